//===--- fuzz_entry.c - libFuzzer target: a cache entry, as a hit reads it ===//
//
// The input is an entry's body (meta, components, payload) after three u32s: payload
// kind, meta size and components size. The harness writes the header with valid
// lengths and checksums (cache/internal.h's layout), so mutations reach what a hit
// trusts after the checksums: the entry check, then the artifact record in the meta
// (cache/artifact.h), as jit/disk.c reads them.
//
//===----------------------------------------------------------------------===//
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "base/bytes.h"
#include "cache/artifact.h"
#include "cache/internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 12) return 0;
  uint64_t body = size - 12;
  jit__cache_header h = {.version = JIT__CACHE_FORMAT_VERSION,
                         .kind = jit__le_get_u32(data)};
  h.meta_size = jit__le_get_u32(data + 4);
  if (h.meta_size > body) h.meta_size = body;
  h.components_size = jit__le_get_u32(data + 8);
  if (h.components_size > body - h.meta_size) h.components_size = body - h.meta_size;
  h.payload_size = body - h.meta_size - h.components_size;
  memset(h.key, 0x5a, sizeof h.key);
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits(data + 12, body));
  memcpy(h.body_hash, c.digest, 16);
  uint8_t *entry = malloc(JIT__CACHE_HEADER_SIZE + body + 1);
  if (!entry) return 0;
  jit__cache_header_encode(&h, entry);
  memcpy(entry + JIT__CACHE_HEADER_SIZE, data + 12, body);
  jit__cache_header got;
  char why[256];
  if (jit__cache_check_bytes(entry, JIT__CACHE_HEADER_SIZE + body, h.key, &got, why,
                             sizeof why)) {
    jit__art art;
    jit_status s = jit__art_decode(entry + JIT__CACHE_HEADER_SIZE, (size_t)got.meta_size, &art);
    if (!s) jit__art_release(&art);
    jit_status_free(s);
  }
  free(entry);
  return 0;
}
