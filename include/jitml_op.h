//===--- jitml_op.h - libjitml as a custom op of a host framework ----------===//
//
// A host framework (an inference engine, a training framework, a plugin system) that
// already owns its tensors registers a libjitml graph as an op once and then calls it
// with DLPack tensors:
//
//   jit_op *op = NULL;
//   s = jit_op_create(graph, "mlp", &op);          // the op takes over `graph`
//   ...
//   DLManagedTensor *ins[3] = {x, w, b};           // borrowed for the call
//   DLManagedTensor *outs[1];
//   s = jit_op_call(op, ins, 3, outs, 1, 0);      // outs[0] is the caller's
//   ...
//   outs[0]->deleter(outs[0]);
//   jit_op_destroy(op);                            // destroys the graph too
//
// Hosts that must allocate outputs themselves (a memory planner, an arena) first ask
// the shape function, which compiles nothing, then call jit_op_call_into.
//
// DLPack version: this header is built against the DLPack the system provides. On
// Debian 12 that is dlpack.h v0.6 (DLPACK_VERSION 60), which has neither
// DLManagedTensorVersioned nor the DLPACK_FLAG_BITMASK_READ_ONLY flag, so the ABI
// takes plain DLManagedTensor and carries no read-only flag. What that means:
//  - Inputs are only ever read, never written: read-only host memory is fine as an
//    input.
//  - Outputs of jit_op_call are freshly allocated by the library, so they are never
//    read-only.
//  - jit_op_call_into writes into the caller's output tensors. DLPack 0.6 cannot
//    say a tensor is read-only, so the caller must not pass memory it may not write.
// When the system's DLPack gains the versioned struct this ABI will gain *_versioned
// entry points next to these; the ones here keep their meaning.
//
// Tensors: CPU, dense row-major (strides NULL or the dense strides), dtypes the graph
// declares (f32 or f16); anything else gives a status, never a crash.
//
// Lifetime: inputs are borrowed only for the duration of the call (their deleters are
// never called by the library); the caller must keep them alive until the call
// returns. Output DLManagedTensors returned by jit_op_call belong to the caller, who
// releases each exactly once by calling its deleter.
//
// Threading: a jit_op may be called from any number of threads at once (jit_run is
// thread-safe); create and destroy it from one thread.
//
//===----------------------------------------------------------------------===//
#ifndef JITML_OP_H_
#define JITML_OP_H_

#include "jitml.h"

#ifdef __cplusplus
extern "C" {
#endif

// A graph registered as an op. Owns its graph.
typedef struct jit_op jit_op;

// The shape and dtype of one output for a set of input shapes.
typedef struct jit_op_output_info {
  int rank;
  int64_t dims[JIT_MAX_RANK];
  // The output's element type. {0, 0, 0} (bits 0) when it cannot be known yet without
  // compiling; see jit_op_output_shapes.
  DLDataType dtype;
} jit_op_output_info;

// Registers `graph` as an op called `name` (letters, digits, '_', '.'; copied),
// finalizing the graph first if it is not (jit_graph_finalize; a no-op for a
// finalized graph or one from jit_graph_from_mlir). On success the op owns `graph`
// and destroys it in jit_op_destroy; on failure the caller still owns it. Compiles
// nothing.
// Returns JIT_INVALID_ARGUMENT (NULL graph/name/out_op, empty or bad name),
// jit_graph_finalize's errors, JIT_RESOURCE_EXHAUSTED.
JIT_API jit_status jit_op_create(jit_graph *graph, const char *name, jit_op **out_op);

// Destroys `op` and its graph. The graph's context must still exist. NULL is a no-op.
JIT_API void jit_op_destroy(jit_op *op);

// The op's name (borrowed, valid until jit_op_destroy), its graph (borrowed), and its
// input and output counts.
JIT_API const char *jit_op_name(const jit_op *op);
JIT_API jit_graph *jit_op_graph(const jit_op *op);
JIT_API int jit_op_num_inputs(const jit_op *op);
JIT_API int jit_op_num_outputs(const jit_op *op);

// The shape function: the shape and dtype of every output (n_outputs entries, which
// must equal the op's output count) for `inputs` (n_inputs borrowed tensors; only
// their shapes and dtypes are read, data may be NULL). Compiles nothing. The dtypes
// are the graph's output dtypes (jit_output_dtype).
// Returns JIT_INVALID_ARGUMENT (NULL pointers, counts), JIT_SHAPE_MISMATCH,
// JIT_DTYPE_MISMATCH (the same binding errors as jit_output_shape).
JIT_API jit_status jit_op_output_shapes(jit_op *op, DLManagedTensor *const *inputs,
                                        int n_inputs, jit_op_output_info *out_info,
                                        int n_outputs);

// Flags for jit_op_call / jit_op_call_into. None are defined yet; pass 0. (Reserved
// for the read-only and other flags of versioned DLPack.)
#define JIT_OP_FLAGS_NONE 0u

// Runs the op on `inputs` (borrowed) and allocates its outputs: on success
// out_outputs[j] (n_outputs entries) are DLManagedTensors on the CPU, dense, the
// caller's to release through their deleters. On failure every out_outputs[j] is
// NULL and nothing is allocated. The first call for a new set of input shapes
// compiles a kernel; later calls with the same shapes reuse it.
// Returns JIT_INVALID_ARGUMENT (NULL pointers, counts, nonzero flags, a NULL input),
// JIT_SHAPE_MISMATCH, JIT_DTYPE_MISMATCH, JIT_UNSUPPORTED (strides, device),
// JIT_COMPILE_ERROR, JIT_DEVICE_ERROR, JIT_RESOURCE_EXHAUSTED.
JIT_API jit_status jit_op_call(jit_op *op, DLManagedTensor *const *inputs, int n_inputs,
                               DLManagedTensor **out_outputs, int n_outputs,
                               uint32_t flags);

// As jit_op_call, but writes into `outputs` (borrowed) that the caller allocated with
// the shapes and dtypes of jit_op_output_shapes. Outputs must be writable and must not
// alias inputs. Same errors as jit_op_call.
JIT_API jit_status jit_op_call_into(jit_op *op, DLManagedTensor *const *inputs,
                                    int n_inputs, DLManagedTensor *const *outputs,
                                    int n_outputs, uint32_t flags);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // JITML_OP_H_
