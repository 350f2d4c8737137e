//===--- gpu_run.c - GPU kernels: compile, cache, load, run ---------------===//
//
// A GPU kernel is the lowering's module (SPIR-V today) plus its launch plan: the
// buffers (inputs, outputs, temporaries) and the kernels in launch order. jit/ owns the
// temporaries: they are allocated once per loaded kernel and reused by every run, so a
// run allocates nothing (runs of one kernel are serialized for that reason).
//
// Disk entries: payload = the module; metadata = a small header with the output
// shapes, followed by the serialized plan. CUDA entries hold the PTX and, when a
// toolkit's ptxas made one, a cubin for the device's SM (payload = PTX then cubin,
// entry kind "cubin" when there is one, else "ptx"), described by a record after the
// plan.
//
// Kernels are loaded and launched only through the backend table (devices/device.h);
// what jit/ knows of a device is its jit__dev_info: the code it runs (SPIR-V, PTX), the
// chip and ISA to compile for.
//
// CUDA cubins: after the lowering's PTX, ptxas (lowering/ptxas.h) assembles it for the
// device's SM. The artifact offers the cubin first and the PTX second; the backend
// loads the cubin (no driver JIT) and falls back to the PTX when the driver refuses it
// (devices/cuda/cuda_backend.c). Which one was used is counted in the stats
// (cuda_cubin_loads / cuda_ptx_loads) and a PTX load is logged with its reason. A
// missing or failing ptxas only costs the cubin: the kernel ships as PTX, and the
// entry keeps the reason. The key is not changed by the toolkit (it has the SM and
// the driver version already): the cubin is made from the keyed PTX for the keyed SM,
// so any ptxas makes an equivalent one, and a prewarmed cache made where a toolkit
// exists serves machines that have only the driver.
//
//===----------------------------------------------------------------------===//
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/hex.h"
#include "jit/internal.h"
#include "lowering/gpu.h"

// A loaded GPU kernel. Thread-safe: runs are serialized by run_mu.
struct jit__gpu_exec {
  jit_device *device;
  jit__gpu_plan plan;
  jit__dev_executable *exe;
  void **temps;            // per plan buffer: the temporary's `data`, else NULL
  jit__dev_buffer **temp_buffers;  // and the allocation behind it
  pthread_mutex_t run_mu;  // one run at a time (temporaries are shared)
};

void jit__gpu_exec_destroy(jit__gpu_exec *e) {
  if (!e) return;
  for (uint32_t i = 0; e->temps && i < e->plan.n_buffers; i++)
    if (e->temps[i]) jit__device_buffer_free(e->device, e->temps[i]);
  free(e->temps);
  free(e->temp_buffers);
  if (e->exe) e->device->backend->vt->unload(e->exe);
  jit__gpu_plan_release(&e->plan);
  pthread_mutex_destroy(&e->run_mu);
  free(e);
}

// What a kernel is loaded from.
typedef struct jit__gpu_image {
  const void *module;  // PTX (CUDA) or SPIR-V (Vulkan)
  size_t module_size;
  const void *cubin;   // PTX: a cubin for the device's chip, or NULL
  size_t cubin_size;
  const char *no_cubin;  // PTX without a cubin: why (for the log); may be NULL
} jit__gpu_image;

// Loads the images through the backend, and counts which one it took.
static jit_status jit__gpu_load_images(jit_device *d, const jit__gpu_image *img,
                                       jit__dev_artifact *art, jit__dev_executable **out) {
  bool ptx = d->info.code == JIT__DEV_CODE_PTX;
  jit__dev_image images[2];
  uint32_t n = 0;
  if (ptx && img->cubin && img->cubin_size)
    images[n++] = (jit__dev_image){JIT__DEV_IMAGE_CUBIN, img->cubin, img->cubin_size};
  images[n++] = (jit__dev_image){ptx ? JIT__DEV_IMAGE_PTX : JIT__DEV_IMAGE_SPIRV,
                                 img->module, img->module_size};
  art->images = images;
  art->n_images = n;
  art->missing_note = img->no_cubin;
  uint32_t used = 0;
  JIT_PROPAGATE(d->backend->vt->load(d->dev, art, out, &used));
  if (images[used].format == JIT__DEV_IMAGE_CUBIN)
    atomic_fetch_add_explicit(&d->ctx->cuda_cubin_loads, 1, memory_order_relaxed);
  else if (images[used].format == JIT__DEV_IMAGE_PTX)
    atomic_fetch_add_explicit(&d->ctx->cuda_ptx_loads, 1, memory_order_relaxed);
  return NULL;
}

// Allocates the plan's temporaries on the device (once per loaded kernel).
static jit_status jit__gpu_alloc_temps(jit__gpu_exec *e) {
  uint32_t n = e->plan.n_buffers;
  e->temps = calloc(n + 1, sizeof(void *));
  e->temp_buffers = calloc(n + 1, sizeof(*e->temp_buffers));
  if (!e->temps || !e->temp_buffers) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
  for (uint32_t i = 0; i < n; i++) {
    if (e->plan.buffers[i].kind != JIT__GPU_BUF_TEMP) continue;
    JIT_PROPAGATE(jit__device_buffer_alloc(e->device, e->plan.buffers[i].bytes, &e->temps[i]));
    e->temp_buffers[i] = jit__device_handle(e->device, e->temps[i]);
  }
  return NULL;
}

// Makes an executable from module bytes and a plan (taken over on success).
static jit_status jit__gpu_load(jit_device *d, const jit__gpu_image *img,
                                jit__gpu_plan *plan, jit__gpu_exec **out) {
  *out = NULL;
  JIT_PROPAGATE(jit__device_open(d));
  jit__gpu_exec *e = calloc(1, sizeof(*e));
  uint64_t *bytes = calloc(plan->n_buffers + 1, sizeof(uint64_t));
  jit__dev_kernel *kd = calloc(plan->n_kernels + 1, sizeof(*kd));
  jit_status s = NULL;
  if (!e || !bytes || !kd) {
    free(e);
    e = NULL;
    s = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
    goto done;
  }
  e->device = d;
  pthread_mutex_init(&e->run_mu, NULL);
  for (uint32_t i = 0; i < plan->n_buffers; i++) bytes[i] = plan->buffers[i].bytes;
  for (uint32_t k = 0; k < plan->n_kernels; k++) {
    const jit__gpu_kernel *pk = &plan->kernels[k];
    kd[k] = (jit__dev_kernel){pk->entry, {0}, {0}, pk->n_args, pk->args};
    memcpy(kd[k].grid, pk->grid, sizeof(kd[k].grid));
    memcpy(kd[k].block, pk->block, sizeof(kd[k].block));
  }
  jit__dev_artifact art = {NULL, 0, NULL, plan->n_buffers, bytes, plan->n_kernels, kd};
  s = jit__gpu_load_images(d, img, &art, &e->exe);
  if (!s) {
    e->plan = *plan;
    memset(plan, 0, sizeof(*plan));
    s = jit__gpu_alloc_temps(e);
  }
done:
  free(bytes);
  free(kd);
  if (s) jit__gpu_exec_destroy(e);
  else *out = e;
  return s;
}

//===--- Disk entries ----------------------------------------------------===//

#define JIT__GPU_META_MAGIC 0x4D555047u  // "GPUM"

typedef struct jit__gpu_meta_head {
  uint32_t magic, n_outputs;
  uint64_t plan_size;
} jit__gpu_meta_head;

typedef struct jit__gpu_meta_out {
  int32_t rank, dtype;
  int64_t dims[JIT_MAX_RANK];
} jit__gpu_meta_out;

#define JIT__GPU_CUDA_MAGIC 0x4D445543u  // "CUDM"

// CUDA entries: after the plan. The payload is the PTX followed by the cubin.
typedef struct jit__gpu_meta_cuda {
  uint32_t magic, reserved;
  uint64_t ptx_size, cubin_size;
  char sm[16];          // the cubin's SM; "" without a cubin
  char ptxas[64];       // version of the ptxas that made it
  char no_cubin[512];   // without a cubin: why
} jit__gpu_meta_cuda;

bool jit__gpu_disk_load(jit_graph *g, jit_device *d, const uint8_t key[16],
                        jit__oshape *shapes, jit__gpu_exec **out) {
  jit_context *ctx = g->ctx;
  *out = NULL;
  if (!jit__cache_enabled(ctx->cache)) return false;
  jit__cache_entry e;
  bool found = false;
  jit_status s = jit__cache_get(ctx->cache, key, &e, &found);
  if (s) {
    jit_status_free(s);
    return false;
  }
  if (!found) return false;
  bool ok = false;
  jit__gpu_meta_head h;
  size_t outs_size = g->n_outputs * sizeof(jit__gpu_meta_out);
  bool cuda = d->info.code == JIT__DEV_CODE_PTX;
  size_t cuda_size = cuda ? sizeof(jit__gpu_meta_cuda) : 0;
  bool kind_ok = cuda ? e.kind == JIT__PAYLOAD_PTX || e.kind == JIT__PAYLOAD_CUBIN
                      : e.kind == JIT__PAYLOAD_SPIRV;
  jit__gpu_meta_cuda cm;
  memset(&cm, 0, sizeof(cm));
  jit__gpu_image img = {e.payload, e.payload_size, NULL, 0, NULL};
  if (kind_ok && e.meta_size >= sizeof(h)) {
    memcpy(&h, e.meta, sizeof(h));
    bool sizes_ok = h.magic == JIT__GPU_META_MAGIC && h.n_outputs == g->n_outputs &&
                    h.plan_size < e.meta_size &&
                    e.meta_size == sizeof(h) + outs_size + h.plan_size + cuda_size;
    if (sizes_ok && cuda) {
      memcpy(&cm, (const unsigned char *)e.meta + e.meta_size - cuda_size, sizeof(cm));
      cm.sm[sizeof cm.sm - 1] = cm.ptxas[sizeof cm.ptxas - 1] = 0;
      cm.no_cubin[sizeof cm.no_cubin - 1] = 0;
      sizes_ok = cm.magic == JIT__GPU_CUDA_MAGIC && cm.ptx_size > 0 &&
                 cm.ptx_size <= e.payload_size && cm.cubin_size == e.payload_size - cm.ptx_size &&
                 (e.kind == JIT__PAYLOAD_CUBIN) == (cm.cubin_size > 0);
      img.module_size = cm.ptx_size;
      // The key has the SM; a cubin for another one would only be refused by the driver.
      if (sizes_ok && cm.cubin_size && strcmp(cm.sm, d->info.chip) == 0) {
        img.cubin = (const unsigned char *)e.payload + cm.ptx_size;
        img.cubin_size = cm.cubin_size;
      }
      img.no_cubin = cm.cubin_size ? "the cached cubin is for another SM" : cm.no_cubin;
    }
    if (sizes_ok) {
      const unsigned char *p = (const unsigned char *)e.meta + sizeof(h);
      for (uint32_t j = 0; j < g->n_outputs; j++) {
        jit__gpu_meta_out o;
        memcpy(&o, p + j * sizeof(o), sizeof(o));
        shapes[j].rank = o.rank;
        shapes[j].dtype = (jit__dtype)o.dtype;
        memcpy(shapes[j].dims, o.dims, sizeof(o.dims));
      }
      jit__gpu_plan plan;
      s = jit__gpu_plan_deserialize(p + outs_size, h.plan_size, &plan);
      if (!s) {
        s = jit__gpu_load(d, &img, &plan, out);
        jit__gpu_plan_release(&plan);
      }
      if (s) {
        jit__log(ctx, JIT_LOG_WARNING, "disk cache: a cached GPU kernel did not load (%s); "
                 "recompiling", jit_status_message(s));
        jit_status_free(s);
      } else {
        ok = true;
        atomic_fetch_add_explicit(&ctx->disk_hits, 1, memory_order_relaxed);
      }
    }
  }
  jit__cache_entry_release(&e);
  return ok;
}

// `cm` (CUDA only, else NULL) describes the cubin in `img` or why there is none.
static void jit__gpu_disk_store(jit_graph *g, jit_device *d, const uint8_t key[16],
                                const DLTensor *inputs, const jit__gpu_artifact *art,
                                const jit__gpu_image *img, const jit__gpu_meta_cuda *cm,
                                const jit__oshape *shapes) {
  jit_context *ctx = g->ctx;
  if (!jit__cache_enabled(ctx->cache)) return;
  uint8_t *plan = NULL;
  size_t plan_size = 0;
  jit_status s = jit__gpu_plan_serialize(&art->plan, &plan, &plan_size);
  if (s) {
    jit_status_free(s);
    return;
  }
  jit__gpu_meta_head h = {JIT__GPU_META_MAGIC, g->n_outputs, plan_size};
  size_t outs_size = g->n_outputs * sizeof(jit__gpu_meta_out);
  size_t cuda_size = cm ? sizeof(*cm) : 0;
  size_t meta_size = sizeof(h) + outs_size + plan_size + cuda_size;
  unsigned char *meta = calloc(1, meta_size);
  char *components = jit__key_components(g, d, inputs);
  // CUDA payload: the PTX, then the cubin (if any).
  size_t payload_size = img->module_size + (cm ? img->cubin_size : 0);
  unsigned char *payload = cm && img->cubin_size ? malloc(payload_size) : NULL;
  if (payload) {
    memcpy(payload, img->module, img->module_size);
    memcpy(payload + img->module_size, img->cubin, img->cubin_size);
  }
  if (meta && components && (payload || !(cm && img->cubin_size))) {
    memcpy(meta, &h, sizeof(h));
    for (uint32_t j = 0; j < g->n_outputs; j++) {
      jit__gpu_meta_out o = {shapes[j].rank, shapes[j].dtype, {0}};
      memcpy(o.dims, shapes[j].dims, sizeof(o.dims));
      memcpy(meta + sizeof(h) + j * sizeof(o), &o, sizeof(o));
    }
    memcpy(meta + sizeof(h) + outs_size, plan, plan_size);
    if (cm) memcpy(meta + sizeof(h) + outs_size + plan_size, cm, sizeof(*cm));
    jit__cache_entry e;
    memset(&e, 0, sizeof(e));
    memcpy(e.key, key, 16);
    e.kind = !cm ? JIT__PAYLOAD_SPIRV : img->cubin_size ? JIT__PAYLOAD_CUBIN : JIT__PAYLOAD_PTX;
    e.meta = meta;
    e.meta_size = meta_size;
    e.payload = payload ? payload : art->binary;
    e.payload_size = payload ? payload_size : art->binary_size;
    e.components = components;
    s = jit__cache_put(ctx->cache, &e);
    if (s) jit_status_free(s);
  }
  free(meta);
  free(components);
  free(plan);
  free(payload);
}

//===--- Compile ---------------------------------------------------------===//

// ptxas may take a while on a large kernel; it is killed after this.
#define JIT__PTXAS_TIMEOUT_MS 120000

// Assembles the artifact's PTX for the device's SM into `*cubin`, or leaves it NULL
// with the reason in `cm->no_cubin`: no ptxas, or ptxas failing, is never an error.
static void jit__gpu_make_cubin(jit_device *d, const jit__gpu_artifact *art,
                                uint8_t **cubin, size_t *cubin_size, jit__gpu_meta_cuda *cm) {
  jit_context *ctx = d->ctx;
  *cubin = NULL;
  *cubin_size = 0;
  jit__ptxas tool;
  pthread_mutex_lock(&ctx->toolkit_mu);
  if (!ctx->ptxas_probed) {
    jit_status s = jit__ptxas_find(ctx->options.cuda_toolkit, &ctx->ptxas);
    if (s) {
      snprintf(ctx->ptxas_absent, sizeof ctx->ptxas_absent, "%s", jit_status_message(s));
      jit__log(ctx, JIT_LOG_INFO, "CUDA kernels ship as PTX only (no cubins): %s",
               jit_status_message(s));
      jit_status_free(s);
    } else {
      jit__log(ctx, JIT_LOG_DEBUG, "CUDA cubins by %s (%s)", ctx->ptxas.path,
               ctx->ptxas.version[0] ? ctx->ptxas.version : "version unknown");
    }
    ctx->ptxas_probed = true;
  }
  tool = ctx->ptxas;
  snprintf(cm->no_cubin, sizeof cm->no_cubin, "%s", ctx->ptxas_absent);
  pthread_mutex_unlock(&ctx->toolkit_mu);
  if (!tool.path[0]) return;
  jit_status s = jit__ptxas_assemble(&tool, art->binary, art->binary_size, d->info.chip,
                                     JIT__PTXAS_TIMEOUT_MS, cubin, cubin_size);
  if (s) {
    snprintf(cm->no_cubin, sizeof cm->no_cubin, "%s", jit_status_message(s));
    jit__log(ctx, JIT_LOG_WARNING, "cuda:%d (%s): no cubin for %s, the kernel ships as PTX "
             "only: %s", d->ordinal, d->name, d->info.chip, jit_status_message(s));
    jit_status_free(s);
    return;
  }
  cm->no_cubin[0] = 0;
  snprintf(cm->sm, sizeof cm->sm, "%s", d->info.chip);
  snprintf(cm->ptxas, sizeof cm->ptxas, "%s", tool.version);
}

jit_status jit__gpu_compile_and_load(jit_graph *g, jit_device *d, const jit__lgraph *lg,
                                     const uint8_t key[16], const DLTensor *inputs,
                                     const jit__oshape *shapes, jit__gpu_exec **out) {
  *out = NULL;
  if (g->mlir)
    return JIT_ERR(JIT_UNSUPPORTED,
                   "graph `%s`: graphs imported from MLIR run on the CPU only (yet)", g->name);
  bool ptx = d->info.code == JIT__DEV_CODE_PTX;
  const char *chip = d->info.chip;
  if (ptx && jit__gpu_ptx_min_version(chip) == 0)
    return JIT_ERR(JIT_UNSUPPORTED, "graph `%s`: %s (%s) is a GPU architecture the PTX "
                   "lowering does not know", g->name, d->name, chip);
  if (ptx && jit__gpu_ptx_min_version(chip) > d->info.isa_max)
    return JIT_ERR(JIT_UNSUPPORTED, "graph `%s`: %s needs PTX %d.%d, newer than its "
                   "driver accepts (%d.%d)", g->name, chip,
                   jit__gpu_ptx_min_version(chip) / 10, jit__gpu_ptx_min_version(chip) % 10,
                   d->info.isa_max / 10, d->info.isa_max % 10);
  bool any_f16 = false;
  for (uint32_t i = 0; i < lg->n_nodes; i++) any_f16 |= lg->nodes[i].dtype == JIT__F16;
  if (any_f16 && !d->f16)
    return JIT_ERR(JIT_UNSUPPORTED,
                   "graph `%s`: f16 on %s needs shaderFloat16 and 16-bit storage buffers, "
                   "which this device lacks",
                   g->name, d->name);
  char hex[33], func_name[48];
  jit__hex_encode(key, 16, hex);
  snprintf(func_name, sizeof(func_name), "jit_%.24s", hex);
  jit__gpu_target t;
  memset(&t, 0, sizeof(t));
  if (ptx) {
    t.format = JIT__GPU_PTX;
    t.chip = chip;
    // libdevice from the same toolkit as ptxas, when one is named.
    const char *tk = g->ctx->options.cuda_toolkit;
    t.cuda_toolkit = tk && tk[0] ? tk : NULL;
  } else {
    t.format = JIT__GPU_SPIRV;
    t.spirv_f16 = any_f16;
  }
  jit__gpu_artifact art;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  jit_status s = jit__compile_gpu(lg, func_name, &t, &art);
  jit__gpu_meta_cuda cm;
  memset(&cm, 0, sizeof(cm));
  cm.magic = JIT__GPU_CUDA_MAGIC;
  uint8_t *cubin = NULL;
  size_t cubin_size = 0;
  if (!s && ptx) {
    jit__gpu_make_cubin(d, &art, &cubin, &cubin_size, &cm);
    cm.ptx_size = art.binary_size;
    cm.cubin_size = cubin_size;
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
  atomic_fetch_add_explicit(&g->ctx->compiles, 1, memory_order_relaxed);
  pthread_mutex_lock(&g->ctx->mu);
  g->ctx->compile_ms += ms;
  pthread_mutex_unlock(&g->ctx->mu);
  if (s) return jit__status_annotate(s, "compiling `%s` for %s:%d", g->name,
                                     jit__device_kind_name(d->kind), d->ordinal);
  jit__gpu_image img = {art.binary, art.binary_size, cubin, cubin_size, cm.no_cubin};
  jit__gpu_disk_store(g, d, key, inputs, &art, &img,
                      ptx ? &cm : NULL, shapes);
  jit__gpu_plan plan = art.plan;
  memset(&art.plan, 0, sizeof(art.plan));
  s = jit__gpu_load(d, &img, &plan, out);
  jit__gpu_plan_release(&plan);
  jit__gpu_artifact_release(&art);
  free(cubin);
  return s;
}

//===--- Run -------------------------------------------------------------===//

// Binds the plan's buffers to the run's tensors and the kernel's temporaries, and
// launches through the backend. Tensors' data were checked by jit/run.c (live, or
// foreign memory the backend checks when it binds it).
jit_status jit__gpu_run(jit__gpu_exec *e, const DLTensor *inputs, uint32_t n_inputs,
                        const DLTensor *outputs, uint32_t n_outputs) {
  uint32_t n = e->plan.n_buffers;
  jit__dev_arg stack[32];
  jit__dev_arg *args = n <= 32 ? stack : malloc(sizeof(*args) * n);
  if (!args) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
  jit_status s = NULL;
  for (uint32_t i = 0; i < n && !s; i++) {
    const jit__gpu_buffer *b = &e->plan.buffers[i];
    args[i].buffer = NULL;
    if (b->kind == JIT__GPU_BUF_INPUT && b->index < n_inputs) {
      args[i].data = inputs[b->index].data;
    } else if (b->kind == JIT__GPU_BUF_OUTPUT && b->index < n_outputs) {
      args[i].data = outputs[b->index].data;
    } else if (b->kind == JIT__GPU_BUF_TEMP && e->temp_buffers[i]) {
      args[i].data = e->temps[i];
      args[i].buffer = e->temp_buffers[i];
    } else {
      s = JIT_ERR(JIT_INTERNAL, "launch plan buffer %u refers to a missing tensor", i);
    }
  }
  if (!s) {
    pthread_mutex_lock(&e->run_mu);
    s = e->device->backend->vt->launch(e->exe, args, n);
    pthread_mutex_unlock(&e->run_mu);
  }
  if (args != stack) free(args);
  return s;
}
