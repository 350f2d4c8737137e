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
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "jit/internal.h"
#include "base/file.h"
#include "base/text.h"
#include "lowering/import.h"

// Bindings whose output shapes are remembered (oldest replaced first).
enum { kBindCacheSize = 32 };

typedef struct jit__bind_entry {
  bool used;
  uint32_t n;           // number of int64 in key
  int64_t *key;         // per input: rank, dims
  jit__oshape *shapes;  // n_results
} jit__bind_entry;

struct jit__mlir_graph {
  jit__mlir_module m;
  pthread_mutex_t mu;  // guards binds
  jit__bind_entry binds[kBindCacheSize];
  uint32_t next_bind;
};

void jit__mlir_graph_free(jit__mlir_graph *mg) {
  if (!mg) return;
  jit__mlir_module_release(&mg->m);
  for (int i = 0; i < kBindCacheSize; i++) {
    free(mg->binds[i].key);
    free(mg->binds[i].shapes);
  }
  pthread_mutex_destroy(&mg->mu);
  free(mg);
}

// The concrete argument shapes of `inputs` as nodes, for lowering/.
static jit__node *jit__arg_nodes(const jit_graph *g, const DLTensor *inputs) {
  jit__node *args = calloc(g->n_inputs + 1, sizeof(*args));
  if (!args) return NULL;
  for (uint32_t i = 0; i < g->n_inputs; i++) {
    args[i] = g->nodes[g->inputs[i]].n;
    args[i].rank = inputs[i].ndim;
    for (int d = 0; d < inputs[i].ndim; d++) args[i].dims[d] = inputs[i].shape[d];
  }
  return args;
}

// The bind-cache key of `inputs`: per input, rank then dims (malloc'ed, *n int64s).
static int64_t *jit__bind_key(const jit_graph *g, const DLTensor *inputs, uint32_t *n_out) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < g->n_inputs; i++) n += 1 + (uint32_t)inputs[i].ndim;
  int64_t *key = malloc(sizeof(int64_t) * (n + 1));
  if (!key) return NULL;
  n = 0;
  for (uint32_t i = 0; i < g->n_inputs; i++) {
    key[n++] = inputs[i].ndim;
    for (int d = 0; d < inputs[i].ndim; d++) key[n++] = inputs[i].shape[d];
  }
  *n_out = n;
  return key;
}

// Converts result nodes to output shapes and remembers them for `inputs` (best effort).
static void jit__bind_remember(const jit_graph *g, const DLTensor *inputs,
                               const jit__node *res, jit__oshape *out_shapes) {
  jit__mlir_graph *mg = g->mlir;
  for (uint32_t j = 0; j < g->n_outputs; j++) {
    out_shapes[j].rank = res[j].rank;
    memset(out_shapes[j].dims, 0, sizeof(out_shapes[j].dims));
    memcpy(out_shapes[j].dims, res[j].dims, sizeof(int64_t) * (size_t)res[j].rank);
    out_shapes[j].dtype = res[j].dtype;
  }
  uint32_t n;
  int64_t *key = jit__bind_key(g, inputs, &n);
  jit__oshape *copy = malloc(sizeof(jit__oshape) * (g->n_outputs + 1));
  if (key && copy) {
    memcpy(copy, out_shapes, sizeof(jit__oshape) * g->n_outputs);
    pthread_mutex_lock(&mg->mu);
    jit__bind_entry *e = &mg->binds[mg->next_bind++ % kBindCacheSize];
    free(e->key);
    free(e->shapes);
    *e = (jit__bind_entry){true, n, key, copy};
    pthread_mutex_unlock(&mg->mu);
  } else {
    free(key);
    free(copy);
  }
}

jit_status jit__mlir_graph_bind(const jit_graph *g, const DLTensor *inputs,
                                jit__oshape *out_shapes) {
  jit__mlir_graph *mg = g->mlir;
  uint32_t n;
  int64_t *key = jit__bind_key(g, inputs, &n);
  if (!key) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "graph `%s`: out of memory", g->name);
  pthread_mutex_lock(&mg->mu);
  for (int i = 0; i < kBindCacheSize; i++) {
    jit__bind_entry *e = &mg->binds[i];
    if (e->used && e->n == n && !memcmp(e->key, key, sizeof(int64_t) * n)) {
      memcpy(out_shapes, e->shapes, sizeof(jit__oshape) * g->n_outputs);
      pthread_mutex_unlock(&mg->mu);
      free(key);
      return NULL;
    }
  }
  pthread_mutex_unlock(&mg->mu);

  jit__node *args = jit__arg_nodes(g, inputs);
  jit__node *res = calloc(g->n_outputs + 1, sizeof(*res));
  jit_status s = NULL;
  if (!args || !res)
    s = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "graph `%s`: out of memory", g->name);
  else
    s = jit__mlir_result_shapes(&mg->m, args, res);
  if (!s) {
    jit__bind_remember(g, inputs, res, out_shapes);
  } else {
    s = jit__status_annotate(s, "graph `%s`", g->name);
  }
  free(key);
  free(args);
  free(res);
  return s;
}

jit_status jit__mlir_graph_compile(const jit_graph *g, const DLTensor *inputs,
                                   const char *func_name, const jit__lower_options *lo,
                                   jit__artifact *out, jit__oshape *out_shapes) {
  jit__node *args = jit__arg_nodes(g, inputs);
  jit__node *res = calloc(g->n_outputs + 1, sizeof(*res));
  jit_status s = NULL;
  if (!args || !res)
    s = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "graph `%s`: out of memory", g->name);
  else
    s = jit__mlir_compile_cpu(&g->mlir->m, args, func_name, lo, out, res);
  if (!s) jit__bind_remember(g, inputs, res, out_shapes);
  free(args);
  free(res);
  if (s) s = jit__status_annotate(s, "graph `%s`", g->name);
  return s;
}

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
    DLDataType dt = {kDLFloat, a->dtype == JIT__F16 ? 16 : 32, 1};
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
jit_status jit__mlir_export(const jit_graph *g, char **out_text);

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

static jit_value jit__replay_node(jit_graph *g, jit__rd *r) {
  int op = (int)jit__rd_int(r), dt = (int)jit__rd_int(r), nops = (int)jit__rd_int(r);
  long long o0 = jit__rd_int(r), o1 = jit__rd_int(r);
  int rank = (int)jit__rd_int(r), axis = (int)jit__rd_int(r), keep = (int)jit__rd_int(r);
  uint64_t bits = jit__rd_hex(r);
  if (r->bad || rank < 0 || rank > JIT_MAX_RANK || nops < 0 || nops > 2 || o0 < 0 ||
      o1 < 0 || (nops > 0 && o0 >= (long long)g->n_nodes) ||
      (nops > 1 && o1 >= (long long)g->n_nodes) || (dt != JIT__F32 && dt != JIT__F16)) {
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
  if (r->bad) return (jit_value){0};
  DLDataType dl = {kDLFloat, dt == JIT__F16 ? 16 : 32, 1};
  jit_value a = {(uint32_t)o0 + 1}, b = {(uint32_t)o1 + 1};
  double scalar;
  memcpy(&scalar, &bits, sizeof scalar);
  switch ((jit__op)op) {
    case JIT__OP_INPUT: {
      char name[256];
      jit__rd_name(r, name, sizeof name);
      if (r->bad) return (jit_value){0};
      return jit_input(g, name, dl, rank, dims);
    }
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
    case JIT__OP_REDUCE_SUM: return jit_reduce_sum(g, a, axis, keep);
    case JIT__OP_REDUCE_MAX: return jit_reduce_max(g, a, axis, keep);
    case JIT__OP_REDUCE_MEAN: return jit_reduce_mean(g, a, axis, keep);
    case JIT__OP_SOFTMAX: return jit_softmax(g, a, axis);
    case JIT__OP_TRANSPOSE: return jit_transpose(g, a, perm);
    case JIT__OP_RESHAPE: return jit_reshape(g, a, rank, req);
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

//===--- jit_graph_to_mlir -----------------------------------------------===//

//===--- Writing a node graph as linalg on tensors with `?` dims ----------===//
//
// One func.func: arguments are tensors whose symbolic dims are `?`, named in
// `jit.dims`; every op is linalg on tensors (linalg.matmul, linalg.generic, fill) with
// dynamic sizes taken from tensor.dim of the values that carry them; reshapes go
// through a 1-D tensor (collapse_shape, then expand_shape with computed sizes). f16 is
// computed in f32 and rounded once, as the CPU emitter does, so results match.


typedef struct jit__xnode {
  char name[40];                       // SSA value
  char dv[JIT_MAX_RANK][40];           // SSA index value of each dynamic dim
} jit__xnode;

typedef struct jit__exporter {
  jit__text b;
  const jit_graph *g;
  jit__xnode *x;
  uint32_t cur;
  int tmp;
} jit__exporter;

static bool jit__static(int64_t d) { return d >= 0; }

static const char *jit__elt(jit__dtype t) { return t == JIT__F16 ? "f16" : "f32"; }

// "tensor<?x16xf32>" for a rank/dims/dtype.
static void jit__ttype(char *out, size_t size, jit__dtype dt, int rank, const int64_t *dims) {
  size_t n = (size_t)snprintf(out, size, "tensor<");
  for (int d = 0; d < rank && n < size; d++)
    n += jit__static(dims[d]) ? (size_t)snprintf(out + n, size - n, "%lldx", (long long)dims[d])
                              : (size_t)snprintf(out + n, size - n, "?x");
  if (n < size) snprintf(out + n, size - n, "%s>", jit__elt(dt));
}

static const jit__node *jit__xn(const jit__exporter *e, uint32_t i) { return &e->g->nodes[i].n; }

static void jit__tmp(jit__exporter *e, char *out) {
  snprintf(out, 40, "%%v%u_%d", e->cur, e->tmp++);
}

// tensor.empty of `dims` (dynamic ones from `dv`) and type `dt`, into `res`.
static void jit__x_empty(jit__exporter *e, const char *res, jit__dtype dt, int rank,
                         const int64_t *dims, char (*dv)[40]) {
  char ty[256];
  jit__ttype(ty, sizeof ty, dt, rank, dims);
  jit__text_printf(&e->b, "  %s = tensor.empty(", res);
  bool first = true;
  for (int d = 0; d < rank; d++)
    if (!jit__static(dims[d])) {
      jit__text_printf(&e->b, "%s%s", first ? "" : ", ", dv[d]);
      first = false;
    }
  jit__text_printf(&e->b, ") : %s\n", ty);
}

// An f32 accumulator of `dims` filled with `init`.
static void jit__x_acc(jit__exporter *e, char *res, const char *init, int rank,
                       const int64_t *dims, char (*dv)[40]) {
  char empty[40], c[40], ty[256];
  jit__tmp(e, empty);
  jit__tmp(e, c);
  jit__tmp(e, res);
  jit__ttype(ty, sizeof ty, JIT__F32, rank, dims);
  jit__x_empty(e, empty, JIT__F32, rank, dims, dv);
  jit__text_printf(&e->b, "  %s = arith.constant %s : f32\n", c, init);
  jit__text_printf(&e->b, "  %s = linalg.fill ins(%s : f32) outs(%s : %s) -> %s\n", res, c, empty,
           ty, ty);
}

typedef struct jit__xop {
  const char *name;
  jit__dtype dt;
  int rank;
  const int64_t *dims;
  int map[JIT_MAX_RANK];  // loop index per dim, -1 = constant 0
} jit__xop;

// The f32 body of a generic: `kind` is an op code or one of the extra codes below.
enum { kBodyCopy = 1000, kBodyAccSum, kBodyAccMax, kBodyMac, kBodyExpSub, kBodyDivBy };

static const char *jit__x_body(jit__text *b, int kind, const char *x, const char *y,
                               const char *by) {
  switch (kind) {
    case JIT__OP_ADD: jit__text_printf(b, "    %%r = arith.addf %s, %s : f32\n", x, y); break;
    case JIT__OP_SUB: jit__text_printf(b, "    %%r = arith.subf %s, %s : f32\n", x, y); break;
    case JIT__OP_MUL: jit__text_printf(b, "    %%r = arith.mulf %s, %s : f32\n", x, y); break;
    case JIT__OP_DIV: jit__text_printf(b, "    %%r = arith.divf %s, %s : f32\n", x, y); break;
    case JIT__OP_MAXIMUM: jit__text_printf(b, "    %%r = arith.maximumf %s, %s : f32\n", x, y); break;
    case JIT__OP_MINIMUM: jit__text_printf(b, "    %%r = arith.minimumf %s, %s : f32\n", x, y); break;
    case JIT__OP_NEG: jit__text_printf(b, "    %%r = arith.negf %s : f32\n", x); break;
    case JIT__OP_EXP: jit__text_printf(b, "    %%r = math.exp %s : f32\n", x); break;
    case JIT__OP_LOG: jit__text_printf(b, "    %%r = math.log %s : f32\n", x); break;
    case JIT__OP_TANH: jit__text_printf(b, "    %%r = math.tanh %s : f32\n", x); break;
    case JIT__OP_SQRT: jit__text_printf(b, "    %%r = math.sqrt %s : f32\n", x); break;
    case JIT__OP_RSQRT: jit__text_printf(b, "    %%r = math.rsqrt %s : f32\n", x); break;
    case JIT__OP_SIGMOID:
      jit__text_printf(b, "    %%one = arith.constant 1.0 : f32\n    %%n = arith.negf %s : f32\n"
               "    %%e = math.exp %%n : f32\n    %%d = arith.addf %%one, %%e : f32\n"
               "    %%r = arith.divf %%one, %%d : f32\n", x);
      break;
    case JIT__OP_RELU:
      jit__text_printf(b, "    %%z = arith.constant 0.0 : f32\n    %%r = arith.maximumf %s, %%z : f32\n", x);
      break;
    case JIT__OP_GELU:
      jit__text_printf(b,
               "    %%h = arith.constant 0.5 : f32\n    %%one = arith.constant 1.0 : f32\n"
               "    %%k = arith.constant 0.044715 : f32\n"
               "    %%s = arith.constant 0.7978845608028654 : f32\n"
               "    %%x2 = arith.mulf %s, %s : f32\n    %%x3 = arith.mulf %%x2, %s : f32\n"
               "    %%t0 = arith.mulf %%k, %%x3 : f32\n    %%t1 = arith.addf %s, %%t0 : f32\n"
               "    %%t2 = arith.mulf %%s, %%t1 : f32\n    %%t3 = math.tanh %%t2 : f32\n"
               "    %%t4 = arith.addf %%one, %%t3 : f32\n    %%t5 = arith.mulf %%h, %s : f32\n"
               "    %%r = arith.mulf %%t5, %%t4 : f32\n", x, x, x, x, x);
      break;
    case kBodyCopy: return x;
    case kBodyAccSum: jit__text_printf(b, "    %%r = arith.addf %%out, %s : f32\n", x); break;
    case kBodyAccMax: jit__text_printf(b, "    %%r = arith.maximumf %%out, %s : f32\n", x); break;
    case kBodyMac:
      jit__text_printf(b, "    %%p = arith.mulf %s, %s : f32\n    %%r = arith.addf %%out, %%p : f32\n", x, y);
      break;
    case kBodyExpSub:
      jit__text_printf(b, "    %%d = arith.subf %s, %s : f32\n    %%r = math.exp %%d : f32\n", x, y);
      break;
    case kBodyDivBy: jit__text_printf(b, "    %%r = arith.divf %s, %s : f32\n", x, by); break;
    default: return x;
  }
  return "%r";
}

static void jit__x_map(jit__text *b, int loops, const jit__xop *o) {
  jit__text_printf(b, "affine_map<(");
  for (int l = 0; l < loops; l++) jit__text_printf(b, "%sd%d", l ? ", " : "", l);
  jit__text_printf(b, ") -> (");
  for (int d = 0; d < o->rank; d++) {
    if (o->map[d] < 0) jit__text_printf(b, "%s0", d ? ", " : "");
    else jit__text_printf(b, "%sd%d", d ? ", " : "", o->map[d]);
  }
  jit__text_printf(b, ")>");
}

static void jit__x_generic(jit__exporter *e, const char *res, int loops, const char *iters,
                           const jit__xop *ins, int n_in, const jit__xop *out, int kind,
                           const char *by) {
  jit__text *b = &e->b;
  char ty[256];
  jit__text_printf(b, "  %s = linalg.generic {indexing_maps = [", res);
  for (int i = 0; i < n_in; i++) {
    jit__x_map(b, loops, &ins[i]);
    jit__text_printf(b, ", ");
  }
  jit__x_map(b, loops, out);
  jit__text_printf(b, "], iterator_types = [");
  for (int l = 0; l < loops; l++)
    jit__text_printf(b, "%s\"%s\"", l ? ", " : "", iters[l] == 'r' ? "reduction" : "parallel");
  jit__text_printf(b, "]} ins(");
  for (int i = 0; i < n_in; i++) jit__text_printf(b, "%s%s", i ? ", " : "", ins[i].name);
  jit__text_printf(b, " : ");
  for (int i = 0; i < n_in; i++) {
    jit__ttype(ty, sizeof ty, ins[i].dt, ins[i].rank, ins[i].dims);
    jit__text_printf(b, "%s%s", i ? ", " : "", ty);
  }
  jit__ttype(ty, sizeof ty, out->dt, out->rank, out->dims);
  jit__text_printf(b, ") outs(%s : %s) {\n  ^bb0(", out->name, ty);
  for (int i = 0; i < n_in; i++) jit__text_printf(b, "%%in%d: %s, ", i, jit__elt(ins[i].dt));
  jit__text_printf(b, "%%out: %s):\n", jit__elt(out->dt));
  const char *r;
  if (kind == kBodyCopy && n_in == 1 && ins[0].dt == out->dt) {
    r = "%in0";
  } else {
    char xs[2][8] = {"", ""};
    for (int i = 0; i < n_in && i < 2; i++) {
      if (ins[i].dt == JIT__F16) {
        jit__text_printf(b, "    %%x%d = arith.extf %%in%d : f16 to f32\n", i, i);
        snprintf(xs[i], sizeof xs[i], "%%x%d", i);
      } else {
        snprintf(xs[i], sizeof xs[i], "%%in%d", i);
      }
    }
    r = jit__x_body(b, kind, xs[0], xs[1], by);
    if (out->dt == JIT__F16) {
      jit__text_printf(b, "    %%y = arith.truncf %s : f32 to f16\n", r);
      r = "%y";
    }
  }
  jit__text_printf(b, "    linalg.yield %s : %s\n  } -> %s\n", r, jit__elt(out->dt), ty);
}

static jit__xop jit__x_operand(jit__exporter *e, uint32_t id) {
  const jit__node *n = jit__xn(e, id);
  jit__xop o = {e->x[id].name, n->dtype, n->rank, n->dims, {0}};
  for (int d = 0; d < n->rank; d++) o.map[d] = d;
  return o;
}

static jit_status jit__x_fail(jit__exporter *e, const char *what) {
  return JIT_ERR(JIT_UNSUPPORTED, "graph `%s`: writing node %u (%s) as MLIR: %s",
                 e->g->name, e->cur, jit__op_name(jit__xn(e, e->cur)->op), what);
}

// Result dim values of an op whose operands map onto its loops: each dynamic result
// dim `d` takes the value of an operand dim mapped to loop d.
static jit_status jit__x_dims_from(jit__exporter *e, const jit__xop *ops, const uint32_t *ids,
                                   int n_ops, int rank, const int64_t *dims, char (*dv)[40]) {
  for (int d = 0; d < rank; d++) {
    if (jit__static(dims[d])) continue;
    bool found = false;
    for (int i = 0; i < n_ops && !found; i++)
      for (int k = 0; k < ops[i].rank && !found; k++)
        if (ops[i].map[k] == d && !jit__static(ops[i].dims[k])) {
          snprintf(dv[d], 40, "%s", e->x[ids[i]].dv[k]);
          found = true;
        }
    if (!found) return jit__x_fail(e, "a dynamic dim has no source");
  }
  return NULL;
}

static jit_status jit__x_elementwise(jit__exporter *e, const jit__node *n) {
  jit__xop ins[2];
  for (int i = 0; i < n->n_operands; i++) {
    ins[i] = jit__x_operand(e, n->operands[i]);
    int off = n->rank - ins[i].rank;
    for (int d = 0; d < ins[i].rank; d++)
      ins[i].map[d] = (ins[i].dims[d] == 1 && n->dims[d + off] != 1) ? -1 : d + off;
  }
  jit__xnode *xn = &e->x[e->cur];
  JIT_PROPAGATE(jit__x_dims_from(e, ins, n->operands, n->n_operands, n->rank, n->dims, xn->dv));
  char empty[40];
  jit__tmp(e, empty);
  jit__x_empty(e, empty, n->dtype, n->rank, n->dims, xn->dv);
  jit__xop out = {empty, n->dtype, n->rank, n->dims, {0}};
  for (int d = 0; d < n->rank; d++) out.map[d] = d;
  char iters[JIT_MAX_RANK + 1];
  memset(iters, 'p', sizeof iters);
  jit__x_generic(e, xn->name, n->rank, iters, ins, n->n_operands, &out, n->op, NULL);
  return NULL;
}

// A copy/truncate of f32 `src` into `res` of dtype `dt`.
static void jit__x_to_dtype(jit__exporter *e, const char *res, const char *src, jit__dtype dt,
                            int rank, const int64_t *dims, char (*dv)[40], int kind,
                            const char *by) {
  char empty[40];
  jit__tmp(e, empty);
  jit__x_empty(e, empty, dt, rank, dims, dv);
  jit__xop in = {src, JIT__F32, rank, dims, {0}}, out = {empty, dt, rank, dims, {0}};
  for (int d = 0; d < rank; d++) in.map[d] = out.map[d] = d;
  char iters[JIT_MAX_RANK + 1];
  memset(iters, 'p', sizeof iters);
  jit__x_generic(e, res, rank, iters, &in, 1, &out, kind, by);
}

static jit_status jit__x_matmul(jit__exporter *e, const jit__node *n) {
  jit__xop a = jit__x_operand(e, n->operands[0]), b = jit__x_operand(e, n->operands[1]);
  int r = n->rank, nb = r - 2;
  jit__xnode *xn = &e->x[e->cur];
  // Loops: batch..., m, n, k.
  jit__xop *ops[2] = {&a, &b};
  for (int i = 0; i < 2; i++) {
    int ob = ops[i]->rank - 2, off = nb - ob;
    for (int d = 0; d < ob; d++)
      ops[i]->map[d] = (ops[i]->dims[d] == 1 && n->dims[d + off] != 1) ? -1 : d + off;
  }
  a.map[a.rank - 2] = nb, a.map[a.rank - 1] = nb + 2;
  b.map[b.rank - 2] = nb + 2, b.map[b.rank - 1] = nb + 1;
  jit__xop both[2] = {a, b};
  JIT_PROPAGATE(jit__x_dims_from(e, both, n->operands, 2, r, n->dims, xn->dv));
  char acc[40], mm[40], ty[256], ta[256], tb[256];
  jit__x_acc(e, acc, "0.0", r, n->dims, xn->dv);
  bool f16 = n->dtype == JIT__F16;
  if (f16) jit__tmp(e, mm);
  else snprintf(mm, sizeof mm, "%s", xn->name);
  jit__ttype(ty, sizeof ty, JIT__F32, r, n->dims);
  if (r == 2 && a.rank == 2 && b.rank == 2) {
    jit__ttype(ta, sizeof ta, a.dt, 2, a.dims);
    jit__ttype(tb, sizeof tb, b.dt, 2, b.dims);
    jit__text_printf(&e->b, "  %s = linalg.matmul ins(%s, %s : %s, %s) outs(%s : %s) -> %s\n", mm,
             a.name, b.name, ta, tb, acc, ty, ty);
  } else {
    jit__xop out = {acc, JIT__F32, r, n->dims, {0}};
    for (int d = 0; d < r; d++) out.map[d] = d;
    char iters[JIT_MAX_RANK + 2];
    memset(iters, 'p', sizeof iters);
    iters[nb + 2] = 'r';
    jit__x_generic(e, mm, r + 1, iters, both, 2, &out, kBodyMac, NULL);
  }
  if (f16) jit__x_to_dtype(e, xn->name, mm, JIT__F16, r, n->dims, xn->dv, kBodyCopy, NULL);
  return NULL;
}

// Reduces `x` (node id) over `axis` into a fresh f32 accumulator; `rd`/`rdv` get the
// reduced dims.
static void jit__x_reduce_f32(jit__exporter *e, char *res, const jit__xop *x,
                              char (*xdv)[40], int axis, int kind, const char *init,
                              int64_t *rd, char (*rdv)[40]) {
  for (int d = 0, j = 0; d < x->rank; d++)
    if (d != axis) {
      rd[j] = x->dims[d];
      snprintf(rdv[j++], 40, "%s", xdv[d]);
    }
  char acc[40];
  jit__x_acc(e, acc, init, x->rank - 1, rd, rdv);
  jit__xop out = {acc, JIT__F32, x->rank - 1, rd, {0}};
  for (int d = 0, j = 0; d < x->rank; d++)
    if (d != axis) out.map[j++] = d;
  char iters[JIT_MAX_RANK + 1];
  memset(iters, 'p', sizeof iters);
  iters[axis] = 'r';
  jit__tmp(e, res);
  jit__x_generic(e, res, x->rank, iters, x, 1, &out, kind, NULL);
}

static void jit__x_shape_list(jit__exporter *e, int rank, const int64_t *dims, char (*dv)[40]) {
  jit__text_printf(&e->b, "[");
  for (int d = 0; d < rank; d++) {
    if (jit__static(dims[d])) jit__text_printf(&e->b, "%s%lld", d ? ", " : "", (long long)dims[d]);
    else jit__text_printf(&e->b, "%s%s", d ? ", " : "", dv[d]);
  }
  jit__text_printf(&e->b, "]");
}

static jit_status jit__x_reduce(jit__exporter *e, const jit__node *n) {
  uint32_t src = n->operands[0];
  jit__xop x = jit__x_operand(e, src);
  int axis = n->axis, rr = x.rank - 1;
  jit__xnode *xn = &e->x[e->cur];
  int64_t rd[JIT_MAX_RANK];
  char rdv[JIT_MAX_RANK][40];
  char cur[40];
  bool is_max = n->op == JIT__OP_REDUCE_MAX, mean = n->op == JIT__OP_REDUCE_MEAN;
  jit__x_reduce_f32(e, cur, &x, e->x[src].dv, axis, is_max ? kBodyAccMax : kBodyAccSum,
                    is_max ? "0xFF800000" : "0.0", rd, rdv);
  char by[40] = "";
  if (mean) {
    jit__tmp(e, by);
    if (jit__static(x.dims[axis])) {
      jit__text_printf(&e->b, "  %s = arith.constant %lld.0 : f32\n", by, (long long)x.dims[axis]);
    } else {
      char i64[40];
      jit__tmp(e, i64);
      jit__text_printf(&e->b, "  %s = arith.index_cast %s : index to i64\n", i64, e->x[src].dv[axis]);
      jit__text_printf(&e->b, "  %s = arith.sitofp %s : i64 to f32\n", by, i64);
    }
  }
  char val[40];
  if (mean || n->dtype == JIT__F16) {
    jit__tmp(e, val);
    jit__x_to_dtype(e, val, cur, n->dtype, rr, rd, rdv, mean ? kBodyDivBy : kBodyCopy, by);
  } else {
    snprintf(val, sizeof val, "%s", cur);
  }
  if (!n->keepdims) {
    snprintf(xn->name, sizeof xn->name, "%s", val);
    for (int j = 0; j < rr; j++) snprintf(xn->dv[j], 40, "%.39s", rdv[j]);
    return NULL;
  }
  for (int j = 0; j < rr; j++) snprintf(xn->dv[j < axis ? j : j + 1], 40, "%.39s", rdv[j]);
  const char *res = val;
  char from[256], to[256];
  jit__ttype(from, sizeof from, n->dtype, rr, rd);
  jit__ttype(to, sizeof to, n->dtype, n->rank, n->dims);
  jit__text_printf(&e->b, "  %s = tensor.expand_shape %s [", xn->name, res);
  for (int j = 0; j < rr; j++) {
    int lo = j < axis ? j : j + 1, hi = lo;
    if (j == axis) lo = axis;
    if (j == rr - 1 && axis == rr) hi = rr;
    jit__text_printf(&e->b, "%s[", j ? ", " : "");
    for (int d = lo; d <= hi; d++) jit__text_printf(&e->b, "%s%d", d > lo ? ", " : "", d);
    jit__text_printf(&e->b, "]");
  }
  jit__text_printf(&e->b, "] output_shape ");
  jit__x_shape_list(e, n->rank, n->dims, xn->dv);
  jit__text_printf(&e->b, " : %s into %s\n", from, to);
  return NULL;
}

static jit_status jit__x_softmax(jit__exporter *e, const jit__node *n) {
  uint32_t src = n->operands[0];
  jit__xop x = jit__x_operand(e, src);
  int axis = n->axis, r = x.rank;
  jit__xnode *xn = &e->x[e->cur];
  memcpy(xn->dv, e->x[src].dv, sizeof xn->dv);
  int64_t rd[JIT_MAX_RANK];
  char rdv[JIT_MAX_RANK][40], mx[40], ex[40], exe[40], sum[40];
  jit__x_reduce_f32(e, mx, &x, e->x[src].dv, axis, kBodyAccMax, "0xFF800000", rd, rdv);
  jit__xop red = {mx, JIT__F32, r - 1, rd, {0}};
  for (int d = 0, j = 0; d < r; d++)
    if (d != axis) red.map[j++] = d;
  char iters[JIT_MAX_RANK + 1];
  memset(iters, 'p', sizeof iters);
  jit__tmp(e, exe);
  jit__tmp(e, ex);
  jit__x_empty(e, exe, JIT__F32, r, x.dims, xn->dv);
  jit__xop exo = {exe, JIT__F32, r, x.dims, {0}};
  for (int d = 0; d < r; d++) exo.map[d] = d;
  jit__xop ins[2] = {x, red};
  jit__x_generic(e, ex, r, iters, ins, 2, &exo, kBodyExpSub, NULL);
  jit__xop exi = {ex, JIT__F32, r, x.dims, {0}};
  for (int d = 0; d < r; d++) exi.map[d] = d;
  jit__x_reduce_f32(e, sum, &exi, xn->dv, axis, kBodyAccSum, "0.0", rd, rdv);
  red.name = sum;
  char empty[40];
  jit__tmp(e, empty);
  jit__x_empty(e, empty, n->dtype, r, n->dims, xn->dv);
  jit__xop out = {empty, n->dtype, r, n->dims, {0}};
  for (int d = 0; d < r; d++) out.map[d] = d;
  jit__xop ins2[2] = {exi, red};
  jit__x_generic(e, xn->name, r, iters, ins2, 2, &out, JIT__OP_DIV, NULL);
  return NULL;
}

static jit_status jit__x_transpose(jit__exporter *e, const jit__node *n) {
  uint32_t src = n->operands[0];
  jit__xop x = jit__x_operand(e, src);
  jit__xnode *xn = &e->x[e->cur];
  for (int i = 0; i < n->rank; i++) {
    x.map[n->perm[i]] = i;
    snprintf(xn->dv[i], 40, "%s", e->x[src].dv[n->perm[i]]);
  }
  char empty[40];
  jit__tmp(e, empty);
  jit__x_empty(e, empty, n->dtype, n->rank, n->dims, xn->dv);
  jit__xop out = {empty, n->dtype, n->rank, n->dims, {0}};
  for (int d = 0; d < n->rank; d++) out.map[d] = d;
  char iters[JIT_MAX_RANK + 1];
  memset(iters, 'p', sizeof iters);
  jit__x_generic(e, xn->name, n->rank, iters, &x, 1, &out, kBodyCopy, NULL);
  return NULL;
}

// The SSA value of symbol `code`: a dim of some input that carries it.
static const char *jit__x_symbol_value(jit__exporter *e, int64_t code) {
  for (uint32_t i = 0; i < e->g->n_inputs; i++) {
    const jit__node *in = jit__xn(e, e->g->inputs[i]);
    for (int d = 0; d < in->rank; d++)
      if (in->dims[d] == code) return e->x[e->g->inputs[i]].dv[d];
  }
  return NULL;
}

// A reshape from or to rank 0: one element, so every dim is 1 at run time. The value
// goes through the all-1s static type (tensor.cast where its type has `?` dims), an
// empty reassociation collapses or expands it, and a cast gives back `?` dims.
static jit_status jit__x_reshape_rank0(jit__exporter *e, const jit__node *n) {
  uint32_t src = n->operands[0];
  const jit__node *x = jit__xn(e, src);
  jit__xnode *xn = &e->x[e->cur];
  int64_t ones[JIT_MAX_RANK];
  for (int d = 0; d < JIT_MAX_RANK; d++) ones[d] = 1;
  char v[40], tx[256], t1[256], t0[256];
  snprintf(v, sizeof v, "%s", e->x[src].name);
  jit__ttype(t0, sizeof t0, x->dtype, 0, ones);
  if (x->rank > 0) {
    jit__ttype(tx, sizeof tx, x->dtype, x->rank, x->dims);
    jit__ttype(t1, sizeof t1, x->dtype, x->rank, ones);
    if (strcmp(tx, t1)) {
      char c[40];
      jit__tmp(e, c);
      jit__text_printf(&e->b, "  %s = tensor.cast %s : %s to %s\n", c, v, tx, t1);
      snprintf(v, sizeof v, "%s", c);
    }
    char c[40];
    jit__tmp(e, c);
    jit__text_printf(&e->b, "  %s = tensor.collapse_shape %s [] : %s into %s\n", c, v, t1, t0);
    snprintf(v, sizeof v, "%s", c);
  }
  if (n->rank == 0) {
    snprintf(xn->name, sizeof xn->name, "%s", v);
    return NULL;
  }
  char tn[256];
  jit__ttype(t1, sizeof t1, n->dtype, n->rank, ones);
  jit__ttype(tn, sizeof tn, n->dtype, n->rank, n->dims);
  bool cast = strcmp(t1, tn) != 0;
  char c[40];
  if (cast) jit__tmp(e, c);
  else snprintf(c, sizeof c, "%s", xn->name);
  jit__text_printf(&e->b, "  %s = tensor.expand_shape %s [] output_shape [", c, v);
  for (int d = 0; d < n->rank; d++) jit__text_printf(&e->b, "%s1", d ? ", " : "");
  jit__text_printf(&e->b, "] : %s into %s\n", t0, t1);
  if (cast) jit__text_printf(&e->b, "  %s = tensor.cast %s : %s to %s\n", xn->name, c, t1, tn);
  for (int d = 0; d < n->rank; d++)
    if (!jit__static(n->dims[d])) snprintf(xn->dv[d], 40, "%%c1");
  return NULL;
}

static jit_status jit__x_reshape(jit__exporter *e, const jit__node *n) {
  uint32_t src = n->operands[0];
  const jit__node *x = jit__xn(e, src);
  const jit__gnode *gn = &e->g->nodes[e->cur];
  jit__xnode *xn = &e->x[e->cur];
  if (x->rank == 0 || n->rank == 0) return jit__x_reshape_rank0(e, n);
  // Element count of x, as a value when dynamic.
  bool x_static = true;
  int64_t count = 1;
  for (int d = 0; d < x->rank; d++) {
    if (jit__static(x->dims[d])) count *= x->dims[d];
    else x_static = false;
  }
  char total[40] = "";
  if (!x_static) {
    jit__tmp(e, total);
    jit__text_printf(&e->b, "  %s = arith.constant %lld : index\n", total, (long long)count);
    for (int d = 0; d < x->rank; d++) {
      if (jit__static(x->dims[d])) continue;
      char t[40];
      jit__tmp(e, t);
      jit__text_printf(&e->b, "  %s = arith.muli %s, %s : index\n", t, total, e->x[src].dv[d]);
      snprintf(total, sizeof total, "%s", t);
    }
  }
  // Result dims: sizes, symbol values, and the inferred one.
  int infer = -1;
  int64_t known = 1;
  char prod[40] = "";
  for (int d = 0; d < n->rank; d++) {
    int64_t q = gn->req[d];
    if (q >= 0) {
      known *= q;
    } else if (q == -1) {
      infer = d;
    } else {
      const char *v = jit__x_symbol_value(e, q);
      if (!v) return jit__x_fail(e, "a symbol of the new shape is no input dim");
      snprintf(xn->dv[d], 40, "%s", v);
      if (!prod[0]) {
        snprintf(prod, sizeof prod, "%s", v);
      } else {
        char t[40];
        jit__tmp(e, t);
        jit__text_printf(&e->b, "  %s = arith.muli %s, %s : index\n", t, prod, v);
        snprintf(prod, sizeof prod, "%s", t);
      }
    }
  }
  if (infer >= 0 && !jit__static(n->dims[infer])) {
    char k[40], t[40], q[40];
    jit__tmp(e, k);
    jit__text_printf(&e->b, "  %s = arith.constant %lld : index\n", k, (long long)known);
    if (prod[0]) {
      jit__tmp(e, t);
      jit__text_printf(&e->b, "  %s = arith.muli %s, %s : index\n", t, k, prod);
    } else {
      snprintf(t, sizeof t, "%s", k);
    }
    const char *tot = total;
    char tc[40];
    if (x_static) {
      jit__tmp(e, tc);
      jit__text_printf(&e->b, "  %s = arith.constant %lld : index\n", tc, (long long)count);
      tot = tc;
    }
    jit__tmp(e, q);
    jit__text_printf(&e->b, "  %s = arith.divui %s, %s : index\n", q, tot, t);
    snprintf(xn->dv[infer], 40, "%s", q);
  }
  bool n_static = true;
  for (int d = 0; d < n->rank; d++) n_static = n_static && jit__static(n->dims[d]);
  // x -> 1-D (static iff the result is all static) -> result.
  char flat[40], tx[256], tf[256], tn[256];
  int64_t fd = n_static ? count : -2;
  jit__ttype(tx, sizeof tx, x->dtype, x->rank, x->dims);
  if (n_static && !x_static) {
    int64_t nc = 1;
    for (int d = 0; d < n->rank; d++) nc *= n->dims[d];
    fd = nc;
  }
  int64_t xfd = x_static ? count : -2;
  jit__ttype(tf, sizeof tf, x->dtype, 1, &xfd);
  if (x->rank > 1) {
    jit__tmp(e, flat);
    jit__text_printf(&e->b, "  %s = tensor.collapse_shape %s [[", flat, e->x[src].name);
    for (int d = 0; d < x->rank; d++) jit__text_printf(&e->b, "%s%d", d ? ", " : "", d);
    jit__text_printf(&e->b, "]] : %s into %s\n", tx, tf);
  } else {
    snprintf(flat, sizeof flat, "%s", e->x[src].name);
  }
  if (fd != xfd) {
    char c[40], tc[256];
    jit__tmp(e, c);
    jit__ttype(tc, sizeof tc, x->dtype, 1, &fd);
    jit__text_printf(&e->b, "  %s = tensor.cast %s : %s to %s\n", c, flat, tf, tc);
    snprintf(flat, sizeof flat, "%s", c);
    snprintf(tf, sizeof tf, "%s", tc);
  }
  jit__ttype(tn, sizeof tn, n->dtype, n->rank, n->dims);
  if (n->rank == 1) {
    if (strcmp(tf, tn)) {
      jit__text_printf(&e->b, "  %s = tensor.cast %s : %s to %s\n", xn->name, flat, tf, tn);
    } else {
      snprintf(xn->name, sizeof xn->name, "%s", flat);
    }
    if (!jit__static(n->dims[0]) && !xn->dv[0][0]) {
      jit__text_printf(&e->b, "  %s_d0 = tensor.dim %s, %%c0 : %s\n", xn->name, xn->name, tn);
      snprintf(xn->dv[0], 40, "%.36s_d0", xn->name);
    }
    return NULL;
  }
  for (int d = 0; d < n->rank; d++)
    if (!jit__static(n->dims[d]) && !xn->dv[d][0])
      return jit__x_fail(e, "a dim of the new shape has no value");
  jit__text_printf(&e->b, "  %s = tensor.expand_shape %s [[", xn->name, flat);
  for (int d = 0; d < n->rank; d++) jit__text_printf(&e->b, "%s%d", d ? ", " : "", d);
  jit__text_printf(&e->b, "]] output_shape ");
  jit__x_shape_list(e, n->rank, n->dims, xn->dv);
  jit__text_printf(&e->b, " : %s into %s\n", tf, tn);
  return NULL;
}

static void jit__x_float(char *out, size_t size, double v, jit__dtype dt) {
  if (dt == JIT__F32) v = (double)(float)v;
  if (isnan(v)) { snprintf(out, size, "%s", dt == JIT__F16 ? "0x7E00" : "0x7FC00000"); return; }
  if (isinf(v)) {
    snprintf(out, size, "%s", v > 0 ? (dt == JIT__F16 ? "0x7C00" : "0x7F800000")
                                    : (dt == JIT__F16 ? "0xFC00" : "0xFF800000"));
    return;
  }
  char d[64];
  snprintf(d, sizeof d, "%.17g", v);
  char *ex = strchr(d, 'e');
  if (strchr(d, '.')) snprintf(out, size, "%s", d);
  else if (ex) snprintf(out, size, "%.*s.0%s", (int)(ex - d), d, ex);
  else snprintf(out, size, "%.60s.0", d);
}

static jit_status jit__x_node(jit__exporter *e, const jit__node *n) {
  switch (n->op) {
    case JIT__OP_INPUT: return NULL;  // named with the arguments
    case JIT__OP_SCALAR: {
      char lit[64];
      jit__x_float(lit, sizeof lit, n->scalar, n->dtype);
      jit__text_printf(&e->b, "  %s = arith.constant dense<%s> : tensor<%s>\n", e->x[e->cur].name,
               lit, jit__elt(n->dtype));
      return NULL;
    }
    case JIT__OP_MATMUL: return jit__x_matmul(e, n);
    case JIT__OP_REDUCE_SUM: case JIT__OP_REDUCE_MAX: case JIT__OP_REDUCE_MEAN:
      return jit__x_reduce(e, n);
    case JIT__OP_SOFTMAX: return jit__x_softmax(e, n);
    case JIT__OP_TRANSPOSE: return jit__x_transpose(e, n);
    case JIT__OP_RESHAPE: return jit__x_reshape(e, n);
    default:
      if (n->op >= JIT__OP_ADD && n->op <= JIT__OP_RSQRT) return jit__x_elementwise(e, n);
      return jit__x_fail(e, "op not supported");
  }
}

// An SSA/symbol-safe copy of `s`: letters, digits, '_' (a leading digit gets a '_').
static void jit__x_ident(char *out, size_t size, const char *s) {
  size_t n = 0;
  if (isdigit((unsigned char)s[0]) && n + 1 < size) out[n++] = '_';
  for (; *s && n + 1 < size; s++) out[n++] = isalnum((unsigned char)*s) ? *s : '_';
  out[n] = 0;
  if (!n) snprintf(out, size, "_");
}

//===--- The node graph behind an export ----------------------------------===//
//
// jit_graph_to_mlir writes, as the entry's `jit.graph` attribute, the node graph the
// text was made from: "jitml-graph-1 <fingerprint>;" then one record per symbol,
// node and output, every name hex-encoded so that the string needs no escapes:
//   s <name>                                   a symbol, in creation order
//   n <op> <dtype> <operand0> <operand1> <rank> <axis> <keepdims> <scalar bits>
//     <dims...> [<reshape's asked dims...>] [<transpose's perm...>] [<input name>]
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
    if (n->op == JIT__OP_INPUT) jit__hexname(b, gn->name ? gn->name : "");
  }
  for (uint32_t j = 0; j < g->n_outputs; j++) jit__text_printf(b, ";o %u", g->outputs[j]);
}

jit_status jit__mlir_export(const jit_graph *g, char **out_text) {
  jit__exporter e = {{0}, g, calloc(g->n_nodes + 1, sizeof(jit__xnode)), 0, 0};
  if (!e.x) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
  for (uint32_t i = 0; i < g->n_nodes; i++) snprintf(e.x[i].name, 40, "%%v%u", i);
  char fname[128];
  jit__x_ident(fname, sizeof fname, g->name);
  jit__text_printf(&e.b, "func.func @%s(", fname);
  for (uint32_t k = 0; k < g->n_inputs; k++) {
    uint32_t id = g->inputs[k];
    const jit__node *n = jit__xn(&e, id);
    char ident[40], ty[256];
    jit__x_ident(ident, 30, g->nodes[id].name ? g->nodes[id].name : "in");
    bool dup = false;
    for (uint32_t j = 0; j < k; j++) dup |= !strcmp(e.x[g->inputs[j]].name + 1, ident);
    if (dup) snprintf(ident, sizeof ident, "in%u", k);
    snprintf(e.x[id].name, 40, "%%%.38s", ident);
    jit__ttype(ty, sizeof ty, n->dtype, n->rank, n->dims);
    jit__text_printf(&e.b, "%s\n    %s: %s {jit.dims = [", k ? "," : "", e.x[id].name, ty);
    for (int d = 0; d < n->rank; d++) {
      if (jit__static(n->dims[d])) jit__text_printf(&e.b, "%s%lld", d ? ", " : "", (long long)n->dims[d]);
      else jit__text_printf(&e.b, "%s\"%s\"", d ? ", " : "", jit_symbol_name(g, n->dims[d]));
    }
    jit__text_printf(&e.b, "]}");
  }
  jit__text_printf(&e.b, ") -> (");
  for (uint32_t j = 0; j < g->n_outputs; j++) {
    const jit__node *n = jit__xn(&e, g->outputs[j]);
    char ty[256];
    jit__ttype(ty, sizeof ty, n->dtype, n->rank, n->dims);
    jit__text_printf(&e.b, "%s%s", j ? ", " : "", ty);
  }
  jit__text_printf(&e.b, ") attributes {jit.graph = \"");
  jit__graph_record(g, &e.b);
  jit__text_printf(&e.b, "\"} {\n");
  for (int d = 0; d < JIT_MAX_RANK; d++) jit__text_printf(&e.b, "  %%c%d = arith.constant %d : index\n", d, d);
  for (uint32_t k = 0; k < g->n_inputs; k++) {
    uint32_t id = g->inputs[k];
    const jit__node *n = jit__xn(&e, id);
    char ty[256];
    jit__ttype(ty, sizeof ty, n->dtype, n->rank, n->dims);
    for (int d = 0; d < n->rank; d++) {
      if (jit__static(n->dims[d])) continue;
      snprintf(e.x[id].dv[d], 40, "%%in%u_d%d", k, d);
      jit__text_printf(&e.b, "  %s = tensor.dim %s, %%c%d : %s\n", e.x[id].dv[d], e.x[id].name, d, ty);
    }
  }
  jit_status s = NULL;
  for (uint32_t i = 0; i < g->n_nodes && !s; i++) {
    e.cur = i;
    e.tmp = 0;
    s = jit__x_node(&e, jit__xn(&e, i));
  }
  if (!s) {
    jit__text_printf(&e.b, "  return ");
    for (uint32_t j = 0; j < g->n_outputs; j++)
      jit__text_printf(&e.b, "%s%s", j ? ", " : "", e.x[g->outputs[j]].name);
    jit__text_printf(&e.b, " : ");
    for (uint32_t j = 0; j < g->n_outputs; j++) {
      const jit__node *n = jit__xn(&e, g->outputs[j]);
      char ty[256];
      jit__ttype(ty, sizeof ty, n->dtype, n->rank, n->dims);
      jit__text_printf(&e.b, "%s%s", j ? ", " : "", ty);
    }
    jit__text_printf(&e.b, "\n}\n");
    if (e.b.oom) s = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
  }
  free(e.x);
  if (s) {
    free(e.b.p);
    return s;
  }
  *out_text = e.b.p;
  return NULL;
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

jit__dtype jit__mlir_graph_result_dtype(const jit_graph *g, uint32_t index) {
  return g->mlir->m.result_dtypes[index];
}
