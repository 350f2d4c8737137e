//===--- paths.h - which code path a kernel took, from its dumped IR ---------===//
//
// For the suites that check the CPU strategy's choices (test_perf_paths.c,
// test_row_paths.c, test_forall_paths.c): contexts that compile every kernel (no disk
// cache) for a thread count, optionally dumping each stage's IR into a temporary
// directory that a test then searches; a dense layer checked against plain C. Static
// functions: each suite gets its own copy and dump directory.
// Define _XOPEN_SOURCE 700 (or _GNU_SOURCE) before including it: nftw.
//
//===----------------------------------------------------------------------===//
#ifndef JITML_TESTS_PATHS_H
#define JITML_TESTS_PATHS_H

#include <dirent.h>
#include <ftw.h>
#include <stdbool.h>
#include <sys/stat.h>

#include "util.h"

// The L2 that $JITML_CPU_L2 pins (bytes, or a number with a K or M suffix: the
// library's grammar), or 0 when it pins none (the host's own L2 then decides).
static inline long pinned_l2(void) {
  const char *e = getenv("JITML_CPU_L2");
  char *end = NULL;
  long v = e ? strtol(e, &end, 10) : 0;
  if (end && (*end == 'K' || *end == 'k')) v <<= 10;
  if (end && (*end == 'M' || *end == 'm')) v <<= 20;
  return v >= (16 << 10) ? v : 0;
}

// The caches the path suites plan for whatever the host has (each calls this from a
// constructor, before the library reads the host): 2 MiB of L2 unless the environment
// gives a size (CTest's legs), and 32 MiB of L3 (a Zen 4 CCX's), which decides where a
// row kernel's stores stream.
static inline void pin_caches(void) {
  setenv("JITML_CPU_L2", "2M", 0);
  setenv("JITML_CPU_L3", "32M", 0);
}

// When set, contexts dump every stage's IR here, so a test can check which path the
// strategy took.
static char g_dump_dir[256];

// A context for `threads` threads whose log messages of `level` and up (none when `fn`
// is NULL) go to fn(user, ...).
static inline jit_context *ctx_logged(int threads, jit_log_fn fn, void *user,
                                      jit_log_level level) {
  jit_options o;
  jit_options_init(&o);
  o.num_threads = threads;
  o.cache_dir = "";  // compile every kernel: this suite is about the compiler
  if (g_dump_dir[0]) o.dump_ir_dir = g_dump_dir;
  o.log_fn = fn;
  o.log_user_data = user;
  o.log_level = level;
  jit_context *ctx = NULL;
  TU_OK(jit_context_create(&o, &ctx));
  return ctx;
}

static inline jit_context *ctx_threads(int threads) {
  return ctx_logged(threads, NULL, NULL, JIT_LOG_ERROR);
}

static inline int rm_entry(const char *path, const struct stat *sb, int flag,
                           struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(path);
}

// Contexts made by ctx_threads between these two dump every stage of every kernel into
// a fresh temporary directory, removed by dump_end.
static inline void dump_begin(void) {
  snprintf(g_dump_dir, sizeof g_dump_dir, "/tmp/jitml-test-paths-XXXXXX");
  cr_assert(mkdtemp(g_dump_dir));
}

static inline void dump_end(void) {
  nftw(g_dump_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  g_dump_dir[0] = 0;
}

// The text (its first 256 KiB) of the `index`-th dumped stage `suffix` of the kernels
// compiled while g_dump_dir was set, in a static buffer; NULL past the last.
static inline const char *dump_text(const char *suffix, int index) {
  DIR *d = opendir(g_dump_dir);
  cr_assert(d, "cannot open %s", g_dump_dir);
  static char buf[1 << 18];
  const char *text = NULL;
  for (struct dirent *e; (e = readdir(d)) && !text;) {
    size_t n = strlen(e->d_name), m = strlen(suffix);
    if (n < m || strcmp(e->d_name + n - m, suffix) || index-- > 0) continue;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", g_dump_dir, e->d_name);
    FILE *f = fopen(path, "rb");
    cr_assert(f);
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    buf[len] = 0;
    fclose(f);
    text = buf;
  }
  closedir(d);
  return text;
}

// Whether the dumped stage `suffix` of a kernel compiled while g_dump_dir was set
// holds `needle`.
static inline bool dump_has(const char *suffix, const char *needle) {
  const char *text;
  for (int i = 0; (text = dump_text(suffix, i)); i++)
    if (strstr(text, needle)) return true;
  return false;
}

// Whether kernels compiled for 2 threads really split: ASan builds keep every kernel
// single-threaded (devices/cpu/cpu.c: libomp is not sanitizer-clean).
#if defined(__SANITIZE_ADDRESS__)
static const bool kThreadsSplit = false;
#else
static const bool kThreadsSplit = true;
#endif

//===--- Dense layers and the host's vectors ------------------------------===//

static inline float gelu_ref(double x) {
  return (float)(0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))));
}

// tu_run_check for a matmul's result: inputs in [-1, 1] make each sum of K products
// ~sqrt(K) in magnitude; f32 summation in another order than the double reference
// differs by ~K * 2^-24 relative, and f16 results by their rounding.
static inline void check_matmul_result(jit_graph *g, const DLTensor *ins, int n_in,
                                       DLDataType dt, int rank, const int64_t *dims,
                                       const float *want, int64_t K, const char *what) {
  bool f16 = tu_is_f16(dt);
  double atol = f16 ? 2e-2 * sqrt((double)K) : 2e-6 * (double)K, rtol = f16 ? 1e-2 : 1e-5;
  tu_run_check(g, ins, n_in, dt, rank, dims, want, rtol, atol, NULL, what);
}

// free() for each of the n buffers.
static inline void free_bufs(void *const *p, int n) {
  for (int i = 0; i < n; i++) free(p[i]);
}

// want[i] = act(want[i] + b[i % N]) in place (b NULL: no bias); act 0 = none, 1 = relu,
// 2 = gelu.
static inline void bias_act_ref(float *want, int64_t n, int64_t N, const float *b,
                                int act) {
  for (int64_t i = 0; i < n; i++) {
    double v = want[i] + (b ? b[i % N] : 0.0);
    want[i] = act == 1 ? (float)(v > 0 ? v : 0) : act == 2 ? gelu_ref(v) : (float)v;
  }
}

// y = act(x W [+ b]) for act 0 = none, 1 = relu, 2 = gelu; checks against ref_matmul.
static inline void check_dense(int M, int K, int N, int threads, DLDataType dt,
                               int bias, int act) {
  jit_context *ctx = ctx_threads(threads);
  jit_graph *g = tu_graph(ctx, "dense");
  int64_t sa[2] = {M, K}, sb[2] = {K, N}, sbias[1] = {N}, sc[2] = {M, N};
  jit_value x = jit_input(g, "x", dt, 2, sa), w = jit_input(g, "w", dt, 2, sb);
  jit_value y = jit_matmul(g, x, w);
  jit_value bv = {0};
  if (bias) {
    bv = jit_input(g, "b", dt, 1, sbias);
    y = jit_add(g, y, bv);
  }
  if (act == 1) y = jit_relu(g, y);
  if (act == 2) y = jit_gelu(g, y);
  jit_output(g, y);
  TU_OK(jit_graph_finalize(g));

  ref_rng rng;
  ref_rng_seed(&rng, (uint64_t)(M * 1000003 + K * 1009 + N));
  float *a = tu_malloc(sizeof(float) * (size_t)M * K);
  float *b = tu_malloc(sizeof(float) * (size_t)K * N);
  float *bb = tu_malloc(sizeof(float) * (size_t)N);
  float *want = tu_malloc(sizeof(float) * (size_t)M * N);
  ref_rng_fill_signed(&rng, a, (int64_t)M * K);
  ref_rng_fill_signed(&rng, b, (int64_t)K * N);
  ref_rng_fill_signed(&rng, bb, N);
  void *da = tu_input_data(dt, a, (int64_t)M * K), *db = tu_input_data(dt, b, (int64_t)K * N);
  void *dbias = tu_input_data(dt, bb, N);
  int64_t dc[2];
  ref_matmul(a, 2, sa, b, 2, sb, want, dc);
  bias_act_ref(want, (int64_t)M * N, N, bias ? bb : NULL, act);
  DLTensor ins[3] = {tu_tensor(da, dt, 2, sa), tu_tensor(db, dt, 2, sb),
                     tu_tensor(dbias, dt, 1, sbias)};
  char what[128];
  snprintf(what, sizeof what, "%s%s %dx%dx%d %s threads=%d", bias ? "bias+" : "",
           act == 1 ? "relu" : act == 2 ? "gelu" : "matmul", M, K, N,
           tu_is_f16(dt) ? "f16" : "f32", threads);
  check_matmul_result(g, ins, bias ? 3 : 2, dt, 2, sc, want, K, what);
  free_bufs((void *[]){a, b, bb, want, da, db, dbias}, 7);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// Whether the transform script holds `needle` (the strategy writes a comment naming
// its choices at the top of each op).
static inline bool script_has(const char *needle) {
  return dump_has("-03-transform-script.mlir", needle);
}

// Register tiles follow the host's vector width (6x16 on AVX2, 8x32 on AVX-512), and
// with them the blocks and the path a shape takes: a case that lands on a path on one
// host may not on the other. Such cases give the shape and needle for each, as
// AVX512(for AVX2, for AVX-512). Both sets were read off the scripts and checked to
// land on the path the comment names. CTest runs the path suites a second time with
// JITML_CPU_FEATURES=-avx512f, so an AVX-512 machine checks the AVX2 paths too.
#if defined(__x86_64__) || defined(__i386__)
static inline bool host_avx512(void) {
  const char *off = getenv("JITML_CPU_FEATURES");
  if (off && strstr(off, "-avx512f")) return false;
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f");
}
#else
static inline bool host_avx512(void) { return false; }
#endif
#define AVX512(avx2, avx512) (host_avx512() ? (avx512) : (avx2))

#endif  // JITML_TESTS_PATHS_H
