//===--- vulkan.h - the Vulkan device: SPIR-V compute through libvulkan ----===//
//
// Runs SPIR-V compute kernels on a Vulkan 1.1 device. libvulkan.so.1 is opened with
// dlopen (symbol table in vk_symbols.h), so libjitml builds and runs on machines
// without Vulkan: there every entry point here reports JIT_UNAVAILABLE. When the build
// machine lacked the Vulkan headers the backend is compiled out and does the same.
//
// Like every device, this one never compiles: it takes a neutral description of a
// module (SPIR-V bytes, the kernels to launch in order with their grids and argument
// buffer indices, and the size of each buffer) that jit/ fills from the lowering's
// launch plan or from a cache entry. Kernel ABI: descriptor set 0, binding i = the
// kernel's argument i, storage buffers, no push constants, LocalSize baked into the
// module; kernels of one run execute in order with a compute->compute memory barrier
// between consecutive dispatches.
//
// Objects:
//   jit__vk_instance    the loaded library, a VkInstance, the usable physical devices
//   jit__vk_device      a VkDevice with one compute queue, a command pool, a
//                       VkPipelineCache; it holds a reference to its instance
//   jit__vk_buffer      a storage buffer on a device
//   jit__vk_executable  a shader module + one compute pipeline per kernel entry
//
// Status codes: JIT_UNAVAILABLE (no library, no device, backend compiled out),
// JIT_INVALID_ARGUMENT (NULL handles, indices out of range, bad SPIR-V, unknown entry
// point, buffer of the wrong device or size), JIT_UNSUPPORTED (the device's limits or
// features: buffer over maxStorageBufferRange, grid over maxComputeWorkGroupCount, a
// module needing Float16 / 16-bit storage / Int64 the device lacks),
// JIT_RESOURCE_EXHAUSTED (out of host or device memory), JIT_CACHE_ERROR (pipeline
// cache bytes made for another device or driver), JIT_DEVICE_ERROR (any other VkResult,
// VK_ERROR_DEVICE_LOST, a wait that timed out). Failed Vulkan calls are reported once,
// where they happen, as "vkName failed: VK_ERROR_... (code)" with that file:line.
//
// Waits are bounded: every submission is waited for with the device's timeout
// (default 10 s). A submission that times out is not freed while the device may still
// use it; it is reaped by a later run once its fence signals, or at destroy.
//
//===----------------------------------------------------------------------===//
#ifndef JITML_DEVICES_VULKAN_VULKAN_H_
#define JITML_DEVICES_VULKAN_VULKAN_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "jitml.h"

//===--- Instance and device enumeration ---------------------------------===//

// Thread-safe: immutable after creation; reference-counted (each device holds one).
typedef struct jit__vk_instance jit__vk_instance;

// Mirrors VkPhysicalDeviceType (same values).
typedef enum jit__vk_device_type {
  JIT__VK_TYPE_OTHER = 0,
  JIT__VK_TYPE_INTEGRATED = 1,
  JIT__VK_TYPE_DISCRETE = 2,
  JIT__VK_TYPE_VIRTUAL = 3,
  JIT__VK_TYPE_CPU = 4,
} jit__vk_device_type;

// What jit/ needs to key kernels by device and to refuse what a device cannot run.
typedef struct jit__vk_device_info {
  uint32_t index;                   // position among the instance's usable devices
  char name[256];                   // deviceName, e.g. "llvmpipe (LLVM 15.0.6, 256 bits)"
  jit__vk_device_type type;
  uint32_t vendor_id;
  uint32_t device_id;
  uint32_t driver_version;          // vendor-encoded
  uint32_t api_version;             // VK_MAKE_API_VERSION-encoded
  uint8_t pipeline_cache_uuid[16];  // what a VkPipelineCache's header must match
  // f16: an f16 module needs both; jit/ refuses f16 graphs with JIT_UNSUPPORTED
  // otherwise (and compiles with jit__gpu_target.spirv_f16 when both are true).
  bool shader_float16;
  bool storage_buffer_16bit_access;
  bool shader_int64;
  uint64_t max_storage_buffer_range;       // bytes one storage-buffer binding may span
  uint32_t max_compute_work_group_count[3];
  uint32_t max_compute_work_group_size[3];
  uint32_t max_compute_work_group_invocations;
  uint32_t max_per_stage_storage_buffers;  // most arguments one kernel may take
} jit__vk_device_info;

typedef struct jit__vk_instance_options {
  // The library to dlopen; NULL means "libvulkan.so.1". (Tests point it at a library
  // that does not exist to check the "unavailable" path.)
  const char *library;
} jit__vk_instance_options;

// True when this build has the Vulkan backend (the headers were present at build time).
bool jit__vk_compiled_in(void);

// Loads libvulkan, creates a Vulkan 1.1 instance and lists the physical devices that
// support Vulkan 1.1 and have a compute queue. `options` may be NULL. Sets *out = NULL
// first. Returns JIT_UNAVAILABLE when the library, an entry point, a driver or any
// usable device is missing (the message says which), JIT_INVALID_ARGUMENT for a NULL
// `out`. On failure nothing is left loaded.
jit_status jit__vk_instance_create(const jit__vk_instance_options *options,
                                   jit__vk_instance **out_instance);
// Drops the caller's reference; the instance goes away with its last device. NULL is
// a no-op.
void jit__vk_instance_release(jit__vk_instance *instance);

// The number of usable devices (>= 1 for a created instance).
uint32_t jit__vk_instance_device_count(const jit__vk_instance *instance);
// Device `index`'s info, borrowed for the instance's lifetime; NULL when out of range.
const jit__vk_device_info *jit__vk_instance_device_info(const jit__vk_instance *instance,
                                                        uint32_t index);

// Picks a device: `selector` (NULL: the environment variable JITML_VULKAN_DEVICE; NULL
// or "" there too: the default) is a decimal index or a case-insensitive substring of
// the device name. The default is the first discrete GPU, else the first integrated
// GPU, else the first virtual GPU, else the first CPU implementation (lavapipe), else
// device 0. A selector that matches nothing is JIT_UNAVAILABLE listing the devices.
jit_status jit__vk_instance_select(const jit__vk_instance *instance, const char *selector,
                                   uint32_t *out_index);

//===--- Devices ----------------------------------------------------------===//

// Thread-safe: buffers and executables may be created, run and destroyed from many
// threads at once. Queue submission and the command pool are guarded by one mutex held
// only while recording and submitting (never while waiting); merging into the pipeline
// cache takes the same mutex.
typedef struct jit__vk_device jit__vk_device;

typedef struct jit__vk_device_options {
  // Bound on every wait for the device, in nanoseconds; 0 means 10 s.
  uint64_t timeout_ns;
  // Put buffers in device-local memory and copy through staging buffers even when
  // host-visible device memory exists (lavapipe has only that kind; tests use this to
  // run the staging path there).
  bool force_staging;
} jit__vk_device_options;

// Creates a logical device on the instance's device `index` with one compute queue,
// enabling shaderFloat16, storageBuffer16BitAccess and shaderInt64 when supported.
// `options` may be NULL. The device holds a reference to `instance`. Sets *out = NULL
// first. Returns JIT_INVALID_ARGUMENT for a bad index, else a converted VkResult.
jit_status jit__vk_device_create(jit__vk_instance *instance, uint32_t index,
                                 const jit__vk_device_options *options,
                                 jit__vk_device **out_device);
// Waits (at most max(timeout, 10 s) each) for submissions still in flight, then frees
// the device and drops its
// reference to the instance. Destroy the device's executables and buffers first. If a
// submission is still running when the wait runs out, the VkDevice is deliberately
// leaked rather than destroyed under the GPU's feet. NULL is a no-op.
void jit__vk_device_destroy(jit__vk_device *device);
// Waits, each bounded by the device's timeout, for submissions whose earlier waits
// timed out, and frees them. Returns JIT_DEVICE_ERROR "timed out" if one is still
// running: then buffers and executables it uses must not be destroyed yet.
jit_status jit__vk_device_wait(jit__vk_device *device);
// Borrowed for the device's lifetime.
const jit__vk_device_info *jit__vk_device_get_info(const jit__vk_device *device);

// The VkPipelineCache's bytes (vkGetPipelineCacheData), malloc'ed into *out_bytes for
// the disk cache to keep. Sets *out_bytes = NULL, *out_size = 0 first.
jit_status jit__vk_pipeline_cache_get(jit__vk_device *device, uint8_t **out_bytes,
                                      size_t *out_size);
// Merges bytes from jit__vk_pipeline_cache_get (possibly of an earlier process) into the
// device's pipeline cache. The header is checked first (version one, this device's
// vendor id, device id and pipelineCacheUUID): bytes for another device or driver are
// JIT_CACHE_ERROR and leave the cache as it was. Bytes are copied.
jit_status jit__vk_pipeline_cache_merge(jit__vk_device *device, const void *bytes,
                                        size_t size);

//===--- Buffers ----------------------------------------------------------===//

// Thread-compatible: transfers into and out of one buffer, and runs that write it, must
// not overlap; distinct buffers are independent.
typedef struct jit__vk_buffer jit__vk_buffer;

// Allocates a storage buffer of `bytes` (contents undefined). Zero bytes is allowed and
// makes a placeholder that can be bound to a kernel (empty tensors). Bytes over
// maxStorageBufferRange are JIT_UNSUPPORTED (nothing is allocated); out of memory is
// JIT_RESOURCE_EXHAUSTED. Sets *out = NULL first.
jit_status jit__vk_buffer_create(jit__vk_device *device, uint64_t bytes,
                                 jit__vk_buffer **out_buffer);
// Frees the buffer. The caller makes sure no run using it is in flight. NULL is a no-op.
void jit__vk_buffer_destroy(jit__vk_buffer *buffer);
// The size asked for at creation.
uint64_t jit__vk_buffer_size(const jit__vk_buffer *buffer);
// Copies host memory into / out of [offset, offset + bytes) of the buffer and returns
// when done. A range outside the buffer is JIT_INVALID_ARGUMENT; zero bytes do nothing.
jit_status jit__vk_buffer_upload(jit__vk_buffer *buffer, uint64_t offset, const void *src,
                                 uint64_t bytes);
jit_status jit__vk_buffer_download(jit__vk_buffer *buffer, uint64_t offset, void *dst,
                                   uint64_t bytes);

//===--- Executables ------------------------------------------------------===//

// One kernel launch. Strings and arrays are borrowed for the call.
typedef struct jit__vk_kernel_desc {
  const char *entry;     // OpEntryPoint name (GLCompute) in the module
  uint32_t grid[3];      // workgroups in x, y, z (a 0 launches nothing)
  uint32_t block[3];     // the module's LocalSize, checked when non-zero
  uint32_t n_args;       // >= 1
  const uint32_t *args;  // buffer indices; binding i = args[i]
} jit__vk_kernel_desc;

// A module and its launch order. Borrowed for the call; everything needed is copied.
typedef struct jit__vk_executable_desc {
  const void *spirv;            // SPIR-V module, little-endian words (any alignment)
  size_t spirv_size;            // bytes, a multiple of 4
  uint32_t n_buffers;           // buffers a run binds, by index
  const uint64_t *buffer_bytes; // minimum size of each buffer
  uint32_t n_kernels;           // >= 1
  const jit__vk_kernel_desc *kernels;  // launch order
} jit__vk_executable_desc;

// Thread-safe: immutable after creation; runs with distinct buffers may overlap.
typedef struct jit__vk_executable jit__vk_executable;

// Checks the module against the description and the device (magic, every kernel's entry
// point exists as a GLCompute entry, LocalSize matches `block` and the device limits,
// grids within maxComputeWorkGroupCount, argument indices < n_buffers, buffer sizes
// within maxStorageBufferRange, capabilities the device enabled), then creates the
// shader module, one descriptor-set layout and pipeline layout per distinct argument
// count, and one compute pipeline per distinct entry point (through the device's
// pipeline cache). Sets *out = NULL first; on failure nothing is left behind.
jit_status jit__vk_executable_create(jit__vk_device *device,
                                     const jit__vk_executable_desc *desc,
                                     jit__vk_executable **out_executable);
// Frees the executable; the caller makes sure no run of it is in flight. NULL: no-op.
void jit__vk_executable_destroy(jit__vk_executable *executable);
// Milliseconds spent in vkCreateShaderModule + vkCreateComputePipelines.
double jit__vk_executable_create_ms(const jit__vk_executable *executable);

// Runs the kernels in order on `buffers` (n_buffers must equal the description's; each
// buffer of this device and at least its declared size; temporaries are the caller's,
// so concurrent runs need their own) in one command buffer, and waits for it with the
// device's timeout. Returns JIT_DEVICE_ERROR "timed out" when the wait runs out, or
// naming the failed Vulkan call; after VK_ERROR_DEVICE_LOST the device refuses all
// further work with JIT_DEVICE_ERROR. `grids` (may be NULL): per kernel, the grid to
// dispatch in place of its own; JIT_UNSUPPORTED past maxComputeWorkGroupCount.
jit_status jit__vk_run_grids(jit__vk_executable *executable, jit__vk_buffer *const *buffers,
                             uint32_t n_buffers, const uint32_t (*grids)[3]);
// With the executable's own grids.
static inline jit_status jit__vk_run(jit__vk_executable *executable,
                                     jit__vk_buffer *const *buffers, uint32_t n_buffers) {
  return jit__vk_run_grids(executable, buffers, n_buffers, NULL);
}

#endif  // JITML_DEVICES_VULKAN_VULKAN_H_
