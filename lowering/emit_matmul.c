//===--- emit_matmul.c - matmuls as named ops or a linalg.generic ----------===//
//
// jit__emit_matmul (emit.h) and the forms the CPU strategy is tuned for (named_batch,
// static mode only): x W^T through a transposed map, matvec as dot products, batched
// matmuls merged into one linalg.matmul or linalg.batch_matmul. Otherwise, and in
// symbolic mode, a 2-D linalg.matmul or a linalg.generic.
//
//===----------------------------------------------------------------------===//
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "base/text.h"
#include "lowering/emit.h"
#include "lowering/lower.h"

// A matmul as a named op, which the CPU strategy tiles and vectorizes. The operands'
// first `p` batch dims (equal on both) are merged into the one batch dim of a
// linalg.batch_matmul (p > 0), and x's next `fold` batch dims, where W's are 1 or
// absent, into x's rows; with p = 0 it is one linalg.matmul. So x W with x batched is
// one matmul over batch x M rows (which packs W once); equal batch dims a batch of
// matmuls; and in between, grouped-query attention's q (B, H, G, S, D) against
// k^T (B, H, 1, D, S) a batch of B H matmuls of G S rows. Operands and result go
// through emit_reshape_to where the ranks differ, and e->flat keeps the named op's
// result for the consumers (emit_elementwise_flat) and outputs (emit_graph). With f16
// inputs the named op extends them to the f32 accumulator itself.
static jit_status emit_named_matmul(jit__emitter *e, const jit__node *n, const jit__gen_operand *a,
                                    const jit__gen_operand *b, int p, int fold) {
  int r = n->rank;
  bool f16 = jit__dtype_is_half(n->dtype);
  int64_t ad[3], bd[3], cd[3];
  const char *an = a->name, *bn = b->name;
  jit__str as, bs;
  int cr = p ? 3 : 2;  // rank of the named op's result
  int o = cr - 2;      // its row dim
  if (p) ad[0] = bd[0] = cd[0] = jit__num_elements(p, a->dims);
  ad[o] = cd[o] = jit__num_elements(fold, a->dims + p) * a->dims[a->rank - 2];
  ad[o + 1] = a->dims[a->rank - 1];
  bd[o] = b->dims[b->rank - 2];
  bd[o + 1] = cd[o + 1] = b->dims[b->rank - 1];
  if (a->rank != cr) {
    as = jit__emit_reshape_to(e, an, a->dt, a->rank, a->dims, cr, ad, false);
    an = as.s;
  }
  if (b->rank != cr) {
    bs = jit__emit_reshape_to(e, bn, b->dt, b->rank, b->dims, cr, bd, false);
    bn = bs.s;
  }
  // f16 x f16 with more than one row: A extended to f32 by its own elementwise op,
  // which the strategy fuses into the matmul's row tiles (a row tile of A converted
  // once per n block, into a small buffer). The register tiles then broadcast f32
  // elements of A from memory instead of converting each one (8 conversions per 16
  // FMAs at 8x32); B stays f16, converted a vector at a time. 512^3 went from 70 to
  // ~130 GFLOP/s (f32: ~150), 1024^3 from 68 to ~115, 8x768x3072 from 59 to 70.
  jit__dtype a_dt = a->dt;
  if (f16 && e->named_batch && cd[cr - 2] > 1) {
    as = jit__emit_convert(e, an, a->dt, JIT__F32, cr, ad, NULL, false);
    an = as.s;
    a_dt = JIT__F32;
  }
  bool reshape = cr != r;
  // Without a reshape the result is n's (a 2-D matmul in symbolic mode: its `?` dims).
  const jit__dimval *cdv = reshape ? NULL : e->dv[e->cur];
  jit__str acc = jit__emit_filled_acc(e, "0.0", cr, cd, cdv);
  jit__str mm = jit__value_name(e, !f16 && !reshape);
  jit__str acc_ty = jit__tensor_type(JIT__F32, cr, cd);
  jit__text_printf(&e->tb, "  %s = linalg.%s ins(%s, %s : %s, %s) outs(%s : %s) -> %s\n",
                   mm.s, cr == 2 ? "matmul" : "batch_matmul", an, bn,
                   jit__tensor_type(a_dt, cr, ad).s, jit__tensor_type(b->dt, cr, bd).s, acc.s,
                   acc_ty.s, acc_ty.s);
  jit__str res = f16 ? jit__emit_f16_result(e, mm.s, cr, cd, cdv, !reshape) : mm;
  if (reshape) {
    jit__emit_reshape_to(e, res.s, n->dtype, cr, cd, r, n->dims, true);
    struct jit__flat_value *f = &e->flat[e->cur];
    f->name = res;
    f->rank = cr;
    memcpy(f->dims, cd, sizeof cd);
  }
  return NULL;
}

// For x (`a`, the result's rank) times W (`b`) making `n`: the number p of leading batch
// dims equal on both, when the rest are x's only (W's 1 or missing); -1 otherwise.
static int matmul_batch_prefix(const jit__gen_operand *a, const jit__gen_operand *b,
                               const jit__node *n) {
  int nb = n->rank - 2, off = nb - (b->rank - 2), p = 0;
  if (a->rank != n->rank) return -1;
  for (int d = 0; d < nb; d++) {
    int64_t bdim = d >= off ? b->dims[d - off] : 1;
    if (a->dims[d] != n->dims[d]) return -1;
    if (d == p && bdim == n->dims[d])
      p++;
    else if (bdim != 1)
      return -1;
  }
  // A batch of one matmul (x (1, 1, K) times a 2-D W) is that matmul: its rows fold.
  return jit__num_elements(p, n->dims) == 1 ? 0 : p;
}

// Matmul operand `op` copied out to the batch dims of the result `n` (its own last two
// dims kept), NumPy-style: a missing or size-1 dim repeats. `dims` receives the shape.
static jit__str emit_batch_broadcast(jit__emitter *e, const jit__gen_operand *op,
                                     const jit__node *n,
                                int64_t *dims) {
  int r = n->rank, nb = r - 2, off = nb - (op->rank - 2);
  memcpy(dims, n->dims, sizeof(int64_t) * nb);
  dims[nb] = op->dims[op->rank - 2];
  dims[nb + 1] = op->dims[op->rank - 1];
  jit__gen_operand in = *op;
  for (int d = 0; d < op->rank - 2; d++) in.map[d] = op->dims[d] == 1 ? -1 : d + off;
  in.map[op->rank - 2] = nb;
  in.map[op->rank - 1] = nb + 1;
  jit__str empty = jit__value_name(e, false), res = jit__value_name(e, false);
  jit__emit_empty(e, empty.s, op->dt, r, dims, NULL);
  jit__gen_operand out = {empty.s, op->dt, r, dims, {0}, NULL, NULL};
  jit__identity_map(&out);
  char iters[JIT_MAX_RANK];
  memset(iters, 'p', sizeof iters);
  jit__emit_generic(e, res.s, r, iters, &in, 1, &out, JIT__B_COPY, NULL);
  return res;
}

// x (`xd`: rows x K, or a batch of them when `cr` is 3) times W^T for W stored `wd`
// (cols x K): a linalg.matmul (linalg.batch_matmul) reading W through the transposed
// map into `cd`, the f16 result rounded once, then reshaped to `n`'s dims where they
// differ; with `flat`, e->flat keeps the op's result for the consumers, as in
// emit_named_matmul.
static void emit_bt_op(jit__emitter *e, const jit__node *n, int cr, const char *xn, jit__dtype xdt,
                       const int64_t *xd, const char *wn, jit__dtype wdt, const int64_t *wd,
                       const int64_t *cd, bool flat) {
  int r = n->rank;
  bool f16 = jit__dtype_is_half(n->dtype);
  bool reshape = r != cr || memcmp(cd, n->dims, sizeof(int64_t) * (size_t)cr) != 0;
  jit__str acc = jit__emit_filled_acc(e, "0.0", cr, cd, NULL);
  jit__str mm = jit__value_name(e, !f16 && !reshape);
  jit__str acc_ty = jit__tensor_type(JIT__F32, cr, cd);
  jit__text_printf(&e->tb,
                   cr == 3 ? "  %s = linalg.batch_matmul indexing_maps = ["
                             "affine_map<(b, m, n, k) -> (b, m, k)>, "
                             "affine_map<(b, m, n, k) -> (b, n, k)>, "
                             "affine_map<(b, m, n, k) -> (b, m, n)>] "
                           : "  %s = linalg.matmul indexing_maps = ["
                             "affine_map<(m, n, k) -> (m, k)>, affine_map<(m, n, k) -> (n, k)>, "
                             "affine_map<(m, n, k) -> (m, n)>] ",
                   mm.s);
  jit__text_printf(&e->tb, "ins(%s, %s : %s, %s) outs(%s : %s) -> %s\n", xn, wn,
                   jit__tensor_type(xdt, cr, xd).s, jit__tensor_type(wdt, cr, wd).s, acc.s,
                   acc_ty.s,
                   acc_ty.s);
  jit__str res = f16 ? jit__emit_f16_result(e, mm.s, cr, cd, NULL, !reshape) : mm;
  if (!reshape) return;
  jit__emit_reshape_to(e, res.s, n->dtype, cr, cd, r, n->dims, true);
  if (!flat) return;
  struct jit__flat_value *f = &e->flat[e->cur];
  f->name = res;
  f->rank = cr;
  memcpy(f->dims, cd, sizeof(int64_t) * (size_t)cr);
}

// x (`a`, its batch dims folded into `rows`) times W^T where `bn` transposes W (N x K):
// emit_bt_op on a 2-D view of x (emit_matmul says when).
static jit_status emit_matmul_bt(jit__emitter *e, const jit__node *n, const jit__gen_operand *a,
                                 int64_t rows, const jit__node *bn) {
  const jit__node *w = &e->g->nodes[bn->operands[0]];
  int64_t ad[2] = {rows, a->dims[a->rank - 1]}, cd[2] = {rows, n->dims[n->rank - 1]};
  const char *an = a->name;
  jit__str as;
  if (a->rank != 2) {
    as = jit__emit_reshape_to(e, an, a->dt, a->rank, a->dims, 2, ad, false);
    an = as.s;
  }
  emit_bt_op(e, n, 2, an, a->dt, ad, e->names[bn->operands[0]], w->dtype, w->dims, cd, true);
  return NULL;
}

// A batch of x W^T where `bn` transposes the last two dims of W (batch..., N, K), all
// batch dims equal on both: emit_bt_op's linalg.batch_matmul over the merged batch
// (lowering/cpu/, plan_batch_dot), through reshaped views where the batch has more
// than one dim.
static jit_status emit_batch_matmul_bt(jit__emitter *e, const jit__node *n,
                                       const jit__gen_operand *a,
                                       const jit__node *bn) {
  int r = n->rank;
  const jit__node *w = &e->g->nodes[bn->operands[0]];
  int64_t bt = jit__num_elements(r - 2, n->dims), m = n->dims[r - 2], nn = n->dims[r - 1];
  int64_t k = a->dims[r - 1];
  int64_t ad[3] = {bt, m, k}, wd[3] = {bt, nn, k}, cd[3] = {bt, m, nn};
  const char *an = a->name, *wn = e->names[bn->operands[0]];
  jit__str as, ws;
  if (r != 3) {
    as = jit__emit_reshape_to(e, an, a->dt, r, a->dims, 3, ad, false);
    ws = jit__emit_reshape_to(e, wn, w->dtype, r, w->dims, 3, wd, false);
    an = as.s;
    wn = ws.s;
  }
  emit_bt_op(e, n, 3, an, a->dt, ad, wn, w->dtype, wd, cd, true);
  return NULL;
}

// Whether x (`a`) times `b` making `n` is emit_matvec's: b a 2-D vector (K x 1) and K
// of 256 or more (the 2-D dot products' bound), or a batch of vectors with all batch
// dims equal on x, b and the result, and K of 256 or more (f16: 64; f32 12x1000x64
// times 12x64x1 took 160 us against 128 unplanned on one thread, 52 against 129 on 2).
static bool is_matvec(const jit__gen_operand *a, const jit__gen_operand *b, const jit__node *n) {
  int64_t k = a->dims[a->rank - 1];
  if (b->rank == 2) return k >= 256 && b->dims[1] == 1;
  if (a->rank != n->rank || b->rank != n->rank || k < (a->dt == JIT__F16 ? 64 : 256))
    return false;
  for (int d = 0; d < n->rank - 2; d++)
    if (a->dims[d] != n->dims[d] || b->dims[d] != n->dims[d]) return false;
  return true;
}

// x (..., M, K) times a vector w (K x 1, or batched as x is: (..., K, 1)): dot products
// of x's rows with w, as w^T x^T, a one-row x W^T that reads x through the transposed
// map: plan_matmul_bt's dot products split across threads over x's rows (x's batch
// dims folded into them when w is 2-D), or plan_batch_dot's for a batch. 128x768 16 ->
// 5.8 us, 4096x1024 0.82 -> 0.65 ms (2 threads 0.86 -> 0.35), 4x128x768 times 4x768x1
// 32 -> 24 us (f16 93 -> 18), times a 2-D 768x1 63 -> 24. As a matmul with N = 1 its
// register tiles were columns of one lane, unthreaded, and a batch of them was not
// planned at all.
static jit_status emit_matvec(jit__emitter *e, const jit__node *n, const jit__gen_operand *a,
                              const jit__gen_operand *b) {
  bool batch = b->rank > 2;
  int r = n->rank, cr = batch ? 3 : 2;
  int64_t k = a->dims[a->rank - 1];
  int64_t bt = batch ? jit__num_elements(r - 2, n->dims) : 1;
  int64_t rows = batch ? n->dims[r - 2] : jit__num_elements(a->rank - 1, a->dims);
  int64_t wd[3] = {bt, 1, k}, xd[3] = {bt, rows, k}, cd[3] = {bt, 1, rows};
  const int64_t *w3 = batch ? wd : wd + 1, *x3 = batch ? xd : xd + 1, *c3 = batch ? cd : cd + 1;
  jit__str ws = jit__emit_reshape_to(e, b->name, b->dt, b->rank, b->dims, cr, w3, false);
  const char *xn = a->name;
  jit__str xs;
  if (a->rank != cr) {
    xs = jit__emit_reshape_to(e, xn, a->dt, a->rank, a->dims, cr, x3, false);
    xn = xs.s;
  }
  // (1, rows) and n's (rows, 1) differ in dims: no e->flat.
  emit_bt_op(e, n, cr, ws.s, b->dt, w3, xn, a->dt, x3, c3, false);
  return NULL;
}

// Whether `bn` transposes the last two dims of a rank-`r` value and nothing else, and
// `a` (x) and W have the batch dims of the result `n`.
static bool swaps_last_two(const jit__node *bn, const jit__gen_operand *a, const jit__node *n,
                           const jit__emitter *e) {
  int r = n->rank;
  if (bn->op != JIT__OP_TRANSPOSE || bn->rank != r || a->rank != r || r < 3) return false;
  const jit__node *w = &e->g->nodes[bn->operands[0]];
  for (int d = 0; d < r - 2; d++)
    if (bn->perm[d] != d || a->dims[d] != n->dims[d] || w->dims[d] != n->dims[d]) return false;
  return bn->perm[r - 2] == r - 1 && bn->perm[r - 1] == r - 2;
}

// Declared in lower.h: up to 17 rows (plan_matmul_bt); f16 only where its tiles are
// dot products (its `dot`, with L = 16 on AVX-512 and 8 on AVX2), as f16's 16x16
// transposes cost more than a transposed copy of W.
bool jit__cpu_bt_map(int64_t rows, int64_t k, bool f16) {
  return rows <= 17 && (!f16 || (k % 16 == 0 && k >= (rows <= 4 ? 32 : rows <= 12 ? 64 : 128)));
}

// The maps of a matmul's operands `ab` over the loops batch..., m, n, k: operand batch
// dims broadcast NumPy-style.
static jit_status matmul_maps(jit__emitter *e, const jit__node *n, jit__gen_operand *ab) {
  int nb = n->rank - 2;
  for (int i = 0; i < 2; i++) {
    jit__gen_operand *op = &ab[i];
    int ob = op->rank - 2, off = nb - ob;
    for (int d = 0; d < ob; d++) {
      int64_t od = op->dims[d], rd = n->dims[d + off];
      if (jit__dims_agree(e, od, rd))
        op->map[d] = d + off;
      else if (od == 1)
        op->map[d] = -1;
      else
        return jit__node_error(e, "matmul batch dims do not broadcast");
    }
  }
  ab[0].map[ab[0].rank - 2] = nb;      // m
  ab[0].map[ab[0].rank - 1] = nb + 2;  // k
  ab[1].map[ab[1].rank - 2] = nb + 2;  // k
  ab[1].map[ab[1].rank - 1] = nb + 1;  // n
  return NULL;
}

jit_status jit__emit_matmul(jit__emitter *e, const jit__node *n) {
  jit__gen_operand a = jit__node_operand(e, n->operands[0]);
  jit__gen_operand b = jit__node_operand(e, n->operands[1]);
  int r = n->rank;
  if (a.rank < 2 || b.rank < 2 || r < 2) return jit__node_error(e, "matmul needs rank >= 2");
  int64_t m = a.dims[a.rank - 2], k = a.dims[a.rank - 1], nn = b.dims[b.rank - 1];
  if (!jit__dims_agree(e, b.dims[b.rank - 2], k) || n->dims[r - 2] != m || n->dims[r - 1] != nn)
    return jit__node_error(e, "matmul shapes do not agree");
  int nb = r - 2;  // batch dims of the result
  if (a.rank - 2 > nb || b.rank - 2 > nb)
    return jit__node_error(e, "matmul operand has more batch dims than the result");
  if (e->symbolic) {
    jit__gen_operand ab[2] = {a, b};
    JIT_PROPAGATE(matmul_maps(e, n, ab));
    if (!jit__result_dims_from(e, ab, 2, r, n->dims, e->dv[e->cur]))
      return jit__node_error(e, "a `?` dim of the result has no operand dim to take its size from");
  }

  bool f16 = jit__dtype_is_half(n->dtype);
  // x W^T (a PyTorch Linear's weight, N x K) with up to 17 rows: linalg.matmul reading
  // the transpose's input through a transposed map (lowering/cpu/, plan_matmul_bt),
  // instead of a transposed copy of W per call: 1x768x3072 0.40 ms against 2.5,
  // 8x768x3072 0.72 against 2.0, 16x768x3072 1.2 against 2.8, 17x768x3072 (the most
  // rows the GEMV-like path takes, too few to pack B) 1.1 against 2.5. With more rows the
  // matmul packs B, from W directly (plan_packed): 64x768x3072 2.5 ms, against 4.1
  // through the transposed map. The transpose node's own value is then unused unless
  // something else reads it. f16 when K is a multiple of 16 and at least 32 (64 above
  // 4 rows, 128 above 12), where the strategy's tiles are dot products on AVX-512 and
  // AVX2 (plan_matmul_dot; the rule is jit__cpu_bt_map, which the strategy also applies
  // to imported modules): 1x768x3072 0.18 ms against 1.0 for the transposed copy,
  // 8x768x3072 0.48 against 1.3. A batched x (a decode step's (B, 1, D)) is its rows:
  // 4x1x768 times W^T took 2.9 ms, against 0.44 for 4x768.
  const jit__node *bn = &e->g->nodes[n->operands[1]];
  int64_t rows = e->named_batch ? jit__num_elements(a.rank - 1, a.dims) : 0;
  if (e->named_batch && b.rank == 2 && bn->op == JIT__OP_TRANSPOSE && bn->rank == 2 &&
      bn->perm[0] == 1 && bn->perm[1] == 0 && jit__cpu_bt_map(rows, k, f16))
    return emit_matmul_bt(e, n, &a, rows, bn);
  if (e->named_batch && nn == 1 && k % 16 == 0 && is_matvec(&a, &b, n))
    return emit_matvec(e, n, &a, &b);
  if (r == 2 && a.rank == 2 && b.rank == 2) return emit_named_matmul(e, n, &a, &b, 0, 0);
  // A batch of x W^T with W stored (batch..., N, K) and up to 4 rows (a decode step's
  // q K^T against a (B, H, S, D) key cache): dot products along k, no copy of W
  // transposed per call (12x1x64 against 12x1024x64 keys: 326 -> 153 us, 2 threads
  // 351 -> 60; K stored (B, D, S) 98).
  if (e->named_batch && m <= 4 && k % 16 == 0 && swaps_last_two(bn, &a, n, e))
    return emit_batch_matmul_bt(e, n, &a, bn);
  if (e->named_batch) {
    // Leading batch dims equal on both operands, then dims where only x has them (W's
    // are 1 or missing): a batch of matmuls over the first, the rest more rows. Batch
    // dims that broadcast otherwise (x's 1 against W's B, a 2-D x against a batched W,
    // W's 1 before an equal dim) are copied out to the result's first: x, then W if
    // that is not enough. A copy of x per batch costs M K of the M K N multiply-adds
    // (128x768 against 4x768x768: 4.2 ms, against 375 as the generic's loops).
    int64_t xd[JIT_MAX_RANK], wd[JIT_MAX_RANK];
    jit__str xs, ws;
    int p = matmul_batch_prefix(&a, &b, n);
    bool x_full = a.rank == r && memcmp(a.dims, n->dims, sizeof(int64_t) * nb) == 0;
    if (p < 0 && !x_full) {
      xs = emit_batch_broadcast(e, &a, n, xd);
      a = (jit__gen_operand){xs.s, a.dt, r, xd, {0}, NULL, NULL};
      p = matmul_batch_prefix(&a, &b, n);
    }
    if (p < 0) {
      ws = emit_batch_broadcast(e, &b, n, wd);
      b = (jit__gen_operand){ws.s, b.dt, r, wd, {0}, NULL, NULL};
      p = nb;
    }
    return emit_named_matmul(e, n, &a, &b, p, nb - p);
  }
  jit__gen_operand ins[2] = {a, b};
  JIT_PROPAGATE(matmul_maps(e, n, ins));
  jit__dimval *dv = e->dv[e->cur];
  jit__str acc = jit__emit_filled_acc(e, "0.0", r, n->dims, dv);
  jit__str mm = jit__value_name(e, !f16);
  jit__gen_operand out = {acc.s, JIT__F32, r, n->dims, {0}, NULL, NULL};
  jit__identity_map(&out);
  char iters[JIT_MAX_RANK + 2];
  memset(iters, 'p', sizeof iters);
  iters[nb + 2] = 'r';
  jit__emit_generic(e, mm.s, r + 1, iters, ins, 2, &out, JIT__B_ACC_MAC, NULL);
  if (f16) jit__emit_f16_result(e, mm.s, r, n->dims, dv, true);
  return NULL;
}

// An i32 tensor of `dims` (`?` ones valued by dv) filled with 0: an accumulator.
static jit__str emit_i32_zeros(jit__emitter *e, int rank, const int64_t *dims,
                               const jit__dimval *dv) {
  jit__str acc = jit__value_name(e, false), zero = jit__value_name(e, false),
           fill = jit__value_name(e, false);
  jit__emit_empty(e, acc.s, JIT__I32, rank, dims, dv);
  jit__str ty = jit__tensor_type(JIT__I32, rank, dims);
  jit__text_printf(&e->tb, "  %s = arith.constant 0 : i32\n"
                           "  %s = linalg.fill ins(%s : i32) outs(%s : %s) -> %s\n",
                   zero.s, fill.s, zero.s, acc.s, ty.s, ty.s);
  return fill;
}

// The zero points' terms of matmul_int8 (operands 4[, 5], as its axis names them):
//   sum (a - za)(b - zb) = sum a b - zb (sum_k a - K za) - za sum_k b,
// each term i32 and exact, as sum a b is. They enter the dequantizing generic over
// (row, col) as operand pairs (sum, zero point): b's zero point with the rows' sums
// of a less K za, a's with the columns' sums of b. The storage of those operands
// (names, dims) outlives emit_zero_terms.
typedef struct zero_terms {
  jit__str sum[2];
  int64_t dims[2];
  jit__dimval dv[2];
} zero_terms;

// One sum of emit_zero_terms: over k of a's rows [R, K] (rows) or of b's columns
// [K, N] (!rows), i32, into z->sum[i]; a's rows less K za when `za` is set.
static void emit_zero_sum(jit__emitter *e, zero_terms *z, int i, bool rows, const char *src,
                          const int64_t *sd, const jit__gen_operand *za, const char *kv) {
  jit__text *tb = &e->tb;
  const int64_t *od = &z->dims[i];
  const jit__dimval *odv = &z->dv[i];
  jit__str fill = emit_i32_zeros(e, 1, od, odv), sum = jit__value_name(e, false);
  jit__str ty = jit__tensor_type(JIT__I32, 1, od);
  jit__gen_operand in = {src, JIT__I8, 2, sd, {rows ? 0 : 1, rows ? 1 : 0}, NULL, NULL};
  jit__gen_operand out = {fill.s, JIT__I32, 1, od, {0}, odv, NULL};
  char iters[2] = {'p', 'r'};  // (outer, k)
  jit__emit_generic_open(e, sum.s, 2, iters, &in, 1, &out);
  jit__text_printf(tb, "    %%zs0 = arith.extsi %%in0 : i8 to i32\n"
                       "    %%zs1 = arith.addi %%out, %%zs0 : i32\n"
                       "    linalg.yield %%zs1 : i32\n  } -> %s\n", ty.s);
  z->sum[i] = sum;
  if (!za) return;
  jit__str e2 = jit__value_name(e, false), r2 = jit__value_name(e, false);
  jit__emit_empty(e, e2.s, JIT__I32, 1, od, odv);
  jit__gen_operand in2[2] = {{sum.s, JIT__I32, 1, od, {0}, odv, NULL}, *za};
  for (int d = 0; d < za->rank; d++) in2[1].map[d] = -1;
  jit__gen_operand o2 = {e2.s, JIT__I32, 1, od, {0}, odv, NULL};
  char it1[1] = {'p'};
  jit__emit_generic_open(e, r2.s, 1, it1, in2, 2, &o2);
  jit__text_printf(tb, "    %%zk0 = arith.extsi %%in1 : i8 to i32\n"
                       "    %%zk1 = arith.muli %%zk0, %s : i32\n"
                       "    %%zk2 = arith.subi %%in0, %%zk1 : i32\n"
                       "    linalg.yield %%zk2 : i32\n  } -> %s\n", kv, ty.s);
  z->sum[i] = r2;
}

// Writes the sums of zero_terms for matmul_int8 node `n` (a's rows `an` [R, K], R
// valued by rdv[0] when `?`; b [K, N]) and their operand pairs into `ins`; returns
// how many (0, 2 or 4).
static int emit_zero_terms(jit__emitter *e, const jit__node *n, zero_terms *z,
                           const char *an, const int64_t *ad, const jit__dimval *rdv,
                           const jit__gen_operand *b, jit__gen_operand *ins) {
  bool has_a = n->axis & 1, has_b = n->axis & 2;
  if (!has_a && !has_b) return 0;
  memset(z, 0, sizeof *z);
  jit__gen_operand za = {0}, zb = {0};
  int k = 4;
  if (has_a) za = jit__node_operand(e, n->operands[k++]);
  if (has_b) zb = jit__node_operand(e, n->operands[k]);
  int64_t K = b->dims[0] >= 0 ? b->dims[0] : ad[1], N = b->dims[1];
  jit__str kv = jit__value_name(e, false);  // K as i32 (`?` in symbolic mode)
  if (K >= 0)
    jit__text_printf(&e->tb, "  %s = arith.constant %lld : i32\n", kv.s, (long long)K);
  else
    jit__text_printf(&e->tb, "  %s = arith.index_cast %s : index to i32\n", kv.s,
                     b->dv[0].s);
  int w = 0;
  if (has_b) {  // (sum_k a - K za, zb): a's rows, b's zero point per column or one
    z->dims[0] = ad[0];
    if (ad[0] < 0) z->dv[0] = rdv[0];
    emit_zero_sum(e, z, 0, true, an, ad, has_a ? &za : NULL, kv.s);
    ins[w] = (jit__gen_operand){z->sum[0].s, JIT__I32, 1, &z->dims[0], {0}, &z->dv[0], NULL};
    ins[w + 1] = zb;
    for (int d = 0; d < zb.rank; d++)
      ins[w + 1].map[d] = d == zb.rank - 1 && zb.dims[d] != 1 ? 1 : -1;
    w += 2;
  }
  if (has_a) {  // (sum_k b, za): b's columns
    z->dims[1] = N;
    if (N < 0) z->dv[1] = b->dv[1];
    emit_zero_sum(e, z, 1, false, b->name, b->dims, NULL, kv.s);
    ins[w] = (jit__gen_operand){z->sum[1].s, JIT__I32, 1, &z->dims[1], {1}, &z->dv[1], NULL};
    ins[w + 1] = za;
    for (int d = 0; d < za.rank; d++) ins[w + 1].map[d] = -1;
    w += 2;
  }
  return w;
}

// int8 x int8 -> int32, dequantized (symmetric: no zero points): a [..., M, K] as rows
// [R, K] (R = the product of a's leading dims, `?` in symbolic mode), b [K, N]. On the
// CPU a linalg.matmul on i8 with an i32 accumulator, which the strategy plans like any
// other; elsewhere a generic of extsi, muli, addi. Then one generic: i32 -> f32 times
// a's scale and b's (one, or per column), reshaped to the result's dims.
jit_status jit__emit_matmul_int8(jit__emitter *e, const jit__node *n) {
  jit__gen_operand a = jit__node_operand(e, n->operands[0]);
  jit__gen_operand b = jit__node_operand(e, n->operands[1]);
  jit__gen_operand sa = jit__node_operand(e, n->operands[2]);
  jit__gen_operand sb = jit__node_operand(e, n->operands[3]);
  int r = n->rank;
  if (a.rank != r || b.rank != 2 || r < 2) return jit__node_error(e, "matmul_int8 ranks");
  int64_t K = a.dims[r - 1], N = b.dims[1], R = 1;
  jit__dimval rdv[2], *dv = e->dv[e->cur];
  memset(rdv, 0, sizeof rdv);
  for (int d = 0; d < r - 1; d++) R = R >= 0 && a.dims[d] >= 0 ? R * a.dims[d] : -1;
  for (int d = 0; d < r; d++)
    if (n->dims[d] < 0) dv[d] = d < r - 1 ? a.dv[d] : b.dv[1];
  jit__text *tb = &e->tb;
  if (R < 0) {  // the rows' count: the product of a's leading dims
    jit__str p = jit__value_name(e, false);
    jit__text_printf(tb, "  %s = arith.constant 1 : index\n", p.s);
    for (int d = 0; d < r - 1; d++) {
      jit__str q = jit__value_name(e, false), c = jit__value_name(e, false);
      if (a.dims[d] >= 0)
        jit__text_printf(tb, "  %s = arith.constant %lld : index\n  %s = arith.muli %s, %s : index\n",
                         c.s, (long long)a.dims[d], q.s, p.s, c.s);
      else
        jit__text_printf(tb, "  %s = arith.muli %s, %s : index\n", q.s, p.s, a.dv[d].s);
      p = q;
    }
    snprintf(rdv[0].s, sizeof rdv[0].s, "%.39s", p.s);
  }
  if (N < 0 && b.dv) rdv[1] = b.dv[1];
  int64_t ad[2] = {R, K}, cd[2] = {R, N};
  const char *an = a.name;
  jit__str as;
  if (r != 2) {  // the leading dims merged into rows: a view
    as = jit__emit_reshape_dyn(e, an, JIT__I8, r, a.dims, 2, ad, rdv, false);
    an = as.s;
  }
  jit__str fill = emit_i32_zeros(e, 2, cd, rdv), mm = jit__value_name(e, false);
  jit__str ity = jit__tensor_type(JIT__I32, 2, cd);
  if (e->opt && e->opt->conv_as_matmul) {  // the CPU: a named matmul the strategy plans
    jit__text_printf(tb, "  %s = linalg.matmul ins(%s, %s : %s, %s) outs(%s : %s) -> %s\n",
                     mm.s, an, b.name, jit__tensor_type(JIT__I8, 2, ad).s,
                     jit__tensor_type(JIT__I8, 2, b.dims).s, fill.s, ity.s, ity.s);
  } else {
    jit__text_printf(tb,
                     "  %s = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (d0, "
                     "d2)>, affine_map<(d0, d1, d2) -> (d2, d1)>, affine_map<(d0, d1, d2) -> "
                     "(d0, d1)>], iterator_types = [\"parallel\", \"parallel\", "
                     "\"reduction\"]} ins(%s, %s : %s, %s) outs(%s : %s) {\n"
                     "  ^bb0(%%in0: i8, %%in1: i8, %%out: i32):\n"
                     "    %%qa = arith.extsi %%in0 : i8 to i32\n"
                     "    %%qb = arith.extsi %%in1 : i8 to i32\n"
                     "    %%qm = arith.muli %%qa, %%qb : i32\n"
                     "    %%qs = arith.addi %%out, %%qm : i32\n"
                     "    linalg.yield %%qs : i32\n  } -> %s\n",
                     mm.s, an, b.name, jit__tensor_type(JIT__I8, 2, ad).s,
                     jit__tensor_type(JIT__I8, 2, b.dims).s, fill.s, ity.s, ity.s);
  }
  // Dequantize: loops (row, col); a's scale at 0..., b's at its last dim = col; then
  // the zero points' terms (below).
  jit__gen_operand ins[7] = {{mm.s, JIT__I32, 2, cd, {0}, rdv, NULL}, sa, sb};
  jit__identity_map(&ins[0]);
  for (int d = 0; d < sa.rank; d++) ins[1].map[d] = -1;
  for (int d = 0; d < sb.rank; d++) ins[2].map[d] = d == sb.rank - 1 && sb.dims[d] != 1 ? 1 : -1;
  zero_terms zt;
  int n_in = 3 + emit_zero_terms(e, n, &zt, an, ad, rdv, &b, ins + 3);
  jit__str fe = jit__value_name(e, false), deq = jit__value_name(e, r == 2);
  jit__emit_empty(e, fe.s, JIT__F32, 2, cd, rdv);
  jit__gen_operand out = {fe.s, JIT__F32, 2, cd, {0}, rdv, NULL};
  jit__identity_map(&out);
  char iters[2] = {'p', 'p'};
  jit__emit_generic_open(e, deq.s, 2, iters, ins, n_in, &out);
  const char *q = "%in0";
  // Each (sum, zero point) pair of zero_terms: q -= zero point * sum, in i32.
  static const char *const terms[2] = {"%qz2", "%qz5"};
  for (int t = 0; 3 + 2 * t < n_in; t++) {
    jit__text_printf(tb, "    %%qz%d = arith.extsi %%in%d : i8 to i32\n"
                         "    %%qz%d = arith.muli %%qz%d, %%in%d : i32\n"
                         "    %s = arith.subi %s, %%qz%d : i32\n",
                     3 * t, 4 + 2 * t, 3 * t + 1, 3 * t, 3 + 2 * t, terms[t], q, 3 * t + 1);
    q = terms[t];
  }
  jit__text_printf(tb,
                   "    %%qf = arith.sitofp %s : i32 to f32\n"
                   "    %%qx = arith.mulf %%qf, %%in1 : f32\n"
                   "    %%qy = arith.mulf %%qx, %%in2 : f32\n"
                   "    linalg.yield %%qy : f32\n  } -> %s\n",
                   q, jit__tensor_type(JIT__F32, 2, cd).s);
  if (r != 2) jit__emit_reshape_dyn(e, deq.s, JIT__F32, 2, cd, r, n->dims, dv, true);
  return NULL;
}
