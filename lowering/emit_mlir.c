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
    case JIT__OP_MATMUL: case JIT__OP_CONV2D: case JIT__OP_GATHER: case JIT__OP_CONCAT:
      return 2;
    case JIT__OP_WHERE: return 3;
    case JIT__OP_MATMUL_INT8: return -2;  // 4, and a zero point per bit of axis
    case JIT__OP_ATTENTION: return -1;  // 3 or 4 (with a mask): check_node
    default: return jit__op_is_binary_elementwise(op) ? 2 : 1;
  }
}

// The invariants every jit__emitter relies on; a violation is a bug upstream.
static jit_status check_node(jit__emitter *e, const jit__node *n) {
  if ((int)n->op < 0 || n->op >= JIT__OP_COUNT_) return jit__node_error(e, "unknown op");
  if (n->dtype != JIT__F32 && !jit__dtype_is_half(n->dtype) &&
      !((n->op == JIT__OP_INPUT || n->op == JIT__OP_CAST) && jit__dtype_is_int(n->dtype)))
    return jit__node_error(e, "unknown dtype");
  if (n->rank < 0 || n->rank > JIT_MAX_RANK) return jit__node_error(e, "rank out of range");
  for (int d = 0; d < n->rank; d++)
    if (n->dims[d] < 0 && !e->symbolic) return jit__node_error(e, "dim not concrete");
  int want = operand_count(n->op);
  if (want == -2) want = 4 + (n->axis & 1) + ((n->axis >> 1) & 1);
  if (want >= 0 ? n->n_operands != want : n->n_operands < 3 || n->n_operands > 4)
    return jit__node_error(e, "operand count");
  for (int i = 0; i < n->n_operands; i++) {
    if (n->operands[i] >= e->cur) return jit__node_error(e, "operand is not an earlier node");
    if (e->g->nodes[n->operands[i]].dtype != n->dtype && n->op != JIT__OP_CAST &&
        !(n->op == JIT__OP_GATHER && i == 1) && !(n->op == JIT__OP_MATMUL_INT8 && (i < 2 || i > 3)))
      return jit__node_error(e, "dtype");
  }
  if (n->op == JIT__OP_SCALAR && n->rank != 0) return jit__node_error(e, "scalar rank");
  if (jit__op_is_unary(n->op)) {
    const jit__node *x = &e->g->nodes[n->operands[0]];
    if (x->rank != n->rank || memcmp(x->dims, n->dims, sizeof(int64_t) * (size_t)n->rank))
      return jit__node_error(e, "unary op changes the shape");
  }
  return NULL;
}

static jit_status emit_node(jit__emitter *e, const jit__node *n) {
  if (e->inlined && e->inlined[e->cur]) return NULL;  // written in its consumer's body
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
    case JIT__OP_CONV2D: case JIT__OP_MAX_POOL2D: case JIT__OP_AVG_POOL2D:
      return jit__emit_window(e, n);
    case JIT__OP_GATHER:
      return jit__emit_gather(e, n);
    case JIT__OP_ATTENTION:
      return jit__emit_attention(e, n);
    case JIT__OP_MATMUL_INT8:
      return jit__emit_matmul_int8(e, n);
    case JIT__OP_CONCAT: case JIT__OP_SLICE: case JIT__OP_PAD:
      return jit__emit_index_copy(e, n);
    case JIT__OP_CAST: {
      const jit__node *x = &e->g->nodes[n->operands[0]];
      if (x->rank != n->rank) return jit__node_error(e, "cast changes the rank");
      memcpy(e->dv[e->cur], e->dv[n->operands[0]], sizeof e->dv[e->cur]);
      if (x->dtype == n->dtype) {
        memcpy(e->names[e->cur], e->names[n->operands[0]], sizeof e->names[e->cur]);
        return NULL;
      }
      jit__emit_convert(e, e->names[n->operands[0]], x->dtype, n->dtype, n->rank, n->dims,
                        e->dv[e->cur], true);
      return NULL;
    }
    default:
      if (jit__op_is_elementwise(n->op))
        return jit__emit_elementwise(e, n, jit__elementwise_kind(n->op));
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
    const jit__node *n = &g->nodes[id];
    if (!e->symbolic || e->opt->destination) {
      snprintf(e->names[id], sizeof e->names[id], "%%a%u", i);
      for (int d = 0; e->symbolic && d < n->rank; d++)
        if (n->dims[d] < 0) snprintf(e->dv[id][d].s, sizeof(jit__dimval), "%%in%u_d%d", i, d);
      continue;
    }
    const char *name = e->opt->input_names ? e->opt->input_names[i] : NULL;
    char ident[30];
    make_ident(ident, sizeof ident, name ? name : "in");
    bool dup = false;
    for (uint32_t j = 0; j < i; j++) dup |= !strcmp(e->names[g->inputs[j]] + 1, ident);
    if (dup || reserved_name(ident)) snprintf(ident, sizeof ident, "arg%u", i);
    snprintf(e->names[id], sizeof e->names[id], "%%%s", ident);
    for (int d = 0; d < n->rank; d++)
      if (n->dims[d] < 0) snprintf(e->dv[id][d].s, sizeof(jit__dimval), "%%in%u_d%d", i, d);
  }
  return NULL;
}

// The index constants %idx0.. and a tensor.dim per `?` input dim, before the body.
static void frame_dims(jit__emitter *e, jit__text *head) {
  const jit__lgraph *g = e->g;
  for (int d = 0; d < JIT_MAX_RANK; d++)
    jit__text_printf(head, "  %%idx%d = arith.constant %d : index\n", d, d);
  for (uint32_t k = 0; k < g->n_inputs; k++) {
    uint32_t id = g->inputs[k];
    const jit__node *n = &g->nodes[id];
    for (int d = 0; d < n->rank; d++)
      if (n->dims[d] < 0)
        jit__text_printf(head, "  %s = tensor.dim %s, %%idx%d : %s\n", e->dv[id][d].s,
                         e->names[id], d, jit__tensor_type(n->dtype, n->rank, n->dims).s);
  }
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
  frame_dims(e, &head);
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

static void emit_outputs(jit__emitter *e, jit__text *tb);

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
  if (e->symbolic && !e->opt->destination) {
    frame_symbolic(e, func_name, e->tb);
    return NULL;
  }

  jit__text body = e->tb, head = {0};
  // An argument with no elements is declared as <0xT>: convert-func-to-llvm's bare
  // pointer convention rejects a memref like memref<2x0xf32> (a 0 after the leading
  // dim), which fails the whole lowering. With bare pointers the declared shape does
  // not change the ABI, and nothing is read from or written to such a buffer.
  // Inputs are the caller's: never written (bufferization copies instead of reusing
  // one), which also lets the kernel's pointers be noalias (compile_cpu.c).
  const int64_t zero = 0;
  jit__text_printf(&head, "func.func @%s(", func_name);
  for (uint32_t i = 0; i < g->n_inputs; i++) {
    const jit__node *n = &g->nodes[g->inputs[i]];
    bool empty = !e->symbolic && jit__num_elements(n->rank, n->dims) == 0;
    jit__text_printf(&head, "%s%%a%u: %s {bufferization.writable = false}", i ? ", " : "", i,
              jit__tensor_type(n->dtype, empty ? 1 : n->rank, empty ? &zero : n->dims).s);
  }
  // An output made by a batched matmul's named op is declared in that op's shape and
  // written from its result (e->flat), which one-shot bufferization then computes in
  // place: through the reshape it would go to a temporary and be copied.
  for (uint32_t j = 0; j < g->n_outputs; j++) {
    const jit__node *n = &g->nodes[g->outputs[j]];
    bool empty = !e->symbolic && jit__num_elements(n->rank, n->dims) == 0;
    const struct jit__flat_value *f = &e->flat[g->outputs[j]];
    int rank = empty ? 1 : f->rank ? f->rank : n->rank;
    const int64_t *dims = empty ? &zero : f->rank ? f->dims : n->dims;
    jit__text_printf(&head, "%s%%r%u: %s", (g->n_inputs || j) ? ", " : "", j,
              jit__shape_type("memref", n->dtype, rank, dims).s);
  }
  jit__text_printf(&head, ") {\n");
  if (e->symbolic) frame_dims(e, &head);

  // Two paths (destination mode, options.split_rows): the body in both regions of an
  // scf.if on the first `?` dim (the first input's, else the next input's), so that
  // the CPU strategy plans each for its side of options.split_rows (lowering/cpu/
  // generic.c: B packed for many rows, not for a few). Sibling regions have scopes
  // of their own: the copies keep their names.
  const char *split_dim = NULL;
  for (uint32_t i = 0; e->symbolic && e->opt->split_rows > 0 && !split_dim && i < g->n_inputs;
       i++) {
    const jit__node *n = &g->nodes[g->inputs[i]];
    for (int d = 0; d < n->rank && !split_dim; d++)
      if (n->dims[d] < 0) split_dim = e->dv[g->inputs[i]][d].s;
  }
  int copies = split_dim ? 2 : 1;
  jit__text whole = head;
  for (int c = 0; c < copies; c++) {
    if (split_dim && c == 0)
      jit__text_printf(&whole, "  %%split_at = arith.constant %lld : index\n"
                       "  %%split = arith.cmpi sge, %s, %%split_at : index\n"
                       "  scf.if %%split {\n", (long long)e->opt->split_rows, split_dim);
    if (split_dim && c == 1) jit__text_printf(&whole, "  } else {\n");
    jit__text_append(&whole, body.p ? body.p : "", body.len);
    emit_outputs(e, &whole);
  }
  if (split_dim) jit__text_printf(&whole, "  }\n");
  whole.oom |= body.oom;
  free(body.p);
  e->tb = whole;
  jit__text_printf(&e->tb, "  return\n}\n");
  return NULL;
}

// The materialize_in_destination of every output into its %r argument.
static void emit_outputs(jit__emitter *e, jit__text *tb) {
  const jit__lgraph *g = e->g;
  // restrict: each %r is a distinct buffer nobody else touches in this function, which
  // lets eliminate-empty-tensors compute the producing op directly into it.
  for (uint32_t j = 0; j < g->n_outputs; j++) {
    const jit__node *n = &g->nodes[g->outputs[j]];
    if (!e->symbolic && jit__num_elements(n->rank, n->dims) == 0) continue;
    const struct jit__flat_value *f = &e->flat[g->outputs[j]];
    int rank = f->rank ? f->rank : n->rank;
    const int64_t *dims = f->rank ? f->dims : n->dims;
    jit__text_printf(tb,
              "  bufferization.materialize_in_destination %s in restrict writable %%r%u"
              " : (%s, %s) -> ()\n",
              f->rank ? f->name.s : e->names[g->outputs[j]], j,
              jit__tensor_type(n->dtype, rank, dims).s,
              jit__shape_type("memref", n->dtype, rank, dims).s);
  }
}

jit_status jit__emit_mlir_with(const jit__lgraph *graph, const char *func_name,
                               const jit__emit_options *options, char **out_text) {
  if (out_text) *out_text = NULL;
  if (!graph || !out_text || !options || (graph->n_nodes && !graph->nodes) ||
      (graph->n_inputs && !graph->inputs) || (graph->n_outputs && !graph->outputs) ||
      (options->symbolic && (!func_name || !options->reshape_req)))
    return JIT_ERR(JIT_INTERNAL, "jit__emit_mlir: NULL argument");
  if ((!options->symbolic || options->destination) && !is_bare_id(func_name))
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
    s = options->fuse_elementwise && !jit__plan_inlining(&e)
            ? JIT_ERR(JIT_RESOURCE_EXHAUSTED, "emitting MLIR: out of memory")
            : emit_graph(&e, func_name);
  }
  jit__fusion_free(&e);
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

jit_status jit__emit_mlir(const jit__lgraph *graph, const char *func_name, char **out_text) {
  jit__emit_options o = {.fuse_elementwise = true, .distinct_empties = true};
  return jit__emit_mlir_with(graph, func_name, &o, out_text);
}

