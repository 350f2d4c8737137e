//===--- import.h - functions from MLIR text (lowering-internal) ------------===//
//
// What jit/graph_mlir.c needs to turn a user's MLIR module into a graph and to compile
// it for one binding, and the CPU pipeline stages that compile_cpu.c shares between
// node graphs and imported modules. Every call that touches MLIR creates and destroys
// its own MLIR context, so all of them are thread-safe.
//
// The forms a module goes through:
//   user text --jit__mlir_import--> canonical text (entry renamed `jit_entry`,
//   canonicalized, printed without locations: the graph's identity) and located text
//   (the same with the user's locations, for messages)
//   located text + concrete input shapes --specialize--> a func on static tensors
//   --TOSA to linalg, results to out-params--> destination-passing form, which is
//   what the node-graph emitter produces too --jit__cpu_compile_module--> object.
//
//===----------------------------------------------------------------------===//
#ifndef JITML_LOWERING_IMPORT_H_
#define JITML_LOWERING_IMPORT_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <llvm-c/TargetMachine.h>
#include <mlir-c/Diagnostics.h>
#include <mlir-c/IR.h>
#include <mlir-c/Pass.h>

#include "base/status.h"
#include "lowering/lower.h"

// The fixed name the entry function gets in the canonical form.
#define JIT__MLIR_ENTRY "jit_entry"

// The longest MLIR text jit_graph_from_mlir(_file) takes (256 MiB): a model's weights
// belong in its inputs, not in its text, and MLIR's parser holds several copies.
#define JIT__MAX_MLIR_BYTES (UINT64_C(256) << 20)

//===--- Diagnostics and contexts ----------------------------------------===//

// MLIR diagnostics of one context, collected as "file:line:col: error: message" lines
// separated by "; ". `file` (may be NULL) replaces the empty file name that locations
// parsed from a string carry.
typedef struct jit__diag {
  char buf[4096];
  size_t len;
  const char *file;
} jit__diag;

// A context with every dialect registered (loaded on demand), the LLVM translations,
// and a handler that collects into `diag`. Destroy with mlirContextDestroy.
MlirContext jit__mlir_context_create(jit__diag *diag);

// Appends `s` to `diag` (cut at its buffer's size): an MlirStringCallback.
void jit__diag_append(MlirStringRef s, void *diag);

// Attaches a handler that collects `ctx`'s diagnostics into `diag` (until detached
// with mlirContextDetachDiagnosticHandler).
MlirDiagnosticHandlerID jit__diag_attach(MlirContext ctx, jit__diag *diag);

// A context for one compile from `pool` (may be NULL) when it has one idle,
// else a new one, with no diagnostic handler.
MlirContext jit__mlir_pool_take(jit__mlir_pool *pool);
// Gives `ctx` back after a compile (its diagnostic handler detached), or destroys it
// when it has served its compiles or the pool is full.
void jit__mlir_pool_give(jit__mlir_pool *pool, MlirContext ctx);

// An LLVM target machine for a compile in `ctx`: the one kept with `ctx` when it came
// from a pool and has these settings (*owned = false: do not dispose it), else a new
// one (*owned = true when the caller must dispose it). NULL: no such target.
LLVMTargetMachineRef jit__mlir_target_machine(MlirContext ctx, const char *triple,
                                              const char *cpu, const char *features,
                                              LLVMCodeGenOptLevel level, bool *owned);

// jit__mlir_run_pipeline; `verify`: run the verifier after every pass (MLIR's
// default), which a compile's own pipelines on verified IR skip.
jit_status jit__mlir_run_pipeline_verify(MlirContext ctx, MlirModule module,
                                         const char *pipeline, jit__diag *diag,
                                         const char *stage, bool verify);

// Runs a textual pass pipeline on `module`. Failures: JIT_INTERNAL for a pipeline that
// does not parse, else JIT_COMPILE_ERROR with the diagnostics.
jit_status jit__mlir_run_pipeline(MlirContext ctx, MlirModule module,
                                  const char *pipeline, jit__diag *diag,
                                  const char *stage);

//===--- IR dumps (lowering/dump.c) ----------------------------------------===//

// Writes `op` / `text` to `<dir>/<kernel>-<stage>` when options->dump_dir is set. A
// failure to write is ignored: dumps never fail a compile.
void jit__dump_op(const jit__lower_options *options, const char *kernel,
                  const char *stage, MlirOperation op);
void jit__dump_text(const jit__lower_options *options, const char *kernel,
                    const char *stage, const char *text, size_t length);

//===--- Shared CPU stages (compile_cpu.c) ---------------------------------===//

// Compiles `module`, which holds `func.func @<func_name>` on static tensors in
// destination-passing form (inputs as tensors, outputs as memref arguments written
// with bufferization.materialize_in_destination; n_args arguments in all), through
// fusion, tiling/vectorization, bufferization, LLVM into `out`. Dumps stages 02-07.
// `t0` is when the compile started (for out->ms_mlir). Does not take `module`.
jit_status jit__cpu_compile_module(MlirContext ctx, MlirModule module,
                                   const char *func_name, uint32_t n_args,
                                   const jit__lower_options *options, jit__diag *diag,
                                   double t0, jit__artifact *out);


//===--- Our own pass (pass_matmul_loops.c) -------------------------------===//

// A new `jitml-lower-matmul-to-loops` pass (on func.func): every linalg.matmul on
// memrefs becomes an scf.for nest (i, j, k) of memref.load, arith.mulf, arith.addf,
// memref.store in the output's element type. Owned by whoever adds it to a pass
// manager.
MlirPass jit__create_matmul_to_loops_pass(void);

//===--- An mlir-opt (opt.c) ------------------------------------------------===//

// Parses `text`, runs `pipeline` (MLIR's textual form, with our passes by name) and
// prints the result into *out_text (malloc'ed). See jit_mlir_opt (jitml.h).
jit_status jit__mlir_opt(const char *text, size_t length, const char *pipeline,
                         const char *source_name, char **out_text);

//===--- Import (import_mlir.c) -------------------------------------------===//

// One argument of the entry function.
typedef struct jit__mlir_arg {
  char name[64];                       // the SSA name in the text, or "arg<i>"
  jit__dtype dtype;
  int rank;
  int64_t dims[JIT_MAX_RANK];          // a size, or -1 for `?`
  char dim_names[JIT_MAX_RANK][64];    // from `jit.dims`; "" where unnamed
} jit__mlir_arg;

typedef struct jit__mlir_module {
  char *canonical;    // canonical text, no locations (hash this)
  char *located;      // canonical text with the user's locations
  char *exported;     // canonical text with the entry's own name (jit_graph_to_mlir)
  char *graph_record; // the entry's `jit.graph` string attribute, if it has one: the
                      // node graph jit_graph_to_mlir wrote it from (jit/graph_mlir.c)
  char entry[128];    // the entry's name in the user's text
  char source[256];   // the text's name in messages ("<input>" or a file name)
  uint32_t n_args, n_results;
  jit__mlir_arg *args;
  jit__dtype *result_dtypes;
  jit__mlir_arg *result_types;  // rank and dims (-1 for `?`) of each result; no names
} jit__mlir_module;

// Refuses, with JIT_PARSE_ERROR at its line and column, text that would take MLIR's
// parser or verifiers down rather than fail (lowering/mlir_guard.c): nesting past 256
// levels, affine expressions of more than 4096 operators, a tensor.concat dim that is
// not a decimal below 2^31. `file` names the text in messages.
jit_status jit__mlir_guard(const char *text, size_t length, const char *file);

// Parses and checks `text` (`length` bytes, need not be NUL-terminated), picks the
// entry (`entry_name`, or NULL for the only/first public func.func) and fills `out`.
// `source_name` names the text in messages. Failures: JIT_PARSE_ERROR,
// JIT_INVALID_ARGUMENT (missing entry, non-tensor argument or result),
// JIT_UNSUPPORTED (dialect, op, element type). On failure `out` owns nothing.
jit_status jit__mlir_import(const char *text, size_t length, const char *entry_name,
                            const char *source_name, jit__mlir_module *out);
void jit__mlir_module_release(jit__mlir_module *m);

// The result shapes of `m` when its arguments have the static shapes `args`
// (m->n_args entries; rank/dims/dtype used). Writes m->n_results entries. Failures:
// JIT_SHAPE_MISMATCH (the body rejects the shapes), JIT_UNSUPPORTED (not all static).
jit_status jit__mlir_result_shapes(const jit__mlir_module *m, const jit__node *args,
                                   jit__node *out_results);

// Compiles `m` specialized for `args` into `out`, entry point after `func_name`, and
// writes the result shapes as jit__mlir_result_shapes does (one specialization serves
// both, so a first call does not refine the shapes twice).
jit_status jit__mlir_compile_cpu(const jit__mlir_module *m, const jit__node *args,
                                 const char *func_name, const jit__lower_options *lo,
                                 jit__artifact *out, jit__node *out_results);

#endif  // JITML_LOWERING_IMPORT_H_
