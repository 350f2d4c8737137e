//===--- prepack.c - weights read as panels packed once, not per call -----===//
//
// A packed matmul (script.c, plan_packed) copies B into panels [nc / tn][kc][tn] once
// per block of columns and rows, on every call: for a 128 x 768 x 3072 layer ~10 % of
// the call, for 64-row products 15-20 %. Where B is a weight (jit_weight: the same data
// from call to call), the runtime can make the panels once, for the whole of B, as
// [N / tn][K][tn], and pass them in B's place; the kernel then reads each block's panels
// where they already are. After bufferization each packing is this loop nest:
//
//   scf.for %p = 0 to nc step tn {                 // L1: one panel per step
//     %panel = memref.subview %buf[%p / tn, 0, 0] [1, kc, tn]
//     scf.for %k = 0 to kc step r {               // L2: r rows at a time
//       %v = vector.transfer_read %B[row(%k), col(%p)]   : vector<r x tn>
//       vector.transfer_write %v, %panel[%k, 0]
//   } }
//
// with row(0) = row0 and col(0) = col0, the block's first row and column of B. The
// rewrite puts a view of the packed B in %buf's place, ahead of L1,
//
//   memref.reinterpret_cast %B to offset: [col0 * K + row0 * tn],
//       sizes: [nc / tn, kc, tn], strides: [K * tn, tn, 1]
//
// that the readers of %buf after L1 (the register tiles' panel subviews) take, and
// drops L1. Where B is W^T for a weight W [N, K] (plan_packed's b_tr), the packing
// reads L x L tiles of W and transposes them in registers (match_site_tr); the view is
// the same, of W's memory, which the runtime then fills from W^T. It is done for an
// argument only when every one of its uses is such a packing, all of one form: the
// kernel then reads B in no other way, and its record says the argument is packed
// (jit__artifact.packed). Anything else keeps the packing in the kernel.
//
//===----------------------------------------------------------------------===//
#include "lowering/cpu/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mlir-c/AffineMap.h>
#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>

#include "lowering/cpu_strategy.h"

#define PREPACK_MAX_SITES 64

typedef struct site {
  MlirOperation read, l1, l2, panel;  // the packing's read, loops and panel subview
  MlirOperation l3;                   // W^T packings: the loop over a panel's columns
  MlirValue buf;                      // the packed buffer it fills
  int64_t tn;                         // its panels' width
  bool tr;                            // B is W^T: the read is of W [N, K]
} site;

// scf.for `loop` runs lb, lb + step, ... below ub, all constants.
static bool const_loop(MlirOperation loop, int64_t *lb, int64_t *ub, int64_t *step) {
  return jit__cpu_op_is(loop, "scf.for") && mlirOperationGetNumResults(loop) == 0 &&
         jit__cpu_const_index(mlirOperationGetOperand(loop, 0), lb) &&
         jit__cpu_const_index(mlirOperationGetOperand(loop, 1), ub) &&
         jit__cpu_const_index(mlirOperationGetOperand(loop, 2), step) && *step > 0;
}

static MlirValue iv_of(MlirOperation loop) {
  return mlirBlockGetArgument(mlirRegionGetFirstBlock(mlirOperationGetRegion(loop, 0)), 0);
}

// Whether `op` is `anc` or nested inside it.
static bool within(MlirOperation op, MlirOperation anc) {
  for (; !mlirOperationIsNull(op); op = mlirOperationGetParentOperation(op))
    if (mlirOperationEqual(op, anc)) return true;
  return false;
}

static bool defined_within(MlirValue v, MlirOperation anc) {
  MlirOperation owner = mlirValueIsAOpResult(v)
                            ? mlirOpResultGetOwner(v)
                            : mlirBlockGetParentOperation(mlirBlockArgumentGetOwner(v));
  return within(owner, anc);
}

static bool all_true(MlirAttribute a, int n) {
  if (mlirAttributeIsNull(a) || !mlirAttributeIsAArray(a) || mlirArrayAttrGetNumElements(a) != n)
    return false;
  for (int i = 0; i < n; i++) {
    MlirAttribute e = mlirArrayAttrGetElement(a, i);
    if (!mlirAttributeIsABool(e) || !mlirBoolAttrGetValue(e)) return false;
  }
  return true;
}

static bool i64_attr_is(MlirOperation op, const char *name, int n, const int64_t *want) {
  MlirAttribute a = mlirOperationGetAttributeByName(op, mlirStringRefCreateFromCString(name));
  if (mlirAttributeIsNull(a) || !mlirAttributeIsADenseI64Array(a) ||
      mlirDenseArrayGetNumElements(a) != n)
    return false;
  for (int i = 0; i < n; i++)
    if (want[i] != INT64_MAX && mlirDenseI64ArrayGetElement(a, i) != want[i]) return false;
  return true;
}

// Whether `map` is (d0) -> (d0 floordiv w) or (d0 ceildiv w): panel p for L1's
// variable p * w.
static bool div_of_dim(MlirAffineMap map, int64_t w) {
  if (mlirAffineMapGetNumDims(map) != 1 || mlirAffineMapGetNumSymbols(map) != 0 ||
      mlirAffineMapGetNumResults(map) != 1)
    return false;
  MlirAffineExpr e = mlirAffineMapGetResult(map, 0);
  if (!mlirAffineExprIsAFloorDiv(e) && !mlirAffineExprIsACeilDiv(e)) return false;
  MlirAffineExpr l = mlirAffineBinaryOpExprGetLHS(e), r = mlirAffineBinaryOpExprGetRHS(e);
  return mlirAffineExprIsADim(l) && mlirAffineDimExprGetPosition(l) == 0 &&
         mlirAffineExprIsAConstant(r) && mlirAffineConstantExprGetValue(r) == w;
}

// Adds to count[i] the coefficient of dim/symbol operand i in sum `e` (dims first, then
// symbols, as affine.apply takes its operands); false unless `e` is a sum of operands,
// operands times constants, and constants.
static bool sum_terms(MlirAffineExpr e, int n_dims, int64_t *count, int n) {
  if (mlirAffineExprIsAConstant(e)) return true;
  int64_t c = 1;
  if (mlirAffineExprIsAMul(e)) {
    MlirAffineExpr r = mlirAffineBinaryOpExprGetRHS(e);
    if (!mlirAffineExprIsAConstant(r)) return false;
    c = mlirAffineConstantExprGetValue(r);
    e = mlirAffineBinaryOpExprGetLHS(e);
  }
  if (mlirAffineExprIsADim(e) || mlirAffineExprIsASymbol(e)) {
    intptr_t i = mlirAffineExprIsADim(e) ? mlirAffineDimExprGetPosition(e)
                                         : n_dims + mlirAffineSymbolExprGetPosition(e);
    if (i >= n) return false;
    count[i] += c;
    return true;
  }
  if (c != 1 || !mlirAffineExprIsAAdd(e)) return false;
  return sum_terms(mlirAffineBinaryOpExprGetLHS(e), n_dims, count, n) &&
         sum_terms(mlirAffineBinaryOpExprGetRHS(e), n_dims, count, n);
}

// How many times loop variable `iv` is added into index `v` (made inside the packing
// by sums only, values of the whole packing times constants among them); -1 when `v`
// is made otherwise (a division, a product with a run-time value...).
static int uses_of_iv(MlirValue v, MlirValue iv, const site *s, int depth) {
  if (mlirValueEqual(v, iv)) return 1;
  if (!defined_within(v, s->l1) || mlirValueEqual(v, iv_of(s->l1)) ||
      mlirValueEqual(v, iv_of(s->l2)) || (s->tr && mlirValueEqual(v, iv_of(s->l3))))
    return 0;  // the other loop's variable, or a value of the whole packing
  if (depth > 6 || !mlirValueIsAOpResult(v)) return -1;
  MlirOperation d = mlirOpResultGetOwner(v);
  intptr_t n = mlirOperationGetNumOperands(d);
  int64_t count[8] = {0};
  if (jit__cpu_op_is(d, "arith.constant")) return 0;
  if (jit__cpu_op_is(d, "arith.addi")) {
    count[0] = count[1] = 1;
  } else if (jit__cpu_op_is(d, "affine.apply") && n <= 8) {
    MlirAffineMap m = mlirAffineMapAttrGetValue(
        mlirOperationGetAttributeByName(d, mlirStringRefCreateFromCString("map")));
    if (mlirAffineMapGetNumResults(m) != 1 ||
        !sum_terms(mlirAffineMapGetResult(m, 0), (int)mlirAffineMapGetNumDims(m), count, (int)n))
      return -1;
  } else {
    return -1;
  }
  int64_t total = 0;
  for (intptr_t i = 0; i < n; i++) {
    int u = uses_of_iv(mlirOperationGetOperand(d, i), iv, s, depth + 1);
    if (u < 0) return -1;
    total += count[i] * u;
  }
  return total < 0 || total > 64 ? -1 : (int)total;
}

// The value `v` (an index inside the packing) has at L1's and L2's first steps, made
// ahead of L1 (`make`; otherwise only checked): the loops' variables become their lower
// bounds, and the pure index ops between them and `v` are cloned. Null when `v` is
// made some other way.
static MlirValue first_value(MlirValue v, const site *s, bool make, int depth) {
  if (depth > 6) return (MlirValue){NULL};
  if (mlirValueEqual(v, iv_of(s->l1))) return mlirOperationGetOperand(s->l1, 0);
  for (int i = 0; i < (s->tr ? 2 : 1); i++) {
    MlirOperation loop = i ? s->l3 : s->l2;
    if (!mlirValueEqual(v, iv_of(loop))) continue;
    MlirValue lb = mlirOperationGetOperand(loop, 0);
    return defined_within(lb, s->l1) ? (MlirValue){NULL} : lb;
  }
  if (!defined_within(v, s->l1)) return v;
  if (!mlirValueIsAOpResult(v)) return (MlirValue){NULL};
  MlirOperation d = mlirOpResultGetOwner(v);
  if (!(jit__cpu_op_is(d, "affine.apply") || jit__cpu_op_is(d, "arith.addi") ||
        jit__cpu_op_is(d, "arith.muli") || jit__cpu_op_is(d, "arith.constant")) ||
      mlirOperationGetNumResults(d) != 1 || mlirOperationGetNumRegions(d) != 0)
    return (MlirValue){NULL};
  intptr_t n = mlirOperationGetNumOperands(d);
  MlirValue ops[8];
  if (n > 8) return (MlirValue){NULL};
  for (intptr_t i = 0; i < n; i++) {
    ops[i] = first_value(mlirOperationGetOperand(d, i), s, make, depth + 1);
    if (mlirValueIsNull(ops[i])) return (MlirValue){NULL};
  }
  if (!make) return v;  // stands for "can be made"
  MlirOperation c = mlirOperationClone(d);
  for (intptr_t i = 0; i < n; i++) mlirOperationSetOperand(c, i, ops[i]);
  mlirBlockInsertOwnedOperationBefore(mlirOperationGetBlock(s->l1), s->l1, c);
  return mlirOperationGetResult(c, 0);
}

// Whether `write` (in the packing loops of `s`) writes the panel %buf[p(%l1), 0, 0]
// [1, kc, w] of a static buffer [nc / w, kc, w] (nc = L1's bound); sets s->panel, buf.
static bool panel_of(site *s, MlirOperation write, int64_t ub1, int64_t ub2, int64_t w) {
  MlirValue pv = mlirOperationGetOperand(write, 1);
  if (!mlirValueIsAOpResult(pv)) return false;
  s->panel = mlirOpResultGetOwner(pv);
  const int64_t dyn = mlirShapedTypeGetDynamicStrideOrOffset();
  const int64_t offs[3] = {dyn, 0, 0}, sizes[3] = {1, ub2, w}, ones[3] = {1, 1, 1};
  if (!jit__cpu_op_is(s->panel, "memref.subview") ||
      !mlirOperationEqual(mlirOperationGetParentOperation(s->panel), s->l1) ||
      mlirOperationGetNumOperands(s->panel) != 2 ||
      !i64_attr_is(s->panel, "static_offsets", 3, offs) ||
      !i64_attr_is(s->panel, "static_sizes", 3, sizes) ||
      !i64_attr_is(s->panel, "static_strides", 3, ones))
    return false;
  // Its panel index: a map of L1's variable alone (p = %l1 / w: the buffer's panels
  // follow L1's steps, which the whole-panel bounds below make exact).
  MlirValue pi = mlirOperationGetOperand(s->panel, 1);
  if (!mlirValueIsAOpResult(pi)) return false;
  MlirOperation pio = mlirOpResultGetOwner(pi);
  if (!jit__cpu_op_is(pio, "affine.apply") || mlirOperationGetNumOperands(pio) != 1 ||
      !mlirValueEqual(mlirOperationGetOperand(pio, 0), iv_of(s->l1)))
    return false;
  if (!div_of_dim(mlirAffineMapAttrGetValue(mlirOperationGetAttributeByName(
                      pio, mlirStringRefCreateFromCString("map"))),
                  w))
    return false;
  s->buf = mlirOperationGetOperand(s->panel, 0);
  if (!mlirValueIsAOpResult(s->buf)) return false;
  MlirOperation a = mlirOpResultGetOwner(s->buf);
  MlirType bt = mlirValueGetType(s->buf);
  if (!(jit__cpu_op_is(a, "memref.alloc") || jit__cpu_op_is(a, "memref.alloca")) ||
      mlirOperationGetNumOperands(a) != 0 || !mlirShapedTypeHasStaticShape(bt) ||
      mlirShapedTypeGetRank(bt) != 3 ||
      !mlirAffineMapIsIdentity(mlirMemRefTypeGetAffineMap(bt)) ||
      mlirShapedTypeGetDimSize(bt, 0) * w != ub1 || mlirShapedTypeGetDimSize(bt, 1) != ub2 ||
      mlirShapedTypeGetDimSize(bt, 2) != w)
    return false;
  return true;
}

// Whether B's row index `row` is row0 + %k (L2's variable) and its column `col` col0 +
// %p (+ %j, L3's, for W^T), both known at the first steps.
static bool indices_ok(const site *s, MlirValue row, MlirValue col) {
  MlirValue i1 = iv_of(s->l1), i2 = iv_of(s->l2);
  int want3 = s->tr ? 1 : 0;
  return uses_of_iv(row, i2, s, 0) == 1 && uses_of_iv(row, i1, s, 0) == 0 &&
         uses_of_iv(col, i1, s, 0) == 1 && uses_of_iv(col, i2, s, 0) == 0 &&
         (!s->tr || (uses_of_iv(row, iv_of(s->l3), s, 0) == 0 &&
                     uses_of_iv(col, iv_of(s->l3), s, 0) == want3)) &&
         !mlirValueIsNull(first_value(row, s, false, 0)) &&
         !mlirValueIsNull(first_value(col, s, false, 0));
}

// Whether `read`, a use of B (a K x N f32 argument), is the read of a packing as the
// header describes, with panels of `*tn` columns (0: not known yet; must match).
static bool match_site(MlirOperation read, MlirValue B, int64_t N, int64_t *tn, site *s) {
  memset(s, 0, sizeof *s);
  if (!jit__cpu_op_is(read, "vector.transfer_read") || mlirOperationGetNumOperands(read) != 4 ||
      !mlirValueEqual(mlirOperationGetOperand(read, 0), B) ||
      !all_true(mlirOperationGetAttributeByName(read, mlirStringRefCreateFromCString("in_bounds")), 2))
    return false;
  MlirValue v = mlirOperationGetResult(read, 0);
  MlirType vt = mlirValueGetType(v);
  if (!mlirTypeIsAVector(vt) || mlirShapedTypeGetRank(vt) != 2) return false;
  int64_t r = mlirShapedTypeGetDimSize(vt, 0), w = mlirShapedTypeGetDimSize(vt, 1);
  if ((*tn && w != *tn) || N % w != 0) return false;
  MlirAttribute pm =
      mlirOperationGetAttributeByName(read, mlirStringRefCreateFromCString("permutation_map"));
  if (mlirAttributeIsNull(pm) || !mlirAttributeIsAAffineMap(pm) ||
      !mlirAffineMapIsIdentity(mlirAffineMapAttrGetValue(pm)))
    return false;
  // Its one user: the write into a panel, at [L2's row, 0].
  MlirOpOperand u = mlirValueGetFirstUse(v);
  if (mlirOpOperandIsNull(u) || !mlirOpOperandIsNull(mlirOpOperandGetNextUse(u))) return false;
  MlirOperation write = mlirOpOperandGetOwner(u);
  int64_t zero = -1;
  if (!jit__cpu_op_is(write, "vector.transfer_write") || mlirOperationGetNumOperands(write) != 4 ||
      mlirOpOperandGetOperandNumber(u) != 0 ||
      !mlirBlockEqual(mlirOperationGetBlock(write), mlirOperationGetBlock(read)) ||
      !jit__cpu_const_index(mlirOperationGetOperand(write, 3), &zero) || zero != 0 ||
      !all_true(mlirOperationGetAttributeByName(write, mlirStringRefCreateFromCString("in_bounds")), 2))
    return false;
  s->read = read;
  s->l2 = mlirOperationGetParentOperation(read);
  int64_t lb2, ub2, st2, lb1, ub1, st1;
  if (!const_loop(s->l2, &lb2, &ub2, &st2) || lb2 != 0 || st2 != r ||
      !mlirValueEqual(mlirOperationGetOperand(write, 2), iv_of(s->l2)))
    return false;
  s->l1 = mlirOperationGetParentOperation(s->l2);
  if (!const_loop(s->l1, &lb1, &ub1, &st1) || lb1 != 0 || st1 != w) return false;
  // L1 holds L2, the panel subview and index ops only; L2 the read and write.
  MlirBlock b1 = mlirRegionGetFirstBlock(mlirOperationGetRegion(s->l1, 0));
  for (MlirOperation o = mlirBlockGetFirstOperation(b1); !mlirOperationIsNull(o);
       o = mlirOperationGetNextInBlock(o))
    if (!(mlirOperationEqual(o, s->l2) || jit__cpu_op_is(o, "memref.subview") ||
          jit__cpu_op_is(o, "affine.apply") || jit__cpu_op_is(o, "arith.addi") ||
          jit__cpu_op_is(o, "arith.muli") || jit__cpu_op_is(o, "arith.constant") ||
          jit__cpu_op_is(o, "scf.yield")))
      return false;
  MlirBlock b2 = mlirOperationGetBlock(read);
  for (MlirOperation o = mlirBlockGetFirstOperation(b2); !mlirOperationIsNull(o);
       o = mlirOperationGetNextInBlock(o))
    if (!(mlirOperationEqual(o, read) || mlirOperationEqual(o, write) ||
          jit__cpu_op_is(o, "affine.apply") || jit__cpu_op_is(o, "arith.addi") ||
          jit__cpu_op_is(o, "arith.constant") || jit__cpu_op_is(o, "scf.yield")))
      return false;
  if (!panel_of(s, write, ub1, ub2, w) || ub2 % r != 0) return false;
  // The read's row is row0 + %k, its column col0 + %p, both known at the first steps.
  if (!indices_ok(s, mlirOperationGetOperand(read, 1), mlirOperationGetOperand(read, 2)))
    return false;
  *tn = s->tn = w;
  return true;
}

// Whether `op` may sit in a W^T packing's innermost loop: index arithmetic and the
// in-register transpose of the tile read.
static bool transpose_op(MlirOperation op) {
  static const char *const ok[] = {"affine.apply",       "arith.addi",       "arith.constant",
                                   "vector.extract",     "vector.shuffle",   "vector.transpose",
                                   "vector.shape_cast",
                                   "vector.to_elements", "vector.from_elements", "scf.yield"};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
    if (jit__cpu_op_is(op, ok[i])) return true;
  return false;
}

// As match_site, for B = W^T read from W [N, K] (plan_packed's b_tr): L x L tiles of W,
// transposed in registers, written into a panel at [%k, %j]:
//   L1 scf.for %p = 0 to nc step tn { %panel = subview %buf[%p / tn, 0, 0] [1, kc, tn]
//     L2 scf.for %k = 0 to kc step L {  L3 scf.for %j = 0 to tn step L {
//       %t = vector.transfer_read %W[col(%p, %j), row(%k)] : vector<L x L>
//       (vector.extract / shuffle / transpose ...)
//       vector.transfer_write %tt, %panel[%k, %j] } } }
static bool match_site_tr(MlirOperation read, MlirValue W, int64_t N, int64_t *tn, site *s) {
  memset(s, 0, sizeof *s);
  s->tr = true;
  if (!jit__cpu_op_is(read, "vector.transfer_read") || mlirOperationGetNumOperands(read) != 4 ||
      !mlirValueEqual(mlirOperationGetOperand(read, 0), W) ||
      !all_true(mlirOperationGetAttributeByName(read, mlirStringRefCreateFromCString("in_bounds")), 2))
    return false;
  MlirType vt = mlirValueGetType(mlirOperationGetResult(read, 0));
  MlirAttribute pm =
      mlirOperationGetAttributeByName(read, mlirStringRefCreateFromCString("permutation_map"));
  if (!mlirTypeIsAVector(vt) || mlirShapedTypeGetRank(vt) != 2 || mlirAttributeIsNull(pm) ||
      !mlirAttributeIsAAffineMap(pm) || !mlirAffineMapIsIdentity(mlirAffineMapAttrGetValue(pm)))
    return false;
  int64_t L = mlirShapedTypeGetDimSize(vt, 0);
  if (mlirShapedTypeGetDimSize(vt, 1) != L) return false;
  s->read = read;
  s->l3 = mlirOperationGetParentOperation(read);
  s->l2 = mlirOperationGetParentOperation(s->l3);
  s->l1 = mlirOperationGetParentOperation(s->l2);
  int64_t lb3, ub3, st3, lb2, ub2, st2, lb1, ub1, st1;
  if (!const_loop(s->l3, &lb3, &ub3, &st3) || lb3 != 0 || st3 != L ||
      !const_loop(s->l2, &lb2, &ub2, &st2) || lb2 != 0 || st2 != L ||
      !const_loop(s->l1, &lb1, &ub1, &st1) || lb1 != 0 || st1 != ub3 ||
      (*tn && ub3 != *tn) || N % ub3 != 0 || ub3 % L != 0 || ub2 % L != 0)
    return false;
  // The innermost loop: this read, one write into the panel at [%k, %j], transposes.
  MlirOperation write = {NULL};
  MlirBlock b3 = mlirOperationGetBlock(read);
  for (MlirOperation o = mlirBlockGetFirstOperation(b3); !mlirOperationIsNull(o);
       o = mlirOperationGetNextInBlock(o)) {
    if (mlirOperationEqual(o, read) || transpose_op(o)) continue;
    if (!jit__cpu_op_is(o, "vector.transfer_write") || !mlirOperationIsNull(write)) return false;
    write = o;
  }
  if (mlirOperationIsNull(write) || mlirOperationGetNumOperands(write) != 4 ||
      !mlirValueEqual(mlirOperationGetOperand(write, 2), iv_of(s->l2)) ||
      !mlirValueEqual(mlirOperationGetOperand(write, 3), iv_of(s->l3)) ||
      !all_true(mlirOperationGetAttributeByName(write, mlirStringRefCreateFromCString("in_bounds")), 2))
    return false;
  // L2 holds L3 and index ops; L1 L2, the panel and index ops.
  for (int level = 0; level < 2; level++) {
    MlirOperation loop = level ? s->l1 : s->l2, inner = level ? s->l2 : s->l3;
    MlirBlock b = mlirRegionGetFirstBlock(mlirOperationGetRegion(loop, 0));
    for (MlirOperation o = mlirBlockGetFirstOperation(b); !mlirOperationIsNull(o);
         o = mlirOperationGetNextInBlock(o))
      if (!(mlirOperationEqual(o, inner) || (level && jit__cpu_op_is(o, "memref.subview")) ||
            jit__cpu_op_is(o, "affine.apply") || jit__cpu_op_is(o, "arith.addi") ||
            jit__cpu_op_is(o, "arith.constant") || jit__cpu_op_is(o, "scf.yield")))
        return false;
  }
  if (!panel_of(s, write, ub1, ub2, ub3)) return false;
  // W's row is B's column: col0 + %p + %j; W's column B's row: row0 + %k.
  if (!indices_ok(s, mlirOperationGetOperand(read, 2), mlirOperationGetOperand(read, 1)))
    return false;
  *tn = s->tn = ub3;
  return true;
}

// Whether `op`, a reader of a packed buffer, is a register tile's panel: a subview
// [p, 0, 0] [1, kc, tn] dropping the panel dim, whose type stays what it is when its
// source becomes the packed view (strides [tn, 1], a run-time offset).
static bool panel_reader(MlirOperation op, int64_t kc, int64_t tn) {
  const int64_t any = INT64_MAX, sizes[3] = {1, kc, tn}, ones[3] = {1, 1, 1};
  const int64_t offs[3] = {any, any, any};
  if (!jit__cpu_op_is(op, "memref.subview") ||
      !i64_attr_is(op, "static_sizes", 3, sizes) || !i64_attr_is(op, "static_strides", 3, ones) ||
      !i64_attr_is(op, "static_offsets", 3, offs))
    return false;
  MlirType t = mlirValueGetType(mlirOperationGetResult(op, 0));
  int64_t strides[2], offset = 0;
  return mlirShapedTypeGetRank(t) == 2 &&
         mlirLogicalResultIsSuccess(mlirMemRefTypeGetStridesAndOffset(t, strides, &offset)) &&
         strides[0] == tn && strides[1] == 1 && mlirShapedTypeIsDynamicStrideOrOffset(offset);
}


// Puts the packed view of argument `B` (K x N, panels of tn) for site `s` ahead of its
// L1; returns the view.
static MlirValue packed_view(MlirContext ctx, const site *s, MlirValue B, int64_t K,
                             int64_t tn) {
  // B's first row and column (W^T: W's column and row).
  MlirValue row0 = first_value(mlirOperationGetOperand(s->read, s->tr ? 2 : 1), s, true, 0);
  MlirValue col0 = first_value(mlirOperationGetOperand(s->read, s->tr ? 1 : 2), s, true, 0);
  MlirLocation loc = mlirOperationGetLocation(s->l1);
  MlirBlock b = mlirOperationGetBlock(s->l1);
  char text[160];
  // Panel col0 / tn starts at (col0 / tn) * K * tn = col0 * K; row row0 of it at row0 * tn.
  snprintf(text, sizeof text, "affine_map<(d0, d1) -> (d0 * %lld + d1 * %lld)>", (long long)K,
           (long long)tn);
  MlirAttribute map = mlirAttributeParseGet(ctx, mlirStringRefCreateFromCString(text));
  MlirType index = mlirIndexTypeGet(ctx);
  MlirOperationState st = mlirOperationStateGet(mlirStringRefCreateFromCString("affine.apply"), loc);
  MlirValue ops[2] = {col0, row0};
  mlirOperationStateAddOperands(&st, 2, ops);
  mlirOperationStateAddResults(&st, 1, &index);
  MlirNamedAttribute ma = jit__cpu_named(ctx, "map", map);
  mlirOperationStateAddAttributes(&st, 1, &ma);
  MlirOperation off = mlirOperationCreate(&st);
  mlirBlockInsertOwnedOperationBefore(b, s->l1, off);

  MlirType bt = mlirValueGetType(s->buf);
  int64_t sizes[3] = {mlirShapedTypeGetDimSize(bt, 0), mlirShapedTypeGetDimSize(bt, 1), tn};
  int64_t strides[3] = {K * tn, tn, 1};
  MlirOperation view = jit__cpu_reinterpret_cast(ctx, s->l1, B, mlirOperationGetResult(off, 0),
                                                 3, sizes, strides);
  return mlirOperationGetResult(view, 0);
}

// Whether view `v` of a packed buffer is only read: through subviews, by vector reads.
static bool read_only(MlirValue v, int depth) {
  for (MlirOpOperand u = mlirValueGetFirstUse(v); !mlirOpOperandIsNull(u);
       u = mlirOpOperandGetNextUse(u)) {
    MlirOperation o = mlirOpOperandGetOwner(u);
    if (jit__cpu_op_is(o, "vector.transfer_read") || jit__cpu_op_is(o, "vector.load")) continue;
    if (depth < 4 && jit__cpu_op_is(o, "memref.subview") &&
        read_only(mlirOperationGetResult(o, 0), depth + 1))
      continue;
    return false;
  }
  return true;
}

enum { MAX_SITES = 128, MAX_READERS = 512 };

typedef struct prepack {
  site s[MAX_SITES];
  uint32_t owner[MAX_SITES];  // the argument each site packs
  int n;
  bool *in;                   // per argument: still taken
  MlirOperation readers[MAX_READERS];
  int reader_site[MAX_READERS];
  int n_readers;
} prepack;

// The live site (its argument still taken) that `op` reads: the nearest one before it
// or an ancestor in the same block, packing `buf`; -1 if none.
static int live_site_before(const prepack *pp, MlirOperation op, MlirValue buf) {
  for (MlirOperation a = op; !mlirOperationIsNull(a); a = mlirOperationGetParentOperation(a)) {
    int best = -1;
    for (int i = 0; i < pp->n; i++)
      if (pp->in[pp->owner[i]] && mlirValueEqual(pp->s[i].buf, buf) &&
          mlirBlockEqual(mlirOperationGetBlock(pp->s[i].l1), mlirOperationGetBlock(a)) &&
          mlirOperationIsBeforeInBlock(pp->s[i].l1, a) &&
          (best < 0 || mlirOperationIsBeforeInBlock(pp->s[best].l1, pp->s[i].l1)))
        best = i;
    if (best >= 0) return best;
  }
  return -1;
}

// Adds the readers of buffer `buf` (site `first`'s) to pp->readers; false unless each
// use is a live site's own panel, a deallocation, or a read-only panel whose packing
// is a live site's. Buffers may be shared by several products' packings (one-shot
// bufferization reuses them), so all weights are looked at together.
static bool buffer_readers(prepack *pp, int first) {
  MlirValue buf = pp->s[first].buf;
  int64_t kc = mlirShapedTypeGetDimSize(mlirValueGetType(buf), 1);
  int64_t tn = mlirShapedTypeGetDimSize(mlirValueGetType(buf), 2);
  for (MlirOpOperand u = mlirValueGetFirstUse(buf); !mlirOpOperandIsNull(u);
       u = mlirOpOperandGetNextUse(u)) {
    MlirOperation o = mlirOpOperandGetOwner(u);
    bool own = false;
    for (int j = 0; j < pp->n && !own; j++)
      own = pp->in[pp->owner[j]] && mlirOperationEqual(o, pp->s[j].panel);
    if (own || jit__cpu_op_is(o, "memref.dealloc")) continue;
    int at = live_site_before(pp, o, buf);
    if (at < 0 || pp->n_readers == MAX_READERS || mlirOpOperandGetOperandNumber(u) != 0 ||
        !panel_reader(o, kc, tn) || !read_only(mlirOperationGetResult(o, 0), 0))
      return false;
    pp->readers[pp->n_readers] = o;
    pp->reader_site[pp->n_readers++] = at;
  }
  return true;
}

// Collects the packings of weight argument `B` (index `arg`): true when every use of B
// is one, with one panel width.
static bool collect_sites(prepack *pp, MlirValue B, uint32_t arg) {
  MlirType t = mlirValueGetType(B);
  if (!mlirTypeIsAMemRef(t) || mlirShapedTypeGetRank(t) != 2 ||
      !mlirShapedTypeHasStaticShape(t) || !mlirTypeIsAF32(mlirShapedTypeGetElementType(t)) ||
      !mlirAffineMapIsIdentity(mlirMemRefTypeGetAffineMap(t)))
    return false;
  int64_t tn = 0;
  int n0 = pp->n;
  // Every use the same form: B itself (N its columns), or W with B = W^T (N its rows).
  for (int tr = 0; tr < 2; tr++) {
    int64_t N = mlirShapedTypeGetDimSize(t, tr ? 0 : 1);
    bool all = true;
    for (MlirOpOperand u = mlirValueGetFirstUse(B); !mlirOpOperandIsNull(u) && all;
         u = mlirOpOperandGetNextUse(u)) {
      MlirOperation read = mlirOpOperandGetOwner(u);
      all = pp->n < MAX_SITES && (tr ? match_site_tr(read, B, N, &tn, &pp->s[pp->n])
                                     : match_site(read, B, N, &tn, &pp->s[pp->n]));
      if (all) pp->owner[pp->n++] = arg;
    }
    if (all && pp->n > n0) return true;
    pp->n = n0;
    tn = 0;
  }
  return false;
}

// Drops every live site's packing loop, its panels then read from B's packed view, and
// each buffer no longer written.
static void rewrite(MlirContext ctx, prepack *pp, MlirBlock entry) {
  MlirValue views[MAX_SITES];
  for (int i = 0; i < pp->n; i++) {
    if (!pp->in[pp->owner[i]]) continue;
    MlirValue B = mlirBlockGetArgument(entry, pp->owner[i]);
    MlirType bt = mlirValueGetType(B);
    views[i] = packed_view(ctx, &pp->s[i], B, mlirShapedTypeGetDimSize(bt, pp->s[i].tr ? 1 : 0),
                           pp->s[i].tn);
  }
  for (int r = 0; r < pp->n_readers; r++)
    mlirOperationSetOperand(pp->readers[r], 0, views[pp->reader_site[r]]);
  for (int i = 0; i < pp->n; i++) {
    if (!pp->in[pp->owner[i]]) continue;
    MlirValue buf = pp->s[i].buf;
    mlirOperationDestroy(pp->s[i].l1);
    bool last = true;  // the buffer goes with its last packing, if nothing else uses it
    for (int j = i + 1; j < pp->n && last; j++)
      last = !(pp->in[pp->owner[j]] && mlirValueEqual(pp->s[j].buf, buf));
    if (!last) continue;
    bool used = false;
    for (MlirOpOperand u = mlirValueGetFirstUse(buf); !mlirOpOperandIsNull(u) && !used;
         u = mlirOpOperandGetNextUse(u))
      used = !jit__cpu_op_is(mlirOpOperandGetOwner(u), "memref.dealloc");
    if (used) continue;
    MlirOpOperand u;
    while (!mlirOpOperandIsNull(u = mlirValueGetFirstUse(buf)))
      mlirOperationDestroy(mlirOpOperandGetOwner(u));
    mlirOperationDestroy(mlirOpResultGetOwner(buf));
  }
}

typedef struct find_func {
  const char *name;
  MlirOperation func;
} find_func;

static MlirWalkResult find_entry(MlirOperation op, void *user) {
  find_func *f = user;
  if (!jit__cpu_op_is(op, "func.func")) return MlirWalkResultAdvance;
  MlirAttribute a = mlirOperationGetAttributeByName(op, mlirStringRefCreateFromCString("sym_name"));
  MlirStringRef s = mlirAttributeIsNull(a) ? (MlirStringRef){NULL, 0} : mlirStringAttrGetValue(a);
  if (s.length == strlen(f->name) && memcmp(s.data, f->name, s.length) == 0) {
    f->func = op;
    return MlirWalkResultInterrupt;
  }
  return MlirWalkResultSkip;
}

int jit__cpu_prepack_weights(MlirContext ctx, MlirOperation module, const char *func_name,
                             const bool *weights, uint32_t n_args, jit__packed_arg *out,
                             int max_out) {
  find_func f = {func_name, {NULL}};
  mlirOperationWalk(module, find_entry, &f, MlirWalkPreOrder);
  if (mlirOperationIsNull(f.func) || !weights) return 0;
  MlirBlock entry = mlirRegionGetFirstBlock(mlirOperationGetRegion(f.func, 0));
  if ((intptr_t)n_args > mlirBlockGetNumArguments(entry)) return 0;
  prepack *pp = calloc(1, sizeof *pp);
  bool *in = calloc(n_args ? n_args : 1, sizeof(bool));
  int n = 0;
  if (!pp || !in) goto done;
  pp->in = in;
  for (uint32_t i = 0; i < n_args; i++)
    in[i] = weights[i] && collect_sites(pp, mlirBlockGetArgument(entry, i), i);
  // A buffer that fails takes every argument packed into it out; until none fails.
  for (bool changed = true; changed;) {
    changed = false;
    pp->n_readers = 0;
    for (int i = 0; i < pp->n; i++) {
      if (!in[pp->owner[i]]) continue;
      bool seen = false;
      for (int j = 0; j < i && !seen; j++)
        seen = in[pp->owner[j]] && mlirValueEqual(pp->s[j].buf, pp->s[i].buf);
      if (seen || buffer_readers(pp, i)) continue;
      for (int j = 0; j < pp->n; j++)
        if (mlirValueEqual(pp->s[j].buf, pp->s[i].buf)) in[pp->owner[j]] = false;
      changed = true;
      break;
    }
  }
  for (uint32_t i = 0; i < n_args; i++) n += in[i];
  if (n > max_out) {  // more than a record lists: the kernel packs them all itself
    n = 0;
    goto done;
  }
  rewrite(ctx, pp, entry);
  n = 0;
  for (uint32_t i = 0; i < n_args; i++)
    if (in[i]) {
      int j = 0;
      while (pp->owner[j] != i) j++;
      out[n++] = (jit__packed_arg){i, (uint32_t)pp->s[j].tn, pp->s[j].tr};
    }
done:
  free(pp);
  free(in);
  return n;
}
