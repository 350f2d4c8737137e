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
