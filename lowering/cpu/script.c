//===--- script.c - the transform script: matmul plans to transform IR ---===//
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
#include "lowering/cpu/internal.h"

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


// Numbers matmul `mm` (the next i, tagged jit_mm = i) and tags its linalg.fill init,
// if it has one, jit_f = i.
static int tag_matmul(walk *w, MlirOperation mm, bool *has_fill) {
  int i = w->n_mm++;
  jit__cpu_set_tag(w->ctx, mm, "jit_mm", i);
  MlirValue init = mlirOperationGetOperand(mm, 2);
  MlirOperation fill = mlirOpResultGetOwner(init);
  *has_fill = mlirValueIsAOpResult(init) && jit__cpu_op_is(fill, "linalg.fill");
  if (*has_fill) jit__cpu_set_tag(w->ctx, fill, "jit_f", i);
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
          (double)Bt * K * N * 4 >= jit__cpu_split_b_bytes(w->h));
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
  jit__cpu_host h = w->h;
  bool split = batch_split(w, Bt, 1, K, N);
  int64_t tn = 8 * h.lanes < N ? 8 * h.lanes : N;
  int64_t kb = jit__cpu_pick_block(K, 8, 1);
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


// The multiply and add of matmul `mm`'s body allowed to fuse into one FMA (LLVM
// contracts them only with this flag); the vector ops made from the body keep it.
static void contract_body(MlirContext ctx, MlirOperation mm) {
  MlirBlock body = mlirRegionGetFirstBlock(mlirOperationGetRegion(mm, 0));
  MlirAttribute contract =
      mlirAttributeParseGet(ctx, mlirStringRefCreateFromCString("#arith.fastmath<contract>"));
  for (MlirOperation op = mlirBlockGetFirstOperation(body); !mlirOperationIsNull(op);
       op = mlirOperationGetNextInBlock(op))
    if (jit__cpu_op_is(op, "arith.mulf") || jit__cpu_op_is(op, "arith.addf"))
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
  jit__cpu_host h = w->h;
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
  jit__cpu_host h = w->h;
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
             (M <= 16 && (double)K * N * 4 >= jit__cpu_split_b_bytes(h));
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

// A generic of parallel loops only that reads its inputs in order (no transposed read)
// and is not a row loop's root.
static bool plain_elementwise(MlirOperation g) {
  char it[JIT_MAX_RANK + 2];
  int nl = jit__cpu_read_iterators(g, it, (int)sizeof it);
  if (nl <= 0) return false;
  for (int l = 0; l < nl; l++)
    if (it[l] != 'p') return false;
  return jit__cpu_transposed_loop(g, nl) < 0 && !jit__cpu_is_row_root(g);
}

static void plan_matmul(walk *w, MlirOperation mm) {
  MlirType ta = mlirValueGetType(mlirOperationGetOperand(mm, 0));
  MlirType tb = mlirValueGetType(mlirOperationGetOperand(mm, 1));
  MlirType tc = mlirValueGetType(mlirOperationGetOperand(mm, 2));
  bool batched = jit__cpu_op_is(mm, "linalg.batch_matmul");
  int rank = batched ? 3 : 2, o = batched ? 1 : 0;
  if (!jit__cpu_static_shaped(ta) || !jit__cpu_static_shaped(tb) || !jit__cpu_static_shaped(tc) ||
      mlirShapedTypeGetRank(ta) != rank || mlirShapedTypeGetRank(tb) != rank ||
      mlirOperationGetNumResults(mm) != 1)
    return;
  if (batched && jit__cpu_batch_b_transposed(mm)) {
    int64_t Bt = mlirShapedTypeGetDimSize(ta, 0), M = mlirShapedTypeGetDimSize(ta, 1);
    int64_t K = mlirShapedTypeGetDimSize(ta, 2), N = mlirShapedTypeGetDimSize(tb, 1);
    // Otherwise jit__cpu_normalize has made it a transpose and a plain batch_matmul; if
    // it could not, the loops stay unplanned (LLVM vectorizes their dot products).
    if (jit__cpu_batch_dot_rows(&w->h, M, K)) plan_batch_dot(w, mm, Bt, M, K, N);
    return;
  }
  if (batched && !jit__cpu_batch_maps_plain(mm)) return;
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
  if (!batched && jit__cpu_b_transposed(mm)) {
    plan_matmul_bt(w, mm, M, K, mlirShapedTypeGetDimSize(tb, 0));
    return;
  }
  int i = w->n_mm++;
  jit__text *sb = &w->sb;
  jit__cpu_host h = w->h;
  jit__cpu_set_tag(w->ctx, mm, batched ? "jit_bm" : "jit_mm", i);
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
  bool w_t = !batched && jit__cpu_made_by_transpose(bv, mm, true);
  bool apart = odd_n || (big_b && (w_t || K * 2 * h.tn * 4 > JIT__PACK_BYTES ||
                                   (h.lanes == 16 && M < 192 && K * N * 4 > h.l2)));
  MlirOperation g = small_m || apart || batched ? (MlirOperation){NULL} : jit__cpu_epilogue_of(mm);
  bool fused = !mlirOperationIsNull(g) && w->n_fused < 64;
  MlirOperation fill = mlirOpResultGetOwner(mlirOperationGetOperand(mm, 2));
  bool has_fill = mlirValueIsAOpResult(mlirOperationGetOperand(mm, 2)) &&
                  jit__cpu_op_is(fill, "linalg.fill");
  if (has_fill) jit__cpu_set_tag(w->ctx, fill, batched ? "jit_bf" : "jit_f", i);
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
                      (double)Bt * K * N * 4 >= jit__cpu_split_b_bytes(h));

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
             (small_m && (double)K * N * 4 >= jit__cpu_split_b_bytes(h));
  int64_t pnc = 0, pkc = 0;
  // The L2 that jit__cpu_pack_plan may fill half of with a whole-K block: measured on AVX-512
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
    bool n_ok = N % T == 0 && jit__cpu_pack_plan(M, N / T, K, tn, fused, big_l2, &pnc, &pkc);
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
                jit__cpu_pack_plan(tM, tN, K, tn, fused, big_l2, &pnc, &pkc);
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
    jit__cpu_set_tag(w->ctx, g, "jit_ep", i);
    w->fused[w->n_fused++] = g;
  }

  // Cache blocks: a kc x nc block of B (256 KiB) in L2; mc rows of A per pass.
  // Row blocks only serve the n blocks around them: without n blocks they would only
  // add a peeled remainder per block (200x300x300: mc 50 = 8 x 6 + 2; ~5 % slower).
  int64_t mc = jit__cpu_pick_block(tM, 64, tm), nc = jit__cpu_pick_block(tN, fused ? 128 : 256, tn);
  if (!nc) mc = 0;
  // No k blocks when all of B fits in L2 anyway (a narrow or small B).
  int64_t kc = fused || K * N * 4 <= (256 << 10) ? 0 : jit__cpu_pick_block(K, 256, 1);
  if (small_m) {
    mc = nc = 0;
    // k blocks of ~8 rows: as many concurrent streams of B as the prefetcher follows
    // well. At 16 rows, 1x768x3072 took 172-199 us vs 152-156 (8 rows), 8x768x3072
    // 680 vs 520 us; 4 and 12 rows were no better than 8.
    kc = jit__cpu_pick_block(K, 8, 1);
    // Each k block reads and writes the thread's rows of C, so they are kept in half of
    // L1 by n blocks when they would not fit: 8x768x3072 at 2 threads (a C half of 48
    // KiB) took 430-440 us with n blocks of 512 vs 490-650 us without (1 thread: the
    // same within noise). A single row (M = 1, 12 KiB) stays one block.
    if (M * tN * 4 > (h.l1 / 2)) nc = jit__cpu_pick_block(tN, (h.l1 / 2) / 4 / M, tn);
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
    kc = h.lanes < 16 ? jit__cpu_pick_block(K, JIT__MASKED_B_BYTES / 4 / mv, 1) : 0;
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
  bool a_made = mlirValueIsAOpResult(av) && jit__cpu_op_is(mlirOpResultGetOwner(av), "linalg.generic");
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
    MlirOperation t = jit__cpu_producer(v);
    if ((k == 1 && b_tr) || mlirOperationIsNull(t) || !jit__cpu_op_is(t, "linalg.generic") ||
        w->n_taken_t >= 16 || mlirShapedTypeGetRank(mlirValueGetType(v)) != (batched ? 3 : 2) ||
        (k == 0 && plain_elementwise(t)))
      continue;
    // B made for a batch split across the threads: its producer is split too (by the
    // batch), whatever its size, rather than run on one thread before the split batch
    // (2 threads, q K^T 12x128x64x128 with K^T its own op: 90 -> 70 us; plain B 63).
    w->ew_split = batched && batch_split && k == 1;
    jit__cpu_plan_generic(w, t);
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
    bool b_made = mlirValueIsAOpResult(bv) && jit__cpu_op_is(mlirOpResultGetOwner(bv), "linalg.generic");
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

static MlirWalkResult plan_op(MlirOperation op, void *user) {
  walk *w = user;
  if (jit__cpu_op_is(op, "linalg.matmul") || jit__cpu_op_is(op, "linalg.batch_matmul")) plan_matmul(w, op);
  return MlirWalkResultAdvance;
}

bool jit__cpu_plan_make(MlirContext ctx, MlirOperation module, const jit__lower_options *o,
                        jit__cpu_plan *out) {
  memset(out, 0, sizeof(*out));
  walk w;
  memset(&w, 0, sizeof w);
  w.ctx = ctx;
  w.o = o;
  w.h = jit__cpu_host_of(o);
  w.threads = o->num_threads > 1 ? o->num_threads : 1;
  jit__text *sb = &w.sb;
  sb_printf(sb,
            "module attributes {transform.with_named_sequence} {\n"
            "transform.named_sequence @__transform_main(%%root: " ANY
            " {transform.readonly}) {\n");
  jit__cpu_unshare_fills(module);
  // Matmuls first: they claim their epilogues, which the generic pass then skips.
  mlirOperationWalk(module, plan_op, &w, MlirWalkPreOrder);
  mlirOperationWalk(module, jit__cpu_find_row_roots, &w, MlirWalkPreOrder);
  mlirOperationWalk(module, jit__cpu_plan_generic_op, &w, MlirWalkPreOrder);
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
  jit__cpu_plan_streams(&w, module, out);
  if (sb->oom) {
    free(sb->p);
    return false;
  }
  out->script = sb->p;
  return true;
}
