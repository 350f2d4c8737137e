//===--- test_ops.c - every op, f32 and f16, against the plain-C reference -===//
//
// Each test builds a graph (often with symbolic dims), runs it for one or more
// concrete shapes, and compares with tests/ref.c. Shapes include 1, primes and sizes
// that are not multiples of the tile sizes (8/32/64/256).
//
//===----------------------------------------------------------------------===//
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jitml.h"
#include "ref.h"
#include "util.h"

// Placeholders in shape specs: replaced by jit_symbol(g, "N"/"M") in the graph and by
// the concrete size at run time.
#define SYM_N (-100)
#define SYM_M (-101)

static void spec_graph_dims(jit_graph *g, int rank, const int64_t *spec, int64_t *out) {
  for (int i = 0; i < rank; i++) {
    if (spec[i] == SYM_N)
      out[i] = jit_symbol(g, "N");
    else if (spec[i] == SYM_M)
      out[i] = jit_symbol(g, "M");
    else
      out[i] = spec[i];
  }
}

static void spec_concrete(int rank, const int64_t *spec, int64_t n, int64_t m,
                          int64_t *out) {
  for (int i = 0; i < rank; i++)
    out[i] = spec[i] == SYM_N ? n : spec[i] == SYM_M ? m : spec[i];
}

static const char *dtype_name(DLDataType dt) { return tu_is_f16(dt) ? "f16" : "f32"; }

// Fills x with values for `op`'s operand: denominators stay away from zero.
static void fill_operand(ref_rng *rng, float *x, int64_t n, int denominator) {
  ref_rng_fill_signed(rng, x, n);
  if (denominator)
    for (int64_t i = 0; i < n; i++) x[i] = (x[i] < 0 ? -0.5f : 0.5f) + 0.5f * x[i];
}

//===--- Reference self-checks ----------------------------------------------===//

Test(ref, f16_conversion) {
  cr_assert_eq(ref_f32_to_f16(1.0f), 0x3c00);
  cr_assert_eq(ref_f32_to_f16(-2.0f), 0xc000);
  cr_assert_eq(ref_f32_to_f16(65504.0f), 0x7bff);
  cr_assert_eq(ref_f32_to_f16(65520.0f), 0x7c00);  // rounds up to inf
  cr_assert_eq(ref_f32_to_f16(0.1f), 0x2e66);
  cr_assert_eq(ref_f32_to_f16(5.9604645e-8f), 0x0001);  // 2^-24
  cr_assert_eq(ref_f32_to_f16(2.98023224e-8f), 0x0000);  // 2^-25: tie to even (0)
  cr_assert_eq(ref_f32_to_f16(1.0f + 1.0f / 2048.0f), 0x3c00);  // tie to even
  cr_assert_eq(ref_f32_to_f16(1.0f + 3.0f / 2048.0f), 0x3c02);  // tie to even (up)
  cr_assert_eq(ref_f32_to_f16(1000.0f), 0x63d0);
  cr_assert(isinf(ref_f16_to_f32(0xfc00)) && ref_f16_to_f32(0xfc00) < 0);
  cr_assert(isnan(ref_f16_to_f32(ref_f32_to_f16(NAN))));
  // Every finite half survives a round trip.
  for (uint32_t h = 0; h < 0x10000u; h++) {
    if ((h & 0x7c00u) == 0x7c00u) continue;
    cr_assert_eq(ref_f32_to_f16(ref_f16_to_f32((uint16_t)h)), h, "h=0x%04x", h);
  }
}

Test(ref, broadcast_and_matmul_shapes) {
  int64_t a[] = {7, 1, 5}, b[] = {3, 1}, c[8];
  cr_assert_eq(ref_broadcast_shape(3, a, 2, b, c), 3);
  cr_assert(c[0] == 7 && c[1] == 3 && c[2] == 5);
  int64_t x[] = {3, 4}, y[] = {4};
  cr_assert_eq(ref_broadcast_shape(1, x + 0, 1, y, c), -1);
  int64_t ma[] = {1, 4, 5}, mb[] = {3, 5, 6};
  cr_assert_eq(ref_matmul(NULL, 3, ma, NULL, 3, mb, NULL, c), 3);
  cr_assert(c[0] == 3 && c[1] == 4 && c[2] == 6);
}

//===--- Binary elementwise ---------------------------------------------------===//

typedef jit_value (*binary_fn)(jit_graph *, jit_value, jit_value);

static binary_fn binary_fn_of(ref_binop op) {
  switch (op) {
    case REF_ADD: return jit_add;
    case REF_SUB: return jit_sub;
    case REF_MUL: return jit_mul;
    case REF_DIV: return jit_div;
    case REF_MAX: return jit_maximum;
    case REF_MIN: return jit_minimum;
    default: return NULL;  // the others are test_nn.c's
  }
}

typedef struct binary_case {
  int ra;
  int64_t a[8];
  int rb;
  int64_t b[8];
  int nn;          // number of N values (1 if the shapes have no symbol)
  int64_t ns[4];   // values of N (M = N + 2 where used)
} binary_case;

static const binary_case kBinaryCases[] = {
    {2, {SYM_N, 5}, 2, {SYM_N, 5}, 3, {1, 7, 61}},          // same shape, symbolic
    {3, {7, 1, 5}, 2, {3, 1}, 1, {0}},                      // -> [7,3,5]
    {2, {SYM_N, 5}, 1, {5}, 2, {1, 13}},                    // row vector
    {2, {1, 3}, 2, {SYM_N, 3}, 2, {1, 17}},                 // static 1 vs symbol
    {0, {0}, 2, {2, SYM_N}, 2, {3, 31}},                    // rank-0 input
    {3, {SYM_N, 1, 4}, 3, {SYM_N, 6, 1}, 2, {2, 5}},        // -> [N,6,4]
    {2, {SYM_N, 257}, 2, {SYM_N, 257}, 1, {9}},             // > one 256 tile
    {8, {2, 1, 3, 1, 2, 1, 2, 3}, 6, {3, 1, 2, 1, 2, 1}, 1, {0}},  // rank 8
};

static void check_binary(ref_binop op, DLDataType dt) {
  binary_fn fn = binary_fn_of(op);
  const int f16 = tu_is_f16(dt);
  const double rtol = f16 ? 5e-3 : 1e-5, atol = f16 ? 1e-4 : 1e-6;
  ref_rng rng;
  ref_rng_seed(&rng, 1000 + (uint64_t)op * 10 + (uint64_t)f16);
  jit_context *ctx = tu_context();
  for (size_t ci = 0; ci < sizeof(kBinaryCases) / sizeof(kBinaryCases[0]); ci++) {
    const binary_case *c = &kBinaryCases[ci];
    jit_graph *g = tu_graph(ctx, "binary");
    int64_t ga[8] = {1}, gb[8] = {1};
    spec_graph_dims(g, c->ra, c->a, ga);
    spec_graph_dims(g, c->rb, c->b, gb);
    jit_value a = jit_input(g, "a", dt, c->ra, ga);
    jit_value b = jit_input(g, "b", dt, c->rb, gb);
    jit_output(g, fn(g, a, b));
    TU_OK(jit_graph_finalize(g));
    for (int k = 0; k < c->nn; k++) {
      int64_t da[8] = {1}, db[8] = {1}, dc[8];
      spec_concrete(c->ra, c->a, c->ns[k], c->ns[k] + 2, da);
      spec_concrete(c->rb, c->b, c->ns[k], c->ns[k] + 2, db);
      int rc = ref_broadcast_shape(c->ra, da, c->rb, db, dc);
      cr_assert(rc >= 0);
      int64_t na = ref_numel(c->ra, da), nb = ref_numel(c->rb, db),
              nc = ref_numel(rc, dc);
      float *xa = tu_malloc((size_t)na * 4), *xb = tu_malloc((size_t)nb * 4),
            *want = tu_malloc((size_t)nc * 4);
      fill_operand(&rng, xa, na, 0);
      fill_operand(&rng, xb, nb, op == REF_DIV);
      void *pa = tu_input_data(dt, xa, na), *pb = tu_input_data(dt, xb, nb);
      ref_binary(op, xa, c->ra, da, xb, c->rb, db, want);
      if (f16) ref_round_f16_array(want, nc);
      DLTensor ins[2] = {tu_tensor(pa, dt, c->ra, da), tu_tensor(pb, dt, c->rb, db)};
      char what[128];
      snprintf(what, sizeof(what), "%s %s case %zu N=%lld", ref_binop_name(op),
               dtype_name(dt), ci, (long long)c->ns[k]);
      tu_run_check(g, ins, 2, dt, rc, dc, want, rtol, atol, NULL, what);
      free(xa);
      free(xb);
      free(want);
      free(pa);
      free(pb);
    }
    jit_graph_destroy(g);
  }
  jit_context_destroy(ctx);
}

// x op s and s op x with s = jit_scalar(2.5).
static void check_binary_scalar(ref_binop op, DLDataType dt) {
  binary_fn fn = binary_fn_of(op);
  const int f16 = tu_is_f16(dt);
  const double rtol = f16 ? 5e-3 : 1e-5, atol = f16 ? 1e-4 : 1e-6;
  const double s = 2.5;
  ref_rng rng;
  ref_rng_seed(&rng, 77 + (uint64_t)op);
  jit_context *ctx = tu_context();
  for (int scalar_first = 0; scalar_first < 2; scalar_first++) {
    jit_graph *g = tu_graph(ctx, "binary_scalar");
    int64_t gd[2] = {jit_symbol(g, "N"), 13};
    jit_value x = jit_input(g, "x", dt, 2, gd);
    jit_value sv = jit_scalar(g, s, dt);
    jit_output(g, scalar_first ? fn(g, sv, x) : fn(g, x, sv));
    TU_OK(jit_graph_finalize(g));
    const int64_t ns[] = {1, 7};
    for (int k = 0; k < 2; k++) {
      int64_t d[2] = {ns[k], 13};
      int64_t n = ref_numel(2, d);
      float *xv = tu_malloc((size_t)n * 4), *want = tu_malloc((size_t)n * 4);
      fill_operand(&rng, xv, n, op == REF_DIV && scalar_first);
      void *px = tu_input_data(dt, xv, n);
      for (int64_t i = 0; i < n; i++)
        want[i] = (float)(scalar_first ? ref_binary_scalar(op, s, xv[i])
                                       : ref_binary_scalar(op, xv[i], s));
      if (f16) ref_round_f16_array(want, n);
      DLTensor in = tu_tensor(px, dt, 2, d);
      char what[128];
      snprintf(what, sizeof(what), "%s %s scalar_first=%d N=%lld", ref_binop_name(op),
               dtype_name(dt), scalar_first, (long long)ns[k]);
      tu_run_check(g, &in, 1, dt, 2, d, want, rtol, atol, NULL, what);
      free(xv);
      free(want);
      free(px);
    }
    jit_graph_destroy(g);
  }
  jit_context_destroy(ctx);
}

#define BINARY_TESTS(name, op)                                          \
  Test(binary, name##_f32) { check_binary(op, TU_F32); }                \
  Test(binary, name##_f16) { check_binary(op, TU_F16); }                \
  Test(binary, name##_scalar_f32) { check_binary_scalar(op, TU_F32); }  \
  Test(binary, name##_scalar_f16) { check_binary_scalar(op, TU_F16); }

BINARY_TESTS(add, REF_ADD)
BINARY_TESTS(sub, REF_SUB)
BINARY_TESTS(mul, REF_MUL)
BINARY_TESTS(div, REF_DIV)
BINARY_TESTS(maximum, REF_MAX)
BINARY_TESTS(minimum, REF_MIN)

//===--- Unary elementwise ----------------------------------------------------===//

typedef jit_value (*unary_fn)(jit_graph *, jit_value);

static unary_fn unary_fn_of(ref_unop op) {
  switch (op) {
    case REF_NEG: return jit_neg;
    case REF_EXP: return jit_exp;
    case REF_LOG: return jit_log;
    case REF_TANH: return jit_tanh;
    case REF_SIGMOID: return jit_sigmoid;
    case REF_RELU: return jit_relu;
    case REF_GELU: return jit_gelu;
    case REF_SQRT: return jit_sqrt;
    case REF_RSQRT: return jit_rsqrt;
    case REF_ERF: return jit_erf;
    case REF_GELU_ERF: return jit_gelu_erf;
    case REF_ROUND: return jit_round;
  }
  return NULL;
}

static void check_unary(ref_unop op, DLDataType dt) {
  unary_fn fn = unary_fn_of(op);
  const int f16 = tu_is_f16(dt);
  double rtol = f16 ? 5e-3 : 1e-5, atol = f16 ? 1e-4 : 1e-6;
  if (!f16 && op == REF_GELU) {
    rtol = 1e-4;
    atol = 1e-5;
  }
  const int positive = op == REF_LOG || op == REF_SQRT || op == REF_RSQRT;
  ref_rng rng;
  ref_rng_seed(&rng, 500 + (uint64_t)op * 3 + (uint64_t)f16);
  jit_context *ctx = tu_context();

  // A symbolic [N, 13] run for several N, then a static rank-3 shape.
  const int64_t spec_sym[2] = {SYM_N, 13}, spec_static[3] = {3, 7, 67};
  const int64_t ns[] = {1, 17, 64};
  for (int shape = 0; shape < 2; shape++) {
    const int rank = shape == 0 ? 2 : 3;
    const int64_t *spec = shape == 0 ? spec_sym : spec_static;
    const int nn = shape == 0 ? 3 : 1;
    jit_graph *g = tu_graph(ctx, "unary");
    int64_t gd[3];
    spec_graph_dims(g, rank, spec, gd);
    jit_value x = jit_input(g, "x", dt, rank, gd);
    jit_output(g, fn(g, x));
    TU_OK(jit_graph_finalize(g));
    for (int k = 0; k < nn; k++) {
      int64_t d[3];
      spec_concrete(rank, spec, ns[k], 0, d);
      int64_t n = ref_numel(rank, d);
      float *xv = tu_malloc((size_t)n * 4), *want = tu_malloc((size_t)n * 4);
      if (positive)
        ref_rng_fill(&rng, xv, n, 0.05f, 4.0f);
      else
        ref_rng_fill(&rng, xv, n, -3.0f, 3.0f);
      if (n > 2 && !positive) xv[0] = 0.0f;  // exact zero: relu/gelu/tanh edge
      void *px = tu_input_data(dt, xv, n);
      ref_unary(op, xv, n, want);
      if (f16) ref_round_f16_array(want, n);
      DLTensor in = tu_tensor(px, dt, rank, d);
      char what[128];
      snprintf(what, sizeof(what), "%s %s shape %d N=%lld", ref_unop_name(op),
               dtype_name(dt), shape, (long long)ns[k]);
      tu_run_check(g, &in, 1, dt, rank, d, want, rtol, atol, NULL, what);
      free(xv);
      free(want);
      free(px);
    }
    jit_graph_destroy(g);
  }
  jit_context_destroy(ctx);
}

#define UNARY_TESTS(name, op)                            \
  Test(unary, name##_f32) { check_unary(op, TU_F32); }   \
  Test(unary, name##_f16) { check_unary(op, TU_F16); }

UNARY_TESTS(neg, REF_NEG)
UNARY_TESTS(exp, REF_EXP)
UNARY_TESTS(log, REF_LOG)
UNARY_TESTS(tanh, REF_TANH)
UNARY_TESTS(sigmoid, REF_SIGMOID)
UNARY_TESTS(relu, REF_RELU)
UNARY_TESTS(gelu, REF_GELU)
UNARY_TESTS(sqrt, REF_SQRT)
UNARY_TESTS(rsqrt, REF_RSQRT)
UNARY_TESTS(erf, REF_ERF)
UNARY_TESTS(gelu_erf, REF_GELU_ERF)
UNARY_TESTS(round, REF_ROUND)

// erf where its approximation ends: 1 beyond |x| = 4 and at infinity, odd and accurate
// for tiny x (no cancellation), NaN kept.
Test(unary, erf_edges) {
  static const float xs[] = {-INFINITY, -10.0f, -4.5f, -4.0f, -1e-30f, 0.0f, 1e-30f,
                             1e-4f,     0.5f,   3.9f,  4.0f,  4.5f,    10.0f, INFINITY, NAN};
  enum { n = sizeof xs / sizeof xs[0] };
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "erf_edges");
  int64_t d[1] = {n};
  jit_output(g, jit_erf(g, jit_input(g, "x", TU_F32, 1, d)));
  TU_OK(jit_graph_finalize(g));
  float x[n], want[n];
  memcpy(x, xs, sizeof x);
  for (int i = 0; i < n; i++) want[i] = (float)erf((double)xs[i]);
  DLTensor in = tu_tensor(x, TU_F32, 1, d);
  tu_run_check(g, &in, 1, TU_F32, 1, d, want, 1e-6, 0.0, NULL, "erf edges");
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

//===--- Norms and clamp (ops composed of others) --------------------------------===//

// layer_norm / rms_norm over the last axis of [N, C] (symbolic N) and [3, 5, C], with
// weight and bias, weight only, and neither; C = 1, 13 and 67.
static void check_norm(DLDataType dt, int rms) {
  const int f16 = tu_is_f16(dt);
  ref_rng rng;
  ref_rng_seed(&rng, 900 + (uint64_t)rms * 2 + (uint64_t)f16);
  jit_context *ctx = tu_context();
  const int64_t cols[] = {1, 13, 67};
  for (int ci = 0; ci < 3; ci++) {
    for (int affine = 0; affine < 3; affine++) {  // 0: w and b, 1: w, 2: none
      if (rms && affine == 0) continue;           // rms_norm takes no bias
      int64_t C = cols[ci];
      for (int shape = 0; shape < 2; shape++) {
        jit_graph *g = tu_graph(ctx, rms ? "rms_norm" : "layer_norm");
        const int rank = shape == 0 ? 2 : 3;
        int64_t gd[3] = {jit_symbol(g, "N"), C, 0}, dc[1] = {C};
        if (shape == 1) gd[0] = 3, gd[1] = 5, gd[2] = C;
        jit_value x = jit_input(g, "x", dt, rank, gd);
        jit_value w = affine < 2 ? jit_input(g, "w", dt, 1, dc) : (jit_value){0};
        jit_value b = affine == 0 ? jit_input(g, "b", dt, 1, dc) : (jit_value){0};
        double eps = 1e-5;
        jit_output(g, rms ? jit_rms_norm(g, x, w, eps) : jit_layer_norm(g, x, w, b, eps));
        TU_OK(jit_graph_finalize(g));
        const int64_t ns[] = {1, 7, 64};
        for (int k = 0; k < (shape == 0 ? 3 : 1); k++) {
          int64_t d[3] = {ns[k], C, 0};
          if (shape == 1) d[0] = 3, d[1] = 5, d[2] = C;
          int64_t n = ref_numel(rank, d), rows = n / C;
          float *xv = tu_malloc((size_t)n * 4), *want = tu_malloc((size_t)n * 4);
          float wv[67], bv[67];
          ref_rng_fill(&rng, xv, n, -2.0f, 3.0f);
          ref_rng_fill(&rng, wv, C, 0.5f, 1.5f);
          ref_rng_fill_signed(&rng, bv, C);
          void *px = tu_input_data(dt, xv, n), *pw = tu_input_data(dt, wv, C),
               *pb = tu_input_data(dt, bv, C);
          ref_norm_rows(xv, rows, C, affine < 2 ? wv : NULL, affine == 0 ? bv : NULL, eps,
                        rms, want);
          if (f16) ref_round_f16_array(want, n);
          DLTensor ins[3] = {tu_tensor(px, dt, rank, d), tu_tensor(pw, dt, 1, dc),
                             tu_tensor(pb, dt, 1, dc)};
          char what[128];
          snprintf(what, sizeof what, "%s %s C=%lld affine %d shape %d N=%lld",
                   rms ? "rms_norm" : "layer_norm", dtype_name(dt), (long long)C, affine,
                   shape, (long long)d[0]);
          // f16 keeps f16 intermediates (mean, variance): a few ulps more.
          tu_run_check(g, ins, 3 - affine, dt, rank, d, want, f16 ? 2e-2 : 1e-4,
                       f16 ? 2e-2 : 1e-5, NULL, what);
          free(xv), free(want), free(px), free(pw), free(pb);
        }
        jit_graph_destroy(g);
      }
    }
  }
  jit_context_destroy(ctx);
}

// layer_norm of a residual after a rank-3 matmul, h = x W + x, x [B, S, C]: at B = S = 1
// elementwise fusion's reshapes left the mean read as (d0, d1) -> (0, 0, 0), which the
// CPU plan vectorized and the compile failed on ("Attempted to vectorize, but failed"),
// GPT-2's block at B = S = 1 among such graphs. C = 1 (no row loop), 67 and 256.
Test(norm, layer_norm_after_matmul) {
  ref_rng rng;
  ref_rng_seed(&rng, 907);
  jit_context *ctx = tu_context();
  static const int64_t bs[][2] = {{1, 1}, {1, 5}, {3, 1}, {2, 7}};
  static const int64_t cols[] = {1, 67, 256};
  for (int ci = 0; ci < 3; ci++) {
    for (int k = 0; k < 4; k++) {
      int64_t C = cols[ci], d[3] = {bs[k][0], bs[k][1], C}, dw[2] = {C, C};
      jit_graph *g = tu_graph(ctx, "layer_norm_after_matmul");
      jit_value x = jit_input(g, "x", TU_F32, 3, d), w = jit_input(g, "w", TU_F32, 2, dw);
      jit_value h = jit_add(g, jit_matmul(g, x, w), x);
      jit_output(g, jit_layer_norm(g, h, (jit_value){0}, (jit_value){0}, 1e-5));
      TU_OK(jit_graph_finalize(g));
      int64_t n = ref_numel(3, d), dh[3];
      float *xv = tu_malloc((size_t)n * 4), *wv = tu_malloc((size_t)(C * C) * 4);
      float *hv = tu_malloc((size_t)n * 4), *want = tu_malloc((size_t)n * 4);
      ref_rng_fill(&rng, xv, n, -1.0f, 1.0f);
      ref_rng_fill(&rng, wv, C * C, -0.1f, 0.1f);
      cr_assert_eq(ref_matmul(xv, 3, d, wv, 2, dw, hv, dh), 3);
      for (int64_t i = 0; i < n; i++) hv[i] += xv[i];
      ref_norm_rows(hv, n / C, C, NULL, NULL, 1e-5, 0, want);
      DLTensor ins[2] = {tu_tensor(xv, TU_F32, 3, d), tu_tensor(wv, TU_F32, 2, dw)};
      char what[96];
      snprintf(what, sizeof what, "layer_norm(x W + x) B=%lld S=%lld C=%lld",
               (long long)d[0], (long long)d[1], (long long)C);
      tu_run_check(g, ins, 2, TU_F32, 3, d, want, 1e-4, 1e-4, NULL, what);
      free(xv), free(wv), free(hv), free(want);
      jit_graph_destroy(g);
    }
  }
  jit_context_destroy(ctx);
}

Test(norm, layer_norm_f32) { check_norm(TU_F32, 0); }
Test(norm, layer_norm_f16) { check_norm(TU_F16, 0); }
Test(norm, rms_norm_f32) { check_norm(TU_F32, 1); }
Test(norm, rms_norm_f16) { check_norm(TU_F16, 1); }

Test(norm, clamp) {
  jit_context *ctx = tu_context();
  static const struct { double lo, hi; } bounds[] = {
      {-1.0, 2.5}, {0.0, 0.0}, {-INFINITY, 1.0}, {-0.5, INFINITY}, {-INFINITY, INFINITY}};
  for (size_t i = 0; i < sizeof bounds / sizeof bounds[0]; i++) {
    jit_graph *g = tu_graph(ctx, "clamp");
    int64_t d[2] = {jit_symbol(g, "N"), 17};
    jit_output(g, jit_clamp(g, jit_input(g, "x", TU_F32, 2, d), bounds[i].lo, bounds[i].hi));
    TU_OK(jit_graph_finalize(g));
    for (int64_t n = 1; n <= 13; n += 12) {
      int64_t s[2] = {n, 17};
      float x[13 * 17], want[13 * 17];
      for (int64_t j = 0; j < n * 17; j++) {
        x[j] = (float)(j % 23) * 0.37f - 4.0f;
        want[j] = fminf(fmaxf(x[j], (float)bounds[i].lo), (float)bounds[i].hi);
      }
      DLTensor in = tu_tensor(x, TU_F32, 2, s);
      tu_run_check(g, &in, 1, TU_F32, 2, s, want, 0, 0, NULL, "clamp");
    }
    jit_graph_destroy(g);
  }
  jit_context_destroy(ctx);
}

// Bad arguments name the op: a weight of the wrong length, a bias of the wrong rank,
// a negative or NaN eps, a rank-0 x, clamp bounds that are no interval.
Test(norm, bad_arguments) {
  jit_context *ctx = tu_context();
  static const char *const says[] = {"weight has shape [12]", "bias has shape [1, 13]",
                                     "eps must be finite", "eps must be finite",
                                     "rank >= 1", "not an interval", "not an interval"};
  static const jit_status_code codes[] = {JIT_SHAPE_MISMATCH, JIT_SHAPE_MISMATCH,
                                          JIT_INVALID_ARGUMENT, JIT_INVALID_ARGUMENT,
                                          JIT_INVALID_ARGUMENT, JIT_INVALID_ARGUMENT,
                                          JIT_INVALID_ARGUMENT};
  for (int i = 0; i < 7; i++) {
    jit_graph *g = tu_graph(ctx, "bad");
    int64_t dx[2] = {jit_symbol(g, "N"), 13}, d12[1] = {12}, d13[1] = {13},
            d1x13[2] = {1, 13};
    jit_value x = jit_input(g, "x", TU_F32, 2, dx);
    jit_value y = {0};
    switch (i) {
      case 0: y = jit_layer_norm(g, x, jit_input(g, "w", TU_F32, 1, d12), (jit_value){0}, 1e-5); break;
      case 1:
        y = jit_layer_norm(g, x, jit_input(g, "w", TU_F32, 1, d13),
                           jit_input(g, "b", TU_F32, 2, d1x13), 1e-5);
        break;
      case 2: y = jit_rms_norm(g, x, (jit_value){0}, -1.0); break;
      case 3: y = jit_layer_norm(g, x, (jit_value){0}, (jit_value){0}, NAN); break;
      case 4: y = jit_rms_norm(g, jit_reduce_sum(g, jit_reduce_sum(g, x, 0, 0), 0, 0),
                               (jit_value){0}, 1e-5); break;
      case 5: y = jit_clamp(g, x, 2.0, 1.0); break;
      case 6: y = jit_clamp(g, x, NAN, 1.0); break;
    }
    cr_expect_eq(y.id, 0, "case %d built a value", i);
    jit_output(g, x);
    jit_status s = jit_graph_finalize(g);
    TU_EXPECT_CODE(s, codes[i]);
    TU_EXPECT_MSG(s, says[i]);
    jit_status_free(s);
    jit_graph_destroy(g);
  }
  jit_context_destroy(ctx);
}

//===--- Matmul ---------------------------------------------------------------===//

// Builds matmul(a, b) from specs and runs it for each N in ns (M = N + 2).
static void check_matmul(DLDataType dt, int ra, const int64_t *spec_a, int rb,
                         const int64_t *spec_b, int nn, const int64_t *ns,
                         uint64_t seed) {
  const int f16 = tu_is_f16(dt);
  ref_rng rng;
  ref_rng_seed(&rng, seed);
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "matmul");
  int64_t ga[8], gb[8];
  spec_graph_dims(g, ra, spec_a, ga);
  spec_graph_dims(g, rb, spec_b, gb);
  jit_value a = jit_input(g, "a", dt, ra, ga);
  jit_value b = jit_input(g, "b", dt, rb, gb);
  jit_output(g, jit_matmul(g, a, b));
  TU_OK(jit_graph_finalize(g));
  for (int k = 0; k < nn; k++) {
    int64_t n_sym = nn ? ns[k] : 0;
    int64_t da[8], db[8], dc[8];
    spec_concrete(ra, spec_a, n_sym, n_sym + 2, da);
    spec_concrete(rb, spec_b, n_sym, n_sym + 2, db);
    int rc = ref_matmul(NULL, ra, da, NULL, rb, db, NULL, dc);
    cr_assert(rc >= 2);
    const int64_t K = da[ra - 1];
    int64_t na = ref_numel(ra, da), nb = ref_numel(rb, db), nc = ref_numel(rc, dc);
    float *xa = tu_malloc((size_t)na * 4), *xb = tu_malloc((size_t)nb * 4),
          *want = tu_malloc((size_t)nc * 4);
    ref_rng_fill_signed(&rng, xa, na);
    ref_rng_fill_signed(&rng, xb, nb);
    void *pa = tu_input_data(dt, xa, na), *pb = tu_input_data(dt, xb, nb);
    ref_matmul(xa, ra, da, xb, rb, db, want, dc);
    if (f16) ref_round_f16_array(want, nc);
    // f32: rounding error grows with K; f16: one rounding of the f32 sum, plus slack
    // for the f32 accumulation.
    double rtol = f16 ? 5e-3 : 1e-5;
    double atol = f16 ? 1e-3 * sqrt((double)K) + 1e-3 : 2.0 * K * FLT_EPSILON + 1e-6;
    DLTensor ins[2] = {tu_tensor(pa, dt, ra, da), tu_tensor(pb, dt, rb, db)};
    char what[160];
    snprintf(what, sizeof(what),
             "matmul %s rank %d x rank %d, M=%lld K=%lld N=%lld (symbol value %lld)",
             dtype_name(dt), ra, rb, (long long)da[ra - 2], (long long)K,
             (long long)db[rb - 1], (long long)n_sym);
    tu_run_check(g, ins, 2, dt, rc, dc, want, rtol, atol, NULL, what);
    free(xa);
    free(xb);
    free(want);
    free(pa);
    free(pb);
  }
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

static void check_matmul_mkn(DLDataType dt, int64_t M, int64_t K, int64_t N) {
  const int64_t a[2] = {M, K}, b[2] = {K, N}, one[1] = {0};
  check_matmul(dt, 2, a, 2, b, 1, one, (uint64_t)(M * 1000003 + K * 1009 + N));
}

Test(matmul, static_f32_1x1x1) { check_matmul_mkn(TU_F32, 1, 1, 1); }
Test(matmul, static_f32_17x31x45) { check_matmul_mkn(TU_F32, 17, 31, 45); }
Test(matmul, static_f32_64x128x96) { check_matmul_mkn(TU_F32, 64, 128, 96); }
Test(matmul, static_f32_61x67x257) { check_matmul_mkn(TU_F32, 61, 67, 257); }
Test(matmul, static_f32_1x768x33) { check_matmul_mkn(TU_F32, 1, 768, 33); }
Test(matmul, static_f32_13x7x1) { check_matmul_mkn(TU_F32, 13, 7, 1); }

Test(matmul, static_f16_1x1x1) { check_matmul_mkn(TU_F16, 1, 1, 1); }
Test(matmul, static_f16_17x31x45) { check_matmul_mkn(TU_F16, 17, 31, 45); }
Test(matmul, static_f16_61x67x257) { check_matmul_mkn(TU_F16, 61, 67, 257); }
Test(matmul, static_f16_1x768x33) { check_matmul_mkn(TU_F16, 1, 768, 33); }

Test(matmul, symbolic_m_f32) {
  const int64_t a[2] = {SYM_N, 31}, b[2] = {31, 45}, ns[] = {1, 17, 64, 257};
  check_matmul(TU_F32, 2, a, 2, b, 4, ns, 11);
}

Test(matmul, symbolic_m_f16) {
  const int64_t a[2] = {SYM_N, 31}, b[2] = {31, 45}, ns[] = {1, 61};
  check_matmul(TU_F16, 2, a, 2, b, 2, ns, 12);
}

Test(matmul, symbolic_k_shared_f32) {
  // K is one symbol in both operands; run with K = 1, 13, 100.
  const int64_t a[2] = {4, SYM_N}, b[2] = {SYM_N, 6}, ns[] = {1, 13, 100};
  check_matmul(TU_F32, 2, a, 2, b, 3, ns, 13);
}

Test(matmul, symbolic_all_f32) {
  // [N, M] x [M, N] with M = N + 2.
  const int64_t a[2] = {SYM_N, SYM_M}, b[2] = {SYM_M, SYM_N}, ns[] = {1, 7, 33};
  check_matmul(TU_F32, 2, a, 2, b, 3, ns, 14);
}

Test(matmul, batched_rank4_x_rank2_f32) {
  const int64_t a[4] = {2, 3, 17, 5}, b[2] = {5, 7}, one[1] = {0};
  check_matmul(TU_F32, 4, a, 2, b, 1, one, 21);
}

Test(matmul, batched_rank4_x_rank2_f16) {
  const int64_t a[4] = {2, 3, 17, 5}, b[2] = {5, 7}, one[1] = {0};
  check_matmul(TU_F16, 4, a, 2, b, 1, one, 22);
}

Test(matmul, batched_same_batch_f32) {
  const int64_t a[3] = {3, 4, 5}, b[3] = {3, 5, 6}, one[1] = {0};
  check_matmul(TU_F32, 3, a, 3, b, 1, one, 23);
}

Test(matmul, batched_broadcast_batch_f32) {
  const int64_t a[3] = {1, 4, 5}, b[3] = {3, 5, 6}, one[1] = {0};
  check_matmul(TU_F32, 3, a, 3, b, 1, one, 24);
  const int64_t a2[4] = {3, 1, 4, 5}, b2[3] = {2, 5, 6};  // -> [3,2,4,6]
  check_matmul(TU_F32, 4, a2, 3, b2, 1, one, 25);
}

Test(matmul, batched_rank2_x_rank3_f32) {
  const int64_t a[2] = {4, 5}, b[3] = {3, 5, 6}, one[1] = {0};
  check_matmul(TU_F32, 2, a, 3, b, 1, one, 26);
}

Test(matmul, batched_symbolic_batch_f32) {
  const int64_t a[3] = {SYM_N, 9, 5}, b[2] = {5, 7}, ns[] = {1, 4};
  check_matmul(TU_F32, 3, a, 2, b, 2, ns, 27);
  const int64_t a2[3] = {SYM_N, 9, 5}, b2[3] = {SYM_N, 5, 7};
  check_matmul(TU_F32, 3, a2, 3, b2, 2, ns, 28);
}

//===--- Reductions -----------------------------------------------------------===//

typedef jit_value (*reduce_fn)(jit_graph *, jit_value, int, int);

static const char *reduce_name(ref_reduce_op op) {
  return op == REF_SUM ? "sum" : op == REF_RMAX ? "max" : "mean";
}

static void check_reduce(ref_reduce_op op, DLDataType dt) {
  reduce_fn fn = op == REF_SUM    ? jit_reduce_sum
                 : op == REF_RMAX ? jit_reduce_max
                                  : jit_reduce_mean;
  const int f16 = tu_is_f16(dt);
  ref_rng rng;
  ref_rng_seed(&rng, 900 + (uint64_t)op * 2 + (uint64_t)f16);
  jit_context *ctx = tu_context();
  typedef struct {
    int rank;
    int64_t spec[3];
    int axis;
    int nn;
    int64_t ns[3];
  } rcase;
  const rcase cases[] = {
      {2, {SYM_N, 13}, 0, 3, {1, 7, 61}},
      {2, {SYM_N, 13}, -1, 2, {1, 31}},
      {3, {5, 7, 9}, 0, 1, {0}},
      {3, {5, 7, 9}, 1, 1, {0}},
      {3, {5, 7, 9}, -1, 1, {0}},
      {2, {3, 1000}, -1, 1, {0}},  // a long axis (> 256)
  };
  for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
    const rcase *c = &cases[ci];
    for (int keepdims = 0; keepdims < 2; keepdims++) {
      jit_graph *g = tu_graph(ctx, "reduce");
      int64_t gd[3];
      spec_graph_dims(g, c->rank, c->spec, gd);
      jit_value x = jit_input(g, "x", dt, c->rank, gd);
      jit_output(g, fn(g, x, c->axis, keepdims));
      TU_OK(jit_graph_finalize(g));
      for (int k = 0; k < c->nn; k++) {
        int64_t d[3], dout[3];
        spec_concrete(c->rank, c->spec, c->ns[k], 0, d);
        int64_t n = ref_numel(c->rank, d);
        int64_t len = d[ref_axis(c->rank, c->axis)];
        float *xv = tu_malloc((size_t)n * 4), *want = tu_malloc((size_t)n * 4);
        ref_rng_fill_signed(&rng, xv, n);
        void *px = tu_input_data(dt, xv, n);
        int rout = ref_reduce(op, xv, c->rank, d, c->axis, keepdims, want, dout);
        cr_assert(rout == c->rank - (keepdims ? 0 : 1));
        int64_t nout = ref_numel(rout, dout);
        if (f16) ref_round_f16_array(want, nout);
        double rtol, atol;
        if (op == REF_RMAX) {
          rtol = 0.0;  // max selects an input: exact
          atol = 0.0;
        } else if (f16) {
          rtol = 5e-3;
          atol = 1e-3 + 1e-6 * (double)len;
        } else {
          rtol = 1e-5;
          atol = op == REF_SUM ? 2.0 * (double)len * FLT_EPSILON + 1e-6 : 1e-6;
        }
        DLTensor in = tu_tensor(px, dt, c->rank, d);
        char what[160];
        snprintf(what, sizeof(what), "reduce_%s %s case %zu axis %d keepdims %d N=%lld",
                 reduce_name(op), dtype_name(dt), ci, c->axis, keepdims,
                 (long long)c->ns[k]);
        tu_run_check(g, &in, 1, dt, rout, dout, want, rtol, atol, NULL, what);
        free(xv);
        free(want);
        free(px);
      }
      jit_graph_destroy(g);
    }
  }
  jit_context_destroy(ctx);
}

Test(reduce, sum_f32) { check_reduce(REF_SUM, TU_F32); }
Test(reduce, sum_f16) { check_reduce(REF_SUM, TU_F16); }
Test(reduce, max_f32) { check_reduce(REF_RMAX, TU_F32); }
Test(reduce, max_f16) { check_reduce(REF_RMAX, TU_F16); }
Test(reduce, mean_f32) { check_reduce(REF_MEAN, TU_F32); }
Test(reduce, mean_f16) { check_reduce(REF_MEAN, TU_F16); }

Test(reduce, max_all_negative_f32) {
  // A max that starts from 0 instead of -inf would return 0 here.
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "reduce_max_neg");
  int64_t gd[2] = {jit_symbol(g, "N"), 7};
  jit_value x = jit_input(g, "x", TU_F32, 2, gd);
  jit_output(g, jit_reduce_max(g, x, -1, 0));
  TU_OK(jit_graph_finalize(g));
  int64_t d[2] = {3, 7}, dout[2];
  float xv[21], want[3];
  for (int i = 0; i < 21; i++) xv[i] = -5.0f - (float)((i * 7) % 11);
  ref_reduce(REF_RMAX, xv, 2, d, -1, 0, want, dout);
  DLTensor in = tu_tensor(xv, TU_F32, 2, d);
  tu_run_check(g, &in, 1, TU_F32, 1, dout, want, 0.0, 0.0, NULL, "max of negatives");
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

//===--- Softmax --------------------------------------------------------------===//

// Rows with +-1000 (a naive exp overflows), then random rows.
static void fill_softmax_rows(ref_rng *rng, float *x, int64_t rows, int64_t cols) {
  ref_rng_fill(rng, x, rows * cols, -4.0f, 4.0f);
  if (rows > 0) x[0 * cols + cols / 3] = 1000.0f;  // one huge entry: ~one-hot
  if (rows > 1)
    for (int64_t j = 0; j < cols; j++) x[1 * cols + j] = -1000.0f;  // uniform
  if (rows > 2)
    for (int64_t j = 0; j < cols; j++)
      x[2 * cols + j] = (j % 2) ? 1000.0f : -1000.0f;  // split between the 1000s
  if (rows > 3) x[3 * cols + cols - 1] = -1000.0f;  // one entry -> 0
}

static void check_softmax(DLDataType dt, int axis) {
  const int f16 = tu_is_f16(dt);
  const double rtol = f16 ? 5e-3 : 1e-5, atol = f16 ? 1e-4 : 1e-6;
  ref_rng rng;
  ref_rng_seed(&rng, 4242 + (uint64_t)f16 * 2 + (uint64_t)(axis + 1));
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "softmax");
  // axis -1: rows of 17 along the last dim; axis 0: [N, 5] columns.
  const int64_t cols = axis == 0 ? 5 : 17;
  int64_t gd[2] = {jit_symbol(g, "N"), cols};
  jit_value x = jit_input(g, "x", dt, 2, gd);
  jit_output(g, jit_softmax(g, x, axis));
  TU_OK(jit_graph_finalize(g));
  const int64_t ns[] = {4, 9, 1, 300};
  for (int k = 0; k < 4; k++) {
    int64_t d[2] = {ns[k], cols};
    int64_t n = ns[k] * cols;
    float *xv = tu_malloc((size_t)n * 4), *want = tu_malloc((size_t)n * 4),
          *got = tu_malloc((size_t)n * 4);
    if (axis == 0) {
      // Columns hold the extremes: transpose the row pattern.
      float *tmp = tu_malloc((size_t)n * 4);
      fill_softmax_rows(&rng, tmp, cols, ns[k]);
      for (int64_t i = 0; i < ns[k]; i++)
        for (int64_t j = 0; j < cols; j++) xv[i * cols + j] = tmp[j * ns[k] + i];
      free(tmp);
    } else {
      fill_softmax_rows(&rng, xv, ns[k], cols);
    }
    void *px = tu_input_data(dt, xv, n);
    ref_softmax(xv, 2, d, axis, want);
    if (f16) ref_round_f16_array(want, n);
    DLTensor in = tu_tensor(px, dt, 2, d);
    char what[128];
    snprintf(what, sizeof(what), "softmax %s axis %d N=%lld", dtype_name(dt), axis,
             (long long)ns[k]);
    tu_run_check(g, &in, 1, dt, 2, d, want, rtol, atol, got, what);
    tu_assert_all_finite(got, n, what);
    free(xv);
    free(want);
    free(got);
    free(px);
  }
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(softmax, last_axis_f32) { check_softmax(TU_F32, -1); }
Test(softmax, last_axis_f16) { check_softmax(TU_F16, -1); }
Test(softmax, axis0_f32) { check_softmax(TU_F32, 0); }
Test(softmax, axis0_f16) { check_softmax(TU_F16, 0); }

Test(softmax, rank3_middle_axis_f32) {
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "softmax3");
  int64_t d[3] = {3, 7, 5};
  jit_value x = jit_input(g, "x", TU_F32, 3, d);
  jit_output(g, jit_softmax(g, x, 1));
  TU_OK(jit_graph_finalize(g));
  ref_rng rng;
  ref_rng_seed(&rng, 5);
  float xv[105], want[105];
  ref_rng_fill(&rng, xv, 105, -3.0f, 3.0f);
  xv[7] = 1000.0f;
  ref_softmax(xv, 3, d, 1, want);
  DLTensor in = tu_tensor(xv, TU_F32, 3, d);
  tu_run_check(g, &in, 1, TU_F32, 3, d, want, 1e-5, 1e-6, NULL, "softmax rank 3 axis 1");
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

//===--- Transpose ------------------------------------------------------------===//

static void check_transpose(DLDataType dt, int rank, const int64_t *spec, const int *perm,
                            int nn, const int64_t *ns) {
  ref_rng rng;
  ref_rng_seed(&rng, 31 + (uint64_t)rank);
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "transpose");
  int64_t gd[8];
  spec_graph_dims(g, rank, spec, gd);
  jit_value x = jit_input(g, "x", dt, rank, gd);
  jit_output(g, jit_transpose(g, x, perm));
  TU_OK(jit_graph_finalize(g));
  for (int k = 0; k < nn; k++) {
    int64_t d[8], dout[8];
    spec_concrete(rank, spec, ns[k], 0, d);
    int64_t n = ref_numel(rank, d);
    float *xv = tu_malloc((size_t)n * 4), *want = tu_malloc((size_t)n * 4);
    ref_rng_fill_signed(&rng, xv, n);
    void *px = tu_input_data(dt, xv, n);
    ref_transpose(xv, rank, d, perm, want, dout);
    DLTensor in = tu_tensor(px, dt, rank, d);
    char what[128];
    snprintf(what, sizeof(what), "transpose %s rank %d N=%lld", dtype_name(dt), rank,
             (long long)ns[k]);
    tu_run_check(g, &in, 1, dt, rank, dout, want, 0.0, 0.0, NULL, what);  // exact
    free(xv);
    free(want);
    free(px);
  }
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(transpose, rank2_f32) {
  const int64_t spec[2] = {SYM_N, 13}, ns[] = {1, 7, 61};
  const int perm[2] = {1, 0};
  check_transpose(TU_F32, 2, spec, perm, 3, ns);
}

Test(transpose, rank2_f16) {
  const int64_t spec[2] = {SYM_N, 33}, ns[] = {1, 65};
  const int perm[2] = {1, 0};
  check_transpose(TU_F16, 2, spec, perm, 2, ns);
}

Test(transpose, rank3_perm201_f32) {
  const int64_t spec[3] = {3, SYM_N, 5}, ns[] = {1, 4, 17};
  const int perm[3] = {2, 0, 1};
  check_transpose(TU_F32, 3, spec, perm, 3, ns);
}

Test(transpose, rank3_perm201_f16) {
  const int64_t spec[3] = {3, SYM_N, 5}, ns[] = {4};
  const int perm[3] = {2, 0, 1};
  check_transpose(TU_F16, 3, spec, perm, 1, ns);
}

Test(transpose, rank4_and_identity_f32) {
  const int64_t spec[4] = {2, 3, 4, 5}, one[1] = {0};
  const int perm[4] = {3, 1, 0, 2};
  check_transpose(TU_F32, 4, spec, perm, 1, one);
  const int id[4] = {0, 1, 2, 3};
  check_transpose(TU_F32, 4, spec, id, 1, one);
}

//===--- Reshape --------------------------------------------------------------===//

// reshape(x) to `rspec` (SYM_N / -1 / static) for x of `spec`; output shape for N is
// `ospec` with N substituted (and -1 already resolved by the caller as N-multiples).
static void check_reshape(DLDataType dt, int rank, const int64_t *spec, int rrank,
                          const int64_t *rspec, const int64_t *out_mult, int nn,
                          const int64_t *ns) {
  ref_rng rng;
  ref_rng_seed(&rng, 61 + (uint64_t)rrank);
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "reshape");
  int64_t gd[8], rd[8];
  spec_graph_dims(g, rank, spec, gd);
  spec_graph_dims(g, rrank, rspec, rd);
  jit_value x = jit_input(g, "x", dt, rank, gd);
  jit_output(g, jit_reshape(g, x, rrank, rd));
  TU_OK(jit_graph_finalize(g));
  for (int k = 0; k < nn; k++) {
    int64_t d[8], dout[8];
    spec_concrete(rank, spec, ns[k], 0, d);
    // out_mult[i] > 0: static size; < 0: -out_mult[i] * N.
    for (int i = 0; i < rrank; i++)
      dout[i] = out_mult[i] > 0 ? out_mult[i] : -out_mult[i] * ns[k];
    int64_t n = ref_numel(rank, d);
    cr_assert_eq(ref_numel(rrank, dout), n);
    float *xv = tu_malloc((size_t)n * 4), *want = tu_malloc((size_t)n * 4);
    ref_rng_fill_signed(&rng, xv, n);
    void *px = tu_input_data(dt, xv, n);
    ref_reshape(xv, n, want);
    DLTensor in = tu_tensor(px, dt, rank, d);
    char what[128];
    snprintf(what, sizeof(what), "reshape %s rank %d->%d N=%lld", dtype_name(dt), rank,
             rrank, (long long)ns[k]);
    tu_run_check(g, &in, 1, dt, rrank, dout, want, 0.0, 0.0, NULL, what);
    free(xv);
    free(want);
    free(px);
  }
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(reshape, symbol_split_f32) {
  const int64_t spec[2] = {SYM_N, 12}, r[3] = {SYM_N, 3, 4}, out[3] = {-1, 3, 4};
  const int64_t ns[] = {1, 7};
  check_reshape(TU_F32, 2, spec, 3, r, out, 2, ns);
}

Test(reshape, symbol_split_f16) {
  const int64_t spec[2] = {SYM_N, 12}, r[3] = {SYM_N, 3, 4}, out[3] = {-1, 3, 4};
  const int64_t ns[] = {5};
  check_reshape(TU_F16, 2, spec, 3, r, out, 1, ns);
}

Test(reshape, inferred_f32) {
  const int64_t ns[] = {1, 13};
  const int64_t spec[3] = {2, SYM_N, 3}, r[2] = {-1, 3}, out[2] = {-2, 3};
  check_reshape(TU_F32, 3, spec, 2, r, out, 2, ns);
  const int64_t spec2[2] = {SYM_N, 6}, r2[1] = {-1}, out2[1] = {-6};
  check_reshape(TU_F32, 2, spec2, 1, r2, out2, 2, ns);
}

Test(reshape, inferred_static_f16) {
  const int64_t spec[2] = {4, 6}, r[3] = {3, -1, 2}, out[3] = {3, 4, 2}, one[1] = {0};
  check_reshape(TU_F16, 2, spec, 3, r, out, 1, one);
}

Test(reshape, then_reduce_f32) {
  // [N, 12] -> [N, 3, 4] -> sum over the last axis -> [N, 3]: the data order matters.
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "reshape_reduce");
  int64_t N = jit_symbol(g, "N");
  int64_t gd[2] = {N, 12}, rd[3] = {N, 3, 4};
  jit_value x = jit_input(g, "x", TU_F32, 2, gd);
  jit_output(g, jit_reduce_sum(g, jit_reshape(g, x, 3, rd), -1, 0));
  TU_OK(jit_graph_finalize(g));
  ref_rng rng;
  ref_rng_seed(&rng, 3);
  float xv[7 * 12], want[7 * 3];
  ref_rng_fill_signed(&rng, xv, 7 * 12);
  int64_t d[2] = {7, 12}, d3[3] = {7, 3, 4}, dout[2];
  ref_reduce(REF_SUM, xv, 3, d3, -1, 0, want, dout);
  DLTensor in = tu_tensor(xv, TU_F32, 2, d);
  tu_run_check(g, &in, 1, TU_F32, 2, dout, want, 1e-5, 1e-6, NULL, "reshape+sum");
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

//===--- Composite graphs -----------------------------------------------------===//

// y = softmax(gelu(x W + b)) for N in {1, 7, 64}, gelu in tanh or erf form: ops fused
// by the compiler (the activation in the matmul's epilogue) must still agree with the
// op-by-op reference.
static void check_mlp(DLDataType dt, ref_unop act) {
  const int f16 = tu_is_f16(dt);
  enum { IN = 45, HID = 33 };
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "mlp");
  int64_t dx[2] = {jit_symbol(g, "N"), IN}, dw[2] = {IN, HID}, db[1] = {HID};
  jit_value x = jit_input(g, "x", dt, 2, dx);
  jit_value w = jit_input(g, "w", dt, 2, dw);
  jit_value b = jit_input(g, "b", dt, 1, db);
  jit_value h = jit_add(g, jit_matmul(g, x, w), b);
  jit_output(g, jit_softmax(g, act == REF_GELU ? jit_gelu(g, h) : jit_gelu_erf(g, h), -1));
  TU_OK(jit_graph_finalize(g));
  cr_assert_eq(jit_graph_num_inputs(g), 3);
  cr_assert_eq(jit_graph_num_outputs(g), 1);
  ref_rng rng;
  ref_rng_seed(&rng, 8);
  float wv[IN * HID], bv[HID];
  ref_rng_fill_signed(&rng, wv, IN * HID);
  ref_rng_fill_signed(&rng, bv, HID);
  void *pw = tu_input_data(dt, wv, IN * HID), *pb = tu_input_data(dt, bv, HID);
  const int64_t ns[] = {1, 7, 64};
  for (int k = 0; k < 3; k++) {
    int64_t N = ns[k], d[2] = {N, IN}, dh[2] = {N, HID}, dwv[2] = {IN, HID},
            dbv[1] = {HID};
    float *xv = tu_malloc((size_t)(N * IN) * 4), *h = tu_malloc((size_t)(N * HID) * 4),
          *h2 = tu_malloc((size_t)(N * HID) * 4);
    ref_rng_fill_signed(&rng, xv, N * IN);
    void *px = tu_input_data(dt, xv, N * IN);
    int64_t dc[2];
    ref_matmul(xv, 2, d, wv, 2, dwv, h, dc);
    ref_binary(REF_ADD, h, 2, dh, bv, 1, dbv, h2);
    ref_unary(act, h2, N * HID, h);
    ref_softmax(h, 2, dh, -1, h2);
    if (f16) ref_round_f16_array(h2, N * HID);
    DLTensor ins[3] = {tu_tensor(px, dt, 2, d), tu_tensor(pw, dt, 2, dwv),
                       tu_tensor(pb, dt, 1, dbv)};
    char what[64];
    snprintf(what, sizeof(what), "mlp %s N=%lld", dtype_name(dt), (long long)N);
    // f16: intermediates may be rounded to f16 between ops, so allow a few ulps more.
    tu_run_check(g, ins, 3, dt, 2, dh, h2, f16 ? 2e-2 : 1e-4, f16 ? 1e-3 : 1e-6, NULL,
                 what);
    free(xv);
    free(h);
    free(h2);
    free(px);
  }
  free(pw);
  free(pb);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(composite, mlp_f32) { check_mlp(TU_F32, REF_GELU); }
Test(composite, mlp_f16) { check_mlp(TU_F16, REF_GELU); }
Test(composite, mlp_gelu_erf_f32) { check_mlp(TU_F32, REF_GELU_ERF); }
Test(composite, mlp_gelu_erf_f16) { check_mlp(TU_F16, REF_GELU_ERF); }

// gelu_erf(x W + b) with cache blocks of both rows and columns around the fused
// epilogue (its tiling interchanged: the script once wrote `interchange [1, 0]` where
// tile_using_for wants `interchange = [1, 0]`, and GPT-2's MLP at 99 rows, K 64, N 256
// failed to compile).
Test(composite, fused_epilogue_in_cache_blocks) {
  jit_context *ctx = tu_context_policy(JIT_SHAPE_POLICY_EXACT);
  static const int64_t ms[] = {1, 33, 97, 99, 130};
  for (int i = 0; i < 5; i++) {
    int64_t M = ms[i], K = 64, N = 256, dx[2] = {M, K}, dw[2] = {K, N}, db[1] = {N},
            dy[2] = {M, N};
    jit_graph *g = tu_graph(ctx, "ep");
    jit_value x = jit_input(g, "x", TU_F32, 2, dx), w = jit_input(g, "w", TU_F32, 2, dw);
    jit_value b = jit_input(g, "b", TU_F32, 1, db);
    jit_output(g, jit_gelu_erf(g, jit_add(g, jit_matmul(g, x, w), b)));
    TU_OK(jit_graph_finalize(g));
    ref_rng rng;
    ref_rng_seed(&rng, 1200 + (uint64_t)i);
    float *xv = tu_malloc(sizeof(float) * (size_t)(M * K)), *wv = tu_malloc(sizeof(float) * K * N);
    float *bv = tu_malloc(sizeof(float) * N), *h = tu_malloc(sizeof(float) * (size_t)(M * N));
    float *want = tu_malloc(sizeof(float) * (size_t)(M * N));
    ref_rng_fill_signed(&rng, xv, M * K);
    ref_rng_fill_signed(&rng, wv, K * N);
    ref_rng_fill_signed(&rng, bv, N);
    int64_t dh[2];
    ref_matmul(xv, 2, dx, wv, 2, dw, h, dh);
    ref_binary(REF_ADD, h, 2, dy, bv, 1, db, want);
    ref_unary(REF_GELU_ERF, want, M * N, h);
    DLTensor in[3] = {tu_tensor(xv, TU_F32, 2, dx), tu_tensor(wv, TU_F32, 2, dw),
                      tu_tensor(bv, TU_F32, 1, db)};
    char what[64];
    snprintf(what, sizeof what, "gelu_erf(xW+b) %lldx64x256", (long long)M);
    tu_run_check(g, in, 3, TU_F32, 2, dy, h, 1e-4, 1e-5, NULL, what);
    free(xv), free(wv), free(bv), free(h), free(want);
    jit_graph_destroy(g);
  }
  jit_context_destroy(ctx);
}

Test(composite, value_used_twice_and_two_outputs) {
  // y0 = x * x + x (x used three times), y1 = reduce_sum(y0, 0, 1) - an output that
  // is also an operand of another output.
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "reuse");
  int64_t gd[2] = {jit_symbol(g, "N"), 5};
  jit_value x = jit_input(g, "x", TU_F32, 2, gd);
  jit_value y0 = jit_add(g, jit_mul(g, x, x), x);
  jit_output(g, y0);
  jit_output(g, jit_reduce_sum(g, y0, 0, 1));
  TU_OK(jit_graph_finalize(g));
  cr_assert_eq(jit_graph_num_outputs(g), 2);
  ref_rng rng;
  ref_rng_seed(&rng, 99);
  float xv[35], want0[35], want1[5], got0[35], got1[5];
  ref_rng_fill_signed(&rng, xv, 35);
  for (int i = 0; i < 35; i++) want0[i] = (float)((double)xv[i] * xv[i] + xv[i]);
  int64_t d[2] = {7, 5}, d1[2];
  ref_reduce(REF_SUM, want0, 2, d, 0, 1, want1, d1);
  int64_t dout0[2] = {7, 5}, dout1[2] = {1, 5};
  DLTensor in = tu_tensor(xv, TU_F32, 2, d);
  DLTensor outs[2] = {tu_tensor(got0, TU_F32, 2, dout0),
                      tu_tensor(got1, TU_F32, 2, dout1)};
  TU_OK(jit_run(g, &in, 1, outs, 2));
  tu_assert_close(got0, want0, 35, 1e-5, 1e-6, 2, dout0, "x*x+x");
  tu_assert_close(got1, want1, 5, 1e-5, 1e-5, 2, dout1, "sum(x*x+x)");
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(composite, input_passed_to_output_and_opt_level0) {
  // The debug pipeline (opt_level 0) computes the same values; transpose(transpose(x))
  // is x itself.
  jit_options opts;
  jit_options_init(&opts);
  opts.opt_level = 0;
  jit_context *ctx = NULL;
  TU_OK(jit_context_create(&opts, &ctx));
  jit_graph *g = tu_graph(ctx, "opt0");
  int64_t gd[2] = {jit_symbol(g, "N"), 17};
  const int perm[2] = {1, 0};
  jit_value x = jit_input(g, "x", TU_F32, 2, gd);
  jit_value w = jit_input(g, "w", TU_F32, 2, (int64_t[]){17, 9});
  jit_output(g, jit_transpose(g, jit_transpose(g, x, perm), perm));
  jit_output(g, jit_matmul(g, x, w));
  TU_OK(jit_graph_finalize(g));
  ref_rng rng;
  ref_rng_seed(&rng, 123);
  float xv[11 * 17], wv[17 * 9], want[11 * 9], got0[11 * 17], got1[11 * 9];
  ref_rng_fill_signed(&rng, xv, 11 * 17);
  ref_rng_fill_signed(&rng, wv, 17 * 9);
  int64_t dx[2] = {11, 17}, dw[2] = {17, 9}, dc[2];
  ref_matmul(xv, 2, dx, wv, 2, dw, want, dc);
  DLTensor ins[2] = {tu_tensor(xv, TU_F32, 2, dx), tu_tensor(wv, TU_F32, 2, dw)};
  DLTensor outs[2] = {tu_tensor(got0, TU_F32, 2, dx), tu_tensor(got1, TU_F32, 2, dc)};
  TU_OK(jit_run(g, ins, 2, outs, 2));
  tu_assert_close(got0, xv, 11 * 17, 0.0, 0.0, 2, dx, "transpose(transpose(x))");
  tu_assert_close(got1, want, 11 * 9, 1e-5, 1e-5, 2, dc, "matmul at opt_level 0");
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

//===--- Edge cases of graph structure ---------------------------------------------===//

// Runs a graph with inputs x [N, 3] (and y [7]) whose outputs are given as values.
static void run_two_outputs(jit_graph *g, int n_in, const float *want0,
                            const float *want1, int rank1, const int64_t *d1,
                            const char *what) {
  float xv[15], yv[7], got0[15], got1[15];
  for (int i = 0; i < 15; i++) xv[i] = (float)i * 0.25f - 1.0f;
  for (int i = 0; i < 7; i++) yv[i] = 100.0f + (float)i;
  int64_t dx[2] = {5, 3}, dy[1] = {7}, d0[2] = {5, 3}, d1c[JIT_MAX_RANK];
  for (int i = 0; i < rank1; i++) d1c[i] = d1[i];
  DLTensor ins[2] = {tu_tensor(xv, TU_F32, 2, dx), tu_tensor(yv, TU_F32, 1, dy)};
  DLTensor outs[2] = {tu_tensor(got0, TU_F32, 2, d0),
                      tu_tensor(got1, TU_F32, rank1, d1c)};
  TU_OK(jit_run(g, ins, n_in, outs, 2));
  tu_assert_close(got0, want0, 15, 1e-6, 1e-7, 2, d0, what);
  tu_assert_close(got1, want1, ref_numel(rank1, d1), 1e-6, 1e-7, rank1, d1, what);
}

Test(edges, output_is_an_input) {
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "identity");
  int64_t gd[2] = {jit_symbol(g, "N"), 3};
  jit_value x = jit_input(g, "x", TU_F32, 2, gd);
  jit_output(g, x);
  jit_output(g, jit_neg(g, x));
  TU_OK(jit_graph_finalize(g));
  float w0[15], w1[15];
  for (int i = 0; i < 15; i++) {
    w0[i] = (float)i * 0.25f - 1.0f;
    w1[i] = -w0[i];
  }
  const int64_t d1[2] = {5, 3};
  run_two_outputs(g, 1, w0, w1, 2, d1, "output = input");
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(edges, same_value_output_twice) {
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "twice");
  int64_t gd[2] = {jit_symbol(g, "N"), 3};
  jit_value x = jit_input(g, "x", TU_F32, 2, gd);
  jit_value y = jit_relu(g, x);
  jit_output(g, y);
  jit_output(g, y);
  TU_OK(jit_graph_finalize(g));
  float w[15];
  for (int i = 0; i < 15; i++) w[i] = fmaxf((float)i * 0.25f - 1.0f, 0.0f);
  const int64_t d1[2] = {5, 3};
  run_two_outputs(g, 1, w, w, 2, d1, "one value, two outputs");
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(edges, unused_input_and_constant_output) {
  // y is an input no output depends on; output 1 is a rank-0 constant (2 * 3 + 1).
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "unused");
  int64_t gd[2] = {jit_symbol(g, "N"), 3}, dy[1] = {7};
  jit_value x = jit_input(g, "x", TU_F32, 2, gd);
  jit_input(g, "y", TU_F32, 1, dy);
  jit_output(g, jit_sub(g, x, jit_scalar(g, 0.5, TU_F32)));
  jit_value six = jit_mul(g, jit_scalar(g, 2.0, TU_F32), jit_scalar(g, 3.0, TU_F32));
  jit_output(g, jit_add(g, six, jit_scalar(g, 1.0, TU_F32)));
  TU_OK(jit_graph_finalize(g));
  cr_assert_eq(jit_graph_num_inputs(g), 2);
  float w0[15], w1[1] = {7.0f};
  for (int i = 0; i < 15; i++) w0[i] = (float)i * 0.25f - 1.5f;
  run_two_outputs(g, 2, w0, w1, 0, NULL, "unused input, constant output");
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(edges, f16_overflow_gives_inf) {
  // 60000 + 60000 overflows f16: computed in f32 and rounded once, the result is inf.
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "f16_overflow");
  int64_t d[1] = {4};
  jit_value x = jit_input(g, "x", TU_F16, 1, d);
  jit_output(g, jit_add(g, x, x));
  TU_OK(jit_graph_finalize(g));
  float xv[4] = {60000.0f, -60000.0f, 1.5f, 30000.0f}, want[4];
  void *px = tu_input_data(TU_F16, xv, 4);
  for (int i = 0; i < 4; i++) want[i] = xv[i] + xv[i];
  ref_round_f16_array(want, 4);  // inf, -inf, 3, 60000
  cr_assert(isinf(want[0]) && isinf(want[1]));
  DLTensor in = tu_tensor(px, TU_F16, 1, d);
  tu_run_check(g, &in, 1, TU_F16, 1, d, want, 0.0, 0.0, NULL, "f16 overflow");
  free(px);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}
