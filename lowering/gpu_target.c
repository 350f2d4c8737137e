//===--- gpu_target.c - what to compile for a device, and a kernel's images ===//
//
// The two ends of a GPU compile that depend on the device's kind of code: choosing the
// target from the device's description (jit/ passes what the backend lists, and
// never looks at the code kind itself), and, after the pipeline, the images the cache
// keeps and the backend loads, best first. For PTX that is a cubin for the device's
// SM assembled by a CUDA toolkit's ptxas (lowering/ptxas.h), then the PTX itself: a
// missing or failing ptxas only costs the cubin, and the artifact's notes keep why.
//
// ptxas is looked for once per toolkit directory per process (a `ptxas --version`
// costs ~10 ms), under a lock.
//
//===----------------------------------------------------------------------===//
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/text.h"
#include "lowering/gpu.h"
#include "lowering/gpu_images.h"
#include "lowering/ptxas.h"

jit_status jit__gpu_target_for(const jit__gpu_device *dev, const jit__lgraph *lg,
                               jit__gpu_target *t) {
  memset(t, 0, sizeof(*t));
  const char *name = lg->name ? lg->name : "graph";
  if (dev->code != JIT__CODE_PTX && dev->code != JIT__CODE_SPIRV)
    return JIT_ERR(JIT_UNSUPPORTED, "graph `%s`: %s runs no code the GPU lowering makes",
                   name, dev->name);
  bool ptx = dev->code == JIT__CODE_PTX;
  int min = ptx ? jit__gpu_ptx_min_version(dev->chip) : 0;
  if (ptx && min == 0)
    return JIT_ERR(JIT_UNSUPPORTED, "graph `%s`: %s (%s) is a GPU architecture the PTX "
                   "lowering does not know", name, dev->name, dev->chip);
  if (ptx && min > dev->isa_max)
    return JIT_ERR(JIT_UNSUPPORTED, "graph `%s`: %s needs PTX %d.%d, newer than its "
                   "driver accepts (%d.%d)", name, dev->chip, min / 10, min % 10,
                   dev->isa_max / 10, dev->isa_max % 10);
  bool any_f16 = false;
  for (uint32_t i = 0; i < lg->n_nodes; i++) any_f16 |= lg->nodes[i].dtype == JIT__F16;
  if (any_f16 && !dev->f16)
    return JIT_ERR(JIT_UNSUPPORTED,
                   "graph `%s`: f16 on %s needs shaderFloat16 and 16-bit storage buffers, "
                   "which this device lacks", name, dev->name);
  bool any_i8 = false;
  for (uint32_t i = 0; i < lg->n_nodes; i++) any_i8 |= lg->nodes[i].dtype == JIT__I8;
  if (any_i8 && !ptx)
    return JIT_ERR(JIT_UNSUPPORTED, "graph `%s`: int8 on %s: the Vulkan lowering has no "
                   "8-bit storage yet (run jit_matmul_int8 on the CPU)", name, dev->name);
  bool any_bf16 = false;
  for (uint32_t i = 0; i < lg->n_nodes; i++) any_bf16 |= lg->nodes[i].dtype == JIT__BF16;
  if (any_bf16 && !ptx)
    return JIT_ERR(JIT_UNSUPPORTED, "graph `%s`: bf16 on %s: SPIR-V for Vulkan has no "
                   "bfloat16 here (use f32 or f16)", name, dev->name);
  if (any_bf16 && ptx && strncmp(dev->chip, "sm_", 3) == 0 && atoi(dev->chip + 3) < 80)
    return JIT_ERR(JIT_UNSUPPORTED, "graph `%s`: bf16 on %s (%s) needs sm_80 or newer", name,
                   dev->name, dev->chip);
  bool any_i64 = false;
  for (uint32_t i = 0; i < lg->n_nodes; i++) any_i64 |= lg->nodes[i].dtype == JIT__I64;
  if (any_i64 && !dev->int64)
    return JIT_ERR(JIT_UNSUPPORTED,
                   "graph `%s`: int64 indices on %s need shaderInt64, which this device "
                   "lacks; use int32", name, dev->name);
  if (ptx) {
    t->format = JIT__GPU_PTX;
    t->chip = dev->chip;
    // libdevice from the same toolkit as ptxas, when one is named.
    t->cuda_toolkit = dev->cuda_toolkit && dev->cuda_toolkit[0] ? dev->cuda_toolkit : NULL;
    t->cubin = true;
    t->cubin_toolkit = dev->cuda_toolkit;
  } else {
    t->format = JIT__GPU_SPIRV;
    t->spirv_f16 = any_f16;
    t->spirv_int64 = any_i64;
  }
  return NULL;
}

//===--- ptxas, found once per toolkit ------------------------------------===//

// ptxas may take a while on a large kernel; it is killed after this.
enum { kPtxasTimeoutMs = 120000, kToolkits = 8 };

typedef struct jit__ptxas_probe {
  char toolkit[4096];  // as asked for; "\x01" for NULL (the usual places)
  jit__ptxas tool;     // path "" when there is none
  char absent[512];    // then: why
} jit__ptxas_probe;

static pthread_mutex_t g_probe_mu = PTHREAD_MUTEX_INITIALIZER;
static jit__ptxas_probe g_probes[kToolkits];
static int g_n_probes;

// The ptxas of `toolkit` (NULL: the usual places), looked for at the first call.
static void jit__ptxas_for(const char *toolkit, jit__ptxas *tool, char *absent, size_t n) {
  const char *want = toolkit ? toolkit : "\x01";
  pthread_mutex_lock(&g_probe_mu);
  jit__ptxas_probe *p = NULL;
  for (int i = 0; i < g_n_probes && !p; i++)
    if (!strcmp(g_probes[i].toolkit, want)) p = &g_probes[i];
  if (!p) {
    // Past kToolkits distinct directories, the last slot is probed again each time.
    p = &g_probes[g_n_probes < kToolkits ? g_n_probes++ : kToolkits - 1];
    snprintf(p->toolkit, sizeof p->toolkit, "%s", want);
    jit_status s = jit__ptxas_find(toolkit, &p->tool);
    snprintf(p->absent, sizeof p->absent, "%s", s ? jit_status_message(s) : "");
    jit_status_free(s);
  }
  *tool = p->tool;
  snprintf(absent, n, "%s", p->absent);
  pthread_mutex_unlock(&g_probe_mu);
}

// Appends "name=value\n" to `t`, the value on one line (ptxas errors span several).
static void jit__note_put(jit__text *t, const char *name, const char *value) {
  jit__text_printf(t, "%s=", name);
  for (const char *c = value; *c; c++) jit__text_append(t, *c == '\n' ? " " : c, 1);
  jit__text_append(t, "\n", 1);
}

jit_status jit__gpu_make_images(const jit__gpu_target *t, jit__gpu_artifact *a) {
  jit__image_format module = t->format == JIT__GPU_PTX ? JIT__IMAGE_PTX : JIT__IMAGE_SPIRV;
  a->n_images = 0;
  if (t->format == JIT__GPU_PTX && t->cubin) {
    jit__ptxas tool;
    char missing[512];
    jit__ptxas_for(t->cubin_toolkit, &tool, missing, sizeof missing);
    if (tool.path[0]) {
      jit_status s = jit__ptxas_assemble(&tool, a->binary, a->binary_size, t->chip,
                                         kPtxasTimeoutMs, &a->cubin, &a->cubin_size);
      snprintf(missing, sizeof missing, "%s", s ? jit_status_message(s) : "");
      if (s && jit_status_get_code(s) == JIT_RESOURCE_EXHAUSTED) return s;
      jit_status_free(s);
    }
    jit__text notes = {0};
    if (a->cubin) {
      jit__note_put(&notes, "sm", t->chip);
      jit__note_put(&notes, "ptxas", tool.version);
      a->images[a->n_images++] = (jit__image){JIT__IMAGE_CUBIN, a->cubin, a->cubin_size};
    } else {
      jit__note_put(&notes, "missing", missing[0] ? missing : "no ptxas");
    }
    if (notes.oom) {
      free(notes.p);
      return JIT_ERR(JIT_RESOURCE_EXHAUSTED, "out of memory");
    }
    a->notes = notes.p;
  }
  a->images[a->n_images++] = (jit__image){module, a->binary, a->binary_size};
  return NULL;
}
