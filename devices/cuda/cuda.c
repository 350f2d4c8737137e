//===--- cuda.c - the CUDA device: primary contexts, buffers, modules, runs -===//
//
// See cuda.h for the contract. Built with the toolkit's cuda.h only (no libcuda at link
// time): JITML_HAVE_CUDA_H is set by CMake when cuda.h was found; without it every
// entry point reports JIT_UNAVAILABLE.
//
//===----------------------------------------------------------------------===//
#include "devices/cuda/cuda.h"

#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/status.h"

// Shared by both builds: a pure table, no driver needed.
int jit__cu_ptx_max_for_driver(int v) {
  // (driver version, newest PTX ISA) from the PTX ISA release notes; a driver newer than
  // the table gets the newest entry (drivers accept all older PTX).
  static const int kTable[][2] = {
      {11000, 70}, {11010, 71}, {11020, 72}, {11030, 73}, {11040, 74}, {11050, 75},
      {11060, 76}, {11070, 77}, {11080, 78}, {12000, 80}, {12010, 81}, {12020, 82},
      {12030, 83}, {12040, 84}, {12050, 85}, {12070, 86}, {12080, 87}, {12090, 88},
      {13000, 90},
  };
  int ptx = 0;
  for (size_t i = 0; i < sizeof kTable / sizeof kTable[0]; i++)
    if (v >= kTable[i][0]) ptx = kTable[i][1];
  return ptx;
}

int jit__cu_ptx_isa_version(const void *ptx, size_t size) {
  // The first `.version X.Y` directive (PTX puts it before anything but comments).
  const char *p = ptx, *end = p ? p + size : NULL;
  static const char kDir[] = ".version";
  for (; p && p + sizeof kDir < end; p++) {
    if (*p != '.' || memcmp(p, kDir, sizeof kDir - 1) != 0) continue;
    p += sizeof kDir - 1;
    while (p < end && (*p == ' ' || *p == '\t')) p++;
    int major = 0, minor = 0, digits = 0;
    while (p < end && *p >= '0' && *p <= '9' && digits++ < 3) major = major * 10 + (*p++ - '0');
    if (!digits || p >= end || *p++ != '.') return 0;
    digits = 0;
    while (p < end && *p >= '0' && *p <= '9' && digits++ < 3) minor = minor * 10 + (*p++ - '0');
    return digits == 1 ? major * 10 + minor : 0;
  }
  return 0;
}

#if !defined(JITML_HAVE_CUDA_H) || !JITML_HAVE_CUDA_H

//===--- Compiled out -----------------------------------------------------===//

#define JIT__CU_OUT                                                                   \
  JIT_ERR(JIT_UNAVAILABLE, "CUDA: backend compiled out (no cuda.h at build time; "    \
                           "install the CUDA toolkit or set CUDA_HOME, and rebuild)")

bool jit__cu_compiled_in(void) { return false; }
jit_status jit__cu_instance_create(const jit__cu_instance_options *options,
                                   jit__cu_instance **out_instance) {
  if (out_instance) *out_instance = NULL;
  return JIT__CU_OUT;
}
void jit__cu_instance_release(jit__cu_instance *instance) {}
uint32_t jit__cu_instance_device_count(const jit__cu_instance *instance) { return 0; }
const jit__cu_device_info *jit__cu_instance_device_info(const jit__cu_instance *instance,
                                                        uint32_t index) {
  return NULL;
}
jit_status jit__cu_instance_select(const jit__cu_instance *instance, const char *selector,
                                   uint32_t *out_index) {
  return JIT__CU_OUT;
}
jit_status jit__cu_device_create(jit__cu_instance *instance, uint32_t index,
                                 const jit__cu_device_options *options,
                                 jit__cu_device **out_device) {
  if (out_device) *out_device = NULL;
  return JIT__CU_OUT;
}
void jit__cu_device_destroy(jit__cu_device *device) {}
jit_status jit__cu_device_wait(jit__cu_device *device, struct CUstream_st *stream) {
  return JIT__CU_OUT;
}
const jit__cu_device_info *jit__cu_device_get_info(const jit__cu_device *device) {
  return NULL;
}
jit_status jit__cu_buffer_create(jit__cu_device *device, uint64_t bytes,
                                 jit__cu_buffer **out_buffer) {
  if (out_buffer) *out_buffer = NULL;
  return JIT__CU_OUT;
}
jit_status jit__cu_buffer_wrap(jit__cu_device *device, uint64_t device_ptr, uint64_t bytes,
                               jit__cu_buffer **out_buffer) {
  if (out_buffer) *out_buffer = NULL;
  return JIT__CU_OUT;
}
void jit__cu_buffer_destroy(jit__cu_buffer *buffer) {}
uint64_t jit__cu_buffer_size(const jit__cu_buffer *buffer) { return 0; }
uint64_t jit__cu_buffer_device_ptr(const jit__cu_buffer *buffer) { return 0; }
jit_status jit__cu_buffer_upload(jit__cu_buffer *buffer, uint64_t offset, const void *src,
                                 uint64_t bytes) {
  return JIT__CU_OUT;
}
jit_status jit__cu_buffer_download(jit__cu_buffer *buffer, uint64_t offset, void *dst,
                                   uint64_t bytes) {
  return JIT__CU_OUT;
}
jit_status jit__cu_buffer_copy(jit__cu_buffer *dst, uint64_t dst_offset,
                               const jit__cu_buffer *src, uint64_t src_offset,
                               uint64_t bytes) {
  return JIT__CU_OUT;
}
jit_status jit__cu_buffer_fill(jit__cu_buffer *buffer, uint64_t offset, uint8_t value,
                               uint64_t bytes) {
  return JIT__CU_OUT;
}
jit_status jit__cu_executable_create(jit__cu_device *device,
                                     const jit__cu_executable_desc *desc,
                                     jit__cu_executable **out_executable) {
  if (out_executable) *out_executable = NULL;
  return JIT__CU_OUT;
}
void jit__cu_executable_destroy(jit__cu_executable *executable) {}
double jit__cu_executable_create_ms(const jit__cu_executable *executable) { return 0; }
jit_status jit__cu_run(jit__cu_executable *executable, jit__cu_buffer *const *buffers,
                       uint32_t n_buffers, const jit__cu_run_options *options) {
  return JIT__CU_OUT;
}

#else  // JITML_HAVE_CUDA_H

#include <ctype.h>
#include <cuda.h>
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

// cuda.h maps cuDeviceGetUuid to cuDeviceGetUuid_v2 (drivers >= 11.4); the original
// symbol (same signature) exists since 9.2, so the table names that one.
#undef cuDeviceGetUuid
#include "devices/cuda/cuda_symbols.h"

#define JIT__CU_DEFAULT_TIMEOUT_NS (10ull * 1000 * 1000 * 1000)

//===--- Instance state (needed by the status conversion) -----------------===//

struct jit__cu_instance {
  atomic_int refs;
  void *lib;
  struct {
#define X(name, params) CUresult(CUDAAPI *name) params;
    JIT__CU_SYMBOLS(X)
#undef X
  } fn;
  uint32_t n_devices;
  jit__cu_device_info *info;
};

struct jit__cu_device {
  jit__cu_instance *inst;
  CUdevice dev;
  CUcontext ctx;
  jit__cu_device_info info;
  uint64_t timeout_ns;
  // The first context-poisoning CUresult seen (0: none); see cuda.h.
  atomic_int sticky;
};

//===--- CUresult -> jit_status, once, where the call is made ------------===//

// Used when the driver cannot name its own error (the toolkit's stub library answers
// every call, cuGetErrorName included, with CUDA_ERROR_STUB_LIBRARY).
static const char *cu_fallback_name(CUresult r) {
  switch (r) {
#define C(x) \
  case x:    \
    return #x;
    C(CUDA_SUCCESS) C(CUDA_ERROR_INVALID_VALUE) C(CUDA_ERROR_OUT_OF_MEMORY)
    C(CUDA_ERROR_NOT_INITIALIZED) C(CUDA_ERROR_DEINITIALIZED) C(CUDA_ERROR_STUB_LIBRARY)
    C(CUDA_ERROR_DEVICE_UNAVAILABLE) C(CUDA_ERROR_NO_DEVICE) C(CUDA_ERROR_INVALID_DEVICE)
    C(CUDA_ERROR_NOT_SUPPORTED) C(CUDA_ERROR_INVALID_IMAGE)
    C(CUDA_ERROR_INVALID_CONTEXT) C(CUDA_ERROR_NO_BINARY_FOR_GPU) C(CUDA_ERROR_INVALID_PTX)
    C(CUDA_ERROR_UNSUPPORTED_PTX_VERSION) C(CUDA_ERROR_INVALID_HANDLE)
    C(CUDA_ERROR_NOT_FOUND) C(CUDA_ERROR_NOT_READY) C(CUDA_ERROR_ILLEGAL_ADDRESS)
    C(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES) C(CUDA_ERROR_LAUNCH_TIMEOUT)
    C(CUDA_ERROR_LAUNCH_FAILED) C(CUDA_ERROR_ILLEGAL_INSTRUCTION)
    C(CUDA_ERROR_MISALIGNED_ADDRESS) C(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH)
    C(CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE) C(CUDA_ERROR_SYSTEM_NOT_READY)
#undef C
    default:
      return "CUDA_ERROR_UNKNOWN_CODE";
  }
}

// Errors after which the context cannot be used again (CUDA programming guide: "sticky"
// errors; the process must reset the context).
static bool cu_is_sticky(CUresult r) {
  switch (r) {
    case CUDA_ERROR_ECC_UNCORRECTABLE:
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_TIMEOUT:
    case CUDA_ERROR_ASSERT:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_LAUNCH_FAILED:
      return true;
    default:
      return false;
  }
}

static jit_status_code cu_result_code(CUresult r) {
  switch (r) {
    case CUDA_ERROR_OUT_OF_MEMORY:
    case CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES:
      return JIT_RESOURCE_EXHAUSTED;
    case CUDA_ERROR_NOT_INITIALIZED:
    case CUDA_ERROR_DEINITIALIZED:
    case CUDA_ERROR_STUB_LIBRARY:
    case CUDA_ERROR_DEVICE_UNAVAILABLE:
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
    case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE:
    case CUDA_ERROR_SYSTEM_NOT_READY:
      return JIT_UNAVAILABLE;
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_INVALID_DEVICE:
    case CUDA_ERROR_INVALID_IMAGE:
    case CUDA_ERROR_INVALID_HANDLE:
    case CUDA_ERROR_NOT_FOUND:
      return JIT_INVALID_ARGUMENT;
    case CUDA_ERROR_NO_BINARY_FOR_GPU:
    case CUDA_ERROR_UNSUPPORTED_PTX_VERSION:
      return JIT_UNSUPPORTED;
    case CUDA_ERROR_INVALID_PTX:
      return JIT_COMPILE_ERROR;
    default:
      return JIT_DEVICE_ERROR;
  }
}

// NULL for CUDA_SUCCESS, else a status "CUDA: <call> failed: <NAME> (<code>): <text>"
// (plus `extra`, e.g. the JIT log) made at the caller's file:line, with the code
// cu_result_code gives, or `code` when that is not JIT_OK. `d`, when given, remembers a
// sticky error.
static jit_status cu_result_as(const jit__cu_instance *in, jit__cu_device *d, CUresult r,
                               jit_status_code code, const char *call, const char *extra,
                               const char *file, int line) {
  if (r == CUDA_SUCCESS) return NULL;
  const char *name = NULL, *text = NULL;
  if (in && in->fn.cuGetErrorName && in->fn.cuGetErrorName(r, &name) != CUDA_SUCCESS)
    name = NULL;
  if (in && in->fn.cuGetErrorString && in->fn.cuGetErrorString(r, &text) != CUDA_SUCCESS)
    text = NULL;
  if (!name) name = cu_fallback_name(r);
  if (d && cu_is_sticky(r)) {
    int none = 0;
    atomic_compare_exchange_strong(&d->sticky, &none, (int)r);
  }
  return jit__status_make(code != JIT_OK ? code : cu_result_code(r), file, line,
                          "CUDA: %s failed: %s (%d)%s%s%s%s", call, name, (int)r,
                          text ? ": " : "", text ? text : "", extra ? "; " : "",
                          extra ? extra : "");
}

static jit_status cu_result(const jit__cu_instance *in, jit__cu_device *d, CUresult r,
                            const char *call, const char *extra, const char *file,
                            int line) {
  return cu_result_as(in, d, r, JIT_OK, call, extra, file, line);
}

// A call through the instance's table `in`, converted once, here.
#define CU_CALL(in, name, ...) \
  cu_result((in), NULL, (in)->fn.name(__VA_ARGS__), #name, NULL, __FILE__, __LINE__)
// A call on a device: also remembers sticky errors on it.
#define CU_DCALL(d, name, ...)                                                        \
  cu_result((d)->inst, (d), (d)->inst->fn.name(__VA_ARGS__), #name, NULL, __FILE__, \
            __LINE__)

static jit_status check_sticky(jit__cu_device *d) {
  int r = atomic_load(&d->sticky);
  if (!r) return NULL;
  return JIT_ERR(JIT_DEVICE_ERROR,
                 "CUDA: device %u (%s) is unusable after %s (%d) in an earlier call; the "
                 "process's primary context must be reset (the error is sticky)",
                 d->info.index, d->info.name, cu_fallback_name((CUresult)r), r);
}

// Makes the device's context current on this thread; pop_ctx restores the previous one.
static jit_status push_ctx(jit__cu_device *d) {
  JIT_PROPAGATE(check_sticky(d));
  return CU_DCALL(d, cuCtxPushCurrent_v2, d->ctx);
}

static void pop_ctx(jit__cu_device *d) {
  CUcontext popped;
  // Cannot fail after a successful push on this thread; nothing to report it to anyway.
  (void)d->inst->fn.cuCtxPopCurrent_v2(&popped);
}

//===--- Instance ---------------------------------------------------------===//

bool jit__cu_compiled_in(void) { return true; }

static void instance_free(jit__cu_instance *in) {
  if (!in) return;
  // RTLD_NODELETE keeps the code mapped: libcuda cannot be initialized again once
  // unloaded, and its threads may still run. dlclose only drops the reference.
  if (in->lib) dlclose(in->lib);
  free(in->info);
  free(in);
}

static jit_status describe_device(jit__cu_instance *in, uint32_t ordinal, int driver,
                                  jit__cu_device_info *info) {
  memset(info, 0, sizeof *info);
  info->index = ordinal;
  CUdevice dev;
  JIT_PROPAGATE(CU_CALL(in, cuDeviceGet, &dev, (int)ordinal));
  JIT_PROPAGATE(CU_CALL(in, cuDeviceGetName, info->name, (int)sizeof info->name - 1, dev));
  static const struct {
    CUdevice_attribute attr;
    size_t offset;
  } kAttrs[] = {
      {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, offsetof(jit__cu_device_info, cc_major)},
      {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, offsetof(jit__cu_device_info, cc_minor)},
      {CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
       offsetof(jit__cu_device_info, multiprocessor_count)},
  };
  for (size_t i = 0; i < sizeof kAttrs / sizeof kAttrs[0]; i++) {
    int v = 0;
    JIT_PROPAGATE(CU_CALL(in, cuDeviceGetAttribute, &v, kAttrs[i].attr, dev));
    memcpy((char *)info + kAttrs[i].offset, &v, sizeof v);
  }
  static const CUdevice_attribute kGrid[3] = {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X,
                                              CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y,
                                              CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z};
  static const CUdevice_attribute kBlock[3] = {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X,
                                               CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y,
                                               CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z};
  for (int i = 0; i < 3; i++) {
    int g = 0, b = 0;
    JIT_PROPAGATE(CU_CALL(in, cuDeviceGetAttribute, &g, kGrid[i], dev));
    JIT_PROPAGATE(CU_CALL(in, cuDeviceGetAttribute, &b, kBlock[i], dev));
    info->max_grid_dim[i] = g > 0 ? (uint32_t)g : 0;
    info->max_block_dim[i] = b > 0 ? (uint32_t)b : 0;
  }
  int tpb = 0;
  JIT_PROPAGATE(
      CU_CALL(in, cuDeviceGetAttribute, &tpb, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, dev));
  info->max_threads_per_block = tpb > 0 ? (uint32_t)tpb : 0;
  size_t total = 0;
  JIT_PROPAGATE(CU_CALL(in, cuDeviceTotalMem_v2, &total, dev));
  info->total_memory = total;
  CUuuid uuid;
  JIT_PROPAGATE(CU_CALL(in, cuDeviceGetUuid, &uuid, dev));
  memcpy(info->uuid, uuid.bytes, sizeof info->uuid);
  snprintf(info->sm, sizeof info->sm, "sm_%d%d", info->cc_major, info->cc_minor);
  info->driver_version = driver;
  info->ptx_max = jit__cu_ptx_max_for_driver(driver);
  return NULL;
}

jit_status jit__cu_instance_create(const jit__cu_instance_options *options,
                                   jit__cu_instance **out_instance) {
  if (!out_instance) return JIT_ERR(JIT_INVALID_ARGUMENT, "CUDA: out_instance is NULL");
  *out_instance = NULL;
  const char *lib_name = options && options->library ? options->library : NULL;
  if (!lib_name) lib_name = getenv("JITML_CUDA_LIBRARY");
  if (!lib_name || !lib_name[0]) lib_name = "libcuda.so.1";
  jit__cu_instance *in = calloc(1, sizeof *in);
  if (!in) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "CUDA: out of memory");
  atomic_init(&in->refs, 1);
  jit_status s = NULL;

  in->lib = dlopen(lib_name, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (!in->lib) {
    const char *e = dlerror();
    s = JIT_ERR(JIT_UNAVAILABLE,
                "CUDA: cannot load %s (%s); an NVIDIA driver is needed (the CUDA toolkit "
                "alone does not provide it)",
                lib_name, e ? e : "not found");
    goto fail;
  }
#define X(name, params)                                                            \
  in->fn.name = (CUresult(CUDAAPI *) params)dlsym(in->lib, #name);                 \
  if (!in->fn.name) {                                                              \
    s = JIT_ERR(JIT_UNAVAILABLE, "CUDA: %s has no `%s` (driver older than CUDA 11?)", \
                lib_name, #name);                                                  \
    goto fail;                                                                     \
  }
  JIT__CU_SYMBOLS(X)
#undef X

  // Whatever cuInit says (no device, driver/library mismatch, the toolkit's stub
  // library, ...), the backend is not usable on this machine: JIT_UNAVAILABLE.
  CUresult r = in->fn.cuInit(0);
  if (r != CUDA_SUCCESS) {
    char extra[512];
    snprintf(extra, sizeof extra, "the CUDA backend is unavailable (library %s)", lib_name);
    s = cu_result_as(in, NULL, r, JIT_UNAVAILABLE, "cuInit", extra, __FILE__, __LINE__);
    goto fail;
  }
  int driver = 0, count = 0;
  if ((s = CU_CALL(in, cuDriverGetVersion, &driver))) goto fail;
  if ((s = CU_CALL(in, cuDeviceGetCount, &count))) goto fail;
  if (count <= 0) {
    s = JIT_ERR(JIT_UNAVAILABLE, "CUDA: %s reports no devices", lib_name);
    goto fail;
  }
  in->info = calloc((size_t)count, sizeof *in->info);
  if (!in->info) {
    s = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "CUDA: out of memory");
    goto fail;
  }
  for (int i = 0; i < count; i++) {
    if ((s = describe_device(in, (uint32_t)i, driver, &in->info[i]))) {
      s = jit__status_annotate(s, "CUDA: describing device %d", i);
      goto fail;
    }
  }
  in->n_devices = (uint32_t)count;
  *out_instance = in;
  return NULL;
fail:
  instance_free(in);
  return s;
}

void jit__cu_instance_release(jit__cu_instance *instance) {
  if (instance && atomic_fetch_sub(&instance->refs, 1) == 1) instance_free(instance);
}

uint32_t jit__cu_instance_device_count(const jit__cu_instance *instance) {
  return instance ? instance->n_devices : 0;
}

const jit__cu_device_info *jit__cu_instance_device_info(const jit__cu_instance *instance,
                                                        uint32_t index) {
  if (!instance || index >= instance->n_devices) return NULL;
  return &instance->info[index];
}

static bool contains_nocase(const char *hay, const char *needle) {
  size_t n = strlen(needle);
  for (; *hay; hay++) {
    size_t i = 0;
    while (i < n && hay[i] &&
           tolower((unsigned char)hay[i]) == tolower((unsigned char)needle[i]))
      i++;
    if (i == n) return true;
  }
  return n == 0;
}

jit_status jit__cu_instance_select(const jit__cu_instance *instance, const char *selector,
                                   uint32_t *out_index) {
  if (!instance || !out_index)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "CUDA: select: NULL instance or out_index");
  const char *from = "selector";
  if (!selector) {
    selector = getenv("JITML_CUDA_DEVICE");
    from = "JITML_CUDA_DEVICE";
  }
  if (!selector || !*selector) {
    *out_index = 0;
    return NULL;
  }
  char *end = NULL;
  unsigned long v = strtoul(selector, &end, 10);
  bool numeric = end && end != selector && *end == '\0';
  for (uint32_t i = 0; i < instance->n_devices; i++) {
    if (numeric ? v == i : contains_nocase(instance->info[i].name, selector)) {
      *out_index = i;
      return NULL;
    }
  }
  char list[1024];
  size_t used = 0;
  list[0] = '\0';
  for (uint32_t i = 0; i < instance->n_devices && used < sizeof list; i++) {
    int w = snprintf(list + used, sizeof list - used, "%s%u: %s (%s)", i ? ", " : "", i,
                     instance->info[i].name, instance->info[i].sm);
    if (w > 0) used += (size_t)w;
  }
  return JIT_ERR(JIT_UNAVAILABLE, "CUDA: %s `%s` matches no device; devices: %s", from,
                 selector, list);
}

//===--- Devices ----------------------------------------------------------===//

jit_status jit__cu_device_create(jit__cu_instance *instance, uint32_t index,
                                 const jit__cu_device_options *options,
                                 jit__cu_device **out_device) {
  if (!out_device) return JIT_ERR(JIT_INVALID_ARGUMENT, "CUDA: out_device is NULL");
  *out_device = NULL;
  if (!instance) return JIT_ERR(JIT_INVALID_ARGUMENT, "CUDA: device_create: NULL instance");
  if (index >= instance->n_devices)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "CUDA: device index %u is out of range (%u devices)",
                   index, instance->n_devices);
  jit__cu_device *d = calloc(1, sizeof *d);
  if (!d) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "CUDA: out of memory");
  d->inst = instance;
  d->info = instance->info[index];
  d->timeout_ns = options && options->timeout_ns ? options->timeout_ns
                                                 : JIT__CU_DEFAULT_TIMEOUT_NS;
  atomic_init(&d->sticky, 0);
  jit_status s = CU_CALL(instance, cuDeviceGet, &d->dev, (int)index);
  if (!s) s = CU_CALL(instance, cuDevicePrimaryCtxRetain, &d->ctx, d->dev);
  if (s) {
    free(d);
    return jit__status_annotate(s, "CUDA: device %u (%s)", index, instance->info[index].name);
  }
  atomic_fetch_add(&instance->refs, 1);
  *out_device = d;
  return NULL;
}

void jit__cu_device_destroy(jit__cu_device *device) {
  if (!device) return;
  // Other users of the primary context (the CUDA runtime, other devices here) keep it
  // alive; the last release destroys it.
  (void)device->inst->fn.cuDevicePrimaryCtxRelease_v2(device->dev);
  jit__cu_instance_release(device->inst);
  free(device);
}

const jit__cu_device_info *jit__cu_device_get_info(const jit__cu_device *device) {
  return device ? &device->info : NULL;
}

// Polls `stream` until it is idle, an error, or `timeout_ns` has passed. The context is
// current. Spins for the first ~20 us (short kernels), then sleeps 1 us doubling to
// 100 us between polls.
static jit_status wait_stream(jit__cu_device *d, CUstream stream, uint64_t timeout_ns,
                              const char *what) {
  double start = jit__now_ms(), limit = (double)timeout_ns / 1e6;
  long sleep_ns = 1000;
  for (unsigned polls = 0;; polls++) {
    CUresult r = d->inst->fn.cuStreamQuery(stream);
    if (r == CUDA_SUCCESS) return NULL;
    if (r != CUDA_ERROR_NOT_READY)
      return jit__status_annotate(
          cu_result(d->inst, d, r, "cuStreamQuery", NULL, __FILE__, __LINE__),
          "CUDA: waiting for %s", what);
    double waited = jit__now_ms() - start;
    if (waited >= limit)
      return JIT_ERR(JIT_DEVICE_ERROR,
                     "CUDA: timed out after %.1f ms waiting for %s on device %u (%s); the "
                     "work is still in flight: do not free its buffers before "
                     "jit__cu_device_wait succeeds",
                     waited, what, d->info.index, d->info.name);
    if (waited < 0.02 && polls < 1000) continue;
    struct timespec ts = {0, sleep_ns};
    nanosleep(&ts, NULL);
    if (sleep_ns < 100000) sleep_ns *= 2;
  }
}

jit_status jit__cu_device_wait(jit__cu_device *device, struct CUstream_st *stream) {
  if (!device) return JIT_ERR(JIT_INVALID_ARGUMENT, "CUDA: wait: NULL device");
  JIT_PROPAGATE(push_ctx(device));
  jit_status s = wait_stream(device, stream, device->timeout_ns, "queued work");
  pop_ctx(device);
  return s;
}

//===--- Buffers ----------------------------------------------------------===//

struct jit__cu_buffer {
  jit__cu_device *dev;
  CUdeviceptr ptr;
  uint64_t size;
  bool owned;  // false: wrapped memory someone else frees
};

jit_status jit__cu_buffer_create(jit__cu_device *device, uint64_t bytes,
                                 jit__cu_buffer **out_buffer) {
  if (!out_buffer) return JIT_ERR(JIT_INVALID_ARGUMENT, "CUDA: out_buffer is NULL");
  *out_buffer = NULL;
  if (!device) return JIT_ERR(JIT_INVALID_ARGUMENT, "CUDA: buffer_create: NULL device");
  if (bytes > SIZE_MAX)
    return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "CUDA: %llu bytes do not fit in size_t",
                   (unsigned long long)bytes);
  jit__cu_buffer *b = calloc(1, sizeof *b);
  if (!b) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "CUDA: out of memory");
  b->dev = device;
  b->size = bytes;
  b->owned = true;
  if (bytes) {
    jit_status s = push_ctx(device);
    if (!s) {
      s = CU_DCALL(device, cuMemAlloc_v2, &b->ptr, (size_t)bytes);
      pop_ctx(device);
    }
    if (s) {
      free(b);
      return jit__status_annotate(s, "CUDA: allocating %llu bytes on device %u (%s, %llu "
                                  "bytes total)",
                                  (unsigned long long)bytes, device->info.index,
                                  device->info.name,
                                  (unsigned long long)device->info.total_memory);
    }
  }
  *out_buffer = b;
  return NULL;
}

// Checks that `ptr` is device (or managed) memory of device `d`; the context is current.
static jit_status check_device_ptr(jit__cu_device *d, CUdeviceptr ptr, const char *which) {
  unsigned int type = 0;
  CUresult r = d->inst->fn.cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr);
  if (r == CUDA_ERROR_INVALID_VALUE || (r == CUDA_SUCCESS && type == CU_MEMORYTYPE_HOST))
    return JIT_ERR(JIT_INVALID_ARGUMENT,
                   "CUDA: %s at 0x%llx is not CUDA device memory (%s); a host "
                   "pointer passed as a kDLCUDA tensor?",
                   which, (unsigned long long)ptr,
                   r == CUDA_SUCCESS ? "page-locked host memory" : "unknown to CUDA");
  if (r != CUDA_SUCCESS)
    return cu_result(d->inst, d, r, "cuPointerGetAttribute(MEMORY_TYPE)", NULL, __FILE__,
                     __LINE__);
  int ordinal = -1;
  r = d->inst->fn.cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr);
  if (r != CUDA_SUCCESS)
    return cu_result(d->inst, d, r, "cuPointerGetAttribute(DEVICE_ORDINAL)", NULL, __FILE__,
                     __LINE__);
  if (ordinal != (int)d->info.index)
    return JIT_ERR(JIT_INVALID_ARGUMENT,
                   "CUDA: %s at 0x%llx is memory of CUDA device %d, but the run is on "
                   "device %u (%s); all tensors of one run must be on one GPU",
                   which, (unsigned long long)ptr, ordinal, d->info.index, d->info.name);
  return NULL;
}

jit_status jit__cu_buffer_wrap(jit__cu_device *device, uint64_t device_ptr, uint64_t bytes,
                               jit__cu_buffer **out_buffer) {
  if (!out_buffer) return JIT_ERR(JIT_INVALID_ARGUMENT, "CUDA: out_buffer is NULL");
  *out_buffer = NULL;
  if (!device) return JIT_ERR(JIT_INVALID_ARGUMENT, "CUDA: buffer_wrap: NULL device");
  if (bytes && device_ptr + bytes < device_ptr)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "CUDA: wrapped range wraps around the address space");
  if (bytes) {
    // The first and the last byte: a tensor running past its allocation (or into
    // another device's memory) is caught without relying on allocation ranges, which
    // differ for memory mapped with cuMemMap (PyTorch's expandable segments).
    JIT_PROPAGATE(push_ctx(device));
    jit_status s = check_device_ptr(device, device_ptr, "the first byte");
    if (!s && bytes > 1) s = check_device_ptr(device, device_ptr + bytes - 1, "the last byte");
    pop_ctx(device);
    if (s)
      return jit__status_annotate(s, "CUDA: wrapping %llu bytes at 0x%llx",
                                  (unsigned long long)bytes, (unsigned long long)device_ptr);
  }
  jit__cu_buffer *b = calloc(1, sizeof *b);
  if (!b) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "CUDA: out of memory");
  *b = (jit__cu_buffer){.dev = device, .ptr = bytes ? device_ptr : 0, .size = bytes};
  *out_buffer = b;
  return NULL;
}

void jit__cu_buffer_destroy(jit__cu_buffer *buffer) {
  if (!buffer) return;
  if (buffer->owned && buffer->ptr &&
      buffer->dev->inst->fn.cuCtxPushCurrent_v2(buffer->dev->ctx) == CUDA_SUCCESS) {
    (void)buffer->dev->inst->fn.cuMemFree_v2(buffer->ptr);
    pop_ctx(buffer->dev);
  }
  free(buffer);
}

uint64_t jit__cu_buffer_size(const jit__cu_buffer *buffer) { return buffer ? buffer->size : 0; }

uint64_t jit__cu_buffer_device_ptr(const jit__cu_buffer *buffer) {
  return buffer ? (uint64_t)buffer->ptr : 0;
}

static jit_status check_range(const jit__cu_buffer *b, uint64_t offset, uint64_t bytes,
                              const char *what) {
  if (!b) return JIT_ERR(JIT_INVALID_ARGUMENT, "CUDA: %s: NULL buffer", what);
  if (offset > b->size || bytes > b->size - offset)
    return JIT_ERR(JIT_INVALID_ARGUMENT,
                   "CUDA: %s: bytes [%llu, +%llu) are outside the buffer of %llu bytes", what,
                   (unsigned long long)offset, (unsigned long long)bytes,
                   (unsigned long long)b->size);
  return NULL;
}

jit_status jit__cu_buffer_upload(jit__cu_buffer *buffer, uint64_t offset, const void *src,
                                 uint64_t bytes) {
  JIT_PROPAGATE(check_range(buffer, offset, bytes, "upload"));
  if (!bytes) return NULL;
  if (!src) return JIT_ERR(JIT_INVALID_ARGUMENT, "CUDA: upload: NULL source");
  jit__cu_device *d = buffer->dev;
  JIT_PROPAGATE(push_ctx(d));
  jit_status s = CU_DCALL(d, cuMemcpyHtoD_v2, buffer->ptr + offset, src, (size_t)bytes);
  pop_ctx(d);
  return s;
}

jit_status jit__cu_buffer_download(jit__cu_buffer *buffer, uint64_t offset, void *dst,
                                   uint64_t bytes) {
  JIT_PROPAGATE(check_range(buffer, offset, bytes, "download"));
  if (!bytes) return NULL;
  if (!dst) return JIT_ERR(JIT_INVALID_ARGUMENT, "CUDA: download: NULL destination");
  jit__cu_device *d = buffer->dev;
  JIT_PROPAGATE(push_ctx(d));
  jit_status s = CU_DCALL(d, cuMemcpyDtoH_v2, dst, buffer->ptr + offset, (size_t)bytes);
  pop_ctx(d);
  return s;
}

jit_status jit__cu_buffer_copy(jit__cu_buffer *dst, uint64_t dst_offset,
                               const jit__cu_buffer *src, uint64_t src_offset,
                               uint64_t bytes) {
  JIT_PROPAGATE(check_range(dst, dst_offset, bytes, "copy (destination)"));
  JIT_PROPAGATE(check_range(src, src_offset, bytes, "copy (source)"));
  if (dst->dev->ctx != src->dev->ctx)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "CUDA: copy between device %u and device %u: "
                   "both buffers must be on one device", src->dev->info.index,
                   dst->dev->info.index);
  if (!bytes) return NULL;
  jit__cu_device *d = dst->dev;
  JIT_PROPAGATE(push_ctx(d));
  jit_status s = CU_DCALL(d, cuMemcpyDtoD_v2, dst->ptr + dst_offset, src->ptr + src_offset,
                          (size_t)bytes);
  pop_ctx(d);
  return s;
}

jit_status jit__cu_buffer_fill(jit__cu_buffer *buffer, uint64_t offset, uint8_t value,
                               uint64_t bytes) {
  JIT_PROPAGATE(check_range(buffer, offset, bytes, "fill"));
  if (!bytes) return NULL;
  jit__cu_device *d = buffer->dev;
  JIT_PROPAGATE(push_ctx(d));
  jit_status s = CU_DCALL(d, cuMemsetD8_v2, buffer->ptr + offset, value, (size_t)bytes);
  pop_ctx(d);
  return s;
}

//===--- Executables ------------------------------------------------------===//

typedef struct cu_kernel {
  CUfunction fn;
  char *entry;        // for messages
  uint32_t grid[3], block[3];
  uint32_t n_args;
  uint32_t first_arg;  // into the executable's args
} cu_kernel;

struct jit__cu_executable {
  jit__cu_device *dev;
  CUmodule module;
  uint32_t n_buffers;
  uint64_t *buffer_bytes;
  uint32_t n_kernels;
  cu_kernel *kernels;
  uint32_t *args;
  uint32_t max_args;
  double create_ms;
};

void jit__cu_executable_destroy(jit__cu_executable *e) {
  if (!e) return;
  if (e->module && e->dev->inst->fn.cuCtxPushCurrent_v2(e->dev->ctx) == CUDA_SUCCESS) {
    (void)e->dev->inst->fn.cuModuleUnload(e->module);
    pop_ctx(e->dev);
  }
  for (uint32_t k = 0; k < e->n_kernels; k++) free(e->kernels[k].entry);
  free(e->kernels);
  free(e->args);
  free(e->buffer_bytes);
  free(e);
}

double jit__cu_executable_create_ms(const jit__cu_executable *executable) {
  return executable ? executable->create_ms : 0;
}

static const char kAxis[3] = {'X', 'Y', 'Z'};

// Checks the description against itself and the device's limits, before any CUDA call.
static jit_status check_desc(const jit__cu_device *d, const jit__cu_executable_desc *desc) {
  const jit__cu_device_info *info = &d->info;
  if (desc->format != JIT__CU_PTX && desc->format != JIT__CU_CUBIN)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "CUDA: unknown module format %d", (int)desc->format);
  if (!desc->module || !desc->module_size)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "CUDA: empty module");
  if (desc->format == JIT__CU_PTX && memchr(desc->module, '\0', desc->module_size))
    return JIT_ERR(JIT_INVALID_ARGUMENT, "CUDA: the PTX holds a NUL byte (binary data "
                   "passed as PTX?)");
  if (desc->format == JIT__CU_CUBIN && desc->module_size < 4)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "CUDA: a cubin of %zu bytes", desc->module_size);
  if (!desc->n_kernels || !desc->kernels)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "CUDA: the executable has no kernels");
  if (desc->n_buffers && !desc->buffer_bytes)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "CUDA: buffer_bytes is NULL");
  for (uint32_t k = 0; k < desc->n_kernels; k++) {
    const jit__cu_kernel_desc *kd = &desc->kernels[k];
    if (!kd->entry || !*kd->entry)
      return JIT_ERR(JIT_INVALID_ARGUMENT, "CUDA: kernel %u has no entry name", k);
    if (!kd->n_args || !kd->args)
      return JIT_ERR(JIT_INVALID_ARGUMENT, "CUDA: kernel %u `%s` has no arguments", k,
                     kd->entry);
    for (uint32_t i = 0; i < kd->n_args; i++)
      if (kd->args[i] >= desc->n_buffers)
        return JIT_ERR(JIT_INVALID_ARGUMENT,
                       "CUDA: kernel %u `%s` argument %u names buffer %u of %u", k,
                       kd->entry, i, kd->args[i], desc->n_buffers);
    uint64_t threads = 1;
    for (int a = 0; a < 3; a++) {
      if (kd->grid[a] > info->max_grid_dim[a])
        return JIT_ERR(JIT_UNSUPPORTED,
                       "CUDA: kernel %u `%s`: grid %c = %u is over the device's maxGridDim%c "
                       "= %u (%s)",
                       k, kd->entry, kAxis[a], kd->grid[a], kAxis[a], info->max_grid_dim[a],
                       info->name);
      if (!kd->block[a])
        return JIT_ERR(JIT_INVALID_ARGUMENT, "CUDA: kernel %u `%s`: block %c is 0", k,
                       kd->entry, kAxis[a]);
      if (kd->block[a] > info->max_block_dim[a])
        return JIT_ERR(JIT_UNSUPPORTED,
                       "CUDA: kernel %u `%s`: block %c = %u is over the device's "
                       "maxBlockDim%c = %u (%s)",
                       k, kd->entry, kAxis[a], kd->block[a], kAxis[a], info->max_block_dim[a],
                       info->name);
      threads *= kd->block[a];
    }
    if (threads > info->max_threads_per_block)
      return JIT_ERR(JIT_UNSUPPORTED,
                     "CUDA: kernel %u `%s`: a block of %llu threads is over the device's "
                     "maxThreadsPerBlock = %u",
                     k, kd->entry, (unsigned long long)threads, info->max_threads_per_block);
  }
  return NULL;
}

jit_status jit__cu_executable_create(jit__cu_device *device,
                                     const jit__cu_executable_desc *desc,
                                     jit__cu_executable **out_executable) {
  if (!out_executable) return JIT_ERR(JIT_INVALID_ARGUMENT, "CUDA: out_executable is NULL");
  *out_executable = NULL;
  if (!device || !desc)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "CUDA: executable_create: NULL device or desc");
  JIT_PROPAGATE(check_desc(device, desc));

  jit__cu_executable *e = calloc(1, sizeof *e);
  if (!e) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "CUDA: out of memory");
  e->dev = device;
  e->n_buffers = desc->n_buffers;
  e->buffer_bytes = calloc(desc->n_buffers ? desc->n_buffers : 1, sizeof *e->buffer_bytes);
  e->kernels = calloc(desc->n_kernels, sizeof *e->kernels);
  size_t total_args = 0;
  for (uint32_t k = 0; k < desc->n_kernels; k++) total_args += desc->kernels[k].n_args;
  e->args = calloc(total_args, sizeof *e->args);
  // The driver's JIT needs NUL-terminated PTX; the lowering's is not.
  char *ptx = NULL;
  if (desc->format == JIT__CU_PTX) ptx = malloc(desc->module_size + 1);
  if (!e->buffer_bytes || !e->kernels || !e->args || (desc->format == JIT__CU_PTX && !ptx)) {
    free(ptx);
    jit__cu_executable_destroy(e);
    return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "CUDA: out of memory");
  }
  if (desc->n_buffers)
    memcpy(e->buffer_bytes, desc->buffer_bytes, desc->n_buffers * sizeof *e->buffer_bytes);
  e->n_kernels = desc->n_kernels;
  uint32_t next = 0;
  jit_status s = NULL;
  for (uint32_t k = 0; k < desc->n_kernels && !s; k++) {
    const jit__cu_kernel_desc *kd = &desc->kernels[k];
    cu_kernel *ck = &e->kernels[k];
    ck->entry = strdup(kd->entry);
    if (!ck->entry) s = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "CUDA: out of memory");
    memcpy(ck->grid, kd->grid, sizeof ck->grid);
    memcpy(ck->block, kd->block, sizeof ck->block);
    ck->n_args = kd->n_args;
    ck->first_arg = next;
    memcpy(e->args + next, kd->args, kd->n_args * sizeof *e->args);
    next += kd->n_args;
    if (kd->n_args > e->max_args) e->max_args = kd->n_args;
  }
  if (s) {
    free(ptx);
    jit__cu_executable_destroy(e);
    return s;
  }
  const void *image = desc->module;
  if (ptx) {
    memcpy(ptx, desc->module, desc->module_size);
    ptx[desc->module_size] = '\0';
    image = ptx;
  }

  if ((s = push_ctx(device))) {
    free(ptx);
    jit__cu_executable_destroy(e);
    return s;
  }
  enum { kLog = 16384 };
  char *error_log = calloc(1, kLog);
  if (!error_log) {
    s = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "CUDA: out of memory");
  } else {
    CUjit_option opts[2] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    void *vals[2] = {error_log, (void *)(uintptr_t)kLog};
    double t0 = jit__now_ms();
    CUresult r = device->inst->fn.cuModuleLoadDataEx(&e->module, image, 2, opts, vals);
    if (r != CUDA_SUCCESS) {
      error_log[kLog - 1] = '\0';
      char extra[kLog + 64];
      snprintf(extra, sizeof extra, "%s module of %zu bytes for %s; JIT log: %s",
               desc->format == JIT__CU_PTX ? "PTX" : "cubin", desc->module_size,
               device->info.sm, *error_log ? error_log : "(empty)");
      int isa = desc->format == JIT__CU_PTX ? jit__cu_ptx_isa_version(ptx, desc->module_size)
                                              : 0;
      if (r == CUDA_ERROR_UNSUPPORTED_PTX_VERSION && isa) {
        // Say which two versions disagree instead of the bare CUresult.
        const jit__cu_device_info *di = &device->info;
        s = JIT_ERR(JIT_UNSUPPORTED,
                    "CUDA: the module is PTX ISA %d.%d, newer than the driver of %s accepts: "
                    "driver version %d (CUDA %d.%d) takes PTX ISA up to %d.%d; update the "
                    "driver, or compile for PTX ISA %d.%d or older (cuModuleLoadDataEx: "
                    "CUDA_ERROR_UNSUPPORTED_PTX_VERSION; JIT log: %s)",
                    isa / 10, isa % 10, di->name, di->driver_version,
                    di->driver_version / 1000, di->driver_version % 1000 / 10,
                    di->ptx_max / 10, di->ptx_max % 10, di->ptx_max / 10, di->ptx_max % 10,
                    *error_log ? error_log : "(empty)");
      } else {
        s = cu_result(device->inst, device, r, "cuModuleLoadDataEx", extra, __FILE__,
                      __LINE__);
      }
      e->module = NULL;
    }
    for (uint32_t k = 0; k < e->n_kernels && !s; k++) {
      s = CU_DCALL(device, cuModuleGetFunction, &e->kernels[k].fn, e->module,
                   e->kernels[k].entry);
      if (s)
        s = jit__status_annotate(s, "CUDA: kernel %u: `%s` is not in the module", k,
                                 e->kernels[k].entry);
    }
    e->create_ms = jit__now_ms() - t0;
  }
  free(error_log);
  free(ptx);
  pop_ctx(device);
  if (s) {
    jit__cu_executable_destroy(e);
    return s;
  }
  *out_executable = e;
  return NULL;
}

//===--- Runs -------------------------------------------------------------===//

jit_status jit__cu_run(jit__cu_executable *executable, jit__cu_buffer *const *buffers,
                       uint32_t n_buffers, const jit__cu_run_options *options) {
  jit__cu_executable *e = executable;
  if (!e) return JIT_ERR(JIT_INVALID_ARGUMENT, "CUDA: run: NULL executable");
  jit__cu_device *d = e->dev;
  if (n_buffers != e->n_buffers || (n_buffers && !buffers))
    return JIT_ERR(JIT_INVALID_ARGUMENT, "CUDA: run: %u buffers given, the executable has %u",
                   n_buffers, e->n_buffers);
  for (uint32_t b = 0; b < n_buffers; b++) {
    if (!buffers[b]) return JIT_ERR(JIT_INVALID_ARGUMENT, "CUDA: run: buffer %u is NULL", b);
    // Two jit__cu_device objects of one ordinal share the primary context.
    if (buffers[b]->dev->ctx != d->ctx)
      return JIT_ERR(JIT_INVALID_ARGUMENT,
                     "CUDA: run: buffer %u is on device %u, the executable on device %u", b,
                     buffers[b]->dev->info.index, d->info.index);
    if (buffers[b]->size < e->buffer_bytes[b])
      return JIT_ERR(JIT_INVALID_ARGUMENT,
                     "CUDA: run: buffer %u has %llu bytes, the executable needs %llu", b,
                     (unsigned long long)buffers[b]->size,
                     (unsigned long long)e->buffer_bytes[b]);
  }
  CUstream stream = options ? options->stream : NULL;
  uint64_t timeout = options && options->timeout_ns ? options->timeout_ns : d->timeout_ns;
  const uint32_t(*grids)[3] = options ? options->grids : NULL;
  for (uint32_t k = 0; grids && k < e->n_kernels; k++)
    for (int a = 0; a < 3; a++)
      if (grids[k][a] > d->info.max_grid_dim[a])
        return JIT_ERR(JIT_UNSUPPORTED, "CUDA: run: kernel %u grid[%d] = %u is over the "
                       "device's limit %u", k, a, grids[k][a], d->info.max_grid_dim[a]);

  // params[i] points at the device address of argument i (cuLaunchKernel copies the
  // values at launch, so one array serves every kernel).
  enum { kStackArgs = 32 };
  CUdeviceptr vals_stack[kStackArgs];
  void *params_stack[kStackArgs];
  CUdeviceptr *vals = vals_stack;
  void **params = params_stack;
  if (e->max_args > kStackArgs) {
    vals = malloc(e->max_args * sizeof *vals);
    params = malloc(e->max_args * sizeof *params);
    if (!vals || !params) {
      free(vals);
      free(params);
      return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "CUDA: out of memory");
    }
  }
  jit_status s = push_ctx(d);
  bool pushed = !s;
  for (uint32_t k = 0; k < e->n_kernels && !s; k++) {
    const cu_kernel *ck = &e->kernels[k];
    const uint32_t *grid = grids ? grids[k] : ck->grid;
    if (!grid[0] || !grid[1] || !grid[2]) continue;  // nothing to do
    for (uint32_t i = 0; i < ck->n_args; i++) {
      vals[i] = buffers[e->args[ck->first_arg + i]]->ptr;
      params[i] = &vals[i];
    }
    s = CU_DCALL(d, cuLaunchKernel, ck->fn, grid[0], grid[1], grid[2],
                 ck->block[0], ck->block[1], ck->block[2], 0, stream, params, NULL);
    if (s)
      s = jit__status_annotate(s, "CUDA: launching kernel %u `%s` (grid %u,%u,%u block "
                               "%u,%u,%u) on device %u (%s)",
                               k, ck->entry, grid[0], grid[1], grid[2],
                               ck->block[0], ck->block[1], ck->block[2], d->info.index,
                               d->info.name);
  }
  if (!s && !(options && options->no_wait))
    s = wait_stream(d, stream, timeout, "the kernels of a run");
  if (pushed) pop_ctx(d);
  if (vals != vals_stack) free(vals);
  if (params != params_stack) free(params);
  return s;
}

#endif  // JITML_HAVE_CUDA_H
