//===--- iter_slices.c - whole-tile slices of loop-carried `?` tensors ------===//
//
// Tiling a generic kernel's register tile by k (tile_using_for [0, 0, 1]) carries the
// tile of C through the k loop and, in each step, takes all of it out and puts it back:
//
//   %t = scf.for .. iter_args(%c = %init) -> (tensor<8x?xf32>) {   // %init: a slice [8, %n]
//     %s = tensor.extract_slice %c[0, 0] [8, %n] [1, 1]
//     .. vector.transfer_write %v, %s ..
//     %r = tensor.insert_slice %w into %c[0, 0] [8, %n] [1, 1]
//     scf.yield %r
//   }
//
// With static sizes both fold away; with a `?` size they stay (the folders compare
// constants only), the masked reads and writes of the accumulators then work on
// different tensors, and hoist_loop_invariant_subsets leaves them inside the loop:
// the sums went through memory at every k step (17x1000x31 with every dim `?`: 50-80
// us against 7-12 for the exact kernel). Here the two are folded where they are whole:
// %c's sizes are %init's (the loop yields an insert_slice into %c, which keeps them),
// and the slice's sizes are %init's sizes, the same SSA values or constants.
//
//===----------------------------------------------------------------------===//
#include <stdbool.h>
#include <stdint.h>

#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>

#include "lowering/cpu/internal.h"

// The static_offsets/static_sizes/static_strides array `name` of `op`.
static MlirAttribute static_array(MlirOperation op, const char *name) {
  return mlirOperationGetAttributeByName(op, mlirStringRefCreateFromCString(name));
}

static int count_dynamic(MlirAttribute a) {
  int n = 0;
  for (intptr_t i = 0; i < mlirDenseArrayGetNumElements(a); i++)
    n += mlirDenseI64ArrayGetElement(a, i) == mlirShapedTypeGetDynamicSize();
  return n;
}

// Whether slice op `s` (extract_slice or insert_slice, its first `lead` operands
// being source and dest) takes all of a tensor whose sizes are those of extract_slice
// `init`: offsets 0, strides 1, sizes equal entry by entry (constants, or the same
// SSA values).
static bool whole_of(MlirOperation s, int lead, MlirOperation init) {
  MlirAttribute off = static_array(s, "static_offsets"), sz = static_array(s, "static_sizes");
  MlirAttribute st = static_array(s, "static_strides");
  MlirAttribute isz = static_array(init, "static_sizes");
  if (mlirAttributeIsNull(off) || mlirAttributeIsNull(sz) || mlirAttributeIsNull(st) ||
      mlirAttributeIsNull(isz))
    return false;
  intptr_t n = mlirDenseArrayGetNumElements(sz);
  if (n != mlirDenseArrayGetNumElements(isz)) return false;
  for (intptr_t i = 0; i < n; i++)
    if (mlirDenseI64ArrayGetElement(off, i) != 0 || mlirDenseI64ArrayGetElement(st, i) != 1)
      return false;
  // Dynamic sizes follow the source (and dest) and the dynamic offsets.
  int dyn = 0, idyn = 0;
  int ibase = 1 + count_dynamic(static_array(init, "static_offsets"));
  for (intptr_t i = 0; i < n; i++) {
    int64_t a = mlirDenseI64ArrayGetElement(sz, i), b = mlirDenseI64ArrayGetElement(isz, i);
    if (a != b) return false;
    if (a != mlirShapedTypeGetDynamicSize()) continue;
    if (lead + dyn >= mlirOperationGetNumOperands(s) ||
        ibase + idyn >= mlirOperationGetNumOperands(init) ||
        !mlirValueEqual(mlirOperationGetOperand(s, lead + dyn),
                        mlirOperationGetOperand(init, ibase + idyn)))
      return false;
    dyn++, idyn++;
  }
  return true;
}

typedef struct fold_walk {
  int folded;
} fold_walk;

// Folds the whole slices of iter_arg `p` of loop `loop`.
static void fold_arg(fold_walk *fw, MlirOperation loop, intptr_t p) {
  MlirBlock body = mlirRegionGetFirstBlock(mlirOperationGetRegion(loop, 0));
  MlirValue arg = mlirBlockGetArgument(body, 1 + p);
  MlirValue init_v = mlirOperationGetOperand(loop, 3 + p);
  if (!mlirValueIsAOpResult(init_v)) return;
  MlirOperation init = mlirOpResultGetOwner(init_v);
  if (!jit__cpu_op_is(init, "tensor.extract_slice")) return;
  MlirType ty = mlirValueGetType(arg);
  if (!mlirTypeIsARankedTensor(ty) || mlirShapedTypeHasStaticShape(ty)) return;
  // The loop keeps the sizes: it yields a whole insert_slice into the arg.
  MlirOperation yield = mlirBlockGetTerminator(body);
  MlirValue y = mlirOperationGetOperand(yield, p);
  if (!mlirValueIsAOpResult(y)) return;
  MlirOperation ins = mlirOpResultGetOwner(y);
  if (!jit__cpu_op_is(ins, "tensor.insert_slice") ||
      !mlirValueEqual(mlirOperationGetOperand(ins, 1), arg) || !whole_of(ins, 2, init) ||
      !mlirTypeEqual(mlirValueGetType(mlirOperationGetOperand(ins, 0)), ty))
    return;
  // Whole extract_slices of the arg read the arg itself.
  for (MlirOpOperand u = mlirValueGetFirstUse(arg); !mlirOpOperandIsNull(u);) {
    MlirOperation o = mlirOpOperandGetOwner(u);
    u = mlirOpOperandGetNextUse(u);
    if (!jit__cpu_op_is(o, "tensor.extract_slice") || !whole_of(o, 1, init) ||
        !mlirTypeEqual(mlirValueGetType(mlirOperationGetResult(o, 0)), ty))
      continue;
    // The next use may be this op's own: skip past it before it goes.
    while (!mlirOpOperandIsNull(u) && mlirOperationEqual(mlirOpOperandGetOwner(u), o))
      u = mlirOpOperandGetNextUse(u);
    mlirValueReplaceAllUsesOfWith(mlirOperationGetResult(o, 0), arg);
    mlirOperationDestroy(o);
    fw->folded++;
  }
  mlirValueReplaceAllUsesOfWith(y, mlirOperationGetOperand(ins, 0));
  mlirOperationDestroy(ins);
  fw->folded++;
}

static MlirWalkResult visit(MlirOperation op, void *user) {
  if (!jit__cpu_op_is(op, "scf.for")) return MlirWalkResultAdvance;
  for (intptr_t p = 0; p < mlirOperationGetNumResults(op); p++) fold_arg(user, op, p);
  return MlirWalkResultAdvance;
}

int jit__cpu_fold_iter_slices(MlirOperation module) {
  fold_walk fw = {0};
  mlirOperationWalk(module, visit, &fw, MlirWalkPostOrder);
  return fw.folded;
}

const char *jit__cpu_generic_hoist_script(void) {
  return "module attributes {transform.with_named_sequence} {\n"
         "transform.named_sequence @__transform_main(%root: " ANY
         " {transform.readonly}) {\n"
         "  %f = transform.structured.match ops{[\"func.func\"]} in %root : (" ANY ") -> " ANY
         "\n"
         "  transform.apply_cse to %f : " ANY "\n"
         "  %fors = transform.structured.match ops{[\"scf.for\"]} in %f : (" ANY ") -> " ANY
         "\n"
         "  transform.apply_licm to %fors : " ANY "\n"
         "  transform.loop.hoist_loop_invariant_subsets %fors : " ANY "\n"
         "  transform.yield\n}\n}\n";
}
