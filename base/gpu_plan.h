//===--- gpu_plan.h - a GPU launch plan, as data --------------------------===//
//
// The launch plan of a GPU kernel: which buffers a run binds (inputs, outputs,
// temporaries), which kernels of the module to launch in which order, with which
// grids, blocks and arguments, and for a generic kernel the programs that compute its
// grids and sizes per binding. Plain data shared by the three modules that meet in it:
// lowering/ makes it (lowering/gpu.h), the artifact record stores it
// (cache/artifact.h) and jit/ launches it through a backend (devices/device.h).
//
// Buffer table convention: buffers [0, n_inputs) are the graph's inputs in argument
// order, [n_inputs, n_inputs + n_outputs) its outputs in result order, and the rest are
// intermediates the runtime allocates (uninitialized; a kernel fully writes each before
// reading it). Every buffer is dense row-major of its byte size.
//
//===----------------------------------------------------------------------===//
#ifndef JITML_BASE_GPU_PLAN_H_
#define JITML_BASE_GPU_PLAN_H_

#include <stdint.h>

typedef enum jit__gpu_buffer_kind {
  JIT__GPU_BUF_INPUT = 0,
  JIT__GPU_BUF_OUTPUT = 1,
  JIT__GPU_BUF_TEMP = 2,  // intermediate: allocated by the runtime, no host data
  // Generic kernels: the binding's sizes as i32 values (plan.sizes, evaluated by
  // jit__gpu_plan_bind), written by the runtime before the first launch.
  JIT__GPU_BUF_SIZES = 3,
} jit__gpu_buffer_kind;

// A size of a generic kernel's plan, computed per binding: a postfix program over
// int64 values in jit__gpu_plan.code (lowering/gpu_generic.c). CONST pushes v; DIM
// pushes dim v of buffer `aux` (an input or output); the binary ops pop two; CMP pops
// two and compares with arith.cmpi predicate `aux`; SELECT pops a condition and two
// values.
typedef enum jit__gx_op {
  JIT__GX_CONST = 1,
  JIT__GX_DIM,
  JIT__GX_ADD,
  JIT__GX_SUB,
  JIT__GX_MUL,
  JIT__GX_DIVS,
  JIT__GX_DIVU,
  JIT__GX_CEILDIVS,
  JIT__GX_FLOORDIVS,
  JIT__GX_REMS,
  JIT__GX_REMU,
  JIT__GX_MINS,
  JIT__GX_MAXS,
  JIT__GX_CMP,
  JIT__GX_SELECT,
  JIT__GX_LAST = JIT__GX_SELECT,
} jit__gx_op;

typedef struct jit__gx {
  uint32_t op;   // jit__gx_op
  uint32_t aux;  // DIM: the buffer; CMP: the predicate
  int64_t v;     // CONST: the value; DIM: the dim
} jit__gx;

// A program: code[at, at + len). len 0: none (the static field holds the value).
typedef struct jit__gpu_expr {
  uint32_t at, len;
} jit__gpu_expr;

typedef struct jit__gpu_buffer {
  jit__gpu_buffer_kind kind;
  uint32_t index;   // input or output index; for temps, the temp's ordinal
  uint64_t bytes;   // size in bytes (0 for an empty tensor)
  jit__gpu_expr bytes_expr;  // generic kernels: the size per binding
} jit__gpu_buffer;

// Kernel entry names are `<func>_k<i>_kernel` for plain kernels, `<func>_k<i>_mm_kernel`
// for tiled matmuls (2-D tiles of A and B staged in workgroup memory) and
// `<func>_k<i>_row_kernel` for row reductions (one workgroup per row, tree reduction
// in workgroup memory).
typedef struct jit__gpu_kernel {
  char entry[64];     // kernel symbol in the module (PTX .entry / SPIR-V entry point)
  uint32_t grid[3];   // workgroups in x, y, z
  uint32_t block[3];  // threads per workgroup in x, y, z
  uint32_t n_args;
  uint32_t *args;     // buffer indices, malloc'ed
  jit__gpu_expr grid_expr[3];  // generic kernels: the grid per binding
} jit__gpu_kernel;

// The launch plan. Thread-compatible: immutable once made.
typedef struct jit__gpu_plan {
  uint32_t n_buffers;
  jit__gpu_buffer *buffers;  // malloc'ed
  uint32_t n_kernels;
  jit__gpu_kernel *kernels;  // malloc'ed, launch order
  // Generic kernels (jit__compile_gpu_generic): the programs of the sizes above, and
  // the values of the SIZES buffer. Empty (0, NULL) in a plan for one binding.
  uint32_t n_code;
  jit__gx *code;
  uint32_t n_sizes;       // in a bound plan too (jit__gpu_plan_bind): the values' count
  jit__gpu_expr *sizes;   // NULL in a bound plan
} jit__gpu_plan;

// Frees what the plan owns (not the struct) and zeroes it. NULL is a no-op.
void jit__gpu_plan_release(jit__gpu_plan *plan);

#endif  // JITML_BASE_GPU_PLAN_H_
