//===--- log.c - log lines through the user's callback ---------------------===//
#include "base/log.h"

#include <stdio.h>

void jit__logv(const jit__logger *logger, jit_log_level level, const char *fmt, va_list ap) {
  if (!logger || !logger->fn || level > logger->level) return;
  char line[1024];
  vsnprintf(line, sizeof line, fmt, ap);
  logger->fn(logger->user, level, line);
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
