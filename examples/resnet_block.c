//===--- resnet_block.c - a ResNet basic block, batch and image size symbolic ---===//
//
// The basic block of ResNet-18/34 (stride 1, no downsampling), NCHW, built with the C
// API with the batch N and the image height H and width W left symbolic:
//
//   y1 = relu(conv3x3(x, W1') + b1')             x: [N, C, H, W], pad 1
//   y  = relu(conv3x3(y1, W2') + b2' + x)
//
// where each batch normalization (gamma, beta, running mean and variance, eps 1e-5)
// is folded into the convolution before it, as inference runtimes do:
//   W' = W * gamma / sqrt(var + eps)   (per output channel)
//   b' = beta - mean * gamma / sqrt(var + eps)
// Weights come from a fixed generator (no downloads). Each (N, H, W) runs twice and
// is checked against a plain-C reference (in double) that applies the batch norms
// unfolded, so the folding is checked too.
//
//   build/examples/resnet_block            C = 64 (ResNet-18's first stage)
//   build/examples/resnet_block --small    C = 8 (what CTest runs)
//
// Exits 0 when every status is OK and every max |error| is within 1e-3.
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

static const double kTolerance = 1e-3;
static const double kEps = 1e-5;
static const DLDataType kF32 = {kDLFloat, 32, 1};

static int C = 64;

static bool ok(jit_status status, const char *what) {
  if (status == NULL) return true;
  fprintf(stderr, "resnet_block: %s failed: %s: %s\n", what,
          jit_status_code_name(jit_status_get_code(status)), jit_status_message(status));
  jit_status_free(status);
  return false;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static float uniform(float lo, float hi) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return lo + (hi - lo) * (float)(rng_state >> 40) / (float)(1 << 24);
}

static float *random_array(int64_t n, float lo, float hi) {
  float *a = malloc(sizeof(float) * (size_t)n);
  for (int64_t i = 0; a && i < n; i++) a[i] = uniform(lo, hi);
  return a;
}

static DLTensor tensor(float *data, int rank, int64_t *shape) {
  return (DLTensor){.data = data, .device = {kDLCPU, 0}, .ndim = rank, .dtype = kF32,
                    .shape = shape};
}

//===--- Weights --------------------------------------------------------===//

// One conv3x3 + batch norm: the conv weight [C, C, 3, 3] and the norm's parameters,
// and the folded weight and bias the graph takes.
typedef struct conv_bn {
  float *w, *gamma, *beta, *mean, *var;
  float *wf, *bf;
} conv_bn;

static bool make_conv_bn(conv_bn *p) {
  float scale = 1.0f / sqrtf(9.0f * (float)C);  // keeps activations around 1
  p->w = random_array((int64_t)C * C * 9, -scale, scale);
  p->gamma = random_array(C, 0.5f, 1.5f);
  p->beta = random_array(C, -0.2f, 0.2f);
  p->mean = random_array(C, -0.2f, 0.2f);
  p->var = random_array(C, 0.5f, 2.0f);
  p->wf = malloc(sizeof(float) * (size_t)C * C * 9);
  p->bf = malloc(sizeof(float) * (size_t)C);
  if (!p->w || !p->gamma || !p->beta || !p->mean || !p->var || !p->wf || !p->bf) return false;
  for (int f = 0; f < C; f++) {
    double s = p->gamma[f] / sqrt(p->var[f] + kEps);
    for (int i = 0; i < C * 9; i++) p->wf[f * C * 9 + i] = (float)(p->w[f * C * 9 + i] * s);
    p->bf[f] = (float)(p->beta[f] - p->mean[f] * s);
  }
  return true;
}

static void free_conv_bn(conv_bn *p) {
  free(p->w), free(p->gamma), free(p->beta), free(p->mean), free(p->var);
  free(p->wf), free(p->bf);
}

//===--- The graph ------------------------------------------------------===//

// Inputs: x, then the folded weight and bias [C, 1, 1] of each conv.
static jit_status build(jit_context *ctx, jit_graph **out) {
  jit_graph *g = NULL;
  jit_status s = jit_graph_create(ctx, "resnet_block", &g);
  if (s) return s;
  int64_t dx[4] = {jit_symbol(g, "N"), C, jit_symbol(g, "H"), jit_symbol(g, "W")};
  int64_t dw[4] = {C, C, 3, 3}, db[3] = {C, 1, 1};
  jit_window_params p;
  jit_window_params_init(&p);
  for (int i = 0; i < 4; i++) p.padding[i] = 1;
  jit_value x = jit_input(g, "x", kF32, 4, dx);
  jit_value w1 = jit_weight(g, "w1", kF32, 4, dw), b1 = jit_weight(g, "b1", kF32, 3, db);
  jit_value w2 = jit_weight(g, "w2", kF32, 4, dw), b2 = jit_weight(g, "b2", kF32, 3, db);
  jit_value y1 = jit_relu(g, jit_add(g, jit_conv2d(g, x, w1, &p), b1));
  jit_value y2 = jit_add(g, jit_add(g, jit_conv2d(g, y1, w2, &p), b2), x);
  jit_output(g, jit_relu(g, y2));
  s = jit_graph_finalize(g);
  if (s) {
    jit_graph_destroy(g);
    return s;
  }
  *out = g;
  return NULL;
}

//===--- Plain-C reference ------------------------------------------------===//

// y = batch_norm(conv3x3(x, p->w)) (+ res), relu; x, y [N, C, H, W] in double.
static void ref_conv_bn(const conv_bn *p, const double *x, int64_t N, int64_t H, int64_t W,
                        const double *res, double *y) {
  for (int64_t n = 0; n < N; n++)
    for (int f = 0; f < C; f++) {
      double s = p->gamma[f] / sqrt(p->var[f] + kEps);
      for (int64_t h = 0; h < H; h++)
        for (int64_t w = 0; w < W; w++) {
          double acc = 0.0;
          for (int c = 0; c < C; c++)
            for (int kh = 0; kh < 3; kh++)
              for (int kw = 0; kw < 3; kw++) {
                int64_t ih = h + kh - 1, iw = w + kw - 1;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                acc += x[((n * C + c) * H + ih) * W + iw] *
                       p->w[((f * C + c) * 3 + kh) * 3 + kw];
              }
          int64_t o = ((n * C + f) * H + h) * W + w;
          double v = (acc - p->mean[f]) * s + p->beta[f];
          if (res) v += res[o];
          y[o] = v > 0 ? v : 0;
        }
    }
}

static bool reference(const conv_bn *p, const float *x, int64_t N, int64_t H, int64_t W,
                      float *y) {
  int64_t n = N * C * H * W;
  double *xd = malloc(sizeof(double) * (size_t)n), *y1 = malloc(sizeof(double) * (size_t)n),
         *y2 = malloc(sizeof(double) * (size_t)n);
  bool good = xd && y1 && y2;
  if (good) {
    for (int64_t i = 0; i < n; i++) xd[i] = x[i];
    ref_conv_bn(&p[0], xd, N, H, W, NULL, y1);
    ref_conv_bn(&p[1], y1, N, H, W, xd, y2);
    for (int64_t i = 0; i < n; i++) y[i] = (float)y2[i];
  }
  free(xd), free(y1), free(y2);
  return good;
}

//===--- Running ----------------------------------------------------------===//

static bool run_one(jit_graph *g, const conv_bn *p, int64_t N, int64_t H, int64_t W) {
  int64_t n = N * C * H * W;
  float *x = random_array(n, -1.0f, 1.0f), *y = malloc(sizeof(float) * (size_t)n),
        *want = malloc(sizeof(float) * (size_t)n);
  bool good = x && y && want && reference(p, x, N, H, W, want);
  int64_t dx[4] = {N, C, H, W}, dw[4] = {C, C, 3, 3}, db[3] = {C, 1, 1};
  DLTensor ins[5] = {tensor(x, 4, dx), tensor(p[0].wf, 4, dw), tensor(p[0].bf, 3, db),
                     tensor(p[1].wf, 4, dw), tensor(p[1].bf, 3, db)};
  DLTensor out = tensor(y, 4, dx);
  double ms[2] = {0, 0};
  for (int call = 0; call < 2 && good; call++) {
    double t0 = now_ms();
    good = ok(jit_run(g, ins, 5, &out, 1), "jit_run");
    ms[call] = now_ms() - t0;
  }
  double err = 0.0, sum = 0.0;
  for (int64_t i = 0; good && i < n; i++) {
    double d = fabs((double)y[i] - want[i]);
    if (!(d <= err)) err = d;  // NaN shows as NaN
    sum += y[i];
  }
  if (good)
    printf("N=%-2lld H=%-3lld W=%-3lld first %8.1f ms  second %8.2f ms  checksum %12.4f  "
           "max |err| %.2e\n",
           (long long)N, (long long)H, (long long)W, ms[0], ms[1], sum, err);
  if (good && !(err <= kTolerance)) {
    fprintf(stderr, "resnet_block: N=%lld H=%lld W=%lld: max |err| %g over %g\n",
            (long long)N, (long long)H, (long long)W, err, kTolerance);
    good = false;
  }
  free(x), free(y), free(want);
  return good;
}

int main(int argc, char **argv) {
  bool small = argc > 1 && strcmp(argv[1], "--small") == 0;
  if (argc > 1 && !small) {
    fprintf(stderr, "usage: resnet_block [--small]\n");
    return 2;
  }
  if (small) C = 8;
  conv_bn p[2] = {{0}, {0}};
  jit_context *ctx = NULL;
  jit_graph *g = NULL;
  bool good = make_conv_bn(&p[0]) && make_conv_bn(&p[1]) &&
              ok(jit_context_create(NULL, &ctx), "jit_context_create") &&
              ok(build(ctx, &g), "building the graph");
  printf("ResNet basic block, C = %d, NCHW, batch norm folded\n", C);
  // (N, H, W): 1 and primes, ResNet's stage sizes (56 for C = 64; small for --small).
  static const int64_t full[][3] = {{1, 56, 56}, {2, 28, 28}, {1, 7, 13}};
  static const int64_t part[][3] = {{1, 1, 1}, {1, 8, 8}, {2, 7, 9}, {3, 13, 5}};
  const int64_t(*shapes)[3] = small ? part : full;
  int n_shapes = small ? 4 : 3;
  for (int i = 0; i < n_shapes && good; i++)
    good = run_one(g, p, shapes[i][0], shapes[i][1], shapes[i][2]);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
  free_conv_bn(&p[0]);
  free_conv_bn(&p[1]);
  printf("%s\n", good ? "OK" : "FAILED");
  return good ? 0 : 1;
}
