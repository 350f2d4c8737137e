//===--- cache.c - opening the cache, get, put, per-key locks --------------===//
//
// The hot paths. A get is open + fstat + two or three preads + one futimens, with no
// lock: entries are only ever renamed into place whole, so a reader sees either the
// old file, the new one, or none. Everything that scans the directory lives in
// maintain.c; bundles in bundle.c.
//
//===----------------------------------------------------------------------===//
#ifndef _GNU_SOURCE
#define _GNU_SOURCE  // mkostemp, O_CLOEXEC/O_NOFOLLOW spelled without feature macros
#endif

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "base/hex.h"
#include "cache/internal.h"

//===--- Small helpers ----------------------------------------------------------===//

static char *strdup_printf(const char *fmt, ...) JIT__PRINTF(1, 2);
static char *strdup_printf(const char *fmt, ...) {
  va_list ap, ap2;
  va_start(ap, fmt);
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap2);
  va_end(ap2);
  char *s = n < 0 ? NULL : malloc((size_t)n + 1);
  if (s) vsnprintf(s, (size_t)n + 1, fmt, ap);
  va_end(ap);
  return s;
}

void jit__cache_entry_path(const jit__cache *cache, const uint8_t key[16], char *out) {
  char hex[33];
  jit__cache_key_hex(key, hex);
  snprintf(out, PATH_MAX, "%s/%.2s/%s.jitk", cache->dir, hex, hex);
}

int jit__cache_pread_full(int fd, void *buf, size_t size, uint64_t offset) {
  uint8_t *p = buf;
  while (size > 0) {
    ssize_t n = pread(fd, p, size, (off_t)offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -1;
    if (n == 0) {  // the file shrank under us: report it as damage, not as EOF
      errno = ENODATA;
      return -1;
    }
    p += n;
    size -= (size_t)n;
    offset += (uint64_t)n;
  }
  return 0;
}


//===--- Header encoding ----------------------------------------------------------===//

void jit__cache_header_encode(const jit__cache_header *h,
                              uint8_t out[JIT__CACHE_HEADER_SIZE]) {
  memset(out, 0, JIT__CACHE_HEADER_SIZE);
  memcpy(out, JIT__CACHE_MAGIC, 8);
  jit__le_put_u32(out + 8, h->version);
  jit__le_put_u32(out + 12, JIT__CACHE_HEADER_SIZE);
  memcpy(out + 16, h->key, 16);
  jit__le_put_u32(out + 32, h->kind);
  jit__le_put_u64(out + 40, h->meta_size);
  jit__le_put_u64(out + 48, h->components_size);
  jit__le_put_u64(out + 56, h->payload_size);
  memcpy(out + 64, h->body_hash, 16);
  jit__le_put_u64(out + 80, XXH3_64bits(out, 80));
}

static bool valid_kind(uint32_t kind) {
  return kind >= JIT__PAYLOAD_CPU_OBJECT && kind <= JIT__PAYLOAD_HOT_LIST;
}

bool jit__cache_header_decode(const uint8_t in[JIT__CACHE_HEADER_SIZE],
                              jit__cache_header *h, char *why, size_t why_size) {
  if (memcmp(in, JIT__CACHE_MAGIC, 8) != 0) {
    snprintf(why, why_size, "bad magic (not a libjitml cache entry)");
    return false;
  }
  h->version = jit__le_get_u32(in + 8);
  if (h->version != JIT__CACHE_FORMAT_VERSION) {
    snprintf(why, why_size, "format version %" PRIu32 ", this library reads %d",
             h->version, JIT__CACHE_FORMAT_VERSION);
    return false;
  }
  if (jit__le_get_u64(in + 80) != XXH3_64bits(in, 80)) {
    snprintf(why, why_size, "header checksum mismatch");
    return false;
  }
  uint32_t header_size = jit__le_get_u32(in + 12), flags = jit__le_get_u32(in + 36);
  if (header_size != JIT__CACHE_HEADER_SIZE || flags != 0 || jit__le_get_u64(in + 88) != 0) {
    snprintf(why, why_size, "unexpected header size %" PRIu32 " or flags %" PRIu32,
             header_size, flags);
    return false;
  }
  memcpy(h->key, in + 16, 16);
  h->kind = jit__le_get_u32(in + 32);
  h->meta_size = jit__le_get_u64(in + 40);
  h->components_size = jit__le_get_u64(in + 48);
  h->payload_size = jit__le_get_u64(in + 56);
  memcpy(h->body_hash, in + 64, 16);
  if (!valid_kind(h->kind)) {
    snprintf(why, why_size, "unknown payload kind %" PRIu32, h->kind);
    return false;
  }
  if (h->meta_size > JIT__CACHE_MAX_META ||
      h->components_size > JIT__CACHE_MAX_COMPONENTS ||
      h->payload_size > JIT__CACHE_MAX_PAYLOAD) {
    snprintf(why, why_size,
             "absurd lengths (meta %" PRIu64 ", components %" PRIu64 ", payload %" PRIu64
             ")",
             h->meta_size, h->components_size, h->payload_size);
    return false;
  }
  return true;
}

uint64_t jit__cache_header_file_size(const jit__cache_header *h) {
  // Cannot overflow: each length is bounded by decode.
  return JIT__CACHE_HEADER_SIZE + h->meta_size + h->components_size + h->payload_size;
}

static bool check_key(const jit__cache_header *h, const uint8_t *key, char *why,
                      size_t why_size) {
  if (!key || memcmp(h->key, key, 16) == 0) return true;
  char hex[33];
  jit__cache_key_hex(h->key, hex);
  snprintf(why, why_size, "header holds key %s, not the key of its file name", hex);
  return false;
}

static bool check_body_hash(const jit__cache_header *h, XXH128_hash_t got, char *why,
                            size_t why_size) {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, got);
  if (memcmp(c.digest, h->body_hash, 16) == 0) return true;
  snprintf(why, why_size, "checksum mismatch (damaged contents)");
  return false;
}

bool jit__cache_check_bytes(const uint8_t *bytes, uint64_t size, const uint8_t *key,
                            jit__cache_header *out_header, char *why, size_t why_size) {
  if (size < JIT__CACHE_HEADER_SIZE) {
    snprintf(why, why_size, "truncated: %" PRIu64 " bytes, shorter than the header",
             size);
    return false;
  }
  if (!jit__cache_header_decode(bytes, out_header, why, why_size) ||
      !check_key(out_header, key, why, why_size))
    return false;
  uint64_t want = jit__cache_header_file_size(out_header);
  if (want != size) {
    snprintf(why, why_size, "length %" PRIu64 " bytes, header says %" PRIu64, size,
             want);
    return false;
  }
  return check_body_hash(out_header,
                         XXH3_128bits(bytes + JIT__CACHE_HEADER_SIZE,
                                      (size_t)(size - JIT__CACHE_HEADER_SIZE)),
                         why, why_size);
}

//===--- Opening -------------------------------------------------------------------===//

// mkdir -p with 0700 for every directory it creates (XDG asks the same of
// $XDG_CACHE_HOME). Existing directories are left as they are; their permissions
// are judged afterwards.
static int make_dirs(const char *path) {
  char buf[PATH_MAX];
  size_t n = strlen(path);
  if (n == 0 || n >= sizeof(buf)) {
    errno = ENAMETOOLONG;
    return -1;
  }
  memcpy(buf, path, n + 1);
  for (size_t i = 1; i <= n; i++) {
    if (buf[i] != '/' && buf[i] != '\0') continue;
    char saved = buf[i];
    buf[i] = '\0';
    if (mkdir(buf, 0700) != 0 && errno != EEXIST) {
      int err = errno;
      struct stat st;
      // EACCES on an existing parent we may not write (e.g. /home) is fine.
      if (stat(buf, &st) != 0 || !S_ISDIR(st.st_mode)) {
        errno = err;
        return -1;
      }
    }
    buf[i] = saved;
  }
  return 0;
}

// The configured directory, or NULL with *reason set (disabled or out of memory:
// *reason NULL too).
static char *resolve_dir(const jit__cache_options *options, char **reason) {
  *reason = NULL;
  const char *dir = options->dir;
  if (dir) {
    if (!*dir) *reason = strdup_printf("the disk cache is turned off (cache dir \"\")");
    return *dir ? strdup(dir) : NULL;
  }
  const char *env = getenv("JITML_CACHE_DIR");
  if (env) {
    if (!*env) *reason = strdup_printf("the disk cache is turned off (JITML_CACHE_DIR=\"\")");
    return *env ? strdup(env) : NULL;
  }
  // XDG: a relative $XDG_CACHE_HOME is invalid and must be ignored.
  const char *xdg = getenv("XDG_CACHE_HOME");
  if (xdg && xdg[0] == '/') return strdup_printf("%s/jitml", xdg);
  const char *home = getenv("HOME");
  if (home && *home) return strdup_printf("%s/.cache/jitml", home);
  *reason = strdup_printf(
      "no cache directory: none given, and JITML_CACHE_DIR, XDG_CACHE_HOME and HOME "
      "are unset");
  return NULL;
}

static uint64_t parse_size(const char *s) {
  if (!s || !*s) return 0;
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s) return 0;
  int shift = 0;
  switch (*end) {
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    default: break;
  }
  if (*end || v > (UINT64_MAX >> shift)) return 0;
  return (uint64_t)v << shift;
}

// Judges the (existing) directory: usable, read-only, or refused (returns a reason).
// Entries hold object code that is loaded and run, so anyone who can write the
// directory can run code in this process: only its owner may.
static char *check_dir(jit__cache *c, const char *dir, const jit__cache_options *o) {
  struct stat st;
  if (stat(dir, &st) != 0)
    return strdup_printf("cache directory %s: stat failed: %s", dir, strerror(errno));
  if (!S_ISDIR(st.st_mode))
    return strdup_printf("cache directory %s is not a directory", dir);
  // Entry, temp and lock paths add at most ~60 bytes to it; keeping room for them
  // means no path built later is ever truncated.
  if (strlen(dir) > PATH_MAX - 128)
    return strdup_printf("cache directory path is too long (%zu bytes)", strlen(dir));
  if (st.st_mode & (S_IWGRP | S_IWOTH))
    return strdup_printf(
        "cache directory %s is writable by group or others (mode 0%03o): refused, "
        "since loading kernels from it would run code others can plant (chmod 700 it)",
        dir, (unsigned)(st.st_mode & 0777));
  uid_t me = geteuid();
  c->owner = st.st_uid;
  if (st.st_uid != me) {
    if (st.st_uid == 0 && o->allow_shared_readonly) {
      c->read_only = true;
      jit__cache_logf(c, JIT_LOG_INFO, "cache directory %s: shared root-owned cache, read-only",
                     dir);
      return NULL;
    }
    return strdup_printf(
        "cache directory %s is owned by uid %u, not by this user (uid %u): refused%s", dir,
        (unsigned)st.st_uid, (unsigned)me,
        st.st_uid == 0 ? " (a root-owned shared cache needs allow_shared_readonly)" : "");
  }
  if (access(dir, W_OK | X_OK) != 0) {
    c->read_only = true;
    jit__cache_logf(c, JIT_LOG_WARNING,
                   "cache directory %s is not writable (%s): using it read-only, new "
                   "kernels are not stored",
                   dir, strerror(errno));
  }
  return NULL;
}

jit_status jit__cache_open(const jit__cache_options *options, jit__cache **out_cache) {
  if (!out_cache) return JIT_ERR(JIT_INVALID_ARGUMENT, "jit__cache_open: out_cache is NULL");
  *out_cache = NULL;
  static const jit__cache_options defaults;
  if (!options) options = &defaults;
  jit__cache *c = calloc(1, sizeof(*c));
  if (!c) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory opening the kernel cache");
  pthread_mutex_init(&c->mu, NULL);
  c->logger = options->logger;
  c->max_age_s = options->max_age_s;
  c->fault_kill_after_bytes = options->fault_kill_after_bytes;
  if (options->trusted) c->trusted = *options->trusted;
  c->max_bytes = options->max_bytes ? options->max_bytes
                                    : parse_size(getenv("JITML_CACHE_MAX_BYTES"));
  if (!c->max_bytes) c->max_bytes = UINT64_C(1) << 30;

  char *reason = NULL;
  char *dir = resolve_dir(options, &reason);
  if (dir) {
    if (make_dirs(dir) != 0) {
      reason = strdup_printf("cannot create cache directory %s: %s", dir, strerror(errno));
    } else {
      // Absolute, so later calls do not depend on the working directory.
      char *abs = realpath(dir, NULL);
      if (!abs) {
        reason = strdup_printf("cache directory %s: %s", dir, strerror(errno));
      } else {
        reason = check_dir(c, abs, options);
        if (!reason) {
          free(dir);
          c->dir = abs;
          c->enabled = true;
          jit__cache_logf(c, JIT_LOG_DEBUG, "kernel cache at %s (limit %" PRIu64 " bytes)%s",
                         abs, c->max_bytes, c->read_only ? ", read-only" : "");
          jit_status s = jit__cache_open_remote(c, options);
          if (s) {
            jit__cache_close(c);
            return s;
          }
          *out_cache = c;
          return NULL;
        }
        free(abs);
      }
    }
    free(dir);
  }
  c->dir = strdup("");
  c->disabled_reason = reason ? reason : strdup("the disk cache is disabled");
  if (!c->dir || !c->disabled_reason) {
    jit__cache_close(c);
    return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory opening the kernel cache");
  }
  // Turned off on purpose is not worth a warning; an unusable directory is.
  bool on_purpose = (options->dir && !*options->dir) ||
                    (!options->dir && getenv("JITML_CACHE_DIR") &&
                     !*getenv("JITML_CACHE_DIR"));
  jit__cache_logf(c, on_purpose ? JIT_LOG_INFO : JIT_LOG_WARNING,
                 "disk kernel cache disabled, kernels are kept in memory only: %s",
                 c->disabled_reason);
  (void)jit__cache_open_remote(c, options);  // only logs that it is not used
  *out_cache = c;
  return NULL;
}

void jit__cache_close(jit__cache *cache) {
  if (!cache) return;
  jit__remote_close(cache->remote);  // sends what is queued first
  jit__sign_wipe(cache->remote_secret, sizeof cache->remote_secret);
  pthread_mutex_destroy(&cache->mu);
  free(cache->dir);
  free(cache->disabled_reason);
  free(cache);
}

bool jit__cache_enabled(const jit__cache *cache) { return cache && cache->enabled; }
bool jit__cache_read_only(const jit__cache *cache) {
  return cache && cache->enabled && cache->read_only;
}
const char *jit__cache_dir(const jit__cache *cache) { return cache ? cache->dir : ""; }
const char *jit__cache_disabled_reason(const jit__cache *cache) {
  return cache ? cache->disabled_reason : "no cache";
}

void jit__cache_get_stats(jit__cache *cache, jit__cache_stats *out) {
  if (!out) return;
  memset(out, 0, sizeof(*out));
  if (!cache) return;
  pthread_mutex_lock(&cache->mu);
  *out = cache->stats;
  pthread_mutex_unlock(&cache->mu);
  if (cache->remote) jit__remote_get_stats(cache->remote, &out->remote);
}

//===--- Reading entries --------------------------------------------------------------===//

jit__cache_read_result jit__cache_read_fd(jit__cache *cache, int fd, const uint8_t *key,
                                          bool load_payload, bool check_body,
                                          jit__cache_entry *out, struct stat *out_st,
                                          char *why, size_t why_size) {
  memset(out, 0, sizeof(*out));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    snprintf(why, why_size, "fstat failed: %s", strerror(errno));
    return JIT__READ_IO;
  }
  if (out_st) *out_st = st;
  if (!S_ISREG(st.st_mode)) {
    snprintf(why, why_size, "not a regular file");
    return JIT__READ_BAD;
  }
  // The directory check keeps others out; this catches a file that got in anyway
  // (copied in with its owner kept, or made writable by a careless chmod -R).
  if (st.st_uid != cache->owner || (st.st_mode & (S_IWGRP | S_IWOTH))) {
    snprintf(why, why_size, "owned by uid %u with mode 0%03o, expected uid %u and no "
             "group/other write", (unsigned)st.st_uid, (unsigned)(st.st_mode & 0777),
             (unsigned)cache->owner);
    return JIT__READ_BAD;
  }
  uint64_t size = (uint64_t)st.st_size;
  if (size < JIT__CACHE_HEADER_SIZE) {
    snprintf(why, why_size, "truncated: %" PRIu64 " bytes, shorter than the header", size);
    return JIT__READ_BAD;
  }
  uint8_t raw[JIT__CACHE_HEADER_SIZE];
  if (jit__cache_pread_full(fd, raw, sizeof(raw), 0) != 0) {
    snprintf(why, why_size, "reading the header failed: %s", strerror(errno));
    return errno == ENODATA ? JIT__READ_BAD : JIT__READ_IO;
  }
  jit__cache_header h;
  if (!jit__cache_header_decode(raw, &h, why, why_size) || !check_key(&h, key, why, why_size))
    return JIT__READ_BAD;
  uint64_t want = jit__cache_header_file_size(&h);
  if (want != size) {
    snprintf(why, why_size, "truncated or padded: %" PRIu64 " bytes, header says %" PRIu64,
             size, want);
    return JIT__READ_BAD;
  }

  memcpy(out->key, h.key, 16);
  out->kind = (jit__payload_kind)h.kind;
  out->meta_size = (size_t)h.meta_size;
  out->payload_size = (size_t)h.payload_size;
  out->meta = h.meta_size ? malloc((size_t)h.meta_size) : NULL;
  out->components = malloc((size_t)h.components_size + 1);
  if ((h.meta_size && !out->meta) || !out->components) goto nomem;
  if (load_payload && h.payload_size) {
    out->payload = malloc((size_t)h.payload_size);
    if (!out->payload) goto nomem;
  }

  uint64_t off = JIT__CACHE_HEADER_SIZE;
  if (jit__cache_pread_full(fd, out->meta, out->meta_size, off) != 0 ||
      jit__cache_pread_full(fd, out->components, (size_t)h.components_size,
                            off + h.meta_size) != 0)
    goto read_failed;
  out->components[h.components_size] = '\0';
  off += h.meta_size + h.components_size;
  if (load_payload && jit__cache_pread_full(fd, out->payload, out->payload_size, off) != 0)
    goto read_failed;
  if (!check_body)
    return JIT__READ_OK;

  XXH3_state_t *state = XXH3_createState();
  if (!state) goto nomem;
  XXH3_128bits_reset(state);
  XXH3_128bits_update(state, out->meta, out->meta_size);
  XXH3_128bits_update(state, out->components, (size_t)h.components_size);
  if (load_payload) {
    XXH3_128bits_update(state, out->payload, out->payload_size);
  } else {
    // verify/list: stream the payload instead of holding it.
    uint8_t buf[65536];
    for (uint64_t left = h.payload_size; left > 0;) {
      size_t n = left < sizeof(buf) ? (size_t)left : sizeof(buf);
      if (jit__cache_pread_full(fd, buf, n, off) != 0) {
        XXH3_freeState(state);
        goto read_failed;
      }
      XXH3_128bits_update(state, buf, n);
      off += n;
      left -= n;
    }
  }
  XXH128_hash_t got = XXH3_128bits_digest(state);
  XXH3_freeState(state);
  if (!check_body_hash(&h, got, why, why_size)) {
    jit__cache_entry_release(out);
    return JIT__READ_BAD;
  }
  return JIT__READ_OK;

read_failed:
  snprintf(why, why_size, "reading failed: %s", strerror(errno));
  jit__cache_entry_release(out);
  return errno == ENODATA ? JIT__READ_BAD : JIT__READ_IO;
nomem:
  snprintf(why, why_size, "out of memory");
  jit__cache_entry_release(out);
  return JIT__READ_NOMEM;
}

void jit__cache_remove_bad(jit__cache *cache, const char *path, int fd, const char *why) {
  struct stat open_st, path_st;
  bool removed = false;
  if (!cache->read_only && fstat(fd, &open_st) == 0 && lstat(path, &path_st) == 0 &&
      open_st.st_dev == path_st.st_dev && open_st.st_ino == path_st.st_ino)
    removed = unlink(path) == 0;
  JIT__CACHE_COUNT(cache, bad_entries, 1);
  jit__cache_logf(cache, JIT_LOG_WARNING, "bad cache entry %s: %s; %s", path, why,
                 removed ? "removed, it will be recompiled" : "ignored (not removed)");
}

jit_status jit__cache_get(jit__cache *cache, const uint8_t key[16],
                          jit__cache_entry *out, bool *found) {
  if (found) *found = false;
  if (out) memset(out, 0, sizeof(*out));
  if (!cache || !key || !out || !found)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "jit__cache_get: NULL %s",
                   !cache ? "cache" : !key ? "key" : !out ? "out" : "found");
  if (!cache->enabled) {
    JIT__CACHE_COUNT(cache, misses, 1);
    return NULL;
  }
  char path[PATH_MAX];
  jit__cache_entry_path(cache, key, path);
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    if (errno != ENOENT && errno != ENOTDIR)
      jit__cache_log_once(cache, JIT__LOGGED_READ_FAILED, JIT_LOG_WARNING,
                          "cache entry %s: open failed: %s (treated as a miss)", path,
                          strerror(errno));
    JIT__CACHE_COUNT(cache, misses, 1);
    return NULL;
  }
  char why[256];
  struct stat st;
  jit__cache_read_result r =
      jit__cache_read_fd(cache, fd, key, true, true, out, &st, why, sizeof(why));
  if (r == JIT__READ_OK) {
    // LRU by our own access stamp: relatime/noatime mounts would not keep atime
    // fresh. An exact clock (not UTIME_NOW's coarse tick) keeps the order of hits
    // that land within one tick. Fails harmlessly on a shared read-only cache.
    struct timespec ts[2];
    int64_t now = jit__cache_now_ns();
    ts[0].tv_sec = (time_t)(now / 1000000000);
    ts[0].tv_nsec = (long)(now % 1000000000);
    ts[1].tv_sec = 0;
    ts[1].tv_nsec = UTIME_OMIT;
    if (!cache->read_only && futimens(fd, ts) != 0)
      jit__cache_log_once(cache, JIT__LOGGED_TOUCH_FAILED, JIT_LOG_DEBUG,
                          "cache entry %s: updating its access time failed: %s", path,
                          strerror(errno));
    pthread_mutex_lock(&cache->mu);
    cache->stats.hits++;
    cache->stats.bytes_read += (uint64_t)st.st_size;
    pthread_mutex_unlock(&cache->mu);
    *found = true;
  } else if (r == JIT__READ_BAD) {
    jit__cache_remove_bad(cache, path, fd, why);
    JIT__CACHE_COUNT(cache, misses, 1);
  } else if (r == JIT__READ_IO) {
    jit__cache_log_once(cache, JIT__LOGGED_READ_FAILED, JIT_LOG_WARNING,
                        "cache entry %s: %s (treated as a miss)", path, why);
    JIT__CACHE_COUNT(cache, misses, 1);
  }
  close(fd);
  if (r == JIT__READ_NOMEM)
    return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory loading cache entry %s", path);
  return NULL;
}

//===--- Writing entries --------------------------------------------------------------===//

// Creates the temp file for `key` in its shard directory, locked with flock so that a
// pruner can tell a live writer's temp file from one a crashed process left behind.
// Retries when a concurrent clear/prune removed the directory or the file between
// creation and locking.
static int create_temp(jit__cache *cache, const char *hex, char *tmp, const char **what) {
  for (int attempt = 0; attempt < 4; attempt++) {
    snprintf(tmp, PATH_MAX, "%s/%.2s", cache->dir, hex);
    *what = "creating the shard directory";
    if (mkdir(tmp, 0700) != 0 && errno != EEXIST) return -1;
    // Checked like the root: a real directory (lstat: not a symlink planted to send
    // writes elsewhere), ours, writable by no one else.
    struct stat sd;
    if (lstat(tmp, &sd) != 0) return -1;
    if (!S_ISDIR(sd.st_mode) || sd.st_uid != geteuid() || (sd.st_mode & 022)) {
      *what = "creating the shard directory (the path is there but is no directory of "
              "ours with mode 0700)";
      errno = S_ISDIR(sd.st_mode) ? EPERM : ENOTDIR;
      return -1;
    }
    snprintf(tmp, PATH_MAX, "%s/%.2s/.tmp-%s-XXXXXX", cache->dir, hex, hex);
    *what = "creating a temp file";
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) continue;
      return -1;
    }
    struct stat a, b;
    if (flock(fd, LOCK_EX | LOCK_NB) == 0 && fstat(fd, &a) == 0 && lstat(tmp, &b) == 0 &&
        a.st_ino == b.st_ino && a.st_dev == b.st_dev)
      return fd;
    close(fd);  // a pruner took it as stale; it unlinks it
  }
  errno = EAGAIN;
  return -1;
}

bool jit__cache_write_atomic(jit__cache *cache, const uint8_t key[16],
                             const struct iovec *iov, int iov_count, int payload_iov) {
  char hex[33], tmp[PATH_MAX], path[PATH_MAX];
  jit__cache_key_hex(key, hex);
  jit__cache_entry_path(cache, key, path);
  const char *what = NULL;
  int fd = create_temp(cache, hex, tmp, &what);
  if (fd < 0) goto failed_no_temp;

  for (int i = 0; i < iov_count; i++) {
    const uint8_t *p = iov[i].iov_base;
    size_t n = iov[i].iov_len;
    what = "writing";
    if (i == payload_iov && cache->fault_kill_after_bytes &&
        cache->fault_kill_after_bytes < n) {
      // Test hook: die the way a crash or kill -9 would, mid-payload.
      (void)jit__cache_write_full(fd, p, (size_t)cache->fault_kill_after_bytes);
      raise(SIGKILL);
    }
    if (jit__cache_write_full(fd, p, n) != 0) goto failed;
  }
  what = "setting permissions";
  if (fchmod(fd, 0600) != 0) goto failed;
  struct timespec ts[2];
  int64_t now = jit__cache_now_ns();
  ts[0].tv_sec = (time_t)(now / 1000000000);
  ts[0].tv_nsec = (long)(now % 1000000000);
  ts[1] = ts[0];
  (void)futimens(fd, ts);  // only the LRU order; the kernel's stamp will do otherwise
  what = "fsync";
  if (fsync(fd) != 0) goto failed;
  // The directory is not fsync'ed: after a power loss the entry may be missing,
  // which is a miss, never a partial file.
  what = "renaming into place";
  if (rename(tmp, path) != 0) goto failed;
  close(fd);
  return true;

failed:;
  int err = errno;
  unlink(tmp);
  close(fd);
  errno = err;
failed_no_temp:
  JIT__CACHE_COUNT(cache, puts_dropped, 1);
  jit__cache_log_once(cache, JIT__LOGGED_PUT_FAILED, JIT_LOG_WARNING,
                      "cache put %s: %s failed: %s; the kernel stays in memory only "
                      "(further put failures are not logged)",
                      path, what, strerror(errno));
  return false;
}

jit_status jit__cache_put(jit__cache *cache, const jit__cache_entry *entry) {
  if (!cache || !entry)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "jit__cache_put: NULL %s", !cache ? "cache" : "entry");
  if (!valid_kind((uint32_t)entry->kind) || (entry->meta_size && !entry->meta) ||
      (entry->payload_size && !entry->payload))
    return JIT_ERR(JIT_INVALID_ARGUMENT,
                   "jit__cache_put: bad entry (kind %d, meta %p/%zu, payload %p/%zu)",
                   (int)entry->kind, entry->meta, entry->meta_size, entry->payload,
                   entry->payload_size);
  if (!cache->enabled) {
    JIT__CACHE_COUNT(cache, puts_dropped, 1);
    return NULL;
  }
  size_t components_size = entry->components ? strlen(entry->components) : 0;
  if (entry->meta_size > JIT__CACHE_MAX_META || components_size > JIT__CACHE_MAX_COMPONENTS ||
      entry->payload_size > JIT__CACHE_MAX_PAYLOAD) {
    JIT__CACHE_COUNT(cache, puts_dropped, 1);
    jit__cache_logf(cache, JIT_LOG_WARNING,
                   "cache put: entry too large to store (meta %zu, payload %zu bytes)",
                   entry->meta_size, entry->payload_size);
    return NULL;
  }

  jit__cache_header h;
  memset(&h, 0, sizeof(h));
  h.version = JIT__CACHE_FORMAT_VERSION;
  memcpy(h.key, entry->key, 16);
  h.kind = (uint32_t)entry->kind;
  h.meta_size = entry->meta_size;
  h.components_size = components_size;
  h.payload_size = entry->payload_size;
  XXH3_state_t *state = XXH3_createState();
  if (!state) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory storing a cache entry");
  XXH3_128bits_reset(state);
  XXH3_128bits_update(state, entry->meta, entry->meta_size);
  XXH3_128bits_update(state, entry->components, components_size);
  XXH3_128bits_update(state, entry->payload, entry->payload_size);
  XXH128_canonical_t canon;
  XXH128_canonicalFromHash(&canon, XXH3_128bits_digest(state));
  XXH3_freeState(state);
  memcpy(h.body_hash, canon.digest, 16);
  uint8_t raw[JIT__CACHE_HEADER_SIZE];
  jit__cache_header_encode(&h, raw);

  struct iovec iov[4] = {
      {raw, sizeof(raw)},
      {entry->meta, entry->meta_size},
      {entry->components, components_size},
      {entry->payload, entry->payload_size},
  };
  jit__cache_push(cache, entry->key, h.kind, iov, 4);
  if (cache->read_only) {
    JIT__CACHE_COUNT(cache, puts_dropped, 1);
    jit__cache_log_once(cache, JIT__LOGGED_READ_ONLY_PUT, JIT_LOG_INFO,
                        "cache directory %s is read-only: new kernels are not stored",
                        cache->dir);
    return NULL;
  }
  if (!jit__cache_write_atomic(cache, entry->key, iov, 4, 3)) return NULL;
  uint64_t total = jit__cache_header_file_size(&h);
  pthread_mutex_lock(&cache->mu);
  cache->stats.puts++;
  cache->stats.bytes_written += total;
  pthread_mutex_unlock(&cache->mu);
  jit__cache_maybe_prune(cache, total);
  return NULL;
}

//===--- Per-key locks ------------------------------------------------------------------===//

void jit__cache_lock_key(jit__cache *cache, const uint8_t key[16], int timeout_ms,
                         jit__cache_lock *out_lock, bool *acquired) {
  if (acquired) *acquired = false;
  if (out_lock) {
    out_lock->fd = -1;
    out_lock->cache = NULL;
  }
  if (!cache || !key || !out_lock || !acquired || !cache->enabled || cache->read_only)
    return;
  char hex[33], path[PATH_MAX];
  jit__cache_key_hex(key, hex);
  snprintf(path, sizeof(path), "%s/locks", cache->dir);
  if (mkdir(path, 0700) != 0 && errno != EEXIST) {
    jit__cache_log_once(cache, JIT__LOGGED_LOCK_FAILED, JIT_LOG_WARNING,
                        "cache lock directory %s: mkdir failed: %s (compiling unlocked)",
                        path, strerror(errno));
    return;
  }
  snprintf(path, sizeof(path), "%s/locks/%s.lock", cache->dir, hex);
  int64_t deadline = jit__cache_now_ns() + (int64_t)(timeout_ms < 0 ? 0 : timeout_ms) * 1000000;
  long sleep_us = 500;
  for (;;) {
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
      jit__cache_log_once(cache, JIT__LOGGED_LOCK_FAILED, JIT_LOG_WARNING,
                          "cache lock %s: open failed: %s (compiling unlocked)", path,
                          strerror(errno));
      return;
    }
    for (;;) {
      if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
        // A pruner may have unlinked the lock file between our open and flock; a
        // lock on an unlinked file excludes no one, so start again on the new one.
        struct stat a, b;
        if (fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_ino == b.st_ino &&
            a.st_dev == b.st_dev) {
          out_lock->fd = fd;
          *acquired = true;
          return;
        }
        break;
      }
      if (errno == EINTR) continue;
      if (errno != EWOULDBLOCK) {
        jit__cache_log_once(cache, JIT__LOGGED_LOCK_FAILED, JIT_LOG_WARNING,
                            "cache lock %s: flock failed: %s (compiling unlocked)", path,
                            strerror(errno));
        close(fd);
        return;
      }
      int64_t left_ns = deadline - jit__cache_now_ns();
      if (left_ns <= 0) {
        close(fd);
        JIT__CACHE_COUNT(cache, lock_timeouts, 1);
        jit__cache_logf(cache, JIT_LOG_DEBUG,
                       "cache lock %s: still held after %d ms, compiling anyway", path,
                       timeout_ms);
        return;
      }
      // Poll with a growing sleep: flock has no timed wait, and a signal-based
      // timeout would disturb the host program.
      long us = sleep_us;
      if ((int64_t)us * 1000 > left_ns) us = (long)(left_ns / 1000) + 1;
      struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
      nanosleep(&ts, NULL);
      if (sleep_us < 20000) sleep_us *= 2;
    }
    close(fd);
  }
}

void jit__cache_unlock(jit__cache_lock *lock) {
  if (!lock) return;
  // The fleet lock goes after this process's queued puts (remote.c).
  if (lock->cache) jit__remote_unlock(lock->cache->remote, lock->key, &lock->token);
  lock->cache = NULL;
  if (lock->fd < 0) return;
  close(lock->fd);  // releases the flock; the file stays for the next locker
  lock->fd = -1;
}
