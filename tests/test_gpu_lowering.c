//===--- test_gpu_lowering.c - graphs -> PTX / SPIR-V, validated offline ----===//
//
// No GPU needed: each graph is lowered to PTX (assembled by `ptxas -arch=sm_90`) and
// to SPIR-V (checked by `spirv-val --target-env vulkan1.1`), and its launch plan is
// checked for sanity and serialization round trips. A missing tool skips the check
// with a visible "skipped: ... not found" line. The lowering is internal (hidden in
// libjitml.so), so this executable compiles the lowering sources itself.
//
//===----------------------------------------------------------------------===//
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lgraph_builder.h"
#include "cache/artifact.h"
#include "cache/cache.h"
#include "lowering/gpu.h"

//===--- Tools -----------------------------------------------------------===//

static const char *find_tool(const char *name, char *buf, size_t size) {
  const char *dirs[4] = {getenv("CUDA_HOME"), getenv("CUDA_PATH"), "/usr/local/cuda", NULL};
  if (!strcmp(name, "ptxas")) {
    for (int i = 0; i < 3; i++) {
      if (!dirs[i]) continue;
      snprintf(buf, size, "%s/bin/ptxas", dirs[i]);
      if (access(buf, X_OK) == 0) return buf;
    }
  }
  const char *path = getenv("PATH");
  if (!path) return NULL;
  const char *p = path;
  while (*p) {
    const char *e = strchr(p, ':');
    size_t n = e ? (size_t)(e - p) : strlen(p);
    snprintf(buf, size, "%.*s/%s", (int)n, p, name);
    if (n && access(buf, X_OK) == 0) return buf;
    p += n + (e ? 1 : 0);
    if (!e) break;
  }
  return NULL;
}

// Writes `data` to a temp file with `suffix`, runs `cmd_fmt` on it (one %s for the
// tool, one for the file), returns the exit status and logs the tool output.
static int run_tool(const char *tool, const char *args_fmt, const void *data, size_t size,
                    const char *suffix) {
  char path[] = "/tmp/jitml_gpu_XXXXXX";
  int fd = mkstemp(path);
  cr_assert(fd >= 0);
  cr_assert_eq(write(fd, data, size), (ssize_t)size);
  close(fd);
  char file[64], logf[80];
  snprintf(file, sizeof file, "%s%s", path, suffix);
  cr_assert_eq(rename(path, file), 0);
  snprintf(logf, sizeof logf, "%s.log", file);
  char cmd[1024], args[256];
  snprintf(args, sizeof args, args_fmt, file);
  snprintf(cmd, sizeof cmd, "'%s' %s > '%s' 2>&1", tool, args, logf);
  int rc = system(cmd);
  if (rc != 0) {
    FILE *f = fopen(logf, "r");
    char text[4096] = {0};
    if (f) {
      size_t n = fread(text, 1, sizeof text - 1, f);
      text[n] = 0;
      fclose(f);
    }
    cr_log_error("%s failed on %s:\n%s", tool, file, text);
  } else {
    unlink(file);
  }
  unlink(logf);
  return rc;
}

//===--- Checks ----------------------------------------------------------===//

static void check_plan(const jit__lgraph *g, const jit__gpu_plan *p) {
  cr_assert_geq(p->n_kernels, 1);
  cr_assert_geq(p->n_buffers, g->n_inputs + g->n_outputs);
  for (uint32_t i = 0; i < g->n_inputs; i++) {
    const jit__node *n = &g->nodes[g->inputs[i]];
    cr_assert_eq(p->buffers[i].kind, JIT__GPU_BUF_INPUT);
    cr_assert_eq(p->buffers[i].index, i);
    cr_assert_eq(p->buffers[i].bytes, (uint64_t)node_numel(n) * (uint64_t)jit__dtype_bytes(n->dtype));
  }
  for (uint32_t j = 0; j < g->n_outputs; j++) {
    const jit__node *n = &g->nodes[g->outputs[j]];
    const jit__gpu_buffer *b = &p->buffers[g->n_inputs + j];
    cr_assert_eq(b->kind, JIT__GPU_BUF_OUTPUT);
    cr_assert_eq(b->index, j);
    cr_assert_eq(b->bytes, (uint64_t)node_numel(n) * (uint64_t)jit__dtype_bytes(n->dtype));
    // Some kernel writing the output has at least one thread per output element.
    uint64_t best = 0;
    for (uint32_t k = 0; k < p->n_kernels; k++) {
      const jit__gpu_kernel *kk = &p->kernels[k];
      bool uses = false;
      for (uint32_t a = 0; a < kk->n_args; a++) uses |= kk->args[a] == g->n_inputs + j;
      uint64_t threads = 1;
      for (int d = 0; d < 3; d++) threads *= (uint64_t)kk->grid[d] * kk->block[d];
      if (uses && threads > best) best = threads;
    }
    // Past 65535 blocks (of at least 32 threads) in a dim, a block may take several
    // tiles in turn (compile_gpu.c); backend_vulkan's grid test checks those numerically.
    if ((uint64_t)node_numel(n) <= 65535ull * 32)
      cr_assert_geq(best, (uint64_t)node_numel(n), "output %u: %llu threads for %lld elements",
                    j, (unsigned long long)best, (long long)node_numel(n));
  }
  for (uint32_t i = g->n_inputs + g->n_outputs; i < p->n_buffers; i++) {
    cr_assert_eq(p->buffers[i].kind, JIT__GPU_BUF_TEMP);
    cr_assert_gt(p->buffers[i].bytes, 0);
  }
  for (uint32_t k = 0; k < p->n_kernels; k++) {
    const jit__gpu_kernel *kk = &p->kernels[k];
    cr_assert_gt(strlen(kk->entry), 0);
    uint64_t block = (uint64_t)kk->block[0] * kk->block[1] * kk->block[2];
    cr_assert(block >= 1 && block <= 1024, "kernel %u: block of %llu", k,
              (unsigned long long)block);
    cr_assert_geq(kk->n_args, 1);
    for (uint32_t a = 0; a < kk->n_args; a++) cr_assert_lt(kk->args[a], p->n_buffers);
  }
}

// The plan through an artifact record (cache/artifact.h): encoded into *bytes, and
// decoded back into *out (the caller releases it).
static void plan_through_record(const jit__gpu_plan *p, uint8_t **bytes, size_t *size,
                                jit__art *out) {
  jit__art rec = {.target = JIT__PAYLOAD_SPIRV, .has_plan = true, .plan = *p};
  jit_status s = jit__art_encode(&rec, bytes, size);
  cr_assert_null(s, "encode: %s", s ? jit_status_message(s) : "");
  s = jit__art_decode(*bytes, *size, out);
  cr_assert_null(s, "decode: %s", s ? jit_status_message(s) : "");
  cr_assert(out->has_plan);
}

static void check_roundtrip(const jit__gpu_plan *p) {
  uint8_t *bytes = NULL;
  size_t size = 0;
  jit__art rec;
  plan_through_record(p, &bytes, &size, &rec);
  jit__gpu_plan q = rec.plan;
  cr_assert_eq(q.n_buffers, p->n_buffers);
  cr_assert_eq(q.n_kernels, p->n_kernels);
  for (uint32_t i = 0; i < p->n_buffers; i++) {
    cr_assert_eq(q.buffers[i].kind, p->buffers[i].kind);
    cr_assert_eq(q.buffers[i].index, p->buffers[i].index);
    cr_assert_eq(q.buffers[i].bytes, p->buffers[i].bytes);
  }
  for (uint32_t k = 0; k < p->n_kernels; k++) {
    cr_assert_str_eq(q.kernels[k].entry, p->kernels[k].entry);
    cr_assert_arr_eq(q.kernels[k].grid, p->kernels[k].grid, sizeof q.kernels[k].grid);
    cr_assert_arr_eq(q.kernels[k].block, p->kernels[k].block, sizeof q.kernels[k].block);
    cr_assert_eq(q.kernels[k].n_args, p->kernels[k].n_args);
    cr_assert_arr_eq(q.kernels[k].args, p->kernels[k].args,
                     sizeof(uint32_t) * p->kernels[k].n_args);
  }
  jit__art_release(&rec);
  // Every truncation is refused cleanly.
  for (size_t cut = 0; cut < size; cut += 1 + size / 64) {
    jit_status s = jit__art_decode(bytes, cut, &rec);
    cr_assert_not_null(s);
    cr_assert_eq(jit_status_get_code(s), JIT_CACHE_ERROR);
    cr_assert_eq(rec.plan.n_kernels, 0);
    jit_status_free(s);
  }
  free(bytes);
}

// Compiles `g` (its generic kernel, `?` dims kept, when `generic`), failing the test
// with the compile's message.
static void compile_as(const jit__lgraph *g, const jit__gpu_target *t, jit__gpu_artifact *a,
                       bool generic) {
  jit_status s = generic ? jit__compile_gpu_generic(g, NULL, "gg", t, a)
                         : jit__compile_gpu(g, "gk", t, a);
  if (s) {
    char msg[4096];
    snprintf(msg, sizeof msg, "%s", jit_status_message(s));
    jit_status_free(s);
    cr_assert_fail("compiling `%s`%s: %s", g->name, generic ? " generic" : "", msg);
  }
  cr_assert_gt(a->binary_size, 0);
}

static void compile_ok(const jit__lgraph *g, const jit__gpu_target *t, jit__gpu_artifact *a) {
  compile_as(g, t, a, false);
}

static void check_ptx(const jit__lgraph *g) {
  jit__gpu_target t = {.format = JIT__GPU_PTX, .chip = "sm_90"};
  jit__gpu_artifact a;
  compile_ok(g, &t, &a);
  cr_assert_eq(a.format, JIT__GPU_PTX);
  check_plan(g, &a.plan);
  check_roundtrip(&a.plan);
  // Every planned entry is in the PTX.
  char *text = malloc(a.binary_size + 1);
  memcpy(text, a.binary, a.binary_size);
  text[a.binary_size] = 0;
  for (uint32_t k = 0; k < a.plan.n_kernels; k++)
    cr_assert_not_null(strstr(text, a.plan.kernels[k].entry), "entry %s missing",
                       a.plan.kernels[k].entry);
  free(text);
  char buf[1024];
  const char *ptxas = find_tool("ptxas", buf, sizeof buf);
  if (!ptxas) {
    cr_log_warn("skipped: ptxas not found");
  } else {
    cr_assert_eq(run_tool(ptxas, "-arch=sm_90 %s -o /dev/null", a.binary, a.binary_size,
                          ".ptx"),
                 0, "ptxas rejected the PTX of `%s`", g->name);
  }
  jit__gpu_artifact_release(&a);
}

static void check_spirv(const jit__lgraph *g, bool f16) {
  jit__gpu_target t = {.format = JIT__GPU_SPIRV, .spirv_f16 = f16};
  jit__gpu_artifact a;
  compile_ok(g, &t, &a);
  cr_assert_eq(a.format, JIT__GPU_SPIRV);
  cr_assert_eq(a.binary_size % 4, 0);
  uint32_t magic;
  memcpy(&magic, a.binary, 4);
  cr_assert_eq(magic, 0x07230203u);
  check_plan(g, &a.plan);
  char buf[1024];
  const char *val = find_tool("spirv-val", buf, sizeof buf);
  if (!val) {
    cr_log_warn("skipped: spirv-val not found");
  } else {
    cr_assert_eq(run_tool(val, "--target-env vulkan1.1 %s", a.binary, a.binary_size,
                          ".spv"),
                 0, "spirv-val rejected the SPIR-V of `%s`", g->name);
  }
  jit__gpu_artifact_release(&a);
}

static void check_all(const jit__lgraph *g, jit__dtype dt) {
  check_ptx(g);
  check_spirv(g, dt == JIT__F16);
}

//===--- Graphs ----------------------------------------------------------===//

static void g_add_broadcast(tg *t, jit__dtype dt) {
  tg_init(t, "add_broadcast", dt);
  int64_t a[3] = {3, 37, 45}, b[2] = {1, 45};
  uint32_t x = tg_input(t, 3, a), y = tg_input(t, 2, b);
  tg_output(t, tg_node(t, JIT__OP_ADD, 2, x, y, 3, a));
}

static void g_unary_chain(tg *t, jit__dtype dt) {
  tg_init(t, "unary_chain", dt);
  int64_t a[2] = {33, 1000};
  uint32_t x = tg_input(t, 2, a);
  uint32_t e = tg_unary(t, JIT__OP_EXP, x);
  uint32_t h = tg_unary(t, JIT__OP_TANH, e);
  tg_output(t, tg_unary(t, JIT__OP_GELU, h));
}

static void g_matmul(tg *t, jit__dtype dt) {
  tg_init(t, "matmul", dt);
  int64_t a[2] = {17, 31}, b[2] = {31, 45}, c[2] = {17, 45};
  uint32_t x = tg_input(t, 2, a), y = tg_input(t, 2, b);
  tg_output(t, tg_node(t, JIT__OP_MATMUL, 2, x, y, 2, c));
}

static void g_batched_matmul(tg *t, jit__dtype dt) {
  tg_init(t, "batched_matmul", dt);
  int64_t a[3] = {4, 17, 31}, b[2] = {31, 45}, c[3] = {4, 17, 45};
  uint32_t x = tg_input(t, 3, a), y = tg_input(t, 2, b);
  tg_output(t, tg_node(t, JIT__OP_MATMUL, 2, x, y, 3, c));
}

static void g_reduce(tg *t, jit__dtype dt, jit__op op, int axis, bool keep) {
  tg_init(t, jit__op_name(op), dt);
  int64_t a[3] = {5, 19, 33};
  uint32_t x = tg_input(t, 3, a);
  tg_output(t, tg_reduce(t, op, x, axis, keep));
}

static void g_softmax(tg *t, jit__dtype dt) {
  tg_init(t, "softmax", dt);
  int64_t a[2] = {7, 300};
  uint32_t x = tg_input(t, 2, a);
  uint32_t s = tg_unary(t, JIT__OP_SOFTMAX, x);
  t->nodes[s].axis = 1;
  tg_output(t, s);
}

static void g_transpose(tg *t, jit__dtype dt) {
  tg_init(t, "transpose", dt);
  int64_t a[3] = {2, 17, 45}, r[3] = {45, 2, 17};
  uint32_t x = tg_input(t, 3, a);
  uint32_t y = tg_node(t, JIT__OP_TRANSPOSE, 1, x, 0, 3, r);
  t->nodes[y].perm[0] = 2;
  t->nodes[y].perm[1] = 0;
  t->nodes[y].perm[2] = 1;
  tg_output(t, y);
}

static void g_reshape(tg *t, jit__dtype dt) {
  tg_init(t, "reshape", dt);
  int64_t a[2] = {6, 35}, r[3] = {3, 10, 7};
  uint32_t x = tg_input(t, 2, a);
  uint32_t y = tg_node(t, JIT__OP_RESHAPE, 1, x, 0, 3, r);
  tg_output(t, tg_unary(t, JIT__OP_RELU, y));
}

// A pure reshape: bufferization makes it a copy into the output.
static void g_reshape_only(tg *t, jit__dtype dt) {
  tg_init(t, "reshape_only", dt);
  int64_t a[2] = {6, 35}, r[1] = {210};
  uint32_t x = tg_input(t, 2, a);
  tg_output(t, tg_node(t, JIT__OP_RESHAPE, 1, x, 0, 1, r));
}

// An MLP-like chain: matmul + bias + gelu, then a row softmax, two outputs.
static void g_mlp(tg *t, jit__dtype dt) {
  tg_init(t, "mlp", dt);
  int64_t a[2] = {8, 64}, w[2] = {64, 96}, b[1] = {96}, c[2] = {8, 96};
  uint32_t x = tg_input(t, 2, a), wt = tg_input(t, 2, w), bias = tg_input(t, 1, b);
  uint32_t mm = tg_node(t, JIT__OP_MATMUL, 2, x, wt, 2, c);
  uint32_t h = tg_unary(t, JIT__OP_GELU, tg_node(t, JIT__OP_ADD, 2, mm, bias, 2, c));
  uint32_t s = tg_unary(t, JIT__OP_SOFTMAX, h);
  t->nodes[s].axis = 1;
  tg_output(t, h);
  tg_output(t, s);
}

//===--- Tests -----------------------------------------------------------===//

#define GRAPH_TESTS(name, build)                                   \
  Test(gpu_lowering, name##_f32) {                                 \
    tg t;                                                          \
    build(&t, JIT__F32);                                           \
    check_all(&t.g, JIT__F32);                                     \
  }                                                                \
  Test(gpu_lowering, name##_f16) {                                 \
    tg t;                                                          \
    build(&t, JIT__F16);                                           \
    check_all(&t.g, JIT__F16);                                     \
  }

GRAPH_TESTS(add_broadcast, g_add_broadcast)
GRAPH_TESTS(unary_chain, g_unary_chain)
GRAPH_TESTS(matmul, g_matmul)
GRAPH_TESTS(batched_matmul, g_batched_matmul)
GRAPH_TESTS(softmax, g_softmax)
GRAPH_TESTS(transpose, g_transpose)
GRAPH_TESTS(reshape, g_reshape)
GRAPH_TESTS(reshape_only, g_reshape_only)
GRAPH_TESTS(mlp, g_mlp)

static void g_sum1(tg *t, jit__dtype dt) { g_reduce(t, dt, JIT__OP_REDUCE_SUM, 1, false); }
static void g_max2(tg *t, jit__dtype dt) { g_reduce(t, dt, JIT__OP_REDUCE_MAX, 2, false); }
static void g_mean0k(tg *t, jit__dtype dt) { g_reduce(t, dt, JIT__OP_REDUCE_MEAN, 0, true); }
GRAPH_TESTS(reduce_sum, g_sum1)
GRAPH_TESTS(reduce_max, g_max2)
GRAPH_TESTS(reduce_mean_keepdims, g_mean0k)

// A full reduction to a rank-0 result: the work is a bare loop nest, no parallel dim.
static void g_sum_all(tg *t, jit__dtype dt) {
  tg_init(t, "sum_all", dt);
  int64_t a[1] = {1000};
  uint32_t x = tg_input(t, 1, a);
  tg_output(t, tg_reduce(t, JIT__OP_REDUCE_SUM, x, 0, false));
}
GRAPH_TESTS(reduce_to_scalar, g_sum_all)

// The ops real models added: comparisons, where and pow in one fused body.
static void g_select_pow(tg *t, jit__dtype dt) {
  tg_init(t, "select_pow", dt);
  int64_t a[2] = {7, 33};
  uint32_t x = tg_input(t, 2, a), y = tg_input(t, 2, a);
  uint32_t c = tg_node(t, JIT__OP_LESS, 2, x, y, 2, a);
  uint32_t p = tg_node(t, JIT__OP_POW, 2, x, y, 2, a);
  uint32_t w = tg_node(t, JIT__OP_WHERE, 3, c, p, 2, a);
  t->nodes[w].operands[2] = y;
  tg_output(t, w);
}

// conv2d (NCHW, stride 2, padding, groups 1 or 2), then a max and an average pool.
static void g_conv_pool(tg *t, jit__dtype dt, int groups) {
  tg_init(t, groups > 1 ? "conv_pool_groups" : "conv_pool", dt);
  int64_t xd[4] = {2, 4, 9, 11}, wd[4] = {6, 4 / groups, 3, 3}, cd[4] = {2, 6, 5, 6};
  uint32_t x = tg_input(t, 4, xd), w = tg_input(t, 4, wd);
  uint32_t c = tg_node(t, JIT__OP_CONV2D, 2, x, w, 4, cd);
  jit__window cw = {.kernel = {3, 3}, .stride = {2, 2}, .pad = {1, 1, 1, 1},
                    .dilation = {1, 1}, .groups = groups};
  t->nodes[c].win = cw;
  int64_t pd[4] = {2, 6, 4, 5};
  uint32_t m = tg_node(t, JIT__OP_MAX_POOL2D, 1, c, 0, 4, pd);
  jit__window pw = {.kernel = {2, 2}, .stride = {1, 1}, .pad = {0, 0, 0, 0},
                    .dilation = {1, 1}, .groups = 1};
  t->nodes[m].win = pw;
  int64_t ad[4] = {2, 6, 4, 5};
  uint32_t v = tg_node(t, JIT__OP_AVG_POOL2D, 1, m, 0, 4, ad);
  jit__window aw = {.kernel = {3, 3}, .stride = {1, 1}, .pad = {1, 1, 1, 1},
                    .dilation = {1, 1}, .groups = 1, .count_pad = false};
  t->nodes[v].win = aw;
  tg_output(t, v);
}
static void g_conv1(tg *t, jit__dtype dt) { g_conv_pool(t, dt, 1); }
static void g_conv2(tg *t, jit__dtype dt) { g_conv_pool(t, dt, 2); }

// An embedding lookup (int32 ids), a concat, a slice and a pad.
static void g_gather_copies(tg *t, jit__dtype dt) {
  tg_init(t, "gather_copies", dt);
  int64_t td[2] = {50, 8}, id[2] = {3, 5}, gd[3] = {3, 5, 8}, cd[3] = {3, 10, 8},
          sd[3] = {3, 4, 8}, pd[3] = {3, 6, 9};
  uint32_t table = tg_input(t, 2, td), ids = tg_input(t, 2, id);
  t->nodes[ids].dtype = JIT__I32;
  uint32_t g = tg_node(t, JIT__OP_GATHER, 2, table, ids, 3, gd);
  uint32_t c = tg_node(t, JIT__OP_CONCAT, 2, g, g, 3, cd);
  t->nodes[c].axis = 1;
  uint32_t s = tg_node(t, JIT__OP_SLICE, 1, c, 0, 3, sd);
  t->nodes[s].axis = 1;
  t->nodes[s].span = (jit__span){.lo = {-7}, .hi = {JIT_SLICE_END}, .step = 2};
  uint32_t p = tg_node(t, JIT__OP_PAD, 1, s, 0, 3, pd);
  t->nodes[p].span = (jit__span){.lo = {0, 1, 0}, .hi = {0, 1, 1}};
  t->nodes[p].scalar = -1.0;
  tg_output(t, p);
}

// Attention with a mask and the causal limit (the composed form on GPUs).
static void g_attention(tg *t, jit__dtype dt) {
  tg_init(t, "attention", dt);
  int64_t qd[3] = {2, 5, 8}, kd[3] = {2, 7, 8}, vd[3] = {2, 7, 4}, md[2] = {5, 7}, od[3] = {2, 5, 4};
  uint32_t q = tg_input(t, 3, qd), k = tg_input(t, 3, kd), v = tg_input(t, 3, vd),
           m = tg_input(t, 2, md);
  uint32_t a = tg_node(t, JIT__OP_ATTENTION, 3, q, k, 3, od);
  t->nodes[a].operands[2] = v;
  t->nodes[a].operands[3] = m;
  t->nodes[a].n_operands = 4;
  t->nodes[a].scalar = 0.35;
  t->nodes[a].causal = true;
  tg_output(t, a);
}

GRAPH_TESTS(attention, g_attention)

// int8 x int8 -> int32, dequantized: PTX only (the Vulkan target refuses int8).
Test(gpu_lowering, matmul_int8_ptx) {
  tg t;
  tg_init(&t, "matmul_int8", JIT__F32);
  int64_t ad[2] = {5, 33}, bd[2] = {33, 7}, sd[1] = {7}, od[2] = {5, 7};
  uint32_t a = tg_input(&t, 2, ad), b = tg_input(&t, 2, bd), sa = tg_input(&t, 0, NULL),
           sb = tg_input(&t, 1, sd);
  t.nodes[a].dtype = t.nodes[b].dtype = JIT__I8;
  uint32_t m = tg_node(&t, JIT__OP_MATMUL_INT8, 2, a, b, 2, od);
  t.nodes[m].n_operands = 4;
  t.nodes[m].operands[2] = sa;
  t.nodes[m].operands[3] = sb;
  tg_output(&t, m);
  check_ptx(&t.g);
}
GRAPH_TESTS(select_pow, g_select_pow)
GRAPH_TESTS(conv_pool, g_conv1)
GRAPH_TESTS(conv_pool_groups, g_conv2)
GRAPH_TESTS(gather_copies, g_gather_copies)

// Casts to and from integers (jit_cast): f32 -> int8 (quantizing), -> int32 and int64
// outputs, int32 -> f32. PTX only: the Vulkan target refuses int8 (test_cast runs the
// rest on lavapipe).
Test(gpu_lowering, int_casts_ptx) {
  tg t;
  tg_init(&t, "int_casts", JIT__F32);
  int64_t d[2] = {5, 33};
  uint32_t x = tg_input(&t, 2, d), i = tg_input(&t, 2, d);
  t.nodes[i].dtype = JIT__I32;
  jit__dtype to[3] = {JIT__I8, JIT__I32, JIT__I64};
  for (int k = 0; k < 3; k++) {
    uint32_t c = tg_unary(&t, JIT__OP_CAST, x);
    t.nodes[c].dtype = to[k];
    tg_output(&t, c);
  }
  uint32_t f = tg_unary(&t, JIT__OP_CAST, i);
  t.nodes[f].dtype = JIT__F32;
  tg_output(&t, tg_unary(&t, JIT__OP_ROUND, f));
  check_ptx(&t.g);
}

Test(gpu_lowering, matmul_plan_shape) {
  tg t;
  g_matmul(&t, JIT__F32);
  // The plain mapping: one thread per output element.
  jit__gpu_target tgt = {.format = JIT__GPU_PTX, .chip = "sm_90", .plain_kernels = true};
  jit__gpu_artifact a;
  compile_ok(&t.g, &tgt, &a);
  // The matmul kernel is the one with a 16x16 block, reading both inputs.
  bool found = false;
  for (uint32_t k = 0; k < a.plan.n_kernels; k++) {
    const jit__gpu_kernel *kk = &a.plan.kernels[k];
    if (kk->block[0] == 16 && kk->block[1] == 16 && kk->n_args >= 3) {
      found = true;
      cr_assert_geq(kk->grid[0] * 16, 45);
      cr_assert_geq(kk->grid[1] * 16, 17);
    }
  }
  cr_assert(found, "no 16x16 matmul kernel in the plan");
  cr_assert_eq(a.n_tiled, 0);
  jit__gpu_artifact_release(&a);
}

//===--- Tiled kernels (workgroup memory) ----------------------------------===//

// Counts SPIR-V instructions: OpVariable in the Workgroup storage class, and
// OpControlBarrier.
static void spirv_count(const jit__gpu_artifact *a, int *wg_vars, int *barriers) {
  const uint32_t *w = (const uint32_t *)a->binary;
  size_t n = a->binary_size / 4;
  *wg_vars = *barriers = 0;
  for (size_t i = 5; i < n;) {
    uint32_t op = w[i] & 0xffff, len = w[i] >> 16;
    cr_assert(len >= 1 && i + len <= n, "malformed SPIR-V at word %zu", i);
    if (op == 59 && len >= 4 && w[i + 3] == 4) ++*wg_vars;  // OpVariable, Workgroup
    if (op == 224) ++*barriers;                              // OpControlBarrier
    i += len;
  }
}

// Kernels named `*<suffix>`; NULL counts both tiled kinds.
static int count_entries(const jit__gpu_plan *p, const char *suffix) {
  if (!suffix) return count_entries(p, "_mm_kernel") + count_entries(p, "_row_kernel");
  int n = 0;
  size_t ls = strlen(suffix);
  for (uint32_t k = 0; k < p->n_kernels; k++) {
    size_t le = strlen(p->kernels[k].entry);
    n += le >= ls && !strcmp(p->kernels[k].entry + le - ls, suffix);
  }
  return n;
}

static const jit__gpu_kernel *find_entry(const jit__gpu_plan *p, const char *suffix) {
  size_t ls = strlen(suffix);
  for (uint32_t k = 0; k < p->n_kernels; k++) {
    size_t le = strlen(p->kernels[k].entry);
    if (le >= ls && !strcmp(p->kernels[k].entry + le - ls, suffix)) return &p->kernels[k];
  }
  return NULL;
}

// Compiles `g` both ways with the IR kept and checks that `n_tiled` kernels named
// `*<suffix>` use workgroup memory and barriers in the IR, the PTX and the SPIR-V;
// with plain_kernels none does.
static void check_tiled(const jit__lgraph *g, jit__dtype dt, uint32_t n_tiled,
                        const char *suffix) {
  jit__gpu_target ptx = {.format = JIT__GPU_PTX, .chip = "sm_90", .keep_ir = true};
  jit__gpu_artifact a;
  compile_ok(g, &ptx, &a);
  cr_assert_eq(a.n_tiled, n_tiled, "`%s`: %u tiled kernels, want %u", g->name, a.n_tiled,
               n_tiled);
  cr_assert_eq(count_entries(&a.plan, suffix), (int)n_tiled);
  cr_assert_not_null(a.ir);
  if (n_tiled) {
    cr_assert_not_null(strstr(a.ir, "workgroup("), "no workgroup attribution:\n%s", a.ir);
    cr_assert_not_null(strstr(a.ir, "gpu.barrier"), "no barrier:\n%s", a.ir);
    char *text = malloc(a.binary_size + 1);
    memcpy(text, a.binary, a.binary_size);
    text[a.binary_size] = 0;
    cr_assert_not_null(strstr(text, ".shared"), "no .shared in the PTX");
    cr_assert_not_null(strstr(text, "bar.sync"), "no bar.sync in the PTX");
    free(text);
  }
  jit__gpu_artifact_release(&a);

  jit__gpu_target spv = {.format = JIT__GPU_SPIRV, .spirv_f16 = dt == JIT__F16};
  compile_ok(g, &spv, &a);
  cr_assert_eq(a.n_tiled, n_tiled);
  cr_assert_null(a.ir);
  int vars, bars;
  spirv_count(&a, &vars, &bars);
  if (n_tiled) {
    cr_assert_geq(vars, (int)n_tiled, "`%s`: %d Workgroup variables", g->name, vars);
    cr_assert_geq(bars, (int)n_tiled, "`%s`: %d barriers", g->name, bars);
  }
  jit__gpu_artifact_release(&a);

  jit__gpu_target plain = {.format = JIT__GPU_SPIRV, .spirv_f16 = dt == JIT__F16,
                           .plain_kernels = true};
  compile_ok(g, &plain, &a);
  cr_assert_eq(a.n_tiled, 0);
  spirv_count(&a, &vars, &bars);
  cr_assert_eq(vars + bars, 0, "plain kernels use workgroup memory");
  cr_assert_eq(count_entries(&a.plan, suffix), 0);
  jit__gpu_artifact_release(&a);
}

Test(gpu_lowering, tiled_matmul_is_used) {
  for (int f16 = 0; f16 < 2; f16++) {
    jit__dtype dt = f16 ? JIT__F16 : JIT__F32;
    tg t;
    g_matmul(&t, dt);
    check_tiled(&t.g, dt, 1, "_mm_kernel");
    g_batched_matmul(&t, dt);
    check_tiled(&t.g, dt, 1, "_mm_kernel");
    g_mlp(&t, dt);
    check_tiled(&t.g, dt, 3, NULL);  // matmul + softmax's max and sum
  }
  // 17 x 45 outputs: 16 x 16 threads, 1 x 2 outputs each -> a 2 x 2 grid.
  tg t;
  g_matmul(&t, JIT__F32);
  jit__gpu_target tgt = {.format = JIT__GPU_SPIRV};
  jit__gpu_artifact a;
  compile_ok(&t.g, &tgt, &a);
  const jit__gpu_kernel *k = find_entry(&a.plan, "_mm_kernel");
  cr_assert_not_null(k);
  cr_assert_eq(k->block[0], 16);
  cr_assert_eq(k->block[1], 16);
  cr_assert_eq(k->grid[0], 2);
  cr_assert_eq(k->grid[1], 2);
  cr_assert_eq(k->n_args, 3);
  jit__gpu_artifact_release(&a);
}

Test(gpu_lowering, tiled_rows_are_used) {
  for (int f16 = 0; f16 < 2; f16++) {
    jit__dtype dt = f16 ? JIT__F16 : JIT__F32;
    tg t;
    g_softmax(&t, dt);
    check_tiled(&t.g, dt, 2, "_row_kernel");
    g_reduce(&t, dt, JIT__OP_REDUCE_MAX, 2, false);  // 5 x 19 rows of 33
    check_tiled(&t.g, dt, 1, "_row_kernel");
    g_sum_all(&t, dt);  // one row of 1000
    check_tiled(&t.g, dt, 1, "_row_kernel");
    // A reduction over a middle axis is strided: it stays plain.
    g_reduce(&t, dt, JIT__OP_REDUCE_SUM, 1, false);
    check_tiled(&t.g, dt, 0, "_row_kernel");
  }
  // Softmax over 300: 256 threads per row, one workgroup per row.
  tg t;
  g_softmax(&t, JIT__F32);
  jit__gpu_target tgt = {.format = JIT__GPU_PTX, .chip = "sm_90"};
  jit__gpu_artifact a;
  compile_ok(&t.g, &tgt, &a);
  const jit__gpu_kernel *k = find_entry(&a.plan, "_row_kernel");
  cr_assert_not_null(k);
  cr_assert_eq(k->block[0], 256);
  cr_assert_eq(k->grid[0], 7);
  jit__gpu_artifact_release(&a);
}

// Odd shapes through both back halves (ptxas and spirv-val check each).
Test(gpu_lowering, tiled_odd_shapes_validate) {
  static const int64_t mm[][4] = {{0, 2, 3, 5},   {0, 17, 16, 64}, {0, 67, 33, 29},
                                  {3, 19, 23, 70}, {0, 130, 48, 37}};
  for (size_t i = 0; i < sizeof mm / sizeof mm[0]; i++)
    for (int f16 = 0; f16 < 2; f16++) {
      jit__dtype dt = f16 ? JIT__F16 : JIT__F32;
      tg t;
      tg_init(&t, "matmul_odd", dt);
      int64_t B = mm[i][0], M = mm[i][1], K = mm[i][2], N = mm[i][3];
      int64_t a3[3] = {B, M, K}, a2[2] = {M, K}, b[2] = {K, N}, c3[3] = {B, M, N},
              c2[2] = {M, N};
      uint32_t x = B ? tg_input(&t, 3, a3) : tg_input(&t, 2, a2), y = tg_input(&t, 2, b);
      tg_output(&t, B ? tg_node(&t, JIT__OP_MATMUL, 2, x, y, 3, c3)
                      : tg_node(&t, JIT__OP_MATMUL, 2, x, y, 2, c2));
      check_all(&t.g, dt);
      check_tiled(&t.g, dt, 1, "_mm_kernel");
    }
  static const int64_t rows[][2] = {{1, 32}, {3, 33}, {2, 257}, {1, 4099}, {130, 97}};
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    tg t;
    tg_init(&t, "softmax_odd", JIT__F32);
    int64_t d[2] = {rows[i][0], rows[i][1]};
    uint32_t s = tg_unary(&t, JIT__OP_SOFTMAX, tg_input(&t, 2, d));
    t.nodes[s].axis = 1;
    tg_output(&t, s);
    check_all(&t.g, JIT__F32);
    check_tiled(&t.g, JIT__F32, 2, "_row_kernel");
  }
}

// Graphs whose plain kernels would need more than 65535 blocks in a grid dim (the MLP
// 784-256-10 at N = 65,536 was refused: "grid 1x65536x1 exceeds 65535 in y/z"): every
// kernel's grid stays within 65535 per dim, through both back halves.
Test(gpu_lowering, grids_stay_within_65535) {
  tg t;
  tg_init(&t, "mlp_65536", JIT__F32);
  tg_mlp(&t, 65536, 784, 256, 10);
  check_all(&t.g, JIT__F32);
  tg s;
  tg_init(&s, "softmax_70001", JIT__F32);
  int64_t d[2] = {70001, 300};
  uint32_t sm = tg_unary(&s, JIT__OP_SOFTMAX, tg_input(&s, 2, d));
  s.nodes[sm].axis = 1;
  tg_output(&s, sm);
  check_all(&s.g, JIT__F32);
  for (int f = 0; f < 2; f++) {
    jit__gpu_target tgt = {.format = f ? JIT__GPU_SPIRV : JIT__GPU_PTX, .chip = "sm_90"};
    for (int g = 0; g < 2; g++) {
      jit__gpu_artifact a;
      compile_ok(g ? &s.g : &t.g, &tgt, &a);
      for (uint32_t k = 0; k < a.plan.n_kernels; k++)
        for (int dim = 0; dim < 3; dim++)
          cr_expect(a.plan.kernels[k].grid[dim] <= 65535, "%s: kernel %s grid[%d] = %u",
                    g ? "softmax" : "mlp", a.plan.kernels[k].entry, dim,
                    a.plan.kernels[k].grid[dim]);
      jit__gpu_artifact_release(&a);
    }
  }
}

//===--- Generic kernels -------------------------------------------------===//

// The MLP 784-256-10 with its batch N symbolic (code -2).
static void g_mlp_generic(tg *t) {
  tg_init(t, "mlp_generic", JIT__F32);
  tg_mlp(t, -2, 784, 256, 10);
}

// One module for every N: it assembles (ptxas) and validates (spirv-val), its plan
// computes the grids from N (and survives serialization), and N = 65,536 binds
// within 65535 blocks per grid dim or is refused for its exact kernel to serve.
Test(gpu_lowering, generic_mlp_binds_per_n) {
  tg t;
  g_mlp_generic(&t);
  char buf[1024];
  for (int f = 0; f < 2; f++) {
    jit__gpu_target tgt = {.format = f ? JIT__GPU_SPIRV : JIT__GPU_PTX, .chip = "sm_90"};
    jit__gpu_artifact a;
    compile_as(&t.g, &tgt, &a, true);
    const char *tool = find_tool(f ? "spirv-val" : "ptxas", buf, sizeof buf);
    if (tool)
      cr_assert_eq(run_tool(tool, f ? "--target-env vulkan1.1 %s" : "-arch=sm_90 %s -o /dev/null",
                            a.binary, a.binary_size, f ? ".spv" : ".ptx"),
                   0, "%s rejected the generic MLP", f ? "spirv-val" : "ptxas");
    cr_assert_gt(a.plan.n_code, 0);
    bool has_sizes = false, dynamic_grid = false;
    for (uint32_t i = 0; i < a.plan.n_buffers; i++)
      has_sizes |= a.plan.buffers[i].kind == JIT__GPU_BUF_SIZES;
    for (uint32_t k = 0; k < a.plan.n_kernels; k++)
      for (int d = 0; d < 3; d++) dynamic_grid |= a.plan.kernels[k].grid_expr[d].len > 0;
    cr_expect(has_sizes && dynamic_grid);
    uint8_t *bytes;
    size_t size;
    jit__art rec;
    plan_through_record(&a.plan, &bytes, &size, &rec);
    free(bytes);
    jit__gpu_plan back = rec.plan;
    memset(&rec.plan, 0, sizeof rec.plan);
    jit__art_release(&rec);
    cr_expect_eq(back.n_code, a.plan.n_code);
    cr_expect_eq(back.n_sizes, a.plan.n_sizes);
    static const int64_t ns[] = {1, 7, 513, 65536};
    for (size_t i = 0; i < 4; i++) {
      int ranks[6] = {2, 2, 1, 2, 1, 2};
      int64_t dims[6][JIT_MAX_RANK] = {{ns[i], 784}, {784, 256}, {256}, {256, 10}, {10},
                                       {ns[i], 10}};
      jit__gpu_plan bound;
      int32_t *sizes = NULL;
      jit_status s = jit__gpu_plan_bind(&back, 6, ranks, (const int64_t(*)[JIT_MAX_RANK])dims,
                                        &bound, &sizes);
      if (s) {  // only past 65535 blocks
        cr_expect(ns[i] == 65536, "N=%lld: %s", (long long)ns[i], jit_status_message(s));
        jit_status_free(s);
        continue;
      }
      cr_expect_eq(bound.buffers[0].bytes, (uint64_t)ns[i] * 784 * 4);
      cr_expect_eq(bound.buffers[5].bytes, (uint64_t)ns[i] * 10 * 4);
      uint64_t most = 0;
      for (uint32_t k = 0; k < bound.n_kernels; k++) {
        uint64_t threads = 1;
        for (int d = 0; d < 3; d++) threads *= (uint64_t)bound.kernels[k].grid[d] *
                                               bound.kernels[k].block[d];
        if (threads > most) most = threads;
      }
      cr_expect_geq(most, (uint64_t)ns[i] * 256, "N=%lld: %llu threads", (long long)ns[i],
                    (unsigned long long)most);
      free(sizes);
      jit__gpu_plan_release(&bound);
    }
    jit__gpu_plan_release(&back);
    jit__gpu_artifact_release(&a);
  }
}

Test(gpu_lowering, softmax_has_temps) {
  tg t;
  g_softmax(&t, JIT__F32);
  jit__gpu_target tgt = {.format = JIT__GPU_PTX, .chip = "sm_90"};
  jit__gpu_artifact a;
  compile_ok(&t.g, &tgt, &a);
  cr_assert_gt(a.plan.n_buffers, 2, "softmax needs intermediate buffers");
  cr_assert_gt(a.plan.n_kernels, 1);
  jit__gpu_artifact_release(&a);
}

//===--- Bad targets and bad bytes ---------------------------------------===//

static jit_status_code compile_code(const jit__gpu_target *t, jit__dtype dt) {
  tg g;
  g_add_broadcast(&g, dt);
  jit__gpu_artifact a;
  jit_status s = jit__compile_gpu(&g.g, "gk", t, &a);
  jit_status_code c = s ? jit_status_get_code(s) : JIT_OK;
  if (s) {
    cr_assert_null(a.binary);
    cr_assert_eq(a.plan.n_kernels, 0);
  }
  jit_status_free(s);
  jit__gpu_artifact_release(&a);
  return c;
}

Test(gpu_lowering, unknown_chip_is_unsupported) {
  const char *bad[] = {"sm_91", "sm_9", "", "compute_90", "gfx90a"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    jit__gpu_target t = {.format = JIT__GPU_PTX, .chip = bad[i]};
    cr_assert_eq(compile_code(&t, JIT__F32), JIT_UNSUPPORTED, "chip `%s`", bad[i]);
  }
  jit__gpu_target t = {.format = JIT__GPU_PTX, .chip = NULL};
  cr_assert_eq(compile_code(&t, JIT__F32), JIT_UNSUPPORTED);
}

Test(gpu_lowering, bad_ptx_version_is_unsupported) {
  // 6.0 cannot target sm_90 (LLVM would abort); 7.9 does not exist.
  int bad[] = {60, 77, 79, 99, -1};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    jit__gpu_target t = {.format = JIT__GPU_PTX, .chip = "sm_90", .ptx_version = bad[i]};
    cr_assert_eq(compile_code(&t, JIT__F32), JIT_UNSUPPORTED, "ptx %d", bad[i]);
  }
  jit__gpu_target ok = {.format = JIT__GPU_PTX, .chip = "sm_90", .ptx_version = 80};
  cr_assert_eq(compile_code(&ok, JIT__F32), JIT_OK);
}

Test(gpu_lowering, other_chips) {
  const char *chips[] = {"sm_80", "sm_90a", "sm_120"};
  for (size_t i = 0; i < sizeof chips / sizeof chips[0]; i++) {
    jit__gpu_target t = {.format = JIT__GPU_PTX, .chip = chips[i]};
    cr_assert_eq(compile_code(&t, JIT__F32), JIT_OK, "chip `%s`", chips[i]);
  }
}

Test(gpu_lowering, spirv_f16_needs_flag) {
  jit__gpu_target t = {.format = JIT__GPU_SPIRV};
  cr_assert_eq(compile_code(&t, JIT__F16), JIT_UNSUPPORTED);
  jit__gpu_target bad = {.format = (jit__gpu_format)7};
  cr_assert_eq(compile_code(&bad, JIT__F32), JIT_UNSUPPORTED);
}

