//===--- spec.h - the jitml tool's SPEC: values of a model's symbolic dims ===//
//
// 'N=1,2,4,8-64:8;S=128': per symbol (`;` between them) values, ranges LO-HI and
// LO-HI:STEP, sizes >= 1; every combination of the symbols' values is a binding. At
// most kSpecSymbols symbols of kSpecValues values each, and kSpecBindings
// combinations, so a SPEC can never ask for more work than it says (a range past the
// cap is refused, not truncated).
//
//===----------------------------------------------------------------------===//
#ifndef JITML_TOOLS_SPEC_H_
#define JITML_TOOLS_SPEC_H_

#include <stddef.h>
#include <stdint.h>

enum { kSpecSymbols = 16, kSpecValues = 4096, kSpecBindings = 1 << 20 };

// The symbols of a SPEC and their values. Thread-compatible.
typedef struct binding_set {
  int n_symbols;
  char names[kSpecSymbols][64];
  int64_t *values[kSpecSymbols];
  int n_values[kSpecSymbols];
} binding_set;

// Parses `spec` into `b` (free it with free_bindings, also after a failure). Returns 0,
// or -1 with what is wrong in `why`.
int parse_spec(const char *spec, binding_set *b, char *why, size_t why_size);
void free_bindings(binding_set *b);
// The number of combinations (at most kSpecBindings once parse_spec succeeded).
size_t binding_count(const binding_set *b);

#endif  // JITML_TOOLS_SPEC_H_
