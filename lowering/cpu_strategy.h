//===--- cpu_strategy.h - per-op CPU code generation strategies ------------===//
//
// The transform script that tiles, fuses, parallelizes and vectorizes one specialized
// module (lowering/cpu/: normalize.c before it, script.c with the plans of plan_matmul.c and
// plan_rows.c, post_bufferize.c after it), and the LLVM-IR rewrite that makes exp vectorizable
// (cpu_vmath.c). Used by compile_cpu.c only.
//
//===----------------------------------------------------------------------===//
#ifndef JITML_LOWERING_CPU_STRATEGY_H_
#define JITML_LOWERING_CPU_STRATEGY_H_

#include <stdbool.h>

#include <llvm-c/Core.h>
#include <mlir-c/IR.h>

#include "lowering/lower.h"

#define JIT__CPU_MAX_PACK 16

typedef struct jit__cpu_plan {
  char *script;      // malloc'ed transform module text; NULL when there is nothing to do
  int n_ops;         // ops the script transforms
  bool parallel;     // the script made scf.forall loops: lower them to OpenMP
  int threads;       // threads those loops use
  // Packed-B buffers the script made, as memref<panels x kc x tn x f32>: after
  // bufferization, their allocations become stack allocations (lowering/cpu/ says
  // why; jit__cpu_stack_buffers).
  int64_t pack[JIT__CPU_MAX_PACK][3];
  int n_pack;
  int n_masked;      // matmuls vectorized with masks (jit__cpu_drop_mask_selects)
  // Streaming (lowering/cpu/, "Streaming"): the outputs are large and written once,
  // so their vector stores go straight to memory (jit__cpu_stream_rows); and for a lone
  // row loop over a large input, the bytes from one row to the next, to prefetch it.
  bool stream;
  int64_t row_prefetch;
  bool unroll_k;     // a matmul large enough for its k loops to be unrolled (below)
  // No matmul, and the host has 512-bit vectors: LLVM's vectorizers may use them
  // (jit__cpu_prefer_wide_vectors).
  bool wide_vectors;
} jit__cpu_plan;

// Rewrites `module`'s 2-D x W^T (W stored N x K) into the form that is fast for its
// rows (jit__cpu_bt_map): a transpose of W feeding a matmul into the matmul reading W
// through (n, k), or the reverse; a matmul that jit__cpu_split_script splits reads W
// through (n, k) until it is split. To run before jit__cpu_split_script, and again
// after it.
void jit__cpu_normalize(MlirContext ctx, MlirOperation module, const jit__lower_options *o);

// Rewrites each small-M matmul of `module` split across `o->num_threads` threads that
// is faster split over K than over N (4 rows or more, or under a page of each row of
// B a thread) into a batch_matmul of the K parts and a sum of their results
// (lowering/cpu/, "Small M split over K"). To run before jit__cpu_split_script.
// Returns the number rewritten.
int jit__cpu_split_k(MlirContext ctx, MlirOperation module, const jit__lower_options *o);

// The script that splits matmuls whose N is not a whole number of register tiles into
// two (lowering/cpu/, "Odd N"), to run before jit__cpu_plan_make; NULL when there are
// none (or out of memory: the matmuls are then planned whole). Free with free().
char *jit__cpu_split_script(MlirContext ctx, MlirOperation module,
                            const jit__lower_options *o);

// Tags the module's linalg ops with `jit_s = i` and writes the script that transforms
// them for the concrete shapes, the host's vector width (`o->features`) and
// `o->num_threads`. Returns false when out of memory. Thread-safe.
bool jit__cpu_plan_make(MlirContext ctx, MlirOperation module, const jit__lower_options *o,
                        jit__cpu_plan *out);
void jit__cpu_plan_free(jit__cpu_plan *plan);

// For a generic kernel (a module with `?` dims): tags its matmuls `jit.gmm = i` and
// writes the script that tiles them with peeled remainders and vectorizes what is
// static (lowering/cpu/generic.c); *n_ops: the matmuls it plans; *threads: the
// threads its scf.forall loops use (1: none made). NULL when out of memory.
// Thread-safe.
char *jit__cpu_generic_script(MlirContext ctx, MlirOperation module,
                              const jit__lower_options *o, int *n_ops, int *threads);

// Puts back the functions that jit__cpu_generic_script's loop.outline made
// (jit_outlined_*, one call each) at their calls and erases them; returns how many,
// -1 when one is left (not called from the kernel).
int jit__cpu_inline_outlined(MlirOperation module);

// After one-shot bufferization (before deallocations are placed): replaces the heap
// allocation of each packed-B buffer of `plan` made once per call or per thread, and
// of each small scratch buffer made inside loops, by a stack allocation at the top of
// the function or thread body (lowering/cpu/ says which and why). Returns the number
// replaced; *bytes is their total size.
int jit__cpu_stack_buffers(MlirContext ctx, MlirOperation module, const jit__cpu_plan *plan,
                           int64_t *bytes);

// After one-shot bufferization, for the inputs of `func_name` that `weights` marks:
// where every use of one is the packing of a matmul's B panels, the kernel reads a
// packed copy passed in its place instead (lowering/cpu/prepack.c). Fills out[] (at
// most max_out) and returns the number of such inputs.
int jit__cpu_prepack_weights(MlirContext ctx, MlirOperation module, const char *func_name,
                             const bool *weights, uint32_t n_inputs, jit__packed_arg *out,
                             int max_out);

// After one-shot bufferization: an output argument written by one memref.copy from
// a heap buffer the kernel made (or a reshaped view of it) gets the buffer's writes
// directly (the buffer becomes a view of the output; lowering/cpu/ says when).
// Returns the number of copies removed.
int jit__cpu_results_in_place(MlirContext ctx, MlirOperation module);

// After bufferization, for plan->unroll_k: gives each register tile's k loop (a loop
// whose own body holds vector FMAs) an llvm.loop.unroll.count of 4, or 2 when its
// static trip count is not a multiple of 4, and every other scf.for unroll.disable, so
// that LLVM's loop-unroll pass (jit__cpu_unroll_passes) unrolls those loops alone
// (lowering/cpu/ says why). Returns the k loops marked.
int jit__cpu_unroll_k_loops(MlirContext ctx, MlirOperation module);

// After bufferization: identical top-level loop nests of the function `func_name`
// (q, k and v of a transformer block) become one private function, called once per
// nest with its own buffers, so that the rest of the compile handles that code once
// (lowering/cpu/share.c says what "identical" is). `bare_ptr`: memrefs cross calls as
// bare pointers (exact kernels), so only those of a static shape and layout may.
// Returns the number of loop nests replaced by calls (0 where none repeats).
int jit__cpu_share_loops(MlirContext ctx, MlirOperation module, const char *func_name,
                         bool bare_ptr);

// After the script, for plan->n_masked: replaces each masked register tile's
// accumulator step select(mask, acc + p, p) by acc + p where nothing reads the
// masked-off lanes (lowering/cpu/ says how that is checked). Returns the number
// replaced.
int jit__cpu_drop_mask_selects(MlirOperation module);

// After a generic kernel's script: folds the whole-tile extract_slice/insert_slice
// pairs that tiling by k leaves on loop-carried tensors with `?` sizes
// (lowering/cpu/iter_slices.c says when they are whole). Returns the ops folded; when
// any, jit__cpu_generic_hoist_script's script hoists the accumulators they hid.
int jit__cpu_fold_iter_slices(MlirOperation module);
const char *jit__cpu_generic_hoist_script(void);

// Replaces every call of llvm.exp on f32 (or f16, computed in f32 and rounded once)
// scalars or vectors in `mod` by an inline polynomial (Cephes expf, within 2 ulp; exact
// at 0, +-inf and NaN), so that the loop and SLP vectorizers can widen it instead of
// calling libm's expf per lane. Returns the number of calls replaced.
int jit__cpu_expand_exp(LLVMModuleRef mod);

// Marks the fadd of every scalar accumulate-into-memory reduction step in `mod`
// `reassoc`, so LLVM can vectorize the reduction loop (cpu_vmath.c says why that is
// safe here). Returns the number marked.
int jit__cpu_mark_reductions(LLVMModuleRef mod);

// Reduces runs of reassociable vector reductions (llvm.vector.reduce.fadd, reassoc) in
// one block together, as one shuffle-and-add tree (the dot-product tiles' sums,
// plan_matmul_dot). Run before the LLVM passes. Returns the number of reductions.
int jit__cpu_tree_reductions(LLVMModuleRef mod);

// Replaces each f32 vector division by a value computed outside the division's block
// with a multiplication by its reciprocal, computed once (cpu_vmath.c). Run after O2,
// which has vectorized and hoisted the divisor. Returns the number replaced.
int jit__cpu_hoist_reciprocals(LLVMModuleRef mod);

// After O2, for plan->stream and plan->row_prefetch (x86 only): marks the vector
// stores to caller memory non-temporal, with an SFENCE before each return of their
// function, and makes the first vector loads of caller memory in each function also
// prefetch `row_bytes` ahead (cpu_vmath.c). Returns the number of stores and loads
// changed.
int jit__cpu_stream_rows(LLVMModuleRef mod, bool stream, int64_t row_bytes);

// Marks every function defined in `mod` "prefer-vector-width"="512", so the loop and
// SLP vectorizers widen to 16 lanes where LLVM's tuning for AVX-512 cores stops at 8
// (cpu_vmath.c says why). Returns the number of functions marked.
int jit__cpu_prefer_wide_vectors(LLVMModuleRef mod);

#endif  // JITML_LOWERING_CPU_STRATEGY_H_
