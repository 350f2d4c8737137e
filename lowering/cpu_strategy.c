//===--- cpu_strategy.c - how each linalg op of a kernel becomes fast code -===//
//
// One transform-dialect script per kernel, written for its concrete shapes. Every
// linalg op the strategy handles is tagged (`jit_mm`, `jit_ep`, `jit_f`, `jit_ew`,
// `jit_rd` = i) so the script can find it again after other ops were rewritten.
//
// Matmul (`linalg.matmul`, f32 or f16 inputs, f32 accumulator), with its elementwise
// consumer G when it has exactly one (bias + activation, or the f16 truncation):
//   1. threads: `tile_using_forall` on the root (G, else the matmul) over M, or over N
//      when M is small, with the producers fused into the forall;
//   2. cache blocks [mc, nc] (N outer, so a kc x nc block of B stays in L2 while the M
//      blocks stream through), fusing the fill and matmul into each block;
//   3. plain matmul: k blocks of kc, then the register tile [TM, TN, 1]; fused: the
//      register tile [TM, TN] of G with the matmul tile fused in and its k loop inside,
//      so bias + activation run on the accumulator while it is still in registers;
//   4. vectorize, hoist the accumulator out of the k loop, outer-product FMAs.
// Block sizes are divisors of the dims (a multiple of the register tile when there is
// one), so every block is static; a register loop with a partial last tile is peeled,
// and the static remainder vectorizes with narrower vectors rather than running scalar.
// An N that is not a whole number of register tiles is split first into two matmuls,
// whole tiles and the rest, each planned on its own ("Odd N").
// Two variants of that (f32): when a thread's part of B does not fit in L2, B is
// packed per [kc, nc] block into contiguous panels in a stack buffer, and each row
// tile of A per k block into a small one (plan_packed; with an epilogue, kc = K so
// that it still runs on the finished register tile); when N is between one and four
// vectors and not a whole number of them (17x1000x31, no epilogue), each row block of
// C is one masked register tile (plan_masked).
//
// Elementwise generics (after linalg-fuse-elementwise-ops made chains into one) are
// split across threads over dim 0, tiled [1, ..., 1, V] and vectorized. An elementwise
// op that reads a row reduction (softmax's division by the sum, normalizations) is the
// root of a row loop into which its producers (max, exp, sum) are fused, so each row
// is read from memory once. Other reductions over the last dim are split across
// threads over their parallel dims. Reduction inner loops are left to LLVM, which
// vectorizes them once cpu_vmath.c marks their adds reassociable. Kernels that write
// large outputs once store them non-temporally ("Streaming" below).
//
// Threads: OpenMP through convert-scf-to-openmp rather than a pool in devices/cpu,
// because the split is then decided per op inside the kernel (a pool would need one
// entry per parallel loop, or a kernel ABI taking tile ranges), a kernel stays one
// function with one C signature, and libomp's fork/join costs a few microseconds,
// which only ops large enough to be split ever pay. Results do not depend on the
// thread count: no split crosses a reduction dim, so every sum is formed in the same
// order whatever the number of threads.
//
//===----------------------------------------------------------------------===//
#include "lowering/cpu_strategy.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <mlir-c/AffineExpr.h>
#include <mlir-c/AffineMap.h>

#include "base/status.h"
#include "base/text.h"

//===--- Text ------------------------------------------------------------===//

// base/text.h's printf under a short name: the script is written in hundreds of calls.
static void sb_printf(jit__text *sb, const char *fmt, ...) JIT__PRINTF(2, 3);
static void sb_printf(jit__text *sb, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  jit__text_vprintf(sb, fmt, ap);
  va_end(ap);
}

#define ANY "!transform.any_op"

// "(!transform.any_op, ... n times)".
static void sb_types(jit__text *sb, int n) {
  sb_printf(sb, "(");
  for (int i = 0; i < n; i++) sb_printf(sb, "%s" ANY, i ? ", " : "");
  sb_printf(sb, ")");
}

// Peels the scf.for that handle `loop` holds, its partial last iteration split off
// into a loop of its own: %<prefix><i> becomes %<prefix><i>m (the whole tiles) and
// %<prefix><i>r (the rest).
static void sb_peel(jit__text *sb, const char *prefix, int i, const char *loop) {
  sb_printf(sb,
            "  %%%s%d = transform.cast %s : " ANY " to !transform.op<\"scf.for\">\n"
            "  %%%s%dm, %%%s%dr = transform.loop.peel %%%s%d : (!transform.op<\"scf.for\">) "
            "-> (!transform.op<\"scf.for\">, !transform.op<\"scf.for\">)\n",
            prefix, i, loop, prefix, i, prefix, i, prefix, i);
}

// The handle "%<prefix><i>", or its result "%<prefix><i>#<sub>" when sub >= 0, in `buf`.
static const char *handle(char buf[32], const char *prefix, int i, int sub) {
  if (sub >= 0)
    snprintf(buf, 32, "%%%s%d#%d", prefix, i, sub);
  else
    snprintf(buf, 32, "%%%s%d", prefix, i);
  return buf;
}

//===--- Host and shapes -------------------------------------------------===//

// The register file decides the register tile: a TM x TN accumulator plus one row of
// B and a broadcast of A must fit. AVX-512: 32 zmm; AVX2: 16 ymm; SSE: 16 xmm.
typedef struct host {
  int lanes;    // f32 lanes per vector register
  int acc;      // vector registers the accumulator may take
  int tm, tn;   // default register tile
  int ptm, ptn; // register tile of plain f32 matmuls above 16 rows (no epilogue)
  int64_t l2;   // bytes of L2 per core
} host;

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

// The host for `o`: its vector registers, and its L2 (`o->l2_bytes`, part of every
// kernel's cache key), or 512 KiB (the Zen 3 machine most block sizes here were measured
// on) when that is not known.
static host host_of(const jit__lower_options *o) {
  const char *features = o->features;
  int64_t l2 = o->l2_bytes > 0 ? o->l2_bytes : 512 << 10;
  // AVX-512: 8x32 (16 of 32 zmm), and 6x64 (24) for plain matmuls that pack B
  // (plan_matmul says why); 12x32 was within 3 % of 8x32 at 256^3, 512^3 and 1024^3.
  if (has_feature(features, "avx512f")) return (host){16, 24, 8, 32, 6, 64, l2};
  // AVX2: 6x16 (12 accumulators) measured 1.1-1.3x faster than 4x16 at 64x768x3072 and
  // 512^3 on Zen 3 (more FMAs per load of B), 8x16 and 3x32 slower.
  if (has_feature(features, "avx2") && has_feature(features, "fma"))
    return (host){8, 12, 6, 16, 6, 16, l2};
  return (host){4, 12, 4, 8, 4, 8, l2};
}

// A block size for a loop of `n`: a divisor of n near `target`, preferably a multiple
// of `reg`, so that every block has the same static size. 0 means "do not block"
// (n is small, or has no divisor in [target/2, 2 target]).
static int64_t pick_block(int64_t n, int64_t target, int64_t reg) {
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

//===--- Op inspection ---------------------------------------------------===//

static bool op_is(MlirOperation op, const char *name) {
  MlirStringRef s = mlirIdentifierStr(mlirOperationGetName(op));
  return s.length == strlen(name) && memcmp(s.data, name, s.length) == 0;
}

static void set_tag(MlirContext ctx, MlirOperation op, const char *tag, int i) {
  mlirOperationSetDiscardableAttributeByName(
      op, mlirStringRefCreateFromCString(tag),
      mlirIntegerAttrGet(mlirIntegerTypeGet(ctx, 64), i));
}

static int64_t shaped_bytes(MlirType t) {
  MlirType e = mlirShapedTypeGetElementType(t);
  int64_t bits = mlirTypeIsAFloat(e) ? (int64_t)mlirFloatTypeGetWidth(e)
                 : mlirTypeIsAInteger(e) ? (int64_t)mlirIntegerTypeGetWidth(e) : 0;
  if (bits <= 0) return -1;
  int64_t n = 1;
  for (intptr_t d = 0; d < mlirShapedTypeGetRank(t); d++) n *= mlirShapedTypeGetDimSize(t, d);
  return n * ((bits + 7) / 8);
}

static bool static_shaped(MlirType t) {
  return mlirTypeIsARankedTensor(t) && mlirShapedTypeHasStaticShape(t);
}

// The generic's indexing map of operand `i` is the identity.
static bool map_is_identity(MlirOperation op, intptr_t i) {
  MlirAttribute maps =
      mlirOperationGetAttributeByName(op, mlirStringRefCreateFromCString("indexing_maps"));
  if (mlirAttributeIsNull(maps) || i >= mlirArrayAttrGetNumElements(maps)) return false;
  MlirAffineMap m = mlirAffineMapAttrGetValue(mlirArrayAttrGetElement(maps, i));
  return mlirAffineMapIsIdentity(m);
}

typedef struct collect {
  char buf[64];
  size_t len;
} collect;

static void collect_cb(MlirStringRef s, void *user) {
  collect *c = user;
  size_t n = s.length < sizeof c->buf - 1 - c->len ? s.length : sizeof c->buf - 1 - c->len;
  memcpy(c->buf + c->len, s.data, n);
  c->len += n;
  c->buf[c->len] = 0;
}

// Iterator kinds of a linalg.generic as 'p'/'r' (read by printing each
// #linalg.iterator_type attribute); returns the loop count or -1.
static int read_iterators(MlirOperation op, char *out, int cap) {
  MlirAttribute it =
      mlirOperationGetAttributeByName(op, mlirStringRefCreateFromCString("iterator_types"));
  if (mlirAttributeIsNull(it) || !mlirAttributeIsAArray(it)) return -1;
  intptr_t n = mlirArrayAttrGetNumElements(it);
  if (n > cap) return -1;
  for (intptr_t i = 0; i < n; i++) {
    collect c = {{0}, 0};
    mlirAttributePrint(mlirArrayAttrGetElement(it, i), collect_cb, &c);
    out[i] = strstr(c.buf, "reduction") ? 'r' : 'p';
  }
  return (int)n;
}

//===--- Plan ------------------------------------------------------------===//

typedef struct walk {
  MlirContext ctx;
  const jit__lower_options *o;
  host h;
  int threads;
  jit__text sb;
  int n_mm, n_ew, n_rd;
  bool parallel;
  bool unroll_k;  // a matmul of 2^24 multiply-adds or more ("Unrolled k loops")
  MlirOperation fused[64];  // generics taken as matmul epilogues
  int n_fused;
  MlirOperation claimed[64];  // generics fused into a row loop (below)
  int n_claimed;
  int n_row;
  int64_t pack[JIT__CPU_MAX_PACK][3];  // packed B buffers made: panels, kc, tn
  int n_pack;
  int64_t masked[64][3];  // per matmul: vector width V (0: not masked), rows, rest rows
  int n_masked;
  bool vecmat[64];  // per matmul: a batch of vector x matrix (plan_batch_vecmat)
  bool any_vecmat;
  bool transposes;  // an elementwise op tiled for a transposed read (plan_generic)
  bool ew_split;    // plan_generic splits the next op's outer loop across the threads
  bool ew_bcast[64];  // per elementwise op: an input broadcast along its vector dim
  // per elementwise op tiled for a transposed read with partial tiles: its transposed
  // loop and loop count (0, 0: none), for the rest tiles' rows (below)
  int ew_rest[64][2];
  bool fill_fused[64];
  // Generics a matmul's plan took: a transpose its B packing computes (plan_packed), or
  // a producer of A or B planned ahead of it (plan_matmul).
  MlirOperation taken_t[16];
  int n_taken_t;
  int64_t row_bytes, row_input_bytes;  // of the last row loop: one row, the whole input
} walk;

// The single elementwise consumer of a matmul that can be computed on its tiles.
static MlirOperation epilogue_of(MlirOperation mm) {
  MlirOperation none = {NULL};
  MlirValue r = mlirOperationGetResult(mm, 0);
  MlirOpOperand use = mlirValueGetFirstUse(r);
  if (mlirOpOperandIsNull(use)) return none;
  if (!mlirOpOperandIsNull(mlirOpOperandGetNextUse(use))) return none;
  MlirOperation g = mlirOpOperandGetOwner(use);
  if (!op_is(g, "linalg.generic") || mlirOperationGetNumResults(g) != 1) return none;
  char it[8];
  if (read_iterators(g, it, 8) != 2 || it[0] != 'p' || it[1] != 'p') return none;
  unsigned idx = mlirOpOperandGetOperandNumber(use);
  intptr_t n_ops = mlirOperationGetNumOperands(g);
  // Reads the matmul through the identity, writes through the identity.
  if (!map_is_identity(g, idx) || !map_is_identity(g, n_ops - 1)) return none;
  if (!static_shaped(mlirValueGetType(mlirOperationGetResult(g, 0)))) return none;
  return g;
}

//===--- Packed B (large matmuls) ----------------------------------------===//

// Bytes of one packed B block. The block lives in the kernel's stack frame (one per
// thread), not in a heap buffer or a workspace argument: a stack is already mapped and
// touched after the first call on a thread, so every later call reuses the same pages
// without malloc, without first-touch faults (~12 us per 4 KiB page here) and without
// a change to the kernel ABI; each OpenMP thread gets its own copy for free; and the
// size is fixed at compile time. 256 KiB (half of this L2, the usual GotoBLAS share)
// is well inside glibc's 8 MiB thread stacks and libomp's 4 MiB worker stacks.
// compile_cpu.c turns the buffer's heap allocation into that stack allocation.
#define JIT__PACK_BYTES (256 << 10)

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
static bool pack_plan(int64_t tM, int64_t tN, int64_t K, int64_t tn, bool fused, int64_t l2,
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

// GotoBLAS-style loops for a plain f32 matmul whose B does not fit in L2:
//   for n block (nc, the fill fused here)   for k block (kc)
//     pack B[k block, n block] into panels [nc/tn][kc][tn]   (contiguous, 8 x tn copies)
//     for m register tile
//       copy A[m tile, k block] into a [tm][kc] buffer
//       for n register tile   for k: tm x tn outer-product FMAs
// The register tiles stream their B panel from L1/L2 in address order instead of
// walking down B's columns N floats apart (at N = 1024 or 3072 every row of a tile
// maps to the same few cache sets, which is what held 1024^3 to ~40 GFLOP/s). The
// packing is the register tile's B operand padded (nofold, so the copy is kept) and
// hoisted above the two register loops by hoist_pad, which turns it into the loop
// filling the panels; each panel is then copied 8 rows at a time with vectors.
//
// With a fused epilogue G (`fused`: root is G's tile), kc = K and the loops are G's,
// the matmul and fill fused in at each level, so bias + activation run on the
// finished accumulator of each register tile as on the unpacked fused path:
//   for n block (nc)   pack B[:, n block]   for m tile   for n tile   k; G on the tile
static void plan_packed(walk *w, int i, const char *root, int64_t tM,
                        int64_t tN, int64_t K, int64_t tm, int64_t tn, int64_t nc,
                        int64_t kc, bool copy_a, bool fused, const char *a_ty,
                        const char *b_ty, bool b_tr, bool fill_tiles) {
  jit__text *sb = &w->sb;
  char hb[32];  // handle() text for sb_peel
  char cur[32];
  snprintf(cur, sizeof cur, "%s", root);
  int rows = kc % 8 == 0 ? 8 : kc % 4 == 0 ? 4 : kc % 2 == 0 ? 2 : 1;  // per panel copy
  if (nc < tN) {
    // n blocks with the fill fused in: each block's C columns are zeroed right before
    // they accumulate (never across k blocks: fusing the fill into a k loop would
    // zero C at every k block).
    sb_printf(sb, "  %%cb%d, %%cbl%d = transform.structured.fuse %s tile_sizes [0, %lld] "
                  ": (" ANY ") -> (" ANY ", " ANY ")\n",
              i, i, cur, (long long)nc);
    snprintf(cur, sizeof cur, "%%cb%d", i);
  }
  if (kc < K) {
    sb_printf(sb, "  %%kb%d, %%kbl%d = transform.structured.tile_using_for %s tile_sizes "
                  "[0, 0, %lld] : (" ANY ") -> (" ANY ", " ANY ")\n",
              i, i, cur, (long long)kc);
    snprintf(cur, sizeof cur, "%%kb%d", i);
  }
  if (fused)
    sb_printf(sb,
              "  %%rg%d, %%rl%d:2 = transform.structured.fuse %s tile_sizes [%lld, %lld] : "
              "(" ANY ") -> (" ANY ", " ANY ", " ANY ")\n"
              "  %%rt%d = transform.structured.match ops{[\"linalg.matmul\"]} in %%rl%d#1 "
              ": (" ANY ") -> " ANY "\n",
              i, i, cur, (long long)tm, (long long)tn, i, i);
  else if (fill_tiles && kc == K && i < 64) {
    // Without k blocks, the fill fused into the register tiles, as on the unpacked path
    // (plan_matmul): 256^3 157 -> 150 us (2 threads 86 -> 82), 192x256x512 241 -> 228,
    // 100x512x1024 at 2 threads 327 -> 306; 64x768x3072 the same.
    sb_printf(sb,
              "  %%rt%d, %%rl%d:2 = transform.structured.fuse %s tile_sizes "
              "[%lld, %lld, 0] : (" ANY ") -> (" ANY ", " ANY ", " ANY ")\n",
              i, i, cur, (long long)tm, (long long)tn);
    w->fill_fused[i] = true;
  } else
    sb_printf(sb,
              "  %%rt%d, %%rl%d:2 = transform.structured.tile_using_for %s tile_sizes "
              "[%lld, %lld, 0] : (" ANY ") -> (" ANY ", " ANY ", " ANY ")\n",
              i, i, cur, (long long)tm, (long long)tn);
  sb_printf(sb,
            "  %%pd%d, %%pp%d, %%pc%d = transform.structured.pad %%rt%d {padding_values = "
            "[0.0 : %s, 0.0 : %s, 0.0 : f32], padding_dimensions = [1], nofold_flags = "
            "[%d, 1, 0], copy_back_op = \"none\"} : (" ANY ") -> (" ANY ", " ANY ", " ANY ")\n"
            "  %%pb%d = transform.get_producer_of_operand %%pd%d[1] : (" ANY ") -> " ANY "\n"
            "  %%hp%d = transform.structured.hoist_pad %%pb%d by 2 loops : (" ANY ") -> " ANY
            "\n"
            "  %%hl%d = transform.get_parent_op %%hp%d {op_name = \"scf.for\"} : (" ANY
            ") -> " ANY "\n",
            i, i, i, i, a_ty, b_ty, copy_a ? 1 : 0, i, i, i, i, i, i);
  if (b_tr) {
    // B is a transpose of W (N x K): the panels are copied from W itself in L x L tiles,
    // each read as L rows of L contiguous k and transposed in registers, the transpose
    // fused into the packing loop instead of made whole beforehand. The slices between
    // W and the tile are merged first, so the tile reads the transpose directly.
    int L = w->h.lanes;
    w->transposes = true;
    sb_printf(sb,
              "  %%ht%d, %%htl%d:2 = transform.structured.tile_using_for %%hp%d tile_sizes "
              "[%d, %d] : (" ANY ") -> (" ANY ", " ANY ", " ANY ")\n"
              "  transform.apply_patterns to %%hl%d { "
              "transform.apply_patterns.tensor.merge_consecutive_insert_extract_slice } : "
              ANY "\n"
              "  %%ts%d = transform.get_producer_of_operand %%ht%d[0] : (" ANY ") -> " ANY "\n"
              "  %%tg%d = transform.get_producer_of_operand %%ts%d[0] : (" ANY ") -> " ANY "\n"
              "  %%tf%d, %%tfl%d = transform.structured.fuse_into_containing_op %%tg%d into "
              "%%htl%d#1 : (" ANY ", " ANY ") -> (" ANY ", " ANY ")\n"
              "  transform.structured.vectorize %%tf%d vector_sizes [%d, %d] : " ANY "\n"
              "  transform.structured.vectorize %%ht%d vector_sizes [%d, %d] : " ANY "\n",
              i, i, i, L, L, i, i, i, i, i, i, i, i, i, i, L, L, i, L, L);
  } else {
    sb_printf(sb,
              "  %%ht%d, %%htl%d = transform.structured.tile_using_for %%hp%d tile_sizes "
              "[%d, 0] : (" ANY ") -> (" ANY ", " ANY ")\n"
              "  transform.structured.vectorize %%ht%d vector_sizes [%d, %lld] : " ANY "\n",
              i, i, i, rows, i, rows, (long long)tn);
  }
  sb_printf(sb,
            "  transform.apply_patterns to %%hl%d { "
            "transform.apply_patterns.tensor.fold_tensor_subset_ops_into_vector_transfers } "
            ": " ANY "\n",
            i);
  if (tM % tm) sb_peel(sb, "qm", i, handle(hb, "rl", i, 0));
  // A's register tile [tm, kc] is copied into a contiguous buffer once per m tile (its
  // pad hoisted over the n register loop), so the tile's rows are kc floats apart
  // instead of K: at K = 1024 its 6 rows were 4 KiB apart, all in the same L1 sets as
  // each other. After the peel and a canonicalization, so that the padded tiles are
  // static; the peeled remainder rows get their own (smaller) copy. Only when the copy
  // fits a stack scratch buffer (jit__cpu_stack_buffers), not malloc'ed per tile.
  if (copy_a) {
    int64_t ka = 64;
    while (kc % ka) ka /= 2;
    sb_printf(sb,
              "  %%fa%d = transform.structured.match ops{[\"func.func\"]} in %%root : (" ANY
              ") -> " ANY "\n"
              "  transform.apply_patterns to %%fa%d { "
              "transform.apply_patterns.canonicalization } : " ANY "\n",
              i, i);
    // The pads left in the function are this matmul's A tiles (earlier matmuls' pads are
    // vectorized by now, later ones are not tiled yet); the peel's remainder loop may
    // have been folded away, so they are found from the function, not from the loops.
    sb_printf(sb,
              "  %%pa%d = transform.structured.match ops{[\"tensor.pad\"]} in %%fa%d : (" ANY
              ") -> " ANY "\n"
              "  transform.foreach %%pa%d : " ANY " {\n"
              "  ^bb0(%%pa%d_1: " ANY "):\n"
              "    %%ha%d = transform.structured.hoist_pad %%pa%d_1 by 1 loops : (" ANY
              ") -> " ANY "\n"
              "    %%hat%d, %%hatl%d:2 = transform.structured.tile_using_for %%ha%d "
              "tile_sizes [1, %lld] : (" ANY ") -> (" ANY ", " ANY ", " ANY ")\n"
              "    transform.structured.vectorize %%hat%d vector_sizes [1, %lld] : " ANY "\n"
              "  }\n",
              i, i, i, i, i, i, i, i, i, (long long)ka, i, (long long)ka);
  }
  sb_printf(sb,
            "  %%mmr%d = transform.structured.match ops{[\"linalg.matmul\"]} attributes "
            "{jit_mm = %d : i64} in %%root : (" ANY ") -> " ANY "\n"
            "  %%mk%d, %%mkl%d = transform.structured.tile_using_for %%mmr%d tile_sizes "
            "[0, 0, 1] : (" ANY ") -> (" ANY ", " ANY ")\n",
            i, i, i, i, i);
  if (w->n_pack < JIT__CPU_MAX_PACK) {
    w->pack[w->n_pack][0] = nc / tn;
    w->pack[w->n_pack][1] = kc;
    w->pack[w->n_pack][2] = tn;
    w->n_pack++;
  }
}

//===--- Masked narrow N -------------------------------------------------===//

// Bytes of B in one k block of a masked narrow-N matmul on AVX2 (plan_masked): most
// of L1d.
#define JIT__MASKED_B_BYTES (24 << 10)

// N below four vectors and not a multiple of one (17x1000x31): the whole row of C is
// one register tile of V = N rounded up to whole vectors, rows = as many as the
// accumulator registers hold (3 at V = 32 on AVX2, up to 12 on AVX-512), vectorized
// with masks. The last vector of each B row is a masked load and C is read and written
// once per tile with masks (hoisted out of the k loop like any accumulator). Peeling N
// instead left 15 of 31 columns to narrower vectors and one-column loops, at ~20
// GFLOP/s. Vectorized as a masked contraction (create_named_contraction), which lowers
// to one FMA per row and vector; without it the masked vectorization gave multiply,
// add and select on 1-lane vectors, which LLVM's SLP pass spent ~35 ms recombining
// (17x1000x31 on AVX-512: 58-63 ms to compile, 22-29 ms now). The selects that keep
// the masked-off lanes go (jit__cpu_drop_mask_selects): 11.3 -> 7.5 us.
// On AVX2, when B (K x V) outgrows L1, k blocks of kc rows (B's block ~24 KiB) come
// first, so every row tile reads the block from L1 rather than all of B from L2:
// 17x1000x31 13.0 us against 13.7-14.2 unblocked. C is read and written once per k
// block; each sum keeps its order, so the results do not change. Not on AVX-512: with
// up to 12-row tiles LLVM spilled accumulators in the blocked loops (9 rows: 9.4 us
// against 6.2), and unblocked was as fast or faster everywhere measured: 64x4000x60
// 172 us against 193, 40x8000x40 (2.5 MiB of B) 224 against 237, 64x1000x60 42-44
// against 45-47.
static void plan_masked(walk *w, int i, const char *root, int64_t tM, int64_t rows,
                        int64_t V, int64_t kc) {
  jit__text *sb = &w->sb;
  char hb[32];  // handle() text for sb_peel
  int64_t rest = tM % rows;
  char kroot[32];
  if (kc) {
    sb_printf(sb, "  %%mkb%d, %%mkbl%d = transform.structured.tile_using_for %s tile_sizes "
                  "[0, 0, %lld] : (" ANY ") -> (" ANY ", " ANY ")\n",
              i, i, root, (long long)kc);
    snprintf(kroot, sizeof kroot, "%%mkb%d", i);
    root = kroot;
  }
  if (rows < tM) {
    sb_printf(sb,
              "  %%rt%d, %%rl%d = transform.structured.tile_using_for %s tile_sizes "
              "[%lld, 0, 0] : (" ANY ") -> (" ANY ", " ANY ")\n",
              i, i, root, (long long)rows);
    if (rest) {
      sb_peel(sb, "qm", i, handle(hb, "rl", i, -1));
      sb_printf(sb,
                "  %%mr%d = transform.structured.match ops{[\"linalg.matmul\"]} in %%qm%dr : "
                "(!transform.op<\"scf.for\">) -> " ANY "\n"
                "  transform.annotate %%mr%d \"jit_mrest\" : " ANY "\n",
                i, i, i);
    }
  } else {
    rows = tM;
    rest = 0;
  }
  sb_printf(sb,
            "  %%mmr%d = transform.structured.match ops{[\"linalg.matmul\"]} attributes "
            "{jit_mm = %d : i64} in %%root : (" ANY ") -> " ANY "\n"
            "  %%mk%d, %%mkl%d = transform.structured.tile_using_for %%mmr%d tile_sizes "
            "[0, 0, 1] : (" ANY ") -> (" ANY ", " ANY ")\n",
            i, i, i, i, i);
  w->masked[i][0] = V;
  w->masked[i][1] = rows;
  w->masked[i][2] = rest;
  w->n_masked++;
}

// Half of L1d: the most of C a small-M matmul keeps across its k blocks.
#define JIT__L1_HALF (16 << 10)

// Bytes of B from which a small-M matmul (or a batch of them) is split across threads
// (plan_matmul): more than one core's L2 holds, and at least 2 MiB. Then the second
// core's share of memory bandwidth, and its own L2, pay for the fork/join; below, the
// split lost or gained nothing (1x256x1024, 1 MiB: 7.9 us unsplit, 8.9 split; the MLP
// example's 7x784x256). From 4 MiB it was: 1x512x1024 34 -> 30 us split, 4x768x768
// 73 -> 55 us, a decode step's q K^T 12x1x64x1024 (3 MiB of K) 111 -> 18 us (each
// core's half of K then stays in its L2 across calls; oneDNN 58 us).
static double split_b_bytes(host h) {
  return (double)(h.l2 > (2 << 20) ? h.l2 : (2 << 20));
}

// The op's indexing maps are `want` (`n_maps` maps of `n_res` plain loop dims each,
// over `n_dims` loops); an op without the attribute has its default maps, `absent_is`.
static bool maps_are(MlirOperation op, int n_maps, int n_dims, int n_res, const int *want,
                     bool absent_is) {
  MlirAttribute maps =
      mlirOperationGetAttributeByName(op, mlirStringRefCreateFromCString("indexing_maps"));
  if (mlirAttributeIsNull(maps)) return absent_is;
  if (!mlirAttributeIsAArray(maps) || mlirArrayAttrGetNumElements(maps) != n_maps)
    return false;
  for (int i = 0; i < n_maps; i++) {
    MlirAttribute a = mlirArrayAttrGetElement(maps, i);
    if (!mlirAttributeIsAAffineMap(a)) return false;
    MlirAffineMap m = mlirAffineMapAttrGetValue(a);
    if (mlirAffineMapGetNumDims(m) != n_dims || mlirAffineMapGetNumResults(m) != n_res)
      return false;
    for (int r = 0; r < n_res; r++) {
      MlirAffineExpr e = mlirAffineMapGetResult(m, r);
      if (!mlirAffineExprIsADim(e) || mlirAffineDimExprGetPosition(e) != want[i * n_res + r])
        return false;
    }
  }
  return true;
}

// linalg.batch_matmul's indexing maps are the default ones (no transposed or
// broadcast operand): A(b, m, k), B(b, k, n), C(b, m, n) over loops (b, m, n, k).
static bool batch_maps_plain(MlirOperation bm) {
  static const int want[9] = {0, 1, 3, 0, 3, 2, 0, 1, 2};
  return maps_are(bm, 3, 4, 3, want, true);
}

// Numbers matmul `mm` (the next i, tagged jit_mm = i) and tags its linalg.fill init,
// if it has one, jit_f = i.
static int tag_matmul(walk *w, MlirOperation mm, bool *has_fill) {
  int i = w->n_mm++;
  set_tag(w->ctx, mm, "jit_mm", i);
  MlirValue init = mlirOperationGetOperand(mm, 2);
  MlirOperation fill = mlirOpResultGetOwner(init);
  *has_fill = mlirValueIsAOpResult(init) && op_is(fill, "linalg.fill");
  if (*has_fill) set_tag(w->ctx, fill, "jit_f", i);
  return i;
}

// The batch loop of batch_matmul i (found by its tag `mm_tag`, its fill by `fill_tag`):
// with `split` an scf.forall dividing the batch among the threads (the fill fused in),
// then a loop over its matmuls one at a time (%b1_i the matmul, %bl_i the loop) with
// the fill fused into each.
static void batch_loop(walk *w, int i, const char *mm_tag, const char *fill_tag,
                       bool has_fill, bool split) {
  jit__text *sb = &w->sb;
  sb_printf(sb,
            "  %%bm%d = transform.structured.match ops{[\"linalg.batch_matmul\"]} attributes "
            "{%s = %d : i64} in %%root : (" ANY ") -> " ANY "\n",
            i, mm_tag, i);
  if (has_fill)
    sb_printf(sb,
              "  %%bf%d = transform.structured.match ops{[\"linalg.fill\"]} attributes "
              "{%s = %d : i64} in %%root : (" ANY ") -> " ANY "\n",
              i, fill_tag, i);
  char cur[32];
  snprintf(cur, sizeof cur, "%%bm%d", i);
  if (split) {
    w->parallel = true;
    sb_printf(sb,
              "  %%bt%d, %%bp%d = transform.structured.tile_using_forall %%bm%d num_threads "
              "[%d] : (" ANY ") -> (" ANY ", " ANY ")\n",
              i, i, i, w->threads);
    if (has_fill)
      sb_printf(sb,
                "  %%bpf%d, %%bp%d_1 = transform.structured.fuse_into_containing_op %%bf%d "
                "into %%bp%d : (" ANY ", " ANY ") -> (" ANY ", " ANY ")\n",
                i, i, i, i);
    snprintf(cur, sizeof cur, "%%bt%d", i);
  }
  sb_printf(sb,
            "  %%b1_%d, %%bl%d = transform.structured.fuse %s tile_sizes [1] : (" ANY
            ") -> (" ANY ", " ANY ")\n",
            i, i, cur);
}

// Batched matmuls (linalg.batch_matmul [Bt, M, K] x [Bt, K, N]) become a loop over the
// batch whose body is a 2-D linalg.matmul (and fill), which the rest of plan_matmul
// then treats like any other: the batch loop tiled by 1 (its fill fused in), the
// unit-batch ops generalized, their unit dim folded away (rank-reducing slices) and
// the generics specialized back into named ops, tagged jit_mm / jit_f = i. With
// `split`, the batch is first divided among the threads (scf.forall), each thread
// taking whole matmuls: no thread waits on another's part of a matmul, and no fork/join
// runs per matmul.
static void plan_batch(walk *w, int i, int64_t Bt, bool has_fill, bool split) {
  jit__text *sb = &w->sb;
  sb_printf(sb, "  // matmul %d: a batch of %lld, threads split %s\n", i, (long long)Bt,
            split ? "the batch" : "each matmul (below)");
  batch_loop(w, i, "jit_bm", "jit_bf", has_fill, split);
  sb_printf(sb, "  %%bg%d = transform.structured.generalize %%b1_%d : (" ANY ") -> " ANY "\n",
            i, i);
  if (has_fill)
    sb_printf(sb,
              "  %%bfi%d = transform.structured.match ops{[\"linalg.fill\"]} in %%bl%d : "
              "(" ANY ") -> " ANY "\n"
              "  %%bfg%d = transform.structured.generalize %%bfi%d : (" ANY ") -> " ANY "\n",
              i, i, i, i);
  sb_printf(sb,
            "  transform.apply_patterns to %%bl%d {\n"
            "    transform.apply_patterns.linalg.fold_unit_extent_dims_via_slices\n"
            "  } : " ANY "\n"
            "  %%bs%d = transform.structured.specialize %%bg%d : (" ANY ") -> " ANY "\n"
            "  %%bi%d = transform.param.constant %d : i64 -> !transform.param<i64>\n"
            "  transform.annotate %%bs%d \"jit_mm\" = %%bi%d : " ANY
            ", !transform.param<i64>\n",
            i, i, i, i, i, i, i);
  if (has_fill)
    sb_printf(sb,
              "  %%bfs%d = transform.structured.specialize %%bfg%d : (" ANY ") -> " ANY "\n"
              "  transform.annotate %%bfs%d \"jit_f\" = %%bi%d : " ANY
              ", !transform.param<i64>\n",
              i, i, i, i);
}

// Whether a batch of Bt matmuls M x K x N is split across the threads, a matmul per
// thread: when it has one for each and is worth splitting by multiply-adds or by the
// bytes of B (as in plan_matmul).
static bool batch_split(const walk *w, int64_t Bt, int64_t M, int64_t K, int64_t N) {
  return w->threads > 1 && Bt >= w->threads &&
         ((double)Bt * M * N * K >= (double)(1 << 23) ||
          (double)Bt * K * N * 4 >= split_b_bytes(w->h));
}

// A batch of vector x matrix products (batch_matmul with M = 1: attention's decode
// step, q K^T and p V for one token), as the small-M path treats one (plan_matmul): for
// each k block of ~8 rows of B, the row of C 8 vectors at a time. The batch_matmul is
// tiled as it is (batch by 1, k blocks, n by 8 vectors, k) and
// vectorized with its unit dims, which vector.cast_away_vector_leading_one_dim drops
// before the contraction becomes FMAs. Threads split the batch when it is worth
// splitting (as in plan_matmul) and has a matmul per thread.
static void plan_batch_vecmat(walk *w, MlirOperation bm, int64_t Bt, int64_t K, int64_t N) {
  bool has_fill;
  int i = tag_matmul(w, bm, &has_fill);
  jit__text *sb = &w->sb;
  char hb[32];  // handle() text for sb_peel
  host h = w->h;
  bool split = batch_split(w, Bt, 1, K, N);
  int64_t tn = 8 * h.lanes < N ? 8 * h.lanes : N;
  int64_t kb = pick_block(K, 8, 1);
  bool peel_k = false;
  if (!kb && K > 16) {
    kb = 8;
    peel_k = K % 8 != 0;
  }
  if (i < 64) w->vecmat[i] = true;
  w->any_vecmat = true;
  // Its k loops are not unrolled (unroll_k): with the k blocks outside the n tiles,
  // unrolled or not ran the same (2x1x2048x1024, 4x1x1024x1024, 8x1x4096x256, 1 and 2
  // threads), and unrolled took 6-10 ms longer to compile.
  sb_printf(sb, "  // matmul %d: a batch of %lld vector x matrix 1x%lldx%lld, threads split %s, "
                "n tile %lld, k blocks %lld\n",
            i, (long long)Bt, (long long)K, (long long)N, split ? "the batch" : "none",
            (long long)tn, (long long)kb);
  batch_loop(w, i, "jit_mm", "jit_f", has_fill, split);
  // k blocks outside the n tiles (as on the 2-D small-M path), so each block streams
  // whole rows of B: with the n tiles outside, every row was read in pieces of 8
  // vectors, one n tile at a time (1 thread: 2x1x2048x1024 1.03 -> 0.58 ms,
  // 2x1x1024x8192 4.3 -> 2.3, 8x1x4096x256 1.7 -> 1.2, 4x1x1000x999 0.62 -> 0.55;
  // 12x1x64x1024 and 12x1x1024x64 the same, at 2 threads 24 -> 19 and the same).
  char cur[32];
  snprintf(cur, sizeof cur, "%%b1_%d", i);
  if (kb) {
    sb_printf(sb,
              "  %%bkt%d, %%bkl%d = transform.structured.tile_using_for %%b1_%d tile_sizes "
              "[0, 0, 0, %lld] : (" ANY ") -> (" ANY ", " ANY ")\n",
              i, i, i, (long long)kb);
    if (peel_k) sb_peel(sb, "bkq", i, handle(hb, "bkl", i, -1));
    sb_printf(sb,
              "  %%bk%d = transform.structured.match ops{[\"linalg.batch_matmul\"]} "
              "attributes {jit_mm = %d : i64} in %%root : (" ANY ") -> " ANY "\n",
              i, i);
    snprintf(cur, sizeof cur, "%%bk%d", i);
  }
  sb_printf(sb,
            "  %%bn%d, %%bnl%d = transform.structured.tile_using_for %s tile_sizes "
            "[0, 0, %lld, 0] : (" ANY ") -> (" ANY ", " ANY ")\n",
            i, i, cur, (long long)tn);
  if (N % tn) sb_peel(sb, "bq", i, handle(hb, "bnl", i, -1));
}

// `v` is made by a plain transpose of the last two dims of a 2-D (or, batched, 3-D)
// tensor (a generic yielding its one input, read through (d1, d0) or (d0, d2, d1)) of
// f32 (or of f16 too, with `f16`), and read by nothing else than `user`.
static bool made_by_transpose(MlirValue v, MlirOperation user, bool f16) {
  static const int want[4] = {1, 0, 0, 1}, want3[6] = {0, 2, 1, 0, 1, 2};
  if (!mlirValueIsAOpResult(v)) return false;
  MlirOperation g = mlirOpResultGetOwner(v);
  if (!op_is(g, "linalg.generic") || mlirOperationGetNumOperands(g) != 2 ||
      mlirOperationGetNumResults(g) != 1 ||
      !(maps_are(g, 2, 2, 2, want, false) || maps_are(g, 2, 3, 3, want3, false)))
    return false;
  MlirOpOperand use = mlirValueGetFirstUse(v);
  if (mlirOpOperandIsNull(use) || !mlirOperationEqual(mlirOpOperandGetOwner(use), user) ||
      !mlirOpOperandIsNull(mlirOpOperandGetNextUse(use)))
    return false;
  MlirType t = mlirValueGetType(v);
  MlirType et = static_shaped(t) ? mlirShapedTypeGetElementType(t) : t;
  if (!static_shaped(t) || !(mlirTypeIsAF32(et) || (f16 && mlirTypeIsAF16(et)))) return false;
  MlirBlock body = mlirRegionGetFirstBlock(mlirOperationGetRegion(g, 0));
  MlirOperation y = mlirBlockGetFirstOperation(body);
  return !mlirOperationIsNull(y) && op_is(y, "linalg.yield") &&
         mlirOperationGetNumOperands(y) == 1 &&
         mlirValueEqual(mlirOperationGetOperand(y, 0), mlirBlockGetArgument(body, 0));
}

// linalg.matmul reads B through the map (m, n, k) -> (n, k): x W^T with W stored N x K
// (emit_mlir.c writes that for matmul(x, transpose(W))).
static bool b_transposed(MlirOperation mm) {
  static const int want[6] = {0, 2, 1, 2, 0, 1};
  return maps_are(mm, 3, 3, 2, want, false);
}

// The multiply and add of matmul `mm`'s body allowed to fuse into one FMA (LLVM
// contracts them only with this flag); the vector ops made from the body keep it.
static void contract_body(MlirContext ctx, MlirOperation mm) {
  MlirBlock body = mlirRegionGetFirstBlock(mlirOperationGetRegion(mm, 0));
  MlirAttribute contract =
      mlirAttributeParseGet(ctx, mlirStringRefCreateFromCString("#arith.fastmath<contract>"));
  for (MlirOperation op = mlirBlockGetFirstOperation(body); !mlirOperationIsNull(op);
       op = mlirOperationGetNextInBlock(op))
    if (op_is(op, "arith.mulf") || op_is(op, "arith.addf"))
      mlirOperationSetAttributeByName(op, mlirStringRefCreateFromCString("fastmath"), contract);
}

// Register tiles of x W^T as dot products along k (plan_matmul_bt, plan_batch_dot):
// each [tm, tn] tile of matmul i (`op`, linalg.matmul or linalg.batch_matmul, k its
// loop `kpos`) keeps tm x tn vectors of partial sums, one lane per k mod L
// (tile_reduction_using_for), adds x's L contiguous k times W's (both read as they are
// stored) into them per step, and reduces each vector across its lanes once at the
// end. Vectorized here; the peeled tiles' sizes folded first (canonicalization), as
// vectorize needs them static. The reductions may reassociate (the vector reductions
// in the function are the dot plans' at this point): in order, each was a chain of 16
// scalar adds (12x1x64x1024: 154 -> 112 us).
static void plan_matmul_dot(walk *w, int i, const char *op, int kpos, int64_t L) {
  char sizes[32];
  snprintf(sizes, sizeof sizes, kpos == 3 ? "0, 0, 0, %lld" : "0, 0, %lld", (long long)L);
  sb_printf(&w->sb,
            "  %%mmr%d = transform.structured.match ops{[\"%s\"]} attributes "
            "{jit_mm = %d : i64} in %%root : (" ANY ") -> " ANY "\n"
            "  %%dfn%d = transform.get_parent_op %%mmr%d {op_name = \"func.func\", "
            "deduplicate} : (" ANY ") -> " ANY "\n"
            "  transform.apply_patterns to %%dfn%d { transform.apply_patterns.canonicalization "
            "transform.apply_patterns.scf.for_loop_canonicalization } : " ANY "\n"
            "  %%mmd%d = transform.structured.match ops{[\"%s\"]} attributes "
            "{jit_mm = %d : i64} in %%root : (" ANY ") -> " ANY "\n"
            "  %%dfl%d, %%dsp%d, %%dcb%d, %%dlp%d = transform.structured."
            "tile_reduction_using_for %%mmd%d by tile_sizes = [%s] : (" ANY
            ") -> (" ANY ", " ANY ", " ANY ", " ANY ")\n"
            "  transform.structured.vectorize %%dsp%d : " ANY "\n"
            "  transform.structured.vectorize %%dcb%d : " ANY "\n"
            "  transform.structured.vectorize %%dfl%d : " ANY "\n"
            "  %%dpl%d = transform.get_parent_op %%dlp%d {deduplicate} : (" ANY ") -> " ANY
            "\n"
            "  transform.apply_patterns to %%dpl%d {\n"
            "    transform.apply_patterns.vector.transfer_permutation_patterns\n"
            "    transform.apply_patterns.vector.cast_away_vector_leading_one_dim\n"
            "    transform.apply_patterns.vector.lower_multi_reduction "
            "lowering_strategy = \"innerreduction\"\n"
            "  } : " ANY "\n"
            "  %%drd%d = transform.structured.match ops{[\"vector.reduction\"]} in %%dfn%d : "
            "(" ANY ") -> " ANY "\n"
            "  %%dfm%d = transform.param.constant #arith.fastmath<reassoc, contract> -> "
            "!transform.any_param\n"
            "  transform.annotate %%drd%d \"fastmath\" = %%dfm%d : " ANY
            ", !transform.any_param\n",
            i, op, i, i, i, i, i, op, i, i, i, i, i, i, sizes, i, i, i, i, i, i, i, i, i, i,
            i);
}

// linalg.batch_matmul reading B through (b, m, n, k) -> (b, n, k): q K^T with K stored
// (B, S, D), as attention's key cache is (emit_mlir.c).
static bool batch_b_transposed(MlirOperation bm) {
  static const int want[9] = {0, 1, 3, 0, 2, 3, 0, 1, 2};
  return maps_are(bm, 3, 4, 3, want, false);
}

// Whether a batch of M x K x N reading B through (b, n, k) is planned as dot products
// along k (plan_batch_dot): few rows, or a long K with up to 48 rows. Otherwise K is
// transposed first (jit__cpu_normalize, either way). Dot products against the
// transpose, 1 thread (2): 12x4x64x1024 113 us against 362, 12x8x256x512 292 (156)
// against 859 (439), 12x32x256x128 196 (92) against 283 (96), 12x48x256x256 628 (297)
// against 748 (369), 12x48x256x128 308 (143) against 336 (126), 12x64x256x128 413
// (192) against 404 (158), 12x128x256x128 892 against 714; 12x128x64x128 (short K)
// unplanned loops 649 us, transposed 133.
static bool batch_dot_rows(const host *h, int64_t M, int64_t K) {
  return K % h->lanes == 0 && (M <= 4 || (K >= 16 * h->lanes && M <= 48));
}

// A batch of x W^T with few rows (a decode step's q K^T: 12 heads of 1x64 against
// 1024x64 keys): the batch loop (split across threads as plan_batch_vecmat would),
// register tiles of up to 4 rows x 8 columns, each a set of dot products along k
// (plan_matmul_dot). Before, K was copied transposed per call (the transpose its own
// op): 12x1x64x1024 326 -> 153 us (2 threads 351 -> 60; K stored (B, D, S): 98),
// 12x2x64x1024 1.11 ms -> 0.24, f16 12x1x64x1024 226 -> 111 us. With D = 64 the four
// steps per dot product leave the reductions across lanes a large share.
static void plan_batch_dot(walk *w, MlirOperation bm, int64_t Bt, int64_t M, int64_t K,
                           int64_t N) {
  bool has_fill;
  int i = tag_matmul(w, bm, &has_fill);
  jit__text *sb = &w->sb;
  char hb[32];  // handle() text for sb_peel
  host h = w->h;
  bool split = batch_split(w, Bt, M, K, N);
  int64_t tm = M < 4 ? M : 4, tn = h.acc / tm < 8 ? h.acc / tm : 8;
  if (tn > N) tn = N;
  contract_body(w->ctx, bm);
  sb_printf(sb, "  // matmul %d: a batch of %lld %lldx%lldx%lld, B transposed, dot products, "
                "threads split %s, register tile %lldx%lld\n",
            i, (long long)Bt, (long long)M, (long long)K, (long long)N,
            split ? "the batch" : "none", (long long)tm, (long long)tn);
  batch_loop(w, i, "jit_mm", "jit_f", has_fill, split);
  bool tile_m = tm < M, tile_n = tn < N;
  int nreg = tile_m + tile_n;
  if (nreg) {
    sb_printf(sb, "  %%rt%d, %%rl%d:%d = transform.structured.tile_using_for %%b1_%d tile_sizes "
                  "[0, %lld, %lld, 0]%s : (" ANY ") -> ",
              i, i, nreg, i, (long long)(tile_m ? tm : 0), (long long)(tile_n ? tn : 0),
              tile_m && tile_n ? " interchange = [0, 2, 1, 3]" : "");
    sb_types(sb, nreg + 1);
    sb_printf(sb, "\n");
    if (tile_m && tile_n) {
      if (M % tm) sb_peel(sb, "qm", i, handle(hb, "rl", i, 1));
      if (N % tn) sb_peel(sb, "qn", i, handle(hb, "rl", i, 0));
    } else {
      if (tile_n && N % tn) sb_peel(sb, "qn", i, handle(hb, "rl", i, 0));
      if (tile_m && M % tm) sb_peel(sb, "qm", i, handle(hb, "rl", i, 0));
    }
  }
  plan_matmul_dot(w, i, "linalg.batch_matmul", 3, h.lanes);
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
// the tiles are dot products instead (plan_matmul_dot): no transposes. f16 W, whose
// 16x16 transposes cost more than its halved bytes saved (it was copied transposed per
// call instead): 1x768x3072 1.0 ms -> 0.18 (x W: 0.19), 8x768x3072 1.26 -> 0.48,
// 16x768x3072 1.83 -> 0.79, 4x64x1000 15.5 -> 7.5 us, 3x32x1000 7.4 -> 3.8; f32
// 1x768x3072 0.39 -> 0.34, 16x768x3072 1.12 -> 0.86, 16x256x512 42 -> 35 us, 12x64x256
// 5.2 -> 4.7, 3x32x1000 3.9 -> 3.5; AVX2 code 1.3-1.9x (16x768x3072 1.58 -> 0.99 ms).
// Shorter K lost to the transposes (9x32x200 2.0 against 1.7 us, 17x64x300 f16 9.6
// against 8.5 for the copy).
static void plan_matmul_bt(walk *w, MlirOperation mm, int64_t M, int64_t K, int64_t N) {
  bool has_fill;
  int i = tag_matmul(w, mm, &has_fill);
  jit__text *sb = &w->sb;
  char hb[32];  // handle() text for sb_peel
  host h = w->h;
  int64_t L = h.lanes, tn = L, tm = M < 8 ? M : 8;
  if (M > 8 && M <= 17) tm = (M + 1) / 2;  // two row tiles, no peel when M is even
  // jit__cpu_bt_map (emit_mlir.c) sends f16 here only where this holds on AVX-512 and AVX2.
  bool dot = M <= 17 && K % L == 0 && K >= (M <= 4 ? 2 : M <= 12 ? 4 : 8) * L;
  if (dot) {
    tm = M < 4 ? M : 4;
    tn = h.acc / tm < 8 ? h.acc / tm : 8;
    contract_body(w->ctx, mm);
  }
  int T = w->threads;
  bool big = (double)M * N * K >= (double)(1 << 24) ||
             (M <= 16 && (double)K * N * 4 >= split_b_bytes(h));
  bool split = T > 1 && big && N % T == 0 && N / T >= tn;
  int64_t tN = split ? N / T : N;
  if (tn > tN) tn = tN;
  if (tm > M) tm = M;
  if (!dot) w->transposes = true;
  if (M * N * K >= (1 << 24)) w->unroll_k = true;
  sb_printf(sb, "  // matmul %d: %lldx%lldx%lld, B transposed%s, threads split %s, register "
                "tile %lldx%lld, k step %lld\n",
            i, (long long)M, (long long)K, (long long)N, dot ? ", dot products" : "",
            split ? "N" : "none", (long long)tm, (long long)tn, (long long)L);
  sb_printf(sb,
            "  %%mm%d = transform.structured.match ops{[\"linalg.matmul\"]} attributes "
            "{jit_mm = %d : i64} in %%root : (" ANY ") -> " ANY "\n",
            i, i);
  char cur[32];
  snprintf(cur, sizeof cur, "%%mm%d", i);
  if (split) {
    w->parallel = true;
    sb_printf(sb,
              "  %%pt%d, %%pf%d = transform.structured.tile_using_forall %%mm%d tile_sizes "
              "[0, %lld, 0] : (" ANY ") -> (" ANY ", " ANY ")\n",
              i, i, i, (long long)tN);
    if (has_fill)
      sb_printf(sb,
                "  %%fl%d = transform.structured.match ops{[\"linalg.fill\"]} attributes "
                "{jit_f = %d : i64} in %%root : (" ANY ") -> " ANY "\n"
                "  %%pl%d, %%pf%d_2 = transform.structured.fuse_into_containing_op %%fl%d "
                "into %%pf%d : (" ANY ", " ANY ") -> (" ANY ", " ANY ")\n",
                i, i, i, i, i, i);
    snprintf(cur, sizeof cur, "%%pt%d", i);
  }
  bool tile_m = tm < M, tile_n = tn < tN;
  int nreg = tile_m + tile_n;
  bool nout = tile_m && tile_n;
  if (nreg) {
    sb_printf(sb, "  %%rt%d, %%rl%d:%d = transform.structured.tile_using_for %s tile_sizes "
                  "[%lld, %lld, 0]%s : (" ANY ") -> ",
              i, i, nreg, cur, (long long)(tile_m ? tm : 0), (long long)(tile_n ? tn : 0),
              nout ? " interchange = [1, 0, 2]" : "");
    sb_types(sb, nreg + 1);
    sb_printf(sb, "\n");
    // The inner loop first: peeling the outer one copies the inner loop.
    if (nout) {
      if (M % tm) sb_peel(sb, "qm", i, handle(hb, "rl", i, 1));
      if (tN % tn) sb_peel(sb, "qn", i, handle(hb, "rl", i, 0));
    } else {
      if (tile_n && tN % tn) sb_peel(sb, "qn", i, handle(hb, "rl", i, 0));
      if (tile_m && M % tm) sb_peel(sb, "qm", i, handle(hb, "rl", i, 0));
    }
  }
  if (dot) {
    plan_matmul_dot(w, i, "linalg.matmul", 2, L);
    return;
  }
  if (K > L) {
    sb_printf(sb,
              "  %%mmr%d = transform.structured.match ops{[\"linalg.matmul\"]} attributes "
              "{jit_mm = %d : i64} in %%root : (" ANY ") -> " ANY "\n"
              "  %%mk%d, %%mkl%d = transform.structured.tile_using_for %%mmr%d tile_sizes "
              "[0, 0, %lld] : (" ANY ") -> (" ANY ", " ANY ")\n",
              i, i, i, i, i, (long long)L);
    if (K % L) sb_peel(sb, "qk", i, handle(hb, "mkl", i, -1));
  }
}

static MlirOperation producer(MlirValue v);
static int transposed_loop(MlirOperation g, int nl);
static bool is_row_root(MlirOperation g);
static void plan_generic(walk *w, MlirOperation g);

// A generic of parallel loops only that reads its inputs in order (no transposed read)
// and is not a row loop's root.
static bool plain_elementwise(MlirOperation g) {
  char it[JIT_MAX_RANK + 2];
  int nl = read_iterators(g, it, (int)sizeof it);
  if (nl <= 0) return false;
  for (int l = 0; l < nl; l++)
    if (it[l] != 'p') return false;
  return transposed_loop(g, nl) < 0 && !is_row_root(g);
}

static void plan_matmul(walk *w, MlirOperation mm) {
  MlirType ta = mlirValueGetType(mlirOperationGetOperand(mm, 0));
  MlirType tb = mlirValueGetType(mlirOperationGetOperand(mm, 1));
  MlirType tc = mlirValueGetType(mlirOperationGetOperand(mm, 2));
  bool batched = op_is(mm, "linalg.batch_matmul");
  int rank = batched ? 3 : 2, o = batched ? 1 : 0;
  if (!static_shaped(ta) || !static_shaped(tb) || !static_shaped(tc) ||
      mlirShapedTypeGetRank(ta) != rank || mlirShapedTypeGetRank(tb) != rank ||
      mlirOperationGetNumResults(mm) != 1)
    return;
  if (batched && batch_b_transposed(mm)) {
    int64_t Bt = mlirShapedTypeGetDimSize(ta, 0), M = mlirShapedTypeGetDimSize(ta, 1);
    int64_t K = mlirShapedTypeGetDimSize(ta, 2), N = mlirShapedTypeGetDimSize(tb, 1);
    // Otherwise jit__cpu_normalize has made it a transpose and a plain batch_matmul; if
    // it could not, the loops stay unplanned (LLVM vectorizes their dot products).
    if (batch_dot_rows(&w->h, M, K)) plan_batch_dot(w, mm, Bt, M, K, N);
    return;
  }
  if (batched && !batch_maps_plain(mm)) return;
  int64_t M = mlirShapedTypeGetDimSize(ta, o), K = mlirShapedTypeGetDimSize(ta, o + 1);
  int64_t N = mlirShapedTypeGetDimSize(tb, o + 1);
  // plan_batch folds the unit batch dim of each matmul away, and with it any other
  // unit dim: with M = 1 (a batch of vector x matrix) plan_batch_vecmat instead; with N
  // or K = 1 no 2-D matmul is left to plan (that batch_matmul is lowered to plain loops).
  if (batched && M == 1 && N > 1 && K > 1) {
    int64_t Bt = mlirShapedTypeGetDimSize(ta, 0);
    plan_batch_vecmat(w, mm, Bt, K, N);
    return;
  }
  if (batched && (M == 1 || N == 1 || K == 1)) return;
  int64_t Bt = batched ? mlirShapedTypeGetDimSize(ta, 0) : 1;
  if (!batched && b_transposed(mm)) {
    plan_matmul_bt(w, mm, M, K, mlirShapedTypeGetDimSize(tb, 0));
    return;
  }
  int i = w->n_mm++;
  jit__text *sb = &w->sb;
  host h = w->h;
  set_tag(w->ctx, mm, batched ? "jit_bm" : "jit_mm", i);
  // Small M is GEMV-like: bound by streaming B once. B is then walked row by row in
  // short k blocks (a few contiguous streams the prefetcher follows) with the C row
  // in L1, rather than down columns of B per register tile. The epilogue then runs as
  // its own vectorized elementwise op over C, which is in cache anyway.
  // So are 17 rows when B is larger than half of L2: the packed path needs 18 rows (3
  // row tiles of 6) and the unpacked one walks down B's columns; 17x768x3072 took 1.54
  // ms (AVX2 code: 2.84) against 1.13 (1.40) GEMV-like, 17x1024x1024 0.53 against 0.42.
  bool small_m = M <= 16 || (M < 18 && K * N * 4 > h.l2 / 2);
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
  bool odd_n = N % h.lanes != 0 && N > h.lanes && N <= 4 * h.lanes;
  // And when B is a transpose of W, which B's packing computes (below): the fused path
  // fuses the transpose into every register tile, where the packing cannot be hoisted
  // (gelu(xW^T+b) 256x768x3072 failed to compile; apart: 8.6-9.2 ms, as with W K x N).
  MlirValue bv = mlirOperationGetOperand(mm, 1);
  bool w_t = !batched && made_by_transpose(bv, mm, true);
  bool apart = odd_n || (big_b && (w_t || K * 2 * h.tn * 4 > JIT__PACK_BYTES ||
                                   (h.lanes == 16 && M < 192 && K * N * 4 > h.l2)));
  MlirOperation g = small_m || apart || batched ? (MlirOperation){NULL} : epilogue_of(mm);
  bool fused = !mlirOperationIsNull(g) && w->n_fused < 64;
  MlirOperation fill = mlirOpResultGetOwner(mlirOperationGetOperand(mm, 2));
  bool has_fill = mlirValueIsAOpResult(mlirOperationGetOperand(mm, 2)) &&
                  op_is(fill, "linalg.fill");
  if (has_fill) set_tag(w->ctx, fill, batched ? "jit_bf" : "jit_f", i);
  // A batch worth splitting is divided by whole matmuls (plan_batch), each then planned
  // for one thread; except where the threads would get unequal shares (fewer than 4
  // matmuls each, not a multiple) and each matmul is large enough to be split by itself
  // (below: 2^24 multiply-adds). Worth splitting: 2^23 multiply-adds (~60 us on one
  // core), or as much B as a small-M matmul splits at. Half the bound for one matmul
  // (below): attention's 12x128x64x128 (2^23.6) took 197 us on 2 threads unsplit,
  // ~100 us split.
  bool uneven = Bt % w->threads != 0 && Bt < 4 * w->threads;
  bool batch_split = batched && w->threads > 1 && Bt >= w->threads &&
                     !(uneven && (double)M * N * K >= (double)(1 << 24)) &&
                     ((double)Bt * M * N * K >= (double)(1 << 23) ||
                      (double)Bt * K * N * 4 >= split_b_bytes(h));

  // Register tile. Small M: all rows in one tile, as wide in N as the registers allow
  // (M = 1 is a GEMV: TN = 8 vectors of B per k step).
  // A plain f32 matmul that packs B takes the host's plain tile (AVX-512: 6x64, 4
  // vectors of B per 6 broadcasts of A, against 2 per 8 at 8x32): tried first, and
  // kept if B is then packed. Against 8x32, two compiles interleaved in one process:
  // 64x768x3072 21 % faster (2 threads 13 %), 512^3 and 128x3072x768
  // 2 %, 256^3 the same. Unpacked it lost (200x300x300 20 % slower, 100^3 10 %), and
  // with an epilogue it was 3-4x slower (gelu(xW+b) 256x768x3072). Its compile takes
  // ~15 % longer (512^3: 46 ms against 40, a 4.3 KB object against 3.0).
  MlirType ea = mlirShapedTypeGetElementType(ta), eb = mlirShapedTypeGetElementType(tb);
  bool floats = (mlirTypeIsAF32(ea) || mlirTypeIsAF16(ea)) &&
                (mlirTypeIsAF32(eb) || mlirTypeIsAF16(eb));
  bool plain_tile = !small_m && floats && (h.ptm != h.tm || h.ptn != h.tn);
  bool plain = plain_tile && !fused;
choose_tile:;
  int64_t dtm = plain ? h.ptm : h.tm, dtn = plain ? h.ptn : h.tn;  // the default tile
  int64_t tm = dtm, tn = dtn;
  if (M < tm) {
    tm = M;
    int64_t vecs = h.acc / tm;
    if (vecs > 8) vecs = 8;
    // A power of two of vectors: LLVM widens a row of 3 or 6 to 4 or 8 and the
    // accumulator spills. 4x768x3072 (6 vectors a row on AVX-512) took 6.2 ms and
    // 7x768x3072 (3) 12 ms, against 0.5 ms for 5 and 6 rows; on AVX2 2 and 4 rows.
    while (vecs & (vecs - 1)) vecs &= vecs - 1;
    tn = vecs * h.lanes;
  }
  if (tn > N) tn = N;
  if (tm > M) tm = M;

  // Threads: split M, or N when M is too small to give each thread whole tiles.
  int T = batch_split ? 1 : w->threads;
  int64_t tM = M, tN = N;  // extent of one thread's part
  int split = -1;          // 0: M, 1: N
  // Only ops worth a few hundred microseconds are split: a fork/join on a busy machine
  // (the other core taken) can cost a scheduler tick, ~8 ms, which swamped kernels of
  // 1-10 MFLOP (the MLP example at N = 7 and 64) when the bound was 2^20.
  // Packed B (plan_packed) for f32 matmuls with the default register tile, fused or
  // not: gelu(xW+b) 256x768x3072 unpacked ran at ~40 GFLOP/s (each register tile
  // walking down B's columns 12 KiB apart), packed at ~70 on the same loaded machine.
  bool can_pack = !small_m && tm == dtm && tn == dtn && floats;
  // Small M is bound by streaming B once, so it is split (over N) by the bytes of B
  // rather than by multiply-adds: at 1x768x3072 (9 MiB of B, ~0.25 ms) the second
  // core's share of memory bandwidth pays for the fork/join, while the MLP example's
  // 7x784x256 (0.8 MiB) stays on one thread.
  // Part of a matmul split at its odd N ("Odd N"): the parts are split across threads
  // as the whole would be (210x600x160 at 2 threads, a 128 and a 32 column part:
  // 281 us on one thread, 150 split).
  int64_t whole_n = N;
  MlirAttribute wn =
      mlirOperationGetAttributeByName(mm, mlirStringRefCreateFromCString("jit_n"));
  if (!mlirAttributeIsNull(wn) && mlirAttributeIsAInteger(wn))
    whole_n = mlirIntegerAttrGetValueInt(wn);
  if ((double)M * whole_n * K >= (double)(1 << 24)) w->unroll_k = true;
  bool big = (double)M * whole_n * K >= (double)(1 << 24) ||
             (small_m && (double)K * N * 4 >= split_b_bytes(h));
  int64_t pnc = 0, pkc = 0;
  // The L2 that pack_plan may fill half of with a whole-K block: measured on AVX-512
  // only (the AVX2 tiles' blocks were chosen on a 512 KiB L2).
  int64_t big_l2 = h.lanes == 16 ? h.l2 : 0;
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
    bool n_ok = N % T == 0 && pack_plan(M, N / T, K, tn, fused, big_l2, &pnc, &pkc);
    bool m_ok = M % T == 0 && M / T >= 3 * tm;
    bool b_fits = K * N * 4 < h.l2 / 2 && !fused && M / T >= 64;
    bool prefer_m = M > N || (M == N && !fused && M / T >= 256) || b_fits;
    if (n_ok && (!prefer_m || !m_ok)) split = 1;
    else if (m_ok) split = 0;
  }
  if (split < 0 && T > 1 && big) {
    if (M % T == 0 && M / T >= 4 * tm) split = 0;
    else if (N % T == 0 && N / T >= tn) split = 1;
    else if (M % T == 0 && M / T >= tm) split = 0;
  }
  if (split == 0) tM = M / T;
  if (split == 1) tN = N / T;
  // Pack when B takes half of L2 or more and enough row tiles reuse it. At exactly 256
  // KiB (256^3) B fits in L2, but a register tile walking down its columns 1 KiB apart
  // uses a few L1 sets only: packed, ~8 % faster at 1 thread. The bound is on all of
  // B, not a thread's part: the columns are as far apart in a half (256^3 at 2 threads,
  // split N: 195-215 us packed vs 260-290 us), and packing costs each thread in
  // proportion to its part. Smaller Bs (160x256x128, 192^3) gained nothing and took
  // ~14 ms more to compile.
  bool packed = can_pack && K * N * 4 >= (256 << 10) && tM >= 3 * tm &&
                pack_plan(tM, tN, K, tn, fused, big_l2, &pnc, &pkc);
  if (plain && !packed) {
    plain = false;  // the default tile after all (above)
    goto choose_tile;
  }
  if (fused && !packed && big_b && h.lanes == 16) {
    fused = false;  // the epilogue apart after all (above)
    plain = plain_tile;
    goto choose_tile;
  }
  if (fused) {
    set_tag(w->ctx, g, "jit_ep", i);
    w->fused[w->n_fused++] = g;
  }

  // Cache blocks: a kc x nc block of B (256 KiB) in L2; mc rows of A per pass.
  // Row blocks only serve the n blocks around them: without n blocks they would only
  // add a peeled remainder per block (200x300x300: mc 50 = 8 x 6 + 2; ~5 % slower).
  int64_t mc = pick_block(tM, 64, tm), nc = pick_block(tN, fused ? 128 : 256, tn);
  if (!nc) mc = 0;
  // No k blocks when all of B fits in L2 anyway (a narrow or small B).
  int64_t kc = fused || K * N * 4 <= (256 << 10) ? 0 : pick_block(K, 256, 1);
  if (small_m) {
    mc = nc = 0;
    // k blocks of ~8 rows: as many concurrent streams of B as the prefetcher follows
    // well. At 16 rows, 1x768x3072 took 172-199 us vs 152-156 (8 rows), 8x768x3072
    // 680 vs 520 us; 4 and 12 rows were no better than 8.
    kc = pick_block(K, 8, 1);
    // Each k block reads and writes the thread's rows of C, so they are kept in half of
    // L1 by n blocks when they would not fit: 8x768x3072 at 2 threads (a C half of 48
    // KiB) took 430-440 us with n blocks of 512 vs 490-650 us without (1 thread: the
    // same within noise). A single row (M = 1, 12 KiB) stays one block.
    if (M * tN * 4 > JIT__L1_HALF) nc = pick_block(tN, JIT__L1_HALF / 4 / M, tn);
  }
  int64_t em = mc ? mc : tM, en = nc ? nc : tN;  // extents the register tiles walk
  // A remainder that is not a whole number of vectors (31 = 16 + 15) makes LLVM
  // legalize odd-width vectors lane by lane, with spills. Pick the width that leaves
  // the smallest remainder; the remainder columns then run one at a time (below).
  bool narrow_rest = false;
  if (!fused && tn % h.lanes == 0 && en > tn && en % tn) {
    int64_t best_tn = tn, best_tm = tm;
    // Whole vectors, a power of two of them: LLVM widens other counts (24 lanes -> 32)
    // and the accumulator then spills.
    for (int64_t v = 1; v <= h.acc; v *= 2) {
      int64_t cand = v * h.lanes, rows = h.acc / v;
      if (cand > en || rows < 1) break;
      if (rows > tm) rows = tm;
      if (en % cand < en % best_tn || (en % cand == en % best_tn && cand > best_tn)) {
        if (rows * v <= h.acc && rows >= (tm < 3 ? tm : 3)) {
          best_tn = cand;
          best_tm = rows;
        }
      }
    }
    tn = best_tn;
    tm = best_tm < M ? best_tm : M;
    narrow_rest = en % tn != 0 && (en % tn) % h.lanes != 0;
  }

  // Narrow N that is not a whole number of vectors (17x1000x31): plan_masked.
  // N above one vector only: below it most lanes would be masked off, and the plain
  // path's narrow vectors do better (100x100x3: 11 vs 5.5 GFLOP/s). Small M too: its
  // tile, all rows by N, was one vector of N lanes, which LLVM split lane by lane
  // (7x256x17 17 us against 0.8 masked; 16x256x31 81 against 1.7; 1x256x17 3.5 against
  // 0.4).
  bool masked = !packed && !fused && split != 1 && N % h.lanes != 0 &&
                N > h.lanes && N <= 4 * h.lanes && i < 64;
  int64_t mv = 0, mtm = 0;
  if (masked) {
    // A power of two of vectors: LLVM widens 3 to 4 and the accumulator spills
    // (130x257x20 at 24 lanes: 2.5 GFLOP/s).
    int64_t nv = (N + h.lanes - 1) / h.lanes;
    if (nv == 3) nv = 4;
    mv = nv * h.lanes;
    // As many rows as the accumulator registers hold: 12 at 2 vectors on AVX-512
    // (fewer tiles, so fewer reads of each B row): 12x1000x31 4.3 us against 7.4 for
    // 8 + 4 rows, 17x1000x31 (12 + 5) 6.1-6.7 against 6.7-7.2 (6 + 6 + 5), 64x1000x31
    // and 1000x600x30 2-6 % faster.
    mtm = h.acc / nv;
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
    mc = nc = 0;
    kc = h.lanes < 16 ? pick_block(K, JIT__MASKED_B_BYTES / 4 / mv, 1) : 0;
    tm = mtm;
    tn = mv;
  }
  // A's row tiles copied per k block (plan_packed) when a tile fits a stack scratch
  // buffer (16 KiB, jit__cpu_stack_buffers). Not on AVX-512: on the Xeon the copies
  // cost more than they saved (8x32 tiles, without them, two compiles interleaved:
  // 1024^3 6-8 % faster at 1 and 2 threads, 768^3 6 %, 512^3 1-4 %; 256^3, gelu(xW+b)
  // 256x768x3072, 128x3072x768 and 64x768x3072 within 1 %).
  // Nor where A is computed by an op fused into the row tiles (f16 A extended to f32,
  // emit_mlir.c), whose result already is a copy of the tile's rows: padding that as
  // well made hoist_pad fail.
  MlirValue av = mlirOperationGetOperand(mm, 0);
  bool a_made = mlirValueIsAOpResult(av) && op_is(mlirOpResultGetOwner(av), "linalg.generic");
  bool copy_a = packed && h.lanes < 16 && !a_made && tm * pkc * 4 <= (16 << 10);
  // B made by a transpose of W (x W^T with more than 17 rows, emit_mlir.c) is packed
  // from W directly when L x L tiles cover the panels (plan_packed). f16 W as well, its
  // tiles transposed as f16: W^T was its own op before, 64x768x3072 3.0-3.2 ms against
  // 2.4 now (x W: 2.3), AVX2 code 4.8 against 3.4.
  bool b_tr = w_t && packed && !fused && pkc % h.lanes == 0 && w->n_taken_t < 16;
  if (b_tr) w->taken_t[w->n_taken_t++] = mlirOpResultGetOwner(bv);
  // Generics that make B, and those that make A other than plain elementwise ones, are
  // planned on their own before this plan: the block and register tiling below fuses
  // an operand's producer into its loops, where it runs per n block, in a shape its own
  // plan did not see. A transpose there (x W^T, AVX2: 41x520x1000) failed to vectorize,
  // its 8x8 tiles not dividing the n blocks of 250 (B's elementwise tiles of 4 vectors
  // would not divide n blocks of 96 either); a layernorm making A was fused into each
  // n block (LN(x) W 128x768x3072: 3.85-4.0 ms, ahead 3.74-3.81 and ~10 ms less to
  // compile). A plain elementwise A (relu(x) W), cheap to redo, stays fused: planned
  // ahead it cost an intermediate (3.9 -> 4.4 ms). So does f16 A's extension, which
  // the row tiles compute.
  // Batched too for B (planned before the batch loop, which would fuse it otherwise):
  // a prefill's q K^T, K^T fused into every register tile, ran its transpose
  // unvectorized there (12x128x64x128 at 1 thread: 364 -> 146 us, 12x512x64x512 5.9 ->
  // 2.4 ms; a transformer block 2 % faster). Batched A producers stay fused.
  for (int k = batched ? 1 : 0; k < 2; k++) {
    MlirValue v = mlirOperationGetOperand(mm, k);
    MlirOperation t = producer(v);
    if ((k == 1 && b_tr) || mlirOperationIsNull(t) || !op_is(t, "linalg.generic") ||
        w->n_taken_t >= 16 || mlirShapedTypeGetRank(mlirValueGetType(v)) != (batched ? 3 : 2) ||
        (k == 0 && plain_elementwise(t)))
      continue;
    // B made for a batch split across the threads: its producer is split too (by the
    // batch), whatever its size, rather than run on one thread before the split batch
    // (2 threads, q K^T 12x128x64x128 with K^T its own op: 90 -> 70 us; plain B 63).
    w->ew_split = batched && batch_split && k == 1;
    plan_generic(w, t);
    w->ew_split = false;
    w->taken_t[w->n_taken_t++] = t;
  }
  if (packed) {
    mc = 0;
    nc = pnc;
    kc = pkc;
  }
  sb_printf(sb, "  // matmul %d: %lldx%lldx%lld%s%s%s, threads split %s, blocks [%lld, "
                "%lld, %lld], register tile %lldx%lld\n",
            i, (long long)M, (long long)K, (long long)N, fused ? " + epilogue" : "",
            packed ? (b_tr ? ", B packed from W^T" : ", B packed")
            : masked ? ", masked N" : "",
            copy_a ? ", A tiles copied" : "",
            split == 0 ? "M" : split == 1 ? "N" : "none", (long long)mc, (long long)nc,
            (long long)kc, (long long)tm, (long long)tn);
  if (batched) plan_batch(w, i, Bt, has_fill, batch_split);
  sb_printf(sb,
            "  %%mm%d = transform.structured.match ops{[\"linalg.matmul\"]} attributes "
            "{jit_mm = %d : i64} in %%root : (" ANY ") -> " ANY "\n",
            i, i);
  if (fused)
    sb_printf(sb,
              "  %%ep%d = transform.structured.match ops{[\"linalg.generic\"]} "
              "attributes {jit_ep = %d : i64} in %%root : (" ANY ") -> " ANY "\n",
              i, i);
  if (has_fill)
    sb_printf(sb,
              "  %%fl%d = transform.structured.match ops{[\"linalg.fill\"]} attributes "
              "{jit_f = %d : i64} in %%root : (" ANY ") -> " ANY "\n",
              i, i);
  char root[32];
  snprintf(root, sizeof root, fused ? "%%ep%d" : "%%mm%d", i);
  const char *zk = fused ? "" : ", 0";  // the matmul has a k loop to leave alone

  if (split >= 0) {
    w->parallel = true;
    sb_printf(sb,
              "  %%pt%d, %%pf%d = transform.structured.tile_using_forall %s tile_sizes "
              "[%lld, %lld%s] : (" ANY ") -> (" ANY ", " ANY ")\n",
              i, i, root, (long long)tM, (long long)tN, zk);
    if (fused)
      sb_printf(sb,
                "  %%pm%d, %%pf%d_1 = transform.structured.fuse_into_containing_op %%mm%d "
                "into %%pf%d : (" ANY ", " ANY ") -> (" ANY ", " ANY ")\n",
                i, i, i, i);
    if (has_fill)
      sb_printf(sb,
                "  %%pl%d, %%pf%d_2 = transform.structured.fuse_into_containing_op %%fl%d "
                "into %%pf%d%s : (" ANY ", " ANY ") -> (" ANY ", " ANY ")\n",
                i, i, i, i, fused ? "_1" : "");
    snprintf(root, sizeof root, "%%pt%d", i);
  }
  if (packed) {
    // The fill fused into the register tiles only where it is their one producer
    // (structured.fuse would pull B's transpose, or A's elementwise producer, in too).
    bool b_made = mlirValueIsAOpResult(bv) && op_is(mlirOpResultGetOwner(bv), "linalg.generic");
    plan_packed(w, i, root, tM, tN, K, tm, tn, nc, kc, copy_a, fused,
                mlirTypeIsAF16(ea) ? "f16" : "f32", mlirTypeIsAF16(eb) ? "f16" : "f32", b_tr,
                has_fill && !a_made && !b_made);
    return;
  }
  if (masked) {
    // Its k loop unrolled (by 4, or 2: jit__cpu_unroll_k_loops) where the trip count
    // is even: two compiles interleaved, 17x1000x31 5-6 % faster, 37x2000x27 4-6 %,
    // 1000x600x30, 200x512x24 and 64x1024x48 the same; ~4 ms more to compile.
    if ((kc ? kc : K) % 2 == 0) w->unroll_k = true;
    plan_masked(w, i, root, tM, mtm, mv, kc);
    return;
  }
  if (mc || nc) {
    int nl = (mc != 0) + (nc != 0);
    sb_printf(sb, "  %%cb%d, %%cbl%d:%d = transform.structured.fuse %s tile_sizes [%lld, "
                  "%lld%s] interchange [1, 0%s] : (" ANY ") -> ",
              i, i, nl, root, (long long)mc, (long long)nc, zk, fused ? "" : ", 2");
    sb_types(sb, nl + 1);
    sb_printf(sb, "\n");
    snprintf(root, sizeof root, "%%cb%d", i);
  }
  int nreg = (tm < em ? 1 : 0) + (tn < en ? 1 : 0);
  const char *lm = NULL, *ln = NULL;  // loop handles to peel
  char lmb[32], lnb[32];
  if (fused) {
    // Register tile of G with the matmul (and fill) fused in.
    if (nreg) {
      sb_printf(sb, "  %%rg%d, %%rl%d:%d = transform.structured.fuse %s tile_sizes "
                    "[%lld, %lld] : (" ANY ") -> ",
                i, i, nreg, root, (long long)(tm < em ? tm : 0),
                (long long)(tn < en ? tn : 0));
      sb_types(sb, nreg + 1);
      sb_printf(sb, "\n");
      int li = 0;
      if (tm < em) { snprintf(lmb, sizeof lmb, "%%rl%d#%d", i, li++); lm = lmb; }
      if (tn < en) { snprintf(lnb, sizeof lnb, "%%rl%d#%d", i, li++); ln = lnb; }
    }
  } else {
    const char *src = root;
    char kb[32];
    if (kc) {
      sb_printf(sb,
                "  %%kb%d, %%kbl%d = transform.structured.tile_using_for %s tile_sizes "
                "[0, 0, %lld] : (" ANY ") -> (" ANY ", " ANY ")\n",
                i, i, root, (long long)kc);
      snprintf(kb, sizeof kb, "%%kb%d", i);
      src = kb;
    }
    // The register tile; its k loop comes last (below), after the peeling, so that k is
    // innermost in every copy and the accumulator stays in registers across it.
    // With no k blocks, the fill is fused into the register tiles: each tile's sums
    // start from zero in registers instead of loading the C a separate pass zeroed
    // (vectorized with the tile, the read of its zeros folds away). Short K gains most:
    // 128x32x128 6.9 -> 5.6 us, 256x64x256 59 -> 49, an attention batch 12x128x64x128
    // 151 -> 134 (2 threads 77 -> 66), 12x128x128x64 136 -> 121, 512x64x512 at 2
    // threads 108 -> 94; 200x300x300, 100^3, 97x61x131 the same. With k blocks the fill
    // stays apart (it must not run per k block).
    if (nreg && has_fill && !kc && i < 64) {
      sb_printf(sb, "  %%rt%d, %%rl%d:%d = transform.structured.fuse %s "
                    "tile_sizes [%lld, %lld, 0] : (" ANY ") -> ",
                i, i, nreg, src, (long long)(tm < em ? tm : 0),
                (long long)(tn < en ? tn : 0));
      sb_types(sb, nreg + 1);
      sb_printf(sb, "\n");
      w->fill_fused[i] = true;
    } else if (nreg) {
      sb_printf(sb, "  %%rt%d, %%rl%d:%d = transform.structured.tile_using_for %s "
                    "tile_sizes [%lld, %lld, 0] : (" ANY ") -> ",
                i, i, nreg, src, (long long)(tm < em ? tm : 0),
                (long long)(tn < en ? tn : 0));
      sb_types(sb, nreg + 1);
      sb_printf(sb, "\n");
    }
    int li = 0;
    if (tm < em) { snprintf(lmb, sizeof lmb, "%%rl%d#%d", i, li++); lm = lmb; }
    if (tn < en) { snprintf(lnb, sizeof lnb, "%%rl%d#%d", i, li++); ln = lnb; }
  }
  // Peel a register loop only when it has a partial last tile (peeling one without is
  // an error): n first, then m, as measured best.
  if (ln && en % tn) sb_peel(sb, "qn", i, ln);
  if (ln && en % tn && narrow_rest)
    sb_printf(sb,
              "  %%qnx%d = transform.structured.match ops{[\"linalg.matmul\"]} in %%qn%dr : "
              "(!transform.op<\"scf.for\">) -> " ANY "\n"
              "  %%qnxt%d, %%qnxl%d = transform.structured.tile_using_for %%qnx%d "
              "tile_sizes [0, 1, 0] : (" ANY ") -> (" ANY ", " ANY ")\n",
              i, i, i, i, i);
  if (lm && em % tm) sb_peel(sb, "qm", i, lm);
  {
    // The k loop inside each register tile (after peeling, so every copy gets one).
    sb_printf(sb,
              "  %%mmr%d = transform.structured.match ops{[\"linalg.matmul\"]} attributes "
              "{jit_mm = %d : i64} in %%root : (" ANY ") -> " ANY "\n"
              "  %%mk%d, %%mkl%d = transform.structured.tile_using_for %%mmr%d tile_sizes "
              "[0, 0, 1] : (" ANY ") -> (" ANY ", " ANY ")\n",
              i, i, i, i, i);
  }
}

//===--- Row fusion (softmax, normalizations) -------------------------===//

// A reduction over the last loop only, reading input 0 through the identity.
static bool is_row_reduction(MlirOperation g) {
  if (!op_is(g, "linalg.generic") || mlirOperationGetNumResults(g) != 1) return false;
  char it[JIT_MAX_RANK + 2];
  int nl = read_iterators(g, it, (int)sizeof it);
  if (nl < 2 || it[nl - 1] != 'r') return false;
  for (int l = 0; l < nl - 1; l++)
    if (it[l] != 'p') return false;
  return map_is_identity(g, 0);
}

static MlirOperation producer(MlirValue v) {
  if (!mlirValueIsAOpResult(v)) return (MlirOperation){NULL};
  return mlirOpResultGetOwner(v);
}

// An elementwise generic of rank >= 2 that reads a row reduction (softmax's division
// by the row sum, a normalization) is the root of a row loop: tiling it by rows fuses
// its producers (the exps, the sum, the max) into the same loop, so a row is read from
// memory once and the rest stays in L1, instead of one pass over the whole matrix per
// op and a full-size intermediate in between.
static bool is_row_root(MlirOperation g) {
  if (!op_is(g, "linalg.generic") || mlirOperationGetNumResults(g) != 1) return false;
  MlirType rt = mlirValueGetType(mlirOperationGetResult(g, 0));
  if (!static_shaped(rt) || mlirShapedTypeGetRank(rt) < 2) return false;
  char it[JIT_MAX_RANK + 2];
  int nl = read_iterators(g, it, (int)sizeof it);
  if (nl != mlirShapedTypeGetRank(rt)) return false;
  for (int l = 0; l < nl; l++)
    if (it[l] != 'p') return false;
  bool reads_reduction = false;
  for (intptr_t k = 0; k + 1 < mlirOperationGetNumOperands(g); k++) {
    MlirType t = mlirValueGetType(mlirOperationGetOperand(g, k));
    if (!mlirTypeIsARankedTensor(t) || !mlirShapedTypeHasStaticShape(t)) return false;
    MlirOperation p = producer(mlirOperationGetOperand(g, k));
    if (!mlirOperationIsNull(p) && is_row_reduction(p)) reads_reduction = true;
  }
  return reads_reduction;
}

static bool is_claimed(walk *w, MlirOperation g) {
  for (int c = 0; c < w->n_claimed; c++)
    if (mlirOperationEqual(w->claimed[c], g)) return true;
  return false;
}

// Claims the generics (and fills) `g` reads, transitively: the row loop computes them.
static void claim_producers(walk *w, MlirOperation g, int depth) {
  if (depth > 16) return;
  for (intptr_t k = 0; k < mlirOperationGetNumOperands(g); k++) {
    MlirOperation p = producer(mlirOperationGetOperand(g, k));
    if (mlirOperationIsNull(p) || !op_is(p, "linalg.generic") || is_claimed(w, p)) continue;
    if (w->n_claimed >= 64) return;
    w->claimed[w->n_claimed++] = p;
    claim_producers(w, p, depth + 1);
  }
}

static MlirWalkResult find_row_roots(MlirOperation op, void *user) {
  walk *w = user;
  if (is_row_root(op)) claim_producers(w, op, 0);
  return MlirWalkResultAdvance;
}

static void plan_row(walk *w, MlirOperation g) {
  MlirType rt = mlirValueGetType(mlirOperationGetResult(g, 0));
  int nl = (int)mlirShapedTypeGetRank(rt);
  int64_t d0 = mlirShapedTypeGetDimSize(rt, 0);
  int64_t numel = 1;
  for (int l = 0; l < nl; l++) numel *= mlirShapedTypeGetDimSize(rt, l);
  int i = w->n_row++;
  set_tag(w->ctx, g, "jit_row", i);
  int64_t bytes = shaped_bytes(rt);
  w->row_input_bytes = bytes;
  w->row_bytes = bytes > 0 ? bytes / numel * mlirShapedTypeGetDimSize(rt, nl - 1) : 0;
  jit__text *sb = &w->sb;
  int T = w->threads;
  bool par = T > 1 && d0 % T == 0 && numel >= (1 << 15);
  sb_printf(sb,
            "  %%row%d = transform.structured.match ops{[\"linalg.generic\"]} attributes "
            "{jit_row = %d : i64} in %%root : (" ANY ") -> " ANY "\n",
            i, i);
  const char *src = "%row";
  if (par) {
    // Rows split across threads with the producers fused into the forall, so that each
    // thread runs whole row loops. (tile_using_forall on the root alone left the max,
    // exp and sum outside the forall, over the whole matrix on one thread, with a
    // full-size intermediate malloc'ed per call: 2 threads were slower than 1.)
    w->parallel = true;
    sb_printf(sb, "  %%rowt%d, %%rowf%d = transform.structured.fuse %%row%d "
                  "tile_sizes [%lld",
              i, i, i, (long long)(d0 / T));
    for (int l = 1; l < nl; l++) sb_printf(sb, ", 0");
    sb_printf(sb, "] {use_forall} : (" ANY ") -> (" ANY ", " ANY ")\n");
    src = "%rowt";
  }
  sb_printf(sb, "  %%rowr%d, %%rowl%d:%d = transform.structured.fuse %s%d tile_sizes [", i,
            i, nl - 1, src, i);
  for (int l = 0; l < nl; l++) sb_printf(sb, "%s%d", l ? ", " : "", l < nl - 1 ? 1 : 0);
  sb_printf(sb, "] : (" ANY ") -> ");
  sb_types(sb, nl);
  sb_printf(sb, "\n");
}

// The loop that walks the contiguous (last) dim of one of the generic's inputs, when
// that is not its last loop (a transposed read), or -1.
static int transposed_loop(MlirOperation g, int nl) {
  MlirAttribute maps =
      mlirOperationGetAttributeByName(g, mlirStringRefCreateFromCString("indexing_maps"));
  if (mlirAttributeIsNull(maps) || !mlirAttributeIsAArray(maps)) return -1;
  intptr_t n_in = mlirOperationGetNumOperands(g) - 1;
  for (intptr_t k = 0; k < n_in && k < mlirArrayAttrGetNumElements(maps); k++) {
    MlirAffineMap m = mlirAffineMapAttrGetValue(mlirArrayAttrGetElement(maps, k));
    intptr_t nr = mlirAffineMapGetNumResults(m);
    if (nr < 1 || mlirAffineMapGetNumDims(m) != nl) continue;
    MlirAffineExpr e = mlirAffineMapGetResult(m, nr - 1);
    if (!mlirAffineExprIsADim(e)) continue;
    int pos = (int)mlirAffineDimExprGetPosition(e);
    if (pos != nl - 1) return pos;
  }
  return -1;
}

// Whether an input of `g` (nl loops) does not vary along the last loop: a column of
// x + c with c of shape (M, 1), or a scalar.
static bool broadcasts_last(MlirOperation g, int nl) {
  MlirAttribute maps =
      mlirOperationGetAttributeByName(g, mlirStringRefCreateFromCString("indexing_maps"));
  if (mlirAttributeIsNull(maps) || !mlirAttributeIsAArray(maps)) return false;
  intptr_t n_in = mlirOperationGetNumOperands(g) - 1;
  for (intptr_t k = 0; k < n_in && k < mlirArrayAttrGetNumElements(maps); k++) {
    MlirAffineMap m = mlirAffineMapAttrGetValue(mlirArrayAttrGetElement(maps, k));
    bool walks = false;
    for (intptr_t r = 0; r < mlirAffineMapGetNumResults(m); r++) {
      MlirAffineExpr e = mlirAffineMapGetResult(m, r);
      walks = walks || (mlirAffineExprIsADim(e) && mlirAffineDimExprGetPosition(e) == nl - 1);
    }
    if (!walks) return true;
  }
  return false;
}

static void plan_generic(walk *w, MlirOperation g) {
  for (int f = 0; f < w->n_fused; f++)
    if (mlirOperationEqual(w->fused[f], g)) return;
  for (int f = 0; f < w->n_taken_t; f++)
    if (mlirOperationEqual(w->taken_t[f], g)) return;
  if (is_claimed(w, g)) return;
  if (is_row_root(g)) {
    plan_row(w, g);
    return;
  }
  if (mlirOperationGetNumResults(g) != 1) return;
  MlirType rt = mlirValueGetType(mlirOperationGetResult(g, 0));
  if (!static_shaped(rt)) return;
  for (intptr_t k = 0; k < mlirOperationGetNumOperands(g); k++) {
    MlirType t = mlirValueGetType(mlirOperationGetOperand(g, k));
    if (mlirTypeIsARankedTensor(t) && !mlirShapedTypeHasStaticShape(t)) return;
  }
  char it[JIT_MAX_RANK + 2];
  int nl = read_iterators(g, it, (int)sizeof it);
  if (nl <= 0) return;
  int n_red = 0;
  for (int l = 0; l < nl; l++) n_red += it[l] == 'r';
  // Loop extents: the result's dims for parallel generics; a reduction's loops are
  // read off its first input, which the reductions emit_mlir writes index directly.
  int64_t ext[JIT_MAX_RANK + 2];
  if (n_red == 0) {
    if (mlirShapedTypeGetRank(rt) != nl) return;
    for (int l = 0; l < nl; l++) ext[l] = mlirShapedTypeGetDimSize(rt, l);
  } else {
    // Only reductions over the last loop, reading input 0 through the identity.
    if (n_red != 1 || it[nl - 1] != 'r' || !map_is_identity(g, 0)) return;
    MlirType t0 = mlirValueGetType(mlirOperationGetOperand(g, 0));
    if (!static_shaped(t0) || mlirShapedTypeGetRank(t0) != nl) return;
    for (int l = 0; l < nl; l++) ext[l] = mlirShapedTypeGetDimSize(t0, l);
  }
  int64_t numel = 1;
  for (int l = 0; l < nl; l++) numel *= ext[l];
  if (numel < 64 && n_red == 0) return;  // nothing to gain
  jit__text *sb = &w->sb;
  char hb[32];  // handle() text for sb_peel
  int T = w->threads;
  bool par = T > 1 && nl >= (n_red ? 2 : 1) && ext[0] % T == 0 && ext[0] >= T &&
             (numel >= (n_red ? (1 << 18) : (1 << 20)) || w->ew_split);  // see the matmul bound
  int64_t e0 = par ? ext[0] / T : ext[0];
  if (n_red) {
    if (!par) return;  // inner loops stay as they are: see the file comment
    int i = w->n_rd++;
    set_tag(w->ctx, g, "jit_rd", i);
    w->parallel = true;
    sb_printf(sb,
              "  %%rd%d = transform.structured.match ops{[\"linalg.generic\"]} attributes "
              "{jit_rd = %d : i64} in %%root : (" ANY ") -> " ANY "\n"
              "  %%rdt%d, %%rdf%d = transform.structured.tile_using_forall %%rd%d "
              "tile_sizes [%lld",
              i, i, i, i, i, (long long)e0);
    for (int l = 1; l < nl; l++) sb_printf(sb, ", 0");
    sb_printf(sb, "] : (" ANY ") -> (" ANY ", " ANY ")\n");
    return;
  }
  int i = w->n_ew++;
  set_tag(w->ctx, g, "jit_ew", i);
  sb_printf(sb,
            "  %%ew%d = transform.structured.match ops{[\"linalg.generic\"]} attributes "
            "{jit_ew = %d : i64} in %%root : (" ANY ") -> " ANY "\n",
            i, i);
  const char *src = "%ew";
  if (par) {
    w->parallel = true;
    sb_printf(sb, "  %%ewt%d, %%ewf%d = transform.structured.tile_using_forall %%ew%d "
                  "tile_sizes [%lld",
              i, i, i, (long long)e0);
    for (int l = 1; l < nl; l++) sb_printf(sb, ", 0");
    sb_printf(sb, "] : (" ANY ") -> (" ANY ", " ANY ")\n");
    src = "%ewt";
  }
  // Inner tile: V lanes of the last dim (4 vector registers), 1 elsewhere.
  int64_t V = 4 * w->h.lanes;
  int64_t last = nl == 1 ? e0 : ext[nl - 1];
  int64_t vl = last > V ? V : 0;
  int n_loops = 0;
  int64_t sizes[JIT_MAX_RANK + 2];
  // An input whose contiguous dim another loop walks (a transpose): tiles of L x L
  // (L = lanes), each read as L rows of L contiguous elements and transposed in
  // registers. With 1 x V tiles every element read came from another cache line, the
  // lines evicted before the next tile used them: a 3072x768 transpose took ~23 ms.
  int tl = nl >= 2 ? transposed_loop(g, nl) : -1;
  int64_t L = w->h.lanes;
  for (int l = 0; l < nl; l++) {
    int64_t e = l == 0 ? e0 : ext[l];
    sizes[l] = l == nl - 1 ? vl : (e > 1 ? 1 : 0);
    if (tl >= 0 && (l == tl || l == nl - 1)) sizes[l] = e > L ? L : 0;
    n_loops += sizes[l] != 0;
  }
  if (tl >= 0) w->transposes = true;
  if (!n_loops) return;
  if (i < 64 && ext[nl - 1] > 1) w->ew_bcast[i] = broadcasts_last(g, nl);
  sb_printf(sb, "  %%ewr%d, %%ewl%d:%d = transform.structured.tile_using_for %s%d "
                "tile_sizes [",
            i, i, n_loops, src, i);
  for (int l = 0; l < nl; l++) sb_printf(sb, "%s%lld", l ? ", " : "", (long long)sizes[l]);
  sb_printf(sb, "] : (" ANY ") -> ");
  sb_types(sb, n_loops + 1);
  sb_printf(sb, "\n");
  // Each loop of vector tiles with a partial last tile is peeled, so every tile is
  // static; the inner loop first: peeling an outer one copies the inner loop, which
  // would leave its handle on only one of the copies.
  bool rest = false;
  for (int l = nl - 1, li = n_loops - 1; l >= 0; l--) {
    if (!sizes[l]) continue;
    int64_t e = l == 0 ? e0 : ext[l];
    if (sizes[l] > 1 && e % sizes[l]) {
      char prefix[32];
      snprintf(prefix, sizeof prefix, "ewp%d_", i);
      sb_peel(sb, prefix, l, handle(hb, "ewl", i, li));
      if (tl >= 0 && i < 64) {
        // Tagged for their own vectorization (below); the rest loop may have been folded
        // away (a handle to no loop), so each of the loops it holds, if any.
        sb_printf(sb,
                  "  transform.foreach %%ewp%d_%dr : !transform.op<\"scf.for\"> {\n"
                  "  ^bb0(%%ewq%d_%d: !transform.op<\"scf.for\">):\n"
                  "    %%ewg%d_%d = transform.structured.match ops{[\"linalg.generic\"]} in "
                  "%%ewq%d_%d : (!transform.op<\"scf.for\">) -> " ANY "\n"
                  "    transform.annotate %%ewg%d_%d \"jit_ewrest\" : " ANY "\n"
                  "  }\n",
                  i, l, i, l, i, l, i, l, i, l);
        rest = true;
      }
    }
    li--;
  }
  if (rest) {
    w->ew_rest[i][0] = tl;
    w->ew_rest[i][1] = nl;
  }
}

//===--- Streaming -------------------------------------------------------===//
//
// A kernel that writes large outputs once, without reading them back (elementwise
// chains, softmax and normalization rows), is bound by memory traffic, and a plain
// store first reads each line of the output in: a third of the traffic of y = f(x).
// Its vector stores to the outputs become non-temporal instead (what memcpy does past
// a size). Not when the output would still be in the cache for the next kernel, below
// JIT__STREAM_BYTES (a quarter of this L3), and never with a matmul or a reduction
// outside a row loop, which read their output back while accumulating into it.
// A lone row loop over an input larger than L2 also prefetches the next row while it
// computes this one: the hardware prefetcher stops at the end of the row, and the
// memory would sit idle during the row's exp and sums. softmax 4096x1024, 1 thread, in
// a C model of the kernel: 3.6-4.1 ms before, 2.4-2.7 ms with both (aligned 32-byte
// streaming stores), 2.7-3.7 ms with the 8-byte ones this emits, the output's alignment
// being unknown here; the kernel itself, on a busy machine: 5.9-7.4 ms before, 5.4-6.0
// ms after.

#define JIT__STREAM_BYTES (8 << 20)
#define JIT__PREFETCH_BYTES (1 << 20)

typedef struct stream_walk {
  const walk *w;
  bool other;         // an op that reads its output back, or that this does not know
  int loose;          // generics outside the row loop
  int64_t out_bytes;  // bytes of all outputs
} stream_walk;

static MlirWalkResult find_streams(MlirOperation op, void *user) {
  stream_walk *s = user;
  MlirIdentifier id = mlirOperationGetName(op);
  MlirStringRef name = mlirIdentifierStr(id);
  if (name.length > 7 && strncmp(name.data, "linalg.", 7) == 0) {
    if (op_is(op, "linalg.fill") || op_is(op, "linalg.yield") || op_is(op, "linalg.index"))
      return MlirWalkResultAdvance;
    if (!op_is(op, "linalg.generic")) {
      s->other = true;
      return MlirWalkResultAdvance;
    }
    bool in_row = is_claimed((walk *)s->w, op) || is_row_root(op);
    if (!in_row) {
      s->loose++;
      char it[JIT_MAX_RANK + 2];
      int nl = read_iterators(op, it, (int)sizeof it);
      for (int l = 0; l < nl; l++)
        if (it[l] != 'p') s->other = true;
      if (nl <= 0) s->other = true;
    }
  } else if (op_is(op, "bufferization.materialize_in_destination")) {
    MlirType t = mlirValueGetType(mlirOperationGetOperand(op, 0));
    int64_t bytes = static_shaped(t) ? shaped_bytes(t) : -1;
    if (bytes < 0) s->other = true;
    else s->out_bytes += bytes;
  }
  return MlirWalkResultAdvance;
}

// Sets out->stream and out->row_prefetch (above) for the module `w` planned.
static void plan_streams(const walk *w, MlirOperation module, jit__cpu_plan *out) {
  if (w->n_mm || strncmp(w->o->triple, "x86_64", 6) != 0) return;
  stream_walk s = {w, false, 0, 0};
  mlirOperationWalk(module, find_streams, &s, MlirWalkPreOrder);
  if (s.other) return;
  out->stream = s.out_bytes >= JIT__STREAM_BYTES;
  if (w->n_row == 1 && s.loose == 0 && w->row_bytes > 0 &&
      w->row_input_bytes >= JIT__PREFETCH_BYTES)
    out->row_prefetch = w->row_bytes;
}

static MlirWalkResult plan_op(MlirOperation op, void *user) {
  walk *w = user;
  if (op_is(op, "linalg.matmul") || op_is(op, "linalg.batch_matmul")) plan_matmul(w, op);
  return MlirWalkResultAdvance;
}

static MlirWalkResult plan_generic_op(MlirOperation op, void *user) {
  walk *w = user;
  if (op_is(op, "linalg.generic")) plan_generic(w, op);
  return MlirWalkResultAdvance;
}

//===--- Odd N -----------------------------------------------------------===//

// A matmul whose N is not a whole number of the plain register tile's width (N = 1000
// against 64 columns) is split, before planning, into a matmul over the columns up to
// the last multiple of that width and one over the rest (under 64 columns): each is
// then planned as any other matmul, the first with whole tiles (packed where B is
// large), the second as a narrow matmul (masked below four vectors). Planned whole,
// the block and tile sizes had to divide N's odd factors: 128x768x1000 ran in n blocks
// of 250 with 8x16 register tiles, at ~0.5x OpenBLAS. Small M as well (all rows in
// one tile): one vector of N lanes per row at N <= 128 (1x768x100 46 us against 4.4
// split), and whole vectors with the rest one column at a time above (16x2048x1000 1.33
// ms against 0.95, 8x768x1000 197 against 183 us; 1x768x1000 the same on one thread).
typedef struct split_walk {
  MlirContext ctx;
  host h;
  jit__text sb;
  int n;
} split_walk;

// Whether matmul `mm`, with N columns, is split at its odd N.
static bool splits_at_odd_n(const host *h, MlirOperation mm, int64_t N) {
  int64_t w = h->ptn, rest = N % w;
  if (N <= w || N <= 4 * h->lanes || !rest) return false;
  return N % h->tn != 0 || mlirOperationIsNull(epilogue_of(mm));
}

// x W^T whose rows pack B (not jit__cpu_bt_map's), still reading W through (n, k)
// because it is to be split (jit__cpu_normalize): split so, each part reads its own
// rows of W.
static MlirWalkResult find_odd_n(MlirOperation op, void *user) {
  static const int plain[6] = {0, 2, 2, 1, 0, 1};
  split_walk *s = user;
  if (!op_is(op, "linalg.matmul") || mlirOperationGetNumResults(op) != 1)
    return MlirWalkResultAdvance;
  bool bt = b_transposed(op);
  if (!bt && !maps_are(op, 3, 3, 2, plain, true)) return MlirWalkResultAdvance;
  MlirType ta = mlirValueGetType(mlirOperationGetOperand(op, 0));
  MlirType tb = mlirValueGetType(mlirOperationGetOperand(op, 1));
  if (!static_shaped(ta) || !static_shaped(tb) || mlirShapedTypeGetRank(ta) != 2 ||
      mlirShapedTypeGetRank(tb) != 2)
    return MlirWalkResultAdvance;
  if (bt && jit__cpu_bt_map(mlirShapedTypeGetDimSize(ta, 0), mlirShapedTypeGetDimSize(ta, 1),
                            mlirTypeIsAF16(mlirShapedTypeGetElementType(tb))))
    return MlirWalkResultAdvance;
  int64_t N = mlirShapedTypeGetDimSize(tb, bt ? 0 : 1), rest = N % s->h.ptn;
  if (!splits_at_odd_n(&s->h, op, N)) return MlirWalkResultAdvance;
  int j = s->n++;
  set_tag(s->ctx, op, "jit_sp", j);
  set_tag(s->ctx, op, "jit_n", (int)N);
  sb_printf(&s->sb,
            "  %%sp%d = transform.structured.match ops{[\"linalg.matmul\"]} attributes "
            "{jit_sp = %d : i64} in %%root : (" ANY ") -> " ANY "\n"
            "  %%spp%d = transform.structured.split %%sp%d after %lld {dimension = 1} : " ANY
            "\n",
            j, j, j, j, (long long)(N - rest));
  return MlirWalkResultAdvance;
}

char *jit__cpu_split_script(MlirContext ctx, MlirOperation module,
                            const jit__lower_options *o) {
  split_walk s;
  memset(&s, 0, sizeof s);
  s.ctx = ctx;
  s.h = host_of(o);
  sb_printf(&s.sb,
            "module attributes {transform.with_named_sequence} {\n"
            "transform.named_sequence @__transform_main(%%root: " ANY
            " {transform.readonly}) {\n");
  mlirOperationWalk(module, find_odd_n, &s, MlirWalkPreOrder);
  sb_printf(&s.sb, "  transform.yield\n}\n}\n");
  if (!s.n || s.sb.oom) {
    free(s.sb.p);
    return NULL;
  }
  return s.sb.p;
}

//===--- Small M split over K ----------------------------------------------===//

// A small-M matmul worth splitting across threads (plan_matmul: by the bytes of B) is
// split over N there, each thread streaming its columns of every row of B. Where a
// thread's part of a row is under a page (N x 4 / T < 4 KiB), that reads B in short
// pieces a page apart: the hardware prefetcher, which stops at page ends, restarts on
// each, and a thread's pieces all sit at the same page offsets, so in part of the L2
// sets only. Those split worse than on one thread (4x768x768: 63 us on one, 68 on two)
// or little better (1x1024x1024 141 -> 90-111 us), where x W^T, whose threads each read
// whole rows of W, took 23 and 38. From 4 rows, split over K was as fast or faster at
// any N (2 threads, split over N -> K: 4x768x3072 237 -> 187 us, 8x768x3072 245 -> 220,
// 16x1024x4096 1.00 -> 0.81 ms, 16x4096x4096 4.2 -> 3.6; 4x4096x4096 and 4x1024x4096
// the same); with 1 or 2 rows and a page a thread or more, over N stayed faster
// (1x4096x4096 1.09 against 1.18 ms). So those matmuls are split over K instead, before
// planning: C = init + sum over t of P[t], P = A[:, t K/T : (t+1) K/T] x B[t K/T ...]
// as a batch_matmul of T (B's rows are a free reshape, A's columns a small copy when
// M > 1), each thread one of its matmuls (plan_batch / plan_batch_vecmat split the
// batch by the same bytes of B), then one pass adding the T partial Cs into C.

// Parses `text`, a func.func of `n_args` arguments, and inlines its body before
// `before`, `args` for its arguments: *out is what it returns. False when `text` does
// not parse.
static bool inline_text(MlirContext ctx, const char *text, MlirOperation before,
                        const MlirValue *args, int n_args, MlirValue *out) {
  MlirModule m = mlirModuleCreateParse(ctx, mlirStringRefCreateFromCString(text));
  if (mlirModuleIsNull(m)) return false;
  MlirOperation fn = mlirBlockGetFirstOperation(mlirModuleGetBody(m));
  MlirBlock body = mlirRegionGetFirstBlock(mlirOperationGetRegion(fn, 0));
  enum { kMax = 64 };
  MlirValue from[kMax], to[kMax];
  int n = 0;
  for (int i = 0; i < n_args && n < kMax; i++, n++) {
    from[n] = mlirBlockGetArgument(body, i);
    to[n] = args[i];
  }
  bool ok = false;
  MlirBlock block = mlirOperationGetBlock(before);
  for (MlirOperation op = mlirBlockGetFirstOperation(body); !mlirOperationIsNull(op);
       op = mlirOperationGetNextInBlock(op)) {
    if (op_is(op, "func.return")) {
      MlirValue r = mlirOperationGetOperand(op, 0);
      for (int j = 0; j < n && !ok; j++)
        if (mlirValueEqual(from[j], r)) {
          *out = to[j];
          ok = true;
        }
      break;
    }
    MlirOperation c = mlirOperationClone(op);
    for (intptr_t k = 0; k < mlirOperationGetNumOperands(c); k++)
      for (int j = 0; j < n; j++)
        if (mlirValueEqual(from[j], mlirOperationGetOperand(c, k))) {
          mlirOperationSetOperand(c, k, to[j]);
          break;
        }
    mlirBlockInsertOwnedOperationBefore(block, before, c);
    for (intptr_t k = 0; k < mlirOperationGetNumResults(c) && n < kMax; k++, n++) {
      from[n] = mlirOperationGetResult(op, k);
      to[n] = mlirOperationGetResult(c, k);
    }
  }
  mlirModuleDestroy(m);
  return ok;
}

// The text of the K split (above) of M x K x N into T parts, as a func.func of A, B and
// C's init returning C.
static void k_split_text(jit__text *t, int64_t M, int64_t K, int64_t N, int T,
                         const char *ea, const char *eb) {
  long long m = M, k = K, n = N, kt = K / T, tt = T;
  sb_printf(t, "func.func @ks(%%a: tensor<%lldx%lldx%s>, %%b: tensor<%lldx%lldx%s>, "
               "%%c: tensor<%lldx%lldxf32>) -> tensor<%lldx%lldxf32> {\n",
            m, k, ea, k, n, eb, m, n, m, n);
  if (M == 1) {
    sb_printf(t, "  %%a1 = tensor.collapse_shape %%a [[0, 1]] : tensor<1x%lldx%s> into "
                 "tensor<%lldx%s>\n"
                 "  %%at = tensor.expand_shape %%a1 [[0, 1, 2]] output_shape [%lld, 1, %lld] "
                 ": tensor<%lldx%s> into tensor<%lldx1x%lldx%s>\n",
              k, ea, k, ea, tt, kt, k, ea, tt, kt, ea);
  } else {
    sb_printf(t,
              "  %%a3 = tensor.expand_shape %%a [[0], [1, 2]] output_shape [%lld, %lld, %lld] "
              ": tensor<%lldx%lldx%s> into tensor<%lldx%lldx%lldx%s>\n"
              "  %%ae = tensor.empty() : tensor<%lldx%lldx%lldx%s>\n"
              "  %%at = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (d1, d0, "
              "d2)>, affine_map<(d0, d1, d2) -> (d0, d1, d2)>], iterator_types = "
              "[\"parallel\", \"parallel\", \"parallel\"]} ins(%%a3 : "
              "tensor<%lldx%lldx%lldx%s>) outs(%%ae : tensor<%lldx%lldx%lldx%s>) {\n"
              "  ^bb0(%%x: %s, %%y: %s):\n    linalg.yield %%x : %s\n"
              "  } -> tensor<%lldx%lldx%lldx%s>\n",
              m, tt, kt, m, k, ea, m, tt, kt, ea, tt, m, kt, ea, m, tt, kt, ea, tt, m, kt, ea,
              ea, ea, ea, tt, m, kt, ea);
  }
  sb_printf(t,
            "  %%b3 = tensor.expand_shape %%b [[0, 1], [2]] output_shape [%lld, %lld, %lld] : "
            "tensor<%lldx%lldx%s> into tensor<%lldx%lldx%lldx%s>\n"
            "  %%z = arith.constant 0.0 : f32\n"
            "  %%pe = tensor.empty() : tensor<%lldx%lldx%lldxf32>\n"
            "  %%pf = linalg.fill ins(%%z : f32) outs(%%pe : tensor<%lldx%lldx%lldxf32>) -> "
            "tensor<%lldx%lldx%lldxf32>\n"
            "  %%p = linalg.batch_matmul ins(%%at, %%b3 : tensor<%lldx%lldx%lldx%s>, "
            "tensor<%lldx%lldx%lldx%s>) outs(%%pf : tensor<%lldx%lldx%lldxf32>) -> "
            "tensor<%lldx%lldx%lldxf32>\n",
            tt, kt, n, k, n, eb, tt, kt, n, eb, tt, m, n, tt, m, n, tt, m, n, tt, m, kt, ea,
            tt, kt, n, eb, tt, m, n, tt, m, n);
  for (int i = 0; i < T; i++)
    sb_printf(t,
              "  %%s%d = tensor.extract_slice %%p[%d, 0, 0] [1, %lld, %lld] [1, 1, 1] : "
              "tensor<%lldx%lldx%lldxf32> to tensor<%lldx%lldxf32>\n",
              i, i, m, n, tt, m, n, m, n);
  sb_printf(t, "  %%r = linalg.generic {indexing_maps = [");
  for (int i = 0; i <= T; i++)
    sb_printf(t, "%saffine_map<(d0, d1) -> (d0, d1)>", i ? ", " : "");
  sb_printf(t, "], iterator_types = [\"parallel\", \"parallel\"]} ins(");
  for (int i = 0; i < T; i++) sb_printf(t, "%s%%s%d", i ? ", " : "", i);
  sb_printf(t, " : ");
  for (int i = 0; i < T; i++) sb_printf(t, "%stensor<%lldx%lldxf32>", i ? ", " : "", m, n);
  sb_printf(t, ") outs(%%c : tensor<%lldx%lldxf32>) {\n  ^bb0(", m, n);
  for (int i = 0; i < T; i++) sb_printf(t, "%%x%d: f32, ", i);
  sb_printf(t, "%%o: f32):\n    %%u0 = arith.addf %%o, %%x0 : f32\n");
  for (int i = 1; i < T; i++)
    sb_printf(t, "    %%u%d = arith.addf %%u%d, %%x%d : f32\n", i, i - 1, i);
  sb_printf(t, "    linalg.yield %%u%d : f32\n  } -> tensor<%lldx%lldxf32>\n"
               "  return %%r : tensor<%lldx%lldxf32>\n}\n",
            T - 1, m, n, m, n);
}

// Whether `mm` is a small-M matmul (f32 or f16 A and B, f32 C) split over K at
// `threads` (above): 4 rows or more, or under a page of each row of B a thread; an N
// that is not a whole number of vectors only up to 12 rows.
static bool splits_k(const host *h, MlirOperation mm, int threads) {
  static const int plain[6] = {0, 2, 2, 1, 0, 1};
  if (threads < 2 || threads > 8 || !op_is(mm, "linalg.matmul") ||
      mlirOperationGetNumOperands(mm) != 3 || mlirOperationGetNumResults(mm) != 1 ||
      !maps_are(mm, 3, 3, 2, plain, true))
    return false;
  MlirType t[3];
  for (int i = 0; i < 3; i++) {
    t[i] = mlirValueGetType(mlirOperationGetOperand(mm, i));
    MlirType e = static_shaped(t[i]) ? mlirShapedTypeGetElementType(t[i]) : t[i];
    if (!static_shaped(t[i]) || mlirShapedTypeGetRank(t[i]) != 2 ||
        !(mlirTypeIsAF32(e) || (i < 2 && mlirTypeIsAF16(e))))
      return false;
  }
  int64_t M = mlirShapedTypeGetDimSize(t[0], 0), K = mlirShapedTypeGetDimSize(t[0], 1);
  int64_t N = mlirShapedTypeGetDimSize(t[1], 1);
  int64_t eb = mlirTypeIsAF16(mlirShapedTypeGetElementType(t[1])) ? 2 : 4;
  // Small M as plan_matmul has it (17 rows with B over half of L2 too: 2 threads,
  // 17x768x3072 0.59 -> 0.43 ms, 17x1024x1024 207 -> 163 us split over K).
  bool small_m = M <= 16 || (M == 17 && K * N * 4 > h->l2 / 2);
  // N not a whole number of vectors: split over N, the matmul is split at its odd N
  // first ("Odd N"), a batch is not. Up to 12 rows over K still did better (2 threads:
  // 1x1024x1000 70 -> 43 us, 4x768x1000 69 -> 47, 8x2048x1000 430 -> 215,
  // 12x1024x1000 256 -> 188); from 13 worse (13x1024x1000 163 -> 198,
  // 16x768x1000 124 -> 170).
  bool whole_vectors = N % h->lanes == 0 || M <= 12;
  return small_m && K % threads == 0 && K / threads >= 64 && whole_vectors &&
         (N * eb / threads < 4096 || M >= 4) && (double)K * N * 4 >= split_b_bytes(*h);
}

typedef struct ks_walk {
  const host *h;
  int threads;
  MlirOperation mm[16];
  int n;
} ks_walk;

static MlirWalkResult find_k_splits(MlirOperation op, void *user) {
  ks_walk *k = user;
  if (k->n < 16 && splits_k(k->h, op, k->threads)) k->mm[k->n++] = op;
  return MlirWalkResultAdvance;
}

int jit__cpu_split_k(MlirContext ctx, MlirOperation module, const jit__lower_options *o) {
  host h = host_of(o);
  ks_walk k = {&h, o->num_threads > 1 ? o->num_threads : 1, {{NULL}}, 0};
  mlirOperationWalk(module, find_k_splits, &k, MlirWalkPreOrder);
  int done = 0;
  for (int i = 0; i < k.n; i++) {
    MlirOperation mm = k.mm[i];
    MlirValue args[3];
    for (int j = 0; j < 3; j++) args[j] = mlirOperationGetOperand(mm, j);
    MlirType ta = mlirValueGetType(args[0]), tb = mlirValueGetType(args[1]);
    jit__text t = {0};
    k_split_text(&t, mlirShapedTypeGetDimSize(ta, 0), mlirShapedTypeGetDimSize(ta, 1),
                 mlirShapedTypeGetDimSize(tb, 1), k.threads,
                 mlirTypeIsAF16(mlirShapedTypeGetElementType(ta)) ? "f16" : "f32",
                 mlirTypeIsAF16(mlirShapedTypeGetElementType(tb)) ? "f16" : "f32");
    MlirValue c;
    bool ok = !t.oom && inline_text(ctx, t.p, mm, args, 3, &c);
    free(t.p);
    if (!ok) continue;  // planned whole, split over N
    mlirValueReplaceAllUsesOfWith(mlirOperationGetResult(mm, 0), c);
    mlirOperationDestroy(mm);
    done++;
  }
  return done;
}

//===--- Shared fills ----------------------------------------------------===//

// CSE (kPrePipeline) merges the zero fills of equal-shaped accumulators into one
// linalg.fill with several users: q, k and v projections of one x. Each plan fuses
// its fill into its own loops, and a fusion that took the shared fill could leave the
// next plan with nothing to fuse ("could not find next producer": a transformer block
// at 2 threads, whose row loop had fused the fill it shared with a threaded matmul).
// Each user gets its own copy before planning.
typedef struct fill_walk {
  MlirOperation fills[64];
  int n;
} fill_walk;

static MlirWalkResult find_shared_fills(MlirOperation op, void *user) {
  fill_walk *f = user;
  if (!op_is(op, "linalg.fill") || mlirOperationGetNumResults(op) != 1 || f->n >= 64)
    return MlirWalkResultAdvance;
  MlirOpOperand use = mlirValueGetFirstUse(mlirOperationGetResult(op, 0));
  if (!mlirOpOperandIsNull(use) && !mlirOpOperandIsNull(mlirOpOperandGetNextUse(use)))
    f->fills[f->n++] = op;
  return MlirWalkResultAdvance;
}

static void unshare_fills(MlirOperation module) {
  fill_walk f;
  f.n = 0;
  mlirOperationWalk(module, find_shared_fills, &f, MlirWalkPreOrder);
  for (int i = 0; i < f.n; i++) {
    MlirOperation fill = f.fills[i];
    MlirOperation owners[64];
    intptr_t pos[64];
    int n = 0;
    for (MlirOpOperand u = mlirValueGetFirstUse(mlirOperationGetResult(fill, 0));
         !mlirOpOperandIsNull(u) && n < 64; u = mlirOpOperandGetNextUse(u)) {
      owners[n] = mlirOpOperandGetOwner(u);
      pos[n++] = (intptr_t)mlirOpOperandGetOperandNumber(u);
    }
    MlirBlock block = mlirOperationGetBlock(fill);
    for (int k = 1; k < n; k++) {
      MlirOperation copy = mlirOperationClone(fill);
      mlirBlockInsertOwnedOperationAfter(block, fill, copy);
      mlirOperationSetOperand(owners[k], pos[k], mlirOperationGetResult(copy, 0));
    }
  }
}

//===--- x W^T as imported ------------------------------------------------===//

// Imported MLIR writes x W^T (W stored N x K, as a PyTorch Linear keeps it) either as a
// matmul reading W through the map (n, k), or as a transpose of W (linalg.transpose,
// generalized by then) feeding a plain matmul. The fast form depends on the rows, as
// emit_mlir.c chooses it for graphs (jit__cpu_bt_map): up to 17 rows read W through
// the map (plan_matmul_bt's dot products or in-register transposes); more rows pack B
// from W (plan_packed's b_tr), which needs the transpose as B's producer. Each form is
// rewritten into the other where it is the slow one: 8x768x3072 as transpose + matmul
// 2.06 ms -> 0.47 (a transposed copy of W per call), 64x768x3072 through the map 3.3-3.4
// ms -> 2.1.

// The transpose generic for ([batch x] N x K) -> ([batch x] K x N) of element type
// `et` applied to `w`, inserted before `before` (from text, inline_text); its result
// in *out.
static bool clone_transpose(MlirContext ctx, MlirType w_type, MlirOperation before,
                            MlirValue w, MlirValue *out) {
  char et[32], text[1600], in[64], res[64];
  intptr_t r = mlirShapedTypeGetRank(w_type);
  if (r != 2 && r != 3) return false;
  long long bt = r == 3 ? mlirShapedTypeGetDimSize(w_type, 0) : 1;
  long long n = mlirShapedTypeGetDimSize(w_type, r - 2), k = mlirShapedTypeGetDimSize(w_type, r - 1);
  MlirType e = mlirShapedTypeGetElementType(w_type);
  if (mlirTypeIsAF32(e)) snprintf(et, sizeof et, "f32");
  else if (mlirTypeIsAF16(e)) snprintf(et, sizeof et, "f16");
  else return false;
  char lead[24] = "";
  if (r == 3) snprintf(lead, sizeof lead, "%lldx", bt);
  snprintf(in, sizeof in, "tensor<%s%lldx%lldx%s>", lead, n, k, et);
  snprintf(res, sizeof res, "tensor<%s%lldx%lldx%s>", lead, k, n, et);
  const char *maps = r == 3 ? "affine_map<(d0, d1, d2) -> (d0, d2, d1)>, "
                              "affine_map<(d0, d1, d2) -> (d0, d1, d2)>"
                            : "affine_map<(d0, d1) -> (d1, d0)>, "
                              "affine_map<(d0, d1) -> (d0, d1)>";
  const char *iters = r == 3 ? "\"parallel\", \"parallel\", \"parallel\""
                             : "\"parallel\", \"parallel\"";
  snprintf(text, sizeof text,
           "func.func @t(%%w: %s) -> %s {\n"
           "  %%e = tensor.empty() : %s\n"
           "  %%t = linalg.generic {indexing_maps = [%s], iterator_types = [%s]} "
           "ins(%%w : %s) outs(%%e : %s) {\n"
           "  ^bb0(%%a: %s, %%b: %s):\n    linalg.yield %%a : %s\n"
           "  } -> %s\n"
           "  return %%t : %s\n}\n",
           in, res, res, maps, iters, in, res, et, et, et, res, res);
  return inline_text(ctx, text, before, &w, 1, out);
}

typedef struct bt_walk {
  MlirOperation mm[64];
  int n;
} bt_walk;

static MlirWalkResult find_2d_matmuls(MlirOperation op, void *user) {
  bt_walk *b = user;
  if ((op_is(op, "linalg.matmul") || op_is(op, "linalg.batch_matmul")) && b->n < 64)
    b->mm[b->n++] = op;
  return MlirWalkResultAdvance;
}

static bool batch_dot_planned(const host *h, MlirOperation bm) {
  MlirType ta = mlirValueGetType(mlirOperationGetOperand(bm, 0));
  if (!static_shaped(ta) || mlirShapedTypeGetRank(ta) != 3) return false;
  return batch_dot_rows(h, mlirShapedTypeGetDimSize(ta, 1), mlirShapedTypeGetDimSize(ta, 2));
}

// matmul / batch_matmul maps: B read as W (N x K, through (n, k)), or plainly (K x N).
static const char kMapsBt[] =
    "[affine_map<(m, n, k) -> (m, k)>, affine_map<(m, n, k) -> (n, k)>, "
    "affine_map<(m, n, k) -> (m, n)>]";
static const char kMapsPlain[] =
    "[affine_map<(m, n, k) -> (m, k)>, affine_map<(m, n, k) -> (k, n)>, "
    "affine_map<(m, n, k) -> (m, n)>]";
static const char kBatchMapsBt[] =
    "[affine_map<(b, m, n, k) -> (b, m, k)>, affine_map<(b, m, n, k) -> (b, n, k)>, "
    "affine_map<(b, m, n, k) -> (b, m, n)>]";
static const char kBatchMapsPlain[] =
    "[affine_map<(b, m, n, k) -> (b, m, k)>, affine_map<(b, m, n, k) -> (b, k, n)>, "
    "affine_map<(b, m, n, k) -> (b, m, n)>]";

// `mm`, whose B is made by a transpose (made_by_transpose), reads the transpose's input
// instead through `maps`; the transpose, B's only use, goes.
static void read_b_as_stored(MlirContext ctx, MlirOperation mm, const char *maps) {
  MlirAttribute a = mlirAttributeParseGet(ctx, mlirStringRefCreateFromCString(maps));
  if (mlirAttributeIsNull(a)) return;
  MlirOperation t = mlirOpResultGetOwner(mlirOperationGetOperand(mm, 1));
  mlirOperationSetOperand(mm, 1, mlirOperationGetOperand(t, 0));
  mlirOperationSetAttributeByName(mm, mlirStringRefCreateFromCString("indexing_maps"), a);
  mlirOperationDestroy(t);
}

// `mm`, reading its B through (n, k), reads a transpose of B (clone_transpose) through
// `maps` instead.
static void read_b_transposed(MlirContext ctx, MlirOperation mm, const char *maps) {
  MlirValue bv = mlirOperationGetOperand(mm, 1), wt;
  MlirType tb = mlirValueGetType(bv);
  MlirAttribute a = mlirAttributeParseGet(ctx, mlirStringRefCreateFromCString(maps));
  if (mlirAttributeIsNull(a) || !static_shaped(tb) || !clone_transpose(ctx, tb, mm, bv, &wt))
    return;
  mlirOperationSetOperand(mm, 1, wt);
  mlirOperationSetAttributeByName(mm, mlirStringRefCreateFromCString("indexing_maps"), a);
}

void jit__cpu_normalize(MlirContext ctx, MlirOperation module, const jit__lower_options *o) {
  static const int plain[6] = {0, 2, 2, 1, 0, 1};
  host h = host_of(o);
  bt_walk b;
  b.n = 0;
  mlirOperationWalk(module, find_2d_matmuls, &b, MlirWalkPreOrder);
  for (int i = 0; i < b.n; i++) {
    MlirOperation mm = b.mm[i];
    if (mlirOperationGetNumOperands(mm) != 3 || mlirOperationGetNumResults(mm) != 1) continue;
    MlirValue bv = mlirOperationGetOperand(mm, 1);
    if (op_is(mm, "linalg.batch_matmul")) {
      // Imported q K^T (K stored batch x N x K, read through (b, n, k)) that is not
      // planned as dot products (batch_dot_rows): a transpose of K and a plain
      // batch_matmul, planned as the graph's are (K^T planned ahead). Its loops were
      // left unplanned: 12x128x64x128 649 us against 133, 12x512x64x512 13.6 ms
      // against 2.1, 4x37x64x50 27 us against 10.
      // And the reverse: a transpose of K feeding a plain batch (emit_mlir.c's q K^T
      // above 4 rows) that the dot products take, reading K as stored: 12x8x256x512
      // 859 -> 292 us, 12x32x256x128 283 -> 196 (1 thread).
      if (batch_b_transposed(mm) && !batch_dot_planned(&h, mm))
        read_b_transposed(ctx, mm, kBatchMapsPlain);
      else if (batch_maps_plain(mm) && batch_dot_planned(&h, mm) &&
               made_by_transpose(bv, mm, true))
        read_b_as_stored(ctx, mm, kBatchMapsBt);
      continue;
    }
    MlirType tx = mlirValueGetType(mlirOperationGetOperand(mm, 0)), tb = mlirValueGetType(bv);
    if (!static_shaped(tx) || !static_shaped(tb) || mlirShapedTypeGetRank(tx) != 2 ||
        mlirShapedTypeGetRank(tb) != 2)
      continue;
    int64_t rows = mlirShapedTypeGetDimSize(tx, 0), k = mlirShapedTypeGetDimSize(tx, 1);
    bool f16 = mlirTypeIsAF16(mlirShapedTypeGetElementType(tb));
    // A matmul to be split at its odd N reads W through the map until then, so that
    // each part gets its own rows of W, and its own transpose after the split. Split
    // after the transpose, the parts read slices of one transposed copy of all of W,
    // which was made whole per call, B no longer packed from W: 64x512x1000 0.65 ms
    // against 0.38 for W stored K x N, 64x512x3000 2.4 against 1.3.
    MlirType tc = mlirValueGetType(mlirOperationGetResult(mm, 0));
    bool want_map = jit__cpu_bt_map(rows, k, f16) ||
                    (static_shaped(tc) && mlirShapedTypeGetRank(tc) == 2 &&
                     splits_at_odd_n(&h, mm, mlirShapedTypeGetDimSize(tc, 1)));
    if (want_map && maps_are(mm, 3, 3, 2, plain, true) && made_by_transpose(bv, mm, true))
      read_b_as_stored(ctx, mm, kMapsBt);  // transpose + matmul -> W through (n, k)
    else if (!want_map && b_transposed(mm))
      read_b_transposed(ctx, mm, kMapsPlain);  // -> a transpose of W and a plain matmul
  }
}


bool jit__cpu_plan_make(MlirContext ctx, MlirOperation module, const jit__lower_options *o,
                        jit__cpu_plan *out) {
  memset(out, 0, sizeof(*out));
  walk w;
  memset(&w, 0, sizeof w);
  w.ctx = ctx;
  w.o = o;
  w.h = host_of(o);
  w.threads = o->num_threads > 1 ? o->num_threads : 1;
  jit__text *sb = &w.sb;
  sb_printf(sb,
            "module attributes {transform.with_named_sequence} {\n"
            "transform.named_sequence @__transform_main(%%root: " ANY
            " {transform.readonly}) {\n");
  unshare_fills(module);
  // Matmuls first: they claim their epilogues, which the generic pass then skips.
  mlirOperationWalk(module, plan_op, &w, MlirWalkPreOrder);
  mlirOperationWalk(module, find_row_roots, &w, MlirWalkPreOrder);
  mlirOperationWalk(module, plan_generic_op, &w, MlirWalkPreOrder);
  out->wide_vectors = w.h.lanes == 16 && w.n_mm == 0;
  // With scf's loop canonicalization: an affine.min of a tile size in a peeled loop
  // folds to its constant (a producer fused into the register tiles, such as f16 A's
  // extension to f32, otherwise kept a dynamic row count that vectorize refuses).
  const char *canon =
      "  transform.apply_patterns to %f { transform.apply_patterns.canonicalization "
      "transform.apply_patterns.scf.for_loop_canonicalization } : " ANY "\n";
  sb_printf(sb, "  %%f = transform.structured.match ops{[\"func.func\"]} in %%root : "
                "(" ANY ") -> " ANY "\n%s",
            canon);
  // Row loops: the intermediates fused into them (exp(x - max) of one row) become
  // row-sized tensors, instead of slices of a full-size buffer that would go to memory.
  if (w.n_row)
    sb_printf(sb, "  transform.apply_patterns to %%f { "
                  "transform.apply_patterns.tensor.fold_tensor_empty } : " ANY "\n");
  // Vectorize what was tiled: register tiles of the matmuls (as named contractions,
  // which lower to outer products), their epilogues and fills, and elementwise tiles.
  for (int i = 0; i < w.n_mm; i++) {
    if (i < 64 && w.vecmat[i]) {
      sb_printf(sb,
                "  %%vm%d = transform.structured.match ops{[\"linalg.batch_matmul\"]} "
                "attributes {jit_mm = %d : i64} in %%f : (" ANY ") -> " ANY "\n"
                "  transform.structured.vectorize %%vm%d {create_named_contraction} : " ANY
                "\n"
                "  %%vf%d = transform.structured.match ops{[\"linalg.fill\"]} attributes "
                "{jit_f = %d : i64} in %%f : (" ANY ") -> " ANY "\n"
                "  transform.structured.vectorize %%vf%d : " ANY "\n",
                i, i, i, i, i, i);
      continue;
    }
    if (i < 64 && w.masked[i][0]) {
      // The peeled rest rows first: the full-tile match below would take them too.
      if (w.masked[i][2])
        sb_printf(sb,
                  "  %%vr%d = transform.structured.match ops{[\"linalg.matmul\"]} "
                  "attributes {jit_mm = %d : i64, jit_mrest} in %%f : (" ANY ") -> " ANY
                  "\n"
                  "  transform.structured.vectorize %%vr%d vector_sizes [%lld, %lld, 1] "
                  "{create_named_contraction} : " ANY
                  "\n",
                  i, i, i, (long long)w.masked[i][2], (long long)w.masked[i][0]);
      sb_printf(sb,
                "  %%vm%d = transform.structured.match ops{[\"linalg.matmul\"]} attributes "
                "{jit_mm = %d : i64} in %%f : (" ANY ") -> " ANY "\n"
                "  transform.structured.vectorize %%vm%d vector_sizes [%lld, %lld, 1] "
                "{create_named_contraction} : " ANY
                "\n",
                i, i, i, (long long)w.masked[i][1], (long long)w.masked[i][0]);
      continue;
    }
    sb_printf(sb,
              "  %%vm%d = transform.structured.match ops{[\"linalg.matmul\"]} attributes "
              "{jit_mm = %d : i64} in %%f : (" ANY ") -> " ANY "\n"
              "  transform.structured.vectorize %%vm%d {create_named_contraction} : " ANY
              "\n",
              i, i, i);
    if (i < 64 && w.fill_fused[i])
      sb_printf(sb,
                "  %%vff%d = transform.structured.match ops{[\"linalg.fill\"]} attributes "
                "{jit_f = %d : i64} in %%f : (" ANY ") -> " ANY "\n"
                "  transform.structured.vectorize %%vff%d : " ANY "\n",
                i, i, i);
  }
  // The register tiles' accumulators, which the epilogue rows below read back, as
  // tile-sized tensors rather than slices of a full-size one (which bufferized into a
  // C-sized malloc per call).
  if (w.n_fused)
    sb_printf(sb, "  transform.apply_patterns to %%f { "
                  "transform.apply_patterns.tensor.fold_tensor_empty } : " ANY "\n");
  for (int f = 0; f < w.n_fused; f++) {
    // The epilogue's matmul index is its jit_ep tag; read it back from the op.
    MlirAttribute a = mlirOperationGetDiscardableAttributeByName(
        w.fused[f], mlirStringRefCreateFromCString("jit_ep"));
    int i = (int)mlirIntegerAttrGetValueInt(a);
    // Each register tile's epilogue as a loop over its rows, one vector row each (the
    // accumulator goes through a tile-sized stack buffer in L1 on the way), not one
    // straight-line block for the whole tile: the tanh of gelu on a 6x16 tile was 12
    // copies of the exp sequence, and more in each peeled remainder. gelu(xW+b)
    // 32x768x3072 compiled in ~81 ms instead of ~100 (LLVM O2 + codegen 44 vs 66 ms, a
    // 5 KB object instead of 13 KB), 256x768x3072 in ~102 instead of ~127; run time
    // the same within noise (1 thread, 32: 2.23-2.27 vs 2.24 ms). After the peeling
    // and canonicalization, so every tile is static.
    sb_printf(sb,
              "  %%ve%d = transform.structured.match ops{[\"linalg.generic\"]} attributes "
              "{jit_ep = %d : i64} in %%f : (" ANY ") -> " ANY "\n"
              "  %%ver%d, %%verl%d = transform.structured.tile_using_for %%ve%d tile_sizes "
              "[1, 0] : (" ANY ") -> (" ANY ", " ANY ")\n"
              "  transform.structured.vectorize %%ver%d : " ANY "\n"
              "  %%vf%d = transform.structured.match ops{[\"linalg.fill\"]} attributes "
              "{jit_f = %d : i64} in %%f : (" ANY ") -> " ANY "\n"
              "  transform.structured.vectorize %%vf%d : " ANY "\n",
              i, i, i, i, i, i, i, i, i);
  }
  for (int i = 0; i < w.n_ew; i++) {
    if (i < 64 && w.ew_rest[i][1]) {
      // The partial tiles of a transposed read (13 x 16, 16 x 13, 13 x 13 at 333^2) in
      // rows of one, each a vector along the last dim reading the transposed input with
      // a stride: vectorized whole, each shape's transposes took longer to compile than
      // the rest of the kernel (exp(x + y^T) 333^2: 116 ms against 51, 77^2 122 against
      // 50, f16 128 against 60) for the same speed (28 us; 1030^2 157 against 148).
      int tl = w.ew_rest[i][0], nl = w.ew_rest[i][1];
      sb_printf(sb,
                "  %%vq%d = transform.structured.match ops{[\"linalg.generic\"]} attributes "
                "{jit_ew = %d : i64, jit_ewrest} in %%f : (" ANY ") -> " ANY "\n"
                "  %%vqt%d, %%vql%d = transform.structured.tile_using_for %%vq%d tile_sizes [",
                i, i, i, i, i);
      for (int l = 0; l < nl; l++) sb_printf(sb, "%s%d", l ? ", " : "", l == tl ? 1 : 0);
      sb_printf(sb, "] : (" ANY ") -> (" ANY ", " ANY ")\n"
                "  transform.structured.vectorize %%vqt%d : " ANY "\n", i);
    }
    sb_printf(sb,
              "  %%vw%d = transform.structured.match ops{[\"linalg.generic\"]} attributes "
              "{jit_ew = %d : i64} in %%f : (" ANY ") -> " ANY "\n",
              i, i);
    if (i >= 64 || !w.ew_bcast[i]) {
      sb_printf(sb, "  transform.structured.vectorize %%vw%d : " ANY "\n", i);
      continue;
    }
    // An input broadcast along the vector dim is read as vector<1 x V> with the map
    // (d0, d1) -> (d0, 0), which no pattern here turns into a load and a broadcast:
    // convert-vector-to-scf made it a loop of V scalar inserts through the stack, per
    // row (x + c with c (M, 1), 4096x1024: 2.8 ms against 1.4 for x + y). Without the
    // unit dims it is a 0-d read and a vector.broadcast.
    sb_printf(sb,
              "  %%vwp%d = transform.get_parent_op %%vw%d {op_name = \"scf.for\", deduplicate} "
              ": (" ANY ") -> " ANY "\n"
              "  transform.structured.vectorize %%vw%d : " ANY "\n"
              "  transform.apply_patterns to %%vwp%d {\n"
              "    transform.apply_patterns.vector.cast_away_vector_leading_one_dim\n"
              "    transform.apply_patterns.vector.transfer_permutation_patterns\n"
              "  } : " ANY "\n",
              i, i, i, i);
  }
  sb_printf(sb, "%s", canon);
  // Masked transfers as transfers with a mask operand, which the accumulator hoisting
  // below recognizes (inside vector.mask it does not).
  if (w.n_masked)
    sb_printf(sb, "  transform.apply_patterns to %%f { "
                  "transform.apply_patterns.vector.lower_masked_transfers } : " ANY "\n");
  // A batch of vector x matrix (plan_batch_vecmat) was vectorized with its unit dims:
  // dropped here, so its contraction is a vector x matrix one.
  if (w.any_vecmat)
    sb_printf(sb, "  transform.apply_patterns to %%f {\n"
                  "    transform.apply_patterns.vector.cast_away_vector_leading_one_dim\n"
                  "  } : " ANY "\n%s",
              canon);
  sb_printf(sb,
            "  %%fors = transform.structured.match ops{[\"scf.for\"]} in %%f : (" ANY
            ") -> " ANY "\n"
            "  transform.apply_licm to %%fors : " ANY "\n"
            "  transform.loop.hoist_loop_invariant_subsets %%fors : " ANY "\n%s"
            "  transform.apply_patterns to %%f {\n"
            "    transform.apply_patterns.vector.lower_contraction lowering_strategy = "
            "\"outerproduct\"\n"
            "    transform.apply_patterns.vector.transfer_permutation_patterns\n"
            "    transform.apply_patterns.vector.lower_outerproduct\n"
            "  } : " ANY "\n"
            "%s"
            "  transform.yield\n}\n}\n",
            canon,
            !w.transposes ? ""
            : w.h.lanes == 16
                ? "  transform.apply_patterns to %f {\n"
                  "    transform.apply_patterns.vector.lower_transpose lowering_strategy = "
                  "\"shuffle_16x16\"\n  } : " ANY "\n"
                : "  transform.apply_patterns to %f {\n"
                  "    transform.apply_patterns.vector.lower_transpose lowering_strategy = "
                  "\"shuffle_1d\"\n  } : " ANY "\n");
  out->n_ops = w.n_mm + w.n_ew + w.n_rd + w.n_row;
  out->n_pack = w.n_pack;
  out->n_masked = w.n_masked;
  memcpy(out->pack, w.pack, sizeof w.pack);
  out->parallel = w.parallel;
  out->unroll_k = w.unroll_k;
  out->threads = w.threads;
  plan_streams(&w, module, out);
  if (sb->oom) {
    free(sb->p);
    return false;
  }
  out->script = sb->p;
  return true;
}

//===--- Unrolled k loops ------------------------------------------------===//
//
// The k loop of a register tile is a dozen FMAs, two loads of B and the broadcasts of
// A. Unrolled by 4 it runs ~8 % faster at 1024^3 (1 thread, against OpenBLAS in the
// same process: 0.87-0.90x rolled, 0.96-1.0x unrolled), 2-8 % at 256^3, 512^3 and
// 128x3072x768, ~10 % for gelu(xW+b) at M = 32; no faster at small M or 17x1000x31.
// It costs compile time (the bigger loop through LLVM's codegen: ~9 % more
// instructions at 512^3), so only matmuls of 2^24 multiply-adds or more take it. The
// unrolling is LLVM's, steered by loop metadata that scf-to-cf carries over from each
// scf.for's `loop_annotation`: unrolling in the transform script before vectorization
// cost ~26 % more instructions per compile, and after bufferization ~26 % too (the
// copies go through every lowering). Every other loop is marked unroll.disable: the
// pass otherwise sizes each loop of the kernel, ~7 % of the compile.

static bool const_index(MlirValue v, int64_t *out) {
  if (!mlirValueIsAOpResult(v)) return false;
  MlirOperation d = mlirOpResultGetOwner(v);
  if (!op_is(d, "arith.constant")) return false;
  MlirAttribute a =
      mlirOperationGetAttributeByName(d, mlirStringRefCreateFromCString("value"));
  if (mlirAttributeIsNull(a) || !mlirAttributeIsAInteger(a)) return false;
  *out = mlirIntegerAttrGetValueInt(a);
  return true;
}

typedef struct unroll_walk {
  MlirStringRef name;         // "loop_annotation"
  MlirAttribute off, by2, by4;  // unroll.disable, count 2, count 4
  int n;
} unroll_walk;

static MlirWalkResult find_k_loops(MlirOperation op, void *user) {
  unroll_walk *uw = user;
  if (!op_is(op, "scf.for")) return MlirWalkResultAdvance;
  bool fma = false;
  MlirBlock body = mlirRegionGetFirstBlock(mlirOperationGetRegion(op, 0));
  for (MlirOperation o = mlirBlockGetFirstOperation(body); !mlirOperationIsNull(o) && !fma;
       o = mlirOperationGetNextInBlock(o))
    fma = op_is(o, "vector.fma");
  int64_t lb, ub, step, count = 0;
  if (fma && const_index(mlirOperationGetOperand(op, 0), &lb) &&
      const_index(mlirOperationGetOperand(op, 1), &ub) &&
      const_index(mlirOperationGetOperand(op, 2), &step) && step > 0 && ub > lb) {
    int64_t trips = (ub - lb + step - 1) / step;
    count = trips % 4 == 0 ? 4 : trips % 2 == 0 ? 2 : 0;
    if (trips <= count) count = 0;
  }
  mlirOperationSetDiscardableAttributeByName(
      op, uw->name, count == 4 ? uw->by4 : count == 2 ? uw->by2 : uw->off);
  uw->n += count > 0;
  return MlirWalkResultAdvance;
}

static MlirAttribute loop_unroll(MlirContext ctx, const char *what) {
  char text[96];
  snprintf(text, sizeof text, "#llvm.loop_annotation<unroll = #llvm.loop_unroll<%s>>",
           what);
  return mlirAttributeParseGet(ctx, mlirStringRefCreateFromCString(text));
}

int jit__cpu_unroll_k_loops(MlirContext ctx, MlirOperation module) {
  unroll_walk uw = {mlirStringRefCreateFromCString("loop_annotation"),
                    loop_unroll(ctx, "disable = true"), loop_unroll(ctx, "count = 2 : i32"),
                    loop_unroll(ctx, "count = 4 : i32"), 0};
  if (mlirAttributeIsNull(uw.off) || mlirAttributeIsNull(uw.by2) ||
      mlirAttributeIsNull(uw.by4))
    return 0;
  mlirOperationWalk(module, find_k_loops, &uw, MlirWalkPreOrder);
  return uw.n;
}

//===--- Masked accumulators without selects -----------------------------===//
//
// The masked register tiles of a narrow-N matmul (plan_masked) lower, row by row, to
// acc_r' = select(mask_r, fma(a_r, b, acc_r), acc_r): the masked-off lanes keep the
// accumulator. Those lanes (columns N and up) are never stored, as the tile's C write
// has a mask too, but LLVM cannot see that, and the select stayed as a register copy
// plus a masked move beside every FMA of the tile's last vector. Where nothing can read
// them, acc_r' = fma(a_r, b, acc_r). Checked here, per k loop:
// - each select's mask is a constant box (constant_mask, through extracts and
//   transposes) whose lanes cover columns [0, n);
// - the accumulator is a loop-carried vector used only by row extracts, each used only
//   by one such FMA (as its addend) and its select;
// - each select result goes, by vector.insert into the same row, through a chain of
//   such inserts to the loop's yield, at the accumulator's position;
// - the loop's result is used only by transfer writes masked to columns [0, m), m <= n.
// So lanes move only within their row and column, and those the writes read are the
// ones on which the select and the FMA agree.

#define JIT__MASK_RANK 4

static MlirAttribute attr_of(MlirOperation op, const char *name) {
  return mlirOperationGetAttributeByName(op, mlirStringRefCreateFromCString(name));
}

// Reads a DenseI64Array attribute into out[n]; false unless it has 1..max elements.
static bool i64_array(MlirAttribute a, int64_t *out, int *n, int max) {
  if (mlirAttributeIsNull(a) || !mlirAttributeIsADenseI64Array(a)) return false;
  intptr_t len = mlirDenseArrayGetNumElements(a);
  if (len > max) return false;
  for (intptr_t i = 0; i < len; i++) out[i] = mlirDenseI64ArrayGetElement(a, i);
  *n = (int)len;
  return true;
}

// When mask `v` is a constant box, lanes [0, size[d]) on in every dim d: its sizes.
static bool mask_box(MlirValue v, int64_t *size, int *rank, int depth) {
  if (depth > 8 || !mlirValueIsAOpResult(v)) return false;
  MlirOperation d = mlirOpResultGetOwner(v);
  if (op_is(d, "vector.constant_mask"))
    return i64_array(attr_of(d, "mask_dim_sizes"), size, rank, JIT__MASK_RANK);
  int64_t in[JIT__MASK_RANK], perm[JIT__MASK_RANK];
  int n = 0, np = 0;
  if (op_is(d, "vector.transpose")) {
    if (!mask_box(mlirOperationGetOperand(d, 0), in, &n, depth + 1) ||
        !i64_array(attr_of(d, "permutation"), perm, &np, JIT__MASK_RANK) || np != n)
      return false;
    for (int i = 0; i < n; i++) {
      if (perm[i] < 0 || perm[i] >= n) return false;
      size[i] = in[perm[i]];
    }
    *rank = n;
    return true;
  }
  if (op_is(d, "vector.extract") && mlirOperationGetNumOperands(d) == 1) {
    if (!mask_box(mlirOperationGetOperand(d, 0), in, &n, depth + 1) ||
        !i64_array(attr_of(d, "static_position"), perm, &np, n) || np >= n)
      return false;
    bool on = true;
    for (int i = 0; i < np; i++) on = on && perm[i] >= 0 && perm[i] < in[i];
    for (int i = np; i < n; i++) size[i - np] = on ? in[i] : 0;
    *rank = n - np;
    return true;
  }
  return false;
}

// The static single-index row of a vector.extract / vector.insert, or -1.
static int64_t row_of(MlirOperation op, int n_operands) {
  int64_t pos[JIT__MASK_RANK];
  int n = 0;
  if (mlirOperationGetNumOperands(op) != n_operands ||
      !i64_array(attr_of(op, "static_position"), pos, &n, JIT__MASK_RANK) || n != 1)
    return -1;
  return pos[0];
}

static bool only_use(MlirValue v, MlirOperation user) {
  MlirOpOperand u = mlirValueGetFirstUse(v);
  return !mlirOpOperandIsNull(u) && mlirOperationEqual(mlirOpOperandGetOwner(u), user) &&
         mlirOpOperandIsNull(mlirOpOperandGetNextUse(u));
}

typedef struct select_walk {
  MlirOperation found[256];
  int n;
} select_walk;

// For k loop `loop` and its iter_arg `pos`: collects the selects to drop into sw, or
// none if any check above fails.
static void masked_steps(MlirOperation loop, intptr_t pos, select_walk *sw) {
  MlirBlock body = mlirRegionGetFirstBlock(mlirOperationGetRegion(loop, 0));
  MlirValue acc = mlirBlockGetArgument(body, pos + 1);
  MlirOperation yield = mlirBlockGetTerminator(body);
  int64_t min_cols = INT64_MAX;  // the narrowest select mask's column extent
  int first = sw->n;
  for (MlirOpOperand u = mlirValueGetFirstUse(acc); !mlirOpOperandIsNull(u);
       u = mlirOpOperandGetNextUse(u)) {
    MlirOperation ex = mlirOpOperandGetOwner(u);
    int64_t r = op_is(ex, "vector.extract") ? row_of(ex, 1) : -1;
    if (r < 0) goto fail;
    // The row: the addend of one fma and the false value of one select of that fma.
    MlirValue row = mlirOperationGetResult(ex, 0);
    MlirOperation fma = {NULL}, sel = {NULL};
    for (MlirOpOperand v = mlirValueGetFirstUse(row); !mlirOpOperandIsNull(v);
         v = mlirOpOperandGetNextUse(v)) {
      MlirOperation o = mlirOpOperandGetOwner(v);
      unsigned k = mlirOpOperandGetOperandNumber(v);
      if (op_is(o, "vector.fma") && k == 2 && mlirOperationIsNull(fma)) fma = o;
      else if (op_is(o, "arith.select") && k == 2 && mlirOperationIsNull(sel)) sel = o;
      else goto fail;
    }
    if (mlirOperationIsNull(fma) || mlirOperationIsNull(sel) ||
        !mlirValueEqual(mlirOperationGetOperand(sel, 1), mlirOperationGetResult(fma, 0)) ||
        !only_use(mlirOperationGetResult(fma, 0), sel))
      goto fail;
    int64_t box[JIT__MASK_RANK];
    int rank = 0;
    if (!mask_box(mlirOperationGetOperand(sel, 0), box, &rank, 0) || rank != 1) goto fail;
    if (box[0] < min_cols) min_cols = box[0];
    // Into the same row, through inserts only, to the yield at `pos`.
    MlirValue cur = mlirOperationGetResult(sel, 0);
    MlirOpOperand next = mlirValueGetFirstUse(cur);
    if (mlirOpOperandIsNull(next) || !mlirOpOperandIsNull(mlirOpOperandGetNextUse(next)))
      goto fail;
    MlirOperation ins = mlirOpOperandGetOwner(next);
    if (!op_is(ins, "vector.insert") || mlirOpOperandGetOperandNumber(next) != 0 ||
        row_of(ins, 2) != r)
      goto fail;
    for (int hops = 0;; hops++) {
      next = mlirValueGetFirstUse(mlirOperationGetResult(ins, 0));
      if (hops > 64 || mlirOpOperandIsNull(next) ||
          !mlirOpOperandIsNull(mlirOpOperandGetNextUse(next)))
        goto fail;
      MlirOperation o = mlirOpOperandGetOwner(next);
      if (mlirOperationEqual(o, yield)) {
        if (mlirOpOperandGetOperandNumber(next) != (unsigned)pos) goto fail;
        break;
      }
      if (!op_is(o, "vector.insert") || mlirOpOperandGetOperandNumber(next) != 1 ||
          row_of(o, 2) < 0)
        goto fail;
      ins = o;
    }
    if (sw->n == 256) goto fail;
    sw->found[sw->n++] = sel;
  }
  if (sw->n == first) return;
  // The loop's result: masked writes of at most min_cols columns only.
  MlirOpOperand w = mlirValueGetFirstUse(mlirOperationGetResult(loop, pos));
  if (mlirOpOperandIsNull(w)) goto fail;
  for (; !mlirOpOperandIsNull(w); w = mlirOpOperandGetNextUse(w)) {
    MlirOperation o = mlirOpOperandGetOwner(w);
    intptr_t n = mlirOperationGetNumOperands(o);
    int64_t box[JIT__MASK_RANK];
    int rank = 0;
    if (!op_is(o, "vector.transfer_write") || mlirOpOperandGetOperandNumber(w) != 0 ||
        n < 3 || !mask_box(mlirOperationGetOperand(o, n - 1), box, &rank, 0) || rank < 1 ||
        box[rank - 1] > min_cols)
      goto fail;
  }
  return;
fail:
  sw->n = first;
}

static MlirWalkResult find_masked_steps(MlirOperation op, void *user) {
  if (!op_is(op, "scf.for")) return MlirWalkResultAdvance;
  for (intptr_t p = 0; p < mlirOperationGetNumResults(op); p++)
    masked_steps(op, p, user);
  return MlirWalkResultAdvance;
}

int jit__cpu_drop_mask_selects(MlirOperation module) {
  select_walk sw;
  sw.n = 0;
  mlirOperationWalk(module, find_masked_steps, &sw, MlirWalkPreOrder);
  for (int k = 0; k < sw.n; k++) {
    MlirOperation sel = sw.found[k];
    mlirValueReplaceAllUsesOfWith(mlirOperationGetResult(sel, 0),
                                  mlirOperationGetOperand(sel, 1));
    mlirOperationDestroy(sel);
  }
  return sw.n;
}

//===--- Scratch buffers on the stack ------------------------------------===//
//
// After one-shot bufferization, before deallocations are placed, two kinds of heap
// allocations become stack allocations at the top of the function (or of a thread's
// scf.forall body, never above it: each thread needs its own):
// - packed-B buffers (plan_packed), made once per call or per thread;
// - small scratch buffers (up to 16 KiB), such as softmax's per-row max and sum (two
//   malloc/free pairs per row before) and row buffer. One made inside a loop is per
//   iteration: nothing carries it into the next one (the checks below), so one buffer
//   serves them all.
// The stack is reused by every later call on the thread, with no malloc and no
// first-touch of fresh pages.

#define JIT__SCRATCH_BYTES (16 << 10)   // largest in-loop buffer moved
#define JIT__STACK_BYTES (320 << 10)    // all stack buffers of one function

typedef struct stack_walk {
  const jit__cpu_plan *plan;
  MlirOperation found[64];
  MlirBlock dest[64];  // the block the buffer moves to the top of
  int n;
  int64_t bytes;
} stack_walk;

static bool is_pack_type(const jit__cpu_plan *plan, MlirType t) {
  MlirType e = mlirShapedTypeGetElementType(t);
  if (mlirShapedTypeGetRank(t) != 3 || !(mlirTypeIsAF32(e) || mlirTypeIsAF16(e)))
    return false;
  for (int p = 0; p < plan->n_pack; p++) {
    bool same = true;
    for (int d = 0; d < 3; d++) same = same && mlirShapedTypeGetDimSize(t, d) == plan->pack[p][d];
    if (same) return true;
  }
  return false;
}


// The buffer never leaves its iteration: no use yields, returns or passes it on.
static bool stays_local(MlirValue v) {
  for (MlirOpOperand u = mlirValueGetFirstUse(v); !mlirOpOperandIsNull(u);
       u = mlirOpOperandGetNextUse(u)) {
    MlirOperation o = mlirOpOperandGetOwner(u);
    if (op_is(o, "scf.yield") || op_is(o, "func.return") || op_is(o, "func.call") ||
        op_is(o, "memref.store") || op_is(o, "scf.forall.in_parallel"))
      return false;
  }
  return true;
}

static MlirWalkResult find_stack_allocs(MlirOperation op, void *user) {
  stack_walk *sw = user;
  if (!op_is(op, "memref.alloc") || mlirOperationGetNumOperands(op) != 0 ||
      mlirOperationGetNumResults(op) != 1 || sw->n >= 64)
    return MlirWalkResultAdvance;
  MlirValue res = mlirOperationGetResult(op, 0);
  MlirType t = mlirValueGetType(res);
  if (!mlirTypeIsAMemRef(t) || !mlirShapedTypeHasStaticShape(t)) return MlirWalkResultAdvance;
  int64_t bytes = shaped_bytes(t);
  if (bytes < 0 || sw->bytes + bytes > JIT__STACK_BYTES) return MlirWalkResultAdvance;
  // Up through scf.for and scf.if to the function or the thread's body.
  MlirBlock b = mlirOperationGetBlock(op);
  int loops = 0;
  for (;;) {
    MlirOperation p = mlirBlockGetParentOperation(b);
    if (mlirOperationIsNull(p)) return MlirWalkResultAdvance;
    if (op_is(p, "func.func") || op_is(p, "scf.forall")) break;
    if (!op_is(p, "scf.for") && !op_is(p, "scf.if")) return MlirWalkResultAdvance;
    loops++;
    b = mlirOperationGetBlock(p);
  }
  bool pack = loops == 0 && is_pack_type(sw->plan, t);
  bool scratch = bytes <= JIT__SCRATCH_BYTES && stays_local(res);
  if (!pack && !scratch) return MlirWalkResultAdvance;
  sw->found[sw->n] = op;
  sw->dest[sw->n++] = b;
  sw->bytes += bytes;
  return MlirWalkResultAdvance;
}

int jit__cpu_stack_buffers(MlirContext ctx, MlirOperation module, const jit__cpu_plan *plan,
                           int64_t *bytes) {
  stack_walk sw;
  memset(&sw, 0, sizeof sw);
  sw.plan = plan;
  mlirOperationWalk(module, find_stack_allocs, &sw, MlirWalkPreOrder);
  for (int k = 0; k < sw.n; k++) {
    MlirOperation old = sw.found[k];
    MlirValue res = mlirOperationGetResult(old, 0);
    MlirType t = mlirValueGetType(res);
    MlirOperationState st = mlirOperationStateGet(
        mlirStringRefCreateFromCString("memref.alloca"), mlirOperationGetLocation(old));
    mlirOperationStateAddResults(&st, 1, &t);
    int32_t seg[2] = {0, 0};
    MlirNamedAttribute attrs[2] = {
        mlirNamedAttributeGet(mlirIdentifierGet(ctx, mlirStringRefCreateFromCString(
                                                         "operandSegmentSizes")),
                              mlirDenseI32ArrayGet(ctx, 2, seg)),
        mlirNamedAttributeGet(
            mlirIdentifierGet(ctx, mlirStringRefCreateFromCString("alignment")),
            mlirIntegerAttrGet(mlirIntegerTypeGet(ctx, 64), 64)),
    };
    mlirOperationStateAddAttributes(&st, 2, attrs);
    MlirOperation na = mlirOperationCreate(&st);
    // At the top of the block: an alloca in a loop would take new stack every time.
    mlirBlockInsertOwnedOperation(sw.dest[k], 0, na);
    mlirValueReplaceAllUsesOfWith(res, mlirOperationGetResult(na, 0));
    mlirOperationDestroy(old);
  }
  *bytes = sw.bytes;
  return sw.n;
}

void jit__cpu_plan_free(jit__cpu_plan *plan) {
  if (!plan) return;
  free(plan->script);
  plan->script = NULL;
}
