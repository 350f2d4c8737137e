//===--- gpu_ir.h - small MLIR C API helpers of the GPU lowering ------------===//
//
// Shared by compile_gpu.c and gpu_generic.c. Header-only (static inline).
//
//===----------------------------------------------------------------------===//
#ifndef JITML_LOWERING_GPU_IR_H_
#define JITML_LOWERING_GPU_IR_H_

#include <stdbool.h>
#include <string.h>

#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <mlir-c/IR.h>

static inline MlirStringRef jit__sr(const char *s) { return mlirStringRefCreateFromCString(s); }

static inline bool jit__op_is(MlirOperation op, const char *name) {
  MlirStringRef s = mlirIdentifierStr(mlirOperationGetName(op));
  size_t n = strlen(name);
  return s.length == n && !memcmp(s.data, name, n);
}

static inline MlirBlock jit__entry_block(MlirOperation func) {
  return mlirRegionGetFirstBlock(mlirOperationGetRegion(func, 0));
}

// An `arith.constant N : index` inserted before `before` in `block`.
static inline MlirValue jit__index_const(MlirContext ctx, MlirBlock block,
                                         MlirOperation before, int64_t v) {
  MlirLocation loc = mlirLocationUnknownGet(ctx);
  MlirOperationState st = mlirOperationStateGet(jit__sr("arith.constant"), loc);
  MlirType idx = mlirIndexTypeGet(ctx);
  MlirNamedAttribute a = mlirNamedAttributeGet(
      mlirIdentifierGet(ctx, jit__sr("value")), mlirIntegerAttrGet(idx, v));
  mlirOperationStateAddAttributes(&st, 1, &a);
  mlirOperationStateAddResults(&st, 1, &idx);
  MlirOperation op = mlirOperationCreate(&st);
  mlirBlockInsertOwnedOperationBefore(block, before, op);
  return mlirOperationGetResult(op, 0);
}

#endif  // JITML_LOWERING_GPU_IR_H_
