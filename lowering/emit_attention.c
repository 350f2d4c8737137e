//===--- emit_attention.c - scaled dot-product attention ---------------------===//
//
// softmax(q k^T * scale + mask) v, with an optional causal mask (query i sees keys
// j <= i + T - S). Two forms:
//
//   blocked (options->attention_block > 0 and static sizes: the CPU's exact kernels)
//   — an scf.for over blocks of keys carrying, per query row, the running max m, sum
//   l and output o (FlashAttention's online softmax):
//     s  = q' k_blk^T (+ mask; -inf past T and after the causal limit)   q' = q scale
//     m' = max(m, rowmax s);  p = exp(s - m');  a = exp(m - m')
//     l' = l a + rowsum p;    o' = o a + p v_blk
//   then o / l. K (transposed) and V are copied once, padded to whole blocks; each
//   block's products are linalg.batch_matmul, which the CPU strategy plans. Only
//   [B, S, block] scores exist at a time, never [S, T]; where S comes in whole query
//   blocks (and the mask has no batch dims) the loop runs per head and query block
//   (emit_tiled), so a step's scores are [1, 64, block] and stay in L2. A max that is
//   still -inf (every key so far masked) counts as 0 in the exponentials, so such rows
//   add 0. Where a query block's scores over all keys take at most 256 KiB (and, if
//   causal, T is at most two key blocks) there is no key loop: the block's [1, 64, T]
//   scores, a softmax and one p v product (emit_rows), fewer passes than the key
//   loop's per block of keys.
//   composed (otherwise: GPU back ends, generic kernels with `?` sizes) — the scores
//   [..., S, T] in f32, masked, their max, exp, sum, the product with v, the division:
//   linalg.generic ops every back end lowers.
// Both compute in f32 (f16 inputs extended, the result rounded once). A row whose
// every key is masked gives NaN (0 / 0), as PyTorch's does.
//
//===----------------------------------------------------------------------===//
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "base/text.h"
#include "lowering/emit.h"
#include "lowering/lower.h"

static const char kNegInf[] = "0xFF800000";

typedef struct att {
  const jit__node *n;
  jit__gen_operand q, k, v, mask;
  bool has_mask;
  int r, nb;            // rank, batch dims
  int64_t S, D, T, Dv;  // sizes; < 0 for `?`
} att;

// A linalg.generic over `nl` loops (iters) whose body is `fmt` (the block arguments
// are %in0.. and %out; it must define %ay, the f32 result).
static void custom_generic(jit__emitter *e, const char *res, int nl, const char *iters,
                           const jit__gen_operand *ins, int n_in, const jit__gen_operand *out,
                           const char *fmt, ...) {
  jit__emit_generic_open(e, res, nl, iters, ins, n_in, out);
  va_list ap;
  va_start(ap, fmt);
  char body[2048];
  vsnprintf(body, sizeof body, fmt, ap);
  va_end(ap);
  jit__text_printf(&e->tb, "%s    linalg.yield %%ay : f32\n  } -> %s\n", body,
                   jit__tensor_type(out->dt, out->rank, out->dims).s);
}

// The mask value's f32 name in a body reading the mask as input `i`.
static const char *mask_in(jit__emitter *e, const att *a, int i) {
  if (jit__dtype_is_half(a->mask.dt)) {
    jit__text_printf(&e->tb, "    %%amk = arith.extf %%in%d : %s to f32\n", i,
                     jit__dtype_str(a->mask.dt));
    return "%amk";
  }
  return i == 1 ? "%in1" : "%in2";
}

//===--- Composed ----------------------------------------------------------===//

static jit_status emit_composed(jit__emitter *e, const att *a) {
  const jit__node *n = a->n;
  int r = a->r, nb = a->nb;
  int64_t sd[JIT_MAX_RANK], od[JIT_MAX_RANK];
  jit__dimval sdv[JIT_MAX_RANK], odv[JIT_MAX_RANK];
  memset(sdv, 0, sizeof sdv);
  memset(odv, 0, sizeof odv);
  for (int d = 0; d < r; d++) {
    sd[d] = od[d] = a->q.dims[d];
    if (a->q.dv) sdv[d] = odv[d] = a->q.dv[d];
  }
  sd[r - 1] = a->T;
  if (a->k.dv) sdv[r - 1] = a->k.dv[nb];
  od[r - 1] = a->Dv;
  if (a->v.dv) odv[r - 1] = a->v.dv[nb + 1];
  memcpy(e->dv[e->cur], odv, sizeof odv);
  char par[JIT_MAX_RANK + 2];
  memset(par, 'p', sizeof par);
  char red[JIT_MAX_RANK + 2];
  memset(red, 'p', sizeof red);
  red[r] = 'r';
  // Scores: loops (b..., s, t, d).
  jit__gen_operand q = a->q, k = a->k;
  for (int d = 0; d < nb; d++) q.map[d] = k.map[d] = d;
  q.map[nb] = nb, q.map[nb + 1] = nb + 2;
  k.map[nb] = nb + 1, k.map[nb + 1] = nb + 2;
  jit__str acc = jit__emit_filled_acc(e, "0.0", r, sd, sdv), sc = jit__value_name(e, false);
  jit__gen_operand sco = {acc.s, JIT__F32, r, sd, {0}, sdv, NULL};
  jit__identity_map(&sco);
  jit__gen_operand qk[2] = {q, k};
  jit__emit_generic(e, sc.s, r + 1, red, qk, 2, &sco, JIT__B_ACC_MAC, NULL);
  // Scaled, masked: loops (b..., s, t).
  jit__str off = {{0}};
  if (n->causal) {
    jit__str tv = jit__emit_size(e, a->T, a->k.dv ? &a->k.dv[nb] : NULL);
    jit__str sv = jit__emit_size(e, a->S, a->q.dv ? &a->q.dv[nb] : NULL);
    off = jit__value_name(e, false);
    jit__text_printf(&e->tb, "  %s = arith.subi %s, %s : index\n", off.s, tv.s, sv.s);
  }
  jit__gen_operand ins[2] = {{sc.s, JIT__F32, r, sd, {0}, sdv, NULL}, {0}};
  jit__identity_map(&ins[0]);
  int n_in = 1;
  int64_t sq[JIT_MAX_RANK];
  if (a->has_mask) {
    JIT_PROPAGATE(jit__elementwise_operand(e, n->operands[3], r, sd, &ins[1], sq));
    n_in = 2;
  }
  jit__str me = jit__value_name(e, false), ms = jit__value_name(e, false);
  jit__emit_empty(e, me.s, JIT__F32, r, sd, sdv);
  jit__gen_operand mo = {me.s, JIT__F32, r, sd, {0}, sdv, NULL};
  jit__identity_map(&mo);
  jit__emit_generic_open(e, ms.s, r, par, ins, n_in, &mo);
  jit__text_printf(&e->tb, "    %%asc = arith.constant %s : f32\n"
                   "    %%ay = arith.mulf %%in0, %%asc : f32\n",
                   jit__float_literal(n->scalar, JIT__F32).s);
  if (a->has_mask)
    jit__text_printf(&e->tb, "    %%ay1 = arith.addf %%ay, %s : f32\n", mask_in(e, a, 1));
  const char *cur = a->has_mask ? "%ay1" : "%ay";
  if (n->causal) {
    jit__text_printf(&e->tb,
                     "    %%ai = linalg.index %d : index\n"
                     "    %%aj = linalg.index %d : index\n"
                     "    %%alim = arith.addi %%ai, %s : index\n"
                     "    %%aok = arith.cmpi sle, %%aj, %%alim : index\n"
                     "    %%ani = arith.constant %s : f32\n"
                     "    %%ay2 = arith.select %%aok, %s, %%ani : f32\n",
                     nb, nb + 1, off.s, kNegInf, cur);
    cur = "%ay2";
  }
  jit__text_printf(&e->tb, "    linalg.yield %s : f32\n  } -> %s\n", cur,
                   jit__tensor_type(JIT__F32, r, sd).s);
  // Softmax's max, exp and sum over t.
  jit__gen_operand sm = {ms.s, JIT__F32, r, sd, {0}, sdv, NULL};
  jit__identity_map(&sm);
  jit__str mx0 = jit__emit_filled_acc(e, kNegInf, r - 1, sd, sdv), mx = jit__value_name(e, false);
  jit__gen_operand mxo = {mx0.s, JIT__F32, r - 1, sd, {0}, sdv, NULL};
  jit__identity_map(&mxo);
  char rr[JIT_MAX_RANK + 1];
  memset(rr, 'p', sizeof rr);
  rr[r - 1] = 'r';
  jit__emit_generic(e, mx.s, r, rr, &sm, 1, &mxo, JIT__B_ACC_MAX, NULL);
  jit__gen_operand mxi = {mx.s, JIT__F32, r - 1, sd, {0}, sdv, NULL};
  jit__identity_map(&mxi);
  jit__str pe = jit__value_name(e, false), p = jit__value_name(e, false);
  jit__emit_empty(e, pe.s, JIT__F32, r, sd, sdv);
  jit__gen_operand pin[2] = {sm, mxi}, po = {pe.s, JIT__F32, r, sd, {0}, sdv, NULL};
  jit__identity_map(&po);
  jit__emit_generic(e, p.s, r, par, pin, 2, &po, JIT__B_EXP_SUB, NULL);
  jit__gen_operand pp = {p.s, JIT__F32, r, sd, {0}, sdv, NULL};
  jit__identity_map(&pp);
  jit__str su0 = jit__emit_filled_acc(e, "0.0", r - 1, sd, sdv), su = jit__value_name(e, false);
  jit__gen_operand suo = {su0.s, JIT__F32, r - 1, sd, {0}, sdv, NULL};
  jit__identity_map(&suo);
  jit__emit_generic(e, su.s, r, rr, &pp, 1, &suo, JIT__B_ACC_SUM, NULL);
  // p v: loops (b..., s, dv, t).
  jit__gen_operand pv[2] = {pp, a->v};
  for (int d = 0; d < nb; d++) pv[1].map[d] = d;
  pv[0].map[nb] = nb, pv[0].map[nb + 1] = nb + 2;
  pv[1].map[nb] = nb + 2, pv[1].map[nb + 1] = nb + 1;
  jit__str oa = jit__emit_filled_acc(e, "0.0", r, od, odv), o = jit__value_name(e, false);
  jit__gen_operand oo = {oa.s, JIT__F32, r, od, {0}, odv, NULL};
  jit__identity_map(&oo);
  jit__emit_generic(e, o.s, r + 1, red, pv, 2, &oo, JIT__B_ACC_MAC, NULL);
  // o / sum, in n's dtype.
  jit__gen_operand din[2] = {{o.s, JIT__F32, r, od, {0}, odv, NULL},
                             {su.s, JIT__F32, r - 1, sd, {0}, sdv, NULL}};
  jit__identity_map(&din[0]);
  jit__identity_map(&din[1]);
  jit__str fe = jit__value_name(e, false), res = jit__value_name(e, true);
  jit__emit_empty(e, fe.s, n->dtype, r, od, odv);
  jit__gen_operand fo = {fe.s, n->dtype, r, od, {0}, odv, NULL};
  jit__identity_map(&fo);
  jit__emit_generic(e, res.s, r, par, din, 2, &fo, JIT__B_DIV, NULL);
  return NULL;
}

//===--- Blocked -------------------------------------------------------------===//

// `x` [dims] (any rank, static) as [B, a, b] f32 (`b3`), converted from f16 once.
static jit__str as_f32_3d(jit__emitter *e, const jit__gen_operand *x, const int64_t *b3) {
  jit__str v = jit__emit_reshape_to(e, x->name, x->dt, x->rank, x->dims, 3, b3, false);
  if (jit__dtype_is_half(x->dt)) v = jit__emit_convert(e, v.s, x->dt, JIT__F32, 3, b3, NULL, false);
  return v;
}

// The body lines that read the mask (static, any rank broadcasting to [..., S, T]) at
// flattened batch %ab, query %as and key %atc (clamped), into %amv (f32).
static void mask_read(jit__emitter *e, const att *a) {
  const jit__gen_operand *m = &a->mask;
  int r = a->r, off = r - m->rank;
  // Strides of the mask's dims, 0 where a dim broadcasts.
  int64_t stride[JIT_MAX_RANK], st = 1;
  for (int d = m->rank - 1; d >= 0; d--) {
    stride[d] = m->dims[d] == 1 ? 0 : st;
    st *= m->dims[d];
  }
  jit__text *tb = &e->tb;
  jit__text_printf(tb, "    %%amx0 = arith.constant 0 : index\n");
  // The batch coordinates from %ab: b_i = (ab / inner_i) % dim_i.
  int64_t inner = 1;
  char prev[16] = "%amx0";
  for (int d = a->nb - 1; d >= 0; d--) {
    int md = d - off;
    int64_t dim = a->q.dims[d];
    if (md >= 0 && stride[md]) {
      jit__text_printf(tb,
                       "    %%ami%d = arith.constant %lld : index\n"
                       "    %%amd%d = arith.divui %%ab, %%ami%d : index\n"
                       "    %%amn%d = arith.constant %lld : index\n"
                       "    %%amr%d = arith.remui %%amd%d, %%amn%d : index\n"
                       "    %%ams%d = arith.constant %lld : index\n"
                       "    %%amp%d = arith.muli %%amr%d, %%ams%d : index\n"
                       "    %%amx%d = arith.addi %s, %%amp%d : index\n",
                       d + 1, (long long)inner, d + 1, d + 1, d + 1, (long long)dim, d + 1,
                       d + 1, d + 1, d + 1, (long long)stride[md], d + 1, d + 1, d + 1,
                       d + 1, prev, d + 1);
      snprintf(prev, sizeof prev, "%%amx%d", d + 1);
    }
    inner *= dim;
  }
  // Query and key dims.
  const char *idx[2] = {"%as", "%atc"};
  for (int i = 0; i < 2; i++) {
    int md = r - 2 + i - off;
    if (md < 0 || !stride[md]) continue;
    jit__text_printf(tb,
                     "    %%amq%d = arith.constant %lld : index\n"
                     "    %%amu%d = arith.muli %s, %%amq%d : index\n"
                     "    %%amy%d = arith.addi %s, %%amu%d : index\n",
                     i, (long long)stride[md], i, idx[i], i, i, prev, i);
    snprintf(prev, sizeof prev, "%%amy%d", i);
  }
  jit__text_printf(tb, "    %%amv0 = tensor.extract %%v%u_mflat[%s] : tensor<%lldx%s>\n",
                   e->cur, prev, (long long)st, jit__dtype_str(m->dt));
  if (jit__dtype_is_half(m->dt))
    jit__text_printf(tb, "    %%amv = arith.extf %%amv0 : %s to f32\n", jit__dtype_str(m->dt));
  else
    jit__text_printf(tb, "    %%amv = arith.addf %%amv0, %%amz : f32\n");
}

// x [B, T, C] copied into [B, Tp, C] (or, `transposed`, [B, C, Tp]), keys past T
// reading key T - 1 (the blocked loop's last block: their scores are set to -inf).
static jit__str padded_keys(jit__emitter *e, const char *x, const int64_t *xd,
                            const int64_t *pd, bool transposed) {
  jit__str pe = jit__value_name(e, false), p = jit__value_name(e, false);
  jit__emit_empty(e, pe.s, JIT__F32, 3, pd, NULL);
  jit__text_printf(&e->tb,
                   "  %s = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d1, "
                   "d2)>], iterator_types = [\"parallel\", \"parallel\", \"parallel\"]} "
                   "outs(%s : %s) {\n  ^bb0(%%out: f32):\n"
                   "    %%ab = linalg.index 0 : index\n    %%ak1 = linalg.index 1 : index\n"
                   "    %%ak2 = linalg.index 2 : index\n    %%atl = arith.constant %lld : index\n"
                   "    %%atc = arith.minui %s, %%atl : index\n"
                   "    %%ay = tensor.extract %s[%%ab, %%atc, %s] : %s\n"
                   "    linalg.yield %%ay : f32\n  } -> %s\n",
                   p.s, pe.s, jit__tensor_type(JIT__F32, 3, pd).s, (long long)(xd[1] - 1),
                   transposed ? "%ak2" : "%ak1", x, transposed ? "%ak1" : "%ak2",
                   jit__tensor_type(JIT__F32, 3, xd).s, jit__tensor_type(JIT__F32, 3, pd).s);
  return p;
}

// The block's scores before q k^T is added: -inf for keys past T and after the causal
// limit, else the mask (0 without one). The product accumulates into it, so the mask
// costs no pass over the scores and their zero fill none either. `sd` [B, S, block],
// `j` the block's first key, `qoff` (empty: 0) the first query row's.
// With `mblk` (a mask without batch dims: its [S or 1, block or 1] slice, f32) it is an
// input of the generic, read through a map; else the mask is read with tensor.extract
// (mask_read), which does not vectorize.
static jit__str mask_block(jit__emitter *e, const att *a, const int64_t *sd, const char *j,
                           const char *qoff, const char *mblk, const int64_t *mbd) {
  jit__text *tb = &e->tb;
  jit__str se = jit__value_name(e, false), sm = jit__value_name(e, false);
  jit__emit_empty(e, se.s, JIT__F32, 3, sd, NULL);
  jit__gen_operand mi = {mblk, JIT__F32, 2, mbd, {0}, NULL, NULL},
                   so = {se.s, JIT__F32, 3, sd, {0}, NULL, NULL};
  if (mblk) mi.map[0] = mbd[0] == 1 ? -1 : 1, mi.map[1] = mbd[1] == 1 ? -1 : 2;
  jit__identity_map(&so);
  jit__emit_generic_open(e, sm.s, 3, "ppp", &mi, mblk ? 1 : 0, &so);
  jit__text_printf(tb,
                   "    %%ab = linalg.index 0 : index\n    %%as = linalg.index 1 : index\n"
                   "    %%at = linalg.index 2 : index\n    %%atg = arith.addi %s, %%at : index\n"
                   "    %%aT = arith.constant %lld : index\n"
                   "    %%aok0 = arith.cmpi ult, %%atg, %%aT : index\n"
                   "    %%atl = arith.constant %lld : index\n"
                   "    %%atc = arith.minui %%atg, %%atl : index\n"
                   "    %%amz = arith.constant 0.0 : f32\n",
                   j, (long long)a->T, (long long)(a->T - 1));
  if (a->n->causal)
    jit__text_printf(tb,
                     "    %%aoff = arith.constant %lld : index\n"
                     "    %%amz0 = arith.constant 0 : index\n"
                     "    %%asg = arith.addi %%as, %s : index\n"
                     "    %%alim = arith.addi %%asg, %%aoff : index\n"
                     "    %%acz = arith.cmpi sle, %%atg, %%alim : index\n"
                     "    %%aok = arith.andi %%aok0, %%acz : i1\n",
                     (long long)(a->T - a->S), qoff[0] ? qoff : "%amz0");
  else
    jit__text_printf(tb, "    %%aok = arith.andi %%aok0, %%aok0 : i1\n");
  const char *val = "%amz";
  if (mblk) {
    val = "%in0";
  } else if (a->has_mask) {
    mask_read(e, a);
    val = "%amv";
  }
  jit__text_printf(tb,
                   "    %%ani = arith.constant %s : f32\n"
                   "    %%ay = arith.select %%aok, %s, %%ani : f32\n"
                   "    linalg.yield %%ay : f32\n  } -> %s\n",
                   kNegInf, val, jit__tensor_type(JIT__F32, 3, sd).s);
  return sm;
}

// o / l (the loop's results #2 and #1) in n's dtype, back to n's shape.
static jit__str finish_blocked(jit__emitter *e, const jit__node *n, const char *loop,
                           const int64_t *od, const int64_t *rd) {
  char fo[300], fl[300];
  snprintf(fo, sizeof fo, "%s#2", loop);
  snprintf(fl, sizeof fl, "%s#1", loop);
  jit__gen_operand din[2] = {{fo, JIT__F32, 3, od, {0}, NULL, NULL},
                             {fl, JIT__F32, 2, rd, {0}, NULL, NULL}};
  jit__identity_map(&din[0]);
  din[1].map[0] = 0, din[1].map[1] = 1;
  jit__str de = jit__value_name(e, false), dres = jit__value_name(e, false);
  jit__emit_empty(e, de.s, n->dtype, 3, od, NULL);
  jit__gen_operand dout = {de.s, n->dtype, 3, od, {0}, NULL, NULL};
  jit__identity_map(&dout);
  jit__emit_generic(e, dres.s, 3, "ppp", din, 2, &dout, JIT__B_DIV, NULL);
  return dres;
}

// The mask read flat (%v<node>_mflat, for mask_read) and, when it has no batch dims
// ([S or 1, T or 1]), copied once into f32 [S', T' padded to whole blocks] that the
// loop slices per block and reads through a map (vectorized): returned, with its dims
// in mpd and T' in *Tm; else an empty name.
static jit__str prepare_mask(jit__emitter *e, const att *a, int64_t Tp, int64_t mpd[2],
                             int64_t *Tm) {
  jit__text *tb = &e->tb;
  if (a->has_mask) {
    int64_t mn = jit__num_elements(a->mask.rank, a->mask.dims);
    jit__text_printf(tb, "  %%v%u_mshape = arith.constant dense<[%lld]> : tensor<1xi64>\n"
                     "  %%v%u_mflat = tensor.reshape %s(%%v%u_mshape) : (%s, tensor<1xi64>) "
                     "-> tensor<%lldx%s>\n",
                     e->cur, (long long)mn, e->cur, a->mask.name, e->cur,
                     jit__tensor_type(a->mask.dt, a->mask.rank, a->mask.dims).s, (long long)mn,
                     jit__dtype_str(a->mask.dt));
  }
  int mr = a->mask.rank;
  bool fast = a->has_mask;
  for (int d = 0; d + 2 < mr; d++) fast = fast && a->mask.dims[d] == 1;
  mpd[0] = mr >= 2 ? a->mask.dims[mr - 2] : 1;
  mpd[1] = mr >= 1 ? a->mask.dims[mr - 1] : 1;
  *Tm = mpd[1];
  if (*Tm != 1) mpd[1] = Tp;
  jit__str mp = {{0}};
  if (fast) {
    jit__str mpe = jit__value_name(e, false);
    mp = jit__value_name(e, false);
    jit__emit_empty(e, mpe.s, JIT__F32, 2, mpd, NULL);
    jit__text_printf(tb,
                     "  %s = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>], "
                     "iterator_types = [\"parallel\", \"parallel\"]} outs(%s : %s) {\n"
                     "  ^bb0(%%out: f32):\n    %%ps = linalg.index 0 : index\n"
                     "    %%pt = linalg.index 1 : index\n    %%ptl = arith.constant %lld : index\n"
                     "    %%ptc = arith.minui %%pt, %%ptl : index\n"
                     "    %%pw = arith.constant %lld : index\n"
                     "    %%prow = arith.muli %%ps, %%pw : index\n"
                     "    %%pi = arith.addi %%prow, %%ptc : index\n"
                     "    %%pv = tensor.extract %%v%u_mflat[%%pi] : tensor<%lldx%s>\n",
                     mp.s, mpe.s, jit__tensor_type(JIT__F32, 2, mpd).s, (long long)(*Tm - 1),
                     (long long)*Tm, e->cur,
                     (long long)jit__num_elements(a->mask.rank, a->mask.dims),
                     jit__dtype_str(a->mask.dt));
    if (jit__dtype_is_half(a->mask.dt))
      jit__text_printf(tb, "    %%py = arith.extf %%pv : %s to f32\n", jit__dtype_str(a->mask.dt));
    else
      jit__text_printf(tb, "    %%py = arith.maximumf %%pv, %%pv : f32\n");
    jit__text_printf(tb, "    linalg.yield %%py : f32\n  } -> %s\n",
                     jit__tensor_type(JIT__F32, 2, mpd).s);
  }
  return mp;
}

// What the key loop of emit_blocked reads, for B heads (all, or one thread's chunk):
// q' [B, S, D], K^T [B, D, Tp] and V [B, Tp, Dv] (keys padded to whole blocks of
// BK), and the padded mask (prepare_mask: mp, its dims and T').
typedef struct att_blk {
  int64_t B, BK, Tp;
  jit__str qs, kt, vp, mp;
  bool fast;
  int64_t mpd[2], Tm;
  // The loop's query rows: S of them from row `qoff` (an index value; empty: row 0),
  // and its keys up to `kub` (an index value; empty: Tp).
  int64_t S;
  jit__str qoff, kub;
} att_blk;

// [B, S] of `x` [B, S, keys] (f32) reduced along the keys by `kind` from `init`.
static jit__str reduce_rows(jit__emitter *e, const char *x, const int64_t *sd,
                            jit__body_kind kind, const char *init) {
  int64_t rd[2] = {sd[0], sd[1]};
  jit__gen_operand xi = {x, JIT__F32, 3, sd, {0}, NULL, NULL};
  jit__identity_map(&xi);
  jit__str acc = jit__emit_filled_acc(e, init, 2, rd, NULL), r = jit__value_name(e, false);
  jit__gen_operand ao = {acc.s, JIT__F32, 2, rd, {0}, NULL, NULL};
  jit__identity_map(&ao);
  jit__emit_generic(e, r.s, 3, "ppr", &xi, 1, &ao, kind, NULL);
  return r;
}

// The scf.for over blocks of keys (see the top) for k->B heads; returns o / l
// [B, S, Dv] in the node's dtype.
static jit__str emit_key_loop(jit__emitter *e, const att *a, const att_blk *k) {
  const jit__node *n = a->n;
  int64_t B = k->B, S = k->S, D = a->D, Dv = a->Dv, BK = k->BK, Tp = k->Tp, Tm = k->Tm;
  jit__text *tb = &e->tb;
  int64_t qd[3] = {B, S, D}, ktd[3] = {B, D, Tp}, vpd[3] = {B, Tp, Dv};
  int64_t mpd[2] = {k->mpd[0], k->mpd[1]};
  jit__str qs = k->qs, kt = k->kt, vp = k->vp, mp = k->mp;
  bool fast = k->fast;
  // The carried values.
  int64_t rd[2] = {B, S}, od[3] = {B, S, Dv}, sd[3] = {B, S, BK};
  jit__str m0 = jit__emit_filled_acc(e, kNegInf, 2, rd, NULL);
  jit__str l0 = jit__emit_filled_acc(e, "0.0", 2, rd, NULL);
  jit__str o0 = jit__emit_filled_acc(e, "0.0", 3, od, NULL);
  jit__str lo = jit__value_name(e, false), hi = jit__value_name(e, false),
           step = jit__value_name(e, false), loop = jit__value_name(e, false);
  char pre[32];
  snprintf(pre, sizeof pre, "%%v%u_", e->cur);
  jit__str rty = jit__tensor_type(JIT__F32, 2, rd), oty = jit__tensor_type(JIT__F32, 3, od);
  jit__text_printf(tb,
                   "  %s = arith.constant 0 : index\n  %s = arith.constant %lld : index\n"
                   "  %s = arith.constant %lld : index\n"
                   "  %s:3 = scf.for %sj = %s to %s step %s iter_args(%sm = %s, %sl = %s, "
                   "%so = %s) -> (%s, %s, %s) {\n",
                   lo.s, hi.s, (long long)Tp, step.s, (long long)BK, loop.s, pre, lo.s,
                   k->kub.s[0] ? k->kub.s : hi.s, step.s, pre, m0.s, pre, l0.s, pre, o0.s,
                   rty.s, rty.s, oty.s);
  // Block views, scores.
  int64_t kbd[3] = {B, D, BK}, vbd[3] = {B, BK, Dv};
  jit__str kb = jit__value_name(e, false), vb = jit__value_name(e, false);
  jit__text_printf(tb,
                   "  %s = tensor.extract_slice %s[0, 0, %sj] [%lld, %lld, %lld] [1, 1, 1] : %s to %s\n"
                   "  %s = tensor.extract_slice %s[0, %sj, 0] [%lld, %lld, %lld] [1, 1, 1] : %s to %s\n",
                   kb.s, kt.s, pre, (long long)B, (long long)D, (long long)BK,
                   jit__tensor_type(JIT__F32, 3, ktd).s, jit__tensor_type(JIT__F32, 3, kbd).s,
                   vb.s, vp.s, pre, (long long)B, (long long)BK, (long long)Dv,
                   jit__tensor_type(JIT__F32, 3, vpd).s, jit__tensor_type(JIT__F32, 3, vbd).s);
  char jn[40];
  snprintf(jn, sizeof jn, "%sj", pre);
  // The mask's rows of this loop's queries (all of them, or one row broadcast), and
  // its columns of this block.
  bool rows = mpd[0] != 1 && mpd[0] != S;
  int64_t mbd[2] = {mpd[0] == 1 ? 1 : S, Tm == 1 ? 1 : BK};
  jit__str mb_blk = mp;
  if (fast && (Tm != 1 || rows)) {
    mb_blk = jit__value_name(e, false);
    jit__text_printf(tb, "  %s = tensor.extract_slice %s[%s, %s] [%lld, %lld] [1, 1] : %s to %s\n",
                     mb_blk.s, mp.s, rows && k->qoff.s[0] ? k->qoff.s : "0",
                     Tm != 1 ? jn : "0", (long long)mbd[0], (long long)mbd[1],
                     jit__tensor_type(JIT__F32, 2, mpd).s, jit__tensor_type(JIT__F32, 2, mbd).s);
  }
  // s = mask + q k^T, accumulated into the masked block.
  jit__str s0 = mask_block(e, a, sd, jn, k->qoff.s, fast ? mb_blk.s : NULL, mbd);
  jit__str sm = jit__value_name(e, false);
  jit__text_printf(tb, "  %s = linalg.batch_matmul ins(%s, %s : %s, %s) outs(%s : %s) -> %s\n",
                   sm.s, qs.s, kb.s, jit__tensor_type(JIT__F32, 3, qd).s,
                   jit__tensor_type(JIT__F32, 3, kbd).s, s0.s,
                   jit__tensor_type(JIT__F32, 3, sd).s, jit__tensor_type(JIT__F32, 3, sd).s);
  // m' = max(m, rowmax s).
  jit__gen_operand smi = {sm.s, JIT__F32, 3, sd, {0}, NULL, NULL};
  jit__identity_map(&smi);
  jit__str mb = reduce_rows(e, sm.s, sd, JIT__B_ACC_MAX, kNegInf);
  char mname[40], lname[40], oname[40];
  snprintf(mname, sizeof mname, "%sm", pre);
  snprintf(lname, sizeof lname, "%sl", pre);
  snprintf(oname, sizeof oname, "%so", pre);
  jit__gen_operand row_m = {mname, JIT__F32, 2, rd, {0}, NULL, NULL},
                   row_mb = {mb.s, JIT__F32, 2, rd, {0}, NULL, NULL};
  jit__identity_map(&row_m);
  jit__identity_map(&row_mb);
  // p = exp(s - m') and alpha = exp(m - m'), m' = max(m, mb) computed in their bodies
  // (m is updated in place last), a max of -inf counting as 0.
  static const char kSafe[] =
      "    %%ani = arith.constant %s : f32\n    %%azr = arith.constant 0.0 : f32\n"
      "    %%amx = arith.maximumf %%in1, %%in2 : f32\n"
      "    %%ainf = arith.cmpf oeq, %%amx, %%ani : f32\n"
      "    %%amk0 = arith.select %%ainf, %%azr, %%amx : f32\n"
      "    %%adf = arith.subf %%in0, %%amk0 : f32\n    %%ay = math.exp %%adf : f32\n";
  jit__gen_operand bm = row_m, bmb = row_mb;  // read over loops (b, s, t)
  jit__str pe = jit__value_name(e, false), p = jit__value_name(e, false);
  jit__emit_empty(e, pe.s, JIT__F32, 3, sd, NULL);
  jit__gen_operand pin[3] = {smi, bm, bmb}, po = {pe.s, JIT__F32, 3, sd, {0}, NULL, NULL};
  jit__identity_map(&po);
  custom_generic(e, p.s, 3, "ppp", pin, 3, &po, kSafe, kNegInf);
  jit__str ae = jit__value_name(e, false), alpha = jit__value_name(e, false);
  jit__emit_empty(e, ae.s, JIT__F32, 2, rd, NULL);
  jit__gen_operand ain[3] = {row_m, row_m, row_mb}, ao = {ae.s, JIT__F32, 2, rd, {0}, NULL, NULL};
  jit__identity_map(&ao);
  custom_generic(e, alpha.s, 2, "pp", ain, 3, &ao, kSafe, kNegInf);
  // l' = l alpha + rowsum p.
  jit__str ls = reduce_rows(e, p.s, sd, JIT__B_ACC_SUM, "0.0");
  jit__gen_operand row_l = {lname, JIT__F32, 2, rd, {0}, NULL, NULL},
                   row_a = {alpha.s, JIT__F32, 2, rd, {0}, NULL, NULL},
                   row_ls = {ls.s, JIT__F32, 2, rd, {0}, NULL, NULL};
  jit__identity_map(&row_l);
  jit__identity_map(&row_a);
  jit__identity_map(&row_ls);
  // l and o are updated in place (their iter_args' buffers): l' = l a + rowsum p.
  jit__str lnew = jit__value_name(e, false);
  jit__gen_operand lin[2] = {row_a, row_ls};
  custom_generic(e, lnew.s, 2, "pp", lin, 2, &row_l,
                 "    %%am = arith.mulf %%out, %%in0 : f32\n    %%ay = arith.addf %%am, %%in1 : f32\n");
  // o' = o a + p v_blk.
  jit__str pvz = jit__emit_filled_acc(e, "0.0", 3, od, NULL), pv = jit__value_name(e, false);
  jit__text_printf(tb, "  %s = linalg.batch_matmul ins(%s, %s : %s, %s) outs(%s : %s) -> %s\n",
                   pv.s, p.s, vb.s, jit__tensor_type(JIT__F32, 3, sd).s,
                   jit__tensor_type(JIT__F32, 3, vbd).s, pvz.s, oty.s, oty.s);
  jit__gen_operand oi = {oname, JIT__F32, 3, od, {0}, NULL, NULL},
                   ob = {alpha.s, JIT__F32, 2, rd, {0}, NULL, NULL},
                   opv = {pv.s, JIT__F32, 3, od, {0}, NULL, NULL};
  jit__identity_map(&oi);
  ob.map[0] = 0, ob.map[1] = 1;
  jit__identity_map(&opv);
  jit__str onew = jit__value_name(e, false);
  jit__gen_operand oin[2] = {ob, opv};
  custom_generic(e, onew.s, 3, "ppp", oin, 2, &oi,
                 "    %%am = arith.mulf %%out, %%in0 : f32\n    %%ay = arith.addf %%am, %%in1 : f32\n");
  // m' = max(m, mb), in place last: what an scf.for yields must be its iter_args'
  // buffers (one-shot bufferization), so every carried value is updated in place.
  jit__str mnew = jit__value_name(e, false);
  custom_generic(e, mnew.s, 2, "pp", &row_mb, 1, &row_m,
                 "    %%ay = arith.maximumf %%out, %%in0 : f32\n");
  jit__text_printf(tb, "  scf.yield %s, %s, %s : %s, %s, %s\n  }\n", mnew.s, lnew.s, onew.s,
                   rty.s, rty.s, oty.s);
  return finish_blocked(e, n, loop.s, od, rd);
}

// The whole row of keys at once for k->S queries of k->B heads, where the scores
// [B, S, Tp] stay small (emit_tiled's query blocks): s = q' K^T accumulated into the
// masked block (mask_block at key 0), softmax over the keys as jit__emit_softmax writes
// it (max, exp, sum and the division, which the CPU strategy fuses into one loop per
// row), and o = p V, a product over all Tp keys. Against the key loop's ~8 passes per
// block of 64 keys (a running max, sum and rescaled o), 12 heads x 64 with an [S, S]
// mask, best of 60, 1 / 2 threads: S = 128 0.95 -> 0.71 / 0.64 -> 0.55 ms, S = 512
// 12.4 -> 9.5 / 7.7 -> 5.7, S = 1024 56 -> 45 / 30 -> 22. Causal only over few keys
// (rows_fit): the key loop skips the blocks past the limit, which this form computes
// (S = 256 2.3 -> 2.4 ms, S = 512 8.0 -> 9.5).
static jit__str emit_rows(jit__emitter *e, const att *a, const att_blk *k, const char *dst) {
  const jit__node *n = a->n;
  int64_t B = k->B, S = k->S, D = a->D, Dv = a->Dv, Tp = k->Tp, Tm = k->Tm;
  jit__text *tb = &e->tb;
  int64_t qd[3] = {B, S, D}, ktd[3] = {B, D, Tp}, vpd[3] = {B, Tp, Dv};
  int64_t sd[3] = {B, S, Tp}, od[3] = {B, S, Dv}, rd[2] = {B, S};
  int64_t mpd[2] = {k->mpd[0], k->mpd[1]};
  bool rows = mpd[0] != 1 && mpd[0] != S;
  int64_t mbd[2] = {mpd[0] == 1 ? 1 : S, Tm == 1 ? 1 : Tp};
  jit__str mb = k->mp;
  if (k->fast && rows) {
    mb = jit__value_name(e, false);
    jit__text_printf(tb, "  %s = tensor.extract_slice %s[%s, 0] [%lld, %lld] [1, 1] : %s to %s\n",
                     mb.s, k->mp.s, k->qoff.s[0] ? k->qoff.s : "0", (long long)mbd[0],
                     (long long)mbd[1], jit__tensor_type(JIT__F32, 2, mpd).s,
                     jit__tensor_type(JIT__F32, 2, mbd).s);
  }
  jit__str j0 = jit__emit_index_const(e, 0);
  jit__str s0 = mask_block(e, a, sd, j0.s, k->qoff.s, k->fast ? mb.s : NULL, mbd);
  jit__str sc = jit__value_name(e, false);
  jit__str sty = jit__tensor_type(JIT__F32, 3, sd);
  jit__text_printf(tb, "  %s = linalg.batch_matmul ins(%s, %s : %s, %s) outs(%s : %s) -> %s\n",
                   sc.s, k->qs.s, k->kt.s, jit__tensor_type(JIT__F32, 3, qd).s,
                   jit__tensor_type(JIT__F32, 3, ktd).s, s0.s, sty.s, sty.s);
  // softmax(s) over the keys.
  jit__gen_operand si = {sc.s, JIT__F32, 3, sd, {0}, NULL, NULL};
  jit__identity_map(&si);
  jit__str mx = reduce_rows(e, sc.s, sd, JIT__B_ACC_MAXNUM, kNegInf);
  jit__gen_operand row = {mx.s, JIT__F32, 2, rd, {0}, NULL, NULL};
  jit__identity_map(&row);
  jit__str pe = jit__value_name(e, false), p = jit__value_name(e, false);
  jit__emit_empty(e, pe.s, JIT__F32, 3, sd, NULL);
  jit__gen_operand pin[2] = {si, row}, po = {pe.s, JIT__F32, 3, sd, {0}, NULL, NULL};
  jit__identity_map(&po);
  jit__emit_generic(e, p.s, 3, "ppp", pin, 2, &po, JIT__B_EXP_SUB, NULL);
  jit__gen_operand pi = {p.s, JIT__F32, 3, sd, {0}, NULL, NULL};
  jit__identity_map(&pi);
  jit__str su = reduce_rows(e, p.s, sd, JIT__B_ACC_SUM, "0.0");
  row.name = su.s;
  jit__str ne = jit__value_name(e, false), pn = jit__value_name(e, false);
  jit__emit_empty(e, ne.s, JIT__F32, 3, sd, NULL);
  jit__gen_operand nin[2] = {pi, row}, no = {ne.s, JIT__F32, 3, sd, {0}, NULL, NULL};
  jit__identity_map(&no);
  jit__emit_generic(e, pn.s, 3, "ppp", nin, 2, &no, JIT__B_DIV, NULL);
  // o = p V, into `dst` zeroed (a zero fill of a new tensor would be hoisted out of the
  // loops and copied into a new buffer per block) or, without one, a new accumulator.
  jit__str oty = jit__tensor_type(JIT__F32, 3, od), o = jit__value_name(e, false);
  jit__str oz = dst ? jit__emit_fill(e, "0.0", dst, oty.s)
                    : jit__emit_filled_acc(e, "0.0", 3, od, NULL);
  jit__text_printf(tb, "  %s = linalg.batch_matmul ins(%s, %s : %s, %s) outs(%s : %s) -> %s\n",
                   o.s, pn.s, k->vp.s, sty.s, jit__tensor_type(JIT__F32, 3, vpd).s, oz.s,
                   oty.s, oty.s);
  if (jit__dtype_is_half(n->dtype)) return jit__emit_f16_result(e, o.s, 3, od, NULL, false);
  return o;
}

// emit_rows' scores per query block: up to 256 KiB (GPT-2's 64 x 1024 keys); causal,
// up to two key blocks, where the key loop skips little (12 heads x 64, 1 / 2 threads:
// S = 64 0.28 -> 0.22 / 0.22 -> 0.18 ms, S = 128 0.77 -> 0.69 / 0.54 -> 0.50; S = 192
// the same either way).
static bool rows_fit(const att *a, int64_t BQ, int64_t Tp) {
  return (!a->n->causal || Tp <= 128) && BQ * Tp * 4 <= (256 << 10);
}

// The key loop per head and per block of BQ queries, for k->B heads: loops over the
// heads and the query blocks around emit_key_loop (B = 1, S = BQ), each step's o / l
// inserted into [B, S, Dv] (the node's dtype; returned). A step's values ([1, BQ, BK]
// scores, [1, BQ, Dv] sums, the head's K^T and V) stay in L2, where the key loop over
// all heads and queries at once made each block's scores and sums [B, S, BK] and
// [B, S, Dv] (GPT-2 at S = 512: 1.5 MiB each, passed over ~8 times per key block).
// Causal: a query block's keys end at its last row's limit (the blocks after it,
// wholly masked, are not visited).
static jit__str emit_tiled(jit__emitter *e, const att *a, const att_blk *k, int64_t BQ) {
  const jit__node *n = a->n;
  int64_t B = k->B, S = a->S, D = a->D, Dv = a->Dv, Tp = k->Tp, BK = k->BK;
  jit__text *tb = &e->tb;
  int64_t od[3] = {B, S, Dv}, qd[3] = {B, S, D}, ktd[3] = {B, D, Tp}, vpd[3] = {B, Tp, Dv};
  jit__str init = jit__value_name(e, false), c0 = jit__value_name(e, false),
           c1 = jit__value_name(e, false), cb = jit__value_name(e, false),
           cs = jit__value_name(e, false), cq = jit__value_name(e, false),
           hl = jit__value_name(e, false), h = jit__value_name(e, false),
           acc = jit__value_name(e, false), ql = jit__value_name(e, false),
           qb = jit__value_name(e, false), acc2 = jit__value_name(e, false);
  jit__emit_empty(e, init.s, n->dtype, 3, od, NULL);
  jit__str oty = jit__tensor_type(n->dtype, 3, od);
  jit__text_printf(tb,
                   "  %s = arith.constant 0 : index\n  %s = arith.constant 1 : index\n"
                   "  %s = arith.constant %lld : index\n  %s = arith.constant %lld : index\n"
                   "  %s = arith.constant %lld : index\n"
                   "  %s = scf.for %s = %s to %s step %s iter_args(%s = %s) -> (%s) {\n"
                   "  %s = scf.for %s = %s to %s step %s iter_args(%s = %s) -> (%s) {\n",
                   c0.s, c1.s, cb.s, (long long)B, cs.s, (long long)S, cq.s, (long long)BQ,
                   hl.s, h.s, c0.s, cb.s, c1.s, acc.s, init.s, oty.s,
                   ql.s, qb.s, c0.s, cs.s, cq.s, acc2.s, acc.s, oty.s);
  att_blk k1 = *k;
  k1.B = 1;
  k1.S = BQ;
  k1.qoff = qb;
  const jit__str *whole[3] = {&k->qs, &k->kt, &k->vp};
  jit__str *part[3] = {&k1.qs, &k1.kt, &k1.vp};
  const int64_t *wd[3] = {qd, ktd, vpd};
  for (int i = 0; i < 3; i++) {
    int64_t pd[3] = {1, i == 0 ? BQ : wd[i][1], wd[i][2]};
    jit__str sl = jit__value_name(e, false);
    jit__text_printf(tb, "  %s = tensor.extract_slice %s[%s, %s, 0] [1, %lld, %lld] [1, 1, 1]"
                         " : %s to %s\n",
                     sl.s, whole[i]->s, h.s, i == 0 ? qb.s : "0", (long long)pd[1],
                     (long long)pd[2], jit__tensor_type(JIT__F32, 3, wd[i]).s,
                     jit__tensor_type(JIT__F32, 3, pd).s);
    *part[i] = sl;
  }
  if (n->causal) {
    // Keys up to the block's last query's limit, qb + BQ - 1 + T - S, in whole blocks.
    int64_t c = BQ + a->T - a->S + BK - 1;
    k1.kub = jit__value_name(e, false);
    jit__text_printf(tb,
                     "  %s = affine.min affine_map<(d0) -> (%lld, ((d0 %s %lld) floordiv %lld) "
                     "* %lld)>(%s)\n",
                     k1.kub.s, (long long)Tp, c < 0 ? "-" : "+", (long long)(c < 0 ? -c : c),
                     (long long)BK, (long long)BK, qb.s);
  }
  int64_t rd[3] = {1, BQ, Dv};
  jit__str r;
  if (rows_fit(a, BQ, Tp)) {
    // An f32 result is accumulated in its place in the loop's tensor.
    jit__str dst = {{0}};
    if (n->dtype == JIT__F32) {
      dst = jit__value_name(e, false);
      jit__text_printf(tb, "  %s = tensor.extract_slice %s[%s, %s, 0] [1, %lld, %lld] [1, 1, 1]"
                           " : %s to %s\n",
                       dst.s, acc2.s, h.s, qb.s, (long long)BQ, (long long)Dv, oty.s,
                       jit__tensor_type(JIT__F32, 3, rd).s);
    }
    r = emit_rows(e, a, &k1, dst.s[0] ? dst.s : NULL);
  } else {
    r = emit_key_loop(e, a, &k1);
  }
  jit__str ins = jit__value_name(e, false);
  jit__text_printf(tb,
                   "  %s = tensor.insert_slice %s into %s[%s, %s, 0] [1, %lld, %lld] [1, 1, 1] :"
                   " %s into %s\n  scf.yield %s : %s\n  }\n  scf.yield %s : %s\n  }\n",
                   ins.s, r.s, acc2.s, h.s, qb.s, (long long)BQ, (long long)Dv,
                   jit__tensor_type(n->dtype, 3, rd).s, oty.s, ins.s, oty.s, ql.s, oty.s);
  return hl;
}

// The query block of emit_tiled for S queries, or 0 where S is not a multiple of one
// (the key loop then takes every query at once).
static int64_t query_block(int64_t S) {
  return S % 64 == 0 ? 64 : S >= 64 && S % 32 == 0 ? 32 : 0;
}

// o / l [k->B, S, Dv] for k->B heads: per head and query block of BQ (emit_tiled), or
// with BQ = 0 the key loop over all of them at once.
static jit__str key_loops(jit__emitter *e, const att *a, const att_blk *k, int64_t BQ) {
  return BQ ? emit_tiled(e, a, k, BQ) : emit_key_loop(e, a, k);
}

static jit_status emit_blocked(jit__emitter *e, const att *a, int64_t BK) {
  const jit__node *n = a->n;
  int64_t B = 1;
  for (int d = 0; d < a->nb; d++) B *= a->q.dims[d];
  int64_t S = a->S, D = a->D, T = a->T, Dv = a->Dv;
  int64_t nblk = (T + BK - 1) / BK, Tp = nblk * BK;
  jit__text *tb = &e->tb;
  int64_t qd[3] = {B, S, D}, kd[3] = {B, T, D}, vd[3] = {B, T, Dv};
  jit__str q3 = as_f32_3d(e, &a->q, qd), k3 = as_f32_3d(e, &a->k, kd), v3 = as_f32_3d(e, &a->v, vd);
  // q' = q * scale.
  jit__str qe = jit__value_name(e, false), qs = jit__value_name(e, false);
  jit__emit_empty(e, qe.s, JIT__F32, 3, qd, NULL);
  jit__gen_operand qi = {q3.s, JIT__F32, 3, qd, {0}, NULL, NULL}, qo = {qe.s, JIT__F32, 3, qd, {0}, NULL, NULL};
  jit__identity_map(&qi);
  jit__identity_map(&qo);
  custom_generic(e, qs.s, 3, "ppp", &qi, 1, &qo,
                 "    %%asc = arith.constant %s : f32\n    %%ay = arith.mulf %%in0, %%asc : f32\n",
                 jit__float_literal(n->scalar, JIT__F32).s);
  // K^T [B, D, Tp] and V [B, Tp, Dv], keys past T read key T - 1 (their scores are -inf).
  int64_t ktd[3] = {B, D, Tp}, vpd[3] = {B, Tp, Dv};
  jit__str kt = padded_keys(e, k3.s, kd, ktd, true), vp = padded_keys(e, v3.s, vd, vpd, false);
  // The mask, flat (for mask_read) and, without batch dims, padded f32 [S', T'].
  int64_t mpd[2], Tm = 1;
  jit__str mp = prepare_mask(e, a, Tp, mpd, &Tm);
  bool fast = mp.s[0] != 0;
  // With threads, the heads in one chunk per thread (an scf.forall; the strategy
  // plans what is inside for one thread): GPT-2's 12 x 128 x 64 causal attention at
  // 2 threads went 1.07 -> 0.57 ms. A mask with batch dims is read at each head's
  // index (mask_read), so it keeps one loop over all heads.
  int th = e->opt ? e->opt->forall_threads : 1;
  int nc = th > 1 && B >= th && B % th == 0 && (!a->has_mask || fast) ? th : 1;
  int64_t od[3] = {B, S, Dv}, Bc = B / nc;
  att_blk k = {.B = Bc, .BK = BK, .Tp = Tp, .qs = qs, .kt = kt, .vp = vp, .mp = mp,
               .fast = fast, .mpd = {mpd[0], mpd[1]}, .Tm = Tm, .S = S};
  // Per head and query block where the mask (if any) has no batch dims and S divides.
  int64_t BQ = !a->has_mask || fast ? query_block(S) : 0;
  if (nc == 1) {
    jit__str r = key_loops(e, a, &k, BQ);
    jit__emit_reshape_to(e, r.s, n->dtype, 3, od, n->rank, n->dims, true);
    return NULL;
  }
  jit__str init = jit__value_name(e, false), loop = jit__value_name(e, false),
           iv = jit__value_name(e, false), it = jit__value_name(e, false),
           b0 = jit__value_name(e, false);
  jit__emit_empty(e, init.s, n->dtype, 3, od, NULL);
  jit__str oty = jit__tensor_type(n->dtype, 3, od);
  jit__text_printf(tb,
                   "  %s = scf.forall (%s) in (%d) shared_outs(%s = %s) -> (%s) {\n"
                   "  %s = affine.apply affine_map<(d0) -> (d0 * %lld)>(%s)\n",
                   loop.s, iv.s, nc, it.s, init.s, oty.s, b0.s, (long long)Bc, iv.s);
  const int64_t *whole[3] = {qd, ktd, vpd};
  jit__str *part[3] = {&k.qs, &k.kt, &k.vp};
  for (int i = 0; i < 3; i++) {
    int64_t cd[3] = {Bc, whole[i][1], whole[i][2]};
    jit__str sl = jit__value_name(e, false);
    jit__text_printf(tb, "  %s = tensor.extract_slice %s[%s, 0, 0] [%lld, %lld, %lld] [1, 1, 1]"
                         " : %s to %s\n",
                     sl.s, part[i]->s, b0.s, (long long)Bc, (long long)cd[1],
                     (long long)cd[2], jit__tensor_type(JIT__F32, 3, whole[i]).s,
                     jit__tensor_type(JIT__F32, 3, cd).s);
    *part[i] = sl;
  }
  jit__str r = key_loops(e, a, &k, BQ);
  int64_t rd[3] = {Bc, S, Dv};
  jit__text_printf(tb,
                   "  scf.forall.in_parallel {\n"
                   "    tensor.parallel_insert_slice %s into %s[%s, 0, 0] [%lld, %lld, %lld] "
                   "[1, 1, 1] : %s into %s\n  }\n  }\n",
                   r.s, it.s, b0.s, (long long)Bc, (long long)S, (long long)Dv,
                   jit__tensor_type(n->dtype, 3, rd).s, oty.s);
  jit__emit_reshape_to(e, loop.s, n->dtype, 3, od, n->rank, n->dims, true);
  return NULL;
}

jit_status jit__emit_attention(jit__emitter *e, const jit__node *n) {
  att a = {.n = n, .r = n->rank, .nb = n->rank - 2};
  a.q = jit__node_operand(e, n->operands[0]);
  a.k = jit__node_operand(e, n->operands[1]);
  a.v = jit__node_operand(e, n->operands[2]);
  a.has_mask = n->n_operands > 3;
  if (a.has_mask) a.mask = jit__node_operand(e, n->operands[3]);
  if (a.r < 2 || a.k.rank != a.r || a.v.rank != a.r) return jit__node_error(e, "attention ranks");
  a.S = a.q.dims[a.nb];
  a.D = a.q.dims[a.nb + 1];
  a.T = a.k.dims[a.nb];
  a.Dv = a.v.dims[a.nb + 1];
  bool all_static = true;
  for (int d = 0; d < a.r; d++)
    all_static &= a.q.dims[d] >= 0 && a.k.dims[d] >= 0 && a.v.dims[d] >= 0;
  for (int d = 0; a.has_mask && d < a.mask.rank; d++) all_static &= a.mask.dims[d] >= 0;
  int BK = e->opt ? e->opt->attention_block : 0;
  if (!e->symbolic && all_static && BK > 0 && a.T > 0) {
    if (a.T < BK) BK = (int)a.T;
    return emit_blocked(e, &a, BK);
  }
  return emit_composed(e, &a);
}
