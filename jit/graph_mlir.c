//===--- graph_mlir.c - graphs from and to MLIR text -----------------------===//
//
// Placeholder while the MLIR import is being written (issue 3): every entry point
// reports JIT_UNSUPPORTED.
//
//===----------------------------------------------------------------------===//
#include "jit/internal.h"

void jit__mlir_graph_free(jit__mlir_graph *m) { (void)m; }

jit_status jit__mlir_graph_bind(const jit_graph *g, const DLTensor *inputs,
                                jit__oshape *out_shapes) {
  return JIT_ERR(JIT_UNSUPPORTED, "graph `%s`: MLIR graphs are not supported yet", g->name);
}

jit_status jit__mlir_graph_compile(const jit_graph *g, const DLTensor *inputs,
                                   const char *func_name, const jit__lower_options *lo,
                                   jit__artifact *out) {
  return JIT_ERR(JIT_UNSUPPORTED, "graph `%s`: MLIR graphs are not supported yet", g->name);
}

jit_status jit_graph_from_mlir(jit_context *ctx, const char *text, size_t length,
                               const char *entry_name, jit_graph **out_graph) {
  if (out_graph) *out_graph = NULL;
  return JIT_ERR(JIT_UNSUPPORTED, "jit_graph_from_mlir is not implemented yet");
}

jit_status jit_graph_to_mlir(jit_graph *graph, char **out_text) {
  if (out_text) *out_text = NULL;
  return JIT_ERR(JIT_UNSUPPORTED, "jit_graph_to_mlir is not implemented yet");
}
