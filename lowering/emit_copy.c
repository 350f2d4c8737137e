//===--- emit_copy.c - concat, slice and pad: copies at computed positions --===//
//
// Each is one linalg.generic over its result, with no inputs: the body takes the loop
// indices (linalg.index), computes where the element comes from, and reads it with
// tensor.extract at an index clamped into the source, selecting between sources (a
// concat's two operands, a pad's value) where the position decides. Piecewise reads
// have no affine map. tensor.insert_slice / extract_slice / tensor.pad would bufferize
// to strided memref.copy: on the CPU a call per copy to devices/cpu's element-by-element
// memrefCopy, on the GPUs the copy wrapping of compile_gpu.c; one parallel generic is
// the form every back end already lowers well. The CPU strategy leaves these loops to
// LLVM (lowering/cpu/plan_rows.c); the GPU back ends map them as any parallel loop.
//
// Symbolic mode: a `?` size of the result (a concat of `?` dims, a slice or a pad of
// one) is computed from the operands' sizes with index arithmetic before the generic.
//
//===----------------------------------------------------------------------===//
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "base/text.h"
#include "lowering/emit.h"
#include "lowering/lower.h"

// The size of dim d of operand `x` as an index value.
static void size_value(jit__emitter *e, const jit__gen_operand *x, int d, jit__dimval *out) {
  jit__str v = jit__emit_size(e, x->dims[d], x->dv ? &x->dv[d] : NULL);
  snprintf(out->s, sizeof out->s, "%.39s", v.s);
}

// `*out` = a op b on index values, at function level.
static void index_op(jit__emitter *e, const char *op, const char *a, const char *b,
                     jit__dimval *out) {
  jit__str r = jit__value_name(e, false);
  jit__text_printf(&e->tb, "  %s = arith.%s %s, %s : index\n", r.s, op, a, b);
  snprintf(out->s, sizeof out->s, "%.39s", r.s);
}

static void index_const(jit__emitter *e, int64_t v, jit__dimval *out) {
  jit__str c = jit__emit_index_const(e, v);
  snprintf(out->s, sizeof out->s, "%.39s", c.s);
}

// A slice's start and length on a dim of size `n` (an index value: a `?` dim, or a
// bound that follows a symbol), NumPy's clamping as jit__slice_bounds: start =
// clamp(lo < 0 ? lo + n : lo, 0, n), same for stop, and length = stop > start ?
// (stop - start - 1) / step + 1 : 0. A bound with a symbol is that symbol's value plus
// lo[0] (hi[0]), whose sign is known only at run time.
static jit_status slice_values(jit__emitter *e, const char *n, const jit__span *s,
                               jit__dimval *start, jit__dimval *len) {
  jit__dimval zero, b[2];
  index_const(e, 0, &zero);
  for (int i = 0; i < 2; i++) {
    int64_t v = i ? s->hi[0] : s->lo[0], sym = i ? s->hi_sym : s->lo_sym;
    jit__dimval c, t;
    index_const(e, v, &c);
    if (sym) {
      const jit__dimval *sv = jit__symbol_value(e, sym);
      if (!sv || !sv->s[0]) return jit__node_error(e, "a slice bound's symbol is no input dim");
      jit__dimval x, neg, wrapped, sel, lo;
      index_op(e, "addi", sv->s, c.s, &x);
      index_op(e, "addi", x.s, n, &wrapped);
      jit__str cmp = jit__value_name(e, false);
      jit__text_printf(&e->tb, "  %s = arith.cmpi slt, %s, %s : index\n", cmp.s, x.s, zero.s);
      snprintf(neg.s, sizeof neg.s, "%.39s", cmp.s);
      jit__str r = jit__value_name(e, false);
      jit__text_printf(&e->tb, "  %s = arith.select %s, %s, %s : index\n", r.s, neg.s,
                       wrapped.s, x.s);
      snprintf(sel.s, sizeof sel.s, "%.39s", r.s);
      index_op(e, "maxsi", sel.s, zero.s, &lo);
      index_op(e, "minsi", lo.s, n, &b[i]);
    } else if (v < 0) {
      index_op(e, "addi", n, c.s, &t);
      index_op(e, "maxsi", t.s, zero.s, &b[i]);
    } else {
      index_op(e, "minsi", c.s, n, &b[i]);
    }
  }
  *start = b[0];
  jit__dimval diff, one, step, q, l;
  index_op(e, "subi", b[1].s, b[0].s, &diff);
  index_const(e, 1, &one);
  index_const(e, s->step, &step);
  index_op(e, "subi", diff.s, one.s, &q);
  index_op(e, "divsi", q.s, step.s, &l);
  index_op(e, "addi", l.s, one.s, &q);
  // Empty when stop <= start (the binding's rule refuses it; kept well-defined).
  index_op(e, "maxsi", q.s, zero.s, len);
  return NULL;
}

// The opening of the generic over `n`'s result (no inputs) and its loop indices %ci<d>.
static void open_body(jit__emitter *e, const jit__node *n, const char *empty, const char *res) {
  jit__text *tb = &e->tb;
  jit__text_printf(tb, "  %s = linalg.generic {indexing_maps = [affine_map<(", res);
  for (int d = 0; d < n->rank; d++) jit__text_printf(tb, "%sd%d", d ? ", " : "", d);
  jit__text_printf(tb, ") -> (");
  for (int d = 0; d < n->rank; d++) jit__text_printf(tb, "%sd%d", d ? ", " : "", d);
  jit__text_printf(tb, ")>], iterator_types = [");
  for (int d = 0; d < n->rank; d++) jit__text_printf(tb, "%s\"parallel\"", d ? ", " : "");
  jit__text_printf(tb, "]} outs(%s : %s) {\n  ^bb0(%%out: %s):\n    %%cz = arith.constant 0 : "
                   "index\n", empty, jit__tensor_type(n->dtype, n->rank, n->dims).s,
                   jit__dtype_str(n->dtype));
  for (int d = 0; d < n->rank; d++)
    jit__text_printf(tb, "    %%ci%d = linalg.index %d : index\n", d, d);
}

// `%<name> = tensor.extract x[...]` with index `axis_idx` on dim `axis` (-1: none)
// and the loop indices elsewhere.
static void extract(jit__emitter *e, const char *name, const jit__gen_operand *x, int axis,
                    const char *axis_idx) {
  jit__text_printf(&e->tb, "    %%%s = tensor.extract %s[", name, x->name);
  for (int d = 0; d < x->rank; d++) {
    if (d == axis) jit__text_printf(&e->tb, "%s%s", d ? ", " : "", axis_idx);
    else jit__text_printf(&e->tb, "%s%%ci%d", d ? ", " : "", d);
  }
  jit__text_printf(&e->tb, "] : %s\n", jit__tensor_type(x->dt, x->rank, x->dims).s);
}

// Outside the body: the values of the result's `?` dims (symbolic mode), into dv.
static jit_status result_sizes(jit__emitter *e, const jit__node *n,
                               const jit__gen_operand *a, const jit__gen_operand *b,
                               jit__dimval *dv) {
  for (int d = 0; d < n->rank; d++) {
    if (n->dims[d] >= 0) continue;
    if (n->op == JIT__OP_CONCAT && d == n->axis) {
      jit__dimval x, y;
      size_value(e, a, d, &x);
      size_value(e, b, d, &y);
      index_op(e, "addi", x.s, y.s, &dv[d]);
    } else if (n->op == JIT__OP_SLICE && d == n->axis) {
      jit__dimval start, size;
      size_value(e, a, d, &size);
      JIT_PROPAGATE(slice_values(e, size.s, &n->span, &start, &dv[d]));
    } else if (n->op == JIT__OP_PAD && (n->span.lo[d] || n->span.hi[d])) {
      jit__dimval c;
      index_const(e, n->span.lo[d] + n->span.hi[d], &c);
      index_op(e, "addi", a->dv[d].s, c.s, &dv[d]);
    } else {
      dv[d] = a->dims[d] < 0 ? a->dv[d] : b->dv[d];
    }
  }
  return NULL;
}

jit_status jit__emit_index_copy(jit__emitter *e, const jit__node *n) {
  jit__gen_operand a = jit__node_operand(e, n->operands[0]);
  jit__gen_operand b = n->op == JIT__OP_CONCAT ? jit__node_operand(e, n->operands[1]) : a;
  if (a.rank != n->rank || b.rank != n->rank) return jit__node_error(e, "rank changes");
  jit__dimval *dv = e->dv[e->cur];
  if (n->op == JIT__OP_SLICE && !e->symbolic && (n->span.lo_sym || n->span.hi_sym))
    return jit__node_error(e, "slice bounds follow a symbol in a specialized graph");
  if (e->symbolic) JIT_PROPAGATE(result_sizes(e, n, &a, &b, dv));
  // What the body needs from outside it: a concat's split point, a slice's start.
  jit__dimval split = {{0}}, start = {{0}}, len;
  if (n->op == JIT__OP_CONCAT) {
    size_value(e, &a, n->axis, &split);
  } else if (n->op == JIT__OP_SLICE) {
    int64_t s0 = 0, l0 = 0;
    if (a.dims[n->axis] >= 0 && !n->span.lo_sym && !n->span.hi_sym) {
      jit__slice_bounds(a.dims[n->axis], &n->span, &s0, &l0);
      index_const(e, s0, &start);
    } else {
      jit__dimval size;
      size_value(e, &a, n->axis, &size);
      JIT_PROPAGATE(slice_values(e, size.s, &n->span, &start, &len));
    }
  }
  jit__dimval sizes[JIT_MAX_RANK];
  if (n->op == JIT__OP_PAD)
    for (int d = 0; d < a.rank; d++) size_value(e, &a, d, &sizes[d]);
  jit__str empty = jit__value_name(e, false), res = jit__value_name(e, true);
  jit__emit_empty(e, empty.s, n->dtype, n->rank, n->dims, dv);
  open_body(e, n, empty.s, res.s);
  jit__text *tb = &e->tb;
  const char *et = jit__dtype_str(n->dtype);
  int ax = n->axis;
  if (n->op == JIT__OP_CONCAT) {
    // i < A: a[i], else b[i - A]; both reads stay in bounds.
    jit__text_printf(tb,
                     "    %%cin = arith.cmpi ult, %%ci%d, %s : index\n"
                     "    %%cia = arith.select %%cin, %%ci%d, %%cz : index\n"
                     "    %%cbs = arith.subi %%ci%d, %s : index\n"
                     "    %%cib = arith.select %%cin, %%cz, %%cbs : index\n",
                     ax, split.s, ax, ax, split.s);
    extract(e, "cva", &a, ax, "%cia");
    extract(e, "cvb", &b, ax, "%cib");
    jit__text_printf(tb, "    %%cv = arith.select %%cin, %%cva, %%cvb : %s\n", et);
  } else if (n->op == JIT__OP_SLICE) {
    jit__text_printf(tb,
                     "    %%cst = arith.constant %lld : index\n"
                     "    %%cm = arith.muli %%ci%d, %%cst : index\n"
                     "    %%cx = arith.addi %%cm, %s : index\n",
                     (long long)n->span.step, ax, start.s);
    extract(e, "cv", &a, ax, "%cx");
  } else if (n->axis != JIT_PAD_CONSTANT) {
    // Reflect: p = i - lo mirrored at both ends (-p below 0, 2 (n - 1) - p past n - 1);
    // circular: p wrapped; replicate: p clamped. Every way clamped into [0, n - 1], so
    // every read is inside.
    for (int d = 0; d < a.rank; d++) {
      jit__text_printf(tb,
                       "    %%cl%d = arith.constant %lld : index\n"
                       "    %%cp%d = arith.subi %%ci%d, %%cl%d : index\n"
                       "    %%cu%d = arith.constant 1 : index\n"
                       "    %%cn%d = arith.subi %s, %%cu%d : index\n",
                       d, (long long)n->span.lo[d], d, d, d, d, d, sizes[d].s, d);
      char p[16];
      snprintf(p, sizeof p, "%%cp%d", d);
      if (n->axis == JIT_PAD_REFLECT) {
        jit__text_printf(tb,
                         "    %%cr%d = arith.subi %%cz, %%cp%d : index\n"
                         "    %%cs%d = arith.cmpi slt, %%cp%d, %%cz : index\n"
                         "    %%ca%d = arith.select %%cs%d, %%cr%d, %%cp%d : index\n"
                         "    %%cb%d = arith.addi %%cn%d, %%cn%d : index\n"
                         "    %%cc%d = arith.subi %%cb%d, %%ca%d : index\n"
                         "    %%cg%d = arith.cmpi sgt, %%ca%d, %%cn%d : index\n"
                         "    %%ch%d = arith.select %%cg%d, %%cc%d, %%ca%d : index\n",
                         d, d, d, d, d, d, d, d, d, d, d, d, d, d, d, d, d, d, d, d, d);
        snprintf(p, sizeof p, "%%ch%d", d);
      } else if (n->axis == JIT_PAD_CIRCULAR) {
        // ((p mod n) + n) mod n: p is in [-n, 2n) (each pad at most n).
        jit__text_printf(tb,
                         "    %%cw%d = arith.addi %%cn%d, %%cu%d : index\n"
                         "    %%cr%d = arith.remsi %%cp%d, %%cw%d : index\n"
                         "    %%cs%d = arith.addi %%cr%d, %%cw%d : index\n"
                         "    %%ch%d = arith.remsi %%cs%d, %%cw%d : index\n",
                         d, d, d, d, d, d, d, d, d, d, d, d);
        snprintf(p, sizeof p, "%%ch%d", d);
      }
      jit__text_printf(tb,
                       "    %%cm%d = arith.maxsi %s, %%cz : index\n"
                       "    %%cq%d = arith.minsi %%cm%d, %%cn%d : index\n",
                       d, p, d, d, d);
    }
    jit__text_printf(tb, "    %%cv = tensor.extract %s[", a.name);
    for (int d = 0; d < a.rank; d++) jit__text_printf(tb, "%s%%cq%d", d ? ", " : "", d);
    jit__text_printf(tb, "] : %s\n", jit__tensor_type(a.dt, a.rank, a.dims).s);
  } else {
    // Inside x on every dim: x[i - lo], else the value.
    jit__text_printf(tb, "    %%cok = arith.constant true\n");
    char prev[16] = "%cok";
    for (int d = 0; d < a.rank; d++) {
      jit__text_printf(tb,
                       "    %%cl%d = arith.constant %lld : index\n"
                       "    %%cp%d = arith.subi %%ci%d, %%cl%d : index\n"
                       "    %%co%d = arith.cmpi ult, %%cp%d, %s : index\n"
                       "    %%cq%d = arith.select %%co%d, %%cp%d, %%cz : index\n"
                       "    %%ck%d = arith.andi %s, %%co%d : i1\n",
                       d, (long long)n->span.lo[d], d, d, d, d, d, sizes[d].s, d, d, d, d,
                       prev, d);
      snprintf(prev, sizeof prev, "%%ck%d", d);
    }
    jit__text_printf(tb, "    %%cin = arith.andi %s, %%cok : i1\n", prev);
    jit__text_printf(tb, "    %%cx = tensor.extract %s[", a.name);
    for (int d = 0; d < a.rank; d++) jit__text_printf(tb, "%s%%cq%d", d ? ", " : "", d);
    jit__text_printf(tb, "] : %s\n"
                     "    %%cpv = arith.constant %s : %s\n"
                     "    %%cv = arith.select %%cin, %%cx, %%cpv : %s\n",
                     jit__tensor_type(a.dt, a.rank, a.dims).s,
                     jit__float_literal(n->scalar, n->dtype).s, et, et);
  }
  jit__text_printf(tb, "    linalg.yield %%cv : %s\n  } -> %s\n", et,
                   jit__tensor_type(n->dtype, n->rank, n->dims).s);
  return NULL;
}
