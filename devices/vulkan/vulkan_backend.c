//===--- vulkan_backend.c - the Vulkan device behind devices/device.h -----===//
//
// Adapts vulkan.h's objects to the backend table: the handles jit/ holds are
// vulkan.h's own objects, cast to the interface's opaque types. A tensor's `data` is its
// jit__vk_buffer; jit/ checks that it is a live allocation before handing it here.
//
//===----------------------------------------------------------------------===//
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "devices/device.h"
#include "devices/vulkan/vulkan.h"

// Thread-safe: immutable after creation.
typedef struct jit__vk_backend {
  jit__backend base;
  jit__vk_instance *instance;
} jit__vk_backend;

static jit__vk_instance *jit__vkb_instance(const jit__backend *b) {
  return ((const jit__vk_backend *)b)->instance;
}
static jit__vk_device *jit__vkb_dev(jit__dev *d) { return (jit__vk_device *)d; }

static void jit__vkb_destroy(jit__backend *b) {
  if (!b) return;
  jit__vk_instance_release(jit__vkb_instance(b));
  free(b);
}

static uint32_t jit__vkb_device_count(const jit__backend *b) {
  return jit__vk_instance_device_count(jit__vkb_instance(b));
}

static void jit__vkb_device_info(const jit__backend *b, uint32_t index, jit__dev_info *out) {
  memset(out, 0, sizeof(*out));
  const jit__vk_device_info *vi = jit__vk_instance_device_info(jit__vkb_instance(b), index);
  if (!vi) return;
  bool f16 = vi->shader_float16 && vi->storage_buffer_16bit_access;
  snprintf(out->name, sizeof out->name, "%s", vi->name);
  out->ordinal = (int)index;
  out->f16 = f16;
  out->int64 = vi->shader_int64;
  out->code = JIT__CODE_SPIRV;
  snprintf(out->state_kind, sizeof out->state_kind, "vk-pipeline-cache");
  // These lines are part of every kernel key: changing them changes every key.
  snprintf(out->target, sizeof out->target,
           "backend=vulkan\nvk.device=%s\nvk.vendor_id=%u\nvk.device_id=%u\n"
           "vk.driver_version=%u\nvk.api_version=%u\nspirv=1.3%s\n",
           vi->name, vi->vendor_id, vi->device_id, vi->driver_version, vi->api_version,
           f16 ? " f16" : "");
}

static jit_status jit__vkb_open(jit__backend *b, uint32_t index, const jit__dev_options *o,
                                jit__dev **out) {
  *out = NULL;
  jit__vk_device_options vo = {.timeout_ns = o ? o->timeout_ns : 0};
  jit__vk_device *d = NULL;
  JIT_PROPAGATE(jit__vk_device_create(jit__vkb_instance(b), index, &vo, &d));
  *out = (jit__dev *)d;
  return NULL;
}

static void jit__vkb_close(jit__dev *d) { jit__vk_device_destroy(jit__vkb_dev(d)); }

static jit_status jit__vkb_buffer_alloc(jit__dev *d, uint64_t bytes, jit__dev_buffer **out,
                                        void **out_data) {
  jit__vk_buffer *b = NULL;
  *out = NULL;
  *out_data = NULL;
  JIT_PROPAGATE(jit__vk_buffer_create(jit__vkb_dev(d), bytes, &b));
  *out = (jit__dev_buffer *)b;
  *out_data = b;
  return NULL;
}

static void jit__vkb_buffer_free(jit__dev *d, jit__dev_buffer *b) {
  (void)d;
  jit__vk_buffer_destroy((jit__vk_buffer *)b);
}

// Without foreign memory, `data` is the buffer itself (jit/ checked it is live).
static jit__vk_buffer *jit__vkb_arg(const jit__dev_arg *a) {
  return a->buffer ? (jit__vk_buffer *)a->buffer : (jit__vk_buffer *)a->data;
}

static jit_status jit__vkb_upload(jit__dev *d, const jit__dev_arg *dst, uint64_t offset,
                                  const void *src, uint64_t bytes) {
  (void)d;
  return jit__vk_buffer_upload(jit__vkb_arg(dst), offset, src, bytes);
}

static jit_status jit__vkb_download(jit__dev *d, const jit__dev_arg *src, uint64_t offset,
                                    void *dst, uint64_t bytes) {
  (void)d;
  return jit__vk_buffer_download(jit__vkb_arg(src), offset, dst, bytes);
}

static jit_status jit__vkb_load(jit__dev *d, const jit__dev_artifact *a,
                                jit__dev_executable **out, uint32_t *out_image) {
  *out = NULL;
  uint32_t img = 0;
  while (img < a->n_images && a->images[img].format != JIT__IMAGE_SPIRV) img++;
  if (img == a->n_images)
    return JIT_ERR(JIT_UNSUPPORTED, "vulkan: the artifact has no SPIR-V module");
  jit__vk_kernel_desc *kd = calloc(a->n_kernels + 1, sizeof(*kd));
  if (!kd) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
  for (uint32_t k = 0; k < a->n_kernels; k++) {
    const jit__dev_kernel *pk = &a->kernels[k];
    kd[k].entry = pk->entry;
    memcpy(kd[k].grid, pk->grid, sizeof(kd[k].grid));
    memcpy(kd[k].block, pk->block, sizeof(kd[k].block));
    kd[k].n_args = pk->n_args;
    kd[k].args = pk->args;
  }
  jit__vk_executable_desc desc = {a->images[img].bytes, a->images[img].size, a->n_buffers,
                                  a->buffer_bytes, a->n_kernels, kd};
  jit__vk_executable *e = NULL;
  jit_status s = jit__vk_executable_create(jit__vkb_dev(d), &desc, &e);
  free(kd);
  if (s) return s;
  *out = (jit__dev_executable *)e;
  if (out_image) *out_image = img;
  return NULL;
}

static void jit__vkb_unload(jit__dev_executable *e) {
  jit__vk_executable_destroy((jit__vk_executable *)e);
}

// (Vulkan buffers know their sizes: each is checked against `bytes` here.)
static jit_status jit__vkb_launch_grids(jit__dev_executable *e, const jit__dev_arg *args,
                                        uint32_t n, const uint32_t (*grids)[3],
                                        const uint64_t *bytes) {
  jit__vk_buffer *stack[32] = {NULL};  // (zeroed: quiets -Wmaybe-uninitialized)
  jit__vk_buffer **bufs = n <= 32 ? stack : malloc(sizeof(*bufs) * n);
  if (!bufs) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
  jit_status s = NULL;
  for (uint32_t i = 0; i < n && !s; i++) {
    bufs[i] = jit__vkb_arg(&args[i]);
    if (bytes && bufs[i] && jit__vk_buffer_size(bufs[i]) < bytes[i])
      s = JIT_ERR(JIT_INVALID_ARGUMENT, "Vulkan: run: buffer %u has %llu bytes, this run "
                  "needs %llu", i, (unsigned long long)jit__vk_buffer_size(bufs[i]),
                  (unsigned long long)bytes[i]);
  }
  if (!s) s = jit__vk_run_grids((jit__vk_executable *)e, bufs, n, grids);
  if (bufs != stack) free(bufs);
  return s;
}

static jit_status jit__vkb_launch(jit__dev_executable *e, const jit__dev_arg *args,
                                  uint32_t n) {
  return jit__vkb_launch_grids(e, args, n, NULL, NULL);
}

static jit_status jit__vkb_wait(jit__dev *d) { return jit__vk_device_wait(jit__vkb_dev(d)); }

static jit_status jit__vkb_state_get(jit__dev *d, uint8_t **out, size_t *size) {
  return jit__vk_pipeline_cache_get(jit__vkb_dev(d), out, size);
}

static jit_status jit__vkb_state_merge(jit__dev *d, const void *bytes, size_t size) {
  return jit__vk_pipeline_cache_merge(jit__vkb_dev(d), bytes, size);
}

static const jit__device_vtable kVulkanVtable = {
    .destroy = jit__vkb_destroy,
    .device_count = jit__vkb_device_count,
    .device_info = jit__vkb_device_info,
    .open = jit__vkb_open,
    .close = jit__vkb_close,
    .buffer_alloc = jit__vkb_buffer_alloc,
    .buffer_free = jit__vkb_buffer_free,
    .upload = jit__vkb_upload,
    .download = jit__vkb_download,
    .load = jit__vkb_load,
    .unload = jit__vkb_unload,
    .launch = jit__vkb_launch,
    .launch_grids = jit__vkb_launch_grids,
    .wait = jit__vkb_wait,
    .state_get = jit__vkb_state_get,
    .state_merge = jit__vkb_state_merge,
};

jit_status jit__vulkan_backend_create(jit__backend **out) {
  *out = NULL;
  jit__vk_instance *inst = NULL;
  JIT_PROPAGATE(jit__vk_instance_create(NULL, &inst));
  jit__vk_backend *b = calloc(1, sizeof(*b));
  if (!b) {
    jit__vk_instance_release(inst);
    return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
  }
  b->base.vt = &kVulkanVtable;
  b->instance = inst;
  *out = &b->base;
  return NULL;
}
