//===--- test_cuda.c - the CUDA device: unavailable paths, a mock driver, a GPU --===//
//
// Three layers, so most of the backend is checked on machines without a GPU:
//   1. here and everywhere: libcuda.so.1 missing, a library that does not exist, the
//      toolkit's stub library (cuInit fails), NULL handles -> clean statuses;
//   2. here and everywhere: a fake driver (cuda_mock.c, a shared library the backend
//      is pointed at) runs the whole host side: enumeration, primary contexts,
//      allocation, transfers, PTX loading with the JIT log, launches (the parameter
//      array is checked against the buffer table), bounded waits, sticky errors,
//      host / other-GPU pointer checks, missing symbols;
//   3. where libcuda loads and cuInit succeeds: bad input (grid over the limit, a
//      launch the driver refuses, out of memory, host pointers) gives clean statuses
//      and the context stays usable. Without a device each of these is skipped with
//      "skipped: no CUDA device".
// The graph tests (lowered graphs against ref.c, f32 and f16) and the device-level
// tests every backend shares are in the conformance suite, test_backend.c
// (backend_cuda, backend_cuda_mock).
// The device and the lowering are internal (hidden in libjitml.so), so this executable
// compiles their sources itself.
//
//===----------------------------------------------------------------------===//
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <dlfcn.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "devices/cuda/cuda.h"
#define LGRAPH_LOG_TAG "cuda"
#include "gpu_check.h"
#include "lgraph_builder.h"
#include "lowering/gpu.h"
#include "lowering/ptxas.h"
#include "ref.h"

//===--- Helpers ---------------------------------------------------------===//

typedef struct cu_env {
  jit__cu_instance *inst;
  jit__cu_device *dev;
  const jit__cu_device_info *info;
} cu_env;

static void env_open_lib(cu_env *e, const char *library, const jit__cu_device_options *o) {
  memset(e, 0, sizeof *e);
  jit__cu_instance_options io = {.library = library};
  OK(jit__cu_instance_create(&io, &e->inst));
  uint32_t index = 0;
  OK(jit__cu_instance_select(e->inst, NULL, &index));
  OK(jit__cu_device_create(e->inst, index, o, &e->dev));
  e->info = jit__cu_device_get_info(e->dev);
  cr_assert_not_null(e->info);
}

// A visible skip that still passes: Debian's Criterion 2.4.1 makes the whole run exit
// 1 when any test calls cr_skip_test or cr_log_warn (seen here), which CTest would count
// as a failure; so skips and warnings are plain lines on stderr.
#define NOTE(...)                       \
  do {                                  \
    fprintf(stderr, __VA_ARGS__);       \
    fputc('\n', stderr);                \
  } while (0)
#define SKIP(...)   \
  do {              \
    NOTE(__VA_ARGS__); \
    return false;   \
  } while (0)

// Opens the selected real device; false (after a "skipped: no CUDA device" line) when
// there is none, and the test returns.
static bool env_open(cu_env *e, const jit__cu_device_options *o) {
  memset(e, 0, sizeof *e);
  jit_status s = jit__cu_instance_create(NULL, &e->inst);
  if (s && jit_status_get_code(s) == JIT_UNAVAILABLE) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", jit_status_message(s));
    jit_status_free(s);
    SKIP("skipped: no CUDA device (%s)", msg);
  }
  OK(s);
  uint32_t index = 0;
  OK(jit__cu_instance_select(e->inst, NULL, &index));
  OK(jit__cu_device_create(e->inst, index, o, &e->dev));
  e->info = jit__cu_device_get_info(e->dev);
  cr_assert_not_null(e->info);
  return true;
}

static void env_close(cu_env *e) {
  jit__cu_device_destroy(e->dev);
  jit__cu_instance_release(e->inst);
  memset(e, 0, sizeof *e);
}

//===--- Plan -> neutral description (what jit/ does) ---------------------===//

typedef struct cu_desc {
  jit__cu_executable_desc desc;
  jit__cu_kernel_desc *kernels;
  uint64_t *bytes;
} cu_desc;

static void plan_to_desc(const jit__gpu_artifact *a, cu_desc *out) {
  const jit__gpu_plan *p = &a->plan;
  out->kernels = calloc(p->n_kernels, sizeof *out->kernels);
  out->bytes = calloc(p->n_buffers ? p->n_buffers : 1, sizeof *out->bytes);
  cr_assert(out->kernels && out->bytes);
  for (uint32_t b = 0; b < p->n_buffers; b++) out->bytes[b] = p->buffers[b].bytes;
  for (uint32_t k = 0; k < p->n_kernels; k++) {
    const jit__gpu_kernel *pk = &p->kernels[k];
    jit__cu_kernel_desc *kd = &out->kernels[k];
    kd->entry = pk->entry;
    memcpy(kd->grid, pk->grid, sizeof kd->grid);
    memcpy(kd->block, pk->block, sizeof kd->block);
    kd->n_args = pk->n_args;
    kd->args = pk->args;
  }
  out->desc = (jit__cu_executable_desc){.format = JIT__CU_PTX,
                                        .module = a->binary,
                                        .module_size = a->binary_size,
                                        .n_buffers = p->n_buffers,
                                        .buffer_bytes = out->bytes,
                                        .n_kernels = p->n_kernels,
                                        .kernels = out->kernels};
}

static void desc_free(cu_desc *d) {
  free(d->kernels);
  free(d->bytes);
}

// The chip to compile for: the device's SM when the lowering knows it, else the newest
// plain chip it knows of the same or an older compute capability (PTX runs on newer
// GPUs through the driver's JIT). What jit/ does.
static void pick_chip(const jit__cu_device_info *info, char *chip, size_t size) {
  snprintf(chip, size, "%s", info->sm);
  if (jit__gpu_ptx_min_version(chip)) return;
  int want = info->cc_major * 10 + info->cc_minor;
  for (int cc = want; cc >= 50; cc--) {
    snprintf(chip, size, "sm_%d", cc);
    if (jit__gpu_ptx_min_version(chip)) return;
  }
  cr_assert_fail("no chip the lowering knows for %s", info->sm);
}

// Compiles `g` to PTX for `info` (sm_90 when NULL). A lowering that needs libdevice on a
// machine without a CUDA toolkit skips the test (visibly): that is a machine problem.
static void compile_ptx(const jit__lgraph *g, const jit__cu_device_info *info,
                        jit__gpu_artifact *a) {
  char chip[16] = "sm_90";
  if (info) pick_chip(info, chip, sizeof chip);
  jit__gpu_target t = {.format = JIT__GPU_PTX, .chip = chip};
  jit_status s = jit__compile_gpu(g, "cu", &t, a);
  if (s) {
    char msg[4096];
    snprintf(msg, sizeof msg, "%s", jit_status_message(s));
    jit_status_code code = jit_status_get_code(s);
    jit_status_free(s);
    // (On a GPU machine without a toolkit: a failure, not a skip, because the graph
    // was not checked; cr_skip_test would fail the run anyway, see SKIP.)
    if (code == JIT_UNAVAILABLE)
      cr_assert_fail("`%s` needs a CUDA toolkit (libdevice) for the lowering: %s", g->name,
                     msg);
    cr_assert_fail("compiling `%s` to PTX for %s: %s", g->name, chip, msg);
  }
}

Test(cuda, device_info) {
  cu_env e;
  if (!env_open(&e, NULL)) return;
  uint32_t n = jit__cu_instance_device_count(e.inst);
  cr_assert_geq(n, 1);
  cr_assert_null(jit__cu_instance_device_info(e.inst, n));
  for (uint32_t i = 0; i < n; i++) {
    const jit__cu_device_info *di = jit__cu_instance_device_info(e.inst, i);
    fprintf(stderr,
            "cuda: device %u: `%s` %s (cc %d.%d), %d SMs, %.1f GiB, driver %d (PTX <= %d.%d), "
            "max grid %u,%u,%u, max block %u,%u,%u / %u threads\n",
            i, di->name, di->sm, di->cc_major, di->cc_minor, di->multiprocessor_count,
            di->total_memory / 1073741824.0, di->driver_version, di->ptx_max / 10,
            di->ptx_max % 10, di->max_grid_dim[0], di->max_grid_dim[1], di->max_grid_dim[2],
            di->max_block_dim[0], di->max_block_dim[1], di->max_block_dim[2],
            di->max_threads_per_block);
    cr_assert_gt(strlen(di->name), 0);
    cr_assert_gt(di->total_memory, 0);
    cr_assert_gt(di->multiprocessor_count, 0);
    cr_assert_geq(di->cc_major, 5);
    cr_assert_gt(di->ptx_max, 0);
  }
  env_close(&e);
}

//===--- Bad input on a GPU ------------------------------------------------===//

// An elementwise graph's artifact for the bad-input tests, and a run of it that must
// still work (the context is usable).
static void small_add(const cu_env *e, jit__gpu_artifact *a) {
  tg t;
  tg_init(&t, "add", JIT__F32);
  int64_t d1[1] = {300};
  uint32_t x = tg_input(&t, 1, d1), y = tg_input(&t, 1, d1);
  tg_output(&t, tg_node(&t, JIT__OP_ADD, 2, x, y, 1, d1));
  compile_ptx(&t.g, e->info, a);
}

static void expect_usable(cu_env *e, const char *after) {
  jit__gpu_artifact a;
  small_add(e, &a);
  cu_desc d;
  plan_to_desc(&a, &d);
  jit__cu_executable *exe;
  OK(jit__cu_executable_create(e->dev, &d.desc, &exe));
  jit__cu_buffer *bufs[3];
  float x[300], y[300], z[300];
  for (int i = 0; i < 300; i++) x[i] = (float)i, y[i] = 0.5f;
  for (int b = 0; b < 3; b++) OK(jit__cu_buffer_create(e->dev, 1200, &bufs[b]));
  OK(jit__cu_buffer_upload(bufs[0], 0, x, 1200));
  OK(jit__cu_buffer_upload(bufs[1], 0, y, 1200));
  OK(jit__cu_run(exe, bufs, 3, NULL));
  OK(jit__cu_buffer_download(bufs[2], 0, z, 1200));
  for (int i = 0; i < 300; i++)
    cr_assert_eq(z[i], (float)i + 0.5f, "after %s: element %d is %g", after, i, (double)z[i]);
  for (int b = 0; b < 3; b++) jit__cu_buffer_destroy(bufs[b]);
  jit__cu_executable_destroy(exe);
  desc_free(&d);
  jit__gpu_artifact_release(&a);
}

Test(cuda, bad_launches_keep_context_usable) {
  cu_env e;
  if (!env_open(&e, NULL)) return;
  jit__gpu_artifact a;
  small_add(&e, &a);
  cu_desc d;
  plan_to_desc(&a, &d);
  jit__cu_executable *exe = (jit__cu_executable *)1;
  jit__cu_kernel_desc k0 = d.kernels[0];
  // grid.y over maxGridDimY (65535 on every GPU so far): refused before the driver.
  d.kernels[0].grid[1] = e.info->max_grid_dim[1] + 1;
  expect_code(jit__cu_executable_create(e.dev, &d.desc, &exe), JIT_UNSUPPORTED, "maxGridDimY",
              "grid.y over the limit");
  cr_assert_null(exe);
  d.kernels[0] = k0;
  // A block over the kernel's .maxntid but within the device's limits: the driver
  // refuses the launch itself (CUDA_ERROR_INVALID_VALUE), reported with the kernel.
  uint32_t threads = k0.block[0] * k0.block[1] * k0.block[2];
  if (threads < e.info->max_threads_per_block) {
    d.kernels[0].block[0] = e.info->max_threads_per_block;
    d.kernels[0].block[1] = d.kernels[0].block[2] = 1;
    OK(jit__cu_executable_create(e.dev, &d.desc, &exe));
    jit__cu_buffer *bufs[3];
    for (int b = 0; b < 3; b++) OK(jit__cu_buffer_create(e.dev, 1200, &bufs[b]));
    jit_status s = jit__cu_run(exe, bufs, 3, NULL);
    if (s) {
      char msg[2048];
      snprintf(msg, sizeof msg, "%s", jit_status_message(s));
      fprintf(stderr, "cuda: block over .maxntid -> %s: %s\n",
              jit_status_code_name(jit_status_get_code(s)), msg);
      cr_assert(strstr(msg, "cuLaunchKernel"), "%s", msg);
      cr_assert(strstr(msg, "CUDA_ERROR_"), "%s", msg);
      jit_status_free(s);
    } else {
      NOTE("the driver launched a block of %u threads past .maxntid %u without error",
                  e.info->max_threads_per_block, threads);
    }
    for (int b = 0; b < 3; b++) jit__cu_buffer_destroy(bufs[b]);
    jit__cu_executable_destroy(exe);
    d.kernels[0] = k0;
  }
  // An entry the module does not have; PTX the driver's JIT rejects (log in the status).
  d.kernels[0].entry = "no_such_kernel";
  expect_code(jit__cu_executable_create(e.dev, &d.desc, &exe), JIT_INVALID_ARGUMENT,
              "no_such_kernel", "unknown entry");
  d.kernels[0] = k0;
  const char *bad_ptx = ".version 7.8\n.target sm_90\n.address_size 64\n"
                        ".visible .entry broken() { this is not ptx; }\n";
  jit__cu_executable_desc bad = d.desc;
  bad.module = bad_ptx;
  bad.module_size = strlen(bad_ptx);
  expect_code(jit__cu_executable_create(e.dev, &bad, &exe), JIT_COMPILE_ERROR,
              "cuModuleLoadDataEx", "invalid PTX");
  expect_usable(&e, "failed launches and loads");
  desc_free(&d);
  jit__gpu_artifact_release(&a);
  env_close(&e);
}

Test(cuda, out_of_memory_keeps_context_usable) {
  cu_env e;
  if (!env_open(&e, NULL)) return;
  jit__cu_buffer *b = (jit__cu_buffer *)1;
  expect_code(jit__cu_buffer_create(e.dev, e.info->total_memory + (1ull << 30), &b),
              JIT_RESOURCE_EXHAUSTED, "CUDA_ERROR_OUT_OF_MEMORY", "more than the GPU has");
  cr_assert_null(b);
  expect_code(jit__cu_buffer_create(e.dev, 1ull << 50, &b), JIT_RESOURCE_EXHAUSTED, NULL,
              "1 PiB");
  expect_usable(&e, "out of memory");
  env_close(&e);
}

Test(cuda, host_and_foreign_pointers) {
  cu_env e;
  if (!env_open(&e, NULL)) return;
  jit__cu_buffer *b = (jit__cu_buffer *)1;
  float *host = fmalloc(1024);
  expect_code(jit__cu_buffer_wrap(e.dev, (uint64_t)(uintptr_t)host, 4096, &b),
              JIT_INVALID_ARGUMENT, "not CUDA device memory", "host pointer as kDLCUDA");
  cr_assert_null(b);
  free(host);
  // Device memory wraps; a range past its allocation does not.
  jit__cu_buffer *owner, *view;
  OK(jit__cu_buffer_create(e.dev, 4096, &owner));
  uint64_t p = jit__cu_buffer_device_ptr(owner);
  OK(jit__cu_buffer_wrap(e.dev, p + 1024, 1024, &view));
  cr_assert_eq(jit__cu_buffer_device_ptr(view), p + 1024);
  OK(jit__cu_buffer_fill(view, 0, 7, 1024));
  uint8_t back[4096];
  OK(jit__cu_buffer_fill(owner, 0, 0, 1024));
  OK(jit__cu_buffer_download(owner, 0, back, 4096));
  cr_assert_eq(back[1023], 0);
  cr_assert_eq(back[1024], 7);
  cr_assert_eq(back[2047], 7);
  jit__cu_buffer_destroy(view);
  jit_status s = jit__cu_buffer_wrap(e.dev, p, 1ull << 40, &view);
  if (s) expect_code(s, JIT_INVALID_ARGUMENT, NULL, "range past the allocation");
  else jit__cu_buffer_destroy(view);  // (the address after it happened to be mapped)
  jit__cu_buffer_destroy(owner);
  // Memory of a second GPU.
  if (jit__cu_instance_device_count(e.inst) > 1) {
    jit__cu_device *other;
    OK(jit__cu_device_create(e.inst, e.info->index == 0 ? 1 : 0, NULL, &other));
    OK(jit__cu_buffer_create(other, 256, &owner));
    expect_code(jit__cu_buffer_wrap(e.dev, jit__cu_buffer_device_ptr(owner), 256, &view),
                JIT_INVALID_ARGUMENT, "memory of CUDA device", "tensor on another GPU");
    jit__cu_buffer_destroy(owner);
    jit__cu_device_destroy(other);
  } else {
    NOTE("one GPU: the two-GPU case is checked with the mock driver only");
  }
  expect_usable(&e, "host and foreign pointers");
  env_close(&e);
}

//===--- Unavailable paths (every machine) ----------------------------------===//

Test(cuda, default_library) {
  jit__cu_instance *in = (jit__cu_instance *)1;
  jit_status s = jit__cu_instance_create(NULL, &in);
  if (!jit__cu_compiled_in()) {
    cr_assert_null(in);
    expect_code(s, JIT_UNAVAILABLE, "compiled out", "compiled-out backend");
    return;
  }
  if (!s) {
    NOTE("libcuda.so.1 loaded: %u device(s)", jit__cu_instance_device_count(in));
    jit__cu_instance_release(in);
    return;
  }
  cr_assert_null(in);
  // No driver (this CI machine), or a driver without a usable device.
  expect_code(s, JIT_UNAVAILABLE, NULL, "default libcuda.so.1");
  fprintf(stderr, "skipped: no CUDA device (the unavailable path was checked)\n");
}

Test(cuda, library_absent_is_unavailable) {
  jit__cu_instance_options o = {.library = "libcuda_jitml_does_not_exist.so.1"};
  jit__cu_instance *in = (jit__cu_instance *)1;
  jit_status s = jit__cu_instance_create(&o, &in);
  cr_assert_null(in);
  if (!jit__cu_compiled_in()) {
    expect_code(s, JIT_UNAVAILABLE, "compiled out", "compiled-out backend");
    return;
  }
  expect_code(s, JIT_UNAVAILABLE, "libcuda_jitml_does_not_exist.so.1", "missing library");
  // The default name is what a user without a driver sees.
  void *real = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!real) {
    expect_code(jit__cu_instance_create(NULL, &in), JIT_UNAVAILABLE, "libcuda.so.1",
                "no driver on this machine");
  } else {
    dlclose(real);
  }
}

// The toolkit's stub libcuda.so (for linking only) loads and has every symbol, but
// cuInit fails with CUDA_ERROR_STUB_LIBRARY: the "cuInit failing" path, named.
Test(cuda, stub_library_cuinit_fails) {
  if (!jit__cu_compiled_in()) {
    NOTE("skipped: CUDA backend compiled out");
    return;
  }
  const char *stub = JITML_TEST_CUDA_STUB;
  if (access(stub, R_OK) != 0) {
    NOTE("skipped: no stub library at %s", stub);
    return;
  }
  jit__cu_instance_options o = {.library = stub};
  jit__cu_instance *in = (jit__cu_instance *)1;
  expect_code(jit__cu_instance_create(&o, &in), JIT_UNAVAILABLE, "cuInit failed: CUDA_ERROR_",
              "stub libcuda");
  cr_assert_null(in);
}

Test(cuda, null_handles) {
  jit__cu_instance_release(NULL);
  jit__cu_device_destroy(NULL);
  jit__cu_buffer_destroy(NULL);
  jit__cu_executable_destroy(NULL);
  cr_assert_eq(jit__cu_instance_device_count(NULL), 0);
  cr_assert_null(jit__cu_instance_device_info(NULL, 0));
  cr_assert_null(jit__cu_device_get_info(NULL));
  cr_assert_eq(jit__cu_buffer_size(NULL), 0);
  cr_assert_eq(jit__cu_buffer_device_ptr(NULL), 0);
  cr_assert_eq(jit__cu_executable_create_ms(NULL), 0);
  jit_status_code want = jit__cu_compiled_in() ? JIT_INVALID_ARGUMENT : JIT_UNAVAILABLE;
  uint32_t idx;
  jit__cu_device *dev = (jit__cu_device *)1;
  jit__cu_buffer *buf = (jit__cu_buffer *)1;
  jit__cu_executable *exe = (jit__cu_executable *)1;
  expect_code(jit__cu_instance_create(NULL, NULL), want, NULL, "NULL out_instance");
  expect_code(jit__cu_instance_select(NULL, "0", &idx), want, NULL, "select NULL");
  expect_code(jit__cu_device_create(NULL, 0, NULL, &dev), want, NULL, "device NULL instance");
  cr_assert_null(dev);
  expect_code(jit__cu_device_wait(NULL, NULL), want, NULL, "wait NULL");
  expect_code(jit__cu_buffer_create(NULL, 4, &buf), want, NULL, "buffer NULL device");
  cr_assert_null(buf);
  buf = (jit__cu_buffer *)1;
  expect_code(jit__cu_buffer_wrap(NULL, 4096, 4, &buf), want, NULL, "wrap NULL device");
  cr_assert_null(buf);
  expect_code(jit__cu_buffer_upload(NULL, 0, "x", 1), want, NULL, "upload NULL");
  char c;
  expect_code(jit__cu_buffer_download(NULL, 0, &c, 1), want, NULL, "download NULL");
  expect_code(jit__cu_buffer_copy(NULL, 0, NULL, 0, 1), want, NULL, "copy NULL");
  expect_code(jit__cu_buffer_fill(NULL, 0, 0, 1), want, NULL, "fill NULL");
  expect_code(jit__cu_executable_create(NULL, NULL, &exe), want, NULL, "executable NULL");
  cr_assert_null(exe);
  expect_code(jit__cu_run(NULL, NULL, 0, NULL), want, NULL, "run NULL");
}

Test(cuda, ptx_max_for_driver) {
  cr_assert_eq(jit__cu_ptx_max_for_driver(10020), 0);
  cr_assert_eq(jit__cu_ptx_max_for_driver(11080), 78);
  cr_assert_eq(jit__cu_ptx_max_for_driver(12040), 84);
  cr_assert_eq(jit__cu_ptx_max_for_driver(12060), 85);
  cr_assert_eq(jit__cu_ptx_max_for_driver(13000), 90);
  cr_assert_eq(jit__cu_ptx_max_for_driver(13020), 90);
}

//===--- The mock driver (every machine) ------------------------------------===//

typedef int (*mock_launch_fn)(int, char *, size_t, unsigned *, unsigned *, void **,
                              unsigned long long *);
typedef struct mock {
  void *lib;
  int (*launch_count)(void);
  int (*ctx_refs)(int);
  int (*live_allocs)(void);
  mock_launch_fn launch;
} mock;

// Opens the backend on the mock driver (skips when the backend is compiled out).
static bool mock_open(cu_env *e, mock *m, const jit__cu_device_options *o) {
  if (!jit__cu_compiled_in()) SKIP("skipped: CUDA backend compiled out");
  env_open_lib(e, JITML_TEST_CUDA_MOCK, o);
  m->lib = dlopen(JITML_TEST_CUDA_MOCK, RTLD_NOW | RTLD_LOCAL);
  cr_assert_not_null(m->lib, "%s", dlerror());
  m->launch_count = (int (*)(void))dlsym(m->lib, "jit_mock_cuda_launch_count");
  m->ctx_refs = (int (*)(int))dlsym(m->lib, "jit_mock_cuda_ctx_refs");
  m->live_allocs = (int (*)(void))dlsym(m->lib, "jit_mock_cuda_live_allocs");
  m->launch = (mock_launch_fn)dlsym(m->lib, "jit_mock_cuda_launch");
  cr_assert(m->launch_count && m->ctx_refs && m->live_allocs && m->launch);
  return true;
}

static void mock_close(cu_env *e, mock *m) {
  env_close(e);
  cr_assert_eq(m->ctx_refs(0), 0, "primary context of device 0 still retained");
  cr_assert_eq(m->ctx_refs(1), 0, "primary context of device 1 still retained");
  cr_assert_eq(m->live_allocs(), 0, "device allocations leaked");
  dlclose(m->lib);
}

// A hand-written module: `mock_add(a, b, c)` and friends, NOT NUL-terminated (a heap
// copy of exactly the text, so ASan sees the mock read past it if the backend passed it
// on without terminating it).
static const char kMockPtx[] =
    "//\n.version 8.4\n.target sm_90\n.address_size 64\n"
    ".visible .entry mock_add(\n\t.param .u64 a,\n\t.param .u64 b,\n\t.param .u64 c\n)\n"
    ".maxntid 64, 1, 1\n{\n\tret;\n}\n"
    ".visible .entry mock_fault(\n\t.param .u64 a\n)\n{\n\tret;\n}\n"
    ".visible .entry mock_slow(\n\t.param .u64 a\n)\n{\n\tret;\n}\n";

typedef struct mock_exe {
  char *ptx;
  uint32_t args[3];
  uint64_t bytes[3];
  jit__cu_kernel_desc k;
  jit__cu_executable_desc d;
} mock_exe;

static void mock_desc(mock_exe *x, const char *entry, uint32_t n_args, uint32_t grid) {
  memset(x, 0, sizeof *x);
  x->ptx = malloc(sizeof kMockPtx - 1);
  memcpy(x->ptx, kMockPtx, sizeof kMockPtx - 1);
  for (uint32_t i = 0; i < 3; i++) x->args[i] = i, x->bytes[i] = 1024;
  x->k = (jit__cu_kernel_desc){.entry = entry, .grid = {grid, 1, 1}, .block = {64, 1, 1},
                               .n_args = n_args, .args = x->args};
  x->d = (jit__cu_executable_desc){.format = JIT__CU_PTX, .module = x->ptx,
                                   .module_size = sizeof kMockPtx - 1, .n_buffers = 3,
                                   .buffer_bytes = x->bytes, .n_kernels = 1, .kernels = &x->k};
}

Test(cuda_mock, enumeration_and_selection) {
  cu_env e;
  mock m;
  if (!mock_open(&e, &m, NULL)) return;
  cr_assert_eq(jit__cu_instance_device_count(e.inst), 2);
  cr_assert_eq(m.ctx_refs(0), 1);
  const jit__cu_device_info *i = e.info;
  cr_assert_str_eq(i->name, "Mock GPU 0");
  cr_assert_str_eq(i->sm, "sm_90");
  cr_assert_eq(i->cc_major, 9);
  cr_assert_eq(i->driver_version, 12040);
  cr_assert_eq(i->ptx_max, 84);
  cr_assert_eq(i->multiprocessor_count, 132);
  cr_assert_eq(i->total_memory, 80ull << 30);
  cr_assert_eq(i->max_grid_dim[1], 65535);
  cr_assert_eq(i->max_block_dim[2], 64);
  cr_assert_eq(i->max_threads_per_block, 1024);
  cr_assert_eq(i->uuid[0], 0x40);
  cr_assert_eq(jit__cu_instance_device_info(e.inst, 1)->uuid[15], 0x41);
  uint32_t got = 9;
  OK(jit__cu_instance_select(e.inst, "gpu 1", &got));
  cr_assert_eq(got, 1);
  OK(jit__cu_instance_select(e.inst, "1", &got));
  cr_assert_eq(got, 1);
  expect_code(jit__cu_instance_select(e.inst, "2", &got), JIT_UNAVAILABLE, "Mock GPU 1 (sm_90)",
              "ordinal out of range");
  setenv("JITML_CUDA_DEVICE", "radeon", 1);
  expect_code(jit__cu_instance_select(e.inst, NULL, &got), JIT_UNAVAILABLE,
              "JITML_CUDA_DEVICE", "env selector");
  setenv("JITML_CUDA_DEVICE", "", 1);
  OK(jit__cu_instance_select(e.inst, NULL, &got));
  cr_assert_eq(got, 0);
  jit__cu_device *d2 = (jit__cu_device *)1;
  expect_code(jit__cu_device_create(e.inst, 2, NULL, &d2), JIT_INVALID_ARGUMENT, "out of range",
              "device index");
  cr_assert_null(d2);
  // Two devices of one ordinal share the (retained twice) primary context.
  OK(jit__cu_device_create(e.inst, 0, NULL, &d2));
  cr_assert_eq(m.ctx_refs(0), 2);
  jit__cu_device_destroy(d2);
  cr_assert_eq(m.ctx_refs(0), 1);
  mock_close(&e, &m);
}

Test(cuda_mock, buffers) {
  cu_env e;
  mock m;
  if (!mock_open(&e, &m, NULL)) return;
  jit__cu_buffer *a, *b, *z;
  OK(jit__cu_buffer_create(e.dev, 64, &a));
  OK(jit__cu_buffer_create(e.dev, 64, &b));
  cr_assert_eq(jit__cu_buffer_size(a), 64);
  cr_assert_neq(jit__cu_buffer_device_ptr(a), 0);
  uint8_t src[64], dst[64];
  for (int i = 0; i < 64; i++) src[i] = (uint8_t)i;
  OK(jit__cu_buffer_upload(a, 0, src, 64));
  OK(jit__cu_buffer_upload(a, 8, src + 40, 4));
  OK(jit__cu_buffer_fill(b, 0, 0xab, 64));
  OK(jit__cu_buffer_copy(b, 16, a, 4, 12));
  OK(jit__cu_buffer_download(b, 12, dst, 20));
  for (int i = 0; i < 4; i++) cr_assert_eq(dst[i], 0xab);
  cr_assert_arr_eq(dst + 4, src + 4, 4);
  cr_assert_arr_eq(dst + 8, src + 40, 4);
  cr_assert_arr_eq(dst + 12, src + 12, 4);
  cr_assert_eq(dst[16], 0xab);
  expect_code(jit__cu_buffer_download(a, 60, dst, 5), JIT_INVALID_ARGUMENT, "outside", "tail");
  expect_code(jit__cu_buffer_upload(a, UINT64_MAX, src, 2), JIT_INVALID_ARGUMENT, "outside",
              "offset overflow");
  expect_code(jit__cu_buffer_upload(a, 0, NULL, 4), JIT_INVALID_ARGUMENT, "NULL", "NULL src");
  expect_code(jit__cu_buffer_copy(b, 0, a, 60, 8), JIT_INVALID_ARGUMENT, "source", "copy range");
  // Zero bytes: address 0, empty transfers do nothing, any byte is outside.
  OK(jit__cu_buffer_create(e.dev, 0, &z));
  cr_assert_eq(jit__cu_buffer_device_ptr(z), 0);
  OK(jit__cu_buffer_upload(z, 0, NULL, 0));
  expect_code(jit__cu_buffer_upload(z, 0, src, 1), JIT_INVALID_ARGUMENT, "outside", "1 byte");
  jit__cu_buffer_destroy(z);
  // Out of device memory: the mock's limit is 4 GiB.
  z = (jit__cu_buffer *)1;
  expect_code(jit__cu_buffer_create(e.dev, 1ull << 40, &z), JIT_RESOURCE_EXHAUSTED,
              "cuMemAlloc_v2 failed: CUDA_ERROR_OUT_OF_MEMORY", "1 TiB");
  cr_assert_null(z);
  OK(jit__cu_buffer_upload(a, 0, src, 64));  // still usable
  jit__cu_buffer_destroy(a);
  jit__cu_buffer_destroy(b);
  mock_close(&e, &m);
}

Test(cuda_mock, add_runs_and_marshals_arguments) {
  cu_env e;
  mock m;
  if (!mock_open(&e, &m, NULL)) return;
  mock_exe x;
  mock_desc(&x, "mock_add", 3, 4);  // 4 blocks of 64 = 256 floats = 1024 bytes
  jit__cu_executable *exe;
  OK(jit__cu_executable_create(e.dev, &x.d, &exe));
  free(x.ptx);  // everything needed was copied
  x.ptx = NULL;
  jit__cu_buffer *bufs[3];
  float in1[256], in2[256], out[256];
  for (int i = 0; i < 256; i++) in1[i] = (float)i, in2[i] = 0.25f;
  for (int b = 0; b < 3; b++) OK(jit__cu_buffer_create(e.dev, 1024, &bufs[b]));
  OK(jit__cu_buffer_upload(bufs[0], 0, in1, 1024));
  OK(jit__cu_buffer_upload(bufs[1], 0, in2, 1024));
  OK(jit__cu_run(exe, bufs, 3, NULL));
  OK(jit__cu_buffer_download(bufs[2], 0, out, 1024));
  for (int i = 0; i < 256; i++) cr_assert_eq(out[i], (float)i + 0.25f);
  // A user stream, queued without waiting; then the bounded wait on it.
  struct CUstream_st *stream = (struct CUstream_st *)(uintptr_t)0x5100;
  jit__cu_run_options ro = {.stream = stream, .no_wait = true};
  OK(jit__cu_run(exe, bufs, 3, &ro));
  OK(jit__cu_device_wait(e.dev, stream));
  cr_assert_eq(m.launch_count(), 2);
  char name[64];
  unsigned grid[3], block[3];
  void *st;
  unsigned long long args[8];
  cr_assert_eq(m.launch(1, name, sizeof name, grid, block, &st, args), 3);
  cr_assert_str_eq(name, "mock_add");
  cr_assert_eq(st, (void *)stream);
  cr_assert_eq(grid[0], 4);
  cr_assert_eq(block[0], 64);
  for (int i = 0; i < 3; i++) cr_assert_eq(args[i], jit__cu_buffer_device_ptr(bufs[i]));
  m.launch(0, name, sizeof name, grid, block, &st, args);
  cr_assert_null(st, "no stream option: the legacy default stream");
  // Grids given per run (a generic kernel's, for one binding): launched as given,
  // refused past the device's limits, and a 0 launches nothing.
  const uint32_t two[1][3] = {{2, 1, 1}}, over[1][3] = {{1, 65536, 1}}, none[1][3] = {{0, 1, 1}};
  jit__cu_run_options rg = {.grids = two};
  OK(jit__cu_run(exe, bufs, 3, &rg));
  cr_assert_eq(m.launch_count(), 3);
  m.launch(2, name, sizeof name, grid, block, &st, args);
  cr_assert_eq(grid[0], 2);
  rg.grids = over;
  expect_code(jit__cu_run(exe, bufs, 3, &rg), JIT_UNSUPPORTED, "grid[1] = 65536", "grid over");
  rg.grids = none;
  OK(jit__cu_run(exe, bufs, 3, &rg));
  cr_assert_eq(m.launch_count(), 3);
  for (int b = 0; b < 3; b++) jit__cu_buffer_destroy(bufs[b]);
  jit__cu_executable_destroy(exe);
  mock_close(&e, &m);
}

// The lowering's own PTX and plan, loaded by the mock: every launch gets the plan's
// grid/block and, for parameter i, the address of buffer args[i]; the number of
// parameters the PTX declares equals the plan's argument count.
Test(cuda_mock, lowering_plan_launches) {
  cu_env e;
  mock m;
  if (!mock_open(&e, &m, NULL)) return;
  tg t;
  tg_init(&t, "mlp", JIT__F32);
  int64_t dx[2] = {8, 64}, dw[2] = {64, 96}, dbias[1] = {96}, dc[2] = {8, 96};
  uint32_t x = tg_input(&t, 2, dx), wt = tg_input(&t, 2, dw), bias = tg_input(&t, 1, dbias);
  uint32_t mm = tg_node(&t, JIT__OP_MATMUL, 2, x, wt, 2, dc);
  uint32_t h = tg_node(&t, JIT__OP_ADD, 2, mm, bias, 2, dc);
  uint32_t sm = tg_unary(&t, JIT__OP_SOFTMAX, h);
  t.nodes[sm].axis = 1;
  tg_output(&t, h);
  tg_output(&t, sm);
  jit__gpu_artifact a;
  compile_ptx(&t.g, e.info, &a);
  cu_desc d;
  plan_to_desc(&a, &d);
  jit__cu_executable *exe;
  OK(jit__cu_executable_create(e.dev, &d.desc, &exe));
  uint32_t nb = a.plan.n_buffers;
  jit__cu_buffer **bufs = calloc(nb, sizeof *bufs);
  for (uint32_t b = 0; b < nb; b++) OK(jit__cu_buffer_create(e.dev, a.plan.buffers[b].bytes, &bufs[b]));
  OK(jit__cu_run(exe, bufs, nb, NULL));
  cr_assert_eq((uint32_t)m.launch_count(), a.plan.n_kernels);
  for (uint32_t k = 0; k < a.plan.n_kernels; k++) {
    const jit__gpu_kernel *pk = &a.plan.kernels[k];
    char name[64];
    unsigned grid[3], block[3];
    void *st;
    unsigned long long args[8];
    int n = m.launch((int)k, name, sizeof name, grid, block, &st, args);
    cr_assert_str_eq(name, pk->entry);
    cr_assert_eq((uint32_t)n, pk->n_args, "kernel %u `%s`: PTX has %d params, plan %u args", k,
                 pk->entry, n, pk->n_args);
    for (int i = 0; i < 3; i++) {
      cr_assert_eq(grid[i], pk->grid[i]);
      cr_assert_eq(block[i], pk->block[i]);
    }
    for (uint32_t i = 0; i < pk->n_args && i < 8; i++)
      cr_assert_eq(args[i], jit__cu_buffer_device_ptr(bufs[pk->args[i]]),
                   "kernel %u argument %u", k, i);
  }
  fprintf(stderr, "cuda_mock: mlp plan: %u buffers, %u kernels launched as planned\n", nb,
          a.plan.n_kernels);
  for (uint32_t b = 0; b < nb; b++) jit__cu_buffer_destroy(bufs[b]);
  free(bufs);
  jit__cu_executable_destroy(exe);
  desc_free(&d);
  jit__gpu_artifact_release(&a);
  mock_close(&e, &m);
}

Test(cuda_mock, bad_modules_and_descriptions) {
  cu_env e;
  mock m;
  if (!mock_open(&e, &m, NULL)) return;
  mock_exe x;
  mock_desc(&x, "mock_add", 3, 4);
  jit__cu_executable *exe = (jit__cu_executable *)1;
  // The driver's JIT log ends up in the status.
  const char *bad = ".version 8.4\n.target sm_90\n// mock_invalid_ptx\n";
  jit__cu_executable_desc d = x.d;
  d.module = bad;
  d.module_size = strlen(bad);
  expect_code(jit__cu_executable_create(e.dev, &d, &exe), JIT_COMPILE_ERROR,
              "mock syntax error near `mock_invalid_ptx`", "JIT log");
  cr_assert_null(exe);
  // A cubin for another GPU, PTX with a NUL, an unknown format, an empty module.
  d = x.d;
  d.format = JIT__CU_CUBIN;
  d.module = "\x7f" "ELF....";
  d.module_size = 8;
  expect_code(jit__cu_executable_create(e.dev, &d, &exe), JIT_UNSUPPORTED,
              "CUDA_ERROR_NO_BINARY_FOR_GPU", "cubin for another SM");
  d = x.d;
  d.module = "abc\0def";
  d.module_size = 7;
  expect_code(jit__cu_executable_create(e.dev, &d, &exe), JIT_INVALID_ARGUMENT, "NUL", "NUL");
  d = x.d;
  d.format = (jit__cu_module_format)7;
  expect_code(jit__cu_executable_create(e.dev, &d, &exe), JIT_INVALID_ARGUMENT, "format", "fmt");
  d = x.d;
  d.module_size = 0;
  expect_code(jit__cu_executable_create(e.dev, &d, &exe), JIT_INVALID_ARGUMENT, "empty", "empty");
  d = x.d;
  d.n_kernels = 0;
  expect_code(jit__cu_executable_create(e.dev, &d, &exe), JIT_INVALID_ARGUMENT, "no kernels", "0");
  // Kernel descriptions.
  jit__cu_kernel_desc k0 = x.k;
  x.k.entry = "no_such_kernel";
  expect_code(jit__cu_executable_create(e.dev, &x.d, &exe), JIT_INVALID_ARGUMENT,
              "`no_such_kernel` is not in the module", "unknown entry");
  x.k = k0;
  x.k.grid[1] = 65536;
  expect_code(jit__cu_executable_create(e.dev, &x.d, &exe), JIT_UNSUPPORTED,
              "grid Y = 65536 is over the device's maxGridDimY = 65535", "grid.y");
  x.k = k0;
  x.k.block[2] = 65;
  expect_code(jit__cu_executable_create(e.dev, &x.d, &exe), JIT_UNSUPPORTED, "maxBlockDimZ",
              "block.z");
  x.k = k0;
  x.k.block[0] = 1024, x.k.block[1] = 2;
  expect_code(jit__cu_executable_create(e.dev, &x.d, &exe), JIT_UNSUPPORTED,
              "maxThreadsPerBlock", "2048 threads");
  x.k = k0;
  x.k.block[1] = 0;
  expect_code(jit__cu_executable_create(e.dev, &x.d, &exe), JIT_INVALID_ARGUMENT, "block Y is 0",
              "block 0");
  x.k = k0;
  uint32_t args[3] = {0, 1, 3};
  x.k.args = args;
  expect_code(jit__cu_executable_create(e.dev, &x.d, &exe), JIT_INVALID_ARGUMENT, "buffer 3",
              "arg index");
  x.k = k0;
  x.k.n_args = 0;
  expect_code(jit__cu_executable_create(e.dev, &x.d, &exe), JIT_INVALID_ARGUMENT, "no arguments",
              "no args");
  x.k = k0;
  expect_code(jit__cu_executable_create(NULL, &x.d, &exe), JIT_INVALID_ARGUMENT, NULL, "NULL dev");
  expect_code(jit__cu_executable_create(e.dev, NULL, &exe), JIT_INVALID_ARGUMENT, NULL, "NULL");
  // Runs with the wrong buffers.
  OK(jit__cu_executable_create(e.dev, &x.d, &exe));
  jit__cu_buffer *bufs[3] = {NULL, NULL, NULL};
  OK(jit__cu_buffer_create(e.dev, 1024, &bufs[0]));
  OK(jit__cu_buffer_create(e.dev, 1024, &bufs[1]));
  expect_code(jit__cu_run(exe, bufs, 2, NULL), JIT_INVALID_ARGUMENT, "2 buffers", "count");
  expect_code(jit__cu_run(exe, bufs, 3, NULL), JIT_INVALID_ARGUMENT, "NULL", "NULL buffer");
  OK(jit__cu_buffer_create(e.dev, 1020, &bufs[2]));
  expect_code(jit__cu_run(exe, bufs, 3, NULL), JIT_INVALID_ARGUMENT, "needs 1024", "small");
  jit__cu_buffer_destroy(bufs[2]);
  jit__cu_device *other;
  OK(jit__cu_device_create(e.inst, 1, NULL, &other));
  OK(jit__cu_buffer_create(other, 1024, &bufs[2]));
  expect_code(jit__cu_run(exe, bufs, 3, NULL), JIT_INVALID_ARGUMENT, "on device 1", "other GPU");
  expect_code(jit__cu_buffer_copy(bufs[0], 0, bufs[2], 0, 4), JIT_INVALID_ARGUMENT,
              "one device", "copy across GPUs");
  jit__cu_buffer_destroy(bufs[2]);
  jit__cu_device_destroy(other);
  OK(jit__cu_buffer_create(e.dev, 1024, &bufs[2]));
  OK(jit__cu_run(exe, bufs, 3, NULL));
  for (int i = 0; i < 3; i++) jit__cu_buffer_destroy(bufs[i]);
  jit__cu_executable_destroy(exe);
  free(x.ptx);
  mock_close(&e, &m);
}

Test(cuda_mock, host_and_other_gpu_pointers) {
  cu_env e;
  mock m;
  if (!mock_open(&e, &m, NULL)) return;
  jit__cu_buffer *b = (jit__cu_buffer *)1;
  char host[256];
  expect_code(jit__cu_buffer_wrap(e.dev, (uint64_t)(uintptr_t)host, 256, &b),
              JIT_INVALID_ARGUMENT, "not CUDA device memory", "host pointer as kDLCUDA");
  cr_assert_null(b);
  jit__cu_buffer *own, *view;
  OK(jit__cu_buffer_create(e.dev, 256, &own));
  uint64_t p = jit__cu_buffer_device_ptr(own);
  OK(jit__cu_buffer_wrap(e.dev, p + 64, 128, &view));
  float v = 3.5f, back = 0;
  OK(jit__cu_buffer_upload(view, 4, &v, 4));
  OK(jit__cu_buffer_download(own, 68, &back, 4));
  cr_assert_eq(back, 3.5f);
  jit__cu_buffer_destroy(view);  // borrowed: the mock still has the allocation
  expect_code(jit__cu_buffer_wrap(e.dev, p + 64, 4096, &view), JIT_INVALID_ARGUMENT,
              "last byte", "range past the allocation");
  expect_code(jit__cu_buffer_wrap(e.dev, UINT64_MAX - 2, 8, &view), JIT_INVALID_ARGUMENT,
              "wraps", "address overflow");
  OK(jit__cu_buffer_wrap(e.dev, 0, 0, &view));  // an empty tensor with a NULL data pointer
  jit__cu_buffer_destroy(view);
  jit__cu_buffer_destroy(own);
  jit__cu_device *other;
  OK(jit__cu_device_create(e.inst, 1, NULL, &other));
  OK(jit__cu_buffer_create(other, 256, &own));
  expect_code(jit__cu_buffer_wrap(e.dev, jit__cu_buffer_device_ptr(own), 256, &view),
              JIT_INVALID_ARGUMENT, "memory of CUDA device 1, but the run is on device 0",
              "tensor on another GPU");
  jit__cu_buffer_destroy(own);
  jit__cu_device_destroy(other);
  mock_close(&e, &m);
}

Test(cuda_mock, bounded_wait) {
  cu_env e;
  mock m;
  jit__cu_device_options o = {.timeout_ns = 20 * 1000 * 1000};  // 20 ms
  if (!mock_open(&e, &m, &o)) return;
  mock_exe x;
  mock_desc(&x, "mock_slow", 1, 1);  // busy for 300 ms
  jit__cu_executable *exe;
  OK(jit__cu_executable_create(e.dev, &x.d, &exe));
  jit__cu_buffer *bufs[3];
  for (int b = 0; b < 3; b++) OK(jit__cu_buffer_create(e.dev, 1024, &bufs[b]));
  double t0 = now_ms();
  expect_code(jit__cu_run(exe, bufs, 3, NULL), JIT_DEVICE_ERROR, "timed out", "20 ms wait");
  double waited = now_ms() - t0;
  cr_assert(waited >= 19 && waited < 250, "waited %.1f ms", waited);
  expect_code(jit__cu_device_wait(e.dev, NULL), JIT_DEVICE_ERROR, "timed out", "wait");
  usleep(350 * 1000);
  OK(jit__cu_device_wait(e.dev, NULL));
  // A per-run timeout overrides the device's.
  jit__cu_run_options ro = {.timeout_ns = 2000ull * 1000 * 1000};
  OK(jit__cu_run(exe, bufs, 3, &ro));
  for (int b = 0; b < 3; b++) jit__cu_buffer_destroy(bufs[b]);
  jit__cu_executable_destroy(exe);
  free(x.ptx);
  mock_close(&e, &m);
}

// A sticky error (the kernel faulted) is reported by the wait with its name; afterwards
// the device refuses work, naming it, and everything still frees cleanly.
Test(cuda_mock, sticky_error) {
  cu_env e;
  mock m;
  if (!mock_open(&e, &m, NULL)) return;
  mock_exe x;
  mock_desc(&x, "mock_fault", 1, 1);
  jit__cu_executable *exe;
  OK(jit__cu_executable_create(e.dev, &x.d, &exe));
  jit__cu_buffer *bufs[3];
  for (int b = 0; b < 3; b++) OK(jit__cu_buffer_create(e.dev, 1024, &bufs[b]));
  expect_code(jit__cu_run(exe, bufs, 3, NULL), JIT_DEVICE_ERROR,
              "cuStreamQuery failed: CUDA_ERROR_ILLEGAL_ADDRESS", "faulting kernel");
  float f = 1;
  expect_code(jit__cu_buffer_upload(bufs[0], 0, &f, 4), JIT_DEVICE_ERROR,
              "unusable after CUDA_ERROR_ILLEGAL_ADDRESS", "after the fault");
  expect_code(jit__cu_run(exe, bufs, 3, NULL), JIT_DEVICE_ERROR, "unusable", "run after");
  for (int b = 0; b < 3; b++) jit__cu_buffer_destroy(bufs[b]);
  jit__cu_executable_destroy(exe);
  free(x.ptx);
  mock_close(&e, &m);
}

Test(cuda_mock, missing_symbol_and_init_errors) {
  if (!jit__cu_compiled_in()) {
    NOTE("skipped: CUDA backend compiled out");
    return;
  }
  jit__cu_instance_options o = {.library = JITML_TEST_CUDA_MOCK_NOLAUNCH};
  jit__cu_instance *in = (jit__cu_instance *)1;
  expect_code(jit__cu_instance_create(&o, &in), JIT_UNAVAILABLE, "has no `cuLaunchKernel`",
              "missing symbol");
  cr_assert_null(in);
  o.library = JITML_TEST_CUDA_MOCK;
  setenv("JITML_MOCK_CUDA_INIT", "100", 1);  // CUDA_ERROR_NO_DEVICE
  expect_code(jit__cu_instance_create(&o, &in), JIT_UNAVAILABLE,
              "cuInit failed: CUDA_ERROR_NO_DEVICE (100)", "cuInit: no device");
  setenv("JITML_MOCK_CUDA_INIT", "803", 1);  // not named by the mock: the fallback table
  expect_code(jit__cu_instance_create(&o, &in), JIT_UNAVAILABLE,
              "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "cuInit: driver mismatch");
  unsetenv("JITML_MOCK_CUDA_INIT");
  setenv("JITML_MOCK_CUDA_DEVICES", "0", 1);
  expect_code(jit__cu_instance_create(&o, &in), JIT_UNAVAILABLE, "no devices", "0 devices");
  cr_assert_null(in);
}

//===--- ptxas: PTX -> cubin (every machine with a toolkit) -----------------===//

// A private directory for one test (removed by rm_tree).
static void make_dir(char *out, size_t size, const char *tag) {
  const char *tmp = getenv("TMPDIR");
  snprintf(out, size, "%s/jitml-%s-XXXXXX", tmp && *tmp ? tmp : "/tmp", tag);
  cr_assert_not_null(mkdtemp(out));
}

static void rm_tree(const char *dir) {
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  cr_assert_eq(system(cmd), 0);
}

static bool dir_is_empty(const char *dir) {
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "test -z \"$(ls -A '%s')\"", dir);
  return system(cmd) == 0;
}

// A fake toolkit: <dir>/bin/ptxas is `script` (a shell script body).
static void fake_toolkit(char *dir, size_t size, const char *script) {
  make_dir(dir, size, "faketk");
  char path[1200];
  snprintf(path, sizeof path, "%s/bin", dir);
  cr_assert_eq(mkdir(path, 0700), 0);
  snprintf(path, sizeof path, "%s/bin/ptxas", dir);
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f);
  fprintf(f, "#!/bin/sh\n%s\n", script);
  fclose(f);
  cr_assert_eq(chmod(path, 0700), 0);
}

// The toolkit's ptxas, or false after a visible skip line.
static bool real_ptxas(jit__ptxas *p) {
  jit_status s = jit__ptxas_find(NULL, p);
  if (s) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", jit_status_message(s));
    jit_status_free(s);
    SKIP("skipped: no ptxas (%s)", msg);
  }
  return true;
}

// The SM an ELF cubin is for (from e_flags: bits 8-15 from ELF ABI version 8 on).
static int cubin_sm(const uint8_t *b, size_t n) {
  cr_assert_geq(n, 64);
  uint32_t flags;
  memcpy(&flags, b + 48, 4);
  return b[8] >= 8 ? (int)(flags >> 8 & 0xff) : (int)(flags & 0xff);
}

Test(cuda_ptxas, finds_the_toolkit_and_its_version) {
  jit__ptxas p;
  if (!real_ptxas(&p)) return;
  cr_assert(p.path[0]);
  cr_assert_gt(p.major, 0, "no version parsed for %s", p.path);
  cr_assert(p.version[0]);
  NOTE("ptxas: %s, release %d.%d (%s)", p.path, p.major, p.minor, p.version);
}

// The lowering's PTX for sm_90, assembled: an ELF cubin for EM_CUDA / sm_90 that the
// mock driver loads (it reads the kernels and their parameter counts from the ELF),
// and the plan launches from it exactly as from the PTX.
Test(cuda_mock, lowering_plan_launches_from_cubin) {
  jit__ptxas p;
  if (!real_ptxas(&p)) return;
  cu_env e;
  mock m;
  if (!mock_open(&e, &m, NULL)) return;
  tg t;
  tg_init(&t, "mlp", JIT__F32);
  int64_t dx[2] = {8, 64}, dw[2] = {64, 96}, dbias[1] = {96}, dc[2] = {8, 96};
  uint32_t x = tg_input(&t, 2, dx), wt = tg_input(&t, 2, dw), bias = tg_input(&t, 1, dbias);
  uint32_t mm = tg_node(&t, JIT__OP_MATMUL, 2, x, wt, 2, dc);
  uint32_t h = tg_node(&t, JIT__OP_ADD, 2, mm, bias, 2, dc);
  uint32_t sm = tg_unary(&t, JIT__OP_SOFTMAX, h);
  t.nodes[sm].axis = 1;
  tg_output(&t, h);
  tg_output(&t, sm);
  jit__gpu_artifact a;
  compile_ptx(&t.g, e.info, &a);
  uint8_t *cubin = NULL;
  size_t size = 0;
  OK(jit__ptxas_assemble(&p, a.binary, a.binary_size, e.info->sm, 0, &cubin, &size));
  cr_assert(size > 64 && !memcmp(cubin, "\x7f" "ELF", 4), "not an ELF image");
  uint16_t machine;
  memcpy(&machine, cubin + 18, 2);
  cr_assert_eq(machine, 190, "e_machine %u is not EM_CUDA", machine);
  cr_assert_eq(cubin_sm(cubin, size), 90);
  cu_desc d;
  plan_to_desc(&a, &d);
  d.desc.format = JIT__CU_CUBIN;
  d.desc.module = cubin;
  d.desc.module_size = size;
  jit__cu_executable *exe;
  OK(jit__cu_executable_create(e.dev, &d.desc, &exe));
  uint32_t nb = a.plan.n_buffers;
  jit__cu_buffer **bufs = calloc(nb, sizeof *bufs);
  for (uint32_t b = 0; b < nb; b++) OK(jit__cu_buffer_create(e.dev, a.plan.buffers[b].bytes, &bufs[b]));
  OK(jit__cu_run(exe, bufs, nb, NULL));
  cr_assert_eq((uint32_t)m.launch_count(), a.plan.n_kernels);
  for (uint32_t k = 0; k < a.plan.n_kernels; k++) {
    const jit__gpu_kernel *pk = &a.plan.kernels[k];
    char name[64];
    unsigned grid[3], block[3];
    void *st;
    unsigned long long args[8];
    int n = m.launch((int)k, name, sizeof name, grid, block, &st, args);
    cr_assert_str_eq(name, pk->entry);
    cr_assert_eq((uint32_t)n, pk->n_args, "kernel %u `%s`: cubin has %d params, plan %u", k,
                 pk->entry, n, pk->n_args);
    for (uint32_t i = 0; i < pk->n_args && i < 8; i++)
      cr_assert_eq(args[i], jit__cu_buffer_device_ptr(bufs[pk->args[i]]));
  }
  void (*loads)(char *, size_t) = (void (*)(char *, size_t))dlsym(m.lib, "jit_mock_cuda_loads");
  cr_assert_not_null(loads);
  char seen[512];
  loads(seen, sizeof seen);
  cr_assert_str_eq(seen, "cubin:ok");
  NOTE("cuda_mock: %zu-byte PTX -> %zu-byte sm_90 cubin by ptxas %s; %u kernels launched",
       a.binary_size, size, p.version, a.plan.n_kernels);
  for (uint32_t b = 0; b < nb; b++) jit__cu_buffer_destroy(bufs[b]);
  free(bufs);
  jit__cu_executable_destroy(exe);
  free(cubin);
  desc_free(&d);
  jit__gpu_artifact_release(&a);
  mock_close(&e, &m);
}

// What goes wrong with ptxas is a status with what it printed, and leaves no files.
Test(cuda_ptxas, failures_are_statuses_and_leave_nothing) {
  jit__ptxas p;
  if (!real_ptxas(&p)) return;
  char tmp[1024];
  make_dir(tmp, sizeof tmp, "ptxas-tmp");
  setenv("TMPDIR", tmp, 1);
  uint8_t *cubin = (uint8_t *)1;
  size_t size = 1;
  const char *bad = ".version 8.0\n.target sm_90\n.address_size 64\n"
                    ".visible .entry k() { bogus_instruction; }\n";
  expect_code(jit__ptxas_assemble(&p, bad, strlen(bad), "sm_90", 0, &cubin, &size),
              JIT_COMPILE_ERROR, "bogus_instruction", "PTX ptxas rejects");
  cr_assert_null(cubin);
  cr_assert_eq(size, 0);
  // CUDA 13's ptxas dropped the SMs before 7.5; older toolkits take sm_60.
  const char *ok = ".version 8.0\n.target sm_90\n.address_size 64\n"
                   ".visible .entry k() { ret; }\n";
  if (p.major >= 13)
    expect_code(jit__ptxas_assemble(&p, ok, strlen(ok), "sm_60", 0, &cubin, &size),
                JIT_COMPILE_ERROR, "sm_60", "an SM the toolkit dropped");
  expect_code(jit__ptxas_assemble(&p, ok, strlen(ok), "sm_90 -o /etc/x", 0, &cubin, &size),
              JIT_INVALID_ARGUMENT, "not an SM architecture", "an arch that is an option");
  expect_code(jit__ptxas_assemble(&p, ok, strlen(ok), "-v", 0, &cubin, &size),
              JIT_INVALID_ARGUMENT, NULL, "an option as arch");
  expect_code(jit__ptxas_assemble(&p, ok, 0, "sm_90", 0, &cubin, &size), JIT_INVALID_ARGUMENT,
              NULL, "empty PTX");
  expect_code(jit__ptxas_assemble(NULL, ok, strlen(ok), "sm_90", 0, &cubin, &size),
              JIT_INVALID_ARGUMENT, NULL, "NULL tool");
  expect_code(jit__ptxas_assemble(&p, ok, strlen(ok), "sm_90", 0, NULL, &size),
              JIT_INVALID_ARGUMENT, NULL, "NULL out");
  OK(jit__ptxas_assemble(&p, ok, strlen(ok), "sm_90a", 0, &cubin, &size));
  free(cubin);
  cr_assert(dir_is_empty(tmp), "ptxas left files in %s", tmp);
  unsetenv("TMPDIR");
  rm_tree(tmp);
}

Test(cuda_ptxas, missing_toolkit_is_unavailable) {
  char empty[1024];
  make_dir(empty, sizeof empty, "emptytk");
  jit__ptxas p;
  jit_status s = jit__ptxas_find(empty, &p);
  cr_assert_eq(p.path[0], 0);
  expect_code(s, JIT_UNAVAILABLE, empty, "an empty toolkit directory");
  expect_code(jit__ptxas_find("", &p), JIT_UNAVAILABLE, "no CUDA toolkit", "\"\"");
  uint8_t *cubin = NULL;
  size_t size = 0;
  expect_code(jit__ptxas_assemble(&p, "x", 1, "sm_90", 0, &cubin, &size), JIT_UNAVAILABLE,
              NULL, "assembling without ptxas");
  expect_code(jit__ptxas_find(NULL, NULL), JIT_INVALID_ARGUMENT, NULL, "NULL out");
  // The environment is searched when no toolkit is named: $CUDA_HOME first.
  char *path = strdup(getenv("PATH") ? getenv("PATH") : "/usr/bin:/bin");
  setenv("CUDA_HOME", empty, 1);
  setenv("PATH", "/nonexistent", 1);
  setenv("CUDA_PATH", "", 1);
  s = jit__ptxas_find(NULL, &p);
  setenv("PATH", path, 1);
  free(path);
  if (s) expect_code(s, JIT_UNAVAILABLE, "$CUDA_HOME", "CUDA_HOME without ptxas");
  else cr_assert_str_neq(p.path, "", "found one in /usr/local/cuda");
  rm_tree(empty);
}

// A ptxas that hangs is killed at the deadline; one that fails has its output in the
// status; one that reports no version still counts (version unknown).
Test(cuda_ptxas, hanging_and_failing_ptxas) {
  char tk[1024], tmp[1024];
  make_dir(tmp, sizeof tmp, "ptxas-tmp");
  setenv("TMPDIR", tmp, 1);
  fake_toolkit(tk, sizeof tk, "case \"$1\" in --version) echo 'Cuda compilation tools, "
                              "release 99.1, V99.1.2';; *) exec sleep 30;; esac");
  jit__ptxas p;
  OK(jit__ptxas_find(tk, &p));
  cr_assert_eq(p.major, 99);
  cr_assert_eq(p.minor, 1);
  cr_assert_str_eq(p.version, "99.1.2");
  const char *ok = ".version 8.0\n.target sm_90\n";
  uint8_t *cubin = NULL;
  size_t size = 0;
  double t0 = now_ms();
  expect_code(jit__ptxas_assemble(&p, ok, strlen(ok), "sm_90", 300, &cubin, &size),
              JIT_COMPILE_ERROR, "timed out after 300 ms", "hanging ptxas");
  double ms = now_ms() - t0;
  cr_assert_lt(ms, 5000, "the wait took %.0f ms", ms);
  rm_tree(tk);
  fake_toolkit(tk, sizeof tk, "case \"$1\" in --version) exit 0;; *) echo 'fake ptxas: "
                              "something broke' >&2; exit 3;; esac");
  OK(jit__ptxas_find(tk, &p));
  cr_assert_eq(p.major, 0);
  expect_code(jit__ptxas_assemble(&p, ok, strlen(ok), "sm_90", 0, &cubin, &size),
              JIT_COMPILE_ERROR, "exit status 3: fake ptxas: something broke", "failing ptxas");
  rm_tree(tk);
  // Exits 0 but writes garbage.
  fake_toolkit(tk, sizeof tk, "case \"$1\" in --version) exit 0;; *) echo junk > \"$5\";; "
                              "esac");
  OK(jit__ptxas_find(tk, &p));
  expect_code(jit__ptxas_assemble(&p, ok, strlen(ok), "sm_90", 0, &cubin, &size),
              JIT_COMPILE_ERROR, "not an ELF cubin", "garbage output");
  rm_tree(tk);
  // `--version` failing means no usable ptxas.
  fake_toolkit(tk, sizeof tk, "echo 'cannot execute' >&2; exit 1");
  expect_code(jit__ptxas_find(tk, &p), JIT_UNAVAILABLE, "cannot execute", "broken ptxas");
  cr_assert_eq(p.path[0], 0);
  rm_tree(tk);
  cr_assert(dir_is_empty(tmp), "files left in %s", tmp);
  unsetenv("TMPDIR");
  rm_tree(tmp);
}

//===--- PTX ISA versions: driver too old ----------------------------------===//

Test(cuda, ptx_isa_version) {
  const char *a = "//\n// Generated\n.version 8.4\n.target sm_90\n";
  cr_assert_eq(jit__cu_ptx_isa_version(a, strlen(a)), 84);
  cr_assert_eq(jit__cu_ptx_isa_version(".version 9.0", 12), 90);
  cr_assert_eq(jit__cu_ptx_isa_version(".version 9.0", 11), 0, "cut before the minor");
  cr_assert_eq(jit__cu_ptx_isa_version(".target sm_90\n", 14), 0);
  cr_assert_eq(jit__cu_ptx_isa_version(".version x.y\n", 13), 0);
  cr_assert_eq(jit__cu_ptx_isa_version(NULL, 0), 0);
}

// A driver older than the module's PTX ISA: the status names both versions instead of
// the bare CUDA_ERROR_UNSUPPORTED_PTX_VERSION, and the context stays usable.
Test(cuda_mock, ptx_newer_than_the_driver) {
  setenv("JITML_MOCK_CUDA_DRIVER", "12020", 1);  // CUDA 12.2: PTX ISA up to 8.2
  cu_env e;
  mock m;
  if (!mock_open(&e, &m, NULL)) return;
  cr_assert_eq(e.info->ptx_max, 82);
  mock_exe x;
  mock_desc(&x, "mock_add", 3, 4);  // kMockPtx is .version 8.4
  jit__cu_executable *exe = NULL;
  jit_status s = jit__cu_executable_create(e.dev, &x.d, &exe);
  cr_assert_null(exe);
  cr_assert_not_null(s);
  char msg[4096];
  snprintf(msg, sizeof msg, "%s", jit_status_message(s));
  expect_code(s, JIT_UNSUPPORTED, "PTX ISA 8.4, newer than the driver", "PTX 8.4 on 12.2");
  cr_assert(strstr(msg, "driver version 12020 (CUDA 12.2)") && strstr(msg, "up to 8.2"),
            "%s", msg);
  // The same module with an older .version loads.
  memcpy(strstr(x.ptx, "8.4"), "8.0", 3);
  OK(jit__cu_executable_create(e.dev, &x.d, &exe));
  jit__cu_executable_destroy(exe);
  free(x.ptx);
  unsetenv("JITML_MOCK_CUDA_DRIVER");
  mock_close(&e, &m);
}
