//===--- gpu_check.h - result checks shared by the GPU device tests -------===//
#ifndef JITML_TESTS_GPU_CHECK_H_
#define JITML_TESTS_GPU_CHECK_H_

#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

// Fails the test if any |got - want| > atol + rtol * |want| (or got is not finite),
// naming how many differ, the first and the largest difference.
static inline void assert_close(const float *got, const float *want, int64_t n,
                                double rtol, double atol, const char *what) {
  int64_t bad = 0, first = -1;
  double worst = 0;
  for (int64_t i = 0; i < n; i++) {
    double g = got[i], w = want[i];
    bool ok = isfinite(g) && fabs(g - w) <= atol + rtol * fabs(w);
    if (!ok) {
      if (first < 0) first = i;
      bad++;
      if (!(fabs(g - w) <= worst)) worst = fabs(g - w);
    }
  }
  if (bad)
    cr_assert_fail("%s: %lld of %lld elements differ; first at %lld: got %.9g want %.9g "
                   "(largest |diff| %.3g)",
                   what, (long long)bad, (long long)n, (long long)first, (double)got[first],
                   (double)want[first], worst);
}

// n floats (at least one), or a failed test.
static inline float *fmalloc(int64_t n) {
  float *p = malloc((size_t)(n ? n : 1) * sizeof(float));
  cr_assert_not_null(p);
  return p;
}

#endif  // JITML_TESTS_GPU_CHECK_H_
