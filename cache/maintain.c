//===--- maintain.c - walk, prune and clear the cache directory ------------===//
//
// Everything that walks the directory. None of it takes a lock that readers wait
// on: an entry removed under a reader stays readable through the reader's open file,
// and a later get just misses. Pruning is the one walk the library starts by itself
// (from a put, never from a get), at most every JIT__PRUNE_INTERVAL_S per process and
// only if no other process pruned within that time (the mtime of <dir>/.last_prune).
//
//===----------------------------------------------------------------------===//
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache/internal.h"

#define JIT__PRUNE_INTERVAL_S 300
// Lock files are tiny; removing old unused ones only keeps the directory tidy.
#define JIT__LOCK_FILE_MAX_AGE_S 3600

bool jit__cache_unlink_if_unlocked(const char *path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return false;
  bool removed = false;
  struct stat a, b;
  // Holding the lock while unlinking: whoever opened the old file and locks it
  // after us sees that the path no longer names it and starts over.
  if (flock(fd, LOCK_EX | LOCK_NB) == 0 && fstat(fd, &a) == 0 && lstat(path, &b) == 0 &&
      a.st_ino == b.st_ino && a.st_dev == b.st_dev)
    removed = unlink(path) == 0;
  close(fd);
  return removed;
}

//===--- Walking the shards -------------------------------------------------------===//

static bool is_shard_name(const char *name) {
  uint8_t k[16];
  char hex[33];
  if (strlen(name) != 2) return false;
  memset(hex, '0', 32);
  hex[0] = name[0];
  hex[1] = name[1];
  hex[32] = '\0';
  return jit__cache_parse_key_hex(hex, k);
}

jit_status jit__cache_scan(jit__cache *cache, const char *what, jit__cache_scan_fn fn,
                           void *user) {
  DIR *top = opendir(cache->dir);
  if (!top)
    return JIT_ERR(JIT_CACHE_ERROR, "%s: cannot read cache directory %s: %s", what,
                   cache->dir, strerror(errno));
  bool go = true;
  struct dirent *d;
  while (go && (d = readdir(top)) != NULL) {
    if (!is_shard_name(d->d_name)) continue;
    char shard[PATH_MAX];
    snprintf(shard, sizeof(shard), "%s/%s", cache->dir, d->d_name);
    // O_NOFOLLOW: a symlink with a shard's name must not lead list, prune or clear
    // (which removes files) out of the cache directory.
    int sfd = openat(dirfd(top), d->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    DIR *sd = sfd < 0 ? NULL : fdopendir(sfd);
    if (!sd) {  // removed meanwhile, a stray file with a shard's name, or a symlink
      if (sfd >= 0) close(sfd);
      continue;
    }
    struct dirent *e;
    while (go && (e = readdir(sd)) != NULL) {
      uint8_t key[16];
      jit__cache_scan_kind kind;
      if (jit__cache_parse_entry_name(e->d_name, key))
        kind = JIT__SCAN_ENTRY;
      else if (strncmp(e->d_name, ".tmp-", 5) == 0)
        kind = JIT__SCAN_TEMP;
      else
        continue;
      struct stat st;
      if (fstatat(dirfd(sd), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
          !S_ISREG(st.st_mode))
        continue;
      char path[PATH_MAX];
      if (snprintf(path, sizeof(path), "%s/%s", shard, e->d_name) >= (int)sizeof(path))
        continue;
      go = fn(cache, user, kind, path, key, &st);
    }
    closedir(sd);
  }
  closedir(top);
  return NULL;
}

//===--- prune and clear -----------------------------------------------------------------===//

typedef struct victim {
  char *path;
  uint64_t size;
  int64_t used_ns;  // last use: max(atime, mtime); gets stamp atime themselves
  dev_t dev;
  ino_t ino;
} victim;

typedef struct prune_walk {
  victim *v;
  size_t n, cap;
  uint64_t total, temps_removed;
  bool clear, nomem;
} prune_walk;

static int64_t stat_ns(struct timespec ts) {
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static bool collect(jit__cache *cache, void *user, jit__cache_scan_kind kind, const char *path,
                    const uint8_t key[16], const struct stat *st) {
  prune_walk *w = user;
  if (kind == JIT__SCAN_TEMP) {
    // A temp file whose flock is free belongs to a writer that died (a live writer
    // holds it from creation to rename).
    if (jit__cache_unlink_if_unlocked(path)) w->temps_removed++;
    return true;
  }
  if (w->n == w->cap) {
    size_t cap = w->cap ? 2 * w->cap : 256;
    victim *nv = realloc(w->v, cap * sizeof(*nv));
    if (!nv) {
      w->nomem = true;
      return false;
    }
    w->v = nv;
    w->cap = cap;
  }
  char *p = strdup(path);
  if (!p) {
    w->nomem = true;
    return false;
  }
  int64_t a = stat_ns(st->st_atim), m = stat_ns(st->st_mtim);
  w->v[w->n++] = (victim){p, (uint64_t)st->st_size, a > m ? a : m, st->st_dev, st->st_ino};
  w->total += (uint64_t)st->st_size;
  return true;
}

static int by_use(const void *a, const void *b) {
  const victim *x = a, *y = b;
  return x->used_ns < y->used_ns ? -1 : x->used_ns > y->used_ns;
}

// Unlinks `v` if its path still names the file seen by the scan (a fresh entry
// renamed over it meanwhile is kept).
static bool remove_victim(const victim *v) {
  struct stat st;
  if (lstat(v->path, &st) != 0 || st.st_ino != v->ino || st.st_dev != v->dev) return false;
  return unlink(v->path) == 0;
}

static void remove_old_lock_files(jit__cache *cache, int64_t max_age_s) {
  char dir[PATH_MAX];
  snprintf(dir, sizeof(dir), "%s/locks", cache->dir);
  DIR *d = opendir(dir);
  if (!d) return;
  int64_t now_s = jit__cache_now_ns() / 1000000000;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    size_t n = strlen(e->d_name);
    struct stat st;
    if (n < 6 || strcmp(e->d_name + n - 5, ".lock") != 0 ||
        fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
        now_s - (int64_t)st.st_mtim.tv_sec < max_age_s)
      continue;
    char path[PATH_MAX];
    if (snprintf(path, sizeof(path), "%s/%s", dir, e->d_name) >= (int)sizeof(path)) continue;
    jit__cache_unlink_if_unlocked(path);
  }
  closedir(d);
}

static jit_status prune_now(jit__cache *cache, const char *what, uint64_t *evicted) {
  prune_walk w = {0};
  jit_status s = jit__cache_scan(cache, what, collect, &w);
  uint64_t removed = 0;
  if (!s && w.nomem)
    s = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "%s: out of memory scanning %s", what, cache->dir);
  if (!s) {
    int64_t now = jit__cache_now_ns();
    int64_t max_age_ns = cache->max_age_s > (uint64_t)INT64_MAX / 1000000000
                             ? INT64_MAX
                             : (int64_t)cache->max_age_s * 1000000000;
    if (w.n) qsort(w.v, w.n, sizeof(*w.v), by_use);  // qsort(NULL, 0) is UB
    // Down to 90% of the limit: puts prune again after writing a tenth of it, so
    // the directory stays under the limit between prunes too.
    uint64_t target = cache->max_bytes - cache->max_bytes / 10;
    uint64_t total = w.total;
    bool over = total > target;
    for (size_t i = 0; i < w.n; i++) {
      bool too_old = cache->max_age_s && now - w.v[i].used_ns > max_age_ns;
      // Sorted oldest first: once one is young enough and the size is fine, so is
      // everything after it.
      if (!too_old && !(over && total > target)) break;
      if (remove_victim(&w.v[i])) removed++;
      total -= w.v[i].size;  // gone either way: evicted, or replaced by someone else
    }
    remove_old_lock_files(cache, JIT__LOCK_FILE_MAX_AGE_S);
    if (removed || w.temps_removed)
      jit__cache_logf(cache, JIT_LOG_INFO,
                     "cache %s: evicted %" PRIu64 " entries (%" PRIu64 " bytes left, limit %"
                     PRIu64 "), removed %" PRIu64 " stale temp files",
                     cache->dir, removed, total, cache->max_bytes, w.temps_removed);
  }
  for (size_t i = 0; i < w.n; i++) free(w.v[i].path);
  free(w.v);
  JIT__CACHE_COUNT(cache, evictions, removed);
  if (evicted) *evicted = removed;
  return s;
}

// Opens the stamp file, whose flock lets one process prune at a time and whose
// mtime says when the last prune (by anyone) started.
static int open_stamp(jit__cache *cache) {
  char path[PATH_MAX];
  snprintf(path, sizeof(path), "%s/.last_prune", cache->dir);
  return open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
}

void jit__cache_maybe_prune(jit__cache *cache, uint64_t bytes_written) {
  int64_t now_s = jit__cache_now_ns() / 1000000000;
  pthread_mutex_lock(&cache->mu);
  cache->bytes_since_prune += bytes_written;
  // Writing a tenth of the limit since the last prune forces one: pruning leaves 90%
  // of the limit, so a burst of puts cannot push the directory past it.
  bool by_size = cache->bytes_since_prune >= cache->max_bytes / 10;
  bool by_time = now_s - cache->last_prune_check_s >= JIT__PRUNE_INTERVAL_S;
  if (by_size || by_time) {
    cache->last_prune_check_s = now_s;
    cache->bytes_since_prune = 0;
  }
  pthread_mutex_unlock(&cache->mu);
  if (!by_size && !by_time) return;

  int fd = open_stamp(cache);
  if (fd < 0) {
    jit__cache_log_once(cache, JIT__LOGGED_PRUNE_FAILED, JIT_LOG_WARNING,
                        "cache %s: cannot open the prune stamp: %s", cache->dir,
                        strerror(errno));
    return;
  }
  struct stat st;
  // Someone else pruning right now: skip, they do the work.
  if (flock(fd, LOCK_EX | LOCK_NB) == 0 && fstat(fd, &st) == 0 &&
      (by_size || now_s - (int64_t)st.st_mtim.tv_sec >= JIT__PRUNE_INTERVAL_S ||
       st.st_size == 0)) {
    (void)futimens(fd, NULL);
    if (st.st_size == 0) (void)jit__cache_write_full(fd, "1", 1);  // "has pruned once"
    jit_status s = prune_now(cache, "pruning the cache", NULL);
    if (s) {
      jit__cache_log_once(cache, JIT__LOGGED_PRUNE_FAILED, JIT_LOG_WARNING, "%s",
                          jit_status_message(s));
      jit_status_free(s);
    }
  }
  close(fd);
}

jit_status jit__cache_prune(jit__cache *cache, uint64_t *evicted) {
  if (evicted) *evicted = 0;
  JIT_PROPAGATE(jit__cache_check_usable(cache, "pruning the cache", true));
  int fd = open_stamp(cache);
  if (fd < 0)
    return JIT_ERR(JIT_CACHE_ERROR, "pruning cache %s: cannot open the prune stamp: %s",
                   cache->dir, strerror(errno));
  // Wait (bounded) for a concurrent automatic prune rather than run two at once.
  for (int i = 0; i < 1000 && flock(fd, LOCK_EX | LOCK_NB) != 0; i++) usleep(10000);
  (void)futimens(fd, NULL);
  jit_status s = prune_now(cache, "pruning the cache", evicted);
  close(fd);
  return s;
}

typedef struct clear_walk {
  uint64_t removed;
} clear_walk;

static bool clear_one(jit__cache *cache, void *user, jit__cache_scan_kind kind, const char *path,
                      const uint8_t key[16], const struct stat *st) {
  clear_walk *w = user;
  if (kind == JIT__SCAN_TEMP)
    jit__cache_unlink_if_unlocked(path);  // a live writer's temp is left to it
  else if (unlink(path) == 0)
    w->removed++;
  return true;
}

jit_status jit__cache_clear(jit__cache *cache, uint64_t *removed) {
  if (removed) *removed = 0;
  JIT_PROPAGATE(jit__cache_check_usable(cache, "clearing the cache", true));
  clear_walk w = {0};
  jit_status s = jit__cache_scan(cache, "clearing the cache", clear_one, &w);
  remove_old_lock_files(cache, 0);
  if (removed) *removed = w.removed;
  jit__cache_logf(cache, JIT_LOG_INFO, "cache %s: cleared %" PRIu64 " entries", cache->dir,
                 w.removed);
  return s;
}
