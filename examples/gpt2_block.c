//===--- gpt2_block.c - a GPT-2 decoder block, batch and sequence symbolic -----===//
//
// One pre-norm decoder block of GPT-2 small, built with the C API with the batch B and
// the sequence length S left symbolic:
//
//   h  = layer_norm(x)                                  x: [B, S, D]
//   q, k, v = h Wq + bq, h Wk + bk, h Wv + bv           split into H heads of D/H
//   a  = softmax(q k^T / sqrt(D/H) + mask) v            mask: [S, S], 0 or -inf above
//   x1 = x + a Wo + bo                                   the diagonal (causal)
//   y  = x1 + gelu_erf(layer_norm(x1) W1 + c1) W2 + c2
//
// Weights come from a fixed generator (no downloads). The causal mask is an input, so
// one graph serves every S; each (B, S) gets its own kernel (shape policy EXACT, see
// build()). Each runs twice and is checked against a plain-C reference in double
// precision.
//
//   build/examples/gpt2_block            GPT-2 small: D 768, 12 heads, MLP 3072
//   build/examples/gpt2_block --small    D 64, 4 heads, MLP 256 (what CTest runs)
//
// Exits 0 when every status is OK and every max |error| is within 2e-3.
//
//===----------------------------------------------------------------------===//
#define _POSIX_C_SOURCE 199309L  // clock_gettime in strict C11

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "jitml.h"

static const double kTolerance = 2e-3;
static const DLDataType kF32 = {kDLFloat, 32, 1};

static int D = 768, H = 12, FF = 3072;

static bool ok(jit_status status, const char *what) {
  if (status == NULL) return true;
  fprintf(stderr, "gpt2_block: %s failed: %s: %s\n", what,
          jit_status_code_name(jit_status_get_code(status)), jit_status_message(status));
  jit_status_free(status);
  return false;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;

static float uniform(float lo, float hi) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return lo + (hi - lo) * (float)(rng_state >> 40) / (float)(1 << 24);
}

static float *random_array(int64_t n, float scale) {
  float *a = malloc(sizeof(float) * (size_t)n);
  for (int64_t i = 0; a && i < n; i++) a[i] = uniform(-scale, scale);
  return a;
}

static DLTensor tensor(float *data, int rank, int64_t *shape) {
  return (DLTensor){.data = data, .device = {kDLCPU, 0}, .ndim = rank, .dtype = kF32,
                    .shape = shape};
}

//===--- Weights --------------------------------------------------------===//

enum { LN1_G, LN1_B, WQ, BQ, WK, BK, WV, BV, WO, BO, LN2_G, LN2_B, W1, C1, W2, C2, NW };

static const char *const kNames[NW] = {"ln1_g", "ln1_b", "wq", "bq", "wk",    "bk",
                                       "wv",    "bv",    "wo", "bo", "ln2_g", "ln2_b",
                                       "w1",    "c1",    "w2", "c2"};

typedef struct weights {
  float *w[NW];
  int64_t shape[NW][2];  // [n] or [rows, cols]
  int rank[NW];
} weights;

// Gains around 1, the rest small, from the fixed generator.
static void make_weights(weights *p) {
  for (int i = 0; i < NW; i++) {
    bool matrix = i == WQ || i == WK || i == WV || i == WO || i == W1 || i == W2;
    p->rank[i] = matrix ? 2 : 1;
    p->shape[i][0] = i == W2 ? FF : i == C1 ? FF : D;
    p->shape[i][1] = !matrix ? 0 : i == W1 ? FF : D;
    int64_t n = p->shape[i][0] * (matrix ? p->shape[i][1] : 1);
    bool gain = i == LN1_G || i == LN2_G;
    p->w[i] = random_array(n, gain ? 0.2f : 0.05f);
    for (int64_t j = 0; gain && j < n; j++) p->w[i][j] += 1.0f;
  }
}

//===--- The graph --------------------------------------------------------===//

// [B, S, D] -> [B, H, S, D/H].
static jit_value heads(jit_graph *g, jit_value t, int64_t B, int64_t S) {
  int64_t split[4] = {B, S, H, D / H};
  int perm[4] = {0, 2, 1, 3};
  return jit_transpose(g, jit_reshape(g, t, 4, split), perm);
}

static jit_value linear(jit_graph *g, jit_value x, jit_value w, jit_value b) {
  return jit_add(g, jit_matmul(g, x, w), b);
}

// Inputs: x [B, S, D], mask [S, S], then the weights in enum order.
static jit_status build(jit_context *ctx, const weights *p, jit_graph **out) {
  jit_graph *g = NULL;
  jit_status s = jit_graph_create(ctx, "gpt2_block", &g);
  if (s) return s;
  int64_t B = jit_symbol(g, "B"), S = jit_symbol(g, "S");
  int64_t dx[3] = {B, S, D}, dm[2] = {S, S};
  jit_value x = jit_input(g, "x", kF32, 3, dx), mask = jit_input(g, "mask", kF32, 2, dm);
  jit_value w[NW];
  // Weights (jit_weight): the same data every call, so the CPU packs them once.
  for (int i = 0; i < NW; i++) w[i] = jit_weight(g, kNames[i], kF32, p->rank[i], p->shape[i]);

  jit_value h = jit_layer_norm(g, x, w[LN1_G], w[LN1_B], 1e-5);
  jit_value q = heads(g, linear(g, h, w[WQ], w[BQ]), B, S);
  jit_value k = heads(g, linear(g, h, w[WK], w[BK]), B, S);
  jit_value v = heads(g, linear(g, h, w[WV], w[BV]), B, S);
  // softmax(q k^T / sqrt(D/H) + mask) v: on the CPU the keys in blocks with a running
  // max and sum (jit_attention), never the whole S x S scores.
  jit_value att = jit_attention(g, q, k, v, mask, 0.0, 0);
  int perm[4] = {0, 2, 1, 3};
  int64_t merged[3] = {B, S, D};
  jit_value a = jit_reshape(g, jit_transpose(g, att, perm), 3, merged);
  jit_value x1 = jit_add(g, x, linear(g, a, w[WO], w[BO]));
  jit_value h2 = jit_layer_norm(g, x1, w[LN2_G], w[LN2_B], 1e-5);
  jit_value m = linear(g, jit_gelu_erf(g, linear(g, h2, w[W1], w[C1])), w[W2], w[C2]);
  jit_output(g, jit_add(g, x1, m));
  // Each (B, S) gets its own kernel: a generic kernel runs batched matmuls (the
  // projections of [B, S, D] and the heads' q k^T) as plain loops today, ~300x slower
  // than exact kernels here (README, "Shape policies").
  s = jit_graph_set_shape_policy(g, JIT_SHAPE_POLICY_EXACT);
  if (!s) s = jit_graph_finalize(g);
  if (s) {
    jit_graph_destroy(g);
    return s;
  }
  *out = g;
  return NULL;
}

//===--- Plain-C reference (double) ------------------------------------------===//

static void ref_layer_norm(const double *x, int64_t rows, const float *g, const float *b,
                           double *y) {
  for (int64_t r = 0; r < rows; r++) {
    const double *xr = x + r * D;
    double mean = 0, var = 0;
    for (int c = 0; c < D; c++) mean += xr[c];
    mean /= D;
    for (int c = 0; c < D; c++) var += (xr[c] - mean) * (xr[c] - mean);
    double inv = 1.0 / sqrt(var / D + 1e-5);
    for (int c = 0; c < D; c++) y[r * D + c] = (xr[c] - mean) * inv * g[c] + b[c];
  }
}

// y[rows, n] = x[rows, k] W[k, n] + b.
static void ref_linear(const double *x, int64_t rows, int k, int n, const float *w,
                       const float *b, double *y) {
  for (int64_t r = 0; r < rows; r++)
    for (int j = 0; j < n; j++) {
      double acc = b[j];
      for (int i = 0; i < k; i++) acc += x[r * k + i] * w[(int64_t)i * n + j];
      y[r * n + j] = acc;
    }
}

// Causal attention of one batch row: q, k, v, out are [S, D] (heads side by side).
static void ref_attention(const double *q, const double *k, const double *v, int64_t S,
                          double *out, double *row) {
  int dh = D / H;
  for (int hd = 0; hd < H; hd++)
    for (int64_t i = 0; i < S; i++) {
      double mx = -INFINITY, sum = 0;
      for (int64_t j = 0; j <= i; j++) {
        double s = 0;
        for (int c = 0; c < dh; c++) s += q[i * D + hd * dh + c] * k[j * D + hd * dh + c];
        row[j] = s / sqrt(dh);
        mx = row[j] > mx ? row[j] : mx;
      }
      for (int64_t j = 0; j <= i; j++) sum += (row[j] = exp(row[j] - mx));
      for (int c = 0; c < dh; c++) {
        double acc = 0;
        for (int64_t j = 0; j <= i; j++) acc += row[j] * v[j * D + hd * dh + c];
        out[i * D + hd * dh + c] = acc / sum;
      }
    }
}

static void reference(const weights *p, const float *x, int64_t B, int64_t S, float *y) {
  int64_t rows = B * S, n = rows * D;
  double *xd = malloc(sizeof(double) * n), *h = malloc(sizeof(double) * n);
  double *q = malloc(sizeof(double) * n), *k = malloc(sizeof(double) * n);
  double *v = malloc(sizeof(double) * n), *a = malloc(sizeof(double) * n);
  double *x1 = malloc(sizeof(double) * n), *f = malloc(sizeof(double) * rows * FF);
  double *row = malloc(sizeof(double) * S);
  for (int64_t i = 0; i < n; i++) xd[i] = x[i];
  ref_layer_norm(xd, rows, p->w[LN1_G], p->w[LN1_B], h);
  ref_linear(h, rows, D, D, p->w[WQ], p->w[BQ], q);
  ref_linear(h, rows, D, D, p->w[WK], p->w[BK], k);
  ref_linear(h, rows, D, D, p->w[WV], p->w[BV], v);
  for (int64_t b = 0; b < B; b++)
    ref_attention(q + b * S * D, k + b * S * D, v + b * S * D, S, a + b * S * D, row);
  ref_linear(a, rows, D, D, p->w[WO], p->w[BO], x1);
  for (int64_t i = 0; i < n; i++) x1[i] += xd[i];
  ref_layer_norm(x1, rows, p->w[LN2_G], p->w[LN2_B], h);
  ref_linear(h, rows, D, FF, p->w[W1], p->w[C1], f);
  for (int64_t i = 0; i < rows * FF; i++) f[i] = 0.5 * f[i] * (1 + erf(f[i] / sqrt(2.0)));
  ref_linear(f, rows, FF, D, p->w[W2], p->w[C2], q);
  for (int64_t i = 0; i < n; i++) y[i] = (float)(x1[i] + q[i]);
  free(xd), free(h), free(q), free(k), free(v), free(a), free(x1), free(f), free(row);
}

//===--- Main ------------------------------------------------------------===//

// Runs the block for (B, S) twice; false on a failed status or a mismatch.
static bool run_one(jit_graph *g, const weights *p, int64_t B, int64_t S) {
  int64_t n = B * S * D, dx[3] = {B, S, D}, dm[2] = {S, S};
  float *x = random_array(n, 1.0f), *y = malloc(sizeof(float) * n);
  float *want = malloc(sizeof(float) * n), *mask = malloc(sizeof(float) * S * S);
  for (int64_t i = 0; i < S; i++)
    for (int64_t j = 0; j < S; j++) mask[i * S + j] = j <= i ? 0.0f : -INFINITY;
  DLTensor in[2 + NW];
  int64_t wshape[NW][2];
  in[0] = tensor(x, 3, dx);
  in[1] = tensor(mask, 2, dm);
  for (int i = 0; i < NW; i++) {
    memcpy(wshape[i], p->shape[i], sizeof wshape[i]);
    in[2 + i] = tensor(p->w[i], p->rank[i], wshape[i]);
  }
  DLTensor out = tensor(y, 3, dx);
  double t0 = now_ms();
  bool good = ok(jit_run(g, in, 2 + NW, &out, 1), "jit_run");
  double t1 = now_ms();
  good = good && ok(jit_run(g, in, 2 + NW, &out, 1), "jit_run");
  double t2 = now_ms();
  double err = 0;
  if (good) {
    reference(p, x, B, S, want);
    for (int64_t i = 0; i < n; i++) {
      double e = fabs((double)y[i] - want[i]);
      err = e > err || e != e ? e : err;
    }
  }
  bool match = good && err <= kTolerance;
  printf("B=%-3lld S=%-4lld first call %9.2f ms   second call %8.3f ms   max|err| %.1e  %s\n",
         (long long)B, (long long)S, t1 - t0, t2 - t1, err, match ? "OK" : "MISMATCH");
  free(x), free(y), free(want), free(mask);
  return match;
}

int main(int argc, char **argv) {
  bool small = argc > 1 && !strcmp(argv[1], "--small");
  if (argc > 1 && !small) {
    fprintf(stderr, "usage: gpt2_block [--small]\n");
    return 2;
  }
  if (small) D = 64, H = 4, FF = 256;
  weights p;
  make_weights(&p);
  jit_context *ctx = NULL;
  jit_graph *g = NULL;
  bool all = ok(jit_context_create(NULL, &ctx), "jit_context_create") &&
             ok(build(ctx, &p, &g), "building the graph");
  printf("GPT-2 block: D %d, %d heads, MLP %d; batch B and sequence S symbolic\n", D, H, FF);
  static const int64_t bs[][2] = {{1, 1}, {1, 7}, {2, 16}, {1, 64}, {3, 33}};
  for (size_t i = 0; all && i < sizeof bs / sizeof bs[0]; i++)
    all = run_one(g, &p, bs[i][0], bs[i][1]) && all;
  jit_stats st = {.struct_size = sizeof st};
  if (ctx && ok(jit_context_stats(ctx, &st), "jit_context_stats"))
    printf("stats: runs %llu   compiles %llu (%.1f ms)   generic runs %llu   disk hits %llu\n",
           (unsigned long long)st.runs, (unsigned long long)st.compiles, st.compile_ms,
           (unsigned long long)st.generic_runs, (unsigned long long)st.disk_hits);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
  for (int i = 0; i < NW; i++) free(p.w[i]);
  return all ? 0 : 1;
}
