//===--- artifact.h - the one record a compiled kernel is stored as --------===//
//
// Every kernel the cache keeps, for any backend, is described by one artifact record
// next to its payload (the object file, PTX, cubin or SPIR-V): which target the
// payload is for, how the payload is cut into parts, the entry point and argument
// layout, the output shapes of its binding, the GPU launch plan, and the backend's
// own notes. One encoder and one decoder, little-endian whatever the host, versioned
// and checksummed, so a hit needs neither MLIR nor shape inference and a damaged or
// foreign record is refused before anything reaches a loader.
//
// Layout (all integers little-endian):
//    0  4  magic "JART"
//    4  4  version (JIT__ART_VERSION; another is foreign: refused, never guessed at)
//    8  4  target (jit__payload_kind of the payload)
//   12  .. sections: tag u32, size u64, `size` bytes; each tag at most once
//   ..  4  tag 0 (end), size 8, XXH3-64 of every byte before this section
//
// Sections: ENTRY (the entry point's name), ARGS (u32 arguments, u32 stack bytes),
// OUTPUTS (u32 count, then per output u32 rank, u32 dtype, rank x i64 dims), PARTS
// (u32 count, then per part u32 payload kind, u64 bytes), PLAN (a GPU launch plan,
// base/gpu_plan.h: u32 buffers, u32 kernels, per buffer u32 kind, u32 index, u64
// bytes, per kernel 64 bytes of NUL-padded entry, u32 grid[3], u32 block[3], u32
// argument count and that many u32 buffer indices), PROGRAMS (a generic kernel's, after
// PLAN: u32 count, per op u32 op, u32 aux, i64 value; then a program {u32 at, u32 len}
// per buffer's bytes, per kernel x 3 grid dims, and u32 sizes with a program each),
// NOTES ("name=value" lines), PACKED (CPU: u32 count, per input that the kernel reads
// as packed panels u32 argument, u32 panel width, u32 transposed; jit__packed_arg in
// lowering/lower.h).
//
//===----------------------------------------------------------------------===//
#ifndef JITML_CACHE_ARTIFACT_H_
#define JITML_CACHE_ARTIFACT_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/gpu_plan.h"
#include "base/status.h"
#include "jitml.h"

// 2: the launch plan is the record's own PLAN and PROGRAMS sections (was a nested
// encoding of its own).
#define JIT__ART_VERSION 2
#define JIT__ART_MAX_PARTS 4
#define JIT__ART_ENTRY_MAX 64  // bytes of an entry point's name, with its NUL
#define JIT__ART_MAX_PACKED 64  // = JIT__MAX_PACKED_ARGS

typedef struct jit__art_packed {
  uint32_t arg;         // an input the kernel reads as [N / tn][K][tn] panels
  uint32_t tn;
  uint32_t transposed;  // 1: the input is W [N, K], the panels are of B = W^T
} jit__art_packed;

typedef struct jit__art_shape {
  int32_t rank;
  int32_t dtype;  // lowering's jit__dtype
  int64_t dims[JIT_MAX_RANK];
} jit__art_shape;

typedef struct jit__art_part {
  uint32_t kind;  // jit__payload_kind
  uint64_t size;
} jit__art_part;

// An artifact record in memory. Encoding borrows every pointer; a decoded record owns
// its arrays and strings (free with jit__art_release). Thread-compatible.
typedef struct jit__art {
  uint32_t target;                      // jit__payload_kind of the whole payload
  char entry[JIT__ART_ENTRY_MAX];       // "" when the target has none
  uint32_t n_args;                      // the kernel's arguments: inputs, then outputs
  uint32_t stack_bytes;                 // CPU: stack the kernel needs beyond its frame
  uint32_t n_packed;                    // CPU: inputs read packed (jit_weight's)
  jit__art_packed packed[JIT__ART_MAX_PACKED];
  uint32_t n_outputs;
  jit__art_shape *outputs;
  uint32_t n_parts;                     // 0: the payload is one part of kind `target`
  jit__art_part parts[JIT__ART_MAX_PARTS];
  bool has_plan;                        // GPU kernels: `plan` holds their launch plan
  jit__gpu_plan plan;
  char *notes;                          // NUL-terminated; NULL when none
} jit__art;

// Encodes `art` into a new buffer (*out_bytes, free()). JIT_RESOURCE_EXHAUSTED when
// out of memory, JIT_INTERNAL for a record that could not be decoded back (an entry
// point without its NUL, a rank past JIT_MAX_RANK, too many parts, a plan whose
// arguments or programs point past its tables).
jit_status jit__art_encode(const jit__art *art, uint8_t **out_bytes, size_t *out_size);

// Decodes and checks `bytes`: magic, version, every section's bounds, the checksum,
// ranks and counts, the plan's buffer kinds, argument indices, ops and programs.
// JIT_CACHE_ERROR says what is wrong ("artifact version 7, expected
// 1", "checksum mismatch", "truncated"); JIT_RESOURCE_EXHAUSTED when out of memory.
// On failure *out is zeroed and owns nothing.
jit_status jit__art_decode(const uint8_t *bytes, size_t size, jit__art *out);

// The sum of the parts' sizes (or 0 with no parts).
uint64_t jit__art_parts_size(const jit__art *art);

// Frees what a decoded record owns and zeroes it. NULL: nothing.
void jit__art_release(jit__art *art);

#endif  // JITML_CACHE_ARTIFACT_H_
