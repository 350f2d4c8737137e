//===--- verify.c - list and verify the cache's entries --------------------===//
//
// The walks that read entries (jitml cache ls / verify): each entry is opened and
// checked as a get would (cache.c), and a damaged one is removed and counted. Apart
// from maintain.c, which the put path calls for pruning, so that reading and pruning
// do not depend on each other.
//
//===----------------------------------------------------------------------===//
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache/internal.h"

typedef struct read_walk {
  jit__cache_visit_fn visit;  // list
  void *user;
  bool check_body;            // verify
  uint64_t checked, bad;
  bool nomem;
} read_walk;

static bool read_one(jit__cache *cache, void *user, jit__cache_scan_kind kind, const char *path,
                     const uint8_t key[16], const struct stat *st_unused) {
  read_walk *w = user;
  if (kind != JIT__SCAN_ENTRY) return true;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return true;  // evicted meanwhile
  jit__cache_entry entry;
  struct stat st;
  char why[256];
  jit__cache_read_result r = jit__cache_read_fd(cache, fd, key, false, w->check_body,
                                                &entry, &st, why, sizeof(why));
  bool go = true;
  w->checked++;
  if (r == JIT__READ_OK) {
    if (w->visit) go = w->visit(w->user, &entry, path, (uint64_t)st.st_size,
                                (int64_t)st.st_atim.tv_sec);
    jit__cache_entry_release(&entry);
  } else if (r == JIT__READ_BAD) {
    jit__cache_remove_bad(cache, path, fd, why);
    w->bad++;
  } else if (r == JIT__READ_NOMEM) {
    w->nomem = true;
    go = false;
  } else {
    jit__cache_logf(cache, JIT_LOG_WARNING, "cache entry %s: %s (skipped)", path, why);
  }
  close(fd);
  return go;
}

jit_status jit__cache_list(jit__cache *cache, jit__cache_visit_fn fn, void *user) {
  JIT_PROPAGATE(jit__cache_check_usable(cache, "listing the cache", false));
  if (!fn) return JIT_ERR(JIT_INVALID_ARGUMENT, "jit__cache_list: fn is NULL");
  read_walk w = {.visit = fn, .user = user};
  JIT_PROPAGATE(jit__cache_scan(cache, "listing the cache", read_one, &w));
  if (w.nomem)
    return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory listing cache %s", cache->dir);
  return NULL;
}

jit_status jit__cache_verify(jit__cache *cache, uint64_t *checked, uint64_t *bad) {
  if (checked) *checked = 0;
  if (bad) *bad = 0;
  JIT_PROPAGATE(jit__cache_check_usable(cache, "verifying the cache", false));
  read_walk w = {.check_body = true};
  JIT_PROPAGATE(jit__cache_scan(cache, "verifying the cache", read_one, &w));
  if (checked) *checked = w.checked;
  if (bad) *bad = w.bad;
  if (w.nomem)
    return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory verifying cache %s", cache->dir);
  return NULL;
}

