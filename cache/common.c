//===--- common.c - what the cache's files share ---------------------------===//
//
// The small helpers that opening, reading, writing (cache.c), maintenance
// (maintain.c) and bundles (bundle.c) all use: the cache's clock, its logging,
// entry names, the usability check and releasing an entry. Kept apart so those
// files depend on this one, not on each other in a circle.
//
//===----------------------------------------------------------------------===//
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/hex.h"
#include "cache/internal.h"

int64_t jit__cache_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void jit__cache_logf(jit__cache *cache, jit_log_level level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  jit__logv(&cache->logger, level, fmt, ap);
  va_end(ap);
}

void jit__cache_log_once(jit__cache *cache, unsigned event, jit_log_level level,
                         const char *fmt, ...) {
  pthread_mutex_lock(&cache->mu);
  bool first = !(cache->logged & event);
  cache->logged |= event;
  pthread_mutex_unlock(&cache->mu);
  if (!first) return;
  va_list ap;
  va_start(ap, fmt);
  jit__logv(&cache->logger, level, fmt, ap);
  va_end(ap);
}

void jit__cache_key_hex(const uint8_t key[16], char out[33]) { jit__hex_encode(key, 16, out); }

bool jit__cache_parse_key_hex(const char *hex, uint8_t key[16]) {
  return jit__hex_decode(hex, 16, key);
}

bool jit__cache_parse_entry_name(const char *name, uint8_t key[16]) {
  return strlen(name) == 37 && strcmp(name + 32, ".jitk") == 0 &&
         jit__cache_parse_key_hex(name, key);
}

jit_status jit__cache_check_usable(const jit__cache *cache, const char *what,
                                   bool need_write) {
  if (!cache) return JIT_ERR(JIT_INVALID_ARGUMENT, "%s: cache is NULL", what);
  if (!cache->enabled)
    return JIT_ERR(JIT_UNAVAILABLE, "%s: disk cache disabled: %s", what,
                   cache->disabled_reason);
  if (need_write && cache->read_only)
    return JIT_ERR(JIT_CACHE_ERROR, "%s: cache directory %s is read-only", what,
                   cache->dir);
  return NULL;
}

void jit__cache_entry_release(jit__cache_entry *entry) {
  if (!entry) return;
  free(entry->meta);
  free(entry->payload);
  free(entry->components);
  memset(entry, 0, sizeof(*entry));
}

// A write past RLIMIT_FSIZE (`ulimit -f`) raises SIGXFSZ, whose default action ends
// the process. The writing thread blocks it around its writes, so the write fails with
// EFBIG instead (a dropped put, like a full disk), and takes a SIGXFSZ the write left
// pending before restoring its mask, so the signal is never delivered late.
static void block_xfsz(sigset_t *old) {
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, SIGXFSZ);
  pthread_sigmask(SIG_BLOCK, &s, old);
}

static void restore_xfsz(const sigset_t *old) {
  if (!sigismember(old, SIGXFSZ)) {  // blocked by us: drop what our writes raised
    sigset_t s, pending;
    sigemptyset(&s);
    sigaddset(&s, SIGXFSZ);
    const struct timespec zero = {0, 0};
    while (sigpending(&pending) == 0 && sigismember(&pending, SIGXFSZ) &&
           sigtimedwait(&s, NULL, &zero) == SIGXFSZ) {
    }
  }
  pthread_sigmask(SIG_SETMASK, old, NULL);
}

int jit__cache_write_full(int fd, const void *buf, size_t size) {
  const uint8_t *p = buf;
  sigset_t old;
  block_xfsz(&old);
  int rc = 0;
  while (size > 0) {
    ssize_t n = write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      rc = -1;
      break;
    }
    p += n;
    size -= (size_t)n;
  }
  int err = errno;
  restore_xfsz(&old);
  errno = err;
  return rc;
}
