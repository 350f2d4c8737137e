//===--- fuzz_bundle.c - libFuzzer target: importing a cache bundle -------===//
//
// Each input becomes a bundle file, imported into a cache in a private temporary
// directory: import must refuse what it cannot verify, never crash, and never store
// an entry that does not verify afterwards. The input is the bundle after its header
// (the manifest, then the entries) preceded by two u32s, the manifest's size and the
// entry count; the harness writes a header with valid checksums (cache/bundle.c's
// layout), so mutations get past them into the manifest and entry checks.
//
//===----------------------------------------------------------------------===//
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <xxhash.h>

#include "base/bytes.h"
#include "cache/cache.h"

static jit__cache *g_cache;
static char g_bundle[4096];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  char dir[] = "/tmp/jitml-fuzz-bundle-XXXXXX";
  if (!mkdtemp(dir)) abort();
  char cache_dir[4096];
  snprintf(cache_dir, sizeof cache_dir, "%s/cache", dir);
  snprintf(g_bundle, sizeof g_bundle, "%s/in.bundle", dir);
  jit__cache_options o = {.dir = cache_dir, .max_bytes = 64u << 20};
  jit_status s = jit__cache_open(&o, &g_cache);
  if (s || !jit__cache_enabled(g_cache)) abort();
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 8) return 0;
  uint64_t count = jit__le_get_u32(data + 4);
  size_t body = size - 8, manifest = jit__le_get_u32(data);
  if (manifest > body) manifest = body;
  uint8_t header[64] = "JITMLB";
  header[7] = 1;
  jit__le_put_u32(header + 8, 1);
  jit__le_put_u32(header + 12, JIT__CACHE_FORMAT_VERSION);
  jit__le_put_u64(header + 16, count);
  jit__le_put_u64(header + 24, manifest);
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits(data + 8, manifest));
  memcpy(header + 32, c.digest, 16);
  jit__le_put_u64(header + 48, XXH3_64bits(header, 48));
  FILE *f = fopen(g_bundle, "wb");
  if (!f) abort();
  if (fwrite(header, 1, 64, f) != 64 || (body && fwrite(data + 8, 1, body, f) != body))
    abort();
  fclose(f);
  count = 0;
  jit_status s = jit__cache_import(g_cache, g_bundle, &count);
  jit_status_free(s);
  if (!s && count) {
    // Whatever was imported verifies.
    uint64_t checked = 0, bad = 0;
    jit_status v = jit__cache_verify(g_cache, &checked, &bad);
    if (v || bad) abort();
    jit_status_free(v);
  }
  return 0;
}
