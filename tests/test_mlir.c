//===--- test_mlir.c - graphs from and to MLIR, IR dumps, our matmul pass ---===//
//
// Fixtures live in tests/mlir/ (JITML_TEST_MLIR_DIR). Each function runs for two
// shapes of its `?` dims against a plain-C reference; bad inputs give clean statuses;
// equal functions written differently share one kernel; IR dumps appear per stage;
// the opt_level 0 pipeline's matmul loops come from our own C pass.
//
// The disk cache is off in every context (cache_dir = ""), so compile counts are exact.
//
//===----------------------------------------------------------------------===//
#define _XOPEN_SOURCE 700  // mkdtemp, nftw

#include <criterion/criterion.h>
#include <dirent.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jitml.h"
#include "ref.h"
#include <sys/stat.h>
#include <unistd.h>
#include "util.h"

#ifndef JITML_TEST_MLIR_DIR
#error "JITML_TEST_MLIR_DIR must name tests/mlir"
#endif

//===--- Helpers ---------------------------------------------------------===//

static jit_context *make_ctx(int opt_level, const char *dump_dir) {
  jit_options o;
  jit_options_init(&o);
  o.cache_dir = "";
  o.opt_level = opt_level;
  o.dump_ir_dir = dump_dir;
  // Compile counts and dumps here are of exact kernels (test_shapes.c has the rest).
  o.shape_policy = JIT_SHAPE_POLICY_EXACT;
  jit_context *ctx = NULL;
  TU_OK(jit_context_create(&o, &ctx));
  return ctx;
}

static char *read_fixture(const char *name, size_t *len) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", JITML_TEST_MLIR_DIR, name);
  FILE *f = fopen(path, "rb");
  cr_assert(f, "cannot open fixture %s", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *text = malloc((size_t)n + 1);
  cr_assert(text);
  cr_assert(fread(text, 1, (size_t)n, f) == (size_t)n);
  text[n] = 0;
  fclose(f);
  if (len) *len = (size_t)n;
  return text;
}

static jit_graph *load(jit_context *ctx, const char *fixture, const char *entry) {
  size_t n;
  char *text = read_fixture(fixture, &n);
  jit_graph *g = NULL;
  TU_OK(jit_graph_from_mlir(ctx, text, n, entry, &g));
  free(text);
  return g;
}

static jit_status load_status(jit_context *ctx, const char *text, const char *entry) {
  jit_graph *g = NULL;
  jit_status s = jit_graph_from_mlir(ctx, text, strlen(text), entry, &g);
  cr_expect(s || g);
  if (s) cr_expect(g == NULL);
  jit_graph_destroy(g);
  return s;
}

static jit_stats stats(jit_context *ctx) {
  jit_stats st;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  TU_OK(jit_context_stats(ctx, &st));
  return st;
}

static void fill(float *x, int64_t n, uint64_t seed) {
  ref_rng r;
  ref_rng_seed(&r, seed);
  ref_rng_fill_signed(&r, x, n);
}

static void expect_close(const float *got, const float *want, int64_t n, float tol,
                         const char *what) {
  for (int64_t i = 0; i < n; i++) {
    float d = fabsf(got[i] - want[i]);
    if (!(d <= tol * (1.0f + fabsf(want[i])))) {
      cr_expect(0, "%s: element %lld is %g, want %g", what, (long long)i, got[i], want[i]);
      return;
    }
  }
}

// Runs `g` with jit_run_alloc and returns output `j` as f32 (converted from f16).
static float *run1(jit_graph *g, DLTensor *in, int n_in, int n_out, int j,
                   int64_t *out_shape, int *out_rank) {
  DLManagedTensor *outs[4] = {0};
  TU_OK(jit_run_alloc(g, in, n_in, outs, n_out));
  DLTensor *t = &outs[j]->dl_tensor;
  int64_t n = ref_numel(t->ndim, t->shape);
  float *r = malloc(sizeof(float) * (size_t)(n + 1));
  if (tu_is_f16(t->dtype))
    ref_f16_to_f32_array(t->data, r, n);
  else
    memcpy(r, t->data, sizeof(float) * (size_t)n);
  if (out_rank) *out_rank = t->ndim;
  if (out_shape) memcpy(out_shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
  for (int k = 0; k < n_out; k++) outs[k]->deleter(outs[k]);
  return r;
}

//===--- linalg on tensors -----------------------------------------------===//

static void mlp_ref(const float *x, const float *w, const float *b, int64_t n, int64_t k,
                    int64_t h, float *y) {
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < h; j++) {
      double s = 0;
      for (int64_t q = 0; q < k; q++) s += (double)x[i * k + q] * w[q * h + j];
      y[i * h + j] = tanhf((float)(s + b[j]));
    }
}

static void run_mlp(jit_graph *g, int64_t n, int64_t h) {
  const int64_t k = 16;
  float *x = malloc(sizeof(float) * n * k), *w = malloc(sizeof(float) * k * h),
        *b = malloc(sizeof(float) * h), *want = malloc(sizeof(float) * n * h);
  fill(x, n * k, 1);
  fill(w, k * h, 2);
  fill(b, h, 3);
  int64_t sx[2] = {n, k}, sw[2] = {k, h}, sb[1] = {h};
  DLTensor in[3] = {tu_tensor(x, TU_F32, 2, sx), tu_tensor(w, TU_F32, 2, sw),
                    tu_tensor(b, TU_F32, 1, sb)};
  int64_t shape[8];
  int rank;
  float *got = run1(g, in, 3, 1, 0, shape, &rank);
  cr_expect(rank == 2 && shape[0] == n && shape[1] == h);
  mlp_ref(x, w, b, n, k, h, want);
  expect_close(got, want, n * h, 1e-5f, "mlp");
  free(x), free(w), free(b), free(want), free(got);
}

Test(mlir, linalg_two_shapes) {
  jit_context *ctx = make_ctx(2, NULL);
  jit_graph *g = load(ctx, "linalg_mlp.mlir", NULL);
  cr_expect(jit_graph_num_inputs(g) == 3 && jit_graph_num_outputs(g) == 1);
  jit_input_info info;
  TU_OK(jit_graph_input_info(g, 0, &info));
  cr_expect_str_eq(info.name, "x");
  cr_expect(info.rank == 2 && info.dims[1] == 16);
  cr_expect_str_eq(jit_symbol_name(g, info.dims[0]), "N");
  // Result types say rank and static sizes; their `?` dims are known per binding only.
  jit_output_info out;
  TU_OK(jit_graph_output_info(g, 0, &out));
  cr_expect(out.rank == 2 && out.dtype.code == kDLFloat && out.dtype.bits == 32);
  cr_expect(out.dims[0] == JIT_DIM_UNKNOWN && out.dims[1] == JIT_DIM_UNKNOWN,
            "dims %lld %lld", (long long)out.dims[0], (long long)out.dims[1]);
  run_mlp(g, 3, 5);
  run_mlp(g, 17, 33);
  run_mlp(g, 3, 5);
  jit_stats st = stats(ctx);
  cr_expect(st.compiles == 2, "compiles = %llu", (unsigned long long)st.compiles);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(mlir, linalg_opt0) {
  jit_context *ctx = make_ctx(0, NULL);
  jit_graph *g = load(ctx, "linalg_mlp.mlir", "forward");
  run_mlp(g, 2, 3);
  run_mlp(g, 9, 7);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(mlir, renamed_function_same_kernel) {
  jit_context *ctx = make_ctx(2, NULL);
  jit_graph *a = load(ctx, "linalg_mlp.mlir", NULL);
  jit_graph *b = load(ctx, "linalg_mlp_renamed.mlir", "other_name");
  run_mlp(a, 4, 6);
  uint64_t compiles = stats(ctx).compiles;
  run_mlp(b, 4, 6);
  cr_expect(stats(ctx).compiles == compiles, "the renamed function compiled again");
  run_mlp(b, 5, 6);
  cr_expect(stats(ctx).compiles == compiles + 1);
  jit_graph_destroy(a);
  jit_graph_destroy(b);
  jit_context_destroy(ctx);
}

// exp(x + y^T) and row sums of x, in f16.
static void run_named(jit_graph *g, int64_t n, int64_t m) {
  float *x = malloc(sizeof(float) * n * m), *y = malloc(sizeof(float) * n * m);
  fill(x, n * m, 5);
  fill(y, n * m, 6);
  ref_round_f16_array(x, n * m);
  ref_round_f16_array(y, n * m);
  uint16_t *x16 = malloc(2 * n * m), *y16 = malloc(2 * n * m);
  ref_f32_to_f16_array(x, x16, n * m);
  ref_f32_to_f16_array(y, y16, n * m);
  int64_t sx[2] = {n, m}, sy[2] = {m, n};
  DLTensor in[2] = {tu_tensor(x16, TU_F16, 2, sx), tu_tensor(y16, TU_F16, 2, sy)};
  float *e = run1(g, in, 2, 2, 0, NULL, NULL), *r = run1(g, in, 2, 2, 1, NULL, NULL);
  float *we = malloc(sizeof(float) * n * m), *wr = malloc(sizeof(float) * n);
  for (int64_t i = 0; i < n; i++) {
    double s = 0;
    for (int64_t j = 0; j < m; j++) {
      we[i * m + j] = expf(x[i * m + j] + y[j * n + i]);
      s += x[i * m + j];
    }
    wr[i] = (float)s;
  }
  expect_close(e, we, n * m, 4e-3f, "exp(x + y^T) f16");
  expect_close(r, wr, n, 2e-2f, "row sums f16");
  free(x), free(y), free(x16), free(y16), free(e), free(r), free(we), free(wr);
}

//===--- IR dumps --------------------------------------------------------===//

static char g_dir[256];

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(path);
}

static void make_dir(void) {
  snprintf(g_dir, sizeof g_dir, "/tmp/jitml-test-mlir-XXXXXX");
  cr_assert(mkdtemp(g_dir));
}

static void remove_dir(void) {
  if (g_dir[0]) nftw(g_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

// The contents of the dump file whose name ends with `suffix` (malloc'ed), or NULL.
static char *dump_file(const char *suffix) {
  DIR *d = opendir(g_dir);
  cr_assert(d);
  char *found = NULL;
  for (struct dirent *e; (e = readdir(d)) && !found;) {
    size_t n = strlen(e->d_name), m = strlen(suffix);
    if (n < m || strcmp(e->d_name + n - m, suffix)) continue;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", g_dir, e->d_name);
    FILE *f = fopen(path, "rb");
    cr_assert(f);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    found = calloc(1, (size_t)len + 1);
    cr_assert(fread(found, 1, (size_t)len, f) == (size_t)len);
    fclose(f);
  }
  closedir(d);
  return found;
}

static void expect_dump(const char *suffix, const char *needle, bool present) {
  char *t = dump_file(suffix);
  cr_expect(t != NULL, "no dump file *%s", suffix);
  if (!t) return;
  cr_expect((strstr(t, needle) != NULL) == present, "%s %s `%s`", suffix,
            present ? "lacks" : "still has", needle);
  free(t);
}

// The named ops become linalg.generic before fusion (compile_cpu.c): transpose, add and
// exp fused into one planned, vectorized op instead of three unplanned scalar loop
// nests, and f16 exp computed inline in f32 rather than by libm per lane (1024^2: 7.3
// ms -> 0.86).
Test(mlir, linalg_named_ops_f16, .init = make_dir, .fini = remove_dir) {
  jit_context *ctx = make_ctx(2, g_dir);
  jit_graph *g = load(ctx, "linalg_named.mlir", NULL);
  run_named(g, 40, 33);
  expect_dump("-02-fused.mlir", "linalg.exp", false);
  expect_dump("-02-fused.mlir", "linalg.transpose", false);
  expect_dump("-03-transform-script.mlir", "jit_ew = 0", true);
  expect_dump("-07-llvm-optimized.ll", "@llvm.exp.", false);
  run_named(g, 3, 5);
  run_named(g, 8, 2);
  // y must be x's transpose in shape: the body says so, the signature does not.
  uint16_t buf[64] = {0};
  int64_t sx[2] = {3, 5}, sy[2] = {3, 5};
  DLTensor in[2] = {tu_tensor(buf, TU_F16, 2, sx), tu_tensor(buf + 16, TU_F16, 2, sy)};
  int rank;
  int64_t dims[8];
  jit_status s = jit_output_shape(g, in, 2, 0, &rank, dims);
  TU_EXPECT_CODE(s, JIT_SHAPE_MISMATCH);
  jit_status_free(s);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

//===--- TOSA ------------------------------------------------------------===//

static void tosa_ref(const float *a, const float *w, const float *bias, int64_t B,
                     int64_t M, float *out) {
  const int64_t K = 8, N = 4;
  float *sm = malloc(sizeof(float) * B * M * N);
  for (int64_t b = 0; b < B; b++)
    for (int64_t i = 0; i < M; i++) {
      float row[4], mx = -INFINITY;
      for (int64_t j = 0; j < N; j++) {
        double s = 0;
        for (int64_t k = 0; k < K; k++)
          s += (double)a[(b * M + i) * K + k] * w[(b * K + k) * N + j];
        float v = (float)s + bias[j];
        row[j] = v > 0 ? v : 0;
        if (row[j] > mx) mx = row[j];
      }
      double sum = 0;
      for (int64_t j = 0; j < N; j++) sum += row[j] = expf(row[j] - mx);
      for (int64_t j = 0; j < N; j++) sm[(b * M + i) * N + j] = row[j] * (float)(1.0 / sum);
    }
  // transpose [B, M, N] -> [B, N, M], flatten, tanh
  int64_t o = 0;
  for (int64_t b = 0; b < B; b++)
    for (int64_t j = 0; j < N; j++)
      for (int64_t i = 0; i < M; i++) out[o++] = tanhf(sm[(b * M + i) * N + j]);
  free(sm);
}

static void run_tosa(jit_graph *g, int64_t B, int64_t M) {
  float *a = malloc(sizeof(float) * B * M * 8), *w = malloc(sizeof(float) * B * 8 * 4),
        bias[4], *want = malloc(sizeof(float) * B * M * 4);
  fill(a, B * M * 8, 7);
  fill(w, B * 8 * 4, 8);
  fill(bias, 4, 9);
  int64_t sa[3] = {B, M, 8}, sw[3] = {B, 8, 4}, sb[3] = {1, 1, 4};
  DLTensor in[3] = {tu_tensor(a, TU_F32, 3, sa), tu_tensor(w, TU_F32, 3, sw),
                    tu_tensor(bias, TU_F32, 3, sb)};
  int64_t shape[8];
  int rank;
  float *got = run1(g, in, 3, 1, 0, shape, &rank);
  cr_expect(rank == 2 && shape[0] == B * M && shape[1] == 4, "shape %lldx%lld",
            (long long)shape[0], (long long)shape[1]);
  tosa_ref(a, w, bias, B, M, want);
  expect_close(got, want, B * M * 4, 1e-5f, "tosa block");
  free(a), free(w), free(want), free(got);
}

Test(mlir, tosa_two_shapes) {
  jit_context *ctx = make_ctx(2, NULL);
  jit_graph *g = load(ctx, "tosa_block.mlir", "block");
  run_tosa(g, 1, 3);
  run_tosa(g, 2, 5);
  cr_expect(stats(ctx).compiles == 2);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// arith/math ops on whole tensors become linalg before bufferization.
Test(mlir, elementwise_on_whole_tensors) {
  jit_context *ctx = make_ctx(2, NULL);
  jit_graph *g = load(ctx, "elementwise_tensors.mlir", NULL);
  int64_t rows[3] = {1, 13, 64};
  for (int r = 0; r < 3; r++) {
    int64_t n = rows[r] * 7, sh[2] = {rows[r], 7};
    float *a = malloc(sizeof(float) * (size_t)n), *b = malloc(sizeof(float) * (size_t)n);
    float *want = malloc(sizeof(float) * (size_t)n);
    fill(a, n, 30 + r);
    fill(b, n, 40 + r);
    for (int64_t i = 0; i < n; i++)
      want[i] = expf(a[i] + b[i]) * tanhf(a[i]) - b[i];
    DLTensor in[2] = {tu_tensor(a, TU_F32, 2, sh), tu_tensor(b, TU_F32, 2, sh)};
    int64_t os[8];
    int rank;
    float *got = run1(g, in, 2, 1, 0, os, &rank);
    cr_expect(rank == 2 && os[0] == rows[r] && os[1] == 7);
    expect_close(got, want, n, 1e-5f, "elementwise on tensors");
    free(a), free(b), free(want), free(got);
  }
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

//===--- Shapes: reshape, concat, outer ----------------------------------===//

Test(mlir, expand_collapse_shape) {
  jit_context *ctx = make_ctx(2, NULL);
  jit_graph *g = load(ctx, "shapes.mlir", "reshape");
  for (int64_t n = 1; n <= 7; n += 6) {
    float *x = malloc(sizeof(float) * n * 6);
    fill(x, n * 6, 10);
    int64_t sx[2] = {n, 6}, shape[8];
    int rank;
    DLTensor in = tu_tensor(x, TU_F32, 2, sx);
    float *y = run1(g, &in, 1, 1, 0, shape, &rank);
    cr_expect(rank == 2 && shape[0] == 2 * n && shape[1] == 3);
    expect_close(y, x, n * 6, 0, "reshape");
    free(x), free(y);
  }
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(mlir, output_dims_from_two_inputs) {
  jit_context *ctx = make_ctx(2, NULL);
  jit_graph *cat = load(ctx, "shapes.mlir", "concat");
  jit_graph *outer = load(ctx, "shapes.mlir", "outer");
  int64_t sizes[2][2] = {{2, 3}, {5, 1}};
  for (int t = 0; t < 2; t++) {
    int64_t n = sizes[t][0], m = sizes[t][1];
    float *a = malloc(sizeof(float) * n * 4), *b = malloc(sizeof(float) * m * 4);
    fill(a, n * 4, 11);
    fill(b, m * 4, 12);
    int64_t sa[2] = {n, 4}, sb[2] = {m, 4}, shape[8];
    int rank;
    DLTensor in[2] = {tu_tensor(a, TU_F32, 2, sa), tu_tensor(b, TU_F32, 2, sb)};
    float *r = run1(cat, in, 2, 1, 0, shape, &rank);
    cr_expect(rank == 2 && shape[0] == n + m && shape[1] == 4);
    expect_close(r, a, n * 4, 0, "concat a");
    expect_close(r + n * 4, b, m * 4, 0, "concat b");
    free(r);

    int64_t s1[1] = {n}, s2[1] = {m};
    DLTensor in2[2] = {tu_tensor(a, TU_F32, 1, s1), tu_tensor(b, TU_F32, 1, s2)};
    float *o = run1(outer, in2, 2, 1, 0, shape, &rank);
    cr_expect(rank == 2 && shape[0] == n && shape[1] == m);
    float *want = malloc(sizeof(float) * n * m);
    for (int64_t i = 0; i < n; i++)
      for (int64_t j = 0; j < m; j++) want[i * m + j] = a[i] * b[j];
    expect_close(o, want, n * m, 1e-6f, "outer");
    free(o), free(want), free(a), free(b);
  }
  jit_graph_destroy(cat);
  jit_graph_destroy(outer);
  jit_context_destroy(ctx);
}

//===--- Bad inputs ------------------------------------------------------===//

Test(mlir, malformed_text_has_line_col) {
  jit_context *ctx = make_ctx(2, NULL);
  size_t n;
  char *text = read_fixture("malformed.mlir", &n);
  jit_graph *g = NULL;
  jit_status s = jit_graph_from_mlir(ctx, text, n, NULL, &g);
  TU_EXPECT_CODE(s, JIT_PARSE_ERROR);
  TU_EXPECT_MSG(s, "<input>:3:");
  TU_EXPECT_MSG(s, "error:");
  TU_EXPECT_MSG(s, "undeclared");
  jit_status_free(s);
  free(text);
  // From a file, the file's name is in the message.
  char path[1024];
  snprintf(path, sizeof path, "%s/malformed.mlir", JITML_TEST_MLIR_DIR);
  s = jit_graph_from_mlir_file(ctx, path, NULL, &g);
  TU_EXPECT_CODE(s, JIT_PARSE_ERROR);
  TU_EXPECT_MSG(s, "malformed.mlir:3:");
  cr_expect(g == NULL);
  jit_status_free(s);
  s = jit_graph_from_mlir_file(ctx, "/nonexistent/x.mlir", NULL, &g);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  jit_status_free(s);
  jit_context_destroy(ctx);
}

// Files that are not regular files are refused at once, without reading them: a
// device that never ends (/dev/zero), a FIFO that no one writes (an open or read of it
// would block forever), a directory. Text over the limit is refused before parsing.
Test(mlir, files_that_are_not_regular_files_are_refused, .timeout = 60) {
  jit_context *ctx = make_ctx(2, NULL);
  jit_graph *g = NULL;
  char dir[] = "/tmp/jitml-test-mlir-XXXXXX", fifo[64];
  cr_assert(mkdtemp(dir));
  snprintf(fifo, sizeof fifo, "%s/model.mlir", dir);
  cr_assert(mkfifo(fifo, 0600) == 0);
  const struct {
    const char *path, *says;
  } cases[] = {{"/dev/zero", "character device"}, {fifo, "FIFO"}, {dir, "directory"}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    jit_status s = jit_graph_from_mlir_file(ctx, cases[i].path, NULL, &g);
    TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
    TU_EXPECT_MSG(s, cases[i].path);
    TU_EXPECT_MSG(s, cases[i].says);
    cr_expect(g == NULL);
    jit_status_free(s);
  }
  unlink(fifo);
  rmdir(dir);
  // Over 256 MiB (the length is checked before the text is read).
  static const char tiny[] = "module {}";
  jit_status s = jit_graph_from_mlir(ctx, tiny, (size_t)(257u << 20), NULL, &g);
  TU_EXPECT_CODE(s, JIT_RESOURCE_EXHAUSTED);
  TU_EXPECT_MSG(s, "limit");
  jit_status_free(s);
  jit_context_destroy(ctx);
}

Test(mlir, missing_entry_lists_functions) {
  jit_context *ctx = make_ctx(2, NULL);
  size_t n;
  char *text = read_fixture("shapes.mlir", &n);
  jit_graph *g = NULL;
  jit_status s = jit_graph_from_mlir(ctx, text, n, "nope", &g);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  TU_EXPECT_MSG(s, "nope");
  TU_EXPECT_MSG(s, "@concat");
  jit_status_free(s);
  free(text);
  s = load_status(ctx, "module {}", NULL);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  jit_status_free(s);
  jit_context_destroy(ctx);
}

Test(mlir, non_tensor_argument) {
  jit_context *ctx = make_ctx(2, NULL);
  jit_status s = load_status(ctx,
                             "func.func @f(%x: tensor<?xf32>, %alpha: f32) -> tensor<?xf32> {\n"
                             "  return %x : tensor<?xf32>\n}\n",
                             NULL);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  TU_EXPECT_MSG(s, "alpha");
  jit_status_free(s);
  s = load_status(ctx,
                  "func.func @f(%x: tensor<?xi16>) -> tensor<?xi16> {\n"
                  "  return %x : tensor<?xi16>\n}\n",
                  NULL);
  TU_EXPECT_CODE(s, JIT_UNSUPPORTED);
  TU_EXPECT_MSG(s, "i16");
  jit_status_free(s);
  jit_context_destroy(ctx);
}

Test(mlir, unsupported_op_is_named) {
  jit_context *ctx = make_ctx(2, NULL);
  jit_status s = load_status(
      ctx,
      "func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {\n"
      "  %c0 = arith.constant 0 : index\n  %c4 = arith.constant 4 : index\n"
      "  %c1 = arith.constant 1 : index\n"
      "  %r = scf.for %i = %c0 to %c4 step %c1 iter_args(%a = %x) -> tensor<4xf32> {\n"
      "    scf.yield %a : tensor<4xf32>\n  }\n"
      "  return %r : tensor<4xf32>\n}\n",
      NULL);
  TU_EXPECT_CODE(s, JIT_UNSUPPORTED);
  TU_EXPECT_MSG(s, "scf.for");
  TU_EXPECT_MSG(s, "<input>:5:");
  jit_status_free(s);
  // An op no dialect knows is a parse error that names it.
  s = load_status(ctx,
                  "func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {\n"
                  "  %y = mystery.op %x : tensor<4xf32>\n  return %y : tensor<4xf32>\n}\n",
                  NULL);
  TU_EXPECT_CODE(s, JIT_PARSE_ERROR);
  TU_EXPECT_MSG(s, "mystery");
  jit_status_free(s);
  jit_context_destroy(ctx);
}

Test(mlir, shape_that_cannot_be_static) {
  jit_context *ctx = make_ctx(2, NULL);
  const char *text =
      "func.func @f(%x: tensor<2xf32>) -> tensor<?xf32> {\n"
      "  %c0 = arith.constant 0 : index\n"
      "  %v = tensor.extract %x[%c0] : tensor<2xf32>\n"
      "  %i = arith.fptosi %v : f32 to i64\n"
      "  %n = arith.index_cast %i : i64 to index\n"
      "  %e = tensor.empty(%n) : tensor<?xf32>\n"
      "  return %e : tensor<?xf32>\n}\n";
  jit_graph *g = NULL;
  TU_OK(jit_graph_from_mlir(ctx, text, strlen(text), NULL, &g));
  float x[2] = {3, 4};
  int64_t sx[1] = {2}, dims[8];
  int rank;
  DLTensor in = tu_tensor(x, TU_F32, 1, sx);
  jit_status s = jit_output_shape(g, &in, 1, 0, &rank, dims);
  TU_EXPECT_CODE(s, JIT_UNSUPPORTED);
  TU_EXPECT_MSG(s, "cannot make");
  TU_EXPECT_MSG(s, "<input>:");
  jit_status_free(s);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(mlir, inputs_violating_static_and_named_dims) {
  jit_context *ctx = make_ctx(2, NULL);
  jit_graph *g = load(ctx, "linalg_mlp.mlir", NULL);
  float buf[4096] = {0};
  // x's second dim is static 16.
  int64_t sx[2] = {3, 15}, sw[2] = {16, 5}, sb[1] = {5};
  DLTensor in[3] = {tu_tensor(buf, TU_F32, 2, sx), tu_tensor(buf + 1024, TU_F32, 2, sw),
                    tu_tensor(buf + 2048, TU_F32, 1, sb)};
  DLManagedTensor *out[1];
  jit_status s = jit_run_alloc(g, in, 3, out, 1);
  TU_EXPECT_CODE(s, JIT_SHAPE_MISMATCH);
  TU_EXPECT_MSG(s, "16");
  jit_status_free(s);
  // H names w's dim 1 and b's dim 0: they must agree.
  sx[1] = 16;
  sb[0] = 6;
  s = jit_run_alloc(g, in, 3, out, 1);
  TU_EXPECT_CODE(s, JIT_SHAPE_MISMATCH);
  TU_EXPECT_MSG(s, "H");
  jit_status_free(s);
  cr_expect(stats(ctx).compiles == 0);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(mlir, garbage_10mb) {
  jit_context *ctx = make_ctx(2, NULL);
  size_t n = 10u << 20;
  char *text = malloc(n);
  ref_rng r;
  ref_rng_seed(&r, 42);
  for (size_t i = 0; i < n; i++) text[i] = (char)(ref_rng_unit(&r) * 256);
  jit_graph *g = NULL;
  jit_status s = jit_graph_from_mlir(ctx, text, n, NULL, &g);
  TU_EXPECT_CODE(s, JIT_PARSE_ERROR);
  cr_expect(g == NULL);
  jit_status_free(s);
  // Printable garbage and deep nesting too.
  for (size_t i = 0; i < n; i++) text[i] = (char)(' ' + (int)(ref_rng_unit(&r) * 94));
  s = jit_graph_from_mlir(ctx, text, n, NULL, &g);
  TU_EXPECT_CODE(s, JIT_PARSE_ERROR);
  jit_status_free(s);
  memset(text, '(', n);
  s = jit_graph_from_mlir(ctx, text, n, NULL, &g);
  TU_EXPECT_CODE(s, JIT_PARSE_ERROR);
  jit_status_free(s);
  free(text);
  jit_context_destroy(ctx);
}

// Texts that took the process down inside MLIR's parser or a verifier (stack
// overflow, a negative index) are refused first, at their line and column; texts just
// under the limits still parse.
static char *repeat_text(const char *head, const char *unit, int times, const char *mid,
                         const char *unit2, int times2, const char *tail) {
  size_t n = strlen(head) + strlen(unit) * (size_t)times + strlen(mid) +
             strlen(unit2) * (size_t)times2 + strlen(tail) + 1;
  char *t = malloc(n), *p = t;
  p += sprintf(p, "%s", head);
  for (int i = 0; i < times; i++) p += sprintf(p, "%s", unit);
  p += sprintf(p, "%s", mid);
  for (int i = 0; i < times2; i++) p += sprintf(p, "%s", unit2);
  sprintf(p, "%s", tail);
  return t;
}

// A malloc'ed copy of the `n` bytes at `text` (NULs included) and a NUL after them.
static char *copy_text(const char *text, size_t n) {
  char *t = malloc(n + 1);
  memcpy(t, text, n);
  t[n] = '\0';
  return t;
}

// Imports the `n` bytes at `text` (malloc'ed, freed here) and expects `code` and a
// message containing `msg`.
static void expect_from_mlir_n(jit_context *ctx, char *text, size_t n, jit_status_code code,
                               const char *msg) {
  jit_graph *g = NULL;
  jit_status s = jit_graph_from_mlir(ctx, text, n, NULL, &g);
  if (code == JIT_OK) cr_expect(s == NULL, "%s", s ? jit_status_message(s) : "");
  else TU_EXPECT_CODE(s, code);
  if (msg) TU_EXPECT_MSG(s, msg);
  jit_status_free(s);
  jit_graph_destroy(g);
  free(text);
}

static void expect_from_mlir(jit_context *ctx, char *text, jit_status_code code,
                             const char *msg) {
  expect_from_mlir_n(ctx, text, strlen(text), code, msg);
}

Test(mlir, parser_crashers_are_refused) {
  jit_context *ctx = make_ctx(2, NULL);
  const char *fn = "func.func @f(%a: ";
  const char *body = ") -> tensor<2xf32> { %c = arith.constant dense<1.0> : tensor<2xf32>\n"
                     "  return %c : tensor<2xf32>\n}\n";
  expect_from_mlir(ctx, repeat_text(fn, "tuple<", 100000, "f32", ">", 100000, body),
                   JIT_PARSE_ERROR, "nested deeper than 256");
  expect_from_mlir(ctx, repeat_text(fn, "complex<", 100000, "f32", ">", 100000, body),
                   JIT_PARSE_ERROR, "1:");
  // 250 levels parse (and the argument type is then refused for what it is).
  expect_from_mlir(ctx, repeat_text(fn, "tuple<", 250, "f32", ">", 250, body),
                   JIT_INVALID_ARGUMENT, "argument 0");
  const char *map = "#m = affine_map<(d0) -> (";
  const char *rest = "d0)>\nfunc.func @f() -> tensor<2xf32> { %c = arith.constant "
                     "dense<1.0> : tensor<2xf32>\n  return %c : tensor<2xf32>\n}\n";
  expect_from_mlir(ctx, repeat_text(map, "-", 200000, "", "", 0, rest), JIT_PARSE_ERROR,
                   "more than 4096 operators");
  expect_from_mlir(ctx, repeat_text(map, "d0 + ", 300000, "", "", 0, rest),
                   JIT_PARSE_ERROR, "more than 4096 operators");
  expect_from_mlir(ctx, repeat_text(map, "d0 + ", 4000, "", "", 0, rest), JIT_OK, NULL);
  const char *cat = "func.func @f(%a: tensor<2x3xf32>, %b: tensor<2x3xf32>) -> "
                    "tensor<4x3xf32> {\n  %r = ";
  const char *cat_tail = " %a, %b : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<4x3xf32>\n"
                         "  return %r : tensor<4x3xf32>\n}\n";
  expect_from_mlir(ctx, repeat_text(cat, "tensor.concat dim(-1)", 1, "", "", 0, cat_tail),
                   JIT_PARSE_ERROR, "2:8: error: 'tensor.concat' op dim");
  expect_from_mlir(ctx, repeat_text(cat, "tensor.concat dim(18446744073709551615)", 1, "", "",
                                    0, cat_tail),
                   JIT_PARSE_ERROR, "'tensor.concat' op dim");
  expect_from_mlir(ctx, repeat_text(cat, "\"tensor.concat\"(%a, %b) <{dim = -1 : i64}> :", 1,
                                    " (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<4x3xf32>\n"
                                    "  return %r : tensor<4x3xf32>\n}\n", "", 0, ""),
                   JIT_PARSE_ERROR, "'tensor.concat' op dim");
  // linalg.transpose / linalg.reduce: their custom parsers crash on a permutation or
  // dimensions that is not a list (found by fuzz_mlir); the generic form's dense array
  // stays accepted.
  const char *tr = "func.func @f(%y: tensor<2x3xf32>) -> tensor<3x2xf32> {\n"
                   "  %e = tensor.empty() : tensor<3x2xf32>\n  %t = ";
  const char *tr_tail = "\n  return %t : tensor<3x2xf32>\n}\n";
  const char *tr_op = "linalg.transpose ins(%y : tensor<2x3xf32>) outs(%e : "
                      "tensor<3x2xf32>) ";
  static const char *bad_perms[] = {"permutation = 3", "permutation = ", "permutation = \"a\"",
                                    "permutation = array<i64: 1, 0>",
                                    "permutation = [1, 99999999999]", "permutation = [1, 0",
                                    "permutation = [-1, 0]"};
  for (size_t i = 0; i < sizeof bad_perms / sizeof *bad_perms; i++)
    expect_from_mlir(ctx, repeat_text(tr, tr_op, 1, bad_perms[i], "", 0, tr_tail),
                     JIT_PARSE_ERROR, "3:78: error: `permutation` / `dimensions`");
  expect_from_mlir(ctx, repeat_text(tr, tr_op, 1, "permutation = [1, 0]", "", 0, tr_tail),
                   JIT_OK, NULL);
  expect_from_mlir(ctx, repeat_text(tr, "\"linalg.transpose\"(%y, %e) <{permutation = "
                                    "array<i64: 1, 0>}> ({\n^bb0(%in: f32, %out: f32):\n"
                                    "  linalg.yield %in : f32\n}) : (tensor<2x3xf32>, "
                                    "tensor<3x2xf32>) -> tensor<3x2xf32>", 1, "", "", 0,
                                    tr_tail),
                   JIT_OK, NULL);
  const char *red = "func.func @f(%x: tensor<2x3xf32>, %a: tensor<2xf32>) -> tensor<2xf32> {\n"
                    "  %r = linalg.reduce ins(%x : tensor<2x3xf32>) outs(%a : tensor<2xf32>) ";
  const char *red_tail = "\n    (%in: f32, %init: f32) {\n      %s = arith.addf %in, %init : f32\n"
                         "      linalg.yield %s : f32\n    }\n  return %r : tensor<2xf32>\n}\n";
  expect_from_mlir(ctx, repeat_text(red, "dimensions = ", 1, "", "", 0, red_tail),
                   JIT_PARSE_ERROR, "`permutation` / `dimensions`");
  expect_from_mlir(ctx, repeat_text(red, "dimensions = [4294967296]", 1, "", "", 0, red_tail),
                   JIT_PARSE_ERROR, "`permutation` / `dimensions`");
  expect_from_mlir(ctx, repeat_text(red, "dimensions = [1]", 1, "", "", 0, red_tail), JIT_OK,
                   NULL);
  // MLIR's lexer skips NUL bytes and CRs like blanks, and an op's parts may be on
  // several lines (found by fuzz_mlir: `permutation\0= [1, 0T` crashed
  // linalg.transpose's parser; `tensor.concat\n dim(-1)` the concat verifier).
  static const char nul_perm[] = "func.func @f(%y: tensor<2x3xf32>) -> tensor<3x2xf32> {\n"
                                 "  %e = tensor.empty() : tensor<3x2xf32>\n  %t = "
                                 "linalg.transpose ins(%y : tensor<2x3xf32>) outs(%e : "
                                 "tensor<3x2xf32>) permutation\0= [1,\r\0 0T\n"
                                 "  return %t : tensor<3x2xf32>\n}\n";
  expect_from_mlir_n(ctx, copy_text(nul_perm, sizeof nul_perm - 1), sizeof nul_perm - 1,
                     JIT_PARSE_ERROR, "3:78: error: `permutation` / `dimensions`");
  static const char nul_ok[] = "func.func @f(%y: tensor<2x3xf32>) -> tensor<3x2xf32> {\n"
                               "  %e = tensor.empty() : tensor<3x2xf32>\n  %t = "
                               "linalg.transpose ins(%y : tensor<2x3xf32>) outs(%e : "
                               "tensor<3x2xf32>) permutation\0=\r [1,\0 0]\n"
                               "  return %t : tensor<3x2xf32>\n}\n";
  expect_from_mlir_n(ctx, copy_text(nul_ok, sizeof nul_ok - 1), sizeof nul_ok - 1, JIT_OK,
                     NULL);
  static const char *const concat_split[] = {"tensor.concat\n dim(-1)",
                                             "tensor.concat dim\n  (-1)",
                                             "tensor.concat dim(\r\n-1)"};
  for (size_t i = 0; i < 3; i++)
    expect_from_mlir(ctx, repeat_text(cat, concat_split[i], 1, "", "", 0, cat_tail),
                     JIT_PARSE_ERROR, "2:8: error: 'tensor.concat' op dim");
  expect_from_mlir(ctx, repeat_text(cat, "tensor.concat\n   dim(0)", 1, "", "", 0, cat_tail),
                   JIT_OK, NULL);
  jit_context_destroy(ctx);
}

// Text that need not be NUL-terminated is read within its length: an unterminated
// string at the very end (found by fuzz_mlir: the guard read one byte past it, which
// ASan reports on this exact-size buffer).
Test(mlir, text_ending_inside_a_string_is_read_within_its_length) {
  jit_context *ctx = make_ctx(2, NULL);
  static const char *texts[] = {"\"a", "\"", "x = \"tensor.concat\"", "// c", "\"a\\"};
  for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
    size_t n = strlen(texts[i]);
    char *exact = malloc(n);
    memcpy(exact, texts[i], n);
    jit_graph *g = NULL;
    jit_status s = jit_graph_from_mlir(ctx, exact, n, NULL, &g);
    // Unparsable, or (a lone comment) a module without a function.
    jit_status_code code = jit_status_get_code(s);
    cr_expect(code == JIT_PARSE_ERROR || code == JIT_INVALID_ARGUMENT, "`%s`: %s", texts[i],
              s ? jit_status_message(s) : "OK");
    jit_status_free(s);
    jit_graph_destroy(g);
    free(exact);
  }
  jit_context_destroy(ctx);
}

Test(mlir, null_arguments) {
  jit_context *ctx = make_ctx(2, NULL);
  jit_graph *g = NULL;
  jit_status s = jit_graph_from_mlir(NULL, "", 0, NULL, &g);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  jit_status_free(s);
  s = jit_graph_from_mlir(ctx, NULL, 0, NULL, &g);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  jit_status_free(s);
  s = jit_graph_to_mlir(NULL, NULL);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  jit_status_free(s);
  jit_context_destroy(ctx);
}

//===--- Round trip ------------------------------------------------------===//

Test(mlir, round_trip_imported_graph) {
  jit_context *ctx = make_ctx(2, NULL);
  jit_graph *g = load(ctx, "linalg_mlp.mlir", NULL);
  char *text = NULL;
  TU_OK(jit_graph_to_mlir(g, &text));
  cr_expect(strstr(text, "@forward") != NULL);
  cr_expect(strstr(text, "jit.dims") != NULL);
  jit_graph *g2 = NULL;
  TU_OK(jit_graph_from_mlir(ctx, text, strlen(text), NULL, &g2));
  jit_string_free(text);
  run_mlp(g, 3, 4);
  uint64_t c = stats(ctx).compiles;
  run_mlp(g2, 3, 4);
  cr_expect(stats(ctx).compiles == c, "the round trip changed the kernel key");
  jit_graph_destroy(g);
  jit_graph_destroy(g2);
  jit_context_destroy(ctx);
}

// Builds y = softmax(relu(x W + b)) summed... a graph with every kind of op.
static jit_graph *build_c_graph_with(jit_context *ctx, double scale) {
  jit_graph *g = NULL;
  TU_OK(jit_graph_create(ctx, "cgraph", &g));
  int64_t N = jit_symbol(g, "N");
  int64_t dx[2] = {N, 6}, dw[2] = {6, 5}, db[1] = {5};
  jit_value x = jit_input(g, "x", TU_F32, 2, dx);
  jit_value w = jit_input(g, "w", TU_F32, 2, dw);
  jit_value b = jit_input(g, "b", TU_F32, 1, db);
  jit_value h = jit_relu(g, jit_add(g, jit_matmul(g, x, w), b));
  jit_value s = jit_softmax(g, h, 1);
  jit_value t = jit_tanh(g, jit_mul(g, s, jit_scalar(g, scale, TU_F32)));
  int perm[2] = {1, 0};
  jit_value tr = jit_transpose(g, t, perm);
  int64_t rs[2] = {-1, N};
  jit_value r = jit_reshape(g, tr, 2, rs);
  jit_output(g, r);
  jit_output(g, jit_reduce_mean(g, h, 1, 1));
  jit_value e = jit_erf(g, jit_gelu_erf(g, jit_exp(g, jit_sub(g, x, jit_scalar(g, 1.0, TU_F32)))));
  jit_output(g, jit_reduce_max(g, e, 0, 0));
  TU_OK(jit_graph_finalize(g));
  return g;
}

static jit_graph *build_c_graph(jit_context *ctx) { return build_c_graph_with(ctx, 2.5); }

// Runs `g1` and `g2` on the same inputs (N = 2, then 9) and expects equal outputs.
static void expect_same_outputs(jit_graph *g1, jit_graph *g2) {
  for (int64_t n = 2; n <= 9; n += 7) {
    float *x = malloc(sizeof(float) * n * 6), w[30], b[5];
    fill(x, n * 6, 20);
    fill(w, 30, 21);
    fill(b, 5, 22);
    int64_t sx[2] = {n, 6}, sw[2] = {6, 5}, sb[1] = {5};
    DLTensor in[3] = {tu_tensor(x, TU_F32, 2, sx), tu_tensor(w, TU_F32, 2, sw),
                      tu_tensor(b, TU_F32, 1, sb)};
    for (int j = 0; j < 3; j++) {
      int64_t s1[8], s2[8];
      int r1, r2;
      float *o1 = run1(g1, in, 3, 3, j, s1, &r1);
      float *o2 = run1(g2, in, 3, 3, j, s2, &r2);
      cr_expect(r1 == r2 && !memcmp(s1, s2, sizeof(int64_t) * (size_t)r1));
      expect_close(o2, o1, ref_numel(r1, s1), 1e-5f, "round trip");
      free(o1), free(o2);
    }
    free(x);
  }
}

static jit_graph *from_text(jit_context *ctx, const char *text) {
  jit_graph *g = NULL;
  jit_status s = jit_graph_from_mlir(ctx, text, strlen(text), NULL, &g);
  if (s) cr_log_error("%s\n%s", jit_status_message(s), text);
  TU_OK(s);
  return g;
}

// A body that writes into an input tensor (a matmul accumulating into an argument, an
// insert_slice into one) writes into a copy: the caller's input buffers are left as
// they were, and the result is the input plus the update. At 1 and 2 threads (4x1024x
// 1024 at 2 threads is split over K, its init the argument).
static const char kWritesInputs[] =
    "func.func @acc(%x: tensor<?x?xf32>, %w: tensor<?x?xf32>, %c: tensor<?x?xf32>) -> "
    "tensor<?x?xf32> {\n"
    "  %r = linalg.matmul ins(%x, %w : tensor<?x?xf32>, tensor<?x?xf32>) outs(%c : "
    "tensor<?x?xf32>) -> tensor<?x?xf32>\n"
    "  return %r : tensor<?x?xf32>\n}\n"
    "func.func @put(%x: tensor<5x8xf32>, %y: tensor<2x8xf32>) -> tensor<5x8xf32> {\n"
    "  %r = tensor.insert_slice %y into %x[1, 0] [2, 8] [1, 1] : tensor<2x8xf32> into "
    "tensor<5x8xf32>\n"
    "  return %r : tensor<5x8xf32>\n}\n";

static void check_acc_input(int threads, int64_t M, int64_t K, int64_t N) {
  jit_options o;
  jit_options_init(&o);
  o.cache_dir = "";
  o.num_threads = threads;
  jit_context *ctx = NULL;
  TU_OK(jit_context_create(&o, &ctx));
  jit_graph *g = NULL;
  TU_OK(jit_graph_from_mlir(ctx, kWritesInputs, strlen(kWritesInputs), "acc", &g));
  int64_t sx[2] = {M, K}, sw[2] = {K, N}, sc[2] = {M, N}, dc[2];
  float *x = malloc(sizeof(float) * (size_t)(M * K)), *w = malloc(sizeof(float) * (size_t)(K * N));
  float *c = malloc(sizeof(float) * (size_t)(M * N)), *c0 = malloc(sizeof(float) * (size_t)(M * N));
  float *want = malloc(sizeof(float) * (size_t)(M * N));
  fill(x, M * K, 1);
  fill(w, K * N, 2);
  fill(c, M * N, 3);
  memcpy(c0, c, sizeof(float) * (size_t)(M * N));
  cr_assert_eq(ref_matmul(x, 2, sx, w, 2, sw, want, dc), 2);
  for (int64_t i = 0; i < M * N; i++) want[i] += c[i];
  DLTensor in[3] = {tu_tensor(x, TU_F32, 2, sx), tu_tensor(w, TU_F32, 2, sw),
                    tu_tensor(c, TU_F32, 2, sc)};
  float *got = run1(g, in, 3, 1, 0, NULL, NULL);
  char what[96];
  snprintf(what, sizeof what, "c + x w, %lldx%lldx%lld threads=%d", (long long)M,
           (long long)K, (long long)N, threads);
  // f32 sums of K products of ~1 (the reference sums in double).
  expect_close(got, want, M * N, K > 256 ? 1e-4f : 1e-5f, what);
  cr_expect(memcmp(c, c0, sizeof(float) * (size_t)(M * N)) == 0, "%s: input c was written",
            what);
  free(x), free(w), free(c), free(c0), free(want), free(got);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(mlir, inputs_are_never_written) {
  check_acc_input(1, 5, 37, 19);
  check_acc_input(1, 300, 200, 130);
  check_acc_input(2, 4, 1024, 1024);
  check_acc_input(2, 1, 1024, 768);
  jit_context *ctx = make_ctx(2, NULL);
  jit_graph *g = NULL;
  TU_OK(jit_graph_from_mlir(ctx, kWritesInputs, strlen(kWritesInputs), "put", &g));
  float x[40], x0[40], y[16], want[40];
  fill(x, 40, 4);
  fill(y, 16, 5);
  memcpy(x0, x, sizeof x);
  memcpy(want, x, sizeof x);
  memcpy(want + 8, y, sizeof y);
  int64_t sx[2] = {5, 8}, sy[2] = {2, 8};
  DLTensor in[2] = {tu_tensor(x, TU_F32, 2, sx), tu_tensor(y, TU_F32, 2, sy)};
  float *got = run1(g, in, 2, 1, 0, NULL, NULL);
  expect_close(got, want, 40, 0, "insert_slice into an input");
  cr_expect(memcmp(x, x0, sizeof x) == 0, "insert_slice: input x was written");
  free(got);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(mlir, round_trip_c_graph) {
  jit_context *ctx = make_ctx(2, NULL);
  jit_graph *g = build_c_graph(ctx);
  char *text = NULL;
  TU_OK(jit_graph_to_mlir(g, &text));
  cr_expect(strstr(text, "jit.dims") != NULL);
  cr_expect(strstr(text, "\"N\"") != NULL);
  jit_graph *g2 = from_text(ctx, text);
  // The same graph again: its symbol keeps its name, and exporting it gives the text.
  jit_input_info info;
  TU_OK(jit_graph_input_info(g2, 0, &info));
  cr_expect_str_eq(info.name, "x");
  cr_expect_str_eq(jit_symbol_name(g2, info.dims[0]), "N");
  char *text2 = NULL;
  TU_OK(jit_graph_to_mlir(g2, &text2));
  cr_expect_str_eq(text2, text);
  jit_string_free(text2);
  jit_string_free(text);
  // Same results, and the same keys: g2 never compiles what g compiled (run1 runs g
  // first for every shape and output).
  uint64_t c0 = stats(ctx).compiles;
  expect_same_outputs(g, g2);
  cr_expect(stats(ctx).compiles - c0 == 2, "%llu compiles for two shapes of two graphs "
            "that should share keys", (unsigned long long)(stats(ctx).compiles - c0));
  jit_graph_destroy(g);
  jit_graph_destroy(g2);
  jit_context_destroy(ctx);
}

// Removes the jit.graph record from an export, so from_mlir must use the body.
static void strip_record(char *text) {
  char *a = strstr(text, " attributes {jit.graph = \"");
  cr_assert(a, "no jit.graph record in:\n%s", text);
  char *end = strstr(a, "\"}");
  cr_assert(end);
  memmove(a, end + 2, strlen(end + 2) + 1);
}

// The body of a C graph's export computes what the graph does (the record removed).
Test(mlir, c_graph_export_body) {
  jit_context *ctx = make_ctx(2, NULL);
  jit_graph *g = build_c_graph(ctx);
  char *text = NULL;
  TU_OK(jit_graph_to_mlir(g, &text));
  strip_record(text);
  jit_graph *g2 = from_text(ctx, text);
  jit_string_free(text);
  expect_same_outputs(g, g2);
  jit_graph_destroy(g);
  jit_graph_destroy(g2);
  jit_context_destroy(ctx);
}

// Reshapes from and to rank 0 are written too: x[1, N] -> scalar -> [N, 1]
// (N must be 1), and sum(v) -> [1].
Test(mlir, rank0_reshapes_export) {
  jit_context *ctx = make_ctx(2, NULL);
  jit_graph *g = NULL;
  TU_OK(jit_graph_create(ctx, "r0", &g));
  int64_t N = jit_symbol(g, "N"), V = jit_symbol(g, "V");
  int64_t dx[2] = {1, N}, dv[1] = {V}, to_nx1[2] = {N, 1}, to_1[1] = {1};
  jit_value x = jit_input(g, "x", TU_F32, 2, dx);
  jit_value v = jit_input(g, "v", TU_F32, 1, dv);
  jit_value s = jit_reshape(g, x, 0, NULL);
  jit_value y = jit_reshape(g, jit_mul(g, s, jit_scalar(g, 3.0, TU_F32)), 2, to_nx1);
  jit_output(g, y);
  jit_output(g, jit_reshape(g, jit_reduce_sum(g, v, 0, 0), 1, to_1));
  TU_OK(jit_graph_finalize(g));
  char *text = NULL;
  TU_OK(jit_graph_to_mlir(g, &text));
  strip_record(text);
  jit_graph *g2 = from_text(ctx, text);
  jit_string_free(text);
  float xv[1] = {1.5f}, vv[7] = {1, 2, 3, 4, 5, 6, 7.25f};
  int64_t sx[2] = {1, 1}, sv[1] = {7};
  DLTensor in[2] = {tu_tensor(xv, TU_F32, 2, sx), tu_tensor(vv, TU_F32, 1, sv)};
  jit_graph *gs[2] = {g, g2};
  for (int k = 0; k < 2; k++) {
    int64_t sh[8];
    int r;
    float *o = run1(gs[k], in, 2, 2, 0, sh, &r);
    cr_expect(r == 2 && sh[0] == 1 && sh[1] == 1, "graph %d: output 0 rank %d", k, r);
    cr_expect(o[0] == 4.5f, "graph %d: %g", k, o[0]);
    free(o);
    o = run1(gs[k], in, 2, 2, 1, sh, &r);
    cr_expect(r == 1 && sh[0] == 1, "graph %d: output 1 rank %d", k, r);
    cr_expect(o[0] == 28.25f, "graph %d: %g", k, o[0]);
    free(o);
  }
  jit_graph_destroy(g);
  jit_graph_destroy(g2);
  jit_context_destroy(ctx);
}

// A body edited after export is used as written, whatever its jit.graph record says.
Test(mlir, round_trip_edited_body_is_not_trusted) {
  jit_context *ctx = make_ctx(2, NULL);
  jit_graph *g = build_c_graph(ctx);
  char *text = NULL;
  TU_OK(jit_graph_to_mlir(g, &text));
  char *at = strstr(text, "dense<2.5>");
  cr_assert(at, "the scalar 2.5 is not where the test expects it:\n%s", text);
  memcpy(at, "dense<3.5>", 10);
  jit_graph *edited = from_text(ctx, text);
  jit_graph *want = build_c_graph_with(ctx, 3.5);
  expect_same_outputs(want, edited);
  // And a record that is not a graph at all.
  char *rec = strstr(text, "jitml-graph-1 ");
  cr_assert(rec);
  rec[strlen("jitml-graph-1 ")] = 'z';
  jit_graph *garbled = from_text(ctx, text);
  expect_same_outputs(want, garbled);
  jit_string_free(text);
  jit_graph_destroy(g);
  jit_graph_destroy(edited);
  jit_graph_destroy(want);
  jit_graph_destroy(garbled);
  jit_context_destroy(ctx);
}

Test(mlir, ir_dumps, .init = make_dir, .fini = remove_dir) {
  jit_context *ctx = make_ctx(2, g_dir);
  jit_graph *g = load(ctx, "linalg_mlp.mlir", NULL);
  run_mlp(g, 8, 32);
  expect_dump("-00-graph.mlir", "tensor<?x16xf32>", true);
  expect_dump("-01-specialized.mlir", "linalg.matmul", true);
  expect_dump("-01-specialized.mlir", "tensor<8x16xf32>", true);
  expect_dump("-02-fused.mlir", "linalg", true);
  expect_dump("-03-tiled-vectorized.mlir", "vector", true);
  expect_dump("-04-bufferized.mlir", "memref", true);
  expect_dump("-05-llvm-dialect.mlir", "llvm.func", true);
  expect_dump("-06-llvm.ll", "define", true);
  expect_dump("-07-llvm-optimized.ll", "define", true);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// Imported linalg.batch_matmul: planned per concrete shape (a batch of 2-D matmuls,
// each tiled and vectorized), exact over a prime batch and non-multiples of the tiles.
Test(mlir, batch_matmul_is_planned, .init = make_dir, .fini = remove_dir) {
  jit_context *ctx = make_ctx(2, g_dir);
  jit_graph *g = load(ctx, "batch_matmul.mlir", NULL);
  const int64_t B = 5, M = 17, K = 70, N = 45;
  float *a = malloc(sizeof(float) * B * M * K), *b = malloc(sizeof(float) * B * K * N),
        *want = malloc(sizeof(float) * B * M * N);
  fill(a, B * M * K, 31);
  fill(b, B * K * N, 32);
  int64_t sa[3] = {B, M, K}, sb[3] = {B, K, N}, sc[8];
  cr_assert(ref_matmul(a, 3, sa, b, 3, sb, want, sc) == 3);
  DLTensor in[2] = {tu_tensor(a, TU_F32, 3, sa), tu_tensor(b, TU_F32, 3, sb)};
  int rank;
  int64_t shape[8];
  float *got = run1(g, in, 2, 1, 0, shape, &rank);
  cr_expect(rank == 3 && shape[0] == B && shape[1] == M && shape[2] == N);
  expect_close(got, want, B * M * N, 2e-6f * K, "batch_matmul 5x17x70x45");
  expect_dump("-03-transform-script.mlir", "a batch of 5", true);
  expect_dump("-04-bufferized.mlir", "vector.fma", true);
  free(a), free(b), free(want), free(got);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// x W^T from `fixture` (W stored N x K) at M x K x N: exact against loops; with a dump
// directory, the plan's comment has `needle` and the fused module has no linalg.transpose
// left (generalized, or folded into the matmul's map).
static void check_linear(jit_graph *g, int64_t M, int64_t K, int64_t N, const char *needle) {
  float *a = malloc(sizeof(float) * M * K), *w = malloc(sizeof(float) * N * K),
        *want = malloc(sizeof(float) * M * N);
  fill(a, M * K, 41 + (int)M);
  fill(w, N * K, 51 + (int)N);
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < N; j++) {
      double acc = 0;
      for (int64_t k = 0; k < K; k++) acc += (double)a[i * K + k] * w[j * K + k];
      want[i * N + j] = (float)acc;
    }
  int64_t sa[2] = {M, K}, sw[2] = {N, K};
  DLTensor in[2] = {tu_tensor(a, TU_F32, 2, sa), tu_tensor(w, TU_F32, 2, sw)};
  int rank;
  int64_t shape[8];
  if (needle) {
    remove_dir();  // this shape's dumps only
    cr_assert(mkdir(g_dir, 0700) == 0);
  }
  float *got = run1(g, in, 2, 1, 0, shape, &rank);
  cr_expect(rank == 2 && shape[0] == M && shape[1] == N);
  char what[64];
  snprintf(what, sizeof what, "x W^T %lldx%lldx%lld", (long long)M, (long long)K, (long long)N);
  expect_close(got, want, M * N, 2e-6f * (float)K, what);
  if (needle) {
    expect_dump("-03-transform-script.mlir", needle, true);
    expect_dump("-02-fused.mlir", "linalg.transpose", false);
  }
  free(a), free(w), free(want), free(got);
}

// Imported linalg.matmul with B read through (n, k): exact for small and large M (256
// rows failed to vectorize before plan_matmul_bt), odd K and N. With more than 17 rows
// it becomes a transpose of W and a plain matmul, B packed from W where B is large
// enough to pack (jit__cpu_normalize): 64x768x3072 3.3-3.4 ms -> 2.1.
Test(mlir, matmul_transposed_b, .init = make_dir, .fini = remove_dir) {
  jit_context *ctx = make_ctx(2, g_dir);
  jit_graph *g = load(ctx, "matmul_transposed_b.mlir", NULL);
  check_linear(g, 1, 768, 77, "B transposed, dot products");
  check_linear(g, 33, 100, 70, NULL);
  check_linear(g, 256, 512, 96, NULL);
  check_linear(g, 8, 256, 33, "8x256x33, B transposed, dot products");
  check_linear(g, 64, 512, 192, "64x512x192, B packed from W^T");
  check_linear(g, 19, 512, 256, "19x512x256, B packed from W^T");
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// x W^T as a linalg.transpose of W and a plain matmul (torch-mlir's nn.Linear): with up
// to 17 rows the matmul reads W through (n, k) instead of a transposed copy of W made
// per call (8x768x3072: 2.06 ms -> 0.47, the transpose having been unplanned scalar
// loops), above that B is packed from W (64x768x3072: 4.7-4.9 ms -> 2.1).
Test(mlir, linear_transpose_then_matmul, .init = make_dir, .fini = remove_dir) {
  jit_context *ctx = make_ctx(2, g_dir);
  jit_graph *g = load(ctx, "linear_transpose.mlir", NULL);
  check_linear(g, 1, 768, 77, "1x768x77, B transposed, dot products");
  check_linear(g, 8, 256, 33, "8x256x33, B transposed, dot products");
  check_linear(g, 17, 100, 70, "17x100x70, B transposed, threads");  // transposes in registers
  check_linear(g, 64, 512, 192, "64x512x192, B packed from W^T");
  check_linear(g, 37, 33, 70, NULL);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// Imported linalg.batch_matmul with B read through (b, n, k): dot products along k
// with few rows or a long K, otherwise a transpose of B planned ahead of a plain batch
// (its loops were left unplanned: 12x128x64x128 649 -> 133 us); exact either way, over
// odd N, a K that is not a whole number of vectors, and rows that are not a whole
// number of register tiles.
Test(mlir, batch_matmul_transposed_b, .init = make_dir, .fini = remove_dir) {
  jit_context *ctx = make_ctx(2, g_dir);
  jit_graph *g = load(ctx, "batch_matmul_transposed_b.mlir", NULL);
  static const int64_t shapes[][4] = {{12, 1, 64, 100}, {3, 17, 256, 45}, {4, 37, 64, 50},
                                      {12, 128, 64, 128}, {2, 70, 24, 33}};
  for (int t = 0; t < 5; t++) {
    int64_t B = shapes[t][0], M = shapes[t][1], K = shapes[t][2], N = shapes[t][3];
    float *a = malloc(sizeof(float) * B * M * K), *w = malloc(sizeof(float) * B * N * K),
          *want = malloc(sizeof(float) * B * M * N);
    fill(a, B * M * K, 61 + t);
    fill(w, B * N * K, 71 + t);
    for (int64_t b = 0; b < B; b++)
      for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
          double acc = 0;
          for (int64_t k = 0; k < K; k++)
            acc += (double)a[(b * M + i) * K + k] * w[(b * N + j) * K + k];
          want[(b * M + i) * N + j] = (float)acc;
        }
    int64_t sa[3] = {B, M, K}, sw[3] = {B, N, K};
    DLTensor in[2] = {tu_tensor(a, TU_F32, 3, sa), tu_tensor(w, TU_F32, 3, sw)};
    int rank;
    int64_t shape[8];
    remove_dir();  // this shape's dumps only
    cr_assert(mkdir(g_dir, 0700) == 0);
    float *got = run1(g, in, 2, 1, 0, shape, &rank);
    cr_expect(rank == 3 && shape[0] == B && shape[1] == M && shape[2] == N);
    expect_close(got, want, B * M * N, 2e-6f * (float)K, "q K^T");
    expect_dump("-03-transform-script.mlir", "B transposed, dot products", t < 2);
    if (t >= 2) {
      expect_dump("-03-transform-script.mlir", "matmul 0: a batch of", true);
      expect_dump("-03-tiled-vectorized.mlir", "linalg.generic", false);
    }
    free(a), free(w), free(want), free(got);
  }
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// An unwritable dump directory does not fail the compile.
Test(mlir, dump_failure_is_harmless) {
  jit_context *ctx = make_ctx(2, "/nonexistent/dir/for/dumps");
  jit_graph *g = load(ctx, "linalg_mlp.mlir", NULL);
  run_mlp(g, 2, 3);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

//===--- Our matmul-to-loops pass (opt_level 0) ----------------------------===//

static void check_matmul_loops_ir(void) {
  expect_dump("-04-bufferized.mlir", "linalg.matmul", false);
  expect_dump("-04-bufferized.mlir", "scf.for", true);
  expect_dump("-04-bufferized.mlir", "arith.mulf", true);
  expect_dump("-04-bufferized.mlir", "arith.addf", true);
  expect_dump("-01-specialized.mlir", "linalg.matmul", true);
}

static void run_c_matmul(jit_context *ctx, bool f16, int64_t m, int64_t k, int64_t n) {
  jit_graph *g = NULL;
  TU_OK(jit_graph_create(ctx, "mm", &g));
  int64_t da[2] = {jit_symbol(g, "M"), jit_symbol(g, "K")},
          db[2] = {jit_symbol(g, "K"), jit_symbol(g, "N")};
  DLDataType dt = f16 ? TU_F16 : TU_F32;
  jit_value va = jit_input(g, "a", dt, 2, da), vb = jit_input(g, "b", dt, 2, db);
  jit_output(g, jit_matmul(g, va, vb));
  TU_OK(jit_graph_finalize(g));
  float *a = malloc(sizeof(float) * m * k), *b = malloc(sizeof(float) * k * n),
        *want = malloc(sizeof(float) * m * n);
  fill(a, m * k, 30);
  fill(b, k * n, 31);
  if (f16) ref_round_f16_array(a, m * k), ref_round_f16_array(b, k * n);
  uint16_t *a16 = malloc(2 * m * k), *b16 = malloc(2 * k * n);
  ref_f32_to_f16_array(a, a16, m * k);
  ref_f32_to_f16_array(b, b16, k * n);
  int64_t sa[2] = {m, k}, sb[2] = {k, n}, dc[8];
  DLTensor in[2] = {tu_tensor(f16 ? (void *)a16 : a, dt, 2, sa),
                    tu_tensor(f16 ? (void *)b16 : b, dt, 2, sb)};
  float *got = run1(g, in, 2, 1, 0, NULL, NULL);
  ref_matmul(a, 2, sa, b, 2, sb, want, dc);
  if (f16) ref_round_f16_array(want, m * n);
  expect_close(got, want, m * n, f16 ? 2e-3f : 1e-5f, f16 ? "matmul f16" : "matmul f32");
  free(a), free(b), free(want), free(a16), free(b16), free(got);
  jit_graph_destroy(g);
}

Test(mlir, matmul_loops_pass_f32, .init = make_dir, .fini = remove_dir) {
  jit_context *ctx = make_ctx(0, g_dir);
  run_c_matmul(ctx, false, 5, 7, 3);
  check_matmul_loops_ir();
  run_c_matmul(ctx, false, 17, 33, 9);
  jit_context_destroy(ctx);
}

Test(mlir, matmul_loops_pass_f16, .init = make_dir, .fini = remove_dir) {
  jit_context *ctx = make_ctx(0, g_dir);
  run_c_matmul(ctx, true, 4, 6, 5);
  check_matmul_loops_ir();
  expect_dump("-04-bufferized.mlir", "arith.extf", true);
  jit_context_destroy(ctx);
}

// linalg.matmul entirely in f16 accumulates in f16.
Test(mlir, matmul_loops_pass_pure_f16, .init = make_dir, .fini = remove_dir) {
  jit_context *ctx = make_ctx(0, g_dir);
  jit_graph *g = load(ctx, "matmul_f16.mlir", NULL);
  for (int t = 0; t < 2; t++) {
    int64_t m = t ? 7 : 2, k = t ? 5 : 3, n = t ? 4 : 6;
    float *a = malloc(sizeof(float) * m * k), *b = malloc(sizeof(float) * k * n),
          *want = malloc(sizeof(float) * m * n);
    fill(a, m * k, 40);
    fill(b, k * n, 41);
    ref_round_f16_array(a, m * k);
    ref_round_f16_array(b, k * n);
    // Reference: each product and each partial sum rounded to f16, in k order.
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) {
        float acc = 0;
        for (int64_t q = 0; q < k; q++) {
          float p = ref_f16_to_f32(ref_f32_to_f16(a[i * k + q] * b[q * n + j]));
          acc = ref_f16_to_f32(ref_f32_to_f16(acc + p));
        }
        want[i * n + j] = acc;
      }
    uint16_t *a16 = malloc(2 * m * k), *b16 = malloc(2 * k * n);
    ref_f32_to_f16_array(a, a16, m * k);
    ref_f32_to_f16_array(b, b16, k * n);
    int64_t sa[2] = {m, k}, sb[2] = {k, n};
    DLTensor in[2] = {tu_tensor(a16, TU_F16, 2, sa), tu_tensor(b16, TU_F16, 2, sb)};
    float *got = run1(g, in, 2, 1, 0, NULL, NULL);
    expect_close(got, want, m * n, 1e-3f, "pure f16 matmul");
    free(a), free(b), free(want), free(a16), free(b16), free(got);
  }
  check_matmul_loops_ir();
  expect_dump("-04-bufferized.mlir", "arith.extf", false);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}
