//===--- call_c.c - the per-call time of two graphs from C -----------------===//
//
// The C side of bench/python_overhead.py: the same two graphs it calls from Python,
// called from C in a loop, so that the Python table can say how much a Python call
// adds. Prints one line per graph: `<name> <median us per call>`.
//   mlp   softmax(gelu(x W1 + b1) W2 + b2), x [1, 784], W1 [784, 256], W2 [256, 10]
//         (examples/mlp's model at N = 1)
//   fma_relu  relu(a * b + c) on three [N] tensors, N = 16M (16,777,216): one fused
//         elementwise kernel, bound by memory bandwidth (the output written into the
//         same buffer on every call)
// Usage: jitml_call_c [calls per round (default 20000; fma_relu does 1/1000 of them,
// at least 3)]; one thread, shape policy exact (each binding's own kernel), 7 rounds,
// the median round's time per call.
//
//===----------------------------------------------------------------------===//
#define _POSIX_C_SOURCE 199309L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "jitml.h"

static const DLDataType kF32 = {kDLFloat, 32, 1};

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static int fail(jit_status s, const char *what) {
  fprintf(stderr, "jitml_call_c: %s: %s\n", what, jit_status_message(s));
  jit_status_free(s);
  return 1;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static DLTensor tensor(float *data, int ndim, int64_t *shape) {
  DLTensor t = {0};
  t.data = data;
  t.device.device_type = kDLCPU;
  t.ndim = ndim;
  t.dtype = kF32;
  t.shape = shape;
  return t;
}

// Times `calls` jit_runs, 7 rounds; prints the median round's us per call.
static int time_calls(const char *name, jit_graph *g, DLTensor *in, int n_in,
                      DLTensor *out, long calls) {
  jit_status s = jit_run(g, in, n_in, out, 1);  // compiles
  if (s) return fail(s, name);
  for (long i = 0; i < calls / 10; i++) jit_run(g, in, n_in, out, 1);  // warm
  double rounds[7];
  for (int r = 0; r < 7; r++) {
    double t0 = now_us();
    for (long i = 0; i < calls; i++) {
      s = jit_run(g, in, n_in, out, 1);
      if (s) return fail(s, name);
    }
    rounds[r] = (now_us() - t0) / (double)calls;
  }
  qsort(rounds, 7, sizeof rounds[0], cmp_double);
  printf("%s %.3f\n", name, rounds[3]);
  return 0;
}

int main(int argc, char **argv) {
  long calls = argc > 1 ? atol(argv[1]) : 20000;
  if (calls < 10) calls = 10;
  jit_options o;
  jit_options_init(&o);
  o.num_threads = 1;
  o.shape_policy = JIT_SHAPE_POLICY_EXACT;
  jit_context *ctx = NULL;
  jit_status s = jit_context_create(&o, &ctx);
  if (s) return fail(s, "context");
  enum { IN = 784, HID = 256, OUT = 10 };
  float *x = calloc(IN, sizeof(float)), *w1 = calloc(IN * HID, sizeof(float));
  float *b1 = calloc(HID, sizeof(float)), *w2 = calloc(HID * OUT, sizeof(float));
  float *b2 = calloc(OUT, sizeof(float)), *y = calloc(IN, sizeof(float));
  for (int i = 0; i < IN * HID; i++) w1[i] = (float)((i * 37) % 101 - 50) / 500.0f;
  for (int i = 0; i < HID * OUT; i++) w2[i] = (float)((i * 13) % 97 - 48) / 500.0f;
  for (int i = 0; i < IN; i++) x[i] = (float)(i % 17) / 17.0f;

  jit_graph *mlp = NULL, *fma = NULL;
  enum { BIG = 16 * 1024 * 1024 };
  float *a = malloc(sizeof(float) * BIG), *b = malloc(sizeof(float) * BIG);
  float *c = malloc(sizeof(float) * BIG), *r = malloc(sizeof(float) * BIG);
  int rc = 1;
  if (!a || !b || !c || !r) {
    fprintf(stderr, "jitml_call_c: out of memory\n");
    goto done;
  }
  for (long i = 0; i < BIG; i++) {
    a[i] = (float)(i % 13) - 6.0f;
    b[i] = (float)(i % 7) * 0.25f;
    c[i] = (float)(i % 5) - 2.0f;
  }
  if ((s = jit_graph_create(ctx, "mlp", &mlp))) goto failed;
  int64_t n = jit_symbol(mlp, "N");
  jit_value xv = jit_input(mlp, "x", kF32, 2, (int64_t[]){n, IN});
  jit_value w1v = jit_input(mlp, "w1", kF32, 2, (int64_t[]){IN, HID});
  jit_value b1v = jit_input(mlp, "b1", kF32, 1, (int64_t[]){HID});
  jit_value w2v = jit_input(mlp, "w2", kF32, 2, (int64_t[]){HID, OUT});
  jit_value b2v = jit_input(mlp, "b2", kF32, 1, (int64_t[]){OUT});
  jit_value h = jit_gelu(mlp, jit_add(mlp, jit_matmul(mlp, xv, w1v), b1v));
  jit_output(mlp, jit_softmax(mlp, jit_add(mlp, jit_matmul(mlp, h, w2v), b2v), -1));
  if ((s = jit_graph_finalize(mlp))) goto failed;
  if ((s = jit_graph_create(ctx, "fma_relu", &fma))) goto failed;
  int64_t fn = jit_symbol(fma, "N");
  jit_value av = jit_input(fma, "a", kF32, 1, (int64_t[]){fn});
  jit_value bv = jit_input(fma, "b", kF32, 1, (int64_t[]){fn});
  jit_value cv = jit_input(fma, "c", kF32, 1, (int64_t[]){fn});
  jit_output(fma, jit_relu(fma, jit_add(fma, jit_mul(fma, av, bv), cv)));
  if ((s = jit_graph_finalize(fma))) goto failed;

  int64_t sx[2] = {1, IN}, sw1[2] = {IN, HID}, sb1[1] = {HID}, sw2[2] = {HID, OUT},
          sb2[1] = {OUT}, sy[2] = {1, OUT}, sbig[1] = {BIG};
  DLTensor ins[5] = {tensor(x, 2, sx), tensor(w1, 2, sw1), tensor(b1, 1, sb1),
                     tensor(w2, 2, sw2), tensor(b2, 1, sb2)};
  DLTensor out = tensor(y, 2, sy);
  rc = time_calls("mlp", mlp, ins, 5, &out, calls);
  DLTensor fin[3] = {tensor(a, 1, sbig), tensor(b, 1, sbig), tensor(c, 1, sbig)};
  DLTensor fout = tensor(r, 1, sbig);
  if (!rc) rc = time_calls("fma_relu", fma, fin, 3, &fout, calls / 1000 < 3 ? 3 : calls / 1000);
  goto done;
failed:
  rc = fail(s, "building the graphs");
done:
  jit_graph_destroy(mlp);
  jit_graph_destroy(fma);
  jit_context_destroy(ctx);
  free(x), free(w1), free(b1), free(w2), free(b2), free(y);
  free(a), free(b), free(c), free(r);
  return rc;
}
