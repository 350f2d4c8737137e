//===--- generic.c - the CPU strategy for kernels with `?` dims -------------===//
//
// A generic kernel (one per graph, its symbolic dims kept as `?`) cannot be planned
// from sizes: the sizes arrive with each call. Its matmuls get static register tiles
// over dynamic loops, with the partial last tiles peeled off (transform.loop.peel) so
// that every whole tile vectorizes unmasked (recipes/mmdyn.mlir: 0.98-1.0x of the
// static kernel at 512^3 and 1024^3):
//
//   [mc rows, kc] cache blocks (dynamic M only; kc when K is large or dynamic)
//     [tm x tn] register tiles, the m and n loops peeled where they can be partial
//       whole rows:     k loop of tm x tn outer products (accumulators in registers)
//       remaining rows: one row at a time, k loop of 1 x tn outer products
//
// A partial n tile (N not a multiple of tn, or `?`) runs as scalar loops. Everything
// else (elementwise ops, reductions, softmax) is left as loops for LLVM's loop
// vectorizer, which handles run-time trip counts with its own remainder loops.
//
//===----------------------------------------------------------------------===//
#include <stdlib.h>
#include <string.h>

#include <mlir-c/BuiltinTypes.h>

#include "lowering/cpu/internal.h"

jit__cpu_generic_mm_plan jit__cpu_plan_generic_mm(int64_t M, int64_t K, int64_t N,
                                                  const jit__cpu_host *h) {
  jit__cpu_generic_mm_plan p = {0};
  p.tm = h->tm;
  p.tn = h->tn;
  // A static N of at most one register tile is one tile, whole: no n loop to peel.
  if (N >= 0 && N <= p.tn) {
    p.tn = N;
    p.peel_n = false;
  } else {
    p.peel_n = N < 0 || N % p.tn != 0;
  }
  // Cache blocks of rows only where M is `?` (the usual case: a batch); a static M
  // is tiled by tm directly, peeled when tm does not divide it.
  p.mc = M < 0 ? 8 * p.tm : 0;
  p.peel_m = M < 0 || M % p.tm != 0;
  p.kc = (K < 0 || K > 256) ? 128 : 0;
  return p;
}

//===--- Script ----------------------------------------------------------===//

// Writes `%<res>, %<res>l:<loops> = tile_using_for %<op> tile_sizes [...]`; returns
// the number of loops (non-zero sizes).
static int tile(jit__text *sb, const char *res, const char *op, int n, const int64_t *sizes) {
  int loops = 0;
  for (int i = 0; i < n; i++) loops += sizes[i] != 0;
  sb_printf(sb, "  %%%s, %%%sl:%d = transform.structured.tile_using_for %s tile_sizes [",
            res, res, loops ? loops : 1, op);
  for (int i = 0; i < n; i++) sb_printf(sb, "%s%lld", i ? ", " : "", (long long)sizes[i]);
  sb_printf(sb, "] : (" ANY ") -> ");
  sb_types(sb, 1 + loops);
  sb_printf(sb, "\n");
  return loops;
}

// One matmul (tag jit.gmm = i): `b` is 1 for a batch_matmul (its leading batch loop is
// tiled by 1 with the cache blocks), else 0.
static void write_matmul(jit__text *sb, int i, const char *name, int b,
                         const jit__cpu_generic_mm_plan *p) {
  char cur[48], loop[48], res[32];
  sb_printf(sb,
            "  %%g%d = transform.structured.match ops{[\"%s\"]} attributes {jit.gmm = %d} "
            "in %%root : (" ANY ") -> " ANY "\n", i, name, i);
  snprintf(cur, sizeof cur, "%%g%d", i);
  int64_t s[4] = {0};
  if (b || p->mc || p->kc) {
    s[0] = 1;
    s[b] = p->mc;
    s[b + 2] = p->kc;
    snprintf(res, sizeof res, "g%do", i);
    tile(sb, res, cur, 3 + b, s);
    snprintf(cur, sizeof cur, "%%g%do", i);
  }
  memset(s, 0, sizeof s);
  s[b] = p->tm;
  s[b + 1] = p->tn;
  snprintf(res, sizeof res, "g%dt", i);
  tile(sb, res, cur, 3 + b, s);
  // The m loop is the first of the register tiling's loops, n the second (none when
  // tn is all of a static N; MLIR still makes a one-trip loop for it).
  if (p->peel_n) {
    snprintf(loop, sizeof loop, "%%g%dtl#1", i);
    sb_peel(sb, "gn", i, loop);
  }
  snprintf(loop, sizeof loop, "%%g%dtl#0", i);
  const char *whole = loop;
  char wbuf[48];
  if (p->peel_m) {
    sb_peel(sb, "gm", i, loop);
    snprintf(wbuf, sizeof wbuf, "%%gm%dm", i);
    whole = wbuf;
    // The remaining rows, one at a time.
    sb_printf(sb,
              "  %%gr%d = transform.structured.match ops{[\"%s\"]} in %%gm%dr : "
              "(!transform.op<\"scf.for\">) -> " ANY "\n", i, name, i);
    memset(s, 0, sizeof s);
    s[b] = 1;
    s[b + 2] = 1;
    snprintf(res, sizeof res, "gr%dt", i);
    snprintf(cur, sizeof cur, "%%gr%d", i);
    tile(sb, res, cur, 3 + b, s);
  }
  sb_printf(sb, "  %%gw%d = transform.structured.match ops{[\"%s\"]} in %s : (%s) -> " ANY "\n",
            i, name, whole, p->peel_m ? "!transform.op<\"scf.for\">" : ANY);
  memset(s, 0, sizeof s);
  s[b + 2] = 1;
  snprintf(res, sizeof res, "gw%dt", i);
  snprintf(cur, sizeof cur, "%%gw%d", i);
  tile(sb, res, cur, 3 + b, s);
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

typedef struct generic_walk {
  MlirContext ctx;
  jit__cpu_host host;
  jit__text sb;
  int n;
} generic_walk;

static MlirWalkResult visit(MlirOperation op, void *user) {
  generic_walk *w = user;
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
  jit__cpu_generic_mm_plan p = jit__cpu_plan_generic_mm(M, K, N, &w->host);
  if (p.tn == 0 || M == 0 || K == 0) return MlirWalkResultAdvance;
  jit__cpu_set_tag(w->ctx, op, "jit.gmm", w->n);
  write_matmul(&w->sb, w->n, bm ? "linalg.batch_matmul" : "linalg.matmul", b, &p);
  w->n++;
  return MlirWalkResultAdvance;
}

char *jit__cpu_generic_script(MlirContext ctx, MlirOperation module,
                              const jit__lower_options *o, int *out_n_ops) {
  generic_walk w = {.ctx = ctx, .host = jit__cpu_host_of(o)};
  *out_n_ops = 0;
  sb_printf(&w.sb,
            "module attributes {transform.with_named_sequence} {\n"
            "transform.named_sequence @__transform_main(%%root: " ANY
            " {transform.readonly}) {\n");
  mlirOperationWalk(module, visit, &w, MlirWalkPreOrder);
  sb_printf(&w.sb,
            "  %%f = transform.structured.match ops{[\"func.func\"]} in %%root : (" ANY
            ") -> " ANY "\n"
            "  transform.apply_patterns to %%f { transform.apply_patterns.canonicalization }"
            " : " ANY "\n"
            "  %%f2 = transform.structured.vectorize_children_and_apply_patterns %%f : (" ANY
            ") -> " ANY "\n"
            "  transform.apply_patterns to %%f2 { transform.apply_patterns.canonicalization }"
            " : " ANY "\n"
            "  %%fors = transform.structured.match ops{[\"scf.for\"]} in %%f2 : (" ANY
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
  return w.sb.p;
}
