//===--- status.h - making and annotating statuses (internal) --------------===//
//
// The base layer every module uses to report failures. A status records its code, the
// message, and the file:line where it was made; context is prefixed on the way up.
//
//===----------------------------------------------------------------------===//
#ifndef JITML_BASE_STATUS_H_
#define JITML_BASE_STATUS_H_

#include <stdarg.h>

#include "jitml.h"

#if defined(__GNUC__)
#define JIT__PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define JIT__PRINTF(f, a)
#endif

// A new status with `code` and a printf-style message. Never returns NULL: if memory
// is exhausted it returns a static out-of-memory status that jit_status_free ignores.
jit_status jit__status_make(jit_status_code code, const char *file, int line,
                            const char *fmt, ...) JIT__PRINTF(4, 5);
jit_status jit__status_makev(jit_status_code code, const char *file, int line,
                             const char *fmt, va_list ap);

// Prefixes "<context>: " to the message of `status` and returns it (takes ownership).
jit_status jit__status_annotate(jit_status status, const char *fmt, ...)
    JIT__PRINTF(2, 3);

#define JIT_ERR(code, ...) jit__status_make((code), __FILE__, __LINE__, __VA_ARGS__)

// Returns from the enclosing function if `expr` fails, adding context to its message.
#define JIT_RETURN_IF_ERROR(expr, ...)                 \
  do {                                                 \
    jit_status jit__s = (expr);                        \
    if (jit__s) return jit__status_annotate(jit__s, __VA_ARGS__); \
  } while (0)

// Returns from the enclosing function if `expr` fails, unchanged.
#define JIT_PROPAGATE(expr)          \
  do {                               \
    jit_status jit__s = (expr);      \
    if (jit__s) return jit__s;       \
  } while (0)

#endif  // JITML_BASE_STATUS_H_
