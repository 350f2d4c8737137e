//===--- fleet.c - the fleet cache: machines sharing one Redis -------------===//
//
//   jitml_fleet [B] [M]      B batch sizes (default 24), M new machines (default 3)
//
// Processes stand for machines, each with its own disk cache directory, sharing one
// redis-server (started here on a free loopback port, no persistence). Workload: a
// 2-layer MLP with symbolic batch N, x[N,256] @ W1[256,512] -> relu -> @ W2[512,64],
// under EXACT (a kernel per batch size); each process calls every size twice, timed
// (the second call runs from memory). Phases: a build machine with the fleet cache
// (every first call compiles; destroying its context waits for the pushes); M new
// machines at once, fresh disks (remote hits, 0 compiles); a disk hit process on new
// machine 1's directory without the fleet; a no-fleet process on a fresh directory
// (what each new machine would pay without the fleet). Prints each process's
// counters, p50 / p90 first-call ms by kind, compile / remote-hit ratio and fleet
// compiles against distinct keys. Outputs are checked against plain C (1e-3 relative,
// floored at 1% of the largest |ref|); exits non-zero on a mismatch, a compile on a
// new machine or a key compiled twice. The parent makes no jitml context before it
// forks. The server is killed on every exit path (PR_SET_PDEATHSIG if this dies).
//
//===----------------------------------------------------------------------===//
#define _GNU_SOURCE
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "jitml.h"

enum { IN = 256, HID = 512, OUT = 64, kMaxSizes = 128, kMaxMachines = 16 };
static const DLDataType kF32 = {kDLFloat, 32, 1};
static const char *kPrefix = "jitml-fleet:";

typedef struct proc_result {
  int done, mismatches;
  double first_ms[kMaxSizes], second_ms[kMaxSizes], destroy_ms;
  jit_stats st;
  char state[160], error[240];
} proc_result;

static int g_sizes, g_machines;
static int64_t g_size[kMaxSizes], g_max_n;
static float *g_x, *g_w1, *g_w2, *g_ref;  // g_ref: [g_max_n, OUT]; size n: first n rows
static double g_ref_max;
static proc_result *g_res;  // shared with the children
static pid_t g_parent, g_redis = -1, g_kids[kMaxMachines];
static volatile sig_atomic_t g_stop, g_n_kids;  // g_stop: the signal that stops us
static int g_port;
static char g_root[256];

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

//===--- Cleanup: the server never outlives this process ------------------===//

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(path);
}

static void cleanup(void) {
  if (getpid() != g_parent) return;  // a forked child exiting
  if (g_redis > 0) {
    kill(g_redis, SIGKILL);
    waitpid(g_redis, NULL, 0);
    g_redis = -1;
  }
  if (g_root[0]) nftw(g_root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  g_root[0] = 0;
}

// Kills the server and the machines at once; main cleans up and dies of `sig` after.
static void on_signal(int sig) {
  if (getpid() != g_parent) {  // a machine not yet reset to the default
    signal(sig, SIG_DFL);
    raise(sig);
    return;
  }
  g_stop = sig;
  if (g_redis > 0) kill(g_redis, SIGKILL);
  for (int i = 0; i < g_n_kids; i++) kill(g_kids[i], SIGKILL);
}

static void catch_signal(int sig) {  // unless ignored (a background job's SIGINT)
  if (signal(sig, on_signal) == SIG_IGN) signal(sig, SIG_IGN);
}

static void stop_if_signaled(void) {
  if (!g_stop) return;
  cleanup();
  signal(g_stop, SIG_DFL);
  raise(g_stop);
}

static void die(const char *what) {
  fprintf(stderr, "jitml_fleet: %s\n", what);
  exit(1);  // atexit: cleanup()
}

//===--- The server ---------------------------------------------------------===//

static struct sockaddr_in loopback(int port) {
  return (struct sockaddr_in){.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
}

// Sends an inline command; the reply's first line goes to `out`. False: no answer.
static bool redis_cmd(const char *cmd, char *out, size_t size) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = loopback(g_port);
  struct timeval tv = {1, 0};
  size_t n = 0;
  out[0] = 0;
  if (fd < 0) return false;
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
      write(fd, cmd, strlen(cmd)) == (ssize_t)strlen(cmd) && write(fd, "\r\n", 2) == 2) {
    ssize_t r;
    while (n + 1 < size && !memchr(out, '\n', n) && (r = read(fd, out + n, size - 1 - n)) > 0)
      n += (size_t)r;
  }
  close(fd);
  out[n] = 0;
  out[strcspn(out, "\r\n")] = 0;
  return n > 0;
}

static long redis_count(const char *pattern) {
  char cmd[128], reply[256];
  snprintf(cmd, sizeof cmd, "KEYS %s%s", kPrefix, pattern);
  return redis_cmd(cmd, reply, sizeof reply) && reply[0] == '*' ? atol(reply + 1) : -1;
}

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0), port = -1;
  struct sockaddr_in a = loopback(0);
  socklen_t len = sizeof a;
  if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
      getsockname(fd, (struct sockaddr *)&a, &len) == 0)
    port = ntohs(a.sin_port);
  if (fd >= 0) close(fd);
  return port;
}

static bool start_redis(void) {
  char dir[300], log[320], port[16], reply[64];
  snprintf(dir, sizeof dir, "%s/redis", g_root);
  snprintf(log, sizeof log, "%s/redis.log", dir);
  if (mkdir(dir, 0700) != 0) return false;
  for (int attempt = 0; attempt < 5 && !g_stop; attempt++) {
    g_port = free_port();
    snprintf(port, sizeof port, "%d", g_port);
    g_redis = fork();
    if (g_redis < 0) return false;
    if (g_redis == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != g_parent) _exit(127);
      execlp("redis-server", "redis-server", "--port", port, "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", dir, "--logfile", log,
             "--daemonize", "no", (char *)NULL);
      _exit(127);
    }
    for (int i = 0; i < 500; i++) {  // up to 5 s
      if (redis_cmd("PING", reply, sizeof reply) && !strcmp(reply, "+PONG")) return true;
      if (waitpid(g_redis, NULL, WNOHANG) == g_redis) break;  // exited: port taken?
      nanosleep(&(struct timespec){0, 10000000}, NULL);
    }
    if (waitpid(g_redis, NULL, WNOHANG) == 0) {
      kill(g_redis, SIGKILL);
      waitpid(g_redis, NULL, 0);
    }
    g_redis = -1;
  }
  return false;
}

//===--- Data and reference ---------------------------------------------===//

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static float *rand_array(size_t n, float scale) {
  float *p = malloc(n * sizeof *p);
  if (!p) die("out of memory");
  for (size_t i = 0; i < n; i++) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    p[i] = ((float)(g_rng >> 40) / 16777216.0f * 2 - 1) * scale;
  }
  return p;
}

// Batch sizes: 1, small primes, powers of two and odd sizes; past the table, 64 + 3i.
static void make_data(void) {
  static const int64_t table[] = {1,  2,  3,  4,  5,  7,  8,  11, 13, 16, 17, 19,
                                  23, 24, 29, 31, 32, 37, 41, 48, 53, 61, 64, 97};
  for (int i = 0; i < g_sizes; i++) {
    g_size[i] = i < 24 ? table[i] : 64 + 3 * i;
    if (g_size[i] > g_max_n) g_max_n = g_size[i];
  }
  g_x = rand_array((size_t)g_max_n * IN, 1.0f);
  g_w1 = rand_array((size_t)IN * HID, 1.0f / 16);
  g_w2 = rand_array((size_t)HID * OUT, 1.0f / 22);
  g_ref = malloc(sizeof(float) * (size_t)g_max_n * OUT);
  double *h = malloc(sizeof(double) * HID);
  if (!g_ref || !h) die("out of memory");
  for (int64_t r = 0; r < g_max_n; r++) {
    for (int j = 0; j < HID; j++) {
      double acc = 0;
      for (int k = 0; k < IN; k++) acc += (double)g_x[r * IN + k] * g_w1[k * HID + j];
      h[j] = acc > 0 ? acc : 0;
    }
    for (int j = 0; j < OUT; j++) {
      double acc = 0;
      for (int k = 0; k < HID; k++) acc += h[k] * g_w2[k * OUT + j];
      g_ref[r * OUT + j] = (float)acc;
      if (fabs(acc) > g_ref_max) g_ref_max = fabs(acc);
    }
  }
  free(h);
}

//===--- A machine (runs in a child) ------------------------------------===//

static DLTensor tensor(float *data, int64_t *shape) {
  return (DLTensor){.data = data, .device = {kDLCPU, 0}, .ndim = 2, .dtype = kF32,
                    .shape = shape};
}

static bool fail(proc_result *res, const char *what, jit_status s) {
  if (!s) return false;
  if (!res->error[0])
    snprintf(res->error, sizeof res->error, "%s: %s", what, jit_status_message(s));
  jit_status_free(s);
  return true;
}

static jit_graph *build_mlp(jit_context *ctx, proc_result *res) {
  jit_graph *g = NULL;
  if (fail(res, "graph", jit_graph_create(ctx, "fleet_mlp", &g))) return NULL;
  int64_t dx[2] = {jit_symbol(g, "N"), IN}, dw1[2] = {IN, HID}, dw2[2] = {HID, OUT};
  jit_value x = jit_input(g, "x", kF32, 2, dx);
  jit_value w1 = jit_input(g, "w1", kF32, 2, dw1);
  jit_value w2 = jit_input(g, "w2", kF32, 2, dw2);
  jit_output(g, jit_matmul(g, jit_relu(g, jit_matmul(g, x, w1)), w2));
  if (fail(res, "finalize", jit_graph_finalize(g)) ||
      fail(res, "policy", jit_graph_set_shape_policy(g, JIT_SHAPE_POLICY_EXACT))) {
    jit_graph_destroy(g);
    return NULL;
  }
  return g;
}

// Runs every batch size twice (first call timed: compile or cache hit; second: in
// memory) and checks the first call's output.
static void run_sizes(jit_graph *g, proc_result *res, float *y) {
  int64_t dw1[2] = {IN, HID}, dw2[2] = {HID, OUT};
  for (int i = 0; i < g_sizes; i++) {
    int64_t n = g_size[i], dx[2] = {n, IN}, dy[2] = {n, OUT};
    DLTensor in[3] = {tensor(g_x, dx), tensor(g_w1, dw1), tensor(g_w2, dw2)};
    DLTensor out = tensor(y, dy);
    memset(y, 0xff, sizeof(float) * (size_t)(n * OUT));  // NaN: a skipped write shows
    double t0 = now_ms();
    bool bad = fail(res, "first run", jit_run(g, in, 3, &out, 1));
    res->first_ms[i] = now_ms() - t0;
    for (int64_t j = 0; !bad && j < n * OUT; j++) {
      double d = fabs((double)y[j] - g_ref[j]);
      bad = !(d <= 1e-3 * fmax(fabs(g_ref[j]), 1e-2 * g_ref_max));
    }
    t0 = now_ms();
    bad |= fail(res, "second run", jit_run(g, in, 3, &out, 1));
    res->second_ms[i] = now_ms() - t0;
    res->mismatches += bad;
  }
}

static int machine(proc_result *res, const char *dir, bool remote) {
  char url[64];
  snprintf(url, sizeof url, "redis://127.0.0.1:%d", g_port);
  jit_options o;
  jit_options_init(&o);
  o.cache_dir = dir;
  o.remote_cache = remote ? url : "";
  o.remote_prefix = kPrefix;
  o.remote_signing_key = "";
  o.bundle_trusted_keys = "";
  o.shape_policy = JIT_SHAPE_POLICY_EXACT;
  o.num_threads = 1;
  jit_context *ctx = NULL;
  if (fail(res, "context", jit_context_create(&o, &ctx))) return 2;
  jit_graph *g = build_mlp(ctx, res);
  float *y = malloc(sizeof(float) * (size_t)g_max_n * OUT);
  if (g && y) run_sizes(g, res, y);
  res->st.struct_size = sizeof res->st;
  fail(res, "stats", jit_context_stats(ctx, &res->st));
  const char *state = NULL;
  jit_cache_remote(ctx, &state);
  snprintf(res->state, sizeof res->state, "%s", state ? state : "(none)");
  free(y);
  jit_graph_destroy(g);
  double t0 = now_ms();
  jit_context_destroy(ctx);  // waits for the background pushes
  res->destroy_ms = now_ms() - t0;
  res->done = 1;
  return g && !res->error[0] && !res->mismatches ? 0 : 1;
}

//===--- Phases (parent) --------------------------------------------------===//

// Runs machines in slots [first, first + n) at once, each in the cache directory
// m<slot> (m<dir_slot> when dir_slot >= 0), and waits for them; returns the failures.
static int phase(int first, int n, int dir_slot, bool remote) {
  pid_t *pids = g_kids;
  int failed = 0;
  fflush(NULL);
  for (int i = 0; i < n; i++) {
    char dir[300];
    snprintf(dir, sizeof dir, "%s/m%d", g_root, dir_slot >= 0 ? dir_slot : first + i);
    if ((pids[i] = fork()) < 0) die("fork failed");
    if (pids[i] == 0) {
      signal(SIGINT, SIG_DFL), signal(SIGTERM, SIG_DFL), signal(SIGHUP, SIG_DFL);
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      _exit(machine(&g_res[first + i], dir, remote));
    }
    g_n_kids = i + 1;
  }
  for (int i = 0; i < n; i++) {
    int status = 0;
    while (waitpid(pids[i], &status, 0) < 0 && errno == EINTR) continue;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
    if (g_stop) continue;
    failed++;
    const char *error = g_res[first + i].error;
    fprintf(stderr, "jitml_fleet: process %d %s %d: %s\n", first + i,
            WIFSIGNALED(status) ? "killed by signal" : "exited",
            WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status),
            error[0] ? error : "(no message)");
  }
  g_n_kids = 0;
  stop_if_signaled();
  return failed;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

// Percentile p (nearest rank) of the first (or second) calls of slots [lo, hi).
static double pct(int lo, int hi, bool second, double p) {
  double v[kMaxSizes * kMaxMachines];
  int n = 0;
  for (int s = lo; s < hi; s++)
    for (int i = 0; i < g_sizes; i++)
      v[n++] = (second ? g_res[s].second_ms : g_res[s].first_ms)[i];
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  int k = (int)ceil(p * n) - 1;
  return v[k < 0 ? 0 : k];
}

#define U(x) ((unsigned long long)(x))

static void print_procs(void) {
  printf("%-16s %7s %7s %6s %6s %6s %6s %6s %6s %6s %8s  %s\n", "process", "p50 ms",
         "p90 ms", "compl", "disk", "r.hit", "r.miss", "r.err", "r.rej", "puts", "destroy",
         "remote state");
  for (int s = 0; s < g_machines + 3; s++) {
    char name[32];
    snprintf(name, sizeof name, s == 0 ? "build machine" : s <= g_machines ? "new machine %d"
             : s == g_machines + 1 ? "disk hit" : "no fleet cache", s);
    const jit_stats *st = &g_res[s].st;
    printf("%-16s %7.1f %7.1f %6llu %6llu %6llu %6llu %6llu %6llu %6llu %8.1f  %s\n", name,
           pct(s, s + 1, false, 0.5), pct(s, s + 1, false, 0.9), U(st->compiles),
           U(st->disk_hits), U(st->remote_hits), U(st->remote_misses), U(st->remote_errors),
           U(st->remote_rejected), U(st->remote_puts), g_res[s].destroy_ms, g_res[s].state);
  }
}

static int report(long values, long locks) {
  int m = g_machines, bad = 0;
  static const char *names[] = {"compile (build machine)", "remote hit (new machines)",
                                "disk hit", "compile (no fleet cache)"};
  const int lo[] = {0, 1, m + 1, m + 2}, hi[] = {1, m + 1, m + 2, m + 3};
  printf("\n%-26s %8s %8s %8s %13s\n", "first call", "p50 ms", "p90 ms", "max ms",
         "2nd call p50");
  for (int r = 0; r < 4; r++)
    printf("%-26s %8.1f %8.1f %8.1f %13.3f\n", names[r], pct(lo[r], hi[r], false, 0.5),
           pct(lo[r], hi[r], false, 0.9), pct(lo[r], hi[r], false, 1.0),
           pct(lo[r], hi[r], true, 0.5));
  double hit = pct(1, m + 1, false, 0.5);
  printf("\ncompile / remote hit, p50: %.1fx (no fleet cache), %.1fx (build machine)\n",
         pct(m + 2, m + 3, false, 0.5) / hit, pct(0, 1, false, 0.5) / hit);
  uint64_t fresh = 0, hits = 0, bytes = 0, mism = 0;
  for (int s = 1; s <= m; s++) {
    fresh += g_res[s].st.compiles, hits += g_res[s].st.remote_hits;
    bytes += g_res[s].st.remote_bytes_read;
  }
  uint64_t fleet = g_res[0].st.compiles + fresh;
  for (int s = 0; s < m + 3; s++) mism += U(g_res[s].mismatches);
  printf("fleet compiles: %llu for %d distinct keys (build machine %llu, new machines %llu)\n",
         U(fleet), g_sizes, U(g_res[0].st.compiles), U(fresh));
  printf("remote hits: %llu of %d first calls, %.1f KiB a value\n", U(hits), m * g_sizes,
         hits ? bytes / 1024.0 / hits : 0.0);
  printf("server after the build machine: %ld values, %ld fleet locks\n", values, locks);
  printf("mismatches: %llu of %d outputs\n", U(mism), (m + 3) * g_sizes);
  if (fleet != (uint64_t)g_sizes) bad++, printf("FAIL: the fleet compiled %llu\n", U(fleet));
  if (fresh) bad++, printf("FAIL: new machines compiled %llu kernels\n", U(fresh));
  if (g_res[m + 1].st.compiles) bad++, printf("FAIL: the disk-hit process compiled\n");
  if (values != g_sizes || locks != 0) bad++, printf("FAIL: the server's keys are wrong\n");
  if (mism) bad++, printf("FAIL: %llu outputs differ from the reference\n", U(mism));
  for (int s = 0; s < m + 3; s++)
    if (!g_res[s].done) bad++, printf("FAIL: process %d did not finish\n", s);
  return bad;
}

int main(int argc, char **argv) {
  g_sizes = argc > 1 ? atoi(argv[1]) : 24;
  g_machines = argc > 2 ? atoi(argv[2]) : 3;
  if (g_sizes < 1 || g_sizes > kMaxSizes || g_machines < 1 || g_machines > kMaxMachines)
    die("usage: jitml_fleet [sizes 1..128] [new machines 1..16]");
  g_parent = getpid();
  make_data();
  g_res = mmap(NULL, sizeof(proc_result) * (kMaxMachines + 3), PROT_READ | PROT_WRITE,
               MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (g_res == MAP_FAILED) die("mmap failed");
  const char *tmp = getenv("TMPDIR");
  snprintf(g_root, sizeof g_root, "%s/jitml-fleet-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(g_root)) die("mkdtemp failed");
  atexit(cleanup);
  catch_signal(SIGINT), catch_signal(SIGTERM), catch_signal(SIGHUP);
  bool started = start_redis();
  stop_if_signaled();
  if (!started) die("redis-server could not be started (scripts/install-deps.sh)");
  printf("jitml_fleet: MLP x[N,%d] @ [%d,%d] -> relu -> @ [%d,%d], EXACT, %d batch sizes "
         "(N up to %lld), %d new machines, redis-server on 127.0.0.1:%d\n\n", IN, IN, HID,
         HID, OUT, g_sizes, (long long)g_max_n, g_machines, g_port);
  int m = g_machines, failed = phase(0, 1, -1, true);  // the build machine
  long values = redis_count("k:*"), locks = redis_count("lock:*");
  failed += phase(1, m, -1, true);       // new machines
  failed += phase(m + 1, 1, 1, false);   // disk hits: new machine 1's cache, no fleet
  failed += phase(m + 2, 1, -1, false);  // no fleet cache
  print_procs();
  failed += report(values, locks);
  fflush(stdout);
  cleanup();
  return failed ? 1 : 0;
}
