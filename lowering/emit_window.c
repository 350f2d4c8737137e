//===--- emit_window.c - conv2d and 2-D pooling as linalg.generic ----------===//
//
// A sliding window is written as one linalg.generic whose input map reads the input
// at strided positions (oh * stride + kh * dilation), the form the named convolution
// and pooling ops generalize to, so every strategy and backend that lowers generics
// lowers it; nothing here depends on a target.
//
//   padding  a generic over the padded shape that reads x with tensor.extract at
//            clamped indices and selects the pad value outside x (zero; -inf for max
//            pools); one parallel loop nest on every back end, where a tensor.pad
//            would bufferize to a strided memref.copy (emit_copy.c says more).
//   conv     the CPU's exact 3x3 stride-1 convolutions: Winograd F(4, 3) or F(2, 3) over rows
//            (emit_winograd.c, where jit__conv_winograd_images); other one-group ones on
//            the CPU: im2col and a matmul (emit_conv_matmul); else
//            loops (n, f, oh, ow | c, kh, kw) (NHWC: n, oh, ow, f | kh, kw, c) into an
//            f32 accumulator: out + x * w. With groups the result is written as
//            [N, G, F/G, OH, OW] (NHWC [N, OH, OW, G, F/G]) and collapsed after, as
//            linalg needs every loop to appear alone in some map: the filter dim of
//            the weight (g * F/G + f) and of x (g * C/G + c) are sums.
//   pools    loops (n, c, oh, ow | kh, kw) with a [KH, KW] window tensor that only
//            gives kh and kw their bounds (the named pooling ops' "fake" operand):
//            max into -inf, sum into 0 and then a division by KH * KW, or (without
//            count_include_pad) by the window's positions inside x, from linalg.index.
//
// Symbolic mode (generic kernels, the export): N, H and W may be `?`; the padded and
// output sizes are then computed from H and W with index arithmetic.
//
//===----------------------------------------------------------------------===//
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "base/text.h"
#include "lowering/emit.h"
#include "lowering/lower.h"

// The geometry of window node `n`: where its spatial and channel dims are, its
// kernel, and the padded input's dims (`?` ones with their values in pdv).
typedef struct geom {
  const jit__node *n;
  int hd, cd;  // first spatial dim, channel dim
  int k[2];    // kernel height, width
  int64_t pdims[4];
  jit__dimval pdv[4];
} geom;

static const char *elem(jit__dtype dt) { return jit__dtype_str(dt); }

// `*dv` = (in + add) / div + plus, on index values (in >= 0 at run time). Unit steps
// are left out.
static void index_affine(jit__emitter *e, const char *in, int64_t add, int64_t div,
                         int64_t plus, jit__dimval *dv) {
  snprintf(dv->s, sizeof dv->s, "%s", in);
  const int64_t steps[3] = {add, div, plus};
  static const char *const ops[3] = {"addi", "divui", "addi"};
  for (int i = 0; i < 3; i++) {
    if ((i == 1 && steps[i] == 1) || (i != 1 && steps[i] == 0)) continue;
    jit__str c = jit__emit_index_const(e, steps[i]), r = jit__value_name(e, false);
    jit__text_printf(&e->tb, "  %s = arith.%s %s, %s : index\n", r.s, ops[i], dv->s, c.s);
    memcpy(dv->s, r.s, sizeof dv->s - 1);
    dv->s[sizeof dv->s - 1] = 0;
  }
}

// The padded input's dims into g->pdims / g->pdv.
static void padded_dims(jit__emitter *e, const jit__gen_operand *x, geom *g) {
  const jit__window *w = &g->n->win;
  for (int d = 0; d < 4; d++) {
    int s = d - g->hd;
    int64_t pad = s == 0 || s == 1 ? w->pad[2 * s] + w->pad[2 * s + 1] : 0;
    g->pdims[d] = x->dims[d] >= 0 ? x->dims[d] + pad : -1;
    memset(&g->pdv[d], 0, sizeof g->pdv[d]);
    if (x->dims[d] < 0 && x->dv) index_affine(e, x->dv[d].s, pad, 1, 0, &g->pdv[d]);
  }
}

// x padded with `padval` (a literal of x's type) as g says; returns its operand, or
// x itself when there is no padding.
static jit__gen_operand emit_pad(jit__emitter *e, const jit__gen_operand *x, geom *g,
                                 const char *padval, jit__str *name) {
  const jit__window *w = &g->n->win;
  padded_dims(e, x, g);
  if (!w->pad[0] && !w->pad[1] && !w->pad[2] && !w->pad[3]) return *x;
  jit__str empty = jit__value_name(e, false);
  *name = jit__value_name(e, false);
  jit__emit_empty(e, empty.s, x->dt, 4, g->pdims, g->pdv);
  jit__str ty = jit__tensor_type(x->dt, 4, g->pdims), xty = jit__tensor_type(x->dt, 4, x->dims);
  jit__text *tb = &e->tb;
  jit__text_printf(tb,
                   "  %s = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> "
                   "(d0, d1, d2, d3)>], iterator_types = [\"parallel\", \"parallel\", "
                   "\"parallel\", \"parallel\"]} outs(%s : %s) {\n  ^bb0(%%out: %s):\n"
                   "    %%wz = arith.constant 0 : index\n",
                   name->s, empty.s, ty.s, elem(x->dt));
  for (int d = 0; d < 4; d++) jit__text_printf(tb, "    %%wi%d = linalg.index %d : index\n", d, d);
  for (int s = 0; s < 2; s++) {
    int d = g->hd + s;
    jit__text_printf(tb, "    %%wlo%d = arith.constant %d : index\n", s, w->pad[2 * s]);
    if (x->dims[d] >= 0)
      jit__text_printf(tb, "    %%wn%d = arith.constant %lld : index\n", s,
                       (long long)x->dims[d]);
    jit__text_printf(tb,
                     "    %%wp%d = arith.subi %%wi%d, %%wlo%d : index\n"
                     "    %%wok%d = arith.cmpi ult, %%wp%d, %s%s : index\n"
                     "    %%wq%d = arith.select %%wok%d, %%wp%d, %%wz : index\n",
                     s, d, s, s, s, x->dims[d] >= 0 ? "%wn" : x->dv[d].s,
                     x->dims[d] >= 0 ? (s ? "1" : "0") : "", s, s, s);
  }
  char idx[4][16];
  for (int d = 0; d < 4; d++) {
    if (d == g->hd || d == g->hd + 1)
      snprintf(idx[d], sizeof idx[d], "%%wq%d", d - g->hd);
    else
      snprintf(idx[d], sizeof idx[d], "%%wi%d", d);
  }
  jit__text_printf(tb,
                   "    %%wok = arith.andi %%wok0, %%wok1 : i1\n"
                   "    %%wv = tensor.extract %s[%s, %s, %s, %s] : %s\n"
                   "    %%wpv = arith.constant %s : %s\n"
                   "    %%wr = arith.select %%wok, %%wv, %%wpv : %s\n"
                   "    linalg.yield %%wr : %s\n  } -> %s\n",
                   x->name, idx[0], idx[1], idx[2], idx[3], xty.s, padval, elem(x->dt),
                   elem(x->dt), elem(x->dt), ty.s);
  jit__gen_operand p = {name->s, x->dt, 4, g->pdims, {0}, g->pdv, NULL};
  jit__identity_map(&p);
  return p;
}

// The values of the result's `?` dims (symbolic mode): N from x, OH and OW from the
// padded sizes, F and C static.
static void result_dims(jit__emitter *e, const jit__gen_operand *x, const geom *g) {
  const jit__node *n = g->n;
  const jit__window *w = &n->win;
  jit__dimval *dv = e->dv[e->cur];
  if (n->dims[0] < 0 && x->dv) dv[0] = x->dv[0];
  for (int s = 0; s < 2; s++) {
    int d = g->hd + s;
    if (n->dims[d] >= 0 || !g->pdv[d].s[0]) continue;
    int64_t span = (int64_t)w->dilation[s] * (g->k[s] - 1) + 1;
    index_affine(e, g->pdv[d].s, -span, w->stride[s], 1, &dv[d]);
  }
}

// "d<a> * stride + d<b> * dilation" into out, for one spatial dim.
static int window_expr(char *out, size_t size, int a, int stride, int b, int dilation) {
  return snprintf(out, size, "d%d * %d + d%d * %d", a, stride, b, dilation);
}

// The accumulator's f32 result `acc` (dims, dv) as node n's value of n's dtype: f16
// rounded once; `kind`/`by` divide on the way (avg pool) or JIT__B_COPY.
static jit__str finish(jit__emitter *e, const char *acc, int rank, const int64_t *dims,
                       const jit__dimval *dv, jit__body_kind kind, const char *by) {
  if (kind == JIT__B_COPY && e->g->nodes[e->cur].dtype == JIT__F32) {
    jit__str r;
    snprintf(r.s, sizeof r.s, "%s", acc);
    return r;
  }
  jit__dtype dt = e->g->nodes[e->cur].dtype;
  jit__str empty = jit__value_name(e, false), res = jit__value_name(e, false);
  jit__emit_empty(e, empty.s, dt, rank, dims, dv);
  jit__gen_operand in = {acc, JIT__F32, rank, dims, {0}, NULL, NULL};
  jit__gen_operand out = {empty.s, dt, rank, dims, {0}, NULL, NULL};
  jit__identity_map(&in);
  jit__identity_map(&out);
  char iters[JIT_MAX_RANK];
  memset(iters, 'p', sizeof iters);
  jit__emit_generic(e, res.s, rank, iters, &in, 1, &out, kind, by);
  return res;
}

static void set_value(jit__emitter *e, const char *name) {
  size_t n = strlen(name), cap = sizeof e->names[e->cur] - 1;
  memcpy(e->names[e->cur], name, n < cap ? n : cap);
  e->names[e->cur][n < cap ? n : cap] = 0;
}

// `x` [dims] copied into a new value of `dims` (`?` ones valued by dv) through `map`
// (the results for output loops d0..), converted to `dt` on the way.
static jit__str emit_copy(jit__emitter *e, const jit__gen_operand *x, const char *map,
                          jit__dtype dt, int rank, const int64_t *dims, const jit__dimval *dv) {
  jit__str empty = jit__value_name(e, false), res = jit__value_name(e, false);
  jit__emit_empty(e, empty.s, dt, rank, dims, dv);
  jit__gen_operand in = *x;
  in.affine = map;
  jit__gen_operand out = {empty.s, dt, rank, dims, {0}, NULL, NULL};
  jit__identity_map(&out);
  char iters[JIT_MAX_RANK];
  memset(iters, 'p', sizeof iters);
  jit__emit_generic(e, res.s, rank, iters, &in, 1, &out, JIT__B_COPY, NULL);
  return res;
}

// CPU kernels, groups 1: the convolution as one matmul, which the CPU strategy tiles,
// packs and threads like any other (the loops of the direct form ran at ~0.7
// GFLOP/s). A row per output position:
//   NHWC  cols [N OH OW, KH KW C] (x's windows, c innermost) x W [KH KW C, F]
//         = the result [N, OH, OW, F] as it is;
//   NCHW  cols [N OH OW, C KH KW] x W^T (W [F, C KH KW] transposed once, small), then
//         the [N, OH, OW, F] product transposed into [N, F, OH, OW].
// The copy into cols is KH KW times x (a 1x1 NHWC conv without stride or padding
// reads x itself). In symbolic mode N, OH and OW may be `?`, and so the rows.
// Exact NCHW kernels: W [F, C KH KW] times each image's windows as columns, cols
// [C KH KW, OH OW] (the copy reads x along its rows: ow innermost, contiguous at
// stride 1), which is the result in NCHW as it is. One image: a linalg.matmul; a
// batch: a linalg.batch_matmul with W repeated per image. A 1x1 convolution without
// stride or padding reads x itself. Against the rows-per-position form (M = N OH OW)
// this saves the result's transpose and makes the copy contiguous: ResNet's 3x3 at
// 56x56, 64 channels, 5.9 -> 3.4 ms at 1 thread; a 1x1 256 -> 64, 3.5 -> 0.9-1.3 ms.
// Output rows per block of emit_conv_nchw_blocked: the most that divide OH with
// columns [K, R OW] within `budget` bytes and, for T > 1 threads, blocks that the
// threads share evenly (or at least 4 each); 0 (no blocks) when one image's columns
// fit whole, or when the rows that fit make a block under 64 columns (a narrow matmul).
static int64_t conv_block_rows(int64_t budget, int T, int64_t N, int64_t K, int64_t OH,
                               int64_t OW, int64_t elem) {
  if (budget <= 0 || K * OH * OW * elem <= budget) return 0;
  for (int64_t R = OH - 1; R >= 1 && R * OW >= 64; R--) {
    int64_t blocks = N * (OH / R);
    if (OH % R == 0 && K * R * OW * elem <= budget &&
        (T <= 1 || blocks % T == 0 || blocks >= 4 * T))
      return R;
  }
  return 0;
}

// emit_conv_nchw_matmul in blocks of R output rows: a loop over (image, block) copies
// the block's windows into columns [C KH KW, R OW] (from a flat slice of the padded x
// that starts at the block's first row) and multiplies W by them into the block's
// columns of the result. The columns are written and packed while they are in L2
// instead of going through memory whole (ResNet's 3x3 at 56x56, C = 64: 7.2 MB).
// With threads, the loop is an scf.forall: each thread copies and multiplies whole
// blocks (the copy is split too, and no matmul forks and joins per block).
static jit__str emit_conv_nchw_blocked(jit__emitter *e, const jit__window *w, const geom *g,
                                       const jit__gen_operand *xp, const char *a,
                                       jit__dtype a_dt, int64_t R, const int64_t *od) {
  int64_t N = od[0], F = od[1], OH = od[2], OW = od[3], P = OH * OW;
  int64_t C = xp->dims[1], KH = g->k[0], KW = g->k[1], K = C * KH * KW;
  int64_t Hp = xp->dims[2], Wp = xp->dims[3], image = C * Hp * Wp, total = N * image;
  int64_t nb = OH / R, step = R * w->stride[0] * Wp, span = image - (nb - 1) * step;
  bool forall = e->opt->forall_threads > 1;
  jit__dtype dt = xp->dt;
  jit__str flat = jit__emit_reshape_to(e, xp->name, dt, 4, xp->dims, 1, &total, false);
  int64_t cd[3] = {N, F, P};
  jit__str init = jit__value_name(e, false);
  jit__emit_empty(e, init.s, JIT__F32, 3, cd, NULL);
  jit__str loop = jit__value_name(e, false), iv = jit__value_name(e, false),
           it = jit__value_name(e, false);
  jit__str acc_ty = jit__tensor_type(JIT__F32, 3, cd);
  if (forall) {
    jit__text_printf(&e->tb, "  %s = scf.forall (%s) in (%lld) shared_outs(%s = %s) -> (%s) {\n",
                     loop.s, iv.s, (long long)(N * nb), it.s, init.s, acc_ty.s);
  } else {
    jit__str lo = jit__emit_index_const(e, 0), hi = jit__emit_index_const(e, N * nb),
             one = jit__emit_index_const(e, 1);
    jit__text_printf(&e->tb,
                     "  %s = scf.for %s = %s to %s step %s iter_args(%s = %s) -> (%s) {\n",
                     loop.s, iv.s, lo.s, hi.s, one.s, it.s, init.s, acc_ty.s);
  }
  // Image n = b / nb, block r = b % nb: x from n image + r step, result columns r R OW.
  jit__str img = jit__value_name(e, false), off = jit__value_name(e, false),
           col = jit__value_name(e, false);
  jit__text_printf(&e->tb,
                   "  %s = affine.apply affine_map<(d0) -> (d0 floordiv %lld)>(%s)\n"
                   "  %s = affine.apply affine_map<(d0) -> ((d0 floordiv %lld) * %lld + "
                   "(d0 mod %lld) * %lld)>(%s)\n"
                   "  %s = affine.apply affine_map<(d0) -> ((d0 mod %lld) * %lld)>(%s)\n",
                   img.s, (long long)nb, iv.s, off.s, (long long)nb, (long long)image,
                   (long long)nb, (long long)step, iv.s, col.s, (long long)nb,
                   (long long)(R * OW), iv.s);
  jit__str xs = jit__value_name(e, false);
  jit__text_printf(&e->tb, "  %s = tensor.extract_slice %s[%s] [%lld] [1] : %s to %s\n", xs.s,
                   flat.s, off.s, (long long)span, jit__tensor_type(dt, 1, &total).s,
                   jit__tensor_type(dt, 1, &span).s);
  int64_t cold[5] = {C, KH, KW, R, OW}, bd[2] = {K, R * OW}, fk[2] = {F, K},
          rd[2] = {F, R * OW};
  char map[256];
  snprintf(map, sizeof map, "d0 * %lld + d3 * %lld + d1 * %lld + d4 * %d + d2 * %d",
           (long long)(Hp * Wp), (long long)(w->stride[0] * Wp),
           (long long)(w->dilation[0] * Wp), w->stride[1], w->dilation[1]);
  jit__gen_operand fx = {xs.s, dt, 1, &span, {0}, NULL, NULL};
  jit__str cols = emit_copy(e, &fx, map, dt, 5, cold, NULL);
  jit__str b = jit__emit_reshape_to(e, cols.s, dt, 5, cold, 2, bd, false);
  // The block's accumulator is its slice of the result, zeroed in place: a fill of a
  // fresh tensor is loop-invariant, hoisted, and then copied into a new buffer per block
  // and again into the result (four copies of each block, 7 % of ResNet's 3x3 at N = 8).
  jit__str blk_ty = jit__tensor_type(JIT__F32, 2, rd);
  jit__str dst = jit__value_name(e, false);
  jit__text_printf(&e->tb,
                   "  %s = tensor.extract_slice %s[%s, 0, %s] [1, %lld, %lld] [1, 1, 1] : %s "
                   "to %s\n",
                   dst.s, it.s, img.s, col.s, (long long)F, (long long)(R * OW), acc_ty.s,
                   blk_ty.s);
  jit__str acc = jit__emit_fill(e, "0.0", dst.s, blk_ty.s);
  jit__str mm = jit__value_name(e, false), next = jit__value_name(e, false);
  jit__text_printf(&e->tb, "  %s = linalg.matmul ins(%s, %s : %s, %s) outs(%s : %s) -> %s\n",
                   mm.s, a, b.s, jit__tensor_type(a_dt, 2, fk).s,
                   jit__tensor_type(dt, 2, bd).s, acc.s, blk_ty.s, blk_ty.s);
  if (forall) {
    jit__text_printf(&e->tb,
                     "  scf.forall.in_parallel {\n"
                     "    tensor.parallel_insert_slice %s into %s[%s, 0, %s] [1, %lld, %lld] "
                     "[1, 1, 1] : %s into %s\n  }\n  }\n",
                     mm.s, it.s, img.s, col.s, (long long)F, (long long)(R * OW), blk_ty.s,
                     acc_ty.s);
  } else {
    jit__text_printf(&e->tb,
                     "  %s = tensor.insert_slice %s into %s[%s, 0, %s] [1, %lld, %lld] "
                     "[1, 1, 1] : %s into %s\n  scf.yield %s : %s\n  }\n",
                     next.s, mm.s, it.s, img.s, col.s, (long long)F, (long long)(R * OW),
                     blk_ty.s, acc_ty.s, next.s, acc_ty.s);
  }
  return loop;
}

static jit_status emit_conv_nchw_matmul(jit__emitter *e, const jit__node *n, const geom *g,
                                        const jit__gen_operand *xp,
                                        const jit__gen_operand *wt) {
  const jit__window *w = &n->win;
  const int64_t *od = n->dims;
  int64_t N = od[0], F = od[1], OH = od[2], OW = od[3], P = OH * OW;
  int64_t C = xp->dims[1], KH = g->k[0], KW = g->k[1], K = C * KH * KW;
  jit__dtype dt = xp->dt;
  bool batch = N > 1;
  int r = batch ? 3 : 2, o = r - 2;
  int64_t bd[3] = {N, K, P}, ad[3] = {N, F, K}, cd[3] = {N, F, P};
  bool plain = KH == 1 && KW == 1 && w->stride[0] == 1 && w->stride[1] == 1 &&
               xp->dims[2] == OH && xp->dims[3] == OW;
  int64_t elem = jit__dtype_is_half(dt) ? 2 : 4, budget = e->opt->conv_block_bytes;
  int T = e->opt->forall_threads;
  int64_t R = plain ? 0 : conv_block_rows(budget, T, N, K, OH, OW, elem);
  // With threads, blocks twice the size rather than none: the copy is then split too
  // (ResNet's 3x3 256 -> 256 at 14x14: two blocks of 7 rows, 0.9 MB each).
  if (!plain && !R && T > 1 && K * OH * OW * elem > budget)
    R = conv_block_rows(2 * budget, T, N, K, OH, OW, elem);
  if (R > 0) {
    int64_t fk[2] = {F, K};
    jit__str a = jit__emit_reshape_to(e, wt->name, wt->dt, 4, wt->dims, 2, fk, false);
    jit__dtype a_dt = wt->dt;
    if (jit__dtype_is_half(a_dt)) {  // A in f32, as below
      a = jit__emit_convert(e, a.s, a_dt, JIT__F32, 2, fk, NULL, false);
      a_dt = JIT__F32;
    }
    jit__str mm = emit_conv_nchw_blocked(e, w, g, xp, a.s, a_dt, R, od);
    jit__str res = jit__dtype_is_half(n->dtype)
                       ? jit__emit_f16_result(e, mm.s, 3, cd, NULL, false) : mm;
    set_value(e, jit__emit_reshape_to(e, res.s, n->dtype, 3, cd, 4, od, false).s);
    return NULL;
  }
  jit__str b;
  if (plain) {
    b = jit__emit_reshape_to(e, xp->name, dt, 4, xp->dims, r, bd + 1 - o, false);
  } else {
    // x read flat (a tensor.reshape to 1-D) through one linear map: elementwise fusion
    // stops there, so the padding stays its own pass over x instead of being redone,
    // with its clamped reads, in each of the KH KW copies, and the copy's inner loop is
    // a plain strided read (a 3x3 at 56x56, 64 channels, 1 thread: 3.4 -> 2.7-3.1 ms;
    // against oneDNN's convolution on the same NCHW tensors 1.05-1.5x, jitml_bench).
    int64_t cold[6] = {N, C, KH, KW, OH, OW}, Hp = xp->dims[2], Wp = xp->dims[3];
    int64_t total = N * C * Hp * Wp;
    jit__str flat = jit__emit_reshape_to(e, xp->name, dt, 4, xp->dims, 1, &total, false);
    char map[256];
    snprintf(map, sizeof map,
             "d0 * %lld + d1 * %lld + d4 * %lld + d2 * %lld + d5 * %d + d3 * %d",
             (long long)(C * Hp * Wp), (long long)(Hp * Wp), (long long)(w->stride[0] * Wp),
             (long long)(w->dilation[0] * Wp), w->stride[1], w->dilation[1]);
    jit__gen_operand fx = {flat.s, dt, 1, &total, {0}, NULL, NULL};
    jit__str cols = emit_copy(e, &fx, map, dt, 6, cold, NULL);
    b = jit__emit_reshape_to(e, cols.s, dt, 6, cold, r, bd + 1 - o, false);
  }
  int64_t fk[2] = {F, K};
  jit__str a = jit__emit_reshape_to(e, wt->name, wt->dt, 4, wt->dims, 2, fk, false);
  if (batch) {
    jit__gen_operand wo = {a.s, wt->dt, 2, fk, {0}, NULL, NULL};
    a = emit_copy(e, &wo, "d1, d2", wt->dt, 3, ad, NULL);
  }
  jit__dtype a_dt = wt->dt;
  if (jit__dtype_is_half(a_dt)) {  // A in f32 for the strategy's row tiles (emit_matmul.c)
    a = jit__emit_convert(e, a.s, a_dt, JIT__F32, r, ad + 1 - o, NULL, false);
    a_dt = JIT__F32;
  }
  jit__str acc = jit__emit_filled_acc(e, "0.0", r, cd + 1 - o, NULL);
  jit__str mm = jit__value_name(e, false);
  jit__str acc_ty = jit__tensor_type(JIT__F32, r, cd + 1 - o);
  jit__text_printf(&e->tb, "  %s = linalg.%s ins(%s, %s : %s, %s) outs(%s : %s) -> %s\n",
                   mm.s, batch ? "batch_matmul" : "matmul", a.s, b.s,
                   jit__tensor_type(a_dt, r, ad + 1 - o).s,
                   jit__tensor_type(dt, r, bd + 1 - o).s, acc.s, acc_ty.s, acc_ty.s);
  jit__str res = jit__dtype_is_half(n->dtype)
                     ? jit__emit_f16_result(e, mm.s, r, cd + 1 - o, NULL, false) : mm;
  jit__str y = jit__emit_reshape_to(e, res.s, n->dtype, r, cd + 1 - o, 4, od, false);
  set_value(e, y.s);
  return NULL;
}

static jit_status emit_conv_matmul(jit__emitter *e, const jit__node *n, const geom *g,
                                   const jit__gen_operand *xp, const jit__gen_operand *wt) {
  const jit__window *w = &n->win;
  if (!w->nhwc && !e->symbolic) return emit_conv_nchw_matmul(e, n, g, xp, wt);
  const int64_t *od = n->dims;
  const jit__dimval *odv = e->dv[e->cur];
  int64_t N = od[0], OH = od[g->hd], OW = od[g->hd + 1], F = od[g->cd];
  int64_t C = xp->dims[g->cd], KH = g->k[0], KW = g->k[1], K = C * KH * KW;
  // The rows: N OH OW, or `?` valued by their product.
  int64_t M = N >= 0 && OH >= 0 && OW >= 0 ? N * OH * OW : -1;
  jit__dimval mdv[2];
  memset(mdv, 0, sizeof mdv);
  if (M < 0) {
    const int64_t f[3] = {N, OH, OW};
    const jit__dimval *fv[3] = {&odv[0], &odv[g->hd], &odv[g->hd + 1]};
    jit__str prod = jit__emit_index_const(e, 1);
    for (int i = 0; i < 3; i++) {
      jit__str t = jit__value_name(e, false);
      if (f[i] >= 0) {
        jit__str c = jit__emit_index_const(e, f[i]);
        jit__text_printf(&e->tb, "  %s = arith.muli %s, %s : index\n", t.s, prod.s, c.s);
      } else {
        jit__text_printf(&e->tb, "  %s = arith.muli %s, %s : index\n", t.s, prod.s, fv[i]->s);
      }
      prod = t;
    }
    snprintf(mdv[0].s, sizeof mdv[0].s, "%.39s", prod.s);
  }
  int64_t ad[2] = {M, K}, bd[2] = {K, F}, cd[2] = {M, F};
  int64_t nhwc[4] = {N, OH, OW, F};
  jit__dimval nhwc_dv[6];
  memset(nhwc_dv, 0, sizeof nhwc_dv);
  nhwc_dv[0] = odv[0];
  nhwc_dv[1] = odv[g->hd];
  nhwc_dv[2] = odv[g->hd + 1];
  jit__dtype dt = xp->dt;
  char map[256], h[64], v[64];
  jit__str a;
  bool plain = w->nhwc && KH == 1 && KW == 1 && w->stride[0] == 1 && w->stride[1] == 1 &&
               xp->dims[1] == OH && xp->dims[2] == OW && OH >= 0 && OW >= 0;
  if (plain) {
    a = jit__emit_reshape_dyn(e, xp->name, dt, 4, xp->dims, 2, ad, mdv, false);
  } else {
    // cols [N, OH, OW, KH, KW, C] (NHWC) or [N, OH, OW, C, KH, KW] (NCHW).
    int64_t cold[6] = {N, OH, OW, w->nhwc ? KH : C, w->nhwc ? KW : KH, w->nhwc ? C : KW};
    int kh = w->nhwc ? 3 : 4;
    window_expr(h, sizeof h, 1, w->stride[0], kh, w->dilation[0]);
    window_expr(v, sizeof v, 2, w->stride[1], kh + 1, w->dilation[1]);
    if (w->nhwc)
      snprintf(map, sizeof map, "d0, %s, %s, d5", h, v);
    else
      snprintf(map, sizeof map, "d0, d3, %s, %s", h, v);
    jit__gen_operand src = *xp;
    int64_t total = 1;
    for (int d = 0; d < 4; d++) total = xp->dims[d] >= 0 && total >= 0 ? total * xp->dims[d] : -1;
    jit__str flat;
    if (w->nhwc && total >= 0) {  // static: x read flat, as emit_conv_nchw_matmul says why
      int64_t Wp = xp->dims[2], row = Wp * C;
      flat = jit__emit_reshape_to(e, xp->name, dt, 4, xp->dims, 1, &total, false);
      snprintf(map, sizeof map,
               "d0 * %lld + d1 * %lld + d3 * %lld + d2 * %lld + d4 * %lld + d5",
               (long long)(xp->dims[1] * row), (long long)(w->stride[0] * row),
               (long long)(w->dilation[0] * row), (long long)(w->stride[1] * C),
               (long long)(w->dilation[1] * C));
      src = (jit__gen_operand){flat.s, dt, 1, &total, {0}, NULL, NULL};
    }
    jit__str cols = emit_copy(e, &src, map, dt, 6, cold, nhwc_dv);
    a = jit__emit_reshape_dyn(e, cols.s, dt, 6, cold, 2, ad, mdv, false);
  }
  jit__str b;
  if (w->nhwc) {
    b = jit__emit_reshape_to(e, wt->name, wt->dt, 4, wt->dims, 2, bd, false);
  } else {
    int64_t fk[2] = {F, K};
    jit__str wf = jit__emit_reshape_to(e, wt->name, wt->dt, 4, wt->dims, 2, fk, false);
    jit__gen_operand wo = {wf.s, wt->dt, 2, fk, {0}, NULL, NULL};
    b = emit_copy(e, &wo, "d1, d0", wt->dt, 2, bd, NULL);
  }
  // f16: A extended to f32 first, as emit_matmul.c does for the strategy's row tiles.
  jit__dtype a_dt = dt;
  if (jit__dtype_is_half(dt)) {
    a = jit__emit_convert(e, a.s, dt, JIT__F32, 2, ad, mdv, false);
    a_dt = JIT__F32;
  }
  jit__str acc = jit__emit_filled_acc(e, "0.0", 2, cd, mdv);
  jit__str mm = jit__value_name(e, false);
  jit__str acc_ty = jit__tensor_type(JIT__F32, 2, cd);
  jit__text_printf(&e->tb, "  %s = linalg.matmul ins(%s, %s : %s, %s) outs(%s : %s) -> %s\n",
                   mm.s, a.s, b.s, jit__tensor_type(a_dt, 2, ad).s,
                   jit__tensor_type(wt->dt, 2, bd).s, acc.s, acc_ty.s, acc_ty.s);
  jit__str r;
  if (w->nhwc) {
    jit__str c = jit__dtype_is_half(n->dtype) ? jit__emit_f16_result(e, mm.s, 2, cd, mdv, false)
                                              : mm;
    r = jit__emit_reshape_dyn(e, c.s, n->dtype, 2, cd, 4, od, odv, false);
  } else {
    jit__str c = jit__emit_reshape_dyn(e, mm.s, JIT__F32, 2, cd, 4, nhwc, nhwc_dv, false);
    jit__gen_operand co = {c.s, JIT__F32, 4, nhwc, {0}, NULL, NULL};
    r = emit_copy(e, &co, "d0, d2, d3, d1", n->dtype, 4, od, odv);
  }
  set_value(e, r.s);
  return NULL;
}

static jit_status emit_conv(jit__emitter *e, const jit__node *n, geom *g) {
  const jit__window *w = &n->win;
  jit__gen_operand x = jit__node_operand(e, n->operands[0]);
  jit__gen_operand wt = jit__node_operand(e, n->operands[1]);
  const int64_t *wd = wt.dims;
  int64_t f = w->nhwc ? wd[3] : wd[0], cg = w->nhwc ? wd[2] : wd[1];
  int G = w->groups;
  g->k[0] = (int)(w->nhwc ? wd[0] : wd[2]);
  g->k[1] = (int)(w->nhwc ? wd[1] : wd[3]);
  jit__str pname;
  int64_t images = jit__conv_winograd_images(e, n, wd);
  if (images > 0) {
    // Tiles of m output rows read m (tH + 1) rows of x: an OH that is not a multiple
    // of m gets zero rows below, and m = 4 two more (the view's last tile).
    int64_t oh = n->dims[2], m = jit__conv_winograd_rows(oh), th = (oh + m - 1) / m;
    jit__node rows = *n;
    rows.win.pad[1] += (int)(m * (th + 1) - 2 - oh);
    geom gw = *g;
    gw.n = &rows;
    jit__gen_operand xp = emit_pad(e, &x, &gw, "0.0", &pname);
    set_value(e, jit__emit_conv_winograd(e, n, &xp, &wt, images).s);
    return NULL;
  }
  jit__gen_operand xp = emit_pad(e, &x, g, "0.0", &pname);
  result_dims(e, &x, g);
  if (e->opt->conv_as_matmul && G == 1) return emit_conv_matmul(e, n, g, &xp, &wt);
  const jit__dimval *dv = e->dv[e->cur];
  // The accumulator: the result's dims, with F split into [G, F/G] when grouped.
  int rank = G > 1 ? 5 : 4;
  int64_t adims[5];
  jit__dimval adv[5];
  memset(adv, 0, sizeof adv);
  for (int d = 0, a = 0; d < 4; d++, a++) {
    if (G > 1 && d == g->cd) {
      adims[a] = G;
      adims[++a] = f / G;
      continue;
    }
    adims[a] = n->dims[d];
    adv[a] = dv[d];
  }
  jit__str acc = jit__emit_filled_acc(e, "0.0", rank, adims, adv);
  // Loops: the accumulator's dims in order, then the reductions.
  char xm[160], wm[160], h[64], wv[64];
  int nl;
  if (!w->nhwc) {
    int oh = rank - 2, red = rank;  // (n, [g,] f, oh, ow | c, kh, kw)
    window_expr(h, sizeof h, oh, w->stride[0], red + 1, w->dilation[0]);
    window_expr(wv, sizeof wv, oh + 1, w->stride[1], red + 2, w->dilation[1]);
    if (G > 1) {
      snprintf(xm, sizeof xm, "d0, d1 * %lld + d%d, %s, %s", (long long)cg, red, h, wv);
      snprintf(wm, sizeof wm, "d1 * %lld + d2, d%d, d%d, d%d", (long long)(f / G), red,
               red + 1, red + 2);
    } else {
      snprintf(xm, sizeof xm, "d0, d%d, %s, %s", red, h, wv);
      snprintf(wm, sizeof wm, "d1, d%d, d%d, d%d", red, red + 1, red + 2);
    }
  } else {
    int red = rank;  // (n, oh, ow, [g,] f | kh, kw, c)
    window_expr(h, sizeof h, 1, w->stride[0], red, w->dilation[0]);
    window_expr(wv, sizeof wv, 2, w->stride[1], red + 1, w->dilation[1]);
    if (G > 1) {
      snprintf(xm, sizeof xm, "d0, %s, %s, d3 * %lld + d%d", h, wv, (long long)cg, red + 2);
      snprintf(wm, sizeof wm, "d%d, d%d, d%d, d3 * %lld + d4", red, red + 1, red + 2,
               (long long)(f / G));
    } else {
      snprintf(xm, sizeof xm, "d0, %s, %s, d%d", h, wv, red + 2);
      snprintf(wm, sizeof wm, "d%d, d%d, d%d, d3", red, red + 1, red + 2);
    }
  }
  nl = rank + 3;
  xp.affine = xm;
  wt.affine = wm;
  jit__gen_operand ins[2] = {xp, wt};
  jit__gen_operand out = {acc.s, JIT__F32, rank, adims, {0}, adv, NULL};
  jit__identity_map(&out);
  char iters[16];
  memset(iters, 'p', sizeof iters);
  memset(iters + rank, 'r', 3);
  jit__str sum = jit__value_name(e, false);
  jit__emit_generic(e, sum.s, nl, iters, ins, 2, &out, JIT__B_ACC_MAC, NULL);
  jit__str r = finish(e, sum.s, rank, adims, adv, JIT__B_COPY, NULL);
  if (G > 1) {
    jit__str c = jit__value_name(e, false);
    jit__text_printf(&e->tb, "  %s = tensor.collapse_shape %s [%s] : %s into %s\n", c.s, r.s,
                     w->nhwc ? "[0], [1], [2], [3, 4]" : "[0], [1, 2], [3], [4]",
                     jit__tensor_type(n->dtype, 5, adims).s,
                     jit__tensor_type(n->dtype, 4, n->dims).s);
    r = c;
  }
  set_value(e, r.s);
  return NULL;
}

// The avg pool's divisor without count_include_pad: per output position, the window's
// rows inside x times its columns, from linalg.index; the division writes n's dtype.
static jit__str divide_by_count(jit__emitter *e, const geom *g, const jit__gen_operand *x,
                                const char *acc) {
  const jit__node *n = g->n;
  const jit__window *w = &n->win;
  const jit__dimval *dv = e->dv[e->cur];
  jit__str empty = jit__value_name(e, false), res = jit__value_name(e, false);
  jit__emit_empty(e, empty.s, n->dtype, 4, n->dims, dv);
  jit__str ty = jit__tensor_type(n->dtype, 4, n->dims);
  jit__text *tb = &e->tb;
  jit__text_printf(tb,
                   "  %s = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> "
                   "(d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], "
                   "iterator_types = [\"parallel\", \"parallel\", \"parallel\", "
                   "\"parallel\"]} ins(%s : %s) outs(%s : %s) {\n"
                   "  ^bb0(%%in0: f32, %%out: %s):\n"
                   "    %%wz = arith.constant 0 : index\n",
                   res.s, acc, jit__tensor_type(JIT__F32, 4, n->dims).s, empty.s, ty.s,
                   elem(n->dtype));
  for (int s = 0; s < 2; s++) {
    int d = g->hd + s;
    // rows = min(start + k, size) - max(start, 0), start = o * stride - pad_lo, in
    // signed index arithmetic.
    jit__text_printf(tb,
                     "    %%wo%d = linalg.index %d : index\n"
                     "    %%wst%d = arith.constant %d : index\n"
                     "    %%wlo%d = arith.constant %d : index\n"
                     "    %%wk%d = arith.constant %d : index\n",
                     s, d, s, w->stride[s], s, w->pad[2 * s], s, g->k[s]);
    if (x->dims[d] >= 0)
      jit__text_printf(tb, "    %%wn%d = arith.constant %lld : index\n", s,
                       (long long)x->dims[d]);
    jit__text_printf(tb,
                     "    %%wa%d = arith.muli %%wo%d, %%wst%d : index\n"
                     "    %%wb%d = arith.subi %%wa%d, %%wlo%d : index\n"
                     "    %%we%d = arith.addi %%wb%d, %%wk%d : index\n"
                     "    %%wm%d = arith.minsi %%we%d, %s%s : index\n"
                     "    %%ws%d = arith.maxsi %%wb%d, %%wz : index\n"
                     "    %%wc%d = arith.subi %%wm%d, %%ws%d : index\n",
                     s, s, s, s, s, s, s, s, s, s, s, x->dims[d] >= 0 ? "%wn" : x->dv[d].s,
                     x->dims[d] >= 0 ? (s ? "1" : "0") : "", s, s, s, s, s);
  }
  jit__text_printf(tb,
                   "    %%wcnt = arith.muli %%wc0, %%wc1 : index\n"
                   "    %%wci = arith.index_cast %%wcnt : index to i32\n"
                   "    %%wcf = arith.sitofp %%wci : i32 to f32\n"
                   "    %%wq = arith.divf %%in0, %%wcf : f32\n");
  const char *r = "%wq";
  if (jit__dtype_is_half(n->dtype)) {
    jit__text_printf(tb, "    %%wy = arith.truncf %%wq : f32 to f16\n");
    r = "%wy";
  }
  jit__text_printf(tb, "    linalg.yield %s : %s\n  } -> %s\n", r, elem(n->dtype), ty.s);
  return res;
}

static jit_status emit_pool(jit__emitter *e, const jit__node *n, geom *g) {
  const jit__window *w = &n->win;
  bool max = n->op == JIT__OP_MAX_POOL2D;
  jit__gen_operand x = jit__node_operand(e, n->operands[0]);
  g->k[0] = w->kernel[0];
  g->k[1] = w->kernel[1];
  jit__str ninf = jit__float_literal(-INFINITY, x.dt);
  jit__str pname;
  jit__gen_operand xp = emit_pad(e, &x, g, max ? ninf.s : "0.0", &pname);
  result_dims(e, &x, g);
  const jit__dimval *dv = e->dv[e->cur];
  jit__str acc = jit__emit_filled_acc(e, max ? "0xFF800000" : "0.0", 4, n->dims, dv);
  // The window operand: only its shape is used.
  jit__str win = jit__value_name(e, false);
  int64_t kd[2] = {g->k[0], g->k[1]};
  jit__emit_empty(e, win.s, JIT__F32, 2, kd, NULL);
  char xm[160], h[64], wv[64], km[32];
  window_expr(h, sizeof h, 2 - (w->nhwc ? 1 : 0), w->stride[0], 4, w->dilation[0]);
  window_expr(wv, sizeof wv, 3 - (w->nhwc ? 1 : 0), w->stride[1], 5, w->dilation[1]);
  // Loops (n, c, oh, ow | kh, kw); NHWC (n, oh, ow, c | kh, kw).
  if (w->nhwc)
    snprintf(xm, sizeof xm, "d0, %s, %s, d3", h, wv);
  else
    snprintf(xm, sizeof xm, "d0, d1, %s, %s", h, wv);
  snprintf(km, sizeof km, "d4, d5");
  xp.affine = xm;
  jit__gen_operand kw = {win.s, JIT__F32, 2, kd, {0}, NULL, km};
  jit__gen_operand ins[2] = {xp, kw};
  jit__gen_operand out = {acc.s, JIT__F32, 4, n->dims, {0}, dv, NULL};
  jit__identity_map(&out);
  jit__str red = jit__value_name(e, false);
  // The body reads x only (input 0): ACC_MAX / ACC_SUM take x and the accumulator.
  jit__emit_generic(e, red.s, 6, "pppprr", ins, 2, &out,
                    max ? JIT__B_ACC_MAX : JIT__B_ACC_SUM, NULL);
  jit__str r;
  if (max) {
    r = finish(e, red.s, 4, n->dims, dv, JIT__B_COPY, NULL);
  } else if (w->count_pad) {
    jit__str by = jit__float_literal((double)g->k[0] * g->k[1], JIT__F32);
    r = finish(e, red.s, 4, n->dims, dv, JIT__B_DIV_BY, by.s);
  } else {
    r = divide_by_count(e, g, &x, red.s);
  }
  set_value(e, r.s);
  return NULL;
}

jit_status jit__emit_window(jit__emitter *e, const jit__node *n) {
  const jit__node *x = &e->g->nodes[n->operands[0]];
  if (x->rank != 4 || n->rank != 4) return jit__node_error(e, "window op on a rank other than 4");
  geom g = {.n = n, .hd = n->win.nhwc ? 1 : 2, .cd = n->win.nhwc ? 3 : 1};
  if (x->dims[g.cd] < 0) return jit__node_error(e, "window op with a `?` channel dim");
  if (n->op == JIT__OP_CONV2D) {
    const jit__node *w = &e->g->nodes[n->operands[1]];
    for (int d = 0; d < w->rank; d++)
      if (w->dims[d] < 0) return jit__node_error(e, "conv2d with a `?` weight dim");
    if (w->rank != 4 || n->win.groups < 1) return jit__node_error(e, "conv2d weight");
    return emit_conv(e, n, &g);
  }
  return emit_pool(e, n, &g);
}
