//===--- post_bufferize.c - rewrites after the script and bufferization -===//
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

typedef struct unroll_walk {
  MlirStringRef name;         // "loop_annotation"
  MlirAttribute off, by2, by4;  // unroll.disable, count 2, count 4
  int n;
} unroll_walk;

static MlirWalkResult find_k_loops(MlirOperation op, void *user) {
  unroll_walk *uw = user;
  if (!jit__cpu_op_is(op, "scf.for")) return MlirWalkResultAdvance;
  bool fma = false;
  MlirBlock body = mlirRegionGetFirstBlock(mlirOperationGetRegion(op, 0));
  for (MlirOperation o = mlirBlockGetFirstOperation(body); !mlirOperationIsNull(o) && !fma;
       o = mlirOperationGetNextInBlock(o))
    fma = jit__cpu_op_is(o, "vector.fma");
  int64_t lb, ub, step, count = 0;
  if (fma && jit__cpu_const_index(mlirOperationGetOperand(op, 0), &lb) &&
      jit__cpu_const_index(mlirOperationGetOperand(op, 1), &ub) &&
      jit__cpu_const_index(mlirOperationGetOperand(op, 2), &step) && step > 0 && ub > lb) {
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
// - each select's mask is a box (constant_mask or create_mask, through extracts and
//   transposes) whose lanes cover columns [0, n), n a constant or (a generic kernel's
//   `?` rest of columns) a run-time value, in its row r or, where the box's rows are
//   a run-time count R (a generic kernel's rest of `?` rows), in row r when r < R;
// - the accumulator is a loop-carried vector used only by row extracts, each used only
//   by one such FMA (as its addend) and its select;
// - each select result goes, by vector.insert into the same row, through a chain of
//   such inserts to the loop's yield, at the accumulator's position;
// - the loop's result is used only by transfer writes masked to columns [0, m), m <= n
//   (the same run-time value where n is one), and to rows [0, R) where there is an R.
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

// One dim of a mask box: lanes [0, c) on, or with v set, [0, v) for a run-time v.
typedef struct mdim {
  int64_t c;
  MlirValue v;
} mdim;

// What a mask is known to be: a box of lanes on, [0, size[d]) in every dim d; with
// `cond` set, only where row `cond_pos` < cond (a row extracted from a box whose
// rows are a run-time count), else no lanes at all.
typedef struct mbox {
  mdim size[JIT__MASK_RANK];
  int rank;
  MlirValue cond;
  int64_t cond_pos;
} mbox;

static mdim mdim_of(MlirValue v) {
  if (mlirValueIsAOpResult(v)) {
    MlirOperation d = mlirOpResultGetOwner(v);
    MlirAttribute a = attr_of(d, "value");
    if (jit__cpu_op_is(d, "arith.constant") && !mlirAttributeIsNull(a) &&
        mlirAttributeIsAInteger(a))
      return (mdim){mlirIntegerAttrGetValueInt(a), {NULL}};
  }
  return (mdim){0, v};
}

// When mask `v` is a box (constant_mask or create_mask, through extracts and
// transposes): its sizes.
static bool mask_box(MlirValue v, mbox *m, int depth) {
  if (depth > 8 || !mlirValueIsAOpResult(v)) return false;
  MlirOperation d = mlirOpResultGetOwner(v);
  if (jit__cpu_op_is(d, "vector.constant_mask")) {
    int64_t c[JIT__MASK_RANK];
    if (!i64_array(attr_of(d, "mask_dim_sizes"), c, &m->rank, JIT__MASK_RANK)) return false;
    for (int i = 0; i < m->rank; i++) m->size[i] = (mdim){c[i], {NULL}};
    m->cond.ptr = NULL;
    return true;
  }
  if (jit__cpu_op_is(d, "vector.create_mask")) {
    intptr_t n = mlirOperationGetNumOperands(d);
    if (n < 1 || n > JIT__MASK_RANK) return false;
    for (intptr_t i = 0; i < n; i++) m->size[i] = mdim_of(mlirOperationGetOperand(d, i));
    m->rank = (int)n;
    m->cond.ptr = NULL;
    return true;
  }
  mbox in;
  int64_t perm[JIT__MASK_RANK];
  int np = 0;
  if (jit__cpu_op_is(d, "vector.transpose")) {
    if (!mask_box(mlirOperationGetOperand(d, 0), &in, depth + 1) ||
        !i64_array(attr_of(d, "permutation"), perm, &np, JIT__MASK_RANK) || np != in.rank)
      return false;
    *m = in;
    for (int i = 0; i < np; i++) {
      if (perm[i] < 0 || perm[i] >= np) return false;
      m->size[i] = in.size[perm[i]];
    }
    return true;
  }
  if (jit__cpu_op_is(d, "vector.extract") && mlirOperationGetNumOperands(d) == 1) {
    if (!mask_box(mlirOperationGetOperand(d, 0), &in, depth + 1) || in.cond.ptr ||
        !i64_array(attr_of(d, "static_position"), perm, &np, in.rank) || np >= in.rank)
      return false;
    bool on = true;
    m->cond.ptr = NULL;
    for (int i = 0; i < np; i++) {
      if (perm[i] < 0) return false;
      if (!in.size[i].v.ptr) {
        on = on && perm[i] < in.size[i].c;
      } else if (m->cond.ptr) {
        return false;  // two run-time conditions
      } else {
        m->cond = in.size[i].v;
        m->cond_pos = perm[i];
      }
    }
    for (int i = np; i < in.rank; i++) m->size[i - np] = on ? in.size[i] : (mdim){0, {NULL}};
    m->rank = in.rank - np;
    return true;
  }
  return false;
}

// Whether [0, a) is within [0, b): constants, or the same run-time value.
static bool mdim_within(mdim a, mdim b) {
  if (!a.v.ptr && !b.v.ptr) return a.c <= b.c;
  if (!a.v.ptr && a.c == 0) return true;
  return a.v.ptr && b.v.ptr && mlirValueEqual(a.v, b.v);
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
  // The selects' column extent (the narrowest constant, or the one run-time value
  // they share), and the run-time row count they are conditional on, if any.
  mdim cols = {INT64_MAX, {NULL}};
  MlirValue rows = {NULL};
  int first = sw->n;
  for (MlirOpOperand u = mlirValueGetFirstUse(acc); !mlirOpOperandIsNull(u);
       u = mlirOpOperandGetNextUse(u)) {
    MlirOperation ex = mlirOpOperandGetOwner(u);
    int64_t r = jit__cpu_op_is(ex, "vector.extract") ? row_of(ex, 1) : -1;
    if (r < 0) goto fail;
    // The row: the addend of one fma and the false value of one select of that fma.
    MlirValue row = mlirOperationGetResult(ex, 0);
    MlirOperation fma = {NULL}, sel = {NULL};
    for (MlirOpOperand v = mlirValueGetFirstUse(row); !mlirOpOperandIsNull(v);
         v = mlirOpOperandGetNextUse(v)) {
      MlirOperation o = mlirOpOperandGetOwner(v);
      unsigned k = mlirOpOperandGetOperandNumber(v);
      if (jit__cpu_op_is(o, "vector.fma") && k == 2 && mlirOperationIsNull(fma)) fma = o;
      else if (jit__cpu_op_is(o, "arith.select") && k == 2 && mlirOperationIsNull(sel)) sel = o;
      else goto fail;
    }
    if (mlirOperationIsNull(fma) || mlirOperationIsNull(sel) ||
        !mlirValueEqual(mlirOperationGetOperand(sel, 1), mlirOperationGetResult(fma, 0)) ||
        !only_use(mlirOperationGetResult(fma, 0), sel))
      goto fail;
    mbox m;
    if (!mask_box(mlirOperationGetOperand(sel, 0), &m, 0) || m.rank != 1) goto fail;
    if (!m.size[0].v.ptr && !cols.v.ptr) {
      if (m.size[0].c < cols.c) cols = m.size[0];
    } else if (cols.v.ptr ? !mdim_within(cols, m.size[0]) : cols.c != INT64_MAX) {
      goto fail;  // a run-time extent beside another extent
    } else {
      cols = m.size[0];
    }
    // A row that is on only below a run-time row count: that of the accumulator's row.
    if (m.cond.ptr) {
      if (m.cond_pos != r || (rows.ptr && !mlirValueEqual(rows, m.cond))) goto fail;
      rows = m.cond;
    }
    // Into the same row, through inserts only, to the yield at `pos`.
    MlirValue cur = mlirOperationGetResult(sel, 0);
    MlirOpOperand next = mlirValueGetFirstUse(cur);
    if (mlirOpOperandIsNull(next) || !mlirOpOperandIsNull(mlirOpOperandGetNextUse(next)))
      goto fail;
    MlirOperation ins = mlirOpOperandGetOwner(next);
    if (!jit__cpu_op_is(ins, "vector.insert") || mlirOpOperandGetOperandNumber(next) != 0 ||
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
      if (!jit__cpu_op_is(o, "vector.insert") || mlirOpOperandGetOperandNumber(next) != 1 ||
          row_of(o, 2) < 0)
        goto fail;
      ins = o;
    }
    if (sw->n == 256) goto fail;
    sw->found[sw->n++] = sel;
  }
  if (sw->n == first) return;
  // The loop's result: masked writes of those columns at most only, and, where the
  // selects' rows have a run-time count, of no more rows than it.
  MlirOpOperand w = mlirValueGetFirstUse(mlirOperationGetResult(loop, pos));
  if (mlirOpOperandIsNull(w)) goto fail;
  for (; !mlirOpOperandIsNull(w); w = mlirOpOperandGetNextUse(w)) {
    MlirOperation o = mlirOpOperandGetOwner(w);
    intptr_t n = mlirOperationGetNumOperands(o);
    mbox m;
    if (!jit__cpu_op_is(o, "vector.transfer_write") || mlirOpOperandGetOperandNumber(w) != 0 ||
        n < 3 || !mask_box(mlirOperationGetOperand(o, n - 1), &m, 0) || m.rank < 1 ||
        m.cond.ptr || !mdim_within(m.size[m.rank - 1], cols))
      goto fail;
    if (rows.ptr && (m.rank < 2 || !mdim_within(m.size[m.rank - 2], (mdim){0, rows})))
      goto fail;
  }
  return;
fail:
  sw->n = first;
}

static MlirWalkResult find_masked_steps(MlirOperation op, void *user) {
  if (!jit__cpu_op_is(op, "scf.for")) return MlirWalkResultAdvance;
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
    if (jit__cpu_op_is(o, "scf.yield") || jit__cpu_op_is(o, "func.return") || jit__cpu_op_is(o, "func.call") ||
        jit__cpu_op_is(o, "memref.store") || jit__cpu_op_is(o, "scf.forall.in_parallel"))
      return false;
  }
  return true;
}

static MlirWalkResult find_stack_allocs(MlirOperation op, void *user) {
  stack_walk *sw = user;
  if (!jit__cpu_op_is(op, "memref.alloc") || mlirOperationGetNumOperands(op) != 0 ||
      mlirOperationGetNumResults(op) != 1 || sw->n >= 64)
    return MlirWalkResultAdvance;
  MlirValue res = mlirOperationGetResult(op, 0);
  MlirType t = mlirValueGetType(res);
  if (!mlirTypeIsAMemRef(t) || !mlirShapedTypeHasStaticShape(t)) return MlirWalkResultAdvance;
  int64_t bytes = jit__cpu_shaped_bytes(t);
  if (bytes < 0 || sw->bytes + bytes > JIT__STACK_BYTES) return MlirWalkResultAdvance;
  // Up through scf.for and scf.if to the function or the thread's body.
  MlirBlock b = mlirOperationGetBlock(op);
  int loops = 0;
  for (;;) {
    MlirOperation p = mlirBlockGetParentOperation(b);
    if (mlirOperationIsNull(p)) return MlirWalkResultAdvance;
    if (jit__cpu_op_is(p, "func.func") || jit__cpu_op_is(p, "scf.forall")) break;
    if (!jit__cpu_op_is(p, "scf.for") && !jit__cpu_op_is(p, "scf.if")) return MlirWalkResultAdvance;
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

//===--- Results computed in their output -------------------------------===//
//
// An output that is a reshape of what the kernel computed (a convolution's [N, F, P]
// product as [N, F, OH, OW], a matmul's rows as [B, S, D]) bufferizes as a heap
// buffer for the product, a view of it and a memref.copy into the output argument:
// the copy, and a malloc large enough to be fresh pages on every call (ResNet's 1x1
// 256 -> 64 at 56x56: 0.68-0.70 ms against its bare matmul's 0.58). The buffer is
// the output's memory seen in the product's shape (a memref.reinterpret_cast, both
// contiguous), and the copy, now of the output onto itself, goes. Only where the
// argument is written by that copy alone, in the function's own block, after the
// buffer was made there, and followed by nothing but other outputs' copies (so no op
// writes the buffer after its value was copied out): jit_run refuses outputs that
// overlap inputs or each other, so writing the output before the end changes nothing
// that is read.

typedef struct place_walk {
  MlirOperation copies[16];
  int n;
} place_walk;

static bool contiguous_memref(MlirType t) {
  return mlirTypeIsAMemRef(t) && mlirShapedTypeHasStaticShape(t) &&
         mlirAffineMapIsIdentity(mlirMemRefTypeGetAffineMap(t));
}

// The static alloc whose view (or itself) `src` is, in block `b`; null if none.
static MlirOperation viewed_alloc(MlirValue src, MlirBlock b) {
  if (!mlirValueIsAOpResult(src)) return (MlirOperation){NULL};
  MlirOperation d = mlirOpResultGetOwner(src);
  if (jit__cpu_op_is(d, "memref.reshape") || jit__cpu_op_is(d, "memref.expand_shape") ||
      jit__cpu_op_is(d, "memref.collapse_shape")) {
    MlirValue base = mlirOperationGetOperand(d, 0);
    if (!mlirValueIsAOpResult(base)) return (MlirOperation){NULL};
    d = mlirOpResultGetOwner(base);
  }
  if (!jit__cpu_op_is(d, "memref.alloc") || mlirOperationGetNumOperands(d) != 0 ||
      !mlirBlockEqual(mlirOperationGetBlock(d), b) ||
      !contiguous_memref(mlirValueGetType(mlirOperationGetResult(d, 0))))
    return (MlirOperation){NULL};
  return d;
}

static MlirWalkResult find_result_copies(MlirOperation op, void *user) {
  place_walk *pw = user;
  if (!jit__cpu_op_is(op, "memref.copy") || pw->n >= 16) return MlirWalkResultAdvance;
  MlirValue src = mlirOperationGetOperand(op, 0), dst = mlirOperationGetOperand(op, 1);
  MlirBlock b = mlirOperationGetBlock(op);
  if (!mlirValueIsABlockArgument(dst) || !mlirBlockEqual(mlirBlockArgumentGetOwner(dst), b) ||
      !contiguous_memref(mlirValueGetType(dst)) || !only_use(dst, op))
    return MlirWalkResultAdvance;
  // Only other outputs' copies may follow (the emitter writes the outputs last): an op
  // after it could write the buffer, which would then be the output.
  for (MlirOperation o = mlirOperationGetNextInBlock(op); !mlirOperationIsNull(o);
       o = mlirOperationGetNextInBlock(o))
    if (!jit__cpu_op_is(o, "memref.copy") && !jit__cpu_op_is(o, "func.return"))
      return MlirWalkResultAdvance;
  MlirOperation a = viewed_alloc(src, b);
  if (mlirOperationIsNull(a)) return MlirWalkResultAdvance;
  MlirType at = mlirValueGetType(mlirOperationGetResult(a, 0)), dt = mlirValueGetType(dst);
  if (jit__cpu_shaped_bytes(at) != jit__cpu_shaped_bytes(dt) ||
      !mlirTypeEqual(mlirShapedTypeGetElementType(at), mlirShapedTypeGetElementType(dt)))
    return MlirWalkResultAdvance;
  pw->copies[pw->n++] = op;
  return MlirWalkResultAdvance;
}

int jit__cpu_results_in_place(MlirContext ctx, MlirOperation module) {
  place_walk pw;
  memset(&pw, 0, sizeof pw);
  mlirOperationWalk(module, find_result_copies, &pw, MlirWalkPreOrder);
  int done = 0;
  for (int k = 0; k < pw.n; k++) {
    MlirOperation copy = pw.copies[k];
    MlirValue dst = mlirOperationGetOperand(copy, 1);
    MlirOperation a = viewed_alloc(mlirOperationGetOperand(copy, 0), mlirOperationGetBlock(copy));
    if (mlirOperationIsNull(a)) continue;  // an earlier one took it
    MlirValue buf = mlirOperationGetResult(a, 0);
    MlirType t = mlirValueGetType(buf);
    int rank = (int)mlirShapedTypeGetRank(t);
    int64_t sizes[JIT_MAX_RANK + 2], strides[JIT_MAX_RANK + 2], step = 1;
    if (rank > JIT_MAX_RANK + 2) continue;
    for (int d = rank - 1; d >= 0; d--) {
      sizes[d] = mlirShapedTypeGetDimSize(t, d);
      strides[d] = step;
      step *= sizes[d];
    }
    MlirOperation view = jit__cpu_reinterpret_cast(ctx, mlirOperationGetNextInBlock(a), dst,
                                                   (MlirValue){NULL}, rank, sizes, strides);
    mlirValueReplaceAllUsesOfWith(buf, mlirOperationGetResult(view, 0));
    mlirOperationDestroy(a);
    mlirOperationDestroy(copy);
    done++;
  }
  return done;
}

void jit__cpu_plan_free(jit__cpu_plan *plan) {
  if (!plan) return;
  free(plan->script);
  plan->script = NULL;
}
