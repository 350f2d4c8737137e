//===--- cpu_backend.c - the host CPU behind devices/device.h -------------===//
//
// The CPU is listed, opened, allocated and loaded through the backend table like any
// device: an opened CPU device is an LLJIT instance (cpu.h), and loading an artifact
// adds its host object there, unloadably. Its kernels are not launched through the
// table: jit_run asks for a kernel's entry point once (host_entry) and calls it
// directly, since a table call per run would cost more than the ~0.05 us the CPU hot
// path takes; launch here is therefore JIT_UNSUPPORTED.
//
//===----------------------------------------------------------------------===//
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "devices/cpu/cpu.h"
#include "devices/device.h"

static void jit__cpub_destroy(jit__backend *b) { (void)b; }  // static: nothing to free

static uint32_t jit__cpub_device_count(const jit__backend *b) {
  (void)b;
  return 1;
}

static void jit__cpub_device_info(const jit__backend *b, uint32_t index, jit__dev_info *out) {
  (void)b;
  memset(out, 0, sizeof(*out));
  if (index != 0) return;
  const jit__cpu_target *t = jit__cpu_host_target();
  snprintf(out->name, sizeof out->name, "%s (%s)", t->cpu, t->triple);
  out->f16 = true;
  out->int64 = true;
  out->foreign_memory = true;  // host tensors may hold any host memory
  out->code = JIT__CODE_HOST;
  // The CPU's key components are the context's (jit/context.c): target, options.
}

// An opened CPU device is its LLJIT instance.
static jit_status jit__cpub_open(jit__backend *b, uint32_t index, const jit__dev_options *o,
                                 jit__dev **out) {
  (void)b, (void)o;
  *out = NULL;
  if (index != 0) return JIT_ERR(JIT_INVALID_ARGUMENT, "cpu: device %u not in [0, 1)", index);
  jit__cpu_device *orc = NULL;
  JIT_PROPAGATE(jit__cpu_device_create(&orc));
  *out = (jit__dev *)orc;
  return NULL;
}

static void jit__cpub_close(jit__dev *d) { jit__cpu_device_destroy((jit__cpu_device *)d); }

// 64-byte aligned, rounded up, plus one line: kernels may read a vector past the end.
static jit_status jit__cpub_buffer_alloc(jit__dev *d, uint64_t bytes, jit__dev_buffer **out,
                                         void **out_data) {
  (void)d;
  void *p = aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
  *out = (jit__dev_buffer *)p;
  *out_data = p;
  if (!p)
    return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory (%llu bytes)",
                   (unsigned long long)bytes);
  return NULL;
}

static void jit__cpub_buffer_free(jit__dev *d, jit__dev_buffer *b) {
  (void)d;
  free(b);
}

static jit_status jit__cpub_upload(jit__dev *d, const jit__dev_arg *dst, uint64_t offset,
                                   const void *src, uint64_t bytes) {
  (void)d;
  if (bytes) memmove((char *)dst->data + offset, src, bytes);
  return NULL;
}

static jit_status jit__cpub_download(jit__dev *d, const jit__dev_arg *src, uint64_t offset,
                                     void *dst, uint64_t bytes) {
  (void)d;
  if (bytes) memmove(dst, (const char *)src->data + offset, bytes);
  return NULL;
}

// A loaded host kernel: unloadable code and its entry point.
typedef struct jit__cpub_exec {
  jit__cpu_device *orc;
  jit__cpu_code *code;
  jit__cpu_kernel_fn fn;
  bool threaded;
} jit__cpub_exec;

// Loads the artifact's first host object; its one kernel names the entry point.
static jit_status jit__cpub_load(jit__dev *d, const jit__dev_artifact *a,
                                 jit__dev_executable **out, uint32_t *out_image) {
  *out = NULL;
  uint32_t img = 0;
  while (img < a->n_images && a->images[img].format != JIT__IMAGE_HOST_OBJECT) img++;
  if (img == a->n_images)
    return JIT_ERR(JIT_UNSUPPORTED, "cpu: the artifact has no host object");
  if (a->n_kernels != 1 || !a->kernels[0].entry)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "cpu: an artifact has one kernel (its entry "
                   "point), not %u", a->n_kernels);
  jit__cpub_exec *e = calloc(1, sizeof(*e));
  if (!e) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
  e->orc = (jit__cpu_device *)d;
  jit_status s = jit__cpu_load_code(e->orc, a->images[img].bytes, a->images[img].size,
                                    a->kernels[0].entry, &e->fn, &e->threaded, &e->code);
  if (s) {
    free(e);
    return s;
  }
  *out = (jit__dev_executable *)e;
  *out_image = img;
  return NULL;
}

// Removes the code from the process: its entry point must not be running.
static void jit__cpub_unload(jit__dev_executable *x) {
  jit__cpub_exec *e = (jit__cpub_exec *)x;
  if (!e) return;
  jit__cpu_unload(e->orc, e->code);
  free(e);
}

static void jit__cpub_host_entry(jit__dev_executable *x, jit__host_fn *out_fn,
                                 bool *out_threaded) {
  jit__cpub_exec *e = (jit__cpub_exec *)x;
  *out_fn = e->fn;
  *out_threaded = e->threaded;
}

static jit_status jit__cpub_launch(jit__dev_executable *e, const jit__dev_arg *args,
                                   uint32_t n) {
  (void)e, (void)args, (void)n;
  return JIT_ERR(JIT_UNSUPPORTED, "cpu: kernels are called through their entry point "
                 "(host_entry), not launched");
}

static jit_status jit__cpub_wait(jit__dev *d) {
  (void)d;
  return NULL;  // CPU kernels return when done
}

static const jit__device_vtable kCpuVtable = {
    .destroy = jit__cpub_destroy,
    .device_count = jit__cpub_device_count,
    .device_info = jit__cpub_device_info,
    .open = jit__cpub_open,
    .close = jit__cpub_close,
    .buffer_alloc = jit__cpub_buffer_alloc,
    .buffer_free = jit__cpub_buffer_free,
    .upload = jit__cpub_upload,
    .download = jit__cpub_download,
    .load = jit__cpub_load,
    .unload = jit__cpub_unload,
    .launch = jit__cpub_launch,
    .host_entry = jit__cpub_host_entry,
    .wait = jit__cpub_wait,
};

// One immutable object for the process: the host needs no state of its own.
static const jit__backend kCpuBackend = {&kCpuVtable};

jit_status jit__cpu_backend_create(jit__backend **out) {
  *out = (jit__backend *)&kCpuBackend;
  return NULL;
}
