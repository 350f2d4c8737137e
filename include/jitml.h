//===--- jitml.h - libjitml public API -------------------------------------===//
//
// libjitml: a JIT compiler for tensor graphs with dynamic shapes. A graph is built
// once with symbolic dims; at the first jit_run for a new set of concrete shapes it is
// specialized for exactly those shapes, lowered through MLIR and compiled with LLVM,
// and every later call with the same shapes runs the compiled kernel directly.
//
// This header is the whole public API. Until 1.0 the API may change between minor
// versions; option structs carry a struct_size so they can grow compatibly.
//
// Conventions:
//  - Every call that can fail returns a jit_status: NULL on success, otherwise a
//    status the caller must free with jit_status_free. Output parameters named out_*
//    are set to NULL/0 first, so they are never left uninitialized.
//  - `create`/`take` give the caller ownership; `get` returns borrowed pointers.
//  - Tensors at the boundary are DLPack DLTensors; strides NULL means dense row-major.
//  - The library never prints, aborts or exits.
//
//===----------------------------------------------------------------------===//
#ifndef JITML_H_
#define JITML_H_

#include <stddef.h>
#include <stdint.h>

#include <dlpack/dlpack.h>

#if defined(_WIN32)
#define JIT_API __declspec(dllexport)
#else
#define JIT_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define JIT_VERSION_MAJOR 0
#define JIT_VERSION_MINOR 1
#define JIT_VERSION_PATCH 0
#define JIT_VERSION_NUMBER \
  (JIT_VERSION_MAJOR * 1000000 + JIT_VERSION_MINOR * 1000 + JIT_VERSION_PATCH)

// Largest tensor rank a graph value may have.
#define JIT_MAX_RANK 8

// Graph size: at most JIT_MAX_NODES values (inputs, constants and ops; for a graph from
// MLIR, operations in its module) and JIT_MAX_GRAPH_IO inputs and JIT_MAX_GRAPH_IO
// outputs (results). Past them the builder records JIT_RESOURCE_EXHAUSTED (returned by
// jit_graph_finalize) and jit_graph_from_mlir returns it, naming the limit. Compile
// time grows with graph size (README, "Compile time of large graphs": 10,000 chained
// adds 3.4 s, 1,000 outputs 1.6 s on a 2-core Xeon); the limits keep one graph's
// compile within minutes.
#define JIT_MAX_NODES 65536
#define JIT_MAX_GRAPH_IO 4096

// Largest tensor, in bytes (2^48 = 256 TiB), that a run binds: every input, output
// and intermediate value. Larger shapes, and shapes whose element count overflows
// int64, are refused with JIT_RESOURCE_EXHAUSTED before anything is allocated or
// compiled. The bound keeps every byte count and offset of a kernel far from wrapping.
#define JIT_MAX_TENSOR_BYTES ((uint64_t)1 << 48)

//===--- Status ----------------------------------------------------------===//

typedef enum jit_status_code {
  JIT_OK = 0,
  JIT_INVALID_ARGUMENT = 1,   // a bad argument: NULL pointer, bad axis, bad perm, ...
  JIT_SHAPE_MISMATCH = 2,     // shapes do not agree (ranks, dims, symbol bindings)
  JIT_DTYPE_MISMATCH = 3,     // element types do not agree
  JIT_UNSUPPORTED = 4,        // valid but not supported (yet): dtype, strides, device
  JIT_PARSE_ERROR = 5,        // text that could not be parsed
  JIT_COMPILE_ERROR = 6,      // MLIR or LLVM failed to compile a kernel
  JIT_DEVICE_ERROR = 7,       // a device failed to load or run a kernel
  JIT_UNAVAILABLE = 8,        // a backend or resource is not present on this machine
  JIT_CACHE_ERROR = 9,        // the kernel cache failed
  JIT_RESOURCE_EXHAUSTED = 10,// out of memory or another limit
  JIT_INTERNAL = 11,          // a bug in libjitml
} jit_status_code;

// A failed operation. NULL means success. Owned by the caller; free with
// jit_status_free. Thread-compatible: one status is used by one thread at a time.
typedef struct jit_status_s *jit_status;

// The code of `status` (JIT_OK for NULL).
JIT_API jit_status_code jit_status_get_code(jit_status status);
// The message of `status`: what failed and where. Borrowed; valid until the status is
// freed. "" for NULL.
JIT_API const char *jit_status_message(jit_status status);
// A short constant name for a code, e.g. "SHAPE_MISMATCH".
JIT_API const char *jit_status_code_name(jit_status_code code);
// Frees `status`; NULL is a no-op.
JIT_API void jit_status_free(jit_status status);

//===--- Version ---------------------------------------------------------===//

// The version of the library linked, e.g. "0.1.0".
JIT_API const char *jit_version(void);
// JIT_VERSION_NUMBER of the library linked.
JIT_API int jit_version_number(void);

//===--- Context ---------------------------------------------------------===//

// Holds compiled kernels, options and statistics. Thread-safe: graphs of one context
// may be built and run from several threads at once.
typedef struct jit_context jit_context;

typedef enum jit_log_level {
  JIT_LOG_ERROR = 0,
  JIT_LOG_WARNING = 1,
  JIT_LOG_INFO = 2,
  JIT_LOG_DEBUG = 3,
} jit_log_level;

// Receives the library's log lines. Called from any thread that runs library code.
typedef void (*jit_log_fn)(void *user_data, jit_log_level level, const char *message);

// Largest jit_options.num_threads.
#define JIT_MAX_THREADS 4096

// How a graph with symbolic dims gets a kernel for a binding it has not seen
// (README, "Shape policies").
typedef enum jit_shape_policy {
  // The default. A new binding runs at once on the graph's generic kernel (compiled
  // once per graph and device with its symbolic dims kept as `?`, or found on disk); a
  // binding called options.specialize_after times gets a kernel of its own, compiled
  // on a background thread, which later calls switch to. Specialized kernels found on
  // disk are used directly.
  JIT_SHAPE_POLICY_AUTO = 0,
  // Every binding gets its own kernel before its first result (compiled or from disk).
  JIT_SHAPE_POLICY_EXACT = 1,
  // Only the generic kernel: no specialization, no exact kernels.
  JIT_SHAPE_POLICY_GENERIC = 2,
} jit_shape_policy;

// Where MLIR text from outside is imported and compiled (jit_graph_from_mlir and the
// kernels of graphs made from it): AUTO isolates where the `jitml-worker` helper is
// installed (next to libjitml.so, in ../libexec/jitml, or $JITML_WORKER) and logs a
// warning once where it is not; ON requires it (JIT_UNAVAILABLE without); OFF works
// in this process. Isolated, a text that crashes or hangs MLIR or LLVM costs a status
// (JIT_PARSE_ERROR when importing, JIT_COMPILE_ERROR when compiling, with the worker's
// last words), not the process. ALL is ON for every graph: the exact kernels of graphs
// built with the C API compile in the worker too (from their MLIR export; generic
// kernels and GPU kernels compile in this process). Compiles need a writable disk
// cache to come back through; without one they run here. $JITML_ISOLATION=
// on|off|auto|all overrides AUTO.
typedef enum jit_isolation {
  JIT_ISOLATION_AUTO = 0,
  JIT_ISOLATION_OFF = 1,
  JIT_ISOLATION_ON = 2,
  JIT_ISOLATION_ALL = 3,
} jit_isolation;

// How CPU kernels compute convolutions (jit_conv2d). AUTO: a 3x3 stride-1 one-group
// NCHW convolution whose transformed rows fit the host's L2 runs as Winograd F(4, 3)
// or F(2, 3) over rows (fewer multiplications, results within ~1e-5 relative of the
// exact sums, ~3x a plain f32 sum's rounding: README, support table note 3); every
// other one as im2col + matmul. IM2COL: every convolution as im2col + matmul, each
// output a plain sum of its C x KH x KW products. Part of the kernel key.
// $JITML_CONV_ALGORITHM=auto|im2col overrides the option. GPU backends and generic
// kernels never use Winograd.
typedef enum jit_conv_algorithm {
  JIT_CONV_ALGORITHM_AUTO = 0,
  JIT_CONV_ALGORITHM_IM2COL = 1,
} jit_conv_algorithm;

typedef struct jit_options {
  // sizeof(jit_options), set by jit_options_init. Lets the struct grow.
  size_t struct_size;
  // 0 = debug pipeline (plain loops), 1-3 = optimized (default 2).
  int opt_level;
  // Threads a CPU kernel may use, in [0, JIT_MAX_THREADS]; 0 = all online cores. Large matmuls, elementwise
  // chains and row reductions are split across them with OpenMP (LLVM's libomp, loaded
  // on first use; without it kernels run on one thread). Results do not depend on the
  // thread count: no reduction is split. Part of the kernel key.
  int num_threads;
  // Log callback; NULL = silent, unless JITML_LOG=debug|info|warning|error is set in
  // the environment, which logs to stderr.
  jit_log_fn log_fn;
  void *log_user_data;
  jit_log_level log_level;  // JIT_LOG_ERROR .. JIT_LOG_DEBUG
  // On-disk kernel cache directory. NULL: $JITML_CACHE_DIR, else
  // $XDG_CACHE_HOME/jitml, else ~/.cache/jitml. "" turns the disk cache off.
  const char *cache_dir;
  // Size limit of the disk cache in bytes; 0 = $JITML_CACHE_MAX_BYTES, else 1 GiB.
  // Least recently used entries are evicted past it. At most INT64_MAX.
  uint64_t cache_max_bytes;
  // Entries unused for longer than this many seconds are evicted; 0 = no age limit.
  // At most INT64_MAX / 10^9 (about 292 years).
  uint64_t cache_max_age_s;
  // Accept a cache directory owned by root that this process cannot write, and use
  // it read-only (a shared, prewarmed cache). Directories writable by other users are
  // always refused: loading object code from them would run their code. 0 or 1.
  int cache_allow_shared_readonly;
  // If non-NULL (or $JITML_DUMP_IR is set), every compile writes the IR of each stage
  // there as numbered files named by kernel key.
  const char *dump_ir_dir;
  // Where jit_run runs graphs whose inputs are host (kDLCPU) tensors: NULL or "cpu"
  // for the CPU; "vulkan" or "vulkan:<index>", "cuda" or "cuda:<index>" to upload the
  // inputs, run on that device and download the outputs. Tensors allocated on a device
  // (jit_tensor_alloc) always run on their device.
  const char *device;
  // CUDA toolkit directory whose bin/ptxas assembles each CUDA kernel's PTX into a
  // cubin for the device's SM, cached next to the PTX (loaded first; the PTX, which the
  // driver JIT-compiles, is the fallback). NULL: $CUDA_HOME, else $CUDA_PATH, else
  // /usr/local/cuda, else ptxas on $PATH. "" : no toolkit (PTX only). Without a ptxas,
  // or when it fails, kernels ship as PTX alone and the reason is logged. A directory's
  // ptxas is looked for once per process. Copied.
  const char *cuda_toolkit;
  // The shape policy of graphs that set none (jit_graph_set_shape_policy), overridden
  // by $JITML_SHAPE_POLICY=auto|exact|generic. Graphs without symbolic dims, graphs
  // from MLIR and runs on a GPU use EXACT (README's support table).
  jit_shape_policy shape_policy;
  // AUTO: the calls of one binding after which it is specialized; 0 = 4.
  // In [0, 1000000].
  int specialize_after;
  // AUTO: the most specialized kernels one graph gets; past it the graph's other
  // bindings stay on its generic kernel (logged once). 0 = 64. In [0, 1000000].
  int max_specializations;
  // Kernels a context keeps loaded, and their bytes of object code; past either, the
  // least recently used are unloaded (the next call of their binding loads it from
  // the disk cache, or runs the generic kernel). A graph's generic kernel is never
  // unloaded. 0 = 1024 kernels and 256 MiB. Kernels at most 1000000.
  int max_loaded_kernels;
  uint64_t max_loaded_kernel_bytes;
  // Public keys (64 hex digits each, separated by commas or spaces) of the signers
  // whose bundles jit_cache_import accepts: with any, an unsigned bundle, one signed by
  // another key or one altered after signing is refused (JIT_CACHE_ERROR). NULL:
  // $JITML_TRUSTED_KEYS; "" or unset: any intact bundle is imported (README, "Signed
  // bundles"). At most 16 keys; a malformed list is JIT_INVALID_ARGUMENT. Read once.
  const char *bundle_trusted_keys;
  // Compile isolation of MLIR text (jit_isolation, above). The worker's time limit per
  // import or compile in ms (0 = 300000) and address-space limit in bytes (0 = none;
  // at least 1 GiB when set: LLVM maps much more than it touches).
  jit_isolation mlir_isolation;
  uint64_t isolation_timeout_ms;
  uint64_t isolation_max_bytes;
  // The fleet cache (README, "Fleet cache"): a Redis server behind the disk cache,
  // shared by many machines. "redis://[[user]:password@]host[:port][/db]" or
  // "unix:///path/to/socket[?db=N]"; NULL: $JITML_REMOTE_CACHE; "" or unset: none.
  // A disk miss asks the server; a compiled kernel is pushed to it in the background;
  // a value from it is verified like a disk entry (and its signature checked against
  // bundle_trusted_keys when any are set), then stored on disk. It needs the disk
  // cache. A malformed URL is JIT_INVALID_ARGUMENT; rediss:// or a build without
  // hiredis, JIT_UNAVAILABLE. The server failing never fails a run. Copied.
  const char *remote_cache;
  // Prefix of every key on the server; NULL: $JITML_REMOTE_PREFIX, else "jitml:".
  const char *remote_prefix;
  // Time limits of connecting and of each command's socket reads and writes, in ms
  // (0 = 250 and 500). A command that times out pauses the tier at once.
  uint32_t remote_connect_timeout_ms;
  uint32_t remote_timeout_ms;
  // Failures in a row after which the tier pauses, and for how long, in ms
  // (0 = 3 and 30000).
  uint32_t remote_failures_to_pause;
  uint32_t remote_pause_ms;
  // Seconds a value lives on the server (0 = no expiry), and the largest value pushed
  // or accepted in bytes (0 = 64 MiB).
  uint64_t remote_ttl_s;
  uint64_t remote_max_bytes;
  // How long a compile waits while another machine compiles the same kernel (the
  // fleet lock), in ms: 0 = 30000; -1 = no fleet lock. In [-1, 3600000].
  int remote_lock_wait_ms;
  // Secret key file (jit_bundle_keygen) that signs every entry pushed; NULL:
  // $JITML_REMOTE_SIGNING_KEY; "" or unset: entries are pushed unsigned. A missing,
  // malformed or group/other-readable file is JIT_INVALID_ARGUMENT. Read once.
  const char *remote_signing_key;
  // Convolutions on the CPU (jit_conv_algorithm, above); JIT_CONV_ALGORITHM_AUTO by
  // default.
  jit_conv_algorithm conv_algorithm;
} jit_options;

// Fills `options` with defaults. Always call it before setting fields.
JIT_API void jit_options_init(jit_options *options);

// Creates a context. `options` may be NULL for defaults and is copied.
// Returns JIT_INVALID_ARGUMENT (NULL out_ctx, bad struct_size, or a field outside the
// range its comment gives; the message names the field), JIT_RESOURCE_EXHAUSTED.
JIT_API jit_status jit_context_create(const jit_options *options, jit_context **out_ctx);
// Destroys `ctx` and its compiled kernels. Every graph of it must be destroyed first.
// NULL is a no-op.
JIT_API void jit_context_destroy(jit_context *ctx);

typedef struct jit_stats {
  size_t struct_size;
  uint64_t runs;            // jit_run calls that ran a kernel
  uint64_t memory_hits;     // runs served by an already loaded kernel
  uint64_t misses;          // runs that found no loaded kernel for their key
  uint64_t compiles;        // kernels compiled (one per key, however many threads ask)
  double compile_ms;        // total time spent compiling
  uint64_t kernels;         // kernels loaded now
  uint64_t disk_hits;       // kernels loaded from the disk cache instead of compiled
  double load_ms;           // total time spent loading kernels from the disk cache
  uint64_t bytes_written;   // bytes written to the disk cache
  uint64_t bytes_read;      // bytes read from the disk cache
  uint64_t evictions;       // entries removed by the size or age limit
  uint64_t bad_entries;     // corrupt or foreign entries found, removed and recompiled
  uint64_t cuda_cubin_loads;  // CUDA kernels loaded from a cubin (no driver JIT)
  uint64_t cuda_ptx_loads;    // CUDA kernels loaded from PTX (JIT-compiled by the
                              // driver: no cubin, or the driver refused it; logged)
  uint64_t generic_runs;      // runs served by a graph's generic kernel
  uint64_t generic_compiles;  // generic kernels compiled (not found on disk)
  uint64_t specializations;   // bindings given their own kernel in the background
  uint64_t specialization_failures;  // background compiles that failed (logged; the
                                     // binding stays on the generic kernel)
  uint64_t specializations_pending;  // background compiles queued or running now
  uint64_t kernels_unloaded;  // kernels unloaded to stay within options.max_loaded_kernels
                              // and max_loaded_kernel_bytes (least recently used first)
  // The fleet cache (options.remote_cache). A remote hit is stored on disk and then
  // loaded, so it counts in disk_hits too.
  uint64_t remote_hits;          // values fetched, verified and used
  uint64_t remote_misses;        // lookups the server had nothing for
  uint64_t remote_errors;        // commands that failed or timed out (runs went on)
  uint64_t remote_skipped;       // lookups and pushes skipped while the tier was paused
  uint64_t remote_rejected;      // values refused: damaged, another key's, another
                                 // version, oversize, unsigned or untrusted (logged)
  uint64_t remote_puts;          // entries pushed
  uint64_t remote_puts_dropped;  // entries not pushed: too large, queue full, paused
                                 // or failed
  uint64_t remote_bytes_read;
  uint64_t remote_bytes_written;
  uint64_t weight_packs;         // packed copies of weights made (jit_weight): one per
                                 // weight, and again per new pointer or change
} jit_stats;

// Copies the context's counters into `out_stats` (whose struct_size the caller sets,
// or 0 for sizeof(jit_stats)). Thread-safe.
JIT_API jit_status jit_context_stats(jit_context *ctx, jit_stats *out_stats);

// Frees a string the library returned (jit_graph_to_mlir, jit_cache_explain). NULL is
// a no-op.
JIT_API void jit_string_free(char *text);

//===--- Graphs ----------------------------------------------------------===//

// A dataflow graph of tensor ops with possibly symbolic dims. Built by one thread
// (thread-compatible), then, after jit_graph_finalize, run from any number of threads
// at once (thread-safe).
typedef struct jit_graph jit_graph;

// A value in a graph: an input or the result of an op. A small handle, passed by value.
// id is 0 for an invalid value (the result of a failed builder call).
typedef struct jit_value {
  uint32_t id;
} jit_value;

// Creates an empty graph in `ctx`. `name` (may be NULL) is used in messages and kernel
// names. Returns JIT_INVALID_ARGUMENT, JIT_RESOURCE_EXHAUSTED.
JIT_API jit_status jit_graph_create(jit_context *ctx, const char *name,
                                    jit_graph **out_graph);
// Destroys `graph`. Kernels compiled for it stay in its context until the context is
// destroyed. NULL is a no-op.
JIT_API void jit_graph_destroy(jit_graph *graph);

// A symbolic dim named `name` (letters, digits, '_'): a negative code to use in a dims
// array next to static sizes, e.g. `int64_t dims[] = {jit_symbol(g, "N"), 784};`.
// The same name returns the same code. On error returns 0 and records the error in
// the graph (see jit_graph_finalize).
JIT_API int64_t jit_symbol(jit_graph *graph, const char *name);

// Builder calls. Each returns the new value; on error it returns an invalid value
// (id 0) and records the first error in the graph ("sticky"): later builder calls
// that receive an invalid value return invalid values too, and jit_graph_finalize
// returns that first error.

// A graph input. `dtype` is f32 {kDLFloat, 32, 1}, f16 {kDLFloat, 16, 1} or bf16
// {kDLBfloat, 16, 1} (both computed in f32 and rounded once per op), or int32 / int64
// for jit_gather's indices. bf16 runs on the CPU and CUDA (sm_80+), not on Vulkan
// (JIT_UNSUPPORTED). `dims` has
// `rank` entries, each a size >= 0 or a symbol from jit_symbol. Inputs are numbered in
// the order of these calls.
JIT_API jit_value jit_input(jit_graph *graph, const char *name, DLDataType dtype,
                            int rank, const int64_t *dims);
// A graph input that holds a layer's weights: as jit_input, with a promise that the
// data it is given stays the same from call to call (same pointer, same contents).
// The CPU may then keep a re-laid-out copy of it, made on the first call, and read
// that instead (an f32 [K, N] matrix multiplied from the right, for example, as the
// panels its matrix products read: see docs/performance.md). A call with another data
// pointer makes the copy again; after writing new values into the same memory, call
// jit_graph_weights_changed. Any dtype and shape that jit_input takes.
JIT_API jit_value jit_weight(jit_graph *graph, const char *name, DLDataType dtype,
                             int rank, const int64_t *dims);
// Says that the data behind `graph`'s weights (jit_weight) changed in place: the
// copies made from them are made again on the next call. Safe to call while other
// threads run the graph (their calls use the old or the new copy, whole).
JIT_API void jit_graph_weights_changed(jit_graph *graph);
// Marks `value` as the next output of the graph.
JIT_API void jit_output(jit_graph *graph, jit_value value);
// A rank-0 constant of `dtype` that broadcasts against any tensor. Infinities are
// allowed (a mask's -inf); NaN is JIT_UNSUPPORTED.
JIT_API jit_value jit_scalar(jit_graph *graph, double value, DLDataType dtype);

// Matrix product of the last two dims: [..., M, K] x [..., K, N] -> [..., M, N]. The
// leading (batch) dims broadcast as in NumPy; a rank-2 operand is shared by every
// batch. f16 inputs accumulate in f32.
JIT_API jit_value jit_matmul(jit_graph *graph, jit_value a, jit_value b);

// Quantized matmul (symmetric: jit_matmul_int8_zp takes zero points): a [..., M, K] and b [K, N] are int8
// graph inputs ({kDLInt, 8, 1}; int8 values feed nothing else), multiplied with int32
// accumulation, then dequantized into f32: result[..., m, n] =
// (sum_k a[..., m, k] b[k, n]) * a_scale * b_scale[n]. a_scale is one f32 value (rank
// 0, or all dims 1); b_scale one value or one per column ([N], [1, N]): per-tensor or
// per-channel weights. M and the leading dims may be symbols. The CPU runs it as a
// matmul on int8 with an int32 accumulator, planned like f32 ones (AVX2 / AVX-512,
// no VNNI or AMX instructions yet).
JIT_API jit_value jit_matmul_int8(jit_graph *graph, jit_value a, jit_value b,
                                  jit_value a_scale, jit_value b_scale);
// jit_matmul_int8 with zero points (asymmetric quantization, ONNX's MatMulInteger
// and QLinearMatMul): result[..., m, n] =
// (sum_k (a[..., m, k] - a_zero) (b[k, n] - b_zero[n])) * a_scale * b_scale[n], the
// sums exact in int32 (as sum a b - b_zero sum_k a - a_zero sum_k b + K a_zero
// b_zero). a_zero is one int8 value; b_zero one or one per column of b, like b_scale;
// either may be a value with id 0 (none: zero). Both none is jit_matmul_int8.
JIT_API jit_value jit_matmul_int8_zp(jit_graph *graph, jit_value a, jit_value b,
                                     jit_value a_scale, jit_value b_scale, jit_value a_zero,
                                     jit_value b_zero);

// Elementwise binary ops with NumPy broadcasting (dims aligned from the right; a dim
// of static size 1 broadcasts). Two symbolic dims that meet must bind to equal sizes.
JIT_API jit_value jit_add(jit_graph *graph, jit_value a, jit_value b);
JIT_API jit_value jit_sub(jit_graph *graph, jit_value a, jit_value b);
JIT_API jit_value jit_mul(jit_graph *graph, jit_value a, jit_value b);
JIT_API jit_value jit_div(jit_graph *graph, jit_value a, jit_value b);
JIT_API jit_value jit_maximum(jit_graph *graph, jit_value a, jit_value b);
JIT_API jit_value jit_minimum(jit_graph *graph, jit_value a, jit_value b);
// a^b with C's pow special cases: a negative a to an integer b gives the signed
// result (pow(-2, 3) = -8, pow(-0, -1) = -inf), a finite negative a to a non-integer
// b NaN, pow(x, 0) = pow(1, y) = 1 (even for NaN), pow(-1, +-inf) = 1. Computed as
// exp(b log|a|) in f32: within 2e-6 (relative) of the exact result where
// |b log|a|| < 16.
JIT_API jit_value jit_pow(jit_graph *graph, jit_value a, jit_value b);
// Comparisons, broadcasting like the ops above: 1 where the comparison holds, else 0,
// in the operands' dtype (a mask to multiply by or to give jit_where). A NaN compares
// unequal to everything: only jit_not_equal holds for it.
JIT_API jit_value jit_less(jit_graph *graph, jit_value a, jit_value b);
JIT_API jit_value jit_less_equal(jit_graph *graph, jit_value a, jit_value b);
JIT_API jit_value jit_greater(jit_graph *graph, jit_value a, jit_value b);
JIT_API jit_value jit_greater_equal(jit_graph *graph, jit_value a, jit_value b);
JIT_API jit_value jit_equal(jit_graph *graph, jit_value a, jit_value b);
JIT_API jit_value jit_not_equal(jit_graph *graph, jit_value a, jit_value b);
// a where cond is nonzero (NaN counts as nonzero), else b; all three broadcast
// together and share one dtype. Only the chosen value is read: where(m, x, -inf)
// masks without the NaNs that m * x + (1 - m) * -inf would make.
JIT_API jit_value jit_where(jit_graph *graph, jit_value cond, jit_value a, jit_value b);
// Scaled dot-product attention, softmax(q k^T * scale + mask) v over the keys:
// q [..., S, D], k [..., T, D], v [..., T, Dv] with equal leading dims -> [..., S, Dv].
// `mask` (id 0: none) is added to the scores and broadcasts to [..., S, T] (0 / -inf
// masks, or any bias). With `causal`, query i sees keys j <= i + T - S (the last query
// sees every key, so a decode step against a cache needs no mask). scale 0 means
// 1 / sqrt(D) (D static). Computed in f32. On the CPU an exact kernel walks the keys in
// blocks of 64 with a running max and sum: the S x T scores are never made whole
// (generic kernels and the GPU back ends make them). A row whose every key is masked
// is NaN, as in PyTorch.
JIT_API jit_value jit_attention(jit_graph *graph, jit_value q, jit_value k, jit_value v,
                                jit_value mask, double scale, int causal);
// x converted to `dtype` among f32, f16, bf16, int8, int32 and int64. Between floats:
// narrowing rounds to nearest even (overflow to inf), widening is exact. Float to
// integer: truncated toward zero and saturated to the integer's range, NaN gives 0
// (C leaves both undefined). Integer to float: rounded to nearest even (overflow to
// inf). Integer to integer: sign-extended or wrapped (as NumPy and PyTorch do). The
// same dtype is x itself. An integer result feeds jit_gather's indices,
// jit_matmul_int8 (quantizing inside a graph), another jit_cast or jit_output (an
// integer input cannot be an output as it is); other
// ops refuse it (JIT_DTYPE_MISMATCH). Vulkan has no int8 (JIT_UNSUPPORTED there).
JIT_API jit_value jit_cast(jit_graph *graph, jit_value x, DLDataType dtype);
// Rows of `table` picked by `indices` (an embedding lookup; axis 0):
// result[i..., j...] = table[indices[i...], j...], of shape indices' dims followed by
// table's dims after the first. `indices` is int32 or int64 ({kDLInt, 32 or 64, 1}): a
// graph input, or a jit_cast. jit_run checks every index of a host input against the
// table's rows for the binding first: one outside [0, rows) is JIT_INVALID_ARGUMENT
// naming it, and nothing runs. Indices it does not read on the host (in GPU memory, or
// computed by a cast) are clamped into range by the kernel instead, so it never reads
// outside the table.
JIT_API jit_value jit_gather(jit_graph *graph, jit_value table, jit_value indices);
// jit_gather along `axis` of the table (negative counts from the end), as
// numpy.take(table, indices, axis): the result is table's dims before `axis`, then the
// indices' dims, then table's dims after `axis`. jit_gather is axis 0. The same index
// rules (an index outside [0, dim) is JIT_INVALID_ARGUMENT before any kernel runs).
JIT_API jit_value jit_gather_axis(jit_graph *graph, jit_value table, jit_value indices,
                                  int axis);

// Elementwise unary ops. f16 is computed in f32 and rounded once.
JIT_API jit_value jit_neg(jit_graph *graph, jit_value x);
JIT_API jit_value jit_exp(jit_graph *graph, jit_value x);
JIT_API jit_value jit_log(jit_graph *graph, jit_value x);
JIT_API jit_value jit_tanh(jit_graph *graph, jit_value x);
JIT_API jit_value jit_sigmoid(jit_graph *graph, jit_value x);
JIT_API jit_value jit_relu(jit_graph *graph, jit_value x);
// gelu, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
JIT_API jit_value jit_gelu(jit_graph *graph, jit_value x);
// erf, within 4.2e-7 of the exact function (absolute and relative) over all f32; and
// gelu in erf form, 0.5 x (1 + erf(x / sqrt(2))), PyTorch's default gelu.
JIT_API jit_value jit_erf(jit_graph *graph, jit_value x);
// x rounded to the nearest integer, ties to even (as C's nearbyint in the default mode,
// NumPy's round and torch.round; a quantizer's rounding before jit_cast to int8).
// Infinities and NaN pass through.
JIT_API jit_value jit_round(jit_graph *graph, jit_value x);
JIT_API jit_value jit_gelu_erf(jit_graph *graph, jit_value x);
JIT_API jit_value jit_sqrt(jit_graph *graph, jit_value x);
JIT_API jit_value jit_rsqrt(jit_graph *graph, jit_value x);

// Reductions over `axis` (negative counts from the end). keepdims != 0 keeps the
// reduced dim with size 1. f16 accumulates in f32.
JIT_API jit_value jit_reduce_sum(jit_graph *graph, jit_value x, int axis, int keepdims);
JIT_API jit_value jit_reduce_max(jit_graph *graph, jit_value x, int axis, int keepdims);
JIT_API jit_value jit_reduce_mean(jit_graph *graph, jit_value x, int axis, int keepdims);
// exp(x - max) / sum(exp(x - max)) along `axis`: safe for large inputs.
JIT_API jit_value jit_softmax(jit_graph *graph, jit_value x, int axis);
// Normalizations over the last axis, built from the ops above (so they run wherever
// those do; f16 and bf16 graphs keep 16-bit intermediates). `weight` and `bias` are
// optional (a value with id 0: none), rank-1 tensors as long as x's last dim (else
// JIT_SHAPE_MISMATCH); eps must be finite and >= 0.
// layer_norm: (x - mean) / sqrt(var + eps) * weight + bias, var the biased variance.
JIT_API jit_value jit_layer_norm(jit_graph *graph, jit_value x, jit_value weight,
                                 jit_value bias, double eps);
// rms_norm: x / sqrt(mean(x^2) + eps) * weight.
JIT_API jit_value jit_rms_norm(jit_graph *graph, jit_value x, jit_value weight, double eps);
// min(max(x, lo), hi); an infinite bound is no bound. lo > hi or NaN:
// JIT_INVALID_ARGUMENT.
JIT_API jit_value jit_clamp(jit_graph *graph, jit_value x, double lo, double hi);
// Sliding windows over the two spatial dims of a rank-4 tensor.
typedef enum jit_layout {
  JIT_LAYOUT_NCHW = 0,  // x [N, C, H, W]; conv weight [F, C/groups, KH, KW] (PyTorch)
  JIT_LAYOUT_NHWC = 1,  // x [N, H, W, C]; conv weight [KH, KW, C/groups, F] (TF, linalg)
} jit_layout;

// Set with jit_window_params_init first (NCHW, stride 1, dilation 1, groups 1, no
// padding, count_include_pad 1), then change what differs. Output size per spatial
// dim: (in + pad_lo + pad_hi - dilation (k - 1) - 1) / stride + 1, rounded down
// (a window that does not fit the padded input once: JIT_SHAPE_MISMATCH).
typedef struct jit_window_params {
  jit_layout layout;
  int kernel[2];         // pools: window height, width (conv: from the weight)
  int stride[2];         // height, width: >= 1
  int padding[4];        // top, bottom, left, right: >= 0 (pools: < kernel)
  int dilation[2];       // >= 1 (avg pool: 1)
  int groups;            // conv: divides C and F; C groups is depthwise
  int count_include_pad; // avg pool: padded positions count in the divisor (PyTorch's
                         // default); 0: divide by the input positions only (ONNX's)
} jit_window_params;
JIT_API void jit_window_params_init(jit_window_params *params);

// 2-D convolution (cross-correlation, as PyTorch and ONNX): no bias (add one with
// jit_add). Padding is zeros. Channels and every weight dim must be static (else
// JIT_UNSUPPORTED); batch, height and width may be symbols. f16 accumulates in f32.
// Bad params: JIT_INVALID_ARGUMENT; shapes that do not match: JIT_SHAPE_MISMATCH.
JIT_API jit_value jit_conv2d(jit_graph *graph, jit_value x, jit_value weight,
                             const jit_window_params *params);
// Pooling over params->kernel windows: max (padding never wins) and average.
JIT_API jit_value jit_max_pool2d(jit_graph *graph, jit_value x,
                                 const jit_window_params *params);
JIT_API jit_value jit_avg_pool2d(jit_graph *graph, jit_value x,
                                 const jit_window_params *params);
// Joins `n` values (same dtype and rank) along `axis` (negative counts from the end);
// every other dim must be equal (symbols: equal at run time).
JIT_API jit_value jit_concat(jit_graph *graph, const jit_value *values, int n, int axis);
// Elements start, start + step, ... before stop along `axis`, NumPy's x[start:stop:step]:
// a negative bound counts from the end, bounds are clamped to the dim, step >= 1
// (JIT_SLICE_END: to the end). The dim may be symbolic; the bounds are fixed numbers
// (jit_slice_symbolic: bounds that follow a symbol).
// A slice that is empty for a binding is JIT_SHAPE_MISMATCH (empty values are not
// supported).
#define JIT_SLICE_END INT64_MAX
JIT_API jit_value jit_slice(jit_graph *graph, jit_value x, int axis, int64_t start,
                            int64_t stop, int64_t step);
// jit_slice with bounds that follow a symbol: start is `start` plus, when start_symbol
// is a symbol from jit_symbol (0: none), that symbol's size in the binding; stop the
// same. The sums then follow jit_slice's rules (a negative one counts from the end,
// both are clamped), e.g. x[:, :S] (stop_symbol S, stop 0) or a cache's x[P - 1 : P + 1]
// (symbols P, offsets -1 and 1). A symbol must be a dim of some input (else
// JIT_INVALID_ARGUMENT at finalize), an offset next to a symbol within +-2^40.
JIT_API jit_value jit_slice_symbolic(jit_graph *graph, jit_value x, int axis,
                                     int64_t start_symbol, int64_t start,
                                     int64_t stop_symbol, int64_t stop, int64_t step);
// Constant padding: low[d] elements of `value` before dim d and high[d] after (each in
// [0, 2^30]; rank(x) entries).
JIT_API jit_value jit_pad(jit_graph *graph, jit_value x, const int64_t *low,
                          const int64_t *high, double value);
// How jit_pad_with fills: with `value`; by mirroring x without repeating its edge
// ([a b c d] padded by 2 each side: c b | a b c d | c b, PyTorch's "reflect", where
// each pad must be below its dim's size); by repeating the edge element (PyTorch's
// "replicate", for dims of at least one element); by wrapping around (c d | a b c d |
// a b, PyTorch's "circular", where each pad is at most its dim's size).
typedef enum jit_padding {
  JIT_PAD_CONSTANT = 0,
  JIT_PAD_REFLECT = 1,
  JIT_PAD_REPLICATE = 2,
  JIT_PAD_CIRCULAR = 3,
} jit_padding;
// jit_pad with a jit_padding (`value` is read for JIT_PAD_CONSTANT only). A reflect pad
// that is not below its dim's size, a circular pad over it, or a replicate or circular
// pad of an empty dim, is JIT_SHAPE_MISMATCH (when building, or for the binding whose
// size breaks it).
JIT_API jit_value jit_pad_with(jit_graph *graph, jit_value x, const int64_t *low,
                               const int64_t *high, jit_padding how, double value);
// Permutes dims: result dim i is input dim perm[i]. `perm` has rank(x) entries.
JIT_API jit_value jit_transpose(jit_graph *graph, jit_value x, const int *perm);
// Same elements, new shape. `dims` may hold symbols and at most one -1 (inferred).
// The element count must match at run time.
JIT_API jit_value jit_reshape(jit_graph *graph, jit_value x, int rank, const int64_t *dims);

// Checks the graph and freezes it. Returns the first builder error if any
// (JIT_INVALID_ARGUMENT, JIT_SHAPE_MISMATCH, JIT_DTYPE_MISMATCH, ...), or
// JIT_INVALID_ARGUMENT if the graph has no outputs. Required before running.
JIT_API jit_status jit_graph_finalize(jit_graph *graph);

// Sets the shape policy of `graph`, overriding the context's (options.shape_policy and
// $JITML_SHAPE_POLICY) for it; affects bindings not seen yet. Thread-safe.
// JIT_INVALID_ARGUMENT for a value that is not a jit_shape_policy.
JIT_API jit_status jit_graph_set_shape_policy(jit_graph *graph, jit_shape_policy policy);

// Creates a graph from MLIR text: a module whose function `entry_name` (NULL: the only
// or first public func.func) takes and returns ranked tensors of f32/f16 with static
// and `?` dims, its body in the func, arith, math, tensor, linalg and tosa dialects.
// Each `?` dim becomes a symbol; an argument attribute `jit.dims = ["N", 784]` names
// dims so that equal names must bind to equal sizes. At run time the function is
// specialized for the concrete input shapes. The graph is returned finalized.
// `text` need not be NUL-terminated. Returns JIT_PARSE_ERROR (with "line:col" of the
// MLIR diagnostics), JIT_INVALID_ARGUMENT (missing entry, non-tensor argument),
// JIT_UNSUPPORTED (dialect, op or element type), JIT_RESOURCE_EXHAUSTED for text over
// 256 MiB.
JIT_API jit_status jit_graph_from_mlir(jit_context *ctx, const char *text, size_t length,
                                       const char *entry_name, jit_graph **out_graph);
// As jit_graph_from_mlir, reading the text from the file at `path`, whose name then
// appears in messages ("model.mlir:12:5: error: ..."). Also returns
// JIT_INVALID_ARGUMENT when the file cannot be opened or read or is not a regular file
// (a FIFO, a device such as /dev/zero, a directory: refused without reading them), and
// JIT_RESOURCE_EXHAUSTED for a file over 256 MiB.
JIT_API jit_status jit_graph_from_mlir_file(jit_context *ctx, const char *path,
                                            const char *entry_name,
                                            jit_graph **out_graph);
// Runs a pass pipeline on MLIR text as `mlir-opt --pass-pipeline=...` does, with
// libjitml's own passes available by name among MLIR's (jitml-lower-matmul-to-loops:
// every 2-D linalg.matmul on memrefs as scf.for loops of arith.mulf/addf in the
// accumulator's type, f32 and f16), and writes the printed result to *out_text (free
// with jit_string_free): a compiler engineer's tool (`jitml opt`) to run and test one
// pass at a time. `pipeline` may leave out the outer builtin.module(...). `source_name`
// (may be NULL) names the text in messages. Returns JIT_PARSE_ERROR (with line:col),
// JIT_INVALID_ARGUMENT (NULL arguments; a pipeline element that does not parse, named),
// JIT_COMPILE_ERROR (a pass failed, with its diagnostics), JIT_RESOURCE_EXHAUSTED (text
// over 256 MiB).
JIT_API jit_status jit_mlir_opt(const char *text, size_t length, const char *pipeline,
                                const char *source_name, char **out_text);
// Writes `graph` (finalized) as MLIR text: a module with one func.func on tensors whose
// `?` dims carry the symbol names in `jit.dims`. Free with jit_string_free.
JIT_API jit_status jit_graph_to_mlir(jit_graph *graph, char **out_text);

// The dtype of output `index` of `graph` (finalized). Returns JIT_INVALID_ARGUMENT
// for a bad index.
JIT_API jit_status jit_output_dtype(const jit_graph *graph, int index,
                                    DLDataType *out_dtype);

// The context `graph` belongs to (borrowed).
JIT_API jit_context *jit_graph_context(const jit_graph *graph);

// Number of inputs / outputs of a graph.
JIT_API int jit_graph_num_inputs(const jit_graph *graph);
JIT_API int jit_graph_num_outputs(const jit_graph *graph);

// What a graph input expects. `name` is borrowed from the graph. dims[i] is a size, or
// a symbol code (negative) whose name jit_symbol_name gives.
typedef struct jit_input_info {
  const char *name;
  DLDataType dtype;
  int rank;
  int64_t dims[JIT_MAX_RANK];
} jit_input_info;

// Describes input `index` of `graph`. Returns JIT_INVALID_ARGUMENT for a bad index.
JIT_API jit_status jit_graph_input_info(const jit_graph *graph, int index,
                                        jit_input_info *out_info);
// The name of symbol `code` in `graph` (borrowed), or NULL if it is not a symbol.
JIT_API const char *jit_symbol_name(const jit_graph *graph, int64_t code);

// An output dim that no binding-free rule gives (see jit_output_info).
#define JIT_DIM_UNKNOWN INT64_MIN

// What a graph output is before any binding: its dtype, rank and dims. dims[i] is a
// size; a symbol code (negative, jit_symbol_name names it) where that dim is exactly
// an input symbol (a batch N passed through); or JIT_DIM_UNKNOWN where it is derived
// from the inputs (a concat's N + M, a convolution's output rows, a `?` of an MLIR
// result), which only a binding gives (jit_output_shape). Host frameworks use it to
// state output shapes symbolically while tracing (PyTorch's fake tensors).
typedef struct jit_output_info {
  DLDataType dtype;
  int rank;
  int64_t dims[JIT_MAX_RANK];
} jit_output_info;

// Describes output `index` of `graph` (finalized). Returns JIT_INVALID_ARGUMENT for a
// bad index or a graph that is not finalized.
JIT_API jit_status jit_graph_output_info(const jit_graph *graph, int index,
                                         jit_output_info *out_info);

//===--- Running ---------------------------------------------------------===//

// The shape function: binds the symbols from `inputs` (only shape and dtype are read;
// data may be NULL) and writes output `index`'s rank and dims (JIT_MAX_RANK entries).
// Compiles nothing. Returns the same binding errors as jit_run.
JIT_API jit_status jit_output_shape(jit_graph *graph, const DLTensor *inputs,
                                    int n_inputs, int index, int *out_rank,
                                    int64_t *out_dims);

// Runs `graph` on `inputs` writing `outputs`, which the caller allocated with exactly
// the output shapes (see jit_output_shape) and dtypes. CPU tensors, dense row-major
// (strides NULL or dense). At the first call for a set of input shapes the graph is
// compiled for them (once, even when several threads ask at once); later calls with
// those shapes run the compiled kernel. Outputs must not overlap inputs or each other
// (on the CPU an overlap is refused with JIT_INVALID_ARGUMENT). Thread-safe.
//
// Limits: rank at most JIT_MAX_RANK; every input, output and intermediate value at
// most JIT_MAX_TENSOR_BYTES (2^48) bytes, its element count within int64. A binding
// past them is refused with JIT_RESOURCE_EXHAUSTED naming the tensor (input index and
// name, output index, or node) and its shape, before anything is compiled or written.
//
// Zero-size tensors (a dim of 0) are accepted. A binding with an empty input runs no
// kernel: it succeeds, writing nothing, when every output is empty too (elementwise
// ops, matmul with M = 0 or N = 0, a reduction or softmax over a non-empty axis of an
// empty tensor, softmax over an empty axis). Where an op would make a non-empty value
// from an empty one — matmul with K = 0 (zeros), reduce_sum / reduce_max / reduce_mean
// over an empty axis (0, -inf, NaN) — the run is refused with JIT_UNSUPPORTED naming
// the node and op.
//
// Returns JIT_INVALID_ARGUMENT (NULL pointers, counts, bad device), JIT_SHAPE_MISMATCH,
// JIT_DTYPE_MISMATCH, JIT_UNSUPPORTED (strides; an empty input feeding a non-empty
// output), JIT_COMPILE_ERROR, JIT_DEVICE_ERROR, JIT_RESOURCE_EXHAUSTED (out of memory;
// a tensor past the limits above; or a CPU kernel that keeps more scratch on the
// calling thread's stack, up to ~320 KiB, than the thread has left, or on each OpenMP
// worker's stack than OMP_STACKSIZE gives).
JIT_API jit_status jit_run(jit_graph *graph, const DLTensor *inputs, int n_inputs,
                           const DLTensor *outputs, int n_outputs);

// Options of one run (jit_run_ex). Call jit_run_options_init first; the struct grows
// at its end (struct_size says how much of it the caller knows).
typedef struct jit_run_options {
  size_t struct_size;
  // A run on CUDA tensors: the CUstream (cast to void *) to queue its kernels on,
  // after the work already queued there (a framework's current stream, e.g. PyTorch's
  // torch.cuda.current_stream().cuda_stream), so that kernels the caller queued
  // earlier have finished writing the inputs before the run reads them. The call
  // returns when the run's kernels are done (it waits for that stream), so the caller
  // may read the outputs at once. The stream must belong to the device's primary
  // context (as PyTorch's and CuPy's streams do). NULL: CUDA's default stream.
  // A non-NULL stream on a run that is not on CUDA tensors (CPU or Vulkan tensors,
  // or host tensors offloaded through options.device) is JIT_INVALID_ARGUMENT.
  void *cuda_stream;
} jit_run_options;

// Fills `options` with the defaults (no stream) and struct_size.
JIT_API void jit_run_options_init(jit_run_options *options);

// jit_run with per-run options; `options` may be NULL (jit_run's behaviour). Returns
// what jit_run returns, and JIT_INVALID_ARGUMENT for a bad struct_size or a stream
// where none applies.
JIT_API jit_status jit_run_ex(jit_graph *graph, const DLTensor *inputs, int n_inputs,
                              const DLTensor *outputs, int n_outputs,
                              const jit_run_options *options);

// Makes these input shapes ready to run without running them, by the graph's shape
// policy: under EXACT their own kernel (loaded from the disk cache, or compiled and
// stored); under AUTO their own kernel if on disk, else the generic kernel; under
// GENERIC the generic kernel. Only shapes and dtypes are read; data may be NULL. Used
// to prewarm caches (with EXACT: `jitml prewarm`). Same errors as jit_run.
JIT_API jit_status jit_graph_compile(jit_graph *graph, const DLTensor *inputs,
                                     int n_inputs);

// Makes the graph's generic kernel ready for the device its runs go to (options.device's
// GPU, else the CPU; its symbolic dims kept as `?`;
// loaded from the disk cache, or compiled and stored), so that the first call of any
// binding under AUTO or GENERIC waits for no compiler; `jit_graph_compile` under EXACT
// prewarms exact kernels. JIT_UNSUPPORTED with the reason for a graph that has no
// generic kernel (no symbolic dims, a graph from MLIR, an op without a `?`-dim
// lowering: README's support table); JIT_INVALID_ARGUMENT for a graph not finalized.
JIT_API jit_status jit_graph_compile_generic(jit_graph *graph);

// Gives the graph's hot bindings their own CPU kernels now, on the calling thread
// (loaded from the disk cache, or compiled and stored), hottest first, at most `max`
// of them (0: all remembered). Hot bindings are those that, in earlier processes
// sharing this cache directory, ran often enough on the generic kernel under AUTO to
// be specialized (options.specialize_after); the cache keeps their list with the
// kernels (an entry of kind "hot-list"), and a process under AUTO prepares them by
// itself in the background when the graph's first binding arrives. `out_ready` (may
// be NULL) receives how many are ready. Nothing to do (0 ready) for a graph without
// symbols, from MLIR, or with no list. A binding that fails is skipped; the first
// failure is returned after the others were tried.
JIT_API jit_status jit_graph_prewarm_hot(jit_graph *graph, int max, size_t *out_ready);

// As jit_run, but allocates the outputs: on success out_outputs[i] (n_outputs entries,
// which must equal the graph's output count) are DLManagedTensors the caller owns and
// releases by calling their deleter. On failure nothing is allocated. Each output is
// sized (and refused past JIT_MAX_TENSOR_BYTES with JIT_RESOURCE_EXHAUSTED naming it)
// before it is allocated; an empty output gets a valid buffer of no elements.
JIT_API jit_status jit_run_alloc(jit_graph *graph, const DLTensor *inputs, int n_inputs,
                                 DLManagedTensor **out_outputs, int n_outputs);

//===--- Devices ---------------------------------------------------------===//

// A device a context can run on: the CPU, each Vulkan device, each CUDA device.
// Borrowed from its context; valid until the context is destroyed.
typedef struct jit_device jit_device;

typedef enum jit_device_kind {
  JIT_DEVICE_CPU = 0,
  JIT_DEVICE_VULKAN = 1,
  JIT_DEVICE_CUDA = 2,
} jit_device_kind;

typedef struct jit_device_info {
  jit_device_kind kind;
  int ordinal;           // index among devices of this kind
  const char *name;      // e.g. "llvmpipe (LLVM 15.0.6, 256 bits)"; borrowed
  DLDevice dl_device;    // how tensors on it say where they are
  int supports_f16;      // whether f16 graphs can run here
} jit_device_info;

// The number of devices of `ctx` (>= 1: the CPU is device 0). The first call looks for
// GPU backends (loading their libraries if present); a backend that is absent is
// simply not listed. Thread-safe.
JIT_API int jit_context_device_count(jit_context *ctx);
// Device `index` of `ctx` (borrowed). Returns JIT_INVALID_ARGUMENT for a bad index.
JIT_API jit_status jit_context_get_device(jit_context *ctx, int index,
                                          jit_device **out_device);
// The first device of `kind` with `ordinal`, or JIT_UNAVAILABLE (saying why the
// backend is absent: no library, no device, compiled out).
JIT_API jit_status jit_context_find_device(jit_context *ctx, jit_device_kind kind,
                                           int ordinal, jit_device **out_device);
JIT_API jit_status jit_device_get_info(const jit_device *device, jit_device_info *out_info);

// Allocates a dense tensor of `dtype` and `shape` on `device` into *out_tensor (its
// shape array is owned by the library). For GPU devices `data` is an opaque handle,
// usable only with this context's jit_run, jit_copy and jit_tensor_free. Returns
// JIT_INVALID_ARGUMENT, JIT_UNSUPPORTED (dtype, size over the device's limits),
// JIT_RESOURCE_EXHAUSTED (out of memory, more than JIT_MAX_TENSOR_BYTES).
JIT_API jit_status jit_tensor_alloc(jit_context *ctx, jit_device *device, DLDataType dtype,
                                    int rank, const int64_t *shape, DLTensor *out_tensor);
// Frees a tensor from jit_tensor_alloc and clears *tensor. Returns JIT_INVALID_ARGUMENT
// for a tensor this context did not allocate (or freed already).
JIT_API jit_status jit_tensor_free(jit_context *ctx, DLTensor *tensor);
// Copies `src` into `dst` (same dtype and shape): host to device, device to host,
// device to device (same device) or host to host. Host tensors must be dense.
// Returns JIT_INVALID_ARGUMENT, JIT_SHAPE_MISMATCH, JIT_UNSUPPORTED,
// JIT_RESOURCE_EXHAUSTED (more than JIT_MAX_TENSOR_BYTES), JIT_DEVICE_ERROR.
JIT_API jit_status jit_copy(jit_context *ctx, const DLTensor *dst, const DLTensor *src);

//===--- Kernel cache ----------------------------------------------------===//

// Explains why `inputs` would (or would not) hit the disk cache for `graph`: the key
// components that differ from the nearest entries of the same graph, e.g. "input 0
// `x` dim 0: 17 vs cached 16, 32". Compiles nothing. Free with jit_string_free.
JIT_API jit_status jit_cache_explain(jit_graph *graph, const DLTensor *inputs,
                                     int n_inputs, char **out_text);

// The disk cache directory in use (borrowed), or "" when the disk cache is off or
// unusable; `out_reason` (may be NULL) receives why it is off (borrowed, or NULL).
JIT_API const char *jit_cache_dir(jit_context *ctx, const char **out_reason);

// One cache entry, as jit_cache_list reports it. Strings are borrowed for the call.
typedef struct jit_cache_entry_info {
  const char *key;          // 32 hex digits
  const char *kind;         // "cpu-object", "ptx", ...
  const char *components;   // the "name=value" lines the key was made from
  uint64_t size;            // bytes on disk
  int64_t last_used;        // seconds since the epoch
} jit_cache_entry_info;

typedef int (*jit_cache_visit_fn)(void *user_data, const jit_cache_entry_info *entry);

// Calls `fn` for each valid entry of the context's disk cache; stops when it returns 0.
JIT_API jit_status jit_cache_list(jit_context *ctx, jit_cache_visit_fn fn,
                                  void *user_data);
// Checks every entry (checksums included) and removes bad ones.
JIT_API jit_status jit_cache_verify(jit_context *ctx, uint64_t *out_checked,
                                    uint64_t *out_bad);
// Applies the size and age limits now.
JIT_API jit_status jit_cache_prune(jit_context *ctx, uint64_t *out_evicted);
// Removes every entry.
JIT_API jit_status jit_cache_clear(jit_context *ctx, uint64_t *out_removed);
// Writes all entries into one bundle file / adds a bundle's verified entries.
JIT_API jit_status jit_cache_export(jit_context *ctx, const char *path,
                                    uint64_t *out_count);
// As jit_cache_export, signing the bundle (ed25519) with the secret key in file
// `secret_key_path` (made by jit_bundle_keygen; a regular file only its owner can
// read). JIT_INVALID_ARGUMENT when the key file is missing, malformed or readable by
// others.
JIT_API jit_status jit_cache_export_signed(jit_context *ctx, const char *path,
                                           const char *secret_key_path,
                                           uint64_t *out_count);
// Makes a signing key pair: the secret key goes into a new file `secret_key_path`
// (mode 0600; an existing file is never replaced: JIT_INVALID_ARGUMENT), the public
// key's 64 hex digits (and a NUL) into `out_public_key`, for bundle_trusted_keys.
JIT_API jit_status jit_bundle_keygen(const char *secret_key_path, char out_public_key[65]);
JIT_API jit_status jit_cache_import(jit_context *ctx, const char *path,
                                    uint64_t *out_count);

// The fleet cache's URL (password hidden; borrowed), or NULL when there is none.
// Asks the server (PING, within remote_timeout_ms; not while the tier is paused);
// `out_state` (may be NULL) receives its state, e.g. "connected", "paused for 29000 ms
// more after 1 errors: GETRANGE timed out", or "off: ..." (borrowed until this
// thread's next call).
JIT_API const char *jit_cache_remote(jit_context *ctx, const char **out_state);
// Called after each entry of a push or pull with the entries done and their total.
typedef void (*jit_cache_progress_fn)(void *user_data, uint64_t done, uint64_t total);
// Pushes every valid kernel of the disk cache that the fleet cache lacks (signed when
// options.remote_signing_key is set), waiting for each. `out_pushed` and
// `out_present` (may be NULL) count the entries pushed and those already there.
// JIT_UNAVAILABLE without a fleet cache or when the server fails (the entries pushed
// by then stay).
JIT_API jit_status jit_cache_push(jit_context *ctx, jit_cache_progress_fn progress,
                                  void *user_data, uint64_t *out_pushed,
                                  uint64_t *out_present);
// Pulls every value of the fleet cache that the disk cache lacks, each verified as on
// a remote hit; refused values are counted in `out_rejected` (may be NULL) and left
// out. JIT_UNAVAILABLE as for jit_cache_push; JIT_CACHE_ERROR for a read-only cache.
JIT_API jit_status jit_cache_pull(jit_context *ctx, jit_cache_progress_fn progress,
                                  void *user_data, uint64_t *out_pulled,
                                  uint64_t *out_rejected);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // JITML_H_
