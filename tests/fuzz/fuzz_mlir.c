//===--- fuzz_mlir.c - libFuzzer target: MLIR text through the public API ===//
//
// jit_graph_from_mlir on each input, in one context: any outcome but a crash, a hang
// or a leak is fine (a parse error, an unsupported op, a graph). A graph that imports
// is also asked for its MLIR back.
//
//===----------------------------------------------------------------------===//
#include <stdint.h>
#include <stdlib.h>

#include "jitml.h"

static jit_context *g_ctx;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  jit_options o;
  jit_options_init(&o);
  o.cache_dir = "";  // nothing is compiled or stored
  o.mlir_isolation = JIT_ISOLATION_OFF;  // the in-process parser is what is fuzzed
  if (jit_context_create(&o, &g_ctx)) abort();
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  jit_graph *g = NULL;
  jit_status s = jit_graph_from_mlir(g_ctx, (const char *)data, size, NULL, &g);
  if (!s) {
    char *text = NULL;
    jit_status_free(jit_graph_to_mlir(g, &text));
    jit_string_free(text);
  }
  jit_status_free(s);
  jit_graph_destroy(g);
  return 0;
}
