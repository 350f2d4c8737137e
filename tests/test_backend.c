//===--- test_backend.c - the backend conformance suite --------------------===//
//
// One suite for every device backend, through the table of devices/device.h only (the
// way jit/ uses them): enumeration, buffers and transfers, loading artifacts, launches,
// errors that must leave the device usable, and graphs lowered by the GPU lowering for
// the device's code (SPIR-V or PTX) compared with the plain-C references in ref.c.
// CTest runs it once per backend, naming it in JITML_TEST_DEVICE (vulkan, cuda), as
// ops_<backend> runs test_ops; a backend that is absent makes each test print
// "skipped: no <backend> device" and pass. JITML_TEST_BACKEND_NO_COMPUTE=1 says the
// device does not compute (the CUDA mock driver, tests/cuda_mock.c): the graph tests
// then skip, the rest runs. The backends and the lowering are internal (hidden in
// libjitml.so), so this executable compiles their sources itself.
//
// Backend-specific behaviour stays in test_vulkan.c, test_vulkan_lost.c and
// test_cuda.c (driver init failures, cubin/PTX selection, SPIR-V checks, lost devices).
//
//===----------------------------------------------------------------------===//
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devices/device.h"
#include "gpu_check.h"
#include "lgraph_builder.h"
#include "lowering/gpu.h"
#include "ref.h"

//===--- Helpers ---------------------------------------------------------===//

// A visible skip that still passes: Debian's Criterion 2.4.1 makes the whole run exit
// 1 when any test calls cr_skip_test or cr_log_warn, which CTest would count as a
// failure; so skips are plain lines on stderr.
#define NOTE(...)                 \
  do {                            \
    fprintf(stderr, __VA_ARGS__); \
    fputc('\n', stderr);          \
  } while (0)

typedef struct be_env {
  const char *name;  // "vulkan", "cuda"
  jit__backend *backend;
  const jit__device_vtable *vt;
  jit__dev *dev;
  jit__dev_info info;
} be_env;

static const struct {
  const char *name;
  jit_status (*create)(jit__backend **);
} kBackends[] = {
    {"vulkan", jit__vulkan_backend_create},
    {"cuda", jit__cuda_backend_create},
};

// Opens device 0 of the backend JITML_TEST_DEVICE names; false (after a "skipped" line)
// when none is named or the backend is absent, and the test returns.
static bool env_open(be_env *e) {
  memset(e, 0, sizeof *e);
  const char *want = getenv("JITML_TEST_DEVICE");
  if (!want || !*want) {
    NOTE("skipped: JITML_TEST_DEVICE names no backend");
    return false;
  }
  for (size_t i = 0; i < sizeof kBackends / sizeof kBackends[0]; i++)
    if (!strcmp(want, kBackends[i].name)) e->name = kBackends[i].name;
  cr_assert_not_null(e->name, "JITML_TEST_DEVICE=%s: not a backend of this suite", want);
  jit_status s = kBackends[e->name[0] == 'c'].create(&e->backend);
  if (s && jit_status_get_code(s) == JIT_UNAVAILABLE) {
    NOTE("skipped: no %s device (%s)", e->name, jit_status_message(s));
    jit_status_free(s);
    return false;
  }
  OK(s);
  // Lavapipe keeps a block in one of its globals that it never frees; pinning the
  // driver (NOLOAD: only if the loader loaded it) keeps it reachable for LeakSanitizer.
  (void)dlopen("libvulkan_lvp.so", RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
  e->vt = e->backend->vt;
  cr_assert_eq((void *)e->vt->destroy, (void *)e->backend->vt->destroy);
  cr_assert_geq(e->vt->device_count(e->backend), 1u);
  e->vt->device_info(e->backend, 0, &e->info);
  // Lavapipe JITs a shader at its first dispatch, inside the bounded wait: allow two
  // minutes on a loaded machine.
  jit__dev_options o = {.timeout_ns = 120ull * 1000 * 1000 * 1000};
  OK(e->vt->open(e->backend, 0, &o, &e->dev));
  return true;
}

static void env_close(be_env *e) {
  if (e->dev) e->vt->close(e->dev);
  if (e->backend) e->vt->destroy(e->backend);
  memset(e, 0, sizeof *e);
}

// Graph tests need a device that computes.
static bool env_open_computing(be_env *e) {
  const char *no = getenv("JITML_TEST_BACKEND_NO_COMPUTE");
  if (no && *no && strcmp(no, "0")) {
    NOTE("skipped: the %s device here does not compute (JITML_TEST_BACKEND_NO_COMPUTE)",
         getenv("JITML_TEST_DEVICE") ? getenv("JITML_TEST_DEVICE") : "?");
    return false;
  }
  return env_open(e);
}

// f16 graphs need a device that runs them.
static bool env_f16_ok(const be_env *e, jit__dtype dt) {
  if (dt != JIT__F16 || e->info.f16) return true;
  NOTE("skipped: %s (%s) does not run f16 kernels", e->name, e->info.name);
  return false;
}

//===--- Compile (what jit/gpu_run.c does) -------------------------------===//

// PTX: the device's chip when the lowering knows it, else the newest one it knows of
// an older compute capability (PTX runs on newer GPUs through the driver's JIT).
static void pick_chip(const be_env *e, char *chip, size_t size) {
  snprintf(chip, size, "%s", e->info.chip);
  if (jit__gpu_ptx_min_version(chip)) return;
  int want = atoi(e->info.chip + 3);
  for (int cc = want; cc >= 50; cc--) {
    snprintf(chip, size, "sm_%d", cc);
    if (jit__gpu_ptx_min_version(chip)) return;
  }
  cr_assert_fail("no chip the lowering knows for %s", e->info.chip);
}

static void compile_for(const be_env *e, const jit__lgraph *g, jit__gpu_artifact *a) {
  char chip[16] = "";
  jit__gpu_target t = {.format = JIT__GPU_SPIRV};
  if (e->info.code == JIT__CODE_PTX) {
    pick_chip(e, chip, sizeof chip);
    t = (jit__gpu_target){.format = JIT__GPU_PTX, .chip = chip};
  } else {
    for (uint32_t i = 0; i < g->n_nodes; i++) t.spirv_f16 |= g->nodes[i].dtype == JIT__F16;
  }
  jit_status s = jit__compile_gpu(g, "be", &t, a);
  if (s) {
    char msg[4096];
    snprintf(msg, sizeof msg, "%s", jit_status_message(s));
    jit_status_free(s);
    cr_assert_fail("compiling `%s` for %s: %s", g->name, e->name, msg);
  }
}

// The artifact a backend loads from a lowering's output (borrowing from it).
typedef struct be_art {
  jit__image image;
  jit__dev_kernel *kernels;
  uint64_t *bytes;
  jit__dev_artifact art;
} be_art;

static void art_from(const be_env *e, const jit__gpu_artifact *a, be_art *out) {
  const jit__gpu_plan *p = &a->plan;
  out->kernels = calloc(p->n_kernels + 1, sizeof *out->kernels);
  out->bytes = calloc(p->n_buffers + 1, sizeof *out->bytes);
  cr_assert(out->kernels && out->bytes);
  for (uint32_t b = 0; b < p->n_buffers; b++) out->bytes[b] = p->buffers[b].bytes;
  for (uint32_t k = 0; k < p->n_kernels; k++) {
    const jit__gpu_kernel *pk = &p->kernels[k];
    out->kernels[k] = (jit__dev_kernel){pk->entry, {0}, {0}, pk->n_args, pk->args};
    memcpy(out->kernels[k].grid, pk->grid, sizeof pk->grid);
    memcpy(out->kernels[k].block, pk->block, sizeof pk->block);
  }
  out->image = (jit__image){e->info.code == JIT__CODE_PTX ? JIT__IMAGE_PTX
                                                                   : JIT__IMAGE_SPIRV,
                                a->binary, a->binary_size};
  out->art = (jit__dev_artifact){&out->image, 1, NULL, p->n_buffers, out->bytes,
                                 p->n_kernels, out->kernels};
}

static void art_free(be_art *a) {
  free(a->kernels);
  free(a->bytes);
}

typedef struct run_times {
  double compile_ms, load_ms, first_run_ms, second_run_ms;
} run_times;

static size_t dt_size(jit__dtype dt) { return dt == JIT__F16 ? 2 : 4; }

// One buffer of a run: allocated through the table, as jit/ does.
static jit__dev_arg alloc_arg(be_env *e, uint64_t bytes) {
  jit__dev_arg a = {NULL, NULL};
  OK(e->vt->buffer_alloc(e->dev, bytes, &a.buffer, &a.data));
  return a;
}

// Uploads f32 values (converted to f16 for f16 graphs).
static void upload_values(be_env *e, const jit__dev_arg *a, jit__dtype dt, const float *v,
                          uint64_t bytes) {
  if (dt != JIT__F16) {
    OK(e->vt->upload(e->dev, a, 0, v, bytes));
    return;
  }
  uint16_t *h = malloc(bytes ? bytes : 1);
  ref_f32_to_f16_array(v, h, (int64_t)(bytes / 2));
  OK(e->vt->upload(e->dev, a, 0, h, bytes));
  free(h);
}

static void download_values(be_env *e, const jit__dev_arg *a, jit__dtype dt, float *v,
                            uint64_t bytes) {
  if (dt != JIT__F16) {
    OK(e->vt->download(e->dev, a, 0, v, bytes));
    return;
  }
  uint16_t *h = malloc(bytes ? bytes : 1);
  OK(e->vt->download(e->dev, a, 0, h, bytes));
  ref_f16_to_f32_array(h, v, (int64_t)(bytes / 2));
  free(h);
}

// Compiles `t`, runs it twice with `inputs` (f32 values, one array per graph input) and
// writes each output (as f32) into outputs[j]. Outputs start as NaN (0xff bytes), so an
// element no kernel writes shows.
static void run_graph(be_env *e, const tg *t, float *const *inputs, float **outputs,
                      run_times *times) {
  double t0 = now_ms();
  jit__gpu_artifact a;
  compile_for(e, &t->g, &a);
  double t1 = now_ms();
  be_art d;
  art_from(e, &a, &d);
  jit__dev_executable *exe = NULL;
  uint32_t used = 99;
  OK(e->vt->load(e->dev, &d.art, &exe, &used));
  cr_assert_eq(used, 0u);
  double t2 = now_ms();
  uint32_t nb = a.plan.n_buffers;
  jit__dev_arg *args = calloc(nb + 1, sizeof *args);
  for (uint32_t b = 0; b < nb; b++) {
    const jit__gpu_buffer *pb = &a.plan.buffers[b];
    args[b] = alloc_arg(e, pb->bytes);
    if (pb->kind == JIT__GPU_BUF_INPUT) {
      upload_values(e, &args[b], t->dt, inputs[pb->index], pb->bytes);
    } else if (pb->bytes) {
      void *nan = malloc(pb->bytes);
      memset(nan, 0xff, pb->bytes);
      OK(e->vt->upload(e->dev, &args[b], 0, nan, pb->bytes));
      free(nan);
    }
  }
  (void)dt_size;
  double t3 = now_ms();
  OK(e->vt->launch(exe, args, nb));
  double t4 = now_ms();
  OK(e->vt->launch(exe, args, nb));
  double t5 = now_ms();
  OK(e->vt->wait(e->dev));
  for (uint32_t b = 0; b < nb; b++) {
    const jit__gpu_buffer *pb = &a.plan.buffers[b];
    if (pb->kind == JIT__GPU_BUF_OUTPUT)
      download_values(e, &args[b], t->dt, outputs[pb->index], pb->bytes);
  }
  if (times) *times = (run_times){t1 - t0, t2 - t1, t4 - t3, t5 - t4};
  for (uint32_t b = 0; b < nb; b++) e->vt->buffer_free(e->dev, args[b].buffer);
  free(args);
  e->vt->unload(exe);
  art_free(&d);
  jit__gpu_artifact_release(&a);
}

// Inputs of f16 graphs are rounded to f16 first, so the reference sees what the GPU sees.
static void round_inputs(jit__dtype dt, float *x, int64_t n) {
  if (dt == JIT__F16) ref_round_f16_array(x, n);
}

// Tolerances: f32 as the CPU backend's op tests; f16 with its 11-bit significand (and
// f16 intermediates between kernels).
static double rtol_for(jit__dtype dt) { return dt == JIT__F16 ? 1e-2 : 1e-5; }
static double atol_for(jit__dtype dt, double k) {
  return dt == JIT__F16 ? 1e-2 * (k > 1 ? sqrt(k) : 1) : 2.0 * k * FLT_EPSILON + 1e-6;
}

//===--- Graph tests (need a device that computes) ------------------------===//

static void add_broadcast_case(jit__dtype dt) {
  be_env e;
  if (!env_open_computing(&e)) return;
  if (!env_f16_ok(&e, dt)) {
    env_close(&e);
    return;
  }
  tg t;
  tg_init(&t, "add_broadcast", dt);
  int64_t da[3] = {3, 37, 45}, db[2] = {1, 45}, db1[1] = {45};
  uint32_t x = tg_input(&t, 3, da), y = tg_input(&t, 2, db);
  uint32_t z = tg_input(&t, 1, db1);
  uint32_t s = tg_node(&t, JIT__OP_ADD, 2, x, y, 3, da);
  tg_output(&t, tg_node(&t, JIT__OP_SUB, 2, s, z, 3, da));
  ref_rng rng;
  ref_rng_seed(&rng, 1);
  int64_t na = ref_numel(3, da);
  float *a = fmalloc(na), *b = fmalloc(45), *c = fmalloc(45), *got = fmalloc(na),
        *tmp = fmalloc(na), *want = fmalloc(na);
  ref_rng_fill_signed(&rng, a, na);
  ref_rng_fill_signed(&rng, b, 45);
  ref_rng_fill_signed(&rng, c, 45);
  round_inputs(dt, a, na), round_inputs(dt, b, 45), round_inputs(dt, c, 45);
  ref_binary(REF_ADD, a, 3, da, b, 2, db, tmp);
  ref_binary(REF_SUB, tmp, 3, da, c, 1, db1, want);
  float *in[3] = {a, b, c};
  run_graph(&e, &t, in, &got, NULL);
  assert_close(got, want, na, rtol_for(dt), atol_for(dt, 1), "(a + b) - c, broadcast");
  free(a), free(b), free(c), free(got), free(tmp), free(want);
  env_close(&e);
}
Test(backend, add_broadcast_f32) { add_broadcast_case(JIT__F32); }
Test(backend, add_broadcast_f16) { add_broadcast_case(JIT__F16); }

static void gelu_chain_case(jit__dtype dt) {
  be_env e;
  if (!env_open_computing(&e)) return;
  if (!env_f16_ok(&e, dt)) {
    env_close(&e);
    return;
  }
  tg t;
  tg_init(&t, "gelu_chain", dt);
  int64_t da[2] = {33, 1000};
  uint32_t x = tg_input(&t, 2, da);
  uint32_t ex = tg_unary(&t, JIT__OP_EXP, x);
  uint32_t th = tg_unary(&t, JIT__OP_TANH, ex);
  tg_output(&t, tg_unary(&t, JIT__OP_GELU, th));
  int64_t n = ref_numel(2, da);
  float *a = fmalloc(n), *got = fmalloc(n), *want = fmalloc(n);
  ref_rng rng;
  ref_rng_seed(&rng, 2);
  ref_rng_fill(&rng, a, n, -3.0f, 3.0f);
  round_inputs(dt, a, n);
  ref_unary(REF_EXP, a, n, want);
  ref_unary(REF_TANH, want, n, want);
  ref_unary(REF_GELU, want, n, want);
  float *in[1] = {a};
  run_graph(&e, &t, in, &got, NULL);
  // libdevice's exp/tanh are within a few ulp of libm.
  assert_close(got, want, n, dt == JIT__F16 ? 2e-2 : 1e-5, dt == JIT__F16 ? 2e-2 : 1e-6,
               "gelu(tanh(exp(x)))");
  free(a), free(got), free(want);
  env_close(&e);
}
Test(backend, gelu_chain_f32) { gelu_chain_case(JIT__F32); }
Test(backend, gelu_chain_f16) { gelu_chain_case(JIT__F16); }

// More blocks than a grid dim may have (65535: Vulkan's guaranteed minimum, CUDA's in
// y and z): a plain kernel with one row of 256 columns per block over 70,001 rows, and
// a 1-D one of 256 lanes per block over 16,777,259 elements (the MLP at N = 65,536 was
// refused, "grid 1x65536x1 exceeds 65535 in y/z"). Each block then takes its tiles in
// turn; every element is checked, the last rows and lanes (the second turn) included.
Test(backend, grid_past_65535_blocks, .timeout = 300) {
  be_env e;
  if (!env_open_computing(&e)) return;
  static const int64_t shapes[][2] = {{70001, 256}, {16777259, 0}};
  for (int c = 0; c < 2; c++) {
    int rank = shapes[c][1] ? 2 : 1;
    const int64_t *da = shapes[c], db[1] = {rank == 2 ? 256 : 1};
    tg t;
    tg_init(&t, "wide_grid", JIT__F32);
    uint32_t x = tg_input(&t, rank, da), b = tg_input(&t, 1, db);
    tg_output(&t, tg_unary(&t, JIT__OP_RELU, tg_node(&t, JIT__OP_ADD, 2, x, b, rank, da)));
    int64_t n = ref_numel(rank, da);
    float *a = fmalloc(n), *bias = fmalloc(db[0]), *got = fmalloc(n), *want = fmalloc(n);
    ref_rng rng;
    ref_rng_seed(&rng, 70 + (uint64_t)c);
    ref_rng_fill_signed(&rng, a, n);
    ref_rng_fill_signed(&rng, bias, db[0]);
    ref_binary(REF_ADD, a, rank, da, bias, 1, db, want);
    ref_unary(REF_RELU, want, n, want);
    float *in[2] = {a, bias};
    run_graph(&e, &t, in, &got, NULL);
    assert_close(got, want, n, 1e-6, 1e-6, rank == 2 ? "relu(x + b), 70001 rows"
                                                     : "relu(x + b), 16777259 lanes");
    free(a), free(bias), free(got), free(want);
  }
  env_close(&e);
}

// A generic kernel (the graph's `?` dims kept) run for one binding: `exe` is its module,
// loaded once, launched with the grids and sizes jit__gpu_plan_bind computes for the
// binding (launch_grids), its SIZES buffer written first.
static void run_generic(be_env *e, const jit__gpu_artifact *ga, jit__dev_executable *exe,
                        const int *ranks, const int64_t (*dims)[JIT_MAX_RANK], uint32_t n_io,
                        float *const *inputs, float **outputs) {
  jit__gpu_plan bound;
  int32_t *sizes = NULL;
  OK(jit__gpu_plan_bind(&ga->plan, n_io, ranks, dims, &bound, &sizes));
  uint32_t nb = bound.n_buffers;
  jit__dev_arg *args = calloc(nb + 1, sizeof *args);
  uint64_t *bytes = calloc(nb + 1, sizeof *bytes);
  uint32_t(*grids)[3] = calloc(bound.n_kernels + 1, sizeof *grids);
  for (uint32_t k = 0; k < bound.n_kernels; k++)
    memcpy(grids[k], bound.kernels[k].grid, sizeof grids[k]);
  for (uint32_t b = 0; b < nb; b++) {
    const jit__gpu_buffer *pb = &bound.buffers[b];
    bytes[b] = pb->bytes;
    args[b] = alloc_arg(e, pb->bytes ? pb->bytes : 4);
    if (pb->kind == JIT__GPU_BUF_INPUT)
      upload_values(e, &args[b], JIT__F32, inputs[pb->index], pb->bytes);
    else if (pb->kind == JIT__GPU_BUF_SIZES)
      OK(e->vt->upload(e->dev, &args[b], 0, sizes, 4 * (uint64_t)bound.n_sizes));
  }
  OK(e->vt->launch_grids(exe, args, nb, (const uint32_t(*)[3])grids, bytes));
  OK(e->vt->wait(e->dev));
  for (uint32_t b = 0; b < nb; b++) {
    const jit__gpu_buffer *pb = &bound.buffers[b];
    if (pb->kind == JIT__GPU_BUF_OUTPUT)
      download_values(e, &args[b], JIT__F32, outputs[pb->index], pb->bytes);
  }
  for (uint32_t b = 0; b < nb; b++) e->vt->buffer_free(e->dev, args[b].buffer);
  free(args);
  free(bytes);
  free(grids);
  jit__gpu_plan_release(&bound);
  free(sizes);
}

// relu(x W1 + b1) W2 + b2 with x [N, 40], one generic kernel (one module load) for N =
// 1, 7, 33, 300
// (1, primes, past a 256-thread block), against plain C.
Test(backend, generic_kernel_per_binding) {
  be_env e;
  if (!env_open_computing(&e)) return;
  tg t;
  tg_init(&t, "generic_mlp", JIT__F32);
  tg_mlp(&t, -2, 40, 24, 5);  // N a symbol
  const int64_t dw1[2] = {40, 24}, db1[1] = {24}, dw2[2] = {24, 5}, db2[1] = {5};
  char chip[16] = "";
  jit__gpu_target tgt = {.format = JIT__GPU_SPIRV};
  if (e.info.code == JIT__CODE_PTX) {
    pick_chip(&e, chip, sizeof chip);
    tgt = (jit__gpu_target){.format = JIT__GPU_PTX, .chip = chip};
  }
  jit__gpu_artifact ga;
  OK(jit__compile_gpu_generic(&t.g, NULL, "gen", &tgt, &ga));
  cr_assert_not_null(e.vt->launch_grids, "%s has no launch_grids", e.name);
  // The module, loaded once: no minimum buffer sizes (they vary per binding).
  be_art d;
  art_from(&e, &ga, &d);
  for (uint32_t b = 0; b < ga.plan.n_buffers; b++)
    if (ga.plan.buffers[b].bytes_expr.len) d.bytes[b] = 0;
  jit__dev_executable *exe = NULL;
  uint32_t used = 99;
  OK(e.vt->load(e.dev, &d.art, &exe, &used));
  ref_rng rng;
  ref_rng_seed(&rng, 90);
  float w1v[40 * 24], b1v[24], w2v[24 * 5], b2v[5];
  ref_rng_fill_signed(&rng, w1v, 40 * 24);
  ref_rng_fill_signed(&rng, b1v, 24);
  ref_rng_fill_signed(&rng, w2v, 24 * 5);
  ref_rng_fill_signed(&rng, b2v, 5);
  static const int64_t ns[] = {1, 7, 33, 300};
  for (size_t i = 0; i < 4; i++) {
    int64_t n = ns[i];
    float *xv = fmalloc(n * 40), *hv = fmalloc(n * 24), *want = fmalloc(n * 5),
          *got = fmalloc(n * 5);
    ref_rng_fill_signed(&rng, xv, n * 40);
    int64_t sx[2] = {n, 40}, sh[2] = {n, 24}, sy[2] = {n, 5}, tmp[2];
    ref_matmul(xv, 2, sx, w1v, 2, dw1, hv, tmp);
    ref_binary(REF_ADD, hv, 2, sh, b1v, 1, db1, hv);
    ref_unary(REF_RELU, hv, n * 24, hv);
    ref_matmul(hv, 2, sh, w2v, 2, dw2, want, tmp);
    ref_binary(REF_ADD, want, 2, sy, b2v, 1, db2, want);
    int ranks[6] = {2, 2, 1, 2, 1, 2};
    int64_t dims[6][JIT_MAX_RANK] = {{n, 40}, {40, 24}, {24}, {24, 5}, {5}, {n, 5}};
    float *in[5] = {xv, w1v, b1v, w2v, b2v};
    run_generic(&e, &ga, exe, ranks, (const int64_t(*)[JIT_MAX_RANK])dims, 6, in, &got);
    char what[64];
    snprintf(what, sizeof what, "generic MLP, N = %lld", (long long)n);
    assert_close(got, want, n * 5, 1e-5, 1e-5, what);
    free(xv), free(hv), free(want), free(got);
  }
  e.vt->unload(exe);
  art_free(&d);
  jit__gpu_artifact_release(&ga);
  env_close(&e);
}

static void matmul_case(be_env *e, jit__dtype dt, int ra, const int64_t *da, int rb,
                        const int64_t *db, uint64_t seed, run_times *times) {
  int64_t dc[JIT_MAX_RANK];
  int rc = ref_matmul(NULL, ra, da, NULL, rb, db, NULL, dc);
  cr_assert(rc >= 2);
  tg t;
  tg_init(&t, "matmul", dt);
  uint32_t x = tg_input(&t, ra, da), y = tg_input(&t, rb, db);
  tg_output(&t, tg_node(&t, JIT__OP_MATMUL, 2, x, y, rc, dc));
  int64_t na = ref_numel(ra, da), nb = ref_numel(rb, db), nc = ref_numel(rc, dc);
  int64_t K = da[ra - 1];
  float *a = fmalloc(na), *b = fmalloc(nb), *got = fmalloc(nc), *want = fmalloc(nc);
  ref_rng rng;
  ref_rng_seed(&rng, seed);
  ref_rng_fill_signed(&rng, a, na);
  ref_rng_fill_signed(&rng, b, nb);
  round_inputs(dt, a, na), round_inputs(dt, b, nb);
  ref_matmul(a, ra, da, b, rb, db, want, dc);
  float *in[2] = {a, b};
  run_graph(e, &t, in, &got, times);
  char what[160];
  snprintf(what, sizeof what, "%s matmul rank %d x rank %d, M=%lld K=%lld N=%lld",
           dt == JIT__F16 ? "f16" : "f32", ra, rb, (long long)da[ra - 2], (long long)K,
           (long long)db[rb - 1]);
  assert_close(got, want, nc, rtol_for(dt), atol_for(dt, (double)K), what);
  free(a), free(b), free(got), free(want);
}

static void matmul_2d_case(jit__dtype dt) {
  be_env e;
  if (!env_open_computing(&e)) return;
  if (!env_f16_ok(&e, dt)) {
    env_close(&e);
    return;
  }
  static const int64_t mkn[][3] = {{1, 1, 1}, {17, 31, 45}, {64, 128, 96}, {3, 100, 1}};
  for (size_t i = 0; i < sizeof mkn / sizeof mkn[0]; i++) {
    int64_t da[2] = {mkn[i][0], mkn[i][1]}, db[2] = {mkn[i][1], mkn[i][2]};
    run_times tm;
    matmul_case(&e, dt, 2, da, 2, db, 10 + i, &tm);
    fprintf(stderr,
            "%s: %s matmul %lldx%lldx%lld on %s (%s): lowering %.1f ms, module load "
            "%.1f ms, first run %.2f ms, second run %.3f ms\n",
            e.name, dt == JIT__F16 ? "f16" : "f32", (long long)mkn[i][0], (long long)mkn[i][1],
            (long long)mkn[i][2], e.info.name, e.info.chip, tm.compile_ms, tm.load_ms,
            tm.first_run_ms, tm.second_run_ms);
  }
  env_close(&e);
}
Test(backend, matmul_2d_f32) { matmul_2d_case(JIT__F32); }
Test(backend, matmul_2d_f16) { matmul_2d_case(JIT__F16); }

Test(backend, matmul_batched) {
  be_env e;
  if (!env_open_computing(&e)) return;
  int64_t a1[3] = {4, 17, 31}, b1[2] = {31, 45};
  matmul_case(&e, JIT__F32, 3, a1, 2, b1, 20, NULL);
  int64_t a2[3] = {3, 8, 16}, b2[3] = {3, 16, 9};
  matmul_case(&e, JIT__F32, 3, a2, 3, b2, 21, NULL);
  if (e.info.f16) matmul_case(&e, JIT__F16, 3, a2, 3, b2, 22, NULL);
  env_close(&e);
}

static void reduce_case(be_env *e, jit__dtype dt, jit__op op, ref_reduce_op rop, int axis,
                        bool keep) {
  tg t;
  tg_init(&t, jit__op_name(op), dt);
  int64_t da[3] = {5, 19, 33};
  uint32_t x = tg_input(&t, 3, da);
  uint32_t r = tg_reduce(&t, op, x, axis, keep);
  tg_output(&t, r);
  int64_t n = ref_numel(3, da), no = node_elems(&t, r);
  float *a = fmalloc(n), *got = fmalloc(no), *want = fmalloc(no);
  ref_rng rng;
  ref_rng_seed(&rng, 30 + (uint64_t)axis);
  ref_rng_fill_signed(&rng, a, n);
  round_inputs(dt, a, n);
  int64_t dout[JIT_MAX_RANK];
  ref_reduce(rop, a, 3, da, axis, keep, want, dout);
  float *in[1] = {a};
  run_graph(e, &t, in, &got, NULL);
  char what[96];
  snprintf(what, sizeof what, "%s %s over axis %d%s", dt == JIT__F16 ? "f16" : "f32",
           jit__op_name(op), axis, keep ? " (keepdims)" : "");
  assert_close(got, want, no, rtol_for(dt), atol_for(dt, (double)da[axis]), what);
  free(a), free(got), free(want);
}

Test(backend, reductions) {
  be_env e;
  if (!env_open_computing(&e)) return;
  reduce_case(&e, JIT__F32, JIT__OP_REDUCE_SUM, REF_SUM, 1, false);
  reduce_case(&e, JIT__F32, JIT__OP_REDUCE_SUM, REF_SUM, 2, true);
  reduce_case(&e, JIT__F32, JIT__OP_REDUCE_MAX, REF_RMAX, 2, false);
  reduce_case(&e, JIT__F32, JIT__OP_REDUCE_MAX, REF_RMAX, 0, false);
  reduce_case(&e, JIT__F32, JIT__OP_REDUCE_MEAN, REF_MEAN, 0, true);
  reduce_case(&e, JIT__F32, JIT__OP_REDUCE_MEAN, REF_MEAN, 1, false);
  if (e.info.f16) {
    reduce_case(&e, JIT__F16, JIT__OP_REDUCE_SUM, REF_SUM, 1, false);
    reduce_case(&e, JIT__F16, JIT__OP_REDUCE_MAX, REF_RMAX, 2, false);
  }
  env_close(&e);
}

static void softmax_case(jit__dtype dt) {
  be_env e;
  if (!env_open_computing(&e)) return;
  if (!env_f16_ok(&e, dt)) {
    env_close(&e);
    return;
  }
  tg t;
  tg_init(&t, "softmax", dt);
  int64_t da[2] = {7, 300};
  uint32_t x = tg_input(&t, 2, da);
  uint32_t s = tg_unary(&t, JIT__OP_SOFTMAX, x);
  t.nodes[s].axis = 1;
  tg_output(&t, s);
  int64_t n = ref_numel(2, da);
  float *a = fmalloc(n), *got = fmalloc(n), *want = fmalloc(n);
  ref_rng rng;
  ref_rng_seed(&rng, 50);
  ref_rng_fill(&rng, a, n, -5.0f, 5.0f);
  // Rows with +-1000: exp without the max subtraction would overflow to inf / NaN.
  for (int j = 0; j < 300; j += 7) a[1 * 300 + j] = 1000.0f;
  for (int j = 0; j < 300; j++) a[2 * 300 + j] = -1000.0f + (float)(j % 3);
  a[3 * 300 + 5] = 1000.0f;
  a[3 * 300 + 6] = -1000.0f;
  round_inputs(dt, a, n);
  ref_softmax(a, 2, da, 1, want);
  float *in[1] = {a};
  run_graph(&e, &t, in, &got, NULL);
  for (int64_t i = 0; i < n; i++)
    cr_assert(isfinite(got[i]), "softmax element %lld is %g", (long long)i, (double)got[i]);
  assert_close(got, want, n, dt == JIT__F16 ? 2e-2 : 1e-5, dt == JIT__F16 ? 1e-3 : 1e-6,
               "softmax with +-1000 rows");
  free(a), free(got), free(want);
  env_close(&e);
}
Test(backend, softmax_large_values_f32) { softmax_case(JIT__F32); }
Test(backend, softmax_large_values_f16) { softmax_case(JIT__F16); }

static void transpose_case(jit__dtype dt) {
  be_env e;
  if (!env_open_computing(&e)) return;
  if (!env_f16_ok(&e, dt)) {
    env_close(&e);
    return;
  }
  tg t;
  tg_init(&t, "transpose", dt);
  int64_t da[3] = {2, 17, 45}, dr[3] = {45, 2, 17};
  uint32_t x = tg_input(&t, 3, da);
  uint32_t y = tg_node(&t, JIT__OP_TRANSPOSE, 1, x, 0, 3, dr);
  int perm[3] = {2, 0, 1};
  memcpy(t.nodes[y].perm, perm, sizeof perm);
  tg_output(&t, y);
  int64_t n = ref_numel(3, da), dout[3];
  float *a = fmalloc(n), *got = fmalloc(n), *want = fmalloc(n);
  ref_rng rng;
  ref_rng_seed(&rng, 60);
  ref_rng_fill_signed(&rng, a, n);
  round_inputs(dt, a, n);
  ref_transpose(a, 3, da, perm, want, dout);
  float *in[1] = {a};
  run_graph(&e, &t, in, &got, NULL);
  assert_close(got, want, n, 0, 0, "transpose (2,0,1)");
  free(a), free(got), free(want);
  env_close(&e);
}
Test(backend, transpose_f32) { transpose_case(JIT__F32); }
Test(backend, transpose_f16) { transpose_case(JIT__F16); }

Test(backend, reshape) {
  be_env e;
  if (!env_open_computing(&e)) return;
  int64_t da[2] = {6, 35}, dr[3] = {3, 10, 7}, dflat[1] = {210};
  float a[210], got[210], want[210];
  ref_rng rng;
  ref_rng_seed(&rng, 70);
  ref_rng_fill_signed(&rng, a, 210);
  float *in[1] = {a}, *out[1] = {got};
  tg t;
  tg_init(&t, "reshape", JIT__F32);
  uint32_t x = tg_input(&t, 2, da);
  uint32_t y = tg_node(&t, JIT__OP_RESHAPE, 1, x, 0, 3, dr);
  tg_output(&t, tg_unary(&t, JIT__OP_RELU, y));
  ref_unary(REF_RELU, a, 210, want);
  run_graph(&e, &t, in, out, NULL);
  assert_close(got, want, 210, 0, 0, "relu(reshape)");
  tg_init(&t, "reshape_only", JIT__F32);
  x = tg_input(&t, 2, da);
  tg_output(&t, tg_node(&t, JIT__OP_RESHAPE, 1, x, 0, 1, dflat));
  ref_reshape(a, 210, want);
  run_graph(&e, &t, in, out, NULL);
  assert_close(got, want, 210, 0, 0, "reshape only");
  env_close(&e);
}

// matmul + bias + gelu, then a row softmax: two outputs and intermediate buffers.
Test(backend, two_outputs) {
  be_env e;
  if (!env_open_computing(&e)) return;
  tg t;
  tg_init(&t, "mlp", JIT__F32);
  int64_t m = 8, dx[2] = {8, 64}, dw[2] = {64, 96}, dbias[1] = {96}, dc[2] = {8, 96};
  uint32_t x = tg_input(&t, 2, dx), wt = tg_input(&t, 2, dw), bias = tg_input(&t, 1, dbias);
  uint32_t mm = tg_node(&t, JIT__OP_MATMUL, 2, x, wt, 2, dc);
  uint32_t h = tg_unary(&t, JIT__OP_GELU, tg_node(&t, JIT__OP_ADD, 2, mm, bias, 2, dc));
  uint32_t sm = tg_unary(&t, JIT__OP_SOFTMAX, h);
  t.nodes[sm].axis = 1;
  tg_output(&t, h);
  tg_output(&t, sm);
  float xs[8 * 64], w[64 * 96], b[96], hv[8 * 96], sv[8 * 96], wh[8 * 96], ws[8 * 96],
      mmv[8 * 96];
  ref_rng rng;
  ref_rng_seed(&rng, 80);
  ref_rng_fill_signed(&rng, xs, 8 * 64);
  ref_rng_fill_signed(&rng, w, 64 * 96);
  ref_rng_fill_signed(&rng, b, 96);
  int64_t dref[2];
  ref_matmul(xs, 2, dx, w, 2, dw, mmv, dref);
  ref_binary(REF_ADD, mmv, 2, dc, b, 1, dbias, wh);
  ref_unary(REF_GELU, wh, m * 96, wh);
  ref_softmax(wh, 2, dc, 1, ws);
  float *in[3] = {xs, w, b}, *out[2] = {hv, sv};
  run_graph(&e, &t, in, out, NULL);
  assert_close(hv, wh, 8 * 96, 1e-5, 2.0 * 64 * FLT_EPSILON + 1e-6, "gelu(x w + b)");
  assert_close(sv, ws, 8 * 96, 1e-5, 1e-6, "softmax(gelu(x w + b))");
  env_close(&e);
}


//===--- Device-level tests (any device, computing or not) ----------------===//

Test(backend, enumeration) {
  be_env e;
  if (!env_open(&e)) return;
  uint32_t n = e.vt->device_count(e.backend);
  for (uint32_t i = 0; i < n; i++) {
    jit__dev_info info;
    e.vt->device_info(e.backend, i, &info);
    cr_assert(info.name[0], "device %u has no name", i);
    cr_assert(!strncmp(info.target, "backend=", 8), "device %u: key lines `%s`", i,
              info.target);
    cr_assert(info.code == JIT__CODE_SPIRV || info.code == JIT__CODE_PTX);
    if (info.code == JIT__CODE_PTX)
      cr_assert(!strncmp(info.chip, "sm_", 3) && info.isa_max > 0, "chip `%s`", info.chip);
    cr_assert_eq(info.state_kind[0] != 0, e.vt->state_get != NULL);
    NOTE("%s device %u: %s (%s)", e.name, i, info.name, info.chip);
  }
  env_close(&e);
}

// Sizes (zero included), round trips, offsets, and ranges outside the buffer.
Test(backend, buffers_and_transfers) {
  be_env e;
  if (!env_open(&e)) return;
  static const uint64_t sizes[] = {0, 1, 4096, 1u << 20};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    uint64_t n = sizes[i];
    jit__dev_arg a = alloc_arg(&e, n);
    cr_assert_not_null(a.buffer);
    if (n >= 4) {
      unsigned char *src = malloc(n), *back = malloc(n);
      for (uint64_t k = 0; k < n; k++) src[k] = (unsigned char)(k * 7 + i);
      OK(e.vt->upload(e.dev, &a, 0, src, n));
      memset(back, 0, n);
      OK(e.vt->download(e.dev, &a, 0, back, n));
      cr_assert(!memcmp(src, back, n), "round trip of %llu bytes", (unsigned long long)n);
      unsigned char part[4] = {1, 2, 3, 4}, got[4];
      OK(e.vt->upload(e.dev, &a, n - 4, part, 4));
      OK(e.vt->download(e.dev, &a, n - 4, got, 4));
      cr_assert(!memcmp(part, got, 4), "transfer at an offset");
      expect_code(e.vt->upload(e.dev, &a, n - 2, part, 4), JIT_INVALID_ARGUMENT, NULL,
                  "upload past the end");
      expect_code(e.vt->download(e.dev, &a, n, got, 4), JIT_INVALID_ARGUMENT, NULL,
                  "download past the end");
      free(src), free(back);
    }
    e.vt->buffer_free(e.dev, a.buffer);
  }
  OK(e.vt->wait(e.dev));
  env_close(&e);
}

// An artifact of the device's code: c = a + b on 300 floats.
static void add_artifact(be_env *e, jit__gpu_artifact *a) {
  tg t;
  tg_init(&t, "add", JIT__F32);
  int64_t d[1] = {300};
  uint32_t x = tg_input(&t, 1, d), y = tg_input(&t, 1, d);
  tg_output(&t, tg_node(&t, JIT__OP_ADD, 2, x, y, 1, d));
  compile_for(e, &t.g, a);
}

// Loads `d` (expecting `code`, JIT_OK for any failure) and leaves nothing behind.
static void expect_load_fails(be_env *e, const jit__dev_artifact *d, jit_status_code code,
                              const char *what) {
  jit__dev_executable *exe = (jit__dev_executable *)1;
  uint32_t used = 0;
  jit_status s = e->vt->load(e->dev, d, &exe, &used);
  cr_assert_not_null(s, "%s: loaded", what);
  cr_assert_null(exe, "%s: *out not NULLed", what);
  if (code != JIT_OK)
    cr_assert_eq(jit_status_get_code(s), code, "%s: %s", what, jit_status_message(s));
  jit_status_free(s);
}

// Bad artifacts are statuses, never crashes, and the device stays usable.
Test(backend, bad_artifacts_keep_device_usable) {
  be_env e;
  if (!env_open(&e)) return;
  jit__gpu_artifact a;
  add_artifact(&e, &a);
  be_art d;
  art_from(&e, &a, &d);
  jit__dev_kernel k0 = d.kernels[0];
  d.kernels[0].entry = "jitml_no_such_entry";
  expect_load_fails(&e, &d.art, JIT_INVALID_ARGUMENT, "unknown entry");
  d.kernels[0] = k0;
  uint32_t bad_args[8] = {0, 1, 99, 99, 99, 99, 99, 99};
  d.kernels[0].args = bad_args;
  expect_load_fails(&e, &d.art, JIT_INVALID_ARGUMENT, "argument index out of range");
  d.kernels[0] = k0;
  d.kernels[0].grid[1] = 1u << 20;
  expect_load_fails(&e, &d.art, JIT_UNSUPPORTED, "grid over the device's limits");
  d.kernels[0] = k0;
  jit__image other = d.image;
  other.format = d.image.format == JIT__IMAGE_SPIRV ? JIT__IMAGE_PTX
                                                        : JIT__IMAGE_SPIRV;
  d.art.images = &other;
  expect_load_fails(&e, &d.art, JIT_UNSUPPORTED, "no image of the device's code");
  static const uint32_t garbage[16] = {0xdeadbeef, 1, 2, 3};
  jit__image junk = {d.image.format, garbage, sizeof garbage};
  d.art.images = &junk;
  expect_load_fails(&e, &d.art, JIT_OK, "garbage module");
  d.art.images = &d.image;
  // Still usable: the artifact loads and launches (computing or not).
  jit__dev_executable *exe = NULL;
  OK(e.vt->load(e.dev, &d.art, &exe, NULL));
  jit__dev_arg args[3];
  float x[300], y[300], z[300];
  for (int i = 0; i < 300; i++) x[i] = (float)i, y[i] = 0.5f * (float)i;
  for (int b = 0; b < 3; b++) args[b] = alloc_arg(&e, 1200);
  OK(e.vt->upload(e.dev, &args[0], 0, x, 1200));
  OK(e.vt->upload(e.dev, &args[1], 0, y, 1200));
  uint32_t nb = d.art.n_buffers;
  cr_assert_eq(nb, 3u);
  expect_code(e.vt->launch(exe, args, nb - 1), JIT_INVALID_ARGUMENT, NULL,
              "a launch with too few buffers");
  OK(e.vt->launch(exe, args, nb));
  OK(e.vt->wait(e.dev));
  OK(e.vt->download(e.dev, &args[2], 0, z, 1200));
  const char *no = getenv("JITML_TEST_BACKEND_NO_COMPUTE");
  if (!no || !*no || !strcmp(no, "0"))
    for (int i = 0; i < 300; i++) cr_assert_eq(z[i], 1.5f * (float)i, "z[%d] = %g", i, z[i]);
  for (int b = 0; b < 3; b++) e.vt->buffer_free(e.dev, args[b].buffer);
  e.vt->unload(exe);
  art_free(&d);
  jit__gpu_artifact_release(&a);
  env_close(&e);
}

// Devices whose tensors may be foreign memory check it: a host pointer is refused.
Test(backend, foreign_memory_is_checked) {
  be_env e;
  if (!env_open(&e)) return;
  if (!e.info.foreign_memory) {
    NOTE("skipped: %s tensors are always this context's allocations (jit/ checks them)",
         e.name);
    env_close(&e);
    return;
  }
  float host[64] = {0};
  jit__dev_arg a = {host, NULL};
  expect_code(e.vt->upload(e.dev, &a, 0, host, sizeof host), JIT_INVALID_ARGUMENT, NULL,
              "a host pointer as device memory");
  env_close(&e);
}

// Closing with nothing in flight, twice in one process (instances are reference
// counted; a second backend object is independent of the first).
Test(backend, two_backend_objects) {
  be_env a, b;
  if (!env_open(&a)) return;
  cr_assert(env_open(&b));
  jit__dev_arg x = alloc_arg(&a, 64), y = alloc_arg(&b, 64);
  a.vt->buffer_free(a.dev, x.buffer);
  env_close(&a);
  char buf[64] = {1};
  OK(b.vt->upload(b.dev, &y, 0, buf, 64));
  b.vt->buffer_free(b.dev, y.buffer);
  env_close(&b);
}
