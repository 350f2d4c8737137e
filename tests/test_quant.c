//===--- test_quant.c - int8 matmul with int32 accumulation and dequantizing ----===//
//
// jit_matmul_int8 against a plain-C reference (int32 sums, then the scales in double),
// over shapes with 1, primes and non-multiples of the tiles, symbolic rows and batch,
// per-tensor and per-channel scales, the extremes of int8 (-128 x -128 summed over
// long K), and the dtype and shape rules.
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

#define TU_I8 ((DLDataType){kDLInt, 8, 1})

static int8_t *random_i8(ref_rng *rng, int64_t n, bool extremes) {
  int8_t *x = tu_malloc((size_t)(n ? n : 1));
  for (int64_t i = 0; i < n; i++)
    x[i] = extremes ? (i % 2 ? -128 : 127) : (int8_t)((int)(ref_rng_unit(rng) * 256.0) - 128);
  return x;
}

// a [B, M, K] (B = 0: a is [M, K]) x b [K, N], scales sa and sb[N] (per_col) or sb[0].
static void check(int64_t B, int64_t M, int64_t K, int64_t N, bool per_col, bool symbolic,
                  bool extremes, jit_shape_policy policy) {
  jit_context *ctx = tu_context_policy(policy);
  jit_graph *g = tu_graph(ctx, "q8");
  int r = B ? 3 : 2;
  int64_t Ms = symbolic ? jit_symbol(g, "M") : M, Bs = symbolic ? jit_symbol(g, "B") : B;
  int64_t da[3] = {Bs, Ms, K}, db[2] = {K, N}, dsb[1] = {N};
  if (!B) da[0] = Ms, da[1] = K;
  jit_value a = jit_input(g, "a", TU_I8, r, da), b = jit_input(g, "b", TU_I8, 2, db);
  jit_value sa = jit_input(g, "sa", TU_F32, 0, NULL);
  jit_value sb = per_col ? jit_input(g, "sb", TU_F32, 1, dsb) : jit_scalar(g, 0.03125, TU_F32);
  jit_output(g, jit_matmul_int8(g, a, b, sa, sb));
  TU_OK(jit_graph_finalize(g));
  ref_rng rng;
  ref_rng_seed(&rng, (uint64_t)(M * 131 + K * 7 + N));
  int64_t rows = (B ? B : 1) * M;
  int8_t *av = random_i8(&rng, rows * K, extremes), *bv = random_i8(&rng, K * N, extremes);
  float sav = 0.0078125f, *sbv = tu_malloc((size_t)N * 4), *want = tu_malloc((size_t)(rows * N) * 4);
  for (int64_t j = 0; j < N; j++) sbv[j] = per_col ? 0.001f * (float)(j + 1) : 0.03125f;
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < N; j++) {
      int32_t acc = 0;
      for (int64_t k = 0; k < K; k++) acc += (int32_t)av[i * K + k] * bv[k * N + j];
      want[i * N + j] = (float)((double)acc * sav * sbv[j]);
    }
  int64_t ca[3] = {B, M, K}, co[3] = {B, M, N};
  if (!B) ca[0] = M, ca[1] = K, co[0] = M, co[1] = N;
  DLTensor ins[4] = {tu_tensor(av, TU_I8, r, ca), tu_tensor(bv, TU_I8, 2, db),
                     tu_tensor(&sav, TU_F32, 0, NULL), tu_tensor(sbv, TU_F32, 1, dsb)};
  char what[96];
  snprintf(what, sizeof what, "int8 B=%lld M=%lld K=%lld N=%lld per_col=%d", (long long)B,
           (long long)M, (long long)K, (long long)N, per_col);
  // The int32 sums are exact; what remains is the f32 multiplication by the scales.
  tu_run_check(g, ins, per_col ? 4 : 3, TU_F32, r, co, want, 1e-6, 1e-6, NULL, what);
  free(av), free(bv), free(sbv), free(want);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(int8, tiny_exact) { check(0, 1, 1, 1, false, false, false, JIT_SHAPE_POLICY_EXACT); }
Test(int8, primes_per_channel_exact) { check(0, 17, 31, 45, true, false, false, JIT_SHAPE_POLICY_EXACT); }
Test(int8, tiles_and_rest_exact) { check(0, 64, 256, 67, true, false, false, JIT_SHAPE_POLICY_EXACT); }
Test(int8, batched_exact) { check(3, 7, 33, 29, false, false, false, JIT_SHAPE_POLICY_EXACT); }
Test(int8, extremes_long_k_exact) { check(0, 5, 4099, 9, false, false, true, JIT_SHAPE_POLICY_EXACT); }
Test(int8, symbolic_generic) { check(2, 13, 47, 19, true, true, false, JIT_SHAPE_POLICY_GENERIC); }
Test(int8, symbolic_auto) { check(0, 61, 67, 33, true, true, false, JIT_SHAPE_POLICY_AUTO); }

Test(int8, rules) {
  jit_context *ctx = tu_context();
  static const char *const says[] = {"a and b are int8", "the scales are f32",
                                     "must be one value", "integer values only feed",
                                     "must be [K, N]"};
  static const jit_status_code codes[] = {JIT_DTYPE_MISMATCH, JIT_DTYPE_MISMATCH,
                                          JIT_SHAPE_MISMATCH, JIT_DTYPE_MISMATCH,
                                          JIT_SHAPE_MISMATCH};
  for (int i = 0; i < 5; i++) {
    jit_graph *g = tu_graph(ctx, "bad");
    int64_t da[2] = {4, 8}, db[2] = {8, 3}, d2[1] = {2}, db3[3] = {1, 8, 3};
    jit_value a = jit_input(g, "a", TU_I8, 2, da), b = jit_input(g, "b", TU_I8, 2, db);
    jit_value f = jit_input(g, "f", TU_F32, 2, da), s = jit_scalar(g, 0.5, TU_F32);
    jit_value y = {0};
    switch (i) {
      case 0: y = jit_matmul_int8(g, f, b, s, s); break;
      case 1: y = jit_matmul_int8(g, a, b, s, jit_input(g, "h", TU_F16, 0, NULL)); break;
      case 2: y = jit_matmul_int8(g, a, b, jit_input(g, "s2", TU_F32, 1, d2), s); break;
      case 3: y = jit_relu(g, a); break;
      case 4: y = jit_matmul_int8(g, a, jit_input(g, "b3", TU_I8, 3, db3), s, s); break;
    }
    cr_expect_eq(y.id, 0, "case %d built a value", i);
    jit_output(g, f);
    jit_status st = jit_graph_finalize(g);
    TU_EXPECT_CODE(st, codes[i]);
    TU_EXPECT_MSG(st, says[i]);
    jit_status_free(st);
    jit_graph_destroy(g);
  }
  jit_context_destroy(ctx);
}
