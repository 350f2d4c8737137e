//===--- normalize.c - rewrites before planning (x W^T form, K split, odd N) ===//
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
  jit__cpu_host h;
  jit__text sb;
  int n;
} split_walk;

// Whether matmul `mm`, with N columns, is split at its odd N.
static bool splits_at_odd_n(const jit__cpu_host *h, MlirOperation mm, int64_t N) {
  int64_t w = h->ptn, rest = N % w;
  if (N <= w || N <= 4 * h->lanes || !rest) return false;
  return N % h->tn != 0 || mlirOperationIsNull(jit__cpu_epilogue_of(mm));
}

// x W^T whose rows pack B (not jit__cpu_bt_map's), still reading W through (n, k)
// because it is to be split (jit__cpu_normalize): split so, each part reads its own
// rows of W.
static MlirWalkResult find_odd_n(MlirOperation op, void *user) {
  static const int plain[6] = {0, 2, 2, 1, 0, 1};
  split_walk *s = user;
  if (!jit__cpu_op_is(op, "linalg.matmul") || mlirOperationGetNumResults(op) != 1)
    return MlirWalkResultAdvance;
  bool bt = jit__cpu_b_transposed(op);
  if (!bt && !jit__cpu_maps_are(op, 3, 3, 2, plain, true)) return MlirWalkResultAdvance;
  MlirType ta = mlirValueGetType(mlirOperationGetOperand(op, 0));
  MlirType tb = mlirValueGetType(mlirOperationGetOperand(op, 1));
  if (!jit__cpu_static_shaped(ta) || !jit__cpu_static_shaped(tb) || mlirShapedTypeGetRank(ta) != 2 ||
      mlirShapedTypeGetRank(tb) != 2)
    return MlirWalkResultAdvance;
  if (bt && jit__cpu_bt_map(mlirShapedTypeGetDimSize(ta, 0), mlirShapedTypeGetDimSize(ta, 1),
                            mlirTypeIsAF16(mlirShapedTypeGetElementType(tb))))
    return MlirWalkResultAdvance;
  int64_t N = mlirShapedTypeGetDimSize(tb, bt ? 0 : 1), rest = N % s->h.ptn;
  if (!splits_at_odd_n(&s->h, op, N)) return MlirWalkResultAdvance;
  int j = s->n++;
  jit__cpu_set_tag(s->ctx, op, "jit_sp", j);
  jit__cpu_set_tag(s->ctx, op, "jit_n", (int)N);
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
  s.h = jit__cpu_host_of(o);
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
    if (jit__cpu_op_is(op, "func.return")) {
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
static bool splits_k(const jit__cpu_host *h, MlirOperation mm, int threads) {
  static const int plain[6] = {0, 2, 2, 1, 0, 1};
  if (threads < 2 || threads > 8 || !jit__cpu_op_is(mm, "linalg.matmul") ||
      jit__cpu_in_forall(mm) ||
      mlirOperationGetNumOperands(mm) != 3 || mlirOperationGetNumResults(mm) != 1 ||
      !jit__cpu_maps_are(mm, 3, 3, 2, plain, true))
    return false;
  MlirType t[3];
  for (int i = 0; i < 3; i++) {
    t[i] = mlirValueGetType(mlirOperationGetOperand(mm, i));
    MlirType e = jit__cpu_static_shaped(t[i]) ? mlirShapedTypeGetElementType(t[i]) : t[i];
    if (!jit__cpu_static_shaped(t[i]) || mlirShapedTypeGetRank(t[i]) != 2 ||
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
         (N * eb / threads < 4096 || M >= 4) && (double)K * N * 4 >= jit__cpu_split_b_bytes(*h);
}

typedef struct ks_walk {
  const jit__cpu_host *h;
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
  jit__cpu_host h = jit__cpu_host_of(o);
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
  if (!jit__cpu_op_is(op, "linalg.fill") || mlirOperationGetNumResults(op) != 1 || f->n >= 64)
    return MlirWalkResultAdvance;
  MlirOpOperand use = mlirValueGetFirstUse(mlirOperationGetResult(op, 0));
  if (!mlirOpOperandIsNull(use) && !mlirOpOperandIsNull(mlirOpOperandGetNextUse(use)))
    f->fills[f->n++] = op;
  return MlirWalkResultAdvance;
}

void jit__cpu_unshare_fills(MlirOperation module) {
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
  if ((jit__cpu_op_is(op, "linalg.matmul") || jit__cpu_op_is(op, "linalg.batch_matmul")) && b->n < 64)
    b->mm[b->n++] = op;
  return MlirWalkResultAdvance;
}

static bool batch_dot_planned(const jit__cpu_host *h, MlirOperation bm) {
  MlirType ta = mlirValueGetType(mlirOperationGetOperand(bm, 0));
  if (!jit__cpu_static_shaped(ta) || mlirShapedTypeGetRank(ta) != 3) return false;
  return jit__cpu_batch_dot_rows(h, mlirShapedTypeGetDimSize(ta, 1), mlirShapedTypeGetDimSize(ta, 2));
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

// `mm`, whose B is made by a transpose (jit__cpu_made_by_transpose), reads the transpose's input
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
  if (mlirAttributeIsNull(a) || !jit__cpu_static_shaped(tb) || !clone_transpose(ctx, tb, mm, bv, &wt))
    return;
  mlirOperationSetOperand(mm, 1, wt);
  mlirOperationSetAttributeByName(mm, mlirStringRefCreateFromCString("indexing_maps"), a);
}

void jit__cpu_normalize(MlirContext ctx, MlirOperation module, const jit__lower_options *o) {
  static const int plain[6] = {0, 2, 2, 1, 0, 1};
  jit__cpu_host h = jit__cpu_host_of(o);
  bt_walk b;
  b.n = 0;
  mlirOperationWalk(module, find_2d_matmuls, &b, MlirWalkPreOrder);
  for (int i = 0; i < b.n; i++) {
    MlirOperation mm = b.mm[i];
    if (mlirOperationGetNumOperands(mm) != 3 || mlirOperationGetNumResults(mm) != 1) continue;
    MlirValue bv = mlirOperationGetOperand(mm, 1);
    if (jit__cpu_op_is(mm, "linalg.batch_matmul")) {
      // Imported q K^T (K stored batch x N x K, read through (b, n, k)) that is not
      // planned as dot products (jit__cpu_batch_dot_rows): a transpose of K and a plain
      // batch_matmul, planned as the graph's are (K^T planned ahead). Its loops were
      // left unplanned: 12x128x64x128 649 us against 133, 12x512x64x512 13.6 ms
      // against 2.1, 4x37x64x50 27 us against 10.
      // And the reverse: a transpose of K feeding a plain batch (emit_mlir.c's q K^T
      // above 4 rows) that the dot products take, reading K as stored: 12x8x256x512
      // 859 -> 292 us, 12x32x256x128 283 -> 196 (1 thread).
      if (jit__cpu_batch_b_transposed(mm) && !batch_dot_planned(&h, mm))
        read_b_transposed(ctx, mm, kBatchMapsPlain);
      else if (jit__cpu_batch_maps_plain(mm) && batch_dot_planned(&h, mm) &&
               jit__cpu_made_by_transpose(bv, mm, true))
        read_b_as_stored(ctx, mm, kBatchMapsBt);
      continue;
    }
    MlirType tx = mlirValueGetType(mlirOperationGetOperand(mm, 0)), tb = mlirValueGetType(bv);
    if (!jit__cpu_static_shaped(tx) || !jit__cpu_static_shaped(tb) || mlirShapedTypeGetRank(tx) != 2 ||
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
                    (jit__cpu_static_shaped(tc) && mlirShapedTypeGetRank(tc) == 2 &&
                     splits_at_odd_n(&h, mm, mlirShapedTypeGetDimSize(tc, 1)));
    if (want_map && jit__cpu_maps_are(mm, 3, 3, 2, plain, true) && jit__cpu_made_by_transpose(bv, mm, true))
      read_b_as_stored(ctx, mm, kMapsBt);  // transpose + matmul -> W through (n, k)
    else if (!want_map && jit__cpu_b_transposed(mm))
      read_b_transposed(ctx, mm, kMapsPlain);  // -> a transpose of W and a plain matmul
  }
}

