//===--- opt.c - an mlir-opt with libjitml's passes (jit_mlir_opt) -----------===//
//
// Parses a module, runs a textual pass pipeline on it and prints the result, so that
// one pass can be run and tested at a time (`jitml opt`). MLIR's C API cannot add a
// pass to the registry that its pipeline parser reads, so the pipeline is split here:
// its elements (top level, and inside func.func(...)) go to the pass manager one
// element at a time, MLIR's own through mlirOpPassManagerAddPipeline and ours by name:
//
//   jitml-lower-matmul-to-loops   (on func.func; pass_matmul_loops.c)
//
// `builtin.module(...)` around the whole pipeline is optional, as with mlir-opt. Text
// goes through mlir_guard.c's checks first, as jit_graph_from_mlir's does.
//
//===----------------------------------------------------------------------===//
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mlir-c/IR.h>
#include <mlir-c/Pass.h>

#include "base/status.h"
#include "base/text.h"
#include "lowering/import.h"

static const char kMatmulLoops[] = "jitml-lower-matmul-to-loops";

static MlirStringRef sr(const char *s, size_t n) { return mlirStringRefCreate(s, n); }

static void append(MlirStringRef s, void *user) { jit__text_append(user, s.data, s.length); }

// The length of the element starting at `p` (up to a ',' outside brackets, or `end`).
static size_t element_length(const char *p, const char *end) {
  int depth = 0;
  const char *q = p;
  for (; q < end; q++) {
    if (*q == '(' || *q == '{' || *q == '[') depth++;
    else if (*q == ')' || *q == '}' || *q == ']') depth--;
    else if (*q == ',' && depth == 0) break;
  }
  return (size_t)(q - p);
}

static void trim(const char **p, size_t *n) {
  while (*n && (**p == ' ' || **p == '\n' || **p == '\t')) (*p)++, (*n)--;
  while (*n && ((*p)[*n - 1] == ' ' || (*p)[*n - 1] == '\n' || (*p)[*n - 1] == '\t')) (*n)--;
}

// Whether [p, p + n) is `<anchor>(...)`; then [*in, *in + *in_n) is what the
// parentheses hold.
static bool nested(const char *p, size_t n, const char *anchor, const char **in,
                   size_t *in_n) {
  size_t a = strlen(anchor);
  if (n < a + 2 || memcmp(p, anchor, a) != 0 || p[a] != '(' || p[n - 1] != ')') return false;
  *in = p + a + 1;
  *in_n = n - a - 2;
  return true;
}

typedef struct adder {
  jit__diag *diag;
  jit_status status;
} adder;

// Adds the elements of [p, p + n) to `pm` (anchored on `anchor`: "builtin.module" or
// "func.func"), recursing into func.func(...) so that our pass can sit among others.
static void add_elements(adder *ad, MlirOpPassManager pm, const char *anchor, const char *p,
                         size_t n) {
  const char *end = p + n;
  while (p < end && !ad->status) {
    size_t len = element_length(p, end);
    const char *e = p;
    size_t en = len;
    trim(&e, &en);
    const char *in;
    size_t in_n;
    if (en == strlen(kMatmulLoops) && !memcmp(e, kMatmulLoops, en)) {
      MlirOpPassManager f = pm;
      if (!strcmp(anchor, "builtin.module"))
        f = mlirOpPassManagerGetNestedUnder(pm, mlirStringRefCreateFromCString("func.func"));
      mlirOpPassManagerAddOwnedPass(f, jit__create_matmul_to_loops_pass());
    } else if (!strcmp(anchor, "builtin.module") && nested(e, en, "func.func", &in, &in_n)) {
      MlirOpPassManager f =
          mlirOpPassManagerGetNestedUnder(pm, mlirStringRefCreateFromCString("func.func"));
      add_elements(ad, f, "func.func", in, in_n);
    } else if (en) {
      size_t before = ad->diag->len;
      MlirLogicalResult r = mlirOpPassManagerAddPipeline(pm, sr(e, en), jit__diag_append, ad->diag);
      if (mlirLogicalResultIsFailure(r))
        ad->status = JIT_ERR(JIT_INVALID_ARGUMENT,
                             "the pass pipeline element `%.*s` does not parse (on %s): %s",
                             (int)en, e, anchor,
                             ad->diag->len > before ? ad->diag->buf + before : "unknown pass");
    }
    p += len + (p + len < end);
  }
}

jit_status jit__mlir_opt(const char *text, size_t length, const char *pipeline,
                         const char *source_name, char **out_text) {
  *out_text = NULL;
  const char *file = source_name && source_name[0] ? source_name : "<input>";
  JIT_PROPAGATE(jit__mlir_guard(text, length, file));
  char *copy = malloc(length + 1);  // the lexer expects a NUL after the text
  if (!copy) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory for %zu bytes", length);
  memcpy(copy, text, length);
  copy[length] = 0;
  jit__diag diag = {{0}, 0, file};
  MlirContext ctx = jit__mlir_context_create(&diag);
  jit_status status = NULL;
  MlirModule module = mlirModuleCreateParse(ctx, sr(copy, length));
  if (mlirModuleIsNull(module)) {
    status = JIT_ERR(JIT_PARSE_ERROR, "parsing MLIR: %s",
                     diag.len ? diag.buf : "the text is not an MLIR module");
  } else {
    const char *p = pipeline, *in;
    size_t n = strlen(pipeline), in_n;
    trim(&p, &n);
    if (nested(p, n, "builtin.module", &in, &in_n)) p = in, n = in_n;
    MlirPassManager pm = mlirPassManagerCreate(ctx);
    adder ad = {&diag, NULL};
    diag.len = 0;
    diag.buf[0] = 0;
    add_elements(&ad, mlirPassManagerGetAsOpPassManager(pm), "builtin.module", p, n);
    status = ad.status;
    if (!status) {
      diag.len = 0;
      diag.buf[0] = 0;
      MlirLogicalResult r = mlirPassManagerRunOnOp(pm, mlirModuleGetOperation(module));
      if (mlirLogicalResultIsFailure(r))
        status = JIT_ERR(JIT_COMPILE_ERROR, "running the pipeline: %s",
                         diag.len ? diag.buf : "a pass failed (no diagnostic)");
    }
    mlirPassManagerDestroy(pm);
    if (!status) {
      jit__text b = {0};
      mlirOperationPrint(mlirModuleGetOperation(module), append, &b);
      jit__text_append(&b, "\n", 1);
      if (b.oom || !b.p) {
        free(b.p);
        status = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory printing the module");
      } else {
        *out_text = b.p;
      }
    }
    mlirModuleDestroy(module);
  }
  mlirContextDestroy(ctx);
  free(copy);
  return status;
}
