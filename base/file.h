//===--- file.h - reading a file that should be a regular file -------------===//
//
// Every file the library reads on a caller's behalf (an MLIR file, a bundle) is
// opened so that it cannot hang or exhaust the process: non-blocking (a FIFO with no
// writer would block an open), checked with fstat to be a regular file (a FIFO, a
// device such as /dev/zero or a directory is refused), bounded in size, and read for
// exactly the size fstat gave. Thread-safe.
//
//===----------------------------------------------------------------------===//
#ifndef JITML_BASE_FILE_H_
#define JITML_BASE_FILE_H_

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

// Reads all of `path` into a new NUL-terminated buffer (*out_text, free()) of
// *out_size bytes (the NUL not counted). `what` names the file in messages ("MLIR
// file"). JIT_INVALID_ARGUMENT when it cannot be opened or read, or is not a regular
// file; JIT_RESOURCE_EXHAUSTED when it is larger than `max_bytes` or memory runs out.
jit_status jit__read_regular_file(const char *path, const char *what, uint64_t max_bytes,
                                  char **out_text, size_t *out_size);

#endif  // JITML_BASE_FILE_H_
