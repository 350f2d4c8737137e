//===--- plan.h - the CPU strategy's choices, as data ----------------------===//
//
// Pure functions from op shapes, the host (host.h) and the thread count to plan
// structs holding the choices; script.c writes transform IR from the structs. No MLIR
// here: tests call these directly (tests/test_cpu_plans.c).
//
//===----------------------------------------------------------------------===//
#ifndef JITML_LOWERING_CPU_PLAN_H_
#define JITML_LOWERING_CPU_PLAN_H_

#include <stdbool.h>
#include <stdint.h>

#include "lowering/cpu/host.h"

// Bytes of one packed B block. The block lives in the kernel's stack frame (one per
// thread), not in a heap buffer or a workspace argument: a stack is already mapped and
// touched after the first call on a thread, so every later call reuses the same pages
// without malloc, without first-touch faults (~12 us per 4 KiB page here) and without
// a change to the kernel ABI; each OpenMP thread gets its own copy for free; and the
// size is fixed at compile time. 256 KiB (half of this L2, the usual GotoBLAS share)
// is well inside glibc's 8 MiB thread stacks and libomp's 4 MiB worker stacks.
// compile_cpu.c turns the buffer's heap allocation into that stack allocation.
#define JIT__PACK_BYTES (256 << 10)

// Cache blocks [nc, kc] for a packed thread's tM x tN part of a matmul with register
// width tn (plan_matmul.c says how), or false when the shape does not take the packed
// path. `l2`: the L2 a whole-K block may fill half of (0: not that way).
bool jit__cpu_pack_plan(int64_t tM, int64_t tN, int64_t K, int64_t tn, bool fused, int64_t l2,
                        int64_t *out_nc, int64_t *out_kc);

// Whether a batch of M x K x N reading B through (b, n, k) is planned as dot products
// along k (plan_matmul.c).
bool jit__cpu_batch_dot_rows(const jit__cpu_host *h, int64_t M, int64_t K);

#endif  // JITML_LOWERING_CPU_PLAN_H_
