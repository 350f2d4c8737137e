//===--- test_quant.c - int8 matmul with int32 accumulation and dequantizing ----===//
//
// jit_matmul_int8 against a plain-C reference (int32 sums, then the scales in double),
// over shapes with 1, primes and non-multiples of the tiles, symbolic rows and batch,
// per-tensor and per-channel scales, the extremes of int8 (-128 x -128 summed over
// long K), zero points (jit_matmul_int8_zp: a's, b's per tensor or per column, both),
// and the dtype and shape rules.
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

// Zero points of check(): a's (one value), b's one value or one per column.
enum { ZP_A = 1, ZP_B = 2, ZP_B_COL = 4 };

// a [B, M, K] (B = 0: a is [M, K]) x b [K, N], scales sa and sb[N] (per_col) or sb[0],
// zero points as `zp` says (graph inputs; none: jit_matmul_int8).
static void check_zp(int64_t B, int64_t M, int64_t K, int64_t N, bool per_col, bool symbolic,
                     bool extremes, jit_shape_policy policy, int zp) {
  jit_context *ctx = tu_context_policy(policy);
  jit_graph *g = tu_graph(ctx, "q8");
  int r = B ? 3 : 2;
  int64_t Ms = symbolic ? jit_symbol(g, "M") : M, Bs = symbolic ? jit_symbol(g, "B") : B;
  int64_t da[3] = {Bs, Ms, K}, db[2] = {K, N}, dsb[1] = {N};
  if (!B) da[0] = Ms, da[1] = K;
  jit_value a = jit_input(g, "a", TU_I8, r, da), b = jit_input(g, "b", TU_I8, 2, db);
  jit_value sa = jit_input(g, "sa", TU_F32, 0, NULL);
  jit_value sb = per_col ? jit_input(g, "sb", TU_F32, 1, dsb) : jit_scalar(g, 0.03125, TU_F32);
  jit_value za = {0}, zb = {0};
  if (zp & ZP_A) za = jit_input(g, "za", TU_I8, 0, NULL);
  if (zp & (ZP_B | ZP_B_COL))
    zb = jit_input(g, "zb", TU_I8, zp & ZP_B_COL ? 1 : 0, dsb);
  jit_output(g, zp ? jit_matmul_int8_zp(g, a, b, sa, sb, za, zb)
                   : jit_matmul_int8(g, a, b, sa, sb));
  TU_OK(jit_graph_finalize(g));
  ref_rng rng;
  ref_rng_seed(&rng, (uint64_t)(M * 131 + K * 7 + N + zp));
  int64_t rows = (B ? B : 1) * M;
  int8_t *av = random_i8(&rng, rows * K, extremes), *bv = random_i8(&rng, K * N, extremes);
  // Zero points at the int8 extremes (with the extremes' data, the most the sums can
  // be: 4099 x 255 x 255 stays within int32) and in between.
  int8_t zav = extremes ? -128 : 37, *zbv = tu_malloc((size_t)N);
  for (int64_t j = 0; j < N; j++)
    zbv[j] = zp & ZP_B_COL ? (int8_t)((j * 53) % 256 - 128) : extremes ? 127 : -19;
  float sav = 0.0078125f, *sbv = tu_malloc((size_t)N * 4), *want = tu_malloc((size_t)(rows * N) * 4);
  for (int64_t j = 0; j < N; j++) sbv[j] = per_col ? 0.001f * (float)(j + 1) : 0.03125f;
  int32_t za_i = zp & ZP_A ? zav : 0;
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < N; j++) {
      int32_t zb_j = zp & (ZP_B | ZP_B_COL) ? zbv[j] : 0;
      int64_t acc = 0;
      for (int64_t k = 0; k < K; k++)
        acc += (int64_t)(av[i * K + k] - za_i) * (bv[k * N + j] - zb_j);
      want[i * N + j] = (float)((double)acc * sav * sbv[j]);
    }
  int64_t ca[3] = {B, M, K}, co[3] = {B, M, N};
  if (!B) ca[0] = M, ca[1] = K, co[0] = M, co[1] = N;
  DLTensor ins[6] = {tu_tensor(av, TU_I8, r, ca), tu_tensor(bv, TU_I8, 2, db),
                     tu_tensor(&sav, TU_F32, 0, NULL)};
  int n_in = 3;
  if (per_col) ins[n_in++] = tu_tensor(sbv, TU_F32, 1, dsb);
  if (zp & ZP_A) ins[n_in++] = tu_tensor(&zav, TU_I8, 0, NULL);
  if (zp & (ZP_B | ZP_B_COL)) ins[n_in++] = tu_tensor(zbv, TU_I8, zp & ZP_B_COL ? 1 : 0, dsb);
  char what[112];
  snprintf(what, sizeof what, "int8 B=%lld M=%lld K=%lld N=%lld per_col=%d zp=%d",
           (long long)B, (long long)M, (long long)K, (long long)N, per_col, zp);
  // The int32 sums are exact; what remains is the f32 multiplication by the scales.
  tu_run_check(g, ins, n_in, TU_F32, r, co, want, 1e-6, 1e-6, NULL, what);
  free(av), free(bv), free(zbv), free(sbv), free(want);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

static void check(int64_t B, int64_t M, int64_t K, int64_t N, bool per_col, bool symbolic,
                  bool extremes, jit_shape_policy policy) {
  check_zp(B, M, K, N, per_col, symbolic, extremes, policy, 0);
}

Test(int8, tiny_exact) { check(0, 1, 1, 1, false, false, false, JIT_SHAPE_POLICY_EXACT); }
Test(int8, primes_per_channel_exact) { check(0, 17, 31, 45, true, false, false, JIT_SHAPE_POLICY_EXACT); }
Test(int8, tiles_and_rest_exact) { check(0, 64, 256, 67, true, false, false, JIT_SHAPE_POLICY_EXACT); }
Test(int8, batched_exact) { check(3, 7, 33, 29, false, false, false, JIT_SHAPE_POLICY_EXACT); }
Test(int8, extremes_long_k_exact) { check(0, 5, 4099, 9, false, false, true, JIT_SHAPE_POLICY_EXACT); }
Test(int8, symbolic_generic) { check(2, 13, 47, 19, true, true, false, JIT_SHAPE_POLICY_GENERIC); }
Test(int8, symbolic_auto) { check(0, 61, 67, 33, true, true, false, JIT_SHAPE_POLICY_AUTO); }

// Zero points: a's only, b's only (one, per column), both; exact kernels with 1,
// primes and tile rests; generic kernels with symbolic rows and batch; the extremes.
Test(int8_zp, a_only_exact) { check_zp(0, 17, 31, 45, true, false, false, JIT_SHAPE_POLICY_EXACT, ZP_A); }
Test(int8_zp, b_only_exact) { check_zp(0, 1, 1, 1, false, false, false, JIT_SHAPE_POLICY_EXACT, ZP_B); }
Test(int8_zp, b_per_column_exact) { check_zp(0, 64, 256, 67, true, false, false, JIT_SHAPE_POLICY_EXACT, ZP_B_COL); }
Test(int8_zp, both_batched_exact) { check_zp(3, 7, 33, 29, false, false, false, JIT_SHAPE_POLICY_EXACT, ZP_A | ZP_B_COL); }
Test(int8_zp, both_extremes_long_k_exact) { check_zp(0, 5, 4099, 9, false, false, true, JIT_SHAPE_POLICY_EXACT, ZP_A | ZP_B); }
Test(int8_zp, both_symbolic_generic) { check_zp(2, 13, 47, 19, true, true, false, JIT_SHAPE_POLICY_GENERIC, ZP_A | ZP_B_COL); }
Test(int8_zp, a_symbolic_auto) { check_zp(0, 61, 67, 33, true, true, false, JIT_SHAPE_POLICY_AUTO, ZP_A); }

// Zero points of the wrong dtype or shape; and a graph with them through its MLIR
// record (jit_graph_to_mlir / jit_graph_from_mlir) runs like the original.
Test(int8_zp, rules_and_mlir_round_trip) {
  jit_context *ctx = tu_context_policy(JIT_SHAPE_POLICY_EXACT);
  static const char *const says[] = {"zero points are int8", "a's zero point",
                                     "b's zero point"};
  for (int i = 0; i < 3; i++) {
    jit_graph *g = tu_graph(ctx, "bad");
    int64_t da[2] = {4, 8}, db[2] = {8, 3}, d2[1] = {2};
    jit_value a = jit_input(g, "a", TU_I8, 2, da), b = jit_input(g, "b", TU_I8, 2, db);
    jit_value s = jit_scalar(g, 0.5, TU_F32), y = {0};
    switch (i) {
      case 0: y = jit_matmul_int8_zp(g, a, b, s, s, s, (jit_value){0}); break;
      case 1: y = jit_matmul_int8_zp(g, a, b, s, s, jit_input(g, "z", TU_I8, 1, d2), (jit_value){0}); break;
      case 2: y = jit_matmul_int8_zp(g, a, b, s, s, (jit_value){0}, jit_input(g, "z", TU_I8, 1, d2)); break;
    }
    cr_expect_eq(y.id, 0, "case %d built a value", i);
    jit_output(g, jit_input(g, "f", TU_F32, 2, da));
    jit_status st = jit_graph_finalize(g);
    TU_EXPECT_CODE(st, i == 0 ? JIT_DTYPE_MISMATCH : JIT_SHAPE_MISMATCH);
    TU_EXPECT_MSG(st, says[i]);
    jit_status_free(st);
    jit_graph_destroy(g);
  }
  // Round trip: b's zero point only (operand 4 is b's), through the text.
  jit_graph *g = tu_graph(ctx, "zp");
  int64_t da[2] = {3, 5}, db[2] = {5, 2}, dz[1] = {2};
  jit_value a = jit_input(g, "a", TU_I8, 2, da), b = jit_input(g, "b", TU_I8, 2, db);
  jit_value s = jit_scalar(g, 0.25, TU_F32), zb = jit_input(g, "zb", TU_I8, 1, dz);
  jit_output(g, jit_matmul_int8_zp(g, a, b, s, s, (jit_value){0}, zb));
  TU_OK(jit_graph_finalize(g));
  char *text = NULL;
  TU_OK(jit_graph_to_mlir(g, &text));
  jit_graph *h = NULL;
  TU_OK(jit_graph_from_mlir(ctx, text, strlen(text), NULL, &h));
  int8_t av[15], bv[10], zbv[2] = {3, -7};
  float want[6];
  for (int i = 0; i < 15; i++) av[i] = (int8_t)(i * 17 % 256 - 128);
  for (int i = 0; i < 10; i++) bv[i] = (int8_t)(i * 29 % 256 - 128);
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 2; j++) {
      int32_t acc = 0;
      for (int k = 0; k < 5; k++) acc += av[i * 5 + k] * (bv[k * 2 + j] - zbv[j]);
      want[i * 2 + j] = (float)acc * 0.0625f;
    }
  DLTensor ins[3] = {tu_tensor(av, TU_I8, 2, da), tu_tensor(bv, TU_I8, 2, db),
                     tu_tensor(zbv, TU_I8, 1, dz)};
  int64_t dy[2] = {3, 2};
  tu_run_check(g, ins, 3, TU_F32, 2, dy, want, 0, 0, NULL, "zp original");
  tu_run_check(h, ins, 3, TU_F32, 2, dy, want, 0, 0, NULL, "zp from its MLIR");
  jit_string_free(text);
  jit_graph_destroy(h);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(int8, rules) {
  jit_context *ctx = tu_context();
  static const char *const says[] = {"are int8", "the scales are f32",
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
