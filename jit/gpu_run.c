//===--- gpu_run.c - GPU kernels: compile, cache, load, run ---------------===//
//
// A GPU kernel is the lowering's module (SPIR-V today) plus its launch plan: the
// buffers (inputs, outputs, temporaries) and the kernels in launch order. jit/ owns the
// temporaries: they are allocated once per loaded kernel and reused by every run, so a
// run allocates nothing (runs of one kernel are serialized for that reason).
//
// Disk entries take jit/disk.c's one path: the images (best first) as the payload's
// parts, the launch plan and the lowering's notes in the artifact record.
//
// Kernels are loaded and launched only through the backend table (devices/device.h);
// what jit/ knows of a device is its jit__dev_info, which it hands to the lowering
// (jit__gpu_target_for) without looking at the kind of code: the lowering picks the
// pipeline and makes the images (for CUDA a cubin by the toolkit's ptxas, then the
// PTX), and the backend loads the first it takes (CUDA falls back from a refused cubin
// to the PTX). Which one was used is counted in the stats (cuda_cubin_loads /
// cuda_ptx_loads); a missing cubin only costs the driver's JIT, and the entry keeps
// why. The key is not changed by the toolkit (it has the SM and the driver version
// already), so a prewarmed cache made where a toolkit exists serves machines that have
// only the driver.
//
//===----------------------------------------------------------------------===//
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "base/hex.h"
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

// What a kernel is loaded from: its images, best first, and why a better one is
// missing ("" or NULL when none is). Borrowed.
typedef struct jit__gpu_image {
  const jit__image *images;
  uint32_t n_images;
  const char *missing;
} jit__gpu_image;

// Loads the images through the backend, and counts which one it took.
static jit_status jit__gpu_load_images(jit_device *d, const jit__gpu_image *img,
                                       jit__dev_artifact *art, jit__dev_executable **out) {
  art->images = img->images;
  art->n_images = img->n_images;
  art->missing_note = img->missing && img->missing[0] ? img->missing : NULL;
  uint32_t used = 0;
  JIT_PROPAGATE(d->backend->vt->load(d->dev, art, out, &used));
  if (img->images[used].format == JIT__IMAGE_CUBIN)
    atomic_fetch_add_explicit(&d->ctx->cuda_cubin_loads, 1, memory_order_relaxed);
  else if (img->images[used].format == JIT__IMAGE_PTX)
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

bool jit__gpu_disk_load(jit_graph *g, jit_device *d, const uint8_t key[16],
                        jit__oshape *shapes, jit__gpu_exec **out) {
  *out = NULL;
  jit__entry en;
  if (!jit__entry_get(g, d, key, &en, shapes)) return false;
  // A generic kernel's entry (programs in its plan) is not a binding's.
  jit_status s = en.art.plan.n_code
                     ? JIT_ERR(JIT_CACHE_ERROR, "the entry is a generic kernel's")
                     : NULL;
  if (!s) {
    jit__gpu_image img = {en.images, en.n_images, en.missing};
    s = jit__gpu_load(d, &img, &en.art.plan, out);
  }
  jit__entry_release(&en);
  if (s) {
    jit__log(g->ctx, JIT_LOG_WARNING, "disk cache: a cached %s kernel of graph `%s` did not "
             "load (%s); recompiling", jit__device_kind_name(d->kind), g->name,
             jit_status_message(s));
    jit_status_free(s);
    return false;
  }
  atomic_fetch_add_explicit(&g->ctx->disk_hits, 1, memory_order_relaxed);
  return true;
}

//===--- Compile ---------------------------------------------------------===//

// Compiles `lg` for `d` (the generic kernel when `req` is given, else the binding's),
// counts the compile and stores the entry of `key`. The caller releases *art
// (jit__gpu_artifact_release) on success.
static jit_status jit__gpu_compile_store(jit_graph *g, jit_device *d, const jit__lgraph *lg,
                                         const int64_t (*req)[JIT_MAX_RANK],
                                         const uint8_t key[16], const DLTensor *inputs,
                                         const jit__oshape *shapes, jit__gpu_artifact *art) {
  memset(art, 0, sizeof(*art));
  if (g->mlir)
    return JIT_ERR(JIT_UNSUPPORTED,
                   "graph `%s`: graphs imported from MLIR run on the CPU only (yet)", g->name);
  jit__gpu_device gd = {d->info.code, d->name, d->info.chip, d->info.isa_max, d->f16,
                        g->ctx->options.cuda_toolkit, d->info.int64};
  jit__gpu_target t;
  JIT_PROPAGATE(jit__gpu_target_for(&gd, lg, &t));
  bool generic = req != NULL;
  char hex[33], func_name[48];
  jit__hex_encode(key, 16, hex);
  snprintf(func_name, sizeof(func_name), "%s_%.24s", generic ? "jitg" : "jit", hex);
  double t0 = jit__now_ms();
  jit_status s = generic ? jit__compile_gpu_generic(lg, req, func_name, &t, art)
                         : jit__compile_gpu(lg, func_name, &t, art);
  double ms = jit__now_ms() - t0;
  jit__count_compile(g->ctx, g, generic ? "generic GPU kernel" : "GPU kernel", ms, NULL);
  if (generic) atomic_fetch_add_explicit(&g->ctx->generic_compiles, 1, memory_order_relaxed);
  if (s) return jit__status_annotate(s, "compiling `%s` for %s:%d", g->name,
                                     jit__device_kind_name(d->kind), d->ordinal);
  char missing[512];
  jit__note_value(art->notes, "missing", missing, sizeof missing);
  if (missing[0])
    jit__log(g->ctx, JIT_LOG_INFO, "%s:%d (%s): `%s` ships without its best image: %s",
             jit__device_kind_name(d->kind), d->ordinal, d->name, g->name, missing);
  jit__art rec = {.has_plan = true, .plan = art->plan, .notes = art->notes};
  jit__entry_put(g, d, key, inputs, &rec, art->images, art->n_images, shapes);
  return NULL;
}

jit_status jit__gpu_compile_and_load(jit_graph *g, jit_device *d, const jit__lgraph *lg,
                                     const uint8_t key[16], const DLTensor *inputs,
                                     const jit__oshape *shapes, jit__gpu_exec **out) {
  *out = NULL;
  jit__gpu_artifact art;
  JIT_PROPAGATE(jit__gpu_compile_store(g, d, lg, NULL, key, inputs, shapes, &art));
  char missing[512];
  jit__note_value(art.notes, "missing", missing, sizeof missing);
  jit__gpu_image img = {art.images, art.n_images, missing};
  jit_status s = jit__gpu_load(d, &img, &art.plan, out);
  jit__gpu_artifact_release(&art);
  return s;
}

//===--- Generic kernels -------------------------------------------------===//

// A graph's generic kernel for one device: its images and its plan with the programs
// of its sizes. Not loaded: each binding loads it with its own bound plan
// (jit__gpu_generic_bind), which costs a module load, not a compile.
struct jit__gpu_generic {
  uint8_t *payload;  // the images' bytes, one after another
  jit__image images[JIT__ART_MAX_PARTS];
  uint32_t n_images;
  char missing[512];
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
  free(gg->payload);
  jit__gpu_plan_release(&gg->plan);
  free(gg);
}

// Copies the images and takes over `plan` into a new jit__gpu_generic.
static jit_status jit__gpu_generic_new(const jit__gpu_image *img, jit__gpu_plan *plan,
                                       jit__gpu_generic **out) {
  size_t size = 0;
  for (uint32_t i = 0; i < img->n_images; i++) size += img->images[i].size;
  jit__gpu_generic *gg = img->n_images <= JIT__ART_MAX_PARTS ? calloc(1, sizeof(*gg)) : NULL;
  if (gg) pthread_mutex_init(&gg->mu, NULL);
  if (gg) gg->payload = malloc(size + 1);
  if (!gg || !gg->payload) {
    jit__gpu_generic_free(gg);
    return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
  }
  uint8_t *at = gg->payload;
  for (uint32_t i = 0; i < img->n_images; i++) {
    memcpy(at, img->images[i].bytes, img->images[i].size);
    gg->images[i] = (jit__image){img->images[i].format, at, img->images[i].size};
    at += img->images[i].size;
  }
  gg->n_images = img->n_images;
  snprintf(gg->missing, sizeof gg->missing, "%s", img->missing ? img->missing : "");
  gg->plan = *plan;
  memset(plan, 0, sizeof(*plan));
  *out = gg;
  return NULL;
}

jit__gpu_generic *jit__gpu_generic_load(jit_graph *g, jit_device *d, const uint8_t key[16],
                                        jit__oshape *shapes) {
  jit__entry en;
  if (!jit__entry_get(g, d, key, &en, shapes)) return NULL;
  jit__gpu_generic *gg = NULL;
  jit_status s = NULL;
  if (en.art.plan.n_code) {
    jit__gpu_image img = {en.images, en.n_images, en.missing};
    s = jit__gpu_generic_new(&img, &en.art.plan, &gg);
  }
  jit__entry_release(&en);
  if (s) {
    jit__log(g->ctx, JIT_LOG_WARNING, "disk cache: a cached generic GPU kernel did not load "
             "(%s); recompiling", jit_status_message(s));
    jit_status_free(s);
  }
  if (gg) atomic_fetch_add_explicit(&g->ctx->disk_hits, 1, memory_order_relaxed);
  return gg;
}

jit_status jit__gpu_generic_make(jit_graph *g, jit_device *d, const uint8_t key[16],
                                 const jit__lgraph *lg, const int64_t (*req)[JIT_MAX_RANK],
                                 const DLTensor *declared, jit__oshape *shapes,
                                 jit__gpu_generic **out) {
  *out = jit__gpu_generic_load(g, d, key, shapes);
  if (*out) return NULL;
  JIT_PROPAGATE(jit__device_open(d));
  for (uint32_t j = 0; j < lg->n_outputs; j++) {
    const jit__node *o = &lg->nodes[lg->outputs[j]];
    shapes[j].rank = o->rank;
    shapes[j].dtype = o->dtype;
    memcpy(shapes[j].dims, o->dims, sizeof shapes[j].dims);
  }
  jit__gpu_artifact art;
  JIT_PROPAGATE(jit__gpu_compile_store(g, d, lg, req, key, declared, shapes, &art));
  char missing[512];
  jit__note_value(art.notes, "missing", missing, sizeof missing);
  jit__gpu_image img = {art.images, art.n_images, missing};
  jit_status s = jit__gpu_generic_new(&img, &art.plan, out);
  jit__gpu_artifact_release(&art);
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
  jit__gpu_image img = {gg->images, gg->n_images, gg->missing};
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
                        const DLTensor *outputs, uint32_t n_outputs, void *stream) {
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
    const uint32_t(*grids)[3] = (const uint32_t(*)[3])e->grids;
    // The temporaries are this kernel's: runs of it take turns (each waits for its
    // kernels before the next binds them).
    pthread_mutex_lock(&e->run_mu);
    if (stream)
      s = vt->launch_stream ? vt->launch_stream(e->exe, args, n, e->shared ? grids : NULL,
                                                e->shared ? e->bytes : NULL, stream)
                            : JIT_ERR(JIT_INVALID_ARGUMENT, "a stream was given for a run "
                                      "on a device without streams");
    else
      s = e->shared ? vt->launch_grids(e->exe, args, n, grids, e->bytes)
                    : vt->launch(e->exe, args, n);
    pthread_mutex_unlock(&e->run_mu);
  }
  if (args != stack) free(args);
  return s;
}
