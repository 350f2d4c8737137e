//===--- image.h - the code a device runs, and the images of a kernel -----===//
//
// Three modules meet in these two enums: lowering/ makes images of a kernel for the
// code a device runs, cache/ keeps them as the parts of an entry's payload, and a
// backend (devices/) loads the one it takes. jit/ passes them along without looking:
// a backend with a new kind of code adds it here, makes it in lowering/ and loads it in
// devices/.
//
//===----------------------------------------------------------------------===//
#ifndef JITML_BASE_IMAGE_H_
#define JITML_BASE_IMAGE_H_

#include <stddef.h>

// The code a device runs. Thread-safe: a constant.
typedef enum jit__code {
  JIT__CODE_HOST = 0,   // host object code (the CPU)
  JIT__CODE_SPIRV = 1,  // SPIR-V compute modules
  JIT__CODE_PTX = 2,    // PTX text (and cubins for the device's chip)
} jit__code;

// The kind of one image. The values are the cache's payload kinds (cache/cache.h), so
// an entry's parts are its images. Thread-safe: a constant.
typedef enum jit__image_format {
  JIT__IMAGE_HOST_OBJECT = 1,  // an ELF object for the host CPU
  JIT__IMAGE_PTX = 2,
  JIT__IMAGE_CUBIN = 3,
  JIT__IMAGE_SPIRV = 4,
} jit__image_format;

// Image bytes, borrowed. Thread-compatible: a value.
typedef struct jit__image {
  jit__image_format format;
  const void *bytes;
  size_t size;
} jit__image;

#endif  // JITML_BASE_IMAGE_H_
