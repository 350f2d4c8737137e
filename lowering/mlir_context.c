//===--- mlir_context.c - MLIR contexts, their diagnostics, pass pipelines --===//
//
// What every compile (CPU, GPU, import) does with MLIR before and around its own
// steps: register everything once per process, make a context whose diagnostics are
// collected as text for the status (never printed), reuse contexts through a small
// pool, and run textual pass pipelines with failures turned into statuses.
//
//===----------------------------------------------------------------------===//
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <llvm-c/Target.h>
#include <mlir-c/Diagnostics.h>
#include <mlir-c/IR.h>
#include <mlir-c/Pass.h>
#include <mlir-c/RegisterEverything.h>
#include <mlir-c/Target/LLVMIR.h>

#include "base/status.h"
#include "lowering/import.h"
#include "lowering/lower.h"

//===--- Process-wide registration ---------------------------------------===//

static pthread_once_t jit__mlir_once = PTHREAD_ONCE_INIT;

static void jit__mlir_init(void) {
  mlirRegisterAllPasses();
  LLVMInitializeNativeTarget();
  LLVMInitializeNativeAsmPrinter();
}

//===--- Diagnostics and contexts ----------------------------------------===//

// Collects MLIR diagnostics as text, so they reach the status instead of stderr.
void jit__diag_append(MlirStringRef s, void *user) {
  jit__diag *d = user;
  size_t room = sizeof(d->buf) - 1 - d->len;
  size_t n = s.length < room ? s.length : room;
  memcpy(d->buf + d->len, s.data, n);
  d->len += n;
  d->buf[d->len] = 0;
}

static void jit__diag_puts(jit__diag *d, const char *s) {
  jit__diag_append(mlirStringRefCreateFromCString(s), d);
}

// Finds the first file:line:col inside `loc` (through names, call sites and fused
// locations).
static bool jit__loc_find(MlirLocation loc, MlirStringRef *file, int *line, int *col,
                          int depth) {
  if (depth > 16) return false;
  if (mlirLocationIsAFileLineColRange(loc)) {
    *file = mlirIdentifierStr(mlirLocationFileLineColRangeGetFilename(loc));
    *line = mlirLocationFileLineColRangeGetStartLine(loc);
    *col = mlirLocationFileLineColRangeGetStartColumn(loc);
    return true;
  }
  if (mlirLocationIsAName(loc))
    return jit__loc_find(mlirLocationNameGetChildLoc(loc), file, line, col, depth + 1);
  if (mlirLocationIsACallSite(loc))
    return jit__loc_find(mlirLocationCallSiteGetCallee(loc), file, line, col, depth + 1);
  if (mlirLocationIsAFused(loc)) {
    intptr_t n = mlirLocationFusedGetNumLocations(loc);
    if (n <= 0 || n > 64) return false;
    MlirLocation locs[64];
    mlirLocationFusedGetLocations(loc, locs);
    for (intptr_t i = 0; i < n; i++)
      if (jit__loc_find(locs[i], file, line, col, depth + 1)) return true;
  }
  return false;
}

static MlirLogicalResult jit__diag_handler(MlirDiagnostic diag, void *user) {
  jit__diag *d = user;
  // Remarks (which passes may emit on success) are no part of an error message.
  if (mlirDiagnosticGetSeverity(diag) == MlirDiagnosticRemark)
    return mlirLogicalResultSuccess();
  if (d->len) jit__diag_puts(d, "; ");
  MlirStringRef file;
  int line = 0, col = 0;
  if (jit__loc_find(mlirDiagnosticGetLocation(diag), &file, &line, &col, 0)) {
    char pos[48];
    if (file.length == 0 || (d->file && file.length == 1 && file.data[0] == '-'))
      jit__diag_puts(d, d->file ? d->file : "<input>");
    else
      jit__diag_append(file, d);
    snprintf(pos, sizeof pos, ":%d:%d", line, col);
    jit__diag_puts(d, pos);
  } else {
    mlirLocationPrint(mlirDiagnosticGetLocation(diag), jit__diag_append, d);
  }
  MlirDiagnosticSeverity sev = mlirDiagnosticGetSeverity(diag);
  jit__diag_puts(d, sev == MlirDiagnosticError     ? ": error: "
                    : sev == MlirDiagnosticWarning ? ": warning: "
                                                   : ": note: ");
  mlirDiagnosticPrint(diag, jit__diag_append, d);
  return mlirLogicalResultSuccess();
}

static MlirContext jit__mlir_context_new(void) {
  pthread_once(&jit__mlir_once, jit__mlir_init);
  MlirDialectRegistry registry = mlirDialectRegistryCreate();
  mlirRegisterAllDialects(registry);
  MlirContext ctx = mlirContextCreateWithRegistry(registry, /*threadingEnabled=*/false);
  mlirDialectRegistryDestroy(registry);
  // Dialects load on demand (parser, passes): loading all ~50 up front costs ~20 ms.
  mlirRegisterAllLLVMTranslations(ctx);
  return ctx;
}

MlirDiagnosticHandlerID jit__diag_attach(MlirContext ctx, jit__diag *diag) {
  return mlirContextAttachDiagnosticHandler(ctx, jit__diag_handler, diag, NULL);
}

MlirContext jit__mlir_context_create(jit__diag *diag) {
  MlirContext ctx = jit__mlir_context_new();
  jit__diag_attach(ctx, diag);
  return ctx;
}

//===--- Context pool ----------------------------------------------------===//

#define JIT__MLIR_POOL_SIZE 4   // contexts kept idle: concurrent compiles beyond it
                                // make (and destroy) their own
#define JIT__MLIR_POOL_USES 32  // compiles per context before it is retired

struct jit__mlir_pool {
  pthread_mutex_t mu;
  int n;
  MlirContext idle[JIT__MLIR_POOL_SIZE];
  int uses[JIT__MLIR_POOL_SIZE];
};

jit__mlir_pool *jit__mlir_pool_create(void) {
  jit__mlir_pool *p = calloc(1, sizeof *p);
  if (p) pthread_mutex_init(&p->mu, NULL);
  return p;
}

void jit__mlir_pool_destroy(jit__mlir_pool *p) {
  if (!p) return;
  for (int i = 0; i < p->n; i++) mlirContextDestroy(p->idle[i]);
  pthread_mutex_destroy(&p->mu);
  free(p);
}

// A context for one compile, from `p` when it has one idle (its compile count in
// *uses), else a new one (*uses = 0).
MlirContext jit__mlir_pool_take(jit__mlir_pool *p, int *uses) {
  *uses = 0;
  if (p) {
    pthread_mutex_lock(&p->mu);
    if (p->n > 0) {
      p->n--;
      MlirContext ctx = p->idle[p->n];
      *uses = p->uses[p->n];
      pthread_mutex_unlock(&p->mu);
      return ctx;
    }
    pthread_mutex_unlock(&p->mu);
  }
  return jit__mlir_context_new();
}

// Gives `ctx` back after a compile (its diagnostic handler detached), or destroys it
// when it has served its compiles or the pool is full.
void jit__mlir_pool_give(jit__mlir_pool *p, MlirContext ctx, int uses) {
  if (p && uses < JIT__MLIR_POOL_USES) {
    pthread_mutex_lock(&p->mu);
    if (p->n < JIT__MLIR_POOL_SIZE) {
      p->idle[p->n] = ctx;
      p->uses[p->n] = uses;
      p->n++;
      pthread_mutex_unlock(&p->mu);
      return;
    }
    pthread_mutex_unlock(&p->mu);
  }
  mlirContextDestroy(ctx);
}

//===--- Pass pipelines --------------------------------------------------===//

// `verify`: run the verifier after every pass (MLIR's default).
jit_status jit__mlir_run_pipeline_verify(MlirContext ctx, MlirModule module,
                                    const char *pipeline, jit__diag *diag,
                                    const char *stage, bool verify) {
  MlirPassManager pm = mlirPassManagerCreate(ctx);
  mlirPassManagerEnableVerifier(pm, verify);
  MlirLogicalResult r = mlirParsePassPipeline(
      mlirPassManagerGetAsOpPassManager(pm), mlirStringRefCreateFromCString(pipeline),
      jit__diag_append, diag);
  if (mlirLogicalResultIsFailure(r)) {
    mlirPassManagerDestroy(pm);
    return JIT_ERR(JIT_INTERNAL, "%s: bad pass pipeline: %s", stage, diag->buf);
  }
  r = mlirPassManagerRunOnOp(pm, mlirModuleGetOperation(module));
  mlirPassManagerDestroy(pm);
  if (mlirLogicalResultIsFailure(r))
    return JIT_ERR(JIT_COMPILE_ERROR, "%s failed: %s", stage,
                   diag->len ? diag->buf : "(no diagnostic)");
  return NULL;
}

jit_status jit__mlir_run_pipeline(MlirContext ctx, MlirModule module,
                                  const char *pipeline, jit__diag *diag,
                                  const char *stage) {
  return jit__mlir_run_pipeline_verify(ctx, module, pipeline, diag, stage, true);
}

