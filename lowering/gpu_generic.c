//===--- gpu_generic.c - sizes of generic GPU kernels, computed per binding -===//
//
// A generic GPU kernel is compiled once with the graph's symbolic dims kept as `?`
// (compile_gpu.c, jit__compile_gpu_generic). What depends on the sizes is computed
// on the host: the grids of its launches, the bytes of its temporaries, and the
// values its kernels read (a loop bound, a guard). After convert-parallel-loops-to-gpu
// those are host SSA values built from memref.dim of the function's arguments with
// arith ops; each becomes a small postfix program (jit__gx) in the plan, evaluated
// per binding by jit__gpu_plan_bind:
//
//   - a grid operand of a launch: kernel.grid_expr;
//   - the size of a temporary (a memref.alloc with `?` dims): buffer.bytes_expr;
//   - a value a kernel body reads: an entry of the SIZES buffer (i32), read in the
//     kernel with memref.load (jit__gx_sink); constants are cloned into the body.
//
// Kernels get no scalar arguments, so the kernel ABI stays "buffers only" on both
// backends. A `?` dim may only lead a buffer's dims: strides then stay static, which
// SPIR-V needs (a runtime array of rows) and the PTX path gets by casting each
// buffer to a static type of 2^31 - 1 rows before it enters a kernel (bare pointers
// need static shapes; a kernel never indexes past the binding's rows).
//
//===----------------------------------------------------------------------===//
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>

#include "base/status.h"
#include "lowering/gpu_generic.h"
#include "lowering/gpu_ir.h"

enum { kMaxCode = 1 << 16, kMaxDepth = 64, kStack = 64 };

//===--- Programs --------------------------------------------------------===//

static jit_status gx_push(jit__gx_builder *b, jit__gx x) {
  if (b->n == kMaxCode) return JIT_ERR(JIT_UNSUPPORTED, "generic GPU kernel: sizes too complex");
  if (b->n == b->cap) {
    uint32_t cap = b->cap ? b->cap * 2 : 64;
    jit__gx *c = realloc(b->code, cap * sizeof *c);
    if (!c) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
    b->code = c;
    b->cap = cap;
  }
  b->code[b->n++] = x;
  return NULL;
}

static bool gx_const_of(MlirValue v, int64_t *out) {
  if (!mlirValueIsAOpResult(v)) return false;
  MlirOperation d = mlirOpResultGetOwner(v);
  if (!jit__op_is(d, "arith.constant")) return false;
  MlirAttribute a = mlirOperationGetAttributeByName(d, jit__sr("value"));
  if (!mlirAttributeIsAInteger(a)) return false;
  *out = mlirIntegerAttrGetValueInt(a);
  return true;
}

// The argument index of a buffer operand: the function's argument itself, or a cast.
static int gx_arg(const jit__gx_builder *b, MlirValue v) {
  for (int depth = 0; depth < 4; depth++) {
    if (mlirValueIsABlockArgument(v)) {
      if (!mlirBlockEqual(mlirBlockArgumentGetOwner(v), b->entry)) return -1;
      return (int)mlirBlockArgumentGetArgNumber(v);
    }
    MlirOperation d = mlirOpResultGetOwner(v);
    if (!jit__op_is(d, "memref.cast")) return -1;
    v = mlirOperationGetOperand(d, 0);
  }
  return -1;
}

static const struct {
  const char *name;
  jit__gx_op op;
} kBinary[] = {
    {"arith.addi", JIT__GX_ADD},          {"arith.subi", JIT__GX_SUB},
    {"arith.muli", JIT__GX_MUL},          {"arith.divsi", JIT__GX_DIVS},
    {"arith.divui", JIT__GX_DIVU},        {"arith.ceildivsi", JIT__GX_CEILDIVS},
    {"arith.ceildivui", JIT__GX_CEILDIVS}, {"arith.floordivsi", JIT__GX_FLOORDIVS},
    {"arith.remsi", JIT__GX_REMS},        {"arith.remui", JIT__GX_REMU},
    {"arith.minsi", JIT__GX_MINS},        {"arith.minui", JIT__GX_MINS},
    {"arith.maxsi", JIT__GX_MAXS},        {"arith.maxui", JIT__GX_MAXS},
};

static jit_status gx_emit(jit__gx_builder *b, MlirValue v, int depth) {
  if (depth > kMaxDepth || !mlirValueIsAOpResult(v))
    return JIT_ERR(JIT_UNSUPPORTED, "generic GPU kernel: a size that is not computed from "
                   "the buffers' dims");
  MlirOperation d = mlirOpResultGetOwner(v);
  int64_t c;
  if (gx_const_of(v, &c)) return gx_push(b, (jit__gx){JIT__GX_CONST, 0, c});
  if (jit__op_is(d, "memref.dim")) {
    int arg = gx_arg(b, mlirOperationGetOperand(d, 0));
    int64_t dim;
    if (arg < 0 || (uint32_t)arg >= b->n_io || !gx_const_of(mlirOperationGetOperand(d, 1), &dim))
      return JIT_ERR(JIT_UNSUPPORTED, "generic GPU kernel: the dim of a buffer that is "
                     "not an input or output");
    return gx_push(b, (jit__gx){JIT__GX_DIM, (uint32_t)arg, dim});
  }
  static const char *const kPass[] = {"arith.index_cast", "arith.index_castui", "arith.extsi",
                                      "arith.extui", "arith.trunci"};
  for (size_t i = 0; i < sizeof kPass / sizeof *kPass; i++)
    if (jit__op_is(d, kPass[i])) return gx_emit(b, mlirOperationGetOperand(d, 0), depth + 1);
  for (size_t i = 0; i < sizeof kBinary / sizeof *kBinary; i++) {
    if (!jit__op_is(d, kBinary[i].name)) continue;
    JIT_PROPAGATE(gx_emit(b, mlirOperationGetOperand(d, 0), depth + 1));
    JIT_PROPAGATE(gx_emit(b, mlirOperationGetOperand(d, 1), depth + 1));
    return gx_push(b, (jit__gx){kBinary[i].op, 0, 0});
  }
  if (jit__op_is(d, "arith.cmpi")) {
    MlirAttribute p = mlirOperationGetAttributeByName(d, jit__sr("predicate"));
    JIT_PROPAGATE(gx_emit(b, mlirOperationGetOperand(d, 0), depth + 1));
    JIT_PROPAGATE(gx_emit(b, mlirOperationGetOperand(d, 1), depth + 1));
    return gx_push(b, (jit__gx){JIT__GX_CMP, (uint32_t)mlirIntegerAttrGetValueInt(p), 0});
  }
  if (jit__op_is(d, "arith.select")) {
    JIT_PROPAGATE(gx_emit(b, mlirOperationGetOperand(d, 1), depth + 1));
    JIT_PROPAGATE(gx_emit(b, mlirOperationGetOperand(d, 2), depth + 1));
    JIT_PROPAGATE(gx_emit(b, mlirOperationGetOperand(d, 0), depth + 1));
    return gx_push(b, (jit__gx){JIT__GX_SELECT, 0, 0});
  }
  MlirStringRef name = mlirIdentifierStr(mlirOperationGetName(d));
  return JIT_ERR(JIT_UNSUPPORTED, "generic GPU kernel: a size computed by `%.*s`",
                 (int)name.length, name.data);
}

jit_status jit__gx_value(jit__gx_builder *b, MlirValue v, jit__gpu_expr *out) {
  uint32_t at = b->n;
  jit_status s = gx_emit(b, v, 0);
  if (s) {
    b->n = at;
    return s;
  }
  *out = (jit__gpu_expr){at, b->n - at};
  return NULL;
}

jit_status jit__gx_bytes(jit__gx_builder *b, MlirType t, const MlirValue *dyn,
                         uint32_t arg, jit__gpu_expr *out) {
  uint32_t at = b->n;
  MlirType e = mlirShapedTypeGetElementType(t);
  int64_t stat = mlirTypeIsAF16(e) ? 2 : 4;
  intptr_t rank = mlirShapedTypeGetRank(t);
  int n_dyn = 0;
  for (intptr_t d = 0; d < rank; d++)
    if (!mlirShapedTypeIsDynamicDim(t, d)) stat *= mlirShapedTypeGetDimSize(t, d);
  JIT_PROPAGATE(gx_push(b, (jit__gx){JIT__GX_CONST, 0, stat}));
  for (intptr_t d = 0; d < rank; d++) {
    if (!mlirShapedTypeIsDynamicDim(t, d)) continue;
    if (dyn) JIT_PROPAGATE(gx_emit(b, dyn[n_dyn++], 0));
    else JIT_PROPAGATE(gx_push(b, (jit__gx){JIT__GX_DIM, arg, d}));
    JIT_PROPAGATE(gx_push(b, (jit__gx){JIT__GX_MUL, 0, 0}));
  }
  *out = (jit__gpu_expr){at, b->n - at};
  return NULL;
}

void jit__gx_builder_release(jit__gx_builder *b) {
  free(b->code);
  free(b->sizes);
  memset(b, 0, sizeof *b);
}

//===--- Evaluation ------------------------------------------------------===//

static bool gx_cmp(uint32_t pred, int64_t a, int64_t b) {
  uint64_t ua = (uint64_t)a, ub = (uint64_t)b;
  switch (pred) {  // arith::CmpIPredicate
    case 0: return a == b;
    case 1: return a != b;
    case 2: return a < b;
    case 3: return a <= b;
    case 4: return a > b;
    case 5: return a >= b;
    case 6: return ua < ub;
    case 7: return ua <= ub;
    case 8: return ua > ub;
    default: return ua >= ub;
  }
}

static jit_status gx_eval(const jit__gx *code, jit__gpu_expr e, uint32_t n_io,
                          const int *ranks, const int64_t (*dims)[JIT_MAX_RANK], int64_t *out) {
  int64_t st[kStack];
  int sp = 0;
  for (uint32_t i = e.at; i < e.at + e.len; i++) {
    const jit__gx *x = &code[i];
    int need = x->op == JIT__GX_CONST || x->op == JIT__GX_DIM ? 0
               : x->op == JIT__GX_SELECT                    ? 3
                                                            : 2;
    if (sp < need || (need == 0 && sp == kStack) || x->op < JIT__GX_CONST ||
        x->op > JIT__GX_LAST)
      return JIT_ERR(JIT_INTERNAL, "generic GPU plan: a bad size program");
    if (x->op == JIT__GX_CONST) {
      st[sp++] = x->v;
      continue;
    }
    if (x->op == JIT__GX_DIM) {
      if (x->aux >= n_io || x->v < 0 || x->v >= ranks[x->aux])
        return JIT_ERR(JIT_INTERNAL, "generic GPU plan: dim %lld of buffer %u",
                       (long long)x->v, x->aux);
      st[sp++] = dims[x->aux][x->v];
      continue;
    }
    if (x->op == JIT__GX_SELECT) {
      int64_t cond = st[--sp], f = st[--sp], t = st[--sp];
      st[sp++] = cond ? t : f;
      continue;
    }
    int64_t b = st[--sp], a = st[--sp], r = 0;
    bool bad = false;
    switch (x->op) {
      case JIT__GX_ADD: bad = __builtin_add_overflow(a, b, &r); break;
      case JIT__GX_SUB: bad = __builtin_sub_overflow(a, b, &r); break;
      case JIT__GX_MUL: bad = __builtin_mul_overflow(a, b, &r); break;
      case JIT__GX_DIVS:
      case JIT__GX_DIVU:
      case JIT__GX_CEILDIVS:
      case JIT__GX_FLOORDIVS:
      case JIT__GX_REMS:
      case JIT__GX_REMU:
        if (b == 0 || (a == INT64_MIN && b == -1)) {
          bad = true;
          break;
        }
        r = x->op == JIT__GX_REMS || x->op == JIT__GX_REMU ? a % b : a / b;
        if (x->op == JIT__GX_CEILDIVS && a % b != 0 && ((a < 0) == (b < 0))) r++;
        if (x->op == JIT__GX_FLOORDIVS && a % b != 0 && ((a < 0) != (b < 0))) r--;
        break;
      case JIT__GX_MINS: r = a < b ? a : b; break;
      case JIT__GX_MAXS: r = a > b ? a : b; break;
      case JIT__GX_CMP: r = gx_cmp(x->aux, a, b); break;
      default: bad = true;
    }
    if (bad) return JIT_ERR(JIT_UNSUPPORTED, "generic GPU plan: a size overflows");
    st[sp++] = r;
  }
  if (sp != 1) return JIT_ERR(JIT_INTERNAL, "generic GPU plan: a bad size program");
  *out = st[0];
  return NULL;
}

jit_status jit__gpu_plan_shell(const jit__gpu_plan *plan, jit__gpu_plan *out) {
  memset(out, 0, sizeof *out);
  out->buffers = calloc(plan->n_buffers + 1, sizeof *out->buffers);
  out->kernels = calloc(plan->n_kernels + 1, sizeof *out->kernels);
  if (!out->buffers || !out->kernels) {
    jit__gpu_plan_release(out);
    return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
  }
  out->n_buffers = plan->n_buffers;
  for (uint32_t i = 0; i < plan->n_buffers; i++) {
    out->buffers[i] = plan->buffers[i];
    if (plan->buffers[i].bytes_expr.len) out->buffers[i].bytes = 0;
    out->buffers[i].bytes_expr = (jit__gpu_expr){0, 0};
  }
  for (uint32_t k = 0; k < plan->n_kernels; k++) {
    const jit__gpu_kernel *pk = &plan->kernels[k];
    jit__gpu_kernel *ok = &out->kernels[k];
    out->n_kernels = k + 1;
    *ok = *pk;
    memset(ok->grid_expr, 0, sizeof ok->grid_expr);
    ok->args = malloc(sizeof(uint32_t) * (pk->n_args + 1));
    if (!ok->args) {
      ok->n_args = 0;
      jit__gpu_plan_release(out);
      return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
    }
    memcpy(ok->args, pk->args, sizeof(uint32_t) * pk->n_args);
  }
  return NULL;
}

jit_status jit__gpu_plan_bind(const jit__gpu_plan *plan, uint32_t n_io, const int *ranks,
                              const int64_t (*dims)[JIT_MAX_RANK], jit__gpu_plan *out,
                              int32_t **out_sizes) {
  *out_sizes = NULL;
  JIT_PROPAGATE(jit__gpu_plan_shell(plan, out));
  int32_t *sizes = calloc(plan->n_sizes + 1, sizeof *sizes);
  jit_status s = sizes ? NULL : JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
  for (uint32_t i = 0; i < plan->n_buffers && !s; i++) {
    int64_t v;
    if (plan->buffers[i].bytes_expr.len &&
        !(s = gx_eval(plan->code, plan->buffers[i].bytes_expr, n_io, ranks, dims, &v)))
      out->buffers[i].bytes = v < 0 ? 0 : (uint64_t)v;
  }
  for (uint32_t k = 0; k < plan->n_kernels && !s; k++) {
    const jit__gpu_kernel *pk = &plan->kernels[k];
    for (int d = 0; d < 3 && !s; d++) {
      int64_t v = pk->grid[d];
      if (pk->grid_expr[d].len) s = gx_eval(plan->code, pk->grid_expr[d], n_io, ranks, dims, &v);
      if (!s && (v < 0 || v > 65535))
        s = JIT_ERR(JIT_UNSUPPORTED, "kernel `%s`: grid[%d] = %lld for this binding, over "
                    "65535", pk->entry, d, (long long)v);
      out->kernels[k].grid[d] = (uint32_t)(v < 0 ? 0 : v);
    }
  }
  for (uint32_t i = 0; i < plan->n_sizes && !s; i++) {
    int64_t v = 0;
    s = gx_eval(plan->code, plan->sizes[i], n_io, ranks, dims, &v);
    if (!s && (v < INT32_MIN || v > INT32_MAX))
      s = JIT_ERR(JIT_UNSUPPORTED, "a size of this binding (%lld) is past 32 bits",
                  (long long)v);
    if (!s) sizes[i] = (int32_t)v;
  }
  if (s) {
    jit__gpu_plan_release(out);
    free(sizes);
    return s;
  }
  out->n_sizes = plan->n_sizes;  // their values: *out_sizes (no programs here)
  *out_sizes = sizes;
  return NULL;
}

//===--- Sizes into the kernels ------------------------------------------===//

static bool gx_inside(MlirOperation op, MlirOperation launch) {
  for (; !mlirOperationIsNull(op); op = mlirOperationGetParentOperation(op))
    if (mlirOperationEqual(op, launch)) return true;
  return false;
}

static bool gx_defined_inside(MlirValue v, MlirOperation launch) {
  MlirOperation owner = mlirValueIsAOpResult(v)
                            ? mlirOpResultGetOwner(v)
                            : mlirBlockGetParentOperation(mlirBlockArgumentGetOwner(v));
  return gx_inside(owner, launch);
}

static MlirOperation gx_create(MlirContext ctx, const char *name, intptr_t n_opnds,
                               const MlirValue *opnds, MlirType result, MlirNamedAttribute *attr) {
  MlirOperationState st = mlirOperationStateGet(jit__sr(name), mlirLocationUnknownGet(ctx));
  if (n_opnds) mlirOperationStateAddOperands(&st, n_opnds, opnds);
  mlirOperationStateAddResults(&st, 1, &result);
  if (attr) mlirOperationStateAddAttributes(&st, 1, attr);
  return mlirOperationCreate(&st);
}


// The SIZES entry of program code[at, at + len), deduplicated.
static jit_status gx_size_index(jit__gx_builder *b, jit__gpu_expr e, uint32_t *out) {
  for (uint32_t i = 0; i < b->n_sizes; i++) {
    jit__gpu_expr o = b->sizes[i];
    if (o.len == e.len && !memcmp(&b->code[o.at], &b->code[e.at], e.len * sizeof(jit__gx))) {
      b->n = e.at;  // the copy just emitted is not needed
      *out = i;
      return NULL;
    }
  }
  if (b->n_sizes == JIT__GX_MAX_SIZES)
    return JIT_ERR(JIT_UNSUPPORTED, "generic GPU kernel: more than %d sizes",
                   JIT__GX_MAX_SIZES);
  if (b->n_sizes == b->cap_sizes) {
    uint32_t cap = b->cap_sizes ? b->cap_sizes * 2 : 16;
    jit__gpu_expr *v = realloc(b->sizes, cap * sizeof *v);
    if (!v) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
    b->sizes = v;
    b->cap_sizes = cap;
  }
  b->sizes[b->n_sizes] = e;
  *out = b->n_sizes++;
  return NULL;
}

typedef struct gx_walk {
  MlirContext ctx;
  jit__gx_builder *b;
  MlirOperation launch;
  MlirBlock body;
  MlirOperation anchor;  // the body's first op before any was added: new ops go before
  MlirValue sizes;
  bool ptx;
  MlirValue from[256], to[256];  // outside values and what the body uses instead
  int n;
  jit_status status;
} gx_walk;

static void gx_insert(gx_walk *w, MlirOperation op) {
  mlirBlockInsertOwnedOperationBefore(w->body, w->anchor, op);
}

static bool gx_is_arith(MlirOperation op) {
  MlirStringRef name = mlirIdentifierStr(mlirOperationGetName(op));
  return name.length > 6 && !memcmp(name.data, "arith.", 6) &&
         mlirOperationGetNumRegions(op) == 0 && mlirOperationGetNumResults(op) == 1;
}

// A buffer with a `?` dim as a static type, cast before the launch (PTX: bare
// pointers need static shapes; the rows as many as 32-bit indices reach).
static jit_status gx_static_buffer(gx_walk *w, MlirValue v, MlirValue *out) {
  MlirType t = mlirValueGetType(v);
  intptr_t rank = mlirShapedTypeGetRank(t);
  int64_t shape[JIT_MAX_RANK];
  for (intptr_t d = 0; d < rank; d++) {
    shape[d] = mlirShapedTypeGetDimSize(t, d);
    if (mlirShapedTypeIsDynamicDim(t, d)) shape[d] = d == 0 ? INT32_MAX : -1;
    if (shape[d] < 0)
      return JIT_ERR(JIT_UNSUPPORTED, "generic GPU kernel: a `?` dim past the first");
  }
  MlirType st = mlirMemRefTypeContiguousGet(mlirShapedTypeGetElementType(t), rank, shape,
                                            mlirMemRefTypeGetMemorySpace(t));
  MlirOperation cast = gx_create(w->ctx, "memref.cast", 1, &v, st, NULL);
  mlirBlockInsertOwnedOperationBefore(mlirOperationGetBlock(w->launch), w->launch, cast);
  *out = mlirOperationGetResult(cast, 0);
  return NULL;
}

// An index the body reads from the SIZES buffer.
static jit_status gx_size_read(gx_walk *w, MlirValue v, MlirValue *out) {
  jit__gpu_expr e;
  uint32_t slot = 0;
  JIT_PROPAGATE(jit__gx_value(w->b, v, &e));
  JIT_PROPAGATE(gx_size_index(w->b, e, &slot));
  MlirValue opnds[2] = {w->sizes, jit__index_const(w->ctx, w->body, w->anchor, slot)};
  MlirOperation load = gx_create(w->ctx, "memref.load", 2, opnds,
                                 mlirIntegerTypeGet(w->ctx, 32), NULL);
  gx_insert(w, load);
  MlirValue lv = mlirOperationGetResult(load, 0);
  MlirOperation cast = gx_create(w->ctx, "arith.index_cast", 1, &lv, mlirValueGetType(v), NULL);
  gx_insert(w, cast);
  *out = mlirOperationGetResult(cast, 0);
  return NULL;
}

// What the kernel body uses in place of outside value `v` (`v` itself for a buffer
// that can enter as it is): a buffer cast to a static type (PTX), a clone of a
// constant, an index read from the SIZES buffer, or a clone of the scalar op that
// computes it from those (a mean's count as a float). New ops go before the anchor in
// the order they are made, so each comes after what it uses.
static jit_status gx_get(gx_walk *w, MlirValue v, int depth, MlirValue *out) {
  for (int k = 0; k < w->n; k++)
    if (mlirValueEqual(w->from[k], v)) {
      *out = w->to[k];
      return NULL;
    }
  if (w->n == 256 || depth > 16)
    return JIT_ERR(JIT_UNSUPPORTED, "generic GPU kernel: too many outside values");
  MlirType t = mlirValueGetType(v);
  MlirOperation def = mlirValueIsAOpResult(v) ? mlirOpResultGetOwner(v) : (MlirOperation){NULL};
  MlirValue r = v;
  if (mlirTypeIsAMemRef(t)) {
    if (w->ptx && !mlirShapedTypeHasStaticShape(t)) JIT_PROPAGATE(gx_static_buffer(w, v, &r));
  } else if (!mlirOperationIsNull(def) && jit__op_is(def, "arith.constant")) {
    MlirOperation clone = mlirOperationClone(def);
    gx_insert(w, clone);
    r = mlirOperationGetResult(clone, 0);
  } else if (mlirTypeIsAIndex(t)) {
    JIT_PROPAGATE(gx_size_read(w, v, &r));
  } else if (!mlirOperationIsNull(def) && gx_is_arith(def)) {
    MlirOperation clone = mlirOperationClone(def);
    for (intptr_t i = 0; i < mlirOperationGetNumOperands(def); i++) {
      MlirValue ri;
      jit_status s = gx_get(w, mlirOperationGetOperand(def, i), depth + 1, &ri);
      if (s) {
        mlirOperationDestroy(clone);
        return s;
      }
      mlirOperationSetOperand(clone, i, ri);
    }
    gx_insert(w, clone);
    r = mlirOperationGetResult(clone, 0);
  } else {
    return JIT_ERR(JIT_UNSUPPORTED, "generic GPU kernel: a value from outside a kernel "
                   "that is not a size");
  }
  w->from[w->n] = v;
  w->to[w->n++] = r;
  *out = r;
  return NULL;
}

static MlirWalkResult gx_walk_cb(MlirOperation op, void *user) {
  gx_walk *w = user;
  if (mlirOperationEqual(op, w->launch)) return MlirWalkResultAdvance;
  intptr_t n = mlirOperationGetNumOperands(op);
  for (intptr_t i = 0; i < n; i++) {
    MlirValue v = mlirOperationGetOperand(op, i), r;
    if (gx_defined_inside(v, w->launch)) continue;
    w->status = gx_get(w, v, 0, &r);
    if (w->status) return MlirWalkResultInterrupt;
    if (!mlirValueEqual(r, v)) mlirOperationSetOperand(op, i, r);
  }
  return MlirWalkResultAdvance;
}

typedef struct gx_find {
  MlirOperation launch;
  int count;
} gx_find;

static MlirWalkResult gx_find_cb(MlirOperation op, void *user) {
  gx_find *f = user;
  if (jit__op_is(op, "gpu.launch") && !f->count++) f->launch = op;
  return MlirWalkResultAdvance;
}

jit_status jit__gx_sink(MlirContext ctx, MlirOperation kf, jit__gx_builder *b, bool ptx) {
  gx_find f = {{NULL}, 0};
  mlirOperationWalk(kf, gx_find_cb, &f, MlirWalkPreOrder);
  if (f.count != 1) return JIT_ERR(JIT_INTERNAL, "expected one gpu.launch, found %d", f.count);
  MlirBlock entry = jit__entry_block(kf);
  // The SIZES buffer: a new last argument of the kernel function.
  int64_t shape[1] = {JIT__GX_MAX_SIZES};
  MlirType st = mlirMemRefTypeContiguousGet(mlirIntegerTypeGet(ctx, 32), 1, shape,
                                            mlirAttributeGetNull());
  MlirValue sizes = mlirBlockAddArgument(entry, st, mlirLocationUnknownGet(ctx));
  intptr_t n = mlirBlockGetNumArguments(entry);
  MlirType *types = malloc((size_t)n * sizeof *types);
  if (!types) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
  for (intptr_t i = 0; i < n; i++) types[i] = mlirValueGetType(mlirBlockGetArgument(entry, i));
  mlirOperationSetAttributeByName(kf, jit__sr("function_type"),
                                  mlirTypeAttrGet(mlirFunctionTypeGet(ctx, n, types, 0, NULL)));
  free(types);
  b->entry = entry;
  gx_walk *w = calloc(1, sizeof *w);
  if (!w) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
  w->ctx = ctx;
  w->b = b;
  w->launch = f.launch;
  w->body = mlirRegionGetFirstBlock(mlirOperationGetRegion(f.launch, 0));
  w->anchor = mlirBlockGetFirstOperation(w->body);
  w->sizes = sizes;
  w->ptx = ptx;
  mlirOperationWalk(f.launch, gx_walk_cb, w, MlirWalkPreOrder);
  jit_status s = w->status;
  free(w);
  return s;
}

jit_status jit__gx_check_buffer(MlirType t) {
  intptr_t rank = mlirShapedTypeGetRank(t);
  for (intptr_t d = 1; d < rank; d++)
    if (mlirShapedTypeIsDynamicDim(t, d))
      return JIT_ERR(JIT_UNSUPPORTED, "generic GPU kernels take `?` dims in a buffer's "
                     "first dim only (dim %d of a rank-%d buffer is `?`)", (int)d, (int)rank);
  return NULL;
}
