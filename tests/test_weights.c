//===--- test_weights.c - jit_weight inputs and their packed copies ---------===//
//
// A weight may be read by its kernels as panels packed once (lowering/cpu/prepack.c,
// jit/weights.c). What must hold on every host: results equal the plain-C product
// whether a copy is made or not, and a copy never outlives its data (a new pointer or
// jit_graph_weights_changed remakes it). CTest pins the L2 (JITML_CPU_L2) so that the
// shapes that take the packed path are the same on every host; the count of copies
// made is checked only for those.
//
//===----------------------------------------------------------------------===//
#define _XOPEN_SOURCE 700
#include <pthread.h>

#include "cache_fixture.h"

TestSuite(weights, .init = tu_cache_setup, .fini = tu_cache_teardown, .timeout = 300);

static jit_context *ctx_threads(int threads) {
  jit_options o;
  jit_options_init(&o);
  o.num_threads = threads;
  o.shape_policy = JIT_SHAPE_POLICY_EXACT;
  jit_context *ctx = NULL;
  TU_OK(jit_context_create(&o, &ctx));
  return ctx;
}

// Whether the graphs below take W as [N, K] and multiply by its transpose (the layout of
// PyTorch's nn.Linear), set per test.
static bool g_tr;

// y = x W (fused: gelu(x W + b)) with W a weight, or x W^T (g_tr); M symbolic.
static jit_graph *dense(jit_context *ctx, int64_t K, int64_t N, bool fused) {
  jit_graph *g = tu_graph(ctx, "dense");
  int64_t m = jit_symbol(g, "M");
  int64_t xd[2] = {m, K}, wd[2] = {g_tr ? N : K, g_tr ? K : N}, bd[1] = {N};
  jit_value x = jit_input(g, "x", TU_F32, 2, xd);
  jit_value w = jit_weight(g, "w", TU_F32, 2, wd);
  jit_value y = jit_matmul(g, x, g_tr ? jit_transpose(g, w, (int[]){1, 0}) : w);
  if (fused) y = jit_gelu_erf(g, jit_add(g, y, jit_input(g, "b", TU_F32, 1, bd)));
  jit_output(g, y);
  TU_OK(jit_graph_finalize(g));
  return g;
}

static void reference(const float *x, const float *w, const float *b, int64_t M, int64_t K,
                      int64_t N, float *y) {
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < N; j++) {
      double acc = 0;
      for (int64_t k = 0; k < K; k++)
        acc += (double)x[i * K + k] * (g_tr ? w[j * K + k] : w[k * N + j]);
      if (b) {
        acc += b[j];
        acc = 0.5 * acc * (1.0 + erf(acc / sqrt(2.0)));
      }
      y[i * N + j] = (float)acc;
    }
}

// Runs `g` on (x, w[, b]) and checks y against the reference.
static void run_check(jit_graph *g, const float *x, const float *w, const float *b, int64_t M,
                      int64_t K, int64_t N, const char *what) {
  int64_t xd[2] = {M, K}, wd[2] = {g_tr ? N : K, g_tr ? K : N}, bd[1] = {N}, yd[2] = {M, N};
  float *y = tu_malloc((size_t)(M * N) * sizeof(float));
  float *want = tu_malloc((size_t)(M * N) * sizeof(float));
  DLTensor in[3] = {tu_tensor((void *)x, TU_F32, 2, xd), tu_tensor((void *)w, TU_F32, 2, wd),
                    tu_tensor((void *)b, TU_F32, 1, bd)};
  DLTensor out = tu_tensor(y, TU_F32, 2, yd);
  TU_OK(jit_run(g, in, b ? 3 : 2, &out, 1));
  reference(x, w, b, M, K, N, want);
  tu_assert_close(y, want, M * N, 1e-4, 2e-5 * (double)K, 2, yd, what);
  free(y);
  free(want);
}

static float *filled(int64_t n, uint64_t seed) {
  float *p = tu_malloc((size_t)n * sizeof(float));
  ref_rng rng;
  ref_rng_seed(&rng, seed);
  ref_rng_fill_signed(&rng, p, n);
  return p;
}

// Shapes with 1, primes and non-multiples of the panel width (32 or 64 columns),
// and ones that pack (N a multiple of 64, enough rows): all equal the reference, with
// one thread and two, plain and with a fused epilogue.
static void products_equal_the_reference(void) {
  // 64 x 3072 x 768: blocks of k (kc < K), so the panels' views start at rows > 0.
  static const int64_t shapes[][3] = {{1, 7, 5},       {13, 64, 100},  {1, 768, 3072},
                                      {37, 384, 448},   {64, 256, 320}, {127, 768, 2304},
                                      {96, 1024, 512},  {64, 3072, 768}};
  for (int threads = 1; threads <= 2; threads++)
    for (int fused = 0; fused <= 1; fused++) {
      jit_context *ctx = ctx_threads(threads);
      for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t M = shapes[s][0], K = shapes[s][1], N = shapes[s][2];
        jit_graph *g = dense(ctx, K, N, fused);
        float *x = filled(M * K, 1 + s), *w = filled(K * N, 100 + s), *b = filled(N, 7);
        char what[96];
        snprintf(what, sizeof what, "%lldx%lldx%lld, %d thread(s)%s%s", (long long)M,
                 (long long)K, (long long)N, threads, g_tr ? ", W^T" : "",
                 fused ? ", gelu(xW + b)" : "");
        for (int rep = 0; rep < 2; rep++) run_check(g, x, w, fused ? b : NULL, M, K, N, what);
        free(x);
        free(w);
        free(b);
        jit_graph_destroy(g);
      }
      jit_context_destroy(ctx);
    }
}

Test(weights, products_equal_the_reference) { products_equal_the_reference(); }
Test(weights, transposed_products_equal_the_reference) {
  g_tr = true;
  products_equal_the_reference();
}

// 128 x 768 x 3072 takes the packed path at 1 and 2 threads on any AVX2 or AVX-512
// host with a 2 MiB L2 (CTest pins it): one copy for many calls; a new pointer or
// jit_graph_weights_changed after writing the same memory makes it again, and the
// results follow the new values. W^T as well.
static void copies_follow_the_data(void) {
  const int64_t M = 128, K = 768, N = 3072;
  for (int threads = 1; threads <= 2; threads++) {
    jit_context *ctx = ctx_threads(threads);
    jit_graph *g = dense(ctx, K, N, false);
    float *x = filled(M * K, 3), *w = filled(K * N, 4), *w2 = filled(K * N, 5);
    for (int rep = 0; rep < 3; rep++) run_check(g, x, w, NULL, M, K, N, "first weights");
    bool pinned = getenv("JITML_CPU_L2") != NULL;
    uint64_t packs = get_stats(ctx).weight_packs;
    if (pinned) cr_expect_eq(packs, 1, "%d thread(s): %llu copies for 3 calls", threads,
                             (unsigned long long)packs);
    run_check(g, x, w2, NULL, M, K, N, "another pointer");
    if (pinned) cr_expect_eq(get_stats(ctx).weight_packs, 2);
    memcpy(w2, w, (size_t)(K * N) * sizeof(float));  // w's values, in w2's memory
    jit_graph_weights_changed(g);
    run_check(g, x, w2, NULL, M, K, N, "changed in place");
    if (pinned) cr_expect_eq(get_stats(ctx).weight_packs, 3);
    run_check(g, x, w2, NULL, M, K, N, "unchanged again");
    if (pinned) cr_expect_eq(get_stats(ctx).weight_packs, 3);
    free(x);
    free(w);
    free(w2);
    jit_graph_destroy(g);
    jit_context_destroy(ctx);
  }
}

Test(weights, copies_follow_the_data) { copies_follow_the_data(); }

// Few rows (32) of a large weight: still read from one packed copy, plain and with an
// epilogue, at 1 and 2 threads (an activation B of that shape is read in place on
// AVX-512 hosts instead: lowering/cpu/plan_matmul.c).
Test(weights, few_rows_read_the_packed_copy) {
  const int64_t M = 32, K = 768, N = 3072;
  bool pinned = getenv("JITML_CPU_L2") != NULL;
  for (int threads = 1; threads <= 2; threads++)
    for (int fused = 0; fused <= 1; fused++) {
      jit_context *ctx = ctx_threads(threads);
      jit_graph *g = dense(ctx, K, N, fused);
      float *x = filled(M * K, 8), *w = filled(K * N, 9), *b = filled(N, 10);
      for (int rep = 0; rep < 3; rep++)
        run_check(g, x, w, fused ? b : NULL, M, K, N, fused ? "gelu(xW + b)" : "x W");
      uint64_t packs = get_stats(ctx).weight_packs;
      if (pinned) cr_expect_eq(packs, 1, "%d thread(s)%s: %llu copies for 3 calls", threads,
                               fused ? ", gelu(xW + b)" : "", (unsigned long long)packs);
      free(x);
      free(w);
      free(b);
      jit_graph_destroy(g);
      jit_context_destroy(ctx);
    }
}
Test(weights, transposed_copies_follow_the_data) {
  g_tr = true;
  copies_follow_the_data();
}

// A kernel loaded from the disk cache still reads the weight packed (its record says
// so) and is right.
Test(weights, disk_hits_read_packed_weights) {
  const int64_t M = 128, K = 768, N = 3072;
  float *x = filled(M * K, 8), *w = filled(K * N, 9);
  for (int round = 0; round < 2; round++) {
    jit_context *ctx = ctx_threads(1);
    jit_graph *g = dense(ctx, K, N, false);
    run_check(g, x, w, NULL, M, K, N, round ? "from disk" : "compiled");
    jit_stats st = get_stats(ctx);
    cr_expect_eq(st.disk_hits, (uint64_t)round, "round %d: %llu disk hits", round,
                 (unsigned long long)st.disk_hits);
    if (getenv("JITML_CPU_L2")) cr_expect_eq(st.weight_packs, 1, "round %d", round);
    jit_graph_destroy(g);
    jit_context_destroy(ctx);
  }
  free(x);
  free(w);
}

// jit_graph_to_mlir records which inputs are weights: the graph read back is the same
// node graph (same kernels, packed weights) and gives the same results.
Test(weights, mlir_round_trip_keeps_weights) {
  const int64_t M = 128, K = 768, N = 3072;
  jit_context *ctx = ctx_threads(1);
  jit_graph *g = dense(ctx, K, N, false);
  char *text = NULL;
  TU_OK(jit_graph_to_mlir(g, &text));
  jit_graph *back = NULL;
  TU_OK(jit_graph_from_mlir(ctx, text, strlen(text), NULL, &back));
  float *x = filled(M * K, 21), *w = filled(K * N, 22);
  run_check(g, x, w, NULL, M, K, N, "built");
  jit_stats st = get_stats(ctx);
  run_check(back, x, w, NULL, M, K, N, "read back");
  jit_stats st2 = get_stats(ctx);
  cr_expect_eq(st2.compiles, st.compiles, "the graph read back compiled its own kernel");
  if (getenv("JITML_CPU_L2"))
    cr_expect_eq(st2.weight_packs, st.weight_packs + 1, "no packed copy for the graph read back");
  jit_string_free(text);
  free(x);
  free(w);
  jit_graph_destroy(back);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

typedef struct racer {
  jit_graph *g;
  const float *x, *w[2];
  const float *want[2];
  int64_t M, K, N;
  int id, bad;
} racer;

static void *race(void *arg) {
  racer *r = arg;
  int64_t xd[2] = {r->M, r->K}, wd[2] = {r->K, r->N}, yd[2] = {r->M, r->N};
  float *y = malloc((size_t)(r->M * r->N) * sizeof(float));
  for (int it = 0; it < 12 && y; it++) {
    int which = (it + r->id) % 2;
    DLTensor in[2] = {tu_tensor((void *)r->x, TU_F32, 2, xd),
                      tu_tensor((void *)r->w[which], TU_F32, 2, wd)};
    DLTensor out = tu_tensor(y, TU_F32, 2, yd);
    jit_status s = jit_run(r->g, in, 2, &out, 1);
    if (s) {
      jit_status_free(s);
      r->bad++;
      continue;
    }
    for (int64_t i = 0; i < r->M * r->N; i++)
      if (fabsf(y[i] - r->want[which][i]) > 2e-5f * (float)r->K * (1 + fabsf(r->want[which][i]))) {
        r->bad++;
        break;
      }
  }
  free(y);
  return NULL;
}

// Threads alternating between two weight buffers (each call remakes the copy the other
// just made) and one calling jit_graph_weights_changed: every result is one weight's.
Test(weights, concurrent_calls_never_see_a_half_made_copy) {
  const int64_t M = 64, K = 256, N = 384;
  jit_context *ctx = ctx_threads(1);
  jit_graph *g = dense(ctx, K, N, false);
  float *x = filled(M * K, 11), *w0 = filled(K * N, 12), *w1 = filled(K * N, 13);
  float *y0 = tu_malloc((size_t)(M * N) * sizeof(float)),
        *y1 = tu_malloc((size_t)(M * N) * sizeof(float));
  reference(x, w0, NULL, M, K, N, y0);
  reference(x, w1, NULL, M, K, N, y1);
  enum { T = 4 };
  racer r[T];
  pthread_t th[T];
  for (int i = 0; i < T; i++) {
    r[i] = (racer){g, x, {w0, w1}, {y0, y1}, M, K, N, i, 0};
    cr_assert_eq(pthread_create(&th[i], NULL, race, &r[i]), 0);
  }
  for (int i = 0; i < 20; i++) jit_graph_weights_changed(g);
  for (int i = 0; i < T; i++) {
    pthread_join(th[i], NULL);
    cr_expect_eq(r[i].bad, 0, "thread %d: %d wrong or failed calls", i, r[i].bad);
  }
  free(x);
  free(w0);
  free(w1);
  free(y0);
  free(y1);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// jit_weight checks what jit_input checks; jit_graph_weights_changed takes NULL and
// graphs without weights.
Test(weights, bad_declarations_are_errors) {
  jit_context *ctx = ctx_threads(1);
  jit_graph *g = tu_graph(ctx, "bad");
  int64_t d[2] = {4, -1};
  jit_value w = jit_weight(g, "w", TU_F32, 2, d);
  cr_expect_eq(w.id, 0, "a -1 dim was accepted");
  jit_status s = jit_graph_finalize(g);
  cr_assert_not_null(s);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  TU_EXPECT_MSG(s, "input 0 `w`");
  jit_status_free(s);
  jit_graph_weights_changed(NULL);
  jit_graph_weights_changed(g);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}
