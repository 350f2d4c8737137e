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
// log; PTX whose `.version` is newer than the mock driver's PTX ISA (12.x: 8.x) fails
// with CUDA_ERROR_UNSUPPORTED_PTX_VERSION. An ELF image loads only if it is a cubin for
// the mock's sm_90 (e_machine EM_CUDA, the SM in e_flags): its kernels are the
// `.text.<name>` sections, their parameter counts from `.nv.info.<name>`
// (EIATTR_KPARAM_INFO records); any other ELF is refused as a cubin for another GPU
// (CUDA_ERROR_NO_BINARY_FOR_GPU). Every module load is logged (jit_mock_cuda_loads).
// Environment: JITML_MOCK_CUDA_DEVICES (default 2), JITML_MOCK_CUDA_INIT (a CUresult
// for cuInit to return), JITML_MOCK_CUDA_DRIVER (cuDriverGetVersion, default 12040),
// JITML_MOCK_CUDA_CUBIN=reject (refuse every cubin, as a driver that cannot load it).
// Built with -DMOCK_OMIT_LAUNCH it lacks cuLaunchKernel.
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
static char loads[512];   // "ptx:ok cubin:refused ..." one word per cuModuleLoadDataEx
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
    case CUDA_ERROR_INVALID_IMAGE: *s = "CUDA_ERROR_INVALID_IMAGE"; return CUDA_SUCCESS;
    case CUDA_ERROR_UNSUPPORTED_PTX_VERSION:
      *s = "CUDA_ERROR_UNSUPPORTED_PTX_VERSION";
      return CUDA_SUCCESS;
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
static int driver_version(void) {
  const char *e = getenv("JITML_MOCK_CUDA_DRIVER");
  return e && atoi(e) ? atoi(e) : 12040;
}
EXPORT CUresult cuDriverGetVersion(int *v) {
  *v = driver_version();
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
static void log_load(const char *what, CUresult r) {
  pthread_mutex_lock(&mu);
  size_t n = strlen(loads);
  snprintf(loads + n, sizeof loads - n, "%s%s:%s", n ? " " : "", what,
           r == CUDA_SUCCESS ? "ok" : "refused");
  pthread_mutex_unlock(&mu);
}

// A cubin for sm_90: ELF64, EM_CUDA (190), the SM in e_flags (bits 8-15 from ELF ABI
// version 8 on, as ptxas 13 writes; bits 0-7 before). Kernels from the section names.
static module *load_cubin(const unsigned char *b) {
  // The driver gets no size either: the class byte decides whether a 64-byte ELF64
  // header follows (the backend's tests pass short "\x7f" "ELF...." images).
  if (b[4] != 2) return NULL;
  uint16_t machine, shentsize, shnum, shstrndx;
  uint32_t flags;
  uint64_t shoff;
  memcpy(&machine, b + 18, 2);
  memcpy(&flags, b + 48, 4);
  memcpy(&shoff, b + 40, 8);
  memcpy(&shentsize, b + 58, 2);
  memcpy(&shnum, b + 60, 2);
  memcpy(&shstrndx, b + 62, 2);
  int sm = b[8] >= 8 ? (int)(flags >> 8 & 0xff) : (int)(flags & 0xff);
  if (machine != 190 || sm != 90 || shentsize != 64 || shstrndx >= shnum)
    return NULL;
  const unsigned char *sh = b + shoff;
  uint64_t str_off;
  memcpy(&str_off, sh + shstrndx * 64 + 24, 8);
  module *mod = calloc(1, sizeof *mod);
  for (int pass = 0; pass < 2; pass++) {
    for (unsigned i = 0; i < shnum; i++) {
      uint32_t name;
      uint64_t off, size;
      memcpy(&name, sh + i * 64, 4);
      memcpy(&off, sh + i * 64 + 24, 8);
      memcpy(&size, sh + i * 64 + 32, 8);
      const char *n = (const char *)b + str_off + name;
      if (pass == 0 && !strncmp(n, ".text.", 6) && mod->n < 16) {
        snprintf(mod->fns[mod->n++].name, sizeof mod->fns[0].name, "%s", n + 6);
      } else if (pass == 1 && !strncmp(n, ".nv.info.", 9)) {
        for (int k = 0; k < mod->n; k++) {
          if (strcmp(mod->fns[k].name, n + 9)) continue;
          // Records: format (4 = 16-bit size + payload, else 2 bytes of value), attribute.
          for (uint64_t p = off; p + 4 <= off + size;) {
            uint16_t len = 0;
            if (b[p] == 4) memcpy(&len, b + p + 2, 2);
            if (b[p] == 4 && b[p + 1] == 0x17) mod->fns[k].n_params++;
            p += 4 + (b[p] == 4 ? len : 0);
          }
        }
      }
    }
  }
  return mod;
}

static int ptx_version(const char *text) {
  const char *v = strstr(text, ".version ");
  int major = 0, minor = 0;
  if (v && sscanf(v, ".version %d.%d", &major, &minor) == 2) return major * 10 + minor;
  return 0;
}

EXPORT CUresult cuModuleLoadDataEx(CUmodule *m, const void *image, unsigned n_opts,
                                   CUjit_option *opts, void **vals) {
  NEED_CTX;
  const char *text = image;
  if (!memcmp(text, "\x7f" "ELF", 4)) {
    const char *e = getenv("JITML_MOCK_CUDA_CUBIN");
    module *mod = NULL;
    if (!(e && !strcmp(e, "reject"))) mod = load_cubin(image);
    log_load("cubin", mod ? CUDA_SUCCESS : CUDA_ERROR_NO_BINARY_FOR_GPU);
    if (!mod) return CUDA_ERROR_NO_BINARY_FOR_GPU;
    *m = (CUmodule)mod;
    return CUDA_SUCCESS;
  }
  char *log = NULL;
  size_t log_size = 0;
  for (unsigned i = 0; i < n_opts; i++) {
    if (opts[i] == CU_JIT_ERROR_LOG_BUFFER) log = vals[i];
    if (opts[i] == CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES) log_size = (uintptr_t)vals[i];
  }
  int drv = driver_version(), ptx_max = drv >= 12000 ? 80 + drv % 1000 / 10 : 78;
  if (ptx_version(text) > ptx_max) {
    if (log && log_size) snprintf(log, log_size, "ptxas application ptx input, line 1; "
                                  "fatal   : Unsupported .version %d.%d; current version "
                                  "is '%d.%d'", ptx_version(text) / 10,
                                  ptx_version(text) % 10, ptx_max / 10, ptx_max % 10);
    log_load("ptx", CUDA_ERROR_UNSUPPORTED_PTX_VERSION);
    return CUDA_ERROR_UNSUPPORTED_PTX_VERSION;
  }
  if (strstr(text, "mock_invalid_ptx")) {
    log_load("ptx", CUDA_ERROR_INVALID_PTX);
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
  log_load("ptx", CUDA_SUCCESS);
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
// The module loads so far, oldest first: "cubin:ok", "cubin:refused ptx:ok", ...
EXPORT void jit_mock_cuda_loads(char *out, size_t size) {
  pthread_mutex_lock(&mu);
  snprintf(out, size, "%s", loads);
  pthread_mutex_unlock(&mu);
}
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
