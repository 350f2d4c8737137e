//===--- import_mlir.c - functions from MLIR text, specialized per binding --===//
//
// Import (once per graph): parse the user's text, check it (entry function, argument
// and result types, dialects), inline calls, canonicalize, and print the canonical
// form: entry renamed `jit_entry`, no locations, SSA names numbered by the printer. Its
// hash is the graph's identity, so the same function written with other value names,
// comments or locations hits the same kernels.
//
// Specialization (per binding): parse the located canonical text, give the entry's
// arguments the concrete static types, and refine: tosa-infer-shapes, canonicalize
// (tensor.dim of a static dim folds to a constant, tensor.empty and linalg ops take
// static shapes, tensor.cast chains fold), cse; the function's result types are then
// taken from what `return` gets, looking through tensor.cast. Any type still dynamic
// is an error naming the op (a later issue adds generic kernels for those). Then TOSA
// is lowered to linalg with the upstream passes, results become memref out-arguments
// written with bufferization.materialize_in_destination (the form emit_mlir.c writes),
// and the shared CPU stages (compile_cpu.c) take over.
//
//===----------------------------------------------------------------------===//
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <mlir-c/IR.h>
#include <mlir-c/Pass.h>
#include <mlir-c/Support.h>

#include "base/clock.h"
#include "base/text.h"
#include "lowering/import.h"

// The dialects an imported body may use (the contract); builtin for the module.
static const char *const kAllowedDialects[] = {"builtin", "func", "arith", "math",
                                               "tensor",  "linalg", "tosa"};


// Before the canonical form is printed: calls inlined, unused private functions gone.
static const char kImportPipeline[] =
    "builtin.module(inline,symbol-dce,canonicalize,cse)";
// Shape refinement for one binding.
static const char kRefinePipeline[] =
    "builtin.module(func.func(tosa-infer-shapes),canonicalize,cse)";
// TOSA to linalg/arith/tensor, as upstream's tosa-to-linalg pipeline orders it; then
// arith/math ops on whole tensors (`arith.addf %a, %b : tensor<5x4xf32>`) to
// linalg.generic, which bufferization and the CPU strategy understand.
static const char kTosaPipeline[] =
    "builtin.module(func.func(tosa-optional-decompositions,tosa-infer-shapes,"
    "tosa-make-broadcastable,tosa-to-linalg-named,tosa-to-linalg,tosa-to-arith,"
    "tosa-to-tensor,convert-elementwise-to-linalg),canonicalize,cse)";

//===--- Small helpers ---------------------------------------------------===//

static MlirStringRef jit__sr(const char *s) { return mlirStringRefCreateFromCString(s); }

static bool jit__sr_eq(MlirStringRef s, const char *c) {
  size_t n = strlen(c);
  return s.length == n && memcmp(s.data, c, n) == 0;
}

static bool jit__op_is(MlirOperation op, const char *name) {
  return jit__sr_eq(mlirIdentifierStr(mlirOperationGetName(op)), name);
}

static void jit__buf_append(MlirStringRef s, void *user) {
  jit__text_append(user, s.data, s.length);
}

// Prints `op` (generic=false, locations as asked) into a malloc'ed string.
static char *jit__print(MlirOperation op, bool locations) {
  jit__text b = {0};
  MlirOpPrintingFlags flags = mlirOpPrintingFlagsCreate();
  if (locations) mlirOpPrintingFlagsEnableDebugInfo(flags, true, /*prettyForm=*/false);
  mlirOperationPrintWithFlags(op, flags, jit__buf_append, &b);
  mlirOpPrintingFlagsDestroy(flags);
  if (b.oom || !b.p) {
    free(b.p);
    return NULL;
  }
  return b.p;
}

// "file:line:col" of `op` into `out` (the diag's file for parsed text), or "".
static const char *jit__where(MlirOperation op, const jit__diag *diag, char *out,
                              size_t size) {
  out[0] = 0;
  MlirLocation loc = mlirOperationGetLocation(op);
  for (int depth = 0; depth < 8; depth++) {
    if (mlirLocationIsAName(loc)) {
      loc = mlirLocationNameGetChildLoc(loc);
    } else if (mlirLocationIsACallSite(loc)) {
      loc = mlirLocationCallSiteGetCallee(loc);
    } else if (mlirLocationIsAFused(loc) && mlirLocationFusedGetNumLocations(loc) > 0 &&
               mlirLocationFusedGetNumLocations(loc) <= 16) {
      MlirLocation locs[16];
      mlirLocationFusedGetLocations(loc, locs);
      loc = locs[0];
    } else {
      break;
    }
  }
  if (!mlirLocationIsAFileLineColRange(loc)) return out;
  MlirStringRef f = mlirIdentifierStr(mlirLocationFileLineColRangeGetFilename(loc));
  const char *dflt = diag && diag->file ? diag->file : "<input>";
  if (f.length == 0 || (f.length == 1 && f.data[0] == '-'))
    snprintf(out, size, "%s:%d:%d: ", dflt, mlirLocationFileLineColRangeGetStartLine(loc),
             mlirLocationFileLineColRangeGetStartColumn(loc));
  else
    snprintf(out, size, "%.*s:%d:%d: ", (int)f.length, f.data,
             mlirLocationFileLineColRangeGetStartLine(loc),
             mlirLocationFileLineColRangeGetStartColumn(loc));
  return out;
}

static void jit__type_str(MlirType t, char *out, size_t size) {
  jit__text b = {0};
  mlirTypePrint(t, jit__buf_append, &b);
  snprintf(out, size, "%s", b.p ? b.p : "?");
  free(b.p);
}

// Element types of arguments and results: the floats, and the signless integers that
// graphs take (gather's indices, int8 matmul inputs, integer casts).
static bool jit__elem_dtype(MlirType elt, jit__dtype *out) {
  if (mlirTypeIsAF32(elt)) *out = JIT__F32;
  else if (mlirTypeIsAF16(elt)) *out = JIT__F16;
  else if (mlirTypeIsABF16(elt)) *out = JIT__BF16;
  else if (mlirTypeIsAInteger(elt) && mlirIntegerTypeIsSignless(elt) &&
           mlirIntegerTypeGetWidth(elt) == 8)
    *out = JIT__I8;
  else if (mlirTypeIsAInteger(elt) && mlirIntegerTypeIsSignless(elt) &&
           mlirIntegerTypeGetWidth(elt) == 32)
    *out = JIT__I32;
  else if (mlirTypeIsAInteger(elt) && mlirIntegerTypeIsSignless(elt) &&
           mlirIntegerTypeGetWidth(elt) == 64)
    *out = JIT__I64;
  else return false;
  return true;
}

// The func.func ops directly in the module's body.
static MlirOperation jit__find_func(MlirModule module, const char *name) {
  for (MlirOperation op = mlirBlockGetFirstOperation(mlirModuleGetBody(module));
       !mlirOperationIsNull(op); op = mlirOperationGetNextInBlock(op)) {
    if (!jit__op_is(op, "func.func")) continue;
    MlirAttribute sym = mlirOperationGetAttributeByName(op, mlirSymbolTableGetSymbolAttributeName());
    if (!mlirAttributeIsNull(sym) && jit__sr_eq(mlirStringAttrGetValue(sym), name)) return op;
  }
  return (MlirOperation){NULL};
}

static bool jit__is_public(MlirOperation fn) {
  MlirAttribute vis = mlirOperationGetAttributeByName(
      fn, mlirSymbolTableGetVisibilityAttributeName());
  return mlirAttributeIsNull(vis) || jit__sr_eq(mlirStringAttrGetValue(vis), "public");
}

static MlirType jit__func_type(MlirOperation fn) {
  return mlirTypeAttrGetValue(mlirOperationGetAttributeByName(fn, jit__sr("function_type")));
}

static void jit__set_func_type(MlirContext ctx, MlirOperation fn, intptr_t n_in,
                               const MlirType *in, intptr_t n_out, const MlirType *out) {
  MlirType ft = mlirFunctionTypeGet(ctx, n_in, in, n_out, out);
  mlirOperationSetAttributeByName(fn, jit__sr("function_type"), mlirTypeAttrGet(ft));
}

static MlirBlock jit__func_body(MlirOperation fn) {
  return mlirRegionGetFirstBlock(mlirOperationGetRegion(fn, 0));
}

static MlirOperation jit__terminator(MlirBlock b) { return mlirBlockGetTerminator(b); }

//===--- Checks ----------------------------------------------------------===//

typedef struct jit__dialect_walk {
  const jit__diag *diag;
  jit_status status;
  uint64_t n_ops;
} jit__dialect_walk;

static MlirWalkResult jit__check_dialect(MlirOperation op, void *user) {
  jit__dialect_walk *w = user;
  if (++w->n_ops > JIT_MAX_NODES) {
    w->status = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "the module has more than %d operations "
                        "(JIT_MAX_NODES)", JIT_MAX_NODES);
    return MlirWalkResultInterrupt;
  }
  MlirStringRef name = mlirIdentifierStr(mlirOperationGetName(op));
  size_t dot = 0;
  while (dot < name.length && name.data[dot] != '.') dot++;
  bool ok = false;
  for (size_t i = 0; i < sizeof kAllowedDialects / sizeof *kAllowedDialects && !ok; i++)
    ok = strlen(kAllowedDialects[i]) == dot && !memcmp(kAllowedDialects[i], name.data, dot);
  char where[512];
  if (!ok) {
    w->status = JIT_ERR(JIT_UNSUPPORTED,
                        "%sop `%.*s` (dialect `%.*s`) is not supported: graphs from MLIR "
                        "may use the func, arith, math, tensor, linalg and tosa dialects",
                        jit__where(op, w->diag, where, sizeof where), (int)name.length,
                        name.data, (int)dot, name.data);
    return MlirWalkResultInterrupt;
  }
  if (jit__op_is(op, "func.func") &&
      mlirRegionIsNull(mlirOperationGetRegion(op, 0)) == false &&
      mlirBlockIsNull(jit__func_body(op))) {
    MlirAttribute sym = mlirOperationGetAttributeByName(op, mlirSymbolTableGetSymbolAttributeName());
    MlirStringRef s = mlirStringAttrGetValue(sym);
    w->status = JIT_ERR(JIT_UNSUPPORTED,
                        "%sfunction `%.*s` is only declared: external functions are not "
                        "supported, every function needs a body",
                        jit__where(op, w->diag, where, sizeof where), (int)s.length, s.data);
    return MlirWalkResultInterrupt;
  }
  return MlirWalkResultAdvance;
}

//===--- Argument names from the text ------------------------------------===//

// The SSA names of the entry's arguments as written (MLIR keeps no names): scans the
// text from the func op's location for the argument list and takes each `%name` at
// its top level. Leaves names empty where the scan fails.
static void jit__scan_arg_names(const char *text, size_t n, MlirOperation fn,
                                jit__mlir_module *m) {
  MlirLocation loc = mlirOperationGetLocation(fn);
  if (!mlirLocationIsAFileLineColRange(loc)) return;
  int line = mlirLocationFileLineColRangeGetStartLine(loc);
  int col = mlirLocationFileLineColRangeGetStartColumn(loc);
  size_t i = 0;
  for (int l = 1; l < line && i < n; i++)
    if (text[i] == '\n') l++;
  i += (size_t)(col > 0 ? col - 1 : 0);
  // To the '@' of the name, then past the name to '('.
  while (i < n && text[i] != '@') i++;
  if (i < n && text[i + 1 < n ? i + 1 : i] == '"') {
    for (i += 2; i < n && text[i] != '"'; i++) {}
  }
  while (i < n && text[i] != '(') i++;
  if (i >= n) return;
  int depth = 0;
  uint32_t a = 0;
  for (; i < n; i++) {
    char c = text[i];
    if (c == '"') {
      for (i++; i < n && text[i] != '"'; i++)
        if (text[i] == '\\') i++;
    } else if (c == '(' || c == '[' || c == '{' || c == '<') {
      depth++;
    } else if (c == ')' || c == ']' || c == '}' || (c == '>' && text[i - 1] != '-')) {
      if (--depth == 0) break;
    } else if (c == '%' && depth == 1) {
      size_t s = ++i;
      while (i < n && (isalnum((unsigned char)text[i]) || text[i] == '_' ||
                       text[i] == '$' || text[i] == '.' || text[i] == '-'))
        i++;
      if (a < m->n_args && i > s)
        snprintf(m->args[a].name, sizeof m->args[a].name, "%.*s", (int)(i - s), text + s);
      a++;
      i--;
    }
  }
  if (a != m->n_args)
    for (uint32_t k = 0; k < m->n_args; k++) m->args[k].name[0] = 0;
}

//===--- Canonical constant order ----------------------------------------===//

// Canonicalization hoists constants to the top of the function in the order it met
// them, so the same function written in another order prints differently. Sorting
// them by their printed form (they have no operands, so any order is valid) removes
// that noise from the canonical text.
typedef struct jit__const_op {
  MlirOperation op;
  char *text;
} jit__const_op;

static int jit__const_cmp(const void *a, const void *b) {
  const jit__const_op *x = a, *y = b;
  return strcmp(x->text ? x->text : "", y->text ? y->text : "");
}

static bool jit__is_constant(MlirOperation op) {
  return mlirOperationGetNumOperands(op) == 0 && mlirOperationGetNumRegions(op) == 0 &&
         (jit__op_is(op, "arith.constant") || jit__op_is(op, "tosa.const") ||
          jit__op_is(op, "tosa.const_shape"));
}

static void jit__sort_constants(MlirOperation fn) {
  MlirBlock body = jit__func_body(fn);
  size_t n = 0;
  for (MlirOperation op = mlirBlockGetFirstOperation(body); !mlirOperationIsNull(op);
       op = mlirOperationGetNextInBlock(op))
    n += jit__is_constant(op);
  if (n < 2) return;
  jit__const_op *ops = calloc(n, sizeof(*ops));
  if (!ops) return;  // unsorted: still correct, only less sharing
  size_t k = 0;
  MlirOpPrintingFlags flags = mlirOpPrintingFlagsCreate();
  mlirOpPrintingFlagsUseLocalScope(flags);
  for (MlirOperation op = mlirBlockGetFirstOperation(body); !mlirOperationIsNull(op);
       op = mlirOperationGetNextInBlock(op)) {
    if (!jit__is_constant(op)) continue;
    jit__text b = {0};
    mlirOperationPrintWithFlags(op, flags, jit__buf_append, &b);
    ops[k].op = op;
    ops[k++].text = b.p;
  }
  mlirOpPrintingFlagsDestroy(flags);
  qsort(ops, n, sizeof(*ops), jit__const_cmp);
  // Everything before the first non-constant op is a constant and moves, so they end
  // up in sorted order in front of it.
  MlirOperation anchor = mlirBlockGetFirstOperation(body);
  while (!mlirOperationIsNull(anchor) && jit__is_constant(anchor))
    anchor = mlirOperationGetNextInBlock(anchor);
  for (size_t i = 0; i < n && !mlirOperationIsNull(anchor); i++)
    mlirOperationMoveBefore(ops[i].op, anchor);
  for (size_t i = 0; i < n; i++) free(ops[i].text);
  free(ops);
}

//===--- Import ----------------------------------------------------------===//

static jit_status jit__read_args(MlirOperation fn, const jit__diag *diag,
                                 jit__mlir_module *m) {
  MlirType ft = jit__func_type(fn);
  MlirAttribute arg_attrs = mlirOperationGetAttributeByName(fn, jit__sr("arg_attrs"));
  for (uint32_t i = 0; i < m->n_args; i++) {
    jit__mlir_arg *a = &m->args[i];
    MlirType t = mlirFunctionTypeGetInput(ft, i);
    char ts[128];
    jit__type_str(t, ts, sizeof ts);
    if (!mlirTypeIsARankedTensor(t))
      return JIT_ERR(JIT_INVALID_ARGUMENT,
                     "function `%s`: argument %u `%%%s` has type %s; every argument must "
                     "be a ranked tensor (tensor<...xf32> or f16)",
                     m->entry, i, a->name, ts);
    if (!jit__elem_dtype(mlirShapedTypeGetElementType(t), &a->dtype))
      return JIT_ERR(JIT_UNSUPPORTED,
                     "function `%s`: argument %u `%%%s` has type %s; only f32, f16, bf16, "
                     "i8, i32 and i64 elements are supported",
                     m->entry, i, a->name, ts);
    a->rank = (int)mlirShapedTypeGetRank(t);
    if (a->rank > JIT_MAX_RANK)
      return JIT_ERR(JIT_UNSUPPORTED, "function `%s`: argument %u `%%%s` has rank %d > %d",
                     m->entry, i, a->name, a->rank, JIT_MAX_RANK);
    for (int d = 0; d < a->rank; d++)
      a->dims[d] = mlirShapedTypeIsDynamicDim(t, d) ? -1 : mlirShapedTypeGetDimSize(t, d);

    MlirAttribute dict = {NULL};
    if (!mlirAttributeIsNull(arg_attrs) && mlirAttributeIsAArray(arg_attrs) &&
        (intptr_t)i < mlirArrayAttrGetNumElements(arg_attrs))
      dict = mlirArrayAttrGetElement(arg_attrs, i);
    MlirAttribute names = {NULL};
    if (!mlirAttributeIsNull(dict) && mlirAttributeIsADictionary(dict))
      names = mlirDictionaryAttrGetElementByName(dict, jit__sr("jit.dims"));
    if (mlirAttributeIsNull(names)) continue;
    if (!mlirAttributeIsAArray(names) || mlirArrayAttrGetNumElements(names) != a->rank)
      return JIT_ERR(JIT_INVALID_ARGUMENT,
                     "function `%s`: argument %u `%%%s`: `jit.dims` must be an array of "
                     "%d names or sizes, one per dim of %s",
                     m->entry, i, a->name, a->rank, ts);
    for (int d = 0; d < a->rank; d++) {
      MlirAttribute e = mlirArrayAttrGetElement(names, d);
      if (mlirAttributeIsAInteger(e)) {
        int64_t v = mlirIntegerAttrGetValueInt(e);
        if (v < 0 || (a->dims[d] >= 0 && a->dims[d] != v))
          return JIT_ERR(JIT_INVALID_ARGUMENT,
                         "function `%s`: argument %u `%%%s`: `jit.dims` gives dim %d the "
                         "size %lld but its type %s says otherwise",
                         m->entry, i, a->name, d, (long long)v, ts);
        a->dims[d] = v;
        continue;
      }
      if (!mlirAttributeIsAString(e))
        return JIT_ERR(JIT_INVALID_ARGUMENT,
                       "function `%s`: argument %u `%%%s`: `jit.dims` entry %d must be a "
                       "string (a dim name) or an integer (a size)",
                       m->entry, i, a->name, d);
      MlirStringRef s = mlirStringAttrGetValue(e);
      bool valid = s.length > 0 && s.length < sizeof a->dim_names[d];
      for (size_t k = 0; k < s.length && valid; k++)
        valid = isalnum((unsigned char)s.data[k]) || s.data[k] == '_';
      if (!valid)
        return JIT_ERR(JIT_INVALID_ARGUMENT,
                       "function `%s`: argument %u `%%%s`: `jit.dims` entry %d \"%.*s\" is "
                       "not a name (letters, digits, '_')",
                       m->entry, i, a->name, d, (int)s.length, s.data);
      if (a->dims[d] >= 0)
        return JIT_ERR(JIT_INVALID_ARGUMENT,
                       "function `%s`: argument %u `%%%s`: `jit.dims` names dim %d \"%.*s\", "
                       "but that dim is static (%lld) in %s; name only `?` dims",
                       m->entry, i, a->name, d, (int)s.length, s.data,
                       (long long)a->dims[d], ts);
      snprintf(a->dim_names[d], sizeof a->dim_names[d], "%.*s", (int)s.length, s.data);
    }
  }
  (void)diag;
  return NULL;
}

static jit_status jit__read_results(MlirOperation fn, jit__mlir_module *m) {
  MlirType ft = jit__func_type(fn);
  if (m->n_results == 0)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "function `%s` returns nothing", m->entry);
  for (uint32_t j = 0; j < m->n_results; j++) {
    MlirType t = mlirFunctionTypeGetResult(ft, j);
    char ts[128];
    jit__type_str(t, ts, sizeof ts);
    if (!mlirTypeIsARankedTensor(t))
      return JIT_ERR(JIT_INVALID_ARGUMENT,
                     "function `%s`: result %u has type %s; every result must be a ranked "
                     "tensor",
                     m->entry, j, ts);
    if (!jit__elem_dtype(mlirShapedTypeGetElementType(t), &m->result_dtypes[j]))
      return JIT_ERR(JIT_UNSUPPORTED,
                     "function `%s`: result %u has type %s; only f32, f16, bf16, i8, i32 and i64 "
                     "elements are supported",
                     m->entry, j, ts);
    if (mlirShapedTypeGetRank(t) > JIT_MAX_RANK)
      return JIT_ERR(JIT_UNSUPPORTED, "function `%s`: result %u has rank > %d", m->entry,
                     j, JIT_MAX_RANK);
    jit__mlir_arg *r = &m->result_types[j];
    r->dtype = m->result_dtypes[j];
    r->rank = (int)mlirShapedTypeGetRank(t);
    for (int d = 0; d < r->rank; d++)
      r->dims[d] = mlirShapedTypeIsDynamicDim(t, d) ? -1 : mlirShapedTypeGetDimSize(t, d);
  }
  return NULL;
}

// Picks the entry: `name`, or the only/first public func.func.
static jit_status jit__pick_entry(MlirModule module, const char *name, const jit__diag *diag,
                                  MlirOperation *out) {
  *out = (MlirOperation){NULL};
  if (name) *out = jit__find_func(module, name);
  char list[512];
  size_t n = 0;
  list[0] = 0;
  for (MlirOperation op = mlirBlockGetFirstOperation(mlirModuleGetBody(module));
       !mlirOperationIsNull(op); op = mlirOperationGetNextInBlock(op)) {
    if (!jit__op_is(op, "func.func")) continue;
    if (!name && mlirOperationIsNull(*out) && jit__is_public(op) &&
        !mlirBlockIsNull(jit__func_body(op)))
      *out = op;
    MlirStringRef s = mlirStringAttrGetValue(
        mlirOperationGetAttributeByName(op, mlirSymbolTableGetSymbolAttributeName()));
    if (n < sizeof list - 1)
      n += (size_t)snprintf(list + n, sizeof list - n, "%s@%.*s", n ? ", " : "",
                            (int)s.length, s.data);
  }
  if (!mlirOperationIsNull(*out)) return NULL;
  if (name)
    return JIT_ERR(JIT_INVALID_ARGUMENT,
                   "the module has no function `%s`; its functions are: %s", name,
                   n ? list : "(none)");
  return JIT_ERR(JIT_INVALID_ARGUMENT,
                 "the module has no public func.func with a body to use as the entry%s%s",
                 n ? "; its functions are: " : "", n ? list : "");
}

void jit__mlir_module_release(jit__mlir_module *m) {
  if (!m) return;
  free(m->canonical);
  free(m->located);
  free(m->exported);
  free(m->graph_record);
  free(m->args);
  free(m->result_dtypes);
  free(m->result_types);
  memset(m, 0, sizeof(*m));
}

jit_status jit__mlir_import(const char *text, size_t length, const char *entry_name,
                            const char *source_name, jit__mlir_module *out) {
  memset(out, 0, sizeof(*out));
  const char *file = source_name && source_name[0] ? source_name : "<input>";
  JIT_PROPAGATE(jit__mlir_guard(text, length, file));
  // The MLIR lexer expects a NUL after the text.
  char *copy = malloc(length + 1);
  if (!copy) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory for %zu bytes", length);
  memcpy(copy, text, length);
  copy[length] = 0;

  snprintf(out->source, sizeof out->source, "%s", file);
  jit__diag diag = {{0}, 0, out->source};
  MlirContext ctx = jit__mlir_context_create(&diag);
  jit_status status = NULL;
  MlirModule module =
      mlirModuleCreateParse(ctx, mlirStringRefCreate(copy, length));
  MlirOperation fn;
  if (mlirModuleIsNull(module)) {
    status = JIT_ERR(JIT_PARSE_ERROR, "parsing MLIR: %s",
                     diag.len ? diag.buf : "the text is not an MLIR module");
    goto done;
  }
  if ((status = jit__pick_entry(module, entry_name, &diag, &fn))) goto done;
  MlirStringRef ename = mlirStringAttrGetValue(
      mlirOperationGetAttributeByName(fn, mlirSymbolTableGetSymbolAttributeName()));
  snprintf(out->entry, sizeof out->entry, "%.*s", (int)ename.length, ename.data);
  if (mlirBlockIsNull(jit__func_body(fn))) {
    status = JIT_ERR(JIT_INVALID_ARGUMENT, "function `%s` has no body", out->entry);
    goto done;
  }
  {
    jit__dialect_walk w = {&diag, NULL, 0};
    mlirOperationWalk(mlirModuleGetOperation(module), jit__check_dialect, &w,
                      MlirWalkPreOrder);
    if ((status = w.status)) goto done;
  }
  MlirType ft = jit__func_type(fn);
  if (mlirFunctionTypeGetNumInputs(ft) > JIT_MAX_GRAPH_IO ||
      mlirFunctionTypeGetNumResults(ft) > JIT_MAX_GRAPH_IO) {
    status = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "function `%s` has %ld arguments and %ld "
                     "results, more than %d (JIT_MAX_GRAPH_IO)", out->entry,
                     (long)mlirFunctionTypeGetNumInputs(ft),
                     (long)mlirFunctionTypeGetNumResults(ft), JIT_MAX_GRAPH_IO);
    goto done;
  }
  out->n_args = (uint32_t)mlirFunctionTypeGetNumInputs(ft);
  out->n_results = (uint32_t)mlirFunctionTypeGetNumResults(ft);
  out->args = calloc(out->n_args + 1, sizeof(*out->args));
  out->result_dtypes = calloc(out->n_results + 1, sizeof(*out->result_dtypes));
  out->result_types = calloc(out->n_results + 1, sizeof(*out->result_types));
  if (!out->args || !out->result_dtypes || !out->result_types) {
    status = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
    goto done;
  }
  jit__scan_arg_names(copy, length, fn, out);
  for (uint32_t i = 0; i < out->n_args; i++)
    if (!out->args[i].name[0])
      snprintf(out->args[i].name, sizeof out->args[i].name, "arg%u", i);
  if ((status = jit__read_args(fn, &diag, out))) goto done;
  if ((status = jit__read_results(fn, out))) goto done;
  {
    MlirAttribute rec = mlirOperationGetAttributeByName(fn, jit__sr("jit.graph"));
    if (!mlirAttributeIsNull(rec) && mlirAttributeIsAString(rec)) {
      MlirStringRef r = mlirStringAttrGetValue(rec);
      out->graph_record = malloc(r.length + 1);
      if (!out->graph_record) {
        status = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
        goto done;
      }
      memcpy(out->graph_record, r.data, r.length);
      out->graph_record[r.length] = 0;
    }
  }

  // Canonical form: the entry under a fixed name, the only public function.
  for (MlirOperation op = mlirBlockGetFirstOperation(mlirModuleGetBody(module));
       !mlirOperationIsNull(op); op = mlirOperationGetNextInBlock(op)) {
    if (!jit__op_is(op, "func.func") || mlirOperationEqual(op, fn)) continue;
    mlirOperationSetAttributeByName(op, mlirSymbolTableGetVisibilityAttributeName(),
                                    mlirStringAttrGet(ctx, jit__sr("private")));
  }
  mlirOperationRemoveAttributeByName(fn, mlirSymbolTableGetVisibilityAttributeName());
  MlirOperation mop = mlirModuleGetOperation(module);
  mlirOperationRemoveAttributeByName(mop, mlirSymbolTableGetSymbolAttributeName());
  if (!mlirOperationIsNull(jit__find_func(module, JIT__MLIR_ENTRY)) &&
      strcmp(out->entry, JIT__MLIR_ENTRY) != 0) {
    status = JIT_ERR(JIT_UNSUPPORTED, "the name `%s` is reserved for the entry function",
                     JIT__MLIR_ENTRY);
    goto done;
  }
  mlirOperationSetAttributeByName(fn, mlirSymbolTableGetSymbolAttributeName(),
                                  mlirStringAttrGet(ctx, jit__sr(JIT__MLIR_ENTRY)));
  diag.len = 0;
  diag.buf[0] = 0;
  status = jit__mlir_run_pipeline(ctx, module, kImportPipeline, &diag, "canonicalizing");
  if (status) {
    // The body is wrong in a way parsing did not catch (e.g. a verifier error after
    // folding): the user's text is at fault.
    status = jit__status_annotate(status, "function `%s`", out->entry);
    goto done;
  }
  fn = jit__find_func(module, JIT__MLIR_ENTRY);
  if (mlirOperationIsNull(fn)) {
    status = JIT_ERR(JIT_INTERNAL, "the entry vanished while canonicalizing");
    goto done;
  }
  jit__sort_constants(fn);
  out->canonical = jit__print(mop, false);
  out->located = jit__print(mop, true);
  mlirOperationSetAttributeByName(fn, mlirSymbolTableGetSymbolAttributeName(),
                                  mlirStringAttrGet(ctx, jit__sr(out->entry)));
  out->exported = jit__print(mop, false);
  if (!out->canonical || !out->located || !out->exported)
    status = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory printing the module");

done:
  if (!mlirModuleIsNull(module)) mlirModuleDestroy(module);
  mlirContextDestroy(ctx);
  free(copy);
  if (status) jit__mlir_module_release(out);
  return status;
}

//===--- Specialization --------------------------------------------------===//

typedef struct jit__static_walk {
  const jit__diag *diag;
  jit_status status;
} jit__static_walk;

static bool jit__type_dynamic(MlirType t) {
  if (mlirTypeIsAUnrankedTensor(t) || mlirTypeIsAUnrankedMemRef(t)) return true;
  return mlirTypeIsAShaped(t) && mlirShapedTypeHasRank(t) && !mlirShapedTypeHasStaticShape(t);
}

static MlirWalkResult jit__check_static(MlirOperation op, void *user) {
  jit__static_walk *w = user;
  const char *what = NULL;
  intptr_t idx = 0;
  MlirType bad = {NULL};
  for (intptr_t i = 0; i < mlirOperationGetNumResults(op) && !what; i++) {
    MlirType t = mlirValueGetType(mlirOperationGetResult(op, i));
    if (jit__type_dynamic(t)) what = "result", idx = i, bad = t;
  }
  for (intptr_t i = 0; i < mlirOperationGetNumOperands(op) && !what; i++) {
    MlirType t = mlirValueGetType(mlirOperationGetOperand(op, i));
    if (jit__type_dynamic(t)) what = "operand", idx = i, bad = t;
  }
  if (!what) return MlirWalkResultAdvance;
  char where[512], ts[128];
  MlirStringRef name = mlirIdentifierStr(mlirOperationGetName(op));
  jit__type_str(bad, ts, sizeof ts);
  w->status = JIT_ERR(JIT_UNSUPPORTED,
                      "%scannot make `%.*s` static for these input shapes: its %s %ld "
                      "still has type %s (kernels for dynamic shapes are not supported "
                      "yet)",
                      jit__where(op, w->diag, where, sizeof where), (int)name.length,
                      name.data, what, (long)idx, ts);
  return MlirWalkResultInterrupt;
}

// Replaces each `return` operand made by tensor.cast with the cast's source and makes
// the function's result types those of the operands. Returns whether anything changed.
static bool jit__refine_results(MlirContext ctx, MlirOperation fn) {
  MlirOperation ret = jit__terminator(jit__func_body(fn));
  intptr_t n = mlirOperationGetNumOperands(ret);
  bool changed = false;
  MlirType ft = jit__func_type(fn);
  MlirType res[64];
  if (n > 64) return false;
  for (intptr_t j = 0; j < n; j++) {
    MlirValue v = mlirOperationGetOperand(ret, j);
    while (mlirValueIsAOpResult(v)) {
      MlirOperation def = mlirOpResultGetOwner(v);
      if (!jit__op_is(def, "tensor.cast")) break;
      v = mlirOperationGetOperand(def, 0);
    }
    if (!mlirValueEqual(v, mlirOperationGetOperand(ret, j))) {
      mlirOperationSetOperand(ret, j, v);
      changed = true;
    }
    res[j] = mlirValueGetType(v);
    if (!mlirTypeEqual(res[j], mlirFunctionTypeGetResult(ft, j))) changed = true;
  }
  if (!changed) return false;
  intptr_t n_in = mlirFunctionTypeGetNumInputs(ft);
  MlirType *in = malloc(sizeof(MlirType) * (size_t)(n_in + 1));
  if (!in) return false;
  for (intptr_t i = 0; i < n_in; i++) in[i] = mlirFunctionTypeGetInput(ft, i);
  jit__set_func_type(ctx, fn, n_in, in, n, res);
  free(in);
  return true;
}

// Gives argument `arg` the static type `to`. TOSA users take it as it is (TOSA ops
// accept operands more static than their types say, and tosa-infer-shapes propagates
// from there); every other user gets `tensor.cast %arg : to -> old`, which
// canonicalization folds into the ops that can take the static type (tensor.dim,
// linalg ops, reshapes), so the shapes flow through the body.
static jit_status jit__retype_arg(MlirContext ctx, MlirBlock body, MlirValue arg,
                                  MlirType old, MlirType to) {
  mlirValueSetType(arg, to);
  if (mlirTypeEqual(old, to)) return NULL;
  size_t n = 0, cap = 0;
  MlirOpOperand *uses = NULL;
  for (MlirOpOperand u = mlirValueGetFirstUse(arg); !mlirOpOperandIsNull(u);
       u = mlirOpOperandGetNextUse(u)) {
    MlirStringRef name = mlirIdentifierStr(mlirOperationGetName(mlirOpOperandGetOwner(u)));
    if (name.length > 5 && !memcmp(name.data, "tosa.", 5)) continue;
    if (n == cap) {
      cap = cap ? cap * 2 : 8;
      MlirOpOperand *p = realloc(uses, cap * sizeof(*p));
      if (!p) {
        free(uses);
        return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
      }
      uses = p;
    }
    uses[n++] = u;
  }
  if (n) {
    MlirOperationState st = mlirOperationStateGet(jit__sr("tensor.cast"),
                                                  mlirValueGetLocation(arg));
    mlirOperationStateAddOperands(&st, 1, &arg);
    mlirOperationStateAddResults(&st, 1, &old);
    MlirOperation cast = mlirOperationCreate(&st);
    MlirValue cv = mlirOperationGetResult(cast, 0);
    mlirBlockInsertOwnedOperation(body, 0, cast);
    // Collected first: rewiring a use unlinks it from the list being walked.
    MlirOperation *owners = malloc(n * sizeof(*owners));
    unsigned *idx = malloc(n * sizeof(*idx));
    if (!owners || !idx) {
      free(owners);
      free(idx);
      free(uses);
      return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
      owners[i] = mlirOpOperandGetOwner(uses[i]);
      idx[i] = mlirOpOperandGetOperandNumber(uses[i]);
    }
    for (size_t i = 0; i < n; i++) mlirOperationSetOperand(owners[i], idx[i], cv);
    free(owners);
    free(idx);
  }
  free(uses);
  (void)ctx;
  return NULL;
}

// The source of `v` if `v` is a tensor.cast of a static tensor, else `v`.
static MlirValue jit__cast_source(MlirValue v) {
  if (!mlirValueIsAOpResult(v)) return v;
  MlirOperation def = mlirOpResultGetOwner(v);
  if (!jit__op_is(def, "tensor.cast")) return v;
  MlirValue src = mlirOperationGetOperand(def, 0);
  return mlirShapedTypeHasStaticShape(mlirValueGetType(src)) ? src : v;
}

// Where canonicalization does not look through tensor.cast, we do: tensor.concat, and
// elementwise arith/math ops on tensors (result shape = operand shape). Such an op takes
// the static operands and gets a static result type, followed by a cast back to the old
// type for its users, which the next canonicalization round folds onwards. Returns
// whether anything changed.
typedef struct jit__absorb {
  MlirOperation *ops;
  size_t n, cap;
} jit__absorb;

static MlirWalkResult jit__absorb_collect(MlirOperation op, void *user) {
  jit__absorb *a = user;
  if (mlirOperationGetNumResults(op) != 1 || mlirOperationGetNumOperands(op) < 1)
    return MlirWalkResultAdvance;
  MlirType rt = mlirValueGetType(mlirOperationGetResult(op, 0));
  if (!mlirTypeIsARankedTensor(rt) || mlirShapedTypeHasStaticShape(rt))
    return MlirWalkResultAdvance;
  MlirStringRef name = mlirIdentifierStr(mlirOperationGetName(op));
  bool elementwise = (name.length > 6 && !memcmp(name.data, "arith.", 6)) ||
                     (name.length > 5 && !memcmp(name.data, "math.", 5));
  if (!elementwise && !jit__op_is(op, "tensor.concat")) return MlirWalkResultAdvance;
  for (intptr_t i = 0; i < mlirOperationGetNumOperands(op); i++) {
    MlirValue v = jit__cast_source(mlirOperationGetOperand(op, i));
    if (!mlirShapedTypeHasStaticShape(mlirValueGetType(v))) return MlirWalkResultAdvance;
  }
  if (a->n == a->cap) {
    size_t cap = a->cap ? a->cap * 2 : 8;
    MlirOperation *p = realloc(a->ops, cap * sizeof(*p));
    if (!p) return MlirWalkResultInterrupt;
    a->ops = p;
    a->cap = cap;
  }
  a->ops[a->n++] = op;
  return MlirWalkResultAdvance;
}

static bool jit__absorb_casts(MlirOperation fn) {
  jit__absorb a = {0};
  mlirOperationWalk(fn, jit__absorb_collect, &a, MlirWalkPreOrder);
  bool changed = false;
  for (size_t k = 0; k < a.n; k++) {
    MlirOperation op = a.ops[k];
    intptr_t n = mlirOperationGetNumOperands(op);
    MlirValue src0 = jit__cast_source(mlirOperationGetOperand(op, 0));
    MlirType t0 = mlirValueGetType(src0);
    intptr_t rank = mlirShapedTypeGetRank(t0);
    int64_t dims[JIT_MAX_RANK];
    if (rank > JIT_MAX_RANK) continue;
    for (intptr_t d = 0; d < rank; d++) dims[d] = mlirShapedTypeGetDimSize(t0, d);
    if (jit__op_is(op, "tensor.concat")) {
      MlirAttribute dim = mlirOperationGetAttributeByName(op, jit__sr("dim"));
      if (mlirAttributeIsNull(dim) || !mlirAttributeIsAInteger(dim)) continue;
      int64_t cd = mlirIntegerAttrGetValueInt(dim);
      if (cd < 0 || cd >= rank) continue;
      dims[cd] = 0;
      for (intptr_t i = 0; i < n; i++)
        dims[cd] += mlirShapedTypeGetDimSize(
            mlirValueGetType(jit__cast_source(mlirOperationGetOperand(op, i))), cd);
    }
    MlirValue res = mlirOperationGetResult(op, 0);
    MlirType old = mlirValueGetType(res);
    MlirType st = mlirRankedTensorTypeGet(rank, dims, mlirShapedTypeGetElementType(old),
                                          mlirAttributeGetNull());
    for (intptr_t i = 0; i < n; i++)
      mlirOperationSetOperand(op, i, jit__cast_source(mlirOperationGetOperand(op, i)));
    mlirValueSetType(res, st);
    // Users keep seeing the old type through a cast after the op.
    MlirOperationState cs = mlirOperationStateGet(jit__sr("tensor.cast"),
                                                  mlirOperationGetLocation(op));
    mlirOperationStateAddOperands(&cs, 1, &res);
    mlirOperationStateAddResults(&cs, 1, &old);
    MlirOperation cast = mlirOperationCreate(&cs);
    mlirBlockInsertOwnedOperationAfter(mlirOperationGetBlock(op), op, cast);
    MlirValue cv = mlirOperationGetResult(cast, 0);
    mlirValueReplaceAllUsesExcept(res, cv, 1, &cast);
    changed = true;
  }
  free(a.ops);
  return changed;
}

// Parses the located text and specializes `jit_entry` for `args`: every type static.
// On success *out_module (owned by the caller) holds it and *out_fn is the function.
static jit_status jit__specialize(MlirContext ctx, jit__diag *diag, const jit__mlir_module *m,
                                  const jit__node *args, MlirModule *out_module,
                                  MlirOperation *out_fn) {
  *out_module = (MlirModule){NULL};
  MlirModule module = mlirModuleCreateParse(ctx, jit__sr(m->located));
  if (mlirModuleIsNull(module))
    return JIT_ERR(JIT_INTERNAL, "the canonical module does not parse: %s", diag->buf);
  MlirOperation fn = jit__find_func(module, JIT__MLIR_ENTRY);
  jit_status status = NULL;
  if (mlirOperationIsNull(fn)) {
    status = JIT_ERR(JIT_INTERNAL, "the canonical module has no `%s`", JIT__MLIR_ENTRY);
    goto fail;
  }
  mlirOperationRemoveAttributeByName(fn, jit__sr("arg_attrs"));
  mlirOperationRemoveAttributeByName(fn, jit__sr("res_attrs"));
  // tensor.cast ops are created below. Their dialect must be loaded first: an op made
  // while its dialect is not yet loaded gets an unregistered name, and once a pass loads
  // the dialect, MLIR 22 can resolve that name to another tensor op (a function of
  // only arith/math ops on tensors came out with tensor.collapse_shape in the casts'
  // place).
  mlirContextGetOrLoadDialect(ctx, jit__sr("tensor"));
  MlirType ft = jit__func_type(fn);
  MlirBlock body = jit__func_body(fn);
  uint32_t n_res = (uint32_t)mlirFunctionTypeGetNumResults(ft);
  MlirType *in = malloc(sizeof(MlirType) * (m->n_args + 1));
  MlirType *res = malloc(sizeof(MlirType) * (n_res + 1));
  if (!in || !res) {
    free(in);
    free(res);
    status = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
    goto fail;
  }
  for (uint32_t i = 0; i < m->n_args; i++) {
    MlirType old = mlirFunctionTypeGetInput(ft, i);
    in[i] = mlirRankedTensorTypeGet(args[i].rank, args[i].dims,
                                    mlirShapedTypeGetElementType(old),
                                    mlirAttributeGetNull());
    status = jit__retype_arg(ctx, body, mlirBlockGetArgument(body, i), old, in[i]);
    if (status) {
      free(in);
      free(res);
      goto fail;
    }
  }
  for (uint32_t j = 0; j < n_res; j++) res[j] = mlirFunctionTypeGetResult(ft, j);
  jit__set_func_type(ctx, fn, m->n_args, in, n_res, res);
  free(in);
  free(res);

  diag->len = 0;
  diag->buf[0] = 0;
  for (int round = 0; round < 8; round++) {
    status = jit__mlir_run_pipeline(ctx, module, kRefinePipeline, diag, "refining shapes");
    if (status) {
      // The body rejects these shapes (a verifier error once the types are static).
      jit_status s = JIT_ERR(JIT_SHAPE_MISMATCH, "%s", jit_status_message(status));
      jit_status_free(status);
      status = s;
      goto fail;
    }
    bool absorbed = jit__absorb_casts(fn);
    if (!jit__refine_results(ctx, fn) && !absorbed) break;
  }
  jit__static_walk w = {diag, NULL};
  mlirOperationWalk(fn, jit__check_static, &w, MlirWalkPreOrder);
  if ((status = w.status)) goto fail;
  MlirType ft2 = jit__func_type(fn);
  for (uint32_t j = 0; j < n_res; j++) {
    if (jit__type_dynamic(mlirFunctionTypeGetResult(ft2, j))) {
      status = JIT_ERR(JIT_UNSUPPORTED, "cannot make result %u static for these input "
                       "shapes", j);
      goto fail;
    }
  }
  *out_module = module;
  *out_fn = fn;
  return NULL;
fail:
  mlirModuleDestroy(module);
  return status;
}

// The result shapes of a specialized entry.
static void jit__read_result_shapes(const jit__mlir_module *m, MlirOperation fn,
                                    jit__node *out) {
  MlirType ft = jit__func_type(fn);
  for (uint32_t j = 0; j < m->n_results; j++) {
    MlirType t = mlirFunctionTypeGetResult(ft, j);
    memset(&out[j], 0, sizeof(out[j]));
    out[j].op = JIT__OP_INPUT;
    out[j].dtype = m->result_dtypes[j];
    out[j].rank = (int)mlirShapedTypeGetRank(t);
    for (int d = 0; d < out[j].rank; d++) out[j].dims[d] = mlirShapedTypeGetDimSize(t, d);
  }
}

jit_status jit__mlir_result_shapes(const jit__mlir_module *m, const jit__node *args,
                                   jit__node *out) {
  jit__diag diag = {{0}, 0, m->source};
  MlirContext ctx = jit__mlir_context_create(&diag);
  MlirModule module;
  MlirOperation fn;
  jit_status s = jit__specialize(ctx, &diag, m, args, &module, &fn);
  if (!s) {
    jit__read_result_shapes(m, fn, out);
    mlirModuleDestroy(module);
  }
  mlirContextDestroy(ctx);
  return s;
}

// The `n_in` inputs of `fn` get `bufferization.writable = false` (kept with their other
// argument attributes), the `n_out` out-arguments after them none: a body whose op
// writes into an input tensor (linalg.matmul outs(%c), tensor.insert_slice into %x)
// then writes into a copy, not into the caller's input buffer, which one-shot
// bufferization otherwise reuses in place.
static jit_status jit__inputs_read_only(MlirContext ctx, MlirOperation fn, intptr_t n_in,
                                        intptr_t n_out) {
  MlirAttribute old = mlirOperationGetAttributeByName(fn, jit__sr("arg_attrs"));
  bool have = !mlirAttributeIsNull(old) && mlirAttributeIsAArray(old);
  MlirAttribute *dicts = malloc(sizeof(MlirAttribute) * (size_t)(n_in + n_out + 1));
  if (!dicts) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
  MlirIdentifier key = mlirIdentifierGet(ctx, jit__sr("bufferization.writable"));
  jit_status s = NULL;
  for (intptr_t i = 0; i < n_in + n_out && !s; i++) {
    MlirAttribute d = have && i < mlirArrayAttrGetNumElements(old)
                          ? mlirArrayAttrGetElement(old, i)
                          : mlirAttributeGetNull();
    intptr_t n = !mlirAttributeIsNull(d) && mlirAttributeIsADictionary(d)
                     ? mlirDictionaryAttrGetNumElements(d)
                     : 0;
    MlirNamedAttribute *el = malloc(sizeof(MlirNamedAttribute) * (size_t)(n + 1));
    if (!el) {
      s = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
      break;
    }
    intptr_t k = 0;
    for (intptr_t j = 0; j < n; j++) {
      MlirNamedAttribute a = mlirDictionaryAttrGetElement(d, j);
      if (!mlirIdentifierEqual(a.name, key)) el[k++] = a;
    }
    if (i < n_in) el[k++] = mlirNamedAttributeGet(key, mlirBoolAttrGet(ctx, 0));
    dicts[i] = mlirDictionaryAttrGet(ctx, k, el);
    free(el);
  }
  if (!s)
    mlirOperationSetAttributeByName(fn, jit__sr("arg_attrs"),
                                    mlirArrayAttrGet(ctx, n_in + n_out, dicts));
  free(dicts);
  return s;
}

// Results -> memref out-arguments written by materialize_in_destination.
static jit_status jit__to_destination_passing(MlirContext ctx, MlirOperation fn) {
  MlirBlock body = jit__func_body(fn);
  MlirOperation ret = jit__terminator(body);
  MlirType ft = jit__func_type(fn);
  intptr_t n_in = mlirFunctionTypeGetNumInputs(ft), n_out = mlirOperationGetNumOperands(ret);
  MlirType *types = malloc(sizeof(MlirType) * (size_t)(n_in + n_out + 1));
  if (!types) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
  for (intptr_t i = 0; i < n_in; i++) types[i] = mlirFunctionTypeGetInput(ft, i);
  mlirContextGetOrLoadDialect(ctx, jit__sr("bufferization"));
  MlirLocation loc = mlirOperationGetLocation(ret);
  MlirNamedAttribute attrs[2] = {
      mlirNamedAttributeGet(mlirIdentifierGet(ctx, jit__sr("restrict")), mlirUnitAttrGet(ctx)),
      mlirNamedAttributeGet(mlirIdentifierGet(ctx, jit__sr("writable")), mlirUnitAttrGet(ctx)),
  };
  for (intptr_t j = 0; j < n_out; j++) {
    MlirValue v = mlirOperationGetOperand(ret, j);
    MlirType t = mlirValueGetType(v);
    int64_t dims[JIT_MAX_RANK];
    intptr_t rank = mlirShapedTypeGetRank(t);
    for (intptr_t d = 0; d < rank; d++) dims[d] = mlirShapedTypeGetDimSize(t, d);
    MlirType mt = mlirMemRefTypeContiguousGet(mlirShapedTypeGetElementType(t), rank, dims,
                                              mlirAttributeGetNull());
    types[n_in + j] = mt;
    MlirValue dest = mlirBlockAddArgument(body, mt, loc);
    MlirOperationState st = mlirOperationStateGet(
        jit__sr("bufferization.materialize_in_destination"), loc);
    MlirValue operands[2] = {v, dest};
    mlirOperationStateAddOperands(&st, 2, operands);
    mlirOperationStateAddAttributes(&st, 2, attrs);
    MlirOperation op = mlirOperationCreate(&st);
    if (mlirOperationIsNull(op)) {
      free(types);
      return JIT_ERR(JIT_INTERNAL, "cannot create materialize_in_destination");
    }
    mlirBlockInsertOwnedOperationBefore(body, ret, op);
  }
  mlirOperationSetOperands(ret, 0, NULL);
  jit__set_func_type(ctx, fn, n_in + n_out, types, 0, NULL);
  free(types);
  return jit__inputs_read_only(ctx, fn, n_in, n_out);
}

jit_status jit__mlir_compile_cpu(const jit__mlir_module *m, const jit__node *args,
                                 const char *func_name, const jit__lower_options *lo,
                                 jit__artifact *out, jit__node *out_results) {
  memset(out, 0, sizeof(*out));
  double t0 = jit__now_ms();
  jit__dump_text(lo, func_name, "00-graph.mlir", m->canonical, strlen(m->canonical));
  jit__diag diag = {{0}, 0, m->source};
  MlirContext ctx = jit__mlir_context_create(&diag);
  MlirModule module = {NULL};
  MlirOperation fn;
  jit_status s = jit__specialize(ctx, &diag, m, args, &module, &fn);
  if (s) goto done;
  jit__read_result_shapes(m, fn, out_results);
  diag.len = 0;
  diag.buf[0] = 0;
  if ((s = jit__mlir_run_pipeline(ctx, module, kTosaPipeline, &diag, "lowering TOSA to linalg")))
    goto done;
  if ((s = jit__to_destination_passing(ctx, fn))) goto done;
  mlirOperationSetAttributeByName(fn, mlirSymbolTableGetSymbolAttributeName(),
                                  mlirStringAttrGet(ctx, jit__sr(func_name)));
  if (!mlirOperationVerify(mlirModuleGetOperation(module))) {
    s = JIT_ERR(JIT_INTERNAL, "the specialized module does not verify: %s", diag.buf);
    goto done;
  }
  jit__dump_op(lo, func_name, "01-specialized.mlir", mlirModuleGetOperation(module));
  s = jit__cpu_compile_module(ctx, module, func_name, m->n_args + m->n_results, lo, &diag,
                              t0, out);
done:
  if (!mlirModuleIsNull(module)) mlirModuleDestroy(module);
  mlirContextDestroy(ctx);
  if (s) s = jit__status_annotate(s, "compiling MLIR function `%s` for the CPU", m->entry);
  return s;
}
