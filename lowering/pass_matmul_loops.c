//===--- pass_matmul_loops.c - jitml-lower-matmul-to-loops, a pass in C -----===//
//
// Our own MLIR pass, written against the C API (mlirCreateExternalPass and the
// rewriter): every 2-D linalg.matmul on memrefs (C += A B) becomes
//
//   scf.for %i = 0 to M {  scf.for %j = 0 to N {  scf.for %k = 0 to K {
//     %a = memref.load A[%i, %k]   %b = memref.load B[%k, %j]   %c = memref.load C[%i, %j]
//     %p = arith.mulf %a', %b'     %s = arith.addf %c, %p       memref.store %s, C[%i, %j]
//   } } }
//
// computed in C's element type, as linalg.matmul's semantics say: inputs of another
// float type are first extended (arith.extf) or truncated (arith.truncf) to it, so f16
// inputs with an f32 accumulator (what the emitter writes) accumulate in f32, and an
// all-f16 matmul accumulates in f16. The debug pipeline (opt_level 0) runs it instead of
// the upstream convert-linalg-to-loops, so its output is what a user sees in the
// 04-bufferized dump. Matmuls it does not handle (tensors, transposed or broadcast
// indexing maps, dynamic shapes, integer types) are left for the upstream pass.
//
// Ops are built generically (mlirOperationStateGet): the C API has no builders for
// scf/memref/arith ops, and the generic form is stable across MLIR versions.
//
//===----------------------------------------------------------------------===//
#include <stdlib.h>
#include <string.h>

#include <mlir-c/AffineExpr.h>
#include <mlir-c/AffineMap.h>
#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <mlir-c/IR.h>
#include <mlir-c/Pass.h>
#include <mlir-c/Rewrite.h>
#include <mlir-c/Support.h>

#include "lowering/import.h"

static bool jit__op_is(MlirOperation op, const char *name) {
  MlirStringRef s = mlirIdentifierStr(mlirOperationGetName(op));
  size_t n = strlen(name);
  return s.length == n && memcmp(s.data, name, n) == 0;
}

static MlirNamedAttribute jit__named(MlirContext ctx, const char *name, MlirAttribute a) {
  return mlirNamedAttributeGet(
      mlirIdentifierGet(ctx, mlirStringRefCreateFromCString(name)), a);
}

// Builds and inserts one op at the rewriter's insertion point.
static MlirOperation jit__build(MlirRewriterBase rw, MlirLocation loc, const char *name,
                                intptr_t n_operands, const MlirValue *operands,
                                intptr_t n_results, const MlirType *results,
                                intptr_t n_attrs, const MlirNamedAttribute *attrs,
                                intptr_t n_regions, MlirRegion *regions) {
  MlirOperationState st = mlirOperationStateGet(mlirStringRefCreateFromCString(name), loc);
  if (n_operands) mlirOperationStateAddOperands(&st, n_operands, operands);
  if (n_results) mlirOperationStateAddResults(&st, n_results, results);
  if (n_attrs) mlirOperationStateAddAttributes(&st, n_attrs, attrs);
  if (n_regions) mlirOperationStateAddOwnedRegions(&st, n_regions, regions);
  return mlirRewriterBaseInsert(rw, mlirOperationCreate(&st));
}

static MlirValue jit__index_const(MlirRewriterBase rw, MlirLocation loc, int64_t v) {
  MlirContext ctx = mlirRewriterBaseGetContext(rw);
  MlirType idx = mlirIndexTypeGet(ctx);
  MlirNamedAttribute a = jit__named(ctx, "value", mlirIntegerAttrGet(idx, v));
  return mlirOperationGetResult(
      jit__build(rw, loc, "arith.constant", 0, NULL, 1, &idx, 1, &a, 0, NULL), 0);
}

// Inserts `scf.for %iv = lb to ub step 1 { scf.yield }` and moves the insertion point
// to the start of its body; returns the induction variable.
static MlirValue jit__build_for(MlirRewriterBase rw, MlirLocation loc, MlirValue lb,
                                MlirValue ub, MlirValue step) {
  MlirContext ctx = mlirRewriterBaseGetContext(rw);
  MlirType idx = mlirIndexTypeGet(ctx);
  MlirRegion region = mlirRegionCreate();
  MlirBlock body = mlirBlockCreate(1, &idx, &loc);
  mlirRegionAppendOwnedBlock(region, body);
  MlirValue operands[3] = {lb, ub, step};
  jit__build(rw, loc, "scf.for", 3, operands, 0, NULL, 0, NULL, 1, &region);
  mlirRewriterBaseSetInsertionPointToStart(rw, body);
  jit__build(rw, loc, "scf.yield", 0, NULL, 0, NULL, 0, NULL, 0, NULL);
  // Body ops go before the yield.
  mlirRewriterBaseSetInsertionPointToStart(rw, body);
  return mlirBlockGetArgument(body, 0);
}

static MlirValue jit__load(MlirRewriterBase rw, MlirLocation loc, MlirValue mem,
                           MlirValue i0, MlirValue i1) {
  MlirValue operands[3] = {mem, i0, i1};
  MlirType elt = mlirShapedTypeGetElementType(mlirValueGetType(mem));
  return mlirOperationGetResult(
      jit__build(rw, loc, "memref.load", 3, operands, 1, &elt, 0, NULL, 0, NULL), 0);
}

// `v` converted to float type `to` (extf when wider, truncf when narrower).
static MlirValue jit__convert(MlirRewriterBase rw, MlirLocation loc, MlirValue v,
                              MlirType to) {
  MlirType from = mlirValueGetType(v);
  if (mlirTypeEqual(from, to)) return v;
  const char *name =
      mlirFloatTypeGetWidth(from) < mlirFloatTypeGetWidth(to) ? "arith.extf" : "arith.truncf";
  return mlirOperationGetResult(jit__build(rw, loc, name, 1, &v, 1, &to, 0, NULL, 0, NULL),
                                0);
}

// Whether `mm` is a matmul this pass handles: memrefs of rank 2 with static shapes,
// float element types, the default indexing maps.
static bool jit__handles(MlirOperation mm) {
  if (mlirOperationGetNumOperands(mm) != 3 || mlirOperationGetNumResults(mm) != 0)
    return false;
  for (int i = 0; i < 3; i++) {
    MlirType t = mlirValueGetType(mlirOperationGetOperand(mm, i));
    if (!mlirTypeIsAMemRef(t) || mlirShapedTypeGetRank(t) != 2 ||
        !mlirShapedTypeHasStaticShape(t) || !mlirTypeIsAFloat(mlirShapedTypeGetElementType(t)))
      return false;
  }
  MlirAttribute maps = mlirOperationGetAttributeByName(
      mm, mlirStringRefCreateFromCString("indexing_maps"));
  if (!mlirAttributeIsNull(maps)) {
    // Default maps: A(d0, d2), B(d2, d1), C(d0, d1).
    static const int want[3][2] = {{0, 2}, {2, 1}, {0, 1}};
    if (!mlirAttributeIsAArray(maps) || mlirArrayAttrGetNumElements(maps) != 3) return false;
    for (int i = 0; i < 3; i++) {
      MlirAttribute a = mlirArrayAttrGetElement(maps, i);
      if (!mlirAttributeIsAAffineMap(a)) return false;
      MlirAffineMap m = mlirAffineMapAttrGetValue(a);
      if (mlirAffineMapGetNumDims(m) != 3 || mlirAffineMapGetNumResults(m) != 2)
        return false;
      for (int r = 0; r < 2; r++) {
        MlirAffineExpr e = mlirAffineMapGetResult(m, r);
        if (!mlirAffineExprIsADim(e) || mlirAffineDimExprGetPosition(e) != want[i][r])
          return false;
      }
    }
  }
  // A `cast` attribute other than the default (signed) only matters for integers,
  // which were refused above.
  return true;
}

static void jit__lower_one(MlirRewriterBase rw, MlirOperation mm) {
  MlirLocation loc = mlirOperationGetLocation(mm);
  MlirValue a = mlirOperationGetOperand(mm, 0), b = mlirOperationGetOperand(mm, 1),
            c = mlirOperationGetOperand(mm, 2);
  MlirType ta = mlirValueGetType(a), tc = mlirValueGetType(c);
  MlirType acc = mlirShapedTypeGetElementType(tc);
  int64_t m = mlirShapedTypeGetDimSize(tc, 0), n = mlirShapedTypeGetDimSize(tc, 1);
  int64_t k = mlirShapedTypeGetDimSize(ta, 1);

  mlirRewriterBaseSetInsertionPointBefore(rw, mm);
  MlirValue c0 = jit__index_const(rw, loc, 0), c1 = jit__index_const(rw, loc, 1);
  MlirValue cm = jit__index_const(rw, loc, m), cn = jit__index_const(rw, loc, n),
            ck = jit__index_const(rw, loc, k);
  MlirValue i = jit__build_for(rw, loc, c0, cm, c1);
  MlirValue j = jit__build_for(rw, loc, c0, cn, c1);
  MlirValue kk = jit__build_for(rw, loc, c0, ck, c1);
  MlirValue va = jit__convert(rw, loc, jit__load(rw, loc, a, i, kk), acc);
  MlirValue vb = jit__convert(rw, loc, jit__load(rw, loc, b, kk, j), acc);
  MlirValue vc = jit__load(rw, loc, c, i, j);
  MlirValue ab[2] = {va, vb};
  MlirValue p = mlirOperationGetResult(
      jit__build(rw, loc, "arith.mulf", 2, ab, 1, &acc, 0, NULL, 0, NULL), 0);
  MlirValue cp[2] = {vc, p};
  MlirValue s = mlirOperationGetResult(
      jit__build(rw, loc, "arith.addf", 2, cp, 1, &acc, 0, NULL, 0, NULL), 0);
  MlirValue st[4] = {s, c, i, j};
  jit__build(rw, loc, "memref.store", 4, st, 0, NULL, 0, NULL, 0, NULL);
  mlirRewriterBaseEraseOp(rw, mm);
}

//===--- The pass --------------------------------------------------------===//

typedef struct jit__mm_list {
  MlirOperation *ops;
  size_t n, cap;
  bool oom;
} jit__mm_list;

static MlirWalkResult jit__collect(MlirOperation op, void *user) {
  jit__mm_list *l = user;
  if (!jit__op_is(op, "linalg.matmul") || !jit__handles(op)) return MlirWalkResultAdvance;
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 8;
    MlirOperation *p = realloc(l->ops, cap * sizeof(*p));
    if (!p) {
      l->oom = true;
      return MlirWalkResultInterrupt;
    }
    l->ops = p;
    l->cap = cap;
  }
  l->ops[l->n++] = op;
  return MlirWalkResultAdvance;
}

static void jit__pass_run(MlirOperation op, MlirExternalPass pass, void *user) {
  (void)user;
  // Collect first: rewriting while walking would invalidate the walk.
  jit__mm_list l = {0};
  mlirOperationWalk(op, jit__collect, &l, MlirWalkPreOrder);
  if (l.oom) {
    free(l.ops);
    mlirExternalPassSignalFailure(pass);
    return;
  }
  if (l.n) {
    MlirRewriterBase rw = mlirIRRewriterCreateFromOp(op);
    for (size_t i = 0; i < l.n; i++) jit__lower_one(rw, l.ops[i]);
    mlirIRRewriterDestroy(rw);
  }
  free(l.ops);
}

static void jit__pass_construct(void *user) { (void)user; }
static void jit__pass_destruct(void *user) { (void)user; }
static void *jit__pass_clone(void *user) { return user; }

// The pass's TypeID: the address of an 8-byte-aligned object unique to this pass.
static _Alignas(8) const char jit__pass_id_anchor[8];

MlirPass jit__create_matmul_to_loops_pass(void) {
  MlirExternalPassCallbacks cb = {jit__pass_construct, jit__pass_destruct, NULL,
                                  jit__pass_clone, jit__pass_run};
  return mlirCreateExternalPass(
      mlirTypeIDCreate(jit__pass_id_anchor),
      mlirStringRefCreateFromCString("JitmlLowerMatmulToLoops"),
      mlirStringRefCreateFromCString("jitml-lower-matmul-to-loops"),
      mlirStringRefCreateFromCString(
          "Lower linalg.matmul on memrefs to scf.for loops of loads, mulf, addf, stores"),
      mlirStringRefCreateFromCString("func.func"), 0, NULL, cb, NULL);
}
