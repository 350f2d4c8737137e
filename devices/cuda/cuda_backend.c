//===--- cuda_backend.c - the CUDA device behind devices/device.h ---------===//
//
// Adapts cuda.h's objects to the backend table. A tensor's `data` is a CUDA device
// address, ours or a framework's: every transfer and launch wraps it, which checks that
// it is device memory of this GPU covering the range (cuda.h). Buffers jit/ allocated
// (temporaries) are passed with their jit__cu_buffer and used as they are.
//
// Loading picks the image: a cubin for the device's SM first (no driver JIT), then the
// PTX when there is none or the driver refuses it (another SM, an image it cannot
// read, a cubin from a newer toolkit than it knows). A PTX load is logged with its
// reason and what the driver's JIT cost.
//
//===----------------------------------------------------------------------===//
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "devices/cuda/cuda.h"
#include "devices/device.h"

// Thread-safe: immutable after creation.
typedef struct jit__cu_backend {
  jit__backend base;
  jit__cu_instance *instance;
} jit__cu_backend;

// An opened device: the CUDA device and what its log lines name.
// Thread-safe: immutable after open.
typedef struct jit__cu_open {
  jit__cu_device *cu;
  jit__dev_options options;
  int ordinal;
  char name[256];
  char sm[16];
} jit__cu_open;

static jit__cu_instance *jit__cub_instance(const jit__backend *b) {
  return ((const jit__cu_backend *)b)->instance;
}
static jit__cu_open *jit__cub_dev(jit__dev *d) { return (jit__cu_open *)d; }

static void jit__cub_log(const jit__cu_open *o, jit_log_level level, const char *fmt, ...)
    JIT__PRINTF(3, 4);
static void jit__cub_log(const jit__cu_open *o, jit_log_level level, const char *fmt, ...) {
  if (!o->options.log) return;
  char line[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  o->options.log(o->options.log_user, level, line);
}

static void jit__cub_destroy(jit__backend *b) {
  if (!b) return;
  jit__cu_instance_release(jit__cub_instance(b));
  free(b);
}

static uint32_t jit__cub_device_count(const jit__backend *b) {
  return jit__cu_instance_device_count(jit__cub_instance(b));
}

static void jit__cub_device_info(const jit__backend *b, uint32_t index, jit__dev_info *out) {
  memset(out, 0, sizeof(*out));
  const jit__cu_device_info *ci = jit__cu_instance_device_info(jit__cub_instance(b), index);
  if (!ci) return;
  snprintf(out->name, sizeof out->name, "%s", ci->name);
  out->ordinal = (int)ci->index;
  out->f16 = ci->cc_major * 10 + ci->cc_minor >= 53;
  out->int64 = true;
  out->foreign_memory = true;
  out->code = JIT__CODE_PTX;
  snprintf(out->chip, sizeof out->chip, "%s", ci->sm);
  out->isa_max = ci->ptx_max;
  // These lines are part of every kernel key: changing them changes every key.
  snprintf(out->target, sizeof out->target,
           "backend=cuda\ncuda.device=%s\ncuda.sm=%s\ncuda.driver_version=%d\n"
           "format=ptx\n",
           ci->name, ci->sm, ci->driver_version);
}

static jit_status jit__cub_open(jit__backend *b, uint32_t index, const jit__dev_options *o,
                                jit__dev **out) {
  *out = NULL;
  const jit__cu_device_info *ci = jit__cu_instance_device_info(jit__cub_instance(b), index);
  jit__cu_open *d = calloc(1, sizeof(*d));
  if (!d) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
  if (o) d->options = *o;
  jit__cu_device_options co = {.timeout_ns = d->options.timeout_ns};
  jit_status s = jit__cu_device_create(jit__cub_instance(b), index, &co, &d->cu);
  if (s) {
    free(d);
    return s;
  }
  d->ordinal = ci ? (int)ci->index : (int)index;
  snprintf(d->name, sizeof d->name, "%s", ci ? ci->name : "");
  snprintf(d->sm, sizeof d->sm, "%s", ci ? ci->sm : "");
  *out = (jit__dev *)d;
  return NULL;
}

static void jit__cub_close(jit__dev *d) {
  if (!d) return;
  jit__cu_device_destroy(jit__cub_dev(d)->cu);
  free(d);
}

static jit_status jit__cub_buffer_alloc(jit__dev *d, uint64_t bytes, jit__dev_buffer **out,
                                        void **out_data) {
  jit__cu_buffer *b = NULL;
  *out = NULL;
  *out_data = NULL;
  // A zero-byte request still needs a distinct address to register.
  JIT_PROPAGATE(jit__cu_buffer_create(jit__cub_dev(d)->cu, bytes ? bytes : 1, &b));
  *out = (jit__dev_buffer *)b;
  *out_data = (void *)(uintptr_t)jit__cu_buffer_device_ptr(b);
  return NULL;
}

static void jit__cub_buffer_free(jit__dev *d, jit__dev_buffer *b) {
  (void)d;
  jit__cu_buffer_destroy((jit__cu_buffer *)b);
}

// Any device address (ours or a framework's) is wrapped for the transfer.
static jit_status jit__cub_upload(jit__dev *d, const jit__dev_arg *dst, uint64_t offset,
                                  const void *src, uint64_t bytes) {
  jit__cu_buffer *w = NULL;
  JIT_PROPAGATE(jit__cu_buffer_wrap(jit__cub_dev(d)->cu,
                                    (uint64_t)(uintptr_t)dst->data + offset, bytes, &w));
  jit_status s = jit__cu_buffer_upload(w, 0, src, bytes);
  jit__cu_buffer_destroy(w);
  return s;
}

static jit_status jit__cub_download(jit__dev *d, const jit__dev_arg *src, uint64_t offset,
                                    void *dst, uint64_t bytes) {
  jit__cu_buffer *w = NULL;
  JIT_PROPAGATE(jit__cu_buffer_wrap(jit__cub_dev(d)->cu,
                                    (uint64_t)(uintptr_t)src->data + offset, bytes, &w));
  jit_status s = jit__cu_buffer_download(w, 0, dst, bytes);
  jit__cu_buffer_destroy(w);
  return s;
}

// Loads image `img` of `a` (a cubin or PTX) with the kernels already converted.
static jit_status jit__cub_load_one(jit__cu_open *d, const jit__dev_artifact *a,
                                    const jit__image *img, const jit__cu_kernel_desc *cd,
                                    jit__cu_executable **out) {
  jit__cu_executable_desc desc = {
      img->format == JIT__IMAGE_CUBIN ? JIT__CU_CUBIN : JIT__CU_PTX,
      img->bytes, img->size, a->n_buffers, a->buffer_bytes, a->n_kernels, cd};
  return jit__cu_executable_create(d->cu, &desc, out);
}

// Tries the images in order (cubins and PTX; others are skipped), keeping why each
// refused one failed for the log and for the final status.
static jit_status jit__cub_load_images(jit__cu_open *d, const jit__dev_artifact *a,
                                       const jit__cu_kernel_desc *cd,
                                       jit__cu_executable **out, uint32_t *out_image) {
  char refused[1024] = "";
  jit_status s = JIT_ERR(JIT_UNSUPPORTED, "cuda: the artifact has no PTX or cubin");
  for (uint32_t i = 0; i < a->n_images; i++) {
    const jit__image *img = &a->images[i];
    if (img->format != JIT__IMAGE_CUBIN && img->format != JIT__IMAGE_PTX) continue;
    jit_status_free(s);
    s = jit__cub_load_one(d, a, img, cd, out);
    if (!s) {
      *out_image = i;
      if (img->format == JIT__IMAGE_CUBIN) {
        jit__cub_log(d, JIT_LOG_DEBUG, "cuda:%d (%s): kernel loaded from its %s cubin "
                     "(%zu bytes)", d->ordinal, d->name, d->sm, img->size);
      } else {
        const char *why = refused[0] ? refused
                          : a->missing_note && a->missing_note[0] ? a->missing_note
                                                                  : "no cubin";
        jit__cub_log(d, JIT_LOG_INFO, "cuda:%d (%s): kernel loaded from PTX, JIT-compiled by "
                     "the driver in %.1f ms: %s", d->ordinal, d->name,
                     jit__cu_executable_create_ms(*out), why);
      }
      return NULL;
    }
    if (img->format == JIT__IMAGE_CUBIN && i + 1 < a->n_images) {
      snprintf(refused, sizeof refused, "the driver refused the cubin: %s",
               jit_status_message(s));
    }
  }
  if (refused[0]) s = jit__status_annotate(s, "PTX fallback (%s)", refused);
  return s;
}

// A loaded artifact: the module, and what a launch needs to wrap device addresses (the
// device and each buffer's declared size). Thread-safe: immutable after load.
typedef struct jit__cub_exec {
  jit__cu_executable *cu;
  jit__cu_open *device;
  uint32_t n_buffers;
  uint64_t *bytes;
} jit__cub_exec;

static void jit__cub_unload(jit__dev_executable *exe) {
  jit__cub_exec *e = (jit__cub_exec *)exe;
  if (!e) return;
  jit__cu_executable_destroy(e->cu);
  free(e->bytes);
  free(e);
}

static jit_status jit__cub_load(jit__dev *dev, const jit__dev_artifact *a,
                                jit__dev_executable **out, uint32_t *out_image) {
  *out = NULL;
  jit__cu_kernel_desc *cd = calloc(a->n_kernels + 1, sizeof(*cd));
  jit__cub_exec *e = calloc(1, sizeof(*e));
  uint64_t *bytes = calloc(a->n_buffers + 1, sizeof(uint64_t));
  if (!cd || !e || !bytes) {
    free(cd);
    free(e);
    free(bytes);
    return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
  }
  for (uint32_t k = 0; k < a->n_kernels; k++) {
    const jit__dev_kernel *pk = &a->kernels[k];
    cd[k] = (jit__cu_kernel_desc){pk->entry, {0}, {0}, pk->n_args, pk->args};
    memcpy(cd[k].grid, pk->grid, sizeof(cd[k].grid));
    memcpy(cd[k].block, pk->block, sizeof(cd[k].block));
  }
  if (a->n_buffers) memcpy(bytes, a->buffer_bytes, sizeof(uint64_t) * a->n_buffers);
  e->device = jit__cub_dev(dev);
  e->n_buffers = a->n_buffers;
  e->bytes = bytes;
  uint32_t img = 0;
  jit_status s = jit__cub_load_images(e->device, a, cd, &e->cu, &img);
  free(cd);
  if (s) {
    jit__cub_unload((jit__dev_executable *)e);
    return s;
  }
  *out = (jit__dev_executable *)e;
  if (out_image) *out_image = img;
  return NULL;
}

// Arguments without a buffer are device addresses, wrapped (and so checked) for the
// launch. `stream`: the caller's CUstream, or NULL (the default stream).
static jit_status jit__cub_launch_stream(jit__dev_executable *exe, const jit__dev_arg *args,
                                         uint32_t n, const uint32_t (*grids)[3],
                                         const uint64_t *bytes, void *stream) {
  jit__cub_exec *e = (jit__cub_exec *)exe;
  if (n != e->n_buffers)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "cuda: %u buffers for a launch of %u", n,
                   e->n_buffers);
  jit__cu_buffer **bufs = calloc(n + 1, sizeof(*bufs));
  bool *wrapped = calloc(n + 1, sizeof(bool));
  jit_status s = bufs && wrapped ? NULL : JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
  for (uint32_t i = 0; i < n && !s; i++) {
    if (args[i].buffer) {
      bufs[i] = (jit__cu_buffer *)args[i].buffer;
      continue;
    }
    uint64_t need = bytes ? bytes[i] : e->bytes[i];
    s = jit__cu_buffer_wrap(e->device->cu, (uint64_t)(uintptr_t)args[i].data,
                            need ? need : 1, &bufs[i]);
    if (s) s = jit__status_annotate(s, "buffer %u", i);
    else wrapped[i] = true;
  }
  jit__cu_run_options ro = {.grids = grids, .stream = (struct CUstream_st *)stream};
  if (!s) s = jit__cu_run(e->cu, bufs, n, &ro);
  for (uint32_t i = 0; bufs && wrapped && i < n; i++)
    if (wrapped[i]) jit__cu_buffer_destroy(bufs[i]);
  free(bufs);
  free(wrapped);
  return s;
}

static jit_status jit__cub_launch_grids(jit__dev_executable *exe, const jit__dev_arg *args,
                                        uint32_t n, const uint32_t (*grids)[3],
                                        const uint64_t *bytes) {
  return jit__cub_launch_stream(exe, args, n, grids, bytes, NULL);
}

static jit_status jit__cub_launch(jit__dev_executable *exe, const jit__dev_arg *args,
                                  uint32_t n) {
  return jit__cub_launch_stream(exe, args, n, NULL, NULL, NULL);
}

static jit_status jit__cub_wait(jit__dev *d) {
  return jit__cu_device_wait(jit__cub_dev(d)->cu, NULL);
}

static const jit__device_vtable kCudaVtable = {
    .destroy = jit__cub_destroy,
    .device_count = jit__cub_device_count,
    .device_info = jit__cub_device_info,
    .open = jit__cub_open,
    .close = jit__cub_close,
    .buffer_alloc = jit__cub_buffer_alloc,
    .buffer_free = jit__cub_buffer_free,
    .upload = jit__cub_upload,
    .download = jit__cub_download,
    .load = jit__cub_load,
    .unload = jit__cub_unload,
    .launch = jit__cub_launch,
    .launch_grids = jit__cub_launch_grids,
    .launch_stream = jit__cub_launch_stream,
    .wait = jit__cub_wait,
};

jit_status jit__cuda_backend_create(jit__backend **out) {
  *out = NULL;
  jit__cu_instance *inst = NULL;
  JIT_PROPAGATE(jit__cu_instance_create(NULL, &inst));
  jit__cu_backend *b = calloc(1, sizeof(*b));
  if (!b) {
    jit__cu_instance_release(inst);
    return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
  }
  b->base.vt = &kCudaVtable;
  b->instance = inst;
  *out = &b->base;
  return NULL;
}
