//===--- gpu_generic.h - sizes of generic GPU kernels (internal) ------------===//
//
// What compile_gpu.c uses to turn the host-side size computations of a generic kernel
// into programs of its plan (gpu_generic.c has the whole story).
//
//===----------------------------------------------------------------------===//
#ifndef JITML_LOWERING_GPU_GENERIC_H_
#define JITML_LOWERING_GPU_GENERIC_H_

#include <mlir-c/IR.h>

#include "lowering/gpu.h"

// Entries of the SIZES buffer a generic kernel can read.
#define JIT__GX_MAX_SIZES 64

// The programs and SIZES entries made so far (moved into the plan at the end).
typedef struct jit__gx_builder {
  jit__gx *code;
  uint32_t n, cap;
  jit__gpu_expr *sizes;
  uint32_t n_sizes, cap_sizes;
  MlirBlock entry;  // the function whose arguments DIM refers to
  uint32_t n_io;    // its first n_io arguments are the inputs and outputs
} jit__gx_builder;

// The program of host value `v` (memref.dim of the inputs and outputs, constants,
// arith ops); JIT_UNSUPPORTED naming what it cannot follow.
jit_status jit__gx_value(jit__gx_builder *b, MlirValue v, jit__gpu_expr *out);
// The bytes of a buffer of type `t`: its `?` dims are the values `dyn` (a memref.alloc's
// operands), or, with `dyn` NULL, the dims of argument `arg`.
jit_status jit__gx_bytes(jit__gx_builder *b, MlirType t, const MlirValue *dyn, uint32_t arg,
                         jit__gpu_expr *out);
// In kernel function `kf` (its one gpu.launch not yet outlined): adds the SIZES
// buffer as its last argument; in the launch's body, clones the constants it uses from
// outside, and reads every other outside size from the SIZES buffer; with `ptx`, casts
// buffers with a `?` dim to a static type before the launch.
jit_status jit__gx_sink(MlirContext ctx, MlirOperation kf, jit__gx_builder *b, bool ptx);
// JIT_UNSUPPORTED when buffer type `t` has a `?` dim past its first.
jit_status jit__gx_check_buffer(MlirType t);
void jit__gx_builder_release(jit__gx_builder *b);

#endif  // JITML_LOWERING_GPU_GENERIC_H_
