//===--- op.c - the custom-op ABI (include/jitml_op.h) ---------------------===//
//
// A thin layer over the public API: an op is a named, owned graph; a call turns the
// borrowed DLManagedTensors into DLTensor views and runs jit_run_alloc / jit_run. The
// only internal header used is base/status.h, to make statuses.
//
// Output dtypes come from jit_output_dtype, output shapes from jit_output_shape: the
// shape function compiles nothing.
//
//===----------------------------------------------------------------------===//
#include "jitml_op.h"

#include <stdlib.h>
#include <string.h>

#include "base/status.h"

struct jit_op {
  jit_graph *graph;
  char *name;
  int n_inputs, n_outputs;
};

static int jit__op_name_ok(const char *name) {
  if (!name[0]) return 0;
  for (const char *p = name; *p; p++) {
    char c = *p;
    int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
             c == '_' || c == '.';
    if (!ok) return 0;
  }
  return 1;
}

jit_status jit_op_create(jit_graph *graph, const char *name, jit_op **out_op) {
  if (out_op) *out_op = NULL;
  if (!graph || !name || !out_op)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_op_create: %s is NULL",
                   !graph ? "graph" : !name ? "name" : "out_op");
  if (!jit__op_name_ok(name))
    return JIT_ERR(JIT_INVALID_ARGUMENT,
                   "jit_op_create: op name \"%s\" is empty or has a character other than "
                   "letters, digits, '_' and '.'",
                   name);
  JIT_RETURN_IF_ERROR(jit_graph_finalize(graph), "jit_op_create: op `%s`", name);
  jit_op *op = calloc(1, sizeof(*op));
  if (!op) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "jit_op_create: out of memory");
  op->graph = graph;
  op->n_inputs = jit_graph_num_inputs(graph);
  op->n_outputs = jit_graph_num_outputs(graph);
  size_t len = strlen(name);
  op->name = malloc(len + 1);
  if (!op->name) {
    free(op);
    return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "jit_op_create: out of memory");
  }
  memcpy(op->name, name, len + 1);
  *out_op = op;
  return NULL;
}

void jit_op_destroy(jit_op *op) {
  if (!op) return;
  jit_graph_destroy(op->graph);
  free(op->name);
  free(op);
}

const char *jit_op_name(const jit_op *op) { return op ? op->name : ""; }
jit_graph *jit_op_graph(const jit_op *op) { return op ? op->graph : NULL; }
int jit_op_num_inputs(const jit_op *op) { return op ? op->n_inputs : 0; }
int jit_op_num_outputs(const jit_op *op) { return op ? op->n_outputs : 0; }

// Copies the DLTensors of `inputs` into a new array (freed by the caller) after
// checking the counts and pointers.
static jit_status jit__op_views(const jit_op *op, const char *fn,
                                DLManagedTensor *const *inputs, int n_inputs,
                                DLTensor **out_views) {
  *out_views = NULL;
  if (n_inputs != op->n_inputs)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "%s: op `%s` takes %d inputs, got %d", fn,
                   op->name, op->n_inputs, n_inputs);
  if (n_inputs > 0 && !inputs)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "%s: op `%s`: inputs is NULL", fn, op->name);
  DLTensor *views = calloc((size_t)n_inputs + 1, sizeof(DLTensor));
  if (!views) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
  for (int i = 0; i < n_inputs; i++) {
    if (!inputs[i]) {
      free(views);
      return JIT_ERR(JIT_INVALID_ARGUMENT, "%s: op `%s`: input %d is NULL", fn, op->name,
                     i);
    }
    views[i] = inputs[i]->dl_tensor;
  }
  *out_views = views;
  return NULL;
}

static jit_status jit__op_check_outputs(const jit_op *op, const char *fn, const void *outs,
                                        int n_outputs, uint32_t flags) {
  if (flags != JIT_OP_FLAGS_NONE)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "%s: op `%s`: unknown flags 0x%x", fn, op->name,
                   (unsigned)flags);
  if (!outs)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "%s: op `%s`: outputs is NULL", fn, op->name);
  if (n_outputs != op->n_outputs)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "%s: op `%s` has %d outputs, got %d", fn,
                   op->name, op->n_outputs, n_outputs);
  return NULL;
}

jit_status jit_op_output_shapes(jit_op *op, DLManagedTensor *const *inputs, int n_inputs,
                                jit_op_output_info *out_info, int n_outputs) {
  if (!op) return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_op_output_shapes: op is NULL");
  if (!out_info)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_op_output_shapes: op `%s`: out_info is NULL",
                   op->name);
  for (int j = 0; j < n_outputs; j++) memset(&out_info[j], 0, sizeof(out_info[j]));
  if (n_outputs != op->n_outputs)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_op_output_shapes: op `%s` has %d outputs, "
                   "got %d", op->name, op->n_outputs, n_outputs);
  DLTensor *views = NULL;
  JIT_PROPAGATE(jit__op_views(op, "jit_op_output_shapes", inputs, n_inputs, &views));
  jit_status s = NULL;
  for (int j = 0; j < n_outputs && !s; j++) {
    s = jit_output_shape(op->graph, views, n_inputs, j, &out_info[j].rank,
                         out_info[j].dims);
    if (!s) s = jit_output_dtype(op->graph, j, &out_info[j].dtype);
  }
  free(views);
  if (s) {
    for (int j = 0; j < n_outputs; j++) memset(&out_info[j], 0, sizeof(out_info[j]));
    return jit__status_annotate(s, "op `%s`", op->name);
  }
  return NULL;
}

jit_status jit_op_call(jit_op *op, DLManagedTensor *const *inputs, int n_inputs,
                       DLManagedTensor **out_outputs, int n_outputs, uint32_t flags) {
  if (out_outputs)
    for (int j = 0; j < n_outputs; j++) out_outputs[j] = NULL;
  if (!op) return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_op_call: op is NULL");
  JIT_PROPAGATE(jit__op_check_outputs(op, "jit_op_call", out_outputs, n_outputs, flags));
  DLTensor *views = NULL;
  JIT_PROPAGATE(jit__op_views(op, "jit_op_call", inputs, n_inputs, &views));
  jit_status s = jit_run_alloc(op->graph, views, n_inputs, out_outputs, n_outputs);
  free(views);
  if (s) return jit__status_annotate(s, "op `%s`", op->name);
  return NULL;
}

jit_status jit_op_call_into(jit_op *op, DLManagedTensor *const *inputs, int n_inputs,
                            DLManagedTensor *const *outputs, int n_outputs,
                            uint32_t flags) {
  if (!op) return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_op_call_into: op is NULL");
  JIT_PROPAGATE(jit__op_check_outputs(op, "jit_op_call_into", outputs, n_outputs, flags));
  DLTensor *views = NULL;
  JIT_PROPAGATE(jit__op_views(op, "jit_op_call_into", inputs, n_inputs, &views));
  DLTensor *oviews = calloc((size_t)n_outputs + 1, sizeof(DLTensor));
  jit_status s = NULL;
  if (!oviews) s = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "jit_op_call_into: out of memory");
  for (int j = 0; j < n_outputs && !s; j++) {
    if (!outputs[j])
      s = JIT_ERR(JIT_INVALID_ARGUMENT, "jit_op_call_into: output %d is NULL", j);
    else
      oviews[j] = outputs[j]->dl_tensor;
  }
  if (!s) s = jit_run(op->graph, views, n_inputs, oviews, n_outputs);
  free(views);
  free(oviews);
  if (s) return jit__status_annotate(s, "op `%s`", op->name);
  return NULL;
}
