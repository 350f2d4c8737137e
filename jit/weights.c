//===--- weights.c - jit_weight inputs and their packed copies ----------------===//
//
// A kernel may read a weight (jit_weight) as the panels its matrix products read,
// [N / tn][K][tn] (lowering/cpu/prepack.c), instead of packing them from the [K, N]
// matrix (or the [N, K] matrix W of B = W^T) on every call; its record lists those inputs (jit__cpu_impl.packed). The copy
// is the graph's, one per input, shared by every kernel of the graph: made on the
// first call that needs it and again when the call's data pointer, the panel width or
// the graph's weights generation (jit_graph_weights_changed) is not the copy's. A call
// holds each copy it reads for reading (a rwlock) while its kernel runs, so a copy is
// never remade under a running kernel.
//
//===----------------------------------------------------------------------===//
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "jit/internal.h"

typedef struct jit__wpack {
  pthread_rwlock_t lock;
  bool live;          // a weight: `lock` initialized
  const void *src;    // the data the copy was made from (NULL: none made)
  uint64_t gen;       // g->weights_gen when it was made
  uint32_t tn;        // its panel width
  bool tr;            // made from W [N, K] as the panels of B = W^T
  float *panels;      // [N / tn][K][tn], 64-byte aligned
  size_t bytes;
} jit__wpack;

jit_value jit_weight(jit_graph *g, const char *name, DLDataType dtype, int rank,
                     const int64_t *dims) {
  jit_value v = jit_input(g, name, dtype, rank, dims);
  if (v.id == 0) return v;
  g->nodes[v.id - 1].n.weight = true;
  return v;
}

void jit_graph_weights_changed(jit_graph *g) {
  if (g) atomic_fetch_add_explicit(&g->weights_gen, 1, memory_order_release);
}

jit_status jit__weights_init(jit_graph *g) {
  bool any = false;
  for (uint32_t i = 0; i < g->n_inputs && !any; i++) any = g->nodes[g->inputs[i]].n.weight;
  if (!any) return NULL;
  g->wpacks = calloc(g->n_inputs, sizeof(jit__wpack));
  if (!g->wpacks) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "graph `%s`: out of memory", g->name);
  for (uint32_t i = 0; i < g->n_inputs; i++) {
    if (!g->nodes[g->inputs[i]].n.weight) continue;
    if (pthread_rwlock_init(&g->wpacks[i].lock, NULL) != 0) {
      jit__weights_free(g);
      return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "graph `%s`: cannot make a lock", g->name);
    }
    g->wpacks[i].live = true;
  }
  return NULL;
}

void jit__weights_free(jit_graph *g) {
  if (!g->wpacks) return;
  for (uint32_t i = 0; i < g->n_inputs; i++) {
    if (!g->wpacks[i].live) continue;
    pthread_rwlock_destroy(&g->wpacks[i].lock);
    free(g->wpacks[i].panels);
  }
  free(g->wpacks);
  g->wpacks = NULL;
}

// (Re)makes wp's copy of `t` (K x N f32) as panels of tn columns. Caller holds the
// lock for writing.
static jit_status jit__pack(jit_graph *g, uint32_t i, jit__wpack *wp, const DLTensor *t,
                            const float *src, uint32_t tn, bool tr, uint64_t gen) {
  int64_t K = t->shape[tr ? 1 : 0], N = t->shape[tr ? 0 : 1];
  size_t bytes = (size_t)K * (size_t)N * sizeof(float);
  if (!wp->panels || wp->bytes != bytes) {
    free(wp->panels);
    wp->src = NULL;
    wp->panels = aligned_alloc(64, (bytes + 63) / 64 * 64);
    wp->bytes = wp->panels ? bytes : 0;
    if (!wp->panels)
      return JIT_ERR(JIT_RESOURCE_EXHAUSTED,
                     "jit_run: graph `%s`: no memory for the packed copy of weight %u "
                     "(%zu bytes)", g->name, i, bytes);
  }
  for (int64_t p = 0; p < N / tn; p++) {
    float *panel = wp->panels + (size_t)p * K * tn;
    if (!tr) {
      for (int64_t k = 0; k < K; k++)
        memcpy(panel + (size_t)k * tn, src + (size_t)k * N + (size_t)p * tn, tn * sizeof(float));
      continue;
    }
    for (uint32_t j = 0; j < tn; j++) {  // W's row p * tn + j is the panel's column j
      const float *row = src + ((size_t)p * tn + j) * K;
      for (int64_t k = 0; k < K; k++) panel[(size_t)k * tn + j] = row[k];
    }
  }
  wp->src = src;
  wp->tr = tr;
  wp->gen = gen;
  wp->tn = tn;
  atomic_fetch_add_explicit(&g->ctx->weight_packs, 1, memory_order_relaxed);
  return NULL;
}

// Releases the first n copies of `im`'s list.
static void jit__release_first(jit_graph *g, const jit__cpu_impl *im, uint32_t n) {
  for (uint32_t j = 0; j < n; j++) pthread_rwlock_unlock(&g->wpacks[im->packed[j].arg].lock);
}

void jit__weights_release(jit_graph *g, const jit__cpu_impl *im) {
  jit__release_first(g, im, im->n_packed);
}

jit_status jit__weights_acquire(jit_graph *g, const jit__cpu_impl *im, const DLTensor *inputs,
                                void **args) {
  // In argument order (the compile lists them so), which keeps two calls from waiting
  // on each other: a call waits for a copy only holding copies of earlier inputs.
  for (uint32_t j = 0; j < im->n_packed; j++) {
    uint32_t i = im->packed[j].arg, tn = im->packed[j].tn;
    bool tr = im->packed[j].transposed;
    const DLTensor *t = &inputs[i];
    jit__wpack *wp = g->wpacks && i < g->n_inputs ? &g->wpacks[i] : NULL;
    // The record's list was checked when it was loaded (jit__entry_fits: weights, in
    // argument order) and the input against its declaration; the panels must tile it.
    if (!wp || !wp->live || t->shape[tr ? 0 : 1] % tn != 0) {
      jit__release_first(g, im, j);
      return JIT_ERR(JIT_INTERNAL,
                     "jit_run: graph `%s`: its kernel reads input %u as packed panels of "
                     "%u, which that input cannot be (not a weight, or not whole panels)",
                     g->name, i, tn);
    }
    const float *src = (const float *)((const char *)t->data + t->byte_offset);
    for (;;) {
      uint64_t gen = atomic_load_explicit(&g->weights_gen, memory_order_acquire);
      pthread_rwlock_rdlock(&wp->lock);
      if (wp->src == src && wp->gen == gen && wp->tn == tn && wp->tr == tr) break;  // read-held
      pthread_rwlock_unlock(&wp->lock);
      pthread_rwlock_wrlock(&wp->lock);
      jit_status s = NULL;
      if (!(wp->src == src && wp->gen == gen && wp->tn == tn && wp->tr == tr))
        s = jit__pack(g, i, wp, t, src, tn, tr, gen);
      pthread_rwlock_unlock(&wp->lock);
      if (s) {
        jit__release_first(g, im, j);
        return s;
      }
    }
    args[i] = wp->panels;
  }
  return NULL;
}
