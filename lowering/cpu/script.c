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
// On AVX-512 the same loops often read B in place instead (`b_in_place`, no panels:
// jit__cpu_plan_matmul says where): the k block of B is then walked N floats apart.
// With a fused epilogue G (`fused`: root is G's tile), kc = K and the loops are G's,
// the matmul and fill fused in at each level, so bias + activation run on the
// finished accumulator of each register tile as on the unpacked fused path:
//   for n block (nc)   pack B[:, n block]   for m tile   for n tile   k; G on the tile
// Tiles `cur` (a fused matmul's epilogue) by [rows, cols] (0: that loop not tiled;
// `interchange` [1, 0] puts the column loop outside) with tile_using_for, naming the
// results %<tile><i> and %<loops><i>:<n>, then fuses exactly its matmul (`mm`,
// updated) and that matmul's fill (`fill`, updated; "" for none) into the innermost
// new loop. structured.fuse would pull every producer in, a matmul before this one
// too: in (x W1) Wo + x at M >= 24 its tiles ended up inside Wo's, and hoist_pad
// failed ("transform.structured.hoist_pad failed to apply").
static void tile_fused(walk *w, int i, const char *tile, const char *loops, const char *cur,
                       int64_t rows, int64_t cols, bool interchange, char mm[32],
                       char fill[32]) {
  jit__text *sb = &w->sb;
  int n = (rows != 0) + (cols != 0);
  sb_printf(sb, "  %%%s%d, %%%s%d:%d = transform.structured.tile_using_for %s tile_sizes "
                "[%lld, %lld]%s : (" ANY ") -> ",
            tile, i, loops, i, n, cur, (long long)rows, (long long)cols,
            interchange ? " interchange = [1, 0]" : "");
  sb_types(sb, 1 + n);
  sb_printf(sb, "\n  %%%sm%d, %%%smc%d = transform.structured.fuse_into_containing_op %s "
                "into %%%s%d#%d : (" ANY ", " ANY ") -> (" ANY ", " ANY ")\n",
            tile, i, tile, i, mm, loops, i, n - 1);
  snprintf(mm, 32, "%%%sm%d", tile, i);
  if (fill[0]) {
    sb_printf(sb, "  %%%sf%d, %%%sfc%d = transform.structured.fuse_into_containing_op %s "
                  "into %%%smc%d : (" ANY ", " ANY ") -> (" ANY ", " ANY ")\n",
              tile, i, tile, i, fill, tile, i);
    snprintf(fill, 32, "%%%sf%d", tile, i);
  }
}

// Matmul i's k loop inside each register tile (after peeling, so every copy gets one).
static void emit_k_tiles(jit__text *sb, int i) {
  sb_printf(sb,
            "  %%mmr%d = transform.structured.match ops{[\"linalg.matmul\"]} attributes "
            "{jit_mm = %d : i64} in %%root : (" ANY ") -> " ANY "\n"
            "  %%mk%d, %%mkl%d = transform.structured.tile_using_for %%mmr%d tile_sizes "
            "[0, 0, 1] : (" ANY ") -> (" ANY ", " ANY ")\n",
            i, i, i, i, i);
}

static void plan_packed(walk *w, int i, const char *root, int64_t tM,
                        int64_t tN, int64_t K, int64_t tm, int64_t tn, int64_t nc,
                        int64_t kc, bool copy_a, bool fused, const char *a_ty,
                        const char *b_ty, bool b_tr, bool b_in_place, bool fill_tiles,
                        char mm[32], char fill[32]) {
  jit__text *sb = &w->sb;
  char hb[32];  // handle() text for sb_peel
  char cur[32];
  snprintf(cur, sizeof cur, "%s", root);
  int rows = kc % 8 == 0 ? 8 : kc % 4 == 0 ? 4 : kc % 2 == 0 ? 2 : 1;  // per panel copy
  if (nc < tN && fused) {
    // n blocks with the matmul and its fill fused in: each block's C columns are
    // zeroed right before they accumulate (never across k blocks: fusing the fill into
    // a k loop would zero C at every k block).
    tile_fused(w, i, "cb", "cbl", cur, 0, nc, false, mm, fill);
    snprintf(cur, sizeof cur, "%%cb%d", i);
  } else if (nc < tN) {
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
  if (fused) {
    tile_fused(w, i, "rg", "rl", cur, tm, tn, false, mm, fill);
    sb_printf(sb,
              "  %%rt%d = transform.structured.match ops{[\"linalg.matmul\"]} in %%rl%d#1 "
              ": (" ANY ") -> " ANY "\n",
              i, i);
  } else if (fill_tiles && kc == K) {
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
  if (b_in_place) {
    // The same loops, the register tiles reading B where it is (jit__cpu_plan_matmul).
    if (tM % tm) sb_peel(sb, "qm", i, handle(hb, "rl", i, 0));
    emit_k_tiles(sb, i);
    return;
  }
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
  emit_k_tiles(sb, i);
  if (w->n_pack < JIT__CPU_MAX_PACK) {
    w->pack[w->n_pack][0] = nc / tn;
    w->pack[w->n_pack][1] = kc;
    w->pack[w->n_pack][2] = tn;
    w->n_pack++;
  }
}

//===--- Masked narrow N -------------------------------------------------===//

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
  emit_k_tiles(sb, i);
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
  jit__text *hd = split ? &w->pre : sb;  // a thread loop: ahead of all tiles (walk.pre)
  sb_printf(hd,
            "  %%bm%d = transform.structured.match ops{[\"linalg.batch_matmul\"]} attributes "
            "{%s = %d : i64} in %%root : (" ANY ") -> " ANY "\n",
            i, mm_tag, i);
  if (has_fill)
    sb_printf(hd,
              "  %%bf%d = transform.structured.match ops{[\"linalg.fill\"]} attributes "
              "{%s = %d : i64} in %%root : (" ANY ") -> " ANY "\n",
              i, fill_tag, i);
  char cur[32];
  snprintf(cur, sizeof cur, "%%bm%d", i);
  if (split) {
    w->parallel = true;
    sb_printf(hd,
              "  %%bt%d, %%bp%d = transform.structured.tile_using_forall %%bm%d num_threads "
              "[%d] : (" ANY ") -> (" ANY ", " ANY ")\n",
              i, i, i, w->threads);
    if (has_fill)
      sb_printf(hd,
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

// A batch of vector x matrix products (batch_matmul with M = 1; jit__cpu_plan_vecmat
// chooses): the batch_matmul is tiled as it is (batch by 1, k blocks, n by 8 vectors,
// k) and vectorized with its unit dims, which vector.cast_away_vector_leading_one_dim
// drops before the contraction becomes FMAs.
static void plan_batch_vecmat(walk *w, MlirOperation bm, int64_t Bt, int64_t K, int64_t N) {
  bool has_fill;
  int i = tag_matmul(w, bm, &has_fill);
  jit__text *sb = &w->sb;
  char hb[32];  // handle() text for sb_peel
  jit__cpu_vecmat_plan p = jit__cpu_plan_vecmat(Bt, K, N, &w->h, w->threads);
  w->vecmat[i] = true;
  w->any_vecmat = true;
  // Its k loops are not unrolled (unroll_k): with the k blocks outside the n tiles,
  // unrolled or not ran the same (2x1x2048x1024, 4x1x1024x1024, 8x1x4096x256, 1 and 2
  // threads), and unrolled took 6-10 ms longer to compile.
  sb_printf(sb, "  // matmul %d: a batch of %lld vector x matrix 1x%lldx%lld, threads split %s, "
                "n tile %lld, k blocks %lld\n",
            i, (long long)Bt, (long long)K, (long long)N, p.split ? "the batch" : "none",
            (long long)p.tn, (long long)p.kb);
  batch_loop(w, i, "jit_mm", "jit_f", has_fill, p.split);
  // k blocks outside the n tiles (as on the 2-D small-M path), so each block streams
  // whole rows of B: with the n tiles outside, every row was read in pieces of 8
  // vectors, one n tile at a time (1 thread: 2x1x2048x1024 1.03 -> 0.58 ms,
  // 2x1x1024x8192 4.3 -> 2.3, 8x1x4096x256 1.7 -> 1.2, 4x1x1000x999 0.62 -> 0.55;
  // 12x1x64x1024 and 12x1x1024x64 the same, at 2 threads 24 -> 19 and the same).
  char cur[32];
  snprintf(cur, sizeof cur, "%%b1_%d", i);
  if (p.kb) {
    sb_printf(sb,
              "  %%bkt%d, %%bkl%d = transform.structured.tile_using_for %%b1_%d tile_sizes "
              "[0, 0, 0, %lld] : (" ANY ") -> (" ANY ", " ANY ")\n",
              i, i, i, (long long)p.kb);
    if (p.peel_k) sb_peel(sb, "bkq", i, handle(hb, "bkl", i, -1));
    sb_printf(sb,
              "  %%bk%d = transform.structured.match ops{[\"linalg.batch_matmul\"]} "
              "attributes {jit_mm = %d : i64} in %%root : (" ANY ") -> " ANY "\n",
              i, i);
    snprintf(cur, sizeof cur, "%%bk%d", i);
  }
  sb_printf(sb,
            "  %%bn%d, %%bnl%d = transform.structured.tile_using_for %s tile_sizes "
            "[0, 0, %lld, 0] : (" ANY ") -> (" ANY ", " ANY ")\n",
            i, i, cur, (long long)p.tn);
  if (p.peel_n) sb_peel(sb, "bq", i, handle(hb, "bnl", i, -1));
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


// The register tiles of plan `p` over matmul i's op `cur` (linalg.matmul, or the
// batch's 2-D body: `batched` puts the batch loop first), the loop over n outside the
// loop over m when both are tiled; each partial last tile peeled, the inner loop first:
// peeling the outer one copies the inner loop.
static void emit_dot_tiles(walk *w, int i, const char *cur, const jit__cpu_dot_plan *p,
                           bool batched) {
  jit__text *sb = &w->sb;
  char hb[32];  // handle() text for sb_peel
  int nreg = p->tile_m + p->tile_n;
  bool nout = p->tile_m && p->tile_n;
  if (!nreg) return;
  sb_printf(sb, "  %%rt%d, %%rl%d:%d = transform.structured.tile_using_for %s tile_sizes "
                "[%s%lld, %lld, 0]%s : (" ANY ") -> ",
            i, i, nreg, cur, batched ? "0, " : "", (long long)(p->tile_m ? p->tm : 0),
            (long long)(p->tile_n ? p->tn : 0),
            !nout ? "" : batched ? " interchange = [0, 2, 1, 3]" : " interchange = [1, 0, 2]");
  sb_types(sb, nreg + 1);
  sb_printf(sb, "\n");
  if (nout) {
    if (p->peel_m) sb_peel(sb, "qm", i, handle(hb, "rl", i, 1));
    if (p->peel_n) sb_peel(sb, "qn", i, handle(hb, "rl", i, 0));
  } else {
    if (p->peel_n) sb_peel(sb, "qn", i, handle(hb, "rl", i, 0));
    if (p->peel_m) sb_peel(sb, "qm", i, handle(hb, "rl", i, 0));
  }
}

// A batch of x W^T with few rows (jit__cpu_plan_batch_dot chooses): the batch loop,
// then register tiles, each a set of dot products along k (plan_matmul_dot).
static void plan_batch_dot(walk *w, MlirOperation bm, int64_t Bt, int64_t M, int64_t K,
                           int64_t N) {
  bool has_fill;
  int i = tag_matmul(w, bm, &has_fill);
  jit__text *sb = &w->sb;
  jit__cpu_dot_plan p = jit__cpu_plan_batch_dot(Bt, M, K, N, &w->h, w->threads);
  contract_body(w->ctx, bm);
  sb_printf(sb, "  // matmul %d: a batch of %lld %lldx%lldx%lld, B transposed, dot products, "
                "threads split %s, register tile %lldx%lld\n",
            i, (long long)Bt, (long long)M, (long long)K, (long long)N,
            p.split ? "the batch" : "none", (long long)p.tm, (long long)p.tn);
  batch_loop(w, i, "jit_mm", "jit_f", has_fill, p.split);
  char cur[32];
  snprintf(cur, sizeof cur, "%%b1_%d", i);
  emit_dot_tiles(w, i, cur, &p, true);
  plan_matmul_dot(w, i, "linalg.batch_matmul", 3, p.L);
}

// x W^T with W stored N x K (jit__cpu_plan_matmul_bt chooses, and says why): threads
// split N; register tiles as dot products along k (plan_matmul_dot), or stepping k by
// one vector's lanes, B's L x L blocks transposed in registers.
static void plan_matmul_bt(walk *w, MlirOperation mm, int64_t M, int64_t K, int64_t N) {
  bool has_fill;
  int i = tag_matmul(w, mm, &has_fill);
  jit__text *sb = &w->sb;
  char hb[32];  // handle() text for sb_peel
  jit__cpu_dot_plan p = jit__cpu_plan_matmul_bt(M, K, N, &w->h, w->threads);
  int64_t L = p.L;
  if (p.dot) contract_body(w->ctx, mm);
  if (!p.dot) w->transposes = true;
  if (p.unroll_k) w->unroll_k = true;
  sb_printf(sb, "  // matmul %d: %lldx%lldx%lld, B transposed%s, threads split %s, register "
                "tile %lldx%lld, k step %lld\n",
            i, (long long)M, (long long)K, (long long)N, p.dot ? ", dot products" : "",
            p.split ? "N" : "none", (long long)p.tm, (long long)p.tn, (long long)L);
  jit__text *hd = p.split ? &w->pre : sb;  // a thread loop: ahead of all tiles (walk.pre)
  sb_printf(hd,
            "  %%mm%d = transform.structured.match ops{[\"linalg.matmul\"]} attributes "
            "{jit_mm = %d : i64} in %%root : (" ANY ") -> " ANY "\n",
            i, i);
  char cur[32];
  snprintf(cur, sizeof cur, "%%mm%d", i);
  if (p.split) {
    w->parallel = true;
    sb_printf(hd,
              "  %%pt%d, %%pf%d = transform.structured.tile_using_forall %%mm%d tile_sizes "
              "[0, %lld, 0] : (" ANY ") -> (" ANY ", " ANY ")\n",
              i, i, i, (long long)p.tN);
    if (has_fill)
      sb_printf(hd,
                "  %%fl%d = transform.structured.match ops{[\"linalg.fill\"]} attributes "
                "{jit_f = %d : i64} in %%root : (" ANY ") -> " ANY "\n"
                "  %%pl%d, %%pf%d_2 = transform.structured.fuse_into_containing_op %%fl%d "
                "into %%pf%d : (" ANY ", " ANY ") -> (" ANY ", " ANY ")\n",
                i, i, i, i, i, i);
    snprintf(cur, sizeof cur, "%%pt%d", i);
  }
  emit_dot_tiles(w, i, cur, &p, false);
  if (p.dot) {
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

// Whether `v` is a kernel argument declared with jit_weight, or a slice or reshape of
// one: a packing of it may be made once (lowering/cpu/prepack.c).
static bool is_weight(const jit__lower_options *o, MlirValue v) {
  if (!o->weights) return false;
  for (int depth = 0; depth < 8 && mlirValueIsAOpResult(v); depth++) {
    MlirOperation op = mlirOpResultGetOwner(v);
    if (!jit__cpu_op_is(op, "tensor.extract_slice") &&
        !jit__cpu_op_is(op, "tensor.collapse_shape") &&
        !jit__cpu_op_is(op, "tensor.expand_shape"))
      return false;
    v = mlirOperationGetOperand(op, 0);
  }
  if (!mlirValueIsABlockArgument(v)) return false;
  MlirOperation owner = mlirBlockGetParentOperation(mlirBlockArgumentGetOwner(v));
  intptr_t arg = mlirBlockArgumentGetArgNumber(v);
  return jit__cpu_op_is(owner, "func.func") && arg >= 0 && arg < (intptr_t)o->n_weights &&
         o->weights[arg];
}

// The matmul's shapes and surroundings, as jit__cpu_plan_matmul reads them.
static jit__cpu_mm_shape mm_shape_of(const jit__lower_options *o, MlirOperation mm,
                                     bool batched, int64_t Bt, int64_t M, int64_t K,
                                     int64_t N) {
  jit__cpu_mm_shape s = {.M = M, .K = K, .N = N, .Bt = Bt, .batched = batched, .whole_n = N};
  // Part of a matmul split at its odd N ("Odd N"): the parts are split across threads
  // as the whole would be (210x600x160 at 2 threads, a 128 and a 32 column part:
  // 281 us on one thread, 150 split).
  MlirAttribute wn =
      mlirOperationGetAttributeByName(mm, mlirStringRefCreateFromCString("jit_n"));
  if (!mlirAttributeIsNull(wn) && mlirAttributeIsAInteger(wn))
    s.whole_n = mlirIntegerAttrGetValueInt(wn);
  MlirType ea = mlirShapedTypeGetElementType(mlirValueGetType(mlirOperationGetOperand(mm, 0)));
  MlirType eb = mlirShapedTypeGetElementType(mlirValueGetType(mlirOperationGetOperand(mm, 1)));
  s.floats = (mlirTypeIsAF32(ea) || mlirTypeIsAF16(ea)) &&
             (mlirTypeIsAF32(eb) || mlirTypeIsAF16(eb));
  s.a_f16 = mlirTypeIsAF16(ea);
  s.b_f16 = mlirTypeIsAF16(eb);
  s.epilogue = !batched && !mlirOperationIsNull(jit__cpu_epilogue_of(mm));
  MlirValue av = mlirOperationGetOperand(mm, 0), bv = mlirOperationGetOperand(mm, 1);
  s.b_from_transpose = !batched && jit__cpu_made_by_transpose(bv, mm, true);
  s.a_made = mlirValueIsAOpResult(av) &&
             jit__cpu_op_is(mlirOpResultGetOwner(av), "linalg.generic");
  s.b_made = mlirValueIsAOpResult(bv) &&
             jit__cpu_op_is(mlirOpResultGetOwner(bv), "linalg.generic");
  s.b_weight = is_weight(o, bv);
  return s;
}

// The plan's comment, batch loop, matches and thread split; `root` receives the
// handle the cache blocks start from.
static void emit_mm_head(walk *w, int i, const jit__cpu_mm_shape *s, const jit__cpu_mm_plan *p,
                         bool has_fill, char root[32]) {
  int64_t M = s->M, K = s->K, N = s->N, Bt = s->Bt;
  int64_t tM = p->tM, tN = p->tN, mc = p->mc, nc = p->nc, kc = p->kc, tm = p->tm, tn = p->tn;
  bool fused = p->fused, packed = p->packed, masked = p->masked, b_tr = p->b_tr;
  bool copy_a = p->copy_a, batched = s->batched;
  int split = p->split;
  jit__text *sb = &w->sb;
  const char *zk = fused ? "" : ", 0";
  sb_printf(sb, "  // matmul %d: %lldx%lldx%lld%s%s%s, threads split %s, blocks [%lld, "
                "%lld, %lld], register tile %lldx%lld%s\n",
            i, (long long)M, (long long)K, (long long)N, fused ? " + epilogue" : "",
            packed ? (b_tr ? ", B packed from W^T"
                      : p->b_in_place ? ", B read in place" : ", B packed")
            : masked ? ", masked N" : "",
            copy_a ? ", A tiles copied" : "",
            split == 0 ? "M" : split == 1 ? "N" : "none", (long long)mc, (long long)nc,
            (long long)kc, (long long)tm, (long long)tn,
            p->small_m && !masked ? ", small M: B read in place" : "");
  if (batched) plan_batch(w, i, Bt, has_fill, p->batch_split);
  // A thread loop goes ahead of all tiles (walk.pre); not a batch's matmul, which only
  // exists once its batch loop is tiled.
  jit__text *hd = split >= 0 && !batched ? &w->pre : sb;
  sb_printf(hd,
            "  %%mm%d = transform.structured.match ops{[\"linalg.matmul\"]} attributes "
            "{jit_mm = %d : i64} in %%root : (" ANY ") -> " ANY "\n",
            i, i);
  if (fused)
    sb_printf(hd,
              "  %%ep%d = transform.structured.match ops{[\"linalg.generic\"]} "
              "attributes {jit_ep = %d : i64} in %%root : (" ANY ") -> " ANY "\n",
              i, i);
  if (has_fill)
    sb_printf(hd,
              "  %%fl%d = transform.structured.match ops{[\"linalg.fill\"]} attributes "
              "{jit_f = %d : i64} in %%root : (" ANY ") -> " ANY "\n",
              i, i);
  snprintf(root, 32, fused ? "%%ep%d" : "%%mm%d", i);

  if (split >= 0) {
    w->parallel = true;
    sb_printf(hd,
              "  %%pt%d, %%pf%d = transform.structured.tile_using_forall %s tile_sizes "
              "[%lld, %lld%s] : (" ANY ") -> (" ANY ", " ANY ")\n",
              i, i, root, (long long)tM, (long long)tN, zk);
    if (fused)
      sb_printf(hd,
                "  %%pm%d, %%pf%d_1 = transform.structured.fuse_into_containing_op %%mm%d "
                "into %%pf%d : (" ANY ", " ANY ") -> (" ANY ", " ANY ")\n",
                i, i, i, i);
    if (has_fill)
      sb_printf(hd,
                "  %%pl%d, %%pf%d_2 = transform.structured.fuse_into_containing_op %%fl%d "
                "into %%pf%d%s : (" ANY ", " ANY ") -> (" ANY ", " ANY ")\n",
                i, i, i, i, fused ? "_1" : "");
    snprintf(root, 32, "%%pt%d", i);
  }
  (void)N, (void)tM, (void)tN, (void)mc, (void)nc, (void)kc, (void)packed, (void)masked;
  (void)M, (void)K, (void)tm, (void)tn, (void)b_tr, (void)copy_a, (void)split;
}

// Cache blocks, register tiles, peeling and the k loop of an unpacked, unmasked plan.
static void emit_mm_tiles(walk *w, int i, const jit__cpu_mm_plan *p, bool has_fill,
                          char root[32], char mm[32], char fill[32]) {
  int64_t mc = p->mc, nc = p->nc, kc = p->kc, tm = p->tm, tn = p->tn, em = p->em, en = p->en;
  bool fused = p->fused, narrow_rest = p->narrow_rest;
  jit__text *sb = &w->sb;
  char hb[32];  // handle() text for sb_peel
  (void)hb;
  const char *zk = fused ? "" : ", 0";  // the matmul has a k loop to leave alone
  if ((mc || nc) && fused) {
    tile_fused(w, i, "cb", "cbl", root, mc, nc, mc && nc, mm, fill);
    snprintf(root, 32, "%%cb%d", i);
  } else if (mc || nc) {
    int nl = (mc != 0) + (nc != 0);
    sb_printf(sb, "  %%cb%d, %%cbl%d:%d = transform.structured.fuse %s tile_sizes [%lld, "
                  "%lld%s] interchange [1, 0%s] : (" ANY ") -> ",
              i, i, nl, root, (long long)mc, (long long)nc, zk, fused ? "" : ", 2");
    sb_types(sb, nl + 1);
    sb_printf(sb, "\n");
    snprintf(root, 32, "%%cb%d", i);
  }
  int nreg = (tm < em ? 1 : 0) + (tn < en ? 1 : 0);
  const char *lm = NULL, *ln = NULL;  // loop handles to peel
  char lmb[32], lnb[32];
  if (fused) {
    // Register tile of G with the matmul (and fill) fused in.
    if (nreg) {
      tile_fused(w, i, "rg", "rl", root, tm < em ? tm : 0, tn < en ? tn : 0, false, mm,
                 fill);
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
    if (nreg && has_fill && !kc) {
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
  emit_k_tiles(sb, i);
}

// Writes the transform IR of matmul i's plan `p`.
static void emit_matmul(walk *w, int i, const jit__cpu_mm_shape *s, const jit__cpu_mm_plan *p,
                        bool has_fill) {
  char root[32], mm[32], fill[32] = "";
  emit_mm_head(w, i, s, p, has_fill, root);
  // The handles of the matmul and its fill for tile_fused: inside the threads' forall
  // when there is one.
  bool split = p->split >= 0;
  snprintf(mm, sizeof mm, split && p->fused ? "%%pm%d" : "%%mm%d", i);
  if (has_fill) snprintf(fill, sizeof fill, split ? "%%pl%d" : "%%fl%d", i);
  int64_t K = s->K, tM = p->tM, tN = p->tN, nc = p->nc, kc = p->kc, tm = p->tm, tn = p->tn;
  bool fused = p->fused, copy_a = p->copy_a, b_tr = p->b_tr, a_made = s->a_made;
  if (p->packed) {
    // The fill fused into the register tiles only where it is their one producer
    // (structured.fuse would pull B's transpose, or A's elementwise producer, in too).
    bool b_made = s->b_made;
    plan_packed(w, i, root, tM, tN, K, tm, tn, nc, kc, copy_a, fused,
                s->a_f16 ? "f16" : "f32", s->b_f16 ? "f16" : "f32", b_tr, p->b_in_place,
                has_fill && !a_made && !b_made, mm, fill);
    return;
  }
  if (p->masked) {
    // Its k loop unrolled (by 4, or 2: jit__cpu_unroll_k_loops) where the trip count
    // is even: two compiles interleaved, 17x1000x31 5-6 % faster, 37x2000x27 4-6 %,
    // 1000x600x30, 200x512x24 and 64x1024x48 the same; ~4 ms more to compile.
    // (jit__cpu_plan_matmul sets p->unroll_k so.)
    plan_masked(w, i, root, tM, p->mtm, p->mv, kc);
    return;
  }
  emit_mm_tiles(w, i, p, has_fill, root, mm, fill);
}

// Plans matmul `mm` (jit__cpu_plan_matmul) for w->threads and writes its script; the
// generics making its operands that it does not fuse are planned first.
static void plan_matmul_threads(walk *w, MlirOperation mm) {
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
  jit__cpu_set_tag(w->ctx, mm, batched ? "jit_bm" : "jit_mm", i);
  jit__cpu_mm_shape s = mm_shape_of(w->o, mm, batched, Bt, M, K, N);
  jit__cpu_mm_plan p = jit__cpu_plan_matmul(&s, &w->h, w->threads);
  MlirOperation fill = mlirOpResultGetOwner(mlirOperationGetOperand(mm, 2));
  bool has_fill = mlirValueIsAOpResult(mlirOperationGetOperand(mm, 2)) &&
                  jit__cpu_op_is(fill, "linalg.fill");
  if (has_fill) jit__cpu_set_tag(w->ctx, fill, batched ? "jit_bf" : "jit_f", i);
  if (p.unroll_k) w->unroll_k = true;
  if (p.fused) {
    MlirOperation g = jit__cpu_epilogue_of(mm);
    jit__cpu_set_tag(w->ctx, g, "jit_ep", i);
    w->fused[w->n_fused++] = g;
  }
  MlirValue bv = mlirOperationGetOperand(mm, 1);
  if (p.b_tr) w->taken_t[w->n_taken_t++] = mlirOpResultGetOwner(bv);
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
    if ((k == 1 && p.b_tr) || mlirOperationIsNull(t) || !jit__cpu_op_is(t, "linalg.generic") ||
        mlirShapedTypeGetRank(mlirValueGetType(v)) != (batched ? 3 : 2) ||
        (k == 0 && plain_elementwise(t)))
      continue;
    // B made for a batch split across the threads: its producer is split too (by the
    // batch), whatever its size, rather than run on one thread before the split batch
    // (2 threads, q K^T 12x128x64x128 with K^T its own op: 90 -> 70 us; plain B 63).
    w->ew_split = batched && p.batch_split && k == 1;
    jit__cpu_plan_generic(w, t);
    w->ew_split = false;
    w->taken_t[w->n_taken_t++] = t;
  }
  emit_matmul(w, i, &s, &p, has_fill);
}

static void plan_matmul(walk *w, MlirOperation mm) {
  jit__cpu_plan_threads_of(w, mm, plan_matmul_threads);
}

static MlirWalkResult plan_op(MlirOperation op, void *user) {
  walk *w = user;
  if (jit__cpu_op_is(op, "linalg.matmul") || jit__cpu_op_is(op, "linalg.batch_matmul")) plan_matmul(w, op);
  return MlirWalkResultAdvance;
}

static MlirWalkResult count_op(MlirOperation op, void *user) {
  (void)op;
  ++*(int *)user;
  return MlirWalkResultAdvance;
}

// The walk's per-op arrays, one entry per op of `module` (no plan numbers more ops
// than that); false when out of memory.
static bool walk_alloc(walk *w, MlirOperation module) {
  int n = 0;
  mlirOperationWalk(module, count_op, &n, MlirWalkPreOrder);
  w->cap = n;
  size_t c = (size_t)n + 1;
  w->fused = calloc(c, sizeof *w->fused);
  w->claimed = calloc(c, sizeof *w->claimed);
  w->masked = calloc(c, sizeof *w->masked);
  w->vecmat = calloc(c, sizeof *w->vecmat);
  w->ew_bcast = calloc(c, sizeof *w->ew_bcast);
  w->ew_rest = calloc(c, sizeof *w->ew_rest);
  w->fill_fused = calloc(c, sizeof *w->fill_fused);
  w->taken_t = calloc(c, sizeof *w->taken_t);
  return w->fused && w->claimed && w->masked && w->vecmat && w->ew_bcast && w->ew_rest &&
         w->fill_fused && w->taken_t;
}

// Puts what the walk wrote to w->pre at offset `at` of w->sb (after the script's
// header), ahead of the ops' tiles.
static void splice_pre(walk *w, size_t at) {
  jit__text *sb = &w->sb, *pre = &w->pre;
  if (pre->oom) sb->oom = true;
  if (!pre->len || sb->oom || !jit__text_reserve(sb, pre->len)) return;
  memmove(sb->p + at + pre->len, sb->p + at, sb->len - at + 1);
  memcpy(sb->p + at, pre->p, pre->len);
  sb->len += pre->len;
}

static void walk_free(walk *w) {
  free(w->pre.p);
  free(w->fused);
  free(w->claimed);
  free(w->masked);
  free(w->vecmat);
  free(w->ew_bcast);
  free(w->ew_rest);
  free(w->fill_fused);
  free(w->taken_t);
}

// Vectorizes the matmuls' register tiles (as named contractions, which lower to outer
// products) and the fills fused into them.
static void vectorize_matmuls(walk *w) {
  jit__text *sb = &w->sb;
  for (int i = 0; i < w->n_mm; i++) {
    if (w->vecmat[i]) {
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
    if (w->masked[i][0]) {
      // The peeled rest rows first: the full-tile match below would take them too.
      if (w->masked[i][2])
        sb_printf(sb,
                  "  %%vr%d = transform.structured.match ops{[\"linalg.matmul\"]} "
                  "attributes {jit_mm = %d : i64, jit_mrest} in %%f : (" ANY ") -> " ANY
                  "\n"
                  "  transform.structured.vectorize %%vr%d vector_sizes [%lld, %lld, 1] "
                  "{create_named_contraction} : " ANY
                  "\n",
                  i, i, i, (long long)w->masked[i][2], (long long)w->masked[i][0]);
      sb_printf(sb,
                "  %%vm%d = transform.structured.match ops{[\"linalg.matmul\"]} attributes "
                "{jit_mm = %d : i64} in %%f : (" ANY ") -> " ANY "\n"
                "  transform.structured.vectorize %%vm%d vector_sizes [%lld, %lld, 1] "
                "{create_named_contraction} : " ANY
                "\n",
                i, i, i, (long long)w->masked[i][1], (long long)w->masked[i][0]);
      continue;
    }
    sb_printf(sb,
              "  %%vm%d = transform.structured.match ops{[\"linalg.matmul\"]} attributes "
              "{jit_mm = %d : i64} in %%f : (" ANY ") -> " ANY "\n"
              "  transform.structured.vectorize %%vm%d {create_named_contraction} : " ANY
              "\n",
              i, i, i);
    if (w->fill_fused[i])
      sb_printf(sb,
                "  %%vff%d = transform.structured.match ops{[\"linalg.fill\"]} attributes "
                "{jit_f = %d : i64} in %%f : (" ANY ") -> " ANY "\n"
                "  transform.structured.vectorize %%vff%d : " ANY "\n",
                i, i, i);
  }
}

// Vectorizes the elementwise ops' tiles: those tagged `jit_ewv` (no rest tiles, no
// broadcast along the vector dim; plan_rows.c) through one match, the others one by one.
static void vectorize_elementwise(walk *w) {
  jit__text *sb = &w->sb;
  bool plain = false;
  for (int i = 0; i < w->n_ew && !plain; i++) plain = !w->ew_rest[i][1] && !w->ew_bcast[i];
  if (plain)
    sb_printf(sb,
              "  %%vwv = transform.structured.match ops{[\"linalg.generic\"]} attributes "
              "{jit_ewv = 0 : i64} in %%f : (" ANY ") -> " ANY "\n"
              "  transform.structured.vectorize %%vwv : " ANY "\n");
  for (int i = 0; i < w->n_ew; i++) {
    if (!w->ew_rest[i][1] && !w->ew_bcast[i]) continue;
    if (w->ew_rest[i][1]) {
      // The partial tiles of a transposed read (13 x 16, 16 x 13, 13 x 13 at 333^2) in
      // rows of one, each a vector along the last dim reading the transposed input with
      // a stride: vectorized whole, each shape's transposes took longer to compile than
      // the rest of the kernel (exp(x + y^T) 333^2: 116 ms against 51, 77^2 122 against
      // 50, f16 128 against 60) for the same speed (28 us; 1030^2 157 against 148).
      int tl = w->ew_rest[i][0], nl = w->ew_rest[i][1];
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
    if (!w->ew_bcast[i]) {
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
  if (!walk_alloc(&w, module)) {
    walk_free(&w);
    return false;
  }
  jit__text *sb = &w.sb;
  sb_printf(sb,
            "module attributes {transform.with_named_sequence} {\n"
            "transform.named_sequence @__transform_main(%%root: " ANY
            " {transform.readonly}) {\n");
  size_t header = sb->len;
  jit__cpu_unshare_fills(module);
  // Matmuls first: they claim their epilogues, which the generic pass then skips.
  mlirOperationWalk(module, plan_op, &w, MlirWalkPreOrder);
  mlirOperationWalk(module, jit__cpu_find_row_roots, &w, MlirWalkPreOrder);
  mlirOperationWalk(module, jit__cpu_plan_generic_op, &w, MlirWalkPreOrder);
  splice_pre(&w, header);
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
  vectorize_matmuls(&w);
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
  vectorize_elementwise(&w);
  // No canonicalization after the elementwise tiles are vectorized: it changed
  // none of the 1,195 distinct kernels of 15 CPU suites (optimized LLVM IR, AVX-512
  // and AVX2, L2 of 512 KiB to 2 MiB) and cost ~1 % of a compile (callgrind: 4 compiles
  // of 512^3 873 -> 865 M instructions, gelu(xW+b) 32x768x3072 998 -> 989 M).
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
  // No canonicalization between the hoisting and the contraction lowering: it changed
  // none of the 1,054 kernels of the CPU suites (AVX-512, and AVX2 with a 512 KiB L2)
  // and rebuilt the whole canonicalization pattern set (~1.5 % of a compile).
  sb_printf(sb,
            "  %%fors = transform.structured.match ops{[\"scf.for\"]} in %%f : (" ANY
            ") -> " ANY "\n"
            "  transform.apply_licm to %%fors : " ANY "\n"
            "  transform.loop.hoist_loop_invariant_subsets %%fors : " ANY "\n"
            "  transform.apply_patterns to %%f {\n"
            "    transform.apply_patterns.vector.lower_contraction lowering_strategy = "
            "\"outerproduct\"\n"
            "    transform.apply_patterns.vector.transfer_permutation_patterns\n"
            "    transform.apply_patterns.vector.lower_outerproduct\n"
            "  } : " ANY "\n"
            "%s"
            "  transform.yield\n}\n}\n",
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
  walk_free(&w);
  if (sb->oom) {
    free(sb->p);
    return false;
  }
  out->script = sb->p;
  return true;
}
