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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "base/text.h"
#include "lowering/emit.h"
#include "lowering/lower.h"

static bool is_elementwise(jit__op op) { return jit__op_is_elementwise(op); }

static bool same_shape(const jit__node *a, const jit__node *b) {
  return a->rank == b->rank && !memcmp(a->dims, b->dims, sizeof(int64_t) * (size_t)a->rank);
}

// What jit__emit_fused works in, sized once for the whole graph (a tree has at most
// as many leaves and levels as the graph has nodes).
struct jit__fusion {
  uint8_t *inlined;             // per node; e->inlined points here
  uint32_t *leaf_of;            // per node: 1 + its input index in the tree being written
  uint32_t *leaf_id;            // per input: its node
  jit__gen_operand *ins;        // per input
  int64_t (*sq)[JIT_MAX_RANK];  // per input: its dims when read squeezed
  struct frame *st;             // the walk's stack
};

// A node being walked (collect, compute): its next operand, and its operands' values.
typedef struct frame {
  uint32_t id;
  int k;
  char arg[3][32];
} frame;

void jit__fusion_free(jit__emitter *e) {
  struct jit__fusion *f = e->fusion;
  if (!f) return;
  free(f->inlined);
  free(f->leaf_of);
  free(f->leaf_id);
  free(f->ins);
  free(f->sq);
  free(f->st);
  free(f);
  e->fusion = NULL;
  e->inlined = NULL;
}

static bool fusion_alloc(jit__emitter *e, size_t n) {
  struct jit__fusion *f = calloc(1, sizeof(*f));
  e->fusion = f;
  if (!f) return false;
  f->inlined = calloc(n, 1);
  f->leaf_of = calloc(n, sizeof(*f->leaf_of));
  f->leaf_id = malloc(n * sizeof(*f->leaf_id));
  f->ins = malloc(n * sizeof(*f->ins));
  f->sq = malloc(n * sizeof(*f->sq));
  f->st = malloc(n * sizeof(*f->st));
  e->inlined = f->inlined;
  return f->inlined && f->leaf_of && f->leaf_id && f->ins && f->sq && f->st;
}

bool jit__plan_inlining(jit__emitter *e) {
  const jit__lgraph *g = e->g;
  size_t n = g->n_nodes ? g->n_nodes : 1;
  uint32_t *uses = calloc(n, sizeof(*uses)), *user = calloc(n, sizeof(*user));
  // Named-op forms reach through elementwise nodes (emit_elementwise_flat): a node
  // that may read one is left as it is, and so are its operands.
  uint8_t *flat = calloc(n, 1);
  bool ok = uses && user && flat && fusion_alloc(e, n);
  for (uint32_t i = 0; ok && i < g->n_nodes; i++) {
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
  for (uint32_t j = 0; ok && j < g->n_outputs; j++)
    if (g->outputs[j] < g->n_nodes) uses[g->outputs[j]] += 2;
  for (uint32_t i = 0; ok && i < g->n_nodes; i++) {
    const jit__node *x = &g->nodes[i];
    if (uses[i] != 1 || !is_elementwise(x->op) || flat[i]) continue;
    const jit__node *c = &g->nodes[user[i]];
    e->inlined[i] = is_elementwise(c->op) && !flat[user[i]] && same_shape(x, c) &&
                    x->dtype == c->dtype;
  }
  free(uses);
  free(user);
  free(flat);
  if (!ok) jit__fusion_free(e);
  return ok;
}

// The inputs of the tree under the consumer (e->cur), in order (each inlined operand
// replaced by its own operands), each once; returns their count in *n_in. Iterative:
// a chain can be as long as the graph.
static jit_status collect(jit__emitter *e, const jit__node *n, int *n_in) {
  struct jit__fusion *f = e->fusion;
  size_t depth = 0;
  f->st[depth++] = (frame){.id = e->cur};
  while (depth) {
    frame *t = &f->st[depth - 1];
    const jit__node *x = &e->g->nodes[t->id];
    if (t->k == x->n_operands) {
      depth--;
      continue;
    }
    uint32_t o = x->operands[t->k++];
    if (e->inlined[o]) {
      f->st[depth++] = (frame){.id = o};
    } else if (!f->leaf_of[o]) {
      int i = (*n_in)++;
      JIT_PROPAGATE(jit__elementwise_operand(e, o, n->rank, n->dims, &f->ins[i], f->sq[i]));
      f->leaf_id[i] = o;
      f->leaf_of[o] = (uint32_t)i + 1;
    }
  }
  return NULL;
}

// Writes the body's computations, the inlined nodes' first (post-order), and puts the
// consumer's f32 value's name in result[32].
static void compute(jit__emitter *e, char result[32]) {
  struct jit__fusion *f = e->fusion;
  size_t depth = 0;
  f->st[depth++] = (frame){.id = e->cur};
  int step = 0;  // computations written: their names' prefix
  while (depth) {
    frame *t = &f->st[depth - 1];
    const jit__node *x = &e->g->nodes[t->id];
    if (t->k < x->n_operands) {
      uint32_t o = x->operands[t->k];
      if (e->inlined[o]) {
        f->st[depth++] = (frame){.id = o};
      } else {
        uint32_t i = f->leaf_of[o] - 1;
        snprintf(t->arg[t->k++], 32, "%%%s%u", jit__dtype_is_half(f->ins[i].dt) ? "x" : "in", i);
      }
      continue;
    }
    char r[16], v[32];
    snprintf(v, sizeof v, "%s",
             jit__emit_body_step(e, jit__elementwise_kind(x->op), t->arg[0], t->arg[1],
                                 t->arg[2], step, r));
    if (jit__dtype_is_half(x->dtype) && t->id != e->cur) {
      // Rounded to 16 bits and back, as the value would be between two separate ops.
      const char *h = jit__dtype_str(x->dtype);
      jit__text_printf(&e->tb,
                       "    %%s%dh = arith.truncf %s : f32 to %s\n"
                       "    %%s%dr = arith.extf %%s%dh : %s to f32\n",
                       step, v, h, step, step, h);
      snprintf(v, sizeof v, "%%s%dr", step);
    }
    step++;
    if (--depth == 0) {
      snprintf(result, 32, "%s", v);
      break;
    }
    frame *p = &f->st[depth - 1];
    snprintf(p->arg[p->k++], 32, "%s", v);
  }
}

jit_status jit__emit_fused(jit__emitter *e, const jit__node *n) {
  struct jit__fusion *f = e->fusion;
  int n_in = 0;
  jit_status s = collect(e, n, &n_in);
  // jit__elementwise_operand pointed a squeezed input's dims at f->sq[i].
  jit__str empty, res;
  jit__gen_operand out;
  if (!s) s = jit__elementwise_result(e, n, f->ins, n_in, &empty, &res, &out);
  if (!s) {
    char iters[JIT_MAX_RANK + 1];
    memset(iters, 'p', sizeof iters);
    jit__emit_generic_open(e, res.s, n->rank, iters, f->ins, n_in, &out);
    for (int i = 0; i < n_in; i++)
      if (jit__dtype_is_half(f->ins[i].dt))
        jit__text_printf(&e->tb, "    %%x%d = arith.extf %%in%d : %s to f32\n", i, i,
                         jit__dtype_str(f->ins[i].dt));
    char result[32] = "";
    compute(e, result);
    const char *elem = jit__dtype_str(n->dtype);
    if (jit__dtype_is_half(n->dtype)) {
      jit__text_printf(&e->tb, "    %%y = arith.truncf %s : f32 to %s\n", result, elem);
      snprintf(result, sizeof result, "%%y");
    }
    jit__text_printf(&e->tb, "    linalg.yield %s : %s\n  } -> %s\n", result, elem,
                     jit__tensor_type(n->dtype, n->rank, n->dims).s);
  }
  for (int i = 0; i < n_in; i++) f->leaf_of[f->leaf_id[i]] = 0;
  return s;
}
