//===--- fuzz_artifact.c - libFuzzer target: the artifact record's decoder ===//
//
// Every input is resealed first (its end section rewritten with the checksum of the
// bytes before it), so mutations get past the checksum into the section parsers. A
// record that decodes is encoded again and must decode to the same bytes' meaning.
//
//===----------------------------------------------------------------------===//
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "base/bytes.h"
#include "cache/artifact.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  // magic + version + target, then the end section (tag 0, size 8, checksum).
  uint8_t *b = malloc(size + 32);
  if (!b) return 0;
  size_t n = 0;
  memcpy(b, "JART", 4);
  jit__le_put_u32(b + 4, JIT__ART_VERSION);
  n = 8;
  memcpy(b + n, data, size);
  n += size;
  jit__le_put_u32(b + n, 0);
  jit__le_put_u64(b + n + 4, 8);
  jit__le_put_u64(b + n + 12, XXH3_64bits(b, n));
  n += 20;
  jit__art art;
  jit_status s = jit__art_decode(b, n, &art);
  if (!s) {
    uint8_t *again = NULL;
    size_t m = 0;
    jit_status e = jit__art_encode(&art, &again, &m);
    jit__art back;
    // What was read back must be written and read again.
    if (e || jit__art_decode(again, m, &back)) abort();
    if (back.n_outputs != art.n_outputs || back.has_plan != art.has_plan ||
        back.plan.n_kernels != art.plan.n_kernels || back.plan.n_code != art.plan.n_code)
      abort();
    jit__art_release(&back);
    free(again);
    jit__art_release(&art);
  }
  jit_status_free(s);
  free(b);
  return 0;
}
