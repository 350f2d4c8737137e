//===--- run.c - binding, specialization keys, jit_run ---------------------===//
//
// A call goes: check the tensors -> key from (graph fingerprint, context target hash,
// input shapes and dtypes) -> kernel table. A hit runs the kernel at once: the key
// holds every input shape, so a key that has a kernel was bound and checked before.
// A miss binds the symbols, infers every node's concrete shape, and compiles once per
// key however many threads ask (single flight), the others waiting on the context's
// condition variable.
//
//===----------------------------------------------------------------------===//
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <xxhash.h>

#include "base/checked.h"
#include "base/clock.h"
#include "base/hex.h"
#include "jit/internal.h"
#include "jit/mlir_graph.h"
#include "jit/kernel_table.h"

//===--- Tensors at the boundary -----------------------------------------===//

static bool jit__dl_dtype(DLDataType t, jit__dtype *out) {
  return jit__dtype_from_dl(t, true, out);
}

// The byte size of a tensor of shape `dims` with `elem_bytes`-byte elements, refused
// (JIT_RESOURCE_EXHAUSTED) past JIT_MAX_TENSOR_BYTES or where the count overflows.
// `where` names the tensor ("input 0 `x`", "output 1", "node 3 (matmul)").
static jit_status jit__tensor_bytes(const jit_graph *g, const char *where, int rank,
                                    const int64_t *dims, int64_t elem_bytes,
                                    uint64_t *out) {
  int64_t bytes;
  if (jit__checked_numel(rank, dims, elem_bytes, &bytes) &&
      (uint64_t)bytes <= JIT_MAX_TENSOR_BYTES) {
    *out = (uint64_t)bytes;
    return NULL;
  }
  char sd[200];
  return JIT_ERR(JIT_RESOURCE_EXHAUSTED,
                 "graph `%s`: %s: shape %s of %lld-byte elements is more than "
                 "JIT_MAX_TENSOR_BYTES (2^48 bytes)",
                 g->name, where, jit__fmt_shape(rank, dims, sd, sizeof sd),
                 (long long)elem_bytes);
}

static int64_t jit__elem_bytes(jit__dtype t) { return jit__dtype_bytes(t); }

// Checks what every tensor needs, whatever the graph: the device `d` (a GPU tensor must
// be a live allocation of this context), dense row-major strides, data. `what` is
// "input"/"output".
static jit_status jit__check_tensor(const jit_graph *g, const char *what, int i,
                                    const char *name, const DLTensor *t, bool need_data,
                                    jit_device *d) {
  if (t->device.device_type != d->dl.device_type || t->device.device_id != d->dl.device_id)
    return JIT_ERR(JIT_INVALID_ARGUMENT,
                   "graph `%s`: %s %d `%s` is on device (type %d, id %d) but the run is on "
                   "%s:%d; all tensors of a run must be on one device",
                   g->name, what, i, name, (int)t->device.device_type,
                   (int)t->device.device_id, jit__device_kind_name(d->kind), d->ordinal);
  // Most device tensors are handles this context made; where they may be foreign
  // memory (CUDA device addresses), the backend checks them when it binds them.
  if (d->kind != JIT_DEVICE_CPU && need_data) {
    if (!t->data || (!d->info.foreign_memory && !jit__device_owns(d, t->data)))
      return JIT_ERR(JIT_INVALID_ARGUMENT,
                     "graph `%s`: %s %d `%s`: not a live tensor of this context on %s:%d "
                     "(allocate with jit_tensor_alloc; freed, or from another context?)",
                     g->name, what, i, name, jit__device_kind_name(d->kind), d->ordinal);
    if (t->byte_offset)
      return JIT_ERR(JIT_UNSUPPORTED, "graph `%s`: %s %d `%s`: byte_offset on a GPU tensor",
                     g->name, what, i, name);
  }
  if (t->ndim < 0 || t->ndim > JIT_MAX_RANK || (t->ndim > 0 && !t->shape))
    return JIT_ERR(JIT_INVALID_ARGUMENT, "graph `%s`: %s %d `%s`: bad ndim %d or NULL shape",
                   g->name, what, i, name, t->ndim);
  for (int d = 0; d < t->ndim; d++)
    if (t->shape[d] < 0)
      return JIT_ERR(JIT_SHAPE_MISMATCH, "graph `%s`: %s %d `%s`: dim %d is %lld; sizes "
                     "must be >= 0", g->name, what, i, name, d, (long long)t->shape[d]);
  // Sized before anything multiplies the dims (strides below, buffer sizes later).
  // The name is formatted only on failure: this runs for every tensor of every call.
  int64_t esz = t->dtype.bits >= 8 ? t->dtype.bits / 8 : 1, bytes = 0;
  if (!jit__checked_numel(t->ndim, t->shape, esz, &bytes) ||
      (uint64_t)bytes > JIT_MAX_TENSOR_BYTES) {
    char where[160];
    snprintf(where, sizeof where, "%s %d%s%s%s", what, i, name[0] ? " `" : "", name,
             name[0] ? "`" : "");
    uint64_t ignored;
    return jit__tensor_bytes(g, where, t->ndim, t->shape, esz, &ignored);
  }
  if (need_data && !t->data)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "graph `%s`: %s %d `%s`: data is NULL", g->name,
                   what, i, name);
  // Strides of a dim of size 1, and of an empty tensor, are free (DLPack says so;
  // NumPy 2 and torch 2 export e.g. (0, 1) for a (0, 4) array): nothing is addressed.
  if (t->strides && bytes > 0) {
    int64_t expect = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
      if (t->shape[d] != 1 && t->strides[d] != expect)
        return JIT_ERR(JIT_UNSUPPORTED,
                       "graph `%s`: %s %d `%s`: dim %d has stride %lld, but only dense "
                       "row-major tensors are supported (expected %lld)",
                       g->name, what, i, name, d, (long long)t->strides[d],
                       (long long)expect);
      expect *= t->shape[d];
    }
  }
  return NULL;
}

static const char *jit__input_name(const jit_graph *g, int i) {
  return g->nodes[g->inputs[i]].name;
}

// Picks the device of a run: the inputs' device, or for host inputs the context's
// offload device when options.device names one (`offload` allowed).
static jit_status jit__run_device(jit_graph *g, const DLTensor *inputs, int n_inputs,
                                  bool offload, jit_device **out) {
  jit_context *ctx = g->ctx;
  DLDevice dl = n_inputs > 0 && inputs ? inputs[0].device : (DLDevice){kDLCPU, 0};
  if (dl.device_type == kDLCPU) {
    *out = offload && ctx->offload ? ctx->offload : ctx->devices[0];
    return NULL;
  }
  jit_status s = jit__device_of(ctx, dl, out);
  if (s) return jit__status_annotate(s, "graph `%s`: input 0 `%s`", g->name,
                                     g->nodes[g->inputs[0]].name);
  return NULL;
}

// Checks the cheap per-call invariants of the inputs and forms the key for device `d`
// (which jit__run_device chose). Host inputs of an offloaded run are checked as host
// tensors.
jit_status jit__inputs_key(jit_graph *g, const DLTensor *inputs, int n_inputs,
                           bool need_data, jit_device *d, uint8_t key[16]) {
  if (!g->finalized)
    return JIT_ERR(JIT_INVALID_ARGUMENT,
                   "graph `%s` is not finalized (call jit_graph_finalize)", g->name);
  if (n_inputs != (int)g->n_inputs)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "graph `%s` takes %u inputs, got %d", g->name,
                   g->n_inputs, n_inputs);
  if (n_inputs > 0 && !inputs)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "graph `%s`: inputs is NULL", g->name);
  // The key hashes one flat record: graph fingerprint, the context's target and
  // options hash, then per input its dtype, rank and dims.
  int64_t stack_rec[4 + 16 * (1 + JIT_MAX_RANK)];
  size_t cap = 4 + (size_t)n_inputs * (1 + JIT_MAX_RANK);
  int64_t *rec = cap <= sizeof(stack_rec) / sizeof(stack_rec[0]) ? stack_rec
                                                                 : malloc(cap * sizeof(int64_t));
  if (!rec) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "graph `%s`: out of memory", g->name);
  memcpy(rec, g->fingerprint, 16);
  memcpy(rec + 2, d->target_hash, 16);
  size_t n = 4;
  jit_status status = NULL;
  jit_device *td = n_inputs > 0 && inputs[0].device.device_type == kDLCPU
                       ? g->ctx->devices[0] : d;
  for (int i = 0; i < n_inputs && !status; i++) {
    const DLTensor *t = &inputs[i];
    const jit__node *decl = &g->nodes[g->inputs[i]].n;
    jit__dtype dt = JIT__F32;
    status = jit__check_tensor(g, "input", i, jit__input_name(g, i), t, need_data, td);
    if (status) break;
    if (!jit__dl_dtype(t->dtype, &dt) || dt != decl->dtype)
      status = JIT_ERR(JIT_DTYPE_MISMATCH,
                       "graph `%s`: input %d `%s`: dtype (code %d, %d bits) does not "
                       "match the declared %s",
                       g->name, i, jit__input_name(g, i), t->dtype.code, t->dtype.bits,
                       jit__dtype_str(decl->dtype));
    else if (t->ndim != decl->rank)
      status = JIT_ERR(JIT_SHAPE_MISMATCH,
                       "graph `%s`: input %d `%s`: rank is %d but the graph declares %d",
                       g->name, i, jit__input_name(g, i), t->ndim, decl->rank);
    if (status) break;
    rec[n++] = ((int64_t)dt << 8) | t->ndim;
    for (int d = 0; d < t->ndim; d++) rec[n++] = t->shape[d];
  }
  if (!status) {
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(rec, n * sizeof(int64_t)));
    memcpy(key, c.digest, 16);
  }
  if (rec != stack_rec) free(rec);
  return status;
}

// Binds every symbol from the input shapes into `symvals`, checking static dims and
// that each symbol gets one size. The inputs passed jit__inputs_key.
static jit_status jit__bind_symbols(const jit_graph *g, const DLTensor *inputs,
                                    int64_t *symvals) {
  // Which input and dim bound each symbol, for messages.
  int bound_in[64], bound_dim[64];
  for (uint32_t s = 0; s < g->n_symbols; s++) symvals[s] = -1;
  for (uint32_t i = 0; i < g->n_inputs; i++) {
    const DLTensor *t = &inputs[i];
    const jit__node *decl = &g->nodes[g->inputs[i]].n;
    for (int d = 0; d < t->ndim; d++) {
      int64_t v = t->shape[d], want = decl->dims[d];
      if (v < 0)
        return JIT_ERR(JIT_SHAPE_MISMATCH,
                       "graph `%s`: input %u `%s`: dim %d is %lld; sizes must be >= 0",
                       g->name, i, jit__input_name(g, (int)i), d, (long long)v);
      if (want >= 0) {
        if (v != want)
          return JIT_ERR(JIT_SHAPE_MISMATCH,
                         "graph `%s`: input %u `%s`: dim %d is %lld but the graph "
                         "declares %lld",
                         g->name, i, jit__input_name(g, (int)i), d, (long long)v,
                         (long long)want);
        continue;
      }
      uint32_t s = JIT__SYMBOL_INDEX(want);
      if (symvals[s] < 0) {
        symvals[s] = v;
        if (s < 64) {
          bound_in[s] = (int)i;
          bound_dim[s] = d;
        }
      } else if (symvals[s] != v) {
        int bi = s < 64 ? bound_in[s] : -1, bd = s < 64 ? bound_dim[s] : -1;
        return JIT_ERR(JIT_SHAPE_MISMATCH,
                       "graph `%s`: input %u `%s`: dim %d is %lld but symbol %s was bound "
                       "to %lld by input %d `%s` dim %d",
                       g->name, i, jit__input_name(g, (int)i), d, (long long)v,
                       g->symbols[s], (long long)symvals[s], bi,
                       bi >= 0 ? jit__input_name(g, bi) : "?", bd);
      }
    }
  }
  return NULL;
}

// Binds the symbols and infers every node's concrete shape into `shapes` (n_nodes
// entries) and the outputs' into `oshapes`. For MLIR graphs `shapes` is unused.
jit_status jit__bind(const jit_graph *g, const DLTensor *inputs, int64_t *symvals,
                     jit__node *shapes, jit__oshape *oshapes) {
  JIT_PROPAGATE(jit__bind_symbols(g, inputs, symvals));
  if (g->mlir) return jit__mlir_graph_bind(g, inputs, oshapes);
  for (uint32_t i = 0; i < g->n_nodes; i++) {
    const jit__node *n = &g->nodes[i].n;
    shapes[i] = *n;
    if (n->op == JIT__OP_INPUT) {
      for (int d = 0; d < n->rank; d++)
        shapes[i].dims[d] = n->dims[d] >= 0 ? n->dims[d] : symvals[JIT__SYMBOL_INDEX(n->dims[d])];
      continue;
    }
    JIT_PROPAGATE(jit__infer_concrete(g, i, shapes, symvals, &shapes[i]));
    // Inputs that fit can bind an intermediate that does not (an outer product of
    // two long vectors): refuse it before compiling a kernel for it.
    uint64_t bytes = 0;
    char what[96];
    int out = -1;
    for (uint32_t j = 0; j < g->n_outputs && out < 0; j++)
      if (g->outputs[j] == i) out = (int)j;
    if (out >= 0)
      snprintf(what, sizeof what, "output %d (node %u, %s)", out, i, jit__op_name(n->op));
    else
      snprintf(what, sizeof what, "node %u (%s)", i, jit__op_name(n->op));
    JIT_PROPAGATE(jit__tensor_bytes(g, what, shapes[i].rank, shapes[i].dims,
                                    jit__elem_bytes(shapes[i].dtype), &bytes));
  }
  for (uint32_t j = 0; j < g->n_outputs; j++) {
    const jit__node *o = &shapes[g->outputs[j]];
    oshapes[j].rank = o->rank;
    memcpy(oshapes[j].dims, o->dims, sizeof(o->dims));
    oshapes[j].dtype = o->dtype;
  }
  return NULL;
}

// The element count of a shape that jit__tensor_bytes accepted (so it cannot wrap).
static uint64_t jit__numel(int rank, const int64_t *dims) {
  uint64_t n = 1;
  for (int d = 0; d < rank; d++) n *= (uint64_t)dims[d];
  return n;
}

//===--- Compile on miss (single flight) ---------------------------------===//

jit__lower_options jit__cpu_lower_options(jit_context *ctx) {
  const jit__cpu_target *t = jit__cpu_host_target();
  const char *dump = ctx->options.dump_ir_dir ? ctx->options.dump_ir_dir
                                               : getenv("JITML_DUMP_IR");
  return (jit__lower_options){.opt_level = ctx->options.opt_level,
                              .dump_dir = dump && dump[0] ? dump : NULL,
                              .triple = t->triple, .cpu = t->cpu, .features = t->features,
                              .l2_bytes = t->l2_bytes, .l3_bytes = t->l3_bytes,
                              .num_threads = jit__cpu_threads(ctx->options.num_threads),
                              .pool = ctx->mlir_pool,
                              .conv_im2col = ctx->options.conv_algorithm ==
                                             JIT_CONV_ALGORITHM_IM2COL};
}

void jit__count_compile(jit_context *ctx, const jit_graph *g, const char *what,
                        double ms, const jit__artifact *art) {
  atomic_fetch_add_explicit(&ctx->compiles, 1, memory_order_relaxed);
  pthread_mutex_lock(&ctx->mu);
  ctx->compile_ms += ms;
  pthread_mutex_unlock(&ctx->mu);
  if (art)
    jit__log(ctx, JIT_LOG_DEBUG,
             "graph `%s`: %s %s compiled in %.1f ms: MLIR %.1f ms, LLVM IR + %s passes "
             "%.1f ms, codegen %.1f ms, %zu-byte object%s%s%s",
             g->name, what, art->entry, ms, art->ms_mlir,
             art->llvm_passes ? art->llvm_passes : "LLVM", art->ms_llvm_opt,
             art->ms_codegen, art->object_size, art->stages[0] ? " (steps, ms: " : "",
             art->stages, art->stages[0] ? ")" : "");
}

// Compiles the kernel for one binding, stores it in the disk cache, and loads it.
static jit_status jit__compile_and_load(jit_graph *g, const DLTensor *inputs,
                                        const jit__node *shapes, jit__oshape *oshapes,
                                        const uint8_t key[16], jit__cpu_impl *impl) {
  jit_context *ctx = g->ctx;
  char hex[33], func_name[48];
  jit__hex_encode(key, 16, hex);
  snprintf(func_name, sizeof(func_name), "jit_%.24s", hex);
  jit__lgraph lg = {g->name, shapes, g->n_nodes, g->inputs, g->n_inputs,
                    g->outputs, g->n_outputs};
  jit__lower_options lo = jit__cpu_lower_options(ctx);
  jit__artifact art;
  double t0 = jit__now_ms();
  jit_status s = g->mlir ? jit__mlir_graph_compile(g, inputs, func_name, &lo, &art, oshapes)
                         : jit__compile_cpu(&lg, func_name, &lo, &art);
  double ms = jit__now_ms() - t0;
  jit__count_compile(ctx, g, "kernel", ms, s ? NULL : &art);
  if (s) return s;
  jit__image image = {JIT__IMAGE_HOST_OBJECT, art.object, art.object_size};
  s = jit__cpu_load_image(ctx, &image, art.entry, impl);
  impl->stack_bytes = art.stack_bytes;
  impl->n_packed = art.n_packed;
  memcpy(impl->packed, art.packed, sizeof impl->packed);
  if (!s) jit__disk_store(g, key, inputs, &art, oshapes);
  jit__artifact_release(&art);
  return s;
}

// How long a process waits for another that is compiling the same key before it
// compiles the kernel itself.
enum { kCompileLockTimeoutMs = 30000 };
// How long an AUTO binding waits for its graph's generic kernel while it compiles in
// the background, before it compiles a kernel of its own. Long enough that only a
// pathological generic compile hits it (the MLP's takes ~0.5 s, ~3 s under ASan), so
// which kernel serves a binding does not depend on the machine's speed.
enum { kGenericWaitMs = 10000 };

// Makes the exact code of key k->key ready: from the disk cache, else by compiling
// it, with a cross-process lock so that processes sharing a cache compile each key
// once. Fills `impl` (CPU) or *gx, and `outs`.
static jit_status jit__materialize(jit_graph *g, const DLTensor *inputs, jit__kernel *k,
                                   jit__cpu_impl *impl, jit__gpu_exec **gx,
                                   jit__oshape *outs) {
  jit_context *ctx = g->ctx;
  bool gpu = k->device->kind != JIT_DEVICE_CPU;
  if (gpu ? jit__gpu_disk_load(g, k->device, k->key, outs, gx)
          : jit__disk_load(g, k->key, impl, outs))
    return NULL;

  jit_status status = NULL;
  int64_t *symvals = malloc(sizeof(int64_t) * (g->n_symbols + 1));
  jit__node *shapes = malloc(sizeof(jit__node) * (g->n_nodes + 1));
  if (!symvals || !shapes) {
    status = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "graph `%s`: out of memory", g->name);
    goto done;
  }
  // Text from outside (and with ALL, every graph's export) compiles in the worker, into
  // the disk cache (jit/isolate.c).
  if (!gpu && (g->mlir ? jit__isolation_on(ctx) : ctx->isolation == JIT_ISOLATION_ALL) &&
      jit__cache_enabled(ctx->cache) && !jit__cache_read_only(ctx->cache)) {
    double t0 = jit__now_ms();
    char *exported = NULL;
    status = g->mlir ? NULL : jit__mlir_export(g, &exported);
    const char *text = g->mlir ? g->mlir->m.exported : exported;
    if (!status)
      status = jit__isolated(ctx, true, g->name, text, strlen(text),
                             g->mlir ? g->mlir->m.entry : NULL, inputs, (int)g->n_inputs,
                             NULL);
    free(exported);
    if (status) goto done;
    if (jit__disk_load_uncounted(g, k->key, impl, outs)) {
      jit__cache_publish(ctx->cache, k->key);  // the worker has no fleet tier
      jit__count_compile(ctx, g, "kernel (in the isolation worker)", jit__now_ms() - t0, NULL);
      goto done;
    }
    jit__log(ctx, JIT_LOG_WARNING, "graph `%s`: the isolation worker's kernel is not in the "
             "disk cache; compiling it in this process", g->name);
  }
  // An MLIR graph compiled for the CPU learns its output shapes from the compile's own
  // specialization: refining the shapes for jit__bind first would do it twice.
  if (g->mlir && !gpu)
    status = jit__bind_symbols(g, inputs, symvals);
  else
    status = jit__bind(g, inputs, symvals, shapes, outs);
  if (status) goto done;

  jit__cache_lock lock;
  bool locked = false;
  jit__cache_lock_fleet(ctx->cache, k->key, kCompileLockTimeoutMs, &lock, &locked);
  // Whoever held the lock may just have stored the kernel.
  if (locked && (gpu ? jit__gpu_disk_load(g, k->device, k->key, outs, gx)
                     : jit__disk_load(g, k->key, impl, outs))) {
    jit__cache_unlock(&lock);
    goto done;
  }
  if (gpu) {
    jit__lgraph lg = {g->name, shapes, g->n_nodes, g->inputs, g->n_inputs,
                      g->outputs, g->n_outputs};
    status = jit__gpu_compile_and_load(g, k->device, &lg, k->key, inputs, outs, gx);
  } else {
    status = jit__compile_and_load(g, inputs, shapes, outs, k->key, impl);
  }
  jit__cache_unlock(&lock);  // also a fleet lock taken without the local one
done:
  free(symvals);
  free(shapes);
  return status;
}

// Takes a use of READY kernel `k` (ctx->mu held), and marks it just used.
static void jit__kernel_take(jit_context *ctx, jit__kernel *k) {
  atomic_fetch_add_explicit(&k->users, 1, memory_order_relaxed);
  k->tick = ++ctx->tick;
}

void jit__kernel_release(jit__kernel *k) {
  if (k) atomic_fetch_sub_explicit(&k->users, 1, memory_order_release);
}

void jit__evict(jit_context *ctx) {
  jit__kernel *list[64];  // unloaded after the lock is dropped, at most 64 a call
  int n = 0;
  pthread_mutex_lock(&ctx->mu);
  while (n < 64 && (ctx->n_code > (uint64_t)ctx->max_loaded ||
                    ctx->code_bytes > ctx->max_loaded_bytes)) {
    // The least recently used kernel with code of its own that no call is running.
    jit__kernel *v = NULL;
    for (size_t i = 0; i < ctx->table.cap; i++) {
      jit__kernel *k = ctx->table.slots[i];
      // (A GPU binding on the generic kernel with its own one asked for stays: the
      // specializer holds it.)
      if (!k || k->state != JIT__K_READY || k->pinned || !jit__kernel_owns_code(k) ||
          atomic_load_explicit(&k->users, memory_order_acquire) != 0 ||
          (atomic_load(&k->gpu_on_generic) && atomic_load(&k->queued)))
        continue;
      if (!v || k->tick < v->tick) v = k;
    }
    if (!v) break;
    jit__table_remove(&ctx->table, v);
    ctx->n_code--;
    ctx->code_bytes -= v->exact.code_bytes;
    list[n++] = v;
  }
  pthread_mutex_unlock(&ctx->mu);
  for (int i = 0; i < n; i++) {
    jit__kernel_free(list[i], ctx->devices[0]);
    atomic_fetch_add_explicit(&ctx->unloaded, 1, memory_order_relaxed);
  }
  if (n)
    jit__log(ctx, JIT_LOG_DEBUG, "unloaded %d least recently used kernel%s (limits: %d "
             "kernels, %llu bytes)", n, n > 1 ? "s" : "", ctx->max_loaded,
             (unsigned long long)ctx->max_loaded_bytes);
}

// Waits (ctx->mu held) until kernel `k` leaves COMPILING; returns its outcome.
static jit_status jit__wait_ready(jit_context *ctx, jit__kernel *k) {
  if (k->state == JIT__K_COMPILING) jit__spec_revive(ctx);  // a forked child's queue
  while (k->state == JIT__K_COMPILING) pthread_cond_wait(&ctx->cv, &ctx->mu);
  if (k->state == JIT__K_READY) return NULL;
  return JIT_ERR(k->fail_code, "%s", k->fail_message ? k->fail_message : "");
}

jit_status jit__claim(jit_context *ctx, jit_device *d, uint32_t n_outputs,
                      const uint8_t key[16], jit__kernel **out, bool *mine) {
  *out = NULL;
  *mine = false;
  jit__kernel *k = calloc(1, sizeof(*k));
  jit__oshape *oshapes = calloc(n_outputs + 1, sizeof(*oshapes));
  if (!k || !oshapes) {
    free(k);
    free(oshapes);
    return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
  }
  memcpy(k->key, key, 16);
  k->device = d;
  k->n_outputs = n_outputs;
  k->outputs = oshapes;
  k->state = JIT__K_COMPILING;
  atomic_init(&k->users, 1);  // the claimer's use

  pthread_mutex_lock(&ctx->mu);
  jit__kernel *other = jit__table_find(&ctx->table, key);
  if (other || !jit__table_insert(&ctx->table, k)) {
    jit__kernel_free(k, ctx->devices[0]);
    jit_status status = other ? jit__wait_ready(ctx, other)
                              : JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
    if (!status) jit__kernel_take(ctx, other);
    pthread_mutex_unlock(&ctx->mu);
    if (!status) *out = other;
    return status;
  }
  k->tick = ++ctx->tick;
  pthread_mutex_unlock(&ctx->mu);
  *out = k;
  *mine = true;
  return NULL;
}

void jit__publish(jit_context *ctx, jit__kernel *k, jit_status status) {
  pthread_mutex_lock(&ctx->mu);
  if (!status && k->pinned) {
    ctx->n_pinned++;
  } else if (!status && jit__kernel_owns_code(k)) {
    ctx->n_code++;
    ctx->code_bytes += k->exact.code_bytes;
  }
  if (status) {
    // Binding and compiling are deterministic: the same key would fail the same way,
    // so later callers get the error without trying again.
    k->fail_code = jit_status_get_code(status);
    size_t len = strlen(jit_status_message(status)) + 1;
    k->fail_message = malloc(len);
    if (k->fail_message) memcpy(k->fail_message, jit_status_message(status), len);
    k->state = JIT__K_FAILED;
  } else {
    k->state = JIT__K_READY;
  }
  pthread_cond_broadcast(&ctx->cv);
  pthread_mutex_unlock(&ctx->mu);
}

// The GPU side of jit__ready_binding: its own kernel from disk (AUTO), else the
// generic kernel launched for this binding (the generic kernel itself compiled on the
// specializer's thread under AUTO, while this first binding compiles its own). false:
// the binding takes its own kernel.
static bool jit__ready_binding_gpu(jit_graph *g, const DLTensor *inputs, jit__kernel *k,
                                   jit_shape_policy policy) {
  bool automatic = policy == JIT_SHAPE_POLICY_AUTO;
  if (automatic && jit__gpu_disk_load(g, k->device, k->key, k->outputs, &k->gpu)) return true;
  jit__kernel *gk = NULL;
  jit_status gs = jit__gpu_generic_get(g, k->device, automatic, &gk);
  if (!gs && gk) gs = jit__serve_generic_gpu(g, inputs, k, gk, automatic);
  if (!gs && gk) return true;
  // No generic kernel (logged where it failed), or this binding is past it (a grid
  // over 65535), or it could not be loaded for it: its own kernel.
  jit_status_free(gs);
  return false;
}

// Makes binding record `k` (claimed by this thread) ready by the graph's shape policy:
// its own kernel (EXACT; AUTO when one is on disk), or the generic kernel.
static jit_status jit__ready_binding(jit_graph *g, const DLTensor *inputs, jit__kernel *k) {
  jit_shape_policy policy = jit__policy_of(g, k->device);
  if (policy != JIT_SHAPE_POLICY_EXACT && k->device->kind != JIT_DEVICE_CPU) {
    if (jit__ready_binding_gpu(g, inputs, k, policy)) return NULL;
    goto exact;
  }
  if (policy != JIT_SHAPE_POLICY_EXACT) {
    if (policy == JIT_SHAPE_POLICY_AUTO &&
        jit__disk_load(g, k->key, &k->exact, k->outputs)) {
      atomic_store_explicit(&k->impl, &k->exact, memory_order_release);
      if (!atomic_exchange(&g->hot_queued, true)) jit__hot_queue(g);
      return NULL;
    }
    // AUTO's first binding of a graph compiles its own kernel now (a generic kernel
    // takes several times as long: the MLP's first result 0.09 s, not 0.3-0.45 s) and
    // queues the generic kernel on the background thread for the bindings after it,
    // which wait for it only while it is still being compiled.
    // (A generic kernel on disk is loaded at once, and used.)
    bool first = policy == JIT_SHAPE_POLICY_AUTO && !atomic_load(&g->generic) &&
                 !atomic_exchange(&g->generic_queued, true);
    // ... but not forever: past kGenericWaitMs a binding compiles its own kernel (a
    // generic kernel of many wide matmuls can take tens of seconds, exact kernels
    // ~0.5 s each), and the generic kernel serves those after it is in.
    if (policy == JIT_SHAPE_POLICY_AUTO && !first && !atomic_load(&g->generic) &&
        jit__generic_compiling(g, kGenericWaitMs))
      goto exact;
    jit__kernel *gk = NULL;
    jit_status s = jit__generic_get_or_queue(g, first, &gk);
    // The bindings earlier processes found hot get their own kernels next (hot.c).
    if (!s && policy == JIT_SHAPE_POLICY_AUTO && !atomic_exchange(&g->hot_queued, true))
      jit__hot_queue(g);
    if (!s && !gk) goto exact;
    if (!s) return jit__serve_generic(g, inputs, k, gk, policy == JIT_SHAPE_POLICY_AUTO);
    // The generic kernel cannot be had (logged once, g->generic_failed): the graph runs
    // EXACT from now on.
    jit_status_free(s);
  }
exact:
  JIT_PROPAGATE(jit__materialize(g, inputs, k, &k->exact, &k->gpu, k->outputs));
  atomic_store_explicit(&k->impl, &k->exact, memory_order_release);
  return NULL;
}

// The dispatch: returns the ready kernel for `key`, loading or compiling it if needed.
// All of kernel selection goes through here.
static jit_status jit__dispatch(jit_graph *g, jit_device *d, const DLTensor *inputs,
                                const uint8_t key[16], jit__kernel **out) {
  jit_context *ctx = g->ctx;
  *out = NULL;
  pthread_mutex_lock(&ctx->mu);
  jit__kernel *k = jit__table_find(&ctx->table, key);
  if (k && k->state == JIT__K_READY) {
    jit__kernel_take(ctx, k);
    pthread_mutex_unlock(&ctx->mu);
    atomic_fetch_add_explicit(&ctx->memory_hits, 1, memory_order_relaxed);
    *out = k;
    return NULL;
  }
  atomic_fetch_add_explicit(&ctx->misses, 1, memory_order_relaxed);
  if (k) {
    jit_status s = jit__wait_ready(ctx, k);
    if (!s) jit__kernel_take(ctx, k);
    pthread_mutex_unlock(&ctx->mu);
    if (!s) *out = k;
    return s;
  }
  pthread_mutex_unlock(&ctx->mu);

  // First for this key: check the symbols before claiming it, so a bad call does not
  // leave a failed entry behind.
  int64_t *symvals = malloc(sizeof(int64_t) * (g->n_symbols + 1));
  jit_status status = symvals ? jit__bind_symbols(g, inputs, symvals)
                              : JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
  free(symvals);
  if (status) return status;
  bool mine = false;
  status = jit__claim(ctx, d, g->n_outputs, key, &k, &mine);
  if (status || !mine) {
    if (!status) *out = k;
    return status ? jit__status_annotate(status, "graph `%s`", g->name) : NULL;
  }
  status = jit__ready_binding(g, inputs, k);
  if (status) jit__log(ctx, JIT_LOG_ERROR, "%s", jit_status_message(status));
  jit__publish(ctx, k, status);
  if (status) {
    jit__kernel_release(k);
    return status;
  }
  *out = k;
  jit__evict(ctx);  // never `k`: this call holds it
  return NULL;
}

//===--- Background specialization ---------------------------------------===//

// Input tensors (shapes only) for a binding's input dims, concatenated.
static void jit__binding_inputs(const jit_graph *g, const int64_t *dims, DLTensor *in) {
  for (uint32_t i = 0; i < g->n_inputs; i++) {
    const jit__node *decl = &g->nodes[g->inputs[i]].n;
    in[i] = (DLTensor){.device = {kDLCPU, 0}, .ndim = decl->rank, .shape = (int64_t *)dims,
                       .dtype = jit__dtype_dl(decl->dtype)};
    dims += decl->rank;
  }
}

void jit__specialize_binding(jit_graph *g, jit__kernel *k) {
  jit_context *ctx = g->ctx;
  DLTensor *in = calloc(g->n_inputs + 1, sizeof(*in));
  jit__oshape *outs = calloc(g->n_outputs + 1, sizeof(*outs));
  jit_status s = NULL;
  if (!in || !outs) {
    s = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
  } else {
    // The binding's input shapes are the first of the sizes its generic calls pass.
    jit__binding_inputs(g, k->dims, in);
    double t0 = jit__now_ms();
    // Into a copy: until the switch `k` holds no code of its own, so no eviction
    // looks at it; after it, `k` may be unloaded (and freed) at once.
    jit__cpu_impl im = {0};
    jit__gpu_exec *ex = NULL;
    s = jit__materialize(g, in, k, &im, &ex, outs);
    bool gpu = k->device->kind != JIT_DEVICE_CPU;
    if (!s) {
      const int64_t *row = k->dims;
      if (!gpu) jit__hot_note(g, &row, 1);  // a restart prepares it first (hot.c)
      atomic_fetch_add_explicit(&ctx->specializations, 1, memory_order_relaxed);
      pthread_mutex_lock(&ctx->mu);
      if (gpu) {
        // Calls still running the generic one keep it: it goes with the record.
        k->gpu_retired = k->gpu;
        __atomic_store_n(&k->gpu, ex, __ATOMIC_RELEASE);
        atomic_store(&k->gpu_on_generic, false);
      } else {
        k->exact = im;
        atomic_store_explicit(&k->impl, &k->exact, memory_order_release);
        ctx->n_code++;
        ctx->code_bytes += k->exact.code_bytes;
      }
      pthread_mutex_unlock(&ctx->mu);
      jit__evict(ctx);
      jit__log(ctx, JIT_LOG_DEBUG, "graph `%s`: a binding got its own kernel in the "
               "background (%.1f ms)", g->name, jit__now_ms() - t0);
    }
  }
  if (s) {
    atomic_fetch_add_explicit(&ctx->spec_failures, 1, memory_order_relaxed);
    jit__log(ctx, JIT_LOG_WARNING, "graph `%s`: specializing a binding in the background "
             "failed; it stays on the generic kernel: %s", g->name, jit_status_message(s));
    jit_status_free(s);
  }
  free(in);
  free(outs);
}

jit_status jit__warm_binding(jit_graph *g, const int64_t *dims, bool background) {
  jit_context *ctx = g->ctx;
  jit_device *d = ctx->devices[0];
  DLTensor *in = calloc(g->n_inputs + 1, sizeof(*in));
  int64_t *symvals = malloc(sizeof(int64_t) * (g->n_symbols + 1));
  jit_status s = NULL;
  uint8_t key[16];
  if (!in || !symvals) {
    s = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "graph `%s`: out of memory", g->name);
    goto done;
  }
  jit__binding_inputs(g, dims, in);
  s = jit__inputs_key(g, in, (int)g->n_inputs, false, d, key);
  if (!s) s = jit__bind_symbols(g, in, symvals);
  if (s) goto done;
  // In the background a new kernel counts against the graph's limit (past it, the
  // binding is left to the calls: its record would otherwise hold the refusal).
  bool counted = false;
  if (background) {
    pthread_mutex_lock(&ctx->mu);
    bool known = jit__table_find(&ctx->table, key) != NULL;
    pthread_mutex_unlock(&ctx->mu);
    if (!known && !jit__spec_allow(g)) goto done;
    counted = !known;
  }
  jit__kernel *k = NULL;
  bool mine = false;
  s = jit__claim(ctx, d, g->n_outputs, key, &k, &mine);
  if (s) goto done;
  jit__kernel *gk = background ? atomic_load_explicit(&g->generic, memory_order_acquire)
                               : NULL;
  if (mine && gk && !jit__disk_load(g, k->key, &k->exact, k->outputs)) {
    // To be compiled: calls of it meanwhile run on the generic kernel, not wait.
    s = jit__serve_generic(g, in, k, gk, true);
    jit__publish(ctx, k, s);
    if (!s) {
      atomic_store_explicit(&k->queued, true, memory_order_relaxed);
      jit__specialize_binding(g, k);
    }
  } else if (mine) {
    // Not asked for yet in this process: its own kernel, as EXACT would make it.
    bool loaded = gk != NULL;  // by the test above
    if (!loaded) s = jit__materialize(g, in, k, &k->exact, &k->gpu, k->outputs);
    if (!s) atomic_store_explicit(&k->impl, &k->exact, memory_order_release);
    jit__publish(ctx, k, s);
    if (!s && background)
      atomic_fetch_add_explicit(&ctx->specializations, 1, memory_order_relaxed);
  } else {
    // Running on the generic kernel already: switched to its own now.
    const jit__cpu_impl *im = atomic_load_explicit(&k->impl, memory_order_acquire);
    if (im && im->dims && k->specialize &&
        !atomic_exchange_explicit(&k->queued, true, memory_order_relaxed) &&
        (counted || !background || jit__spec_allow(g)))
      jit__specialize_binding(g, k);
  }
  jit__kernel_release(k);
  if (!s) jit__evict(ctx);
done:
  free(in);
  free(symvals);
  return s;
}

//===--- Public entry points ---------------------------------------------===//

static jit_status jit__check_outputs(const jit_graph *g, const jit__oshape *oshapes,
                                     const DLTensor *outputs, int n_outputs,
                                     const DLTensor *inputs, jit_device *d) {
  if (n_outputs != (int)g->n_outputs)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "graph `%s` has %u outputs, got %d", g->name,
                   g->n_outputs, n_outputs);
  if (!outputs)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "graph `%s`: outputs is NULL", g->name);
  for (int j = 0; j < n_outputs; j++) {
    const DLTensor *t = &outputs[j];
    const jit__oshape *o = &oshapes[j];
    JIT_PROPAGATE(jit__check_tensor(g, "output", j, "", t, true, d));
    jit__dtype dt = JIT__F32;
    if (!jit__dl_dtype(t->dtype, &dt) || dt != o->dtype)
      return JIT_ERR(JIT_DTYPE_MISMATCH,
                     "graph `%s`: output %d: dtype (code %d, %d bits) but the graph "
                     "produces %s",
                     g->name, j, t->dtype.code, t->dtype.bits, jit__dtype_str(o->dtype));
    bool same = t->ndim == o->rank;
    for (int d = 0; same && d < o->rank; d++) same = t->shape[d] == o->dims[d];
    if (!same) {
      char want[200], got[200];
      jit__fmt_shape(o->rank, o->dims, want, sizeof want);
      jit__fmt_shape(t->ndim, t->shape, got, sizeof got);
      return JIT_ERR(JIT_SHAPE_MISMATCH,
                     "graph `%s`: output %d has shape %s but the graph produces %s for "
                     "these inputs",
                     g->name, j, got, want);
    }
    if (d->kind != JIT_DEVICE_CPU) {
      for (uint32_t i = 0; i < g->n_inputs; i++)
        if (inputs[i].data == t->data)
          return JIT_ERR(JIT_INVALID_ARGUMENT,
                         "graph `%s`: output %d is input %u `%s`; outputs must not alias "
                         "inputs", g->name, j, i, jit__input_name(g, (int)i));
      continue;
    }
    // Kernels read inputs after writing outputs; overlapping buffers would be wrong.
    size_t esz = (size_t)jit__dtype_bytes(dt);
    const char *ob = (const char *)t->data + t->byte_offset;
    const char *oe = ob + jit__numel(o->rank, o->dims) * esz;
    for (uint32_t i = 0; i < g->n_inputs; i++) {
      const DLTensor *in = &inputs[i];
      size_t isz = in->dtype.bits / 8;
      const char *ib = (const char *)in->data + in->byte_offset;
      const char *ie = ib + jit__numel(in->ndim, in->shape) * isz;
      if (ob < ie && ib < oe)
        return JIT_ERR(JIT_INVALID_ARGUMENT,
                       "graph `%s`: output %d overlaps input %u `%s`; outputs must not "
                       "alias inputs",
                       g->name, j, i, jit__input_name(g, (int)i));
    }
    // Nor each other: a kernel writes each output as its own (noalias) buffer.
    for (int i = 0; i < j; i++) {
      const DLTensor *p = &outputs[i];
      const char *pb = (const char *)p->data + p->byte_offset;
      size_t psz = (size_t)jit__dtype_bytes(oshapes[i].dtype);
      const char *pe = pb + jit__numel(oshapes[i].rank, oshapes[i].dims) * psz;
      if (ob < pe && pb < oe)
        return JIT_ERR(JIT_INVALID_ARGUMENT,
                       "graph `%s`: output %d overlaps output %d; outputs must not alias "
                       "each other", g->name, j, i);
    }
  }
  return NULL;
}

//===--- Zero-size bindings ----------------------------------------------===//

// True if some input has a zero dim (the inputs passed jit__inputs_key).
static bool jit__any_empty_input(const jit_graph *g, const DLTensor *inputs) {
  for (uint32_t i = 0; i < g->n_inputs; i++)
    if (jit__numel(inputs[i].ndim, inputs[i].shape) == 0) return true;
  return false;
}

// A binding with an empty input runs no kernel: kernels are lowered for non-empty
// loops, and an empty result needs nothing written. It is accepted when every output
// is empty too. An op that makes a non-empty value from an empty one (matmul with
// K = 0, a reduction or softmax over an empty axis feeding a non-empty output) would
// need its identity written, which no kernel here does: JIT_UNSUPPORTED naming it
// (the header says so). Writes the outputs' shapes into `oshapes`.
static jit_status jit__empty_binding(jit_graph *g, const DLTensor *inputs,
                                     jit__oshape *oshapes) {
  int64_t *symvals = malloc(sizeof(int64_t) * (g->n_symbols + 1));
  jit__node *shapes = malloc(sizeof(jit__node) * (g->n_nodes + 1));
  jit_status s = symvals && shapes ? jit__bind(g, inputs, symvals, shapes, oshapes)
                                   : JIT_ERR(JIT_RESOURCE_EXHAUSTED,
                                             "graph `%s`: out of memory", g->name);
  for (uint32_t i = 0; !s && !g->mlir && i < g->n_nodes; i++) {
    const jit__node *n = &shapes[i];
    if (jit__numel(n->rank, n->dims) == 0) continue;
    for (int o = 0; o < n->n_operands; o++) {
      const jit__node *a = &shapes[n->operands[o]];
      if (jit__numel(a->rank, a->dims) != 0) continue;
      char sa[200], sn[200];
      s = JIT_ERR(JIT_UNSUPPORTED,
                  "graph `%s`: node %u (%s) makes a non-empty result %s from an empty "
                  "operand %s; zero-size bindings run only where every value computed "
                  "from an empty one is empty",
                  g->name, i, jit__op_name(n->op), jit__fmt_shape(n->rank, n->dims, sn,
                  sizeof sn), jit__fmt_shape(a->rank, a->dims, sa, sizeof sa));
      break;
    }
  }
  for (uint32_t j = 0; !s && j < g->n_outputs; j++) {
    if (jit__numel(oshapes[j].rank, oshapes[j].dims) == 0) continue;
    char so[200];
    s = JIT_ERR(JIT_UNSUPPORTED,
                "graph `%s`: output %u has shape %s but an input is empty; a binding "
                "with an empty input runs only when every output is empty",
                g->name, j, jit__fmt_shape(oshapes[j].rank, oshapes[j].dims, so, sizeof so));
  }
  free(symvals);
  free(shapes);
  return s;
}

// jit_run for a binding with an empty input: checks the outputs against the empty
// shapes and returns them untouched (they hold no elements).
static jit_status jit__run_empty(jit_graph *g, const DLTensor *inputs,
                                 const DLTensor *outputs, int n_outputs, jit_device *d) {
  jit__oshape *oshapes = calloc(g->n_outputs + 1, sizeof(*oshapes));
  if (!oshapes) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "jit_run: out of memory");
  jit_status s = jit__empty_binding(g, inputs, oshapes);
  bool host = g->n_inputs == 0 || inputs[0].device.device_type == kDLCPU;
  if (!s)
    s = jit__check_outputs(g, oshapes, outputs, n_outputs, inputs,
                           host ? g->ctx->devices[0] : d);
  free(oshapes);
  return s;
}

// Runs GPU kernel `k` on host tensors: uploads the inputs into temporary device
// buffers, runs, downloads the outputs (options.device offloading).
static jit_status jit__call_offloaded(jit_graph *g, jit__gpu_exec *ex, const DLTensor *inputs,
                                      const DLTensor *outputs, int n_outputs) {
  jit_device *d = jit__gpu_exec_device(ex);
  uint32_t n_in = g->n_inputs, n_out = g->n_outputs;
  DLTensor *dev = calloc(n_in + n_out + 1, sizeof(DLTensor));
  if (!dev) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "jit_run: out of memory");
  jit_status s = NULL;
  for (uint32_t i = 0; i < n_in + n_out && !s; i++) {
    const DLTensor *h = i < n_in ? &inputs[i] : &outputs[i - n_in];
    dev[i] = *h;
    dev[i].device = d->dl;
    dev[i].strides = NULL;
    dev[i].byte_offset = 0;
    uint64_t bytes = jit__numel(h->ndim, h->shape) * (h->dtype.bits / 8);
    void *buf = NULL;
    s = jit__device_buffer_alloc(d, bytes, &buf);
    dev[i].data = buf;
    if (!s && i < n_in)
      s = jit__device_upload(d, buf, 0, (const char *)h->data + h->byte_offset, bytes);
  }
  if (!s) s = jit__gpu_run(ex, dev, n_in, dev + n_in, n_out, NULL);
  for (uint32_t j = 0; j < n_out && !s; j++) {
    const DLTensor *h = &outputs[j];
    uint64_t bytes = jit__numel(h->ndim, h->shape) * (h->dtype.bits / 8);
    s = jit__device_download(d, dev[n_in + j].data, 0, (char *)h->data + h->byte_offset,
                             bytes);
  }
  for (uint32_t i = 0; i < n_in + n_out; i++) {
    if (!dev[i].data) continue;
    jit_status f = jit__device_buffer_free(d, dev[i].data);
    if (f) jit_status_free(f);
  }
  free(dev);
  return s;
}

// A run of binding `k` on its graph's generic kernel: counted; under AUTO the call
// that makes the binding hot asks for its own kernel, once.
static void jit__count_generic_run(jit_graph *g, jit__kernel *k) {
  atomic_fetch_add_explicit(&g->ctx->generic_runs, 1, memory_order_relaxed);
  if (k->specialize &&
      atomic_fetch_add_explicit(&k->hits, 1, memory_order_relaxed) + 1 >=
          (unsigned)g->ctx->specialize_after &&
      !atomic_exchange_explicit(&k->queued, true, memory_order_relaxed))
    jit__spec_enqueue(g, k);
}

// Checks the outputs against kernel `k` and runs it (GPU kernels on `stream`, the
// caller's CUDA stream, where not NULL).
static jit_status jit__call(jit_graph *g, jit__kernel *k, const DLTensor *inputs,
                            const DLTensor *outputs, int n_outputs, void *stream) {
  jit_device *d = k->device;
  bool host = g->n_inputs == 0 || inputs[0].device.device_type == kDLCPU;
  jit_device *od = host ? g->ctx->devices[0] : d;
  JIT_PROPAGATE(jit__check_outputs(g, k->outputs, outputs, n_outputs, inputs, od));
  if (d->kind != JIT_DEVICE_CPU) {
    jit__gpu_exec *ex = __atomic_load_n(&k->gpu, __ATOMIC_ACQUIRE);
    bool generic = atomic_load_explicit(&k->gpu_on_generic, memory_order_relaxed);
    jit_status s = host ? jit__call_offloaded(g, ex, inputs, outputs, n_outputs)
                        : jit__gpu_run(ex, inputs, g->n_inputs, outputs, g->n_outputs,
                                       stream);
    if (s) return jit__status_annotate(s, "graph `%s` on %s:%d", g->name,
                                       jit__device_kind_name(d->kind), d->ordinal);
    atomic_fetch_add_explicit(&g->ctx->runs, 1, memory_order_relaxed);
    if (generic) jit__count_generic_run(g, k);
    return NULL;
  }
  const jit__cpu_impl *im = atomic_load_explicit(&k->impl, memory_order_acquire);
  // Kernels keep their packed blocks and scratch rows on the calling thread's stack:
  // a thread with too little left (small pthread or musl stacks) gets an error rather
  // than a crash. 64 KiB more for the kernel's own frames and the OpenMP fork.
  if (im->stack_bytes) {
    size_t left = jit__cpu_stack_left(), need = (size_t)im->stack_bytes + (64u << 10);
    if (left < need)
      return JIT_ERR(JIT_RESOURCE_EXHAUSTED,
                     "jit_run: graph `%s`: its kernel for these shapes needs %zu KiB of "
                     "stack and the calling thread has %zu KiB left; call it from a "
                     "thread with a larger stack (pthread_attr_setstacksize)",
                     g->name, need >> 10, left >> 10);
    size_t workers = im->threaded ? jit__cpu_omp_stack() : SIZE_MAX;
    if (workers < need)
      return JIT_ERR(JIT_RESOURCE_EXHAUSTED,
                     "jit_run: graph `%s`: its kernel for these shapes needs %zu KiB of "
                     "stack on each OpenMP worker thread and they have %zu KiB; raise "
                     "OMP_STACKSIZE before the process starts, or run it with "
                     "jit_options.num_threads = 1",
                     g->name, need >> 10, workers >> 10);
  }
  // A generic kernel takes one more argument: the sizes of this binding.
  void *stack_args[33];
  size_t n_args = g->n_inputs + g->n_outputs;
  void **args = n_args < 33 ? stack_args : malloc((n_args + 1) * sizeof(void *));
  if (!args) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "jit_run: out of memory");
  for (uint32_t i = 0; i < g->n_inputs; i++)
    args[i] = (char *)inputs[i].data + inputs[i].byte_offset;
  for (uint32_t j = 0; j < g->n_outputs; j++)
    args[g->n_inputs + j] = (char *)outputs[j].data + outputs[j].byte_offset;
  args[n_args] = (void *)im->dims;
  jit_status ws = im->n_packed ? jit__weights_acquire(g, im, inputs, args) : NULL;
  if (ws) {
    if (args != stack_args) free(args);
    return ws;
  }
  im->fn(args);
  if (im->n_packed) jit__weights_release(g, im);
  if (args != stack_args) free(args);
  atomic_fetch_add_explicit(&g->ctx->runs, 1, memory_order_relaxed);
  if (im->dims) jit__count_generic_run(g, k);
  return NULL;
}

void jit_run_options_init(jit_run_options *o) {
  if (!o) return;
  memset(o, 0, sizeof(*o));
  o->struct_size = sizeof(*o);
}

jit_status jit_run(jit_graph *g, const DLTensor *inputs, int n_inputs,
                   const DLTensor *outputs, int n_outputs) {
  return jit_run_ex(g, inputs, n_inputs, outputs, n_outputs, NULL);
}

jit_status jit_run_ex(jit_graph *g, const DLTensor *inputs, int n_inputs,
                      const DLTensor *outputs, int n_outputs, const jit_run_options *o) {
  if (!g) return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_run: graph is NULL");
  void *stream = NULL;
  if (o) {
    if (o->struct_size < offsetof(jit_run_options, cuda_stream) + sizeof(void *))
      return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_run_ex: graph `%s`: options.struct_size "
                     "is %zu; call jit_run_options_init first", g->name, o->struct_size);
    stream = o->cuda_stream;
  }
  jit_device *d = NULL;
  JIT_PROPAGATE(jit__run_device(g, inputs, n_inputs, true, &d));
  if (stream && (d->kind != JIT_DEVICE_CUDA ||
                 (g->n_inputs && inputs[0].device.device_type != kDLCUDA)))
    return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_run_ex: graph `%s`: options.cuda_stream is "
                   "for runs on CUDA tensors; this run is on %s %s", g->name,
                   g->n_inputs && inputs[0].device.device_type == kDLCPU ? "host tensors, on"
                                                                         : "tensors of",
                   jit__device_kind_name(d->kind));
  uint8_t key[16];
  JIT_PROPAGATE(jit__inputs_key(g, inputs, n_inputs, true, d, key));
  if (n_outputs != (int)g->n_outputs || !outputs)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "graph `%s` has %u outputs, got %d%s", g->name,
                   g->n_outputs, n_outputs, outputs ? "" : " (outputs is NULL)");
  // Before the empty path: indices into a table with no rows are out of range.
  JIT_PROPAGATE(jit__check_indices(g, inputs));
  if (jit__any_empty_input(g, inputs))
    return jit__run_empty(g, inputs, outputs, n_outputs, d);
  jit__kernel *k = NULL;
  JIT_PROPAGATE(jit__dispatch(g, d, inputs, key, &k));
  jit_status s = jit__call(g, k, inputs, outputs, n_outputs, stream);
  jit__kernel_release(k);
  return s;
}

jit_status jit_graph_compile(jit_graph *g, const DLTensor *inputs, int n_inputs) {
  if (!g) return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_graph_compile: graph is NULL");
  jit_device *d = NULL;
  JIT_PROPAGATE(jit__run_device(g, inputs, n_inputs, true, &d));
  uint8_t key[16];
  JIT_PROPAGATE(jit__inputs_key(g, inputs, n_inputs, false, d, key));
  if (jit__any_empty_input(g, inputs)) {  // nothing to compile; refused as jit_run would
    jit__oshape *oshapes = calloc(g->n_outputs + 1, sizeof(*oshapes));
    if (!oshapes) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "jit_graph_compile: out of memory");
    jit_status s = jit__empty_binding(g, inputs, oshapes);
    free(oshapes);
    return s;
  }
  jit__kernel *k = NULL;
  jit_status s = jit__dispatch(g, d, inputs, key, &k);
  jit__kernel_release(k);
  return s;
}

// Binds `inputs` and writes every output's shape and dtype (g->n_outputs entries).
static jit_status jit__output_shapes(jit_graph *g, const DLTensor *inputs, int n_inputs,
                                     jit__oshape *oshapes) {
  jit_device *d = NULL;
  JIT_PROPAGATE(jit__run_device(g, inputs, n_inputs, true, &d));
  uint8_t key[16];
  JIT_PROPAGATE(jit__inputs_key(g, inputs, n_inputs, false, d, key));
  // A loaded kernel knows its output shapes: no binding (and, for graphs from MLIR,
  // no MLIR context) needed.
  pthread_mutex_lock(&g->ctx->mu);
  jit__kernel *k = jit__table_find(&g->ctx->table, key);
  bool ready = k && k->state == JIT__K_READY;
  if (ready) memcpy(oshapes, k->outputs, sizeof(jit__oshape) * g->n_outputs);
  pthread_mutex_unlock(&g->ctx->mu);
  if (ready) return NULL;
  int64_t *symvals = malloc(sizeof(int64_t) * (g->n_symbols + 1));
  jit__node *shapes = malloc(sizeof(jit__node) * (g->n_nodes + 1));
  jit_status s = NULL;
  if (!symvals || !shapes)
    s = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "graph `%s`: out of memory", g->name);
  else
    s = jit__bind(g, inputs, symvals, shapes, oshapes);
  free(symvals);
  free(shapes);
  return s;
}

jit_status jit_output_shape(jit_graph *g, const DLTensor *inputs, int n_inputs,
                            int index, int *out_rank, int64_t *out_dims) {
  if (out_rank) *out_rank = 0;
  if (!g || !out_rank || !out_dims)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_output_shape: %s is NULL",
                   !g ? "graph" : !out_rank ? "out_rank" : "out_dims");
  if (g->finalized && (index < 0 || index >= (int)g->n_outputs))
    return JIT_ERR(JIT_INVALID_ARGUMENT, "graph `%s`: output index %d not in [0, %u)",
                   g->name, index, g->n_outputs);
  jit__oshape *oshapes = malloc(sizeof(jit__oshape) * (g->n_outputs + 1));
  if (!oshapes) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "jit_output_shape: out of memory");
  jit_status s = jit__output_shapes(g, inputs, n_inputs, oshapes);
  if (!s) {
    *out_rank = oshapes[index].rank;
    memcpy(out_dims, oshapes[index].dims, sizeof(int64_t) * (size_t)oshapes[index].rank);
  }
  free(oshapes);
  return s;
}

//===--- jit_run_alloc ---------------------------------------------------===//

typedef struct jit__owned_tensor {
  DLManagedTensor managed;
  int64_t shape[JIT_MAX_RANK];
} jit__owned_tensor;

static void jit__owned_deleter(DLManagedTensor *self) {
  if (!self) return;
  free(self->dl_tensor.data);
  free(self);  // managed is the first member of jit__owned_tensor
}

jit_status jit_run_alloc(jit_graph *g, const DLTensor *inputs, int n_inputs,
                         DLManagedTensor **out_outputs, int n_outputs) {
  if (!g || !out_outputs)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_run_alloc: %s is NULL",
                   !g ? "graph" : "out_outputs");
  for (int j = 0; j < n_outputs; j++) out_outputs[j] = NULL;
  if (n_outputs != (int)g->n_outputs)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "graph `%s` has %u outputs, got %d", g->name,
                   g->n_outputs, n_outputs);
  // Dispatch first: the kernel (from memory, disk or a compile) carries the output
  // shapes, so a hit needs no shape inference.
  jit_device *d = NULL;
  JIT_PROPAGATE(jit__run_device(g, inputs, n_inputs, true, &d));
  if (n_inputs > 0 && inputs && inputs[0].device.device_type != kDLCPU)
    return JIT_ERR(JIT_UNSUPPORTED, "jit_run_alloc: allocates host outputs, so it takes "
                   "host inputs; for device tensors use jit_tensor_alloc and jit_run");
  uint8_t key[16];
  JIT_PROPAGATE(jit__inputs_key(g, inputs, n_inputs, true, d, key));
  // A binding with an empty input has no kernel (see jit__empty_binding): its
  // outputs are allocated empty and nothing runs.
  jit__kernel *k = NULL;
  jit__oshape *empty = NULL;
  const jit__oshape *oshapes;
  if (jit__any_empty_input(g, inputs)) {
    empty = calloc(g->n_outputs + 1, sizeof(*empty));
    if (!empty) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "jit_run_alloc: out of memory");
    jit_status s = jit__empty_binding(g, inputs, empty);
    if (s) {
      free(empty);
      return s;
    }
    oshapes = empty;
  } else {
    JIT_PROPAGATE(jit__dispatch(g, d, inputs, key, &k));
    oshapes = k->outputs;
  }
  DLTensor *views = calloc((size_t)n_outputs + 1, sizeof(DLTensor));
  jit_status s = views ? NULL : JIT_ERR(JIT_RESOURCE_EXHAUSTED, "jit_run_alloc: out of memory");
  for (int j = 0; j < n_outputs && !s; j++) {
    jit__owned_tensor *o = calloc(1, sizeof(*o));
    if (!o) {
      s = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "jit_run_alloc: out of memory");
      break;
    }
    out_outputs[j] = &o->managed;
    o->managed.deleter = jit__owned_deleter;
    int rank = oshapes[j].rank;
    memcpy(o->shape, oshapes[j].dims, sizeof(int64_t) * (size_t)rank);
    DLTensor *t = &o->managed.dl_tensor;
    t->device = (DLDevice){kDLCPU, 0};
    t->ndim = rank;
    t->shape = o->shape;
    t->dtype = jit__dtype_dl(oshapes[j].dtype);
    // Graphs from MLIR learn their output shapes from the compile, not jit__bind:
    // size every output here, before the allocation a wrapped count would undersize.
    uint64_t bytes = 0;
    char where[32];
    snprintf(where, sizeof where, "output %d", j);
    s = jit__tensor_bytes(g, where, rank, o->shape, t->dtype.bits / 8, &bytes);
    if (s) break;
    // 64-byte alignment: whole cache lines and aligned vector loads for the kernel. An
    // empty output still gets a (unique, freeable) buffer.
    t->data = aligned_alloc(64, bytes ? (size_t)(bytes + 63) / 64 * 64 : 64);
    if (!t->data) {
      s = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "jit_run_alloc: out of memory for output %d "
                  "(%llu bytes)", j, (unsigned long long)bytes);
      break;
    }
    views[j] = *t;
  }
  if (!s && k) s = jit__call(g, k, inputs, views, n_outputs, NULL);
  jit__kernel_release(k);
  free(views);
  free(empty);
  if (s) {
    for (int j = 0; j < n_outputs; j++) {
      if (out_outputs[j]) out_outputs[j]->deleter(out_outputs[j]);
      out_outputs[j] = NULL;
    }
  }
  return s;
}
