//===--- gpu.h - GPU lowering: specialized graph -> PTX / SPIR-V + launch plan ===//
//
// The half of the GPU backends that lives in lowering/: it turns one specialized graph
// into a device module (PTX text for CUDA, SPIR-V words for Vulkan) and the launch plan
// a runtime needs to run it: which buffers to allocate, which kernels to launch in
// which order, with which grid/block sizes and arguments. It loads nothing and talks
// to no device; devices/cuda and devices/vulkan consume the artifact, and cache/
// stores the module bytes with the plan in the artifact record (cache/artifact.h).
// The plan's types and buffer table convention: base/gpu_plan.h.
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

#include "base/gpu_plan.h"
#include "base/image.h"
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
  // SPIR-V: allow int64 (the Int64 capability; the device's shaderInt64).
  bool spirv_int64;
  // Both: use only the plain kernels (one thread per output element, serial loops
  // that read and write the accumulator in memory each step), never the tiled
  // workgroup-memory kernels for matmuls and row reductions nor register
  // accumulators. For before/after comparisons and as a way around a device that
  // mishandles workgroup memory.
  bool plain_kernels;
  // PTX: also assemble a cubin for `chip` with the ptxas of `cubin_toolkit` (as
  // jit__ptxas_find takes it: NULL looks in the usual places, "" uses none). Without
  // one, or when it fails, the kernel ships as PTX alone and jit__gpu_artifact.notes
  // says why (`missing=`).
  bool cubin;
  const char *cubin_toolkit;
  // Both: keep the text of the device module (gpu.module with its gpu.funcs, before
  // the NVVM/SPIR-V conversion) in jit__gpu_artifact.ir, for tests and dumps.
  bool keep_ir;
} jit__gpu_target;

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
  // With jit__gpu_target.cubin: the cubin ptxas made (malloc'ed), or NULL.
  uint8_t *cubin;
  size_t cubin_size;
  // The images to store and load, best first, borrowing `binary` and `cubin`: the
  // cubin, then the PTX; or the SPIR-V module.
  uint32_t n_images;
  jit__image images[2];
  // "name=value" lines for the artifact record (malloc'ed), or NULL. PTX with
  // target.cubin: `sm` and `ptxas` (the cubin's chip and the ptxas release), or
  // `missing` (why there is no cubin).
  char *notes;
} jit__gpu_artifact;

// A device as the GPU lowering sees it: jit/ fills it from the backend's description
// (devices/device.h's jit__dev_info). Thread-compatible: a value.
typedef struct jit__gpu_device {
  jit__code code;            // the code it runs (base/image.h)
  const char *name;          // for messages
  const char *chip;          // PTX: "sm_90"
  int isa_max;               // PTX: the newest PTX ISA its driver takes, times ten
  bool f16;                  // f16 kernels can run
  const char *cuda_toolkit;  // PTX: jit_options.cuda_toolkit, or NULL
  bool int64;                // int64 buffers can be read (jit_gather's indices)
} jit__gpu_device;

// What to compile `graph` to for `device`, cubins included: JIT_UNSUPPORTED where the
// device cannot run it (host code, an unknown chip, a driver too old for the chip's
// PTX, f16 without the features).
jit_status jit__gpu_target_for(const jit__gpu_device *device, const jit__lgraph *graph,
                               jit__gpu_target *out);

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

// Frees what the artifact owns (not the struct). NULL is a no-op.
void jit__gpu_artifact_release(jit__gpu_artifact *artifact);

#endif  // JITML_LOWERING_GPU_H_
