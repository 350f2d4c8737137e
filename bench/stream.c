//===--- stream.c - a serving workload: one graph, many batch sizes --------===//
//
// jitml_stream runs a stream of calls whose symbolic dim takes many values, as a
// serving process sees them, under each shape policy (EXACT, GENERIC, AUTO) in one
// run, each in a fresh context with the disk cache off (every kernel is made in the
// run). Per policy it prints the total time, the time spent compiling, the p50 and
// p99 of the calls (p99 also without the first call, which waits for the generic
// kernel), and the steady state: the stream's hottest bindings run again once every
// background compile is done, as calls per second against EXACT's.
//
// Workloads: the 784-256-10 MLP of examples/mlp.c (batch N in 1..512), and a
// one-head transformer block (d = 256, FFN 1024) with symbolic sequence length S in
// 1..512. Streams: 300 calls over 100 distinct values (each three times, shuffled),
// and 1,000 calls drawn Zipf-like (s = 1.1) from 100 values.
//
//   jitml_stream [--quick] [--only mlp|block] [--stream uniform|zipf] [--threads N]
//                [--device vulkan|cuda]   (runs go to that device: generic GPU kernels)
//   jitml_stream --kernels [--threads N]
//   jitml_stream --export DIR ...   (also writes the graphs and streams for stream_iree.py)
//
// --kernels: generic kernels against exact ones, shape by shape (the targets: >= 0.85x
// on large shapes, >= 0.7x on odd ones).
//
// --quick: 120 calls over 40 values, for a smoke run. bench/stream_iree.py runs the
// same streams through IREE for comparison.
//
//===----------------------------------------------------------------------===//
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "jitml.h"

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static bool ok(jit_status s, const char *what) {
  if (!s) return true;
  fprintf(stderr, "jitml_stream: %s: %s\n", what, jit_status_message(s));
  jit_status_free(s);
  return false;
}

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static double unit(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (double)(rng >> 11) / 9007199254740992.0;
}

static float *rand_array(size_t n, float scale) {
  float *p = malloc(n * sizeof *p + 64);
  for (size_t i = 0; p && i < n; i++) p[i] = (float)((unit() * 2 - 1) * scale);
  return p;
}

static DLTensor tensor(float *data, int ndim, int64_t *shape) {
  DLTensor t = {0};
  t.data = data;
  t.device = (DLDevice){kDLCPU, 0};
  t.ndim = ndim;
  t.dtype = (DLDataType){kDLFloat, 32, 1};
  t.shape = shape;
  return t;
}

//===--- Workloads -------------------------------------------------------===//

enum { kMaxInputs = 16, kMaxDim = 512 };

typedef struct workload {
  const char *name;
  const char *sym;  // the symbol's name
  jit_graph *(*build)(jit_context *ctx);
  int n_inputs;
  // Input i's shape for symbol value v (dims, rank).
  int (*shape)(int i, int64_t v, int64_t *dims);
  int64_t out_cols;  // output is [v, out_cols]
} workload;

static jit_graph *finalize(jit_graph *g) {
  if (!ok(jit_graph_finalize(g), "finalize")) exit(1);
  return g;
}

// The MLP of examples/mlp.c: softmax(gelu(x W1 + b1) W2 + b2).
static jit_graph *build_mlp(jit_context *ctx) {
  jit_graph *g = NULL;
  if (!ok(jit_graph_create(ctx, "mlp", &g), "graph")) exit(1);
  const DLDataType f32 = {kDLFloat, 32, 1};
  int64_t n = jit_symbol(g, "N");
  int64_t dx[2] = {n, 784}, dw1[2] = {784, 256}, db1[1] = {256}, dw2[2] = {256, 10},
          db2[1] = {10};
  jit_value x = jit_input(g, "x", f32, 2, dx);
  jit_value w1 = jit_input(g, "w1", f32, 2, dw1);
  jit_value b1 = jit_input(g, "b1", f32, 1, db1);
  jit_value w2 = jit_input(g, "w2", f32, 2, dw2);
  jit_value b2 = jit_input(g, "b2", f32, 1, db2);
  jit_value h = jit_gelu(g, jit_add(g, jit_matmul(g, x, w1), b1));
  jit_output(g, jit_softmax(g, jit_add(g, jit_matmul(g, h, w2), b2), -1));
  return finalize(g);
}

static int shape_mlp(int i, int64_t v, int64_t *d) {
  static const int64_t s[5][2] = {{0, 784}, {784, 256}, {256, 0}, {256, 10}, {10, 0}};
  d[0] = i == 0 ? v : s[i][0];
  d[1] = s[i][1];
  return (i == 2 || i == 4) ? 1 : 2;
}

enum { D = 256, F = 1024 };

// One head of self-attention and an FFN, residuals, no norms (the op set has none):
//   a = softmax((x Wq)(x Wk)^T / 16) (x Wv) Wo + x;  y = gelu(a W1 + b1) W2 + b2 + a.
static jit_graph *build_block(jit_context *ctx) {
  jit_graph *g = NULL;
  if (!ok(jit_graph_create(ctx, "block", &g), "graph")) exit(1);
  const DLDataType f32 = {kDLFloat, 32, 1};
  int64_t s = jit_symbol(g, "S");
  int64_t dx[2] = {s, D}, dd[2] = {D, D}, d1[2] = {D, F}, db1[1] = {F}, d2[2] = {F, D},
          db2[1] = {D};
  jit_value x = jit_input(g, "x", f32, 2, dx);
  jit_value wq = jit_input(g, "wq", f32, 2, dd);
  jit_value wk = jit_input(g, "wk", f32, 2, dd);
  jit_value wv = jit_input(g, "wv", f32, 2, dd);
  jit_value wo = jit_input(g, "wo", f32, 2, dd);
  jit_value w1 = jit_input(g, "w1", f32, 2, d1);
  jit_value b1 = jit_input(g, "b1", f32, 1, db1);
  jit_value w2 = jit_input(g, "w2", f32, 2, d2);
  jit_value b2 = jit_input(g, "b2", f32, 1, db2);
  int perm[2] = {1, 0};
  jit_value q = jit_matmul(g, x, wq), k = jit_matmul(g, x, wk), v = jit_matmul(g, x, wv);
  jit_value scores = jit_mul(g, jit_matmul(g, q, jit_transpose(g, k, perm)),
                             jit_scalar(g, 1.0 / 16.0, f32));
  jit_value att = jit_matmul(g, jit_softmax(g, scores, -1), v);
  jit_value a = jit_add(g, jit_matmul(g, att, wo), x);
  jit_value h = jit_gelu(g, jit_add(g, jit_matmul(g, a, w1), b1));
  jit_output(g, jit_add(g, jit_add(g, jit_matmul(g, h, w2), b2), a));
  return finalize(g);
}

static int shape_block(int i, int64_t v, int64_t *d) {
  static const int64_t s[9][2] = {{0, D}, {D, D}, {D, D}, {D, D}, {D, D},
                                  {D, F}, {F, 0}, {F, D}, {D, 0}};
  d[0] = i == 0 ? v : s[i][0];
  d[1] = s[i][1];
  return (i == 6 || i == 8) ? 1 : 2;
}

static const workload kWorkloads[] = {
    {"mlp 784-256-10", "N", build_mlp, 5, shape_mlp, 10},
    {"transformer block d=256", "S", build_block, 9, shape_block, D},
};

//===--- Streams ---------------------------------------------------------===//

// `distinct` values spread over 1..512 (1 and 512 included).
static void values(int distinct, int64_t *v) {
  for (int i = 0; i < distinct; i++)
    v[i] = 1 + (int64_t)((double)i * (kMaxDim - 1) / (distinct > 1 ? distinct - 1 : 1));
  // Shuffle, so the stream's order is not the values' order.
  for (int i = distinct - 1; i > 0; i--) {
    int j = (int)(unit() * (i + 1));
    int64_t t = v[i];
    v[i] = v[j];
    v[j] = t;
  }
}

// Each value `calls / distinct` times, shuffled.
static void uniform_stream(int calls, int distinct, int64_t *out) {
  int64_t v[1024];
  values(distinct, v);
  for (int i = 0; i < calls; i++) out[i] = v[i % distinct];
  for (int i = calls - 1; i > 0; i--) {
    int j = (int)(unit() * (i + 1));
    int64_t t = out[i];
    out[i] = out[j];
    out[j] = t;
  }
}

// Draws with probability ~ 1 / rank^1.1 over `distinct` values.
static void zipf_stream(int calls, int distinct, int64_t *out) {
  int64_t v[1024];
  double cdf[1024], sum = 0;
  values(distinct, v);
  for (int i = 0; i < distinct; i++) cdf[i] = (sum += 1.0 / pow(i + 1, 1.1));
  for (int c = 0; c < calls; c++) {
    double u = unit() * sum;
    int i = 0;
    while (i < distinct - 1 && cdf[i] < u) i++;
    out[c] = v[i];
  }
}

//===--- One policy ------------------------------------------------------===//

typedef struct result {
  double total_ms, compile_ms, p50, p99, p99_after_first, steady_cps;
  uint64_t compiles, generic_runs, specializations;
} result;

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double percentile(double *sorted, int n, double p) {
  int i = (int)ceil(p * n) - 1;
  return sorted[i < 0 ? 0 : i >= n ? n - 1 : i];
}

typedef struct buffers {
  float *in[kMaxInputs];
  float *out;
} buffers;

static bool call(jit_graph *g, const workload *w, buffers *b, int64_t v) {
  int64_t shapes[kMaxInputs][2], oshape[2] = {v, w->out_cols};
  DLTensor in[kMaxInputs];
  for (int i = 0; i < w->n_inputs; i++) {
    int r = w->shape(i, v, shapes[i]);
    in[i] = tensor(b->in[i], r, shapes[i]);
  }
  DLTensor out = tensor(b->out, 2, oshape);
  return ok(jit_run(g, in, w->n_inputs, &out, 1), "jit_run");
}

static jit_stats stats_of(jit_context *ctx) {
  jit_stats s = {0};
  s.struct_size = sizeof s;
  jit_context_stats(ctx, &s);
  return s;
}

// Waits until no background compile is queued or running.
static void settle(jit_context *ctx) {
  struct timespec ts = {0, 20 * 1000 * 1000};
  for (int i = 0; i < 3000 && stats_of(ctx).specializations_pending; i++) nanosleep(&ts, NULL);
}

// The steady state: `hot` values, each called `reps` times round robin, after enough
// calls of each to make it hot (AUTO) and its compile done.
static double steady(jit_context *ctx, jit_graph *g, const workload *w, buffers *b,
                     const int64_t *hot, int n_hot, int reps) {
  for (int k = 0; k < 8; k++)
    for (int i = 0; i < n_hot; i++) call(g, w, b, hot[i]);
  settle(ctx);
  // The best of five rounds: a shared machine's noise only ever slows a round down.
  double best = 1e300;
  for (int round = 0; round < 5; round++) {
    double t0 = now_ms();
    for (int r = 0; r < reps; r++)
      for (int i = 0; i < n_hot; i++) call(g, w, b, hot[i]);
    double ms = now_ms() - t0;
    if (ms < best) best = ms;
  }
  return (double)(reps * n_hot) / (best / 1e3);
}

static int g_threads;
static const char *g_device;

static result run_policy(const workload *w, jit_shape_policy policy, const int64_t *stream,
                         int calls, const int64_t *hot, int n_hot, buffers *b) {
  result r = {0};
  jit_options o;
  jit_options_init(&o);
  o.cache_dir = "";
  o.shape_policy = policy;
  o.num_threads = g_threads;
  o.device = g_device;
  jit_context *ctx = NULL;
  if (!ok(jit_context_create(&o, &ctx), "context")) exit(1);
  jit_graph *g = w->build(ctx);
  double *lat = malloc(sizeof(double) * (size_t)calls);
  double t0 = now_ms();
  for (int c = 0; c < calls; c++) {
    double t = now_ms();
    if (!call(g, w, b, stream[c])) exit(1);
    lat[c] = now_ms() - t;
  }
  r.total_ms = now_ms() - t0;
  jit_stats st = stats_of(ctx);
  r.compile_ms = st.compile_ms;
  r.compiles = st.compiles;
  r.generic_runs = st.generic_runs;
  qsort(lat + 1, (size_t)calls - 1, sizeof *lat, cmp_double);
  r.p99_after_first = percentile(lat + 1, calls - 1, 0.99);
  qsort(lat, (size_t)calls, sizeof *lat, cmp_double);
  r.p50 = percentile(lat, calls, 0.5);
  r.p99 = percentile(lat, calls, 0.99);
  free(lat);
  // The stream's own specializations (AUTO), then the steady state.
  settle(ctx);
  r.specializations = stats_of(ctx).specializations;
  r.steady_cps = steady(ctx, g, w, b, hot, n_hot, 20);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
  return r;
}

// The stream's `n` most frequent values.
static int hottest(const int64_t *stream, int calls, int64_t *hot, int n) {
  int64_t vals[1024];
  int counts[1024], nv = 0;
  for (int c = 0; c < calls; c++) {
    int i = 0;
    while (i < nv && vals[i] != stream[c]) i++;
    if (i == nv) {
      vals[nv] = stream[c];
      counts[nv++] = 0;
    }
    counts[i]++;
  }
  int k = 0;
  for (; k < n && k < nv; k++) {
    int best = k;
    for (int i = k + 1; i < nv; i++)
      if (counts[i] > counts[best]) best = i;
    int64_t tv = vals[k];
    int tc = counts[k];
    vals[k] = vals[best];
    counts[k] = counts[best];
    vals[best] = tv;
    counts[best] = tc;
    hot[k] = vals[k];
  }
  return k;
}

//===--- Kernels: generic against exact, shape by shape ------------------===//

// A [M, K] x [K, N] matmul graph; `all` makes K and N symbolic too (else only M).
static jit_graph *build_matmul(jit_context *ctx, bool all, int64_t K, int64_t N) {
  jit_graph *g = NULL;
  if (!ok(jit_graph_create(ctx, "matmul", &g), "graph")) exit(1);
  const DLDataType f32 = {kDLFloat, 32, 1};
  int64_t m = jit_symbol(g, "M");
  int64_t k = all ? jit_symbol(g, "K") : K, n = all ? jit_symbol(g, "N") : N;
  int64_t da[2] = {m, k}, db[2] = {k, n};
  jit_value a = jit_input(g, "a", f32, 2, da);
  jit_value b = jit_input(g, "b", f32, 2, db);
  jit_output(g, jit_matmul(g, a, b));
  return finalize(g);
}

typedef struct kcase {
  const char *what;
  int kind;  // 0: the MLP at batch M; 1: matmul, M symbolic; 2: matmul, all symbolic
  int64_t M, K, N;
} kcase;

// Microseconds per call of `g` on the case's shapes: the best of `rounds` rounds.
static double time_case(jit_graph *g, const kcase *c, float **bufs, int reps) {
  int64_t sh[kMaxInputs][2], so[2];
  DLTensor in[kMaxInputs], out;
  int n_in;
  if (c->kind == 0) {
    n_in = 5;
    for (int i = 0; i < 5; i++) in[i] = tensor(bufs[i], shape_mlp(i, c->M, sh[i]), sh[i]);
    so[0] = c->M;
    so[1] = 10;
  } else {
    n_in = 2;
    sh[0][0] = c->M, sh[0][1] = c->K, sh[1][0] = c->K, sh[1][1] = c->N;
    in[0] = tensor(bufs[0], 2, sh[0]);
    in[1] = tensor(bufs[1], 2, sh[1]);
    so[0] = c->M;
    so[1] = c->N;
  }
  out = tensor(bufs[kMaxInputs - 1], 2, so);
  if (!ok(jit_run(g, in, n_in, &out, 1), "jit_run")) exit(1);
  double t0 = now_ms();
  for (int r = 0; r < reps; r++) jit_run(g, in, n_in, &out, 1);
  return (now_ms() - t0) * 1e3 / reps;
}

static int cmp_dbl(const void *a, const void *b) { return cmp_double(a, b); }

// Generic against exact kernels: for each case the two contexts' kernels are timed
// in alternation, 7 rounds, and the median of the per-round ratios is printed.
static void kernels(int threads) {
  static const kcase cases[] = {
      {"mlp N=1", 0, 1, 0, 0},         {"mlp N=7", 0, 7, 0, 0},
      {"mlp N=64", 0, 64, 0, 0},       {"mlp N=300", 0, 300, 0, 0},
      {"mlp N=512", 0, 512, 0, 0},     {"mm 17x1000x31 (M)", 1, 17, 1000, 31},
      {"mm 17x1000x31 (MKN)", 2, 17, 1000, 31}, {"mm 1x784x256 (M)", 1, 1, 784, 256},
      {"mm 97x127x131 (MKN)", 2, 97, 127, 131}, {"mm 512x512x512 (M)", 1, 512, 512, 512},
      {"mm 512x512x512 (MKN)", 2, 512, 512, 512}, {"mm 1024x1024x1024 (M)", 1, 1024, 1024, 1024},
  };
  float *bufs[kMaxInputs] = {0};
  for (int i = 0; i < kMaxInputs; i++) bufs[i] = rand_array(1024 * 1024, 0.1f);
  printf("\ngeneric kernels against exact ones (threads %d; median of 7 alternating "
         "rounds, us per call; the generic kernel's compile)\n%-24s %10s %10s %8s %9s\n",
         threads, "case", "exact us", "generic us", "ratio", "gen. ms");
  jit_context *ctx[2];
  for (int p = 0; p < 2; p++) {
    jit_options o;
    jit_options_init(&o);
    o.cache_dir = "";
    o.num_threads = threads;
    o.shape_policy = p ? JIT_SHAPE_POLICY_GENERIC : JIT_SHAPE_POLICY_EXACT;
    if (!ok(jit_context_create(&o, &ctx[p]), "context")) exit(1);
  }
  for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
    const kcase *c = &cases[ci];
    jit_graph *g[2];
    for (int p = 0; p < 2; p++)
      g[p] = c->kind == 0 ? build_mlp(ctx[p]) : build_matmul(ctx[p], c->kind == 2, c->K, c->N);
    double flops = c->kind == 0 ? 2.0 * c->M * (784 * 256 + 2560) : 2.0 * c->M * c->K * c->N;
    int reps = flops > 1e8 ? 10 : flops > 1e7 ? 50 : flops > 1e6 ? 300 : 2000;
    double ex[7], ge[7], ratio[7];
    double c0 = stats_of(ctx[1]).compile_ms;
    time_case(g[1], c, bufs, 1);
    double gms = stats_of(ctx[1]).compile_ms - c0;
    for (int r = 0; r < 7; r++) {
      ex[r] = time_case(g[0], c, bufs, reps);
      ge[r] = time_case(g[1], c, bufs, reps);
      ratio[r] = ex[r] / ge[r];
    }
    qsort(ex, 7, sizeof *ex, cmp_dbl);
    qsort(ge, 7, sizeof *ge, cmp_dbl);
    qsort(ratio, 7, sizeof *ratio, cmp_dbl);
    printf("%-24s %10.1f %10.1f %7.2fx %9.0f\n", c->what, ex[3], ge[3], ratio[3], gms);
    fflush(stdout);
    for (int p = 0; p < 2; p++) jit_graph_destroy(g[p]);
  }
  for (int p = 0; p < 2; p++) jit_context_destroy(ctx[p]);
  for (int i = 0; i < kMaxInputs; i++) free(bufs[i]);
}

// --export DIR: the workload's graph as MLIR (DIR/<mlp|block>.mlir, `?` dims) and each
// stream's values (DIR/<mlp|block>-<stream>.txt), for bench/stream_iree.py to run the
// same calls through IREE.
static void export_stream(const char *dir, const workload *w, const char *sname,
                          const int64_t *stream, int calls) {
  const char *tag = w->build == build_mlp ? "mlp" : "block";
  char path[1024];
  snprintf(path, sizeof path, "%s/%s-%s.txt", dir, tag, sname);
  FILE *f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "jitml_stream: cannot write %s\n", path);
    exit(1);
  }
  for (int c = 0; c < calls; c++) fprintf(f, "%lld\n", (long long)stream[c]);
  fclose(f);
  snprintf(path, sizeof path, "%s/%s.mlir", dir, tag);
  jit_context *ctx = NULL;
  if (!ok(jit_context_create(NULL, &ctx), "context")) exit(1);
  jit_graph *g = w->build(ctx);
  char *text = NULL;
  if (!ok(jit_graph_to_mlir(g, &text), "jit_graph_to_mlir")) exit(1);
  f = fopen(path, "w");
  if (f) {
    fputs(text, f);
    fclose(f);
  }
  jit_string_free(text);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

int main(int argc, char **argv) {
  bool quick = false, kernel_mode = false;
  int threads = 0;
  const char *export_dir = NULL;
  const char *only = NULL, *which = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--quick")) quick = true;
    else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
    else if (!strcmp(argv[i], "--stream") && i + 1 < argc) which = argv[++i];
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--kernels")) kernel_mode = true;
    else if (!strcmp(argv[i], "--export") && i + 1 < argc) export_dir = argv[++i];
    else if (!strcmp(argv[i], "--device") && i + 1 < argc) g_device = argv[++i];
    else {
      fprintf(stderr, "usage: jitml_stream [--quick] [--only mlp|block] "
              "[--stream uniform|zipf] [--threads N] [--kernels] [--export DIR] "
              "[--device vulkan|cuda]\n");
      return 2;
    }
  }
  g_threads = threads;
  if (getenv("JITML_SHAPE_POLICY"))
    fprintf(stderr, "jitml_stream: JITML_SHAPE_POLICY is set and overrides every policy "
            "below; unset it\n");
  if (kernel_mode) {
    kernels(threads);
    return 0;
  }
  printf("libjitml %s; each policy in a fresh context, disk cache off%s%s\n", jit_version(),
         g_device ? "; device " : "", g_device ? g_device : "");
  static const char *const pname[] = {"AUTO", "EXACT", "GENERIC"};
  for (size_t wi = 0; wi < sizeof kWorkloads / sizeof *kWorkloads; wi++) {
    const workload *w = &kWorkloads[wi];
    if (only && !strstr(w->name, only)) continue;
    buffers b = {0};
    for (int i = 0; i < w->n_inputs; i++) {
      int64_t d[2];
      int r = w->shape(i, kMaxDim, d);
      b.in[i] = rand_array((size_t)(r == 2 ? d[0] * d[1] : d[0]), i == 0 ? 1.0f : 0.05f);
    }
    b.out = rand_array((size_t)kMaxDim * (size_t)w->out_cols, 0);
    for (int si = 0; si < 2; si++) {
      const char *sname = si ? "zipf" : "uniform";
      if (which && strcmp(which, sname)) continue;
      int distinct = quick ? 40 : 100, calls = si ? (quick ? 400 : 1000) : 3 * distinct;
      int64_t *stream = malloc(sizeof(int64_t) * (size_t)calls), hot[8];
      if (si) zipf_stream(calls, distinct, stream);
      else uniform_stream(calls, distinct, stream);
      int n_hot = hottest(stream, calls, hot, 8);
      if (export_dir) export_stream(export_dir, w, sname, stream, calls);
      printf("\n%s, %s stream: %d calls over %d values of %s in 1..%d\n", w->name, sname,
             calls, distinct, w->sym, kMaxDim);
      printf("%-8s %10s %10s %9s %9s %9s %9s %8s %6s %8s\n", "policy", "total ms",
             "compile ms", "p50 ms", "p99 ms", "p99 ms*", "compiles", "generic", "spec",
             "steady");
      result res[3];
      const jit_shape_policy order[3] = {JIT_SHAPE_POLICY_EXACT, JIT_SHAPE_POLICY_GENERIC,
                                         JIT_SHAPE_POLICY_AUTO};
      for (int p = 0; p < 3; p++) {
        res[p] = run_policy(w, order[p], stream, calls, hot, n_hot, &b);
        const result *r = &res[p];
        printf("%-8s %10.0f %10.0f %9.3f %9.2f %9.2f %9llu %8llu %6llu %7.2fx\n",
               pname[order[p]], r->total_ms, r->compile_ms, r->p50, r->p99,
               r->p99_after_first, (unsigned long long)r->compiles,
               (unsigned long long)r->generic_runs, (unsigned long long)r->specializations,
               r->steady_cps / res[0].steady_cps);
        fflush(stdout);
      }
      printf("AUTO total / EXACT total: %.3f   (p99*: without the first call; steady: the "
             "%d hottest values again, calls/s against EXACT's)\n",
             res[2].total_ms / res[0].total_ms, n_hot);
      free(stream);
    }
    for (int i = 0; i < w->n_inputs; i++) free(b.in[i]);
    free(b.out);
  }
  return 0;
}
