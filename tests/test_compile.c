//===--- test_compile.c - what a compile keeps between kernels --------------===//
//
// A jit_context keeps MLIR contexts between its CPU compiles, with the pass managers
// and the LLVM target machine built in each (lowering/mlir_context.c). A kernel
// compiled after others in such a context must be the kernel a fresh context makes:
// the final LLVM IR is compared as text (the kernel's name aside, which carries the
// key). Also: JITML_LOG=debug's compile line lists the steps and their times; and
// identical loop nests of one kernel (q, k and v) are compiled once, with results equal
// to plain C's.
//
//===----------------------------------------------------------------------===//
#define _XOPEN_SOURCE 700  // nftw, mkdtemp, popen
#include <ftw.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util.h"

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(path);
}

// A context that compiles every kernel (no disk cache) for `threads` threads, dumping
// each stage into `dump_dir` (may be NULL) and sending its log to fn(user).
static jit_context *ctx_for(int threads, const char *dump_dir, jit_log_fn fn,
                            void *user) {
  jit_options o;
  jit_options_init(&o);
  o.num_threads = threads;
  o.cache_dir = "";
  o.dump_ir_dir = dump_dir;
  o.log_fn = fn;
  o.log_user_data = user;
  o.log_level = JIT_LOG_DEBUG;
  jit_context *ctx = NULL;
  TU_OK(jit_context_create(&o, &ctx));
  return ctx;
}

// Compiles and runs gelu(x W + b) (gelu = 1) or x W for M x K x N, checked against the
// plain C reference.
static void dense(jit_context *ctx, int64_t M, int64_t K, int64_t N, int gelu) {
  jit_graph *g = tu_graph(ctx, gelu ? "dense_gelu" : "matmul");
  int64_t sx[2] = {M, K}, sw[2] = {K, N}, sb[1] = {N}, sy[2] = {M, N};
  jit_value xv = jit_input(g, "x", TU_F32, 2, sx);  // inputs in argument order
  jit_value y = jit_matmul(g, xv, jit_input(g, "w", TU_F32, 2, sw));
  if (gelu) y = jit_gelu(g, jit_add(g, y, jit_input(g, "b", TU_F32, 1, sb)));
  jit_output(g, y);
  TU_OK(jit_graph_finalize(g));
  float *x = tu_malloc(sizeof(float) * (size_t)(M * K));
  float *w = tu_malloc(sizeof(float) * (size_t)(K * N));
  float *b = tu_malloc(sizeof(float) * (size_t)N);
  float *want = tu_malloc(sizeof(float) * (size_t)(M * N));
  ref_rng rng;
  ref_rng_seed(&rng, (uint64_t)(M * 1000003 + K * 1009 + N));
  ref_rng_fill_signed(&rng, x, M * K);
  ref_rng_fill_signed(&rng, w, K * N);
  ref_rng_fill_signed(&rng, b, N);
  int64_t dc[2];
  cr_assert(ref_matmul(x, 2, sx, w, 2, sw, want, dc) == 2);
  for (int64_t i = 0; i < M * N && gelu; i++)
    want[i] = (float)ref_unary_scalar(REF_GELU, (double)want[i] + b[i % N]);
  DLTensor ins[3] = {tu_tensor(x, TU_F32, 2, sx), tu_tensor(w, TU_F32, 2, sw),
                     tu_tensor(b, TU_F32, 1, sb)};
  tu_run_check(g, ins, gelu ? 3 : 2, TU_F32, 2, sy, want, 1e-5, 2e-6 * (double)K, NULL,
               "dense");
  jit_graph_destroy(g);
  free(x);
  free(w);
  free(b);
  free(want);
}

// The text of `path`; malloc'ed, NUL-terminated.
static char *read_text(const char *path) {
  FILE *f = fopen(path, "rb");
  cr_assert(f != NULL, "cannot open %s", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = tu_malloc((size_t)n + 1);
  cr_assert(fread(s, 1, (size_t)n, f) == (size_t)n);
  s[n] = 0;
  fclose(f);
  return s;
}

// The name of the one *-07-llvm-optimized.ll file in `dir`, into name.
static void optimized_ir_name(const char *dir, char *name, size_t size) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "ls %s | grep -e '-07-llvm-optimized.ll$'", dir);
  FILE *p = popen(cmd, "r");
  cr_assert(p != NULL);
  cr_assert(fgets(name, (int)size, p) != NULL, "no optimized IR dumped in %s", dir);
  name[strcspn(name, "\n")] = 0;
  char extra[256];
  cr_assert(fgets(extra, sizeof extra, p) == NULL, "%s holds more than one kernel", dir);
  pclose(p);
}

// Kernels of several shapes and strategies (rows of one, packed B with a gelu
// epilogue, masked narrow N, tiny), each compiled last in a context that compiled the
// others first (twice over: one MLIR context serves them all), against the same
// kernel from a fresh context. Kernel keys do not depend on the dump directory, so
// the file names match.
Test(compile, reused_context_compiles_the_same_kernel) {
  static const int64_t shapes[][4] = {
      {1, 768, 768, 1}, {32, 256, 384, 1}, {17, 1000, 31, 0}, {7, 13, 5, 0}};
  int n = (int)(sizeof shapes / sizeof shapes[0]);
  for (int last = 0; last < n; last++) {
    char fresh[] = "/tmp/jitml-compile-XXXXXX", reused[] = "/tmp/jitml-compile-XXXXXX";
    cr_assert(mkdtemp(fresh) != NULL && mkdtemp(reused) != NULL);
    const int64_t *s = shapes[last];
    jit_context *a = ctx_for(1, fresh, NULL, NULL);
    dense(a, s[0], s[1], s[2], (int)s[3]);
    jit_context_destroy(a);

    jit_context *b = ctx_for(1, reused, NULL, NULL);
    for (int rep = 0; rep < 2; rep++)
      for (int i = 0; i < n; i++)
        if (i != last) dense(b, shapes[i][0] + rep, shapes[i][1], shapes[i][2], (int)shapes[i][3]);
    dense(b, s[0], s[1], s[2], (int)s[3]);
    jit_context_destroy(b);

    char name[256], path[600];
    optimized_ir_name(fresh, name, sizeof name);
    snprintf(path, sizeof path, "%s/%s", fresh, name);
    char *want = read_text(path);
    snprintf(path, sizeof path, "%s/%s", reused, name);
    char *got = read_text(path);
    cr_expect(strcmp(want, got) == 0,
              "%ldx%ldx%ld: the kernel compiled after others differs from a fresh "
              "context's (%s)", (long)s[0], (long)s[1], (long)s[2], name);
    free(want);
    free(got);
    nftw(fresh, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
    nftw(reused, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
  }
}

typedef struct log_sink {
  char text[8192];
  size_t len;
} log_sink;

static void collect(void *user, jit_log_level level, const char *msg) {
  (void)level;
  log_sink *s = user;
  size_t n = strlen(msg);
  if (s->len + n + 2 > sizeof s->text) return;
  memcpy(s->text + s->len, msg, n);
  s->len += n;
  s->text[s->len++] = '\n';
  s->text[s->len] = 0;
}

// The debug line of a compile names its steps with their times, from the emitted
// MLIR's parse to the translation to LLVM IR.
Test(compile, debug_log_lists_the_steps) {
  log_sink sink = {{0}, 0};
  jit_context *ctx = ctx_for(1, NULL, collect, &sink);
  dense(ctx, 9, 64, 48, 1);
  jit_context_destroy(ctx);
  const char *line = strstr(sink.text, "compiled in");
  cr_assert(line != NULL, "no compile line in the log:\n%s", sink.text);
  static const char *const steps[] = {"(steps, ms: emit+parse ", ", fusion ", ", plan ",
                                      ", tiling ", ", bufferize ", ", to LLVM dialect ",
                                      ", translate "};
  const char *at = line;
  for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
    const char *p = strstr(at, steps[i]);
    cr_expect(p != NULL, "step `%s` missing or out of order in: %s", steps[i], line);
    if (p) {
      double ms = -1;
      cr_expect(sscanf(p + strlen(steps[i]), "%lf", &ms) == 1 && ms >= 0,
                "step `%s` has no time: %s", steps[i], line);
      at = p;
    }
  }
}

//===--- Identical loop nests ----------------------------------------------===//

// Compiles q, k, v = x W_i + b_i (three outputs, x M x K) for `threads` under `policy`
// (GENERIC: M symbolic, bound to `M`), checks each against plain C, and returns the
// loop nests the compile shared (its debug line's "shared N" step; 0 when none).
static int projections(int threads, jit_shape_policy policy, int64_t M, int64_t K,
                       int64_t N) {
  log_sink sink = {{0}, 0};
  jit_context *ctx = ctx_for(threads, NULL, collect, &sink);
  jit_graph *g = tu_graph(ctx, "qkv");
  TU_OK(jit_graph_set_shape_policy(g, policy));
  int64_t sx[2] = {policy == JIT_SHAPE_POLICY_GENERIC ? jit_symbol(g, "M") : M, K};
  int64_t sw[2] = {K, N}, sb[1] = {N}, sy[2] = {M, N};
  jit_value x = jit_input(g, "x", TU_F32, 2, sx);
  for (int i = 0; i < 3; i++) {
    char wn[4] = {'w', (char)('0' + i), 0}, bn[4] = {'b', (char)('0' + i), 0};
    jit_value w = jit_input(g, wn, TU_F32, 2, sw), b = jit_input(g, bn, TU_F32, 1, sb);
    jit_output(g, jit_add(g, jit_matmul(g, x, w), b));
  }
  TU_OK(jit_graph_finalize(g));
  ref_rng rng;
  ref_rng_seed(&rng, (uint64_t)(M * 1000003 + K * 1009 + N));
  float *in[7], *got[3], *want[3];
  int64_t sx_run[2] = {M, K};
  DLTensor ins[7], outs[3];
  in[0] = tu_malloc(sizeof(float) * (size_t)(M * K));
  ref_rng_fill_signed(&rng, in[0], M * K);
  ins[0] = tu_tensor(in[0], TU_F32, 2, sx_run);
  for (int i = 0; i < 3; i++) {
    in[1 + 2 * i] = tu_malloc(sizeof(float) * (size_t)(K * N));
    in[2 + 2 * i] = tu_malloc(sizeof(float) * (size_t)N);
    ref_rng_fill_signed(&rng, in[1 + 2 * i], K * N);
    ref_rng_fill_signed(&rng, in[2 + 2 * i], N);
    ins[1 + 2 * i] = tu_tensor(in[1 + 2 * i], TU_F32, 2, sw);
    ins[2 + 2 * i] = tu_tensor(in[2 + 2 * i], TU_F32, 1, sb);
    got[i] = tu_malloc(sizeof(float) * (size_t)(M * N));
    want[i] = tu_malloc(sizeof(float) * (size_t)(M * N));
    int64_t dc[2];
    cr_assert(ref_matmul(in[0], 2, sx_run, in[1 + 2 * i], 2, sw, want[i], dc) == 2);
    for (int64_t e = 0; e < M * N; e++) want[i][e] += in[2 + 2 * i][e % N];
    outs[i] = tu_tensor(got[i], TU_F32, 2, sy);
  }
  TU_OK(jit_run(g, ins, 7, outs, 3));
  for (int i = 0; i < 3; i++) {
    char what[64];
    snprintf(what, sizeof what, "projection %d of %dx%dx%d, %d threads", i, (int)M, (int)K,
             (int)N, threads);
    tu_assert_close(got[i], want[i], M * N, 1e-5, 2e-6 * (double)K, 2, sy, what);
    free(got[i]);
    free(want[i]);
  }
  for (int i = 0; i < 7; i++) free(in[i]);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
  const char *line = strstr(sink.text, "compiled in");
  cr_assert(line != NULL, "no compile line in the log:\n%s", sink.text);
  const char *step = strstr(line, ", shared ");
  int n = 0;
  if (step) cr_assert(sscanf(step + 9, "%d", &n) == 1, "no count in: %s", line);
  return n;
}

// The three projections' loop nests (each its matmul, bias and, by shape, a remainder)
// become one function called three times: shapes with 1, primes and sizes that are no
// multiple of the register tiles, one and two threads, exact and generic kernels.
Test(compile, identical_loop_nests_compile_once) {
  static const int64_t shapes[][3] = {
      {13, 257, 131}, {3, 129, 65}, {31, 67, 127}, {1, 256, 257}, {37, 300, 288}};
  for (int threads = 1; threads <= 2; threads++) {
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
      int n = projections(threads, JIT_SHAPE_POLICY_EXACT, shapes[i][0], shapes[i][1],
                          shapes[i][2]);
      cr_expect(n >= 3 && n % 3 == 0, "%dx%dx%d, %d threads: %d nests shared",
                (int)shapes[i][0], (int)shapes[i][1], (int)shapes[i][2], threads, n);
    }
    for (int64_t M = 1; M <= 41; M += 20) {
      int n = projections(threads, JIT_SHAPE_POLICY_GENERIC, M, 67, 127);
      cr_expect(n >= 3 && n % 3 == 0, "generic, M = %d, %d threads: %d nests shared",
                (int)M, threads, n);
    }
  }
}
