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

// Bytes of B in one k block of a masked narrow-N matmul on AVX2 (plan_masked): most
// of L1d.
#define JIT__MASKED_B_BYTES (24 << 10)

// What plan_matmul reads of a matmul: its shapes and what surrounds it.
typedef struct jit__cpu_mm_shape {
  int64_t M, K, N;       // one matmul's (of a batch: each one's)
  int64_t Bt;            // matmuls in the batch (1: not batched)
  bool batched;          // a linalg.batch_matmul with plain maps
  int64_t whole_n;       // N before an odd-N split ("Odd N", normalize.c), else N
  bool floats;           // f32 or f16 inputs
  bool a_f16, b_f16;     // f16 A, f16 B
  bool epilogue;         // an elementwise consumer its register tiles could run
  bool b_from_transpose; // B is made by a transpose of W (x W^T)
  bool a_made, b_made;   // A, B computed by a linalg.generic
  bool b_weight;         // B is (a slice of) a jit_weight, whose panels may be packed once
} jit__cpu_mm_shape;

// How a matmul is tiled (plan_matmul.c says why each choice is made). Thread-compatible.
typedef struct jit__cpu_mm_plan {
  bool small_m;          // GEMV-like: B streamed once in short k blocks
  bool batch_split;      // a batch divided among the threads by whole matmuls
  int split;             // threads split -1: nothing, 0: M, 1: N
  int64_t tM, tN;        // one thread's part
  int64_t dtm, dtn;      // the default register tile the tile was chosen from
  int64_t tm, tn;        // the register tile
  int64_t mc, nc, kc;    // cache blocks (0: none)
  int64_t em, en;        // the extents the register tiles walk
  bool fused;            // the epilogue runs on each register tile
  bool packed;           // B packed into panels per [kc, nc] block
  int64_t pnc, pkc;      // the packed blocks pack_plan chose
  bool copy_a;           // A's row tiles copied per k block (packed)
  bool b_tr;             // B packed from W directly (B = W^T)
  bool b_in_place;       // packed plan's loops, B read in place (no panels)
  bool narrow_rest;      // the n remainder is not whole vectors: one column at a time
  bool masked;           // one masked register tile per row block (narrow odd N)
  int64_t mv, mtm;       // masked: vector width and rows of the tile
  bool unroll_k;         // the k loops are worth unrolling
} jit__cpu_mm_plan;

// The plan for matmul `s` on host `h` with `threads` threads. Pure.
jit__cpu_mm_plan jit__cpu_plan_matmul(const jit__cpu_mm_shape *s, const jit__cpu_host *h,
                                      int threads);

//===--- Batches and x W^T (plan_batch.c) --------------------------------===//

// Whether a batch of Bt matmuls M x K x N is split across `threads` threads, whole
// matmuls per thread (plan_batch.c says when). Pure.
bool jit__cpu_batch_split(const jit__cpu_host *h, int threads, int64_t Bt, int64_t M,
                          int64_t K, int64_t N);

// A batch of vector x matrix products (batch_matmul with M = 1). Thread-compatible.
typedef struct jit__cpu_vecmat_plan {
  bool split;    // threads split the batch
  int64_t tn;    // n tile (up to 8 vectors)
  int64_t kb;    // k block (0: none)
  bool peel_k;   // the k blocks' last one is partial: peeled
  bool peel_n;   // the n tiles' last one is partial: peeled
} jit__cpu_vecmat_plan;

// The plan for a batch of Bt products 1 x K x N on host `h` with `threads`. Pure.
jit__cpu_vecmat_plan jit__cpu_plan_vecmat(int64_t Bt, int64_t K, int64_t N,
                                          const jit__cpu_host *h, int threads);

// Register tiles of a matmul as dot products along k, or of x W^T by in-register
// transposes, and how threads split it. Thread-compatible.
typedef struct jit__cpu_dot_plan {
  bool dot;            // dot products along k (else: in-register transposes, x W^T only)
  bool split;          // threads split the batch (batched) or N (x W^T)
  int64_t tN;          // one thread's columns (x W^T; else N)
  int64_t tm, tn;      // the register tile
  int64_t L;           // the k step: one vector's lanes
  bool tile_m, tile_n; // the register tiles loop over m, n
  bool peel_m, peel_n; // that loop's last tile is partial: peeled
  bool unroll_k;       // 2^24 multiply-adds or more (x W^T)
} jit__cpu_dot_plan;

// A batch of Bt x W^T products M x K x N (jit__cpu_batch_dot_rows holds). Pure.
jit__cpu_dot_plan jit__cpu_plan_batch_dot(int64_t Bt, int64_t M, int64_t K, int64_t N,
                                          const jit__cpu_host *h, int threads);

// x W^T (W stored N x K), M x K x N. Pure.
jit__cpu_dot_plan jit__cpu_plan_matmul_bt(int64_t M, int64_t K, int64_t N,
                                          const jit__cpu_host *h, int threads);

//===--- Row loops, elementwise ops and streaming (plan_row_choice.c) ----===//

// A row loop (softmax, a normalization) over a result of `numel` elements whose first
// dim is `d0`. Thread-compatible.
typedef struct jit__cpu_row_plan {
  bool par;      // rows split across the threads (producers fused into the forall)
  int64_t rows;  // one thread's rows when `par`
} jit__cpu_row_plan;

// The plan for that row loop with `threads` threads. Pure.
jit__cpu_row_plan jit__cpu_plan_row(int64_t d0, int64_t numel, int threads);

// Loops of an elementwise op or a reduction, as plan_rows.c reads them off the op.
typedef struct jit__cpu_ew_shape {
  int nl;                           // loops
  int64_t ext[JIT_MAX_RANK + 2];    // their extents
  bool reduction;                   // one reduction, over the last loop
  int tl;                           // the loop walking an input's contiguous dim when
                                    // that is not the last (a transposed read), or -1
  bool follow_split;                // split like the batch before it (walk's ew_split)
} jit__cpu_ew_shape;

// How it is tiled. Thread-compatible.
typedef struct jit__cpu_ew_plan {
  bool skip;                        // left as it is
  bool par;                         // loop pd split across the threads
  int pd;                           // the loop split: the first of more than one step
  int64_t e0;                       // one thread's share of loop pd
  int n_loops;                      // loops tiled below (0: none)
  int64_t sizes[JIT_MAX_RANK + 2];  // the inner tile per loop (0: not tiled)
  bool peel[JIT_MAX_RANK + 2];      // that loop's last tile is partial: peeled
  bool transposes;                  // tiled for a transposed read
} jit__cpu_ew_plan;

// The plan for op `s` on host `h` with `threads` threads. Pure.
jit__cpu_ew_plan jit__cpu_plan_elementwise(const jit__cpu_ew_shape *s, const jit__cpu_host *h,
                                           int threads);

// What the streaming plan reads of a module: the walk's findings (plan_rows.c).
typedef struct jit__cpu_stream_facts {
  bool other;               // an op that reads its output back, or that is not known
  int loose;                // generics outside the row loop
  int64_t out_bytes;        // bytes of all outputs
  int64_t in_bytes;         // bytes of all inputs
  int64_t l3;               // the host's L3; 0 when not known
  int n_row;                // row loops
  int64_t row_bytes;        // the last row loop's row
  int64_t row_input_bytes;  // the last row loop's whole input
} jit__cpu_stream_facts;

// Non-temporal stores, and the prefetched row (0: none). Thread-compatible.
typedef struct jit__cpu_stream_plan {
  bool stream;
  int64_t row_prefetch;
} jit__cpu_stream_plan;

// The streaming plan of an x86 module without matmuls. Pure.
jit__cpu_stream_plan jit__cpu_plan_stream(const jit__cpu_stream_facts *f);

//===--- Generic kernels (generic.c) -------------------------------------===//

// How a matmul with `?` dims is tiled in a generic kernel (generic.c says how the
// pieces fit). M, K, N: sizes, or -1 for `?`. Thread-compatible.
typedef struct jit__cpu_generic_mm_plan {
  int64_t mc;      // rows per cache block (0: none; only where M is `?`)
  int64_t kc;      // k per cache block (0: none)
  int64_t tm, tn;  // the register tile
  int64_t lanes;   // f32 lanes of one vector register
  int64_t M, K, N; // the matmul's sizes (-1: `?`)
  bool peel_n;     // the n loop's last tile can be partial: peeled (one masked tile)
  bool halve_rows; // the rows after the whole m tiles go in halving tiles, else by one
  bool pack;       // B's panel of each column piece packed (f32; static N)
  bool peel_k;     // K is `?`: its k blocks are peeled, the whole ones packed, the last
                   // one not
  int threads;     // threads splitting the work (scf.forall; 1: none)
  bool split_n;    // they split the columns (N), else the rows
} jit__cpu_generic_mm_plan;

// The plan for an M x K x N matmul of a generic kernel on host `h` with `threads`
// threads, on the kernel's path for few rows or many (generic.c), with f32 operands
// or not (B is packed on the path for many rows, f32 only), under a fused epilogue or
// not (then no k blocks). Pure.
jit__cpu_generic_mm_plan jit__cpu_plan_generic_mm(int64_t M, int64_t K, int64_t N,
                                                  const jit__cpu_host *h, int threads,
                                                  bool few_rows, bool f32, bool fused);

#endif  // JITML_LOWERING_CPU_PLAN_H_
