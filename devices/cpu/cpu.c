//===--- cpu.c - the CPU device over LLVM ORC LLJIT ------------------------===//
#include "devices/cpu/cpu.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <llvm-c/Core.h>
#include <llvm-c/Error.h>
#include <llvm-c/LLJIT.h>
#include <llvm-c/Orc.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>

#include "base/status.h"

struct jit__cpu_device {
  // ORC is internally thread-safe, but adding an object and looking it up are two
  // steps that must see each other; loads are rare (once per kernel), so one lock.
  pthread_mutex_t mu;
  LLVMOrcLLJITRef jit;
  unsigned long n_loaded;
};

//===--- Process-wide LLVM set-up ----------------------------------------===//

static pthread_once_t jit__llvm_once = PTHREAD_ONCE_INIT;
static jit__cpu_target jit__host;

// Whether comma-separated `list` holds the item `sign` + name[0..len).
static bool jit__has_item(const char *list, char sign, const char *name, size_t len) {
  for (const char *p = list; *p;) {
    const char *end = strchr(p, ',');
    size_t n = end ? (size_t)(end - p) : strlen(p);
    if (n == len + 1 && p[0] == sign && memcmp(p + 1, name, len) == 0) return true;
    p += n + (end ? 1 : 0);
  }
  return false;
}

// The host's features without those $JITML_CPU_FEATURES turns off: each "-name" in
// that comma-separated list drops "+name" and is appended, so LLVM also drops what
// implies it (-avx512f: every AVX-512 extension). Only removals of features the host
// has: other items ("+name", or a feature it lacks or LLVM does not know) go to
// *ignored (malloc'ed, or NULL), which each jit_context_create logs as a warning,
// since code for a feature the machine lacks could not run. Kernels then use a subset
// of the machine's instructions (the test suite runs the AVX2 paths on AVX-512
// machines this way); the features are part of every kernel's cache key.
// Returns `host` itself when there is nothing to remove or no memory; else a new
// string, and `host` (LLVM's) is disposed of.
static char *jit__features_without(char *host, const char *off, char **ignored) {
  *ignored = NULL;
  if (!off || !*off) return host;
  size_t cap = strlen(host) + strlen(off) + 2;
  char *out = malloc(cap), *skip = malloc(strlen(off) + 1);
  if (!out || !skip) {
    free(out);
    free(skip);
    return host;
  }
  size_t n = 0, ns = 0;
  out[0] = skip[0] = 0;
  for (const char *p = host; *p;) {  // the host's items the list does not drop
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    if (len && !(p[0] == '+' && jit__has_item(off, '-', p + 1, len - 1)))
      n += (size_t)snprintf(out + n, cap - n, "%s%.*s", n ? "," : "", (int)len, p);
    p += len + (end ? 1 : 0);
  }
  for (const char *q = off; *q;) {  // then the drops, or why not
    const char *end = strchr(q, ',');
    size_t len = end ? (size_t)(end - q) : strlen(q);
    bool drops = len > 1 && q[0] == '-' && jit__has_item(host, '+', q + 1, len - 1);
    if (drops) n += (size_t)snprintf(out + n, cap - n, ",%.*s", (int)len, q);
    else if (len) ns += (size_t)snprintf(skip + ns, strlen(off) + 1 - ns, "%s%.*s",
                                         ns ? "," : "", (int)len, q);
    q += len + (end ? 1 : 0);
  }
  if (ns) *ignored = skip;
  else free(skip);
  LLVMDisposeMessage(host);
  return out;
}

// $JITML_CPU_L2: the L2 per core the CPU plans assume, in place of the one the C
// library reads (which is 0 on some hosts and VMs, and only one machine's answer):
// bytes, or a whole number with a K or M suffix (KiB, MiB), from 16K to 1024M. It is
// part of every kernel's key, as the detected size is. Plans depend on it (cache
// blocks, thread splits), so the test suite pins it and runs again with other sizes,
// and a benchmark can ask what a host with another L2 would get. $JITML_CPU_L3 is the
// same for the L3 (which decides where stores stream, plan_row_choice.c). Returns the
// bytes, or 0 for text that is not such a size.
static long jit__parse_cache_size(const char *text) {
  char *end = NULL;
  errno = 0;
  long long v = strtoll(text, &end, 10);
  if (errno || end == text || v <= 0) return 0;
  long long unit = 1;
  if (*end == 'K' || *end == 'k') unit = 1 << 10, end++;
  else if (*end == 'M' || *end == 'm') unit = 1 << 20, end++;
  if (*end == 'i' && unit > 1 && end[1] == 'B') end += 2;  // "512KiB", "2MiB"
  if (*end || v > (1LL << 30) / unit) return 0;
  v *= unit;
  return v >= (16 << 10) ? (long)v : 0;
}

// *bytes (as sysconf read it; below 0 when unknown, then 0) or, where $name is set,
// the size it gives; text that is no size is kept in *ignored (for the process, like
// the rest of the target) and the detected size stays.
static void cache_size_from_env(const char *name, long *bytes, const char **ignored) {
  if (*bytes < 0) *bytes = 0;
  const char *env = getenv(name);
  if (!env || !*env) return;
  long given = jit__parse_cache_size(env);
  if (given > 0) *bytes = given;
  else *ignored = strdup(env);
}

static void jit__llvm_init(void) {
  LLVMInitializeNativeTarget();
  LLVMInitializeNativeAsmPrinter();
  // These strings live for the process: they describe the machine it runs on.
  jit__host.triple = LLVMGetDefaultTargetTriple();
  jit__host.cpu = LLVMGetHostCPUName();
  char *ignored = NULL;
  jit__host.features = jit__features_without(LLVMGetHostCPUFeatures(),
                                             getenv("JITML_CPU_FEATURES"), &ignored);
  jit__host.features_ignored = ignored;
#ifdef _SC_LEVEL2_CACHE_SIZE
  jit__host.l2_bytes = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
#ifdef _SC_LEVEL3_CACHE_SIZE
  jit__host.l3_bytes = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
  cache_size_from_env("JITML_CPU_L2", &jit__host.l2_bytes, &jit__host.l2_ignored);
  cache_size_from_env("JITML_CPU_L3", &jit__host.l3_bytes, &jit__host.l3_ignored);
}

void jit__llvm_init_once(void) { pthread_once(&jit__llvm_once, jit__llvm_init); }

const jit__cpu_target *jit__cpu_host_target(void) {
  jit__llvm_init_once();
  return &jit__host;
}

//===--- OpenMP runtime ----------------------------------------------------===//

// Multi-threaded kernels are OpenMP code (lowering/cpu/ says why): they call
// __kmpc_* in LLVM's libomp, which is loaded on first use, RTLD_GLOBAL so that the
// process symbol generator below resolves those calls. Candidates: Debian's
// libomp-22-dev location, then the loader's search path.
static const char *const jit__omp_paths[] = {"/usr/lib/llvm-22/lib/libomp.so.5",
                                             "/usr/lib/llvm-22/lib/libomp.so",
                                             "/usr/lib/x86_64-linux-gnu/libomp.so.5"};
static pthread_once_t jit__omp_once = PTHREAD_ONCE_INIT;
static void *jit__omp_lib;

static void jit__omp_load(void) {
  for (size_t i = 0; i < sizeof jit__omp_paths / sizeof *jit__omp_paths && !jit__omp_lib; i++)
    jit__omp_lib = dlopen(jit__omp_paths[i], RTLD_NOW | RTLD_GLOBAL);
  if (!jit__omp_lib) jit__omp_lib = dlopen("libomp.so.5", RTLD_NOW | RTLD_GLOBAL);
}

int jit__cpu_threads(int requested) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // libomp is not sanitizer-clean: LeakSanitizer's exit-time thread suspension crashes
  // on its idle workers, and omp_pause_resource_all leaks its own allocations; it is
  // not instrumented for ThreadSanitizer either. In ASan and TSan builds kernels are
  // single-threaded (the release test suite covers threads).
  (void)requested;
  return 1;
#else
  long n = requested > 0 ? requested : sysconf(_SC_NPROCESSORS_ONLN);
  if (n <= 1) return 1;
  if (n > 256) n = 256;
  // Whether a runtime is there, without loading it (a process that never runs a
  // threaded kernel never maps it).
  for (size_t i = 0; i < sizeof jit__omp_paths / sizeof *jit__omp_paths; i++)
    if (access(jit__omp_paths[i], R_OK) == 0) return (int)n;
  return 1;
#endif
}

// Converts an LLVMErrorRef (consuming it) into a status.
// What ORC's execution session reported last on this thread (a symbol a kernel needs
// and nothing defines, say): its default reporter prints to stderr, and the library
// never prints, so the reporter keeps it here for the status of the lookup that fails.
static _Thread_local char jit__orc_reported[512];

static void jit__orc_report(void *ctx, LLVMErrorRef err) {
  (void)ctx;
  char *msg = LLVMGetErrorMessage(err);
  snprintf(jit__orc_reported, sizeof jit__orc_reported, "%s", msg);
  LLVMDisposeErrorMessage(msg);
}

static jit_status jit__from_llvm_error(LLVMErrorRef err, const char *what) {
  char *msg = LLVMGetErrorMessage(err);
  bool more = jit__orc_reported[0] != 0;
  jit_status s = JIT_ERR(JIT_DEVICE_ERROR, "cpu: %s: %s%s%s%s", what, msg, more ? " (" : "",
                         jit__orc_reported, more ? ")" : "");
  jit__orc_reported[0] = 0;
  LLVMDisposeErrorMessage(msg);
  return s;
}

//===--- Runtime helpers kernels may call ----------------------------------===//

// memref.copy between strided buffers lowers to a call of `memrefCopy` (MLIR's
// CRunnerUtils, not a Debian library). Bufferization keeps such copies when it cannot
// prove a hoisted tile may be updated in place (the tiled matmuls with peeled
// remainders do this), so the device defines the symbol itself. Arguments are
// unranked descriptors: {rank, ranked descriptor *}, the ranked one being
// {allocated, aligned, offset, sizes[rank], strides[rank]}.
typedef struct jit__unranked {
  int64_t rank;
  void *desc;
} jit__unranked;

static void jit__memref_copy(int64_t elem, const jit__unranked *src, const jit__unranked *dst) {
  int64_t rank = src->rank;
  const int64_t *s = src->desc, *d = dst->desc;
  const char *sp = (const char *)(intptr_t)s[1] + s[2] * elem;
  char *dp = (char *)(intptr_t)d[1] + d[2] * elem;
  const int64_t *sizes = s + 3, *ss = s + 3 + rank, *ds = d + 3 + rank;
  if (rank == 0) {
    memcpy(dp, sp, (size_t)elem);
    return;
  }
  for (int64_t r = 0; r < rank; r++)
    if (sizes[r] == 0) return;
  int64_t idx[16] = {0};
  if (rank > 16) return;  // kernels never have more than JIT_MAX_RANK (8) dims
  for (;;) {
    int64_t so = 0, dof = 0;
    for (int64_t r = 0; r < rank - 1; r++) {
      so += idx[r] * ss[r];
      dof += idx[r] * ds[r];
    }
    int64_t n = sizes[rank - 1];
    if (ss[rank - 1] == 1 && ds[rank - 1] == 1) {
      memcpy(dp + dof * elem, sp + so * elem, (size_t)(n * elem));
    } else {
      for (int64_t i = 0; i < n; i++)
        memcpy(dp + (dof + i * ds[rank - 1]) * elem, sp + (so + i * ss[rank - 1]) * elem,
               (size_t)elem);
    }
    int64_t r = rank - 2;
    for (; r >= 0; r--) {
      if (++idx[r] < sizes[r]) break;
      idx[r] = 0;
    }
    if (r < 0) return;
  }
}

//===--- Intermediate buffers --------------------------------------------===//
//
// A kernel's intermediates (memref.alloc after bufferization) are malloc'ed and freed
// inside each call. Large ones come from mmap, so every call paid for first touching
// fresh pages (~12 us a 4 KiB page on these VMs): a transformer block with 17 rows and
// its weights given transposed (transposed copies of 2-9 MiB each) spent most of its
// 18 ms in page faults. The kernels' malloc and free are these instead: blocks of 64
// KiB or more, once freed, stay with the thread that freed them (up to 32 blocks and
// 256 MiB; the least recently freed goes first) and serve its next requests of up to
// their size, so the same kernel called again reuses the same memory. Smaller blocks
// go straight to malloc, whose bins already reuse them. A thread's blocks are freed
// when it exits. 32, not 8: a transformer block (S = 128) has 15 such intermediates,
// and with 8 kept, 4 of 16 runs of it paid 176-224 page faults (~2 ms) on every call
// (glibc trimming the blocks given back; 0 of 38 runs with 32).

#define JIT__SCRATCH_MIN ((size_t)64 << 10)
#define JIT__SCRATCH_KEEP ((size_t)256 << 20)
#define JIT__SCRATCH_SLOTS 32

typedef struct jit__scratch {
  void *block[JIT__SCRATCH_SLOTS];  // raw blocks, most recently freed last
  size_t size[JIT__SCRATCH_SLOTS];  // their usable sizes
  int n;
  size_t bytes;
  bool keyed;  // the thread-exit destructor is registered
} jit__scratch;

static _Thread_local jit__scratch jit__t_scratch;
static pthread_key_t jit__scratch_key;
static pthread_once_t jit__scratch_once = PTHREAD_ONCE_INIT;

// Every block starts with its usable size; the kernel aligns what it gets itself
// (malloc(size + alignment), rounded up).
#define JIT__SCRATCH_HDR 16

static void jit__scratch_release(void *arg) {
  jit__scratch *c = arg;
  for (int i = 0; i < c->n; i++) free(c->block[i]);
  c->n = 0;
  c->bytes = 0;
}

static void jit__scratch_key_init(void) {
  pthread_key_create(&jit__scratch_key, jit__scratch_release);
}

static void *jit__kernel_malloc(size_t n) {
  jit__scratch *c = &jit__t_scratch;
  if (n >= JIT__SCRATCH_MIN) {
    int best = -1;
    for (int i = 0; i < c->n; i++)
      if (c->size[i] >= n && c->size[i] / 2 <= n && (best < 0 || c->size[i] < c->size[best]))
        best = i;
    if (best >= 0) {
      char *raw = c->block[best];
      c->bytes -= c->size[best];
      c->n--;
      memmove(c->block + best, c->block + best + 1, sizeof(void *) * (size_t)(c->n - best));
      memmove(c->size + best, c->size + best + 1, sizeof(size_t) * (size_t)(c->n - best));
      return raw + JIT__SCRATCH_HDR;
    }
  }
  if (n > SIZE_MAX - JIT__SCRATCH_HDR) return NULL;
  char *raw = malloc(n + JIT__SCRATCH_HDR);
  if (!raw) return NULL;
  memcpy(raw, &n, sizeof n);
  return raw + JIT__SCRATCH_HDR;
}

static void jit__kernel_free(void *p) {
  if (!p) return;
  char *raw = (char *)p - JIT__SCRATCH_HDR;
  size_t n;
  memcpy(&n, raw, sizeof n);
  jit__scratch *c = &jit__t_scratch;
  if (n < JIT__SCRATCH_MIN || n > JIT__SCRATCH_KEEP) {
    free(raw);
    return;
  }
  if (!c->keyed) {
    pthread_once(&jit__scratch_once, jit__scratch_key_init);
    pthread_setspecific(jit__scratch_key, c);
    c->keyed = true;
  }
  while (c->n > 0 && (c->n == JIT__SCRATCH_SLOTS || c->bytes + n > JIT__SCRATCH_KEEP)) {
    free(c->block[0]);  // the least recently freed
    c->bytes -= c->size[0];
    c->n--;
    memmove(c->block, c->block + 1, sizeof(void *) * (size_t)c->n);
    memmove(c->size, c->size + 1, sizeof(size_t) * (size_t)c->n);
  }
  c->block[c->n] = raw;
  c->size[c->n++] = n;
  c->bytes += n;
}

// LLVM may fold a malloc and a zeroing memset of the same size into calloc, which
// must then come from here too (its block goes to jit__kernel_free).
static void *jit__kernel_calloc(size_t count, size_t size) {
  if (size && count > SIZE_MAX / size) return NULL;
  void *p = jit__kernel_malloc(count * size);
  if (p) memset(p, 0, count * size);
  return p;
}

// bf16 conversions LLVM's x86 backend calls where the host has no AVX-512 BF16 (for
// bf16 vector loads and stores it legalizes through f32), from libgcc / compiler-rt,
// which kernels do not link. bf16 travels in the low 16 bits of an SSE register. C11
// has no type for that (_Float16 is missing from older compilers, clang 14 among them),
// but a float travels in the same register: its low 16 bits carry the bf16, the rest
// is ignored by the caller. No arithmetic touches these floats. Round to nearest
// even; NaN stays a (quiet) NaN.
static float jit__truncsfbf2(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  uint32_t h = (u & 0x7FFFFFFFu) > 0x7F800000u ? ((u >> 16) | 0x40u) & 0xFFFFu
                                                : ((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16) & 0xFFFFu;
  float r;
  memcpy(&r, &h, sizeof r);
  return r;
}

static float jit__extendbfsf2(float x) {
  uint32_t h;
  memcpy(&h, &x, sizeof h);
  uint32_t u = (h & 0xFFFFu) << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static LLVMOrcCSymbolMapPair jit__absolute(LLVMOrcLLJITRef jit, const char *name,
                                           LLVMOrcExecutorAddress addr) {
  LLVMOrcCSymbolMapPair sym;
  sym.Name = LLVMOrcLLJITMangleAndIntern(jit, name);
  sym.Sym.Address = addr;
  sym.Sym.Flags.GenericFlags =
      LLVMJITSymbolGenericFlagsExported | LLVMJITSymbolGenericFlagsCallable;
  sym.Sym.Flags.TargetFlags = 0;
  return sym;
}

static LLVMErrorRef jit__define_helpers(LLVMOrcLLJITRef jit) {
  union {
    void (*f)(int64_t, const jit__unranked *, const jit__unranked *);
    LLVMOrcExecutorAddress a;
  } copy;
  union { void *(*f)(size_t); LLVMOrcExecutorAddress a; } alloc;
  union { void *(*f)(size_t, size_t); LLVMOrcExecutorAddress a; } zalloc;
  union { void (*f)(void *); LLVMOrcExecutorAddress a; } release;
  union { float (*f)(float); LLVMOrcExecutorAddress a; } trunc_bf;
  union { float (*f)(float); LLVMOrcExecutorAddress a; } ext_bf;
  copy.a = alloc.a = zalloc.a = release.a = trunc_bf.a = ext_bf.a = 0;
  copy.f = jit__memref_copy;
  alloc.f = jit__kernel_malloc;
  zalloc.f = jit__kernel_calloc;
  release.f = jit__kernel_free;
  trunc_bf.f = jit__truncsfbf2;
  ext_bf.f = jit__extendbfsf2;
  LLVMOrcCSymbolMapPair syms[6] = {jit__absolute(jit, "memrefCopy", copy.a),
                                   jit__absolute(jit, "malloc", alloc.a),
                                   jit__absolute(jit, "calloc", zalloc.a),
                                   jit__absolute(jit, "free", release.a),
                                   jit__absolute(jit, "__truncsfbf2", trunc_bf.a),
                                   jit__absolute(jit, "__extendbfsf2", ext_bf.a)};
  LLVMOrcMaterializationUnitRef mu = LLVMOrcAbsoluteSymbols(syms, 6);
  return LLVMOrcJITDylibDefine(LLVMOrcLLJITGetMainJITDylib(jit), mu);  // takes mu
}

//===--- Device ----------------------------------------------------------===//

jit_status jit__cpu_device_create(jit__cpu_device **out_device) {
  *out_device = NULL;
  jit__llvm_init_once();
  jit__cpu_device *d = calloc(1, sizeof(*d));
  if (!d) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "cpu: out of memory");
  LLVMOrcJITTargetMachineBuilderRef jtmb = NULL;
  LLVMErrorRef err = LLVMOrcJITTargetMachineBuilderDetectHost(&jtmb);
  if (err) {
    free(d);
    return jit__from_llvm_error(err, "detecting the host");
  }
  LLVMOrcLLJITBuilderRef builder = LLVMOrcCreateLLJITBuilder();
  LLVMOrcLLJITBuilderSetJITTargetMachineBuilder(builder, jtmb);  // takes jtmb
  err = LLVMOrcCreateLLJIT(&d->jit, builder);                   // takes builder
  if (err) {
    free(d);
    return jit__from_llvm_error(err, "creating LLJIT");
  }
  LLVMOrcExecutionSessionSetErrorReporter(LLVMOrcLLJITGetExecutionSession(d->jit),
                                          jit__orc_report, NULL);
  // Kernels call malloc/free (intermediate buffers), libm and compiler-rt helpers
  // (f16 conversions): resolve them from the process.
  LLVMOrcDefinitionGeneratorRef gen = NULL;
  err = LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess(
      &gen, LLVMOrcLLJITGetGlobalPrefix(d->jit), NULL, NULL);
  if (err) {
    LLVMOrcDisposeLLJIT(d->jit);
    free(d);
    return jit__from_llvm_error(err, "creating the process symbol generator");
  }
  LLVMOrcJITDylibAddGenerator(LLVMOrcLLJITGetMainJITDylib(d->jit), gen);
  err = jit__define_helpers(d->jit);
  if (err) {
    LLVMOrcDisposeLLJIT(d->jit);
    free(d);
    return jit__from_llvm_error(err, "defining runtime helpers");
  }
  pthread_mutex_init(&d->mu, NULL);
  *out_device = d;
  return NULL;
}

void jit__cpu_device_destroy(jit__cpu_device *device) {
  if (!device) return;
  LLVMErrorRef err = LLVMOrcDisposeLLJIT(device->jit);
  if (err) LLVMConsumeError(err);
  pthread_mutex_destroy(&device->mu);
  free(device);
}

jit_status jit__cpu_load_code(jit__cpu_device *device, const void *object, size_t size,
                              const char *entry, jit__cpu_kernel_fn *out_fn,
                              bool *out_threaded, jit__cpu_code **out_code) {
  *out_fn = NULL;
  if (out_code) *out_code = NULL;
  static const char kFork[] = "__kmpc_fork_call";
  bool threaded = memmem(object, size, kFork, sizeof kFork - 1) != NULL;
  if (out_threaded) *out_threaded = threaded;
  if (threaded) {
    pthread_once(&jit__omp_once, jit__omp_load);
    if (!jit__omp_lib)
      return JIT_ERR(JIT_UNAVAILABLE, "cpu: kernel `%s` is multi-threaded but no OpenMP "
                     "runtime (libomp.so.5, Debian libomp-22-dev) could be loaded", entry);
  }
  pthread_mutex_lock(&device->mu);
  char name[96];
  snprintf(name, sizeof(name), "%s.o", entry);
  LLVMMemoryBufferRef buf =
      LLVMCreateMemoryBufferWithMemoryRangeCopy((const char *)object, size, name);
  LLVMOrcJITDylibRef jd = LLVMOrcLLJITGetMainJITDylib(device->jit);
  // Unloadable code gets a resource tracker of its own; the rest the dylib's default.
  LLVMOrcResourceTrackerRef rt = out_code ? LLVMOrcJITDylibCreateResourceTracker(jd) : NULL;
  LLVMErrorRef err = rt ? LLVMOrcLLJITAddObjectFileWithRT(device->jit, rt, buf)
                        : LLVMOrcLLJITAddObjectFile(device->jit, jd, buf);  // take buf
  jit_status status = NULL;
  if (err) {
    status = jit__from_llvm_error(err, "adding the object file");
  } else {
    LLVMOrcExecutorAddress addr = 0;
    err = LLVMOrcLLJITLookup(device->jit, &addr, entry);
    if (err) {
      status = jit__from_llvm_error(err, "looking up the entry point");
    } else if (!addr) {
      status = JIT_ERR(JIT_DEVICE_ERROR, "cpu: entry point `%s` resolved to 0", entry);
    } else {
      // Object pointer to function pointer: the only way to call JIT'ed code.
      union { LLVMOrcExecutorAddress a; jit__cpu_kernel_fn f; } u = {addr};
      *out_fn = u.f;
      device->n_loaded++;
    }
  }
  if (rt && status) {
    LLVMErrorRef e = LLVMOrcResourceTrackerRemove(rt);
    if (e) LLVMConsumeError(e);
    LLVMOrcReleaseResourceTracker(rt);
  } else if (rt) {
    *out_code = (jit__cpu_code *)rt;
  }
  pthread_mutex_unlock(&device->mu);
  return status;
}

void jit__cpu_unload(jit__cpu_device *device, jit__cpu_code *code) {
  if (!code) return;
  LLVMOrcResourceTrackerRef rt = (LLVMOrcResourceTrackerRef)code;
  pthread_mutex_lock(&device->mu);
  LLVMErrorRef e = LLVMOrcResourceTrackerRemove(rt);
  if (e) LLVMConsumeError(e);
  LLVMOrcReleaseResourceTracker(rt);
  device->n_loaded--;
  pthread_mutex_unlock(&device->mu);
}

//===--- Stack -------------------------------------------------------------===//

// The lowest address of this thread's stack; NULL until looked up, (char *)1 when the
// lookup failed. Stacks grow down on every target this library builds for.
static _Thread_local char *jit__stack_low;

size_t jit__cpu_stack_left(void) {
  if (!jit__stack_low) {
    pthread_attr_t attr;
    void *addr = NULL;
    size_t size = 0;
    jit__stack_low = (char *)1;
    if (pthread_getattr_np(pthread_self(), &attr) == 0) {
      if (pthread_attr_getstack(&attr, &addr, &size) == 0 && addr) jit__stack_low = addr;
      pthread_attr_destroy(&attr);
    }
  }
  // The frame address, not a local's: under ASan a local may live on a fake stack.
  char *here = __builtin_frame_address(0);
  if (jit__stack_low == (char *)1 || here <= jit__stack_low) return SIZE_MAX;
  return (size_t)(here - jit__stack_low);
}

// libomp gives its workers OMP_STACKSIZE (or KMP_STACKSIZE) bytes of stack, 4-8 MiB by
// default; a threaded kernel's packed blocks sit on each worker's stack as on the
// caller's. kmp_get_stacksize_s is libomp's own extension; without it, unknown.
static pthread_once_t jit__omp_stack_once = PTHREAD_ONCE_INIT;
static size_t jit__omp_stack_bytes = SIZE_MAX;

static void jit__omp_stack_read(void) {
  pthread_once(&jit__omp_once, jit__omp_load);
  if (!jit__omp_lib) return;
  size_t (*get)(void) = (size_t(*)(void))dlsym(jit__omp_lib, "kmp_get_stacksize_s");
  if (get) {
    size_t v = get();
    if (v > 0) jit__omp_stack_bytes = v;
  }
}

size_t jit__cpu_omp_stack(void) {
  pthread_once(&jit__omp_stack_once, jit__omp_stack_read);
  return jit__omp_stack_bytes;
}
