//===--- paths.h - which code path a kernel took, from its dumped IR ---------===//
//
// For the suites that check the CPU strategy's choices (test_perf_paths.c,
// test_forall_paths.c): contexts that compile every kernel (no disk cache) for a thread
// count, optionally dumping each stage's IR into a temporary directory that a test
// then searches. Static functions: each suite gets its own copy and dump directory.
// Define _XOPEN_SOURCE 700 (or _GNU_SOURCE) before including it: nftw.
//
//===----------------------------------------------------------------------===//
#ifndef JITML_TESTS_PATHS_H
#define JITML_TESTS_PATHS_H

#include <dirent.h>
#include <ftw.h>
#include <stdbool.h>
#include <sys/stat.h>

#include "util.h"

// The L2 that $JITML_CPU_L2 pins (bytes, or a number with a K or M suffix: the
// library's grammar), or 0 when it pins none (the host's own L2 then decides).
static inline long pinned_l2(void) {
  const char *e = getenv("JITML_CPU_L2");
  char *end = NULL;
  long v = e ? strtol(e, &end, 10) : 0;
  if (end && (*end == 'K' || *end == 'k')) v <<= 10;
  if (end && (*end == 'M' || *end == 'm')) v <<= 20;
  return v >= (16 << 10) ? v : 0;
}

// When set, contexts dump every stage's IR here, so a test can check which path the
// strategy took.
static char g_dump_dir[256];

// A context for `threads` threads whose log messages of `level` and up (none when `fn`
// is NULL) go to fn(user, ...).
static inline jit_context *ctx_logged(int threads, jit_log_fn fn, void *user,
                                      jit_log_level level) {
  jit_options o;
  jit_options_init(&o);
  o.num_threads = threads;
  o.cache_dir = "";  // compile every kernel: this suite is about the compiler
  if (g_dump_dir[0]) o.dump_ir_dir = g_dump_dir;
  o.log_fn = fn;
  o.log_user_data = user;
  o.log_level = level;
  jit_context *ctx = NULL;
  TU_OK(jit_context_create(&o, &ctx));
  return ctx;
}

static inline jit_context *ctx_threads(int threads) {
  return ctx_logged(threads, NULL, NULL, JIT_LOG_ERROR);
}

static inline int rm_entry(const char *path, const struct stat *sb, int flag,
                           struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(path);
}

// Contexts made by ctx_threads between these two dump every stage of every kernel into
// a fresh temporary directory, removed by dump_end.
static inline void dump_begin(void) {
  snprintf(g_dump_dir, sizeof g_dump_dir, "/tmp/jitml-test-paths-XXXXXX");
  cr_assert(mkdtemp(g_dump_dir));
}

static inline void dump_end(void) {
  nftw(g_dump_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  g_dump_dir[0] = 0;
}

// The text (its first 256 KiB) of the `index`-th dumped stage `suffix` of the kernels
// compiled while g_dump_dir was set, in a static buffer; NULL past the last.
static inline const char *dump_text(const char *suffix, int index) {
  DIR *d = opendir(g_dump_dir);
  cr_assert(d, "cannot open %s", g_dump_dir);
  static char buf[1 << 18];
  const char *text = NULL;
  for (struct dirent *e; (e = readdir(d)) && !text;) {
    size_t n = strlen(e->d_name), m = strlen(suffix);
    if (n < m || strcmp(e->d_name + n - m, suffix) || index-- > 0) continue;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", g_dump_dir, e->d_name);
    FILE *f = fopen(path, "rb");
    cr_assert(f);
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    buf[len] = 0;
    fclose(f);
    text = buf;
  }
  closedir(d);
  return text;
}

// Whether the dumped stage `suffix` of a kernel compiled while g_dump_dir was set
// holds `needle`.
static inline bool dump_has(const char *suffix, const char *needle) {
  const char *text;
  for (int i = 0; (text = dump_text(suffix, i)); i++)
    if (strstr(text, needle)) return true;
  return false;
}

// Whether kernels compiled for 2 threads really split: ASan builds keep every kernel
// single-threaded (devices/cpu/cpu.c: libomp is not sanitizer-clean).
#if defined(__SANITIZE_ADDRESS__)
static const bool kThreadsSplit = false;
#else
static const bool kThreadsSplit = true;
#endif

#endif  // JITML_TESTS_PATHS_H
