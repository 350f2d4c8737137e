//===--- test_perf_paths.c - every specialized CPU code path against plain C ===//
//
// lowering/cpu/ picks a different loop structure by shape: GEMV-like small
// M, register tiles with peeled remainders, cache blocks chosen as divisors, a fused
// bias + activation epilogue, threads split over M or N, batched and transposed
// products. Each test here lands on one of those paths with shapes that include 1,
// primes and non-multiples of every tile, at 1 and 2 threads, f32 and f16, and
// compares with the double-accumulating references in ref.c. The row and elementwise
// ops' paths, and whole blocks, are in test_row_paths.c.
//
//===----------------------------------------------------------------------===//
#define _XOPEN_SOURCE 700  // nftw
#include <dirent.h>
#include <ftw.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "paths.h"

// The comment lines of the first transform script (the plans' choices), for a failed
// needle's message; in a static buffer.
static const char *script_choices(void) {
  static char out[1024];
  const char *text = dump_text("-03-transform-script.mlir", 0);
  size_t n = 0;
  out[0] = 0;
  for (const char *p = text ? strstr(text, "// ") : NULL; p && n + 2 < sizeof out;
       p = strstr(p + 3, "// ")) {
    size_t len = strcspn(p, "\n");
    n += (size_t)snprintf(out + n, sizeof out - n, "%.*s; ", (int)len, p);
  }
  return out;
}


// check_dense, and that the kernel took the path whose script comment has `needle`
// (a "split" needle is only checked where kernels use threads).
static void check_dense_path_dt(int M, int K, int N, int threads, DLDataType dt, int bias,
                                int act, const char *needle) {
  if (!kThreadsSplit && strstr(needle, "split")) needle = "threads split none";
  dump_begin();
  check_dense(M, K, N, threads, dt, bias, act);
  cr_expect(script_has(needle), "%dx%dx%d %s threads=%d: script lacks `%s` (has: %s)", M,
            K, N, tu_is_f16(dt) ? "f16" : "f32", threads, needle, script_choices());
  dump_end();
}

static void check_dense_path_act(int M, int K, int N, int threads, int bias, int act,
                                 const char *needle) {
  check_dense_path_dt(M, K, N, threads, TU_F32, bias, act, needle);
}

static void check_dense_path(int M, int K, int N, int threads, const char *needle) {
  check_dense_path_act(M, K, N, threads, 0, 0, needle);
}

// The L2 per core the plans assume. The real host's would make the needles below
// depend on the machine the suite runs on, so the suite pins it: $JITML_CPU_L2
// (devices/cpu/cpu.c), 2 MiB unless the environment already gives a size (CTest runs
// the suite again at 512 KiB and 1 MiB). Read back here with the library's grammar
// (bytes, or a number with a K or M suffix).
// The L3 is pinned as well (paths.h, pin_caches).
__attribute__((constructor)) static void pin_l2(void) { pin_caches(); }

static long host_l2(void) {
  long v = pinned_l2();
  return v ? v : 512 << 10;  // what the library assumes for an unknown L2
}

// Whether the L2 holds more than twice a 256 KiB B (lowering/cpu/ splits plain
// matmuls whose B fits there over M).
static bool host_big_l2(void) { return host_l2() > (512 << 10); }

// Packed B in whole-K blocks of up to half of L2 for 128 rows a thread or more
// (lowering/cpu/, pack_plan): AVX-512 hosts with more than 512 KiB of L2.
// The block is then as wide as half of L2 allows: `whole` names the block of a 2 MiB L2,
// `whole_1m` that of a 1 MiB one, where a K x 256 block does not fit in 512 KiB.
#define WHOLE_K(other, whole) WHOLE_K3(other, whole, whole)
#define WHOLE_K3(other, whole_1m, whole)                                            \
  (!host_avx512() || !host_big_l2() ? (other)                                      \
   : host_l2() < (2 << 20)          ? (whole_1m)                                   \
                                    : (whole))

// The packed path's loops read an activation B from panels copied per call ("B
// packed"), or on AVX-512 from B itself where a thread has fewer than 256 rows or its
// part of B fits in 1 MiB ("B read in place": lowering/cpu/plan_matmul.c). `pre` and
// `post` are the text around it in the script's comment.
#define PANELS(pre, post) AVX512(pre "B packed" post, pre "B read in place" post)

static const int kShapes[][3] = {
    {1, 1, 1},     {1, 7, 13},     {1, 768, 96},  {2, 33, 17},   {3, 64, 100},
    {5, 33, 17},   {8, 96, 200},   {16, 64, 64},  {17, 1000, 31}, {17, 31, 1000},
    {31, 17, 7},   {97, 61, 131},  {64, 128, 96}, {100, 100, 100}, {128, 300, 256},
    {130, 257, 262},
};

Test(perf_paths, matmul_f32_one_thread) {
  for (size_t i = 0; i < sizeof kShapes / sizeof *kShapes; i++)
    check_dense(kShapes[i][0], kShapes[i][1], kShapes[i][2], 1, TU_F32, 0, 0);
}

Test(perf_paths, matmul_f32_two_threads) {
  for (size_t i = 0; i < sizeof kShapes / sizeof *kShapes; i++)
    check_dense(kShapes[i][0], kShapes[i][1], kShapes[i][2], 2, TU_F32, 0, 0);
}

Test(perf_paths, matmul_threads_split_n_and_m) {
  // Sizes over the 2^24 multiply-adds below which kernels stay single-threaded.
  check_dense(8, 512, 4096, 2, TU_F32, 0, 0);   // small M: split over N
  check_dense(2, 2048, 4100, 2, TU_F32, 0, 0);
  check_dense(256, 256, 256, 2, TU_F32, 0, 0);  // split over M
  check_dense(66, 512, 500, 2, TU_F32, 0, 0);   // halves of 33 rows
}

// Small M split over N by the bytes of B (4 MiB and up) rather than by multiply-adds;
// remainders of the per-thread half that are not whole register tiles or vectors.
// The MLP example's 7x784x256 stays on one thread.
Test(perf_paths, small_m_split_by_bytes) {
  check_dense_path(1, 768, 3072, 2, "split N");
  check_dense_path(14, 1000, 1100, 2, "split N");  // 550 columns a thread: 17 x 32 + 6
  check_dense_path(1, 1031, 1018, 2, "split N");   // 509 a thread: 7 x 64 + 61
  check_dense_path_act(1, 1025, 1030, 2, 1, 2, "split N");  // gelu(xW+b), M = 1, odd K
  check_dense_path(7, 784, 256, 2, "threads split none");
  // From as much B as one core's L2 holds, and 2 MiB: 2.3 MiB here (split over K,
  // below).
  check_dense_path(4, 768, 768, 2,
                   host_l2() <= (2304 << 10) ? "a batch of 2, threads split the batch"
                                             : "threads split none");
  check_dense_path(1, 256, 1024, 2, "threads split none");  // 1 MiB
}

// From 4 rows, or where a thread would get under a page (4 KiB) of each row of B split
// so, small M is split over K instead: a batch of T matmuls of K / T, a thread each,
// and their sum (vector x matrix for M = 1); with bias + activation after it. Not on
// one thread (nor in ASan builds, whose kernels are single-threaded: every needle
// here names its thread split).
Test(perf_paths, small_m_split_over_k) {
  check_dense_path(1, 1024, 1024, 2,
                   "a batch of 2 vector x matrix 1x512x1024, threads split the batch");
  check_dense_path(16, 1024, 1024, 2, "a batch of 2, threads split the batch");
  check_dense_path(16, 1024, 1024, 2, "matmul 0: 16x512x1024, threads split none");
  check_dense_path_act(3, 768, 1536, 2, 1, 2, "a batch of 2, threads split the batch");
  check_dense_path_act(1, 2048, 512, 2, 1, 1,
                       "vector x matrix 1x1024x512, threads split the batch");
  check_dense_path(7, 1000, 784, 2, "a batch of 2, threads split the batch");
  check_dense_path(1, 1024, 1024, 1, "1x1024x1024, threads split none");
  // N not a whole number of vectors: over K up to 12 rows, over N from 13.
  check_dense_path(2, 1024, 1001, 2, "a batch of 2, threads split the batch");
  check_dense_path_act(3, 1000, 1100, 2, 1, 2, "a batch of 2, threads split the batch");
  check_dense_path(13, 1024, 1001, 2, "split N");
  // From 4 rows over K at any N; fewer rows with a page or more a thread over N.
  check_dense_path(4, 768, 3072, 2, "a batch of 2, threads split the batch");
  check_dense_path(8, 768, 3072, 2, "matmul 0: 8x384x3072, threads split none");
  check_dense_path(2, 1024, 4096, 2, "2x1024x4096, threads split N");
  check_dense_path_act(17, 768, 3072, 2, 1, 2, "matmul 0: 17x384x3072, threads split none");
  // f16 B (and A, which stays f16 for one row): its rows are half as long, so N = 2048
  // (and 1x768x3072) splits over K too.
  check_dense_path_dt(1, 1024, 2048, 2, TU_F16, 0, 0,
                      "a batch of 2 vector x matrix 1x512x2048, threads split the batch");
  check_dense_path_dt(1, 768, 3072, 2, TU_F16, 1, 2,
                      "a batch of 2 vector x matrix 1x384x3072, threads split the batch");
  check_dense_path_dt(5, 1024, 1024, 2, TU_F16, 1, 1, "a batch of 2, threads split the batch");
  check_dense_path_dt(1, 768, 3072, 2, TU_F32, 0, 0, "split N");
}

// Small M walks B in k blocks of ~8 rows (~16 on AVX-512 from 2 rows of A): a divisor
// of K near that, or none for prime K.
Test(perf_paths, small_m_k_blocks) {
  check_dense_path(1, 768, 3072, 1, "blocks [0, 0, 8]");
  check_dense_path(5, 1001, 200, 1, AVX512("blocks [0, 0, 7]", "blocks [0, 0, 13]"));
  check_dense_path(13, 1009, 100, 1, "blocks [0, 0, 0]");
  check_dense_path_act(9, 390, 301, 1, 1, 2,  // epilogue apart
                       AVX512("blocks [0, 0, 6]", "blocks [0, 0, 15]"));
  // 17 rows with B over half of L2: too few rows to pack B, so GEMV-like too.
  check_dense_path(17, 768, 3072, 1,
                   AVX512("17x768x3072, threads split none, blocks [0, 256, 8]",
                          "17x768x3072, threads split none, blocks [0, 256, 16]"));
  check_dense_path(17, 100, 64, 1, "17x100x64, threads split none, blocks [0, 0, 0]");
}

// Small M keeps the thread's rows of C (read and written by every k block) in half of
// L1 with n blocks, when they would not fit: 16 KiB / 4 / M columns, a divisor of the
// thread's N near that; none for a prime N. One row (12 KiB) stays one block.
// Fewer rows than the register tile: the row of vectors is a power of two (LLVM widened
// 3 or 6 vectors to 4 or 8 and the accumulator spilled: 10-25x slower).
Test(perf_paths, small_m_rows_of_power_of_two_vectors) {
  check_dense_path(4, 768, 3072, 1, AVX512("register tile 4x16", "register tile 4x64"));
  check_dense_path(2, 768, 3072, 1, AVX512("register tile 2x32", "register tile 2x128"));
  check_dense_path(7, 768, 3072, 1, AVX512("register tile 6x16", "register tile 7x32"));
  // Odd N: the rest columns' tiles narrower still; exact.
  check_dense(2, 300, 1000, 1, TU_F32, 1, 1);
  check_dense(7, 100, 333, 2, TU_F32, 0, 0);
  check_dense(5, 64, 97, 1, TU_F16, 1, 2);
}

// Few rows and an N between one and four vectors, not a whole number of them: one
// masked tile (it was one vector of N lanes, which LLVM split lane by lane: 7x256x17
// ran at 3.5 GFLOP/s). Above four vectors the rest after the split (odd_n_split_in_two)
// is such a tile.
Test(perf_paths, small_m_narrow_n_masked) {
  check_dense_path(7, 256, 17, 1, "matmul 0: 7x256x17, masked N");
  check_dense_path(1, 256, 17, 1, "matmul 0: 1x256x17, masked N");
  check_dense_path(16, 256, 31, 2, "matmul 0: 16x256x31, masked N");
  check_dense_path(13, 61, AVX512(29, 53), 1, "masked N");
  check_dense_path(1, 768, 100, 1, AVX512("matmul 1: 1x768x4,", "matmul 1: 1x768x36, masked N"));
  check_dense_path(3, 97, 1000, 2, AVX512("matmul 1: 3x97x8,", "matmul 1: 3x97x40, masked N"));
  check_dense(5, 64, 23, 1, TU_F16, 1, 2);
  check_dense(1, 130, 47, 2, TU_F16, 0, 0);
  check_dense(9, 33, 19, 1, TU_F32, 1, 1);
}

// On AVX-512 an f32 matmul of up to 64 rows that would pack B reads it in place
// instead, like small M (lowering/cpu/plan_matmul.c): k blocks of ~16 rows, ~48 over
// 32 rows (50 for K = 300, 13 for 1001), a peeled rest of rows (37 = 4 x 8 + 5), an
// odd N split (1000 = 960 + 40), an epilogue apart that was fused, at 1 and 2
// threads, N split between them (64 rows: M would have each read all of B); past 64
// rows, and everywhere with AVX2 code, B is packed. Where B was not packed
// (20x1002x1024: no k block divides K near 16) nor for x W^T (perf_paths/linear_*)
// nothing changes (AVX2 code packs 20x1002x1024).
Test(perf_paths, small_m_up_to_64_rows) {
  const char *in_place = "small M: B read in place";
  check_dense_path(32, 768, 3072, 1, AVX512("B packed", in_place));
  check_dense_path(32, 768, 3072, 2, AVX512("B packed", in_place));
  check_dense_path(37, 300, 384, 1, AVX512("B packed", "blocks [0, 96, 50]"));
  check_dense_path(31, 1001, 768, 2, AVX512("B packed", "blocks [0, 128, 13]"));
  check_dense_path(40, 1000, 1000, 2, AVX512("B packed", in_place));
  check_dense_path_act(29, 512, 512, 1, 1, 2, AVX512("epilogue, B packed", in_place));
  check_dense_path_act(17, 768, 3072, 2, 1, 1, in_place);
  check_dense_path(64, 768, 3072, 2, AVX512("B packed", "threads split N, blocks [0, 64, 48]"));
  check_dense_path(53, 640, 1536, 1, AVX512("B packed", in_place));
  check_dense_path(65, 768, 3072, 1, PANELS("", ""));
  check_dense_path(20, 1002, 1024, 1, AVX512("B packed", "blocks [0, 256, 334]"));
}

Test(perf_paths, small_m_n_blocks) {
  check_dense_path(8, 768, 3072, 1, AVX512("blocks [0, 512, 8]", "blocks [0, 512, 16]"));
  check_dense_path(8, 768, 3072, 2,  // 1536 columns a thread
                   AVX512("blocks [0, 512, 8]", "blocks [0, 512, 16]"));
  // N split at the last whole tile first (odd_n_split_in_two): 960 (992) and 40 (8).
  check_dense_path(16, 200, 1000, 1, AVX512("blocks [0, 496, 8]", "blocks [0, 192, 20]"));
  check_dense_path(11, 97, 2053, 1, "matmul 1: 11x97x5, threads split none, blocks [0, 0, 0]");
  // gelu(xW+b); on AVX-512 N is split at 1984 (31 x 64; the epilogue then runs apart).
  check_dense_path_act(6, 300, 2000, 1, 1, 2,
                       AVX512("blocks [0, 400, 6]", "matmul 0: 6x300x1984, threads split none, "
                                                    "blocks [0, 496, 15]"));
}

// B packed into panels (plan_packed): B too large for L2, enough rows to reuse it.
// Prime and odd M (a peeled row tile), K with and without k blocks (and a k block not
// a multiple of 8 rows), n blocks that are not powers of two, splits over N and M.
// A that fits in 256 KiB takes kc = K and narrower n blocks; larger A, k blocks, with
// n blocks as wide as the thread's N when it has few rows (<= 256).
// AVX-512 reads B in place up to 64 rows (small_m_up_to_64_rows): more rows there.
Test(perf_paths, matmul_packed_b) {
  check_dense_path(AVX512(37, 67), 300, AVX512(288, 384), 1,
                   AVX512("blocks [0, 144, 300]", "blocks [0, 192, 300]"));
  // A 200 KB: kc = K (AVX-512's 6x64 tile needs nc >= 128, so K <= 512 there).
  check_dense_path(AVX512(50, 70), AVX512(1000, 500), 256, 1,
                   AVX512("blocks [0, 64, 1000]", "blocks [0, 128, 500]"));
  check_dense_path(67, 1000, 256, 1, "blocks [0, 256, 200]");   // A 268 KB: kc 200
  check_dense_path(97, AVX512(520, 400), AVX512(512, 1024), 1,  // 8 n blocks
                   AVX512("blocks [0, 64, 520]", "blocks [0, 128, 400]"));
  check_dense_path(127, 520, 512, 1, "blocks [0, 512, 104]");   // few rows: all of N
  check_dense_path(131, 520, 512, 1,
                   WHOLE_K3("blocks [0, 512, 104]", "blocks [0, 128, 520]",
                            "blocks [0, 256, 520]"));
  check_dense_path(263, 520, 512, 1,                             // many: two n blocks
                   WHOLE_K3("blocks [0, 256, 104]", "blocks [0, 128, 520]",
                            "blocks [0, 256, 520]"));
  check_dense_path(AVX512(45, 67), 3000, 768, 2, "threads split N, blocks [0, 384, 120]");
  // One 2-panel block (3 row tiles at least, so 24 rows on AVX-512).
  check_dense_path(AVX512(19, 67), 3280, AVX512(32, 64), 1,
                   AVX512("blocks [0, 32, 1640]", "blocks [0, 64, 656]"));
  check_dense_path(AVX512(37, 67), 128, 512, 1, "blocks [0, 256, 128]");  // B 256 KiB
  check_dense_path(300, 256, 256, 2, "split M");                // 150 rows a thread,
  check_dense_path(300, 256, 256, 2, PANELS("", ""));           // all of B each
  // Split N: each thread packs its half, under 256 KiB (the bound is on all of B).
  // Where all of B fits in under half of L2 (2 MiB L2s, not 512 KiB ones), M instead;
  // never with 9 MiB of B.
  check_dense_path(256, 256, 256, 2, PANELS("", ""));
  check_dense_path(256, 256, 256, 2, host_big_l2() ? "threads split M" : "threads split N");
  // (On AVX-512 with less L2, N's halves of 160 are not whole 64-wide panels: M.)
  check_dense_path(320, 320, 320, 2, host_big_l2() || host_avx512() ? "split M" : "split N");
  check_dense_path(64, 768, 3072, 2, "split N");
  // 184 KiB a thread (AVX-512: 240 KiB; a half of 144 columns is not whole panels).
  check_dense_path(199, 320, AVX512(288, 384), 2,
                   AVX512("threads split N, blocks [0, 144, 320]",
                          "threads split N, blocks [0, 192, 320]"));
  // M = N with 256 rows a thread or more: split M (each thread packs all of B).
  check_dense_path(512, 320, 512, 2, WHOLE_K("threads split M, blocks [0, 512, 80]",
                                             "threads split M, blocks [0, 256, 320]"));
  check_dense_path(512, 512, 512, 1, WHOLE_K("blocks [0, 256, 256]", "blocks [0, 256, 512]"));
  check_dense_path(1024, 1024, 1024, 1,
                   WHOLE_K3("blocks [0, 256, 256]", "blocks [0, 128, 1024]",
                            "blocks [0, 256, 1024]"));
}

// Where B is read in place on the packed path's loops (AVX-512): fewer than 256 rows a
// thread, or a thread's part of B in 1 MiB; else (and on AVX2) from packed panels.
// Prime and odd rows (a peeled row tile), k blocks, splits over N and M.
Test(perf_paths, matmul_b_in_place) {
  check_dense_path(255, 1024, 1024, 1, PANELS("", ""));        // 255 rows, B 4 MiB
  check_dense_path(256, 1024, 1024, 1, "B packed");             // 256 rows, B 4 MiB
  check_dense_path(131, 3072, 768, 1, PANELS("", ""));         // k blocks, 5 rest rows
  check_dense_path(131, 3072, 768, 2, "threads split N");
  check_dense_path(131, 3072, 768, 2, PANELS("", ""));
  check_dense_path(512, 512, 512, 1, PANELS("", ""));          // B 1 MiB
  check_dense_path(512, 520, 512, 2, "B packed");               // B over 1 MiB, 256 rows
}

// Without n blocks there are no row blocks either (they would only add remainders).
Test(perf_paths, matmul_no_row_blocks) {
  check_dense_path(200, 250, 256, 1, "blocks [0, 0, 0]");  // not 4 blocks of 50 rows
  check_dense_path(131, 90, 97, 1, "blocks [0, 0, 0]");
  // A's row tiles copied too: whole tiles only (no peel), and a 5-row remainder.
  // nc 160, kc 256; kc 200. AVX-512 hosts copy no A tiles (lowering/cpu/).
  check_dense_path(66, 1024, 320, 1, AVX512("A tiles copied", "B read in place, threads"));
  check_dense_path(71, 1000, 288, 1, AVX512("A tiles copied", "B read in place, threads"));
  // Packed, halves of N (AVX-512 reads B in place up to 64 rows).
  check_dense_path(AVX512(64, 96), 256, 1536, 2, "split N");
  check_dense_path(AVX512(64, 96), 256, 1536, 2, PANELS("", ""));
  check_dense_path(210, 600, 160, 2, "split M");   // packed, 105 rows each
  check_dense_path(210, 600, 160, 2, PANELS("", ""));
}

// Matmuls of 2^24 multiply-adds or more have their register tiles' k loops unrolled by
// LLVM (lowering/cpu/, "Unrolled k loops"): by 4, by 2 when the trip count is only
// even, not at all when it is odd; smaller matmuls are left rolled.
static void check_unroll(int M, int K, int N, int threads, int act, const char *needle,
                         bool unrolled) {
  dump_begin();
  check_dense(M, K, N, threads, TU_F32, act != 0, act);
  cr_expect(script_has(needle), "%dx%dx%d: script lacks `%s`", M, K, N, needle);
  char count[32] = "loop_unroll<count";
  cr_expect(dump_has("-05-llvm-dialect.mlir", count) == unrolled,
            "%dx%dx%d threads=%d: k loops %s", M, K, N, threads,
            unrolled ? "not unrolled" : "unrolled");
  dump_end();
}

Test(perf_paths, k_loops_unrolled) {
  check_unroll(127, 520, 512, 1, 0, "blocks [0, 512, 104]", true);  // kc 104: by 4
  check_unroll(AVX512(50, 20), 1002, AVX512(400, 1024), 1, 0,
               AVX512("blocks [0, 400, 334]", "blocks [0, 256, 334]"), true);  // unpacked, by 2
  check_unroll(AVX512(37, 65), 1001, 512, 1, 0, "blocks [0, 64, 1001]", false);  // odd kc = K
  check_unroll(AVX512(64, 192), 768, 384, 1, 2, "epilogue", true);  // gelu epilogue
  check_unroll(256, 256, 256, 2, 0, PANELS("", ""), true);
  // Masked narrow N: unrolled below 2^24 too, where the k loop's trip count is even.
  check_unroll(17, 1000, 31, 1, 0, "masked N", true);   // K 1000 (AVX2: kc 200)
  check_unroll(130, 257, 20, 1, 0, "masked N", false);  // K 257
  check_unroll(AVX512(37, 67), 300, AVX512(288, 384), 1, 0,
               AVX512("blocks [0, 144, 300]", "blocks [0, 192, 300]"), false);  // rolled
}

// The fused epilogue on packed B: kc = K (the epilogue needs the whole sum), nc as
// wide as a K x nc block allows. Odd and prime M (peeled row tiles), two-panel blocks,
// K not a multiple of 8, splits over N and over M.
Test(perf_paths, fused_packed_b) {
  // AVX-512 fuses with 192 rows or more, or a B that fits in L2 (lowering/cpu/): M + 160.
  int more = AVX512(0, 160);
  check_dense_path_act(37 + more, 300, 288, 1, 1, 2, PANELS("epilogue, ", ""));  // 1 rest row
  check_dense_path_act(50 + more, 1000, 256, 1, 1, 1, PANELS("epilogue, ", "")); // nc 64
  // nc = 2 panels (AVX2 32, AVX-512 64: K <= 1024), and K odd; at least 3 row tiles.
  check_dense_path_act(AVX512(19, 193), AVX512(2000, 1000), AVX512(96, 128), 1, 1, 2,
                       PANELS("epilogue, ", ""));
  check_dense_path_act(AVX512(23, 199), 1001, 320, 1, 1, 2, PANELS("epilogue, ", ""));
  check_dense_path_act(AVX512(64, 192), 256, 1536, 2, 1, 2, "split N");  // halves of N
  check_dense_path_act(AVX512(64, 192), 256, 1536, 2, 1, 2, PANELS("epilogue, ", ""));
  // 105 rows each; on AVX-512 N = 192, as no 2 to 3 panels of 32 divide 160.
  check_dense_path_act(210, 600, AVX512(160, 192), 2, 1, 2, "split M");
  check_dense_path_act(210, 600, AVX512(160, 192), 2, 1, 1, PANELS("epilogue, ", ""));
  // The epilogue apart, as its own pass over C, where the fused path would walk a large
  // B unpacked (K too long for one block) or, on AVX-512, is slower (few rows).
  // (AVX-512 reads an activation B of up to 64 rows in place: 66 rows there.)
  const int apart[][4] = {{AVX512(64, 66), 3000, 768, 2}, {AVX512(40, 66), 2400, 512, 1},
                          {66, 768, 3072, 2}};
  for (int k = 0; k < 3; k++) {
    if (k == 2 && !host_avx512()) break;
    dump_begin();
    check_dense(apart[k][0], apart[k][1], apart[k][2], 1, TU_F32, 1, apart[k][3]);
    cr_expect(script_has(PANELS("", "")) && !script_has("epilogue"),
              "%dx%dx%d: the epilogue fused, or not the packed path", apart[k][0], apart[k][1],
              apart[k][2]);
    dump_end();
  }
  // M = N, 256 rows a thread: a plain matmul would split M, with an epilogue N stays.
  check_dense_path_act(512, 256, 512, 2, 1, 2,
                       AVX512("A tiles copied, threads split N", "B read in place, threads split N"));
}

// N between one and four vectors, not a multiple of one (plan_masked): the whole row of
// C as one masked register tile, a peeled rest of rows, at 1 and 2 threads; on AVX2 k
// blocks when B outgrows L1 (24 KiB blocks). AVX-512 takes up to 12 rows a tile (24
// accumulators) and no k blocks: 12 + 5 rows, 11 + 11 + 11 + 4, 12 alone.
Test(perf_paths, matmul_masked_narrow_n) {
  check_dense_path(17, 1000, 31, 1,
                   AVX512("masked N, threads split none, blocks [0, 0, 200], register tile 3x32",
                          "masked N, threads split none, blocks [0, 0, 0], register tile 12x32"));
  check_dense_path(37, 2000, 27, 1,
                   AVX512("masked N, threads split none, blocks [0, 0, 200], register tile 3x32",
                          "masked N, threads split none, blocks [0, 0, 0], register tile 11x32"));
  check_dense_path(12, 1000, 31, 1, AVX512("register tile 3x32", "register tile 12x32"));
  check_dense_path(130, 257, 20, 1, "masked N, threads split none, blocks [0, 0, 0]");
  // A rest row; 1 valid lane in the last vector. N above one vector (8 or 16 lanes).
  check_dense_path(97, 61, AVX512(13, 29), 1, "masked N");
  check_dense_path(19, 5, AVX512(9, 17), 1, "masked N");
  check_dense_path(1000, 600, 30, 2, "split M");  // 500 rows a thread
  check_dense_path(1000, 600, 30, 2, "masked N");
  check_dense_path(1000, 600, 30, 2, AVX512("blocks [0, 0, 200]", "blocks [0, 0, 0], register tile 12x32"));
  // With an epilogue (apart: a fused tile of that odd width ran 40x slower), and with
  // f16 inputs (extended in the masked contraction).
  check_dense_path_act(17, 1000, 31, 1, 1, 2, "17x1000x31, masked N");
  check_dense_path_act(19, 5, AVX512(9, 17), 1, 1, 1, "masked N");
  dump_begin();
  check_dense(17, 1000, 31, 1, TU_F16, 1, 2);
  check_dense(19, 40, AVX512(13, 29), 1, TU_F16, 0, 0);
  cr_expect(script_has("17x1000x31, masked N"), "f16 17x1000x31: not masked");
  cr_expect(script_has(AVX512("19x40x13, masked N", "19x40x29, masked N")),
            "f16 19x40xN: not masked");
  dump_end();
  // The masked-off lanes are never stored, so their accumulator steps are plain FMAs:
  // no selects left (jit__cpu_drop_mask_selects), for the full and the rest row tiles.
  static const int no_select[][3] = {{17, 1000, 31}, {130, 257, 20}, {19, 5, 17}};
  for (int k = 0; k < 3; k++) {
    dump_begin();
    check_dense(no_select[k][0], no_select[k][1], no_select[k][2], 1, TU_F32, 0, 0);
    cr_expect(script_has("masked N"), "%dx%dx%d: not masked", no_select[k][0],
              no_select[k][1], no_select[k][2]);
    cr_expect(!dump_has("-04-bufferized.mlir", "arith.select"),
              "%dx%dx%d: masked accumulator selects left", no_select[k][0],
              no_select[k][1], no_select[k][2]);
    dump_end();
  }
}

Test(perf_paths, fused_bias_activation) {
  static const int s[][3] = {{1, 768, 384}, {4, 64, 96}, {17, 33, 31}, {32, 256, 384},
                             {64, 64, 200}, {97, 61, 131}};
  for (size_t i = 0; i < sizeof s / sizeof *s; i++) {
    check_dense(s[i][0], s[i][1], s[i][2], 1, TU_F32, 1, 2);
    check_dense(s[i][0], s[i][1], s[i][2], 2, TU_F32, 1, 1);
  }
}

Test(perf_paths, matmul_f16) {
  static const int s[][3] = {{1, 64, 96}, {17, 100, 31}, {64, 128, 96}, {33, 70, 200}};
  for (size_t i = 0; i < sizeof s / sizeof *s; i++) {
    check_dense(s[i][0], s[i][1], s[i][2], 1, TU_F16, 0, 0);
    check_dense(s[i][0], s[i][1], s[i][2], 2, TU_F16, 1, 2);
  }
}

//===--- Batched matmuls --------------------------------------------------===//

// act(x W [+ b]) for x of rank rx and W of rank rw (batch dims, NumPy broadcasting; b
// over N); act 0 = none, 1 = relu, 2 = gelu. Checks against ref_matmul and, unless
// `needle` is NULL, that the strategy wrote `needle` into the script.
static void check_batched(int rx, const int64_t *dx_in, int rw, const int64_t *dw_in,
                          int threads, DLDataType dt, int bias, int act,
                          const char *needle) {
  int64_t dx[8], dw[8];
  memcpy(dx, dx_in, sizeof(int64_t) * (size_t)rx);
  memcpy(dw, dw_in, sizeof(int64_t) * (size_t)rw);
  if (needle && !kThreadsSplit && strstr(needle, "split")) {
    if (strstr(needle, "split the batch") && !strstr(needle, "vector x matrix"))
      needle = "split each matmul";
    else if (!strstr(needle, "split each matmul"))
      needle = "threads split none";
  }
  if (needle) dump_begin();
  jit_context *ctx = ctx_threads(threads);
  jit_graph *g = tu_graph(ctx, "batched");
  int64_t K = dx[rx - 1], N = dw[rw - 1], sbias[1] = {N};
  jit_value x = jit_input(g, "x", dt, rx, dx), w = jit_input(g, "w", dt, rw, dw);
  jit_value y = jit_matmul(g, x, w);
  if (bias) y = jit_add(g, y, jit_input(g, "b", dt, 1, sbias));
  if (act == 1) y = jit_relu(g, y);
  if (act == 2) y = jit_gelu(g, y);
  jit_output(g, y);
  TU_OK(jit_graph_finalize(g));

  int64_t nx = 1, nw = 1, dc[8];
  for (int d = 0; d < rx; d++) nx *= dx[d];
  for (int d = 0; d < rw; d++) nw *= dw[d];
  int rc = ref_matmul(NULL, rx, dx, NULL, rw, dw, NULL, dc);
  cr_assert(rc > 0);
  int64_t nc = 1;
  for (int d = 0; d < rc; d++) nc *= dc[d];
  ref_rng rng;
  ref_rng_seed(&rng, (uint64_t)(nx * 1000003 + nw * 1009 + N));
  float *a = tu_malloc(sizeof(float) * (size_t)nx), *b = tu_malloc(sizeof(float) * (size_t)nw);
  float *bb = tu_malloc(sizeof(float) * (size_t)N), *want = tu_malloc(sizeof(float) * (size_t)nc);
  ref_rng_fill_signed(&rng, a, nx);
  ref_rng_fill_signed(&rng, b, nw);
  ref_rng_fill_signed(&rng, bb, N);
  bool f16 = tu_is_f16(dt);
  if (f16) {  // the kernel sees the inputs rounded to f16
    ref_round_f16_array(a, nx);
    ref_round_f16_array(b, nw);
    ref_round_f16_array(bb, N);
  }
  ref_matmul(a, rx, dx, b, rw, dw, want, dc);
  bias_act_ref(want, nc, N, bias ? bb : NULL, act);
  void *da = tu_input_data(dt, a, nx), *db = tu_input_data(dt, b, nw);
  void *dbias = tu_input_data(dt, bb, N);
  DLTensor ins[3] = {tu_tensor(da, dt, rx, dx), tu_tensor(db, dt, rw, dw),
                     tu_tensor(dbias, dt, 1, sbias)};
  char what[160];
  snprintf(what, sizeof what, "batched %s rank %d x rank %d, K=%lld N=%lld, %s threads=%d",
           act == 1 ? "relu" : act == 2 ? "gelu" : "matmul", rx, rw, (long long)K,
           (long long)N, f16 ? "f16" : "f32", threads);
  check_matmul_result(g, ins, bias ? 3 : 2, dt, rc, dc, want, K, what);
  if (needle) {
    cr_expect(script_has(needle), "%s: script lacks `%s` (has: %s)", what, needle,
              script_choices());
    dump_end();
  }
  free_bufs((void *[]){a, b, bb, want, da, db, dbias}, 7);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// q K^T with K stored as a key cache is, (batch..., N, D): x (batch..., M, D) times
// transpose(k) over its last two dims, against the C reference; `needle` as in
// check_batched.
static void check_batched_kt_in(int r, const int64_t *dq, int64_t N, int threads,
                                DLDataType dt, const char *needle, const char *absent,
                                const char *absent_in, const char *threaded_needle) {
  if (needle && !kThreadsSplit && strstr(needle, "split")) needle = "threads split none";
  if (needle) dump_begin();
  int64_t sq[8], sk[8], dkt[8], dc[8], nq = 1, nk = 1;
  int perm[8];
  for (int d = 0; d < r; d++) {
    sq[d] = sk[d] = dq[d];
    perm[d] = d;
  }
  sk[r - 2] = N;
  perm[r - 2] = r - 1;
  perm[r - 1] = r - 2;
  for (int d = 0; d < r; d++) {
    nq *= sq[d];
    nk *= sk[d];
  }
  jit_context *ctx = ctx_threads(threads);
  jit_graph *g = tu_graph(ctx, "qkt");
  jit_value q = jit_input(g, "q", dt, r, sq);
  jit_value k = jit_transpose(g, jit_input(g, "k", dt, r, sk), perm);
  jit_output(g, jit_matmul(g, q, k));
  TU_OK(jit_graph_finalize(g));
  ref_rng rng;
  ref_rng_seed(&rng, (uint64_t)(nq * 31 + nk));
  float *a = tu_malloc(sizeof(float) * (size_t)nq), *b = tu_malloc(sizeof(float) * (size_t)nk);
  float *bt = tu_malloc(sizeof(float) * (size_t)nk);
  ref_rng_fill_signed(&rng, a, nq);
  ref_rng_fill_signed(&rng, b, nk);
  bool f16 = tu_is_f16(dt);
  if (f16) {
    ref_round_f16_array(a, nq);
    ref_round_f16_array(b, nk);
  }
  ref_transpose(b, r, sk, perm, bt, dkt);
  int rc = ref_matmul(NULL, r, sq, NULL, r, dkt, NULL, dc);
  cr_assert_eq(rc, r);
  int64_t nc = 1;
  for (int d = 0; d < rc; d++) nc *= dc[d];
  float *want = tu_malloc(sizeof(float) * (size_t)nc);
  ref_matmul(a, r, sq, bt, r, dkt, want, dc);
  void *da = tu_input_data(dt, a, nq), *db = tu_input_data(dt, b, nk);
  DLTensor ins[2] = {tu_tensor(da, dt, r, sq), tu_tensor(db, dt, r, sk)};
  char what[128];
  snprintf(what, sizeof what, "q K^T rank %d, %lldx%lldx%lld %s threads=%d", r,
           (long long)sq[r - 2], (long long)sq[r - 1], (long long)N, f16 ? "f16" : "f32",
           threads);
  check_matmul_result(g, ins, 2, dt, rc, dc, want, sq[r - 1], what);
  if (needle) {
    cr_expect(script_has(needle), "%s: script lacks `%s` (has: %s)", what, needle,
              script_choices());
    if (absent)
      cr_expect(!dump_has(absent_in, absent), "%s: %s has `%s`", what, absent_in, absent);
    if (threaded_needle && kThreadsSplit)
      cr_expect(script_has(threaded_needle), "%s: script lacks `%s`", what, threaded_needle);
    dump_end();
  }
  free_bufs((void *[]){a, b, bt, want, da, db}, 6);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// check_batched_kt_in, `absent` looked for in the optimized LLVM IR.
static void check_batched_kt(int r, const int64_t *dq, int64_t N, int threads, DLDataType dt,
                             const char *needle, const char *absent) {
  check_batched_kt_in(r, dq, N, threads, dt, needle, absent, "-07-llvm-optimized.ll", NULL);
}

static void check_bmm(int64_t Bt, int64_t M, int64_t K, int64_t N, int threads,
                      DLDataType dt, const char *needle) {
  const int64_t dx[3] = {Bt, M, K}, dw[3] = {Bt, K, N};
  check_batched(3, dx, 3, dw, threads, dt, 0, 0, needle);
}

// Without k blocks the fill is fused into the register tiles (their sums start at zero
// in registers, lowering/cpu/): peeled rows, threads, a batch; with k blocks it stays
// its own pass. Exact either way. (With an epilogue, f16's rounding included, the fill
// was already fused with the tiles.)
static void check_fill_fused(int M, int K, int N, int threads, DLDataType dt, bool fused) {
  dump_begin();
  check_dense(M, K, N, threads, dt, 0, 0);
  cr_expect(script_has("%vff0 = transform.structured.match ops{[\"linalg.fill\"]}") == fused,
            "%dx%dx%d threads=%d: fill %s the register tiles", M, K, N, threads,
            fused ? "not fused into" : "fused into");
  dump_end();
}

Test(perf_paths, fill_fused_into_register_tiles) {
  check_fill_fused(128, 32, 128, 1, TU_F32, true);
  check_fill_fused(131, 90, 128, 1, TU_F32, true);  // peeled rows
  check_fill_fused(512, 64, 512, 2, TU_F32, true);  // split over threads
  check_fill_fused(67, 1000, 256, 1, TU_F32, false);  // k blocks of 200
  // Packed B without k blocks (256^3: kc = K), peeled rows (4 of 256 in 6-row tiles on
  // AVX-512); with k blocks (512^3) not.
  check_fill_fused(256, 256, 256, 1, TU_F32, true);
  check_fill_fused(256, 256, 256, 2, TU_F32, true);
  check_fill_fused(512, 512, 512, 1, TU_F32, WHOLE_K(false, true));  // k blocks, or not
  const int64_t dx[3] = {12, 128, 64}, dw[3] = {12, 64, 128};
  check_batched(3, dx, 3, dw, 2, TU_F32, 0, 0, "%vff0 = transform.structured.match");
}

// Equal batch dims on both operands: linalg.batch_matmul, a loop over the batch whose
// body is a 2-D matmul planned like any other (masked, packed, small M), the batch
// split across threads by whole matmuls when there is enough work.
Test(perf_paths, batch_matmul_is_a_loop_of_planned_matmuls) {
  check_bmm(5, 17, 64, 31, 1, TU_F32, "a batch of 5, threads split each matmul");
  check_bmm(5, 17, 64, 31, 1, TU_F32, "masked N");
  check_bmm(3, 96, 300, 200, 2, TU_F32, "a batch of 3, threads split the batch");
  check_bmm(2, 128, 512, 256, 2, TU_F32, "a batch of 2, threads split the batch");
  check_bmm(2, 128, 512, 256, 2, TU_F32, "B packed");
  check_bmm(2, 128, 512, 256, 2, TU_F32, "threads split none");
  check_bmm(4, 3, 768, 129, 1, TU_F32, "matmul 0: 3x768x129");
  // Uneven shares (2 + 1) of matmuls large enough to split by themselves.
  check_bmm(3, 256, 256, 256, 2, TU_F32, "a batch of 3, threads split each matmul");
  check_bmm(3, 256, 256, 256, 2, TU_F32,  // as check_dense_path(256, 256, 256, 2)
            host_big_l2() ? "threads split M" : "threads split N");
  // M = 1: a batch of vector x matrix, n tiles of 8 vectors over k blocks (a prime K
  // peeled), the batch split across threads from 2^23 multiply-adds.
  check_bmm(12, 1, 64, 1000, 1, TU_F32, "a batch of 12 vector x matrix 1x64x1000");
  check_bmm(3, 1, 1009, 77, 1, TU_F32, "k blocks 8");
  check_bmm(4, 1, 768, 3072, 2, TU_F32, "vector x matrix 1x768x3072, threads split the batch");
  // Or from as much B as one core's L2 holds, and 2 MiB (a decode step's q K^T, 3 MiB).
  check_bmm(12, 1, 64, 1024, 2, TU_F32,
            host_l2() <= (3 << 20) ? "vector x matrix 1x64x1024, threads split the batch"
                                   : "vector x matrix 1x64x1024, threads split none");
  check_bmm(5, 1, 40, 33, 2, TU_F16, "vector x matrix");
  check_bmm(2, 1, 7, 50, 1, TU_F32, "k blocks 0");
  // The n tiles inside the k blocks, so each k block streams whole rows of B; a prime
  // K and an N of 2 tiles + 44 peeled.
  const char *k_outer = AVX512("%bn0, %bnl0 = transform.structured.tile_using_for %bk0 "
                               "tile_sizes [0, 0, 64, 0]",
                               "%bn0, %bnl0 = transform.structured.tile_using_for %bk0 "
                               "tile_sizes [0, 0, 128, 0]");
  check_bmm(2, 1, 2048, 1024, 1, TU_F32, k_outer);
  check_bmm(2, 1, 1031, 300, 2, TU_F32, k_outer);
  // A unit N or K would fold away with the batch dim: plain loops, exact.
  check_bmm(3, 17, 40, 1, 2, TU_F32, NULL);
  check_bmm(2, 5, 1, 9, 1, TU_F16, NULL);
  check_bmm(1, 40, 50, 61, 2, TU_F32, "matmul 0: 40x50x");  // a batch of one: its matmul
  check_bmm(2, 64, 64, 64, 2, TU_F32, "a batch of 2, threads split each matmul");
  check_bmm(3, 17, 33, 45, 1, TU_F16, "a batch of 3");
  check_bmm(7, 13, 20, 11, 2, TU_F16, "a batch of 7");
  // Rank 4: the batch dims become one.
  const int64_t dx[4] = {2, 3, 9, 20}, dw[4] = {2, 3, 20, 11};
  check_batched(4, dx, 4, dw, 2, TU_F32, 0, 0, "a batch of 6");
  check_batched(4, dx, 4, dw, 1, TU_F32, 1, 2, "a batch of 6");
}

// x W with x batched and W 2-D: one matmul over all of x's rows, its elementwise
// consumers (bias over N, activation) computed in that shape so the epilogue fuses.
Test(perf_paths, batched_x_times_w_is_one_matmul) {
  const int64_t x1[3] = {3, 7, 64}, w1[2] = {64, 48};
  check_batched(3, x1, 2, w1, 1, TU_F32, 0, 0, "matmul 0: 21x64x48,");
  const int64_t x2[3] = {4, 16, 100}, w2[2] = {100, 288};
  check_batched(3, x2, 2, w2, 1, TU_F32, 1, 2, "matmul 0: 64x100x288 + epilogue");
  const int64_t x3[3] = {2, 128, 256}, w3[2] = {256, 256};
  check_batched(3, x3, 2, w3, 2, TU_F32, 1, 1, PANELS("matmul 0: 256x256x256 + epilogue, ", ""));
  const int64_t x4[4] = {2, 3, 5, 33}, w4[2] = {33, 45};
  check_batched(4, x4, 2, w4, 1, TU_F16, 1, 2, "matmul 0: 30x33x");  // N split on AVX2
  check_batched(4, x4, 2, w4, 2, TU_F32, 0, 1, "matmul 0: 30x33x");
}

// Batch dims that broadcast (one operand's is 1, or missing on x) stay a generic
// contraction: exact, not planned.
// Batch dims where only x has them after equal leading ones (grouped-query attention's
// q (B, H, G, S, D) against k^T (B, H, 1, D, S)) fold into x's rows: a batch of B H
// matmuls of G S rows each; W's unit batch dims alone make x W one matmul.
Test(perf_paths, x_only_batch_dims_fold_into_rows) {
  const int64_t x1[5] = {2, 3, 4, 9, 20}, w1[5] = {2, 3, 1, 20, 11};
  check_batched(5, x1, 5, w1, 1, TU_F32, 0, 0, "matmul 0: 36x20x11,");
  check_batched(5, x1, 5, w1, 2, TU_F32, 1, 2, "matmul 0: 36x20x11");
  const int64_t x2[4] = {4, 7, 33, 64}, w2[4] = {4, 1, 64, 130};
  check_batched(4, x2, 4, w2, 2, TU_F32, 1, 1, "matmul 0: 231x64x");
  check_batched(4, x2, 4, w2, 1, TU_F16, 0, 0, "matmul 0: 231x64x");
  const int64_t x3[3] = {5, 17, 40}, w3[3] = {1, 40, 72};
  check_batched(3, x3, 3, w3, 1, TU_F32, 1, 2, "matmul 0: 85x40x");
}

// A decode step's q K^T against a key cache stored (B, H, S, D): up to 4 rows a
// matmul, D a whole number of 16, as a batch of dot products along D, no copy of K
// transposed per call (12x1x64 against 12x1024x64: 326 -> 153 us, 2 threads 351 ->
// 60). Odd key counts (peeled column tiles), f16, both thread counts.
Test(perf_paths, decode_q_kt_dot_products) {
  const int64_t q1[3] = {12, 1, 64}, q2[4] = {2, 3, 2, 32}, q3[3] = {5, 4, 128};
  // The tiles' 8 sums reduced as one tree (jit__cpu_tree_reductions), not one
  // shuffle ladder (rdx.shuf) per sum: 12x1x64x1024 115 -> 104 us.
  check_batched_kt(3, q1, 1024, 2, TU_F32,
                   "a batch of 12 1x64x1024, B transposed, dot products, threads split the "
                   "batch",
                   "rdx.shuf");
  check_batched_kt(4, q2, 77, 1, TU_F32, "a batch of 6 2x32x77, B transposed, dot products",
                   NULL);
  check_batched_kt(3, q3, 50, 1, TU_F16, "a batch of 5 4x128x50, B transposed, dot products",
                   NULL);
  check_batched_kt(3, q1, 33, 1, TU_F16, "a batch of 12 1x64x33, B transposed, dot products",
                   NULL);
  const int64_t q4[3] = {3, 5, 64}, q5[3] = {3, 1, 40};
  check_batched_kt(3, q4, 20, 1, TU_F32, NULL, NULL);  // 5 rows: K^T its own op
  check_batched_kt(3, q5, 20, 2, TU_F32, NULL, NULL);  // D not a multiple of 16
}

// With more rows (a prefill's q K^T) K^T is its own op, planned (16x16 tiles) before the
// batch loop: fused into it, the transpose ran unvectorized inside every register tile
// (12x128x64x128 at 1 thread: 364 -> 146 us; 12x512x64x512 5.9 -> 2.4 ms). Nothing is
// left unvectorized; odd sizes and both thread counts (f16 exact).
Test(perf_paths, prefill_q_kt_transpose_planned_ahead) {
  const int64_t q1[3] = {12, 128, 64}, q2[3] = {3, 37, 48}, q3[4] = {2, 3, 20, 32};
  check_batched_kt_in(3, q1, 128, 1, TU_F32, "a batch of 12", "linalg.generic",
                      "-03-tiled-vectorized.mlir", NULL);
  check_batched_kt_in(3, q2, 100, 2, TU_F32, "a batch of 3", "linalg.generic",
                      "-03-tiled-vectorized.mlir", NULL);
  check_batched_kt_in(4, q3, 45, 1, TU_F32, "a batch of 6", "linalg.generic",
                      "-03-tiled-vectorized.mlir", NULL);
  // With the batch split across threads, so is K^T (by the batch): 2 threads,
  // 12x128x64x128 90 -> 70 us.
  check_batched_kt_in(3, q1, 128, 2, TU_F32, "a batch of 12, threads split the batch",
                      "linalg.generic", "-03-tiled-vectorized.mlir",
                      "tile_using_forall %ew0 tile_sizes [6, 0, 0]");
  // f16: its A's extension to f32 stays fused into the batch loop (a generic there).
  check_batched_kt(4, q3, 45, 1, TU_F16, "a batch of 6", NULL);
  // A long D (256) with up to 48 rows: dot products along D after all, K read as stored
  // (12x8x256x512 at 1 thread: 859 -> 292 us); 64 rows keep K^T.
  const int64_t q4[3] = {12, 8, 256}, q5[3] = {3, 37, 256}, q6[3] = {2, 64, 256};
  check_batched_kt(3, q4, 512, 1, TU_F32, "a batch of 12 8x256x512, B transposed, dot products",
                   NULL);
  check_batched_kt(3, q5, 100, 2, TU_F32, "a batch of 3 37x256x100, B transposed, dot products",
                   NULL);
  check_batched_kt(3, q5, 77, 1, TU_F16, "B transposed, dot products", NULL);
  check_batched_kt(3, q6, 128, 1, TU_F32, "a batch of 2, threads split", NULL);
}

// Batch dims that broadcast other than as more rows (x's 1 against W's larger dim, a
// 2-D x times a batched W, W's 1 before a dim equal on both) are copied out to the
// result's batch dims, x's first and then W's if that is not enough, and run as a batch
// of planned matmuls. They were one generic's loops: 128x768 times 4x768x768 took 375
// ms, against 4.4.
Test(perf_paths, broadcast_batch_dims_copied_out) {
  const int64_t x1[3] = {1, 9, 20}, w1[3] = {4, 20, 11};
  check_batched(3, x1, 3, w1, 2, TU_F32, 1, 1, "a batch of 4,");
  const int64_t x2[2] = {9, 20}, w2[3] = {4, 20, 11};
  check_batched(2, x2, 3, w2, 1, TU_F32, 0, 0, "a batch of 4,");
  const int64_t x3[4] = {3, 1, 9, 20}, w3[3] = {2, 20, 11};
  check_batched(4, x3, 3, w3, 1, TU_F16, 1, 2, "a batch of 6,");
  const int64_t x4[4] = {3, 2, 37, 19}, w4[4] = {1, 2, 19, 23};
  check_batched(4, x4, 4, w4, 1, TU_F32, 0, 0, "a batch of 6,");
  const int64_t x5[5] = {2, 1, 3, 17, 20}, w5[5] = {1, 4, 1, 20, 9};
  check_batched(5, x5, 5, w5, 2, TU_F32, 1, 0, "a batch of 24,");
  const int64_t x6[2] = {1, 64}, w6[3] = {12, 64, 129};
  check_batched(2, x6, 3, w6, 2, TU_F32, 0, 0, "a batch of 12 vector x matrix");
}

// f16 matmuls with more than one row extend A to f32 first (its own op, fused into the
// row tiles), and pack their f16 B as f32 ones do: fused (the f16 rounding on the
// tile) and plain (6x64 on AVX-512); odd rows, both thread counts.
Test(perf_paths, matmul_f16_packed) {
  static const int s[][3] = {{96, 512, 384}, {61, 640, 1024}, {37, 300, 200}};
  for (size_t i = 0; i < sizeof s / sizeof *s; i++) {
    for (int t = 1; t <= 2; t++) {
      dump_begin();
      check_dense(s[i][0], s[i][1], s[i][2], t, TU_F16, t == 2, t == 2 ? 2 : 0);
      char ext[96];
      snprintf(ext, sizeof ext, "tensor<%dx%dxf32>, tensor<%dx%dxf16>", s[i][0], s[i][1],
               s[i][1], s[i][2]);
      cr_expect(dump_has("-00-graph.mlir", ext), "f16 %dx%dx%d: A not extended first",
                s[i][0], s[i][1], s[i][2]);
      if (i < 2)
        cr_expect(script_has("B packed"), "f16 %dx%dx%d threads=%d: B not packed", s[i][0],
                  s[i][1], s[i][2], t);
      dump_end();
    }
  }
}

// A transpose (an elementwise op reading its input through a permuted map): L x L
// tiles (L = lanes), transposed in registers, both loops peeled, the partial tiles in
// rows of one (when either extent is not a multiple of L); exact.
static void check_transpose_2d(int64_t R, int64_t C, int threads, DLDataType dt) {
  dump_begin();
  jit_context *ctx = ctx_threads(threads);
  jit_graph *g = tu_graph(ctx, "transpose");
  int64_t d[2] = {R, C}, dout[2];
  const int perm[2] = {1, 0};
  jit_output(g, jit_transpose(g, jit_input(g, "x", dt, 2, d), perm));
  TU_OK(jit_graph_finalize(g));
  ref_rng rng;
  ref_rng_seed(&rng, (uint64_t)(R * 31 + C));
  float *x = tu_malloc(sizeof(float) * (size_t)(R * C));
  float *want = tu_malloc(sizeof(float) * (size_t)(R * C));
  ref_rng_fill_signed(&rng, x, R * C);
  void *px = tu_input_data(dt, x, R * C);
  ref_transpose(x, 2, d, perm, want, dout);
  DLTensor in = tu_tensor(px, dt, 2, d);
  char what[96];
  snprintf(what, sizeof what, "transpose %lldx%lld %s threads=%d", (long long)R,
           (long long)C, tu_is_f16(dt) ? "f16" : "f32", threads);
  tu_run_check(g, &in, 1, dt, 2, dout, want, 0.0, 0.0, NULL, what);
  cr_expect(script_has(AVX512("tile_sizes [8, 8]", "tile_sizes [16, 16]")),
            "%s: not tiled for a transposed read", what);
  int64_t L = AVX512(8, 16);
  bool partial = (R > L && R % L) || (C > L && C % L);
  cr_expect(script_has("jit_ewrest} in %f") == partial &&
                script_has("tile_using_for %vq0 tile_sizes [1, 0]") == partial,
            "%s: partial tiles %s in rows of one", what, partial ? "not" : "but");
  dump_end();
  free(x);
  free(want);
  free(px);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(perf_paths, transpose_tiles) {
  check_transpose_2d(37, 1000, 1, TU_F32);
  check_transpose_2d(1001, 17, 2, TU_F16);
  check_transpose_2d(2048, 768, 2, TU_F32);  // split across threads
  check_transpose_2d(64, 48, 1, TU_F32);
  check_transpose_2d(333, 77, 1, TU_F32);
}

// act(x W^T + b) with W stored N x K (a PyTorch Linear's weight) against plain C; with
// `needle`, the path the script names.
// act(x W^T [+ b]) with W stored N x K (a PyTorch Linear's weight) and x of rank `rx`
// (`dx`, K last); as check_batched otherwise.
static void check_linear_x(int rx, const int64_t *dx, int64_t N, int threads, DLDataType dt,
                           int act, const char *needle) {
  if (needle && !kThreadsSplit && strstr(needle, "split")) needle = "threads split none";
  if (needle) dump_begin();
  int64_t K = dx[rx - 1], M = 1;
  for (int d = 0; d < rx - 1; d++) M *= dx[d];
  int64_t sw[2] = {N, K}, sb[1] = {N}, dwt[2], dc[8];
  const int perm[2] = {1, 0};
  jit_context *ctx = ctx_threads(threads);
  jit_graph *g = tu_graph(ctx, "linear");
  jit_value w = jit_transpose(g, jit_input(g, "w", dt, 2, sw), perm);
  jit_value y = jit_matmul(g, jit_input(g, "x", dt, rx, dx), w);
  if (act) y = jit_add(g, y, jit_input(g, "b", dt, 1, sb));
  if (act == 1) y = jit_relu(g, y);
  if (act == 2) y = jit_gelu(g, y);
  jit_output(g, y);
  TU_OK(jit_graph_finalize(g));
  ref_rng rng;
  ref_rng_seed(&rng, (uint64_t)(M * 7 + K * 11 + N));
  float *x = tu_malloc(sizeof(float) * (size_t)(M * K));
  float *wv = tu_malloc(sizeof(float) * (size_t)(N * K));
  float *wt = tu_malloc(sizeof(float) * (size_t)(N * K));
  float *bb = tu_malloc(sizeof(float) * (size_t)N);
  float *want = tu_malloc(sizeof(float) * (size_t)(M * N));
  ref_rng_fill_signed(&rng, x, M * K);
  ref_rng_fill_signed(&rng, wv, N * K);
  ref_rng_fill_signed(&rng, bb, N);
  bool f16 = tu_is_f16(dt);
  if (f16) {
    ref_round_f16_array(x, M * K);
    ref_round_f16_array(wv, N * K);
    ref_round_f16_array(bb, N);
  }
  ref_transpose(wv, 2, sw, perm, wt, dwt);
  int rc = ref_matmul(x, rx, dx, wt, 2, dwt, want, dc);
  cr_assert_eq(rc, rx);
  bias_act_ref(want, M * N, N, act ? bb : NULL, act);
  void *pw = tu_input_data(dt, wv, N * K), *px = tu_input_data(dt, x, M * K);
  void *pb = tu_input_data(dt, bb, N);
  int64_t sx[8];
  memcpy(sx, dx, sizeof(int64_t) * (size_t)rx);
  DLTensor ins[3] = {tu_tensor(pw, dt, 2, sw), tu_tensor(px, dt, rx, sx),
                     tu_tensor(pb, dt, 1, sb)};
  char what[128];
  snprintf(what, sizeof what, "x W^T rank %d, %lldx%lldx%lld %s act=%d threads=%d", rx,
           (long long)M, (long long)K, (long long)N, f16 ? "f16" : "f32", act, threads);
  check_matmul_result(g, ins, act ? 3 : 2, dt, rc, dc, want, K, what);
  if (needle) {
    cr_expect(script_has(needle), "%s: script lacks `%s` (has: %s)", what, needle,
              script_choices());
    dump_end();
  }
  free_bufs((void *[]){x, wv, wt, bb, want, pw, px, pb}, 8);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

static void check_linear(int64_t M, int64_t K, int64_t N, int threads, DLDataType dt,
                         int act, const char *needle) {
  const int64_t dx[2] = {M, K};
  check_linear_x(2, dx, N, threads, dt, act, needle);
}

// x W^T with up to 17 rows reads W through a transposed map (16x16 / 8x8 register
// transposes, k remainders peeled; 9-17 rows in two row tiles, each n tile's rows of W
// read by both). With more rows, a packed B is packed from W in
// register-transposed tiles: with n blocks (the transpose fused into each), without
// (40x1024x512 on AVX-512: one block of all N, k blocks of 128), split across threads,
// and with an epilogue (then apart). Otherwise (k blocks not whole tiles, B unpacked,
// f16) W's transposed copy, then the matmul.
Test(perf_paths, linear_weight_layout) {
  check_linear(100, 512, 1024, 1, TU_F32, 0, "B packed from W^T");
  check_linear(40, 1024, 512, 1, TU_F32, 0, "B packed from W^T");
  check_linear(100, 512, 1024, 2, TU_F32, 0, "B packed from W^T");
  check_linear(200, 512, 384, 1, TU_F32, 1, "200x512x384, B packed from W^T");
  check_linear(41, 520, 1024, 1, TU_F32, 0, AVX512("B packed from W^T", "B packed, threads"));
  check_linear(41, 520, 1000, 1, TU_F32, 0, NULL);
  // N not a whole number of register tiles (1000: 960 + 40 on AVX-512, 992 + 8 on
  // AVX2): split while still reading W through (n, k), so the whole-tile part packs B
  // from its own rows of W (it read slices of a whole transposed copy of W before).
  const char *odd = AVX512("64x512x992, B packed from W^T", "64x512x960, B packed from W^T");
  check_linear(64, 512, 1000, 1, TU_F32, 0, odd);
  check_linear(64, 512, 1000, 2, TU_F32, 2, odd);
  check_linear(64, 512, 1000, 1, TU_F16, 1, odd);
  check_linear(130, 100, 1001, 2, TU_F32, 0, NULL);
  check_linear(30, 64, 96, 1, TU_F32, 2, NULL);
  check_linear(1, 768, 3072, 2, TU_F32, 0,
               "1x768x3072, B transposed, dot products, threads split N");
  check_linear(3, 100, 45, 1, TU_F32, 2, "3x100x45, B transposed");
  check_linear(8, 1000, 333, 1, TU_F32, 1, "8x1000x333, B transposed");
  check_linear(5, 7, 19, 1, TU_F32, 0, "B transposed");
  check_linear(9, 300, 333, 2, TU_F32, 1, "matmul 0: 9x300x333, B transposed, threads split");
  check_linear(12, 766, 200, 1, TU_F32, 0, "B transposed, threads split none, register tile 6x");
  check_linear(13, 100, 77, 1, TU_F32, 2, "B transposed, threads split none, register tile 7x");
  check_linear(16, 256, 512, 2, TU_F32, 0, "16x256x512, B transposed");
  check_linear(17, 768, 512, 1, TU_F32, 0, "17x768x512, B transposed");
  check_linear(18, 256, 512, 1, TU_F32, 0, "18x256x512, B packed from W^T");
  check_linear(3, 300, 333, 1, TU_F16, 2, NULL);
  // f16 W too, its L x L tiles transposed as f16 (it was copied transposed first:
  // 64x768x3072 3.0-3.2 ms, now 2.4; x W 2.3).
  check_linear(100, 512, 1024, 2, TU_F16, 0, "100x512x1024, B packed from W^T");
  check_linear(37, 1024, 512, 1, TU_F16, 1, "37x1024x512, B packed from W^T");
  check_linear(200, 512, 384, 1, TU_F16, 2, "200x512x384, B packed from W^T");
}

// x W^T with up to 17 rows and K of 2 vectors or more (4 above 4 rows, 8 above 12):
// register tiles of dot products along k (plan_matmul_dot), f16 (before, W^T was
// copied per call: 1x768x3072 1.0 ms against 0.18) and f32; peeled row and column
// tiles, an epilogue, both thread counts. Shorter K keeps the transposes, and f16 the
// copy.
Test(perf_paths, linear_dot_products) {
  check_linear(1, 768, 3072, 2, TU_F16, 0, "1x768x3072, B transposed, dot products");
  check_linear(4, 256, 1000, 1, TU_F16, 2, "4x256x1000, B transposed, dot products");
  check_linear(13, 768, 97, 1, TU_F16, 1, "13x768x97, B transposed, dot products");
  check_linear(17, 768, 40, 2, TU_F16, 0, "17x768x40, B transposed, dot products");
  check_linear(1, 512, 37, 1, TU_F32, 0, "1x512x37, B transposed, dot products");
  check_linear(3, 768, 130, 2, TU_F32, 2, "3x768x130, B transposed, dot products");
  check_linear(4, 256, 1000, 1, TU_F32, 0, "4x256x1000, B transposed, dot products");
  check_linear(16, 256, 130, 2, TU_F32, 1, "16x256x130, B transposed, dot products");
  check_linear(9, 32, 200, 1, TU_F32, 0,  // K short for 9 rows (AVX-512: 2 vectors)
               AVX512("9x32x200, B transposed, dot products", "9x32x200, B transposed, threads"));
  check_linear(12, 64, 256, 2, TU_F16, 1, "12x64x256, B transposed, dot products");
  check_linear(3, 32, 1000, 1, TU_F16, 0, "3x32x1000, B transposed, dot products");
  check_linear(5, 240, 64, 1, TU_F16, 0, NULL);
}

// x times a vector w (K x 1) with K a multiple of 16 and 256 or more: x's rows dot w,
// planned as the one-row w^T x^T reading x through the transposed map (it was a
// matmul of one-lane columns, unthreaded: 128x768x1 16 us against 5.8 now); a batch of
// them (K >= 256, f16 64) as a batch of such (it was not planned).
Test(perf_paths, matrix_times_vector_dot_products) {
  check_dense_path(128, 768, 1, 2, "1x768x128, B transposed, dot products");
  check_dense_path(2048, 1024, 1, 2, "1x1024x2048, B transposed, dot products, threads split N");
  check_dense_path(37, 272, 1, 1, "1x272x37, B transposed, dot products");
  check_dense_path(1, 256, 1, 1, "1x256x1, B transposed, dot products");
  check_dense_path_act(33, 512, 1, 1, 1, 2, "1x512x33, B transposed, dot products");
  check_dense(45, 256, 1, 2, TU_F16, 1, 1);
  check_dense(45, 250, 1, 1, TU_F32, 0, 0);  // K not a multiple of 16: the matmul
  // Batched x: folded into rows against a 2-D w, a batch against a batch of vectors.
  const int64_t x1[3] = {4, 33, 256}, w1[2] = {256, 1}, w2[3] = {4, 256, 1};
  const int64_t x3[4] = {2, 3, 17, 64}, w3[4] = {2, 3, 64, 1};
  check_batched(3, x1, 2, w1, 1, TU_F32, 1, 0, "1x256x132, B transposed, dot products");
  check_batched(3, x1, 3, w2, 2, TU_F32, 0, 1, "a batch of 4 1x256x33, B transposed, dot");
  check_batched(4, x3, 4, w3, 1, TU_F16, 0, 0, "a batch of 6 1x64x17, B transposed, dot");
  check_batched(4, x3, 4, w3, 1, TU_F32, 0, 0, NULL);  // f32 K < 256: unplanned loops
}

// x W^T with x batched (a decode step's (B, 1, D), a short sequence): its batch dims are
// more rows, so up to 17 of them read W through the transposed map (4x1x768 times W^T
// took 2.9 ms as a transposed copy of W and a batch, against 0.44 as 4 rows); x (1, 1,
// K) times a 2-D W is one vector x matrix, not a batch of one.
Test(perf_paths, linear_batched_rows) {
  const int64_t x1[3] = {4, 1, 768}, x2[3] = {2, 8, 100}, x3[4] = {1, 3, 1, 512};
  const int64_t x4[3] = {3, 7, 64}, x5[3] = {1, 1, 96};
  check_linear_x(3, x1, 300, 2, TU_F32, 0, "4x768x300, B transposed");
  check_linear_x(3, x1, 257, 1, TU_F16, 2, "4x768x257, B transposed, dot products");
  check_linear_x(3, x2, 45, 1, TU_F32, 1, "16x100x45, B transposed");
  check_linear_x(4, x3, 64, 1, TU_F32, 0, "3x512x64, B transposed");
  check_linear_x(3, x4, 33, 1, TU_F32, 2, NULL);  // 21 rows: W^T its own op (B small)
  check_linear_x(3, x5, 130, 1, TU_F32, 0, "1x96x130, B transposed");
  check_batched(3, x5, 2, (const int64_t[]){96, 130}, 1, TU_F32, 0, 0, "matmul 0: 1x96x128,");
}

// N not a whole number of the plain register tile's width (64 columns on AVX-512, 16
// on AVX2) is split into a matmul over whole tiles and one over the rest (masked
// between one and four vectors), each planned on its own; threads split both parts as
// they would the whole. With an epilogue it then runs apart, except where N is whole
// default tiles (32 columns on AVX-512): 288 stays one fused matmul.
Test(perf_paths, odd_n_split_in_two) {
  check_dense_path(128, 300, 1000, 1,
                   AVX512("matmul 1: 128x300x8,", "matmul 1: 128x300x40, masked"));
  check_dense_path(128, 300, 1000, 2, AVX512("matmul 0: 128x300x992, B packed",
                                             "matmul 0: 128x300x960, B read in place, threads split"));
  check_dense_path(128, 300, 1000, 2, AVX512("matmul 1: 128x300x8, threads split",
                                             "matmul 1: 128x300x40, masked N, threads split"));
  check_dense_path(131, 90, 97, 1, AVX512("matmul 1: 131x90x1,", "matmul 1: 131x90x33, masked"));
  check_dense_path_act(67, 200, 300, 1, 1, 2, AVX512("matmul 1: 67x200x12", "matmul 1: 67x200x44"));
  check_dense_path_act(67, 200, 288, 1, 1, 2, "matmul 0: 67x200x288 + epilogue");
  check_dense_path_act(23, 64, 70, 2, 1, 1, "matmul 1: 23x64x");
  check_dense_path(16, 64, 70, 1, "matmul 1: 16x64x6,");  // few rows too
  check_linear(100, 256, 999, 1, TU_F32, 1, AVX512("matmul 1: 100x256x7", "matmul 1: 100x256x39"));
  check_linear(100, 256, 999, 2, TU_F16, 2, "matmul 1: 100x256x");
  check_dense(45, 130, 333, 1, TU_F16, 1, 2);
}

// The same kernel at 1 and 2 threads gives bit-identical results: no split crosses a
// reduction dim.
Test(perf_paths, identical_across_thread_counts) {
  const int M = 96, K = 300, N = 600;  // over 2^24 multiply-adds: threaded
  float *out[2];
  ref_rng rng;
  ref_rng_seed(&rng, 7);
  float *a = tu_malloc(sizeof(float) * M * K), *b = tu_malloc(sizeof(float) * K * N);
  ref_rng_fill_signed(&rng, a, M * K);
  ref_rng_fill_signed(&rng, b, K * N);
  int64_t sa[2] = {M, K}, sb[2] = {K, N}, sc[2] = {M, N};
  for (int t = 0; t < 2; t++) {
    jit_context *ctx = ctx_threads(t + 1);
    jit_graph *g = tu_graph(ctx, "mm");
    jit_value va = jit_input(g, "a", TU_F32, 2, sa);
    jit_value vb = jit_input(g, "b", TU_F32, 2, sb);
    jit_output(g, jit_matmul(g, va, vb));
    TU_OK(jit_graph_finalize(g));
    out[t] = tu_malloc(sizeof(float) * M * N);
    DLTensor ins[2] = {tu_tensor(a, TU_F32, 2, sa), tu_tensor(b, TU_F32, 2, sb)};
    DLTensor o = tu_tensor(out[t], TU_F32, 2, sc);
    TU_OK(jit_run(g, ins, 2, &o, 1));
    jit_graph_destroy(g);
    jit_context_destroy(ctx);
  }
  cr_expect(memcmp(out[0], out[1], sizeof(float) * M * N) == 0,
            "1 and 2 threads differ");
  free(out[0]);
  free(out[1]);
  free(a);
  free(b);
}

