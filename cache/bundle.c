//===--- bundle.c - export and import a prewarmed cache as one file --------===//
//
// A bundle ships a cache to another machine of the same target:
//
//   header (64 bytes, little-endian)
//      0  8  magic "JITMLB\0\1"
//      8  4  bundle version (1)
//     12  4  entry format version (JIT__CACHE_FORMAT_VERSION)
//     16  8  entry count
//     24  8  manifest size
//     32 16  XXH3-128 of the manifest (canonical)
//     48  8  XXH3-64 of bytes 0..47
//     56  8  reserved (0)
//   manifest: text, "jitml-bundle 1\n" "build-id <hex>\n", then one line per entry:
//             "<32 hex key> <kind> <size>\n"
//   the entry files' bytes, in manifest order, each exactly as stored in the cache
//   bundle version 2 only: a signature trailer (cache/sign.h) over everything above
//
// Every entry carries its own header and checksums, so import checks each one as a
// cache get would, against the key the manifest gives it. Import checks the whole
// bundle before storing anything: a damaged bundle imports nothing. A signed bundle
// (version 2) is checked first of all: where the cache trusts keys, only a bundle
// signed by one of them goes on (version 1, unsigned, is refused there); the version
// sits under the signature, so stripping the trailer does not make a signed bundle an
// acceptable unsigned one. Import reads the bundle through one descriptor: a file that
// someone else may rewrite during the import is not a source to import from.
//
//===----------------------------------------------------------------------===//
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "cache/internal.h"

#define BUNDLE_MAGIC "JITMLB\0\1"
#define BUNDLE_VERSION 1         // unsigned
#define BUNDLE_VERSION_SIGNED 2  // with a signature trailer
#define MANIFEST_VERSION 1
#define BUNDLE_HEADER_SIZE 64
#define BUNDLE_MAX_MANIFEST (UINT64_C(256) << 20)
#define ENTRY_MAX_SIZE                                                       \
  (JIT__CACHE_HEADER_SIZE + JIT__CACHE_MAX_META + JIT__CACHE_MAX_COMPONENTS + \
   JIT__CACHE_MAX_PAYLOAD)

typedef struct strbuf {
  char *data;
  size_t len, cap;
  bool nomem;
} strbuf;

static void sb_printf(strbuf *sb, const char *fmt, ...) JIT__PRINTF(2, 3);
static void sb_printf(strbuf *sb, const char *fmt, ...) {
  if (sb->nomem) return;
  char line[256];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line, sizeof(line), fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= sizeof(line)) n = 0;
  if (sb->len + (size_t)n + 1 > sb->cap) {
    size_t cap = sb->cap ? 2 * sb->cap : 4096;
    while (cap < sb->len + (size_t)n + 1) cap *= 2;
    char *d = realloc(sb->data, cap);
    if (!d) {
      sb->nomem = true;
      return;
    }
    sb->data = d;
    sb->cap = cap;
  }
  memcpy(sb->data + sb->len, line, (size_t)n + 1);
  sb->len += (size_t)n;
}

// Reads a whole entry file into a malloc'ed buffer. 0, or -1 with errno.
static int read_whole(int fd, uint64_t size, uint8_t **out) {
  *out = malloc(size ? (size_t)size : 1);
  if (!*out) {
    errno = ENOMEM;
    return -1;
  }
  if (jit__cache_pread_full(fd, *out, (size_t)size, 0) != 0) {
    free(*out);
    *out = NULL;
    return -1;
  }
  return 0;
}

//===--- Export -------------------------------------------------------------===//

typedef struct export_walk {
  int spool;
  strbuf manifest;
  uint64_t count;
  jit_status error;
} export_walk;

static bool export_one(jit__cache *cache, void *user, jit__cache_scan_kind kind,
                       const char *path, const uint8_t key[16], const struct stat *st_scan) {
  export_walk *w = user;
  if (kind != JIT__SCAN_ENTRY) return true;
  // O_NONBLOCK: a FIFO planted in the cache must not block the open (fstat refuses it).
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return true;  // evicted meanwhile
  struct stat st;
  uint8_t *bytes = NULL;
  bool go = true;
  bool stat_ok = fstat(fd, &st) == 0;
  if (stat_ok && (!S_ISREG(st.st_mode) || (uint64_t)st.st_size > ENTRY_MAX_SIZE)) {
    jit__cache_remove_bad(cache, path, fd,
                          S_ISREG(st.st_mode) ? "larger than any entry can be"
                                              : "not a regular file");
    close(fd);
    return true;
  }
  if (!stat_ok || read_whole(fd, (uint64_t)st.st_size, &bytes) != 0) {
    if (errno == ENOMEM) {
      w->error = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "exporting %s: out of memory", path);
      go = false;
    } else if (errno == ENODATA) {  // shorter than its own stat said
      jit__cache_remove_bad(cache, path, fd, "truncated while reading");
    } else {
      jit__cache_logf(cache, JIT_LOG_WARNING, "exporting %s: read failed: %s (skipped)",
                      path, strerror(errno));
    }
    close(fd);
    return go;
  }
  jit__cache_header h;
  char why[256];
  if (!jit__cache_check_bytes(bytes, (uint64_t)st.st_size, key, &h, why, sizeof(why))) {
    jit__cache_remove_bad(cache, path, fd, why);
  } else if (jit__cache_write_full(w->spool, bytes, (size_t)st.st_size) != 0) {
    w->error = JIT_ERR(JIT_CACHE_ERROR, "exporting %s: writing the bundle failed: %s", path,
                       strerror(errno));
    go = false;
  } else {
    char hex[33];
    jit__cache_key_hex(key, hex);
    sb_printf(&w->manifest, "%s %" PRIu32 " %" PRIu64 "\n", hex, h.kind,
              (uint64_t)st.st_size);
    w->count++;
  }
  free(bytes);
  close(fd);
  return go;
}

static int copy_fd(int from, int to) {
  if (lseek(from, 0, SEEK_SET) != 0) return -1;
  uint8_t buf[65536];
  for (;;) {
    ssize_t n = read(from, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -1;
    if (n == 0) return 0;
    if (jit__cache_write_full(to, buf, (size_t)n) != 0) return -1;
  }
}

jit_status jit__cache_export(jit__cache *cache, const char *bundle_path,
                             const uint8_t *secret, uint64_t *count) {
  if (count) *count = 0;
  JIT_PROPAGATE(jit__cache_check_usable(cache, "exporting the cache", false));
  if (!bundle_path || !*bundle_path)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "jit__cache_export: no bundle path");
  // Entries are spooled first because the manifest, which precedes them, is known
  // only once every entry has been read and checked. Both files sit next to the
  // bundle so that the final rename is atomic.
  char tmp[PATH_MAX], spool_path[PATH_MAX];
  if (snprintf(tmp, sizeof(tmp), "%s.tmp-XXXXXX", bundle_path) >= (int)sizeof(tmp))
    return JIT_ERR(JIT_INVALID_ARGUMENT, "bundle path %s is too long", bundle_path);
  snprintf(spool_path, sizeof(spool_path), "%s.spool-XXXXXX", bundle_path);
  int out = mkostemp(tmp, O_CLOEXEC);
  if (out < 0)
    return JIT_ERR(JIT_CACHE_ERROR, "exporting to %s: cannot create a file there: %s",
                   bundle_path, strerror(errno));
  export_walk w = {.spool = mkostemp(spool_path, O_CLOEXEC)};
  jit_status s = NULL;
  if (w.spool < 0) {
    s = JIT_ERR(JIT_CACHE_ERROR, "exporting to %s: cannot create a spool file: %s",
                bundle_path, strerror(errno));
    goto done;
  }
  unlink(spool_path);  // gone when closed, whatever happens
  sb_printf(&w.manifest, "jitml-bundle %d\nbuild-id %s\n", MANIFEST_VERSION,
            jit__library_build_id());
  s = jit__cache_scan(cache, "exporting the cache", export_one, &w);
  if (!s) s = w.error;
  else jit_status_free(w.error);
  if (!s && w.manifest.nomem)
    s = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "exporting to %s: out of memory", bundle_path);
  if (s) goto done;

  uint8_t header[BUNDLE_HEADER_SIZE] = {0};
  memcpy(header, BUNDLE_MAGIC, 8);
  jit__le_put_u32(header + 8, secret ? BUNDLE_VERSION_SIGNED : BUNDLE_VERSION);
  jit__le_put_u32(header + 12, JIT__CACHE_FORMAT_VERSION);
  jit__le_put_u64(header + 16, w.count);
  jit__le_put_u64(header + 24, w.manifest.len);
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits(w.manifest.data, w.manifest.len));
  memcpy(header + 32, c.digest, 16);
  jit__le_put_u64(header + 48, XXH3_64bits(header, 48));
  if (jit__cache_write_full(out, header, sizeof(header)) != 0 ||
      jit__cache_write_full(out, w.manifest.data, w.manifest.len) != 0 ||
      copy_fd(w.spool, out) != 0) {
    s = JIT_ERR(JIT_CACHE_ERROR, "exporting to %s: writing failed: %s", bundle_path,
                strerror(errno));
    goto done;
  }
  if (secret) {
    uint8_t trailer[JIT__SIGN_TRAILER_BYTES];
    off_t size = lseek(out, 0, SEEK_CUR);
    s = size < 0 ? JIT_ERR(JIT_CACHE_ERROR, "exporting to %s: %s", bundle_path,
                           strerror(errno))
                 : jit__sign_fd(out, (uint64_t)size, secret, trailer);
    if (!s && jit__cache_write_full(out, trailer, sizeof trailer) != 0)
      s = JIT_ERR(JIT_CACHE_ERROR, "exporting to %s: writing failed: %s", bundle_path,
                  strerror(errno));
    if (s) goto done;
  }
  if (fsync(out) != 0 || rename(tmp, bundle_path) != 0) {
    s = JIT_ERR(JIT_CACHE_ERROR, "exporting to %s: writing failed: %s", bundle_path,
                strerror(errno));
    goto done;
  }
  tmp[0] = '\0';  // renamed: nothing to remove
  if (count) *count = w.count;
  jit__cache_logf(cache, JIT_LOG_INFO, "exported %" PRIu64 " cache entries to %s%s",
                  w.count, bundle_path, secret ? " (signed)" : "");
done:
  if (tmp[0]) unlink(tmp);
  close(out);
  if (w.spool >= 0) close(w.spool);
  free(w.manifest.data);
  return s;
}

//===--- Import -------------------------------------------------------------===//

typedef struct manifest_entry {
  uint8_t key[16];
  uint32_t kind;
  uint64_t size;
} manifest_entry;

// Parses the manifest after its two header lines; checks it lists `count` entries
// whose sizes add up to `body_size` (the bytes after the manifest).
static bool parse_manifest(char *text, uint64_t count, uint64_t body_size,
                           manifest_entry *entries, char *why, size_t why_size) {
  char *save = NULL;
  char *line = strtok_r(text, "\n", &save);
  if (!line || strcmp(line, "jitml-bundle 1") != 0) {
    snprintf(why, why_size, "manifest does not start with \"jitml-bundle 1\"");
    return false;
  }
  line = strtok_r(NULL, "\n", &save);
  if (!line || strncmp(line, "build-id ", 9) != 0) {
    snprintf(why, why_size, "manifest has no build-id line");
    return false;
  }
  uint64_t sum = 0;
  for (uint64_t i = 0; i < count; i++) {
    line = strtok_r(NULL, "\n", &save);
    char hex[33];
    uint32_t kind;
    uint64_t size;
    int used = 0;
    if (!line || sscanf(line, "%32s %" SCNu32 " %" SCNu64 "%n", hex, &kind, &size, &used) != 3 ||
        line[used] != '\0' || strlen(hex) != 32 ||
        !jit__cache_parse_key_hex(hex, entries[i].key) || size > ENTRY_MAX_SIZE ||
        size < JIT__CACHE_HEADER_SIZE) {
      snprintf(why, why_size, "manifest line %" PRIu64 " is malformed", i + 3);
      return false;
    }
    entries[i].kind = kind;
    entries[i].size = size;
    sum += size;
  }
  if (strtok_r(NULL, "\n", &save)) {
    snprintf(why, why_size, "manifest lists more entries than its header's %" PRIu64, count);
    return false;
  }
  if (sum != body_size) {
    snprintf(why, why_size,
             "entries add up to %" PRIu64 " bytes but the bundle holds %" PRIu64
             " (truncated or padded)",
             sum, body_size);
    return false;
  }
  return true;
}

// Reads and checks entry `e` at `offset`; on success returns its bytes (malloc'ed).
static jit_status load_entry(int fd, const char *bundle_path, uint64_t index,
                             const manifest_entry *e, uint64_t offset, uint8_t **out) {
  *out = malloc((size_t)e->size);
  if (!*out)
    return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "importing %s: out of memory", bundle_path);
  char why[256], hex[33];
  jit__cache_header h;
  jit__cache_key_hex(e->key, hex);
  if (jit__cache_pread_full(fd, *out, (size_t)e->size, offset) != 0) {
    snprintf(why, sizeof(why), "read failed: %s", strerror(errno));
  } else if (jit__cache_check_bytes(*out, e->size, e->key, &h, why, sizeof(why))) {
    if (h.kind == e->kind) return NULL;
    snprintf(why, sizeof(why), "kind %" PRIu32 " but the manifest says %" PRIu32, h.kind,
             e->kind);
  }
  free(*out);
  *out = NULL;
  return JIT_ERR(JIT_CACHE_ERROR, "bundle %s: entry %" PRIu64 " (%s) is bad: %s; nothing imported",
                 bundle_path, index, hex, why);
}

jit_status jit__cache_import(jit__cache *cache, const char *bundle_path, uint64_t *count) {
  if (count) *count = 0;
  JIT_PROPAGATE(jit__cache_check_usable(cache, "importing into the cache", true));
  if (!bundle_path)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "jit__cache_import: no bundle path");
  // O_NONBLOCK: a FIFO given as the bundle must not block the open; fstat refuses it.
  int fd = open(bundle_path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    return JIT_ERR(JIT_CACHE_ERROR, "importing bundle %s: open failed: %s", bundle_path,
                   strerror(errno));
  jit_status s = NULL;
  char *manifest = NULL;
  manifest_entry *entries = NULL;
  uint8_t header[BUNDLE_HEADER_SIZE];
  struct stat st;
  char why[256] = "";
  bool stat_ok = fstat(fd, &st) == 0;
  if (stat_ok && !S_ISREG(st.st_mode)) {
    snprintf(why, sizeof(why), "not a regular file");
    goto refuse;
  }
  if (!stat_ok || (uint64_t)st.st_size < BUNDLE_HEADER_SIZE ||
      jit__cache_pread_full(fd, header, sizeof(header), 0) != 0) {
    snprintf(why, sizeof(why), "too short or unreadable");
    goto refuse;
  }
  if (memcmp(header, BUNDLE_MAGIC, 8) != 0) {
    snprintf(why, sizeof(why), "not a libjitml cache bundle (bad magic)");
    goto refuse;
  }
  if (jit__le_get_u64(header + 48) != XXH3_64bits(header, 48)) {
    snprintf(why, sizeof(why), "header checksum mismatch");
    goto refuse;
  }
  uint32_t version = jit__le_get_u32(header + 8), format = jit__le_get_u32(header + 12);
  if ((version != BUNDLE_VERSION && version != BUNDLE_VERSION_SIGNED) ||
      format != JIT__CACHE_FORMAT_VERSION) {
    snprintf(why, sizeof(why),
             "bundle version %" PRIu32 " with entry format %" PRIu32
             ", this library reads %d or %d with format %d",
             version, format, BUNDLE_VERSION, BUNDLE_VERSION_SIGNED, JIT__CACHE_FORMAT_VERSION);
    goto refuse;
  }
  uint64_t file_size = (uint64_t)st.st_size;
  uint8_t signer[JIT__SIGN_PUBLIC_BYTES];
  if (version == BUNDLE_VERSION && cache->trusted.n) {
    snprintf(why, sizeof(why), "unsigned, and this cache trusts only signed bundles");
    goto refuse;
  }
  if (version == BUNDLE_VERSION_SIGNED) {
    if (!jit__sign_verify_fd(fd, file_size, &cache->trusted, signer, why, sizeof(why)))
      goto refuse;
    file_size -= JIT__SIGN_TRAILER_BYTES;
    if (file_size < BUNDLE_HEADER_SIZE) {
      snprintf(why, sizeof(why), "too short");
      goto refuse;
    }
  }
  uint64_t n = jit__le_get_u64(header + 16), manifest_size = jit__le_get_u64(header + 24);
  if (manifest_size > BUNDLE_MAX_MANIFEST || manifest_size > file_size - BUNDLE_HEADER_SIZE ||
      n > (file_size - BUNDLE_HEADER_SIZE - manifest_size) / JIT__CACHE_HEADER_SIZE) {
    snprintf(why, sizeof(why), "absurd sizes (manifest %" PRIu64 ", %" PRIu64 " entries)",
             manifest_size, n);
    goto refuse;
  }
  manifest = malloc((size_t)manifest_size + 1);
  entries = malloc((size_t)(n ? n : 1) * sizeof(*entries));
  if (!manifest || !entries) {
    s = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "importing %s: out of memory", bundle_path);
    goto done;
  }
  if (jit__cache_pread_full(fd, manifest, (size_t)manifest_size, BUNDLE_HEADER_SIZE) != 0) {
    snprintf(why, sizeof(why), "reading the manifest failed: %s", strerror(errno));
    goto refuse;
  }
  manifest[manifest_size] = '\0';
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits(manifest, (size_t)manifest_size));
  if (memcmp(c.digest, header + 32, 16) != 0) {
    snprintf(why, sizeof(why), "manifest checksum mismatch");
    goto refuse;
  }
  uint64_t body = BUNDLE_HEADER_SIZE + manifest_size;
  if (!parse_manifest(manifest, n, file_size - body, entries, why, sizeof(why))) goto refuse;

  // Pass 1 checks everything, pass 2 (re-checking, the file may change) stores.
  for (int pass = 0; pass < 2 && !s; pass++) {
    uint64_t off = body;
    for (uint64_t i = 0; i < n && !s; i++) {
      uint8_t *bytes;
      s = load_entry(fd, bundle_path, i, &entries[i], off, &bytes);
      if (s) break;
      if (pass == 1) {
        struct iovec iov = {bytes, (size_t)entries[i].size};
        if (jit__cache_write_atomic(cache, entries[i].key, &iov, 1, -1)) {
          if (count) (*count)++;
          JIT__CACHE_COUNT(cache, bytes_written, entries[i].size);
        } else {
          s = JIT_ERR(JIT_CACHE_ERROR, "importing %s: storing entry %" PRIu64
                      " in %s failed (see the log)", bundle_path, i, cache->dir);
        }
      }
      free(bytes);
      off += entries[i].size;
    }
  }
  if (!s)
    jit__cache_logf(cache, JIT_LOG_INFO, "imported %" PRIu64 " cache entries from %s%s", n,
                    bundle_path, version == BUNDLE_VERSION_SIGNED
                                     ? cache->trusted.n ? " (signed by a trusted key)"
                                                        : " (signed; no keys trusted)"
                                     : "");
  goto done;

refuse:
  s = JIT_ERR(JIT_CACHE_ERROR, "bundle %s refused: %s; nothing imported", bundle_path, why);
done:
  free(manifest);
  free(entries);
  close(fd);
  return s;
}
