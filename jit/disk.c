//===--- disk.c - the disk tier of the kernel table ------------------------===//
//
// Between the in-memory kernel table and a compile sits the on-disk cache (cache/). An
// entry for a CPU kernel is the object file as the compile produced it, plus a small
// metadata record (entry point, argument count, output shapes) so that a hit needs
// neither MLIR nor shape inference, plus the text of the key's components so a miss
// can be explained (jit_cache_explain).
//
//===----------------------------------------------------------------------===//
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/hex.h"
#include "base/clock.h"
#include "cache/artifact.h"
#include "cache/cache.h"
#include "jit/internal.h"

//===--- Metadata record -------------------------------------------------===//

// The entry's metadata is its artifact record (cache/artifact.h): entry point,
// argument count, stack bytes and output shapes, so a hit needs no shape inference.
static void *jit__meta_encode(const char *entry, uint32_t n_args, uint32_t n_outputs,
                              uint32_t stack_bytes, const jit__oshape *outs,
                              size_t *out_size) {
  jit__art art = {.target = JIT__PAYLOAD_CPU_OBJECT, .n_args = n_args,
                  .stack_bytes = stack_bytes, .n_outputs = n_outputs};
  snprintf(art.entry, sizeof art.entry, "%s", entry);
  art.outputs = calloc(n_outputs ? n_outputs : 1, sizeof *art.outputs);
  if (!art.outputs) return NULL;
  for (uint32_t j = 0; j < n_outputs; j++) {
    art.outputs[j].rank = outs[j].rank;
    art.outputs[j].dtype = (int32_t)outs[j].dtype;
    memcpy(art.outputs[j].dims, outs[j].dims, sizeof outs[j].dims);
  }
  uint8_t *bytes = NULL;
  jit_status s = jit__art_encode(&art, &bytes, out_size);
  free(art.outputs);
  jit_status_free(s);  // out of memory: the kernel is simply not stored
  return bytes;
}

// Decodes and checks a record against what the graph expects.
static bool jit__meta_decode(const void *meta, size_t size, uint32_t n_args,
                             uint32_t n_outputs, char entry[64], uint32_t *stack_bytes,
                             jit__oshape *outs) {
  jit__art art;
  jit_status s = jit__art_decode(meta, size, &art);
  if (s) {
    jit_status_free(s);
    return false;
  }
  bool ok = art.target == JIT__PAYLOAD_CPU_OBJECT && art.entry[0] && art.n_args == n_args &&
            art.n_outputs == n_outputs;
  for (uint32_t j = 0; ok && j < n_outputs; j++) {
    const jit__art_shape *o = &art.outputs[j];
    ok = o->dtype == JIT__F32 || o->dtype == JIT__F16;
    outs[j].rank = o->rank;
    outs[j].dtype = (jit__dtype)o->dtype;
    memcpy(outs[j].dims, o->dims, sizeof outs[j].dims);
  }
  if (ok) {
    memcpy(entry, art.entry, sizeof art.entry);
    *stack_bytes = art.stack_bytes;
  }
  jit__art_release(&art);
  return ok;
}

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

//===--- Load and store --------------------------------------------------===//

bool jit__disk_load(jit_graph *g, const uint8_t key[16], jit__cpu_impl *impl,
                    jit__oshape *out_shapes) {
  jit_context *ctx = g->ctx;
  impl->fn = NULL;
  if (!jit__cache_enabled(ctx->cache)) return false;
  double t0 = jit__now_ms();
  jit__cache_entry e;
  bool found = false;
  jit_status s = jit__cache_get(ctx->cache, key, &e, &found);
  if (s) {
    jit__log(ctx, JIT_LOG_WARNING, "disk cache: %s", jit_status_message(s));
    jit_status_free(s);
    return false;
  }
  if (!found) return false;
  char entry[64];
  bool ok = false;
  if (e.kind != JIT__PAYLOAD_CPU_OBJECT ||
      !jit__meta_decode(e.meta, e.meta_size, g->n_inputs + g->n_outputs, g->n_outputs,
                        entry, &impl->stack_bytes, out_shapes)) {
    char hex[33];
    jit__hex_encode(key, 16, hex);
    jit__log(ctx, JIT_LOG_WARNING,
             "disk cache: entry %s does not describe a CPU kernel of graph `%s`; "
             "recompiling",
             hex, g->name);
  } else {
    s = jit__cpu_load_code(ctx->cpu, e.payload, e.payload_size, entry, &impl->fn,
                           &impl->threaded, &impl->code);
    impl->code_bytes = e.payload_size;
    if (s) {
      jit__log(ctx, JIT_LOG_WARNING, "disk cache: loading a cached kernel failed (%s); "
               "recompiling", jit_status_message(s));
      jit_status_free(s);
    } else {
      ok = true;
    }
  }
  jit__cache_entry_release(&e);
  if (ok) {
    double ms = jit__now_ms() - t0;
    atomic_fetch_add_explicit(&ctx->disk_hits, 1, memory_order_relaxed);
    pthread_mutex_lock(&ctx->mu);
    ctx->load_ms += ms;
    pthread_mutex_unlock(&ctx->mu);
    jit__log(ctx, JIT_LOG_DEBUG, "graph `%s`: kernel loaded from the disk cache in %.2f ms",
             g->name, ms);
  }
  return ok;
}

void jit__disk_put(jit_context *ctx, const jit__cache_entry *e) {
  jit_status s = jit__cache_put(ctx->cache, e);
  if (s) {
    jit__log(ctx, JIT_LOG_WARNING, "disk cache: %s", jit_status_message(s));
    jit_status_free(s);
  }
}

void jit__disk_store(jit_graph *g, const uint8_t key[16], const DLTensor *inputs,
                     const jit__artifact *art, const jit__oshape *shapes) {
  jit_context *ctx = g->ctx;
  if (!jit__cache_enabled(ctx->cache)) return;
  jit__cache_entry e;
  memset(&e, 0, sizeof(e));
  memcpy(e.key, key, 16);
  e.kind = JIT__PAYLOAD_CPU_OBJECT;
  e.meta = jit__meta_encode(art->entry, art->n_args, g->n_outputs, art->stack_bytes, shapes,
                            &e.meta_size);
  e.payload = art->object;
  e.payload_size = art->object_size;
  e.components = jit__key_components(g, ctx->devices[0], inputs);
  if (e.meta && e.components) jit__disk_put(ctx, &e);
  free(e.meta);
  free(e.components);
}
