//===--- from_mlir.c - run a function from an .mlir file for two shapes ----===//
//
//   from_mlir FILE [ENTRY [SIZE1 SIZE2]]
//
// Loads FILE (a module whose entry takes and returns tensors with `?` dims, in
// linalg/tosa/tensor/arith/math), binds every symbolic dim to SIZE1 (default 1), runs it
// twice on random inputs, then does the same with SIZE2 (default 7). It prints each
// output's shape and checksum, and the time of each call with where its kernel came
// from: compiled (first call for those shapes), the disk cache, or memory.
// Set JITML_DUMP_IR=<dir> to see every stage of each compile.
//
//===----------------------------------------------------------------------===//
#define _POSIX_C_SOURCE 200809L  // clock_gettime

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "jitml.h"

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int check(jit_status s, const char *what) {
  if (!s) return 0;
  fprintf(stderr, "%s: %s: %s\n", what, jit_status_code_name(jit_status_get_code(s)),
          jit_status_message(s));
  jit_status_free(s);
  return 1;
}

// f16 -> f32 for checksums (no NaN/denormal care needed for a checksum).
static float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 31, man = h & 1023;
  uint32_t bits;
  if (exp == 0) bits = sign;  // flush denormals
  else if (exp == 31) bits = sign | 0x7F800000u | (man << 13);
  else bits = sign | ((exp + 112) << 23) | (man << 13);
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

static int run_size(jit_graph *g, int64_t size) {
  int n_in = jit_graph_num_inputs(g), n_out = jit_graph_num_outputs(g);
  DLTensor *in = calloc((size_t)n_in, sizeof(DLTensor));
  int64_t(*shapes)[JIT_MAX_RANK] = calloc((size_t)n_in, sizeof(*shapes));
  DLManagedTensor **out = calloc((size_t)n_out, sizeof(*out));
  int rc = 0;
  unsigned seed = 1;
  for (int i = 0; i < n_in; i++) {
    jit_input_info info;
    if (check(jit_graph_input_info(g, i, &info), "input info")) return 1;
    size_t n = 1;
    for (int d = 0; d < info.rank; d++) {
      shapes[i][d] = info.dims[d] >= 0 ? info.dims[d] : size;
      n *= (size_t)shapes[i][d];
    }
    size_t esz = info.dtype.bits / 8;
    void *data = malloc(n * esz + 1);
    for (size_t k = 0; k < n; k++) {
      float v = (float)((seed = seed * 1103515245u + 12345u) >> 8) / (1 << 24) - 0.5f;
      if (esz == 4) ((float *)data)[k] = v;
      else ((uint16_t *)data)[k] = 0x3800;  // 0.5 in f16
    }
    in[i] = (DLTensor){data, {kDLCPU, 0}, info.rank, info.dtype, shapes[i], NULL, 0};
  }
  printf("all `?` dims = %lld:\n", (long long)size);
  for (int call = 0; call < 2 && !rc; call++) {
    jit_stats before = {.struct_size = sizeof(jit_stats)};
    jit_stats after = {.struct_size = sizeof(jit_stats)};
    jit_context_stats(jit_graph_context(g), &before);
    double t0 = now_ms();
    rc = check(jit_run_alloc(g, in, n_in, out, n_out), "jit_run_alloc");
    double ms = now_ms() - t0;
    if (rc) break;
    jit_context_stats(jit_graph_context(g), &after);
    const char *how = after.compiles > before.compiles     ? " (compiled)"
                      : after.disk_hits > before.disk_hits ? " (loaded from the disk cache)"
                                                           : " (kernel in memory)";
    printf("  call %d: %8.2f ms%s\n", call + 1, ms, how);
    for (int j = 0; j < n_out; j++) {
      DLTensor *t = &out[j]->dl_tensor;
      size_t n = 1;
      double sum = 0;
      for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
      for (size_t k = 0; k < n; k++)
        sum += t->dtype.bits == 32 ? ((float *)t->data)[k]
                                   : half_to_float(((uint16_t *)t->data)[k]);
      if (call == 1) {
        printf("  output %d: [", j);
        for (int d = 0; d < t->ndim; d++)
          printf("%s%lld", d ? ", " : "", (long long)t->shape[d]);
        printf("] checksum %.6f\n", sum);
      }
      out[j]->deleter(out[j]);
    }
  }
  for (int i = 0; i < n_in; i++) free(in[i].data);
  free(in);
  free(shapes);
  free(out);
  return rc;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s FILE.mlir [ENTRY [SIZE1 SIZE2]]\n", argv[0]);
    return 2;
  }
  const char *entry = argc > 2 && strcmp(argv[2], "-") ? argv[2] : NULL;
  int64_t s1 = argc > 3 ? atoll(argv[3]) : 1, s2 = argc > 4 ? atoll(argv[4]) : 7;
  jit_context *ctx = NULL;
  jit_graph *g = NULL;
  if (check(jit_context_create(NULL, &ctx), "jit_context_create")) return 1;
  int rc = check(jit_graph_from_mlir_file(ctx, argv[1], entry, &g), argv[1]);
  if (!rc) {
    printf("%s: %d inputs, %d outputs\n", argv[1], jit_graph_num_inputs(g),
           jit_graph_num_outputs(g));
    rc = run_size(g, s1) || run_size(g, s2);
  }
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
  return rc;
}
