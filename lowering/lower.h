//===--- lower.h - what lowering consumes and produces ---------------------===//
//
// lowering/ turns one *specialized* graph (every dim concrete) into an artifact: object
// code plus the record of how to call it. It knows nothing of contexts, caches or
// devices; jit/ builds the jit__lgraph from a user graph and a binding, and hands the
// artifact to a device. Compilation is a pure function of its inputs: it shares no
// state with the run path, so it may later move to a worker thread or process.
//
//===----------------------------------------------------------------------===//
#ifndef JITML_LOWERING_LOWER_H_
#define JITML_LOWERING_LOWER_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "jitml.h"

typedef enum jit__op {
  JIT__OP_INPUT,
  JIT__OP_SCALAR,
  JIT__OP_MATMUL,
  // Binary elementwise (broadcasting).
  JIT__OP_ADD,
  JIT__OP_SUB,
  JIT__OP_MUL,
  JIT__OP_DIV,
  JIT__OP_MAXIMUM,
  JIT__OP_MINIMUM,
  // Unary elementwise.
  JIT__OP_NEG,
  JIT__OP_EXP,
  JIT__OP_LOG,
  JIT__OP_TANH,
  JIT__OP_SIGMOID,
  JIT__OP_RELU,
  JIT__OP_GELU,
  JIT__OP_SQRT,
  JIT__OP_RSQRT,
  // Reductions over one axis.
  JIT__OP_REDUCE_SUM,
  JIT__OP_REDUCE_MAX,
  JIT__OP_REDUCE_MEAN,
  JIT__OP_SOFTMAX,
  JIT__OP_TRANSPOSE,
  JIT__OP_RESHAPE,
  // Unary elementwise ops added later: numbered after the rest, so that graphs exported
  // before them (jit/graph_mlir.c replays op numbers) keep their meaning.
  JIT__OP_ERF,
  JIT__OP_GELU_ERF,
  // Binary elementwise (broadcasting): comparisons give 1 or 0 in the operands' dtype.
  JIT__OP_LESS,
  JIT__OP_LESS_EQUAL,
  JIT__OP_GREATER,
  JIT__OP_GREATER_EQUAL,
  JIT__OP_EQUAL,
  JIT__OP_NOT_EQUAL,
  JIT__OP_POW,
  // Ternary elementwise (broadcasting): operand 1 where operand 0 is nonzero, else 2.
  JIT__OP_WHERE,
  // Sliding windows over two spatial dims (params in jit__node.win).
  JIT__OP_CONV2D,
  JIT__OP_MAX_POOL2D,
  JIT__OP_AVG_POOL2D,
  // Rows of operand 0 (a table) picked by operand 1 (integer indices), axis 0.
  JIT__OP_GATHER,
  // Copies at computed positions (emit_copy.c): operands 0 and 1 joined along `axis`;
  // a strided range of `axis` (span); constant padding (span, `scalar` the value).
  JIT__OP_CONCAT,
  JIT__OP_SLICE,
  JIT__OP_PAD,
  // The operand converted to the node's dtype (f32 <-> f16), rounded once.
  JIT__OP_CAST,
  // softmax(q k^T * scalar + mask) v: operands q, k, v[, mask]; `causal` masks keys
  // after each query's position (emit_attention.c).
  JIT__OP_ATTENTION,
  // int8 x int8 -> int32 products of the last two dims (operands a, b), dequantized:
  // (sum a b) * operand 2 (a's scale, one value) * operand 3 (b's: one, or per column).
  // Zero points (jit_matmul_int8_zp) follow as operands 4[, 5], int8, which `axis`
  // names: bit 0 a's (one value), bit 1 b's (one, or per column).
  JIT__OP_MATMUL_INT8,
  // Unary: to the nearest integer, ties to even (a quantizer's rounding).
  JIT__OP_ROUND,
  JIT__OP_COUNT_,
} jit__op;

// Unary elementwise ops (same shape in and out), binary broadcasting ones, and all
// elementwise ones.
static inline bool jit__op_is_unary(jit__op op) {
  return (op >= JIT__OP_NEG && op <= JIT__OP_RSQRT) || op == JIT__OP_ERF ||
         op == JIT__OP_GELU_ERF || op == JIT__OP_ROUND;
}
static inline bool jit__op_is_binary_elementwise(jit__op op) {
  return (op >= JIT__OP_ADD && op <= JIT__OP_MINIMUM) ||
         (op >= JIT__OP_LESS && op <= JIT__OP_POW);
}
static inline bool jit__op_is_elementwise(jit__op op) {
  return jit__op_is_binary_elementwise(op) || jit__op_is_unary(op) || op == JIT__OP_WHERE;
}
static inline bool jit__op_is_window(jit__op op) {
  return op >= JIT__OP_CONV2D && op <= JIT__OP_AVG_POOL2D;
}

// The op's name as the API spells it ("matmul", "add", ...).
const char *jit__op_name(jit__op op);

typedef enum jit__dtype {
  JIT__F32 = 0,
  JIT__F16 = 1,
  // Integers: graph inputs that only jit_gather's indices read.
  JIT__I32 = 2,
  JIT__I64 = 3,
  // bfloat16: stored in 16 bits, computed in f32 like f16.
  JIT__BF16 = 4,
  // int8: graph inputs that only jit_matmul_int8 reads.
  JIT__I8 = 5,
} jit__dtype;

static inline bool jit__dtype_is_int(jit__dtype t) {
  return t == JIT__I32 || t == JIT__I64 || t == JIT__I8;
}
// The 16-bit floats, extended to f32 to compute and rounded once at the end.
static inline bool jit__dtype_is_half(jit__dtype t) { return t == JIT__F16 || t == JIT__BF16; }
static inline int jit__dtype_bytes(jit__dtype t) {
  return jit__dtype_is_half(t) ? 2 : t == JIT__I64 ? 8 : t == JIT__I8 ? 1 : 4;
}
// The name users see and MLIR's element type: "f32", "f16", "bf16", "i32", "i64".
static inline const char *jit__dtype_str(jit__dtype t) {
  return t == JIT__F16 ? "f16" : t == JIT__BF16 ? "bf16" : t == JIT__I32 ? "i32"
         : t == JIT__I64 ? "i64" : t == JIT__I8 ? "i8" : "f32";
}
static inline DLDataType jit__dtype_dl(jit__dtype t) {
  DLDataType d = {jit__dtype_is_int(t) ? kDLInt : t == JIT__BF16 ? kDLBfloat : kDLFloat,
                  (uint8_t)(8 * jit__dtype_bytes(t)), 1};
  return d;
}
// f32/f16 (and, with `ints`, int32/int64) from DLPack; false for anything else.
static inline bool jit__dtype_from_dl(DLDataType t, bool ints, jit__dtype *out) {
  if (t.lanes != 1) return false;
  if (t.code == kDLFloat && t.bits == 32) *out = JIT__F32;
  else if (t.code == kDLFloat && t.bits == 16) *out = JIT__F16;
  else if (t.code == kDLBfloat && t.bits == 16) *out = JIT__BF16;
  else if (ints && t.code == kDLInt && t.bits == 32) *out = JIT__I32;
  else if (ints && t.code == kDLInt && t.bits == 64) *out = JIT__I64;
  else if (ints && t.code == kDLInt && t.bits == 8) *out = JIT__I8;
  else return false;
  return true;
}

// One node of a graph. In a jit__lgraph every dim is concrete (>= 0), except for
// jit__emit_mlir_with's symbolic mode; in the user graph (jit/) dims may be negative
// symbol codes.
// A sliding window over the two spatial dims of a 4-D tensor (conv2d, pools).
typedef struct jit__window {
  bool nhwc;          // layout: NCHW (false) or NHWC; conv weights OIHW or HWIO
  int kernel[2];      // pools: the window (conv: the weight's KH, KW)
  int stride[2];
  int pad[4];         // top, bottom, left, right
  int dilation[2];
  int groups;         // conv
  bool count_pad;     // avg pool: padded positions count in the divisor
} jit__window;

// Slice: lo[0] = start, hi[0] = stop (as given: negative counts from the end,
// JIT_SLICE_END), step >= 1; lo_sym / hi_sym: 0, or a symbol (jit/'s code) whose size
// at run time is added to lo[0] / hi[0] before that (jit_slice_symbolic). A binding's
// concrete graph has them added already (0); only symbolic emits see them. Pad: lo[d],
// hi[d] elements before and after dim d.
typedef struct jit__span {
  int64_t lo[JIT_MAX_RANK], hi[JIT_MAX_RANK];
  int64_t step;
  int64_t lo_sym, hi_sym;
} jit__span;

// A slice's first index and length on a dim of n elements, NumPy's way: a negative
// bound counts from the end, bounds are clamped to [0, n].
static inline void jit__slice_bounds(int64_t n, const jit__span *s, int64_t *start,
                                     int64_t *len) {
  int64_t a = s->lo[0], b = s->hi[0];
  a = a < 0 ? (a + n < 0 ? 0 : a + n) : (a > n ? n : a);
  b = b < 0 ? (b + n < 0 ? 0 : b + n) : (b > n ? n : b);
  *start = a;
  *len = b > a ? (b - a - 1) / s->step + 1 : 0;
}

typedef struct jit__node {
  jit__op op;
  jit__dtype dtype;
  int n_operands;
  uint32_t operands[6];  // node indices, always smaller than this node's index
  int rank;
  int64_t dims[JIT_MAX_RANK];
  int axis;                   // reductions, softmax
  bool keepdims;              // reductions
  int perm[JIT_MAX_RANK];     // transpose
  double scalar;              // scalar
  jit__window win;            // conv2d, pools
  jit__span span;             // slice, pad
  bool causal;                // attention
  bool weight;                // inputs: declared with jit_weight (lowering/cpu/prepack.c)
} jit__node;

// A specialized graph: nodes in topological order with concrete dims.
typedef struct jit__lgraph {
  const char *name;
  const jit__node *nodes;
  uint32_t n_nodes;
  const uint32_t *inputs;   // node indices of the inputs, in argument order
  uint32_t n_inputs;
  const uint32_t *outputs;  // node indices of the outputs, in result order
  uint32_t n_outputs;
} jit__lgraph;

// MLIR contexts kept between the CPU compiles of one jit_context, so that a compile
// does not create a context and load its dialects again (~8 % of a compile's
// instructions), with the pass managers built in each (parsed and initialized once)
// and its LLVM target machine (~4 % more). Thread-safe: concurrent compiles take different contexts. A context
// is retired after JIT__MLIR_POOL_USES compiles, so the types and attributes it
// uniques stay bounded in a long-running process.
typedef struct jit__mlir_pool jit__mlir_pool;
// NULL when out of memory (compiles then make their own contexts).
jit__mlir_pool *jit__mlir_pool_create(void);
void jit__mlir_pool_destroy(jit__mlir_pool *pool);  // NULL is a no-op

typedef struct jit__lower_options {
  int opt_level;      // 0: plain loops (debug); >= 1: tiled and vectorized
  const char *dump_dir;  // if non-NULL, each stage's IR is written there (later issue)
  const char *triple;    // target triple, CPU name and features (from devices/cpu)
  const char *cpu;
  const char *features;
  long l2_bytes;         // the target's L2 per core; 0 when unknown
  long l3_bytes;         // the target's L3 (shared); 0 when unknown
  int num_threads;       // threads a kernel may use (jit__cpu_threads); 0 or 1: one
  jit__mlir_pool *pool;  // where CPU compiles get their MLIR context; NULL: a fresh one
  // A generic kernel (jit__compile_cpu_generic): the module has `?` dims, its
  // arguments are memrefs with run-time sizes (see jit__artifact for the entry).
  bool generic;
  // Per argument (inputs, then outputs; NULL: none): a weight, whose packed panels the
  // runtime may pass in its place (lowering/cpu/prepack.c, jit__artifact.packed).
  const bool *weights;
  uint32_t n_weights;  // entries in `weights`
  // Convolutions as im2col + matmul only (jit_conv_algorithm IM2COL): no Winograd.
  bool conv_im2col;
} jit__lower_options;

// An input the kernel reads as panels packed ahead of the call (lowering/cpu/prepack.c):
// argument `arg` is a matmul's B, a K x N f32 matrix, or with `transposed` its W, an
// N x K matrix with B = W^T; the kernel reads B laid out [N / tn][K][tn] (element
// (k, n) at ((n / tn) * K + k) * tn + n % tn).
typedef struct jit__packed_arg {
  uint32_t arg;
  uint32_t tn;
  bool transposed;
} jit__packed_arg;
#define JIT__MAX_PACKED_ARGS 64

// What a compile produces: object code for the host CPU whose entry point is
// `void <entry>(void **args)`, args = inputs then outputs, each a pointer to the
// first element of a dense row-major buffer of the specialized shape. A generic
// kernel's entry reads one more: args[n_args] points to the int64 sizes of every
// argument, in argument order, all `rank` dims of each (static ones included). This is
// exactly what a kernel cache stores.
typedef struct jit__artifact {
  uint8_t *object;        // ELF object bytes, malloc'ed, owned by the artifact
  size_t object_size;
  char entry[64];         // entry point symbol
  uint32_t n_args;        // n_inputs + n_outputs
  // Bytes of stack buffers the kernel puts on the calling thread's stack (packed B
  // blocks, scratch rows: lowering/cpu/), at most; jit_run checks the thread has them.
  uint32_t stack_bytes;
  // Inputs the kernel reads packed (only jit_weight inputs): the caller passes each as
  // jit__packed_arg says instead of the row-major matrix.
  uint32_t n_packed;
  jit__packed_arg packed[JIT__MAX_PACKED_ARGS];
  // Where the compile spent its time (ms), for logs and benchmarks.
  double ms_mlir;         // context, parse, fusion, tiling/vectorization, to LLVM dialect
  double ms_llvm_opt;     // translation to LLVM IR and LLVM's passes
  double ms_codegen;      // machine code emission
  const char *llvm_passes;  // LLVM pipeline: "light" [+ rotate] [+ k-unroll], or "O0"
  // The CPU compile's steps up to LLVM IR as "name ms, ..." (empty for GPU kernels).
  char stages[192];
} jit__artifact;

// Frees what `artifact` owns (not the struct itself). NULL is a no-op.
void jit__artifact_release(jit__artifact *artifact);

// Writes the MLIR (func on static tensors, linalg ops) for `graph` into a malloc'ed,
// NUL-terminated string. `func_name` names the function. Batched matmuls are
// linalg.generic ops, which is what the GPU back ends map (gpu_tiled.c); the CPU's
// exact kernels ask jit__emit_mlir_with for named ones (named_batch). Thread-safe.
jit_status jit__emit_mlir(const jit__lgraph *graph, const char *func_name, char **out_text);

// How jit__emit_mlir_with writes a graph's dims, and the function around its body.
//
// Static (symbolic false): every dim is a size; the function takes the inputs as
// tensors and the outputs as memrefs it writes (jit__emit_mlir, the compile path).
// Symbolic: a dim < 0 is a symbol (jit/'s code), written `?`, whose size at run time is
// the tensor.dim of the first input dim that carries it; a dim that jit/ could not name
// (a reshape's inferred dim) is computed from the others. The function then takes and
// returns tensors, each argument tagged {jit.dims = [...]} with its sizes and symbol
// names (jit_graph_to_mlir). Both modes write every op through the same code.
typedef struct jit__emit_options {
  bool named_batch;  // see jit__emit_mlir; static mode only
  bool symbolic;
  // Symbolic mode only:
  const char *const *input_names;  // per input, its name (made an SSA-safe identifier)
  // The name of symbol `code` (a dim < -1), for jit.dims.
  const char *(*symbol_name)(const void *arg, int64_t code);
  const void *symbol_arg;
  // Per node, what a reshape node asked for (sizes, symbol codes, one -1); read for
  // reshape nodes only.
  const int64_t (*reshape_req)[JIT_MAX_RANK];
  const char *func_attributes;  // written inside `attributes {...}`; NULL: none
  // Symbolic mode in destination-passing form (the generic kernel's compile): the
  // function takes the inputs as tensors and the outputs as memrefs with `?` dims and
  // writes them, as static mode does; no jit.dims, input_names and symbol_name unused.
  bool destination;
  // Destination mode: > 0 writes the body twice, under scf.if (first `?` dim >=
  // split_rows) and its else (emit_mlir.c); the generic CPU kernel plans each path
  // for its side.
  int64_t split_rows;
  // Elementwise nodes with one consumer, also elementwise and of the same shape, are
  // written inside its body (emit_fused.c): what linalg-fuse-elementwise-ops would
  // make, in linear time (its pairwise fusion cloned the growing body at each step:
  // 2,000 chained adds took 1.5 s). Compiles set it; the graph's MLIR export does not.
  bool fuse_elementwise;
  // Convolutions with one group as an im2col copy and a 2-D linalg.matmul, which the
  // CPU strategies plan (emit_window.c); else one generic of their loops. CPU compiles
  // set it (jit__emit_mlir's named_batch too); the GPU back ends and the export do not.
  bool conv_as_matmul;
  // Attention in blocks of this many keys with a running max and sum (the CPU's exact
  // kernels): the S x T scores are never made whole. 0: the composed form (scores,
  // softmax, product), which the GPU back ends and generic kernels take.
  int attention_block;
  // Exact NCHW convolutions (conv_as_matmul) whose im2col columns for one image are
  // over this many bytes go in blocks of output rows, each block's columns at most
  // this size, copied and multiplied in one loop step (emit_window.c). 0: whole.
  int64_t conv_block_bytes;
  // The kernel's threads, where > 1: loops the emitter writes for them as scf.forall
  // (the convolutions' im2col blocks, blocked attention's heads), whose steps the
  // threads share; the CPU strategy plans what is inside a forall for one thread.
  int forall_threads;
  // Exact NCHW 3x3 convolutions with stride 1 as Winograd F(2, 3) over rows
  // (emit_winograd.c) rather than im2col blocks, where the transformed rows and the
  // products' sums of the batch, or else of one image (then a loop over the images),
  // take at most this many bytes each (jit__conv_winograd_images); 0: never.
  // conv_as_matmul kernels only.
  int64_t conv_winograd_bytes;
  // Each tensor.empty gets an attribute of its own (`jit_e = N`), so that CSE does not
  // merge the inits of many results into one tensor, whose thousands of writers made
  // one-shot bufferization's conflict analysis quadratic (3,000 outputs: 23 s).
  // Compiles set it; the export does not.
  bool distinct_empties;
} jit__emit_options;

// jit__emit_mlir with the dims mode of `options`. In symbolic mode `func_name` is made
// an MLIR identifier (non-identifier characters become '_'). Thread-safe.
jit_status jit__emit_mlir_with(const jit__lgraph *graph, const char *func_name,
                               const jit__emit_options *options, char **out_text);

// Compiles `graph` for the host CPU into `out` (entry named after `func_name`).
// Creates and destroys its own MLIR and LLVM contexts; thread-safe.
jit_status jit__compile_cpu(const jit__lgraph *graph, const char *func_name,
                           const jit__lower_options *options, jit__artifact *out);

// Where the generic CPU kernel's two paths part: calls whose first `?` dim is at least
// this run the path that packs B (its copy costs more than it saves for fewer rows:
// the MLP at N = 1 and 7 ran at 0.41-0.49x of exact packed, 0.75-0.83x unpacked; at
// N = 64-512 0.78-1.4x packed, 0.47-0.85x unpacked; 17x1000x31 0.15x packed, 0.4x not).
#define JIT__GENERIC_SPLIT_ROWS 32

// The CPU's largest im2col block (jit__emit_options.conv_block_bytes, a quarter of L2
// up to this): a block's columns stay in L2 between their copy and the matmul.
#define JIT__CONV_BLOCK_BYTES (512 * 1024)

// Compiles the generic kernel of `graph`, whose dims < 0 are symbols (jit/'s codes)
// or unknown, kept as `?` (jit__emit_options' symbolic mode; `reshape_req` as there).
// The entry takes the sizes of every argument at run time (jit__artifact). Fails with
// JIT_UNSUPPORTED where some op has no `?`-dim lowering. Thread-safe.
jit_status jit__compile_cpu_generic(const jit__lgraph *graph,
                                   const int64_t (*reshape_req)[JIT_MAX_RANK],
                                   const char *func_name, const jit__lower_options *options,
                                   jit__artifact *out);

// Whether x W^T with `rows` rows of x (W stored N x K, of f16 or f32) is best read
// through the transposed map (n, k) rather than as a transpose of W and a plain matmul
// (lowering/cpu/, plan_matmul_bt): emit_matmul.c writes graphs that way, and the CPU
// strategy rewrites imported modules to it (jit__cpu_normalize).
bool jit__cpu_bt_map(int64_t rows, int64_t k, bool f16);

#endif  // JITML_LOWERING_LOWER_H_
