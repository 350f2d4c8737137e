//===--- artifact.c - the one record a compiled kernel is stored as --------===//
//
// The layout is in artifact.h. The decoder trusts nothing: it reads through a bounded
// reader (base/bytes.h), checks the checksum before it allocates anything sized by the
// record, and bounds every count by the bytes that would have to hold it.
//
//===----------------------------------------------------------------------===//
#include "cache/artifact.h"

#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "base/bytes.h"

enum {
  kTagEnd = 0,
  kTagEntry = 1,
  kTagArgs = 2,
  kTagOutputs = 3,
  kTagParts = 4,
  kTagPlan = 5,
  kTagNotes = 6,
  kTagPrograms = 7,
  kTagPacked = 8,
  kTagCount = 9,
};

enum { kEntryBytes = 64 };  // a plan kernel's entry field (jit__gpu_kernel.entry)

static const uint8_t kMagic[4] = {'J', 'A', 'R', 'T'};

//===--- Encoding --------------------------------------------------------===//

static void put_section(jit__bytes_writer *w, uint32_t tag, const void *data, uint64_t n) {
  jit__bw_u32(w, tag);
  jit__bw_u64(w, n);
  jit__bw_put(w, data, (size_t)n);
}

// A section whose body is built in `body` first (its size goes before it).
static void put_built(jit__bytes_writer *w, uint32_t tag, jit__bytes_writer *body) {
  if (body->oom) w->oom = true;
  put_section(w, tag, body->p, body->len);
  free(body->p);
  *body = (jit__bytes_writer){0};
}

static void put_expr(jit__bytes_writer *w, jit__gpu_expr e) {
  jit__bw_u32(w, e.at);
  jit__bw_u32(w, e.len);
}

// The PLAN section's body.
static void put_plan(jit__bytes_writer *w, const jit__gpu_plan *p) {
  jit__bw_u32(w, p->n_buffers);
  jit__bw_u32(w, p->n_kernels);
  for (uint32_t i = 0; i < p->n_buffers; i++) {
    jit__bw_u32(w, (uint32_t)p->buffers[i].kind);
    jit__bw_u32(w, p->buffers[i].index);
    jit__bw_u64(w, p->buffers[i].bytes);
  }
  for (uint32_t i = 0; i < p->n_kernels; i++) {
    const jit__gpu_kernel *k = &p->kernels[i];
    char entry[kEntryBytes] = {0};
    const char *nul = memchr(k->entry, 0, sizeof entry - 1);
    memcpy(entry, k->entry, nul ? (size_t)(nul - k->entry) : sizeof entry - 1);
    jit__bw_put(w, entry, sizeof entry);
    for (int d = 0; d < 3; d++) jit__bw_u32(w, k->grid[d]);
    for (int d = 0; d < 3; d++) jit__bw_u32(w, k->block[d]);
    jit__bw_u32(w, k->n_args);
    for (uint32_t a = 0; a < k->n_args; a++) jit__bw_u32(w, k->args[a]);
  }
}

// The PROGRAMS section's body (a generic kernel's plan).
static void put_programs(jit__bytes_writer *w, const jit__gpu_plan *p) {
  jit__bw_u32(w, p->n_code);
  for (uint32_t i = 0; i < p->n_code; i++) {
    jit__bw_u32(w, p->code[i].op);
    jit__bw_u32(w, p->code[i].aux);
    jit__bw_u64(w, (uint64_t)p->code[i].v);
  }
  for (uint32_t i = 0; i < p->n_buffers; i++) put_expr(w, p->buffers[i].bytes_expr);
  for (uint32_t i = 0; i < p->n_kernels; i++)
    for (int d = 0; d < 3; d++) put_expr(w, p->kernels[i].grid_expr[d]);
  jit__bw_u32(w, p->n_sizes);
  for (uint32_t i = 0; i < p->n_sizes; i++) put_expr(w, p->sizes[i]);
}

static bool expr_ok(jit__gpu_expr e, uint32_t n_code) {
  return (uint64_t)e.at + e.len <= n_code;
}

// Whether the decoder would take `p` back: what the encoder refuses to write.
static bool plan_ok(const jit__gpu_plan *p) {
  for (uint32_t i = 0; i < p->n_buffers; i++)
    if (p->buffers[i].kind > JIT__GPU_BUF_SIZES || !expr_ok(p->buffers[i].bytes_expr, p->n_code))
      return false;
  for (uint32_t i = 0; i < p->n_kernels; i++) {
    const jit__gpu_kernel *k = &p->kernels[i];
    if (!memchr(k->entry, 0, sizeof k->entry)) return false;
    for (uint32_t a = 0; a < k->n_args; a++)
      if (k->args[a] >= p->n_buffers) return false;
    for (int d = 0; d < 3; d++)
      if (!expr_ok(k->grid_expr[d], p->n_code)) return false;
  }
  for (uint32_t i = 0; i < p->n_code; i++)
    if (p->code[i].op < JIT__GX_CONST || p->code[i].op > JIT__GX_LAST) return false;
  for (uint32_t i = 0; i < p->n_sizes; i++)
    if (!expr_ok(p->sizes[i], p->n_code)) return false;
  return true;
}

jit_status jit__art_encode(const jit__art *art, uint8_t **out_bytes, size_t *out_size) {
  *out_bytes = NULL;
  *out_size = 0;
  if (!memchr(art->entry, 0, sizeof art->entry) || art->n_parts > JIT__ART_MAX_PARTS)
    return JIT_ERR(JIT_INTERNAL, "artifact: entry point or parts out of range");
  if (art->n_packed > JIT__ART_MAX_PACKED)
    return JIT_ERR(JIT_INTERNAL, "artifact: %u packed arguments", art->n_packed);
  for (uint32_t i = 0; i < art->n_packed; i++)
    if (art->packed[i].arg >= art->n_args || art->packed[i].tn == 0 ||
        art->packed[i].transposed > 1)
      return JIT_ERR(JIT_INTERNAL, "artifact: packed argument %u of %u, panels %u",
                     art->packed[i].arg, art->n_args, art->packed[i].tn);
  if (art->has_plan && !plan_ok(&art->plan))
    return JIT_ERR(JIT_INTERNAL, "artifact: a launch plan that points past its tables");
  for (uint32_t i = 0; i < art->n_outputs; i++)
    if (art->outputs[i].rank < 0 || art->outputs[i].rank > JIT_MAX_RANK)
      return JIT_ERR(JIT_INTERNAL, "artifact: output %u has rank %d", i,
                     (int)art->outputs[i].rank);
  jit__bytes_writer w = {0}, body = {0};
  jit__bw_put(&w, kMagic, 4);
  jit__bw_u32(&w, JIT__ART_VERSION);
  jit__bw_u32(&w, art->target);
  if (art->entry[0]) put_section(&w, kTagEntry, art->entry, strlen(art->entry) + 1);
  jit__bw_u32(&body, art->n_args);
  jit__bw_u32(&body, art->stack_bytes);
  put_built(&w, kTagArgs, &body);
  if (art->n_packed) {
    jit__bw_u32(&body, art->n_packed);
    for (uint32_t i = 0; i < art->n_packed; i++) {
      jit__bw_u32(&body, art->packed[i].arg);
      jit__bw_u32(&body, art->packed[i].tn);
      jit__bw_u32(&body, art->packed[i].transposed);
    }
    put_built(&w, kTagPacked, &body);
  }
  jit__bw_u32(&body, art->n_outputs);
  for (uint32_t i = 0; i < art->n_outputs; i++) {
    const jit__art_shape *o = &art->outputs[i];
    jit__bw_u32(&body, (uint32_t)o->rank);
    jit__bw_u32(&body, (uint32_t)o->dtype);
    for (int d = 0; d < o->rank; d++) jit__bw_u64(&body, (uint64_t)o->dims[d]);
  }
  put_built(&w, kTagOutputs, &body);
  if (art->n_parts) {
    jit__bw_u32(&body, art->n_parts);
    for (uint32_t i = 0; i < art->n_parts; i++) {
      jit__bw_u32(&body, art->parts[i].kind);
      jit__bw_u64(&body, art->parts[i].size);
    }
    put_built(&w, kTagParts, &body);
  }
  if (art->has_plan) {
    put_plan(&body, &art->plan);
    put_built(&w, kTagPlan, &body);
    if (art->plan.n_code) {
      put_programs(&body, &art->plan);
      put_built(&w, kTagPrograms, &body);
    }
  }
  if (art->notes) put_section(&w, kTagNotes, art->notes, strlen(art->notes) + 1);
  uint64_t sum = w.oom ? 0 : XXH3_64bits(w.p, w.len);
  jit__bw_u32(&w, kTagEnd);
  jit__bw_u64(&w, 8);
  jit__bw_u64(&w, sum);
  if (w.oom) {
    free(w.p);
    return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "artifact: out of memory encoding a record");
  }
  *out_bytes = w.p;
  *out_size = w.len;
  return NULL;
}

//===--- Decoding --------------------------------------------------------===//

static jit_status bad(jit__art *out, const char *why) {
  jit__art_release(out);
  return JIT_ERR(JIT_CACHE_ERROR, "artifact record: %s", why);
}

// A NUL-terminated string section of at most `cap` bytes (cap 0: any length).
static bool is_string(const uint8_t *p, uint64_t n, size_t cap) {
  return n > 0 && (cap == 0 || n <= cap) && p[n - 1] == 0 && !memchr(p, 0, (size_t)n - 1);
}

typedef enum { kReadOk, kReadBad, kReadNoMem } read_result;

static read_result read_outputs(jit__bytes_reader *r, jit__art *out) {
  uint32_t n = jit__br_u32(r);
  // Each output takes at least 8 bytes: bound the count before allocating.
  if (r->bad || n > (r->len - r->pos) / 8) return kReadBad;
  out->outputs = calloc(n ? n : 1, sizeof *out->outputs);
  if (!out->outputs) return kReadNoMem;
  out->n_outputs = n;
  for (uint32_t i = 0; i < n && !r->bad; i++) {
    jit__art_shape *o = &out->outputs[i];
    uint32_t rank = jit__br_u32(r);
    o->dtype = (int32_t)jit__br_u32(r);
    if (rank > JIT_MAX_RANK) return kReadBad;
    o->rank = (int32_t)rank;
    for (uint32_t d = 0; d < rank; d++) o->dims[d] = (int64_t)jit__br_u64(r);
  }
  return !r->bad && r->pos == r->len ? kReadOk : kReadBad;
}

static bool read_parts(jit__bytes_reader *r, jit__art *out) {
  uint32_t n = jit__br_u32(r);
  if (n == 0 || n > JIT__ART_MAX_PARTS) return false;
  out->n_parts = n;
  for (uint32_t i = 0; i < n; i++) {
    out->parts[i].kind = jit__br_u32(r);
    out->parts[i].size = jit__br_u64(r);
  }
  return !r->bad && r->pos == r->len;
}

// A PLAN section: buffers and kernels. Every count is bounded by the bytes that must
// hold its records (16 per buffer, 92 per kernel) before anything is allocated.
static read_result read_plan(jit__bytes_reader *r, jit__gpu_plan *p) {
  uint32_t nb = jit__br_u32(r), nk = jit__br_u32(r);
  if (r->bad || (uint64_t)nb * 16 + (uint64_t)nk * 92 > r->len - r->pos) return kReadBad;
  p->buffers = calloc(nb ? nb : 1, sizeof *p->buffers);
  p->kernels = calloc(nk ? nk : 1, sizeof *p->kernels);
  if (!p->buffers || !p->kernels) return kReadNoMem;
  p->n_buffers = nb;
  for (uint32_t i = 0; i < nb; i++) {
    uint32_t kind = jit__br_u32(r);
    p->buffers[i].kind = (jit__gpu_buffer_kind)kind;
    p->buffers[i].index = jit__br_u32(r);
    p->buffers[i].bytes = jit__br_u64(r);
    if (kind > JIT__GPU_BUF_SIZES) return kReadBad;
  }
  for (uint32_t i = 0; i < nk && !r->bad; i++) {
    jit__gpu_kernel *k = &p->kernels[i];
    p->n_kernels = i + 1;
    const uint8_t *entry = jit__br_take(r, kEntryBytes);
    if (!entry || entry[kEntryBytes - 1] != 0) return kReadBad;
    memcpy(k->entry, entry, kEntryBytes);
    for (int d = 0; d < 3; d++) k->grid[d] = jit__br_u32(r);
    for (int d = 0; d < 3; d++) k->block[d] = jit__br_u32(r);
    uint32_t na = jit__br_u32(r);
    if (r->bad || (uint64_t)na * 4 > r->len - r->pos) return kReadBad;
    k->args = calloc(na ? na : 1, sizeof *k->args);
    if (!k->args) return kReadNoMem;
    k->n_args = na;
    for (uint32_t a = 0; a < na; a++)
      if ((k->args[a] = jit__br_u32(r)) >= nb) return kReadBad;
  }
  return !r->bad && r->pos == r->len ? kReadOk : kReadBad;
}

static jit__gpu_expr read_expr(jit__bytes_reader *r, uint32_t n_code) {
  jit__gpu_expr e = {jit__br_u32(r), 0};
  e.len = jit__br_u32(r);
  if (!expr_ok(e, n_code)) r->bad = true;
  return e;
}

// A PROGRAMS section, into the plan its PLAN section made.
static read_result read_programs(jit__bytes_reader *r, jit__gpu_plan *p) {
  uint32_t n = jit__br_u32(r);
  if (r->bad || n == 0 || n > (r->len - r->pos) / 16) return kReadBad;
  p->code = calloc(n, sizeof *p->code);
  if (!p->code) return kReadNoMem;
  p->n_code = n;
  for (uint32_t i = 0; i < n; i++) {
    p->code[i].op = jit__br_u32(r);
    p->code[i].aux = jit__br_u32(r);
    p->code[i].v = (int64_t)jit__br_u64(r);
    if (p->code[i].op < JIT__GX_CONST || p->code[i].op > JIT__GX_LAST) return kReadBad;
  }
  for (uint32_t i = 0; i < p->n_buffers; i++) p->buffers[i].bytes_expr = read_expr(r, n);
  for (uint32_t i = 0; i < p->n_kernels; i++)
    for (int d = 0; d < 3; d++) p->kernels[i].grid_expr[d] = read_expr(r, n);
  uint32_t ns = jit__br_u32(r);
  if (r->bad || ns > (r->len - r->pos) / 8) return kReadBad;
  p->sizes = calloc(ns + 1, sizeof *p->sizes);
  if (!p->sizes) return kReadNoMem;
  p->n_sizes = ns;
  for (uint32_t i = 0; i < ns; i++) p->sizes[i] = read_expr(r, n);
  return !r->bad && r->pos == r->len ? kReadOk : kReadBad;
}

// A copy of n bytes, or NULL when out of memory.
static void *copy_of(const uint8_t *p, uint64_t n) {
  void *c = malloc(n ? (size_t)n : 1);
  if (c) memcpy(c, p, (size_t)n);
  return c;
}

// One section's body into `out`.
static read_result read_section(uint32_t tag, const uint8_t *p, uint64_t n, jit__art *out) {
  jit__bytes_reader r = {p, (size_t)n, 0, false};
  switch (tag) {
    case kTagEntry:
      if (!is_string(p, n, JIT__ART_ENTRY_MAX)) return kReadBad;
      memcpy(out->entry, p, (size_t)n);
      return kReadOk;
    case kTagArgs:
      out->n_args = jit__br_u32(&r);
      out->stack_bytes = jit__br_u32(&r);
      return !r.bad && r.pos == r.len ? kReadOk : kReadBad;
    case kTagOutputs:
      return read_outputs(&r, out);
    case kTagPacked:
      out->n_packed = jit__br_u32(&r);
      if (r.bad || out->n_packed > JIT__ART_MAX_PACKED) return kReadBad;
      for (uint32_t i = 0; i < out->n_packed; i++) {
        out->packed[i].arg = jit__br_u32(&r);
        out->packed[i].tn = jit__br_u32(&r);
        out->packed[i].transposed = jit__br_u32(&r);
        if (out->packed[i].tn == 0 || out->packed[i].transposed > 1) return kReadBad;
      }
      return !r.bad && r.pos == r.len ? kReadOk : kReadBad;
    case kTagParts:
      return read_parts(&r, out) ? kReadOk : kReadBad;
    case kTagPlan:
      out->has_plan = true;
      return read_plan(&r, &out->plan);
    case kTagPrograms:
      // After its PLAN: the programs refer to its buffers and kernels.
      if (!out->has_plan) return kReadBad;
      return read_programs(&r, &out->plan);
    case kTagNotes:
      if (!is_string(p, n, 0)) return kReadBad;
      out->notes = copy_of(p, n);
      return out->notes ? kReadOk : kReadNoMem;
    default:
      return kReadBad;  // a tag this version does not define: a foreign record
  }
}

jit_status jit__art_decode(const uint8_t *bytes, size_t size, jit__art *out) {
  memset(out, 0, sizeof *out);
  if (!bytes || size < 12 + 20 || memcmp(bytes, kMagic, 4) != 0)
    return bad(out, "bad magic or truncated");
  uint32_t version = jit__le_get_u32(bytes + 4);
  if (version != JIT__ART_VERSION)
    return JIT_ERR(JIT_CACHE_ERROR, "artifact record: version %u, expected %u", version,
                   (unsigned)JIT__ART_VERSION);
  // The end section is the last 20 bytes; everything before it is checksummed.
  const uint8_t *end = bytes + size - 20;
  if (jit__le_get_u32(end) != kTagEnd || jit__le_get_u64(end + 4) != 8)
    return bad(out, "truncated (no end section)");
  if (jit__le_get_u64(end + 12) != XXH3_64bits(bytes, size - 20))
    return bad(out, "checksum mismatch");
  out->target = jit__le_get_u32(bytes + 8);
  jit__bytes_reader r = {bytes, size - 20, 12, false};
  bool seen[kTagCount] = {false};
  while (r.pos < r.len) {
    uint32_t tag = jit__br_u32(&r);
    uint64_t n = jit__br_u64(&r);
    const uint8_t *body = r.bad || n > r.len - r.pos ? NULL : jit__br_take(&r, (size_t)n);
    if (!body && n) return bad(out, "a section runs past the end");
    if (tag == kTagEnd || tag >= kTagCount || seen[tag]) return bad(out, "bad section tag");
    seen[tag] = true;
    read_result rr = read_section(tag, body ? body : (const uint8_t *)"", n, out);
    if (rr == kReadNoMem) {
      jit__art_release(out);
      return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "artifact record: out of memory");
    }
    if (rr == kReadBad) return bad(out, "a malformed section");
  }
  if (!seen[kTagArgs] || !seen[kTagOutputs]) return bad(out, "missing sections");
  for (uint32_t i = 0; i < out->n_packed; i++)
    if (out->packed[i].arg >= out->n_args) return bad(out, "a packed argument past the last");
  return NULL;
}

uint64_t jit__art_parts_size(const jit__art *art) {
  uint64_t n = 0;
  for (uint32_t i = 0; i < art->n_parts; i++) n += art->parts[i].size;
  return n;
}

void jit__art_release(jit__art *art) {
  if (!art) return;
  free(art->outputs);
  jit__gpu_plan_release(&art->plan);
  free(art->notes);
  memset(art, 0, sizeof *art);
}
