//===--- share.c - identical loop nests compiled once --------------------===//
//
// A transformer block computes q, k and v the same way: three matmuls of one shape,
// each with its bias and its split into heads. After bufferization the kernel holds
// three loop nests that differ only in the buffers they read and write, and every
// stage after (the lowering to LLVM, LLVM's passes, codegen: ~80 % of a block's
// compile) would handle each one. Here, identical top-level loops of the kernel
// function become one private function, called once per loop with that loop's
// buffers; the LLVM pipeline has no inliner, so codegen sees the body once.
//
// "Identical" is structural, from the ops' uniqued MLIR objects: op names, types and
// attributes (the same pointer is the same value within a context), the nesting, and
// each operand either defined in the loop (by its position), a constant (by its
// attribute, cloned into the function), or a value from outside (by the order in which
// the loop first uses it: these become the function's arguments). A cheap signature
// without attributes finds candidates; the full one confirms them. The strategy's tags
// (`jit_*` and `jit.*` attributes, which only the transform scripts read) do not count.
//
//===----------------------------------------------------------------------===//
#include "lowering/cpu/internal.h"

#include <stdlib.h>
#include <string.h>

#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>

// Loops smaller than this (ops in the nest) stay where they are: a call saves little.
enum { kMinOps = 12, kMaxLoops = 256 };

//===--- Value numbering -------------------------------------------------===//

// Open addressing from an MlirValue's pointer to a number.
typedef struct vmap {
  const void **keys;
  uint32_t *vals;
  uint32_t cap, n;
  bool oom;
} vmap;

static uint32_t vmap_slot(const vmap *m, const void *k) {
  uintptr_t h = (uintptr_t)k;
  h ^= h >> 17;
  h *= 0x9E3779B97F4A7C15ull;
  uint32_t i = (uint32_t)(h >> 32) & (m->cap - 1);
  while (m->keys[i] && m->keys[i] != k) i = (i + 1) & (m->cap - 1);
  return i;
}

static bool vmap_grow(vmap *m) {
  uint32_t cap = m->cap ? m->cap * 2 : 256;
  vmap big = {calloc(cap, sizeof(void *)), calloc(cap, sizeof(uint32_t)), cap, 0, false};
  if (!big.keys || !big.vals) {
    free(big.keys);
    free(big.vals);
    return false;
  }
  for (uint32_t i = 0; i < m->cap; i++)
    if (m->keys[i]) {
      uint32_t s = vmap_slot(&big, m->keys[i]);
      big.keys[s] = m->keys[i];
      big.vals[s] = m->vals[i];
      big.n++;
    }
  free(m->keys);
  free(m->vals);
  *m = big;
  return true;
}

// The number of `k`, or UINT32_MAX.
static uint32_t vmap_get(const vmap *m, const void *k) {
  if (!m->cap) return UINT32_MAX;
  uint32_t s = vmap_slot(m, k);
  return m->keys[s] ? m->vals[s] : UINT32_MAX;
}

static void vmap_put(vmap *m, const void *k, uint32_t v) {
  if ((m->n + 1) * 2 > m->cap && !vmap_grow(m)) {
    m->oom = true;
    return;
  }
  uint32_t s = vmap_slot(m, k);
  if (!m->keys[s]) m->n++;
  m->keys[s] = k;
  m->vals[s] = v;
}

static void vmap_clear(vmap *m) {
  if (m->cap) memset(m->keys, 0, m->cap * sizeof(void *));
  m->n = 0;
}

//===--- Signatures ------------------------------------------------------===//

// One loop nest's signature: a sequence of words, and the values from outside it
// (`ext`, in the order of first use) with whether each is a constant.
typedef struct sig {
  uint64_t *w;
  size_t n, cap;
  MlirValue *ext;
  bool *ext_const;
  size_t n_ext, cap_ext;
  uint32_t n_ops;
  bool bad;  // not shareable (successors, results, a type a call cannot pass), or OOM
} sig;

typedef struct sig_walk {
  sig *s;
  vmap local;      // values defined in the nest -> their number
  vmap outside;    // values from outside -> their index in s->ext
  uint32_t next;   // the next local number
  bool attrs;      // the full signature
  bool bare;       // memrefs are passed as bare pointers
} sig_walk;

static void sig_word(sig *s, uint64_t v) {
  if (s->n == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 1024;
    uint64_t *w = realloc(s->w, cap * sizeof *w);
    if (!w) {
      s->bad = true;
      return;
    }
    s->w = w;
    s->cap = cap;
  }
  s->w[s->n++] = v;
}

static void sig_ptr(sig *s, const void *p) { sig_word(s, (uint64_t)(uintptr_t)p); }

// The words that are not pointers (user-space pointers are under 2^56) carry a tag in
// their top byte.
enum { kLocal = 1, kConstant, kOutside, kBlock, kEnd };
static void sig_tag(sig *s, uint64_t tag, uint64_t v) { sig_word(s, tag << 56 | v); }

static bool is_constant(MlirOperation def) {
  return jit__cpu_op_is(def, "arith.constant") || jit__cpu_op_is(def, "ub.poison");
}

// Whether a call can pass a value of type `t`: with bare pointers only memrefs of a
// static shape and layout (convert-func-to-llvm's rule).
static bool passable(MlirType t, bool bare) {
  if (!mlirTypeIsAMemRef(t)) return !mlirTypeIsAUnrankedMemRef(t);
  if (!bare) return true;
  if (!mlirShapedTypeHasStaticShape(t)) return false;
  intptr_t rank = mlirShapedTypeGetRank(t);
  int64_t strides[16], offset;
  if (rank > 16 ||
      mlirLogicalResultIsFailure(mlirMemRefTypeGetStridesAndOffset(t, strides, &offset)))
    return false;
  for (intptr_t d = 0; d < rank; d++)
    if (mlirShapedTypeIsDynamicStrideOrOffset(strides[d])) return false;
  return !mlirShapedTypeIsDynamicStrideOrOffset(offset);
}

static void sig_local(sig_walk *sw, MlirValue v) {
  vmap_put(&sw->local, v.ptr, sw->next++);
  sig_ptr(sw->s, mlirValueGetType(v).ptr);
}

static void sig_operand(sig_walk *sw, MlirValue v) {
  sig *s = sw->s;
  uint32_t id = vmap_get(&sw->local, v.ptr);
  if (id != UINT32_MAX) {
    sig_tag(s, kLocal, id);
    return;
  }
  MlirOperation def =
      mlirValueIsAOpResult(v) ? mlirOpResultGetOwner(v) : (MlirOperation){NULL};
  bool cst = !mlirOperationIsNull(def) && is_constant(def);
  if (cst) {  // compared by what it is: cloned into the function
    sig_tag(s, kConstant, 0);
    sig_ptr(s, mlirOperationGetName(def).ptr);
    sig_ptr(s, mlirValueGetType(v).ptr);
    MlirAttribute a =
        mlirOperationGetAttributeByName(def, mlirStringRefCreateFromCString("value"));
    sig_ptr(s, a.ptr);
  }
  uint32_t e = vmap_get(&sw->outside, v.ptr);
  if (e == UINT32_MAX) {
    if (!cst && !passable(mlirValueGetType(v), sw->bare)) s->bad = true;
    if (s->n_ext == s->cap_ext) {
      size_t cap = s->cap_ext ? s->cap_ext * 2 : 16;
      MlirValue *ext = realloc(s->ext, cap * sizeof *ext);
      bool *ec = ext ? realloc(s->ext_const, cap * sizeof *ec) : NULL;
      if (ext) s->ext = ext;
      if (!ec) {
        s->bad = true;
        return;
      }
      s->ext_const = ec;
      s->cap_ext = cap;
    }
    e = (uint32_t)s->n_ext;
    s->ext[s->n_ext] = v;
    s->ext_const[s->n_ext++] = cst;
    vmap_put(&sw->outside, v.ptr, e);
  }
  if (!cst) {
    sig_tag(s, kOutside, e);
    sig_ptr(s, mlirValueGetType(v).ptr);
  }
}

static void sig_op(sig_walk *sw, MlirOperation op) {
  sig *s = sw->s;
  s->n_ops++;
  sig_ptr(s, mlirOperationGetName(op).ptr);
  if (mlirOperationGetNumSuccessors(op)) s->bad = true;
  intptr_t n = mlirOperationGetNumOperands(op);
  sig_word(s, (uint64_t)n);
  for (intptr_t i = 0; i < n; i++) sig_operand(sw, mlirOperationGetOperand(op, i));
  if (sw->attrs) {
    intptr_t na = mlirOperationGetNumAttributes(op);
    for (intptr_t i = 0; i < na; i++) {
      MlirNamedAttribute a = mlirOperationGetAttribute(op, i);
      MlirStringRef name = mlirIdentifierStr(a.name);
      if (name.length > 4 && !memcmp(name.data, "jit", 3) &&
          (name.data[3] == '_' || name.data[3] == '.'))
        continue;  // the strategy's tags
      sig_ptr(s, a.name.ptr);
      sig_ptr(s, a.attribute.ptr);
    }
  }
  n = mlirOperationGetNumResults(op);
  sig_word(s, (uint64_t)n);
  for (intptr_t i = 0; i < n; i++) sig_local(sw, mlirOperationGetResult(op, i));
  intptr_t nr = mlirOperationGetNumRegions(op);
  sig_word(s, (uint64_t)nr);
  for (intptr_t r = 0; r < nr; r++) {
    MlirRegion region = mlirOperationGetRegion(op, r);
    for (MlirBlock b = mlirRegionGetFirstBlock(region); !mlirBlockIsNull(b);
         b = mlirBlockGetNextInRegion(b)) {
      intptr_t na = mlirBlockGetNumArguments(b);
      sig_tag(s, kBlock, (uint64_t)na);
      for (intptr_t i = 0; i < na; i++) sig_local(sw, mlirBlockGetArgument(b, i));
      for (MlirOperation o = mlirBlockGetFirstOperation(b); !mlirOperationIsNull(o);
           o = mlirOperationGetNextInBlock(o))
        sig_op(sw, o);
      sig_tag(s, kEnd, 0);
    }
  }
}

// Fills `s` for the loop `op`: the full signature when `attrs`.
static void sig_build(sig_walk *sw, sig *s, MlirOperation op, bool attrs) {
  s->n = s->n_ext = 0;
  s->n_ops = 0;
  s->bad = mlirOperationGetNumResults(op) != 0;
  sw->s = s;
  sw->attrs = attrs;
  sw->next = 0;
  vmap_clear(&sw->local);
  vmap_clear(&sw->outside);
  sig_op(sw, op);
  if (sw->local.oom || sw->outside.oom) s->bad = true;
}

static bool sig_equal(const sig *a, const sig *b) {
  return !a->bad && !b->bad && a->n == b->n && !memcmp(a->w, b->w, a->n * sizeof *a->w);
}

static void sig_free(sig *s) {
  free(s->w);
  free(s->ext);
  free(s->ext_const);
}

//===--- Outlining -------------------------------------------------------===//

static bool inside(MlirOperation op, MlirOperation ancestor) {
  for (; !mlirOperationIsNull(op); op = mlirOperationGetParentOperation(op))
    if (mlirOperationEqual(op, ancestor)) return true;
  return false;
}

// Replaces the uses of `v` inside `scope` by `with`.
static void replace_inside(MlirValue v, MlirValue with, MlirOperation scope) {
  for (MlirOpOperand u = mlirValueGetFirstUse(v); !mlirOpOperandIsNull(u);) {
    MlirOpOperand next = mlirOpOperandGetNextUse(u);
    MlirOperation owner = mlirOpOperandGetOwner(u);
    if (inside(owner, scope))
      mlirOperationSetOperand(owner, mlirOpOperandGetOperandNumber(u), with);
    u = next;
  }
}

static MlirOperation make_call(MlirContext ctx, MlirAttribute callee, const sig *s,
                               MlirOperation before) {
  MlirOperationState st = mlirOperationStateGet(
      mlirStringRefCreateFromCString("func.call"), mlirOperationGetLocation(before));
  for (size_t i = 0; i < s->n_ext; i++)
    if (!s->ext_const[i]) mlirOperationStateAddOperands(&st, 1, &s->ext[i]);
  MlirNamedAttribute a = jit__cpu_named(ctx, "callee", callee);
  mlirOperationStateAddAttributes(&st, 1, &a);
  MlirOperation call = mlirOperationCreate(&st);
  mlirBlockInsertOwnedOperationBefore(mlirOperationGetBlock(before), before, call);
  return call;
}

// Moves `loop` (signature `s`) into a new private function `name` (free) of the module
// `table` holds, called where the loop was.
static MlirAttribute outline(MlirContext ctx, MlirSymbolTable table, MlirOperation loop,
                             const sig *s, const char *name) {
  MlirLocation loc = mlirOperationGetLocation(loop);
  MlirType *types = malloc((s->n_ext + 1) * sizeof *types);
  MlirLocation *locs = malloc((s->n_ext + 1) * sizeof *locs);
  if (!types || !locs) {
    free(types);
    free(locs);
    return mlirAttributeGetNull();
  }
  intptr_t n = 0;
  for (size_t i = 0; i < s->n_ext; i++)
    if (!s->ext_const[i]) {
      types[n] = mlirValueGetType(s->ext[i]);
      locs[n++] = loc;
    }
  MlirBlock body = mlirBlockCreate(n, types, locs);
  MlirType fn_type = mlirFunctionTypeGet(ctx, n, types, 0, NULL);
  free(types);
  free(locs);
  MlirRegion region = mlirRegionCreate();
  mlirRegionAppendOwnedBlock(region, body);
  MlirOperationState st =
      mlirOperationStateGet(mlirStringRefCreateFromCString("func.func"), loc);
  MlirStringRef sym = mlirStringRefCreateFromCString(name);
  MlirNamedAttribute attrs[3] = {
      jit__cpu_named(ctx, "sym_name", mlirStringAttrGet(ctx, sym)),
      jit__cpu_named(ctx, "function_type", mlirTypeAttrGet(fn_type)),
      jit__cpu_named(ctx, "sym_visibility",
            mlirStringAttrGet(ctx, mlirStringRefCreateFromCString("private"))),
  };
  mlirOperationStateAddAttributes(&st, 3, attrs);
  mlirOperationStateAddOwnedRegions(&st, 1, &region);
  MlirOperation fn = mlirOperationCreate(&st);
  MlirAttribute callee = mlirFlatSymbolRefAttrGet(
      ctx, mlirStringAttrGetValue(mlirSymbolTableInsert(table, fn)));
  MlirOperationState rs =
      mlirOperationStateGet(mlirStringRefCreateFromCString("func.return"), loc);
  MlirOperation ret = mlirOperationCreate(&rs);
  mlirBlockAppendOwnedOperation(body, ret);

  make_call(ctx, callee, s, loop);
  mlirOperationMoveBefore(loop, ret);
  intptr_t arg = 0;
  for (size_t i = 0; i < s->n_ext; i++) {
    MlirValue with;
    if (s->ext_const[i]) {
      MlirOperation c = mlirOperationClone(mlirOpResultGetOwner(s->ext[i]));
      mlirBlockInsertOwnedOperationBefore(body, mlirBlockGetFirstOperation(body), c);
      with = mlirOperationGetResult(c, 0);
    } else {
      with = mlirBlockGetArgument(body, arg++);
    }
    replace_inside(s->ext[i], with, fn);
  }
  return callee;
}

//===--- Entry -----------------------------------------------------------===//

static bool is_loop(MlirOperation op) {
  return jit__cpu_op_is(op, "scf.for") || jit__cpu_op_is(op, "scf.forall") ||
         jit__cpu_op_is(op, "scf.parallel");
}

static uint64_t sig_hash(const sig *s) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < s->n; i++) h = (h ^ s->w[i]) * 1099511628211ull;
  return h;
}

// The loops a kernel's function runs at its top level, or in the branches of an
// scf.if there (a generic kernel's row paths), with their cheap signatures' hashes.
typedef struct candidates {
  MlirOperation loops[kMaxLoops];
  uint64_t hash[kMaxLoops];
  int n;
  sig_walk sw;
  sig s;
} candidates;

static void find_loops(candidates *c, MlirBlock block) {
  for (MlirOperation op = mlirBlockGetFirstOperation(block);
       !mlirOperationIsNull(op) && c->n < kMaxLoops;
       op = mlirOperationGetNextInBlock(op)) {
    if (jit__cpu_op_is(op, "scf.if")) {
      for (intptr_t r = 0; r < mlirOperationGetNumRegions(op); r++) {
        MlirBlock b = mlirRegionGetFirstBlock(mlirOperationGetRegion(op, r));
        if (!mlirBlockIsNull(b)) find_loops(c, b);
      }
      continue;
    }
    if (!is_loop(op)) continue;
    sig_build(&c->sw, &c->s, op, false);
    if (c->s.bad || c->s.n_ops < kMinOps) continue;
    c->loops[c->n] = op;
    c->hash[c->n++] = sig_hash(&c->s);
  }
}

int jit__cpu_share_loops(MlirContext ctx, MlirOperation module, const char *func_name,
                         bool bare_ptr) {
  MlirSymbolTable table = mlirSymbolTableCreate(module);
  MlirOperation fn =
      mlirSymbolTableLookup(table, mlirStringRefCreateFromCString(func_name));
  candidates *c = mlirOperationIsNull(fn) ? NULL : calloc(1, sizeof *c);
  if (!c) {
    mlirSymbolTableDestroy(table);
    return 0;
  }
  c->sw.bare = bare_ptr;
  find_loops(c, mlirRegionGetFirstBlock(mlirOperationGetRegion(fn, 0)));
  sig t = {0};
  int shared = 0, funcs = 0;
  for (int i = 0; i < c->n; i++) {
    if (mlirOperationIsNull(c->loops[i])) continue;
    MlirAttribute callee = mlirAttributeGetNull();
    bool full = false;  // c->s is loop i's full signature
    for (int j = i + 1; j < c->n; j++) {
      if (mlirOperationIsNull(c->loops[j]) || c->hash[j] != c->hash[i]) continue;
      if (!full) sig_build(&c->sw, &c->s, c->loops[i], true);
      full = true;
      sig_build(&c->sw, &t, c->loops[j], true);
      if (!sig_equal(&c->s, &t)) continue;
      if (mlirAttributeIsNull(callee)) {
        char name[96];  // a name the module does not hold (imported MLIR may)
        do snprintf(name, sizeof name, "%s_shared%d", func_name, funcs++);
        while (!mlirOperationIsNull(
            mlirSymbolTableLookup(table, mlirStringRefCreateFromCString(name))));
        callee = outline(ctx, table, c->loops[i], &c->s, name);
        if (mlirAttributeIsNull(callee)) break;  // out of memory: the loops stay
        shared++;
      }
      make_call(ctx, callee, &t, c->loops[j]);
      mlirOperationDestroy(c->loops[j]);
      c->loops[j] = (MlirOperation){NULL};
      shared++;
    }
  }
  sig_free(&c->s);
  sig_free(&t);
  free(c->sw.local.keys);
  free(c->sw.local.vals);
  free(c->sw.outside.keys);
  free(c->sw.outside.vals);
  free(c);
  mlirSymbolTableDestroy(table);
  return shared;
}
