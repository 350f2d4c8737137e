//===--- clock.h - a monotonic clock in milliseconds -----------------------===//
//
// The one clock for compile times, waits and timeouts: CLOCK_MONOTONIC, so a
// changed wall clock never makes a wait end early or a stage take negative time.
// Header-only. Thread-safe.
//
//===----------------------------------------------------------------------===//
#ifndef JITML_BASE_CLOCK_H_
#define JITML_BASE_CLOCK_H_

#include <time.h>

// Milliseconds since an arbitrary fixed point (boot); only differences mean anything.
static inline double jit__now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

#endif  // JITML_BASE_CLOCK_H_
