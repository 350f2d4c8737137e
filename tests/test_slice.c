//===--- test_slice.c - slices whose bounds follow symbols ------------------===//
//
// jit_slice_symbolic: x[:S], x[S - 8 :], x[S - 1 : S + 2 : 2] on a cache whose length T
// is another symbol, along axis 0 and 1, for bindings with 1, primes and sizes where a
// bound turns negative (counts from the end) or passes the dim (clamped); each checked
// against a plain C slice, with exact kernels and the generic kernel, and through
// to_mlir/from_mlir. Bad symbols and empty bindings are errors with their statuses.
//
//===----------------------------------------------------------------------===//
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

// NumPy's bounds of x[a:b:step] on a dim of n (as the library documents them).
static void np_bounds(int64_t n, int64_t a, int64_t b, int64_t step, int64_t *start,
                      int64_t *len) {
  a = a < 0 ? (a + n < 0 ? 0 : a + n) : (a > n ? n : a);
  b = b < 0 ? (b + n < 0 ? 0 : b + n) : (b > n ? n : b);
  *start = a;
  *len = b > a ? (b - a - 1) / step + 1 : 0;
}

typedef struct slice_case {
  int sym_start, sym_stop;  // whether the bound adds S
  int64_t start, stop, step;
} slice_case;

// cache [T, 3] (axis 0) or [2, T, 3] (axis 1), q [S, 3]: out = slice of the cache along
// `axis` with bounds (S if the case says so) + offset. Inputs' values are their flat
// index, so a wrong row shows.
static jit_graph *build(jit_context *ctx, const slice_case *c, int axis) {
  jit_graph *g = tu_graph(ctx, "cache_slice");
  int64_t S = jit_symbol(g, "S"), T = jit_symbol(g, "T");
  int64_t dq[2] = {S, 3}, dc0[2] = {T, 3}, dc1[3] = {2, T, 3};
  jit_value q = jit_input(g, "q", TU_F32, 2, dq);
  jit_value cache = jit_input(g, "cache", TU_F32, axis ? 3 : 2, axis ? dc1 : dc0);
  jit_value s = jit_slice_symbolic(g, cache, axis, c->sym_start ? S : 0, c->start,
                                   c->sym_stop ? S : 0, c->stop, c->step);
  // q joins in (a broadcast add of zeros), so that every input is used.
  jit_value zero = jit_mul(g, jit_reduce_sum(g, q, 0, 1), jit_scalar(g, 0.0, TU_F32));
  jit_output(g, jit_add(g, s, zero));
  TU_OK(jit_graph_finalize(g));
  return g;
}

// Runs `g` for S = s_val, T = t_val and checks against the C slice.
static void check_binding(jit_graph *g, const slice_case *c, int axis, int64_t s_val,
                          int64_t t_val, const char *how) {
  int64_t dq[2] = {s_val, 3}, dc0[2] = {t_val, 3}, dc1[3] = {2, t_val, 3};
  int rank = axis ? 3 : 2;
  int64_t *dc = axis ? dc1 : dc0;
  int64_t nc = ref_numel(rank, dc);
  float *q = tu_malloc((size_t)(s_val * 3) * 4), *cache = tu_malloc((size_t)nc * 4);
  for (int64_t i = 0; i < s_val * 3; i++) q[i] = (float)(1000 + i);
  for (int64_t i = 0; i < nc; i++) cache[i] = (float)i;
  int64_t start, len;
  np_bounds(t_val, c->start + (c->sym_start ? s_val : 0), c->stop + (c->sym_stop ? s_val : 0),
            c->step, &start, &len);
  cr_assert(len > 0, "test case is empty");
  int64_t want_dims[3] = {2, len, 3};
  if (!axis) want_dims[0] = len, want_dims[1] = 3;
  int64_t outer = axis ? 2 : 1;
  float *want = tu_malloc((size_t)(outer * len * 3) * 4);
  for (int64_t o = 0; o < outer; o++)
    for (int64_t r = 0; r < len; r++)
      for (int64_t j = 0; j < 3; j++)
        want[(o * len + r) * 3 + j] = cache[(o * t_val + start + r * c->step) * 3 + j];
  DLTensor ins[2] = {tu_tensor(q, TU_F32, 2, dq), tu_tensor(cache, TU_F32, rank, dc)};
  char what[160];
  snprintf(what, sizeof what, "%s axis %d [%s%lld : %s%lld : %lld] S=%lld T=%lld", how, axis,
           c->sym_start ? "S + " : "", (long long)c->start, c->sym_stop ? "S + " : "",
           (long long)c->stop, (long long)c->step, (long long)s_val, (long long)t_val);
  tu_run_check(g, ins, 2, TU_F32, rank, want_dims, want, 0, 0, NULL, what);
  free(q);
  free(cache);
  free(want);
}

static const slice_case kCases[] = {
    {0, 1, 0, 0, 1},    // x[:S]
    {1, 0, -8, JIT_SLICE_END, 1},  // x[S - 8 :]: from the end while S < 8
    {1, 1, -1, 2, 2},   // x[S - 1 : S + 2 : 2]
    {1, 1, -3, 0, 1},   // x[S - 3 : S]: the last rows before S
};
// (S, T) pairs: 1, primes, S past T (clamped), S - 8 below -T (clamped to 0).
static const int64_t kBindings[][2] = {{1, 1}, {1, 7}, {3, 10}, {7, 7}, {5, 13}, {11, 4}, {2, 17}};

// Whether case c is non-empty for S, T (the empty ones are the error test's).
static bool nonempty(const slice_case *c, int64_t s, int64_t t) {
  int64_t start, len;
  np_bounds(t, c->start + (c->sym_start ? s : 0), c->stop + (c->sym_stop ? s : 0), c->step,
            &start, &len);
  return len > 0;
}

static void check_policy(jit_shape_policy policy, const char *how) {
  for (size_t k = 0; k < sizeof kCases / sizeof kCases[0]; k++)
    for (int axis = 0; axis < 2; axis++) {
      jit_context *ctx = tu_context_policy(policy);
      jit_graph *g = build(ctx, &kCases[k], axis);
      int runs = 0;
      for (size_t b = 0; b < sizeof kBindings / sizeof kBindings[0]; b++)
        if (nonempty(&kCases[k], kBindings[b][0], kBindings[b][1])) {
          check_binding(g, &kCases[k], axis, kBindings[b][0], kBindings[b][1], how);
          runs++;
        }
      // GENERIC on the CPU: every run on the one `?`-dim kernel (GPUs run exact ones).
      jit_stats st;
      memset(&st, 0, sizeof st);
      st.struct_size = sizeof st;
      TU_OK(jit_context_stats(ctx, &st));
      if (policy == JIT_SHAPE_POLICY_GENERIC && !getenv("JITML_TEST_DEVICE"))
        cr_expect(st.generic_runs == (uint64_t)runs && st.generic_compiles <= 1,
                  "%d runs: %llu on the generic kernel, %llu generic compiles", runs,
                  (unsigned long long)st.generic_runs,
                  (unsigned long long)st.generic_compiles);
      jit_graph_destroy(g);
      jit_context_destroy(ctx);
    }
}

Test(slice_symbolic, exact_kernels) { check_policy(JIT_SHAPE_POLICY_EXACT, "exact"); }
Test(slice_symbolic, generic_kernel) { check_policy(JIT_SHAPE_POLICY_GENERIC, "generic"); }

// The graph written as MLIR and read back is the same graph: same results.
Test(slice_symbolic, mlir_round_trip) {
  jit_context *ctx = tu_context();
  for (size_t k = 0; k < sizeof kCases / sizeof kCases[0]; k++) {
    jit_graph *g = build(ctx, &kCases[k], 1);
    char *text = NULL;
    TU_OK(jit_graph_to_mlir(g, &text));
    cr_expect(strstr(text, " s ") != NULL, "the record lacks the bounds' symbols: %s", text);
    jit_graph *back = NULL;
    TU_OK(jit_graph_from_mlir(ctx, text, strlen(text), NULL, &back));
    // Rebuilt from its record (not imported as MLIR): it writes the same text.
    char *again = NULL;
    TU_OK(jit_graph_to_mlir(back, &again));
    cr_expect(strcmp(text, again) == 0, "from_mlir did not rebuild the node graph");
    jit_string_free(again);
    for (size_t b = 0; b < sizeof kBindings / sizeof kBindings[0]; b++)
      if (nonempty(&kCases[k], kBindings[b][0], kBindings[b][1]))
        check_binding(back, &kCases[k], 1, kBindings[b][0], kBindings[b][1], "from_mlir");
    jit_string_free(text);
    jit_graph_destroy(back);
    jit_graph_destroy(g);
  }
  jit_context_destroy(ctx);
}

Test(slice_symbolic, bad_bounds) {
  jit_context *ctx = tu_context();
  int64_t d[2] = {7, 3};
  // Not a symbol of the graph.
  jit_graph *g = tu_graph(ctx, "bad_symbol");
  jit_value x = jit_input(g, "x", TU_F32, 2, d);
  jit_output(g, jit_slice_symbolic(g, x, 0, -999, 0, 0, 2, 1));
  jit_status s = jit_graph_finalize(g);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  TU_EXPECT_MSG(s, "start_symbol -999");
  jit_status_free(s);
  jit_graph_destroy(g);
  // A symbol no input carries has no value.
  g = tu_graph(ctx, "unbound");
  int64_t S = jit_symbol(g, "S");
  x = jit_input(g, "x", TU_F32, 2, d);
  jit_output(g, jit_slice_symbolic(g, x, 0, 0, 0, S, 0, 1));
  s = jit_graph_finalize(g);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  TU_EXPECT_MSG(s, "symbol S is not a dim of any input");
  jit_status_free(s);
  jit_graph_destroy(g);
  // An offset next to a symbol past 2^40.
  g = tu_graph(ctx, "far");
  S = jit_symbol(g, "S");
  int64_t ds[2] = {S, 3};
  x = jit_input(g, "x", TU_F32, 2, ds);
  jit_output(g, jit_slice_symbolic(g, x, 0, S, INT64_C(1) << 41, 0, JIT_SLICE_END, 1));
  s = jit_graph_finalize(g);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  jit_status_free(s);
  jit_graph_destroy(g);
  // x[S - 3 : S] on a cache of T < S - 3 rows is empty for that binding only.
  g = build(ctx, &kCases[3], 0);
  int64_t dq[2] = {11, 3}, dc[2] = {4, 3}, dout[2] = {1, 3};
  float q[33] = {0}, cache[12] = {0}, out[3];
  DLTensor ins[2] = {tu_tensor(q, TU_F32, 2, dq), tu_tensor(cache, TU_F32, 2, dc)};
  DLTensor o = tu_tensor(out, TU_F32, 2, dout);
  s = jit_run(g, ins, 2, &o, 1);
  TU_EXPECT_CODE(s, JIT_SHAPE_MISMATCH);
  TU_EXPECT_MSG(s, "is empty");
  jit_status_free(s);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}
