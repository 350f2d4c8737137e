//===--- host.h - the host a CPU kernel is planned for ---------------------===//
//
// One description of the machine, made in one place (jit__cpu_host_of) from the
// lowering options, and read by every plan (plan.h) and by the rewrites that ask the
// plans ahead of time (normalize.c). Pure data: no MLIR.
//
//===----------------------------------------------------------------------===//
#ifndef JITML_LOWERING_CPU_HOST_H_
#define JITML_LOWERING_CPU_HOST_H_

#include <stdint.h>

#include "lowering/lower.h"

// The register file decides the register tile: a TM x TN accumulator plus one row of
// B and a broadcast of A must fit. AVX-512: 32 zmm; AVX2: 16 ymm; SSE: 16 xmm.
// Thread-compatible: a value, copied freely.
typedef struct jit__cpu_host {
  int lanes;    // f32 lanes per vector register
  int acc;      // vector registers the accumulator may take
  int tm, tn;   // default register tile
  int ptm, ptn; // register tile of plain f32 matmuls above 16 rows (no epilogue)
  int64_t l1;   // bytes of L1d per core
  int64_t l2;   // bytes of L2 per core
  int64_t l3;   // bytes of L3 shared by the cores; 0 when not known (streaming stores)
  int cores;    // cores a kernel may use (the options' thread count)
} jit__cpu_host;

// The host for `o`: its vector registers from `o->features`, and its L2
// (`o->l2_bytes`, part of every kernel's cache key), or 512 KiB (the Zen 3 machine
// most block sizes here were measured on) when that is not known.
jit__cpu_host jit__cpu_host_of(const jit__lower_options *o);

// The host with LLVM feature list `features` ("+a,-b,+c") and `l2_bytes` of L2
// (0: not known), as jit__cpu_host_of makes it; for tests.
jit__cpu_host jit__cpu_host_make(const char *features, int64_t l2_bytes, int cores);

// A block size for a loop of `n`: a divisor of n near `target`, preferably a multiple
// of `reg`, so that every block has the same static size. 0 means "do not block"
// (n is small, or has no divisor in [target/2, 2 target]).
int64_t jit__cpu_pick_block(int64_t n, int64_t target, int64_t reg);

// Bytes of B from which a small-M matmul (or a batch of them) is split across threads
// (host.c says why).
double jit__cpu_split_b_bytes(jit__cpu_host h);

#endif  // JITML_LOWERING_CPU_HOST_H_
