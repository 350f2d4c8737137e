//===--- internal.h - what the CPU strategy's files share ------------------===//
//
// The walk over one module that plans its ops and writes their transform script
// (script.c drives it; plan_rows.c adds the row and elementwise ops), the op
// inspection helpers (ops.c), and short text helpers for writing transform IR. Not
// used outside lowering/cpu/.
//
//===----------------------------------------------------------------------===//
#ifndef JITML_LOWERING_CPU_INTERNAL_H_
#define JITML_LOWERING_CPU_INTERNAL_H_

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <mlir-c/IR.h>

#include "base/text.h"
#include "lowering/cpu/host.h"
#include "lowering/cpu/plan.h"
#include "lowering/cpu_strategy.h"

//===--- Text ------------------------------------------------------------===//
// Static inline: each file that writes transform IR gets its own copy of these few
// lines, rather than an exported name per one-line helper.


// base/text.h's printf under a short name: the script is written in hundreds of calls.
static inline void sb_printf(jit__text *sb, const char *fmt, ...) JIT__PRINTF(2, 3);
static inline void sb_printf(jit__text *sb, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  jit__text_vprintf(sb, fmt, ap);
  va_end(ap);
}

#define ANY "!transform.any_op"

// "(!transform.any_op, ... n times)".
static inline void sb_types(jit__text *sb, int n) {
  sb_printf(sb, "(");
  for (int i = 0; i < n; i++) sb_printf(sb, "%s" ANY, i ? ", " : "");
  sb_printf(sb, ")");
}

// Peels the scf.for that handle `loop` holds, its partial last iteration split off
// into a loop of its own: %<prefix><i> becomes %<prefix><i>m (the whole tiles) and
// %<prefix><i>r (the rest).
static inline void sb_peel(jit__text *sb, const char *prefix, int i, const char *loop) {
  sb_printf(sb,
            "  %%%s%d = transform.cast %s : " ANY " to !transform.op<\"scf.for\">\n"
            "  %%%s%dm, %%%s%dr = transform.loop.peel %%%s%d : (!transform.op<\"scf.for\">) "
            "-> (!transform.op<\"scf.for\">, !transform.op<\"scf.for\">)\n",
            prefix, i, loop, prefix, i, prefix, i, prefix, i);
}

// The handle "%<prefix><i>", or its result "%<prefix><i>#<sub>" when sub >= 0, in `buf`.
static inline const char *handle(char buf[32], const char *prefix, int i, int sub) {
  if (sub >= 0)
    snprintf(buf, 32, "%%%s%d#%d", prefix, i, sub);
  else
    snprintf(buf, 32, "%%%s%d", prefix, i);
  return buf;
}

//===--- The walk --------------------------------------------------------===//

// Thread-compatible: one per jit__cpu_plan_make call.
//===--- Plan ------------------------------------------------------------===//

typedef struct walk {
  MlirContext ctx;
  const jit__lower_options *o;
  jit__cpu_host h;
  int threads;
  jit__text sb;
  // The thread loops of the matmuls split over threads, and the fusions into them,
  // which the script runs ahead of every op's tiles (jit__cpu_plan_make): each
  // fuse_into_containing_op prints and verifies the whole function in a diagnostic
  // upstream builds even on success, so it costs least while the function is untiled.
  jit__text pre;
  int n_mm, n_ew, n_rd;
  bool parallel;
  bool unroll_k;  // a matmul of 2^24 multiply-adds or more ("Unrolled k loops")
  // Per-op arrays, `cap` entries each (the module's op count, jit__cpu_plan_make), so
  // no count needs a bound of its own.
  int cap;
  MlirOperation *fused;  // generics taken as matmul epilogues
  int n_fused;
  MlirOperation *claimed;  // generics fused into a row loop (below)
  int n_claimed;
  int n_row;
  int64_t pack[JIT__CPU_MAX_PACK][3];  // packed B buffers made: panels, kc, tn
  int n_pack;
  int64_t (*masked)[3];  // per matmul: vector width V (0: not masked), rows, rest rows
  int n_masked;
  bool *vecmat;  // per matmul: a batch of vector x matrix (plan_batch_vecmat)
  bool any_vecmat;
  bool transposes;  // an elementwise op tiled for a transposed read (jit__cpu_plan_generic)
  bool ew_split;    // jit__cpu_plan_generic splits the next op's outer loop across the threads
  bool *ew_bcast;  // per elementwise op: an input broadcast along its vector dim
  // per elementwise op tiled for a transposed read with partial tiles: its transposed
  // loop and loop count (0, 0: none), for the rest tiles' rows (below)
  int (*ew_rest)[2];
  bool *fill_fused;  // per matmul: its fill fused into the register tiles
  // Generics a matmul's plan took: a transpose its B packing computes (plan_packed), or
  // a producer of A or B planned ahead of it (plan_matmul).
  MlirOperation *taken_t;
  int n_taken_t;
  int64_t row_bytes, row_input_bytes;  // of the last row loop: one row, the whole input
} walk;

// plan(w, op), with w->threads 1 while it runs where `op` is inside an scf.forall of
// the emitter's (its threads share that loop: a convolution's im2col blocks, blocked
// attention's heads); the module is then a parallel one.
void jit__cpu_plan_threads_of(walk *w, MlirOperation op, void (*plan)(walk *, MlirOperation));

//===--- Op inspection (ops.c) -------------------------------------------===//

bool jit__cpu_op_is(MlirOperation op, const char *name);
// Whether `op` is inside an scf.forall (the emitter's threads already share its loop,
// as a convolution's im2col blocks: what is inside is planned for one thread).
bool jit__cpu_in_forall(MlirOperation op);
void jit__cpu_set_tag(MlirContext ctx, MlirOperation op, const char *tag, int i);
// Bytes of a static shaped type; -1 for an element type that is not int or float.
int64_t jit__cpu_shaped_bytes(MlirType t);
bool jit__cpu_static_shaped(MlirType t);
// The generic's indexing map of operand `i` is the identity.
bool jit__cpu_map_is_identity(MlirOperation op, intptr_t i);
// Iterator kinds of a linalg.generic as 'p'/'r'; returns the loop count or -1.
int jit__cpu_read_iterators(MlirOperation op, char *out, int cap);
// The op's indexing maps are `want` (ops.c).
bool jit__cpu_maps_are(MlirOperation op, int n_maps, int n_dims, int n_res, const int *want,
                       bool absent_is);
bool jit__cpu_batch_maps_plain(MlirOperation bm);
bool jit__cpu_made_by_transpose(MlirValue v, MlirOperation user, bool f16);
bool jit__cpu_b_transposed(MlirOperation mm);
bool jit__cpu_batch_b_transposed(MlirOperation bm);
// The single elementwise consumer of a matmul that can be computed on its tiles.
MlirOperation jit__cpu_epilogue_of(MlirOperation mm);
// The op making `v`, or a null op for a block argument.
MlirOperation jit__cpu_producer(MlirValue v);
// `v` is an arith.constant integer (an index); its value in *out.
bool jit__cpu_const_index(MlirValue v, int64_t *out);
MlirNamedAttribute jit__cpu_named(MlirContext ctx, const char *name, MlirAttribute a);
// Makes `memref.reinterpret_cast %src` to sizes/strides (rank dims) at offset `offset`
// (a null value: 0; a plain row-major view then has the identity layout), before
// `before`.
MlirOperation jit__cpu_reinterpret_cast(MlirContext ctx, MlirOperation before, MlirValue src,
                                        MlirValue offset, int rank, const int64_t *sizes,
                                        const int64_t *strides);

//===--- Rows and elementwise ops (plan_rows.c) --------------------------===//

bool jit__cpu_is_row_root(MlirOperation g);
int jit__cpu_transposed_loop(MlirOperation g, int nl);
void jit__cpu_plan_generic(walk *w, MlirOperation g);
MlirWalkResult jit__cpu_find_row_roots(MlirOperation op, void *user);
MlirWalkResult jit__cpu_plan_generic_op(MlirOperation op, void *user);
void jit__cpu_plan_streams(const walk *w, MlirOperation module, jit__cpu_plan *out);

//===--- Pre-rewrites (normalize.c) --------------------------------------===//

// Gives each linalg.fill read by more than one op a copy per reader.
void jit__cpu_unshare_fills(MlirOperation module);

#endif  // JITML_LOWERING_CPU_INTERNAL_H_
