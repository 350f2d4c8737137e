//===--- log.c - log lines through the user's callback ---------------------===//
#include "base/log.h"

#include <stdio.h>

// How deep this thread is in user callbacks (jit/fork.c: a fork from one of them).
static _Thread_local int jit__callback_depth;

bool jit__log_in_callback(void) { return jit__callback_depth > 0; }

void jit__logv(const jit__logger *logger, jit_log_level level, const char *fmt, va_list ap) {
  if (!logger || !logger->fn || level > logger->level) return;
  char line[1024];
  vsnprintf(line, sizeof line, fmt, ap);
  jit__callback_depth++;
  logger->fn(logger->user, level, line);
  jit__callback_depth--;
}

void jit__logf(const jit__logger *logger, jit_log_level level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  jit__logv(logger, level, fmt, ap);
  va_end(ap);
}

void jit__log_to_stderr(void *user, jit_log_level level, const char *message) {
  (void)user;
  static const char *names[] = {"error", "warning", "info", "debug"};
  unsigned i = (unsigned)level < 4 ? (unsigned)level : 3;
  fprintf(stderr, "jitml %s: %s\n", names[i], message);
}
