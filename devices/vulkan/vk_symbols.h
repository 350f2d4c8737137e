//===--- vk_symbols.h - the Vulkan entry points libjitml uses (X-macros) ---===//
//
// libvulkan.so.1 is opened with dlopen, so nothing here is linked. Each list is an
// X-macro: `X(name)` is expanded once to declare a `PFN_name name;` field in a table
// and once to resolve it. Symbols come in the loader's three levels:
//   - loader:   dlsym on the library (only vkGetInstanceProcAddr);
//   - global:   vkGetInstanceProcAddr(NULL, name), before an instance exists;
//   - instance: vkGetInstanceProcAddr(instance, name);
//   - device:   vkGetDeviceProcAddr(device, name), which skips the loader trampoline.
// Every symbol listed is core Vulkan 1.0 or 1.1; a missing one makes the backend report
// JIT_UNAVAILABLE naming it. Add a symbol by adding it to the right list.
// (After IREE hal/drivers/vulkan/dynamic_symbol_tables.h.)
//
//===----------------------------------------------------------------------===//
#ifndef JITML_DEVICES_VULKAN_VK_SYMBOLS_H_
#define JITML_DEVICES_VULKAN_VK_SYMBOLS_H_

#define JIT__VK_GLOBAL_SYMBOLS(X) \
  X(vkEnumerateInstanceVersion)   \
  X(vkCreateInstance)

#define JIT__VK_INSTANCE_SYMBOLS(X)            \
  X(vkDestroyInstance)                         \
  X(vkEnumeratePhysicalDevices)                \
  X(vkGetPhysicalDeviceProperties)             \
  X(vkGetPhysicalDeviceFeatures)               \
  X(vkGetPhysicalDeviceFeatures2)              \
  X(vkGetPhysicalDeviceQueueFamilyProperties)  \
  X(vkGetPhysicalDeviceMemoryProperties)       \
  X(vkEnumerateDeviceExtensionProperties)      \
  X(vkCreateDevice)                            \
  X(vkGetDeviceProcAddr)

#define JIT__VK_DEVICE_SYMBOLS(X)     \
  X(vkDestroyDevice)                  \
  X(vkGetDeviceQueue)                 \
  X(vkQueueSubmit)                    \
  X(vkCreateCommandPool)              \
  X(vkDestroyCommandPool)             \
  X(vkAllocateCommandBuffers)         \
  X(vkFreeCommandBuffers)             \
  X(vkBeginCommandBuffer)             \
  X(vkEndCommandBuffer)               \
  X(vkCmdBindPipeline)                \
  X(vkCmdBindDescriptorSets)          \
  X(vkCmdDispatch)                    \
  X(vkCmdPipelineBarrier)             \
  X(vkCmdCopyBuffer)                  \
  X(vkCreateFence)                    \
  X(vkDestroyFence)                   \
  X(vkWaitForFences)                  \
  X(vkGetFenceStatus)                 \
  X(vkCreateBuffer)                   \
  X(vkDestroyBuffer)                  \
  X(vkGetBufferMemoryRequirements)    \
  X(vkAllocateMemory)                 \
  X(vkFreeMemory)                     \
  X(vkBindBufferMemory)               \
  X(vkMapMemory)                      \
  X(vkUnmapMemory)                    \
  X(vkCreateShaderModule)             \
  X(vkDestroyShaderModule)            \
  X(vkCreateDescriptorSetLayout)      \
  X(vkDestroyDescriptorSetLayout)     \
  X(vkCreatePipelineLayout)           \
  X(vkDestroyPipelineLayout)          \
  X(vkCreateComputePipelines)         \
  X(vkDestroyPipeline)                \
  X(vkCreatePipelineCache)            \
  X(vkDestroyPipelineCache)           \
  X(vkGetPipelineCacheData)           \
  X(vkMergePipelineCaches)            \
  X(vkCreateDescriptorPool)           \
  X(vkDestroyDescriptorPool)          \
  X(vkAllocateDescriptorSets)         \
  X(vkUpdateDescriptorSets)

#endif  // JITML_DEVICES_VULKAN_VK_SYMBOLS_H_
