//===--- device.h - the one interface every device backend implements -----===//
//
// jit/ talks to devices only through this table of functions: it lists a backend's
// devices, opens one at first use, allocates and frees buffers, copies to and from
// them, loads an artifact (the compiled bytes and their launch plan), launches it and
// waits. A backend is one folder under devices/ that fills a jit__device_vtable and
// exports one constructor, named in jit/device.c's registration table; adding a
// backend touches nothing else in jit/.
//
// A backend never compiles (DESIGN.md): the artifact it is given is made by lowering/
// (and, for CUDA cubins, by the toolkit's ptxas), or read from the cache. When a
// backend offers several images of one kernel (a cubin and its PTX), the backend picks:
// it loads the first it can and falls back to the next, and says which one it used.
//
// Objects (each backend defines the structs; jit/ sees them only through this table):
//   jit__backend         a loaded backend: its library, its instance, the devices it
//                        lists. Starts with the vtable pointer (IREE hal/resource.h).
//   jit__dev             an opened device (a VkDevice, a CUDA primary context)
//   jit__dev_buffer      memory on an opened device
//   jit__dev_executable  a loaded artifact
//
// Status codes: as the backends' own headers say (devices/*/<backend>.h). A backend
// that is absent on this machine, or compiled out of this build, fails its
// constructor with JIT_UNAVAILABLE; a call a backend does not implement (the CPU
// device's launch: jit/ calls a host kernel's entry point itself) is JIT_UNSUPPORTED.
//
//===----------------------------------------------------------------------===//
#ifndef JITML_DEVICES_DEVICE_H_
#define JITML_DEVICES_DEVICE_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/image.h"
#include "jitml.h"

typedef struct jit__device_vtable jit__device_vtable;

// A loaded backend. Each backend's instance struct starts with this.
// Thread-safe: immutable after creation.
typedef struct jit__backend {
  const jit__device_vtable *vt;
} jit__backend;

// Thread-safe (see the backend's header for what may overlap).
typedef struct jit__dev jit__dev;
// Thread-compatible: transfers and runs touching one buffer must not overlap.
typedef struct jit__dev_buffer jit__dev_buffer;
// Thread-safe: immutable after creation; runs with distinct buffers may overlap.
typedef struct jit__dev_executable jit__dev_executable;


// One device as a backend lists it: what jit/ needs to key kernels by device, to
// compile for it and to refuse what it cannot run. Plain data.
// Thread-compatible: a value; filled once at enumeration.
typedef struct jit__dev_info {
  char name[256];       // e.g. "NVIDIA H200", "llvmpipe (LLVM 15.0.6, 256 bits)"
  int ordinal;          // DLDevice.device_id
  bool f16;             // f16 kernels can run
  bool int64;           // kernels can read int64 (jit_gather's indices)
  // Tensors on this device may hold device addresses the backend did not allocate
  // (CUDA: a framework's memory; the backend checks them at every use). Else a
  // tensor's data must be a live allocation of the context, which jit/ checks.
  bool foreign_memory;
  jit__code code;       // what it runs (base/image.h); jit/ hands it to the lowering
  char chip[16];        // PTX: "sm_90" (the lowering's chip, the cubin's arch)
  int isa_max;          // PTX: newest PTX ISA the driver takes, times ten
  // The backend's key components, "name=value\n" lines; jit/ appends the compiler's.
  char target[1024];
  // With state_get: the name the state is kept under ("vk-pipeline-cache"); else "".
  char state_kind[32];
} jit__dev_info;

// Receives a backend's log lines (a cubin refused, a PTX JIT and what it cost). Called
// from whichever thread made the call that logs: it must be thread-safe.
typedef void (*jit__dev_log_fn)(void *user, jit_log_level level, const char *message);

// How a device is opened. Thread-compatible: a value.
typedef struct jit__dev_options {
  uint64_t timeout_ns;  // bound on every wait; 0: the backend's default (10 s)
  jit__dev_log_fn log;  // may be NULL
  void *log_user;
} jit__dev_options;


// One kernel launch of an artifact. Borrowed for the load call.
// Thread-compatible: a value.
typedef struct jit__dev_kernel {
  const char *entry;     // the entry point's name in the module
  uint32_t grid[3];      // workgroups / blocks (a 0 launches nothing)
  uint32_t block[3];     // threads per workgroup / block, as the module declares
  uint32_t n_args;       // >= 1
  const uint32_t *args;  // buffer indices; argument i is buffer args[i]
} jit__dev_kernel;

// What a backend loads: alternative images of one module, best first, and the plan
// that launches it. Borrowed for the call; the backend copies what it keeps.
// Thread-compatible: a value.
typedef struct jit__dev_artifact {
  const jit__image *images;     // base/image.h
  uint32_t n_images;            // >= 1
  // Why a better image than images[0] is missing ("no ptxas", ...), for the log; or
  // NULL.
  const char *missing_note;
  uint32_t n_buffers;           // buffers a launch binds, by index
  const uint64_t *buffer_bytes; // minimum size of each
  uint32_t n_kernels;           // >= 1
  const jit__dev_kernel *kernels;  // launch order
} jit__dev_artifact;

// A buffer a launch binds: `data` is what a tensor holds (a Vulkan buffer, a CUDA
// device address); `buffer` is the allocation behind it when jit/ made it, else NULL
// (a foreign address, checked by the backend; a backend without foreign memory takes
// `data` as its own buffer, which jit/ checked is live). Thread-compatible: a value.
typedef struct jit__dev_arg {
  void *data;
  jit__dev_buffer *buffer;
} jit__dev_arg;

// A host kernel's entry point: args = pointers to its arguments' descriptors.
typedef void (*jit__host_fn)(void **args);

// The backend interface. Functions that may be NULL say so.
// Thread-safe: a constant table.
struct jit__device_vtable {
  // Drops the backend; its devices are closed first. NULL is a no-op.
  void (*destroy)(jit__backend *backend);
  // The number of devices listed, and one device's description.
  uint32_t (*device_count)(const jit__backend *backend);
  void (*device_info)(const jit__backend *backend, uint32_t index, jit__dev_info *out);
  // Opens device `index` (sets *out = NULL first) and closes it (NULL: no-op). Close a
  // device's executables and buffers first.
  jit_status (*open)(jit__backend *backend, uint32_t index, const jit__dev_options *options,
                     jit__dev **out_device);
  void (*close)(jit__dev *device);
  // Allocates `bytes` (zero allowed); *out_data is what a tensor's data holds.
  jit_status (*buffer_alloc)(jit__dev *device, uint64_t bytes, jit__dev_buffer **out_buffer,
                             void **out_data);
  void (*buffer_free)(jit__dev *device, jit__dev_buffer *buffer);
  // Host <-> device copies of [offset, offset + bytes) of `data` (`buffer` as in
  // jit__dev_arg); synchronous.
  jit_status (*upload)(jit__dev *device, const jit__dev_arg *dst, uint64_t offset,
                       const void *src, uint64_t bytes);
  jit_status (*download)(jit__dev *device, const jit__dev_arg *src, uint64_t offset,
                         void *dst, uint64_t bytes);
  // Loads the first image of `artifact` the device takes (sets *out = NULL first);
  // *out_image says which. On failure, the status of the last image tried, annotated
  // with why the earlier ones were refused.
  jit_status (*load)(jit__dev *device, const jit__dev_artifact *artifact,
                     jit__dev_executable **out_executable, uint32_t *out_image);
  void (*unload)(jit__dev_executable *executable);
  // Launches the kernels in order on `args` (one per artifact buffer) and waits for
  // them, bounded by the device's timeout.
  jit_status (*launch)(jit__dev_executable *executable, const jit__dev_arg *args,
                       uint32_t n_args);
  // Optional (NULL where the backend has none): as launch, with `grids[k]` in place of
  // kernel k's grid (a 0 launches nothing; each within the device's limits, else
  // JIT_UNSUPPORTED) and `bytes[i]` in place of buffer i's declared size. A generic
  // kernel is loaded once and launched with each binding's grids and sizes; without
  // this jit/ loads it once per binding.
  jit_status (*launch_grids)(jit__dev_executable *executable, const jit__dev_arg *args,
                             uint32_t n_args, const uint32_t (*grids)[3],
                             const uint64_t *bytes);
  // Optional (NULL where the backend has no streams; CUDA has them): as launch_grids
  // (grids and bytes may be NULL: the executable's own), queued on `stream` (a CUstream)
  // after the work already there; waits for that stream, bounded by the timeout.
  jit_status (*launch_stream)(jit__dev_executable *executable, const jit__dev_arg *args,
                              uint32_t n_args, const uint32_t (*grids)[3],
                              const uint64_t *bytes, void *stream);
  // Optional (NULL where kernels are launched): the entry point of a loaded host
  // kernel, which jit/ calls itself with the arguments it builds (a table call per run
  // would cost more than the ~0.05 us the CPU hot path takes), and whether it forks
  // OpenMP threads.
  void (*host_entry)(jit__dev_executable *executable, jit__host_fn *out_fn,
                     bool *out_threaded);
  // Waits for work that an earlier wait gave up on.
  jit_status (*wait)(jit__dev *device);
  // Optional (NULL when the backend keeps none): bytes of the device's own cache of
  // loaded code (Vulkan's VkPipelineCache), kept by jit/ in the disk cache across
  // processes, and merging them back into a new device.
  jit_status (*state_get)(jit__dev *device, uint8_t **out_bytes, size_t *out_size);
  jit_status (*state_merge)(jit__dev *device, const void *bytes, size_t size);
};

//===--- The registry -----------------------------------------------------===//

#define JIT__N_BACKENDS 3

// One row per backend, indexed by jit_device_kind (devices/registry.c). Adding a
// backend is adding a row there (and a kind to jitml.h).
// Thread-safe: a constant table.
typedef struct jit__backend_entry {
  jit_device_kind kind;
  const char *name;            // as options.device and messages spell it
  DLDeviceType dl;             // the DLPack device type of its tensors
  jit_status (*create)(jit__backend **out);
} jit__backend_entry;

extern const jit__backend_entry jit__backends[JIT__N_BACKENDS];

//===--- Backends (each folder under devices/ exports one constructor) ----===//

// Each sets *out = NULL first and returns JIT_UNAVAILABLE when the backend is absent
// or compiled out (the message says why).
jit_status jit__cpu_backend_create(jit__backend **out_backend);
jit_status jit__vulkan_backend_create(jit__backend **out_backend);
jit_status jit__cuda_backend_create(jit__backend **out_backend);

#endif  // JITML_DEVICES_DEVICE_H_
