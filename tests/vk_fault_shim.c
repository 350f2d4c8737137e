//===--- vk_fault_shim.c - a Vulkan library that can lose its device ------===//
//
// Loaded by tests in place of libvulkan.so.1 (jit__vk_instance_options.library). It
// forwards every entry point to the real loader except the ones that report a device
// loss, which it can make fail on demand, as a GPU reset or a driver crash would:
//   jitml_vk_fault(JITML_VK_LOSE_ON_SUBMIT)  vkQueueSubmit returns VK_ERROR_DEVICE_LOST
//   jitml_vk_fault(JITML_VK_LOSE_ON_WAIT)    the work runs, then vkWaitForFences and
//                                            vkGetFenceStatus return VK_ERROR_DEVICE_LOST
//   jitml_vk_fault(JITML_VK_FAULT_NONE)      everything forwarded again
// lavapipe never loses its device, so this is how the backend's handling is tested.
//
//===----------------------------------------------------------------------===//
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include <vulkan/vulkan.h>

#include "vk_fault_shim.h"

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static void *g_lib;
static PFN_vkGetInstanceProcAddr g_gipa;
static PFN_vkGetDeviceProcAddr g_gdpa;
static PFN_vkQueueSubmit g_submit;
static PFN_vkWaitForFences g_wait;
static PFN_vkGetFenceStatus g_fence_status;
static atomic_int g_mode;

__attribute__((visibility("default"))) void jitml_vk_fault(int mode) {
  atomic_store(&g_mode, mode);
}

static void shim_load(void) {
  g_lib = dlopen("libvulkan.so.1", RTLD_NOW | RTLD_LOCAL);
  if (g_lib) g_gipa = (PFN_vkGetInstanceProcAddr)dlsym(g_lib, "vkGetInstanceProcAddr");
}

static VKAPI_ATTR VkResult VKAPI_CALL shim_submit(VkQueue q, uint32_t n,
                                                  const VkSubmitInfo *si, VkFence fence) {
  if (atomic_load(&g_mode) == JITML_VK_LOSE_ON_SUBMIT) return VK_ERROR_DEVICE_LOST;
  return g_submit(q, n, si, fence);
}

static VKAPI_ATTR VkResult VKAPI_CALL shim_wait(VkDevice d, uint32_t n, const VkFence *f,
                                                VkBool32 all, uint64_t timeout) {
  VkResult r = g_wait(d, n, f, all, timeout);
  return atomic_load(&g_mode) == JITML_VK_LOSE_ON_WAIT ? VK_ERROR_DEVICE_LOST : r;
}

static VKAPI_ATTR VkResult VKAPI_CALL shim_fence_status(VkDevice d, VkFence f) {
  VkResult r = g_fence_status(d, f);
  return atomic_load(&g_mode) == JITML_VK_LOSE_ON_WAIT ? VK_ERROR_DEVICE_LOST : r;
}

// The shim's replacement for `name`, given the real function `real` (NULL if none).
static PFN_vkVoidFunction shim_wrap(const char *name, PFN_vkVoidFunction real) {
  if (!real) return NULL;
  if (!strcmp(name, "vkQueueSubmit")) {
    g_submit = (PFN_vkQueueSubmit)real;
    return (PFN_vkVoidFunction)shim_submit;
  }
  if (!strcmp(name, "vkWaitForFences")) {
    g_wait = (PFN_vkWaitForFences)real;
    return (PFN_vkVoidFunction)shim_wait;
  }
  if (!strcmp(name, "vkGetFenceStatus")) {
    g_fence_status = (PFN_vkGetFenceStatus)real;
    return (PFN_vkVoidFunction)shim_fence_status;
  }
  return real;
}

static VKAPI_ATTR PFN_vkVoidFunction VKAPI_CALL shim_gdpa(VkDevice d, const char *name) {
  return shim_wrap(name, g_gdpa(d, name));
}

__attribute__((visibility("default"))) VKAPI_ATTR PFN_vkVoidFunction VKAPI_CALL
vkGetInstanceProcAddr(VkInstance instance, const char *name) {
  pthread_once(&g_once, shim_load);
  if (!g_gipa) return NULL;
  if (!strcmp(name, "vkGetInstanceProcAddr")) return (PFN_vkVoidFunction)vkGetInstanceProcAddr;
  PFN_vkVoidFunction real = g_gipa(instance, name);
  if (!strcmp(name, "vkGetDeviceProcAddr")) {
    if (!real) return NULL;
    g_gdpa = (PFN_vkGetDeviceProcAddr)real;
    return (PFN_vkVoidFunction)shim_gdpa;
  }
  return shim_wrap(name, real);
}
