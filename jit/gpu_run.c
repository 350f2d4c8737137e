//===--- gpu_run.c - GPU kernels: compile, cache, load, run ---------------===//
//
// A GPU kernel is the lowering's module (SPIR-V today) plus its launch plan: the
// buffers (inputs, outputs, temporaries) and the kernels in launch order. jit/ owns the
// temporaries: they are allocated once per loaded kernel and reused by every run, so a
// run allocates nothing (runs of one kernel are serialized for that reason).
//
// Disk entries: payload = the module; metadata = its artifact record
// (cache/artifact.h): output shapes, the serialized launch plan and, for CUDA, the
// payload's parts (the PTX, then a cubin for the device's SM when a toolkit's ptxas
// made one; entry kind "cubin" when there is one, else "ptx") and notes (the cubin's
// SM, the ptxas version, or why there is no cubin).
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
#include "base/text.h"
#include "cache/artifact.h"
#include "jit/internal.h"
#include "lowering/gpu.h"

// A loaded GPU kernel. Thread-safe: runs are serialized by run_mu. A binding of a
// generic kernel has a plan of its own (grids, sizes) and launches the generic
// kernel's module (`shared`: not unloaded here) with its grids.
struct jit__gpu_exec {
  jit_device *device;
  jit__gpu_plan plan;
  jit__dev_executable *exe;
  bool shared;             // `exe` is a generic kernel's: launched with plan's grids
  uint32_t (*grids)[3];    // shared: the plan's grids and buffer sizes, as launches take
  uint64_t *bytes;         // them
  void **temps;            // per plan buffer: the temporary's `data`, else NULL
  jit__dev_buffer **temp_buffers;  // and the allocation behind it
  pthread_mutex_t run_mu;  // one run at a time (temporaries are shared)
};

jit_device *jit__gpu_exec_device(const jit__gpu_exec *e) { return e->device; }

void jit__gpu_exec_destroy(jit__gpu_exec *e) {
  if (!e) return;
  for (uint32_t i = 0; e->temps && i < e->plan.n_buffers; i++)
    if (e->temps[i]) jit__device_buffer_free(e->device, e->temps[i]);
  free(e->temps);
  free(e->temp_buffers);
  free(e->grids);
  free(e->bytes);
  if (e->exe && !e->shared) e->device->backend->vt->unload(e->exe);
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

// Allocates the plan's temporaries (and a generic kernel's SIZES buffer) on the device
// (once per loaded kernel).
static jit_status jit__gpu_alloc_temps(jit__gpu_exec *e) {
  uint32_t n = e->plan.n_buffers;
  e->temps = calloc(n + 1, sizeof(void *));
  e->temp_buffers = calloc(n + 1, sizeof(*e->temp_buffers));
  if (!e->temps || !e->temp_buffers) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
  for (uint32_t i = 0; i < n; i++) {
    if (e->plan.buffers[i].kind != JIT__GPU_BUF_TEMP &&
        e->plan.buffers[i].kind != JIT__GPU_BUF_SIZES)
      continue;
    JIT_PROPAGATE(jit__device_buffer_alloc(e->device, e->plan.buffers[i].bytes, &e->temps[i]));
    e->temp_buffers[i] = jit__device_handle(e->device, e->temps[i]);
  }
  return NULL;
}

// Makes an executable from module bytes and a plan (taken over on success).
static jit_status jit__gpu_load_as(jit_device *d, const jit__gpu_image *img,
                                   jit__gpu_plan *plan, bool temps, jit__gpu_exec **out);

static jit_status jit__gpu_load(jit_device *d, const jit__gpu_image *img,
                                jit__gpu_plan *plan, jit__gpu_exec **out) {
  return jit__gpu_load_as(d, img, plan, true, out);
}

// jit__gpu_load, with the plan's temporaries allocated or not (a generic kernel's
// module: each binding has its own).
static jit_status jit__gpu_load_as(jit_device *d, const jit__gpu_image *img,
                                   jit__gpu_plan *plan, bool temps, jit__gpu_exec **out) {
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
    if (temps) s = jit__gpu_alloc_temps(e);
  }
done:
  free(bytes);
  free(kd);
  if (s) jit__gpu_exec_destroy(e);
  else *out = e;
  return s;
}

//===--- Disk entries ----------------------------------------------------===//

// CUDA entries: what the compile knew of the cubin, kept in the artifact's notes.
typedef struct jit__gpu_cubin_info {
  char sm[16];         // the cubin's SM; "" without a cubin
  char ptxas[64];      // version of the ptxas that made it
  char no_cubin[512];  // without a cubin: why
} jit__gpu_cubin_info;

// Appends "name=value\n" to `t`, the value on one line (ptxas errors span several).
static void jit__note_put(jit__text *t, const char *name, const char *value) {
  jit__text_printf(t, "%s=", name);
  for (const char *c = value; *c; c++) jit__text_append(t, *c == '\n' ? " " : c, 1);
  jit__text_append(t, "\n", 1);
}

// The value of `name` in "name=value" lines, into out (empty when absent).
static void jit__note_get(const char *notes, const char *name, char *out, size_t size) {
  out[0] = 0;
  size_t n = strlen(name);
  for (const char *l = notes; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
    if (strncmp(l, name, n) != 0 || l[n] != '=') continue;
    size_t len = strcspn(l + n + 1, "\n");
    snprintf(out, size, "%.*s", (int)len, l + n + 1);
    return;
  }
}

// The image to load from a cached CUDA entry: the PTX, and the cubin after it when it
// is for this device's SM (the key has the SM; another SM's cubin would only be
// refused by the driver). False when the parts do not describe the payload.
static bool jit__gpu_cuda_image(const jit__art *art, const jit__cache_entry *e,
                                const jit_device *d, jit__gpu_cubin_info *ci,
                                jit__gpu_image *img) {
  bool has_cubin = art->n_parts == 2;
  if (art->n_parts < 1 || art->n_parts > 2 || art->parts[0].kind != JIT__PAYLOAD_PTX ||
      art->parts[0].size == 0 || jit__art_parts_size(art) != e->payload_size ||
      (has_cubin && art->parts[1].kind != JIT__PAYLOAD_CUBIN) ||
      (art->target == JIT__PAYLOAD_CUBIN) != has_cubin)
    return false;
  jit__note_get(art->notes, "sm", ci->sm, sizeof ci->sm);
  jit__note_get(art->notes, "no_cubin", ci->no_cubin, sizeof ci->no_cubin);
  img->module_size = art->parts[0].size;
  if (has_cubin && strcmp(ci->sm, d->info.chip) == 0) {
    img->cubin = (const unsigned char *)e->payload + art->parts[0].size;
    img->cubin_size = art->parts[1].size;
  }
  img->no_cubin = has_cubin ? "the cached cubin is for another SM" : ci->no_cubin;
  return true;
}

// Decodes an entry's artifact record: its image (borrowing the entry's payload), its
// plan (*plan, the caller releases it) and output shapes; false when the entry does
// not describe a kernel of `g` for `d` (then *s may hold why).
static bool jit__gpu_entry_decode(jit_graph *g, jit_device *d, const jit__cache_entry *e,
                                  jit__art *art, jit__gpu_cubin_info *ci, jit__gpu_image *img,
                                  jit__gpu_plan *plan, jit__oshape *shapes, jit_status *s) {
  memset(plan, 0, sizeof *plan);
  bool cuda = d->info.code == JIT__DEV_CODE_PTX;
  *img = (jit__gpu_image){e->payload, e->payload_size, NULL, 0, NULL};
  bool ok = (cuda ? art->target == JIT__PAYLOAD_PTX || art->target == JIT__PAYLOAD_CUBIN
                  : art->target == JIT__PAYLOAD_SPIRV && art->n_parts == 0) &&
            art->n_outputs == g->n_outputs && art->plan &&
            (!cuda || jit__gpu_cuda_image(art, e, d, ci, img));
  for (uint32_t j = 0; ok && j < g->n_outputs; j++) {
    const jit__art_shape *o = &art->outputs[j];
    ok = o->dtype == JIT__F32 || o->dtype == JIT__F16;
    shapes[j].rank = o->rank;
    shapes[j].dtype = (jit__dtype)o->dtype;
    memcpy(shapes[j].dims, o->dims, sizeof shapes[j].dims);
  }
  if (ok) *s = jit__gpu_plan_deserialize(art->plan, art->plan_size, plan);
  return ok && !*s;
}

// Decodes an entry's artifact record and makes the kernel; false (logged) when the
// entry does not describe a kernel of `g` for `d`, or does not load.
static bool jit__gpu_entry_load(jit_graph *g, jit_device *d, const jit__cache_entry *e,
                                jit__oshape *shapes, jit__gpu_exec **out) {
  jit__art art;
  jit_status s = jit__art_decode(e->meta, e->meta_size, &art);
  if (s) {
    jit__log(g->ctx, JIT_LOG_WARNING, "disk cache: %s; recompiling", jit_status_message(s));
    jit_status_free(s);
    return false;
  }
  jit__gpu_cubin_info ci;
  jit__gpu_image img;
  jit__gpu_plan plan;
  bool ok = jit__gpu_entry_decode(g, d, e, &art, &ci, &img, &plan, shapes, &s);
  // A generic kernel's entry (programs in its plan) is not a binding's.
  if (ok && plan.n_code) ok = false;
  if (ok) s = jit__gpu_load(d, &img, &plan, out);
  jit__gpu_plan_release(&plan);
  if (s) {
    jit__log(g->ctx, JIT_LOG_WARNING, "disk cache: a cached GPU kernel did not load (%s); "
             "recompiling", jit_status_message(s));
    jit_status_free(s);
    ok = false;
  } else if (!ok) {
    jit__log(g->ctx, JIT_LOG_WARNING, "disk cache: an entry does not describe a %s kernel "
             "of graph `%s`; recompiling", jit__device_kind_name(d->kind), g->name);
  }
  jit__art_release(&art);
  return ok;
}

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
  bool ok = jit__gpu_entry_load(g, d, &e, shapes, out);
  if (ok) atomic_fetch_add_explicit(&ctx->disk_hits, 1, memory_order_relaxed);
  jit__cache_entry_release(&e);
  return ok;
}

// The artifact record of a GPU kernel: `ci` (CUDA only, else NULL) describes the
// cubin in `img` or why there is none. Returns malloc'ed bytes, or NULL.
static uint8_t *jit__gpu_record(jit_graph *g, const jit__gpu_artifact *art,
                                const jit__gpu_image *img, const jit__gpu_cubin_info *ci,
                                const jit__oshape *shapes, size_t *out_size) {
  jit__art rec = {.n_outputs = g->n_outputs};
  rec.target = !ci ? JIT__PAYLOAD_SPIRV : img->cubin_size ? JIT__PAYLOAD_CUBIN : JIT__PAYLOAD_PTX;
  rec.outputs = calloc(g->n_outputs + 1, sizeof *rec.outputs);
  jit__text notes = {0};
  if (ci) {
    rec.n_parts = img->cubin_size ? 2 : 1;
    rec.parts[0] = (jit__art_part){JIT__PAYLOAD_PTX, img->module_size};
    rec.parts[1] = (jit__art_part){JIT__PAYLOAD_CUBIN, img->cubin_size};
    jit__note_put(&notes, "sm", ci->sm);
    jit__note_put(&notes, "ptxas", ci->ptxas);
    jit__note_put(&notes, "no_cubin", ci->no_cubin);
    rec.notes = notes.p;
  }
  for (uint32_t j = 0; rec.outputs && j < g->n_outputs; j++) {
    rec.outputs[j].rank = shapes[j].rank;
    rec.outputs[j].dtype = (int32_t)shapes[j].dtype;
    memcpy(rec.outputs[j].dims, shapes[j].dims, sizeof shapes[j].dims);
  }
  size_t plan_size = 0;
  jit_status s = jit__gpu_plan_serialize(&art->plan, &rec.plan, &plan_size);
  rec.plan_size = plan_size;
  uint8_t *bytes = NULL;
  if (!s && rec.outputs && !notes.oom) s = jit__art_encode(&rec, &bytes, out_size);
  jit_status_free(s);  // out of memory: the kernel is simply not stored
  free(rec.outputs);
  free(rec.plan);
  free(notes.p);
  return bytes;
}

static void jit__gpu_disk_store(jit_graph *g, jit_device *d, const uint8_t key[16],
                                const DLTensor *inputs, const jit__gpu_artifact *art,
                                const jit__gpu_image *img, const jit__gpu_cubin_info *ci,
                                const jit__oshape *shapes) {
  jit_context *ctx = g->ctx;
  if (!jit__cache_enabled(ctx->cache)) return;
  jit__cache_entry e;
  memset(&e, 0, sizeof(e));
  memcpy(e.key, key, 16);
  e.meta = jit__gpu_record(g, art, img, ci, shapes, &e.meta_size);
  char *components = jit__key_components(g, d, inputs);
  // CUDA payload: the PTX, then the cubin (if any).
  size_t payload_size = img->module_size + (ci ? img->cubin_size : 0);
  unsigned char *payload = ci && img->cubin_size ? malloc(payload_size) : NULL;
  if (payload) {
    memcpy(payload, img->module, img->module_size);
    memcpy(payload + img->module_size, img->cubin, img->cubin_size);
  }
  if (e.meta && components && (payload || !(ci && img->cubin_size))) {
    e.kind = !ci ? JIT__PAYLOAD_SPIRV : img->cubin_size ? JIT__PAYLOAD_CUBIN : JIT__PAYLOAD_PTX;
    e.payload = payload ? payload : art->binary;
    e.payload_size = payload ? payload_size : art->binary_size;
    e.components = components;
    jit__disk_put(ctx, &e);
  }
  free(e.meta);
  free(components);
  free(payload);
}

//===--- Compile ---------------------------------------------------------===//

// ptxas may take a while on a large kernel; it is killed after this.
#define JIT__PTXAS_TIMEOUT_MS 120000

// Assembles the artifact's PTX for the device's SM into `*cubin`, or leaves it NULL
// with the reason in `cm->no_cubin`: no ptxas, or ptxas failing, is never an error.
static void jit__gpu_make_cubin(jit_device *d, const jit__gpu_artifact *art,
                                uint8_t **cubin, size_t *cubin_size, jit__gpu_cubin_info *cm) {
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

// What to compile `lg` to for device `d`; JIT_UNSUPPORTED where the device cannot run
// it (an unknown chip, a driver too old for its PTX, f16 without the features).
static jit_status jit__gpu_target_for(jit_graph *g, jit_device *d, const jit__lgraph *lg,
                                      jit__gpu_target *t) {
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
  memset(t, 0, sizeof(*t));
  if (ptx) {
    t->format = JIT__GPU_PTX;
    t->chip = chip;
    // libdevice from the same toolkit as ptxas, when one is named.
    const char *tk = g->ctx->options.cuda_toolkit;
    t->cuda_toolkit = tk && tk[0] ? tk : NULL;
  } else {
    t->format = JIT__GPU_SPIRV;
    t->spirv_f16 = any_f16;
  }
  return NULL;
}

// A compiled GPU kernel: the artifact, for CUDA a cubin made from its PTX, and the
// image of both that loading takes.
typedef struct jit__gpu_built {
  jit__gpu_artifact art;
  jit__gpu_cubin_info cm;
  uint8_t *cubin;
  size_t cubin_size;
  jit__gpu_image img;
} jit__gpu_built;

static void jit__gpu_built_release(jit__gpu_built *b) {
  jit__gpu_artifact_release(&b->art);
  free(b->cubin);
}

// Compiles `lg` for `d` (the generic kernel when `req` is given, else the binding's),
// makes a cubin for CUDA, counts the compile and stores the entry of `key`. The caller
// releases *b (jit__gpu_built_release) on success.
static jit_status jit__gpu_compile_store(jit_graph *g, jit_device *d, const jit__lgraph *lg,
                                         const int64_t (*req)[JIT_MAX_RANK],
                                         const uint8_t key[16], const DLTensor *inputs,
                                         const jit__oshape *shapes, jit__gpu_built *b) {
  memset(b, 0, sizeof(*b));
  jit__gpu_target t;
  JIT_PROPAGATE(jit__gpu_target_for(g, d, lg, &t));
  bool ptx = t.format == JIT__GPU_PTX, generic = req != NULL;
  char hex[33], func_name[48];
  jit__hex_encode(key, 16, hex);
  snprintf(func_name, sizeof(func_name), "%s_%.24s", generic ? "jitg" : "jit", hex);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  jit_status s = generic ? jit__compile_gpu_generic(lg, req, func_name, &t, &b->art)
                         : jit__compile_gpu(lg, func_name, &t, &b->art);
  if (!s && ptx) jit__gpu_make_cubin(d, &b->art, &b->cubin, &b->cubin_size, &b->cm);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
  atomic_fetch_add_explicit(&g->ctx->compiles, 1, memory_order_relaxed);
  if (generic) atomic_fetch_add_explicit(&g->ctx->generic_compiles, 1, memory_order_relaxed);
  pthread_mutex_lock(&g->ctx->mu);
  g->ctx->compile_ms += ms;
  pthread_mutex_unlock(&g->ctx->mu);
  if (s) return jit__status_annotate(s, "compiling `%s` for %s:%d", g->name,
                                     jit__device_kind_name(d->kind), d->ordinal);
  b->img = (jit__gpu_image){b->art.binary, b->art.binary_size, b->cubin, b->cubin_size,
                            b->cm.no_cubin};
  jit__gpu_disk_store(g, d, key, inputs, &b->art, &b->img, ptx ? &b->cm : NULL, shapes);
  return NULL;
}

jit_status jit__gpu_compile_and_load(jit_graph *g, jit_device *d, const jit__lgraph *lg,
                                     const uint8_t key[16], const DLTensor *inputs,
                                     const jit__oshape *shapes, jit__gpu_exec **out) {
  *out = NULL;
  jit__gpu_built b;
  JIT_PROPAGATE(jit__gpu_compile_store(g, d, lg, NULL, key, inputs, shapes, &b));
  jit__gpu_plan plan = b.art.plan;
  memset(&b.art.plan, 0, sizeof(b.art.plan));
  jit_status s = jit__gpu_load(d, &b.img, &plan, out);
  jit__gpu_plan_release(&plan);
  jit__gpu_built_release(&b);
  return s;
}

//===--- Generic kernels -------------------------------------------------===//

// A graph's generic kernel for one device: its module (and cubin) and its plan with
// the programs of its sizes. Not loaded: each binding loads it with its own bound
// plan (jit__gpu_generic_bind), which costs a module load, not a compile.
struct jit__gpu_generic {
  uint8_t *module, *cubin;
  size_t module_size, cubin_size;
  char no_cubin[512];
  jit__gpu_plan plan;
  // Where the backend launches with given grids: the module, loaded once (at the
  // first binding), that every binding launches.
  pthread_mutex_t mu;
  jit__gpu_exec *loaded;
};

void jit__gpu_generic_free(jit__gpu_generic *gg) {
  if (!gg) return;
  jit__gpu_exec_destroy(gg->loaded);
  pthread_mutex_destroy(&gg->mu);
  free(gg->module);
  free(gg->cubin);
  jit__gpu_plan_release(&gg->plan);
  free(gg);
}

// Copies an image and takes over `plan` into a new jit__gpu_generic.
static jit_status jit__gpu_generic_new(const jit__gpu_image *img, jit__gpu_plan *plan,
                                       jit__gpu_generic **out) {
  jit__gpu_generic *gg = calloc(1, sizeof(*gg));
  if (gg) pthread_mutex_init(&gg->mu, NULL);
  if (gg) gg->module = malloc(img->module_size + 1);
  if (gg && img->cubin_size) gg->cubin = malloc(img->cubin_size);
  if (!gg || !gg->module || (img->cubin_size && !gg->cubin)) {
    jit__gpu_generic_free(gg);
    return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
  }
  memcpy(gg->module, img->module, img->module_size);
  gg->module_size = img->module_size;
  if (img->cubin_size) memcpy(gg->cubin, img->cubin, img->cubin_size);
  gg->cubin_size = img->cubin_size;
  snprintf(gg->no_cubin, sizeof gg->no_cubin, "%s", img->no_cubin ? img->no_cubin : "");
  gg->plan = *plan;
  memset(plan, 0, sizeof(*plan));
  *out = gg;
  return NULL;
}

// The generic kernel of `key` from the disk cache, or NULL.
static jit__gpu_generic *jit__gpu_generic_from_disk(jit_graph *g, jit_device *d,
                                                    const uint8_t key[16],
                                                    jit__oshape *shapes) {
  jit_context *ctx = g->ctx;
  if (!jit__cache_enabled(ctx->cache)) return NULL;
  jit__cache_entry e;
  bool found = false;
  jit_status s = jit__cache_get(ctx->cache, key, &e, &found);
  if (s || !found) {
    jit_status_free(s);
    return NULL;
  }
  jit__gpu_generic *gg = NULL;
  jit__art art;
  if (!(s = jit__art_decode(e.meta, e.meta_size, &art))) {
    jit__gpu_cubin_info ci;
    jit__gpu_image img;
    jit__gpu_plan plan;
    if (jit__gpu_entry_decode(g, d, &e, &art, &ci, &img, &plan, shapes, &s) && plan.n_code)
      s = jit__gpu_generic_new(&img, &plan, &gg);
    jit__gpu_plan_release(&plan);
    jit__art_release(&art);
  }
  if (s) {
    jit__log(ctx, JIT_LOG_WARNING, "disk cache: a cached generic GPU kernel did not load "
             "(%s); recompiling", jit_status_message(s));
    jit_status_free(s);
  }
  if (gg) atomic_fetch_add_explicit(&ctx->disk_hits, 1, memory_order_relaxed);
  jit__cache_entry_release(&e);
  return gg;
}

jit__gpu_generic *jit__gpu_generic_load(jit_graph *g, jit_device *d, const uint8_t key[16],
                                        jit__oshape *shapes) {
  return jit__gpu_generic_from_disk(g, d, key, shapes);
}

jit_status jit__gpu_generic_make(jit_graph *g, jit_device *d, const uint8_t key[16],
                                 const jit__lgraph *lg, const int64_t (*req)[JIT_MAX_RANK],
                                 const DLTensor *declared, jit__oshape *shapes,
                                 jit__gpu_generic **out) {
  *out = jit__gpu_generic_from_disk(g, d, key, shapes);
  if (*out) return NULL;
  JIT_PROPAGATE(jit__device_open(d));
  for (uint32_t j = 0; j < lg->n_outputs; j++) {
    const jit__node *o = &lg->nodes[lg->outputs[j]];
    shapes[j].rank = o->rank;
    shapes[j].dtype = o->dtype;
    memcpy(shapes[j].dims, o->dims, sizeof shapes[j].dims);
  }
  jit__gpu_built b;
  JIT_PROPAGATE(jit__gpu_compile_store(g, d, lg, req, key, declared, shapes, &b));
  jit_status s = jit__gpu_generic_new(&b.img, &b.art.plan, out);
  jit__gpu_built_release(&b);
  return s;
}

// A binding's kernel that launches generic kernel `gg`'s module, loaded once here,
// with `plan` (the binding's, taken over): temporaries of its own, no module load.
static jit_status jit__gpu_generic_shared(jit__gpu_generic *gg, jit_device *d,
                                          const jit__gpu_image *img, jit__gpu_plan *plan,
                                          jit__gpu_exec **out) {
  jit_status s = NULL;
  pthread_mutex_lock(&gg->mu);
  if (!gg->loaded) {
    jit__gpu_plan p;
    s = jit__gpu_plan_shell(&gg->plan, &p);
    if (!s) s = jit__gpu_load_as(d, img, &p, false, &gg->loaded);
    jit__gpu_plan_release(&p);
  }
  jit__gpu_exec *shared = gg->loaded;
  pthread_mutex_unlock(&gg->mu);
  if (s) return s;
  jit__gpu_exec *e = calloc(1, sizeof(*e));
  if (!e) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
  e->device = d;
  e->exe = shared->exe;
  e->shared = true;
  pthread_mutex_init(&e->run_mu, NULL);
  e->plan = *plan;
  memset(plan, 0, sizeof(*plan));
  e->grids = malloc(sizeof(*e->grids) * (e->plan.n_kernels + 1));
  e->bytes = malloc(sizeof(*e->bytes) * (e->plan.n_buffers + 1));
  s = e->grids && e->bytes ? jit__gpu_alloc_temps(e)
                           : JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
  for (uint32_t k = 0; !s && k < e->plan.n_kernels; k++)
    memcpy(e->grids[k], e->plan.kernels[k].grid, sizeof e->grids[k]);
  for (uint32_t i = 0; !s && i < e->plan.n_buffers; i++) e->bytes[i] = e->plan.buffers[i].bytes;
  if (s) jit__gpu_exec_destroy(e);
  else *out = e;
  return s;
}

jit_status jit__gpu_generic_bind(jit__gpu_generic *gg, jit_device *d, const DLTensor *inputs,
                                 uint32_t n_in, const jit__oshape *outs, uint32_t n_out,
                                 jit__gpu_exec **out) {
  *out = NULL;
  uint32_t n_io = n_in + n_out;
  int *ranks = calloc(n_io + 1, sizeof(int));
  int64_t(*dims)[JIT_MAX_RANK] = calloc(n_io + 1, sizeof(*dims));
  jit_status s = NULL;
  jit__gpu_plan plan;
  int32_t *sizes = NULL;
  if (!ranks || !dims) {
    s = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
    goto done;
  }
  for (uint32_t i = 0; i < n_io; i++) {
    bool in = i < n_in;
    ranks[i] = in ? inputs[i].ndim : outs[i - n_in].rank;
    const int64_t *src = in ? inputs[i].shape : outs[i - n_in].dims;
    memcpy(dims[i], src, sizeof(int64_t) * (size_t)ranks[i]);
  }
  s = jit__gpu_plan_bind(&gg->plan, n_io, ranks, (const int64_t(*)[JIT_MAX_RANK])dims, &plan,
                         &sizes);
  if (s) goto done;
  jit__gpu_image img = {gg->module, gg->module_size, gg->cubin, gg->cubin_size,
                        gg->no_cubin[0] ? gg->no_cubin : NULL};
  uint32_t n_sizes = plan.n_sizes;
  if (d->backend->vt->launch_grids) {
    s = jit__gpu_generic_shared(gg, d, &img, &plan, out);
  } else {
    s = jit__gpu_load(d, &img, &plan, out);
  }
  jit__gpu_plan_release(&plan);
  // The sizes go into the SIZES buffer once: this loaded kernel serves one binding.
  for (uint32_t i = 0; !s && i < (*out)->plan.n_buffers; i++)
    if ((*out)->plan.buffers[i].kind == JIT__GPU_BUF_SIZES && n_sizes)
      s = jit__device_upload(d, (*out)->temps[i], 0, sizes, 4 * (uint64_t)n_sizes);
  if (s) {
    jit__gpu_exec_destroy(*out);
    *out = NULL;
  }
done:
  free(ranks);
  free(dims);
  free(sizes);
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
    } else if ((b->kind == JIT__GPU_BUF_TEMP || b->kind == JIT__GPU_BUF_SIZES) &&
               e->temp_buffers[i]) {
      args[i].data = e->temps[i];
      args[i].buffer = e->temp_buffers[i];
    } else {
      s = JIT_ERR(JIT_INTERNAL, "launch plan buffer %u refers to a missing tensor", i);
    }
  }
  if (!s) {
    const jit__device_vtable *vt = e->device->backend->vt;
    pthread_mutex_lock(&e->run_mu);
    s = e->shared ? vt->launch_grids(e->exe, args, n, (const uint32_t(*)[3])e->grids, e->bytes)
                  : vt->launch(e->exe, args, n);
    pthread_mutex_unlock(&e->run_mu);
  }
  if (args != stack) free(args);
  return s;
}
