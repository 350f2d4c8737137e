//===--- jitml_worker.c - the compile isolation worker (jit/isolate.c) ----===//
//
// libjitml starts this program to do, in a process of its own, what MLIR text from
// outside could crash, hang or blow up: importing the text, and compiling a graph of
// it for one binding into the disk cache, from which the calling process then loads
// the kernel. A crash or a hang here costs the caller a status, not its process.
//
// Request on stdin (one per run), text lines then the MLIR bytes:
//   jitml-worker 3
//   mode import|compile
//   entry <hex of the name>|-
//   opt_level <n>
//   threads <n>
//   conv_algorithm <n>            (jit_conv_algorithm)
//   cache_dir <hex of the path>|- (compile: the caller's cache directory)
//   inputs <k>                    (compile: k lines follow)
//   <code> <bits> <rank> <d0> ... (one per input: DLPack dtype code and bits (f32, f16,
//                                 bf16), and its dims)
//   text <bytes>
//   <the MLIR text>
// Answer on stdout, one line: "ok" or "error <status code> <message>". Exit 0 when an
// answer was written. Uses the public API only.
//
//===----------------------------------------------------------------------===//
#define _POSIX_C_SOURCE 200809L
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jitml.h>

enum { kMaxInputs = 4096 };

typedef struct request {
  char mode[16], entry[512], cache_dir[8192];
  int opt_level, threads, conv_algorithm, n_inputs;
  DLTensor *inputs;
  int64_t (*dims)[JIT_MAX_RANK];
  char *text;
  size_t length;
} request;

static int answer_error(jit_status_code code, const char *message) {
  printf("error %d ", (int)code);
  for (const char *c = message; *c; c++) putchar(*c == '\n' ? ' ' : *c);
  putchar('\n');
  fflush(stdout);
  return 0;
}

static int answer_status(jit_status s) {
  if (!s) {
    printf("ok\n");
    fflush(stdout);
    return 0;
  }
  answer_error(jit_status_get_code(s), jit_status_message(s));
  jit_status_free(s);
  return 0;
}

// Decodes a hex field in place ("-" stays "-"); false if it is not hex.
static int unhex(char *s) {
  if (!strcmp(s, "-")) return 1;
  size_t n = strlen(s);
  if (n % 2) return 0;
  for (size_t i = 0; i < n / 2; i++) {
    unsigned v;
    if (sscanf(s + 2 * i, "%2x", &v) != 1 || v == 0) return 0;
    s[i] = (char)v;
  }
  s[n / 2] = 0;
  return 1;
}

// Reads the request; false on anything malformed.
static int read_request(request *r) {
  int version = 0;
  if (scanf("jitml-worker %d mode %15s entry %511s opt_level %d threads %d conv_algorithm %d "
            "cache_dir %8191s inputs %d",
            &version, r->mode, r->entry, &r->opt_level, &r->threads, &r->conv_algorithm,
            r->cache_dir, &r->n_inputs) != 8 ||
      version != 3 || r->n_inputs < 0 || r->n_inputs > kMaxInputs || !unhex(r->entry) ||
      !unhex(r->cache_dir))
    return 0;
  r->inputs = calloc((size_t)r->n_inputs + 1, sizeof *r->inputs);
  r->dims = calloc((size_t)r->n_inputs + 1, sizeof *r->dims);
  if (!r->inputs || !r->dims) return 0;
  for (int i = 0; i < r->n_inputs; i++) {
    int code = 0, bits = 0, rank = 0;
    if (scanf("%d %d %d", &code, &bits, &rank) != 3) return 0;
    bool known = (code == kDLFloat && (bits == 16 || bits == 32)) ||
                 (code == kDLBfloat && bits == 16);
    if (!known || rank < 0 || rank > JIT_MAX_RANK) return 0;
    for (int d = 0; d < rank; d++)
      if (scanf("%lld", (long long *)&r->dims[i][d]) != 1) return 0;
    r->inputs[i] = (DLTensor){.device = {kDLCPU, 0}, .ndim = rank,
                              .dtype = {(uint8_t)code, (uint8_t)bits, 1},
                              .shape = r->dims[i]};
  }
  unsigned long long length = 0;
  if (scanf(" text %llu", &length) != 1 || getchar() != '\n' || length > (1ull << 28))
    return 0;
  r->length = (size_t)length;
  r->text = malloc(r->length + 1);
  return r->text && fread(r->text, 1, r->length, stdin) == r->length;
}

int main(void) {
  request r;
  memset(&r, 0, sizeof r);
  if (!read_request(&r)) return answer_error(JIT_INVALID_ARGUMENT, "jitml-worker: bad request");
  bool compile = !strcmp(r.mode, "compile");
  jit_options o;
  jit_options_init(&o);
  o.opt_level = r.opt_level;
  o.num_threads = r.threads;
  o.conv_algorithm = (jit_conv_algorithm)r.conv_algorithm;  // checked by the context
  o.cache_dir = compile && strcmp(r.cache_dir, "-") ? r.cache_dir : "";
  o.remote_cache = "";  // the caller pushes what the worker stores (jit__cache_publish)
  o.shape_policy = JIT_SHAPE_POLICY_EXACT;
  o.mlir_isolation = JIT_ISOLATION_OFF;  // this is the isolated process
  jit_context *ctx = NULL;
  jit_status s = jit_context_create(&o, &ctx);
  if (s) return answer_status(s);
  jit_graph *g = NULL;
  s = jit_graph_from_mlir(ctx, r.text, r.length, strcmp(r.entry, "-") ? r.entry : NULL, &g);
  if (!s && compile) s = jit_graph_compile(g, r.inputs, r.n_inputs);
  answer_status(s);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
  free(r.inputs);
  free(r.dims);
  free(r.text);
  return 0;
}
