//===--- mlir_graph.c - binding, compiling and freeing graphs from MLIR ----===//
//
// Output shapes of a binding come from specializing the module (an MLIR context, a
// few ms), so they are remembered per binding in the graph.
//
//===----------------------------------------------------------------------===//
#include "jit/mlir_graph.h"

#include <stdlib.h>
#include <string.h>

void jit__mlir_graph_free(jit__mlir_graph *mg) {
  if (!mg) return;
  jit__mlir_module_release(&mg->m);
  for (int i = 0; i < kBindCacheSize; i++) {
    free(mg->binds[i].key);
    free(mg->binds[i].shapes);
  }
  pthread_mutex_destroy(&mg->mu);
  free(mg);
}

// The concrete argument shapes of `inputs` as nodes, for lowering/.
static jit__node *jit__arg_nodes(const jit_graph *g, const DLTensor *inputs) {
  jit__node *args = calloc(g->n_inputs + 1, sizeof(*args));
  if (!args) return NULL;
  for (uint32_t i = 0; i < g->n_inputs; i++) {
    args[i] = g->nodes[g->inputs[i]].n;
    args[i].rank = inputs[i].ndim;
    for (int d = 0; d < inputs[i].ndim; d++) args[i].dims[d] = inputs[i].shape[d];
  }
  return args;
}

// The bind-cache key of `inputs`: per input, rank then dims (malloc'ed, *n int64s).
static int64_t *jit__bind_key(const jit_graph *g, const DLTensor *inputs, uint32_t *n_out) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < g->n_inputs; i++) n += 1 + (uint32_t)inputs[i].ndim;
  int64_t *key = malloc(sizeof(int64_t) * (n + 1));
  if (!key) return NULL;
  n = 0;
  for (uint32_t i = 0; i < g->n_inputs; i++) {
    key[n++] = inputs[i].ndim;
    for (int d = 0; d < inputs[i].ndim; d++) key[n++] = inputs[i].shape[d];
  }
  *n_out = n;
  return key;
}

// Converts result nodes to output shapes and remembers them for `inputs` (best effort).
static void jit__bind_remember(const jit_graph *g, const DLTensor *inputs,
                               const jit__node *res, jit__oshape *out_shapes) {
  jit__mlir_graph *mg = g->mlir;
  for (uint32_t j = 0; j < g->n_outputs; j++) {
    out_shapes[j].rank = res[j].rank;
    memset(out_shapes[j].dims, 0, sizeof(out_shapes[j].dims));
    memcpy(out_shapes[j].dims, res[j].dims, sizeof(int64_t) * (size_t)res[j].rank);
    out_shapes[j].dtype = res[j].dtype;
  }
  uint32_t n;
  int64_t *key = jit__bind_key(g, inputs, &n);
  jit__oshape *copy = malloc(sizeof(jit__oshape) * (g->n_outputs + 1));
  if (key && copy) {
    memcpy(copy, out_shapes, sizeof(jit__oshape) * g->n_outputs);
    pthread_mutex_lock(&mg->mu);
    jit__bind_entry *e = &mg->binds[mg->next_bind++ % kBindCacheSize];
    free(e->key);
    free(e->shapes);
    *e = (jit__bind_entry){true, n, key, copy};
    pthread_mutex_unlock(&mg->mu);
  } else {
    free(key);
    free(copy);
  }
}

jit_status jit__mlir_graph_bind(const jit_graph *g, const DLTensor *inputs,
                                jit__oshape *out_shapes) {
  jit__mlir_graph *mg = g->mlir;
  uint32_t n;
  int64_t *key = jit__bind_key(g, inputs, &n);
  if (!key) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "graph `%s`: out of memory", g->name);
  pthread_mutex_lock(&mg->mu);
  for (int i = 0; i < kBindCacheSize; i++) {
    jit__bind_entry *e = &mg->binds[i];
    if (e->used && e->n == n && !memcmp(e->key, key, sizeof(int64_t) * n)) {
      memcpy(out_shapes, e->shapes, sizeof(jit__oshape) * g->n_outputs);
      pthread_mutex_unlock(&mg->mu);
      free(key);
      return NULL;
    }
  }
  pthread_mutex_unlock(&mg->mu);

  jit__node *args = jit__arg_nodes(g, inputs);
  jit__node *res = calloc(g->n_outputs + 1, sizeof(*res));
  jit_status s = NULL;
  if (!args || !res)
    s = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "graph `%s`: out of memory", g->name);
  else
    s = jit__mlir_result_shapes(&mg->m, args, res);
  if (!s) {
    jit__bind_remember(g, inputs, res, out_shapes);
  } else {
    s = jit__status_annotate(s, "graph `%s`", g->name);
  }
  free(key);
  free(args);
  free(res);
  return s;
}

jit_status jit__mlir_graph_compile(const jit_graph *g, const DLTensor *inputs,
                                   const char *func_name, const jit__lower_options *lo,
                                   jit__artifact *out, jit__oshape *out_shapes) {
  jit__node *args = jit__arg_nodes(g, inputs);
  jit__node *res = calloc(g->n_outputs + 1, sizeof(*res));
  jit_status s = NULL;
  if (!args || !res)
    s = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "graph `%s`: out of memory", g->name);
  else
    s = jit__mlir_compile_cpu(&g->mlir->m, args, func_name, lo, out, res);
  if (!s) jit__bind_remember(g, inputs, res, out_shapes);
  free(args);
  free(res);
  if (s) s = jit__status_annotate(s, "graph `%s`", g->name);
  return s;
}

jit__dtype jit__mlir_graph_result_dtype(const jit_graph *g, uint32_t index) {
  return g->mlir->m.result_dtypes[index];
}

void jit__mlir_graph_result_info(const jit_graph *g, uint32_t index, jit_output_info *out) {
  const jit__mlir_module *m = &g->mlir->m;
  out->dtype = jit__dtype_dl(m->result_dtypes[index]);
  out->rank = m->result_types[index].rank;
  for (int d = 0; d < out->rank; d++)
    out->dims[d] = m->result_types[index].dims[d] < 0 ? JIT_DIM_UNKNOWN
                                                      : m->result_types[index].dims[d];
}
