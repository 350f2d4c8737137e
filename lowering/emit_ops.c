//===--- emit_ops.c - elementwise ops, reductions, softmax, transpose, reshape ===//
//
// The jit__emitter's ops other than matmul (emit.h). Each writes node e->cur, in
// static or symbolic mode through the same code: in symbolic mode a `?` result dim
// takes its size (e->dv) from the operand dim its loop walks, or for a reshape from
// the symbols it asked for.
//
//===----------------------------------------------------------------------===//
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "base/text.h"
#include "lowering/emit.h"
#include "lowering/lower.h"

//===--- Ops --------------------------------------------------------------------===//

static bool same_dims(int ra, const int64_t *a, int rb, const int64_t *b) {
  return ra == rb && !memcmp(a, b, sizeof(int64_t) * (size_t)ra);
}

// An elementwise node that reads a batched matmul's result (e->flat) whole, and its
// other operands only along the dims that the named op kept (a bias over N, a scalar),
// computed in the named op's shape too, so that the strategy sees the matmul's
// consumer directly (a bias + activation epilogue fused into its register tiles);
// the node's own value is a reshape of that. False (nothing written) otherwise.
static bool emit_elementwise_flat(jit__emitter *e, const jit__node *n, jit__body_kind kind) {
  const struct jit__flat_value *ref = NULL;
  for (int i = 0; i < n->n_operands && !ref; i++) {
    uint32_t id = n->operands[i];
    const jit__node *x = &e->g->nodes[id];
    if (e->flat[id].rank && same_dims(x->rank, x->dims, n->rank, n->dims)) ref = &e->flat[id];
  }
  if (!ref) return false;
  int fr = ref->rank, lead = n->rank - fr + 1;  // node dims [0, lead) are flat dim 0
  jit__gen_operand ins[3];
  for (int i = 0; i < n->n_operands; i++) {
    uint32_t id = n->operands[i];
    const jit__node *x = &e->g->nodes[id];
    const struct jit__flat_value *f = &e->flat[id];
    if (f->rank == fr && same_dims(x->rank, x->dims, n->rank, n->dims) &&
        same_dims(f->rank, f->dims, fr, ref->dims)) {
      ins[i] = (jit__gen_operand){f->name.s, x->dtype, fr, ref->dims, {0}, NULL, NULL};
      jit__identity_map(&ins[i]);
      continue;
    }
    ins[i] = jit__node_operand(e, id);
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
  jit__str empty = jit__value_name(e, false), flat = jit__value_name(e, false);
  jit__emit_empty(e, empty.s, n->dtype, fr, ref->dims, NULL);
  jit__gen_operand out = {empty.s, n->dtype, fr, ref->dims, {0}, NULL, NULL};
  jit__identity_map(&out);
  char iters[JIT_MAX_RANK + 1];
  memset(iters, 'p', sizeof iters);
  jit__emit_generic(e, flat.s, fr, iters, ins, n->n_operands, &out, kind, NULL);
  struct jit__flat_value *mine = &e->flat[e->cur];
  int64_t dims[3];
  memcpy(dims, ref->dims, sizeof dims);
  jit__emit_reshape_to(e, flat.s, n->dtype, fr, dims, n->rank, n->dims, true);
  mine->name = flat;
  mine->rank = fr;
  memcpy(mine->dims, dims, sizeof dims);
  return true;
}

jit__body_kind jit__elementwise_kind(jit__op op) {
  static const jit__body_kind kinds[JIT__OP_COUNT_] = {
      [JIT__OP_ADD] = JIT__B_ADD,         [JIT__OP_SUB] = JIT__B_SUB,   [JIT__OP_MUL] = JIT__B_MUL,
      [JIT__OP_DIV] = JIT__B_DIV,         [JIT__OP_MAXIMUM] = JIT__B_MAX,
      [JIT__OP_MINIMUM] = JIT__B_MIN,     [JIT__OP_NEG] = JIT__B_NEG,   [JIT__OP_EXP] = JIT__B_EXP,
      [JIT__OP_LOG] = JIT__B_LOG,         [JIT__OP_TANH] = JIT__B_TANH,
      [JIT__OP_SIGMOID] = JIT__B_SIGMOID, [JIT__OP_RELU] = JIT__B_RELU,
      [JIT__OP_GELU] = JIT__B_GELU,
      [JIT__OP_SQRT] = JIT__B_SQRT,       [JIT__OP_RSQRT] = JIT__B_RSQRT,
      [JIT__OP_ERF] = JIT__B_ERF,         [JIT__OP_GELU_ERF] = JIT__B_GELU_ERF,
      [JIT__OP_LESS] = JIT__B_LT,         [JIT__OP_LESS_EQUAL] = JIT__B_LE,
      [JIT__OP_GREATER] = JIT__B_GT,      [JIT__OP_GREATER_EQUAL] = JIT__B_GE,
      [JIT__OP_EQUAL] = JIT__B_EQ,        [JIT__OP_NOT_EQUAL] = JIT__B_NE,
      [JIT__OP_POW] = JIT__B_POW,         [JIT__OP_WHERE] = JIT__B_SELECT,
      [JIT__OP_ROUND] = JIT__B_ROUND,
  };
  return (int)op >= 0 && op < JIT__OP_COUNT_ ? kinds[op] : JIT__B_COPY;
}

jit_status jit__elementwise_operand(jit__emitter *e, uint32_t id, int rank,
                                    const int64_t *dims, jit__gen_operand *op,
                                    int64_t sq_dims[JIT_MAX_RANK]) {
  *op = jit__node_operand(e, id);
  int off = rank - op->rank;
  if (off < 0) return jit__node_error(e, "operand has a higher rank than the result");
  // NumPy broadcasting: right-aligned; missing leading dims vanish from the map and a
  // size-1 dim against a larger one reads index 0.
  for (int d = 0; d < op->rank; d++) {
    int64_t od = op->dims[d], rd = dims[d + off];
    if (jit__dims_agree(e, od, rd))
      op->map[d] = d + off;
    else if (od == 1)
      op->map[d] = -1;
    else
      return jit__node_error(e, "operand shape does not broadcast to the result");
  }
  // A keepdims reduction is read without its unit dim: through the expand_shape that
  // puts it back, linalg-fuse-elementwise-ops moved the reshape up onto the
  // reduction's input, where it stopped the strategy's row loop from fusing the
  // reduction in (layernorm's mean of (x - mean)^2 read a whole (x - mean) made
  // before the loop: 12.4 ms at 4096x1024, one pass over x would take ~1.4).
  const struct jit__squeezed *q = &e->squeezed[id];
  if (q->set) {
    jit__gen_operand r = {q->name.s, op->dt, op->rank - 1, sq_dims, {0}, NULL, NULL};
    for (int d = 0, j = 0; d < op->rank; d++) {
      if (d == q->axis) continue;
      sq_dims[j] = op->dims[d];
      r.map[j++] = op->map[d];
    }
    *op = r;
  }
  return NULL;
}

jit_status jit__emit_elementwise(jit__emitter *e, const jit__node *n, jit__body_kind kind) {
  for (int i = 0; e->inlined && i < n->n_operands; i++)
    if (e->inlined[n->operands[i]]) return jit__emit_fused(e, n);
  if (e->named_batch && emit_elementwise_flat(e, n, kind)) return NULL;
  jit__gen_operand ins[3];
  int64_t sq_dims[3][JIT_MAX_RANK];
  for (int i = 0; i < n->n_operands; i++)
    JIT_PROPAGATE(jit__elementwise_operand(e, n->operands[i], n->rank, n->dims, &ins[i],
                                           sq_dims[i]));
  jit__str empty, res;
  jit__gen_operand out;
  JIT_PROPAGATE(jit__elementwise_result(e, n, ins, n->n_operands, &empty, &res, &out));
  char iters[JIT_MAX_RANK + 1];
  memset(iters, 'p', sizeof iters);
  jit__emit_generic(e, res.s, n->rank, iters, ins, n->n_operands, &out, kind, NULL);
  return NULL;
}

jit_status jit__elementwise_result(jit__emitter *e, const jit__node *n,
                                   const jit__gen_operand *ins, int n_in, jit__str *empty,
                                   jit__str *res, jit__gen_operand *out) {
  if (e->symbolic && !jit__result_dims_from(e, ins, n_in, n->rank, n->dims, e->dv[e->cur]))
    return jit__node_error(e, "a `?` dim of the result has no operand dim to take its size from");
  *empty = jit__value_name(e, false);
  *res = jit__value_name(e, true);
  jit__emit_empty(e, empty->s, n->dtype, n->rank, n->dims, e->dv[e->cur]);
  *out = (jit__gen_operand){empty->s, n->dtype, n->rank, n->dims, {0}, NULL, NULL};
  jit__identity_map(out);
  return NULL;
}

// Reduces `x` over `axis` into a fresh f32 accumulator (starting at `init`) of the
// operand's shape without that dim, which `red_dims` receives.
static jit__str emit_reduce_f32(jit__emitter *e, const jit__gen_operand *x, int axis,
                                jit__body_kind kind,
                           const char *init, int64_t *red_dims, jit__dimval *red_dv, bool final) {
  for (int d = 0, j = 0; d < x->rank; d++) {
    if (d == axis) continue;
    if (x->dv) red_dv[j] = x->dv[d];
    red_dims[j++] = x->dims[d];
  }
  jit__str acc = jit__emit_filled_acc(e, init, x->rank - 1, red_dims, red_dv);
  jit__gen_operand out = {acc.s, JIT__F32, x->rank - 1, red_dims, {0}, NULL, NULL};
  for (int d = 0, j = 0; d < x->rank; d++)
    if (d != axis) out.map[j++] = d;
  char iters[JIT_MAX_RANK];
  memset(iters, 'p', sizeof iters);
  iters[axis] = 'r';
  jit__str res = jit__value_name(e, final);
  jit__emit_generic(e, res.s, x->rank, iters, x, 1, &out, kind, NULL);
  return res;
}

jit_status jit__emit_reduce(jit__emitter *e, const jit__node *n) {
  jit__gen_operand x = jit__node_operand(e, n->operands[0]);
  int axis = n->axis;
  if (axis < 0 || axis >= x.rank) return jit__node_error(e, "reduction axis out of range");
  int rr = x.rank - 1;
  if (n->rank != (n->keepdims ? x.rank : rr)) return jit__node_error(e, "reduction result rank");
  for (int d = 0, j = 0; d < x.rank; d++) {
    if (d == axis) {
      if (n->keepdims && n->dims[j++] != 1) return jit__node_error(e, "kept dim is not 1");
      continue;
    }
    if (n->dims[j++] != x.dims[d]) return jit__node_error(e, "reduction result shape");
  }
  bool is_max = n->op == JIT__OP_REDUCE_MAX, is_mean = n->op == JIT__OP_REDUCE_MEAN;
  bool post = is_mean || jit__dtype_is_half(n->dtype);  // a generic after the accumulation

  int64_t red_dims[JIT_MAX_RANK];
  jit__dimval red_dv[JIT_MAX_RANK];
  // -inf is 0xFF800000: MLIR has no decimal spelling for it.
  jit__str cur = emit_reduce_f32(e, &x, axis, is_max ? JIT__B_ACC_MAX : JIT__B_ACC_SUM,
                            is_max ? "0xFF800000" : "0.0", red_dims, red_dv,
                            !post && !n->keepdims);
  if (post) {
    // The mean divides by the reduced dim: a literal, or its `?` size as an f32 value.
    jit__body_kind kind = is_mean ? JIT__B_DIV_BY : JIT__B_COPY;
    jit__str by = jit__float_literal((double)x.dims[axis], JIT__F32);
    if (is_mean && x.dims[axis] < 0) {
      jit__str i64 = jit__value_name(e, false);
      by = jit__value_name(e, false);
      jit__text_printf(&e->tb, "  %s = arith.index_cast %s : index to i64\n", i64.s,
                       x.dv[axis].s);
      jit__text_printf(&e->tb, "  %s = arith.sitofp %s : i64 to f32\n", by.s, i64.s);
      kind = JIT__B_DIV_BY_VALUE;
    }
    jit__str empty = jit__value_name(e, false), res = jit__value_name(e, !n->keepdims);
    jit__emit_empty(e, empty.s, n->dtype, rr, red_dims, red_dv);
    jit__gen_operand in = {cur.s, JIT__F32, rr, red_dims, {0}, NULL, NULL};
    jit__gen_operand out = {empty.s, n->dtype, rr, red_dims, {0}, NULL, NULL};
    jit__identity_map(&in);
    jit__identity_map(&out);
    char iters[JIT_MAX_RANK];
    memset(iters, 'p', sizeof iters);
    jit__emit_generic(e, res.s, rr, iters, &in, 1, &out, kind, by.s);
    cur = res;
  }
  jit__dimval *dv = e->dv[e->cur];
  for (int j = 0; j < rr; j++) dv[n->keepdims && j >= axis ? j + 1 : j] = red_dv[j];
  if (n->keepdims) {
    if (e->named_batch && rr > 0) {
      struct jit__squeezed *q = &e->squeezed[e->cur];
      q->name = cur;
      q->axis = axis;
      q->set = true;
    }
    // Re-insert the size-1 dim by gluing it to a neighbour's reassociation group;
    // from rank 0 the reassociation is empty.
    jit__str res = jit__value_name(e, true);
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
    jit__print_shape_list(e, n->rank, n->dims, dv);
    jit__text_printf(&e->tb, " : %s into %s\n", jit__tensor_type(n->dtype, rr, red_dims).s,
              jit__tensor_type(n->dtype, n->rank, n->dims).s);
  }
  return NULL;
}

jit_status jit__emit_softmax(jit__emitter *e, const jit__node *n) {
  jit__gen_operand x = jit__node_operand(e, n->operands[0]);
  int axis = n->axis, r = x.rank;
  if (axis < 0 || axis >= r || n->rank != r) return jit__node_error(e, "softmax axis or rank");
  int64_t red_dims[JIT_MAX_RANK];
  jit__dimval red_dv[JIT_MAX_RANK], *dv = e->dv[e->cur];
  memcpy(dv, x.dv, sizeof(jit__dimval) * JIT_MAX_RANK);
  char iters[JIT_MAX_RANK];
  memset(iters, 'p', sizeof iters);

  // exp(x - max) keeps every exponent <= 0, so large inputs cannot overflow.
  jit__str mx =
      emit_reduce_f32(e, &x, axis, JIT__B_ACC_MAXNUM, "0xFF800000", red_dims, red_dv, false);
  jit__gen_operand red = {mx.s, JIT__F32, r - 1, red_dims, {0}, NULL, NULL};
  for (int d = 0, j = 0; d < r; d++)
    if (d != axis) red.map[j++] = d;

  jit__str ex_empty = jit__value_name(e, false), ex = jit__value_name(e, false);
  jit__emit_empty(e, ex_empty.s, JIT__F32, r, x.dims, dv);
  jit__gen_operand ex_out = {ex_empty.s, JIT__F32, r, x.dims, {0}, NULL, NULL};
  jit__identity_map(&ex_out);
  jit__gen_operand ins[2] = {x, red};
  jit__emit_generic(e, ex.s, r, iters, ins, 2, &ex_out, JIT__B_EXP_SUB, NULL);

  jit__gen_operand ex_in = {ex.s, JIT__F32, r, x.dims, {0}, dv, NULL};
  jit__identity_map(&ex_in);
  jit__str sum = emit_reduce_f32(e, &ex_in, axis, JIT__B_ACC_SUM, "0.0", red_dims, red_dv, false);
  red.name = sum.s;

  jit__str empty = jit__value_name(e, false), res = jit__value_name(e, true);
  jit__emit_empty(e, empty.s, n->dtype, r, n->dims, dv);
  jit__gen_operand out = {empty.s, n->dtype, r, n->dims, {0}, NULL, NULL};
  jit__identity_map(&out);
  jit__gen_operand ins2[2] = {ex_in, red};
  jit__emit_generic(e, res.s, r, iters, ins2, 2, &out, JIT__B_DIV, NULL);
  return NULL;
}

// Node e->cur is the same value as node `src` (an identity transpose or reshape).
// Operands come before their users, so src < cur: the two names never overlap.
static void alias_name(jit__emitter *e, uint32_t src) {
  memmove(e->names[e->cur], e->names[src], sizeof e->names[e->cur]);
  memcpy(e->dv[e->cur], e->dv[src], sizeof e->dv[e->cur]);
}

jit_status jit__emit_transpose(jit__emitter *e, const jit__node *n) {
  uint32_t src = n->operands[0];
  jit__gen_operand x = jit__node_operand(e, src);
  int r = x.rank;
  if (n->rank != r) return jit__node_error(e, "transpose changes the rank");
  bool seen[JIT_MAX_RANK] = {false}, identity = true;
  for (int i = 0; i < r; i++) {
    int p = n->perm[i];
    if (p < 0 || p >= r || seen[p] || n->dims[i] != x.dims[p])
      return jit__node_error(e, "bad permutation");
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
  jit__str empty = jit__value_name(e, false), res = jit__value_name(e, true);
  jit__emit_empty(e, empty.s, n->dtype, r, n->dims, e->dv[e->cur]);
  jit__gen_operand out = {empty.s, n->dtype, r, n->dims, {0}, NULL, NULL};
  jit__identity_map(&out);
  char iters[JIT_MAX_RANK];
  memset(iters, 'p', sizeof iters);
  jit__emit_generic(e, res.s, r, iters, &x, 1, &out, JIT__B_COPY, NULL);
  return NULL;
}

// A reshape from or to rank 0: one element, so every dim on the other side is 1, and
// the empty reassociation is how expand/collapse_shape add or drop unit dims of a
// scalar. A `?` side goes through its all-1s static type by tensor.cast (symbolic mode).
static void emit_reshape_rank0(jit__emitter *e, const jit__node *n, uint32_t src) {
  const jit__node *x = &e->g->nodes[src];
  static const int64_t ones[JIT_MAX_RANK] = {1, 1, 1, 1, 1, 1, 1, 1};
  jit__str v;
  snprintf(v.s, sizeof v.s, "%s", e->names[src]);
  if (x->rank > 0) {
    jit__str tx = jit__tensor_type(x->dtype, x->rank, x->dims);
    jit__str t1 = jit__tensor_type(x->dtype, x->rank, ones);
    if (strcmp(tx.s, t1.s)) {
      jit__str c = jit__value_name(e, false);
      jit__text_printf(&e->tb, "  %s = tensor.cast %s : %s to %s\n", c.s, v.s, tx.s, t1.s);
      v = c;
    }
    jit__str c = jit__value_name(e, true);
    jit__text_printf(&e->tb, "  %s = tensor.collapse_shape %s [] : %s into %s\n", c.s, v.s,
                     t1.s, jit__tensor_type(n->dtype, 0, NULL).s);
    return;
  }
  jit__str t1 = jit__tensor_type(n->dtype, n->rank, ones);
  jit__str tn = jit__tensor_type(n->dtype, n->rank, n->dims);
  bool cast = strcmp(t1.s, tn.s) != 0;
  jit__str c = jit__value_name(e, !cast);
  jit__text_printf(&e->tb, "  %s = tensor.expand_shape %s [] output_shape ", c.s, v.s);
  jit__print_int_list(e, n->rank, ones);
  jit__text_printf(&e->tb, " : %s into %s\n", jit__tensor_type(x->dtype, 0, NULL).s, t1.s);
  if (cast)
    jit__text_printf(&e->tb, "  %s = tensor.cast %s : %s to %s\n", jit__value_name(e, true).s, c.s,
                     t1.s, tn.s);
  for (int d = 0; d < n->rank; d++)
    if (n->dims[d] < 0) snprintf(e->dv[e->cur][d].s, sizeof(jit__dimval), "%%idx1");
}

// `a` * `b` as a fresh index value, into `res` (which may hold `a` or `b`).
static void emit_index_mul(jit__emitter *e, jit__str *res, const char *a, const char *b) {
  jit__str t = jit__value_name(e, false);
  jit__text_printf(&e->tb, "  %s = arith.muli %s, %s : index\n", t.s, a, b);
  *res = t;
}

// Symbolic mode: the values of a reshape's `?` result dims into e->dv[e->cur]: a symbol
// the reshape asked for is that symbol's value; the inferred dim (-1) is the element
// count of x over the product of the others.
static jit_status reshape_sizes(jit__emitter *e, const jit__node *n, uint32_t src) {
  const jit__node *x = &e->g->nodes[src];
  const int64_t *req = e->opt->reshape_req[e->cur];
  jit__dimval *dv = e->dv[e->cur];
  int infer = -1;
  int64_t known = 1, count = 1;
  jit__str prod = {{0}};
  for (int d = 0; d < n->rank; d++) {
    if (req[d] >= 0) {
      known *= req[d];
    } else if (req[d] == -1) {
      infer = d;
    } else {
      const jit__dimval *v = jit__symbol_value(e, req[d]);
      if (!v) return jit__node_error(e, "a symbol of the new shape is no input dim");
      dv[d] = *v;
      if (!prod.s[0]) snprintf(prod.s, sizeof prod.s, "%s", v->s);
      else emit_index_mul(e, &prod, prod.s, v->s);
    }
  }
  if (infer < 0 || n->dims[infer] >= 0) return NULL;
  jit__str total = jit__value_name(e, false);
  for (int d = 0; d < x->rank; d++)
    if (x->dims[d] >= 0) count *= x->dims[d];
  jit__text_printf(&e->tb, "  %s = arith.constant %lld : index\n", total.s, (long long)count);
  for (int d = 0; d < x->rank; d++)
    if (x->dims[d] < 0) emit_index_mul(e, &total, total.s, e->dv[src][d].s);
  jit__str k = jit__value_name(e, false), q = jit__value_name(e, false);
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

jit_status jit__emit_reshape(jit__emitter *e, const jit__node *n) {
  uint32_t src = n->operands[0];
  const jit__node *x = &e->g->nodes[src];
  bool x_static = all_static(x->rank, x->dims), n_static = all_static(n->rank, n->dims);
  int64_t count = x_static ? jit__num_elements(x->rank, x->dims) : -1;
  if (x_static && n_static && count != jit__num_elements(n->rank, n->dims))
    return jit__node_error(e, "reshape changes the element count");
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
    jit__emit_reshape_to(e, e->names[src], n->dtype, x->rank, x->dims, n->rank, n->dims, true);
    return NULL;
  }
  if (e->symbolic) JIT_PROPAGATE(reshape_sizes(e, n, src));
  // A buffer expanded into two or more `?` dims crashes MLIR 22's
  // expand-strided-metadata (memref.expand_shape, once bufferized): a generic kernel
  // reshapes to such a shape with tensor.reshape and a shape operand (memref.reshape).
  int n_dynamic = 0;
  for (int d = 0; d < n->rank; d++) n_dynamic += n->dims[d] < 0;
  if (e->opt->destination && n_dynamic > 1) {
    jit__emit_reshape_dyn(e, e->names[src], x->dtype, x->rank, x->dims, n->rank, n->dims,
                          e->dv[e->cur], true);
    return NULL;
  }
  // Otherwise through 1-D: collapse all dims into one, then expand to the target; a
  // rank-1 endpoint skips its step. The 1-D value is `?` where x has a `?` dim, and a
  // tensor.cast makes it `?` where the result has one and static where it has none:
  // collapse/expand_shape want a group with a `?` dim on one side to be `?` on the other.
  int64_t x_flat = x_static ? count : -1;
  int64_t to_flat = n_static ? jit__num_elements(n->rank, n->dims) : -1;
  jit__str src_ty = jit__tensor_type(x->dtype, x->rank, x->dims);
  jit__str to_ty = jit__tensor_type(n->dtype, n->rank, n->dims);
  jit__str flat_ty = jit__tensor_type(n->dtype, 1, &x_flat), flat, res;
  bool cast = to_flat != x_flat, last = n->rank == 1 && !cast;
  snprintf(flat.s, sizeof flat.s, "%s", e->names[src]);
  if (x->rank > 1) {
    jit__str mid = jit__value_name(e, last);
    jit__text_printf(&e->tb, "  %s = tensor.collapse_shape %s [[", mid.s, flat.s);
    for (int d = 0; d < x->rank; d++) jit__text_printf(&e->tb, "%s%d", d ? ", " : "", d);
    jit__text_printf(&e->tb, "]] : %s into %s\n", src_ty.s, flat_ty.s);
    flat = mid;
  }
  if (cast) {
    jit__str to_flat_ty = jit__tensor_type(n->dtype, 1, &to_flat);
    res = jit__value_name(e, n->rank == 1);
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
    res = jit__value_name(e, true);
    jit__text_printf(&e->tb, "  %s = tensor.expand_shape %s [[", res.s, flat.s);
    for (int d = 0; d < n->rank; d++) jit__text_printf(&e->tb, "%s%d", d ? ", " : "", d);
    jit__text_printf(&e->tb, "]] output_shape ");
    jit__print_shape_list(e, n->rank, n->dims, e->dv[e->cur]);
    jit__text_printf(&e->tb, " : %s into %s\n", flat_ty.s, to_ty.s);
  }
  return NULL;
}

// Gather along `axis` (numpy.take): result[a..., i..., b...] = table[a..., idx[i...],
// b...], one generic over the result reading the indices through a map (result dims
// axis .. axis + ri - 1) and the table with tensor.extract at the index clamped to
// [0, rows - 1], so that no index reads outside the table (jit/ reports indices out of
// range before a kernel runs).
jit_status jit__emit_gather(jit__emitter *e, const jit__node *n) {
  jit__gen_operand t = jit__node_operand(e, n->operands[0]);
  jit__gen_operand ix = jit__node_operand(e, n->operands[1]);
  int ri = ix.rank, r = n->rank, ax = n->axis;
  if (t.rank < 1 || ax < 0 || ax >= t.rank || r != ri + t.rank - 1)
    return jit__node_error(e, "gather shapes");
  for (int d = 0; d < ri; d++) ix.map[d] = ax + d;
  jit__dimval *dv = e->dv[e->cur];
  for (int d = 0; d < r; d++) {
    bool from_ix = d >= ax && d < ax + ri;
    const jit__gen_operand *src = from_ix ? &ix : &t;
    int sd = from_ix ? d - ax : d < ax ? d : d - ri + 1;
    if (n->dims[d] < 0 && src->dv) dv[d] = src->dv[sd];
  }
  // The last row: a constant, or rows - 1 computed before the generic.
  jit__str last = jit__value_name(e, false);
  if (t.dims[ax] >= 0) {
    jit__text_printf(&e->tb, "  %s = arith.constant %lld : index\n", last.s,
                     (long long)(t.dims[ax] > 0 ? t.dims[ax] - 1 : 0));
  } else {
    jit__str one = jit__value_name(e, false);
    jit__text_printf(&e->tb, "  %s = arith.constant 1 : index\n"
                     "  %s = arith.subi %s, %s : index\n", one.s, last.s, t.dv[ax].s, one.s);
  }
  const char *it = jit__dtype_str(ix.dt), *et = jit__dtype_str(n->dtype);
  if (r == 0) {
    // One element (a rank-1 table, a scalar index): plain reads, no generic. The
    // generic kernels' vectorize_children turned a 0-loop generic's read into a
    // vector.gather that crashed MLIR 22's lowering.
    jit__str i0 = jit__value_name(e, false), ic = jit__value_name(e, false),
             z = jit__value_name(e, false), m = jit__value_name(e, false),
             c = jit__value_name(e, false), v = jit__value_name(e, false),
             res = jit__value_name(e, true);
    jit__text_printf(&e->tb,
                     "  %s = tensor.extract %s[] : %s\n"
                     "  %s = arith.index_cast %s : %s to index\n"
                     "  %s = arith.constant 0 : index\n"
                     "  %s = arith.maxsi %s, %s : index\n"
                     "  %s = arith.minsi %s, %s : index\n"
                     "  %s = tensor.extract %s[%s] : %s\n"
                     "  %s = tensor.from_elements %s : %s\n",
                     i0.s, ix.name, jit__tensor_type(ix.dt, 0, NULL).s, ic.s, i0.s, it, z.s,
                     m.s, ic.s, z.s, c.s, m.s, last.s, v.s, t.name, c.s,
                     jit__tensor_type(t.dt, t.rank, t.dims).s, res.s, v.s,
                     jit__tensor_type(n->dtype, 0, NULL).s);
    return NULL;
  }
  jit__str empty = jit__value_name(e, false), res = jit__value_name(e, true);
  jit__emit_empty(e, empty.s, n->dtype, r, n->dims, dv);
  jit__gen_operand out = {empty.s, n->dtype, r, n->dims, {0}, NULL, NULL};
  jit__identity_map(&out);
  char iters[JIT_MAX_RANK + 1];
  memset(iters, 'p', sizeof iters);
  jit__emit_generic_open(e, res.s, r, iters, &ix, 1, &out);
  jit__text_printf(&e->tb,
                   "    %%gi = arith.index_cast %%in0 : %s to index\n"
                   "    %%gz = arith.constant 0 : index\n"
                   "    %%gm = arith.maxsi %%gi, %%gz : index\n"
                   "    %%gc = arith.minsi %%gm, %s : index\n",
                   it, last.s);
  for (int d = 0; d < r; d++)
    if (d < ax || d >= ax + ri)
      jit__text_printf(&e->tb, "    %%gj%d = linalg.index %d : index\n", d, d);
  jit__text_printf(&e->tb, "    %%gv = tensor.extract %s[", t.name);
  for (int d = 0; d < ax; d++) jit__text_printf(&e->tb, "%%gj%d, ", d);
  jit__text_printf(&e->tb, "%%gc");
  for (int d = ax + ri; d < r; d++) jit__text_printf(&e->tb, ", %%gj%d", d);
  jit__text_printf(&e->tb, "] : %s\n    linalg.yield %%gv : %s\n  } -> %s\n",
                   jit__tensor_type(t.dt, t.rank, t.dims).s, et,
                   jit__tensor_type(n->dtype, r, n->dims).s);
  return NULL;
}
