//===--- checked.h - element and byte counts that cannot wrap ---------------===//
//
// Every element or byte count that comes from a caller's shape goes through these:
// a product of dims wraps silently in size_t (a 2^62-element f32 tensor is "0 bytes"),
// and a buffer sized from a wrapped count is a heap overflow waiting for the kernel.
// Each returns false instead of a wrapped value; the caller turns that into a status
// naming the tensor. Header-only. Thread-safe (pure functions).
//
//===----------------------------------------------------------------------===//
#ifndef JITML_BASE_CHECKED_H_
#define JITML_BASE_CHECKED_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

// a * b into *out, false on overflow (or a negative factor).
static inline bool jit__checked_mul_i64(int64_t a, int64_t b, int64_t *out) {
  if (a < 0 || b < 0) return false;
  return !__builtin_mul_overflow(a, b, out);
}

// a + b into *out, false on overflow.
static inline bool jit__checked_add_u64(uint64_t a, uint64_t b, uint64_t *out) {
  return !__builtin_add_overflow(a, b, out);
}

// The element count of `dims[0..rank)` times `elem_bytes` (1 for a plain element
// count) into *out. False when a dim is negative or the product does not fit in an
// int64_t: shapes are int64 everywhere (DLPack, MLIR), so that is the outer bound even
// where size_t is wider.
static inline bool jit__checked_numel(int rank, const int64_t *dims, int64_t elem_bytes,
                                      int64_t *out) {
  int64_t n = elem_bytes;
  for (int d = 0; d < rank; d++)
    if (!jit__checked_mul_i64(n, dims[d], &n)) return false;
  *out = n;
  return true;
}

// Like jit__checked_numel over the dims that are known (>= 0), skipping symbols and
// unknowns (< 0): at build time, a static part whose product already overflows can
// never be bound.
static inline bool jit__checked_static_numel(int rank, const int64_t *dims, int64_t *out) {
  int64_t n = 1;
  for (int d = 0; d < rank; d++)
    if (dims[d] >= 0 && !jit__checked_mul_i64(n, dims[d], &n)) return false;
  *out = n;
  return true;
}

// Formats a concrete shape as "[2, 3]" into buf (truncated to fit), for the messages
// that refuse one.
static inline const char *jit__fmt_shape(int rank, const int64_t *dims, char *buf,
                                         size_t size) {
  size_t n = (size_t)snprintf(buf, size, "[");
  for (int d = 0; d < rank && n < size; d++)
    n += (size_t)snprintf(buf + n, size - n, "%s%lld", d ? ", " : "", (long long)dims[d]);
  if (n < size) snprintf(buf + n, size - n, "]");
  return buf;
}

#endif  // JITML_BASE_CHECKED_H_
