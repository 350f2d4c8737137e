//===--- cache_api.c - the public face of the disk cache -------------------===//
//
// Listing, maintenance, bundles, and jit_cache_explain: why a binding misses.
//
//===----------------------------------------------------------------------===//
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/hex.h"
#include "jit/internal.h"

static const char *jit__kind_name(jit__payload_kind k) {
  switch (k) {
    case JIT__PAYLOAD_CPU_OBJECT: return "cpu-object";
    case JIT__PAYLOAD_PTX: return "ptx";
    case JIT__PAYLOAD_CUBIN: return "cubin";
    case JIT__PAYLOAD_SPIRV: return "spirv";
    case JIT__PAYLOAD_VK_PIPELINE_CACHE: return "vk-pipeline-cache";
    case JIT__PAYLOAD_HOT_LIST: return "hot-list";
  }
  return "unknown";
}

const char *jit_cache_dir(jit_context *ctx, const char **out_reason) {
  if (out_reason) *out_reason = NULL;
  if (!ctx) return "";
  if (out_reason) *out_reason = jit__cache_disabled_reason(ctx->cache);
  return jit__cache_dir(ctx->cache);
}

typedef struct jit__list_ctx {
  jit_cache_visit_fn fn;
  void *user;
} jit__list_ctx;

static bool jit__list_visit(void *user, const jit__cache_entry *e, const char *path,
                            uint64_t size, int64_t atime) {
  jit__list_ctx *l = user;
  char hex[33];
  jit__hex_encode(e->key, 16, hex);
  jit_cache_entry_info info = {hex, jit__kind_name(e->kind),
                               e->components ? e->components : "", size, atime};
  return l->fn(l->user, &info) != 0;
}

jit_status jit_cache_list(jit_context *ctx, jit_cache_visit_fn fn, void *user_data) {
  if (!ctx || !fn)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_cache_list: %s is NULL", ctx ? "fn" : "ctx");
  jit__list_ctx l = {fn, user_data};
  return jit__cache_list(ctx->cache, jit__list_visit, &l);
}

#define JIT__CHECK_CTX(name) \
  if (!ctx) return JIT_ERR(JIT_INVALID_ARGUMENT, name ": ctx is NULL")

jit_status jit_cache_verify(jit_context *ctx, uint64_t *out_checked, uint64_t *out_bad) {
  JIT__CHECK_CTX("jit_cache_verify");
  uint64_t c = 0, b = 0;
  jit_status s = jit__cache_verify(ctx->cache, &c, &b);
  if (out_checked) *out_checked = c;
  if (out_bad) *out_bad = b;
  return s;
}

jit_status jit_cache_prune(jit_context *ctx, uint64_t *out_evicted) {
  JIT__CHECK_CTX("jit_cache_prune");
  uint64_t n = 0;
  jit_status s = jit__cache_prune(ctx->cache, &n);
  if (out_evicted) *out_evicted = n;
  return s;
}

jit_status jit_cache_clear(jit_context *ctx, uint64_t *out_removed) {
  JIT__CHECK_CTX("jit_cache_clear");
  uint64_t n = 0;
  jit_status s = jit__cache_clear(ctx->cache, &n);
  if (out_removed) *out_removed = n;
  return s;
}

jit_status jit_cache_export(jit_context *ctx, const char *path, uint64_t *out_count) {
  JIT__CHECK_CTX("jit_cache_export");
  if (!path) return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_cache_export: path is NULL");
  uint64_t n = 0;
  jit_status s = jit__cache_export(ctx->cache, path, NULL, &n);
  if (out_count) *out_count = n;
  return s;
}

jit_status jit_cache_export_signed(jit_context *ctx, const char *path,
                                   const char *secret_key_path, uint64_t *out_count) {
  if (out_count) *out_count = 0;
  JIT__CHECK_CTX("jit_cache_export_signed");
  if (!path || !secret_key_path)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_cache_export_signed: %s is NULL",
                   path ? "secret_key_path" : "path");
  uint8_t secret[JIT__SIGN_SECRET_BYTES];
  JIT_PROPAGATE(jit__sign_read_secret(secret_key_path, secret));
  uint64_t n = 0;
  jit_status s = jit__cache_export(ctx->cache, path, secret, &n);
  jit__sign_wipe(secret, sizeof secret);
  if (out_count) *out_count = n;
  return s;
}

jit_status jit_bundle_keygen(const char *secret_key_path, char out_public_key[65]) {
  if (!out_public_key)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_bundle_keygen: out_public_key is NULL");
  return jit__sign_keygen(secret_key_path, out_public_key);
}

jit_status jit_cache_import(jit_context *ctx, const char *path, uint64_t *out_count) {
  JIT__CHECK_CTX("jit_cache_import");
  if (!path) return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_cache_import: path is NULL");
  uint64_t n = 0;
  jit_status s = jit__cache_import(ctx->cache, path, &n);
  if (out_count) *out_count = n;
  return s;
}

//===--- Fleet cache -------------------------------------------------------===//

const char *jit_cache_remote(jit_context *ctx, const char **out_state) {
  static _Thread_local char state[512];
  const char *url = NULL;
  if (ctx) url = jit__cache_remote(ctx->cache, state, sizeof state);
  else snprintf(state, sizeof state, "off: no context");
  if (out_state) *out_state = state;
  return url;
}

// jit_cache_push and jit_cache_pull: the counts go out whatever happened.
typedef jit_status (*jit__transfer_fn)(jit__cache *, jit__cache_progress_fn, void *,
                                       uint64_t *, uint64_t *);

static jit_status jit__transfer(jit_context *ctx, const char *name, jit__transfer_fn fn,
                                jit_cache_progress_fn progress, void *user_data,
                                uint64_t *out_a, uint64_t *out_b) {
  if (!ctx) return JIT_ERR(JIT_INVALID_ARGUMENT, "%s: ctx is NULL", name);
  uint64_t a = 0, b = 0;
  jit_status s = fn(ctx->cache, progress, user_data, &a, &b);
  if (out_a) *out_a = a;
  if (out_b) *out_b = b;
  return s;
}

jit_status jit_cache_push(jit_context *ctx, jit_cache_progress_fn progress, void *user_data,
                          uint64_t *out_pushed, uint64_t *out_present) {
  return jit__transfer(ctx, "jit_cache_push", jit__cache_push_all, progress, user_data,
                       out_pushed, out_present);
}

jit_status jit_cache_pull(jit_context *ctx, jit_cache_progress_fn progress, void *user_data,
                          uint64_t *out_pulled, uint64_t *out_rejected) {
  return jit__transfer(ctx, "jit_cache_pull", jit__cache_pull_all, progress, user_data,
                       out_pulled, out_rejected);
}

//===--- Explain ---------------------------------------------------------===//


// The value of line "name=" in a components text, copied into buf ("" if absent).
static const char *jit__component(const char *text, const char *name, char *buf,
                                  size_t size) {
  size_t n = strlen(name);
  buf[0] = 0;
  for (const char *p = text; p && *p;) {
    const char *eol = strchr(p, '\n');
    size_t len = eol ? (size_t)(eol - p) : strlen(p);
    if (len > n && p[n] == '=' && memcmp(p, name, n) == 0) {
      size_t v = len - n - 1 < size - 1 ? len - n - 1 : size - 1;
      memcpy(buf, p + n + 1, v);
      buf[v] = 0;
      break;
    }
    p = eol ? eol + 1 : NULL;
  }
  return buf;
}

// Parses "name f32 [7, 784]" into dims; returns the rank or -1.
static int jit__parse_dims(const char *v, int64_t *dims) {
  const char *b = strchr(v, '[');
  if (!b) return -1;
  int r = 0;
  for (const char *p = b + 1; *p && *p != ']' && r < JIT_MAX_RANK;) {
    char *end;
    long long d = strtoll(p, &end, 10);
    if (end == p) break;
    dims[r++] = d;
    p = end;
    while (*p == ',' || *p == ' ') p++;
  }
  return r;
}

typedef struct jit__explain {
  const jit_graph *g;
  const char *want;       // components of the asked binding
  char graph_fp[64];
  uint64_t same_graph, other_graphs;
  bool exact;
  jit__text diffs;        // target/compiler lines that differ
  // Per input dim, the sizes seen in entries of this graph (up to 8 distinct).
  int64_t seen[64][JIT_MAX_RANK][8];
  int n_seen[64][JIT_MAX_RANK];
  char want_key[33];
} jit__explain;

static const char *const kSharedComponents[] = {
    "format", "backend", "target.triple", "target.cpu", "target.features",
    "target.l2", "target.l3", "compiler", "build_id", "opt_level"};

static bool jit__explain_visit(void *user, const jit__cache_entry *e, const char *path,
                               uint64_t size, int64_t atime) {
  jit__explain *x = user;
  char hex[33];
  jit__hex_encode(e->key, 16, hex);
  if (strcmp(hex, x->want_key) == 0) x->exact = true;
  char fp[64];
  jit__component(e->components ? e->components : "", "graph", fp, sizeof fp);
  if (strcmp(fp, x->graph_fp) != 0) {
    x->other_graphs++;
    return true;
  }
  x->same_graph++;
  for (size_t i = 0; i < sizeof(kSharedComponents) / sizeof(kSharedComponents[0]); i++) {
    char a[4096], b[4096];
    jit__component(x->want, kSharedComponents[i], a, sizeof a);
    jit__component(e->components, kSharedComponents[i], b, sizeof b);
    if (strcmp(a, b) != 0 && !(x->diffs.p && strstr(x->diffs.p, kSharedComponents[i])))
      jit__text_printf(&x->diffs, "%s differs: `%.200s` vs cached `%.200s`\n",
                    kSharedComponents[i], a, b);
  }
  for (uint32_t i = 0; i < x->g->n_inputs && i < 64; i++) {
    char name[16], v[512];
    snprintf(name, sizeof name, "input.%u", i);
    int64_t dims[JIT_MAX_RANK];
    int r = jit__parse_dims(jit__component(e->components, name, v, sizeof v), dims);
    for (int d = 0; d < r; d++) {
      bool dup = false;
      for (int k = 0; k < x->n_seen[i][d]; k++) dup |= x->seen[i][d][k] == dims[d];
      if (!dup && x->n_seen[i][d] < 8) x->seen[i][d][x->n_seen[i][d]++] = dims[d];
    }
  }
  return true;
}

static int jit__cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

jit_status jit_cache_explain(jit_graph *g, const DLTensor *inputs, int n_inputs,
                             char **out_text) {
  if (out_text) *out_text = NULL;
  if (!g || !out_text)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_cache_explain: %s is NULL",
                   g ? "out_text" : "graph");
  jit_device *d = g->ctx->offload ? g->ctx->offload : g->ctx->devices[0];
  if (n_inputs > 0 && inputs && inputs[0].device.device_type != kDLCPU)
    JIT_PROPAGATE(jit__device_of(g->ctx, inputs[0].device, &d));
  uint8_t key[16];
  JIT_PROPAGATE(jit__inputs_key(g, inputs, n_inputs, false, d, key));
  jit__explain *x = calloc(1, sizeof(*x));
  char *want = jit__key_components(g, d, inputs);
  if (!x || !want) {
    free(x);
    free(want);
    return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "jit_cache_explain: out of memory");
  }
  x->g = g;
  x->want = want;
  jit__hex_encode(key, 16, x->want_key);
  jit__component(want, "graph", x->graph_fp, sizeof x->graph_fp);
  jit_context *ctx = g->ctx;
  jit__text out = {0};
  jit__explain_policy(g, d, key, &out);
  const char *reason = NULL;
  const char *dir = jit_cache_dir(ctx, &reason);
  jit_status s = NULL;
  if (!dir[0]) {
    jit__text_printf(&out, "disk cache is off: %s\n", reason ? reason : "disabled");
  } else {
    s = jit__cache_list(ctx->cache, jit__explain_visit, x);
    jit__text_printf(&out, "key %s in %s: %s\n", x->want_key, dir,
                  x->exact ? "hit (a cached kernel exists for these shapes)" : "miss");
    if (!x->exact) {
      if (!x->same_graph)
        jit__text_printf(&out,
                      "no cached kernels for graph `%s` (%s); %llu entries of other "
                      "graphs\n",
                      g->name, x->graph_fp, (unsigned long long)x->other_graphs);
      else
        jit__text_printf(&out, "%llu cached kernels for graph `%s`\n",
                      (unsigned long long)x->same_graph, g->name);
      if (x->diffs.p) jit__text_printf(&out, "%s", x->diffs.p);
      for (uint32_t i = 0; x->same_graph && i < g->n_inputs && i < 64; i++) {
        for (int d = 0; d < inputs[i].ndim; d++) {
          bool seen = false;
          for (int k = 0; k < x->n_seen[i][d]; k++) seen |= x->seen[i][d][k] == inputs[i].shape[d];
          if (seen || !x->n_seen[i][d]) continue;
          qsort(x->seen[i][d], (size_t)x->n_seen[i][d], sizeof(int64_t), jit__cmp_i64);
          jit__text_printf(&out, "shape of input %u `%s` dim %d: %lld vs cached", i,
                        g->nodes[g->inputs[i]].name, d, (long long)inputs[i].shape[d]);
          for (int k = 0; k < x->n_seen[i][d]; k++)
            jit__text_printf(&out, "%s %lld", k ? "," : "", (long long)x->seen[i][d][k]);
          jit__text_printf(&out, "\n");
        }
      }
    }
  }
  free(x->diffs.p);
  free(x);
  free(want);
  if (s || out.oom) {
    free(out.p);
    return s ? s : JIT_ERR(JIT_RESOURCE_EXHAUSTED, "jit_cache_explain: out of memory");
  }
  *out_text = out.p;
  return NULL;
}
