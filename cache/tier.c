//===--- tier.c - the fleet tier of the cache: Redis behind the disk ---------===//
//
// A kernel compiled on one machine serves every machine that shares the server:
//
//   fetch:   disk miss -> GET the value -> verify it as an entry file -> store it on
//            disk (the next process hits locally) -> return it;
//   put:     every kernel stored on disk is also queued for the server (remote.c sends
//            it from its own thread: a run never waits for a push);
//   lock:    a compile takes the key's fleet lock, so machines compile each key once.
//
// A value is the entry file's bytes (cache/internal.h), followed by a signature
// trailer (cache/sign.h) of those bytes when the pushing machine has a signing key. It
// is accepted only when the header decodes, its key is the key asked for, its format
// version is ours, its length is exact, its checksum holds, its kind is a kernel's
// and, when this machine trusts keys, it is signed by one of them; anything else is
// refused, counted (remote_rejected) and logged, and the kernel is compiled. The target
// is part of the key, so the key echo also stops a value made for another target.
//
//===----------------------------------------------------------------------===//
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache/internal.h"

static bool jit__kernel_kind(uint32_t kind) {
  return kind == JIT__PAYLOAD_CPU_OBJECT || kind == JIT__PAYLOAD_PTX ||
         kind == JIT__PAYLOAD_CUBIN || kind == JIT__PAYLOAD_SPIRV;
}

jit_status jit__cache_open_remote(jit__cache *c, const jit__cache_options *o) {
  if (!o->remote) return NULL;
  if (!c->enabled) {
    jit__cache_logf(c, JIT_LOG_WARNING, "remote cache %s is not used: it needs the disk "
                    "cache, which is off (%s)", o->remote->url, c->disabled_reason);
    return NULL;
  }
  jit__remote_options ro = *o->remote;
  ro.logger = c->logger;
  JIT_PROPAGATE(jit__remote_open(&ro, &c->remote));
  c->remote_lock_wait_ms = o->remote_lock_wait_ms;
  if (o->remote_secret) {
    memcpy(c->remote_secret, o->remote_secret, sizeof c->remote_secret);
    c->remote_signs = true;
  }
  jit__cache_logf(c, JIT_LOG_DEBUG, "remote cache %s behind %s%s%s",
                  jit__remote_url(c->remote), c->dir,
                  c->remote_signs ? ", pushes signed" : "",
                  c->trusted.n ? ", accepts only trusted signatures" : "");
  return NULL;
}

const char *jit__cache_remote(jit__cache *c, char *state, size_t state_size) {
  if (!c || !c->remote) {
    snprintf(state, state_size, "off: %s", c && c->enabled ? "no remote cache configured"
                                                           : "the disk cache is off");
    return NULL;
  }
  (void)jit__remote_ping(c->remote);
  jit__remote_state(c->remote, state, state_size);
  return jit__remote_url(c->remote);
}

//===--- Push ---------------------------------------------------------------------===//

// The value of an entry: its bytes, then a signature trailer when this cache signs.
// Takes `bytes` (malloc'ed with room for the trailer); NULL if signing failed.
static uint8_t *jit__cache_seal(jit__cache *c, uint8_t *bytes, size_t *size) {
  if (!c->remote_signs) return bytes;
  jit_status s = jit__sign_bytes(bytes, *size, c->remote_secret, bytes + *size);
  if (s) {
    jit__cache_logf(c, JIT_LOG_WARNING, "remote cache: %s; not pushed", jit_status_message(s));
    jit_status_free(s);
    free(bytes);
    return NULL;
  }
  *size += JIT__SIGN_TRAILER_BYTES;
  return bytes;
}

void jit__cache_push(jit__cache *c, const uint8_t key[16], uint32_t kind,
                     const struct iovec *iov, int iov_count) {
  if (!c->remote || !jit__kernel_kind(kind)) return;
  size_t size = 0;
  for (int i = 0; i < iov_count; i++) size += iov[i].iov_len;
  uint8_t *bytes = malloc(size + JIT__SIGN_TRAILER_BYTES);
  if (!bytes) return;
  for (int i = 0, at = 0; i < iov_count; at += (int)iov[i].iov_len, i++)
    if (iov[i].iov_len) memcpy(bytes + at, iov[i].iov_base, iov[i].iov_len);
  if ((bytes = jit__cache_seal(c, bytes, &size))) jit__remote_put(c->remote, key, bytes, size);
}

// Reads the disk entry of `key` whole, checked, with room for a trailer. NULL if absent,
// bad or out of memory.
static uint8_t *jit__cache_read_entry(jit__cache *c, const uint8_t key[16], size_t *size,
                                      uint32_t *kind) {
  char path[PATH_MAX], why[256];
  jit__cache_entry_path(c, key, path);
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  struct stat st;
  uint8_t *bytes = NULL;
  jit__cache_header h;
  if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
      (uint64_t)st.st_size <= JIT__CACHE_MAX_PAYLOAD &&
      (bytes = malloc((size_t)st.st_size + JIT__SIGN_TRAILER_BYTES)) &&
      (jit__cache_pread_full(fd, bytes, (size_t)st.st_size, 0) != 0 ||
       !jit__cache_check_bytes(bytes, (uint64_t)st.st_size, key, &h, why, sizeof why))) {
    free(bytes);
    bytes = NULL;
  }
  if (fd >= 0) close(fd);
  *size = bytes ? (size_t)st.st_size : 0;
  *kind = bytes ? h.kind : 0;
  return bytes;
}

void jit__cache_publish(jit__cache *c, const uint8_t key[16]) {
  if (!c || !c->remote) return;
  size_t size;
  uint32_t kind;
  uint8_t *bytes = jit__cache_read_entry(c, key, &size, &kind);
  if (bytes && jit__kernel_kind(kind) && (bytes = jit__cache_seal(c, bytes, &size)))
    jit__remote_put(c->remote, key, bytes, size);
  else
    free(bytes);
}

//===--- Fetch --------------------------------------------------------------------===//

bool jit__cache_check_value(const jit__trusted_keys *trusted, const uint8_t key[16],
                            const uint8_t *bytes, size_t size, jit__cache_header *h,
                            size_t *entry_size, char *why, size_t why_size) {
  if (size < JIT__CACHE_HEADER_SIZE) {
    snprintf(why, why_size, "%zu bytes, shorter than an entry's header", size);
    return false;
  }
  if (!jit__cache_header_decode(bytes, h, why, why_size)) return false;
  uint64_t want = jit__cache_header_file_size(h);
  bool signed_ = size == want + JIT__SIGN_TRAILER_BYTES;
  if (size != want && !signed_) {
    snprintf(why, why_size, "%zu bytes where its header says %" PRIu64 " (or %" PRIu64
             " signed)", size, want, want + JIT__SIGN_TRAILER_BYTES);
    return false;
  }
  if (!jit__cache_check_bytes(bytes, want, key, h, why, why_size)) return false;
  if (!jit__kernel_kind(h->kind)) {
    snprintf(why, why_size, "payload kind %u is not a kernel's", h->kind);
    return false;
  }
  // With trusted keys only their signatures pass; without, a signature present must
  // still verify (the bytes are intact), as for bundles.
  uint8_t signer[JIT__SIGN_PUBLIC_BYTES];
  if ((signed_ || trusted->n) &&
      !jit__sign_verify_bytes(bytes, size, trusted, signer, why, why_size))
    return false;
  *entry_size = (size_t)want;
  return true;
}

bool jit__cache_entry_from(const jit__cache_header *h, const uint8_t *bytes,
                                  const uint8_t key[16], jit__cache_entry *out) {
  const uint8_t *at = bytes + JIT__CACHE_HEADER_SIZE;
  memcpy(out->key, key, 16);
  out->kind = (jit__payload_kind)h->kind;
  out->meta_size = h->meta_size;
  out->payload_size = h->payload_size;
  out->meta = h->meta_size ? malloc(h->meta_size) : NULL;
  out->components = malloc(h->components_size + 1);
  out->payload = h->payload_size ? malloc(h->payload_size) : NULL;
  if ((h->meta_size && !out->meta) || !out->components || (h->payload_size && !out->payload)) {
    jit__cache_entry_release(out);
    return false;
  }
  if (h->meta_size) memcpy(out->meta, at, h->meta_size);
  at += h->meta_size;
  memcpy(out->components, at, h->components_size);
  out->components[h->components_size] = 0;
  at += h->components_size;
  if (h->payload_size) memcpy(out->payload, at, h->payload_size);
  return true;
}

static bool jit__cache_was_refused(jit__cache *c, const uint8_t key[16]) {
  pthread_mutex_lock(&c->mu);
  bool refused = false;
  uint32_t n = c->n_refused < 64 ? c->n_refused : 64;
  for (uint32_t i = 0; i < n && !refused; i++) refused = !memcmp(c->refused[i], key, 16);
  pthread_mutex_unlock(&c->mu);
  return refused;
}

static void jit__cache_reject(jit__cache *c, const uint8_t key[16], const char *why) {
  char hex[33];
  jit__cache_key_hex(key, hex);
  pthread_mutex_lock(&c->mu);
  c->stats.remote_rejected++;
  memcpy(c->refused[c->n_refused++ % 64], key, 16);
  pthread_mutex_unlock(&c->mu);
  jit__cache_logf(c, JIT_LOG_WARNING, "remote cache %s: value of %s refused: %s (nothing of "
                  "it is used; a run compiles the kernel and pushes it in its place)",
                  jit__remote_url(c->remote), hex, why);
}

// What a fetch from the server came to.
typedef enum jit__fetched {
  JIT__FETCHED,   // verified and stored (and in `out` when asked)
  JIT__ABSENT,    // no value (or one refused before in this process)
  JIT__REFUSED,   // a value that failed its checks (counted, logged)
  JIT__FAILED,    // the tier is paused or the command failed
} jit__fetched;

// Gets `key` from the server, checks it and stores it on disk. `out` may be NULL
// (pull: store only). Non-NULL only for out-of-memory.
static jit_status jit__cache_fetch_remote(jit__cache *c, const uint8_t key[16],
                                          jit__cache_entry *out, jit__fetched *result) {
  uint8_t *bytes = NULL;
  size_t size = 0, entry_size = 0;
  *result = JIT__ABSENT;
  if (jit__cache_was_refused(c, key)) return NULL;
  jit__remote_got got = jit__remote_get(c->remote, key, &bytes, &size);
  if (got == JIT__REMOTE_NOMEM)
    return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory fetching a remote cache entry");
  if (got == JIT__REMOTE_FAILED) *result = JIT__FAILED;
  if (got == JIT__REMOTE_OVERSIZE || got == JIT__REMOTE_WRONG_TYPE) {
    jit__cache_reject(c, key, got == JIT__REMOTE_OVERSIZE ? "larger than remote_max_bytes"
                                                          : "the key holds no string");
    *result = JIT__REFUSED;
  }
  if (got != JIT__REMOTE_HIT) return NULL;
  char why[256];
  jit__cache_header h;
  jit_status s = NULL;
  if (!jit__cache_check_value(&c->trusted, key, bytes, size, &h, &entry_size, why,
                              sizeof why)) {
    jit__cache_reject(c, key, why);
    *result = JIT__REFUSED;
  } else {
    struct iovec iov = {bytes, entry_size};
    if (!c->read_only && jit__cache_write_atomic(c, key, &iov, 1, -1)) {
      pthread_mutex_lock(&c->mu);
      c->stats.puts++;
      c->stats.bytes_written += entry_size;
      pthread_mutex_unlock(&c->mu);
      jit__cache_maybe_prune(c, entry_size);
    }
    if (out && !jit__cache_entry_from(&h, bytes, key, out))
      s = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory fetching a remote cache entry");
    else
      JIT__CACHE_COUNT(c, remote_hits, 1);
    if (!s) *result = JIT__FETCHED;
  }
  free(bytes);
  return s;
}

jit_status jit__cache_fetch(jit__cache *c, const uint8_t key[16], jit__cache_entry *out,
                            bool *found) {
  JIT_PROPAGATE(jit__cache_get(c, key, out, found));
  if (*found || !c->remote) return NULL;
  jit__fetched result;
  jit_status s = jit__cache_fetch_remote(c, key, out, &result);
  *found = result == JIT__FETCHED;
  return s;
}

//===--- Fleet locks --------------------------------------------------------------===//

void jit__cache_lock_fleet(jit__cache *c, const uint8_t key[16], int timeout_ms,
                           jit__cache_lock *lock, bool *acquired) {
  jit__cache_lock_key(c, key, timeout_ms, lock, acquired);
  if (!c || !c->remote || c->remote_lock_wait_ms < 0) return;
  if (jit__remote_lock(c->remote, key, c->remote_lock_wait_ms, &lock->token)) {
    lock->cache = c;
    memcpy(lock->key, key, 16);
  }
}

//===--- Whole-cache transfers -------------------------------------------------------===//

typedef struct jit__keys {
  uint8_t (*keys)[16];
  uint64_t n, cap;
  bool oom;
} jit__keys;

static bool jit__keys_add(jit__keys *k, const uint8_t key[16]) {
  if (k->n == k->cap) {
    uint64_t cap = k->cap ? k->cap * 2 : 256;
    void *grown = realloc(k->keys, cap * 16);
    if (!grown) {
      k->oom = true;
      return false;
    }
    k->keys = grown;
    k->cap = cap;
  }
  memcpy(k->keys[k->n++], key, 16);
  return true;
}

static bool jit__keys_of_entry(void *user, const jit__cache_entry *e, const char *path,
                               uint64_t size, int64_t atime) {
  return !jit__kernel_kind((uint32_t)e->kind) || jit__keys_add(user, e->key);
}

static bool jit__keys_of_value(void *user, const uint8_t key[16]) {
  return jit__keys_add(user, key);
}

static jit_status jit__cache_need_remote(jit__cache *c, const char *what) {
  if (!c || !c->remote)
    return JIT_ERR(JIT_UNAVAILABLE, "%s: no remote cache configured (options.remote_cache "
                   "or $JITML_REMOTE_CACHE)%s", what,
                   c && !c->enabled ? "; it needs the disk cache, which is off" : "");
  return NULL;
}

jit_status jit__cache_push_all(jit__cache *c, jit__cache_progress_fn progress, void *user,
                               uint64_t *pushed, uint64_t *present) {
  *pushed = *present = 0;
  JIT_PROPAGATE(jit__cache_need_remote(c, "cache push"));
  jit__keys k = {0};
  jit_status s = jit__cache_list(c, jit__keys_of_entry, &k);
  if (!s && k.oom) s = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "cache push: out of memory");
  for (uint64_t i = 0; !s && i < k.n; i++) {
    bool there = false;
    s = jit__remote_exists(c->remote, k.keys[i], &there);
    size_t size = 0;
    uint32_t kind = 0;
    uint8_t *bytes = s || there ? NULL : jit__cache_read_entry(c, k.keys[i], &size, &kind);
    if (bytes && (bytes = jit__cache_seal(c, bytes, &size))) {
      s = jit__remote_put_now(c->remote, k.keys[i], bytes, size);
      if (!s) (*pushed)++;
    }
    *present += there;
    free(bytes);
    if (progress) progress(user, i + 1, k.n);
  }
  free(k.keys);
  return s;
}

jit_status jit__cache_pull_all(jit__cache *c, jit__cache_progress_fn progress, void *user,
                               uint64_t *pulled, uint64_t *rejected) {
  *pulled = *rejected = 0;
  JIT_PROPAGATE(jit__cache_need_remote(c, "cache pull"));
  if (c->read_only)
    return JIT_ERR(JIT_CACHE_ERROR, "cache pull: the disk cache %s is read-only", c->dir);
  jit__keys k = {0};
  jit_status s = jit__remote_scan(c->remote, jit__keys_of_value, &k);
  if (!s && k.oom) s = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "cache pull: out of memory");
  for (uint64_t i = 0; !s && i < k.n; i++) {
    char path[PATH_MAX];
    jit__cache_entry_path(c, k.keys[i], path);
    struct stat st;
    if (lstat(path, &st) != 0) {
      jit__fetched result;
      s = jit__cache_fetch_remote(c, k.keys[i], NULL, &result);
      *pulled += result == JIT__FETCHED;
      *rejected += result == JIT__REFUSED;
      if (!s && result == JIT__FAILED)
        s = JIT_ERR(JIT_UNAVAILABLE, "cache pull: the remote cache %s failed",
                    jit__remote_url(c->remote));
    }
    if (progress) progress(user, i + 1, k.n);
  }
  free(k.keys);
  return s;
}
