// jitml.h compiles alone as strict C11 (-std=c11 -pedantic) and links.
#include "jitml.h"

int main(void) {
  jit_value v = {0};
  jit_status_code c = JIT_OK;
  return (jit_version_number() == JIT_VERSION_NUMBER && v.id == 0 && c == JIT_OK) ? 0
                                                                                  : 1;
}
