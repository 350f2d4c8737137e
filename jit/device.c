//===--- device.c - devices of a context, device tensors, copies -----------===//
//
// A registry over the backends devices/registry.c lists (devices/device.h): jit/ names
// no backend. Device 0 is always the CPU. GPU backends are looked for
// once, at the first call that needs them (listing devices, allocating on one, or a
// context whose options.device names one): loading libvulkan and creating an instance
// costs tens of milliseconds a CPU-only user should not pay.
//
// Device tensors: `data` is what the backend hands out (a buffer handle, a device
// address). Every live allocation is kept in its device's list, so a tensor of another
// context, or one freed already, is refused with a status instead of being
// dereferenced (backends whose tensors may hold foreign memory check it themselves).
//
//===----------------------------------------------------------------------===//
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "base/checked.h"
#include "jit/internal.h"

static void jit__device_release(jit_device *d, const jit__live *l);

//===--- Registration ----------------------------------------------------===//

const char *jit__device_kind_name(jit_device_kind kind) {
  return (unsigned)kind < JIT__N_BACKENDS ? jit__backends[kind].name : "unknown";
}

static void jit__device_hash_target(jit_device *d) {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits(d->target_text, strlen(d->target_text)));
  memcpy(d->target_hash, c.digest, sizeof(d->target_hash));
}

// A new device of `backend` (not yet listed); NULL when out of memory.
static jit_device *jit__device_new(jit_context *ctx, const jit__backend_entry *be,
                                   jit__backend *backend, uint32_t index) {
  jit_device *d = calloc(1, sizeof(*d));
  if (!d) return NULL;
  d->ctx = ctx;
  d->kind = be->kind;
  d->backend = backend;
  d->index = index;
  backend->vt->device_info(backend, index, &d->info);
  d->ordinal = d->info.ordinal;
  d->dl = (DLDevice){be->dl, (int32_t)d->info.ordinal};
  d->f16 = d->info.f16;
  snprintf(d->name, sizeof d->name, "%s", d->info.name);
  pthread_mutex_init(&d->mu, NULL);
  return d;
}

static void jit__device_free(jit_device *d) {
  pthread_mutex_destroy(&d->mu);
  free(d);
}

jit_status jit__devices_init_cpu(jit_context *ctx) {
  const jit__backend_entry *be = &jit__backends[JIT_DEVICE_CPU];
  jit__backend *cpu = NULL;
  JIT_PROPAGATE(be->create(&cpu));
  jit_device *d = jit__device_new(ctx, be, cpu, 0);
  jit_device **list = calloc(4, sizeof(*list));
  jit_status s = d && list ? cpu->vt->open(cpu, 0, NULL, &d->dev)
                           : JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
  if (s) {
    if (d) jit__device_free(d);
    free(list);
    cpu->vt->destroy(cpu);
    return s;
  }
  d->target_text = ctx->target_text;  // shared with the context, not owned
  memcpy(d->target_hash, ctx->target_hash, 16);
  ctx->backends[JIT_DEVICE_CPU] = cpu;
  list[0] = d;
  ctx->devices = list;
  ctx->n_devices = 1;
  ctx->cap_devices = 4;
  pthread_mutex_init(&ctx->devices_mu, NULL);
  return NULL;
}

static bool jit__devices_push(jit_context *ctx, jit_device *d) {
  if (ctx->n_devices == ctx->cap_devices) {
    jit_device **list = realloc(ctx->devices, sizeof(*list) * ctx->cap_devices * 2);
    if (!list) return false;
    ctx->devices = list;
    ctx->cap_devices *= 2;
  }
  ctx->devices[ctx->n_devices++] = d;
  return true;
}

// Records why a GPU backend has no devices (for jit_context_find_device's message).
static void jit__backend_absent(jit_context *ctx, jit_device_kind kind, jit_status s) {
  snprintf(ctx->absent[kind], sizeof ctx->absent[0], "%s", jit_status_message(s));
  jit__log(ctx, JIT_LOG_INFO, "no %s devices: %s", jit__device_kind_name(kind),
           jit_status_message(s));
  jit_status_free(s);
}

// Adds device `index` of a loaded backend; false when out of memory (the device is then
// simply not listed). Its key components are the backend's lines and the compiler's.
static bool jit__device_add(jit_context *ctx, const jit__backend_entry *be,
                            jit__backend *backend, uint32_t index) {
  jit_device *d = jit__device_new(ctx, be, backend, index);
  char *text = malloc(sizeof d->info.target + 256);
  if (!d || !text) {
    if (d) jit__device_free(d);
    free(text);
    return false;
  }
  snprintf(text, sizeof d->info.target + 256, "%scompiler=libjitml %s, LLVM %s\nbuild_id=%s\n",
           d->info.target, jit_version(), JITML_LLVM_VERSION, jit__library_build_id());
  d->target_text = text;
  jit__device_hash_target(d);
  if (!jit__devices_push(ctx, d)) {
    free(text);
    jit__device_free(d);
    return false;
  }
  return true;
}

// Lists a GPU backend's devices (none is opened until it is used).
static void jit__scan_backend(jit_context *ctx, const jit__backend_entry *be) {
  jit__backend *backend = NULL;
  jit_status s = be->create(&backend);
  if (s) {
    jit__backend_absent(ctx, be->kind, s);
    return;
  }
  ctx->backends[be->kind] = backend;  // destroyed at context destroy, after the devices
  uint32_t n = backend->vt->device_count(backend);
  for (uint32_t i = 0; i < n; i++)
    if (!jit__device_add(ctx, be, backend, i)) break;
}

void jit__devices_scan(jit_context *ctx) {
  pthread_mutex_lock(&ctx->devices_mu);
  if (!ctx->devices_scanned) {
    for (int k = 0; k < JIT__N_BACKENDS; k++)
      if (k != JIT_DEVICE_CPU) jit__scan_backend(ctx, &jit__backends[k]);
    ctx->devices_scanned = true;
  }
  pthread_mutex_unlock(&ctx->devices_mu);
}

//===--- Device state through the disk cache ------------------------------===//

// The disk-cache key of a device's state (Vulkan's VkPipelineCache): its kind and the
// device's target identity.
static void jit__device_state_key(const jit_device *d, uint8_t key[16]) {
  XXH128_canonical_t c;
  char text[sizeof d->info.state_kind + 1 + 16];
  size_t n = strlen(d->info.state_kind);
  memcpy(text, d->info.state_kind, n);
  text[n] = '\n';
  memcpy(text + n + 1, d->target_hash, 16);
  XXH128_canonicalFromHash(&c, XXH3_128bits(text, n + 1 + 16));
  memcpy(key, c.digest, 16);
}

// Seeds a newly opened device's state from the disk cache. Bytes made for another
// device or driver are refused by the backend (JIT_CACHE_ERROR): logged, ignored.
static void jit__device_state_load(jit_device *d) {
  jit__cache *cache = d->ctx->cache;
  if (!d->backend->vt->state_merge || !jit__cache_enabled(cache)) return;
  jit__cache_entry e;
  bool found = false;
  uint8_t key[16];
  jit__device_state_key(d, key);
  jit_status s = jit__cache_get(cache, key, &e, &found);
  if (!s && found) {
    if (e.kind == JIT__PAYLOAD_VK_PIPELINE_CACHE)  // the payload kind of device states
      s = d->backend->vt->state_merge(d->dev, e.payload, e.payload_size);
    jit__cache_entry_release(&e);
  }
  if (s) {
    jit__log(d->ctx, JIT_LOG_INFO, "%s:%d: cached %s not used: %s",
             jit__device_kind_name(d->kind), d->ordinal, d->info.state_kind,
             jit_status_message(s));
    jit_status_free(s);
  }
}

// Stores a device's state (at context destroy), so the next process skips the
// driver's shader compiles where the driver keeps them there.
static void jit__device_state_store(jit_device *d) {
  jit__cache *cache = d->ctx->cache;
  if (!d->dev || !d->backend->vt->state_get || !jit__cache_enabled(cache)) return;
  uint8_t *bytes = NULL;
  size_t size = 0;
  jit_status s = d->backend->vt->state_get(d->dev, &bytes, &size);
  if (!s && size) {
    jit__cache_entry e;
    memset(&e, 0, sizeof(e));
    jit__device_state_key(d, e.key);
    e.kind = JIT__PAYLOAD_VK_PIPELINE_CACHE;
    e.payload = bytes;
    e.payload_size = size;
    char components[1400];
    snprintf(components, sizeof components, "kind=%s\n%s", d->info.state_kind,
             d->target_text);
    e.components = components;
    s = jit__cache_put(cache, &e);
  }
  if (s) jit_status_free(s);
  free(bytes);
}

// The bound on every wait for a GPU: $JITML_GPU_TIMEOUT_MS, else 0 (the backend's
// default, 10 s). Software devices (lavapipe) JIT each shader at its first dispatch,
// inside that wait; on a loaded machine that can take longer than 10 s.
static uint64_t jit__gpu_timeout_ns(void) {
  const char *v = getenv("JITML_GPU_TIMEOUT_MS");
  if (!v || !*v) return 0;
  char *end;
  unsigned long long ms = strtoull(v, &end, 10);
  if (*end || ms == 0 || ms > 24ull * 3600 * 1000) return 0;
  return ms * 1000ull * 1000ull;
}

// Backends log through the context's callback.
static void jit__device_log(void *user, jit_log_level level, const char *message) {
  jit__log((jit_context *)user, level, "%s", message);
}

// Opens the device's backend object at its first use.
jit_status jit__device_open(jit_device *d) {
  pthread_mutex_lock(&d->mu);
  jit_status s = NULL;
  if (!d->dev) {
    jit__dev_options o = {jit__gpu_timeout_ns(), jit__device_log, d->ctx};
    s = d->backend->vt->open(d->backend, d->index, &o, &d->dev);
    if (!s) jit__device_state_load(d);
  }
  pthread_mutex_unlock(&d->mu);
  if (s) return jit__status_annotate(s, "opening %s:%d (%s)",
                                     jit__device_kind_name(d->kind), d->ordinal, d->name);
  return NULL;
}

void jit__devices_destroy(jit_context *ctx) {
  for (int i = 0; i < ctx->n_devices; i++) {
    jit_device *d = ctx->devices[i];
    for (size_t k = 0; k < d->n_live; k++) jit__device_release(d, &d->live[k]);
    free(d->live);
    jit__device_state_store(d);
    if (d->dev) d->backend->vt->close(d->dev);
    if (i > 0) free(d->target_text);
    jit__device_free(d);
  }
  free(ctx->devices);
  for (int k = 0; k < JIT__N_BACKENDS; k++)
    if (ctx->backends[k]) ctx->backends[k]->vt->destroy(ctx->backends[k]);
  pthread_mutex_destroy(&ctx->devices_mu);
}

//===--- Lookup ----------------------------------------------------------===//

int jit_context_device_count(jit_context *ctx) {
  if (!ctx) return 0;
  jit__devices_scan(ctx);
  return ctx->n_devices;
}

jit_status jit_context_get_device(jit_context *ctx, int index, jit_device **out) {
  if (out) *out = NULL;
  if (!ctx || !out)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_context_get_device: %s is NULL",
                   ctx ? "out_device" : "ctx");
  jit__devices_scan(ctx);
  if (index < 0 || index >= ctx->n_devices)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "device index %d not in [0, %d)", index,
                   ctx->n_devices);
  *out = ctx->devices[index];
  return NULL;
}

jit_status jit_context_find_device(jit_context *ctx, jit_device_kind kind, int ordinal,
                                   jit_device **out) {
  if (out) *out = NULL;
  if (!ctx || !out)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_context_find_device: %s is NULL",
                   ctx ? "out_device" : "ctx");
  if ((unsigned)kind >= JIT__N_BACKENDS)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "unknown device kind %d", (int)kind);
  if (kind != JIT_DEVICE_CPU) jit__devices_scan(ctx);
  int seen = 0;
  for (int i = 0; i < ctx->n_devices; i++) {
    if (ctx->devices[i]->kind != kind) continue;
    if (ctx->devices[i]->ordinal == ordinal) {
      *out = ctx->devices[i];
      return NULL;
    }
    seen++;
  }
  if (seen)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "%s:%d: there are only %d %s devices",
                   jit__device_kind_name(kind), ordinal, seen, jit__device_kind_name(kind));
  return JIT_ERR(JIT_UNAVAILABLE, "no %s device: %s", jit__device_kind_name(kind),
                 ctx->absent[kind][0] ? ctx->absent[kind] : "none found");
}

jit_status jit_device_get_info(const jit_device *d, jit_device_info *out) {
  if (!d || !out)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_device_get_info: %s is NULL",
                   d ? "out_info" : "device");
  out->kind = d->kind;
  out->ordinal = d->ordinal;
  out->name = d->name;
  out->dl_device = d->dl;
  out->supports_f16 = d->f16;
  return NULL;
}

// Parses "cpu", "vulkan", "vulkan:1", "cuda:0" into a device of `ctx`.
jit_status jit__device_from_option(jit_context *ctx, const char *spec, jit_device **out) {
  *out = ctx->devices[0];
  if (!spec || !spec[0] || !strcmp(spec, "cpu")) return NULL;
  int ordinal = 0;
  const char *colon = strchr(spec, ':');
  size_t n = colon ? (size_t)(colon - spec) : strlen(spec);
  if (colon) {
    char *end;
    long v = strtol(colon + 1, &end, 10);
    if (end == colon + 1 || *end || v < 0)
      return JIT_ERR(JIT_INVALID_ARGUMENT, "options.device `%s`: bad device index", spec);
    ordinal = (int)v;
  }
  int kind = 0;
  while (kind < JIT__N_BACKENDS &&
         (strlen(jit__backends[kind].name) != n || strncmp(spec, jit__backends[kind].name, n)))
    kind++;
  if (kind == JIT__N_BACKENDS)
    return JIT_ERR(JIT_INVALID_ARGUMENT,
                   "options.device `%s`: expected cpu, vulkan[:N] or cuda[:N]", spec);
  if (kind == JIT_DEVICE_CPU) return NULL;
  return jit__status_annotate(jit_context_find_device(ctx, kind, ordinal, out),
                              "options.device `%s`", spec);
}

// The device a tensor says it is on; JIT_INVALID_ARGUMENT/UNAVAILABLE if none.
jit_status jit__device_of(jit_context *ctx, DLDevice dl, jit_device **out) {
  *out = NULL;
  if (dl.device_type == kDLCPU) {
    *out = ctx->devices[0];
    return NULL;
  }
  int kind = 0;
  while (kind < JIT__N_BACKENDS && jit__backends[kind].dl != dl.device_type) kind++;
  if (kind == JIT__N_BACKENDS)
    return JIT_ERR(JIT_UNSUPPORTED,
                   "device type %d is not supported (CPU, Vulkan and CUDA are)",
                   (int)dl.device_type);
  return jit_context_find_device(ctx, kind, dl.device_id, out);
}

//===--- Device tensors --------------------------------------------------===//

static bool jit__live_find(jit_device *d, const void *data, size_t *at) {
  for (size_t i = 0; i < d->n_live; i++) {
    if (d->live[i].data == data) {
      if (at) *at = i;
      return true;
    }
  }
  return false;
}

bool jit__device_owns(jit_device *d, const void *data) {
  return jit__device_handle(d, data) != NULL;
}

jit__dev_buffer *jit__device_handle(jit_device *d, const void *data) {
  pthread_mutex_lock(&d->mu);
  size_t at = 0;
  jit__dev_buffer *h = jit__live_find(d, data, &at) ? d->live[at].handle : NULL;
  pthread_mutex_unlock(&d->mu);
  return h;
}

static size_t jit__dl_bytes(DLDataType t) { return (size_t)t.bits / 8; }

static bool jit__live_add(jit_device *d, jit__live l) {
  pthread_mutex_lock(&d->mu);
  if (d->n_live == d->cap_live) {
    size_t cap = d->cap_live ? d->cap_live * 2 : 16;
    jit__live *list = realloc(d->live, sizeof(*list) * cap);
    if (!list) {
      pthread_mutex_unlock(&d->mu);
      return false;
    }
    d->live = list;
    d->cap_live = cap;
  }
  d->live[d->n_live++] = l;
  pthread_mutex_unlock(&d->mu);
  return true;
}

static bool jit__live_remove(jit_device *d, const void *data, jit__live *out) {
  pthread_mutex_lock(&d->mu);
  size_t at = 0;
  bool found = jit__live_find(d, data, &at);
  if (found) {
    *out = d->live[at];
    d->live[at] = d->live[--d->n_live];
  }
  pthread_mutex_unlock(&d->mu);
  return found;
}

// Frees an allocation of device `d`.
static void jit__device_release(jit_device *d, const jit__live *l) {
  d->backend->vt->buffer_free(d->dev, l->handle);
}

// Allocates `bytes` on device `d` (64-byte aligned host memory for the CPU) and
// registers it as live. *out is what a tensor's `data` holds.
jit_status jit__device_buffer_alloc(jit_device *d, uint64_t bytes, void **out) {
  *out = NULL;
  jit__live l = {NULL, NULL};
  JIT_PROPAGATE(jit__device_open(d));
  JIT_PROPAGATE(d->backend->vt->buffer_alloc(d->dev, bytes, &l.handle, &l.data));
  if (!jit__live_add(d, l)) {
    jit__device_release(d, &l);
    return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
  }
  *out = l.data;
  return NULL;
}

jit_status jit__device_buffer_free(jit_device *d, void *data) {
  jit__live l;
  if (!jit__live_remove(d, data, &l))
    return JIT_ERR(JIT_INVALID_ARGUMENT,
                   "%s:%d: the tensor was not allocated by this context, or was freed",
                   jit__device_kind_name(d->kind), d->ordinal);
  jit__device_release(d, &l);
  return NULL;
}

// What a transfer on `data` binds: its allocation, which must be live unless the
// backend takes foreign memory (it checks that itself).
static jit_status jit__device_arg(jit_device *d, void *data, jit__dev_arg *out) {
  JIT_PROPAGATE(jit__device_open(d));
  out->data = data;
  out->buffer = d->info.foreign_memory ? NULL : jit__device_handle(d, data);
  if (!d->info.foreign_memory && !out->buffer)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "not a live %s tensor of this context",
                   jit__device_kind_name(d->kind));
  return NULL;
}

jit_status jit__device_upload(jit_device *d, void *data, uint64_t offset, const void *src,
                              uint64_t bytes) {
  jit__dev_arg a;
  JIT_PROPAGATE(jit__device_arg(d, data, &a));
  return d->backend->vt->upload(d->dev, &a, offset, src, bytes);
}

jit_status jit__device_download(jit_device *d, const void *data, uint64_t offset,
                                void *dst, uint64_t bytes) {
  jit__dev_arg a;
  JIT_PROPAGATE(jit__device_arg(d, (void *)data, &a));
  return d->backend->vt->download(d->dev, &a, offset, dst, bytes);
}

typedef struct jit__tensor_box {
  int64_t shape[JIT_MAX_RANK];
} jit__tensor_box;

jit_status jit_tensor_alloc(jit_context *ctx, jit_device *device, DLDataType dtype,
                            int rank, const int64_t *shape, DLTensor *out) {
  if (out) memset(out, 0, sizeof(*out));
  if (!ctx || !device || !out || (rank > 0 && !shape))
    return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_tensor_alloc: a required pointer is NULL");
  if (device->ctx != ctx)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_tensor_alloc: the device belongs to another "
                   "context");
  if (dtype.code != kDLFloat || (dtype.bits != 32 && dtype.bits != 16) || dtype.lanes != 1)
    return JIT_ERR(JIT_UNSUPPORTED, "jit_tensor_alloc: only f32 and f16 tensors");
  if (rank < 0 || rank > JIT_MAX_RANK)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_tensor_alloc: rank %d not in [0, %d]", rank,
                   JIT_MAX_RANK);
  for (int i = 0; i < rank; i++)
    if (shape[i] < 0)
      return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_tensor_alloc: dim %d is %lld", i,
                     (long long)shape[i]);
  int64_t nbytes;
  if (!jit__checked_numel(rank, shape, (int64_t)jit__dl_bytes(dtype), &nbytes) ||
      (uint64_t)nbytes > JIT_MAX_TENSOR_BYTES) {
    char sd[200];
    return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "jit_tensor_alloc: shape %s of %d-bit elements "
                   "is more than JIT_MAX_TENSOR_BYTES (2^48 bytes)",
                   jit__fmt_shape(rank, shape, sd, sizeof sd), dtype.bits);
  }
  jit__tensor_box *box = malloc(sizeof(*box));
  if (!box) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "jit_tensor_alloc: out of memory");
  if (rank) memcpy(box->shape, shape, sizeof(int64_t) * (size_t)rank);  // rank 0: NULL ok
  uint64_t bytes = (uint64_t)nbytes;
  void *data = NULL;
  jit_status s = jit__device_buffer_alloc(device, bytes, &data);
  if (s) {
    free(box);
    return jit__status_annotate(s, "jit_tensor_alloc");
  }
  out->data = data;
  out->device = device->dl;
  out->ndim = rank;
  out->dtype = dtype;
  out->shape = box->shape;  // shape is the box's first member: freed with it
  return NULL;
}

static jit_status jit__annotate_free(jit_status s) {
  return s ? jit__status_annotate(s, "jit_tensor_free") : NULL;
}

jit_status jit_tensor_free(jit_context *ctx, DLTensor *t) {
  if (!ctx || !t) return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_tensor_free: NULL argument");
  if (!t->data && !t->shape) return NULL;  // already cleared
  jit_device *d = NULL;
  JIT_PROPAGATE(jit__device_of(ctx, t->device, &d));
  JIT_PROPAGATE(jit__annotate_free(jit__device_buffer_free(d, t->data)));
  free(t->shape);
  memset(t, 0, sizeof(*t));
  return NULL;
}

static bool jit__dense(const DLTensor *t) {
  if (!t->strides) return true;
  int64_t expect = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    if (t->shape[d] != 1 && t->strides[d] != expect) return false;
    expect *= t->shape[d];
  }
  return true;
}

jit_status jit_copy(jit_context *ctx, const DLTensor *dst, const DLTensor *src) {
  if (!ctx || !dst || !src) return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_copy: NULL argument");
  if (dst->dtype.code != src->dtype.code || dst->dtype.bits != src->dtype.bits ||
      dst->dtype.lanes != src->dtype.lanes || dst->ndim != src->ndim)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_copy: dtype or rank differ");
  if (src->ndim < 0 || src->ndim > JIT_MAX_RANK || (src->ndim > 0 && (!src->shape ||
                                                                       !dst->shape)))
    return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_copy: bad ndim %d or NULL shape", src->ndim);
  for (int i = 0; i < src->ndim; i++) {
    if (src->shape[i] != dst->shape[i])
      return JIT_ERR(JIT_SHAPE_MISMATCH, "jit_copy: dim %d is %lld in src, %lld in dst", i,
                     (long long)src->shape[i], (long long)dst->shape[i]);
    if (src->shape[i] < 0)
      return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_copy: dim %d is %lld", i,
                     (long long)src->shape[i]);
  }
  // Sized before anything multiplies the dims: a wrapped count would copy the wrong
  // number of bytes.
  int64_t nbytes;
  int64_t esz = src->dtype.bits >= 8 ? src->dtype.bits / 8 : 1;
  if (!jit__checked_numel(src->ndim, src->shape, esz, &nbytes) ||
      (uint64_t)nbytes > JIT_MAX_TENSOR_BYTES) {
    char sd[200];
    return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "jit_copy: shape %s of %lld-byte elements is "
                   "more than JIT_MAX_TENSOR_BYTES (2^48 bytes)",
                   jit__fmt_shape(src->ndim, src->shape, sd, sizeof sd), (long long)esz);
  }
  if (!jit__dense(src) || !jit__dense(dst))
    return JIT_ERR(JIT_UNSUPPORTED, "jit_copy: only dense tensors");
  uint64_t bytes = (uint64_t)nbytes;
  jit_device *ds = NULL, *dd = NULL;
  JIT_PROPAGATE(jit__device_of(ctx, src->device, &ds));
  JIT_PROPAGATE(jit__device_of(ctx, dst->device, &dd));
  const char *sp = (const char *)src->data + src->byte_offset;
  char *dp = (char *)dst->data + dst->byte_offset;
  if (ds->kind == JIT_DEVICE_CPU && dd->kind == JIT_DEVICE_CPU) {
    if (bytes) memmove(dp, sp, bytes);
    return NULL;
  }
  if (!ds->info.foreign_memory && !jit__device_owns(ds, src->data))
    return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_copy: src is not a live tensor of this context");
  if (!dd->info.foreign_memory && !jit__device_owns(dd, dst->data))
    return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_copy: dst is not a live tensor of this context");
  if (ds->kind == JIT_DEVICE_CPU)
    return jit__device_upload(dd, dst->data, dst->byte_offset, sp, bytes);
  if (dd->kind == JIT_DEVICE_CPU)
    return jit__device_download(ds, src->data, src->byte_offset, dp, bytes);
  if (ds != dd)
    return JIT_ERR(JIT_UNSUPPORTED, "jit_copy: between two GPU devices");
  // Device to device on one device: through the host (rare; kernels never need it).
  void *tmp = malloc(bytes ? bytes : 1);
  if (!tmp) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "jit_copy: out of memory");
  jit_status s = jit__device_download(ds, src->data, src->byte_offset, tmp, bytes);
  if (!s) s = jit__device_upload(dd, dst->data, dst->byte_offset, tmp, bytes);
  free(tmp);
  return s;
}
