//===--- gpu_images.h - a GPU kernel's images (internal to lowering/) -----===//
#ifndef JITML_LOWERING_GPU_IMAGES_H_
#define JITML_LOWERING_GPU_IMAGES_H_

#include "lowering/gpu.h"

// Fills a->n_images, images (and for PTX with t->cubin: cubin, notes) after the
// pipeline made a->binary (gpu_target.c). Only running out of memory is an error: a
// missing or failing ptxas leaves the PTX alone, with `missing=` in the notes.
jit_status jit__gpu_make_images(const jit__gpu_target *t, jit__gpu_artifact *a);

#endif  // JITML_LOWERING_GPU_IMAGES_H_
