//===--- sign.c - ed25519 signatures of bundles and remote entries ---------===//
//
// The layout of a trailer and of key files is in sign.h.
//
//===----------------------------------------------------------------------===//
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "cache/sign.h"

#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/hex.h"

static const uint8_t kTrailerMagic[8] = {'J', 'I', 'T', 'M', 'L', 'S', 'I', 'G'};

static jit_status jit__sodium_start(void) {
  if (sodium_init() < 0)  // idempotent and thread-safe once it has succeeded
    return JIT_ERR(JIT_UNAVAILABLE, "bundle signing: libsodium could not start");
  return NULL;
}

jit_status jit__sign_keygen(const char *secret_path, char public_hex[65]) {
  public_hex[0] = 0;
  if (!secret_path || !secret_path[0])
    return JIT_ERR(JIT_INVALID_ARGUMENT, "bundle keygen: no secret key path");
  JIT_PROPAGATE(jit__sodium_start());
  uint8_t pk[crypto_sign_PUBLICKEYBYTES], sk[crypto_sign_SECRETKEYBYTES];
  crypto_sign_keypair(pk, sk);
  char text[2 * crypto_sign_SECRETKEYBYTES + 2];
  jit__hex_encode(sk, sizeof sk, text);
  text[2 * sizeof sk] = '\n';
  text[2 * sizeof sk + 1] = 0;
  sodium_memzero(sk, sizeof sk);
  int fd = open(secret_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    sodium_memzero(text, sizeof text);
    return JIT_ERR(JIT_INVALID_ARGUMENT, "bundle keygen: cannot create %s: %s (an existing "
                   "key is never replaced)", secret_path, strerror(errno));
  }
  size_t n = strlen(text);
  bool ok = write(fd, text, n) == (ssize_t)n && fsync(fd) == 0;
  int err = errno;
  sodium_memzero(text, sizeof text);
  if (close(fd) != 0) ok = false;
  if (!ok) {
    unlink(secret_path);
    return JIT_ERR(JIT_INVALID_ARGUMENT, "bundle keygen: writing %s failed: %s", secret_path,
                   strerror(err));
  }
  jit__hex_encode(pk, sizeof pk, public_hex);
  public_hex[64] = 0;
  return NULL;
}

jit_status jit__sign_read_secret(const char *path, uint8_t secret[JIT__SIGN_SECRET_BYTES]) {
  if (!path || !path[0]) return JIT_ERR(JIT_INVALID_ARGUMENT, "bundle signing: no key path");
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "bundle signing key %s: %s", path, strerror(errno));
  struct stat st;
  char text[2 * JIT__SIGN_SECRET_BYTES + 3] = {0};
  const char *why = NULL;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) why = "not a regular file";
  else if (st.st_mode & 077) why = "readable or writable by group or others (chmod 600)";
  else if (st.st_size < 2 * JIT__SIGN_SECRET_BYTES || st.st_size > (off_t)sizeof text - 1)
    why = "not a secret key file (128 hex digits)";
  else if (read(fd, text, (size_t)st.st_size) != st.st_size) why = "unreadable";
  close(fd);
  if (!why && (!jit__hex_decode(text, JIT__SIGN_SECRET_BYTES, secret) ||
               (text[128] && text[128] != '\n')))
    why = "not a secret key file (128 hex digits)";
  sodium_memzero(text, sizeof text);
  if (why) return JIT_ERR(JIT_INVALID_ARGUMENT, "bundle signing key %s: %s", path, why);
  return jit__sodium_start();
}

jit_status jit__sign_parse_keys(const char *text, const char *what, jit__trusted_keys *out) {
  memset(out, 0, sizeof *out);
  for (const char *p = text ? text : ""; *p;) {
    p += strspn(p, ", \t\n");
    size_t len = strcspn(p, ", \t\n");
    if (!len) break;
    if (out->n == JIT__SIGN_MAX_TRUSTED)
      return JIT_ERR(JIT_INVALID_ARGUMENT, "%s: more than %d trusted keys", what,
                     JIT__SIGN_MAX_TRUSTED);
    if (len != 64 || !jit__hex_decode(p, 32, out->keys[out->n]))
      return JIT_ERR(JIT_INVALID_ARGUMENT, "%s: `%.*s` is not a public key (64 hex digits)",
                     what, (int)(len > 80 ? 80 : len), p);
    out->n++;
    p += len;
  }
  return NULL;
}

// Where signed bytes come from: memory (`bytes`) or a file read with pread (`fd`).
typedef struct jit__sign_source {
  int fd;
  const uint8_t *bytes;
} jit__sign_source;

static bool jit__sign_read(jit__sign_source src, void *out, size_t n, uint64_t at) {
  if (src.bytes) {
    memcpy(out, src.bytes + at, n);
    return true;
  }
  return pread(src.fd, out, n, (off_t)at) == (ssize_t)n;
}

// Feeds bytes [0, size) of `src` to `st`; false on a read error.
static bool jit__sign_feed(jit__sign_source src, uint64_t size, crypto_sign_state *st) {
  if (src.bytes) {
    crypto_sign_update(st, src.bytes, (unsigned long long)size);
    return true;
  }
  uint8_t buf[1 << 16];
  for (uint64_t at = 0; at < size;) {
    size_t want = size - at < sizeof buf ? (size_t)(size - at) : sizeof buf;
    ssize_t got = pread(src.fd, buf, want, (off_t)at);
    if (got <= 0) {
      if (got < 0 && errno == EINTR) continue;
      return false;
    }
    crypto_sign_update(st, buf, (unsigned long long)got);
    at += (uint64_t)got;
  }
  return true;
}

void jit__sign_wipe(void *secret, size_t size) { sodium_memzero(secret, size); }

static jit_status jit__sign(jit__sign_source src, uint64_t size,
                            const uint8_t secret[JIT__SIGN_SECRET_BYTES],
                            uint8_t trailer[JIT__SIGN_TRAILER_BYTES]) {
  JIT_PROPAGATE(jit__sodium_start());
  crypto_sign_state st;
  crypto_sign_init(&st);
  if (!jit__sign_feed(src, size, &st))
    return JIT_ERR(JIT_CACHE_ERROR, "signing: reading the bytes back failed: %s",
                   strerror(errno));
  memcpy(trailer, kTrailerMagic, 8);
  crypto_sign_ed25519_sk_to_pk(trailer + 8, secret);
  crypto_sign_final_create(&st, trailer + 40, NULL, secret);
  return NULL;
}

jit_status jit__sign_fd(int fd, uint64_t size, const uint8_t secret[JIT__SIGN_SECRET_BYTES],
                        uint8_t trailer[JIT__SIGN_TRAILER_BYTES]) {
  return jit__sign((jit__sign_source){fd, NULL}, size, secret, trailer);
}

jit_status jit__sign_bytes(const uint8_t *bytes, size_t size,
                           const uint8_t secret[JIT__SIGN_SECRET_BYTES],
                           uint8_t trailer[JIT__SIGN_TRAILER_BYTES]) {
  return jit__sign((jit__sign_source){-1, bytes}, size, secret, trailer);
}

static bool jit__sign_verify(jit__sign_source src, uint64_t size,
                             const jit__trusted_keys *trusted,
                             uint8_t signer[JIT__SIGN_PUBLIC_BYTES], char *why,
                             size_t why_size) {
  uint8_t trailer[JIT__SIGN_TRAILER_BYTES];
  memset(signer, 0, JIT__SIGN_PUBLIC_BYTES);
  if (jit__sodium_start()) {
    snprintf(why, why_size, "libsodium could not start");
    return false;
  }
  if (size < sizeof trailer ||
      !jit__sign_read(src, trailer, sizeof trailer, size - sizeof trailer) ||
      memcmp(trailer, kTrailerMagic, 8) != 0) {
    snprintf(why, why_size, "no signature trailer");
    return false;
  }
  memcpy(signer, trailer + 8, JIT__SIGN_PUBLIC_BYTES);
  bool known = trusted->n == 0;
  for (uint32_t i = 0; i < trusted->n && !known; i++)
    known = sodium_memcmp(trusted->keys[i], signer, JIT__SIGN_PUBLIC_BYTES) == 0;
  char hex[65];
  jit__hex_encode(signer, JIT__SIGN_PUBLIC_BYTES, hex);
  hex[64] = 0;
  if (!known) {
    snprintf(why, why_size, "signed by %.16s..., which is not a trusted key", hex);
    return false;
  }
  crypto_sign_state st;
  crypto_sign_init(&st);
  if (!jit__sign_feed(src, size - sizeof trailer, &st)) {
    snprintf(why, why_size, "reading it failed: %s", strerror(errno));
    return false;
  }
  if (crypto_sign_final_verify(&st, trailer + 40, signer) != 0) {
    snprintf(why, why_size, "the signature by %.16s... does not verify (altered after "
             "signing)", hex);
    return false;
  }
  return true;
}

bool jit__sign_verify_fd(int fd, uint64_t size, const jit__trusted_keys *trusted,
                         uint8_t signer[JIT__SIGN_PUBLIC_BYTES], char *why, size_t why_size) {
  return jit__sign_verify((jit__sign_source){fd, NULL}, size, trusted, signer, why, why_size);
}

bool jit__sign_verify_bytes(const uint8_t *bytes, size_t size, const jit__trusted_keys *trusted,
                            uint8_t signer[JIT__SIGN_PUBLIC_BYTES], char *why,
                            size_t why_size) {
  return jit__sign_verify((jit__sign_source){-1, bytes}, size, trusted, signer, why, why_size);
}
