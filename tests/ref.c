//===--- ref.c - plain-C reference implementations for the tests ----------===//
#include "ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

//===--- f16 ----------------------------------------------------------------===//

uint16_t ref_f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof(x));
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t exp = (x >> 23) & 0xffu;
  uint32_t mant = x & 0x7fffffu;
  if (exp == 0xffu) {  // inf or NaN
    if (mant) return (uint16_t)(sign | 0x7e00u | (mant >> 13));
    return (uint16_t)(sign | 0x7c00u);
  }
  int32_t e = (int32_t)exp - 127 + 15;
  if (e >= 31) return (uint16_t)(sign | 0x7c00u);  // overflow -> inf
  if (e <= 0) {
    // Subnormal half (or zero). Values below 2^-25 round to zero; exactly 2^-25 is a
    // tie that rounds to the even zero.
    if (e < -10) return (uint16_t)sign;
    mant |= 0x800000u;  // implicit bit
    int shift = 14 - e;  // 14..24
    uint32_t h = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) h++;  // may carry into the exponent
    return (uint16_t)(sign | h);
  }
  uint32_t h = ((uint32_t)e << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;  // carry may reach inf
  return (uint16_t)(sign | h);
}

float ref_f16_to_f32(uint16_t h) {
  uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
  uint32_t exp = ((uint32_t)h >> 10) & 0x1fu;
  uint32_t mant = (uint32_t)h & 0x3ffu;
  uint32_t x;
  if (exp == 0) {
    float v = (float)ldexp((double)mant, -24);
    return sign ? -v : v;
  } else if (exp == 31) {
    x = sign | 0x7f800000u | (mant << 13);
  } else {
    x = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  float f;
  memcpy(&f, &x, sizeof(f));
  return f;
}

void ref_f32_to_f16_array(const float *src, uint16_t *dst, int64_t n) {
  for (int64_t i = 0; i < n; i++) dst[i] = ref_f32_to_f16(src[i]);
}

void ref_f16_to_f32_array(const uint16_t *src, float *dst, int64_t n) {
  for (int64_t i = 0; i < n; i++) dst[i] = ref_f16_to_f32(src[i]);
}

void ref_round_f16_array(float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) x[i] = ref_f16_to_f32(ref_f32_to_f16(x[i]));
}

//===--- Random inputs ------------------------------------------------------===//

void ref_rng_seed(ref_rng *rng, uint64_t seed) {
  rng->state = seed ? seed * 0x9e3779b97f4a7c15ull : 0x853c49e6748fea9bull;
  if (!rng->state) rng->state = 1;
}

static uint64_t ref_rng_next(ref_rng *rng) {  // xorshift64*
  uint64_t x = rng->state;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  rng->state = x;
  return x * 0x2545f4914f6cdd1dull;
}

double ref_rng_unit(ref_rng *rng) {
  return (double)(ref_rng_next(rng) >> 11) * (1.0 / 9007199254740992.0);
}

void ref_rng_fill(ref_rng *rng, float *x, int64_t n, float lo, float hi) {
  for (int64_t i = 0; i < n; i++)
    x[i] = (float)(lo + (hi - lo) * ref_rng_unit(rng));
}

void ref_rng_fill_signed(ref_rng *rng, float *x, int64_t n) {
  ref_rng_fill(rng, x, n, -1.0f, 1.0f);
}

void ref_rng_fill_positive(ref_rng *rng, float *x, int64_t n) {
  ref_rng_fill(rng, x, n, 0.05f, 1.0f);
}

//===--- Shapes -------------------------------------------------------------===//

int64_t ref_numel(int rank, const int64_t *dims) {
  int64_t n = 1;
  for (int i = 0; i < rank; i++) n *= dims[i];
  return n;
}

void ref_strides(int rank, const int64_t *dims, int64_t *strides) {
  int64_t s = 1;
  for (int i = rank - 1; i >= 0; i--) {
    strides[i] = s;
    s *= dims[i];
  }
}

int ref_broadcast_shape(int ra, const int64_t *da, int rb, const int64_t *db,
                        int64_t *dc) {
  int rc = ra > rb ? ra : rb;
  for (int i = 0; i < rc; i++) {
    int ia = i - (rc - ra), ib = i - (rc - rb);
    int64_t a = ia >= 0 ? da[ia] : 1;
    int64_t b = ib >= 0 ? db[ib] : 1;
    if (a != b && a != 1 && b != 1) return -1;
    dc[i] = a == 1 ? b : a;
  }
  return rc;
}

// Strides of `rank`/`dims` seen as an operand of an `rc`-rank broadcast: left-padded,
// with 0 for broadcast dims.
static void ref_bcast_strides(int rank, const int64_t *dims, int rc, int64_t *out) {
  int64_t s[REF_MAX_RANK];
  ref_strides(rank, dims, s);
  for (int i = 0; i < rc; i++) {
    int j = i - (rc - rank);
    out[i] = (j < 0 || dims[j] == 1) ? 0 : s[j];
  }
}

// Advances a row-major multi-index; returns 0 after the last one.
static int ref_next_index(int rank, const int64_t *dims, int64_t *idx) {
  for (int i = rank - 1; i >= 0; i--) {
    if (++idx[i] < dims[i]) return 1;
    idx[i] = 0;
  }
  return 0;
}

//===--- Elementwise --------------------------------------------------------===//

double ref_binary_scalar(ref_binop op, double a, double b) {
  switch (op) {
    case REF_ADD: return a + b;
    case REF_SUB: return a - b;
    case REF_MUL: return a * b;
    case REF_DIV: return a / b;
    case REF_MAX: return a > b ? a : b;
    case REF_MIN: return a < b ? a : b;
    case REF_LT: return a < b;
    case REF_LE: return a <= b;
    case REF_GT: return a > b;
    case REF_GE: return a >= b;
    case REF_EQ: return a == b;
    case REF_NE: return a != b;
    case REF_POW: return pow(a, b);
  }
  return NAN;
}

double ref_unary_scalar(ref_unop op, double x) {
  switch (op) {
    case REF_NEG: return -x;
    case REF_EXP: return exp(x);
    case REF_LOG: return log(x);
    case REF_TANH: return tanh(x);
    case REF_SIGMOID: return 1.0 / (1.0 + exp(-x));
    case REF_RELU: return x > 0 ? x : 0.0;
    case REF_GELU:
      return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
    case REF_SQRT: return sqrt(x);
    case REF_RSQRT: return 1.0 / sqrt(x);
    case REF_ERF: return erf(x);
    case REF_GELU_ERF: return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
    case REF_ROUND: return nearbyint(x);  // the default mode: ties to even
  }
  return NAN;
}

const char *ref_binop_name(ref_binop op) {
  static const char *names[] = {"add", "sub", "mul", "div", "maximum", "minimum", "less",
                                "less_equal", "greater", "greater_equal", "equal",
                                "not_equal", "pow"};
  return (unsigned)op < 13 ? names[op] : "?";
}

const char *ref_unop_name(ref_unop op) {
  static const char *names[] = {"neg",  "exp",  "log",   "tanh", "sigmoid",  "relu",
                                "gelu", "sqrt", "rsqrt", "erf",  "gelu_erf", "round"};
  return (unsigned)op < 12 ? names[op] : "?";
}

void ref_binary(ref_binop op, const float *a, int ra, const int64_t *da,
                const float *b, int rb, const int64_t *db, float *c) {
  int64_t dc[REF_MAX_RANK], sa[REF_MAX_RANK], sb[REF_MAX_RANK];
  int rc = ref_broadcast_shape(ra, da, rb, db, dc);
  if (rc < 0) return;
  ref_bcast_strides(ra, da, rc, sa);
  ref_bcast_strides(rb, db, rc, sb);
  int64_t n = ref_numel(rc, dc);
  int64_t idx[REF_MAX_RANK] = {0};
  for (int64_t k = 0; k < n; k++) {
    int64_t oa = 0, ob = 0;
    for (int i = 0; i < rc; i++) {
      oa += idx[i] * sa[i];
      ob += idx[i] * sb[i];
    }
    c[k] = (float)ref_binary_scalar(op, a[oa], b[ob]);
    ref_next_index(rc, dc, idx);
  }
}

void ref_unary(ref_unop op, const float *x, int64_t n, float *y) {
  for (int64_t i = 0; i < n; i++) y[i] = (float)ref_unary_scalar(op, x[i]);
}

//===--- Matmul -------------------------------------------------------------===//

int ref_matmul(const float *a, int ra, const int64_t *da, const float *b, int rb,
               const int64_t *db, float *c, int64_t *dc) {
  if (ra < 2 || rb < 2) return -1;
  int64_t M = da[ra - 2], K = da[ra - 1], K2 = db[rb - 2], N = db[rb - 1];
  if (K != K2) return -1;
  int64_t batch[REF_MAX_RANK];
  int rbatch = ref_broadcast_shape(ra - 2, da, rb - 2, db, batch);
  if (rbatch < 0) return -1;
  for (int i = 0; i < rbatch; i++) dc[i] = batch[i];
  dc[rbatch] = M;
  dc[rbatch + 1] = N;
  if (!c) return rbatch + 2;

  // Batch strides of each operand in units of whole matrices.
  int64_t sa[REF_MAX_RANK], sb[REF_MAX_RANK];
  ref_bcast_strides(ra - 2, da, rbatch, sa);
  ref_bcast_strides(rb - 2, db, rbatch, sb);
  int64_t nbatch = ref_numel(rbatch, batch);
  int64_t idx[REF_MAX_RANK] = {0};
  for (int64_t t = 0; t < nbatch; t++) {
    int64_t oa = 0, ob = 0;
    for (int i = 0; i < rbatch; i++) {
      oa += idx[i] * sa[i];
      ob += idx[i] * sb[i];
    }
    const float *pa = a + oa * M * K;
    const float *pb = b + ob * K * N;
    float *pc = c + t * M * N;
    for (int64_t i = 0; i < M; i++) {
      for (int64_t j = 0; j < N; j++) {
        double acc = 0.0;
        for (int64_t k = 0; k < K; k++) acc += (double)pa[i * K + k] * pb[k * N + j];
        pc[i * N + j] = (float)acc;
      }
    }
    ref_next_index(rbatch, batch, idx);
  }
  return rbatch + 2;
}

//===--- Reductions, softmax, layout -----------------------------------------===//

int ref_axis(int rank, int axis) {
  if (axis < 0) axis += rank;
  return (axis < 0 || axis >= rank) ? -1 : axis;
}

// Views `dims` as [outer, len, inner] around `axis`.
static void ref_split(int rank, const int64_t *dims, int axis, int64_t *outer,
                      int64_t *len, int64_t *inner) {
  *outer = ref_numel(axis, dims);
  *len = dims[axis];
  *inner = ref_numel(rank - axis - 1, dims + axis + 1);
}

int ref_reduce(ref_reduce_op op, const float *x, int rank, const int64_t *dims,
               int axis, int keepdims, float *y, int64_t *dout) {
  axis = ref_axis(rank, axis);
  if (axis < 0) return -1;
  int r = 0;
  for (int i = 0; i < rank; i++) {
    if (i == axis) {
      if (keepdims) dout[r++] = 1;
    } else {
      dout[r++] = dims[i];
    }
  }
  int64_t outer, len, inner;
  ref_split(rank, dims, axis, &outer, &len, &inner);
  for (int64_t o = 0; o < outer; o++) {
    for (int64_t in = 0; in < inner; in++) {
      const float *p = x + o * len * inner + in;
      double acc = op == REF_RMAX ? -INFINITY : 0.0;
      for (int64_t k = 0; k < len; k++) {
        double v = p[k * inner];
        if (op == REF_RMAX)
          acc = v > acc ? v : acc;
        else
          acc += v;
      }
      if (op == REF_MEAN) acc /= (double)len;
      y[o * inner + in] = (float)acc;
    }
  }
  return r;
}

void ref_softmax(const float *x, int rank, const int64_t *dims, int axis, float *y) {
  axis = ref_axis(rank, axis);
  if (axis < 0) return;
  int64_t outer, len, inner;
  ref_split(rank, dims, axis, &outer, &len, &inner);
  for (int64_t o = 0; o < outer; o++) {
    for (int64_t in = 0; in < inner; in++) {
      int64_t base = o * len * inner + in;
      double m = -INFINITY;
      for (int64_t k = 0; k < len; k++)
        if (x[base + k * inner] > m) m = x[base + k * inner];
      double s = 0.0;
      for (int64_t k = 0; k < len; k++) s += exp((double)x[base + k * inner] - m);
      for (int64_t k = 0; k < len; k++)
        y[base + k * inner] = (float)(exp((double)x[base + k * inner] - m) / s);
    }
  }
}

void ref_transpose(const float *x, int rank, const int64_t *dims, const int *perm,
                   float *y, int64_t *dout) {
  int64_t sin[REF_MAX_RANK];
  ref_strides(rank, dims, sin);
  for (int i = 0; i < rank; i++) dout[i] = dims[perm[i]];
  int64_t n = ref_numel(rank, dims);
  int64_t idx[REF_MAX_RANK] = {0};
  for (int64_t k = 0; k < n; k++) {
    int64_t off = 0;
    for (int i = 0; i < rank; i++) off += idx[i] * sin[perm[i]];
    y[k] = x[off];
    ref_next_index(rank, dout, idx);
  }
}

void ref_reshape(const float *x, int64_t n, float *y) {
  for (int64_t i = 0; i < n; i++) y[i] = x[i];
}

void ref_norm_rows(const float *x, int64_t rows, int64_t cols, const float *w,
                   const float *b, double eps, int rms, float *y) {
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * cols;
    double mean = 0, var = 0;
    for (int64_t c = 0; c < cols; c++) mean += xr[c];
    mean = rms ? 0 : mean / (double)cols;
    for (int64_t c = 0; c < cols; c++) var += (xr[c] - mean) * (xr[c] - mean);
    double inv = 1.0 / sqrt(var / (double)cols + eps);
    for (int64_t c = 0; c < cols; c++) {
      double v = (xr[c] - mean) * inv;
      if (w) v *= w[c];
      if (b) v += b[c];
      y[r * cols + c] = (float)v;
    }
  }
}

//===--- Sliding windows ------------------------------------------------------===//

void ref_window_dims(const ref_window *w, const int64_t *dx, const int64_t *dw, int64_t *dout) {
  int hd = w->nhwc ? 1 : 2, cd = w->nhwc ? 3 : 1;
  int k[2] = {w->kh, w->kw};
  int64_t f = dx[cd];
  if (dw) {
    k[0] = (int)(w->nhwc ? dw[0] : dw[2]);
    k[1] = (int)(w->nhwc ? dw[1] : dw[3]);
    f = w->nhwc ? dw[3] : dw[0];
  }
  dout[0] = dx[0];
  dout[cd] = f;
  for (int s = 0; s < 2; s++)
    dout[hd + s] = (dx[hd + s] + w->pad[2 * s] + w->pad[2 * s + 1] -
                    (int64_t)w->dilation[s] * (k[s] - 1) - 1) / w->stride[s] + 1;
}

// Index of x[n][c][h][w] in either layout.
static int64_t ref_x_at(const ref_window *w, const int64_t *dx, int64_t n, int64_t c,
                        int64_t h, int64_t x) {
  if (w->nhwc) return ((n * dx[1] + h) * dx[2] + x) * dx[3] + c;
  return ((n * dx[1] + c) * dx[2] + h) * dx[3] + x;
}

void ref_conv2d(const ref_window *w, const float *x, const int64_t *dx, const float *wt,
                const int64_t *dw, float *y) {
  int64_t dy[4];
  ref_window_dims(w, dx, dw, dy);
  int hd = w->nhwc ? 1 : 2, cd = w->nhwc ? 3 : 1;
  int64_t C = dx[cd], H = dx[hd], W = dx[hd + 1], F = dy[cd];
  int64_t KH = w->nhwc ? dw[0] : dw[2], KW = w->nhwc ? dw[1] : dw[3];
  int64_t Cg = C / w->groups, Fg = F / w->groups;
  for (int64_t n = 0; n < dy[0]; n++)
    for (int64_t f = 0; f < F; f++)
      for (int64_t oh = 0; oh < dy[hd]; oh++)
        for (int64_t ow = 0; ow < dy[hd + 1]; ow++) {
          double acc = 0.0;
          int64_t g = f / Fg;
          for (int64_t c = 0; c < Cg; c++)
            for (int64_t kh = 0; kh < KH; kh++)
              for (int64_t kw = 0; kw < KW; kw++) {
                int64_t h = oh * w->stride[0] - w->pad[0] + kh * w->dilation[0];
                int64_t v = ow * w->stride[1] - w->pad[2] + kw * w->dilation[1];
                if (h < 0 || h >= H || v < 0 || v >= W) continue;
                double xv = x[ref_x_at(w, dx, n, g * Cg + c, h, v)];
                int64_t wi = w->nhwc ? ((kh * KW + kw) * Cg + c) * F + f
                                     : ((f * Cg + c) * KH + kh) * KW + kw;
                acc += xv * wt[wi];
              }
          y[ref_x_at(w, dy, n, f, oh, ow)] = (float)acc;
        }
}

void ref_pool2d(const ref_window *w, int max, const float *x, const int64_t *dx, float *y) {
  int64_t dy[4];
  ref_window_dims(w, dx, NULL, dy);
  int hd = w->nhwc ? 1 : 2, cd = w->nhwc ? 3 : 1;
  int64_t H = dx[hd], W = dx[hd + 1];
  for (int64_t n = 0; n < dy[0]; n++)
    for (int64_t c = 0; c < dy[cd]; c++)
      for (int64_t oh = 0; oh < dy[hd]; oh++)
        for (int64_t ow = 0; ow < dy[hd + 1]; ow++) {
          double acc = max ? -INFINITY : 0.0;
          int64_t count = 0;
          for (int64_t kh = 0; kh < w->kh; kh++)
            for (int64_t kw = 0; kw < w->kw; kw++) {
              int64_t h = oh * w->stride[0] - w->pad[0] + kh * w->dilation[0];
              int64_t v = ow * w->stride[1] - w->pad[2] + kw * w->dilation[1];
              if (h < 0 || h >= H || v < 0 || v >= W) continue;
              double xv = x[ref_x_at(w, dx, n, c, h, v)];
              count++;
              if (max) acc = (xv > acc || isnan(xv)) ? xv : acc;
              else acc += xv;
            }
          if (!max) acc /= w->count_pad ? (double)w->kh * w->kw : (double)count;
          y[ref_x_at(w, dy, n, c, oh, ow)] = (float)acc;
        }
}

// softmax(q k^T scale + mask) v in double, q [B, S, D], k [B, T, D], v [B, T, Dv], mask
// [S, T] or NULL; causal: key j <= i + T - S.
void ref_attention(const float *q, const float *k, const float *v, const float *mask,
                   int64_t B, int64_t S, int64_t T, int64_t D, int64_t Dv, double scale,
                   int causal, float *out) {
  double *row = malloc(sizeof(double) * (size_t)T);
  for (int64_t b = 0; b < B; b++)
    for (int64_t i = 0; i < S; i++) {
      double mx = -INFINITY;
      for (int64_t j = 0; j < T; j++) {
        double s = 0;
        for (int64_t d = 0; d < D; d++) s += (double)q[(b * S + i) * D + d] * k[(b * T + j) * D + d];
        s *= scale;
        if (mask) s += mask[i * T + j];
        if (causal && j > i + T - S) s = -INFINITY;
        row[j] = s;
        if (s > mx) mx = s;
      }
      double sum = 0;
      for (int64_t j = 0; j < T; j++) sum += row[j] = exp(row[j] - mx);
      for (int64_t c = 0; c < Dv; c++) {
        double acc = 0;
        for (int64_t j = 0; j < T; j++) acc += row[j] * v[(b * T + j) * Dv + c];
        out[(b * S + i) * Dv + c] = (float)(acc / sum);
      }
    }
  free(row);
}
