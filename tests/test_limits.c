//===--- test_limits.c - size limits, overflow, option ranges, zero-size -===//
//
// Shapes whose element or byte counts overflow or pass JIT_MAX_TENSOR_BYTES get a
// status naming the tensor, never a wrapped allocation (the 2^62-element output of
// jit_run_alloc was a heap overflow); option fields out of range are refused naming
// the field; zero-size bindings run when every output is empty and are refused
// (JIT_UNSUPPORTED, naming the op) where an op would make a non-empty value from an
// empty one. Huge shapes are bound over a small buffer: they are refused before any
// byte is read or written. Everything is freed (the suite runs under ASan/LSan).
//
//===----------------------------------------------------------------------===//
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jitml.h"
#include "util.h"

// Some buffer for tensors whose shapes are refused before their data is touched.
static float dummy[64];

// y = a [N, 1] x b [1, M]: an outer product whose output grows as N * M.
static jit_graph *outer_graph(jit_context *ctx, int use_matmul) {
  jit_graph *g = tu_graph(ctx, "outer");
  int64_t da[2] = {jit_symbol(g, "N"), 1}, db[2] = {1, jit_symbol(g, "M")};
  jit_value a = jit_input(g, "a", TU_F32, 2, da);
  jit_value b = jit_input(g, "b", TU_F32, 2, db);
  jit_output(g, use_matmul ? jit_matmul(g, a, b) : jit_add(g, a, b));
  TU_OK(jit_graph_finalize(g));
  return g;
}

//===--- Bound shapes past the limits ------------------------------------===//

// N = M = 2^31: 2^62 f32 elements, 2^64 bytes, which wrapped to a 0-byte buffer.
Test(limits, alloc_2p62_element_output_refused) {
  jit_context *ctx = tu_context();
  for (int mm = 0; mm < 2; mm++) {
    jit_graph *g = outer_graph(ctx, mm);
    int64_t sa[2] = {INT64_C(1) << 31, 1}, sb[2] = {1, INT64_C(1) << 31};
    DLTensor ins[2] = {tu_tensor(dummy, TU_F32, 2, sa), tu_tensor(dummy, TU_F32, 2, sb)};
    DLManagedTensor *out[1] = {(DLManagedTensor *)1};
    jit_status s = jit_run_alloc(g, ins, 2, out, 1);
    TU_EXPECT_CODE(s, JIT_RESOURCE_EXHAUSTED);
    TU_EXPECT_MSG(s, "output 0");
    TU_EXPECT_MSG(s, "[2147483648, 2147483648]");
    cr_expect(out[0] == NULL);
    jit_status_free(s);
    // The same binding through jit_run with a caller's output, and jit_graph_compile.
    int64_t so[2] = {sa[0], sb[1]};
    DLTensor o = tu_tensor(dummy, TU_F32, 2, so);
    s = jit_run(g, ins, 2, &o, 1);
    TU_EXPECT_CODE(s, JIT_RESOURCE_EXHAUSTED);
    jit_status_free(s);
    s = jit_graph_compile(g, ins, 2);
    TU_EXPECT_CODE(s, JIT_RESOURCE_EXHAUSTED);
    jit_status_free(s);
    jit_graph_destroy(g);
  }
  jit_context_destroy(ctx);
}

// 2^24 x 2^24 f32 = 2^50 bytes: no overflow, but past JIT_MAX_TENSOR_BYTES.
Test(limits, output_past_byte_limit_refused) {
  jit_context *ctx = tu_context();
  jit_graph *g = outer_graph(ctx, 1);
  int64_t sa[2] = {INT64_C(1) << 24, 1}, sb[2] = {1, INT64_C(1) << 24};
  DLTensor ins[2] = {tu_tensor(dummy, TU_F32, 2, sa), tu_tensor(dummy, TU_F32, 2, sb)};
  DLManagedTensor *out[1] = {NULL};
  jit_status s = jit_run_alloc(g, ins, 2, out, 1);
  TU_EXPECT_CODE(s, JIT_RESOURCE_EXHAUSTED);
  TU_EXPECT_MSG(s, "JIT_MAX_TENSOR_BYTES");
  TU_EXPECT_MSG(s, "matmul");
  jit_status_free(s);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// x [N, 2^30] bound with N = 2^40: 2^70 elements overflow int64.
Test(limits, bound_input_overflow_refused) {
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "wide");
  int64_t d[2] = {jit_symbol(g, "N"), INT64_C(1) << 30};
  jit_output(g, jit_relu(g, jit_input(g, "x", TU_F32, 2, d)));
  TU_OK(jit_graph_finalize(g));
  int64_t big[2] = {INT64_C(1) << 40, INT64_C(1) << 30};
  DLTensor in = tu_tensor(dummy, TU_F32, 2, big);
  DLTensor o = tu_tensor(dummy, TU_F32, 2, big);
  jit_status s = jit_run(g, &in, 1, &o, 1);
  TU_EXPECT_CODE(s, JIT_RESOURCE_EXHAUSTED);
  TU_EXPECT_MSG(s, "input 0 `x`");
  TU_EXPECT_MSG(s, "[1099511627776, 1073741824]");
  jit_status_free(s);
  int rank = 0;
  int64_t dims[JIT_MAX_RANK];
  s = jit_output_shape(g, &in, 1, 0, &rank, dims);
  TU_EXPECT_CODE(s, JIT_RESOURCE_EXHAUSTED);
  jit_status_free(s);
  // 2^22 x 2^30 f32 = 2^54 bytes: fits int64, past the byte limit.
  big[0] = INT64_C(1) << 22;
  s = jit_run(g, &in, 1, &o, 1);
  TU_EXPECT_CODE(s, JIT_RESOURCE_EXHAUSTED);
  TU_EXPECT_MSG(s, "input 0 `x`");
  jit_status_free(s);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// A reshape whose symbols, each bound within limits, multiply past int64.
Test(limits, bound_reshape_overflow_refused) {
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "reshape_big");
  int64_t N = jit_symbol(g, "N");
  int64_t d[1] = {N};
  jit_value x = jit_input(g, "x", TU_F32, 1, d);
  int64_t r[4] = {N, N, N, -1};
  jit_output(g, jit_reshape(g, x, 4, r));
  TU_OK(jit_graph_finalize(g));
  int64_t s_in[1] = {INT64_C(1) << 22};  // N^3 = 2^66
  DLTensor in = tu_tensor(dummy, TU_F32, 1, s_in);
  DLManagedTensor *out[1] = {NULL};
  jit_status s = jit_run_alloc(g, &in, 1, out, 1);
  TU_EXPECT_CODE(s, JIT_RESOURCE_EXHAUSTED);
  TU_EXPECT_MSG(s, "reshape");
  jit_status_free(s);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// jit_tensor_alloc and jit_copy size their tensors with the same checks.
Test(limits, tensor_alloc_and_copy_sizes_checked) {
  jit_context *ctx = tu_context();
  jit_device *cpu = NULL;
  TU_OK(jit_context_find_device(ctx, JIT_DEVICE_CPU, 0, &cpu));
  DLTensor t;
  int64_t wrap[2] = {INT64_C(1) << 31, INT64_C(1) << 31};  // 2^64 f32 bytes
  jit_status s = jit_tensor_alloc(ctx, cpu, TU_F32, 2, wrap, &t);
  TU_EXPECT_CODE(s, JIT_RESOURCE_EXHAUSTED);
  TU_EXPECT_MSG(s, "[2147483648, 2147483648]");
  jit_status_free(s);
  // 2^62 + 1 elements: the byte count wrapped to 4, copying the wrong size.
  int64_t odd[2] = {(INT64_C(1) << 31) + 1, (INT64_C(1) << 31) - 1};
  DLTensor a = tu_tensor(dummy, TU_F32, 2, odd), b = tu_tensor(dummy + 32, TU_F32, 2, odd);
  s = jit_copy(ctx, &b, &a);
  TU_EXPECT_CODE(s, JIT_RESOURCE_EXHAUSTED);
  TU_EXPECT_MSG(s, "JIT_MAX_TENSOR_BYTES");
  jit_status_free(s);
  int64_t empty[2] = {0, 5};
  TU_OK(jit_tensor_alloc(ctx, cpu, TU_F32, 2, empty, &t));
  TU_OK(jit_tensor_free(ctx, &t));
  jit_context_destroy(ctx);
}

//===--- Static dims that overflow (builder time) --------------------------===//

static void expect_finalize_invalid(jit_graph *g, const char *needle) {
  jit_status s = jit_graph_finalize(g);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  TU_EXPECT_MSG(s, needle);
  jit_status_free(s);
}

Test(limits, static_dims_overflow_invalid) {
  jit_context *ctx = tu_context();
  int64_t huge[2] = {INT64_C(1) << 40, INT64_C(1) << 30};

  jit_graph *g = tu_graph(ctx, "static_input");
  jit_value x = jit_input(g, "x", TU_F32, 2, huge);
  cr_expect(x.id == 0);
  expect_finalize_invalid(g, "input 0 `x`");
  jit_graph_destroy(g);

  g = tu_graph(ctx, "static_reshape");
  int64_t d[1] = {4};
  x = jit_input(g, "x", TU_F32, 1, d);
  cr_expect(jit_reshape(g, x, 2, huge).id == 0);
  expect_finalize_invalid(g, "reshape");
  jit_graph_destroy(g);

  // Operands that fit, a result that does not: [2^40, 1] x [1, 2^40].
  g = tu_graph(ctx, "static_matmul");
  int64_t da[2] = {INT64_C(1) << 40, 1}, db[2] = {1, INT64_C(1) << 40};
  jit_value a = jit_input(g, "a", TU_F32, 2, da);
  jit_value b = jit_input(g, "b", TU_F32, 2, db);
  cr_expect(jit_matmul(g, a, b).id == 0);
  expect_finalize_invalid(g, "matmul");
  jit_graph_destroy(g);

  // A symbol next to static dims: only the static part is checked at build time.
  g = tu_graph(ctx, "static_ok");
  int64_t ds[3] = {jit_symbol(g, "N"), INT64_C(1) << 31, INT64_C(1) << 31};
  x = jit_input(g, "x", TU_F32, 3, ds);
  cr_expect(x.id != 0);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

//===--- Option ranges ----------------------------------------------------===//

static void expect_option_refused(const jit_options *o, const char *field) {
  jit_context *ctx = (jit_context *)1;
  jit_status s = jit_context_create(o, &ctx);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  TU_EXPECT_MSG(s, field);
  cr_expect(ctx == NULL);
  jit_status_free(s);
  jit_context_destroy(ctx);
}

Test(limits, option_fields_out_of_range) {
  jit_options o;
#define REFUSED(field, value)                 \
  do {                                        \
    jit_options_init(&o);                     \
    o.field = (value);                        \
    expect_option_refused(&o, "options." #field); \
  } while (0)
  REFUSED(opt_level, -1);
  REFUSED(opt_level, 4);
  REFUSED(num_threads, -1);
  REFUSED(num_threads, JIT_MAX_THREADS + 1);
  REFUSED(log_level, (jit_log_level)-1);
  REFUSED(log_level, (jit_log_level)4);
  REFUSED(cache_max_bytes, (uint64_t)INT64_MAX + 1);
  REFUSED(cache_max_bytes, UINT64_MAX);
  REFUSED(cache_max_age_s, UINT64_MAX);
  REFUSED(cache_allow_shared_readonly, 2);
  REFUSED(cache_allow_shared_readonly, -1);
#undef REFUSED
  // The edges of each range are accepted.
  jit_options_init(&o);
  o.opt_level = 3;
  o.num_threads = 1;
  o.log_level = JIT_LOG_DEBUG;
  o.cache_max_bytes = 1;
  o.cache_max_age_s = (uint64_t)INT64_MAX / 1000000000u;
  o.cache_allow_shared_readonly = 1;
  jit_context *ctx = NULL;
  TU_OK(jit_context_create(&o, &ctx));
  jit_context_destroy(ctx);
}

//===--- Zero-size bindings -----------------------------------------------===//

// Expects jit_run and jit_run_alloc to succeed with output 0 empty of shape `want`.
static void expect_empty_run(jit_graph *g, DLTensor *ins, int n_in, int rank,
                             const int64_t *want) {
  int64_t shape[JIT_MAX_RANK];
  memcpy(shape, want, sizeof(int64_t) * (size_t)rank);
  float canary = 42.0f;
  DLTensor o = tu_tensor(&canary, TU_F32, rank, shape);
  TU_OK(jit_run(g, ins, n_in, &o, 1));
  cr_expect(canary == 42.0f, "an empty output was written");
  DLManagedTensor *out[1] = {NULL};
  TU_OK(jit_run_alloc(g, ins, n_in, out, 1));
  cr_assert(out[0] != NULL);
  tu_assert_shape(out[0]->dl_tensor.ndim, out[0]->dl_tensor.shape, rank, want,
                  "jit_run_alloc output 0");
  cr_expect(out[0]->dl_tensor.data != NULL);
  out[0]->deleter(out[0]);
  TU_OK(jit_graph_compile(g, ins, n_in));
}

// Expects the binding refused as JIT_UNSUPPORTED naming `op`, by every entry point.
static void expect_empty_refused(jit_graph *g, DLTensor *ins, int n_in, int rank,
                                 int64_t *oshape, const char *op) {
  DLTensor o = tu_tensor(dummy, TU_F32, rank, oshape);
  jit_status s = jit_run(g, ins, n_in, &o, 1);
  TU_EXPECT_CODE(s, JIT_UNSUPPORTED);
  TU_EXPECT_MSG(s, op);
  jit_status_free(s);
  DLManagedTensor *out[1] = {NULL};
  s = jit_run_alloc(g, ins, n_in, out, 1);
  TU_EXPECT_CODE(s, JIT_UNSUPPORTED);
  cr_expect(out[0] == NULL);
  jit_status_free(s);
  s = jit_graph_compile(g, ins, n_in);
  TU_EXPECT_CODE(s, JIT_UNSUPPORTED);
  jit_status_free(s);
}

Test(limits, zero_size_elementwise) {
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "ew");
  int64_t d[2] = {jit_symbol(g, "N"), 3};
  jit_value x = jit_input(g, "x", TU_F32, 2, d);
  jit_output(g, jit_mul(g, jit_relu(g, x), jit_exp(g, x)));
  TU_OK(jit_graph_finalize(g));
  int64_t s0[2] = {0, 3};
  DLTensor in = tu_tensor(dummy, TU_F32, 2, s0);
  expect_empty_run(g, &in, 1, 2, s0);
  // The same graph still runs non-empty bindings, against a plain-C expectation.
  float xs[6] = {-1, 0, 1, 2, -3, 0.5f}, got[6], want[6];
  for (int i = 0; i < 6; i++) want[i] = (xs[i] > 0 ? xs[i] : 0) * expf(xs[i]);
  int64_t s2[2] = {2, 3};
  DLTensor in2 = tu_tensor(xs, TU_F32, 2, s2), o2 = tu_tensor(got, TU_F32, 2, s2);
  TU_OK(jit_run(g, &in2, 1, &o2, 1));
  tu_assert_close(got, want, 6, 1e-5, 1e-5, 2, s2, "relu(x) * exp(x)");
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(limits, zero_size_matmul) {
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "mm");
  int64_t M = jit_symbol(g, "M"), K = jit_symbol(g, "K"), N = jit_symbol(g, "N");
  int64_t da[2] = {M, K}, db[2] = {K, N};
  jit_value a = jit_input(g, "a", TU_F32, 2, da);
  jit_value b = jit_input(g, "b", TU_F32, 2, db);
  jit_output(g, jit_matmul(g, a, b));
  TU_OK(jit_graph_finalize(g));
  // M = 0 and N = 0: empty outputs.
  int64_t sa[2] = {0, 2}, sb[2] = {2, 3}, so[2] = {0, 3};
  DLTensor ins[2] = {tu_tensor(dummy, TU_F32, 2, sa), tu_tensor(dummy, TU_F32, 2, sb)};
  expect_empty_run(g, ins, 2, 2, so);
  sa[0] = 4;
  sb[1] = 0;
  so[0] = 4;
  so[1] = 0;
  expect_empty_run(g, ins, 2, 2, so);
  // K = 0: the product is a [4, 3] of zeros, which no kernel writes: refused.
  sa[1] = 0;
  sb[0] = 0;
  sb[1] = 3;
  so[1] = 3;
  expect_empty_refused(g, ins, 2, 2, so, "matmul");
  // Plain-C expectation for a non-empty binding of the same graph.
  float av[4] = {1, 2, 3, 4}, got[2], want[2];
  int64_t ta[2] = {2, 2}, tb[2] = {2, 1}, to[2] = {2, 1};
  float bcol[2] = {5, 6};
  DLTensor ins2[2] = {tu_tensor(av, TU_F32, 2, ta), tu_tensor(bcol, TU_F32, 2, tb)};
  DLTensor o2 = tu_tensor(got, TU_F32, 2, to);
  TU_OK(jit_run(g, ins2, 2, &o2, 1));
  for (int i = 0; i < 2; i++) want[i] = av[i * 2] * bcol[0] + av[i * 2 + 1] * bcol[1];
  tu_assert_close(got, want, 2, 1e-5, 1e-5, 2, to, "matmul");
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// reduce_* over axis 1 of x [R, C]: R = 0 gives an empty [0]; C = 0 would need the
// identity (0, -inf, NaN) and is refused naming the op.
Test(limits, zero_size_reduce) {
  jit_context *ctx = tu_context();
  const char *names[3] = {"reduce_sum", "reduce_max", "reduce_mean"};
  for (int r = 0; r < 3; r++) {
    jit_graph *g = tu_graph(ctx, names[r]);
    int64_t d[2] = {jit_symbol(g, "R"), jit_symbol(g, "C")};
    jit_value x = jit_input(g, "x", TU_F32, 2, d);
    jit_value y = r == 0 ? jit_reduce_sum(g, x, 1, 0)
                : r == 1 ? jit_reduce_max(g, x, 1, 0)
                         : jit_reduce_mean(g, x, 1, 0);
    jit_output(g, y);
    TU_OK(jit_graph_finalize(g));
    int64_t s[2] = {0, 5}, so[1] = {0};
    DLTensor in = tu_tensor(dummy, TU_F32, 2, s);
    expect_empty_run(g, &in, 1, 1, so);
    s[0] = 3;
    s[1] = 0;
    so[0] = 3;
    expect_empty_refused(g, &in, 1, 1, so, names[r]);
    // Non-empty, against plain C.
    float xs[6] = {1, -2, 3, 4, 5, -6}, got[2], want[2];
    for (int i = 0; i < 2; i++) {
      const float *row = xs + 3 * i;
      float sum = row[0] + row[1] + row[2];
      float mx = fmaxf(row[0], fmaxf(row[1], row[2]));
      want[i] = r == 0 ? sum : r == 1 ? mx : sum / 3;
    }
    int64_t s2[2] = {2, 3}, so2[1] = {2};
    DLTensor in2 = tu_tensor(xs, TU_F32, 2, s2), o2 = tu_tensor(got, TU_F32, 1, so2);
    TU_OK(jit_run(g, &in2, 1, &o2, 1));
    tu_assert_close(got, want, 2, 1e-5, 1e-5, 1, so2, names[r]);
    jit_graph_destroy(g);
  }
  jit_context_destroy(ctx);
}

// Softmax keeps the shape: an empty axis or an empty batch gives an empty output.
Test(limits, zero_size_softmax) {
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "softmax");
  int64_t d[2] = {jit_symbol(g, "R"), jit_symbol(g, "C")};
  jit_output(g, jit_softmax(g, jit_input(g, "x", TU_F32, 2, d), 1));
  TU_OK(jit_graph_finalize(g));
  int64_t s[2] = {3, 0};
  DLTensor in = tu_tensor(dummy, TU_F32, 2, s);
  expect_empty_run(g, &in, 1, 2, s);
  s[0] = 0;
  s[1] = 4;
  expect_empty_run(g, &in, 1, 2, s);
  // Non-empty, against plain C.
  float xs[4] = {1, 2, 3, 4}, got[4], want[4];
  float m = 4, z = 0;
  for (int i = 0; i < 4; i++) z += expf(xs[i] - m);
  for (int i = 0; i < 4; i++) want[i] = expf(xs[i] - m) / z;
  int64_t s1[2] = {1, 4};
  DLTensor in1 = tu_tensor(xs, TU_F32, 2, s1), o1 = tu_tensor(got, TU_F32, 2, s1);
  TU_OK(jit_run(g, &in1, 1, &o1, 1));
  tu_assert_close(got, want, 4, 1e-5, 1e-5, 2, s1, "softmax");
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// An empty input next to a non-empty one whose output does not depend on it: the
// binding has no kernel to run, so the non-empty output is refused.
Test(limits, zero_size_mixed_outputs_refused) {
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "mixed");
  int64_t d[1] = {jit_symbol(g, "N")}, e[1] = {2};
  jit_value x = jit_input(g, "x", TU_F32, 1, d);
  jit_value y = jit_input(g, "y", TU_F32, 1, e);
  jit_output(g, jit_relu(g, x));
  jit_output(g, jit_relu(g, y));
  TU_OK(jit_graph_finalize(g));
  int64_t sx[1] = {0}, sy[1] = {2};
  DLTensor ins[2] = {tu_tensor(dummy, TU_F32, 1, sx), tu_tensor(dummy, TU_F32, 1, sy)};
  DLManagedTensor *out[2] = {NULL, NULL};
  jit_status s = jit_run_alloc(g, ins, 2, out, 2);
  TU_EXPECT_CODE(s, JIT_UNSUPPORTED);
  TU_EXPECT_MSG(s, "output 1");
  cr_expect(out[0] == NULL && out[1] == NULL);
  jit_status_free(s);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

//===--- Graph size ------------------------------------------------------===//

// Past JIT_MAX_NODES values, JIT_MAX_GRAPH_IO inputs or outputs: the builder records
// JIT_RESOURCE_EXHAUSTED naming the limit, returned by finalize; nothing is built past it.
Test(limits, graph_size_limits) {
  jit_context *ctx = tu_context();
  int64_t d[1] = {4};
  jit_graph *g = tu_graph(ctx, "long");
  jit_value x = jit_input(g, "x", TU_F32, 1, d);
  for (int i = 1; i < JIT_MAX_NODES; i++) x = jit_add(g, x, x);
  cr_expect_neq(x.id, 0, "the last value within the limit");
  cr_expect_eq(jit_add(g, x, x).id, 0, "a value past JIT_MAX_NODES");
  jit_output(g, x);
  jit_status s = jit_graph_finalize(g);
  TU_EXPECT_CODE(s, JIT_RESOURCE_EXHAUSTED);
  TU_EXPECT_MSG(s, "JIT_MAX_NODES");
  jit_status_free(s);
  jit_graph_destroy(g);

  g = tu_graph(ctx, "wide");
  x = jit_input(g, "x", TU_F32, 1, d);
  for (int i = 0; i <= JIT_MAX_GRAPH_IO; i++) jit_output(g, x);
  s = jit_graph_finalize(g);
  TU_EXPECT_CODE(s, JIT_RESOURCE_EXHAUSTED);
  TU_EXPECT_MSG(s, "JIT_MAX_GRAPH_IO");
  jit_status_free(s);
  jit_graph_destroy(g);

  g = tu_graph(ctx, "many inputs");
  for (int i = 0; i <= JIT_MAX_GRAPH_IO; i++) x = jit_input(g, "x", TU_F32, 1, d);
  cr_expect_eq(x.id, 0, "an input past JIT_MAX_GRAPH_IO");
  s = jit_graph_finalize(g);
  TU_EXPECT_CODE(s, JIT_RESOURCE_EXHAUSTED);
  TU_EXPECT_MSG(s, "inputs (JIT_MAX_GRAPH_IO)");
  jit_status_free(s);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// The same limits for graphs from MLIR: arguments, results and operations.
Test(limits, mlir_graph_size_limits) {
  jit_context *ctx = tu_context();
  size_t cap = 64 * (size_t)JIT_MAX_NODES + 4096;
  char *t = malloc(cap);
  // JIT_MAX_GRAPH_IO + 1 arguments.
  size_t n = (size_t)snprintf(t, cap, "func.func @f(");
  for (int i = 0; i <= JIT_MAX_GRAPH_IO; i++)
    n += (size_t)snprintf(t + n, cap - n, "%s%%a%d: tensor<2xf32>", i ? ", " : "", i);
  n += (size_t)snprintf(t + n, cap - n, ") -> tensor<2xf32> {\n  return %%a0 : tensor<2xf32>\n}\n");
  jit_graph *g = NULL;
  jit_status s = jit_graph_from_mlir(ctx, t, n, NULL, &g);
  TU_EXPECT_CODE(s, JIT_RESOURCE_EXHAUSTED);
  TU_EXPECT_MSG(s, "JIT_MAX_GRAPH_IO");
  jit_status_free(s);
  cr_expect(g == NULL);
  // JIT_MAX_NODES operations.
  n = (size_t)snprintf(t, cap, "func.func @f(%%a: tensor<2xf32>) -> tensor<2xf32> {\n"
                               "  %%v0 = arith.addf %%a, %%a : tensor<2xf32>\n");
  for (int i = 1; i < JIT_MAX_NODES; i++)
    n += (size_t)snprintf(t + n, cap - n, "  %%v%d = arith.addf %%v%d, %%v%d : tensor<2xf32>\n",
                          i, i - 1, i - 1);
  n += (size_t)snprintf(t + n, cap - n, "  return %%v%d : tensor<2xf32>\n}\n",
                        JIT_MAX_NODES - 1);
  s = jit_graph_from_mlir(ctx, t, n, NULL, &g);
  TU_EXPECT_CODE(s, JIT_RESOURCE_EXHAUSTED);
  TU_EXPECT_MSG(s, "JIT_MAX_NODES");
  jit_status_free(s);
  free(t);
  jit_context_destroy(ctx);
}
