//===--- test_cpu_rewrites.c - the CPU strategy's IR rewrites, directly ---===//
//
// The rewrites jit__cpu_split_k and jit__cpu_normalize make before planning, called on
// parsed modules with the options a 2-thread AVX-512 host would give. ASan builds run
// every kernel on one thread (devices/cpu/cpu.c), so there the graph tests never reach
// the K split: this runs its C (IR built from text, inline_text) under the sanitizers
// too. The rewritten module must verify and hold the expected ops. The lowering is
// internal (hidden in libjitml.so), so this executable compiles its sources itself.
//
//===----------------------------------------------------------------------===//
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mlir-c/IR.h>
#include <mlir-c/RegisterEverything.h>

#include "lowering/cpu_strategy.h"

typedef struct text_buf {
  char *p;
  size_t len;
} text_buf;

static void append(MlirStringRef s, void *user) {
  text_buf *b = user;
  char *q = realloc(b->p, b->len + s.length + 1);
  cr_assert(q);
  memcpy(q + b->len, s.data, s.length);
  b->len += s.length;
  q[b->len] = 0;
  b->p = q;
}

static MlirContext make_ctx(void) {
  MlirDialectRegistry registry = mlirDialectRegistryCreate();
  mlirRegisterAllDialects(registry);
  MlirContext ctx = mlirContextCreateWithRegistry(registry, false);
  mlirDialectRegistryDestroy(registry);
  return ctx;
}

static jit__lower_options options(int threads) {
  jit__lower_options o;
  memset(&o, 0, sizeof o);
  o.opt_level = 2;
  o.triple = "x86_64-unknown-linux-gnu";
  o.cpu = "skylake-avx512";
  o.features = "+avx2,+fma,+avx512f";
  o.l2_bytes = 2 << 20;
  o.num_threads = threads;
  return o;
}

// Parses `text`, runs `rewrite` (split_k when true, else normalize), and returns the
// printed module (malloc'ed) after checking that it verifies; *count: what split_k
// returned.
static char *rewrite(const char *text, bool split_k, int threads, int *count) {
  MlirContext ctx = make_ctx();
  MlirModule m = mlirModuleCreateParse(ctx, mlirStringRefCreateFromCString(text));
  cr_assert(!mlirModuleIsNull(m), "fixture does not parse");
  MlirOperation op = mlirModuleGetOperation(m);
  jit__lower_options o = options(threads);
  int n = 0;
  if (split_k) n = jit__cpu_split_k(ctx, op, &o);
  else jit__cpu_normalize(ctx, op, &o);
  if (count) *count = n;
  cr_expect(mlirOperationVerify(op), "the rewritten module does not verify");
  text_buf b = {NULL, 0};
  mlirOperationPrint(op, append, &b);
  mlirModuleDestroy(m);
  mlirContextDestroy(ctx);
  return b.p;
}

static char *matmul_text(int M, int K, int N, const char *ea, const char *eb) {
  char *t = malloc(2048);
  cr_assert(t);
  snprintf(t, 2048,
           "func.func @f(%%a: tensor<%dx%dx%s>, %%b: tensor<%dx%dx%s>) -> tensor<%dx%dxf32> {\n"
           "  %%z = arith.constant 0.0 : f32\n"
           "  %%e = tensor.empty() : tensor<%dx%dxf32>\n"
           "  %%c = linalg.fill ins(%%z : f32) outs(%%e : tensor<%dx%dxf32>) -> "
           "tensor<%dx%dxf32>\n"
           "  %%r = linalg.matmul ins(%%a, %%b : tensor<%dx%dx%s>, tensor<%dx%dx%s>) "
           "outs(%%c : tensor<%dx%dxf32>) -> tensor<%dx%dxf32>\n"
           "  return %%r : tensor<%dx%dxf32>\n}\n",
           M, K, ea, K, N, eb, M, N, M, N, M, N, M, N, M, K, ea, K, N, eb, M, N, M, N, M, N);
  return t;
}

// Small M at 2 threads: a batch_matmul of the two K halves and their sum, which
// verifies; f32 and f16, one row (A reshaped) and more (A's halves copied).
Test(cpu_rewrites, small_m_split_over_k) {
  static const struct {
    int M, K, N;
    const char *ea, *eb;
  } cases[] = {{1, 1024, 1024, "f32", "f32"}, {4, 768, 768, "f32", "f32"},
               {1, 1024, 2048, "f16", "f16"}, {5, 1024, 1024, "f32", "f16"},
               {3, 1000, 1100, "f32", "f32"}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char *text = matmul_text(cases[i].M, cases[i].K, cases[i].N, cases[i].ea, cases[i].eb);
    int n = 0;
    char *out = rewrite(text, true, 2, &n);
    cr_expect(n == 1, "%dx%dx%d: %d rewritten", cases[i].M, cases[i].K, cases[i].N, n);
    cr_expect(strstr(out, "linalg.batch_matmul") && !strstr(out, "linalg.matmul"),
              "%dx%dx%d: no batch of K halves:\n%s", cases[i].M, cases[i].K, cases[i].N, out);
    char want[64];
    snprintf(want, sizeof want, "tensor<2x%dx%dx%s>", cases[i].K / 2, cases[i].N, cases[i].eb);
    cr_expect(strstr(out, want), "%dx%dx%d: B's halves are not %s", cases[i].M, cases[i].K,
              cases[i].N, want);
    free(out);
    free(text);
  }
}

// Not on one thread, not with K odd, not for rows that are not small M.
Test(cpu_rewrites, split_k_leaves_others) {
  static const int cases[][4] = {{1, 1024, 1024, 1}, {1, 1023, 1024, 2}, {64, 1024, 1024, 2}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char *text = matmul_text(cases[i][0], cases[i][1], cases[i][2], "f32", "f32");
    int n = -1;
    char *out = rewrite(text, true, cases[i][3], &n);
    cr_expect(n == 0 && strstr(out, "linalg.matmul") && !strstr(out, "batch_matmul"),
              "%dx%dx%d threads=%d was rewritten", cases[i][0], cases[i][1], cases[i][2],
              cases[i][3]);
    free(out);
    free(text);
  }
}

static const char kBatchBt[] =
    "func.func @f(%a: tensor<12x128x64xf32>, %b: tensor<12x128x64xf32>) -> "
    "tensor<12x128x128xf32> {\n"
    "  %z = arith.constant 0.0 : f32\n"
    "  %e = tensor.empty() : tensor<12x128x128xf32>\n"
    "  %c = linalg.fill ins(%z : f32) outs(%e : tensor<12x128x128xf32>) -> "
    "tensor<12x128x128xf32>\n"
    "  %r = linalg.batch_matmul indexing_maps = [affine_map<(b, m, n, k) -> (b, m, k)>, "
    "affine_map<(b, m, n, k) -> (b, n, k)>, affine_map<(b, m, n, k) -> (b, m, n)>] "
    "ins(%a, %b : tensor<12x128x64xf32>, tensor<12x128x64xf32>) outs(%c : "
    "tensor<12x128x128xf32>) -> tensor<12x128x128xf32>\n"
    "  return %r : tensor<12x128x128xf32>\n}\n";

static const char kBatchTransposeOfK[] =
    "func.func @f(%a: tensor<12x8x256xf32>, %b: tensor<12x512x256xf32>) -> "
    "tensor<12x8x512xf32> {\n"
    "  %z = arith.constant 0.0 : f32\n"
    "  %te = tensor.empty() : tensor<12x256x512xf32>\n"
    "  %t = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d2, d1)>, "
    "affine_map<(d0, d1, d2) -> (d0, d1, d2)>], iterator_types = [\"parallel\", "
    "\"parallel\", \"parallel\"]} ins(%b : tensor<12x512x256xf32>) outs(%te : "
    "tensor<12x256x512xf32>) {\n"
    "  ^bb0(%x: f32, %y: f32):\n    linalg.yield %x : f32\n  } -> tensor<12x256x512xf32>\n"
    "  %e = tensor.empty() : tensor<12x8x512xf32>\n"
    "  %c = linalg.fill ins(%z : f32) outs(%e : tensor<12x8x512xf32>) -> "
    "tensor<12x8x512xf32>\n"
    "  %r = linalg.batch_matmul ins(%a, %t : tensor<12x8x256xf32>, tensor<12x256x512xf32>) "
    "outs(%c : tensor<12x8x512xf32>) -> tensor<12x8x512xf32>\n"
    "  return %r : tensor<12x8x512xf32>\n}\n";

// q K^T read through (b, n, k) with 128 rows and a short K: a transpose of K and a
// plain batch; a transpose of K feeding 8 rows with K = 256: the batch reads K as
// stored, the transpose gone.
Test(cpu_rewrites, batched_transposed_b_both_ways) {
  char *out = rewrite(kBatchBt, false, 1, NULL);
  cr_expect(strstr(out, "linalg.generic") && strstr(out, "tensor<12x64x128xf32>"),
            "no transpose of K:\n%s", out);
  // (b, m, n, k) -> (b, n, k), as printed.
  cr_expect(!strstr(out, "(d0, d1, d2, d3) -> (d0, d2, d3)"),
            "the batch still reads K through (b, n, k):\n%s", out);
  cr_log_info("%s", out);
  free(out);
  out = rewrite(kBatchTransposeOfK, false, 2, NULL);
  cr_expect(!strstr(out, "linalg.generic"), "the transpose of K is left:\n%s", out);
  cr_expect(strstr(out, "ins(%arg0, %arg1 : tensor<12x8x256xf32>, tensor<12x512x256xf32>)"),
            "the batch does not read K as stored:\n%s", out);
  free(out);
}

// A k loop over the `?`-wide tile of C, as tiling by k leaves it: the whole-tile
// extract_slice and insert_slice of the loop-carried tensor fold (2 ops), so that the
// accumulators can be hoisted; with the slice one column narrower than the loop's
// init (%m, not %n), nothing folds.
static const char kIterSlices[] =
    "func.func @f(%c: tensor<8x?xf32>, %n: index, %m: index, %k: index) -> tensor<8x?xf32> {\n"
    "  %c0 = arith.constant 0 : index\n"
    "  %c1 = arith.constant 1 : index\n"
    "  %init = tensor.extract_slice %c[0, 0] [8, %n] [1, 1] : tensor<8x?xf32> to tensor<8x?xf32>\n"
    "  %r = scf.for %i = %c0 to %k step %c1 iter_args(%a = %init) -> (tensor<8x?xf32>) {\n"
    "    %s = tensor.extract_slice %a[0, 0] [8, %SIZE] [1, 1] : tensor<8x?xf32> to tensor<8x?xf32>\n"
    "    %e = tensor.empty(%SIZE) : tensor<8x?xf32>\n"
    "    %w = linalg.copy ins(%s : tensor<8x?xf32>) outs(%e : tensor<8x?xf32>) -> tensor<8x?xf32>\n"
    "    %y = tensor.insert_slice %w into %a[0, 0] [8, %SIZE] [1, 1] : tensor<8x?xf32> into tensor<8x?xf32>\n"
    "    scf.yield %y : tensor<8x?xf32>\n"
    "  }\n"
    "  return %r : tensor<8x?xf32>\n"
    "}\n";

Test(cpu_rewrites, whole_slices_of_loop_tensors_fold) {
  for (int narrower = 0; narrower < 2; narrower++) {
    char text[2048];
    const char *size = narrower ? "m" : "n";
    // The template's %SIZE, written out.
    size_t o = 0;
    for (const char *p = kIterSlices; *p && o + 8 < sizeof text; p++) {
      if (!strncmp(p, "%SIZE", 5)) {
        o += (size_t)snprintf(text + o, sizeof text - o, "%%%s", size);
        p += 4;
      } else {
        text[o++] = *p;
      }
    }
    text[o] = 0;
    MlirContext ctx = make_ctx();
    MlirModule m = mlirModuleCreateParse(ctx, mlirStringRefCreateFromCString(text));
    cr_assert(!mlirModuleIsNull(m), "the test module does not parse:\n%s", text);
    MlirOperation op = mlirModuleGetOperation(m);
    int n = jit__cpu_fold_iter_slices(op);
    cr_expect(mlirOperationVerify(op), "the folded module does not verify");
    text_buf out = {0};
    mlirOperationPrint(op, append, &out);
    if (narrower) {
      cr_expect(n == 0, "a narrower slice folded (%d ops):\n%s", n, out.p);
    } else {
      cr_expect(n == 2, "%d ops folded, want 2:\n%s", n, out.p);
      cr_expect(!strstr(out.p, "tensor.insert_slice") &&
                    strstr(out.p, "ins(%arg5 : tensor<8x?xf32>)"),
                "the whole slices are still there:\n%s", out.p);
    }
    free(out.p);
    mlirModuleDestroy(m);
    mlirContextDestroy(ctx);
  }
}

// A masked register tile of a generic kernel after hoisting: two rows whose run-time
// count is %r, columns [0, %c). The selects that keep the masked-off lanes go when the
// loop's result is written with the same run-time box (2 selects); a write of more
// rows (%r2) or of other columns keeps them.
static const char kMaskedSteps[] =
    "func.func @f(%t: tensor<2x32xf32>, %a: vector<32xf32>, %b: vector<32xf32>, %r: index,"
    " %r2: index, %c: index, %k: index) -> tensor<2x32xf32> {\n"
    "  %c0 = arith.constant 0 : index\n"
    "  %c1 = arith.constant 1 : index\n"
    "  %cst = arith.constant 0.0 : f32\n"
    "  %m = vector.create_mask %c1, %r, %c : vector<1x2x32xi1>\n"
    "  %m0 = vector.extract %m[0, 0] : vector<32xi1> from vector<1x2x32xi1>\n"
    "  %m1 = vector.extract %m[0, 1] : vector<32xi1> from vector<1x2x32xi1>\n"
    "  %wm = vector.create_mask WROWS, WCOLS : vector<2x32xi1>\n"
    "  %init = vector.transfer_read %t[%c0, %c0], %cst, %wm {in_bounds = [true, true]} :"
    " tensor<2x32xf32>, vector<2x32xf32>\n"
    "  %acc = scf.for %i = %c0 to %k step %c1 iter_args(%v = %init) -> (vector<2x32xf32>) {\n"
    "    %v0 = vector.extract %v[0] : vector<32xf32> from vector<2x32xf32>\n"
    "    %f0 = vector.fma %a, %b, %v0 : vector<32xf32>\n"
    "    %s0 = arith.select %m0, %f0, %v0 : vector<32xi1>, vector<32xf32>\n"
    "    %v1 = vector.extract %v[1] : vector<32xf32> from vector<2x32xf32>\n"
    "    %f1 = vector.fma %a, %b, %v1 : vector<32xf32>\n"
    "    %s1 = arith.select %m1, %f1, %v1 : vector<32xi1>, vector<32xf32>\n"
    "    %z = arith.constant dense<0.0> : vector<2x32xf32>\n"
    "    %i0 = vector.insert %s0, %z [0] : vector<32xf32> into vector<2x32xf32>\n"
    "    %i1 = vector.insert %s1, %i0 [1] : vector<32xf32> into vector<2x32xf32>\n"
    "    scf.yield %i1 : vector<2x32xf32>\n"
    "  }\n"
    "  %w = vector.transfer_write %acc, %t[%c0, %c0], %wm {in_bounds = [true, true]} :"
    " vector<2x32xf32>, tensor<2x32xf32>\n"
    "  return %w : tensor<2x32xf32>\n"
    "}\n";

// kMaskedSteps with its write mask's rows and columns.
static char *masked_steps_text(const char *rows, const char *cols) {
  size_t cap = sizeof kMaskedSteps + 64;
  char *out = malloc(cap);
  cr_assert(out);
  const char *at = strstr(kMaskedSteps, "WROWS, WCOLS");
  cr_assert(at);
  snprintf(out, cap, "%.*s%s, %s%s", (int)(at - kMaskedSteps), kMaskedSteps, rows, cols,
           at + strlen("WROWS, WCOLS"));
  return out;
}

Test(cpu_rewrites, run_time_mask_selects_drop) {
  static const struct {
    const char *rows, *cols;
    int want;
  } cases[] = {{"%r", "%c", 2}, {"%r2", "%c", 0}, {"%r", "%k", 0}, {"%c1", "%c", 0}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char *text = masked_steps_text(cases[i].rows, cases[i].cols);
    MlirContext ctx = make_ctx();
    MlirModule m = mlirModuleCreateParse(ctx, mlirStringRefCreateFromCString(text));
    cr_assert(!mlirModuleIsNull(m), "the test module does not parse:\n%s", text);
    MlirOperation op = mlirModuleGetOperation(m);
    int n = jit__cpu_drop_mask_selects(op);
    cr_expect(n == cases[i].want, "write mask (%s, %s): %d selects dropped, want %d",
              cases[i].rows, cases[i].cols, n, cases[i].want);
    cr_expect(mlirOperationVerify(op), "write mask (%s, %s): the module does not verify",
              cases[i].rows, cases[i].cols);
    mlirModuleDestroy(m);
    mlirContextDestroy(ctx);
    free(text);
  }
}

// A product computed into a heap buffer and copied, through a view, into an output
// argument: SRC is what the copy reads, USE an extra use of the output before it,
// AFTER an op after it.
static const char kResultCopy[] =
    "func.func @f(%x: memref<64x12xf32>, %out: memref<1x64x3x4xf32>) {\n"
    "  %cst = arith.constant 1.0 : f32\n"
    "  %c0 = arith.constant 0 : index\n"
    "  %a = memref.alloc() {alignment = 64 : i64} : memref<64x12xf32>\n"
    "  linalg.fill ins(%cst : f32) outs(%a : memref<64x12xf32>)\n"
    "  %e = memref.expand_shape SRC [[0, 1], [2, 3]] output_shape [1, 64, 3, 4] :"
    " memref<64x12xf32> into memref<1x64x3x4xf32>\n"
    "  USE\n"
    "  memref.copy %e, %out : memref<1x64x3x4xf32> to memref<1x64x3x4xf32>\n"
    "  AFTER\n"
    "  return\n"
    "}\n";

static char *result_copy_text(const char *src, const char *use, const char *after) {
  size_t cap = sizeof kResultCopy + 256;
  char *out = malloc(cap);
  cr_assert(out);
  const char *s = strstr(kResultCopy, "SRC"), *u = strstr(kResultCopy, "USE"),
             *a = strstr(kResultCopy, "AFTER");
  cr_assert(s && u && a && s < u && u < a);
  snprintf(out, cap, "%.*s%s%.*s%s%.*s%s%s", (int)(s - kResultCopy), kResultCopy, src,
           (int)(u - s - 3), s + 3, use, (int)(a - u - 3), u + 3, after, a + 5);
  return out;
}

Test(cpu_rewrites, result_written_in_its_output) {
  static const struct {
    const char *src, *use, *after;
    int want;
  } cases[] = {
      {"%a", "", "", 1},
      {"%x", "", "", 0},  // not a buffer the kernel made
      {"%a", "%v = memref.load %out[%c0, %c0, %c0, %c0] : memref<1x64x3x4xf32>", "", 0},
      // An op after the copy writes the buffer: it must not land in the output.
      {"%a", "", "linalg.fill ins(%cst : f32) outs(%a : memref<64x12xf32>)", 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char *text = result_copy_text(cases[i].src, cases[i].use, cases[i].after);
    MlirContext ctx = make_ctx();
    MlirModule m = mlirModuleCreateParse(ctx, mlirStringRefCreateFromCString(text));
    cr_assert(!mlirModuleIsNull(m), "the test module does not parse:\n%s", text);
    MlirOperation op = mlirModuleGetOperation(m);
    int n = jit__cpu_results_in_place(ctx, op);
    cr_expect(n == cases[i].want, "case %zu: %d copies removed, want %d", i, n, cases[i].want);
    cr_expect(mlirOperationVerify(op), "case %zu: the module does not verify", i);
    text_buf b = {NULL, 0};
    mlirOperationPrint(op, append, &b);
    if (cases[i].want) {
      cr_expect(strstr(b.p, "memref.reinterpret_cast %arg1 to offset: [0], sizes: [64, 12], "
                            "strides: [12, 1]") && !strstr(b.p, "memref.copy") &&
                    !strstr(b.p, "memref.alloc"),
                "case %zu: the fill does not write the output:\n%s", i, b.p);
    } else {
      cr_expect(strstr(b.p, "memref.copy") != NULL, "case %zu: the copy went:\n%s", i, b.p);
    }
    free(b.p);
    mlirModuleDestroy(m);
    mlirContextDestroy(ctx);
    free(text);
  }
}

// Two loop nests for jit__cpu_share_loops: each reads A (and %w), computes with the
// constant CST (and ATTR on its first multiply), writes OUT; TAG is the inner loop's
// attribute dictionary. Identical ones become one private function called twice.
typedef struct nest {
  const char *a, *out, *cst, *attr, *tag;
} nest;

static void print_nest(char *buf, size_t cap, nest n) {
  const char *ta = strcmp(n.a, "%v") ? "memref<4x8xf32>"
                                     : "memref<4x8xf32, strided<[8, 1], offset: ?>>";
  const char *to = strcmp(n.out, "%v") ? "memref<4x8xf32>" : ta;
  snprintf(buf, cap,
           "  scf.for %%i = %%c0 to %%c4 step %%c1 {\n"
           "    scf.for %%j = %%c0 to %%c8 step %%c1 {\n"
           "      %%a = memref.load %s[%%i, %%j] : %s\n"
           "      %%b = memref.load %%w[%%j] : memref<8xf32>\n"
           "      %%m = arith.mulf %%a, %%b %s : f32\n"
           "      %%s = arith.addf %%m, %s : f32\n"
           "      %%t = arith.mulf %%s, %%s : f32\n"
           "      %%u = arith.subf %%t, %%a : f32\n"
           "      %%r = arith.maximumf %%u, %%b : f32\n"
           "      memref.store %%r, %s[%%i, %%j] : %s\n"
           "    } %s\n"
           "  }\n",
           n.a, ta, n.attr, n.cst, n.out, to, n.tag);
}

static char *share_text(nest n1, nest n2, bool in_if) {
  char l1[1024], l2[1024];
  print_nest(l1, sizeof l1, n1);
  print_nest(l2, sizeof l2, n2);
  char *t = malloc(4096);
  cr_assert(t);
  snprintf(t, 4096,
           "func.func @f(%%x: memref<4x8xf32>, %%y: memref<4x8xf32>, %%w: memref<8xf32>,\n"
           "             %%o0: memref<4x8xf32>, %%o1: memref<4x8xf32>,\n"
           "             %%v: memref<4x8xf32, strided<[8, 1], offset: ?>>, %%p: i1) {\n"
           "  %%c0 = arith.constant 0 : index\n"
           "  %%c1 = arith.constant 1 : index\n"
           "  %%c4 = arith.constant 4 : index\n"
           "  %%c8 = arith.constant 8 : index\n"
           "  %%two = arith.constant 2.0 : f32\n"
           "  %%two_b = arith.constant 2.0 : f32\n"
           "  %%three = arith.constant 3.0 : f32\n"
           "%s%s%s%s"
           "  return\n"
           "}\n",
           in_if ? "  scf.if %p {\n" : "", l1, l2, in_if ? "  }\n" : "");
  return t;
}

// Returns what jit__cpu_share_loops returned; *printed: the module after it.
static int share(const char *text, bool bare, char **printed) {
  MlirContext ctx = make_ctx();
  MlirModule m = mlirModuleCreateParse(ctx, mlirStringRefCreateFromCString(text));
  cr_assert(!mlirModuleIsNull(m), "the test module does not parse:\n%s", text);
  MlirOperation op = mlirModuleGetOperation(m);
  int n = jit__cpu_share_loops(ctx, op, "f", bare);
  cr_expect(mlirOperationVerify(op), "the module does not verify after sharing:\n%s",
            text);
  text_buf b = {NULL, 0};
  mlirOperationPrint(op, append, &b);
  *printed = b.p;
  mlirModuleDestroy(m);
  mlirContextDestroy(ctx);
  return n;
}

static size_t count_of(const char *hay, const char *needle) {
  size_t n = 0;
  for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle)) n++;
  return n;
}

Test(cpu_rewrites, identical_loop_nests_share_a_function) {
  const nest base = {"%x", "%o0", "%two", "", ""};
  static const struct {
    const char *what;
    nest second;
    bool bare, in_if;
    int want;
  } cases[] = {
      {"other buffers", {"%y", "%o1", "%two", "", ""}, true, false, 2},
      {"in an scf.if", {"%y", "%o1", "%two", "", ""}, true, true, 2},
      {"an equal constant", {"%y", "%o1", "%two_b", "", ""}, true, false, 2},
      {"other strategy tags", {"%y", "%o1", "%two", "", "{jit_f = 1 : i64}"}, true, false,
       2},
      {"another constant", {"%y", "%o1", "%three", "", ""}, true, false, 0},
      {"an attribute", {"%y", "%o1", "%two", "fastmath<fast>", ""}, true, false, 0},
      {"another discardable attribute", {"%y", "%o1", "%two", "", "{other = 1 : i64}"},
       true, false, 0},
      {"one buffer read and written", {"%o1", "%o1", "%two", "", ""}, true, false, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char *text = share_text(base, cases[i].second, cases[i].in_if);
    char *out = NULL;
    int n = share(text, cases[i].bare, &out);
    cr_expect(n == cases[i].want, "%s: %d nests shared, want %d", cases[i].what, n,
              cases[i].want);
    if (cases[i].want) {
      cr_expect(count_of(out, "func.func private @f_shared0(") == 1 &&
                    count_of(out, "call @f_shared0(") == 2 &&
                    count_of(out, "scf.for") == 2,
                "%s: not one function called twice:\n%s", cases[i].what, out);
      // The calls pass each nest's own buffers, the constant is cloned in.
      cr_expect(strstr(out, "call @f_shared0(%arg0, %arg2, %arg3)") &&
                    strstr(out, "call @f_shared0(%arg1, %arg2, %arg4)"),
                "%s: the calls do not pass each nest's buffers:\n%s", cases[i].what, out);
    } else {
      cr_expect(count_of(out, "call @") == 0 && count_of(out, "scf.for") == 4,
                "%s: changed:\n%s", cases[i].what, out);
    }
    free(out);
    free(text);
  }
}

// A view with a run-time offset cannot cross a call as a bare pointer (exact kernels):
// its nests stay; with whole descriptors (generic kernels) they share.
Test(cpu_rewrites, loop_nests_share_only_what_a_call_can_pass) {
  const nest a = {"%v", "%o0", "%two", "", ""}, b = {"%v", "%o1", "%two", "", ""};
  char *text = share_text(a, b, false), *out = NULL;
  cr_expect(share(text, true, &out) == 0, "bare pointers: shared:\n%s", out);
  free(out);
  cr_expect(share(text, false, &out) == 2, "descriptors: not shared:\n%s", out);
  free(out);
  free(text);
}

// A module that already holds the function name the first choice would take (imported
// MLIR may): the shared function takes the next free one.
Test(cpu_rewrites, shared_function_takes_a_free_name) {
  const nest a = {"%x", "%o0", "%two", "", ""}, b = {"%y", "%o1", "%two", "", ""};
  char *body = share_text(a, b, false), *out = NULL;
  size_t cap = strlen(body) + 64;
  char *text = malloc(cap);
  cr_assert(text);
  snprintf(text, cap, "func.func private @f_shared0(i32)\n%s", body);
  cr_expect(share(text, true, &out) == 2, "not shared:\n%s", out);
  cr_expect(count_of(out, "call @f_shared1(") == 2 &&
                count_of(out, "func.func private @f_shared1(") == 1,
            "not one new function called twice:\n%s", out);
  free(out);
  free(text);
  free(body);
}
