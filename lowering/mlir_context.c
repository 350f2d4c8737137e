//===--- mlir_context.c - MLIR contexts, their diagnostics, pass pipelines --===//
//
// What every compile (CPU, GPU, import) does with MLIR before and around its own
// steps: register everything once per process, make a context whose diagnostics are
// collected as text for the status (never printed), reuse contexts through a small
// pool (each with the pass managers and the LLVM target machine its compiles built),
// and run textual pass pipelines with failures turned into statuses.
//
//===----------------------------------------------------------------------===//
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
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
#define JIT__MLIR_PMS 24        // pass managers a pooled context keeps

// A pooled context and what was built in it: its pass managers, parsed from their
// pipeline text once and initialized once (canonicalize freezes its patterns then,
// ~2 % of a compile), and the LLVM target machine of its compiles (creating one
// creates its subtarget, another ~2 %). Used by one compile at a time.
typedef struct jit__mlir_ws {
  MlirContext ctx;
  int uses;  // compiles served
  int n_pms;
  struct {
    char *pipeline;
    bool verify;
    MlirPassManager pm;
  } pms[JIT__MLIR_PMS];
  LLVMTargetMachineRef tm;  // with the settings it was made for
  char *tm_triple, *tm_cpu, *tm_features;
  LLVMCodeGenOptLevel tm_level;
  struct jit__mlir_ws *prev;  // the thread's current workspace before this one
} jit__mlir_ws;

struct jit__mlir_pool {
  pthread_mutex_t mu;
  int n;
  jit__mlir_ws *idle[JIT__MLIR_POOL_SIZE];
};

// The workspace of the compile running on this thread (nested takes stack up).
static _Thread_local jit__mlir_ws *jit__ws_current;

// Disposes of the workspace's target machine and its settings.
static void jit__ws_forget_tm(jit__mlir_ws *ws) {
  if (ws->tm) LLVMDisposeTargetMachine(ws->tm);
  free(ws->tm_triple);
  free(ws->tm_cpu);
  free(ws->tm_features);
  ws->tm = NULL;
}

static void jit__ws_destroy(jit__mlir_ws *ws) {
  for (int i = 0; i < ws->n_pms; i++) {
    mlirPassManagerDestroy(ws->pms[i].pm);
    free(ws->pms[i].pipeline);
  }
  jit__ws_forget_tm(ws);
  mlirContextDestroy(ws->ctx);
  free(ws);
}

jit__mlir_pool *jit__mlir_pool_create(void) {
  jit__mlir_pool *p = calloc(1, sizeof *p);
  if (p) pthread_mutex_init(&p->mu, NULL);
  return p;
}

void jit__mlir_pool_destroy(jit__mlir_pool *p) {
  if (!p) return;
  for (int i = 0; i < p->n; i++) jit__ws_destroy(p->idle[i]);
  pthread_mutex_destroy(&p->mu);
  free(p);
}

// A context for one compile, from `p` when it has one idle, else a new one. Until it
// is given back, it is this thread's current workspace: its pipelines and target
// machine are kept.
MlirContext jit__mlir_pool_take(jit__mlir_pool *p) {
  jit__mlir_ws *ws = NULL;
  if (p) {
    pthread_mutex_lock(&p->mu);
    if (p->n > 0) ws = p->idle[--p->n];
    pthread_mutex_unlock(&p->mu);
  }
  if (!ws) {
    ws = calloc(1, sizeof *ws);
    if (!ws) return jit__mlir_context_new();  // runs uncached
    ws->ctx = jit__mlir_context_new();
  }
  ws->prev = jit__ws_current;
  jit__ws_current = ws;
  return ws->ctx;
}

// Gives `ctx` back after a compile (its diagnostic handler detached), or destroys it
// when it has served JIT__MLIR_POOL_USES compiles or the pool is full.
void jit__mlir_pool_give(jit__mlir_pool *p, MlirContext ctx) {
  jit__mlir_ws *ws = jit__ws_current;
  if (!ws || ws->ctx.ptr != ctx.ptr) {  // taken when out of memory: no workspace
    mlirContextDestroy(ctx);
    return;
  }
  jit__ws_current = ws->prev;
  ws->prev = NULL;
  if (p && ++ws->uses < JIT__MLIR_POOL_USES) {
    pthread_mutex_lock(&p->mu);
    if (p->n < JIT__MLIR_POOL_SIZE) {
      p->idle[p->n++] = ws;
      pthread_mutex_unlock(&p->mu);
      return;
    }
    pthread_mutex_unlock(&p->mu);
  }
  jit__ws_destroy(ws);
}

// The current workspace when it holds `ctx`, else NULL.
static jit__mlir_ws *jit__ws_of(MlirContext ctx) {
  jit__mlir_ws *ws = jit__ws_current;
  return ws && ws->ctx.ptr == ctx.ptr ? ws : NULL;
}

LLVMTargetMachineRef jit__mlir_target_machine(MlirContext ctx, const char *triple,
                                              const char *cpu, const char *features,
                                              LLVMCodeGenOptLevel level, bool *owned) {
  jit__mlir_ws *ws = jit__ws_of(ctx);
  if (ws && ws->tm && ws->tm_level == level && !strcmp(ws->tm_triple, triple) &&
      !strcmp(ws->tm_cpu, cpu) && !strcmp(ws->tm_features, features)) {
    *owned = false;
    return ws->tm;
  }
  *owned = true;
  char *err = NULL;
  LLVMTargetRef target;
  if (LLVMGetTargetFromTriple(triple, &target, &err)) {
    LLVMDisposeMessage(err);
    return NULL;
  }
  LLVMTargetMachineRef tm = LLVMCreateTargetMachine(target, triple, cpu, features, level,
                                                    LLVMRelocPIC, LLVMCodeModelSmall);
  char *t = ws && tm ? strdup(triple) : NULL, *c = t ? strdup(cpu) : NULL,
       *f = c ? strdup(features) : NULL;
  if (!f) {  // not kept: the caller disposes of it
    free(t);
    free(c);
    return tm;
  }
  jit__ws_forget_tm(ws);
  ws->tm = tm;
  ws->tm_triple = t;
  ws->tm_cpu = c;
  ws->tm_features = f;
  ws->tm_level = level;
  *owned = false;
  return tm;
}

//===--- Pass pipelines --------------------------------------------------===//

// A pass manager for `pipeline` in `ctx` (parsed errors into `diag`), kept in the
// current workspace (*owned = false) or the caller's to destroy (*owned = true).
static MlirPassManager jit__pass_manager(MlirContext ctx, const char *pipeline,
                                         bool verify, jit__diag *diag, bool *owned) {
  jit__mlir_ws *ws = jit__ws_of(ctx);
  *owned = true;
  if (ws) {
    for (int i = 0; i < ws->n_pms; i++)
      if (ws->pms[i].verify == verify && strcmp(ws->pms[i].pipeline, pipeline) == 0) {
        *owned = false;
        return ws->pms[i].pm;
      }
  }
  MlirPassManager pm = mlirPassManagerCreate(ctx);
  mlirPassManagerEnableVerifier(pm, verify);
  MlirLogicalResult r = mlirParsePassPipeline(
      mlirPassManagerGetAsOpPassManager(pm), mlirStringRefCreateFromCString(pipeline),
      jit__diag_append, diag);
  if (mlirLogicalResultIsFailure(r)) {
    mlirPassManagerDestroy(pm);
    return (MlirPassManager){NULL};
  }
  if (ws && ws->n_pms < JIT__MLIR_PMS) {
    char *copy = strdup(pipeline);
    if (copy) {
      ws->pms[ws->n_pms].pipeline = copy;
      ws->pms[ws->n_pms].verify = verify;
      ws->pms[ws->n_pms].pm = pm;
      ws->n_pms++;
      *owned = false;
    }
  }
  return pm;
}

// `verify`: run the verifier after every pass (MLIR's default).
jit_status jit__mlir_run_pipeline_verify(MlirContext ctx, MlirModule module,
                                    const char *pipeline, jit__diag *diag,
                                    const char *stage, bool verify) {
  bool owned;
  MlirPassManager pm = jit__pass_manager(ctx, pipeline, verify, diag, &owned);
  if (mlirPassManagerIsNull(pm))
    return JIT_ERR(JIT_INTERNAL, "%s: bad pass pipeline: %s", stage, diag->buf);
  MlirLogicalResult r = mlirPassManagerRunOnOp(pm, mlirModuleGetOperation(module));
  if (owned) mlirPassManagerDestroy(pm);
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

