//===--- hex.h - bytes as lower-case hex text and back ---------------------===//
//
// Kernel keys, fingerprints and build ids are written as lower-case hex in file
// names, key components and messages. Header-only. Thread-safe.
//
//===----------------------------------------------------------------------===//
#ifndef JITML_BASE_HEX_H_
#define JITML_BASE_HEX_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// Writes the 2n hex digits of bytes[0..n) and a NUL to out (room for 2n + 1).
static inline void jit__hex_encode(const uint8_t *bytes, size_t n, char *out) {
  static const char digits[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = digits[bytes[i] >> 4];
    out[2 * i + 1] = digits[bytes[i] & 15];
  }
  out[2 * n] = '\0';
}

// The value of one lower-case hex digit, or -1. Upper case is refused: every name
// the library writes is lower case, so another spelling is another (foreign) name.
static inline int jit__hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// Reads 2n lower-case hex digits of `hex` into out[0..n); false (out partly written)
// at the first character that is not one. Reads no further than it needs, so a NUL
// before 2n digits stops it.
static inline bool jit__hex_decode(const char *hex, size_t n, uint8_t *out) {
  for (size_t i = 0; i < n; i++) {
    int hi = jit__hex_digit(hex[2 * i]), lo = hi < 0 ? -1 : jit__hex_digit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = (uint8_t)(hi << 4 | lo);
  }
  return true;
}

#endif  // JITML_BASE_HEX_H_
