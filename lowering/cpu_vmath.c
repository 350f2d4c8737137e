//===--- cpu_vmath.c - exp as inline arithmetic, so it vectorizes ----------===//
//
// math.exp (and math.tanh, which math-expand-ops rewrites into exp) reaches LLVM as
// llvm.exp. Without a vector math library LLVM scalarizes a vector llvm.exp into one
// expf call per lane and will not vectorize a loop that calls it, which made gelu,
// sigmoid and softmax run at libm speed. Debian's MLIR 22 has no registered
// polynomial-approximation pass, so the rewrite is done here, on the LLVM IR, before
// O2: Cephes' expf (range reduction by ln 2 in two parts, degree-5 polynomial, 2^n
// built in the exponent bits), within 2 ulp of expf on its normal range. +inf, -inf,
// NaN and 0 are exact; results below ~1e-38 flush to 0.
// The other LLVM-IR rewrites of CPU kernels live here too: reassociable reduction adds,
// reciprocals of row sums, streaming stores and row prefetches, several vector
// reductions as one tree.
//
//===----------------------------------------------------------------------===//
#include <stdlib.h>
#include <string.h>

#include <llvm-c/Core.h>

#include "lowering/cpu_strategy.h"

typedef struct vm {
  LLVMModuleRef mod;
  LLVMContextRef ctx;
  LLVMBuilderRef b;
  LLVMTypeRef ty, ity;  // float or <n x float>; i32 or <n x i32>
  unsigned lanes;       // 0 for scalars
} vm;

static LLVMValueRef splat(vm *v, LLVMValueRef scalar) {
  if (!v->lanes) return scalar;
  LLVMValueRef *el = malloc(sizeof(LLVMValueRef) * v->lanes);
  if (!el) return NULL;
  for (unsigned i = 0; i < v->lanes; i++) el[i] = scalar;
  LLVMValueRef r = LLVMConstVector(el, v->lanes);
  free(el);
  return r;
}

static LLVMValueRef cf(vm *v, double x) {
  return splat(v, LLVMConstReal(LLVMFloatTypeInContext(v->ctx), x));
}

static LLVMValueRef ci(vm *v, long long x) {
  return splat(v, LLVMConstInt(LLVMInt32TypeInContext(v->ctx), (unsigned long long)x, 1));
}

static LLVMValueRef intrinsic(vm *v, const char *name, LLVMValueRef *args, unsigned n) {
  unsigned id = LLVMLookupIntrinsicID(name, strlen(name));
  LLVMValueRef fn = LLVMGetIntrinsicDeclaration(v->mod, id, &v->ty, 1);
  LLVMTypeRef fty = LLVMIntrinsicGetType(v->ctx, id, &v->ty, 1);
  return LLVMBuildCall2(v->b, fty, fn, args, n, "");
}

static LLVMValueRef fmuladd(vm *v, LLVMValueRef a, LLVMValueRef b, LLVMValueRef c) {
  LLVMValueRef args[3] = {a, b, c};
  return intrinsic(v, "llvm.fmuladd", args, 3);
}

static LLVMValueRef build_exp(vm *v, LLVMValueRef x) {
  LLVMBuilderRef b = v->b;
  // Clamp so that 2^n below stays within the exponent field: at the top n = 129 makes
  // 2^(n-1) +inf (as does n = 128 with y >= 1, rounding up at the last multiply), so
  // x > ~88.72 and +inf give +inf without a select; at the bottom n = -126 makes it 0.
  // A NaN passes both clamps (select on ordered compares) and every step after it.
  LLVMValueRef hi = cf(v, 89.5), lo = cf(v, -87.33654022216797);
  LLVMValueRef xc = LLVMBuildSelect(b, LLVMBuildFCmp(b, LLVMRealOGT, x, hi, ""), hi, x, "");
  xc = LLVMBuildSelect(b, LLVMBuildFCmp(b, LLVMRealOLT, xc, lo, ""), lo, xc, "");
  // n = round(x / ln 2) by adding 1.5 * 2^23 + 126: the sum's low mantissa bits are
  // n + 126, so no round and no float-to-int conversion (which is also poison for NaN in
  // LLVM IR). r = x - n ln 2 with ln 2 split so n * C1 is exact.
  LLVMValueRef magic = cf(v, 12582912.0 + 126.0);
  LLVMValueRef sum = fmuladd(v, xc, cf(v, 1.44269504088896341), magic);
  LLVMValueRef fx = LLVMBuildFSub(b, sum, magic, "");
  LLVMValueRef r = fmuladd(v, fx, cf(v, -0.693359375), xc);
  r = fmuladd(v, fx, cf(v, 2.12194440e-4), r);
  // 2 exp(r) = 2 + r (2 + r 2p(r)), Horner to the end (no r^2, no separate + 1), with
  // the doubling (see below) folded into Cephes' coefficients, where it is exact.
  static const double c[] = {1.9875691500E-4, 1.3981999507E-3, 8.3334519073E-3,
                             4.1665795894E-2, 1.6666665459E-1, 5.0000001201E-1, 1.0, 1.0};
  LLVMValueRef y = cf(v, 2 * c[0]);
  for (int i = 1; i < 8; i++) y = fmuladd(v, y, r, cf(v, 2 * c[i]));
  // 2^(n-1) * 2 exp(r), so n = 128 (x near the top of the range) stays finite when it
  // should. The sum's bits are 0x4B400000 + 126 + n, and 0x4B400000 << 23 wraps to 0:
  // the shift leaves (n - 1 + 127) << 23, the exponent field of 2^(n-1).
  LLVMValueRef bits = LLVMBuildShl(b, LLVMBuildBitCast(b, sum, v->ity, ""), ci(v, 23), "");
  return LLVMBuildFMul(b, y, LLVMBuildBitCast(b, bits, v->ty, ""), "");
}

static bool is_exp(LLVMValueRef inst, unsigned *lanes, bool *half) {
  if (!LLVMIsACallInst(inst)) return false;
  LLVMValueRef callee = LLVMGetCalledValue(inst);
  if (!callee || !LLVMIsAFunction(callee)) return false;
  size_t len = 0;
  const char *name = LLVMGetValueName2(callee, &len);
  if (len < 9 || strncmp(name, "llvm.exp.", 9) != 0) return false;
  LLVMTypeRef t = LLVMTypeOf(inst);
  *lanes = 0;
  if (LLVMGetTypeKind(t) == LLVMVectorTypeKind) {
    *lanes = LLVMGetVectorSize(t);
    t = LLVMGetElementType(t);
  }
  *half = LLVMGetTypeKind(t) == LLVMHalfTypeKind;
  return LLVMGetTypeKind(t) == LLVMFloatTypeKind || *half;
}

// Scalar reductions (sum, mean, softmax's denominator, batch-matmul inner products)
// reach LLVM as `acc = load p; acc' = fadd acc, x; store acc', p` inside a loop. LLVM
// promotes acc to a register but will not vectorize the loop: that would reorder the
// additions, which strict IEEE semantics forbid. Marking exactly those fadds
// `reassoc` lets it keep several partial sums in vector lanes. The order then differs
// from a left-to-right sum (within the tolerance of any f32 sum), but it is fixed by
// the code, so results are the same on every call and for every thread count.
// Same address: the same value, or GEPs / extractvalues / integer index arithmetic of
// the same operands (before O2 the load and the store each compute their own: a row
// sum kept as (M, 1) indexes its accumulator with its own `add row, 0` on each side).
static bool is_index_math(LLVMValueRef v) {
  if (!LLVMIsAInstruction(v)) return false;
  switch (LLVMGetInstructionOpcode(v)) {
    case LLVMAdd: case LLVMSub: case LLVMMul: case LLVMShl: case LLVMOr:
      return true;
    default:
      return false;
  }
}

static bool same_address(LLVMValueRef a, LLVMValueRef b, int depth) {
  if (a == b) return true;
  if (depth == 0) return false;
  bool gep = LLVMIsAGetElementPtrInst(a) && LLVMIsAGetElementPtrInst(b);
  bool ev = LLVMIsAExtractValueInst(a) && LLVMIsAExtractValueInst(b);
  bool math = is_index_math(a) && is_index_math(b) &&
              LLVMGetInstructionOpcode(a) == LLVMGetInstructionOpcode(b);
  if (!gep && !ev && !math) return false;
  if (gep && LLVMGetGEPSourceElementType(a) != LLVMGetGEPSourceElementType(b)) return false;
  int n = LLVMGetNumOperands(a);
  if (n != LLVMGetNumOperands(b)) return false;
  if (ev) {
    unsigned k = LLVMGetNumIndices(a);
    if (k != LLVMGetNumIndices(b) || memcmp(LLVMGetIndices(a), LLVMGetIndices(b),
                                            k * sizeof(unsigned)) != 0)
      return false;
  }
  for (int i = 0; i < n; i++)
    if (!same_address(LLVMGetOperand(a, (unsigned)i), LLVMGetOperand(b, (unsigned)i),
                      depth - 1))
      return false;
  return true;
}

static bool is_accumulate(LLVMValueRef inst) {
  if (LLVMGetInstructionOpcode(inst) != LLVMFAdd) return false;
  if (LLVMGetTypeKind(LLVMTypeOf(inst)) != LLVMFloatTypeKind) return false;
  LLVMValueRef next = LLVMGetNextInstruction(inst);
  for (int hops = 0; next && hops < 8; hops++, next = LLVMGetNextInstruction(next)) {
    if (!LLVMIsAStoreInst(next) || LLVMGetOperand(next, 0) != inst) continue;
    LLVMValueRef ptr = LLVMGetOperand(next, 1);
    for (int k = 0; k < 2; k++) {
      LLVMValueRef op = LLVMGetOperand(inst, (unsigned)k);
      if (LLVMIsALoadInst(op) && same_address(LLVMGetOperand(op, 0), ptr, 4)) return true;
    }
  }
  return false;
}

int jit__cpu_mark_reductions(LLVMModuleRef mod) {
  int count = 0;
  for (LLVMValueRef fn = LLVMGetFirstFunction(mod); fn; fn = LLVMGetNextFunction(fn))
    for (LLVMBasicBlockRef bb = LLVMGetFirstBasicBlock(fn); bb; bb = LLVMGetNextBasicBlock(bb))
      for (LLVMValueRef i = LLVMGetFirstInstruction(bb); i; i = LLVMGetNextInstruction(i))
        if (is_accumulate(i) && LLVMCanValueUseFastMathFlags(i)) {
          LLVMSetFastMathFlags(i, LLVMGetFastMathFlags(i) | LLVMFastMathAllowReassoc);
          count++;
        }
  return count;
}

int jit__cpu_expand_exp(LLVMModuleRef mod) {
  vm v = {mod, LLVMGetModuleContext(mod), NULL, NULL, NULL, 0};
  v.b = LLVMCreateBuilderInContext(v.ctx);
  int count = 0;
  for (LLVMValueRef fn = LLVMGetFirstFunction(mod); fn; fn = LLVMGetNextFunction(fn)) {
    for (LLVMBasicBlockRef bb = LLVMGetFirstBasicBlock(fn); bb;
         bb = LLVMGetNextBasicBlock(bb)) {
      LLVMValueRef inst = LLVMGetFirstInstruction(bb);
      while (inst) {
        LLVMValueRef next = LLVMGetNextInstruction(inst);
        unsigned lanes;
        bool half;
        if (is_exp(inst, &lanes, &half)) {
          v.lanes = lanes;
          LLVMTypeRef f = LLVMFloatTypeInContext(v.ctx), i = LLVMInt32TypeInContext(v.ctx);
          v.ty = lanes ? LLVMVectorType(f, lanes) : f;
          v.ity = lanes ? LLVMVectorType(i, lanes) : i;
          LLVMPositionBuilderBefore(v.b, inst);
          LLVMValueRef x = LLVMGetOperand(inst, 0);
          // f16 (imported f16 math, which stays f16): in f32, rounded once to f16, rather
          // than LLVM's libm call per lane (exp(x + y^T) 1024^2 f16: 2.1 ms -> 0.2).
          if (half) x = LLVMBuildFPExt(v.b, x, v.ty, "");
          LLVMValueRef r = build_exp(&v, x);
          if (half) r = LLVMBuildFPTrunc(v.b, r, LLVMTypeOf(inst), "");
          LLVMReplaceAllUsesWith(inst, r);
          LLVMInstructionEraseFromParent(inst);
          count++;
        }
        inst = next;
      }
    }
  }
  LLVMDisposeBuilder(v.b);
  // The intrinsics' declarations, now unused.
  for (LLVMValueRef fn = LLVMGetFirstFunction(mod); fn;) {
    LLVMValueRef next = LLVMGetNextFunction(fn);
    size_t len = 0;
    const char *name = LLVMGetValueName2(fn, &len);
    if (len > 9 && strncmp(name, "llvm.exp.", 9) == 0 && !LLVMGetFirstUse(fn))
      LLVMDeleteFunction(fn);
    fn = next;
  }
  return count;
}

// fdiv x, d on f32 vectors inside a loop, where d is computed outside the block (a
// row sum broadcast for softmax's division, a norm): x * r with r = 1 / d computed once
// where d is. A vector divide costs ~4-5 cycles of throughput against 0.5 for a
// multiply, which was a sixth of softmax's time. Two roundings instead of one: within
// 1.5 ulp of the division.
int jit__cpu_hoist_reciprocals(LLVMModuleRef mod) {
  vm v = {mod, LLVMGetModuleContext(mod), NULL, NULL, NULL, 0};
  v.b = LLVMCreateBuilderInContext(v.ctx);
  int count = 0;
  LLVMValueRef last_d = NULL, last_r = NULL;  // the unrolled copies share one reciprocal
  for (LLVMValueRef fn = LLVMGetFirstFunction(mod); fn; fn = LLVMGetNextFunction(fn))
    for (LLVMBasicBlockRef bb = LLVMGetFirstBasicBlock(fn); bb; bb = LLVMGetNextBasicBlock(bb)) {
      LLVMValueRef i = LLVMGetFirstInstruction(bb);
      while (i) {
        LLVMValueRef next = LLVMGetNextInstruction(i);
        LLVMTypeRef t = LLVMTypeOf(i);
        LLVMValueRef d = LLVMGetInstructionOpcode(i) == LLVMFDiv ? LLVMGetOperand(i, 1) : NULL;
        if (d && LLVMGetTypeKind(t) == LLVMVectorTypeKind &&
            LLVMGetTypeKind(LLVMGetElementType(t)) == LLVMFloatTypeKind &&
            LLVMIsAInstruction(d) && LLVMGetInstructionParent(d) != bb &&
            LLVMGetInstructionOpcode(d) != LLVMPHI) {
          // The reciprocal right after d (d dominates the division, so it does too).
          LLVMValueRef after = LLVMGetNextInstruction(d);
          if (after) {
            LLVMValueRef r = d == last_d ? last_r : NULL;
            if (!r) {
              LLVMPositionBuilderBefore(v.b, after);
              v.lanes = LLVMGetVectorSize(t);
              r = LLVMBuildFDiv(v.b, cf(&v, 1.0), d, "");
              last_d = d;
              last_r = r;
            }
            LLVMPositionBuilderBefore(v.b, i);
            LLVMValueRef m = LLVMBuildFMul(v.b, LLVMGetOperand(i, 0), r, "");
            LLVMReplaceAllUsesWith(i, m);
            LLVMInstructionEraseFromParent(i);
            count++;
          }
        }
        i = next;
      }
    }
  LLVMDisposeBuilder(v.b);
  return count;
}

//===--- Streaming stores and row prefetch --------------------------------===//

// Whether pointer `p` points into memory the caller passed in (a kernel argument, or a
// pointer loaded from the entry wrapper's argument array), on every path: not into a
// stack slot, a heap allocation or anything unknown. `seen` breaks the cycles of the
// loop-carried pointers (phi -> gep -> phi).
static bool caller_memory(LLVMValueRef p, LLVMValueRef *seen, int *n_seen, int depth) {
  if (depth > 32) return false;
  if (LLVMIsAArgument(p)) return true;
  if (!LLVMIsAInstruction(p)) return false;
  switch (LLVMGetInstructionOpcode(p)) {
    case LLVMGetElementPtr:
    case LLVMBitCast:
      return caller_memory(LLVMGetOperand(p, 0), seen, n_seen, depth + 1);
    case LLVMLoad:
      return LLVMGetTypeKind(LLVMTypeOf(p)) == LLVMPointerTypeKind;
    case LLVMSelect:
      return caller_memory(LLVMGetOperand(p, 1), seen, n_seen, depth + 1) &&
             caller_memory(LLVMGetOperand(p, 2), seen, n_seen, depth + 1);
    case LLVMPHI: {
      for (int k = 0; k < *n_seen; k++)
        if (seen[k] == p) return true;  // judged by its other incoming values
      if (*n_seen >= 64) return false;
      seen[(*n_seen)++] = p;
      for (unsigned k = 0; k < LLVMCountIncoming(p); k++)
        if (!caller_memory(LLVMGetIncomingValue(p, k), seen, n_seen, depth + 1))
          return false;
      return true;
    }
    default:
      return false;
  }
}

static bool is_caller_memory(LLVMValueRef p) {
  LLVMValueRef seen[64];
  int n_seen = 0;
  return caller_memory(p, seen, &n_seen, 0);
}

static bool is_vector(LLVMValueRef v) {
  return LLVMGetTypeKind(LLVMTypeOf(v)) == LLVMVectorTypeKind;
}

static LLVMValueRef i32c(LLVMContextRef ctx, int x) {
  return LLVMConstInt(LLVMInt32TypeInContext(ctx), (unsigned long long)x, 0);
}

// Vector stores to caller memory become non-temporal (x86 MOVNT*: written to memory
// without first reading the line in, which a plain store does: a third of a streaming
// kernel's traffic), with an SFENCE before each return of a function that made one, so
// the stores are ordered before whatever the caller or the OpenMP join does next.
// The output's alignment is unknown here, and the x86 backend splits a non-temporal
// store it cannot prove aligned into 8-byte MOVNTSDs (two instructions per 8 bytes).
// So each such store is versioned (version_aligned): one whole-vector MOVNTPS when the
// address turns out aligned at run time, which it is for every store of a row loop over
// an aligned output (jit_tensor_alloc, NumPy, PyTorch), else the 8-byte stores.

// Moves the instructions of `bb` before `at` (its PHIs included) into a new block
// placed before it, and has the predecessors of `bb` branch there instead. Returns the
// new block; `bb` keeps `at`, what follows it and its terminator, so the successors'
// PHIs still name the right block.
static LLVMBasicBlockRef split_before(LLVMContextRef ctx, LLVMBuilderRef b, LLVMValueRef fn,
                                      LLVMBasicBlockRef bb, LLVMValueRef at) {
  LLVMBasicBlockRef head = LLVMInsertBasicBlockInContext(ctx, bb, "");
  for (LLVMBasicBlockRef p = LLVMGetFirstBasicBlock(fn); p; p = LLVMGetNextBasicBlock(p)) {
    LLVMValueRef term = LLVMGetBasicBlockTerminator(p);
    if (!term || p == head) continue;
    for (unsigned k = 0; k < LLVMGetNumSuccessors(term); k++)
      if (LLVMGetSuccessor(term, k) == bb) LLVMSetSuccessor(term, k, head);
  }
  LLVMPositionBuilderAtEnd(b, head);
  for (LLVMValueRef i = LLVMGetFirstInstruction(bb); i && i != at;) {
    LLVMValueRef next = LLVMGetNextInstruction(i);
    LLVMInstructionRemoveFromParent(i);
    LLVMInsertIntoBuilder(b, i);
    i = next;
  }
  return head;
}

// store -> if (address % a == 0) { copy aligned to a } else { store }, for a vector
// store of a power of two bytes from 16 not known to be aligned, a being its size up to
// 64 (a wider store is split into a-byte ones). Returns whether it did.
static bool version_aligned(LLVMContextRef ctx, LLVMBuilderRef b, LLVMValueRef st) {
  LLVMTypeRef vty = LLVMTypeOf(LLVMGetOperand(st, 0));
  unsigned lanes = LLVMGetVectorSize(vty);
  LLVMTypeRef ety = LLVMGetElementType(vty);
  unsigned ebits = LLVMGetTypeKind(ety) == LLVMFloatTypeKind    ? 32
                   : LLVMGetTypeKind(ety) == LLVMDoubleTypeKind ? 64
                   : LLVMGetTypeKind(ety) == LLVMIntegerTypeKind ? LLVMGetIntTypeWidth(ety)
                                                                 : 0;
  unsigned size = lanes * ebits / 8, a = size < 64 ? size : 64;
  if (size < 16 || (size & (size - 1)) || LLVMGetAlignment(st) >= a) return false;
  LLVMBasicBlockRef bb = LLVMGetInstructionParent(st);
  LLVMValueRef fn = LLVMGetBasicBlockParent(bb);
  LLVMBasicBlockRef head = split_before(ctx, b, fn, bb, st);
  LLVMBasicBlockRef yes = LLVMInsertBasicBlockInContext(ctx, bb, "");
  LLVMBasicBlockRef no = LLVMInsertBasicBlockInContext(ctx, bb, "");
  LLVMTypeRef i64 = LLVMInt64TypeInContext(ctx);
  LLVMPositionBuilderAtEnd(b, head);
  LLVMValueRef addr = LLVMBuildPtrToInt(b, LLVMGetOperand(st, 1), i64, "");
  LLVMValueRef low = LLVMBuildAnd(b, addr, LLVMConstInt(i64, a - 1, 0), "");
  LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntEQ, low, LLVMConstInt(i64, 0, 0), ""), yes,
                  no);
  LLVMValueRef copy = LLVMInstructionClone(st);
  LLVMSetAlignment(copy, a);
  LLVMPositionBuilderAtEnd(b, yes);
  LLVMInsertIntoBuilder(b, copy);
  LLVMBuildBr(b, bb);
  LLVMInstructionRemoveFromParent(st);
  LLVMPositionBuilderAtEnd(b, no);
  LLVMInsertIntoBuilder(b, st);
  LLVMBuildBr(b, bb);
  return true;
}

static int stream_stores(LLVMModuleRef mod, LLVMBuilderRef b) {
  LLVMContextRef ctx = LLVMGetModuleContext(mod);
  unsigned kind = LLVMGetMDKindIDInContext(ctx, "nontemporal", 11);
  LLVMMetadataRef one = LLVMValueAsMetadata(i32c(ctx, 1));
  LLVMValueRef md = LLVMMetadataAsValue(ctx, LLVMMDNodeInContext2(ctx, &one, 1));
  int total = 0;
  LLVMValueRef *stores = NULL;  // this function's, to version
  int cap = 0;
  for (LLVMValueRef fn = LLVMGetFirstFunction(mod); fn; fn = LLVMGetNextFunction(fn)) {
    int count = 0, listed = 0;
    for (LLVMBasicBlockRef bb = LLVMGetFirstBasicBlock(fn); bb; bb = LLVMGetNextBasicBlock(bb))
      for (LLVMValueRef i = LLVMGetFirstInstruction(bb); i; i = LLVMGetNextInstruction(i))
        if (LLVMGetInstructionOpcode(i) == LLVMStore && is_vector(LLVMGetOperand(i, 0)) &&
            is_caller_memory(LLVMGetOperand(i, 1))) {
          LLVMSetMetadata(i, kind, md);
          count++;
          if (listed == cap) {
            int grown_cap = cap ? 2 * cap : 64;
            LLVMValueRef *grown = realloc(stores, sizeof *stores * (size_t)grown_cap);
            if (!grown) continue;  // not versioned: correct, only slower
            stores = grown;
            cap = grown_cap;
          }
          stores[listed++] = i;
        }
    if (!count) continue;
    // Versioned once all are found: the splits reorder the function's blocks.
    for (int k = 0; k < listed; k++) version_aligned(ctx, b, stores[k]);
    const char *name = "llvm.x86.sse.sfence";
    unsigned id = LLVMLookupIntrinsicID(name, strlen(name));
    LLVMValueRef sfence = LLVMGetIntrinsicDeclaration(mod, id, NULL, 0);
    LLVMTypeRef fty = LLVMIntrinsicGetType(ctx, id, NULL, 0);
    for (LLVMBasicBlockRef bb = LLVMGetFirstBasicBlock(fn); bb; bb = LLVMGetNextBasicBlock(bb)) {
      LLVMValueRef term = LLVMGetBasicBlockTerminator(bb);
      if (term && LLVMGetInstructionOpcode(term) == LLVMRet) {
        LLVMPositionBuilderBefore(b, term);
        LLVMBuildCall2(b, fty, sfence, NULL, 0, "");
      }
    }
    total += count;
  }
  free(stores);
  return total;
}

// Whether block `bb` loads vectors from caller memory.
static bool loads_caller_vectors(LLVMBasicBlockRef bb) {
  for (LLVMValueRef i = LLVMGetFirstInstruction(bb); i; i = LLVMGetNextInstruction(i))
    if (LLVMGetInstructionOpcode(i) == LLVMLoad && is_vector(i) &&
        is_caller_memory(LLVMGetOperand(i, 0)))
      return true;
  return false;
}

// In each function, the vector loads of caller memory in the second block that has
// any (a row kernel's second pass over its row: softmax's exp, a normalization's
// division or its variance), or in the first when there is one, also prefetch the
// same place `row_bytes` further, i.e. the next row. The first pass misses on this
// row while the hardware prefetcher runs along it, but that stops at the end of the
// row; the second pass reads the row from L1 and computes, and without these the
// memory would sit idle through it. 4096x1024, 1 thread, prefetching from the first
// pass -> from the second: softmax 1.87 -> 1.36 ms (2 threads 0.95 -> 0.68), a
// layernorm 1.46 -> 1.34, x / sum(x) 1.27 -> 1.18; better or the same at 16384x256,
// 1024x4096, 256x16384 and 64x65536. From the third pass (the layernorm's, with the
// streaming stores) no better than from the first.
static int prefetch_next_row(LLVMModuleRef mod, LLVMBuilderRef b, int64_t row_bytes) {
  LLVMContextRef ctx = LLVMGetModuleContext(mod);
  LLVMTypeRef i8 = LLVMInt8TypeInContext(ctx);
  LLVMTypeRef ptr = LLVMPointerTypeInContext(ctx, 0);
  const char *name = "llvm.prefetch";
  unsigned id = LLVMLookupIntrinsicID(name, strlen(name));
  LLVMValueRef fn_pf = LLVMGetIntrinsicDeclaration(mod, id, &ptr, 1);
  LLVMTypeRef fty = LLVMIntrinsicGetType(ctx, id, &ptr, 1);
  LLVMValueRef off = LLVMConstInt(LLVMInt64TypeInContext(ctx), (unsigned long long)row_bytes, 0);
  int total = 0;
  for (LLVMValueRef fn = LLVMGetFirstFunction(mod); fn; fn = LLVMGetNextFunction(fn)) {
    if (fn == fn_pf) continue;
    LLVMBasicBlockRef pass[2] = {NULL, NULL};
    for (LLVMBasicBlockRef bb = LLVMGetFirstBasicBlock(fn); bb && !pass[1];
         bb = LLVMGetNextBasicBlock(bb))
      if (loads_caller_vectors(bb)) pass[pass[0] != NULL] = bb;
    LLVMBasicBlockRef bb = pass[1] ? pass[1] : pass[0];
    if (!bb) continue;
    for (LLVMValueRef i = LLVMGetFirstInstruction(bb); i; i = LLVMGetNextInstruction(i)) {
      if (LLVMGetInstructionOpcode(i) != LLVMLoad || !is_vector(i) ||
          !is_caller_memory(LLVMGetOperand(i, 0)))
        continue;
      LLVMPositionBuilderBefore(b, i);
      LLVMValueRef p = LLVMGetOperand(i, 0);
      LLVMValueRef args[4] = {LLVMBuildGEP2(b, i8, p, &off, 1, ""), i32c(ctx, 0),
                              i32c(ctx, 3), i32c(ctx, 1)};
      LLVMBuildCall2(b, fty, fn_pf, args, 4, "");
      total++;
    }
  }
  return total;
}

int jit__cpu_stream_rows(LLVMModuleRef mod, bool stream, int64_t row_bytes) {
  LLVMBuilderRef b = LLVMCreateBuilderInContext(LLVMGetModuleContext(mod));
  int n = stream ? stream_stores(mod, b) : 0;
  if (row_bytes > 0) n += prefetch_next_row(mod, b, row_bytes);
  LLVMDisposeBuilder(b);
  return n;
}

// LLVM tunes its vectorizers for AVX-512 cores to 256-bit vectors (the Prefer256Bit
// tuning: 512-bit ones can lower the clock on older cores), so the elementwise and row
// loops it vectorizes itself, unlike the matmuls' 16-lane vectors from MLIR, ran at half
// the width. Softmax 4096x1024 is compute-bound at 1 thread (its exp): 2.55 ms at 8
// lanes, 2.15 ms at 16 (three runs each, also with the exp above; 2 threads 1.23 -> 1.03
// ms). Matmul kernels are left as they are: no difference within noise there.
int jit__cpu_prefer_wide_vectors(LLVMModuleRef mod) {
  LLVMContextRef ctx = LLVMGetModuleContext(mod);
  static const char key[] = "prefer-vector-width", val[] = "512";
  int n = 0;
  for (LLVMValueRef fn = LLVMGetFirstFunction(mod); fn; fn = LLVMGetNextFunction(fn)) {
    if (!LLVMCountBasicBlocks(fn)) continue;
    LLVMAddAttributeAtIndex(fn, LLVMAttributeFunctionIndex,
                            LLVMCreateStringAttribute(ctx, key, sizeof key - 1, val,
                                                      sizeof val - 1));
    n++;
  }
  return n;
}

//===--- Reductions of several vectors at once -----------------------------===//

// Whether `i` is a reassociable llvm.vector.reduce.fadd of an f32 vector; its lanes.
static unsigned reduce_fadd_lanes(LLVMValueRef i) {
  if (!LLVMIsACallInst(i) || !LLVMCanValueUseFastMathFlags(i) ||
      !(LLVMGetFastMathFlags(i) & LLVMFastMathAllowReassoc))
    return 0;
  LLVMValueRef fn = LLVMGetCalledValue(i);
  size_t len = 0;
  const char *name = fn ? LLVMGetValueName2(fn, &len) : NULL;
  if (!name || len < 22 || memcmp(name, "llvm.vector.reduce.fadd", 23) != 0) return 0;
  LLVMTypeRef t = LLVMTypeOf(LLVMGetOperand(i, 1));
  if (LLVMGetTypeKind(t) != LLVMVectorTypeKind ||
      LLVMGetTypeKind(LLVMGetElementType(t)) != LLVMFloatTypeKind)
    return 0;
  return LLVMGetVectorSize(t);
}

// shufflevector of x and y (or x alone when y is NULL) by `mask` (`n` lanes; -1: poison).
static LLVMValueRef shuffle(LLVMBuilderRef b, LLVMContextRef ctx, LLVMValueRef x,
                            LLVMValueRef y, const int *mask, unsigned n) {
  LLVMValueRef m[64];
  LLVMTypeRef i32 = LLVMInt32TypeInContext(ctx);
  for (unsigned l = 0; l < n; l++)
    m[l] = mask[l] < 0 ? LLVMGetPoison(i32) : LLVMConstInt(i32, (unsigned)mask[l], 0);
  if (!y) y = LLVMGetPoison(LLVMTypeOf(x));
  return LLVMBuildShuffleVector(b, x, y, LLVMConstVector(m, n), "");
}

// The n (a power of two, 2 <= n <= L) reductions `calls` of L-lane vectors as one tree:
// pairs of vectors are halved into one (the low halves of each group of lanes against
// the high halves, x's groups before y's) until one vector holds n groups of L/n lanes,
// whose groups are then halved in place to one lane each. About 3 shuffles and adds
// per sum against 8 for one 16-lane reduction alone. Reassociation is allowed there.
static void tree_reduce(LLVMBuilderRef b, LLVMContextRef ctx, LLVMValueRef *calls,
                        unsigned n, unsigned L) {
  LLVMValueRef last = calls[n - 1], v[64] = {NULL};
  LLVMPositionBuilderBefore(b, last);
  LLVMFastMathFlags fm = LLVMGetFastMathFlags(last);
  for (unsigned i = 0; i < n; i++) v[i] = LLVMGetOperand(calls[i], 1);
  int lo[64], hi[64];
  unsigned groups = 1, w = L;
  for (unsigned cnt = n; cnt > 1; cnt /= 2, groups *= 2, w /= 2) {
    unsigned l = 0;
    for (unsigned src = 0; src < 2; src++)
      for (unsigned g = 0; g < groups; g++)
        for (unsigned t = 0; t < w / 2; t++, l++) {
          lo[l] = (int)(src * L + g * w + t);
          hi[l] = (int)(src * L + g * w + w / 2 + t);
        }
    for (unsigned i = 0; i < cnt / 2; i++) {
      LLVMValueRef s = LLVMBuildFAdd(b, shuffle(b, ctx, v[2 * i], v[2 * i + 1], lo, L),
                                     shuffle(b, ctx, v[2 * i], v[2 * i + 1], hi, L), "");
      LLVMSetFastMathFlags(s, fm);
      v[i] = s;
    }
  }
  LLVMValueRef r = v[0];  // n groups of w lanes
  for (; w > 1; w /= 2) {
    for (unsigned l = 0; l < L; l++) lo[l] = hi[l] = -1;
    for (unsigned g = 0; g < n; g++)
      for (unsigned t = 0; t < w / 2; t++) {
        lo[g * (w / 2) + t] = (int)(g * w + t);
        hi[g * (w / 2) + t] = (int)(g * w + w / 2 + t);
      }
    r = LLVMBuildFAdd(b, shuffle(b, ctx, r, NULL, lo, L), shuffle(b, ctx, r, NULL, hi, L), "");
    LLVMSetFastMathFlags(r, fm);
  }
  LLVMTypeRef i64 = LLVMInt64TypeInContext(ctx);
  for (unsigned i = 0; i < n; i++) {
    LLVMValueRef sum = LLVMBuildExtractElement(b, r, LLVMConstInt(i64, i, 0), "");
    LLVMValueRef res = LLVMBuildFAdd(b, LLVMGetOperand(calls[i], 0), sum, "");
    LLVMSetFastMathFlags(res, fm);
    LLVMReplaceAllUsesWith(calls[i], res);
  }
  for (unsigned i = 0; i < n; i++) LLVMInstructionEraseFromParent(calls[i]);
}

// Tree-reduces the run `run[0..n)` in chunks of the largest powers of two (>= 2).
static int flush_run(LLVMBuilderRef b, LLVMContextRef ctx, LLVMValueRef *run, unsigned n,
                     unsigned L) {
  unsigned done = 0;
  while (n - done >= 2) {
    unsigned c = 1;
    while (c * 2 <= n - done) c *= 2;
    tree_reduce(b, ctx, run + done, c, L);
    done += c;
  }
  return (int)(done);
}

// Whether instruction `i` uses one of run[0..n).
static bool uses_any(LLVMValueRef i, LLVMValueRef *run, unsigned n) {
  for (int k = 0; k < LLVMGetNumOperands(i); k++)
    for (unsigned j = 0; j < n; j++)
      if (LLVMGetOperand(i, k) == run[j]) return true;
  return false;
}

int jit__cpu_tree_reductions(LLVMModuleRef mod) {
  LLVMContextRef ctx = LLVMGetModuleContext(mod);
  LLVMBuilderRef b = LLVMCreateBuilderInContext(ctx);
  int count = 0;
  for (LLVMValueRef fn = LLVMGetFirstFunction(mod); fn; fn = LLVMGetNextFunction(fn)) {
    for (LLVMBasicBlockRef bb = LLVMGetFirstBasicBlock(fn); bb;
         bb = LLVMGetNextBasicBlock(bb)) {
      // A run: reductions of one width in this block, none of them used yet.
      LLVMValueRef run[64];
      unsigned n = 0, L = 0;
      for (LLVMValueRef i = LLVMGetFirstInstruction(bb); i;) {
        LLVMValueRef next = LLVMGetNextInstruction(i);
        unsigned lanes = reduce_fadd_lanes(i);
        if (n && (uses_any(i, run, n) || (lanes && (lanes != L || n == L)))) {
          count += flush_run(b, ctx, run, n, L);
          n = 0;
        }
        if (lanes && lanes <= 64) {
          run[n++] = i;
          L = lanes;
        }
        i = next;
      }
      if (n) count += flush_run(b, ctx, run, n, L);
    }
  }
  LLVMDisposeBuilder(b);
  return count;
}
