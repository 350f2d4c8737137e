//===--- plan_batch.c - batches, vector x matrix and x W^T (no MLIR) -----===//
//
// The choices for the matmuls script.c does not send through jit__cpu_plan_matmul: a
// batch of vector x matrix products, a batch of x W^T with few rows, and x W^T with W
// stored N x K. script.c writes each plan as transform IR.
//
//===----------------------------------------------------------------------===//
#include "lowering/cpu/plan.h"

// A batch is split across the threads, a matmul per thread, when it has one for each
// and is worth splitting by multiply-adds or by the bytes of B (as in plan_matmul).
bool jit__cpu_batch_split(const jit__cpu_host *h, int threads, int64_t Bt, int64_t M,
                          int64_t K, int64_t N) {
  return threads > 1 && Bt >= threads &&
         ((double)Bt * M * N * K >= (double)(1 << 23) ||
          (double)Bt * K * N * 4 >= jit__cpu_split_b_bytes(*h));
}

// A batch of vector x matrix products (attention's decode step, q K^T and p V for one
// token), as the small-M path treats one (plan_matmul): for each k block of ~8 rows of
// B, the row of C 8 vectors at a time. Without a divisor of K near 8, K above 16 still
// takes blocks of 8, the last one peeled.
jit__cpu_vecmat_plan jit__cpu_plan_vecmat(int64_t Bt, int64_t K, int64_t N,
                                          const jit__cpu_host *h, int threads) {
  jit__cpu_vecmat_plan p = {0};
  p.split = jit__cpu_batch_split(h, threads, Bt, 1, K, N);
  p.tn = 8 * h->lanes < N ? 8 * h->lanes : N;
  p.kb = jit__cpu_pick_block(K, 8, 1);
  if (!p.kb && K > 16) {
    p.kb = 8;
    p.peel_k = K % 8 != 0;
  }
  p.peel_n = N % p.tn != 0;
  return p;
}

// A batch of x W^T with few rows (a decode step's q K^T: 12 heads of 1x64 against
// 1024x64 keys): the batch loop (split across threads as a batch of vector x matrix
// would), register tiles of up to 4 rows x 8 columns (as many columns as the
// accumulator registers allow), each a set of dot products along k. Before, K was
// copied transposed per call (the transpose its own op): 12x1x64x1024 326 -> 153 us
// (2 threads 351 -> 60; K stored (B, D, S): 98), 12x2x64x1024 1.11 ms -> 0.24, f16
// 12x1x64x1024 226 -> 111 us. With D = 64 the four steps per dot product leave the
// reductions across lanes a large share.
jit__cpu_dot_plan jit__cpu_plan_batch_dot(int64_t Bt, int64_t M, int64_t K, int64_t N,
                                          const jit__cpu_host *h, int threads) {
  jit__cpu_dot_plan p = {0};
  p.dot = true;
  p.split = jit__cpu_batch_split(h, threads, Bt, M, K, N);
  p.tN = N;
  p.L = h->lanes;
  p.tm = M < 4 ? M : 4;
  p.tn = h->acc / p.tm < 8 ? h->acc / p.tm : 8;
  if (p.tn > N) p.tn = N;
  p.tile_m = p.tm < M;
  p.tile_n = p.tn < N;
  p.peel_m = p.tile_m && M % p.tm;
  p.peel_n = p.tile_n && N % p.tn;
  return p;
}

// x W^T with W stored N x K, up to 17 rows (emit_mlir.c), or imported: each register
// tile [up to 8 rows, one vector of N] steps k by one vector's lanes L, reading B as L
// rows of L contiguous k and transposing them in registers (16x16 shuffles on AVX-512)
// before the outer-product FMAs, rather than reading a column of W (K floats apart)
// per k. No packing and no fused epilogue; threads split N. Tiles of 4 vectors of N
// made 64x16 transposes, lowered element by element (1x768x3072: 0.87 ms and 335 ms to
// compile, against 0.47 ms and ~60 ms). With more than 8 rows the n loop is outside
// the m loop, so each row tile reads its L rows of W from L1 after the first, not all
// of W again from memory (16x768x3072: 1.20 ms against 1.34; imported 64x768x3072:
// 4.1 against 5.7); 9-17 rows are two equal row tiles (12 rows: no peeled rest, 74 ms
// to compile against 114).
//
// With K a whole number of vectors and long enough for the tiles' final reductions
// across lanes to matter little (2 vectors with up to 4 rows, 4 with up to 12, else 8),
// the tiles are dot products instead (script.c's plan_matmul_dot): no transposes. f16
// W, whose 16x16 transposes cost more than its halved bytes saved (it was copied
// transposed per call instead): 1x768x3072 1.0 ms -> 0.18 (x W: 0.19), 8x768x3072
// 1.26 -> 0.48, 16x768x3072 1.83 -> 0.79, 4x64x1000 15.5 -> 7.5 us, 3x32x1000 7.4 ->
// 3.8; f32 1x768x3072 0.39 -> 0.34, 16x768x3072 1.12 -> 0.86, 16x256x512 42 -> 35 us,
// 12x64x256 5.2 -> 4.7, 3x32x1000 3.9 -> 3.5; AVX2 code 1.3-1.9x (16x768x3072 1.58 ->
// 0.99 ms). Shorter K lost to the transposes (9x32x200 2.0 against 1.7 us, 17x64x300
// f16 9.6 against 8.5 for the copy).
jit__cpu_dot_plan jit__cpu_plan_matmul_bt(int64_t M, int64_t K, int64_t N,
                                          const jit__cpu_host *h, int threads) {
  jit__cpu_dot_plan p = {0};
  int64_t L = h->lanes, tn = L, tm = M < 8 ? M : 8;
  if (M > 8 && M <= 17) tm = (M + 1) / 2;  // two row tiles, no peel when M is even
  // jit__cpu_bt_map (emit_mlir.c) sends f16 here only where this holds on AVX-512 and AVX2.
  p.dot = M <= 17 && K % L == 0 && K >= (M <= 4 ? 2 : M <= 12 ? 4 : 8) * L;
  if (p.dot) {
    tm = M < 4 ? M : 4;
    tn = h->acc / tm < 8 ? h->acc / tm : 8;
  }
  int T = threads;
  bool big = (double)M * N * K >= (double)(1 << 24) ||
             (M <= 16 && (double)K * N * 4 >= jit__cpu_split_b_bytes(*h));
  p.split = T > 1 && big && N % T == 0 && N / T >= tn;
  p.tN = p.split ? N / T : N;
  if (tn > p.tN) tn = p.tN;
  if (tm > M) tm = M;
  p.tm = tm;
  p.tn = tn;
  p.L = L;
  p.tile_m = tm < M;
  p.tile_n = tn < p.tN;
  p.peel_m = p.tile_m && M % tm;
  p.peel_n = p.tile_n && p.tN % tn;
  p.unroll_k = M * N * K >= (1 << 24);
  return p;
}
