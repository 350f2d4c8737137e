//===--- version.c - the library's version ---------------------------------===//
#include "jitml.h"

#define JIT__STR2(x) #x
#define JIT__STR(x) JIT__STR2(x)

const char *jit_version(void) {
  return JIT__STR(JIT_VERSION_MAJOR) "." JIT__STR(JIT_VERSION_MINOR) "." JIT__STR(
      JIT_VERSION_PATCH);
}

int jit_version_number(void) { return JIT_VERSION_NUMBER; }
