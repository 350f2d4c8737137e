//===--- test_errors.c - misuse and bad input give a status, never a crash -===//
//
// Each case checks the status code and that the message says where: the input's
// index and/or name, the dim, the sizes. Builder errors are sticky and come back from
// jit_graph_finalize. Everything is freed, also on the error paths (LSan runs these).
//
//===----------------------------------------------------------------------===//
#define _POSIX_C_SOURCE 200809L  // setenv
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jitml.h"
#include "util.h"

// True if the message names input/output `index` by `name` or by its index.
static int names_tensor(jit_status s, const char *kind, int index, const char *name) {
  const char *m = jit_status_message(s);
  char buf[64];
  if (name && strstr(m, name)) return 1;
  snprintf(buf, sizeof(buf), "%s %d", kind, index);
  if (strstr(m, buf)) return 1;
  snprintf(buf, sizeof(buf), "%s #%d", kind, index);
  if (strstr(m, buf)) return 1;
  snprintf(buf, sizeof(buf), "%s[%d]", kind, index);
  return strstr(m, buf) != NULL;
}

#define EXPECT_NAMES_INPUT(s, index, name)                                     \
  cr_expect(names_tensor((s), "input", (index), (name)),                       \
            "message \"%s\" names neither input %d nor `%s`",                  \
            jit_status_message(s), (index), (name))

#define EXPECT_NAMES_OUTPUT(s, index)                                          \
  cr_expect(names_tensor((s), "output", (index), NULL),                        \
            "message \"%s\" does not name output %d", jit_status_message(s),   \
            (index))

// A finalized graph: y = alpha [N, 4] + beta [N, 4]; z = sum(y, -1) [N].
typedef struct fixture {
  jit_context *ctx;
  jit_graph *g;
  float a[64], b[64], y[64], z[16];
  int64_t da[2], db[2], dy[2], dz[1];
  DLTensor ins[2], outs[2];
} fixture;

static void fixture_init(fixture *f, int64_t n) {
  memset(f, 0, sizeof(*f));
  f->ctx = tu_context();
  f->g = tu_graph(f->ctx, "errgraph");
  int64_t N = jit_symbol(f->g, "N");
  int64_t d[2] = {N, 4};
  jit_value a = jit_input(f->g, "alpha", TU_F32, 2, d);
  jit_value b = jit_input(f->g, "beta", TU_F32, 2, d);
  jit_value y = jit_add(f->g, a, b);
  jit_output(f->g, y);
  jit_output(f->g, jit_reduce_sum(f->g, y, -1, 0));
  TU_OK(jit_graph_finalize(f->g));
  f->da[0] = f->db[0] = f->dy[0] = f->dz[0] = n;
  f->da[1] = f->db[1] = f->dy[1] = 4;
  for (int i = 0; i < 64; i++) {
    f->a[i] = (float)i;
    f->b[i] = 1.0f;
  }
  f->ins[0] = tu_tensor(f->a, TU_F32, 2, f->da);
  f->ins[1] = tu_tensor(f->b, TU_F32, 2, f->db);
  f->outs[0] = tu_tensor(f->y, TU_F32, 2, f->dy);
  f->outs[1] = tu_tensor(f->z, TU_F32, 1, f->dz);
}

static void fixture_fini(fixture *f) {
  jit_graph_destroy(f->g);
  jit_context_destroy(f->ctx);
}

// Runs the fixture and returns the status (the caller checks and frees it).
static jit_status fixture_run(fixture *f) {
  return jit_run(f->g, f->ins, 2, f->outs, 2);
}

Test(errors, fixture_runs) {
  // The baseline every other case perturbs must itself succeed.
  fixture f;
  fixture_init(&f, 3);
  TU_OK(fixture_run(&f));
  for (int i = 0; i < 12; i++) cr_assert_eq(f.y[i], (float)i + 1.0f);
  for (int r = 0; r < 3; r++)
    cr_assert_eq(f.z[r], (float)(4 * 4 * r + 6 + 4), "row %d", r);
  fixture_fini(&f);
}

//===--- Status accessors and NULL handles ---------------------------------------===//

Test(errors, null_is_a_noop_and_ok) {
  jit_status_free(NULL);
  jit_graph_destroy(NULL);
  jit_context_destroy(NULL);
  cr_assert_eq(jit_status_get_code(NULL), JIT_OK);
  cr_assert_str_eq(jit_status_message(NULL), "");
  cr_assert_str_eq(jit_status_code_name(JIT_SHAPE_MISMATCH), "SHAPE_MISMATCH");
  cr_assert_str_eq(jit_status_code_name(JIT_OK), "OK");
  cr_assert_str_eq(jit_status_code_name(JIT_INVALID_ARGUMENT), "INVALID_ARGUMENT");
  cr_assert_not_null(jit_status_code_name((jit_status_code)999));
  cr_assert_str_eq(jit_version(), "0.1.0");
  cr_assert_eq(jit_version_number(), JIT_VERSION_NUMBER);
}

Test(errors, null_out_pointers_at_creation) {
  jit_status s = jit_context_create(NULL, NULL);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  jit_status_free(s);

  jit_graph *g = (jit_graph *)&s;  // not NULL: must be reset
  s = jit_graph_create(NULL, "g", &g);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  cr_expect(g == NULL, "out_graph not reset to NULL");
  jit_status_free(s);

  jit_context *ctx = tu_context();
  s = jit_graph_create(ctx, "g", NULL);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  jit_status_free(s);

  jit_stats st;
  memset(&st, 0, sizeof(st));
  st.struct_size = sizeof(st);
  s = jit_context_stats(NULL, &st);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  jit_status_free(s);
  s = jit_context_stats(ctx, NULL);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  jit_status_free(s);
  jit_context_destroy(ctx);
}

Test(errors, bad_options) {
  jit_options o;
  jit_context *ctx = (jit_context *)&o;
  jit_options_init(&o);
  o.struct_size = 3;
  jit_status s = jit_context_create(&o, &ctx);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  cr_expect(ctx == NULL, "out_ctx not reset to NULL");
  jit_status_free(s);

  jit_options_init(&o);
  o.opt_level = 7;
  ctx = NULL;
  s = jit_context_create(&o, &ctx);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  TU_EXPECT_MSG(s, "opt_level");
  jit_status_free(s);
  jit_context_destroy(ctx);  // NULL after a failure; harmless otherwise

  jit_options_init(&o);
  o.num_threads = -1;
  ctx = NULL;
  s = jit_context_create(&o, &ctx);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  jit_status_free(s);
  jit_context_destroy(ctx);

  // A malformed trusted-key list never means "trust nothing in particular".
  jit_options_init(&o);
  o.bundle_trusted_keys = "0123";
  ctx = NULL;
  s = jit_context_create(&o, &ctx);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  TU_EXPECT_MSG(s, "options.bundle_trusted_keys");
  jit_status_free(s);
  cr_expect(ctx == NULL);
  setenv("JITML_TRUSTED_KEYS", "zz", 1);
  jit_options_init(&o);
  s = jit_context_create(&o, &ctx);
  unsetenv("JITML_TRUSTED_KEYS");
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  TU_EXPECT_MSG(s, "JITML_TRUSTED_KEYS");
  jit_status_free(s);
}

Test(errors, bundle_signing_arguments) {
  char pk[65];
  jit_status s = jit_bundle_keygen(NULL, pk);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  jit_status_free(s);
  s = jit_bundle_keygen("/nonexistent-dir/key", NULL);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  jit_status_free(s);
  s = jit_bundle_keygen("/nonexistent-dir/key", pk);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  TU_EXPECT_MSG(s, "/nonexistent-dir/key");
  jit_status_free(s);
  jit_options o;
  jit_options_init(&o);
  o.cache_dir = "";
  jit_context *ctx = NULL;
  TU_OK(jit_context_create(&o, &ctx));
  uint64_t n = 7;
  s = jit_cache_export_signed(ctx, "/tmp/x.jitmlb", NULL, &n);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  cr_expect_eq(n, 0);
  jit_status_free(s);
  s = jit_cache_export_signed(ctx, "/tmp/x.jitmlb", "/nonexistent-key", &n);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  TU_EXPECT_MSG(s, "/nonexistent-key");
  jit_status_free(s);
  jit_context_destroy(ctx);
}

Test(errors, builder_calls_on_null_graph) {
  int64_t d[1] = {3};
  cr_expect_eq(jit_symbol(NULL, "N"), 0);
  jit_value v = jit_input(NULL, "x", TU_F32, 1, d);
  cr_expect_eq(v.id, 0);
  cr_expect_eq(jit_scalar(NULL, 1.0, TU_F32).id, 0);
  cr_expect_eq(jit_add(NULL, v, v).id, 0);
  cr_expect_eq(jit_relu(NULL, v).id, 0);
  jit_output(NULL, v);
  jit_status s = jit_graph_finalize(NULL);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  jit_status_free(s);
}

Test(errors, run_null_pointers) {
  fixture f;
  fixture_init(&f, 3);
  jit_status s;

  s = jit_run(NULL, f.ins, 2, f.outs, 2);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  jit_status_free(s);

  s = jit_run(f.g, NULL, 2, f.outs, 2);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  jit_status_free(s);

  s = jit_run(f.g, f.ins, 2, NULL, 2);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  jit_status_free(s);

  s = jit_run_alloc(f.g, f.ins, 2, NULL, 2);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  jit_status_free(s);

  int rank = 0;
  int64_t dims[JIT_MAX_RANK];
  s = jit_output_shape(f.g, f.ins, 2, 0, NULL, dims);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  jit_status_free(s);
  s = jit_output_shape(f.g, f.ins, 2, 0, &rank, NULL);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  jit_status_free(s);
  s = jit_output_shape(NULL, f.ins, 2, 0, &rank, dims);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  jit_status_free(s);
  s = jit_output_shape(f.g, NULL, 2, 0, &rank, dims);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  jit_status_free(s);

  // NULL data in input 1 `beta`.
  f.ins[1].data = NULL;
  s = fixture_run(&f);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  EXPECT_NAMES_INPUT(s, 1, "beta");
  jit_status_free(s);
  f.ins[1].data = f.b;

  // NULL shape with ndim 2.
  f.ins[0].shape = NULL;
  s = fixture_run(&f);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  EXPECT_NAMES_INPUT(s, 0, "alpha");
  jit_status_free(s);
  f.ins[0].shape = f.da;

  // NULL data in output 1.
  f.outs[1].data = NULL;
  s = fixture_run(&f);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  EXPECT_NAMES_OUTPUT(s, 1);
  jit_status_free(s);
  f.outs[1].data = f.z;

  TU_OK(fixture_run(&f));  // the graph is still usable
  fixture_fini(&f);
}

//===--- Counts ------------------------------------------------------------------===//

Test(errors, wrong_input_count) {
  fixture f;
  fixture_init(&f, 3);
  jit_status s = jit_run(f.g, f.ins, 1, f.outs, 2);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  TU_EXPECT_MSG(s, "input");
  TU_EXPECT_MSG(s, "2");  // the graph's count
  jit_status_free(s);
  s = jit_run(f.g, f.ins, -1, f.outs, 2);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  jit_status_free(s);
  int rank;
  int64_t dims[JIT_MAX_RANK];
  s = jit_output_shape(f.g, f.ins, 1, 0, &rank, dims);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  jit_status_free(s);
  fixture_fini(&f);
}

Test(errors, wrong_output_count) {
  fixture f;
  fixture_init(&f, 3);
  jit_status s = jit_run(f.g, f.ins, 2, f.outs, 0);  // zero outputs given
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  TU_EXPECT_MSG(s, "output");
  jit_status_free(s);
  s = jit_run(f.g, f.ins, 2, f.outs, 1);  // graph has 2
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  TU_EXPECT_MSG(s, "output");
  jit_status_free(s);
  DLTensor three[3] = {f.outs[0], f.outs[1], f.outs[1]};
  s = jit_run(f.g, f.ins, 2, three, 3);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  jit_status_free(s);
  DLManagedTensor *m[3] = {NULL, NULL, NULL};
  s = jit_run_alloc(f.g, f.ins, 2, m, 1);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  cr_expect(m[0] == NULL && m[1] == NULL);
  jit_status_free(s);
  s = jit_run_alloc(f.g, f.ins, 2, m, 3);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  cr_expect(m[0] == NULL && m[1] == NULL && m[2] == NULL);
  jit_status_free(s);
  int rank = 5;
  int64_t dims[JIT_MAX_RANK];
  s = jit_output_shape(f.g, f.ins, 2, 2, &rank, dims);  // index out of range
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  jit_status_free(s);
  s = jit_output_shape(f.g, f.ins, 2, -1, &rank, dims);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  jit_status_free(s);
  fixture_fini(&f);
}

//===--- Shapes and dtypes of inputs -----------------------------------------------===//

Test(errors, rank_mismatch) {
  fixture f;
  fixture_init(&f, 3);
  int64_t d3[3] = {3, 4, 1};
  f.ins[1] = tu_tensor(f.b, TU_F32, 3, d3);
  jit_status s = fixture_run(&f);
  TU_EXPECT_CODE(s, JIT_SHAPE_MISMATCH);
  EXPECT_NAMES_INPUT(s, 1, "beta");
  TU_EXPECT_MSG(s, "rank");
  jit_status_free(s);
  fixture_fini(&f);
}

Test(errors, static_dim_mismatch) {
  fixture f;
  fixture_init(&f, 3);
  f.db[1] = 9;  // the graph says 4
  jit_status s = fixture_run(&f);
  TU_EXPECT_CODE(s, JIT_SHAPE_MISMATCH);
  EXPECT_NAMES_INPUT(s, 1, "beta");
  TU_EXPECT_MSG(s, "dim 1");
  TU_EXPECT_MSG(s, "9");
  TU_EXPECT_MSG(s, "4");
  jit_status_free(s);
  f.db[1] = 4;
  f.db[0] = -3;  // a negative size
  s = fixture_run(&f);
  cr_expect(jit_status_get_code(s) == JIT_SHAPE_MISMATCH ||
                jit_status_get_code(s) == JIT_INVALID_ARGUMENT,
            "negative dim: %s", jit_status_message(s));
  EXPECT_NAMES_INPUT(s, 1, "beta");
  jit_status_free(s);
  fixture_fini(&f);
}

Test(errors, dtype_mismatch_f16_into_f32) {
  fixture f;
  fixture_init(&f, 3);
  uint16_t h[12] = {0};
  f.ins[0] = tu_tensor(h, TU_F16, 2, f.da);
  jit_status s = fixture_run(&f);
  TU_EXPECT_CODE(s, JIT_DTYPE_MISMATCH);
  EXPECT_NAMES_INPUT(s, 0, "alpha");
  jit_status_free(s);
  // Vector lanes are not a scalar dtype.
  f.ins[0] = tu_tensor(f.a, (DLDataType){kDLFloat, 32, 2}, 2, f.da);
  s = fixture_run(&f);
  cr_expect(s != NULL, "a 2-lane dtype was accepted");
  EXPECT_NAMES_INPUT(s, 0, "alpha");
  jit_status_free(s);
  fixture_fini(&f);
}

Test(errors, symbol_bound_twice) {
  fixture f;
  fixture_init(&f, 13);
  f.db[0] = 29;  // alpha binds N = 13, beta says 29
  jit_status s = fixture_run(&f);
  TU_EXPECT_CODE(s, JIT_SHAPE_MISMATCH);
  EXPECT_NAMES_INPUT(s, 0, "alpha");
  EXPECT_NAMES_INPUT(s, 1, "beta");
  TU_EXPECT_MSG(s, "13");
  TU_EXPECT_MSG(s, "29");
  TU_EXPECT_MSG(s, "dim 0");
  TU_EXPECT_MSG(s, "N");
  jit_status_free(s);
  // The shape function reports the same binding error.
  int rank = 3;
  int64_t dims[JIT_MAX_RANK];
  s = jit_output_shape(f.g, f.ins, 2, 0, &rank, dims);
  TU_EXPECT_CODE(s, JIT_SHAPE_MISMATCH);
  EXPECT_NAMES_INPUT(s, 1, "beta");
  cr_expect_eq(rank, 0, "out_rank not reset on failure");
  jit_status_free(s);
  fixture_fini(&f);
}

Test(errors, symbols_meeting_in_broadcast) {
  // x [N, 4] + y [M, 4]: N and M must bind equal; a symbol never broadcasts, even when
  // it is bound to 1. x [N, 4] + z [3, 4]: N must be 3.
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "meet");
  int64_t N = jit_symbol(g, "N"), M = jit_symbol(g, "M");
  cr_assert(N < 0 && M < 0 && N != M, "symbol codes %lld %lld", (long long)N,
            (long long)M);
  cr_assert_eq(jit_symbol(g, "N"), N, "the same name gives the same code");
  int64_t dx[2] = {N, 4}, dy[2] = {M, 4}, dz[2] = {3, 4};
  jit_value x = jit_input(g, "x", TU_F32, 2, dx);
  jit_value y = jit_input(g, "y", TU_F32, 2, dy);
  jit_value z = jit_input(g, "z", TU_F32, 2, dz);
  jit_output(g, jit_add(g, jit_add(g, x, y), z));
  TU_OK(jit_graph_finalize(g));
  float bx[20] = {0}, by[20] = {0}, bz[12] = {0}, out[20];
  int64_t sx[2] = {3, 4}, sy[2] = {3, 4}, sz[2] = {3, 4}, so[2] = {3, 4};
  DLTensor ins[3] = {tu_tensor(bx, TU_F32, 2, sx), tu_tensor(by, TU_F32, 2, sy),
                     tu_tensor(bz, TU_F32, 2, sz)};
  DLTensor o = tu_tensor(out, TU_F32, 2, so);
  TU_OK(jit_run(g, ins, 3, &o, 1));  // N = M = 3: fine

  sy[0] = 5;  // M = 5 != N = 3
  jit_status s = jit_run(g, ins, 3, &o, 1);
  TU_EXPECT_CODE(s, JIT_SHAPE_MISMATCH);
  jit_status_free(s);

  sx[0] = 1;  // N = 1, M = 3: a symbol bound to 1 does not broadcast
  sy[0] = 3;
  s = jit_run(g, ins, 3, &o, 1);
  TU_EXPECT_CODE(s, JIT_SHAPE_MISMATCH);
  jit_status_free(s);

  sx[0] = sy[0] = 1;  // N = M = 1 and z is [3, 4]: a symbol meeting 3 must be 3
  s = jit_run(g, ins, 3, &o, 1);
  TU_EXPECT_CODE(s, JIT_SHAPE_MISMATCH);
  jit_status_free(s);

  sx[0] = sy[0] = 5;  // N = M = 5 but z is [3, 4]
  so[0] = 5;
  s = jit_run(g, ins, 3, &o, 1);
  TU_EXPECT_CODE(s, JIT_SHAPE_MISMATCH);
  jit_status_free(s);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// N = 0: both outputs are empty ([0, 4] and [0]), so the run succeeds without a
// kernel (tests/test_limits.c covers zero-size bindings in depth).
Test(errors, zero_size_dim_runs_empty) {
  fixture f;
  fixture_init(&f, 0);
  TU_OK(fixture_run(&f));
  fixture_fini(&f);
}

//===--- Layout and device --------------------------------------------------------===//

Test(errors, non_dense_strides_unsupported) {
  fixture f;
  fixture_init(&f, 3);
  int64_t col_major[2] = {1, 3};
  f.ins[1].strides = col_major;
  jit_status s = fixture_run(&f);
  TU_EXPECT_CODE(s, JIT_UNSUPPORTED);
  EXPECT_NAMES_INPUT(s, 1, "beta");
  TU_EXPECT_MSG(s, "stride");
  jit_status_free(s);
  int64_t padded[2] = {8, 1};  // rows padded to 8 elements
  f.ins[1].strides = padded;
  s = fixture_run(&f);
  TU_EXPECT_CODE(s, JIT_UNSUPPORTED);
  jit_status_free(s);
  f.ins[1].strides = NULL;
  int64_t out_strides[2] = {1, 3};
  f.outs[0].strides = out_strides;
  s = fixture_run(&f);
  TU_EXPECT_CODE(s, JIT_UNSUPPORTED);
  EXPECT_NAMES_OUTPUT(s, 0);
  jit_status_free(s);
  fixture_fini(&f);
}

static int is_device_error_code(jit_status_code c) {
  return c == JIT_INVALID_ARGUMENT || c == JIT_UNSUPPORTED || c == JIT_UNAVAILABLE;
}

Test(errors, non_cpu_device) {
  fixture f;
  fixture_init(&f, 3);
  // Every tensor says CUDA (the pointers are host memory; the library must not run).
  for (int i = 0; i < 2; i++) f.ins[i].device.device_type = kDLCUDA;
  for (int i = 0; i < 2; i++) f.outs[i].device.device_type = kDLCUDA;
  jit_status s = fixture_run(&f);
  cr_expect(s != NULL, "host pointers labelled kDLCUDA were accepted");
  cr_expect(is_device_error_code(jit_status_get_code(s)), "code %s: %s",
            jit_status_code_name(jit_status_get_code(s)), jit_status_message(s));
  jit_status_free(s);
  // Mixed devices: one CUDA input among CPU tensors.
  for (int i = 0; i < 2; i++) f.ins[i].device.device_type = kDLCPU;
  for (int i = 0; i < 2; i++) f.outs[i].device.device_type = kDLCPU;
  f.ins[1].device.device_type = kDLCUDA;
  s = fixture_run(&f);
  cr_expect(s != NULL, "a kDLCUDA input among CPU tensors was accepted");
  cr_expect(is_device_error_code(jit_status_get_code(s)), "code %s: %s",
            jit_status_code_name(jit_status_get_code(s)), jit_status_message(s));
  EXPECT_NAMES_INPUT(s, 1, "beta");
  jit_status_free(s);
  // An unknown device type.
  f.ins[1].device.device_type = (DLDeviceType)77;
  s = fixture_run(&f);
  cr_expect(s != NULL);
  cr_expect(is_device_error_code(jit_status_get_code(s)));
  jit_status_free(s);
  fixture_fini(&f);
}

//===--- Outputs -----------------------------------------------------------------===//

Test(errors, output_wrong_shape_or_dtype) {
  fixture f;
  fixture_init(&f, 3);
  f.dy[0] = 4;  // should be 3
  jit_status s = fixture_run(&f);
  TU_EXPECT_CODE(s, JIT_SHAPE_MISMATCH);
  EXPECT_NAMES_OUTPUT(s, 0);
  jit_status_free(s);
  f.dy[0] = 3;

  f.outs[1].ndim = 2;  // rank 2 for a rank-1 output
  int64_t d2[2] = {3, 1};
  f.outs[1].shape = d2;
  s = fixture_run(&f);
  TU_EXPECT_CODE(s, JIT_SHAPE_MISMATCH);
  EXPECT_NAMES_OUTPUT(s, 1);
  jit_status_free(s);
  f.outs[1] = tu_tensor(f.z, TU_F32, 1, f.dz);

  uint16_t h[12];
  f.outs[0] = tu_tensor(h, TU_F16, 2, f.dy);
  s = fixture_run(&f);
  TU_EXPECT_CODE(s, JIT_DTYPE_MISMATCH);
  EXPECT_NAMES_OUTPUT(s, 0);
  jit_status_free(s);
  f.outs[0] = tu_tensor(f.y, TU_F32, 2, f.dy);
  TU_OK(fixture_run(&f));
  fixture_fini(&f);
}

//===--- Lifecycle ----------------------------------------------------------------===//

Test(errors, run_before_finalize) {
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "unfinished");
  int64_t d[1] = {4};
  jit_value x = jit_input(g, "x", TU_F32, 1, d);
  jit_output(g, jit_neg(g, x));
  float in[4] = {1, 2, 3, 4}, out[4];
  DLTensor ti = tu_tensor(in, TU_F32, 1, d), to = tu_tensor(out, TU_F32, 1, d);
  jit_status s = jit_run(g, &ti, 1, &to, 1);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  TU_EXPECT_MSG(s, "finalize");
  jit_status_free(s);
  DLManagedTensor *m = NULL;
  s = jit_run_alloc(g, &ti, 1, &m, 1);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  cr_expect(m == NULL);
  jit_status_free(s);
  // After finalize it runs.
  TU_OK(jit_graph_finalize(g));
  TU_OK(jit_run(g, &ti, 1, &to, 1));
  cr_expect_eq(out[3], -4.0f);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(errors, no_outputs) {
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "empty");
  int64_t d[1] = {4};
  jit_input(g, "x", TU_F32, 1, d);
  jit_status s = jit_graph_finalize(g);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  TU_EXPECT_MSG(s, "output");
  jit_status_free(s);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

//===--- Builder errors: sticky, reported by finalize ------------------------------===//

typedef jit_value (*build_fn)(jit_graph *g);

// Builds with `fn` (which returns the failing call's value), marks it as output, and
// expects finalize to return `code`. Returns the status for message checks.
static jit_status finalize_error(jit_context *ctx, build_fn fn, jit_status_code code) {
  jit_graph *g = tu_graph(ctx, "bad");
  jit_value v = fn(g);
  cr_expect_eq(v.id, 0, "a failing builder call returned a valid value");
  jit_output(g, v);
  jit_status s = jit_graph_finalize(g);
  TU_EXPECT_CODE(s, code);
  // The graph cannot run after a failed finalize.
  float buf[64] = {0};
  int64_t d[2] = {2, 3};
  DLTensor t = tu_tensor(buf, TU_F32, 2, d);
  jit_status r = jit_run(g, &t, 1, &t, 1);
  cr_expect(r != NULL, "a graph whose finalize failed ran");
  jit_status_free(r);
  jit_graph_destroy(g);
  return s;
}

static jit_value in2(jit_graph *g, const char *name, int64_t d0, int64_t d1,
                     DLDataType dt) {
  int64_t d[2] = {d0, d1};
  return jit_input(g, name, dt, 2, d);
}

static jit_value b_bad_axis(jit_graph *g) {
  return jit_reduce_sum(g, in2(g, "x", 2, 3, TU_F32), 5, 0);
}
static jit_value b_bad_neg_axis(jit_graph *g) {
  return jit_reduce_max(g, in2(g, "x", 2, 3, TU_F32), -3, 1);
}
static jit_value b_bad_softmax_axis(jit_graph *g) {
  return jit_softmax(g, in2(g, "x", 2, 3, TU_F32), 2);
}
static jit_value b_dup_perm(jit_graph *g) {
  const int perm[2] = {0, 0};
  return jit_transpose(g, in2(g, "x", 2, 3, TU_F32), perm);
}
static jit_value b_range_perm(jit_graph *g) {
  const int perm[2] = {0, 2};
  return jit_transpose(g, in2(g, "x", 2, 3, TU_F32), perm);
}
static jit_value b_null_perm(jit_graph *g) {
  return jit_transpose(g, in2(g, "x", 2, 3, TU_F32), NULL);
}
static jit_value b_matmul_k(jit_graph *g) {
  return jit_matmul(g, in2(g, "a", 4, 5, TU_F32), in2(g, "b", 6, 3, TU_F32));
}
static jit_value b_matmul_batch(jit_graph *g) {
  int64_t da[3] = {2, 3, 4}, db[3] = {3, 4, 5};
  return jit_matmul(g, jit_input(g, "a", TU_F32, 3, da),
                    jit_input(g, "b", TU_F32, 3, db));
}
static jit_value b_broadcast(jit_graph *g) {
  return jit_add(g, in2(g, "x", 2, 3, TU_F32), in2(g, "y", 2, 4, TU_F32));
}
static jit_value b_reshape_count(jit_graph *g) {
  int64_t d[2] = {5, 5};
  return jit_reshape(g, in2(g, "x", 4, 6, TU_F32), 2, d);
}
static jit_value b_reshape_infer(jit_graph *g) {
  int64_t d[2] = {-1, 5};  // 24 is not a multiple of 5
  return jit_reshape(g, in2(g, "x", 4, 6, TU_F32), 2, d);
}
static jit_value b_reshape_two_infer(jit_graph *g) {
  int64_t d[3] = {-1, -1, 2};
  return jit_reshape(g, in2(g, "x", 4, 6, TU_F32), 3, d);
}
static jit_value b_dtype_add(jit_graph *g) {
  return jit_add(g, in2(g, "x", 2, 3, TU_F32), in2(g, "h", 2, 3, TU_F16));
}
static jit_value b_dtype_matmul(jit_graph *g) {
  return jit_matmul(g, in2(g, "x", 2, 3, TU_F16), in2(g, "w", 3, 2, TU_F32));
}
static jit_value b_dtype_scalar(jit_graph *g) {
  return jit_mul(g, in2(g, "x", 2, 3, TU_F32), jit_scalar(g, 2.0, TU_F16));
}

Test(errors, bad_axis) {
  jit_context *ctx = tu_context();
  jit_status s = finalize_error(ctx, b_bad_axis, JIT_INVALID_ARGUMENT);
  TU_EXPECT_MSG(s, "axis");
  TU_EXPECT_MSG(s, "5");
  jit_status_free(s);
  s = finalize_error(ctx, b_bad_neg_axis, JIT_INVALID_ARGUMENT);
  TU_EXPECT_MSG(s, "-3");
  jit_status_free(s);
  s = finalize_error(ctx, b_bad_softmax_axis, JIT_INVALID_ARGUMENT);
  jit_status_free(s);
  jit_context_destroy(ctx);
}

Test(errors, bad_perm) {
  jit_context *ctx = tu_context();
  jit_status s = finalize_error(ctx, b_dup_perm, JIT_INVALID_ARGUMENT);
  TU_EXPECT_MSG(s, "perm");
  jit_status_free(s);
  s = finalize_error(ctx, b_range_perm, JIT_INVALID_ARGUMENT);
  jit_status_free(s);
  s = finalize_error(ctx, b_null_perm, JIT_INVALID_ARGUMENT);
  jit_status_free(s);
  jit_context_destroy(ctx);
}

Test(errors, matmul_shapes) {
  jit_context *ctx = tu_context();
  jit_status s = finalize_error(ctx, b_matmul_k, JIT_SHAPE_MISMATCH);
  TU_EXPECT_MSG(s, "5");
  TU_EXPECT_MSG(s, "6");
  TU_EXPECT_MSG(s, "matmul");
  jit_status_free(s);
  s = finalize_error(ctx, b_matmul_batch, JIT_SHAPE_MISMATCH);
  jit_status_free(s);
  jit_context_destroy(ctx);
}

Test(errors, broadcast_incompatible) {
  jit_context *ctx = tu_context();
  jit_status s = finalize_error(ctx, b_broadcast, JIT_SHAPE_MISMATCH);
  TU_EXPECT_MSG(s, "3");
  TU_EXPECT_MSG(s, "4");
  jit_status_free(s);
  jit_context_destroy(ctx);
}

Test(errors, reshape_bad) {
  jit_context *ctx = tu_context();
  jit_status s = finalize_error(ctx, b_reshape_count, JIT_SHAPE_MISMATCH);
  TU_EXPECT_MSG(s, "24");
  TU_EXPECT_MSG(s, "25");
  jit_status_free(s);
  s = finalize_error(ctx, b_reshape_infer, JIT_SHAPE_MISMATCH);
  jit_status_free(s);
  s = finalize_error(ctx, b_reshape_two_infer, JIT_INVALID_ARGUMENT);
  jit_status_free(s);
  jit_context_destroy(ctx);
}

Test(errors, dtype_mixing) {
  jit_context *ctx = tu_context();
  jit_status s = finalize_error(ctx, b_dtype_add, JIT_DTYPE_MISMATCH);
  jit_status_free(s);
  s = finalize_error(ctx, b_dtype_matmul, JIT_DTYPE_MISMATCH);
  jit_status_free(s);
  s = finalize_error(ctx, b_dtype_scalar, JIT_DTYPE_MISMATCH);
  jit_status_free(s);
  jit_context_destroy(ctx);
}

Test(errors, reshape_symbolic_count_checked_at_run) {
  // x [N, 6] -> [M, 4], M bound by input m: the element counts can only be compared
  // at run time. N = 2, M = 3 (12 elements) runs; N = 3, M = 5 (18 vs 20) does not.
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "reshape_run");
  int64_t N = jit_symbol(g, "N"), M = jit_symbol(g, "M");
  int64_t dx[2] = {N, 6}, dr[2] = {M, 4}, dm[1] = {M};
  jit_value x = jit_input(g, "x", TU_F32, 2, dx);
  jit_value m = jit_input(g, "m", TU_F32, 1, dm);
  jit_output(g, jit_reshape(g, x, 2, dr));
  jit_output(g, jit_neg(g, m));
  TU_OK(jit_graph_finalize(g));
  float xb[18], mb[5] = {0}, o0[20], o1[5];
  for (int i = 0; i < 18; i++) xb[i] = (float)i;
  int64_t sx[2] = {2, 6}, sm[1] = {3}, so0[2] = {3, 4}, so1[1] = {3};
  DLTensor ins[2] = {tu_tensor(xb, TU_F32, 2, sx), tu_tensor(mb, TU_F32, 1, sm)};
  DLTensor outs[2] = {tu_tensor(o0, TU_F32, 2, so0), tu_tensor(o1, TU_F32, 1, so1)};
  TU_OK(jit_run(g, ins, 2, outs, 2));
  cr_expect_eq(o0[11], 11.0f);
  sx[0] = 3;
  sm[0] = so0[0] = so1[0] = 5;
  jit_status s = jit_run(g, ins, 2, outs, 2);
  TU_EXPECT_CODE(s, JIT_SHAPE_MISMATCH);
  TU_EXPECT_MSG(s, "18");
  TU_EXPECT_MSG(s, "20");
  jit_status_free(s);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(errors, first_error_is_sticky) {
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "sticky");
  jit_value x = in2(g, "x", 2, 3, TU_F32);
  jit_value bad = jit_reduce_sum(g, x, 7, 0);  // first error: INVALID_ARGUMENT
  cr_expect_eq(bad.id, 0);
  jit_value y = jit_relu(g, bad);  // consumes an invalid value
  cr_expect_eq(y.id, 0);
  jit_value z = jit_matmul(g, x, x);  // a second, different error: SHAPE_MISMATCH
  cr_expect_eq(z.id, 0);
  jit_value ok = jit_neg(g, x);  // a good call may still give a valid value
  jit_output(g, ok);
  jit_status s = jit_graph_finalize(g);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  TU_EXPECT_MSG(s, "7");
  jit_status_free(s);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(errors, invalid_values_and_inputs) {
  jit_context *ctx = tu_context();
  jit_status s;
  jit_graph *g;
  int64_t d[2] = {2, 3};

  g = tu_graph(ctx, "zero_value");  // id 0 passed with no earlier error
  jit_output(g, jit_exp(g, (jit_value){0}));
  s = jit_graph_finalize(g);
  cr_expect(s != NULL, "an op on value id 0 finalized");
  jit_status_free(s);
  jit_graph_destroy(g);

  g = tu_graph(ctx, "foreign_value");  // an id this graph never made
  jit_value x = jit_input(g, "x", TU_F32, 2, d);
  jit_output(g, jit_add(g, x, (jit_value){x.id + 1000}));
  s = jit_graph_finalize(g);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  jit_status_free(s);
  jit_graph_destroy(g);

  g = tu_graph(ctx, "bad_dtype");  // i32 is not supported
  jit_output(g, jit_input(g, "x", (DLDataType){kDLInt, 32, 1}, 2, d));
  s = jit_graph_finalize(g);
  cr_expect(jit_status_get_code(s) == JIT_UNSUPPORTED ||
                jit_status_get_code(s) == JIT_INVALID_ARGUMENT ||
                jit_status_get_code(s) == JIT_DTYPE_MISMATCH,
            "i32 input: %s", jit_status_message(s));
  jit_status_free(s);
  jit_graph_destroy(g);

  g = tu_graph(ctx, "bad_rank");  // rank 9 > JIT_MAX_RANK
  int64_t d9[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  jit_output(g, jit_input(g, "x", TU_F32, 9, d9));
  s = jit_graph_finalize(g);
  cr_expect(jit_status_get_code(s) == JIT_INVALID_ARGUMENT ||
                jit_status_get_code(s) == JIT_UNSUPPORTED,
            "rank 9: %s", jit_status_message(s));
  jit_status_free(s);
  jit_graph_destroy(g);

  g = tu_graph(ctx, "null_dims");
  jit_output(g, jit_input(g, "x", TU_F32, 2, NULL));
  s = jit_graph_finalize(g);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  jit_status_free(s);
  jit_graph_destroy(g);

  g = tu_graph(ctx, "unknown_symbol");  // a negative dim that is no symbol of g
  int64_t dn[2] = {-1000000, 3};
  jit_output(g, jit_input(g, "x", TU_F32, 2, dn));
  s = jit_graph_finalize(g);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  jit_status_free(s);
  jit_graph_destroy(g);

  g = tu_graph(ctx, "bad_symbol_name");
  cr_expect_eq(jit_symbol(g, "no spaces!"), 0);
  jit_output(g, jit_input(g, "x", TU_F32, 2, d));
  s = jit_graph_finalize(g);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  jit_status_free(s);
  jit_graph_destroy(g);

  g = tu_graph(ctx, "null_symbol_name");
  cr_expect_eq(jit_symbol(g, NULL), 0);
  jit_output(g, jit_input(g, "x", TU_F32, 2, d));
  s = jit_graph_finalize(g);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  jit_status_free(s);
  jit_graph_destroy(g);

  jit_context_destroy(ctx);
}

// Outputs are written as buffers of their own (the kernel's pointers are noalias): on
// the CPU an output that overlaps an input, or another output, is refused before
// anything runs.
Test(errors, overlapping_outputs_refused) {
  jit_context *ctx = NULL;
  TU_OK(jit_context_create(NULL, &ctx));
  jit_graph *g = tu_graph(ctx, "two_out");
  int64_t d[1] = {8};
  jit_value x = jit_input(g, "x", TU_F32, 1, d);
  jit_output(g, jit_exp(g, x));
  jit_output(g, jit_neg(g, x));
  TU_OK(jit_graph_finalize(g));
  float buf[24] = {0};
  DLTensor in = tu_tensor(buf, TU_F32, 1, d);
  DLTensor out[2] = {tu_tensor(buf + 8, TU_F32, 1, d), tu_tensor(buf + 16, TU_F32, 1, d)};
  TU_OK(jit_run(g, &in, 1, out, 2));
  cr_expect(buf[8] == 1.0f && buf[16] == 0.0f, "exp(0) = %g, -0 = %g", buf[8], buf[16]);
  out[1] = tu_tensor(buf + 12, TU_F32, 1, d);  // half of output 0
  jit_status s = jit_run(g, &in, 1, out, 2);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  TU_EXPECT_MSG(s, "output 1 overlaps output 0");
  jit_status_free(s);
  out[1] = tu_tensor(buf + 4, TU_F32, 1, d);  // half of the input
  s = jit_run(g, &in, 1, out, 2);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  TU_EXPECT_MSG(s, "overlaps input 0");
  jit_status_free(s);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}
