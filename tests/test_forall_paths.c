//===--- test_forall_paths.c - loops the emitter writes for threads, vs plain C ===//
//
// The CPU's exact kernels have two loops of their own that threads share (scf.forall,
// what is inside planned for one thread): the blocks of a convolution's im2col
// columns, and the heads of blocked attention.
//
// An exact NCHW convolution whose im2col columns are over a quarter of L2 (at most
// 512 KiB) runs in blocks of output rows: a loop (an scf.forall with threads) whose
// steps copy one block's windows and multiply W by them (lowering/emit_window.c).
// These tests land on that path (checked in the emitted IR) with strides, dilations,
// uneven padding, kernels that are not square, prime sizes, batches, one filter row
// block per thread or several, f32 and f16, at 1 and 2 threads, and compare with the
// double-accumulating reference of ref.c. CTest pins the L2 (JITML_CPU_L2) so that
// the blocks are the same on every host; a second leg asks as a host with 512 KiB.
// 3x3 stride-1 convolutions with 16 channels and filters or more over 784 output
// positions or more go as Winograd F(2, 3) over rows instead (lowering/
// emit_winograd.c: batched matmuls, no block loop), where its transformed rows fit in
// L2 (else im2col): odd and even output rows, padding on some sides or none, channels
// that are not a multiple of the vector, and a batch whose rows do not fit.
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
  bool threads_only;     // blocked only in twice the budget: at 2 threads, 2 MiB L2
  bool winograd;         // as Winograd F(2, 3) where it fits L2 (winograd_expected)
  bool images;           // past a 2 MiB L2 in batches of 3 and 4: one image at a time
} conv_case;

#define W_(s0, s1, p0, p1, p2, p3, d0, d1) {0, 0, 0, {s0, s1}, {p0, p1, p2, p3}, {d0, d1}, 1, 1}

static const conv_case kCases[] = {
    // A 3x3 with padding 1 and 8 channels (too few for Winograd): K = 72, 66x72 out
    // (66 = 2 x 3 x 11 rows).
    {"3x3 pad 1", W_(1, 1, 1, 1, 1, 1, 1, 1), 8, 24, 3, 3, 66, 72, true, false, false, false},
    // 5x3, stride (2, 1), dilation (2, 1), uneven padding, 5 filters, prime input
    // sizes: 63x68 out (63 = 3^2 x 7 rows), K = 120.
    {"5x3 stride 2x1 dilation 2x1", W_(2, 1, 1, 2, 0, 3, 2, 1), 8, 5, 5, 3, 131, 67, true, false, false, false},
    // Stride 2 both ways: 47x64 out (47 rows, a prime: one row a block), K = 63.
    {"3x3 stride 2", W_(2, 2, 1, 1, 1, 1, 1, 1), 7, 9, 3, 3, 94, 128, true, false, false, false},
    // Columns of 36 KiB: whole, no loop.
    {"3x3 small", W_(1, 1, 1, 1, 1, 1, 1, 1), 4, 6, 3, 3, 23, 25, false, false, false, false},
    // ResNet's 256 channels at 14x14 (K = 2304): a block of 7 rows is 0.9 MB, over
    // the 512 KiB budget, and fewer rows make under 64 columns: blocks only where
    // threads double the budget.
    {"3x3 256 channels 14x14", W_(1, 1, 1, 1, 1, 1, 1, 1), 256, 8, 3, 3, 14, 14, false, true, false, false},
    // Winograd F(4, 3): 29 x 31 out (rows in tiles of 4: three zero rows more below),
    // no padding, 17 channels and 19 filters; 28 x 33 out with padding on two sides
    // only.
    {"winograd odd rows", W_(1, 1, 0, 0, 0, 0, 1, 1), 17, 19, 3, 3, 31, 33, false, false, true, false},
    {"winograd uneven pad", W_(1, 1, 2, 0, 1, 0, 1, 1), 32, 16, 3, 3, 28, 34, false, false,
     true, false},
    // Under 784 positions (7 x 7): im2col, whole (28 KiB of columns: whole under any
    // budget down to a 128 KiB L2's, so on any host).
    {"3x3 7x7", W_(1, 1, 1, 1, 1, 1, 1, 1), 16, 16, 3, 3, 7, 7, false, false, false, false},
    // ResNet's 3x3 with padding 1, smaller: K = 144, 34x36 out (34 = 2 x 17 rows).
    {"winograd pad 1", W_(1, 1, 1, 1, 1, 1, 1, 1), 16, 24, 3, 3, 34, 36, false, false, true, false},
    // F(2, 3), where tiles of 4 rows would take as many transformed rows or more: one
    // pair of output rows (2 x 398 out, no padding); "five rows" below.
    {"winograd one row pair", W_(1, 1, 0, 0, 0, 0, 1, 1), 16, 16, 3, 3, 4, 400, false, false,
     true, false},
    // 64 x 200 out: one image's transformed rows take 1.2 MiB, three images' 3.7 MiB:
    // under a 2 MiB L2 one image at a time, under 512 KiB im2col.
    {"winograd past L2", W_(1, 1, 1, 1, 1, 1, 1, 1), 16, 16, 3, 3, 64, 200, false, false,
     true, true},
    // 63 x 100 out (rows in tiles of 4, the last with one zero row): one image's 627
    // KiB, three images' 1.8 MiB (the batch at once under a 2 MiB L2), four images'
    // 2.4 MiB (one at a time).
    {"winograd odd rows past L2", W_(1, 1, 1, 1, 1, 1, 1, 1), 16, 16, 3, 3, 63, 100, false,
     false, true, true},
    // F(2, 3) again: 5 x 160 out (three pairs of rows, the last with a zero row), 20
    // filters.
    {"winograd five rows", W_(1, 1, 0, 0, 0, 0, 1, 1), 16, 20, 3, 3, 7, 162, false, false,
     true, false},
};

// Output rows per Winograd tile as emit_winograd.c picks them: F(4, 3) where it takes
// fewer transformed rows over OH than F(2, 3) (6 per 4 output rows against 4 per 2).
static int winograd_rows(int64_t oh) { return 6 * ((oh + 3) / 4) < 4 * ((oh + 1) / 2) ? 4 : 2; }

// Whether case `cc` with batch n goes as Winograd, as emit_winograd.c decides: 1 for
// the batch at once, where its rows U [m + 2, C, N tH Wp] and sums M [m + 2, F, N tH Wp] (f32)
// fit the L2 that JITML_CPU_L2 pins (CTest: 2M, 512K), or 2 MiB where that is less
// (emit_winograd.c's floor); 2 for one image at a time,
// where only one image's do; else 0. -1 where no L2 is pinned (a hand run) and they
// take over 256 KiB: the host's own L2 decides, and only the numbers are checked.
static int winograd_expected(const conv_case *cc, int64_t n, int64_t oh, int64_t ow) {
  if (!cc->winograd) return 0;
  int m = winograd_rows(oh);
  int64_t q = ((oh + m - 1) / m) * (ow + 2), cf = cc->c > cc->f ? cc->c : cc->f;
  int64_t image = (m + 2) * cf * q * 4, l2 = pinned_l2();
  if (!l2) return n * image <= (2 << 20) ? 1 : -1;
  if (l2 < (2 << 20)) l2 = 2 << 20;
  return n * image <= l2 ? 1 : image <= l2 ? 2 : 0;
}

// The graph of case `cc`'s convolution with batch n, its dims into dx, dw and dy.
static jit_graph *conv_graph(jit_context *ctx, const conv_case *cc, int64_t n, DLDataType dt,
                             int64_t dx[4], int64_t dw[4], int64_t dy[4]) {
  jit_graph *g = tu_graph(ctx, "conv");
  int64_t x4[4] = {n, cc->c, cc->h, cc->wd}, w4[4] = {cc->f, cc->c, cc->kh, cc->kw};
  memcpy(dx, x4, sizeof x4);
  memcpy(dw, w4, sizeof w4);
  jit_window_params p;
  jit_window_params_init(&p);
  memcpy(p.stride, cc->w.stride, sizeof p.stride);
  memcpy(p.padding, cc->w.pad, sizeof p.padding);
  memcpy(p.dilation, cc->w.dilation, sizeof p.dilation);
  jit_value x = jit_input(g, "x", dt, 4, dx), w = jit_input(g, "w", dt, 4, dw);
  jit_output(g, jit_conv2d(g, x, w, &p));
  TU_OK(jit_graph_finalize(g));
  ref_window_dims(&cc->w, dx, dw, dy);
  return g;
}

// Its inputs filled from `rng` as `dt` (*px, *pw; *xv, *wv the same values as f32), and
// ref_conv2d's result on those in *want (each malloc'ed).
static void conv_data(ref_rng *rng, const conv_case *cc, DLDataType dt, const int64_t *dx,
                      const int64_t *dw, const int64_t *dy, float **xv, float **wv,
                      void **px, void **pw, float **want) {
  int64_t nx = ref_numel(4, dx), nw = ref_numel(4, dw), ny = ref_numel(4, dy);
  *xv = tu_malloc((size_t)nx * 4), *wv = tu_malloc((size_t)nw * 4);
  *want = tu_malloc((size_t)ny * 4);
  ref_rng_fill_signed(rng, *xv, nx);
  ref_rng_fill_signed(rng, *wv, nw);
  *px = tu_input_data(dt, *xv, nx);  // rounds *xv to dt's values
  *pw = tu_input_data(dt, *wv, nw);
  ref_conv2d(&cc->w, *xv, dx, *wv, dw, *want);
}

// The convolution of case `cc` with batch n at `threads`, against ref_conv2d; and
// whether its kernel has the block loop (where `cc` says it must).
static void check_case(const conv_case *cc, int64_t n, int threads, DLDataType dt) {
  bool f16 = tu_is_f16(dt);
  ref_rng rng;
  ref_rng_seed(&rng, 5000 + (uint64_t)n * 3 + (uint64_t)threads + (f16 ? 17u : 0u));
  dump_begin();
  jit_context *ctx = ctx_threads(threads);
  int64_t dx[4], dw[4], dy[4];
  jit_graph *g = conv_graph(ctx, cc, n, dt, dx, dw, dy);
  float *xv, *wv, *want;
  void *px, *pw;
  conv_data(&rng, cc, dt, dx, dw, dy, &xv, &wv, &px, &pw, &want);
  if (f16) ref_round_f16_array(want, ref_numel(4, dy));
  DLTensor ins[2] = {tu_tensor(px, dt, 4, dx), tu_tensor(pw, dt, 4, dw)};
  char what[160];
  snprintf(what, sizeof what, "%s %s N=%lld threads=%d", cc->name, f16 ? "f16" : "f32",
           (long long)n, threads);
  // Sums of K = C KH KW products of values in [-1, 1]: the f32 rounding grows with K.
  double k_scale = (double)(cc->c * cc->kh * cc->kw) / 144.0;
  k_scale = k_scale > 1.0 ? k_scale : 1.0;
  // Winograd F(4, 3)'s transforms (factors up to 8 and 1/30) add about as much
  // rounding again as the sum's own: 3x the f32 bound where it may run (the numbers
  // seen: up to 1.5x; F(2, 3) stays within 1x).
  int m = winograd_rows(dy[2]);
  double rtol = f16 ? 4e-3 : 2e-5, atol = f16 ? 4e-3 * sqrt(k_scale) : 1e-5 * k_scale;
  if (cc->winograd && m == 4 && !f16) atol *= 3;
  tu_run_check(g, ins, 2, dt, 4, dy, want, rtol, atol, NULL, what);
  // The emitted kernel: the block loop, shared by the threads where they split.
  // (A Winograd case that falls back to im2col may be blocked or not, as its L2 says.)
  int wino = winograd_expected(cc, n, dy[2], dy[3]);
  bool split = threads > 1 && kThreadsSplit;
  bool loop = dump_has("-00-graph.mlir", split ? "scf.forall" : "scf.for");
  if (cc->blocked && !f16)
    cr_expect(loop, "%s: no block loop (%s) in the emitted kernel", what,
              split ? "scf.forall" : "scf.for");
  if (cc->threads_only) {  // blocks where the L2 is 2 MiB (a 512 KiB budget)
    // Both CTest legs pin the L2 (2M, 512K); run by hand on an unpinned host, the
    // host's own L2 decides, and only the numbers are checked.
    const char *l2 = getenv("JITML_CPU_L2");
    bool want = split && l2 && strcmp(l2, "2M") == 0;
    if (!f16 && l2)
      cr_expect(dump_has("-00-graph.mlir", "scf.forall") == want, "%s: blocks %s", what,
                want ? "missing" : "where the budget has none");
  } else if (!cc->blocked && (!cc->winograd || wino == 1)) {
    cr_expect(!dump_has("-00-graph.mlir", "scf.for"), "%s: a block loop for columns that fit",
              what);
  }
  // Winograd's products: W's transforms [m + 2, F, C] (batched over the m + 2 rows of
  // B^T d) times the transformed rows [m + 2, C, n].
  char wino_ir[96];
  snprintf(wino_ir, sizeof wino_ir, "tensor<%dx%lldx%lldxf32>, tensor<%dx%lldx", m + 2,
           (long long)cc->f, (long long)cc->c, m + 2, (long long)cc->c);
  if (wino >= 0)
    cr_expect(dump_has("-00-graph.mlir", wino_ir) == (wino >= 1), "%s: Winograd's products %s",
              what, wino ? "missing" : "where they must not be");
  if (wino == 2)  // the loop over the images
    cr_expect(dump_has("-00-graph.mlir", "scf.for"), "%s: no loop over the images", what);
  free(xv), free(wv), free(want), free(px), free(pw);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
  dump_end();
}

// Batches 1 and 3; the cases one image at a time also 4 (at 2 threads, two images each
// in an scf.forall).
static void check_all(int i, DLDataType dt) {
  static const int64_t batches[] = {1, 3, 4};
  for (int b = 0; b < (kCases[i].images ? 3 : 2); b++)
    for (int threads = 1; threads <= 2; threads++) check_case(&kCases[i], batches[b], threads, dt);
}

#define CONV_TESTS(i, name)                                      \
  Test(forall_paths, name##_f32) { check_all(i, TU_F32); }       \
  Test(forall_paths, name##_f16) { check_all(i, TU_F16); }

CONV_TESTS(0, pad1)
CONV_TESTS(1, strided_dilated_uneven)
CONV_TESTS(2, stride2_prime_rows)
CONV_TESTS(3, whole)
CONV_TESTS(4, twice_the_budget_with_threads)
CONV_TESTS(5, winograd_odd_rows)
CONV_TESTS(6, winograd_uneven_padding)
CONV_TESTS(7, winograd_too_small)
CONV_TESTS(8, winograd_pad1)
CONV_TESTS(9, winograd_one_row_pair)
CONV_TESTS(10, winograd_past_l2)
CONV_TESTS(11, winograd_odd_rows_past_l2)
CONV_TESTS(12, winograd_five_rows)

// Runs "winograd pad 1" (F(4, 3) at 34 output rows) in `ctx` against ref_conv2d,
// within the plain f32 bound for `im2col` (3x that for Winograd's sums); its output
// dims into dy. Returns whether the kernel dumped to g_dump_dir has Winograd's
// products (false when none was compiled).
static bool run_conv_algorithm(jit_context *ctx, uint64_t seed, bool im2col, const char *what,
                               int64_t dy[4]) {
  const conv_case *cc = &kCases[8];
  ref_rng rng;
  ref_rng_seed(&rng, seed);
  int64_t dx[4], dw[4];
  jit_graph *g = conv_graph(ctx, cc, 1, TU_F32, dx, dw, dy);
  float *xv, *wv, *want;
  void *px, *pw;
  conv_data(&rng, cc, TU_F32, dx, dw, dy, &xv, &wv, &px, &pw, &want);
  DLTensor ins[2] = {tu_tensor(px, TU_F32, 4, dx), tu_tensor(pw, TU_F32, 4, dw)};
  double k_scale = (double)(cc->c * cc->kh * cc->kw) / 144.0;
  tu_run_check(g, ins, 2, TU_F32, 4, dy, want, 2e-5, (im2col ? 1e-5 : 3e-5) * k_scale, NULL,
               what);
  free(xv), free(wv), free(want), free(px), free(pw);
  jit_graph_destroy(g);
  char wino_ir[96];
  snprintf(wino_ir, sizeof wino_ir, "tensor<6x%lldx%lldxf32>, tensor<6x%lldx", (long long)cc->f,
           (long long)cc->c, (long long)cc->c);
  return dump_has("-00-graph.mlir", wino_ir);
}

// jit_options.conv_algorithm: under IM2COL a convolution that AUTO takes as Winograd
// has no Winograd products in its kernel and stays within the plain f32 bound; under
// AUTO the products are there where winograd_expected says. Out-of-range values and a
// bad $JITML_CONV_ALGORITHM are JIT_INVALID_ARGUMENT.
static void check_conv_algorithm(jit_conv_algorithm algo, const char *env) {
  dump_begin();
  if (env) setenv("JITML_CONV_ALGORITHM", env, 1);
  jit_options o;
  jit_options_init(&o);
  o.num_threads = 1;
  o.cache_dir = "";
  o.dump_ir_dir = g_dump_dir;
  o.conv_algorithm = env ? JIT_CONV_ALGORITHM_AUTO : algo;
  jit_context *ctx = NULL;
  TU_OK(jit_context_create(&o, &ctx));
  unsetenv("JITML_CONV_ALGORITHM");
  bool im2col = algo == JIT_CONV_ALGORITHM_IM2COL;
  int64_t dy[4];
  bool wino = run_conv_algorithm(ctx, 5100 + (uint64_t)algo, im2col,
                                 im2col ? "conv_algorithm im2col" : "conv_algorithm auto", dy);
  int expected = winograd_expected(&kCases[8], 1, dy[2], dy[3]);
  if (im2col)
    cr_expect(!wino, "conv_algorithm im2col%s: Winograd's products in the kernel",
              env ? " ($JITML_CONV_ALGORITHM)" : "");
  else if (expected >= 0)
    cr_expect(wino == (expected >= 1), "conv_algorithm auto: Winograd's products %s",
              wino ? "unexpected" : "missing");
  jit_context_destroy(ctx);
  dump_end();
}

// The disk cache keeps the two algorithms' kernels apart: with one cache directory,
// an IM2COL context after an AUTO one compiles its own kernel (no Winograd products in
// it) rather than loading AUTO's, and each finds its own entry afterwards.
static void conv_cached(const char *cache, jit_conv_algorithm algo, bool want_compiled) {
  dump_begin();
  jit_options o;
  jit_options_init(&o);
  o.num_threads = 1;
  o.cache_dir = cache;
  o.dump_ir_dir = g_dump_dir;
  o.conv_algorithm = algo;
  jit_context *ctx = NULL;
  TU_OK(jit_context_create(&o, &ctx));
  bool im2col = algo == JIT_CONV_ALGORITHM_IM2COL;
  const char *what = im2col ? "cached conv, im2col" : "cached conv, auto";
  int64_t dy[4];
  bool wino = run_conv_algorithm(ctx, 5200, im2col, what, dy);
  jit_stats st = {.struct_size = sizeof st};
  TU_OK(jit_context_stats(ctx, &st));
  cr_expect(st.compiles == (want_compiled ? 1u : 0u) && st.disk_hits == (want_compiled ? 0u : 1u),
            "%s: %llu compiles and %llu disk hits, want %s", what,
            (unsigned long long)st.compiles, (unsigned long long)st.disk_hits,
            want_compiled ? "a compile (no entry of its own yet)" : "a disk hit");
  if (want_compiled && im2col) cr_expect(!wino, "%s: Winograd's products", what);
  jit_context_destroy(ctx);
  dump_end();
}

Test(forall_paths, conv_algorithm_disk_keys) {
  char cache[] = "/tmp/jitml-test-convkeys-XXXXXX";
  cr_assert(mkdtemp(cache));
  conv_cached(cache, JIT_CONV_ALGORITHM_AUTO, true);
  conv_cached(cache, JIT_CONV_ALGORITHM_IM2COL, true);
  conv_cached(cache, JIT_CONV_ALGORITHM_IM2COL, false);
  conv_cached(cache, JIT_CONV_ALGORITHM_AUTO, false);
  nftw(cache, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

Test(forall_paths, conv_algorithm) {
  check_conv_algorithm(JIT_CONV_ALGORITHM_AUTO, NULL);
  check_conv_algorithm(JIT_CONV_ALGORITHM_IM2COL, NULL);
  check_conv_algorithm(JIT_CONV_ALGORITHM_IM2COL, "IM2COL");  // the variable overrides
  jit_options o;
  jit_options_init(&o);
  o.cache_dir = "";
  o.conv_algorithm = (jit_conv_algorithm)2;
  jit_context *ctx = NULL;
  jit_status s = jit_context_create(&o, &ctx);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  TU_EXPECT_MSG(s, "options.conv_algorithm");
  jit_status_free(s);
  o.conv_algorithm = JIT_CONV_ALGORITHM_AUTO;
  setenv("JITML_CONV_ALGORITHM", "winograd", 1);
  s = jit_context_create(&o, &ctx);
  unsetenv("JITML_CONV_ALGORITHM");
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  TU_EXPECT_MSG(s, "JITML_CONV_ALGORITHM");
  jit_status_free(s);
}

//===--- Attention: one chunk of heads per thread ----------------------------===//

// jit_attention over q [NB, H, S, D] (S = 37, T = 70: one whole key block and one
// padded; or S = 64, 128 and 192, whole query blocks of 64, with T = 100, 160, 200) at
// `threads`, causal or with a mask [S, T] (or [NB, 1, S, T], per batch element: read
// at each head's index, so no chunks), against ref_attention; and whether the kernel
// has the heads' forall (2 threads dividing the NB H heads, a mask without batch dims)
// and, for S = 64, 128 and 192, the loops per head and query block (emit_attention.c's
// emit_tiled; not with a mask that differs per batch element).
static void check_attention(DLDataType dt, int64_t NB, int64_t H, int mask_rank, int causal,
                            int threads, int64_t S, int64_t T) {
  bool f16 = tu_is_f16(dt);
  const int64_t D = 16, Dv = 12, B = NB * H;
  dump_begin();
  jit_context *ctx = ctx_threads(threads);
  jit_graph *g = tu_graph(ctx, "attention");
  int64_t dq[4] = {NB, H, S, D}, dk[4] = {NB, H, T, D}, dv[4] = {NB, H, T, Dv},
          dm[4] = {NB, 1, S, T}, dy[4] = {NB, H, S, Dv};
  int64_t *dmask = dm + 4 - mask_rank;  // [NB, 1, S, T], [S, T] or [T]
  jit_value q = jit_input(g, "q", dt, 4, dq), k = jit_input(g, "k", dt, 4, dk),
            v = jit_input(g, "v", dt, 4, dv);
  jit_value m = mask_rank ? jit_input(g, "m", dt, mask_rank, dmask) : (jit_value){0};
  jit_output(g, jit_attention(g, q, k, v, m, 0.0, causal));
  TU_OK(jit_graph_finalize(g));
  ref_rng rng;
  ref_rng_seed(&rng, 90 + (uint64_t)(B * 4 + mask_rank + causal));
  int64_t nq = B * S * D, nk = B * T * D, nv = B * T * Dv, nm = NB * S * T, ny = B * S * Dv;
  float *qv = tu_malloc((size_t)nq * 4), *kv = tu_malloc((size_t)nk * 4),
        *vv = tu_malloc((size_t)nv * 4), *mv = tu_malloc((size_t)nm * 4),
        *want = tu_malloc((size_t)ny * 4);
  ref_rng_fill_signed(&rng, qv, nq);
  ref_rng_fill_signed(&rng, kv, nk);
  ref_rng_fill_signed(&rng, vv, nv);
  // Masks that differ per batch element (mask_rank 4), each row's first key kept; a
  // mask [T] is every row's (the kernel reads the first T).
  for (int64_t i = 0; i < nm; i++) {
    int64_t j = mask_rank == 1 ? i % T : i;
    mv[i] = (j % T) && (j * 7 + j / (S * T)) % 5 == 0 ? -INFINITY : 0.25f * (float)(j % 3);
  }
  void *pq = tu_input_data(dt, qv, nq), *pk = tu_input_data(dt, kv, nk),
       *pv = tu_input_data(dt, vv, nv), *pm = tu_input_data(dt, mv, nm);
  for (int64_t b = 0; b < NB; b++)  // per batch element: its heads, its mask
    ref_attention(qv + b * H * S * D, kv + b * H * T * D, vv + b * H * T * Dv,
                  mask_rank ? mv + (mask_rank == 4 ? b * S * T : 0) : NULL, H, S, T, D, Dv,
                  1.0 / sqrt((double)D), causal, want + b * H * S * Dv);
  if (f16) ref_round_f16_array(want, ny);
  DLTensor ins[4] = {tu_tensor(pq, dt, 4, dq), tu_tensor(pk, dt, 4, dk),
                     tu_tensor(pv, dt, 4, dv), tu_tensor(pm, dt, mask_rank, dmask)};
  char what[160];
  snprintf(what, sizeof what,
           "attention %s %lldx%lld heads, S=%lld T=%lld, mask rank %d causal=%d threads=%d",
           f16 ? "f16" : "f32", (long long)NB, (long long)H, (long long)S, (long long)T,
           mask_rank, causal, threads);
  tu_run_check(g, ins, mask_rank ? 4 : 3, dt, 4, dy, want, f16 ? 1e-2 : 2e-5,
               f16 ? 5e-3 : 2e-6, NULL, what);
  bool chunks = threads > 1 && kThreadsSplit && B % threads == 0 && mask_rank != 4;
  cr_expect(dump_has("-00-graph.mlir", "scf.forall") == chunks, "%s: heads' forall %s", what,
            chunks ? "missing" : "where it must not be");
  // (A mask [NB, 1, S, T] with NB = 1 has no batch dims to read per head.)
  bool tiled = S % 64 == 0 && (mask_rank != 4 || NB == 1);  // o / l inserted per block
  cr_expect(dump_has("-00-graph.mlir", "= tensor.insert_slice") == tiled,
            "%s: loops per head and query block %s", what, tiled ? "missing" : "unexpected");
  // Each query block's scores over all keys at once (emit_rows: [1, 64, T padded to
  // whole blocks of 64]), unless causal over more than two key blocks (the key loop's
  // blocks of 64).
  int64_t Tp = (T + 63) / 64 * 64;
  char rows_ty[48];
  snprintf(rows_ty, sizeof rows_ty, "tensor<1x64x%lldxf32>", (long long)Tp);
  bool rows = tiled && (!causal || Tp <= 128);
  cr_expect(dump_has("-00-graph.mlir", rows_ty) == rows, "%s: scores per query block %s",
            what, rows ? "missing" : "unexpected");
  free(qv), free(kv), free(vv), free(mv), free(want), free(pq), free(pk), free(pv), free(pm);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
  dump_end();
}

// 2 x 6 heads (6 a thread at 2 threads), 1 x 1 (fewer than the threads), 1 x 5 (odd:
// one loop), each at 1 and 2 threads; S x T of 37 x 70, 64 x 100, 128 x 160 and
// 192 x 200.
static void check_attention_all(DLDataType dt, int mask_rank, int causal) {
  static const int64_t heads[3][2] = {{2, 6}, {1, 1}, {1, 5}};
  static const int64_t st[4][2] = {{37, 70}, {64, 100}, {128, 160}, {192, 200}};
  for (int s = 0; s < 4; s++)
    for (int h = 0; h < 3; h++)
      for (int threads = 1; threads <= 2; threads++)
        check_attention(dt, heads[h][0], heads[h][1], mask_rank, causal, threads, st[s][0],
                        st[s][1]);
}

Test(forall_paths, attention_causal_f32) { check_attention_all(TU_F32, 0, 1); }
Test(forall_paths, attention_mask_f32) { check_attention_all(TU_F32, 2, 0); }
Test(forall_paths, attention_mask_causal_f16) { check_attention_all(TU_F16, 2, 1); }
Test(forall_paths, attention_batch_mask_f32) { check_attention_all(TU_F32, 4, 0); }
Test(forall_paths, attention_key_mask_f32) { check_attention_all(TU_F32, 1, 0); }
Test(forall_paths, attention_plain_f16) { check_attention_all(TU_F16, 0, 0); }
