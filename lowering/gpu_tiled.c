//===--- gpu_tiled.c - GPU kernels that use workgroup memory ----------------===//
//
// Why hand-written kernels: MLIR 22 has the pieces for tiled GPU kernels (linalg
// promotion, gpu-map-forall), but they work on linalg ops before bufferization, while
// compile_gpu.c maps bufferized loops (so that intermediates become runtime buffers);
// the transform route would be a second front half to keep working for both back
// halves. Instead the kernel is written here as MLIR text: a gpu.launch with
// workgroup attributions (memref space 3), gpu.barrier and gpu.thread_id/block_id,
// which convert-gpu-to-nvvm and (after jit__gpu_attributions_to_allocs)
// convert-gpu-to-spirv both lower. What the kernel computes is not written here:
// the text holds placeholders ("jit.x", "jit.acc", ...), each replaced by clones of
// the original loop body's ops with the loop indices remapped. So fused elementwise
// producers, f16 extensions, broadcasting batch dims, transposed operands and the
// combine op (add, max, ...) come from the graph, and the accumulation keeps the
// original's operand order.
//
// Recognised loop nest (what convert-linalg-to-parallel-loops makes of a linalg
// reduction or contraction after compile_gpu.c's normalisation):
//   scf.parallel (%i...) = (0...) to (ub...) step (1...) {
//     scf.for %r = 0 to R step 1 {
//       <loads and pure arith/math ops computing %x>
//       %acc = memref.load %out[<no %r>]
//       %y = <combine> %acc, %x       (or %x, %acc)
//       memref.store %y, %out[<same indices>]
//     }
//   }
// Matmul: two loads depend on %r: A uses the second-to-last parallel index and not
// the last, B the last and not the second-to-last. Row: every load that uses %r uses
// it as its last (contiguous) index.
//
// Edges: tiles are guarded (out-of-range rows/columns are loaded as 0 and never
// stored) and the K remainder is a separate, shorter tile step, so no padded value
// ever enters an accumulation: any shape (1, primes, non-multiples of the tile) is
// exact. Grid sizes stay <= 65535 per dim (Vulkan's guaranteed minimum) or the plain
// mapping is used.
//
//===----------------------------------------------------------------------===//
#include "lowering/gpu_tiled.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>

#include "base/text.h"
#include "jitml.h"

//===--- Small helpers ---------------------------------------------------===//

static MlirStringRef tl_sr(const char *s) { return mlirStringRefCreateFromCString(s); }

static bool tl_is(MlirOperation op, const char *name) {
  MlirStringRef s = mlirIdentifierStr(mlirOperationGetName(op));
  size_t n = strlen(name);
  return s.length == n && !memcmp(s.data, name, n);
}

static bool tl_prefix(MlirOperation op, const char *prefix) {
  MlirStringRef s = mlirIdentifierStr(mlirOperationGetName(op));
  size_t n = strlen(prefix);
  return s.length >= n && !memcmp(s.data, prefix, n);
}

static int64_t tl_const(MlirValue v, bool *ok) {
  if (mlirValueIsAOpResult(v)) {
    MlirOperation d = mlirOpResultGetOwner(v);
    if (tl_is(d, "arith.constant")) {
      MlirAttribute a = mlirOperationGetAttributeByName(d, tl_sr("value"));
      if (mlirAttributeIsAInteger(a)) return mlirIntegerAttrGetValueInt(a);
    }
  }
  *ok = false;
  return 0;
}

static int tl_uses(MlirValue v) {
  int n = 0;
  for (MlirOpOperand u = mlirValueGetFirstUse(v); !mlirOpOperandIsNull(u);
       u = mlirOpOperandGetNextUse(u))
    n++;
  return n;
}

// Defined in `entry` (the kernel function's entry block): usable anywhere in it.
static bool tl_outside(MlirValue v, MlirBlock entry) {
  if (mlirValueIsABlockArgument(v)) return mlirBlockEqual(mlirBlockArgumentGetOwner(v), entry);
  return mlirBlockEqual(mlirOperationGetBlock(mlirOpResultGetOwner(v)), entry);
}

// The function argument behind a memref, through views that keep the base address.
static MlirValue tl_base(MlirValue v) {
  for (int depth = 0; depth < 16 && mlirValueIsAOpResult(v); depth++) {
    MlirOperation d = mlirOpResultGetOwner(v);
    if (tl_is(d, "memref.collapse_shape") || tl_is(d, "memref.expand_shape") ||
        tl_is(d, "memref.cast"))
      v = mlirOperationGetOperand(d, 0);
    else
      break;
  }
  return v;
}


static void tl_type_cb(MlirStringRef s, void *user) {
  char *buf = user;
  size_t have = strlen(buf), n = s.length;
  if (have + n >= 64) n = 63 - have;
  memcpy(buf + have, s.data, n);
  buf[have + n] = 0;
}

// The type's MLIR spelling ("f32", "f16") into buf[64].
static void tl_type_str(MlirType t, char *buf) {
  buf[0] = 0;
  mlirTypePrint(t, tl_type_cb, buf);
}

//===--- The recognised loop nest ----------------------------------------===//

enum { kMaxBody = 64 };

typedef struct tl_nest {
  MlirOperation par, fr;
  int rank;
  int64_t ub[JIT_MAX_RANK];
  int64_t red;  // the reduction loop's trip count
  MlirValue iv[JIT_MAX_RANK], r;
  MlirOperation acc_load, comb, store;
  MlirValue x;  // the combine's operand that is not the accumulator
  MlirOperation ops[kMaxBody];  // the other body ops, in order
  int n_ops;
  // Contractions: the two loads that use %r; x_ops = ops minus those loads.
  MlirOperation la, lb;
} tl_nest;

static int tl_iv_index(const tl_nest *n, MlirValue v) {
  for (int d = 0; d < n->rank; d++)
    if (mlirValueEqual(v, n->iv[d])) return d;
  return -1;
}

static bool tl_is_body_result(const tl_nest *n, int upto, MlirValue v) {
  if (!mlirValueIsAOpResult(v)) return false;
  MlirOperation o = mlirOpResultGetOwner(v);
  for (int i = 0; i < upto; i++)
    if (mlirOperationEqual(o, n->ops[i])) return true;
  return false;
}

// Ops that may be cloned into a tiled kernel: reads and pure scalar arithmetic.
static bool tl_clonable(MlirOperation op) {
  if (mlirOperationGetNumRegions(op) != 0) return false;
  if (tl_is(op, "memref.load")) return true;
  return tl_prefix(op, "arith.") || tl_prefix(op, "math.");
}

// Matches the nest of the module comment in `kf`; false leaves nothing changed.
static bool tl_match(MlirOperation kf, tl_nest *n) {
  memset(n, 0, sizeof *n);
  MlirBlock entry = mlirRegionGetFirstBlock(mlirOperationGetRegion(kf, 0));
  int n_par = 0;
  for (MlirOperation op = mlirBlockGetFirstOperation(entry); !mlirOperationIsNull(op);
       op = mlirOperationGetNextInBlock(op)) {
    if (tl_is(op, "scf.parallel")) {
      n->par = op;
      n_par++;
    } else if (!tl_is(op, "arith.constant") && !tl_is(op, "func.return") &&
               !tl_is(op, "memref.collapse_shape") && !tl_is(op, "memref.expand_shape") &&
               !tl_is(op, "memref.cast")) {
      return false;
    }
  }
  if (n_par != 1 || mlirOperationGetNumResults(n->par) != 0) return false;
  n->rank = (int)(mlirOperationGetNumOperands(n->par) / 3);
  if (n->rank < 1 || n->rank > JIT_MAX_RANK ||
      mlirOperationGetNumOperands(n->par) != (intptr_t)(3 * n->rank))
    return false;
  bool ok = true;
  for (int d = 0; d < n->rank; d++) {
    ok = ok && tl_const(mlirOperationGetOperand(n->par, d), &ok) == 0;
    n->ub[d] = tl_const(mlirOperationGetOperand(n->par, n->rank + d), &ok);
    ok = ok && tl_const(mlirOperationGetOperand(n->par, 2 * n->rank + d), &ok) == 1;
    ok = ok && n->ub[d] >= 1;
  }
  if (!ok) return false;
  MlirBlock pb = mlirRegionGetFirstBlock(mlirOperationGetRegion(n->par, 0));
  for (int d = 0; d < n->rank; d++) n->iv[d] = mlirBlockGetArgument(pb, d);
  n->fr = mlirBlockGetFirstOperation(pb);
  if (mlirOperationIsNull(n->fr) || !tl_is(n->fr, "scf.for")) return false;
  MlirOperation term = mlirOperationGetNextInBlock(n->fr);
  if (mlirOperationIsNull(term) || !tl_is(term, "scf.reduce") ||
      mlirOperationGetNumOperands(term) != 0 ||
      !mlirOperationIsNull(mlirOperationGetNextInBlock(term)))
    return false;
  if (mlirOperationGetNumResults(n->fr) != 0 || mlirOperationGetNumOperands(n->fr) != 3)
    return false;
  ok = tl_const(mlirOperationGetOperand(n->fr, 0), &ok) == 0;
  n->red = tl_const(mlirOperationGetOperand(n->fr, 1), &ok);
  ok = ok && tl_const(mlirOperationGetOperand(n->fr, 2), &ok) == 1 && n->red >= 1;
  if (!ok) return false;
  MlirBlock fb = mlirRegionGetFirstBlock(mlirOperationGetRegion(n->fr, 0));
  n->r = mlirBlockGetArgument(fb, 0);

  // The body: ..., store, yield.
  MlirOperation last = mlirBlockGetTerminator(fb);
  if (mlirOperationIsNull(last) || !tl_is(last, "scf.yield") ||
      mlirOperationGetNumOperands(last) != 0)
    return false;
  int count = 0;
  for (MlirOperation op = mlirBlockGetFirstOperation(fb); !mlirOperationEqual(op, last);
       op = mlirOperationGetNextInBlock(op)) {
    n->store = op;
    count++;
  }
  if (count < 3 || count > kMaxBody + 3) return false;
  if (!tl_is(n->store, "memref.store")) return false;
  MlirValue y = mlirOperationGetOperand(n->store, 0);
  if (!mlirValueIsAOpResult(y)) return false;
  n->comb = mlirOpResultGetOwner(y);
  static const char *const kCombine[] = {"arith.addf",    "arith.mulf",   "arith.maximumf",
                                         "arith.minimumf", "arith.maxnumf", "arith.minnumf"};
  bool known = false;
  for (size_t i = 0; i < sizeof kCombine / sizeof kCombine[0]; i++) known |= tl_is(n->comb, kCombine[i]);
  if (!known || tl_uses(y) != 1 || mlirOperationGetNumOperands(n->comb) != 2) return false;
  if (!mlirBlockEqual(mlirOperationGetBlock(n->comb), fb)) return false;
  MlirValue out = mlirOperationGetOperand(n->store, 1);
  intptr_t n_idx = mlirOperationGetNumOperands(n->store) - 2;
  for (int side = 0; side < 2; side++) {
    MlirValue v = mlirOperationGetOperand(n->comb, side);
    if (!mlirValueIsAOpResult(v)) continue;
    MlirOperation d = mlirOpResultGetOwner(v);
    if (!tl_is(d, "memref.load") || !mlirValueEqual(mlirOperationGetOperand(d, 0), out) ||
        mlirOperationGetNumOperands(d) != n_idx + 1 || tl_uses(v) != 1 ||
        !mlirBlockEqual(mlirOperationGetBlock(d), fb))
      continue;
    bool same = true;
    for (intptr_t i = 0; i < n_idx; i++)
      same = same && mlirValueEqual(mlirOperationGetOperand(d, 1 + i),
                                    mlirOperationGetOperand(n->store, 2 + i));
    if (!same) continue;
    n->acc_load = d;
    n->x = mlirOperationGetOperand(n->comb, 1 - side);
    break;
  }
  if (mlirOperationIsNull(n->acc_load)) return false;
  // The accumulator's indices: parallel indices or outside values, never %r.
  for (intptr_t i = 0; i < n_idx; i++) {
    MlirValue v = mlirOperationGetOperand(n->store, 2 + i);
    if (tl_iv_index(n, v) < 0 && !tl_outside(v, entry)) return false;
  }
  if (!tl_outside(out, entry)) return false;
  MlirValue out_base = tl_base(out);

  // The other ops: clonable, operands from indices, earlier body ops or outside.
  for (MlirOperation op = mlirBlockGetFirstOperation(fb); !mlirOperationEqual(op, n->store);
       op = mlirOperationGetNextInBlock(op)) {
    if (mlirOperationEqual(op, n->acc_load) || mlirOperationEqual(op, n->comb)) continue;
    if (!tl_clonable(op) || n->n_ops == kMaxBody) return false;
    for (intptr_t i = 0; i < mlirOperationGetNumOperands(op); i++) {
      MlirValue v = mlirOperationGetOperand(op, i);
      if (tl_iv_index(n, v) < 0 && !mlirValueEqual(v, n->r) &&
          !tl_is_body_result(n, n->n_ops, v) && !tl_outside(v, entry))
        return false;
    }
    // A read of the output buffer would see partial results.
    if (tl_is(op, "memref.load") &&
        mlirValueEqual(tl_base(mlirOperationGetOperand(op, 0)), out_base))
      return false;
    n->ops[n->n_ops++] = op;
  }
  if (!tl_is_body_result(n, n->n_ops, n->x)) return false;
  for (int i = 0; i < n->n_ops; i++)
    for (intptr_t k = 0; k < mlirOperationGetNumResults(n->ops[i]); k++)
      if (mlirValueEqual(mlirOperationGetResult(n->ops[i], k), n->x) && tl_uses(n->x) != 1)
        return false;
  return true;
}

// Row reductions: every load that uses %r uses it only as its last index, with
// no computed index; the combine's operands have one type.
static bool tl_is_row(const tl_nest *n) {
  if (n->red < 32) return false;  // a workgroup per row of fewer elements idles
  if (!mlirTypeEqual(mlirValueGetType(n->x),
                     mlirValueGetType(mlirOperationGetResult(n->acc_load, 0))))
    return false;
  bool uses_r = false;
  for (int i = 0; i < n->n_ops; i++) {
    MlirOperation op = n->ops[i];
    if (!tl_is(op, "memref.load")) {
      for (intptr_t k = 0; k < mlirOperationGetNumOperands(op); k++)
        if (mlirValueEqual(mlirOperationGetOperand(op, k), n->r)) return false;
      continue;
    }
    intptr_t no = mlirOperationGetNumOperands(op);
    for (intptr_t k = 1; k < no; k++) {
      MlirValue v = mlirOperationGetOperand(op, k);
      if (mlirValueEqual(v, n->r)) {
        if (k != no - 1) return false;
        uses_r = true;
      } else if (tl_is_body_result(n, n->n_ops, v)) {
        return false;
      }
    }
  }
  return uses_r;
}

// Bit d set: the load's indices use parallel index d; bit 30: %r. -1 for an index
// computed in the body.
static int tl_load_mask(const tl_nest *n, MlirOperation load) {
  int mask = 0;
  for (intptr_t k = 1; k < mlirOperationGetNumOperands(load); k++) {
    MlirValue v = mlirOperationGetOperand(load, k);
    int d = tl_iv_index(n, v);
    if (d >= 0)
      mask |= 1 << d;
    else if (mlirValueEqual(v, n->r))
      mask |= 1 << 30;
    else if (tl_is_body_result(n, n->n_ops, v))
      return -1;
  }
  return mask;
}

// Contractions: see the module comment. Fills n->la / n->lb.
static bool tl_is_mm(tl_nest *n) {
  if (n->rank < 2) return false;
  int bi = 1 << (n->rank - 2), bj = 1 << (n->rank - 1), br = 1 << 30;
  for (int i = 0; i < n->n_ops; i++) {
    MlirOperation op = n->ops[i];
    if (!tl_is(op, "memref.load")) {
      // The product must not index anything itself: it is computed from the two
      // staged values only.
      for (intptr_t k = 0; k < mlirOperationGetNumOperands(op); k++) {
        MlirValue v = mlirOperationGetOperand(op, k);
        if (tl_iv_index(n, v) >= 0 || mlirValueEqual(v, n->r)) return false;
      }
      continue;
    }
    int m = tl_load_mask(n, op);
    if (m < 0 || !(m & br)) return false;  // a load that does not walk k
    if ((m & bi) && !(m & bj) && mlirOperationIsNull(n->la))
      n->la = op;
    else if ((m & bj) && !(m & bi) && mlirOperationIsNull(n->lb))
      n->lb = op;
    else
      return false;
  }
  if (mlirOperationIsNull(n->la) || mlirOperationIsNull(n->lb)) return false;
  // The accumulator is indexed by both i and j (one output per (i, j)).
  int acc = tl_load_mask(n, n->acc_load);
  return acc > 0 && (acc & bi) && (acc & bj);
}

//===--- Placeholders ----------------------------------------------------===//
//
// The generated text uses unregistered ops `"jit.<what>"(operands)`; each is replaced
// by clones of original ops, with `from[i]` remapped to `to[i]`.

typedef struct tl_map {
  MlirValue from[kMaxBody * 2 + JIT_MAX_RANK + 4];
  MlirValue to[kMaxBody * 2 + JIT_MAX_RANK + 4];
  int n;
} tl_map;

static void tl_map_add(tl_map *m, MlirValue from, MlirValue to) {
  if (m->n < (int)(sizeof m->from / sizeof m->from[0])) {
    m->from[m->n] = from;
    m->to[m->n] = to;
    m->n++;
  }
}

static MlirValue tl_map_get(const tl_map *m, MlirValue v) {
  for (int i = m->n - 1; i >= 0; i--)
    if (mlirValueEqual(m->from[i], v)) return m->to[i];
  return (MlirValue){NULL};
}

// Clones ops[0..n) before `ph` with `m` applied (and extended by each clone's
// results), then replaces `ph`'s result (if any) by the clone of `result` and erases
// `ph`.
static void tl_expand(MlirOperation ph, MlirOperation const *ops, int n, tl_map *m,
                      MlirValue result) {
  MlirBlock block = mlirOperationGetBlock(ph);
  for (int i = 0; i < n; i++) {
    MlirOperation c = mlirOperationClone(ops[i]);
    for (intptr_t k = 0; k < mlirOperationGetNumOperands(c); k++) {
      MlirValue to = tl_map_get(m, mlirOperationGetOperand(c, k));
      if (!mlirValueIsNull(to)) mlirOperationSetOperand(c, k, to);
    }
    mlirBlockInsertOwnedOperationBefore(block, ph, c);
    for (intptr_t k = 0; k < mlirOperationGetNumResults(ops[i]); k++)
      tl_map_add(m, mlirOperationGetResult(ops[i], k), mlirOperationGetResult(c, k));
  }
  if (mlirOperationGetNumResults(ph) == 1)
    mlirValueReplaceAllUsesOfWith(mlirOperationGetResult(ph, 0), tl_map_get(m, result));
  mlirOperationDestroy(ph);
}

typedef struct tl_phs {
  MlirOperation *v;
  int n, cap;
  bool oom;
} tl_phs;

static MlirWalkResult tl_collect_cb(MlirOperation op, void *user) {
  tl_phs *p = user;
  if (!tl_prefix(op, "jit.")) return MlirWalkResultAdvance;
  if (p->n == p->cap) {
    int cap = p->cap ? p->cap * 2 : 64;
    MlirOperation *v = realloc(p->v, (size_t)cap * sizeof *v);
    if (!v) {
      p->oom = true;
      return MlirWalkResultInterrupt;
    }
    p->v = v;
    p->cap = cap;
  }
  p->v[p->n++] = op;
  return MlirWalkResultAdvance;
}

// Replaces every placeholder under `root` (see the text generators for operands).
static jit_status tl_expand_all(MlirOperation root, tl_nest *n) {
  tl_phs p = {NULL, 0, 0, false};
  mlirOperationWalk(root, tl_collect_cb, &p, MlirWalkPreOrder);
  if (p.oom) {
    free(p.v);
    return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
  }
  // x ops of a contraction: the body minus its two staged loads.
  MlirOperation xops[kMaxBody];
  int n_x = 0;
  for (int i = 0; i < n->n_ops; i++)
    if (!mlirOperationEqual(n->ops[i], n->la) && !mlirOperationEqual(n->ops[i], n->lb))
      xops[n_x++] = n->ops[i];
  MlirValue acc = mlirOperationGetResult(n->acc_load, 0);
  MlirValue comb = mlirOperationGetResult(n->comb, 0);
  for (int i = 0; i < p.n; i++) {
    MlirOperation ph = p.v[i];
    MlirStringRef name = mlirIdentifierStr(mlirOperationGetName(ph));
    char what[32] = {0};
    memcpy(what, name.data, name.length < 31 ? name.length : 31);
    tl_map m = {.n = 0};
    // Index operands (ivs..., r) come first for the ops that take them.
    if (!strcmp(what, "jit.acc")) {
      for (int d = 0; d < n->rank; d++) tl_map_add(&m, n->iv[d], mlirOperationGetOperand(ph, d));
      tl_expand(ph, &n->acc_load, 1, &m, acc);
    } else if (!strcmp(what, "jit.st")) {
      tl_map_add(&m, comb, mlirOperationGetOperand(ph, 0));
      for (int d = 0; d < n->rank; d++)
        tl_map_add(&m, n->iv[d], mlirOperationGetOperand(ph, 1 + d));
      tl_expand(ph, &n->store, 1, &m, (MlirValue){NULL});
    } else if (!strcmp(what, "jit.comb")) {
      tl_map_add(&m, acc, mlirOperationGetOperand(ph, 0));
      tl_map_add(&m, n->x, mlirOperationGetOperand(ph, 1));
      tl_expand(ph, &n->comb, 1, &m, comb);
    } else if (!strcmp(what, "jit.lda") || !strcmp(what, "jit.ldb")) {
      for (int d = 0; d < n->rank; d++) tl_map_add(&m, n->iv[d], mlirOperationGetOperand(ph, d));
      tl_map_add(&m, n->r, mlirOperationGetOperand(ph, n->rank));
      MlirOperation ld = what[6] == 'a' ? n->la : n->lb;
      tl_expand(ph, &ld, 1, &m, mlirOperationGetResult(ld, 0));
    } else if (!strcmp(what, "jit.mmx")) {
      tl_map_add(&m, mlirOperationGetResult(n->la, 0), mlirOperationGetOperand(ph, 0));
      tl_map_add(&m, mlirOperationGetResult(n->lb, 0), mlirOperationGetOperand(ph, 1));
      tl_expand(ph, xops, n_x, &m, n->x);
    } else if (!strcmp(what, "jit.rowx")) {
      for (int d = 0; d < n->rank; d++) tl_map_add(&m, n->iv[d], mlirOperationGetOperand(ph, d));
      tl_map_add(&m, n->r, mlirOperationGetOperand(ph, n->rank));
      tl_expand(ph, n->ops, n->n_ops, &m, n->x);
    } else {
      free(p.v);
      return JIT_ERR(JIT_INTERNAL, "unknown placeholder `%s`", what);
    }
  }
  free(p.v);
  return NULL;
}

//===--- Kernel text -----------------------------------------------------===//

// SSA names are made unique by a counter; constants are emitted where used and
// folded by the canonicalizer that runs after outlining. Names are short ("%v123",
// "%bx", "%v9#3"): kName bytes hold any of them.
enum { kName = 32 };

static void tl_cpy(char *dst, const char *src) {
  size_t n = strlen(src);
  if (n > kName - 1) n = kName - 1;
  memmove(dst, src, n);
  dst[n] = 0;
}

// "<base>#<i>": result i of a multi-result op.
static void tl_res(char *dst, const char *base, int i) {
  if (snprintf(dst, kName, "%s#%d", base, i) >= kName) dst[0] = 0;
}
typedef struct tl_gen {
  jit__text s;
  int id;
} tl_gen;

// A fresh name "%v<id>" into buf[kName].
static const char *tl_fresh(tl_gen *g, char *buf) {
  snprintf(buf, kName, "%%v%d", g->id++);
  return buf;
}

// An index constant, emitted now; its name into buf[kName].
static const char *tl_c(tl_gen *g, int64_t v, char *buf) {
  tl_fresh(g, buf);
  jit__text_printf(&g->s, "    %s = arith.constant %lld : index\n", buf, (long long)v);
  return buf;
}

// `%res = arith.<op> %a, %b : index` with %b an index constant.
static const char *tl_binc(tl_gen *g, const char *op, const char *a, int64_t b, char *buf) {
  char cb[kName];
  tl_c(g, b, cb);
  tl_fresh(g, buf);
  jit__text_printf(&g->s, "    %s = arith.%s %s, %s : index\n", buf, op, a, cb);
  return buf;
}

static const char *tl_bin(tl_gen *g, const char *op, const char *a, const char *b, char *buf) {
  tl_fresh(g, buf);
  jit__text_printf(&g->s, "    %s = arith.%s %s, %s : index\n", buf, op, a, b);
  return buf;
}

// `%res = arith.cmpi ult, %a, <c>`.
static const char *tl_ltc(tl_gen *g, const char *a, int64_t c, char *buf) {
  char cb[kName];
  tl_c(g, c, cb);
  tl_fresh(g, buf);
  jit__text_printf(&g->s, "    %s = arith.cmpi ult, %s, %s : index\n", buf, a, cb);
  return buf;
}

// The ivs of the nest from a linear index `lin` over ub[0..rank): names into iv[d].
static void tl_delinearize(tl_gen *g, const tl_nest *n, int first, int count,
                           const char *lin, char (*iv)[kName]) {
  char q[kName];
  snprintf(q, sizeof q, "%s", lin);
  for (int d = first + count - 1; d >= first; d--) {
    if (d == first) {
      tl_cpy(iv[d], q);
      break;
    }
    tl_binc(g, "remui", q, n->ub[d], iv[d]);
    char nq[kName];
    tl_binc(g, "divui", q, n->ub[d], nq);
    snprintf(q, sizeof q, "%s", nq);
  }
}

static void tl_launch_open(tl_gen *g, const uint32_t grid[3], const uint32_t block[3],
                           const char *workgroup) {
  char c[6][kName];
  for (int i = 0; i < 3; i++) tl_c(g, grid[i], c[i]);
  for (int i = 0; i < 3; i++) tl_c(g, block[i], c[3 + i]);
  jit__text_printf(&g->s,
            "    gpu.launch blocks(%%bx, %%by, %%bz) in (%%gx = %s, %%gy = %s, %%gz = %s) "
            "threads(%%tx, %%ty, %%tz) in (%%sx = %s, %%sy = %s, %%sz = %s) "
            "workgroup(%s) {\n",
            c[0], c[1], c[2], c[3], c[4], c[5], workgroup);
}

// The operand list "%a, %b, ..." and its type list "index, index, ..." for a
// placeholder taking the nest's ivs (and optionally one more index).
static void tl_iv_args(const tl_nest *n, char (*iv)[kName], const char *extra, char *ops,
                       char *types, size_t size) {
  size_t o = 0, t = 0;
  ops[0] = types[0] = 0;
  for (int d = 0; d < n->rank; d++) {
    o += (size_t)snprintf(ops + o, size - o, "%s%s", d ? ", " : "", iv[d]);
    t += (size_t)snprintf(types + t, size - t, "%sindex", d ? ", " : "");
  }
  if (extra) {
    snprintf(ops + o, size - o, ", %s", extra);
    snprintf(types + t, size - t, ", index");
  }
}

//===--- Matmul ----------------------------------------------------------===//

enum { kTK = 16, kThreads = 16 };  // K tile; threads per tile side (16 x 16)

typedef struct tl_mm {
  int64_t M, N, K, batch;
  int rm, rn;  // outputs per thread along i and j
  int64_t bm, bn;
  uint32_t grid[3];
  char ta[64], tb[64], tc[64], tx[64];  // staged A / B, accumulator, product types
} tl_mm;

static bool tl_mm_plan(const tl_nest *n, tl_mm *p) {
  p->M = n->ub[n->rank - 2];
  p->N = n->ub[n->rank - 1];
  p->K = n->red;
  p->batch = 1;
  for (int d = 0; d < n->rank - 2; d++) p->batch *= n->ub[d];
  // More outputs per thread when the matrix is large enough: each staged value is
  // then reused rm (rn) times from registers.
  p->rm = p->M >= 64 ? 4 : p->M >= 32 ? 2 : 1;
  p->rn = p->N >= 64 ? 4 : p->N >= 32 ? 2 : 1;
  p->bm = (int64_t)kThreads * p->rm;
  p->bn = (int64_t)kThreads * p->rn;
  int64_t gx = (p->N + p->bn - 1) / p->bn, gy = (p->M + p->bm - 1) / p->bm;
  if (gx > 65535 || gy > 65535 || p->batch > 65535) return false;
  p->grid[0] = (uint32_t)gx;
  p->grid[1] = (uint32_t)gy;
  p->grid[2] = (uint32_t)p->batch;
  tl_type_str(mlirValueGetType(mlirOperationGetResult(n->la, 0)), p->ta);
  tl_type_str(mlirValueGetType(mlirOperationGetResult(n->lb, 0)), p->tb);
  tl_type_str(mlirValueGetType(mlirOperationGetResult(n->acc_load, 0)), p->tc);
  tl_type_str(mlirValueGetType(n->x), p->tx);
  return true;
}

// A zero of float type `t`, emitted now.
static const char *tl_zero(tl_gen *g, const char *t, char *buf) {
  tl_fresh(g, buf);
  jit__text_printf(&g->s, "    %s = arith.constant 0.0 : %s\n", buf, t);
  return buf;
}

// Stages one K tile [kbase, kbase + kcount) of A (rows row0..) and B (columns col0..)
// into %sA / %sB. Thread `tid` moves elements tid, tid + 256, ... so that consecutive
// threads read consecutive addresses of each row of A and of B.
static void tl_mm_stage_at(tl_gen *g, const tl_nest *n, const tl_mm *p, char (*biv)[kName],
                           const char *tid, const char *row0, const char *col0,
                           const char *kbase, int64_t kcount) {
  int64_t threads = (int64_t)kThreads * kThreads;
  for (int side = 0; side < 2; side++) {
    bool a = side == 0;
    int64_t elems = a ? p->bm * kTK : kTK * p->bn, width = a ? kTK : p->bn;
    const char *ty = a ? p->ta : p->tb;
    for (int64_t q = 0; q * threads < elems; q++) {
      char e[kName], major[kName], minor[kName], gmn[kName], gk[kName], cond[kName] = {0};
      tl_binc(g, "addi", tid, q * threads, e);
      tl_binc(g, "divui", e, width, major);
      tl_binc(g, "remui", e, width, minor);
      // A: major = row in tile, minor = k; B: major = k, minor = column in tile.
      const char *mn = a ? major : minor, *kk = a ? minor : major;
      tl_bin(g, "addi", a ? row0 : col0, mn, gmn);
      tl_bin(g, "addi", kk, kbase, gk);
      int64_t lim = a ? p->M : p->N;
      bool guard_mn = lim % (a ? p->bm : p->bn) != 0, guard_k = kcount < kTK;
      if (guard_mn) tl_ltc(g, gmn, lim, cond);
      if (guard_k) {
        char ck[kName];
        tl_ltc(g, kk, kcount, ck);
        if (cond[0]) {
          char both[kName];
          tl_fresh(g, both);
          jit__text_printf(&g->s, "    %s = arith.andi %s, %s : i1\n", both, cond, ck);
          snprintf(cond, sizeof cond, "%s", both);
        } else {
          snprintf(cond, sizeof cond, "%s", ck);
        }
      }
      char iv[JIT_MAX_RANK][kName], zero[kName], ops[512], types[512], v[kName];
      for (int d = 0; d < n->rank - 2; d++) tl_cpy(iv[d], biv[d]);
      tl_c(g, 0, zero);
      tl_cpy(iv[n->rank - 2], a ? gmn : zero);
      tl_cpy(iv[n->rank - 1], a ? zero : gmn);
      tl_iv_args(n, iv, gk, ops, types, sizeof ops);
      tl_fresh(g, v);
      if (cond[0]) {
        jit__text_printf(&g->s, "    %s = scf.if %s -> (%s) {\n", v, cond, ty);
        char l[kName];
        tl_fresh(g, l);
        jit__text_printf(&g->s, "    %s = \"jit.ld%c\"(%s) : (%s) -> %s\n", l, a ? 'a' : 'b', ops,
                  types, ty);
        jit__text_printf(&g->s, "    scf.yield %s : %s\n    } else {\n", l, ty);
        char z[kName];
        tl_zero(g, ty, z);
        jit__text_printf(&g->s, "    scf.yield %s : %s\n    }\n", z, ty);
      } else {
        jit__text_printf(&g->s, "    %s = \"jit.ld%c\"(%s) : (%s) -> %s\n", v, a ? 'a' : 'b', ops,
                  types, ty);
      }
      jit__text_printf(&g->s, "    memref.store %s, %s[%s, %s] : memref<%lldx%lldx%s, 3>\n", v,
                a ? "%sA" : "%sB", major, minor, (long long)(a ? p->bm : kTK),
                (long long)(a ? kTK : p->bn), ty);
    }
  }
}

// One K tile of products: `acc` (rm*rn names) in, the loop's results out as
// "<res>#<i>". Returns the result's base name in res[kName].
static void tl_mm_compute(tl_gen *g, const tl_mm *p, char (*acc)[kName], const char *tyr,
                          const char *txc, int64_t count, char *res) {
  int na = p->rm * p->rn;
  char lo[kName], hi[kName], one[kName], kk[kName];
  tl_c(g, 0, lo);
  tl_c(g, count, hi);
  tl_c(g, 1, one);
  tl_fresh(g, res);
  tl_fresh(g, kk);
  jit__text_printf(&g->s, "    %s:%d = scf.for %s = %s to %s step %s iter_args(", res, na, kk, lo,
            hi, one);
  char it[16][kName];
  for (int i = 0; i < na; i++) {
    tl_fresh(g, it[i]);
    jit__text_printf(&g->s, "%s%s = %s", i ? ", " : "", it[i], acc[i]);
  }
  jit__text_printf(&g->s, ") -> (");
  for (int i = 0; i < na; i++) jit__text_printf(&g->s, "%s%s", i ? ", " : "", p->tc);
  jit__text_printf(&g->s, ") {\n");
  char av[4][kName], bv[4][kName];
  for (int r = 0; r < p->rm; r++) {
    char row[kName];
    tl_binc(g, "addi", tyr, (int64_t)r * kThreads, row);
    tl_fresh(g, av[r]);
    jit__text_printf(&g->s, "    %s = memref.load %%sA[%s, %s] : memref<%lldx%dx%s, 3>\n", av[r],
              row, kk, (long long)p->bm, kTK, p->ta);
  }
  for (int c = 0; c < p->rn; c++) {
    char col[kName];
    tl_binc(g, "addi", txc, (int64_t)c * kThreads, col);
    tl_fresh(g, bv[c]);
    jit__text_printf(&g->s, "    %s = memref.load %%sB[%s, %s] : memref<%dx%lldx%s, 3>\n", bv[c],
              kk, col, kTK, (long long)p->bn, p->tb);
  }
  char out[16][kName];
  for (int r = 0; r < p->rm; r++)
    for (int c = 0; c < p->rn; c++) {
      char x[kName];
      tl_fresh(g, x);
      jit__text_printf(&g->s, "    %s = \"jit.mmx\"(%s, %s) : (%s, %s) -> %s\n", x, av[r], bv[c],
                p->ta, p->tb, p->tx);
      int i = r * p->rn + c;
      tl_fresh(g, out[i]);
      jit__text_printf(&g->s, "    %s = \"jit.comb\"(%s, %s) : (%s, %s) -> %s\n", out[i], it[i], x,
                p->tc, p->tx, p->tc);
    }
  jit__text_printf(&g->s, "    scf.yield ");
  for (int i = 0; i < na; i++) jit__text_printf(&g->s, "%s%s", i ? ", " : "", out[i]);
  jit__text_printf(&g->s, " : ");
  for (int i = 0; i < na; i++) jit__text_printf(&g->s, "%s%s", i ? ", " : "", p->tc);
  jit__text_printf(&g->s, "\n    }\n");
}

static void tl_mm_text(tl_gen *g, const tl_nest *n, const tl_mm *p) {
  char wg[256];
  snprintf(wg, sizeof wg, "%%sA : memref<%lldx%dx%s, 3>, %%sB : memref<%dx%lldx%s, 3>",
           (long long)p->bm, kTK, p->ta, kTK, (long long)p->bn, p->tb);
  uint32_t block[3] = {kThreads, kThreads, 1};
  tl_launch_open(g, p->grid, block, wg);
  char biv[JIT_MAX_RANK][kName];
  if (n->rank > 2) tl_delinearize(g, n, 0, n->rank - 2, "%bz", biv);
  char row0[kName], col0[kName], tid[kName], t16[kName];
  tl_binc(g, "muli", "%by", p->bm, row0);
  tl_binc(g, "muli", "%bx", p->bn, col0);
  tl_binc(g, "muli", "%ty", kThreads, t16);
  tl_bin(g, "addi", t16, "%tx", tid);
  char tyr[kName], txc[kName];
  tl_bin(g, "addi", row0, "%ty", tyr);  // this thread's first row / column
  tl_bin(g, "addi", col0, "%tx", txc);
  bool gi = p->M % p->bm != 0, gj = p->N % p->bn != 0;
  // Accumulators start from the output's current value (the fill), as in the plain
  // loop, so the sum is formed in the same order.
  int na = p->rm * p->rn;
  char acc[16][kName], inb[16][kName], giv[4][kName], gjv[4][kName];
  for (int r = 0; r < p->rm; r++) tl_binc(g, "addi", tyr, (int64_t)r * kThreads, giv[r]);
  for (int c = 0; c < p->rn; c++) tl_binc(g, "addi", txc, (int64_t)c * kThreads, gjv[c]);
  for (int r = 0; r < p->rm; r++)
    for (int c = 0; c < p->rn; c++) {
      int i = r * p->rn + c;
      char ci[kName] = {0}, cj[kName] = {0};
      if (gi) tl_ltc(g, giv[r], p->M, ci);
      if (gj) tl_ltc(g, gjv[c], p->N, cj);
      inb[i][0] = 0;
      if (gi && gj) {
        tl_fresh(g, inb[i]);
        jit__text_printf(&g->s, "    %s = arith.andi %s, %s : i1\n", inb[i], ci, cj);
      } else if (gi || gj) {
        tl_cpy(inb[i], gi ? ci : cj);
      }
      char iv[JIT_MAX_RANK][kName], ops[512], types[512];
      for (int d = 0; d < n->rank - 2; d++) tl_cpy(iv[d], biv[d]);
      tl_cpy(iv[n->rank - 2], giv[r]);
      tl_cpy(iv[n->rank - 1], gjv[c]);
      tl_iv_args(n, iv, NULL, ops, types, sizeof ops);
      tl_fresh(g, acc[i]);
      if (inb[i][0]) {
        jit__text_printf(&g->s, "    %s = scf.if %s -> (%s) {\n", acc[i], inb[i], p->tc);
        char l[kName], z[kName];
        tl_fresh(g, l);
        jit__text_printf(&g->s, "    %s = \"jit.acc\"(%s) : (%s) -> %s\n    scf.yield %s : %s\n"
                  "    } else {\n", l, ops, types, p->tc, l, p->tc);
        tl_zero(g, p->tc, z);
        jit__text_printf(&g->s, "    scf.yield %s : %s\n    }\n", z, p->tc);
      } else {
        jit__text_printf(&g->s, "    %s = \"jit.acc\"(%s) : (%s) -> %s\n", acc[i], ops, types, p->tc);
      }
    }
  // Full K tiles, then the remainder as one shorter tile.
  int64_t kfull = p->K / kTK * kTK, krem = p->K - kfull;
  char cur[16][kName];
  for (int i = 0; i < na; i++) tl_cpy(cur[i], acc[i]);
  if (kfull) {
    char lo[kName], hi[kName], st[kName], kt[kName], res[kName], it[16][kName];
    tl_c(g, 0, lo);
    tl_c(g, kfull, hi);
    tl_c(g, kTK, st);
    tl_fresh(g, res);
    tl_fresh(g, kt);
    jit__text_printf(&g->s, "    %s:%d = scf.for %s = %s to %s step %s iter_args(", res, na, kt, lo,
              hi, st);
    for (int i = 0; i < na; i++) {
      tl_fresh(g, it[i]);
      jit__text_printf(&g->s, "%s%s = %s", i ? ", " : "", it[i], cur[i]);
    }
    jit__text_printf(&g->s, ") -> (");
    for (int i = 0; i < na; i++) jit__text_printf(&g->s, "%s%s", i ? ", " : "", p->tc);
    jit__text_printf(&g->s, ") {\n");
    tl_mm_stage_at(g, n, p, biv, tid, row0, col0, kt, kTK);
    jit__text_printf(&g->s, "    gpu.barrier\n");
    char inner[kName];
    tl_mm_compute(g, p, it, "%ty", "%tx", kTK, inner);
    jit__text_printf(&g->s, "    gpu.barrier\n    scf.yield ");
    for (int i = 0; i < na; i++) jit__text_printf(&g->s, "%s%s#%d", i ? ", " : "", inner, i);
    jit__text_printf(&g->s, " : ");
    for (int i = 0; i < na; i++) jit__text_printf(&g->s, "%s%s", i ? ", " : "", p->tc);
    jit__text_printf(&g->s, "\n    }\n");
    for (int i = 0; i < na; i++) tl_res(cur[i], res, i);
  }
  if (krem) {
    char kb[kName];
    tl_c(g, kfull, kb);
    tl_mm_stage_at(g, n, p, biv, tid, row0, col0, kb, krem);
    jit__text_printf(&g->s, "    gpu.barrier\n");
    char inner[kName];
    tl_mm_compute(g, p, cur, "%ty", "%tx", krem, inner);
    for (int i = 0; i < na; i++) tl_res(cur[i], inner, i);
  }
  for (int r = 0; r < p->rm; r++)
    for (int c = 0; c < p->rn; c++) {
      int i = r * p->rn + c;
      char iv[JIT_MAX_RANK][kName], ops[512], types[512];
      for (int d = 0; d < n->rank - 2; d++) tl_cpy(iv[d], biv[d]);
      tl_cpy(iv[n->rank - 2], giv[r]);
      tl_cpy(iv[n->rank - 1], gjv[c]);
      tl_iv_args(n, iv, NULL, ops, types, sizeof ops);
      if (inb[i][0]) jit__text_printf(&g->s, "    scf.if %s {\n", inb[i]);
      jit__text_printf(&g->s, "    \"jit.st\"(%s, %s) : (%s, %s) -> ()\n", cur[i], ops, p->tc, types);
      if (inb[i][0]) jit__text_printf(&g->s, "    }\n");
    }
  jit__text_printf(&g->s, "    gpu.terminator\n    }\n");
}

//===--- Row reductions --------------------------------------------------===//

typedef struct tl_row {
  int64_t rows, len;
  uint32_t threads;  // a power of two <= len: every thread has at least one element
  uint32_t grid[3];
  char tc[64];
} tl_row;

static bool tl_row_plan(const tl_nest *n, tl_row *p) {
  p->len = n->red;
  p->rows = 1;
  for (int d = 0; d < n->rank; d++) p->rows *= n->ub[d];
  // Up to 256 threads for a few long rows; 64 when there are many rows: the rows
  // alone fill the device, and each halving of the workgroup saves a barrier round
  // (on lavapipe, 512 rows of 1024: 64 threads ~1.05x the plain kernel, 256 ~0.8x).
  uint32_t cap = p->rows >= 128 ? 64 : 256;
  p->threads = 32;
  while (p->threads < cap && (int64_t)p->threads * 2 <= p->len) p->threads *= 2;
  int64_t gx = p->rows < 65535 ? p->rows : 65535, gy = (p->rows + gx - 1) / gx;
  if (gy > 65535) return false;
  p->grid[0] = (uint32_t)gx;
  p->grid[1] = (uint32_t)gy;
  p->grid[2] = 1;
  tl_type_str(mlirValueGetType(mlirOperationGetResult(n->acc_load, 0)), p->tc);
  return true;
}

static void tl_row_text(tl_gen *g, const tl_nest *n, const tl_row *p) {
  char wg[128];
  snprintf(wg, sizeof wg, "%%sh : memref<%ux%s, 3>", p->threads, p->tc);
  uint32_t block[3] = {p->threads, 1, 1};
  tl_launch_open(g, p->grid, block, wg);
  char row[kName];
  bool guard = (int64_t)p->grid[0] * p->grid[1] != p->rows;
  if (p->grid[1] > 1) {
    char t[kName];
    tl_binc(g, "muli", "%by", p->grid[0], t);
    tl_bin(g, "addi", t, "%bx", row);
  } else {
    snprintf(row, sizeof row, "%%bx");
  }
  if (guard) {
    // Uniform per workgroup, so the barriers inside stay legal.
    char ok[kName];
    tl_ltc(g, row, p->rows, ok);
    jit__text_printf(&g->s, "    scf.if %s {\n", ok);
  }
  char iv[JIT_MAX_RANK][kName], ops[512], types[512];
  tl_delinearize(g, n, 0, n->rank, row, iv);
  // Thread t reduces elements t, t + T, ... of the row, starting from its first one
  // (no identity value is needed, so any combine op works). The loop has the same
  // trip count in every thread and at least one trip, and the last, partial round is
  // an scf.if: MLIR's SCF-to-SPIR-V lowering leaves an scf.for's results undefined
  // when the loop runs zero times.
  int64_t full = p->len / p->threads, rest = p->len % p->threads;
  char part[kName], x0[kName];
  tl_iv_args(n, iv, "%tx", ops, types, sizeof ops);
  tl_fresh(g, x0);
  jit__text_printf(&g->s, "    %s = \"jit.rowx\"(%s) : (%s) -> %s\n", x0, ops, types, p->tc);
  snprintf(part, sizeof part, "%s", x0);
  if (full > 1) {
    char start[kName], end[kName], st[kName], r[kName], a[kName], x[kName], y[kName], res[kName];
    tl_binc(g, "addi", "%tx", p->threads, start);
    tl_binc(g, "addi", "%tx", full * p->threads, end);
    tl_c(g, p->threads, st);
    tl_fresh(g, res);
    tl_fresh(g, r);
    tl_fresh(g, a);
    jit__text_printf(&g->s, "    %s = scf.for %s = %s to %s step %s iter_args(%s = %s) -> (%s) {\n",
              res, r, start, end, st, a, part, p->tc);
    tl_iv_args(n, iv, r, ops, types, sizeof ops);
    tl_fresh(g, x);
    jit__text_printf(&g->s, "    %s = \"jit.rowx\"(%s) : (%s) -> %s\n", x, ops, types, p->tc);
    tl_fresh(g, y);
    jit__text_printf(&g->s,
              "    %s = \"jit.comb\"(%s, %s) : (%s, %s) -> %s\n    scf.yield %s : %s\n    }\n",
              y, a, x, p->tc, p->tc, p->tc, y, p->tc);
    snprintf(part, sizeof part, "%s", res);
  }
  if (rest) {
    char lt[kName], r[kName], x[kName], y[kName], res[kName];
    tl_ltc(g, "%tx", rest, lt);
    tl_fresh(g, res);
    jit__text_printf(&g->s, "    %s = scf.if %s -> (%s) {\n", res, lt, p->tc);
    tl_binc(g, "addi", "%tx", full * p->threads, r);
    tl_iv_args(n, iv, r, ops, types, sizeof ops);
    tl_fresh(g, x);
    jit__text_printf(&g->s, "    %s = \"jit.rowx\"(%s) : (%s) -> %s\n", x, ops, types, p->tc);
    tl_fresh(g, y);
    jit__text_printf(&g->s,
              "    %s = \"jit.comb\"(%s, %s) : (%s, %s) -> %s\n    scf.yield %s : %s\n"
              "    } else {\n    scf.yield %s : %s\n    }\n",
              y, part, x, p->tc, p->tc, p->tc, y, p->tc, part, p->tc);
    snprintf(part, sizeof part, "%s", res);
  }
  jit__text_printf(&g->s, "    memref.store %s, %%sh[%%tx] : memref<%ux%s, 3>\n    gpu.barrier\n", part,
            p->threads, p->tc);
  // Tree: after the step with stride s, sh[0..s) hold the partials.
  for (uint32_t s = p->threads / 2; s >= 1; s /= 2) {
    char lt[kName], other[kName], u[kName], v[kName], w[kName];
    tl_ltc(g, "%tx", s, lt);
    jit__text_printf(&g->s, "    scf.if %s {\n", lt);
    tl_binc(g, "addi", "%tx", s, other);
    tl_fresh(g, u);
    tl_fresh(g, v);
    tl_fresh(g, w);
    jit__text_printf(&g->s,
              "    %s = memref.load %%sh[%%tx] : memref<%ux%s, 3>\n"
              "    %s = memref.load %%sh[%s] : memref<%ux%s, 3>\n"
              "    %s = \"jit.comb\"(%s, %s) : (%s, %s) -> %s\n"
              "    memref.store %s, %%sh[%%tx] : memref<%ux%s, 3>\n    }\n",
              u, p->threads, p->tc, v, other, p->threads, p->tc, w, u, v, p->tc, p->tc, p->tc,
              w, p->threads, p->tc);
    // Thread 0 reads what it wrote itself after the last step: no barrier needed.
    if (s > 1) jit__text_printf(&g->s, "    gpu.barrier\n");
  }
  char is0[kName], z[kName], tot[kName], acc[kName], fin[kName];
  tl_c(g, 0, z);
  tl_fresh(g, is0);
  jit__text_printf(&g->s, "    %s = arith.cmpi eq, %%tx, %s : index\n    scf.if %s {\n", is0, z, is0);
  tl_fresh(g, tot);
  jit__text_printf(&g->s, "    %s = memref.load %%sh[%s] : memref<%ux%s, 3>\n", tot, z, p->threads,
            p->tc);
  tl_iv_args(n, iv, NULL, ops, types, sizeof ops);
  tl_fresh(g, acc);
  tl_fresh(g, fin);
  jit__text_printf(&g->s,
            "    %s = \"jit.acc\"(%s) : (%s) -> %s\n"
            "    %s = \"jit.comb\"(%s, %s) : (%s, %s) -> %s\n"
            "    \"jit.st\"(%s, %s) : (%s, %s) -> ()\n    }\n",
            acc, ops, types, p->tc, fin, acc, tot, p->tc, p->tc, p->tc, fin, ops, p->tc, types);
  if (guard) jit__text_printf(&g->s, "    }\n");
  jit__text_printf(&g->s, "    gpu.terminator\n    }\n");
}

//===--- Entry points ----------------------------------------------------===//

jit_status jit__gpu_try_tiled(MlirContext ctx, MlirOperation kf, const char *diag,
                              jit__tiled_kind *out_kind) {
  *out_kind = JIT__TILED_NONE;
  tl_nest n;
  if (!tl_match(kf, &n)) return NULL;
  jit__tiled_kind kind = JIT__TILED_NONE;
  tl_mm mm;
  tl_row row;
  if (tl_is_mm(&n) && tl_mm_plan(&n, &mm))
    kind = JIT__TILED_MM;
  else if (tl_is_row(&n) && tl_row_plan(&n, &row))
    kind = JIT__TILED_ROW;
  if (kind == JIT__TILED_NONE) return NULL;

  tl_gen g = {{NULL, 0, 0, false}, 0};
  jit__text_printf(&g.s, "func.func @jit_tiled() {\n");
  if (kind == JIT__TILED_MM)
    tl_mm_text(&g, &n, &mm);
  else
    tl_row_text(&g, &n, &row);
  jit__text_printf(&g.s, "    return\n}\n");
  if (g.s.oom) {
    free(g.s.p);
    return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
  }
  // Placeholders are unregistered ops: allowed only while the text is parsed.
  mlirContextSetAllowUnregisteredDialects(ctx, true);
  MlirModule m = mlirModuleCreateParse(ctx, mlirStringRefCreate(g.s.p, g.s.len));
  mlirContextSetAllowUnregisteredDialects(ctx, false);
  if (mlirModuleIsNull(m)) {
    jit_status s = JIT_ERR(JIT_INTERNAL, "tiled %s kernel does not parse: %s\n%s",
                           kind == JIT__TILED_MM ? "matmul" : "row", diag, g.s.p);
    free(g.s.p);
    return s;
  }
  free(g.s.p);
  MlirOperation tf = mlirBlockGetFirstOperation(mlirModuleGetBody(m));
  MlirBlock tb = mlirRegionGetFirstBlock(mlirOperationGetRegion(tf, 0));
  MlirOperation launch = {NULL};
  for (MlirOperation op = mlirBlockGetFirstOperation(tb), next; !mlirOperationIsNull(op);
       op = next) {
    next = mlirOperationGetNextInBlock(op);
    if (tl_is(op, "func.return")) break;
    if (tl_is(op, "gpu.launch")) launch = op;
    mlirOperationMoveBefore(op, n.par);
  }
  mlirModuleDestroy(m);
  jit_status s = tl_expand_all(launch, &n);
  if (s) return s;
  mlirOperationDestroy(n.par);

  MlirStringRef name = mlirStringAttrGetValue(
      mlirOperationGetAttributeByName(kf, tl_sr("sym_name")));
  char buf[128];
  snprintf(buf, sizeof buf, "%.*s%s", (int)name.length, name.data,
           kind == JIT__TILED_MM ? "_mm" : "_row");
  mlirOperationSetAttributeByName(kf, tl_sr("sym_name"), mlirStringAttrGet(ctx, tl_sr(buf)));
  *out_kind = kind;
  return NULL;
}

void jit__gpu_attributions_to_allocs(MlirContext ctx, MlirOperation gpu_module) {
  MlirBlock gb = mlirRegionGetFirstBlock(mlirOperationGetRegion(gpu_module, 0));
  for (MlirOperation f = mlirBlockGetFirstOperation(gb); !mlirOperationIsNull(f);
       f = mlirOperationGetNextInBlock(f)) {
    if (!tl_is(f, "gpu.func")) continue;
    MlirAttribute na = mlirOperationGetAttributeByName(f, tl_sr("workgroup_attributions"));
    if (mlirAttributeIsNull(na) || !mlirAttributeIsAInteger(na)) continue;
    int64_t count = mlirIntegerAttrGetValueInt(na);
    if (count <= 0) continue;
    MlirAttribute ft = mlirOperationGetAttributeByName(f, tl_sr("function_type"));
    intptr_t n_in = mlirFunctionTypeGetNumInputs(mlirTypeAttrGetValue(ft));
    MlirBlock entry = mlirRegionGetFirstBlock(mlirOperationGetRegion(f, 0));
    MlirOperation first = mlirBlockGetFirstOperation(entry);
    for (int64_t i = count - 1; i >= 0; i--) {
      MlirValue arg = mlirBlockGetArgument(entry, n_in + i);
      MlirType t = mlirValueGetType(arg);
      MlirOperationState st = mlirOperationStateGet(tl_sr("memref.alloc"),
                                                    mlirLocationUnknownGet(ctx));
      int32_t seg[2] = {0, 0};
      MlirNamedAttribute a = mlirNamedAttributeGet(
          mlirIdentifierGet(ctx, tl_sr("operandSegmentSizes")), mlirDenseI32ArrayGet(ctx, 2, seg));
      mlirOperationStateAddAttributes(&st, 1, &a);
      mlirOperationStateAddResults(&st, 1, &t);
      MlirOperation alloc = mlirOperationCreate(&st);
      mlirBlockInsertOwnedOperationBefore(entry, first, alloc);
      first = alloc;
      mlirValueReplaceAllUsesOfWith(arg, mlirOperationGetResult(alloc, 0));
      mlirBlockEraseArgument(entry, (unsigned)(n_in + i));
    }
    mlirOperationSetAttributeByName(
        f, tl_sr("workgroup_attributions"),
        mlirIntegerAttrGet(mlirIntegerTypeGet(ctx, 64), 0));
  }
}

//===--- Accumulators in registers for the plain mapping -----------------===//

bool jit__gpu_acc_in_register(MlirContext ctx, MlirOperation kf) {
  tl_nest n;
  if (!tl_match(kf, &n)) return false;
  MlirLocation loc = mlirOperationGetLocation(n.fr);
  MlirBlock pb = mlirOperationGetBlock(n.fr);
  // The initial value, read once before the loop.
  MlirOperation init = mlirOperationClone(n.acc_load);
  mlirBlockInsertOwnedOperationBefore(pb, n.fr, init);
  MlirType tc = mlirValueGetType(mlirOperationGetResult(n.acc_load, 0));
  MlirType idx = mlirIndexTypeGet(ctx);
  MlirType bt[2] = {idx, tc};
  MlirLocation bl[2] = {loc, loc};
  MlirBlock body = mlirBlockCreate(2, bt, bl);
  MlirRegion region = mlirRegionCreate();
  mlirRegionAppendOwnedBlock(region, body);
  MlirValue opnds[4] = {mlirOperationGetOperand(n.fr, 0), mlirOperationGetOperand(n.fr, 1),
                        mlirOperationGetOperand(n.fr, 2), mlirOperationGetResult(init, 0)};
  MlirOperationState st = mlirOperationStateGet(tl_sr("scf.for"), loc);
  mlirOperationStateAddOperands(&st, 4, opnds);
  mlirOperationStateAddResults(&st, 1, &tc);
  mlirOperationStateAddOwnedRegions(&st, 1, &region);
  MlirOperation nf = mlirOperationCreate(&st);
  mlirBlockInsertOwnedOperationBefore(pb, n.fr, nf);
  // The body moves over; the accumulator is the loop-carried value.
  mlirValueReplaceAllUsesOfWith(mlirOperationGetResult(n.acc_load, 0),
                                mlirBlockGetArgument(body, 1));
  mlirValueReplaceAllUsesOfWith(n.r, mlirBlockGetArgument(body, 0));
  MlirBlock fb = mlirRegionGetFirstBlock(mlirOperationGetRegion(n.fr, 0));
  for (MlirOperation op = mlirBlockGetFirstOperation(fb), next; !mlirOperationEqual(op, n.store);
       op = next) {
    next = mlirOperationGetNextInBlock(op);
    if (mlirOperationEqual(op, n.acc_load)) continue;
    mlirOperationRemoveFromParent(op);
    mlirBlockAppendOwnedOperation(body, op);
  }
  MlirValue y = mlirOperationGetResult(n.comb, 0);
  MlirOperationState ys = mlirOperationStateGet(tl_sr("scf.yield"), loc);
  mlirOperationStateAddOperands(&ys, 1, &y);
  mlirBlockAppendOwnedOperation(body, mlirOperationCreate(&ys));
  // One store after the loop.
  MlirOperation store = mlirOperationClone(n.store);
  mlirOperationSetOperand(store, 0, mlirOperationGetResult(nf, 0));
  mlirBlockInsertOwnedOperationBefore(pb, n.fr, store);
  mlirOperationDestroy(n.fr);
  return true;
}
