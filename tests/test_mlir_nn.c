//===--- test_mlir_nn.c - imported CNN and tensor ops against the C API ops ---===//
//
// Modules as other front ends write them (linalg named convolutions and pooling with
// tensor.pad, TOSA's conv2d / pools / concat / slice / select / cast / gather, tensor
// concat and strided extract_slice; fixtures in tests/mlir/nn_*.mlir) load with
// jit_graph_from_mlir and compute what the same ops built with the C API compute
// (test_nn.c checks those against plain C), over batch sizes 1 and primes.
//
//===----------------------------------------------------------------------===//
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jitml.h"
#include "ref.h"
#include "util.h"

#ifndef JITML_TEST_MLIR_DIR
#error "JITML_TEST_MLIR_DIR must name tests/mlir"
#endif

static jit_graph *load(jit_context *ctx, const char *file, const char *entry) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", JITML_TEST_MLIR_DIR, file);
  jit_graph *g = NULL;
  TU_OK(jit_graph_from_mlir_file(ctx, path, entry, &g));
  return g;
}

static float *random_f32(ref_rng *rng, int64_t n) {
  float *x = tu_malloc((size_t)n * 4);
  ref_rng_fill_signed(rng, x, n);
  return x;
}

// Runs output `j` of both graphs on their inputs and compares them (f32 results, or
// f16 ones converted).
static void expect_same(jit_graph *imported, const DLTensor *in_a, int n_a, jit_graph *native,
                        const DLTensor *in_b, int n_b, int n_out, double rtol, const char *what) {
  DLManagedTensor *oa[4] = {0}, *ob[4] = {0};
  TU_OK(jit_run_alloc(imported, in_a, n_a, oa, n_out));
  TU_OK(jit_run_alloc(native, in_b, n_b, ob, n_out));
  for (int j = 0; j < n_out; j++) {
    DLTensor *a = &oa[j]->dl_tensor, *b = &ob[j]->dl_tensor;
    cr_assert_eq(a->ndim, b->ndim, "%s: output %d rank", what, j);
    for (int d = 0; d < a->ndim; d++)
      cr_assert_eq(a->shape[d], b->shape[d], "%s: output %d dim %d", what, j, d);
    cr_assert_eq(a->dtype.bits, b->dtype.bits, "%s: output %d dtype", what, j);
    int64_t n = ref_numel(a->ndim, a->shape);
    float *x = tu_malloc((size_t)n * 4), *y = tu_malloc((size_t)n * 4);
    if (a->dtype.bits == 16) {
      ref_f16_to_f32_array(a->data, x, n);
      ref_f16_to_f32_array(b->data, y, n);
    } else {
      memcpy(x, a->data, (size_t)n * 4);
      memcpy(y, b->data, (size_t)n * 4);
    }
    tu_assert_close(x, y, n, rtol, 1e-6, (int)a->ndim, a->shape, what);
    free(x);
    free(y);
    oa[j]->deleter(oa[j]);
    ob[j]->deleter(ob[j]);
  }
}

// tensor.pad + linalg.conv_2d_nchw_fchw (stride 2) + linalg.pooling_nchw_max, N `?`.
Test(mlir_nn, linalg_conv_pool_nchw) {
  jit_context *ctx = tu_context();
  jit_graph *imp = load(ctx, "nn_linalg_conv_pool.mlir", "a");
  jit_graph *g = tu_graph(ctx, "native");
  int64_t dx[4] = {jit_symbol(g, "N"), 3, 9, 11}, dw[4] = {5, 3, 3, 3};
  jit_window_params cp, pp;
  jit_window_params_init(&cp);
  cp.stride[0] = cp.stride[1] = 2;
  for (int i = 0; i < 4; i++) cp.padding[i] = 1;
  jit_window_params_init(&pp);
  pp.kernel[0] = pp.kernel[1] = 2;
  pp.stride[0] = pp.stride[1] = 2;
  jit_value x = jit_input(g, "x", TU_F32, 4, dx), w = jit_input(g, "w", TU_F32, 4, dw);
  jit_output(g, jit_max_pool2d(g, jit_conv2d(g, x, w, &cp), &pp));
  TU_OK(jit_graph_finalize(g));
  ref_rng rng;
  ref_rng_seed(&rng, 1);
  for (int64_t n = 1; n <= 3; n += 2) {
    int64_t cx[4] = {n, 3, 9, 11};
    float *xv = random_f32(&rng, n * 297), *wv = random_f32(&rng, 135);
    DLTensor in[2] = {tu_tensor(xv, TU_F32, 4, cx), tu_tensor(wv, TU_F32, 4, dw)};
    expect_same(imp, in, 2, g, in, 2, 1, 1e-5, "linalg conv + pool");
    free(xv);
    free(wv);
  }
  jit_graph_destroy(imp);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// TOSA (NHWC, OHWI weights): conv2d with bias, max_pool2d, avg_pool2d (padding not
// counted), concat on channels, slice.
Test(mlir_nn, tosa_conv_pools_concat_slice) {
  jit_context *ctx = tu_context();
  jit_graph *imp = load(ctx, "nn_tosa_conv_pool.mlir", "b");
  jit_graph *g = tu_graph(ctx, "native");
  int64_t dx[4] = {1, 8, 8, 3}, dw[4] = {3, 3, 3, 4}, db[1] = {4};
  jit_window_params cp, mp, ap;
  jit_window_params_init(&cp);
  cp.layout = JIT_LAYOUT_NHWC;
  for (int i = 0; i < 4; i++) cp.padding[i] = 1;
  jit_window_params_init(&mp);
  mp.layout = JIT_LAYOUT_NHWC;
  mp.kernel[0] = mp.kernel[1] = 2;
  mp.stride[0] = mp.stride[1] = 2;
  ap = cp;
  ap.kernel[0] = ap.kernel[1] = 3;
  ap.count_include_pad = 0;
  // TOSA's weight is OHWI; the C API's NHWC weight is HWIO: the native graph takes the
  // transposed copy.
  jit_value x = jit_input(g, "x", TU_F32, 4, dx), w = jit_input(g, "w", TU_F32, 4, dw),
            b = jit_input(g, "b", TU_F32, 1, db);
  jit_value c = jit_add(g, jit_conv2d(g, x, w, &cp), b);
  jit_value m = jit_max_pool2d(g, c, &mp), a = jit_avg_pool2d(g, m, &ap);
  jit_value v[2] = {a, m};
  jit_output(g, jit_slice(g, jit_concat(g, v, 2, 3), 2, 1, 3, 1));
  TU_OK(jit_graph_finalize(g));
  ref_rng rng;
  ref_rng_seed(&rng, 2);
  float *xv = random_f32(&rng, 192), *ohwi = random_f32(&rng, 108), hwio[108], *bv = random_f32(&rng, 4);
  for (int o = 0; o < 4; o++)
    for (int k = 0; k < 27; k++) hwio[k * 4 + o] = ohwi[o * 27 + k];
  int64_t dwo[4] = {4, 3, 3, 3};
  DLTensor ia[3] = {tu_tensor(xv, TU_F32, 4, dx), tu_tensor(ohwi, TU_F32, 4, dwo),
                    tu_tensor(bv, TU_F32, 1, db)};
  DLTensor ib[3] = {ia[0], tu_tensor(hwio, TU_F32, 4, dw), ia[2]};
  expect_same(imp, ia, 3, g, ib, 3, 1, 1e-5, "tosa conv + pools + concat + slice");
  free(xv), free(ohwi), free(bv);
  jit_graph_destroy(imp);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// TOSA greater + select + cast to f16, and a gather with constant indices.
Test(mlir_nn, tosa_select_cast_gather) {
  jit_context *ctx = tu_context();
  jit_graph *imp = load(ctx, "nn_tosa_select_cast_gather.mlir", "c");
  jit_graph *g = tu_graph(ctx, "native");
  int64_t dx[2] = {jit_symbol(g, "N"), 6}, dt[2] = {10, 6}, di[1] = {3};
  DLDataType i32 = {kDLInt, 32, 1};
  jit_value x = jit_input(g, "x", TU_F32, 2, dx), y = jit_input(g, "y", TU_F32, 2, dx);
  jit_value t = jit_input(g, "t", TU_F32, 2, dt), ids = jit_input(g, "ids", i32, 1, di);
  jit_output(g, jit_cast(g, jit_where(g, jit_greater(g, x, y), x, y), TU_F16));
  int64_t r3[3] = {1, 3, 6};
  jit_output(g, jit_reshape(g, jit_gather(g, t, ids), 3, r3));
  TU_OK(jit_graph_finalize(g));
  ref_rng rng;
  ref_rng_seed(&rng, 3);
  int32_t iv[3] = {9, 0, 4};
  for (int64_t n = 1; n <= 7; n += 6) {
    int64_t cx[2] = {n, 6}, t3[3] = {1, 10, 6};
    float *xv = random_f32(&rng, n * 6), *yv = random_f32(&rng, n * 6), *tv = random_f32(&rng, 60);
    DLTensor ia[3] = {tu_tensor(xv, TU_F32, 2, cx), tu_tensor(yv, TU_F32, 2, cx),
                      tu_tensor(tv, TU_F32, 3, t3)};
    DLTensor ib[4] = {ia[0], ia[1], tu_tensor(tv, TU_F32, 2, dt), tu_tensor(iv, i32, 1, di)};
    expect_same(imp, ia, 3, g, ib, 4, 2, 0, "tosa select + cast + gather");
    free(xv), free(yv), free(tv);
  }
  jit_graph_destroy(imp);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// tensor.concat and a strided tensor.extract_slice, N `?`.
Test(mlir_nn, tensor_concat_strided_slice) {
  jit_context *ctx = tu_context();
  jit_graph *imp = load(ctx, "nn_tensor_concat_slice.mlir", "d");
  jit_graph *g = tu_graph(ctx, "native");
  int64_t N = jit_symbol(g, "N"), da[3] = {N, 2, 5}, db[3] = {N, 3, 5};
  jit_value a = jit_input(g, "a", TU_F32, 3, da), b = jit_input(g, "b", TU_F32, 3, db);
  jit_value v[2] = {a, b};
  jit_value s = jit_slice(g, jit_concat(g, v, 2, 1), 1, 1, 5, 2);
  jit_output(g, jit_slice(g, s, 2, 1, 5, 2));
  TU_OK(jit_graph_finalize(g));
  ref_rng rng;
  ref_rng_seed(&rng, 4);
  for (int64_t n = 1; n <= 5; n += 4) {
    int64_t ca[3] = {n, 2, 5}, cb[3] = {n, 3, 5};
    float *av = random_f32(&rng, n * 10), *bv = random_f32(&rng, n * 15);
    DLTensor in[2] = {tu_tensor(av, TU_F32, 3, ca), tu_tensor(bv, TU_F32, 3, cb)};
    expect_same(imp, in, 2, g, in, 2, 1, 0, "tensor concat + slice");
    free(av), free(bv);
  }
  jit_graph_destroy(imp);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// jit_mlir_opt (what `jitml opt` calls; tests/tool/run.sh checks the printed IR): our
// pass among MLIR's, and its errors.
Test(mlir_nn, opt_api) {
  static const char mm[] =
      "func.func @mm(%a: memref<2x3xf32>, %b: memref<3x4xf32>, %c: memref<2x4xf32>) {\n"
      "  linalg.matmul ins(%a, %b : memref<2x3xf32>, memref<3x4xf32>) outs(%c : "
      "memref<2x4xf32>)\n  return\n}\n";
  char *out = NULL;
  TU_OK(jit_mlir_opt(mm, strlen(mm), "func.func(canonicalize,jitml-lower-matmul-to-loops)",
                     NULL, &out));
  cr_expect(strstr(out, "scf.for") && !strstr(out, "linalg.matmul"), "%s", out);
  jit_string_free(out);
  jit_status s = jit_mlir_opt(NULL, 0, "canonicalize", NULL, &out);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  jit_status_free(s);
  s = jit_mlir_opt(mm, strlen(mm), "func.func(cse,bogus)", "mm.mlir", &out);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  TU_EXPECT_MSG(s, "`bogus` does not parse (on func.func)");
  jit_status_free(s);
  cr_expect_null(out);
  s = jit_mlir_opt(mm, 20, "canonicalize", "mm.mlir", &out);
  TU_EXPECT_CODE(s, JIT_PARSE_ERROR);
  TU_EXPECT_MSG(s, "mm.mlir:1:");
  jit_status_free(s);
}
