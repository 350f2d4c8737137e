//===--- mlir_guard.c - cheap checks of MLIR text before MLIR's parser -------===//
//
// MLIR's parser is recursive descent and its verifiers trust some attributes, so a
// hostile text can take the process down before any diagnostic: brackets or type
// parameters nested 100,000 deep, an affine expression of 200,000 unary minuses or
// 300,000 terms (each a level of recursion: the stack overflows), a tensor.concat
// whose dim is negative (its verifier indexes with it). One pass over the text, outside
// strings and comments, refuses these with JIT_PARSE_ERROR and the line and column:
//
//   nesting of ( [ { and < (a `>` closes one, except in `->` and `>=`): at most
//       kMaxNesting levels; real models nest a dozen;
//   affine_map< and affine_set< bodies: at most kMaxAffineOps operators (+ - * and
//       the keyword operators); real maps have a handful;
//   tensor.concat: its dim, `dim(N)` or `dim = N` before the op's first `:`, a
//       decimal below 2^31;
//   `permutation =` and `dimensions =` (linalg.transpose, reduce, broadcast: their
//       custom parsers crash on anything but a list): `[`, or in an attribute
//       dictionary (generic form) also `array<i64:`, then decimals below 2^31
//       separated by commas, then `]` or `>`.
// Blanks are what MLIR's lexer skips: space, tab, newline, CR and NUL.
//
// What a worker process would catch in general (a crash anywhere in MLIR or LLVM) is
// the reliability issue's compile isolation; these guards stay as the cheap first line.
//
//===----------------------------------------------------------------------===//
#include <ctype.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "lowering/import.h"

enum { kMaxNesting = 256, kMaxAffineOps = 4096 };

typedef struct scan {
  const char *s;
  size_t n, i;
  int line, col;  // of s[i]
  size_t colon;   // check_concat's next ':' (n: none; 0: not looked for yet)
} scan;

// One character on; none past the end (an unterminated string ends there).
static void advance(scan *c) {
  if (c->i >= c->n) return;
  if (c->s[c->i] == '\n') {
    c->line++;
    c->col = 1;
  } else {
    c->col++;
  }
  c->i++;
}

static bool starts(const scan *c, const char *word) {
  size_t k = strlen(word);
  return c->i + k <= c->n && memcmp(c->s + c->i, word, k) == 0 &&
         (c->i == 0 || !(isalnum((unsigned char)c->s[c->i - 1]) || c->s[c->i - 1] == '_' ||
                         c->s[c->i - 1] == '.'));
}

// Whitespace as MLIR's lexer skips it: a NUL byte inside the text too (found by
// fuzz_mlir: `permutation\0= [1, 0T` reached linalg.transpose's parser, which crashed).
static bool blank(char ch) {
  return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\0';
}

static jit_status refuse(const scan *c, const char *file, const char *what) {
  return JIT_ERR(JIT_PARSE_ERROR, "parsing MLIR: %s:%d:%d: error: %s", file, c->line, c->col,
                 what);
}

// At `tensor.concat`: its dim, written `dim(N)` or `dim = N` before the op's first `:`
// (the custom form's types, or the generic form's `dim = N : i64`), on any line, must
// be a plain decimal below 2^31. A concat without one is left to the parser. (The line
// alone was searched before: `tensor.concat\n dim(-1)` reached the verifier, which
// crashed.) The next `:` is kept in c->colon, so the searches stay linear in all.
static jit_status check_concat(scan *c, const char *file) {
  const char *p = c->s + c->i, *end = c->s + c->n;
  if (c->colon <= c->i) {  // not looked for yet, or behind us
    const char *colon = memchr(p, ':', (size_t)(end - p));
    c->colon = colon ? (size_t)(colon - c->s) : c->n;
  }
  const char *eol = c->s + c->colon;
  for (const char *q = p + strlen("tensor.concat"); q + 3 < eol; q++) {
    if (memcmp(q, "dim", 3) != 0 || isalnum((unsigned char)q[-1]) || q[-1] == '_') continue;
    const char *v = q + 3;
    while (v < eol && blank(*v)) v++;
    if (v == eol || (*v != '(' && *v != '=')) continue;
    for (v++; v < eol && blank(*v); v++) {
    }
    int64_t value = 0;
    int digits = 0;
    while (v < eol && isdigit((unsigned char)*v) && digits < 12) {
      value = value * 10 + (*v++ - '0');
      digits++;
    }
    bool ok = digits > 0 && value < ((int64_t)1 << 31) && (v == eol || !isalnum((unsigned char)*v));
    if (!ok) return refuse(c, file, "'tensor.concat' op dim must be a non-negative decimal "
                                    "below 2^31");
    return NULL;
  }
  return NULL;
}

// At `permutation` or `dimensions` (c->i at its first letter, `word` its length): when
// followed by `=`, the value must be a list of small non-negative decimals.
static jit_status check_index_list(const scan *c, size_t word, const char *file) {
  const char *p = c->s + c->i + word, *end = c->s + c->n;
  while (p < end && blank(*p)) p++;
  if (p == end || *p != '=') return NULL;  // a use of the word, not the attribute
  for (p++; p < end && blank(*p); p++) {
  }
  // In a dictionary (after `{` or `,`) the generic form's dense array is allowed too.
  const char *b = c->s + c->i;
  while (b > c->s && blank(b[-1])) b--;
  bool dictionary = b > c->s && (b[-1] == '{' || b[-1] == ',');
  char close = ']';
  if (p < end && *p == '[') {
    p++;
  } else if (dictionary && (size_t)(end - p) >= 10 && !memcmp(p, "array<i64:", 10)) {
    p += 10;
    close = '>';
  } else {
    return refuse(c, file, "`permutation` / `dimensions` must be a list of integers");
  }
  for (bool first = true;; first = false) {
    while (p < end && blank(*p)) p++;
    if (p < end && *p == close && first) return NULL;  // empty list
    int64_t value = 0;
    int digits = 0;
    while (p < end && isdigit((unsigned char)*p) && digits < 12) {
      value = value * 10 + (*p++ - '0');
      digits++;
    }
    while (p < end && blank(*p)) p++;
    if (digits == 0 || value >= ((int64_t)1 << 31) || p == end || (*p != ',' && *p != close))
      return refuse(c, file, "`permutation` / `dimensions` must be a list of non-negative "
                             "decimals below 2^31");
    if (*p++ == close) return NULL;
  }
}

jit_status jit__mlir_guard(const char *s, size_t n, const char *file) {
  scan c = {s, n, 0, 1, 1, 0};
  int depth = 0;
  // Inside an affine_map< / affine_set<: its `<` depth and operators so far.
  int affine_depth = -1, affine_ops = 0;
  while (c.i < n) {
    char ch = s[c.i], next = c.i + 1 < n ? s[c.i + 1] : 0;
    if (ch == '"') {
      if (c.i + 15 <= n && !memcmp(s + c.i + 1, "tensor.concat\"", 14)) {
        advance(&c);
        JIT_PROPAGATE(check_concat(&c, file));
      }
      for (advance(&c); c.i < n && s[c.i] != '"' && s[c.i] != '\n'; advance(&c))
        if (s[c.i] == '\\' && c.i + 1 < n) advance(&c);
      if (c.i >= n) break;  // unterminated: the parser says where
    } else if (ch == '/' && next == '/') {
      while (c.i + 1 < n && s[c.i + 1] != '\n') advance(&c);
    } else if (ch == '(' || ch == '[' || ch == '{' || ch == '<') {
      if (ch == '<' && affine_depth < 0 && c.i >= 10 &&
          (!memcmp(s + c.i - 10, "affine_map", 10) || !memcmp(s + c.i - 10, "affine_set", 10))) {
        affine_depth = depth;
        affine_ops = 0;
      }
      if (++depth > kMaxNesting)
        return refuse(&c, file, "brackets nested deeper than 256 levels");
    } else if (ch == ')' || ch == ']' || ch == '}' ||
               (ch == '>' && next != '=' && !(c.i > 0 && s[c.i - 1] == '-'))) {
      if (depth > 0) depth--;
      if (depth == affine_depth) affine_depth = -1;
    } else if (affine_depth >= 0 &&
               (ch == '+' || (ch == '-' && next != '>') || ch == '*' || starts(&c, "floordiv") ||
                starts(&c, "ceildiv") || starts(&c, "mod"))) {
      if (++affine_ops > kMaxAffineOps)
        return refuse(&c, file, "affine expression with more than 4096 operators");
    } else if (starts(&c, "tensor.concat")) {
      JIT_PROPAGATE(check_concat(&c, file));
    } else if (starts(&c, "permutation")) {
      JIT_PROPAGATE(check_index_list(&c, strlen("permutation"), file));
    } else if (starts(&c, "dimensions")) {
      JIT_PROPAGATE(check_index_list(&c, strlen("dimensions"), file));
    }
    advance(&c);
  }
  return NULL;
}
