//===--- lgraph_builder.h - hand-built jit__lgraph graphs for GPU tests -----===//
//
// Shared by the tests of the internal GPU lowering and devices (test_gpu_lowering.c,
// test_vulkan.c, test_cuda.c), which build jit__lgraph instances by hand instead of
// going through the public API: a small fixed-size graph builder (tg, tg_*), element
// counts, and the status helpers (OK, expect_code) and timer (now_ms) those tests use.
// Everything is static inline, so each test executable gets its own copy and unused
// helpers cost nothing. Needs Criterion (cr_assert) and _GNU_SOURCE (clock_gettime).
//
// Define LGRAPH_LOG_TAG (a string literal, e.g. "cuda") before including this header
// to have expect_code print every failure it checks to stderr as
// "<tag>: <what> -> <code>: <message>", so the log shows what a user would see.
//
//===----------------------------------------------------------------------===//
#ifndef JITML_TESTS_LGRAPH_BUILDER_H
#define JITML_TESTS_LGRAPH_BUILDER_H

#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "lowering/lower.h"

//===--- Helpers ---------------------------------------------------------===//

static inline double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

// Fails the test with the status's message (and frees it) unless it is NULL.
#define OK(expr)                                                                    \
  do {                                                                              \
    jit_status ok__ = (expr);                                                       \
    if (ok__) {                                                                     \
      char ok__msg[4096];                                                           \
      snprintf(ok__msg, sizeof ok__msg, "%s: %s",                                   \
               jit_status_code_name(jit_status_get_code(ok__)), jit_status_message(ok__)); \
      jit_status_free(ok__);                                                        \
      cr_assert_fail("%s failed: %s", #expr, ok__msg);                              \
    }                                                                               \
  } while (0)

// Asserts `s` failed with `code` and (if non-NULL) a message containing `part`; with
// LGRAPH_LOG_TAG defined, also prints the message (see the top of this file).
static inline void expect_code(jit_status s, jit_status_code code, const char *part,
                               const char *what) {
  cr_assert_not_null(s, "%s: succeeded, want %s", what, jit_status_code_name(code));
  char msg[4096];
  snprintf(msg, sizeof msg, "%s", jit_status_message(s));
  jit_status_code got = jit_status_get_code(s);
  jit_status_free(s);
#ifdef LGRAPH_LOG_TAG
  fprintf(stderr, LGRAPH_LOG_TAG ": %s -> %s: %s\n", what, jit_status_code_name(got), msg);
#endif
  cr_assert_eq(got, code, "%s: got %s (%s), want %s", what, jit_status_code_name(got), msg,
               jit_status_code_name(code));
  if (part) cr_assert_not_null(strstr(msg, part), "%s: message `%s` lacks `%s`", what, msg, part);
}

//===--- Graph building --------------------------------------------------===//

#define MAXN 16

typedef struct tg {
  jit__node nodes[MAXN];
  uint32_t inputs[8], outputs[8];
  jit__lgraph g;
  jit__dtype dt;
} tg;

static inline void tg_init(tg *t, const char *name, jit__dtype dt) {
  memset(t, 0, sizeof *t);
  t->g.name = name;
  t->g.nodes = t->nodes;
  t->g.inputs = t->inputs;
  t->g.outputs = t->outputs;
  t->dt = dt;
}

static inline uint32_t tg_node(tg *t, jit__op op, int n_ops, uint32_t a, uint32_t b,
                               int rank, const int64_t *dims) {
  uint32_t id = t->g.n_nodes++;
  cr_assert(id < MAXN);
  jit__node *n = &t->nodes[id];
  n->op = op;
  n->dtype = t->dt;
  n->n_operands = n_ops;
  n->operands[0] = a;
  n->operands[1] = b;
  n->rank = rank;
  if (rank) memcpy(n->dims, dims, sizeof(int64_t) * (size_t)rank);
  return id;
}

static inline uint32_t tg_input(tg *t, int rank, const int64_t *dims) {
  uint32_t id = tg_node(t, JIT__OP_INPUT, 0, 0, 0, rank, dims);
  cr_assert(t->g.n_inputs < 8);
  t->inputs[t->g.n_inputs++] = id;
  return id;
}

static inline void tg_output(tg *t, uint32_t id) {
  cr_assert(t->g.n_outputs < 8);
  t->outputs[t->g.n_outputs++] = id;
}

static inline uint32_t tg_unary(tg *t, jit__op op, uint32_t x) {
  return tg_node(t, op, 1, x, 0, t->nodes[x].rank, t->nodes[x].dims);
}

static inline uint32_t tg_reduce(tg *t, jit__op op, uint32_t x, int axis, bool keepdims) {
  const jit__node *xn = &t->nodes[x];
  int64_t dims[JIT_MAX_RANK];
  int r = 0;
  for (int d = 0; d < xn->rank; d++) {
    if (d == axis) {
      if (keepdims) dims[r++] = 1;
    } else {
      dims[r++] = xn->dims[d];
    }
  }
  uint32_t id = tg_node(t, op, 1, x, 0, r, dims);
  t->nodes[id].axis = axis;
  t->nodes[id].keepdims = keepdims;
  return id;
}

// relu(x W1 + b1) W2 + b2 with x [n, in], W1 [in, hid], W2 [hid, out] (n may be a
// symbol code, < -1); inputs in that order: x, W1, b1, W2, b2.
static inline void tg_mlp(tg *t, int64_t n, int64_t in, int64_t hid, int64_t out) {
  int64_t dx[2] = {n, in}, dw1[2] = {in, hid}, db1[1] = {hid}, dh[2] = {n, hid},
          dw2[2] = {hid, out}, db2[1] = {out}, dy[2] = {n, out};
  uint32_t x = tg_input(t, 2, dx), w1 = tg_input(t, 2, dw1), b1 = tg_input(t, 1, db1);
  uint32_t w2 = tg_input(t, 2, dw2), b2 = tg_input(t, 1, db2);
  uint32_t h = tg_node(t, JIT__OP_MATMUL, 2, x, w1, 2, dh);
  h = tg_unary(t, JIT__OP_RELU, tg_node(t, JIT__OP_ADD, 2, h, b1, 2, dh));
  uint32_t y = tg_node(t, JIT__OP_MATMUL, 2, h, w2, 2, dy);
  tg_output(t, tg_node(t, JIT__OP_ADD, 2, y, b2, 2, dy));
}

// Elements of a node (the product of its dims; 1 for a scalar).
static inline int64_t node_numel(const jit__node *n) {
  int64_t e = 1;
  for (int d = 0; d < n->rank; d++) e *= n->dims[d];
  return e;
}

// Elements of node `id` of `t`.
static inline int64_t node_elems(const tg *t, uint32_t id) { return node_numel(&t->nodes[id]); }

#endif  // JITML_TESTS_LGRAPH_BUILDER_H
