//===--- graph_size.c - compile time against graph size -------------------===//
//
//   jitml_graph_size [--max-chain N] [--max-outputs N]
//
// Compiles, once each with the disk cache off, a chain of n elementwise adds
// (y = ((x + x) + x) + ...) and a graph of n outputs (y_i = x * c_i) for growing n, and
// prints each compile time with its time per node and the ratio of that to the
// smallest size's: a ratio near 1 is linear growth, a growing ratio is superlinear.
// Public API only; the kernels are checked against plain C on one run.
//
//===----------------------------------------------------------------------===//
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jitml.h>

static const DLDataType kF32 = {kDLFloat, 32, 1};

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void check(jit_status s, const char *what) {
  if (!s) return;
  fprintf(stderr, "jitml_graph_size: %s: %s\n", what, jit_status_message(s));
  exit(1);
}

// Builds the graph (`outputs`: n outputs, else a chain of n adds), compiles it for
// x [64], runs it once, checks it and returns the compile time in ms.
static double compile_ms(int n, int outputs) {
  jit_options o;
  jit_options_init(&o);
  o.cache_dir = "";
  o.shape_policy = JIT_SHAPE_POLICY_EXACT;
  o.num_threads = 1;
  jit_context *ctx = NULL;
  check(jit_context_create(&o, &ctx), "context");
  jit_graph *g = NULL;
  check(jit_graph_create(ctx, outputs ? "outputs" : "chain", &g), "graph");
  int64_t d[1] = {64};
  jit_value x = jit_input(g, "x", kF32, 1, d);
  if (outputs) {
    for (int i = 0; i < n; i++) jit_output(g, jit_mul(g, x, jit_scalar(g, i + 1, kF32)));
  } else {
    jit_value y = x;
    for (int i = 0; i < n; i++) y = jit_add(g, y, x);
    jit_output(g, y);
  }
  check(jit_graph_finalize(g), "finalize");
  float xs[64];
  for (int i = 0; i < 64; i++) xs[i] = (float)i / 64;
  DLTensor in = {.data = xs, .device = {kDLCPU, 0}, .ndim = 1, .dtype = kF32, .shape = d};
  int n_out = outputs ? n : 1;
  float *ys = malloc(sizeof(float) * 64 * (size_t)n_out);
  DLTensor *out = calloc((size_t)n_out, sizeof *out);
  for (int j = 0; j < n_out; j++)
    out[j] = (DLTensor){.data = ys + 64 * j, .device = {kDLCPU, 0}, .ndim = 1, .dtype = kF32,
                        .shape = d};
  double t0 = now_ms();
  check(jit_graph_compile(g, &in, 1), "compile");
  double ms = now_ms() - t0;
  check(jit_run(g, &in, 1, out, n_out), "run");
  for (int j = 0; j < n_out; j++)
    for (int i = 0; i < 64; i++) {
      float want = outputs ? xs[i] * (float)(j + 1) : xs[i] * (float)(n + 1);
      if (fabsf(ys[64 * j + i] - want) > 1e-3f * fabsf(want) + 1e-5f) {
        fprintf(stderr, "jitml_graph_size: wrong result at output %d element %d\n", j, i);
        exit(1);
      }
    }
  free(ys);
  free(out);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
  return ms;
}

static void series(const char *what, const int *sizes, int n_sizes, int max, int outputs) {
  printf("%-8s %8s %10s %12s %8s\n", what, "nodes", "compile ms", "us per node", "ratio");
  double base = 0;
  for (int i = 0; i < n_sizes && sizes[i] <= max; i++) {
    double ms = compile_ms(sizes[i], outputs);
    double per = 1e3 * ms / sizes[i];
    if (i == 0) base = per;
    printf("%-8s %8d %10.0f %12.1f %8.2f\n", what, sizes[i], ms, per, per / base);
    fflush(stdout);
  }
}

int main(int argc, char **argv) {
  int max_chain = 10000, max_outputs = 3000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--max-chain")) max_chain = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--max-outputs")) max_outputs = atoi(argv[i + 1]);
  }
  static const int chain[] = {500, 1000, 2000, 5000, 10000, 20000};
  static const int outs[] = {100, 250, 500, 1000, 2000, 3000, 4000};
  series("chain", chain, 6, max_chain, 0);
  series("outputs", outs, 7, max_outputs, 1);
  return 0;
}
