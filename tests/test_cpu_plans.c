//===--- test_cpu_plans.c - the CPU matmul plans, without MLIR ------------===//
//
// Calls jit__cpu_plan_matmul directly with explicit hosts (AVX2 and AVX-512; 512 KiB,
// 1 MiB and 2 MiB of L2) and checks choices measured and kept on purpose
// (lowering/cpu/plan_matmul.c says why each is made). No MLIR context.
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

// Small M is GEMV-like: no packing, k blocks of ~8 rows, split over N by B's bytes.
Test(cpu_plans, small_m) {
  jit__cpu_mm_plan p = plan(AVX512, 2 << 20, 2, 1, 768, 3072);
  cr_expect(p.small_m);
  cr_expect(!p.packed);
  cr_expect_eq(p.kc, 8);
  cr_expect_eq(p.split, 1);
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
