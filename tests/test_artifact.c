//===--- test_artifact.c - the artifact record's encoder and decoder -------===//
//
// Round trips of every section, and damage: every truncation, every single-bit flip,
// another version, a section past the end, counts larger than the bytes, duplicate
// and unknown tags. The decoder must refuse each with JIT_CACHE_ERROR (never read out
// of bounds: this suite runs under ASan in CI) and leave nothing allocated.
//
//===----------------------------------------------------------------------===//
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "base/bytes.h"
#include "cache/artifact.h"
#include "cache/cache.h"

// A generic kernel's launch plan: an input, an output, a SIZES buffer, two kernels,
// programs for a size, a buffer's bytes and a grid dim. Static storage: borrowed by
// the records below.
static jit__gpu_buffer g_buffers[3] = {
    {JIT__GPU_BUF_INPUT, 0, 4096, {0, 0}},
    {JIT__GPU_BUF_OUTPUT, 0, 0, {0, 3}},
    {JIT__GPU_BUF_SIZES, 0, 8, {0, 0}},
};
static uint32_t g_args0[2] = {0, 2}, g_args1[3] = {0, 1, 2};
static jit__gx g_code[4] = {
    {JIT__GX_DIM, 0, 0}, {JIT__GX_CONST, 0, 4}, {JIT__GX_MUL, 0, 0}, {JIT__GX_CONST, 0, 7}};
static jit__gpu_expr g_sizes[2] = {{0, 1}, {3, 1}};

static jit__gpu_plan test_plan(void) {
  static jit__gpu_kernel kernels[2];
  memset(kernels, 0, sizeof kernels);
  kernels[0] = (jit__gpu_kernel){"jit_k0_kernel", {3, 1, 1}, {256, 1, 1}, 2, g_args0,
                                 {{0, 1}, {0, 0}, {0, 0}}};
  kernels[1] = (jit__gpu_kernel){"jit_k1_mm_kernel", {1, 2, 1}, {16, 16, 1}, 3, g_args1,
                                 {{0, 0}, {0, 0}, {0, 0}}};
  return (jit__gpu_plan){3, g_buffers, 2, kernels, 4, g_code, 2, g_sizes};
}

// A record with every section: a CUDA-like entry of two parts with a generic plan and
// notes, outputs of rank 0, 1 and JIT_MAX_RANK.
static void full_record(jit__art *a, jit__art_shape *outs) {
  memset(a, 0, sizeof *a);
  a->target = JIT__PAYLOAD_CUBIN;
  strcpy(a->entry, "jit_kernel_17");
  a->n_args = 5;
  a->stack_bytes = 262144;
  a->n_outputs = 3;
  outs[0] = (jit__art_shape){0, 0, {0}};
  outs[1] = (jit__art_shape){1, 1, {17}};
  outs[2].rank = JIT_MAX_RANK;
  outs[2].dtype = 0;
  for (int d = 0; d < JIT_MAX_RANK; d++) outs[2].dims[d] = (int64_t)d * 1000003 + 1;
  a->outputs = outs;
  a->n_parts = 2;
  a->parts[0] = (jit__art_part){JIT__PAYLOAD_PTX, 12345};
  a->parts[1] = (jit__art_part){JIT__PAYLOAD_CUBIN, 678};
  a->has_plan = true;
  a->plan = test_plan();
  a->notes = "sm=sm_90\nptxas=13.0\n";
}

static uint8_t *encode(const jit__art *a, size_t *n) {
  uint8_t *bytes = NULL;
  jit_status s = jit__art_encode(a, &bytes, n);
  cr_assert_null(s, "encode: %s", s ? jit_status_message(s) : "");
  return bytes;
}

// Decoding `bytes` fails with JIT_CACHE_ERROR and leaves `out` empty.
static void expect_refused(const uint8_t *bytes, size_t n, const char *what) {
  jit__art out;
  jit_status s = jit__art_decode(bytes, n, &out);
  cr_expect_not_null(s, "%s: decoded", what);
  if (s) {
    cr_expect_eq(jit_status_get_code(s), JIT_CACHE_ERROR, "%s: %s", what,
                 jit_status_message(s));
    jit_status_free(s);
  }
  cr_expect(out.outputs == NULL && !out.has_plan && out.plan.buffers == NULL &&
                out.plan.kernels == NULL && out.plan.code == NULL && out.notes == NULL,
            "%s: a refused record still owns memory", what);
  jit__art_release(&out);
}

Test(artifact, round_trip_of_every_section) {
  jit__art a;
  jit__art_shape outs[3];
  full_record(&a, outs);
  size_t n = 0;
  uint8_t *bytes = encode(&a, &n);
  jit__art b;
  jit_status s = jit__art_decode(bytes, n, &b);
  cr_assert_null(s, "decode: %s", s ? jit_status_message(s) : "");
  cr_expect_eq(b.target, JIT__PAYLOAD_CUBIN);
  cr_expect_str_eq(b.entry, "jit_kernel_17");
  cr_expect_eq(b.n_args, 5);
  cr_expect_eq(b.stack_bytes, 262144);
  cr_assert_eq(b.n_outputs, 3);
  for (int i = 0; i < 3; i++) {
    cr_expect_eq(b.outputs[i].rank, outs[i].rank, "output %d rank", i);
    cr_expect_eq(b.outputs[i].dtype, outs[i].dtype, "output %d dtype", i);
    for (int d = 0; d < outs[i].rank; d++)
      cr_expect_eq(b.outputs[i].dims[d], outs[i].dims[d], "output %d dim %d", i, d);
  }
  cr_assert_eq(b.n_parts, 2);
  cr_expect(b.parts[0].kind == JIT__PAYLOAD_PTX && b.parts[0].size == 12345);
  cr_expect(b.parts[1].kind == JIT__PAYLOAD_CUBIN && b.parts[1].size == 678);
  cr_expect_eq(jit__art_parts_size(&b), 12345 + 678);
  cr_assert(b.has_plan);
  const jit__gpu_plan *p = &a.plan, *q = &b.plan;
  cr_assert(q->n_buffers == 3 && q->n_kernels == 2 && q->n_code == 4 && q->n_sizes == 2);
  for (uint32_t i = 0; i < 3; i++)
    cr_expect(q->buffers[i].kind == p->buffers[i].kind &&
                  q->buffers[i].index == p->buffers[i].index &&
                  q->buffers[i].bytes == p->buffers[i].bytes &&
                  q->buffers[i].bytes_expr.at == p->buffers[i].bytes_expr.at &&
                  q->buffers[i].bytes_expr.len == p->buffers[i].bytes_expr.len,
              "buffer %u", i);
  for (uint32_t k = 0; k < 2; k++) {
    cr_expect_str_eq(q->kernels[k].entry, p->kernels[k].entry);
    cr_expect_arr_eq(q->kernels[k].grid, p->kernels[k].grid, sizeof q->kernels[k].grid);
    cr_expect_arr_eq(q->kernels[k].block, p->kernels[k].block, sizeof q->kernels[k].block);
    cr_assert_eq(q->kernels[k].n_args, p->kernels[k].n_args);
    cr_expect_arr_eq(q->kernels[k].args, p->kernels[k].args, 4 * p->kernels[k].n_args);
    cr_expect_arr_eq(q->kernels[k].grid_expr, p->kernels[k].grid_expr,
                     sizeof q->kernels[k].grid_expr);
  }
  for (uint32_t i = 0; i < 4; i++)
    cr_expect(q->code[i].op == g_code[i].op && q->code[i].aux == g_code[i].aux &&
                  q->code[i].v == g_code[i].v, "op %u", i);
  cr_expect_arr_eq(q->sizes, g_sizes, sizeof g_sizes);
  cr_expect_str_eq(b.notes, "sm=sm_90\nptxas=13.0\n");
  jit__art_release(&b);
  free(bytes);
}

// A CPU kernel that reads two of its inputs as packed panels (jit_weight) says so in
// its record; a record naming an argument past the kernel's is refused both ways.
Test(artifact, packed_inputs_round_trip) {
  jit__art a;
  memset(&a, 0, sizeof a);
  a.target = JIT__PAYLOAD_CPU_OBJECT;
  snprintf(a.entry, sizeof a.entry, "jit_k");
  a.n_args = 4;
  a.n_packed = 2;
  a.packed[0] = (jit__art_packed){1, 64, 0};
  a.packed[1] = (jit__art_packed){2, 32, 1};
  size_t n = 0;
  uint8_t *bytes = encode(&a, &n);
  jit__art b;
  jit_status s = jit__art_decode(bytes, n, &b);
  cr_assert_null(s, "decode: %s", s ? jit_status_message(s) : "");
  cr_expect_eq(b.n_packed, 2);
  cr_expect(b.packed[0].arg == 1 && b.packed[0].tn == 64 && !b.packed[0].transposed);
  cr_expect(b.packed[1].arg == 2 && b.packed[1].tn == 32 && b.packed[1].transposed == 1);
  jit__art_release(&b);
  free(bytes);
  a.packed[1].arg = 4;  // past the 4 arguments
  uint8_t *bad = NULL;
  s = jit__art_encode(&a, &bad, &n);
  cr_expect_not_null(s, "encoded a packed argument past the last");
  jit_status_free(s);
  free(bad);
}

// The smallest record (a CPU kernel of no outputs, no entry point, no parts) decodes
// to exactly that, with nothing allocated that a caller could misread.
Test(artifact, minimal_record) {
  jit__art a = {.target = JIT__PAYLOAD_CPU_OBJECT, .n_args = 1};
  size_t n = 0;
  uint8_t *bytes = encode(&a, &n);
  jit__art b;
  jit_status s = jit__art_decode(bytes, n, &b);
  cr_assert_null(s, "decode: %s", s ? jit_status_message(s) : "");
  cr_expect(b.entry[0] == 0 && b.n_outputs == 0 && b.n_parts == 0 && !b.has_plan &&
            !b.notes);
  jit__art_release(&b);
  free(bytes);
}

Test(artifact, every_truncation_and_bit_flip_is_refused) {
  jit__art a;
  jit__art_shape outs[3];
  full_record(&a, outs);
  size_t n = 0;
  uint8_t *bytes = encode(&a, &n);
  char what[64];
  for (size_t len = 0; len < n; len++) {
    snprintf(what, sizeof what, "truncated to %zu of %zu bytes", len, n);
    expect_refused(bytes, len, what);
  }
  uint8_t *copy = malloc(n);
  for (size_t bit = 0; bit < n * 8; bit++) {
    memcpy(copy, bytes, n);
    copy[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    snprintf(what, sizeof what, "bit %zu flipped", bit);
    expect_refused(copy, n, what);
  }
  free(copy);
  free(bytes);
}

// Re-seals a record whose body was edited: the checksum is right again, so only
// the decoder's own checks stand between the bytes and the caller.
static void reseal(uint8_t *bytes, size_t n) {
  jit__le_put_u64(bytes + n - 8, XXH3_64bits(bytes, n - 20));
}

Test(artifact, foreign_version_is_named) {
  jit__art a = {.target = JIT__PAYLOAD_CPU_OBJECT, .n_args = 1};
  size_t n = 0;
  uint8_t *bytes = encode(&a, &n);
  jit__le_put_u32(bytes + 4, 7);
  reseal(bytes, n);
  jit__art b;
  jit_status s = jit__art_decode(bytes, n, &b);
  cr_assert_not_null(s);
  cr_expect_eq(jit_status_get_code(s), JIT_CACHE_ERROR);
  cr_expect(strstr(jit_status_message(s), "version 7, expected 2") != NULL, "%s",
            jit_status_message(s));
  jit_status_free(s);
  free(bytes);
}

// Sealed records whose sections lie: a size past the end, an output count the bytes
// cannot hold, a rank past JIT_MAX_RANK, an entry point without its NUL, a tag this
// version does not define, a tag twice.
Test(artifact, sealed_lies_are_refused) {
  const struct {
    const char *what;
    uint32_t tag;
    uint32_t words[4];
    int n_words;
  } cases[] = {
      {"section past the end", 2, {0}, -1},
      {"output count past the bytes", 3, {0x40000000u, 0, 0, 0}, 1},
      {"rank past JIT_MAX_RANK", 3, {1, JIT_MAX_RANK + 1, 0, 0}, 2},
      {"entry point without its NUL", 1, {0x41414141u, 0, 0, 0}, 1},
      {"undefined tag", 99, {0, 0, 0, 0}, 1},
      {"args twice", 2, {1, 0, 0, 0}, 2},
  };
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    jit__bytes_writer w = {0};
    jit__bw_put(&w, "JART", 4);
    jit__bw_u32(&w, JIT__ART_VERSION);
    jit__bw_u32(&w, JIT__PAYLOAD_CPU_OBJECT);
    jit__bw_u32(&w, 2);  // ARGS
    jit__bw_u64(&w, 8);
    jit__bw_u32(&w, 1);
    jit__bw_u32(&w, 0);
    jit__bw_u32(&w, 3);  // OUTPUTS: none
    jit__bw_u64(&w, 4);
    jit__bw_u32(&w, 0);
    jit__bw_u32(&w, cases[c].tag);
    if (cases[c].n_words < 0) {
      jit__bw_u64(&w, 1u << 20);
    } else {
      jit__bw_u64(&w, 4 * (uint64_t)cases[c].n_words);
      for (int i = 0; i < cases[c].n_words; i++) jit__bw_u32(&w, cases[c].words[i]);
    }
    jit__bw_u32(&w, 0);
    jit__bw_u64(&w, 8);
    jit__bw_u64(&w, 0);
    cr_assert(!w.oom);
    reseal(w.p, w.len);
    expect_refused(w.p, w.len, cases[c].what);
    free(w.p);
  }
}

// Plans whose kernels name a buffer the plan lacks, whose programs run past the code,
// or with an op that does not exist: the encoder refuses to write them and the decoder
// refuses them sealed (the bytes patched after a valid encoding).
Test(artifact, plans_that_point_past_their_tables_are_refused) {
  jit__art a = {.target = JIT__PAYLOAD_SPIRV, .has_plan = true, .plan = test_plan()};
  size_t n = 0;
  uint8_t *good = encode(&a, &n);
  // Where each lie goes: found as a run of u32 words, then `delta` bytes on.
  struct {
    const char *what;
    uint32_t find[4];
    int delta;
    uint32_t value;
  } cases[] = {
      // kernel 0's block, argument count, then args[0]
      {"argument past the buffers", {256, 1, 1, 2}, 16, 3},
      // the last op (CONST 7), then buffer 0's program {at, len}
      {"program past the code", {JIT__GX_CONST, 0, 7, 0}, 16, 9},
      // the MUL op
      {"undefined op", {JIT__GX_MUL, 0, 0, 0}, 0, 99},
  };
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    uint8_t *bytes = malloc(n);
    memcpy(bytes, good, n);
    size_t at = 0;
    for (size_t i = 12; i + 16 <= n - 20 && !at; i += 4) {
      bool all = true;
      for (int w = 0; w < 4; w++)
        all = all && jit__le_get_u32(bytes + i + 4 * w) == cases[c].find[w];
      if (all) at = i;
    }
    cr_assert(at, "%s: its bytes not found", cases[c].what);
    jit__le_put_u32(bytes + at + cases[c].delta, cases[c].value);
    reseal(bytes, n);
    expect_refused(bytes, n, cases[c].what);
    free(bytes);
  }
  free(good);
  // The encoder: an argument naming buffer 3 of 3.
  jit__gpu_plan bad = test_plan();
  uint32_t args[2] = {0, 3};
  bad.kernels[0].args = args;
  jit__art b = {.target = JIT__PAYLOAD_SPIRV, .has_plan = true, .plan = bad};
  uint8_t *bytes = NULL;
  jit_status s = jit__art_encode(&b, &bytes, &n);
  cr_expect(s && jit_status_get_code(s) == JIT_INTERNAL && !bytes);
  jit_status_free(s);
  test_plan();  // restores the static kernels
}

Test(artifact, encoder_refuses_what_it_could_not_read_back) {
  jit__art_shape bad_rank = {JIT_MAX_RANK + 1, 0, {0}};
  jit__art a = {.target = JIT__PAYLOAD_CPU_OBJECT, .n_outputs = 1, .outputs = &bad_rank};
  uint8_t *bytes = (uint8_t *)1;
  size_t n = 1;
  jit_status s = jit__art_encode(&a, &bytes, &n);
  cr_expect_not_null(s);
  cr_expect(bytes == NULL && n == 0);
  jit_status_free(s);
  jit__art b = {.target = JIT__PAYLOAD_CPU_OBJECT};
  memset(b.entry, 'x', sizeof b.entry);  // no NUL
  s = jit__art_encode(&b, &bytes, &n);
  cr_expect_not_null(s);
  jit_status_free(s);
}
