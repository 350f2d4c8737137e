//===--- dump.c - IR of every compile stage, on request --------------------===//
//
// With a dump directory (jit_options.dump_ir_dir or $JITML_DUMP_IR) each compile writes
// <dir>/<kernel>-<NN>-<stage>.<ext>, NN ordering the stages:
//   00-graph.mlir              the graph as emitted or imported (dims may be `?`)
//   01-specialized.mlir        one function on static tensors, destination-passing
//   02-fused.mlir              after elementwise fusion          (opt_level >= 1)
//   02-planned.mlir            the ops tagged for the plan       (exact kernels)
//   03-transform-script.mlir   the plan's transform script       (opt_level >= 1)
//   03-tiled-vectorized.mlir   after the matmul transform script (opt_level >= 1)
//   04-bufferized.mlir         on memrefs (at opt_level 0 after our matmul-to-loops pass)
//   05-llvm-dialect.mlir       the LLVM dialect
//   06-llvm.ll                 LLVM IR as translated, with the entry wrapper
//   07-llvm-optimized.ll       LLVM IR after LLVM's optimizations
// A dump that cannot be written is skipped: dumps never fail a compile. Files are
// written to a temporary name and renamed, so a reader never sees half a file.
//
//===----------------------------------------------------------------------===//
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lowering/import.h"

static FILE *jit__dump_open(const jit__lower_options *o, const char *kernel,
                            const char *stage, char *path, size_t path_size,
                            char *tmp, size_t tmp_size) {
  if (!o || !o->dump_dir || !o->dump_dir[0]) return NULL;
  int n = snprintf(path, path_size, "%s/%s-%s", o->dump_dir, kernel, stage);
  if (n < 0 || (size_t)n >= path_size) return NULL;
  n = snprintf(tmp, tmp_size, "%s.tmp%ld", path, (long)getpid());
  if (n < 0 || (size_t)n >= tmp_size) return NULL;
  return fopen(tmp, "w");
}

static void jit__dump_close(FILE *f, const char *path, const char *tmp) {
  bool ok = !ferror(f);
  ok = (fclose(f) == 0) && ok;
  if (!ok || rename(tmp, path) != 0) remove(tmp);
}

static void jit__dump_write(MlirStringRef s, void *user) {
  fwrite(s.data, 1, s.length, (FILE *)user);
}

void jit__dump_op(const jit__lower_options *options, const char *kernel,
                  const char *stage, MlirOperation op) {
  char path[1024], tmp[1100];
  FILE *f = jit__dump_open(options, kernel, stage, path, sizeof path, tmp, sizeof tmp);
  if (!f) return;
  // Print even invalid IR (a stage may have left it half converted): the generic form
  // is what a reader needs then, and the verifier would only refuse to print.
  MlirOpPrintingFlags flags = mlirOpPrintingFlagsCreate();
  mlirOpPrintingFlagsAssumeVerified(flags);
  mlirOperationPrintWithFlags(op, flags, jit__dump_write, f);
  mlirOpPrintingFlagsDestroy(flags);
  fputc('\n', f);
  jit__dump_close(f, path, tmp);
}

void jit__dump_text(const jit__lower_options *options, const char *kernel,
                    const char *stage, const char *text, size_t length) {
  char path[1024], tmp[1100];
  FILE *f = jit__dump_open(options, kernel, stage, path, sizeof path, tmp, sizeof tmp);
  if (!f) return;
  fwrite(text, 1, length, f);
  jit__dump_close(f, path, tmp);
}
