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
  // GPU devices: the loaded module and plan (read with an acquire load: a binding
  // served by the generic kernel switches once to its own, the old one then kept in
  // gpu_retired until the record is freed, for calls still running it).
  jit__gpu_exec *gpu;
  jit__gpu_exec *gpu_retired;
  jit__gpu_generic *gpu_generic;  // a graph's generic GPU kernel (its record only)
  atomic_bool gpu_on_generic;     // `gpu` was loaded from the generic kernel
  jit__kstate state;            // guarded by ctx->mu; READY and FAILED are final
  // CPU: what runs, &exact or &shared, set before READY; a binding served by the
  // generic kernel switches to &exact once, when its own kernel is ready (release
  // store after `exact` is filled; jit_run loads it with acquire).
  _Atomic(const jit__cpu_impl *) impl;
  jit__cpu_impl exact;          // this key's own code (for a generic key: the generic code)
  jit__cpu_impl shared;         // served by a generic kernel: its code, with `dims`
  int64_t *dims;                // owned storage behind shared.dims
  bool specialize;              // AUTO: specialize after ctx->specialize_after runs
  atomic_uint hits;             // runs through `shared`
  atomic_bool queued;           // asked to be specialized
  // Bounded kernel memory (run.c, jit__evict): calls running it now (taken by the
  // dispatch, dropped by jit__kernel_release), the context's tick at its last use
  // (guarded by ctx->mu), and whether it is never unloaded (a graph's generic kernel).
  atomic_int users;
  uint64_t tick;
  bool pinned;
  uint32_t n_outputs;
  jit__oshape *outputs;         // the output shapes of this binding
  jit_status_code fail_code;    // FAILED: the compile's status, replayed to callers
  char *fail_message;
};

// Finds the kernel for `key`; NULL if absent. Caller holds ctx->mu.
jit__kernel *jit__table_find(jit__kernel_table *t, const uint8_t key[16]);
// Inserts `k` (whose key is absent); false when out of memory. Caller holds ctx->mu.
bool jit__table_insert(jit__kernel_table *t, jit__kernel *k);
// Removes `k` (present) from the table. Caller holds ctx->mu.
void jit__table_remove(jit__kernel_table *t, jit__kernel *k);
// Whether `k` holds unloadable code (its own CPU object or a GPU module).
bool jit__kernel_owns_code(const jit__kernel *k);
// Frees one kernel (NULL: nothing) and what it holds, its CPU code unloaded from `cpu`
// (the context's CPU device).
void jit__kernel_free(jit__kernel *k, jit_device *cpu);
// Frees every kernel (GPU kernels free their device temporaries) and the table.
void jit__kernel_table_free(jit__kernel_table *t, jit_device *cpu);

#endif  // JITML_JIT_KERNEL_TABLE_H_
