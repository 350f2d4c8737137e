//===--- test_nn.c - comparisons, where, pow, conv2d and pools vs plain C ---===//
//
// The ops real models add to the elementwise core (masks, selects, powers) and the
// sliding windows of a CNN, f32 and f16, against tests/ref.c over shapes with 1,
// primes and sizes that are not multiples of any tile; symbolic batch, height and
// width; bad arguments with their statuses. CTest runs this suite on every GPU
// backend too (ops_nn_vulkan, ops_nn_cuda).
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

static const char *dtype_name(DLDataType dt) { return tu_is_f16(dt) ? "f16" : "f32"; }

//===--- Comparisons and pow ---------------------------------------------===//

typedef jit_value (*binary_fn)(jit_graph *, jit_value, jit_value);

static binary_fn fn_of(ref_binop op) {
  switch (op) {
    case REF_LT: return jit_less;
    case REF_LE: return jit_less_equal;
    case REF_GT: return jit_greater;
    case REF_GE: return jit_greater_equal;
    case REF_EQ: return jit_equal;
    case REF_NE: return jit_not_equal;
    case REF_POW: return jit_pow;
    default: return NULL;
  }
}

// Values drawn from a small set, so that equal pairs and NaNs are common.
static void fill_coarse(ref_rng *rng, float *x, int64_t n) {
  static const float set[] = {-1.5f, -1.0f, -0.5f, 0.0f, 0.5f, 1.0f, 2.0f, NAN};
  for (int64_t i = 0; i < n; i++) x[i] = set[(int)(ref_rng_unit(rng) * 8) & 7];
}

// op(a [N, 5], b) for b of shape [N, 5], [5] and [1, 1] (broadcasting), N symbolic.
static void check_compare(ref_binop op, DLDataType dt) {
  ref_rng rng;
  ref_rng_seed(&rng, 500 + (uint64_t)op * 2 + (uint64_t)tu_is_f16(dt));
  jit_context *ctx = tu_context();
  static const int rbs[] = {2, 1, 2};
  static const int64_t bshape[3][2] = {{-1, 5}, {5, 0}, {1, 1}};
  for (int c = 0; c < 3; c++) {
    jit_graph *g = tu_graph(ctx, "compare");
    int64_t N = jit_symbol(g, "N");
    int64_t ga[2] = {N, 5}, gb[2] = {bshape[c][0] < 0 ? N : bshape[c][0], bshape[c][1]};
    jit_value a = jit_input(g, "a", dt, 2, ga), b = jit_input(g, "b", dt, rbs[c], gb);
    jit_output(g, fn_of(op)(g, a, b));
    TU_OK(jit_graph_finalize(g));
    static const int64_t ns[] = {1, 13};
    for (int k = 0; k < 2; k++) {
      int64_t da[2] = {ns[k], 5}, db[2] = {bshape[c][0] < 0 ? ns[k] : bshape[c][0],
                                           bshape[c][1]};
      int64_t na = ref_numel(2, da), nb = ref_numel(rbs[c], db);
      float *xa = tu_malloc((size_t)na * 4), *xb = tu_malloc((size_t)nb * 4),
            *want = tu_malloc((size_t)na * 4);
      fill_coarse(&rng, xa, na);
      fill_coarse(&rng, xb, nb);
      void *pa = tu_input_data(dt, xa, na), *pb = tu_input_data(dt, xb, nb);
      ref_binary(op, xa, 2, da, xb, rbs[c], db, want);
      DLTensor ins[2] = {tu_tensor(pa, dt, 2, da), tu_tensor(pb, dt, rbs[c], db)};
      char what[96];
      snprintf(what, sizeof what, "%s %s case %d N=%lld", ref_binop_name(op),
               dtype_name(dt), c, (long long)ns[k]);
      tu_run_check(g, ins, 2, dt, 2, da, want, 0, 0, NULL, what);
      free(xa), free(xb), free(want), free(pa), free(pb);
    }
    jit_graph_destroy(g);
  }
  jit_context_destroy(ctx);
}

#define COMPARE_TESTS(name, op)                                 \
  Test(compare, name##_f32) { check_compare(op, TU_F32); }      \
  Test(compare, name##_f16) { check_compare(op, TU_F16); }
COMPARE_TESTS(less, REF_LT)
COMPARE_TESTS(less_equal, REF_LE)
COMPARE_TESTS(greater, REF_GT)
COMPARE_TESTS(greater_equal, REF_GE)
COMPARE_TESTS(equal, REF_EQ)
COMPARE_TESTS(not_equal, REF_NE)

// pow over bases in (-3, 3) and exponents that are integers (-3..3) or not, N
// symbolic; then the edge cases one by one.
static void check_pow(DLDataType dt) {
  const int f16 = tu_is_f16(dt);
  ref_rng rng;
  ref_rng_seed(&rng, 900 + (uint64_t)f16);
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "pow");
  int64_t gd[2] = {jit_symbol(g, "N"), 7};
  jit_value a = jit_input(g, "a", dt, 2, gd), b = jit_input(g, "b", dt, 2, gd);
  jit_output(g, jit_pow(g, a, b));
  TU_OK(jit_graph_finalize(g));
  static const int64_t ns[] = {1, 31};
  for (int k = 0; k < 2; k++) {
    int64_t d[2] = {ns[k], 7}, n = ns[k] * 7;
    float *xa = tu_malloc((size_t)n * 4), *xb = tu_malloc((size_t)n * 4),
          *want = tu_malloc((size_t)n * 4);
    ref_rng_fill(&rng, xa, n, -3.0f, 3.0f);
    for (int64_t i = 0; i < n; i++) {
      double u = ref_rng_unit(&rng);
      // Integers where the base is negative half the time; else any exponent.
      xb[i] = i % 2 ? (float)(floor(u * 7.0) - 3.0) : (float)(u * 6.0 - 3.0);
      if (i % 2 == 0 && xa[i] < 0) xa[i] = -xa[i];
    }
    void *pa = tu_input_data(dt, xa, n), *pb = tu_input_data(dt, xb, n);
    for (int64_t i = 0; i < n; i++) want[i] = (float)pow(xa[i], xb[i]);
    if (f16) ref_round_f16_array(want, n);
    DLTensor ins[2] = {tu_tensor(pa, dt, 2, d), tu_tensor(pb, dt, 2, d)};
    char what[64];
    snprintf(what, sizeof what, "pow %s N=%lld", dtype_name(dt), (long long)ns[k]);
    tu_run_check(g, ins, 2, dt, 2, d, want, f16 ? 5e-3 : 1e-5, f16 ? 1e-3 : 1e-6, NULL, what);
    free(xa), free(xb), free(want), free(pa), free(pb);
  }
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(pow, random_f32) { check_pow(TU_F32); }
Test(pow, random_f16) { check_pow(TU_F16); }

Test(pow, edges) {
  static const float a[] = {0.0f, NAN, 1.0f, 0.0f, 0.0f, -2.0f, -2.0f, INFINITY, -INFINITY,
                            -INFINITY, 4.0f, 2.0f, -3.0f, 10.0f, 0.5f,  // 10^6: 13.8
                            -1.0f, -1.0f, -0.0f, -0.0f, -0.0f, -INFINITY, -INFINITY,
                            -1.0f, -1.0f, -2.0f};
  static const float b[] = {0.0f, 0.0f, NAN, -1.0f, 2.0f, 3.0f, 0.5f, -1.0f, 3.0f,
                            2.0f, 0.5f, 10.0f, -2.0f, 6.0f, -3.0f,
                            INFINITY, -INFINITY, -1.0f, 3.0f, 0.5f, 0.5f, -0.5f,
                            NAN, 5.0f, INFINITY};
  enum { n = sizeof a / sizeof a[0] };
  float want[n];
  for (int i = 0; i < n; i++) want[i] = (float)pow(a[i], b[i]);
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "pow_edges");
  int64_t d[1] = {n};
  jit_value x = jit_input(g, "a", TU_F32, 1, d), y = jit_input(g, "b", TU_F32, 1, d);
  jit_output(g, jit_pow(g, x, y));
  TU_OK(jit_graph_finalize(g));
  DLTensor ins[2] = {tu_tensor((void *)a, TU_F32, 1, d), tu_tensor((void *)b, TU_F32, 1, d)};
  float got[n];
  tu_run_check(g, ins, 2, TU_F32, 1, d, want, 2e-6, 0, got, "pow edges");
  for (int i = 0; i < n; i++)  // the sign of zeros and infinities too
    cr_expect(signbit(got[i]) == signbit(want[i]) || isnan(want[i]),
              "pow(%g, %g): got %g, want %g", a[i], b[i], got[i], want[i]);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

//===--- where -----------------------------------------------------------===//

// where(cond [N, 1], a [N, 6], b scalar -inf): a masked score row; cond holds 0, 1,
// -0, 0.5 and NaN (nonzero).
static void check_where(DLDataType dt) {
  ref_rng rng;
  ref_rng_seed(&rng, 77 + (uint64_t)tu_is_f16(dt));
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "where");
  int64_t N = jit_symbol(g, "N");
  int64_t dc[2] = {N, 1}, da[2] = {N, 6};
  jit_value c = jit_input(g, "c", dt, 2, dc), a = jit_input(g, "a", dt, 2, da);
  jit_value w = jit_where(g, c, a, jit_scalar(g, -INFINITY, dt));
  // The mask feeds a softmax over the row, as attention would use it: rows that keep
  // nothing become NaN in both, so only kept rows are compared after it.
  jit_output(g, jit_add(g, w, jit_scalar(g, 1.0, dt)));
  TU_OK(jit_graph_finalize(g));
  static const float conds[] = {0.0f, 1.0f, -0.0f, 0.5f, NAN};
  static const int64_t ns[] = {1, 5, 17};
  for (int k = 0; k < 3; k++) {
    int64_t n = ns[k], cd[2] = {n, 1}, ad[2] = {n, 6};
    float *xc = tu_malloc((size_t)n * 4), *xa = tu_malloc((size_t)n * 24),
          *want = tu_malloc((size_t)n * 24);
    for (int64_t i = 0; i < n; i++) xc[i] = conds[(i + k) % 5];
    ref_rng_fill_signed(&rng, xa, n * 6);
    void *pc = tu_input_data(dt, xc, n), *pa = tu_input_data(dt, xa, n * 6);
    for (int64_t i = 0; i < n * 6; i++) want[i] = xc[i / 6] != 0.0f ? xa[i] + 1.0f : -INFINITY;
    if (tu_is_f16(dt)) ref_round_f16_array(want, n * 6);
    DLTensor ins[2] = {tu_tensor(pc, dt, 2, cd), tu_tensor(pa, dt, 2, ad)};
    char what[64];
    snprintf(what, sizeof what, "where %s N=%lld", dtype_name(dt), (long long)n);
    tu_run_check(g, ins, 2, dt, 2, ad, want, tu_is_f16(dt) ? 2e-3 : 1e-6, 0, NULL, what);
    free(xc), free(xa), free(want), free(pc), free(pa);
  }
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(where, masked_rows_f32) { check_where(TU_F32); }
Test(where, masked_rows_f16) { check_where(TU_F16); }

// All three operands broadcast: cond [3, 1, 4], a [5, 1], b [1, 5, 4] -> [3, 5, 4]; the
// comparison that makes cond and the select fuse into one kernel body.
Test(where, three_way_broadcast_from_compare) {
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "where3");
  int64_t dx[3] = {3, 1, 4}, da[2] = {5, 1}, db[3] = {1, 5, 4};
  jit_value x = jit_input(g, "x", TU_F32, 3, dx), a = jit_input(g, "a", TU_F32, 2, da),
            b = jit_input(g, "b", TU_F32, 3, db);
  jit_value cond = jit_greater(g, x, jit_scalar(g, 0.0, TU_F32));
  jit_output(g, jit_where(g, cond, a, b));
  TU_OK(jit_graph_finalize(g));
  float xv[12], av[5], bv[20], want[60];
  for (int i = 0; i < 12; i++) xv[i] = (float)(i % 3) - 1.0f;
  for (int i = 0; i < 5; i++) av[i] = 10.0f + (float)i;
  for (int i = 0; i < 20; i++) bv[i] = -(float)i;
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 5; j++)
      for (int k = 0; k < 4; k++)
        want[(i * 5 + j) * 4 + k] = xv[i * 4 + k] > 0 ? av[j] : bv[j * 4 + k];
  DLTensor ins[3] = {tu_tensor(xv, TU_F32, 3, dx), tu_tensor(av, TU_F32, 2, da),
                     tu_tensor(bv, TU_F32, 3, db)};
  int64_t dout[3] = {3, 5, 4};
  tu_run_check(g, ins, 3, TU_F32, 3, dout, want, 0, 0, NULL, "where broadcast");
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

//===--- conv2d and pools -------------------------------------------------===//

typedef struct window_case {
  const char *name;
  ref_window w;
  int64_t c, f, kh, kw;  // conv: channels, filters, kernel (pools: c, kernel in w)
  int64_t h, wd;         // input height, width
  int64_t ns[3];         // batch sizes (N symbolic); 0 ends
  int sym_hw;            // height and width symbolic too (bound to h, wd and h + 2)
} window_case;

static jit_window_params params_of(const ref_window *w) {
  jit_window_params p;
  jit_window_params_init(&p);
  p.layout = w->nhwc ? JIT_LAYOUT_NHWC : JIT_LAYOUT_NCHW;
  p.kernel[0] = w->kh;
  p.kernel[1] = w->kw;
  memcpy(p.stride, w->stride, sizeof p.stride);
  memcpy(p.padding, w->pad, sizeof p.padding);
  memcpy(p.dilation, w->dilation, sizeof p.dilation);
  p.groups = w->groups;
  p.count_include_pad = w->count_pad;
  return p;
}

static void x_dims(const ref_window *w, int64_t n, int64_t c, int64_t h, int64_t wd,
                   int64_t *d) {
  d[0] = n;
  d[w->nhwc ? 3 : 1] = c;
  d[w->nhwc ? 1 : 2] = h;
  d[w->nhwc ? 2 : 3] = wd;
}

// kind: 0 conv, 1 max pool, 2 avg pool.
static void check_window(int kind, const window_case *wc, DLDataType dt) {
  const int f16 = tu_is_f16(dt);
  ref_rng rng;
  ref_rng_seed(&rng, 4000 + (uint64_t)kind * 7 + (uint64_t)f16);
  ref_window w = wc->w;
  jit_window_params p = params_of(&w);
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, wc->name);
  int64_t gx[4], gw[4];
  int64_t H = wc->sym_hw ? jit_symbol(g, "H") : wc->h, W = wc->sym_hw ? jit_symbol(g, "W") : wc->wd;
  x_dims(&w, jit_symbol(g, "N"), wc->c, H, W, gx);
  int64_t cg = wc->c / (w.groups ? w.groups : 1);
  if (w.nhwc) {
    gw[0] = wc->kh, gw[1] = wc->kw, gw[2] = cg, gw[3] = wc->f;
  } else {
    gw[0] = wc->f, gw[1] = cg, gw[2] = wc->kh, gw[3] = wc->kw;
  }
  jit_value x = jit_input(g, "x", dt, 4, gx), y;
  if (kind == 0)
    y = jit_conv2d(g, x, jit_input(g, "w", dt, 4, gw), &p);
  else if (kind == 1)
    y = jit_max_pool2d(g, x, &p);
  else
    y = jit_avg_pool2d(g, x, &p);
  jit_output(g, y);
  TU_OK(jit_graph_finalize(g));
  for (int k = 0; k < 3 && wc->ns[k]; k++) {
    int64_t dx[4], dy[4], h = wc->h + (wc->sym_hw ? 2 * k : 0), wd = wc->wd + (wc->sym_hw ? k : 0);
    x_dims(&w, wc->ns[k], wc->c, h, wd, dx);
    ref_window_dims(&w, dx, kind == 0 ? gw : NULL, dy);
    int64_t nx = ref_numel(4, dx), nw = ref_numel(4, gw), ny = ref_numel(4, dy);
    float *xv = tu_malloc((size_t)nx * 4), *wv = tu_malloc((size_t)nw * 4),
          *want = tu_malloc((size_t)ny * 4);
    ref_rng_fill_signed(&rng, xv, nx);
    ref_rng_fill_signed(&rng, wv, nw);
    void *px = tu_input_data(dt, xv, nx), *pw = tu_input_data(dt, wv, nw);
    if (kind == 0)
      ref_conv2d(&w, xv, dx, wv, gw, want);
    else
      ref_pool2d(&w, kind == 1, xv, dx, want);
    if (f16) ref_round_f16_array(want, ny);
    DLTensor ins[2] = {tu_tensor(px, dt, 4, dx), tu_tensor(pw, dt, 4, gw)};
    char what[128];
    snprintf(what, sizeof what, "%s %s N=%lld H=%lld W=%lld", wc->name, dtype_name(dt),
             (long long)wc->ns[k], (long long)h, (long long)wd);
    // A conv sums up to C/G * KH * KW products of values in [-1, 1].
    double rtol = f16 ? 4e-3 : 2e-5, atol = f16 ? 4e-3 : 1e-5;
    tu_run_check(g, ins, kind == 0 ? 2 : 1, dt, 4, dy, want, rtol, atol, NULL, what);
    free(xv), free(wv), free(want), free(px), free(pw);
  }
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

#define W_(nhwc, s0, s1, p0, p1, p2, p3, d0, d1, g) \
  {nhwc, 0, 0, {s0, s1}, {p0, p1, p2, p3}, {d0, d1}, g, 1}

static const window_case kConv[] = {
    {"conv 3x3 pad 1", W_(0, 1, 1, 1, 1, 1, 1, 1, 1, 1), 3, 8, 3, 3, 7, 5, {1, 2, 0}, 0},
    {"conv 1x1", W_(0, 1, 1, 0, 0, 0, 0, 1, 1, 1), 13, 5, 1, 1, 4, 3, {1, 3, 0}, 0},
    {"conv stride 2 odd pad", W_(0, 2, 2, 0, 2, 1, 0, 1, 1, 1), 4, 7, 3, 2, 11, 9, {2, 0}, 0},
    {"conv dilation 2", W_(0, 1, 1, 2, 2, 2, 2, 2, 2, 1), 2, 3, 3, 3, 9, 8, {1, 0}, 0},
    {"conv groups 2", W_(0, 1, 1, 1, 1, 1, 1, 1, 1, 2), 6, 4, 3, 3, 6, 6, {1, 3, 0}, 0},
    {"conv depthwise", W_(0, 1, 1, 1, 1, 1, 1, 1, 1, 5), 5, 10, 3, 3, 5, 7, {2, 0}, 0},
    {"conv nhwc 3x3", W_(1, 1, 1, 1, 1, 1, 1, 1, 1, 1), 3, 8, 3, 3, 7, 5, {1, 2, 0}, 0},
    {"conv nhwc stride 2 groups 3", W_(1, 2, 1, 1, 0, 0, 1, 1, 1, 3), 6, 9, 3, 2, 9, 6, {1, 0}, 0},
    {"conv symbolic HW", W_(0, 2, 2, 1, 1, 1, 1, 1, 1, 1), 3, 4, 3, 3, 7, 6, {1, 2, 3}, 1},
    {"conv nhwc symbolic HW", W_(1, 1, 1, 1, 1, 1, 1, 1, 1, 1), 2, 3, 3, 3, 5, 5, {2, 1, 0}, 1},
};

#define P_(nhwc, kh, kw, s0, s1, p0, p1, p2, p3, d0, d1, cp) \
  {nhwc, kh, kw, {s0, s1}, {p0, p1, p2, p3}, {d0, d1}, 1, cp}

static const window_case kPool[] = {
    {"pool 2x2 stride 2", P_(0, 2, 2, 2, 2, 0, 0, 0, 0, 1, 1, 1), 3, 0, 0, 0, 8, 7, {1, 2, 0}, 0},
    {"pool 3x3 stride 2 pad 1", P_(0, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 1), 5, 0, 0, 0, 9, 10, {1, 3, 0}, 0},
    {"pool 3x3 pad 1 exclude pad", P_(0, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 0), 2, 0, 0, 0, 5, 6, {1, 0}, 0},
    {"pool nhwc 3x2 pad", P_(1, 3, 2, 2, 1, 1, 2, 1, 0, 1, 1, 0), 7, 0, 0, 0, 7, 5, {2, 0}, 0},
    {"pool 1x1", P_(0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1), 1, 0, 0, 0, 1, 1, {1, 2, 0}, 0},
    {"pool symbolic HW", P_(0, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 0), 3, 0, 0, 0, 7, 9, {1, 2, 3}, 1},
};

#define WINDOW_TESTS(suite, kind, cases, i, name)                                \
  Test(suite, name##_f32) { check_window(kind, &cases[i], TU_F32); }           \
  Test(suite, name##_f16) { check_window(kind, &cases[i], TU_F16); }

WINDOW_TESTS(conv2d, 0, kConv, 0, pad1)
WINDOW_TESTS(conv2d, 0, kConv, 1, pointwise)
WINDOW_TESTS(conv2d, 0, kConv, 2, stride2_odd_pad)
WINDOW_TESTS(conv2d, 0, kConv, 3, dilation2)
WINDOW_TESTS(conv2d, 0, kConv, 4, groups2)
WINDOW_TESTS(conv2d, 0, kConv, 5, depthwise)
WINDOW_TESTS(conv2d, 0, kConv, 6, nhwc)
WINDOW_TESTS(conv2d, 0, kConv, 7, nhwc_stride2_groups3)
WINDOW_TESTS(conv2d, 0, kConv, 8, symbolic_hw)
WINDOW_TESTS(conv2d, 0, kConv, 9, nhwc_symbolic_hw)
WINDOW_TESTS(max_pool2d, 1, kPool, 0, k2s2)
WINDOW_TESTS(max_pool2d, 1, kPool, 1, k3s2p1)
WINDOW_TESTS(max_pool2d, 1, kPool, 3, nhwc)
WINDOW_TESTS(max_pool2d, 1, kPool, 4, k1)
WINDOW_TESTS(max_pool2d, 1, kPool, 5, symbolic_hw)
WINDOW_TESTS(avg_pool2d, 2, kPool, 0, k2s2)
WINDOW_TESTS(avg_pool2d, 2, kPool, 1, k3s2p1)
WINDOW_TESTS(avg_pool2d, 2, kPool, 2, exclude_pad)
WINDOW_TESTS(avg_pool2d, 2, kPool, 3, nhwc_exclude_pad)
WINDOW_TESTS(avg_pool2d, 2, kPool, 5, symbolic_hw)

// A max pool with a dilation, and one that sees NaN: it wins.
Test(max_pool2d, dilation_and_nan) {
  window_case wc = {"pool dilated", P_(0, 2, 2, 1, 1, 1, 0, 0, 1, 2, 2, 1), 2, 0, 0, 0, 6, 5,
                    {1, 0}, 0};
  check_window(1, &wc, TU_F32);
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "nan");
  int64_t d[4] = {1, 1, 2, 2};
  jit_window_params p;
  jit_window_params_init(&p);
  p.kernel[0] = p.kernel[1] = 2;
  jit_output(g, jit_max_pool2d(g, jit_input(g, "x", TU_F32, 4, d), &p));
  TU_OK(jit_graph_finalize(g));
  float x[4] = {1.0f, NAN, 3.0f, 2.0f}, want[1] = {NAN};
  DLTensor in = tu_tensor(x, TU_F32, 4, d);
  int64_t od[4] = {1, 1, 1, 1};
  tu_run_check(g, &in, 1, TU_F32, 4, od, want, 0, 0, NULL, "max pool NaN");
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// conv -> bias -> relu -> max pool, the CNN stem, all symbolic batch.
Test(conv2d, stem_with_bias_relu_pool) {
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "stem");
  int64_t dx[4] = {jit_symbol(g, "N"), 3, 11, 13}, dw[4] = {6, 3, 3, 3}, db[3] = {6, 1, 1};
  jit_window_params cp, pp;
  jit_window_params_init(&cp);
  cp.stride[0] = cp.stride[1] = 2;
  for (int i = 0; i < 4; i++) cp.padding[i] = 1;
  jit_window_params_init(&pp);
  pp.kernel[0] = pp.kernel[1] = 2;
  pp.stride[0] = pp.stride[1] = 2;
  jit_value x = jit_input(g, "x", TU_F32, 4, dx), w = jit_input(g, "w", TU_F32, 4, dw),
            b = jit_input(g, "b", TU_F32, 3, db);
  jit_value y = jit_relu(g, jit_add(g, jit_conv2d(g, x, w, &cp), b));
  jit_output(g, jit_max_pool2d(g, y, &pp));
  TU_OK(jit_graph_finalize(g));
  ref_rng rng;
  ref_rng_seed(&rng, 31);
  for (int64_t n = 1; n <= 3; n += 2) {
    int64_t cx[4] = {n, 3, 11, 13}, cy[4], cz[4];
    ref_window rw = {0, 0, 0, {2, 2}, {1, 1, 1, 1}, {1, 1}, 1, 1};
    ref_window_dims(&rw, cx, dw, cy);
    ref_window pw = {0, 2, 2, {2, 2}, {0, 0, 0, 0}, {1, 1}, 1, 1};
    ref_window_dims(&pw, cy, NULL, cz);
    int64_t nx = ref_numel(4, cx), ny = ref_numel(4, cy), nz = ref_numel(4, cz);
    float *xv = tu_malloc((size_t)nx * 4), wv[162], bv[6], *yv = tu_malloc((size_t)ny * 4),
          *want = tu_malloc((size_t)nz * 4);
    ref_rng_fill_signed(&rng, xv, nx);
    ref_rng_fill_signed(&rng, wv, 162);
    ref_rng_fill_signed(&rng, bv, 6);
    ref_conv2d(&rw, xv, cx, wv, dw, yv);
    for (int64_t i = 0; i < ny; i++) {
      float v = yv[i] + bv[(i / (cy[2] * cy[3])) % 6];
      yv[i] = v > 0 ? v : 0;
    }
    ref_pool2d(&pw, 1, yv, cy, want);
    DLTensor ins[3] = {tu_tensor(xv, TU_F32, 4, cx), tu_tensor(wv, TU_F32, 4, dw),
                       tu_tensor(bv, TU_F32, 3, db)};
    tu_run_check(g, ins, 3, TU_F32, 4, cz, want, 2e-5, 1e-5, NULL, "stem");
    free(xv), free(yv), free(want);
  }
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

//===--- Bad arguments -----------------------------------------------------===//

Test(nn, bad_arguments) {
  jit_context *ctx = tu_context();
  static const char *const says[] = {
      "must have rank 4",       "with 1 groups reads 2",  "stride must be in",
      "padding must be smaller", "avg_pool2d takes no dilation", "larger than the padded",
      "channel dim of x",       "operand dtypes differ",  "kernel must be in",
      "params is NULL",         "do not broadcast"};
  static const jit_status_code codes[] = {
      JIT_SHAPE_MISMATCH,   JIT_SHAPE_MISMATCH,   JIT_INVALID_ARGUMENT, JIT_INVALID_ARGUMENT,
      JIT_INVALID_ARGUMENT, JIT_SHAPE_MISMATCH,   JIT_UNSUPPORTED,      JIT_DTYPE_MISMATCH,
      JIT_INVALID_ARGUMENT, JIT_INVALID_ARGUMENT, JIT_SHAPE_MISMATCH};
  enum { n_cases = sizeof codes / sizeof codes[0] };
  for (int i = 0; i < n_cases; i++) {
    jit_graph *g = tu_graph(ctx, "bad");
    int64_t N = jit_symbol(g, "N");
    int64_t dx[4] = {N, 4, 8, 8}, d3[3] = {4, 8, 8}, dw[4] = {3, 3, 3, 3}, dws[4] = {2, 2, 3, 3};
    int64_t dxs[4] = {N, N, 8, 8}, d5[2] = {N, 5}, d6[2] = {N, 6};
    jit_value x = jit_input(g, "x", TU_F32, 4, dx), y = {0};
    jit_window_params p;
    jit_window_params_init(&p);
    p.kernel[0] = p.kernel[1] = 2;
    switch (i) {
      case 0: y = jit_conv2d(g, jit_input(g, "x3", TU_F32, 3, d3), jit_input(g, "w", TU_F32, 4, dw), &p); break;
      case 1: p.groups = 1; y = jit_conv2d(g, x, jit_input(g, "w", TU_F32, 4, dws), &p); break;
      case 2: p.stride[1] = 0; y = jit_max_pool2d(g, x, &p); break;
      case 3: p.padding[3] = 2; y = jit_avg_pool2d(g, x, &p); break;
      case 4: p.dilation[0] = 2; y = jit_avg_pool2d(g, x, &p); break;
      case 5: p.kernel[0] = 11; y = jit_max_pool2d(g, x, &p); break;
      case 6: y = jit_max_pool2d(g, jit_input(g, "xs", TU_F32, 4, dxs), &p); break;
      case 7: y = jit_where(g, jit_input(g, "c", TU_F16, 2, d5), jit_input(g, "a", TU_F32, 2, d5),
                            jit_input(g, "b", TU_F32, 2, d5)); break;
      case 8: p.kernel[1] = 0; y = jit_max_pool2d(g, x, &p); break;
      case 9: y = jit_conv2d(g, x, jit_input(g, "w", TU_F32, 4, dw), NULL); break;
      case 10: y = jit_where(g, jit_input(g, "c", TU_F32, 2, d5), jit_input(g, "a", TU_F32, 2, d6),
                             jit_input(g, "b", TU_F32, 2, d5)); break;
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

// A binding whose height is too small for the window: a status at run time.
Test(nn, window_larger_than_bound_input) {
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "small");
  int64_t dx[4] = {1, 1, jit_symbol(g, "H"), 4};
  jit_window_params p;
  jit_window_params_init(&p);
  p.kernel[0] = p.kernel[1] = 3;
  jit_output(g, jit_max_pool2d(g, jit_input(g, "x", TU_F32, 4, dx), &p));
  TU_OK(jit_graph_finalize(g));
  float x[8] = {0}, y[8];
  int64_t d[4] = {1, 1, 2, 4}, od[4] = {1, 1, 1, 2};
  DLTensor in = tu_tensor(x, TU_F32, 4, d), out = tu_tensor(y, TU_F32, 4, od);
  jit_status s = jit_run(g, &in, 1, &out, 1);
  TU_EXPECT_CODE(s, JIT_SHAPE_MISMATCH);
  TU_EXPECT_MSG(s, "larger than the padded height");
  jit_status_free(s);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// Export to MLIR and back: the same node graph (same fingerprint), the same results.
Test(nn, mlir_round_trip) {
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "rt");
  int64_t dx[4] = {jit_symbol(g, "N"), 2, 6, 6}, dw[4] = {4, 1, 3, 3};
  jit_window_params cp, pp;
  jit_window_params_init(&cp);
  cp.groups = 2;
  cp.padding[0] = cp.padding[2] = 1;
  jit_window_params_init(&pp);
  pp.kernel[0] = pp.kernel[1] = 2;
  pp.count_include_pad = 0;
  pp.stride[0] = pp.stride[1] = 2;
  pp.padding[1] = 1;
  jit_value x = jit_input(g, "x", TU_F32, 4, dx);
  jit_value c = jit_conv2d(g, x, jit_input(g, "w", TU_F32, 4, dw), &cp);
  jit_value m = jit_less(g, c, jit_scalar(g, 0.25, TU_F32));
  jit_value y = jit_where(g, m, jit_pow(g, c, jit_scalar(g, 2.0, TU_F32)), c);
  jit_output(g, jit_avg_pool2d(g, y, &pp));
  TU_OK(jit_graph_finalize(g));
  char *text = NULL;
  TU_OK(jit_graph_to_mlir(g, &text));
  jit_graph *back = NULL;
  TU_OK(jit_graph_from_mlir(ctx, text, strlen(text), NULL, &back));
  float xv[72], wv[36];
  ref_rng rng;
  ref_rng_seed(&rng, 5);
  ref_rng_fill_signed(&rng, xv, 72);
  ref_rng_fill_signed(&rng, wv, 36);
  int64_t cx[4] = {1, 2, 6, 6}, od[4];
  DLTensor ins[2] = {tu_tensor(xv, TU_F32, 4, cx), tu_tensor(wv, TU_F32, 4, dw)};
  int rank = 0;
  TU_OK(jit_output_shape(g, ins, 2, 0, &rank, od));
  cr_assert_eq(rank, 4);
  float a[64], b[64];
  cr_assert(ref_numel(4, od) <= 64);
  DLTensor oa = tu_tensor(a, TU_F32, 4, od), ob = tu_tensor(b, TU_F32, 4, od);
  TU_OK(jit_run(g, ins, 2, &oa, 1));
  TU_OK(jit_run(back, ins, 2, &ob, 1));
  cr_expect(memcmp(a, b, sizeof(float) * (size_t)ref_numel(4, od)) == 0,
            "the round trip computes something else");
  jit_string_free(text);
  jit_graph_destroy(back);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

//===--- gather ------------------------------------------------------------===//

// An embedding lookup: table [V, D] (V symbolic or static), ids [B, S] int32/int64
// (B, S symbolic) -> [B, S, D]; then a 3-D table read by rank-1 ids.
static void check_gather(DLDataType dt, DLDataType it, int sym_rows) {
  const int f16 = tu_is_f16(dt), wide = it.bits == 64;
  ref_rng rng;
  ref_rng_seed(&rng, 60 + (uint64_t)(f16 * 4 + wide * 2 + sym_rows));
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "embed");
  int64_t dt_[2] = {sym_rows ? jit_symbol(g, "V") : 37, 13};
  int64_t di[2] = {jit_symbol(g, "B"), jit_symbol(g, "S")};
  jit_value table = jit_input(g, "table", dt, 2, dt_), ids = jit_input(g, "ids", it, 2, di);
  jit_output(g, jit_mul(g, jit_gather(g, table, ids), jit_scalar(g, 2.0, dt)));
  TU_OK(jit_graph_finalize(g));
  static const int64_t bs[][2] = {{1, 1}, {2, 7}, {3, 5}};
  for (int k = 0; k < 3; k++) {
    int64_t V = sym_rows ? 37 + 2 * k : 37, B = bs[k][0], S = bs[k][1], n = B * S;
    int64_t tdims[2] = {V, 13}, idims[2] = {B, S}, odims[3] = {B, S, 13};
    float *tv = tu_malloc((size_t)V * 13 * 4), *want = tu_malloc((size_t)n * 13 * 4);
    ref_rng_fill_signed(&rng, tv, V * 13);
    void *pt = tu_input_data(dt, tv, V * 13);
    int64_t *i64 = tu_malloc((size_t)n * 8);
    int32_t *i32 = tu_malloc((size_t)n * 4);
    for (int64_t j = 0; j < n; j++) {
      i64[j] = j == 0 ? V - 1 : j == 1 ? 0 : (int64_t)(ref_rng_unit(&rng) * (double)V);
      i32[j] = (int32_t)i64[j];
      for (int c = 0; c < 13; c++) want[j * 13 + c] = 2.0f * tv[i64[j] * 13 + c];
    }
    DLTensor ins[2] = {tu_tensor(pt, dt, 2, tdims),
                       tu_tensor(wide ? (void *)i64 : (void *)i32, it, 2, idims)};
    char what[96];
    snprintf(what, sizeof what, "gather %s ids i%d V=%lld B=%lld S=%lld", dtype_name(dt),
             it.bits, (long long)V, (long long)B, (long long)S);
    tu_run_check(g, ins, 2, dt, 3, odims, want, 0, 0, NULL, what);
    // Out of range, either way: a status naming the index, the output untouched.
    for (int side = 0; side < 2; side++) {
      int64_t bad = side ? V : -1;
      if (wide) i64[n - 1] = bad; else i32[n - 1] = (int32_t)bad;
      float *out = tu_malloc((size_t)n * 13 * (f16 ? 2 : 4));
      DLTensor ot = tu_tensor(out, dt, 3, odims);
      jit_status s = jit_run(g, ins, 2, &ot, 1);
      TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
      char says[96];
      snprintf(says, sizeof says, "index %lld (element %lld of input 1 `ids`)", (long long)bad,
               (long long)(n - 1));
      TU_EXPECT_MSG(s, says);
      jit_status_free(s);
      free(out);
    }
    free(tv), free(want), free(pt), free(i64), free(i32);
  }
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(gather, embedding_f32_i32) { check_gather(TU_F32, (DLDataType){kDLInt, 32, 1}, 0); }
Test(gather, embedding_f32_i64_symbolic_rows) {
  check_gather(TU_F32, (DLDataType){kDLInt, 64, 1}, 1);
}
Test(gather, embedding_f16_i32_symbolic_rows) {
  check_gather(TU_F16, (DLDataType){kDLInt, 32, 1}, 1);
}

// A rank-3 table by rank-1 ids, and a scalar index (rank 0): whole slices.
Test(gather, slices_and_scalar_index) {
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "slices");
  int64_t dt_[3] = {5, 3, 2}, di[1] = {4};
  DLDataType i32 = {kDLInt, 32, 1};
  jit_value table = jit_input(g, "t", TU_F32, 3, dt_);
  jit_value ids = jit_input(g, "ids", i32, 1, di), one = jit_input(g, "one", i32, 0, NULL);
  jit_output(g, jit_gather(g, table, ids));
  jit_output(g, jit_gather(g, table, one));
  TU_OK(jit_graph_finalize(g));
  float tv[30], y[24], z[6];
  for (int i = 0; i < 30; i++) tv[i] = (float)i;
  int32_t iv[4] = {4, 0, 4, 2}, ov = 3;
  DLTensor ins[3] = {tu_tensor(tv, TU_F32, 3, dt_), tu_tensor(iv, i32, 1, di),
                     tu_tensor(&ov, i32, 0, NULL)};
  int64_t yd[3] = {4, 3, 2}, zd[2] = {3, 2};
  DLTensor outs[2] = {tu_tensor(y, TU_F32, 3, yd), tu_tensor(z, TU_F32, 2, zd)};
  TU_OK(jit_run(g, ins, 3, outs, 2));
  for (int i = 0; i < 24; i++) cr_expect_eq(y[i], (float)(iv[i / 6] * 6 + i % 6), "y[%d]", i);
  for (int i = 0; i < 6; i++) cr_expect_eq(z[i], (float)(18 + i), "z[%d]", i);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// Integer values feed only gather's indices; indices must be integers.
// jit_gather_axis: numpy.take along the middle and last axes of a [A, 7, C] table with
// [2, S] indices (A, C, S symbolic), against a plain-C take; an index past the axis is
// refused naming the axis's size.
Test(gather, other_axes) {
  jit_context *ctx = tu_context();
  const DLDataType i32 = {kDLInt, 32, 1};
  for (int axis = 1; axis <= 2; axis++) {
    jit_graph *g = tu_graph(ctx, "take");
    int64_t A = jit_symbol(g, "A"), C = jit_symbol(g, "C"), S = jit_symbol(g, "S");
    jit_value t = jit_input(g, "t", TU_F32, 3, (int64_t[]){A, 7, C});
    jit_value ix = jit_input(g, "ix", i32, 2, (int64_t[]){2, S});
    jit_output(g, jit_gather_axis(g, t, ix, axis == 2 ? -1 : axis));
    TU_OK(jit_graph_finalize(g));
    enum { a = 3, c = 5, s = 4 };
    float tv[a * 7 * c], y[a * 2 * s * 7 * c];
    for (int i = 0; i < a * 7 * c; i++) tv[i] = (float)i * 0.5f - 20.0f;
    int dim = axis == 1 ? 7 : c;
    int32_t iv[2 * s];
    for (int i = 0; i < 2 * s; i++) iv[i] = (i * 5 + 3) % dim;
    int64_t st[3] = {a, 7, c}, si[2] = {2, s};
    int64_t sy1[4] = {a, 2, s, c}, sy2[4] = {a, 7, 2, s};
    DLTensor ins[2] = {tu_tensor(tv, TU_F32, 3, st), tu_tensor(iv, i32, 2, si)};
    DLTensor out = tu_tensor(y, TU_F32, 4, axis == 1 ? sy1 : sy2);
    TU_OK(jit_run(g, ins, 2, &out, 1));
    for (int p = 0; p < a; p++)
      for (int q = 0; q < 2 * s; q++)
        for (int r = 0; r < (axis == 1 ? c : 7); r++) {
          float want = axis == 1 ? tv[(p * 7 + iv[q]) * c + r] : tv[(p * 7 + r) * c + iv[q]];
          float got = axis == 1 ? y[(p * 2 * s + q) * c + r] : y[(p * 7 + r) * 2 * s + q];
          cr_assert_eq(got, want, "axis %d: [%d][%d][%d] = %g, want %g", axis, p, q, r, got,
                       want);
        }
    iv[3] = dim;  // one past the axis
    jit_status s2 = jit_run(g, ins, 2, &out, 1);
    TU_EXPECT_CODE(s2, JIT_INVALID_ARGUMENT);
    char want_msg[32];
    snprintf(want_msg, sizeof want_msg, "[0, %d)", dim);
    TU_EXPECT_MSG(s2, want_msg);
    jit_status_free(s2);
    jit_graph_destroy(g);
  }
  jit_context_destroy(ctx);
}

Test(gather, dtype_rules) {
  jit_context *ctx = tu_context();
  DLDataType i64 = {kDLInt, 64, 1}, u8 = {kDLUInt, 8, 1};
  static const char *const says[] = {"integer values only feed jit_gather's indices",
                                     "indices are int32 or int64",
                                     "outputs are f32, f16 or bf16", "use f32, f16 or bf16 (int32"};
  static const jit_status_code codes[] = {JIT_DTYPE_MISMATCH, JIT_DTYPE_MISMATCH,
                                          JIT_DTYPE_MISMATCH, JIT_UNSUPPORTED};
  for (int i = 0; i < 4; i++) {
    jit_graph *g = tu_graph(ctx, "bad");
    int64_t d[2] = {3, 4};
    jit_value f = jit_input(g, "f", TU_F32, 2, d), n = jit_input(g, "n", i64, 2, d);
    switch (i) {
      case 0: jit_output(g, jit_add(g, f, n)); break;
      case 1: jit_output(g, jit_gather(g, f, f)); break;
      case 2: jit_output(g, n); break;
      case 3: jit_input(g, "u", u8, 1, d); break;
    }
    jit_output(g, f);
    jit_status s = jit_graph_finalize(g);
    TU_EXPECT_CODE(s, codes[i]);
    TU_EXPECT_MSG(s, says[i]);
    jit_status_free(s);
    jit_graph_destroy(g);
  }
  jit_context_destroy(ctx);
}

//===--- concat, slice, pad ------------------------------------------------===//

// A value of `dims` filled with its flat index (exactly representable in f16 too).
static float *iota(int rank, const int64_t *dims, float offset) {
  int64_t n = ref_numel(rank, dims);
  float *v = tu_malloc((size_t)(n ? n : 1) * 4);
  for (int64_t i = 0; i < n; i++) v[i] = offset + (float)(i % 1024);
  return v;
}

// concat of three values along axis 1 with N symbolic (and the middle one's axis dim a
// symbol too), slices with negative bounds and steps, pad on every dim; the result
// checked elementwise.
static void check_copies(DLDataType dt) {
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "copies");
  int64_t N = jit_symbol(g, "N"), K = jit_symbol(g, "K");
  int64_t da[3] = {N, 2, 5}, db[3] = {N, K, 5}, dc[3] = {N, 3, 5};
  jit_value a = jit_input(g, "a", dt, 3, da), b = jit_input(g, "b", dt, 3, db),
            c = jit_input(g, "c", dt, 3, dc);
  jit_value v[3] = {a, b, c};
  jit_value cat = jit_concat(g, v, 3, -2);                 // [N, 5 + K, 5]
  jit_value s1 = jit_slice(g, cat, 1, -4, JIT_SLICE_END, 2);  // last 4 rows, every other
  jit_value s2 = jit_slice(g, s1, 2, 1, -1, 1);                // [N, 2, 3]
  int64_t lo[3] = {1, 0, 2}, hi[3] = {0, 3, 1};
  jit_output(g, jit_pad(g, s2, lo, hi, -7.0));              // [N + 1, 5, 6]
  jit_output(g, cat);
  TU_OK(jit_graph_finalize(g));
  static const int64_t ns[][2] = {{1, 1}, {2, 4}, {3, 2}};
  for (int k = 0; k < 3; k++) {
    int64_t n = ns[k][0], kk = ns[k][1], L = 5 + kk;
    int64_t xa[3] = {n, 2, 5}, xb[3] = {n, kk, 5}, xc[3] = {n, 3, 5};
    float *va = iota(3, xa, 0), *vb = iota(3, xb, 2000), *vc = iota(3, xc, 4000);
    void *pa = tu_input_data(dt, va, n * 10), *pb = tu_input_data(dt, vb, n * kk * 5),
         *pc = tu_input_data(dt, vc, n * 15);
    float *want_cat = tu_malloc((size_t)(n * L * 5) * 4);
    for (int64_t i = 0; i < n; i++)
      for (int64_t r = 0; r < L; r++)
        for (int64_t j = 0; j < 5; j++)
          want_cat[(i * L + r) * 5 + j] =
              r < 2 ? va[(i * 2 + r) * 5 + j]
                    : r < 2 + kk ? vb[(i * kk + r - 2) * 5 + j] : vc[(i * 3 + r - 2 - kk) * 5 + j];
    // s1 rows: L-4, L-2; s2 cols 1..3; pad: [n + 1, 5, 6] of -7 around.
    int64_t pd[3] = {n + 1, 5, 6};
    float *want = tu_malloc((size_t)ref_numel(3, pd) * 4);
    for (int64_t i = 0; i < n + 1; i++)
      for (int64_t r = 0; r < 5; r++)
        for (int64_t j = 0; j < 6; j++) {
          int64_t si = i - 1, sr = r, sj = j - 2;
          float v = -7.0f;
          if (si >= 0 && sr < 2 && sj >= 0 && sj < 3)
            v = want_cat[(si * L + (L - 4 + 2 * sr)) * 5 + 1 + sj];
          want[(i * 5 + r) * 6 + j] = v;
        }
    DLTensor ins[3] = {tu_tensor(pa, dt, 3, xa), tu_tensor(pb, dt, 3, xb), tu_tensor(pc, dt, 3, xc)};
    int64_t cd[3] = {n, L, 5};
    size_t es = tu_is_f16(dt) ? 2 : 4;
    void *o0 = tu_malloc((size_t)ref_numel(3, pd) * es), *o1 = tu_malloc((size_t)(n * L * 5) * es);
    DLTensor outs[2] = {tu_tensor(o0, dt, 3, pd), tu_tensor(o1, dt, 3, cd)};
    TU_OK(jit_run(g, ins, 3, outs, 2));
    float *g0 = tu_malloc((size_t)ref_numel(3, pd) * 4), *g1 = tu_malloc((size_t)(n * L * 5) * 4);
    if (es == 2) {
      ref_f16_to_f32_array(o0, g0, ref_numel(3, pd));
      ref_f16_to_f32_array(o1, g1, n * L * 5);
    } else {
      memcpy(g0, o0, (size_t)ref_numel(3, pd) * 4);
      memcpy(g1, o1, (size_t)(n * L * 5) * 4);
    }
    char what[64];
    snprintf(what, sizeof what, "copies %s N=%lld K=%lld", dtype_name(dt), (long long)n,
             (long long)kk);
    tu_assert_close(g1, want_cat, n * L * 5, 0, 0, 3, cd, what);
    tu_assert_close(g0, want, ref_numel(3, pd), 0, 0, 3, pd, what);
    free(va), free(vb), free(vc), free(pa), free(pb), free(pc);
    free(want_cat), free(want), free(o0), free(o1), free(g0), free(g1);
  }
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(copies, concat_slice_pad_f32) { check_copies(TU_F32); }
Test(copies, concat_slice_pad_f16) { check_copies(TU_F16); }

// GPT-2's fused QKV split: three slices of the last axis, then used as q, k, v.
Test(copies, qkv_split_and_rank0_pad) {
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "qkv");
  int64_t d[2] = {jit_symbol(g, "S"), 12};
  jit_value x = jit_input(g, "x", TU_F32, 2, d);
  jit_value q = jit_slice(g, x, -1, 0, 4, 1), k = jit_slice(g, x, -1, 4, 8, 1),
            v = jit_slice(g, x, -1, 8, 12, 1);
  jit_output(g, jit_add(g, jit_mul(g, q, k), v));
  jit_output(g, jit_pad(g, jit_reduce_sum(g, jit_reduce_sum(g, x, 0, 0), 0, 0), NULL, NULL, 0));
  TU_OK(jit_graph_finalize(g));
  for (int64_t s = 1; s <= 7; s += 6) {
    int64_t xd[2] = {s, 12}, od[2] = {s, 4};
    float *xv = iota(2, xd, 0), y[28], z, want[28];
    double sum = 0;
    for (int64_t i = 0; i < s * 12; i++) sum += xv[i];
    for (int64_t i = 0; i < s; i++)
      for (int j = 0; j < 4; j++)
        want[i * 4 + j] = xv[i * 12 + j] * xv[i * 12 + 4 + j] + xv[i * 12 + 8 + j];
    DLTensor in = tu_tensor(xv, TU_F32, 2, xd);
    DLTensor outs[2] = {tu_tensor(y, TU_F32, 2, od), tu_tensor(&z, TU_F32, 0, NULL)};
    TU_OK(jit_run(g, &in, 1, outs, 2));
    tu_assert_close(y, want, s * 4, 1e-6, 0, 2, od, "qkv");
    cr_expect(fabs(z - sum) < 1e-3, "pad of a rank-0 value: %g vs %g", z, sum);
    free(xv);
  }
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// Reflect, replicate and circular padding of a [2, H] tensor (H symbolic) by (1, 3) on
// dim 1, against a plain-C mirror / clamp / wrap; a reflect pad not below H is refused
// at run time.
Test(copies, reflect_replicate_circular_pads) {
  jit_context *ctx = tu_context();
  for (int how = JIT_PAD_REFLECT; how <= JIT_PAD_CIRCULAR; how++) {
    jit_graph *g = tu_graph(ctx, "pad_modes");
    int64_t H = jit_symbol(g, "H");
    jit_value x = jit_input(g, "x", TU_F32, 2, (int64_t[]){2, H});
    jit_output(g, jit_pad_with(g, x, (int64_t[]){0, 1}, (int64_t[]){0, 3}, how, 9.0));
    TU_OK(jit_graph_finalize(g));
    for (int h = 4; h <= 7; h += 3) {
      float xv[2 * 7], y[2 * 11];
      for (int i = 0; i < 2 * h; i++) xv[i] = (float)(i * i % 17) - 8.0f;
      int64_t sx[2] = {2, h}, sy[2] = {2, h + 4};
      DLTensor in = tu_tensor(xv, TU_F32, 2, sx), out = tu_tensor(y, TU_F32, 2, sy);
      TU_OK(jit_run(g, &in, 1, &out, 1));
      for (int r = 0; r < 2; r++)
        for (int j = 0; j < h + 4; j++) {
          int p = j - 1;
          int q = how == JIT_PAD_REFLECT     ? (p < 0 ? -p : p > h - 1 ? 2 * (h - 1) - p : p)
                  : how == JIT_PAD_CIRCULAR ? (p % h + h) % h
                                            : (p < 0 ? 0 : p > h - 1 ? h - 1 : p);
          cr_assert_eq(y[r * (h + 4) + j], xv[r * h + q], "padding %d h=%d [%d][%d]: %g, want %g",
                       how, h, r, j, y[r * (h + 4) + j], xv[r * h + q]);
        }
    }
    if (how == JIT_PAD_REFLECT) {
      float xv[6], y[14];
      int64_t sx[2] = {2, 3}, sy[2] = {2, 7};
      DLTensor in = tu_tensor(xv, TU_F32, 2, sx), out = tu_tensor(y, TU_F32, 2, sy);
      jit_status s = jit_run(g, &in, 1, &out, 1);
      TU_EXPECT_CODE(s, JIT_SHAPE_MISMATCH);
      TU_EXPECT_MSG(s, "reflect");
      jit_status_free(s);
    }
    jit_graph_destroy(g);
  }
  jit_context_destroy(ctx);
}

Test(copies, bad_arguments) {
  jit_context *ctx = tu_context();
  static const char *const says[] = {"differ in a dim other than axis 1", "axis 3 out of range",
                                     "step 0 not in", "is empty", "each must be in",
                                     "no values to join", "is empty"};
  static const jit_status_code codes[] = {JIT_SHAPE_MISMATCH, JIT_INVALID_ARGUMENT,
                                          JIT_INVALID_ARGUMENT, JIT_SHAPE_MISMATCH,
                                          JIT_INVALID_ARGUMENT, JIT_INVALID_ARGUMENT,
                                          JIT_SHAPE_MISMATCH};
  for (int i = 0; i < 7; i++) {
    jit_graph *g = tu_graph(ctx, "bad");
    int64_t d[2] = {3, 4}, e[2] = {2, 5};
    jit_value x = jit_input(g, "x", TU_F32, 2, d), y = jit_input(g, "y", TU_F32, 2, e), r = {0};
    jit_value v[2] = {x, y};
    int64_t lo[2] = {0, -1}, hi[2] = {0, 0};
    switch (i) {
      case 0: r = jit_concat(g, v, 2, 1); break;
      case 1: r = jit_concat(g, v, 2, 3); break;
      case 2: r = jit_slice(g, x, 0, 0, 2, 0); break;
      case 3: r = jit_slice(g, x, 1, 3, 1, 1); break;
      case 4: r = jit_pad(g, x, lo, hi, 0); break;
      case 5: r = jit_concat(g, v, 0, 0); break;
      case 6: r = jit_slice(g, x, 0, -10, -4, 1); break;
    }
    cr_expect_eq(r.id, 0, "case %d built a value", i);
    jit_output(g, x);
    jit_status s = jit_graph_finalize(g);
    TU_EXPECT_CODE(s, codes[i]);
    TU_EXPECT_MSG(s, says[i]);
    jit_status_free(s);
    jit_graph_destroy(g);
  }
  jit_context_destroy(ctx);
}

//===--- cast ----------------------------------------------------------------===//

// f32 -> f16 (round to nearest even, overflow to inf) -> f32 (exact), N symbolic, and
// a mixed-precision chain: an f16 input computed on in f32 and returned in f16.
Test(cast, f32_f16_round_trip_and_mixed_chain) {
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "cast");
  int64_t d[2] = {jit_symbol(g, "N"), 6}, dw[2] = {6, 3};
  jit_value x = jit_input(g, "x", TU_F32, 2, d), h = jit_input(g, "h", TU_F16, 2, d);
  jit_value w = jit_input(g, "w", TU_F32, 2, dw);
  jit_output(g, jit_cast(g, jit_cast(g, x, TU_F16), TU_F32));
  jit_output(g, jit_cast(g, jit_matmul(g, jit_cast(g, h, TU_F32), w), TU_F16));
  jit_output(g, jit_cast(g, x, TU_F32));  // the same dtype: x itself
  TU_OK(jit_graph_finalize(g));
  ref_rng rng;
  ref_rng_seed(&rng, 8);
  for (int64_t n = 1; n <= 9; n += 8) {
    int64_t xd[2] = {n, 6}, od[2] = {n, 3};
    float *xv = tu_malloc((size_t)n * 24), *hv = tu_malloc((size_t)n * 24), wv[18];
    ref_rng_fill_signed(&rng, xv, n * 6);
    ref_rng_fill_signed(&rng, hv, n * 6);
    ref_rng_fill_signed(&rng, wv, 18);
    xv[0] = 70000.0f;                 // overflows f16
    if (n > 1) xv[7] = 1.0f + 1.0f / 2048.0f;  // a tie: rounds to even (1.0)
    void *ph = tu_input_data(TU_F16, hv, n * 6);
    float *w0 = tu_malloc((size_t)n * 24), *w1 = tu_malloc((size_t)n * 12);
    memcpy(w0, xv, (size_t)n * 24);
    ref_round_f16_array(w0, n * 6);
    for (int64_t i = 0; i < n; i++)
      for (int j = 0; j < 3; j++) {
        double acc = 0;
        for (int k = 0; k < 6; k++) acc += (double)hv[i * 6 + k] * wv[k * 3 + j];
        w1[i * 3 + j] = (float)acc;
      }
    ref_round_f16_array(w1, n * 3);
    DLTensor ins[3] = {tu_tensor(xv, TU_F32, 2, xd), tu_tensor(ph, TU_F16, 2, xd),
                       tu_tensor(wv, TU_F32, 2, dw)};
    float *o0 = tu_malloc((size_t)n * 24), *o2 = tu_malloc((size_t)n * 24);
    uint16_t *o1 = tu_malloc((size_t)n * 6);
    DLTensor outs[3] = {tu_tensor(o0, TU_F32, 2, xd), tu_tensor(o1, TU_F16, 2, od),
                        tu_tensor(o2, TU_F32, 2, xd)};
    TU_OK(jit_run(g, ins, 3, outs, 3));
    float *g1 = tu_malloc((size_t)n * 12);
    ref_f16_to_f32_array(o1, g1, n * 3);
    tu_assert_close(o0, w0, n * 6, 0, 0, 2, xd, "f32 -> f16 -> f32");
    tu_assert_close(g1, w1, n * 3, 2e-3, 1e-3, 2, od, "f16 chain in f32");
    tu_assert_close(o2, xv, n * 6, 0, 0, 2, xd, "cast to the same dtype");
    cr_expect(isinf(o0[0]), "70000 in f16 is inf, got %g", o0[0]);
    free(xv), free(hv), free(ph), free(w0), free(w1), free(o0), free(o1), free(o2), free(g1);
  }
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(cast, to_unsigned_is_unsupported) {
  // Integer casts are tests/test_cast.c's; unsigned and 16-bit integers have none.
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "cast_uint");
  int64_t d[1] = {4};
  jit_value x = jit_input(g, "x", TU_F32, 1, d);
  cr_expect_eq(jit_cast(g, x, (DLDataType){kDLUInt, 8, 1}).id, 0);
  jit_output(g, x);
  jit_status s = jit_graph_finalize(g);
  TU_EXPECT_CODE(s, JIT_UNSUPPORTED);
  TU_EXPECT_MSG(s, "f32, f16, bf16, int8, int32 and int64");
  jit_status_free(s);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

//===--- attention -----------------------------------------------------------===//

static float *random_f32_n(ref_rng *rng, int64_t n) {
  float *x = tu_malloc((size_t)(n ? n : 1) * 4);
  ref_rng_fill_signed(rng, x, n);
  return x;
}

// Heads [B, H, S, D] with S and T symbolic or static; with and without a mask, causal
// or not; T across one and several key blocks (64), prime sizes.
static void check_attention(DLDataType dt, int with_mask, int causal, int symbolic,
                            jit_shape_policy policy) {
  const int f16 = tu_is_f16(dt);
  jit_context *ctx = tu_context_policy(policy);
  jit_graph *g = tu_graph(ctx, "attention");
  int64_t S = symbolic ? jit_symbol(g, "S") : 5, T = symbolic ? jit_symbol(g, "T") : 131;
  const int64_t H = 3, D = 8, Dv = 6;
  int64_t dq[4] = {2, H, S, D}, dk[4] = {2, H, T, D}, dv[4] = {2, H, T, Dv}, dm[2] = {S, T};
  jit_value q = jit_input(g, "q", dt, 4, dq), k = jit_input(g, "k", dt, 4, dk),
            v = jit_input(g, "v", dt, 4, dv);
  jit_value m = with_mask ? jit_input(g, "m", dt, 2, dm) : (jit_value){0};
  jit_output(g, jit_attention(g, q, k, v, m, 0.0, causal));
  TU_OK(jit_graph_finalize(g));
  static const int64_t st[][2] = {{5, 131}, {1, 1}, {7, 64}, {13, 200}};
  ref_rng rng;
  ref_rng_seed(&rng, 70 + (uint64_t)(with_mask * 2 + causal));
  for (int c = 0; c < (symbolic ? 4 : 1); c++) {
    int64_t s = st[c][0], t = st[c][1], B = 2 * H;
    int64_t cq[4] = {2, H, s, D}, ck[4] = {2, H, t, D}, cv[4] = {2, H, t, Dv}, cm[2] = {s, t},
            co[4] = {2, H, s, Dv};
    float *qv = random_f32_n(&rng, B * s * D), *kv = random_f32_n(&rng, B * t * D),
          *vv = random_f32_n(&rng, B * t * Dv), *mv = tu_malloc((size_t)(s * t) * 4),
          *want = tu_malloc((size_t)(B * s * Dv) * 4);
    for (int64_t i = 0; i < s * t; i++) mv[i] = (i * 7) % 5 == 0 ? -INFINITY : 0.25f * (float)(i % 3);
    if (causal || !with_mask)  // keep every row alive: the diagonal is never masked
      for (int64_t i = 0; i < s; i++) mv[i * t + (i + t - s)] = 0.0f;
    for (int64_t i = 0; i < s && !causal; i++) mv[i * t] = 0.0f;
    void *pq = tu_input_data(dt, qv, B * s * D), *pk = tu_input_data(dt, kv, B * t * D),
         *pv = tu_input_data(dt, vv, B * t * Dv), *pm = tu_input_data(dt, mv, s * t);
    ref_attention(qv, kv, vv, with_mask ? mv : NULL, B, s, t, D, Dv, 1.0 / sqrt((double)D),
                  causal, want);
    if (f16) ref_round_f16_array(want, B * s * Dv);
    DLTensor ins[4] = {tu_tensor(pq, dt, 4, cq), tu_tensor(pk, dt, 4, ck),
                       tu_tensor(pv, dt, 4, cv), tu_tensor(pm, dt, 2, cm)};
    char what[96];
    snprintf(what, sizeof what, "attention %s mask=%d causal=%d S=%lld T=%lld", dtype_name(dt),
             with_mask, causal, (long long)s, (long long)t);
    tu_run_check(g, ins, with_mask ? 4 : 3, dt, 4, co, want, f16 ? 1e-2 : 2e-5,
                 f16 ? 5e-3 : 2e-6, NULL, what);
    free(qv), free(kv), free(vv), free(mv), free(want), free(pq), free(pk), free(pv), free(pm);
  }
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(attention, plain_static_exact) { check_attention(TU_F32, 0, 0, 0, JIT_SHAPE_POLICY_EXACT); }
Test(attention, mask_causal_exact) { check_attention(TU_F32, 1, 1, 1, JIT_SHAPE_POLICY_EXACT); }
Test(attention, mask_exact) { check_attention(TU_F32, 1, 0, 1, JIT_SHAPE_POLICY_EXACT); }
Test(attention, causal_generic) { check_attention(TU_F32, 0, 1, 1, JIT_SHAPE_POLICY_GENERIC); }
Test(attention, mask_causal_generic) { check_attention(TU_F32, 1, 1, 1, JIT_SHAPE_POLICY_GENERIC); }
Test(attention, f16_causal_exact) { check_attention(TU_F16, 0, 1, 1, JIT_SHAPE_POLICY_EXACT); }
Test(attention, f16_mask_auto) { check_attention(TU_F16, 1, 0, 1, JIT_SHAPE_POLICY_AUTO); }

Test(attention, bad_arguments) {
  jit_context *ctx = tu_context();
  static const char *const says[] = {"must be [..., S, D], [..., T, D]", "do not broadcast",
                                     "must be finite", "D is not static"};
  for (int i = 0; i < 4; i++) {
    jit_graph *g = tu_graph(ctx, "bad");
    int64_t dq[3] = {2, 4, 8}, dk[3] = {2, 5, 7}, dk2[3] = {2, 5, 8}, dm[2] = {3, 5},
            dqs[3] = {2, 4, jit_symbol(g, "D")};
    jit_value q = jit_input(g, "q", TU_F32, 3, i == 3 ? dqs : dq), r = {0};
    jit_value k = jit_input(g, "k", TU_F32, 3, i == 0 ? dk : dk2);
    switch (i) {
      case 0: r = jit_attention(g, q, k, k, (jit_value){0}, 0, 0); break;
      case 1: r = jit_attention(g, q, k, k, jit_input(g, "m", TU_F32, 2, dm), 0, 0); break;
      case 2: r = jit_attention(g, q, k, k, (jit_value){0}, NAN, 0); break;
      case 3: r = jit_attention(g, q, k, k, (jit_value){0}, 0, 1); break;
    }
    cr_expect_eq(r.id, 0, "case %d built a value", i);
    jit_output(g, q);
    jit_status s = jit_graph_finalize(g);
    TU_EXPECT_CODE(s, i < 2 ? JIT_SHAPE_MISMATCH : JIT_INVALID_ARGUMENT);
    TU_EXPECT_MSG(s, says[i]);
    jit_status_free(s);
    jit_graph_destroy(g);
  }
  jit_context_destroy(ctx);
}
