//===--- cuda_mock.c - a fake libcuda for testing devices/cuda without a GPU ===//
//
// Built as a shared library that test_cuda points the CUDA backend at (instance option
// `library`), so the backend's whole host side (symbol loading, enumeration, context
// push/pop, allocation, transfers, module loading with the JIT log, launches with their
// parameter arrays, bounded waits, sticky errors, pointer checks) runs on a machine
// without a driver, under ASan/UBSan. Device memory is host memory; the only kernels
// that "run" are:
//   mock_add(a, b, c)  c[i] = a[i] + b[i] (f32) for i < gridDim.x * blockDim.x
//   mock_fault(...)    the stream then reports CUDA_ERROR_ILLEGAL_ADDRESS (sticky)
//   mock_slow(...)     the stream stays busy for 300 ms (CUDA_ERROR_NOT_READY)
// Any other entry launches as a no-op. Every launch is logged for the test to inspect
// (jit_mock_cuda_launch). PTX containing `mock_invalid_ptx` fails to load with a JIT
// log; an image that starts with "\x7f" "ELF" is refused as a cubin for another GPU.
// Environment: JITML_MOCK_CUDA_DEVICES (default 2), JITML_MOCK_CUDA_INIT (a CUresult
// for cuInit to return). Built with -DMOCK_OMIT_LAUNCH it lacks cuLaunchKernel.
// Not a model of the driver beyond what the backend relies on.
//
//===----------------------------------------------------------------------===//
#define _GNU_SOURCE 1
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))
#undef cuDeviceGetUuid

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int initialized, n_devices;
static int ctx_refs[8];
static _Thread_local int ctx_stack[16], ctx_depth;

typedef struct alloc {
  char *p;
  size_t size;
  int dev;
  struct alloc *next;
} alloc;
static alloc *allocs;

typedef struct fn {
  char name[64];
  int n_params;
} fn;
typedef struct module {
  int n;
  fn fns[16];
} module;

typedef struct launch {
  char name[64];
  unsigned grid[3], block[3];
  CUstream stream;
  int n_args;
  unsigned long long args[8];
} launch;
static launch launches[64];
static int n_launches;
static CUresult pending;  // sticky error the stream reports
static double busy_until;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int cur_dev(void) { return ctx_depth ? ctx_stack[ctx_depth - 1] : -1; }

static alloc *find(CUdeviceptr p) {
  for (alloc *a = allocs; a; a = a->next)
    if (p >= (uintptr_t)a->p && p < (uintptr_t)a->p + a->size) return a;
  return NULL;
}

#define NEED_INIT \
  if (!initialized) return CUDA_ERROR_NOT_INITIALIZED
#define NEED_CTX                                     \
  NEED_INIT;                                         \
  if (cur_dev() < 0) return CUDA_ERROR_INVALID_CONTEXT; \
  if (pending) return pending

EXPORT CUresult cuGetErrorName(CUresult e, const char **s) {
  switch (e) {
    case CUDA_ERROR_OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; return CUDA_SUCCESS;
    case CUDA_ERROR_ILLEGAL_ADDRESS: *s = "CUDA_ERROR_ILLEGAL_ADDRESS"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_PTX: *s = "CUDA_ERROR_INVALID_PTX"; return CUDA_SUCCESS;
    case CUDA_ERROR_NOT_FOUND: *s = "CUDA_ERROR_NOT_FOUND"; return CUDA_SUCCESS;
    case CUDA_ERROR_NO_DEVICE: *s = "CUDA_ERROR_NO_DEVICE"; return CUDA_SUCCESS;
    case CUDA_ERROR_NO_BINARY_FOR_GPU: *s = "CUDA_ERROR_NO_BINARY_FOR_GPU"; return CUDA_SUCCESS;
    default: *s = NULL; return CUDA_ERROR_INVALID_VALUE;
  }
}
EXPORT CUresult cuGetErrorString(CUresult e, const char **s) {
  *s = "mock description";
  return CUDA_SUCCESS;
}
EXPORT CUresult cuInit(unsigned flags) {
  const char *e = getenv("JITML_MOCK_CUDA_INIT");
  if (e && atoi(e)) return (CUresult)atoi(e);
  const char *n = getenv("JITML_MOCK_CUDA_DEVICES");
  pthread_mutex_lock(&mu);
  n_devices = n ? atoi(n) : 2;
  if (n_devices > 8) n_devices = 8;
  initialized = 1;
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuDriverGetVersion(int *v) {
  *v = 12040;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetCount(int *c) {
  NEED_INIT;
  *c = n_devices;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGet(CUdevice *d, int o) {
  NEED_INIT;
  if (o < 0 || o >= n_devices) return CUDA_ERROR_INVALID_DEVICE;
  *d = o;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
  snprintf(name, (size_t)len, "Mock GPU %d", (int)d);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d) {
  memset(u->bytes, 0x40 + d, sizeof u->bytes);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d) {
  switch (a) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = 0; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = 132; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: *v = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y:
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: *v = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X:
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: *v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: *v = 64; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = 1024; break;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceTotalMem_v2(size_t *b, CUdevice d) {
  *b = (size_t)80 << 30;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
  NEED_INIT;
  pthread_mutex_lock(&mu);
  ctx_refs[d]++;
  pthread_mutex_unlock(&mu);
  *c = (CUcontext)(uintptr_t)(0x1000 + d);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
  pthread_mutex_lock(&mu);
  ctx_refs[d]--;
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxPushCurrent_v2(CUcontext c) {
  if (ctx_depth == 16) return CUDA_ERROR_INVALID_VALUE;
  ctx_stack[ctx_depth++] = (int)((uintptr_t)c - 0x1000);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *c) {
  if (!ctx_depth) return CUDA_ERROR_INVALID_CONTEXT;
  *c = (CUcontext)(uintptr_t)(0x1000 + ctx_stack[--ctx_depth]);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
  NEED_CTX;
  if (!n) return CUDA_ERROR_INVALID_VALUE;
  if (n > ((size_t)1 << 32)) return CUDA_ERROR_OUT_OF_MEMORY;
  alloc *a = calloc(1, sizeof *a);
  a->p = malloc(n);
  a->size = n;
  a->dev = cur_dev();
  pthread_mutex_lock(&mu);
  a->next = allocs;
  allocs = a;
  pthread_mutex_unlock(&mu);
  *p = (uintptr_t)a->p;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemFree_v2(CUdeviceptr p) {
  NEED_INIT;  // works after a sticky error too, so tests can clean up
  pthread_mutex_lock(&mu);
  for (alloc **pa = &allocs; *pa; pa = &(*pa)->next) {
    if ((uintptr_t)(*pa)->p == p) {
      alloc *a = *pa;
      *pa = a->next;
      pthread_mutex_unlock(&mu);
      free(a->p);
      free(a);
      return CUDA_SUCCESS;
    }
  }
  pthread_mutex_unlock(&mu);
  return CUDA_ERROR_INVALID_VALUE;
}
static CUresult check(CUdeviceptr p, size_t n) {
  alloc *a = find(p);
  if (!a || p + n > (uintptr_t)a->p + a->size) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n) {
  NEED_CTX;
  if (check(d, n)) return CUDA_ERROR_INVALID_VALUE;
  memcpy((void *)(uintptr_t)d, s, n);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n) {
  NEED_CTX;
  if (check(s, n)) return CUDA_ERROR_INVALID_VALUE;
  memcpy(d, (void *)(uintptr_t)s, n);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n) {
  NEED_CTX;
  if (check(d, n) || check(s, n)) return CUDA_ERROR_INVALID_VALUE;
  memmove((void *)(uintptr_t)d, (void *)(uintptr_t)s, n);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) {
  NEED_CTX;
  if (check(d, n)) return CUDA_ERROR_INVALID_VALUE;
  memset((void *)(uintptr_t)d, v, n);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attr, CUdeviceptr p) {
  NEED_INIT;
  alloc *a = find(p);
  if (!a) return CUDA_ERROR_INVALID_VALUE;
  if (attr == CU_POINTER_ATTRIBUTE_MEMORY_TYPE) {
    *(unsigned *)data = CU_MEMORYTYPE_DEVICE;
  } else if (attr == CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL) {
    *(int *)data = a->dev;
  } else {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}
EXPORT CUresult cuModuleLoadDataEx(CUmodule *m, const void *image, unsigned n_opts,
                                   CUjit_option *opts, void **vals) {
  NEED_CTX;
  const char *text = image;
  if (!memcmp(text, "\x7f" "ELF", 4)) return CUDA_ERROR_NO_BINARY_FOR_GPU;
  char *log = NULL;
  size_t log_size = 0;
  for (unsigned i = 0; i < n_opts; i++) {
    if (opts[i] == CU_JIT_ERROR_LOG_BUFFER) log = vals[i];
    if (opts[i] == CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES) log_size = (uintptr_t)vals[i];
  }
  if (strstr(text, "mock_invalid_ptx")) {
    if (log && log_size) snprintf(log, log_size, "ptxas application ptx input, line 3; error "
                                  ": mock syntax error near `mock_invalid_ptx`");
    return CUDA_ERROR_INVALID_PTX;
  }
  module *mod = calloc(1, sizeof *mod);
  // `.entry name(` ... `)`: count .param in the list. Reads up to the NUL the backend
  // must have appended (ASan catches a missing one).
  for (const char *p = strstr(text, ".entry "); p && mod->n < 16; p = strstr(p, ".entry ")) {
    p += 7;
    fn *f = &mod->fns[mod->n++];
    size_t len = strcspn(p, "( \n");
    snprintf(f->name, sizeof f->name, "%.*s", (int)len, p);
    const char *close = strchr(p, ')');
    for (const char *q = strstr(p, ".param"); q && close && q < close; q = strstr(q + 1, ".param"))
      f->n_params++;
  }
  *m = (CUmodule)mod;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuModuleUnload(CUmodule m) {
  free(m);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
  NEED_CTX;
  module *mod = (module *)m;
  for (int i = 0; i < mod->n; i++)
    if (!strcmp(mod->fns[i].name, name)) {
      *f = (CUfunction)&mod->fns[i];
      return CUDA_SUCCESS;
    }
  return CUDA_ERROR_NOT_FOUND;
}
#ifndef MOCK_OMIT_LAUNCH
EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                               unsigned by, unsigned bz, unsigned shmem, CUstream stream,
                               void **params, void **extra) {
  NEED_CTX;
  fn *k = (fn *)f;
  if ((unsigned long long)bx * by * bz > 1024 || gy > 65535 || gz > 65535 || !params)
    return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&mu);
  if (n_launches < 64) {
    launch *l = &launches[n_launches++];
    snprintf(l->name, sizeof l->name, "%s", k->name);
    l->grid[0] = gx, l->grid[1] = gy, l->grid[2] = gz;
    l->block[0] = bx, l->block[1] = by, l->block[2] = bz;
    l->stream = stream;
    l->n_args = k->n_params;
    for (int i = 0; i < k->n_params && i < 8; i++) l->args[i] = *(CUdeviceptr *)params[i];
  }
  pthread_mutex_unlock(&mu);
  if (!strcmp(k->name, "mock_add")) {
    float *a = (float *)(uintptr_t)*(CUdeviceptr *)params[0];
    float *b = (float *)(uintptr_t)*(CUdeviceptr *)params[1];
    float *c = (float *)(uintptr_t)*(CUdeviceptr *)params[2];
    for (unsigned long long i = 0; i < (unsigned long long)gx * bx; i++) c[i] = a[i] + b[i];
  } else if (!strcmp(k->name, "mock_fault")) {
    pending = CUDA_ERROR_ILLEGAL_ADDRESS;
  } else if (!strcmp(k->name, "mock_slow")) {
    busy_until = now() + 0.3;
  }
  return CUDA_SUCCESS;
}
#endif
EXPORT CUresult cuStreamQuery(CUstream s) {
  NEED_INIT;
  if (pending) return pending;
  return now() < busy_until ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}

//===--- For the test ------------------------------------------------------===//

EXPORT int jit_mock_cuda_launch_count(void) { return n_launches; }
EXPORT int jit_mock_cuda_ctx_refs(int dev) { return ctx_refs[dev]; }
EXPORT int jit_mock_cuda_live_allocs(void) {
  int n = 0;
  for (alloc *a = allocs; a; a = a->next) n++;
  return n;
}
// Launch `i`: its entry, grid, block, stream and the first 8 argument values.
EXPORT int jit_mock_cuda_launch(int i, char *name, size_t name_size, unsigned grid[3],
                                unsigned block[3], void **stream, unsigned long long args[8]) {
  if (i < 0 || i >= n_launches) return -1;
  const launch *l = &launches[i];
  snprintf(name, name_size, "%s", l->name);
  memcpy(grid, l->grid, sizeof l->grid);
  memcpy(block, l->block, sizeof l->block);
  *stream = l->stream;
  memcpy(args, l->args, sizeof l->args);
  return l->n_args;
}
