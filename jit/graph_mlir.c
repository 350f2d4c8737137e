//===--- graph_mlir.c - graphs from and to MLIR text -----------------------===//
//
// A graph from MLIR is a jit_graph whose nodes are only the INPUT nodes of the entry
// function's arguments (so binding, symbol checks and keys work as for graphs built in
// C) and whose body is the module's canonical text (lowering/import_mlir.c). Its
// fingerprint is the XXH3-128 of that text, so equal functions share kernels whatever
// their value names, comments or locations.
//
// Output shapes of a binding come from specializing the module (an MLIR context, a
// few ms), so they are remembered per binding in the graph.
//
// jit_graph_to_mlir: an imported graph gives back its canonical text (the entry under
// its own name), so from_mlir(to_mlir(g)) has the same fingerprint and hits the same
// kernels. A graph built in C is written as linalg on tensors with `?` dims
// (mlir_export below) with its node graph recorded in an attribute; from_mlir rebuilds
// that node graph when the body is still exactly what was exported, so a C graph
// round-trips to the same graph: same results, same specialization keys.
//
//===----------------------------------------------------------------------===//
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "jit/internal.h"
#include "jit/mlir_graph.h"
#include "base/file.h"
#include "base/text.h"
#include "lowering/import.h"

//===--- jit_graph_from_mlir ---------------------------------------------===//

// A default name for an unnamed `?` dim: "<argument>_d<dim>", made a valid symbol.
static void jit__default_dim_name(const char *arg, int d, char *out, size_t size) {
  snprintf(out, size, "%s_d%d", arg, d);
  for (char *p = out; *p; p++)
    if (!isalnum((unsigned char)*p) && *p != '_') *p = '_';
}

static jit_status jit__graph_from_module(jit_context *ctx, jit__mlir_module *m,
                                         jit_graph **out_graph) {
  jit_graph *g = NULL;
  jit_status cs = jit_graph_create(ctx, m->entry, &g);
  if (cs) {
    jit__mlir_module_release(m);
    return cs;
  }
  jit__mlir_graph *mg = calloc(1, sizeof(*mg));
  if (!mg) {
    jit_graph_destroy(g);
    jit__mlir_module_release(m);
    return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
  }
  pthread_mutex_init(&mg->mu, NULL);
  mg->m = *m;  // taken over
  memset(m, 0, sizeof(*m));
  g->mlir = mg;
  const jit__mlir_module *mm = &mg->m;
  for (uint32_t i = 0; i < mm->n_args && !g->error; i++) {
    const jit__mlir_arg *a = &mm->args[i];
    int64_t dims[JIT_MAX_RANK];
    for (int d = 0; d < a->rank; d++) {
      if (a->dims[d] >= 0) {
        dims[d] = a->dims[d];
        continue;
      }
      char name[96];
      if (a->dim_names[d][0])
        snprintf(name, sizeof name, "%s", a->dim_names[d]);
      else
        jit__default_dim_name(a->name, d, name, sizeof name);
      dims[d] = jit_symbol(g, name);
    }
    DLDataType dt = jit__dtype_dl(a->dtype);
    jit_input(g, a->name, dt, a->rank, dims);
  }
  jit_status s = NULL;
  if (g->error) {
    s = JIT_ERR(jit_status_get_code(g->error), "%s", jit_status_message(g->error));
  } else {
    // Results are not nodes: the run path reads their shapes from jit__mlir_graph_bind.
    g->outputs = calloc(mm->n_results, sizeof(uint32_t));
    if (!g->outputs) s = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
    g->n_outputs = g->cap_outputs = mm->n_results;
  }
  if (s) {
    jit_graph_destroy(g);
    return s;
  }
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits(mm->canonical, strlen(mm->canonical)));
  memcpy(g->fingerprint, c.digest, sizeof(g->fingerprint));
  g->finalized = true;
  *out_graph = g;
  return NULL;
}

#define JIT__RECORD_MAGIC "jitml-graph-1"
static void jit__graph_record(const jit_graph *g, jit__text *b);

//===--- Raising an export back to its node graph -------------------------===//
// (the record's format is described above jit__graph_record, further down)

typedef struct jit__rd {
  const char *p;
  bool bad;
} jit__rd;

static long long jit__rd_int(jit__rd *r) {
  while (*r->p == ' ') r->p++;
  char *end;
  errno = 0;
  long long v = strtoll(r->p, &end, 10);
  if (end == r->p || errno) r->bad = true;
  r->p = end;
  return v;
}

static unsigned long long jit__rd_hex(jit__rd *r) {
  while (*r->p == ' ') r->p++;
  char *end;
  errno = 0;
  unsigned long long v = strtoull(r->p, &end, 16);
  if (end == r->p || errno) r->bad = true;
  r->p = end;
  return v;
}

// A hex-encoded name ("-" for the empty one) into out[size].
static void jit__rd_name(jit__rd *r, char *out, size_t size) {
  while (*r->p == ' ') r->p++;
  size_t n = 0;
  if (*r->p == '-') {
    r->p++;
  } else {
    while (isxdigit((unsigned char)r->p[0]) && isxdigit((unsigned char)r->p[1])) {
      unsigned v;
      if (sscanf(r->p, "%2x", &v) != 1 || v == 0 || n + 1 >= size) {
        r->bad = true;
        break;
      }
      out[n++] = (char)v;
      r->p += 2;
    }
    if (!n) r->bad = true;
  }
  out[n] = 0;
}

static bool jit__rd_end(jit__rd *r) {
  while (*r->p == ' ') r->p++;
  if (*r->p == ';') {
    r->p++;
    return true;
  }
  return *r->p == 0;
}

// An input's name, then `w` for a jit_weight (later records only).
static jit_value jit__replay_input(jit_graph *g, jit__rd *r, DLDataType dl, int rank,
                                   const int64_t *dims) {
  char name[256];
  jit__rd_name(r, name, sizeof name);
  while (*r->p == ' ') r->p++;
  bool weight = *r->p == 'w';
  if (weight) r->p++;
  if (r->bad) return (jit_value){0};
  return (weight ? jit_weight : jit_input)(g, name, dl, rank, dims);
}

static jit_value jit__replay_node(jit_graph *g, jit__rd *r) {
  int op = (int)jit__rd_int(r), dt = (int)jit__rd_int(r), nops = (int)jit__rd_int(r);
  long long o0 = jit__rd_int(r), o1 = jit__rd_int(r);
  int rank = (int)jit__rd_int(r), axis = (int)jit__rd_int(r), keep = (int)jit__rd_int(r);
  uint64_t bits = jit__rd_hex(r);
  if (r->bad || rank < 0 || rank > JIT_MAX_RANK || nops < 0 || nops > 6 || o0 < 0 ||
      o1 < 0 || (nops > 0 && o0 >= (long long)g->n_nodes) ||
      (nops > 1 && o1 >= (long long)g->n_nodes) || (dt < JIT__F32 || dt > JIT__I8)) {
    r->bad = true;
    return (jit_value){0};
  }
  int64_t dims[JIT_MAX_RANK], req[JIT_MAX_RANK];
  int perm[JIT_MAX_RANK];
  for (int d = 0; d < rank; d++) dims[d] = jit__rd_int(r);
  if (op == JIT__OP_RESHAPE)
    for (int d = 0; d < rank; d++) req[d] = jit__rd_int(r);
  if (op == JIT__OP_TRANSPOSE)
    for (int d = 0; d < rank; d++) perm[d] = (int)jit__rd_int(r);
  // Ops added later: where's third operand, a window's parameters.
  long long o2 = op == JIT__OP_WHERE ? jit__rd_int(r) : 0, o3 = 0;
  int att_ops = 0, causal = 0;
  long long zp[2] = {-1, -1};  // matmul_int8's zero points, in operand order
  if (op == JIT__OP_MATMUL_INT8) {
    o2 = jit__rd_int(r);
    o3 = jit__rd_int(r);
    if (o2 >= (long long)g->n_nodes || o3 < 0 || o3 >= (long long)g->n_nodes) r->bad = true;
    while (*r->p == ' ') r->p++;
    if (*r->p == 'z') {
      r->p++;
      zp[0] = jit__rd_int(r);
      zp[1] = jit__rd_int(r);
    }
    int n_zp = (axis & 1) + ((axis >> 1) & 1);
    if (axis < 0 || axis > 3 || nops != 4 + n_zp || (n_zp > 0 && zp[0] < 0))
      r->bad = true;
    for (int i = 0; i < n_zp; i++)
      if (zp[i] < 0 || zp[i] >= (long long)g->n_nodes) r->bad = true;
  }
  if (op == JIT__OP_ATTENTION) {
    att_ops = (int)jit__rd_int(r);
    o2 = jit__rd_int(r);
    o3 = jit__rd_int(r);
    causal = (int)jit__rd_int(r);
    if (att_ops < 3 || att_ops > 4 || o2 >= (long long)g->n_nodes || o3 < 0 ||
        o3 >= (long long)g->n_nodes)
      r->bad = true;
  }
  jit_window_params wp;
  jit_window_params_init(&wp);
  if (op >= JIT__OP_CONV2D && op <= JIT__OP_AVG_POOL2D) {
    int v[13];
    for (int i = 0; i < 13; i++) v[i] = (int)jit__rd_int(r);
    wp.layout = v[0] ? JIT_LAYOUT_NHWC : JIT_LAYOUT_NCHW;
    memcpy(wp.kernel, v + 1, sizeof wp.kernel);
    memcpy(wp.stride, v + 3, sizeof wp.stride);
    memcpy(wp.padding, v + 5, sizeof wp.padding);
    memcpy(wp.dilation, v + 9, sizeof wp.dilation);
    wp.groups = v[11];
    wp.count_include_pad = v[12];
  }
  if (r->bad || o2 < 0 || (op == JIT__OP_WHERE && (nops != 3 || o2 >= (long long)g->n_nodes)))
    return (jit_value){0};
  int64_t span[3] = {0, 0, 1}, lo[JIT_MAX_RANK] = {0}, hi[JIT_MAX_RANK] = {0};
  int64_t span_sym[2] = {0, 0};
  if (op == JIT__OP_SLICE) {
    for (int i = 0; i < 3; i++) span[i] = jit__rd_int(r);
    while (*r->p == ' ') r->p++;
    if (*r->p == 's') {
      r->p++;
      span_sym[0] = jit__rd_int(r);
      span_sym[1] = jit__rd_int(r);
    }
  }
  int in_rank = op == JIT__OP_PAD ? (int)jit__rd_int(r) : 0;
  if (in_rank < 0 || in_rank > JIT_MAX_RANK) r->bad = true;
  for (int d = 0; d < in_rank && !r->bad; d++) lo[d] = jit__rd_int(r), hi[d] = jit__rd_int(r);
  if (r->bad) return (jit_value){0};
  DLDataType dl = jit__dtype_dl(dt);
  jit_value a = {(uint32_t)o0 + 1}, b = {(uint32_t)o1 + 1};
  double scalar;
  memcpy(&scalar, &bits, sizeof scalar);
  switch ((jit__op)op) {
    case JIT__OP_INPUT: return jit__replay_input(g, r, dl, rank, dims);
    case JIT__OP_SCALAR: return jit_scalar(g, scalar, dl);
    case JIT__OP_MATMUL: return jit_matmul(g, a, b);
    case JIT__OP_ADD: return jit_add(g, a, b);
    case JIT__OP_SUB: return jit_sub(g, a, b);
    case JIT__OP_MUL: return jit_mul(g, a, b);
    case JIT__OP_DIV: return jit_div(g, a, b);
    case JIT__OP_MAXIMUM: return jit_maximum(g, a, b);
    case JIT__OP_MINIMUM: return jit_minimum(g, a, b);
    case JIT__OP_NEG: return jit_neg(g, a);
    case JIT__OP_EXP: return jit_exp(g, a);
    case JIT__OP_LOG: return jit_log(g, a);
    case JIT__OP_TANH: return jit_tanh(g, a);
    case JIT__OP_SIGMOID: return jit_sigmoid(g, a);
    case JIT__OP_RELU: return jit_relu(g, a);
    case JIT__OP_GELU: return jit_gelu(g, a);
    case JIT__OP_SQRT: return jit_sqrt(g, a);
    case JIT__OP_RSQRT: return jit_rsqrt(g, a);
    case JIT__OP_ERF: return jit_erf(g, a);
    case JIT__OP_ROUND: return jit_round(g, a);
    case JIT__OP_GELU_ERF: return jit_gelu_erf(g, a);
    case JIT__OP_REDUCE_SUM: return jit_reduce_sum(g, a, axis, keep);
    case JIT__OP_REDUCE_MAX: return jit_reduce_max(g, a, axis, keep);
    case JIT__OP_REDUCE_MEAN: return jit_reduce_mean(g, a, axis, keep);
    case JIT__OP_SOFTMAX: return jit_softmax(g, a, axis);
    case JIT__OP_TRANSPOSE: return jit_transpose(g, a, perm);
    case JIT__OP_RESHAPE: return jit_reshape(g, a, rank, req);
    case JIT__OP_LESS: return jit_less(g, a, b);
    case JIT__OP_LESS_EQUAL: return jit_less_equal(g, a, b);
    case JIT__OP_GREATER: return jit_greater(g, a, b);
    case JIT__OP_GREATER_EQUAL: return jit_greater_equal(g, a, b);
    case JIT__OP_EQUAL: return jit_equal(g, a, b);
    case JIT__OP_NOT_EQUAL: return jit_not_equal(g, a, b);
    case JIT__OP_POW: return jit_pow(g, a, b);
    case JIT__OP_WHERE: return jit_where(g, a, b, (jit_value){(uint32_t)o2 + 1});
    case JIT__OP_CONV2D: return jit_conv2d(g, a, b, &wp);
    case JIT__OP_MAX_POOL2D: return jit_max_pool2d(g, a, &wp);
    case JIT__OP_AVG_POOL2D: return jit_avg_pool2d(g, a, &wp);
    case JIT__OP_GATHER: return jit_gather_axis(g, a, b, axis);
    case JIT__OP_CONCAT: {
      jit_value v[2] = {a, b};
      return jit_concat(g, v, 2, axis);
    }
    case JIT__OP_SLICE:
      return jit_slice_symbolic(g, a, axis, span_sym[0], span[0], span_sym[1], span[1], span[2]);
    case JIT__OP_PAD: return jit_pad_with(g, a, lo, hi, (jit_padding)axis, scalar);
    case JIT__OP_CAST: return jit_cast(g, a, dl);
    case JIT__OP_MATMUL_INT8: {
      jit_value z[2] = {{0}, {0}};
      int k = 0;
      if (axis & 1) z[0] = (jit_value){(uint32_t)zp[k++] + 1};
      if (axis & 2) z[1] = (jit_value){(uint32_t)zp[k] + 1};
      return jit_matmul_int8_zp(g, a, b, (jit_value){(uint32_t)o2 + 1},
                                (jit_value){(uint32_t)o3 + 1}, z[0], z[1]);
    }
    case JIT__OP_ATTENTION:
      return jit_attention(g, a, b, (jit_value){(uint32_t)o2 + 1},
                           att_ops > 3 ? (jit_value){(uint32_t)o3 + 1} : (jit_value){0},
                           scalar, causal);
    default: r->bad = true; return (jit_value){0};
  }
}

// The node graph `m`'s record describes, rebuilt with the builder; NULL where the
// record is malformed or the builder refuses it.
static jit_graph *jit__replay(jit_context *ctx, const jit__mlir_module *m,
                              uint8_t fingerprint[16]) {
  jit__rd r = {m->graph_record, false};
  size_t ml = strlen(JIT__RECORD_MAGIC);
  if (strncmp(r.p, JIT__RECORD_MAGIC " ", ml + 1) != 0) return NULL;
  r.p += ml + 1;
  for (int i = 0; i < 16; i++) {
    unsigned v;
    if (!isxdigit((unsigned char)r.p[0]) || !isxdigit((unsigned char)r.p[1]) ||
        sscanf(r.p, "%2x", &v) != 1)
      return NULL;
    fingerprint[i] = (uint8_t)v;
    r.p += 2;
  }
  if (!jit__rd_end(&r)) return NULL;
  jit_graph *g = NULL;
  jit_status s = jit_graph_create(ctx, m->entry, &g);
  if (s) {
    jit_status_free(s);
    return NULL;
  }
  while (*r.p && !r.bad && !g->error) {
    char kind = *r.p++;
    if (kind == 's') {
      char name[256];
      jit__rd_name(&r, name, sizeof name);
      if (!r.bad && jit_symbol(g, name) != JIT__SYMBOL_CODE(g->n_symbols - 1)) r.bad = true;
    } else if (kind == 'n') {
      uint32_t before = g->n_nodes;
      jit_value v = jit__replay_node(g, &r);
      if (v.id != before + 1) r.bad = true;
    } else if (kind == 'o') {
      long long i = jit__rd_int(&r);
      if (r.bad || i < 0 || i >= (long long)g->n_nodes) r.bad = true;
      else jit_output(g, (jit_value){(uint32_t)i + 1});
    } else {
      r.bad = true;
    }
    if (!r.bad && !jit__rd_end(&r)) r.bad = true;
  }
  jit_status fs = r.bad ? NULL : jit_graph_finalize(g);
  if (r.bad || fs) {
    jit_status_free(fs);
    jit_graph_destroy(g);
    return NULL;
  }
  return g;
}

// If `m` is an export of a node graph whose body is unchanged, that graph (see above).
static jit_graph *jit__raise(jit_context *ctx, const jit__mlir_module *m) {
  uint8_t recorded[16];
  jit_graph *g = jit__replay(ctx, m, recorded);
  if (!g) {
    jit__log(ctx, JIT_LOG_DEBUG, "`%s`: its jit.graph record does not rebuild a graph; "
             "using the body as written", m->entry);
    return NULL;
  }
  bool same = memcmp(recorded, g->fingerprint, 16) == 0;
  char *text = NULL;
  jit__mlir_module m2;
  memset(&m2, 0, sizeof m2);
  if (same) {
    jit_status s = jit__mlir_export(g, &text);
    if (!s) s = jit__mlir_import(text, strlen(text), m->entry, "<export>", &m2);
    same = !s && strcmp(m2.canonical, m->canonical) == 0;
    jit_status_free(s);
  }
  free(text);
  jit__mlir_module_release(&m2);
  if (!same) {
    jit__log(ctx, JIT_LOG_DEBUG, "`%s`: the body differs from the graph its jit.graph "
             "record describes; using the body as written", m->entry);
    jit_graph_destroy(g);
    return NULL;
  }
  return g;
}

static jit_status jit__from_mlir(jit_context *ctx, const char *text, size_t length,
                                 const char *entry_name, const char *source,
                                 jit_graph **out_graph) {
  if (out_graph) *out_graph = NULL;
  if (!ctx || !text || !out_graph)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_graph_from_mlir: %s is NULL",
                   !ctx ? "ctx" : !text ? "text" : "out_graph");
  if ((uint64_t)length > JIT__MAX_MLIR_BYTES)
    return JIT_ERR(JIT_RESOURCE_EXHAUSTED,
                   "jit_graph_from_mlir: %s is %zu bytes, over the limit of %llu bytes",
                   source, length, (unsigned long long)JIT__MAX_MLIR_BYTES);
  // Text from outside is imported by the isolation worker first (jit/isolate.c). Where
  // the worker came back, with a graph or a status, importing here is safe (the same
  // deterministic code) and gives the status its own words; where it died, that ends it.
  if (jit__isolation_on(ctx)) {
    char what[300];
    bool died = false;
    snprintf(what, sizeof what, "MLIR text %s", source);
    jit_status s = jit__isolated(ctx, false, what, text, length, entry_name, NULL, 0, &died);
    if (died || (s && jit_status_get_code(s) == JIT_UNAVAILABLE)) return s;
    jit_status_free(s);
  }
  jit__mlir_module m;
  JIT_PROPAGATE(jit__mlir_import(text, length, entry_name, source, &m));
  if (m.graph_record) {
    jit_graph *g = jit__raise(ctx, &m);
    if (g) {
      jit__mlir_module_release(&m);
      *out_graph = g;
      return NULL;
    }
  }
  return jit__graph_from_module(ctx, &m, out_graph);
}

jit_status jit_graph_from_mlir(jit_context *ctx, const char *text, size_t length,
                               const char *entry_name, jit_graph **out_graph) {
  return jit__from_mlir(ctx, text, length, entry_name, "<input>", out_graph);
}

jit_status jit_graph_from_mlir_file(jit_context *ctx, const char *path,
                                    const char *entry_name, jit_graph **out_graph) {
  if (out_graph) *out_graph = NULL;
  if (!path) return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_graph_from_mlir_file: path is NULL");
  char *text = NULL;
  size_t len = 0;
  JIT_PROPAGATE(jit__read_regular_file(path, "MLIR file", JIT__MAX_MLIR_BYTES, &text, &len));
  jit_status s = jit__from_mlir(ctx, text, len, entry_name, path, out_graph);
  free(text);
  return s;
}

//===--- The node graph behind an export ----------------------------------===//
//
// jit_graph_to_mlir writes, as the entry's `jit.graph` attribute, the node graph the
// text was made from: "jitml-graph-1 <fingerprint>;" then one record per symbol,
// node and output, every name hex-encoded so that the string needs no escapes:
//   s <name>                                   a symbol, in creation order
//   n <op> <dtype> <operand0> <operand1> <rank> <axis> <keepdims> <scalar bits>
//     <dims...> [<reshape's asked dims...>] [<transpose's perm...>] [<input name> [w]]
//     (w: declared with jit_weight)
//   o <node>                                   an output
// jit_graph_from_mlir rebuilds that graph with the builder and uses it instead of the
// text only if the rebuilt graph has the recorded fingerprint AND its export
// canonicalizes to exactly the module it was handed. A body edited after export (or
// a record that does not describe it) fails the second check and the text is used as
// written; so the record can never make a graph compute something its body does not
// say. A graph that round-trips is the same node graph: same results, same kernels,
// same keys.

static void jit__hexname(jit__text *b, const char *s) {
  if (!*s) jit__text_printf(b, " -");
  else jit__text_printf(b, " ");
  for (; *s; s++) jit__text_printf(b, "%02x", (unsigned char)*s);
}

static void jit__graph_record(const jit_graph *g, jit__text *b) {
  jit__text_printf(b, JIT__RECORD_MAGIC " ");
  for (int i = 0; i < 16; i++) jit__text_printf(b, "%02x", g->fingerprint[i]);
  for (uint32_t i = 0; i < g->n_symbols; i++) {
    jit__text_printf(b, ";s");
    jit__hexname(b, g->symbols[i]);
  }
  for (uint32_t i = 0; i < g->n_nodes; i++) {
    const jit__gnode *gn = &g->nodes[i];
    const jit__node *n = &gn->n;
    uint64_t bits;
    memcpy(&bits, &n->scalar, sizeof bits);
    jit__text_printf(b, ";n %d %d %d %u %u %d %d %d %llx", (int)n->op, (int)n->dtype, n->n_operands,
             n->operands[0], n->operands[1], n->rank, n->axis, (int)n->keepdims,
             (unsigned long long)bits);
    for (int d = 0; d < n->rank; d++) jit__text_printf(b, " %lld", (long long)n->dims[d]);
    if (n->op == JIT__OP_RESHAPE)
      for (int d = 0; d < n->rank; d++) jit__text_printf(b, " %lld", (long long)gn->req[d]);
    if (n->op == JIT__OP_TRANSPOSE)
      for (int d = 0; d < n->rank; d++) jit__text_printf(b, " %d", n->perm[d]);
    if (n->op == JIT__OP_WHERE) jit__text_printf(b, " %u", n->operands[2]);
    if (n->op == JIT__OP_MATMUL_INT8) {
      jit__text_printf(b, " %u %u", n->operands[2], n->operands[3]);
      // Zero points (jit_matmul_int8_zp; `axis` says whose) only: older records lack it.
      if (n->n_operands > 4)
        jit__text_printf(b, " z %u %u", n->operands[4],
                         n->n_operands > 5 ? n->operands[5] : 0u);
    }
    if (n->op == JIT__OP_ATTENTION)
      jit__text_printf(b, " %d %u %u %d", n->n_operands, n->operands[2],
                       n->n_operands > 3 ? n->operands[3] : 0u, (int)n->causal);
    if (n->op == JIT__OP_SLICE) {
      jit__text_printf(b, " %lld %lld %lld", (long long)n->span.lo[0],
                       (long long)n->span.hi[0], (long long)n->span.step);
      // Bounds that follow symbols (jit_slice_symbolic) only: older records lack it.
      if (n->span.lo_sym || n->span.hi_sym)
        jit__text_printf(b, " s %lld %lld", (long long)n->span.lo_sym,
                         (long long)n->span.hi_sym);
    }
    if (n->op == JIT__OP_PAD) {
      int xr = g->nodes[n->operands[0]].n.rank;
      jit__text_printf(b, " %d", xr);
      for (int d = 0; d < xr; d++)
        jit__text_printf(b, " %lld %lld", (long long)n->span.lo[d], (long long)n->span.hi[d]);
    }
    if (jit__op_is_window(n->op)) {
      const jit__window *w = &n->win;
      jit__text_printf(b, " %d %d %d %d %d %d %d %d %d %d %d %d %d", (int)w->nhwc,
                       w->kernel[0], w->kernel[1], w->stride[0], w->stride[1], w->pad[0],
                       w->pad[1], w->pad[2], w->pad[3], w->dilation[0], w->dilation[1],
                       w->groups, (int)w->count_pad);
    }
    if (n->op == JIT__OP_INPUT) jit__hexname(b, gn->name ? gn->name : "");
    if (n->op == JIT__OP_INPUT && n->weight) jit__text_printf(b, " w");
  }
  for (uint32_t j = 0; j < g->n_outputs; j++) jit__text_printf(b, ";o %u", g->outputs[j]);
}

//===--- jit_graph_to_mlir -----------------------------------------------===//
//
// A node graph is written by lowering/'s emitter in its symbolic mode (linalg on
// tensors with `?` dims, jit.dims on the arguments), with the graph's record (below)
// as the entry's `jit.graph` attribute. What lowering cannot know, jit/ passes in: the
// inputs' names, the symbols' names, and what each reshape asked for.

static const char *jit__export_symbol_name(const void *g, int64_t code) {
  return jit_symbol_name((const jit_graph *)g, code);
}

jit_status jit__mlir_export(const jit_graph *g, char **out_text) {
  uint32_t n = g->n_nodes ? g->n_nodes : 1;
  jit__node *nodes = malloc(sizeof(*nodes) * n);
  int64_t(*req)[JIT_MAX_RANK] = malloc(sizeof(*req) * n);
  const char **names = calloc(g->n_inputs + 1, sizeof(*names));
  jit__text attrs = {0};
  jit_status s = NULL;
  if (!nodes || !req || !names) {
    s = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
    goto done;
  }
  for (uint32_t i = 0; i < g->n_nodes; i++) {
    nodes[i] = g->nodes[i].n;
    memcpy(req[i], g->nodes[i].req, sizeof req[i]);
  }
  for (uint32_t k = 0; k < g->n_inputs; k++) names[k] = g->nodes[g->inputs[k]].name;
  jit__text_printf(&attrs, "jit.graph = \"");
  jit__graph_record(g, &attrs);
  jit__text_printf(&attrs, "\"");
  if (attrs.oom) {
    s = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
    goto done;
  }
  jit__lgraph lg = {g->name, nodes, g->n_nodes, g->inputs, g->n_inputs,
                    g->outputs, g->n_outputs};
  jit__emit_options o = {.symbolic = true,
                         .input_names = names,
                         .symbol_name = jit__export_symbol_name,
                         .symbol_arg = g,
                         .reshape_req = (const int64_t(*)[JIT_MAX_RANK])req,
                         .func_attributes = attrs.p};
  s = jit__emit_mlir_with(&lg, g->name, &o, out_text);
done:
  free(nodes);
  free(req);
  free(names);
  free(attrs.p);
  return s;
}

jit_status jit_graph_to_mlir(jit_graph *graph, char **out_text) {
  if (out_text) *out_text = NULL;
  if (!graph || !out_text)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_graph_to_mlir: %s is NULL",
                   !graph ? "graph" : "out_text");
  if (!graph->finalized)
    return JIT_ERR(JIT_INVALID_ARGUMENT,
                   "graph `%s` is not finalized (call jit_graph_finalize)", graph->name);
  if (graph->mlir) {
    const char *t = graph->mlir->m.exported;
    size_t n = strlen(t) + 1;
    *out_text = malloc(n);
    if (!*out_text) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
    memcpy(*out_text, t, n);
    return NULL;
  }
  return jit__mlir_export(graph, out_text);
}

//===--- jit_mlir_opt ----------------------------------------------------===//

jit_status jit_mlir_opt(const char *text, size_t length, const char *pipeline,
                        const char *source_name, char **out_text) {
  if (out_text) *out_text = NULL;
  if (!text || !pipeline || !out_text)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_mlir_opt: %s is NULL",
                   !text ? "text" : !pipeline ? "pipeline" : "out_text");
  if ((uint64_t)length > JIT__MAX_MLIR_BYTES)
    return JIT_ERR(JIT_RESOURCE_EXHAUSTED,
                   "jit_mlir_opt: the text is %zu bytes, over the limit of %llu bytes", length,
                   (unsigned long long)JIT__MAX_MLIR_BYTES);
  return jit__mlir_opt(text, length, pipeline, source_name, out_text);
}
