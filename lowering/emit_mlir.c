//===--- emit_mlir.c - a specialized graph as MLIR text --------------------===//
//
// Writes one func.func on static tensors for a jit__lgraph:
//
//   func.func @f(%a0: tensor<..>, ..., %r0: memref<..>, ...) {
//     <linalg on tensors>
//     bufferization.materialize_in_destination %vK in restrict writable %r0 : ...
//     return
//   }
//
// Text rather than C-API builders: it is what a user can read in a dump, what tests can
// compare, and it keeps this file free of MLIR contexts (so it is trivially
// thread-safe). Every intermediate uses tensor.empty() as its init so that
// linalg-fuse-elementwise-ops can fuse chains and eliminate-empty-tensors can make the
// final op of each output write straight into the caller's buffer.
//
// f16 is stored as f16 but computed in f32: generic bodies extend their operands and
// truncate the result once, and reductions and matmuls accumulate in f32, so an f16
// result differs from the f32 computation by one rounding only.
//
//===----------------------------------------------------------------------===//
#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "base/text.h"
#include "lowering/lower.h"

//===--- Names -------------------------------------------------------------===//

static const char *const jit__op_names[JIT__OP_COUNT_] = {
    [JIT__OP_INPUT] = "input",
    [JIT__OP_SCALAR] = "scalar",
    [JIT__OP_MATMUL] = "matmul",
    [JIT__OP_ADD] = "add",
    [JIT__OP_SUB] = "sub",
    [JIT__OP_MUL] = "mul",
    [JIT__OP_DIV] = "div",
    [JIT__OP_MAXIMUM] = "maximum",
    [JIT__OP_MINIMUM] = "minimum",
    [JIT__OP_NEG] = "neg",
    [JIT__OP_EXP] = "exp",
    [JIT__OP_LOG] = "log",
    [JIT__OP_TANH] = "tanh",
    [JIT__OP_SIGMOID] = "sigmoid",
    [JIT__OP_RELU] = "relu",
    [JIT__OP_GELU] = "gelu",
    [JIT__OP_SQRT] = "sqrt",
    [JIT__OP_RSQRT] = "rsqrt",
    [JIT__OP_REDUCE_SUM] = "reduce_sum",
    [JIT__OP_REDUCE_MAX] = "reduce_max",
    [JIT__OP_REDUCE_MEAN] = "reduce_mean",
    [JIT__OP_SOFTMAX] = "softmax",
    [JIT__OP_TRANSPOSE] = "transpose",
    [JIT__OP_RESHAPE] = "reshape",
};

const char *jit__op_name(jit__op op) {
  if ((int)op < 0 || op >= JIT__OP_COUNT_ || !jit__op_names[op]) return "unknown";
  return jit__op_names[op];
}

void jit__artifact_release(jit__artifact *artifact) {
  if (!artifact) return;
  free(artifact->object);
  artifact->object = NULL;
  artifact->object_size = 0;
}

//===--- Growable text buffer -------------------------------------------------===//

// Appends never fail visibly: an allocation failure sets `oom` and later appends are
// dropped, so emitters need no error plumbing and the caller checks once at the end.
//===--- Types and literals -------------------------------------------------===//

// Small strings returned by value so they can be used inline in a printf argument
// list; the largest (8 dims of 19 digits) fits with room to spare.
typedef struct str {
  char s[256];
} str;

static const char *elem_name(jit__dtype dt) { return dt == JIT__F16 ? "f16" : "f32"; }

static str shape_type(const char *kind, jit__dtype dt, int rank, const int64_t *dims) {
  str t;
  int n = snprintf(t.s, sizeof t.s, "%s<", kind);
  for (int i = 0; i < rank; i++)
    n += dims[i] < 0 ? snprintf(t.s + n, sizeof t.s - (size_t)n, "?x")
                     : snprintf(t.s + n, sizeof t.s - (size_t)n, "%lldx", (long long)dims[i]);
  snprintf(t.s + n, sizeof t.s - (size_t)n, "%s>", elem_name(dt));
  return t;
}

static str tensor_type(jit__dtype dt, int rank, const int64_t *dims) {
  return shape_type("tensor", dt, rank, dims);
}

// An MLIR float literal for `v` as a value of type `dt`. MLIR's float literal needs a
// '.' before any exponent ("1e+20" lexes as an integer), and has no spelling for inf
// or nan except the bit pattern in hex, so those and values that overflow `dt` are
// written as hex.
static str float_literal(double v, jit__dtype dt) {
  str t;
  bool f16 = dt == JIT__F16;
  if (f16 && fabs(v) >= 65520.0) v = v > 0 ? INFINITY : -INFINITY;  // rounds to inf
  if (!f16) v = (double)(float)v;  // print exactly the f32 the kernel will hold
  if (isnan(v)) {
    snprintf(t.s, sizeof t.s, "%s", f16 ? "0x7E00" : "0x7FC00000");
    return t;
  }
  if (isinf(v)) {
    snprintf(t.s, sizeof t.s, "%s",
             v > 0 ? (f16 ? "0x7C00" : "0x7F800000") : (f16 ? "0xFC00" : "0xFF800000"));
    return t;
  }
  char digits[64];
  snprintf(digits, sizeof digits, "%.17g", v);
  char *e = strchr(digits, 'e');
  if (strchr(digits, '.')) {
    snprintf(t.s, sizeof t.s, "%s", digits);
  } else if (e) {
    snprintf(t.s, sizeof t.s, "%.*s.0%s", (int)(e - digits), digits, e);
  } else {
    snprintf(t.s, sizeof t.s, "%s.0", digits);
  }
  return t;
}

//===--- Emitter state ---------------------------------------------------------===//

// The SSA index value of a `?` dim (symbolic mode): "%in0_d1", "%v7_t3", "%idx1".
typedef struct dimval {
  char s[40];
} dimval;

typedef struct emitter {
  jit__text tb;
  const jit__lgraph *g;
  const jit__emit_options *opt;
  bool symbolic;      // opt->symbolic: dims < 0 are `?` (see lower.h)
  dimval (*dv)[JIT_MAX_RANK];  // per node: the value of each `?` dim of its result
  bool dim_lost;      // a `?` dim had no value to give tensor.empty (a bug; reported)
  char (*names)[32];  // SSA name holding each node's value
  uint32_t cur;       // node being emitted
  int n_tmp;          // temporaries made for it so far
  bool named_batch;   // batched matmuls as named ops (jit__emit_mlir)
  // Per node: the value it was reshaped from, when a batched matmul's named op (of
  // rank flat_rank) made it (emit_named_matmul); an output written from there.
  struct flat_value {
    str name;
    int rank;
    int64_t dims[3];
  } *flat;
  // Per node: for a reduction with keepdims (CPU), the value before its unit dim was
  // put back, and that dim (emit_reduce); elementwise consumers read that instead.
  struct squeezed {
    str name;
    int axis;
    bool set;
  } *squeezed;
  uint8_t *mm_up, *mm_down;  // per node: steps to a matmul (matmul_distances)
} emitter;

// The name for the next value of the current node: its final value gets %v<i> so dumps
// read naturally; the steps on the way get %v<i>_t<k>.
static str value_name(emitter *e, bool final) {
  str t;
  if (final)
    snprintf(t.s, sizeof t.s, "%%v%u", e->cur);
  else
    snprintf(t.s, sizeof t.s, "%%v%u_t%d", e->cur, e->n_tmp++);
  return t;
}

// tensor.empty of `dims`; its `?` dims (symbolic mode) take their sizes from `dv`.
static void emit_empty(emitter *e, const char *res, jit__dtype dt, int rank,
                       const int64_t *dims, const dimval *dv) {
  jit__text_printf(&e->tb, "  %s = tensor.empty(", res);
  for (int d = 0, k = 0; d < rank; d++) {
    if (dims[d] >= 0) continue;
    if (!dv || !dv[d].s[0]) e->dim_lost = true;
    jit__text_printf(&e->tb, "%s%s", k++ ? ", " : "", dv ? dv[d].s : "");
  }
  jit__text_printf(&e->tb, ") : %s\n", tensor_type(dt, rank, dims).s);
}

// An f32 tensor of `rank`/`dims` filled with `init` (a literal), for accumulators.
static str emit_filled_acc(emitter *e, const char *init, int rank, const int64_t *dims,
                           const dimval *dv) {
  str empty = value_name(e, false), cst = value_name(e, false), acc = value_name(e, false);
  str ty = tensor_type(JIT__F32, rank, dims);
  emit_empty(e, empty.s, JIT__F32, rank, dims, dv);
  jit__text_printf(&e->tb, "  %s = arith.constant %s : f32\n", cst.s, init);
  jit__text_printf(&e->tb, "  %s = linalg.fill ins(%s : f32) outs(%s : %s) -> %s\n", acc.s, cst.s,
            empty.s, ty.s, ty.s);
  return acc;
}

//===--- linalg.generic -----------------------------------------------------------===//

// What a generic body computes, in f32, from its (extended) inputs x, y and, for
// reductions, the f32 accumulator `out`.
typedef enum body_kind {
  B_COPY,
  B_ADD, B_SUB, B_MUL, B_DIV, B_MAX, B_MIN,
  B_NEG, B_EXP, B_LOG, B_TANH, B_SIGMOID, B_RELU, B_GELU, B_SQRT, B_RSQRT,
  B_ACC_SUM,  // out + x
  B_ACC_MAX,  // max(out, x)
  B_ACC_MAXNUM,  // max(out, x) for softmax, as llvm.maxnum with no NaN checks (nnan:
                 // one vmaxps per vector, no test for NaN and no scalar tail; 64x1024
                 // in cache 17.5 -> 15.6 us). Whatever max a row with a NaN gets, the
                 // NaN turns the row all NaN through its exp and sum, as it should
  B_ACC_MAC,  // out + x * y
  B_EXP_SUB,  // exp(x - y)
  B_DIV_BY,   // x / constant (`by`, a literal)
  B_DIV_BY_VALUE,  // x / `by`, an f32 value defined outside the body (a `?` count)
} body_kind;

// One operand of a generic: map[d] is the loop index of operand dim d, or -1 for the
// constant 0 (a broadcast size-1 dim).
typedef struct gen_operand {
  const char *name;
  jit__dtype dt;
  int rank;
  const int64_t *dims;
  int map[JIT_MAX_RANK];
  const dimval *dv;  // the values of its `?` dims (symbolic mode); NULL: none
} gen_operand;

static void identity_map(gen_operand *op) {
  for (int d = 0; d < op->rank; d++) op->map[d] = d;
}

static void print_map(emitter *e, int n_loops, const gen_operand *op) {
  jit__text_printf(&e->tb, "affine_map<(");
  for (int l = 0; l < n_loops; l++) jit__text_printf(&e->tb, "%sd%d", l ? ", " : "", l);
  jit__text_printf(&e->tb, ") -> (");
  for (int d = 0; d < op->rank; d++) {
    if (op->map[d] < 0)
      jit__text_printf(&e->tb, "%s0", d ? ", " : "");
    else
      jit__text_printf(&e->tb, "%sd%d", d ? ", " : "", op->map[d]);
  }
  jit__text_printf(&e->tb, ")>");
}

// Body statements; returns the name of the f32 result. Names inside a region only need
// to be unique within it, so every body reuses %c*, %t*.
static const char *emit_body(emitter *e, body_kind kind, const char *x, const char *y,
                             const char *out, const char *by) {
  jit__text *tb = &e->tb;
  switch (kind) {
    case B_COPY:
      return x;
    case B_ADD: case B_SUB: case B_MUL: case B_DIV: case B_MAX: case B_MIN: {
      static const char *const ops[] = {"addf", "subf", "mulf", "divf", "maximumf",
                                        "minimumf"};
      jit__text_printf(tb, "    %%t0 = arith.%s %s, %s : f32\n", ops[kind - B_ADD], x, y);
      return "%t0";
    }
    case B_NEG:
      jit__text_printf(tb, "    %%t0 = arith.negf %s : f32\n", x);
      return "%t0";
    case B_EXP: case B_LOG: case B_TANH: case B_SQRT: case B_RSQRT: {
      const char *fn = kind == B_EXP ? "exp" : kind == B_LOG ? "log"
                       : kind == B_TANH ? "tanh" : kind == B_SQRT ? "sqrt" : "rsqrt";
      jit__text_printf(tb, "    %%t0 = math.%s %s : f32\n", fn, x);
      return "%t0";
    }
    case B_SIGMOID:
      jit__text_printf(tb,
                "    %%c1 = arith.constant 1.0 : f32\n"
                "    %%t0 = arith.negf %s : f32\n"
                "    %%t1 = math.exp %%t0 : f32\n"
                "    %%t2 = arith.addf %%c1, %%t1 : f32\n"
                "    %%t3 = arith.divf %%c1, %%t2 : f32\n",
                x);
      return "%t3";
    case B_RELU:
      jit__text_printf(tb,
                "    %%c0 = arith.constant 0.0 : f32\n"
                "    %%t0 = arith.maximumf %s, %%c0 : f32\n",
                x);
      return "%t0";
    case B_GELU:
      // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
      jit__text_printf(tb,
                "    %%c0 = arith.constant 0.5 : f32\n"
                "    %%c1 = arith.constant 1.0 : f32\n"
                "    %%c2 = arith.constant 0.044715 : f32\n"
                "    %%c3 = arith.constant 0.7978845608028654 : f32\n"
                "    %%t0 = arith.mulf %s, %s : f32\n"
                "    %%t1 = arith.mulf %%t0, %s : f32\n"
                "    %%t2 = arith.mulf %%c2, %%t1 : f32\n"
                "    %%t3 = arith.addf %s, %%t2 : f32\n"
                "    %%t4 = arith.mulf %%c3, %%t3 : f32\n"
                "    %%t5 = math.tanh %%t4 : f32\n"
                "    %%t6 = arith.addf %%c1, %%t5 : f32\n"
                "    %%t7 = arith.mulf %%c0, %s : f32\n"
                "    %%t8 = arith.mulf %%t7, %%t6 : f32\n",
                x, x, x, x, x);
      return "%t8";
    case B_ACC_SUM:
      jit__text_printf(tb, "    %%t0 = arith.addf %s, %s : f32\n", out, x);
      return "%t0";
    case B_ACC_MAX:
      jit__text_printf(tb, "    %%t0 = arith.maximumf %s, %s : f32\n", out, x);
      return "%t0";
    case B_ACC_MAXNUM:
      jit__text_printf(tb, "    %%t0 = arith.maxnumf %s, %s fastmath<nnan> : f32\n", out, x);
      return "%t0";
    case B_ACC_MAC:
      jit__text_printf(tb,
                "    %%t0 = arith.mulf %s, %s : f32\n"
                "    %%t1 = arith.addf %s, %%t0 : f32\n",
                x, y, out);
      return "%t1";
    case B_EXP_SUB:
      jit__text_printf(tb,
                "    %%t0 = arith.subf %s, %s : f32\n"
                "    %%t1 = math.exp %%t0 : f32\n",
                x, y);
      return "%t1";
    case B_DIV_BY:
      jit__text_printf(tb,
                "    %%c0 = arith.constant %s : f32\n"
                "    %%t9 = arith.divf %s, %%c0 : f32\n",
                by, x);
      return "%t9";
    case B_DIV_BY_VALUE:
      jit__text_printf(tb, "    %%t9 = arith.divf %s, %s : f32\n", x, by);
      return "%t9";
  }
  return x;
}

// `res` = linalg.generic over `n_loops` loops (`iters`[l] is 'p' or 'r'), reading
// `ins` and writing into `out` (whose name is the init tensor). Inputs are extended to
// f32 and the result truncated to out's dtype, except that a copy between equal types
// passes the value through.
static void emit_generic(emitter *e, const char *res, int n_loops, const char *iters,
                         const gen_operand *ins, int n_in, const gen_operand *out,
                         body_kind kind, const char *by) {
  jit__text *tb = &e->tb;
  jit__text_printf(tb, "  %s = linalg.generic {indexing_maps = [", res);
  for (int i = 0; i < n_in; i++) {
    print_map(e, n_loops, &ins[i]);
    jit__text_printf(tb, ", ");
  }
  print_map(e, n_loops, out);
  jit__text_printf(tb, "], iterator_types = [");
  for (int l = 0; l < n_loops; l++)
    jit__text_printf(tb, "%s\"%s\"", l ? ", " : "", iters[l] == 'r' ? "reduction" : "parallel");
  jit__text_printf(tb, "]} ins(");
  for (int i = 0; i < n_in; i++) jit__text_printf(tb, "%s%s", i ? ", " : "", ins[i].name);
  jit__text_printf(tb, " : ");
  for (int i = 0; i < n_in; i++)
    jit__text_printf(tb, "%s%s", i ? ", " : "", tensor_type(ins[i].dt, ins[i].rank, ins[i].dims).s);
  str out_ty = tensor_type(out->dt, out->rank, out->dims);
  jit__text_printf(tb, ") outs(%s : %s) {\n  ^bb0(", out->name, out_ty.s);
  for (int i = 0; i < n_in; i++) jit__text_printf(tb, "%%in%d: %s, ", i, elem_name(ins[i].dt));
  jit__text_printf(tb, "%%out: %s):\n", elem_name(out->dt));

  const char *result;
  char xs[2][8];  // the body's inputs; `result` may be one of them, used below
  if (kind == B_COPY && n_in == 1 && ins[0].dt == out->dt) {
    result = "%in0";
  } else {
    for (int i = 0; i < n_in && i < 2; i++) {
      if (ins[i].dt == JIT__F16) {
        jit__text_printf(tb, "    %%x%d = arith.extf %%in%d : f16 to f32\n", i, i);
        snprintf(xs[i], sizeof xs[i], "%%x%d", i);
      } else {
        snprintf(xs[i], sizeof xs[i], "%%in%d", i);
      }
    }
    // Accumulating outs are always f32, so %out never needs extending.
    result = emit_body(e, kind, xs[0], n_in > 1 ? xs[1] : "", "%out", by);
    if (out->dt == JIT__F16) {
      jit__text_printf(tb, "    %%y = arith.truncf %s : f32 to f16\n", result);
      result = "%y";
    }
  }
  jit__text_printf(tb, "    linalg.yield %s : %s\n  } -> %s\n", result, elem_name(out->dt),
            out_ty.s);
}

static gen_operand node_operand(emitter *e, uint32_t id) {
  const jit__node *n = &e->g->nodes[id];
  gen_operand op = {e->names[id], n->dtype, n->rank, n->dims, {0}, e->dv[id]};
  identity_map(&op);
  return op;
}

// Symbolic mode: the values of the `?` dims of a result over loops 0..rank-1 (its map
// the identity) into `dv`, each from an operand dim that the same loop walks.
static bool result_dims_from(emitter *e, const gen_operand *ins, int n_in, int rank,
                             const int64_t *dims, dimval *dv) {
  for (int d = 0; d < rank; d++) {
    if (dims[d] >= 0) continue;
    bool found = false;
    for (int i = 0; i < n_in && !found; i++)
      for (int k = 0; k < ins[i].rank && !found; k++)
        if (ins[i].map[k] == d && ins[i].dims[k] < 0 && ins[i].dv && ins[i].dv[k].s[0]) {
          dv[d] = ins[i].dv[k];
          found = true;
        }
    if (!found) return false;
  }
  return true;
}

// Whether operand dim `od` can be read by a loop of result dim `rd`: equal, or in
// symbolic mode a symbol against anything but the 1 that broadcasts (jit/'s
// broadcasting: a symbol meeting a size or another symbol must agree at run time).
static bool dims_agree(const emitter *e, int64_t od, int64_t rd) {
  return od == rd || (e->symbolic && (od < 0 || rd < 0) && od != 1);
}

//===--- Ops --------------------------------------------------------------------===//

static jit_status node_error(emitter *e, const char *what) {
  const jit__node *n = &e->g->nodes[e->cur];
  return JIT_ERR(JIT_INTERNAL, "emitting MLIR for graph '%s': node %u (%s): %s",
                 e->g->name ? e->g->name : "", e->cur, jit__op_name(n->op), what);
}

static str emit_reshape_to(emitter *e, const char *x, jit__dtype dt, int rank,
                           const int64_t *dims, int to_rank, const int64_t *to_dims,
                           bool final);

static bool same_dims(int ra, const int64_t *a, int rb, const int64_t *b) {
  return ra == rb && !memcmp(a, b, sizeof(int64_t) * (size_t)ra);
}

// An elementwise node that reads a batched matmul's result (e->flat) whole, and its
// other operands only along the dims that the named op kept (a bias over N, a scalar),
// computed in the named op's shape too, so that the strategy sees the matmul's
// consumer directly (a bias + activation epilogue fused into its register tiles);
// the node's own value is a reshape of that. False (nothing written) otherwise.
static bool emit_elementwise_flat(emitter *e, const jit__node *n, body_kind kind) {
  const struct flat_value *ref = NULL;
  for (int i = 0; i < n->n_operands && !ref; i++) {
    uint32_t id = n->operands[i];
    const jit__node *x = &e->g->nodes[id];
    if (e->flat[id].rank && same_dims(x->rank, x->dims, n->rank, n->dims)) ref = &e->flat[id];
  }
  if (!ref) return false;
  int fr = ref->rank, lead = n->rank - fr + 1;  // node dims [0, lead) are flat dim 0
  gen_operand ins[2];
  for (int i = 0; i < n->n_operands; i++) {
    uint32_t id = n->operands[i];
    const jit__node *x = &e->g->nodes[id];
    const struct flat_value *f = &e->flat[id];
    if (f->rank == fr && same_dims(x->rank, x->dims, n->rank, n->dims) &&
        same_dims(f->rank, f->dims, fr, ref->dims)) {
      ins[i] = (gen_operand){f->name.s, x->dtype, fr, ref->dims, {0}, NULL};
      identity_map(&ins[i]);
      continue;
    }
    ins[i] = node_operand(e, id);
    int off = n->rank - x->rank;
    if (off < 0) return false;
    for (int d = 0; d < x->rank; d++) {
      int nd = d + off;
      if (x->dims[d] == 1 && (nd < lead || n->dims[nd] != 1))
        ins[i].map[d] = -1;
      else if (nd >= lead && x->dims[d] == n->dims[nd])
        ins[i].map[d] = nd - lead + 1;
      else
        return false;
    }
  }
  str empty = value_name(e, false), flat = value_name(e, false);
  emit_empty(e, empty.s, n->dtype, fr, ref->dims, NULL);
  gen_operand out = {empty.s, n->dtype, fr, ref->dims, {0}, NULL};
  identity_map(&out);
  char iters[JIT_MAX_RANK + 1];
  memset(iters, 'p', sizeof iters);
  emit_generic(e, flat.s, fr, iters, ins, n->n_operands, &out, kind, NULL);
  struct flat_value *mine = &e->flat[e->cur];
  int64_t dims[3];
  memcpy(dims, ref->dims, sizeof dims);
  emit_reshape_to(e, flat.s, n->dtype, fr, dims, n->rank, n->dims, true);
  mine->name = flat;
  mine->rank = fr;
  memcpy(mine->dims, dims, sizeof dims);
  return true;
}

static jit_status emit_elementwise(emitter *e, const jit__node *n, body_kind kind) {
  if (e->named_batch && emit_elementwise_flat(e, n, kind)) return NULL;
  gen_operand ins[2];
  int64_t sq_dims[2][JIT_MAX_RANK];
  for (int i = 0; i < n->n_operands; i++) {
    ins[i] = node_operand(e, n->operands[i]);
    int off = n->rank - ins[i].rank;
    if (off < 0) return node_error(e, "operand has a higher rank than the result");
    // NumPy broadcasting: right-aligned; missing leading dims vanish from the map and a
    // size-1 dim against a larger one reads index 0.
    for (int d = 0; d < ins[i].rank; d++) {
      int64_t od = ins[i].dims[d], rd = n->dims[d + off];
      if (dims_agree(e, od, rd))
        ins[i].map[d] = d + off;
      else if (od == 1)
        ins[i].map[d] = -1;
      else
        return node_error(e, "operand shape does not broadcast to the result");
    }
    // A keepdims reduction is read without its unit dim: through the expand_shape that
    // puts it back, linalg-fuse-elementwise-ops moved the reshape up onto the
    // reduction's input, where it stopped the strategy's row loop from fusing the
    // reduction in (layernorm's mean of (x - mean)^2 read a whole (x - mean) made
    // before the loop: 12.4 ms at 4096x1024, one pass over x would take ~1.4).
    const struct squeezed *q = &e->squeezed[n->operands[i]];
    if (q->set) {
      gen_operand r = {q->name.s, ins[i].dt, ins[i].rank - 1, sq_dims[i], {0}, NULL};
      for (int d = 0, j = 0; d < ins[i].rank; d++) {
        if (d == q->axis) continue;
        sq_dims[i][j] = ins[i].dims[d];
        r.map[j++] = ins[i].map[d];
      }
      ins[i] = r;
    }
  }
  if (e->symbolic && !result_dims_from(e, ins, n->n_operands, n->rank, n->dims, e->dv[e->cur]))
    return node_error(e, "a `?` dim of the result has no operand dim to take its size from");
  str empty = value_name(e, false), res = value_name(e, true);
  emit_empty(e, empty.s, n->dtype, n->rank, n->dims, e->dv[e->cur]);
  gen_operand out = {empty.s, n->dtype, n->rank, n->dims, {0}, NULL};
  identity_map(&out);
  char iters[JIT_MAX_RANK + 1];
  memset(iters, 'p', sizeof iters);
  emit_generic(e, res.s, n->rank, iters, ins, n->n_operands, &out, kind, NULL);
  return NULL;
}

static int64_t num_elements(int rank, const int64_t *dims) {
  int64_t n = 1;
  for (int i = 0; i < rank; i++) n *= dims[i];
  return n;
}

static void print_int_list(emitter *e, int n, const int64_t *v) {
  jit__text_printf(&e->tb, "[");
  for (int i = 0; i < n; i++) jit__text_printf(&e->tb, "%s%lld", i ? ", " : "", (long long)v[i]);
  jit__text_printf(&e->tb, "]");
}

// A shape as output_shape lists it: sizes, and the values of `?` dims from `dv`.
static void print_shape_list(emitter *e, int rank, const int64_t *dims, const dimval *dv) {
  jit__text_printf(&e->tb, "[");
  for (int i = 0; i < rank; i++) {
    if (dims[i] >= 0) {
      jit__text_printf(&e->tb, "%s%lld", i ? ", " : "", (long long)dims[i]);
      continue;
    }
    if (!dv || !dv[i].s[0]) e->dim_lost = true;
    jit__text_printf(&e->tb, "%s%s", i ? ", " : "", dv ? dv[i].s : "");
  }
  jit__text_printf(&e->tb, "]");
}

// `x` (`rank`/`dims`, type `from`) converted to `to` (extended, or rounded once).
static str emit_convert(emitter *e, const char *x, jit__dtype from, jit__dtype to, int rank,
                        const int64_t *dims, const dimval *dv, bool final) {
  str empty = value_name(e, false), res = value_name(e, final);
  emit_empty(e, empty.s, to, rank, dims, dv);
  gen_operand in = {x, from, rank, dims, {0}, NULL};
  gen_operand out = {empty.s, to, rank, dims, {0}, NULL};
  identity_map(&in);
  identity_map(&out);
  char iters[JIT_MAX_RANK];
  memset(iters, 'p', sizeof iters);
  emit_generic(e, res.s, rank, iters, &in, 1, &out, B_COPY, NULL);
  return res;
}

// The f16 result of an f32 accumulator `acc`: one rounding, after the sum.
static str emit_f16_result(emitter *e, const char *acc, int rank, const int64_t *dims,
                           const dimval *dv, bool final) {
  return emit_convert(e, acc, JIT__F32, JIT__F16, rank, dims, dv, final);
}

// `x` (`rank`/`dims`, type `dt`) as a new value of shape `to_rank`/`to_dims` (the same
// elements in the same order), through tensor.reshape rather than collapse_shape /
// expand_shape: linalg-fuse-elementwise-ops (compile_cpu.c) propagates those through
// a matmul, turning it back into a generic of more loops, which no strategy tiles.
// tensor.reshape bufferizes to a view (memref.reshape): nothing is copied.
static str emit_reshape_to(emitter *e, const char *x, jit__dtype dt, int rank,
                           const int64_t *dims, int to_rank, const int64_t *to_dims,
                           bool final) {
  str shape = value_name(e, false), res = value_name(e, final);
  jit__text_printf(&e->tb, "  %s = arith.constant dense<", shape.s);
  print_int_list(e, to_rank, to_dims);
  jit__text_printf(&e->tb, "> : tensor<%dxi64>\n", to_rank);
  jit__text_printf(&e->tb, "  %s = tensor.reshape %s(%s) : (%s, tensor<%dxi64>) -> %s\n", res.s,
                   x, shape.s, tensor_type(dt, rank, dims).s, to_rank,
                   tensor_type(dt, to_rank, to_dims).s);
  return res;
}

// A matmul as a named op, which the CPU strategy tiles and vectorizes. The operands'
// first `p` batch dims (equal on both) are merged into the one batch dim of a
// linalg.batch_matmul (p > 0), and x's next `fold` batch dims, where W's are 1 or
// absent, into x's rows; with p = 0 it is one linalg.matmul. So x W with x batched is
// one matmul over batch x M rows (which packs W once); equal batch dims a batch of
// matmuls; and in between, grouped-query attention's q (B, H, G, S, D) against
// k^T (B, H, 1, D, S) a batch of B H matmuls of G S rows. Operands and result go
// through emit_reshape_to where the ranks differ, and e->flat keeps the named op's
// result for the consumers (emit_elementwise_flat) and outputs (emit_graph). With f16
// inputs the named op extends them to the f32 accumulator itself.
static jit_status emit_named_matmul(emitter *e, const jit__node *n, const gen_operand *a,
                                    const gen_operand *b, int p, int fold) {
  int r = n->rank;
  bool f16 = n->dtype == JIT__F16;
  int64_t ad[3], bd[3], cd[3];
  const char *an = a->name, *bn = b->name;
  str as, bs;
  int cr = p ? 3 : 2;  // rank of the named op's result
  int o = cr - 2;      // its row dim
  if (p) ad[0] = bd[0] = cd[0] = num_elements(p, a->dims);
  ad[o] = cd[o] = num_elements(fold, a->dims + p) * a->dims[a->rank - 2];
  ad[o + 1] = a->dims[a->rank - 1];
  bd[o] = b->dims[b->rank - 2];
  bd[o + 1] = cd[o + 1] = b->dims[b->rank - 1];
  if (a->rank != cr) {
    as = emit_reshape_to(e, an, a->dt, a->rank, a->dims, cr, ad, false);
    an = as.s;
  }
  if (b->rank != cr) {
    bs = emit_reshape_to(e, bn, b->dt, b->rank, b->dims, cr, bd, false);
    bn = bs.s;
  }
  // f16 x f16 with more than one row: A extended to f32 by its own elementwise op,
  // which the strategy fuses into the matmul's row tiles (a row tile of A converted
  // once per n block, into a small buffer). The register tiles then broadcast f32
  // elements of A from memory instead of converting each one (8 conversions per 16
  // FMAs at 8x32); B stays f16, converted a vector at a time. 512^3 went from 70 to
  // ~130 GFLOP/s (f32: ~150), 1024^3 from 68 to ~115, 8x768x3072 from 59 to 70.
  jit__dtype a_dt = a->dt;
  if (f16 && e->named_batch && cd[cr - 2] > 1) {
    as = emit_convert(e, an, JIT__F16, JIT__F32, cr, ad, NULL, false);
    an = as.s;
    a_dt = JIT__F32;
  }
  bool reshape = cr != r;
  // Without a reshape the result is n's (a 2-D matmul in symbolic mode: its `?` dims).
  const dimval *cdv = reshape ? NULL : e->dv[e->cur];
  str acc = emit_filled_acc(e, "0.0", cr, cd, cdv);
  str mm = value_name(e, !f16 && !reshape);
  str acc_ty = tensor_type(JIT__F32, cr, cd);
  jit__text_printf(&e->tb, "  %s = linalg.%s ins(%s, %s : %s, %s) outs(%s : %s) -> %s\n",
                   mm.s, cr == 2 ? "matmul" : "batch_matmul", an, bn,
                   tensor_type(a_dt, cr, ad).s, tensor_type(b->dt, cr, bd).s, acc.s,
                   acc_ty.s, acc_ty.s);
  str res = f16 ? emit_f16_result(e, mm.s, cr, cd, cdv, !reshape) : mm;
  if (reshape) {
    emit_reshape_to(e, res.s, n->dtype, cr, cd, r, n->dims, true);
    struct flat_value *f = &e->flat[e->cur];
    f->name = res;
    f->rank = cr;
    memcpy(f->dims, cd, sizeof cd);
  }
  return NULL;
}

// For x (`a`, the result's rank) times W (`b`) making `n`: the number p of leading batch
// dims equal on both, when the rest are x's only (W's 1 or missing); -1 otherwise.
static int matmul_batch_prefix(const gen_operand *a, const gen_operand *b,
                               const jit__node *n) {
  int nb = n->rank - 2, off = nb - (b->rank - 2), p = 0;
  if (a->rank != n->rank) return -1;
  for (int d = 0; d < nb; d++) {
    int64_t bdim = d >= off ? b->dims[d - off] : 1;
    if (a->dims[d] != n->dims[d]) return -1;
    if (d == p && bdim == n->dims[d])
      p++;
    else if (bdim != 1)
      return -1;
  }
  // A batch of one matmul (x (1, 1, K) times a 2-D W) is that matmul: its rows fold.
  return num_elements(p, n->dims) == 1 ? 0 : p;
}

// Matmul operand `op` copied out to the batch dims of the result `n` (its own last two
// dims kept), NumPy-style: a missing or size-1 dim repeats. `dims` receives the shape.
static str emit_batch_broadcast(emitter *e, const gen_operand *op, const jit__node *n,
                                int64_t *dims) {
  int r = n->rank, nb = r - 2, off = nb - (op->rank - 2);
  memcpy(dims, n->dims, sizeof(int64_t) * nb);
  dims[nb] = op->dims[op->rank - 2];
  dims[nb + 1] = op->dims[op->rank - 1];
  gen_operand in = *op;
  for (int d = 0; d < op->rank - 2; d++) in.map[d] = op->dims[d] == 1 ? -1 : d + off;
  in.map[op->rank - 2] = nb;
  in.map[op->rank - 1] = nb + 1;
  str empty = value_name(e, false), res = value_name(e, false);
  emit_empty(e, empty.s, op->dt, r, dims, NULL);
  gen_operand out = {empty.s, op->dt, r, dims, {0}, NULL};
  identity_map(&out);
  char iters[JIT_MAX_RANK];
  memset(iters, 'p', sizeof iters);
  emit_generic(e, res.s, r, iters, &in, 1, &out, B_COPY, NULL);
  return res;
}

// x (`xd`: rows x K, or a batch of them when `cr` is 3) times W^T for W stored `wd`
// (cols x K): a linalg.matmul (linalg.batch_matmul) reading W through the transposed
// map into `cd`, the f16 result rounded once, then reshaped to `n`'s dims where they
// differ; with `flat`, e->flat keeps the op's result for the consumers, as in
// emit_named_matmul.
static void emit_bt_op(emitter *e, const jit__node *n, int cr, const char *xn, jit__dtype xdt,
                       const int64_t *xd, const char *wn, jit__dtype wdt, const int64_t *wd,
                       const int64_t *cd, bool flat) {
  int r = n->rank;
  bool f16 = n->dtype == JIT__F16;
  bool reshape = r != cr || memcmp(cd, n->dims, sizeof(int64_t) * (size_t)cr) != 0;
  str acc = emit_filled_acc(e, "0.0", cr, cd, NULL);
  str mm = value_name(e, !f16 && !reshape);
  str acc_ty = tensor_type(JIT__F32, cr, cd);
  jit__text_printf(&e->tb,
                   cr == 3 ? "  %s = linalg.batch_matmul indexing_maps = ["
                             "affine_map<(b, m, n, k) -> (b, m, k)>, "
                             "affine_map<(b, m, n, k) -> (b, n, k)>, "
                             "affine_map<(b, m, n, k) -> (b, m, n)>] "
                           : "  %s = linalg.matmul indexing_maps = ["
                             "affine_map<(m, n, k) -> (m, k)>, affine_map<(m, n, k) -> (n, k)>, "
                             "affine_map<(m, n, k) -> (m, n)>] ",
                   mm.s);
  jit__text_printf(&e->tb, "ins(%s, %s : %s, %s) outs(%s : %s) -> %s\n", xn, wn,
                   tensor_type(xdt, cr, xd).s, tensor_type(wdt, cr, wd).s, acc.s, acc_ty.s,
                   acc_ty.s);
  str res = f16 ? emit_f16_result(e, mm.s, cr, cd, NULL, !reshape) : mm;
  if (!reshape) return;
  emit_reshape_to(e, res.s, n->dtype, cr, cd, r, n->dims, true);
  if (!flat) return;
  struct flat_value *f = &e->flat[e->cur];
  f->name = res;
  f->rank = cr;
  memcpy(f->dims, cd, sizeof(int64_t) * (size_t)cr);
}

// x (`a`, its batch dims folded into `rows`) times W^T where `bn` transposes W (N x K):
// emit_bt_op on a 2-D view of x (emit_matmul says when).
static jit_status emit_matmul_bt(emitter *e, const jit__node *n, const gen_operand *a,
                                 int64_t rows, const jit__node *bn) {
  const jit__node *w = &e->g->nodes[bn->operands[0]];
  int64_t ad[2] = {rows, a->dims[a->rank - 1]}, cd[2] = {rows, n->dims[n->rank - 1]};
  const char *an = a->name;
  str as;
  if (a->rank != 2) {
    as = emit_reshape_to(e, an, a->dt, a->rank, a->dims, 2, ad, false);
    an = as.s;
  }
  emit_bt_op(e, n, 2, an, a->dt, ad, e->names[bn->operands[0]], w->dtype, w->dims, cd, true);
  return NULL;
}

// A batch of x W^T where `bn` transposes the last two dims of W (batch..., N, K), all
// batch dims equal on both: emit_bt_op's linalg.batch_matmul over the merged batch
// (cpu_strategy.c, plan_batch_dot), through reshaped views where the batch has more
// than one dim.
static jit_status emit_batch_matmul_bt(emitter *e, const jit__node *n, const gen_operand *a,
                                       const jit__node *bn) {
  int r = n->rank;
  const jit__node *w = &e->g->nodes[bn->operands[0]];
  int64_t bt = num_elements(r - 2, n->dims), m = n->dims[r - 2], nn = n->dims[r - 1];
  int64_t k = a->dims[r - 1];
  int64_t ad[3] = {bt, m, k}, wd[3] = {bt, nn, k}, cd[3] = {bt, m, nn};
  const char *an = a->name, *wn = e->names[bn->operands[0]];
  str as, ws;
  if (r != 3) {
    as = emit_reshape_to(e, an, a->dt, r, a->dims, 3, ad, false);
    ws = emit_reshape_to(e, wn, w->dtype, r, w->dims, 3, wd, false);
    an = as.s;
    wn = ws.s;
  }
  emit_bt_op(e, n, 3, an, a->dt, ad, wn, w->dtype, wd, cd, true);
  return NULL;
}

// Whether x (`a`) times `b` making `n` is emit_matvec's: b a 2-D vector (K x 1) and K
// of 256 or more (the 2-D dot products' bound), or a batch of vectors with all batch
// dims equal on x, b and the result, and K of 256 or more (f16: 64; f32 12x1000x64
// times 12x64x1 took 160 us against 128 unplanned on one thread, 52 against 129 on 2).
static bool is_matvec(const gen_operand *a, const gen_operand *b, const jit__node *n) {
  int64_t k = a->dims[a->rank - 1];
  if (b->rank == 2) return k >= 256 && b->dims[1] == 1;
  if (a->rank != n->rank || b->rank != n->rank || k < (a->dt == JIT__F16 ? 64 : 256))
    return false;
  for (int d = 0; d < n->rank - 2; d++)
    if (a->dims[d] != n->dims[d] || b->dims[d] != n->dims[d]) return false;
  return true;
}

// x (..., M, K) times a vector w (K x 1, or batched as x is: (..., K, 1)): dot products
// of x's rows with w, as w^T x^T, a one-row x W^T that reads x through the transposed
// map: plan_matmul_bt's dot products split across threads over x's rows (x's batch
// dims folded into them when w is 2-D), or plan_batch_dot's for a batch. 128x768 16 ->
// 5.8 us, 4096x1024 0.82 -> 0.65 ms (2 threads 0.86 -> 0.35), 4x128x768 times 4x768x1
// 32 -> 24 us (f16 93 -> 18), times a 2-D 768x1 63 -> 24. As a matmul with N = 1 its
// register tiles were columns of one lane, unthreaded, and a batch of them was not
// planned at all.
static jit_status emit_matvec(emitter *e, const jit__node *n, const gen_operand *a,
                              const gen_operand *b) {
  bool batch = b->rank > 2;
  int r = n->rank, cr = batch ? 3 : 2;
  int64_t k = a->dims[a->rank - 1];
  int64_t bt = batch ? num_elements(r - 2, n->dims) : 1;
  int64_t rows = batch ? n->dims[r - 2] : num_elements(a->rank - 1, a->dims);
  int64_t wd[3] = {bt, 1, k}, xd[3] = {bt, rows, k}, cd[3] = {bt, 1, rows};
  const int64_t *w3 = batch ? wd : wd + 1, *x3 = batch ? xd : xd + 1, *c3 = batch ? cd : cd + 1;
  str ws = emit_reshape_to(e, b->name, b->dt, b->rank, b->dims, cr, w3, false);
  const char *xn = a->name;
  str xs;
  if (a->rank != cr) {
    xs = emit_reshape_to(e, xn, a->dt, a->rank, a->dims, cr, x3, false);
    xn = xs.s;
  }
  // (1, rows) and n's (rows, 1) differ in dims: no e->flat.
  emit_bt_op(e, n, cr, ws.s, b->dt, w3, xn, a->dt, x3, c3, false);
  return NULL;
}

// Whether `bn` transposes the last two dims of a rank-`r` value and nothing else, and
// `a` (x) and W have the batch dims of the result `n`.
static bool swaps_last_two(const jit__node *bn, const gen_operand *a, const jit__node *n,
                           const emitter *e) {
  int r = n->rank;
  if (bn->op != JIT__OP_TRANSPOSE || bn->rank != r || a->rank != r || r < 3) return false;
  const jit__node *w = &e->g->nodes[bn->operands[0]];
  for (int d = 0; d < r - 2; d++)
    if (bn->perm[d] != d || a->dims[d] != n->dims[d] || w->dims[d] != n->dims[d]) return false;
  return bn->perm[r - 2] == r - 1 && bn->perm[r - 1] == r - 2;
}

// Declared in lower.h: up to 17 rows (plan_matmul_bt); f16 only where its tiles are
// dot products (its `dot`, with L = 16 on AVX-512 and 8 on AVX2), as f16's 16x16
// transposes cost more than a transposed copy of W.
bool jit__cpu_bt_map(int64_t rows, int64_t k, bool f16) {
  return rows <= 17 && (!f16 || (k % 16 == 0 && k >= (rows <= 4 ? 32 : rows <= 12 ? 64 : 128)));
}

// The maps of a matmul's operands `ab` over the loops batch..., m, n, k: operand batch
// dims broadcast NumPy-style.
static jit_status matmul_maps(emitter *e, const jit__node *n, gen_operand *ab) {
  int nb = n->rank - 2;
  for (int i = 0; i < 2; i++) {
    gen_operand *op = &ab[i];
    int ob = op->rank - 2, off = nb - ob;
    for (int d = 0; d < ob; d++) {
      int64_t od = op->dims[d], rd = n->dims[d + off];
      if (dims_agree(e, od, rd))
        op->map[d] = d + off;
      else if (od == 1)
        op->map[d] = -1;
      else
        return node_error(e, "matmul batch dims do not broadcast");
    }
  }
  ab[0].map[ab[0].rank - 2] = nb;      // m
  ab[0].map[ab[0].rank - 1] = nb + 2;  // k
  ab[1].map[ab[1].rank - 2] = nb + 2;  // k
  ab[1].map[ab[1].rank - 1] = nb + 1;  // n
  return NULL;
}

static jit_status emit_matmul(emitter *e, const jit__node *n) {
  gen_operand a = node_operand(e, n->operands[0]), b = node_operand(e, n->operands[1]);
  int r = n->rank;
  if (a.rank < 2 || b.rank < 2 || r < 2) return node_error(e, "matmul needs rank >= 2");
  int64_t m = a.dims[a.rank - 2], k = a.dims[a.rank - 1], nn = b.dims[b.rank - 1];
  if (!dims_agree(e, b.dims[b.rank - 2], k) || n->dims[r - 2] != m || n->dims[r - 1] != nn)
    return node_error(e, "matmul shapes do not agree");
  int nb = r - 2;  // batch dims of the result
  if (a.rank - 2 > nb || b.rank - 2 > nb)
    return node_error(e, "matmul operand has more batch dims than the result");
  if (e->symbolic) {
    gen_operand ab[2] = {a, b};
    JIT_PROPAGATE(matmul_maps(e, n, ab));
    if (!result_dims_from(e, ab, 2, r, n->dims, e->dv[e->cur]))
      return node_error(e, "a `?` dim of the result has no operand dim to take its size from");
  }

  bool f16 = n->dtype == JIT__F16;
  // x W^T (a PyTorch Linear's weight, N x K) with up to 17 rows: linalg.matmul reading
  // the transpose's input through a transposed map (cpu_strategy.c, plan_matmul_bt),
  // instead of a transposed copy of W per call: 1x768x3072 0.40 ms against 2.5,
  // 8x768x3072 0.72 against 2.0, 16x768x3072 1.2 against 2.8, 17x768x3072 (the most
  // rows the GEMV-like path takes, too few to pack B) 1.1 against 2.5. With more rows the
  // matmul packs B, from W directly (plan_packed): 64x768x3072 2.5 ms, against 4.1
  // through the transposed map. The transpose node's own value is then unused unless
  // something else reads it. f16 when K is a multiple of 16 and at least 32 (64 above
  // 4 rows, 128 above 12), where the strategy's tiles are dot products on AVX-512 and
  // AVX2 (plan_matmul_dot; the rule is jit__cpu_bt_map, which the strategy also applies
  // to imported modules): 1x768x3072 0.18 ms against 1.0 for the transposed copy,
  // 8x768x3072 0.48 against 1.3. A batched x (a decode step's (B, 1, D)) is its rows:
  // 4x1x768 times W^T took 2.9 ms, against 0.44 for 4x768.
  const jit__node *bn = &e->g->nodes[n->operands[1]];
  int64_t rows = e->named_batch ? num_elements(a.rank - 1, a.dims) : 0;
  if (e->named_batch && b.rank == 2 && bn->op == JIT__OP_TRANSPOSE && bn->rank == 2 &&
      bn->perm[0] == 1 && bn->perm[1] == 0 && jit__cpu_bt_map(rows, k, f16))
    return emit_matmul_bt(e, n, &a, rows, bn);
  if (e->named_batch && nn == 1 && k % 16 == 0 && is_matvec(&a, &b, n))
    return emit_matvec(e, n, &a, &b);
  if (r == 2 && a.rank == 2 && b.rank == 2) return emit_named_matmul(e, n, &a, &b, 0, 0);
  // A batch of x W^T with W stored (batch..., N, K) and up to 4 rows (a decode step's
  // q K^T against a (B, H, S, D) key cache): dot products along k, no copy of W
  // transposed per call (12x1x64 against 12x1024x64 keys: 326 -> 153 us, 2 threads
  // 351 -> 60; K stored (B, D, S) 98).
  if (e->named_batch && m <= 4 && k % 16 == 0 && swaps_last_two(bn, &a, n, e))
    return emit_batch_matmul_bt(e, n, &a, bn);
  if (e->named_batch) {
    // Leading batch dims equal on both operands, then dims where only x has them (W's
    // are 1 or missing): a batch of matmuls over the first, the rest more rows. Batch
    // dims that broadcast otherwise (x's 1 against W's B, a 2-D x against a batched W,
    // W's 1 before an equal dim) are copied out to the result's first: x, then W if
    // that is not enough. A copy of x per batch costs M K of the M K N multiply-adds
    // (128x768 against 4x768x768: 4.2 ms, against 375 as the generic's loops).
    int64_t xd[JIT_MAX_RANK], wd[JIT_MAX_RANK];
    str xs, ws;
    int p = matmul_batch_prefix(&a, &b, n);
    bool x_full = a.rank == r && memcmp(a.dims, n->dims, sizeof(int64_t) * nb) == 0;
    if (p < 0 && !x_full) {
      xs = emit_batch_broadcast(e, &a, n, xd);
      a = (gen_operand){xs.s, a.dt, r, xd, {0}, NULL};
      p = matmul_batch_prefix(&a, &b, n);
    }
    if (p < 0) {
      ws = emit_batch_broadcast(e, &b, n, wd);
      b = (gen_operand){ws.s, b.dt, r, wd, {0}, NULL};
      p = nb;
    }
    return emit_named_matmul(e, n, &a, &b, p, nb - p);
  }
  gen_operand ins[2] = {a, b};
  JIT_PROPAGATE(matmul_maps(e, n, ins));
  dimval *dv = e->dv[e->cur];
  str acc = emit_filled_acc(e, "0.0", r, n->dims, dv);
  str mm = value_name(e, !f16);
  gen_operand out = {acc.s, JIT__F32, r, n->dims, {0}, NULL};
  identity_map(&out);
  char iters[JIT_MAX_RANK + 2];
  memset(iters, 'p', sizeof iters);
  iters[nb + 2] = 'r';
  emit_generic(e, mm.s, r + 1, iters, ins, 2, &out, B_ACC_MAC, NULL);
  if (f16) emit_f16_result(e, mm.s, r, n->dims, dv, true);
  return NULL;
}

// Reduces `x` over `axis` into a fresh f32 accumulator (starting at `init`) of the
// operand's shape without that dim, which `red_dims` receives.
static str emit_reduce_f32(emitter *e, const gen_operand *x, int axis, body_kind kind,
                           const char *init, int64_t *red_dims, dimval *red_dv, bool final) {
  for (int d = 0, j = 0; d < x->rank; d++) {
    if (d == axis) continue;
    if (x->dv) red_dv[j] = x->dv[d];
    red_dims[j++] = x->dims[d];
  }
  str acc = emit_filled_acc(e, init, x->rank - 1, red_dims, red_dv);
  gen_operand out = {acc.s, JIT__F32, x->rank - 1, red_dims, {0}, NULL};
  for (int d = 0, j = 0; d < x->rank; d++)
    if (d != axis) out.map[j++] = d;
  char iters[JIT_MAX_RANK];
  memset(iters, 'p', sizeof iters);
  iters[axis] = 'r';
  str res = value_name(e, final);
  emit_generic(e, res.s, x->rank, iters, x, 1, &out, kind, NULL);
  return res;
}

static jit_status emit_reduce(emitter *e, const jit__node *n) {
  gen_operand x = node_operand(e, n->operands[0]);
  int axis = n->axis;
  if (axis < 0 || axis >= x.rank) return node_error(e, "reduction axis out of range");
  int rr = x.rank - 1;
  if (n->rank != (n->keepdims ? x.rank : rr)) return node_error(e, "reduction result rank");
  for (int d = 0, j = 0; d < x.rank; d++) {
    if (d == axis) {
      if (n->keepdims && n->dims[j++] != 1) return node_error(e, "kept dim is not 1");
      continue;
    }
    if (n->dims[j++] != x.dims[d]) return node_error(e, "reduction result shape");
  }
  bool is_max = n->op == JIT__OP_REDUCE_MAX, is_mean = n->op == JIT__OP_REDUCE_MEAN;
  bool post = is_mean || n->dtype == JIT__F16;  // a generic after the accumulation

  int64_t red_dims[JIT_MAX_RANK];
  dimval red_dv[JIT_MAX_RANK];
  // -inf is 0xFF800000: MLIR has no decimal spelling for it.
  str cur = emit_reduce_f32(e, &x, axis, is_max ? B_ACC_MAX : B_ACC_SUM,
                            is_max ? "0xFF800000" : "0.0", red_dims, red_dv,
                            !post && !n->keepdims);
  if (post) {
    // The mean divides by the reduced dim: a literal, or its `?` size as an f32 value.
    body_kind kind = is_mean ? B_DIV_BY : B_COPY;
    str by = float_literal((double)x.dims[axis], JIT__F32);
    if (is_mean && x.dims[axis] < 0) {
      str i64 = value_name(e, false);
      by = value_name(e, false);
      jit__text_printf(&e->tb, "  %s = arith.index_cast %s : index to i64\n", i64.s,
                       x.dv[axis].s);
      jit__text_printf(&e->tb, "  %s = arith.sitofp %s : i64 to f32\n", by.s, i64.s);
      kind = B_DIV_BY_VALUE;
    }
    str empty = value_name(e, false), res = value_name(e, !n->keepdims);
    emit_empty(e, empty.s, n->dtype, rr, red_dims, red_dv);
    gen_operand in = {cur.s, JIT__F32, rr, red_dims, {0}, NULL};
    gen_operand out = {empty.s, n->dtype, rr, red_dims, {0}, NULL};
    identity_map(&in);
    identity_map(&out);
    char iters[JIT_MAX_RANK];
    memset(iters, 'p', sizeof iters);
    emit_generic(e, res.s, rr, iters, &in, 1, &out, kind, by.s);
    cur = res;
  }
  dimval *dv = e->dv[e->cur];
  for (int j = 0; j < rr; j++) dv[n->keepdims && j >= axis ? j + 1 : j] = red_dv[j];
  if (n->keepdims) {
    if (e->named_batch && rr > 0) {
      struct squeezed *q = &e->squeezed[e->cur];
      q->name = cur;
      q->axis = axis;
      q->set = true;
    }
    // Re-insert the size-1 dim by gluing it to a neighbour's reassociation group;
    // from rank 0 the reassociation is empty.
    str res = value_name(e, true);
    jit__text_printf(&e->tb, "  %s = tensor.expand_shape %s [", res.s, cur.s);
    for (int j = 0; j < rr; j++) {
      int lo = j < axis ? j : j + 1, hi = lo;
      if (j == axis) lo = axis;                // [axis, axis + 1]
      if (j == rr - 1 && axis == rr) hi = rr;  // the last group takes a trailing unit dim
      jit__text_printf(&e->tb, "%s[", j ? ", " : "");
      for (int d = lo; d <= hi; d++) jit__text_printf(&e->tb, "%s%d", d > lo ? ", " : "", d);
      jit__text_printf(&e->tb, "]");
    }
    jit__text_printf(&e->tb, "] output_shape ");
    print_shape_list(e, n->rank, n->dims, dv);
    jit__text_printf(&e->tb, " : %s into %s\n", tensor_type(n->dtype, rr, red_dims).s,
              tensor_type(n->dtype, n->rank, n->dims).s);
  }
  return NULL;
}

static jit_status emit_softmax(emitter *e, const jit__node *n) {
  gen_operand x = node_operand(e, n->operands[0]);
  int axis = n->axis, r = x.rank;
  if (axis < 0 || axis >= r || n->rank != r) return node_error(e, "softmax axis or rank");
  int64_t red_dims[JIT_MAX_RANK];
  dimval red_dv[JIT_MAX_RANK], *dv = e->dv[e->cur];
  memcpy(dv, x.dv, sizeof(dimval) * JIT_MAX_RANK);
  char iters[JIT_MAX_RANK];
  memset(iters, 'p', sizeof iters);

  // exp(x - max) keeps every exponent <= 0, so large inputs cannot overflow.
  str mx = emit_reduce_f32(e, &x, axis, B_ACC_MAXNUM, "0xFF800000", red_dims, red_dv, false);
  gen_operand red = {mx.s, JIT__F32, r - 1, red_dims, {0}, NULL};
  for (int d = 0, j = 0; d < r; d++)
    if (d != axis) red.map[j++] = d;

  str ex_empty = value_name(e, false), ex = value_name(e, false);
  emit_empty(e, ex_empty.s, JIT__F32, r, x.dims, dv);
  gen_operand ex_out = {ex_empty.s, JIT__F32, r, x.dims, {0}, NULL};
  identity_map(&ex_out);
  gen_operand ins[2] = {x, red};
  emit_generic(e, ex.s, r, iters, ins, 2, &ex_out, B_EXP_SUB, NULL);

  gen_operand ex_in = {ex.s, JIT__F32, r, x.dims, {0}, dv};
  identity_map(&ex_in);
  str sum = emit_reduce_f32(e, &ex_in, axis, B_ACC_SUM, "0.0", red_dims, red_dv, false);
  red.name = sum.s;

  str empty = value_name(e, false), res = value_name(e, true);
  emit_empty(e, empty.s, n->dtype, r, n->dims, dv);
  gen_operand out = {empty.s, n->dtype, r, n->dims, {0}, NULL};
  identity_map(&out);
  gen_operand ins2[2] = {ex_in, red};
  emit_generic(e, res.s, r, iters, ins2, 2, &out, B_DIV, NULL);
  return NULL;
}

// Node e->cur is the same value as node `src` (an identity transpose or reshape).
// Operands come before their users, so src < cur: the two names never overlap.
static void alias_name(emitter *e, uint32_t src) {
  memmove(e->names[e->cur], e->names[src], sizeof e->names[e->cur]);
  memcpy(e->dv[e->cur], e->dv[src], sizeof e->dv[e->cur]);
}

static jit_status emit_transpose(emitter *e, const jit__node *n) {
  uint32_t src = n->operands[0];
  gen_operand x = node_operand(e, src);
  int r = x.rank;
  if (n->rank != r) return node_error(e, "transpose changes the rank");
  bool seen[JIT_MAX_RANK] = {false}, identity = true;
  for (int i = 0; i < r; i++) {
    int p = n->perm[i];
    if (p < 0 || p >= r || seen[p] || n->dims[i] != x.dims[p])
      return node_error(e, "bad permutation");
    seen[p] = true;
    x.map[p] = i;  // input dim p is walked by result loop i
    e->dv[e->cur][i] = e->dv[src][p];
    identity = identity && p == i;
  }
  if (identity) {
    alias_name(e, src);
    return NULL;
  }
  // A generic rather than linalg.transpose, so the elementwise fusion pass sees it.
  str empty = value_name(e, false), res = value_name(e, true);
  emit_empty(e, empty.s, n->dtype, r, n->dims, e->dv[e->cur]);
  gen_operand out = {empty.s, n->dtype, r, n->dims, {0}, NULL};
  identity_map(&out);
  char iters[JIT_MAX_RANK];
  memset(iters, 'p', sizeof iters);
  emit_generic(e, res.s, r, iters, &x, 1, &out, B_COPY, NULL);
  return NULL;
}

// Per node, the fewest steps to a matmul up through operands (mm_up) and down through
// users (mm_down), capped at 255; a matmul itself is 0. One pass each way: operands
// come before their users.
static void matmul_distances(const jit__lgraph *g, uint8_t *up, uint8_t *down) {
  for (uint32_t i = 0; i < g->n_nodes; i++) {
    const jit__node *n = &g->nodes[i];
    int d = 255;
    if (n->op == JIT__OP_MATMUL) d = 0;
    for (int k = 0; k < n->n_operands && d; k++)
      if (up[n->operands[k]] + 1 < d) d = up[n->operands[k]] + 1;
    up[i] = (uint8_t)d;
    down[i] = n->op == JIT__OP_MATMUL ? 0 : 255;
  }
  for (uint32_t i = g->n_nodes; i-- > 0;) {
    const jit__node *n = &g->nodes[i];
    for (int k = 0; k < n->n_operands; k++) {
      uint8_t *o = &down[n->operands[k]];
      if (down[i] + 1 < *o) *o = (uint8_t)(down[i] + 1);
    }
  }
}

// A reshape from or to rank 0: one element, so every dim on the other side is 1, and
// the empty reassociation is how expand/collapse_shape add or drop unit dims of a
// scalar. A `?` side goes through its all-1s static type by tensor.cast (symbolic mode).
static void emit_reshape_rank0(emitter *e, const jit__node *n, uint32_t src) {
  const jit__node *x = &e->g->nodes[src];
  static const int64_t ones[JIT_MAX_RANK] = {1, 1, 1, 1, 1, 1, 1, 1};
  str v;
  snprintf(v.s, sizeof v.s, "%s", e->names[src]);
  if (x->rank > 0) {
    str tx = tensor_type(x->dtype, x->rank, x->dims), t1 = tensor_type(x->dtype, x->rank, ones);
    if (strcmp(tx.s, t1.s)) {
      str c = value_name(e, false);
      jit__text_printf(&e->tb, "  %s = tensor.cast %s : %s to %s\n", c.s, v.s, tx.s, t1.s);
      v = c;
    }
    str c = value_name(e, true);
    jit__text_printf(&e->tb, "  %s = tensor.collapse_shape %s [] : %s into %s\n", c.s, v.s,
                     t1.s, tensor_type(n->dtype, 0, NULL).s);
    return;
  }
  str t1 = tensor_type(n->dtype, n->rank, ones), tn = tensor_type(n->dtype, n->rank, n->dims);
  bool cast = strcmp(t1.s, tn.s) != 0;
  str c = value_name(e, !cast);
  jit__text_printf(&e->tb, "  %s = tensor.expand_shape %s [] output_shape ", c.s, v.s);
  print_int_list(e, n->rank, ones);
  jit__text_printf(&e->tb, " : %s into %s\n", tensor_type(x->dtype, 0, NULL).s, t1.s);
  if (cast)
    jit__text_printf(&e->tb, "  %s = tensor.cast %s : %s to %s\n", value_name(e, true).s, c.s,
                     t1.s, tn.s);
  for (int d = 0; d < n->rank; d++)
    if (n->dims[d] < 0) snprintf(e->dv[e->cur][d].s, sizeof(dimval), "%%idx1");
}

// The value of symbol `code`: the first input dim that carries it (symbolic mode).
static const dimval *symbol_value(const emitter *e, int64_t code) {
  for (uint32_t i = 0; i < e->g->n_inputs; i++) {
    const jit__node *in = &e->g->nodes[e->g->inputs[i]];
    for (int d = 0; d < in->rank; d++)
      if (in->dims[d] == code) return &e->dv[e->g->inputs[i]][d];
  }
  return NULL;
}

// `a` * `b` as a fresh index value, into `res` (which may hold `a` or `b`).
static void emit_index_mul(emitter *e, str *res, const char *a, const char *b) {
  str t = value_name(e, false);
  jit__text_printf(&e->tb, "  %s = arith.muli %s, %s : index\n", t.s, a, b);
  *res = t;
}

// Symbolic mode: the values of a reshape's `?` result dims into e->dv[e->cur]: a symbol
// the reshape asked for is that symbol's value; the inferred dim (-1) is the element
// count of x over the product of the others.
static jit_status reshape_sizes(emitter *e, const jit__node *n, uint32_t src) {
  const jit__node *x = &e->g->nodes[src];
  const int64_t *req = e->opt->reshape_req[e->cur];
  dimval *dv = e->dv[e->cur];
  int infer = -1;
  int64_t known = 1, count = 1;
  str prod = {{0}};
  for (int d = 0; d < n->rank; d++) {
    if (req[d] >= 0) {
      known *= req[d];
    } else if (req[d] == -1) {
      infer = d;
    } else {
      const dimval *v = symbol_value(e, req[d]);
      if (!v) return node_error(e, "a symbol of the new shape is no input dim");
      dv[d] = *v;
      if (!prod.s[0]) snprintf(prod.s, sizeof prod.s, "%s", v->s);
      else emit_index_mul(e, &prod, prod.s, v->s);
    }
  }
  if (infer < 0 || n->dims[infer] >= 0) return NULL;
  str total = value_name(e, false);
  for (int d = 0; d < x->rank; d++)
    if (x->dims[d] >= 0) count *= x->dims[d];
  jit__text_printf(&e->tb, "  %s = arith.constant %lld : index\n", total.s, (long long)count);
  for (int d = 0; d < x->rank; d++)
    if (x->dims[d] < 0) emit_index_mul(e, &total, total.s, e->dv[src][d].s);
  str k = value_name(e, false), q = value_name(e, false);
  jit__text_printf(&e->tb, "  %s = arith.constant %lld : index\n", k.s, (long long)known);
  if (prod.s[0]) emit_index_mul(e, &k, k.s, prod.s);
  jit__text_printf(&e->tb, "  %s = arith.divui %s, %s : index\n", q.s, total.s, k.s);
  snprintf(dv[infer].s, sizeof dv[infer].s, "%.39s", q.s);
  return NULL;
}

static bool all_static(int rank, const int64_t *dims) {
  for (int d = 0; d < rank; d++)
    if (dims[d] < 0) return false;
  return true;
}

static jit_status emit_reshape(emitter *e, const jit__node *n) {
  uint32_t src = n->operands[0];
  const jit__node *x = &e->g->nodes[src];
  bool x_static = all_static(x->rank, x->dims), n_static = all_static(n->rank, n->dims);
  int64_t count = x_static ? num_elements(x->rank, x->dims) : -1;
  if (x_static && n_static && count != num_elements(n->rank, n->dims))
    return node_error(e, "reshape changes the element count");
  if (x->rank == n->rank && !memcmp(x->dims, n->dims, sizeof(int64_t) * (size_t)n->rank)) {
    alias_name(e, src);
    return NULL;
  }
  if (x->rank == 0 || n->rank == 0) {
    emit_reshape_rank0(e, n, src);
    return NULL;
  }
  // Within four steps of a matmul (CPU): tensor.reshape, a view. The fusion pass moves
  // collapse/expand_shape through the ops around them, and through a matmul it makes
  // the matmul a generic of more loops that no strategy plans: an attention block's
  // q = x Wq + b reshaped to heads ran its projections as plain loops (~5 GFLOP/s).
  // Elsewhere the reshape pair, which lets elementwise chains fuse across it.
  if (e->named_batch && (e->mm_up[src] <= 4 || e->mm_down[e->cur] <= 4)) {
    emit_reshape_to(e, e->names[src], n->dtype, x->rank, x->dims, n->rank, n->dims, true);
    return NULL;
  }
  if (e->symbolic) JIT_PROPAGATE(reshape_sizes(e, n, src));
  // Otherwise through 1-D: collapse all dims into one, then expand to the target; a
  // rank-1 endpoint skips its step. The 1-D value is `?` where x has a `?` dim, and a
  // tensor.cast makes it `?` where the result has one and static where it has none:
  // collapse/expand_shape want a group with a `?` dim on one side to be `?` on the other.
  int64_t x_flat = x_static ? count : -1;
  int64_t to_flat = n_static ? num_elements(n->rank, n->dims) : -1;
  str src_ty = tensor_type(x->dtype, x->rank, x->dims);
  str to_ty = tensor_type(n->dtype, n->rank, n->dims);
  str flat_ty = tensor_type(n->dtype, 1, &x_flat), flat, res;
  bool cast = to_flat != x_flat, last = n->rank == 1 && !cast;
  snprintf(flat.s, sizeof flat.s, "%s", e->names[src]);
  if (x->rank > 1) {
    str mid = value_name(e, last);
    jit__text_printf(&e->tb, "  %s = tensor.collapse_shape %s [[", mid.s, flat.s);
    for (int d = 0; d < x->rank; d++) jit__text_printf(&e->tb, "%s%d", d ? ", " : "", d);
    jit__text_printf(&e->tb, "]] : %s into %s\n", src_ty.s, flat_ty.s);
    flat = mid;
  }
  if (cast) {
    str to_flat_ty = tensor_type(n->dtype, 1, &to_flat);
    res = value_name(e, n->rank == 1);
    jit__text_printf(&e->tb, "  %s = tensor.cast %s : %s to %s\n", res.s, flat.s, flat_ty.s,
                     to_flat_ty.s);
    flat = res;
    flat_ty = to_flat_ty;
  } else if (n->rank == 1 && x->rank == 1) {
    // Both 1-D and `?` (of different symbols): the same value.
    snprintf(e->names[e->cur], sizeof e->names[e->cur], "%.31s", flat.s);
    return NULL;
  }
  if (n->rank > 1) {
    res = value_name(e, true);
    jit__text_printf(&e->tb, "  %s = tensor.expand_shape %s [[", res.s, flat.s);
    for (int d = 0; d < n->rank; d++) jit__text_printf(&e->tb, "%s%d", d ? ", " : "", d);
    jit__text_printf(&e->tb, "]] output_shape ");
    print_shape_list(e, n->rank, n->dims, e->dv[e->cur]);
    jit__text_printf(&e->tb, " : %s into %s\n", flat_ty.s, to_ty.s);
  }
  return NULL;
}

//===--- Graph ------------------------------------------------------------------===//

static int operand_count(jit__op op) {
  switch (op) {
    case JIT__OP_INPUT: case JIT__OP_SCALAR: return 0;
    case JIT__OP_MATMUL: case JIT__OP_ADD: case JIT__OP_SUB: case JIT__OP_MUL:
    case JIT__OP_DIV: case JIT__OP_MAXIMUM: case JIT__OP_MINIMUM: return 2;
    default: return 1;
  }
}

// The invariants every emitter relies on; a violation is a bug upstream.
static jit_status check_node(emitter *e, const jit__node *n) {
  if ((int)n->op < 0 || n->op >= JIT__OP_COUNT_) return node_error(e, "unknown op");
  if (n->dtype != JIT__F32 && n->dtype != JIT__F16) return node_error(e, "unknown dtype");
  if (n->rank < 0 || n->rank > JIT_MAX_RANK) return node_error(e, "rank out of range");
  for (int d = 0; d < n->rank; d++)
    if (n->dims[d] < 0 && !e->symbolic) return node_error(e, "dim not concrete");
  if (n->n_operands != operand_count(n->op)) return node_error(e, "operand count");
  for (int i = 0; i < n->n_operands; i++) {
    if (n->operands[i] >= e->cur) return node_error(e, "operand is not an earlier node");
    if (e->g->nodes[n->operands[i]].dtype != n->dtype) return node_error(e, "dtype");
  }
  if (n->op == JIT__OP_SCALAR && n->rank != 0) return node_error(e, "scalar rank");
  if (n->op >= JIT__OP_NEG && n->op <= JIT__OP_RSQRT) {
    const jit__node *x = &e->g->nodes[n->operands[0]];
    if (x->rank != n->rank || memcmp(x->dims, n->dims, sizeof(int64_t) * (size_t)n->rank))
      return node_error(e, "unary op changes the shape");
  }
  return NULL;
}

static jit_status emit_node(emitter *e, const jit__node *n) {
  static const body_kind kinds[JIT__OP_COUNT_] = {
      [JIT__OP_ADD] = B_ADD,         [JIT__OP_SUB] = B_SUB,   [JIT__OP_MUL] = B_MUL,
      [JIT__OP_DIV] = B_DIV,         [JIT__OP_MAXIMUM] = B_MAX,
      [JIT__OP_MINIMUM] = B_MIN,     [JIT__OP_NEG] = B_NEG,   [JIT__OP_EXP] = B_EXP,
      [JIT__OP_LOG] = B_LOG,         [JIT__OP_TANH] = B_TANH,
      [JIT__OP_SIGMOID] = B_SIGMOID, [JIT__OP_RELU] = B_RELU, [JIT__OP_GELU] = B_GELU,
      [JIT__OP_SQRT] = B_SQRT,       [JIT__OP_RSQRT] = B_RSQRT,
  };
  switch (n->op) {
    case JIT__OP_INPUT:
      if (!e->names[e->cur][0]) return node_error(e, "input node is not a graph input");
      if (!e->symbolic && num_elements(n->rank, n->dims) == 0) {
        // Its argument is declared 1-D (see emit_graph); with no elements to read, a
        // tensor.empty of the real shape stands in for it.
        snprintf(e->names[e->cur], sizeof e->names[e->cur], "%%v%u", e->cur);
        emit_empty(e, e->names[e->cur], n->dtype, n->rank, n->dims, NULL);
      }
      return NULL;
    case JIT__OP_SCALAR:
      jit__text_printf(&e->tb, "  %%v%u = arith.constant dense<%s> : %s\n", e->cur,
                float_literal(n->scalar, n->dtype).s, tensor_type(n->dtype, 0, NULL).s);
      return NULL;
    case JIT__OP_MATMUL:
      return emit_matmul(e, n);
    case JIT__OP_REDUCE_SUM: case JIT__OP_REDUCE_MAX: case JIT__OP_REDUCE_MEAN:
      return emit_reduce(e, n);
    case JIT__OP_SOFTMAX:
      return emit_softmax(e, n);
    case JIT__OP_TRANSPOSE:
      return emit_transpose(e, n);
    case JIT__OP_RESHAPE:
      return emit_reshape(e, n);
    default:
      if (n->op >= JIT__OP_ADD && n->op <= JIT__OP_RSQRT)
        return emit_elementwise(e, n, kinds[n->op]);
      return JIT_ERR(JIT_UNSUPPORTED, "emitting MLIR: node %u: op %d not supported",
                     e->cur, (int)n->op);
  }
}

// MLIR bare identifiers: what may follow '@' unquoted.
static bool is_bare_id(const char *s) {
  if (!s || !(*s == '_' || (*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z')))
    return false;
  for (; *s; s++)
    if (!(*s == '_' || *s == '$' || *s == '.' || (*s >= 'a' && *s <= 'z') ||
          (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9')))
      return false;
  return true;
}

// An SSA/symbol-safe copy of `s` into out[size]: letters, digits and '_' (others become
// '_', a leading digit gets a '_' before it; "" becomes "_").
static void make_ident(char *out, size_t size, const char *s) {
  size_t n = 0;
  if (isdigit((unsigned char)s[0]) && n + 1 < size) out[n++] = '_';
  for (; *s && n + 1 < size; s++) out[n++] = isalnum((unsigned char)*s) ? *s : '_';
  out[n] = 0;
  if (!n) snprintf(out, size, "_");
}

// Whether `id` may name a value this file writes (%v3, %v3_t1, %in0_d1, %idx2) or one
// that a generic's body defines (%c0, %t0, %x0, %y, %in0, %out): linalg.generic's
// region sees the function's values, so an argument of that name would be redefined.
static bool reserved_name(const char *id) {
  static const char *const prefixes[] = {"c", "t", "x", "in", "idx", "v"};
  if (!strcmp(id, "y") || !strcmp(id, "out")) return true;
  for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes; i++) {
    size_t n = strlen(prefixes[i]);
    if (!strncmp(id, prefixes[i], n) && isdigit((unsigned char)id[n])) return true;
  }
  return false;
}

// Names the arguments: %a<i> (static), or the inputs' own names made identifiers, a
// name already taken or reserved becoming arg<i>, with a value %in<i>_d<d> per `?` dim
// (symbolic).
static jit_status name_inputs(emitter *e) {
  const jit__lgraph *g = e->g;
  for (uint32_t i = 0; i < g->n_inputs; i++) {
    uint32_t id = g->inputs[i];
    if (id >= g->n_nodes || g->nodes[id].op != JIT__OP_INPUT || e->names[id][0])
      return JIT_ERR(JIT_INTERNAL, "emitting MLIR for graph '%s': input %u is node %u, "
                     "which is not a distinct input node", g->name ? g->name : "", i, id);
    if (!e->symbolic) {
      snprintf(e->names[id], sizeof e->names[id], "%%a%u", i);
      continue;
    }
    const char *name = e->opt->input_names ? e->opt->input_names[i] : NULL;
    char ident[30];
    make_ident(ident, sizeof ident, name ? name : "in");
    bool dup = false;
    for (uint32_t j = 0; j < i; j++) dup |= !strcmp(e->names[g->inputs[j]] + 1, ident);
    if (dup || reserved_name(ident)) snprintf(ident, sizeof ident, "arg%u", i);
    snprintf(e->names[id], sizeof e->names[id], "%%%s", ident);
    const jit__node *n = &g->nodes[id];
    for (int d = 0; d < n->rank; d++)
      if (n->dims[d] < 0) snprintf(e->dv[id][d].s, sizeof(dimval), "%%in%u_d%d", i, d);
  }
  return NULL;
}

// The symbolic frame (jit_graph_to_mlir): tensors in, tensors out, each argument's
// sizes and symbol names in jit.dims, the index constants %idx0.. and a tensor.dim per
// `?` input dim before the body. `body` is taken over.
static void frame_symbolic(emitter *e, const char *func_name, jit__text body) {
  const jit__lgraph *g = e->g;
  jit__text head = {0};
  char fname[128];
  make_ident(fname, sizeof fname, func_name);
  jit__text_printf(&head, "func.func @%s(", fname);
  for (uint32_t k = 0; k < g->n_inputs; k++) {
    const jit__node *n = &g->nodes[g->inputs[k]];
    jit__text_printf(&head, "%s\n    %s: %s {jit.dims = [", k ? "," : "",
                     e->names[g->inputs[k]], tensor_type(n->dtype, n->rank, n->dims).s);
    for (int d = 0; d < n->rank; d++) {
      if (n->dims[d] >= 0) {
        jit__text_printf(&head, "%s%lld", d ? ", " : "", (long long)n->dims[d]);
        continue;
      }
      const char *sym = e->opt->symbol_name ? e->opt->symbol_name(e->opt->symbol_arg,
                                                                  n->dims[d]) : NULL;
      jit__text_printf(&head, "%s\"%s\"", d ? ", " : "", sym ? sym : "?");
    }
    jit__text_printf(&head, "]}");
  }
  jit__text_printf(&head, ") -> (");
  for (uint32_t j = 0; j < g->n_outputs; j++) {
    const jit__node *n = &g->nodes[g->outputs[j]];
    jit__text_printf(&head, "%s%s", j ? ", " : "", tensor_type(n->dtype, n->rank, n->dims).s);
  }
  jit__text_printf(&head, ")");
  if (e->opt->func_attributes)
    jit__text_printf(&head, " attributes {%s}", e->opt->func_attributes);
  jit__text_printf(&head, " {\n");
  for (int d = 0; d < JIT_MAX_RANK; d++)
    jit__text_printf(&head, "  %%idx%d = arith.constant %d : index\n", d, d);
  for (uint32_t k = 0; k < g->n_inputs; k++) {
    uint32_t id = g->inputs[k];
    const jit__node *n = &g->nodes[id];
    for (int d = 0; d < n->rank; d++)
      if (n->dims[d] < 0)
        jit__text_printf(&head, "  %s = tensor.dim %s, %%idx%d : %s\n", e->dv[id][d].s,
                         e->names[id], d, tensor_type(n->dtype, n->rank, n->dims).s);
  }
  jit__text_append(&head, body.p ? body.p : "", body.len);
  head.oom |= body.oom;
  free(body.p);
  jit__text_printf(&head, "  return ");
  for (uint32_t j = 0; j < g->n_outputs; j++)
    jit__text_printf(&head, "%s%s", j ? ", " : "", e->names[g->outputs[j]]);
  jit__text_printf(&head, " : ");
  for (uint32_t j = 0; j < g->n_outputs; j++) {
    const jit__node *n = &g->nodes[g->outputs[j]];
    jit__text_printf(&head, "%s%s", j ? ", " : "", tensor_type(n->dtype, n->rank, n->dims).s);
  }
  jit__text_printf(&head, "\n}\n");
  e->tb = head;
}

static jit_status emit_graph(emitter *e, const char *func_name) {
  const jit__lgraph *g = e->g;
  JIT_PROPAGATE(name_inputs(e));
  for (uint32_t j = 0; j < g->n_outputs; j++)
    if (g->outputs[j] >= g->n_nodes)
      return JIT_ERR(JIT_INTERNAL, "emitting MLIR for graph '%s': output %u is node %u of %u",
                     g->name ? g->name : "", j, g->outputs[j], g->n_nodes);

  // The body first: it decides how outputs made by batched matmuls are declared.
  for (uint32_t i = 0; i < g->n_nodes; i++) {
    const jit__node *n = &g->nodes[i];
    e->cur = i;
    e->n_tmp = 0;
    jit_status s = check_node(e, n);
    if (!s) s = emit_node(e, n);
    if (s) return s;
    if (!e->names[i][0]) snprintf(e->names[i], sizeof e->names[i], "%%v%u", i);
  }
  if (e->dim_lost)
    return JIT_ERR(JIT_INTERNAL, "emitting MLIR for graph '%s': a `?` dim has no value",
                   g->name ? g->name : "");
  if (e->symbolic) {
    frame_symbolic(e, func_name, e->tb);
    return NULL;
  }

  jit__text body = e->tb, head = {0};
  // An argument with no elements is declared as <0xT>: convert-func-to-llvm's bare
  // pointer convention rejects a memref like memref<2x0xf32> (a 0 after the leading
  // dim), which fails the whole lowering. With bare pointers the declared shape does
  // not change the ABI, and nothing is read from or written to such a buffer.
  const int64_t zero = 0;
  jit__text_printf(&head, "func.func @%s(", func_name);
  for (uint32_t i = 0; i < g->n_inputs; i++) {
    const jit__node *n = &g->nodes[g->inputs[i]];
    bool empty = num_elements(n->rank, n->dims) == 0;
    jit__text_printf(&head, "%s%%a%u: %s", i ? ", " : "", i,
              tensor_type(n->dtype, empty ? 1 : n->rank, empty ? &zero : n->dims).s);
  }
  // An output made by a batched matmul's named op is declared in that op's shape and
  // written from its result (e->flat), which one-shot bufferization then computes in
  // place: through the reshape it would go to a temporary and be copied.
  for (uint32_t j = 0; j < g->n_outputs; j++) {
    const jit__node *n = &g->nodes[g->outputs[j]];
    bool empty = num_elements(n->rank, n->dims) == 0;
    const struct flat_value *f = &e->flat[g->outputs[j]];
    int rank = empty ? 1 : f->rank ? f->rank : n->rank;
    const int64_t *dims = empty ? &zero : f->rank ? f->dims : n->dims;
    jit__text_printf(&head, "%s%%r%u: %s", (g->n_inputs || j) ? ", " : "", j,
              shape_type("memref", n->dtype, rank, dims).s);
  }
  jit__text_printf(&head, ") {\n");

  jit__text_append(&head, body.p ? body.p : "", body.len);
  head.oom |= body.oom;
  free(body.p);
  e->tb = head;

  // restrict: each %r is a distinct buffer nobody else touches in this function, which
  // lets eliminate-empty-tensors compute the producing op directly into it.
  for (uint32_t j = 0; j < g->n_outputs; j++) {
    const jit__node *n = &g->nodes[g->outputs[j]];
    if (num_elements(n->rank, n->dims) == 0) continue;
    const struct flat_value *f = &e->flat[g->outputs[j]];
    int rank = f->rank ? f->rank : n->rank;
    const int64_t *dims = f->rank ? f->dims : n->dims;
    jit__text_printf(&e->tb,
              "  bufferization.materialize_in_destination %s in restrict writable %%r%u"
              " : (%s, %s) -> ()\n",
              f->rank ? f->name.s : e->names[g->outputs[j]], j,
              tensor_type(n->dtype, rank, dims).s, shape_type("memref", n->dtype, rank, dims).s);
  }
  jit__text_printf(&e->tb, "  return\n}\n");
  return NULL;
}

jit_status jit__emit_mlir_with(const jit__lgraph *graph, const char *func_name,
                               const jit__emit_options *options, char **out_text) {
  if (out_text) *out_text = NULL;
  if (!graph || !out_text || !options || (graph->n_nodes && !graph->nodes) ||
      (graph->n_inputs && !graph->inputs) || (graph->n_outputs && !graph->outputs) ||
      (options->symbolic && (!func_name || !options->reshape_req)))
    return JIT_ERR(JIT_INTERNAL, "jit__emit_mlir: NULL argument");
  if (!options->symbolic && !is_bare_id(func_name))
    return JIT_ERR(JIT_INTERNAL, "jit__emit_mlir: function name '%s' is not an MLIR "
                   "identifier", func_name ? func_name : "(null)");
  // The named-op forms are tuned for (and only written for) static shapes.
  emitter e = {.g = graph, .opt = options, .symbolic = options->symbolic,
               .named_batch = options->named_batch && !options->symbolic};
  size_t n = graph->n_nodes ? graph->n_nodes : 1;
  e.names = calloc(n, sizeof *e.names);
  e.flat = calloc(n, sizeof *e.flat);
  e.squeezed = calloc(n, sizeof *e.squeezed);
  e.mm_up = calloc(n, 2);
  e.dv = calloc(n, sizeof *e.dv);
  jit_status s = NULL;
  if (!e.names || !e.flat || !e.squeezed || !e.mm_up || !e.dv) {
    s = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "emitting MLIR: out of memory");
  } else {
    e.mm_down = e.mm_up + graph->n_nodes;
    matmul_distances(graph, e.mm_up, e.mm_down);
    s = emit_graph(&e, func_name);
  }
  free(e.names);
  free(e.flat);
  free(e.squeezed);
  free(e.mm_up);
  free(e.dv);
  if (!s && e.tb.oom) s = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "emitting MLIR: out of memory");
  if (s) {
    free(e.tb.p);
    return s;
  }
  *out_text = e.tb.p;
  return NULL;
}

jit_status jit__emit_mlir(const jit__lgraph *graph, const char *func_name,
                          bool named_batch, char **out_text) {
  jit__emit_options o = {.named_batch = named_batch};
  return jit__emit_mlir_with(graph, func_name, &o, out_text);
}
