//===--- test_cache.c - the on-disk kernel cache (cache/, internal API) ----===//
//
// Round trips, hits in a fresh process, every kind of damaged entry, a writer killed
// mid-write, read-only/refused directories, eviction, 8 processes x 4 threads racing
// on shared keys, and bundles. The cache is tested through its internal header: this
// executable compiles cache/*.c and base/status.c itself (libjitml hides them), see
// tests/CMakeLists.txt.
//
// Tests run as root in CI containers, where permission bits do not stop writes, so
// the read-only cases make writes fail another way or drop privileges in a child.
//
//===----------------------------------------------------------------------===//
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include "cache/cache.h"
#include "cache/internal.h"

//===--- Fixture: a private directory ------------------------------------------===//

static char g_root[256];   // mkdtemp'ed; removed by teardown
static char g_dir[300];    // g_root/cache

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb;
  (void)ftw;
  if (flag == FTW_DP || flag == FTW_D) chmod(path, 0700);
  return remove(path);
}

static int unlock_dir(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb;
  (void)ftw;
  if (flag == FTW_D) chmod(path, 0700);
  return 0;
}

static void setup(void) {
  snprintf(g_root, sizeof(g_root), "/tmp/jitml-test-cache-XXXXXX");
  cr_assert(mkdtemp(g_root) != NULL, "mkdtemp failed: %s", strerror(errno));
  snprintf(g_dir, sizeof(g_dir), "%s/cache", g_root);
}

static void teardown(void) {
  if (!g_root[0]) return;
  nftw(g_root, unlock_dir, 16, FTW_PHYS);
  nftw(g_root, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

TestSuite(cache, .init = setup, .fini = teardown, .timeout = 60);

//===--- Helpers ---------------------------------------------------------------===//

static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_log_count;
static char g_log_last[1024];

static void test_log(void *user, jit_log_level level, const char *message) {
  (void)user;
  (void)level;
  pthread_mutex_lock(&g_log_mu);
  g_log_count++;
  snprintf(g_log_last, sizeof(g_log_last), "%s", message);
  pthread_mutex_unlock(&g_log_mu);
}

static int log_lines_containing(const char *needle);
static char g_log_all[16384];
static void test_log_all(void *user, jit_log_level level, const char *message) {
  test_log(user, level, message);
  pthread_mutex_lock(&g_log_mu);
  size_t n = strlen(g_log_all);
  snprintf(g_log_all + n, sizeof(g_log_all) - n, "%s\n", message);
  pthread_mutex_unlock(&g_log_mu);
}
static int log_lines_containing(const char *needle) {
  int count = 0;
  for (const char *p = g_log_all; (p = strstr(p, needle)) != NULL; p++) count++;
  return count;
}

#define OK(expr)                                                                   \
  do {                                                                             \
    jit_status s_ = (expr);                                                        \
    if (s_) {                                                                      \
      char m_[1024];                                                               \
      snprintf(m_, sizeof(m_), "%s", jit_status_message(s_));                      \
      jit_status_free(s_);                                                         \
      cr_assert(0, "%s failed: %s", #expr, m_);                                    \
    }                                                                              \
  } while (0)

// Asserts `expr` fails with `code`, and frees the status.
#define FAILS(expr, code)                                                          \
  do {                                                                             \
    jit_status s_ = (expr);                                                        \
    cr_assert(s_ != NULL, "%s succeeded", #expr);                                  \
    jit_status_code c_ = jit_status_get_code(s_);                                  \
    char m_[1024];                                                                 \
    snprintf(m_, sizeof(m_), "%s", jit_status_message(s_));                        \
    jit_status_free(s_);                                                           \
    cr_assert_eq(c_, (code), "%s: code %d (%s)", #expr, (int)c_, m_);              \
  } while (0)

static jit__cache *open_opts(const jit__cache_options *o) {
  jit__cache *c = NULL;
  OK(jit__cache_open(o, &c));
  cr_assert(c != NULL);
  return c;
}

static jit__cache *open_dir(const char *dir) {
  jit__cache_options o = {.dir = dir, .logger = {test_log_all, NULL, JIT_LOG_DEBUG}};
  return open_opts(&o);
}

static void make_key(int i, uint8_t key[16]) {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits(&i, sizeof(i)));
  memcpy(key, c.digest, 16);
}

// A deterministic entry for `i` (so any process can check what it read).
static void make_entry(int i, size_t payload_size, jit__cache_entry *e) {
  memset(e, 0, sizeof(*e));
  make_key(i, e->key);
  e->kind = (jit__payload_kind)(1 + i % 5);
  char meta[64];
  int n = snprintf(meta, sizeof(meta), "entry=kernel_%d;args=3", i);
  e->meta = malloc((size_t)n);
  memcpy(e->meta, meta, (size_t)n);
  e->meta_size = (size_t)n;
  e->payload = malloc(payload_size ? payload_size : 1);
  for (size_t j = 0; j < payload_size; j++)
    ((uint8_t *)e->payload)[j] = (uint8_t)(i * 131 + j * 7 + (j >> 8));
  e->payload_size = payload_size;
  char comp[128];
  snprintf(comp, sizeof(comp), "graph=g%d\nshape=[%d,4]\nformat=1\n", i, i);
  e->components = strdup(comp);
}

static bool same_entry(const jit__cache_entry *a, const jit__cache_entry *b) {
  return memcmp(a->key, b->key, 16) == 0 && a->kind == b->kind &&
         a->meta_size == b->meta_size &&
         (a->meta_size == 0 || memcmp(a->meta, b->meta, a->meta_size) == 0) &&
         a->payload_size == b->payload_size &&
         (a->payload_size == 0 || memcmp(a->payload, b->payload, a->payload_size) == 0) &&
         strcmp(a->components ? a->components : "", b->components ? b->components : "") == 0;
}

static void put_entry(jit__cache *c, int i, size_t payload_size) {
  jit__cache_entry e;
  make_entry(i, payload_size, &e);
  OK(jit__cache_put(c, &e));
  jit__cache_entry_release(&e);
}

// Gets entry `i` and checks it against make_entry(i). Returns whether it was found.
static bool get_check(jit__cache *c, int i, size_t payload_size) {
  jit__cache_entry want, got;
  make_entry(i, payload_size, &want);
  bool found = false;
  OK(jit__cache_get(c, want.key, &got, &found));
  if (found) cr_assert(same_entry(&want, &got), "entry %d differs", i);
  jit__cache_entry_release(&want);
  jit__cache_entry_release(&got);
  return found;
}

static void path_of(jit__cache *c, int i, char *out) {
  uint8_t key[16];
  make_key(i, key);
  jit__cache_entry_path(c, key, out);
}

static jit__cache_stats stats_of(jit__cache *c) {
  jit__cache_stats s;
  jit__cache_get_stats(c, &s);
  return s;
}

typedef struct dir_census {
  int entries, temps;
  uint64_t entry_bytes;
} dir_census;

static dir_census census(const char *dir) {
  dir_census r = {0};
  DIR *top = opendir(dir);
  cr_assert(top != NULL, "opendir %s: %s", dir, strerror(errno));
  struct dirent *d;
  while ((d = readdir(top)) != NULL) {
    if (strlen(d->d_name) != 2) continue;
    char shard[PATH_MAX];
    snprintf(shard, sizeof(shard), "%s/%s", dir, d->d_name);
    DIR *sd = opendir(shard);
    if (!sd) continue;
    struct dirent *e;
    while ((e = readdir(sd)) != NULL) {
      struct stat st;
      char p[PATH_MAX + 300];
      snprintf(p, sizeof(p), "%s/%s", shard, e->d_name);
      if (stat(p, &st) != 0 || !S_ISREG(st.st_mode)) continue;
      if (strstr(e->d_name, ".jitk")) {
        r.entries++;
        r.entry_bytes += (uint64_t)st.st_size;
      } else if (strncmp(e->d_name, ".tmp-", 5) == 0) {
        r.temps++;
      }
    }
    closedir(sd);
  }
  closedir(top);
  return r;
}

static bool exists(const char *path) {
  struct stat st;
  return lstat(path, &st) == 0;
}

static void read_file(const char *path, uint8_t **out, size_t *size) {
  FILE *f = fopen(path, "rb");
  cr_assert(f != NULL, "fopen %s", path);
  fseek(f, 0, SEEK_END);
  *size = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  *out = malloc(*size ? *size : 1);
  cr_assert(fread(*out, 1, *size, f) == *size);
  fclose(f);
}

static void write_file(const char *path, const void *data, size_t size) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  cr_assert(fd >= 0, "open %s: %s", path, strerror(errno));
  cr_assert(write(fd, data, size) == (ssize_t)size);
  close(fd);
}

//===--- Basics ---------------------------------------------------------------------===//

Test(cache, round_trip_and_miss) {
  jit__cache *c = open_dir(g_dir);
  cr_assert(jit__cache_enabled(c));
  cr_assert(!jit__cache_read_only(c));
  cr_assert_null(jit__cache_disabled_reason(c));
  cr_assert(strstr(jit__cache_dir(c), "/cache") != NULL);
  put_entry(c, 1, 1000);
  put_entry(c, 2, 0);  // an empty payload is still an entry
  jit__cache_entry e;
  make_entry(3, 5, &e);
  free(e.meta);
  e.meta = NULL;
  e.meta_size = 0;
  free(e.components);
  e.components = NULL;
  OK(jit__cache_put(c, &e));
  jit__cache_entry got;
  bool found = false;
  OK(jit__cache_get(c, e.key, &got, &found));
  cr_assert(found);
  cr_assert_eq(got.meta_size, 0);
  cr_assert_str_eq(got.components, "");
  cr_assert_eq(got.payload_size, 5);
  cr_assert_eq(memcmp(got.payload, e.payload, 5), 0);
  jit__cache_entry_release(&got);
  jit__cache_entry_release(&e);

  cr_assert(get_check(c, 1, 1000));
  cr_assert(get_check(c, 2, 0));
  cr_assert(!get_check(c, 4, 10), "absent key hit");

  // Modes: the directory 0700 (we created it), entries 0600.
  struct stat st;
  cr_assert_eq(stat(g_dir, &st), 0);
  cr_assert_eq(st.st_mode & 0777, 0700);
  char path[PATH_MAX];
  path_of(c, 1, path);
  cr_assert_eq(stat(path, &st), 0);
  cr_assert_eq(st.st_mode & 0777, 0600);

  jit__cache_stats s = stats_of(c);
  cr_assert_eq(s.puts, 3);
  cr_assert_eq(s.hits, 3);
  cr_assert_eq(s.misses, 1);
  cr_assert_eq(s.bad_entries, 0);
  cr_assert_gt(s.bytes_written, 1000);
  cr_assert_gt(s.bytes_read, 1000);
  jit__cache_close(c);
}

Test(cache, overwrite_replaces) {
  jit__cache *c = open_dir(g_dir);
  put_entry(c, 1, 100);
  jit__cache_entry e;
  make_entry(1, 300, &e);  // same key, other bytes
  OK(jit__cache_put(c, &e));
  jit__cache_entry got;
  bool found;
  OK(jit__cache_get(c, e.key, &got, &found));
  cr_assert(found);
  cr_assert(same_entry(&e, &got));
  jit__cache_entry_release(&got);
  jit__cache_entry_release(&e);
  cr_assert_eq(census(g_dir).entries, 1);
  jit__cache_close(c);
}

Test(cache, disabled_and_directory_resolution) {
  jit__cache *c = open_dir("");
  cr_assert(!jit__cache_enabled(c));
  cr_assert_str_eq(jit__cache_dir(c), "");
  cr_assert_not_null(jit__cache_disabled_reason(c));
  jit__cache_entry e;
  make_entry(1, 10, &e);
  OK(jit__cache_put(c, &e));  // dropped, not an error
  bool found = true;
  jit__cache_entry got;
  OK(jit__cache_get(c, e.key, &got, &found));
  cr_assert(!found);
  jit__cache_lock lock;
  bool acquired = true;
  jit__cache_lock_key(c, e.key, 10, &lock, &acquired);
  cr_assert(!acquired);
  jit__cache_unlock(&lock);
  FAILS(jit__cache_clear(c, NULL), JIT_UNAVAILABLE);
  jit__cache_stats s = stats_of(c);
  cr_assert_eq(s.puts_dropped, 1);
  cr_assert_eq(s.misses, 1);
  jit__cache_entry_release(&e);
  jit__cache_close(c);

  // NULL dir: $JITML_CACHE_DIR, then $XDG_CACHE_HOME/jitml, then $HOME/.cache/jitml.
  char want[PATH_MAX];
  jit__cache_options o = {.dir = NULL};
  snprintf(want, sizeof(want), "%s/env", g_root);
  setenv("JITML_CACHE_DIR", want, 1);
  c = open_opts(&o);
  cr_assert_str_eq(jit__cache_dir(c), want);
  jit__cache_close(c);
  setenv("JITML_CACHE_DIR", "", 1);
  c = open_opts(&o);
  cr_assert(!jit__cache_enabled(c));
  jit__cache_close(c);
  unsetenv("JITML_CACHE_DIR");
  setenv("XDG_CACHE_HOME", g_root, 1);
  snprintf(want, sizeof(want), "%s/jitml", g_root);
  c = open_opts(&o);
  cr_assert_str_eq(jit__cache_dir(c), want);
  jit__cache_close(c);
  unsetenv("XDG_CACHE_HOME");
  char home[PATH_MAX];
  snprintf(home, sizeof(home), "%s/home", g_root);
  setenv("HOME", home, 1);
  snprintf(want, sizeof(want), "%s/home/.cache/jitml", g_root);
  c = open_opts(&o);
  cr_assert_str_eq(jit__cache_dir(c), want);
  struct stat st;
  cr_assert_eq(stat(home, &st), 0);
  cr_assert_eq(st.st_mode & 0777, 0700, "parents are created 0700 too");
  jit__cache_close(c);
}

Test(cache, misuse_gets_statuses) {
  FAILS(jit__cache_open(NULL, NULL), JIT_INVALID_ARGUMENT);
  jit__cache_close(NULL);
  jit__cache *c = open_dir(g_dir);
  uint8_t key[16] = {0};
  jit__cache_entry got;
  bool found;
  FAILS(jit__cache_get(NULL, key, &got, &found), JIT_INVALID_ARGUMENT);
  FAILS(jit__cache_get(c, NULL, &got, &found), JIT_INVALID_ARGUMENT);
  FAILS(jit__cache_get(c, key, &got, NULL), JIT_INVALID_ARGUMENT);
  FAILS(jit__cache_put(c, NULL), JIT_INVALID_ARGUMENT);
  jit__cache_entry e;
  make_entry(1, 10, &e);
  e.kind = (jit__payload_kind)99;
  FAILS(jit__cache_put(c, &e), JIT_INVALID_ARGUMENT);
  e.kind = JIT__PAYLOAD_PTX;
  void *p = e.payload;
  e.payload = NULL;
  FAILS(jit__cache_put(c, &e), JIT_INVALID_ARGUMENT);
  e.payload = p;
  jit__cache_entry_release(&e);
  FAILS(jit__cache_list(c, NULL, NULL), JIT_INVALID_ARGUMENT);
  FAILS(jit__cache_export(c, NULL, NULL, NULL), JIT_INVALID_ARGUMENT);
  FAILS(jit__cache_import(c, "/nonexistent/bundle", NULL), JIT_CACHE_ERROR);
  jit__cache_entry_release(NULL);
  jit__cache_unlock(NULL);
  jit__cache_close(c);
}

Test(cache, hit_in_a_fresh_process) {
  jit__cache *c = open_dir(g_dir);
  put_entry(c, 7, 4096);
  jit__cache_close(c);
  pid_t pid = fork();
  cr_assert(pid >= 0);
  if (pid == 0) {
    jit__cache *cc = NULL;
    jit__cache_options o = {.dir = g_dir};
    jit_status s = jit__cache_open(&o, &cc);
    jit__cache_entry want, got;
    make_entry(7, 4096, &want);
    bool found = false;
    if (!s) s = jit__cache_get(cc, want.key, &got, &found);
    int rc = s ? 3 : !found ? 1 : !same_entry(&want, &got) ? 2 : 0;
    if (found) jit__cache_entry_release(&got);
    jit__cache_entry_release(&want);
    jit_status_free(s);
    jit__cache_close(cc);
    _exit(rc);
  }
  int status;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child: status %d", status);
}

Test(cache, lock_excludes_and_times_out) {
  jit__cache *c = open_dir(g_dir);
  uint8_t key[16];
  make_key(1, key);
  jit__cache_lock a, b;
  bool got_a = false, got_b = true;
  jit__cache_lock_key(c, key, 1000, &a, &got_a);
  cr_assert(got_a);
  jit__cache_lock_key(c, key, 50, &b, &got_b);  // a second open file: excluded
  cr_assert(!got_b);
  cr_assert_eq(stats_of(c).lock_timeouts, 1);
  jit__cache_unlock(&a);
  jit__cache_lock_key(c, key, 50, &b, &got_b);
  cr_assert(got_b);
  jit__cache_unlock(&b);
  jit__cache_unlock(&b);  // twice is harmless
  jit__cache_close(c);
}

Test(cache, build_id) {
  const char *id = jit__library_build_id();
  cr_assert_not_null(id);
  cr_assert(id == jit__library_build_id(), "computed once");
  const char *hex = strncmp(id, "gnu-", 4) == 0 ? id + 4 : strncmp(id, "xxh3-", 5) == 0 ? id + 5 : NULL;
  cr_assert_not_null(hex, "build id %s", id);
  cr_assert_geq(strlen(hex), 16, "build id %s", id);
  for (const char *p = hex; *p; p++)
    cr_assert((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'), "build id %s", id);
}

//===--- Damaged entries ------------------------------------------------------------===//

// Gets entry `i`, which the caller damaged: a miss, the file removed, one more bad entry.
static void expect_bad(jit__cache *c, int i, const char *what) {
  char path[PATH_MAX];
  path_of(c, i, path);
  uint64_t bad = stats_of(c).bad_entries;
  cr_assert(!get_check(c, i, 2000), "%s: damaged entry hit", what);
  cr_assert(!exists(path), "%s: damaged entry not removed", what);
  cr_assert_eq(stats_of(c).bad_entries, bad + 1, "%s: not counted", what);
  // Recompiled and stored again, it hits.
  put_entry(c, i, 2000);
  cr_assert(get_check(c, i, 2000), "%s: no hit after re-put", what);
}

static void flip_bit(const char *path, long offset) {
  int fd = open(path, O_RDWR);
  cr_assert(fd >= 0);
  uint8_t b;
  cr_assert_eq(pread(fd, &b, 1, offset), 1);
  b ^= 0x10;
  cr_assert_eq(pwrite(fd, &b, 1, offset), 1);
  close(fd);
}

// Rewrites the header of `path` with a valid header checksum after `edit`.
static void rewrite_header(const char *path, void (*edit)(uint8_t *raw)) {
  int fd = open(path, O_RDWR);
  cr_assert(fd >= 0);
  uint8_t raw[JIT__CACHE_HEADER_SIZE];
  cr_assert_eq(pread(fd, raw, sizeof(raw), 0), (ssize_t)sizeof(raw));
  edit(raw);
  jit__le_put_u64(raw + 80, XXH3_64bits(raw, 80));
  cr_assert_eq(pwrite(fd, raw, sizeof(raw), 0), (ssize_t)sizeof(raw));
  close(fd);
}
static void next_version(uint8_t *raw) { jit__le_put_u32(raw + 8, JIT__CACHE_FORMAT_VERSION + 1); }
static void absurd_payload(uint8_t *raw) { jit__le_put_u64(raw + 56, UINT64_C(1) << 62); }
static void bigger_payload(uint8_t *raw) { jit__le_put_u64(raw + 56, jit__le_get_u64(raw + 56) + 1); }
static void unknown_kind(uint8_t *raw) { jit__le_put_u32(raw + 32, 77); }

Test(cache, damaged_entries_are_misses_and_removed) {
  jit__cache *c = open_dir(g_dir);
  for (int i = 0; i < 16; i++) put_entry(c, i, 2000);
  char path[PATH_MAX], other[PATH_MAX];

  path_of(c, 0, path);
  cr_assert_eq(truncate(path, 1500), 0);
  expect_bad(c, 0, "truncated");

  path_of(c, 1, path);
  cr_assert_eq(truncate(path, 10), 0);
  expect_bad(c, 1, "truncated into the header");

  path_of(c, 2, path);
  struct stat st;
  stat(path, &st);
  flip_bit(path, st.st_size - 1);
  expect_bad(c, 2, "payload bit flip");

  path_of(c, 3, path);
  flip_bit(path, JIT__CACHE_HEADER_SIZE + 3);
  expect_bad(c, 3, "meta bit flip");

  static const long header_offsets[] = {0, 9, 20, 33, 45, 60, 70, 85};
  for (int k = 0; k < 8; k++) {
    path_of(c, 4, path);
    flip_bit(path, header_offsets[k]);
    char what[64];
    snprintf(what, sizeof(what), "header bit flip at %ld", header_offsets[k]);
    expect_bad(c, 4, what);
  }

  // Entry 6's file under entry 5's name: the key in the header says so.
  path_of(c, 5, path);
  path_of(c, 6, other);
  uint8_t *bytes;
  size_t size;
  read_file(other, &bytes, &size);
  write_file(path, bytes, size);
  free(bytes);
  expect_bad(c, 5, "key mismatch");
  cr_assert(get_check(c, 6, 2000), "the original entry is intact");

  path_of(c, 7, path);
  rewrite_header(path, next_version);
  expect_bad(c, 7, "format version + 1");
  cr_assert(log_lines_containing("format version") >= 1, "log: %s", g_log_all);

  path_of(c, 8, path);
  rewrite_header(path, absurd_payload);
  expect_bad(c, 8, "absurd length");

  path_of(c, 9, path);
  rewrite_header(path, bigger_payload);
  expect_bad(c, 9, "length disagrees with the file");

  path_of(c, 10, path);
  rewrite_header(path, unknown_kind);
  expect_bad(c, 10, "unknown kind");

  path_of(c, 11, path);
  write_file(path, "", 0);
  expect_bad(c, 11, "empty file");

  path_of(c, 12, path);
  chmod(path, 0666);
  expect_bad(c, 12, "other-writable entry");

  // Everything else still hits; verify finds nothing left to remove.
  for (int i = 13; i < 16; i++) cr_assert(get_check(c, i, 2000));
  uint64_t checked = 0, bad = 1;
  OK(jit__cache_verify(c, &checked, &bad));
  cr_assert_eq(checked, 16);
  cr_assert_eq(bad, 0);
  jit__cache_close(c);
}

// A FIFO in place of an entry (or a bundle) must not block: an open of a FIFO with no
// writer blocks forever, so the cache opens non-blocking and refuses what fstat says is
// not a regular file. The suite's timeout (60 s) fails a test that hangs.
Test(cache, fifos_in_place_of_entries_and_bundles_do_not_hang) {
  jit__cache *c = open_dir(g_dir);
  put_entry(c, 0, 2000);
  char path[PATH_MAX];
  path_of(c, 0, path);
  cr_assert_eq(unlink(path), 0);
  cr_assert_eq(mkfifo(path, 0600), 0);
  uint64_t bad = stats_of(c).bad_entries;
  cr_assert(!get_check(c, 0, 2000), "a FIFO entry hit");
  cr_expect(!exists(path), "the FIFO was not removed");
  cr_expect_eq(stats_of(c).bad_entries, bad + 1, "the FIFO was not counted");
  put_entry(c, 0, 2000);
  cr_expect(get_check(c, 0, 2000), "no hit after re-put");
  // verify and export walk past a FIFO (the walks only visit regular files).
  path_of(c, 1, path);
  put_entry(c, 1, 2000);
  cr_assert_eq(unlink(path), 0);
  cr_assert_eq(mkfifo(path, 0600), 0);
  uint64_t checked = 0, found_bad = 0;
  OK(jit__cache_verify(c, &checked, &found_bad));
  cr_expect(checked == 1 && found_bad == 0, "verify: %llu checked, %llu bad",
            (unsigned long long)checked, (unsigned long long)found_bad);
  char bundle[PATH_MAX];
  snprintf(bundle, sizeof bundle, "%s/out.jitmlb", g_root);
  uint64_t n = 0;
  OK(jit__cache_export(c, bundle, NULL, &n));
  cr_expect_eq(n, 1, "exported %llu", (unsigned long long)n);
  // A FIFO given as the bundle to import.
  char fifo[PATH_MAX];
  snprintf(fifo, sizeof fifo, "%s/in.jitmlb", g_root);
  cr_assert_eq(mkfifo(fifo, 0600), 0);
  jit_status s = jit__cache_import(c, fifo, &n);
  cr_assert_not_null(s, "a FIFO imported");
  cr_expect(strstr(jit_status_message(s), "not a regular file") != NULL, "%s",
            jit_status_message(s));
  jit_status_free(s);
  jit__cache_close(c);
}

// Under `ulimit -f` a write past the limit raises SIGXFSZ, which by default ends the
// process: a put must instead be dropped (counted, logged) and the process go on. In a
// child, whose limit does not reach the rest of the suite.
Test(cache, file_size_limit_drops_the_put_without_a_signal) {
  pid_t pid = fork();
  cr_assert(pid >= 0);
  if (pid == 0) {
    jit__cache *c = NULL;
    jit__cache_options o = {.dir = g_dir};
    if (jit__cache_open(&o, &c) || !c) _exit(10);
    struct rlimit rl = {4096, 4096};
    if (setrlimit(RLIMIT_FSIZE, &rl) != 0) _exit(11);
    put_entry(c, 1, 100000);  // 100 KB: the write fails with EFBIG
    jit__cache_stats st = stats_of(c);
    bool dropped = st.puts_dropped == 1 && st.puts == 0;
    put_entry(c, 2, 100);     // a small one still fits
    bool small_ok = get_check(c, 2, 100);
    jit__cache_close(c);
    _exit(dropped && small_ok ? 0 : 12);
  }
  int status = 0;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(!WIFSIGNALED(status), "killed by signal %d", WTERMSIG(status));
  cr_assert_eq(WEXITSTATUS(status), 0, "child exit %d", WEXITSTATUS(status));
}

// A symlink with a shard's name, planted inside the cache, leads no write and no clear
// out of the cache directory.
Test(cache, symlinked_shards_are_not_followed) {
  jit__cache *c = open_dir(g_dir);
  char outside[PATH_MAX], shard[PATH_MAX], path[PATH_MAX], victim[PATH_MAX + 64];
  snprintf(outside, sizeof outside, "%s/outside", g_root);
  cr_assert_eq(mkdir(outside, 0700), 0);
  // Named like an entry, so a clear that followed the symlink would remove it.
  snprintf(victim, sizeof victim, "%s/00000000000000000000000000000000.jitk", outside);
  FILE *f = fopen(victim, "w");
  cr_assert(f);
  fputs("not a cache entry", f);
  fclose(f);
  path_of(c, 5, path);  // <dir>/<2 hex>/<32 hex>.jitk
  snprintf(shard, sizeof shard, "%.*s", (int)(strrchr(path, '/') - path), path);
  rmdir(shard);
  cr_assert_eq(symlink(outside, shard), 0);
  // A put through the symlink is dropped; nothing lands outside.
  put_entry(c, 5, 1000);
  cr_expect_eq(stats_of(c).puts_dropped, 1);
  DIR *d = opendir(outside);
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
  closedir(d);
  cr_expect_eq(n, 1, "%d files outside the cache", n);
  // Clearing the cache does not remove what the symlink points at.
  uint64_t removed = 0;
  OK(jit__cache_clear(c, &removed));
  cr_expect(exists(victim), "clear followed the symlink");
  jit__cache_close(c);
}

Test(cache, verify_and_list_find_bad_entries) {
  jit__cache *c = open_dir(g_dir);
  for (int i = 0; i < 6; i++) put_entry(c, i, 3000);
  char path[PATH_MAX];
  path_of(c, 2, path);
  flip_bit(path, 2500);  // payload: only a full verify sees it
  path_of(c, 4, path);
  flip_bit(path, 40);  // header: list sees it too
  uint64_t checked, bad;
  OK(jit__cache_verify(c, &checked, &bad));
  cr_assert_eq(checked, 6);
  cr_assert_eq(bad, 2);
  cr_assert_eq(census(g_dir).entries, 4);
  cr_assert_eq(stats_of(c).bad_entries, 2);
  jit__cache_close(c);
}

//===--- kill -9 in the middle of a put ------------------------------------------------===//

static void killed_put(int i) {
  pid_t pid = fork();
  cr_assert(pid >= 0);
  if (pid == 0) {
    jit__cache *cc = NULL;
    jit__cache_options o = {.dir = g_dir, .fault_kill_after_bytes = 1000};
    if (jit__cache_open(&o, &cc)) _exit(3);
    jit__cache_entry e;
    make_entry(i, 64 * 1024, &e);
    jit_status_free(jit__cache_put(cc, &e));
    _exit(2);  // not reached: the hook kills the process
  }
  int status;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "child status %d", status);
}

Test(cache, kill_9_mid_write_leaves_no_entry) {
  killed_put(1);
  dir_census d = census(g_dir);
  cr_assert_eq(d.entries, 0, "a partial entry is visible");
  cr_assert_eq(d.temps, 1, "the dead writer's temp file is there");
  jit__cache *c = open_dir(g_dir);
  cr_assert(!get_check(c, 1, 64 * 1024));
  cr_assert_eq(stats_of(c).bad_entries, 0);
  uint64_t checked = 1, bad = 1;
  OK(jit__cache_verify(c, &checked, &bad));
  cr_assert_eq(checked, 0, "a temp file counted as an entry");
  // prune removes the dead writer's temp file (its flock is free).
  uint64_t evicted = 1;
  OK(jit__cache_prune(c, &evicted));
  cr_assert_eq(evicted, 0);
  cr_assert_eq(census(g_dir).temps, 0);
  // The key works normally afterwards.
  put_entry(c, 1, 64 * 1024);
  cr_assert(get_check(c, 1, 64 * 1024));
  d = census(g_dir);
  cr_assert_eq(d.temps, 0);
  cr_assert_eq(d.entries, 1);
  // clear removes them too.
  killed_put(2);
  cr_assert_eq(census(g_dir).temps, 1);
  uint64_t removed = 0;
  OK(jit__cache_clear(c, &removed));
  cr_assert_eq(removed, 1);
  d = census(g_dir);
  cr_assert_eq(d.temps + d.entries, 0);
  jit__cache_close(c);
}

//===--- Read-only, unwritable and refused directories ----------------------------------===//

Test(cache, put_failure_is_dropped_and_logged_once) {
  jit__cache *c = open_dir(g_dir);
  put_entry(c, 1, 500);
  // Make the shard directories of two other keys regular files: their puts fail
  // (as on a read-only or full disk) even for root.
  char p1[PATH_MAX];
  path_of(c, 1, p1);
  *strrchr(p1, '/') = '\0';
  int blocked[2], nb = 0;
  for (int i = 2; nb < 2; i++) {
    char shard[PATH_MAX];
    path_of(c, i, shard);
    *strrchr(shard, '/') = '\0';
    if (strcmp(shard, p1) == 0) continue;
    if (!exists(shard)) write_file(shard, "x", 1);
    blocked[nb++] = i;
  }
  jit__cache_entry e;
  for (int k = 0; k < 2; k++) {
    make_entry(blocked[k], 500, &e);
    OK(jit__cache_put(c, &e));  // best effort: no error
    jit__cache_entry_release(&e);
  }
  jit__cache_stats s = stats_of(c);
  cr_assert_eq(s.puts_dropped, 2);
  cr_assert_eq(s.puts, 1);
  cr_assert_eq(log_lines_containing("cache put"), 1, "logged once: %s", g_log_all);
  cr_assert(log_lines_containing("creating") >= 1, "names what failed: %s", g_log_all);
  cr_assert(get_check(c, 1, 500), "existing entries still hit");
  cr_assert(!get_check(c, blocked[0], 500));
  jit__cache_close(c);

  // A cache directory that cannot be created (its parent is a file): disabled.
  char file[PATH_MAX], bad_dir[PATH_MAX];
  snprintf(file, sizeof(file), "%s/file", g_root);
  snprintf(bad_dir, sizeof(bad_dir), "%s/file/cache", g_root);
  write_file(file, "x", 1);
  c = open_dir(bad_dir);
  cr_assert(!jit__cache_enabled(c));
  cr_assert(strstr(jit__cache_disabled_reason(c), "cannot create") != NULL, "%s",
            jit__cache_disabled_reason(c));
  OK(jit__cache_put(c, &(jit__cache_entry){.kind = JIT__PAYLOAD_PTX}));
  jit__cache_close(c);
}

// A full disk, simulated with a file size limit (EFBIG, as ENOSPC would be): the put
// is dropped, its temp file removed, and hits still served.
static int full_disk_child(void) {
  signal(SIGXFSZ, SIG_IGN);
  struct rlimit lim = {4096, 4096};
  if (setrlimit(RLIMIT_FSIZE, &lim) != 0) return 10;
  jit__cache *c = NULL;
  jit__cache_options o = {.dir = g_dir};
  if (jit__cache_open(&o, &c)) return 11;
  jit__cache_entry e;
  make_entry(2, 64 * 1024, &e);
  jit_status s = jit__cache_put(c, &e);
  int rc = s ? 12 : stats_of(c).puts_dropped != 1 ? 13 : stats_of(c).puts != 0 ? 14 : 0;
  jit_status_free(s);
  jit__cache_entry_release(&e);
  bool found = false;
  jit__cache_entry want, got;
  make_entry(1, 700, &want);
  s = jit__cache_get(c, want.key, &got, &found);
  if (!rc && (s || !found || !same_entry(&want, &got))) rc = 15;
  if (found) jit__cache_entry_release(&got);
  jit__cache_entry_release(&want);
  jit_status_free(s);
  jit__cache_close(c);
  return rc;
}

Test(cache, full_disk_drops_the_put) {
  jit__cache *c = open_dir(g_dir);
  put_entry(c, 1, 700);
  jit__cache_close(c);
  pid_t pid = fork();
  cr_assert(pid >= 0);
  if (pid == 0) _exit(full_disk_child());
  int status;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child: status %d", status);
  dir_census d = census(g_dir);
  cr_assert_eq(d.entries, 1);
  cr_assert_eq(d.temps, 0, "the failed put left its temp file");
}

// In a child without privileges (root ignores permission bits), checks that a
// root-owned cache is refused by default and served read-only when allowed.
static int shared_readonly_child(void) {
  if (setgid(65534) != 0 || setuid(65534) != 0) return 10;
  jit__cache *c = NULL;
  jit__cache_options o = {.dir = g_dir};
  if (jit__cache_open(&o, &c)) return 11;
  bool refused = !jit__cache_enabled(c) &&
                 strstr(jit__cache_disabled_reason(c), "owned by uid 0") != NULL;
  jit__cache_close(c);
  if (!refused) return 12;
  o.allow_shared_readonly = true;
  if (jit__cache_open(&o, &c)) return 13;
  if (!jit__cache_enabled(c) || !jit__cache_read_only(c)) return 14;
  jit__cache_entry want, got;
  make_entry(1, 700, &want);
  bool found = false;
  jit_status s = jit__cache_get(c, want.key, &got, &found);
  int rc = s ? 15 : !found ? 16 : !same_entry(&want, &got) ? 17 : 0;
  if (found) jit__cache_entry_release(&got);
  jit__cache_entry_release(&want);
  jit_status_free(s);
  jit__cache_entry e;
  make_entry(2, 700, &e);
  s = jit__cache_put(c, &e);
  if (!rc && (s || stats_of(c).puts_dropped != 1)) rc = 18;
  jit_status_free(s);
  jit__cache_lock lock;
  bool acquired = true;
  jit__cache_lock_key(c, e.key, 10, &lock, &acquired);
  if (!rc && acquired) rc = 19;
  jit__cache_entry_release(&e);
  jit__cache_close(c);
  return rc;
}

Test(cache, read_only_directory) {
  jit__cache *c = open_dir(g_dir);
  put_entry(c, 1, 700);
  jit__cache_close(c);
  if (geteuid() != 0) {
    // Our own directory, not writable: read-only, hits still served.
    cr_assert_eq(chmod(g_dir, 0500), 0);
    c = open_dir(g_dir);
    cr_assert(jit__cache_enabled(c) && jit__cache_read_only(c));
    cr_assert(get_check(c, 1, 700));
    put_entry(c, 2, 700);
    cr_assert_eq(stats_of(c).puts_dropped, 1);
    cr_assert(!get_check(c, 2, 700));
    jit__cache_close(c);
    chmod(g_dir, 0700);
    return;
  }
  // As root: the cache becomes a root-owned shared cache, readable by all.
  char shard[PATH_MAX];
  c = open_dir(g_dir);
  path_of(c, 1, shard);
  jit__cache_close(c);
  cr_assert_eq(chmod(shard, 0644), 0);
  *strrchr(shard, '/') = '\0';
  cr_assert_eq(chmod(shard, 0755), 0);
  cr_assert_eq(chmod(g_dir, 0755), 0);
  cr_assert_eq(chmod(g_root, 0755), 0);
  pid_t pid = fork();
  cr_assert(pid >= 0);
  if (pid == 0) _exit(shared_readonly_child());
  int status;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child: status %d", status);
}

Test(cache, unsafe_directories_are_refused) {
  cr_assert_eq(mkdir(g_dir, 0700), 0);
  cr_assert_eq(chmod(g_dir, 0777), 0);
  jit__cache *c = open_dir(g_dir);
  cr_assert(!jit__cache_enabled(c));
  cr_assert(strstr(jit__cache_disabled_reason(c), "writable by group or others") != NULL,
            "%s", jit__cache_disabled_reason(c));
  cr_assert(strstr(jit__cache_disabled_reason(c), g_dir) != NULL, "names the path");
  cr_assert(log_lines_containing("disabled") == 1, "logged once: %s", g_log_all);
  jit__cache_close(c);

  cr_assert_eq(chmod(g_dir, 0770), 0);
  c = open_dir(g_dir);
  cr_assert(!jit__cache_enabled(c));
  jit__cache_close(c);

  // Even the shared read-only option does not accept a writable directory.
  jit__cache_options o = {.dir = g_dir, .allow_shared_readonly = true};
  c = open_opts(&o);
  cr_assert(!jit__cache_enabled(c));
  jit__cache_close(c);

  cr_assert_eq(chmod(g_dir, 0700), 0);
  if (geteuid() == 0) {
    cr_assert_eq(chown(g_dir, 65534, 65534), 0);
    c = open_dir(g_dir);
    cr_assert(!jit__cache_enabled(c));
    cr_assert(strstr(jit__cache_disabled_reason(c), "owned by uid 65534") != NULL, "%s",
              jit__cache_disabled_reason(c));
    jit__cache_close(c);
    cr_assert_eq(chown(g_dir, 0, 0), 0);
  }
  c = open_dir(g_dir);
  cr_assert(jit__cache_enabled(c));
  jit__cache_close(c);
}

//===--- Eviction -------------------------------------------------------------------===//

Test(cache, eviction_keeps_under_limit_and_keeps_recent) {
  const uint64_t limit = 16 * 1024;
  jit__cache_options o = {.dir = g_dir, .max_bytes = limit, .logger = {test_log_all, NULL, JIT_LOG_DEBUG}};
  jit__cache *c = open_opts(&o);
  const size_t payload = 900;  // ~1 KiB per entry with header, meta and components
  for (int i = 0; i < 3; i++) put_entry(c, i, payload);  // the hot set
  for (int i = 3; i < 80; i++) {
    put_entry(c, i, payload);
    for (int h = 0; h < 3; h++) cr_assert(get_check(c, h, payload), "hot %d evicted at %d", h, i);
    // Pruning after every tenth of the limit written keeps the directory under it
    // without any explicit prune.
    cr_assert_leq(census(g_dir).entry_bytes, limit, "over the limit after put %d", i);
  }
  cr_assert(get_check(c, 79, payload), "the newest entry survives");
  uint64_t evicted = 0;
  OK(jit__cache_prune(c, &evicted));
  dir_census d = census(g_dir);
  cr_assert_leq(d.entry_bytes, limit);
  cr_assert_gt(d.entries, 5);
  jit__cache_stats s = stats_of(c);
  cr_assert_gt(s.evictions, 50);
  cr_assert_eq(s.bad_entries, 0);
  for (int h = 0; h < 3; h++) cr_assert(get_check(c, h, payload));
  cr_assert(!get_check(c, 3, payload), "the least recently used entry is gone");
  jit__cache_close(c);
}

Test(cache, max_age_evicts_unused_entries) {
  jit__cache_options o = {.dir = g_dir, .max_age_s = 3600};
  jit__cache *c = open_opts(&o);
  for (int i = 0; i < 4; i++) put_entry(c, i, 100);
  // Entry 0 last used (and written) two hours ago.
  char path[PATH_MAX];
  path_of(c, 0, path);
  struct timespec old[2] = {{time(NULL) - 7200, 0}, {time(NULL) - 7200, 0}};
  cr_assert_eq(utimensat(AT_FDCWD, path, old, 0), 0);
  // Entry 1 written two hours ago but read just now: kept.
  path_of(c, 1, path);
  cr_assert_eq(utimensat(AT_FDCWD, path, old, 0), 0);
  cr_assert(get_check(c, 1, 100));
  uint64_t evicted = 0;
  OK(jit__cache_prune(c, &evicted));
  cr_assert_eq(evicted, 1);
  cr_assert(!get_check(c, 0, 100));
  for (int i = 1; i < 4; i++) cr_assert(get_check(c, i, 100));
  jit__cache_close(c);
}

//===--- 8 processes x 4 threads on shared keys ------------------------------------------===//

#define RACE_PROCS 8
#define RACE_THREADS 4
#define RACE_KEYS 12
#define RACE_PAYLOAD (32 * 1024)

typedef struct race_thread {
  jit__cache *cache;
  int proc, thread;
  int log_fd;
  int rc;
} race_thread;

static void *race_body(void *arg) {
  race_thread *t = arg;
  for (int n = 0; n < RACE_KEYS && !t->rc; n++) {
    int i = (n + t->proc * RACE_THREADS + t->thread) % RACE_KEYS;
    jit__cache_entry want, got;
    make_entry(1000 + i, RACE_PAYLOAD, &want);
    jit__cache_lock lock;
    bool acquired = false, found = false;
    jit__cache_lock_key(t->cache, want.key, 20000, &lock, &acquired);
    if (!acquired) t->rc = 2;
    jit_status s = jit__cache_get(t->cache, want.key, &got, &found);
    if (s) t->rc = 3;
    jit_status_free(s);
    if (found) {
      if (!same_entry(&want, &got)) t->rc = 4;
      jit__cache_entry_release(&got);
    } else if (!t->rc) {
      // "Compile": record it, then store it.
      char line[64];
      jit__cache_key_hex(want.key, line);
      strcat(line, "\n");
      if (write(t->log_fd, line, strlen(line)) != (ssize_t)strlen(line)) t->rc = 5;
      usleep(2000);  // compiling takes a while: the others pile up on the lock
      s = jit__cache_put(t->cache, &want);
      if (s) t->rc = 6;
      jit_status_free(s);
    }
    jit__cache_unlock(&lock);
    jit__cache_entry_release(&want);
  }
  return NULL;
}

static int race_child(int proc, int start_fd, const char *log_path) {
  jit__cache *c = NULL;
  jit__cache_options o = {.dir = g_dir};
  if (jit__cache_open(&o, &c) || !jit__cache_enabled(c)) return 20;
  int log_fd = open(log_path, O_WRONLY | O_APPEND | O_CLOEXEC);
  if (log_fd < 0) return 21;
  char b;
  (void)!read(start_fd, &b, 1);  // EOF when the parent closes its end: all start now
  race_thread t[RACE_THREADS];
  pthread_t th[RACE_THREADS];
  for (int k = 0; k < RACE_THREADS; k++) {
    t[k] = (race_thread){c, proc, k, log_fd, 0};
    pthread_create(&th[k], NULL, race_body, &t[k]);
  }
  int rc = 0;
  for (int k = 0; k < RACE_THREADS; k++) {
    pthread_join(th[k], NULL);
    if (t[k].rc && !rc) rc = t[k].rc;
  }
  if (!rc && stats_of(c).bad_entries) rc = 7;
  close(log_fd);
  jit__cache_close(c);
  return rc;
}

Test(cache, races_compile_each_key_once) {
  char log_path[PATH_MAX];
  snprintf(log_path, sizeof(log_path), "%s/compiles.log", g_root);
  write_file(log_path, "", 0);
  int start[2];
  cr_assert_eq(pipe(start), 0);
  pid_t pids[RACE_PROCS];
  for (int p = 0; p < RACE_PROCS; p++) {
    pids[p] = fork();
    cr_assert(pids[p] >= 0);
    if (pids[p] == 0) {
      close(start[1]);
      _exit(race_child(p, start[0], log_path));
    }
  }
  close(start[0]);
  close(start[1]);  // the barrier: every child's read returns now
  for (int p = 0; p < RACE_PROCS; p++) {
    int status;
    cr_assert_eq(waitpid(pids[p], &status, 0), pids[p]);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "process %d: status %d", p,
              status);
  }
  // Each key compiled exactly once across all 32 threads.
  uint8_t *text;
  size_t size;
  read_file(log_path, &text, &size);
  cr_assert_eq(size, (size_t)RACE_KEYS * 33, "compiles logged: %.*s", (int)size, text);
  for (int i = 0; i < RACE_KEYS; i++) {
    uint8_t key[16];
    char hex[40];
    make_key(1000 + i, key);
    jit__cache_key_hex(key, hex);
    strcat(hex, "\n");
    char *first = memmem(text, size, hex, 33);
    cr_assert_not_null(first, "key %d never compiled", i);
    cr_assert_null(memmem(first + 33, size - (size_t)(first + 33 - (char *)text), hex, 33),
                   "key %d compiled twice", i);
  }
  free(text);
  jit__cache *c = open_dir(g_dir);
  uint64_t checked, bad;
  OK(jit__cache_verify(c, &checked, &bad));
  cr_assert_eq(checked, RACE_KEYS);
  cr_assert_eq(bad, 0);
  cr_assert_eq(census(g_dir).temps, 0);
  jit__cache_close(c);
}

//===--- list, clear, bundles -----------------------------------------------------------===//

typedef struct listed {
  int count;
  uint64_t bytes;
  bool components_ok;
} listed;

static bool list_visit(void *user, const jit__cache_entry *e, const char *path, uint64_t size,
                       int64_t atime) {
  listed *l = user;
  l->count++;
  l->bytes += size;
  if (!e->components || !strstr(e->components, "graph=g") || e->payload != NULL ||
      e->payload_size != 1234 || !strstr(path, ".jitk") || atime <= 0)
    l->components_ok = false;
  return true;
}

Test(cache, list_and_clear) {
  jit__cache *c = open_dir(g_dir);
  for (int i = 0; i < 5; i++) put_entry(c, i, 1234);
  listed l = {.components_ok = true};
  OK(jit__cache_list(c, list_visit, &l));
  cr_assert_eq(l.count, 5);
  cr_assert(l.components_ok);
  cr_assert_eq(l.bytes, census(g_dir).entry_bytes);
  uint64_t removed = 0;
  OK(jit__cache_clear(c, &removed));
  cr_assert_eq(removed, 5);
  for (int i = 0; i < 5; i++) cr_assert(!get_check(c, i, 1234));
  put_entry(c, 1, 1234);  // usable after a clear
  cr_assert(get_check(c, 1, 1234));
  jit__cache_close(c);
}

Test(cache, bundle_round_trip_and_corruption) {
  jit__cache *c = open_dir(g_dir);
  for (int i = 0; i < 6; i++) put_entry(c, i, 3000 + (size_t)i);
  char bundle[PATH_MAX], broken[PATH_MAX];
  snprintf(bundle, sizeof(bundle), "%s/prewarm.jitmlb", g_root);
  snprintf(broken, sizeof(broken), "%s/broken.jitmlb", g_root);
  uint64_t n = 0;
  OK(jit__cache_export(c, bundle, NULL, &n));
  cr_assert_eq(n, 6);
  uint64_t removed;
  OK(jit__cache_clear(c, &removed));
  cr_assert_eq(removed, 6);
  OK(jit__cache_import(c, bundle, &n));
  cr_assert_eq(n, 6);
  for (int i = 0; i < 6; i++) cr_assert(get_check(c, i, 3000 + (size_t)i), "entry %d", i);

  uint8_t *bytes;
  size_t size;
  read_file(bundle, &bytes, &size);
  OK(jit__cache_clear(c, &removed));
  // A bit flipped in the last entry's payload: refused, and nothing imported (the
  // first five entries are fine, but a damaged bundle imports nothing).
  bytes[size - 10] ^= 4;
  write_file(broken, bytes, size);
  FAILS(jit__cache_import(c, broken, &n), JIT_CACHE_ERROR);
  cr_assert_eq(n, 0);
  cr_assert_eq(census(g_dir).entries, 0);
  bytes[size - 10] ^= 4;
  // Truncated.
  write_file(broken, bytes, size - 100);
  FAILS(jit__cache_import(c, broken, &n), JIT_CACHE_ERROR);
  // Manifest damaged.
  bytes[70] ^= 1;
  write_file(broken, bytes, size);
  FAILS(jit__cache_import(c, broken, &n), JIT_CACHE_ERROR);
  bytes[70] ^= 1;
  // Another format version (header checksum recomputed, so only the version differs).
  jit__le_put_u32(bytes + 12, JIT__CACHE_FORMAT_VERSION + 1);
  jit__le_put_u64(bytes + 48, XXH3_64bits(bytes, 48));
  write_file(broken, bytes, size);
  jit_status s = jit__cache_import(c, broken, &n);
  cr_assert(s && strstr(jit_status_message(s), "format") != NULL, "%s", jit_status_message(s));
  jit_status_free(s);
  // Not a bundle at all.
  write_file(broken, "hello", 5);
  FAILS(jit__cache_import(c, broken, &n), JIT_CACHE_ERROR);
  free(bytes);
  cr_assert_eq(census(g_dir).entries, 0);
  // The good bundle still imports.
  OK(jit__cache_import(c, bundle, &n));
  cr_assert_eq(n, 6);
  jit__cache_close(c);
}

// A cache that trusts `keys` (text as jit__sign_parse_keys takes it), on g_dir.
static jit__cache *open_trusting(const char *keys) {
  jit__trusted_keys trusted;
  OK(jit__sign_parse_keys(keys, "test", &trusted));
  jit__cache_options o = {.dir = g_dir, .trusted = &trusted};
  return open_opts(&o);
}

// Signed bundles: made with a key from keygen; imported where that key is trusted
// or none is; refused where another key is trusted, when unsigned under a trust list,
// altered after signing, stripped of its signature, or with a bad trailer.
Test(cache, signed_bundles) {
  char sk_path[PATH_MAX], sk2_path[PATH_MAX], bundle[PATH_MAX], plain[PATH_MAX],
      broken[PATH_MAX];
  snprintf(sk_path, sizeof sk_path, "%s/signing.key", g_root);
  snprintf(sk2_path, sizeof sk2_path, "%s/other.key", g_root);
  snprintf(bundle, sizeof bundle, "%s/signed.jitmlb", g_root);
  snprintf(plain, sizeof plain, "%s/plain.jitmlb", g_root);
  snprintf(broken, sizeof broken, "%s/broken.jitmlb", g_root);
  char pk[65], pk2[65];
  OK(jit__sign_keygen(sk_path, pk));
  OK(jit__sign_keygen(sk2_path, pk2));
  cr_assert_eq(strlen(pk), 64);
  struct stat st;
  cr_assert_eq(stat(sk_path, &st), 0);
  cr_assert_eq(st.st_mode & 0777, 0600);
  char scratch[65];
  FAILS(jit__sign_keygen(sk_path, scratch), JIT_INVALID_ARGUMENT);  // never replaced
  uint8_t sk[JIT__SIGN_SECRET_BYTES];
  OK(jit__sign_read_secret(sk_path, sk));

  jit__cache *c = open_dir(g_dir);
  for (int i = 0; i < 4; i++) put_entry(c, i, 2000 + (size_t)i);
  uint64_t n = 0, removed = 0;
  OK(jit__cache_export(c, bundle, sk, &n));
  cr_assert_eq(n, 4);
  OK(jit__cache_export(c, plain, NULL, &n));
  OK(jit__cache_clear(c, &removed));
  // No key trusted: signed and unsigned bundles both import.
  OK(jit__cache_import(c, bundle, &n));
  cr_assert_eq(n, 4);
  OK(jit__cache_import(c, plain, &n));
  jit__cache_close(c);

  char both[200];
  snprintf(both, sizeof both, "%s, %s", pk2, pk);
  c = open_trusting(both);
  OK(jit__cache_clear(c, &removed));
  OK(jit__cache_import(c, bundle, &n));
  cr_assert_eq(n, 4);
  for (int i = 0; i < 4; i++) cr_assert(get_check(c, i, 2000 + (size_t)i), "entry %d", i);
  OK(jit__cache_clear(c, &removed));
  jit_status s = jit__cache_import(c, plain, &n);
  cr_assert(s && strstr(jit_status_message(s), "unsigned"), "%s",
            s ? jit_status_message(s) : "imported");
  jit_status_free(s);

  uint8_t *bytes;
  size_t size;
  read_file(bundle, &bytes, &size);
  // Altered after signing (a byte of an entry; its own checksum would catch it later,
  // the signature first).
  bytes[size - 200] ^= 1;
  write_file(broken, bytes, size);
  s = jit__cache_import(c, broken, &n);
  cr_assert(s && strstr(jit_status_message(s), "does not verify"), "%s",
            s ? jit_status_message(s) : "imported");
  jit_status_free(s);
  bytes[size - 200] ^= 1;
  // The signature itself damaged, and the trailer cut short.
  bytes[size - 1] ^= 1;
  write_file(broken, bytes, size);
  FAILS(jit__cache_import(c, broken, &n), JIT_CACHE_ERROR);
  bytes[size - 1] ^= 1;
  write_file(broken, bytes, size - 10);
  FAILS(jit__cache_import(c, broken, &n), JIT_CACHE_ERROR);
  // Stripped: the trailer cut off and the header made version 1 (checksum redone).
  jit__le_put_u32(bytes + 8, 1);
  jit__le_put_u64(bytes + 48, XXH3_64bits(bytes, 48));
  write_file(broken, bytes, size - JIT__SIGN_TRAILER_BYTES);
  s = jit__cache_import(c, broken, &n);
  cr_assert(s && strstr(jit_status_message(s), "unsigned"), "%s",
            s ? jit_status_message(s) : "imported");
  jit_status_free(s);
  free(bytes);
  cr_assert_eq(census(g_dir).entries, 0);
  jit__cache_close(c);

  // Trusting only the other key.
  c = open_trusting(pk2);
  s = jit__cache_import(c, bundle, &n);
  cr_assert(s && strstr(jit_status_message(s), "not a trusted key"), "%s",
            s ? jit_status_message(s) : "imported");
  jit_status_free(s);
  jit__cache_close(c);

  // Secret key files: readable by others, or not a key, are refused.
  cr_assert_eq(chmod(sk_path, 0644), 0);
  FAILS(jit__sign_read_secret(sk_path, sk), JIT_INVALID_ARGUMENT);
  write_file(sk2_path, "not a key\n", 10);
  cr_assert_eq(chmod(sk2_path, 0600), 0);
  FAILS(jit__sign_read_secret(sk2_path, sk), JIT_INVALID_ARGUMENT);
  FAILS(jit__sign_read_secret(g_root, sk), JIT_INVALID_ARGUMENT);  // a directory
}

Test(cache, trusted_key_lists) {
  jit__trusted_keys k;
  OK(jit__sign_parse_keys("", "test", &k));
  cr_assert_eq(k.n, 0);
  OK(jit__sign_parse_keys(NULL, "test", &k));
  char two[200];
  memset(two, 'a', 64);
  two[64] = ',';
  memset(two + 65, '0', 64);
  two[129] = 0;
  OK(jit__sign_parse_keys(two, "test", &k));
  cr_assert_eq(k.n, 2);
  cr_assert_eq(k.keys[0][0], 0xaa);
  jit_status s = jit__sign_parse_keys("abcd", "JITML_TRUSTED_KEYS", &k);
  cr_assert(s && jit_status_get_code(s) == JIT_INVALID_ARGUMENT &&
            strstr(jit_status_message(s), "JITML_TRUSTED_KEYS: `abcd`"), "%s",
            s ? jit_status_message(s) : "OK");
  jit_status_free(s);
  two[3] = 'g';
  FAILS(jit__sign_parse_keys(two, "test", &k), JIT_INVALID_ARGUMENT);
  char many[17 * 65 + 1] = "";
  for (int i = 0; i < 17; i++) {
    memset(many + 65 * i, 'b', 64);
    many[65 * i + 64] = ' ';
  }
  many[17 * 65] = 0;
  FAILS(jit__sign_parse_keys(many, "test", &k), JIT_INVALID_ARGUMENT);
}

Test(cache, threads_share_one_handle) {
  jit__cache *c = open_dir(g_dir);
  race_thread t[8];
  pthread_t th[8];
  int log_fd = open("/dev/null", O_WRONLY);
  for (int k = 0; k < 8; k++) {
    t[k] = (race_thread){c, k / 4, k % 4, log_fd, 0};
    pthread_create(&th[k], NULL, race_body, &t[k]);
  }
  for (int k = 0; k < 8; k++) {
    pthread_join(th[k], NULL);
    cr_assert_eq(t[k].rc, 0, "thread %d", k);
  }
  close(log_fd);
  jit__cache_stats s = stats_of(c);
  cr_assert_eq(s.puts, RACE_KEYS);
  cr_assert_eq(s.hits + s.misses, 8 * RACE_KEYS);
  cr_assert_eq(s.misses, RACE_KEYS);
  jit__cache_close(c);
}
