//===--- log.h - log lines through the user's callback ---------------------===//
//
// The library never prints on its own: every module logs through a jit__logger, the
// callback, user pointer and level of jit_options (or $JITML_LOG's stderr logger).
// A logger with no callback drops everything. Thread-safe when the callback is.
//
//===----------------------------------------------------------------------===//
#ifndef JITML_BASE_LOG_H_
#define JITML_BASE_LOG_H_

#include <stdarg.h>
#include <stdbool.h>

#include "base/status.h"
#include "jitml.h"

typedef struct jit__logger {
  jit_log_fn fn;         // NULL: silent
  void *user;
  jit_log_level level;   // lines above this level are dropped
} jit__logger;

// Formats one line (up to 1 KiB, longer is cut) and hands it to the callback when
// `level` passes the logger's level.
void jit__logv(const jit__logger *logger, jit_log_level level, const char *fmt, va_list ap);
void jit__logf(const jit__logger *logger, jit_log_level level, const char *fmt, ...)
    JIT__PRINTF(3, 4);

// Whether this thread is inside a log callback now (the library may hold locks there).
bool jit__log_in_callback(void);

// A jit_log_fn that writes "jitml <level>: <message>" to stderr ($JITML_LOG).
void jit__log_to_stderr(void *user, jit_log_level level, const char *message);

#endif  // JITML_BASE_LOG_H_
