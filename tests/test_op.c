//===--- test_op.c - the custom-op ABI (include/jitml_op.h) -----------------===//
//
// An op owns its graph; jit_op_call takes borrowed DLManagedTensors (their deleters are
// never called) and returns outputs the caller frees through their deleters; the shape
// function compiles nothing and reports dtypes; jit_op_call_into writes host-allocated
// outputs; bad arguments give statuses, never crashes.
//
//===----------------------------------------------------------------------===//
#define _XOPEN_SOURCE 700  // mkdtemp, setenv, nftw

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jitml.h"
#include "jitml_op.h"
#include "ref.h"
#include "cache_fixture.h"
#include "util.h"

TestSuite(op, .init = tu_cache_setup, .fini = tu_cache_teardown);

//===--- y = relu(x W + b), x [N, 4], W [4, 3]; and s = sum(x, axis 1) ----------===//

enum { IN = 4, OUT = 3 };

static jit_graph *build_layer(jit_context *ctx, DLDataType dt) {
  jit_graph *g = tu_graph(ctx, "layer");
  int64_t dx[2] = {jit_symbol(g, "N"), IN}, dw[2] = {IN, OUT}, db[1] = {OUT};
  jit_value x = jit_input(g, "x", dt, 2, dx);
  jit_value w = jit_input(g, "w", dt, 2, dw);
  jit_value b = jit_input(g, "b", dt, 1, db);
  jit_output(g, jit_relu(g, jit_add(g, jit_matmul(g, x, w), b)));
  jit_output(g, jit_reduce_sum(g, x, 1, 0));
  // Not finalized: jit_op_create finalizes.
  return g;
}

// A borrowed input whose deleter must never run: it counts calls.
static int g_deleter_calls;
static void counting_deleter(DLManagedTensor *self) {
  (void)self;
  g_deleter_calls++;
}

static DLManagedTensor managed(void *data, DLDataType dt, int rank, int64_t *shape) {
  DLManagedTensor m;
  memset(&m, 0, sizeof(m));
  m.dl_tensor = tu_tensor(data, dt, rank, shape);
  m.deleter = counting_deleter;
  return m;
}

static float g_w[IN * OUT] = {1, 0, -1, 0.5f, 1, 0, 0, 2, 1, -1, 0, 0.25f};
static float g_b[OUT] = {0.5f, -0.5f, 0.f};

static void reference(const float *x, int64_t n, float *y, float *s) {
  for (int64_t i = 0; i < n; i++) {
    s[i] = 0;
    for (int k = 0; k < IN; k++) s[i] += x[i * IN + k];
    for (int j = 0; j < OUT; j++) {
      float acc = g_b[j];
      for (int k = 0; k < IN; k++) acc += x[i * IN + k] * g_w[k * OUT + j];
      y[i * OUT + j] = acc > 0 ? acc : 0;
    }
  }
}

Test(op, create_call_free) {
  jit_context *ctx = tu_context();
  jit_op *op = NULL;
  TU_OK(jit_op_create(build_layer(ctx, TU_F32), "my.layer_1", &op));
  cr_assert_str_eq(jit_op_name(op), "my.layer_1");
  cr_assert_eq(jit_op_num_inputs(op), 3);
  cr_assert_eq(jit_op_num_outputs(op), 2);
  cr_assert(jit_op_graph(op) != NULL);
  int64_t ns[] = {1, 5, 1};  // N = 1, 5, then 1 again (a memory hit)
  g_deleter_calls = 0;
  for (int r = 0; r < 3; r++) {
    int64_t n = ns[r];
    float x[5 * IN];
    for (int i = 0; i < n * IN; i++) x[i] = (float)((i * 7) % 11) / 5.f - 1.f;
    int64_t xs[2] = {n, IN}, ws[2] = {IN, OUT}, bs[1] = {OUT};
    DLManagedTensor mx = managed(x, TU_F32, 2, xs), mw = managed(g_w, TU_F32, 2, ws),
                    mb = managed(g_b, TU_F32, 1, bs);
    DLManagedTensor *ins[3] = {&mx, &mw, &mb};
    DLManagedTensor *outs[2] = {NULL, NULL};
    TU_OK(jit_op_call(op, ins, 3, outs, 2, JIT_OP_FLAGS_NONE));
    cr_assert(outs[0] && outs[1]);
    cr_assert_eq(outs[0]->dl_tensor.ndim, 2);
    cr_assert_eq(outs[0]->dl_tensor.shape[0], n);
    cr_assert_eq(outs[0]->dl_tensor.shape[1], OUT);
    cr_assert_eq(outs[1]->dl_tensor.ndim, 1);
    cr_assert_eq(outs[0]->dl_tensor.dtype.bits, 32);
    float y[5 * OUT], s[5];
    reference(x, n, y, s);
    tu_assert_close(outs[0]->dl_tensor.data, y, n * OUT, 1e-6, 1e-6, 2, xs, "y");
    tu_assert_close(outs[1]->dl_tensor.data, s, n, 1e-6, 1e-6, 1, xs, "s");
    outs[0]->deleter(outs[0]);
    outs[1]->deleter(outs[1]);
  }
  cr_expect_eq(g_deleter_calls, 0, "the op called a borrowed input's deleter");
  jit_stats st = get_stats(ctx);
  cr_expect_eq(st.runs, 3);
  cr_expect_eq(st.memory_hits, 1);
  jit_op_destroy(op);  // destroys the graph
  jit_context_destroy(ctx);
}

Test(op, shape_function_compiles_nothing_then_call_into) {
  jit_context *ctx = tu_context();
  jit_op *op = NULL;
  TU_OK(jit_op_create(build_layer(ctx, TU_F16), "layer16", &op));
  int64_t n = 6;
  int64_t xs[2] = {n, IN}, ws[2] = {IN, OUT}, bs[1] = {OUT};
  // The shape function reads no data.
  DLManagedTensor mx = managed(NULL, TU_F16, 2, xs), mw = managed(NULL, TU_F16, 2, ws),
                  mb = managed(NULL, TU_F16, 1, bs);
  DLManagedTensor *ins[3] = {&mx, &mw, &mb};
  jit_op_output_info info[2];
  TU_OK(jit_op_output_shapes(op, ins, 3, info, 2));
  int64_t want0[2] = {n, OUT}, want1[1] = {n};
  tu_assert_shape(info[0].rank, info[0].dims, 2, want0, "out 0");
  tu_assert_shape(info[1].rank, info[1].dims, 1, want1, "out 1");
  cr_assert(info[0].dtype.code == kDLFloat && info[0].dtype.bits == 16 &&
            info[0].dtype.lanes == 1);
  cr_assert_eq(get_stats(ctx).compiles, 0, "the shape function compiled");

  // The host allocates outputs from the shape function, then calls into them.
  float xf[6 * IN], w32[IN * OUT], b32[OUT];
  for (int i = 0; i < n * IN; i++) xf[i] = (float)(i % 5) / 4.f - 0.5f;
  memcpy(w32, g_w, sizeof(w32));
  memcpy(b32, g_b, sizeof(b32));
  uint16_t *xh = tu_input_data(TU_F16, xf, n * IN), *wh = tu_input_data(TU_F16, w32, IN * OUT),
           *bh = tu_input_data(TU_F16, b32, OUT);
  mx.dl_tensor.data = xh;
  mw.dl_tensor.data = wh;
  mb.dl_tensor.data = bh;
  uint16_t yh[6 * OUT], sh[6];
  DLManagedTensor my = managed(yh, info[0].dtype, info[0].rank, info[0].dims),
                  ms = managed(sh, info[1].dtype, info[1].rank, info[1].dims);
  DLManagedTensor *outs[2] = {&my, &ms};
  TU_OK(jit_op_call_into(op, ins, 3, outs, 2, 0));
  float y[6 * OUT], s[6], got[6 * OUT];
  // Reference on the f16-rounded inputs, f32 math.
  float saved_w[IN * OUT], saved_b[OUT];
  memcpy(saved_w, g_w, sizeof(g_w));
  memcpy(saved_b, g_b, sizeof(g_b));
  memcpy(g_w, w32, sizeof(g_w));
  memcpy(g_b, b32, sizeof(g_b));
  reference(xf, n, y, s);
  memcpy(g_w, saved_w, sizeof(g_w));
  memcpy(g_b, saved_b, sizeof(g_b));
  ref_f16_to_f32_array(yh, got, n * OUT);
  tu_assert_close(got, y, n * OUT, 1e-2, 1e-2, 2, want0, "y f16");
  ref_f16_to_f32_array(sh, got, n);
  tu_assert_close(got, s, n, 1e-2, 1e-2, 1, want1, "s f16");
  // A host output of the wrong dtype is refused before anything is written.
  DLManagedTensor bad = managed(yh, TU_F32, info[0].rank, info[0].dims);
  DLManagedTensor *bad_outs[2] = {&bad, &ms};
  jit_status st = jit_op_call_into(op, ins, 3, bad_outs, 2, 0);
  TU_EXPECT_CODE(st, JIT_DTYPE_MISMATCH);
  TU_EXPECT_MSG(st, "layer16");
  jit_status_free(st);
  free(xh);
  free(wh);
  free(bh);
  jit_op_destroy(op);
  jit_context_destroy(ctx);
}

Test(op, bad_arguments) {
  jit_context *ctx = tu_context();
  jit_graph *g = build_layer(ctx, TU_F32);
  jit_op *op = (jit_op *)(uintptr_t)1;
  jit_status s = jit_op_create(g, "bad name!", &op);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  cr_expect(op == NULL);
  jit_status_free(s);
  s = jit_op_create(NULL, "x", &op);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  jit_status_free(s);
  s = jit_op_create(g, "", &op);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  jit_status_free(s);
  TU_OK(jit_op_create(g, "ok", &op));  // the caller kept `g` through the failures

  float x[2 * IN] = {0};
  int64_t xs[2] = {2, IN}, ws[2] = {IN, OUT}, bs[1] = {OUT}, bad_ws[2] = {IN + 1, OUT};
  DLManagedTensor mx = managed(x, TU_F32, 2, xs), mw = managed(g_w, TU_F32, 2, ws),
                  mb = managed(g_b, TU_F32, 1, bs), mbad = managed(g_w, TU_F32, 2, bad_ws);
  DLManagedTensor *ins[3] = {&mx, &mw, &mb};
  DLManagedTensor *outs[2] = {(DLManagedTensor *)(uintptr_t)1, NULL};

  s = jit_op_call(op, ins, 2, outs, 2, 0);  // wrong count
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  cr_expect(outs[0] == NULL, "outputs are NULL after a failure");
  jit_status_free(s);
  s = jit_op_call(op, ins, 3, outs, 1, 0);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  jit_status_free(s);
  s = jit_op_call(op, ins, 3, outs, 2, 0x8u);  // unknown flag
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  jit_status_free(s);
  DLManagedTensor *with_null[3] = {&mx, NULL, &mb};
  s = jit_op_call(op, with_null, 3, outs, 2, 0);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  TU_EXPECT_MSG(s, "input 1");
  jit_status_free(s);
  DLManagedTensor *mismatched[3] = {&mx, &mbad, &mb};
  s = jit_op_call(op, mismatched, 3, outs, 2, 0);
  TU_EXPECT_CODE(s, JIT_SHAPE_MISMATCH);
  TU_EXPECT_MSG(s, "op `ok`");
  cr_expect(outs[0] == NULL && outs[1] == NULL);
  jit_status_free(s);
  // Strided input: a clear status, not a wrong answer.
  int64_t strides[2] = {1, 2};
  mx.dl_tensor.strides = strides;
  s = jit_op_call(op, ins, 3, outs, 2, 0);
  TU_EXPECT_CODE(s, JIT_UNSUPPORTED);
  jit_status_free(s);
  mx.dl_tensor.strides = NULL;
  jit_op_output_info info[2];
  s = jit_op_output_shapes(op, mismatched, 3, info, 2);
  TU_EXPECT_CODE(s, JIT_SHAPE_MISMATCH);
  cr_expect_eq(info[0].rank, 0);
  jit_status_free(s);
  s = jit_op_output_shapes(NULL, ins, 3, info, 2);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  jit_status_free(s);
  s = jit_op_call_into(op, ins, 3, NULL, 2, 0);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  jit_status_free(s);
  s = jit_op_call(NULL, ins, 3, outs, 2, 0);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  jit_status_free(s);
  cr_expect_eq(g_deleter_calls, 0);
  cr_expect_str_eq(jit_op_name(NULL), "");
  cr_expect_eq(jit_op_num_inputs(NULL), 0);
  jit_op_destroy(NULL);
  jit_op_destroy(op);
  jit_context_destroy(ctx);
}

Test(op, builder_error_surfaces_at_create) {
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "broken");
  int64_t d1[2] = {2, 3}, d2[2] = {4, 5};
  jit_value a = jit_input(g, "a", TU_F32, 2, d1);
  jit_value b = jit_input(g, "b", TU_F32, 2, d2);
  jit_output(g, jit_matmul(g, a, b));
  jit_op *op = NULL;
  jit_status s = jit_op_create(g, "broken", &op);
  TU_EXPECT_CODE(s, JIT_SHAPE_MISMATCH);
  TU_EXPECT_MSG(s, "op `broken`");
  cr_expect(op == NULL);
  jit_status_free(s);
  jit_graph_destroy(g);  // still the caller's
  jit_context_destroy(ctx);
}
