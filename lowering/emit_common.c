//===--- emit_common.c - what every op's emitter writes with ---------------===//
//
// Names, types and literals, the emitter's value names, tensor.empty and filled
// accumulators, linalg.generic with its maps and bodies, and the shape helpers that
// emit_ops.c, emit_matmul.c and the function writer (emit_mlir.c) share. Kept apart
// from emit_mlir.c, which calls the op emitters, so that no two of these files call
// each other.
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
    [JIT__OP_ERF] = "erf",
    [JIT__OP_ROUND] = "round",
    [JIT__OP_GELU_ERF] = "gelu_erf",
    [JIT__OP_LESS] = "less",
    [JIT__OP_LESS_EQUAL] = "less_equal",
    [JIT__OP_GREATER] = "greater",
    [JIT__OP_GREATER_EQUAL] = "greater_equal",
    [JIT__OP_EQUAL] = "equal",
    [JIT__OP_NOT_EQUAL] = "not_equal",
    [JIT__OP_POW] = "pow",
    [JIT__OP_WHERE] = "where",
    [JIT__OP_CONV2D] = "conv2d",
    [JIT__OP_MAX_POOL2D] = "max_pool2d",
    [JIT__OP_AVG_POOL2D] = "avg_pool2d",
    [JIT__OP_GATHER] = "gather",
    [JIT__OP_CONCAT] = "concat",
    [JIT__OP_SLICE] = "slice",
    [JIT__OP_PAD] = "pad",
    [JIT__OP_CAST] = "cast",
    [JIT__OP_ATTENTION] = "attention",
    [JIT__OP_MATMUL_INT8] = "matmul_int8",
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

static const char *elem_name(jit__dtype dt) { return jit__dtype_str(dt); }

jit__str jit__shape_type(const char *kind, jit__dtype dt, int rank, const int64_t *dims) {
  jit__str t;
  int n = snprintf(t.s, sizeof t.s, "%s<", kind);
  for (int i = 0; i < rank; i++)
    n += dims[i] < 0 ? snprintf(t.s + n, sizeof t.s - (size_t)n, "?x")
                     : snprintf(t.s + n, sizeof t.s - (size_t)n, "%lldx", (long long)dims[i]);
  snprintf(t.s + n, sizeof t.s - (size_t)n, "%s>", elem_name(dt));
  return t;
}

jit__str jit__tensor_type(jit__dtype dt, int rank, const int64_t *dims) {
  return jit__shape_type("tensor", dt, rank, dims);
}

// An MLIR float literal for `v` as a value of type `dt`. MLIR's float literal needs a
// '.' before any exponent ("1e+20" lexes as an integer), and has no spelling for inf
// or nan except the bit pattern in hex, so those and values that overflow `dt` are
// written as hex.
jit__str jit__float_literal(double v, jit__dtype dt) {
  jit__str t;
  if (dt == JIT__BF16) {
    // The f32 value rounded to bfloat16 (to nearest even; NaN stays NaN), written as
    // its bit pattern.
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint16_t h = isnan(f) ? 0x7FC0 : (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
    snprintf(t.s, sizeof t.s, "0x%04X", (unsigned)h);
    return t;
  }
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
  jit__text_printf(&e->tb, ")");
  if (e->opt && e->opt->distinct_empties)
    jit__text_printf(&e->tb, " {jit_e = %d : i64}", e->n_empty++);
  jit__text_printf(&e->tb, " : %s\n", jit__tensor_type(dt, rank, dims).s);
}

// An f32 tensor of `rank`/`dims` filled with `init` (a literal), for accumulators.
jit__str jit__emit_fill(jit__emitter *e, const char *init, const char *dst, const char *ty) {
  jit__str cst = jit__value_name(e, false), acc = jit__value_name(e, false);
  jit__text_printf(&e->tb, "  %s = arith.constant %s : f32\n", cst.s, init);
  jit__text_printf(&e->tb, "  %s = linalg.fill ins(%s : f32) outs(%s : %s) -> %s\n", acc.s, cst.s,
            dst, ty, ty);
  return acc;
}

jit__str jit__emit_filled_acc(jit__emitter *e, const char *init, int rank, const int64_t *dims,
                           const jit__dimval *dv) {
  jit__str empty = jit__value_name(e, false);
  jit__emit_empty(e, empty.s, JIT__F32, rank, dims, dv);
  return jit__emit_fill(e, init, empty.s, jit__tensor_type(JIT__F32, rank, dims).s);
}

//===--- linalg.generic -----------------------------------------------------------===//

void jit__identity_map(jit__gen_operand *op) {
  for (int d = 0; d < op->rank; d++) op->map[d] = d;
}

static void print_map(jit__emitter *e, int n_loops, const jit__gen_operand *op) {
  jit__text_printf(&e->tb, "affine_map<(");
  for (int l = 0; l < n_loops; l++) jit__text_printf(&e->tb, "%sd%d", l ? ", " : "", l);
  jit__text_printf(&e->tb, ") -> (");
  if (op->affine) {
    jit__text_printf(&e->tb, "%s)>", op->affine);
    return;
  }
  for (int d = 0; d < op->rank; d++) {
    if (op->map[d] < 0)
      jit__text_printf(&e->tb, "%s0", d ? ", " : "");
    else
      jit__text_printf(&e->tb, "%sd%d", d ? ", " : "", op->map[d]);
  }
  jit__text_printf(&e->tb, ")>");
}

// erf(x) in f32 as a rational function on x clamped to [-4, 4] (erf is 1 to f32
// precision beyond): x P(x^2) / Q(x^2), P of degree 6 and Q of degree 4 in x^2, the
// approximation Eigen and XLA use; no transcendental call, so it vectorizes on every
// backend. Within 4.2e-7 of erf (absolute and relative) over all f32. Returns the
// result's name.
static const char *emit_erf(jit__text *tb, const char *x) {
  static const char *const p[] = {"-2.72614225801306e-10", "2.77068142495902e-08",
                                  "-2.10102402082508e-06", "-5.69250639462346e-05",
                                  "-7.34990630326855e-04", "-2.95459980854025e-03",
                                  "-1.60960333262415e-02"};
  static const char *const q[] = {"-1.45660718464996e-05", "-2.13374055278905e-04",
                                  "-1.68282697438203e-03", "-7.37332916720468e-03",
                                  "-1.42647390514189e-02"};
  // Names from 100 up (%c1xx constants, %t1xx values), so that a body around it (gelu)
  // keeps %t0.. and fusion's renaming of %t<digits> / %c<digits> covers them.
  jit__text_printf(tb,
                   "    %%c100 = arith.constant 4.0 : f32\n"
                   "    %%c101 = arith.constant -4.0 : f32\n"
                   "    %%t100 = arith.minimumf %s, %%c100 : f32\n"
                   "    %%t101 = arith.maximumf %%t100, %%c101 : f32\n"
                   "    %%t102 = arith.mulf %%t101, %%t101 : f32\n",
                   x);
  for (int i = 0; i < 7; i++)
    jit__text_printf(tb, "    %%c%d = arith.constant %s : f32\n", 110 + i, p[i]);
  for (int i = 0; i < 5; i++)
    jit__text_printf(tb, "    %%c%d = arith.constant %s : f32\n", 120 + i, q[i]);
  // Horner in x^2: acc = C[0]; acc = acc * x2 + C[i] (%t11i / %t12i after step i).
  for (int i = 1; i < 7; i++)
    jit__text_printf(tb,
                     "    %%t%d = arith.mulf %%%c%d, %%t102 : f32\n"
                     "    %%t%d = arith.addf %%t%d, %%c%d : f32\n",
                     140 + i, i == 1 ? 'c' : 't', 110 + i - 1, 110 + i, 140 + i, 110 + i);
  for (int i = 1; i < 5; i++)
    jit__text_printf(tb,
                     "    %%t%d = arith.mulf %%%c%d, %%t102 : f32\n"
                     "    %%t%d = arith.addf %%t%d, %%c%d : f32\n",
                     150 + i, i == 1 ? 'c' : 't', 120 + i - 1, 120 + i, 150 + i, 120 + i);
  jit__text_printf(tb,
                   "    %%t130 = arith.mulf %%t101, %%t116 : f32\n"
                   "    %%t131 = arith.divf %%t130, %%t124 : f32\n");
  return "%t131";
}

// Body statements; returns the name of the f32 result. Names inside a region only need
// to be unique within it, so every body reuses %c*, %t*.
// pow(x, y) as IEEE pow: |x|^y = exp(y log|x|) (1 where |x| = 1, so (-1)^inf is 1),
// negated for an odd integer y where x's sign is negative (-0 and -inf included: (-0)^-1
// is -inf), NaN for a finite negative x to a non-integer y, and pow(x, 0) = pow(1, y)
// = 1 even for NaN. An infinite y counts as an even integer.
static const char *emit_pow(jit__text *tb, const char *x, const char *y) {
  jit__text_printf(tb,
                   "    %%c0 = arith.constant 0.0 : f32\n"
                   "    %%c1 = arith.constant 1.0 : f32\n"
                   "    %%c2 = arith.constant 0.5 : f32\n"
                   "    %%c3 = arith.constant 2.0 : f32\n"
                   "    %%c4 = arith.constant 0x7FC00000 : f32\n"
                   "    %%c5 = arith.constant 0xFF800000 : f32\n"
                   "    %%t0 = math.absf %s : f32\n"
                   "    %%t1 = math.log %%t0 : f32\n"
                   "    %%t2 = arith.mulf %s, %%t1 : f32\n"
                   "    %%t3 = math.exp %%t2 : f32\n"
                   "    %%t4 = arith.cmpf oeq, %%t0, %%c1 : f32\n"
                   "    %%t5 = arith.select %%t4, %%c1, %%t3 : f32\n",
                   x, y);
  // y an integer (t7), odd (t11); x's sign negative (t15: x < 0, or 1/x < 0 for -0).
  jit__text_printf(tb,
                   "    %%t6 = math.floor %s : f32\n"
                   "    %%t7 = arith.cmpf oeq, %%t6, %s : f32\n"
                   "    %%t8 = arith.mulf %s, %%c2 : f32\n"
                   "    %%t9 = math.floor %%t8 : f32\n"
                   "    %%t10 = arith.mulf %%t9, %%c3 : f32\n"
                   "    %%t11 = arith.cmpf one, %%t10, %s : f32\n"
                   "    %%t12 = arith.andi %%t7, %%t11 : i1\n"
                   "    %%t13 = arith.cmpf olt, %s, %%c0 : f32\n"
                   "    %%t14 = arith.divf %%c1, %s : f32\n"
                   "    %%t15 = arith.cmpf olt, %%t14, %%c0 : f32\n"
                   "    %%t16 = arith.ori %%t13, %%t15 : i1\n"
                   "    %%t17 = arith.andi %%t16, %%t12 : i1\n"
                   "    %%t18 = arith.negf %%t5 : f32\n"
                   "    %%t19 = arith.select %%t17, %%t18, %%t5 : f32\n",
                   y, y, y, y, x, x);
  jit__text_printf(tb,
                   "    %%t20 = arith.cmpf ogt, %s, %%c5 : f32\n"
                   "    %%t21 = arith.andi %%t13, %%t20 : i1\n"
                   "    %%t22 = arith.cmpf une, %%t6, %s : f32\n"
                   "    %%t23 = arith.andi %%t21, %%t22 : i1\n"
                   "    %%t24 = arith.select %%t23, %%c4, %%t19 : f32\n"
                   "    %%t25 = arith.cmpf oeq, %s, %%c0 : f32\n"
                   "    %%t26 = arith.cmpf oeq, %s, %%c1 : f32\n"
                   "    %%t27 = arith.ori %%t25, %%t26 : i1\n"
                   "    %%t28 = arith.select %%t27, %%c1, %%t24 : f32\n",
                   x, y, y, x);
  return "%t28";
}

static const char *emit_body(jit__emitter *e, jit__body_kind kind, const char *x, const char *y,
                             const char *z, const char *out, const char *by) {
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
    case JIT__B_ERF:
      return emit_erf(tb, x);
    case JIT__B_ROUND:
      // Exact on every target: llvm.roundeven on the CPU (whose pipeline keeps
      // math-expand-ops off it, compile_cpu.c), RoundEven in SPIR-V, cvt.rni in PTX.
      jit__text_printf(tb, "    %%t0 = math.roundeven %s : f32\n", x);
      return "%t0";
    case JIT__B_GELU_ERF: {
      // 0.5 x (1 + erf(x / sqrt(2))): PyTorch's default gelu.
      jit__text_printf(tb, "    %%c0 = arith.constant 0.70710678118654752 : f32\n"
                           "    %%t0 = arith.mulf %s, %%c0 : f32\n", x);
      const char *erf = emit_erf(tb, "%t0");
      jit__text_printf(tb,
                       "    %%c1 = arith.constant 1.0 : f32\n"
                       "    %%c2 = arith.constant 0.5 : f32\n"
                       "    %%t1 = arith.addf %%c1, %s : f32\n"
                       "    %%t2 = arith.mulf %%c2, %s : f32\n"
                       "    %%t3 = arith.mulf %%t2, %%t1 : f32\n",
                       erf, x);
      return "%t3";
    }
    case JIT__B_LT: case JIT__B_LE: case JIT__B_GT: case JIT__B_GE: case JIT__B_EQ:
    case JIT__B_NE: {
      // Ordered, except "not equal", which holds for NaN (as in C and NumPy).
      static const char *const preds[] = {"olt", "ole", "ogt", "oge", "oeq", "une"};
      jit__text_printf(tb,
                       "    %%c0 = arith.constant 0.0 : f32\n"
                       "    %%c1 = arith.constant 1.0 : f32\n"
                       "    %%t0 = arith.cmpf %s, %s, %s : f32\n"
                       "    %%t1 = arith.select %%t0, %%c1, %%c0 : f32\n",
                       preds[kind - JIT__B_LT], x, y);
      return "%t1";
    }
    case JIT__B_POW:
      return emit_pow(tb, x, y);
    case JIT__B_SELECT:
      jit__text_printf(tb,
                       "    %%c0 = arith.constant 0.0 : f32\n"
                       "    %%t0 = arith.cmpf une, %s, %%c0 : f32\n"
                       "    %%t1 = arith.select %%t0, %s, %s : f32\n",
                       x, y, z);
      return "%t1";
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
void jit__emit_generic_open(jit__emitter *e, const char *res, int n_loops, const char *iters,
                            const jit__gen_operand *ins, int n_in,
                            const jit__gen_operand *out) {
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
  jit__text_printf(tb, "]%s}", e->split_next ? ", jit_split" : "");
  e->split_next = false;
  if (n_in) {  // a generic of its indices alone has no ins
    jit__text_printf(tb, " ins(");
    for (int i = 0; i < n_in; i++) jit__text_printf(tb, "%s%s", i ? ", " : "", ins[i].name);
    jit__text_printf(tb, " : ");
    for (int i = 0; i < n_in; i++)
      jit__text_printf(tb, "%s%s", i ? ", " : "",
                       jit__tensor_type(ins[i].dt, ins[i].rank, ins[i].dims).s);
    jit__text_printf(tb, ")");
  }
  jit__str out_ty = jit__tensor_type(out->dt, out->rank, out->dims);
  jit__text_printf(tb, " outs(%s : %s) {\n  ^bb0(", out->name, out_ty.s);
  for (int i = 0; i < n_in; i++) jit__text_printf(tb, "%%in%d: %s, ", i, elem_name(ins[i].dt));
  jit__text_printf(tb, "%%out: %s):\n", elem_name(out->dt));
}

const char *jit__emit_body_step(jit__emitter *e, jit__body_kind kind, const char *x,
                                const char *y, const char *z, int step, char name[16]) {
  // Into a text of its own, then copied with %t.. and %c.. renamed %s<step>t..: each
  // body writes those names from 0.
  jit__text mine = {0}, keep = e->tb;
  e->tb = mine;
  const char *r = emit_body(e, kind, x, y, z, "%out", NULL);
  mine = e->tb;
  e->tb = keep;
  e->tb.oom |= mine.oom;
  for (size_t i = 0; i < mine.len; i++) {
    char ch = mine.p[i];
    if (ch == '%' && i + 2 < mine.len && (mine.p[i + 1] == 't' || mine.p[i + 1] == 'c') &&
        mine.p[i + 2] >= '0' && mine.p[i + 2] <= '9') {
      jit__text_printf(&e->tb, "%%s%d%c", step, mine.p[i + 1]);
      i++;
      continue;
    }
    jit__text_append(&e->tb, &ch, 1);
  }
  free(mine.p);
  if ((r[1] == 't' || r[1] == 'c') && r[2] >= '0' && r[2] <= '9') {
    snprintf(name, 16, "%%s%d%s", step, r + 1);
    return name;
  }
  return r;  // one of x, y, z
}

// The body of a cast from or to an integer (jit_cast): int -> float exactly where the
// float can hold it (else rounded to nearest even), float -> int truncated toward zero
// and saturated to the integer's range with NaN as 0 (C leaves both undefined; this is
// what a quantizer clamps to anyway), int -> int sign-extended or wrapped (as NumPy and
// PyTorch do).
static const char *emit_int_convert(jit__text *tb, jit__dtype from, jit__dtype to) {
  const char *fe = elem_name(from), *te = elem_name(to);
  int fb = 8 * jit__dtype_bytes(from), tbits = 8 * jit__dtype_bytes(to);
  if (jit__dtype_is_int(from) && jit__dtype_is_int(to)) {
    jit__text_printf(tb, "    %%y = arith.%s %%in0 : %s to %s\n", tbits > fb ? "extsi" : "trunci",
                     fe, te);
    return "%y";
  }
  if (jit__dtype_is_int(from)) {  // to a float: through f32 for the 16-bit ones
    jit__text_printf(tb, "    %%x0 = arith.sitofp %%in0 : %s to f32\n", fe);
    if (!jit__dtype_is_half(to)) return "%x0";
    jit__text_printf(tb, "    %%y = arith.truncf %%x0 : f32 to %s\n", te);
    return "%y";
  }
  // A float to an integer: clamped to the range's ends as f32 (for the wide ones the
  // largest f32 below 2^31 / 2^63), and what is at or past 2^31 / 2^63 is the maximum.
  static const char *const lo[] = {[8] = "-128.0", [32] = "-2147483648.0",
                                   [64] = "-9223372036854775808.0"};
  static const char *const hi[] = {[8] = "127.0", [32] = "2147483520.0",
                                   [64] = "9223371487098961920.0"};
  static const char *const top[] = {[8] = "128.0", [32] = "2147483648.0",
                                    [64] = "9223372036854775808.0"};
  static const char *const max[] = {[8] = "127", [32] = "2147483647",
                                    [64] = "9223372036854775807"};
  const char *x = "%in0";
  if (jit__dtype_is_half(from)) {
    jit__text_printf(tb, "    %%x0 = arith.extf %%in0 : %s to f32\n", fe);
    x = "%x0";
  }
  jit__text_printf(tb,
                   "    %%c0 = arith.constant %s : f32\n"
                   "    %%c1 = arith.constant %s : f32\n"
                   "    %%c2 = arith.constant 0 : %s\n"
                   "    %%t0 = arith.maximumf %s, %%c0 : f32\n"
                   "    %%t1 = arith.minimumf %%t0, %%c1 : f32\n"
                   "    %%t2 = arith.fptosi %%t1 : f32 to %s\n"
                   "    %%c3 = arith.constant %s : f32\n"
                   "    %%c4 = arith.constant %s : %s\n"
                   "    %%t3 = arith.cmpf oge, %s, %%c3 : f32\n"
                   "    %%t4 = arith.select %%t3, %%c4, %%t2 : %s\n"
                   "    %%t5 = arith.cmpf uno, %s, %s : f32\n"
                   "    %%y = arith.select %%t5, %%c2, %%t4 : %s\n",
                   lo[tbits], hi[tbits], te, x, te, top[tbits], max[tbits], te, x, te, x, x,
                   te);
  return "%y";
}

void jit__emit_generic(jit__emitter *e, const char *res, int n_loops, const char *iters,
                         const jit__gen_operand *ins, int n_in, const jit__gen_operand *out,
                         jit__body_kind kind, const char *by) {
  jit__text *tb = &e->tb;
  jit__emit_generic_open(e, res, n_loops, iters, ins, n_in, out);
  jit__str out_ty = jit__tensor_type(out->dt, out->rank, out->dims);
  const char *result;
  char xs[3][8] = {"", "", ""};  // the body's inputs; `result` may be one of them
  if (kind == JIT__B_COPY && n_in == 1 && ins[0].dt == out->dt) {
    result = "%in0";
  } else if (kind == JIT__B_COPY && n_in == 1 &&
             (jit__dtype_is_int(ins[0].dt) || jit__dtype_is_int(out->dt))) {
    result = emit_int_convert(tb, ins[0].dt, out->dt);
  } else {
    for (int i = 0; i < n_in && i < 3; i++) {
      if (jit__dtype_is_half(ins[i].dt)) {
        jit__text_printf(tb, "    %%x%d = arith.extf %%in%d : %s to f32\n", i, i,
                         elem_name(ins[i].dt));
        snprintf(xs[i], sizeof xs[i], "%%x%d", i);
      } else {
        snprintf(xs[i], sizeof xs[i], "%%in%d", i);
      }
    }
    // Accumulating outs are always f32, so %out never needs extending.
    result = emit_body(e, kind, xs[0], xs[1], xs[2], "%out", by);
    if (jit__dtype_is_half(out->dt)) {
      jit__text_printf(tb, "    %%y = arith.truncf %s : f32 to %s\n", result,
                       elem_name(out->dt));
      result = "%y";
    }
  }
  jit__text_printf(tb, "    linalg.yield %s : %s\n  } -> %s\n", result, elem_name(out->dt),
            out_ty.s);
}

jit__gen_operand jit__node_operand(jit__emitter *e, uint32_t id) {
  const jit__node *n = &e->g->nodes[id];
  jit__gen_operand op = {e->names[id], n->dtype, n->rank, n->dims, {0}, e->dv[id], NULL};
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
  jit__gen_operand in = {x, from, rank, dims, {0}, NULL, NULL};
  jit__gen_operand out = {empty.s, to, rank, dims, {0}, NULL, NULL};
  jit__identity_map(&in);
  jit__identity_map(&out);
  char iters[JIT_MAX_RANK];
  memset(iters, 'p', sizeof iters);
  jit__emit_generic(e, res.s, rank, iters, &in, 1, &out, JIT__B_COPY, NULL);
  return res;
}

// The 16-bit result (the current node's dtype, f16 or bf16) of an f32 accumulator
// `acc`: one rounding, after the sum.
jit__str jit__emit_f16_result(jit__emitter *e, const char *acc, int rank, const int64_t *dims,
                           const jit__dimval *dv, bool final) {
  return jit__emit_convert(e, acc, JIT__F32, e->g->nodes[e->cur].dtype, rank, dims, dv, final);
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

jit__str jit__emit_index_const(jit__emitter *e, int64_t v) {
  jit__str c = jit__value_name(e, false);
  jit__text_printf(&e->tb, "  %s = arith.constant %lld : index\n", c.s, (long long)v);
  return c;
}

jit__str jit__emit_size(jit__emitter *e, int64_t size, const jit__dimval *dv) {
  if (size >= 0) return jit__emit_index_const(e, size);
  jit__str v;
  snprintf(v.s, sizeof v.s, "%s", dv->s);
  return v;
}

jit__str jit__emit_reshape_dyn(jit__emitter *e, const char *x, jit__dtype dt, int rank,
                               const int64_t *dims, int to_rank, const int64_t *to,
                               const jit__dimval *to_dv, bool final) {
  bool dynamic = false;
  for (int d = 0; d < to_rank; d++) dynamic |= to[d] < 0;
  if (!dynamic) return jit__emit_reshape_to(e, x, dt, rank, dims, to_rank, to, final);
  char elems[JIT_MAX_RANK][40];
  for (int d = 0; d < to_rank; d++) {
    jit__str v = jit__value_name(e, false);
    if (to[d] >= 0)
      jit__text_printf(&e->tb, "  %s = arith.constant %lld : i64\n", v.s, (long long)to[d]);
    else
      jit__text_printf(&e->tb, "  %s = arith.index_cast %s : index to i64\n", v.s,
                       to_dv[d].s);
    snprintf(elems[d], sizeof elems[d], "%.39s", v.s);
  }
  jit__str shape = jit__value_name(e, false), res = jit__value_name(e, final);
  jit__text_printf(&e->tb, "  %s = tensor.from_elements ", shape.s);
  for (int d = 0; d < to_rank; d++) jit__text_printf(&e->tb, "%s%s", d ? ", " : "", elems[d]);
  jit__text_printf(&e->tb, " : tensor<%dxi64>\n", to_rank);
  jit__text_printf(&e->tb, "  %s = tensor.reshape %s(%s) : (%s, tensor<%dxi64>) -> %s\n",
                   res.s, x, shape.s, jit__tensor_type(dt, rank, dims).s, to_rank,
                   jit__tensor_type(dt, to_rank, to).s);
  return res;
}

const jit__dimval *jit__symbol_value(const jit__emitter *e, int64_t code) {
  for (uint32_t i = 0; i < e->g->n_inputs; i++) {
    const jit__node *in = &e->g->nodes[e->g->inputs[i]];
    for (int d = 0; d < in->rank; d++)
      if (in->dims[d] == code) return &e->dv[e->g->inputs[i]][d];
  }
  return NULL;
}
