//===--- registry.c - the backends this build knows ------------------------===//
//
// The one list of backends: jit/device.c walks it and names none of them. A backend
// compiled out of this build still has its row; its constructor then reports
// JIT_UNAVAILABLE.
//
//===----------------------------------------------------------------------===//
#include "devices/device.h"

const jit__backend_entry jit__backends[JIT__N_BACKENDS] = {
    {JIT_DEVICE_CPU, "cpu", kDLCPU, jit__cpu_backend_create},
    {JIT_DEVICE_VULKAN, "vulkan", kDLVulkan, jit__vulkan_backend_create},
    {JIT_DEVICE_CUDA, "cuda", kDLCUDA, jit__cuda_backend_create},
};
