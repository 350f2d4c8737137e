//===--- emit_fused.c - elementwise chains written as one linalg.generic ----===//
//
// The compile pipelines start with linalg-fuse-elementwise-ops, which fuses an
// elementwise producer into its consumer one pair at a time, cloning the growing body
// at each step: a chain of n ops costs O(n^2) (2,000 chained adds: 1.5 s of a 1.7 s
// compile; 10,000 would take about a minute). The emitter writes such chains fused
// already, in one pass: an elementwise node with exactly one use, by an elementwise
// node of the same shape (so that its operands' maps hold in the consumer's loops),
// not an output, is written inside its consumer's body (e->inlined). The result is
// what the pass makes: the inputs are the leaves in order (the consumer's operands,
// each inlined one replaced by its own operands), the body the producers' computations
// first; f16 values are rounded between the steps as separate ops would round them.
// Repeated leaves are one input (the pass's canonicalization would merge them too).
//
// Not inlined: values of batched matmuls' named-op forms (e->flat: emit_ops.c writes
// their consumers in the named op's shape), and anything in the graph's MLIR export,
// which is read back op by op.
//
//===----------------------------------------------------------------------===//
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "base/text.h"
#include "lowering/emit.h"
#include "lowering/lower.h"

static bool is_elementwise(jit__op op) { return op >= JIT__OP_ADD && op <= JIT__OP_RSQRT; }

static bool same_shape(const jit__node *a, const jit__node *b) {
  return a->rank == b->rank && !memcmp(a->dims, b->dims, sizeof(int64_t) * (size_t)a->rank);
}

bool jit__plan_inlining(jit__emitter *e) {
  const jit__lgraph *g = e->g;
  size_t n = g->n_nodes ? g->n_nodes : 1;
  uint32_t *uses = calloc(n, sizeof(*uses)), *user = calloc(n, sizeof(*user));
  // Named-op forms reach through elementwise nodes (emit_elementwise_flat): a node
  // that may read one is left as it is, and so are its operands.
  uint8_t *flat = calloc(n, 1);
  e->inlined = calloc(n, 1);
  if (!uses || !user || !flat || !e->inlined) {
    free(uses);
    free(user);
    free(flat);
    free(e->inlined);
    e->inlined = NULL;
    return false;
  }
  for (uint32_t i = 0; i < g->n_nodes; i++) {
    const jit__node *x = &g->nodes[i];
    for (int k = 0; k < x->n_operands; k++) {
      uint32_t o = x->operands[k];
      if (o >= i) continue;  // check_node reports it
      uses[o]++;
      user[o] = i;
      if (e->named_batch && (flat[o] || (g->nodes[o].op == JIT__OP_MATMUL &&
                                         g->nodes[o].rank >= 3)))
        flat[i] = is_elementwise(x->op);
    }
  }
  for (uint32_t j = 0; j < g->n_outputs; j++)
    if (g->outputs[j] < g->n_nodes) uses[g->outputs[j]] += 2;
  for (uint32_t i = 0; i < g->n_nodes; i++) {
    const jit__node *x = &g->nodes[i];
    if (uses[i] != 1 || !is_elementwise(x->op) || flat[i]) continue;
    const jit__node *c = &g->nodes[user[i]];
    e->inlined[i] = is_elementwise(c->op) && !flat[user[i]] && same_shape(x, c) &&
                    x->dtype == c->dtype;
  }
  free(uses);
  free(user);
  free(flat);
  return true;
}

typedef struct fused {
  jit__emitter *e;
  const jit__node *n;       // the consumer written
  jit__gen_operand *ins;    // leaves
  int64_t (*sq)[JIT_MAX_RANK];
  uint32_t *leaf_id;
  int n_in, cap;
} fused;

// A node being walked (collect, compute): its next operand, and its operands' values.
typedef struct frame {
  uint32_t id;
  int k;
  char arg[2][32];
} frame;

typedef struct walk {
  frame *st;
  size_t n, cap;
} walk;

static bool push(walk *w, uint32_t id) {
  if (w->n == w->cap) {
    size_t cap = w->cap ? 2 * w->cap : 16;
    frame *st = realloc(w->st, sizeof(*st) * cap);
    if (!st) return false;
    w->st = st;
    w->cap = cap;
  }
  w->st[w->n++] = (frame){.id = id};
  return true;
}

static jit_status add_leaf(fused *f, uint32_t id) {
  for (int i = 0; i < f->n_in; i++)
    if (f->leaf_id[i] == id) return NULL;
  if (f->n_in == f->cap) {
    int cap = f->cap ? 2 * f->cap : 8;
    jit__gen_operand *ins = realloc(f->ins, sizeof(*ins) * (size_t)cap);
    if (ins) f->ins = ins;
    int64_t(*sq)[JIT_MAX_RANK] = realloc(f->sq, sizeof(*sq) * (size_t)cap);
    if (sq) f->sq = sq;
    uint32_t *ids = realloc(f->leaf_id, sizeof(*ids) * (size_t)cap);
    if (ids) f->leaf_id = ids;
    if (!ins || !sq || !ids) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "emitting MLIR: out of memory");
    f->cap = cap;
  }
  // sq moves with realloc: a squeezed operand's dims are pointed at it once all are in.
  JIT_PROPAGATE(jit__elementwise_operand(f->e, id, f->n->rank, f->n->dims, &f->ins[f->n_in],
                                         f->sq[f->n_in]));
  f->leaf_id[f->n_in++] = id;
  return NULL;
}

// The leaves under the consumer, in order (each inlined operand replaced by its own),
// each once. Iterative: a chain can be as long as the graph.
static jit_status collect(fused *f, walk *w) {
  const jit__lgraph *g = f->e->g;
  w->n = 0;
  if (!push(w, f->e->cur)) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "emitting MLIR: out of memory");
  while (w->n) {
    frame *t = &w->st[w->n - 1];
    const jit__node *x = &g->nodes[t->id];
    if (t->k == x->n_operands) {
      w->n--;
      continue;
    }
    uint32_t o = x->operands[t->k++];
    if (f->e->inlined[o]) {
      if (!push(w, o)) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "emitting MLIR: out of memory");
    } else {
      JIT_PROPAGATE(add_leaf(f, o));
    }
  }
  return NULL;
}

// Writes the body's computations, the inlined nodes' first (post-order), and puts the
// consumer's f32 value's name in result[32].
static jit_status compute(fused *f, walk *w, char result[32]) {
  jit__emitter *e = f->e;
  w->n = 0;
  if (!push(w, e->cur)) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "emitting MLIR: out of memory");
  int step = 0;
  while (w->n) {
    frame *t = &w->st[w->n - 1];
    const jit__node *x = &e->g->nodes[t->id];
    if (t->k < x->n_operands) {
      uint32_t o = x->operands[t->k];
      if (e->inlined[o]) {
        if (!push(w, o)) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "emitting MLIR: out of memory");
        continue;
      }
      for (int i = 0; i < f->n_in; i++)
        if (f->leaf_id[i] == o)
          snprintf(t->arg[t->k], 32, "%%%s%d", f->ins[i].dt == JIT__F16 ? "x" : "in", i);
      t->k++;
      continue;
    }
    char r[16], v[32];
    const char *val = jit__emit_body_step(e, jit__elementwise_kind(x->op), t->arg[0],
                                          t->arg[1], step, r);
    snprintf(v, sizeof v, "%s", val);
    if (x->dtype == JIT__F16 && t->id != e->cur) {
      // Rounded to f16 and back, as the value would be between two separate ops.
      jit__text_printf(&e->tb,
                       "    %%s%dh = arith.truncf %s : f32 to f16\n"
                       "    %%s%dr = arith.extf %%s%dh : f16 to f32\n",
                       step, v, step, step);
      snprintf(v, sizeof v, "%%s%dr", step);
    }
    step++;
    w->n--;
    if (!w->n) {
      snprintf(result, 32, "%s", v);
      break;
    }
    frame *p = &w->st[w->n - 1];
    snprintf(p->arg[p->k++], 32, "%s", v);
  }
  return NULL;
}

jit_status jit__emit_fused(jit__emitter *e, const jit__node *n) {
  fused f = {.e = e, .n = n};
  walk w = {0};
  jit_status s = collect(&f, &w);
  for (int i = 0; i < f.n_in && !s; i++)
    if (e->squeezed[f.leaf_id[i]].set) f.ins[i].dims = f.sq[i];
  jit__str empty, res;
  jit__gen_operand out;
  if (!s) s = jit__elementwise_result(e, n, f.ins, f.n_in, &empty, &res, &out);
  if (!s) {
    char iters[JIT_MAX_RANK + 1];
    memset(iters, 'p', sizeof iters);
    jit__emit_generic_open(e, res.s, n->rank, iters, f.ins, f.n_in, &out);
    for (int i = 0; i < f.n_in; i++)
      if (f.ins[i].dt == JIT__F16)
        jit__text_printf(&e->tb, "    %%x%d = arith.extf %%in%d : f16 to f32\n", i, i);
    char result[32] = "";
    s = compute(&f, &w, result);
    const char *elem = n->dtype == JIT__F16 ? "f16" : "f32";
    if (n->dtype == JIT__F16) {
      jit__text_printf(&e->tb, "    %%y = arith.truncf %s : f32 to f16\n", result);
      snprintf(result, sizeof result, "%%y");
    }
    jit__text_printf(&e->tb, "    linalg.yield %s : %s\n  } -> %s\n", result, elem,
                     jit__tensor_type(n->dtype, n->rank, n->dims).s);
  }
  free(w.st);
  free(f.ins);
  free(f.sq);
  free(f.leaf_id);
  return s;
}
