//===--- generic.c - the CPU strategy for kernels with `?` dims -------------===//
//
// A generic kernel (one per graph, its symbolic dims kept as `?`) cannot be planned
// from sizes: the sizes arrive with each call. Its matmuls get static register tiles
// over dynamic loops, the partial last tiles peeled off (transform.loop.peel) so that
// every tile that runs vectorized is static and unmasked (recipes/mmdyn.mlir):
//
//   threads: scf.forall over rows, or over columns where each thread gets whole
//            column tiles of a static N (then a small M is as fast as a large one)
//   cache blocks: rows in blocks of mc (`?` M), k in blocks of kc (large or `?` K;
//            none under a fused epilogue, which needs the finished sums)
//   rows and columns cut into static pieces (write_dim): register tiles of tm rows
//            and tn columns, then the rest: rows in halving tiles (tm/2 .. 1), static
//            columns in power-of-two widths, a `?` rest of columns as scalar loops
//   each piece: the k loop by one (tm x tn outer products, accumulators in
//            registers), a fused epilogue then a row at a time
//
// emit_mlir.c writes the graph twice, under scf.if on its first `?` dim: the path for
// many rows (>= JIT__GENERIC_SPLIT_ROWS) cuts columns first and packs each column
// piece's panel of B (pad + hoist_pad), the path for few rows cuts rows first and
// reads B in place. Everything that is not a matmul (elementwise ops, reductions,
// softmax) is left as loops for LLVM's loop vectorizer, which handles run-time trip
// counts with its own remainder loops.
//
//===----------------------------------------------------------------------===//
#include <stdlib.h>
#include <string.h>

#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>

#include "lowering/cpu/internal.h"

jit__cpu_generic_mm_plan jit__cpu_plan_generic_mm(int64_t M, int64_t K, int64_t N,
                                                  const jit__cpu_host *h, int threads,
                                                  bool few_rows, bool f32, bool fused) {
  jit__cpu_generic_mm_plan p = {0};
  p.tm = h->tm;
  p.tn = h->tn;
  p.lanes = h->lanes;
  p.M = M;
  p.K = K;
  p.N = N;
  p.kc = (K < 0 || K > 256) ? 128 : 0;
  // B packed per column piece where its panel is static and does not sit in L1 anyway;
  // the rows then run whole under each piece (no row blocks: the panel is packed once).
  // Not with odd columns: their pieces' C tiles went through temporaries and copies
  // under k blocks (40x1000x31 packed: 0.1x of exact).
  // A `?` N: the whole column tiles are packed, the (masked) rest is not.
  p.pack = !few_rows && f32 && (K < 0 || K > 64) && (N < 0 || (N > 0 && N % p.tn == 0));
  if (p.pack && (N < 0 || N % h->ptn == 0)) p.tm = h->ptm, p.tn = h->ptn;
  if (p.pack && K < 0) {
    // A `?` K: blocks of 256 peeled, so that the whole ones have static panels (the
    // attention's P V in a transformer block, K = the sequence).
    p.kc = 256;
    p.peel_k = true;
  } else if (p.pack) {
    // The exact plans' register tile for packed panels where N has whole ones (6x64 on
    // AVX-512: 24 accumulators, fewer loads per FMA; above), and no k blocks up to
    // K = 1024 (the panel, K x tn, stays in L2; C is then read and written once):
    // 1024^3 at 2 threads went from 0.56x to ~0.9x of the exact kernel.
    // A packed panel must be static: k blocks that divide K (a divisor near 256).
    p.kc = K <= 1024 ? 0 : jit__cpu_pick_block(K, 256, 8);
    if (K > 1024 && !p.kc) {
      p.pack = false;
      p.tm = h->tm, p.tn = h->tn, p.kc = 128;
    }
  }
  // Under a fused epilogue there are no k blocks (it needs the finished sums): a `?` K
  // then has no static panel to pack.
  if (fused) {
    p.kc = 0;
    if (K < 0) p.pack = p.peel_k = false;
  }
  p.peel_n = N < 0 || N % p.tn != 0;
  // The static-M rows: tm divides them, or they are peeled (a static M < tm is one tile).
  if (M >= 0 && M < p.tm) p.tm = M;
  // Cache blocks of rows only where M is `?` (the usual case: a batch) and B is not
  // packed; a static M is tiled by tm directly, peeled when tm does not divide it.
  p.mc = M < 0 && !p.pack ? 8 * p.tm : 0;
  // Rows left after the whole tiles go in halving tiles where B is large enough to
  // matter (read once per level, not once per row) or where they are all there is
  // (the path for few rows: one by one, each row's sums were one chain of FMAs a
  // latency apart, 7x500x31 at 0.37x of the exact kernel, 0.53x halved), else one by
  // one (33x31x77 halved: 8.8 -> 18.7 us).
  p.halve_rows = few_rows || K < 0 || N < 0 || K * N >= 16384;
  // Threads split the columns where each gets whole register tiles of a static N (B
  // is then read once in all, and a small M is as fast as a large one), else the rows:
  // a `?` M always (its size is not known here; a thread with no rows does nothing), a
  // static one with a register tile for each thread.
  p.split_n = threads > 1 && N > 0 && N % ((int64_t)threads * p.tn) == 0 && !p.peel_n;
  p.threads = threads > 1 && (p.split_n || M < 0 || M >= (int64_t)threads * p.tm) ? threads
                                                                                  : 1;
  // On the path for few rows (the graph's first `?` dim below JIT__GENERIC_SPLIT_ROWS,
  // M's bound when M is that dim) a small matmul stays on one thread: a fork/join cost
  // 7x256x10 (the MLP's second layer at N = 7) 5.9 us against 1.2 for the exact kernel
  // on one thread. From 2^19 multiply-adds at 32 rows the split pays (17x1000x31: 16
  // us on two threads, 17 on one; 7x784x256: 45 and 72).
  if (few_rows && M < 0 && K >= 0 && N >= 0 && 32.0 * K * N < (double)(1 << 19))
    p.threads = 1;
  return p;
}

//===--- Script ----------------------------------------------------------===//

#define FOR "!transform.op<\"scf.for\">"

// The functions the script outlines (writer) are named kOutlinedPrefix<i>, i <
// JIT__MAX_OUTLINED; more matmuls than that stay in the kernel's function.
#define JIT__MAX_OUTLINED 64
static const char kOutlinedPrefix[] = "jit_outlined_";

// Handles are named %h<n>, n counting up through the whole script.
//
// Upstream fuse_into_containing_op builds a diagnostic even when it succeeds,
// printing (and so verifying and numbering) the whole function around the loop it
// fuses into: each fusion costs the function's size, and a kernel with many matmuls
// paid that quadratically. So the function is kept small while the script fuses:
// - `late` gets the vectorize ops, written after the tiling, fusion and peeling of
//   their matmul (their handles stay valid: nothing later touches those tiles);
// - a matmul split over threads is then done, and its scf.forall is outlined into a
//   function of its own (visit), which jit__cpu_inline_outlined puts back after the
//   script.
// The LLVM IR that comes out is the same as without either (the 1,280 kernels, 375
// generic, 48 with outlined matmuls, of 15 test suites; the stream bench's transformer
// block). Instructions to compile (callgrind, the whole process): the transformer
// block's generic kernel (9 matmuls) 13.77 G -> 11.44 G, the MLP's 2.41 G -> 2.26 G.
typedef struct writer {
  jit__text *sb;
  int n;
  jit__text *late;
} writer;

// `%h = match <name> in <in>` (in of type `in_ty`); returns h.
static int match_in(writer *w, const char *name, const char *in, const char *in_ty) {
  sb_printf(w->sb, "  %%h%d = transform.structured.match ops{[\"%s\"]} in %s : (%s) -> " ANY
            "\n", w->n, name, in, in_ty);
  return w->n++;
}

// `%h, %hl:<loops> = tile_using_for %h<op> tile_sizes [...]`; returns h.
static int tile(writer *w, int op, int n, const int64_t *sizes) {
  int loops = 0;
  for (int i = 0; i < n; i++) loops += sizes[i] != 0;
  sb_printf(w->sb, "  %%h%d, %%h%dl:%d = transform.structured.tile_using_for %%h%d tile_sizes [",
            w->n, w->n, loops, op);
  for (int i = 0; i < n; i++) sb_printf(w->sb, "%s%lld", i ? ", " : "", (long long)sizes[i]);
  sb_printf(w->sb, "] : (" ANY ") -> ");
  sb_types(w->sb, 1 + loops);
  sb_printf(w->sb, "\n");
  return w->n++;
}

// Fuses producer %h<op> into the loop `into` (tiles of it computed inside, where the
// loop's body reads them; only that op, not its own producers); returns the fused
// op's handle.
static int fuse_into(writer *w, int op, const char *into) {
  sb_printf(w->sb, "  %%h%d, %%h%dc = transform.structured.fuse_into_containing_op %%h%d into "
            "%s : (" ANY ", " ANY ") -> (" ANY ", " ANY ")\n", w->n, w->n, op, into);
  return w->n++;
}

// Peels loop `loop` (an any_op handle text); returns h: %h<h>m whole, %h<h>r the rest.
static int peel(writer *w, const char *loop) {
  sb_printf(w->sb,
            "  %%h%d = transform.cast %s : " ANY " to " FOR "\n"
            "  %%h%dm, %%h%dr = transform.loop.peel %%h%d : (" FOR ") -> (" FOR ", " FOR ")\n",
            w->n, loop, w->n, w->n, w->n);
  return w->n++;
}

// Tiles the k loop by 1 (a register tile's outer products) of every `name` op in `in`.
// Returns the tiled op's handle.
static int k_by_one(writer *w, const char *name, int b, const char *in, const char *in_ty) {
  int mm = match_in(w, name, in, in_ty);
  int64_t s[4] = {0};
  s[b + 2] = 1;
  return tile(w, mm, 3 + b, s);
}

// Splits op %h<op> across the threads along loop `dim` of `n` (scf.forall); returns
// the tiled op's handle, the forall's is %h<h>l.
static int split(writer *w, int op, int n, int dim, int threads) {
  sb_printf(w->sb, "  %%h%d, %%h%dl = transform.structured.tile_using_forall %%h%d num_threads [",
            w->n, w->n, op);
  for (int d = 0; d < n; d++) sb_printf(w->sb, "%s%d", d ? ", " : "", d == dim ? threads : 0);
  sb_printf(w->sb, "] : (" ANY ") -> (" ANY ", " ANY ")\n");
  return w->n++;
}

// What the column and row tilings work on: the matmul (tag jit.gmm = i, `name`,
// batch loop first when `b` is 1), or, when `ep` is set, its elementwise epilogue
// (tag jit.gep = i), whose tiles get the matmul's tiles fused in, so that bias and
// activation run on the accumulators (recipes/gelu.mlir).
typedef struct target {
  const char *name;
  int b;
  const char *ep;  // "linalg.generic", or NULL
  int top, mm;     // handles of the tiled op (the epilogue, or the matmul) and the matmul
  int fill;        // the fill making the matmul's zeros (an epilogue's matmul only) is
                   // fused into every tile, so the accumulators start as zeros in
                   // registers rather than loaded from a zeroed buffer: 0, else -1
} target;

// With t->fill: fuses the fill that makes the zeros of fused matmul %h<mm> into `loop`
// as well. The matmul tile's init is a slice of that fill's result (found through the
// producers: a name match would also see a full-size copy that tiling leaves behind
// for a tensor.dim until canonicalization).
static void fuse_into_fill(writer *w, const target *t, int mm, const char *loop) {
  if (t->fill < 0) return;
  sb_printf(w->sb,
            "  %%h%d = transform.get_producer_of_operand %%h%d[2] : (" ANY ") -> " ANY "\n"
            "  %%h%dp = transform.get_producer_of_operand %%h%d[0] : (" ANY ") -> " ANY "\n",
            w->n, mm, w->n, w->n);
  char p[32];
  snprintf(p, sizeof p, "%%h%dp", w->n++);
  sb_printf(w->sb, "  %%h%d, %%h%dc = transform.structured.fuse_into_containing_op %s into "
            "%s : (" ANY ", " ANY ") -> (" ANY ", " ANY ")\n", w->n, w->n, p, loop);
  w->n++;
}

// Tiles the target found in `in` (of type `in_ty`) along loop `dim` by `size` (the
// epilogue's dim, the matmul's dim + b), fusing the matmul into the new loop; returns
// the tiled op's handle (its loop is %h<h>l#0).
static int tile_dim(writer *w, const target *t, const char *in, const char *in_ty, int dim,
                    int64_t size) {
  int64_t s[4] = {0};
  // In %root the ops are the tagged ones (t->top, t->mm), not found by name.
  bool root = !strcmp(in, "%root");
  char loop[48];
  if (!t->ep) {
    s[t->b + dim] = size;
    return tile(w, root ? t->top : match_in(w, t->name, in, in_ty), 3 + t->b, s);
  }
  int mm = root ? t->mm : match_in(w, t->name, in, in_ty);
  s[dim] = size;
  int h = tile(w, root ? t->top : match_in(w, t->ep, in, in_ty), 2, s);
  snprintf(loop, sizeof loop, "%%h%dl#0", h);
  fuse_into_fill(w, t, fuse_into(w, mm, loop), loop);
  return h;
}

// The k loop of the matmul tile in `in` by one and, with an epilogue, the epilogue's
// rows one at a time: on a whole register tile (vector<8x32>) gelu's tanh spilled
// ~600 registers (a fused gelu(xW+b) ran 5.6x slower than the exact kernel).
// `rows` x `cols`: the tile's size, or with masks, a bound of it (columns: a static
// rest that is no whole number of vectors, rounded up, or the column tiles' width for
// a `?` rest). With `vec` (a masked tile, or one in a rest of `?` rows) it is
// vectorized here at that size, as a named contraction (which lowers to one FMA per
// row and vector; script.c's masked N says more): a whole tile inside a peeled rest of
// rows can keep a `?` type (the peel did not fold its affine.min), which
// vectorize_children_and_apply_patterns would leave as scalar loops; it then gets a
// row mask that is all true at run time.
static void finish_tile(writer *w, const target *t, const char *in, const char *in_ty,
                        int64_t rows, int64_t cols, bool vec) {
  int h = k_by_one(w, t->name, t->b, in, in_ty);
  if (vec)
    sb_printf(w->late, "  transform.structured.vectorize %%h%d vector_sizes [%s%lld, %lld, 1] "
              "{create_named_contraction} : " ANY "\n", h, t->b ? "1, " : "",
              (long long)rows, (long long)cols);
  if (!t->ep) return;
  int64_t s[2] = {1, 0};
  h = tile(w, match_in(w, t->ep, in, in_ty), 2, s);
  if (vec)
    sb_printf(w->late, "  transform.structured.vectorize %%h%d vector_sizes [1, %lld] : " ANY
              "\n", h, (long long)cols);
}

static int64_t pow2_floor(int64_t x) {
  int64_t r = 1;
  while (r * 2 <= x) r *= 2;
  return r;
}

// Cuts loop `dim` (0: rows, 1: columns) of the target in `in` into pieces whose
// widths are static, so that every register tile vectorizes unmasked at a width LLVM
// handles well (a 31-wide vector of columns cost 45x): tiles of the register tile's
// size (tm, tn), then, peeled off, what is left: a static rest in power-of-two widths
// (31 = 16 + 8 + 4 + 2 + 1), a `?` rest of rows in halving tiles (tm/2, .., 1, each
// level peeled; B is read once per level rather than once per row), a `?` rest of
// columns as scalar loops. Rows are cut first; in each row piece the columns; in each
// column piece the k loop by one (outer products, accumulators in registers).
// B packed (recipes/mm_packBws.mlir): the [K, width] panel of B that the row tiles
// in `loop` read is copied once, before the loop, into a contiguous buffer (a padded
// matmul: pad with nofold + hoist_pad, as lowering/cpu/script.c packs), so each k step
// reads one or two cache lines instead of lines a row of B apart.
static void pack_b(writer *w, const target *t, const char *loop, const char *loop_ty,
                   int64_t width, int64_t depth) {
  int mm = match_in(w, t->name, loop, loop_ty);
  // The copy goes `rows` rows of the panel at a time, a divisor of its depth (a
  // partial last tile would be masked, and masking this copy does not lower).
  int64_t rows = depth % 8 == 0 ? 8 : depth % 4 == 0 ? 4 : depth % 2 == 0 ? 2 : 1;
  int h = w->n;
  sb_printf(w->sb,
            "  %%h%dd, %%h%dp, %%h%dc = transform.structured.pad %%h%d {padding_values = "
            "[0.0 : f32, 0.0 : f32, 0.0 : f32], padding_dimensions = [%d], nofold_flags = "
            "[0, 1, 0], copy_back_op = \"none\"} : (" ANY ") -> (" ANY ", " ANY ", " ANY ")\n",
            h, h, h, mm, t->b + 1);
  sb_printf(w->sb,
            "  %%h%db = transform.get_producer_of_operand %%h%dd[1] : (" ANY ") -> " ANY "\n"
            "  %%h%dh = transform.structured.hoist_pad %%h%db by 1 loops : (" ANY ") -> " ANY
            "\n",
            h, h, h, h);
  sb_printf(w->sb,
            "  %%h%dt, %%h%dtl = transform.structured.tile_using_for %%h%dh tile_sizes "
            "[%lld, 0] : (" ANY ") -> (" ANY ", " ANY ")\n",
            h, h, h, (long long)rows);
  sb_printf(w->late, "  transform.structured.vectorize %%h%dt vector_sizes [%lld, %lld] : " ANY
            "\n", h, (long long)rows, (long long)width);
  w->n++;
}

static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Cuts loop `dim` (0: rows, 1: columns) of the target in `in` into pieces whose
// rows are static, so that every register tile vectorizes: rows in tiles of tm, then,
// peeled off, what is left: a static rest in power-of-two heights, a `?` rest in
// halving tiles (tm/2, .., 1, each level peeled; B is read once per level rather than
// once per row) or one by one; columns in tiles of tn (wider under a piece of fewer
// than tm/2 rows), then the rest (static or `?`) as one tile vectorized with masks
// at the tiles' width or the rest rounded up to whole vectors (finish_tile). Pieces of power-of-two widths (31 = 16 + 8 + 4 + 3) read
// each row of A once per piece and ran 17x1000x31 at 0.4x of the exact kernel; a `?`
// rest of columns as scalar loops read and wrote C at each k step (0.03x).
// `outer` is the dim cut first; in each of its pieces the other one is cut; in each of
// those the k loop goes by one (outer products, accumulators in registers). With
// columns outer and p->pack, each column piece's B panel is packed ahead of its rows
// (`piece`: that piece's width, 0 when not known). `rows` x `cols`: the size of the
// row or column piece `in` lies in (0: not cut yet; finish_tile says more).
static void write_dim(writer *w, const target *t, const char *in, const char *in_ty,
                      const jit__cpu_generic_mm_plan *p, int dim, int outer, int64_t piece,
                      int64_t rows, int64_t cols, bool vec) {
  char cur[48], loop[48];
  snprintf(cur, sizeof cur, "%s", in);
  const char *cur_ty = in_ty;
  // Where threads split the columns, each cuts its own part (N / threads, a whole
  // number of tiles): a masked rest sized from all of N covered too few columns of a
  // part (AVX2, 1x256x256: 48-wide tiles, rest 16 of a part's 32).
  int64_t cols_left = p->split_n ? p->N / p->threads : p->N;
  int64_t left = dim == 0 ? p->M : cols_left, width = dim == 0 ? p->tm : p->tn;
  // Columns inside a piece of few rows go wider, so that its k loop still has
  // tm/2 x tn accumulators (one row of two vectors is a chain of FMAs one latency apart).
  if (dim == 1 && outer == 0 && rows > 0 && rows < p->tm / 2)
    width = p->tn * (p->tm / 2 / rows);
  bool first = true;
  for (;; first = false) {
    // A static rest wider than two vectors goes on in tiles of two (a 1x80 masked
    // tile, 77 columns under a row, ran 16x slower: LLVM splits an 80-lane masked load
    // and store badly).
    if (dim == 1 && left >= 0 && left < width && round_up(left, p->lanes) > 2 * p->lanes)
      width = 2 * p->lanes;
    if (dim == 1 && (left < 0 ? !first : left < width)) {
      // The rest of the columns (or all of a static N narrower than tn): one tile,
      // masked unless it is whole vectors.
      int64_t mw = left < 0 ? width : round_up(left, p->lanes);
      if (left < 0 && mw > 2 * p->lanes) {
        // A `?` rest in masked tiles of two vectors (a loop of one to tn / 32 steps),
        // not one of the tiles' width: 3 columns left of 64 cost as much as 64 (a
        // 97x127x131 matmul with every dim `?` ran at 0.44x of the exact kernel).
        mw = 2 * p->lanes;
        snprintf(cur, sizeof cur, "%%h%dl#0", tile_dim(w, t, cur, cur_ty, 1, mw));
        cur_ty = ANY;
      }
      if (outer == 1) write_dim(w, t, cur, cur_ty, p, 0, outer, 0, 0, mw, true);
      else finish_tile(w, t, cur, cur_ty, rows, mw, true);
      return;
    }
    if (left >= 0 && left < width) width = pow2_floor(left);
    if (dim == 0 && left < 0 && width < p->tm && !p->halve_rows) width = 1;
    int h = tile_dim(w, t, cur, cur_ty, dim, width);
    snprintf(loop, sizeof loop, "%%h%dl#0", h);
    // Whole tiles only: a static extent they divide, or a `?` one in tiles of one.
    bool whole_only = (left >= 0 && left % width == 0) || (left < 0 && width == 1);
    char whole[48];
    int pl = -1;
    if (whole_only) {
      snprintf(whole, sizeof whole, "%s", loop);
    } else {
      pl = peel(w, loop);
      snprintf(whole, sizeof whole, "%%h%dm", pl);
    }
    const char *whole_ty = whole_only ? ANY : FOR;
    // The whole row tiles read B packed; the rest, a few rows, read it in place (a pad
    // there would stop the rest's own tiles from fusing their matmul in).
    if (dim == 0 && outer == 1 && first && p->pack && piece > 0)
      pack_b(w, t, whole, whole_ty, piece, p->kc ? p->kc : p->K);
    int64_t r = dim == 0 ? width : rows, c = dim == 1 ? width : cols;
    bool v = vec || (dim == 0 && !first && left < 0);
    if (dim == outer)
      write_dim(w, t, whole, whole_ty, p, 1 - dim, outer, dim == 1 ? width : 0, r, c, v);
    else
      finish_tile(w, t, whole, whole_ty, r, c, v);
    if (whole_only) return;
    snprintf(cur, sizeof cur, "%%h%dr", pl);
    cur_ty = FOR;
    if (left >= 0) left %= width;
    else if (dim == 0) width /= 2;
  }
}

// One matmul (tag jit.gmm = i) and its epilogue (tag jit.gep = i) if `fused`: threads
// split the target (scf.forall, the matmul fused into it), cache blocks of rows (and
// of k, without an epilogue: the epilogue needs the finished sums), then columns and
// rows (write_columns).
// Writes the handle of its scf.forall, when it makes one, into forall[48] ("" else).
static void write_matmul(writer *w, int i, const char *name, int b, bool fused, bool fill,
                         const jit__cpu_generic_mm_plan *p, char *forall) {
  target t = {name, b, fused ? "linalg.generic" : NULL, 0, 0, -1};
  (void)fill;  // fusing the fill too made each row tile a copied temporary (2x slower)
  sb_printf(w->sb, "  %%h%d = transform.structured.match ops{[\"%s\"]} attributes "
            "{jit.gmm = %d} in %%root : (" ANY ") -> " ANY "\n", w->n, name, i);
  int mm = w->n++, top = mm;
  if (fused) {
    sb_printf(w->sb, "  %%h%d = transform.structured.match ops{[\"linalg.generic\"]} "
              "attributes {jit.gep = %d} in %%root : (" ANY ") -> " ANY "\n", w->n, i);
    top = w->n++;
  }
  int n = fused ? 2 : 3 + b, off = fused ? 0 : b;
  char loop[48];
  snprintf(loop, sizeof loop, "%%root");
  forall[0] = 0;
  if (p->threads > 1) {
    top = split(w, top, n, off + (p->split_n ? 1 : 0), p->threads);
    snprintf(loop, sizeof loop, "%%h%dl", top);
    snprintf(forall, 48, "%s", loop);
    if (fused) {
      mm = fuse_into(w, mm, loop);
      fuse_into_fill(w, &t, mm, loop);
      snprintf(forall, 48, "%%h%dc", mm);  // the fusion consumed the forall's handle
    }
  }
  int64_t s[4] = {0};
  bool kc = p->kc != 0;
  if (b || p->mc || kc) {
    if (b) s[0] = 1;
    s[off] = p->mc;
    if (kc) s[off + 2] = p->kc;
    top = tile(w, top, n, s);
    snprintf(loop, sizeof loop, "%%h%dl#0", top);
    if (fused) {
      mm = fuse_into(w, mm, loop);
      fuse_into_fill(w, &t, mm, loop);
    }
  }
  t.top = top;
  t.mm = mm;
  if (!kc || !p->peel_k) {
    write_dim(w, &t, loop, ANY, p, p->pack ? 1 : 0, p->pack ? 1 : 0, 0, 0, 0, false);
    return;
  }
  // The whole k blocks with B packed, the last (`?`) one reading B in place.
  char kloop[48], part[48];
  snprintf(kloop, sizeof kloop, "%%h%dl#%d", top, b + (p->mc ? 1 : 0));
  int pl = peel(w, kloop);
  snprintf(part, sizeof part, "%%h%dm", pl);
  write_dim(w, &t, part, FOR, p, 1, 1, 0, 0, 0, false);
  jit__cpu_generic_mm_plan rest = *p;
  rest.pack = false;
  snprintf(part, sizeof part, "%%h%dr", pl);
  write_dim(w, &t, part, FOR, &rest, 0, 0, 0, 0, 0, false);
}

// The one elementwise consumer of matmul `mm` that write_fused can fuse, or null.
static MlirOperation fusable_epilogue(MlirOperation mm) {
  MlirOperation none = {NULL};
  MlirOpOperand use = mlirValueGetFirstUse(mlirOperationGetResult(mm, 0));
  if (mlirOpOperandIsNull(use) || !mlirOpOperandIsNull(mlirOpOperandGetNextUse(use)))
    return none;
  MlirOperation g = mlirOpOperandGetOwner(use);
  if (!jit__cpu_op_is(g, "linalg.generic") || mlirOperationGetNumResults(g) != 1) return none;
  char it[8];
  if (jit__cpu_read_iterators(g, it, 8) != 2 || it[0] != 'p' || it[1] != 'p') return none;
  intptr_t n_ops = mlirOperationGetNumOperands(g);
  unsigned idx = mlirOpOperandGetOperandNumber(use);
  if ((intptr_t)idx == n_ops - 1) return none;  // the matmul is its init, not an input
  if (!jit__cpu_map_is_identity(g, idx) || !jit__cpu_map_is_identity(g, n_ops - 1)) return none;
  return g;
}

// The matmul shape (M, K, N; -1 for `?`) of a linalg.matmul or batch_matmul.
static void matmul_shape(MlirOperation op, int b, int64_t *M, int64_t *K, int64_t *N) {
  MlirType a = mlirValueGetType(mlirOperationGetOperand(op, 0));
  MlirType bt = mlirValueGetType(mlirOperationGetOperand(op, 1));
  int64_t m = mlirShapedTypeGetDimSize(a, b), k = mlirShapedTypeGetDimSize(a, b + 1);
  int64_t n = mlirShapedTypeGetDimSize(bt, b + 1);
  *M = mlirShapedTypeIsDynamicSize(m) ? -1 : m;
  *K = mlirShapedTypeIsDynamicSize(k) ? -1 : k;
  *N = mlirShapedTypeIsDynamicSize(n) ? -1 : n;
}

// Whether `op` is in the else region of an scf.if (the generic kernel's path for few
// rows, emit_mlir.c's split_rows).
static bool on_few_rows_path(MlirOperation op) {
  for (MlirBlock b = mlirOperationGetBlock(op); !mlirBlockIsNull(b);) {
    MlirOperation parent = mlirBlockGetParentOperation(b);
    if (mlirOperationIsNull(parent)) break;
    if (jit__cpu_op_is(parent, "scf.if") && mlirOperationGetNumRegions(parent) == 2 &&
        mlirRegionEqual(mlirBlockGetParentRegion(b), mlirOperationGetRegion(parent, 1)))
      return true;
    b = mlirOperationGetBlock(parent);
  }
  return false;
}

typedef struct generic_walk {
  MlirContext ctx;
  jit__cpu_host host;
  jit__text sb;
  jit__text late;    // writer.late
  int outlined;      // scf.forall loops outlined so far
  int n;
  int threads;       // the options' thread count
  int used_threads;  // the most any forall uses
  int handles;       // transform handles named so far
  int n_big;         // large static generics tiled (tile_big_static)
} generic_walk;

// A linalg.generic with static sizes (a transposed weight, say) would be vectorized
// whole by vectorize_children_and_apply_patterns: a 256x256 transpose became 56 MB of
// LLVM dialect and a compile that never ended. Past 1024 elements its parallel loops
// are tiled (1, .., 1, 16: one short vector at a time); generics with a `?` size stay
// loops for LLVM.
static void tile_big_static(generic_walk *w, MlirOperation op) {
  if (!jit__cpu_op_is(op, "linalg.generic") || mlirOperationGetNumResults(op) != 1) return;
  if (!mlirAttributeIsNull(mlirOperationGetAttributeByName(
          op, mlirStringRefCreateFromCString("jit.gep"))))
    return;  // a fused epilogue, tiled with its matmul
  MlirType t = mlirValueGetType(mlirOperationGetResult(op, 0));
  if (!jit__cpu_static_shaped(t)) return;
  int64_t n = 1;
  for (intptr_t d = 0; d < mlirShapedTypeGetRank(t); d++) n *= mlirShapedTypeGetDimSize(t, d);
  char it[JIT_MAX_RANK + 2];
  int nl = jit__cpu_read_iterators(op, it, (int)sizeof it);
  if (n <= 1024 || nl <= 0) return;
  int last = -1;
  for (int l = 0; l < nl; l++)
    if (it[l] == 'p') last = l;
  if (last < 0) return;
  jit__cpu_set_tag(w->ctx, op, "jit.gbig", w->n_big);
  sb_printf(&w->sb, "  %%big%d = transform.structured.match ops{[\"linalg.generic\"]} "
            "attributes {jit.gbig = %d} in %%root : (" ANY ") -> " ANY "\n", w->n_big, w->n_big);
  int loops = 0;
  for (int l = 0; l < nl; l++) loops += it[l] == 'p';
  sb_printf(&w->sb, "  %%bigt%d, %%bigl%d:%d = transform.structured.tile_using_for %%big%d "
            "tile_sizes [", w->n_big, w->n_big, loops, w->n_big);
  for (int l = 0; l < nl; l++)
    sb_printf(&w->sb, "%s%d", l ? ", " : "", it[l] != 'p' ? 0 : l == last ? 16 : 1);
  sb_printf(&w->sb, "] : (" ANY ") -> ");
  sb_types(&w->sb, 1 + loops);
  sb_printf(&w->sb, "\n");
  w->n_big++;
}

// Writes the vectorize ops held back so far (writer) into the script.
static void flush_late(generic_walk *w) {
  if (w->late.len) jit__text_append(&w->sb, w->late.p, w->late.len);
  w->late.len = 0;
}

static MlirWalkResult visit(MlirOperation op, void *user) {
  generic_walk *w = user;
  tile_big_static(w, op);
  bool mm = jit__cpu_op_is(op, "linalg.matmul"), bm = jit__cpu_op_is(op, "linalg.batch_matmul");
  if (!mm && !bm) return MlirWalkResultAdvance;
  // Named matmuls with their default maps only (other maps read an operand
  // transposed or broadcast: left to the loops).
  static const int plain[6] = {0, 2, 2, 1, 0, 1};
  if (mm ? !jit__cpu_maps_are(op, 3, 3, 2, plain, true) : !jit__cpu_batch_maps_plain(op))
    return MlirWalkResultAdvance;
  int b = bm ? 1 : 0;
  int64_t M, K, N;
  matmul_shape(op, b, &M, &K, &N);
  // Packing only on the path for many rows (the scf.if's then region, emit_mlir.c),
  // and for f32 operands (the padding values' type).
  bool f32 = true;
  for (int o = 0; o < 3 && f32; o++)
    f32 = mlirTypeIsAF32(mlirShapedTypeGetElementType(
        mlirValueGetType(mlirOperationGetOperand(op, o))));
  // An epilogue is fused where N is static (a `?` N leaves a masked rest of columns).
  MlirOperation ep = mm && N >= 0 ? fusable_epilogue(op) : (MlirOperation){NULL};
  bool fused = !mlirOperationIsNull(ep);
  jit__cpu_generic_mm_plan p = jit__cpu_plan_generic_mm(M, K, N, &w->host, w->threads,
                                                        on_few_rows_path(op), f32, fused);
  if (p.threads > w->used_threads) w->used_threads = p.threads;
  if (p.tn == 0 || M == 0 || K == 0) return MlirWalkResultAdvance;
  jit__cpu_set_tag(w->ctx, op, "jit.gmm", w->n);
  writer wr = {&w->sb, w->handles, &w->late};
  if (fused) jit__cpu_set_tag(w->ctx, ep, "jit.gep", w->n);
  // The zeros the sums start from, when a fill of this matmul's alone makes them.
  MlirValue init = mlirOperationGetOperand(op, 2);
  MlirOperation fill = mlirValueIsAOpResult(init) ? mlirOpResultGetOwner(init)
                                                  : (MlirOperation){NULL};
  bool fills = !mlirOperationIsNull(fill) && jit__cpu_op_is(fill, "linalg.fill") &&
               mlirOpOperandIsNull(mlirOpOperandGetNextUse(mlirValueGetFirstUse(init)));
  char forall[48];
  write_matmul(&wr, w->n, bm ? "linalg.batch_matmul" : "linalg.matmul", b, fused, fills, &p,
               forall);
  if (forall[0] && w->outlined < JIT__MAX_OUTLINED) {
    // Finished: its vectorize ops, then the forall into a function (writer says why).
    flush_late(w);
    sb_printf(&w->sb, "  %%o%d, %%oc%d = transform.loop.outline %s {func_name = \"%s%d\"} "
              ": (" ANY ") -> (" ANY ", " ANY ")\n", w->outlined, w->outlined, forall,
              kOutlinedPrefix, w->outlined);
    w->outlined++;
  }
  w->handles = wr.n;
  w->n++;
  return MlirWalkResultAdvance;
}

char *jit__cpu_generic_script(MlirContext ctx, MlirOperation module,
                              const jit__lower_options *o, int *out_n_ops, int *out_threads) {
  generic_walk w = {.ctx = ctx, .host = jit__cpu_host_of(o), .threads = o->num_threads,
                    .used_threads = 1};
  *out_n_ops = 0;
  *out_threads = 1;
  sb_printf(&w.sb,
            "module attributes {transform.with_named_sequence} {\n"
            "transform.named_sequence @__transform_main(%%root: " ANY
            " {transform.readonly}) {\n");
  mlirOperationWalk(module, visit, &w, MlirWalkPreOrder);
  flush_late(&w);
  w.sb.oom |= w.late.oom;
  free(w.late.p);
  sb_printf(&w.sb,
            "  %%f = transform.structured.match ops{[\"func.func\"]} in %%root : (" ANY
            ") -> " ANY "\n"
            "  transform.apply_patterns to %%f { transform.apply_patterns.canonicalization }"
            " : " ANY "\n"
            "  %%f2 = transform.structured.vectorize_children_and_apply_patterns %%f : (" ANY
            ") -> " ANY "\n"
            "  transform.apply_cse to %%f2 : " ANY "\n"
            "  transform.apply_patterns to %%f2 { transform.apply_patterns.canonicalization "
            "transform.apply_patterns.scf.for_loop_canonicalization }"
            " : " ANY "\n"
            "  transform.apply_patterns to %%f2 { "
            "transform.apply_patterns.vector.lower_masked_transfers } : " ANY "\n"
            "  transform.apply_cse to %%f2 : " ANY "\n"
            "  %%fors = transform.structured.match ops{[\"scf.for\"]} in %%root : (" ANY
            ") -> " ANY "\n"
            "  transform.apply_licm to %%fors : " ANY "\n"
            "  transform.loop.hoist_loop_invariant_subsets %%fors : " ANY "\n"
            "  transform.apply_patterns to %%f2 { transform.apply_patterns.canonicalization }"
            " : " ANY "\n"
            "  transform.apply_patterns to %%f2 {\n"
            "    transform.apply_patterns.vector.lower_contraction lowering_strategy = "
            "\"outerproduct\"\n"
            "    transform.apply_patterns.vector.transfer_permutation_patterns\n"
            "    transform.apply_patterns.vector.lower_outerproduct\n"
            "  } : " ANY "\n"
            "  transform.yield\n}\n}\n");
  if (w.sb.oom) {
    free(w.sb.p);
    return NULL;
  }
  *out_n_ops = w.n;
  *out_threads = w.used_threads;
  return w.sb.p;
}

//===--- Outlined groups back in place -----------------------------------===//

typedef struct outlined_calls {
  MlirOperation ops[JIT__MAX_OUTLINED];
  int n;
} outlined_calls;

static bool is_outlined_name(MlirStringRef s) {
  size_t n = sizeof kOutlinedPrefix - 1;
  return s.length > n && !memcmp(s.data, kOutlinedPrefix, n);
}

// Whether top-level `op` is one of the outlined functions.
static bool is_outlined_func(MlirOperation op) {
  MlirAttribute sym = mlirOperationGetAttributeByName(op, mlirSymbolTableGetSymbolAttributeName());
  return !mlirAttributeIsNull(sym) && mlirAttributeIsAString(sym) &&
         is_outlined_name(mlirStringAttrGetValue(sym));
}

static MlirWalkResult find_outlined_call(MlirOperation op, void *user) {
  outlined_calls *c = user;
  if (!jit__cpu_op_is(op, "func.call") || c->n == (int)(sizeof c->ops / sizeof *c->ops))
    return MlirWalkResultAdvance;
  MlirAttribute callee =
      mlirOperationGetAttributeByName(op, mlirStringRefCreateFromCString("callee"));
  if (!mlirAttributeIsNull(callee) && mlirAttributeIsAFlatSymbolRef(callee) &&
      is_outlined_name(mlirFlatSymbolRefAttrGetValue(callee)))
    c->ops[c->n++] = op;
  return MlirWalkResultAdvance;
}

// The upstream inliner will not do it: affine ops inline only into an affine scope
// or loop, and the calls sit in the scf.if of the generic kernel's row paths. Each
// function has one block and one call, so its ops move to the call (its arguments
// replaced by the call's operands, the call's results by what it returns).
int jit__cpu_inline_outlined(MlirOperation module) {
  outlined_calls calls = {.n = 0};
  mlirOperationWalk(module, find_outlined_call, &calls, MlirWalkPreOrder);
  MlirSymbolTable table = mlirSymbolTableCreate(module);
  int done = 0;
  for (int i = 0; i < calls.n; i++) {
    MlirOperation call = calls.ops[i];
    MlirOperation fn = mlirSymbolTableLookup(
        table, mlirFlatSymbolRefAttrGetValue(mlirOperationGetAttributeByName(
                   call, mlirStringRefCreateFromCString("callee"))));
    if (mlirOperationIsNull(fn)) continue;
    MlirBlock body = mlirRegionGetFirstBlock(mlirOperationGetRegion(fn, 0));
    for (intptr_t a = 0; a < mlirBlockGetNumArguments(body); a++)
      mlirValueReplaceAllUsesOfWith(mlirBlockGetArgument(body, a),
                                    mlirOperationGetOperand(call, a));
    MlirOperation ret = mlirBlockGetTerminator(body);
    for (MlirOperation op = mlirBlockGetFirstOperation(body);
         !mlirOperationIsNull(op) && !mlirOperationEqual(op, ret);) {
      MlirOperation next = mlirOperationGetNextInBlock(op);
      mlirOperationMoveBefore(op, call);
      op = next;
    }
    for (intptr_t r = 0; r < mlirOperationGetNumResults(call); r++)
      mlirValueReplaceAllUsesOfWith(mlirOperationGetResult(call, r),
                                    mlirOperationGetOperand(ret, r));
    mlirOperationDestroy(call);
    mlirSymbolTableErase(table, fn);
    done++;
  }
  mlirSymbolTableDestroy(table);
  MlirBlock top = mlirRegionGetFirstBlock(mlirOperationGetRegion(module, 0));
  for (MlirOperation op = mlirBlockGetFirstOperation(top); !mlirOperationIsNull(op);
       op = mlirOperationGetNextInBlock(op))
    if (is_outlined_func(op)) return -1;  // not called where the script left it
  return done;
}
