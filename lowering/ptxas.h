//===--- ptxas.h - PTX -> cubin with the CUDA toolkit's ptxas (internal) ---===//
//
// The last, optional step of the CUDA lowering: when a CUDA toolkit is present, its
// `ptxas` assembles the lowering's PTX into a cubin for exactly the device's SM, which
// the driver loads without JIT-compiling anything. ptxas is a separate program, so it
// runs as a subprocess: posix_spawn (no shell), its own private temporary directory
// (mkdtemp, 0700, removed afterwards), stdin from /dev/null, stdout and stderr into a
// file that goes into the status when it fails, and a bounded wait after which it is
// killed. Like the rest of lowering/ this loads nothing and talks to no device; a
// missing or failing ptxas is the caller's to treat as "ship PTX only".
//
// Thread-safe: every call has its own directory and child; nothing is shared.
//
//===----------------------------------------------------------------------===//
#ifndef JITML_LOWERING_PTXAS_H_
#define JITML_LOWERING_PTXAS_H_

#include <stddef.h>
#include <stdint.h>

#include "jitml.h"

// A ptxas found on this machine. Plain data; copy it freely.
typedef struct jit__ptxas {
  char path[4096];   // the executable; "" when none was found
  char version[64];  // from `ptxas --version`: "13.0.88", or "" if it did not say
  int major, minor;  // toolkit release (13, 0); 0, 0 if unknown
} jit__ptxas;

// Looks for ptxas and asks it its version (`ptxas --version`, at most 10 s). Where:
// `toolkit`/bin/ptxas when `toolkit` is non-NULL (then nowhere else; "" means "use no
// toolkit"), else the first of $CUDA_HOME/bin, $CUDA_PATH/bin, /usr/local/cuda/bin and
// the directories of $PATH that has an executable ptxas. Fills `out` in every case.
// Returns JIT_UNAVAILABLE, out->path "", when there is none (the message lists where it
// looked) or it does not run (the message carries what it printed);
// JIT_INVALID_ARGUMENT for a NULL `out`.
jit_status jit__ptxas_find(const char *toolkit, jit__ptxas *out);

// Assembles `ptx` (`ptx_size` bytes; need not be NUL-terminated) into a cubin for
// `arch` ("sm_90", "sm_90a"): `ptxas -arch=<arch> -O3 <ptx> -o <cubin>`, waiting at most
// `timeout_ms` (0: 120 s), then killing it. On success *out_cubin is the ELF image
// (malloc'ed, the caller frees it) and *out_size its size. Returns JIT_INVALID_ARGUMENT
// (NULL or empty arguments, an `arch` that is not sm_<digits>[a|f]), JIT_UNAVAILABLE
// (no ptxas in `tool`, or it could not be started), JIT_COMPILE_ERROR (ptxas failed:
// the message carries its exit status and output; it timed out; it wrote no ELF),
// JIT_RESOURCE_EXHAUSTED, JIT_INTERNAL (the temporary directory or files could not be
// made). On failure nothing is left behind.
jit_status jit__ptxas_assemble(const jit__ptxas *tool, const void *ptx, size_t ptx_size,
                               const char *arch, uint32_t timeout_ms, uint8_t **out_cubin,
                               size_t *out_size);

#endif  // JITML_LOWERING_PTXAS_H_
