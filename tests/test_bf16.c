//===--- test_bf16.c - bfloat16 graphs against the plain-C reference ---------===//
//
// bf16 ({kDLBfloat, 16, 1}) is stored in 16 bits and computed in f32, rounded once per
// op (to nearest even), like f16. Each test rounds its inputs to bf16, computes the
// reference in double, rounds it to bf16 and compares with a tolerance of a few bf16
// ulps (8 significant bits: 2^-8 relative). Shapes include 1, primes and symbolic dims.
//
//===----------------------------------------------------------------------===//
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jitml.h"
#include "ref.h"
#include "util.h"

#define TU_BF16 ((DLDataType){kDLBfloat, 16, 1})

static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if (isnan(f)) return 0x7FC0;
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

static float from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static void round_bf16(float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) x[i] = from_bf16(to_bf16(x[i]));
}

// bf16 data for `x` (rounded in place, so the reference sees what the library sees).
static uint16_t *bf16_data(float *x, int64_t n) {
  uint16_t *h = tu_malloc((size_t)(n ? n : 1) * 2);
  for (int64_t i = 0; i < n; i++) h[i] = to_bf16(x[i]);
  round_bf16(x, n);
  return h;
}

// Runs `g` and compares output 0 ([rank, dims], bf16) with `want` (rounded to bf16 here).
static void run_check(jit_graph *g, const DLTensor *ins, int n_in, int rank, int64_t *dims,
                      float *want, double rtol, double atol, const char *what) {
  int64_t n = ref_numel(rank, dims);
  uint16_t *out = tu_malloc((size_t)n * 2);
  DLTensor ot = tu_tensor(out, TU_BF16, rank, dims);
  TU_OK(jit_run(g, ins, n_in, &ot, 1));
  float *got = tu_malloc((size_t)n * 4);
  for (int64_t i = 0; i < n; i++) got[i] = from_bf16(out[i]);
  round_bf16(want, n);
  tu_assert_close(got, want, n, rtol, atol, rank, dims, what);
  free(out);
  free(got);
}

static float *randoms(ref_rng *rng, int64_t n) {
  float *x = tu_malloc((size_t)(n ? n : 1) * 4);
  ref_rng_fill_signed(rng, x, n);
  return x;
}

// gelu_erf(x * y + 1) with broadcasting, a chain the emitter fuses (bf16 rounding
// between the steps as separate ops would round).
Test(bf16, elementwise_chain) {
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "bf16_ew");
  int64_t dx[2] = {jit_symbol(g, "N"), 13}, dy[1] = {13};
  jit_value x = jit_input(g, "x", TU_BF16, 2, dx), y = jit_input(g, "y", TU_BF16, 1, dy);
  jit_output(g, jit_gelu_erf(g, jit_add(g, jit_mul(g, x, y), jit_scalar(g, 1.0, TU_BF16))));
  TU_OK(jit_graph_finalize(g));
  ref_rng rng;
  ref_rng_seed(&rng, 1);
  for (int64_t n = 1; n <= 17; n += 16) {
    int64_t cx[2] = {n, 13};
    float *xv = randoms(&rng, n * 13), *yv = randoms(&rng, 13), *want = tu_malloc((size_t)n * 52);
    uint16_t *px = bf16_data(xv, n * 13), *py = bf16_data(yv, 13);
    for (int64_t i = 0; i < n * 13; i++) {
      float t = from_bf16(to_bf16(from_bf16(to_bf16(xv[i] * yv[i % 13])) + 1.0f));
      want[i] = (float)(0.5 * t * (1.0 + erf(t / sqrt(2.0))));
    }
    DLTensor ins[2] = {tu_tensor(px, TU_BF16, 2, cx), tu_tensor(py, TU_BF16, 1, dy)};
    run_check(g, ins, 2, 2, cx, want, 8e-3, 1e-3, "bf16 gelu_erf(x*y+1)");
    free(xv), free(yv), free(want), free(px), free(py);
  }
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// matmul (f32 accumulation) then softmax over the last axis, N symbolic.
Test(bf16, matmul_softmax) {
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "bf16_mm");
  int64_t da[2] = {jit_symbol(g, "N"), 67}, db[2] = {67, 31};
  jit_value a = jit_input(g, "a", TU_BF16, 2, da), b = jit_input(g, "b", TU_BF16, 2, db);
  jit_output(g, jit_softmax(g, jit_matmul(g, a, b), -1));
  TU_OK(jit_graph_finalize(g));
  ref_rng rng;
  ref_rng_seed(&rng, 2);
  for (int64_t n = 1; n <= 41; n += 40) {
    int64_t ca[2] = {n, 67}, co[2] = {n, 31};
    float *av = randoms(&rng, n * 67), *bv = randoms(&rng, 67 * 31),
          *want = tu_malloc((size_t)n * 31 * 4);
    uint16_t *pa = bf16_data(av, n * 67), *pb = bf16_data(bv, 67 * 31);
    for (int64_t i = 0; i < n; i++) {
      double row[31], mx = -INFINITY, sum = 0;
      for (int j = 0; j < 31; j++) {
        double acc = 0;
        for (int k = 0; k < 67; k++) acc += (double)av[i * 67 + k] * bv[k * 31 + j];
        row[j] = from_bf16(to_bf16((float)acc));  // the matmul's bf16 result
        if (row[j] > mx) mx = row[j];
      }
      for (int j = 0; j < 31; j++) sum += row[j] = exp(row[j] - mx);
      for (int j = 0; j < 31; j++) want[i * 31 + j] = (float)(row[j] / sum);
    }
    DLTensor ins[2] = {tu_tensor(pa, TU_BF16, 2, ca), tu_tensor(pb, TU_BF16, 2, db)};
    run_check(g, ins, 2, 2, co, want, 1.6e-2, 2e-3, "bf16 softmax(a b)");
    free(av), free(bv), free(want), free(pa), free(pb);
  }
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// layer_norm and a conv2d (im2col + matmul on the CPU), then casts to f32 and back.
Test(bf16, layer_norm_conv_cast) {
  jit_context *ctx = tu_context_policy(JIT_SHAPE_POLICY_EXACT);
  jit_graph *g = tu_graph(ctx, "bf16_conv");
  int64_t dx[4] = {2, 3, 7, 9}, dw[4] = {5, 3, 3, 3};
  jit_window_params p;
  jit_window_params_init(&p);
  for (int i = 0; i < 4; i++) p.padding[i] = 1;
  jit_value x = jit_input(g, "x", TU_BF16, 4, dx), w = jit_input(g, "w", TU_BF16, 4, dw);
  jit_value c = jit_conv2d(g, jit_layer_norm(g, x, (jit_value){0}, (jit_value){0}, 1e-5), w, &p);
  jit_output(g, jit_cast(g, jit_cast(g, c, TU_F32), TU_BF16));
  TU_OK(jit_graph_finalize(g));
  ref_rng rng;
  ref_rng_seed(&rng, 3);
  float *xv = randoms(&rng, 378), *wv = randoms(&rng, 135), *ln = tu_malloc(378 * 4),
        *want = tu_malloc(2 * 5 * 7 * 9 * 4);
  uint16_t *px = bf16_data(xv, 378), *pw = bf16_data(wv, 135);
  ref_norm_rows(xv, 42, 9, NULL, NULL, 1e-5, 0, ln);
  round_bf16(ln, 378);  // layer_norm's bf16 result
  ref_window rw = {0, 0, 0, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1, 1};
  ref_conv2d(&rw, ln, dx, wv, dw, want);
  int64_t od[4] = {2, 5, 7, 9};
  DLTensor ins[2] = {tu_tensor(px, TU_BF16, 4, dx), tu_tensor(pw, TU_BF16, 4, dw)};
  // layer_norm keeps bf16 intermediates (its mean, x - mean, variance: each rounded to
  // 8 bits), which the reference does not: a few bf16 ulps of the conv's inputs, summed
  // over 27 products.
  run_check(g, ins, 2, 4, od, want, 2e-2, 5e-2, "bf16 conv(layer_norm(x))");
  free(xv), free(wv), free(ln), free(want), free(px), free(pw);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// 3x3 stride-1 convolutions the CPU runs as Winograd over rows (emit_winograd.c: 16
// channels and filters, 784 output positions or more): 30 x 30 out with padding 1
// (F(4, 3), 30 rows in tiles of 4) and 5 x 160 out without (F(2, 3)), the bf16 rows
// widened in the first transform and the result rounded in the last, at 1 and 2
// threads.
Test(bf16, winograd_conv) {
  static const struct {
    int64_t h, w, pad;
  } kShapes[2] = {{30, 30, 1}, {7, 162, 0}};
  for (int s = 0; s < 2; s++) {
    for (int threads = 1; threads <= 2; threads++) {
      jit_options o;
      jit_options_init(&o);
      o.num_threads = threads;
      o.cache_dir = "";
      o.shape_policy = JIT_SHAPE_POLICY_EXACT;
      jit_context *ctx = NULL;
      TU_OK(jit_context_create(&o, &ctx));
      jit_graph *g = tu_graph(ctx, "bf16_winograd");
      int64_t P = kShapes[s].pad, dx[4] = {1, 16, kShapes[s].h, kShapes[s].w},
              dw[4] = {16, 16, 3, 3};
      int64_t od[4] = {1, 16, dx[2] + 2 * P - 2, dx[3] + 2 * P - 2};
      jit_window_params p;
      jit_window_params_init(&p);
      for (int i = 0; i < 4; i++) p.padding[i] = (int)P;
      jit_value x = jit_input(g, "x", TU_BF16, 4, dx), w = jit_input(g, "w", TU_BF16, 4, dw);
      jit_output(g, jit_conv2d(g, x, w, &p));
      TU_OK(jit_graph_finalize(g));
      ref_rng rng;
      ref_rng_seed(&rng, 11 + (uint64_t)s);
      int64_t nx = ref_numel(4, dx), nw = ref_numel(4, dw), ny = ref_numel(4, od);
      float *xv = randoms(&rng, nx), *wv = randoms(&rng, nw), *want = tu_malloc((size_t)ny * 4);
      uint16_t *px = bf16_data(xv, nx), *pw = bf16_data(wv, nw);
      int q = (int)P;
      ref_window rw = {0, 0, 0, {1, 1}, {q, q, q, q}, {1, 1}, 1, 0};
      ref_conv2d(&rw, xv, dx, wv, dw, want);
      DLTensor ins[2] = {tu_tensor(px, TU_BF16, 4, dx), tu_tensor(pw, TU_BF16, 4, dw)};
      char what[64];
      snprintf(what, sizeof what, "bf16 winograd %lldx%lld threads=%d", (long long)od[2],
               (long long)od[3], threads);
      // Sums of 144 products of values in [-1, 1] (up to ~10), rounded to 8 bits once.
      run_check(g, ins, 2, 4, od, want, 1e-2, 2e-2, what);
      free(xv), free(wv), free(want), free(px), free(pw);
      jit_graph_destroy(g);
      jit_context_destroy(ctx);
    }
  }
}

// Transposes of bf16 whose tiles would be transposed in registers (a [256, 9] one
// aborted the process in LLVM's x86 backend): exact, any shape.
Test(bf16, transposes) {
  static const int64_t kShapes[][2] = {{256, 9}, {9, 256}, {37, 1000}, {64, 64}, {1, 17}};
  for (int s = 0; s < 5; s++) {
    jit_context *ctx = tu_context_policy(JIT_SHAPE_POLICY_EXACT);
    jit_graph *g = tu_graph(ctx, "bf16_transpose");
    int64_t d[2] = {kShapes[s][0], kShapes[s][1]}, t[2] = {d[1], d[0]};
    int perm[2] = {1, 0};
    jit_output(g, jit_transpose(g, jit_input(g, "x", TU_BF16, 2, d), perm));
    TU_OK(jit_graph_finalize(g));
    ref_rng rng;
    ref_rng_seed(&rng, 40 + (uint64_t)s);
    int64_t n = d[0] * d[1];
    float *xv = randoms(&rng, n), *want = tu_malloc((size_t)n * 4);
    uint16_t *px = bf16_data(xv, n);
    for (int64_t i = 0; i < d[0]; i++)
      for (int64_t j = 0; j < d[1]; j++) want[j * d[0] + i] = xv[i * d[1] + j];
    DLTensor in = tu_tensor(px, TU_BF16, 2, d);
    run_check(g, &in, 1, 2, t, want, 0, 0, "bf16 transpose");
    free(xv), free(want), free(px);
    jit_graph_destroy(g);
    jit_context_destroy(ctx);
  }
}

// f32 -> bf16 rounds to nearest even (ties, overflow to inf, NaN), bf16 -> f32 exact.
Test(bf16, cast_rounding) {
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "bf16_cast");
  int64_t d[1] = {8};
  jit_value x = jit_input(g, "x", TU_F32, 1, d);
  jit_output(g, jit_cast(g, x, TU_BF16));
  TU_OK(jit_graph_finalize(g));
  float xv[8] = {1.0f, 1.0f + 1.0f / 256.0f, 1.0f + 3.0f / 256.0f, -2.5f, 3.4e38f, NAN,
                 1e-40f, -0.0f};
  uint16_t out[8];
  DLTensor in = tu_tensor(xv, TU_F32, 1, d), ot = tu_tensor(out, TU_BF16, 1, d);
  TU_OK(jit_run(g, &in, 1, &ot, 1));
  // A subnormal may flush to zero (AVX-512 BF16's conversion does; others round it).
  for (int i = 0; i < 8; i++)
    cr_expect(out[i] == to_bf16(xv[i]) || (isnan(xv[i]) && isnan(from_bf16(out[i]))) ||
                  (fabsf(xv[i]) < 1.2e-38f && (out[i] & 0x7FFF) == 0),
              "cast(%g) = 0x%04x, want 0x%04x", xv[i], out[i], to_bf16(xv[i]));
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// Attention in bf16 (computed in f32, blocked on the CPU's exact kernels).
Test(bf16, attention) {
  jit_context *ctx = tu_context_policy(JIT_SHAPE_POLICY_EXACT);
  jit_graph *g = tu_graph(ctx, "bf16_att");
  int64_t dq[3] = {2, 5, 8}, dk[3] = {2, 70, 8};
  jit_value q = jit_input(g, "q", TU_BF16, 3, dq), k = jit_input(g, "k", TU_BF16, 3, dk),
            v = jit_input(g, "v", TU_BF16, 3, dk);
  jit_output(g, jit_attention(g, q, k, v, (jit_value){0}, 0.5, 1));
  TU_OK(jit_graph_finalize(g));
  ref_rng rng;
  ref_rng_seed(&rng, 4);
  float *qv = randoms(&rng, 80), *kv = randoms(&rng, 1120), *vv = randoms(&rng, 1120),
        *want = tu_malloc(80 * 4);
  uint16_t *pq = bf16_data(qv, 80), *pk = bf16_data(kv, 1120), *pv = bf16_data(vv, 1120);
  for (int b = 0; b < 2; b++)
    for (int i = 0; i < 5; i++) {
      double s[70], mx = -INFINITY, sum = 0;
      for (int j = 0; j < 70; j++) {
        double acc = 0;
        for (int d = 0; d < 8; d++) acc += (double)qv[(b * 5 + i) * 8 + d] * kv[(b * 70 + j) * 8 + d];
        s[j] = j > i + 65 ? -INFINITY : 0.5 * acc;
        if (s[j] > mx) mx = s[j];
      }
      for (int j = 0; j < 70; j++) sum += s[j] = exp(s[j] - mx);
      for (int c = 0; c < 8; c++) {
        double acc = 0;
        for (int j = 0; j < 70; j++) acc += s[j] * vv[(b * 70 + j) * 8 + c];
        want[(b * 5 + i) * 8 + c] = (float)(acc / sum);
      }
    }
  DLTensor ins[3] = {tu_tensor(pq, TU_BF16, 3, dq), tu_tensor(pk, TU_BF16, 3, dk),
                     tu_tensor(pv, TU_BF16, 3, dk)};
  run_check(g, ins, 3, 3, dq, want, 1e-2, 2e-3, "bf16 attention");
  free(qv), free(kv), free(vv), free(want), free(pq), free(pk), free(pv);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}
