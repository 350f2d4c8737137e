//===--- cache_fixture.h - a private disk cache per test, and stats ---------===//
//
// Suites that count compiles point JITML_CACHE_DIR (and XDG_CACHE_HOME) at a fresh
// temporary directory per test, so kernels cached by earlier runs cannot turn a
// compile into a disk hit. Use: TestSuite(name, .init = tu_cache_setup,
// .fini = tu_cache_teardown). Needs _XOPEN_SOURCE 700 (mkdtemp, setenv, nftw).
//
//===----------------------------------------------------------------------===//
#ifndef JITML_TESTS_CACHE_FIXTURE_H_
#define JITML_TESTS_CACHE_FIXTURE_H_

#include <ftw.h>

#include "util.h"

static char tu_cache_dir[256];

static int tu_remove_entry(const char *path, const struct stat *sb, int flag,
                           struct FTW *ftw) {
  (void)sb;
  (void)flag;
  (void)ftw;
  return remove(path);
}

static void tu_cache_setup(void) {
  const char *tmp = getenv("TMPDIR");
  snprintf(tu_cache_dir, sizeof(tu_cache_dir), "%s/jitml-test-XXXXXX",
           tmp && *tmp ? tmp : "/tmp");
  cr_assert(mkdtemp(tu_cache_dir) != NULL, "mkdtemp failed");
  setenv("JITML_CACHE_DIR", tu_cache_dir, 1);
  setenv("XDG_CACHE_HOME", tu_cache_dir, 1);
}

static void tu_cache_teardown(void) {
  if (tu_cache_dir[0]) nftw(tu_cache_dir, tu_remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static inline jit_stats get_stats(jit_context *ctx) {
  jit_stats st;
  memset(&st, 0, sizeof(st));
  st.struct_size = sizeof(st);
  TU_OK(jit_context_stats(ctx, &st));
  return st;
}

#endif  // JITML_TESTS_CACHE_FIXTURE_H_
