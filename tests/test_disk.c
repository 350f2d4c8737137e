//===--- test_disk.c - the disk cache seen through the public API ----------===//
//
// Fresh-process hits, cross-process races, corrupt entries, unusable locations,
// permissions, eviction and explain. Processes are forked children; each reports its
// stats through a pipe.
//
//===----------------------------------------------------------------------===//
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util.h"

static char g_dir[256];

static void rm_rf(const char *path) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
  if (system(cmd) != 0) fprintf(stderr, "rm -rf %s failed\n", path);
}

static void setup(void) {
  snprintf(g_dir, sizeof g_dir, "/tmp/jitml-disk-test-XXXXXX");
  cr_assert(mkdtemp(g_dir) != NULL);
  chmod(g_dir, 0700);
}

static void teardown(void) { rm_rf(g_dir); }

TestSuite(disk, .init = setup, .fini = teardown, .timeout = 300);

static jit_context *ctx_with(const char *dir, uint64_t max_bytes) {
  jit_options o;
  jit_options_init(&o);
  o.cache_dir = dir;
  o.cache_max_bytes = max_bytes;
  o.shape_policy = JIT_SHAPE_POLICY_EXACT;  // entries per binding (test_shapes.c: generic)
  jit_context *ctx = NULL;
  TU_OK(jit_context_create(&o, &ctx));
  return ctx;
}

// y = relu(x W + b): x [N, 33], W [33, 17], b [17].
enum { K = 33, NOUT = 17 };

static jit_graph *dense_graph(jit_context *ctx) {
  jit_graph *g = tu_graph(ctx, "dense");
  int64_t N = jit_symbol(g, "N");
  jit_value x = jit_input(g, "x", TU_F32, 2, (int64_t[]){N, K});
  jit_value w = jit_input(g, "w", TU_F32, 2, (int64_t[]){K, NOUT});
  jit_value b = jit_input(g, "b", TU_F32, 1, (int64_t[]){NOUT});
  jit_output(g, jit_relu(g, jit_add(g, jit_matmul(g, x, w), b)));
  TU_OK(jit_graph_finalize(g));
  return g;
}

// Runs the dense graph for batch n and checks it against plain C. Returns 0 if the
// results match (so children can report without Criterion asserts).
static int run_dense(jit_graph *g, int n) {
  float *x = malloc(sizeof(float) * n * K), w[K * NOUT], b[NOUT];
  float *y = malloc(sizeof(float) * n * NOUT);
  for (int i = 0; i < n * K; i++) x[i] = (float)((i * 7 % 23) - 11) / 11.0f;
  for (int i = 0; i < K * NOUT; i++) w[i] = (float)((i * 5 % 19) - 9) / 19.0f;
  for (int i = 0; i < NOUT; i++) b[i] = (float)(i % 3) - 1.0f;
  int64_t sx[] = {n, K}, sw[] = {K, NOUT}, sb[] = {NOUT}, sy[] = {n, NOUT};
  DLTensor in[] = {tu_tensor(x, TU_F32, 2, sx), tu_tensor(w, TU_F32, 2, sw),
                   tu_tensor(b, TU_F32, 1, sb)};
  DLTensor out = tu_tensor(y, TU_F32, 2, sy);
  jit_status s = jit_run(g, in, 3, &out, 1);
  int bad = s != NULL;
  if (s) {
    fprintf(stderr, "jit_run: %s\n", jit_status_message(s));
    jit_status_free(s);
  }
  for (int i = 0; !bad && i < n; i++) {
    for (int j = 0; j < NOUT; j++) {
      double acc = b[j];
      for (int k = 0; k < K; k++) acc += (double)x[i * K + k] * w[k * NOUT + j];
      double want = acc > 0 ? acc : 0;
      if (fabs(want - y[i * NOUT + j]) > 1e-4 * (1 + fabs(want))) bad = 1;
    }
  }
  free(x);
  free(y);
  return bad;
}

// What a child process reports.
typedef struct report {
  int bad;
  uint64_t compiles, disk_hits, bad_entries;
} report;

static report child_run(const char *dir, const int *ns, int count) {
  report r = {0};
  jit_context *ctx = ctx_with(dir, 0);
  jit_graph *g = dense_graph(ctx);
  for (int i = 0; i < count; i++) r.bad |= run_dense(g, ns[i]);
  jit_stats st = {0};
  jit_context_stats(ctx, &st);
  r.compiles = st.compiles;
  r.disk_hits = st.disk_hits;
  r.bad_entries = st.bad_entries;
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
  return r;
}

// Runs child_run in a forked process and returns its report.
static report in_child(const char *dir, const int *ns, int count) {
  int fds[2];
  cr_assert(pipe(fds) == 0);
  pid_t pid = fork();
  cr_assert(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    report r = child_run(dir, ns, count);
    ssize_t w = write(fds[1], &r, sizeof r);
    _exit(w == (ssize_t)sizeof r ? 0 : 1);
  }
  close(fds[1]);
  report r;
  memset(&r, 0xff, sizeof r);
  ssize_t got = read(fds[0], &r, sizeof r);
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  cr_assert(got == (ssize_t)sizeof r && WIFEXITED(status) && WEXITSTATUS(status) == 0,
            "child failed (status %d)", status);
  return r;
}

Test(disk, hit_in_a_fresh_process) {
  int ns[] = {1, 7, 64};
  report first = in_child(g_dir, ns, 3);
  cr_expect_eq(first.bad, 0);
  cr_expect_eq(first.compiles, 3);
  cr_expect_eq(first.disk_hits, 0);
  report second = in_child(g_dir, ns, 3);
  cr_expect_eq(second.bad, 0, "results from cached kernels differ");
  cr_expect_eq(second.compiles, 0, "a fresh process compiled %llu kernels",
               (unsigned long long)second.compiles);
  cr_expect_eq(second.disk_hits, 3);
}

Test(disk, disabled_with_empty_dir) {
  jit_context *ctx = ctx_with("", 0);
  const char *reason = NULL;
  cr_expect_str_eq(jit_cache_dir(ctx, &reason), "");
  jit_graph *g = dense_graph(ctx);
  cr_expect_eq(run_dense(g, 5), 0);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// Every entry file under the cache directory (recursively).
static int list_entries(const char *dir, char paths[][512], int max) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "find '%s' -name '*.jitk' -type f | sort", dir);
  FILE *p = popen(cmd, "r");
  int n = 0;
  while (p && n < max && fgets(paths[n], 512, p)) {
    paths[n][strcspn(paths[n], "\n")] = 0;
    n++;
  }
  if (p) pclose(p);
  return n;
}

Test(disk, corrupt_entry_is_removed_and_recompiled) {
  int ns[] = {9};
  report first = in_child(g_dir, ns, 1);
  cr_assert_eq(first.compiles, 1);
  char paths[8][512];
  cr_assert_eq(list_entries(g_dir, paths, 8), 1);
  // Flip one byte in the middle of the file (the payload).
  int fd = open(paths[0], O_RDWR);
  cr_assert(fd >= 0);
  off_t size = lseek(fd, 0, SEEK_END);
  unsigned char c;
  cr_assert(pread(fd, &c, 1, size / 2) == 1);
  c ^= 0x40;
  cr_assert(pwrite(fd, &c, 1, size / 2) == 1);
  close(fd);
  report second = in_child(g_dir, ns, 1);
  cr_expect_eq(second.bad, 0);
  cr_expect_eq(second.bad_entries, 1, "the flipped entry was not detected");
  cr_expect_eq(second.compiles, 1);
  report third = in_child(g_dir, ns, 1);
  cr_expect_eq(third.disk_hits, 1, "the recompiled kernel was not stored again");
}

Test(disk, truncated_entry_is_a_miss) {
  int ns[] = {4};
  in_child(g_dir, ns, 1);
  char paths[8][512];
  cr_assert_eq(list_entries(g_dir, paths, 8), 1);
  cr_assert(truncate(paths[0], 40) == 0);
  report r = in_child(g_dir, ns, 1);
  cr_expect_eq(r.bad, 0);
  cr_expect_eq(r.compiles, 1);
  cr_expect_eq(r.bad_entries, 1);
}

Test(disk, unusable_location_falls_back_to_memory) {
  // A regular file where the directory should be.
  char path[300];
  snprintf(path, sizeof path, "%s/not-a-dir", g_dir);
  FILE *f = fopen(path, "w");
  cr_assert(f);
  fputs("x", f);
  fclose(f);
  jit_context *ctx = ctx_with(path, 0);
  const char *reason = NULL;
  cr_expect_str_eq(jit_cache_dir(ctx, &reason), "");
  cr_expect(reason != NULL && reason[0], "no reason given");
  jit_graph *g = dense_graph(ctx);
  cr_expect_eq(run_dense(g, 3), 0);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(disk, world_writable_dir_is_refused) {
  char path[300];
  snprintf(path, sizeof path, "%s/shared", g_dir);
  cr_assert(mkdir(path, 0777) == 0);
  cr_assert(chmod(path, 0777) == 0);
  jit_context *ctx = ctx_with(path, 0);
  const char *reason = NULL;
  cr_expect_str_eq(jit_cache_dir(ctx, &reason), "", "a world-writable cache was used");
  cr_expect(reason && strstr(reason, "writable"), "reason: %s", reason ? reason : "(none)");
  jit_graph *g = dense_graph(ctx);
  cr_expect_eq(run_dense(g, 2), 0);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

Test(disk, explain_names_the_differing_dim) {
  int ns[] = {16, 32};
  in_child(g_dir, ns, 2);
  jit_context *ctx = ctx_with(g_dir, 0);
  jit_graph *g = dense_graph(ctx);
  int64_t sx[] = {17, K}, sw[] = {K, NOUT}, sb[] = {NOUT};
  DLTensor in[] = {tu_tensor(NULL, TU_F32, 2, sx), tu_tensor(NULL, TU_F32, 2, sw),
                   tu_tensor(NULL, TU_F32, 1, sb)};
  char *text = NULL;
  TU_OK(jit_cache_explain(g, in, 3, &text));
  cr_expect(strstr(text, "miss") != NULL, "%s", text);
  cr_expect(strstr(text, "input 0 `x` dim 0: 17 vs cached 16, 32") != NULL, "%s", text);
  jit_string_free(text);
  sx[0] = 32;
  TU_OK(jit_cache_explain(g, in, 3, &text));
  cr_expect(strstr(text, "hit") != NULL, "%s", text);
  jit_string_free(text);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// n[0]: entries, n[1]: their bytes, n[2]: the smallest entry's bytes.
static int count_visit(void *user, const jit_cache_entry_info *e) {
  uint64_t *n = user;
  n[0]++;
  n[1] += e->size;
  if (!n[2] || e->size < n[2]) n[2] = e->size;
  return 1;
}

Test(disk, eviction_keeps_the_directory_under_its_limit) {
  int ns[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  in_child(g_dir, ns, 10);
  jit_context *ctx = ctx_with(g_dir, 0);
  uint64_t n[3] = {0, 0, 0};
  TU_OK(jit_cache_list(ctx, count_visit, n));
  cr_assert_eq(n[0], 10);
  uint64_t per_entry = n[1] / n[0], smallest = n[2];
  jit_context_destroy(ctx);

  // A limit of about three entries. Entries differ in size (the kernels for N < 6 and
  // N >= 6 differ), so how many fit is bounded by the smallest one: a prune leaves at
  // most 90% of the limit.
  uint64_t limit = per_entry * 3 + per_entry / 2;
  ctx = ctx_with(g_dir, limit);
  uint64_t evicted = 0;
  TU_OK(jit_cache_prune(ctx, &evicted));
  n[0] = n[1] = n[2] = 0;
  TU_OK(jit_cache_list(ctx, count_visit, n));
  cr_expect_eq(n[0] + evicted, 10, "%llu left, %llu evicted", (unsigned long long)n[0],
               (unsigned long long)evicted);
  cr_expect_geq(evicted + (limit - limit / 10) / smallest, 10);  // at most that many fit
  cr_expect_geq(evicted, 5);
  cr_expect_leq(n[1], limit - limit / 10, "%llu bytes left over 90%% of a %llu limit",
                (unsigned long long)n[1], (unsigned long long)limit);
  // What is left still hits.
  jit_graph *g = dense_graph(ctx);
  cr_expect_eq(run_dense(g, 10), 0);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

//===--- Races: 8 processes x 4 threads on an empty cache -----------------===//

typedef struct thread_arg {
  jit_graph *g;
  int seed, bad;
} thread_arg;

static void *race_thread(void *p) {
  thread_arg *a = p;
  int ns[] = {3, 5, 8, 13};
  for (int i = 0; i < 8; i++) a->bad |= run_dense(a->g, ns[(i + a->seed) % 4]);
  return NULL;
}

Test(disk, processes_and_threads_race_on_an_empty_cache) {
  enum { P = 8, T = 4 };
  int fds[2];
  cr_assert(pipe(fds) == 0);
  pid_t pids[P];
  for (int p = 0; p < P; p++) {
    pids[p] = fork();
    cr_assert(pids[p] >= 0);
    if (pids[p] == 0) {
      close(fds[0]);
      report r = {0};
      jit_context *ctx = ctx_with(g_dir, 0);
      jit_graph *g = dense_graph(ctx);
      pthread_t th[T];
      thread_arg args[T];
      for (int t = 0; t < T; t++) {
        args[t] = (thread_arg){g, p + t, 0};
        pthread_create(&th[t], NULL, race_thread, &args[t]);
      }
      for (int t = 0; t < T; t++) {
        pthread_join(th[t], NULL);
        r.bad |= args[t].bad;
      }
      jit_stats st = {0};
      jit_context_stats(ctx, &st);
      r.compiles = st.compiles;
      r.disk_hits = st.disk_hits;
      r.bad_entries = st.bad_entries;
      jit_graph_destroy(g);
      jit_context_destroy(ctx);
      ssize_t w = write(fds[1], &r, sizeof r);
      _exit(w == (ssize_t)sizeof r ? 0 : 1);
    }
  }
  close(fds[1]);
  uint64_t total_compiles = 0;
  for (int p = 0; p < P; p++) {
    report r;
    cr_assert_eq(read(fds[0], &r, sizeof r), (ssize_t)sizeof r);
    cr_expect_eq(r.bad, 0, "wrong results in a racing process");
    cr_expect_leq(r.compiles, 4, "a process compiled a key twice");
    cr_expect_eq(r.bad_entries, 0);
    total_compiles += r.compiles;
  }
  close(fds[0]);
  for (int p = 0; p < P; p++) {
    int status = 0;
    waitpid(pids[p], &status, 0);
    cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  // The per-key lock makes the processes share: each of the 4 keys compiled once.
  cr_expect_eq(total_compiles, 4, "%llu compiles across processes for 4 keys",
               (unsigned long long)total_compiles);
  jit_context *ctx = ctx_with(g_dir, 0);
  uint64_t checked = 0, bad = 0;
  TU_OK(jit_cache_verify(ctx, &checked, &bad));
  cr_expect_eq(checked, 4);
  cr_expect_eq(bad, 0);
  jit_context_destroy(ctx);
}
