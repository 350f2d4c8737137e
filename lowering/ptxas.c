//===--- ptxas.c - PTX -> cubin with the CUDA toolkit's ptxas --------------===//
//
// See ptxas.h. Why a subprocess and not MLIR's `gpu-module-to-binary{format=bin}`: that
// pass also shells out to ptxas, but through LLVM's process API with no bound on the
// wait and with its output folded into diagnostics, and it makes the cubin *instead of*
// the PTX, while the cache wants both (the cubin for this SM, the PTX as the fallback
// the driver JITs when the cubin is refused).
//
// Why output goes to a file and not a pipe: with a pipe, a ptxas that writes more than
// the pipe holds while we wait for it would block; a file in the private directory
// needs no reader.
//
//===----------------------------------------------------------------------===//
#include "base/clock.h"
#include "lowering/ptxas.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/status.h"

extern char **environ;

static bool jit__is_executable(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

//===--- Private directory -----------------------------------------------===//

// Removes everything in `dir` (ptxas writes only the files we name, but a killed ptxas
// may leave others) and the directory itself.
static void jit__rm_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (d) {
    struct dirent *e;
    char path[4200];
    while ((e = readdir(d))) {
      if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
      snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
      unlink(path);
    }
    closedir(d);
  }
  rmdir(dir);
}

static jit_status jit__make_tmp_dir(char *out, size_t size) {
  const char *base = getenv("TMPDIR");
  if (!base || base[0] != '/' || strlen(base) > size - 32) base = "/tmp";
  snprintf(out, size, "%s/jitml-ptxas-XXXXXX", base);
  if (!mkdtemp(out))
    return JIT_ERR(JIT_INTERNAL, "ptxas: cannot make a temporary directory %s: %s", out,
                   strerror(errno));
  return NULL;
}

static jit_status jit__write_file(const char *path, const void *data, size_t size) {
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0)
    return JIT_ERR(JIT_INTERNAL, "ptxas: cannot create %s: %s", path, strerror(errno));
  const char *p = data;
  while (size) {
    ssize_t n = write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = errno;
      close(fd);
      return JIT_ERR(JIT_INTERNAL, "ptxas: cannot write %s: %s", path, strerror(err));
    }
    p += n;
    size -= (size_t)n;
  }
  close(fd);
  return NULL;
}

// Reads at most `limit` bytes of `path` into a malloc'ed, NUL-terminated buffer.
static jit_status jit__read_file(const char *path, size_t limit, char **out, size_t *out_size) {
  *out = NULL;
  *out_size = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return JIT_ERR(JIT_COMPILE_ERROR, "ptxas: it wrote no %s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    close(fd);
    return JIT_ERR(JIT_INTERNAL, "ptxas: cannot stat %s: %s", path, strerror(errno));
  }
  size_t want = (size_t)st.st_size < limit ? (size_t)st.st_size : limit;
  char *buf = malloc(want + 1);
  if (!buf) {
    close(fd);
    return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "ptxas: out of memory reading %s", path);
  }
  size_t got = 0;
  while (got < want) {
    ssize_t n = read(fd, buf + got, want - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += (size_t)n;
  }
  close(fd);
  buf[got] = '\0';
  *out = buf;
  *out_size = got;
  return NULL;
}

//===--- Running ptxas ----------------------------------------------------===//

typedef struct jit__run_result {
  bool exited;      // exited normally with `code`
  int code;
  int signal;       // killed by this signal (ours after a timeout, or another's)
  bool timed_out;
  bool unknown;     // reaped by someone else (SIGCHLD ignored): status unknown
} jit__run_result;

// Runs argv[0] with `argv` (no shell), stdin /dev/null, stdout and stderr appended to
// `log_path`; waits at most `timeout_ms`, then kills it (SIGKILL) and reaps it.
static jit_status jit__run(char *const argv[], const char *log_path, uint32_t timeout_ms,
                           jit__run_result *r) {
  memset(r, 0, sizeof *r);
  posix_spawn_file_actions_t fa;
  if (posix_spawn_file_actions_init(&fa) != 0)
    return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "ptxas: out of memory");
  int e = posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  if (!e) e = posix_spawn_file_actions_addopen(&fa, 1, log_path,
                                               O_WRONLY | O_CREAT | O_APPEND, 0600);
  if (!e) e = posix_spawn_file_actions_adddup2(&fa, 1, 2);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
  // Descriptors the application left open without O_CLOEXEC (and our cache lock files)
  // are none of ptxas's business.
  if (!e) e = posix_spawn_file_actions_addclosefrom_np(&fa, 3);
#endif
  pid_t pid = 0;
  if (!e) e = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  if (e)
    return JIT_ERR(JIT_UNAVAILABLE, "ptxas: cannot run %s: %s", argv[0], strerror(e));
  double deadline = jit__now_ms() + timeout_ms;
  long sleep_ns = 200000;  // 0.2 ms, doubling to 10 ms: short jobs return fast
  for (;;) {
    int st = 0;
    pid_t w = waitpid(pid, &st, WNOHANG);
    if (w == pid) {
      if (WIFEXITED(st)) {
        r->exited = true;
        r->code = WEXITSTATUS(st);
      } else if (WIFSIGNALED(st)) {
        r->signal = WTERMSIG(st);
      }
      return NULL;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {  // ECHILD: the application ignores SIGCHLD, so the kernel reaped it
      r->unknown = true;
      return NULL;
    }
    if (jit__now_ms() >= deadline) {
      kill(pid, SIGKILL);
      while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
      }
      r->timed_out = true;
      r->signal = SIGKILL;
      return NULL;
    }
    struct timespec ts = {0, sleep_ns};
    nanosleep(&ts, NULL);
    if (sleep_ns < 10000000) sleep_ns *= 2;
  }
}

// " (exit status 255): <output>" for a failed run, into buf.
static void jit__describe(const jit__run_result *r, const char *output, char *buf,
                          size_t size) {
  const char *out = output && output[0] ? output : "(no output)";
  if (r->timed_out)
    snprintf(buf, size, "timed out and was killed; output so far: %s", out);
  else if (r->signal)
    snprintf(buf, size, "was killed by signal %d; output: %s", r->signal, out);
  else if (r->unknown)
    snprintf(buf, size, "ended with an unknown exit status (SIGCHLD is ignored); output: %s",
             out);
  else
    snprintf(buf, size, "exit status %d: %s", r->code, out);
  // Trailing newlines make messages ragged.
  size_t n = strlen(buf);
  while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ')) buf[--n] = 0;
}

//===--- Finding ptxas ----------------------------------------------------===//

// Parses "Cuda compilation tools, release 13.0, V13.0.88" from `ptxas --version`.
static void jit__parse_version(const char *text, jit__ptxas *out) {
  const char *rel = strstr(text, "release ");
  if (rel && sscanf(rel, "release %d.%d", &out->major, &out->minor) != 2)
    out->major = out->minor = 0;
  const char *v = rel ? strstr(rel, ", V") : NULL;
  if (v) {
    v += 3;
    size_t n = strspn(v, "0123456789.");
    if (n >= sizeof out->version) n = sizeof out->version - 1;
    memcpy(out->version, v, n);
    out->version[n] = 0;
  } else if (out->major) {
    snprintf(out->version, sizeof out->version, "%d.%d", out->major, out->minor);
  }
}

static jit_status jit__probe(jit__ptxas *out) {
  char dir[4096], log_path[4200];
  JIT_PROPAGATE(jit__make_tmp_dir(dir, sizeof dir));
  snprintf(log_path, sizeof log_path, "%s/version.txt", dir);
  char *argv[] = {out->path, "--version", NULL};
  jit__run_result r;
  jit_status s = jit__run(argv, log_path, 10000, &r);
  char *text = NULL;
  size_t n = 0;
  if (!s) s = jit__read_file(log_path, 16384, &text, &n);
  if (!s && !(r.exited && r.code == 0) && !r.unknown) {
    char why[2048];
    jit__describe(&r, text, why, sizeof why);
    s = JIT_ERR(JIT_UNAVAILABLE, "ptxas: `%s --version` failed: %s", out->path, why);
  }
  if (!s) jit__parse_version(text, out);
  free(text);
  jit__rm_dir(dir);
  return s;
}

jit_status jit__ptxas_find(const char *toolkit, jit__ptxas *out) {
  if (!out) return JIT_ERR(JIT_INVALID_ARGUMENT, "ptxas: out is NULL");
  memset(out, 0, sizeof *out);
  char looked[2048] = "";
  size_t used = 0;
  const char *dirs[3] = {NULL, NULL, NULL};
  const char *names[3] = {NULL, NULL, NULL};
  if (toolkit) {
    if (!toolkit[0])
      return JIT_ERR(JIT_UNAVAILABLE, "ptxas: no CUDA toolkit is to be used "
                     "(options.cuda_toolkit is \"\")");
    dirs[0] = toolkit, names[0] = "options.cuda_toolkit";
  } else {
    dirs[0] = getenv("CUDA_HOME"), names[0] = "$CUDA_HOME";
    dirs[1] = getenv("CUDA_PATH"), names[1] = "$CUDA_PATH";
    dirs[2] = "/usr/local/cuda", names[2] = NULL;
  }
  for (int i = 0; i < 3 && !out->path[0]; i++) {
    if (!dirs[i] || !dirs[i][0]) continue;
    char cand[4096];
    int len = snprintf(cand, sizeof cand, "%s/bin/ptxas", dirs[i]);
    if (len > 0 && (size_t)len < sizeof cand && jit__is_executable(cand))
      snprintf(out->path, sizeof out->path, "%s", cand);
    else if (used < sizeof looked)
      used += (size_t)snprintf(looked + used, sizeof looked - used, "%s%s%s%s",
                               used ? ", " : "", cand, names[i] ? " from " : "",
                               names[i] ? names[i] : "");
  }
  // The toolkit's own directories first; then $PATH (Debian's nvidia-cuda-toolkit
  // puts ptxas in /usr/bin).
  const char *path_env = toolkit ? NULL : getenv("PATH");
  while (path_env && *path_env && !out->path[0]) {
    size_t len = strcspn(path_env, ":");
    char cand[4096];
    if (len && len < sizeof cand - 8) {
      snprintf(cand, sizeof cand, "%.*s/ptxas", (int)len, path_env);
      if (cand[0] == '/' && jit__is_executable(cand))
        snprintf(out->path, sizeof out->path, "%s", cand);
    }
    path_env += len + (path_env[len] == ':');
  }
  if (!out->path[0])
    return JIT_ERR(JIT_UNAVAILABLE, "ptxas: no CUDA toolkit with ptxas (looked for %s%s)",
                   looked[0] ? looked : "nothing", toolkit ? "" : " and in $PATH");
  jit_status s = jit__probe(out);
  if (s) {
    out->path[0] = 0;
    return s;
  }
  return NULL;
}

//===--- Assembling -------------------------------------------------------===//

// sm_<digits> with an optional a/f suffix: all ptxas accepts, and nothing that could be
// read as another option.
static bool jit__valid_arch(const char *arch) {
  if (strncmp(arch, "sm_", 3) != 0) return false;
  size_t n = strspn(arch + 3, "0123456789");
  if (n == 0 || n > 4) return false;
  const char *rest = arch + 3 + n;
  return !rest[0] || ((rest[0] == 'a' || rest[0] == 'f') && !rest[1]);
}

jit_status jit__ptxas_assemble(const jit__ptxas *tool, const void *ptx, size_t ptx_size,
                               const char *arch, uint32_t timeout_ms, uint8_t **out_cubin,
                               size_t *out_size) {
  if (!out_cubin || !out_size)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "ptxas: out_cubin or out_size is NULL");
  *out_cubin = NULL;
  *out_size = 0;
  if (!tool || !ptx || !ptx_size || !arch)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "ptxas: NULL tool, PTX or arch, or empty PTX");
  if (!tool->path[0]) return JIT_ERR(JIT_UNAVAILABLE, "ptxas: no ptxas was found");
  if (!jit__valid_arch(arch))
    return JIT_ERR(JIT_INVALID_ARGUMENT, "ptxas: `%.32s` is not an SM architecture "
                   "(sm_<digits>[a|f])", arch);
  if (memchr(ptx, '\0', ptx_size))
    return JIT_ERR(JIT_INVALID_ARGUMENT, "ptxas: the PTX holds a NUL byte");
  if (!timeout_ms) timeout_ms = 120000;

  char dir[4096], in[4200], out[4200], log_path[4200], arch_opt[48];
  JIT_PROPAGATE(jit__make_tmp_dir(dir, sizeof dir));
  snprintf(in, sizeof in, "%s/kernel.ptx", dir);
  snprintf(out, sizeof out, "%s/kernel.cubin", dir);
  snprintf(log_path, sizeof log_path, "%s/ptxas.log", dir);
  snprintf(arch_opt, sizeof arch_opt, "-arch=%s", arch);
  jit_status s = jit__write_file(in, ptx, ptx_size);
  jit__run_result r;
  if (!s) {
    char *argv[] = {(char *)tool->path, arch_opt, "-O3", in, "-o", out, NULL};
    s = jit__run(argv, log_path, timeout_ms, &r);
  }
  if (!s && !(r.exited && r.code == 0) && !r.unknown) {
    char *text = NULL;
    size_t n = 0;
    jit_status rs = jit__read_file(log_path, 8192, &text, &n);
    jit_status_free(rs);
    char why[9000];
    jit__describe(&r, text, why, sizeof why);
    free(text);
    if (r.timed_out)
      s = JIT_ERR(JIT_COMPILE_ERROR, "ptxas %s for %s timed out after %u ms and was killed",
                  tool->path, arch, timeout_ms);
    else
      s = JIT_ERR(JIT_COMPILE_ERROR, "ptxas %s -arch=%s failed (%s)", tool->path, arch, why);
  }
  char *cubin = NULL;
  size_t size = 0;
  if (!s) s = jit__read_file(out, (size_t)1 << 30, &cubin, &size);
  if (!s && (size < 52 || memcmp(cubin, "\x7f" "ELF", 4) != 0)) {
    s = JIT_ERR(JIT_COMPILE_ERROR, "ptxas %s -arch=%s wrote %zu bytes that are not an ELF "
                "cubin", tool->path, arch, size);
  }
  jit__rm_dir(dir);
  if (s) {
    free(cubin);
    return s;
  }
  *out_cubin = (uint8_t *)cubin;
  *out_size = size;
  return NULL;
}
