//===--- ops.c - what the CPU strategy reads from linalg ops -------------===//
#include "lowering/cpu/internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <mlir-c/AffineExpr.h>
#include <mlir-c/AffineMap.h>

#include "base/status.h"
#include "base/text.h"

//===--- Op inspection ---------------------------------------------------===//

bool jit__cpu_op_is(MlirOperation op, const char *name) {
  MlirStringRef s = mlirIdentifierStr(mlirOperationGetName(op));
  return s.length == strlen(name) && memcmp(s.data, name, s.length) == 0;
}

void jit__cpu_set_tag(MlirContext ctx, MlirOperation op, const char *tag, int i) {
  mlirOperationSetDiscardableAttributeByName(
      op, mlirStringRefCreateFromCString(tag),
      mlirIntegerAttrGet(mlirIntegerTypeGet(ctx, 64), i));
}

bool jit__cpu_in_forall(MlirOperation op) {
  for (MlirOperation p = mlirOperationGetParentOperation(op); !mlirOperationIsNull(p);
       p = mlirOperationGetParentOperation(p))
    if (jit__cpu_op_is(p, "scf.forall")) return true;
  return false;
}

void jit__cpu_plan_threads_of(walk *w, MlirOperation op, void (*plan)(walk *, MlirOperation)) {
  if (w->threads <= 1 || !jit__cpu_in_forall(op)) {
    plan(w, op);
    return;
  }
  int threads = w->threads;
  w->parallel = true;
  w->threads = 1;
  plan(w, op);
  w->threads = threads;
}

int64_t jit__cpu_shaped_bytes(MlirType t) {
  MlirType e = mlirShapedTypeGetElementType(t);
  int64_t bits = mlirTypeIsAFloat(e) ? (int64_t)mlirFloatTypeGetWidth(e)
                 : mlirTypeIsAInteger(e) ? (int64_t)mlirIntegerTypeGetWidth(e) : 0;
  if (bits <= 0) return -1;
  int64_t n = 1;
  for (intptr_t d = 0; d < mlirShapedTypeGetRank(t); d++) n *= mlirShapedTypeGetDimSize(t, d);
  return n * ((bits + 7) / 8);
}

bool jit__cpu_static_shaped(MlirType t) {
  return mlirTypeIsARankedTensor(t) && mlirShapedTypeHasStaticShape(t);
}

// The generic's indexing map of operand `i` is the identity.
bool jit__cpu_map_is_identity(MlirOperation op, intptr_t i) {
  MlirAttribute maps =
      mlirOperationGetAttributeByName(op, mlirStringRefCreateFromCString("indexing_maps"));
  if (mlirAttributeIsNull(maps) || i >= mlirArrayAttrGetNumElements(maps)) return false;
  MlirAffineMap m = mlirAffineMapAttrGetValue(mlirArrayAttrGetElement(maps, i));
  return mlirAffineMapIsIdentity(m);
}

typedef struct collect {
  char buf[64];
  size_t len;
} collect;

static void collect_cb(MlirStringRef s, void *user) {
  collect *c = user;
  size_t n = s.length < sizeof c->buf - 1 - c->len ? s.length : sizeof c->buf - 1 - c->len;
  memcpy(c->buf + c->len, s.data, n);
  c->len += n;
  c->buf[c->len] = 0;
}

// Iterator kinds of a linalg.generic as 'p'/'r' (read by printing each
// #linalg.iterator_type attribute); returns the loop count or -1.
int jit__cpu_read_iterators(MlirOperation op, char *out, int cap) {
  MlirAttribute it =
      mlirOperationGetAttributeByName(op, mlirStringRefCreateFromCString("iterator_types"));
  if (mlirAttributeIsNull(it) || !mlirAttributeIsAArray(it)) return -1;
  intptr_t n = mlirArrayAttrGetNumElements(it);
  if (n > cap) return -1;
  for (intptr_t i = 0; i < n; i++) {
    collect c = {{0}, 0};
    mlirAttributePrint(mlirArrayAttrGetElement(it, i), collect_cb, &c);
    out[i] = strstr(c.buf, "reduction") ? 'r' : 'p';
  }
  return (int)n;
}


// The op's indexing maps are `want` (`n_maps` maps of `n_res` plain loop dims each,
// over `n_dims` loops); an op without the attribute has its default maps, `absent_is`.
bool jit__cpu_maps_are(MlirOperation op, int n_maps, int n_dims, int n_res, const int *want,
                     bool absent_is) {
  MlirAttribute maps =
      mlirOperationGetAttributeByName(op, mlirStringRefCreateFromCString("indexing_maps"));
  if (mlirAttributeIsNull(maps)) return absent_is;
  if (!mlirAttributeIsAArray(maps) || mlirArrayAttrGetNumElements(maps) != n_maps)
    return false;
  for (int i = 0; i < n_maps; i++) {
    MlirAttribute a = mlirArrayAttrGetElement(maps, i);
    if (!mlirAttributeIsAAffineMap(a)) return false;
    MlirAffineMap m = mlirAffineMapAttrGetValue(a);
    if (mlirAffineMapGetNumDims(m) != n_dims || mlirAffineMapGetNumResults(m) != n_res)
      return false;
    for (int r = 0; r < n_res; r++) {
      MlirAffineExpr e = mlirAffineMapGetResult(m, r);
      if (!mlirAffineExprIsADim(e) || mlirAffineDimExprGetPosition(e) != want[i * n_res + r])
        return false;
    }
  }
  return true;
}

// linalg.batch_matmul's indexing maps are the default ones (no transposed or
// broadcast operand): A(b, m, k), B(b, k, n), C(b, m, n) over loops (b, m, n, k).
bool jit__cpu_batch_maps_plain(MlirOperation bm) {
  static const int want[9] = {0, 1, 3, 0, 3, 2, 0, 1, 2};
  return jit__cpu_maps_are(bm, 3, 4, 3, want, true);
}


// `v` is made by a plain transpose of the last two dims of a 2-D (or, batched, 3-D)
// tensor (a generic yielding its one input, read through (d1, d0) or (d0, d2, d1)) of
// f32 (or of f16 too, with `f16`), and read by nothing else than `user`.
bool jit__cpu_made_by_transpose(MlirValue v, MlirOperation user, bool f16) {
  static const int want[4] = {1, 0, 0, 1}, want3[6] = {0, 2, 1, 0, 1, 2};
  if (!mlirValueIsAOpResult(v)) return false;
  MlirOperation g = mlirOpResultGetOwner(v);
  if (!jit__cpu_op_is(g, "linalg.generic") || mlirOperationGetNumOperands(g) != 2 ||
      mlirOperationGetNumResults(g) != 1 ||
      !(jit__cpu_maps_are(g, 2, 2, 2, want, false) || jit__cpu_maps_are(g, 2, 3, 3, want3, false)))
    return false;
  MlirOpOperand use = mlirValueGetFirstUse(v);
  if (mlirOpOperandIsNull(use) || !mlirOperationEqual(mlirOpOperandGetOwner(use), user) ||
      !mlirOpOperandIsNull(mlirOpOperandGetNextUse(use)))
    return false;
  MlirType t = mlirValueGetType(v);
  MlirType et = jit__cpu_static_shaped(t) ? mlirShapedTypeGetElementType(t) : t;
  if (!jit__cpu_static_shaped(t) || !(mlirTypeIsAF32(et) || (f16 && mlirTypeIsAF16(et)))) return false;
  MlirBlock body = mlirRegionGetFirstBlock(mlirOperationGetRegion(g, 0));
  MlirOperation y = mlirBlockGetFirstOperation(body);
  return !mlirOperationIsNull(y) && jit__cpu_op_is(y, "linalg.yield") &&
         mlirOperationGetNumOperands(y) == 1 &&
         mlirValueEqual(mlirOperationGetOperand(y, 0), mlirBlockGetArgument(body, 0));
}

// linalg.matmul reads B through the map (m, n, k) -> (n, k): x W^T with W stored N x K
// (emit_mlir.c writes that for matmul(x, transpose(W))).
bool jit__cpu_b_transposed(MlirOperation mm) {
  static const int want[6] = {0, 2, 1, 2, 0, 1};
  return jit__cpu_maps_are(mm, 3, 3, 2, want, false);
}


// linalg.batch_matmul reading B through (b, m, n, k) -> (b, n, k): q K^T with K stored
// (B, S, D), as attention's key cache is (emit_mlir.c).
bool jit__cpu_batch_b_transposed(MlirOperation bm) {
  static const int want[9] = {0, 1, 3, 0, 2, 3, 0, 1, 2};
  return jit__cpu_maps_are(bm, 3, 4, 3, want, false);
}

// The single elementwise consumer of a matmul that can be computed on its tiles.
MlirOperation jit__cpu_epilogue_of(MlirOperation mm) {
  MlirOperation none = {NULL};
  MlirValue r = mlirOperationGetResult(mm, 0);
  MlirOpOperand use = mlirValueGetFirstUse(r);
  if (mlirOpOperandIsNull(use)) return none;
  if (!mlirOpOperandIsNull(mlirOpOperandGetNextUse(use))) return none;
  MlirOperation g = mlirOpOperandGetOwner(use);
  if (!jit__cpu_op_is(g, "linalg.generic") || mlirOperationGetNumResults(g) != 1) return none;
  char it[8];
  if (jit__cpu_read_iterators(g, it, 8) != 2 || it[0] != 'p' || it[1] != 'p') return none;
  unsigned idx = mlirOpOperandGetOperandNumber(use);
  intptr_t n_ops = mlirOperationGetNumOperands(g);
  // Reads the matmul through the identity, writes through the identity.
  if (!jit__cpu_map_is_identity(g, idx) || !jit__cpu_map_is_identity(g, n_ops - 1)) return none;
  if (!jit__cpu_static_shaped(mlirValueGetType(mlirOperationGetResult(g, 0)))) return none;
  return g;
}

MlirOperation jit__cpu_producer(MlirValue v) {
  if (!mlirValueIsAOpResult(v)) return (MlirOperation){NULL};
  return mlirOpResultGetOwner(v);
}

bool jit__cpu_const_index(MlirValue v, int64_t *out) {
  if (!mlirValueIsAOpResult(v)) return false;
  MlirOperation d = mlirOpResultGetOwner(v);
  if (!jit__cpu_op_is(d, "arith.constant")) return false;
  MlirAttribute a =
      mlirOperationGetAttributeByName(d, mlirStringRefCreateFromCString("value"));
  if (mlirAttributeIsNull(a) || !mlirAttributeIsAInteger(a)) return false;
  *out = mlirIntegerAttrGetValueInt(a);
  return true;
}

MlirOperation jit__cpu_reinterpret_cast(MlirContext ctx, MlirOperation before, MlirValue src,
                                        MlirValue offset, int rank, const int64_t *sizes,
                                        const int64_t *strides) {
  int64_t dyn = mlirShapedTypeGetDynamicStrideOrOffset(), off = mlirValueIsNull(offset) ? 0 : dyn;
  MlirAttribute layout = mlirStridedLayoutAttrGet(ctx, off, rank, strides);
  MlirType t = mlirMemRefTypeGet(mlirShapedTypeGetElementType(mlirValueGetType(src)), rank,
                                 sizes, layout, mlirAttributeGetNull());
  // An identity layout where the view is the source's own row-major shape.
  int64_t step = 1;
  bool plain = mlirValueIsNull(offset);
  for (int d = rank - 1; d >= 0 && plain; d--) {
    plain = strides[d] == step;
    step *= sizes[d];
  }
  if (plain)
    t = mlirMemRefTypeContiguousGet(mlirShapedTypeGetElementType(t), rank, sizes,
                                    mlirAttributeGetNull());
  MlirOperationState st = mlirOperationStateGet(
      mlirStringRefCreateFromCString("memref.reinterpret_cast"), mlirOperationGetLocation(before));
  MlirValue ops[2] = {src, offset};
  mlirOperationStateAddOperands(&st, plain ? 1 : 2, ops);
  mlirOperationStateAddResults(&st, 1, &t);
  int32_t seg[4] = {1, plain ? 0 : 1, 0, 0};
  MlirNamedAttribute attrs[4] = {
      jit__cpu_named(ctx, "operandSegmentSizes", mlirDenseI32ArrayGet(ctx, 4, seg)),
      jit__cpu_named(ctx, "static_offsets", mlirDenseI64ArrayGet(ctx, 1, &off)),
      jit__cpu_named(ctx, "static_sizes", mlirDenseI64ArrayGet(ctx, rank, sizes)),
      jit__cpu_named(ctx, "static_strides", mlirDenseI64ArrayGet(ctx, rank, strides)),
  };
  mlirOperationStateAddAttributes(&st, 4, attrs);
  MlirOperation view = mlirOperationCreate(&st);
  mlirBlockInsertOwnedOperationBefore(mlirOperationGetBlock(before), before, view);
  return view;
}

MlirNamedAttribute jit__cpu_named(MlirContext ctx, const char *name, MlirAttribute a) {
  return mlirNamedAttributeGet(mlirIdentifierGet(ctx, mlirStringRefCreateFromCString(name)), a);
}
