//===--- thread_stress.c - the threaded paths, for ThreadSanitizer ---------===//
//
// A plain program (Criterion's fork-server arena cannot be mapped under TSan) that
// drives every path where threads meet: four threads running one graph under AUTO
// while bindings are specialized in the background and switch kernels, with a limit of
// four loaded kernels so that least recently used ones are unloaded under the
// running threads; single-flight compiles of one key from all threads; a graph
// destroyed with specializations queued and in flight; the context destroyed after;
// hot bindings remembered in a cache directory and warmed up by a restarted context
// while threads run them; two "machines" sharing a real redis-server (the fleet tier's
// push thread, breaker and shared connection) from eight threads, then the server
// killed under them; a weight's packed copy (jit/weights.c) remade under threads that
// alternate between two weight buffers while another says the weights changed.
// Results are checked against plain C. Exits 0 when all is well. CTest runs it in every
// build; .ci/run runs it in a -DJITML_TSAN=ON build.
//
//===----------------------------------------------------------------------===//
#define _DEFAULT_SOURCE  // mkdtemp
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "jitml.h"
#if JITML_HAVE_HIREDIS
#include "redis_fixture.h"
#endif

enum { K = 48, N = 40, kThreads = 4, kRounds = 40 };

static const DLDataType kF32 = {kDLFloat, 32, 1};
static int failures;
static pthread_mutex_t fail_mu = PTHREAD_MUTEX_INITIALIZER;

static void fail(const char *what, jit_status s) {
  pthread_mutex_lock(&fail_mu);
  failures++;
  fprintf(stderr, "thread_stress: %s: %s\n", what, s ? jit_status_message(s) : "mismatch");
  pthread_mutex_unlock(&fail_mu);
  jit_status_free(s);
}

// relu(x W): x [M, K], W [K, N], M symbolic.
static jit_graph *layer(jit_context *ctx) {
  jit_graph *g = NULL;
  jit_status s = jit_graph_create(ctx, "layer", &g);
  if (s) {
    fail("graph", s);
    exit(1);
  }
  int64_t dx[2] = {jit_symbol(g, "M"), K}, dw[2] = {K, N};
  jit_value x = jit_input(g, "x", kF32, 2, dx);
  jit_value w = jit_input(g, "w", kF32, 2, dw);
  jit_output(g, jit_relu(g, jit_matmul(g, x, w)));
  if ((s = jit_graph_finalize(g))) {
    fail("finalize", s);
    exit(1);
  }
  return g;
}

static float W[K * N];

static void run_one(jit_graph *g, int64_t m, unsigned seed) {
  float *x = malloc(sizeof(float) * (size_t)(m * K)), *y = malloc(sizeof(float) * (size_t)(m * N));
  for (int64_t i = 0; i < m * K; i++) x[i] = (float)((seed * 31 + i * 7) % 13) / 13.0f - 0.5f;
  int64_t sx[2] = {m, K}, sw[2] = {K, N}, sy[2] = {m, N};
  DLTensor in[2] = {{x, {kDLCPU, 0}, 2, kF32, sx, NULL, 0}, {W, {kDLCPU, 0}, 2, kF32, sw, NULL, 0}};
  DLTensor out = {y, {kDLCPU, 0}, 2, kF32, sy, NULL, 0};
  jit_status s = jit_run(g, in, 2, &out, 1);
  if (s) {
    fail("jit_run", s);
  } else {
    for (int64_t r = 0; r < m; r++)
      for (int j = 0; j < N; j++) {
        double acc = 0;
        for (int k = 0; k < K; k++) acc += (double)x[r * K + k] * W[k * N + j];
        double want = acc > 0 ? acc : 0;
        if (fabs(want - y[r * N + j]) > 1e-4) {
          fail("result", NULL);
          r = m;
          break;
        }
      }
  }
  free(x);
  free(y);
}

typedef struct job {
  jit_graph *g;
  int index;
} job;

static void *runner(void *arg) {
  job *j = arg;
  for (int i = 0; i < kRounds; i++) run_one(j->g, 1 + (j->index * 3 + i) % 9, (unsigned)i);
  return NULL;
}

static void *same_key(void *arg) {
  run_one(((job *)arg)->g, 37, 5);
  return NULL;
}

// Runs `fn` on `g` from kThreads threads at once (job i for thread i) and joins them.
static void on_threads(jit_graph *g, void *(*fn)(void *)) {
  pthread_t t[kThreads];
  job jobs[kThreads];
  for (int i = 0; i < kThreads; i++) {
    jobs[i] = (job){g, i};
    pthread_create(&t[i], NULL, fn, &jobs[i]);
  }
  for (int i = 0; i < kThreads; i++) pthread_join(t[i], NULL);
}

// Packed weights: [64, 256] x [256, 384] takes the packed path on AVX2 and AVX-512
// (whatever it takes, the results are checked); four threads alternate between two
// weight buffers, so each call may remake the copy that another just read, while the
// main thread calls jit_graph_weights_changed.
enum { WM = 64, WK = 256, WN = 384 };
static float WX[WM * WK], WB[2][WK * WN], WY[2][WM * WN];

static void *weight_runner(void *arg) {
  jit_graph *g = ((job *)arg)->g;
  float *y = malloc(sizeof(float) * WM * WN);
  int64_t sx[2] = {WM, WK}, sw[2] = {WK, WN}, sy[2] = {WM, WN};
  for (int i = 0; i < 8 && y; i++) {
    int b = (i + ((job *)arg)->index) % 2;
    DLTensor in[2] = {{WX, {kDLCPU, 0}, 2, kF32, sx, NULL, 0},
                      {WB[b], {kDLCPU, 0}, 2, kF32, sw, NULL, 0}};
    DLTensor out = {y, {kDLCPU, 0}, 2, kF32, sy, NULL, 0};
    jit_status s = jit_run(g, in, 2, &out, 1);
    if (s) {
      fail("jit_run (weights)", s);
      break;
    }
    for (int j = 0; j < WM * WN; j++)
      if (fabsf(y[j] - WY[b][j]) > 1e-3f) {
        fail("result (weights)", NULL);
        break;
      }
  }
  free(y);
  return NULL;
}

static void weights(void) {
  for (int i = 0; i < WM * WK; i++) WX[i] = (float)((i * 7) % 13) / 13.0f - 0.5f;
  for (int b = 0; b < 2; b++)
    for (int i = 0; i < WK * WN; i++) WB[b][i] = (float)((i * (5 + b)) % 11) / 11.0f - 0.5f;
  for (int b = 0; b < 2; b++)
    for (int r = 0; r < WM; r++)
      for (int c = 0; c < WN; c++) {
        double acc = 0;
        for (int k = 0; k < WK; k++) acc += (double)WX[r * WK + k] * WB[b][k * WN + c];
        WY[b][r * WN + c] = (float)acc;
      }
  jit_options o;
  jit_options_init(&o);
  o.cache_dir = "";
  o.shape_policy = JIT_SHAPE_POLICY_EXACT;
  jit_context *ctx = NULL;
  jit_graph *g = NULL;
  jit_status s = jit_context_create(&o, &ctx);
  if (!s) s = jit_graph_create(ctx, "weights", &g);
  if (s) {
    fail("weights context", s);
    jit_context_destroy(ctx);
    return;
  }
  int64_t dx[2] = {WM, WK}, dw[2] = {WK, WN};
  jit_value x = jit_input(g, "x", kF32, 2, dx);
  jit_output(g, jit_matmul(g, x, jit_weight(g, "w", kF32, 2, dw)));
  if ((s = jit_graph_finalize(g))) {
    fail("weights finalize", s);
  } else {
    pthread_t t[kThreads];
    job jobs[kThreads];
    for (int i = 0; i < kThreads; i++) {
      jobs[i] = (job){g, i};
      pthread_create(&t[i], NULL, weight_runner, &jobs[i]);
    }
    for (int i = 0; i < 50; i++) jit_graph_weights_changed(g);
    for (int i = 0; i < kThreads; i++) pthread_join(t[i], NULL);
    jit_stats st = {.struct_size = sizeof st};
    jit_context_stats(ctx, &st);
    printf("thread_stress: weights: %llu runs, %llu packed copies made\n",
           (unsigned long long)st.runs, (unsigned long long)st.weight_packs);
  }
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// Hot bindings across a restart, in a cache directory: a first context makes bindings
// hot (noted by the specializer's thread, and by the graph's destruction for those
// still queued); a second one queues them at its first call, and its background warm
// ups race with four threads running the same bindings.
static void hot_restart(void) {
  char dir[] = "/tmp/jitml-stress-XXXXXX";
  if (!mkdtemp(dir)) {
    fail("mkdtemp", NULL);
    return;
  }
  for (int round = 0; round < 2; round++) {
    jit_options o;
    jit_options_init(&o);
    o.cache_dir = dir;
    o.specialize_after = 2;
    jit_context *ctx = NULL;
    jit_status s = jit_context_create(&o, &ctx);
    if (s) {
      fail("context", s);
      break;
    }
    jit_graph *g = layer(ctx);
    on_threads(g, runner);
    jit_graph_destroy(g);
    jit_context_destroy(ctx);
  }
  char cmd[64];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) fail("removing the cache directory", NULL);
}

#if JITML_HAVE_HIREDIS
typedef struct machine_job {
  jit_graph *g;
  int64_t base;  // the round's bindings: M = base + 0..8
  int index;
} machine_job;

static void *machine_runner(void *arg) {
  machine_job *j = arg;
  for (int i = 0; i < kRounds; i++)
    run_one(j->g, j->base + (j->index * 3 + i) % 9, (unsigned)i);
  return NULL;
}

// kThreads threads running machine `j`'s graph.
static void *machine_threads(void *arg) {
  machine_job *j = arg, jobs[kThreads];
  pthread_t t[kThreads];
  for (int i = 0; i < kThreads; i++) {
    jobs[i] = (machine_job){j->g, j->base, i};
    pthread_create(&t[i], NULL, machine_runner, &jobs[i]);
  }
  for (int i = 0; i < kThreads; i++) pthread_join(t[i], NULL);
  return NULL;
}

// Two machines (contexts with their own cache directories) sharing one redis-server,
// four threads each; a second round after the server was killed.
static void fleet(void) {
  tu_redis r;
  if (!tu_redis_start(&r)) {
    fail("starting redis-server", NULL);
    return;
  }
  char dirs[2][32] = {"/tmp/jitml-stress-XXXXXX", "/tmp/jitml-stress-XXXXXX"};
  jit_context *ctx[2] = {NULL, NULL};
  machine_job jobs[2] = {{NULL, 1, 0}, {NULL, 1, 0}};
  for (int m = 0; m < 2; m++) {
    jit_options o;
    jit_options_init(&o);
    o.cache_dir = mkdtemp(dirs[m]);
    o.remote_cache = r.url;
    o.remote_timeout_ms = 300;
    o.specialize_after = 2;
    jit_status s = o.cache_dir ? jit_context_create(&o, &ctx[m]) : NULL;
    if (!o.cache_dir || s) fail("fleet context", s);
    if (ctx[m]) jobs[m].g = layer(ctx[m]);
  }
  for (int round = 0; round < 2 && jobs[0].g && jobs[1].g; round++) {
    if (round == 1) tu_redis_kill(&r);
    jobs[0].base = jobs[1].base = 1 + 9 * round;  // new bindings: they ask the server
    pthread_t other;
    pthread_create(&other, NULL, machine_threads, &jobs[1]);
    machine_threads(&jobs[0]);
    pthread_join(other, NULL);
  }
  jit_stats st = {.struct_size = sizeof st};
  if (ctx[1]) jit_context_stats(ctx[1], &st);
  printf("thread_stress: fleet: second machine %llu remote hits, %llu errors, %llu skipped\n",
         (unsigned long long)st.remote_hits, (unsigned long long)st.remote_errors,
         (unsigned long long)st.remote_skipped);
  for (int m = 0; m < 2; m++) {
    jit_graph_destroy(jobs[m].g);
    jit_context_destroy(ctx[m]);
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dirs[m]);
    if (dirs[m][19] != 'X' && system(cmd) != 0) fail("removing a cache directory", NULL);
  }
  tu_redis_stop(&r);
}
#endif

int main(void) {
  for (int i = 0; i < K * N; i++) W[i] = (float)((i * 17) % 11) / 11.0f - 0.5f;
  jit_options o;
  jit_options_init(&o);
  o.cache_dir = "";
  o.shape_policy = JIT_SHAPE_POLICY_AUTO;
  o.specialize_after = 2;
  o.max_loaded_kernels = 4;
  jit_context *ctx = NULL;
  jit_status s = jit_context_create(&o, &ctx);
  if (s) {
    fail("context", s);
    return 1;
  }
  jit_graph *g = layer(ctx);
  // Nine bindings from four threads: specializations, switches and unloads meet runs.
  on_threads(g, runner);
  // Once they are all compiled, again: nine specialized bindings do not fit in four
  // loaded kernels, so runs meet unloads (and bindings unloaded go back to the
  // generic kernel, then are specialized again).
  jit_stats st = {.struct_size = sizeof st};
  for (int i = 0; i < 3000; i++) {
    jit_context_stats(ctx, &st);
    if (!st.specializations_pending) break;
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  on_threads(g, runner);
  // One new key from every thread at once: one compile (single flight).
  on_threads(g, same_key);
  jit_context_stats(ctx, &st);
  printf("thread_stress: %llu runs, %llu generic, %llu specializations, %llu unloaded, "
         "%llu kernels loaded\n",
         (unsigned long long)st.runs, (unsigned long long)st.generic_runs,
         (unsigned long long)st.specializations, (unsigned long long)st.kernels_unloaded,
         (unsigned long long)st.kernels);
  if (st.runs != 2 * kThreads * kRounds + kThreads) fail("runs counted", NULL);
  if (st.kernels_unloaded == 0) fail("nothing was unloaded under a limit of 4", NULL);
  // Destroyed with compiles queued and maybe one in flight.
  for (int64_t m = 10; m < 16; m++) {
    run_one(g, m, 1);
    run_one(g, m, 2);
  }
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
  hot_restart();
  weights();
#if JITML_HAVE_HIREDIS
  fleet();
#endif
  return failures ? 1 : 0;
}
