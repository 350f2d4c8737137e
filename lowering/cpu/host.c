//===--- host.c - the host description every CPU plan reads ---------------===//
#include "lowering/cpu/host.h"

#include <stdbool.h>
#include <string.h>


// Whether LLVM's feature list `features` ("+a,-b,+c") turns `name` on: the last
// item naming it exactly says ("+avx512f" is not "+avx512fp16").
static bool has_feature(const char *features, const char *name) {
  bool on = false;
  size_t len = strlen(name);
  for (const char *p = features; p && *p;) {
    const char *end = strchr(p, ',');
    size_t n = end ? (size_t)(end - p) : strlen(p);
    if (n == len + 1 && memcmp(p + 1, name, len) == 0) on = p[0] == '+';
    p += n + (end ? 1 : 0);
  }
  return on;
}

// The host for `features` and `l2_bytes` (0: 512 KiB, the Zen 3 machine most block
// sizes here were measured on). L1d is 32 KiB on every host measured; L3 is 0 here
// (jit__cpu_host_of sets the target's).
jit__cpu_host jit__cpu_host_make(const char *features, int64_t l2_bytes, int cores) {
  jit__cpu_host h = {.l1 = 32 << 10, .l2 = l2_bytes > 0 ? l2_bytes : 512 << 10,
                     .l3 = 0, .cores = cores > 1 ? cores : 1};
  // AVX-512: 8x32 (16 of 32 zmm), and 6x64 (24) for plain matmuls that pack B
  // (plan_matmul.c says why); 12x32 was within 3 % of 8x32 at 256^3, 512^3 and 1024^3.
  if (has_feature(features, "avx512f")) {
    h.lanes = 16, h.acc = 24, h.tm = 8, h.tn = 32, h.ptm = 6, h.ptn = 64;
  } else if (has_feature(features, "avx2") && has_feature(features, "fma")) {
    // AVX2: 6x16 (12 accumulators) measured 1.1-1.3x faster than 4x16 at 64x768x3072
    // and 512^3 on Zen 3 (more FMAs per load of B), 8x16 and 3x32 slower.
    h.lanes = 8, h.acc = 12, h.tm = 6, h.tn = 16, h.ptm = 6, h.ptn = 16;
  } else {
    h.lanes = 4, h.acc = 12, h.tm = 4, h.tn = 8, h.ptm = 4, h.ptn = 8;
  }
  return h;
}

jit__cpu_host jit__cpu_host_of(const jit__lower_options *o) {
  jit__cpu_host h = jit__cpu_host_make(o->features, o->l2_bytes, o->num_threads);
  h.l3 = o->l3_bytes > 0 ? o->l3_bytes : 0;
  return h;
}

// A block size for a loop of `n`: a divisor of n near `target`, preferably a multiple
// of `reg`, so that every block has the same static size. 0 means "do not block"
// (n is small, or has no divisor in [target/2, 2 target]).
int64_t jit__cpu_pick_block(int64_t n, int64_t target, int64_t reg) {
  if (n <= target + target / 2) return 0;
  int64_t best = 0;
  for (int pass = 0; pass < 2 && !best; pass++) {
    for (int64_t d = 0; d <= target; d++) {
      int64_t cand[2] = {target - d, target + d};
      for (int c = 0; c < 2; c++) {
        int64_t b = cand[c];
        if (b < target / 2 || b > 2 * target || b <= 0 || n % b) continue;
        if (pass == 0 && b % reg) continue;
        best = b;
        break;
      }
      if (best) break;
    }
  }
  return best;
}

// Bytes of B from which a small-M matmul (or a batch of them) is split across threads
// (plan_matmul): more than one core's L2 holds, and at least 2 MiB. Then the second
// core's share of memory bandwidth, and its own L2, pay for the fork/join; below, the
// split lost or gained nothing (1x256x1024, 1 MiB: 7.9 us unsplit, 8.9 split; the MLP
// example's 7x784x256). From 4 MiB it was: 1x512x1024 34 -> 30 us split, 4x768x768
// 73 -> 55 us, a decode step's q K^T 12x1x64x1024 (3 MiB of K) 111 -> 18 us (each
// core's half of K then stays in its L2 across calls; oneDNN 58 us).
double jit__cpu_split_b_bytes(jit__cpu_host h) {
  return (double)(h.l2 > (2 << 20) ? h.l2 : (2 << 20));
}
