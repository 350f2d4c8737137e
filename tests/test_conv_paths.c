//===--- test_conv_paths.c - the CPU's blocked im2col convolutions vs plain C ===//
//
// An exact NCHW convolution whose im2col columns are over a quarter of L2 (at most
// 512 KiB) runs in blocks of output rows: a loop (an scf.forall with threads) whose
// steps copy one block's windows and multiply W by them (lowering/emit_window.c).
// These tests land on that path (checked in the emitted IR) with strides, dilations,
// uneven padding, kernels that are not square, prime sizes, batches, one filter row
// block per thread or several, f32 and f16, at 1 and 2 threads, and compare with the
// double-accumulating reference of ref.c. CTest pins the L2 (JITML_CPU_L2) so that
// the blocks are the same on every host; a second leg asks as a host with 512 KiB.
//
//===----------------------------------------------------------------------===//
#define _XOPEN_SOURCE 700  // nftw, mkdtemp

#include "paths.h"

typedef struct conv_case {
  const char *name;
  ref_window w;
  int64_t c, f, kh, kw;  // channels, filters, kernel
  int64_t h, wd;         // input height, width
  bool blocked;          // f32 columns over 512 KiB: blocked whatever the pinned L2
} conv_case;

#define W_(s0, s1, p0, p1, p2, p3, d0, d1) {0, 0, 0, {s0, s1}, {p0, p1, p2, p3}, {d0, d1}, 1, 1}

static const conv_case kCases[] = {
    // ResNet's 3x3 with padding 1, smaller: K = 144, 34x36 out (34 = 2 x 17 rows).
    {"3x3 pad 1", W_(1, 1, 1, 1, 1, 1, 1, 1), 16, 24, 3, 3, 34, 36, true},
    // 5x3, stride (2, 1), dilation (2, 1), uneven padding, 5 filters, prime input
    // sizes: 63x68 out (63 = 3^2 x 7 rows), K = 120.
    {"5x3 stride 2x1 dilation 2x1", W_(2, 1, 1, 2, 0, 3, 2, 1), 8, 5, 5, 3, 131, 67, true},
    // Stride 2 both ways: 47x64 out (47 rows, a prime: one row a block), K = 63.
    {"3x3 stride 2", W_(2, 2, 1, 1, 1, 1, 1, 1), 7, 9, 3, 3, 94, 128, true},
    // Columns of 36 KiB: whole, no loop.
    {"3x3 small", W_(1, 1, 1, 1, 1, 1, 1, 1), 4, 6, 3, 3, 23, 25, false},
};

// The convolution of case `cc` with batch n at `threads`, against ref_conv2d; and
// whether its kernel has the block loop (where `cc` says it must).
static void check_case(const conv_case *cc, int64_t n, int threads, DLDataType dt) {
  bool f16 = tu_is_f16(dt);
  ref_rng rng;
  ref_rng_seed(&rng, 5000 + (uint64_t)n * 3 + (uint64_t)threads + (f16 ? 17u : 0u));
  dump_begin();
  jit_context *ctx = ctx_threads(threads);
  jit_graph *g = tu_graph(ctx, "conv");
  int64_t dx[4] = {n, cc->c, cc->h, cc->wd}, dw[4] = {cc->f, cc->c, cc->kh, cc->kw}, dy[4];
  jit_window_params p;
  jit_window_params_init(&p);
  memcpy(p.stride, cc->w.stride, sizeof p.stride);
  memcpy(p.padding, cc->w.pad, sizeof p.padding);
  memcpy(p.dilation, cc->w.dilation, sizeof p.dilation);
  jit_value x = jit_input(g, "x", dt, 4, dx), w = jit_input(g, "w", dt, 4, dw);
  jit_output(g, jit_conv2d(g, x, w, &p));
  TU_OK(jit_graph_finalize(g));
  ref_window_dims(&cc->w, dx, dw, dy);
  int64_t nx = ref_numel(4, dx), nw = ref_numel(4, dw), ny = ref_numel(4, dy);
  float *xv = tu_malloc((size_t)nx * 4), *wv = tu_malloc((size_t)nw * 4),
        *want = tu_malloc((size_t)ny * 4);
  ref_rng_fill_signed(&rng, xv, nx);
  ref_rng_fill_signed(&rng, wv, nw);
  void *px = tu_input_data(dt, xv, nx), *pw = tu_input_data(dt, wv, nw);
  ref_conv2d(&cc->w, xv, dx, wv, dw, want);
  if (f16) ref_round_f16_array(want, ny);
  DLTensor ins[2] = {tu_tensor(px, dt, 4, dx), tu_tensor(pw, dt, 4, dw)};
  char what[160];
  snprintf(what, sizeof what, "%s %s N=%lld threads=%d", cc->name, f16 ? "f16" : "f32",
           (long long)n, threads);
  // Sums of up to 144 products of values in [-1, 1].
  double rtol = f16 ? 4e-3 : 2e-5, atol = f16 ? 4e-3 : 1e-5;
  tu_run_check(g, ins, 2, dt, 4, dy, want, rtol, atol, NULL, what);
  // The emitted kernel: the block loop, shared by the threads where they split.
  bool split = threads > 1 && kThreadsSplit;
  bool loop = dump_has("-00-graph.mlir", split ? "scf.forall" : "scf.for");
  if (cc->blocked && !f16)
    cr_expect(loop, "%s: no block loop (%s) in the emitted kernel", what,
              split ? "scf.forall" : "scf.for");
  if (!cc->blocked)
    cr_expect(!dump_has("-00-graph.mlir", "scf.for"), "%s: a block loop for columns that fit",
              what);
  free(xv), free(wv), free(want), free(px), free(pw);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
  dump_end();
}

static void check_all(int i, DLDataType dt) {
  static const int64_t batches[] = {1, 3};
  for (int b = 0; b < 2; b++)
    for (int threads = 1; threads <= 2; threads++) check_case(&kCases[i], batches[b], threads, dt);
}

#define CONV_TESTS(i, name)                                      \
  Test(conv_paths, name##_f32) { check_all(i, TU_F32); }         \
  Test(conv_paths, name##_f16) { check_all(i, TU_F16); }

CONV_TESTS(0, pad1)
CONV_TESTS(1, strided_dilated_uneven)
CONV_TESTS(2, stride2_prime_rows)
CONV_TESTS(3, whole)
