//===--- cpu.h - the CPU device: object code loaded with LLVM ORC ----------===//
//
// Loads object files (the bytes a compile produces and the cache stores) into one
// LLJIT instance and returns their entry points. Knows nothing of MLIR or lowering.
//
//===----------------------------------------------------------------------===//
#ifndef JITML_DEVICES_CPU_CPU_H_
#define JITML_DEVICES_CPU_CPU_H_

#include <stdbool.h>
#include <stddef.h>

#include "jitml.h"

// A kernel entry point: args = input buffers then output buffers.
typedef void (*jit__cpu_kernel_fn)(void **args);

// Thread-safe.
typedef struct jit__cpu_device jit__cpu_device;

// The host target, detected once per process; borrowed strings.
typedef struct jit__cpu_target {
  const char *triple;
  const char *cpu;
  const char *features;
  // L2 per core as the C library reads it, or as $JITML_CPU_L2 says (cpu.c); 0 when
  // unknown.
  long l2_bytes;
  // L3 (all of it, shared by the cores) as the C library reads it, or as $JITML_CPU_L3
  // says; 0 when unknown.
  long l3_bytes;
  // Items of $JITML_CPU_FEATURES that turned nothing off (comma-separated), or NULL.
  const char *features_ignored;
  // $JITML_CPU_L2 when it is not a size cpu.c takes (then ignored), or NULL.
  const char *l2_ignored;
  // $JITML_CPU_L3 likewise.
  const char *l3_ignored;
} jit__cpu_target;
const jit__cpu_target *jit__cpu_host_target(void);
// Initializes LLVM's native target once per process (pthread_once). Thread-safe.
void jit__llvm_init_once(void);

// Threads a kernel compiled for jit_options.num_threads = `requested` uses: `requested`,
// or the online CPUs for 0; 1 when no OpenMP runtime (libomp.so.5) is installed, as
// multi-threaded kernels call into it. Deterministic for a machine, so it can be part
// of the kernel key. Thread-safe.
int jit__cpu_threads(int requested);

jit_status jit__cpu_device_create(jit__cpu_device **out_device);
void jit__cpu_device_destroy(jit__cpu_device *device);

// Loaded code that can be unloaded (an ORC resource tracker of its own).
typedef struct jit__cpu_code jit__cpu_code;
// Adds `object` (ELF bytes, copied) and looks up `entry`. *out_threaded (when not
// NULL): whether the kernel forks OpenMP threads. With `out_code` the code is
// unloadable with jit__cpu_unload through *out_code (NULL on failure); without, it
// stays loaded until the device is destroyed. Returns JIT_DEVICE_ERROR with LLVM's
// message on failure.
jit_status jit__cpu_load_code(jit__cpu_device *device, const void *object, size_t size,
                              const char *entry, jit__cpu_kernel_fn *out_fn,
                              bool *out_threaded, jit__cpu_code **out_code);
// Removes `code` from the process: its entry point must not run again (nor be
// running). NULL is a no-op.
void jit__cpu_unload(jit__cpu_device *device, jit__cpu_code *code);

// Bytes of stack left below the caller's frame on the calling thread; SIZE_MAX when
// the thread's stack cannot be found. The first call on a thread looks its stack up
// (pthread_getattr_np), later ones cost a subtraction.
size_t jit__cpu_stack_left(void);

// Bytes of stack each OpenMP worker thread gets (libomp's OMP_STACKSIZE, read once,
// after a threaded kernel has been loaded); SIZE_MAX when unknown. Thread-safe.
size_t jit__cpu_omp_stack(void);

#endif  // JITML_DEVICES_CPU_CPU_H_
