//===--- plan_row_choice.c - row loops, elementwise ops, streaming (no MLIR) ===//
//
// The choices for the ops plan_rows.c tiles: row loops (softmax, normalizations),
// elementwise ops and reductions, and whether a kernel's stores stream. plan_rows.c
// reads the facts off the ops and writes each plan as transform IR.
//
//===----------------------------------------------------------------------===//
#include "lowering/cpu/plan.h"

// Rows split across threads from 2^15 elements, when they divide evenly.
jit__cpu_row_plan jit__cpu_plan_row(int64_t d0, int64_t numel, int threads) {
  jit__cpu_row_plan p = {0};
  p.par = threads > 1 && d0 % threads == 0 && numel >= (1 << 15);
  p.rows = p.par ? d0 / threads : d0;
  return p;
}

// One loop is split across the threads (an elementwise op's first that they divide:
// [1, 64, 56, 56] splits its 64, [9, 4096] its 4096 at 2 threads; a reduction's first)
// from 2^16 elements (2^18 for a reduction; see the matmul bound), or when it follows
// a batch split the same way, or the emitter asks (jit_split: Winograd's transforms);
// a reduction on one thread is left as it is (its inner loops stay as they are). The
// inner tile: V lanes of the last dim (4 vector registers), 1 elsewhere.
// relu(a * b + c) at 2 threads, one split against none (medians, with Python's call):
// 2^14 elements 9.9 / 8.4 us, 2^16 15.7 / 14.4, 2^17 20.6 / 85, 2^18 57 / 185, 2^19 176
// / 351; GPT-2's attention at S = 128, whose head transposes and scaling are [12, 128,
// 64] (98 K), 0.44 -> 0.35 ms with 2^16 rather than 2^20 as before.
jit__cpu_ew_plan jit__cpu_plan_elementwise(const jit__cpu_ew_shape *s, const jit__cpu_host *h,
                                           int threads) {
  jit__cpu_ew_plan p = {0};
  int nl = s->nl, T = threads;
  const int64_t *ext = s->ext;
  bool red = s->reduction;
  int64_t numel = 1;
  for (int l = 0; l < nl; l++) numel *= ext[l];
  if (numel < 64 && !red) {  // nothing to gain
    p.skip = true;
    return p;
  }
  // The loop split: a reduction's first; else the first that the threads divide (its
  // first of more than one step where none does: not split).
  int pd = 0;
  while (!red && pd < nl - 1 && ext[pd] == 1) pd++;
  for (int l = pd; !red && T > 1 && l < nl; l++)
    if (ext[l] >= T && ext[l] % T == 0) {
      pd = l;
      break;
    }
  p.pd = pd;
  p.par = T > 1 && nl >= (red ? 2 : 1) && ext[pd] % T == 0 && ext[pd] >= T &&
          (numel >= (red ? (1 << 18) : (1 << 16)) || s->follow_split);
  p.e0 = p.par ? ext[pd] / T : ext[pd];
  if (red) {
    p.skip = !p.par;
    return p;
  }
  int64_t V = 4 * h->lanes;
  int64_t last = pd == nl - 1 ? p.e0 : ext[nl - 1];
  int64_t vl = last > V ? V : 0;
  // An input whose contiguous dim another loop walks (a transpose): tiles of L x L
  // (L = lanes), each read as L rows of L contiguous elements and transposed in
  // registers. With 1 x V tiles every element read came from another cache line, the
  // lines evicted before the next tile used them: a 3072x768 transpose took ~23 ms.
  int tl = s->tl;
  int64_t L = h->lanes;
  for (int l = 0; l < nl; l++) {
    int64_t e = l == pd ? p.e0 : ext[l];
    p.sizes[l] = l == nl - 1 ? vl : (e > 1 ? 1 : 0);
    if (tl >= 0 && (l == tl || l == nl - 1)) p.sizes[l] = e > L ? L : 0;
    p.n_loops += p.sizes[l] != 0;
    // Each loop of vector tiles with a partial last tile is peeled, so every tile is
    // static.
    p.peel[l] = p.sizes[l] > 1 && e % p.sizes[l];
  }
  p.transposes = tl >= 0;
  return p;
}

//===--- Streaming -------------------------------------------------------===//
//
// A kernel that writes large outputs once, without reading them back (elementwise
// chains, softmax and normalization rows), is bound by memory traffic, and a plain
// store first reads each line of the output in: a third of the traffic of y = f(x).
// Its vector stores to the outputs become non-temporal instead (what memcpy does past
// a size). Not when the output would still be in the cache for the next kernel: below
// JIT__STREAM_BYTES of output (a quarter of the Zen 4's 32 MiB L3), or when all the
// kernel reads and writes takes less than a quarter of a larger L3. On this Xeon (480
// MiB of L3, the C library says) streaming made layer_norm 4096x768 (25 MB read and
// written) 12 % slower, 986-999 us against 862-882 at 1 thread, 503-517 against
// 447-457 at 2, and softmax 4096x1024 (32 MB) 14 % slower, while relu(a*b+c) over 16M
// floats (256 MB) stayed 16-19 % faster streamed (14.0 against 16.6-17.0 ms). Never with
// a matmul or a reduction outside a row loop, which read their output back while
// accumulating into it.
// A lone row loop over an input larger than L2 also prefetches the next row while it
// computes this one: the hardware prefetcher stops at the end of the row, and the
// memory would sit idle during the row's exp and sums. softmax 4096x1024, 1 thread, in
// a C model of the kernel: 3.6-4.1 ms before, 2.4-2.7 ms with both (aligned 32-byte
// streaming stores), 2.7-3.7 ms with the 8-byte ones this emits, the output's alignment
// being unknown here; the kernel itself, on a busy machine: 5.9-7.4 ms before, 5.4-6.0
// ms after.

#define JIT__STREAM_BYTES (8 << 20)
#define JIT__PREFETCH_BYTES (1 << 20)

jit__cpu_stream_plan jit__cpu_plan_stream(const jit__cpu_stream_facts *f) {
  jit__cpu_stream_plan p = {0};
  if (f->other) return p;
  int64_t cached = f->l3 / 4 > JIT__STREAM_BYTES ? f->l3 / 4 : JIT__STREAM_BYTES;
  p.stream = f->out_bytes >= JIT__STREAM_BYTES && f->in_bytes + f->out_bytes >= cached;
  if (f->n_row == 1 && f->loose == 0 && f->row_bytes > 0 &&
      f->row_input_bytes >= JIT__PREFETCH_BYTES)
    p.row_prefetch = f->row_bytes;
  return p;
}
