//===--- plan_matmul.c - choosing how a matmul is tiled (no MLIR) --------===//
#include "lowering/cpu/plan.h"


//===--- Packed B (large matmuls) ----------------------------------------===//


// Cache blocks for the packed path, or false when the shape does not take it: nc the
// widest divisor of tN up to `most` that is a multiple of the register width tn (so no
// panel is partial); kc = K when a K x nc block fits JIT__PACK_BYTES, else the largest
// multiple of 8 dividing K, at least `least`, that does.
// With `whole_k` (a fused epilogue, which needs the finished sum in the register tile),
// kc = K always and nc is the widest that lets a K x nc block fit.
static bool pack_blocks(int64_t tN, int64_t K, int64_t tn, bool whole_k, int64_t most,
                        int64_t least, int64_t bytes, int64_t *out_nc, int64_t *out_kc) {
  int64_t nc = 0;
  if (whole_k && most > bytes / 4 / K) most = bytes / 4 / K;
  for (int64_t d = tN < most ? tN : most; d >= 2 * tn && !nc; d--)
    if (d % tn == 0 && tN % d == 0) nc = d;
  if (!nc) return false;
  int64_t budget = bytes / 4 / nc, kc = 0;
  if (K <= budget) {
    kc = K;
  } else if (!whole_k) {
    for (int64_t d = budget - budget % 8; d >= least && !kc; d -= 8)
      if (K % d == 0) kc = d;
  }
  if (!kc) return false;
  *out_nc = nc;
  *out_kc = kc;
  return true;
}

// Blocks for a thread's tM x tN part: kc = K (no k blocks) when there is an epilogue,
// or when the thread's rows of A fit in half of L2 beside the B block, since a narrower
// n block then costs no extra pass over A from memory (64x768x3072: ~10 % faster at 1
// and 2 threads than nc = kc = 256, and ~10-30 ms less to compile); else k blocks.
// With few rows (tM <= 256) each B block serves few register tiles, so packing it is
// a large share of the time: the n block is then all of the thread's N (up to 1024
// columns) with a shorter kc, if kc stays >= 64. The packing then reads whole rows of
// B, and A is copied once instead of once per n block. 128x3072x768 (nc 768, kc 64
// instead of 256 and 256): 0.89x instead of 0.68x OpenBLAS at 1 thread, 0.93x instead
// of 0.82x at 2 (nc 384, kc 128; medians of 4-5 interleaved runs). With many rows it
// loses: 512^3 at nc 512, kc 128 took 4.9 ms against 3.6.
// Where half of `l2` is more than JIT__PACK_BYTES (AVX-512 hosts with 2 MiB of L2, as
// the Xeon; l2 is 0 otherwise), kc = K too with a B block of up to half of L2 (nc up to 256, at least two
// panels): C is then written once, its fill fused into the register tiles, and no k
// loop re-reads the tiles' sums. Against nc = kc = 256, interleaved: 512^3 1.22-1.24 ms
// against 1.31-1.38 (2 threads 0.68-0.70 against 0.71-0.75), 1024^3 10.4-10.8 ms
// against 11.5 (2 threads 5.4-5.6 against 5.6-5.8), 768^3 4.4-4.6 against 4.8-4.9,
// 1024x512x512 2.67-2.73 against 2.97, 512x512x1024 2.87-2.98 against 3.16-3.23,
// 263x520x512 654 us against 681-724, 512x320x512 at 2 threads 413 against 445-610;
// 320x512x512 the same. Not with fewer than 128 rows a thread, whose B block serves
// too few register tiles (67x1000x256 195-210 us against 184-186, 37x1001x512 344
// against 307-314, 20x1002x1024 570 against 512-533). The block is then too large for the stack (JIT__STACK_BYTES):
// it is a heap block, which the CPU runtime keeps for the thread's next call.
bool jit__cpu_pack_plan(int64_t tM, int64_t tN, int64_t K, int64_t tn, bool fused, int64_t l2,
                      int64_t *out_nc, int64_t *out_kc) {
  if ((fused || tM * K * 4 <= JIT__PACK_BYTES) &&
      pack_blocks(tN, K, tn, true, 256, 0, JIT__PACK_BYTES, out_nc, out_kc))
    return true;
  if (fused) return false;
  if (l2 / 2 > JIT__PACK_BYTES && tM >= 128 &&
      pack_blocks(tN, K, tn, true, 256, 0, l2 / 2, out_nc, out_kc))
    return true;
  if (tM <= 256 && tN <= 1024 &&
      pack_blocks(tN, K, tn, false, tN, 64, JIT__PACK_BYTES, out_nc, out_kc) &&
      *out_nc == tN)
    return true;
  return pack_blocks(tN, K, tn, false, 256, 32, JIT__PACK_BYTES, out_nc, out_kc);
}


// Whether a batch of M x K x N reading B through (b, n, k) is planned as dot products
// along k (plan_batch_dot): few rows, or a long K with up to 48 rows. Otherwise K is
// transposed first (jit__cpu_normalize, either way). Dot products against the
// transpose, 1 thread (2): 12x4x64x1024 113 us against 362, 12x8x256x512 292 (156)
// against 859 (439), 12x32x256x128 196 (92) against 283 (96), 12x48x256x256 628 (297)
// against 748 (369), 12x48x256x128 308 (143) against 336 (126), 12x64x256x128 413
// (192) against 404 (158), 12x128x256x128 892 against 714; 12x128x64x128 (short K)
// unplanned loops 649 us, transposed 133.
bool jit__cpu_batch_dot_rows(const jit__cpu_host *h, int64_t M, int64_t K) {
  return K % h->lanes == 0 && (M <= 4 || (K >= 16 * h->lanes && M <= 48));
}

//===--- Matmul ----------------------------------------------------------===//

// Which register tile: the default one (with `plain`, the host's plain tile), fewer
// rows and as many columns as the registers allow for small M.
static void mm_tile(const jit__cpu_mm_shape *s, const jit__cpu_host *h, bool plain,
                    jit__cpu_mm_plan *p) {
  int64_t M = s->M, N = s->N;
  p->dtm = plain ? h->ptm : h->tm;
  p->dtn = plain ? h->ptn : h->tn;  // the default tile
  int64_t tm = p->dtm, tn = p->dtn;
  if (M < tm) {
    tm = M;
    int64_t vecs = h->acc / tm;
    if (vecs > 8) vecs = 8;
    // A power of two of vectors: LLVM widens a row of 3 or 6 to 4 or 8 and the
    // accumulator spills. 4x768x3072 (6 vectors a row on AVX-512) took 6.2 ms and
    // 7x768x3072 (3) 12 ms, against 0.5 ms for 5 and 6 rows; on AVX2 2 and 4 rows.
    while (vecs & (vecs - 1)) vecs &= vecs - 1;
    tn = vecs * h->lanes;
  }
  if (tn > N) tn = N;
  if (tm > M) tm = M;
  p->tm = tm;
  p->tn = tn;
}

// Which dim the T threads split (-1: none, 0: M, 1: N) with the tile in `p`; the
// packed blocks of a split N in *pnc, *pkc.
static int mm_split(const jit__cpu_mm_shape *s, const jit__cpu_host *h, int T, bool can_pack,
                    bool big, bool fused, const jit__cpu_mm_plan *p, int64_t *pnc,
                    int64_t *pkc) {
  int64_t M = s->M, K = s->K, N = s->N, tm = p->tm, tn = p->tn;
  int split = -1;
  // The L2 that jit__cpu_pack_plan may fill half of with a whole-K block: measured on AVX-512
  // only (the AVX2 tiles' blocks were chosen on a 512 KiB L2).
  int64_t big_l2 = h->lanes == 16 ? h->l2 : 0;
  if (can_pack && T > 1 && big) {
    // Packed: splitting N gives each thread its own half of B to pack and read once;
    // splitting M has both threads pack all of B. So N, unless A (M x K) is the
    // larger operand or N does not split into whole blocks. When M = N, a plain matmul
    // with 256 rows a thread or more is split over M: packing all of B is then a small
    // share of a thread's work, and A's copies are split instead (2 threads, two
    // compiles interleaved in one process: 512^3, 768^3, 1024^3 and 1024x512x1024 2-7 %
    // faster; 256^3 3 % slower). Not for M < N (512x768x3072: the same; 128x3072x768
    // 10 % slower) nor with an epilogue (gelu(xW+b) 512x768x3072 8 % slower).
    // Where all of B fits in under half of L2 (2 MiB on the Xeon, against Zen 3's 512
    // KiB), a plain matmul with 64 rows a thread or more splits M as well: there,
    // against split N, 256^3 24-45 % faster, 320^3 18 %, 384^3 22 %, 192x256x512 15 %,
    // 256x256x512 12 %, 256x512x256 7 % (64x768x3072, 9 MiB of B: 23 % slower; with
    // an epilogue 256^3 3 % slower, so not there either).
    bool n_ok = N % T == 0 && jit__cpu_pack_plan(M, N / T, K, tn, fused, big_l2, pnc, pkc);
    bool m_ok = M % T == 0 && M / T >= 3 * tm;
    bool b_fits = K * N * 4 < h->l2 / 2 && !fused && M / T >= 64;
    bool prefer_m = M > N || (M == N && !fused && M / T >= 256) || b_fits;
    if (n_ok && (!prefer_m || !m_ok)) split = 1;
    else if (m_ok) split = 0;
  }
  // Small M (B read in place) splits N first, so that each thread reads its half of B:
  // split M, 64x768x3072 at 2 threads took 1.08-1.21x as long as packed B split N.
  if (split < 0 && T > 1 && big) {
    if (M % T == 0 && M / T >= 4 * tm && !p->small_m) split = 0;
    else if (N % T == 0 && N / T >= tn) split = 1;
    else if (M % T == 0 && M / T >= tm) split = 0;
  }
  return split;
}

// The register tile, the threads' split and whether B is packed, for one choice of
// `plain` and `fused` (jit__cpu_plan_matmul changes them while the result does not
// stand).
static void mm_tile_split_pack(const jit__cpu_mm_shape *s, const jit__cpu_host *h, int T,
                               bool plain, bool fused, jit__cpu_mm_plan *p) {
  int64_t M = s->M, K = s->K, N = s->N;
  mm_tile(s, h, plain, p);
  // Threads: split M, or N when M is too small to give each thread whole tiles.
  p->tM = M;
  p->tN = N;  // extent of one thread's part
  // Only ops worth a few hundred microseconds are split: a fork/join on a busy machine
  // (the other core taken) can cost a scheduler tick, ~8 ms, which swamped kernels of
  // 1-10 MFLOP (the MLP example at N = 7 and 64) when the bound was 2^20.
  // Packed B (plan_packed) for f32 matmuls with the default register tile, fused or
  // not: gelu(xW+b) 256x768x3072 unpacked ran at ~40 GFLOP/s (each register tile
  // walking down B's columns 12 KiB apart), packed at ~70 on the same loaded machine.
  bool can_pack = !p->small_m && p->tm == p->dtm && p->tn == p->dtn && s->floats;
  // Small M is bound by streaming B once, so it is split (over N) by the bytes of B
  // rather than by multiply-adds: at 1x768x3072 (9 MiB of B, ~0.25 ms) the second
  // core's share of memory bandwidth pays for the fork/join, while the MLP example's
  // 7x784x256 (0.8 MiB) stays on one thread.
  // Part of a matmul split at its odd N ("Odd N"): the parts are split across threads
  // as the whole would be (210x600x160 at 2 threads, a 128 and a 32 column part:
  // 281 us on one thread, 150 split).
  bool big = (double)M * s->whole_n * K >= (double)(1 << 24) ||
             (p->small_m && (double)K * N * 4 >= jit__cpu_split_b_bytes(*h));
  int64_t big_l2 = h->lanes == 16 ? h->l2 : 0;
  p->pnc = p->pkc = 0;
  p->split = mm_split(s, h, T, can_pack, big, fused, p, &p->pnc, &p->pkc);
  if (p->split == 0) p->tM = M / T;
  if (p->split == 1) p->tN = N / T;
  // Pack when B takes half of L2 or more and enough row tiles reuse it. At exactly 256
  // KiB (256^3) B fits in L2, but a register tile walking down its columns 1 KiB apart
  // uses a few L1 sets only: packed, ~8 % faster at 1 thread. The bound is on all of
  // B, not a thread's part: the columns are as far apart in a half (256^3 at 2 threads,
  // split N: 195-215 us packed vs 260-290 us), and packing costs each thread in
  // proportion to its part. Smaller Bs (160x256x128, 192^3) gained nothing and took
  // ~14 ms more to compile.
  p->packed = can_pack && K * N * 4 >= (256 << 10) && p->tM >= 3 * p->tm &&
              jit__cpu_pack_plan(p->tM, p->tN, K, p->tn, fused, big_l2, &p->pnc, &p->pkc);
}

// Cache blocks, and the register tile that leaves the narrowest remainder.
static void mm_blocks(const jit__cpu_mm_shape *s, const jit__cpu_host *h, jit__cpu_mm_plan *p) {
  int64_t M = s->M, K = s->K, N = s->N, tM = p->tM, tN = p->tN;
  int64_t tm = p->tm, tn = p->tn;
  bool fused = p->fused;
  // Cache blocks: a kc x nc block of B (256 KiB) in L2; mc rows of A per pass.
  // Row blocks only serve the n blocks around them: without n blocks they would only
  // add a peeled remainder per block (200x300x300: mc 50 = 8 x 6 + 2; ~5 % slower).
  int64_t mc = jit__cpu_pick_block(tM, 64, tm);
  int64_t nc = jit__cpu_pick_block(tN, fused ? 128 : 256, tn);
  if (!nc) mc = 0;
  // No k blocks when all of B fits in L2 anyway (a narrow or small B).
  int64_t kc = fused || K * N * 4 <= (256 << 10) ? 0 : jit__cpu_pick_block(K, 256, 1);
  if (p->small_m) {
    mc = nc = 0;
    // k blocks of ~8 rows: as many concurrent streams of B as the prefetcher follows
    // well. At 16 rows, 1x768x3072 took 172-199 us vs 152-156 (8 rows), 8x768x3072
    // 680 vs 520 us; 4 and 12 rows were no better than 8 (measured on the Zen 3 VM
    // with AVX2 code). With AVX-512 code on a Zen 4, from 2 rows of A, 16 rows of B:
    // each k block loads and stores the register tiles' sums, M rows of C whose lines
    // 12-16 KiB apart share L1 sets, and 16 halve those passes (one thread, medians of
    // 31 interleaved: 2x768x3072 1.04x, 3x 1.13x, 5x 1.11x, 8x 1.09x, 12x 1.03x,
    // 16x768x3072 1.24x, 16x1024x4096 1.48x; at 2 threads 8x768x3072 1.04x,
    // 16x768x3072 1.15x; 1x768x3072 the same, 32 no better than 16). Not measured
    // on an Intel AVX-512 host. Over 32 rows (AVX-512 only, jit__cpu_plan_matmul), k
    // blocks of ~48 rows: each block of B then serves more register tiles per pass over
    // C (against 16 rows, interleaved, 1 thread: 40x768x3072 1.08x, 36x 1.03x, 33x the
    // same, 40x1024x1024 1.07x; 32x768x3072 and 24x the same; at 64x768x3072 the
    // in-place read beat packing with 48 rows (1.13-1.17x), 64 (1.10-1.12x) and 32
    // (1.08x), not with 16 (1.00-1.02x)).
    kc = jit__cpu_pick_block(K, h->lanes == 16 && M >= 2 ? (M > 32 ? 48 : 16) : 8, 1);
    // Each k block reads and writes the thread's rows of C, so they are kept in half of
    // L1 by n blocks when they would not fit: 8x768x3072 at 2 threads (a C half of 48
    // KiB) took 430-440 us with n blocks of 512 vs 490-650 us without (1 thread: the
    // same within noise). A single row (M = 1, 12 KiB) stays one block.
    if (M * tN * 4 > h->l1 / 2) nc = jit__cpu_pick_block(tN, h->l1 / 2 / 4 / M, tn);
  }
  int64_t em = mc ? mc : tM, en = nc ? nc : tN;  // extents the register tiles walk
  // A remainder that is not a whole number of vectors (31 = 16 + 15) makes LLVM
  // legalize odd-width vectors lane by lane, with spills. Pick the width that leaves
  // the smallest remainder; the remainder columns then run one at a time (below).
  p->narrow_rest = false;
  if (!fused && tn % h->lanes == 0 && en > tn && en % tn) {
    int64_t best_tn = tn, best_tm = tm;
    // Whole vectors, a power of two of them: LLVM widens other counts (24 lanes -> 32)
    // and the accumulator then spills.
    for (int64_t v = 1; v <= h->acc; v *= 2) {
      int64_t cand = v * h->lanes, rows = h->acc / v;
      if (cand > en || rows < 1) break;
      if (rows > tm) rows = tm;
      if (en % cand < en % best_tn || (en % cand == en % best_tn && cand > best_tn)) {
        if (rows * v <= h->acc && rows >= (tm < 3 ? tm : 3)) {
          best_tn = cand;
          best_tm = rows;
        }
      }
    }
    tn = best_tn;
    tm = best_tm < M ? best_tm : M;
    p->narrow_rest = en % tn != 0 && (en % tn) % h->lanes != 0;
  }
  (void)N;
  p->mc = mc, p->nc = nc, p->kc = kc, p->em = em, p->en = en, p->tm = tm, p->tn = tn;
}

  // Narrow N that is not a whole number of vectors (17x1000x31): plan_masked.
  // N above one vector only: below it most lanes would be masked off, and the plain
  // path's narrow vectors do better (100x100x3: 11 vs 5.5 GFLOP/s). Small M too: its
  // tile, all rows by N, was one vector of N lanes, which LLVM split lane by lane
  // (7x256x17 17 us against 0.8 masked; 16x256x31 81 against 1.7; 1x256x17 3.5 against
  // 0.4).
static void mm_masked(const jit__cpu_mm_shape *s, const jit__cpu_host *h, jit__cpu_mm_plan *p) {
  int64_t K = s->K, N = s->N, tM = p->tM;
  p->masked = !p->packed && !p->fused && p->split != 1 && N % h->lanes != 0 &&
              N > h->lanes && N <= 4 * h->lanes;
  if (!p->masked) return;
  // A power of two of vectors: LLVM widens 3 to 4 and the accumulator spills
  // (130x257x20 at 24 lanes: 2.5 GFLOP/s).
  int64_t nv = (N + h->lanes - 1) / h->lanes;
  if (nv == 3) nv = 4;
  int64_t mv = nv * h->lanes;
  // As many rows as the accumulator registers hold: 12 at 2 vectors on AVX-512
  // (fewer tiles, so fewer reads of each B row): 12x1000x31 4.3 us against 7.4 for
  // 8 + 4 rows, 17x1000x31 (12 + 5) 6.1-6.7 against 6.7-7.2 (6 + 6 + 5), 64x1000x31
  // and 1000x600x30 2-6 % faster.
  int64_t mtm = h->acc / nv;
  if (mtm > tM) mtm = tM;
  // A row tile needs 8 independent FMAs per k step (two FMA ports, 4 cycles each) or
  // its k loop waits on their latency: a 1-row rest at 2 vectors ran at half speed,
  // ~15 % of 17x1000x31 (8 + 8 + 1 rows). So the tile height that leaves no rest, or
  // the fewest rows short of that in the rest, down to that minimum: 12 + 5.
  int64_t least = (8 + nv - 1) / nv, best_short = -1;
  for (int64_t r = mtm; r >= least && r >= 1; r--) {
    int64_t rest = tM % r, shortfall = rest && rest < least ? least - rest : 0;
    if (best_short < 0 || shortfall < best_short) {
      best_short = shortfall;
      mtm = r;
    }
  }
  p->mc = p->nc = 0;
  p->kc = h->lanes < 16 ? jit__cpu_pick_block(K, JIT__MASKED_B_BYTES / 4 / mv, 1) : 0;
  p->tm = p->mtm = mtm;
  p->tn = p->mv = mv;
}

// The plan, GEMV-like (small M, below) as well where `small`.
static jit__cpu_mm_plan plan_matmul(const jit__cpu_mm_shape *s, const jit__cpu_host *h,
                                    int threads, bool small) {
  jit__cpu_mm_plan p = {0};
  int64_t M = s->M, K = s->K, N = s->N, Bt = s->Bt;
  bool batched = s->batched;
  threads = threads > 1 ? threads : 1;
  // Small M is GEMV-like: bound by streaming B once. B is then walked row by row in
  // short k blocks (a few contiguous streams the prefetcher follows) with the C row
  // in L1, rather than down columns of B per register tile. The epilogue then runs as
  // its own vectorized elementwise op over C, which is in cache anyway.
  // So are 17 rows when B is larger than half of L2: the packed path needs 18 rows (3
  // row tiles of 6) and the unpacked one walks down B's columns; 17x768x3072 took 1.54
  // ms (AVX2 code: 2.84) against 1.13 (1.40) GEMV-like, 17x1024x1024 0.53 against 0.42.
  p.small_m = small || M <= 16 || (M < 18 && K * N * 4 > h->l2 / 2);
  // A bias + activation epilogue runs on each register tile while its sums are in
  // registers (fused), except where the matmul is faster without it and the epilogue
  // then costs one pass over C in cache: when B is large (256 KiB or more) and
  // - the fused path cannot pack B, which needs all of K in a block (2 panels x K in
  //   256 KiB: K <= 1024 on AVX-512, 2048 on AVX2), and walked B's columns instead:
  //   gelu(xW+b) 64x3000x768 2.2x faster apart (AVX2 code: 2.2x), 256x2048x1024 2.6x,
  //   relu 128x4096x1024 3.4x (AVX2 code);
  // - on AVX-512, with fewer than 192 rows and B larger than L2 (the plain path's 6x64
  //   tile and wider blocks win there: 32x768x3072 17 % faster apart, 2 threads 10 %,
  //   64x768x3072 12 %, 128x768x3072 4 %, 32x1024x1024 22 %; with 256 rows and more
  //   fused was 2-7 % faster; with B in L2 the same, 100x512x512 and 150x1024x256, and
  //   the MLP example at N = 64, 64x784x256, 10 % slower apart and 14 ms longer to
  //   compile), or when the fused path does not pack B after all (below; 200x300x300
  //   1.55x, 100x768x1000 1.33x). With AVX2 code fused was as fast or faster there
  //   (200x300x300 1.39x).
  // Two compiles interleaved in one process; the same kernel either way, one jit_run.
  // Apart compiles slower: gelu(xW+b) 32x768x3072 49 -> 65 ms in a fresh process (the
  // 6x64 tile, and the epilogue's own loop nest).
  bool big_b = K * N * 4 >= (256 << 10);
  // Apart too, whatever B's size, when N is between one and four vectors and not a
  // whole number of them: the fused register tile would be that odd width, which LLVM
  // legalizes lane by lane (gelu(xW+b) 17x1000x31 took 330 us fused, 40x the matmul).
  bool odd_n = N % h->lanes != 0 && N > h->lanes && N <= 4 * h->lanes;
  // And when B is a transpose of W, which B's packing computes (below): the fused path
  // fuses the transpose into every register tile, where the packing cannot be hoisted
  // (gelu(xW^T+b) 256x768x3072 failed to compile; apart: 8.6-9.2 ms, as with W K x N).
  bool apart = odd_n || (big_b && (s->b_from_transpose || K * 2 * h->tn * 4 > JIT__PACK_BYTES ||
                                   (h->lanes == 16 && M < 192 && K * N * 4 > h->l2)));
  bool fused = s->epilogue && !p.small_m && !apart && !batched;
  // A batch worth splitting is divided by whole matmuls (plan_batch), each then planned
  // for one thread; except where the threads would get unequal shares (fewer than 4
  // matmuls each, not a multiple) and each matmul is large enough to be split by itself
  // (below: 2^24 multiply-adds). Worth splitting: 2^23 multiply-adds (~60 us on one
  // core), or as much B as a small-M matmul splits at. Half the bound for one matmul
  // (below): attention's 12x128x64x128 (2^23.6) took 197 us on 2 threads unsplit,
  // ~100 us split.
  bool uneven = Bt % threads != 0 && Bt < 4 * threads;
  p.batch_split = batched && threads > 1 && Bt >= threads &&
                  !(uneven && (double)M * N * K >= (double)(1 << 24)) &&
                  ((double)Bt * M * N * K >= (double)(1 << 23) ||
                   (double)Bt * K * N * 4 >= jit__cpu_split_b_bytes(*h));

  // Register tile. Small M: all rows in one tile, as wide in N as the registers allow
  // (M = 1 is a GEMV: TN = 8 vectors of B per k step).
  // A plain f32 matmul that packs B takes the host's plain tile (AVX-512: 6x64, 4
  // vectors of B per 6 broadcasts of A, against 2 per 8 at 8x32): tried first, and
  // kept if B is then packed. Against 8x32, two compiles interleaved in one process:
  // 64x768x3072 21 % faster (2 threads 13 %), 512^3 and 128x3072x768
  // 2 %, 256^3 the same. Unpacked it lost (200x300x300 20 % slower, 100^3 10 %), and
  // with an epilogue it was 3-4x slower (gelu(xW+b) 256x768x3072). Its compile takes
  // ~15 % longer (512^3: 46 ms against 40, a 4.3 KB object against 3.0).
  bool plain_tile = !p.small_m && s->floats && (h->ptm != h->tm || h->ptn != h->tn);
  bool plain = plain_tile && !fused;
  int T = p.batch_split ? 1 : threads;
  for (;;) {
    mm_tile_split_pack(s, h, T, plain, fused, &p);
    if (plain && !p.packed) {
      plain = false;  // the default tile after all (above)
      continue;
    }
    if (fused && !p.packed && big_b && h->lanes == 16) {
      fused = false;  // the epilogue apart after all (above)
      plain = plain_tile;
      continue;
    }
    break;
  }
  p.fused = fused;
  if ((double)M * s->whole_n * K >= (double)(1 << 24)) p.unroll_k = true;
  mm_blocks(s, h, &p);
  mm_masked(s, h, &p);
  // A's row tiles copied per k block (plan_packed) when a tile fits a stack scratch
  // buffer (16 KiB, jit__cpu_stack_buffers). Not on AVX-512: on the Xeon the copies
  // cost more than they saved (8x32 tiles, without them, two compiles interleaved:
  // 1024^3 6-8 % faster at 1 and 2 threads, 768^3 6 %, 512^3 1-4 %; 256^3, gelu(xW+b)
  // 256x768x3072, 128x3072x768 and 64x768x3072 within 1 %).
  // Nor where A is computed by an op fused into the row tiles (f16 A extended to f32,
  // emit_mlir.c), whose result already is a copy of the tile's rows: padding that as
  // well made hoist_pad fail.
  p.copy_a = p.packed && h->lanes < 16 && !s->a_made && p.tm * p.pkc * 4 <= (16 << 10);
  // B made by a transpose of W (x W^T with more than 17 rows, emit_mlir.c) is packed
  // from W directly when L x L tiles cover the panels (plan_packed). f16 W as well, its
  // tiles transposed as f16: W^T was its own op before, 64x768x3072 3.0-3.2 ms against
  // 2.4 now (x W: 2.3), AVX2 code 4.8 against 3.4.
  p.b_tr = s->b_from_transpose && p.packed && !p.fused && p.pkc % h->lanes == 0;
  if (p.packed) {
    p.mc = 0;
    p.nc = p.pnc;
    p.kc = p.pkc;
  }
  // Its k loop unrolled (by 4, or 2: jit__cpu_unroll_k_loops) where the trip count
  // is even: two compiles interleaved, 17x1000x31 5-6 % faster, 37x2000x27 4-6 %,
  // 1000x600x30, 200x512x24 and 64x1024x48 the same; ~4 ms more to compile.
  if (p.masked && (p.kc ? p.kc : K) % 2 == 0) p.unroll_k = true;
  return p;
}

jit__cpu_mm_plan jit__cpu_plan_matmul(const jit__cpu_mm_shape *s, const jit__cpu_host *h,
                                      int threads) {
  jit__cpu_mm_plan p = plan_matmul(s, h, threads, false);
  // On AVX-512, a packed f32 plan for up to 64 rows is GEMV-like instead: its 8x32
  // register tiles read B's rows in place, in k blocks of 16 rows (48 over 32 rows),
  // rather than packing all of B on each call. Against packed B, two compiles
  // interleaved in one process (Zen 4), 1 thread (2 threads): 32x768x3072 1.10x
  // (1.16x), 20x768x3072 1.18x, 24x 1.12x (1.18x), 40x 1.12x, 48x 1.04x (1.09x), 56x
  // 1.04x, 64x 1.04x (1.05x), 32x1024x4096 1.29x, 32x3072x768 1.26x (1.29x),
  // 64x3072x768 1.09x, 32x1024x1024 0.99x (1.31x), 64x1024x1024 1.00x, 36x1000x1000
  // (1.17x), 32x512x512 1.07x, 29x300x300 1.04x (1.05x), 32x256x256 1.08x (1.07x),
  // 64x256x3136 (a 1x1 convolution's) 1.04x (1.05x), 31x1001x768 (k blocks of 13
  // rows) 1.04x (1.03x), 32x1002x1024 and 32x1009x1024 (no k blocks) 1.13x and 1.17x;
  // gelu(xW+b), fused before, 32x768x3072 1.11x (1.09x), 64x768x3072 1.04x,
  // 32x512x512 1.07x, 36x784x256 1.05x, 40x1024x1024 1.06x. With the machine's memory
  // busier (packed 64x768x3072 at 3.5-4.2 ms against 3.1) the gains over 40 rows were
  // larger (64x768x3072 1.13-1.16x, 48x1024x1024 1.16x (1.33x)): reading B once is
  // what counts there. Not past 64 rows (96x768x3072 1.03x, 128x768x3072 0.97x,
  // 128x3072x768 0.89x, memory busy), nor with AVX2 code (32x768x3072 0.70x,
  // 29x300x300 0.85x), nor for x W^T, whose packing reads W directly (32x768x3072
  // 0.82x), nor where B was not packed (20x1002x1024, unpacked k blocks of 334:
  // 0.92x), nor for a weight (jit_weight), whose panels are packed once
  // (lowering/cpu/prepack.c: gelu(xW+b) 32x768x3072 0.80x, 2 threads 0.83x), nor for
  // f16 or batches (unmeasured). Not timed on an Intel AVX-512 host.
  bool f32_activation = s->floats && !s->a_f16 && !s->b_f16 && !s->batched &&
                        !s->b_from_transpose && !s->b_weight;
  if (p.packed && h->lanes == 16 && s->M <= 64 && f32_activation)
    p = plan_matmul(s, h, threads, true);
  // Past 64 rows on AVX-512, the packed plan's loops (k blocks of kc rows, 6x64
  // register tiles, m outside n) read B in place instead of from panels copied per
  // call, where a thread has fewer than 256 rows or its part of B fits in 1 MiB: the
  // copy costs in proportion to B, the product in proportion to M x B, and reading B
  // in place its rows N floats apart costs ~8 % of the product (768^3 0.91x, 1024^3
  // 0.92x, 256x1024x1024 0.94x, 512x1024x1024 at 2 threads 0.92x, gelu(xW+b)
  // 512x768x3072 0.98x: those stay packed). Two compiles interleaved in one process
  // (Zen 4, 1 MiB of L2), 1 thread (2 threads): 128x3072x768 1.06-1.11x (1.10x),
  // 128x2304x768 1.05x, 96x1024x1024 1.01x, 128x768x3072 1.01x, 256^3 1.02x (1.04x),
  // 512^3 1.02x (1.04x), 200x600x160 1.04x, 300^3 1.02x, 160x256x128 1.05x; with a
  // fused gelu epilogue 197x300x288 1.03x, 210x1000x256 1.03x, 128x768x768 1.05x,
  // 100x512x1024 1.05x, 192x256x1536 (1.05x). A compile ~20 % shorter (no packing
  // loops: 512^3 44-47 -> 33-37 ms). With AVX2 code, f16, batches, weights (packed
  // once) and x W^T (packed from W): unmeasured, or packed for a reason; they keep
  // their panels. Not timed on an Intel AVX-512 host.
  if (p.packed && h->lanes == 16 && f32_activation && !p.copy_a && !p.b_tr &&
      (p.tM < 256 || s->K * p.tN * 4 <= (1 << 20)))
    p.b_in_place = true;
  return p;
}
