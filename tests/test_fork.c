// Contexts across fork(): a child forked while the library's background thread
// compiles, or while another thread compiles, goes on using what it inherited (runs,
// new shapes, destroying graphs and the context) without waiting for threads that are
// not in it (jit/fork.c). The children check their results with plain C (no Criterion
// asserts there) and exit 0 when all is right; a child that hangs is killed and fails
// the test.
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "jitml.h"
#include "util.h"

#define K 24
#define N 40

// act(x[rows, K] @ w[K, N]) with x and w filled from `rows`; 0 when the result
// matches the plain C one, else 1 (printed).
static int run_check(jit_graph *g, int64_t rows, bool tanh_act) {
  float *x = malloc(sizeof(float) * (size_t)(rows * K)), w[K * N];
  float *y = malloc(sizeof(float) * (size_t)(rows * N));
  for (int64_t i = 0; i < rows * K; i++) x[i] = (float)((i * 7 + rows) % 13) / 13.0f - 0.5f;
  for (int i = 0; i < K * N; i++) w[i] = (float)((i * 5) % 11) / 11.0f - 0.5f;
  int64_t sx[2] = {rows, K}, sw[2] = {K, N}, sy[2] = {rows, N};
  DLTensor in[2] = {tu_tensor(x, TU_F32, 2, sx), tu_tensor(w, TU_F32, 2, sw)};
  DLTensor out = tu_tensor(y, TU_F32, 2, sy);
  jit_status s = jit_run(g, in, 2, &out, 1);
  int bad = 0;
  if (s) {
    fprintf(stderr, "pid %d: %lld rows: %s\n", (int)getpid(), (long long)rows,
            jit_status_message(s));
    jit_status_free(s);
    bad = 1;
  }
  for (int64_t i = 0; i < rows && !bad; i++)
    for (int j = 0; j < N && !bad; j++) {
      double acc = 0;
      for (int k = 0; k < K; k++) acc += (double)x[i * K + k] * w[k * N + j];
      double want = tanh_act ? tanh(acc) : (acc > 0 ? acc : 0);
      if (fabs(y[i * N + j] - want) > 1e-4 + 1e-4 * fabs(want)) {
        fprintf(stderr, "pid %d: %lld rows: (%lld, %d) is %g, want %g\n", (int)getpid(),
                (long long)rows, (long long)i, j, (double)y[i * N + j], want);
        bad = 1;
      }
    }
  free(x);
  free(y);
  return bad;
}

// act(x[rows, K] @ w[K, N]), rows symbolic.
static jit_graph *matmul_act(jit_context *ctx, const char *name, bool tanh_act) {
  jit_graph *g = tu_graph(ctx, name);
  int64_t sx[2] = {jit_symbol(g, "rows"), K}, sw[2] = {K, N};
  jit_value x = jit_input(g, "x", TU_F32, 2, sx);
  jit_value w = jit_input(g, "w", TU_F32, 2, sw);
  jit_value y = jit_matmul(g, x, w);
  jit_output(g, tanh_act ? jit_tanh(g, y) : jit_relu(g, y));
  TU_OK(jit_graph_finalize(g));
  return g;
}

static jit_context *context(jit_shape_policy policy, jit_log_fn log, void *user) {
  jit_options o;
  jit_options_init(&o);
  o.cache_dir = "";  // no disk cache: every kernel is compiled in the process
  o.shape_policy = policy;
  o.log_fn = log;
  o.log_user_data = user;
  o.log_level = JIT_LOG_DEBUG;
  jit_context *ctx = NULL;
  TU_OK(jit_context_create(&o, &ctx));
  return ctx;
}

// Puts `g` under the GENERIC shape policy; 0 when that worked (children: no asserts).
static int set_generic(jit_graph *g) {
  jit_status s = jit_graph_set_shape_policy(g, JIT_SHAPE_POLICY_GENERIC);
  int bad = s != NULL;
  jit_status_free(s);
  return bad;
}

// Asserts that child `pid` exits 0 within a minute (killed if it does not).
static void assert_child_ok(pid_t pid) {
  cr_assert(pid >= 0, "fork failed");
  int status = tu_wait_child(pid, 60000);
  cr_assert_eq(status, 0, "child status %d (-1: hung)", status);
}

// Under AUTO the first binding's run queues the generic kernel's compile on the
// background thread; a fork right after it finds that compile in flight. The child
// runs new shapes, asks for the generic kernel, and destroys its graph and context
// (which waited for the parent's thread for ever before).
Test(fork, child_goes_on_while_the_generic_kernel_compiles) {
  jit_context *ctx = context(JIT_SHAPE_POLICY_AUTO, NULL, NULL);
  jit_graph *g = matmul_act(ctx, "fork_auto", false);
  cr_assert_eq(run_check(g, 5, false), 0);
  pid_t pid = fork();
  if (pid == 0) {
    int bad = run_check(g, 7, false);
    bad |= set_generic(g);
    bad |= run_check(g, 1, false);
    bad |= run_check(g, 13, false);
    jit_graph_destroy(g);
    jit_context_destroy(ctx);
    _exit(bad);
  }
  assert_child_ok(pid);
  cr_assert_eq(run_check(g, 9, false), 0);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// Two graphs' generic kernels queued: at the fork the first compiles (the fork waits
// for it) and the second is still queued. The child, with no background thread, needs
// the second: a thread of its own builds it.
Test(fork, child_builds_a_queued_generic_kernel) {
  jit_context *ctx = context(JIT_SHAPE_POLICY_AUTO, NULL, NULL);
  jit_graph *a = matmul_act(ctx, "fork_a", false);
  jit_graph *b = matmul_act(ctx, "fork_b", true);
  cr_assert_eq(run_check(a, 3, false), 0);
  cr_assert_eq(run_check(b, 3, true), 0);
  pid_t pid = fork();
  if (pid == 0) {
    int bad = set_generic(b);
    bad |= run_check(b, 11, true);
    bad |= run_check(a, 17, false);
    jit_graph_destroy(a);
    jit_graph_destroy(b);
    jit_context_destroy(ctx);
    _exit(bad);
  }
  assert_child_ok(pid);
  cr_assert_eq(run_check(b, 11, true), 0);
  jit_graph_destroy(a);
  jit_graph_destroy(b);
  jit_context_destroy(ctx);
}

// A user thread compiles a shape and is held, its compile done but its kernel not yet
// published (the log line of a finished compile comes before), while the main thread
// forks. In the child that thread is gone: its kernel record would stay "compiling"
// for ever, and a run of the same shape wait on it. The child compiles it anew.
typedef struct held {
  sem_t go, reached, release;
  pthread_t thread;
  atomic_bool hold;
  jit_graph *g;
  int bad;
} held;

static void hold_after_compile(void *user, jit_log_level level, const char *message) {
  (void)level;
  held *h = user;
  if (strstr(message, " compiled in ") && pthread_equal(pthread_self(), h->thread) &&
      atomic_exchange(&h->hold, false)) {
    sem_post(&h->reached);
    sem_wait(&h->release);
  }
}

static void *compile_held(void *arg) {
  held *h = arg;
  sem_wait(&h->go);  // h->thread is set
  h->bad = run_check(h->g, 19, false);
  return NULL;
}

Test(fork, child_compiles_again_what_another_thread_was_compiling) {
  held h = {.bad = -1};
  sem_init(&h.go, 0, 0);
  sem_init(&h.reached, 0, 0);
  sem_init(&h.release, 0, 0);
  atomic_init(&h.hold, true);
  jit_context *ctx = context(JIT_SHAPE_POLICY_EXACT, hold_after_compile, &h);
  h.g = matmul_act(ctx, "fork_held", false);
  // The callback compares its thread with h.thread: set before the thread starts.
  cr_assert_eq(pthread_create(&h.thread, NULL, compile_held, &h), 0);
  sem_post(&h.go);
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 60;
  cr_assert_eq(sem_timedwait(&h.reached, &until), 0, "the compile did not finish");
  pid_t pid = fork();
  if (pid == 0) {
    int bad = run_check(h.g, 19, false);
    bad |= run_check(h.g, 2, false);
    jit_graph_destroy(h.g);
    jit_context_destroy(ctx);
    _exit(bad);
  }
  sem_post(&h.release);
  pthread_join(h.thread, NULL);
  assert_child_ok(pid);
  cr_assert_eq(h.bad, 0);
  cr_assert_eq(run_check(h.g, 19, false), 0);
  jit_stats st = {.struct_size = sizeof st};
  TU_OK(jit_context_stats(ctx, &st));
  cr_expect_eq(st.compiles, 1, "the parent compiled 19 rows %llu times",
               (unsigned long long)st.compiles);
  jit_graph_destroy(h.g);
  jit_context_destroy(ctx);
  sem_destroy(&h.go);
  sem_destroy(&h.reached);
  sem_destroy(&h.release);
}
