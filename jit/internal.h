//===--- internal.h - jit/ shared internals --------------------------------===//
#ifndef JITML_JIT_INTERNAL_H_
#define JITML_JIT_INTERNAL_H_

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "cache/artifact.h"
#include "cache/cache.h"
#include "devices/cpu/cpu.h"
#include "devices/device.h"
#include "base/status.h"
#include "base/text.h"
#include "jitml.h"
#include "lowering/lower.h"

//===--- Context ---------------------------------------------------------===//

typedef struct jit__kernel jit__kernel;
typedef struct jit__specializer jit__specializer;

// A live allocation: what tensors hold in `data` (host pointer, Vulkan buffer handle,
// CUDA device address) and the backend's object behind it.
typedef struct jit__live {
  void *data;
  jit__dev_buffer *handle;
} jit__live;

// The number of backends jit/device.c registers (one per jit_device_kind).

// A device of a context (device.c), behind the backend table of devices/device.h. The
// CPU is device 0.
// Thread-safe: fields are immutable after the scan that lists the device, except `dev`
// and the live list, which `mu` guards.
struct jit_device {
  jit_context *ctx;
  jit_device_kind kind;
  int ordinal;
  char name[256];
  DLDevice dl;
  bool f16;
  char *target_text;          // key components of kernels for this device
  uint8_t target_hash[16];
  jit__backend *backend;      // borrowed from the context
  uint32_t index;             // the device's index in its backend's list
  jit__dev_info info;         // as the backend describes it
  jit__dev *dev;              // opened at first use (the CPU: at context creation)
  pthread_mutex_t mu;         // guards backend creation and the live list
  jit__live *live;            // allocations of jit_tensor_alloc and temporaries
  size_t n_live, cap_live;
};

// The kernel table: key -> kernel, open addressing. Guarded by jit_context.mu.
typedef struct jit__kernel_table {
  jit__kernel **slots;
  size_t cap;    // power of two
  size_t count;
} jit__kernel_table;

struct jit_context {
  jit_options options;
  jit__logger logger;  // from options (or $JITML_LOG): what jit__log writes through
  // The key components every kernel shares: target triple/cpu/features, library and
  // LLVM versions, the library's build id, lowering options ("name=value" lines), and
  // their hash, which goes into every key.
  char *target_text;
  uint8_t target_hash[16];
  jit__mlir_pool *mlir_pool;   // MLIR contexts reused by CPU compiles; NULL if none
  jit__cache *cache;           // the disk tier; disabled handle when off/unusable
  pthread_mutex_t mu;          // guards table and the kernel states
  pthread_cond_t cv;           // signalled when a compile finishes
  jit__kernel_table table;
  // Devices (device.c): devices[0] is the CPU; GPUs are looked for on first need.
  pthread_mutex_t devices_mu;
  jit_device **devices;
  int n_devices, cap_devices;
  bool devices_scanned;
  char absent[JIT__N_BACKENDS][256];        // why a GPU backend has no devices
  jit__backend *backends[JIT__N_BACKENDS];  // loaded backends, by jit_device_kind
  jit_device *offload;          // options.device when it names a GPU, else NULL
  atomic_uint_fast64_t runs, memory_hits, misses, compiles, disk_hits;
  // Shape policies (shapes.c): options.shape_policy after $JITML_SHAPE_POLICY, and the
  // AUTO limits with their defaults filled in.
  jit_shape_policy policy;
  int specialize_after, max_specializations;
  atomic_uint_fast64_t generic_runs, generic_compiles, specializations, spec_failures;
  atomic_uint_fast64_t weight_packs;  // jit/weights.c
  // Bounded kernel memory (run.c, jit__evict), guarded by mu: the limits, the
  // unloadable kernels loaded and their bytes, the pinned ones (generic kernels), the
  // use clock; and how many were unloaded.
  int max_loaded;
  uint64_t max_loaded_bytes;
  uint64_t n_code, code_bytes, n_pinned, tick;
  atomic_uint_fast64_t unloaded;
  jit__specializer *spec;       // background compiles (specialize.c)
  double compile_ms, load_ms;  // guarded by mu
  jit__trusted_keys trusted;  // bundle import's (options.bundle_trusted_keys)
  jit_isolation isolation;    // options.mlir_isolation, $JITML_ISOLATION applied
  char worker[4096];          // the isolation worker; "" when none was found
  // options.cuda_toolkit points at the context's own copy. Which image CUDA kernels
  // were loaded from (gpu_run.c):
  atomic_uint_fast64_t cuda_cubin_loads, cuda_ptx_loads;
  // The live contexts, for the fork() handlers (jit/fork.c; guarded there).
  jit_context *fork_prev, *fork_next;
};

// Logs through the context's callback (or JITML_LOG on stderr).
#define jit__log(ctx, level, ...) jit__logf(&(ctx)->logger, (level), __VA_ARGS__)

//===--- Graph -----------------------------------------------------------===//

// Symbol codes are -2, -3, ... (-1 means "infer" in reshape dims).
#define JIT__SYMBOL_CODE(index) (-2 - (int64_t)(index))
#define JIT__SYMBOL_INDEX(code) ((uint32_t)(-2 - (code)))

typedef struct jit__gnode {
  jit__node n;                  // dims may hold symbol codes; unknown derived dims
                                // hold JIT__DIM_UNKNOWN
  int64_t req[JIT_MAX_RANK];    // reshape: the dims asked for (symbols, one -1)
  char *name;                   // inputs: their name
} jit__gnode;

#define JIT__DIM_UNKNOWN INT64_MIN

// A graph imported from MLIR text (jit/graph_mlir.c): its nodes are only the INPUT
// nodes of the function's arguments; the body lives here.
typedef struct jit__mlir_graph jit__mlir_graph;

struct jit_graph {
  jit_context *ctx;
  jit__mlir_graph *mlir;  // non-NULL for graphs from jit_graph_from_mlir
  char *name;
  jit__gnode *nodes;
  uint32_t n_nodes, cap_nodes;
  uint32_t *inputs, n_inputs, cap_inputs;
  uint32_t *outputs, n_outputs, cap_outputs;
  char **symbols;
  uint32_t n_symbols, cap_symbols;
  jit_status error;     // first builder error (sticky)
  bool finalized;
  bool has_gather;      // some node is a gather (jit__check_indices has work)
  uint8_t fingerprint[16];
  // Shape policy (shapes.c): jit_graph_set_shape_policy's, or -1 for the context's.
  atomic_int shape_policy;
  // The graph's generic kernel on the CPU once ready (NULL before), and, guarded by
  // ctx->mu, whether it cannot have one (then it runs EXACT; logged once) and how
  // many of its bindings were given kernels of their own in the background.
  _Atomic(jit__kernel *) generic;
  atomic_bool generic_queued;  // AUTO: its compile was queued on the specializer
  atomic_bool hot_queued;      // AUTO: its remembered hot bindings were queued (hot.c)
  bool generic_failed;
  char *generic_why;    // why, when it failed (malloc'ed)
  uint32_t n_specialized;
  bool spec_limit_logged;
  // Weights (jit_weight; jit/weights.c): per input, its packed copy where a kernel
  // reads one (NULL until finalize, and for graphs without weights), and the count
  // of jit_graph_weights_changed calls.
  struct jit__wpack *wpacks;
  atomic_uint_fast64_t weights_gen;
};

// Infers node `i`'s concrete shape from its operands' concrete shapes (`shapes` holds
// rank and dims for nodes < i) and the symbol values. Writes rank/dims into `out`.
// Used at run time for every node; fails with a message naming the node and op.
jit_status jit__infer_concrete(const jit_graph *g, uint32_t i, const jit__node *shapes,
                               const int64_t *symbol_values, jit__node *out);

// The shape and dtype of one output for one binding.
typedef struct jit__oshape {
  int rank;
  int64_t dims[JIT_MAX_RANK];
  jit__dtype dtype;
} jit__oshape;

// Binds the symbols of `inputs` (which passed jit__inputs_key) and infers every
// node's concrete shape into `shapes` (n_nodes entries) and the outputs' into
// `oshapes`, refusing sizes past JIT_MAX_TENSOR_BYTES (jit/run.c).
// Every index of every gather whose indices are in host memory lies in its table's
// rows for this binding (indices.c); else JIT_INVALID_ARGUMENT naming the first.
jit_status jit__check_indices(const jit_graph *g, const DLTensor *inputs);

jit_status jit__bind(const jit_graph *g, const DLTensor *inputs, int64_t *symvals,
                     jit__node *shapes, jit__oshape *oshapes);

// The lowering options of a CPU compile in `ctx` (jit/run.c), and the counting of one
// compile of `g` that took `ms` (with its stage times logged when `art` is set).
jit__lower_options jit__cpu_lower_options(jit_context *ctx);
void jit__count_compile(jit_context *ctx, const jit_graph *g, const char *what,
                        double ms, const jit__artifact *art);

// The kernel table's single flight (jit/run.c). Finds or makes the record of `key`:
// *mine when this thread made it (state COMPILING; it must jit__publish it), else
// the record once READY, or the error its compile failed with.
jit_status jit__claim(jit_context *ctx, jit_device *d, uint32_t n_outputs,
                      const uint8_t key[16], jit__kernel **out, bool *mine);
// Ends a claim: READY, or FAILED with `status` (which the caller still owns).
void jit__publish(jit_context *ctx, jit__kernel *k, jit_status status);
// Drops a use of a kernel that the dispatch returned (every path that got one).
void jit__kernel_release(jit__kernel *k);
// Unloads least recently used kernels while `ctx` is past its limits.
void jit__evict(jit_context *ctx);

//===--- Shape policies and generic kernels (jit/shapes.c) ----------------===//

// Reads options.shape_policy, $JITML_SHAPE_POLICY and the AUTO limits into `ctx`;
// JIT_INVALID_ARGUMENT naming the field or variable.
jit_status jit__shape_options(jit_context *ctx, const jit_options *o);
// The index of `value` among the n `names` (case-insensitive), or -1: the values of
// the JITML_* variables that name an enumerator (context.c).
int jit__env_choice(const char *value, const char *const *names, int n);
// The policy a new binding of `g` on device `d` gets: EXACT where there is no generic
// kernel to be had (no symbols, a graph from MLIR, a GPU, a generic compile that failed).
jit_shape_policy jit__policy_of(jit_graph *g, const jit_device *d);
// The graph's generic kernel for the CPU, loaded from disk or compiled once (single
// flight); an error when it cannot be built (then g->generic_failed is set).
jit_status jit__generic_get(jit_graph *g, jit__kernel **out);
// jit__generic_get that, with `queue`, hands a compile (not a disk hit) to the
// specializer's thread: then *out is NULL (AUTO's first binding compiles its own).
jit_status jit__generic_get_or_queue(jit_graph *g, bool queue, jit__kernel **out);
// The graph's generic kernel for GPU `d`: its READY record (pinned), or built here, or
// with `queue` (and none yet) handed to the specializer: then *out is NULL. An error
// when it cannot be built (kept in its record: replayed at once to later bindings).
jit_status jit__gpu_generic_get(jit_graph *g, jit_device *d, bool queue, jit__kernel **out);
// Binding record `k` (claimed) on a GPU runs generic kernel `gk`, loaded with this
// binding's grids and sizes; JIT_UNSUPPORTED when the binding is past it.
jit_status jit__serve_generic_gpu(jit_graph *g, const DLTensor *inputs, jit__kernel *k,
                                  jit__kernel *gk, bool specialize);
// Compiles claimed generic record `gk` and publishes it (the specializer's thread).
void jit__generic_build(jit_graph *g, jit__kernel *gk);
// Binding record `k` (COMPILING, claimed by this thread) runs on generic kernel `gk`:
// binds `inputs`, fills k->outputs and the sizes the generic entry reads.
// `specialize`: AUTO, so that enough calls specialize it.
jit_status jit__serve_generic(jit_graph *g, const DLTensor *inputs, jit__kernel *k,
                              jit__kernel *gk, bool specialize);
// The key of the generic kernel of `g` on device `d`: a binding key with the
// symbols' codes in place of their values.
jit_status jit__generic_key(const jit_graph *g, const jit_device *d, uint8_t key[16]);
// Whether the graph's generic kernel (CPU) is still being compiled after waiting up to
// `wait_ms` for it (AUTO: a binding then gets its own kernel rather than wait longer).
bool jit__generic_compiling(jit_graph *g, double wait_ms);
// Appends to `out` which kernel a call of binding `key` on `d` would run now, and why
// (jit_cache_explain).
void jit__explain_policy(jit_graph *g, jit_device *d, const uint8_t key[16], jit__text *out);

//===--- fork() (jit/fork.c) ---------------------------------------------===//

// Adds a new context to (removes one being destroyed from) the contexts that the
// process's fork() handlers take care of; the first call installs the handlers.
void jit__fork_register(jit_context *ctx);
void jit__fork_unregister(jit_context *ctx);

//===--- Background specialization (jit/specialize.c) --------------------===//

// The specializer of a context, its thread started at the first job. NULL on OOM.
jit__specializer *jit__spec_create(void);
// Stops the thread (the job in flight ends first) and frees what is queued.
void jit__spec_destroy(jit__specializer *sp);
// The recompile guard: true, counting one more kernel of its own for `g`, unless the
// graph reached options.max_specializations (then false, logged once).
bool jit__spec_allow(jit_graph *g);
// Queues binding `k` of `g` for its own kernel (jit__specialize_binding), unless the
// graph reached its limit (logged once). Never blocks on a compile.
void jit__spec_enqueue(jit_graph *g, jit__kernel *k);
// Jobs queued or running now.
uint64_t jit__spec_pending(jit__specializer *sp);
// Queues a job: binding `k`'s own kernel, or with `generic` the graph's generic
// kernel into claimed record `k` (jit__generic_build). false when it could not be
// queued (no thread, no memory).
bool jit__spec_push(jit_graph *g, jit__kernel *k, bool generic);
// Queues binding `dims` (its inputs' dims, concatenated; copied) of `g` for its own
// kernel (jit__warm_binding): a binding remembered as hot. false when not queued.
bool jit__spec_push_hot(jit_graph *g, const int64_t *dims);
// Drops the queued jobs of `g` and waits for its job in flight (jit_graph_destroy).
void jit__spec_forget_graph(jit_graph *g);
// In a forked child whose parent had queued jobs: starts the thread that serves them
// (before waiting for a kernel that may be one of them). Elsewhere nothing.
void jit__spec_revive(jit_context *ctx);
// fork() handlers (jit/fork.c). prepare: locks the specializer, its job in flight
// finished and no other taken; parent: resumes; child: no thread, the queue kept (a
// thread is started by jit__spec_revive or the next job). Whether claimed record `k`
// is a queued generic build (sp locked, in the child).
void jit__spec_fork_prepare(jit__specializer *sp);
void jit__spec_fork_parent(jit__specializer *sp);
void jit__spec_fork_child(jit__specializer *sp);
bool jit__spec_queued_build(const jit__specializer *sp, const jit__kernel *k);
// Compiles (or loads from disk) binding `k`'s own kernel and switches its calls to it
// (jit/run.c). Runs on the specializer's thread.
void jit__specialize_binding(jit_graph *g, jit__kernel *k);
// Makes binding `dims` (its inputs' dims, concatenated) of `g` have its own CPU
// kernel loaded, as later calls will find it: from disk or compiled; a binding served
// by the generic kernel now is specialized. `background`: on the specializer's thread,
// under the graph's options.max_specializations and counted as a specialization.
jit_status jit__warm_binding(jit_graph *g, const int64_t *dims, bool background);
// The graph's bindings that became hot under AUTO, remembered in the disk cache
// (jit/hot.c): one more process found bindings `rows` hot (each its inputs' dims;
// disk I/O: the specializer's thread, or a graph's destruction); queue the remembered
// ones on the specializer (a graph's first binding under AUTO).
void jit__hot_note(jit_graph *g, const int64_t *const *rows, size_t n);
void jit__hot_queue(jit_graph *g);

//===--- Devices (jit/device.c) ------------------------------------------===//

jit_status jit__devices_init_cpu(jit_context *ctx);
void jit__devices_scan(jit_context *ctx);
void jit__devices_destroy(jit_context *ctx);
const char *jit__device_kind_name(jit_device_kind kind);
jit_status jit__device_open(jit_device *d);
jit_status jit__device_of(jit_context *ctx, DLDevice dl, jit_device **out);
jit_status jit__device_from_option(jit_context *ctx, const char *spec, jit_device **out);
bool jit__device_owns(jit_device *d, const void *buffer);
// The backend object behind `data` if it is a live allocation of `d`, else NULL.
jit__dev_buffer *jit__device_handle(jit_device *d, const void *data);
// Host <-> device transfers on any allocation of `d` (or, for CUDA, any device address).
jit_status jit__device_upload(jit_device *d, void *data, uint64_t offset, const void *src,
                              uint64_t bytes);
jit_status jit__device_download(jit_device *d, const void *data, uint64_t offset,
                                void *dst, uint64_t bytes);
jit_status jit__device_buffer_alloc(jit_device *d, uint64_t bytes, void **out);
jit_status jit__device_buffer_free(jit_device *d, void *buffer);

//===--- GPU kernels (jit/gpu_run.c) --------------------------------------===//

typedef struct jit__gpu_exec jit__gpu_exec;
// Loads the kernel for `key` on `d` from the disk cache (output shapes included).
bool jit__gpu_disk_load(jit_graph *g, jit_device *d, const uint8_t key[16],
                        jit__oshape *shapes, jit__gpu_exec **out);
// Compiles `lg` for `d`, stores it in the disk cache and loads it.
jit_status jit__gpu_compile_and_load(jit_graph *g, jit_device *d, const jit__lgraph *lg,
                                     const uint8_t key[16], const DLTensor *inputs,
                                     const jit__oshape *shapes, jit__gpu_exec **out);
// Runs on device buffers: inputs[i].data / outputs[j].data are the device's buffers.
// A graph's generic kernel for a GPU (gpu_run.c): module and plan with programs, not
// loaded. Made from disk or compiled (and stored) under `key`; its output shapes (`?`
// dims negative) into `shapes`. `declared`: the inputs as declared, for the entry's
// key text.
typedef struct jit__gpu_generic jit__gpu_generic;
jit_status jit__gpu_generic_make(jit_graph *g, jit_device *d, const uint8_t key[16],
                                 const jit__lgraph *lg, const int64_t (*req)[JIT_MAX_RANK],
                                 const DLTensor *declared, jit__oshape *shapes,
                                 jit__gpu_generic **out);
// The generic kernel of `key` from the disk cache only, or NULL.
jit__gpu_generic *jit__gpu_generic_load(jit_graph *g, jit_device *d, const uint8_t key[16],
                                        jit__oshape *shapes);
// Loads generic kernel `gg` for one binding (its inputs and output shapes): the grids,
// temporaries and sizes of that binding. JIT_UNSUPPORTED when the binding is past
// what the generic kernel addresses (then its own kernel serves it).
jit_status jit__gpu_generic_bind(jit__gpu_generic *gg, jit_device *d, const DLTensor *inputs,
                                 uint32_t n_in, const jit__oshape *outs, uint32_t n_out,
                                 jit__gpu_exec **out);
void jit__gpu_generic_free(jit__gpu_generic *gg);
// `stream`: the caller's CUDA stream (jit_run_options.cuda_stream), or NULL.
jit_status jit__gpu_run(jit__gpu_exec *e, const DLTensor *inputs, uint32_t n_inputs,
                        const DLTensor *outputs, uint32_t n_outputs, void *stream);
void jit__gpu_exec_destroy(jit__gpu_exec *e);
jit_device *jit__gpu_exec_device(const jit__gpu_exec *e);

// CPU code as jit_run calls it.
typedef struct jit__cpu_impl {
  jit__host_fn fn;
  uint32_t stack_bytes;         // stack the kernel needs (jit__artifact.stack_bytes)
  bool threaded;                // it forks OpenMP workers, which need that stack too
  const int64_t *dims;          // a generic kernel's: the binding's argument sizes
                                // (its entry's last argument); NULL: exact code
  jit__dev_executable *code;    // the loaded object when owned here (unloadable)
  uint64_t code_bytes;          // its size
  uint32_t n_packed;            // inputs it reads as packed panels (jit/weights.c)
  jit__packed_arg packed[JIT__MAX_PACKED_ARGS];
} jit__cpu_impl;

//===--- Weights (jit/weights.c) ------------------------------------------===//

// At finalize: a graph with weights gets its per-input packed copies (none made yet).
jit_status jit__weights_init(jit_graph *g);
void jit__weights_free(jit_graph *g);
// Before kernel `im` runs: points args[i] at the packed copy of each input i it reads
// packed (made now where missing or stale), each held for reading until
// jit__weights_release. JIT_RESOURCE_EXHAUSTED when a copy cannot be made.
jit_status jit__weights_acquire(jit_graph *g, const jit__cpu_impl *im, const DLTensor *inputs,
                                void **args);
void jit__weights_release(jit_graph *g, const jit__cpu_impl *im);

// A node graph as the MLIR module jit_graph_to_mlir gives (jit/graph_mlir.c).
jit_status jit__mlir_export(const jit_graph *g, char **out_text);

//===--- Compile isolation (jit/isolate.c) -------------------------------===//

// Resolves the context's isolation mode and finds the worker (logs where it is missing).
void jit__isolation_init(jit_context *ctx);
// Whether MLIR text goes to the worker first: ON, or AUTO with a worker found.
bool jit__isolation_on(const jit_context *ctx);
// Imports (`compile` false) or compiles for `inputs` into the disk cache (`compile`
// true) MLIR `text` in a worker process. `what` names the graph in messages. The
// worker's own status as it is; JIT_PARSE_ERROR / JIT_COMPILE_ERROR when it crashed,
// hung (killed after options.isolation_timeout_ms) or did not answer, with *died set
// (`died` may be NULL); JIT_UNAVAILABLE without a worker.
jit_status jit__isolated(jit_context *ctx, bool compile, const char *what, const char *text,
                         size_t length, const char *entry, const DLTensor *inputs,
                         int n_inputs, bool *died);

//===--- Disk tier (jit/disk.c) -------------------------------------------===//

// A cache entry decoded for one graph and device: its record, and its images (best
// first) borrowing the entry's payload. Thread-compatible.
typedef struct jit__entry {
  jit__cache_entry e;
  jit__art art;
  uint32_t n_images;
  jit__image images[JIT__ART_MAX_PARTS];
  char missing[512];  // why a better image is missing (the record's note), or ""
} jit__entry;

// Gets the entry of `key` and checks that it describes a kernel of `g` for `d`'s kind
// of device: true with *en (release it with jit__entry_release) and the output shapes
// set; false on a miss, a bad entry or an unusable cache (logged, never an error).
bool jit__entry_get(jit_graph *g, jit_device *d, const uint8_t key[16], jit__entry *en,
                    jit__oshape *shapes);
void jit__entry_release(jit__entry *en);
// Stores a compiled kernel of `g` for `d` under `key` (best effort: a failure is
// logged): `images` (1 to JIT__ART_MAX_PARTS, best first) as the payload's parts, `rec`
// (entry point, arguments, plan, notes; its target, parts and outputs are set here)
// and `shapes` as the record.
void jit__entry_put(jit_graph *g, jit_device *d, const uint8_t key[16],
                    const DLTensor *inputs, const jit__art *rec, const jit__image *images,
                    uint32_t n_images, const jit__oshape *shapes);
// The value of `name` in an artifact's "name=value" notes (NULL: none), into `out`
// ("" when absent).
void jit__note_value(const char *notes, const char *name, char *out, size_t size);
// Loads host object `image` (entry point `entry`) through the CPU device into `impl`:
// its entry point, whether it forks OpenMP threads, its code (unloadable) and size.
jit_status jit__cpu_load_image(jit_context *ctx, const jit__image *image, const char *entry,
                               jit__cpu_impl *impl);
// Loads the CPU kernel for `key` from the disk cache: true with `impl` (its code loaded
// unloadably, its stack need and whether it forks OpenMP threads) and the output
// shapes set, or false (as jit__entry_get, or its code did not load).
bool jit__disk_load(jit_graph *g, const uint8_t key[16], jit__cpu_impl *impl,
                    jit__oshape *out_shapes);
// jit__disk_load, not counted as a disk hit (the isolation worker's kernel: its caller
// counts a compile).
bool jit__disk_load_uncounted(jit_graph *g, const uint8_t key[16], jit__cpu_impl *impl,
                              jit__oshape *out_shapes);
// Puts entry `e` into the context's disk cache; a failure is logged, never an error
// (the cache is best effort).
void jit__disk_put(jit_context *ctx, const jit__cache_entry *e);
// Stores a compiled CPU kernel (best effort).
void jit__disk_store(jit_graph *g, const uint8_t key[16], const DLTensor *inputs,
                     const jit__artifact *art, const jit__oshape *shapes);
// The "name=value" lines a key for `inputs` is made from (malloc'ed).
char *jit__key_components(const jit_graph *g, const jit_device *d, const DLTensor *inputs);
// Computes the key of `inputs` after checking them (jit/run.c).
jit_status jit__inputs_key(jit_graph *g, const DLTensor *inputs, int n_inputs,
                           bool need_data, jit_device *d, uint8_t key[16]);

//===--- Graphs from MLIR (jit/graph_mlir.c) ------------------------------===//

void jit__mlir_graph_free(jit__mlir_graph *m);
// The dtype of result `index` of an MLIR graph.
jit__dtype jit__mlir_graph_result_dtype(const jit_graph *g, uint32_t index);
// jit_graph_output_info of an imported graph: static sizes, JIT_DIM_UNKNOWN for `?`.
void jit__mlir_graph_result_info(const jit_graph *g, uint32_t index, jit_output_info *out);
// The output shapes of `g` (an MLIR graph) for `inputs`, whose symbols were bound and
// checked already. Refines the function's shapes through its body; compiles nothing.
jit_status jit__mlir_graph_bind(const jit_graph *g, const DLTensor *inputs,
                                jit__oshape *out_shapes);
// Compiles `g` (an MLIR graph) specialized for the shapes of `inputs`, and gives the
// output shapes of that binding (also remembered for jit__mlir_graph_bind).
jit_status jit__mlir_graph_compile(const jit_graph *g, const DLTensor *inputs,
                                   const char *func_name, const jit__lower_options *lo,
                                   jit__artifact *out, jit__oshape *out_shapes);

#endif  // JITML_JIT_INTERNAL_H_
