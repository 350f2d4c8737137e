//===--- custom_op_host.c - libjitml as a custom op of a host framework ----===//
//
// A minimal "host framework": it owns its tensors (DLManagedTensor with deleters),
// keeps an op registry (name -> op) and runs a model by calling ops by name. One op
// is a libjitml graph registered through include/jitml_op.h; the host never sees a
// jit_graph again after registering it.
//
//   build/examples/custom_op_host
//
// The model: y = dense_gelu(x, W, b) computed by the jitml op, then a host-native
// "rowsum" op. Runs for batch sizes 1, 5 and 32 with both calling styles (the op
// allocates its outputs; the host allocates from the shape function), checks against
// a plain-C reference, and exits non-zero on any error or mismatch.
//
//===----------------------------------------------------------------------===//
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jitml.h"
#include "jitml_op.h"

enum { IN = 8, OUT = 4 };

//===--- The host's tensors -------------------------------------------------===//

typedef struct host_tensor {
  DLManagedTensor managed;  // first member: a DLManagedTensor* is a host_tensor*
  int64_t shape[JIT_MAX_RANK];
} host_tensor;

static void host_tensor_deleter(DLManagedTensor *self) {
  if (!self) return;
  free(self->dl_tensor.data);
  free(self);
}

// A dense f32 CPU tensor owned by the host (freed by its deleter).
static DLManagedTensor *host_tensor_new(int rank, const int64_t *dims) {
  host_tensor *t = calloc(1, sizeof(*t));
  if (!t) return NULL;
  int64_t n = 1;
  for (int i = 0; i < rank; i++) {
    t->shape[i] = dims[i];
    n *= dims[i];
  }
  t->managed.dl_tensor.data = calloc((size_t)(n ? n : 1), sizeof(float));
  if (!t->managed.dl_tensor.data) {
    free(t);
    return NULL;
  }
  t->managed.dl_tensor.device = (DLDevice){kDLCPU, 0};
  t->managed.dl_tensor.ndim = rank;
  t->managed.dl_tensor.dtype = (DLDataType){kDLFloat, 32, 1};
  t->managed.dl_tensor.shape = t->shape;
  t->managed.deleter = host_tensor_deleter;
  return &t->managed;
}

static void release(DLManagedTensor *t) {
  if (t && t->deleter) t->deleter(t);
}

static float *f32(DLManagedTensor *t) { return (float *)t->dl_tensor.data; }

//===--- The host's op registry ------------------------------------------------===//

// A host op: either native (a C function) or a libjitml op.
typedef int (*native_fn)(DLManagedTensor *const *in, int n_in, DLManagedTensor **out);

typedef struct registry_entry {
  char name[64];
  jit_op *jit;       // owned; NULL for a native op
  native_fn native;
} registry_entry;

typedef struct registry {
  registry_entry entries[16];
  int n;
} registry;

static bool ok(jit_status s, const char *what) {
  if (!s) return true;
  fprintf(stderr, "custom_op_host: %s: %s: %s\n", what,
          jit_status_code_name(jit_status_get_code(s)), jit_status_message(s));
  jit_status_free(s);
  return false;
}

// Registers `graph` once under `name`; the registry (through the op) owns it after.
static bool registry_add_jit(registry *r, const char *name, jit_graph *graph) {
  if (r->n == 16) return false;
  registry_entry *e = &r->entries[r->n];
  memset(e, 0, sizeof(*e));
  if (!ok(jit_op_create(graph, name, &e->jit), "jit_op_create")) return false;
  snprintf(e->name, sizeof(e->name), "%s", name);
  r->n++;
  return true;
}

static bool registry_add_native(registry *r, const char *name, native_fn fn) {
  if (r->n == 16) return false;
  registry_entry *e = &r->entries[r->n++];
  memset(e, 0, sizeof(*e));
  snprintf(e->name, sizeof(e->name), "%s", name);
  e->native = fn;
  return true;
}

static registry_entry *registry_find(registry *r, const char *name) {
  for (int i = 0; i < r->n; i++)
    if (strcmp(r->entries[i].name, name) == 0) return &r->entries[i];
  return NULL;
}

static void registry_free(registry *r) {
  for (int i = 0; i < r->n; i++) jit_op_destroy(r->entries[i].jit);
  r->n = 0;
}

// The host's forward call: one output. `host_alloc` picks the calling style for jit
// ops: the op allocates (jit_op_call), or the host allocates from the shape function
// and the op writes into it (jit_op_call_into).
static DLManagedTensor *forward(registry *r, const char *name, DLManagedTensor *const *in,
                                int n_in, bool host_alloc) {
  registry_entry *e = registry_find(r, name);
  if (!e) {
    fprintf(stderr, "custom_op_host: no op `%s`\n", name);
    return NULL;
  }
  DLManagedTensor *out = NULL;
  if (e->native) return e->native(in, n_in, &out) == 0 ? out : NULL;
  if (!host_alloc) {
    if (!ok(jit_op_call(e->jit, in, n_in, &out, 1, JIT_OP_FLAGS_NONE), name)) return NULL;
    return out;
  }
  jit_op_output_info info;
  if (!ok(jit_op_output_shapes(e->jit, in, n_in, &info, 1), name)) return NULL;
  if (info.dtype.code != kDLFloat || info.dtype.bits != 32) {
    fprintf(stderr, "custom_op_host: `%s`: this host only allocates f32\n", name);
    return NULL;
  }
  out = host_tensor_new(info.rank, info.dims);
  if (!out) return NULL;
  if (!ok(jit_op_call_into(e->jit, in, n_in, &out, 1, JIT_OP_FLAGS_NONE), name)) {
    release(out);
    return NULL;
  }
  return out;
}

// A native op: the sum of each row of a [N, K] tensor -> [N].
static int rowsum(DLManagedTensor *const *in, int n_in, DLManagedTensor **out) {
  if (n_in != 1 || in[0]->dl_tensor.ndim != 2) return 1;
  int64_t n = in[0]->dl_tensor.shape[0], k = in[0]->dl_tensor.shape[1];
  *out = host_tensor_new(1, &n);
  if (!*out) return 1;
  for (int64_t i = 0; i < n; i++) {
    float s = 0;
    for (int64_t j = 0; j < k; j++) s += f32(in[0])[i * k + j];
    f32(*out)[i] = s;
  }
  return 0;
}

//===--- The model -------------------------------------------------------------===//

static jit_graph *build_dense_gelu(jit_context *ctx) {
  jit_graph *g = NULL;
  if (!ok(jit_graph_create(ctx, "dense_gelu", &g), "jit_graph_create")) return NULL;
  const DLDataType f = {kDLFloat, 32, 1};
  jit_value x = jit_input(g, "x", f, 2, (int64_t[]){jit_symbol(g, "N"), IN});
  jit_value w = jit_input(g, "w", f, 2, (int64_t[]){IN, OUT});
  jit_value b = jit_input(g, "b", f, 1, (int64_t[]){OUT});
  jit_output(g, jit_gelu(g, jit_add(g, jit_matmul(g, x, w), b)));
  return g;  // jit_op_create finalizes it and reports any builder error
}

static float gelu_ref(float v) {
  return 0.5f * v * (1.f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v)));
}

int main(void) {
  jit_context *ctx = NULL;
  registry reg = {.n = 0};
  DLManagedTensor *w = NULL, *b = NULL;
  int rc = 1;
  if (!ok(jit_context_create(NULL, &ctx), "jit_context_create")) return 1;
  jit_graph *g = build_dense_gelu(ctx);
  if (!g) goto done;
  if (!registry_add_jit(&reg, "dense_gelu", g)) {
    jit_graph_destroy(g);  // still ours when registration failed
    goto done;
  }
  registry_add_native(&reg, "rowsum", rowsum);

  w = host_tensor_new(2, (int64_t[]){IN, OUT});
  b = host_tensor_new(1, (int64_t[]){OUT});
  if (!w || !b) goto done;
  for (int i = 0; i < IN * OUT; i++) f32(w)[i] = (float)((i * 5) % 7) / 7.f - 0.4f;
  for (int j = 0; j < OUT; j++) f32(b)[j] = 0.1f * (float)j;

  const int64_t batches[] = {1, 5, 32};
  double worst = 0;
  for (int bi = 0; bi < 3; bi++) {
    for (int style = 0; style < 2; style++) {
      int64_t n = batches[bi];
      DLManagedTensor *x = host_tensor_new(2, (int64_t[]){n, IN});
      if (!x) goto done;
      for (int64_t i = 0; i < n * IN; i++) f32(x)[i] = (float)(i % 9) / 9.f - 0.5f;
      DLManagedTensor *ins[3] = {x, w, b};
      DLManagedTensor *h = forward(&reg, "dense_gelu", ins, 3, style == 1);
      DLManagedTensor *y = h ? forward(&reg, "rowsum", &h, 1, false) : NULL;
      bool good = y != NULL;
      for (int64_t i = 0; good && i < n; i++) {
        float want = 0;
        for (int j = 0; j < OUT; j++) {
          float acc = f32(b)[j];
          for (int k = 0; k < IN; k++) acc += f32(x)[i * IN + k] * f32(w)[k * OUT + j];
          want += gelu_ref(acc);
        }
        double d = fabs((double)f32(y)[i] - want);
        if (d > worst) worst = d;
      }
      if (good)
        printf("N = %2lld (%s): y[0] = %.6f\n", (long long)n,
               style ? "host allocates" : "op allocates", (double)f32(y)[0]);
      release(y);
      release(h);  // the op's output (or the host's): released through its deleter
      release(x);
      if (!good) goto done;
    }
  }
  printf("max |error| vs reference: %.3g\n", worst);
  rc = worst <= 1e-4 ? 0 : 1;
  if (rc) fprintf(stderr, "custom_op_host: mismatch %.3g > 1e-4\n", worst);

done:
  release(w);
  release(b);
  registry_free(&reg);  // destroys the ops and their graphs, before the context
  jit_context_destroy(ctx);
  return rc;
}
