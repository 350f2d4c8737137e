//===--- util.h - helpers shared by the Criterion tests --------------------===//
//
// Making DLTensors, asserting on statuses, comparing arrays with a tolerance, and
// running a single-output graph against a reference. Header-only (static inline) so
// each test executable stays one file plus ref.c.
//
//===----------------------------------------------------------------------===//
#ifndef JITML_TESTS_UTIL_H_
#define JITML_TESTS_UTIL_H_

#include <criterion/criterion.h>
#include <dlfcn.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "jitml.h"
#include "ref.h"

// Keeps Mesa's lavapipe driver loaded for the life of the test process. Its Vulkan
// ICD leaks a 128-byte block when the loader unloads it at vkDestroyInstance, which
// LeakSanitizer reports (from an "<unknown module>", so no suppression can name it);
// with the driver pinned nothing is reported. A no-op where lavapipe is absent.
__attribute__((constructor)) static void tu_pin_lavapipe(void) {
  dlopen("libvulkan_lvp.so", RTLD_NOW | RTLD_NODELETE);
}

#define TU_F32 ((DLDataType){kDLFloat, 32, 1})
#define TU_F16 ((DLDataType){kDLFloat, 16, 1})

static inline int tu_is_f16(DLDataType dt) {
  return dt.code == kDLFloat && dt.bits == 16 && dt.lanes == 1;
}

// Asserts that `expr` (a jit_status) succeeded; on failure frees the status and fails
// the test with its code and message.
#define TU_OK(expr)                                                              \
  do {                                                                           \
    jit_status tu_s_ = (expr);                                                   \
    if (tu_s_) {                                                                 \
      char tu_msg_[2048];                                                        \
      snprintf(tu_msg_, sizeof(tu_msg_), "%s: %s",                               \
               jit_status_code_name(jit_status_get_code(tu_s_)),                 \
               jit_status_message(tu_s_));                                       \
      jit_status_free(tu_s_);                                                    \
      cr_assert(0, "%s failed: %s", #expr, tu_msg_);                             \
    }                                                                            \
  } while (0)

// Expects (non-fatally) that `s` failed with `code`. Does not free `s`.
#define TU_EXPECT_CODE(s, code)                                                  \
  cr_expect(jit_status_get_code(s) == (code),                                    \
            "expected %s, got %s (message: \"%s\")", jit_status_code_name(code), \
            (s) ? jit_status_code_name(jit_status_get_code(s)) : "success",      \
            jit_status_message(s))

// Expects (non-fatally) that the message of `s` contains `needle`.
#define TU_EXPECT_MSG(s, needle)                                                 \
  cr_expect(strstr(jit_status_message(s), (needle)) != NULL,                     \
            "message \"%s\" does not mention \"%s\"", jit_status_message(s),     \
            (needle))

// A dense CPU tensor (strides NULL) over caller-owned data and shape arrays.
static inline DLTensor tu_tensor(void *data, DLDataType dtype, int rank,
                                 int64_t *shape) {
  DLTensor t;
  memset(&t, 0, sizeof(t));
  t.data = data;
  t.device.device_type = kDLCPU;
  t.device.device_id = 0;
  t.ndim = rank;
  t.dtype = dtype;
  t.shape = shape;
  t.strides = NULL;
  t.byte_offset = 0;
  return t;
}

// A context with default options, except that $JITML_TEST_DEVICE (e.g. "vulkan") sets
// options.device: CTest runs the op suite once per backend that way (the conformance
// suite). A backend that is absent skips the test with a visible line.
// tu_context with options.shape_policy = `policy` (tests that count compiles per
// binding ask for EXACT).
static inline jit_context *tu_context_policy(jit_shape_policy policy) {
  jit_context *ctx = NULL;
  jit_options o;
  jit_options_init(&o);
  o.device = getenv("JITML_TEST_DEVICE");
  o.shape_policy = policy;
  jit_status s = jit_context_create(&o, &ctx);
  if (s && jit_status_get_code(s) == JIT_UNAVAILABLE) {
    char msg[512];
    snprintf(msg, sizeof msg, "skipped: no %s device (%s)", o.device, jit_status_message(s));
    jit_status_free(s);
    cr_skip_test("%s", msg);
  }
  TU_OK(s);
  cr_assert(ctx != NULL);
  return ctx;
}

static inline jit_context *tu_context(void) {
  return tu_context_policy(JIT_SHAPE_POLICY_AUTO);
}

static inline jit_graph *tu_graph(jit_context *ctx, const char *name) {
  jit_graph *g = NULL;
  TU_OK(jit_graph_create(ctx, name, &g));
  cr_assert(g != NULL);
  return g;
}

static inline void *tu_malloc(size_t n) {
  void *p = malloc(n ? n : 1);
  cr_assert(p != NULL, "out of memory");
  return p;
}

// Data of an input of `dtype` holding the values `x` (f32). For f16 the values are
// rounded to f16 *in place* in x, so the caller's reference sees what the library sees.
static inline void *tu_input_data(DLDataType dtype, float *x, int64_t n) {
  if (tu_is_f16(dtype)) {
    uint16_t *h = tu_malloc((size_t)n * sizeof(uint16_t));
    ref_f32_to_f16_array(x, h, n);
    ref_f16_to_f32_array(h, x, n);
    return h;
  }
  float *f = tu_malloc((size_t)n * sizeof(float));
  memcpy(f, x, (size_t)n * sizeof(float));
  return f;
}

static inline void tu_format_index(char *buf, size_t size, int64_t flat, int rank,
                                   const int64_t *dims) {
  if (rank <= 0 || !dims) {
    snprintf(buf, size, "[%lld]", (long long)flat);
    return;
  }
  int64_t idx[REF_MAX_RANK];
  int64_t rem = flat;
  for (int i = rank - 1; i >= 0; i--) {
    idx[i] = dims[i] ? rem % dims[i] : 0;
    rem = dims[i] ? rem / dims[i] : 0;
  }
  size_t off = (size_t)snprintf(buf, size, "[%lld] = (", (long long)flat);
  for (int i = 0; i < rank && off < size; i++)
    off += (size_t)snprintf(buf + off, size - off, i ? ",%lld" : "%lld",
                            (long long)idx[i]);
  if (off < size) snprintf(buf + off, size - off, ")");
}

// Asserts |got - want| <= atol + rtol * |want| everywhere (NaN/inf must match
// exactly); on failure reports the number of mismatches and the first one.
static inline void tu_assert_close(const float *got, const float *want, int64_t n,
                                   double rtol, double atol, int rank,
                                   const int64_t *dims, const char *what) {
  int64_t nbad = 0, first = -1;
  double worst = 0.0;
  for (int64_t i = 0; i < n; i++) {
    double g = got[i], w = want[i];
    int ok;
    if (isnan(w) || isinf(w))
      ok = (isnan(w) && isnan(g)) || g == w;
    else
      ok = isfinite(g) && fabs(g - w) <= atol + rtol * fabs(w);
    if (!ok) {
      if (first < 0) first = i;
      nbad++;
      double d = fabs(g - w);
      if (!(d <= worst)) worst = d;
    }
  }
  if (nbad) {
    char where[256];
    tu_format_index(where, sizeof(where), first, rank, dims);
    cr_assert(0,
              "%s: %lld of %lld elements differ; first at %s: got %.9g want %.9g "
              "(tol %.3g + %.3g*|want|, largest |diff| %.3g)",
              what, (long long)nbad, (long long)n, where, (double)got[first],
              (double)want[first], atol, rtol, worst);
  }
}

static inline void tu_assert_all_finite(const float *x, int64_t n, const char *what) {
  for (int64_t i = 0; i < n; i++)
    cr_assert(isfinite(x[i]), "%s: element %lld is %g", what, (long long)i,
              (double)x[i]);
}

static inline void tu_assert_shape(int rank, const int64_t *dims, int want_rank,
                                   const int64_t *want, const char *what) {
  cr_assert(rank == want_rank, "%s: rank %d, want %d", what, rank, want_rank);
  for (int i = 0; i < rank; i++)
    cr_assert(dims[i] == want[i], "%s: dim %d is %lld, want %lld", what, i,
              (long long)dims[i], (long long)want[i]);
}

// Runs a finalized single-output graph `g` on `ins`: checks output 0's shape (from
// jit_output_shape) against want_rank/want_dims, allocates the output of `odt`, runs,
// and compares the result (converted to f32) with `want`. If `got_out` is non-NULL the
// result (f32) is copied there too.
static inline void tu_run_check(jit_graph *g, const DLTensor *ins, int n_in,
                                DLDataType odt, int want_rank, const int64_t *want_dims,
                                const float *want, double rtol, double atol,
                                float *got_out, const char *what) {
  int rank = -1;
  int64_t dims[JIT_MAX_RANK];
  TU_OK(jit_output_shape(g, ins, n_in, 0, &rank, dims));
  tu_assert_shape(rank, dims, want_rank, want_dims, what);
  int64_t n = ref_numel(rank, dims);
  size_t esz = tu_is_f16(odt) ? 2 : 4;
  void *out = tu_malloc((size_t)n * esz);
  memset(out, 0xff, (size_t)n * esz);  // NaN everywhere: unwritten elements show
  DLTensor ot = tu_tensor(out, odt, rank, dims);
  TU_OK(jit_run(g, ins, n_in, &ot, 1));
  float *got = tu_malloc((size_t)n * sizeof(float));
  if (esz == 2)
    ref_f16_to_f32_array(out, got, n);
  else
    memcpy(got, out, (size_t)n * sizeof(float));
  tu_assert_close(got, want, n, rtol, atol, rank, dims, what);
  if (got_out) memcpy(got_out, got, (size_t)n * sizeof(float));
  free(got);
  free(out);
}

// The exit status of child `pid`, or -1 when it has not exited within `ms` (it is then
// killed): a child that hangs fails the test instead of hanging the suite.
static inline int tu_wait_child(pid_t pid, int ms) {
  int status = 0;
  for (int waited = 0; waited < ms; waited += 10) {
    if (waitpid(pid, &status, WNOHANG) == pid)
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    nanosleep(&(struct timespec){0, 10000000}, NULL);
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return -1;
}

#endif  // JITML_TESTS_UTIL_H_
