// jitml.h compiles alone as C++ (extern "C" guards) and links from C++.
#include "jitml.h"

int main() {
  jit_value v = {0};
  jit_status s = nullptr;
  jit_status_free(s);
  return (jit_version_number() == JIT_VERSION_NUMBER && v.id == 0 &&
          jit_status_get_code(s) == JIT_OK)
             ? 0
             : 1;
}
