//===--- emit_winograd.c - 3x3 convolutions as Winograd F(m, 3) over rows ---===//
//
// Exact NCHW convolutions with a 3x3 kernel, stride 1 and no dilation (ResNet's), on
// the CPU: Winograd's F(m, 3) along the output rows and a shifted read along the
// columns, so that m output rows take (m + 2) x 3 products per column where the
// im2col matmul takes m x 9, and nothing is copied into columns. m = 4 (4.5 products
// an output against 9) where its tiles of 4 rows waste no more than pairs would
// (jit__conv_winograd_rows), else m = 2 (6 an output).
//
// With x padded to [N, C, Hp, Wp] (Hp = m (tH + 1) rows for tH = ceil(OH / m) tiles of
// output rows: zero rows below where OH is not a multiple of m, and with m = 4 two
// more for the view) and q = (n, t, w) flattened, Q = N tH Wp of them (a = m + 2):
//   rows     U[i, c, q]  = (B^T d)_i over x's rows m t .. m t + m + 1 (a generic per
//            i; the rows come from a slices of x viewed as [N, C, tH + 1, m, Wp]);
//   filters  V[kw, i, f, c] = (G g)_i over the weight's three rows, per column kw;
//   product  M[i, f, q]  = sum_kw V[kw, i] U[i, :, q + kw] (three batched matmuls over
//            i into one accumulator; B a shifted slice of U, so no copy: an output at
//            w < OW reads U at w + kw <= OW + 1 < Wp, inside its own row, and the last
//            two q, whose reads would pass U's end, are columns w >= OW left out);
//   output   y[n, f, h, w] = (A^T m)_o at t = h / m, o = h mod m, for h < OH and
//            w < OW (one generic over y's own loops, o from linalg.index, which the
//            bias, residual and relu after the convolution fuse into).
// F(2, 3): B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1], G = [1 0 0; .5 .5 .5;
// .5 -.5 .5; 0 0 1], A^T = [1 1 1 0; 0 1 -1 -1]: additions and halvings, so the f32
// result stays within a few ulps of the direct sum.
// F(4, 3): the points 0, 1, -1, 1/2, -2 (and infinity), which round less than the
// usual 0, +-1, +-2 (in the tests' sums the largest error went 2.7e-5 -> 1.5e-5),
// B^T's rows scaled to small integers (their factors moved into G):
// B^T = [2 -3 -4 3 2 0; 0 -2 1 5 2 0; 0 -2 5 -1 -2 0; 0 2 1 -2 -1 0; 0 1 -2 -1 2 0;
// 0 2 -3 -4 3 2], G = [1/2 0 0; 1/6 1/6 1/6; 1/6 -1/6 1/6; 16/15 8/15 4/15; 1/30 -1/15
// 2/15; 0 0 1/2], A^T = [1 1 1 1 1 0; 0 1 -1 1/2 -2 0; 0 1 1 1/4 4 0; 0 1 -1 1/8 -8 1].
// Its results differ from the direct sum by up to ~3x F(2, 3)'s (1.5e-5 over 144-term
// sums of values in [-1, 1], F(2, 3) ~5e-6), as any F(4, 3) does. All in f32; f16
// and bf16 in and out are converted in the first and last generics. U and M are sized
// for L2: where the batch's do not fit and one image's do, the images go one at a time
// (emit_images).
//
//===----------------------------------------------------------------------===//
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/text.h"
#include "lowering/emit.h"
#include "lowering/lower.h"

// Body text: fmt's '#' become `sfx` (the result's name), for the body's values are
// in the function's scope and must not meet another generic's.
static void bodyf(jit__emitter *e, const char *sfx, const char *fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  for (const char *c = buf; *c; c++) {
    if (*c == '#')
      jit__text_printf(&e->tb, "_%s", sfx);
    else
      jit__text_append(&e->tb, c, 1);
  }
}

// Output rows per tile, m of F(m, 3): 4 (6 transformed rows per 4 output rows: 4.5
// products per output row and column) or 2 (4 per 2: 6), whichever takes fewer
// transformed rows over OH (2 on a tie: its transforms are cheaper).
int jit__conv_winograd_rows(int64_t oh) {
  return 6 * ((oh + 3) / 4) < 4 * ((oh + 1) / 2) ? 4 : 2;
}

// Bytes of the larger of Winograd's U [m + 2, C, Q] and M [m + 2, F, Q] (f32, Q =
// N tH Wp) for a 3x3 stride-1 convolution of N images, C channels and F filters to
// OH x OW.
static int64_t winograd_bytes(int64_t n, int64_t c, int64_t f, int64_t oh, int64_t ow) {
  int m = jit__conv_winograd_rows(oh);
  int64_t q = n * ((oh + m - 1) / m) * (ow + 2);  // N tH Wp
  return (m + 2) * (c > f ? c : f) * q * 4;
}

#define JIT__WINOGRAD_MIN_BYTES (2 << 20)

int64_t jit__conv_winograd_images(const jit__emitter *e, const jit__node *n, const int64_t *wd) {
  const jit__window *w = &n->win;
  if (!e->opt || e->opt->conv_winograd_bytes <= 0 || !e->opt->conv_as_matmul ||
      e->symbolic || w->nhwc || w->groups != 1)
    return 0;
  if (wd[2] != 3 || wd[3] != 3 || w->stride[0] != 1 || w->stride[1] != 1 ||
      w->dilation[0] != 1 || w->dilation[1] != 1)
    return 0;
  // Few channels or few output positions (ResNet's 14x14): the transforms' passes,
  // the weight's above all, cost more than the products they save.
  int64_t F = wd[0], C = wd[1], OH = n->dims[2], OW = n->dims[3];
  if (!(C >= 16 && F >= 16 && OH >= 2 && OW >= 4 && OH * OW >= 784)) return 0;
  // And U [4, C, Q] and M [4, F, Q] (f32) within the budget (the host's L2): each of the
  // three products per column kw reads U and adds into all of M, so past L2 those
  // passes go to memory. ResNet's 64 -> 64 at 56x56 on the Xeon (2 MiB of L2), the
  // basic block at 1 / 2 threads: N = 1 (1.6 MiB) 3.54 / 2.01 ms against im2col's
  // 3.83 / 2.20; N = 2 (3.2 MiB) 11.2 / 6.25 ms against 8.3 / 4.17; N = 8 39.9 / 19.6
  // against 34.0 / 17.4. Where one image fits and the batch does not, the images go
  // one at a time (jit__emit_conv_winograd).
  // The budget is at least 2 MiB: on a Zen 4 (1 MiB of L2, a fast L3) F(4, 3) past
  // L2 still won, 1 thread, 64 -> 64 at N = 1: 56x56 (1.2 MiB) 1.34 against im2col's
  // 2.25 ms, 64x64 (1.6 MiB) 1.82 against 2.94, 72x72 (2 MiB) 2.57 against 3.91, 88x88
  // (3 MiB) 4.06 against 6.73; N = 8 at 56x56 one image at a time 12.6 against 20.6 ms
  // (2 threads 5.96 against 10.4). Not raised past 2 MiB: the Xeon's numbers above.
  int64_t N = n->dims[0], budget = e->opt->conv_winograd_bytes;
  if (budget < JIT__WINOGRAD_MIN_BYTES) budget = JIT__WINOGRAD_MIN_BYTES;
  if (winograd_bytes(N, C, F, OH, OW) <= budget) return N;
  return winograd_bytes(1, C, F, OH, OW) <= budget ? 1 : 0;
}

// An extract_slice of `x` (type xt) at `offs` with `sizes` (all strides 1) into `to`.
static jit__str slice(jit__emitter *e, const char *x, const char *xt, int rank,
                      const int64_t *offs, const int64_t *sizes, const char *to) {
  jit__str r = jit__value_name(e, false);
  jit__text *tb = &e->tb;
  jit__text_printf(tb, "  %s = tensor.extract_slice %s[", r.s, x);
  for (int d = 0; d < rank; d++) jit__text_printf(tb, "%s%lld", d ? ", " : "", (long long)offs[d]);
  jit__text_printf(tb, "] [");
  for (int d = 0; d < rank; d++) jit__text_printf(tb, "%s%lld", d ? ", " : "", (long long)sizes[d]);
  jit__text_printf(tb, "] [");
  for (int d = 0; d < rank; d++) jit__text_printf(tb, "%s1", d ? ", " : "");
  jit__text_printf(tb, "] : %s to %s\n", xt, to);
  return r;
}

// Yields, as `dt`, sum_j k[o][j] v[j] over the n values v, o (one of n_o) from
// `linalg.index dim` (modulo `mod` where > 0): each coefficient is selected by o
// before the products, so an element takes n products whatever n_o (the loops inside
// o's hoist the selects), where the sums of every o selected after took ~20 ops.
static void body_coef_sum(jit__emitter *e, const char *sfx, int dim, int mod, int n_o,
                          const double (*k)[6], int n, char v[][8], jit__dtype dt,
                          const char *res_ty) {
  bodyf(e, sfx, "    %%wi# = linalg.index %d : index\n", dim);
  const char *o = "%wi#";
  if (mod > 0) {
    bodyf(e, sfx, "    %%wn# = arith.constant %d : index\n"
                  "    %%wo# = arith.remui %%wi#, %%wn# : index\n", mod);
    o = "%wo#";
  }
  for (int r = 1; r < n_o; r++)
    bodyf(e, sfx,
          "    %%wk%d# = arith.constant %d : index\n"
          "    %%we%d# = arith.cmpi eq, %s, %%wk%d# : index\n",
          r, r, r, o, r);
  for (int j = 0; j < n; j++) {
    for (int r = 0; r < n_o; r++) {
      bodyf(e, sfx, "    %%q%d_%d# = arith.constant %.17e : f32\n", j, r, k[r][j]);
      if (r)
        bodyf(e, sfx, "    %%c%d_%d# = arith.select %%we%d#, %%q%d_%d#, %%%c%d_%d# : f32\n",
              j, r, r, j, r, r == 1 ? 'q' : 'c', j, r - 1);
    }
    bodyf(e, sfx, "    %%t%d# = arith.mulf %%%c%d_%d#, %s : f32\n", j, n_o > 1 ? 'c' : 'q',
          j, n_o - 1, v[j]);
    if (j == 1) bodyf(e, sfx, "    %%s1# = arith.addf %%t0#, %%t1# : f32\n");
    if (j > 1) bodyf(e, sfx, "    %%s%d# = arith.addf %%s%d#, %%t%d# : f32\n", j, j - 1, j);
  }
  char res[16];
  snprintf(res, sizeof res, n > 1 ? "%%s%d#" : "%%t0#", n - 1);
  if (jit__dtype_is_half(dt)) {
    bodyf(e, sfx, "    %%wy# = arith.truncf %s : f32 to %s\n", res, jit__dtype_str(dt));
    snprintf(res, sizeof res, "%%wy#");
  }
  bodyf(e, sfx, "    linalg.yield %s : %s\n  } -> %s\n", res, jit__dtype_str(dt), res_ty);
}

// The head of a transform: a generic over the loops of its new result (`dt`, dims),
// split across the threads (`jit_split`); returns the result's name.
static jit__str open_transform(jit__emitter *e, jit__dtype dt, int rank, const int64_t *dims,
                               const jit__gen_operand *ins, int n_in) {
  jit__str empty = jit__value_name(e, false), res = jit__value_name(e, false);
  jit__emit_empty(e, empty.s, dt, rank, dims, NULL);
  jit__gen_operand out = {empty.s, dt, rank, dims, {0}, NULL, NULL};
  jit__identity_map(&out);
  e->split_next = true;
  jit__emit_generic_open(e, res.s, rank, "ppppp", ins, n_in, &out);
  return res;
}


// B^T's rows: F(2, 3)'s, and F(4, 3)'s for the points 0, 1, -1, 1/2, -2 scaled to
// integers (see the top).
static const int kBt2[4][6] = {{1, 0, -1, 0}, {0, 1, 1, 0}, {0, -1, 1, 0}, {0, 1, 0, -1}};
static const int kBt4[6][6] = {{2, -3, -4, 3, 2, 0}, {0, -2, 1, 5, 2, 0},
                               {0, -2, 5, -1, -2, 0}, {0, 2, 1, -2, -1, 0},
                               {0, 1, -2, -1, 2, 0}, {0, 2, -3, -4, 3, 2}};

// Body text of sum_j k[j] v[j] over the n values v (k small integers, some of them
// positive), starting from a positive term; its value's name into acc.
static void body_dot(jit__emitter *e, const char *sfx, const int *k, int n, char v[][8],
                     char acc[16]) {
  acc[0] = 0;
  int first = 0;
  while (first < n && k[first] <= 0) first++;
  for (int t = 0; t < n; t++) {
    int j = (first + t) % n, c = k[j] < 0 ? -k[j] : k[j];
    if (!c) continue;
    char term[16];
    if (c == 1) {
      snprintf(term, sizeof term, "%s", v[j]);
    } else {
      bodyf(e, sfx, "    %%k%d# = arith.constant %d.0 : f32\n"
                    "    %%m%d# = arith.mulf %%k%d#, %s : f32\n", j, c, j, j, v[j]);
      snprintf(term, sizeof term, "%%m%d#", j);
    }
    if (!acc[0]) {
      snprintf(acc, 16, "%s", term);
      continue;
    }
    bodyf(e, sfx, "    %%s%d# = arith.%s %s, %s : f32\n", j, k[j] < 0 ? "subf" : "addf", acc,
          term);
    snprintf(acc, 16, "%%s%d#", j);
  }
}

// U [m + 2, C, N, tH, Wp] from the padded x (rows of B^T d), or from `x5`, x already
// viewed as [N, C, tH + 1, m, Wp] (an image's slice of that view of the batch: a
// reshape of the image's slice itself would copy it). One generic per row i of B^T
// over loops (c, n, t, w), written into U[i]: one that made all m + 2 rows computed
// every row's sum for each element and selected one (F(4, 3): ~35 ops an element
// against ~9; ResNet's 3x3 at 56x56, one thread, 0.15 ms of a 1.24 ms convolution).
static jit__str emit_rows(jit__emitter *e, const jit__gen_operand *xp, int m, int64_t tH,
                          const char *x5) {
  int64_t N = xp->dims[0], C = xp->dims[1], Wp = xp->dims[3];
  int a = m + 2;
  jit__dtype dt = xp->dt;
  int64_t xd[5] = {N, C, tH + 1, m, Wp}, sd[4] = {N, C, tH, Wp}, ud[5] = {a, C, N, tH, Wp};
  int64_t id[4] = {C, N, tH, Wp};
  jit__str xr;
  if (x5)
    snprintf(xr.s, sizeof xr.s, "%s", x5);
  else
    xr = jit__emit_reshape_to(e, xp->name, dt, 4, xp->dims, 5, xd, false);
  jit__str xt = jit__tensor_type(dt, 5, xd), st = jit__tensor_type(dt, 4, sd);
  jit__str ut = jit__tensor_type(JIT__F32, 5, ud), it = jit__tensor_type(JIT__F32, 4, id);
  jit__str rows[6];  // x's rows m t .. m t + m + 1
  for (int r = 0; r < a; r++) {
    int64_t offs[5] = {0, 0, r / m, r % m, 0}, sizes[5] = {N, C, tH, 1, Wp};
    rows[r] = slice(e, xr.s, xt.s, 5, offs, sizes, st.s);
  }
  jit__str u = jit__value_name(e, false);
  jit__emit_empty(e, u.s, JIT__F32, 5, ud, NULL);
  for (int i = 0; i < a; i++) {
    const int *k = m == 2 ? kBt2[i] : kBt4[i];
    jit__gen_operand ins[6];
    int n_in = 0;
    char v[6][8];
    for (int r = 0; r < a; r++) {
      if (!k[r]) continue;
      ins[n_in] = (jit__gen_operand){rows[r].s, dt, 4, sd, {1, 0, 2, 3}, NULL, NULL};
      snprintf(v[r], sizeof v[r], "%%in%d", n_in++);
    }
    jit__str ui = open_transform(e, JIT__F32, 4, id, ins, n_in);
    const char *sfx = ui.s + 1;
    for (int r = 0; r < a; r++) {  // f16 / bf16 rows as f32
      if (!k[r] || !jit__dtype_is_half(dt)) continue;
      bodyf(e, sfx, "    %%x%d# = arith.extf %s : %s to f32\n", r, v[r], jit__dtype_str(dt));
      snprintf(v[r], sizeof v[r], "%%x%d#", r);
    }
    char r[16];
    body_dot(e, sfx, k, a, v, r);
    bodyf(e, sfx, "    linalg.yield %s : f32\n  } -> %s\n", r, it.s);
    jit__str next = jit__value_name(e, false);
    jit__text_printf(&e->tb,
                     "  %s = tensor.insert_slice %s into %s[%d, 0, 0, 0, 0] [1, %lld, %lld, "
                     "%lld, %lld] [1, 1, 1, 1, 1] : %s into %s\n",
                     next.s, ui.s, u.s, i, (long long)C, (long long)N, (long long)tH,
                     (long long)Wp, it.s, ut.s);
    u = next;
  }
  return u;
}

// V [3, m + 2, F, C] from the weight [F, C, 3, 3] (rows of G g, per column kw).
static jit__str emit_filters(jit__emitter *e, const jit__gen_operand *wt, int m) {
  int64_t F = wt->dims[0], C = wt->dims[1], vd[4] = {3, m + 2, F, C};
  // The weight's taps first ([F C, 9] transposed, which the strategy does in
  // registers), so that the transform reads rows of (f, c) rather than every ninth
  // element (a 256 x 256 weight: 0.74 ms read with stride 9).
  // In f32 (f16 and bf16 widened on the way), so that the strategy transposes f32
  // tiles in registers for every dtype (it does not transpose bf16 tiles: plan_rows.c).
  int64_t w2[2] = {F * C, 9}, t2[2] = {9, F * C}, t4[4] = {3, 3, F, C}, sd[3] = {3, F, C};
  jit__str wf = jit__emit_reshape_to(e, wt->name, wt->dt, 4, wt->dims, 2, w2, false);
  jit__gen_operand tin = {wf.s, wt->dt, 2, w2, {1, 0}, NULL, NULL};
  jit__str te = jit__value_name(e, false), tr = jit__value_name(e, false);
  jit__emit_empty(e, te.s, JIT__F32, 2, t2, NULL);
  jit__gen_operand tout = {te.s, JIT__F32, 2, t2, {0}, NULL, NULL};
  jit__identity_map(&tout);
  e->split_next = true;
  jit__emit_generic(e, tr.s, 2, "pp", &tin, 1, &tout, JIT__B_COPY, NULL);
  jit__str taps = jit__emit_reshape_to(e, tr.s, JIT__F32, 2, t2, 4, t4, false);
  jit__str tt = jit__tensor_type(JIT__F32, 4, t4), st = jit__tensor_type(JIT__F32, 3, sd);
  jit__str rows[3];
  jit__gen_operand ins[3];
  for (int k = 0; k < 3; k++) {
    int64_t offs[4] = {k, 0, 0, 0}, sizes[4] = {1, 3, F, C};
    rows[k] = slice(e, taps.s, tt.s, 4, offs, sizes, st.s);
    ins[k] = (jit__gen_operand){rows[k].s, JIT__F32, 3, sd, {0, 2, 3}, NULL, NULL};
  }
  jit__str v = open_transform(e, JIT__F32, 4, vd, ins, 3);
  char g[3][8];
  const char *sfx = v.s + 1;
  for (int k = 0; k < 3; k++) snprintf(g[k], sizeof g[k], "%%in%d", k);  // f32 taps
  // G's rows; F(4, 3)'s divided by the factors that made B^T's integers (see the top).
  static const double kG2[4][6] = {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}};
  static const double kG4[6][6] = {{1.0 / 2, 0, 0},
                                   {1.0 / 6, 1.0 / 6, 1.0 / 6},
                                   {1.0 / 6, -1.0 / 6, 1.0 / 6},
                                   {16.0 / 15, 8.0 / 15, 4.0 / 15},
                                   {1.0 / 30, -1.0 / 15, 2.0 / 15},
                                   {0, 0, 1.0 / 2}};
  body_coef_sum(e, sfx, 1, 0, m + 2, m == 2 ? kG2 : kG4, 3, g, JIT__F32,
                jit__tensor_type(JIT__F32, 4, vd).s);
  return v;
}

// Sum over kw of V[kw] (batched over i) times U's columns [start + kw, start + kw + n):
// M's columns [start, start + n), [a, F, n] (a = m + 2), from a zero accumulator of
// its own.
static jit__str emit_chain(jit__emitter *e, const char *u, const char *v, int64_t a, int64_t C,
                           int64_t F, int64_t Q, int64_t start, int64_t n) {
  int64_t uq[3] = {a, C, Q}, sd[3] = {a, F, n}, vd[4] = {3, a, F, C};
  int64_t ad[3] = {a, F, C}, bd[3] = {a, C, n};
  jit__str st = jit__tensor_type(JIT__F32, 3, sd), at = jit__tensor_type(JIT__F32, 3, ad);
  jit__str bt = jit__tensor_type(JIT__F32, 3, bd), vt = jit__tensor_type(JIT__F32, 4, vd);
  jit__str ut = jit__tensor_type(JIT__F32, 3, uq);
  jit__str s = jit__emit_filled_acc(e, "0.0", 3, sd, NULL);
  for (int kw = 0; kw < 3; kw++) {
    int64_t ao[4] = {kw, 0, 0, 0}, as[4] = {1, a, F, C}, bo[3] = {0, 0, start + kw};
    jit__str va = slice(e, v, vt.s, 4, ao, as, at.s);
    jit__str b = slice(e, u, ut.s, 3, bo, bd, bt.s);
    jit__str mm = jit__value_name(e, false);
    jit__text_printf(&e->tb,
                     "  %s = linalg.batch_matmul ins(%s, %s : %s, %s) outs(%s : %s) -> %s\n",
                     mm.s, va.s, b.s, at.s, bt.s, s.s, st.s, st.s);
    s = mm;
  }
  return s;
}

// `part` [a, F, n] into m [a, F, Q] at column `start`.
static jit__str insert_cols(jit__emitter *e, const char *part, const char *m, int64_t a,
                            int64_t F, int64_t Q, int64_t start, int64_t n) {
  int64_t md[3] = {a, F, Q}, sd[3] = {a, F, n};
  jit__str r = jit__value_name(e, false);
  jit__text_printf(&e->tb,
                   "  %s = tensor.insert_slice %s into %s[0, 0, %lld] [%lld, %lld, %lld] "
                   "[1, 1, 1] : %s into %s\n",
                   r.s, part, m, (long long)start, (long long)a, (long long)F, (long long)n,
                   jit__tensor_type(JIT__F32, 3, sd).s, jit__tensor_type(JIT__F32, 3, md).s);
  return r;
}

// M [a, F, Q]: its first L = Q - 2 columns as emit_chain's products (the last two are
// never read). The strategy runs a column rest that is not whole vectors one column at
// a time, so the columns go as whole register tiles of 32 and one last chain of 16 or
// 32 that ends at L (overlapping the tiles' last columns, which it writes again with
// the same sums).
static jit__str emit_products(jit__emitter *e, const char *u, const char *v, int64_t a,
                              int64_t C, int64_t F, int64_t Q) {
  int64_t L = Q - 2, md[3] = {a, F, Q};
  int64_t whole = L / 32 * 32, rest = L - whole, tail = rest <= 16 ? 16 : 32;
  if (L < 32) whole = 0, rest = tail = L;
  jit__str m = jit__value_name(e, false);
  jit__emit_empty(e, m.s, JIT__F32, 3, md, NULL);
  if (whole)
    m = insert_cols(e, emit_chain(e, u, v, a, C, F, Q, 0, whole).s, m.s, a, F, Q, 0, whole);
  if (rest)
    m = insert_cols(e, emit_chain(e, u, v, a, C, F, Q, L - tail, tail).s, m.s, a, F, Q,
                    L - tail, tail);
  return m;
}

// y [N, F, OH, OW] of `dt` from M [m + 2, F, N, tH, Wp] (A^T m) over loops (n, f, h,
// w) reading M at t = h / m (o = h mod m): a result its consumer's elementwise ops
// fuse into (the threads split its first dim of more than one: f where N = 1). With
// `rows3` (one image) y [F, OH, OW] over loops (f, h, w): emit_images inserts that
// into the batch's result, which eliminate-empty-tensors then has the generic write in
// place.
static jit__str emit_output(jit__emitter *e, const char *m, int tm, jit__dtype dt, int64_t N,
                            int64_t F, int64_t tH, int64_t Wp, int64_t OH, int64_t OW,
                            bool rows3) {
  int a = tm + 2, r = rows3 ? 3 : 4;
  int64_t m5[5] = {a, F, N, tH, Wp}, mq[3] = {a, F, N * tH * Wp};
  int64_t sd4[4] = {F, N, tH, OW}, sd3[3] = {F, tH, OW};
  int64_t yd4[4] = {N, F, OH, OW}, yd3[3] = {F, OH, OW};
  const int64_t *sd = rows3 ? sd3 : sd4, *yd = rows3 ? yd3 : yd4;
  jit__str mr = jit__emit_reshape_to(e, m, JIT__F32, 3, mq, 5, m5, false);
  jit__str mt = jit__tensor_type(JIT__F32, 5, m5), st = jit__tensor_type(JIT__F32, r, sd);
  jit__gen_operand ins[6];
  jit__str parts[6];
  char map[48];
  if (rows3)
    snprintf(map, sizeof map, "d0, d1 floordiv %d, d2", tm);
  else
    snprintf(map, sizeof map, "d1, d0, d2 floordiv %d, d3", tm);
  for (int i = 0; i < a; i++) {
    int64_t offs[5] = {i, 0, 0, 0, 0}, sizes[5] = {1, F, N, tH, OW};
    parts[i] = slice(e, mr.s, mt.s, 5, offs, sizes, st.s);
    ins[i] = (jit__gen_operand){parts[i].s, JIT__F32, r, sd, {0}, NULL, map};
  }
  jit__str y = open_transform(e, dt, r, yd, ins, a);
  const char *sfx = y.s + 1;
  // A^T's rows.
  static const double kAt2[2][6] = {{1, 1, 1, 0}, {0, 1, -1, -1}};
  static const double kAt4[4][6] = {{1, 1, 1, 1, 1, 0},
                                    {0, 1, -1, 0.5, -2, 0},
                                    {0, 1, 1, 0.25, 4, 0},
                                    {0, 1, -1, 0.125, -8, 1}};
  char v[6][8];
  for (int i = 0; i < a; i++) snprintf(v[i], sizeof v[i], "%%in%d", i);
  body_coef_sum(e, sfx, r - 2, tm, tm, tm == 2 ? kAt2 : kAt4, a, v, dt,
                jit__tensor_type(dt, r, yd).s);
  return y;
}

// The convolution of xp's N images (see the top). emit_images passes one image: `x5`
// its view for emit_rows, `vt` the filters' transform (made once, before its loop) and,
// `rows3` (the result [F, OH, OW]).
static jit__str emit_batch(jit__emitter *e, const jit__node *n, const jit__gen_operand *xp,
                           const jit__gen_operand *wt, const char *x5, const char *vt,
                           bool rows3) {
  int64_t N = n->dims[0], F = n->dims[1], OH = n->dims[2], OW = n->dims[3];
  int m = jit__conv_winograd_rows(OH), a = m + 2;
  int64_t C = xp->dims[1], Wp = xp->dims[3], tH = (OH + m - 1) / m, Q = N * tH * Wp;
  jit__str u = emit_rows(e, xp, m, tH, x5);
  int64_t ud[5] = {a, C, N, tH, Wp}, uq[3] = {a, C, Q};
  jit__str uf = jit__emit_reshape_to(e, u.s, JIT__F32, 5, ud, 3, uq, false);
  jit__str v;
  if (vt)
    snprintf(v.s, sizeof v.s, "%s", vt);
  else
    v = emit_filters(e, wt, m);
  jit__str mm = emit_products(e, uf.s, v.s, a, C, F, Q);
  return emit_output(e, mm.s, m, n->dtype, N, F, tH, Wp, OH, OW, rows3);
}

// One image at a time, in an scf.for over the images that carries the result; with
// threads, an scf.forall over equal chunks of the images around it (the strategy plans
// what is inside for one thread), else the threads split each image's passes. ResNet's
// 3x3, 64 channels at 56x56: one image's U and M take 1.6 MiB, eight images' 13 MiB.
static jit__str emit_images(jit__emitter *e, const jit__node *n, const jit__gen_operand *xp,
                            const jit__gen_operand *wt) {
  jit__text *tb = &e->tb;
  const int64_t *od = n->dims, *xd = xp->dims;
  int64_t N = od[0];
  int T = e->opt->forall_threads;
  int64_t chunks = T > 1 && N % T == 0 ? T : 1, per = N / chunks;
  int64_t cd[4] = {per, od[1], od[2], od[3]}, x1[4] = {1, xd[1], xd[2], xd[3]};
  jit__str oty = jit__tensor_type(n->dtype, 4, od), cty = jit__tensor_type(n->dtype, 4, cd);
  jit__str init = jit__value_name(e, false);
  jit__emit_empty(e, init.s, n->dtype, 4, od, NULL);
  jit__str outer = {{0}}, it = {{0}}, n0 = {{0}}, start = init;
  if (chunks > 1) {
    outer = jit__value_name(e, false), it = jit__value_name(e, false);
    n0 = jit__value_name(e, false), start = jit__value_name(e, false);
    jit__str ci = jit__value_name(e, false);
    jit__text_printf(tb,
                     "  %s = scf.forall (%s) in (%lld) shared_outs(%s = %s) -> (%s) {\n"
                     "  %s = affine.apply affine_map<(d0) -> (d0 * %lld)>(%s)\n"
                     "  %s = tensor.extract_slice %s[%s, 0, 0, 0] [%lld, %lld, %lld, %lld] "
                     "[1, 1, 1, 1] : %s to %s\n",
                     outer.s, ci.s, (long long)chunks, it.s, init.s, oty.s, n0.s,
                     (long long)per, ci.s, start.s, it.s, n0.s, (long long)cd[0],
                     (long long)cd[1], (long long)cd[2], (long long)cd[3], oty.s, cty.s);
  }
  // The filters' transform and the batch viewed as [N, C, tH + 1, 2, Wp] once, outside
  // the loops (the transform was not hoisted: made per image, 2 % of the time).
  int m = jit__conv_winograd_rows(od[2]);
  jit__str vt = emit_filters(e, wt, m);
  int64_t tH = (od[2] + m - 1) / m, F = od[1], OH = od[2], OW = od[3];
  int64_t x5d[5] = {N, xd[1], tH + 1, m, xd[3]}, x51[5] = {1, xd[1], tH + 1, m, xd[3]};
  jit__str xall = jit__emit_reshape_to(e, xp->name, xp->dt, 4, xd, 5, x5d, false);
  jit__str lo = jit__emit_index_const(e, 0), hi = jit__emit_index_const(e, per),
           one = jit__emit_index_const(e, 1);
  jit__str loop = jit__value_name(e, false), iv = jit__value_name(e, false),
           acc = jit__value_name(e, false), img = iv;
  jit__text_printf(tb, "  %s = scf.for %s = %s to %s step %s iter_args(%s = %s) -> (%s) {\n",
                   loop.s, iv.s, lo.s, hi.s, one.s, acc.s, start.s, cty.s);
  if (chunks > 1) {
    img = jit__value_name(e, false);
    jit__text_printf(tb, "  %s = arith.addi %s, %s : index\n", img.s, n0.s, iv.s);
  }
  jit__str xs = jit__value_name(e, false);
  jit__text_printf(tb,
                   "  %s = tensor.extract_slice %s[%s, 0, 0, 0, 0] [1, %lld, %lld, %d, %lld] "
                   "[1, 1, 1, 1, 1] : %s to %s\n",
                   xs.s, xall.s, img.s, (long long)xd[1], (long long)(tH + 1), m, (long long)xd[3],
                   jit__tensor_type(xp->dt, 5, x5d).s, jit__tensor_type(xp->dt, 5, x51).s);
  jit__node one_image = *n;
  one_image.dims[0] = 1;
  jit__gen_operand x1op = *xp;
  x1op.dims = x1;
  jit__str y = emit_batch(e, &one_image, &x1op, wt, xs.s, vt.s, true);
  int64_t r3[3] = {F, OH, OW};
  jit__str yty = jit__tensor_type(n->dtype, 3, r3);
  jit__str next = jit__value_name(e, false);
  jit__text_printf(tb,
                   "  %s = tensor.insert_slice %s into %s[%s, 0, 0, 0] [1, %lld, %lld, %lld] "
                   "[1, 1, 1, 1] : %s into %s\n  scf.yield %s : %s\n  }\n",
                   next.s, y.s, acc.s, iv.s, (long long)od[1], (long long)od[2],
                   (long long)od[3], yty.s, cty.s, next.s, cty.s);
  if (chunks == 1) return loop;
  jit__text_printf(tb,
                   "  scf.forall.in_parallel {\n"
                   "    tensor.parallel_insert_slice %s into %s[%s, 0, 0, 0] [%lld, %lld, %lld, "
                   "%lld] [1, 1, 1, 1] : %s into %s\n  }\n  }\n",
                   loop.s, it.s, n0.s, (long long)cd[0], (long long)cd[1], (long long)cd[2],
                   (long long)cd[3], cty.s, oty.s);
  return outer;
}

jit__str jit__emit_conv_winograd(jit__emitter *e, const jit__node *n, const jit__gen_operand *xp,
                                 const jit__gen_operand *wt, int64_t images) {
  return images == n->dims[0] ? emit_batch(e, n, xp, wt, NULL, NULL, false)
                              : emit_images(e, n, xp, wt);
}
