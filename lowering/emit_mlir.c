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
#include "lowering/emit.h"
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

//===--- Types and literals -------------------------------------------------===//

static const char *elem_name(jit__dtype dt) { return dt == JIT__F16 ? "f16" : "f32"; }

static jit__str shape_type(const char *kind, jit__dtype dt, int rank, const int64_t *dims) {
  jit__str t;
  int n = snprintf(t.s, sizeof t.s, "%s<", kind);
  for (int i = 0; i < rank; i++)
    n += dims[i] < 0 ? snprintf(t.s + n, sizeof t.s - (size_t)n, "?x")
                     : snprintf(t.s + n, sizeof t.s - (size_t)n, "%lldx", (long long)dims[i]);
  snprintf(t.s + n, sizeof t.s - (size_t)n, "%s>", elem_name(dt));
  return t;
}

jit__str jit__tensor_type(jit__dtype dt, int rank, const int64_t *dims) {
  return shape_type("tensor", dt, rank, dims);
}

// An MLIR float literal for `v` as a value of type `dt`. MLIR's float literal needs a
// '.' before any exponent ("1e+20" lexes as an integer), and has no spelling for inf
// or nan except the bit pattern in hex, so those and values that overflow `dt` are
// written as hex.
jit__str jit__float_literal(double v, jit__dtype dt) {
  jit__str t;
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

// The name for the next value of the current node: its final value gets %v<i> so dumps
// read naturally; the steps on the way get %v<i>_t<k>.
jit__str jit__value_name(jit__emitter *e, bool final) {
  jit__str t;
  if (final)
    snprintf(t.s, sizeof t.s, "%%v%u", e->cur);
  else
    snprintf(t.s, sizeof t.s, "%%v%u_t%d", e->cur, e->n_tmp++);
  return t;
}

// tensor.empty of `dims`; its `?` dims (symbolic mode) take their sizes from `dv`.
void jit__emit_empty(jit__emitter *e, const char *res, jit__dtype dt, int rank,
                       const int64_t *dims, const jit__dimval *dv) {
  jit__text_printf(&e->tb, "  %s = tensor.empty(", res);
  for (int d = 0, k = 0; d < rank; d++) {
    if (dims[d] >= 0) continue;
    if (!dv || !dv[d].s[0]) e->dim_lost = true;
    jit__text_printf(&e->tb, "%s%s", k++ ? ", " : "", dv ? dv[d].s : "");
  }
  jit__text_printf(&e->tb, ") : %s\n", jit__tensor_type(dt, rank, dims).s);
}

// An f32 tensor of `rank`/`dims` filled with `init` (a literal), for accumulators.
jit__str jit__emit_filled_acc(jit__emitter *e, const char *init, int rank, const int64_t *dims,
                           const jit__dimval *dv) {
  jit__str empty = jit__value_name(e, false), cst = jit__value_name(e, false);
  jit__str acc = jit__value_name(e, false);
  jit__str ty = jit__tensor_type(JIT__F32, rank, dims);
  jit__emit_empty(e, empty.s, JIT__F32, rank, dims, dv);
  jit__text_printf(&e->tb, "  %s = arith.constant %s : f32\n", cst.s, init);
  jit__text_printf(&e->tb, "  %s = linalg.fill ins(%s : f32) outs(%s : %s) -> %s\n", acc.s, cst.s,
            empty.s, ty.s, ty.s);
  return acc;
}

//===--- linalg.generic -----------------------------------------------------------===//

void jit__identity_map(jit__gen_operand *op) {
  for (int d = 0; d < op->rank; d++) op->map[d] = d;
}

static void print_map(jit__emitter *e, int n_loops, const jit__gen_operand *op) {
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
static const char *emit_body(jit__emitter *e, jit__body_kind kind, const char *x, const char *y,
                             const char *out, const char *by) {
  jit__text *tb = &e->tb;
  switch (kind) {
    case JIT__B_COPY:
      return x;
    case JIT__B_ADD: case JIT__B_SUB: case JIT__B_MUL: case JIT__B_DIV: case JIT__B_MAX:
    case JIT__B_MIN: {
      static const char *const ops[] = {"addf", "subf", "mulf", "divf", "maximumf",
                                        "minimumf"};
      jit__text_printf(tb, "    %%t0 = arith.%s %s, %s : f32\n", ops[kind - JIT__B_ADD], x, y);
      return "%t0";
    }
    case JIT__B_NEG:
      jit__text_printf(tb, "    %%t0 = arith.negf %s : f32\n", x);
      return "%t0";
    case JIT__B_EXP: case JIT__B_LOG: case JIT__B_TANH: case JIT__B_SQRT: case JIT__B_RSQRT: {
      const char *fn = kind == JIT__B_EXP ? "exp" : kind == JIT__B_LOG ? "log"
                       : kind == JIT__B_TANH ? "tanh" : kind == JIT__B_SQRT ? "sqrt" : "rsqrt";
      jit__text_printf(tb, "    %%t0 = math.%s %s : f32\n", fn, x);
      return "%t0";
    }
    case JIT__B_SIGMOID:
      jit__text_printf(tb,
                "    %%c1 = arith.constant 1.0 : f32\n"
                "    %%t0 = arith.negf %s : f32\n"
                "    %%t1 = math.exp %%t0 : f32\n"
                "    %%t2 = arith.addf %%c1, %%t1 : f32\n"
                "    %%t3 = arith.divf %%c1, %%t2 : f32\n",
                x);
      return "%t3";
    case JIT__B_RELU:
      jit__text_printf(tb,
                "    %%c0 = arith.constant 0.0 : f32\n"
                "    %%t0 = arith.maximumf %s, %%c0 : f32\n",
                x);
      return "%t0";
    case JIT__B_GELU:
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
    case JIT__B_ACC_SUM:
      jit__text_printf(tb, "    %%t0 = arith.addf %s, %s : f32\n", out, x);
      return "%t0";
    case JIT__B_ACC_MAX:
      jit__text_printf(tb, "    %%t0 = arith.maximumf %s, %s : f32\n", out, x);
      return "%t0";
    case JIT__B_ACC_MAXNUM:
      jit__text_printf(tb, "    %%t0 = arith.maxnumf %s, %s fastmath<nnan> : f32\n", out, x);
      return "%t0";
    case JIT__B_ACC_MAC:
      jit__text_printf(tb,
                "    %%t0 = arith.mulf %s, %s : f32\n"
                "    %%t1 = arith.addf %s, %%t0 : f32\n",
                x, y, out);
      return "%t1";
    case JIT__B_EXP_SUB:
      jit__text_printf(tb,
                "    %%t0 = arith.subf %s, %s : f32\n"
                "    %%t1 = math.exp %%t0 : f32\n",
                x, y);
      return "%t1";
    case JIT__B_DIV_BY:
      jit__text_printf(tb,
                "    %%c0 = arith.constant %s : f32\n"
                "    %%t9 = arith.divf %s, %%c0 : f32\n",
                by, x);
      return "%t9";
    case JIT__B_DIV_BY_VALUE:
      jit__text_printf(tb, "    %%t9 = arith.divf %s, %s : f32\n", x, by);
      return "%t9";
  }
  return x;
}

// `res` = linalg.generic over `n_loops` loops (`iters`[l] is 'p' or 'r'), reading
// `ins` and writing into `out` (whose name is the init tensor). Inputs are extended to
// f32 and the result truncated to out's dtype, except that a copy between equal types
// passes the value through.
void jit__emit_generic(jit__emitter *e, const char *res, int n_loops, const char *iters,
                         const jit__gen_operand *ins, int n_in, const jit__gen_operand *out,
                         jit__body_kind kind, const char *by) {
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
    jit__text_printf(tb, "%s%s", i ? ", " : "",
                     jit__tensor_type(ins[i].dt, ins[i].rank, ins[i].dims).s);
  jit__str out_ty = jit__tensor_type(out->dt, out->rank, out->dims);
  jit__text_printf(tb, ") outs(%s : %s) {\n  ^bb0(", out->name, out_ty.s);
  for (int i = 0; i < n_in; i++) jit__text_printf(tb, "%%in%d: %s, ", i, elem_name(ins[i].dt));
  jit__text_printf(tb, "%%out: %s):\n", elem_name(out->dt));

  const char *result;
  char xs[2][8];  // the body's inputs; `result` may be one of them, used below
  if (kind == JIT__B_COPY && n_in == 1 && ins[0].dt == out->dt) {
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

jit__gen_operand jit__node_operand(jit__emitter *e, uint32_t id) {
  const jit__node *n = &e->g->nodes[id];
  jit__gen_operand op = {e->names[id], n->dtype, n->rank, n->dims, {0}, e->dv[id]};
  jit__identity_map(&op);
  return op;
}

// Symbolic mode: the values of the `?` dims of a result over loops 0..rank-1 (its map
// the identity) into `dv`, each from an operand dim that the same loop walks.
bool jit__result_dims_from(jit__emitter *e, const jit__gen_operand *ins, int n_in, int rank,
                             const int64_t *dims, jit__dimval *dv) {
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
bool jit__dims_agree(const jit__emitter *e, int64_t od, int64_t rd) {
  return od == rd || (e->symbolic && (od < 0 || rd < 0) && od != 1);
}

jit_status jit__node_error(jit__emitter *e, const char *what) {
  const jit__node *n = &e->g->nodes[e->cur];
  return JIT_ERR(JIT_INTERNAL, "emitting MLIR for graph '%s': node %u (%s): %s",
                 e->g->name ? e->g->name : "", e->cur, jit__op_name(n->op), what);
}

int64_t jit__num_elements(int rank, const int64_t *dims) {
  int64_t n = 1;
  for (int i = 0; i < rank; i++) n *= dims[i];
  return n;
}

void jit__print_int_list(jit__emitter *e, int n, const int64_t *v) {
  jit__text_printf(&e->tb, "[");
  for (int i = 0; i < n; i++) jit__text_printf(&e->tb, "%s%lld", i ? ", " : "", (long long)v[i]);
  jit__text_printf(&e->tb, "]");
}

// A shape as output_shape lists it: sizes, and the values of `?` dims from `dv`.
void jit__print_shape_list(jit__emitter *e, int rank, const int64_t *dims, const jit__dimval *dv) {
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
jit__str jit__emit_convert(jit__emitter *e, const char *x, jit__dtype from, jit__dtype to, int rank,
                        const int64_t *dims, const jit__dimval *dv, bool final) {
  jit__str empty = jit__value_name(e, false), res = jit__value_name(e, final);
  jit__emit_empty(e, empty.s, to, rank, dims, dv);
  jit__gen_operand in = {x, from, rank, dims, {0}, NULL};
  jit__gen_operand out = {empty.s, to, rank, dims, {0}, NULL};
  jit__identity_map(&in);
  jit__identity_map(&out);
  char iters[JIT_MAX_RANK];
  memset(iters, 'p', sizeof iters);
  jit__emit_generic(e, res.s, rank, iters, &in, 1, &out, JIT__B_COPY, NULL);
  return res;
}

// The f16 result of an f32 accumulator `acc`: one rounding, after the sum.
jit__str jit__emit_f16_result(jit__emitter *e, const char *acc, int rank, const int64_t *dims,
                           const jit__dimval *dv, bool final) {
  return jit__emit_convert(e, acc, JIT__F32, JIT__F16, rank, dims, dv, final);
}

// `x` (`rank`/`dims`, type `dt`) as a new value of shape `to_rank`/`to_dims` (the same
// elements in the same order), through tensor.reshape rather than collapse_shape /
// expand_shape: linalg-fuse-elementwise-ops (compile_cpu.c) propagates those through
// a matmul, turning it back into a generic of more loops, which no strategy tiles.
// tensor.reshape bufferizes to a view (memref.reshape): nothing is copied.
jit__str jit__emit_reshape_to(jit__emitter *e, const char *x, jit__dtype dt, int rank,
                           const int64_t *dims, int to_rank, const int64_t *to_dims,
                           bool final) {
  jit__str shape = jit__value_name(e, false), res = jit__value_name(e, final);
  jit__text_printf(&e->tb, "  %s = arith.constant dense<", shape.s);
  jit__print_int_list(e, to_rank, to_dims);
  jit__text_printf(&e->tb, "> : tensor<%dxi64>\n", to_rank);
  jit__text_printf(&e->tb, "  %s = tensor.reshape %s(%s) : (%s, tensor<%dxi64>) -> %s\n", res.s,
                   x, shape.s, jit__tensor_type(dt, rank, dims).s, to_rank,
                   jit__tensor_type(dt, to_rank, to_dims).s);
  return res;
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

//===--- Graph ------------------------------------------------------------------===//

static int operand_count(jit__op op) {
  switch (op) {
    case JIT__OP_INPUT: case JIT__OP_SCALAR: return 0;
    case JIT__OP_MATMUL: case JIT__OP_ADD: case JIT__OP_SUB: case JIT__OP_MUL:
    case JIT__OP_DIV: case JIT__OP_MAXIMUM: case JIT__OP_MINIMUM: return 2;
    default: return 1;
  }
}

// The invariants every jit__emitter relies on; a violation is a bug upstream.
static jit_status check_node(jit__emitter *e, const jit__node *n) {
  if ((int)n->op < 0 || n->op >= JIT__OP_COUNT_) return jit__node_error(e, "unknown op");
  if (n->dtype != JIT__F32 && n->dtype != JIT__F16) return jit__node_error(e, "unknown dtype");
  if (n->rank < 0 || n->rank > JIT_MAX_RANK) return jit__node_error(e, "rank out of range");
  for (int d = 0; d < n->rank; d++)
    if (n->dims[d] < 0 && !e->symbolic) return jit__node_error(e, "dim not concrete");
  if (n->n_operands != operand_count(n->op)) return jit__node_error(e, "operand count");
  for (int i = 0; i < n->n_operands; i++) {
    if (n->operands[i] >= e->cur) return jit__node_error(e, "operand is not an earlier node");
    if (e->g->nodes[n->operands[i]].dtype != n->dtype) return jit__node_error(e, "dtype");
  }
  if (n->op == JIT__OP_SCALAR && n->rank != 0) return jit__node_error(e, "scalar rank");
  if (n->op >= JIT__OP_NEG && n->op <= JIT__OP_RSQRT) {
    const jit__node *x = &e->g->nodes[n->operands[0]];
    if (x->rank != n->rank || memcmp(x->dims, n->dims, sizeof(int64_t) * (size_t)n->rank))
      return jit__node_error(e, "unary op changes the shape");
  }
  return NULL;
}

static jit_status emit_node(jit__emitter *e, const jit__node *n) {
  static const jit__body_kind kinds[JIT__OP_COUNT_] = {
      [JIT__OP_ADD] = JIT__B_ADD,         [JIT__OP_SUB] = JIT__B_SUB,   [JIT__OP_MUL] = JIT__B_MUL,
      [JIT__OP_DIV] = JIT__B_DIV,         [JIT__OP_MAXIMUM] = JIT__B_MAX,
      [JIT__OP_MINIMUM] = JIT__B_MIN,     [JIT__OP_NEG] = JIT__B_NEG,   [JIT__OP_EXP] = JIT__B_EXP,
      [JIT__OP_LOG] = JIT__B_LOG,         [JIT__OP_TANH] = JIT__B_TANH,
      [JIT__OP_SIGMOID] = JIT__B_SIGMOID, [JIT__OP_RELU] = JIT__B_RELU,
      [JIT__OP_GELU] = JIT__B_GELU,
      [JIT__OP_SQRT] = JIT__B_SQRT,       [JIT__OP_RSQRT] = JIT__B_RSQRT,
  };
  switch (n->op) {
    case JIT__OP_INPUT:
      if (!e->names[e->cur][0]) return jit__node_error(e, "input node is not a graph input");
      if (!e->symbolic && jit__num_elements(n->rank, n->dims) == 0) {
        // Its argument is declared 1-D (see emit_graph); with no elements to read, a
        // tensor.empty of the real shape stands in for it.
        snprintf(e->names[e->cur], sizeof e->names[e->cur], "%%v%u", e->cur);
        jit__emit_empty(e, e->names[e->cur], n->dtype, n->rank, n->dims, NULL);
      }
      return NULL;
    case JIT__OP_SCALAR:
      jit__text_printf(&e->tb, "  %%v%u = arith.constant dense<%s> : %s\n", e->cur,
                jit__float_literal(n->scalar, n->dtype).s, jit__tensor_type(n->dtype, 0, NULL).s);
      return NULL;
    case JIT__OP_MATMUL:
      return jit__emit_matmul(e, n);
    case JIT__OP_REDUCE_SUM: case JIT__OP_REDUCE_MAX: case JIT__OP_REDUCE_MEAN:
      return jit__emit_reduce(e, n);
    case JIT__OP_SOFTMAX:
      return jit__emit_softmax(e, n);
    case JIT__OP_TRANSPOSE:
      return jit__emit_transpose(e, n);
    case JIT__OP_RESHAPE:
      return jit__emit_reshape(e, n);
    default:
      if (n->op >= JIT__OP_ADD && n->op <= JIT__OP_RSQRT)
        return jit__emit_elementwise(e, n, kinds[n->op]);
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
static jit_status name_inputs(jit__emitter *e) {
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
      if (n->dims[d] < 0) snprintf(e->dv[id][d].s, sizeof(jit__dimval), "%%in%u_d%d", i, d);
  }
  return NULL;
}

// The symbolic frame (jit_graph_to_mlir): tensors in, tensors out, each argument's
// sizes and symbol names in jit.dims, the index constants %idx0.. and a tensor.dim per
// `?` input dim before the body. `body` is taken over.
static void frame_symbolic(jit__emitter *e, const char *func_name, jit__text body) {
  const jit__lgraph *g = e->g;
  jit__text head = {0};
  char fname[128];
  make_ident(fname, sizeof fname, func_name);
  jit__text_printf(&head, "func.func @%s(", fname);
  for (uint32_t k = 0; k < g->n_inputs; k++) {
    const jit__node *n = &g->nodes[g->inputs[k]];
    jit__text_printf(&head, "%s\n    %s: %s {jit.dims = [", k ? "," : "",
                     e->names[g->inputs[k]], jit__tensor_type(n->dtype, n->rank, n->dims).s);
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
    jit__text_printf(&head, "%s%s", j ? ", " : "", jit__tensor_type(n->dtype, n->rank, n->dims).s);
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
                         e->names[id], d, jit__tensor_type(n->dtype, n->rank, n->dims).s);
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
    jit__text_printf(&head, "%s%s", j ? ", " : "", jit__tensor_type(n->dtype, n->rank, n->dims).s);
  }
  jit__text_printf(&head, "\n}\n");
  e->tb = head;
}

static jit_status emit_graph(jit__emitter *e, const char *func_name) {
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
    bool empty = jit__num_elements(n->rank, n->dims) == 0;
    jit__text_printf(&head, "%s%%a%u: %s", i ? ", " : "", i,
              jit__tensor_type(n->dtype, empty ? 1 : n->rank, empty ? &zero : n->dims).s);
  }
  // An output made by a batched matmul's named op is declared in that op's shape and
  // written from its result (e->flat), which one-shot bufferization then computes in
  // place: through the reshape it would go to a temporary and be copied.
  for (uint32_t j = 0; j < g->n_outputs; j++) {
    const jit__node *n = &g->nodes[g->outputs[j]];
    bool empty = jit__num_elements(n->rank, n->dims) == 0;
    const struct jit__flat_value *f = &e->flat[g->outputs[j]];
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
    if (jit__num_elements(n->rank, n->dims) == 0) continue;
    const struct jit__flat_value *f = &e->flat[g->outputs[j]];
    int rank = f->rank ? f->rank : n->rank;
    const int64_t *dims = f->rank ? f->dims : n->dims;
    jit__text_printf(&e->tb,
              "  bufferization.materialize_in_destination %s in restrict writable %%r%u"
              " : (%s, %s) -> ()\n",
              f->rank ? f->name.s : e->names[g->outputs[j]], j,
              jit__tensor_type(n->dtype, rank, dims).s,
              shape_type("memref", n->dtype, rank, dims).s);
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
  jit__emitter e = {.g = graph, .opt = options, .symbolic = options->symbolic,
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

