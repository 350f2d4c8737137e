//===--- test_cpu_plans.c - the CPU plans, without MLIR -------------------===//
//
// Calls the plans (plan.h) directly with explicit hosts (AVX2 and AVX-512; 512 KiB,
// 1 MiB and 2 MiB of L2) and checks choices measured and kept on purpose
// (lowering/cpu/plan_*.c say why each is made). No MLIR context.
//
//===----------------------------------------------------------------------===//
#include <criterion/criterion.h>

#include "lowering/cpu/host.h"
#include "lowering/cpu/plan.h"

#define AVX512 "+avx2,+fma,+avx512f"
#define AVX2 "+avx2,+fma,-avx512f"

static jit__cpu_mm_plan plan(const char *features, int64_t l2, int threads, int64_t M,
                             int64_t K, int64_t N) {
  jit__cpu_host h = jit__cpu_host_make(features, l2, threads);
  jit__cpu_mm_shape s = {.M = M, .K = K, .N = N, .Bt = 1, .whole_n = N, .floats = true};
  return jit__cpu_plan_matmul(&s, &h, threads);
}

Test(cpu_plans, host) {
  jit__cpu_host a = jit__cpu_host_make(AVX512, 0, 1), b = jit__cpu_host_make(AVX2, 1 << 20, 2);
  cr_expect_eq(a.lanes, 16);
  cr_expect_eq(a.l2, 512 << 10, "unknown L2 is taken as 512 KiB");
  cr_expect_eq(a.ptm * 100 + a.ptn, 664);
  cr_expect_eq(b.lanes, 8);
  cr_expect_eq(b.l2, 1 << 20);
  cr_expect_eq(b.cores, 2);
}

// 131x520x512 on one AVX-512 thread: B packed, its blocks sized by L2.
Test(cpu_plans, packed_blocks_follow_l2) {
  jit__cpu_mm_plan p = plan(AVX512, 2 << 20, 1, 131, 520, 512);
  cr_expect(p.packed);
  cr_expect_eq(p.nc, 256);
  cr_expect_eq(p.kc, 520);
  cr_expect_eq(p.tn, 64);
  p = plan(AVX512, 1 << 20, 1, 131, 520, 512);
  cr_expect(p.packed);
  cr_expect_eq(p.nc, 128);
  cr_expect_eq(p.kc, 520);
  p = plan(AVX512, 512 << 10, 1, 131, 520, 512);
  cr_expect(p.packed);
  cr_expect_eq(p.nc, 512);
  cr_expect_eq(p.kc, 104);
}

// 320^3 on 2 threads: AVX-512 splits M at every L2; AVX2 splits N at 512 KiB, M at 2 MiB.
Test(cpu_plans, thread_split) {
  int64_t l2s[3] = {512 << 10, 1 << 20, 2 << 20};
  for (int k = 0; k < 3; k++)
    cr_expect_eq(plan(AVX512, l2s[k], 2, 320, 320, 320).split, 0, "L2 %lld",
                 (long long)l2s[k]);
  cr_expect_eq(plan(AVX2, 512 << 10, 2, 320, 320, 320).split, 1);
  cr_expect_eq(plan(AVX2, 2 << 20, 2, 320, 320, 320).split, 0);
}

// Narrow odd N (17x1000x31): one masked tile per row block, 12 + 5 rows on AVX-512.
Test(cpu_plans, masked_narrow_n) {
  jit__cpu_mm_plan p = plan(AVX512, 2 << 20, 1, 17, 1000, 31);
  cr_expect(p.masked);
  cr_expect_eq(p.mv, 32);
  cr_expect_eq(p.mtm, 12);
  cr_expect_eq(p.kc, 0, "no k blocks on AVX-512");
  p = plan(AVX2, 512 << 10, 1, 17, 1000, 31);
  cr_expect(p.masked);
  cr_expect_gt(p.kc, 0, "k blocks on AVX2");
}

// Small M is GEMV-like: no packing, k blocks of 8 rows (16 on AVX-512 from 2 rows of
// A), split over N by B's bytes.
Test(cpu_plans, small_m) {
  jit__cpu_mm_plan p = plan(AVX512, 2 << 20, 2, 1, 768, 3072);
  cr_expect(p.small_m);
  cr_expect(!p.packed);
  cr_expect_eq(p.kc, 8);
  cr_expect_eq(p.split, 1);
  cr_expect_eq(plan(AVX512, 1 << 20, 1, 8, 768, 3072).kc, 16, "AVX-512 from 2 rows: 16");
  cr_expect_eq(plan(AVX2, 1 << 20, 1, 8, 768, 3072).kc, 8);
  p = plan(AVX512, 2 << 20, 2, 7, 784, 256);
  cr_expect_eq(p.split, -1, "the MLP example's 0.8 MiB of B stays on one thread");
}

// An epilogue runs on the register tiles, except apart where the comments say.
Test(cpu_plans, epilogue) {
  jit__cpu_host h = jit__cpu_host_make(AVX512, 2 << 20, 1);
  jit__cpu_mm_shape s = {.M = 100, .K = 512, .N = 512, .Bt = 1, .whole_n = 512,
                         .floats = true, .epilogue = true};
  cr_expect(jit__cpu_plan_matmul(&s, &h, 1).fused);
  s.M = 17, s.N = 31, s.whole_n = 31, s.K = 1000;
  cr_expect(!jit__cpu_plan_matmul(&s, &h, 1).fused, "odd N: apart");
}

//===--- Batches and x W^T (plan_batch.c) -----------------------------------===//

static jit__cpu_host host(const char *features, int64_t l2, int threads) {
  return jit__cpu_host_make(features, l2, threads);
}

// A batch of vector x matrix: n tiles of 8 vectors, k blocks of a divisor of K near 8,
// or 8 with the last one peeled for a prime K; none for a short K (test_perf_paths:
// "a batch of 12 vector x matrix 1x64x1000", "k blocks 8", "k blocks 0").
Test(cpu_plans, vecmat_tiles) {
  jit__cpu_host a = host(AVX512, 2 << 20, 1), b = host(AVX2, 512 << 10, 1);
  jit__cpu_vecmat_plan p = jit__cpu_plan_vecmat(12, 64, 1000, &a, 1);
  cr_expect(!p.split);
  cr_expect_eq(p.tn, 128);
  cr_expect_eq(p.kb, 8);
  cr_expect(!p.peel_k);
  cr_expect(p.peel_n, "1000 is no multiple of 128");
  cr_expect_eq(jit__cpu_plan_vecmat(12, 64, 1000, &b, 1).tn, 64);
  p = jit__cpu_plan_vecmat(3, 1009, 77, &a, 1);
  cr_expect_eq(p.kb, 8);
  cr_expect(p.peel_k, "a prime K");
  cr_expect_eq(p.tn, 77);
  cr_expect(!p.peel_n);
  cr_expect_eq(jit__cpu_plan_vecmat(2, 7, 50, &a, 1).kb, 0);
}

// Threads split the batch from 2^23 multiply-adds, or from as much B as one core's L2
// holds and 2 MiB: a decode step's 12x1x64x1024 (3 MiB) up to 3 MiB of L2.
Test(cpu_plans, vecmat_split) {
  jit__cpu_host a = host(AVX512, 2 << 20, 2), big = host(AVX512, 4 << 20, 2);
  cr_expect(jit__cpu_plan_vecmat(4, 768, 3072, &a, 2).split);
  cr_expect(jit__cpu_plan_vecmat(12, 64, 1024, &a, 2).split);
  cr_expect(!jit__cpu_plan_vecmat(12, 64, 1024, &big, 2).split);
  cr_expect(!jit__cpu_batch_split(&a, 2, 1, 1, 768, 3072), "one matmul for two threads");
}

// A batch of x W^T with few rows: register tiles of up to 4 rows and as many columns
// as the accumulators allow, up to 8 ("a batch of 12 1x64x1024, B transposed, dot
// products, threads split the batch", "a batch of 6 2x32x77", "a batch of 5 4x128x50").
Test(cpu_plans, batch_dot) {
  jit__cpu_host a = host(AVX512, 512 << 10, 2), b = host(AVX2, 512 << 10, 1);
  jit__cpu_dot_plan p = jit__cpu_plan_batch_dot(12, 1, 64, 1024, &a, 2);
  cr_expect(p.dot && p.split);
  cr_expect_eq(p.tm * 100 + p.tn, 108);
  cr_expect_eq(p.L, 16);
  cr_expect(!p.tile_m && p.tile_n && !p.peel_n);
  p = jit__cpu_plan_batch_dot(6, 2, 32, 77, &a, 1);
  cr_expect(!p.split);
  cr_expect_eq(p.tm * 100 + p.tn, 208);
  cr_expect(p.peel_n, "77 keys: a peeled column tile");
  p = jit__cpu_plan_batch_dot(6, 2, 32, 77, &b, 1);
  cr_expect_eq(p.tm * 100 + p.tn, 206);
  cr_expect_eq(p.L, 8);
  cr_expect_eq(jit__cpu_plan_batch_dot(5, 4, 128, 50, &a, 1).tn, 6);
  cr_expect_eq(jit__cpu_plan_batch_dot(5, 4, 128, 50, &b, 1).tn, 3);
  p = jit__cpu_plan_batch_dot(12, 8, 256, 512, &a, 1);
  cr_expect(p.tile_m && !p.peel_m);
}

// x W^T: dot products when K is a whole number of vectors and long enough, else
// in-register transposes with up to 8 rows a tile, 9-17 rows as two equal tiles
// ("1x768x3072, B transposed, dot products, threads split N", "3x100x45, B
// transposed", "register tile 6x", "register tile 7x", "9x32x200").
Test(cpu_plans, matmul_bt) {
  jit__cpu_host a = host(AVX512, 2 << 20, 2), b = host(AVX2, 512 << 10, 1);
  jit__cpu_dot_plan p = jit__cpu_plan_matmul_bt(1, 768, 3072, &a, 2);
  cr_expect(p.dot && p.split);
  cr_expect_eq(p.tN, 1536);
  cr_expect_eq(p.tm * 100 + p.tn, 108);
  cr_expect(!p.unroll_k);
  p = jit__cpu_plan_matmul_bt(3, 100, 45, &a, 1);
  cr_expect(!p.dot && !p.split);
  cr_expect_eq(p.tm * 100 + p.tn, 316);
  cr_expect(!p.tile_m && p.tile_n && p.peel_n);
  cr_expect_eq(jit__cpu_plan_matmul_bt(12, 766, 200, &a, 1).tm, 6);
  cr_expect_eq(jit__cpu_plan_matmul_bt(13, 100, 77, &a, 1).tm, 7);
  cr_expect(!jit__cpu_plan_matmul_bt(9, 32, 200, &a, 1).dot, "AVX-512: K of 2 vectors");
  cr_expect(jit__cpu_plan_matmul_bt(9, 32, 200, &b, 1).dot, "AVX2: K of 4 vectors");
  p = jit__cpu_plan_matmul_bt(16, 768, 3072, &a, 1);
  cr_expect(p.dot && p.unroll_k);
  cr_expect_eq(p.tm, 4);
}

//===--- Rows, elementwise ops and streaming (plan_row_choice.c) ------------===//

// Softmax rows split across 2 threads from 2^15 elements, when the rows divide evenly
// (test_row_paths softmax_rows_split_across_threads: 64x1024, 16x3001, 4x9x1031).
Test(cpu_plans, row_split) {
  jit__cpu_row_plan p = jit__cpu_plan_row(64, 64 * 1024, 2);
  cr_expect(p.par);
  cr_expect_eq(p.rows, 32);
  cr_expect_eq(jit__cpu_plan_row(16, 16 * 3001, 2).rows, 8);
  cr_expect_eq(jit__cpu_plan_row(4, 4 * 9 * 1031, 2).rows, 2);
  cr_expect(!jit__cpu_plan_row(64, 64 * 1024, 1).par);
  cr_expect(!jit__cpu_plan_row(8, 8 * 16, 2).par, "too small");
  cr_expect(!jit__cpu_plan_row(63, 63 * 1024, 2).par, "uneven rows");
}

static jit__cpu_ew_plan ew(const char *features, int threads, int64_t rows, int64_t cols,
                           bool reduction, int tl) {
  jit__cpu_host h = jit__cpu_host_make(features, 512 << 10, threads);
  jit__cpu_ew_shape s = {.nl = 2, .ext = {rows, cols}, .reduction = reduction, .tl = tl};
  return jit__cpu_plan_elementwise(&s, &h, threads);
}

// An elementwise chain (test_row_paths elementwise_chain): rows of 4 vectors, the
// partial last one peeled; split across 2 threads from 2^16 elements (128x513), not
// below (127x513 is 65,151, and 127 rows do not split in two: nor do 513 columns);
// nothing planned under 64 elements.
Test(cpu_plans, elementwise_tiles) {
  jit__cpu_ew_plan p = ew(AVX512, 2, 2048, 513, false, -1);
  cr_expect(!p.skip && p.par);
  cr_expect_eq(p.e0, 1024);
  cr_expect_eq(p.n_loops, 2);
  cr_expect_eq(p.sizes[0] * 1000 + p.sizes[1], 1064);
  cr_expect(!p.peel[0] && p.peel[1]);
  cr_expect_eq(ew(AVX2, 2, 2048, 513, false, -1).sizes[1], 32);
  p = ew(AVX512, 2, 128, 513, false, -1);
  cr_expect(p.par && p.e0 == 64);
  p = ew(AVX512, 2, 126, 513, false, -1);  // 64,638 elements
  cr_expect(!p.par);
  cr_expect_eq(p.e0, 126);
  cr_expect(ew(AVX512, 1, 1, 37, false, -1).skip);
  cr_expect(!ew(AVX512, 1, 3, 1000, false, -1).skip);
}

// The split goes to the first loop that the threads divide: [1, 64, 56, 56] its 64,
// [63, 1100] its 1100; [63, 1101] none.
Test(cpu_plans, elementwise_split_loop) {
  jit__cpu_host h = jit__cpu_host_make(AVX512, 512 << 10, 2);
  jit__cpu_ew_shape s = {.nl = 4, .ext = {1, 64, 56, 56}, .tl = -1};
  jit__cpu_ew_plan p = jit__cpu_plan_elementwise(&s, &h, 2);
  cr_expect(p.par && p.pd == 1 && p.e0 == 32, "par %d pd %d e0 %lld", p.par, p.pd,
            (long long)p.e0);
  cr_expect_eq(p.sizes[0], 0);  // the unit loop is not tiled
  cr_expect_eq(p.sizes[3], 0);  // 56 columns: under 4 vectors
  s = (jit__cpu_ew_shape){.nl = 2, .ext = {1, 1 << 21}, .tl = -1};  // only the last loop
  p = jit__cpu_plan_elementwise(&s, &h, 2);
  cr_expect(p.par && p.pd == 1 && p.e0 == 1 << 20 && p.sizes[1] == 64);
  s = (jit__cpu_ew_shape){.nl = 2, .ext = {63, 1100}, .tl = -1};  // 69 K
  p = jit__cpu_plan_elementwise(&s, &h, 2);
  cr_expect(p.par && p.pd == 1 && p.e0 == 550 && p.sizes[1] == 64 && p.peel[1]);
  s.ext[1] = 1101;
  cr_expect(!jit__cpu_plan_elementwise(&s, &h, 2).par);
  s.ext[0] = 64;
  p = jit__cpu_plan_elementwise(&s, &h, 2);
  cr_expect(p.par && p.pd == 0 && p.e0 == 32);
  s.ext[1] = 1000;  // 64,000 elements: under 2^16
  cr_expect(!jit__cpu_plan_elementwise(&s, &h, 2).par);
  cr_expect(!jit__cpu_plan_elementwise(&s, &h, 1).par);
  s.follow_split = true;  // as the emitter asks (jit_split), whatever the size
  cr_expect(jit__cpu_plan_elementwise(&s, &h, 2).par);
}

// A transposed read (test_perf_paths transpose_tiles): L x L tiles, partial ones peeled.
Test(cpu_plans, transpose_tiles) {
  jit__cpu_ew_plan p = ew(AVX512, 1, 1000, 37, false, 0);
  cr_expect(p.transposes);
  cr_expect_eq(p.sizes[0] * 100 + p.sizes[1], 1616);
  cr_expect(p.peel[0] && p.peel[1]);
  p = ew(AVX2, 1, 48, 64, false, 0);
  cr_expect_eq(p.sizes[0] * 100 + p.sizes[1], 808);
  cr_expect(!p.peel[0] && !p.peel[1]);
}

// Reductions are only split across threads (from 2^18 elements), or left as they are.
Test(cpu_plans, reductions) {
  jit__cpu_ew_plan p = ew(AVX512, 2, 1024, 512, true, -1);
  cr_expect(!p.skip && p.par);
  cr_expect_eq(p.e0, 512);
  cr_expect(ew(AVX512, 1, 1024, 512, true, -1).skip);
  cr_expect(ew(AVX512, 2, 64, 512, true, -1).skip);
}

// Streaming stores from 8 MiB of output; the next row prefetched by a lone row loop over
// 1 MiB or more (test_row_paths large_softmax_streams_small_does_not).
Test(cpu_plans, streams) {
  int64_t big = 2054LL * 1031 * 4, small = 64LL * 1024 * 4;
  jit__cpu_stream_facts f = {.out_bytes = big, .n_row = 1, .row_bytes = 1031 * 4,
                             .row_input_bytes = big};
  jit__cpu_stream_plan p = jit__cpu_plan_stream(&f);
  cr_expect(p.stream);
  cr_expect_eq(p.row_prefetch, 1031 * 4);
  f.out_bytes = f.row_input_bytes = small;
  p = jit__cpu_plan_stream(&f);
  cr_expect(!p.stream);
  cr_expect_eq(p.row_prefetch, 0);
  f.out_bytes = f.row_input_bytes = big;
  f.other = true;
  cr_expect(!jit__cpu_plan_stream(&f).stream, "a reduction reads its output back");
}

// With a known L3, stores stream only where all a kernel reads and writes takes a
// quarter of it or more (the output stays cached for the next kernel otherwise); 8 MiB
// of output at least, whatever the L3.
Test(cpu_plans, streams_past_a_quarter_of_l3) {
  int64_t mib = 1 << 20;
  jit__cpu_stream_facts f = {.out_bytes = 12 * mib, .in_bytes = 12 * mib, .l3 = 480 * mib,
                             .n_row = 1, .row_bytes = 3072, .row_input_bytes = 12 * mib};
  cr_expect(!jit__cpu_plan_stream(&f).stream, "24 MiB against 480 MiB of L3");
  cr_expect_eq(jit__cpu_plan_stream(&f).row_prefetch, 3072, "the row prefetch stays");
  f.in_bytes = 108 * mib;  // 120 MiB: a quarter
  cr_expect(jit__cpu_plan_stream(&f).stream, "120 MiB against 480 MiB of L3");
  f.l3 = 32 * mib;
  f.in_bytes = 0;
  cr_expect(jit__cpu_plan_stream(&f).stream, "12 MiB out against 32 MiB of L3");
  f.l3 = 0;
  cr_expect(jit__cpu_plan_stream(&f).stream, "12 MiB out, L3 not known");
  f.out_bytes = 4 * mib;
  f.in_bytes = 500 * mib;
  f.l3 = 480 * mib;
  cr_expect(!jit__cpu_plan_stream(&f).stream, "4 MiB of output never streams");
}
