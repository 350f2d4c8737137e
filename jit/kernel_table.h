//===--- kernel_table.h - loaded kernels by key ----------------------------===//
//
// What a context has compiled or loaded: one jit__kernel per specialization key, in
// an open-addressing table guarded by jit_context.mu. run.c fills it (single flight:
// a kernel is COMPILING until its one compile ends); the context frees it.
//
//===----------------------------------------------------------------------===//
#ifndef JITML_JIT_KERNEL_TABLE_H_
#define JITML_JIT_KERNEL_TABLE_H_

#include "jit/internal.h"

typedef enum jit__kstate {
  JIT__K_COMPILING,
  JIT__K_READY,
  JIT__K_FAILED,
} jit__kstate;

struct jit__kernel {
  uint8_t key[16];
  jit_device *device;           // where it runs
  jit__gpu_exec *gpu;           // GPU devices: the loaded module and plan
  jit__kstate state;            // guarded by ctx->mu; READY and FAILED are final
  jit__cpu_kernel_fn fn;        // set before READY
  uint32_t stack_bytes;         // CPU: stack the kernel needs (jit__artifact.stack_bytes)
  bool threaded;                // CPU: it forks OpenMP workers, which need that stack too
  uint32_t n_outputs;
  jit__oshape *outputs;         // the output shapes of this binding
  jit_status_code fail_code;    // FAILED: the compile's status, replayed to callers
  char *fail_message;
};

// Finds the kernel for `key`; NULL if absent. Caller holds ctx->mu.
jit__kernel *jit__table_find(jit__kernel_table *t, const uint8_t key[16]);
// Inserts `k` (whose key is absent); false when out of memory. Caller holds ctx->mu.
bool jit__table_insert(jit__kernel_table *t, jit__kernel *k);
// Frees one kernel (NULL: nothing) and what it holds.
void jit__kernel_free(jit__kernel *k);
// Frees every kernel (GPU kernels free their device temporaries) and the table.
void jit__kernel_table_free(jit__kernel_table *t);

#endif  // JITML_JIT_KERNEL_TABLE_H_
