//===--- test_devices.c - devices, device tensors, copies, offloading ------===//
//
// Runs on the CPU everywhere; the Vulkan cases run where a Vulkan device exists
// (lavapipe in CI) and print "skipped: no Vulkan device" elsewhere.
//
//===----------------------------------------------------------------------===//
#include "util.h"

// Exact kernels (shape policy EXACT): the tests here count one compile per shape.
static jit_context *ctx_opts(const char *device) {
  jit_options o;
  jit_options_init(&o);
  o.device = device;
  o.shape_policy = JIT_SHAPE_POLICY_EXACT;
  jit_context *ctx = NULL;
  jit_status s = jit_context_create(&o, &ctx);
  if (s && jit_status_get_code(s) == JIT_UNAVAILABLE) {
    jit_status_free(s);
    cr_skip_test("skipped: no %s device", device);
  }
  TU_OK(s);
  return ctx;
}

static jit_device *vulkan_or_skip(jit_context *ctx) {
  jit_device *d = NULL;
  jit_status s = jit_context_find_device(ctx, JIT_DEVICE_VULKAN, 0, &d);
  if (s) {
    cr_expect_eq(jit_status_get_code(s), JIT_UNAVAILABLE, "%s", jit_status_message(s));
    jit_status_free(s);
    jit_context_destroy(ctx);
    cr_skip_test("skipped: no Vulkan device");
  }
  return d;
}

Test(devices, cpu_is_device_zero) {
  jit_context *ctx = tu_context();
  cr_assert_geq(jit_context_device_count(ctx), 1);
  jit_device *d = NULL;
  TU_OK(jit_context_get_device(ctx, 0, &d));
  jit_device_info info;
  TU_OK(jit_device_get_info(d, &info));
  cr_expect_eq(info.kind, JIT_DEVICE_CPU);
  cr_expect_eq(info.dl_device.device_type, kDLCPU);
  jit_status s = jit_context_get_device(ctx, 99, &d);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  jit_status_free(s);
  jit_context_destroy(ctx);
}

Test(devices, bad_device_option) {
  jit_options o;
  jit_options_init(&o);
  o.device = "tpu:3";
  jit_context *ctx = NULL;
  jit_status s = jit_context_create(&o, &ctx);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  TU_EXPECT_MSG(s, "tpu:3");
  jit_status_free(s);
  cr_expect_null(ctx);
}

Test(devices, cpu_tensors_and_copies) {
  jit_context *ctx = tu_context();
  jit_device *cpu = NULL;
  TU_OK(jit_context_get_device(ctx, 0, &cpu));
  int64_t shape[] = {3, 5};
  DLTensor a, b;
  TU_OK(jit_tensor_alloc(ctx, cpu, TU_F32, 2, shape, &a));
  TU_OK(jit_tensor_alloc(ctx, cpu, TU_F32, 2, shape, &b));
  for (int i = 0; i < 15; i++) ((float *)a.data)[i] = (float)i;
  TU_OK(jit_copy(ctx, &b, &a));
  for (int i = 0; i < 15; i++) cr_expect_eq(((float *)b.data)[i], (float)i);
  TU_OK(jit_tensor_free(ctx, &a));
  jit_status s = jit_tensor_free(ctx, &a);  // cleared: a no-op
  cr_expect_null(s);
  DLTensor fake = b;
  fake.data = (char *)b.data + 4;  // not an allocation of ours
  s = jit_tensor_free(ctx, &fake);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  jit_status_free(s);
  TU_OK(jit_tensor_free(ctx, &b));
  jit_context_destroy(ctx);
}

// y = relu(x W + b) with x [N, 13], W [13, 7], b [7]; checks against plain C.
static jit_graph *dense(jit_context *ctx) {
  jit_graph *g = tu_graph(ctx, "dense");
  int64_t N = jit_symbol(g, "N");
  jit_value x = jit_input(g, "x", TU_F32, 2, (int64_t[]){N, 13});
  jit_value w = jit_input(g, "w", TU_F32, 2, (int64_t[]){13, 7});
  jit_value b = jit_input(g, "b", TU_F32, 1, (int64_t[]){7});
  jit_output(g, jit_relu(g, jit_add(g, jit_matmul(g, x, w), b)));
  TU_OK(jit_graph_finalize(g));
  return g;
}

static void dense_ref(const float *x, const float *w, const float *b, int n, float *y) {
  for (int i = 0; i < n; i++)
    for (int j = 0; j < 7; j++) {
      double acc = b[j];
      for (int k = 0; k < 13; k++) acc += (double)x[i * 13 + k] * w[k * 7 + j];
      y[i * 7 + j] = acc > 0 ? (float)acc : 0.0f;
    }
}

static void fill(float *p, int n, int seed) {
  for (int i = 0; i < n; i++) p[i] = (float)(((i + seed) * 37 % 29) - 14) / 14.0f;
}

Test(devices, vulkan_device_tensors) {
  jit_context *ctx = tu_context();
  jit_device *vk = vulkan_or_skip(ctx);
  jit_graph *g = dense(ctx);
  enum { N = 17 };
  float x[N * 13], w[13 * 7], b[7], y[N * 7], ref[N * 7];
  fill(x, N * 13, 1);
  fill(w, 13 * 7, 2);
  fill(b, 7, 3);
  dense_ref(x, w, b, N, ref);
  int64_t sx[] = {N, 13}, sw[] = {13, 7}, sb[] = {7}, sy[] = {N, 7};
  DLTensor hx = tu_tensor(x, TU_F32, 2, sx), hw = tu_tensor(w, TU_F32, 2, sw),
           hb = tu_tensor(b, TU_F32, 1, sb), hy = tu_tensor(y, TU_F32, 2, sy);
  DLTensor in[3], out;
  TU_OK(jit_tensor_alloc(ctx, vk, TU_F32, 2, sx, &in[0]));
  TU_OK(jit_tensor_alloc(ctx, vk, TU_F32, 2, sw, &in[1]));
  TU_OK(jit_tensor_alloc(ctx, vk, TU_F32, 1, sb, &in[2]));
  TU_OK(jit_tensor_alloc(ctx, vk, TU_F32, 2, sy, &out));
  cr_expect_eq(in[0].device.device_type, kDLVulkan);
  TU_OK(jit_copy(ctx, &in[0], &hx));
  TU_OK(jit_copy(ctx, &in[1], &hw));
  TU_OK(jit_copy(ctx, &in[2], &hb));
  TU_OK(jit_run(g, in, 3, &out, 1));
  TU_OK(jit_copy(ctx, &hy, &out));
  tu_assert_close(y, ref, N * 7, 1e-4, 1e-5, 2, sy, "dense on vulkan");

  // Mixing a host and a device input is refused.
  DLTensor mixed[3] = {in[0], hw, in[2]};
  jit_status s = jit_run(g, mixed, 3, &out, 1);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  TU_EXPECT_MSG(s, "one device");
  jit_status_free(s);

  // A freed tensor is refused, not dereferenced.
  DLTensor stale = in[2];
  TU_OK(jit_tensor_free(ctx, &in[2]));
  DLTensor with_stale[3] = {in[0], in[1], stale};
  s = jit_run(g, with_stale, 3, &out, 1);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  TU_EXPECT_MSG(s, "not a live tensor");
  jit_status_free(s);
  s = jit_tensor_free(ctx, &stale);  // double free
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  jit_status_free(s);

  // A tensor of another context is refused.
  jit_context *other = tu_context();
  jit_device *ovk = vulkan_or_skip(other);
  DLTensor foreign;
  TU_OK(jit_tensor_alloc(other, ovk, TU_F32, 1, sb, &foreign));
  DLTensor with_foreign[3] = {in[0], in[1], foreign};
  s = jit_run(g, with_foreign, 3, &out, 1);
  TU_EXPECT_CODE(s, JIT_INVALID_ARGUMENT);
  jit_status_free(s);
  TU_OK(jit_tensor_free(other, &foreign));
  jit_context_destroy(other);

  TU_OK(jit_tensor_free(ctx, &in[0]));
  TU_OK(jit_tensor_free(ctx, &in[1]));
  TU_OK(jit_tensor_free(ctx, &out));
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

static int count_pipeline_caches(void *user, const jit_cache_entry_info *e) {
  if (!strcmp(e->kind, "vk-pipeline-cache")) ++*(int *)user;
  return 1;
}

Test(devices, vulkan_offload_matches_cpu_and_caches) {
  jit_context *ctx = ctx_opts("vulkan");
  jit_graph *g = dense(ctx);
  int sizes[] = {1, 5, 64, 5};
  for (int t = 0; t < 4; t++) {
    int n = sizes[t];
    float *x = malloc(sizeof(float) * n * 13), w[13 * 7], b[7];
    float *y = malloc(sizeof(float) * n * 7), *ref = malloc(sizeof(float) * n * 7);
    fill(x, n * 13, t);
    fill(w, 13 * 7, 5);
    fill(b, 7, 6);
    dense_ref(x, w, b, n, ref);
    int64_t sx[] = {n, 13}, sw[] = {13, 7}, sb[] = {7}, sy[] = {n, 7};
    DLTensor in[] = {tu_tensor(x, TU_F32, 2, sx), tu_tensor(w, TU_F32, 2, sw),
                     tu_tensor(b, TU_F32, 1, sb)};
    DLTensor out = tu_tensor(y, TU_F32, 2, sy);
    TU_OK(jit_run(g, in, 3, &out, 1));
    tu_assert_close(y, ref, n * 7, 1e-4, 1e-5, 2, sy, "dense offloaded");
    free(x);
    free(y);
    free(ref);
  }
  jit_stats st = {0};
  TU_OK(jit_context_stats(ctx, &st));
  cr_expect_eq(st.compiles + st.disk_hits, 3, "3 shapes: %llu compiles, %llu disk hits",
               (unsigned long long)st.compiles, (unsigned long long)st.disk_hits);
  cr_expect_eq(st.memory_hits, 1);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);

  // A new context loads the SPIR-V kernels from the disk cache, and the device's
  // VkPipelineCache was stored there when the first context went away.
  ctx = ctx_opts("vulkan");
  int pipeline_caches = 0;
  TU_OK(jit_cache_list(ctx, count_pipeline_caches, &pipeline_caches));
  // At least this build's (a suite dir reused across rebuilds keeps older builds' too).
  cr_expect_geq(pipeline_caches, 1, "%d pipeline-cache entries", pipeline_caches);
  g = dense(ctx);
  float x[13], w[13 * 7], b[7], y[7], ref[7];
  fill(x, 13, 1);
  fill(w, 13 * 7, 5);
  fill(b, 7, 6);
  dense_ref(x, w, b, 1, ref);
  int64_t sx[] = {1, 13}, sw[] = {13, 7}, sb[] = {7}, sy[] = {1, 7};
  DLTensor in[] = {tu_tensor(x, TU_F32, 2, sx), tu_tensor(w, TU_F32, 2, sw),
                   tu_tensor(b, TU_F32, 1, sb)};
  DLTensor out = tu_tensor(y, TU_F32, 2, sy);
  TU_OK(jit_run(g, in, 3, &out, 1));
  tu_assert_close(y, ref, 7, 1e-4, 1e-5, 2, sy, "dense from disk");
  TU_OK(jit_context_stats(ctx, &st));
  cr_expect_eq(st.compiles, 0);
  cr_expect_eq(st.disk_hits, 1);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// CUDA: runs the dense graph offloaded where a GPU exists; elsewhere the backend must
// say it is unavailable (and why), not fail or crash.
Test(devices, cuda_runs_or_reports_unavailable) {
  jit_context *ctx = tu_context();
  jit_device *cu = NULL;
  jit_status s = jit_context_find_device(ctx, JIT_DEVICE_CUDA, 0, &cu);
  if (s) {
    TU_EXPECT_CODE(s, JIT_UNAVAILABLE);
    cr_expect(strlen(jit_status_message(s)) > 10, "no reason: %s", jit_status_message(s));
    jit_status_free(s);
    // A kDLCUDA tensor is refused cleanly too.
    jit_graph *g = dense(ctx);
    float x[13] = {0};
    int64_t sx[] = {1, 13}, sw[] = {13, 7}, sb[] = {7}, sy[] = {1, 7};
    DLTensor in[] = {tu_tensor(x, TU_F32, 2, sx), tu_tensor(x, TU_F32, 2, sw),
                     tu_tensor(x, TU_F32, 1, sb)};
    for (int i = 0; i < 3; i++) in[i].device = (DLDevice){kDLCUDA, 0};
    DLTensor out = tu_tensor(x, TU_F32, 2, sy);
    out.device = (DLDevice){kDLCUDA, 0};
    s = jit_run(g, in, 3, &out, 1);
    TU_EXPECT_CODE(s, JIT_UNAVAILABLE);
    jit_status_free(s);
    jit_graph_destroy(g);
    jit_context_destroy(ctx);
    fprintf(stderr, "skipped: no CUDA device (the unavailable path was checked)\n");
    return;
  }
  jit_context_destroy(ctx);
  ctx = ctx_opts("cuda");
  jit_graph *g = dense(ctx);
  enum { N = 33 };
  float x[N * 13], w[13 * 7], b[7], y[N * 7], ref[N * 7];
  fill(x, N * 13, 7);
  fill(w, 13 * 7, 8);
  fill(b, 7, 9);
  dense_ref(x, w, b, N, ref);
  int64_t sx[] = {N, 13}, sw[] = {13, 7}, sb[] = {7}, sy[] = {N, 7};
  DLTensor in[] = {tu_tensor(x, TU_F32, 2, sx), tu_tensor(w, TU_F32, 2, sw),
                   tu_tensor(b, TU_F32, 1, sb)};
  DLTensor out = tu_tensor(y, TU_F32, 2, sy);
  TU_OK(jit_run(g, in, 3, &out, 1));
  tu_assert_close(y, ref, N * 7, 1e-4, 1e-5, 2, sy, "dense on cuda");
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}
