//===--- isolate.c - importing and compiling MLIR text in a worker process ===//
//
// MLIR text from outside reaches MLIR's parser, verifiers and passes and LLVM, which
// may crash, hang or exhaust memory on input nobody tested (the fuzzer keeps finding
// such text; lowering/mlir_guard.c refuses the known kinds cheaply). Where isolation
// is on, the same work is first done by tools/jitml_worker.c in a child process, with
// a time limit and optionally a memory limit:
//
//   import:  the worker imports the text; only if that succeeds does this process
//            import it too (the same deterministic code, shown not to crash on it);
//   compile: the worker compiles a graph from MLIR for one binding into the disk
//            cache, and this process loads the kernel from there (jit/run.c).
//
// A worker that dies of a signal, exits without answering or passes its time limit
// (then killed) becomes JIT_PARSE_ERROR (import) or JIT_COMPILE_ERROR (compile) with
// its last lines of stderr; its own status is passed on as it is. The host process
// goes on either way.
//
// The worker is $JITML_WORKER, else `jitml-worker` next to libjitml.so (the build
// tree), else <libexecdir>/jitml/jitml-worker of the install (JITML_WORKER_FROM_LIB:
// the path from the library's directory, e.g. ../libexec/jitml). The child is made
// with fork + execve, and between the two it only calls async-signal-safe functions
// (dup2, setrlimit, close), so forking a threaded process is safe. Where glibc has it
// (2.34+) the fork is _Fork, which runs no pthread_atfork handlers: the library's own
// (jit/fork.c) would wait for the background compile, and this fork may happen on
// that thread or while it waits for the kernel this compile makes.
//
//===----------------------------------------------------------------------===//
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/hex.h"
#include "base/text.h"
#include "jit/internal.h"

extern char **environ;

//===--- Finding the worker ----------------------------------------------===//

static bool jit__executable(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

void jit__isolation_init(jit_context *ctx) {
  jit_isolation mode = ctx->options.mlir_isolation;
  const char *env = getenv("JITML_ISOLATION");
  if (mode == JIT_ISOLATION_AUTO && env) {
    if (!strcmp(env, "on")) mode = JIT_ISOLATION_ON;
    else if (!strcmp(env, "off")) mode = JIT_ISOLATION_OFF;
    else if (!strcmp(env, "all")) mode = JIT_ISOLATION_ALL;
    else if (strcmp(env, "auto"))
      jit__log(ctx, JIT_LOG_WARNING, "JITML_ISOLATION: `%s` is not on, off, auto or all; "
               "ignored", env);
  }
  ctx->isolation = mode;
  ctx->worker[0] = 0;
  if (mode == JIT_ISOLATION_OFF) return;
  const char *named = getenv("JITML_WORKER");
  if (named && named[0]) {
    snprintf(ctx->worker, sizeof ctx->worker, "%s", named);
  } else {
    Dl_info info;
    char dir[PATH_MAX] = "";
    if (dladdr((void *)jit_version, &info) && info.dli_fname) {
      snprintf(dir, sizeof dir, "%s", info.dli_fname);
      char *slash = strrchr(dir, '/');
      if (slash) *slash = 0;
      else snprintf(dir, sizeof dir, ".");
    }
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/jitml-worker", dir);
    if (!jit__executable(path))
      snprintf(path, sizeof path, "%s/%s/jitml-worker", dir, JITML_WORKER_FROM_LIB);
    if (jit__executable(path) && strlen(path) < sizeof ctx->worker)
    memcpy(ctx->worker, path, strlen(path) + 1);
  }
  if (ctx->worker[0] && !jit__executable(ctx->worker)) {
    jit__log(ctx, JIT_LOG_WARNING, "isolation worker %s is not an executable file",
             ctx->worker);
    ctx->worker[0] = 0;
  }
  if (!ctx->worker[0] && mode == JIT_ISOLATION_AUTO)
    jit__log(ctx, JIT_LOG_WARNING, "no jitml-worker found (next to libjitml.so, in "
             "%s, or $JITML_WORKER): MLIR text is imported and compiled in this process",
             JITML_WORKER_FROM_LIB);
}

bool jit__isolation_on(const jit_context *ctx) {
  return ctx->isolation == JIT_ISOLATION_ON || ctx->isolation == JIT_ISOLATION_ALL ||
         (ctx->isolation == JIT_ISOLATION_AUTO && ctx->worker[0]);
}

//===--- The request ------------------------------------------------------===//

static void jit__hex_field(jit__text *t, const char *name, const char *value) {
  jit__text_printf(t, "%s ", name);
  if (!value || !value[0]) {
    jit__text_append(t, "-", 1);
  } else {
    for (const unsigned char *c = (const unsigned char *)value; *c; c++)
      jit__text_printf(t, "%02x", *c);
  }
  jit__text_append(t, "\n", 1);
}

static void jit__request_head(jit_context *ctx, const char *mode, const char *entry,
                              const DLTensor *inputs, int n_inputs, size_t length,
                              jit__text *t) {
  jit__text_printf(t, "jitml-worker 3\nmode %s\n", mode);
  jit__hex_field(t, "entry", entry);
  jit__text_printf(t, "opt_level %d\nthreads %d\nconv_algorithm %d\n", ctx->options.opt_level,
                   ctx->options.num_threads, (int)ctx->options.conv_algorithm);
  jit__hex_field(t, "cache_dir", jit__cache_dir(ctx->cache));
  jit__text_printf(t, "inputs %d\n", n_inputs);
  for (int i = 0; i < n_inputs; i++) {
    jit__text_printf(t, "%d %d %d", inputs[i].dtype.code, inputs[i].dtype.bits,
                     inputs[i].ndim);
    for (int d = 0; d < inputs[i].ndim; d++)
      jit__text_printf(t, " %lld", (long long)inputs[i].shape[d]);
    jit__text_append(t, "\n", 1);
  }
  jit__text_printf(t, "text %zu\n", length);
}

//===--- The child --------------------------------------------------------===//

typedef struct jit__child {
  pid_t pid;
  int in, out, err;  // our ends: its stdin, stdout, stderr
} jit__child;

static jit_status jit__spawn(const jit_context *ctx, jit__child *c) {
  int pin[2], pout[2], perr[2];
  if (pipe2(pin, O_CLOEXEC) || pipe2(pout, O_CLOEXEC) || pipe2(perr, O_CLOEXEC))
    return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "isolation worker: pipe: %s", strerror(errno));
  struct rlimit mem = {ctx->options.isolation_max_bytes, ctx->options.isolation_max_bytes};
  char *const argv[] = {(char *)"jitml-worker", NULL};
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
  pid_t pid = _Fork();
#else
  pid_t pid = fork();
#endif
  if (pid == 0) {
    // Async-signal-safe calls only until execve.
    dup2(pin[0], 0);
    dup2(pout[1], 1);
    dup2(perr[1], 2);
    if (mem.rlim_cur) setrlimit(RLIMIT_AS, &mem);
    execve(ctx->worker, argv, environ);
    _exit(127);
  }
  close(pin[0]);
  close(pout[1]);
  close(perr[1]);
  if (pid < 0) {
    close(pin[1]);
    close(pout[0]);
    close(perr[0]);
    return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "isolation worker: fork: %s", strerror(errno));
  }
  *c = (jit__child){pid, pin[1], pout[0], perr[0]};
  fcntl(c->in, F_SETFL, O_NONBLOCK);
  fcntl(c->out, F_SETFL, O_NONBLOCK);
  fcntl(c->err, F_SETFL, O_NONBLOCK);
  return NULL;
}

// What came back from a child.
typedef struct jit__reply {
  char out[4096], err[4096];  // stdout; the tail of stderr
  size_t n_out, n_err;
  bool timed_out;
  int wait_status;
} jit__reply;

static void jit__keep_tail(char *buf, size_t *n, size_t cap, const char *add, size_t k) {
  if (k >= cap - 1) {
    memcpy(buf, add + k - (cap - 1), cap - 1);
    *n = cap - 1;
  } else {
    if (*n + k > cap - 1) {
      size_t drop = *n + k - (cap - 1);
      memmove(buf, buf + drop, *n - drop);
      *n -= drop;
    }
    memcpy(buf + *n, add, k);
    *n += k;
  }
  buf[*n] = 0;
}

// Writes `head` then `body` to the child and reads its output until it closes both
// pipes or `deadline_ms` (jit__now_ms) passes; then reaps it (killed on a timeout).
static void jit__exchange(jit__child *c, const jit__text *head, const char *body,
                          size_t body_len, double deadline_ms, jit__reply *r) {
  size_t at = 0, total = head->len + body_len;
  bool out_open = true, err_open = true;
  while ((out_open || err_open) && !r->timed_out) {
    struct pollfd p[3] = {{c->out, POLLIN, 0}, {c->err, POLLIN, 0}, {c->in, POLLOUT, 0}};
    int n = c->in >= 0 ? 3 : 2;
    double left = deadline_ms - jit__now_ms();
    if (left <= 0) {
      r->timed_out = true;
      break;
    }
    if (poll(p, (nfds_t)n, left > 1000 ? 1000 : (int)left + 1) < 0 && errno != EINTR) break;
    char buf[4096];
    if (p[0].revents) {
      ssize_t k = read(c->out, buf, sizeof buf);
      if (k > 0) jit__keep_tail(r->out, &r->n_out, sizeof r->out, buf, (size_t)k);
      else if (k == 0 || errno != EAGAIN) out_open = false;
    }
    if (p[1].revents) {
      ssize_t k = read(c->err, buf, sizeof buf);
      if (k > 0) jit__keep_tail(r->err, &r->n_err, sizeof r->err, buf, (size_t)k);
      else if (k == 0 || errno != EAGAIN) err_open = false;
    }
    if (n == 3 && p[2].revents) {
      const char *src = at < head->len ? head->p + at : body + (at - head->len);
      size_t len = at < head->len ? head->len - at : total - at;
      ssize_t k = write(c->in, src, len > 65536 ? 65536 : len);
      if (k > 0) at += (size_t)k;
      if ((k < 0 && errno != EAGAIN) || at == total) {  // EPIPE: it stopped reading
        close(c->in);
        c->in = -1;
      }
    }
  }
  if (c->in >= 0) close(c->in);
  close(c->out);
  close(c->err);
  if (r->timed_out) kill(c->pid, SIGKILL);
  while (waitpid(c->pid, &r->wait_status, 0) < 0 && errno == EINTR) {
  }
}

//===--- One run ------------------------------------------------------------===//

jit_status jit__isolated(jit_context *ctx, bool compile, const char *what, const char *text,
                         size_t length, const char *entry, const DLTensor *inputs,
                         int n_inputs, bool *died_out) {
  bool died_here = false, *died = died_out ? died_out : &died_here;
  *died = false;
  jit_status_code failure = compile ? JIT_COMPILE_ERROR : JIT_PARSE_ERROR;
  const char *doing = compile ? "compiling" : "importing";
  if (!ctx->worker[0])
    return JIT_ERR(JIT_UNAVAILABLE, "%s %s in a worker process: no jitml-worker found "
                   "(options.mlir_isolation requires one)", doing, what);
  jit__text head = {0};
  jit__request_head(ctx, compile ? "compile" : "import", entry, inputs, n_inputs, length,
                    &head);
  if (head.oom) {
    free(head.p);
    return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
  }
  // A worker that stops reading makes our writes fail with EPIPE: keep the SIGPIPE
  // that would come with them pending on this thread, then drop it.
  sigset_t pipe_set, old;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
  jit__child c = {-1, -1, -1, -1};
  jit_status s = jit__spawn(ctx, &c);
  jit__reply *r = calloc(1, sizeof *r);
  double t0 = jit__now_ms();
  uint64_t limit_ms = ctx->options.isolation_timeout_ms ? ctx->options.isolation_timeout_ms
                                                        : 300000;
  if (!s && !r) {
    kill(c.pid, SIGKILL);
    s = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
  }
  if (!s) jit__exchange(&c, &head, text, length, t0 + (double)limit_ms, r);
  struct timespec zero = {0, 0};
  while (sigtimedwait(&pipe_set, NULL, &zero) > 0) {
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  free(head.p);
  if (s) {
    free(r);
    return s;
  }
  int code = 0;
  char message[4096] = "";
  int ws = r->wait_status;
  *died = true;
  if (r->timed_out) {
    s = JIT_ERR(failure, "%s %s in a worker process: no answer within %llu ms, killed%s%s",
                doing, what, (unsigned long long)limit_ms, r->n_err ? "; it said: " : "",
                r->err);
  } else if (!strncmp(r->out, "ok\n", 3) && WIFEXITED(ws) && WEXITSTATUS(ws) == 0) {
    s = NULL;
    *died = false;
  } else if (sscanf(r->out, "error %d %4095[^\n]", &code, message) == 2 && code > 0 &&
             code <= JIT_INTERNAL && WIFEXITED(ws) && WEXITSTATUS(ws) == 0) {
    s = JIT_ERR((jit_status_code)code, "%s", message);
    *died = false;
  } else if (WIFSIGNALED(ws)) {
    s = JIT_ERR(failure, "%s %s in a worker process: it died of signal %d (%s)%s%s", doing,
                what, WTERMSIG(ws), strsignal(WTERMSIG(ws)), r->n_err ? "; it said: " : "",
                r->err);
  } else {
    s = JIT_ERR(failure, "%s %s in a worker process: it exited with status %d without an "
                "answer%s%s", doing, what, WIFEXITED(ws) ? WEXITSTATUS(ws) : -1,
                r->n_err ? "; it said: " : "", r->err);
  }
  jit__log(ctx, JIT_LOG_DEBUG, "isolation worker: %s %s in %.1f ms: %s", doing, what,
           jit__now_ms() - t0, s ? jit_status_message(s) : "ok");
  free(r);
  return s;
}
