//===--- cuda.h - the CUDA device: PTX / cubin through the CUDA Driver API --===//
//
// Runs kernels on NVIDIA GPUs through the CUDA Driver API. libcuda.so.1 is opened with
// dlopen (symbol table in cuda_symbols.h), never linked, so libjitml builds and runs on
// machines without a driver: there every entry point here reports JIT_UNAVAILABLE.
// When the build machine lacked the toolkit's cuda.h the backend is compiled out and
// does the same.
//
// Like every device, this one never compiles: it takes a neutral description of a
// module (PTX text or cubin bytes, the kernels to launch in order with their grids,
// blocks and argument buffer indices, and the size of each buffer) that jit/ fills
// from the lowering's launch plan (lowering/gpu.h) or from a cache entry. Kernel ABI
// (the lowering's bare-pointer convention): kernel argument i is one `.param .u64`
// holding the device address of buffer args[i]; no shared memory is requested; the
// block must match the module's `.maxntid`. Kernels of one run are launched in order on
// one stream, which orders them.
//
// Choosing the module (jit/ compiles and offers the images, cuda_backend.c picks; the
// functions here load whichever they are given):
//   1. the device's SM is jit__cu_device_info.sm ("sm_90", from the compute
//      capability); key cache entries with it and with driver_version;
//   2. a cubin for exactly that SM, when the cache holds one (made by ptxas when a
//      toolkit was present at compile time), loads without any JIT: prefer it;
//   3. else PTX for that SM (or an older one), which the driver JIT-compiles at load
//      (tens to hundreds of ms; the driver keeps its own cache in ~/.nv/ComputeCache).
//      Compile PTX with a ptx_version <= jit__cu_device_info.ptx_max: a newer PTX ISA
//      than the driver knows fails with CUDA_ERROR_UNSUPPORTED_PTX_VERSION.
//   A cubin the driver refuses (CUDA_ERROR_NO_BINARY_FOR_GPU / INVALID_IMAGE: another
//   SM, a damaged entry) is JIT_UNSUPPORTED / JIT_INVALID_ARGUMENT: fall back to PTX.
//   PTX newer than the driver takes (CUDA_ERROR_UNSUPPORTED_PTX_VERSION) is
//   JIT_UNSUPPORTED with a message naming the module's PTX ISA, the driver version and
//   the newest PTX ISA it takes.
//
// Objects:
//   jit__cu_instance    the loaded library after cuInit, the devices it lists
//   jit__cu_device      a device's primary context (retained), shared with any other
//                       user of the CUDA runtime in the process (PyTorch, ...), so
//                       device pointers from DLPack kDLCUDA tensors are valid in it
//   jit__cu_buffer      device memory: allocated here, or wrapped (borrowed)
//   jit__cu_executable  a loaded CUmodule + one CUfunction per kernel
//
// Status codes: JIT_UNAVAILABLE (no library, a missing entry point, cuInit failing:
// no device, driver/library mismatch, the toolkit's stub library; backend compiled out),
// JIT_INVALID_ARGUMENT (NULL handles, indices out of range, an unknown kernel entry,
// memory that is not device memory of this device, CUDA_ERROR_INVALID_VALUE from a
// launch), JIT_UNSUPPORTED (grid or block over the device's limits, cubin for another
// SM, PTX newer than the driver), JIT_COMPILE_ERROR (the driver's PTX JIT failed; the
// message carries its log), JIT_RESOURCE_EXHAUSTED (CUDA_ERROR_OUT_OF_MEMORY,
// CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, host memory), JIT_DEVICE_ERROR (any other
// CUresult, a wait that timed out). CUDA results are converted once, where the call is
// made, as "CUDA: cuName failed: CUDA_ERROR_... (code): <description>" with that
// file:line.
//
// Errors that poison a CUDA context (CUDA_ERROR_ILLEGAL_ADDRESS, LAUNCH_FAILED,
// ILLEGAL_INSTRUCTION, MISALIGNED_ADDRESS, ...: "sticky" errors) cannot be recovered
// from in this process without cuDevicePrimaryCtxReset, which would also destroy other
// libraries' allocations in the shared primary context; this backend never resets it.
// After one, the device refuses all further work with JIT_DEVICE_ERROR naming the
// first error. Every other failure (a bad launch configuration, out of memory, a module
// that does not load) leaves the context usable.
//
// Waits are bounded: cuStreamSynchronize cannot time out, so a run waits by polling
// cuStreamQuery (spinning briefly, then sleeping up to 100 us between polls) until the
// timeout (run option, else the device's, else 10 s). A run that times out is still in
// flight: its buffers must not be freed until jit__cu_device_wait succeeds.
//
//===----------------------------------------------------------------------===//
#ifndef JITML_DEVICES_CUDA_CUDA_H_
#define JITML_DEVICES_CUDA_CUDA_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "jitml.h"

// cuda.h's CUstream is `struct CUstream_st *`; naming the struct keeps this header free
// of cuda.h while the type stays checked.
struct CUstream_st;

//===--- Instance and device enumeration ---------------------------------===//

// Thread-safe: immutable after creation; reference-counted (each device holds one).
typedef struct jit__cu_instance jit__cu_instance;

// What jit/ needs to key kernels by device and to refuse what a device cannot run.
typedef struct jit__cu_device_info {
  uint32_t index;             // CUDA device ordinal (as cuDeviceGet, DLDevice.device_id)
  char name[256];             // cuDeviceGetName, e.g. "NVIDIA H200"
  int cc_major, cc_minor;     // compute capability
  char sm[16];                // "sm_<major><minor>", e.g. "sm_90": the PTX chip / cubin arch
  int driver_version;         // cuDriverGetVersion: 1000 * major + 10 * minor (12040)
  int ptx_max;                // newest PTX ISA the driver JITs, times ten (84 for 12.4)
  uint64_t total_memory;      // bytes (cuDeviceTotalMem)
  int multiprocessor_count;
  uint32_t max_grid_dim[3];   // CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X/Y/Z
  uint32_t max_block_dim[3];  // CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X/Y/Z
  uint32_t max_threads_per_block;
  uint8_t uuid[16];           // cuDeviceGetUuid (as nvidia-smi's GPU-... id)
} jit__cu_device_info;

typedef struct jit__cu_instance_options {
  // The library to dlopen; NULL means $JITML_CUDA_LIBRARY when set and not empty, else
  // "libcuda.so.1". (Tests point it at a library that does not exist, at the toolkit's
  // stub, or at a mock driver, to check the "unavailable" and host-side paths.)
  const char *library;
} jit__cu_instance_options;

// True when this build has the CUDA backend (cuda.h was present at build time).
bool jit__cu_compiled_in(void);

// The newest PTX ISA version (times ten) that a driver of `driver_version`
// (cuDriverGetVersion's encoding) accepts; 0 for drivers older than CUDA 11.0. A
// driver newer than the table gets the newest version the table knows.
int jit__cu_ptx_max_for_driver(int driver_version);

// The PTX ISA version (times ten: 80 for `.version 8.0`) that PTX text declares, from
// its first `.version` directive; 0 when there is none or it does not parse. `ptx`
// need not be NUL-terminated.
int jit__cu_ptx_isa_version(const void *ptx, size_t size);

// Loads libcuda, calls cuInit(0) and lists the devices. `options` may be NULL. Sets
// *out = NULL first. Returns JIT_UNAVAILABLE when the library or an entry point is
// missing (the message names the library or symbol), when cuInit fails (with the CUDA
// error name: CUDA_ERROR_NO_DEVICE, CUDA_ERROR_INSUFFICIENT_DRIVER,
// CUDA_ERROR_STUB_LIBRARY, ...) or no device exists; JIT_INVALID_ARGUMENT for a NULL
// `out`. The library stays mapped for the process once cuInit ran (libcuda cannot be
// unloaded and initialized again), but nothing else is left behind on failure.
jit_status jit__cu_instance_create(const jit__cu_instance_options *options,
                                   jit__cu_instance **out_instance);
// Drops the caller's reference; the instance goes away with its last device. NULL is a
// no-op.
void jit__cu_instance_release(jit__cu_instance *instance);

// The number of devices (>= 1 for a created instance).
uint32_t jit__cu_instance_device_count(const jit__cu_instance *instance);
// Device `index`'s info, borrowed for the instance's lifetime; NULL when out of range.
const jit__cu_device_info *jit__cu_instance_device_info(const jit__cu_instance *instance,
                                                        uint32_t index);

// Picks a device: `selector` (NULL: the environment variable JITML_CUDA_DEVICE; NULL or
// "" there too: device 0) is a decimal ordinal or a case-insensitive substring of the
// device name. A selector that matches nothing is JIT_UNAVAILABLE listing the devices.
// (jit/ running DLPack kDLCUDA tensors uses their device_id directly.)
jit_status jit__cu_instance_select(const jit__cu_instance *instance, const char *selector,
                                   uint32_t *out_index);

//===--- Devices ----------------------------------------------------------===//

// Thread-safe: buffers and executables may be created, run and destroyed from many
// threads at once; every call makes the primary context current on the calling thread
// (cuCtxPushCurrent) and restores the thread's previous context before returning.
typedef struct jit__cu_device jit__cu_device;

typedef struct jit__cu_device_options {
  // Bound on every wait for the device, in nanoseconds; 0 means 10 s.
  uint64_t timeout_ns;
} jit__cu_device_options;

// Retains the primary context of the instance's device `index`. `options` may be NULL.
// The device holds a reference to `instance`. Sets *out = NULL first. Returns
// JIT_INVALID_ARGUMENT for a bad index, else a converted CUresult.
jit_status jit__cu_device_create(jit__cu_instance *instance, uint32_t index,
                                 const jit__cu_device_options *options,
                                 jit__cu_device **out_device);
// Releases the primary context and drops the reference to the instance. Destroy the
// device's executables and buffers first. NULL is a no-op.
void jit__cu_device_destroy(jit__cu_device *device);
// Waits, bounded by the device's timeout, until the work queued on `stream` (NULL: the
// legacy default stream, where runs without a stream option go) has finished: what a
// run that timed out, or ran with no_wait, left in flight. Returns JIT_DEVICE_ERROR
// "timed out" if it has not, or the error the work ended with.
jit_status jit__cu_device_wait(jit__cu_device *device, struct CUstream_st *stream);
// Borrowed for the device's lifetime.
const jit__cu_device_info *jit__cu_device_get_info(const jit__cu_device *device);

//===--- Buffers ----------------------------------------------------------===//

// Thread-compatible: transfers into and out of one buffer, and runs that write it, must
// not overlap; distinct buffers are independent.
typedef struct jit__cu_buffer jit__cu_buffer;

// Allocates `bytes` of device memory (cuMemAlloc; contents undefined). Zero bytes is
// allowed and makes a placeholder whose device address is 0 (empty tensors). Out of
// device memory is JIT_RESOURCE_EXHAUSTED "CUDA_ERROR_OUT_OF_MEMORY"; the context stays
// usable. Sets *out = NULL first.
jit_status jit__cu_buffer_create(jit__cu_device *device, uint64_t bytes,
                                 jit__cu_buffer **out_buffer);
// Wraps memory someone else owns (a DLPack kDLCUDA tensor's data + byte_offset) as a
// buffer of `bytes`; destroying the buffer does not free it. The address is checked
// with cuPointerGetAttribute: memory unknown to CUDA (a host pointer passed as kDLCUDA)
// or host memory is JIT_INVALID_ARGUMENT "not CUDA device memory"; device memory of
// another device is JIT_INVALID_ARGUMENT naming both ordinals; a range running past the
// end of its allocation is JIT_INVALID_ARGUMENT. Sets *out = NULL first.
jit_status jit__cu_buffer_wrap(jit__cu_device *device, uint64_t device_ptr, uint64_t bytes,
                               jit__cu_buffer **out_buffer);
// Frees (or, when wrapped, forgets) the buffer. The caller makes sure no run using it is
// in flight. NULL is a no-op.
void jit__cu_buffer_destroy(jit__cu_buffer *buffer);
// The size asked for at creation.
uint64_t jit__cu_buffer_size(const jit__cu_buffer *buffer);
// The device address (CUdeviceptr); 0 for a zero-byte buffer.
uint64_t jit__cu_buffer_device_ptr(const jit__cu_buffer *buffer);
// Copies host memory into / out of [offset, offset + bytes) of the buffer and returns
// when done (cuMemcpyHtoD / DtoH: synchronous, ordered after earlier work on the legacy
// default stream and on blocking streams, but not after work on CU_STREAM_NON_BLOCKING
// streams: wait for those first). A range outside the buffer is JIT_INVALID_ARGUMENT;
// zero bytes do nothing.
jit_status jit__cu_buffer_upload(jit__cu_buffer *buffer, uint64_t offset, const void *src,
                                 uint64_t bytes);
jit_status jit__cu_buffer_download(jit__cu_buffer *buffer, uint64_t offset, void *dst,
                                   uint64_t bytes);
// Device-to-device copy between two buffers of one device (jit_copy of kDLCUDA
// tensors); same range rules and ordering as upload.
jit_status jit__cu_buffer_copy(jit__cu_buffer *dst, uint64_t dst_offset,
                               const jit__cu_buffer *src, uint64_t src_offset,
                               uint64_t bytes);
// Sets [offset, offset + bytes) to `value` (cuMemsetD8).
jit_status jit__cu_buffer_fill(jit__cu_buffer *buffer, uint64_t offset, uint8_t value,
                               uint64_t bytes);

//===--- Executables ------------------------------------------------------===//

typedef enum jit__cu_module_format {
  JIT__CU_PTX = 1,    // PTX text; need not be NUL-terminated (a terminated copy is made)
  JIT__CU_CUBIN = 2,  // an ELF cubin (or fatbin) for the device's SM
} jit__cu_module_format;

// One kernel launch. Strings and arrays are borrowed for the call.
typedef struct jit__cu_kernel_desc {
  const char *entry;     // .entry name in the module
  uint32_t grid[3];      // blocks in x, y, z (a 0 launches nothing)
  uint32_t block[3];     // threads per block; must match the module's .maxntid
  uint32_t n_args;       // >= 1
  const uint32_t *args;  // buffer indices; kernel parameter i = address of args[i]
} jit__cu_kernel_desc;

// A module and its launch order. Borrowed for the call; everything needed is copied.
typedef struct jit__cu_executable_desc {
  jit__cu_module_format format;
  const void *module;            // PTX text or cubin bytes
  size_t module_size;            // bytes (PTX: without any terminating NUL)
  uint32_t n_buffers;            // buffers a run binds, by index
  const uint64_t *buffer_bytes;  // minimum size of each buffer
  uint32_t n_kernels;            // >= 1
  const jit__cu_kernel_desc *kernels;  // launch order
} jit__cu_executable_desc;

// Thread-safe: immutable after creation; runs with distinct buffers may overlap.
typedef struct jit__cu_executable jit__cu_executable;

// Checks the description (every kernel has an entry, arguments, indices < n_buffers,
// grid and block within the device's limits), loads the module with
// cuModuleLoadDataEx (the driver's JIT error log is captured into the status), and
// looks up one CUfunction per kernel (an entry missing from the module is
// JIT_INVALID_ARGUMENT naming it). Sets *out = NULL first; on failure nothing is left.
jit_status jit__cu_executable_create(jit__cu_device *device,
                                     const jit__cu_executable_desc *desc,
                                     jit__cu_executable **out_executable);
// Unloads the module; the caller makes sure no run of it is in flight. NULL: no-op.
void jit__cu_executable_destroy(jit__cu_executable *executable);
// Milliseconds spent in cuModuleLoadDataEx (the driver's PTX JIT) + cuModuleGetFunction.
double jit__cu_executable_create_ms(const jit__cu_executable *executable);

typedef struct jit__cu_run_options {
  // The stream to launch on (borrowed; a framework's current stream); NULL: the legacy
  // default stream.
  struct CUstream_st *stream;
  // Return once the kernels are queued instead of waiting for them (for framework
  // streams: the caller orders later work on the same stream). Launch errors are still
  // reported; errors during execution surface at the caller's next synchronization.
  bool no_wait;
  // Bound on the wait in nanoseconds; 0: the device's.
  uint64_t timeout_ns;
  // Per kernel, the grid to launch in place of its own (a generic kernel's, computed
  // for a binding); NULL: the kernels' own. Checked against the device's limits.
  const uint32_t (*grids)[3];
} jit__cu_run_options;

// Launches the kernels in order on `buffers` (n_buffers must equal the description's;
// each buffer of this device and at least its declared size; temporaries are the
// caller's, so concurrent runs need their own) with cuLaunchKernel, then waits (bounded)
// unless options->no_wait. `options` may be NULL. Returns JIT_DEVICE_ERROR "timed out"
// when the wait runs out, or a status naming the failed call and kernel.
jit_status jit__cu_run(jit__cu_executable *executable, jit__cu_buffer *const *buffers,
                       uint32_t n_buffers, const jit__cu_run_options *options);

#endif  // JITML_DEVICES_CUDA_CUDA_H_
