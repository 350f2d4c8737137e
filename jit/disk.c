//===--- disk.c - the disk tier of the kernel table: one path for every device ===//
//
// Between the in-memory kernel table and a compile sits the on-disk cache (cache/).
// Whatever the device, an entry is the kernel's images (the parts of its payload, best
// first: an object file, a cubin then its PTX, a SPIR-V module), its artifact record
// (cache/artifact.h: entry point, arguments, output shapes, launch plan, notes), so
// that a hit needs neither MLIR nor shape inference, and the text of the key's
// components, so that a miss can be explained (jit_cache_explain).
//
// A hit takes one path: get -> decode the record -> check it describes a kernel of
// this graph (jit__entry_get) -> load the images (CPU: the host JIT, run.c; a GPU: the
// backend, gpu_run.c). A compile takes the other: the lowering's images and record
// -> encode -> put (jit__entry_put) -> load.
//
//===----------------------------------------------------------------------===//
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "base/hex.h"
#include "cache/artifact.h"
#include "cache/cache.h"
#include "jit/internal.h"

//===--- Key components --------------------------------------------------===//

char *jit__key_components(const jit_graph *g, const jit_device *d, const DLTensor *inputs) {
  size_t cap = 1024 + strlen(d->target_text) + g->n_inputs * 256;
  char *s = malloc(cap);
  if (!s) return NULL;
  char fp[33];
  jit__hex_encode(g->fingerprint, 16, fp);
  size_t n = (size_t)snprintf(s, cap, "format=%d\ngraph=%s\ngraph_name=%s\n",
                              JIT__CACHE_FORMAT_VERSION, fp, g->name);
  for (uint32_t i = 0; i < g->n_inputs && n < cap; i++) {
    const DLTensor *t = &inputs[i];
    n += (size_t)snprintf(s + n, cap - n, "input.%u=%s %s [", i, g->nodes[g->inputs[i]].name,
                          t->dtype.bits == 16 ? "f16" : "f32");
    // A generic kernel's inputs carry their symbols (negative codes): named `?name`.
    for (int d = 0; d < t->ndim && n < cap; d++) {
      const char *sym = t->shape[d] < 0 ? jit_symbol_name(g, t->shape[d]) : NULL;
      if (sym) n += (size_t)snprintf(s + n, cap - n, "%s?%s", d ? ", " : "", sym);
      else n += (size_t)snprintf(s + n, cap - n, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    }
    if (n < cap) n += (size_t)snprintf(s + n, cap - n, "]\n");
  }
  if (n < cap) snprintf(s + n, cap - n, "%s", d->target_text);
  return s;
}

//===--- Get ---------------------------------------------------------------===//

void jit__note_value(const char *notes, const char *name, char *out, size_t size) {
  out[0] = 0;
  size_t n = strlen(name);
  for (const char *l = notes; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
    if (strncmp(l, name, n) != 0 || l[n] != '=') continue;
    size_t len = strcspn(l + n + 1, "\n");
    snprintf(out, size, "%.*s", (int)len, l + n + 1);
    return;
  }
}

// Whether the decoded record describes a kernel of `g`: its images cut the payload,
// the first is the record's target, its outputs are `g`'s, and what the device's kind
// of kernel needs is there (CPU: an entry point taking every input and output; GPU: a
// launch plan). Fills en->images and `shapes`.
static bool jit__entry_fits(const jit_graph *g, const jit_device *d, jit__entry *en,
                            jit__oshape *shapes) {
  const jit__art *a = &en->art;
  bool cpu = d->kind == JIT_DEVICE_CPU;
  bool ok = a->n_parts >= 1 && jit__art_parts_size(a) == en->e.payload_size &&
            a->parts[0].kind == a->target && a->n_outputs == g->n_outputs &&
            (cpu ? a->entry[0] && a->n_args == g->n_inputs + g->n_outputs && !a->has_plan
                 : a->has_plan);
  // Packed inputs: the graph's weights only (jit/weights.c keeps copies of those).
  for (uint32_t i = 0; ok && cpu && i < a->n_packed; i++)
    ok = a->packed[i].arg < g->n_inputs && g->nodes[g->inputs[a->packed[i].arg]].n.weight &&
         (i == 0 || a->packed[i - 1].arg < a->packed[i].arg);
  const uint8_t *at = en->e.payload;
  for (uint32_t i = 0; ok && i < a->n_parts; i++) {
    en->images[i] = (jit__image){(jit__image_format)a->parts[i].kind, at, a->parts[i].size};
    at += a->parts[i].size;
  }
  en->n_images = ok ? a->n_parts : 0;
  for (uint32_t j = 0; ok && j < g->n_outputs; j++) {
    const jit__art_shape *o = &a->outputs[j];
    ok = o->dtype == JIT__F32 || o->dtype == JIT__F16 || o->dtype == JIT__BF16;  // never ints
    shapes[j].rank = o->rank;
    shapes[j].dtype = (jit__dtype)o->dtype;
    memcpy(shapes[j].dims, o->dims, sizeof shapes[j].dims);
  }
  jit__note_value(a->notes, "missing", en->missing, sizeof en->missing);
  return ok;
}

bool jit__entry_get(jit_graph *g, jit_device *d, const uint8_t key[16], jit__entry *en,
                    jit__oshape *shapes) {
  jit_context *ctx = g->ctx;
  memset(en, 0, sizeof *en);
  if (!jit__cache_enabled(ctx->cache)) return false;
  bool found = false;
  jit_status s = jit__cache_fetch(ctx->cache, key, &en->e, &found);
  if (s) {
    jit__log(ctx, JIT_LOG_WARNING, "disk cache: %s", jit_status_message(s));
    jit_status_free(s);
    return false;
  }
  if (!found) return false;
  s = jit__art_decode(en->e.meta, en->e.meta_size, &en->art);
  if (s || !jit__entry_fits(g, d, en, shapes)) {
    char hex[33];
    jit__hex_encode(key, 16, hex);
    jit__log(ctx, JIT_LOG_WARNING, "disk cache: entry %s does not describe a %s kernel of "
             "graph `%s`%s%s; recompiling", hex, jit__device_kind_name(d->kind), g->name,
             s ? ": " : "", s ? jit_status_message(s) : "");
    jit_status_free(s);
    jit__entry_release(en);
    return false;
  }
  return true;
}

void jit__entry_release(jit__entry *en) {
  jit__cache_entry_release(&en->e);
  jit__art_release(&en->art);
  memset(en, 0, sizeof *en);
}

//===--- Put ---------------------------------------------------------------===//

void jit__disk_put(jit_context *ctx, const jit__cache_entry *e) {
  jit_status s = jit__cache_put(ctx->cache, e);
  if (s) {
    jit__log(ctx, JIT_LOG_WARNING, "disk cache: %s", jit_status_message(s));
    jit_status_free(s);
  }
}

void jit__entry_put(jit_graph *g, jit_device *d, const uint8_t key[16],
                    const DLTensor *inputs, const jit__art *rec, const jit__image *images,
                    uint32_t n_images, const jit__oshape *shapes) {
  jit_context *ctx = g->ctx;
  if (!jit__cache_enabled(ctx->cache) || n_images < 1 || n_images > JIT__ART_MAX_PARTS) return;
  jit__art art = *rec;
  art.target = images[0].format;
  art.n_parts = n_images;
  art.n_outputs = g->n_outputs;
  art.outputs = calloc(g->n_outputs + 1, sizeof *art.outputs);
  size_t payload_size = 0;
  for (uint32_t i = 0; i < n_images; i++) {
    art.parts[i] = (jit__art_part){images[i].format, images[i].size};
    payload_size += images[i].size;
  }
  for (uint32_t j = 0; art.outputs && j < g->n_outputs; j++) {
    art.outputs[j].rank = shapes[j].rank;
    art.outputs[j].dtype = (int32_t)shapes[j].dtype;
    memcpy(art.outputs[j].dims, shapes[j].dims, sizeof shapes[j].dims);
  }
  // One image is stored as it is; several are concatenated.
  uint8_t *joined = n_images > 1 ? malloc(payload_size + 1) : NULL;
  for (size_t i = 0, at = 0; joined && i < n_images; at += images[i].size, i++)
    memcpy(joined + at, images[i].bytes, images[i].size);
  jit__cache_entry e = {.kind = (jit__payload_kind)images[0].format,
                        .payload = joined ? joined : (void *)images[0].bytes,
                        .payload_size = payload_size};
  memcpy(e.key, key, 16);
  e.components = jit__key_components(g, d, inputs);
  jit_status s = art.outputs ? jit__art_encode(&art, (uint8_t **)&e.meta, &e.meta_size)
                             : JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
  // Out of memory (or a record that would not decode): the kernel is simply not stored.
  if (s) jit__log(ctx, JIT_LOG_WARNING, "disk cache: %s", jit_status_message(s));
  else if (e.components && (joined || n_images == 1)) jit__disk_put(ctx, &e);
  jit_status_free(s);
  free(art.outputs);
  free(joined);
  free(e.meta);
  free(e.components);
}

//===--- CPU kernels ------------------------------------------------------===//

jit_status jit__cpu_load_image(jit_context *ctx, const jit__image *image, const char *entry,
                               jit__cpu_impl *impl) {
  jit_device *d = ctx->devices[0];
  const jit__device_vtable *vt = d->backend->vt;
  jit__dev_kernel kernel = {.entry = entry};
  jit__dev_artifact art = {.images = image, .n_images = 1, .n_kernels = 1, .kernels = &kernel};
  uint32_t used = 0;
  impl->fn = NULL;
  impl->code = NULL;
  JIT_PROPAGATE(vt->load(d->dev, &art, &impl->code, &used));
  vt->host_entry(impl->code, &impl->fn, &impl->threaded);
  impl->code_bytes = image->size;
  return NULL;
}

// Loads the CPU kernel of `key`, counted as a disk hit when `hit`.
static bool jit__disk_load_as(jit_graph *g, const uint8_t key[16], jit__cpu_impl *impl,
                              jit__oshape *out_shapes, bool hit) {
  jit_context *ctx = g->ctx;
  impl->fn = NULL;
  double t0 = jit__now_ms();
  jit__entry en;
  if (!jit__entry_get(g, ctx->devices[0], key, &en, out_shapes)) return false;
  jit_status s = jit__cpu_load_image(ctx, &en.images[0], en.art.entry, impl);
  impl->stack_bytes = en.art.stack_bytes;
  impl->n_packed = en.art.n_packed;
  for (uint32_t i = 0; i < en.art.n_packed; i++)
    impl->packed[i] = (jit__packed_arg){en.art.packed[i].arg, en.art.packed[i].tn,
                                        en.art.packed[i].transposed != 0};
  jit__entry_release(&en);
  if (s) {
    jit__log(ctx, JIT_LOG_WARNING, "disk cache: loading a cached kernel failed (%s); "
             "recompiling", jit_status_message(s));
    jit_status_free(s);
    return false;
  }
  if (!hit) return true;
  double ms = jit__now_ms() - t0;
  atomic_fetch_add_explicit(&ctx->disk_hits, 1, memory_order_relaxed);
  pthread_mutex_lock(&ctx->mu);
  ctx->load_ms += ms;
  pthread_mutex_unlock(&ctx->mu);
  jit__log(ctx, JIT_LOG_DEBUG, "graph `%s`: kernel loaded from the disk cache in %.2f ms",
           g->name, ms);
  return true;
}

bool jit__disk_load(jit_graph *g, const uint8_t key[16], jit__cpu_impl *impl,
                    jit__oshape *out_shapes) {
  return jit__disk_load_as(g, key, impl, out_shapes, true);
}

bool jit__disk_load_uncounted(jit_graph *g, const uint8_t key[16], jit__cpu_impl *impl,
                              jit__oshape *out_shapes) {
  return jit__disk_load_as(g, key, impl, out_shapes, false);
}

void jit__disk_store(jit_graph *g, const uint8_t key[16], const DLTensor *inputs,
                     const jit__artifact *art, const jit__oshape *shapes) {
  jit__art rec = {.n_args = art->n_args, .stack_bytes = art->stack_bytes,
                  .n_packed = art->n_packed};
  for (uint32_t i = 0; i < art->n_packed; i++)
    rec.packed[i] = (jit__art_packed){art->packed[i].arg, art->packed[i].tn,
                                      art->packed[i].transposed};
  snprintf(rec.entry, sizeof rec.entry, "%s", art->entry);
  jit__image image = {JIT__IMAGE_HOST_OBJECT, art->object, art->object_size};
  jit__entry_put(g, g->ctx->devices[0], key, inputs, &rec, &image, 1, shapes);
}
