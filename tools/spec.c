//===--- spec.c - the jitml tool's SPEC: values of a model's symbolic dims ===//
#define _POSIX_C_SOURCE 200809L
#include "tools/spec.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void free_bindings(binding_set *b) {
  for (int i = 0; i < b->n_symbols; i++) free(b->values[i]);
  memset(b, 0, sizeof(*b));
}

size_t binding_count(const binding_set *b) {
  size_t n = 1;
  for (int i = 0; i < b->n_symbols; i++) n *= (size_t)b->n_values[i];
  return n;
}

// A decimal >= 1 and < 2^62 at *p, which moves past it; false if there is none.
static bool read_size(const char **p, int64_t *out) {
  const char *s = *p;
  int64_t v = 0;
  int digits = 0;
  while (*s >= '0' && *s <= '9') {
    if (v > ((int64_t)1 << 62) / 10) return false;
    v = v * 10 + (*s++ - '0');
    digits++;
  }
  if (!digits || v < 1 || v >= ((int64_t)1 << 62)) return false;
  *p = s;
  *out = v;
  return true;
}

// One item: N, LO-HI or LO-HI:STEP, appended to symbol i's values.
static int add_item(const char *item, binding_set *b, int i, char *why, size_t n) {
  int64_t lo, hi, step = 1;
  const char *p = item;
  if (!read_size(&p, &lo)) goto bad;
  hi = lo;
  if (*p == '-') {
    p++;
    if (!read_size(&p, &hi) || hi < lo) goto bad;
    if (*p == ':') {
      p++;
      if (!read_size(&p, &step)) goto bad;
    }
  }
  if (*p) goto bad;
  // Values the range has, without overflow: (hi - lo) / step + 1.
  int64_t count = (hi - lo) / step + 1;
  if (count > kSpecValues - b->n_values[i]) {
    snprintf(why, n, "bad SPEC: `%s` has more than %d values", b->names[i], kSpecValues);
    return -1;
  }
  for (int64_t k = 0; k < count; k++) b->values[i][b->n_values[i]++] = lo + k * step;
  return 0;
bad:
  snprintf(why, n, "bad SPEC value `%.40s`: use N, LO-HI or LO-HI:STEP with sizes >= 1",
           item);
  return -1;
}

int parse_spec(const char *spec, binding_set *b, char *why, size_t n) {
  memset(b, 0, sizeof(*b));
  if (!spec) {
    snprintf(why, n, "missing --shapes/--shape SPEC, e.g. 'N=1,2,4'");
    return -1;
  }
  char *copy = strdup(spec), *save = NULL;
  if (!copy) {
    snprintf(why, n, "out of memory");
    return -1;
  }
  int rc = 0;
  size_t combos = 1;
  for (char *part = strtok_r(copy, ";", &save); part && !rc; part = strtok_r(NULL, ";", &save)) {
    char *eq = strchr(part, '=');
    if (!eq || eq == part || b->n_symbols == kSpecSymbols) {
      snprintf(why, n, "bad SPEC: expected NAME=VALUES (at most %d symbols)", kSpecSymbols);
      rc = -1;
      break;
    }
    *eq = 0;
    int i = b->n_symbols++;
    snprintf(b->names[i], sizeof b->names[i], "%s", part);
    b->values[i] = malloc(sizeof(int64_t) * kSpecValues);
    if (!b->values[i]) {
      snprintf(why, n, "out of memory");
      rc = -1;
      break;
    }
    char *save2 = NULL;
    for (char *item = strtok_r(eq + 1, ",", &save2); item && !rc;
         item = strtok_r(NULL, ",", &save2))
      rc = add_item(item, b, i, why, n);
    if (!rc && !b->n_values[i]) {
      snprintf(why, n, "bad SPEC: symbol `%s` without values", b->names[i]);
      rc = -1;
    }
    if (!rc && (combos *= (size_t)b->n_values[i]) > kSpecBindings) {
      snprintf(why, n, "bad SPEC: more than %d bindings", kSpecBindings);
      rc = -1;
    }
  }
  free(copy);
  return rc;
}
