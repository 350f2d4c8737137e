//===--- graph.c - graph builder and shape inference -----------------------===//
//
// Shapes are inferred twice with one set of rules: at build time over dims that may be
// symbols (to reject what is wrong whatever the binding), and at run time over the
// concrete dims of one binding (jit__infer_concrete), which is what lowering sees.
// Broadcasting follows NumPy on the concrete dims.
//
//===----------------------------------------------------------------------===//
#include <ctype.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "base/checked.h"
#include "jit/internal.h"

//===--- Small helpers ---------------------------------------------------===//

static char *jit__strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

// Grows *arr (elements of `size`) to hold at least n+1.
static bool jit__grow(void **arr, uint32_t *cap, uint32_t n, size_t size) {
  if (n < *cap) return true;
  uint32_t c = *cap ? *cap * 2 : 16;
  void *p = realloc(*arr, (size_t)c * size);
  if (!p) return false;
  *arr = p;
  *cap = c;
  return true;
}

static const char *jit__dtype_name(jit__dtype t) { return jit__dtype_str(t); }

// Formats a dims array as "[N, 784]" using the graph's symbol names.
static const char *jit__fmt_dims(const jit_graph *g, int rank, const int64_t *dims,
                                 char *buf, size_t size) {
  size_t n = 0;
  n += (size_t)snprintf(buf + n, size - n, "[");
  for (int i = 0; i < rank && n < size; i++) {
    const char *sep = i ? ", " : "";
    if (dims[i] >= 0)
      n += (size_t)snprintf(buf + n, size - n, "%s%lld", sep, (long long)dims[i]);
    else if (dims[i] == JIT__DIM_UNKNOWN || dims[i] == -1)
      n += (size_t)snprintf(buf + n, size - n, "%s?", sep);
    else if (g && JIT__SYMBOL_INDEX(dims[i]) < g->n_symbols)
      n += (size_t)snprintf(buf + n, size - n, "%s%s", sep,
                            g->symbols[JIT__SYMBOL_INDEX(dims[i])]);
    else
      n += (size_t)snprintf(buf + n, size - n, "%s<bad %lld>", sep, (long long)dims[i]);
  }
  if (n < size) snprintf(buf + n, size - n, "]");
  return buf;
}

//===--- Errors (sticky) -------------------------------------------------===//

static void jit__record(jit_graph *g, jit_status s) {
  if (!g->error) g->error = s;
  else jit_status_free(s);
}

#define JIT__FAIL(g, code, ...)                                   \
  do {                                                           \
    jit__record((g), JIT_ERR((code), __VA_ARGS__));              \
    return (jit_value){0};                                       \
  } while (0)

// Checks the builder preconditions shared by every op: a usable graph and valid
// operands. Returns false (with the error recorded when it is new) otherwise.
static bool jit__check_operand(jit_graph *g, const char *op, jit_value v, int index) {
  if (!g) return false;
  if (g->finalized) {
    jit__record(g, JIT_ERR(JIT_INVALID_ARGUMENT,
                           "graph `%s`: %s: the graph is finalized and cannot change",
                           g->name, op));
    return false;
  }
  if (v.id == 0 && g->error) return false;  // an earlier error: stay quiet
  if (v.id == 0 || v.id > g->n_nodes) {
    jit__record(g, JIT_ERR(JIT_INVALID_ARGUMENT,
                           "graph `%s`: %s: operand %d is not a value of this graph "
                           "(id %u)",
                           g->name, op, index, v.id));
    return false;
  }
  return true;
}

static const jit__node *jit__value(const jit_graph *g, jit_value v) {
  return &g->nodes[v.id - 1].n;
}

static jit_value jit__append(jit_graph *g, const jit__gnode *node) {
  if (g->n_nodes >= JIT_MAX_NODES)
    JIT__FAIL(g, JIT_RESOURCE_EXHAUSTED, "graph `%s`: more than %d values (JIT_MAX_NODES)",
              g->name, JIT_MAX_NODES);
  if (!jit__grow((void **)&g->nodes, &g->cap_nodes, g->n_nodes, sizeof(jit__gnode)))
    JIT__FAIL(g, JIT_RESOURCE_EXHAUSTED, "graph `%s`: out of memory", g->name);
  g->nodes[g->n_nodes++] = *node;
  return (jit_value){g->n_nodes};
}

//===--- Shape rules (shared by build time and run time) ------------------===//

// Dims here are either concrete (>= 0), symbols (<= -2) or JIT__DIM_UNKNOWN. At run
// time all are concrete. A rule returns NULL or a status whose message starts with
// what is wrong; the caller prefixes where.

static bool jit__dim_known(int64_t d) { return d >= 0; }

// NumPy broadcasting of two shapes into `out`, with one rule for symbols: only a dim
// that is 1 in the graph (static) broadcasts. A symbol bound to 1 at run time does not:
// a kernel's broadcasting must not change with the binding, and "N = 1" should not
// silently turn a shape error into a broadcast. `da_decl`/`db_decl` are the operands'
// build-time shapes (the same as a/b at build time).
static jit_status jit__rule_broadcast(const jit_graph *g, const jit__node *a,
                                      const jit__node *b, const jit__node *a_decl,
                                      const jit__node *b_decl, jit__node *out) {
  int r = a->rank > b->rank ? a->rank : b->rank;
  out->rank = r;
  for (int i = 0; i < r; i++) {
    int ia = i - (r - a->rank), ib = i - (r - b->rank);
    int64_t da = ia >= 0 ? a->dims[ia] : 1, db = ib >= 0 ? b->dims[ib] : 1;
    bool a1 = ia < 0 || a_decl->dims[ia] == 1, b1 = ib < 0 || b_decl->dims[ib] == 1;
    int64_t d;
    if (da == db) d = da;
    else if (a1) d = db;
    else if (b1) d = da;
    else if (jit__dim_known(da) && jit__dim_known(db)) {
      char sa[160], sb[160];
      return JIT_ERR(JIT_SHAPE_MISMATCH,
                     "shapes %s and %s do not broadcast: dim %d is %lld vs %lld%s",
                     jit__fmt_dims(g, a->rank, a->dims, sa, sizeof sa),
                     jit__fmt_dims(g, b->rank, b->dims, sb, sizeof sb), i,
                     (long long)da, (long long)db,
                     (da == 1 || db == 1) ? " (only dims that are 1 in the graph "
                                            "broadcast, not symbols bound to 1)"
                                          : "");
    } else {
      // A symbol meets a size or another symbol: they must agree at run time.
      d = jit__dim_known(da) ? da : jit__dim_known(db) ? db : da;
    }
    out->dims[i] = d;
  }
  return NULL;
}

static jit_status jit__rule_matmul(const jit_graph *g, const jit__node *a,
                                   const jit__node *b, const jit__node *a_decl,
                                   const jit__node *b_decl, jit__node *out) {
  char sa[160], sb[160];
  if (a->rank < 2 || b->rank < 2)
    return JIT_ERR(JIT_SHAPE_MISMATCH,
                   "operands must have rank >= 2, got %s and %s",
                   jit__fmt_dims(g, a->rank, a->dims, sa, sizeof sa),
                   jit__fmt_dims(g, b->rank, b->dims, sb, sizeof sb));
  int64_t ka = a->dims[a->rank - 1], kb = b->dims[b->rank - 2];
  if (ka != kb && jit__dim_known(ka) && jit__dim_known(kb))
    return JIT_ERR(JIT_SHAPE_MISMATCH,
                   "contraction dims differ: a %s has K = %lld, b %s has K = %lld",
                   jit__fmt_dims(g, a->rank, a->dims, sa, sizeof sa), (long long)ka,
                   jit__fmt_dims(g, b->rank, b->dims, sb, sizeof sb), (long long)kb);
  // Batch dims broadcast like elementwise shapes.
  jit__node ba = *a, bb = *b, bo = {0};
  ba.rank = a->rank - 2;
  bb.rank = b->rank - 2;
  jit_status s = jit__rule_broadcast(g, &ba, &bb, a_decl, b_decl, &bo);
  if (s) return jit__status_annotate(s, "batch dims");
  out->rank = bo.rank + 2;
  memcpy(out->dims, bo.dims, sizeof(int64_t) * (size_t)bo.rank);
  out->dims[bo.rank] = a->dims[a->rank - 2];
  out->dims[bo.rank + 1] = b->dims[b->rank - 1];
  return NULL;
}

static void jit__rule_reduce(const jit__node *x, int axis, bool keepdims,
                             jit__node *out) {
  out->rank = 0;
  for (int i = 0; i < x->rank; i++) {
    if (i == axis) {
      if (keepdims) out->dims[out->rank++] = 1;
    } else {
      out->dims[out->rank++] = x->dims[i];
    }
  }
}

// Reshape: `req` may hold concrete sizes, symbols resolved through `symvals` (NULL at
// build time) and one -1.
static jit_status jit__rule_reshape(const jit_graph *g, const jit__node *x, int rank,
                                    const int64_t *req, const int64_t *symvals,
                                    jit__node *out) {
  out->rank = rank;
  int infer = -1;
  bool known_in = true, known_out = true, overflow = false;
  int64_t in_count = 1, out_count = 1;
  for (int i = 0; i < x->rank; i++) {
    if (jit__dim_known(x->dims[i])) in_count *= x->dims[i];  // x's shape was checked
    else known_in = false;
  }
  for (int i = 0; i < rank; i++) {
    int64_t d = req[i];
    if (d <= -2) d = symvals ? symvals[JIT__SYMBOL_INDEX(d)] : d;
    if (d == -1) {
      infer = i;
      out->dims[i] = JIT__DIM_UNKNOWN;
      continue;
    }
    out->dims[i] = d;
    if (!jit__dim_known(d)) known_out = false;
    else if (!jit__checked_mul_i64(out_count, d, &out_count))
      overflow = true;
  }
  char sx[160], sr[160];
  // The requested sizes (static, or symbols bound at run time) may multiply past
  // int64 even where each fits; at build time that is a bad argument, at run time a
  // binding too large to run.
  if (overflow)
    return JIT_ERR(symvals ? JIT_RESOURCE_EXHAUSTED : JIT_INVALID_ARGUMENT,
                   "cannot reshape %s to %s: more than INT64_MAX elements",
                   jit__fmt_dims(g, x->rank, x->dims, sx, sizeof sx),
                   jit__fmt_dims(g, rank, req, sr, sizeof sr));
  if (infer >= 0 && known_in && known_out) {
    if (out_count == 0 || in_count % out_count != 0)
      return JIT_ERR(JIT_SHAPE_MISMATCH,
                     "cannot reshape %s (%lld elements) to %s",
                     jit__fmt_dims(g, x->rank, x->dims, sx, sizeof sx),
                     (long long)in_count, jit__fmt_dims(g, rank, req, sr, sizeof sr));
    out->dims[infer] = in_count / out_count;
  } else if (infer < 0 && known_in && known_out && in_count != out_count) {
    return JIT_ERR(JIT_SHAPE_MISMATCH,
                   "cannot reshape %s (%lld elements) to %s (%lld elements)",
                   jit__fmt_dims(g, x->rank, x->dims, sx, sizeof sx),
                   (long long)in_count, jit__fmt_dims(g, rank, req, sr, sizeof sr),
                   (long long)out_count);
  }
  return NULL;
}

// A sliding window's output size along one spatial dim of `in` elements, or -1 when
// the window does not fit the padded input once.
static int64_t jit__window_out(int64_t in, int k, int stride, int pad_lo, int pad_hi,
                               int dilation) {
  int64_t span = (int64_t)dilation * (k - 1) + 1, padded = in + pad_lo + pad_hi;
  if (padded < span) return -1;
  return (padded - span) / stride + 1;
}

// conv2d [N, C, H, W] x [F, C/groups, KH, KW] -> [N, F, OH, OW] (NHWC: [N, H, W, C] x
// [KH, KW, C/groups, F] -> [N, OH, OW, F]) and pools (no weight). Channels and the
// weight are static (checked when the node is built); N, H and W may be symbols.
static jit_status jit__rule_window(const jit_graph *g, const jit__node *n, const jit__node *x,
                                   const jit__node *w, jit__node *out) {
  const jit__window *p = &n->win;
  char sx[160], sw[160];
  if (x->rank != 4 || (w && w->rank != 4))
    return JIT_ERR(JIT_SHAPE_MISMATCH, "x %s%s%s must have rank 4 (%s)",
                   jit__fmt_dims(g, x->rank, x->dims, sx, sizeof sx), w ? " and weight " : "",
                   w ? jit__fmt_dims(g, w->rank, w->dims, sw, sizeof sw) : "",
                   p->nhwc ? "NHWC" : "NCHW");
  int hd = p->nhwc ? 1 : 2, cd = p->nhwc ? 3 : 1;
  int64_t c = x->dims[cd], f = c;
  int kh = p->kernel[0], kw = p->kernel[1];
  if (w) {
    int64_t wf = p->nhwc ? w->dims[3] : w->dims[0], wc = p->nhwc ? w->dims[2] : w->dims[1];
    kh = (int)(p->nhwc ? w->dims[0] : w->dims[2]);
    kw = (int)(p->nhwc ? w->dims[1] : w->dims[3]);
    f = wf;
    if (jit__dim_known(c) && (wc * p->groups != c || wf % p->groups != 0))
      return JIT_ERR(JIT_SHAPE_MISMATCH,
                     "x %s has %lld channels, but weight %s (%s) with %d groups reads %lld "
                     "(%lld per group); its %lld filters must be a multiple of the groups",
                     jit__fmt_dims(g, x->rank, x->dims, sx, sizeof sx), (long long)c,
                     jit__fmt_dims(g, w->rank, w->dims, sw, sizeof sw),
                     p->nhwc ? "HWIO" : "OIHW", p->groups, (long long)(wc * p->groups),
                     (long long)wc, (long long)wf);
  }
  int64_t o[2];
  for (int i = 0; i < 2; i++) {
    int64_t in = x->dims[hd + i];
    if (!jit__dim_known(in)) {
      o[i] = JIT__DIM_UNKNOWN;
      continue;
    }
    o[i] = jit__window_out(in, i ? kw : kh, p->stride[i], p->pad[2 * i], p->pad[2 * i + 1],
                           p->dilation[i]);
    if (o[i] < 1)
      return JIT_ERR(JIT_SHAPE_MISMATCH,
                     "x %s: the %s window (%d, dilation %d) is larger than the padded %s "
                     "(%lld + %d + %d)",
                     jit__fmt_dims(g, x->rank, x->dims, sx, sizeof sx), i ? "width" : "height",
                     i ? kw : kh, p->dilation[i], i ? "width" : "height", (long long)in,
                     p->pad[2 * i], p->pad[2 * i + 1]);
  }
  out->rank = 4;
  out->dims[0] = x->dims[0];
  out->dims[cd] = f;
  out->dims[hd] = o[0];
  out->dims[hd + 1] = o[1];
  return NULL;
}

// concat (a, b along n->axis), slice (a's n->axis), pad (every dim of a).
static jit_status jit__rule_copy(const jit_graph *g, const jit__node *n, const jit__node *a,
                                 const jit__node *b, const int64_t *symvals,
                                 jit__node *out) {
  char sa[160], sb[160];
  out->rank = a->rank;
  memcpy(out->dims, a->dims, sizeof(int64_t) * (size_t)a->rank);
  if (n->op == JIT__OP_CONCAT) {
    bool ok = a->rank == b->rank;
    for (int d = 0; ok && d < a->rank; d++)
      ok = d == n->axis || a->dims[d] == b->dims[d] || !jit__dim_known(a->dims[d]) ||
           !jit__dim_known(b->dims[d]);
    if (!ok)
      return JIT_ERR(JIT_SHAPE_MISMATCH, "%s and %s differ in a dim other than axis %d",
                     jit__fmt_dims(g, a->rank, a->dims, sa, sizeof sa),
                     jit__fmt_dims(g, b->rank, b->dims, sb, sizeof sb), n->axis);
    for (int d = 0; d < a->rank; d++)
      if (d != n->axis && !jit__dim_known(a->dims[d])) out->dims[d] = b->dims[d];
    int64_t x = a->dims[n->axis], y = b->dims[n->axis];
    out->dims[n->axis] = jit__dim_known(x) && jit__dim_known(y) ? x + y : JIT__DIM_UNKNOWN;
    return NULL;
  }
  if (n->op == JIT__OP_SLICE) {
    int64_t len = 0, start = 0, in = a->dims[n->axis];
    jit__span span = n->span;
    if (symvals) {  // a binding: the bounds' symbols become their sizes
      if (span.lo_sym) span.lo[0] += symvals[JIT__SYMBOL_INDEX(span.lo_sym)];
      if (span.hi_sym) span.hi[0] += symvals[JIT__SYMBOL_INDEX(span.hi_sym)];
      span.lo_sym = span.hi_sym = 0;
      out->span = span;
    }
    if (!jit__dim_known(in) || span.lo_sym || span.hi_sym) {
      out->dims[n->axis] = JIT__DIM_UNKNOWN;
      return NULL;
    }
    jit__slice_bounds(in, &span, &start, &len);
    if (len == 0)
      return JIT_ERR(JIT_SHAPE_MISMATCH,
                     "the slice [%lld:%lld:%lld] of axis %d of %s is empty (empty values "
                     "are not supported)",
                     (long long)span.lo[0], (long long)span.hi[0],
                     (long long)span.step, n->axis,
                     jit__fmt_dims(g, a->rank, a->dims, sa, sizeof sa));
    out->dims[n->axis] = len;
    return NULL;
  }
  for (int d = 0; d < a->rank; d++) {
    int64_t lo = n->span.lo[d], hi = n->span.hi[d], size = a->dims[d];
    if (jit__dim_known(size) && n->axis == JIT_PAD_REFLECT && (lo >= size || hi >= size))
      return JIT_ERR(JIT_SHAPE_MISMATCH, "reflect padding of %lld before and %lld after dim "
                     "%d of %s: each must be below the dim's size (PyTorch's rule)",
                     (long long)lo, (long long)hi, d,
                     jit__fmt_dims(g, a->rank, a->dims, sa, sizeof sa));
    if (jit__dim_known(size) && n->axis == JIT_PAD_CIRCULAR && (lo > size || hi > size))
      return JIT_ERR(JIT_SHAPE_MISMATCH, "circular padding of %lld before and %lld after dim "
                     "%d of %s: each must be at most the dim's size (it wraps once)",
                     (long long)lo, (long long)hi, d,
                     jit__fmt_dims(g, a->rank, a->dims, sa, sizeof sa));
    if (size == 0 && (n->axis == JIT_PAD_REPLICATE || n->axis == JIT_PAD_CIRCULAR) &&
        (lo || hi))
      return JIT_ERR(JIT_SHAPE_MISMATCH, "%s padding of dim %d of %s: the dim has no "
                     "element to repeat", n->axis == JIT_PAD_REPLICATE ? "replicate" : "circular",
                     d, jit__fmt_dims(g, a->rank, a->dims, sa, sizeof sa));
    if (jit__dim_known(size)) out->dims[d] = size + lo + hi;
    else if (lo || hi) out->dims[d] = JIT__DIM_UNKNOWN;
  }
  return NULL;
}

// attention: q [..., S, D], k [..., T, D], v [..., T, Dv] with equal leading dims, and
// an optional mask that broadcasts to the scores [..., S, T]; -> [..., S, Dv].
static jit_status jit__rule_attention(const jit_graph *g, const jit__node *const *ops,
                                      const jit__node *const *decl, jit__node *out) {
  const jit__node *q = ops[0], *k = ops[1], *v = ops[2];
  char sq[160], sk[160], sv[160];
  int r = q->rank;
  bool ok = r >= 2 && k->rank == r && v->rank == r;
  for (int d = 0; ok && d < r - 2; d++)
    ok = (q->dims[d] == k->dims[d] || !jit__dim_known(q->dims[d]) || !jit__dim_known(k->dims[d])) &&
         (q->dims[d] == v->dims[d] || !jit__dim_known(q->dims[d]) || !jit__dim_known(v->dims[d]));
  int64_t D = ok ? q->dims[r - 1] : 0, T = ok ? k->dims[r - 2] : 0;
  ok = ok && (k->dims[r - 1] == D || !jit__dim_known(D) || !jit__dim_known(k->dims[r - 1])) &&
       (v->dims[r - 2] == T || !jit__dim_known(T) || !jit__dim_known(v->dims[r - 2]));
  if (!ok)
    return JIT_ERR(JIT_SHAPE_MISMATCH,
                   "q %s, k %s and v %s must be [..., S, D], [..., T, D] and [..., T, Dv] "
                   "with the same leading dims",
                   jit__fmt_dims(g, q->rank, q->dims, sq, sizeof sq),
                   jit__fmt_dims(g, k->rank, k->dims, sk, sizeof sk),
                   jit__fmt_dims(g, v->rank, v->dims, sv, sizeof sv));
  out->rank = r;
  memcpy(out->dims, q->dims, sizeof(int64_t) * (size_t)r);
  out->dims[r - 1] = v->dims[r - 1];
  if (ops[3]) {
    jit__node scores = *q, scores_decl = *decl[0], b = {0};
    scores.dims[r - 1] = T;
    scores_decl.dims[r - 1] = decl[1]->dims[r - 2];
    JIT_PROPAGATE(jit__rule_broadcast(g, &scores, ops[3], &scores_decl, decl[3], &b));
    bool same = b.rank == r;
    for (int d = 0; same && d < r; d++)
      same = b.dims[d] == scores.dims[d] || !jit__dim_known(scores.dims[d]);
    if (!same)
      return JIT_ERR(JIT_SHAPE_MISMATCH, "the mask %s does not broadcast to the scores %s",
                     jit__fmt_dims(g, ops[3]->rank, ops[3]->dims, sq, sizeof sq),
                     jit__fmt_dims(g, r, scores.dims, sk, sizeof sk));
  }
  return NULL;
}

// Applies node n's rule given its operand shapes `ops` (NULL past its operands) and
// their build-time shapes `decl`. Writes rank/dims of `out`. `symvals` is NULL at
// build time.
// Whether every dim of `x` is 1 (one value).
static bool jit__numel_is_one(const jit__node *x) {
  for (int d = 0; d < x->rank; d++)
    if (x->dims[d] != 1) return false;
  return true;
}

static jit_status jit__apply_rule(const jit_graph *g, const jit__gnode *gn,
                                  const jit__node *const *ops, const jit__node *const *decl,
                                  const int64_t *symvals, jit__node *out) {
  const jit__node *n = &gn->n, *a = ops[0], *b = ops[1];
  switch (n->op) {
    case JIT__OP_INPUT:
    case JIT__OP_SCALAR:
      return NULL;  // shapes come from elsewhere
    case JIT__OP_MATMUL:
      return jit__rule_matmul(g, a, b, decl[0], decl[1], out);
    case JIT__OP_WHERE: {
      // The two values first, then the condition against what they make.
      jit__node ab = {0}, ab_decl = {0};
      JIT_PROPAGATE(jit__rule_broadcast(g, b, ops[2], decl[1], decl[2], &ab));
      JIT_PROPAGATE(jit__rule_broadcast(g, decl[1], decl[2], decl[1], decl[2], &ab_decl));
      return jit__rule_broadcast(g, a, &ab, decl[0], &ab_decl, out);
    }
    case JIT__OP_REDUCE_SUM: case JIT__OP_REDUCE_MAX: case JIT__OP_REDUCE_MEAN:
      jit__rule_reduce(a, n->axis, n->keepdims, out);
      return NULL;
    case JIT__OP_TRANSPOSE:
      out->rank = a->rank;
      for (int i = 0; i < a->rank; i++) out->dims[i] = a->dims[n->perm[i]];
      return NULL;
    case JIT__OP_RESHAPE:
      return jit__rule_reshape(g, a, n->rank, gn->req, symvals, out);
    case JIT__OP_CONV2D: case JIT__OP_MAX_POOL2D: case JIT__OP_AVG_POOL2D:
      return jit__rule_window(g, n, a, b, out);
    case JIT__OP_CONCAT: case JIT__OP_SLICE: case JIT__OP_PAD:
      return jit__rule_copy(g, n, a, b, symvals, out);
    case JIT__OP_ATTENTION:
      return jit__rule_attention(g, ops, decl, out);
    case JIT__OP_MATMUL_INT8: {
      char sa[160], sb[160];
      const jit__node *sa_n = ops[2], *sb_n = ops[3];
      if (b->rank != 2)
        return JIT_ERR(JIT_SHAPE_MISMATCH, "b %s must be [K, N]",
                       jit__fmt_dims(g, b->rank, b->dims, sb, sizeof sb));
      JIT_PROPAGATE(jit__rule_matmul(g, a, b, decl[0], decl[1], out));
      int64_t N = b->dims[1], ns = 1;
      bool one = true;
      for (int d = 0; d < sa_n->rank; d++) one &= sa_n->dims[d] == 1;
      for (int d = 0; d < sb_n->rank; d++) ns = d == sb_n->rank - 1 ? sb_n->dims[d] : ns;
      bool per_col = sb_n->rank >= 1 && (ns == N || !jit__dim_known(ns) || !jit__dim_known(N));
      for (int d = 0; d + 1 < sb_n->rank; d++) per_col &= sb_n->dims[d] == 1;
      bool sb_one = true;
      for (int d = 0; d < sb_n->rank; d++) sb_one &= sb_n->dims[d] == 1;
      if (!one || !(sb_one || per_col))
        return JIT_ERR(JIT_SHAPE_MISMATCH,
                       "a's scale %s must be one value, and b's %s one value or one per "
                       "column of b (N = %lld)",
                       jit__fmt_dims(g, sa_n->rank, sa_n->dims, sa, sizeof sa),
                       jit__fmt_dims(g, sb_n->rank, sb_n->dims, sb, sizeof sb), (long long)N);
      // Zero points (jit_matmul_int8_zp): a's like a's scale, b's like b's.
      int k = 4;
      if (n->axis & 1) {
        const jit__node *z = ops[k++];
        if (!jit__numel_is_one(z))
          return JIT_ERR(JIT_SHAPE_MISMATCH, "a's zero point %s must be one value",
                         jit__fmt_dims(g, z->rank, z->dims, sa, sizeof sa));
      }
      if (n->axis & 2) {
        const jit__node *z = ops[k];
        int64_t zn = z->rank ? z->dims[z->rank - 1] : 1;
        bool col = z->rank >= 1 && (zn == N || !jit__dim_known(zn) || !jit__dim_known(N));
        for (int d = 0; d + 1 < z->rank; d++) col &= z->dims[d] == 1;
        if (!jit__numel_is_one(z) && !col)
          return JIT_ERR(JIT_SHAPE_MISMATCH,
                         "b's zero point %s must be one value or one per column of b "
                         "(N = %lld)",
                         jit__fmt_dims(g, z->rank, z->dims, sb, sizeof sb), (long long)N);
      }
      return NULL;
    }
    case JIT__OP_GATHER: {
      char sa[160], sb[160];
      if (a->rank < 1)
        return JIT_ERR(JIT_SHAPE_MISMATCH, "table %s has no rows: it needs rank >= 1",
                       jit__fmt_dims(g, a->rank, a->dims, sa, sizeof sa));
      if (b->rank + a->rank - 1 > JIT_MAX_RANK)
        return JIT_ERR(JIT_SHAPE_MISMATCH,
                       "indices %s and table %s make a result of rank %d, over %d",
                       jit__fmt_dims(g, b->rank, b->dims, sb, sizeof sb),
                       jit__fmt_dims(g, a->rank, a->dims, sa, sizeof sa),
                       b->rank + a->rank - 1, JIT_MAX_RANK);
      // table[:axis] + indices + table[axis + 1:], as numpy.take(table, indices, axis).
      int ax = n->axis;
      out->rank = b->rank + a->rank - 1;
      memcpy(out->dims, a->dims, sizeof(int64_t) * (size_t)ax);
      memcpy(out->dims + ax, b->dims, sizeof(int64_t) * (size_t)b->rank);
      memcpy(out->dims + ax + b->rank, a->dims + ax + 1,
             sizeof(int64_t) * (size_t)(a->rank - 1 - ax));
      return NULL;
    }
    default:
      if (jit__op_is_binary_elementwise(n->op))
        return jit__rule_broadcast(g, a, b, decl[0], decl[1], out);
      // Unary elementwise and softmax keep the shape.
      out->rank = a->rank;
      memcpy(out->dims, a->dims, sizeof(int64_t) * (size_t)a->rank);
      return NULL;
  }
}

jit_status jit__infer_concrete(const jit_graph *g, uint32_t i, const jit__node *shapes,
                               const int64_t *symbol_values, jit__node *out) {
  const jit__gnode *gn = &g->nodes[i];
  const jit__node *ops[6] = {0}, *decl[6] = {0};
  for (int k = 0; k < gn->n.n_operands; k++) {
    ops[k] = &shapes[gn->n.operands[k]];
    decl[k] = &g->nodes[gn->n.operands[k]].n;
  }
  jit_status s = jit__apply_rule(g, gn, ops, decl, symbol_values, out);
  if (s)
    return jit__status_annotate(s, "graph `%s`: node %u (%s)", g->name, i,
                                jit__op_name(gn->n.op));
  for (int d = 0; d < out->rank; d++) {
    if (out->dims[d] < 0)
      return JIT_ERR(JIT_INTERNAL, "graph `%s`: node %u (%s): dim %d unresolved",
                     g->name, i, jit__op_name(gn->n.op), d);
  }
  return NULL;
}

//===--- Graph lifetime --------------------------------------------------===//

jit_status jit_graph_create(jit_context *ctx, const char *name, jit_graph **out_graph) {
  if (!out_graph) return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_graph_create: out_graph is NULL");
  *out_graph = NULL;
  if (!ctx) return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_graph_create: ctx is NULL");
  jit_graph *g = calloc(1, sizeof(*g));
  if (!g) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "jit_graph_create: out of memory");
  g->ctx = ctx;
  atomic_init(&g->shape_policy, -1);
  g->name = jit__strdup(name && name[0] ? name : "graph");
  if (!g->name) {
    free(g);
    return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "jit_graph_create: out of memory");
  }
  *out_graph = g;
  return NULL;
}

void jit_graph_destroy(jit_graph *g) {
  if (!g) return;
  jit__spec_forget_graph(g);
  free(g->generic_why);
  for (uint32_t i = 0; i < g->n_nodes; i++) free(g->nodes[i].name);
  for (uint32_t i = 0; i < g->n_symbols; i++) free(g->symbols[i]);
  free(g->nodes);
  free(g->inputs);
  free(g->outputs);
  free(g->symbols);
  jit_status_free(g->error);
  jit__weights_free(g);
  jit__mlir_graph_free(g->mlir);
  free(g->name);
  free(g);
}

jit_status jit_output_dtype(const jit_graph *g, int index, DLDataType *out_dtype) {
  if (!g || !out_dtype)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_output_dtype: %s is NULL",
                   g ? "out_dtype" : "graph");
  if (index < 0 || (uint32_t)index >= g->n_outputs)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "graph `%s`: output index %d not in [0, %u)",
                   g->name, index, g->n_outputs);
  jit__dtype dt = g->mlir ? jit__mlir_graph_result_dtype(g, (uint32_t)index)
                          : g->nodes[g->outputs[index]].n.dtype;
  *out_dtype = jit__dtype_dl(dt);
  return NULL;
}

jit_context *jit_graph_context(const jit_graph *g) { return g ? g->ctx : NULL; }

int jit_graph_num_inputs(const jit_graph *g) { return g ? (int)g->n_inputs : 0; }
int jit_graph_num_outputs(const jit_graph *g) { return g ? (int)g->n_outputs : 0; }

int64_t jit_symbol(jit_graph *g, const char *name) {
  if (!g) return 0;
  if (!name || !name[0]) {
    jit__record(g, JIT_ERR(JIT_INVALID_ARGUMENT, "graph `%s`: jit_symbol: empty name",
                           g->name));
    return 0;
  }
  for (const char *p = name; *p; p++) {
    if (!isalnum((unsigned char)*p) && *p != '_') {
      jit__record(g, JIT_ERR(JIT_INVALID_ARGUMENT,
                             "graph `%s`: jit_symbol: bad name `%s` (letters, digits, "
                             "'_' only)",
                             g->name, name));
      return 0;
    }
  }
  for (uint32_t i = 0; i < g->n_symbols; i++)
    if (strcmp(g->symbols[i], name) == 0) return JIT__SYMBOL_CODE(i);
  char *copy = jit__strdup(name);
  if (!copy || !jit__grow((void **)&g->symbols, &g->cap_symbols, g->n_symbols,
                          sizeof(char *))) {
    free(copy);
    jit__record(g, JIT_ERR(JIT_RESOURCE_EXHAUSTED, "graph `%s`: out of memory", g->name));
    return 0;
  }
  g->symbols[g->n_symbols] = copy;
  return JIT__SYMBOL_CODE(g->n_symbols++);
}

//===--- Builder ---------------------------------------------------------===//

jit_value jit_input(jit_graph *g, const char *name, DLDataType dtype, int rank,
                    const int64_t *dims) {
  if (!g) return (jit_value){0};
  if (g->finalized)
    JIT__FAIL(g, JIT_INVALID_ARGUMENT, "graph `%s`: jit_input: the graph is finalized",
              g->name);
  const char *nm = name && name[0] ? name : "?";
  if (g->n_inputs >= JIT_MAX_GRAPH_IO)
    JIT__FAIL(g, JIT_RESOURCE_EXHAUSTED, "graph `%s`: input `%s`: more than %d inputs "
              "(JIT_MAX_GRAPH_IO)", g->name, nm, JIT_MAX_GRAPH_IO);
  jit__gnode node = {0};
  node.n.op = JIT__OP_INPUT;
  if (!jit__dtype_from_dl(dtype, true, &node.n.dtype))
    JIT__FAIL(g, JIT_UNSUPPORTED,
              "graph `%s`: input %u `%s`: dtype (code %d, %d bits, %d lanes) is not "
              "supported; use f32, f16 or bf16 (int32 or int64 for jit_gather's indices)",
              g->name, g->n_inputs, nm, dtype.code, dtype.bits, dtype.lanes);
  if (rank < 0 || rank > JIT_MAX_RANK)
    JIT__FAIL(g, JIT_INVALID_ARGUMENT, "graph `%s`: input %u `%s`: rank %d not in [0, %d]",
              g->name, g->n_inputs, nm, rank, JIT_MAX_RANK);
  if (rank > 0 && !dims)
    JIT__FAIL(g, JIT_INVALID_ARGUMENT, "graph `%s`: input %u `%s`: dims is NULL",
              g->name, g->n_inputs, nm);
  node.n.rank = rank;
  for (int i = 0; i < rank; i++) {
    int64_t d = dims[i];
    if (d == -1 || (d < -1 && JIT__SYMBOL_INDEX(d) >= g->n_symbols))
      JIT__FAIL(g, JIT_INVALID_ARGUMENT,
                "graph `%s`: input %u `%s`: dim %d is %lld, neither a size nor a "
                "symbol of this graph",
                g->name, g->n_inputs, nm, i, (long long)d);
    node.n.dims[i] = d;
  }
  int64_t count;
  if (!jit__checked_static_numel(rank, dims, &count)) {
    char sd[200];
    JIT__FAIL(g, JIT_INVALID_ARGUMENT,
              "graph `%s`: input %u `%s`: the static dims of %s have more than "
              "INT64_MAX elements",
              g->name, g->n_inputs, nm, jit__fmt_dims(g, rank, dims, sd, sizeof sd));
  }
  node.name = jit__strdup(nm);
  if (!node.name || !jit__grow((void **)&g->inputs, &g->cap_inputs, g->n_inputs,
                               sizeof(uint32_t))) {
    free(node.name);
    JIT__FAIL(g, JIT_RESOURCE_EXHAUSTED, "graph `%s`: out of memory", g->name);
  }
  jit_value v = jit__append(g, &node);
  if (v.id == 0) {
    free(node.name);
    return v;
  }
  g->inputs[g->n_inputs++] = v.id - 1;
  return v;
}

void jit_output(jit_graph *g, jit_value v) {
  if (!jit__check_operand(g, "jit_output", v, 0)) return;
  // An integer output is a jit_cast to an integer dtype.
  if (jit__dtype_is_int(jit__value(g, v)->dtype) && jit__value(g, v)->op != JIT__OP_CAST) {
    jit__record(g, JIT_ERR(JIT_DTYPE_MISMATCH, "graph `%s`: jit_output: value %u is %s; "
                           "outputs are f32, f16 or bf16, or integers that jit_cast made",
                           g->name, v.id, jit__dtype_str(jit__value(g, v)->dtype)));
    return;
  }
  if (g->n_outputs >= JIT_MAX_GRAPH_IO) {
    jit__record(g, JIT_ERR(JIT_RESOURCE_EXHAUSTED, "graph `%s`: more than %d outputs "
                           "(JIT_MAX_GRAPH_IO)", g->name, JIT_MAX_GRAPH_IO));
    return;
  }
  if (!jit__grow((void **)&g->outputs, &g->cap_outputs, g->n_outputs, sizeof(uint32_t))) {
    jit__record(g, JIT_ERR(JIT_RESOURCE_EXHAUSTED, "graph `%s`: out of memory", g->name));
    return;
  }
  g->outputs[g->n_outputs++] = v.id - 1;
}

jit_value jit_scalar(jit_graph *g, double value, DLDataType dtype) {
  if (!g) return (jit_value){0};
  if (g->finalized)
    JIT__FAIL(g, JIT_INVALID_ARGUMENT, "graph `%s`: jit_scalar: the graph is finalized",
              g->name);
  jit__gnode node = {0};
  node.n.op = JIT__OP_SCALAR;
  if (!jit__dtype_from_dl(dtype, false, &node.n.dtype))
    JIT__FAIL(g, JIT_UNSUPPORTED, "graph `%s`: scalar: dtype not supported; use f32, f16 or bf16",
              g->name);
  if (isnan(value))
    JIT__FAIL(g, JIT_UNSUPPORTED, "graph `%s`: scalar: value is NaN", g->name);
  node.n.scalar = value;
  return jit__append(g, &node);
}

// Builds a node with operands `v` (n_ops of them), checks dtypes, and infers its
// build-time shape.
static jit_value jit__make_node(jit_graph *g, jit__op op, const jit_value *v, int n_ops,
                                jit__gnode *node) {
  const char *opname = jit__op_name(op);
  const jit__node *ops[6] = {0};
  for (int k = 0; k < n_ops; k++) {
    if (!jit__check_operand(g, opname, v[k], k)) return (jit_value){0};
    ops[k] = jit__value(g, v[k]);
    node->n.operands[k] = v[k].id - 1;
  }
  node->n.op = op;
  node->n.n_operands = n_ops;
  node->n.dtype = ops[0]->dtype;
  // Integers (inputs) are read by jit_gather's indices only; its table is a float.
  for (int k = 0; k < n_ops; k++) {
    bool want_int = (op == JIT__OP_GATHER && k == 1) ||
                    (op == JIT__OP_MATMUL_INT8 && (k < 2 || k > 3));
    jit__dtype t = ops[k]->dtype;
    const char *bad = NULL;
    if (op == JIT__OP_CAST)
      bad = NULL;  // any dtype to any
    else if (op == JIT__OP_MATMUL_INT8)
      bad = k < 2 || k > 3 ? (t != JIT__I8 ? "a, b and the zero points are int8" : NULL)
                           : (t != JIT__F32 ? "the scales are f32" : NULL);
    else if (jit__dtype_is_int(t) != want_int)
      bad = want_int ? "indices are int32 or int64"
                     : "integer values only feed jit_gather's indices, jit_matmul_int8 and "
                       "jit_cast";
    else if (op == JIT__OP_GATHER && t == JIT__I8)
      bad = "indices are int32 or int64";
    if (bad)
      JIT__FAIL(g, JIT_DTYPE_MISMATCH, "graph `%s`: node %u (%s): operand %d is %s; %s",
                g->name, g->n_nodes, opname, k, jit__dtype_str(t), bad);
  }
  if (op == JIT__OP_MATMUL_INT8) node->n.dtype = JIT__F32;
  for (int k = 1; k < n_ops && op != JIT__OP_GATHER && op != JIT__OP_MATMUL_INT8; k++)
    if (ops[k]->dtype != ops[0]->dtype)
      JIT__FAIL(g, JIT_DTYPE_MISMATCH,
                "graph `%s`: node %u (%s): operand dtypes differ: %s (operand 0) vs %s "
                "(operand %d)",
                g->name, g->n_nodes, opname, jit__dtype_name(ops[0]->dtype),
                jit__dtype_name(ops[k]->dtype), k);
  jit_status s = jit__apply_rule(g, node, ops, ops, NULL, &node->n);
  if (s) {
    jit__record(g, jit__status_annotate(s, "graph `%s`: node %u (%s)", g->name,
                                        g->n_nodes, opname));
    return (jit_value){0};
  }
  // Operands that fit can still make a result that does not (matmul [2^40, 1] x
  // [1, 2^40], a broadcast outer sum): no binding could ever run it.
  int64_t count;
  if (!jit__checked_static_numel(node->n.rank, node->n.dims, &count)) {
    char sd[200];
    JIT__FAIL(g, JIT_INVALID_ARGUMENT,
              "graph `%s`: node %u (%s): the static dims of its result %s have more "
              "than INT64_MAX elements",
              g->name, g->n_nodes, opname,
              jit__fmt_dims(g, node->n.rank, node->n.dims, sd, sizeof sd));
  }
  return jit__append(g, node);
}

static jit_value jit__binary(jit_graph *g, jit__op op, jit_value a, jit_value b) {
  jit__gnode node = {0};
  jit_value v[2] = {a, b};
  return jit__make_node(g, op, v, 2, &node);
}

static jit_value jit__unary(jit_graph *g, jit__op op, jit_value x) {
  jit__gnode node = {0};
  return jit__make_node(g, op, &x, 1, &node);
}

jit_value jit_matmul(jit_graph *g, jit_value a, jit_value b) {
  return jit__binary(g, JIT__OP_MATMUL, a, b);
}
jit_value jit_add(jit_graph *g, jit_value a, jit_value b) {
  return jit__binary(g, JIT__OP_ADD, a, b);
}
jit_value jit_sub(jit_graph *g, jit_value a, jit_value b) {
  return jit__binary(g, JIT__OP_SUB, a, b);
}
jit_value jit_mul(jit_graph *g, jit_value a, jit_value b) {
  return jit__binary(g, JIT__OP_MUL, a, b);
}
jit_value jit_div(jit_graph *g, jit_value a, jit_value b) {
  return jit__binary(g, JIT__OP_DIV, a, b);
}
jit_value jit_maximum(jit_graph *g, jit_value a, jit_value b) {
  return jit__binary(g, JIT__OP_MAXIMUM, a, b);
}
jit_value jit_minimum(jit_graph *g, jit_value a, jit_value b) {
  return jit__binary(g, JIT__OP_MINIMUM, a, b);
}
jit_value jit_neg(jit_graph *g, jit_value x) { return jit__unary(g, JIT__OP_NEG, x); }
jit_value jit_exp(jit_graph *g, jit_value x) { return jit__unary(g, JIT__OP_EXP, x); }
jit_value jit_log(jit_graph *g, jit_value x) { return jit__unary(g, JIT__OP_LOG, x); }
jit_value jit_tanh(jit_graph *g, jit_value x) { return jit__unary(g, JIT__OP_TANH, x); }
jit_value jit_sigmoid(jit_graph *g, jit_value x) {
  return jit__unary(g, JIT__OP_SIGMOID, x);
}
jit_value jit_relu(jit_graph *g, jit_value x) { return jit__unary(g, JIT__OP_RELU, x); }
jit_value jit_gelu(jit_graph *g, jit_value x) { return jit__unary(g, JIT__OP_GELU, x); }
jit_value jit_sqrt(jit_graph *g, jit_value x) { return jit__unary(g, JIT__OP_SQRT, x); }
jit_value jit_rsqrt(jit_graph *g, jit_value x) { return jit__unary(g, JIT__OP_RSQRT, x); }
jit_value jit_erf(jit_graph *g, jit_value x) { return jit__unary(g, JIT__OP_ERF, x); }
jit_value jit_round(jit_graph *g, jit_value x) { return jit__unary(g, JIT__OP_ROUND, x); }
jit_value jit_gelu_erf(jit_graph *g, jit_value x) { return jit__unary(g, JIT__OP_GELU_ERF, x); }
jit_value jit_less(jit_graph *g, jit_value a, jit_value b) {
  return jit__binary(g, JIT__OP_LESS, a, b);
}
jit_value jit_less_equal(jit_graph *g, jit_value a, jit_value b) {
  return jit__binary(g, JIT__OP_LESS_EQUAL, a, b);
}
jit_value jit_greater(jit_graph *g, jit_value a, jit_value b) {
  return jit__binary(g, JIT__OP_GREATER, a, b);
}
jit_value jit_greater_equal(jit_graph *g, jit_value a, jit_value b) {
  return jit__binary(g, JIT__OP_GREATER_EQUAL, a, b);
}
jit_value jit_equal(jit_graph *g, jit_value a, jit_value b) {
  return jit__binary(g, JIT__OP_EQUAL, a, b);
}
jit_value jit_not_equal(jit_graph *g, jit_value a, jit_value b) {
  return jit__binary(g, JIT__OP_NOT_EQUAL, a, b);
}
jit_value jit_pow(jit_graph *g, jit_value a, jit_value b) {
  return jit__binary(g, JIT__OP_POW, a, b);
}
enum { kMaxSpan = 1 << 30 };

static bool jit__axis(jit_graph *g, const char *op, jit_value x, int *axis);

jit_value jit_concat(jit_graph *g, const jit_value *values, int n, int axis) {
  if (!g) return (jit_value){0};
  if (!values || n < 1)
    JIT__FAIL(g, JIT_INVALID_ARGUMENT, "graph `%s`: node %u (concat): %s", g->name,
              g->n_nodes, !values ? "values is NULL" : "no values to join");
  if (!jit__axis(g, "concat", values[0], &axis)) return (jit_value){0};
  jit_value acc = values[0];
  for (int i = 1; i < n && acc.id; i++) {
    jit__gnode node = {0};
    node.n.axis = axis;
    jit_value v[2] = {acc, values[i]};
    acc = jit__make_node(g, JIT__OP_CONCAT, v, 2, &node);
  }
  return acc;
}

// A slice node; lo_sym / hi_sym: 0 or the symbol added to start / stop.
static jit_value jit__slice(jit_graph *g, jit_value x, int axis, int64_t start,
                            int64_t stop, int64_t step, int64_t lo_sym, int64_t hi_sym) {
  if (!jit__axis(g, "slice", x, &axis)) return (jit_value){0};
  if (step < 1 || step > kMaxSpan)
    JIT__FAIL(g, JIT_INVALID_ARGUMENT, "graph `%s`: node %u (slice): step %lld not in "
              "[1, 2^30]", g->name, g->n_nodes, (long long)step);
  jit__gnode node = {0};
  node.n.axis = axis;
  node.n.span.lo[0] = start;
  node.n.span.hi[0] = stop;
  node.n.span.step = step;
  node.n.span.lo_sym = lo_sym;
  node.n.span.hi_sym = hi_sym;
  return jit__make_node(g, JIT__OP_SLICE, &x, 1, &node);
}

jit_value jit_slice(jit_graph *g, jit_value x, int axis, int64_t start, int64_t stop,
                    int64_t step) {
  return jit__slice(g, x, axis, start, stop, step, 0, 0);
}

static const int64_t kMaxSymbolOffset = INT64_C(1) << 40;

jit_value jit_slice_symbolic(jit_graph *g, jit_value x, int axis, int64_t start_symbol,
                             int64_t start, int64_t stop_symbol, int64_t stop, int64_t step) {
  if (!g) return (jit_value){0};
  const int64_t sym[2] = {start_symbol, stop_symbol}, off[2] = {start, stop};
  for (int i = 0; i < 2; i++) {
    const char *which = i ? "stop" : "start";
    if (sym[i] != 0 && (sym[i] > -2 || JIT__SYMBOL_INDEX(sym[i]) >= g->n_symbols))
      JIT__FAIL(g, JIT_INVALID_ARGUMENT, "graph `%s`: node %u (slice): %s_symbol %lld is "
                "neither 0 nor a symbol of this graph", g->name, g->n_nodes, which,
                (long long)sym[i]);
    if (sym[i] != 0 && (off[i] > kMaxSymbolOffset || off[i] < -kMaxSymbolOffset))
      JIT__FAIL(g, JIT_INVALID_ARGUMENT, "graph `%s`: node %u (slice): %s %lld next to "
                "symbol %s is not within +-2^40", g->name, g->n_nodes, which,
                (long long)off[i], g->symbols[JIT__SYMBOL_INDEX(sym[i])]);
  }
  return jit__slice(g, x, axis, start, stop, step, start_symbol, stop_symbol);
}

jit_value jit_pad(jit_graph *g, jit_value x, const int64_t *low, const int64_t *high,
                  double value) {
  return jit_pad_with(g, x, low, high, JIT_PAD_CONSTANT, value);
}

jit_value jit_pad_with(jit_graph *g, jit_value x, const int64_t *low, const int64_t *high,
                       jit_padding how, double value) {
  if (!jit__check_operand(g, "pad", x, 0)) return (jit_value){0};
  if (how != JIT_PAD_CONSTANT && how != JIT_PAD_REFLECT && how != JIT_PAD_REPLICATE &&
      how != JIT_PAD_CIRCULAR)
    JIT__FAIL(g, JIT_INVALID_ARGUMENT, "graph `%s`: node %u (pad): padding kind %d is not "
              "JIT_PAD_CONSTANT, JIT_PAD_REFLECT, JIT_PAD_REPLICATE or JIT_PAD_CIRCULAR",
              g->name, g->n_nodes, (int)how);
  int rank = jit__value(g, x)->rank;
  if ((!low || !high) && rank > 0)
    JIT__FAIL(g, JIT_INVALID_ARGUMENT, "graph `%s`: node %u (pad): %s is NULL", g->name,
              g->n_nodes, !low ? "low" : "high");
  jit__gnode node = {0};
  for (int d = 0; d < rank; d++) {
    if (low[d] < 0 || low[d] > kMaxSpan || high[d] < 0 || high[d] > kMaxSpan)
      JIT__FAIL(g, JIT_INVALID_ARGUMENT, "graph `%s`: node %u (pad): dim %d pads %lld "
                "before and %lld after; each must be in [0, 2^30]", g->name, g->n_nodes, d,
                (long long)low[d], (long long)high[d]);
    node.n.span.lo[d] = low[d];
    node.n.span.hi[d] = high[d];
  }
  // The kind rides in `axis`, which pads do not use otherwise: keys and the MLIR
  // record of constant pads stay what they were.
  node.n.axis = (int)how;
  node.n.scalar = how == JIT_PAD_CONSTANT ? value : 0.0;
  return jit__make_node(g, JIT__OP_PAD, &x, 1, &node);
}

jit_value jit_cast(jit_graph *g, jit_value x, DLDataType dtype) {
  if (!jit__check_operand(g, "cast", x, 0)) return (jit_value){0};
  jit__dtype to;
  if (!jit__dtype_from_dl(dtype, true, &to))
    JIT__FAIL(g, JIT_UNSUPPORTED, "graph `%s`: node %u (cast): to dtype (code %d, %d bits, "
              "%d lanes): casts are among f32, f16, bf16, int8, int32 and int64", g->name,
              g->n_nodes, dtype.code, dtype.bits, dtype.lanes);
  jit__gnode node = {0};
  jit_value v = jit__make_node(g, JIT__OP_CAST, &x, 1, &node);
  if (v.id) g->nodes[v.id - 1].n.dtype = to;
  return v;
}

jit_value jit_attention(jit_graph *g, jit_value q, jit_value k, jit_value v, jit_value mask,
                        double scale, int causal) {
  if (!jit__check_operand(g, "attention", q, 0)) return (jit_value){0};
  const jit__node *qn = jit__value(g, q);
  int64_t D = qn->rank >= 1 ? qn->dims[qn->rank - 1] : -1;
  if (!isfinite(scale) || scale < 0 || (scale == 0 && !jit__dim_known(D)))
    JIT__FAIL(g, JIT_INVALID_ARGUMENT, "graph `%s`: node %u (attention): scale %g: %s",
              g->name, g->n_nodes, scale,
              scale == 0 ? "0 means 1/sqrt(D), and q's last dim D is not static"
                         : "must be finite and >= 0");
  jit__gnode node = {0};
  node.n.scalar = scale > 0 ? scale : 1.0 / sqrt((double)(D > 0 ? D : 1));
  node.n.causal = causal != 0;
  jit_value ops[4] = {q, k, v, mask};
  return jit__make_node(g, JIT__OP_ATTENTION, ops, mask.id ? 4 : 3, &node);
}

jit_value jit_matmul_int8(jit_graph *g, jit_value a, jit_value b, jit_value a_scale,
                          jit_value b_scale) {
  jit__gnode node = {0};
  jit_value v[4] = {a, b, a_scale, b_scale};
  return jit__make_node(g, JIT__OP_MATMUL_INT8, v, 4, &node);
}

jit_value jit_matmul_int8_zp(jit_graph *g, jit_value a, jit_value b, jit_value a_scale,
                             jit_value b_scale, jit_value a_zero, jit_value b_zero) {
  jit__gnode node = {0};
  jit_value v[6] = {a, b, a_scale, b_scale};
  int n = 4;
  if (a_zero.id) v[n++] = a_zero, node.n.axis |= 1;
  if (b_zero.id) v[n++] = b_zero, node.n.axis |= 2;
  return jit__make_node(g, JIT__OP_MATMUL_INT8, v, n, &node);
}

jit_value jit_gather(jit_graph *g, jit_value table, jit_value indices) {
  return jit_gather_axis(g, table, indices, 0);
}

jit_value jit_gather_axis(jit_graph *g, jit_value table, jit_value indices, int axis) {
  if (!jit__check_operand(g, "gather", table, 0)) return (jit_value){0};
  // A rank-0 table has no axis: the shape rule says so ("rank >= 1").
  if (jit__value(g, table)->rank > 0 && !jit__axis(g, "gather", table, &axis))
    return (jit_value){0};
  if (jit__value(g, table)->rank == 0) axis = 0;
  jit__gnode node = {0};
  node.n.axis = axis;
  jit_value v[2] = {table, indices};
  return jit__make_node(g, JIT__OP_GATHER, v, 2, &node);
}
jit_value jit_where(jit_graph *g, jit_value cond, jit_value a, jit_value b) {
  jit__gnode node = {0};
  jit_value v[3] = {cond, a, b};
  return jit__make_node(g, JIT__OP_WHERE, v, 3, &node);
}

//===--- Sliding windows -------------------------------------------------===//

enum { kMaxWindowParam = 1 << 16 };

void jit_window_params_init(jit_window_params *p) {
  if (!p) return;
  memset(p, 0, sizeof(*p));
  p->layout = JIT_LAYOUT_NCHW;
  p->stride[0] = p->stride[1] = 1;
  p->dilation[0] = p->dilation[1] = 1;
  p->groups = 1;
  p->count_include_pad = 1;
}

static bool jit__param_in(int v, int lo) { return v >= lo && v <= kMaxWindowParam; }

// Checks `p` for `op` and copies it into `win`; records the error otherwise. `w` is
// the conv weight (id 0 for pools).
static bool jit__window_of(jit_graph *g, jit__op op, jit_value x, jit_value w,
                           const jit_window_params *p, jit__window *win) {
  const char *name = jit__op_name(op);
  if (!jit__check_operand(g, name, x, 0)) return false;
  if (op == JIT__OP_CONV2D && !jit__check_operand(g, name, w, 1)) return false;
  const char *bad = NULL;
  if (!p) bad = "params is NULL";
  else if (p->layout != JIT_LAYOUT_NCHW && p->layout != JIT_LAYOUT_NHWC)
    bad = "layout is not JIT_LAYOUT_NCHW or JIT_LAYOUT_NHWC";
  else if (!jit__param_in(p->stride[0], 1) || !jit__param_in(p->stride[1], 1))
    bad = "stride must be in [1, 65536]";
  else if (!jit__param_in(p->dilation[0], 1) || !jit__param_in(p->dilation[1], 1))
    bad = "dilation must be in [1, 65536]";
  else if (!jit__param_in(p->padding[0], 0) || !jit__param_in(p->padding[1], 0) ||
           !jit__param_in(p->padding[2], 0) || !jit__param_in(p->padding[3], 0))
    bad = "padding must be in [0, 65536]";
  else if (op == JIT__OP_CONV2D && !jit__param_in(p->groups, 1))
    bad = "groups must be in [1, 65536]";
  else if (op != JIT__OP_CONV2D && (!jit__param_in(p->kernel[0], 1) ||
                                    !jit__param_in(p->kernel[1], 1)))
    bad = "kernel must be in [1, 65536]";
  else if (op != JIT__OP_CONV2D && (p->padding[0] >= p->kernel[0] ||
                                    p->padding[1] >= p->kernel[0] ||
                                    p->padding[2] >= p->kernel[1] ||
                                    p->padding[3] >= p->kernel[1]))
    bad = "padding must be smaller than the kernel (a window of padding only has no value)";
  else if (op == JIT__OP_AVG_POOL2D && (p->dilation[0] != 1 || p->dilation[1] != 1))
    bad = "avg_pool2d takes no dilation";
  if (bad) {
    jit__record(g, JIT_ERR(JIT_INVALID_ARGUMENT, "graph `%s`: node %u (%s): %s", g->name,
                           g->n_nodes, name, bad));
    return false;
  }
  memset(win, 0, sizeof(*win));
  win->nhwc = p->layout == JIT_LAYOUT_NHWC;
  memcpy(win->stride, p->stride, sizeof win->stride);
  memcpy(win->pad, p->padding, sizeof win->pad);
  memcpy(win->dilation, p->dilation, sizeof win->dilation);
  win->groups = op == JIT__OP_CONV2D ? p->groups : 1;
  win->count_pad = op == JIT__OP_AVG_POOL2D && p->count_include_pad;
  if (op != JIT__OP_CONV2D) memcpy(win->kernel, p->kernel, sizeof win->kernel);
  // Lowering writes the channels and the weight as static sizes.
  const jit__node *xn = jit__value(g, x);
  int cd = win->nhwc ? 3 : 1;
  bool static_c = xn->rank != 4 || jit__dim_known(xn->dims[cd]);
  if (op == JIT__OP_CONV2D) {
    const jit__node *wn = jit__value(g, w);
    for (int d = 0; d < wn->rank; d++) static_c &= jit__dim_known(wn->dims[d]);
    if (wn->rank == 4) {
      win->kernel[0] = (int)(win->nhwc ? wn->dims[0] : wn->dims[2]);
      win->kernel[1] = (int)(win->nhwc ? wn->dims[1] : wn->dims[3]);
    }
  }
  if (!static_c) {
    jit__record(g, JIT_ERR(JIT_UNSUPPORTED,
                           "graph `%s`: node %u (%s): the channel dim of x%s must be static "
                           "(batch, height and width may be symbols)",
                           g->name, g->n_nodes, name,
                           op == JIT__OP_CONV2D ? " and every dim of the weight" : ""));
    return false;
  }
  return true;
}

static jit_value jit__window_node(jit_graph *g, jit__op op, jit_value x, jit_value w,
                                  const jit_window_params *p) {
  jit__gnode node = {0};
  if (!jit__window_of(g, op, x, w, p, &node.n.win)) return (jit_value){0};
  jit_value v[2] = {x, w};
  return jit__make_node(g, op, v, op == JIT__OP_CONV2D ? 2 : 1, &node);
}

jit_value jit_conv2d(jit_graph *g, jit_value x, jit_value w, const jit_window_params *p) {
  return jit__window_node(g, JIT__OP_CONV2D, x, w, p);
}
jit_value jit_max_pool2d(jit_graph *g, jit_value x, const jit_window_params *p) {
  return jit__window_node(g, JIT__OP_MAX_POOL2D, x, (jit_value){0}, p);
}
jit_value jit_avg_pool2d(jit_graph *g, jit_value x, const jit_window_params *p) {
  return jit__window_node(g, JIT__OP_AVG_POOL2D, x, (jit_value){0}, p);
}

// Normalizes a possibly negative axis against `x`'s rank, recording an error if it
// is out of range.
static bool jit__axis(jit_graph *g, const char *op, jit_value x, int *axis) {
  if (!jit__check_operand(g, op, x, 0)) return false;
  int rank = jit__value(g, x)->rank;
  int a = *axis < 0 ? *axis + rank : *axis;
  if (a < 0 || a >= rank) {
    jit__record(g, JIT_ERR(JIT_INVALID_ARGUMENT,
                           "graph `%s`: node %u (%s): axis %d out of range for rank %d",
                           g->name, g->n_nodes, op, *axis, rank));
    return false;
  }
  *axis = a;
  return true;
}

static jit_value jit__reduce(jit_graph *g, jit__op op, jit_value x, int axis,
                             int keepdims) {
  if (!jit__axis(g, jit__op_name(op), x, &axis)) return (jit_value){0};
  jit__gnode node = {0};
  node.n.axis = axis;
  node.n.keepdims = keepdims != 0;
  return jit__make_node(g, op, &x, 1, &node);
}

jit_value jit_reduce_sum(jit_graph *g, jit_value x, int axis, int keepdims) {
  return jit__reduce(g, JIT__OP_REDUCE_SUM, x, axis, keepdims);
}
jit_value jit_reduce_max(jit_graph *g, jit_value x, int axis, int keepdims) {
  return jit__reduce(g, JIT__OP_REDUCE_MAX, x, axis, keepdims);
}
jit_value jit_reduce_mean(jit_graph *g, jit_value x, int axis, int keepdims) {
  return jit__reduce(g, JIT__OP_REDUCE_MEAN, x, axis, keepdims);
}

jit_value jit_softmax(jit_graph *g, jit_value x, int axis) {
  if (!jit__axis(g, "softmax", x, &axis)) return (jit_value){0};
  jit__gnode node = {0};
  node.n.axis = axis;
  return jit__make_node(g, JIT__OP_SOFTMAX, &x, 1, &node);
}

jit_value jit_transpose(jit_graph *g, jit_value x, const int *perm) {
  if (!jit__check_operand(g, "transpose", x, 0)) return (jit_value){0};
  int rank = jit__value(g, x)->rank;
  if (!perm && rank > 0)
    JIT__FAIL(g, JIT_INVALID_ARGUMENT, "graph `%s`: node %u (transpose): perm is NULL",
              g->name, g->n_nodes);
  jit__gnode node = {0};
  bool seen[JIT_MAX_RANK] = {0};
  for (int i = 0; i < rank; i++) {
    if (perm[i] < 0 || perm[i] >= rank || seen[perm[i]])
      JIT__FAIL(g, JIT_INVALID_ARGUMENT,
                "graph `%s`: node %u (transpose): perm is not a permutation of 0..%d "
                "(entry %d is %d)",
                g->name, g->n_nodes, rank - 1, i, perm[i]);
    seen[perm[i]] = true;
    node.n.perm[i] = perm[i];
  }
  return jit__make_node(g, JIT__OP_TRANSPOSE, &x, 1, &node);
}

jit_value jit_reshape(jit_graph *g, jit_value x, int rank, const int64_t *dims) {
  if (!jit__check_operand(g, "reshape", x, 0)) return (jit_value){0};
  if (rank < 0 || rank > JIT_MAX_RANK || (rank > 0 && !dims))
    JIT__FAIL(g, JIT_INVALID_ARGUMENT,
              "graph `%s`: node %u (reshape): rank %d with %s dims", g->name, g->n_nodes,
              rank, dims ? "given" : "NULL");
  jit__gnode node = {0};
  node.n.rank = rank;
  int n_infer = 0;
  for (int i = 0; i < rank; i++) {
    int64_t d = dims[i];
    if (d == -1) n_infer++;
    else if (d < -1 && JIT__SYMBOL_INDEX(d) >= g->n_symbols)
      JIT__FAIL(g, JIT_INVALID_ARGUMENT,
                "graph `%s`: node %u (reshape): dim %d is %lld, neither a size, -1 nor "
                "a symbol of this graph",
                g->name, g->n_nodes, i, (long long)d);
    node.req[i] = d;
  }
  if (n_infer > 1)
    JIT__FAIL(g, JIT_INVALID_ARGUMENT,
              "graph `%s`: node %u (reshape): more than one dim is -1", g->name,
              g->n_nodes);
  return jit__make_node(g, JIT__OP_RESHAPE, &x, 1, &node);
}

//===--- Finalize --------------------------------------------------------===//

// Whether symbol `code` is a dim of some input of `g` (which gives it its value).
static bool jit__symbol_bound(const jit_graph *g, int64_t code) {
  for (uint32_t k = 0; k < g->n_inputs; k++) {
    const jit__node *in = &g->nodes[g->inputs[k]].n;
    for (int j = 0; j < in->rank; j++)
      if (in->dims[j] == code) return true;
  }
  return false;
}

// A symbol used by a reshape or a slice's bound must be bound by some input, or it has
// no value.
static jit_status jit__check_symbols_bound(const jit_graph *g) {
  for (uint32_t i = 0; i < g->n_nodes; i++) {
    const jit__gnode *gn = &g->nodes[i];
    int64_t used[JIT_MAX_RANK];
    int n_used = 0;
    if (gn->n.op == JIT__OP_RESHAPE) {
      for (int d = 0; d < gn->n.rank; d++)
        if (gn->req[d] <= -2) used[n_used++] = gn->req[d];
    } else if (gn->n.op == JIT__OP_SLICE) {
      if (gn->n.span.lo_sym) used[n_used++] = gn->n.span.lo_sym;
      if (gn->n.span.hi_sym) used[n_used++] = gn->n.span.hi_sym;
    }
    for (int k = 0; k < n_used; k++)
      if (!jit__symbol_bound(g, used[k]))
        return JIT_ERR(JIT_INVALID_ARGUMENT,
                       "graph `%s`: node %u (%s): symbol %s is not a dim of any input, so "
                       "it has no value at run time", g->name, i, jit__op_name(gn->n.op),
                       g->symbols[JIT__SYMBOL_INDEX(used[k])]);
  }
  return NULL;
}

// The graph's identity for kernel keys: its structure, not its name or symbol names.
static void jit__fingerprint(jit_graph *g) {
  XXH3_state_t *st = XXH3_createState();
  if (!st) return;  // leaves an all-zero fingerprint: still correct, less sharing
  XXH3_128bits_reset(st);
  for (uint32_t i = 0; i < g->n_nodes; i++) {
    const jit__gnode *gn = &g->nodes[i];
    int64_t rec[8 + 3 * JIT_MAX_RANK] = {0};
    rec[0] = gn->n.op;
    rec[1] = gn->n.dtype;
    rec[2] = gn->n.n_operands;
    rec[3] = gn->n.operands[0];
    rec[4] = gn->n.operands[1];
    rec[5] = gn->n.rank;
    rec[6] = gn->n.axis * 2 + gn->n.keepdims;
    memcpy(&rec[7], &gn->n.scalar, sizeof(double));
    for (int d = 0; d < JIT_MAX_RANK; d++) {
      rec[8 + d] = d < gn->n.rank ? gn->n.dims[d] : 0;
      rec[8 + JIT_MAX_RANK + d] = gn->n.op == JIT__OP_RESHAPE ? gn->req[d] : 0;
      rec[8 + 2 * JIT_MAX_RANK + d] = gn->n.op == JIT__OP_TRANSPOSE ? gn->n.perm[d] : 0;
    }
    XXH3_128bits_update(st, rec, sizeof(rec));
    // Only what ops added later carry, so that older graphs keep their keys.
    if (gn->n.n_operands > 2) XXH3_128bits_update(st, &gn->n.operands[2], sizeof(uint32_t));
    if (gn->n.n_operands > 3) XXH3_128bits_update(st, &gn->n.operands[3], sizeof(uint32_t));
    for (int k = 4; k < gn->n.n_operands; k++)  // zero points (axis says whose)
      XXH3_128bits_update(st, &gn->n.operands[k], sizeof(uint32_t));
    if (gn->n.op == JIT__OP_ATTENTION) XXH3_128bits_update(st, &gn->n.causal, sizeof(bool));
    // A weight's kernels may read it packed: not the same kernels as a plain input's.
    if (gn->n.op == JIT__OP_INPUT && gn->n.weight)
      XXH3_128bits_update(st, &gn->n.weight, sizeof(bool));
    if (gn->n.op == JIT__OP_SLICE || gn->n.op == JIT__OP_PAD) {
      XXH3_128bits_update(st, &gn->n.span, offsetof(jit__span, lo_sym));
      if (gn->n.span.lo_sym || gn->n.span.hi_sym)  // jit_slice_symbolic's, after the rest
        XXH3_128bits_update(st, &gn->n.span.lo_sym, 2 * sizeof(int64_t));
    }
    if (jit__op_is_window(gn->n.op)) {
      const jit__window *w = &gn->n.win;
      int32_t win[14] = {w->nhwc,      w->kernel[0], w->kernel[1],   w->stride[0],
                         w->stride[1], w->pad[0],    w->pad[1],      w->pad[2],
                         w->pad[3],    w->dilation[0], w->dilation[1], w->groups,
                         w->count_pad, 0};
      XXH3_128bits_update(st, win, sizeof(win));
    }
  }
  XXH3_128bits_update(st, g->inputs, sizeof(uint32_t) * g->n_inputs);
  XXH3_128bits_update(st, &g->n_inputs, sizeof(g->n_inputs));
  XXH3_128bits_update(st, g->outputs, sizeof(uint32_t) * g->n_outputs);
  XXH3_128bits_update(st, &g->n_outputs, sizeof(g->n_outputs));
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits_digest(st));
  memcpy(g->fingerprint, c.digest, sizeof(g->fingerprint));
  XXH3_freeState(st);
}

jit_status jit_graph_finalize(jit_graph *g) {
  if (!g) return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_graph_finalize: graph is NULL");
  if (g->error)
    return JIT_ERR(jit_status_get_code(g->error), "%s", jit_status_message(g->error));
  if (g->finalized) return NULL;
  if (g->n_outputs == 0)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "graph `%s` has no outputs (call jit_output)",
                   g->name);
  JIT_PROPAGATE(jit__check_symbols_bound(g));
  JIT_PROPAGATE(jit__weights_init(g));
  jit__fingerprint(g);
  for (uint32_t i = 0; i < g->n_nodes; i++) g->has_gather |= g->nodes[i].n.op == JIT__OP_GATHER;
  g->finalized = true;
  return NULL;
}

//===--- Ops composed of others --------------------------------------------===//
//
// Built from the primitive ops above, so every backend, the generic kernels, the MLIR
// export and the fusion of elementwise chains cover them as they are. Each checks its
// own arguments first, so that an error names it rather than one of its parts.

static DLDataType jit__dl_of(const jit__node *n) {
  return jit__dtype_dl(n->dtype);
}

// Checks the optional per-feature operand `p` (id 0: none) of a norm over x's last
// axis: a rank-1 tensor as long as that axis.
static bool jit__check_affine(jit_graph *g, const char *op, const char *what, jit_value x,
                              jit_value p) {
  if (p.id == 0) return true;
  if (!jit__check_operand(g, op, p, 1)) return false;
  const jit__node *nx = jit__value(g, x), *np = jit__value(g, p);
  int64_t last = nx->dims[nx->rank - 1];
  if (np->rank != 1 || np->dims[0] != last) {
    char want[64], got[200];
    jit__record(g, JIT_ERR(JIT_SHAPE_MISMATCH, "graph `%s`: node %u (%s): %s has shape %s; "
                           "want %s (x's last dim)", g->name, g->n_nodes, op, what,
                           jit__fmt_dims(g, np->rank, np->dims, got, sizeof got),
                           jit__fmt_dims(g, 1, &last, want, sizeof want)));
    return false;
  }
  return true;
}

// The shared checks of a norm: x of rank >= 1, eps finite and >= 0.
static bool jit__check_norm(jit_graph *g, const char *op, jit_value x, double eps) {
  if (!jit__check_operand(g, op, x, 0)) return false;
  if (jit__value(g, x)->rank < 1 || !isfinite(eps) || eps < 0) {
    jit__record(g, JIT_ERR(JIT_INVALID_ARGUMENT, "graph `%s`: node %u (%s): %s", g->name,
                           g->n_nodes, op, !isfinite(eps) || eps < 0
                                               ? "eps must be finite and >= 0"
                                               : "x must have rank >= 1"));
    return false;
  }
  return true;
}

// y * weight + bias, each when given.
static jit_value jit__affine(jit_graph *g, jit_value y, jit_value weight, jit_value bias) {
  if (weight.id) y = jit_mul(g, y, weight);
  if (bias.id) y = jit_add(g, y, bias);
  return y;
}

jit_value jit_layer_norm(jit_graph *g, jit_value x, jit_value weight, jit_value bias,
                         double eps) {
  if (!jit__check_norm(g, "layer_norm", x, eps) ||
      !jit__check_affine(g, "layer_norm", "weight", x, weight) ||
      !jit__check_affine(g, "layer_norm", "bias", x, bias))
    return (jit_value){0};
  DLDataType dt = jit__dl_of(jit__value(g, x));
  // x - mean twice, one node per consumer: elementwise fusion takes a producer with
  // one use only, so a shared one stayed a tensor, which the CPU's row loop wrote and
  // read back (4 passes over each row instead of 3). layer_norm 4096x768 on a Zen 4
  // at 1 thread, interleaved: 0.59-0.64 ms against 0.76-0.99 (oneDNN 0.66-0.71).
  jit_value mean = jit_reduce_mean(g, x, -1, 1);
  jit_value d = jit_sub(g, x, mean), d2 = jit_sub(g, x, mean);
  jit_value var = jit_reduce_mean(g, jit_mul(g, d2, d2), -1, 1);
  jit_value inv = jit_rsqrt(g, jit_add(g, var, jit_scalar(g, eps, dt)));
  return jit__affine(g, jit_mul(g, d, inv), weight, bias);
}

jit_value jit_rms_norm(jit_graph *g, jit_value x, jit_value weight, double eps) {
  if (!jit__check_norm(g, "rms_norm", x, eps) ||
      !jit__check_affine(g, "rms_norm", "weight", x, weight))
    return (jit_value){0};
  DLDataType dt = jit__dl_of(jit__value(g, x));
  jit_value ms = jit_reduce_mean(g, jit_mul(g, x, x), -1, 1);
  jit_value inv = jit_rsqrt(g, jit_add(g, ms, jit_scalar(g, eps, dt)));
  return jit__affine(g, jit_mul(g, x, inv), weight, (jit_value){0});
}

jit_value jit_clamp(jit_graph *g, jit_value x, double lo, double hi) {
  if (!jit__check_operand(g, "clamp", x, 0)) return (jit_value){0};
  if (isnan(lo) || isnan(hi) || lo > hi)
    JIT__FAIL(g, JIT_INVALID_ARGUMENT, "graph `%s`: node %u (clamp): bounds [%g, %g] are "
              "not an interval (lo <= hi, no NaN)", g->name, g->n_nodes, lo, hi);
  DLDataType dt = jit__dl_of(jit__value(g, x));
  // An infinite bound clamps nothing on its side.
  if (isfinite(lo)) x = jit_maximum(g, x, jit_scalar(g, lo, dt));
  if (isfinite(hi)) x = jit_minimum(g, x, jit_scalar(g, hi, dt));
  return x;
}

//===--- Introspection ---------------------------------------------------===//

jit_status jit_graph_input_info(const jit_graph *g, int index, jit_input_info *out) {
  if (!g || !out)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_graph_input_info: %s is NULL",
                   g ? "out_info" : "graph");
  memset(out, 0, sizeof(*out));
  if (index < 0 || (uint32_t)index >= g->n_inputs)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "graph `%s`: input index %d not in [0, %u)",
                   g->name, index, g->n_inputs);
  const jit__gnode *n = &g->nodes[g->inputs[index]];
  out->name = n->name;
  out->dtype = jit__dtype_dl(n->n.dtype);
  out->rank = n->n.rank;
  memcpy(out->dims, n->n.dims, sizeof(out->dims));
  return NULL;
}

jit_status jit_graph_output_info(const jit_graph *g, int index, jit_output_info *out) {
  if (!g || !out)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_graph_output_info: %s is NULL",
                   g ? "out_info" : "graph");
  memset(out, 0, sizeof(*out));
  if (!g->finalized)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "graph `%s`: jit_graph_output_info before "
                   "jit_graph_finalize", g->name);
  if (index < 0 || (uint32_t)index >= g->n_outputs)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "graph `%s`: output index %d not in [0, %u)",
                   g->name, index, g->n_outputs);
  if (g->mlir) {
    jit__mlir_graph_result_info(g, (uint32_t)index, out);
    return NULL;
  }
  const jit__node *n = &g->nodes[g->outputs[index]].n;
  out->dtype = jit__dtype_dl(n->dtype);
  out->rank = n->rank;
  for (int d = 0; d < n->rank; d++)
    out->dims[d] = n->dims[d] == JIT__DIM_UNKNOWN ? JIT_DIM_UNKNOWN : n->dims[d];
  return NULL;
}

const char *jit_symbol_name(const jit_graph *g, int64_t code) {
  if (!g || code > -2 || JIT__SYMBOL_INDEX(code) >= g->n_symbols) return NULL;
  return g->symbols[JIT__SYMBOL_INDEX(code)];
}
