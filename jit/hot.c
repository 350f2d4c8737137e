//===--- hot.c - hot bindings, remembered in the cache directory -------------===//
//
// Under AUTO a binding that keeps running on its graph's generic kernel gets a kernel
// of its own in the background (specialize.c). Which bindings those were outlives the
// process: the disk cache holds one entry per graph (kind "hot-list", keyed by the
// graph's generic key) listing them, each with the number of processes in which it
// became hot. A process queues the list on its specializer when the graph's first
// binding arrives, after the generic kernel and most often hot first, so those
// bindings have their own kernels (from disk, or compiled) before calls ask for them;
// jit_graph_prewarm_hot (`jitml prewarm --hot`) does the same on the calling thread.
// Bundles carry the list with the kernels.
//
// The entry is text: a header line, then one line per binding, "COUNT D0 D1 ..."
// with the binding's input dims in input order. It is read, updated and rewritten
// under the cache's per-key lock (a writer that cannot get the lock in time skips its
// update: the list is a hint). A list that does not describe the graph is ignored,
// logged, and replaced at the next update.
//
//===----------------------------------------------------------------------===//
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "base/hex.h"
#include "base/text.h"
#include "cache/cache.h"
#include "jit/internal.h"

enum { kMaxRows = 256, kLockTimeoutMs = 1000 };

static const char kHeader[] = "jitml hot bindings 1";

// Rows of n_dims sizes each, most often hot first.
typedef struct jit__hot_list {
  uint32_t n_dims;
  size_t n;
  uint64_t count[kMaxRows];
  int64_t *dims;  // kMaxRows x n_dims
} jit__hot_list;

static uint32_t jit__hot_dims(const jit_graph *g) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < g->n_inputs; i++) n += (uint32_t)g->nodes[g->inputs[i]].n.rank;
  return n;
}

static bool jit__hot_init(const jit_graph *g, jit__hot_list *l) {
  memset(l, 0, sizeof(*l));
  l->n_dims = jit__hot_dims(g);
  l->dims = malloc(sizeof(int64_t) * kMaxRows * (l->n_dims + 1));
  return l->dims != NULL;
}

// The list's key: the generic key of the graph on the CPU, tagged.
static jit_status jit__hot_key(const jit_graph *g, uint8_t key[16], uint8_t generic[16]) {
  JIT_PROPAGATE(jit__generic_key(g, g->ctx->devices[0], generic));
  uint8_t rec[32];
  memcpy(rec, "jitml hot list\0\0", 16);
  memcpy(rec + 16, generic, 16);
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits(rec, sizeof rec));
  memcpy(key, c.digest, 16);
  return NULL;
}

// A row fits the graph: its static dims are the declared ones, its symbols sizes in
// [1, 2^40]. (That one symbol gets one size is checked when the binding is bound.)
static bool jit__hot_row_fits(const jit_graph *g, const int64_t *dims) {
  for (uint32_t i = 0; i < g->n_inputs; i++) {
    const jit__node *decl = &g->nodes[g->inputs[i]].n;
    for (int d = 0; d < decl->rank; d++, dims++) {
      if (decl->dims[d] >= 0 ? *dims != decl->dims[d]
                             : *dims < 1 || *dims > ((int64_t)1 << 40))
        return false;
    }
  }
  return true;
}

static bool jit__hot_parse(const jit_graph *g, const char *text, size_t len,
                           jit__hot_list *l) {
  size_t hl = sizeof kHeader - 1;
  if (len < hl + 1 || memcmp(text, kHeader, hl) != 0 || text[hl] != '\n') return false;
  const char *p = text + hl + 1, *end = text + len;
  while (p < end && l->n < kMaxRows) {
    const char *eol = memchr(p, '\n', (size_t)(end - p));
    if (!eol) return false;
    char line[1024];
    size_t n = (size_t)(eol - p);
    if (n >= sizeof line) return false;
    memcpy(line, p, n);
    line[n] = 0;
    p = eol + 1;
    char *q = line, *next = NULL;
    unsigned long long count = strtoull(q, &next, 10);
    if (next == q || count == 0) return false;
    int64_t *row = l->dims + l->n * l->n_dims;
    for (uint32_t k = 0; k < l->n_dims; k++) {
      q = next;
      long long v = strtoll(q, &next, 10);
      if (next == q) return false;
      row[k] = v;
    }
    if (*next != 0 || !jit__hot_row_fits(g, row)) return false;
    l->count[l->n++] = count;
  }
  return true;
}

// Reads the list of `g` (an empty list when there is none or it is unusable).
static void jit__hot_read(jit_graph *g, const uint8_t key[16], jit__hot_list *l) {
  jit_context *ctx = g->ctx;
  jit__cache_entry e;
  bool found = false;
  jit_status s = jit__cache_get(ctx->cache, key, &e, &found);
  if (s) {
    jit_status_free(s);
    return;
  }
  if (!found) return;
  bool ok = e.kind == JIT__PAYLOAD_HOT_LIST && jit__hot_parse(g, e.payload, e.payload_size, l);
  if (!ok) {
    l->n = 0;
    jit__log(ctx, JIT_LOG_WARNING, "graph `%s`: the disk cache's list of hot bindings does "
             "not describe this graph; ignored (rewritten at the next update)", g->name);
  }
  jit__cache_entry_release(&e);
}

static void jit__hot_write(jit_graph *g, const uint8_t key[16], const uint8_t generic[16],
                           const jit__hot_list *l) {
  jit_context *ctx = g->ctx;
  jit__text body = {0}, comp = {0};
  jit__text_printf(&body, "%s\n", kHeader);
  for (size_t r = 0; r < l->n; r++) {
    jit__text_printf(&body, "%" PRIu64, l->count[r]);
    for (uint32_t k = 0; k < l->n_dims; k++)
      jit__text_printf(&body, " %" PRId64, l->dims[r * l->n_dims + k]);
    jit__text_printf(&body, "\n");
  }
  char gh[33], fp[33];
  jit__hex_encode(generic, 16, gh);
  jit__hex_encode(g->fingerprint, 16, fp);
  jit__text_printf(&comp, "format=%d\nhot_bindings_of=%s\ngraph=%s\ngraph_name=%s\n",
                   JIT__CACHE_FORMAT_VERSION, gh, fp, g->name);
  if (!body.oom && !comp.oom) {
    jit__cache_entry e = {.kind = JIT__PAYLOAD_HOT_LIST, .payload = body.p,
                          .payload_size = body.len, .components = comp.p};
    memcpy(e.key, key, 16);
    jit__disk_put(ctx, &e);
  }
  free(body.p);
  free(comp.p);
}

// One more process found binding `dims` hot: its row moves up (or comes in, the
// least hot leaving a full list) ahead of the rows as hot or less, so the list stays
// most often hot first, then most recent first.
static void jit__hot_bump(jit__hot_list *l, const int64_t *dims) {
  size_t bytes = sizeof(int64_t) * l->n_dims, r = 0, at = 0;
  uint64_t count = 1;
  while (r < l->n && memcmp(l->dims + r * l->n_dims, dims, bytes) != 0) r++;
  if (r < l->n) count = l->count[r] + 1;
  else if (l->n == kMaxRows) r = l->n - 1;
  else l->n++;
  while (at < r && l->count[at] > count) at++;
  memmove(l->dims + (at + 1) * l->n_dims, l->dims + at * l->n_dims, (r - at) * bytes);
  memmove(l->count + at + 1, l->count + at, (r - at) * sizeof(uint64_t));
  memcpy(l->dims + at * l->n_dims, dims, bytes);
  l->count[at] = count;
}

void jit__hot_note(jit_graph *g, const int64_t *const *rows, size_t n) {
  jit_context *ctx = g->ctx;
  if (n == 0 || !jit__cache_enabled(ctx->cache) || jit__cache_read_only(ctx->cache)) return;
  uint8_t key[16], generic[16];
  jit__hot_list l;
  jit_status s = jit__hot_key(g, key, generic);
  if (s || !jit__hot_init(g, &l)) {
    jit_status_free(s);
    return;
  }
  jit__cache_lock lock;
  bool locked = false;
  jit__cache_lock_key(ctx->cache, key, kLockTimeoutMs, &lock, &locked);
  if (locked) {
    jit__hot_read(g, key, &l);
    for (size_t i = 0; i < n; i++) jit__hot_bump(&l, rows[i]);
    jit__hot_write(g, key, generic, &l);
    jit__cache_unlock(&lock);
  }
  free(l.dims);
}

// Calls `fn` for up to `max` bindings of the graph's list, hottest first.
static void jit__hot_each(jit_graph *g, size_t max,
                          void (*fn)(jit_graph *, const int64_t *, void *), void *user) {
  uint8_t key[16], generic[16];
  jit__hot_list l;
  if (!jit__cache_enabled(g->ctx->cache)) return;
  jit_status s = jit__hot_key(g, key, generic);
  if (s || !jit__hot_init(g, &l)) {
    jit_status_free(s);
    return;
  }
  jit__hot_read(g, key, &l);
  for (size_t r = 0; r < l.n && r < max; r++) fn(g, l.dims + r * l.n_dims, user);
  free(l.dims);
}

static void jit__hot_push(jit_graph *g, const int64_t *dims, void *user) {
  (void)user;
  jit__spec_push_hot(g, dims);
}

void jit__hot_queue(jit_graph *g) {
  jit__hot_each(g, (size_t)g->ctx->max_specializations, jit__hot_push, NULL);
}

typedef struct jit__prewarm {
  size_t ready;
  jit_status first;
} jit__prewarm;

static void jit__hot_warm(jit_graph *g, const int64_t *dims, void *user) {
  jit__prewarm *p = user;
  jit_status s = jit__warm_binding(g, dims, false);
  if (!s) p->ready++;
  else if (!p->first) p->first = s;
  else jit_status_free(s);
}

jit_status jit_graph_prewarm_hot(jit_graph *g, int max, size_t *out_ready) {
  if (out_ready) *out_ready = 0;
  if (!g) return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_graph_prewarm_hot: graph is NULL");
  if (!g->finalized)
    return JIT_ERR(JIT_INVALID_ARGUMENT,
                   "graph `%s` is not finalized (call jit_graph_finalize)", g->name);
  if (max < 0)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "jit_graph_prewarm_hot: graph `%s`: max is %d, "
                   "not >= 0", g->name, max);
  if (g->n_symbols == 0 || g->mlir) return NULL;  // never on a list: nothing to do
  jit__prewarm p = {0, NULL};
  jit__hot_each(g, max ? (size_t)max : kMaxRows, jit__hot_warm, &p);
  if (out_ready) *out_ready = p.ready;
  return p.first ? jit__status_annotate(p.first, "jit_graph_prewarm_hot: graph `%s`",
                                        g->name)
                 : NULL;
}
