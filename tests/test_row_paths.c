//===--- test_row_paths.c - row, elementwise and block paths against plain C ===//
//
// The CPU strategy's paths for what is not one matmul: vectorized elementwise chains
// with a peeled tail and column broadcasts, layer norm's one-row loop, softmax rows
// (split across threads, streamed when large, NaN and infinite rows), inline exp,
// whole transformer blocks and buffers reused across calls, the host description's
// warnings, and the LLVM pipeline each kernel takes. Like test_perf_paths.c, at 1 and
// 2 threads with shapes that include 1, primes and non-multiples of every tile,
// compared with the double-accumulating references in ref.c; CTest runs it on the
// same pinned hosts.
//
//===----------------------------------------------------------------------===//
#define _GNU_SOURCE  // RUSAGE_THREAD; implies _XOPEN_SOURCE 700
#include <dirent.h>
#include <ftw.h>
#include <pthread.h>
#include <stdbool.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "paths.h"

// The same caches as test_perf_paths.c whatever the host has.
__attribute__((constructor)) static void pin_l2(void) { pin_caches(); }

// relu(a * b + c) as one vectorized loop, with a tail that is not a multiple of the
// vector tile, and split over threads when large.
static void check_chain(int64_t rows, int64_t cols, int threads) {
  jit_context *ctx = ctx_threads(threads);
  jit_graph *g = tu_graph(ctx, "chain");
  int64_t s[2] = {rows, cols};
  jit_value a = jit_input(g, "a", TU_F32, 2, s), b = jit_input(g, "b", TU_F32, 2, s),
            c = jit_input(g, "c", TU_F32, 2, s);
  jit_output(g, jit_relu(g, jit_add(g, jit_mul(g, a, b), c)));
  TU_OK(jit_graph_finalize(g));
  int64_t n = rows * cols;
  float *x[3], *want = tu_malloc(sizeof(float) * (size_t)n);
  ref_rng rng;
  ref_rng_seed(&rng, (uint64_t)n);
  for (int i = 0; i < 3; i++) {
    x[i] = tu_malloc(sizeof(float) * (size_t)n);
    ref_rng_fill_signed(&rng, x[i], n);
  }
  for (int64_t i = 0; i < n; i++) {
    float v = x[0][i] * x[1][i] + x[2][i];
    want[i] = v > 0 ? v : 0;
  }
  DLTensor ins[3] = {tu_tensor(x[0], TU_F32, 2, s), tu_tensor(x[1], TU_F32, 2, s),
                     tu_tensor(x[2], TU_F32, 2, s)};
  char what[64];
  snprintf(what, sizeof what, "relu(a*b+c) %lldx%lld threads=%d", (long long)rows,
           (long long)cols, threads);
  tu_run_check(g, ins, 3, TU_F32, 2, s, want, 1e-6, 1e-6, NULL, what);
  for (int i = 0; i < 3; i++) free(x[i]);
  free(want);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(row_paths, elementwise_chain) {
  check_chain(1, 1, 1);
  check_chain(1, 37, 1);
  check_chain(3, 1000, 1);
  check_chain(127, 513, 2);      // under 2^16 elements: one thread
  check_chain(256, 513, 2);      // from 2^16: rows split over threads
  check_chain(2048, 513, 2);
  check_chain(2, 600001, 2);
  check_chain(7, 20000, 2);      // 7 rows do not split in two: the columns do
  check_chain(1, 131072, 2);     // one row: its columns split
}

// x + c and gelu(x * c) with c of shape (M, 1): c is read once per row and broadcast
// (the script drops the tile's unit dims so that it is a load and a broadcast, not a
// loop of inserts), exact over shapes with 1, primes and rows that are not a whole
// number of vectors.
static void check_column_broadcast(int64_t M, int64_t N, int threads, int act) {
  int64_t sx[2] = {M, N}, sc[2] = {M, 1}, n = M * N;
  dump_begin();
  jit_context *ctx = ctx_threads(threads);
  jit_graph *g = tu_graph(ctx, "colbcast");
  jit_value x = jit_input(g, "x", TU_F32, 2, sx), c = jit_input(g, "c", TU_F32, 2, sc);
  jit_output(g, act ? jit_gelu(g, jit_mul(g, x, c)) : jit_add(g, x, c));
  TU_OK(jit_graph_finalize(g));
  float *xv = tu_malloc(sizeof(float) * (size_t)n), *cv = tu_malloc(sizeof(float) * (size_t)M);
  float *want = tu_malloc(sizeof(float) * (size_t)n);
  ref_rng rng;
  ref_rng_seed(&rng, (uint64_t)(n + act));
  ref_rng_fill_signed(&rng, xv, n);
  ref_rng_fill_signed(&rng, cv, M);
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < N; j++) {
      float v = act ? xv[i * N + j] * cv[i] : xv[i * N + j] + cv[i];
      want[i * N + j] = act ? gelu_ref(v) : v;
    }
  DLTensor ins[2] = {tu_tensor(xv, TU_F32, 2, sx), tu_tensor(cv, TU_F32, 2, sc)};
  char what[64];
  snprintf(what, sizeof what, "%s %lldx%lld threads=%d", act ? "gelu(x * c)" : "x + c",
           (long long)M, (long long)N, threads);
  tu_run_check(g, ins, 2, TU_F32, 2, sx, want, act ? 1e-5 : 0, act ? 1e-6 : 0, NULL, what);
  if (N > 1)
    cr_expect(script_has("cast_away_vector_leading_one_dim"),
              "%s: the broadcast column is not read as a scalar", what);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
  dump_end();
  free(xv);
  free(cv);
  free(want);
}

Test(row_paths, column_broadcast) {
  check_column_broadcast(1, 1, 1, 0);
  check_column_broadcast(7, 13, 1, 0);
  check_column_broadcast(97, 1000, 1, 1);
  check_column_broadcast(2048, 515, 2, 0);  // split across threads
  check_column_broadcast(3, 4099, 1, 1);
}

// Layer normalization written with keepdims means, (x - m) * rsqrt(mean((x - m)^2) + e):
// one row loop with both means fused in (no whole (x - m) on the heap), the row sums
// vectorized (reassociated), and exact against plain C.
static void check_layernorm(int64_t M, int64_t N, int threads) {
  int64_t s[2] = {M, N}, n = M * N;
  dump_begin();
  jit_context *ctx = ctx_threads(threads);
  jit_graph *g = tu_graph(ctx, "layernorm");
  jit_value x = jit_input(g, "x", TU_F32, 2, s);
  jit_value d = jit_sub(g, x, jit_reduce_mean(g, x, 1, 1));
  jit_value var = jit_reduce_mean(g, jit_mul(g, d, d), 1, 1);
  jit_output(g, jit_mul(g, d, jit_rsqrt(g, jit_add(g, var, jit_scalar(g, 1e-5, TU_F32)))));
  TU_OK(jit_graph_finalize(g));
  float *xv = tu_malloc(sizeof(float) * (size_t)n), *want = tu_malloc(sizeof(float) * (size_t)n);
  ref_rng rng;
  ref_rng_seed(&rng, (uint64_t)n + 3);
  ref_rng_fill_signed(&rng, xv, n);
  for (int64_t i = 0; i < M; i++) {
    double mean = 0, var2 = 0;
    for (int64_t j = 0; j < N; j++) mean += xv[i * N + j];
    mean /= (double)N;
    for (int64_t j = 0; j < N; j++) var2 += (xv[i * N + j] - mean) * (xv[i * N + j] - mean);
    var2 /= (double)N;
    for (int64_t j = 0; j < N; j++)
      want[i * N + j] = (float)((xv[i * N + j] - mean) / sqrt(var2 + 1e-5));
  }
  DLTensor in = tu_tensor(xv, TU_F32, 2, s);
  char what[64];
  snprintf(what, sizeof what, "layernorm %lldx%lld threads=%d", (long long)M, (long long)N,
           threads);
  tu_run_check(g, &in, 1, TU_F32, 2, s, want, 1e-4, 1e-5, NULL, what);
  cr_expect(!dump_has("-04-bufferized.mlir", "memref.alloc("), "%s: a heap intermediate",
            what);
  if (N >= 64)
    cr_expect(dump_has("-07-llvm-optimized.ll", "fadd reassoc <"),
              "%s: row sums not vectorized", what);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
  dump_end();
  free(xv);
  free(want);
}

Test(row_paths, layernorm_one_row_loop) {
  check_layernorm(1, 1, 1);
  check_layernorm(3, 37, 1);
  check_layernorm(97, 1000, 1);
  check_layernorm(64, 768, 2);
  check_layernorm(5, 3001, 2);  // rows up to 4000 floats on the stack (softmax_rows)
}

// A transformer encoder block through the graph API (projections with W stored K x N
// or as a transposed N x K input, heads split by reshape + transpose, softmax, two
// layernorms, a gelu MLP) against plain C. Every projection and MLP matmul is planned
// as one (the head reshapes next to them are views: collapse/expand_shape there made
// the fusion pass turn the matmuls into generics of more loops), q, k and v's equal
// zero fills each fuse into their own matmul, and the result is exact at 1 and 2
// threads.
typedef struct blk_dims { int64_t S, D, H, F; } blk_dims;

static void ref_layernorm_rows(float *x, int64_t M, int64_t N) {
  for (int64_t i = 0; i < M; i++) {
    double mean = 0, var = 0;
    for (int64_t j = 0; j < N; j++) mean += x[i * N + j];
    mean /= (double)N;
    for (int64_t j = 0; j < N; j++) var += (x[i * N + j] - mean) * (x[i * N + j] - mean);
    var /= (double)N;
    for (int64_t j = 0; j < N; j++)
      x[i * N + j] = (float)((x[i * N + j] - mean) / sqrt(var + 1e-5));
  }
}

static jit_value g_layernorm(jit_graph *g, jit_value x) {
  jit_value d = jit_sub(g, x, jit_reduce_mean(g, x, 1, 1));
  jit_value v = jit_reduce_mean(g, jit_mul(g, d, d), 1, 1);
  return jit_mul(g, d, jit_rsqrt(g, jit_add(g, v, jit_scalar(g, 1e-5, TU_F32))));
}

// x (rows x K) W + b into y, W given K x N, or N x K when `wt`.
static void ref_linear(const float *x, int64_t rows, int64_t K, const float *w, int64_t N,
                       bool wt, const float *b, float *y) {
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < N; j++) {
      double acc = b[j];
      for (int64_t k = 0; k < K; k++) acc += (double)x[i * K + k] * w[wt ? j * K + k : k * N + j];
      y[i * N + j] = (float)acc;
    }
}

static void check_block(blk_dims bd, int threads, bool wt) {
  int64_t S = bd.S, D = bd.D, H = bd.H, Dh = D / H, F = bd.F;
  dump_begin();
  jit_context *ctx = ctx_threads(threads);
  jit_graph *g = tu_graph(ctx, "block");
  static const int p10[2] = {1, 0}, p102[3] = {1, 0, 2}, p120[3] = {1, 2, 0};
  // Weights: names w0..w5 (q, k, v, o, mlp up, mlp down), biases b0..b5.
  int64_t kin[6] = {D, D, D, D, D, F}, nout[6] = {D, D, D, D, F, D};
  float *wv[6], *bv[6];
  jit_value wg[6], bg[6];
  ref_rng rng;
  ref_rng_seed(&rng, (uint64_t)(S * 131 + D + threads + wt));
  for (int i = 0; i < 6; i++) {
    int64_t sw[2] = {wt ? nout[i] : kin[i], wt ? kin[i] : nout[i]}, sb[1] = {nout[i]};
    char name[8];
    snprintf(name, sizeof name, "w%d", i);
    wv[i] = tu_malloc(sizeof(float) * (size_t)(kin[i] * nout[i]));
    ref_rng_fill(&rng, wv[i], kin[i] * nout[i], -0.2f, 0.2f);
    wg[i] = jit_input(g, name, TU_F32, 2, sw);
    if (wt) wg[i] = jit_transpose(g, wg[i], p10);
    snprintf(name, sizeof name, "b%d", i);
    bv[i] = tu_malloc(sizeof(float) * (size_t)nout[i]);
    ref_rng_fill_signed(&rng, bv[i], nout[i]);
    bg[i] = jit_input(g, name, TU_F32, 1, sb);
  }
  int64_t sx[2] = {S, D}, sh[3] = {S, H, Dh};
  jit_value x = jit_input(g, "x", TU_F32, 2, sx);
  jit_value q = jit_add(g, jit_matmul(g, x, wg[0]), bg[0]);
  jit_value k = jit_add(g, jit_matmul(g, x, wg[1]), bg[1]);
  jit_value v = jit_add(g, jit_matmul(g, x, wg[2]), bg[2]);
  q = jit_transpose(g, jit_reshape(g, q, 3, sh), p102);
  k = jit_transpose(g, jit_reshape(g, k, 3, sh), p120);
  v = jit_transpose(g, jit_reshape(g, v, 3, sh), p102);
  jit_value sc = jit_softmax(g, jit_mul(g, jit_matmul(g, q, k), jit_scalar(g, 0.25, TU_F32)), 2);
  jit_value at = jit_reshape(g, jit_transpose(g, jit_matmul(g, sc, v), p102), 2, sx);
  jit_value h = g_layernorm(g, jit_add(g, x, jit_add(g, jit_matmul(g, at, wg[3]), bg[3])));
  jit_value m = jit_gelu(g, jit_add(g, jit_matmul(g, h, wg[4]), bg[4]));
  jit_output(g, g_layernorm(g, jit_add(g, h, jit_add(g, jit_matmul(g, m, wg[5]), bg[5]))));
  TU_OK(jit_graph_finalize(g));

  // The reference, step by step.
  float *xv = tu_malloc(sizeof(float) * (size_t)(S * D));
  ref_rng_fill_signed(&rng, xv, S * D);
  float *qkv[3], *t1 = tu_malloc(sizeof(float) * (size_t)(S * D));
  for (int i = 0; i < 3; i++) {
    qkv[i] = tu_malloc(sizeof(float) * (size_t)(S * D));
    ref_linear(xv, S, D, wv[i], D, wt, bv[i], t1);
    static const int *perms[3] = {p102, p120, p102};
    int64_t dt_[3];
    ref_transpose(t1, 3, sh, perms[i], qkv[i], dt_);
  }
  int64_t dq[3] = {H, S, Dh}, dk[3] = {H, Dh, S}, dsc[3], dctx[3], dtr[3];
  float *scv = tu_malloc(sizeof(float) * (size_t)(H * S * S));
  float *smv = tu_malloc(sizeof(float) * (size_t)(H * S * S));
  ref_matmul(qkv[0], 3, dq, qkv[1], 3, dk, scv, dsc);
  for (int64_t i = 0; i < H * S * S; i++) scv[i] *= 0.25f;
  ref_softmax(scv, 3, dsc, 2, smv);
  float *ctxv = tu_malloc(sizeof(float) * (size_t)(S * D));
  ref_matmul(smv, 3, dsc, qkv[2], 3, dq, ctxv, dctx);
  ref_transpose(ctxv, 3, dctx, p102, t1, dtr);
  float *hv = tu_malloc(sizeof(float) * (size_t)(S * D));
  ref_linear(t1, S, D, wv[3], D, wt, bv[3], hv);
  for (int64_t i = 0; i < S * D; i++) hv[i] += xv[i];
  ref_layernorm_rows(hv, S, D);
  float *mv = tu_malloc(sizeof(float) * (size_t)(S * F));
  ref_linear(hv, S, D, wv[4], F, wt, bv[4], mv);
  for (int64_t i = 0; i < S * F; i++) mv[i] = gelu_ref(mv[i]);
  float *want = tu_malloc(sizeof(float) * (size_t)(S * D));
  ref_linear(mv, S, F, wv[5], D, wt, bv[5], want);
  for (int64_t i = 0; i < S * D; i++) want[i] += hv[i];
  ref_layernorm_rows(want, S, D);

  // Inputs in the graph's order (by name).
  DLTensor ins[13];
  int n_in = 0;
  jit_input_info info;
  jit_status past_end;
  while ((past_end = jit_graph_input_info(g, n_in, &info)) == NULL) {
    cr_assert(n_in < 13);
    char name[8];
    float *data = NULL;
    for (int i = 0; i < 6 && !data; i++) {
      snprintf(name, sizeof name, "w%d", i);
      if (!strcmp(info.name, name)) data = wv[i];
      snprintf(name, sizeof name, "b%d", i);
      if (!strcmp(info.name, name)) data = bv[i];
    }
    if (!strcmp(info.name, "x")) data = xv;
    cr_assert(data, "unexpected input %s", info.name);
    int64_t *dims = tu_malloc(sizeof(int64_t) * (size_t)info.rank);
    memcpy(dims, info.dims, sizeof(int64_t) * (size_t)info.rank);
    ins[n_in++] = tu_tensor(data, TU_F32, info.rank, dims);
  }
  jit_status_free(past_end);  // the index past the last input
  char what[96];
  snprintf(what, sizeof what, "block S=%lld D=%lld H=%lld F=%lld threads=%d %s", (long long)S,
           (long long)D, (long long)H, (long long)F, threads, wt ? "W^T" : "W");
  tu_run_check(g, ins, n_in, TU_F32, 2, sx, want, 1e-4, 1e-4, NULL, what);
  char needle[64];
  snprintf(needle, sizeof needle, "%lldx%lldx%lld", (long long)S, (long long)D, (long long)D);
  cr_expect(script_has(needle), "%s: the projections are not planned matmuls", what);
  cr_expect(!dump_has("-02-fused.mlir", "\"reduction\", \"reduction\""),
            "%s: a matmul became a generic of two reduction loops", what);
  for (int i = 0; i < n_in; i++) free(ins[i].shape);
  for (int i = 0; i < 6; i++) {
    free(wv[i]);
    free(bv[i]);
  }
  for (int i = 0; i < 3; i++) free(qkv[i]);
  free(t1);
  free(xv);
  free(scv);
  free(smv);
  free(ctxv);
  free(hv);
  free(mv);
  free(want);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
  dump_end();
}

// A reshape right after a matmul (heads split straight from x W) is a view: the matmul
// stays a linalg.matmul (the fusion pass had made it a generic of more loops when
// nothing after the reshape was a matmul), and the result is exact.
Test(row_paths, reshape_after_matmul_keeps_it) {
  int64_t sx[2] = {37, 96}, sw[2] = {96, 80}, sh[3] = {37, 5, 16}, dc[2];
  dump_begin();
  jit_context *ctx = ctx_threads(1);
  jit_graph *g = tu_graph(ctx, "reshape_mm");
  jit_value a = jit_input(g, "a", TU_F32, 2, sx);  // inputs in this order
  jit_value b = jit_input(g, "b", TU_F32, 2, sw);
  jit_value h = jit_reshape(g, jit_matmul(g, a, b), 3, sh);
  jit_output(g, jit_add(g, h, jit_scalar(g, 1.0, TU_F32)));
  TU_OK(jit_graph_finalize(g));
  float *x = tu_malloc(sizeof(float) * 37 * 96), *w = tu_malloc(sizeof(float) * 96 * 80);
  float *want = tu_malloc(sizeof(float) * 37 * 80);
  ref_rng rng;
  ref_rng_seed(&rng, 11);
  ref_rng_fill_signed(&rng, x, 37 * 96);
  ref_rng_fill_signed(&rng, w, 96 * 80);
  ref_matmul(x, 2, sx, w, 2, sw, want, dc);
  for (int i = 0; i < 37 * 80; i++) want[i] += 1.0f;
  DLTensor ins[2] = {tu_tensor(x, TU_F32, 2, sx), tu_tensor(w, TU_F32, 2, sw)};
  tu_run_check(g, ins, 2, TU_F32, 3, sh, want, 1e-5, 1e-4, NULL, "reshape after matmul");
  cr_expect(!dump_has("-02-fused.mlir", "\"reduction\"]"),
            "the matmul before a reshape became a generic");
  free(x);
  free(w);
  free(want);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
  dump_end();
}

Test(row_paths, transformer_block) {
  check_block((blk_dims){7, 48, 3, 96}, 1, false);
  check_block((blk_dims){7, 48, 3, 96}, 2, true);
  check_block((blk_dims){33, 128, 2, 200}, 2, false);  // odd F: its matmuls split at N
  check_block((blk_dims){64, 256, 4, 512}, 2, true);   // B packed from W^T
  check_block((blk_dims){64, 256, 4, 512}, 1, false);
  check_block((blk_dims){1, 256, 4, 512}, 2, true);  // projections as dot products
  check_block((blk_dims){3, 256, 2, 768}, 1, true);  // the last one only (K = 768)
}

// A kernel's large intermediates (here y = relu(LN(LN(x) W1)) W2: LN(x) and its
// matmul's result, 512 KiB each, made before the matmuls that read them) are freed into
// the calling thread's cache and reused by its next call (devices/cpu/cpu.c), where
// glibc returned the top of its heap on each call and the next one first-touched the
// pages again (~250 page faults a call). Reused blocks hold the last call's data, and
// the results stay the same; a thread's cached blocks are freed when it exits (the ASan
// run checks for leaks).
typedef struct reuse_run {
  jit_graph *g;
  DLTensor ins[3];
  float *out;
  const float *first;  // the first call's output, or NULL
  long faults;         // minor page faults over the last calls
  bool same;
} reuse_run;

static long minor_faults(void) {
  struct rusage ru;
  getrusage(RUSAGE_THREAD, &ru);
  return ru.ru_minflt;
}

static void *reuse_calls(void *arg) {
  reuse_run *r = arg;
  int64_t so[2] = {256, 512};
  DLTensor out = tu_tensor(r->out, TU_F32, 2, so);
  for (int i = 0; i < 2; i++) TU_OK(jit_run(r->g, r->ins, 3, &out, 1));
  long before = minor_faults();
  for (int i = 0; i < 5; i++) TU_OK(jit_run(r->g, r->ins, 3, &out, 1));
  r->faults = minor_faults() - before;
  r->same = !r->first || memcmp(r->out, r->first, sizeof(float) * 256 * 512) == 0;
  return NULL;
}

Test(row_paths, intermediates_reused_across_calls) {
  int64_t sx[2] = {256, 512}, sw[2] = {512, 512};
  jit_context *ctx = ctx_threads(1);
  jit_graph *g = tu_graph(ctx, "reuse");
  jit_value x = jit_input(g, "a", TU_F32, 2, sx);
  jit_value y = jit_matmul(g, g_layernorm(g, x), jit_input(g, "b", TU_F32, 2, sw));
  y = jit_matmul(g, jit_relu(g, g_layernorm(g, y)), jit_input(g, "c", TU_F32, 2, sw));
  jit_output(g, y);
  TU_OK(jit_graph_finalize(g));
  float *v[3], *first = tu_malloc(sizeof(float) * 256 * 512);
  ref_rng rng;
  ref_rng_seed(&rng, 5);
  for (int i = 0; i < 3; i++) {  // x 256x512, W1 and W2 512x512
    int64_t n = (i ? 512 : 256) * 512;
    v[i] = tu_malloc(sizeof(float) * (size_t)n);
    ref_rng_fill_signed(&rng, v[i], n);
  }
  reuse_run r = {g, {tu_tensor(v[0], TU_F32, 2, sx), tu_tensor(v[1], TU_F32, 2, sw),
                     tu_tensor(v[2], TU_F32, 2, sw)}, first, NULL, 0, true};
  int64_t so[2] = {256, 512};
  DLTensor out = tu_tensor(first, TU_F32, 2, so);
  TU_OK(jit_run(g, r.ins, 3, &out, 1));  // compiles; fresh memory for every buffer
  r.out = tu_malloc(sizeof(float) * 256 * 512);
  r.first = first;
  reuse_calls(&r);
  cr_expect(r.same, "a call reusing buffers gave other results");
  // ASan's allocator has its own quarantine and page behaviour: counted without it.
  if (kThreadsSplit)
    cr_expect(r.faults < 40, "5 calls first-touched %ld pages", r.faults);
  for (int t = 0; t < 2; t++) {  // other threads, which exit with blocks cached
    pthread_t th;
    cr_assert(pthread_create(&th, NULL, reuse_calls, &r) == 0);
    pthread_join(th, NULL);
    cr_expect(r.same, "thread %d: other results", t);
  }
  for (int i = 0; i < 3; i++) free(v[i]);
  free(first);
  free(r.out);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// exp, tanh, sigmoid, gelu and softmax through the inline exp: accuracy over a wide
// range, and the special values.
Test(row_paths, inline_exp_accuracy_and_specials) {
  const int64_t n = 4099;
  float *x = tu_malloc(sizeof(float) * n), *want = tu_malloc(sizeof(float) * n);
  for (int64_t i = 0; i < n; i++) x[i] = -100.0f + 200.0f * (float)i / (float)(n - 1);
  x[0] = -INFINITY;
  x[1] = INFINITY;
  x[2] = NAN;
  x[3] = 0.0f;
  x[4] = 88.7f;
  x[5] = -87.0f;
  // Around the top of the range: exp overflows to +inf past ~88.7228 (the clamp at 89.5
  // and 2^n built in the exponent bits must get there without a select).
  static const float top[] = {88.72f, 88.7228f, 88.723f, 88.75f, 89.0f, 89.49f, 89.5f,
                              89.51f, 89.8f, 1e30f, -1e30f, -87.3f, -87.5f, -88.0f};
  for (size_t k = 0; k < sizeof top / sizeof *top; k++) x[6 + k] = top[k];
  int64_t s[1] = {n};
  jit_value (*const ops[])(jit_graph *, jit_value) = {jit_exp, jit_tanh, jit_sigmoid,
                                                      jit_gelu};
  for (int op = 0; op < 4; op++) {
    for (int64_t i = 0; i < n; i++) {
      double v = x[i];
      want[i] = op == 0 ? (float)exp(v) : op == 1 ? (float)tanh(v)
                : op == 2 ? (float)(1.0 / (1.0 + exp(-v))) : gelu_ref(v);
    }
    if (op == 3) {
      want[0] = NAN;  // -inf * (1 + tanh(-inf)) = -inf * 0
      want[1] = INFINITY;
    }
    jit_context *ctx = ctx_threads(1);
    jit_graph *g = tu_graph(ctx, "unary");
    jit_output(g, ops[op](g, jit_input(g, "x", TU_F32, 1, s)));
    TU_OK(jit_graph_finalize(g));
    DLTensor in = tu_tensor(x, TU_F32, 1, s);
    // Results below 1e-37 may flush to 0: the absolute tolerance covers them.
    tu_run_check(g, &in, 1, TU_F32, 1, s, want, 4e-6, 1e-6, NULL, "unary via exp");
    jit_graph_destroy(g);
    jit_context_destroy(ctx);
  }
  free(x);
  free(want);
}

Test(row_paths, softmax_rows) {
  // Row buffers on the stack up to 16 KiB (4000 floats), on the heap above (4099).
  static const int64_t shapes[][2] = {{1, 1},    {3, 37},   {64, 1024},
                                      {130, 77}, {2, 4000}, {3, 4099}};
  for (int t = 1; t <= 2; t++) {
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
      int64_t s[2] = {shapes[k][0], shapes[k][1]}, n = s[0] * s[1];
      float *x = tu_malloc(sizeof(float) * (size_t)n), *want = tu_malloc(sizeof(float) * (size_t)n);
      ref_rng rng;
      ref_rng_seed(&rng, (uint64_t)n);
      ref_rng_fill(&rng, x, n, -30.0f, 30.0f);
      ref_softmax(x, 2, s, 1, want);
      jit_context *ctx = ctx_threads(t);
      jit_graph *g = tu_graph(ctx, "softmax");
      jit_output(g, jit_softmax(g, jit_input(g, "x", TU_F32, 2, s), 1));
      TU_OK(jit_graph_finalize(g));
      DLTensor in = tu_tensor(x, TU_F32, 2, s);
      tu_run_check(g, &in, 1, TU_F32, 2, s, want, 1e-5, 1e-7, NULL, "softmax");
      jit_graph_destroy(g);
      jit_context_destroy(ctx);
      free(x);
      free(want);
    }
  }
}

// Rows with special values, whose max is taken without NaN checks (a NaN still turns
// its row all NaN, through the exp and the sum, as in the reference): a NaN early in
// the row and one in its last partial vector, -inf entries (masked attention), a row
// all -inf (NaN: -inf - -inf), a +inf entry, +-1e30, and an ordinary row after them.
Test(row_paths, softmax_special_rows) {
  static const int64_t widths[] = {37, 1031};
  enum { kRows = 8 };
  for (size_t k = 0; k < sizeof widths / sizeof *widths; k++) {
    int64_t c = widths[k], s[2] = {kRows, c}, n = kRows * c;
    float *x = tu_malloc(sizeof(float) * (size_t)n), *want = tu_malloc(sizeof(float) * (size_t)n);
    ref_rng rng;
    ref_rng_seed(&rng, (uint64_t)n);
    ref_rng_fill(&rng, x, n, -10.0f, 10.0f);
    x[0 * c + 3] = NAN;
    x[1 * c + c - 2] = NAN;
    for (int64_t j = 0; j < c; j += 3) x[2 * c + j] = -INFINITY;
    for (int64_t j = 0; j < c; j++) x[3 * c + j] = -INFINITY;
    x[4 * c + c / 2] = INFINITY;
    x[5 * c + 1] = 1e30f;
    x[6 * c + c - 1] = -1e30f;
    ref_softmax(x, 2, s, 1, want);
    cr_assert(isnan(want[0]) && isnan(want[c]) && isnan(want[3 * c]) && !isnan(want[2 * c + 1]));
    for (int t = 1; t <= 2; t++) {
      jit_context *ctx = ctx_threads(t);
      jit_graph *g = tu_graph(ctx, "softmax");
      jit_output(g, jit_softmax(g, jit_input(g, "x", TU_F32, 2, s), 1));
      TU_OK(jit_graph_finalize(g));
      DLTensor in = tu_tensor(x, TU_F32, 2, s);
      tu_run_check(g, &in, 1, TU_F32, 2, s, want, 1e-5, 1e-7, NULL, "softmax, special rows");
      jit_graph_destroy(g);
      jit_context_destroy(ctx);
    }
    free(x);
    free(want);
  }
}

// Rows split across threads: each thread runs whole row loops (max, exp, sum and the
// division fused), with no full-size intermediate on the heap, and the result does
// not depend on the thread count (every row is reduced by one thread, in one order).
Test(row_paths, softmax_rows_split_across_threads) {
  static const int64_t shapes[][3] = {{64, 1024, 0}, {16, 3001, 0}, {4, 9, 1031}};
  for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
    int rank = shapes[k][2] ? 3 : 2;
    int64_t s[3] = {shapes[k][0], shapes[k][1], shapes[k][2]};
    int64_t n = s[0] * s[1] * (rank == 3 ? s[2] : 1);
    float *x = tu_malloc(sizeof(float) * (size_t)n), *want = tu_malloc(sizeof(float) * (size_t)n);
    float *got[2] = {tu_malloc(sizeof(float) * (size_t)n), tu_malloc(sizeof(float) * (size_t)n)};
    ref_rng rng;
    ref_rng_seed(&rng, (uint64_t)n + 7);
    ref_rng_fill(&rng, x, n, -30.0f, 30.0f);
    ref_softmax(x, rank, s, rank - 1, want);
    for (int t = 1; t <= 2; t++) {
      dump_begin();
      jit_context *ctx = ctx_threads(t);
      jit_graph *g = tu_graph(ctx, "softmax");
      jit_output(g, jit_softmax(g, jit_input(g, "x", TU_F32, rank, s), rank - 1));
      TU_OK(jit_graph_finalize(g));
      DLTensor in = tu_tensor(x, TU_F32, rank, s);
      DLTensor out = tu_tensor(got[t - 1], TU_F32, rank, s);
      TU_OK(jit_run(g, &in, 1, &out, 1));
      tu_assert_close(got[t - 1], want, n, 1e-5, 1e-7, rank, s, "softmax");
      if (t == 2 && kThreadsSplit)
        cr_expect(dump_has("-04-bufferized.mlir", "scf.forall"),
                  "softmax %lldx%lld: rows not split across threads", (long long)s[0],
                  (long long)s[1]);
      cr_expect(!dump_has("-04-bufferized.mlir", "memref.alloc("),
                "softmax %lldx%lld threads=%d: a heap intermediate is left",
                (long long)s[0], (long long)s[1], t);
      jit_graph_destroy(g);
      jit_context_destroy(ctx);
      dump_end();
    }
    cr_expect(memcmp(got[0], got[1], sizeof(float) * (size_t)n) == 0,
              "softmax %lldx%lld: 1 and 2 threads differ", (long long)s[0], (long long)s[1]);
    free(x);
    free(want);
    free(got[0]);
    free(got[1]);
  }
}

// Whether the kernel's streaming stores have a whole-vector version (32- or 64-byte
// aligned, by the vector width) for outputs that are aligned at run time.
static bool has_aligned_stream(void) {
  return dump_has("-07-llvm-optimized.ll", "align 32, !nontemporal") ||
         dump_has("-07-llvm-optimized.ll", "align 64, !nontemporal");
}

// A 64-byte aligned buffer of n floats and 16 more, so that it can also be used 4 bytes
// in (a misaligned output).
static float *alloc_out(int64_t n) {
  float *p = aligned_alloc(64, sizeof(float) * (size_t)(n + 16) / 64 * 64 + 64);
  cr_assert(p != NULL, "out of memory");
  return p;
}

// Whether the LLVM basic block (blank-line delimited in the printed IR) holding the
// first `anchor` in the optimized IR also holds `needle`, and not `absent`.
static bool ll_block_has(const char *anchor, const char *needle, const char *absent) {
  const char *text = dump_text("-07-llvm-optimized.ll", 0), *at;
  if (!text || !(at = strstr(text, anchor))) return false;
  const char *start = at, *end = strstr(at, "\n\n");
  while (start > text && !(start[-1] == '\n' && start - 1 > text && start[-2] == '\n')) start--;
  if (!end) end = at + strlen(at);
  size_t len = (size_t)(end - start);
  char *block = malloc(len + 1);
  cr_assert(block);
  memcpy(block, start, len);
  block[len] = 0;
  bool ok = strstr(block, needle) && !strstr(block, absent);
  free(block);
  return ok;
}

// Large outputs written once go straight to memory (non-temporal stores, fenced; whole
// vectors where an address is aligned at run time, 8 bytes at a time where not), and a
// large row loop prefetches its next row; small ones keep plain stores, so the next
// kernel still finds them in the cache. Exact against the reference either way, at 1
// and 2 threads, into an aligned and a misaligned output, with rows that are not a
// whole number of vectors (so the aligned output's rows start at every alignment).
static void check_softmax_streams(int64_t rows, int64_t cols, bool streams) {
  int64_t s[2] = {rows, cols}, n = rows * cols;
  float *x = tu_malloc(sizeof(float) * (size_t)n), *want = tu_malloc(sizeof(float) * (size_t)n);
  float *out_buf = alloc_out(n);
  ref_rng rng;
  ref_rng_seed(&rng, (uint64_t)n);
  ref_rng_fill(&rng, x, n, -30.0f, 30.0f);
  ref_softmax(x, 2, s, 1, want);
  for (int t = 1; t <= 2; t++) {
    dump_begin();
    jit_context *ctx = ctx_threads(t);
    jit_graph *g = tu_graph(ctx, "softmax");
    jit_output(g, jit_softmax(g, jit_input(g, "x", TU_F32, 2, s), 1));
    TU_OK(jit_graph_finalize(g));
    DLTensor in = tu_tensor(x, TU_F32, 2, s);
    for (int off = 0; off <= 1; off++) {
      float *got = out_buf + off;
      DLTensor out = tu_tensor(got, TU_F32, 2, s);
      memset(got, 0, sizeof(float) * (size_t)n);
      TU_OK(jit_run(g, &in, 1, &out, 1));
      tu_assert_close(got, want, n, 1e-5, 1e-7, 2, s, off ? "softmax, misaligned" : "softmax");
    }
    cr_expect(has_aligned_stream() == streams,
              "softmax %lldx%lld threads=%d: no whole-vector version of the stores",
              (long long)rows, (long long)cols, t);
    cr_expect(dump_has("-07-llvm-optimized.ll", "!nontemporal") == streams,
              "softmax %lldx%lld threads=%d: stores %sstreamed", (long long)rows,
              (long long)cols, t, streams ? "not " : "");
    cr_expect(dump_has("-07-llvm-optimized.ll", "@llvm.prefetch") == streams,
              "softmax %lldx%lld threads=%d: next row %sprefetched", (long long)rows,
              (long long)cols, t, streams ? "not " : "");
    // From the row's second pass, its exp (which multiplies), not from its max.
    if (streams)
      cr_expect(ll_block_has("call void @llvm.prefetch", " fmul ", "@llvm.maxnum"),
                "softmax %lldx%lld threads=%d: next row not prefetched from the exp pass",
                (long long)rows, (long long)cols, t);
    jit_graph_destroy(g);
    jit_context_destroy(ctx);
    dump_end();
  }
  free(x);
  free(want);
  free(out_buf);
}

Test(row_paths, large_softmax_streams_small_does_not) {
  check_softmax_streams(2054, 1031, true);  // 8.08 MiB out
  check_softmax_streams(64, 1024, false);
}

// On AVX-512 hosts the loops LLVM vectorizes itself (row and elementwise kernels) take
// 16 lanes, not the 8 of LLVM's tuning for those cores; matmul kernels are left alone.
Test(row_paths, row_kernels_take_512_bit_vectors_on_avx512) {
  bool wide = host_avx512();
  int64_t s[2] = {37, 1000};
  dump_begin();
  jit_context *ctx = ctx_threads(1);
  jit_graph *g = tu_graph(ctx, "softmax");
  jit_output(g, jit_softmax(g, jit_input(g, "x", TU_F32, 2, s), 1));
  TU_OK(jit_graph_finalize(g));
  float *x = tu_malloc(sizeof(float) * 37 * 1000), *want = tu_malloc(sizeof(float) * 37 * 1000);
  ref_rng rng;
  ref_rng_seed(&rng, 7);
  ref_rng_fill(&rng, x, 37 * 1000, -30.0f, 30.0f);
  ref_softmax(x, 2, s, 1, want);
  DLTensor in = tu_tensor(x, TU_F32, 2, s);
  tu_run_check(g, &in, 1, TU_F32, 2, s, want, 1e-5, 1e-7, NULL, "softmax 37x1000");
  cr_expect(dump_has("-07-llvm-optimized.ll", "\"prefer-vector-width\"=\"512\"") == wide,
            "softmax: 512-bit vectors %spreferred", wide ? "not " : "");
  cr_expect(dump_has("-07-llvm-optimized.ll", "<16 x float>") == wide,
            "softmax: %s16-lane vectors", wide ? "no " : "");
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
  dump_end();
  free(x);
  free(want);
  dump_begin();
  check_dense(64, 128, 96, 1, TU_F32, 1, 2);
  cr_expect(!dump_has("-07-llvm-optimized.ll", "prefer-vector-width"),
            "gelu(xW+b): the vector width preference set on a matmul kernel");
  dump_end();
}

// A warning that names the variable `needle`, kept for a test.
typedef struct warning_about {
  const char *needle;
  char text[512];
} warning_about;

static void keep_warning(void *user, jit_log_level level, const char *message) {
  warning_about *w = user;
  if (level == JIT_LOG_WARNING && strstr(message, w->needle))
    snprintf(w->text, sizeof w->text, "%s", message);
}

// A context whose warnings about `w->needle` go to w->text.
static jit_context *ctx_warned(warning_about *w) {
  w->text[0] = 0;
  return ctx_logged(1, keep_warning, w, JIT_LOG_WARNING);
}

// JITML_CPU_FEATURES items that turn nothing off (a name LLVM does not know, a "+")
// are named in a warning, not passed on; the kernels still compile and run.
Test(row_paths, cpu_features_items_that_drop_nothing_are_reported) {
  setenv("JITML_CPU_FEATURES", "-nosuchfeature,+avx512f", 1);  // before the first use
  warning_about w = {"JITML_CPU_FEATURES", ""};
  jit_context *ctx = ctx_warned(&w);
  cr_expect(strstr(w.text, "-nosuchfeature,+avx512f") != NULL, "warning: `%s`", w.text);
  jit_context_destroy(ctx);
  check_dense(17, 100, 31, 1, TU_F32, 1, 2);
}

// A JITML_CPU_L2 that is no size (a unit it does not know, under 16 KiB, past 1 GiB)
// is named in a warning and ignored; the kernels still compile and run.
Test(row_paths, cpu_l2_that_is_no_size_is_reported) {
  const char *bad[] = {"2X", "8K", "4096M", "-1M", "M", "512KB"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    // Each context reads the host once per process: a child per value.
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
      setenv("JITML_CPU_L2", bad[i], 1);
      warning_about w = {"JITML_CPU_L2", ""};
      jit_context *ctx = ctx_warned(&w);
      char quoted[64];
      snprintf(quoted, sizeof quoted, "`%s`", bad[i]);
      bool named = strstr(w.text, quoted) != NULL;
      jit_context_destroy(ctx);
      _exit(named ? 0 : 1);
    }
    int status = 0;
    cr_assert(waitpid(pid, &status, 0) == pid);
    cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "JITML_CPU_L2=%s: no warning naming it", bad[i]);
  }
  setenv("JITML_CPU_L2", "lots", 1);
  warning_about w = {"JITML_CPU_L2", ""};
  jit_context *ctx = ctx_warned(&w);
  cr_expect(strstr(w.text, "`lots`") != NULL, "warning: `%s`", w.text);
  jit_context_destroy(ctx);
  check_dense(17, 100, 31, 1, TU_F32, 1, 2);
}

// JITML_CPU_L3 takes the same sizes: another is named in a warning and ignored.
Test(row_paths, cpu_l3_that_is_no_size_is_reported) {
  setenv("JITML_CPU_L3", "480MB", 1);  // this test's own process reads the host once
  warning_about w = {"JITML_CPU_L3", ""};
  jit_context *ctx = ctx_warned(&w);
  cr_expect(strstr(w.text, "`480MB`") != NULL, "warning: `%s`", w.text);
  jit_context_destroy(ctx);
  check_dense(17, 100, 31, 1, TU_F32, 1, 2);
}

// relu(a * b + c) over 2^21 + 17 floats (8 MiB and a bit, a prime count): streamed,
// exact into an aligned and a misaligned output, and the same at 1 and 2 threads.
Test(row_paths, large_elementwise_chain_streams) {
  int64_t n = (1 << 21) + 17, s[1] = {n};
  float *a = tu_malloc(sizeof(float) * (size_t)n), *b = tu_malloc(sizeof(float) * (size_t)n);
  float *c = tu_malloc(sizeof(float) * (size_t)n), *want = tu_malloc(sizeof(float) * (size_t)n);
  float *out_buf = alloc_out(n);
  ref_rng rng;
  ref_rng_seed(&rng, 99);
  ref_rng_fill_signed(&rng, a, n);
  ref_rng_fill_signed(&rng, b, n);
  ref_rng_fill_signed(&rng, c, n);
  for (int64_t i = 0; i < n; i++) {
    float v = a[i] * b[i] + c[i];
    want[i] = v > 0.0f ? v : 0.0f;
  }
  for (int t = 1; t <= 2; t++) {
    dump_begin();
    jit_context *ctx = ctx_threads(t);
    jit_graph *g = tu_graph(ctx, "chain");
    jit_value va = jit_input(g, "a", TU_F32, 1, s);
    jit_value vb = jit_input(g, "b", TU_F32, 1, s);
    jit_value vc = jit_input(g, "c", TU_F32, 1, s);
    jit_output(g, jit_relu(g, jit_add(g, jit_mul(g, va, vb), vc)));
    TU_OK(jit_graph_finalize(g));
    DLTensor in[3] = {tu_tensor(a, TU_F32, 1, s), tu_tensor(b, TU_F32, 1, s),
                      tu_tensor(c, TU_F32, 1, s)};
    for (int off = 0; off <= 1; off++) {
      float *got = out_buf + off;
      DLTensor out = tu_tensor(got, TU_F32, 1, s);
      memset(got, 0, sizeof(float) * (size_t)n);
      TU_OK(jit_run(g, in, 3, &out, 1));
      tu_assert_close(got, want, n, 1e-6, 1e-7, 1, s,
                      off ? "relu(a*b+c), misaligned" : "relu(a*b+c)");
    }
    cr_expect(has_aligned_stream(),
              "relu(a*b+c) threads=%d: no whole-vector version of the stores", t);
    cr_expect(dump_has("-07-llvm-optimized.ll", "!nontemporal"),
              "relu(a*b+c) threads=%d: stores not streamed", t);
    jit_graph_destroy(g);
    jit_context_destroy(ctx);
    dump_end();
  }
  free(a);
  free(b);
  free(c);
  free(want);
  free(out_buf);
}

// Softmax's row max ignores NaN (arith.maxnumf), but a row holding a
// NaN still comes out all NaN through its exp and sum, as with a NaN-propagating max;
// -inf entries become 0 and the rest of their row is unaffected. 1 and 2 threads.
Test(row_paths, softmax_nan_and_inf_rows) {
  enum { R = 6, C = 37 };
  int64_t s[2] = {R, C};
  float x[R * C], got[R * C], want[R * C];
  ref_rng rng;
  ref_rng_seed(&rng, 5);
  ref_rng_fill(&rng, x, R * C, -5.0f, 5.0f);
  x[0 * C + 3] = NAN;       // row 0: one NaN
  x[1 * C + 36] = NAN;      // row 1: NaN in the last (remainder) lane
  x[2 * C + 0] = -INFINITY; // row 2: some -inf
  x[2 * C + 20] = -INFINITY;
  for (int j = 0; j < C; j++) x[3 * C + j] = NAN;  // row 3: all NaN
  ref_softmax(x, 2, s, 1, want);
  for (int t = 1; t <= 2; t++) {
    jit_context *ctx = ctx_threads(t);
    jit_graph *g = tu_graph(ctx, "softmax");
    jit_output(g, jit_softmax(g, jit_input(g, "x", TU_F32, 2, s), 1));
    TU_OK(jit_graph_finalize(g));
    DLTensor in = tu_tensor(x, TU_F32, 2, s), out = tu_tensor(got, TU_F32, 2, s);
    TU_OK(jit_run(g, &in, 1, &out, 1));
    for (int i = 0; i < R; i++)
      for (int j = 0; j < C; j++) {
        float v = got[i * C + j];
        if (i == 0 || i == 1 || i == 3) {
          cr_expect(isnan(v), "threads=%d: row %d col %d is %g, not NaN", t, i, j, (double)v);
        } else {
          cr_expect(fabsf(v - want[i * C + j]) <= 1e-6f + 1e-5f * fabsf(want[i * C + j]),
                    "threads=%d: row %d col %d is %g, want %g", t, i, j, (double)v,
                    (double)want[i * C + j]);
        }
      }
    cr_expect(got[2 * C + 0] == 0.0f && got[2 * C + 20] == 0.0f, "exp(-inf) is not 0");
    jit_graph_destroy(g);
    jit_context_destroy(ctx);
  }
}

//===--- LLVM pipeline choice ---------------------------------------------===//

static void keep_compile_line(void *user, jit_log_level level, const char *message) {
  (void)level;
  if (strstr(message, "compiled in")) snprintf(user, 512, "%s", message);
}

// Kernels that MLIR vectorized whole (a fill may be left: a store loop) take the light
// LLVM pipeline; kernels with loops left to LLVM's vectorizers (softmax's row
// reductions) take it with their loops rotated first (they took O2 before, ~2.5x the
// pass time). A fill's linalg.yield once sent every matmul down the second.
Test(row_paths, llvm_pipeline_choice) {
  char line[512];
  jit_context *ctx = ctx_logged(1, keep_compile_line, line, JIT_LOG_DEBUG);

  int64_t sa[2] = {37, 300}, sb[2] = {300, 288}, so[2] = {37, 288};
  float *a = tu_malloc(sizeof(float) * 37 * 300), *b = tu_malloc(sizeof(float) * 300 * 288);
  float *got = tu_malloc(sizeof(float) * 37 * 288), *want = tu_malloc(sizeof(float) * 37 * 288);
  ref_rng rng;
  ref_rng_seed(&rng, 17);
  ref_rng_fill_signed(&rng, a, 37 * 300);
  ref_rng_fill_signed(&rng, b, 300 * 288);
  int64_t dc[2];
  cr_assert_eq(ref_matmul(a, 2, sa, b, 2, sb, want, dc), 2);
  jit_graph *g = tu_graph(ctx, "matmul");
  jit_value va = jit_input(g, "a", TU_F32, 2, sa);
  jit_output(g, jit_matmul(g, va, jit_input(g, "b", TU_F32, 2, sb)));
  TU_OK(jit_graph_finalize(g));
  DLTensor in[2] = {tu_tensor(a, TU_F32, 2, sa), tu_tensor(b, TU_F32, 2, sb)};
  DLTensor out = tu_tensor(got, TU_F32, 2, so);
  line[0] = 0;
  TU_OK(jit_run(g, in, 2, &out, 1));
  tu_assert_close(got, want, 37 * 288, 1e-4, 1e-5, 2, so, "matmul");
  cr_expect(strstr(line, "LLVM IR + light passes") != NULL, "matmul: %s", line);
  jit_graph_destroy(g);

  int64_t ss[2] = {64, 100};
  float *x = tu_malloc(sizeof(float) * 6400), *sm = tu_malloc(sizeof(float) * 6400);
  float *sm_want = tu_malloc(sizeof(float) * 6400);
  ref_rng_fill(&rng, x, 6400, -5.0f, 5.0f);
  ref_softmax(x, 2, ss, 1, sm_want);
  g = tu_graph(ctx, "softmax");
  jit_output(g, jit_softmax(g, jit_input(g, "x", TU_F32, 2, ss), 1));
  TU_OK(jit_graph_finalize(g));
  DLTensor xin = tu_tensor(x, TU_F32, 2, ss), xout = tu_tensor(sm, TU_F32, 2, ss);
  line[0] = 0;
  TU_OK(jit_run(g, &xin, 1, &xout, 1));
  tu_assert_close(sm, sm_want, 6400, 1e-5, 1e-7, 2, ss, "softmax");
  cr_expect(strstr(line, "LLVM IR + light + rotate passes") != NULL, "softmax: %s", line);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
  free(a);
  free(b);
  free(got);
  free(want);
  free(x);
  free(sm);
  free(sm_want);
}
