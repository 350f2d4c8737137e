//===--- fuzz_spec.c - libFuzzer target: the jitml tool's SPEC parser -----===//
//
// Any text: parsed or refused with a reason; a parsed SPEC has at most the values and
// bindings tools/spec.h promises, each value >= 1.
//
//===----------------------------------------------------------------------===//
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tools/spec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = malloc(size + 1);
  if (!text) return 0;
  memcpy(text, data, size);
  text[size] = 0;
  binding_set b;
  char why[256] = "";
  if (parse_spec(text, &b, why, sizeof why) == 0) {
    if (binding_count(&b) > kSpecBindings) abort();  // "" is one binding of no symbol
    for (int i = 0; i < b.n_symbols; i++) {
      if (b.n_values[i] < 1 || b.n_values[i] > kSpecValues) abort();
      for (int k = 0; k < b.n_values[i]; k++)
        if (b.values[i][k] < 1) abort();
    }
  } else if (!why[0]) {
    abort();  // a refusal says why
  }
  free_bindings(&b);
  free(text);
  return 0;
}
