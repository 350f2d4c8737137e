//===--- indices.c - jit_gather's indices checked before a kernel runs -----===//
//
// A gather kernel clamps each index into the table (emit_ops.c), so it never reads
// outside it; an index out of range is still the caller's error, reported here with
// where it is. Indices in host memory are read once per call (a pass over them, next
// to the kernel's pass over the result); device memory is left to the clamp.
//
//===----------------------------------------------------------------------===//
#include <inttypes.h>
#include <stdlib.h>

#include "jit/internal.h"

// The table's rows (its dim `axis`) for this binding: a static size, the value of the
// symbol there (from the first input dim that carries it), or -1 when only a full
// binding could tell (a table computed with an unknown dim).
static int64_t jit__table_rows(const jit_graph *g, const jit__node *table, int axis,
                               const DLTensor *inputs) {
  int64_t d0 = table->dims[axis];
  if (d0 >= 0) return d0;
  if (d0 == JIT__DIM_UNKNOWN) return -1;
  for (uint32_t i = 0; i < g->n_inputs; i++) {
    const jit__node *in = &g->nodes[g->inputs[i]].n;
    for (int d = 0; d < in->rank; d++)
      if (in->dims[d] == d0) return inputs[i].shape[d];
  }
  return -1;
}

jit_status jit__check_indices(const jit_graph *g, const DLTensor *inputs) {
  if (!g->has_gather) return NULL;
  int64_t *symvals = NULL;
  jit__node *shapes = NULL;
  jit_status s = NULL;
  for (uint32_t i = 0; i < g->n_nodes && !s; i++) {
    const jit__node *n = &g->nodes[i].n;
    if (n->op != JIT__OP_GATHER) continue;
    uint32_t k = 0;
    while (k < g->n_inputs && g->inputs[k] != n->operands[1]) k++;
    const DLTensor *t = &inputs[k];
    if (k == g->n_inputs || t->device.device_type != kDLCPU) continue;
    int64_t rows = jit__table_rows(g, &g->nodes[n->operands[0]].n, n->axis, inputs);
    if (rows < 0) {  // rare: bind the whole graph once for this call
      if (!shapes) {
        symvals = malloc(sizeof(int64_t) * (g->n_symbols + 1));
        shapes = malloc(sizeof(jit__node) * (g->n_nodes + 1));
        jit__oshape *os = malloc(sizeof(jit__oshape) * (g->n_outputs + 1));
        s = symvals && shapes && os ? jit__bind(g, inputs, symvals, shapes, os)
                                    : JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
        free(os);
        if (s) break;
      }
      rows = shapes[n->operands[0]].dims[n->axis];
    }
    int64_t count = 1;
    for (int d = 0; d < t->ndim; d++) count *= t->shape[d];
    const char *base = (const char *)t->data + t->byte_offset;
    bool wide = t->dtype.bits == 64;
    for (int64_t j = 0; j < count; j++) {
      int64_t v = wide ? ((const int64_t *)base)[j] : ((const int32_t *)base)[j];
      if (v >= 0 && v < rows) continue;
      s = JIT_ERR(JIT_INVALID_ARGUMENT,
                  "graph `%s`: node %u (gather): index %" PRId64 " (element %" PRId64
                  " of input %u `%s`) is outside the table's rows [0, %" PRId64 ")",
                  g->name, i, v, j, k, g->nodes[g->inputs[k]].name, rows);
      break;
    }
  }
  free(symvals);
  free(shapes);
  return s;
}
