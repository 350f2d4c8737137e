//===--- bench.c - libjitml against OpenBLAS, oneDNN and memory bandwidth --===//
//
// One process, one run: every case is timed for libjitml and for each peer present,
// medians over repeats, then a table with the ratio to the best peer, a CSV and (with
// gnuplot) a PNG chart. Not a test: nothing here asserts on numbers.
//
//   bench [--quick] [--cputime] [--only SUBSTR] [--csv FILE] [--png FILE] [--reps N]
//         [--rounds N]
//
// --rounds N runs the timed cases N times over and reports, for each case, the median
// of each time across the rounds (the table, CSV and chart): on a shared machine whose
// speed drifts from minute to minute, one round's medians still swing by ~30 %.
//
// Peers are loaded with dlopen, so the bench builds and runs without them:
// - OpenBLAS (libopenblas.so.0): cblas_sgemm at 1 and 2 threads. It reads
//   OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE when it is loaded, so they are unset before
//   the dlopen, and the core it picked is printed.
// - oneDNN (libdnnl.so.2, when built with its header): the matmul primitive, with bias
//   and a gelu_tanh post-op for the fused cases, softmax, layer normalization and
//   convolution (plain NCHW/OIHW) primitives, and an eltwise primitive to measure
//   per-call overhead.
// Threading runtimes spin for a while after a parallel region (libomp for libjitml,
// pthreads for OpenBLAS, libgomp for oneDNN); on two cores they would steal each
// other's core, so the bench pauses between implementations. Single-threaded cases
// against oneDNN or OpenBLAS have no such threads, so they alternate the
// implementations batch by batch instead (time_interleaved): the machine's drift then
// hits each of them alike.
//
//===----------------------------------------------------------------------===//
#define _GNU_SOURCE
#include <dlfcn.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "jitml.h"

#if JITML_BENCH_HAVE_DNNL
#include <dnnl.h>
#endif

//===--- Timing ----------------------------------------------------------===//

// --cputime: process CPU time instead of wall time. On a machine shared with other
// jobs it leaves out the time this process was descheduled; only meaningful for
// single-threaded cases (threads add up, spinning included).
static clockid_t g_clock = CLOCK_MONOTONIC;

static double now_us(void) {
  struct timespec ts;
  clock_gettime(g_clock, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

typedef void (*bench_fn)(void *user);

static struct {
  int quick;
  int reps;
  const char *only;
  const char *csv;
  const char *png;
  FILE *csv_file;
  int rounds;
} g_opt = {0, 0, NULL, NULL, NULL, NULL, 1};

// Median time of one call in microseconds: `reps` samples, each a batch sized so a
// sample lasts ~2 ms (~0.5 ms quick), after ~50 ms (10 quick) of warm-up calls. After
// the pause between implementations, threads took tens of milliseconds to run at full
// speed here: 1x768x3072 at 2 threads timed 270-310 us (libjitml) and 125-165 us
// (oneDNN) over 21 samples after one warm-up call, 87 and 88 us over 64.
static double time_median(bench_fn fn, void *user) {
  struct timespec w0, w1;
  clock_gettime(CLOCK_MONOTONIC, &w0);  // wall time, also under --cputime
  for (double warm = g_opt.quick ? 10e3 : 50e3;;) {
    fn(user);
    clock_gettime(CLOCK_MONOTONIC, &w1);
    if ((w1.tv_sec - w0.tv_sec) * 1e6 + (w1.tv_nsec - w0.tv_nsec) / 1e3 >= warm) break;
  }
  double t0 = now_us();
  fn(user);
  double one = now_us() - t0;
  double target = g_opt.quick ? 500 : 2000;
  int batch = one > 0 ? (int)(target / one) : 1000;
  if (batch < 1) batch = 1;
  if (batch > 100000) batch = 100000;
  int reps = g_opt.reps;
  double samples[64];
  if (reps > 64) reps = 64;
  for (int r = 0; r < reps; r++) {
    double s = now_us();
    for (int i = 0; i < batch; i++) fn(user);
    samples[r] = (now_us() - s) / batch;
  }
  qsort(samples, (size_t)reps, sizeof(double), cmp_double);
  return samples[reps / 2];
}

// Like time_median for `n` functions at once: after each one's warm-up, every timed
// round runs one batch of each in turn. Writes each one's median (us) to out[i].
static void time_interleaved(int n, bench_fn *fns, void **users, double *out) {
  enum { kMax = 4 };
  int batch[kMax], reps = g_opt.reps > 64 ? 64 : g_opt.reps;
  double samples[kMax][64];
  for (int f = 0; f < n && f < kMax; f++) {
    double t0 = now_us();
    while (now_us() - t0 < (g_opt.quick ? 10e3 : 50e3)) fns[f](users[f]);
    double s = now_us();
    fns[f](users[f]);
    double one = now_us() - s;
    batch[f] = one > 0 ? (int)((g_opt.quick ? 500 : 2000) / one) : 1000;
    if (batch[f] < 1) batch[f] = 1;
    if (batch[f] > 100000) batch[f] = 100000;
  }
  for (int r = 0; r < reps; r++)
    for (int f = 0; f < n && f < kMax; f++) {
      double s = now_us();
      for (int i = 0; i < batch[f]; i++) fns[f](users[f]);
      samples[f][r] = (now_us() - s) / batch[f];
    }
  for (int f = 0; f < n && f < kMax; f++) {
    qsort(samples[f], (size_t)reps, sizeof(double), cmp_double);
    out[f] = samples[f][reps / 2];
  }
}

// Lets the other runtime's spinning threads go to sleep before the next one runs.
static void settle(void) { usleep(g_opt.quick ? 20000 : 200000); }

//===--- Buffers ---------------------------------------------------------===//

static float *alloc_f32(size_t n, unsigned seed) {
  float *p = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
  if (!p) {
    fprintf(stderr, "bench: out of memory (%zu floats)\n", n);
    exit(1);
  }
  uint32_t s = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; i++) {
    s = s * 1664525u + 1013904223u;
    p[i] = (float)((s >> 8) & 0xffff) / 65536.0f - 0.5f;
  }
  return p;
}

#define F32 ((DLDataType){kDLFloat, 32, 1})

static DLTensor tensor(float *data, int rank, int64_t *shape) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = kDLCPU;
  t.ndim = rank;
  t.dtype = F32;
  t.shape = shape;
  return t;
}

static void check(jit_status s, const char *what) {
  if (!s) return;
  fprintf(stderr, "bench: %s: %s\n", what, jit_status_message(s));
  jit_status_free(s);
  exit(1);
}

//===--- Peers: OpenBLAS -------------------------------------------------===//

static struct {
  void *lib;
  void (*sgemm)(int, int, int, int, int, int, float, const float *, int, const float *,
                int, float, float *, int);
  void (*set_threads)(int);
  char *(*corename)(void);
} g_blas;

static void blas_load(void) {
  // OpenBLAS reads these at load time; the bench wants its own choice of kernel.
  unsetenv("OPENBLAS_CORETYPE");
  unsetenv("OPENBLAS_L2_SIZE");
  g_blas.lib = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
  if (!g_blas.lib) return;
  *(void **)&g_blas.sgemm = dlsym(g_blas.lib, "cblas_sgemm");
  *(void **)&g_blas.set_threads = dlsym(g_blas.lib, "openblas_set_num_threads");
  *(void **)&g_blas.corename = dlsym(g_blas.lib, "openblas_get_corename");
  if (!g_blas.sgemm || !g_blas.set_threads) g_blas.lib = NULL;
}

//===--- Peers: oneDNN ---------------------------------------------------===//

static void (*g_omp_set_threads)(int);

// With g_wt, W is stored transposed, N x K (nb x N x K): x W^T, PyTorch's Linear weight
// and attention's key cache layout; every peer and graph reads it so (the cases' "W^T").
static int g_wt;

#if JITML_BENCH_HAVE_DNNL
static dnnl_engine_t g_eng;
static dnnl_stream_t g_stream;

typedef struct dnnl_case {
  dnnl_primitive_t prim;
  dnnl_memory_t mem[4];
  int n_args;
  dnnl_exec_arg_t args[4];
} dnnl_case;

static int dnnl_ok(dnnl_status_t s) { return s == dnnl_success; }

// Matmul (M,K) x (K,N) [+ bias(N)] [-> gelu_tanh], f32, plain row-major layouts
// (oneDNN 2.x C API: descriptors are structs initialized in place); with nb > 0, a
// batch of nb: (nb,M,K) x (nb,K,N), no bias.
static int dnnl_matmul_create(dnnl_case *c, int64_t nb, int64_t M, int64_t K, int64_t N,
                              float *a, float *b, float *bias, float *out, int gelu) {
  memset(c, 0, sizeof *c);
  dnnl_memory_desc_t ad, bd, cd, biasd;
  dnnl_dims_t da = {M, K}, db = {K, N}, dc = {M, N}, dbias = {1, N};
  dnnl_dims_t ba = {nb, M, K}, bb = {nb, K, N}, bc = {nb, M, N};
  if (nb > 0) {
    dnnl_memory_desc_init_by_tag(&ad, 3, ba, dnnl_f32, dnnl_abc);
    dnnl_memory_desc_init_by_tag(&bd, 3, bb, dnnl_f32, g_wt ? dnnl_acb : dnnl_abc);
    dnnl_memory_desc_init_by_tag(&cd, 3, bc, dnnl_f32, dnnl_abc);
  } else {
    dnnl_memory_desc_init_by_tag(&ad, 2, da, dnnl_f32, dnnl_ab);
    dnnl_memory_desc_init_by_tag(&bd, 2, db, dnnl_f32, g_wt ? dnnl_ba : dnnl_ab);
    dnnl_memory_desc_init_by_tag(&cd, 2, dc, dnnl_f32, dnnl_ab);
  }
  dnnl_memory_desc_init_by_tag(&biasd, 2, dbias, dnnl_f32, dnnl_ab);
  dnnl_matmul_desc_t desc;
  if (!dnnl_ok(dnnl_matmul_desc_init(&desc, &ad, &bd, bias ? &biasd : NULL, &cd)))
    return 0;
  dnnl_primitive_attr_t attr = NULL;
  dnnl_primitive_attr_create(&attr);
  dnnl_post_ops_t po = NULL;
  if (gelu) {
    dnnl_post_ops_create(&po);
    dnnl_post_ops_append_eltwise(po, 1.f, dnnl_eltwise_gelu_tanh, 0.f, 0.f);
    dnnl_primitive_attr_set_post_ops(attr, po);
  }
  dnnl_primitive_desc_t pd = NULL;
  int ok = dnnl_ok(dnnl_primitive_desc_create(&pd, &desc, attr, g_eng, NULL));
  if (ok) ok = dnnl_ok(dnnl_primitive_create(&c->prim, pd));
  if (pd) dnnl_primitive_desc_destroy(pd);
  if (po) dnnl_post_ops_destroy(po);
  dnnl_primitive_attr_destroy(attr);
  if (ok) {
    dnnl_memory_create(&c->mem[0], &ad, g_eng, a);
    dnnl_memory_create(&c->mem[1], &bd, g_eng, b);
    dnnl_memory_create(&c->mem[2], &cd, g_eng, out);
    c->args[0] = (dnnl_exec_arg_t){DNNL_ARG_SRC, c->mem[0]};
    c->args[1] = (dnnl_exec_arg_t){DNNL_ARG_WEIGHTS, c->mem[1]};
    c->args[2] = (dnnl_exec_arg_t){DNNL_ARG_DST, c->mem[2]};
    c->n_args = 3;
    if (bias) {
      dnnl_memory_create(&c->mem[3], &biasd, g_eng, bias);
      c->args[3] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, c->mem[3]};
      c->n_args = 4;
    }
  }
  return ok;
}

// Makes c's primitive from op descriptor `desc` and binds data[i] (of memory desc
// mds[i]) as argument args[i], i < n. 0 when oneDNN refuses it.
static int dnnl_finish(dnnl_case *c, const void *desc, int n, const int *args,
                       const dnnl_memory_desc_t *const *mds, void *const *data) {
  dnnl_primitive_desc_t pd = NULL;
  int ok = dnnl_ok(dnnl_primitive_desc_create(&pd, desc, NULL, g_eng, NULL));
  if (ok) ok = dnnl_ok(dnnl_primitive_create(&c->prim, pd));
  if (pd) dnnl_primitive_desc_destroy(pd);
  for (int i = 0; ok && i < n; i++) {
    dnnl_memory_create(&c->mem[i], mds[i], g_eng, data[i]);
    c->args[i] = (dnnl_exec_arg_t){args[i], c->mem[i]};
  }
  c->n_args = ok ? n : 0;
  return ok;
}

// relu over n floats: the smallest primitive, for per-call overhead.
static int dnnl_relu_create(dnnl_case *c, int64_t n, float *x, float *y) {
  memset(c, 0, sizeof *c);
  dnnl_memory_desc_t d;
  dnnl_dims_t dims = {n};
  dnnl_memory_desc_init_by_tag(&d, 1, dims, dnnl_f32, dnnl_a);
  dnnl_eltwise_desc_t desc;
  if (!dnnl_ok(dnnl_eltwise_forward_desc_init(&desc, dnnl_forward_inference,
                                              dnnl_eltwise_relu, &d, 0.f, 0.f)))
    return 0;
  const dnnl_memory_desc_t *mds[2] = {&d, &d};
  return dnnl_finish(c, &desc, 2, (const int[]){DNNL_ARG_SRC, DNNL_ARG_DST}, mds,
                     (void *const[]){x, y});
}

// Row softmax over `cols` (axis 1) of rows x cols, f32, plain layout.
static int dnnl_softmax_create(dnnl_case *c, int64_t rows, int64_t cols, float *x, float *y) {
  memset(c, 0, sizeof *c);
  dnnl_memory_desc_t d;
  dnnl_dims_t dims = {rows, cols};
  dnnl_memory_desc_init_by_tag(&d, 2, dims, dnnl_f32, dnnl_ab);
  dnnl_softmax_desc_t desc;
  if (!dnnl_ok(dnnl_softmax_forward_desc_init(&desc, dnnl_forward_inference, &d, 1)))
    return 0;
  const dnnl_memory_desc_t *mds[2] = {&d, &d};
  return dnnl_finish(c, &desc, 2, (const int[]){DNNL_ARG_SRC, DNNL_ARG_DST}, mds,
                     (void *const[]){x, y});
}

// Layer normalization of each row (inference: statistics computed), with a scale and a
// shift of `cols` values each.
static int dnnl_layer_norm_create(dnnl_case *c, int64_t rows, int64_t cols, float *x,
                                  float *y, float *scale, float *shift, float eps) {
  memset(c, 0, sizeof *c);
  dnnl_memory_desc_t d, wd;
  dnnl_dims_t dims = {rows, cols}, wdims = {cols};
  dnnl_memory_desc_init_by_tag(&d, 2, dims, dnnl_f32, dnnl_ab);
  dnnl_memory_desc_init_by_tag(&wd, 1, wdims, dnnl_f32, dnnl_a);
  dnnl_layer_normalization_desc_t desc;
  if (!dnnl_ok(dnnl_layer_normalization_forward_desc_init(
          &desc, dnnl_forward_inference, &d, NULL, eps, dnnl_use_scale | dnnl_use_shift)))
    return 0;
  const dnnl_memory_desc_t *mds[4] = {&d, &d, &wd, &wd};
  return dnnl_finish(c, &desc, 4,
                     (const int[]){DNNL_ARG_SRC, DNNL_ARG_DST, DNNL_ARG_SCALE, DNNL_ARG_SHIFT},
                     mds, (void *const[]){x, y, scale, shift});
}

// conv2d NCHW x OIHW, padding `pad` on every side, on the plain layouts a framework
// hands over (oneDNN picks its implementation for them; no reorders around it).
static int dnnl_conv_create(dnnl_case *c, int64_t n, int64_t C, int64_t F, int64_t H,
                            int64_t W, int64_t k, int64_t stride, int64_t pad, float *x,
                            float *w, float *y) {
  memset(c, 0, sizeof *c);
  int64_t oh = (H + 2 * pad - k) / stride + 1, ow = (W + 2 * pad - k) / stride + 1;
  dnnl_memory_desc_t xd, wd, yd;
  dnnl_dims_t dx = {n, C, H, W}, dw = {F, C, k, k}, dy = {n, F, oh, ow};
  dnnl_memory_desc_init_by_tag(&xd, 4, dx, dnnl_f32, dnnl_nchw);
  dnnl_memory_desc_init_by_tag(&wd, 4, dw, dnnl_f32, dnnl_oihw);
  dnnl_memory_desc_init_by_tag(&yd, 4, dy, dnnl_f32, dnnl_nchw);
  dnnl_dims_t st = {stride, stride}, pl = {pad, pad}, pr = {pad, pad};
  dnnl_convolution_desc_t desc;
  if (!dnnl_ok(dnnl_convolution_forward_desc_init(&desc, dnnl_forward_inference,
                                                  dnnl_convolution_auto, &xd, &wd, NULL, &yd,
                                                  st, pl, pr)))
    return 0;
  const dnnl_memory_desc_t *mds[3] = {&xd, &wd, &yd};
  return dnnl_finish(c, &desc, 3, (const int[]){DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST},
                     mds, (void *const[]){x, w, y});
}

static void dnnl_case_destroy(dnnl_case *c) {
  if (c->prim) dnnl_primitive_destroy(c->prim);
  for (int i = 0; i < 4; i++)
    if (c->mem[i]) dnnl_memory_destroy(c->mem[i]);
}

static void dnnl_run(void *user) {
  dnnl_case *c = user;
  dnnl_primitive_execute(c->prim, g_stream, c->n_args, c->args);
  dnnl_stream_wait(g_stream);
}

static int dnnl_load(void) {
  if (!dnnl_ok(dnnl_engine_create(&g_eng, dnnl_cpu, 0))) return 0;
  if (!dnnl_ok(dnnl_stream_create(&g_stream, g_eng, dnnl_stream_default_flags))) return 0;
  *(void **)&g_omp_set_threads = dlsym(RTLD_DEFAULT, "omp_set_num_threads");
  return 1;
}
#else
static int dnnl_load(void) { return 0; }
#endif

static int g_have_dnnl;

//===--- libjitml graphs -------------------------------------------------===//

typedef struct jit_case {
  jit_graph *g;
  DLTensor in[3], out[1];
  int n_in;
  double compile_ms;
  int64_t shapes[5][3];  // what in[] and out[] point to (dense_case)
} jit_case;

static jit_context *make_ctx(int threads) {
  jit_options o;
  jit_options_init(&o);
  o.num_threads = threads;
  o.cache_dir = "";  // always compile: the bench reports compile time
  jit_context *ctx = NULL;
  check(jit_context_create(&o, &ctx), "jit_context_create");
  return ctx;
}

static void jit_case_compile(jit_case *c) {
  double t0 = now_us();
  check(jit_graph_compile(c->g, c->in, c->n_in), "jit_graph_compile");
  c->compile_ms = (now_us() - t0) / 1e3;
}

static void jit_case_run(void *user) {
  jit_case *c = user;
  jit_status s = jit_run(c->g, c->in, c->n_in, c->out, 1);
  if (s) check(s, "jit_run");
}

//===--- Results ---------------------------------------------------------===//

typedef struct row {
  char name[48];
  int threads;
  double jit_us, blas_us, dnnl_us, ref_us;  // 0: not measured
  const char *unit;                         // "GFLOP/s" or "GB/s"
  double work;                              // flops or bytes per call
  double compile_ms;
} row;

// Every round's rows, then (final_rows) one per case: the medians across rounds.
#define MAX_ROWS 1024
static row g_rows[MAX_ROWS];
static int g_n_rows;
static row g_final[MAX_ROWS];
static int g_n_final;

static double rate(const row *r, double us) { return us > 0 ? r->work / us / 1e3 : 0; }

static double best_peer(const row *r) {
  double b = 0;
  if (r->blas_us > 0) b = r->blas_us;
  if (r->dnnl_us > 0 && (b == 0 || r->dnnl_us < b)) b = r->dnnl_us;
  if (b == 0) b = r->ref_us;
  return b;
}

static void print_header(void) {
  printf("%-26s %2s | %9s %8s | %9s %9s %9s | %7s | %7s\n", "case", "T", "jitml us",
         "rate", "openblas", "onednn", "ref", "vs best", "comp ms");
}

static void print_row(const row *r) {
  double bp = best_peer(r);
  printf("%-26s %2d | %9.1f %8.1f | %9.1f %9.1f %9.1f | %6.2fx | %7.1f\n", r->name,
         r->threads, r->jit_us, rate(r, r->jit_us), r->blas_us, r->dnnl_us, r->ref_us,
         bp > 0 && r->jit_us > 0 ? bp / r->jit_us : 0, r->compile_ms);
  fflush(stdout);
}

static void csv_row(const row *r) {
  double bp = best_peer(r);
  if (g_opt.csv_file)
    fprintf(g_opt.csv_file, "%s,%d,%s,%.3f,%.3f,%.3f,%.3f,%.3f,%.4f,%.2f\n", r->name,
            r->threads, r->unit, r->jit_us, r->blas_us, r->dnnl_us, r->ref_us,
            rate(r, r->jit_us), bp > 0 && r->jit_us > 0 ? bp / r->jit_us : 0,
            r->compile_ms);
}

static row *new_row(const char *name, int threads, const char *unit, double work) {
  if (g_n_rows == MAX_ROWS) {
    fprintf(stderr, "bench: more than %d rows (lower --rounds)\n", MAX_ROWS);
    exit(2);
  }
  row *r = &g_rows[g_n_rows++];
  memset(r, 0, sizeof *r);
  snprintf(r->name, sizeof r->name, "%s", name);
  r->threads = threads;
  r->unit = unit;
  r->work = work;
  return r;
}

static int wanted(const char *name) { return !g_opt.only || strstr(name, g_opt.only); }

//===--- Cases: matmul ---------------------------------------------------===//

typedef struct blas_mm {
  int M, N, K;
  const float *a, *b;
  float *c;
  const float *bias;  // non-NULL: add bias and gelu after the sgemm
  int nb;             // > 0: a batch of nb matmuls, one sgemm each
} blas_mm;

static float gelu_ref(float x) {
  return 0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x)));
}

static void blas_run(void *user) {
  blas_mm *m = user;
  size_t sa = (size_t)m->M * m->K, sb = (size_t)m->K * m->N, sc = (size_t)m->M * m->N;
  for (int i = 0; i < (m->nb > 0 ? m->nb : 1); i++)
    g_blas.sgemm(101 /*row major*/, 111 /*no trans*/, g_wt ? 112 /*trans*/ : 111, m->M,
                 m->N, m->K, 1.0f, m->a + i * sa, m->K, m->b + i * sb, g_wt ? m->K : m->N,
                 0.0f, m->c + i * sc, m->N);
  if (m->bias)
    for (int i = 0; i < m->M; i++) {
      float *row = m->c + (size_t)i * m->N;
      for (int j = 0; j < m->N; j++) row[j] = gelu_ref(row[j] + m->bias[j]);
    }
}

static void set_peer_threads(int t) {
  if (g_blas.lib) g_blas.set_threads(t);
  if (g_omp_set_threads) g_omp_set_threads(t);
}

// The graph of matmul (gelu = 0) or gelu(x W + b) (gelu = 1) on a (M x K), b (K x N),
// bias (N) -> c (M x N), finalized, not compiled, into *jc (its tensors point into it,
// so it must not be copied). With nb > 0 (no gelu), a batch: (nb,M,K) x (nb,K,N).
static void dense_case(jit_case *jc, jit_context *ctx, int nb, int M, int K, int N,
                       int gelu, float *a, float *b, float *bias, float *c) {
  memset(jc, 0, sizeof *jc);
  check(jit_graph_create(ctx, gelu ? "dense_gelu" : "matmul", &jc->g), "graph");
  int64_t *sa = jc->shapes[0], *sb = jc->shapes[1], *sbias = jc->shapes[2], *sc = jc->shapes[3];
  int r = nb > 0 ? 3 : 2, o = r - 2;
  if (nb > 0) sa[0] = sb[0] = sc[0] = nb;
  sa[o] = sc[o] = M, sa[o + 1] = sb[o] = K, sb[o + 1] = sbias[0] = sc[o + 1] = N;
  jit_value x = jit_input(jc->g, "x", F32, r, sa);
  int64_t *swt = jc->shapes[4];  // W as stored with g_wt: its last two dims swapped
  memcpy(swt, sb, sizeof(int64_t) * (size_t)r);
  int perm[3] = {0, 1, 2};
  if (g_wt) {
    swt[o] = N, swt[o + 1] = K;
    perm[o] = o + 1, perm[o + 1] = o;
  }
  jit_value w = jit_input(jc->g, "w", F32, r, swt);
  if (g_wt) w = jit_transpose(jc->g, w, perm);
  jit_value y = jit_matmul(jc->g, x, w);
  jc->in[0] = tensor(a, r, sa);
  jc->in[1] = tensor(b, r, swt);
  jc->n_in = 2;
  if (gelu) {
    jit_value bb = jit_input(jc->g, "b", F32, 1, sbias);
    y = jit_gelu(jc->g, jit_add(jc->g, y, bb));
    jc->in[2] = tensor(bias, 1, sbias);
    jc->n_in = 3;
  }
  jit_output(jc->g, y);
  check(jit_graph_finalize(jc->g), "finalize");
  jc->out[0] = tensor(c, r, sc);
}

// matmul (gelu = 0) or gelu(x W + b) (gelu = 1); with nb > 0, a batch of nb matmuls
// (OpenBLAS: one sgemm each; oneDNN: a 3-D matmul primitive).
static void case_matmul(int nb, int M, int K, int N, int threads, int gelu) {
  char name[48];
  const char *wt = g_wt ? " W^T" : "";
  if (gelu)
    snprintf(name, sizeof name, "gelu(xW+b) %dx%dx%d%s", M, K, N, wt);
  else if (nb > 0)
    snprintf(name, sizeof name, "batch %s%dx%dx%dx%d%s", g_wt ? "" : "matmul ", nb, M, K, N, wt);
  else
    snprintf(name, sizeof name, "matmul %dx%dx%d%s", M, K, N, wt);
  if (!wanted(name)) return;
  size_t n = nb > 0 ? (size_t)nb : 1;
  row *r = new_row(name, threads, "GFLOP/s", 2.0 * n * M * N * K);
  float *a = alloc_f32(n * M * K, 1), *b = alloc_f32(n * K * N, 2);
  float *bias = alloc_f32((size_t)N, 3), *c = alloc_f32(n * M * N, 4);

  jit_context *ctx = make_ctx(threads);
  jit_case jc;
  dense_case(&jc, ctx, nb, M, K, N, gelu, a, b, bias, c);
  jit_case_compile(&jc);
  r->compile_ms = jc.compile_ms;
  set_peer_threads(threads);
  blas_mm bm = {M, N, K, a, b, c, gelu ? bias : NULL, nb};
  bool have_dnnl = false;
#if JITML_BENCH_HAVE_DNNL
  dnnl_case dc;
  memset(&dc, 0, sizeof dc);  // destroyable whether or not it is made
  have_dnnl = g_have_dnnl && dnnl_matmul_create(&dc, nb, M, K, N, a, b,
                                                gelu ? bias : NULL, c, gelu);
#endif
  if (threads == 1) {
    // Batch by batch in turn (time_interleaved); the outputs are all c, which each
    // implementation overwrites whole.
    bench_fn fns[3] = {jit_case_run};
    void *users[3] = {&jc};
    double *outs[3] = {&r->jit_us};
    int n = 1;
    if (g_blas.lib) fns[n] = blas_run, users[n] = &bm, outs[n++] = &r->blas_us;
#if JITML_BENCH_HAVE_DNNL
    if (have_dnnl) fns[n] = dnnl_run, users[n] = &dc, outs[n++] = &r->dnnl_us;
#endif
    double us[3];
    time_interleaved(n, fns, users, us);
    for (int i = 0; i < n; i++) *outs[i] = us[i];
  } else {
    r->jit_us = time_median(jit_case_run, &jc);
    if (g_blas.lib) {
      settle();
      r->blas_us = time_median(blas_run, &bm);
    }
#if JITML_BENCH_HAVE_DNNL
    if (have_dnnl) {
      settle();
      r->dnnl_us = time_median(dnnl_run, &dc);
    }
#endif
  }
#if JITML_BENCH_HAVE_DNNL
  dnnl_case_destroy(&dc);
#endif
  (void)have_dnnl;
  jit_graph_destroy(jc.g);
  jit_context_destroy(ctx);
  settle();
  print_row(r);
  free(a);
  free(b);
  free(bias);
  free(c);
}

//===--- Cases: bandwidth ------------------------------------------------===//

typedef struct copy_args {
  float *dst;
  const float *src;
  size_t n;
} copy_args;

static void memcpy_run(void *user) {
  copy_args *c = user;
  memcpy(c->dst, c->src, c->n * sizeof(float));
}

// relu(a * b + c) over n floats vs memcpy of the same bytes (3 reads + 1 write).
static void case_elementwise(size_t n, int threads) {
  const char *name = "relu(a*b+c)";
  if (!wanted(name)) return;
  row *r = new_row(name, threads, "GB/s", 4.0 * n * sizeof(float));
  float *a = alloc_f32(n, 5), *b = alloc_f32(n, 6), *c = alloc_f32(n, 7),
        *o = alloc_f32(n, 8);
  jit_context *ctx = make_ctx(threads);
  jit_case jc = {0};
  check(jit_graph_create(ctx, "fma_relu", &jc.g), "graph");
  int64_t s[1] = {(int64_t)n};
  jit_value va = jit_input(jc.g, "a", F32, 1, s), vb = jit_input(jc.g, "b", F32, 1, s),
            vc = jit_input(jc.g, "c", F32, 1, s);
  jit_output(jc.g, jit_relu(jc.g, jit_add(jc.g, jit_mul(jc.g, va, vb), vc)));
  check(jit_graph_finalize(jc.g), "finalize");
  jc.in[0] = tensor(a, 1, s);
  jc.in[1] = tensor(b, 1, s);
  jc.in[2] = tensor(c, 1, s);
  jc.n_in = 3;
  jc.out[0] = tensor(o, 1, s);
  jit_case_compile(&jc);
  r->compile_ms = jc.compile_ms;
  r->jit_us = time_median(jit_case_run, &jc);
  jit_graph_destroy(jc.g);
  jit_context_destroy(ctx);
  settle();
  // memcpy of the same bytes: 2n floats read and 2n written (a,b -> c,o).
  free(c);
  free(o);
  float *src = alloc_f32(2 * n, 9), *dst = alloc_f32(2 * n, 10);
  copy_args ca = {dst, src, 2 * n};
  r->ref_us = time_median(memcpy_run, &ca);
  print_row(r);
  free(src);
  free(dst);
  free(a);
  free(b);
}

typedef struct softmax_args {
  const float *x;
  float *y;
  int rows, cols;
} softmax_args;

static void softmax_ref_run(void *user) {
  softmax_args *s = user;
  for (int i = 0; i < s->rows; i++) {
    const float *x = s->x + (size_t)i * s->cols;
    float *y = s->y + (size_t)i * s->cols;
    float mx = -INFINITY, sum = 0;
    for (int j = 0; j < s->cols; j++) mx = x[j] > mx ? x[j] : mx;
    for (int j = 0; j < s->cols; j++) sum += (y[j] = expf(x[j] - mx));
    float inv = 1.0f / sum;
    for (int j = 0; j < s->cols; j++) y[j] *= inv;
  }
}

// libjitml's kernel and oneDNN's primitive for one case (dc: a dnnl_case, or NULL without
// oneDNN) into r->jit_us and r->dnnl_us. On one thread batch by batch in turn
// (time_interleaved), as the single-threaded matmuls are: timed one after the other,
// layer_norm 4096x768 read 1.09x of oneDNN in one round and 0.82x in the next on the
// 2-core Zen 4 VM. With threads one after the other, with a pause between (their
// runtimes spin).
static void time_jit_and_dnnl(row *r, jit_case *jc, void *dc, int threads) {
#if JITML_BENCH_HAVE_DNNL
  if (dc && threads == 1) {
    bench_fn fns[2] = {jit_case_run, dnnl_run};
    void *users[2] = {jc, dc};
    double us[2];
    time_interleaved(2, fns, users, us);
    r->jit_us = us[0];
    r->dnnl_us = us[1];
    return;
  }
#endif
  r->jit_us = time_median(jit_case_run, jc);
#if JITML_BENCH_HAVE_DNNL
  if (dc) {
    settle();
    r->dnnl_us = time_median(dnnl_run, dc);
  }
#else
  (void)dc;
  (void)threads;
#endif
}

// Row softmax: compared with plain C, and with the time memcpy needs for its bytes.
static void case_softmax(int rows, int cols, double memcpy_gbs, int threads) {
  char name[48];
  snprintf(name, sizeof name, "softmax %dx%d", rows, cols);
  if (!wanted(name)) return;
  row *r = new_row(name, threads, "GB/s", 2.0 * rows * cols * sizeof(float));
  float *x = alloc_f32((size_t)rows * cols, 11), *y = alloc_f32((size_t)rows * cols, 12);
  jit_context *ctx = make_ctx(threads);
  jit_case jc = {0};
  check(jit_graph_create(ctx, "softmax", &jc.g), "graph");
  int64_t s[2] = {rows, cols};
  jit_output(jc.g, jit_softmax(jc.g, jit_input(jc.g, "x", F32, 2, s), 1));
  check(jit_graph_finalize(jc.g), "finalize");
  jc.in[0] = tensor(x, 2, s);
  jc.n_in = 1;
  jc.out[0] = tensor(y, 2, s);
  jit_case_compile(&jc);
  r->compile_ms = jc.compile_ms;
  void *peer = NULL;
#if JITML_BENCH_HAVE_DNNL
  dnnl_case dc;
  memset(&dc, 0, sizeof dc);  // destroyable whether or not it is made
  set_peer_threads(threads);
  if (g_have_dnnl && dnnl_softmax_create(&dc, rows, cols, x, y)) peer = &dc;
#endif
  time_jit_and_dnnl(r, &jc, peer, threads);
#if JITML_BENCH_HAVE_DNNL
  dnnl_case_destroy(&dc);
#endif
  jit_graph_destroy(jc.g);
  jit_context_destroy(ctx);
  softmax_args sa = {x, y, rows, cols};
  r->ref_us = time_median(softmax_ref_run, &sa);
  print_row(r);
  if (memcpy_gbs > 0)
    printf("  softmax: %.1f GB/s = %.2fx of memcpy bandwidth (%.1f GB/s)\n",
           rate(r, r->jit_us), rate(r, r->jit_us) / memcpy_gbs, memcpy_gbs);
  free(x);
  free(y);
}

typedef struct norm_args {
  const float *x, *w, *b;
  float *y;
  int rows, cols;
} norm_args;

static void layer_norm_ref_run(void *user) {
  norm_args *s = user;
  for (int i = 0; i < s->rows; i++) {
    const float *x = s->x + (size_t)i * s->cols;
    float *y = s->y + (size_t)i * s->cols, mean = 0, var = 0;
    for (int j = 0; j < s->cols; j++) mean += x[j];
    mean /= (float)s->cols;
    for (int j = 0; j < s->cols; j++) var += (x[j] - mean) * (x[j] - mean);
    float inv = 1.0f / sqrtf(var / (float)s->cols + 1e-5f);
    for (int j = 0; j < s->cols; j++) y[j] = (x[j] - mean) * inv * s->w[j] + s->b[j];
  }
}

// Layer norm of each row with weight and bias: against oneDNN's layer normalization
// and plain C.
static void case_layer_norm(int rows, int cols, int threads) {
  char name[48];
  snprintf(name, sizeof name, "layer_norm %dx%d", rows, cols);
  if (!wanted(name)) return;
  row *r = new_row(name, threads, "GB/s", 2.0 * rows * cols * sizeof(float));
  float *x = alloc_f32((size_t)rows * cols, 16), *y = alloc_f32((size_t)rows * cols, 17);
  float *w = alloc_f32((size_t)cols, 18), *b = alloc_f32((size_t)cols, 19);
  jit_context *ctx = make_ctx(threads);
  jit_case jc = {0};
  check(jit_graph_create(ctx, "layer_norm", &jc.g), "graph");
  int64_t s[2] = {rows, cols}, sc[1] = {cols};
  jit_value vx = jit_input(jc.g, "x", F32, 2, s), vw = jit_input(jc.g, "w", F32, 1, sc);
  jit_value vb = jit_input(jc.g, "b", F32, 1, sc);
  jit_output(jc.g, jit_layer_norm(jc.g, vx, vw, vb, 1e-5));
  check(jit_graph_finalize(jc.g), "finalize");
  jc.in[0] = tensor(x, 2, s);
  jc.in[1] = tensor(w, 1, sc);
  jc.in[2] = tensor(b, 1, sc);
  jc.n_in = 3;
  jc.out[0] = tensor(y, 2, s);
  jit_case_compile(&jc);
  r->compile_ms = jc.compile_ms;
  void *peer = NULL;
#if JITML_BENCH_HAVE_DNNL
  dnnl_case dc;
  memset(&dc, 0, sizeof dc);
  set_peer_threads(threads);
  if (g_have_dnnl && dnnl_layer_norm_create(&dc, rows, cols, x, y, w, b, 1e-5f)) peer = &dc;
#endif
  time_jit_and_dnnl(r, &jc, peer, threads);
#if JITML_BENCH_HAVE_DNNL
  dnnl_case_destroy(&dc);
#endif
  jit_graph_destroy(jc.g);
  jit_context_destroy(ctx);
  norm_args na = {x, w, b, y, rows, cols};
  r->ref_us = time_median(layer_norm_ref_run, &na);
  print_row(r);
  free(x);
  free(y);
  free(w);
  free(b);
}

// conv2d NCHW (ResNet's shapes, padding k / 2): libjitml (im2col + its matmul on the
// CPU) against oneDNN's convolution on the same plain layouts.
static void case_conv(int n, int C, int F, int H, int k, int stride, int threads) {
  char name[48];
  snprintf(name, sizeof name, "conv%dx%d %d->%d %dx%d s%d", k, k, C, F, H, H, stride);
  if (!wanted(name)) return;
  int pad = k / 2, o = (H + 2 * pad - k) / stride + 1;
  row *r = new_row(name, threads, "GFLOP/s", 2.0 * n * F * o * o * C * k * k);
  float *x = alloc_f32((size_t)n * C * H * H, 21), *w = alloc_f32((size_t)F * C * k * k, 22);
  float *y = alloc_f32((size_t)n * F * o * o, 23);
  jit_context *ctx = make_ctx(threads);
  jit_case jc = {0};
  check(jit_graph_create(ctx, "conv", &jc.g), "graph");
  int64_t sx[4] = {n, C, H, H}, sw[4] = {F, C, k, k}, sy[4] = {n, F, o, o};
  jit_window_params p;
  jit_window_params_init(&p);
  p.stride[0] = p.stride[1] = stride;
  for (int i = 0; i < 4; i++) p.padding[i] = pad;
  jit_value vx = jit_input(jc.g, "x", F32, 4, sx), vw = jit_input(jc.g, "w", F32, 4, sw);
  jit_output(jc.g, jit_conv2d(jc.g, vx, vw, &p));
  check(jit_graph_finalize(jc.g), "finalize");
  jc.in[0] = tensor(x, 4, sx);
  jc.in[1] = tensor(w, 4, sw);
  jc.n_in = 2;
  jc.out[0] = tensor(y, 4, sy);
  jit_case_compile(&jc);
  r->compile_ms = jc.compile_ms;
  void *peer = NULL;
#if JITML_BENCH_HAVE_DNNL
  dnnl_case dc;
  memset(&dc, 0, sizeof dc);
  set_peer_threads(threads);
  if (g_have_dnnl && dnnl_conv_create(&dc, n, C, F, H, H, k, stride, pad, x, w, y)) peer = &dc;
#endif
  time_jit_and_dnnl(r, &jc, peer, threads);
#if JITML_BENCH_HAVE_DNNL
  dnnl_case_destroy(&dc);
#endif
  jit_graph_destroy(jc.g);
  jit_context_destroy(ctx);
  print_row(r);
  free(x);
  free(w);
  free(y);
}

// Triad a = b + s c and memcpy, for the machine's bandwidth at this size.
typedef struct triad_args {
  float *a;
  const float *b, *c;
  size_t n;
} triad_args;

static void triad_run(void *user) {
  triad_args *t = user;
  for (size_t i = 0; i < t->n; i++) t->a[i] = t->b[i] + 3.0f * t->c[i];
}

static double case_bandwidth(size_t n) {
  float *a = alloc_f32(n, 13), *b = alloc_f32(n, 14), *c = alloc_f32(n, 15);
  triad_args t = {a, b, c, n};
  double triad = time_median(triad_run, &t);
  copy_args ca = {a, b, n};
  double cp = time_median(memcpy_run, &ca);
  double triad_gbs = 3.0 * n * 4 / triad / 1e3, cp_gbs = 2.0 * n * 4 / cp / 1e3;
  printf("bandwidth (%zu MiB arrays, 1 thread): memcpy %.1f GB/s, triad %.1f GB/s\n",
         n * 4 >> 20, cp_gbs, triad_gbs);
  // Rows without a peer: in the CSV (and the medians across rounds), not the chart.
  new_row("memcpy", 1, "GB/s", 2.0 * n * 4)->jit_us = cp;
  new_row("triad", 1, "GB/s", 3.0 * n * 4)->jit_us = triad;
  free(a);
  free(b);
  free(c);
  return cp_gbs;
}

//===--- Cases: per-call overhead ----------------------------------------===//

static void case_overhead(void) {
  const char *name = "jit_run overhead relu[8]";
  if (!wanted(name)) return;
  row *r = new_row(name, 1, "us", 0);
  float *x = alloc_f32(8, 16), *y = alloc_f32(8, 17);
  jit_context *ctx = make_ctx(1);
  jit_case jc = {0};
  check(jit_graph_create(ctx, "tiny", &jc.g), "graph");
  int64_t s[1] = {8};
  jit_output(jc.g, jit_relu(jc.g, jit_input(jc.g, "x", F32, 1, s)));
  check(jit_graph_finalize(jc.g), "finalize");
  jc.in[0] = tensor(x, 1, s);
  jc.n_in = 1;
  jc.out[0] = tensor(y, 1, s);
  jit_case_compile(&jc);
  r->compile_ms = jc.compile_ms;
  r->jit_us = time_median(jit_case_run, &jc);
  jit_graph_destroy(jc.g);
  jit_context_destroy(ctx);
#if JITML_BENCH_HAVE_DNNL
  if (g_have_dnnl) {
    set_peer_threads(1);
    dnnl_case dc;
    if (dnnl_relu_create(&dc, 8, x, y)) r->dnnl_us = time_median(dnnl_run, &dc);
    dnnl_case_destroy(&dc);
  }
#endif
  print_row(r);
  free(x);
  free(y);
}

//===--- Compile time ------------------------------------------------------===//
//
// The first call's cost for a new shape: jit_graph_compile in a fresh context with no
// disk cache, one thread, median of `reps` (3 quick) compiles, as wall time and as the
// compiling thread's CPU time (which other tenants of a busy machine inflate less).
// Also "warm": the same compile in a context that has compiled another kernel before
// (a tiny 2x8x8 matmul), as every compile but a process's first is: its MLIR
// dialects are loaded and its MLIR context is reused (lowering/lower.h, the pool).
// Peer: oneDNN creating its JIT (brgemm) matmul primitive for the same shape, with its
// primitive cache off. CSV rows: case "compile <name>" (and "warm compile <name>"),
// unit "ms", jitml_us = median wall ms, ref_us = median CPU ms, onednn_us = oneDNN
// creation ms.

static double thread_cpu_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

// Sorts v; for an even n, the mean of the middle two.
static double median_of(double *v, int n) {
  qsort(v, (size_t)n, sizeof(double), cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void case_compile_one(int M, int K, int N, int gelu) {
  char name[64];
  snprintf(name, sizeof name, "compile %s %dx%dx%d", gelu ? "gelu(xW+b)" : "matmul", M, K, N);
  if (!wanted(name)) return;
  float *a = alloc_f32((size_t)M * K, 1), *b = alloc_f32((size_t)K * N, 2);
  float *bias = alloc_f32((size_t)N, 3), *c = alloc_f32((size_t)M * N, 4);
  int reps = g_opt.quick ? 3 : 7;
  double wall[16], cpu[16], wwall[16], wcpu[16], dnnl[16];
  for (int r = 0; r < reps; r++) {
    for (int warm = 0; warm <= 1; warm++) {
      jit_context *ctx = make_ctx(1);
      if (warm) {
        jit_case w;
        dense_case(&w, ctx, 0, 2, 8, 8, 0, a, b, bias, c);
        check(jit_graph_compile(w.g, w.in, w.n_in), "jit_graph_compile");
        jit_graph_destroy(w.g);
      }
      jit_case jc;
      dense_case(&jc, ctx, 0, M, K, N, gelu, a, b, bias, c);
      double c0 = thread_cpu_ms(), t0 = now_us();
      check(jit_graph_compile(jc.g, jc.in, jc.n_in), "jit_graph_compile");
      (warm ? wwall : wall)[r] = (now_us() - t0) / 1e3;
      (warm ? wcpu : cpu)[r] = thread_cpu_ms() - c0;
      jit_graph_destroy(jc.g);
      jit_context_destroy(ctx);
    }
    dnnl[r] = 0;
#if JITML_BENCH_HAVE_DNNL
    if (g_have_dnnl) {
      dnnl_case dc;
      double t0 = now_us();
      if (dnnl_matmul_create(&dc, 0, M, K, N, a, b, gelu ? bias : NULL, c, gelu))
        dnnl[r] = (now_us() - t0) / 1e3;
      dnnl_case_destroy(&dc);
    }
#endif
  }
  double w = median_of(wall, reps), u = median_of(cpu, reps), d = median_of(dnnl, reps);
  double ww = median_of(wwall, reps), wu = median_of(wcpu, reps);
  printf("%-32s | %8.1f %8.1f | %8.1f %8.1f | %8.2f\n", name, w, u, ww, wu, d);
  fflush(stdout);
  if (g_opt.csv_file) {
    fprintf(g_opt.csv_file, "%s,1,ms,%.1f,0,%.2f,%.1f,0,0,%.1f\n", name, w, d, u, w);
    fprintf(g_opt.csv_file, "warm %s,1,ms,%.1f,0,%.2f,%.1f,0,0,%.1f\n", name, ww, d, wu, ww);
  }
  free(a);
  free(b);
  free(bias);
  free(c);
}

static void case_compile(void) {
  // Any filter naming a compile case (`--only "compile matmul"`) runs the section.
  if (g_opt.only && !strstr(g_opt.only, "compile") && !wanted("compile")) return;
#if JITML_BENCH_HAVE_DNNL
  if (g_have_dnnl) dnnl_set_primitive_cache_capacity(0);
#endif
  printf("\nCompile time of a new shape (fresh context, no disk cache, 1 thread; medians "
         "of %d)\n", g_opt.quick ? 3 : 7);
  printf("%-32s | %8s %8s | %8s %8s | %8s\n", "case", "wall ms", "cpu ms", "warm wall",
         "warm cpu", "oneDNN ms");
  static const int gm[] = {1, 32, 256};
  for (int i = 0; i < 3; i++) case_compile_one(gm[i], 768, 3072, 1);
  case_compile_one(512, 512, 512, 0);
  case_compile_one(17, 1000, 31, 0);
}

//===--- Chart -----------------------------------------------------------===//

static void write_chart(void) {
  if (!g_opt.png || !g_opt.csv) return;
  if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
    printf("gnuplot not found: no chart\n");
    return;
  }
  char dat[] = "/tmp/jitml-bench-XXXXXX";
  int fd = mkstemp(dat);
  if (fd < 0) return;
  FILE *f = fdopen(fd, "w");
  for (int i = 0; i < g_n_final; i++) {
    const row *r = &g_final[i];
    double bp = best_peer(r);
    if (bp <= 0 || r->jit_us <= 0 || r->work == 0) continue;
    fprintf(f, "\"%s (%dT)\" %.3f\n", r->name, r->threads, bp / r->jit_us);
  }
  fclose(f);
  char rounds[48] = "";
  if (g_opt.rounds > 1) snprintf(rounds, sizeof rounds, "; medians of %d rounds", g_opt.rounds);
  char cmd[4096];
  snprintf(cmd, sizeof cmd,
           "gnuplot -e \"set terminal pngcairo size 1200,600 font ',9' noenhanced;"
           "set output '%s';set style fill solid 0.8;set boxwidth 0.7;set bmargin 9;set rmargin 8;"
           "set ylabel 'speed vs best peer (x, higher is better)';set grid ytics;"
           "set xtics rotate by -40 noenhanced;set yrange [0:3];"
           "set title 'libjitml / best of OpenBLAS, oneDNN (memcpy, plain C for "
           "bandwidth cases); bars above 3x are cut and labelled%s';"
           "plot '%s' using 0:(\\$2>3?3:\\$2):xtic(1) with boxes notitle lc rgb '#3b7dd8', "
           "'' using 0:(\\$2>3?2.85:1/0):(sprintf('%%.1fx',\\$2)) with labels notitle, "
           "1 notitle lc rgb 'black' dt 2\" 2>&1 || gnuplot -e \"set terminal png size 1200,600;"
           "set output '%s';set style fill solid;set boxwidth 0.7;set xtics rotate by -40;"
           "plot '%s' using 0:2:xtic(1) with boxes notitle, 1 notitle\"",
           g_opt.png, rounds, dat, g_opt.png, dat);
  if (system(cmd) == 0) printf("chart: %s\n", g_opt.png);
  unlink(dat);
}

//===--- Cases: Vulkan (lavapipe in CI) vs the CPU backend ------------------===//
//
// Informative only. Each graph runs on the CPU backend (host tensors) and on the first
// Vulkan device with its tensors resident there (jit_tensor_alloc, inputs copied once),
// so the Vulkan time is dispatch + kernels + wait, without transfers. On lavapipe the
// "GPU" is the same two cores, so the ratio measures the SPIR-V kernels, not a GPU.
// CSV rows: case "vulkan <name>", jitml_us = Vulkan time, ref_us = CPU backend time,
// ratio = CPU / Vulkan (> 1: Vulkan faster); they are not in the chart.

enum { kGpuMlp, kGpuMatmul, kGpuSoftmax };

typedef struct gpu_bench {
  jit_graph *g;
  DLTensor in[5], out[1];
  int n_in;
} gpu_bench;

static void gpu_bench_run(void *user) {
  gpu_bench *b = user;
  check(jit_run(b->g, b->in, b->n_in, b->out, 1), "jit_run");
}

// Builds case `kind` in `ctx`; shapes into shp[i] (inputs, then the output at
// shp[4]), ranks into rk.
static jit_graph *gpu_graph(jit_context *ctx, int kind, int64_t n, int64_t shp[5][2],
                            int *rk, int *n_in) {
  jit_graph *g = NULL;
  check(jit_graph_create(ctx, "gpu_bench", &g), "graph");
  if (kind == kGpuMlp) {
    // softmax(gelu(x W1 + b1) W2 + b2), 784-256-10.
    int64_t d[5][2] = {{n, 784}, {784, 256}, {256, 0}, {256, 10}, {10, 0}};
    int r[5] = {2, 2, 1, 2, 1};
    jit_value v[5];
    static const char *const names[5] = {"x", "w1", "b1", "w2", "b2"};
    for (int i = 0; i < 5; i++) {
      memcpy(shp[i], d[i], sizeof d[i]);
      rk[i] = r[i];
      v[i] = jit_input(g, names[i], F32, r[i], shp[i]);
    }
    jit_value h = jit_gelu(g, jit_add(g, jit_matmul(g, v[0], v[1]), v[2]));
    jit_output(g, jit_softmax(g, jit_add(g, jit_matmul(g, h, v[3]), v[4]), 1));
    *n_in = 5;
  } else if (kind == kGpuMatmul) {
    for (int i = 0; i < 2; i++) shp[i][0] = shp[i][1] = n, rk[i] = 2;
    jit_output(g, jit_matmul(g, jit_input(g, "a", F32, 2, shp[0]),
                             jit_input(g, "b", F32, 2, shp[1])));
    *n_in = 2;
  } else {
    shp[0][0] = n, shp[0][1] = 1024, rk[0] = 2;
    jit_output(g, jit_softmax(g, jit_input(g, "x", F32, 2, shp[0]), 1));
    *n_in = 1;
  }
  check(jit_graph_finalize(g), "finalize");
  return g;
}

static void case_vulkan_one(jit_context *ctx, jit_device *dev, const char *name, int kind,
                            int64_t n, double flops) {
  char full[64];
  snprintf(full, sizeof full, "vulkan %s", name);
  if (!wanted(full)) return;
  int64_t shp[5][2] = {{0}}, oshp[2];
  int rk[5] = {0}, n_in = 0;
  jit_graph *g = gpu_graph(ctx, kind, n, shp, rk, &n_in);
  // The output: [n, 10], [n, n] or [n, 1024].
  oshp[0] = n;
  oshp[1] = kind == kGpuMlp ? 10 : kind == kGpuMatmul ? n : 1024;
  float *host_in[5], *host_out = alloc_f32((size_t)(oshp[0] * oshp[1]), 90);
  float *dev_res = alloc_f32((size_t)(oshp[0] * oshp[1]), 91);
  gpu_bench cpu = {g, {{0}}, {{0}}, n_in}, gpu = {g, {{0}}, {{0}}, n_in};
  for (int i = 0; i < n_in; i++) {
    int64_t cnt = rk[i] == 2 ? shp[i][0] * shp[i][1] : shp[i][0];
    host_in[i] = alloc_f32((size_t)cnt, 80 + (unsigned)i);
    cpu.in[i] = tensor(host_in[i], rk[i], shp[i]);
    check(jit_tensor_alloc(ctx, dev, F32, rk[i], shp[i], &gpu.in[i]), "jit_tensor_alloc");
    check(jit_copy(ctx, &gpu.in[i], &cpu.in[i]), "jit_copy");
  }
  cpu.out[0] = tensor(host_out, 2, oshp);
  check(jit_tensor_alloc(ctx, dev, F32, 2, oshp, &gpu.out[0]), "jit_tensor_alloc");

  double t0 = now_us();
  gpu_bench_run(&cpu);
  double cpu_first_ms = (now_us() - t0) / 1e3;
  double cpu_us = time_median(gpu_bench_run, &cpu);
  settle();
  t0 = now_us();
  gpu_bench_run(&gpu);
  double gpu_first_ms = (now_us() - t0) / 1e3;
  double gpu_us = time_median(gpu_bench_run, &gpu);
  DLTensor res = tensor(dev_res, 2, oshp);
  check(jit_copy(ctx, &res, &gpu.out[0]), "jit_copy");
  double diff = 0;
  for (int64_t i = 0; i < oshp[0] * oshp[1]; i++)
    if (fabs((double)dev_res[i] - host_out[i]) > diff) diff = fabs((double)dev_res[i] - host_out[i]);

  printf("%-26s | %9.1f %9.1f | %7.2fx | %8.2f %8.2f | %9.2g | %7.1f %7.1f\n", name, cpu_us,
         gpu_us, gpu_us > 0 ? cpu_us / gpu_us : 0, flops / cpu_us / 1e3, flops / gpu_us / 1e3,
         diff, cpu_first_ms, gpu_first_ms);
  fflush(stdout);
  if (g_opt.csv_file)
    fprintf(g_opt.csv_file, "%s,0,GFLOP/s,%.3f,0,0,%.3f,%.4f,%.4f,%.2f\n", full, gpu_us,
            cpu_us, flops / gpu_us / 1e3, gpu_us > 0 ? cpu_us / gpu_us : 0, gpu_first_ms);
  for (int i = 0; i < n_in; i++) {
    check(jit_tensor_free(ctx, &gpu.in[i]), "jit_tensor_free");
    free(host_in[i]);
  }
  check(jit_tensor_free(ctx, &gpu.out[0]), "jit_tensor_free");
  free(host_out);
  free(dev_res);
  jit_graph_destroy(g);
}

static void case_vulkan(void) {
  if (!wanted("vulkan mlp 784-256-10 N=1") && !wanted("vulkan mlp 784-256-10 N=64") &&
      !wanted("vulkan matmul 256^3") && !wanted("vulkan softmax 512x1024"))
    return;
  jit_options o;
  jit_options_init(&o);
  o.cache_dir = "";  // always compile: the first-run column includes the compile
  jit_context *ctx = NULL;
  check(jit_context_create(&o, &ctx), "jit_context_create");
  jit_device *dev = NULL;
  jit_status s = jit_context_find_device(ctx, JIT_DEVICE_VULKAN, 0, &dev);
  if (s) {
    printf("vulkan: skipped: no Vulkan device (%s)\n", jit_status_message(s));
    jit_status_free(s);
    jit_context_destroy(ctx);
    return;
  }
  jit_device_info info;
  check(jit_device_get_info(dev, &info), "jit_device_get_info");
  printf("\nVulkan device `%s` vs the CPU backend (all cores); device-resident tensors\n",
         info.name);
  printf("%-26s | %9s %9s | %8s | %8s %8s | %9s | %7s %7s\n", "case", "cpu us", "vulkan us",
         "cpu/vk", "cpu GF/s", "vk GF/s", "max|diff|", "cpu 1st", "vk 1st");
  // Work per call (multiply-adds x 2; softmax: ~5 flops per element).
  case_vulkan_one(ctx, dev, "mlp 784-256-10 N=1", kGpuMlp, 1,
                  2.0 * (784 * 256 + 256 * 10));
  case_vulkan_one(ctx, dev, "mlp 784-256-10 N=64", kGpuMlp, 64,
                  2.0 * 64 * (784 * 256 + 256 * 10));
  case_vulkan_one(ctx, dev, "matmul 256^3", kGpuMatmul, 256, 2.0 * 256 * 256 * 256);
  case_vulkan_one(ctx, dev, "softmax 512x1024", kGpuSoftmax, 512, 5.0 * 512 * 1024);
  jit_context_destroy(ctx);
}

//===--- Main ------------------------------------------------------------===//

// One round of the timed cases (rows in g_rows).
static void run_timed_cases(long ncpu) {
  static const int mm[][3] = {{512, 512, 512},  {1024, 1024, 1024}, {1, 768, 3072},
                              {8, 768, 3072},   {64, 768, 3072},    {128, 3072, 768},
                              {17, 1000, 31},   {256, 256, 256}};
  int max_t = ncpu >= 2 && g_clock == CLOCK_MONOTONIC ? 2 : 1;
  for (size_t i = 0; i < sizeof mm / sizeof mm[0]; i++) {
    if (g_opt.quick && mm[i][0] * (double)mm[i][1] * mm[i][2] > 3e8) continue;
    for (int t = 1; t <= max_t; t++) case_matmul(0, mm[i][0], mm[i][1], mm[i][2], t, 0);
  }
  // Attention-sized batches: Q K^T and P V of 12 heads over 128 tokens (head dim 64),
  // and a decode step's q K^T (one token against 1024).
  static const int bm[][4] = {{12, 128, 64, 128}, {12, 128, 128, 64}, {12, 1, 64, 1024}};
  for (size_t i = 0; i < sizeof bm / sizeof bm[0]; i++) {
    if (g_opt.quick && i > 0) continue;
    for (int t = 1; t <= max_t; t++) case_matmul(bm[i][0], bm[i][1], bm[i][2], bm[i][3], t, 0);
  }
  // The same with W stored transposed (N x K; the batch's keys (12, 1024, 64)).
  static const int wt[][4] = {{0, 1, 768, 3072}, {0, 8, 768, 3072}, {0, 64, 768, 3072},
                              {12, 1, 64, 1024}};
  g_wt = 1;
  for (size_t i = 0; i < sizeof wt / sizeof wt[0]; i++) {
    if (g_opt.quick && i != 1) continue;
    for (int t = 1; t <= max_t; t++) case_matmul(wt[i][0], wt[i][1], wt[i][2], wt[i][3], t, 0);
  }
  g_wt = 0;
  static const int gm[] = {1, 32, 256};
  for (int i = 0; i < 3; i++) {
    if (g_opt.quick && gm[i] > 32) continue;
    for (int t = 1; t <= max_t; t++) case_matmul(0, gm[i], 768, 3072, t, 1);
  }
  size_t n = g_opt.quick ? (1u << 20) : (16u << 20);
  double bw = wanted("relu") || wanted("softmax") ? case_bandwidth(n) : 0;
  if (g_clock != CLOCK_MONOTONIC) max_t = 1;
  for (int t = 1; t <= max_t; t++) case_elementwise(n, t);
  for (int t = 1; t <= max_t; t++) case_softmax(g_opt.quick ? 512 : 4096, 1024, bw, t);
  for (int t = 1; t <= max_t; t++) case_layer_norm(g_opt.quick ? 512 : 4096, 768, t);
  // ResNet-18's convolutions: stage 1's 3x3 at 56x56, stage 3's at 14x14, a strided
  // 3x3 into stage 2, and a bottleneck's 1x1.
  static const int cv[][6] = {{1, 64, 64, 56, 3, 1}, {1, 256, 256, 14, 3, 1},
                              {1, 64, 128, 56, 3, 2}, {1, 256, 64, 56, 1, 1}};
  for (size_t i = 0; i < sizeof cv / sizeof cv[0]; i++) {
    if (g_opt.quick && i > 0) continue;
    for (int t = 1; t <= max_t; t++)
      case_conv(cv[i][0], cv[i][1], cv[i][2], cv[i][3], cv[i][4], cv[i][5], t);
  }
  case_overhead();
}

// g_final: one row per case (name and threads), in first-run order, each time the
// median of that case's rounds.
static void median_rows(void) {
  g_n_final = 0;
  for (int i = 0; i < g_n_rows; i++) {
    const row *r = &g_rows[i];
    bool seen = false;
    for (int f = 0; f < g_n_final && !seen; f++)
      seen = g_final[f].threads == r->threads && !strcmp(g_final[f].name, r->name);
    if (seen) continue;
    double v[5][16];
    int n = 0;
    for (int j = i; j < g_n_rows && n < 16; j++) {
      const row *q = &g_rows[j];
      if (q->threads != r->threads || strcmp(q->name, r->name)) continue;
      v[0][n] = q->jit_us, v[1][n] = q->blas_us, v[2][n] = q->dnnl_us, v[3][n] = q->ref_us;
      v[4][n] = q->compile_ms;
      n++;
    }
    row *m = &g_final[g_n_final++];
    *m = *r;
    m->jit_us = median_of(v[0], n);
    m->blas_us = median_of(v[1], n);
    m->dnnl_us = median_of(v[2], n);
    m->ref_us = median_of(v[3], n);
    m->compile_ms = median_of(v[4], n);
  }
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--quick")) g_opt.quick = 1;
    else if (!strcmp(argv[i], "--only") && i + 1 < argc) g_opt.only = argv[++i];
    else if (!strcmp(argv[i], "--cputime")) g_clock = CLOCK_PROCESS_CPUTIME_ID;
    else if (!strcmp(argv[i], "--csv") && i + 1 < argc) g_opt.csv = argv[++i];
    else if (!strcmp(argv[i], "--png") && i + 1 < argc) g_opt.png = argv[++i];
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) g_opt.reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) g_opt.rounds = atoi(argv[++i]);
    else {
      fprintf(stderr,
              "usage: %s [--quick] [--cputime] [--only SUBSTR] [--csv FILE] [--png FILE] "
              "[--reps N] [--rounds N]\n",
              argv[0]);
      return 2;
    }
  }
  if (g_opt.rounds < 1 || g_opt.rounds > 16) {
    fprintf(stderr, "bench: --rounds takes 1 to 16\n");
    return 2;
  }
  if (g_opt.reps <= 0) g_opt.reps = g_opt.quick ? 3 : 11;
  blas_load();
  g_have_dnnl = dnnl_load();
  if (g_opt.csv) {
    g_opt.csv_file = fopen(g_opt.csv, "w");
    if (g_opt.csv_file)
      fprintf(g_opt.csv_file,
              "case,threads,unit,jitml_us,openblas_us,onednn_us,ref_us,jitml_rate,"
              "ratio_vs_best_peer,compile_ms\n");
  }
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  printf("libjitml %s; %ld CPUs; OpenBLAS: %s (core %s); oneDNN: %s; medians of %d\n",
         jit_version(), ncpu, g_blas.lib ? "yes" : "not found",
         g_blas.lib && g_blas.corename ? g_blas.corename() : "-",
         g_have_dnnl ? "yes" : "not found", g_opt.reps);
  for (int round = 1; round <= g_opt.rounds; round++) {
    if (g_opt.rounds > 1) printf("\nround %d of %d\n", round, g_opt.rounds);
    print_header();
    run_timed_cases(ncpu);
  }
  median_rows();
  if (g_opt.rounds > 1) {
    printf("\nmedians of %d rounds\n", g_opt.rounds);
    print_header();
    for (int i = 0; i < g_n_final; i++) {
      const row *r = &g_final[i];
      if (strcmp(r->name, "memcpy") && strcmp(r->name, "triad")) print_row(r);
      else printf("%-26s %2d | %9.1f %8.1f GB/s\n", r->name, r->threads, r->jit_us,
                  rate(r, r->jit_us));
    }
  }
  for (int i = 0; i < g_n_final; i++) csv_row(&g_final[i]);
  case_compile();
  case_vulkan();
  if (g_opt.csv_file) fclose(g_opt.csv_file);
  write_chart();
  return 0;
}
