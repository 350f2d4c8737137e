//===--- test_run.c - jit_run: specialization, stats, shapes, threads ------===//
//
// One graph run with several shapes compiles each shape once and serves repeats from
// memory; jit_output_shape compiles nothing; jit_run_alloc hands out DLManagedTensors;
// several threads running one graph on new shapes compile each key exactly once.
//
// Every test points JITML_CACHE_DIR (and XDG_CACHE_HOME) at a fresh temporary directory,
// so that an on-disk kernel cache from an earlier run cannot turn compiles into loads.
//
//===----------------------------------------------------------------------===//
#define _XOPEN_SOURCE 700  // mkdtemp, setenv, nftw, pthread_barrier_t

#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jitml.h"
#include "ref.h"
#include "cache_fixture.h"
#include "paths.h"
#include "util.h"

//===--- Fixture: a private cache directory ------------------------------------===//

TestSuite(run, .init = tu_cache_setup, .fini = tu_cache_teardown);

//===--- A small dense layer: y = relu(x W + b), x [N, IN] ----------------------===//

enum { IN = 16, OUT = 8 };

typedef struct layer {
  float w[IN * OUT];
  float b[OUT];
} layer;

static jit_graph *build_layer(jit_context *ctx) {
  jit_graph *g = tu_graph(ctx, "layer");
  int64_t dx[2] = {jit_symbol(g, "N"), IN}, dw[2] = {IN, OUT}, db[1] = {OUT};
  jit_value x = jit_input(g, "x", TU_F32, 2, dx);
  jit_value w = jit_input(g, "w", TU_F32, 2, dw);
  jit_value b = jit_input(g, "b", TU_F32, 1, db);
  jit_output(g, jit_relu(g, jit_add(g, jit_matmul(g, x, w), b)));
  TU_OK(jit_graph_finalize(g));
  return g;
}

static void layer_init(layer *l, uint64_t seed) {
  ref_rng rng;
  ref_rng_seed(&rng, seed);
  ref_rng_fill_signed(&rng, l->w, IN * OUT);
  ref_rng_fill_signed(&rng, l->b, OUT);
}

static void layer_ref(const layer *l, const float *x, int64_t n, float *y) {
  for (int64_t i = 0; i < n; i++)
    for (int j = 0; j < OUT; j++) {
      double acc = l->b[j];
      for (int k = 0; k < IN; k++) acc += (double)x[i * IN + k] * l->w[k * OUT + j];
      y[i * OUT + j] = acc > 0 ? (float)acc : 0.0f;
    }
}

// Runs the layer for batch n; returns the largest error (or a negative code for a
// failed status, so that threads need no Criterion asserts).
static double layer_run(jit_graph *g, layer *l, int64_t n, uint64_t seed,
                        char *err, size_t err_size) {
  ref_rng rng;
  ref_rng_seed(&rng, seed);
  float *x = malloc((size_t)n * IN * sizeof(float));
  float *y = malloc((size_t)n * OUT * sizeof(float));
  float *want = malloc((size_t)n * OUT * sizeof(float));
  double worst = -1.0;
  if (!x || !y || !want) {
    snprintf(err, err_size, "out of memory");
    goto done;
  }
  ref_rng_fill_signed(&rng, x, n * IN);
  for (int64_t i = 0; i < n * OUT; i++) y[i] = NAN;
  layer_ref(l, x, n, want);
  int64_t dx[2] = {n, IN}, dw[2] = {IN, OUT}, db[1] = {OUT}, dy[2] = {n, OUT};
  DLTensor ins[3] = {tu_tensor(x, TU_F32, 2, dx), tu_tensor(l->w, TU_F32, 2, dw),
                     tu_tensor(l->b, TU_F32, 1, db)};
  DLTensor out = tu_tensor(y, TU_F32, 2, dy);
  jit_status s = jit_run(g, ins, 3, &out, 1);
  if (s) {
    snprintf(err, err_size, "jit_run N=%lld: %s: %s", (long long)n,
             jit_status_code_name(jit_status_get_code(s)), jit_status_message(s));
    jit_status_free(s);
    goto done;
  }
  worst = 0.0;
  for (int64_t i = 0; i < n * OUT; i++) {
    double d = fabs((double)y[i] - want[i]);
    if (!(d <= worst)) worst = d;  // NaN propagates as +inf-like
    if (isnan(y[i])) worst = INFINITY;
  }
done:
  free(x);
  free(y);
  free(want);
  return worst;
}

static void layer_check(jit_graph *g, layer *l, int64_t n, uint64_t seed) {
  char err[1024] = "";
  double worst = layer_run(g, l, n, seed, err, sizeof(err));
  cr_assert(worst >= 0.0, "%s", err);
  cr_assert(worst <= 1e-5, "N=%lld: max |error| %g", (long long)n, worst);
}

//===--- Specialization and statistics -------------------------------------------===//

Test(run, each_shape_compiles_once) {
  jit_context *ctx = tu_context_policy(JIT_SHAPE_POLICY_EXACT);
  jit_graph *g = build_layer(ctx);
  layer l;
  layer_init(&l, 1);
  jit_stats st = get_stats(ctx);
  cr_assert_eq(st.runs, 0);
  cr_assert_eq(st.compiles, 0);

  const int64_t ns[] = {1, 7, 64, 7, 1};
  const uint64_t want_compiles[] = {1, 2, 3, 3, 3};
  const uint64_t want_hits[] = {0, 0, 0, 1, 2};
  for (int i = 0; i < 5; i++) {
    layer_check(g, &l, ns[i], 100 + (uint64_t)i);
    st = get_stats(ctx);
    cr_assert_eq(st.runs, (uint64_t)i + 1, "after run %d (N=%lld): runs %llu", i,
                 (long long)ns[i], (unsigned long long)st.runs);
    cr_assert_eq(st.compiles, want_compiles[i],
                 "after run %d (N=%lld): compiles %llu, want %llu", i, (long long)ns[i],
                 (unsigned long long)st.compiles, (unsigned long long)want_compiles[i]);
    cr_assert_eq(st.memory_hits, want_hits[i],
                 "after run %d (N=%lld): memory_hits %llu, want %llu", i,
                 (long long)ns[i], (unsigned long long)st.memory_hits,
                 (unsigned long long)want_hits[i]);
    cr_assert_eq(st.misses, want_compiles[i], "after run %d: misses %llu", i,
                 (unsigned long long)st.misses);
  }
  cr_assert_eq(st.kernels, 3, "kernels loaded: %llu", (unsigned long long)st.kernels);
  cr_assert(st.compile_ms > 0.0, "compile_ms %g", st.compile_ms);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// One context compiling more shapes than an MLIR context serves before it is retired
// (lowering/compile_cpu.c: 32): every kernel exact, including those compiled in a
// reused MLIR context and in the one that replaced it.
Test(run, many_shapes_in_one_context) {
  jit_context *ctx = tu_context_policy(JIT_SHAPE_POLICY_EXACT);
  jit_graph *g = build_layer(ctx);
  layer l;
  layer_init(&l, 3);
  for (int64_t n = 1; n <= 40; n++) layer_check(g, &l, n, 500 + (uint64_t)n);
  layer_check(g, &l, 1, 600);  // still a memory hit
  jit_stats st = get_stats(ctx);
  cr_assert_eq(st.compiles, 40, "compiles %llu", (unsigned long long)st.compiles);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(run, stats_struct_size_zero_means_current) {
  jit_context *ctx = tu_context();
  jit_graph *g = build_layer(ctx);
  layer l;
  layer_init(&l, 2);
  layer_check(g, &l, 3, 1);
  jit_stats st;
  memset(&st, 0xab, sizeof(st));
  st.struct_size = 0;
  TU_OK(jit_context_stats(ctx, &st));
  cr_assert_eq(st.runs, 1);
  cr_assert_eq(st.compiles, 1);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(run, failed_runs_are_not_counted) {
  jit_context *ctx = tu_context();
  jit_graph *g = build_layer(ctx);
  layer l;
  layer_init(&l, 7);
  layer_check(g, &l, 2, 1);
  float x[2 * (IN + 1)] = {0}, y[2 * OUT];
  int64_t dx[2] = {2, IN + 1}, dw[2] = {IN, OUT}, db[1] = {OUT}, dy[2] = {2, OUT};
  DLTensor ins[3] = {tu_tensor(x, TU_F32, 2, dx), tu_tensor(l.w, TU_F32, 2, dw),
                     tu_tensor(l.b, TU_F32, 1, db)};
  DLTensor out = tu_tensor(y, TU_F32, 2, dy);
  jit_status s = jit_run(g, ins, 3, &out, 1);
  TU_EXPECT_CODE(s, JIT_SHAPE_MISMATCH);
  jit_status_free(s);
  jit_stats st = get_stats(ctx);
  cr_assert_eq(st.runs, 1, "runs %llu", (unsigned long long)st.runs);
  cr_assert_eq(st.compiles, 1, "compiles %llu", (unsigned long long)st.compiles);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(run, same_shape_new_data_is_recomputed) {
  jit_context *ctx = tu_context();
  jit_graph *g = build_layer(ctx);
  layer l;
  layer_init(&l, 3);
  layer_check(g, &l, 5, 10);
  layer_check(g, &l, 5, 11);  // same key, different x
  layer_init(&l, 4);
  layer_check(g, &l, 5, 12);  // same key, different weights
  jit_stats st = get_stats(ctx);
  cr_assert_eq(st.compiles, 1);
  cr_assert_eq(st.memory_hits, 2);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(run, contexts_are_independent) {
  jit_context *a = tu_context(), *b = tu_context();
  jit_graph *ga = build_layer(a), *gb = build_layer(b);
  layer l;
  layer_init(&l, 5);
  layer_check(ga, &l, 7, 1);
  layer_check(gb, &l, 7, 2);
  layer_check(ga, &l, 7, 3);
  jit_stats sa = get_stats(a), sb = get_stats(b);
  cr_assert_eq(sa.compiles, 1);
  cr_assert_eq(sa.runs, 2);
  // b has its own kernel table, so it needs the kernel too: it loads what a compiled
  // into the shared disk cache instead of compiling it again.
  cr_assert_eq(sb.compiles, 0, "context b compiled %llu", (unsigned long long)sb.compiles);
  cr_assert_eq(sb.disk_hits, 1, "context b had %llu disk hits",
               (unsigned long long)sb.disk_hits);
  cr_assert_eq(sb.memory_hits, 0);
  cr_assert_eq(sb.runs, 1);
  jit_graph_destroy(ga);
  jit_graph_destroy(gb);
  jit_context_destroy(a);
  jit_context_destroy(b);
}

Test(run, graph_destroyed_then_rebuilt) {
  jit_context *ctx = tu_context();
  layer l;
  layer_init(&l, 6);
  jit_graph *g = build_layer(ctx);
  layer_check(g, &l, 9, 1);
  jit_graph_destroy(g);
  jit_stats st = get_stats(ctx);
  cr_assert(st.kernels >= 1, "kernels of a destroyed graph stay in the context");
  g = build_layer(ctx);
  layer_check(g, &l, 9, 2);
  layer_check(g, &l, 4, 3);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

//===--- jit_output_shape -------------------------------------------------------===//

Test(run, output_shape_compiles_nothing) {
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "shapes");
  int64_t N = jit_symbol(g, "N"), M = jit_symbol(g, "M");
  int64_t dx[2] = {N, 6}, dw[2] = {6, M}, dr[3] = {N, 3, 2};
  jit_value x = jit_input(g, "x", TU_F32, 2, dx);
  jit_value w = jit_input(g, "w", TU_F32, 2, dw);
  const int perm[2] = {1, 0};
  jit_output(g, jit_matmul(g, x, w));                                   // [N, M]
  jit_output(g, jit_transpose(g, x, perm));                             // [6, N]
  jit_output(g, jit_reduce_sum(g, jit_reshape(g, x, 3, dr), 1, 1));     // [N, 1, 2]
  jit_output(g, jit_reduce_max(g, jit_reduce_sum(g, x, -1, 0), 0, 0));  // []
  TU_OK(jit_graph_finalize(g));
  cr_assert_eq(jit_graph_num_inputs(g), 2);
  cr_assert_eq(jit_graph_num_outputs(g), 4);

  int64_t sx[2] = {5, 6}, sw[2] = {6, 11};
  DLTensor ins[2] = {tu_tensor(NULL, TU_F32, 2, sx), tu_tensor(NULL, TU_F32, 2, sw)};
  const int want_rank[4] = {2, 2, 3, 0};
  const int64_t want[4][3] = {{5, 11}, {6, 5}, {5, 1, 2}, {0}};
  for (int i = 0; i < 4; i++) {
    int rank = -1;
    int64_t dims[JIT_MAX_RANK];
    for (int j = 0; j < JIT_MAX_RANK; j++) dims[j] = -7;
    TU_OK(jit_output_shape(g, ins, 2, i, &rank, dims));
    char what[32];
    snprintf(what, sizeof(what), "output %d", i);
    tu_assert_shape(rank, dims, want_rank[i], want[i], what);
  }
  jit_stats st = get_stats(ctx);
  cr_assert_eq(st.compiles, 0, "jit_output_shape compiled %llu kernels",
               (unsigned long long)st.compiles);
  cr_assert_eq(st.runs, 0);

  // Then run for real: the shapes must agree with what the shape function said.
  ref_rng rng;
  ref_rng_seed(&rng, 17);
  float xv[30], wv[66], o0[55], o1[30], o2[10], o3[1];
  float w0[55], w1[30], w2[10], w3, rows[5];
  ref_rng_fill_signed(&rng, xv, 30);
  ref_rng_fill_signed(&rng, wv, 66);
  int64_t d0[2], d1[2], d2[3], d3[1], dtmp[3], d3x[3] = {5, 3, 2};
  ref_matmul(xv, 2, sx, wv, 2, sw, w0, d0);
  ref_transpose(xv, 2, sx, perm, w1, d1);
  ref_reduce(REF_SUM, xv, 3, d3x, 1, 1, w2, d2);
  ref_reduce(REF_SUM, xv, 2, sx, -1, 0, rows, dtmp);
  ref_reduce(REF_RMAX, rows, 1, dtmp, 0, 0, &w3, d3);
  ins[0].data = xv;
  ins[1].data = wv;
  DLTensor outs[4] = {tu_tensor(o0, TU_F32, 2, d0), tu_tensor(o1, TU_F32, 2, d1),
                      tu_tensor(o2, TU_F32, 3, d2), tu_tensor(o3, TU_F32, 0, d3)};
  TU_OK(jit_run(g, ins, 2, outs, 4));
  tu_assert_close(o0, w0, 55, 1e-5, 1e-5, 2, d0, "matmul output");
  tu_assert_close(o1, w1, 30, 0.0, 0.0, 2, d1, "transpose output");
  tu_assert_close(o2, w2, 10, 1e-5, 1e-5, 3, d2, "reshape+sum output");
  tu_assert_close(o3, &w3, 1, 1e-5, 1e-5, 0, NULL, "rank-0 output");
  st = get_stats(ctx);
  cr_assert_eq(st.compiles, 1);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

//===--- jit_run_alloc -----------------------------------------------------------===//

static void check_managed(DLManagedTensor *m, DLDataType dt, int rank,
                          const int64_t *dims, const float *want, double rtol,
                          double atol, const char *what) {
  cr_assert(m != NULL, "%s: NULL managed tensor", what);
  cr_assert(m->deleter != NULL, "%s: no deleter", what);
  DLTensor *t = &m->dl_tensor;
  cr_assert_eq(t->device.device_type, kDLCPU, "%s: device %d", what,
               (int)t->device.device_type);
  cr_assert(t->dtype.code == dt.code && t->dtype.bits == dt.bits &&
                t->dtype.lanes == dt.lanes,
            "%s: dtype {%d,%d,%d}", what, t->dtype.code, t->dtype.bits, t->dtype.lanes);
  cr_assert(rank == 0 || t->shape != NULL, "%s: NULL shape", what);
  tu_assert_shape(t->ndim, t->shape, rank, dims, what);
  if (t->strides) {  // allowed, but must be dense row-major
    int64_t s[8];
    ref_strides(rank, dims, s);
    for (int i = 0; i < rank; i++)
      if (dims[i] > 1)
        cr_assert_eq(t->strides[i], s[i], "%s: stride %d is %lld", what, i,
                     (long long)t->strides[i]);
  }
  cr_assert(t->data != NULL, "%s: NULL data", what);
  int64_t n = ref_numel(rank, dims);
  float *got = tu_malloc((size_t)n * sizeof(float));
  const char *base = (const char *)t->data + t->byte_offset;
  if (tu_is_f16(dt))
    ref_f16_to_f32_array((const uint16_t *)base, got, n);
  else
    memcpy(got, base, (size_t)n * sizeof(float));
  tu_assert_close(got, want, n, rtol, atol, rank, dims, what);
  free(got);
}

static void check_run_alloc(DLDataType dt) {
  const int f16 = tu_is_f16(dt);
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "alloc");
  int64_t dx[2] = {jit_symbol(g, "N"), 13};
  const int perm[2] = {1, 0};
  jit_value x = jit_input(g, "x", dt, 2, dx);
  jit_output(g, jit_exp(g, x));               // [N, 13]
  jit_output(g, jit_transpose(g, x, perm));   // [13, N]
  TU_OK(jit_graph_finalize(g));
  ref_rng rng;
  ref_rng_seed(&rng, 41);
  const int64_t ns[] = {3, 29};
  for (int k = 0; k < 2; k++) {
    int64_t n = ns[k], d[2] = {n, 13}, dt_[2];
    float *xv = tu_malloc((size_t)(n * 13) * 4), *we = tu_malloc((size_t)(n * 13) * 4),
          *wt = tu_malloc((size_t)(n * 13) * 4);
    ref_rng_fill_signed(&rng, xv, n * 13);
    void *px = tu_input_data(dt, xv, n * 13);
    ref_unary(REF_EXP, xv, n * 13, we);
    ref_transpose(xv, 2, d, perm, wt, dt_);
    if (f16) ref_round_f16_array(we, n * 13);
    DLTensor in = tu_tensor(px, dt, 2, d);
    DLManagedTensor *outs[2] = {NULL, NULL};
    TU_OK(jit_run_alloc(g, &in, 1, outs, 2));
    check_managed(outs[0], dt, 2, d, we, f16 ? 5e-3 : 1e-5, f16 ? 1e-4 : 1e-6, "exp");
    check_managed(outs[1], dt, 2, dt_, wt, 0.0, 0.0, "transpose");
    outs[0]->deleter(outs[0]);
    outs[1]->deleter(outs[1]);
    free(xv);
    free(we);
    free(wt);
    free(px);
  }
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(run, run_alloc_f32) { check_run_alloc(TU_F32); }
Test(run, run_alloc_f16) { check_run_alloc(TU_F16); }

Test(run, run_alloc_failure_allocates_nothing) {
  jit_context *ctx = tu_context();
  jit_graph *g = build_layer(ctx);
  float x[2 * 15] = {0}, w[IN * OUT] = {0}, b[OUT] = {0};
  int64_t dx[2] = {2, 15}, dw[2] = {IN, OUT}, db[1] = {OUT};  // x has 15, not 16
  DLTensor ins[3] = {tu_tensor(x, TU_F32, 2, dx), tu_tensor(w, TU_F32, 2, dw),
                     tu_tensor(b, TU_F32, 1, db)};
  DLManagedTensor *out = (DLManagedTensor *)&ins[0];  // not NULL: must be reset
  jit_status s = jit_run_alloc(g, ins, 3, &out, 1);
  TU_EXPECT_CODE(s, JIT_SHAPE_MISMATCH);
  cr_expect(out == NULL, "out_outputs[0] not reset to NULL on failure");
  jit_status_free(s);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

//===--- Tensor layouts accepted at the boundary ---------------------------------===//

Test(run, explicit_dense_strides_accepted) {
  jit_context *ctx = tu_context();
  jit_graph *g = build_layer(ctx);
  layer l;
  layer_init(&l, 8);
  float x[3 * IN], y[3 * OUT], want[3 * OUT];
  ref_rng rng;
  ref_rng_seed(&rng, 9);
  ref_rng_fill_signed(&rng, x, 3 * IN);
  layer_ref(&l, x, 3, want);
  int64_t dx[2] = {3, IN}, sx[2] = {IN, 1}, dw[2] = {IN, OUT}, sw[2] = {OUT, 1},
          db[1] = {OUT}, sb[1] = {1}, dy[2] = {3, OUT}, sy[2] = {OUT, 1};
  DLTensor ins[3] = {tu_tensor(x, TU_F32, 2, dx), tu_tensor(l.w, TU_F32, 2, dw),
                     tu_tensor(l.b, TU_F32, 1, db)};
  ins[0].strides = sx;
  ins[1].strides = sw;
  ins[2].strides = sb;
  DLTensor out = tu_tensor(y, TU_F32, 2, dy);
  out.strides = sy;
  TU_OK(jit_run(g, ins, 3, &out, 1));
  tu_assert_close(y, want, 3 * OUT, 1e-5, 1e-5, 2, dy, "dense explicit strides");
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(run, free_strides_of_unit_dims_and_empty_tensors) {
  // DLPack leaves the stride of a size-1 dim, and every stride of an empty tensor,
  // free; NumPy 2 and torch 2 export such strides ((0, 1) for a (0, 4) array).
  jit_context *ctx = tu_context();
  jit_graph *g = build_layer(ctx);
  layer l;
  layer_init(&l, 8);
  float x[IN], y[OUT], want[OUT];
  ref_rng rng;
  ref_rng_seed(&rng, 10);
  ref_rng_fill_signed(&rng, x, IN);
  layer_ref(&l, x, 1, want);
  int64_t dx[2] = {1, IN}, sx[2] = {0, 1}, dw[2] = {IN, OUT}, db[1] = {OUT},
          dy[2] = {1, OUT}, sy[2] = {12345, 1};
  DLTensor ins[3] = {tu_tensor(x, TU_F32, 2, dx), tu_tensor(l.w, TU_F32, 2, dw),
                     tu_tensor(l.b, TU_F32, 1, db)};
  ins[0].strides = sx;
  DLTensor out = tu_tensor(y, TU_F32, 2, dy);
  out.strides = sy;
  TU_OK(jit_run(g, ins, 3, &out, 1));
  tu_assert_close(y, want, OUT, 1e-5, 1e-5, 2, dy, "size-1 dims with odd strides");
  // Empty batch: strides (0, 0) are fine, nothing is addressed.
  int64_t ex[2] = {0, IN}, es[2] = {0, 0}, ey[2] = {0, OUT};
  ins[0] = tu_tensor(x, TU_F32, 2, ex);
  ins[0].strides = es;
  out = tu_tensor(y, TU_F32, 2, ey);
  out.strides = es;
  TU_OK(jit_run(g, ins, 3, &out, 1));
  // A real non-dense layout is still refused, naming the dim.
  int64_t dx2[2] = {2, IN}, sx2[2] = {1, 2};
  float x2[2 * IN] = {0};
  ins[0] = tu_tensor(x2, TU_F32, 2, dx2);
  ins[0].strides = sx2;
  int64_t dy2[2] = {2, OUT};
  float y2[2 * OUT];
  out = tu_tensor(y2, TU_F32, 2, dy2);
  jit_status s = jit_run(g, ins, 3, &out, 1);
  TU_EXPECT_CODE(s, JIT_UNSUPPORTED);
  cr_expect(strstr(jit_status_message(s), "dim 1 has stride 2") != NULL, "%s",
            jit_status_message(s));
  jit_status_free(s);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(run, output_info_before_binding) {
  // An output's dims: sizes, the input symbol a dim passes through, JIT_DIM_UNKNOWN
  // where a binding is needed (a concat's N + M).
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "out_info");
  int64_t N = jit_symbol(g, "N"), M = jit_symbol(g, "M");
  jit_value a = jit_input(g, "a", TU_F32, 2, (int64_t[]){N, 4});
  jit_value b = jit_input(g, "b", TU_F32, 2, (int64_t[]){M, 4});
  jit_value w = jit_input(g, "w", TU_F16, 2, (int64_t[]){4, 3});
  jit_output(g, jit_matmul(g, jit_cast(g, a, TU_F16), w));
  jit_output(g, jit_concat(g, (jit_value[]){a, b}, 2, 0));
  jit_output_info o;
  jit_status s = jit_graph_output_info(g, 0, &o);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);  // not finalized yet
  jit_status_free(s);
  TU_OK(jit_graph_finalize(g));
  TU_OK(jit_graph_output_info(g, 0, &o));
  cr_expect(o.rank == 2 && o.dtype.code == kDLFloat && o.dtype.bits == 16);
  cr_expect(o.dims[0] == N && o.dims[1] == 3, "dims %lld %lld", (long long)o.dims[0],
            (long long)o.dims[1]);
  cr_expect_str_eq(jit_symbol_name(g, o.dims[0]), "N");
  TU_OK(jit_graph_output_info(g, 1, &o));
  cr_expect(o.rank == 2 && o.dims[0] == JIT_DIM_UNKNOWN && o.dims[1] == 4);
  s = jit_graph_output_info(g, 2, &o);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  cr_expect(strstr(jit_status_message(s), "output index 2") != NULL, "%s",
            jit_status_message(s));
  jit_status_free(s);
  s = jit_graph_output_info(g, 0, NULL);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  jit_status_free(s);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(run, run_options_on_the_cpu) {
  // jit_run_ex with no options or the defaults is jit_run; a CUDA stream on host
  // tensors is refused, naming the option.
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "run_ex");
  int64_t d[1] = {jit_symbol(g, "N")};
  jit_value x = jit_input(g, "x", TU_F32, 1, d);
  jit_output(g, jit_mul(g, x, jit_scalar(g, 2.0, TU_F32)));
  TU_OK(jit_graph_finalize(g));
  float in[3] = {1, 2, -3}, out[3];
  int64_t s3[1] = {3};
  DLTensor xi = tu_tensor(in, TU_F32, 1, s3), yo = tu_tensor(out, TU_F32, 1, s3);
  TU_OK(jit_run_ex(g, &xi, 1, &yo, 1, NULL));
  cr_expect(out[0] == 2 && out[1] == 4 && out[2] == -6);
  jit_run_options o;
  jit_run_options_init(&o);
  cr_expect(o.struct_size == sizeof o && o.cuda_stream == NULL);
  in[0] = 5;
  TU_OK(jit_run_ex(g, &xi, 1, &yo, 1, &o));
  cr_expect(out[0] == 10);
  o.cuda_stream = (void *)&o;
  jit_status s = jit_run_ex(g, &xi, 1, &yo, 1, &o);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  cr_expect(strstr(jit_status_message(s), "cuda_stream") != NULL, "%s",
            jit_status_message(s));
  jit_status_free(s);
  jit_run_options_init(NULL);  // a no-op
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(run, byte_offset_honored_or_refused) {
  // DLPack's byte_offset: the data starts that many bytes after `data`. The library
  // must either honour it or refuse it as JIT_UNSUPPORTED, never read the wrong bytes.
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "offset");
  int64_t gd[1] = {jit_symbol(g, "N")};
  jit_value x = jit_input(g, "x", TU_F32, 1, gd);
  jit_output(g, jit_mul(g, x, jit_scalar(g, 3.0, TU_F32)));
  TU_OK(jit_graph_finalize(g));
  float buf[4 + 9], y[9], want[9];
  for (int i = 0; i < 13; i++) buf[i] = (float)(i - 4);
  for (int i = 0; i < 9; i++) want[i] = 3.0f * buf[4 + i];
  int64_t d[1] = {9};
  DLTensor in = tu_tensor(buf, TU_F32, 1, d);
  in.byte_offset = 4 * sizeof(float);
  DLTensor out = tu_tensor(y, TU_F32, 1, d);
  jit_status s = jit_run(g, &in, 1, &out, 1);
  if (s) {
    TU_EXPECT_CODE(s, JIT_UNSUPPORTED);
    cr_log_info("byte_offset refused: %s", jit_status_message(s));
    jit_status_free(s);
  } else {
    tu_assert_close(y, want, 9, 0.0, 0.0, 1, d, "input with byte_offset");
  }
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

//===--- Options and logging --------------------------------------------------------===//

Test(run, options_defaults) {
  jit_options o;
  memset(&o, 0x5a, sizeof(o));
  jit_options_init(&o);
  cr_assert_eq(o.struct_size, sizeof(jit_options));
  cr_assert_eq(o.opt_level, 2);
  cr_assert_eq(o.num_threads, 0);
  cr_assert(o.log_fn == NULL);
}

typedef struct log_sink {
  pthread_mutex_t mu;
  int lines;
  int bad;  // NULL message or level out of range
} log_sink;

static void log_to_sink(void *user, jit_log_level level, const char *message) {
  log_sink *s = user;
  pthread_mutex_lock(&s->mu);
  s->lines++;
  if (!message || level < JIT_LOG_ERROR || level > JIT_LOG_DEBUG) s->bad++;
  pthread_mutex_unlock(&s->mu);
}

Test(run, log_callback_receives_only_valid_lines) {
  log_sink sink = {PTHREAD_MUTEX_INITIALIZER, 0, 0};
  jit_options o;
  jit_options_init(&o);
  o.log_fn = log_to_sink;
  o.log_user_data = &sink;
  o.log_level = JIT_LOG_DEBUG;
  jit_context *ctx = NULL;
  TU_OK(jit_context_create(&o, &ctx));
  jit_graph *g = build_layer(ctx);
  layer l;
  layer_init(&l, 12);
  layer_check(g, &l, 4, 1);
  layer_check(g, &l, 4, 2);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
  cr_assert_eq(sink.bad, 0, "%d of %d log lines had a NULL message or a bad level",
               sink.bad, sink.lines);
}

//===--- Threads ------------------------------------------------------------------===//

enum { THREADS = 4, RUNS_PER_THREAD = 12 };

typedef struct worker {
  jit_graph *graph;
  layer *l;
  pthread_barrier_t *start;
  int id;
  int64_t ns[RUNS_PER_THREAD];
  char err[1024];
  double worst;
} worker;

static void *worker_main(void *arg) {
  worker *w = arg;
  pthread_barrier_wait(w->start);
  w->worst = 0.0;
  for (int i = 0; i < RUNS_PER_THREAD; i++) {
    double e = layer_run(w->graph, w->l, w->ns[i], (uint64_t)(w->id * 1000 + i), w->err,
                         sizeof(w->err));
    if (e < 0.0) {
      w->worst = -1.0;
      return NULL;
    }
    if (!(e <= w->worst)) w->worst = e;
    if (w->worst > 1e-5) {
      snprintf(w->err, sizeof(w->err), "thread %d run %d N=%lld: max |error| %g", w->id,
               i, (long long)w->ns[i], e);
      return NULL;
    }
  }
  return NULL;
}

// Each thread runs the sizes {3, 5, 9} four times each, in its own shuffled order;
// graphs[t % n_graphs] is thread t's graph.
static void run_threads(jit_graph **graphs, int n_graphs, layer *l) {
  static const int64_t sizes[3] = {3, 5, 9};
  pthread_barrier_t start;
  cr_assert_eq(pthread_barrier_init(&start, NULL, THREADS), 0);
  worker w[THREADS];
  pthread_t th[THREADS];
  ref_rng rng;
  ref_rng_seed(&rng, 2024);
  for (int t = 0; t < THREADS; t++) {
    memset(&w[t], 0, sizeof(w[t]));
    w[t].graph = graphs[t % n_graphs];
    w[t].l = l;
    w[t].start = &start;
    w[t].id = t;
    for (int i = 0; i < RUNS_PER_THREAD; i++) w[t].ns[i] = sizes[i % 3];
    // Fisher-Yates, but every thread starts with a new shape (the first three runs
    // cover all three sizes, so the threads race to compile each key).
    for (int i = 2; i > 0; i--) {
      int j = (int)(ref_rng_unit(&rng) * (i + 1));
      int64_t tmp = w[t].ns[i];
      w[t].ns[i] = w[t].ns[j];
      w[t].ns[j] = tmp;
    }
    for (int i = RUNS_PER_THREAD - 1; i > 3; i--) {
      int j = 3 + (int)(ref_rng_unit(&rng) * (i - 2));
      int64_t tmp = w[t].ns[i];
      w[t].ns[i] = w[t].ns[j];
      w[t].ns[j] = tmp;
    }
  }
  for (int t = 0; t < THREADS; t++)
    cr_assert_eq(pthread_create(&th[t], NULL, worker_main, &w[t]), 0);
  for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
  pthread_barrier_destroy(&start);
  for (int t = 0; t < THREADS; t++) {
    cr_assert(w[t].worst >= 0.0, "thread %d: %s", t, w[t].err);
    cr_assert(w[t].worst <= 1e-5, "%s", w[t].err);
  }
}

Test(run, threads_share_one_graph) {
  jit_context *ctx = tu_context_policy(JIT_SHAPE_POLICY_EXACT);
  jit_graph *g = build_layer(ctx);
  layer l;
  layer_init(&l, 31);
  run_threads(&g, 1, &l);
  jit_stats st = get_stats(ctx);
  cr_assert_eq(st.runs, THREADS * RUNS_PER_THREAD, "runs %llu",
               (unsigned long long)st.runs);
  cr_assert_eq(st.compiles, 3, "compiles %llu: each of the 3 keys must compile once",
               (unsigned long long)st.compiles);
  cr_assert_eq(st.kernels, 3, "kernels %llu", (unsigned long long)st.kernels);
  // Repeats after the first round are hits.
  cr_assert(st.memory_hits >= THREADS * (RUNS_PER_THREAD - 3), "memory_hits %llu",
            (unsigned long long)st.memory_hits);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(run, threads_on_two_graphs_of_one_context) {
  // Two separately built graphs: threads 0 and 2 run one, threads 1 and 3 the other.
  // Identical graphs may share kernels, so compiles is 3 (shared) or 6 (per graph).
  jit_context *ctx = tu_context_policy(JIT_SHAPE_POLICY_EXACT);
  jit_graph *g[2] = {build_layer(ctx), build_layer(ctx)};
  layer l;
  layer_init(&l, 32);
  run_threads(g, 2, &l);
  jit_stats st = get_stats(ctx);
  cr_assert_eq(st.runs, THREADS * RUNS_PER_THREAD);
  cr_assert(st.compiles == 3 || st.compiles == 6, "compiles %llu",
            (unsigned long long)st.compiles);
  jit_graph_destroy(g[0]);
  jit_graph_destroy(g[1]);
  jit_context_destroy(ctx);
}

// A kernel keeps its packed B block on the calling thread's stack (256 KiB for 256^3
// with AVX2 code; AVX-512 reads such a B in place, and packs 256x4096x256's in k blocks
// on the stack whatever its L2: lowering/cpu/). A
// thread with too little stack gets JIT_RESOURCE_EXHAUSTED naming the need, not a
// crash; the need survives the disk cache (a new context loads it with the kernel).
typedef struct stack_call {
  jit_graph *g;
  DLTensor in[2], out;
  jit_status_code code;
  char message[512];
} stack_call;

static void *stack_call_run(void *p) {
  stack_call *c = p;
  jit_status s = jit_run(c->g, c->in, 2, &c->out, 1);
  c->code = jit_status_get_code(s);
  snprintf(c->message, sizeof c->message, "%s", s ? jit_status_message(s) : "");
  jit_status_free(s);
  return NULL;
}

// An n x k times k x n f32 matmul's operands, its C reference and an output buffer:
// 256^3 with AVX2 code, 256x4096x256 on AVX-512 (see above).
typedef struct mm_data {
  int64_t sa[2], sb[2], sc[2];
  float *a, *b, *got, *want;
} mm_data;

static mm_data mm_data_make(uint64_t seed) {
  int64_t n = 256, k = AVX512(256, 4096);
  mm_data m = {{n, k}, {k, n}, {n, n}, NULL, NULL, NULL, NULL};
  m.a = tu_malloc(sizeof(float) * (size_t)(n * k));
  m.b = tu_malloc(sizeof(float) * (size_t)(k * n));
  m.got = tu_malloc(sizeof(float) * (size_t)(n * n));
  m.want = tu_malloc(sizeof(float) * (size_t)(n * n));
  ref_rng rng;
  ref_rng_seed(&rng, seed);
  ref_rng_fill_signed(&rng, m.a, n * k);
  ref_rng_fill_signed(&rng, m.b, k * n);
  int64_t dc[2];
  ref_matmul(m.a, 2, m.sa, m.b, 2, m.sb, m.want, dc);
  return m;
}

static void mm_data_free(mm_data *m) {
  free(m->a);
  free(m->b);
  free(m->got);
  free(m->want);
}

// The graph a @ b for `m`'s shapes, finalized.
static jit_graph *mm_graph(jit_context *ctx, const mm_data *m) {
  jit_graph *g = tu_graph(ctx, "mm");
  jit_value va = jit_input(g, "a", TU_F32, 2, m->sa);  // inputs in this order
  jit_value vb = jit_input(g, "b", TU_F32, 2, m->sb);
  jit_output(g, jit_matmul(g, va, vb));
  TU_OK(jit_graph_finalize(g));
  return g;
}

static void stack_call_on_thread(stack_call *c, size_t stack) {
  pthread_attr_t attr;
  pthread_t t;
  cr_assert_eq(pthread_attr_init(&attr), 0);
  cr_assert_eq(pthread_attr_setstacksize(&attr, stack), 0);
  cr_assert_eq(pthread_create(&t, &attr, stack_call_run, c), 0);
  cr_assert_eq(pthread_join(t, NULL), 0);
  pthread_attr_destroy(&attr);
}

Test(run, too_small_a_thread_stack_is_refused) {
  mm_data m = mm_data_make(5);
  int64_t n = m.sc[0], *sh = m.sc;
  float *got = m.got, *want = m.want;
  for (int round = 0; round < 2; round++) {  // compiled, then from the disk cache
    jit_options o;
    jit_options_init(&o);
    o.num_threads = 1;
    jit_context *ctx = NULL;
    TU_OK(jit_context_create(&o, &ctx));
    jit_graph *g = mm_graph(ctx, &m);
    stack_call c = {g, {tu_tensor(m.a, TU_F32, 2, m.sa), tu_tensor(m.b, TU_F32, 2, m.sb)},
                    tu_tensor(got, TU_F32, 2, sh), JIT_OK, ""};
    TU_OK(jit_graph_compile(g, c.in, 2));
    memset(got, 0, sizeof(float) * n * n);
    stack_call_on_thread(&c, 192 << 10);
    cr_expect_eq(c.code, JIT_RESOURCE_EXHAUSTED, "round %d: %s", round, c.message);
    cr_expect(strstr(c.message, "KiB of stack") != NULL, "round %d: %s", round, c.message);
    stack_call_on_thread(&c, 8 << 20);
    cr_expect_eq(c.code, JIT_OK, "round %d: %s", round, c.message);
    tu_assert_close(got, want, n * n, 1e-4, 1e-4, 2, sh, "matmul on an 8 MiB stack");
    jit_stats st = get_stats(ctx);
    cr_expect_eq(st.compiles, round == 0 ? 1u : 0u, "round %d: compiles %llu", round,
                 (unsigned long long)st.compiles);
    jit_graph_destroy(g);
    jit_context_destroy(ctx);
  }
  mm_data_free(&m);
}

// A threaded kernel has each OpenMP worker keep its own packed block, on the worker's
// stack (OMP_STACKSIZE, read by libomp when it starts): too small a one is refused
// too, naming the setting, rather than crashing a worker. One thread still runs.
Test(run, too_small_openmp_worker_stacks_are_refused) {
  setenv("OMP_STACKSIZE", "128K", 1);  // before libomp is loaded in this process
  mm_data m = mm_data_make(6);
  int64_t n = m.sc[0];
  for (int threads = 2; threads >= 1; threads--) {
    jit_options o;
    jit_options_init(&o);
    o.num_threads = threads;
    o.cache_dir = "";
    jit_context *ctx = NULL;
    TU_OK(jit_context_create(&o, &ctx));
    jit_graph *g = mm_graph(ctx, &m);
    DLTensor in[2] = {tu_tensor(m.a, TU_F32, 2, m.sa), tu_tensor(m.b, TU_F32, 2, m.sb)};
    DLTensor out = tu_tensor(m.got, TU_F32, 2, m.sc);
    memset(m.got, 0, sizeof(float) * n * n);
    jit_status s = jit_run(g, in, 2, &out, 1);
    // ASan builds keep kernels single-threaded (devices/cpu/cpu.c).
#if defined(__SANITIZE_ADDRESS__)
    bool refused = false;
#else
    bool refused = threads == 2;
#endif
    if (refused) {
      cr_expect_eq(jit_status_get_code(s), JIT_RESOURCE_EXHAUSTED, "%s",
                   s ? jit_status_message(s) : "ran");
      cr_expect(s && strstr(jit_status_message(s), "OMP_STACKSIZE") != NULL, "%s",
                s ? jit_status_message(s) : "ran");
    } else {
      cr_expect(s == NULL, "threads=%d: %s", threads, s ? jit_status_message(s) : "");
      tu_assert_close(m.got, m.want, n * n, 1e-4, 1e-4, 2, m.sc, "matmul, 1 thread");
    }
    jit_status_free(s);
    jit_graph_destroy(g);
    jit_context_destroy(ctx);
  }
  mm_data_free(&m);
}

// Elementwise chains are written as one linalg.generic by the emitter (emit_fused.c):
// y = relu(t + t * x) with t = exp(u), u = tanh(tanh(x * 0.5 + bias) * 0.5 + bias)
// (bias broadcast over rows, x read at both ends, t used twice), in f32 and f16 (the
// reference rounds after every op, as separate ops would), as exact kernels and as a
// generic one over rows 1, 7 and 33; and a chain of 1,500 adds of a bias, which the
// MLIR fusion pass took quadratic time over.
static float r16(float v, bool f16) {
  if (f16) ref_round_f16_array(&v, 1);
  return v;
}

static void check_chain(jit_shape_policy policy, DLDataType dt, int64_t M) {
  enum { N = 37 };
  bool f16 = tu_is_f16(dt);
  jit_context *ctx = tu_context_policy(policy);
  jit_graph *g = tu_graph(ctx, "chain");
  int64_t rows = policy == JIT_SHAPE_POLICY_GENERIC ? jit_symbol(g, "M") : M;
  jit_value x = jit_input(g, "x", dt, 2, (int64_t[]){rows, N});
  jit_value bias = jit_input(g, "bias", dt, 1, (int64_t[]){N});
  jit_value half = jit_scalar(g, 0.5, dt);
  jit_value u = x;
  for (int i = 0; i < 2; i++) u = jit_tanh(g, jit_add(g, jit_mul(g, u, half), bias));
  jit_value t = jit_exp(g, u);
  jit_output(g, jit_relu(g, jit_add(g, t, jit_mul(g, t, x))));
  TU_OK(jit_graph_finalize(g));
  float *xv = tu_malloc(sizeof(float) * (size_t)(M * N)), bv[N];
  float *want = tu_malloc(sizeof(float) * (size_t)(M * N));
  ref_rng rng;
  ref_rng_seed(&rng, 500 + (uint64_t)M);
  ref_rng_fill_signed(&rng, xv, M * N);
  ref_rng_fill_signed(&rng, bv, N);
  void *xd = tu_input_data(dt, xv, M * N), *bd = tu_input_data(dt, bv, N);
  for (int64_t i = 0; i < M * N; i++) {
    float v = xv[i], b = bv[i % N];
    for (int k = 0; k < 2; k++) v = r16(tanhf(r16(r16(v * 0.5f, f16) + b, f16)), f16);
    float e = r16(expf(v), f16);
    float s = r16(e + r16(e * xv[i], f16), f16);
    want[i] = s > 0 ? s : 0;
  }
  DLTensor ins[2] = {tu_tensor(xd, dt, 2, (int64_t[]){M, N}), tu_tensor(bd, dt, 1, (int64_t[]){N})};
  char what[64];
  snprintf(what, sizeof what, "chain %s %s M=%lld", f16 ? "f16" : "f32",
           policy == JIT_SHAPE_POLICY_GENERIC ? "generic" : "exact", (long long)M);
  tu_run_check(g, ins, 2, dt, 2, (int64_t[]){M, N}, want, f16 ? 4e-3 : 1e-5,
               f16 ? 4e-3 : 1e-6, NULL, what);
  free(xv);
  free(want);
  free(xd);
  free(bd);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(run, elementwise_chains_fused) {
  static const int64_t ms[] = {1, 7, 33};
  for (int f = 0; f < 2; f++)
    for (int i = 0; i < 3; i++) {
      check_chain(JIT_SHAPE_POLICY_EXACT, f ? TU_F16 : TU_F32, ms[i]);
      check_chain(JIT_SHAPE_POLICY_GENERIC, f ? TU_F16 : TU_F32, ms[i]);
    }
}

Test(run, long_elementwise_chain) {
  enum { N = 19, ADDS = 1500 };
  jit_context *ctx = tu_context_policy(JIT_SHAPE_POLICY_EXACT);
  jit_graph *g = tu_graph(ctx, "long");
  jit_value x = jit_input(g, "x", TU_F32, 1, (int64_t[]){N});
  jit_value b = jit_input(g, "b", TU_F32, 1, (int64_t[]){N});
  jit_value v = x;
  for (int i = 0; i < ADDS; i++) v = jit_add(g, v, b);
  jit_output(g, v);
  TU_OK(jit_graph_finalize(g));
  float xv[N], bv[N], want[N];
  for (int i = 0; i < N; i++) {
    xv[i] = (float)i;
    bv[i] = 0.25f * (float)(i % 4);
    float s = xv[i];
    for (int k = 0; k < ADDS; k++) s += bv[i];
    want[i] = s;
  }
  DLTensor ins[2] = {tu_tensor(xv, TU_F32, 1, (int64_t[]){N}),
                     tu_tensor(bv, TU_F32, 1, (int64_t[]){N})};
  tu_run_check(g, ins, 2, TU_F32, 1, (int64_t[]){N}, want, 0, 0, NULL, "1,500 adds");
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}
