//===--- plan_rows.c - row loops, elementwise ops and streaming ----------===//
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


//===--- Row fusion (softmax, normalizations) -------------------------===//

// A reduction over the last loop only, reading input 0 through the identity.
static bool is_row_reduction(MlirOperation g) {
  if (!jit__cpu_op_is(g, "linalg.generic") || mlirOperationGetNumResults(g) != 1) return false;
  char it[JIT_MAX_RANK + 2];
  int nl = jit__cpu_read_iterators(g, it, (int)sizeof it);
  if (nl < 2 || it[nl - 1] != 'r') return false;
  for (int l = 0; l < nl - 1; l++)
    if (it[l] != 'p') return false;
  return jit__cpu_map_is_identity(g, 0);
}



// An elementwise generic of rank >= 2 that reads a row reduction (softmax's division
// by the row sum, a normalization) is the root of a row loop: tiling it by rows fuses
// its producers (the exps, the sum, the max) into the same loop, so a row is read from
// memory once and the rest stays in L1, instead of one pass over the whole matrix per
// op and a full-size intermediate in between.
bool jit__cpu_is_row_root(MlirOperation g) {
  if (!jit__cpu_op_is(g, "linalg.generic") || mlirOperationGetNumResults(g) != 1) return false;
  MlirType rt = mlirValueGetType(mlirOperationGetResult(g, 0));
  if (!jit__cpu_static_shaped(rt) || mlirShapedTypeGetRank(rt) < 2) return false;
  char it[JIT_MAX_RANK + 2];
  int nl = jit__cpu_read_iterators(g, it, (int)sizeof it);
  if (nl != mlirShapedTypeGetRank(rt)) return false;
  for (int l = 0; l < nl; l++)
    if (it[l] != 'p') return false;
  bool reads_reduction = false;
  for (intptr_t k = 0; k + 1 < mlirOperationGetNumOperands(g); k++) {
    MlirType t = mlirValueGetType(mlirOperationGetOperand(g, k));
    if (!mlirTypeIsARankedTensor(t) || !mlirShapedTypeHasStaticShape(t)) return false;
    MlirOperation p = jit__cpu_producer(mlirOperationGetOperand(g, k));
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
    MlirOperation p = jit__cpu_producer(mlirOperationGetOperand(g, k));
    if (mlirOperationIsNull(p) || !jit__cpu_op_is(p, "linalg.generic") || is_claimed(w, p)) continue;
    w->claimed[w->n_claimed++] = p;
    claim_producers(w, p, depth + 1);
  }
}

MlirWalkResult jit__cpu_find_row_roots(MlirOperation op, void *user) {
  walk *w = user;
  if (jit__cpu_is_row_root(op)) claim_producers(w, op, 0);
  return MlirWalkResultAdvance;
}

static void plan_row(walk *w, MlirOperation g) {
  MlirType rt = mlirValueGetType(mlirOperationGetResult(g, 0));
  int nl = (int)mlirShapedTypeGetRank(rt);
  int64_t d0 = mlirShapedTypeGetDimSize(rt, 0);
  int64_t numel = 1;
  for (int l = 0; l < nl; l++) numel *= mlirShapedTypeGetDimSize(rt, l);
  int i = w->n_row++;
  jit__cpu_set_tag(w->ctx, g, "jit_row", i);
  int64_t bytes = jit__cpu_shaped_bytes(rt);
  w->row_input_bytes = bytes;
  w->row_bytes = bytes > 0 ? bytes / numel * mlirShapedTypeGetDimSize(rt, nl - 1) : 0;
  jit__text *sb = &w->sb;
  jit__cpu_row_plan p = jit__cpu_plan_row(d0, numel, w->threads);
  sb_printf(sb,
            "  %%row%d = transform.structured.match ops{[\"linalg.generic\"]} attributes "
            "{jit_row = %d : i64} in %%root : (" ANY ") -> " ANY "\n",
            i, i);
  const char *src = "%row";
  if (p.par) {
    // Rows split across threads with the producers fused into the forall, so that each
    // thread runs whole row loops. (tile_using_forall on the root alone left the max,
    // exp and sum outside the forall, over the whole matrix on one thread, with a
    // full-size intermediate malloc'ed per call: 2 threads were slower than 1.)
    w->parallel = true;
    sb_printf(sb, "  %%rowt%d, %%rowf%d = transform.structured.fuse %%row%d "
                  "tile_sizes [%lld",
              i, i, i, (long long)p.rows);
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
int jit__cpu_transposed_loop(MlirOperation g, int nl) {
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

// Reduction `g` (nl loops), or a generic left to LLVM, split across the threads as plan
// `p` says (loop p->pd), and nothing else.
static void emit_split(walk *w, MlirOperation g, int nl, const jit__cpu_ew_plan *p) {
  jit__text *sb = &w->sb;
  int i = w->n_rd++;
  jit__cpu_set_tag(w->ctx, g, "jit_rd", i);
  w->parallel = true;
  sb_printf(sb,
            "  %%rd%d = transform.structured.match ops{[\"linalg.generic\"]} attributes "
            "{jit_rd = %d : i64} in %%root : (" ANY ") -> " ANY "\n"
            "  %%rdt%d, %%rdf%d = transform.structured.tile_using_forall %%rd%d "
            "tile_sizes [",
            i, i, i, i, i);
  for (int l = 0; l < nl; l++)
    sb_printf(sb, "%s%lld", l ? ", " : "", (long long)(l == p->pd ? p->e0 : 0));
  sb_printf(sb, "] : (" ANY ") -> (" ANY ", " ANY ")\n");
}

// Whether plan `p` peels a loop whose rest tiles are vectorized on their own (only
// with a transposed read, tl >= 0).
static bool has_rest_tiles(const jit__cpu_ew_plan *p, int nl, int tl) {
  for (int l = 0; tl >= 0 && p->n_loops && l < nl; l++)
    if (p->sizes[l] && p->peel[l]) return true;
  return false;
}

// Elementwise op `g` (loops `s`) tiled as plan `p` says.
static void emit_elementwise(walk *w, MlirOperation g, const jit__cpu_ew_shape *s,
                             const jit__cpu_ew_plan *p) {
  jit__text *sb = &w->sb;
  char hb[32];  // handle() text for sb_peel
  int nl = s->nl, tl = s->tl;
  int i = w->n_ew++;
  jit__cpu_set_tag(w->ctx, g, "jit_ew", i);
  if (p->transposes) w->transposes = true;
  // (Only tiled ops read a broadcast input in vectors of the last dim's tile.)
  if (p->n_loops && s->ext[nl - 1] > 1) w->ew_bcast[i] = broadcasts_last(g, nl);
  bool rest = has_rest_tiles(p, nl, tl);
  // Ops vectorized alike share one match at vectorization (script.c): a match per op
  // walks the whole function once per op, quadratic in a graph of 3,000 outputs.
  if (!w->ew_bcast[i] && !rest) jit__cpu_set_tag(w->ctx, g, "jit_ewv", 0);
  // The op's own handle, only where it is tiled.
  if (!p->par && !p->n_loops) return;
  sb_printf(sb,
            "  %%ew%d = transform.structured.match ops{[\"linalg.generic\"]} attributes "
            "{jit_ew = %d : i64} in %%root : (" ANY ") -> " ANY "\n",
            i, i);
  const char *src = "%ew";
  if (p->par) {
    w->parallel = true;
    sb_printf(sb, "  %%ewt%d, %%ewf%d = transform.structured.tile_using_forall %%ew%d "
                  "tile_sizes [",
              i, i, i);
    for (int l = 0; l < nl; l++)
      sb_printf(sb, "%s%lld", l ? ", " : "", (long long)(l == p->pd ? p->e0 : 0));
    sb_printf(sb, "] : (" ANY ") -> (" ANY ", " ANY ")\n");
    src = "%ewt";
  }
  if (!p->n_loops) return;
  sb_printf(sb, "  %%ewr%d, %%ewl%d:%d = transform.structured.tile_using_for %s%d "
                "tile_sizes [",
            i, i, p->n_loops, src, i);
  for (int l = 0; l < nl; l++) sb_printf(sb, "%s%lld", l ? ", " : "", (long long)p->sizes[l]);
  sb_printf(sb, "] : (" ANY ") -> ");
  sb_types(sb, p->n_loops + 1);
  sb_printf(sb, "\n");
  // The inner loop peeled first: peeling an outer one copies the inner loop, which
  // would leave its handle on only one of the copies.
  for (int l = nl - 1, li = p->n_loops - 1; l >= 0; l--) {
    if (!p->sizes[l]) continue;
    if (p->peel[l]) {
      char prefix[32];
      snprintf(prefix, sizeof prefix, "ewp%d_", i);
      sb_peel(sb, prefix, l, handle(hb, "ewl", i, li));
      if (tl >= 0) {
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
      }
    }
    li--;
  }
  if (rest) {
    w->ew_rest[i][0] = tl;
    w->ew_rest[i][1] = nl;
  }
}

static MlirWalkResult find_extract(MlirOperation op, void *user) {
  if (jit__cpu_op_is(op, "tensor.extract")) {
    *(bool *)user = true;
    return MlirWalkResultInterrupt;
  }
  return MlirWalkResultAdvance;
}

// Whether some indexing map of `g` has a result other than a loop index or the
// constant 0 (a broadcast dim): d1 * 2 + d4, a window's strided read.
static bool has_strided_map(MlirOperation g) {
  MlirAttribute maps =
      mlirOperationGetAttributeByName(g, mlirStringRefCreateFromCString("indexing_maps"));
  for (intptr_t i = 0; !mlirAttributeIsNull(maps) && i < mlirArrayAttrGetNumElements(maps);
       i++) {
    MlirAffineMap m = mlirAffineMapAttrGetValue(mlirArrayAttrGetElement(maps, i));
    // More results than loops (a [1, 1, 1] mean read as (d0, d1) -> (0, 0, 0), which
    // elementwise fusion's reshapes leave): no projected permutation either.
    if (mlirAffineMapGetNumResults(m) > mlirAffineMapGetNumDims(m)) return true;
    for (intptr_t r = 0; r < mlirAffineMapGetNumResults(m); r++) {
      MlirAffineExpr x = mlirAffineMapGetResult(m, r);
      bool zero = mlirAffineExprIsAConstant(x) && mlirAffineConstantExprGetValue(x) == 0;
      if (!mlirAffineExprIsADim(x) && !zero) return true;
    }
  }
  return false;
}

// Whether an operand of `g` holds bf16: its transposed tiles would shuffle bfloat
// vectors, on which LLVM's x86 backend aborts ("Do not know how to soft promote this
// operator's operand": a [256, 9] transpose killed the process).
static bool has_bf16(MlirOperation g) {
  for (intptr_t k = 0; k < mlirOperationGetNumOperands(g); k++) {
    MlirType t = mlirValueGetType(mlirOperationGetOperand(g, k));
    if (mlirTypeIsAShaped(t) && mlirTypeIsABF16(mlirShapedTypeGetElementType(t))) return true;
  }
  return false;
}

static void plan_generic_threads(walk *w, MlirOperation g) {
  // A body that reads a tensor at computed indices (a window's padding, emit_window.c)
  // does not vectorize as an elementwise op: its loops are left to LLVM, split across
  // the threads where it is large enough (and not tiled). So does one
  // that reads an operand at strided positions (a window's im2col copy, Winograd's
  // output transform at h / m): vectorize takes projected permutations only.
  bool loose = false;
  mlirOperationWalk(g, find_extract, &loose, MlirWalkPreOrder);
  loose = loose || has_strided_map(g);
  for (int f = 0; f < w->n_fused; f++)
    if (mlirOperationEqual(w->fused[f], g)) return;
  for (int f = 0; f < w->n_taken_t; f++)
    if (mlirOperationEqual(w->taken_t[f], g)) return;
  if (is_claimed(w, g)) return;
  if (jit__cpu_is_row_root(g)) {
    if (loose) return;
    plan_row(w, g);
    return;
  }
  if (mlirOperationGetNumResults(g) != 1) return;
  MlirType rt = mlirValueGetType(mlirOperationGetResult(g, 0));
  if (!jit__cpu_static_shaped(rt)) return;
  for (intptr_t k = 0; k < mlirOperationGetNumOperands(g); k++) {
    MlirType t = mlirValueGetType(mlirOperationGetOperand(g, k));
    if (mlirTypeIsARankedTensor(t) && !mlirShapedTypeHasStaticShape(t)) return;
  }
  char it[JIT_MAX_RANK + 2];
  int nl = jit__cpu_read_iterators(g, it, (int)sizeof it);
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
    if (n_red != 1 || it[nl - 1] != 'r' || !jit__cpu_map_is_identity(g, 0)) return;
    MlirType t0 = mlirValueGetType(mlirOperationGetOperand(g, 0));
    if (!jit__cpu_static_shaped(t0) || mlirShapedTypeGetRank(t0) != nl) return;
    for (int l = 0; l < nl; l++) ext[l] = mlirShapedTypeGetDimSize(t0, l);
  }
  // Split like the batch before it, or where the emitter asks (`jit_split`: a
  // generic whose body does more than an elementwise op's, Winograd's transforms).
  bool hint = !mlirAttributeIsNull(
      mlirOperationGetAttributeByName(g, mlirStringRefCreateFromCString("jit_split")));
  jit__cpu_ew_shape es = {.nl = nl, .reduction = n_red != 0,
                          .follow_split = w->ew_split || hint};
  for (int l = 0; l < nl; l++) es.ext[l] = ext[l];
  es.tl = nl >= 2 && !n_red && !has_bf16(g) ? jit__cpu_transposed_loop(g, nl) : -1;
  jit__cpu_ew_plan p = jit__cpu_plan_elementwise(&es, &w->h, w->threads);
  if (p.skip) return;
  if (loose) {
    if (p.par && !n_red) emit_split(w, g, nl, &p);
    return;
  }
  if (n_red) emit_split(w, g, nl, &p);
  else emit_elementwise(w, g, &es, &p);
}

void jit__cpu_plan_generic(walk *w, MlirOperation g) {
  jit__cpu_plan_threads_of(w, g, plan_generic_threads);
}

//===--- Streaming -------------------------------------------------------===//
//
// What jit__cpu_plan_stream (plan_row_choice.c, which says why) reads of a module.

typedef struct stream_walk {
  const walk *w;
  bool other;         // an op that reads its output back, or that this does not know
  int loose;          // generics outside the row loop
  int64_t out_bytes;  // bytes of all outputs
  int64_t in_bytes;   // bytes of all inputs (the function's tensor arguments)
} stream_walk;

static MlirWalkResult find_streams(MlirOperation op, void *user) {
  stream_walk *s = user;
  MlirIdentifier id = mlirOperationGetName(op);
  MlirStringRef name = mlirIdentifierStr(id);
  if (jit__cpu_op_is(op, "func.func")) {
    MlirBlock entry = mlirRegionGetFirstBlock(mlirOperationGetRegion(op, 0));
    for (intptr_t i = 0; !mlirBlockIsNull(entry) && i < mlirBlockGetNumArguments(entry); i++) {
      MlirType t = mlirValueGetType(mlirBlockGetArgument(entry, i));
      if (mlirTypeIsARankedTensor(t) && jit__cpu_static_shaped(t))
        s->in_bytes += jit__cpu_shaped_bytes(t);
    }
    return MlirWalkResultAdvance;
  }
  if (name.length > 7 && strncmp(name.data, "linalg.", 7) == 0) {
    if (jit__cpu_op_is(op, "linalg.fill") || jit__cpu_op_is(op, "linalg.yield") || jit__cpu_op_is(op, "linalg.index"))
      return MlirWalkResultAdvance;
    if (!jit__cpu_op_is(op, "linalg.generic")) {
      s->other = true;
      return MlirWalkResultAdvance;
    }
    bool in_row = is_claimed((walk *)s->w, op) || jit__cpu_is_row_root(op);
    if (!in_row) {
      s->loose++;
      char it[JIT_MAX_RANK + 2];
      int nl = jit__cpu_read_iterators(op, it, (int)sizeof it);
      for (int l = 0; l < nl; l++)
        if (it[l] != 'p') s->other = true;
      if (nl <= 0) s->other = true;
    }
  } else if (jit__cpu_op_is(op, "bufferization.materialize_in_destination")) {
    MlirType t = mlirValueGetType(mlirOperationGetOperand(op, 0));
    int64_t bytes = jit__cpu_static_shaped(t) ? jit__cpu_shaped_bytes(t) : -1;
    if (bytes < 0) s->other = true;
    else s->out_bytes += bytes;
  }
  return MlirWalkResultAdvance;
}

// Sets out->stream and out->row_prefetch (above) for the module `w` planned.
void jit__cpu_plan_streams(const walk *w, MlirOperation module, jit__cpu_plan *out) {
  if (w->n_mm || strncmp(w->o->triple, "x86_64", 6) != 0) return;
  stream_walk s = {w, false, 0, 0, 0};
  mlirOperationWalk(module, find_streams, &s, MlirWalkPreOrder);
  jit__cpu_stream_facts f = {s.other, s.loose, s.out_bytes, s.in_bytes, w->h.l3,
                             w->n_row, w->row_bytes, w->row_input_bytes};
  jit__cpu_stream_plan p = jit__cpu_plan_stream(&f);
  out->stream = p.stream;
  out->row_prefetch = p.row_prefetch;
}


MlirWalkResult jit__cpu_plan_generic_op(MlirOperation op, void *user) {
  walk *w = user;
  if (jit__cpu_op_is(op, "linalg.generic")) jit__cpu_plan_generic(w, op);
  return MlirWalkResultAdvance;
}
