//===--- vk_fault_shim.h - modes of the device-losing Vulkan shim ---------===//
#ifndef JITML_TESTS_VK_FAULT_SHIM_H_
#define JITML_TESTS_VK_FAULT_SHIM_H_

enum {
  JITML_VK_FAULT_NONE = 0,
  JITML_VK_LOSE_ON_SUBMIT = 1,
  JITML_VK_LOSE_ON_WAIT = 2,
};

// Exported by the shim library; tests find it with dlsym.
typedef void (*jitml_vk_fault_fn)(int mode);

#endif  // JITML_TESTS_VK_FAULT_SHIM_H_
