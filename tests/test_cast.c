//===--- test_cast.c - jit_cast to and from integers ----------------------===//
//
// jit_cast between floats (f32, f16, bf16) and integers (int8, int32, int64) against a
// plain-C reference of the documented rules: float -> int truncates toward zero,
// saturates to the integer's range and makes NaN 0; int -> float rounds to nearest
// even; int -> int sign-extends or wraps. Shapes with 1, a prime and a non-multiple of
// the vector width, static and symbolic (the generic kernel). Integer casts feeding
// jit_matmul_int8 (dynamic quantization inside a graph), integer outputs, and the dtype
// rules. Run on the CPU, and on Vulkan and CUDA by the ops_cast_* legs
// ($JITML_TEST_DEVICE); Vulkan has no int8 and says so (JIT_UNSUPPORTED).
//
//===----------------------------------------------------------------------===//
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jitml.h"
#include "ref.h"
#include "util.h"

#define TU_I8 ((DLDataType){kDLInt, 8, 1})
#define TU_I32 ((DLDataType){kDLInt, 32, 1})
#define TU_I64 ((DLDataType){kDLInt, 64, 1})
#define TU_BF16 ((DLDataType){kDLBfloat, 16, 1})

static const char *device_name(void) {
  const char *d = getenv("JITML_TEST_DEVICE");
  return d && d[0] ? d : "cpu";
}

// The reference of float -> int`bits`.
static int64_t ref_to_int(double x, int bits) {
  double lo = -ldexp(1.0, bits - 1), top = ldexp(1.0, bits - 1);
  int64_t max = bits == 64 ? INT64_MAX : (int64_t)top - 1;
  if (isnan(x)) return 0;
  if (x >= top) return max;
  if (x <= lo) return bits == 64 ? INT64_MIN : (int64_t)lo;
  return (int64_t)trunc(x);
}

static uint16_t ref_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40u);
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

static float ref_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static int dl_bytes(DLDataType t) { return t.bits / 8; }

// Element i of `p` (of dtype `t`) as a double.
static double load(const void *p, DLDataType t, int64_t i) {
  if (t.code == kDLInt)
    return t.bits == 8 ? ((const int8_t *)p)[i] : t.bits == 32 ? ((const int32_t *)p)[i]
                                                               : (double)((const int64_t *)p)[i];
  if (t.code == kDLBfloat) return ref_bf16_to_f32(((const uint16_t *)p)[i]);
  if (t.bits == 16) return ref_f16_to_f32(((const uint16_t *)p)[i]);
  return ((const float *)p)[i];
}

static void store_float(void *p, DLDataType t, int64_t i, float v) {
  if (t.code == kDLBfloat) ((uint16_t *)p)[i] = ref_f32_to_bf16(v);
  else if (t.bits == 16) ((uint16_t *)p)[i] = ref_f32_to_f16(v);
  else ((float *)p)[i] = v;
}

// Inputs of dtype `from`: floats with halves, negatives, range ends and past them, NaN
// and infinities; integers with the extremes of their range.
static void *make_input(DLDataType from, int64_t n) {
  void *p = tu_malloc((size_t)(n * dl_bytes(from) + 8));
  static const double special[] = {0.0, 1.5, -1.5, 2.5, -2.7, 126.9, 127.5, -128.9,
                                   300.0, -70000.0, 1e10, -1e10, 3e38, INFINITY,
                                   -INFINITY, NAN, 2147483520.0, -2147483648.0};
  for (int64_t i = 0; i < n; i++) {
    double v = i < 18 ? special[i] : (double)((i * 7919) % 2001 - 1000) * 0.37;
    if (from.code == kDLInt) {
      int64_t w = i % 5 == 0 ? (from.bits == 8 ? 127 : from.bits == 32 ? INT32_MAX : INT64_MAX)
                  : i % 5 == 1 ? (from.bits == 8 ? -128 : from.bits == 32 ? INT32_MIN : INT64_MIN)
                               : (i * 104729) % 70001 - 35000;
      if (from.bits == 8) ((int8_t *)p)[i] = (int8_t)(w % 128);
      else if (from.bits == 32) ((int32_t *)p)[i] = (int32_t)w;
      else  // large int64s (wrapping on purpose, in unsigned arithmetic)
        ((int64_t *)p)[i] = (int64_t)((uint64_t)w * (i % 3 == 2 ? 1000003u : 1u));
    } else {
      store_float(p, from, i, (float)v);
    }
  }
  return p;
}

// The reference of element i of cast(x, to).
static bool check_elem(const void *x, DLDataType from, const void *y, DLDataType to,
                       int64_t i, char *why, size_t size) {
  if (to.code == kDLInt && from.code == kDLInt) {
    int64_t v = (int64_t)(from.bits == 64 ? ((const int64_t *)x)[i] : (int64_t)load(x, from, i));
    int64_t want = to.bits == 8 ? (int8_t)(uint8_t)(uint64_t)v
                   : to.bits == 32 ? (int32_t)(uint32_t)(uint64_t)v : v;
    int64_t got = to.bits == 64 ? ((const int64_t *)y)[i] : (int64_t)load(y, to, i);
    if (got == want) return true;
    snprintf(why, size, "%lld -> %lld, want %lld", (long long)v, (long long)got, (long long)want);
    return false;
  }
  if (to.code == kDLInt) {
    double v = load(x, from, i);
    int64_t want = ref_to_int(v, to.bits);
    int64_t got = to.bits == 64 ? ((const int64_t *)y)[i] : (int64_t)load(y, to, i);
    if (got == want) return true;
    snprintf(why, size, "%g -> %lld, want %lld", v, (long long)got, (long long)want);
    return false;
  }
  // int -> float: one rounding of the exact integer (to f32, then to the 16-bit type,
  // which equals one rounding for the values here: none is near a double rounding tie).
  int64_t v = from.bits == 64 ? ((const int64_t *)x)[i] : (int64_t)load(x, from, i);
  float f = (float)v;
  uint16_t h = to.code == kDLBfloat ? ref_f32_to_bf16(f) : ref_f32_to_f16(f);
  double want = to.bits == 32 ? f : to.code == kDLBfloat ? ref_bf16_to_f32(h)
                                                         : ref_f16_to_f32(h);
  double got = load(y, to, i);
  if (got == want || (isinf(got) && isinf(want) && (got > 0) == (want > 0))) return true;
  snprintf(why, size, "%lld -> %g, want %g", (long long)v, got, want);
  return false;
}

// cast(x, to) over [n] (static, or N symbolic), checked element by element. Returns
// false where the device refuses the dtype (Vulkan: int8), having checked that it
// says JIT_UNSUPPORTED.
static bool check_cast(DLDataType from, DLDataType to, int64_t n, bool symbolic) {
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "cast_int");
  int64_t d[1] = {symbolic ? jit_symbol(g, "N") : n};
  jit_output(g, jit_cast(g, jit_input(g, "x", from, 1, d), to));
  TU_OK(jit_graph_finalize(g));
  void *x = make_input(from, n);
  void *y = tu_malloc((size_t)(n * dl_bytes(to) + 8));
  int64_t s[1] = {n};
  DLTensor in = tu_tensor(x, from, 1, s), out = tu_tensor(y, to, 1, s);
  jit_status st = jit_run(g, &in, 1, &out, 1);
  bool ran = true;
  if (st && jit_status_get_code(st) == JIT_UNSUPPORTED && !strcmp(device_name(), "vulkan") &&
      (from.bits == 8 || to.bits == 8)) {
    TU_EXPECT_MSG(st, "int8");
    jit_status_free(st);
    ran = false;
  } else {
    TU_OK(st);
    char why[160];
    for (int64_t i = 0; i < n; i++)
      cr_assert(check_elem(x, from, y, to, i, why, sizeof why),
                "cast (%d,%d) -> (%d,%d), n=%lld%s, element %lld: %s", from.code, from.bits,
                to.code, to.bits, (long long)n, symbolic ? " symbolic" : "", (long long)i,
                why);
  }
  free(x);
  free(y);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
  return ran;
}

static void check_all(DLDataType from, DLDataType to) {
  static const int64_t sizes[] = {1, 37, 1000};
  for (int k = 0; k < 3; k++) {
    if (!check_cast(from, to, sizes[k], false)) return;
    check_cast(from, to, sizes[k], true);
  }
}

Test(cast, f32_to_ints) {
  check_all(TU_F32, TU_I8);
  check_all(TU_F32, TU_I32);
  check_all(TU_F32, TU_I64);
}

Test(cast, half_floats_to_ints) {
  check_all(TU_F16, TU_I8);
  check_all(TU_F16, TU_I32);
  if (strcmp(device_name(), "vulkan")) check_all(TU_BF16, TU_I32);  // Vulkan: no bf16
}

Test(cast, ints_to_floats) {
  check_all(TU_I32, TU_F32);
  check_all(TU_I32, TU_F16);
  check_all(TU_I8, TU_F32);
  check_all(TU_I64, TU_F32);
  if (strcmp(device_name(), "vulkan")) check_all(TU_I32, TU_BF16);
}

Test(cast, ints_to_ints) {
  check_all(TU_I64, TU_I32);
  check_all(TU_I32, TU_I8);
  check_all(TU_I8, TU_I64);
  check_all(TU_I32, TU_I64);
}

// Dynamic quantization in one graph: q = cast(x / sx, int8) feeds jit_matmul_int8 with
// int8 weights; the result against the same steps in C.
Test(cast, quantize_then_int8_matmul) {
  if (!strcmp(device_name(), "vulkan")) return;  // no int8 there (checked above)
  enum { M = 13, K = 67, N = 9 };
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "dyn_quant");
  int64_t m = jit_symbol(g, "M");
  jit_value x = jit_input(g, "x", TU_F32, 2, (int64_t[]){m, K});
  jit_value w = jit_input(g, "w", TU_I8, 2, (int64_t[]){K, N});
  jit_value sx = jit_input(g, "sx", TU_F32, 0, NULL);
  jit_value sw = jit_input(g, "sw", TU_F32, 1, (int64_t[]){N});
  jit_value q = jit_cast(g, jit_div(g, x, sx), TU_I8);
  jit_output(g, jit_matmul_int8(g, q, w, sx, sw));
  jit_output(g, q);  // an integer output
  TU_OK(jit_graph_finalize(g));
  float xv[M * K], sxv = 0.05f, swv[N], y[M * N];
  int8_t wv[K * N], qv[M * K];
  for (int i = 0; i < M * K; i++) xv[i] = (float)((i * 37) % 211 - 105) * 0.061f;
  for (int i = 0; i < K * N; i++) wv[i] = (int8_t)((i * 53) % 255 - 127);
  for (int j = 0; j < N; j++) swv[j] = 0.01f * (float)(j + 1);
  int64_t sxs[2] = {M, K}, sws[2] = {K, N}, sn[1] = {N}, sy[2] = {M, N};
  DLTensor ins[4] = {tu_tensor(xv, TU_F32, 2, sxs), tu_tensor(wv, TU_I8, 2, sws),
                     tu_tensor(&sxv, TU_F32, 0, NULL), tu_tensor(swv, TU_F32, 1, sn)};
  DLTensor outs[2] = {tu_tensor(y, TU_F32, 2, sy), tu_tensor(qv, TU_I8, 2, sxs)};
  TU_OK(jit_run(g, ins, 4, outs, 2));
  for (int i = 0; i < M; i++) {
    for (int k = 0; k < K; k++) {
      int64_t want = ref_to_int((double)(xv[i * K + k] / sxv), 8);
      cr_assert_eq(qv[i * K + k], want, "q[%d][%d] = %d, want %lld", i, k, qv[i * K + k],
                   (long long)want);
    }
    for (int j = 0; j < N; j++) {
      int32_t acc = 0;
      for (int k = 0; k < K; k++) acc += (int32_t)qv[i * K + k] * wv[k * N + j];
      double want = (double)acc * sxv * swv[j];
      cr_assert(fabs(y[i * N + j] - want) <= 1e-5 * fabs(want) + 1e-6, "y[%d][%d] = %g, want %g",
                i, j, y[i * N + j], want);
    }
  }
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// Integers are cast, gathered with, multiplied as int8 and output; nothing else takes
// them, and an integer output must come from a cast.
Test(cast, rules) {
  jit_context *ctx = tu_context();
  jit_graph *g = tu_graph(ctx, "cast_rules");
  jit_value x = jit_input(g, "x", TU_F32, 1, (int64_t[]){4});
  jit_value i = jit_cast(g, x, TU_I32);
  jit_add(g, i, i);
  jit_status s = jit_graph_finalize(g);
  TU_EXPECT_CODE(s, JIT_DTYPE_MISMATCH);
  TU_EXPECT_MSG(s, "jit_cast");
  jit_status_free(s);
  jit_graph_destroy(g);

  g = tu_graph(ctx, "cast_bad_dtype");
  x = jit_input(g, "x", TU_F32, 1, (int64_t[]){4});
  jit_output(g, jit_cast(g, x, (DLDataType){kDLUInt, 8, 1}));
  s = jit_graph_finalize(g);
  TU_EXPECT_CODE(s, JIT_UNSUPPORTED);
  TU_EXPECT_MSG(s, "int8, int32 and int64");
  jit_status_free(s);
  jit_graph_destroy(g);

  // A float output that is then cast back: fine; an int output of the wrong dtype at
  // run time: DTYPE_MISMATCH.
  g = tu_graph(ctx, "cast_out_dtype");
  x = jit_input(g, "x", TU_F32, 1, (int64_t[]){3});
  jit_output(g, jit_cast(g, x, TU_I32));
  TU_OK(jit_graph_finalize(g));
  float xv[3] = {1.9f, -1.9f, 7};
  int64_t yv[3];
  int64_t s3[1] = {3};
  DLTensor in = tu_tensor(xv, TU_F32, 1, s3), out = tu_tensor(yv, TU_I64, 1, s3);
  s = jit_run(g, &in, 1, &out, 1);
  TU_EXPECT_CODE(s, JIT_DTYPE_MISMATCH);
  jit_status_free(s);
  int32_t y32[3];
  out = tu_tensor(y32, TU_I32, 1, s3);
  TU_OK(jit_run(g, &in, 1, &out, 1));
  cr_expect(y32[0] == 1 && y32[1] == -1 && y32[2] == 7);
  jit_graph_destroy(g);
  jit_context_destroy(ctx);
}

// jit_round: ties to even, at the halves, past 2^23 (already integers), signed zeros,
// infinities and NaN; f32 and f16 (test_ops runs it on random data).
Test(cast, round_ties_to_even) {
  static const float xs[] = {0.5f,  1.5f,   2.5f,   -0.5f,  -1.5f,     -2.5f,    0.49999997f,
                             3.7f,  -3.7f,  1e7f,   8388609.0f, -0.0f,  0.0f,    INFINITY,
                             -INFINITY, NAN, 126.5f, 127.5f, -128.5f,  1023.5f};
  enum { N = sizeof xs / sizeof xs[0] };
  for (int half = 0; half < 2; half++) {
    DLDataType dt = half ? TU_F16 : TU_F32;
    jit_context *ctx = tu_context();
    jit_graph *g = tu_graph(ctx, "round");
    int64_t d[1] = {jit_symbol(g, "N")};
    jit_output(g, jit_round(g, jit_input(g, "x", dt, 1, d)));
    TU_OK(jit_graph_finalize(g));
    uint16_t xh[N], yh[N];
    float y[N];
    for (int i = 0; i < N; i++) xh[i] = ref_f32_to_f16(xs[i]);
    int64_t s[1] = {N};
    DLTensor in = tu_tensor(half ? (void *)xh : (void *)xs, dt, 1, s);
    DLTensor out = tu_tensor(half ? (void *)yh : (void *)y, dt, 1, s);
    TU_OK(jit_run(g, &in, 1, &out, 1));
    for (int i = 0; i < N; i++) {
      double x = half ? ref_f16_to_f32(xh[i]) : xs[i];
      double got = half ? ref_f16_to_f32(yh[i]) : y[i], want = nearbyint(x);
      cr_assert(got == want || (isnan(got) && isnan(want)),
                "round(%.9g) = %.9g, want %.9g (%s)", x, got, want, half ? "f16" : "f32");
      if (want == 0) cr_assert(signbit(got) == signbit(want), "round(%g): sign of zero", x);
    }
    jit_graph_destroy(g);
    jit_context_destroy(ctx);
  }
}
