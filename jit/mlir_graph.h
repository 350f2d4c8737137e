//===--- mlir_graph.h - what a graph from MLIR holds -----------------------===//
//
// A graph from jit_graph_from_mlir keeps its canonical module (lowering/import.h) and
// the output shapes of the bindings it has seen. graph_mlir.c makes it; mlir_graph.c
// binds, compiles and frees it (apart, so that graph.c, which frees graphs, does not
// call into graph_mlir.c, which builds graphs through graph.c).
//
//===----------------------------------------------------------------------===//
#ifndef JITML_JIT_MLIR_GRAPH_H_
#define JITML_JIT_MLIR_GRAPH_H_

#include <pthread.h>

#include "jit/internal.h"
#include "lowering/import.h"

// Bindings whose output shapes are remembered (oldest replaced first).
enum { kBindCacheSize = 32 };

typedef struct jit__bind_entry {
  bool used;
  uint32_t n;           // number of int64 in key
  int64_t *key;         // per input: rank, dims
  jit__oshape *shapes;  // n_results
} jit__bind_entry;

struct jit__mlir_graph {
  jit__mlir_module m;
  pthread_mutex_t mu;  // guards binds
  jit__bind_entry binds[kBindCacheSize];
  uint32_t next_bind;
};

#endif  // JITML_JIT_MLIR_GRAPH_H_
