//===--- ref.h - plain-C reference implementations for the tests ----------===//
//
// Simple loops, no cleverness: what every libjitml op must compute. Arrays are dense
// row-major f32; f16 data is uint16_t (IEEE binary16) and is converted with
// ref_f32_to_f16 / ref_f16_to_f32. Shapes have rank <= REF_MAX_RANK.
//
//===----------------------------------------------------------------------===//
#ifndef JITML_TESTS_REF_H_
#define JITML_TESTS_REF_H_

#include <stddef.h>
#include <stdint.h>

#define REF_MAX_RANK 8

//===--- f16 ----------------------------------------------------------------===//

// f32 -> IEEE half, round to nearest even; overflow gives inf, NaN stays NaN.
uint16_t ref_f32_to_f16(float f);
// IEEE half -> f32 (exact).
float ref_f16_to_f32(uint16_t h);
void ref_f32_to_f16_array(const float *src, uint16_t *dst, int64_t n);
void ref_f16_to_f32_array(const uint16_t *src, float *dst, int64_t n);
// Rounds each element to the nearest f16 value, in place (still stored as f32).
void ref_round_f16_array(float *x, int64_t n);

//===--- Random inputs ------------------------------------------------------===//

typedef struct ref_rng {
  uint64_t state;
} ref_rng;

void ref_rng_seed(ref_rng *rng, uint64_t seed);
// Uniform in [0, 1).
double ref_rng_unit(ref_rng *rng);
// Fills x with values uniform in [lo, hi).
void ref_rng_fill(ref_rng *rng, float *x, int64_t n, float lo, float hi);
// Values in [-1, 1].
void ref_rng_fill_signed(ref_rng *rng, float *x, int64_t n);
// Values in [0.05, 1] (for log, sqrt, rsqrt).
void ref_rng_fill_positive(ref_rng *rng, float *x, int64_t n);

//===--- Shapes -------------------------------------------------------------===//

int64_t ref_numel(int rank, const int64_t *dims);
// Row-major strides in elements.
void ref_strides(int rank, const int64_t *dims, int64_t *strides);
// NumPy broadcast of two shapes (a dim of size 1 broadcasts). Writes the result dims
// and returns its rank, or -1 if the shapes are incompatible.
int ref_broadcast_shape(int ra, const int64_t *da, int rb, const int64_t *db,
                        int64_t *dc);

//===--- Elementwise --------------------------------------------------------===//

typedef enum ref_binop {
  REF_ADD,
  REF_SUB,
  REF_MUL,
  REF_DIV,
  REF_MAX,
  REF_MIN,
  REF_LT,  // comparisons: 1.0 or 0.0
  REF_LE,
  REF_GT,
  REF_GE,
  REF_EQ,
  REF_NE,
  REF_POW,  // C's pow
} ref_binop;

typedef enum ref_unop {
  REF_NEG,
  REF_EXP,
  REF_LOG,
  REF_TANH,
  REF_SIGMOID,
  REF_RELU,
  REF_GELU,
  REF_SQRT,
  REF_RSQRT,
  REF_ERF,
  REF_GELU_ERF,
  REF_ROUND,
} ref_unop;

double ref_binary_scalar(ref_binop op, double a, double b);
double ref_unary_scalar(ref_unop op, double x);
const char *ref_binop_name(ref_binop op);
const char *ref_unop_name(ref_unop op);

// c = a op b with broadcasting; c has the broadcast shape (ref_broadcast_shape).
// Computed in double, stored as f32.
void ref_binary(ref_binop op, const float *a, int ra, const int64_t *da,
                const float *b, int rb, const int64_t *db, float *c);
void ref_unary(ref_unop op, const float *x, int64_t n, float *y);

//===--- Matmul -------------------------------------------------------------===//

// Matrix product of the last two dims with NumPy batch broadcasting; both ranks >= 2.
// Writes the result shape to dc and returns its rank (-1 if incompatible). c may be
// NULL to get only the shape. Accumulates in double.
int ref_matmul(const float *a, int ra, const int64_t *da, const float *b, int rb,
               const int64_t *db, float *c, int64_t *dc);

//===--- Reductions, softmax, layout -----------------------------------------===//

typedef enum ref_reduce_op {
  REF_SUM,
  REF_RMAX,
  REF_MEAN,
} ref_reduce_op;

// Normalizes a possibly negative axis; -1 if out of range.
int ref_axis(int rank, int axis);
// Reduces over `axis` (may be negative). Writes the output shape to dout and returns
// its rank. Accumulates in double.
int ref_reduce(ref_reduce_op op, const float *x, int rank, const int64_t *dims,
               int axis, int keepdims, float *y, int64_t *dout);
// exp(x - max) / sum(exp(x - max)) along `axis`; same shape as x.
void ref_softmax(const float *x, int rank, const int64_t *dims, int axis, float *y);
// Normalization of each row of `cols` values: layer norm ((x - mean) / sqrt(var + eps),
// biased variance) or, with `rms`, x / sqrt(mean(x^2) + eps); then * w + b where given
// (NULL: none). In double.
void ref_norm_rows(const float *x, int64_t rows, int64_t cols, const float *w,
                   const float *b, double eps, int rms, float *y);
// Result dim i is input dim perm[i]. Writes the output shape to dout.
void ref_transpose(const float *x, int rank, const int64_t *dims, const int *perm,
                   float *y, int64_t *dout);
// Same elements in a new shape: a copy.
void ref_reshape(const float *x, int64_t n, float *y);

//===--- Sliding windows ------------------------------------------------------===//

typedef struct ref_window {
  int nhwc;           // x [N, H, W, C], weight [KH, KW, C/groups, F]; else NCHW, OIHW
  int kh, kw;         // pools (conv: from the weight)
  int stride[2], pad[4], dilation[2];  // pad: top, bottom, left, right
  int groups;
  int count_pad;      // avg pool
} ref_window;

// Output dims of a window over x (weight dims for conv, NULL for pools).
void ref_window_dims(const ref_window *w, const int64_t *dx, const int64_t *dw, int64_t *dout);
// Convolution (cross-correlation, zero padding), in double.
void ref_conv2d(const ref_window *w, const float *x, const int64_t *dx, const float *wt,
                const int64_t *dw, float *y);
// Max (padding never wins) or average pooling, in double.
void ref_pool2d(const ref_window *w, int max, const float *x, const int64_t *dx, float *y);

// softmax(q k^T scale + mask) v in double, q [B, S, D], k [B, T, D], v [B, T, Dv], mask
// [S, T] or NULL; causal: key j <= i + T - S.
void ref_attention(const float *q, const float *k, const float *v, const float *mask,
                   int64_t B, int64_t S, int64_t T, int64_t D, int64_t Dv, double scale,
                   int causal, float *out);

#endif  // JITML_TESTS_REF_H_
