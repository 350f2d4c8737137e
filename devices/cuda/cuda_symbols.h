//===--- cuda_symbols.h - the CUDA Driver API entry points libjitml uses ---===//
//
// libcuda.so.1 is opened with dlopen, so nothing here is linked. The list is an
// X-macro: `X(name, (parameters))` is expanded once to declare a field
// `CUresult (CUDAAPI *name)(parameters);` in the table and once to resolve it with
// dlsym(library, "name"). Names are the versioned ABI symbols that cuda.h's macros map
// the plain names to (cuMemAlloc -> cuMemAlloc_v2), all present since CUDA 11.0
// drivers; a missing one makes the backend report JIT_UNAVAILABLE naming it. Add a
// symbol by adding a line here. Include after cuda.h.
// (After IREE hal/drivers/cuda/cuda_dynamic_symbol_table.h.)
//
//===----------------------------------------------------------------------===//
#ifndef JITML_DEVICES_CUDA_CUDA_SYMBOLS_H_
#define JITML_DEVICES_CUDA_CUDA_SYMBOLS_H_

#define JIT__CU_SYMBOLS(X)                                                            \
  X(cuGetErrorName, (CUresult error, const char **pStr))                              \
  X(cuGetErrorString, (CUresult error, const char **pStr))                            \
  X(cuInit, (unsigned int Flags))                                                     \
  X(cuDriverGetVersion, (int *driverVersion))                                         \
  X(cuDeviceGetCount, (int *count))                                                   \
  X(cuDeviceGet, (CUdevice *device, int ordinal))                                     \
  X(cuDeviceGetName, (char *name, int len, CUdevice dev))                             \
  X(cuDeviceGetUuid, (CUuuid *uuid, CUdevice dev))                                    \
  X(cuDeviceGetAttribute, (int *pi, CUdevice_attribute attrib, CUdevice dev))         \
  X(cuDeviceTotalMem_v2, (size_t *bytes, CUdevice dev))                               \
  X(cuDevicePrimaryCtxRetain, (CUcontext *pctx, CUdevice dev))                        \
  X(cuDevicePrimaryCtxRelease_v2, (CUdevice dev))                                     \
  X(cuCtxPushCurrent_v2, (CUcontext ctx))                                             \
  X(cuCtxPopCurrent_v2, (CUcontext *pctx))                                            \
  X(cuMemAlloc_v2, (CUdeviceptr *dptr, size_t bytesize))                              \
  X(cuMemFree_v2, (CUdeviceptr dptr))                                                 \
  X(cuMemcpyHtoD_v2, (CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount))  \
  X(cuMemcpyDtoH_v2, (void *dstHost, CUdeviceptr srcDevice, size_t ByteCount))        \
  X(cuMemcpyDtoD_v2, (CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)) \
  X(cuMemsetD8_v2, (CUdeviceptr dstDevice, unsigned char uc, size_t N))               \
  X(cuPointerGetAttribute, (void *data, CUpointer_attribute attribute, CUdeviceptr ptr)) \
  X(cuModuleLoadDataEx, (CUmodule *module, const void *image, unsigned int numOptions, \
                         CUjit_option *options, void **optionValues))                 \
  X(cuModuleUnload, (CUmodule hmod))                                                  \
  X(cuModuleGetFunction, (CUfunction *hfunc, CUmodule hmod, const char *name))        \
  X(cuLaunchKernel, (CUfunction f, unsigned int gridDimX, unsigned int gridDimY,      \
                     unsigned int gridDimZ, unsigned int blockDimX,                   \
                     unsigned int blockDimY, unsigned int blockDimZ,                  \
                     unsigned int sharedMemBytes, CUstream hStream,                   \
                     void **kernelParams, void **extra))                              \
  X(cuStreamQuery, (CUstream hStream))
// cuStreamSynchronize is deliberately absent: it cannot time out, and every wait here
// is bounded (cuStreamQuery polled against a deadline).

#endif  // JITML_DEVICES_CUDA_CUDA_SYMBOLS_H_
