//===--- status.c - jit_status ---------------------------------------------===//
#include "base/status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct jit_status_s {
  jit_status_code code;
  const char *file;
  int line;
  char *message;
};

// Returned when a status itself cannot be allocated; never freed.
static struct jit_status_s jit__oom_status = {
    JIT_RESOURCE_EXHAUSTED, __FILE__, __LINE__,
    (char *)"out of memory while reporting an error"};

jit_status jit__status_makev(jit_status_code code, const char *file, int line,
                             const char *fmt, va_list ap) {
  jit_status s = calloc(1, sizeof(*s));
  if (!s) return &jit__oom_status;
  s->code = code == JIT_OK ? JIT_INTERNAL : code;
  s->file = file;
  s->line = line;
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap2);
  va_end(ap2);
  if (n < 0) n = 0;
  s->message = malloc((size_t)n + 1);
  if (!s->message) {
    free(s);
    return &jit__oom_status;
  }
  vsnprintf(s->message, (size_t)n + 1, fmt, ap);
  return s;
}

jit_status jit__status_make(jit_status_code code, const char *file, int line,
                            const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  jit_status s = jit__status_makev(code, file, line, fmt, ap);
  va_end(ap);
  return s;
}

jit_status jit__status_annotate(jit_status status, const char *fmt, ...) {
  if (!status || status == &jit__oom_status) return status;
  char prefix[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof(prefix), fmt, ap);
  va_end(ap);
  if (!prefix[0]) return status;
  size_t n = strlen(prefix) + 2 + strlen(status->message) + 1;
  char *m = malloc(n);
  if (!m) return status;  // keep the inner message rather than lose it
  snprintf(m, n, "%s: %s", prefix, status->message);
  free(status->message);
  status->message = m;
  return status;
}

jit_status_code jit_status_get_code(jit_status status) {
  return status ? status->code : JIT_OK;
}

const char *jit_status_message(jit_status status) {
  return status ? status->message : "";
}

const char *jit_status_code_name(jit_status_code code) {
  switch (code) {
    case JIT_OK: return "OK";
    case JIT_INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case JIT_SHAPE_MISMATCH: return "SHAPE_MISMATCH";
    case JIT_DTYPE_MISMATCH: return "DTYPE_MISMATCH";
    case JIT_UNSUPPORTED: return "UNSUPPORTED";
    case JIT_PARSE_ERROR: return "PARSE_ERROR";
    case JIT_COMPILE_ERROR: return "COMPILE_ERROR";
    case JIT_DEVICE_ERROR: return "DEVICE_ERROR";
    case JIT_UNAVAILABLE: return "UNAVAILABLE";
    case JIT_CACHE_ERROR: return "CACHE_ERROR";
    case JIT_RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case JIT_INTERNAL: return "INTERNAL";
  }
  return "UNKNOWN";
}

void jit_status_free(jit_status status) {
  if (!status || status == &jit__oom_status) return;
  free(status->message);
  free(status);
}
