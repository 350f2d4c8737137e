//===--- text.h - a growing text buffer -------------------------------------===//
//
// The one text builder for everything that writes MLIR, transform scripts, records or
// messages piece by piece. Errors are sticky: after an allocation failure every call
// is a no-op and `oom` stays set, so a writer checks once at the end. Header-only, so
// the tests that compile internal sources need nothing more to link.
//
//===----------------------------------------------------------------------===//
#ifndef JITML_BASE_TEXT_H_
#define JITML_BASE_TEXT_H_

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"

typedef struct jit__text {
  char *p;     // NUL-terminated once anything was written; NULL before
  size_t len;  // bytes written, without the NUL
  size_t cap;
  bool oom;
} jit__text;

// Room for `extra` more bytes plus the NUL.
static inline bool jit__text_reserve(jit__text *t, size_t extra) {
  if (t->oom) return false;
  if (t->p && t->len + extra < t->cap) return true;
  size_t cap = t->cap ? t->cap : 4096;
  while (cap <= t->len + extra) cap *= 2;
  char *q = realloc(t->p, cap);
  if (!q) {
    t->oom = true;
    return false;
  }
  t->p = q;
  t->cap = cap;
  return true;
}

static inline void jit__text_append(jit__text *t, const char *s, size_t n) {
  if (!jit__text_reserve(t, n)) return;
  memcpy(t->p + t->len, s, n);
  t->len += n;
  t->p[t->len] = 0;
}

static inline void jit__text_vprintf(jit__text *t, const char *fmt, va_list ap) {
  if (t->oom) return;
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap2);
  va_end(ap2);
  if (n < 0) {
    t->oom = true;
    return;
  }
  if (!jit__text_reserve(t, (size_t)n)) return;
  vsnprintf(t->p + t->len, t->cap - t->len, fmt, ap);
  t->len += (size_t)n;
}

static inline void jit__text_printf(jit__text *t, const char *fmt, ...) JIT__PRINTF(2, 3);
static inline void jit__text_printf(jit__text *t, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  jit__text_vprintf(t, fmt, ap);
  va_end(ap);
}

#endif  // JITML_BASE_TEXT_H_
