//===--- gpu_plan.c - a GPU launch plan, as data --------------------------===//
#include "base/gpu_plan.h"

#include <stdlib.h>
#include <string.h>

void jit__gpu_plan_release(jit__gpu_plan *plan) {
  if (!plan) return;
  for (uint32_t i = 0; plan->kernels && i < plan->n_kernels; i++) free(plan->kernels[i].args);
  free(plan->kernels);
  free(plan->buffers);
  free(plan->code);
  free(plan->sizes);
  memset(plan, 0, sizeof *plan);
}
