//===--- emit.h - the linalg emitter's shared state (lowering/ only) -------===//
//
// emit_mlir.c (types, values, linalg.generic, the graph and its function frame),
// emit_ops.c (elementwise, reductions, softmax, transpose, reshape) and
// emit_matmul.c (matmuls) write one graph through one jit__emitter. Nothing here is
// used outside those three files; lower.h is the interface (jit__emit_mlir_with).
//
//===----------------------------------------------------------------------===//
#ifndef JITML_LOWERING_EMIT_H_
#define JITML_LOWERING_EMIT_H_

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"
#include "base/text.h"
#include "lowering/lower.h"

// Small strings returned by value so they can be used inline in a printf argument
// list; the largest (8 dims of 19 digits) fits with room to spare.
typedef struct jit__str {
  char s[256];
} jit__str;

// The SSA index value of a `?` dim (symbolic mode): "%in0_d1", "%v7_t3", "%idx1".
typedef struct jit__dimval {
  char s[40];
} jit__dimval;

typedef struct jit__emitter {
  jit__text tb;
  const jit__lgraph *g;
  const jit__emit_options *opt;
  bool symbolic;      // opt->symbolic: dims < 0 are `?` (see lower.h)
  jit__dimval (*dv)[JIT_MAX_RANK];  // per node: the value of each `?` dim of its result
  bool dim_lost;      // a `?` dim had no value to give tensor.empty (a bug; reported)
  char (*names)[32];  // SSA name holding each node's value
  uint32_t cur;       // node being emitted
  int n_tmp;          // temporaries made for it so far
  int n_empty;        // tensor.empty ops written (distinct_empties numbers them)
  bool named_batch;   // batched matmuls as named ops (jit__emit_mlir)
  // The next generic's threads hint: jit__emit_generic_open writes `jit_split` into its
  // attributes and clears this (the CPU strategy splits such a generic across the
  // threads whatever its size: its body does more than an elementwise op's).
  bool split_next;
  // Per node: the value it was reshaped from, when a batched matmul's named op (of
  // rank flat_rank) made it (emit_named_matmul); an output written from there.
  struct jit__flat_value {
    jit__str name;
    int rank;
    int64_t dims[3];
  } *flat;
  // Per node: for a reduction with keepdims (CPU), the value before its unit dim was
  // put back, and that dim (emit_reduce); elementwise consumers read that instead.
  struct jit__squeezed {
    jit__str name;
    int axis;
    bool set;
  } *squeezed;
  uint8_t *mm_up, *mm_down;  // per node: steps to a matmul (matmul_distances)
  // Per node: 1 when it is an elementwise node written inside its one consumer's body
  // (emit_fused.c); NULL: none are. It and the writing's scratch are e->fusion's.
  uint8_t *inlined;
  struct jit__fusion *fusion;
} jit__emitter;

// What a generic body computes, in f32, from its (extended) inputs x, y, z and, for
// reductions, the f32 accumulator `out`.
typedef enum jit__body_kind {
  JIT__B_COPY,
  JIT__B_ADD, JIT__B_SUB, JIT__B_MUL, JIT__B_DIV, JIT__B_MAX, JIT__B_MIN,
  JIT__B_NEG, JIT__B_EXP, JIT__B_LOG, JIT__B_TANH, JIT__B_SIGMOID, JIT__B_RELU, JIT__B_GELU,
  JIT__B_SQRT, JIT__B_RSQRT, JIT__B_ERF, JIT__B_GELU_ERF, JIT__B_ROUND,
  JIT__B_LT, JIT__B_LE, JIT__B_GT, JIT__B_GE, JIT__B_EQ, JIT__B_NE,  // 1.0 or 0.0
  JIT__B_POW,
  JIT__B_SELECT,   // y where x != 0, else z
  JIT__B_ACC_SUM,  // out + x
  JIT__B_ACC_MAX,  // max(out, x)
  JIT__B_ACC_MAXNUM,  // max(out, x) for softmax, as llvm.maxnum with no NaN checks (nnan:
                 // one vmaxps per vector, no test for NaN and no scalar tail; 64x1024
                 // in cache 17.5 -> 15.6 us). Whatever max a row with a NaN gets, the
                 // NaN turns the row all NaN through its exp and sum, as it should
  JIT__B_ACC_MAC,  // out + x * y
  JIT__B_EXP_SUB,  // exp(x - y)
  JIT__B_DIV_BY,   // x / constant (`by`, a literal)
  JIT__B_DIV_BY_VALUE,  // x / `by`, an f32 value defined outside the body (a `?` count)
} jit__body_kind;

// One operand of a generic: map[d] is the loop index of operand dim d, or -1 for the
// constant 0 (a broadcast size-1 dim).
typedef struct jit__gen_operand {
  const char *name;
  jit__dtype dt;
  int rank;
  const int64_t *dims;
  int map[JIT_MAX_RANK];
  const jit__dimval *dv;  // the values of its `?` dims (symbolic mode); NULL: none
  // When set, the map's results as written ("d0, d2 * 2 + d5, 0"), instead of `map`:
  // windows read their input at strided positions (emit_window.c).
  const char *affine;
} jit__gen_operand;

//===--- Types and literals ---===//

// `kind`<d0x..xelem> ("tensor" or "memref"), a negative dim written as `?`.
jit__str jit__shape_type(const char *kind, jit__dtype dt, int rank, const int64_t *dims);
jit__str jit__tensor_type(jit__dtype dt, int rank, const int64_t *dims);
jit__str jit__float_literal(double v, jit__dtype dt);
int64_t jit__num_elements(int rank, const int64_t *dims);

//===--- Values and generics (emit_mlir.c) ---===//

jit__str jit__value_name(jit__emitter *e, bool final);
void jit__emit_empty(jit__emitter *e, const char *res, jit__dtype dt, int rank,
                       const int64_t *dims, const jit__dimval *dv);
// `dst` (an f32 tensor of type `ty`) filled with `init`: an accumulator in place, such
// as a loop's slice of its result (a fill of a fresh tensor in a loop is hoisted and
// then copied into a new buffer per iteration).
jit__str jit__emit_fill(jit__emitter *e, const char *init, const char *dst, const char *ty);
jit__str jit__emit_filled_acc(jit__emitter *e, const char *init, int rank, const int64_t *dims,
                           const jit__dimval *dv);
void jit__identity_map(jit__gen_operand *op);
void jit__emit_generic(jit__emitter *e, const char *res, int n_loops, const char *iters,
                         const jit__gen_operand *ins, int n_in, const jit__gen_operand *out,
                         jit__body_kind kind, const char *by);
// The head of jit__emit_generic, up to its block's arguments (%in<i>, %out).
void jit__emit_generic_open(jit__emitter *e, const char *res, int n_loops, const char *iters,
                            const jit__gen_operand *ins, int n_in,
                            const jit__gen_operand *out);
// One body computation of `kind` on f32 values x (and y, z), its names made unique by
// `step`; returns the result's name (in name[16], or one of x, y, z).
const char *jit__emit_body_step(jit__emitter *e, jit__body_kind kind, const char *x,
                                const char *y, const char *z, int step, char name[16]);
jit__gen_operand jit__node_operand(jit__emitter *e, uint32_t id);
bool jit__result_dims_from(jit__emitter *e, const jit__gen_operand *ins, int n_in, int rank,
                             const int64_t *dims, jit__dimval *dv);
bool jit__dims_agree(const jit__emitter *e, int64_t od, int64_t rd);
jit_status jit__node_error(jit__emitter *e, const char *what);
void jit__print_int_list(jit__emitter *e, int n, const int64_t *v);
void jit__print_shape_list(jit__emitter *e, int rank, const int64_t *dims, const jit__dimval *dv);
jit__str jit__emit_convert(jit__emitter *e, const char *x, jit__dtype from, jit__dtype to, int rank,
                        const int64_t *dims, const jit__dimval *dv, bool final);
jit__str jit__emit_f16_result(jit__emitter *e, const char *acc, int rank, const int64_t *dims,
                           const jit__dimval *dv, bool final);
// An index constant at function level (any value).
jit__str jit__emit_index_const(jit__emitter *e, int64_t v);
// The value of symbol `code` (symbolic mode): the first input dim that carries it;
// NULL when no input does.
const jit__dimval *jit__symbol_value(const jit__emitter *e, int64_t code);
// An index value at function level: the constant `size`, or dv's value when `size`
// is `?` (< 0).
jit__str jit__emit_size(jit__emitter *e, int64_t size, const jit__dimval *dv);
// `x` as shape `to`: jit__emit_reshape_to where `to` is static, else a tensor.reshape
// whose shape operand takes the `?` sizes from to_dv (a view either way).
jit__str jit__emit_reshape_dyn(jit__emitter *e, const char *x, jit__dtype dt, int rank,
                               const int64_t *dims, int to_rank, const int64_t *to,
                               const jit__dimval *to_dv, bool final);
jit__str jit__emit_reshape_to(jit__emitter *e, const char *x, jit__dtype dt, int rank,
                           const int64_t *dims, int to_rank, const int64_t *to_dims,
                           bool final);

//===--- Ops (emit_ops.c, emit_matmul.c): each writes node e->cur ---===//

jit_status jit__emit_elementwise(jit__emitter *e, const jit__node *n, jit__body_kind kind);
// The body kind of an elementwise op (jit__op_is_elementwise).
jit__body_kind jit__elementwise_kind(jit__op op);
// Operand `id` of an elementwise node of shape (rank, dims), its map broadcast
// NumPy-style (a keepdims reduction read without its unit dim: sq_dims holds the
// dims then).
jit_status jit__elementwise_operand(jit__emitter *e, uint32_t id, int rank,
                                    const int64_t *dims, jit__gen_operand *op,
                                    int64_t sq_dims[JIT_MAX_RANK]);
// The result of elementwise node `n` over operands `ins`: the values of its `?` dims
// (symbolic mode), its empty init (named *empty), *out (that init, identity map) and
// *res (the node's value name).
jit_status jit__elementwise_result(jit__emitter *e, const jit__node *n,
                                   const jit__gen_operand *ins, int n_in, jit__str *empty,
                                   jit__str *res, jit__gen_operand *out);
// Elementwise chains (emit_fused.c): marks e->inlined (options->fuse_elementwise);
// false when out of memory. jit__emit_elementwise writes a node with inlined operands
// through jit__emit_fused.
bool jit__plan_inlining(jit__emitter *e);
void jit__fusion_free(jit__emitter *e);  // no-op without one
jit_status jit__emit_fused(jit__emitter *e, const jit__node *n);
jit_status jit__emit_reduce(jit__emitter *e, const jit__node *n);
jit_status jit__emit_softmax(jit__emitter *e, const jit__node *n);
jit_status jit__emit_transpose(jit__emitter *e, const jit__node *n);
jit_status jit__emit_reshape(jit__emitter *e, const jit__node *n);
jit_status jit__emit_matmul(jit__emitter *e, const jit__node *n);
jit_status jit__emit_matmul_int8(jit__emitter *e, const jit__node *n);  // emit_matmul.c
jit_status jit__emit_window(jit__emitter *e, const jit__node *n);  // emit_window.c
// The images per Winograd F(m, 3) pass of conv node `n` (weight dims wd): all N, 1 (a
// loop over the images), or 0 (not Winograd); its value from the padded x (m (tH + 1)
// rows, tH = ceil(OH / m)) and the weight (emit_winograd.c). m, the output rows per
// tile, is jit__conv_winograd_rows(OH): 2 or 4.
int64_t jit__conv_winograd_images(const jit__emitter *e, const jit__node *n, const int64_t *wd);
int jit__conv_winograd_rows(int64_t oh);
jit__str jit__emit_conv_winograd(jit__emitter *e, const jit__node *n, const jit__gen_operand *xp,
                                 const jit__gen_operand *wt, int64_t images);
jit_status jit__emit_gather(jit__emitter *e, const jit__node *n);
jit_status jit__emit_index_copy(jit__emitter *e, const jit__node *n);  // emit_copy.c
jit_status jit__emit_attention(jit__emitter *e, const jit__node *n);  // emit_attention.c

#endif  // JITML_LOWERING_EMIT_H_
