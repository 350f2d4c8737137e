//===--- shapes.c - shape policies and generic kernels ---------------------===//
//
// A graph with symbolic dims has one generic kernel per device: the graph lowered
// with those dims kept as `?` (lowering/cpu/generic.c), keyed by everything a binding
// key holds except the symbols' values, and cached on disk like any kernel. Under
// AUTO and GENERIC a binding seen for the first time runs on it at once: its record
// in the kernel table points at the generic code plus the binding's sizes (the
// generic entry's last argument). Under AUTO a binding that keeps coming back gets
// its own kernel from the specializer (specialize.c) and switches to it.
//
// Where no generic kernel can be had the graph runs EXACT: graphs without symbols
// (their one binding is the generic one), graphs from MLIR (their `?` dims are
// specialized by import_mlir.c), GPU devices (their launch plans are static), and a
// graph whose generic compile failed (logged once, and kept in the graph).
//
//===----------------------------------------------------------------------===//
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "base/clock.h"
#include "base/hex.h"
#include "jit/internal.h"
#include "jit/kernel_table.h"

enum { kDefaultSpecializeAfter = 4, kDefaultMaxSpecializations = 64, kMaxLimit = 1000000 };

static const char *const kPolicyNames[] = {"auto", "exact", "generic"};

jit_status jit__shape_options(jit_context *ctx, const jit_options *o) {
  if ((int)o->shape_policy < JIT_SHAPE_POLICY_AUTO ||
      (int)o->shape_policy > JIT_SHAPE_POLICY_GENERIC)
    return JIT_ERR(JIT_INVALID_ARGUMENT,
                   "jit_context_create: options.shape_policy is %d, not a jit_shape_policy "
                   "(JIT_SHAPE_POLICY_AUTO, _EXACT or _GENERIC)", (int)o->shape_policy);
  if (o->specialize_after < 0 || o->specialize_after > kMaxLimit)
    return JIT_ERR(JIT_INVALID_ARGUMENT,
                   "jit_context_create: options.specialize_after is %d, not in [0, %d]",
                   o->specialize_after, kMaxLimit);
  if (o->max_specializations < 0 || o->max_specializations > kMaxLimit)
    return JIT_ERR(JIT_INVALID_ARGUMENT,
                   "jit_context_create: options.max_specializations is %d, not in [0, %d]",
                   o->max_specializations, kMaxLimit);
  ctx->policy = o->shape_policy;
  const char *env = getenv("JITML_SHAPE_POLICY");
  if (env && env[0]) {
    int found = jit__env_choice(env, kPolicyNames, 3);
    if (found < 0)
      return JIT_ERR(JIT_INVALID_ARGUMENT,
                     "jit_context_create: JITML_SHAPE_POLICY is `%s`, not auto, exact or "
                     "generic", env);
    ctx->policy = (jit_shape_policy)found;
  }
  if (o->max_loaded_kernels < 0 || o->max_loaded_kernels > kMaxLimit)
    return JIT_ERR(JIT_INVALID_ARGUMENT,
                   "jit_context_create: options.max_loaded_kernels is %d, not in [0, %d]",
                   o->max_loaded_kernels, kMaxLimit);
  ctx->max_loaded = o->max_loaded_kernels ? o->max_loaded_kernels : 1024;
  ctx->max_loaded_bytes =
      o->max_loaded_kernel_bytes ? o->max_loaded_kernel_bytes : (uint64_t)256 << 20;
  ctx->specialize_after = o->specialize_after ? o->specialize_after : kDefaultSpecializeAfter;
  ctx->max_specializations =
      o->max_specializations ? o->max_specializations : kDefaultMaxSpecializations;
  return NULL;
}

jit_status jit_graph_set_shape_policy(jit_graph *g, jit_shape_policy policy) {
  if (!g) return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_graph_set_shape_policy: graph is NULL");
  if ((int)policy < JIT_SHAPE_POLICY_AUTO || (int)policy > JIT_SHAPE_POLICY_GENERIC)
    return JIT_ERR(JIT_INVALID_ARGUMENT,
                   "jit_graph_set_shape_policy: graph `%s`: policy is %d, not a "
                   "jit_shape_policy", g->name, (int)policy);
  atomic_store(&g->shape_policy, (int)policy);
  return NULL;
}

jit_shape_policy jit__policy_of(jit_graph *g, const jit_device *d) {
  if (g->n_symbols == 0 || g->mlir) return JIT_SHAPE_POLICY_EXACT;
  int p = atomic_load_explicit(&g->shape_policy, memory_order_relaxed);
  jit_shape_policy policy = p >= 0 ? (jit_shape_policy)p : g->ctx->policy;
  // On a GPU a generic kernel that cannot be built is a FAILED record of its key: each
  // new binding then gets its own kernel (run.c).
  if (policy == JIT_SHAPE_POLICY_EXACT || d->kind != JIT_DEVICE_CPU) return policy;
  pthread_mutex_lock(&g->ctx->mu);
  bool failed = g->generic_failed;
  pthread_mutex_unlock(&g->ctx->mu);
  return failed ? JIT_SHAPE_POLICY_EXACT : policy;
}

//===--- The generic kernel ----------------------------------------------===//

// The generic key: a binding key's record (run.c) with each input's declared dims,
// symbols as their (negative) codes, after a tag no binding record can start with.
jit_status jit__generic_key(const jit_graph *g, const jit_device *d, uint8_t key[16]) {
  size_t n = 0, cap = 7 + (size_t)g->n_inputs * (1 + JIT_MAX_RANK);
  int64_t *rec = malloc(cap * sizeof(int64_t));
  if (!rec) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "graph `%s`: out of memory", g->name);
  memcpy(rec, "jitml generic kernel\0\0\0", 24);
  memcpy(rec + 3, g->fingerprint, 16);
  memcpy(rec + 5, d->target_hash, 16);
  n = 7;
  for (uint32_t i = 0; i < g->n_inputs; i++) {
    const jit__node *in = &g->nodes[g->inputs[i]].n;
    rec[n++] = ((int64_t)in->dtype << 8) | in->rank;
    for (int k = 0; k < in->rank; k++) rec[n++] = in->dims[k];
  }
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits(rec, n * sizeof(int64_t)));
  memcpy(key, c.digest, 16);
  free(rec);
  return NULL;
}

// The inputs as declared (symbols as their codes), for the disk entry's key text.
static void jit__declared_inputs(const jit_graph *g, DLTensor *in) {
  for (uint32_t i = 0; i < g->n_inputs; i++) {
    jit__node *n = &g->nodes[g->inputs[i]].n;
    in[i] = (DLTensor){.device = {kDLCPU, 0}, .ndim = n->rank, .shape = n->dims,
                       .dtype = jit__dtype_dl(n->dtype)};
  }
}

// What a generic compile lowers: the graph's nodes with their symbolic dims, what its
// reshapes asked for, and its inputs as declared (for the disk entry's key text).
typedef struct jit__generic_src {
  jit__node *nodes;
  int64_t (*req)[JIT_MAX_RANK];
  DLTensor *in;
  jit__lgraph lg;
} jit__generic_src;

static void jit__generic_src_free(jit__generic_src *src) {
  free(src->nodes);
  free(src->req);
  free(src->in);
}

static jit_status jit__generic_src_make(jit_graph *g, jit__generic_src *src) {
  uint32_t n = g->n_nodes ? g->n_nodes : 1;
  src->nodes = malloc(sizeof(*src->nodes) * n);
  src->req = malloc(sizeof(*src->req) * n);
  src->in = calloc(g->n_inputs + 1, sizeof(*src->in));
  if (!src->nodes || !src->req || !src->in) {
    jit__generic_src_free(src);
    return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
  }
  for (uint32_t i = 0; i < g->n_nodes; i++) {
    src->nodes[i] = g->nodes[i].n;
    memcpy(src->req[i], g->nodes[i].req, sizeof src->req[i]);
  }
  jit__declared_inputs(g, src->in);
  src->lg = (jit__lgraph){g->name, src->nodes, g->n_nodes, g->inputs, g->n_inputs,
                          g->outputs, g->n_outputs};
  return NULL;
}

// Compiles the generic kernel of `g` into gk->exact and stores it on disk.
static jit_status jit__generic_compile(jit_graph *g, jit__kernel *gk) {
  jit_context *ctx = g->ctx;
  jit__generic_src src;
  JIT_PROPAGATE(jit__generic_src_make(g, &src));
  char hex[33], func_name[48];
  jit__hex_encode(gk->key, 16, hex);
  snprintf(func_name, sizeof func_name, "jitg_%.24s", hex);
  jit__lower_options lo = jit__cpu_lower_options(ctx);
  jit__artifact art;
  double t0 = jit__now_ms();
  jit_status s = jit__compile_cpu_generic(&src.lg, (const int64_t(*)[JIT_MAX_RANK])src.req,
                                          func_name, &lo, &art);
  double ms = jit__now_ms() - t0;
  jit__count_compile(ctx, g, "generic kernel", ms, s ? NULL : &art);
  atomic_fetch_add_explicit(&ctx->generic_compiles, 1, memory_order_relaxed);
  if (s) goto done;
  jit__image image = {JIT__IMAGE_HOST_OBJECT, art.object, art.object_size};
  s = jit__cpu_load_image(ctx, &image, art.entry, &gk->exact);
  gk->exact.stack_bytes = art.stack_bytes;
  // The outputs' declared shapes (`?` dims negative) go into the entry's record.
  for (uint32_t j = 0; j < g->n_outputs; j++) {
    const jit__node *o = &g->nodes[g->outputs[j]].n;
    gk->outputs[j].rank = o->rank;
    gk->outputs[j].dtype = o->dtype;
    memcpy(gk->outputs[j].dims, o->dims, sizeof o->dims);
  }
  if (!s) jit__disk_store(g, gk->key, src.in, &art, gk->outputs);
  jit__artifact_release(&art);
done:
  jit__generic_src_free(&src);
  return s;
}

// Ends the build of claimed generic record `gk`: loads it from disk or compiles it
// (under the key's cross-process lock), publishes it, and on failure marks the graph
// (logged once). Returns the build's status (owned by the caller).
static jit_status jit__generic_finish(jit_graph *g, jit__kernel *gk, bool loaded,
                                      bool tried_disk) {
  jit_context *ctx = g->ctx;
  jit_status s = NULL;
  if (loaded) {
    jit__log(ctx, JIT_LOG_DEBUG, "graph `%s`: generic kernel loaded from the disk cache",
             g->name);
  } else if (!tried_disk && jit__disk_load(g, gk->key, &gk->exact, gk->outputs)) {
    jit__log(ctx, JIT_LOG_DEBUG, "graph `%s`: generic kernel loaded from the disk cache",
             g->name);
  } else {
    jit__cache_lock lock;
    bool locked = false;
    jit__cache_lock_fleet(ctx->cache, gk->key, 30000, &lock, &locked);
    if (!(locked && jit__disk_load(g, gk->key, &gk->exact, gk->outputs)))
      s = jit__generic_compile(g, gk);
    jit__cache_unlock(&lock);  // also a fleet lock taken without the local one
  }
  if (!s) {
    atomic_store_explicit(&gk->impl, &gk->exact, memory_order_release);
    gk->pinned = true;  // bindings share its code: never unloaded
  }
  jit__publish(ctx, gk, s);
  jit__kernel_release(gk);  // the claim's use: pinned, none is kept for the bindings
  if (s) {
    pthread_mutex_lock(&ctx->mu);
    bool first = !g->generic_failed;
    g->generic_failed = true;
    if (first) {
      size_t n = strlen(jit_status_message(s)) + 1;
      g->generic_why = malloc(n);
      if (g->generic_why) memcpy(g->generic_why, jit_status_message(s), n);
    }
    pthread_mutex_unlock(&ctx->mu);
    if (first)
      jit__log(ctx, JIT_LOG_WARNING,
               "graph `%s`: no generic kernel (%s); its bindings get exact kernels "
               "(shape policy EXACT)", g->name, jit_status_message(s));
    return s;
  }
  atomic_store_explicit(&g->generic, gk, memory_order_release);
  return NULL;
}

jit_status jit__generic_get_or_queue(jit_graph *g, bool queue, jit__kernel **out) {
  *out = atomic_load_explicit(&g->generic, memory_order_acquire);
  if (*out) return NULL;
  jit_context *ctx = g->ctx;
  uint8_t key[16];
  bool mine = false;
  jit__kernel *gk = NULL;
  jit_status s = jit__generic_key(g, ctx->devices[0], key);
  if (!s) s = jit__claim(ctx, ctx->devices[0], g->n_outputs, key, &gk, &mine);
  if (!s && !mine) {
    jit__kernel_release(gk);  // ready (claim waited): pinned
    atomic_store_explicit(&g->generic, gk, memory_order_release);
  } else if (!s) {
    // From disk at once; a compile goes to the background thread when asked (it ends
    // the claim there), else happens here.
    bool loaded = queue && jit__disk_load(g, key, &gk->exact, gk->outputs);
    if (queue && !loaded && jit__spec_push(g, gk, true))
      return NULL;  // *out stays NULL: not ready yet
    s = jit__generic_finish(g, gk, loaded, queue);
  }
  if (s) return s;
  *out = gk;
  return NULL;
}

bool jit__generic_compiling(jit_graph *g, double wait_ms) {
  jit_context *ctx = g->ctx;
  uint8_t key[16];
  jit_status s = jit__generic_key(g, ctx->devices[0], key);
  if (s) {
    jit_status_free(s);
    return false;
  }
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);  // ctx->cv waits on the default clock
  int64_t ns = until.tv_nsec + (int64_t)(wait_ms * 1e6);
  until.tv_sec += (time_t)(ns / 1000000000);
  until.tv_nsec = (long)(ns % 1000000000);
  pthread_mutex_lock(&ctx->mu);
  jit__spec_revive(ctx);  // a forked child's queue may hold that compile
  bool compiling = false;
  for (;;) {
    // Looked up again after each wait: the record may have gone and come back.
    jit__kernel *k = jit__table_find(&ctx->table, key);
    compiling = k && k->state == JIT__K_COMPILING;
    if (!compiling || pthread_cond_timedwait(&ctx->cv, &ctx->mu, &until) != 0) break;
  }
  if (compiling) {  // the last look, after the time ran out
    jit__kernel *k = jit__table_find(&ctx->table, key);
    compiling = k && k->state == JIT__K_COMPILING;
  }
  pthread_mutex_unlock(&ctx->mu);
  return compiling;
}

jit_status jit__generic_get(jit_graph *g, jit__kernel **out) {
  return jit__generic_get_or_queue(g, false, out);
}

//===--- Generic kernels on GPUs ------------------------------------------===//

// Builds claimed GPU generic record `gk` (from disk, or compiled and stored) and
// publishes it; a failure is logged once (the record keeps it: later bindings of the
// graph on that device get their own kernels).
static jit_status jit__gpu_generic_finish(jit_graph *g, jit__kernel *gk) {
  jit_context *ctx = g->ctx;
  jit__generic_src src;
  jit_status s = jit__generic_src_make(g, &src);
  if (!s) {
    s = jit__gpu_generic_make(g, gk->device, gk->key, &src.lg,
                              (const int64_t(*)[JIT_MAX_RANK])src.req, src.in, gk->outputs,
                              &gk->gpu_generic);
    jit__generic_src_free(&src);
  }
  if (!s) gk->pinned = true;  // bindings load it: never unloaded
  jit__publish(ctx, gk, s);
  jit__kernel_release(gk);
  if (s)
    jit__log(ctx, JIT_LOG_WARNING, "graph `%s`: no generic kernel on %s:%d (%s); its "
             "bindings there get kernels of their own (shape policy EXACT)", g->name,
             jit__device_kind_name(gk->device->kind), gk->device->ordinal,
             jit_status_message(s));
  return s;
}

jit_status jit__gpu_generic_get(jit_graph *g, jit_device *d, bool queue, jit__kernel **out) {
  *out = NULL;
  uint8_t key[16];
  bool mine = false;
  jit__kernel *gk = NULL;
  JIT_PROPAGATE(jit__generic_key(g, d, key));
  JIT_PROPAGATE(jit__claim(g->ctx, d, g->n_outputs, key, &gk, &mine));
  if (!mine) {
    jit__kernel_release(gk);  // ready: pinned
    *out = gk;
    return NULL;
  }
  // From disk at once; a compile goes to the background thread when asked.
  if (queue && (gk->gpu_generic = jit__gpu_generic_load(g, d, key, gk->outputs))) {
    gk->pinned = true;
    jit__publish(g->ctx, gk, NULL);
    jit__kernel_release(gk);
    *out = gk;
    return NULL;
  }
  if (queue && jit__spec_push(g, gk, true)) return NULL;  // built in the background
  JIT_PROPAGATE(jit__gpu_generic_finish(g, gk));
  *out = gk;
  return NULL;
}

jit_status jit__serve_generic_gpu(jit_graph *g, const DLTensor *inputs, jit__kernel *k,
                                  jit__kernel *gk, bool specialize) {
  size_t n_dims = 0;
  for (uint32_t i = 0; i < g->n_inputs; i++) n_dims += (size_t)inputs[i].ndim;
  int64_t *symvals = malloc(sizeof(int64_t) * (g->n_symbols + 1));
  jit__node *shapes = malloc(sizeof(jit__node) * (g->n_nodes + 1));
  int64_t *dims = malloc(sizeof(int64_t) * (n_dims + 1));
  jit_status s = NULL;
  if (!symvals || !shapes || !dims)
    s = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "graph `%s`: out of memory", g->name);
  else
    s = jit__bind(g, inputs, symvals, shapes, k->outputs);
  if (!s)
    s = jit__gpu_generic_bind(gk->gpu_generic, k->device, inputs, g->n_inputs, k->outputs,
                              g->n_outputs, &k->gpu);
  if (!s) {
    // The binding's input dims, as a CPU binding on the generic kernel keeps them (its
    // specialization reads them).
    int64_t *p = dims;
    for (uint32_t i = 0; i < g->n_inputs; i++) {
      if (inputs[i].ndim)  // a rank-0 tensor's shape may be NULL
        memcpy(p, inputs[i].shape, sizeof(int64_t) * (size_t)inputs[i].ndim);
      p += inputs[i].ndim;
    }
    k->dims = dims;
    dims = NULL;
    k->specialize = specialize;
    atomic_store(&k->gpu_on_generic, true);
  }
  free(dims);
  free(symvals);
  free(shapes);
  return s;
}

void jit__generic_build(jit_graph *g, jit__kernel *gk) {
  // A failure is logged and kept (in the graph on the CPU, in the record on a GPU):
  // bindings then get their own kernels.
  if (gk->device->kind != JIT_DEVICE_CPU) jit_status_free(jit__gpu_generic_finish(g, gk));
  else jit_status_free(jit__generic_finish(g, gk, false, true));
}

jit_status jit__serve_generic(jit_graph *g, const DLTensor *inputs, jit__kernel *k,
                              jit__kernel *gk, bool specialize) {
  size_t n_dims = 0;
  for (uint32_t i = 0; i < g->n_inputs; i++) n_dims += (size_t)inputs[i].ndim;
  for (uint32_t j = 0; j < g->n_outputs; j++) n_dims += (size_t)gk->outputs[j].rank;
  int64_t *symvals = malloc(sizeof(int64_t) * (g->n_symbols + 1));
  jit__node *shapes = malloc(sizeof(jit__node) * (g->n_nodes + 1));
  k->dims = malloc(sizeof(int64_t) * (n_dims + 1));
  jit_status s = NULL;
  if (!symvals || !shapes || !k->dims)
    s = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "graph `%s`: out of memory", g->name);
  else
    s = jit__bind(g, inputs, symvals, shapes, k->outputs);
  if (!s) {
    int64_t *p = k->dims;
    for (uint32_t i = 0; i < g->n_inputs; i++) {
      if (inputs[i].ndim)  // a rank-0 tensor's shape may be NULL
        memcpy(p, inputs[i].shape, sizeof(int64_t) * (size_t)inputs[i].ndim);
      p += inputs[i].ndim;
    }
    for (uint32_t j = 0; j < g->n_outputs; j++) {
      memcpy(p, k->outputs[j].dims, sizeof(int64_t) * (size_t)k->outputs[j].rank);
      p += k->outputs[j].rank;
    }
    k->shared = gk->exact;
    k->shared.dims = k->dims;
    k->shared.code = NULL;  // the generic kernel's own
    k->specialize = specialize;
    atomic_store_explicit(&k->impl, &k->shared, memory_order_release);
  }
  free(symvals);
  free(shapes);
  return s;
}

jit_status jit_graph_compile_generic(jit_graph *g) {
  if (!g) return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_graph_compile_generic: graph is NULL");
  if (!g->finalized)
    return JIT_ERR(JIT_INVALID_ARGUMENT,
                   "graph `%s` is not finalized (call jit_graph_finalize)", g->name);
  if (g->n_symbols == 0)
    return JIT_ERR(JIT_UNSUPPORTED, "graph `%s` has no symbolic dims: its one binding is "
                   "compiled exactly (jit_graph_compile)", g->name);
  if (g->mlir)
    return JIT_ERR(JIT_UNSUPPORTED, "graph `%s` is from MLIR: its bindings get exact "
                   "kernels (generic kernels are built for graphs of the C API and their "
                   "exports)", g->name);
  jit__kernel *gk = NULL;
  // For the device runs go to: options.device's GPU, else the CPU.
  jit_device *d = g->ctx->offload;
  jit_status s = d ? jit__gpu_generic_get(g, d, false, &gk) : jit__generic_get(g, &gk);
  if (s && jit_status_get_code(s) != JIT_RESOURCE_EXHAUSTED) {
    jit_status u = JIT_ERR(JIT_UNSUPPORTED, "graph `%s` has no generic kernel: %s", g->name,
                           jit_status_message(s));
    jit_status_free(s);
    return u;
  }
  return s;
}

//===--- Explain ---------------------------------------------------------===//

static const char *const kPolicyUpper[] = {"AUTO", "EXACT", "GENERIC"};

void jit__explain_policy(jit_graph *g, jit_device *d, const uint8_t key[16], jit__text *out) {
  jit_context *ctx = g->ctx;
  int gp = atomic_load(&g->shape_policy);
  jit_shape_policy asked = gp >= 0 ? (jit_shape_policy)gp : ctx->policy;
  jit_shape_policy policy = jit__policy_of(g, d);
  jit__text_printf(out, "shape policy: %s", kPolicyUpper[policy]);
  if (policy != asked) {
    pthread_mutex_lock(&ctx->mu);
    const char *why = g->n_symbols == 0 ? "the graph has no symbolic dims"
                      : g->mlir         ? "graphs from MLIR get exact kernels"
                      : g->generic_why  ? g->generic_why
                                        : "no generic kernel";
    jit__text_printf(out, " (%s asked; %s)", kPolicyUpper[asked], why);
    pthread_mutex_unlock(&ctx->mu);
  } else if (gp >= 0) {
    jit__text_printf(out, " (set on the graph)");
  }
  jit__text_printf(out, "\n");
  pthread_mutex_lock(&ctx->mu);
  jit__kernel *k = jit__table_find(&ctx->table, key);
  const char *now = NULL;
  char buf[256];
  if (k && k->state == JIT__K_READY && d->kind != JIT_DEVICE_CPU) {
    now = !atomic_load(&k->gpu_on_generic) ? "kernel now: its own kernel, loaded"
          : atomic_load(&k->queued)
              ? "kernel now: the generic kernel; its own is being compiled in the background"
          : k->specialize ? "kernel now: the generic kernel (specialized after "
                            "options.specialize_after runs)"
                          : "kernel now: the generic kernel (policy GENERIC)";
  } else if (k && k->state == JIT__K_READY) {
    const jit__cpu_impl *im = atomic_load(&k->impl);
    if (!im || !im->dims) {
      now = "kernel now: its own kernel, loaded";
    } else if (atomic_load(&k->queued)) {
      now = "kernel now: the generic kernel; its own is being compiled in the background";
    } else if (k->specialize) {
      snprintf(buf, sizeof buf, "kernel now: the generic kernel (%u of %d runs before it "
               "is specialized)", atomic_load(&k->hits), ctx->specialize_after);
      now = buf;
    } else {
      now = "kernel now: the generic kernel (policy GENERIC)";
    }
    if (im && im->dims && g->spec_limit_logged)
      now = "kernel now: the generic kernel (options.max_specializations reached)";
  } else if (k && k->state == JIT__K_FAILED) {
    now = "kernel now: none, its compile failed";
  } else if (policy == JIT_SHAPE_POLICY_EXACT) {
    now = "kernel now: none loaded; the next call loads its own from disk or compiles it";
  } else {
    // Loaded: on the CPU the graph holds it; on a GPU its record is READY in the table.
    bool generic = atomic_load(&g->generic) != NULL;
    uint8_t gkey[16];
    if (d->kind != JIT_DEVICE_CPU) {
      jit_status ks = jit__generic_key(g, d, gkey);
      jit__kernel *gk = ks ? NULL : jit__table_find(&ctx->table, gkey);
      generic = gk && gk->state == JIT__K_READY;
      jit_status_free(ks);
    }
    snprintf(buf, sizeof buf, "kernel now: none loaded; the next call %sruns the generic "
             "kernel%s",
             policy == JIT_SHAPE_POLICY_AUTO ? "uses its own kernel if cached on disk, "
                                               "else " : "",
             generic ? " (loaded)" : " (loaded from disk or compiled first)");
    now = buf;
  }
  jit__text_printf(out, "%s\n", now);
  pthread_mutex_unlock(&ctx->mu);
}
