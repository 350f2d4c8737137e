//===--- mlp.c - a two-layer MLP with a symbolic batch size -----------------===//
//
// Builds   y = softmax(gelu(x W1 + b1) W2 + b2)   once, with the batch size N left
// symbolic, and runs it for N = 1, 7 and 64. Under the default shape policy (AUTO) the
// first jit_run compiles a kernel specialized for N = 1 (or loads it from the disk
// cache, if an earlier process made it) and the graph's generic kernel in the
// background; N = 7 and 64 run on the generic kernel (N = 7 may wait for it to finish
// compiling); the second call of each finds its kernel in memory; a second context,
// standing in for a new process, loads kernels from the disk cache. Every result is
// checked against a plain-C reference.
//
//   build/examples/mlp
//
// Exits 0 when every status is OK and every max |error| is within 1e-4.
//
//===----------------------------------------------------------------------===//
#define _POSIX_C_SOURCE 199309L  // clock_gettime in strict C11

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "jitml.h"

enum { IN = 784, HIDDEN = 256, OUT = 10 };

static const double kTolerance = 1e-4;

//===--- Helpers -------------------------------------------------------===//

// Prints a failed status and frees it. Returns true when `status` is OK (NULL), so a
// call site reads `if (!ok(jit_run(...), "jit_run")) goto done;`.
static bool ok(jit_status status, const char *what) {
  if (status == NULL) return true;
  fprintf(stderr, "mlp: %s failed: %s: %s\n", what,
          jit_status_code_name(jit_status_get_code(status)),
          jit_status_message(status));
  jit_status_free(status);
  return false;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

// A fixed xorshift generator, so every run (and every machine) sees the same weights
// and the same inputs: a mismatch can be reproduced.
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static float uniform(float lo, float hi) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  // The top 24 bits give a float in [0, 1) with every value exactly representable.
  float u = (float)(rng_state >> 40) * (1.0f / 16777216.0f);
  return lo + (hi - lo) * u;
}

static float *random_array(size_t n, float lo, float hi) {
  float *a = malloc(n * sizeof *a);
  if (a == NULL) return NULL;
  for (size_t i = 0; i < n; ++i) a[i] = uniform(lo, hi);
  return a;
}

// A dense row-major f32 CPU tensor. DLPack 0.6 wants a non-const shape pointer, so the
// caller keeps the dims array alive as long as the tensor.
static DLTensor f32_tensor(float *data, int ndim, int64_t *shape) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = kDLCPU;
  t.device.device_id = 0;
  t.ndim = ndim;
  t.dtype.code = kDLFloat;
  t.dtype.bits = 32;
  t.dtype.lanes = 1;
  t.shape = shape;
  t.strides = NULL;  // dense row-major
  t.byte_offset = 0;
  return t;
}

//===--- Plain-C reference ---------------------------------------------===//

// The same formula as jit_gelu (tanh form), in double so the reference is the more
// accurate side of the comparison.
static double gelu_ref(double x) {
  const double k = 0.7978845608028654;  // sqrt(2 / pi)
  return 0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x)));
}

// y[n, OUT] = softmax(gelu(x W1 + b1) W2 + b2), row by row, with plain loops.
static void mlp_ref(const float *x, const float *w1, const float *b1, const float *w2,
                    const float *b2, int64_t n, float *y) {
  double h[HIDDEN];
  double z[OUT];
  for (int64_t r = 0; r < n; ++r) {
    const float *xr = x + r * IN;
    for (int j = 0; j < HIDDEN; ++j) {
      double acc = b1[j];
      for (int k = 0; k < IN; ++k) acc += (double)xr[k] * w1[k * HIDDEN + j];
      h[j] = gelu_ref(acc);
    }
    double max = -INFINITY;
    for (int j = 0; j < OUT; ++j) {
      double acc = b2[j];
      for (int k = 0; k < HIDDEN; ++k) acc += h[k] * w2[k * OUT + j];
      z[j] = acc;
      if (acc > max) max = acc;
    }
    // Subtracting the max keeps exp in range, as jit_softmax does.
    double sum = 0.0;
    for (int j = 0; j < OUT; ++j) {
      z[j] = exp(z[j] - max);
      sum += z[j];
    }
    for (int j = 0; j < OUT; ++j) y[r * OUT + j] = (float)(z[j] / sum);
  }
}

//===--- The graph -----------------------------------------------------===//

// Builds the MLP graph. Builder calls record the first error in the graph, so there
// is nothing to check until jit_graph_finalize, which reports it.
static jit_status build_mlp(jit_context *ctx, jit_graph **out_graph) {
  *out_graph = NULL;
  jit_graph *g = NULL;
  jit_status s = jit_graph_create(ctx, "mlp", &g);
  if (s) return s;

  const DLDataType f32 = {kDLFloat, 32, 1};
  const int64_t n = jit_symbol(g, "N");  // the batch size, bound at each jit_run
  const int64_t x_dims[] = {n, IN};
  const int64_t w1_dims[] = {IN, HIDDEN};
  const int64_t b1_dims[] = {HIDDEN};
  const int64_t w2_dims[] = {HIDDEN, OUT};
  const int64_t b2_dims[] = {OUT};

  // Inputs are numbered in this order; run_one passes its tensors in the same order.
  jit_value x = jit_input(g, "x", f32, 2, x_dims);
  jit_value w1 = jit_input(g, "w1", f32, 2, w1_dims);
  jit_value b1 = jit_input(g, "b1", f32, 1, b1_dims);
  jit_value w2 = jit_input(g, "w2", f32, 2, w2_dims);
  jit_value b2 = jit_input(g, "b2", f32, 1, b2_dims);

  // [N, 256] + [256] broadcasts the bias over the batch.
  jit_value h = jit_gelu(g, jit_add(g, jit_matmul(g, x, w1), b1));
  jit_value y = jit_softmax(g, jit_add(g, jit_matmul(g, h, w2), b2), -1);
  jit_output(g, y);

  s = jit_graph_finalize(g);
  if (s) {
    jit_graph_destroy(g);
    return s;
  }
  *out_graph = g;
  return NULL;
}

//===--- One batch size ------------------------------------------------===//

typedef struct weights {
  float *w1, *b1, *w2, *b2;
} weights;

// Where the last kernel came from, from the change in a context's stats.
static const char *source(const jit_stats *before, const jit_stats *after) {
  if (after->compiles > before->compiles) return "compiled";
  if (after->disk_hits > before->disk_hits) return "disk";
  return "memory";
}

static bool stats_of(jit_context *ctx, jit_stats *st) {
  memset(st, 0, sizeof *st);
  st->struct_size = sizeof *st;
  return ok(jit_context_stats(ctx, st), "jit_context_stats");
}

// Runs the graph twice for batch size `n`, then once in `fresh` (the same graph in
// another context), checks the result against the reference and prints one line.
// Returns false on a failed status or a mismatch.
static bool run_one(jit_graph *graph, jit_graph *fresh, const weights *w, int64_t n) {
  bool passed = false;
  float *x = random_array((size_t)n * IN, -1.0f, 1.0f);
  float *y = NULL;
  float *y_ref = malloc((size_t)n * OUT * sizeof *y_ref);
  if (x == NULL || y_ref == NULL) {
    fprintf(stderr, "mlp: out of memory\n");
    goto done;
  }

  int64_t x_shape[] = {n, IN};
  int64_t w1_shape[] = {IN, HIDDEN};
  int64_t b1_shape[] = {HIDDEN};
  int64_t w2_shape[] = {HIDDEN, OUT};
  int64_t b2_shape[] = {OUT};
  const DLTensor inputs[] = {
      f32_tensor(x, 2, x_shape),       f32_tensor(w->w1, 2, w1_shape),
      f32_tensor(w->b1, 1, b1_shape),  f32_tensor(w->w2, 2, w2_shape),
      f32_tensor(w->b2, 1, b2_shape),
  };
  const int n_inputs = (int)(sizeof inputs / sizeof inputs[0]);

  // Ask the library for the output shape rather than assuming [n, OUT]: that is what
  // a caller with a less obvious graph does.
  int rank = 0;
  int64_t dims[JIT_MAX_RANK];
  if (!ok(jit_output_shape(graph, inputs, n_inputs, 0, &rank, dims),
          "jit_output_shape"))
    goto done;
  size_t count = 1;
  for (int i = 0; i < rank; ++i) count *= (size_t)dims[i];
  if (count != (size_t)n * OUT) {
    fprintf(stderr, "mlp: N=%lld: unexpected output size %zu\n", (long long)n, count);
    goto done;
  }
  y = malloc(count * sizeof *y);
  if (y == NULL) {
    fprintf(stderr, "mlp: out of memory\n");
    goto done;
  }
  const DLTensor outputs[] = {f32_tensor(y, rank, dims)};

  // The first call for this N binds N, misses the kernel table and compiles (or
  // loads the kernel from the disk cache).
  jit_stats before, after;
  jit_context *ctx = jit_graph_context(graph);
  if (!stats_of(ctx, &before)) goto done;
  double t0 = now_ms();
  if (!ok(jit_run(graph, inputs, n_inputs, outputs, 1), "jit_run (first)")) goto done;
  double first_ms = now_ms() - t0;
  if (!stats_of(ctx, &after)) goto done;
  const char *first_from = source(&before, &after);

  // The second call finds the kernel for this N already loaded.
  t0 = now_ms();
  if (!ok(jit_run(graph, inputs, n_inputs, outputs, 1), "jit_run (second)")) goto done;
  double second_ms = now_ms() - t0;

  // A new context has an empty kernel table, like a new process: its first call
  // loads the kernel from the disk cache instead of compiling it.
  jit_context *fresh_ctx = jit_graph_context(fresh);
  if (!stats_of(fresh_ctx, &before)) goto done;
  t0 = now_ms();
  if (!ok(jit_run(fresh, inputs, n_inputs, outputs, 1), "jit_run (new context)"))
    goto done;
  double fresh_ms = now_ms() - t0;
  if (!stats_of(fresh_ctx, &after)) goto done;
  const char *fresh_from = source(&before, &after);

  mlp_ref(x, w->w1, w->b1, w->w2, w->b2, n, y_ref);
  // Each softmax row sums to 1, so the checksum should be close to N.
  double checksum = 0.0;
  double max_err = 0.0;
  for (size_t i = 0; i < count; ++i) {
    checksum += y[i];
    double err = fabs((double)y[i] - (double)y_ref[i]);
    // A NaN compares false with everything: count it as an infinite error.
    if (!(err <= max_err)) max_err = isnan(err) ? INFINITY : err;
  }
  passed = max_err <= kTolerance;
  printf("N=%-4lld first call %8.2f ms (%s)   second call %7.3f ms (memory)   "
         "new context %7.2f ms (%s)   checksum %.6f   max|err| %.1e  %s\n",
         (long long)n, first_ms, first_from, second_ms, fresh_ms, fresh_from, checksum,
         max_err, passed ? "OK" : "MISMATCH");

done:
  free(x);
  free(y);
  free(y_ref);
  return passed;
}

//===--- main ----------------------------------------------------------===//

int main(int argc, char **argv) {
  // `--device vulkan` (or cuda, vulkan:1, ...) runs the graph there: the host tensors
  // are uploaded, the kernels run on the device, the outputs come back.
  jit_options options;
  jit_options_init(&options);
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--device") == 0 && i + 1 < argc) {
      options.device = argv[++i];
    } else {
      fprintf(stderr, "usage: %s [--device cpu|vulkan[:N]|cuda[:N]]\n", argv[0]);
      return 2;
    }
  }

  int exit_code = 1;
  jit_context *ctx = NULL, *ctx2 = NULL;
  jit_graph *graph = NULL, *graph2 = NULL;
  weights w = {NULL, NULL, NULL, NULL};

  printf("libjitml %s\n", jit_version());

  // Small weights keep the activations in gelu's interesting range and the logits
  // moderate, so the softmax is not just one-hot.
  w.w1 = random_array((size_t)IN * HIDDEN, -0.05f, 0.05f);
  w.b1 = random_array(HIDDEN, -0.05f, 0.05f);
  w.w2 = random_array((size_t)HIDDEN * OUT, -0.05f, 0.05f);
  w.b2 = random_array(OUT, -0.05f, 0.05f);
  if (w.w1 == NULL || w.b1 == NULL || w.w2 == NULL || w.b2 == NULL) {
    fprintf(stderr, "mlp: out of memory\n");
    goto done;
  }

  if (!ok(jit_context_create(&options, &ctx), "jit_context_create")) goto done;
  if (!ok(build_mlp(ctx, &graph), "building the graph")) goto done;
  if (!ok(jit_context_create(&options, &ctx2), "jit_context_create")) goto done;
  if (!ok(build_mlp(ctx2, &graph2), "building the graph")) goto done;
  const char *reason = NULL;
  const char *cache = jit_cache_dir(ctx, &reason);
  printf("device: %s   disk cache: %s\n", options.device ? options.device : "cpu",
         cache[0] ? cache : reason ? reason : "off");

  static const int64_t batch_sizes[] = {1, 7, 64};
  bool all_passed = true;
  for (size_t i = 0; i < sizeof batch_sizes / sizeof batch_sizes[0]; ++i) {
    // Keep going after a failure so one run shows every batch size's result.
    if (!run_one(graph, graph2, &w, batch_sizes[i])) all_passed = false;
  }

  jit_stats stats;
  memset(&stats, 0, sizeof stats);
  stats.struct_size = sizeof stats;
  if (!ok(jit_context_stats(ctx, &stats), "jit_context_stats")) goto done;
  printf("stats: runs %llu   compiles %llu (%.1f ms)   disk hits %llu (%.1f ms)   "
         "memory hits %llu   misses %llu   kernels %llu\n",
         (unsigned long long)stats.runs, (unsigned long long)stats.compiles,
         stats.compile_ms, (unsigned long long)stats.disk_hits, stats.load_ms,
         (unsigned long long)stats.memory_hits, (unsigned long long)stats.misses,
         (unsigned long long)stats.kernels);

  exit_code = all_passed ? 0 : 1;

done:
  // Graphs before their context, as jit_context_destroy requires.
  jit_graph_destroy(graph);
  jit_graph_destroy(graph2);
  jit_context_destroy(ctx);
  jit_context_destroy(ctx2);
  free(w.w1);
  free(w.b1);
  free(w.w2);
  free(w.b2);
  return exit_code;
}
