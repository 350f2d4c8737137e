//===--- sign.h - ed25519 signatures of bundles and remote entries ---------===//
//
// A bundle or a fleet cache entry carries code from another machine. A signed one
// ends with a trailer, "JITMLSIG", the signer's ed25519 public key (32 bytes) and an
// Ed25519ph signature (64 bytes) of every byte before the trailer (libsodium's
// crypto_sign_*_create, streamed, so a bundle is never read into memory whole). A
// reader that trusts some keys accepts only bytes signed by one of them.
//
// Key files: the secret key is 128 lower-case hex digits (libsodium's 64-byte secret
// key, seed then public key) and a newline, in a regular file that only its owner can
// read or write; a public key is 64 hex digits. Thread-safe: no shared state.
//
//===----------------------------------------------------------------------===//
#ifndef JITML_CACHE_SIGN_H_
#define JITML_CACHE_SIGN_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#define JIT__SIGN_PUBLIC_BYTES 32
#define JIT__SIGN_SECRET_BYTES 64
#define JIT__SIGN_TRAILER_BYTES (8 + 32 + 64)
#define JIT__SIGN_MAX_TRUSTED 16

// Keys an importer trusts. Thread-compatible: a value.
typedef struct jit__trusted_keys {
  uint32_t n;
  uint8_t keys[JIT__SIGN_MAX_TRUSTED][JIT__SIGN_PUBLIC_BYTES];
} jit__trusted_keys;

// Makes a key pair: writes the secret key to `secret_path` (created, never replaced:
// an existing file is JIT_INVALID_ARGUMENT; mode 0600) and the public key's 64 hex
// digits and a NUL into `public_hex`. JIT_UNAVAILABLE when libsodium cannot start.
jit_status jit__sign_keygen(const char *secret_path, char public_hex[65]);

// Reads a secret key file: a regular file, not readable or writable by group or
// others, holding 128 hex digits. JIT_INVALID_ARGUMENT says what is wrong.
jit_status jit__sign_read_secret(const char *path, uint8_t secret[JIT__SIGN_SECRET_BYTES]);

// Parses public keys (64 hex digits each, separated by commas, spaces or newlines) into
// `out`; "" gives none. JIT_INVALID_ARGUMENT names the bad item (`what`: where the
// text came from, e.g. "JITML_TRUSTED_KEYS").
jit_status jit__sign_parse_keys(const char *text, const char *what, jit__trusted_keys *out);

// Zeroes a secret where the compiler cannot drop the stores.
void jit__sign_wipe(void *secret, size_t size);

// Signs bytes [0, size) of `fd` (read with pread) into `trailer`.
jit_status jit__sign_fd(int fd, uint64_t size, const uint8_t secret[JIT__SIGN_SECRET_BYTES],
                        uint8_t trailer[JIT__SIGN_TRAILER_BYTES]);

// Checks that the last JIT__SIGN_TRAILER_BYTES of the `size` bytes of `fd` are a
// trailer whose signature verifies over the bytes before it, by a key of `trusted`
// (when trusted->n > 0; else by the key the trailer names, which proves only that the
// bytes are intact). False with `why` set otherwise; *signer gets the trailer's key.
bool jit__sign_verify_fd(int fd, uint64_t size, const jit__trusted_keys *trusted,
                         uint8_t signer[JIT__SIGN_PUBLIC_BYTES], char *why, size_t why_size);

// The same over `size` bytes in memory (a remote cache entry: signed bytes, then the
// trailer, which jit__sign_verify_bytes expects as the last bytes of `size`).
jit_status jit__sign_bytes(const uint8_t *bytes, size_t size,
                           const uint8_t secret[JIT__SIGN_SECRET_BYTES],
                           uint8_t trailer[JIT__SIGN_TRAILER_BYTES]);
bool jit__sign_verify_bytes(const uint8_t *bytes, size_t size, const jit__trusted_keys *trusted,
                            uint8_t signer[JIT__SIGN_PUBLIC_BYTES], char *why,
                            size_t why_size);

#endif  // JITML_CACHE_SIGN_H_
