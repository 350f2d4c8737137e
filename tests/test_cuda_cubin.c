//===--- test_cuda_cubin.c - CUDA cubins through jit_run, on the mock driver ===//
//
// jit_run on a CUDA device where there is no GPU: the backend is pointed at the mock
// driver (tests/cuda_mock.c) with JITML_CUDA_LIBRARY, so everything above the driver
// is the real library: the GPU lowering makes PTX for the mock's sm_90, the toolkit's
// ptxas (through a wrapper that counts its calls) makes a cubin, the disk entry holds
// both, and the kernel is loaded cubin first. The mock records each module load
// ("cubin:ok", "cubin:refused", "ptx:ok"); its kernels do not compute anything, so
// these tests check what was made, stored and loaded, not the numbers (test_cuda and
// the ops_cuda conformance suite check numbers where a GPU exists).
// Each test has its own disk cache directory (cache_fixture.h).
//
//===----------------------------------------------------------------------===//
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache_fixture.h"
#include "jitml.h"

// Visible skips that still pass (see NOTE in test_cuda.c: cr_skip_test fails the run).
#define NOTE(...)                 \
  do {                            \
    fprintf(stderr, __VA_ARGS__); \
    fputc('\n', stderr);          \
  } while (0)

static void setup(void) {
  tu_cache_setup();
  setenv("JITML_CUDA_LIBRARY", JITML_TEST_CUDA_MOCK, 1);
  setenv("JITML_MOCK_CUDA_DEVICES", "1", 1);
}

TestSuite(cuda_cubin, .init = setup, .fini = tu_cache_teardown);

//===--- Helpers ---------------------------------------------------------===//

static char g_log[16384];
static size_t g_log_len;

static void capture_log(void *user, jit_log_level level, const char *message) {
  (void)user;
  (void)level;
  if (g_log_len < sizeof g_log)
    g_log_len += (size_t)snprintf(g_log + g_log_len, sizeof g_log - g_log_len, "%s\n", message);
}

// The toolkit's real ptxas, or NULL.
static const char *real_ptxas(void) {
  static char path[1024];
  const char *home = getenv("CUDA_HOME");
  snprintf(path, sizeof path, "%s/bin/ptxas", home && *home ? home : "/usr/local/cuda");
  return access(path, X_OK) == 0 ? path : NULL;
}

// A toolkit directory <cache dir>/<name> whose bin/ptxas is `body` (a shell script).
static void make_toolkit(char *dir, size_t size, const char *name, const char *body) {
  snprintf(dir, size, "%s/%s", tu_cache_dir, name);
  cr_assert_eq(mkdir(dir, 0700), 0);
  if (!body) return;  // an empty toolkit: no bin/ptxas
  char path[1400];
  snprintf(path, sizeof path, "%s/bin", dir);
  cr_assert_eq(mkdir(path, 0700), 0);
  snprintf(path, sizeof path, "%s/bin/ptxas", dir);
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f);
  fprintf(f, "#!/bin/sh\n%s\n", body);
  fclose(f);
  cr_assert_eq(chmod(path, 0700), 0);
}

// A toolkit whose ptxas appends its arguments to <dir>/calls, then runs the real one.
static bool counting_toolkit(char *dir, size_t size) {
  const char *real = real_ptxas();
  if (!real) {
    NOTE("skipped: no ptxas in $CUDA_HOME or /usr/local/cuda");
    return false;
  }
  char body[4096];
  snprintf(body, sizeof body,
           "[ \"$1\" = --version ] || echo \"$@\" >> '%s/counting/calls'\nexec '%s' \"$@\"",
           tu_cache_dir, real);
  make_toolkit(dir, size, "counting", body);
  return true;
}

// How many times the counting toolkit assembled something.
static int ptxas_calls(const char *dir) {
  char path[1400], line[4096];
  snprintf(path, sizeof path, "%s/calls", dir);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  int n = 0;
  while (fgets(line, sizeof line, f)) n += strstr(line, "-arch=sm_90") != NULL;
  fclose(f);
  return n;
}

// What the mock driver was asked to load so far in this process.
static void mock_loads(char *out, size_t size) {
  void *lib = dlopen(JITML_TEST_CUDA_MOCK, RTLD_NOW | RTLD_NOLOAD);
  cr_assert_not_null(lib, "the mock driver is not loaded");
  void (*fn)(char *, size_t) = (void (*)(char *, size_t))dlsym(lib, "jit_mock_cuda_loads");
  cr_assert_not_null(fn);
  fn(out, size);
  dlclose(lib);
}

static int mock_live_allocs(void) {
  void *lib = dlopen(JITML_TEST_CUDA_MOCK, RTLD_NOW | RTLD_NOLOAD);
  if (!lib) return 0;
  int (*fn)(void) = (int (*)(void))dlsym(lib, "jit_mock_cuda_live_allocs");
  int n = fn ? fn() : -1;
  dlclose(lib);
  return n;
}

typedef struct entry_kinds {
  int ptx, cubin, other;
} entry_kinds;

static int count_kind(void *user, const jit_cache_entry_info *e) {
  entry_kinds *k = user;
  if (!strcmp(e->kind, "ptx")) k->ptx++;
  else if (!strcmp(e->kind, "cubin")) k->cubin++;
  else k->other++;
  return 1;
}

// Opens a context offloading to the mock's CUDA device with `toolkit` (NULL: the
// default search), runs y = relu(a + b) on 1000 floats once, and returns the run's
// status (the stats in *st). False (after a visible line) when the CUDA backend is
// compiled out.
static bool run_once(const char *toolkit, jit_status *out_status, jit_stats *st) {
  jit_options o;
  jit_options_init(&o);
  o.device = "cuda";
  o.cuda_toolkit = toolkit;
  o.log_fn = capture_log;
  o.log_level = JIT_LOG_DEBUG;
  jit_context *ctx = NULL;
  jit_status s = jit_context_create(&o, &ctx);
  if (s && jit_status_get_code(s) == JIT_UNAVAILABLE) {
    NOTE("skipped: no CUDA backend (%s)", jit_status_message(s));
    jit_status_free(s);
    return false;
  }
  TU_OK(s);
  jit_graph *g = NULL;
  TU_OK(jit_graph_create(ctx, "add_relu", &g));
  int64_t dims[1] = {1000};
  jit_value a = jit_input(g, "a", TU_F32, 1, dims);
  jit_value b = jit_input(g, "b", TU_F32, 1, dims);
  jit_output(g, jit_relu(g, jit_add(g, a, b)));
  TU_OK(jit_graph_finalize(g));
  static float xa[1000], xb[1000], y[1000];
  int64_t shape[1] = {1000};
  DLTensor in[2] = {tu_tensor(xa, TU_F32, 1, shape), tu_tensor(xb, TU_F32, 1, shape)};
  DLTensor out = tu_tensor(y, TU_F32, 1, shape);
  *out_status = jit_run(g, in, 2, &out, 1);
  *st = get_stats(ctx);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
  cr_assert_eq(mock_live_allocs(), 0, "device memory left allocated");
  return true;
}

static entry_kinds list_entries(void) {
  jit_context *ctx = NULL;
  jit_options o;
  jit_options_init(&o);
  TU_OK(jit_context_create(&o, &ctx));
  entry_kinds k = {0, 0, 0};
  TU_OK(jit_cache_list(ctx, count_kind, &k));
  jit_context_destroy(ctx);
  return k;
}

//===--- Tests -----------------------------------------------------------===//

// ptxas present: one cubin made, stored next to the PTX, and loaded first (no JIT).
Test(cuda_cubin, cubin_made_stored_and_loaded_first) {
  char tk[1024];
  if (!counting_toolkit(tk, sizeof tk)) return;
  jit_status s;
  jit_stats st;
  if (!run_once(tk, &s, &st)) return;
  TU_OK(s);
  char loads[512];
  mock_loads(loads, sizeof loads);
  cr_assert_str_eq(loads, "cubin:ok", "the driver was given: %s", loads);
  cr_assert_eq(ptxas_calls(tk), 1);
  cr_assert_eq(st.compiles, 1);
  cr_assert_eq(st.cuda_cubin_loads, 1);
  cr_assert_eq(st.cuda_ptx_loads, 0);
  entry_kinds k = list_entries();
  cr_assert_eq(k.cubin, 1, "entries: %d cubin, %d ptx, %d other", k.cubin, k.ptx, k.other);
  cr_assert_eq(k.ptx + k.other, 0);
}

// A cache hit in a new context loads the cached cubin; ptxas does not run again.
Test(cuda_cubin, disk_hit_loads_cached_cubin_without_ptxas) {
  char tk[1024];
  if (!counting_toolkit(tk, sizeof tk)) return;
  jit_status s;
  jit_stats st;
  if (!run_once(tk, &s, &st)) return;
  TU_OK(s);
  cr_assert_eq(ptxas_calls(tk), 1);
  if (!run_once(tk, &s, &st)) return;
  TU_OK(s);
  cr_assert_eq(st.compiles, 0, "the second context compiled");
  cr_assert_eq(st.disk_hits, 1);
  cr_assert_eq(st.cuda_cubin_loads, 1);
  cr_assert_eq(st.cuda_ptx_loads, 0);
  cr_assert_eq(ptxas_calls(tk), 1, "ptxas ran again on a cache hit");
  char loads[512];
  mock_loads(loads, sizeof loads);
  cr_assert_str_eq(loads, "cubin:ok cubin:ok");
  // A machine with the driver alone (no toolkit at all) is served the same cubin.
  g_log_len = 0;
  if (!run_once("", &s, &st)) return;
  TU_OK(s);
  cr_assert_eq(st.disk_hits, 1);
  cr_assert_eq(st.cuda_cubin_loads, 1);
}

// A cubin the driver refuses (here: every cubin) falls back to the PTX in the same
// entry, and says why.
Test(cuda_cubin, refused_cubin_falls_back_to_ptx) {
  char tk[1024];
  if (!counting_toolkit(tk, sizeof tk)) return;
  setenv("JITML_MOCK_CUDA_CUBIN", "reject", 1);
  jit_status s;
  jit_stats st;
  if (!run_once(tk, &s, &st)) return;
  TU_OK(s);
  char loads[512];
  mock_loads(loads, sizeof loads);
  cr_assert_str_eq(loads, "cubin:refused ptx:ok");
  cr_assert_eq(st.cuda_cubin_loads, 0);
  cr_assert_eq(st.cuda_ptx_loads, 1);
  cr_assert(strstr(g_log, "kernel loaded from PTX") &&
                strstr(g_log, "the driver refused the cubin") &&
                strstr(g_log, "CUDA_ERROR_NO_BINARY_FOR_GPU"),
            "log:\n%s", g_log);
  // From the disk too.
  if (!run_once(tk, &s, &st)) return;
  TU_OK(s);
  cr_assert_eq(st.disk_hits, 1);
  cr_assert_eq(st.cuda_ptx_loads, 1);
  mock_loads(loads, sizeof loads);
  cr_assert_str_eq(loads, "cubin:refused ptx:ok cubin:refused ptx:ok");
}

// No ptxas (a toolkit directory without one, or "" for none): the kernel ships and
// runs as PTX alone, with the reason logged and kept in the entry.
Test(cuda_cubin, missing_ptxas_runs_on_ptx) {
  char tk[1024];
  make_toolkit(tk, sizeof tk, "empty", NULL);
  jit_status s;
  jit_stats st;
  if (!run_once(tk, &s, &st)) return;
  TU_OK(s);
  char loads[512];
  mock_loads(loads, sizeof loads);
  cr_assert_str_eq(loads, "ptx:ok");
  cr_assert_eq(st.cuda_ptx_loads, 1);
  cr_assert_eq(st.cuda_cubin_loads, 0);
  cr_assert(strstr(g_log, "ships without its best image") && strstr(g_log, tk), "log:\n%s",
            g_log);
  entry_kinds k = list_entries();
  cr_assert_eq(k.ptx, 1);
  cr_assert_eq(k.cubin, 0);
  // The entry remembers why it has no cubin, for the log of a later hit.
  g_log_len = 0;
  if (!run_once(tk, &s, &st)) return;
  TU_OK(s);
  cr_assert_eq(st.disk_hits, 1);
  cr_assert(strstr(g_log, "no CUDA toolkit with ptxas"), "log:\n%s", g_log);
}

Test(cuda_cubin, no_toolkit_option_runs_on_ptx) {
  jit_status s;
  jit_stats st;
  if (!run_once("", &s, &st)) return;
  TU_OK(s);
  cr_assert_eq(st.cuda_ptx_loads, 1);
  cr_assert(strstr(g_log, "options.cuda_toolkit is \"\""), "log:\n%s", g_log);
}

// ptxas failing: not fatal; its output is in the logged reason; PTX is used.
Test(cuda_cubin, failing_ptxas_runs_on_ptx) {
  char tk[1024];
  make_toolkit(tk, sizeof tk, "broken",
               "[ \"$1\" = --version ] && exit 0\necho 'fake ptxas: out of luck' >&2\nexit 7");
  jit_status s;
  jit_stats st;
  if (!run_once(tk, &s, &st)) return;
  TU_OK(s);
  cr_assert_eq(st.cuda_ptx_loads, 1);
  cr_assert(strstr(g_log, "exit status 7: fake ptxas: out of luck"), "log:\n%s", g_log);
  entry_kinds k = list_entries();
  cr_assert_eq(k.ptx, 1);
}

// A driver older than the PTX ISA the chip needs: a clear status with both versions,
// before anything is compiled.
Test(cuda_cubin, driver_too_old_for_the_ptx) {
  setenv("JITML_MOCK_CUDA_DRIVER", "11070", 1);  // CUDA 11.7: PTX ISA up to 7.7
  jit_status s;
  jit_stats st;
  if (!run_once("", &s, &st)) return;
  cr_assert_not_null(s);
  TU_EXPECT_CODE(s, JIT_UNSUPPORTED);
  TU_EXPECT_MSG(s, "7.8");  // what sm_90 needs
  TU_EXPECT_MSG(s, "7.7");  // what the driver takes
  jit_status_free(s);
  cr_assert_eq(st.compiles, 0);
}

// The launch log's stream of launch `i` (NULL stream: the default one).
static void *mock_launch_stream(int i) {
  void *lib = dlopen(JITML_TEST_CUDA_MOCK, RTLD_NOW | RTLD_NOLOAD);
  cr_assert_not_null(lib, "the mock driver is not loaded");
  int (*fn)(int, char *, size_t, unsigned *, unsigned *, void **, unsigned long long *) =
      (int (*)(int, char *, size_t, unsigned *, unsigned *, void **,
               unsigned long long *))dlsym(lib, "jit_mock_cuda_launch");
  int (*count)(void) = (int (*)(void))dlsym(lib, "jit_mock_cuda_launch_count");
  cr_assert(fn && count);
  char name[64];
  unsigned grid[3], block[3];
  unsigned long long args[8];
  void *stream = (void *)-1;
  cr_assert(fn(i, name, sizeof name, grid, block, &stream, args) >= 0, "no launch %d of %d",
            i, count());
  dlclose(lib);
  return stream;
}

static int mock_launch_count(void) {
  void *lib = dlopen(JITML_TEST_CUDA_MOCK, RTLD_NOW | RTLD_NOLOAD);
  int (*count)(void) = lib ? (int (*)(void))dlsym(lib, "jit_mock_cuda_launch_count") : NULL;
  int n = count ? count() : 0;
  if (lib) dlclose(lib);
  return n;
}

// jit_run_ex's cuda_stream: a run on CUDA tensors launches every kernel on the
// caller's stream (the mock logs it), a run without it on the default stream; a
// stream with host tensors, and a bad struct_size, are refused before anything runs.
Test(cuda_cubin, runs_on_the_callers_stream) {
  jit_options o;
  jit_options_init(&o);
  jit_context *ctx = NULL;
  TU_OK(jit_context_create(&o, &ctx));
  jit_device *cuda = NULL;
  jit_status s = jit_context_find_device(ctx, JIT_DEVICE_CUDA, 0, &cuda);
  if (s && jit_status_get_code(s) == JIT_UNAVAILABLE) {
    NOTE("skipped: no CUDA backend (%s)", jit_status_message(s));
    jit_status_free(s);
    jit_context_destroy(ctx);
    return;
  }
  TU_OK(s);
  jit_graph *g = NULL;
  TU_OK(jit_graph_create(ctx, "stream_relu", &g));
  int64_t n = jit_symbol(g, "N");
  jit_value a = jit_input(g, "a", TU_F32, 1, (int64_t[]){n});
  jit_value b = jit_input(g, "b", TU_F32, 1, (int64_t[]){n});
  jit_output(g, jit_relu(g, jit_add(g, a, b)));
  TU_OK(jit_graph_finalize(g));
  int64_t shape[1] = {777};
  DLTensor in[2], out;
  TU_OK(jit_tensor_alloc(ctx, cuda, TU_F32, 1, shape, &in[0]));
  TU_OK(jit_tensor_alloc(ctx, cuda, TU_F32, 1, shape, &in[1]));
  TU_OK(jit_tensor_alloc(ctx, cuda, TU_F32, 1, shape, &out));

  void *const kStream = (void *)(uintptr_t)0x5eed0;
  jit_run_options ro;
  jit_run_options_init(&ro);
  ro.cuda_stream = kStream;
  int before = mock_launch_count();
  TU_OK(jit_run_ex(g, in, 2, &out, 1, &ro));
  int after = mock_launch_count();
  cr_assert_gt(after, before, "no kernel launched");
  for (int i = before; i < after; i++)
    cr_assert_eq(mock_launch_stream(i), kStream, "launch %d on stream %p", i,
                 mock_launch_stream(i));
  // Without options, and with a NULL stream: the default stream.
  TU_OK(jit_run_ex(g, in, 2, &out, 1, NULL));
  cr_assert_null(mock_launch_stream(mock_launch_count() - 1));
  ro.cuda_stream = NULL;
  TU_OK(jit_run_ex(g, in, 2, &out, 1, &ro));
  cr_assert_null(mock_launch_stream(mock_launch_count() - 1));

  // A bad struct_size.
  jit_run_options bad = ro;
  bad.struct_size = 3;
  s = jit_run_ex(g, in, 2, &out, 1, &bad);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  TU_EXPECT_MSG(s, "jit_run_options_init");
  jit_status_free(s);
  TU_OK(jit_tensor_free(ctx, &in[0]));
  TU_OK(jit_tensor_free(ctx, &in[1]));
  TU_OK(jit_tensor_free(ctx, &out));
  jit_graph_destroy(g);
  jit_context_destroy(ctx);

  // Host tensors offloaded to CUDA (options.device): a stream is not theirs.
  jit_options_init(&o);
  o.device = "cuda";
  TU_OK(jit_context_create(&o, &ctx));
  TU_OK(jit_graph_create(ctx, "stream_host", &g));
  jit_output(g, jit_relu(g, jit_input(g, "a", TU_F32, 1, (int64_t[]){4})));
  TU_OK(jit_graph_finalize(g));
  float x[4] = {1, -2, 3, -4}, y[4];
  int64_t s4[1] = {4};
  DLTensor hx = tu_tensor(x, TU_F32, 1, s4), hy = tu_tensor(y, TU_F32, 1, s4);
  ro.cuda_stream = kStream;
  s = jit_run_ex(g, &hx, 1, &hy, 1, &ro);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  TU_EXPECT_MSG(s, "cuda_stream");
  jit_status_free(s);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
  cr_assert_eq(mock_live_allocs(), 0, "device memory left allocated");
}
