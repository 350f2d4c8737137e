//===--- vulkan.c - the Vulkan device: instance, buffers, pipelines, runs ---===//
//
// See vulkan.h for the contract. Built with the Vulkan headers only (no libvulkan at
// link time): JITML_HAVE_VULKAN is set by CMake when vulkan/vulkan_core.h was found;
// without it every entry point reports JIT_UNAVAILABLE.
//
//===----------------------------------------------------------------------===//
#include "devices/vulkan/vulkan.h"

#include <stdlib.h>
#include <string.h>

#include "base/bytes.h"
#include "base/clock.h"
#include "base/status.h"

#if !defined(JITML_HAVE_VULKAN) || !JITML_HAVE_VULKAN

//===--- Compiled out -----------------------------------------------------===//

#define JIT__VK_OUT \
  JIT_ERR(JIT_UNAVAILABLE, "Vulkan: backend compiled out (no Vulkan headers at build " \
                           "time; install libvulkan-dev and rebuild)")

bool jit__vk_compiled_in(void) { return false; }
jit_status jit__vk_instance_create(const jit__vk_instance_options *options,
                                   jit__vk_instance **out_instance) {
  if (out_instance) *out_instance = NULL;
  return JIT__VK_OUT;
}
void jit__vk_instance_release(jit__vk_instance *instance) {}
uint32_t jit__vk_instance_device_count(const jit__vk_instance *instance) { return 0; }
const jit__vk_device_info *jit__vk_instance_device_info(const jit__vk_instance *instance,
                                                        uint32_t index) {
  return NULL;
}
jit_status jit__vk_instance_select(const jit__vk_instance *instance, const char *selector,
                                   uint32_t *out_index) {
  return JIT__VK_OUT;
}
jit_status jit__vk_device_create(jit__vk_instance *instance, uint32_t index,
                                 const jit__vk_device_options *options,
                                 jit__vk_device **out_device) {
  if (out_device) *out_device = NULL;
  return JIT__VK_OUT;
}
void jit__vk_device_destroy(jit__vk_device *device) {}
jit_status jit__vk_device_wait(jit__vk_device *device) { return JIT__VK_OUT; }
const jit__vk_device_info *jit__vk_device_get_info(const jit__vk_device *device) {
  return NULL;
}
jit_status jit__vk_pipeline_cache_get(jit__vk_device *device, uint8_t **out_bytes,
                                      size_t *out_size) {
  if (out_bytes) *out_bytes = NULL;
  if (out_size) *out_size = 0;
  return JIT__VK_OUT;
}
jit_status jit__vk_pipeline_cache_merge(jit__vk_device *device, const void *bytes,
                                        size_t size) {
  return JIT__VK_OUT;
}
jit_status jit__vk_buffer_create(jit__vk_device *device, uint64_t bytes,
                                 jit__vk_buffer **out_buffer) {
  if (out_buffer) *out_buffer = NULL;
  return JIT__VK_OUT;
}
void jit__vk_buffer_destroy(jit__vk_buffer *buffer) {}
uint64_t jit__vk_buffer_size(const jit__vk_buffer *buffer) { return 0; }
jit_status jit__vk_buffer_upload(jit__vk_buffer *buffer, uint64_t offset, const void *src,
                                 uint64_t bytes) {
  return JIT__VK_OUT;
}
jit_status jit__vk_buffer_download(jit__vk_buffer *buffer, uint64_t offset, void *dst,
                                   uint64_t bytes) {
  return JIT__VK_OUT;
}
jit_status jit__vk_executable_create(jit__vk_device *device,
                                     const jit__vk_executable_desc *desc,
                                     jit__vk_executable **out_executable) {
  if (out_executable) *out_executable = NULL;
  return JIT__VK_OUT;
}
void jit__vk_executable_destroy(jit__vk_executable *executable) {}
double jit__vk_executable_create_ms(const jit__vk_executable *executable) { return 0; }
jit_status jit__vk_run_grids(jit__vk_executable *executable, jit__vk_buffer *const *buffers,
                             uint32_t n_buffers, const uint32_t (*grids)[3]) {
  return JIT__VK_OUT;
}

#else  // JITML_HAVE_VULKAN

#define VK_NO_PROTOTYPES 1
#include <ctype.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>
#include <vulkan/vulkan_core.h>

#include "devices/vulkan/vk_symbols.h"

#define JIT__VK_DEFAULT_TIMEOUT_NS (10ull * 1000 * 1000 * 1000)

//===--- VkResult -> jit_status, once, where the call is made ------------===//

static const char *vk_result_name(VkResult r) {
  switch (r) {
#define C(x) \
  case x:    \
    return #x;
    C(VK_SUCCESS) C(VK_NOT_READY) C(VK_TIMEOUT) C(VK_EVENT_SET) C(VK_EVENT_RESET)
    C(VK_INCOMPLETE) C(VK_ERROR_OUT_OF_HOST_MEMORY) C(VK_ERROR_OUT_OF_DEVICE_MEMORY)
    C(VK_ERROR_INITIALIZATION_FAILED) C(VK_ERROR_DEVICE_LOST) C(VK_ERROR_MEMORY_MAP_FAILED)
    C(VK_ERROR_LAYER_NOT_PRESENT) C(VK_ERROR_EXTENSION_NOT_PRESENT)
    C(VK_ERROR_FEATURE_NOT_PRESENT) C(VK_ERROR_INCOMPATIBLE_DRIVER)
    C(VK_ERROR_TOO_MANY_OBJECTS) C(VK_ERROR_FORMAT_NOT_SUPPORTED) C(VK_ERROR_FRAGMENTED_POOL)
    C(VK_ERROR_UNKNOWN) C(VK_ERROR_OUT_OF_POOL_MEMORY) C(VK_ERROR_INVALID_EXTERNAL_HANDLE)
    C(VK_ERROR_FRAGMENTATION) C(VK_ERROR_INVALID_OPAQUE_CAPTURE_ADDRESS)
    C(VK_PIPELINE_COMPILE_REQUIRED) C(VK_ERROR_INVALID_SHADER_NV)
#undef C
    default:
      return "unknown VkResult";
  }
}

static jit_status_code vk_result_code(VkResult r) {
  switch (r) {
    case VK_ERROR_OUT_OF_HOST_MEMORY:
    case VK_ERROR_OUT_OF_DEVICE_MEMORY:
    case VK_ERROR_TOO_MANY_OBJECTS:
    case VK_ERROR_FRAGMENTED_POOL:
    case VK_ERROR_OUT_OF_POOL_MEMORY:
    case VK_ERROR_FRAGMENTATION:
      return JIT_RESOURCE_EXHAUSTED;
    case VK_ERROR_INCOMPATIBLE_DRIVER:
    case VK_ERROR_INITIALIZATION_FAILED:
      return JIT_UNAVAILABLE;
    case VK_ERROR_LAYER_NOT_PRESENT:
    case VK_ERROR_EXTENSION_NOT_PRESENT:
    case VK_ERROR_FEATURE_NOT_PRESENT:
    case VK_ERROR_FORMAT_NOT_SUPPORTED:
      return JIT_UNSUPPORTED;
    default:
      return JIT_DEVICE_ERROR;
  }
}

// NULL for success codes (VK_SUCCESS and the positive ones), else a status naming the
// call and the caller's file:line.
static jit_status vk_result_status(VkResult r, const char *call, const char *file,
                                   int line) {
  if (r >= 0) return NULL;
  return jit__status_make(vk_result_code(r), file, line, "Vulkan: %s failed: %s (%d)", call,
                          vk_result_name(r), (int)r);
}

// Instance-level call through table `t` (any struct with the PFN fields).
#define VK_CALL(t, name, ...) \
  vk_result_status((t)->name(__VA_ARGS__), #name, __FILE__, __LINE__)
// Device-level call: also remembers VK_ERROR_DEVICE_LOST on the device.
#define VK_DCALL(d, name, ...) \
  vk_device_result((d), (d)->fn.name(__VA_ARGS__), #name, __FILE__, __LINE__)

//===--- Instance ---------------------------------------------------------===//

typedef struct vk_phys {
  VkPhysicalDevice pd;
  jit__vk_device_info info;
  uint32_t queue_family;
  bool f16_via_ext;     // device < 1.2: shaderFloat16 comes from VK_KHR_shader_float16_int8
  bool shader_int16;
  bool shader_float64;
} vk_phys;

struct jit__vk_instance {
  atomic_int refs;
  void *lib;
  PFN_vkGetInstanceProcAddr vkGetInstanceProcAddr;
  struct {
#define X(n) PFN_##n n;
    JIT__VK_GLOBAL_SYMBOLS(X)
    JIT__VK_INSTANCE_SYMBOLS(X)
#undef X
  } fn;
  VkInstance vk;
  uint32_t n_phys;
  vk_phys *phys;
};

bool jit__vk_compiled_in(void) { return true; }

static void instance_free(jit__vk_instance *in) {
  if (!in) return;
  if (in->vk && in->fn.vkDestroyInstance) in->fn.vkDestroyInstance(in->vk, NULL);
  if (in->lib) dlclose(in->lib);
  free(in->phys);
  free(in);
}

static bool has_extension(const VkExtensionProperties *ext, uint32_t n, const char *name) {
  for (uint32_t i = 0; i < n; i++)
    if (!strcmp(ext[i].extensionName, name)) return true;
  return false;
}

// Fills `p` for physical device `pd`; false if it is not usable (below 1.1, no compute).
static bool describe_phys(jit__vk_instance *in, VkPhysicalDevice pd, vk_phys *p) {
  memset(p, 0, sizeof *p);
  p->pd = pd;
  VkPhysicalDeviceProperties props;
  in->fn.vkGetPhysicalDeviceProperties(pd, &props);
  if (props.apiVersion < VK_API_VERSION_1_1) return false;

  uint32_t nq = 0;
  in->fn.vkGetPhysicalDeviceQueueFamilyProperties(pd, &nq, NULL);
  VkQueueFamilyProperties *q = calloc(nq ? nq : 1, sizeof *q);
  if (!q) return false;
  in->fn.vkGetPhysicalDeviceQueueFamilyProperties(pd, &nq, q);
  int64_t fam = -1;
  // A compute-only family first (an async compute queue on discrete GPUs), else any.
  for (uint32_t i = 0; i < nq && fam < 0; i++)
    if ((q[i].queueFlags & VK_QUEUE_COMPUTE_BIT) && !(q[i].queueFlags & VK_QUEUE_GRAPHICS_BIT) &&
        q[i].queueCount > 0)
      fam = i;
  for (uint32_t i = 0; i < nq && fam < 0; i++)
    if ((q[i].queueFlags & VK_QUEUE_COMPUTE_BIT) && q[i].queueCount > 0) fam = i;
  free(q);
  if (fam < 0) return false;
  p->queue_family = (uint32_t)fam;

  uint32_t next = 0;
  VkExtensionProperties *ext = NULL;
  if (in->fn.vkEnumerateDeviceExtensionProperties(pd, NULL, &next, NULL) == VK_SUCCESS &&
      next) {
    ext = calloc(next, sizeof *ext);
    if (ext && in->fn.vkEnumerateDeviceExtensionProperties(pd, NULL, &next, ext) < 0) next = 0;
    if (!ext) next = 0;
  }
  bool f16_struct = props.apiVersion >= VK_API_VERSION_1_2;
  if (!f16_struct && has_extension(ext, next, VK_KHR_SHADER_FLOAT16_INT8_EXTENSION_NAME)) {
    f16_struct = true;
    p->f16_via_ext = true;
  }
  free(ext);

  VkPhysicalDeviceShaderFloat16Int8Features f16 = {
      .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES};
  VkPhysicalDevice16BitStorageFeatures s16 = {
      .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES,
      .pNext = f16_struct ? &f16 : NULL};
  VkPhysicalDeviceFeatures2 feat = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2,
                                    .pNext = &s16};
  in->fn.vkGetPhysicalDeviceFeatures2(pd, &feat);

  jit__vk_device_info *d = &p->info;
  snprintf(d->name, sizeof d->name, "%s", props.deviceName);
  d->type = (jit__vk_device_type)props.deviceType;
  d->vendor_id = props.vendorID;
  d->device_id = props.deviceID;
  d->driver_version = props.driverVersion;
  d->api_version = props.apiVersion;
  memcpy(d->pipeline_cache_uuid, props.pipelineCacheUUID, 16);
  d->shader_float16 = f16_struct && f16.shaderFloat16;
  if (!d->shader_float16) p->f16_via_ext = false;
  d->storage_buffer_16bit_access = s16.storageBuffer16BitAccess;
  d->shader_int64 = feat.features.shaderInt64;
  p->shader_int16 = feat.features.shaderInt16;
  p->shader_float64 = feat.features.shaderFloat64;
  d->max_storage_buffer_range = props.limits.maxStorageBufferRange;
  for (int i = 0; i < 3; i++) {
    d->max_compute_work_group_count[i] = props.limits.maxComputeWorkGroupCount[i];
    d->max_compute_work_group_size[i] = props.limits.maxComputeWorkGroupSize[i];
  }
  d->max_compute_work_group_invocations = props.limits.maxComputeWorkGroupInvocations;
  d->max_per_stage_storage_buffers = props.limits.maxPerStageDescriptorStorageBuffers;
  return true;
}

jit_status jit__vk_instance_create(const jit__vk_instance_options *options,
                                   jit__vk_instance **out_instance) {
  if (!out_instance) return JIT_ERR(JIT_INVALID_ARGUMENT, "Vulkan: out_instance is NULL");
  *out_instance = NULL;
  const char *lib_name = options && options->library ? options->library : "libvulkan.so.1";
  jit__vk_instance *in = calloc(1, sizeof *in);
  if (!in) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "Vulkan: out of memory");
  atomic_init(&in->refs, 1);
  jit_status s = NULL;

  in->lib = dlopen(lib_name, RTLD_NOW | RTLD_LOCAL);
  if (!in->lib) {
    const char *e = dlerror();
    s = JIT_ERR(JIT_UNAVAILABLE,
                "Vulkan: cannot load %s (%s); install a Vulkan loader and driver, e.g. "
                "libvulkan1 and mesa-vulkan-drivers",
                lib_name, e ? e : "not found");
    goto fail;
  }
  in->vkGetInstanceProcAddr = (PFN_vkGetInstanceProcAddr)dlsym(in->lib, "vkGetInstanceProcAddr");
  if (!in->vkGetInstanceProcAddr) {
    s = JIT_ERR(JIT_UNAVAILABLE, "Vulkan: %s has no vkGetInstanceProcAddr", lib_name);
    goto fail;
  }
#define X(n) in->fn.n = (PFN_##n)in->vkGetInstanceProcAddr(NULL, #n);
  JIT__VK_GLOBAL_SYMBOLS(X)
#undef X
  if (!in->fn.vkEnumerateInstanceVersion || !in->fn.vkCreateInstance) {
    s = JIT_ERR(JIT_UNAVAILABLE,
                "Vulkan: %s is a Vulkan 1.0 loader (no vkEnumerateInstanceVersion); "
                "libjitml needs Vulkan 1.1",
                lib_name);
    goto fail;
  }
  uint32_t version = 0;
  if ((s = VK_CALL(&in->fn, vkEnumerateInstanceVersion, &version))) goto fail;
  if (version < VK_API_VERSION_1_1) {
    s = JIT_ERR(JIT_UNAVAILABLE, "Vulkan: the loader supports Vulkan %u.%u; libjitml needs 1.1",
                VK_API_VERSION_MAJOR(version), VK_API_VERSION_MINOR(version));
    goto fail;
  }
  VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO,
                           .pApplicationName = "libjitml",
                           .pEngineName = "libjitml",
                           .apiVersion = VK_API_VERSION_1_1};
  VkInstanceCreateInfo ici = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO,
                              .pApplicationInfo = &app};
  if ((s = VK_CALL(&in->fn, vkCreateInstance, &ici, NULL, &in->vk))) {
    if (jit_status_get_code(s) == JIT_UNAVAILABLE)
      s = jit__status_annotate(s, "no Vulkan driver (ICD) could be loaded");
    goto fail;
  }
#define X(n)                                                                  \
  in->fn.n = (PFN_##n)in->vkGetInstanceProcAddr(in->vk, #n);                  \
  if (!in->fn.n) {                                                            \
    s = JIT_ERR(JIT_UNAVAILABLE, "Vulkan: %s lacks the entry point " #n, lib_name); \
    goto fail;                                                                \
  }
  JIT__VK_INSTANCE_SYMBOLS(X)
#undef X

  uint32_t n = 0;
  if ((s = VK_CALL(&in->fn, vkEnumeratePhysicalDevices, in->vk, &n, NULL))) goto fail;
  VkPhysicalDevice *pds = calloc(n ? n : 1, sizeof *pds);
  in->phys = calloc(n ? n : 1, sizeof *in->phys);
  if (!pds || !in->phys) {
    free(pds);
    s = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "Vulkan: out of memory");
    goto fail;
  }
  if ((s = VK_CALL(&in->fn, vkEnumeratePhysicalDevices, in->vk, &n, pds))) {
    free(pds);
    goto fail;
  }
  for (uint32_t i = 0; i < n; i++) {
    if (describe_phys(in, pds[i], &in->phys[in->n_phys])) {
      in->phys[in->n_phys].info.index = in->n_phys;
      in->n_phys++;
    }
  }
  free(pds);
  if (in->n_phys == 0) {
    s = JIT_ERR(JIT_UNAVAILABLE,
                "Vulkan: no usable device (%u physical device(s), none with Vulkan 1.1 and a "
                "compute queue)",
                n);
    goto fail;
  }
  *out_instance = in;
  return NULL;
fail:
  instance_free(in);
  return s;
}

void jit__vk_instance_release(jit__vk_instance *instance) {
  if (!instance) return;
  if (atomic_fetch_sub(&instance->refs, 1) == 1) instance_free(instance);
}

uint32_t jit__vk_instance_device_count(const jit__vk_instance *instance) {
  return instance ? instance->n_phys : 0;
}

const jit__vk_device_info *jit__vk_instance_device_info(const jit__vk_instance *instance,
                                                        uint32_t index) {
  if (!instance || index >= instance->n_phys) return NULL;
  return &instance->phys[index].info;
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

jit_status jit__vk_instance_select(const jit__vk_instance *instance, const char *selector,
                                   uint32_t *out_index) {
  if (!instance || !out_index)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "Vulkan: select: NULL instance or out_index");
  const char *from = "selector";
  if (!selector) {
    selector = getenv("JITML_VULKAN_DEVICE");
    from = "JITML_VULKAN_DEVICE";
  }
  if (!selector || !*selector) {
    static const jit__vk_device_type order[] = {JIT__VK_TYPE_DISCRETE, JIT__VK_TYPE_INTEGRATED,
                                                JIT__VK_TYPE_VIRTUAL, JIT__VK_TYPE_CPU};
    for (size_t o = 0; o < sizeof order / sizeof order[0]; o++)
      for (uint32_t i = 0; i < instance->n_phys; i++)
        if (instance->phys[i].info.type == order[o]) {
          *out_index = i;
          return NULL;
        }
    *out_index = 0;
    return NULL;
  }
  bool digits = true;
  for (const char *c = selector; *c; c++) digits &= isdigit((unsigned char)*c) != 0;
  for (uint32_t i = 0; i < instance->n_phys; i++) {
    bool match = digits ? strtoul(selector, NULL, 10) == i
                        : contains_nocase(instance->phys[i].info.name, selector);
    if (match) {
      *out_index = i;
      return NULL;
    }
  }
  char list[1024];
  size_t len = 0;
  list[0] = 0;
  for (uint32_t i = 0; i < instance->n_phys && len < sizeof list; i++)
    len += (size_t)snprintf(list + len, sizeof list - len, "%s%u `%s`", i ? ", " : "", i,
                            instance->phys[i].info.name);
  return JIT_ERR(JIT_UNAVAILABLE, "Vulkan: %s=`%s` matches no device (devices: %s)", from,
                 selector, list);
}

//===--- Device -----------------------------------------------------------===//

// Everything one submission owns; freed when its fence has signaled.
typedef struct vk_inflight {
  VkFence fence;
  VkCommandBuffer cmd;
  VkDescriptorPool dpool;
  VkBuffer staging;
  VkDeviceMemory staging_mem;
  void *staging_map;
  struct vk_inflight *next;
} vk_inflight;

struct jit__vk_device {
  jit__vk_instance *inst;
  const vk_phys *phys;
  struct {
#define X(n) PFN_##n n;
    JIT__VK_DEVICE_SYMBOLS(X)
#undef X
  } fn;
  VkDevice vk;
  VkQueue queue;
  VkCommandPool pool;
  VkPipelineCache pcache;
  VkPhysicalDeviceMemoryProperties mem;
  uint64_t timeout_ns;
  bool force_staging;
  bool f16, s16, int64, int16, float64;  // enabled features
  pthread_mutex_t mu;         // queue, command pool, zombies
  pthread_rwlock_t cache_mu;  // pipeline creation (read) vs. merges (write)
  atomic_bool lost;
  vk_inflight *zombies;  // timed-out submissions, guarded by mu
};

static jit_status vk_device_result(jit__vk_device *d, VkResult r, const char *call,
                                   const char *file, int line) {
  if (r == VK_ERROR_DEVICE_LOST) atomic_store(&d->lost, true);
  return vk_result_status(r, call, file, line);
}

static jit_status check_lost(jit__vk_device *d) {
  if (atomic_load(&d->lost))
    return JIT_ERR(JIT_DEVICE_ERROR,
                   "Vulkan: device `%s` was lost (VK_ERROR_DEVICE_LOST) earlier; "
                   "create a new device",
                   d->phys->info.name);
  return NULL;
}

const jit__vk_device_info *jit__vk_device_get_info(const jit__vk_device *device) {
  return device ? &device->phys->info : NULL;
}

jit_status jit__vk_device_create(jit__vk_instance *instance, uint32_t index,
                                 const jit__vk_device_options *options,
                                 jit__vk_device **out_device) {
  if (!out_device) return JIT_ERR(JIT_INVALID_ARGUMENT, "Vulkan: out_device is NULL");
  *out_device = NULL;
  if (!instance) return JIT_ERR(JIT_INVALID_ARGUMENT, "Vulkan: NULL instance");
  if (index >= instance->n_phys)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "Vulkan: device index %u out of range (%u devices)",
                   index, instance->n_phys);
  jit__vk_device *d = calloc(1, sizeof *d);
  if (!d) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "Vulkan: out of memory");
  const vk_phys *p = &instance->phys[index];
  d->phys = p;
  d->timeout_ns = options && options->timeout_ns ? options->timeout_ns
                                                  : JIT__VK_DEFAULT_TIMEOUT_NS;
  d->force_staging = options && options->force_staging;
  atomic_init(&d->lost, false);
  if (pthread_mutex_init(&d->mu, NULL)) {
    free(d);
    return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "Vulkan: pthread_mutex_init failed");
  }
  if (pthread_rwlock_init(&d->cache_mu, NULL)) {
    pthread_mutex_destroy(&d->mu);
    free(d);
    return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "Vulkan: pthread_rwlock_init failed");
  }
  atomic_fetch_add(&instance->refs, 1);
  d->inst = instance;
  jit_status s = NULL;

  d->f16 = p->info.shader_float16;
  d->s16 = p->info.storage_buffer_16bit_access;
  d->int64 = p->info.shader_int64;
  d->int16 = p->shader_int16;
  d->float64 = p->shader_float64;
  VkPhysicalDeviceShaderFloat16Int8Features f16 = {
      .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES,
      .shaderFloat16 = d->f16};
  VkPhysicalDevice16BitStorageFeatures s16 = {
      .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES,
      .pNext = d->f16 ? &f16 : NULL,
      .storageBuffer16BitAccess = d->s16};
  VkPhysicalDeviceFeatures2 feat = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2,
                                    .pNext = &s16};
  feat.features.shaderInt64 = d->int64;
  feat.features.shaderInt16 = d->int16;
  feat.features.shaderFloat64 = d->float64;
  const char *exts[1] = {VK_KHR_SHADER_FLOAT16_INT8_EXTENSION_NAME};
  float prio = 1.0f;
  VkDeviceQueueCreateInfo qci = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
                                 .queueFamilyIndex = p->queue_family,
                                 .queueCount = 1,
                                 .pQueuePriorities = &prio};
  VkDeviceCreateInfo dci = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO,
                            .pNext = &feat,
                            .queueCreateInfoCount = 1,
                            .pQueueCreateInfos = &qci,
                            .enabledExtensionCount = p->f16_via_ext ? 1 : 0,
                            .ppEnabledExtensionNames = exts};
  if ((s = VK_CALL(&instance->fn, vkCreateDevice, p->pd, &dci, NULL, &d->vk))) goto fail;
#define X(n)                                                                           \
  d->fn.n = (PFN_##n)instance->fn.vkGetDeviceProcAddr(d->vk, #n);                      \
  if (!d->fn.n) {                                                                      \
    s = JIT_ERR(JIT_UNAVAILABLE, "Vulkan: device `%s` lacks the entry point " #n,      \
                p->info.name);                                                         \
    goto fail;                                                                         \
  }
  JIT__VK_DEVICE_SYMBOLS(X)
#undef X
  d->fn.vkGetDeviceQueue(d->vk, p->queue_family, 0, &d->queue);
  instance->fn.vkGetPhysicalDeviceMemoryProperties(p->pd, &d->mem);
  VkCommandPoolCreateInfo pci = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
                                 .flags = VK_COMMAND_POOL_CREATE_TRANSIENT_BIT,
                                 .queueFamilyIndex = p->queue_family};
  if ((s = VK_DCALL(d, vkCreateCommandPool, d->vk, &pci, NULL, &d->pool))) goto fail;
  VkPipelineCacheCreateInfo cci = {.sType = VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO};
  if ((s = VK_DCALL(d, vkCreatePipelineCache, d->vk, &cci, NULL, &d->pcache))) goto fail;
  *out_device = d;
  return NULL;
fail:
  s = jit__status_annotate(s, "creating a device on `%s`", p->info.name);
  jit__vk_device_destroy(d);
  return s;
}

// Frees what `f` owns. The command buffer goes back to the pool under the mutex
// unless the caller already holds it (`locked`).
static void inflight_free(jit__vk_device *d, vk_inflight *f, bool locked) {
  if (!f) return;
  if (f->cmd) {
    if (!locked) pthread_mutex_lock(&d->mu);
    d->fn.vkFreeCommandBuffers(d->vk, d->pool, 1, &f->cmd);
    if (!locked) pthread_mutex_unlock(&d->mu);
  }
  if (f->fence) d->fn.vkDestroyFence(d->vk, f->fence, NULL);
  if (f->dpool) d->fn.vkDestroyDescriptorPool(d->vk, f->dpool, NULL);
  if (f->staging) d->fn.vkDestroyBuffer(d->vk, f->staging, NULL);
  if (f->staging_mem) {
    if (f->staging_map) d->fn.vkUnmapMemory(d->vk, f->staging_mem);
    d->fn.vkFreeMemory(d->vk, f->staging_mem, NULL);
  }
  free(f);
}

// Frees timed-out submissions whose fences have signaled since. Called with mu held.
static void reap_zombies_locked(jit__vk_device *d) {
  vk_inflight **pp = &d->zombies;
  while (*pp) {
    vk_inflight *f = *pp;
    VkResult r = d->fn.vkGetFenceStatus(d->vk, f->fence);
    if (r == VK_SUCCESS || r == VK_ERROR_DEVICE_LOST) {
      if (r == VK_ERROR_DEVICE_LOST) atomic_store(&d->lost, true);
      *pp = f->next;
      inflight_free(d, f, true);
    } else {
      pp = &f->next;
    }
  }
}

// Waits up to `timeout_ns` for each parked submission and frees those that finished;
// false if one is still running.
static bool wait_zombies(jit__vk_device *d, uint64_t timeout_ns) {
  pthread_mutex_lock(&d->mu);
  for (vk_inflight *f = d->zombies; f; f = f->next) {
    VkResult r = d->fn.vkWaitForFences(d->vk, 1, &f->fence, VK_TRUE, timeout_ns);
    if (r == VK_TIMEOUT) break;
  }
  reap_zombies_locked(d);
  bool idle = d->zombies == NULL;
  pthread_mutex_unlock(&d->mu);
  return idle;
}

jit_status jit__vk_device_wait(jit__vk_device *device) {
  if (!device) return JIT_ERR(JIT_INVALID_ARGUMENT, "Vulkan: NULL device");
  if (!wait_zombies(device, device->timeout_ns))
    return JIT_ERR(JIT_DEVICE_ERROR, "Vulkan: waiting for `%s` timed out after %.3f s",
                   device->phys->info.name, device->timeout_ns / 1e9);
  return NULL;
}

void jit__vk_device_destroy(jit__vk_device *device) {
  jit__vk_device *d = device;
  if (!d) return;
  bool busy = false;
  if (d->vk && d->fn.vkWaitForFences) {
    uint64_t t = d->timeout_ns > JIT__VK_DEFAULT_TIMEOUT_NS ? d->timeout_ns
                                                            : JIT__VK_DEFAULT_TIMEOUT_NS;
    busy = !wait_zombies(d, t);
  }
  if (busy) {
    // The device still runs work we submitted: destroying it (or the instance, or
    // unloading the driver) could crash the process. Leaking is the lesser harm.
    return;
  }
  if (d->vk) {
    if (d->pcache) d->fn.vkDestroyPipelineCache(d->vk, d->pcache, NULL);
    if (d->pool) d->fn.vkDestroyCommandPool(d->vk, d->pool, NULL);
    if (d->fn.vkDestroyDevice) d->fn.vkDestroyDevice(d->vk, NULL);
  }
  pthread_rwlock_destroy(&d->cache_mu);
  pthread_mutex_destroy(&d->mu);
  jit__vk_instance_release(d->inst);
  free(d);
}

//===--- Submissions ------------------------------------------------------===//

typedef void (*record_fn)(jit__vk_device *d, VkCommandBuffer cmd, void *ctx);
typedef void (*done_fn)(vk_inflight *f, void *ctx);

// Records `record` into a fresh command buffer, submits it with `f`'s new fence and waits
// with the device's timeout; on success calls `done` (may be NULL) before freeing `f`.
// Takes `f` over in every case: frees it when done, or parks it on the zombie list when
// the wait times out. `what` names the work for messages.
static jit_status submit_and_wait(jit__vk_device *d, vk_inflight *f, record_fn record,
                                  done_fn done, void *ctx, const char *what) {
  jit_status s = NULL;
  VkFenceCreateInfo fci = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
  if ((s = VK_DCALL(d, vkCreateFence, d->vk, &fci, NULL, &f->fence))) {
    inflight_free(d, f, false);
    return s;
  }
  pthread_mutex_lock(&d->mu);
  reap_zombies_locked(d);
  if ((s = check_lost(d))) goto unlock_fail;
  VkCommandBufferAllocateInfo cai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                                     .commandPool = d->pool,
                                     .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                                     .commandBufferCount = 1};
  if ((s = VK_DCALL(d, vkAllocateCommandBuffers, d->vk, &cai, &f->cmd))) goto unlock_fail;
  VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                                 .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
  if ((s = VK_DCALL(d, vkBeginCommandBuffer, f->cmd, &bi))) goto unlock_fail;
  record(d, f->cmd, ctx);
  if ((s = VK_DCALL(d, vkEndCommandBuffer, f->cmd))) goto unlock_fail;
  VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO,
                     .commandBufferCount = 1,
                     .pCommandBuffers = &f->cmd};
  if ((s = VK_DCALL(d, vkQueueSubmit, d->queue, 1, &si, f->fence))) goto unlock_fail;
  pthread_mutex_unlock(&d->mu);

  VkResult r = d->fn.vkWaitForFences(d->vk, 1, &f->fence, VK_TRUE, d->timeout_ns);
  if (r == VK_TIMEOUT) {
    pthread_mutex_lock(&d->mu);
    f->next = d->zombies;
    d->zombies = f;
    pthread_mutex_unlock(&d->mu);
    return JIT_ERR(JIT_DEVICE_ERROR, "Vulkan: %s on `%s` timed out after %.3f s", what,
                   d->phys->info.name, d->timeout_ns / 1e9);
  }
  s = vk_device_result(d, r, "vkWaitForFences", __FILE__, __LINE__);
  if (!s && done) done(f, ctx);
  inflight_free(d, f, false);
  return s ? jit__status_annotate(s, "%s on `%s`", what, d->phys->info.name) : NULL;
unlock_fail:
  inflight_free(d, f, true);
  pthread_mutex_unlock(&d->mu);
  return jit__status_annotate(s, "%s on `%s`", what, d->phys->info.name);
}

//===--- Buffers ----------------------------------------------------------===//

struct jit__vk_buffer {
  jit__vk_device *dev;
  uint64_t size;
  VkBuffer buf;
  VkDeviceMemory mem;
  void *map;  // persistent mapping of host-visible coherent memory; NULL: staging path
};

static int find_memory_type(const jit__vk_device *d, uint32_t bits,
                            VkMemoryPropertyFlags want) {
  for (uint32_t i = 0; i < d->mem.memoryTypeCount; i++)
    if ((bits & (1u << i)) && (d->mem.memoryTypes[i].propertyFlags & want) == want)
      return (int)i;
  return -1;
}

// Creates a buffer of `size` bytes and binds memory from the first type that has one of
// the property sets in `wants` (in order; 0 ends the list) and that allocates. Maps the
// memory when `map` is non-NULL and the chosen type is host-visible and coherent.
static jit_status make_buffer(jit__vk_device *d, VkDeviceSize size, VkBufferUsageFlags usage,
                              const VkMemoryPropertyFlags *wants, VkBuffer *out_buf,
                              VkDeviceMemory *out_mem, void **map) {
  *out_buf = VK_NULL_HANDLE;
  *out_mem = VK_NULL_HANDLE;
  if (map) *map = NULL;
  VkBufferCreateInfo bci = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
                            .size = size,
                            .usage = usage,
                            .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
  jit_status s = VK_DCALL(d, vkCreateBuffer, d->vk, &bci, NULL, out_buf);
  if (s) return s;
  VkMemoryRequirements req;
  d->fn.vkGetBufferMemoryRequirements(d->vk, *out_buf, &req);
  int tried = 0;
  for (const VkMemoryPropertyFlags *w = wants; *w; w++) {
    int type = find_memory_type(d, req.memoryTypeBits, *w);
    if (type < 0) continue;
    tried++;
    VkMemoryAllocateInfo mai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
                                .allocationSize = req.size,
                                .memoryTypeIndex = (uint32_t)type};
    jit_status_free(s);
    s = VK_DCALL(d, vkAllocateMemory, d->vk, &mai, NULL, out_mem);
    if (s) {
      *out_mem = VK_NULL_HANDLE;
      // Out of this kind of memory (a small host-visible heap on a discrete GPU):
      // try the next kind.
      if (jit_status_get_code(s) == JIT_RESOURCE_EXHAUSTED) continue;
      break;
    }
    if ((s = VK_DCALL(d, vkBindBufferMemory, d->vk, *out_buf, *out_mem, 0))) break;
    VkMemoryPropertyFlags hv = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT |
                               VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    if (map && (*w & hv) == hv &&
        (s = VK_DCALL(d, vkMapMemory, d->vk, *out_mem, 0, VK_WHOLE_SIZE, 0, map)))
      break;
    return NULL;
  }
  if (!s && !tried)
    s = JIT_ERR(JIT_UNSUPPORTED, "Vulkan: no suitable memory type for a %llu-byte buffer",
                (unsigned long long)size);
  if (*out_mem) d->fn.vkFreeMemory(d->vk, *out_mem, NULL);
  d->fn.vkDestroyBuffer(d->vk, *out_buf, NULL);
  *out_buf = VK_NULL_HANDLE;
  *out_mem = VK_NULL_HANDLE;
  if (map) *map = NULL;
  return s;
}

jit_status jit__vk_buffer_create(jit__vk_device *device, uint64_t bytes,
                                 jit__vk_buffer **out_buffer) {
  if (!out_buffer) return JIT_ERR(JIT_INVALID_ARGUMENT, "Vulkan: out_buffer is NULL");
  *out_buffer = NULL;
  if (!device) return JIT_ERR(JIT_INVALID_ARGUMENT, "Vulkan: NULL device");
  jit__vk_device *d = device;
  JIT_PROPAGATE(check_lost(d));
  if (bytes > d->phys->info.max_storage_buffer_range)
    return JIT_ERR(JIT_UNSUPPORTED,
                   "Vulkan: a %llu-byte buffer is over maxStorageBufferRange (%llu bytes) of "
                   "`%s`",
                   (unsigned long long)bytes,
                   (unsigned long long)d->phys->info.max_storage_buffer_range,
                   d->phys->info.name);
  jit__vk_buffer *b = calloc(1, sizeof *b);
  if (!b) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "Vulkan: out of memory");
  b->dev = d;
  b->size = bytes;
  const VkMemoryPropertyFlags dl = VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT,
                              hvc = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT |
                                    VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
  // Mapped device-local memory (lavapipe, integrated GPUs, resizable BAR) needs no
  // copies; else device-local memory behind staging copies; else host memory.
  const VkMemoryPropertyFlags direct[] = {dl | hvc, dl, hvc, 0};
  const VkMemoryPropertyFlags staged[] = {dl, 0};
  jit_status s = make_buffer(
      d, bytes ? bytes : 4,
      VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
          VK_BUFFER_USAGE_TRANSFER_DST_BIT,
      d->force_staging ? staged : direct, &b->buf, &b->mem, d->force_staging ? NULL : &b->map);
  if (s) {
    free(b);
    return jit__status_annotate(s, "allocating a %llu-byte buffer on `%s`",
                                (unsigned long long)bytes, d->phys->info.name);
  }
  *out_buffer = b;
  return NULL;
}

void jit__vk_buffer_destroy(jit__vk_buffer *buffer) {
  if (!buffer) return;
  jit__vk_device *d = buffer->dev;
  if (buffer->map) d->fn.vkUnmapMemory(d->vk, buffer->mem);
  d->fn.vkDestroyBuffer(d->vk, buffer->buf, NULL);
  d->fn.vkFreeMemory(d->vk, buffer->mem, NULL);
  free(buffer);
}

uint64_t jit__vk_buffer_size(const jit__vk_buffer *buffer) {
  return buffer ? buffer->size : 0;
}

typedef struct copy_ctx {
  VkBuffer src, dst;
  VkBufferCopy region;
  bool download;
  void *host;  // download destination
} copy_ctx;

static void copy_done(vk_inflight *f, void *vctx) {
  copy_ctx *c = vctx;
  if (c->download) memcpy(c->host, f->staging_map, c->region.size);
}

static void record_copy(jit__vk_device *d, VkCommandBuffer cmd, void *vctx) {
  copy_ctx *c = vctx;
  if (c->download) {
    // Kernels' (or copies') writes to the buffer before the copy reads it.
    VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                          .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
                          .dstAccessMask = VK_ACCESS_TRANSFER_READ_BIT};
    d->fn.vkCmdPipelineBarrier(cmd,
                               VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                               VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1, &mb, 0, NULL, 0, NULL);
  }
  d->fn.vkCmdCopyBuffer(cmd, c->src, c->dst, 1, &c->region);
  // Later kernels (uploads) or the host (downloads) see the copy.
  VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                        .srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT,
                        .dstAccessMask = c->download ? VK_ACCESS_HOST_READ_BIT
                                                     : VK_ACCESS_SHADER_READ_BIT |
                                                           VK_ACCESS_SHADER_WRITE_BIT |
                                                           VK_ACCESS_TRANSFER_READ_BIT |
                                                           VK_ACCESS_TRANSFER_WRITE_BIT};
  d->fn.vkCmdPipelineBarrier(cmd, VK_PIPELINE_STAGE_TRANSFER_BIT,
                             c->download ? VK_PIPELINE_STAGE_HOST_BIT
                                         : VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT |
                                               VK_PIPELINE_STAGE_TRANSFER_BIT,
                             0, 1, &mb, 0, NULL, 0, NULL);
}

static jit_status transfer(jit__vk_buffer *b, uint64_t offset, void *host, uint64_t bytes,
                           bool download) {
  const char *what = download ? "download" : "upload";
  if (!b) return JIT_ERR(JIT_INVALID_ARGUMENT, "Vulkan: %s: NULL buffer", what);
  if (bytes && !host) return JIT_ERR(JIT_INVALID_ARGUMENT, "Vulkan: %s: NULL host pointer", what);
  if (offset > b->size || bytes > b->size - offset)
    return JIT_ERR(JIT_INVALID_ARGUMENT,
                   "Vulkan: %s of %llu bytes at offset %llu is outside the %llu-byte buffer",
                   what, (unsigned long long)bytes, (unsigned long long)offset,
                   (unsigned long long)b->size);
  jit__vk_device *d = b->dev;
  JIT_PROPAGATE(check_lost(d));
  if (!bytes) return NULL;
  if (b->map) {
    if (download)
      memcpy(host, (char *)b->map + offset, bytes);
    else
      memcpy((char *)b->map + offset, host, bytes);
    return NULL;
  }
  vk_inflight *f = calloc(1, sizeof *f);
  if (!f) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "Vulkan: out of memory");
  const VkMemoryPropertyFlags host_kinds[] = {
      VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT |
          (download ? VK_MEMORY_PROPERTY_HOST_CACHED_BIT : 0),
      VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT, 0};
  jit_status s = make_buffer(d, bytes,
                             download ? VK_BUFFER_USAGE_TRANSFER_DST_BIT
                                      : VK_BUFFER_USAGE_TRANSFER_SRC_BIT,
                             host_kinds, &f->staging, &f->staging_mem, &f->staging_map);
  if (!s && !f->staging_map)
    s = JIT_ERR(JIT_UNSUPPORTED, "Vulkan: no host-visible coherent memory for staging");
  if (s) {
    inflight_free(d, f, false);
    return jit__status_annotate(s, "%s of %llu bytes", what, (unsigned long long)bytes);
  }
  if (!download) memcpy(f->staging_map, host, bytes);
  copy_ctx c = {.src = download ? b->buf : f->staging,
                .dst = download ? f->staging : b->buf,
                .region = {.srcOffset = download ? offset : 0,
                           .dstOffset = download ? 0 : offset,
                           .size = bytes},
                .download = download,
                .host = host};
  return submit_and_wait(d, f, record_copy, copy_done, &c, what);
}

jit_status jit__vk_buffer_upload(jit__vk_buffer *buffer, uint64_t offset, const void *src,
                                 uint64_t bytes) {
  return transfer(buffer, offset, (void *)src, bytes, false);
}

jit_status jit__vk_buffer_download(jit__vk_buffer *buffer, uint64_t offset, void *dst,
                                   uint64_t bytes) {
  return transfer(buffer, offset, dst, bytes, true);
}

//===--- Pipeline cache ---------------------------------------------------===//

jit_status jit__vk_pipeline_cache_get(jit__vk_device *device, uint8_t **out_bytes,
                                      size_t *out_size) {
  if (!out_bytes || !out_size)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "Vulkan: pipeline cache: NULL output");
  *out_bytes = NULL;
  *out_size = 0;
  if (!device) return JIT_ERR(JIT_INVALID_ARGUMENT, "Vulkan: NULL device");
  jit__vk_device *d = device;
  jit_status s = NULL;
  // Merges write the cache; reading it is safe alongside pipeline creation.
  pthread_rwlock_rdlock(&d->cache_mu);
  size_t size = 0;
  uint8_t *bytes = NULL;
  for (int attempt = 0; attempt < 4; attempt++) {
    if ((s = VK_DCALL(d, vkGetPipelineCacheData, d->vk, d->pcache, &size, NULL))) break;
    free(bytes);
    bytes = malloc(size ? size : 1);
    if (!bytes) {
      s = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "Vulkan: out of memory");
      break;
    }
    VkResult r = d->fn.vkGetPipelineCacheData(d->vk, d->pcache, &size, bytes);
    if (r == VK_INCOMPLETE) continue;  // grew in between: ask again
    s = vk_device_result(d, r, "vkGetPipelineCacheData", __FILE__, __LINE__);
    break;
  }
  pthread_rwlock_unlock(&d->cache_mu);
  if (s || !bytes) {
    free(bytes);
    return s ? s : JIT_ERR(JIT_DEVICE_ERROR, "Vulkan: vkGetPipelineCacheData kept growing");
  }
  *out_bytes = bytes;
  *out_size = size;
  return NULL;
}

jit_status jit__vk_pipeline_cache_merge(jit__vk_device *device, const void *bytes,
                                        size_t size) {
  if (!device) return JIT_ERR(JIT_INVALID_ARGUMENT, "Vulkan: NULL device");
  jit__vk_device *d = device;
  const jit__vk_device_info *info = &d->phys->info;
  const uint8_t *p = bytes;
  // VkPipelineCacheHeaderVersionOne: headerSize, headerVersion, vendorID, deviceID, UUID.
  if (!p || size < 32)
    return JIT_ERR(JIT_CACHE_ERROR,
                   "Vulkan: pipeline cache data of %zu bytes is shorter than its header",
                   p ? size : 0);
  uint32_t header_size = jit__le_get_u32(p), version = jit__le_get_u32(p + 4), vendor = jit__le_get_u32(p + 8),
           dev_id = jit__le_get_u32(p + 12);
  if (header_size < 32 || header_size > size || version != VK_PIPELINE_CACHE_HEADER_VERSION_ONE)
    return JIT_ERR(JIT_CACHE_ERROR,
                   "Vulkan: pipeline cache data has a bad header (size %u, version %u)",
                   header_size, version);
  if (vendor != info->vendor_id || dev_id != info->device_id ||
      memcmp(p + 16, info->pipeline_cache_uuid, 16) != 0)
    return JIT_ERR(JIT_CACHE_ERROR,
                   "Vulkan: pipeline cache data was made for vendor 0x%x device 0x%x (or "
                   "another driver build); this is `%s`, vendor 0x%x device 0x%x",
                   vendor, dev_id, info->name, info->vendor_id, info->device_id);
  JIT_PROPAGATE(check_lost(d));
  VkPipelineCacheCreateInfo cci = {.sType = VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO,
                                   .initialDataSize = size,
                                   .pInitialData = bytes};
  VkPipelineCache src;
  JIT_RETURN_IF_ERROR(VK_DCALL(d, vkCreatePipelineCache, d->vk, &cci, NULL, &src),
                      "loading pipeline cache data");
  pthread_rwlock_wrlock(&d->cache_mu);
  jit_status s = VK_DCALL(d, vkMergePipelineCaches, d->vk, d->pcache, 1, &src);
  pthread_rwlock_unlock(&d->cache_mu);
  d->fn.vkDestroyPipelineCache(d->vk, src, NULL);
  return s;
}

//===--- SPIR-V inspection ------------------------------------------------===//

// What the executable checks before handing a module to the driver: a wrong entry name
// or a capability the device lacks is undefined behaviour in Vulkan (drivers may crash),
// so it is caught here instead.
typedef struct spv_entry {
  const char *name;  // points into the module's words
  uint32_t id;
  uint32_t local[3];
  bool has_local;
} spv_entry;

typedef struct spv_info {
  uint32_t version_minor;
  uint32_t n_entries;
  spv_entry *entries;  // GLCompute entry points only
  bool cap_float16, cap_float64, cap_int64, cap_int16, cap_sb16;
} spv_info;

enum {
  SPV_OP_CAPABILITY = 17,
  SPV_OP_ENTRY_POINT = 15,
  SPV_OP_EXECUTION_MODE = 16,
  SPV_MODEL_GLCOMPUTE = 5,
  SPV_MODE_LOCAL_SIZE = 17,
  SPV_CAP_FLOAT16 = 9,
  SPV_CAP_FLOAT64 = 10,
  SPV_CAP_INT64 = 11,
  SPV_CAP_INT16 = 22,
  SPV_CAP_SB16 = 4433,  // StorageBuffer16BitAccess
};

static jit_status spv_parse(const uint32_t *w, size_t n, spv_info *out) {
  memset(out, 0, sizeof *out);
  if (n < 5 || w[0] != 0x07230203u)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "Vulkan: not a SPIR-V module (magic 0x%08x, %zu words)",
                   n ? w[0] : 0, n);
  if ((w[1] >> 16 & 0xff) != 1)
    return JIT_ERR(JIT_UNSUPPORTED, "Vulkan: SPIR-V version %u.%u", w[1] >> 16 & 0xff,
                   w[1] >> 8 & 0xff);
  out->version_minor = w[1] >> 8 & 0xff;
  size_t cap = 0;
  for (size_t i = 5; i < n;) {
    uint32_t op = w[i] & 0xffff, wc = w[i] >> 16;
    if (wc == 0 || wc > n - i)
      return JIT_ERR(JIT_INVALID_ARGUMENT, "Vulkan: malformed SPIR-V at word %zu", i);
    if (op == SPV_OP_CAPABILITY && wc >= 2) {
      uint32_t c = w[i + 1];
      out->cap_float16 |= c == SPV_CAP_FLOAT16;
      out->cap_float64 |= c == SPV_CAP_FLOAT64;
      out->cap_int64 |= c == SPV_CAP_INT64;
      out->cap_int16 |= c == SPV_CAP_INT16;
      out->cap_sb16 |= c == SPV_CAP_SB16;
    } else if (op == SPV_OP_ENTRY_POINT && wc >= 4 && w[i + 1] == SPV_MODEL_GLCOMPUTE) {
      const char *name = (const char *)&w[i + 3];
      if (!memchr(name, 0, (size_t)(wc - 3) * 4))
        return JIT_ERR(JIT_INVALID_ARGUMENT, "Vulkan: unterminated entry name at word %zu", i);
      if (out->n_entries == cap) {
        cap = cap ? 2 * cap : 8;
        spv_entry *e = realloc(out->entries, cap * sizeof *e);
        if (!e) return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "Vulkan: out of memory");
        out->entries = e;
      }
      out->entries[out->n_entries++] = (spv_entry){.name = name, .id = w[i + 2]};
    } else if (op == SPV_OP_EXECUTION_MODE && wc >= 6 && w[i + 2] == SPV_MODE_LOCAL_SIZE) {
      for (uint32_t e = 0; e < out->n_entries; e++)
        if (out->entries[e].id == w[i + 1]) {
          memcpy(out->entries[e].local, &w[i + 3], sizeof out->entries[e].local);
          out->entries[e].has_local = true;
        }
    }
    i += wc;
  }
  return NULL;
}

//===--- Executables ------------------------------------------------------===//

typedef struct vk_kernel {
  uint32_t pipeline;  // index into pipelines
  uint32_t layout;    // index into layouts
  uint32_t grid[3];
  uint32_t n_args;
  uint32_t first_arg;  // into argv
} vk_kernel;

struct jit__vk_executable {
  jit__vk_device *dev;
  VkShaderModule module;
  uint32_t n_layouts;
  uint32_t *layout_args;  // argument count of each layout
  VkDescriptorSetLayout *set_layouts;
  VkPipelineLayout *pipeline_layouts;
  uint32_t n_pipelines;
  VkPipeline *pipelines;
  uint32_t n_kernels;
  vk_kernel *kernels;
  uint32_t *argv;
  uint32_t total_args;
  uint32_t n_buffers;
  uint64_t *buffer_bytes;
  double create_ms;
};

void jit__vk_executable_destroy(jit__vk_executable *executable) {
  jit__vk_executable *e = executable;
  if (!e) return;
  jit__vk_device *d = e->dev;
  for (uint32_t i = 0; e->pipelines && i < e->n_pipelines; i++)
    if (e->pipelines[i]) d->fn.vkDestroyPipeline(d->vk, e->pipelines[i], NULL);
  for (uint32_t i = 0; i < e->n_layouts; i++) {
    if (e->pipeline_layouts[i])
      d->fn.vkDestroyPipelineLayout(d->vk, e->pipeline_layouts[i], NULL);
    if (e->set_layouts[i]) d->fn.vkDestroyDescriptorSetLayout(d->vk, e->set_layouts[i], NULL);
  }
  if (e->module) d->fn.vkDestroyShaderModule(d->vk, e->module, NULL);
  free(e->layout_args);
  free(e->set_layouts);
  free(e->pipeline_layouts);
  free(e->pipelines);
  free(e->kernels);
  free(e->argv);
  free(e->buffer_bytes);
  free(e);
}

double jit__vk_executable_create_ms(const jit__vk_executable *executable) {
  return executable ? executable->create_ms : 0;
}

// Checks `desc` against the module and the device limits.
static jit_status check_desc(const jit__vk_device *d, const jit__vk_executable_desc *desc,
                             const spv_info *spv, uint32_t *out_entry_of_kernel) {
  const jit__vk_device_info *info = &d->phys->info;
  uint32_t max_minor = info->api_version >= VK_API_VERSION_1_3   ? 6
                       : info->api_version >= VK_API_VERSION_1_2 ? 5
                                                                 : 3;
  if (spv->version_minor > max_minor)
    return JIT_ERR(JIT_UNSUPPORTED, "Vulkan: SPIR-V 1.%u is newer than `%s` accepts (1.%u)",
                   spv->version_minor, info->name, max_minor);
  if ((spv->cap_float16 && !d->f16) || (spv->cap_sb16 && !d->s16))
    return JIT_ERR(JIT_UNSUPPORTED,
                   "Vulkan: the module uses f16 (%s) but `%s` lacks shaderFloat16 or "
                   "storageBuffer16BitAccess",
                   spv->cap_float16 ? "Float16" : "StorageBuffer16BitAccess", info->name);
  if ((spv->cap_int64 && !d->int64) || (spv->cap_int16 && !d->int16) ||
      (spv->cap_float64 && !d->float64))
    return JIT_ERR(JIT_UNSUPPORTED,
                   "Vulkan: the module needs a capability `%s` lacks (%s)", info->name,
                   spv->cap_int64 && !d->int64   ? "Int64"
                   : spv->cap_int16 && !d->int16 ? "Int16"
                                                 : "Float64");
  if (desc->n_buffers && !desc->buffer_bytes)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "Vulkan: %u buffers but no buffer sizes",
                   desc->n_buffers);
  for (uint32_t b = 0; b < desc->n_buffers; b++)
    if (desc->buffer_bytes[b] > info->max_storage_buffer_range)
      return JIT_ERR(JIT_UNSUPPORTED,
                     "Vulkan: buffer %u of %llu bytes is over maxStorageBufferRange (%llu "
                     "bytes) of `%s`",
                     b, (unsigned long long)desc->buffer_bytes[b],
                     (unsigned long long)info->max_storage_buffer_range, info->name);
  for (uint32_t k = 0; k < desc->n_kernels; k++) {
    const jit__vk_kernel_desc *kd = &desc->kernels[k];
    const char *entry = kd->entry ? kd->entry : "(null)";
    int found = -1;
    for (uint32_t e = 0; kd->entry && e < spv->n_entries && found < 0; e++)
      if (!strcmp(spv->entries[e].name, kd->entry)) found = (int)e;
    if (found < 0) {
      char list[512];
      size_t len = 0;
      list[0] = 0;
      for (uint32_t e = 0; e < spv->n_entries && len < sizeof list; e++)
        len += (size_t)snprintf(list + len, sizeof list - len, "%s`%s`", e ? ", " : "",
                                spv->entries[e].name);
      return JIT_ERR(JIT_INVALID_ARGUMENT,
                     "Vulkan: kernel %u: entry point `%s` is not in the module (its compute "
                     "entry points: %s)",
                     k, entry, spv->n_entries ? list : "none");
    }
    out_entry_of_kernel[k] = (uint32_t)found;
    const spv_entry *se = &spv->entries[found];
    if (kd->n_args == 0 || !kd->args)
      return JIT_ERR(JIT_INVALID_ARGUMENT, "Vulkan: kernel %u `%s` has no arguments", k, entry);
    if (kd->n_args > info->max_per_stage_storage_buffers)
      return JIT_ERR(JIT_UNSUPPORTED,
                     "Vulkan: kernel %u `%s` takes %u buffers; `%s` allows %u per stage", k,
                     entry, kd->n_args, info->name, info->max_per_stage_storage_buffers);
    for (uint32_t a = 0; a < kd->n_args; a++)
      if (kd->args[a] >= desc->n_buffers)
        return JIT_ERR(JIT_INVALID_ARGUMENT,
                       "Vulkan: kernel %u `%s` argument %u is buffer %u of %u", k, entry, a,
                       kd->args[a], desc->n_buffers);
    for (int i = 0; i < 3; i++)
      if (kd->grid[i] > info->max_compute_work_group_count[i])
        return JIT_ERR(JIT_UNSUPPORTED,
                       "Vulkan: kernel %u `%s` grid[%d] = %u is over "
                       "maxComputeWorkGroupCount (%u) of `%s`",
                       k, entry, i, kd->grid[i], info->max_compute_work_group_count[i],
                       info->name);
    bool block_given = kd->block[0] || kd->block[1] || kd->block[2];
    if (se->has_local) {
      if (block_given && memcmp(kd->block, se->local, sizeof se->local) != 0)
        return JIT_ERR(JIT_INVALID_ARGUMENT,
                       "Vulkan: kernel %u `%s`: block %ux%ux%u but the module's LocalSize "
                       "is %ux%ux%u",
                       k, entry, kd->block[0], kd->block[1], kd->block[2], se->local[0],
                       se->local[1], se->local[2]);
      uint64_t inv = (uint64_t)se->local[0] * se->local[1] * se->local[2];
      for (int i = 0; i < 3; i++)
        if (se->local[i] > info->max_compute_work_group_size[i])
          inv = UINT64_MAX;
      if (inv > info->max_compute_work_group_invocations)
        return JIT_ERR(JIT_UNSUPPORTED,
                       "Vulkan: kernel %u `%s`: LocalSize %ux%ux%u is over the limits of "
                       "`%s` (%u invocations, %ux%ux%u)",
                       k, entry, se->local[0], se->local[1], se->local[2], info->name,
                       info->max_compute_work_group_invocations,
                       info->max_compute_work_group_size[0],
                       info->max_compute_work_group_size[1],
                       info->max_compute_work_group_size[2]);
    }
  }
  return NULL;
}

jit_status jit__vk_executable_create(jit__vk_device *device,
                                     const jit__vk_executable_desc *desc,
                                     jit__vk_executable **out_executable) {
  if (!out_executable) return JIT_ERR(JIT_INVALID_ARGUMENT, "Vulkan: out_executable is NULL");
  *out_executable = NULL;
  if (!device || !desc)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "Vulkan: executable: NULL device or description");
  jit__vk_device *d = device;
  JIT_PROPAGATE(check_lost(d));
  if (!desc->spirv || desc->spirv_size == 0 || desc->spirv_size % 4)
    return JIT_ERR(JIT_INVALID_ARGUMENT,
                   "Vulkan: SPIR-V must be a non-empty multiple of 4 bytes (got %zu)",
                   desc->spirv ? desc->spirv_size : 0);
  if (desc->n_kernels == 0 || !desc->kernels)
    return JIT_ERR(JIT_INVALID_ARGUMENT, "Vulkan: an executable needs at least one kernel");

  jit_status s = NULL;
  size_t n_words = desc->spirv_size / 4;
  uint32_t *words = malloc(desc->spirv_size);  // aligned copy
  uint32_t *entry_of = calloc(desc->n_kernels, sizeof *entry_of);
  jit__vk_executable *e = calloc(1, sizeof *e);
  spv_info spv = {0};
  if (!words || !entry_of || !e) {
    s = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "Vulkan: out of memory");
    goto done;
  }
  memcpy(words, desc->spirv, desc->spirv_size);
  e->dev = d;
  if ((s = spv_parse(words, n_words, &spv))) goto done;
  if ((s = check_desc(d, desc, &spv, entry_of))) goto done;

  uint32_t nk = desc->n_kernels;
  e->n_kernels = nk;
  e->n_buffers = desc->n_buffers;
  for (uint32_t k = 0; k < nk; k++) e->total_args += desc->kernels[k].n_args;
  e->kernels = calloc(nk, sizeof *e->kernels);
  e->argv = calloc(e->total_args, sizeof *e->argv);
  e->buffer_bytes = calloc(desc->n_buffers ? desc->n_buffers : 1, sizeof *e->buffer_bytes);
  e->layout_args = calloc(nk, sizeof *e->layout_args);
  e->set_layouts = calloc(nk, sizeof *e->set_layouts);
  e->pipeline_layouts = calloc(nk, sizeof *e->pipeline_layouts);
  e->pipelines = calloc(nk, sizeof *e->pipelines);
  uint32_t *pipe_kernel = calloc(nk, sizeof *pipe_kernel);  // first kernel of each pipeline
  VkComputePipelineCreateInfo *pci = calloc(nk, sizeof *pci);
  if (!e->kernels || !e->argv || !e->buffer_bytes || !e->layout_args || !e->set_layouts ||
      !e->pipeline_layouts || !e->pipelines || !pipe_kernel || !pci) {
    free(pipe_kernel);
    free(pci);
    s = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "Vulkan: out of memory");
    goto done;
  }
  if (desc->n_buffers)
    memcpy(e->buffer_bytes, desc->buffer_bytes, desc->n_buffers * sizeof *e->buffer_bytes);

  double t0 = jit__now_ms();
  VkShaderModuleCreateInfo smci = {.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO,
                                   .codeSize = desc->spirv_size,
                                   .pCode = words};
  if ((s = VK_DCALL(d, vkCreateShaderModule, d->vk, &smci, NULL, &e->module))) goto free_tmp;

  uint32_t next_arg = 0;
  for (uint32_t k = 0; k < nk; k++) {
    const jit__vk_kernel_desc *kd = &desc->kernels[k];
    vk_kernel *kk = &e->kernels[k];
    memcpy(kk->grid, kd->grid, sizeof kk->grid);
    kk->n_args = kd->n_args;
    kk->first_arg = next_arg;
    memcpy(e->argv + next_arg, kd->args, kd->n_args * sizeof *kd->args);
    next_arg += kd->n_args;
    // One set layout and pipeline layout per distinct argument count.
    uint32_t l = 0;
    while (l < e->n_layouts && e->layout_args[l] != kd->n_args) l++;
    if (l == e->n_layouts) {
      VkDescriptorSetLayoutBinding *bind = calloc(kd->n_args, sizeof *bind);
      if (!bind) {
        s = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "Vulkan: out of memory");
        goto free_tmp;
      }
      for (uint32_t a = 0; a < kd->n_args; a++)
        bind[a] = (VkDescriptorSetLayoutBinding){.binding = a,
                                                 .descriptorType =
                                                     VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                                 .descriptorCount = 1,
                                                 .stageFlags = VK_SHADER_STAGE_COMPUTE_BIT};
      VkDescriptorSetLayoutCreateInfo lci = {
          .sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO,
          .bindingCount = kd->n_args,
          .pBindings = bind};
      e->layout_args[l] = kd->n_args;
      e->n_layouts++;
      s = VK_DCALL(d, vkCreateDescriptorSetLayout, d->vk, &lci, NULL, &e->set_layouts[l]);
      free(bind);
      if (s) goto free_tmp;
      VkPipelineLayoutCreateInfo plci = {.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO,
                                         .setLayoutCount = 1,
                                         .pSetLayouts = &e->set_layouts[l]};
      if ((s = VK_DCALL(d, vkCreatePipelineLayout, d->vk, &plci, NULL,
                        &e->pipeline_layouts[l])))
        goto free_tmp;
    }
    kk->layout = l;
    // One pipeline per distinct (entry point, layout).
    uint32_t p = 0;
    while (p < e->n_pipelines &&
           !(entry_of[pipe_kernel[p]] == entry_of[k] && e->kernels[pipe_kernel[p]].layout == l))
      p++;
    if (p == e->n_pipelines) {
      pipe_kernel[p] = k;
      pci[p] = (VkComputePipelineCreateInfo){
          .sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
          .stage = {.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                    .stage = VK_SHADER_STAGE_COMPUTE_BIT,
                    .module = e->module,
                    .pName = spv.entries[entry_of[k]].name},
          .layout = e->pipeline_layouts[l],
          .basePipelineIndex = -1};
      e->n_pipelines++;
    }
    kk->pipeline = p;
  }
  pthread_rwlock_rdlock(&d->cache_mu);
  s = VK_DCALL(d, vkCreateComputePipelines, d->vk, d->pcache, e->n_pipelines, pci, NULL,
               e->pipelines);
  pthread_rwlock_unlock(&d->cache_mu);
  e->create_ms = jit__now_ms() - t0;
free_tmp:
  free(pipe_kernel);
  free(pci);
done:
  free(words);
  free(entry_of);
  free(spv.entries);
  if (s) {
    jit__vk_executable_destroy(e);
    return jit__status_annotate(s, "creating an executable on `%s`", d->phys->info.name);
  }
  *out_executable = e;
  return NULL;
}

typedef struct run_ctx {
  const jit__vk_executable *e;
  const VkDescriptorSet *sets;
  const uint32_t (*grids)[3];  // NULL: the kernels' own
} run_ctx;

static void record_run(jit__vk_device *d, VkCommandBuffer cmd, void *vctx) {
  const run_ctx *c = vctx;
  const jit__vk_executable *e = c->e;
  uint32_t bound = UINT32_MAX;
  for (uint32_t k = 0; k < e->n_kernels; k++) {
    const vk_kernel *kk = &e->kernels[k];
    if (k > 0) {
      // Each kernel may read what the previous ones wrote (and overwrite what they read).
      VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                            .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT,
                            .dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT};
      d->fn.vkCmdPipelineBarrier(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                                 VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &mb, 0, NULL, 0,
                                 NULL);
    }
    if (kk->pipeline != bound) {
      d->fn.vkCmdBindPipeline(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, e->pipelines[kk->pipeline]);
      bound = kk->pipeline;
    }
    d->fn.vkCmdBindDescriptorSets(cmd, VK_PIPELINE_BIND_POINT_COMPUTE,
                                  e->pipeline_layouts[kk->layout], 0, 1, &c->sets[k], 0, NULL);
    const uint32_t *grid = c->grids ? c->grids[k] : kk->grid;
    if (grid[0] && grid[1] && grid[2]) d->fn.vkCmdDispatch(cmd, grid[0], grid[1], grid[2]);
  }
  // The host (mapped memory) and later copies see the results.
  VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                        .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT,
                        .dstAccessMask = VK_ACCESS_HOST_READ_BIT | VK_ACCESS_TRANSFER_READ_BIT};
  d->fn.vkCmdPipelineBarrier(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                             VK_PIPELINE_STAGE_HOST_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1,
                             &mb, 0, NULL, 0, NULL);
}

jit_status jit__vk_run_grids(jit__vk_executable *executable, jit__vk_buffer *const *buffers,
                             uint32_t n_buffers, const uint32_t (*grids)[3]) {
  jit__vk_executable *e = executable;
  if (!e) return JIT_ERR(JIT_INVALID_ARGUMENT, "Vulkan: run: NULL executable");
  jit__vk_device *d = e->dev;
  const jit__vk_device_info *info = jit__vk_device_get_info(d);
  for (uint32_t k = 0; grids && k < e->n_kernels; k++)
    for (int i = 0; i < 3; i++)
      if (grids[k][i] > info->max_compute_work_group_count[i])
        return JIT_ERR(JIT_UNSUPPORTED, "Vulkan: run: kernel %u grid[%d] = %u is over "
                       "maxComputeWorkGroupCount (%u) of `%s`", k, i, grids[k][i],
                       info->max_compute_work_group_count[i], info->name);
  if (n_buffers != e->n_buffers || (n_buffers && !buffers))
    return JIT_ERR(JIT_INVALID_ARGUMENT, "Vulkan: run: %u buffers given, the executable has %u",
                   n_buffers, e->n_buffers);
  for (uint32_t b = 0; b < n_buffers; b++) {
    if (!buffers[b]) return JIT_ERR(JIT_INVALID_ARGUMENT, "Vulkan: run: buffer %u is NULL", b);
    if (buffers[b]->dev != d)
      return JIT_ERR(JIT_INVALID_ARGUMENT, "Vulkan: run: buffer %u belongs to another device", b);
    if (buffers[b]->size < e->buffer_bytes[b])
      return JIT_ERR(JIT_INVALID_ARGUMENT,
                     "Vulkan: run: buffer %u has %llu bytes, the executable needs %llu", b,
                     (unsigned long long)buffers[b]->size,
                     (unsigned long long)e->buffer_bytes[b]);
  }
  JIT_PROPAGATE(check_lost(d));

  jit_status s = NULL;
  vk_inflight *f = calloc(1, sizeof *f);
  VkDescriptorSetLayout *layouts = calloc(e->n_kernels, sizeof *layouts);
  VkDescriptorSet *sets = calloc(e->n_kernels, sizeof *sets);
  VkDescriptorBufferInfo *bi = calloc(e->total_args, sizeof *bi);
  VkWriteDescriptorSet *wr = calloc(e->total_args, sizeof *wr);
  if (!f || !layouts || !sets || !bi || !wr) {
    free(f);
    f = NULL;
    s = JIT_ERR(JIT_RESOURCE_EXHAUSTED, "Vulkan: out of memory");
    goto done;
  }
  VkDescriptorPoolSize ps = {.type = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                             .descriptorCount = e->total_args};
  VkDescriptorPoolCreateInfo dpci = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO,
                                     .maxSets = e->n_kernels,
                                     .poolSizeCount = 1,
                                     .pPoolSizes = &ps};
  if ((s = VK_DCALL(d, vkCreateDescriptorPool, d->vk, &dpci, NULL, &f->dpool))) goto done;
  for (uint32_t k = 0; k < e->n_kernels; k++) layouts[k] = e->set_layouts[e->kernels[k].layout];
  VkDescriptorSetAllocateInfo dsai = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO,
                                      .descriptorPool = f->dpool,
                                      .descriptorSetCount = e->n_kernels,
                                      .pSetLayouts = layouts};
  if ((s = VK_DCALL(d, vkAllocateDescriptorSets, d->vk, &dsai, sets))) goto done;
  for (uint32_t k = 0; k < e->n_kernels; k++) {
    const vk_kernel *kk = &e->kernels[k];
    for (uint32_t a = 0; a < kk->n_args; a++) {
      uint32_t i = kk->first_arg + a;
      bi[i] = (VkDescriptorBufferInfo){.buffer = buffers[e->argv[i]]->buf,
                                       .offset = 0,
                                       .range = VK_WHOLE_SIZE};
      wr[i] = (VkWriteDescriptorSet){.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET,
                                     .dstSet = sets[k],
                                     .dstBinding = a,
                                     .descriptorCount = 1,
                                     .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                     .pBufferInfo = &bi[i]};
    }
  }
  d->fn.vkUpdateDescriptorSets(d->vk, e->total_args, wr, 0, NULL);
  run_ctx c = {.e = e, .sets = sets, .grids = grids};
  s = submit_and_wait(d, f, record_run, NULL, &c, "run");
  f = NULL;  // taken over
done:
  if (f) inflight_free(d, f, false);
  free(layouts);
  free(sets);
  free(bi);
  free(wr);
  return s;
}

#endif  // JITML_HAVE_VULKAN
