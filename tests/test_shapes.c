//===--- test_shapes.c - generic kernels and shape policies ----------------===//
//
// Generic kernels (one per graph, `?` dims bound at run time) against plain C over
// shapes that include 1, primes and non-multiples of every register tile (8x32 on
// AVX-512, 6x16 on AVX2); the EXACT, GENERIC and AUTO policies and their limits; the
// background specializer racing with runs and with graph and context destruction.
//
//===----------------------------------------------------------------------===//
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "paths.h"
#include "util.h"

static jit_stats stats(jit_context *ctx) {
  jit_stats s;
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  TU_OK(jit_context_stats(ctx, &s));
  return s;
}

static jit_context *ctx_with(jit_shape_policy policy, int after, int max_spec) {
  jit_options o;
  jit_options_init(&o);
  o.cache_dir = "";
  o.shape_policy = policy;
  o.specialize_after = after;
  o.max_specializations = max_spec;
  jit_context *ctx = NULL;
  TU_OK(jit_context_create(&o, &ctx));
  return ctx;
}

// Waits (up to 60 s) until the context has made `n` specializations.
static void wait_specializations(jit_context *ctx, uint64_t n) {
  for (int i = 0; i < 6000 && stats(ctx).specializations < n; i++) usleep(10000);
  cr_assert(stats(ctx).specializations >= n, "%llu specializations, want %llu",
            (unsigned long long)stats(ctx).specializations, (unsigned long long)n);
}

//===--- Matmuls ---------------------------------------------------------===//

// [M, K] x [K, N] with the dims named in `sym` ("MKN" subset) symbolic.
static jit_graph *matmul_graph(jit_context *ctx, const char *sym, int64_t K, int64_t N,
                               DLDataType dt) {
  jit_graph *g = tu_graph(ctx, "mm");
  int64_t m = jit_symbol(g, "M");
  int64_t k = strchr(sym, 'K') ? jit_symbol(g, "K") : K;
  int64_t n = strchr(sym, 'N') ? jit_symbol(g, "N") : N;
  int64_t da[2] = {m, k}, db[2] = {k, n};
  jit_value a = jit_input(g, "a", dt, 2, da);  // inputs in this order
  jit_value b = jit_input(g, "b", dt, 2, db);
  jit_output(g, jit_matmul(g, a, b));
  TU_OK(jit_graph_finalize(g));
  return g;
}

static void check_matmul(jit_graph *g, int64_t M, int64_t K, int64_t N, DLDataType dt,
                         uint64_t seed) {
  ref_rng rng;
  ref_rng_seed(&rng, seed);
  float *a = tu_malloc(sizeof(float) * (size_t)(M * K + 1));
  float *b = tu_malloc(sizeof(float) * (size_t)(K * N + 1));
  float *want = tu_malloc(sizeof(float) * (size_t)(M * N + 1));
  ref_rng_fill_signed(&rng, a, M * K);
  ref_rng_fill_signed(&rng, b, K * N);
  bool f16 = tu_is_f16(dt);
  if (f16) {
    ref_round_f16_array(a, M * K);
    ref_round_f16_array(b, K * N);
  }
  int64_t da[2] = {M, K}, db[2] = {K, N}, dc[2];
  ref_matmul(a, 2, da, b, 2, db, want, dc);
  void *ad = tu_input_data(dt, a, M * K), *bd = tu_input_data(dt, b, K * N);
  DLTensor in[2] = {tu_tensor(ad, dt, 2, da), tu_tensor(bd, dt, 2, db)};
  char what[96];
  snprintf(what, sizeof what, "%s matmul %lldx%lldx%lld", f16 ? "f16" : "f32",
           (long long)M, (long long)K, (long long)N);
  // f16 results are rounded once from an f32 accumulation of K products.
  double tol = f16 ? 2e-3 : 1e-4 * (1.0 + (double)K / 256.0);
  tu_run_check(g, in, 2, dt, 2, dc, want, tol, tol, NULL, what);
  if (ad != a) free(ad);
  if (bd != b) free(bd);
  free(a);
  free(b);
  free(want);
}

Test(shapes, generic_matmul_dynamic_rows) {
  jit_context *ctx = ctx_with(JIT_SHAPE_POLICY_GENERIC, 0, 0);
  // K with and without divisors near 128 (packed B's k blocks), N narrow, odd, wide.
  static const int64_t kn[][2] = {{1000, 31}, {33, 17}, {256, 256}, {5, 1},
                                  {64, 40},   {300, 48}, {127, 33}, {999, 100}};
  static const int64_t ms[] = {1, 2, 5, 7, 8, 9, 13, 17, 31, 64, 65, 100};
  for (size_t c = 0; c < sizeof kn / sizeof kn[0]; c++) {
    jit_graph *g = matmul_graph(ctx, "M", kn[c][0], kn[c][1], TU_F32);
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
      check_matmul(g, ms[i], kn[c][0], kn[c][1], TU_F32, 10 + i);
    jit_graph_destroy(g);
  }
  jit_stats st = stats(ctx);
  // One kernel per graph, whatever the row counts (none fell back to EXACT).
  cr_expect_eq(st.compiles, 8, "compiles %llu", (unsigned long long)st.compiles);
  cr_expect_eq(st.generic_compiles, 8);
  cr_expect_eq(st.generic_runs, 8 * 12, "generic runs %llu",
               (unsigned long long)st.generic_runs);
  jit_context_destroy(ctx);
}

Test(shapes, generic_matmul_all_dims_symbolic) {
  jit_context *ctx = ctx_with(JIT_SHAPE_POLICY_GENERIC, 0, 0);
  jit_graph *g = matmul_graph(ctx, "MKN", 0, 0, TU_F32);
  // From 32 rows B is packed: a `?` K in blocks of 256 (600: two and a rest of 88; 256:
  // one, no rest), a `?` N in tiles of 64 and a rest in masked tiles of 32 (100, 129).
  static const int64_t s[][3] = {{17, 1000, 31}, {1, 1, 1},     {13, 7, 40},
                                 {64, 64, 64},   {3, 129, 33},  {1, 784, 256},
                                 {97, 5, 65},    {40, 600, 100}, {33, 256, 64},
                                 {70, 300, 129}};
  for (size_t i = 0; i < sizeof s / sizeof s[0]; i++)
    check_matmul(g, s[i][0], s[i][1], s[i][2], TU_F32, 40 + i);
  cr_expect_eq(stats(ctx).compiles, 1);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// The packed path's other cases: K static in blocks that divide it (1100: 4 of 275),
// and K `?` with N static (attention's P V), over row counts around 32 (the paths'
// split), a prime, and non-multiples of the 6-row tiles.
Test(shapes, generic_matmul_packed_blocks) {
  jit_context *ctx = ctx_with(JIT_SHAPE_POLICY_GENERIC, 0, 0);
  jit_graph *g = matmul_graph(ctx, "M", 1100, 128, TU_F32);
  static const int64_t ms[] = {31, 32, 37, 66};
  for (size_t i = 0; i < 4; i++) check_matmul(g, ms[i], 1100, 128, TU_F32, 80 + i);
  jit_graph_destroy(g);
  g = matmul_graph(ctx, "MK", 0, 192, TU_F32);
  static const int64_t mk[][2] = {{32, 256}, {41, 600}, {67, 5}, {7, 513}};
  for (size_t i = 0; i < 4; i++) check_matmul(g, mk[i][0], mk[i][1], 192, TU_F32, 90 + i);
  cr_expect_eq(stats(ctx).compiles, 2);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(shapes, generic_matmul_f16) {
  jit_context *ctx = ctx_with(JIT_SHAPE_POLICY_GENERIC, 0, 0);
  jit_graph *g = matmul_graph(ctx, "M", 96, 48, TU_F16);
  static const int64_t ms[] = {1, 7, 33};
  for (size_t i = 0; i < 3; i++) check_matmul(g, ms[i], 96, 48, TU_F16, 60 + i);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// x [B, S, K] times a 2-D W (one matmul over all of x's rows in the generic kernel),
// then the attention pair q [B, H, S, D] k [B, H, D, S] (a batch matmul over B H) and
// p [B, H, S, S] v [B, H, S, D] (a `?` K: the generic's loops), B and S symbolic; f32
// and f16.
static void check_generic_batched(DLDataType dt) {
  jit_context *ctx = ctx_with(JIT_SHAPE_POLICY_GENERIC, 0, 0);
  jit_graph *g = tu_graph(ctx, "batched");
  int64_t B = jit_symbol(g, "B"), S = jit_symbol(g, "S");
  int64_t dx[3] = {B, S, 40}, dw[2] = {40, 24}, dq[4] = {B, 3, S, 8}, dk[4] = {B, 3, 8, S};
  int64_t dv[4] = {B, 3, S, 8};
  jit_value x = jit_input(g, "x", dt, 3, dx), w = jit_input(g, "w", dt, 2, dw);
  jit_value q = jit_input(g, "q", dt, 4, dq), k = jit_input(g, "k", dt, 4, dk);
  jit_value v = jit_input(g, "v", dt, 4, dv);
  jit_output(g, jit_matmul(g, x, w));
  jit_value scores = jit_matmul(g, q, k);
  jit_output(g, scores);
  jit_output(g, jit_matmul(g, scores, v));
  TU_OK(jit_graph_finalize(g));
  bool f16 = tu_is_f16(dt);
  static const int64_t bs[][2] = {{1, 1}, {2, 7}, {3, 17}};
  for (int c = 0; c < 3; c++) {
    int64_t b = bs[c][0], sq = bs[c][1];
    int64_t sx[3] = {b, sq, 40}, sw[2] = {40, 24}, sqd[4] = {b, 3, sq, 8}, skd[4] = {b, 3, 8, sq};
    int64_t *svd = sqd;
    ref_rng rng;
    ref_rng_seed(&rng, 170 + (uint64_t)c);
    int64_t n[5] = {ref_numel(3, sx), 40 * 24, ref_numel(4, sqd), ref_numel(4, skd),
                    ref_numel(4, svd)};
    float *h[5];
    void *dev[5];
    for (int i = 0; i < 5; i++) {
      h[i] = tu_malloc(sizeof(float) * (size_t)n[i]);
      ref_rng_fill_signed(&rng, h[i], n[i]);
      dev[i] = tu_input_data(dt, h[i], n[i]);
    }
    DLTensor in[5] = {tu_tensor(dev[0], dt, 3, sx), tu_tensor(dev[1], dt, 2, sw),
                      tu_tensor(dev[2], dt, 4, sqd), tu_tensor(dev[3], dt, 4, skd),
                      tu_tensor(dev[4], dt, 4, svd)};
    int64_t d0[4], d1[4], d2[4];
    float *want0 = tu_malloc(sizeof(float) * (size_t)(b * sq * 24));
    float *want1 = tu_malloc(sizeof(float) * (size_t)(b * 3 * sq * sq));
    float *want2 = tu_malloc(sizeof(float) * (size_t)(b * 3 * sq * 8));
    ref_matmul(h[0], 3, sx, h[1], 2, sw, want0, d0);
    ref_matmul(h[2], 4, sqd, h[3], 4, skd, want1, d1);
    if (f16) ref_round_f16_array(want1, b * 3 * sq * sq);  // scores are f16 in between
    ref_matmul(want1, 4, d1, h[4], 4, svd, want2, d2);
    if (f16) {
      ref_round_f16_array(want0, b * sq * 24);
      ref_round_f16_array(want2, b * 3 * sq * 8);
    }
    double rtol = f16 ? 1e-2 : 1e-4, atol = f16 ? 1e-2 : 1e-4;
    // All three outputs from one run.
    const int64_t *dims[3] = {d0, d1, d2};
    const int ranks[3] = {3, 4, 4};
    const float *wants[3] = {want0, want1, want2};
    DLTensor outs[3];
    void *raw[3];
    for (int j = 0; j < 3; j++) {
      int64_t cnt = ref_numel(ranks[j], dims[j]);
      raw[j] = tu_malloc((size_t)cnt * (f16 ? 2 : 4));
      outs[j] = tu_tensor(raw[j], dt, ranks[j], (int64_t *)dims[j]);
    }
    TU_OK(jit_run(g, in, 5, outs, 3));
    static const char *const names[3] = {"x W", "q k", "p v"};
    for (int j = 0; j < 3; j++) {
      int64_t cnt = ref_numel(ranks[j], dims[j]);
      float *got = tu_malloc(sizeof(float) * (size_t)cnt);
      if (f16) ref_f16_to_f32_array(raw[j], got, cnt);
      else memcpy(got, raw[j], sizeof(float) * (size_t)cnt);
      char what[64];
      snprintf(what, sizeof what, "%s, B=%lld S=%lld", names[j], (long long)b, (long long)sq);
      tu_assert_close(got, wants[j], cnt, rtol, atol, ranks[j], dims[j], what);
      free(got);
      free(raw[j]);
    }
    for (int i = 0; i < 5; i++) free(h[i]), free(dev[i]);
    free(want0), free(want1), free(want2);
  }
  cr_expect_eq(stats(ctx).compiles, 1);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(shapes, generic_batched_matmuls_f32) { check_generic_batched(TU_F32); }
Test(shapes, generic_batched_matmuls_f16) { check_generic_batched(TU_F16); }

// [B, M, K] x [B, K, N], B and M symbolic.
Test(shapes, generic_batch_matmul) {
  jit_context *ctx = ctx_with(JIT_SHAPE_POLICY_GENERIC, 0, 0);
  jit_graph *g = tu_graph(ctx, "bmm");
  int64_t B = jit_symbol(g, "B"), M = jit_symbol(g, "M");
  int64_t da[3] = {B, M, 24}, db[3] = {B, 24, 40};
  jit_value a = jit_input(g, "a", TU_F32, 3, da);
  jit_value b = jit_input(g, "b", TU_F32, 3, db);
  jit_output(g, jit_matmul(g, a, b));
  TU_OK(jit_graph_finalize(g));
  static const int64_t bm[][2] = {{1, 1}, {3, 7}, {2, 17}, {5, 9}};
  for (int c = 0; c < 4; c++) {
    int64_t sa[3] = {bm[c][0], bm[c][1], 24}, sb[3] = {bm[c][0], 24, 40}, sc[3];
    ref_rng rng;
    ref_rng_seed(&rng, 70 + (uint64_t)c);
    int64_t na = ref_numel(3, sa), nb = ref_numel(3, sb);
    float *a = tu_malloc(sizeof(float) * (size_t)na), *b = tu_malloc(sizeof(float) * (size_t)nb);
    ref_rng_fill_signed(&rng, a, na);
    ref_rng_fill_signed(&rng, b, nb);
    float *want = tu_malloc(sizeof(float) * (size_t)(bm[c][0] * bm[c][1] * 40));
    ref_matmul(a, 3, sa, b, 3, sb, want, sc);
    DLTensor in[2] = {tu_tensor(a, TU_F32, 3, sa), tu_tensor(b, TU_F32, 3, sb)};
    tu_run_check(g, in, 2, TU_F32, 3, sc, want, 1e-4, 1e-4, NULL, "batch matmul");
    free(a);
    free(b);
    free(want);
  }
  cr_expect_eq(stats(ctx).compiles, 1);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

//===--- The MLP of examples/mlp.c ---------------------------------------===//

enum { IN = 784, HID = 256, OUT = 10 };

static jit_graph *mlp_graph(jit_context *ctx) {
  jit_graph *g = tu_graph(ctx, "mlp");
  int64_t n = jit_symbol(g, "N");
  int64_t dx[2] = {n, IN}, dw1[2] = {IN, HID}, db1[1] = {HID}, dw2[2] = {HID, OUT},
          db2[1] = {OUT};
  jit_value x = jit_input(g, "x", TU_F32, 2, dx);
  jit_value w1 = jit_input(g, "w1", TU_F32, 2, dw1);
  jit_value b1 = jit_input(g, "b1", TU_F32, 1, db1);
  jit_value w2 = jit_input(g, "w2", TU_F32, 2, dw2);
  jit_value b2 = jit_input(g, "b2", TU_F32, 1, db2);
  jit_value h = jit_gelu(g, jit_add(g, jit_matmul(g, x, w1), b1));
  jit_output(g, jit_softmax(g, jit_add(g, jit_matmul(g, h, w2), b2), -1));
  TU_OK(jit_graph_finalize(g));
  return g;
}

typedef struct mlp_weights {
  float w1[IN * HID], b1[HID], w2[HID * OUT], b2[OUT];
} mlp_weights;

static mlp_weights *mlp_weights_make(uint64_t seed) {
  mlp_weights *w = tu_malloc(sizeof *w);
  ref_rng rng;
  ref_rng_seed(&rng, seed);
  ref_rng_fill(&rng, w->w1, IN * HID, -0.05f, 0.05f);
  ref_rng_fill(&rng, w->b1, HID, -0.1f, 0.1f);
  ref_rng_fill(&rng, w->w2, HID * OUT, -0.2f, 0.2f);
  ref_rng_fill(&rng, w->b2, OUT, -0.1f, 0.1f);
  return w;
}

static double gelu_ref_d(double x) {
  return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

// Runs the MLP for batch n and compares with plain C; returns the max error.
static double mlp_check(jit_graph *g, const mlp_weights *w, int64_t n, uint64_t seed) {
  ref_rng rng;
  ref_rng_seed(&rng, seed);
  float *x = tu_malloc(sizeof(float) * (size_t)(n * IN));
  float *y = tu_malloc(sizeof(float) * (size_t)(n * OUT));
  ref_rng_fill(&rng, x, n * IN, -1.0f, 1.0f);
  int64_t sx[2] = {n, IN}, sw1[2] = {IN, HID}, sb1[1] = {HID}, sw2[2] = {HID, OUT},
          sb2[1] = {OUT}, sy[2] = {n, OUT};
  DLTensor in[5] = {tu_tensor(x, TU_F32, 2, sx), tu_tensor((void *)w->w1, TU_F32, 2, sw1),
                    tu_tensor((void *)w->b1, TU_F32, 1, sb1),
                    tu_tensor((void *)w->w2, TU_F32, 2, sw2),
                    tu_tensor((void *)w->b2, TU_F32, 1, sb2)};
  DLTensor out = tu_tensor(y, TU_F32, 2, sy);
  TU_OK(jit_run(g, in, 5, &out, 1));
  double worst = 0;
  for (int64_t r = 0; r < n; r++) {
    double h[HID], z[OUT], mx = -INFINITY, sum = 0;
    for (int j = 0; j < HID; j++) {
      double acc = w->b1[j];
      for (int k = 0; k < IN; k++) acc += (double)x[r * IN + k] * w->w1[k * HID + j];
      h[j] = gelu_ref_d(acc);
    }
    for (int j = 0; j < OUT; j++) {
      double acc = w->b2[j];
      for (int k = 0; k < HID; k++) acc += h[k] * w->w2[k * OUT + j];
      z[j] = acc;
      mx = acc > mx ? acc : mx;
    }
    for (int j = 0; j < OUT; j++) sum += (z[j] = exp(z[j] - mx));
    for (int j = 0; j < OUT; j++) {
      double e = fabs(z[j] / sum - y[r * OUT + j]);
      worst = e > worst || isnan(y[r * OUT + j]) ? (isnan(e) ? INFINITY : e) : worst;
    }
  }
  free(x);
  free(y);
  return worst;
}

Test(shapes, generic_mlp_against_plain_c) {
  jit_context *ctx = ctx_with(JIT_SHAPE_POLICY_GENERIC, 0, 0);
  jit_graph *g = mlp_graph(ctx);
  mlp_weights *w = mlp_weights_make(1);
  static const int64_t ns[] = {1, 2, 3, 7, 8, 9, 31, 64, 65, 129};
  for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
    double e = mlp_check(g, w, ns[i], 100 + i);
    cr_expect(e <= 1e-5, "N=%lld: max |error| %g", (long long)ns[i], e);
  }
  jit_stats st = stats(ctx);
  cr_expect_eq(st.compiles, 1, "compiles %llu", (unsigned long long)st.compiles);
  cr_expect_eq(st.generic_runs, 10);
  cr_expect_eq(st.specializations, 0);
  free(w);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// (x W1) W2 + x, a residual block: the second matmul's epilogue reads x and its A is
// the first matmul. Its exact kernels failed to compile for M >= 24 ("hoist_pad failed
// to apply": the epilogue's tiling fused the first matmul in too).
Test(shapes, residual_after_two_matmuls) {
  for (int policy = JIT_SHAPE_POLICY_EXACT; policy <= JIT_SHAPE_POLICY_GENERIC; policy++) {
    jit_context *ctx = ctx_with((jit_shape_policy)policy, 0, 0);
    jit_graph *g = tu_graph(ctx, "residual");
    int64_t dx[2] = {jit_symbol(g, "M"), 64}, dw[2] = {64, 64};
    jit_value x = jit_input(g, "x", TU_F32, 2, dx);
    jit_value w1 = jit_input(g, "w1", TU_F32, 2, dw);
    jit_value w2 = jit_input(g, "w2", TU_F32, 2, dw);
    jit_output(g, jit_add(g, jit_matmul(g, jit_matmul(g, x, w1), w2), x));
    TU_OK(jit_graph_finalize(g));
    static const int64_t ms[] = {1, 23, 24, 27, 64, 97};
    for (int c = 0; c < 6; c++) {
      int64_t m = ms[c], sx[2] = {m, 64}, sw[2] = {64, 64};
      ref_rng rng;
      ref_rng_seed(&rng, 990 + (uint64_t)c);
      float *xv = tu_malloc(sizeof(float) * (size_t)(m * 64)), w1v[64 * 64], w2v[64 * 64];
      float *h = tu_malloc(sizeof(float) * (size_t)(m * 64));
      float *want = tu_malloc(sizeof(float) * (size_t)(m * 64));
      ref_rng_fill_signed(&rng, xv, m * 64);
      ref_rng_fill(&rng, w1v, 64 * 64, -0.2f, 0.2f);
      ref_rng_fill(&rng, w2v, 64 * 64, -0.2f, 0.2f);
      int64_t dh[2];
      ref_matmul(xv, 2, sx, w1v, 2, sw, h, dh);
      ref_matmul(h, 2, sx, w2v, 2, sw, want, dh);
      for (int64_t i = 0; i < m * 64; i++) want[i] += xv[i];
      DLTensor in[3] = {tu_tensor(xv, TU_F32, 2, sx), tu_tensor(w1v, TU_F32, 2, sw),
                        tu_tensor(w2v, TU_F32, 2, sw)};
      tu_run_check(g, in, 3, TU_F32, 2, sx, want, 1e-4, 1e-4, NULL, "(x W1) W2 + x");
      free(xv);
      free(h);
      free(want);
    }
    jit_graph_destroy(g);
    jit_context_destroy(ctx);
  }
}

// x W1^T W2 with W1 transposed in the graph: a large static transpose in a generic
// kernel (vectorized whole it made 56 MB of LLVM dialect and a compile that never
// ended; now tiled to short vectors).
Test(shapes, generic_static_transpose_of_a_weight) {
  jit_context *ctx = ctx_with(JIT_SHAPE_POLICY_GENERIC, 0, 0);
  jit_graph *g = tu_graph(ctx, "xwt");
  int64_t dx[2] = {jit_symbol(g, "M"), 128}, dw[2] = {128, 128};
  jit_value x = jit_input(g, "x", TU_F32, 2, dx);
  jit_value w1 = jit_input(g, "w1", TU_F32, 2, dw);
  jit_value w2 = jit_input(g, "w2", TU_F32, 2, dw);
  int perm[2] = {1, 0};
  jit_output(g, jit_matmul(g, jit_matmul(g, x, jit_transpose(g, w1, perm)), w2));
  TU_OK(jit_graph_finalize(g));
  static const int64_t ms[] = {1, 7, 50};
  for (int c = 0; c < 3; c++) {
    int64_t m = ms[c], sx[2] = {m, 128}, sw[2] = {128, 128}, d[2];
    ref_rng rng;
    ref_rng_seed(&rng, 970 + (uint64_t)c);
    float *xv = tu_malloc(sizeof(float) * (size_t)(m * 128)), *w1v = tu_malloc(4 * 128 * 128);
    float *w2v = tu_malloc(4 * 128 * 128), *w1t = tu_malloc(4 * 128 * 128);
    float *h = tu_malloc(sizeof(float) * (size_t)(m * 128));
    float *want = tu_malloc(sizeof(float) * (size_t)(m * 128));
    ref_rng_fill_signed(&rng, xv, m * 128);
    ref_rng_fill(&rng, w1v, 128 * 128, -0.1f, 0.1f);
    ref_rng_fill(&rng, w2v, 128 * 128, -0.1f, 0.1f);
    ref_transpose(w1v, 2, sw, perm, w1t, d);
    ref_matmul(xv, 2, sx, w1t, 2, sw, h, d);
    ref_matmul(h, 2, sx, w2v, 2, sw, want, d);
    DLTensor in[3] = {tu_tensor(xv, TU_F32, 2, sx), tu_tensor(w1v, TU_F32, 2, sw),
                      tu_tensor(w2v, TU_F32, 2, sw)};
    tu_run_check(g, in, 3, TU_F32, 2, sx, want, 1e-4, 1e-4, NULL, "x W1^T W2");
    free(xv), free(w1v), free(w2v), free(w1t), free(h), free(want);
  }
  cr_expect_eq(stats(ctx).generic_compiles, 1);
  cr_expect_eq(stats(ctx).generic_runs, 3);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

//===--- Other ops -------------------------------------------------------===//

// Reductions on both axes, softmax, a transpose, elementwise with broadcasting and
// reshapes (to one `?` dim, and to two) of one [R, C] input, R and C symbolic.
Test(shapes, generic_row_and_layout_ops) {
  jit_context *ctx = ctx_with(JIT_SHAPE_POLICY_GENERIC, 0, 0);
  jit_graph *g = tu_graph(ctx, "ops");
  int64_t R = jit_symbol(g, "R"), C = jit_symbol(g, "C");
  int64_t dx[2] = {R, C}, db[1] = {C};
  jit_value x = jit_input(g, "x", TU_F32, 2, dx);
  jit_value b = jit_input(g, "b", TU_F32, 1, db);
  int perm[2] = {1, 0};
  int64_t flat[1] = {-1}, back[2] = {-1, R};
  jit_output(g, jit_reduce_sum(g, x, 1, 0));                    // 0: [R]
  jit_output(g, jit_reduce_max(g, x, 0, 1));                    // 1: [1, C]
  jit_output(g, jit_softmax(g, x, 1));                          // 2: [R, C]
  jit_output(g, jit_transpose(g, jit_tanh(g, x), perm));        // 3: [C, R]
  jit_output(g, jit_mul(g, jit_sub(g, x, b), jit_exp(g, b)));   // 4: [R, C]
  jit_output(g, jit_reshape(g, jit_relu(g, x), 1, flat));       // 5: [R*C]
  jit_output(g, jit_reshape(g, jit_transpose(g, x, perm), 2, back));  // 6: [C, R]
  TU_OK(jit_graph_finalize(g));
  static const int64_t rc[][2] = {{1, 1}, {1, 33}, {7, 5}, {17, 31}, {64, 100}, {3, 257}};
  for (int c = 0; c < 6; c++) {
    int64_t r = rc[c][0], cc = rc[c][1], n = r * cc;
    ref_rng rng;
    ref_rng_seed(&rng, 200 + (uint64_t)c);
    float *xv = tu_malloc(sizeof(float) * (size_t)n), *bv = tu_malloc(sizeof(float) * (size_t)cc);
    ref_rng_fill_signed(&rng, xv, n);
    ref_rng_fill_signed(&rng, bv, cc);
    int64_t sx[2] = {r, cc}, sb[1] = {cc};
    DLTensor in[2] = {tu_tensor(xv, TU_F32, 2, sx), tu_tensor(bv, TU_F32, 1, sb)};
    DLManagedTensor *outs[7] = {0};
    TU_OK(jit_run_alloc(g, in, 2, outs, 7));
    float *want = tu_malloc(sizeof(float) * (size_t)n), *tmp = tu_malloc(sizeof(float) * (size_t)n);
    int64_t dout[2];
    char what[64];
    // 0, 1: reductions
    int rk = ref_reduce(REF_SUM, xv, 2, sx, 1, 0, want, dout);
    snprintf(what, sizeof what, "reduce_sum %lldx%lld", (long long)r, (long long)cc);
    tu_assert_shape(outs[0]->dl_tensor.ndim, outs[0]->dl_tensor.shape, rk, dout, what);
    tu_assert_close(outs[0]->dl_tensor.data, want, r, 1e-5, 1e-5, rk, dout, what);
    rk = ref_reduce(REF_RMAX, xv, 2, sx, 0, 1, want, dout);
    tu_assert_shape(outs[1]->dl_tensor.ndim, outs[1]->dl_tensor.shape, rk, dout, "reduce_max");
    tu_assert_close(outs[1]->dl_tensor.data, want, cc, 0, 0, rk, dout, "reduce_max");
    // 2: softmax
    ref_softmax(xv, 2, sx, 1, want);
    tu_assert_close(outs[2]->dl_tensor.data, want, n, 1e-5, 1e-6, 2, sx, "softmax");
    // 3: transpose of tanh
    ref_unary(REF_TANH, xv, n, tmp);
    ref_transpose(tmp, 2, sx, perm, want, dout);
    tu_assert_shape(outs[3]->dl_tensor.ndim, outs[3]->dl_tensor.shape, 2, dout, "transpose");
    tu_assert_close(outs[3]->dl_tensor.data, want, n, 1e-5, 1e-6, 2, dout, "transpose");
    // 4: (x - b) * exp(b)
    for (int64_t i = 0; i < n; i++)
      want[i] = (float)(((double)xv[i] - bv[i % cc]) * exp((double)bv[i % cc]));
    tu_assert_close(outs[4]->dl_tensor.data, want, n, 1e-5, 1e-6, 2, sx, "broadcast");
    // 5: relu, flattened
    for (int64_t i = 0; i < n; i++) want[i] = xv[i] > 0 ? xv[i] : 0;
    cr_expect_eq(outs[5]->dl_tensor.ndim, 1);
    cr_expect_eq(outs[5]->dl_tensor.shape[0], n);
    tu_assert_close(outs[5]->dl_tensor.data, want, n, 0, 0, 1, &n, "reshape to [?]");
    // 6: the transpose reshaped to [-1, R] (two `?` dims): the same [C, R] values
    ref_transpose(xv, 2, sx, perm, want, dout);
    tu_assert_shape(outs[6]->dl_tensor.ndim, outs[6]->dl_tensor.shape, 2, dout, "reshape");
    tu_assert_close(outs[6]->dl_tensor.data, want, n, 0, 0, 2, dout, "reshape to [?, R]");
    for (int j = 0; j < 7; j++) outs[j]->deleter(outs[j]);
    free(xv);
    free(bv);
    free(want);
    free(tmp);
  }
  cr_expect_eq(stats(ctx).compiles, 1);
  cr_expect_eq(stats(ctx).generic_runs, 6);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

//===--- Policies --------------------------------------------------------===//

Test(shapes, exact_compiles_every_binding) {
  jit_context *ctx = ctx_with(JIT_SHAPE_POLICY_EXACT, 0, 0);
  jit_graph *g = matmul_graph(ctx, "M", 33, 17, TU_F32);
  for (int64_t m = 1; m <= 3; m++) check_matmul(g, m, 33, 17, TU_F32, 300 + (uint64_t)m);
  jit_stats st = stats(ctx);
  cr_expect_eq(st.compiles, 3);
  cr_expect_eq(st.generic_runs, 0);
  cr_expect_eq(st.generic_compiles, 0);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// AUTO: the graph's first binding gets its own kernel at once (the generic kernel is
// compiled in the background); later new bindings run on the generic kernel; the one
// called specialize_after times is compiled in the background, and later calls run
// its own kernel.
Test(shapes, auto_specializes_hot_bindings) {
  jit_context *ctx = ctx_with(JIT_SHAPE_POLICY_AUTO, 3, 0);
  jit_graph *g = mlp_graph(ctx);
  mlp_weights *w = mlp_weights_make(2);
  cr_expect(mlp_check(g, w, 4, 1) <= 1e-5);  // the first: exact
  cr_expect(mlp_check(g, w, 5, 1) <= 1e-5);
  cr_expect(mlp_check(g, w, 6, 2) <= 1e-5);
  jit_stats st = stats(ctx);
  cr_expect_eq(st.compiles, 2, "the first binding's kernel and the generic one");
  cr_expect_eq(st.generic_compiles, 1);
  cr_expect_eq(st.generic_runs, 2);
  for (int i = 0; i < 2; i++) cr_expect(mlp_check(g, w, 5, 3 + (uint64_t)i) <= 1e-5);
  wait_specializations(ctx, 1);
  uint64_t before = stats(ctx).generic_runs;
  for (int i = 0; i < 3; i++) cr_expect(mlp_check(g, w, 5, 9 + (uint64_t)i) <= 1e-5);
  st = stats(ctx);
  cr_expect_eq(st.generic_runs, before, "N=5 still ran on the generic kernel");
  cr_expect_eq(st.compiles, 3);
  cr_expect_eq(st.specializations, 1);
  cr_expect_eq(st.kernels, 3);
  free(w);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(shapes, max_specializations_is_a_limit) {
  jit_context *ctx = ctx_with(JIT_SHAPE_POLICY_AUTO, 1, 2);
  jit_graph *g = matmul_graph(ctx, "M", 33, 17, TU_F32);
  for (int64_t m = 1; m <= 5; m++) check_matmul(g, m, 33, 17, TU_F32, 400 + (uint64_t)m);
  wait_specializations(ctx, 2);
  usleep(200000);
  jit_stats st = stats(ctx);
  cr_expect_eq(st.specializations, 2, "specializations %llu",
               (unsigned long long)st.specializations);
  for (int64_t m = 1; m <= 5; m++) check_matmul(g, m, 33, 17, TU_F32, 410 + (uint64_t)m);
  // M = 1 got its own kernel as the first binding, two were specialized, two stay.
  cr_expect_eq(stats(ctx).generic_runs - st.generic_runs, 2, "two bindings stay generic");
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(shapes, graph_policy_overrides_the_context) {
  jit_context *ctx = ctx_with(JIT_SHAPE_POLICY_EXACT, 0, 0);
  jit_graph *g = matmul_graph(ctx, "M", 33, 17, TU_F32);
  TU_OK(jit_graph_set_shape_policy(g, JIT_SHAPE_POLICY_GENERIC));
  for (int64_t m = 1; m <= 3; m++) check_matmul(g, m, 33, 17, TU_F32, 500 + (uint64_t)m);
  cr_expect_eq(stats(ctx).compiles, 1);
  cr_expect_eq(stats(ctx).generic_runs, 3);
  jit_status s = jit_graph_set_shape_policy(g, (jit_shape_policy)7);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  jit_status_free(s);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// A graph without symbols has one binding: it is compiled exactly, never generically.
Test(shapes, static_graphs_stay_exact) {
  jit_context *ctx = ctx_with(JIT_SHAPE_POLICY_GENERIC, 0, 0);
  jit_graph *g = tu_graph(ctx, "static");
  int64_t d[2] = {4, 8};
  jit_output(g, jit_relu(g, jit_input(g, "x", TU_F32, 2, d)));
  TU_OK(jit_graph_finalize(g));
  float x[32], y[32];
  for (int i = 0; i < 32; i++) x[i] = (float)i - 16;
  DLTensor in = tu_tensor(x, TU_F32, 2, d), out = tu_tensor(y, TU_F32, 2, d);
  TU_OK(jit_run(g, &in, 1, &out, 1));
  cr_expect_eq(stats(ctx).generic_runs, 0);
  cr_expect_eq(stats(ctx).generic_compiles, 0);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(shapes, bad_policy_options_are_refused) {
  jit_options o;
  jit_options_init(&o);
  o.cache_dir = "";
  jit_context *ctx = NULL;
  struct {
    jit_shape_policy policy;
    int after, max;
    const char *field;
  } bad[] = {{(jit_shape_policy)3, 0, 0, "options.shape_policy"},
             {JIT_SHAPE_POLICY_AUTO, 0, -5, "options.max_specializations"},
             {(jit_shape_policy)-1, 0, 0, "options.shape_policy"},
             {JIT_SHAPE_POLICY_AUTO, -1, 0, "options.specialize_after"},
             {JIT_SHAPE_POLICY_AUTO, 0, 2000000, "options.max_specializations"}};
  for (int i = 0; i < 5; i++) {
    o.shape_policy = bad[i].policy;
    o.specialize_after = bad[i].after;
    o.max_specializations = bad[i].max;
    jit_status s = jit_context_create(&o, &ctx);
    TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
    TU_EXPECT_MSG(s, bad[i].field);
    jit_status_free(s);
    cr_expect(ctx == NULL);
  }
  jit_options_init(&o);
  o.cache_dir = "";
  o.max_loaded_kernels = -1;
  jit_status s = jit_context_create(&o, &ctx);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  TU_EXPECT_MSG(s, "options.max_loaded_kernels");
  jit_status_free(s);
}

Test(shapes, environment_overrides_the_option) {
  setenv("JITML_SHAPE_POLICY", "Generic", 1);
  jit_context *ctx = ctx_with(JIT_SHAPE_POLICY_EXACT, 0, 0);
  jit_graph *g = matmul_graph(ctx, "M", 33, 17, TU_F32);
  for (int64_t m = 1; m <= 2; m++) check_matmul(g, m, 33, 17, TU_F32, 600 + (uint64_t)m);
  cr_expect_eq(stats(ctx).generic_runs, 2);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
  setenv("JITML_SHAPE_POLICY", "sometimes", 1);
  jit_options o;
  jit_options_init(&o);
  o.cache_dir = "";
  jit_status s = jit_context_create(&o, &ctx);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  TU_EXPECT_MSG(s, "JITML_SHAPE_POLICY");
  jit_status_free(s);
  unsetenv("JITML_SHAPE_POLICY");
}

Test(shapes, compile_generic_prewarms) {
  jit_context *ctx = ctx_with(JIT_SHAPE_POLICY_AUTO, 0, 0);
  jit_graph *g = matmul_graph(ctx, "M", 33, 17, TU_F32);
  TU_OK(jit_graph_compile_generic(g));
  TU_OK(jit_graph_compile_generic(g));  // ready: nothing more
  cr_expect_eq(stats(ctx).compiles, 1);
  check_matmul(g, 9, 33, 17, TU_F32, 960);
  cr_expect_eq(stats(ctx).compiles, 1, "the first call waited for a compile");
  jit_graph_destroy(g);
  g = tu_graph(ctx, "static");
  int64_t d[1] = {3};
  jit_output(g, jit_exp(g, jit_input(g, "x", TU_F32, 1, d)));
  jit_status s = jit_graph_compile_generic(g);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);  // not finalized
  jit_status_free(s);
  TU_OK(jit_graph_finalize(g));
  s = jit_graph_compile_generic(g);
  TU_EXPECT_CODE(s, JIT_UNSUPPORTED);
  TU_EXPECT_MSG(s, "no symbolic dims");
  jit_status_free(s);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// A generic kernel at 2 threads: each matmul's scf.forall is outlined while the script
// tiles the next one (lowering/cpu/generic.c) and put back afterwards: the dumped
// script outlines, the tiled module has one function left, and the results match
// x W1 + b1, then times W2, at sizes on both row paths (few rows and 32 or more).
static int count_of(const char *text, const char *needle) {
  int n = 0;
  for (const char *p = text; (p = strstr(p, needle)); p += strlen(needle)) n++;
  return n;
}

Test(shapes, generic_outlined_matmuls_put_back) {
  dump_begin();
  jit_options o;
  jit_options_init(&o);
  o.cache_dir = "";
  o.shape_policy = JIT_SHAPE_POLICY_GENERIC;
  o.num_threads = 2;
  o.dump_ir_dir = g_dump_dir;
  jit_context *ctx = NULL;
  TU_OK(jit_context_create(&o, &ctx));
  enum { K = 256, H = 192, N = 67 };
  jit_graph *g = tu_graph(ctx, "two");
  int64_t m = jit_symbol(g, "M");
  int64_t dx[2] = {m, K}, dw1[2] = {K, H}, db1[1] = {H}, dw2[2] = {H, N};
  jit_value x = jit_input(g, "x", TU_F32, 2, dx), w1 = jit_input(g, "w1", TU_F32, 2, dw1);
  jit_value b1 = jit_input(g, "b1", TU_F32, 1, db1), w2 = jit_input(g, "w2", TU_F32, 2, dw2);
  jit_output(g, jit_matmul(g, jit_add(g, jit_matmul(g, x, w1), b1), w2));
  TU_OK(jit_graph_finalize(g));
  TU_OK(jit_graph_compile_generic(g));
  const char *text = dump_text("-03-transform-script.mlir", 0);
  cr_assert(text, "no script dumped");
  // Every forall is outlined: both matmuls on the path for many rows where kernels
  // run on 2 threads (not in sanitizer builds, nor without libomp: no forall then).
  int outlines = count_of(text, "transform.loop.outline");
  int foralls = count_of(text, "transform.structured.tile_using_forall");
  cr_expect_eq(outlines, foralls, "%d of %d scf.forall loops outlined", outlines, foralls);
  text = dump_text("-03-tiled-vectorized.mlir", 0);
  cr_assert(text, "no module dumped");
  cr_assert(strlen(text) < (1 << 18) - 1, "the module is longer than dump_text reads");
  cr_expect_eq(count_of(text, "func.func @"), 1, "functions left after the script");
  cr_expect_eq(count_of(text, "jit_outlined_"), 0, "an outlined matmul was not put back");
  ref_rng rng;
  ref_rng_seed(&rng, 7100);
  const int64_t rows[] = {1, 7, 31, 32, 45, 97};
  for (size_t r = 0; r < sizeof rows / sizeof *rows; r++) {
    int64_t M = rows[r], ax[2] = {M, K}, ah[2] = {M, H}, ay[2] = {M, N}, dc[2];
    size_t f = sizeof(float);
    float *xv = tu_malloc(f * (size_t)(M * K)), *w1v = tu_malloc(f * K * H);
    float *b1v = tu_malloc(f * H), *w2v = tu_malloc(f * H * N);
    float *t = tu_malloc(f * (size_t)(M * H)), *h = tu_malloc(f * (size_t)(M * H));
    float *want = tu_malloc(f * (size_t)(M * N));
    ref_rng_fill_signed(&rng, xv, M * K);
    ref_rng_fill_signed(&rng, w1v, K * H);
    ref_rng_fill_signed(&rng, b1v, H);
    ref_rng_fill_signed(&rng, w2v, H * N);
    ref_matmul(xv, 2, ax, w1v, 2, dw1, t, dc);
    ref_binary(REF_ADD, t, 2, ah, b1v, 1, db1, h);
    ref_matmul(h, 2, ah, w2v, 2, dw2, want, dc);
    DLTensor in[4] = {tu_tensor(xv, TU_F32, 2, ax), tu_tensor(w1v, TU_F32, 2, dw1),
                      tu_tensor(b1v, TU_F32, 1, db1), tu_tensor(w2v, TU_F32, 2, dw2)};
    char what[64];
    snprintf(what, sizeof what, "outlined generic kernel, M = %lld", (long long)M);
    tu_run_check(g, in, 4, TU_F32, 2, ay, want, 1e-4, 1e-3, NULL, what);
    free(xv), free(w1v), free(b1v), free(w2v), free(t), free(h), free(want);
  }
  cr_expect_eq(stats(ctx).generic_runs, sizeof rows / sizeof *rows,
               "runs not on the generic kernel");
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
  dump_end();
}

//===--- Explain ---------------------------------------------------------===//

static void expect_explain(jit_graph *g, int64_t m, const char *needle) {
  float a[1], b[1];
  int64_t sa[2] = {m, 33}, sb[2] = {33, 17};
  DLTensor in[2] = {tu_tensor(a, TU_F32, 2, sa), tu_tensor(b, TU_F32, 2, sb)};
  char *text = NULL;
  TU_OK(jit_cache_explain(g, in, 2, &text));
  cr_expect(strstr(text, needle) != NULL, "explain for M=%lld lacks \"%s\":\n%s",
            (long long)m, needle, text);
  jit_string_free(text);
}

Test(shapes, explain_says_which_kernel_and_why) {
  jit_context *ctx = ctx_with(JIT_SHAPE_POLICY_AUTO, 2, 0);
  jit_graph *g = matmul_graph(ctx, "M", 33, 17, TU_F32);
  expect_explain(g, 5, "shape policy: AUTO");
  check_matmul(g, 4, 33, 17, TU_F32, 949);  // the first binding: its own kernel
  expect_explain(g, 4, "kernel now: its own kernel, loaded");
  expect_explain(g, 5, "the next call uses its own kernel if cached on disk, else runs "
                       "the generic kernel");
  check_matmul(g, 5, 33, 17, TU_F32, 950);
  expect_explain(g, 5, "kernel now: the generic kernel (1 of 2 runs");
  check_matmul(g, 5, 33, 17, TU_F32, 951);
  wait_specializations(ctx, 1);
  expect_explain(g, 5, "kernel now: its own kernel, loaded");
  TU_OK(jit_graph_set_shape_policy(g, JIT_SHAPE_POLICY_EXACT));
  expect_explain(g, 6, "shape policy: EXACT (set on the graph)");
  jit_graph_destroy(g);
  // No symbols: EXACT whatever was asked, and why.
  g = tu_graph(ctx, "static");
  int64_t d[2] = {5, 33};
  jit_output(g, jit_relu(g, jit_input(g, "a", TU_F32, 2, d)));
  TU_OK(jit_graph_finalize(g));
  float a[1];
  DLTensor in = tu_tensor(a, TU_F32, 2, d);
  char *text = NULL;
  TU_OK(jit_cache_explain(g, &in, 1, &text));
  cr_expect(strstr(text, "shape policy: EXACT (AUTO asked; the graph has no symbolic dims)"),
            "%s", text);
  jit_string_free(text);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

//===--- Bounded kernel memory -------------------------------------------===//

// Six exact kernels under a limit of four: the two least recently used are unloaded;
// a binding unloaded runs again (compiled anew: the disk cache is off) and another
// goes.
Test(shapes, least_recently_used_kernels_are_unloaded) {
  jit_options o;
  jit_options_init(&o);
  o.cache_dir = "";
  o.shape_policy = JIT_SHAPE_POLICY_EXACT;
  o.max_loaded_kernels = 4;
  jit_context *ctx = NULL;
  TU_OK(jit_context_create(&o, &ctx));
  jit_graph *g = matmul_graph(ctx, "M", 33, 17, TU_F32);
  for (int64_t m = 1; m <= 6; m++) check_matmul(g, m, 33, 17, TU_F32, 900 + (uint64_t)m);
  jit_stats st = stats(ctx);
  cr_expect_eq(st.kernels, 4, "kernels %llu", (unsigned long long)st.kernels);
  cr_expect_eq(st.kernels_unloaded, 2);
  // M = 3 was used last among the first ones kept: hit. M = 1 was unloaded: compiled.
  check_matmul(g, 3, 33, 17, TU_F32, 910);
  cr_expect_eq(stats(ctx).compiles, 6);
  check_matmul(g, 1, 33, 17, TU_F32, 911);
  st = stats(ctx);
  cr_expect_eq(st.compiles, 7);
  cr_expect_eq(st.kernels, 4);
  cr_expect_eq(st.kernels_unloaded, 3);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// A byte limit below one kernel's size keeps just the kernel in use.
Test(shapes, byte_limit_unloads_too) {
  jit_options o;
  jit_options_init(&o);
  o.cache_dir = "";
  o.shape_policy = JIT_SHAPE_POLICY_EXACT;
  o.max_loaded_kernel_bytes = 1;
  jit_context *ctx = NULL;
  TU_OK(jit_context_create(&o, &ctx));
  jit_graph *g = matmul_graph(ctx, "M", 33, 17, TU_F32);
  for (int64_t m = 1; m <= 3; m++) check_matmul(g, m, 33, 17, TU_F32, 920 + (uint64_t)m);
  jit_stats st = stats(ctx);
  cr_expect_eq(st.kernels, 1, "kernels %llu", (unsigned long long)st.kernels);
  cr_expect_eq(st.kernels_unloaded, 2);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

//===--- Disk ------------------------------------------------------------===//

// A context over cache directory `dir` with shape policy `policy`.
static jit_context *ctx_in(const char *dir, jit_shape_policy policy) {
  jit_options o;
  jit_options_init(&o);
  o.cache_dir = dir;
  o.shape_policy = policy;
  jit_context *ctx = NULL;
  TU_OK(jit_context_create(&o, &ctx));
  return ctx;
}

static void remove_dir(const char *dir) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  cr_expect(system(cmd) == 0);
}

Test(shapes, generic_kernel_comes_back_from_disk) {
  char dir[] = "/tmp/jitml-shapes-XXXXXX";
  cr_assert(mkdtemp(dir));
  for (int round = 0; round < 2; round++) {
    jit_context *ctx = ctx_in(dir, JIT_SHAPE_POLICY_GENERIC);
    jit_graph *g = matmul_graph(ctx, "M", 40, 24, TU_F32);
    check_matmul(g, 3 + round, 40, 24, TU_F32, 700 + (uint64_t)round);
    jit_stats st = stats(ctx);
    cr_expect_eq(st.compiles, round == 0 ? 1 : 0, "round %d: compiles %llu", round,
                 (unsigned long long)st.compiles);
    cr_expect_eq(st.disk_hits, round == 0 ? 0 : 1, "round %d", round);
    jit_graph_destroy(g);
    jit_context_destroy(ctx);
  }
  remove_dir(dir);
}

// AUTO in a restarted process: the first binding runs on the generic kernel the last
// process left on disk (no compile), one the last process compiled runs its own.
Test(shapes, auto_restart_uses_the_disk) {
  char dir[] = "/tmp/jitml-shapes-XXXXXX";
  cr_assert(mkdtemp(dir));
  for (int round = 0; round < 2; round++) {
    jit_context *ctx = ctx_in(dir, JIT_SHAPE_POLICY_AUTO);
    jit_graph *g = matmul_graph(ctx, "M", 40, 24, TU_F32);
    check_matmul(g, round == 0 ? 3 : 5, 40, 24, TU_F32, 720 + (uint64_t)round);
    check_matmul(g, 3, 40, 24, TU_F32, 722);
    for (int i = 0; i < 3000 && stats(ctx).specializations_pending; i++) usleep(10000);
    jit_stats st = stats(ctx);
    if (round == 0) {
      cr_expect_eq(st.compiles, 2, "M=3's own kernel and the generic one");
    } else {
      cr_expect_eq(st.compiles, 0, "round 1: compiles %llu", (unsigned long long)st.compiles);
      cr_expect_eq(st.generic_runs, 1, "M=5 on the generic kernel from disk");
      cr_expect_eq(st.disk_hits, 2, "the generic kernel and M=3's own");
    }
    jit_graph_destroy(g);
    jit_context_destroy(ctx);
  }
  remove_dir(dir);
}

// What jit_cache_list finds: the hot lists, and the key of the kernel whose inputs
// read `want` (a components line such as "input.0=a f32 [11, 40]").
typedef struct listing {
  const char *want;
  int hot_lists;
  char key[33];
} listing;

static int list_visit(void *user, const jit_cache_entry_info *e) {
  listing *l = user;
  if (!strcmp(e->kind, "hot-list")) {
    l->hot_lists++;
    cr_expect(strstr(e->components, "hot_bindings_of=") != NULL, "%s", e->components);
  }
  if (l->want && strstr(e->components, l->want)) snprintf(l->key, sizeof l->key, "%s", e->key);
  return 1;
}

// Removes the disk entry of the kernel whose inputs read `want`.
static void remove_kernel(const char *dir, jit_context *ctx, const char *want) {
  listing l = {want, 0, ""};
  TU_OK(jit_cache_list(ctx, list_visit, &l));
  cr_assert(l.key[0], "no entry with `%s`", want);
  char path[512];
  snprintf(path, sizeof path, "%s/%.2s/%s.jitk", dir, l.key, l.key);
  cr_assert(unlink(path) == 0, "%s", path);
}

// AUTO remembers the bindings it specialized in the cache directory. A restarted
// process prepares them in the background at its graph's first call, before they
// are asked for: loaded from disk, or, when gone from it, run on the generic kernel
// and compiled. jit_graph_prewarm_hot does it on the caller's thread.
Test(shapes, hot_bindings_are_remembered) {
  char dir[] = "/tmp/jitml-shapes-XXXXXX";
  cr_assert(mkdtemp(dir));
  jit_context *ctx = ctx_in(dir, JIT_SHAPE_POLICY_AUTO);  // specialize_after 4
  jit_graph *g = matmul_graph(ctx, "M", 40, 24, TU_F32);
  check_matmul(g, 3, 40, 24, TU_F32, 900);
  for (int i = 0; i < 4; i++) check_matmul(g, 11, 40, 24, TU_F32, 901 + (uint64_t)i);
  wait_specializations(ctx, 1);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);

  // A restart: M=3 is called; M=11, never called, is loaded in the background.
  ctx = ctx_in(dir, JIT_SHAPE_POLICY_AUTO);
  listing l = {NULL, 0, ""};
  TU_OK(jit_cache_list(ctx, list_visit, &l));
  cr_expect_eq(l.hot_lists, 1);
  g = matmul_graph(ctx, "M", 40, 24, TU_F32);
  check_matmul(g, 3, 40, 24, TU_F32, 910);
  wait_specializations(ctx, 1);
  check_matmul(g, 11, 40, 24, TU_F32, 911);
  jit_stats st = stats(ctx);
  cr_expect_eq(st.compiles, 0, "compiles %llu", (unsigned long long)st.compiles);
  cr_expect_eq(st.disk_hits, 2, "M=3's and M=11's own kernels");
  cr_expect_eq(st.memory_hits, 1, "M=11 was loaded before it was called");
  cr_expect_eq(st.generic_runs, 0);
  jit_graph_destroy(g);

  // Gone from disk: a restart runs M=11 on the generic kernel while it compiles.
  remove_kernel(dir, ctx, "input.0=a f32 [11, 40]");
  jit_context_destroy(ctx);
  ctx = ctx_in(dir, JIT_SHAPE_POLICY_AUTO);
  g = matmul_graph(ctx, "M", 40, 24, TU_F32);
  check_matmul(g, 5, 40, 24, TU_F32, 920);  // the generic kernel, from disk
  wait_specializations(ctx, 1);
  check_matmul(g, 11, 40, 24, TU_F32, 921);
  st = stats(ctx);
  cr_expect_eq(st.compiles, 1, "M=11's own kernel");
  cr_expect_eq(st.generic_runs, 1, "M=5 only");
  jit_graph_destroy(g);

  // EXACT (as `jitml prewarm --hot`): on the calling thread.
  remove_kernel(dir, ctx, "input.0=a f32 [11, 40]");
  jit_context_destroy(ctx);
  ctx = ctx_in(dir, JIT_SHAPE_POLICY_EXACT);
  g = matmul_graph(ctx, "M", 40, 24, TU_F32);
  size_t ready = 0;
  TU_OK(jit_graph_prewarm_hot(g, 0, &ready));
  cr_expect_eq(ready, 1);
  check_matmul(g, 11, 40, 24, TU_F32, 930);
  st = stats(ctx);
  cr_expect_eq(st.compiles, 1);
  cr_expect_eq(st.memory_hits, 1);
  jit_status bad = jit_graph_prewarm_hot(g, -1, NULL);
  TU_EXPECT_CODE(bad, JIT_INVALID_ARGUMENT);
  jit_status_free(bad);
  bad = jit_graph_prewarm_hot(NULL, 0, NULL);
  TU_EXPECT_CODE(bad, JIT_INVALID_ARGUMENT);
  jit_status_free(bad);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
  remove_dir(dir);
}

//===--- On a GPU (Vulkan: lavapipe in CI) --------------------------------===//

// A context whose runs go to Vulkan device 0, or a skipped test where there is none.
static jit_context *vulkan_ctx_in(const char *dir, jit_shape_policy policy, int after) {
  jit_options o;
  jit_options_init(&o);
  o.cache_dir = dir;
  o.device = "vulkan";
  o.shape_policy = policy;
  o.specialize_after = after;
  jit_context *ctx = NULL;
  jit_status s = jit_context_create(&o, &ctx);
  if (s && jit_status_get_code(s) == JIT_UNAVAILABLE) {
    jit_status_free(s);
    cr_skip_test("skipped: no Vulkan device");
  }
  TU_OK(s);
  return ctx;
}

static jit_context *vulkan_ctx(jit_shape_policy policy, int after) {
  return vulkan_ctx_in("", policy, after);
}

// A GPU's generic kernel is a disk entry like any other: a new context loads it.
Test(shapes, generic_vulkan_kernel_comes_back_from_disk) {
  char dir[] = "/tmp/jitml-shapes-XXXXXX";
  cr_assert(mkdtemp(dir));
  for (int round = 0; round < 2; round++) {
    jit_context *ctx = vulkan_ctx_in(dir, JIT_SHAPE_POLICY_GENERIC, 0);
    jit_graph *g = matmul_graph(ctx, "M", 37, 29, TU_F32);
    check_matmul(g, 3 + round, 37, 29, TU_F32, 970 + (uint64_t)round);
    jit_stats st = stats(ctx);
    cr_expect_eq(st.compiles, round == 0 ? 1 : 0, "round %d: compiles %llu", round,
                 (unsigned long long)st.compiles);
    cr_expect_eq(st.disk_hits, round == 0 ? 0 : 1, "round %d", round);
    cr_expect_eq(st.generic_runs, 1);
    jit_graph_destroy(g);
    jit_context_destroy(ctx);
  }
  remove_dir(dir);
}

// GENERIC on a GPU: one compile for every row count (1, primes, past a 256-thread
// block and a 16-row tile), each result against plain C.
Test(shapes, generic_kernel_on_vulkan) {
  jit_context *ctx = vulkan_ctx(JIT_SHAPE_POLICY_GENERIC, 0);
  jit_graph *g = matmul_graph(ctx, "M", 37, 29, TU_F32);
  static const int64_t ms[] = {1, 2, 7, 17, 33, 300};
  for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
    check_matmul(g, ms[i], 37, 29, TU_F32, 950 + i);
  jit_stats st = stats(ctx);
  cr_expect_eq(st.compiles, 1, "compiles %llu", (unsigned long long)st.compiles);
  cr_expect_eq(st.generic_compiles, 1);
  cr_expect_eq(st.generic_runs, 6);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// jit_graph_compile_generic prewarms the generic kernel for options.device's GPU:
// then no binding compiles, not even the first under AUTO.
Test(shapes, compile_generic_for_vulkan) {
  jit_context *ctx = vulkan_ctx(JIT_SHAPE_POLICY_AUTO, 0);
  jit_graph *g = matmul_graph(ctx, "M", 37, 29, TU_F32);
  TU_OK(jit_graph_compile_generic(g));
  cr_expect_eq(stats(ctx).generic_compiles, 1);
  check_matmul(g, 6, 37, 29, TU_F32, 980);
  check_matmul(g, 11, 37, 29, TU_F32, 981);
  jit_stats st = stats(ctx);
  cr_expect_eq(st.compiles, 1, "compiles %llu", (unsigned long long)st.compiles);
  cr_expect_eq(st.generic_runs, 2);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// AUTO on a GPU: the first binding compiles its own kernel (the generic one compiles
// in the background), later ones load the generic kernel with their sizes, and the
// binding that comes back gets its own kernel in the background and switches to it.
Test(shapes, auto_on_vulkan_specializes) {
  jit_context *ctx = vulkan_ctx(JIT_SHAPE_POLICY_AUTO, 2);
  jit_graph *g = matmul_graph(ctx, "M", 37, 29, TU_F32);
  check_matmul(g, 5, 37, 29, TU_F32, 960);  // its own
  check_matmul(g, 9, 37, 29, TU_F32, 961);  // the generic kernel
  check_matmul(g, 9, 37, 29, TU_F32, 962);  // the second run: asks for its own
  wait_specializations(ctx, 1);
  uint64_t before = stats(ctx).generic_runs;
  check_matmul(g, 9, 37, 29, TU_F32, 963);
  jit_stats st = stats(ctx);
  cr_expect_eq(before, 2);
  cr_expect_eq(st.generic_runs, before, "M=9 still ran the generic kernel");
  cr_expect_eq(st.compiles, 3, "M=5's, the generic one, M=9's");
  cr_expect_eq(st.generic_compiles, 1);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

//===--- Threads ---------------------------------------------------------===//

enum { kThreads = 4, kRounds = 24 };

typedef struct runner {
  jit_graph *g;
  const mlp_weights *w;
  int index;
  double worst;
} runner;

static void *run_stream(void *arg) {
  runner *r = arg;
  for (int i = 0; i < kRounds; i++) {
    int64_t n = 1 + (r->index + i) % 6;  // six bindings, each hot soon
    double e = mlp_check(r->g, r->w, n, (uint64_t)(r->index * 1000 + i));
    if (e > r->worst) r->worst = e;
  }
  return NULL;
}

// Runs from four threads while bindings are specialized in the background and switch
// from the generic kernel to their own: every result stays right.
Test(shapes, background_compiles_race_with_runs) {
  jit_context *ctx = ctx_with(JIT_SHAPE_POLICY_AUTO, 2, 0);
  jit_graph *g = mlp_graph(ctx);
  mlp_weights *w = mlp_weights_make(3);
  pthread_t t[kThreads];
  runner r[kThreads];
  for (int i = 0; i < kThreads; i++) {
    r[i] = (runner){g, w, i, 0};
    cr_assert(pthread_create(&t[i], NULL, run_stream, &r[i]) == 0);
  }
  for (int i = 0; i < kThreads; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < kThreads; i++)
    cr_expect(r[i].worst <= 1e-5, "thread %d: max |error| %g", i, r[i].worst);
  jit_stats st = stats(ctx);
  cr_expect_eq(st.runs, kThreads * kRounds);
  cr_expect_eq(st.generic_compiles, 1);
  free(w);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// Destroying a graph (then its context) with specializations queued and in flight
// neither hangs nor leaks (the ASan leg checks the leaks).
Test(shapes, destroy_with_compiles_in_flight) {
  jit_context *ctx = ctx_with(JIT_SHAPE_POLICY_AUTO, 1, 0);
  jit_graph *g = matmul_graph(ctx, "M", 300, 200, TU_F32);
  for (int64_t m = 1; m <= 6; m++) check_matmul(g, m, 300, 200, TU_F32, 800 + (uint64_t)m);
  jit_graph_destroy(g);  // five or six compiles were asked for; at most one runs
  cr_expect(stats(ctx).specializations < 6);
  jit_context_destroy(ctx);
}
