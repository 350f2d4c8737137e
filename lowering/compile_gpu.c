//===--- compile_gpu.c - specialized graph -> PTX / SPIR-V + launch plan ----===//
//
// Front half (shared by CUDA and Vulkan):
//   graph -> MLIR text (emit_mlir.c) -> elementwise fusion -> one-shot bufferization
//   (outputs are the caller's buffers) -> linalg to scf.parallel loop nests.
//   Then, on the IR through the C API:
//   - every memref.alloc left in the function becomes an extra function argument, so
//     intermediates are buffers the runtime allocates (the plan's TEMP buffers);
//   - top-level work that is not a parallel loop (a rank-0 fill or reduction, a
//     memref.copy) is wrapped into a parallel loop so that it runs on the device too;
//   - the function is split into one function per top-level parallel loop, so that
//     each loop gets its own tile sizes: scf-parallel-loop-tiling takes one list per
//     pass run, and func.func is the smallest unit a pass manager can run on;
//   - matmuls and innermost-axis reductions (softmax's too) get kernels that use
//     workgroup memory (gpu_tiled.c: 2-D A/B tiles; one workgroup per row with a tree
//     reduction); with jit__gpu_target.plain_kernels, or for any other loop:
//   - tile, map loops onto blocks/threads ourselves (last dim -> x, for coalescing),
//     convert to gpu.launch, sink constants, outline kernels;
//   - read the launch plan from the gpu.launch_func ops and merge all kernels into one
//     gpu.module, so the runtime loads one module.
// Back halves: NVVM -> PTX (gpu-module-to-binary{format=isa}), or SPIR-V for Vulkan.
//
// Every compile creates its own MLIR context; compiles on different threads share only
// the process-wide pass registration done once.
//
//===----------------------------------------------------------------------===//
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <llvm-c/Target.h>
#include <mlir-c/AffineMap.h>
#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <mlir-c/Diagnostics.h>
#include <mlir-c/Dialect/GPU.h>
#include <mlir-c/IR.h>
#include <mlir-c/Pass.h>
#include <mlir-c/RegisterEverything.h>
#include <mlir-c/Target/LLVMIR.h>

#include "base/status.h"
#include "base/text.h"
#include "lowering/gpu.h"
#include "lowering/gpu_generic.h"
#include "lowering/gpu_images.h"
#include "lowering/gpu_ir.h"
#include "lowering/gpu_tiled.h"
#include "lowering/import.h"

//===--- Pipelines -------------------------------------------------------===//

// Tensors -> buffers -> loops. Intermediates become memref.alloc (promoted to
// arguments below); no deallocation pass: the runtime owns those buffers.
static const char kFrontPipeline[] =
    "builtin.module(linalg-fuse-elementwise-ops,canonicalize,cse,"
    "eliminate-empty-tensors,empty-tensor-to-alloc-tensor,"
    "one-shot-bufferize{bufferize-function-boundaries=1 "
    "function-boundary-type-conversion=identity-layout-map},"
    "canonicalize,cse,canonicalize,"
    "func.func(convert-linalg-to-parallel-loops),canonicalize,cse)";

// After tiling and mapping (done per kernel function): loops -> gpu.launch -> kernels.
static const char kOutlinePipeline[] =
    "builtin.module(convert-parallel-loops-to-gpu,canonicalize,"
    "gpu-launch-sink-index-computations,gpu-kernel-outlining,canonicalize,cse)";

static double jit__gpu_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

//===--- Process-wide registration ---------------------------------------===//

static pthread_once_t jit__gpu_once = PTHREAD_ONCE_INIT;

static void jit__gpu_init(void) {
  mlirRegisterAllPasses();
  // gpu-module-to-binary looks the NVPTX target up in LLVM's registry.
  LLVMInitializeNVPTXTargetInfo();
  LLVMInitializeNVPTXTarget();
  LLVMInitializeNVPTXTargetMC();
  LLVMInitializeNVPTXAsmPrinter();
}

//===--- Chips -----------------------------------------------------------===//

// The PTX ISA version each chip needs (LLVM's NVPTX.td), raised to 6.0, the oldest
// LLVM's NVPTX backend defaults to. A chip missing here is refused: LLVM given a chip
// with a too-old PTX version ends the process ("PTX version 6.0 does not support
// target 'sm_90'").
static const struct {
  const char *chip;
  int ptx;
} kChips[] = {
    {"sm_50", 60},  {"sm_52", 60},  {"sm_53", 60},   {"sm_60", 60},   {"sm_61", 60},
    {"sm_62", 60},  {"sm_70", 60},  {"sm_72", 61},   {"sm_75", 63},   {"sm_80", 70},
    {"sm_86", 71},  {"sm_87", 74},  {"sm_89", 78},   {"sm_90", 78},   {"sm_90a", 80},
    {"sm_100", 86}, {"sm_100a", 86}, {"sm_101", 86}, {"sm_101a", 86}, {"sm_120", 87},
    {"sm_120a", 87},
};

// PTX versions LLVM 22 accepts as +ptxNN features (llc -mattr=help); an unknown one
// would be ignored with a warning and fall back to 6.0.
static const int kPtxVersions[] = {60, 61, 62, 63, 64, 65, 70, 71, 72, 73, 74, 75, 76,
                                   77, 78, 80, 81, 82, 83, 84, 85, 86, 87, 88, 90};

int jit__gpu_ptx_min_version(const char *chip) {
  if (!chip) return 0;
  for (size_t i = 0; i < sizeof kChips / sizeof kChips[0]; i++)
    if (!strcmp(kChips[i].chip, chip)) return kChips[i].ptx;
  return 0;
}

static jit_status jit__check_target(const jit__gpu_target *t, int *out_ptx) {
  if (t->format == JIT__GPU_PTX) {
    int min = jit__gpu_ptx_min_version(t->chip);
    if (!min)
      return JIT_ERR(JIT_UNSUPPORTED, "GPU chip `%s` is not supported by the PTX "
                     "lowering", t->chip ? t->chip : "(null)");
    int v = t->ptx_version ? t->ptx_version : min;
    bool known = false;
    for (size_t i = 0; i < sizeof kPtxVersions / sizeof kPtxVersions[0]; i++)
      known = known || kPtxVersions[i] == v;
    if (!known || v < min)
      return JIT_ERR(JIT_UNSUPPORTED, "PTX version %d.%d is not usable for `%s` "
                     "(needs %d.%d or newer, and one LLVM knows)", v / 10, v % 10,
                     t->chip, min / 10, min % 10);
    *out_ptx = v;
    return NULL;
  }
  if (t->format == JIT__GPU_SPIRV) {
    int minor = t->spirv_minor ? t->spirv_minor : 3;
    if (minor < 0 || minor > 6)
      return JIT_ERR(JIT_UNSUPPORTED, "SPIR-V version 1.%d is not supported", minor);
    return NULL;
  }
  return JIT_ERR(JIT_UNSUPPORTED, "unknown GPU format %d", (int)t->format);
}

//===--- Small IR helpers ------------------------------------------------===//

static MlirOperation jit__find_func(MlirModule module, const char *name) {
  size_t n = strlen(name);
  for (MlirOperation op = mlirBlockGetFirstOperation(mlirModuleGetBody(module));
       !mlirOperationIsNull(op); op = mlirOperationGetNextInBlock(op)) {
    if (!jit__op_is(op, "func.func")) continue;
    MlirStringRef s = mlirStringAttrGetValue(
        mlirOperationGetAttributeByName(op, jit__sr("sym_name")));
    if (s.length == n && !memcmp(s.data, name, n)) return op;
  }
  return (MlirOperation){NULL};
}

// A new `scf.parallel` over [0, ub[d]) with step 1, inserted before `before`; its body
// block (with `rank` index arguments) is returned in *out_body, holding only the
// terminator.
static MlirOperation jit__make_parallel(MlirContext ctx, MlirBlock block,
                                        MlirOperation before, int rank,
                                        const int64_t *ub, MlirBlock *out_body) {
  MlirLocation loc = mlirLocationUnknownGet(ctx);
  MlirValue opnds[3 * JIT_MAX_RANK];
  MlirValue zero = jit__index_const(ctx, block, before, 0);
  MlirValue one = jit__index_const(ctx, block, before, 1);
  for (int d = 0; d < rank; d++) {
    opnds[d] = zero;
    opnds[rank + d] = jit__index_const(ctx, block, before, ub[d]);
    opnds[2 * rank + d] = one;
  }
  MlirType idx[JIT_MAX_RANK];
  MlirLocation locs[JIT_MAX_RANK];
  for (int d = 0; d < rank; d++) {
    idx[d] = mlirIndexTypeGet(ctx);
    locs[d] = loc;
  }
  MlirBlock body = mlirBlockCreate(rank, idx, locs);
  MlirOperationState rs = mlirOperationStateGet(jit__sr("scf.reduce"), loc);
  mlirBlockAppendOwnedOperation(body, mlirOperationCreate(&rs));
  MlirRegion region = mlirRegionCreate();
  mlirRegionAppendOwnedBlock(region, body);

  MlirOperationState st = mlirOperationStateGet(jit__sr("scf.parallel"), loc);
  mlirOperationStateAddOperands(&st, 3 * rank, opnds);
  int32_t seg[4] = {rank, rank, rank, 0};
  MlirNamedAttribute a = mlirNamedAttributeGet(
      mlirIdentifierGet(ctx, jit__sr("operandSegmentSizes")),
      mlirDenseI32ArrayGet(ctx, 4, seg));
  mlirOperationStateAddAttributes(&st, 1, &a);
  mlirOperationStateAddOwnedRegions(&st, 1, &region);
  MlirOperation par = mlirOperationCreate(&st);
  mlirBlockInsertOwnedOperationBefore(block, before, par);
  *out_body = body;
  return par;
}

//===--- Intermediates become arguments ----------------------------------===//

typedef struct jit__bufinfo {
  uint32_t n;
  uint32_t cap;
  jit__gpu_buffer *v;
} jit__bufinfo;

static jit_status jit__buf_push(jit__bufinfo *b, jit__gpu_buffer x) {
  if (b->n == b->cap) {
    uint32_t cap = b->cap ? b->cap * 2 : 16;
    jit__gpu_buffer *v = realloc(b->v, cap * sizeof *v);
    if (!v) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
    b->v = v;
    b->cap = cap;
  }
  b->v[b->n++] = x;
  return NULL;
}

static uint64_t jit__memref_bytes(MlirType t) {
  uint64_t n = 1;
  intptr_t r = mlirShapedTypeGetRank(t);
  for (intptr_t d = 0; d < r; d++) n *= (uint64_t)mlirShapedTypeGetDimSize(t, d);
  MlirType e = mlirShapedTypeGetElementType(t);
  return n * (mlirTypeIsAF16(e) ? 2 : 4);
}

// Replaces each top-level memref.alloc of `func` with a new trailing argument and
// rewrites the function type. Records each as a TEMP buffer; with `gx` (a generic
// kernel) its bytes may depend on the binding (the alloc's `?` sizes).
static jit_status jit__promote_allocs(MlirContext ctx, MlirOperation func,
                                      jit__bufinfo *bufs, jit__gx_builder *gx) {
  MlirBlock entry = jit__entry_block(func);
  uint32_t n_temp = 0;
  for (MlirOperation op = mlirBlockGetFirstOperation(entry), next; !mlirOperationIsNull(op);
       op = next) {
    next = mlirOperationGetNextInBlock(op);
    if (!jit__op_is(op, "memref.alloc")) continue;
    MlirValue res = mlirOperationGetResult(op, 0);
    MlirType t = mlirValueGetType(res);
    jit__gpu_buffer b = {JIT__GPU_BUF_TEMP, n_temp++, 0, {0, 0}};
    bool dense = mlirAffineMapIsIdentity(mlirMemRefTypeGetAffineMap(t));
    if (gx && dense && !mlirShapedTypeHasStaticShape(t)) {
      JIT_PROPAGATE(jit__gx_check_buffer(t));
      MlirValue dyn[JIT_MAX_RANK];
      intptr_t n = mlirOperationGetNumOperands(op);
      for (intptr_t i = 0; i < n && i < JIT_MAX_RANK; i++) dyn[i] = mlirOperationGetOperand(op, i);
      JIT_PROPAGATE(jit__gx_bytes(gx, t, dyn, 0, &b.bytes_expr));
    } else if (mlirOperationGetNumOperands(op) != 0 || !mlirShapedTypeHasStaticShape(t) ||
               !dense) {
      return JIT_ERR(JIT_UNSUPPORTED, "GPU lowering: an intermediate buffer without a "
                     "static dense shape");
    } else {
      b.bytes = jit__memref_bytes(t);
    }
    MlirValue arg = mlirBlockAddArgument(entry, t, mlirOperationGetLocation(op));
    mlirValueReplaceAllUsesOfWith(res, arg);
    mlirOperationDestroy(op);
    JIT_PROPAGATE(jit__buf_push(bufs, b));
  }
  intptr_t n = mlirBlockGetNumArguments(entry);
  MlirType *types = malloc((size_t)(n ? n : 1) * sizeof *types);
  if (!types) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
  for (intptr_t i = 0; i < n; i++) types[i] = mlirValueGetType(mlirBlockGetArgument(entry, i));
  MlirType fty = mlirFunctionTypeGet(ctx, n, types, 0, NULL);
  free(types);
  mlirOperationSetAttributeByName(func, jit__sr("function_type"), mlirTypeAttrGet(fty));
  return NULL;
}

//===--- Everything on the device ----------------------------------------===//

// Ops that may stay in the host function: they compute no tensor data.
static bool jit__is_host_op_at(MlirOperation op, int depth);

static bool jit__is_host_op(MlirOperation op) { return jit__is_host_op_at(op, 0); }

static bool jit__is_host_op_at(MlirOperation op, int depth) {
  static const char *const kHost[] = {
      "arith.constant",       "func.return",         "memref.collapse_shape",
      "memref.expand_shape",  "memref.cast",         "memref.reinterpret_cast",
      "memref.get_global",    "scf.parallel",
  };
  for (size_t i = 0; i < sizeof kHost / sizeof kHost[0]; i++)
    if (jit__op_is(op, kHost[i])) return true;
  // A generic kernel's sizes: dims of its buffers and scalar arithmetic on them (a
  // mean's count as a float too), made from nothing but other host values.
  if (jit__op_is(op, "memref.dim")) return true;
  MlirStringRef name = mlirIdentifierStr(mlirOperationGetName(op));
  if (depth > 8 || name.length <= 6 || memcmp(name.data, "arith.", 6) != 0 ||
      mlirOperationGetNumResults(op) != 1 || mlirOperationGetNumRegions(op) != 0 ||
      mlirOperationGetNumOperands(op) == 0)
    return false;
  for (intptr_t i = 0; i < mlirOperationGetNumOperands(op); i++) {
    MlirValue v = mlirOperationGetOperand(op, i);
    if (!mlirValueIsAOpResult(v) || !jit__is_host_op_at(mlirOpResultGetOwner(v), depth + 1))
      return false;
  }
  return true;
}

// memref.copy %src, %dst -> an scf.parallel of loads and stores over dst's shape, so
// the copy becomes a kernel like any other loop.
static jit_status jit__copy_to_loop(MlirContext ctx, MlirBlock block, MlirOperation copy) {
  MlirValue src = mlirOperationGetOperand(copy, 0), dst = mlirOperationGetOperand(copy, 1);
  MlirType t = mlirValueGetType(dst);
  if (!mlirShapedTypeHasStaticShape(t) || !mlirShapedTypeHasStaticShape(mlirValueGetType(src)))
    return JIT_ERR(JIT_UNSUPPORTED, "GPU lowering: a copy of a dynamic shape");
  int rank = (int)mlirShapedTypeGetRank(t);
  int64_t ub[JIT_MAX_RANK];
  for (int d = 0; d < rank; d++) ub[d] = mlirShapedTypeGetDimSize(t, d);
  int prank = rank ? rank : 1;
  if (!rank) ub[0] = 1;
  MlirBlock body;
  jit__make_parallel(ctx, block, copy, prank, ub, &body);
  MlirOperation term = mlirBlockGetTerminator(body);
  MlirLocation loc = mlirOperationGetLocation(copy);
  MlirValue lopnds[1 + JIT_MAX_RANK], sopnds[2 + JIT_MAX_RANK];
  lopnds[0] = src;
  for (int d = 0; d < rank; d++) lopnds[1 + d] = mlirBlockGetArgument(body, d);
  MlirType et = mlirShapedTypeGetElementType(t);
  MlirOperationState ls = mlirOperationStateGet(jit__sr("memref.load"), loc);
  mlirOperationStateAddOperands(&ls, 1 + rank, lopnds);
  mlirOperationStateAddResults(&ls, 1, &et);
  MlirOperation load = mlirOperationCreate(&ls);
  mlirBlockInsertOwnedOperationBefore(body, term, load);
  sopnds[0] = mlirOperationGetResult(load, 0);
  sopnds[1] = dst;
  for (int d = 0; d < rank; d++) sopnds[2 + d] = mlirBlockGetArgument(body, d);
  MlirOperationState ss = mlirOperationStateGet(jit__sr("memref.store"), loc);
  mlirOperationStateAddOperands(&ss, 2 + rank, sopnds);
  mlirBlockInsertOwnedOperationBefore(body, term, mlirOperationCreate(&ss));
  mlirOperationDestroy(copy);
  return NULL;
}

// Leaves only host-side bookkeeping and parallel loops at the top level of `func`:
// - memref.copy (bufferization copies e.g. an input reshaped straight into an output)
//   becomes a parallel loop of loads and stores;
// - rank-0 fills and reductions to a scalar come out of convert-linalg-to-parallel-loops
//   as bare stores and scf.for nests: each scf.for nest, and each maximal run of other
//   such ops, is moved into a one-iteration scf.parallel (one thread does the work,
//   unless the nest is a reduction jit__gpu_try_tiled gives a workgroup).
static jit_status jit__device_only(MlirContext ctx, MlirOperation func) {
  MlirBlock entry = jit__entry_block(func);
  for (MlirOperation op = mlirBlockGetFirstOperation(entry), next; !mlirOperationIsNull(op);
       op = next) {
    next = mlirOperationGetNextInBlock(op);
    if (jit__op_is(op, "memref.copy")) {
      MlirType a = mlirValueGetType(mlirOperationGetOperand(op, 0));
      MlirType b = mlirValueGetType(mlirOperationGetOperand(op, 1));
      if (!mlirTypeEqual(mlirShapedTypeGetElementType(a), mlirShapedTypeGetElementType(b)) ||
          mlirShapedTypeGetRank(a) != mlirShapedTypeGetRank(b))
        return JIT_ERR(JIT_UNSUPPORTED, "GPU lowering: a copy between different shapes");
      JIT_PROPAGATE(jit__copy_to_loop(ctx, entry, op));
      continue;
    }
    if (jit__is_host_op(op)) continue;
    // The run [op, last] of consecutive device ops. A loop nest (a reduction to a
    // scalar, or of a single row) is a run of its own, so that it is a kernel of the
    // shape jit__gpu_try_tiled recognises (a workgroup per row instead of one thread).
    MlirOperation last = op;
    while (!jit__op_is(op, "scf.for") && !mlirOperationIsNull(next) &&
           !jit__is_host_op(next) && !jit__op_is(next, "memref.copy") &&
           !jit__op_is(next, "scf.for")) {
      last = next;
      next = mlirOperationGetNextInBlock(next);
    }
    int64_t one = 1;
    MlirBlock body;
    jit__make_parallel(ctx, entry, op, 1, &one, &body);
    MlirOperation term = mlirBlockGetTerminator(body);
    for (MlirOperation m = op;;) {
      MlirOperation mn = mlirOperationGetNextInBlock(m);
      bool done = mlirOperationEqual(m, last);
      mlirOperationRemoveFromParent(m);
      mlirBlockInsertOwnedOperationBefore(body, term, m);
      if (done) break;
      m = mn;
    }
  }
  return NULL;
}

//===--- One function per kernel, tiled and mapped -----------------------===//

static int64_t jit__const_index(MlirValue v, bool *ok) {
  if (mlirValueIsAOpResult(v)) {
    MlirOperation d = mlirOpResultGetOwner(v);
    if (jit__op_is(d, "arith.constant")) {
      MlirAttribute a = mlirOperationGetAttributeByName(d, jit__sr("value"));
      if (mlirAttributeIsAInteger(a)) return mlirIntegerAttrGetValueInt(a);
    }
  }
  *ok = false;
  return 0;
}

typedef struct jit__nested {
  const char *name;
  bool found;
} jit__nested;

static MlirWalkResult jit__nested_cb(MlirOperation op, void *user) {
  jit__nested *n = user;
  if (jit__op_is(op, n->name)) {
    n->found = true;
    return MlirWalkResultInterrupt;
  }
  return MlirWalkResultAdvance;
}

static bool jit__has_nested(MlirOperation op, const char *name) {
  jit__nested n = {name, false};
  mlirOperationWalk(op, jit__nested_cb, &n, MlirWalkPreOrder);
  return n.found;
}

static uint32_t jit__pow2_at_least(int64_t n, uint32_t lo, uint32_t hi) {
  uint32_t p = lo;
  while (p < hi && (int64_t)p < n) p *= 2;
  return p;
}

// Tile sizes (= block size per loop dim) for one top-level parallel loop:
// - 1-D: 256 lanes (fewer, in whole warps, for short loops);
// - loops with an inner reduction (matmul, row reductions) of rank >= 2: 16x16 on the
//   last two dims;
// - elementwise of rank >= 2: 256 lanes split as x over the last dim (up to 256) and
//   y over the one before, so consecutive lanes touch consecutive addresses.
static void jit__pick_tiles(MlirOperation par, int rank, int64_t *tiles) {
  bool ok = true;
  int64_t ub[JIT_MAX_RANK];
  for (int d = 0; d < rank; d++) {
    ub[d] = jit__const_index(mlirOperationGetOperand(par, rank + d), &ok);
    if (!ok) ub[d] = 256;
    tiles[d] = 1;
  }
  if (rank == 1) {
    tiles[0] = jit__pow2_at_least(ub[0], 32, 256);
    return;
  }
  if (jit__has_nested(par, "scf.for")) {
    tiles[rank - 1] = 16;
    tiles[rank - 2] = 16;
    return;
  }
  uint32_t x = jit__pow2_at_least(ub[rank - 1], 32, 256);
  tiles[rank - 1] = x;
  tiles[rank - 2] = jit__pow2_at_least(ub[rank - 2], 1, 256 / x);
}

static jit_status jit__run_on(MlirContext ctx, MlirOperation op, const char *anchor,
                              const char *pipeline, jit__diag *diag, const char *stage) {
  MlirPassManager pm = mlirPassManagerCreateOnOperation(ctx, jit__sr(anchor));
  MlirLogicalResult r = mlirOpPassManagerAddPipeline(
      mlirPassManagerGetAsOpPassManager(pm), jit__sr(pipeline), jit__diag_append, diag);
  if (mlirLogicalResultIsFailure(r)) {
    mlirPassManagerDestroy(pm);
    return JIT_ERR(JIT_INTERNAL, "%s: bad pass pipeline `%s`: %s", stage, pipeline,
                   diag->buf);
  }
  r = mlirPassManagerRunOnOp(pm, op);
  mlirPassManagerDestroy(pm);
  if (mlirLogicalResultIsFailure(r))
    return JIT_ERR(JIT_COMPILE_ERROR, "%s failed: %s", stage,
                   diag->len ? diag->buf : "(no diagnostic)");
  return NULL;
}

// The mapping attribute for a loop of `rank` dims at `level` ("block" or "thread"):
// last dim -> x, then y, z; further dims stay sequential loops in the kernel. Level
// "sequential": every dim a loop in the kernel.
static MlirAttribute jit__mapping_attr(MlirContext ctx, int rank, const char *level) {
  char text[2048];
  int n = snprintf(text, sizeof text, "[");
  for (int d = 0; d < rank; d++) {
    int from_last = rank - 1 - d;
    char proc[32];
    if (!strcmp(level, "sequential"))
      snprintf(proc, sizeof proc, "sequential");
    else if (from_last < 3)
      snprintf(proc, sizeof proc, "%s_%c", level, "xyz"[from_last]);
    else
      snprintf(proc, sizeof proc, "sequential");
    n += snprintf(text + n, sizeof text - (size_t)n,
                  "%s#gpu.loop_dim_map<processor = %s, map = (d0) -> (d0), "
                  "bound = (d0) -> (d0)>",
                  d ? ", " : "", proc);
  }
  snprintf(text + n, sizeof text - (size_t)n, "]");
  return mlirAttributeParseGet(ctx, jit__sr(text));
}

static MlirOperation jit__first_in_block(MlirBlock b, const char *name) {
  for (MlirOperation op = mlirBlockGetFirstOperation(b); !mlirOperationIsNull(op);
       op = mlirOperationGetNextInBlock(op))
    if (jit__op_is(op, name)) return op;
  return (MlirOperation){NULL};
}

// Runs scf-parallel-loop-tiling on `kf` with `tiles` (its innermost parallel loops).
static jit_status jit__tile_loops(MlirContext ctx, MlirOperation kf, int rank,
                                  const int64_t *tiles, jit__diag *diag) {
  char pipe[256];
  int n = snprintf(pipe, sizeof pipe, "scf-parallel-loop-tiling{parallel-loop-tile-sizes=");
  for (int d = 0; d < rank; d++)
    n += snprintf(pipe + n, sizeof pipe - (size_t)n, "%s%lld", d ? "," : "",
                  (long long)tiles[d]);
  snprintf(pipe + n, sizeof pipe - (size_t)n, " no-min-max-bounds=1}");
  return jit__run_on(ctx, kf, "func.func", pipe, diag, "tiling");
}

static MlirOperation jit__inner_parallel(MlirOperation par) {
  return jit__first_in_block(mlirRegionGetFirstBlock(mlirOperationGetRegion(par, 0)),
                             "scf.parallel");
}

// Tiles the one top-level scf.parallel of kernel function `kf` and maps the tile loop
// to blocks and the intra-tile loop to threads. Where a dim would need more than
// kMaxGrid blocks (65535: Vulkan's guaranteed minimum per dim, CUDA's in y and z),
// each block takes several tiles of it in turn: the block loop is tiled by c tiles
// (c = ceil(tiles / kMaxGrid)), and a sequential loop inside it steps through them.
static jit_status jit__tile_and_map(MlirContext ctx, MlirOperation kf, jit__diag *diag) {
  enum { kMaxGrid = 65535 };
  MlirOperation par = jit__first_in_block(jit__entry_block(kf), "scf.parallel");
  if (mlirOperationIsNull(par)) return JIT_ERR(JIT_INTERNAL, "kernel function lost its loop");
  int rank = (int)(mlirOperationGetNumOperands(par) / 3);
  if (rank < 1 || rank > JIT_MAX_RANK)
    return JIT_ERR(JIT_INTERNAL, "parallel loop of rank %d", rank);
  int64_t tiles[JIT_MAX_RANK], block_tiles[JIT_MAX_RANK] = {0};
  jit__pick_tiles(par, rank, tiles);
  bool folded = false;
  for (int d = 0; d < rank; d++) {
    bool ok = true;
    int64_t lb = jit__const_index(mlirOperationGetOperand(par, d), &ok);
    int64_t ub = jit__const_index(mlirOperationGetOperand(par, rank + d), &ok);
    int64_t step = jit__const_index(mlirOperationGetOperand(par, 2 * rank + d), &ok);
    int64_t blocks = ok && step > 0 ? ((ub - lb + step - 1) / step + tiles[d] - 1) / tiles[d]
                                    : 0;
    int64_t c = rank - 1 - d < 3 && blocks > kMaxGrid ? (blocks + kMaxGrid - 1) / kMaxGrid : 1;
    block_tiles[d] = tiles[d] * c;
    folded = folded || c > 1;
  }
  JIT_PROPAGATE(jit__tile_loops(ctx, kf, rank, block_tiles, diag));
  if (folded) JIT_PROPAGATE(jit__tile_loops(ctx, kf, rank, tiles, diag));

  MlirOperation outer = jit__first_in_block(jit__entry_block(kf), "scf.parallel");
  if (mlirOperationIsNull(outer)) return JIT_ERR(JIT_INTERNAL, "tiling lost the loop");
  MlirOperation middle = folded ? jit__inner_parallel(outer) : outer;
  MlirOperation inner = mlirOperationIsNull(middle) ? middle : jit__inner_parallel(middle);
  if (mlirOperationIsNull(inner)) return JIT_ERR(JIT_INTERNAL, "tiling made no inner loop");
  int orank = (int)(mlirOperationGetNumOperands(outer) / 3);
  int irank = (int)(mlirOperationGetNumOperands(inner) / 3);
  MlirAttribute om = jit__mapping_attr(ctx, orank, "block");
  MlirAttribute im = jit__mapping_attr(ctx, irank, "thread");
  MlirAttribute mm = folded ? jit__mapping_attr(ctx, (int)(mlirOperationGetNumOperands(middle) / 3),
                                                "sequential")
                            : om;
  if (mlirAttributeIsNull(om) || mlirAttributeIsNull(im) || mlirAttributeIsNull(mm))
    return JIT_ERR(JIT_INTERNAL, "bad loop mapping attribute: %s", diag->buf);
  mlirOperationSetAttributeByName(outer, jit__sr("mapping"), om);
  if (folded) mlirOperationSetAttributeByName(middle, jit__sr("mapping"), mm);
  mlirOperationSetAttributeByName(inner, jit__sr("mapping"), im);
  return NULL;
}

// convert-linalg-to-parallel-loops keeps the op's loop order, so a reduction over a
// middle or leading axis gives `parallel { for { parallel { body } } }` (or a bare
// `for { parallel }`, wrapped above). Only the outer loop is mapped to the GPU, so the
// inner parallel dims are hoisted into it: `parallel (outer..., inner...) { for { body
// } }`. This is an interchange of the reduction loop with loops whose iterations touch
// disjoint accumulator elements, so it keeps the result.
static jit_status jit__hoist_parallel(MlirContext ctx, MlirOperation par) {
  for (int round = 0; round < JIT_MAX_RANK; round++) {
    MlirBlock pb = mlirRegionGetFirstBlock(mlirOperationGetRegion(par, 0));
    // The chain par -> for -> ... -> for -> q, each body holding only the next op and
    // its terminator.
    MlirOperation fors[JIT_MAX_RANK + 1];
    int n_for = 0;
    MlirOperation cur = mlirBlockGetFirstOperation(pb), q = {NULL};
    while (!mlirOperationIsNull(cur) && n_for <= JIT_MAX_RANK) {
      MlirOperation after = mlirOperationGetNextInBlock(cur);
      if (mlirOperationIsNull(after) || !mlirOperationIsNull(mlirOperationGetNextInBlock(after)))
        break;  // not [op, terminator]
      if (jit__op_is(cur, "scf.parallel")) {
        q = cur;
        break;
      }
      if (!jit__op_is(cur, "scf.for")) break;
      fors[n_for++] = cur;
      cur = mlirBlockGetFirstOperation(mlirRegionGetFirstBlock(mlirOperationGetRegion(cur, 0)));
    }
    if (n_for == 0 || mlirOperationIsNull(q)) return NULL;
    int pr = (int)(mlirOperationGetNumOperands(par) / 3);
    int qr = (int)(mlirOperationGetNumOperands(q) / 3);
    if (mlirOperationGetNumResults(q) || mlirOperationGetNumResults(par) || pr + qr > JIT_MAX_RANK)
      return NULL;
    int64_t ub[JIT_MAX_RANK];
    bool ok = true;
    for (int d = 0; d < pr + qr; d++) {
      MlirOperation l = d < pr ? par : q;
      int r = d < pr ? pr : qr, i = d < pr ? d : d - pr;
      ok = ok && jit__const_index(mlirOperationGetOperand(l, i), &ok) == 0;
      ub[d] = jit__const_index(mlirOperationGetOperand(l, r + i), &ok);
      ok = ok && jit__const_index(mlirOperationGetOperand(l, 2 * r + i), &ok) == 1;
    }
    if (!ok) return NULL;  // not normalized: leave it (correct, less parallel)
    MlirBlock outer_block = mlirOperationGetBlock(par);
    MlirBlock nb;
    MlirOperation np = jit__make_parallel(ctx, outer_block, par, pr + qr, ub, &nb);
    for (int d = 0; d < pr; d++)
      mlirValueReplaceAllUsesOfWith(mlirBlockGetArgument(pb, d), mlirBlockGetArgument(nb, d));
    MlirBlock qb = mlirRegionGetFirstBlock(mlirOperationGetRegion(q, 0));
    for (int d = 0; d < qr; d++)
      mlirValueReplaceAllUsesOfWith(mlirBlockGetArgument(qb, d),
                                    mlirBlockGetArgument(nb, pr + d));
    // q's body (minus its scf.reduce) replaces q inside the innermost for.
    MlirBlock fb = mlirOperationGetBlock(q);
    for (MlirOperation op = mlirBlockGetFirstOperation(qb), next; !mlirOperationIsNull(op);
         op = next) {
      next = mlirOperationGetNextInBlock(op);
      if (mlirOperationIsNull(next)) break;  // the terminator
      mlirOperationRemoveFromParent(op);
      mlirBlockInsertOwnedOperationBefore(fb, q, op);
    }
    mlirOperationDestroy(q);
    // The outermost for moves into the new loop; the old one, now empty, goes.
    mlirOperationRemoveFromParent(fors[0]);
    mlirBlockInsertOwnedOperationBefore(nb, mlirBlockGetTerminator(nb), fors[0]);
    mlirOperationDestroy(par);
    par = np;
  }
  return NULL;
}

// Splits `func` into one function per top-level scf.parallel, named
// `<func>_k<i>`; each keeps the full argument list. `func` is erased. Returns the
// kernel functions in order in *out_funcs (malloc'ed).
static jit_status jit__split(MlirContext ctx, MlirModule module, MlirOperation func,
                             const char *name, MlirOperation **out_funcs,
                             uint32_t *out_n) {
  uint32_t n = 0;
  for (MlirOperation op = mlirBlockGetFirstOperation(jit__entry_block(func));
       !mlirOperationIsNull(op); op = mlirOperationGetNextInBlock(op))
    n += jit__op_is(op, "scf.parallel");
  MlirOperation *funcs = calloc(n ? n : 1, sizeof *funcs);
  if (!funcs) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
  MlirBlock mbody = mlirModuleGetBody(module);
  for (uint32_t k = 0; k < n; k++) {
    MlirOperation kf = mlirOperationClone(func);
    char kname[80];
    snprintf(kname, sizeof kname, "%s_k%u", name, k);
    mlirOperationSetAttributeByName(kf, jit__sr("sym_name"),
                                    mlirStringAttrGet(ctx, jit__sr(kname)));
    uint32_t i = 0;
    for (MlirOperation op = mlirBlockGetFirstOperation(jit__entry_block(kf)), next;
         !mlirOperationIsNull(op); op = next) {
      next = mlirOperationGetNextInBlock(op);
      if (jit__op_is(op, "scf.parallel") && i++ != k) mlirOperationDestroy(op);
    }
    mlirBlockInsertOwnedOperationBefore(mbody, func, kf);
    funcs[k] = kf;
  }
  mlirOperationDestroy(func);
  *out_funcs = funcs;
  *out_n = n;
  return NULL;
}

//===--- The launch plan from the host functions --------------------------===//

// The function argument a kernel operand is, looking through views that keep the
// base address (collapse/expand of dense buffers, casts).
static int jit__arg_index(MlirValue v, MlirBlock entry) {
  for (int depth = 0; depth < 16; depth++) {
    if (mlirValueIsABlockArgument(v)) {
      if (!mlirBlockEqual(mlirBlockArgumentGetOwner(v), entry)) return -1;
      return (int)mlirBlockArgumentGetArgNumber(v);
    }
    MlirOperation d = mlirOpResultGetOwner(v);
    if (jit__op_is(d, "memref.collapse_shape") || jit__op_is(d, "memref.expand_shape") ||
        jit__op_is(d, "memref.cast"))
      v = mlirOperationGetOperand(d, 0);
    else
      return -1;
  }
  return -1;
}

typedef struct jit__launch_walk {
  MlirOperation found;
  int count;
} jit__launch_walk;

static MlirWalkResult jit__launch_cb(MlirOperation op, void *user) {
  jit__launch_walk *w = user;
  if (jit__op_is(op, "gpu.launch_func")) {
    if (!w->count++) w->found = op;
  }
  return MlirWalkResultAdvance;
}

static jit_status jit__read_launch(MlirOperation kf, jit__gpu_kernel *k, jit__gx_builder *gx) {
  jit__launch_walk w = {{NULL}, 0};
  mlirOperationWalk(kf, jit__launch_cb, &w, MlirWalkPreOrder);
  if (w.count != 1)
    return JIT_ERR(JIT_INTERNAL, "expected one gpu.launch_func per kernel, found %d",
                   w.count);
  MlirOperation lf = w.found;
  MlirAttribute kattr = mlirOperationGetAttributeByName(lf, jit__sr("kernel"));
  MlirStringRef kn = mlirSymbolRefAttrGetLeafReference(kattr);
  if (kn.length >= sizeof k->entry)
    return JIT_ERR(JIT_INTERNAL, "kernel name too long");
  memcpy(k->entry, kn.data, kn.length);
  k->entry[kn.length] = 0;

  // Operand segments: async deps, grid x/y/z, block x/y/z, cluster x/y/z, dynamic
  // shared memory, kernel operands, async object.
  MlirAttribute seg = mlirOperationGetAttributeByName(lf, jit__sr("operandSegmentSizes"));
  if (mlirAttributeIsNull(seg) || !mlirAttributeIsADenseI32Array(seg) ||
      mlirDenseArrayGetNumElements(seg) != 13)
    return JIT_ERR(JIT_INTERNAL, "gpu.launch_func has an unexpected operand layout");
  int32_t s[13];
  for (int i = 0; i < 13; i++) s[i] = mlirDenseI32ArrayGetElement(seg, i);
  if (s[0] != 0 || s[7] || s[8] || s[9] || s[10])
    return JIT_ERR(JIT_INTERNAL, "gpu.launch_func with async/cluster/shared operands");
  int pos = 0;
  for (int i = 0; i < 6; i++) {
    bool ok = true;
    MlirValue opnd = mlirOperationGetOperand(lf, pos++);
    int64_t v = jit__const_index(opnd, &ok);
    if (!ok && gx && i < 3) {
      // A generic kernel's grid: computed per binding.
      gx->entry = jit__entry_block(kf);
      JIT_PROPAGATE(jit__gx_value(gx, opnd, &k->grid_expr[i]));
      k->grid[i] = 1;
      continue;
    }
    if (!ok || v < 1 || v > 0x7fffffff)
      return JIT_ERR(JIT_UNSUPPORTED, "kernel `%s`: launch size %d is not a constant in "
                     "range", k->entry, i);
    if (i < 3)
      k->grid[i] = (uint32_t)v;
    else
      k->block[i - 3] = (uint32_t)v;
  }
  if (k->grid[1] > 65535 || k->grid[2] > 65535)
    return JIT_ERR(JIT_UNSUPPORTED, "kernel `%s`: grid %ux%ux%u exceeds 65535 in y/z",
                   k->entry, k->grid[0], k->grid[1], k->grid[2]);
  k->n_args = (uint32_t)s[11];
  k->args = calloc(k->n_args ? k->n_args : 1, sizeof *k->args);
  if (!k->args) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
  MlirBlock entry = jit__entry_block(kf);
  for (uint32_t i = 0; i < k->n_args; i++) {
    MlirValue v = mlirOperationGetOperand(lf, 6 + i);
    int idx = mlirTypeIsAMemRef(mlirValueGetType(v)) ? jit__arg_index(v, entry) : -1;
    if (idx < 0)
      return JIT_ERR(JIT_UNSUPPORTED, "kernel `%s`: argument %u is not a graph buffer "
                     "(a constant or a strided view)", k->entry, i);
    k->args[i] = (uint32_t)idx;
  }
  return NULL;
}

// Moves every gpu.func into the first gpu.module and erases the host functions and the
// other gpu.modules: one device module per graph.
static jit_status jit__merge_modules(MlirModule module) {
  MlirBlock body = mlirModuleGetBody(module);
  MlirOperation first = jit__first_in_block(body, "gpu.module");
  if (mlirOperationIsNull(first)) return JIT_ERR(JIT_INTERNAL, "no gpu.module");
  MlirBlock fb = mlirRegionGetFirstBlock(mlirOperationGetRegion(first, 0));
  for (MlirOperation op = mlirBlockGetFirstOperation(body), next; !mlirOperationIsNull(op);
       op = next) {
    next = mlirOperationGetNextInBlock(op);
    if (jit__op_is(op, "func.func")) {
      mlirOperationDestroy(op);
    } else if (jit__op_is(op, "gpu.module") && !mlirOperationEqual(op, first)) {
      MlirBlock gb = mlirRegionGetFirstBlock(mlirOperationGetRegion(op, 0));
      for (MlirOperation f = mlirBlockGetFirstOperation(gb), fn; !mlirOperationIsNull(f);
           f = fn) {
        fn = mlirOperationGetNextInBlock(f);
        if (!jit__op_is(f, "gpu.func")) continue;
        mlirOperationRemoveFromParent(f);
        mlirBlockAppendOwnedOperation(fb, f);
      }
      mlirOperationDestroy(op);
    }
  }
  return NULL;
}

static void jit__pbuf_cb(MlirStringRef s, void *user) {
  jit__text_append(user, s.data, s.length);
}

// `op` as MLIR text into *out (malloc'ed).
static jit_status jit__print_op(MlirOperation op, char **out) {
  jit__text b = {0};
  mlirOperationPrint(op, jit__pbuf_cb, &b);
  if (b.oom || !b.p) {
    free(b.p);
    return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory printing the device module");
  }
  *out = b.p;
  return NULL;
}

//===--- Back halves -----------------------------------------------------===//

static bool jit__file_exists(const char *p) { return access(p, R_OK) == 0; }

// A CUDA toolkit directory holding libdevice, or NULL.
static const char *jit__find_toolkit(const char *given, char *buf, size_t size) {
  const char *cands[4] = {given, getenv("CUDA_HOME"), getenv("CUDA_PATH"),
                          "/usr/local/cuda"};
  for (int i = 0; i < 4; i++) {
    if (!cands[i] || !cands[i][0]) continue;
    snprintf(buf, size, "%s/nvvm/libdevice/libdevice.10.bc", cands[i]);
    if (jit__file_exists(buf)) return cands[i];
  }
  return NULL;
}

typedef struct jit__libcall_walk {
  char name[64];
  bool found;
} jit__libcall_walk;

static MlirWalkResult jit__libcall_cb(MlirOperation op, void *user) {
  jit__libcall_walk *w = user;
  if (!jit__op_is(op, "llvm.func")) return MlirWalkResultAdvance;
  MlirStringRef s = mlirStringAttrGetValue(
      mlirOperationGetAttributeByName(op, jit__sr("sym_name")));
  if (s.length > 5 && !memcmp(s.data, "__nv_", 5)) {
    size_t n = s.length < sizeof w->name - 1 ? s.length : sizeof w->name - 1;
    memcpy(w->name, s.data, n);
    w->name[n] = 0;
    w->found = true;
    return MlirWalkResultInterrupt;
  }
  return MlirWalkResultAdvance;
}

static jit_status jit__back_ptx(MlirContext ctx, MlirModule module,
                                const jit__gpu_target *t, int ptx, jit__diag *diag) {
  char pipe[1024];
  snprintf(pipe, sizeof pipe,
           "builtin.module(nvvm-attach-target{chip=%s features=+ptx%d O=3},"
           "gpu.module(lower-affine,convert-scf-to-cf,"
           "convert-gpu-to-nvvm{use-bare-ptr-memref-call-conv=1},canonicalize,cse,"
           "reconcile-unrealized-casts))",
           t->chip, ptx);
  JIT_PROPAGATE(jit__mlir_run_pipeline(ctx, module, pipe, diag, "lowering to NVVM"));
  char lib[1024];
  const char *tk = jit__find_toolkit(t->cuda_toolkit, lib, sizeof lib);
  jit__libcall_walk w = {{0}, false};
  mlirOperationWalk(mlirModuleGetOperation(module), jit__libcall_cb, &w, MlirWalkPreOrder);
  if (w.found && !tk)
    return JIT_ERR(JIT_UNAVAILABLE, "the kernels call `%s` from libdevice, but no CUDA "
                   "toolkit with nvvm/libdevice/libdevice.10.bc was found (set "
                   "CUDA_HOME)", w.name);
  if (tk)
    snprintf(pipe, sizeof pipe, "builtin.module(gpu-module-to-binary{format=isa "
             "toolkit=%s})", tk);
  else
    snprintf(pipe, sizeof pipe, "builtin.module(gpu-module-to-binary{format=isa})");
  return jit__mlir_run_pipeline(ctx, module, pipe, diag, "PTX generation");
}

static jit_status jit__back_spirv(MlirContext ctx, MlirModule module,
                                  const jit__gpu_target *t, const jit__gpu_plan *plan,
                                  jit__diag *diag) {
  // The workgroup size is part of each SPIR-V entry point.
  MlirOperation gm = jit__first_in_block(mlirModuleGetBody(module), "gpu.module");
  MlirBlock gb = mlirRegionGetFirstBlock(mlirOperationGetRegion(gm, 0));
  for (MlirOperation f = mlirBlockGetFirstOperation(gb); !mlirOperationIsNull(f);
       f = mlirOperationGetNextInBlock(f)) {
    if (!jit__op_is(f, "gpu.func")) continue;
    MlirStringRef name = mlirStringAttrGetValue(
        mlirOperationGetAttributeByName(f, jit__sr("sym_name")));
    const jit__gpu_kernel *k = NULL;
    for (uint32_t i = 0; i < plan->n_kernels; i++)
      if (strlen(plan->kernels[i].entry) == name.length &&
          !memcmp(plan->kernels[i].entry, name.data, name.length))
        k = &plan->kernels[i];
    if (!k) return JIT_ERR(JIT_INTERNAL, "gpu.func without a launch");
    char abi[128];
    snprintf(abi, sizeof abi, "#spirv.entry_point_abi<workgroup_size = [%u, %u, %u]>",
             k->block[0], k->block[1], k->block[2]);
    MlirAttribute a = mlirAttributeParseGet(ctx, jit__sr(abi));
    if (mlirAttributeIsNull(a)) return JIT_ERR(JIT_INTERNAL, "bad entry_point_abi: %s", diag->buf);
    mlirOperationSetAttributeByName(f, jit__sr("spirv.entry_point_abi"), a);
  }
  jit__gpu_attributions_to_allocs(ctx, gm);
  char pipe[1024];
  snprintf(pipe, sizeof pipe,
           "builtin.module(gpu.module(fold-memref-alias-ops,lower-affine),"
           "spirv-attach-target{ver=v1.%d caps=Shader%s%s "
           "exts=SPV_KHR_storage_buffer_storage_class%s client_api=Vulkan},"
           "gpu.module(gpu.func(convert-math-to-spirv)),convert-gpu-to-spirv,"
           "spirv.module(spirv-lower-abi-attrs,spirv-update-vce))",
           t->spirv_minor ? t->spirv_minor : 3,
           t->spirv_f16 ? ",Float16,StorageBuffer16BitAccess" : "",
           t->spirv_int64 ? ",Int64" : "",
           t->spirv_f16 ? ",SPV_KHR_16bit_storage" : "");
  JIT_PROPAGATE(jit__mlir_run_pipeline(ctx, module, pipe, diag, "lowering to SPIR-V"));
  // convert-gpu-to-spirv leaves the spirv.module beside the gpu.module;
  // gpu-module-to-binary serializes the one inside it.
  MlirBlock body = mlirModuleGetBody(module);
  MlirOperation sm = jit__first_in_block(body, "spirv.module");
  gm = jit__first_in_block(body, "gpu.module");
  if (mlirOperationIsNull(sm) || mlirOperationIsNull(gm))
    return JIT_ERR(JIT_INTERNAL, "convert-gpu-to-spirv made no spirv.module");
  gb = mlirRegionGetFirstBlock(mlirOperationGetRegion(gm, 0));
  mlirOperationRemoveFromParent(sm);
  mlirBlockInsertOwnedOperationBefore(gb, mlirBlockGetFirstOperation(gb), sm);
  return jit__mlir_run_pipeline(ctx, module, "builtin.module(gpu-module-to-binary)", diag,
                           "SPIR-V serialization");
}

static jit_status jit__take_binary(MlirModule module, jit__gpu_artifact *out) {
  MlirOperation bin = jit__first_in_block(mlirModuleGetBody(module), "gpu.binary");
  if (mlirOperationIsNull(bin)) return JIT_ERR(JIT_INTERNAL, "no gpu.binary produced");
  MlirAttribute objs = mlirOperationGetAttributeByName(bin, jit__sr("objects"));
  if (mlirAttributeIsNull(objs) || mlirArrayAttrGetNumElements(objs) != 1)
    return JIT_ERR(JIT_INTERNAL, "gpu.binary does not hold exactly one object");
  MlirAttribute obj = mlirArrayAttrGetElement(objs, 0);
  MlirStringRef bytes = mlirGPUObjectAttrGetObject(obj);
  out->binary = malloc(bytes.length ? bytes.length : 1);
  if (!out->binary) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
  memcpy(out->binary, bytes.data, bytes.length);
  out->binary_size = bytes.length;
  return NULL;
}

//===--- Entry -----------------------------------------------------------===//

// The generic kernel's steps between mapping and outlining: loops to gpu.launch, then
// in each kernel function the sizes its body reads from outside go through the SIZES
// buffer (gpu_generic.c), which becomes buffer `bufs->n`.
static jit_status jit__generic_launches(MlirContext ctx, MlirModule module,
                                       MlirOperation *kfuncs, uint32_t n_k, bool ptx,
                                       jit__gx_builder *gx, jit__bufinfo *bufs,
                                       jit__diag *diag) {
  JIT_PROPAGATE(jit__mlir_run_pipeline(
      ctx, module, "builtin.module(convert-parallel-loops-to-gpu,canonicalize,lower-affine,"
      "canonicalize,cse)", diag, "loops to GPU launches"));
  for (uint32_t k = 0; k < n_k; k++) {
    if (mlirBlockGetNumArguments(jit__entry_block(kfuncs[k])) != (intptr_t)bufs->n)
      return JIT_ERR(JIT_INTERNAL, "kernel %u: arguments and buffers differ", k);
    JIT_RETURN_IF_ERROR(jit__gx_sink(ctx, kfuncs[k], gx, ptx), "kernel %u", k);
  }
  return jit__buf_push(bufs, (jit__gpu_buffer){JIT__GPU_BUF_SIZES, 0,
                                               4 * JIT__GX_MAX_SIZES, {0, 0}});
}

// The buffers of the inputs and outputs: the function's first arguments after
// bufferization. With `gx`, a `?` dim makes the size a program of the binding.
static jit_status jit__io_buffers(const jit__lgraph *g, MlirOperation func,
                                  jit__gx_builder *gx, jit__bufinfo *bufs) {
  MlirBlock entry = jit__entry_block(func);
  uint32_t n = g->n_inputs + g->n_outputs;
  if (mlirBlockGetNumArguments(entry) < (intptr_t)n)
    return JIT_ERR(JIT_INTERNAL, "bufferized function has too few arguments");
  if (gx) {
    gx->entry = entry;
    gx->n_io = n;
  }
  for (uint32_t i = 0; i < n; i++) {
    bool in = i < g->n_inputs;
    const jit__node *nd = &g->nodes[in ? g->inputs[i] : g->outputs[i - g->n_inputs]];
    jit__gpu_buffer b = {in ? JIT__GPU_BUF_INPUT : JIT__GPU_BUF_OUTPUT,
                         in ? i : i - g->n_inputs, 0, {0, 0}};
    MlirType t = mlirValueGetType(mlirBlockGetArgument(entry, i));
    if (gx && !mlirShapedTypeHasStaticShape(t)) {
      JIT_PROPAGATE(jit__gx_check_buffer(t));
      JIT_PROPAGATE(jit__gx_bytes(gx, t, NULL, i, &b.bytes_expr));
    } else {
      uint64_t e = 1;
      for (int d = 0; d < nd->rank; d++) e *= (uint64_t)nd->dims[d];
      b.bytes = e * (uint64_t)jit__dtype_bytes(nd->dtype);
    }
    JIT_PROPAGATE(jit__buf_push(bufs, b));
  }
  return NULL;
}

static jit_status jit__compile_gpu_in(MlirContext ctx, const jit__lgraph *g,
                                      const char *func_name, const jit__gpu_target *t,
                                      int ptx, const char *text, jit__gx_builder *gx,
                                      jit__diag *diag, jit__gpu_artifact *out) {
  double t0 = jit__gpu_ms();
  MlirModule module = mlirModuleCreateParse(ctx, jit__sr(text));
  if (mlirModuleIsNull(module))
    return JIT_ERR(JIT_INTERNAL, "generated MLIR does not parse: %s", diag->buf);
  jit_status s = NULL;
  MlirOperation *kfuncs = NULL;
  uint32_t n_k = 0;
  jit__bufinfo bufs = {0, 0, NULL};

  s = jit__mlir_run_pipeline(ctx, module, kFrontPipeline, diag, "bufferization");
  if (s) goto done;
  MlirOperation func = jit__find_func(module, func_name);
  if (mlirOperationIsNull(func)) {
    s = JIT_ERR(JIT_INTERNAL, "function `%s` missing after bufferization", func_name);
    goto done;
  }
  if ((s = jit__io_buffers(g, func, gx, &bufs))) goto done;
  if ((s = jit__promote_allocs(ctx, func, &bufs, gx))) goto done;
  if ((s = jit__device_only(ctx, func))) goto done;
  for (MlirOperation op = mlirBlockGetFirstOperation(jit__entry_block(func)), next;
       !mlirOperationIsNull(op) && !s; op = next) {
    next = mlirOperationGetNextInBlock(op);
    if (jit__op_is(op, "scf.parallel")) s = jit__hoist_parallel(ctx, op);
  }
  if (s) goto done;
  if ((s = jit__split(ctx, module, func, func_name, &kfuncs, &n_k))) goto done;
  // Generic kernels are plain ones: the tiled kernels are planned from static sizes.
  bool plain = t->plain_kernels || gx;
  for (uint32_t k = 0; k < n_k && !s; k++) {
    jit__tiled_kind kind = JIT__TILED_NONE;
    if (!plain) s = jit__gpu_try_tiled(ctx, kfuncs[k], diag->buf, &kind);
    if (!s && kind != JIT__TILED_NONE) {
      out->n_tiled++;
    } else if (!s) {
      if (!plain) jit__gpu_acc_in_register(ctx, kfuncs[k]);
      s = jit__tile_and_map(ctx, kfuncs[k], diag);
    }
    if (s) s = jit__status_annotate(s, "kernel %u", k);
  }
  if (s) goto done;
  if (gx) {
    s = jit__generic_launches(ctx, module, kfuncs, n_k, t->format == JIT__GPU_PTX, gx, &bufs,
                              diag);
    if (!s)
      s = jit__mlir_run_pipeline(ctx, module, "builtin.module(gpu-kernel-outlining,"
                                 "canonicalize,cse)", diag, "kernel outlining");
  } else {
    s = jit__mlir_run_pipeline(ctx, module, kOutlinePipeline, diag, "kernel outlining");
  }
  if (s) goto done;

  out->plan.n_buffers = bufs.n;
  out->plan.buffers = bufs.v;
  bufs.v = NULL;
  out->plan.kernels = calloc(n_k ? n_k : 1, sizeof *out->plan.kernels);
  if (!out->plan.kernels) {
    s = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
    goto done;
  }
  out->plan.n_kernels = n_k;
  for (uint32_t k = 0; k < n_k && !s; k++) {
    s = jit__read_launch(kfuncs[k], &out->plan.kernels[k], gx);
    if (s) s = jit__status_annotate(s, "kernel %u", k);
  }
  if (s) goto done;
  if (gx) {  // the programs go with the plan
    out->plan.code = gx->code;
    out->plan.n_code = gx->n;
    out->plan.sizes = gx->sizes;
    out->plan.n_sizes = gx->n_sizes;
    memset(gx, 0, sizeof *gx);
  }
  if (n_k == 0) {
    // Nothing to compute (e.g. only empty tensors): an empty module and plan.
    out->ms_front = jit__gpu_ms() - t0;
    goto done;
  }
  if ((s = jit__merge_modules(module))) goto done;
  if (t->keep_ir && (s = jit__print_op(jit__first_in_block(mlirModuleGetBody(module), "gpu.module"),
                                       &out->ir)))
    goto done;
  double t1 = jit__gpu_ms();
  out->ms_front = t1 - t0;
  s = t->format == JIT__GPU_PTX ? jit__back_ptx(ctx, module, t, ptx, diag)
                                : jit__back_spirv(ctx, module, t, &out->plan, diag);
  if (!s) s = jit__take_binary(module, out);
  out->ms_back = jit__gpu_ms() - t1;

done:
  free(kfuncs);
  free(bufs.v);
  mlirModuleDestroy(module);
  return s;
}

// Checks, emits and compiles: the static kernel (`req` NULL) or the generic one.
static jit_status jit__compile_gpu_with(const jit__lgraph *graph,
                                        const int64_t (*req)[JIT_MAX_RANK],
                                        const char *func_name, const jit__gpu_target *target,
                                        jit__gpu_artifact *out) {
  if (!out) return JIT_ERR(JIT_INTERNAL, "jit__compile_gpu: NULL artifact");
  memset(out, 0, sizeof *out);
  if (!graph || !func_name || !target)
    return JIT_ERR(JIT_INTERNAL, "jit__compile_gpu: NULL argument");
  // Kernel entries are `<func>_k<i>_kernel` and must fit jit__gpu_kernel.entry.
  if (strlen(func_name) > 40)
    return JIT_ERR(JIT_INTERNAL, "kernel name `%s` too long", func_name);
  int ptx = 0;
  JIT_RETURN_IF_ERROR(jit__check_target(target, &ptx), "compiling `%s` for the GPU",
                      graph->name ? graph->name : func_name);
  if (target->format == JIT__GPU_SPIRV && !target->spirv_f16)
    for (uint32_t i = 0; i < graph->n_nodes; i++)
      if (graph->nodes[i].dtype == JIT__F16)
        return JIT_ERR(JIT_UNSUPPORTED, "compiling `%s` for Vulkan: f16 needs a device "
                       "with shaderFloat16 and 16-bit storage (target flag spirv_f16)",
                       graph->name ? graph->name : func_name);
  out->format = target->format;
  pthread_once(&jit__gpu_once, jit__gpu_init);

  char *text = NULL;
  jit__emit_options eo = {.symbolic = true, .destination = true, .reshape_req = req,
                          .fuse_elementwise = true, .distinct_empties = true};
  JIT_RETURN_IF_ERROR(req ? jit__emit_mlir_with(graph, func_name, &eo, &text)
                          : jit__emit_mlir(graph, func_name, &text),
                      "emitting MLIR");
  jit__diag diag = {{0}, 0, NULL};
  jit__gx_builder gx = {0};
  MlirContext ctx = jit__mlir_context_create(&diag);
  jit_status s = jit__compile_gpu_in(ctx, graph, func_name, target, ptx, text,
                                     req ? &gx : NULL, &diag, out);
  mlirContextDestroy(ctx);
  jit__gx_builder_release(&gx);
  free(text);
  if (!s) s = jit__gpu_make_images(target, out);
  if (s) {
    jit__gpu_artifact_release(out);
    s = jit__status_annotate(s, "compiling `%s`%s for %s",
                             graph->name ? graph->name : func_name, req ? " (generic)" : "",
                             target->format == JIT__GPU_PTX ? target->chip : "Vulkan");
  }
  return s;
}

jit_status jit__compile_gpu(const jit__lgraph *graph, const char *func_name,
                            const jit__gpu_target *target, jit__gpu_artifact *out) {
  return jit__compile_gpu_with(graph, NULL, func_name, target, out);
}

jit_status jit__compile_gpu_generic(const jit__lgraph *graph,
                                    const int64_t (*reshape_req)[JIT_MAX_RANK],
                                    const char *func_name, const jit__gpu_target *target,
                                    jit__gpu_artifact *out) {
  if (reshape_req || !graph)
    return jit__compile_gpu_with(graph, reshape_req, func_name, target, out);
  // No reshape asked for anything but the dims it has.
  int64_t(*req)[JIT_MAX_RANK] = calloc(graph->n_nodes + 1, sizeof *req);
  if (!req) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
  for (uint32_t i = 0; i < graph->n_nodes; i++)
    memcpy(req[i], graph->nodes[i].dims, sizeof req[i]);
  jit_status s = jit__compile_gpu_with(graph, (const int64_t(*)[JIT_MAX_RANK])req, func_name,
                                       target, out);
  free(req);
  return s;
}

//===--- Ownership -------------------------------------------------------===//

void jit__gpu_artifact_release(jit__gpu_artifact *a) {
  if (!a) return;
  free(a->binary);
  a->binary = NULL;
  free(a->ir);
  a->ir = NULL;
  a->binary_size = 0;
  free(a->cubin);
  a->cubin = NULL;
  a->cubin_size = 0;
  free(a->notes);
  a->notes = NULL;
  a->n_images = 0;
  jit__gpu_plan_release(&a->plan);
}
