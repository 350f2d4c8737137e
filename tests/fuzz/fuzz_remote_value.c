//===--- fuzz_remote_value.c - libFuzzer target: a value from the fleet cache ===//
//
// A Redis server's value is code from another machine; whoever can write the server
// can send anything. The input's first byte picks the mode: bit 0, the rest is the raw
// value; else the rest is three u32s (payload kind, meta size, components size) and a
// body, which the harness seals with a valid header and checksum (as fuzz_entry does),
// so that mutations reach what comes after the checksum; bit 1 appends the input's
// last 104 bytes as a signature trailer; bit 2 checks against a trusted key. Whatever
// passes is taken apart as a hit would take it (cache/tier.c), and its artifact record
// decoded.
//
//===----------------------------------------------------------------------===//
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "base/bytes.h"
#include "cache/artifact.h"
#include "cache/internal.h"

static const uint8_t kKey[16] = {0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a,
                                 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a};

// A value sealed around data's body: header, body, then maybe a trailer.
static uint8_t *seal(const uint8_t *data, size_t size, bool trailer, size_t *out_size) {
  if (size < 12 + (trailer ? JIT__SIGN_TRAILER_BYTES : 0)) return NULL;
  const uint8_t *tail = data + size - JIT__SIGN_TRAILER_BYTES;
  if (trailer) size -= JIT__SIGN_TRAILER_BYTES;
  uint64_t body = size - 12;
  jit__cache_header h = {.version = JIT__CACHE_FORMAT_VERSION, .kind = jit__le_get_u32(data)};
  h.meta_size = jit__le_get_u32(data + 4);
  if (h.meta_size > body) h.meta_size = body;
  h.components_size = jit__le_get_u32(data + 8);
  if (h.components_size > body - h.meta_size) h.components_size = body - h.meta_size;
  h.payload_size = body - h.meta_size - h.components_size;
  memcpy(h.key, kKey, 16);
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits(data + 12, body));
  memcpy(h.body_hash, c.digest, 16);
  *out_size = JIT__CACHE_HEADER_SIZE + body + (trailer ? JIT__SIGN_TRAILER_BYTES : 0);
  uint8_t *v = malloc(*out_size + 1);
  if (!v) return NULL;
  jit__cache_header_encode(&h, v);
  memcpy(v + JIT__CACHE_HEADER_SIZE, data + 12, body);
  if (trailer) memcpy(v + JIT__CACHE_HEADER_SIZE + body, tail, JIT__SIGN_TRAILER_BYTES);
  return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  uint8_t mode = data[0];
  data++, size--;
  size_t value_size = size;
  uint8_t *value = NULL;
  if (mode & 1) {
    value = malloc(size + 1);
    if (value) memcpy(value, data, size);
  } else {
    value = seal(data, size, mode & 2, &value_size);
  }
  if (!value) return 0;
  jit__trusted_keys trusted = {0};
  if (mode & 4) {
    trusted.n = 1;
    memset(trusted.keys[0], 0x11, sizeof trusted.keys[0]);
  }
  jit__cache_header h;
  size_t entry_size = 0;
  char why[256];
  if (jit__cache_check_value(&trusted, kKey, value, value_size, &h, &entry_size, why,
                             sizeof why)) {
    jit__cache_entry e;
    memset(&e, 0, sizeof e);
    if (jit__cache_entry_from(&h, value, kKey, &e)) {
      jit__art art;
      jit_status s = jit__art_decode(e.meta, e.meta_size, &art);
      if (!s) jit__art_release(&art);
      jit_status_free(s);
      jit__cache_entry_release(&e);
    }
  }
  free(value);
  return 0;
}
