//===--- gpu.h - GPU lowering: specialized graph -> PTX / SPIR-V + launch plan ===//
//
// The half of the GPU backends that lives in lowering/: it turns one specialized graph
// into a device module (PTX text for CUDA, SPIR-V words for Vulkan) and the launch plan
// a runtime needs to run it: which buffers to allocate, which kernels to launch in
// which order, with which grid/block sizes and arguments. It loads nothing and talks
// to no device; devices/cuda and devices/vulkan consume the artifact, and cache/
// stores the module bytes plus jit__gpu_plan_serialize's bytes as entry metadata.
//
// Buffer table convention: buffers [0, n_inputs) are the graph's inputs in argument
// order, [n_inputs, n_inputs + n_outputs) its outputs in result order, and the rest are
// intermediates the runtime allocates (uninitialized; a kernel fully writes each before
// reading it). Every buffer is dense row-major of its byte size.
//
// Kernel ABI: each kernel takes one pointer-sized argument per entry of `args`, in
// order: for PTX one `.param .u64` device pointer each (bare-pointer convention); for
// SPIR-V, storage buffer bindings: descriptor set 0, binding i = args[i], no push
// constants. Launch exactly `block` threads per workgroup (PTX declares .maxntid, SPIR-V
// LocalSize) and `grid` workgroups. Kernels must run in order (each may read what the
// previous ones wrote): a barrier between consecutive launches is required.
//
//===----------------------------------------------------------------------===//
#ifndef JITML_LOWERING_GPU_H_
#define JITML_LOWERING_GPU_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lowering/lower.h"

typedef enum jit__gpu_format {
  JIT__GPU_PTX = 1,    // NVIDIA PTX text (not NUL-terminated in `binary`)
  JIT__GPU_SPIRV = 2,  // SPIR-V module, little-endian 32-bit words, for Vulkan
} jit__gpu_format;

// What to compile for. Zero-initialize, then set `format` and the fields it uses.
typedef struct jit__gpu_target {
  jit__gpu_format format;
  // PTX: the chip ("sm_90"); unknown chips are refused with JIT_UNSUPPORTED.
  const char *chip;
  // PTX: the PTX ISA version times ten (80 = PTX 8.0); 0 picks the minimum the chip
  // needs. A version below that minimum, or one LLVM does not know, is JIT_UNSUPPORTED
  // (LLVM would otherwise end the process).
  int ptx_version;
  // PTX: CUDA toolkit directory whose nvvm/libdevice/libdevice.10.bc provides math
  // functions (exp, tanh, ...); NULL searches $CUDA_HOME, $CUDA_PATH, /usr/local/cuda.
  // Graphs without transcendental math need none.
  const char *cuda_toolkit;
  // SPIR-V: minor version of SPIR-V 1.x (3 = 1.3, the Vulkan 1.1 ceiling); 0 means 3.
  int spirv_minor;
  // SPIR-V: allow f16 storage and arithmetic (adds Float16 and StorageBuffer16BitAccess
  // capabilities and SPV_KHR_16bit_storage). Without it an f16 graph is JIT_UNSUPPORTED.
  bool spirv_f16;
  // Both: use only the plain kernels (one thread per output element, serial loops
  // that read and write the accumulator in memory each step), never the tiled
  // workgroup-memory kernels for matmuls and row reductions nor register
  // accumulators. For before/after comparisons and as a way around a device that
  // mishandles workgroup memory.
  bool plain_kernels;
  // Both: keep the text of the device module (gpu.module with its gpu.funcs, before
  // the NVVM/SPIR-V conversion) in jit__gpu_artifact.ir, for tests and dumps.
  bool keep_ir;
} jit__gpu_target;

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

typedef struct jit__gpu_artifact {
  jit__gpu_format format;
  uint8_t *binary;  // module bytes, malloc'ed
  size_t binary_size;
  jit__gpu_plan plan;
  double ms_front;  // parse, bufferization, mapping, outlining
  double ms_back;   // conversion to NVVM/SPIR-V and serialization
  char *ir;         // with jit__gpu_target.keep_ir: the device module as MLIR text
                    // (malloc'ed, NUL-terminated); else NULL
  uint32_t n_tiled; // kernels that use workgroup memory (tiled matmul / row kernels)
} jit__gpu_artifact;

// Compiles `graph` for `target` into `out` (kernel names start with `func_name`).
// Creates and destroys its own MLIR context; thread-safe. Returns JIT_UNSUPPORTED for
// unknown chips, bad PTX versions, f16 SPIR-V without `spirv_f16`, and graphs the GPU
// path cannot map yet; JIT_COMPILE_ERROR with MLIR's diagnostics if a pass fails. On
// failure `out` owns nothing.
jit_status jit__compile_gpu(const jit__lgraph *graph, const char *func_name,
                            const jit__gpu_target *target, jit__gpu_artifact *out);

// Compiles `graph` with its symbolic dims kept as `?` (dims < 0; `reshape_req` per
// node, what a reshape asked for) into a generic kernel: one module for every binding,
// whose plan computes the grids, the temporaries' sizes and the SIZES buffer from the
// binding's dims (jit__gpu_plan_bind). Plain kernels only (one thread per output
// element). JIT_UNSUPPORTED for graphs it cannot take: a `?` dim past the leading
// position of a buffer (its strides would be dynamic), more than 64 distinct sizes.
jit_status jit__compile_gpu_generic(const jit__lgraph *graph,
                                    const int64_t (*reshape_req)[JIT_MAX_RANK],
                                    const char *func_name, const jit__gpu_target *target,
                                    jit__gpu_artifact *out);

// The plan of generic `plan` without its programs: sizes that vary per binding 0 (no
// minimum), grids as placeholders. What its module is loaded with, once, where the
// backend launches with given grids.
jit_status jit__gpu_plan_shell(const jit__gpu_plan *plan, jit__gpu_plan *out);

// The plan of generic `plan` for one binding: `ranks[b]` and `dims[b]` give the shape
// of buffer b for each of the n_io inputs and outputs. Fills `out` (static: grids,
// bytes, no programs) and *out_sizes (malloc'ed, plan->n_sizes i32 values; NULL when
// none). JIT_UNSUPPORTED when the binding is past what the kernel can address (a grid
// dim over 65535, a size over 2^31 - 1): its exact kernel serves it.
jit_status jit__gpu_plan_bind(const jit__gpu_plan *plan, uint32_t n_io, const int *ranks,
                              const int64_t (*dims)[JIT_MAX_RANK], jit__gpu_plan *out,
                              int32_t **out_sizes);

// The minimum PTX version (times ten) for `chip`, or 0 if the chip is unknown.
int jit__gpu_ptx_min_version(const char *chip);

// Frees what the plan / artifact owns (not the struct). NULL is a no-op.
void jit__gpu_plan_release(jit__gpu_plan *plan);
void jit__gpu_artifact_release(jit__gpu_artifact *artifact);

// The plan as flat little-endian bytes (magic "JGPL", version, then counts and
// records; see compile_gpu.c), malloc'ed into *out_bytes. Thread-safe.
jit_status jit__gpu_plan_serialize(const jit__gpu_plan *plan, uint8_t **out_bytes,
                                   size_t *out_size);

// Parses bytes made by jit__gpu_plan_serialize into `out` (caller releases it).
// Truncated or corrupt input gives JIT_CACHE_ERROR and leaves `out` empty.
jit_status jit__gpu_plan_deserialize(const uint8_t *bytes, size_t size,
                                     jit__gpu_plan *out);

#endif  // JITML_LOWERING_GPU_H_
