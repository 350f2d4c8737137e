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
  kTagCount = 7,
};

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

jit_status jit__art_encode(const jit__art *art, uint8_t **out_bytes, size_t *out_size) {
  *out_bytes = NULL;
  *out_size = 0;
  if (!memchr(art->entry, 0, sizeof art->entry) || art->n_parts > JIT__ART_MAX_PARTS)
    return JIT_ERR(JIT_INTERNAL, "artifact: entry point or parts out of range");
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
  if (art->plan) put_section(&w, kTagPlan, art->plan, art->plan_size);
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
    case kTagParts:
      return read_parts(&r, out) ? kReadOk : kReadBad;
    case kTagPlan:
      out->plan = copy_of(p, n);
      out->plan_size = n;
      return out->plan ? kReadOk : kReadNoMem;
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
  free(art->plan);
  free(art->notes);
  memset(art, 0, sizeof *art);
}
