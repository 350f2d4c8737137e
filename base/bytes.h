//===--- bytes.h - little-endian fields, a growing writer, a bounded reader ===//
//
// Everything the library stores as bytes (cache entries, bundles, launch plans) is
// little-endian whatever the host's order, written through jit__bytes_writer and read
// back through jit__bytes_reader, whose reads past the end return zeros and set `bad`
// instead of reading out of bounds, so a decoder checks once at the end. Both are
// sticky like jit__text: after a failure every call is a no-op. Header-only.
// Thread-compatible: one writer or reader per thread.
//
//===----------------------------------------------------------------------===//
#ifndef JITML_BASE_BYTES_H_
#define JITML_BASE_BYTES_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline void jit__le_put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void jit__le_put_u64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint32_t jit__le_get_u32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--) v = v << 8 | p[i];
  return v;
}
static inline uint64_t jit__le_get_u64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

typedef struct jit__bytes_writer {
  uint8_t *p;  // malloc'ed; the caller frees it (or takes it) when done
  size_t len, cap;
  bool oom;
} jit__bytes_writer;

static inline void jit__bw_put(jit__bytes_writer *w, const void *src, size_t n) {
  if (w->oom || n == 0) return;
  if (n > SIZE_MAX / 2 - w->len) {
    w->oom = true;
    return;
  }
  if (w->len + n > w->cap) {
    size_t cap = w->cap ? w->cap * 2 : 256;
    while (cap < w->len + n) cap *= 2;
    uint8_t *p = realloc(w->p, cap);
    if (!p) {
      w->oom = true;
      return;
    }
    w->p = p;
    w->cap = cap;
  }
  memcpy(w->p + w->len, src, n);
  w->len += n;
}
static inline void jit__bw_u32(jit__bytes_writer *w, uint32_t v) {
  uint8_t b[4];
  jit__le_put_u32(b, v);
  jit__bw_put(w, b, 4);
}
static inline void jit__bw_u64(jit__bytes_writer *w, uint64_t v) {
  uint8_t b[8];
  jit__le_put_u64(b, v);
  jit__bw_put(w, b, 8);
}

typedef struct jit__bytes_reader {
  const uint8_t *p;
  size_t len, pos;
  bool bad;  // a read went past the end
} jit__bytes_reader;

// The next n bytes, or NULL (and `bad`) when fewer are left.
static inline const uint8_t *jit__br_take(jit__bytes_reader *r, size_t n) {
  if (r->bad || r->len - r->pos < n) {
    r->bad = true;
    return NULL;
  }
  const uint8_t *b = r->p + r->pos;
  r->pos += n;
  return b;
}
static inline uint32_t jit__br_u32(jit__bytes_reader *r) {
  const uint8_t *b = jit__br_take(r, 4);
  return b ? jit__le_get_u32(b) : 0;
}
static inline uint64_t jit__br_u64(jit__bytes_reader *r) {
  const uint8_t *b = jit__br_take(r, 8);
  return b ? jit__le_get_u64(b) : 0;
}

#endif  // JITML_BASE_BYTES_H_
