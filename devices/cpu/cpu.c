//===--- cpu.c - the CPU device over LLVM ORC LLJIT ------------------------===//
#include "devices/cpu/cpu.h"

#include <dlfcn.h>
#include <pthread.h>
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

#include "jit/status.h"

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

static void jit__llvm_init(void) {
  LLVMInitializeNativeTarget();
  LLVMInitializeNativeAsmPrinter();
  // These strings live for the process: they describe the machine it runs on.
  jit__host.triple = LLVMGetDefaultTargetTriple();
  jit__host.cpu = LLVMGetHostCPUName();
  jit__host.features = LLVMGetHostCPUFeatures();
}

void jit__llvm_init_once(void) { pthread_once(&jit__llvm_once, jit__llvm_init); }

const jit__cpu_target *jit__cpu_host_target(void) {
  jit__llvm_init_once();
  return &jit__host;
}

//===--- OpenMP runtime ----------------------------------------------------===//

// Multi-threaded kernels are OpenMP code (lowering/cpu_strategy.c says why): they call
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
  long n = requested > 0 ? requested : sysconf(_SC_NPROCESSORS_ONLN);
  if (n <= 1) return 1;
  if (n > 256) n = 256;
  // Whether a runtime is there, without loading it (a process that never runs a
  // threaded kernel never maps it).
  for (size_t i = 0; i < sizeof jit__omp_paths / sizeof *jit__omp_paths; i++)
    if (access(jit__omp_paths[i], R_OK) == 0) return (int)n;
  return 1;
}

// Converts an LLVMErrorRef (consuming it) into a status.
static jit_status jit__from_llvm_error(LLVMErrorRef err, const char *what) {
  char *msg = LLVMGetErrorMessage(err);
  jit_status s = JIT_ERR(JIT_DEVICE_ERROR, "cpu: %s: %s", what, msg);
  LLVMDisposeErrorMessage(msg);
  return s;
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

jit_status jit__cpu_load(jit__cpu_device *device, const void *object, size_t size,
                         const char *entry, jit__cpu_kernel_fn *out_fn) {
  *out_fn = NULL;
  static const char kFork[] = "__kmpc_fork_call";
  if (memmem(object, size, kFork, sizeof kFork - 1)) {
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
  LLVMErrorRef err = LLVMOrcLLJITAddObjectFile(
      device->jit, LLVMOrcLLJITGetMainJITDylib(device->jit), buf);  // takes buf
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
  pthread_mutex_unlock(&device->mu);
  return status;
}
