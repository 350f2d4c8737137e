//===--- gpu_tiled.h - GPU kernels that use workgroup memory (internal) -----===//
//
// Used by compile_gpu.c only. After compile_gpu.c has split the bufferized function
// into one function per kernel (one top-level scf.parallel each), jit__gpu_try_tiled
// recognises two loop-nest shapes and replaces the loop with a hand-written
// gpu.launch that uses workgroup memory:
//   - contractions (matmul, batched matmul, with f16 operands extended to f32): 2-D
//     output tiles, A and B tiles staged in workgroup memory, several outputs per
//     thread ("_mm" kernels);
//   - reductions along the innermost, contiguous dim (row sums/max, the reductions of
//     softmax, with elementwise producers fused in): one workgroup per row, each
//     thread reduces a strided part of the row, then a tree reduction in workgroup
//     memory ("_row" kernels).
// Everything else keeps the plain mapping. The same gpu.launch serves PTX and SPIR-V;
// jit__gpu_attributions_to_allocs adapts its workgroup buffers for the SPIR-V half.
//
//===----------------------------------------------------------------------===//
#ifndef JITML_LOWERING_GPU_TILED_H_
#define JITML_LOWERING_GPU_TILED_H_

#include <stdbool.h>

#include <mlir-c/IR.h>

#include "base/status.h"

typedef enum jit__tiled_kind {
  JIT__TILED_NONE = 0,  // not recognised: use the plain mapping
  JIT__TILED_MM = 1,
  JIT__TILED_ROW = 2,
} jit__tiled_kind;

// Tries to replace the one top-level scf.parallel of kernel function `kf` (a func.func
// whose entry block holds constants, views of its arguments, the loop and the return)
// with a tiled gpu.launch. On success sets *out_kind and appends "_mm" / "_row" to the
// function's name; when the loop is not one of the shapes above, leaves `kf` untouched
// with *out_kind = JIT__TILED_NONE. `diag` is the text the context's diagnostic
// handler collected (for messages). Returns JIT_INTERNAL only if the generated kernel
// does not parse (a bug).
jit_status jit__gpu_try_tiled(MlirContext ctx, MlirOperation kf, const char *diag,
                              jit__tiled_kind *out_kind);

// For loops jit__gpu_try_tiled leaves to the plain mapping: if `kf` holds the nest
// shape of gpu_tiled.c (a reduction loop that loads, combines and stores one
// accumulator element per iteration), keeps the accumulator in a register instead:
// one load before the loop, one store after it (the same operations in the same
// order, so the same results). Returns whether it did.
bool jit__gpu_acc_in_register(MlirContext ctx, MlirOperation kf);

// For SPIR-V: MLIR's SPIR-V conversion takes workgroup memory as memref.alloc in
// memory space 3, not as gpu.func workgroup attributions (which the NVVM conversion
// takes); turns every attribution of every gpu.func in `gpu_module` into such an alloc.
void jit__gpu_attributions_to_allocs(MlirContext ctx, MlirOperation gpu_module);

#endif  // JITML_LOWERING_GPU_TILED_H_
