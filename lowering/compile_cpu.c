//===--- compile_cpu.c - specialized graph -> host object code -------------===//
//
// graph -> MLIR text (emit_mlir.c) -> parse -> elementwise fusion -> transform script
// (matmul tiling, peeling, vectorization) -> bufferization and conversion to the LLVM
// dialect -> LLVM IR -> O2 for the host CPU -> object bytes.
//
// Everything after "a module with a func on static tensors in destination-passing
// form" is jit__cpu_compile_module, which imported MLIR modules (import_mlir.c) share.
// At opt_level 0 nothing is fused or tiled, and linalg.matmul becomes loops through our
// own C pass (pass_matmul_loops.c) instead of convert-linalg-to-loops. With a dump
// directory, every stage is written as <kernel>-NN-<stage>.mlir/.ll (dump.c).
//
// A compile takes an MLIR context from its jit_context's pool (with the pass managers
// and the LLVM target machine kept in it: mlir_context.c) and makes its own LLVM
// context, so compiles on different threads share nothing but the process-wide
// registrations done once. JITML_LOG=debug prints the time of each step.
//
//===----------------------------------------------------------------------===//
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <llvm-c/Analysis.h>
#include <llvm-c/Core.h>
#include <llvm-c/Error.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <llvm-c/Transforms/PassBuilder.h>
#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <mlir-c/Diagnostics.h>
#include <mlir-c/Dialect/Transform/Interpreter.h>
#include <mlir-c/IR.h>
#include <mlir-c/Pass.h>
#include <mlir-c/RegisterEverything.h>
#include <mlir-c/Target/LLVMIR.h>

#include "base/clock.h"
#include "base/status.h"
#include "base/text.h"
#include "lowering/cpu/host.h"
#include "lowering/cpu_strategy.h"
#include "lowering/import.h"
#include "lowering/lower.h"

//===--- Pipelines -------------------------------------------------------===//

// The project's own canonicalizations, without region simplification (dead block
// arguments and blocks): for the 1,283 kernels of 15 test suites the same LLVM IR comes
// out, with ~1 % fewer instructions per compile (callgrind).
#define JIT__CANON "canonicalize{region-simplify=disabled}"

// Before the transform script: fuse elementwise producers into consumers.
static const char kPrePipeline[] =
    "builtin.module(linalg-fuse-elementwise-ops," JIT__CANON ",cse)";

// After it: tensors -> buffers (destination-passing: results are written into the
// output memrefs; intermediates are malloc'ed and freed inside the kernel).
// In two parts: between them, packed-B and scratch buffers move to the stack
// (jit__cpu_stack_buffers), before deallocations are placed.
static const char kBufferizePipeline[] =
    "builtin.module(" JIT__CANON ",cse,eliminate-empty-tensors,"
    "empty-tensor-to-alloc-tensor,"
    "one-shot-bufferize{bufferize-function-boundaries=1 "
    "function-boundary-type-conversion=identity-layout-map},"
    JIT__CANON ",cse," JIT__CANON ")";
static const char kDeallocPipeline[] =
    "builtin.module(ownership-based-buffer-deallocation," JIT__CANON ","
    "buffer-deallocation-simplification,bufferization-lower-deallocations,"
    JIT__CANON ",cse)";

// math-expand-ops with every expansion but roundeven's, which goes through x + 0.5
// (round(0.49999997) would be 1); convert-math-to-llvm makes it llvm.roundeven, exact.
#define JIT__MATH_EXPAND \
  "math-expand-ops{ops=ctlz,sinh,cosh,tan,tanh,asinh,acosh,atanh,fma,ceil,exp2,powf,fpowi," \
  "round,rsqrt,clampf}"

// Then everything to the LLVM dialect: two lowerings, one with the scf.forall loops the
// strategy made for threads, each for bare-pointer memrefs (exact kernels) or whole
// descriptors (generic ones). The first %s is "func.func(convert-linalg-to-loops),"
// and the second JIT__TO_LLVM_MATH, each only where the kernel has such ops left
// (jit__find_left): a pass with nothing to convert builds its patterns and walks the
// module all the same (callgrind, 512^3 matmuls: 0.9 % and 0.8 % of a compile).
#define JIT__TO_LLVM_LINALG "func.func(convert-linalg-to-loops),"
#define JIT__TO_LLVM_MATH JIT__MATH_EXPAND ",convert-math-to-llvm,"
#define JIT__TO_LLVM(func_conv)                                                          \
  "builtin.module(%s%s"                                                                  \
  "convert-vector-to-scf{full-unroll=1},convert-scf-to-cf,expand-strided-metadata,"       \
  "lower-affine,convert-vector-to-llvm,finalize-memref-to-llvm,"                          \
  "convert-arith-to-llvm,convert-cf-to-llvm," func_conv ",convert-ub-to-llvm,"            \
  "reconcile-unrealized-casts)"
// With threads: scf.forall -> scf.parallel -> omp.parallel + omp.wsloop.
// finalize-memref-to-llvm must run before convert-scf-to-cf here (recipes/omp.pipe), and
// convert-openmp-to-llvm after convert-func-to-llvm, or it converts the signature with
// full memref descriptors instead of bare pointers. %d = thread count.
#define JIT__TO_LLVM_OMP(func_conv)                                                      \
  "builtin.module(%s%s"                                                                  \
  "convert-vector-to-scf{full-unroll=1},scf-forall-to-parallel,"                          \
  "convert-scf-to-openmp{num-threads=%d},expand-strided-metadata,lower-affine,"           \
  "finalize-memref-to-llvm,convert-scf-to-cf,convert-vector-to-llvm,"                     \
  "convert-arith-to-llvm,convert-cf-to-llvm," func_conv ",convert-openmp-to-llvm,"        \
  "convert-ub-to-llvm,reconcile-unrealized-casts)"
// Memrefs are passed as bare pointers: all shapes are static, so the kernel needs
// nothing but the base address. A generic kernel's memrefs have run-time sizes, which
// bare pointers cannot carry: its arguments are whole memref descriptors
// (jit__add_entry fills them).
#define JIT__BARE "convert-func-to-llvm{use-bare-ptr-memref-call-conv=1}"
static const char kToLLVMPipeline[] = JIT__TO_LLVM(JIT__BARE);
static const char kToLLVMPipelineOmp[] = JIT__TO_LLVM_OMP(JIT__BARE);
static const char kToLLVMPipelineGeneric[] = JIT__TO_LLVM("convert-func-to-llvm");
static const char kToLLVMPipelineGenericOmp[] = JIT__TO_LLVM_OMP("convert-func-to-llvm");

//===--- Steps -----------------------------------------------------------===//

// The compile's own pipelines, on IR that was verified when it was parsed or
// imported: the verifier runs once, on the LLVM-dialect result (jit__cpu_compile_module),
// not after each of the ~40 passes, where it took ~10% of a compile (callgrind,
// gelu(xW+b) 32x768x3072: 33 M of 350 M instructions).
static jit_status jit__run_own_pipeline(MlirContext ctx, MlirModule module,
                                        const char *pipeline, jit__diag *diag,
                                        const char *stage) {
  return jit__mlir_run_pipeline_verify(ctx, module, pipeline, diag, stage, false);
}

// Applies the transform `script` to `module`; `what` names it in errors.
static jit_status jit__apply_script(MlirContext ctx, MlirModule module,
                                    const char *script, const char *what, jit__diag *diag) {
  MlirModule tmod = mlirModuleCreateParse(ctx, mlirStringRefCreateFromCString(script));
  if (mlirModuleIsNull(tmod))
    return JIT_ERR(JIT_INTERNAL, "%s: transform script does not parse: %s", what,
                   diag->buf);
  MlirOperation entry = {NULL};
  for (MlirOperation op = mlirBlockGetFirstOperation(mlirModuleGetBody(tmod));
       !mlirOperationIsNull(op); op = mlirOperationGetNextInBlock(op)) {
    entry = op;  // the script holds exactly one named sequence
  }
  MlirTransformOptions topts = mlirTransformOptionsCreate();
  MlirLogicalResult r = mlirTransformApplyNamedSequence(
      mlirModuleGetOperation(module), entry, mlirModuleGetOperation(tmod), topts);
  mlirTransformOptionsDestroy(topts);
  mlirModuleDestroy(tmod);
  if (mlirLogicalResultIsFailure(r))
    return JIT_ERR(JIT_COMPILE_ERROR, "%s failed: %s", what,
                   diag->len ? diag->buf : "(no diagnostic)");
  return NULL;
}

//===--- Named elementwise ops -------------------------------------------===//

// Named linalg ops that are elementwise or move data, as imported MLIR and TOSA's
// lowering write them (linalg.transpose, linalg.add, linalg.exp, ...), become
// linalg.generic first: elementwise fusion and the CPU strategy only see generics, and
// a named op was left to unplanned scalar loops. A W^T written as linalg.transpose
// before a matmul (torch-mlir's nn.Linear) took 4.7-4.9 ms at 64x768x3072 against 2.1
// for the same matmul from a graph, whose transpose is a generic that B's packing reads
// W through. Contractions (linalg.matmul, ...) and fills stay named: the strategy plans
// them by name.
static const char *const kGeneralized[] = {
    "linalg.transpose", "linalg.broadcast", "linalg.map",  "linalg.reduce",
    "linalg.copy",      "linalg.elementwise", "linalg.add", "linalg.sub",
    "linalg.mul",       "linalg.div",       "linalg.div_unsigned", "linalg.max",
    "linalg.min",       "linalg.powf",      "linalg.select", "linalg.exp",
    "linalg.log",       "linalg.abs",       "linalg.ceil", "linalg.floor",
    "linalg.negf",      "linalg.reciprocal", "linalg.round", "linalg.sqrt",
    "linalg.rsqrt",     "linalg.square",    "linalg.tanh", "linalg.erf"};
enum { kNumGeneralized = (int)(sizeof kGeneralized / sizeof *kGeneralized) };

static MlirWalkResult jit__find_named(MlirOperation op, void *user) {
  MlirStringRef name = mlirIdentifierStr(mlirOperationGetName(op));
  for (int i = 0; i < kNumGeneralized; i++) {
    if (strlen(kGeneralized[i]) == name.length &&
        memcmp(kGeneralized[i], name.data, name.length) == 0) {
      *(bool *)user = true;
      return MlirWalkResultInterrupt;
    }
  }
  return MlirWalkResultAdvance;
}

// Generalizes the ops of kGeneralized in `module`, if it has any.
static jit_status jit__generalize_named(MlirContext ctx, MlirModule module,
                                        jit__diag *diag) {
  bool any = false;
  mlirOperationWalk(mlirModuleGetOperation(module), jit__find_named, &any,
                    MlirWalkPreOrder);
  if (!any) return NULL;
  jit__text sb = {0};
  jit__text_printf(&sb, "%s", "module attributes {transform.with_named_sequence} {\n"
                        "transform.named_sequence @__transform_main(%root: "
                        "!transform.any_op {transform.readonly}) {\n"
                        "  %named = transform.structured.match ops{[");
  for (int i = 0; i < kNumGeneralized; i++)
    jit__text_printf(&sb, "%s\"%s\"", i ? ", " : "", kGeneralized[i]);
  jit__text_printf(&sb, "%s", "]} in %root : (!transform.any_op) -> !transform.any_op\n"
                        "  %g = transform.structured.generalize %named : "
                        "(!transform.any_op) -> !transform.any_op\n"
                        "  transform.yield\n}\n}\n");
  if (sb.oom || !sb.p) {
    free(sb.p);
    return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
  }
  jit_status s = jit__apply_script(ctx, module, sb.p, "generalizing named ops", diag);
  free(sb.p);
  return s;
}


// The rank and sizes (-1: `?`) of each argument of a generic kernel's function, read
// off its type before lowering: the entry fills one memref descriptor per argument.
typedef struct jit__arg_shape {
  int rank;
  int64_t dims[JIT_MAX_RANK];
} jit__arg_shape;

static jit_status jit__generic_arg_shapes(MlirModule module, uint32_t n_args,
                                          jit__arg_shape *out) {
  MlirOperation fn = mlirBlockGetFirstOperation(mlirModuleGetBody(module));
  if (mlirOperationIsNull(fn))
    return JIT_ERR(JIT_INTERNAL, "generic kernel: empty module");
  MlirAttribute ft = mlirOperationGetAttributeByName(
      fn, mlirStringRefCreateFromCString("function_type"));
  if (mlirAttributeIsNull(ft) || !mlirAttributeIsAType(ft))
    return JIT_ERR(JIT_INTERNAL, "generic kernel: no function type");
  MlirType t = mlirTypeAttrGetValue(ft);
  if ((uint32_t)mlirFunctionTypeGetNumInputs(t) != n_args)
    return JIT_ERR(JIT_INTERNAL, "generic kernel: %ld arguments, expected %u",
                   (long)mlirFunctionTypeGetNumInputs(t), n_args);
  for (uint32_t i = 0; i < n_args; i++) {
    MlirType a = mlirFunctionTypeGetInput(t, (intptr_t)i);
    if (!mlirTypeIsAShaped(a) || !mlirShapedTypeHasRank(a) ||
        mlirShapedTypeGetRank(a) > JIT_MAX_RANK)
      return JIT_ERR(JIT_INTERNAL, "generic kernel: argument %u is not a ranked shape", i);
    out[i].rank = (int)mlirShapedTypeGetRank(a);
    for (int d = 0; d < out[i].rank; d++) {
      int64_t v = mlirShapedTypeGetDimSize(a, d);
      out[i].dims[d] = mlirShapedTypeIsDynamicSize(v) ? -1 : v;
    }
  }
  return NULL;
}

// Adds `void <entry>(void **args)` that unpacks the argument array and calls the
// kernel, which becomes internal so O3 inlines it: one C-callable signature for every
// kernel, whatever its argument count. Exact kernels (`shapes` NULL) take each memref
// as a bare pointer. A generic kernel reads args[n_args] too, the int64 sizes of every
// argument (lower.h), and takes each memref as its descriptor fields (allocated and
// aligned pointer, offset 0, sizes, row-major strides): static sizes as constants,
// `?` ones loaded from the sizes.
static jit_status jit__add_entry(LLVMContextRef llctx, LLVMModuleRef mod,
                                 const char *kernel, const char *entry, uint32_t n_args,
                                 const jit__arg_shape *shapes) {
  LLVMValueRef fn = LLVMGetNamedFunction(mod, kernel);
  if (!fn) return JIT_ERR(JIT_INTERNAL, "kernel `%s` missing from LLVM IR", kernel);
  LLVMTypeRef fty = LLVMGlobalGetValueType(fn);
  uint32_t n_params = n_args;
  if (shapes) {
    n_params = 0;
    for (uint32_t i = 0; i < n_args; i++) n_params += 3 + 2 * (uint32_t)shapes[i].rank;
  }
  if (LLVMCountParamTypes(fty) != n_params)
    return JIT_ERR(JIT_INTERNAL, "kernel `%s` takes %u parameters, expected %u", kernel,
                   LLVMCountParamTypes(fty), n_params);
  LLVMTypeRef ptr = LLVMPointerTypeInContext(llctx, 0);
  LLVMTypeRef i64 = LLVMInt64TypeInContext(llctx);
  // Every buffer a kernel gets is its own: inputs are never written (emit_mlir.c) and
  // jit_run refuses outputs that overlap inputs or each other. Said to LLVM (noalias),
  // stores to one output no longer order loads of the others: a graph of 1,000
  // outputs compiled in 3.3 s instead of 7.6 (the machine scheduler's dependences).
  // Generic kernels: on the aligned pointer of each descriptor, the one read and
  // written through.
  unsigned noalias = LLVMGetEnumAttributeKindForName("noalias", 7);
  for (uint32_t i = 0, p = 0; i < n_args; i++) {
    uint32_t at = shapes ? p + 1 : i;
    LLVMAddAttributeAtIndex(fn, at + 1, LLVMCreateEnumAttribute(llctx, noalias, 0));
    if (shapes) p += 3 + 2 * (uint32_t)shapes[i].rank;
  }
  LLVMTypeRef ety = LLVMFunctionType(LLVMVoidTypeInContext(llctx), &ptr, 1, 0);
  LLVMValueRef efn = LLVMAddFunction(mod, entry, ety);
  LLVMBuilderRef b = LLVMCreateBuilderInContext(llctx);
  LLVMPositionBuilderAtEnd(b, LLVMAppendBasicBlockInContext(llctx, efn, "entry"));
  LLVMValueRef *params = calloc(n_params ? n_params : 1, sizeof(*params));
  if (!params) {
    LLVMDisposeBuilder(b);
    return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
  }
  LLVMValueRef base = LLVMGetParam(efn, 0);
  LLVMValueRef dims = NULL;
  if (shapes) {
    LLVMValueRef at = LLVMConstInt(i64, n_args, 0);
    dims = LLVMBuildLoad2(b, ptr, LLVMBuildGEP2(b, ptr, base, &at, 1, ""), "dims");
  }
  uint32_t p = 0, off = 0;
  for (uint32_t i = 0; i < n_args; i++) {
    LLVMValueRef idx = LLVMConstInt(i64, i, 0);
    LLVMValueRef data = LLVMBuildLoad2(b, ptr, LLVMBuildGEP2(b, ptr, base, &idx, 1, ""), "");
    params[p++] = data;
    if (!shapes) continue;
    int r = shapes[i].rank;
    LLVMValueRef size[JIT_MAX_RANK], stride[JIT_MAX_RANK];
    for (int d = 0; d < r; d++) {
      if (shapes[i].dims[d] >= 0) {
        size[d] = LLVMConstInt(i64, (unsigned long long)shapes[i].dims[d], 0);
      } else {
        LLVMValueRef at = LLVMConstInt(i64, off + (uint32_t)d, 0);
        size[d] = LLVMBuildLoad2(b, i64, LLVMBuildGEP2(b, i64, dims, &at, 1, ""), "");
      }
    }
    LLVMValueRef st = LLVMConstInt(i64, 1, 0);
    for (int d = r - 1; d >= 0; d--) {
      stride[d] = st;
      if (d > 0) st = LLVMBuildNUWMul(b, st, size[d], "");
    }
    params[p++] = data;
    params[p++] = LLVMConstInt(i64, 0, 0);
    for (int d = 0; d < r; d++) params[p++] = size[d];
    for (int d = 0; d < r; d++) params[p++] = stride[d];
    off += (uint32_t)r;
  }
  LLVMBuildCall2(b, fty, fn, params, n_params, "");
  LLVMBuildRetVoid(b);
  LLVMDisposeBuilder(b);
  free(params);
  LLVMSetLinkage(fn, LLVMInternalLinkage);
  return NULL;
}

// LLVM's part: the vector code MLIR made needs cleaning up (allocas, redundant loads,
// loop-invariant address arithmetic), the loops of its fills vectorizing (and SLP +
// vector-combine for what MLIR left in narrow vectors), not O2's repeated
// instcombine/GVN rounds, inliner and loop passes. Measured: "LLVM IR + passes" 30-55
// ms -> 4-17 ms on the matmul and fused gelu(xW+b) kernels of the benchmark, at the
// same kernel speed.
// Kernels that leave loops to LLVM's loop vectorizer (row reductions: softmax,
// layernorm) need those loops rotated first: without loop-rotate softmax's rows were
// 6x slower (4096x1024: 14 ms against 2.4). They went through O2 before, at the same
// speed: its IndVarSimplify alone took ~75 ms of an encoder block's ~165 ("LLVM IR +
// passes" 55-63 ms now; the block's whole compile ~400 -> ~300 ms, softmax 64x1024 ~15
// -> ~11 ms).
// %s: "loop(loop-rotate)," for such kernels; %s: the unrolling of the loops that
// jit__cpu_unroll_k_loops marked (every other loop is marked unroll.disable; no full
// unrolling by size either).
static const char kLLVMPipeline[] =
    "function(sroa,early-cse<memssa>,instcombine<no-verify-fixpoint>,simplifycfg,"
    "loop-mssa(licm),%sgvn,"
    "loop-vectorize,slp-vectorizer,vector-combine,instcombine<no-verify-fixpoint>,"
    "simplifycfg%s)";
static const char kRotate[] = "loop(loop-rotate),";
static const char kUnrollK[] =
    ",loop-unroll<O2;no-partial;no-runtime;no-upperbound;no-profile-peeling;"
    "full-unroll-max=0>";

// Whether `op` converts to or from bf16 (sets *user, a bool, and stops).
static MlirWalkResult jit__find_bf16(MlirOperation op, void *user) {
  MlirStringRef name = mlirIdentifierStr(mlirOperationGetName(op));
  bool conv = (name.length == 12 && !memcmp(name.data, "arith.truncf", 12)) ||
              (name.length == 10 && !memcmp(name.data, "arith.extf", 10));
  if (!conv) return MlirWalkResultAdvance;
  for (intptr_t i = 0; i < mlirOperationGetNumResults(op) + mlirOperationGetNumOperands(op); i++) {
    intptr_t nr = mlirOperationGetNumResults(op);
    MlirType t = mlirValueGetType(i < nr ? mlirOperationGetResult(op, i)
                                         : mlirOperationGetOperand(op, i - nr));
    if (mlirTypeIsAShaped(t)) t = mlirShapedTypeGetElementType(t);
    if (mlirTypeIsABF16(t)) {
      *(bool *)user = true;
      return MlirWalkResultInterrupt;
    }
  }
  return MlirWalkResultAdvance;
}

// After bufferization, what is left besides vector code, in one walk:
// - `unvectorized`: a linalg op that MLIR did not vectorize and that is more than a
//   fill, e.g. a reduction left to LLVM's loop vectorizer (kRotate). (A fill becomes a
//   store loop, which kLLVMPipeline vectorizes, and a memref.copy of contiguous rows a
//   memcpy.) A fill's body is skipped: counting the linalg.yield in it once sent every
//   kernel with a fill left (plain matmuls, small-M gelu) through O2, then the
//   pipeline for such kernels, ~20-30 ms more per compile at the same speed.
// - `linalg` (any, fills too) and `math` (transcendental functions, in linalg bodies
//   too): whether the lowering to LLVM needs its passes for them (JIT__TO_LLVM).
// Sets the jit__left_ops at *user.
typedef struct {
  bool unvectorized, linalg, math;
} jit__left_ops;

static MlirWalkResult jit__find_left(MlirOperation op, void *user) {
  jit__left_ops *left = user;
  MlirStringRef name = mlirIdentifierStr(mlirOperationGetName(op));
  if (name.length > 5 && memcmp(name.data, "math.", 5) == 0) left->math = true;
  if (name.length > 7 && memcmp(name.data, "linalg.", 7) == 0) {
    left->linalg = true;
    if (name.length == 11 && memcmp(name.data, "linalg.fill", 11) == 0)
      return MlirWalkResultSkip;
    left->unvectorized = true;
  }
  return left->unvectorized && left->math ? MlirWalkResultInterrupt : MlirWalkResultAdvance;
}

// Whether `op` is a heap allocation (memref.alloc: sets *user, a bool, and stops).
static MlirWalkResult jit__find_alloc(MlirOperation op, void *user) {
  MlirStringRef name = mlirIdentifierStr(mlirOperationGetName(op));
  if (name.length == 12 && memcmp(name.data, "memref.alloc", 12) == 0) {
    *(bool *)user = true;
    return MlirWalkResultInterrupt;
  }
  return MlirWalkResultAdvance;
}

// After the passes: divisions by a row's sum become multiplications by its reciprocal;
// and streaming kernels get their non-temporal stores and row prefetches
// (jit__cpu_stream_rows).
// `rows`: kLLVMPipeline with its loops rotated; `unroll`: with the k-loop unrolling.
static jit_status jit__llvm_to_object(MlirContext ctx, LLVMModuleRef mod,
                                      const jit__lower_options *o,
                                      const jit__cpu_plan *plan, bool rows, bool unroll,
                                      jit__artifact *out) {
  bool own_tm = true;
  LLVMTargetMachineRef tm = jit__mlir_target_machine(
      ctx, o->triple, o->cpu, o->features,
      o->opt_level > 0 ? LLVMCodeGenLevelAggressive : LLVMCodeGenLevelNone, &own_tm);
  if (!tm)
    return JIT_ERR(JIT_COMPILE_ERROR, "cannot create an LLVM target machine for `%s` (%s)",
                   o->triple, o->cpu);
  LLVMSetTarget(mod, o->triple);
  LLVMTargetDataRef dl = LLVMCreateTargetDataLayout(tm);
  LLVMSetModuleDataLayout(mod, dl);
  LLVMDisposeTargetData(dl);

  jit_status status = NULL;
  LLVMPassBuilderOptionsRef po = LLVMCreatePassBuilderOptions();
  // MLIR already unrolled what should be (vector tiles); LLVM fully unrolling small
  // constant-trip loops around them multiplied object size and compile time by ~5x
  // for odd shapes (e.g. 7 rows).
  LLVMPassBuilderOptionsSetLoopUnrolling(po, 0);
  static const char *const names[2][2] = {
      {"light", "light + k-unroll"}, {"light + rotate", "light + rotate + k-unroll"}};
  out->llvm_passes = o->opt_level <= 0 ? "O0" : names[rows][unroll];
  char pipeline[sizeof kLLVMPipeline + sizeof kRotate + sizeof kUnrollK];
  snprintf(pipeline, sizeof pipeline, kLLVMPipeline, rows ? kRotate : "",
           unroll ? kUnrollK : "");
  LLVMErrorRef lerr =
      LLVMRunPasses(mod, o->opt_level <= 0 ? "default<O0>" : pipeline, tm, po);
  LLVMDisposePassBuilderOptions(po);
  if (!lerr && o->opt_level > 0) jit__cpu_hoist_reciprocals(mod);
  if (!lerr && o->opt_level > 0 && (plan->stream || plan->row_prefetch))
    jit__cpu_stream_rows(mod, plan->stream, plan->row_prefetch);
  double t_opt = jit__now_ms();
  if (lerr) {
    char *m = LLVMGetErrorMessage(lerr);
    status = JIT_ERR(JIT_COMPILE_ERROR, "LLVM optimization failed: %s", m);
    LLVMDisposeErrorMessage(m);
  }
  LLVMMemoryBufferRef buf = NULL;
  char *err = NULL;
  if (!status && LLVMTargetMachineEmitToMemoryBuffer(tm, mod, LLVMObjectFile, &err, &buf)) {
    status = JIT_ERR(JIT_COMPILE_ERROR, "LLVM code generation failed: %s",
                     err ? err : "");
    LLVMDisposeMessage(err);
  }
  if (!status) {
    size_t n = LLVMGetBufferSize(buf);
    out->object = malloc(n ? n : 1);
    if (!out->object) {
      status = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory for a %zu-byte object", n);
    } else {
      memcpy(out->object, LLVMGetBufferStart(buf), n);
      out->object_size = n;
    }
    LLVMDisposeMemoryBuffer(buf);
  }
  out->ms_codegen = jit__now_ms() - t_opt;
  if (own_tm) LLVMDisposeTargetMachine(tm);
  return status;
}

//===--- Shared stages ---------------------------------------------------===//

// Stage 04 at opt_level 0: our own pass turns every linalg.matmul into loops (the
// upstream convert-linalg-to-loops in kToLLVMPipeline takes the rest).
static jit_status jit__run_matmul_loops(MlirContext ctx, MlirModule module,
                                        jit__diag *diag) {
  // The pass creates scf/memref/arith ops: make sure those dialects are loaded.
  mlirContextGetOrLoadDialect(ctx, mlirStringRefCreateFromCString("scf"));
  mlirContextGetOrLoadDialect(ctx, mlirStringRefCreateFromCString("memref"));
  mlirContextGetOrLoadDialect(ctx, mlirStringRefCreateFromCString("arith"));
  MlirPassManager pm = mlirPassManagerCreate(ctx);
  MlirOpPassManager fpm =
      mlirPassManagerGetNestedUnder(pm, mlirStringRefCreateFromCString("func.func"));
  mlirOpPassManagerAddOwnedPass(fpm, jit__create_matmul_to_loops_pass());
  MlirLogicalResult r = mlirPassManagerRunOnOp(pm, mlirModuleGetOperation(module));
  mlirPassManagerDestroy(pm);
  if (mlirLogicalResultIsFailure(r))
    return JIT_ERR(JIT_COMPILE_ERROR, "jitml-lower-matmul-to-loops failed: %s",
                   diag->len ? diag->buf : "(no diagnostic)");
  return NULL;
}

// Ends a stage of the MLIR part of a compile: appends "name ms" (since *t) to
// out->stages, which JITML_LOG=debug prints, and restarts *t.
static void jit__stage_end(jit__artifact *out, const char *name, double *t) {
  double now = jit__now_ms();
  size_t n = strlen(out->stages);
  if (n + 1 < sizeof out->stages)
    snprintf(out->stages + n, sizeof out->stages - n, "%s%s %.1f", n ? ", " : "", name,
             now - *t);
  *t = now;
}

static void jit__dump_llvm(const jit__lower_options *o, const char *kernel,
                           const char *stage, LLVMModuleRef mod) {
  if (!o->dump_dir) return;
  char *text = LLVMPrintModuleToString(mod);
  if (!text) return;
  jit__dump_text(o, kernel, stage, text, strlen(text));
  LLVMDisposeMessage(text);
}

// Named elementwise ops as generics, then elementwise producers fused into consumers.
static jit_status jit__cpu_fuse(MlirContext ctx, MlirModule module, jit__diag *diag) {
  JIT_PROPAGATE(jit__generalize_named(ctx, module, diag));
  return jit__run_own_pipeline(ctx, module, kPrePipeline, diag, "elementwise fusion");
}

// The generic kernel's tiling (opt_level > 0): fusion, then the `?`-dim strategy's
// script (lowering/cpu/generic.c) and its accumulator hoisting. *t: jit__stage_end's.
static jit_status jit__cpu_tile_generic(MlirContext ctx, MlirModule module,
                                        const char *func_name,
                                        const jit__lower_options *options, jit__diag *diag,
                                        jit__cpu_plan *plan, jit__artifact *out, double *t) {
  MlirOperation mop = mlirModuleGetOperation(module);
  jit_status status = NULL;
  JIT_PROPAGATE(jit__cpu_fuse(ctx, module, diag));
  jit__dump_op(options, func_name, "02-fused.mlir", mop);
  jit__stage_end(out, "fusion", t);
  plan->script = jit__cpu_generic_script(ctx, mop, options, &plan->n_ops, &plan->threads);
  plan->parallel = plan->threads > 1;
  if (!plan->script) {
    return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
  }
  if (options->dump_dir)
    jit__dump_text(options, func_name, "03-transform-script.mlir", plan->script,
                   strlen(plan->script));
  if ((status = jit__apply_script(ctx, module, plan->script, "generic tiling", diag)))
    return status;
  if (jit__cpu_inline_outlined(mop) < 0)
    return JIT_ERR(JIT_INTERNAL, "generic tiling: a matmul the script outlined was not put "
                   "back into the kernel");
  if (jit__cpu_fold_iter_slices(mop) > 0 &&
      (status = jit__apply_script(ctx, module, jit__cpu_generic_hoist_script(),
                                  "hoisting generic accumulators", diag)))
    return status;
  jit__cpu_drop_mask_selects(mop);  // once every accumulator is hoisted
  jit__dump_op(options, func_name, "03-tiled-vectorized.mlir", mop);
  jit__stage_end(out, "plan+tiling", t);
  return NULL;
}

// An exact kernel's tiling (opt_level > 0): fusion, normalization, odd-N splits, then
// the plan's script (lowering/cpu/). *t: jit__stage_end's.
static jit_status jit__cpu_tile_exact(MlirContext ctx, MlirModule module,
                                      const char *func_name,
                                      const jit__lower_options *options, jit__diag *diag,
                                      jit__cpu_plan *plan, jit__artifact *out, double *t) {
  MlirOperation mop = mlirModuleGetOperation(module);
  jit_status status = NULL;
  JIT_PROPAGATE(jit__cpu_fuse(ctx, module, diag));
  jit__stage_end(out, "fusion", t);
  jit__cpu_normalize(ctx, mop, options);
  jit__cpu_split_k(ctx, mop, options);
  jit__dump_op(options, func_name, "02-fused.mlir", mop);
  char *split = jit__cpu_split_script(ctx, mop, options);
  if (split) {
    if (options->dump_dir)
      jit__dump_text(options, func_name, "02-split-script.mlir", split, strlen(split));
    status = jit__apply_script(ctx, module, split, "splitting matmuls at odd N", diag);
    free(split);
    if (status) return status;
    jit__cpu_normalize(ctx, mop, options);
  }
  if (!jit__cpu_plan_make(ctx, mop, options, plan)) {
    return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
  }
  jit__stage_end(out, "plan", t);
  jit__dump_op(options, func_name, "02-planned.mlir", mop);
  if (options->dump_dir)
    jit__dump_text(options, func_name, "03-transform-script.mlir", plan->script,
                   strlen(plan->script));
  if (plan->n_ops > 0 && (status = jit__apply_script(ctx, module, plan->script,
                                                    "tiling/vectorization", diag)))
    return status;
  if (plan->n_masked > 0) jit__cpu_drop_mask_selects(mop);
  jit__dump_op(options, func_name, "03-tiled-vectorized.mlir", mop);
  jit__stage_end(out, "tiling", t);
  return NULL;
}

jit_status jit__cpu_compile_module(MlirContext ctx, MlirModule module,
                                   const char *func_name, uint32_t n_args,
                                   const jit__lower_options *options, jit__diag *diag,
                                   double t0, jit__artifact *out) {
  memset(out, 0, sizeof(*out));
  if (strlen(func_name) + 7 > sizeof(out->entry))
    return JIT_ERR(JIT_INTERNAL, "kernel name `%s` too long", func_name);
  MlirOperation mop = mlirModuleGetOperation(module);
  jit_status status = NULL;
  jit__cpu_plan plan;
  memset(&plan, 0, sizeof plan);
  bool rows = false;    // loops left to LLVM's vectorizer (kRotate)
  bool unroll = false;  // k loops to unroll (kUnrollK)
  plan.threads = 1;
  LLVMContextRef llctx = NULL;
  LLVMModuleRef mod = NULL;
  jit__arg_shape *arg_shapes = NULL;
  double t = t0;
  jit__stage_end(out, "emit+parse", &t);
  if (options->generic) {
    arg_shapes = calloc(n_args + 1, sizeof(*arg_shapes));
    status = arg_shapes ? jit__generic_arg_shapes(module, n_args, arg_shapes)
                        : JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
    if (status) goto done;
  }
  if (options->opt_level > 0) {
    status = options->generic
                 ? jit__cpu_tile_generic(ctx, module, func_name, options, diag, &plan, out, &t)
                 : jit__cpu_tile_exact(ctx, module, func_name, options, diag, &plan, out, &t);
    if (status) goto done;
  }
  status = jit__run_own_pipeline(ctx, module, kBufferizePipeline, diag, "bufferization");
  if (status) goto done;
  jit__stage_end(out, "bufferize", &t);
  if (options->opt_level > 0) {
    int64_t stack = 0;
    if (options->weights && !options->generic)
      out->n_packed = (uint32_t)jit__cpu_prepack_weights(
          ctx, mop, func_name, options->weights, n_args, out->packed, JIT__MAX_PACKED_ARGS);
    jit__cpu_results_in_place(ctx, mop);
    jit__cpu_stack_buffers(ctx, mop, &plan, &stack);
    out->stack_bytes = (uint32_t)stack;
  }
  // Deallocations are placed where the kernel allocates: most kernels do not (their
  // buffers went to the stack), and the pipeline then changes nothing (~1.5-2.5 ms).
  bool allocs = false;
  mlirOperationWalk(mop, jit__find_alloc, &allocs, MlirWalkPreOrder);
  if (allocs) {
    status = jit__run_own_pipeline(ctx, module, kDeallocPipeline, diag, "buffer deallocation");
    if (status) goto done;
    jit__stage_end(out, "dealloc", &t);
  }
  if (options->opt_level <= 0 && (status = jit__run_matmul_loops(ctx, module, diag)))
    goto done;
  // Identical loop nests (q, k, v) as one function: the debug log's "shared N" step.
  if (options->opt_level > 0) {
    int shared = jit__cpu_share_loops(ctx, mop, func_name, !options->generic);
    if (shared > 0) {
      char name[32];
      snprintf(name, sizeof name, "shared %d", shared);
      jit__stage_end(out, name, &t);
    }
  }
  jit__dump_op(options, func_name, "04-bufferized.mlir", mop);
  // Neither the k-loop marks nor the bf16 expansion below add linalg or math ops.
  jit__left_ops left = {false, false, false};
  mlirOperationWalk(mop, jit__find_left, &left, MlirWalkPreOrder);
  if (options->opt_level > 0) {
    rows = left.unvectorized;
    unroll = plan.unroll_k && jit__cpu_unroll_k_loops(ctx, mop) > 0;
  }
  // bf16 conversions as integer arithmetic: LLVM's x86 backend calls __truncsfbf2 for
  // them where the host lacks AVX-512 BF16, a libgcc/compiler-rt routine the kernels do
  // not link (and its instruction flushes subnormals): the same rounding on every host.
  {
    bool bf16 = false;
    mlirOperationWalk(mop, jit__find_bf16, &bf16, MlirWalkPreOrder);
    if (bf16) {
      status = jit__run_own_pipeline(
          ctx, module, "builtin.module(func.func(arith-expand{include-bf16=1}))", diag,
          "bf16 conversions");
      if (status) goto done;
    }
  }
  const char *linalg = left.linalg ? JIT__TO_LLVM_LINALG : "";
  const char *math = left.math ? JIT__TO_LLVM_MATH : "";
  // The longest of the four (bare pointers, threads) with both parts and a thread count.
  char to_llvm[sizeof kToLLVMPipelineOmp + sizeof JIT__TO_LLVM_LINALG +
               sizeof JIT__TO_LLVM_MATH + 16];
  if (plan.parallel)
    snprintf(to_llvm, sizeof to_llvm,
             options->generic ? kToLLVMPipelineGenericOmp : kToLLVMPipelineOmp, linalg, math,
             plan.threads);
  else
    snprintf(to_llvm, sizeof to_llvm,
             options->generic ? kToLLVMPipelineGeneric : kToLLVMPipeline, linalg, math);
  status = jit__run_own_pipeline(ctx, module, to_llvm, diag, "lowering to LLVM");
  if (status) goto done;
  if (!mlirOperationVerify(mop)) {
    status = JIT_ERR(JIT_INTERNAL, "the LLVM-dialect module does not verify: %s",
                     diag->len ? diag->buf : "(no diagnostic)");
    goto done;
  }
  jit__dump_op(options, func_name, "05-llvm-dialect.mlir", mop);
  jit__stage_end(out, "to LLVM dialect", &t);

  double t1 = jit__now_ms();
  out->ms_mlir = t1 - t0;
  llctx = LLVMContextCreate();
  mod = mlirTranslateModuleToLLVMIR(mop, llctx);
  if (!mod) {
    status = JIT_ERR(JIT_COMPILE_ERROR, "translation to LLVM IR failed: %s", diag->buf);
    goto done;
  }
  if (options->opt_level > 0) {
    jit__cpu_expand_exp(mod);
    jit__cpu_mark_reductions(mod);
    jit__cpu_tree_reductions(mod);
  }
  snprintf(out->entry, sizeof(out->entry), "%s_entry", func_name);
  out->n_args = n_args;
  status = jit__add_entry(llctx, mod, func_name, out->entry, out->n_args, arg_shapes);
  if (status) goto done;
  jit__stage_end(out, "translate", &t);
  if (plan.wide_vectors) jit__cpu_prefer_wide_vectors(mod);
  jit__dump_llvm(options, func_name, "06-llvm.ll", mod);
  status = jit__llvm_to_object(ctx, mod, options, &plan, rows, unroll, out);
  jit__dump_llvm(options, func_name, "07-llvm-optimized.ll", mod);
  out->ms_llvm_opt = jit__now_ms() - t1 - out->ms_codegen;

done:
  free(arg_shapes);
  if (mod) LLVMDisposeModule(mod);
  if (llctx) LLVMContextDispose(llctx);
  jit__cpu_plan_free(&plan);
  if (status) jit__artifact_release(out);
  return status;
}

//===--- Entry -----------------------------------------------------------===//

// Parses `text` (the graph's function, emitted already) and compiles it.
static jit_status jit__compile_text(const jit__lgraph *graph, const char *func_name,
                                    const jit__lower_options *options, char *text,
                                    double t0, jit__artifact *out) {
  jit__dump_text(options, func_name, "00-graph.mlir", text, strlen(text));
  jit__diag diag = {{0}, 0, NULL};
  MlirContext ctx = jit__mlir_pool_take(options->pool);
  MlirDiagnosticHandlerID handler = jit__diag_attach(ctx, &diag);
  jit_status status = NULL;
  MlirModule module = mlirModuleCreateParse(ctx, mlirStringRefCreateFromCString(text));
  if (mlirModuleIsNull(module)) {
    status = JIT_ERR(JIT_INTERNAL, "generated MLIR does not parse: %s", diag.buf);
  } else {
    // The emitted function is specialized already: stage 01 is stage 00 parsed.
    jit__dump_op(options, func_name, "01-specialized.mlir", mlirModuleGetOperation(module));
    status = jit__cpu_compile_module(ctx, module, func_name,
                                     graph->n_inputs + graph->n_outputs, options, &diag,
                                     t0, out);
    mlirModuleDestroy(module);
  }
  mlirContextDetachDiagnosticHandler(ctx, handler);
  jit__mlir_pool_give(options->pool, ctx);
  free(text);
  if (status)
    status = jit__status_annotate(status, "compiling %s`%s` for the CPU",
                                  options->generic ? "the generic kernel of " : "",
                                  graph->name ? graph->name : func_name);
  return status;
}

jit_status jit__compile_cpu(const jit__lgraph *graph, const char *func_name,
                            const jit__lower_options *options, jit__artifact *out) {
  memset(out, 0, sizeof(*out));
  double t0 = jit__now_ms();
  char *text = NULL;
  // Named batched matmuls, convolutions as matmuls, attention in key blocks, and the
  // convolutions' im2col blocks: a quarter of L2, at most JIT__CONV_BLOCK_BYTES (ResNet's 3x3 at 56x56, C = 64, on a
  // 2 MiB L2: 256 and 512 KiB blocks the same, 1 and 2 MiB 5-15 % slower).
  int64_t l2 = jit__cpu_host_of(options).l2;
  jit__emit_options eo = {.named_batch = true, .conv_as_matmul = true,
                          .attention_block = 64, .fuse_elementwise = true,
                          .distinct_empties = true,
                          .conv_block_bytes = l2 / 4 < JIT__CONV_BLOCK_BYTES
                                                  ? l2 / 4 : JIT__CONV_BLOCK_BYTES,
                          .forall_threads = options->num_threads,
                          .conv_winograd_bytes = options->conv_im2col ? 0 : l2};
  JIT_RETURN_IF_ERROR(jit__emit_mlir_with(graph, func_name, &eo, &text), "emitting MLIR");
  jit__lower_options o = *options;
  o.generic = false;
  // Weights (jit_weight), per argument: the kernel may read them packed.
  bool *weights = NULL;
  for (uint32_t i = 0; i < graph->n_inputs; i++) {
    if (!graph->nodes[graph->inputs[i]].weight) continue;
    if (!weights && !(weights = calloc(graph->n_inputs + graph->n_outputs, sizeof(bool)))) break;
    weights[i] = true;
  }
  o.weights = weights;
  o.n_weights = weights ? graph->n_inputs + graph->n_outputs : 0;
  jit_status s = jit__compile_text(graph, func_name, &o, text, t0, out);
  free(weights);
  return s;
}

jit_status jit__compile_cpu_generic(const jit__lgraph *graph,
                                   const int64_t (*reshape_req)[JIT_MAX_RANK],
                                   const char *func_name, const jit__lower_options *options,
                                   jit__artifact *out) {
  memset(out, 0, sizeof(*out));
  double t0 = jit__now_ms();
  char *text = NULL;
  // Two paths: many rows (B packed) and a few (not): lowering/cpu/generic.c.
  jit__emit_options eo = {.symbolic = true, .destination = true, .reshape_req = reshape_req,
                          .conv_as_matmul = true,
                          .split_rows = options->opt_level > 0 ? JIT__GENERIC_SPLIT_ROWS : 0,
                          .fuse_elementwise = true, .distinct_empties = true};
  jit_status s = jit__emit_mlir_with(graph, func_name, &eo, &text);
  if (s) {
    // What the emitter cannot write with `?` dims is not supported generically.
    if (jit_status_get_code(s) == JIT_INTERNAL) return s;
    return jit__status_annotate(s, "emitting the generic kernel of `%s`",
                                graph->name ? graph->name : func_name);
  }
  jit__lower_options o = *options;
  o.generic = true;
  return jit__compile_text(graph, func_name, &o, text, t0, out);
}
