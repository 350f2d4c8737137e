//===--- test_isolation.c - MLIR text imported and compiled in a worker ---===//
//
// The real worker (build/jitml-worker) imports and compiles; stand-in workers (shell
// scripts named by $JITML_WORKER) crash, hang, print nothing useful or run out of
// memory, and each becomes a status in this process, which goes on.
//
//===----------------------------------------------------------------------===//
#define _POSIX_C_SOURCE 200809L  // setenv, mkdtemp
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "jitml.h"
#include "util.h"

static const char kTranspose[] =
    "func.func @f(%y: tensor<2x3xf32>) -> tensor<3x2xf32> {\n"
    "  %e = tensor.empty() : tensor<3x2xf32>\n"
    "  %t = linalg.transpose ins(%y : tensor<2x3xf32>) outs(%e : tensor<3x2xf32>) "
    "permutation = [1, 0]\n"
    "  return %t : tensor<3x2xf32>\n}\n";

// The temporary directories iso_ctx made, removed at the end of each test.
static char g_dirs[8][64];
static int g_n_dirs;

static void remove_dirs(void) {
  for (int i = 0; i < g_n_dirs; i++) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dirs[i]);
    cr_expect_eq(system(cmd), 0);
  }
  g_n_dirs = 0;
}

TestSuite(isolation, .fini = remove_dirs);

// A context with isolation `mode` and the worker named by `worker` (NULL: the real
// one), caching into a fresh directory.
static jit_context *iso_ctx(jit_isolation mode, const char *worker, uint64_t timeout_ms,
                            uint64_t max_bytes, char *dir, size_t dir_size) {
  snprintf(dir, dir_size, "/tmp/jitml-iso-XXXXXX");
  cr_assert(mkdtemp(dir));
  if (g_n_dirs < 8) snprintf(g_dirs[g_n_dirs++], sizeof g_dirs[0], "%s", dir);
  if (worker) setenv("JITML_WORKER", worker, 1);
  else unsetenv("JITML_WORKER");
  jit_options o;
  jit_options_init(&o);
  o.mlir_isolation = mode;
  o.isolation_timeout_ms = timeout_ms;
  o.isolation_max_bytes = max_bytes;
  o.cache_dir = dir;
  jit_context *ctx = NULL;
  TU_OK(jit_context_create(&o, &ctx));
  return ctx;
}

// A stand-in worker: `body` as a shell script in `dir`.
static void script(const char *dir, const char *body, char *path, size_t size) {
  snprintf(path, size, "%s/worker.sh", dir);
  FILE *f = fopen(path, "w");
  cr_assert(f);
  fprintf(f, "#!/bin/sh\n%s\n", body);
  fclose(f);
  chmod(path, 0700);
}

static jit_status import(jit_context *ctx, jit_graph **g) {
  return jit_graph_from_mlir(ctx, kTranspose, strlen(kTranspose), NULL, g);
}

// A context whose worker is the shell script `body` (in a fresh directory).
static jit_context *stand_in(const char *body, jit_isolation mode, uint64_t timeout_ms,
                             uint64_t max_bytes) {
  char dir[64], path[128];
  jit_context_destroy(iso_ctx(JIT_ISOLATION_OFF, NULL, 0, 0, dir, sizeof dir));
  script(dir, body, path, sizeof path);
  return iso_ctx(mode, path, timeout_ms, max_bytes, dir, sizeof dir);
}

// Importing kTranspose fails with `code` and a message holding `needle`.
static void expect_import_fails(jit_context *ctx, jit_status_code code, const char *needle) {
  jit_graph *g = NULL;
  jit_status s = import(ctx, &g);
  TU_EXPECT_CODE(s, code);
  TU_EXPECT_MSG(s, needle);
  jit_status_free(s);
  cr_expect(g == NULL);
}

// The transpose of [[1 2 3] [4 5 6]], run; compiles as counted.
static void run_transpose(jit_context *ctx, jit_graph *g) {
  float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {0};
  int64_t sa[2] = {2, 3}, sb[2] = {3, 2};
  DLTensor in = {.data = a, .device = {kDLCPU, 0}, .ndim = 2, .dtype = TU_F32, .shape = sa};
  DLTensor out = {.data = b, .device = {kDLCPU, 0}, .ndim = 2, .dtype = TU_F32, .shape = sb};
  TU_OK(jit_run(g, &in, 1, &out, 1));
  const float want[6] = {1, 4, 2, 5, 3, 6};
  for (int i = 0; i < 6; i++) cr_expect_eq(b[i], want[i], "element %d", i);
  (void)ctx;
}

Test(isolation, real_worker_imports_and_compiles) {
  char dir[64];
  jit_context *ctx = iso_ctx(JIT_ISOLATION_ON, NULL, 0, 0, dir, sizeof dir);
  jit_graph *g = NULL;
  TU_OK(import(ctx, &g));
  run_transpose(ctx, g);
  jit_stats st = {.struct_size = sizeof st};
  TU_OK(jit_context_stats(ctx, &st));
  cr_expect_eq(st.compiles, 1, "the worker's compile counts as one");
  cr_expect_eq(st.disk_hits, 0);
  // A text the worker refuses comes back with its line and column, as in-process.
  jit_graph *bad = NULL;
  jit_status s = jit_graph_from_mlir(ctx, "func.func @f(%a: tensor<2xf32>) {\n  return %b\n}",
                                     46, NULL, &bad);
  TU_EXPECT_CODE(s, JIT_PARSE_ERROR);
  TU_EXPECT_MSG(s, "<input>:2:");
  jit_status_free(s);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(isolation, crash_while_importing_is_a_status) {
  jit_context *ctx = stand_in("echo 'LLVM ERROR: pretend parser crash' >&2\nkill -SEGV $$",
                              JIT_ISOLATION_ON, 0, 0);
  expect_import_fails(ctx, JIT_PARSE_ERROR, "died of signal 11");
  expect_import_fails(ctx, JIT_PARSE_ERROR, "pretend parser crash");
  jit_context_destroy(ctx);
}

Test(isolation, crash_while_compiling_is_a_status) {
  // Imports fine (it answers ok to an import), dies when asked to compile.
  jit_context *ctx = stand_in("read a; read mode\n[ \"$mode\" = 'mode import' ] && "
                              "{ echo ok; exit 0; }\nkill -ABRT $$", JIT_ISOLATION_ON, 0, 0);
  jit_graph *g = NULL;
  TU_OK(import(ctx, &g));
  float a[6] = {0}, b[6];
  int64_t sa[2] = {2, 3}, sb[2] = {3, 2};
  DLTensor in = {.data = a, .device = {kDLCPU, 0}, .ndim = 2, .dtype = TU_F32, .shape = sa};
  DLTensor out = {.data = b, .device = {kDLCPU, 0}, .ndim = 2, .dtype = TU_F32, .shape = sb};
  jit_status s = jit_run(g, &in, 1, &out, 1);
  TU_EXPECT_CODE(s, JIT_COMPILE_ERROR);
  TU_EXPECT_MSG(s, "died of signal 6");
  jit_status_free(s);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(isolation, hang_is_killed_at_the_time_limit) {
  jit_context *ctx = stand_in("exec sleep 60", JIT_ISOLATION_ON, 300, 0);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  expect_import_fails(ctx, JIT_PARSE_ERROR, "no answer within 300 ms, killed");
  clock_gettime(CLOCK_MONOTONIC, &t1);
  cr_expect_lt(t1.tv_sec - t0.tv_sec, 10, "the hang was not cut short");
  jit_context_destroy(ctx);
}

Test(isolation, no_answer_and_memory_limit) {
  jit_context *ctx = stand_in("echo hello", JIT_ISOLATION_ON, 0, 0);
  expect_import_fails(ctx, JIT_PARSE_ERROR, "without an answer");
  jit_context_destroy(ctx);
  // Past its address-space limit the worker fails to allocate and says nothing useful.
  ctx = stand_in("exec python3 -c 'b = bytearray(3 << 30); print(\"ok\")'", JIT_ISOLATION_ON,
                 0, (uint64_t)1 << 30);
  expect_import_fails(ctx, JIT_PARSE_ERROR, "MemoryError");
  jit_context_destroy(ctx);
}

Test(isolation, on_without_a_worker_is_unavailable) {
  char dir[64];
  jit_context *ctx = iso_ctx(JIT_ISOLATION_ON, "/nonexistent/jitml-worker", 0, 0, dir,
                             sizeof dir);
  expect_import_fails(ctx, JIT_UNAVAILABLE, "no jitml-worker found");
  jit_context_destroy(ctx);
  jit_graph *g = NULL;
  // AUTO without one works in this process.
  ctx = iso_ctx(JIT_ISOLATION_AUTO, "/nonexistent/jitml-worker", 0, 0, dir, sizeof dir);
  TU_OK(import(ctx, &g));
  run_transpose(ctx, g);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// A log line collector for the ALL test.
static char g_log[8192];
static void collect(void *user, jit_log_level level, const char *message) {
  (void)user, (void)level;
  size_t n = strlen(g_log);
  snprintf(g_log + n, sizeof g_log - n, "%s\n", message);
}

// y = relu(x * x + x) on [N, 5], built with the C API.
static jit_graph *c_graph(jit_context *ctx) {
  jit_graph *g = tu_graph(ctx, "c_graph");
  int64_t d[2] = {jit_symbol(g, "N"), 5};
  jit_value x = jit_input(g, "x", TU_F32, 2, d);
  jit_output(g, jit_relu(g, jit_add(g, jit_mul(g, x, x), x)));
  TU_OK(jit_graph_finalize(g));
  return g;
}

// ALL: a graph built in C compiles in the worker (from its export, which raises to the
// same graph and so the same key) and loads from the disk cache; a crash is a status.
Test(isolation, all_compiles_c_graphs_in_the_worker) {
  char dir[64];
  jit_context *ctx = iso_ctx(JIT_ISOLATION_ALL, NULL, 0, 0, dir, sizeof dir);
  jit_context_destroy(ctx);
  jit_options o;
  jit_options_init(&o);
  o.mlir_isolation = JIT_ISOLATION_ALL;
  o.shape_policy = JIT_SHAPE_POLICY_EXACT;
  o.cache_dir = dir;
  o.log_fn = collect;
  o.log_level = JIT_LOG_DEBUG;
  g_log[0] = 0;
  TU_OK(jit_context_create(&o, &ctx));
  jit_graph *g = c_graph(ctx);
  float x[15], y[15];
  for (int i = 0; i < 15; i++) x[i] = (float)(i - 7) / 3;
  int64_t shape[2] = {3, 5};
  DLTensor in = {.data = x, .device = {kDLCPU, 0}, .ndim = 2, .dtype = TU_F32, .shape = shape};
  DLTensor out = {.data = y, .device = {kDLCPU, 0}, .ndim = 2, .dtype = TU_F32, .shape = shape};
  TU_OK(jit_run(g, &in, 1, &out, 1));
  for (int i = 0; i < 15; i++) {
    float want = x[i] * x[i] + x[i];
    cr_expect_float_eq(y[i], want > 0 ? want : 0, 1e-6, "element %d", i);
  }
  jit_stats st = {.struct_size = sizeof st};
  TU_OK(jit_context_stats(ctx, &st));
  cr_expect_eq(st.compiles, 1);
  cr_expect(strstr(g_log, "isolation worker: compiling c_graph") != NULL, "log:\n%s", g_log);
  cr_expect(strstr(g_log, "not in the disk cache") == NULL, "the keys differ:\n%s", g_log);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);

  ctx = stand_in("kill -SEGV $$", JIT_ISOLATION_ALL, 0, 0);
  g = c_graph(ctx);
  jit_status s = jit_run(g, &in, 1, &out, 1);
  TU_EXPECT_CODE(s, JIT_COMPILE_ERROR);
  TU_EXPECT_MSG(s, "died of signal 11");
  jit_status_free(s);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}
