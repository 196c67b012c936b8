/*
** attention.c: masks (broadcast over a tensor), masked_fill, and scaled
** dot-product attention composed of batched matmuls, the masked softmax and
** dropout, or fused (the backend's kernels, or its library attention:
** cuDNN on cuda), each with its backward.
*/
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "tensor.h"

/* ------------------------------------------------------------------------ */
/* masked_fill                                                               */

/* y = x where the mask is 0, v elsewhere; not recorded. */
static gcap_status masked_fill(gcap_tensor *x, gcap_tensor *mask, int64_t flags, float v,
                               const char *op, gcap_tensor **y) {
  gcap_tensor *in[2];
  gc_kargs a;
  gcap_status st;
  int d;
  if ((st = gc_tensor_alloc(x->e, op, x->dt, x->ndim, x->shape, y)) != GCAP_OK) return st;
  memset(&a, 0, sizeof a);
  a.p[0] = gc_tensor_ptr(*y);
  a.p[1] = gc_tensor_ptr(x);
  a.p[2] = gc_tensor_ptr(mask);
  a.n[0] = x->numel;
  for (d = 0; d < 4; d++)
    a.n[1 + d] = x->ndim - 4 + d >= 0 ? x->shape[x->ndim - 4 + d] : 1;
  a.n[5] = flags;
  a.f[0] = v;
  in[0] = x;
  in[1] = mask;
  if ((st = gc_run(x->e, GC_K_MASKED_FILL, &a, in, 2, *y)) != GCAP_OK)
    return gc_keep_or_free(y, st);
  return GCAP_OK;
}

/* saved: the mask; k[0] = its flags. The filled elements get no grad. */
static gcap_status masked_fill_backward(gc_node *n, gcap_tensor *g, gcap_tensor **gin) {
  return masked_fill(g, n->saved[0], n->k[0], 0.0f, "masked_fill backward", &gin[0]);
}

gcap_status gcap_masked_fill(gcap_tensor *t, gcap_tensor *mask, double value, gcap_tensor **out) {
  int64_t flags;
  gc_node *n;
  gcap_status st;
  if ((st = gc_op_start_out("masked_fill", t, "t", mask, out)) != GCAP_OK) return st;
  if (mask == NULL) return gc_null(t->e, "masked_fill", "mask");
  if ((st = gc_mask_flags(t->e, t->ndim, t->shape, mask, "masked_fill", "mask", &flags)) !=
          GCAP_OK ||
      (st = masked_fill(t, mask, flags, (float)value, "masked_fill", out)) != GCAP_OK)
    return st;
  if (!gc_grad_needed(t->e, &t, 1)) return GCAP_OK;
  if ((st = gc_record(*out, "masked_fill", masked_fill_backward, &t, 1, &mask, 1, &n)) != GCAP_OK)
    return gc_keep_or_free(out, st);
  n->k[0] = flags;
  return GCAP_OK;
}

/* ------------------------------------------------------------------------ */
/* scaled dot-product attention                                              */

/* q [..., Sq, D], k [..., Sk, D], v [..., Sk, Dv] of q's engine: 2-D to 4-D,
** one ndim, equal batch dims, one dtype. */
static gcap_status sdpa_check(gcap_tensor *q, gcap_tensor *k, gcap_tensor *v, double p) {
  static const char op[] = "scaled_dot_product_attention";
  int d, n = q->ndim,
         ok = k->ndim == n && v->ndim == n && n >= 2 && k->dt == q->dt && v->dt == q->dt;
  for (d = 0; ok && d < n - 2; d++)
    ok = k->shape[d] == q->shape[d] && v->shape[d] == q->shape[d];
  if (ok) ok = k->shape[n - 1] == q->shape[n - 1] && v->shape[n - 2] == k->shape[n - 2];
  if (!ok) {
    char b1[64], b2[64], b3[64];
    return gc_fail(q->e, GCAP_EINVAL,
                   "%s: expected q [..., Sq, D], k [..., Sk, D], v [..., Sk, Dv] of one engine and "
                   "dtype with equal batch dims; got q %s %s, k %s %s, v %s %s",
                   op, gc_dtype_name(q->dt), gc_shape_str(q, b1, sizeof b1), gc_dtype_name(k->dt),
                   gc_shape_str(k, b2, sizeof b2), gc_dtype_name(v->dt),
                   gc_shape_str(v, b3, sizeof b3));
  }
  if (!(p >= 0.0 && p < 1.0))
    return gc_fail(q->e, GCAP_EINVAL, "%s: dropout_p must be in [0, 1), got %g", op, p);
  return GCAP_OK;
}

/* The unfused composition, each op recording its own backward:
** softmax(scale q k^T + mask, causal), dropout, times v. */
static gcap_status sdpa_composed(gcap_tensor *q, gcap_tensor *k, gcap_tensor *v,
                                 const gcap_sdpa_opts *o, double scale, gcap_tensor **out) {
  gcap_tensor *s = NULL, *p = NULL, *pd = NULL;
  gcap_status st;
  if ((st = gc_matmul(q, 0, k, 1, &s)) != GCAP_OK) return st;
  if ((st = gcap_softmax_masked(s, scale, o->attn_mask, o->mask_kind, o->is_causal, &p)) != GCAP_OK)
    goto done;
  if (o->dropout_p > 0.0 && (st = gcap_dropout(p, o->dropout_p, 1, &pd)) != GCAP_OK) goto done;
  st = gc_matmul(pd ? pd : p, 0, v, 0, out);
done:
  gcap_tensor_free(s);
  gcap_tensor_free(p);
  gcap_tensor_free(pd);
  return st;
}

/* The fused path: one kernel forward (GC_K_ATTN), two backward
** (GC_K_ATTN_BWD_DQ, then GC_K_ATTN_BWD_DKV), over q, k, v seen as [BH, S,
** D]; the rows' softmax stats are kept for the backward, the weights never
** stored. With GC_ATTN_CUDNN in the flags the backend's library runs them,
** the backward in one launch (backend.h). */
static void attn_args(gc_kargs *a, gcap_tensor *q, gcap_tensor *k, gcap_tensor *v, float scale,
                      float p, int64_t flags, int64_t heads) {
  int n = q->ndim, d;
  memset(a, 0, sizeof *a);
  a->n[0] = 1; /* BH: the batch dims' product */
  for (d = 0; d < n - 2; d++)
    a->n[0] *= q->shape[d];
  a->n[1] = q->shape[n - 2];
  a->n[2] = k->shape[n - 2];
  a->n[3] = q->shape[n - 1];
  a->n[4] = v->shape[n - 1];
  a->n[5] = flags;
  a->n[6] = heads;
  a->f[0] = scale;
  a->f[1] = p;
}

/* The backward's own stats: a copy of the forward's (head, max, sum) with
** room for the D of its `rows` rows, which the backward writes; so the saved
** stats stay as the forward left them, for another backward. */
static gcap_status attn_bwd_stats(gcap_tensor *stats, int64_t rows, gcap_tensor **out) {
  int64_t len = stats->numel + rows;
  gc_kargs a;
  gcap_status st;
  if ((st = gc_tensor_alloc(stats->e, "scaled_dot_product_attention backward", GCAP_F32, 1, &len,
                            out)) != GCAP_OK)
    return st;
  memset(&a, 0, sizeof a);
  a.p[0] = gc_tensor_ptr(*out);
  a.p[1] = gc_tensor_ptr(stats);
  a.n[0] = stats->numel;
  a.n[1] = stats->dt;
  if ((st = gc_run(stats->e, GC_K_COPY, &a, &stats, 1, *out)) != GCAP_OK) gc_keep_or_free(out, st);
  return st;
}

/* The first backward launch (GC_K_ATTN_BWD_DQ) over in = do, q, k, v,
** stats, o (, mask); with GC_ATTN_CUDNN the only one: it writes dk and dv
** too, and stats is only read. */
static gcap_status attn_backward_dq(gc_node *n, gcap_tensor **gin, gc_kargs *a, gcap_tensor **in,
                                    int nin) {
  gcap_engine *e = in[0]->e;
  gcap_status st;
  a->p[0] = gc_tensor_ptr(gin[0]);
  a->p[1] = gc_tensor_ptr(in[0]);
  a->p[2] = gc_tensor_ptr(in[1]), a->p[3] = gc_tensor_ptr(in[2]), a->p[4] = gc_tensor_ptr(in[3]);
  a->p[5] = gc_tensor_ptr(in[4]);
  a->p[6] = nin > 6 ? gc_tensor_ptr(in[6]) : NULL;
  a->p[7] = gc_tensor_ptr(in[5]);
  if (n->k[0] & GC_ATTN_CUDNN) {
    a->p[8] = gc_tensor_ptr(gin[1]);
    a->p[9] = gc_tensor_ptr(gin[2]);
    if ((st = gc_note_access(e, gin[1], 1)) == GCAP_OK) st = gc_note_access(e, gin[2], 1);
  } else {
    st = gc_note_access(e, in[4], 1); /* D */
  }
  return st != GCAP_OK ? st : gc_run(e, GC_K_ATTN_BWD_DQ, a, in, nin, gin[0]);
}

/* saved: q, k, v, stats (head, then the rows' max and sum; with
** GC_ATTN_CUDNN the library's log-sum-exp), o, mask (or none); f[0] = scale,
** f[1] = dropout p; k[0] = the mask's flags with causal (and GC_ATTN_CUDNN),
** k[1] = heads. */
static gcap_status attn_backward(gc_node *n, gcap_tensor *g, gcap_tensor **gin) {
  gcap_tensor *q = n->saved[0], *k = n->saved[1], *v = n->saved[2], *stats = NULL;
  gcap_tensor *o = n->saved[4], *mask = n->nsaved > 5 ? n->saved[5] : NULL, *in[7], *gd = NULL;
  gc_kargs a;
  gcap_status st;
  int i, nin;
  for (i = 0; i < 3; i++) { /* every grad is computed (the kernels write them together) */
    gcap_tensor *x = n->saved[i];
    if ((st = gc_tensor_alloc(g->e, "scaled_dot_product_attention backward", x->dt, x->ndim,
                              x->shape, &gin[i])) != GCAP_OK)
      return st; /* the caller frees what gin holds */
  }
  /* the library reads do aligned as the forward's operands: a view elsewhere is copied */
  if ((n->k[0] & GC_ATTN_CUDNN) && (uintptr_t)gc_tensor_ptr(g) % GC_ATTN_CUDNN_ALIGN != 0) {
    if ((st = gcap_tensor_clone(g, &gd)) != GCAP_OK) return st;
    g = gd;
  }
  attn_args(&a, q, k, v, n->f[0], n->f[1], n->k[0], n->k[1]);
  /* the library only reads the stats; the own kernels write D into a copy */
  if (n->k[0] & GC_ATTN_CUDNN)
    stats = gcap_tensor_retain(n->saved[3]);
  else if ((st = attn_bwd_stats(n->saved[3], a.n[0] * a.n[1], &stats)) != GCAP_OK)
    goto done;
  in[0] = g, in[1] = q, in[2] = k, in[3] = v, in[4] = stats, in[5] = o, in[6] = mask;
  nin = mask ? 7 : 6;
  st = attn_backward_dq(n, gin, &a, in, nin);
  if (st != GCAP_OK || (n->k[0] & GC_ATTN_CUDNN)) goto done;
  a.p[0] = gc_tensor_ptr(gin[1]);
  a.p[1] = gc_tensor_ptr(gin[2]);
  a.p[2] = gc_tensor_ptr(g);
  a.p[3] = gc_tensor_ptr(q), a.p[4] = gc_tensor_ptr(k), a.p[5] = gc_tensor_ptr(v);
  a.p[6] = gc_tensor_ptr(stats);
  a.p[7] = mask ? gc_tensor_ptr(mask) : NULL;
  if ((st = gc_note_access(g->e, gin[2], 1)) == GCAP_OK)
    st = gc_run(g->e, GC_K_ATTN_BWD_DKV, &a, in, nin, gin[1]);
done:
  gcap_tensor_free(stats); /* later work on the stream runs after these launches */
  gcap_tensor_free(gd);
  return st;
}

/* GC_K_ATTN's arguments but o and stats (p[0], p[4]); flags: the mask's,
** with causal (gcap_scaled_dot_product_attention). */
static void attn_fwd_args(gc_kargs *a, gcap_tensor *q, gcap_tensor *k, gcap_tensor *v,
                          const gcap_sdpa_opts *o, double scale, int64_t flags) {
  int n = q->ndim;
  attn_args(a, q, k, v, (float)scale, (float)o->dropout_p, flags, n >= 3 ? q->shape[n - 3] : 1);
  a->p[1] = gc_tensor_ptr(q), a->p[2] = gc_tensor_ptr(k), a->p[3] = gc_tensor_ptr(v);
  a->p[5] = o->attn_mask ? gc_tensor_ptr(o->attn_mask) : NULL;
  a->p[6] = o->dropout_p > 0.0 ? q->e->rng->ptr : NULL;
  a->dt = (int)q->dt;
}

/* 1 when the backend's library attention takes this call (GC_ATTN_CUDNN),
** having built what it needs, the backward's too where grads will flow;
** otherwise 0 and why into why[n]. */
static int sdpa_cudnn(gcap_tensor *q, gcap_tensor *k, gcap_tensor *v, const gcap_sdpa_opts *o,
                      double scale, int64_t flags, char *why, size_t n) {
  gcap_engine *e = q->e;
  gcap_tensor *in[3];
  gc_kargs a;
  in[0] = q, in[1] = k, in[2] = v;
  attn_fwd_args(&a, q, k, v, o, scale, flags);
  return e->be->attn_supported(e->bs, &a, gc_grad_needed(e, in, 3), e->cap != NULL, why, n);
}

/* GC_K_ATTN with arguments a (all but o and stats) over in[0..nin) into
** out: its stats made into *stats, the head then per_row floats a row, and
** the generator moved on past a dropout's draws of the weights' elements
** (as gcap_dropout's). */
static gcap_status attn_launch(gc_kargs *a, gcap_tensor *const *in, int nin, int per_row,
                               gcap_tensor *out, gcap_tensor **stats) {
  gcap_engine *e = out->e;
  int64_t len = GC_ATTN_HEAD + per_row * a->n[0] * a->n[1];
  gcap_status st;
  if ((st = gc_tensor_alloc(e, "scaled_dot_product_attention", GCAP_F32, 1, &len, stats)) !=
      GCAP_OK)
    return st;
  a->p[0] = gc_tensor_ptr(out);
  a->p[4] = gc_tensor_ptr(*stats);
  if ((st = gc_note_access(e, *stats, 1)) != GCAP_OK ||
      (st = gc_run(e, GC_K_ATTN, a, in, nin, out)) != GCAP_OK)
    return st;
  return a->f[1] > 0.0f ? gc_rng_advance(e, a->n[0] * a->n[1] * a->n[2]) : GCAP_OK;
}

/* flags: the mask's, with causal (and GC_ATTN_CUDNN). */
static gcap_status sdpa_fused(gcap_tensor *q, gcap_tensor *k, gcap_tensor *v,
                              const gcap_sdpa_opts *o, double scale, int64_t flags,
                              gcap_tensor **out) {
  int n = q->ndim;
  int64_t shape[GCAP_MAXDIM], heads;
  gcap_tensor *stats = NULL, *in[4], *save[6];
  gcap_engine *e = q->e;
  gc_node *node;
  gc_kargs a;
  gcap_status st;
  memcpy(shape, q->shape, sizeof shape);
  shape[n - 1] = v->shape[n - 1];
  if ((st = gc_tensor_alloc(e, "scaled_dot_product_attention", q->dt, n, shape, out)) != GCAP_OK)
    return st;
  attn_fwd_args(&a, q, k, v, o, scale, flags);
  heads = a.n[6];
  in[0] = q, in[1] = k, in[2] = v, in[3] = o->attn_mask;
  /* two floats a row: max and sum (the backward adds D in its own copy); the
  ** library's one, its log-sum-exp */
  if ((st = attn_launch(&a, in, o->attn_mask ? 4 : 3, flags & GC_ATTN_CUDNN ? 1 : 2, *out,
                        &stats)) != GCAP_OK)
    goto fail;
  if (gc_grad_needed(e, in, 3)) {
    save[0] = q, save[1] = k, save[2] = v, save[3] = stats, save[4] = *out;
    save[5] = o->attn_mask;
    if ((st = gc_record(*out, "scaled_dot_product_attention", attn_backward, in, 3, save,
                        o->attn_mask ? 6 : 5, &node)) != GCAP_OK)
      goto fail;
    node->f[0] = (float)scale;
    node->f[1] = (float)o->dropout_p;
    node->k[0] = flags;
    node->k[1] = heads;
  }
  gcap_tensor_free(stats);
  return GCAP_OK;
fail:
  gcap_tensor_free(stats);
  return gc_keep_or_free(out, st);
}

/* GC_K_ATTN's arguments over the packed qkv [S, B, H, 3D] (GC_ATTN_PACKED),
** q, k and v in place; o and stats (p[0], p[4]) left to the caller. */
static void attn_packed_args(gc_kargs *a, gcap_tensor *qkv, float scale, float p, int64_t flags) {
  const int64_t s = qkv->shape[0], heads = qkv->shape[2], d = qkv->shape[3] / 3;
  char *base = (char *)gc_tensor_ptr(qkv);
  size_t step = (size_t)d * gc_dtype_size(qkv->dt);
  memset(a, 0, sizeof *a);
  a->n[0] = qkv->shape[1] * heads;
  a->n[1] = a->n[2] = s;
  a->n[3] = a->n[4] = d;
  a->n[5] = flags | GC_ATTN_PACKED;
  a->n[6] = heads;
  a->f[0] = scale;
  a->f[1] = p;
  a->p[1] = base, a->p[2] = base + step, a->p[3] = base + 2 * step;
  a->dt = (int)qkv->dt;
}

/* saved: qkv, the library's stats, o; f[0] = scale, f[1] = dropout p; k[0] = the flags. The
** grad of qkv in one launch, dq, dk and dv written in place. */
static gcap_status attn_packed_backward(gc_node *n, gcap_tensor *g, gcap_tensor **gin) {
  gcap_tensor *qkv = n->saved[0], *in[4], *gd = NULL;
  gc_kargs a;
  gcap_status st;
  ptrdiff_t step;
  char *base;
  if ((st = gc_tensor_alloc(g->e, "scaled_dot_product_attention backward", qkv->dt, qkv->ndim,
                            qkv->shape, &gin[0])) != GCAP_OK)
    return st;
  /* the library reads do aligned as the forward's operands: a view elsewhere is copied */
  if ((uintptr_t)gc_tensor_ptr(g) % GC_ATTN_CUDNN_ALIGN != 0) {
    if ((st = gcap_tensor_clone(g, &gd)) != GCAP_OK) return st;
    g = gd;
  }
  attn_packed_args(&a, qkv, n->f[0], n->f[1], n->k[0]);
  step = (char *)a.p[2] - (char *)a.p[1];
  a.p[4] = a.p[3], a.p[3] = a.p[2], a.p[2] = a.p[1]; /* the backward's q, k, v */
  a.p[1] = gc_tensor_ptr(g);
  base = (char *)gc_tensor_ptr(gin[0]);
  a.p[0] = base, a.p[8] = base + step, a.p[9] = base + 2 * step;
  a.p[5] = gc_tensor_ptr(n->saved[1]);
  a.p[7] = gc_tensor_ptr(n->saved[2]);
  in[0] = g, in[1] = qkv, in[2] = n->saved[1], in[3] = n->saved[2];
  st = gc_run(g->e, GC_K_ATTN_BWD_DQ, &a, in, 4, gin[0]);
  gcap_tensor_free(gd);
  return st;
}

gcap_status gc_sdpa_packed(gcap_tensor *qkv, const gcap_sdpa_opts *o, char *why, size_t nwhy,
                           gcap_tensor **out) {
  static const char op[] = "scaled_dot_product_attention";
  gcap_engine *e = qkv->e;
  int64_t shape[3], d = qkv->shape[3] / 3, flags = GC_ATTN_CUDNN;
  double scale = o->scale != 0.0 ? o->scale : 1.0 / sqrt((double)d);
  gcap_tensor *stats = NULL, *save[3];
  gc_node *node;
  gc_kargs a;
  gcap_status st;
  *out = NULL;
  if (o->attn_mask != NULL || (o->impl != GCAP_SDPA_AUTO && o->impl != GCAP_SDPA_CUDNN)) {
    snprintf(why, nwhy, "the packed path takes no mask and attn_impl auto or cudnn");
    return GCAP_OK;
  }
  if (o->is_causal) flags |= GC_MASK_CAUSAL;
  attn_packed_args(&a, qkv, (float)scale, (float)o->dropout_p, flags);
  a.p[6] = o->dropout_p > 0.0 ? e->rng->ptr : NULL;
  if (!e->be->attn_supported(e->bs, &a, gc_grad_needed(e, &qkv, 1), e->cap != NULL, why, nwhy))
    return GCAP_OK;
  shape[0] = qkv->shape[0], shape[1] = qkv->shape[1], shape[2] = qkv->shape[2] * d;
  if ((st = gc_tensor_alloc(e, op, qkv->dt, 3, shape, out)) != GCAP_OK) return st;
  if ((st = attn_launch(&a, &qkv, 1, 1, *out, &stats)) != GCAP_OK) goto fail;
  if (gc_grad_needed(e, &qkv, 1)) {
    save[0] = qkv, save[1] = stats, save[2] = *out;
    if ((st = gc_record(*out, op, attn_packed_backward, &qkv, 1, save, 3, &node)) != GCAP_OK)
      goto fail;
    node->f[0] = (float)scale;
    node->f[1] = (float)o->dropout_p;
    node->k[0] = flags;
  }
  gcap_tensor_free(stats);
  return GCAP_OK;
fail:
  gcap_tensor_free(stats);
  return gc_keep_or_free(out, st);
}

gcap_status gcap_scaled_dot_product_attention(gcap_tensor *q, gcap_tensor *k, gcap_tensor *v,
                                              const gcap_sdpa_opts *opts, gcap_tensor **out) {
  gcap_attn_stats ran;
  return gc_sdpa(q, k, v, opts, &ran, out);
}

gcap_status gc_sdpa(gcap_tensor *q, gcap_tensor *k, gcap_tensor *v, const gcap_sdpa_opts *opts,
                    gcap_attn_stats *ran, gcap_tensor **out) {
  static const char op[] = "scaled_dot_product_attention";
  gcap_sdpa_opts o;
  double scale;
  int64_t d, dv, shape[GCAP_MAXDIM], flags = 0;
  int fusable;
  char *why = ran->why;
  const size_t nwhy = sizeof ran->why;
  gcap_status st;
  memset(ran, 0, sizeof *ran);
  if ((st = gc_op_start_out(op, q, "q", k ? k : v, out)) != GCAP_OK ||
      (st = gc_operand(q->e, op, "k", k)) != GCAP_OK ||
      (st = gc_operand(q->e, op, "v", v)) != GCAP_OK)
    return st;
  memset(&o, 0, sizeof o);
  if (opts != NULL) o = *opts;
  if ((st = sdpa_check(q, k, v, o.dropout_p)) != GCAP_OK) return st;
  d = q->shape[q->ndim - 1], dv = v->shape[v->ndim - 1];
  if (d == 0) { /* no scores to scale: refused by every implementation alike */
    char b[64];
    return gc_fail(q->e, GCAP_EINVAL,
                   "%s: the head dim D of q and k is 0 (q %s); D must be positive", op,
                   gc_shape_str(q, b, sizeof b));
  }
  /* the kernels take the scale as a float: a larger one would be inf there */
  if (!(o.scale == 0.0 || (o.scale > 0.0 && o.scale <= (double)FLT_MAX)))
    return gc_fail(q->e, GCAP_EINVAL, "%s: the scale must be positive and at most %g, got %g", op,
                   (double)FLT_MAX, o.scale);
  scale = o.scale != 0.0 ? o.scale : 1.0 / sqrt((double)d);
  if (o.mask_kind != GCAP_MASK_ADD && o.mask_kind != GCAP_MASK_BOOL)
    return gc_fail(q->e, GCAP_EINVAL, "%s: unknown mask kind %d", op, (int)o.mask_kind);
  memcpy(shape, q->shape, sizeof shape);
  shape[q->ndim - 1] = k->shape[k->ndim - 2]; /* the scores', which the mask covers */
  if (o.attn_mask != NULL &&
      (st = gc_mask_flags(q->e, q->ndim, shape, o.attn_mask, op, "attn_mask", &flags)) != GCAP_OK)
    return st;
  if (o.attn_mask != NULL && o.mask_kind == GCAP_MASK_BOOL) flags |= GC_MASK_BOOL;
  if (o.is_causal) flags |= GC_MASK_CAUSAL;
  fusable = d <= GCAP_SDPA_FUSED_DMAX && dv <= GCAP_SDPA_FUSED_DMAX;
  switch (o.impl) {
    case GCAP_SDPA_AUTO: /* cuDNN where it runs, the composition elsewhere (docs/lua-api.md) */
    case GCAP_SDPA_CUDNN:
      if (sdpa_cudnn(q, k, v, &o, scale, flags, why, nwhy)) {
        ran->impl = "cudnn";
        st = sdpa_fused(q, k, v, &o, scale, flags | GC_ATTN_CUDNN, out);
      } else if (o.impl == GCAP_SDPA_CUDNN) {
        st = gc_fail(q->e, GCAP_EUNSUPPORTED, "%s: impl 'cudnn' cannot run this call: %s", op, why);
      } else {
        ran->impl = "composed";
        st = sdpa_composed(q, k, v, &o, scale, out);
      }
      break;
    case GCAP_SDPA_COMPOSED:
      ran->impl = "composed";
      snprintf(why, nwhy, "impl 'composed' asks for the composition");
      st = sdpa_composed(q, k, v, &o, scale, out);
      break;
    case GCAP_SDPA_FUSED:
      if (!fusable)
        return gc_fail(q->e, GCAP_EINVAL,
                       "%s: the fused kernel takes head dims up to %d, got D %lld and Dv %lld", op,
                       GCAP_SDPA_FUSED_DMAX, (long long)d, (long long)dv);
      ran->impl = "fused";
      snprintf(why, nwhy, "impl 'fused' asks for the own fused kernels");
      st = sdpa_fused(q, k, v, &o, scale, flags, out);
      break;
    default:
      return gc_fail(q->e, GCAP_EINVAL, "%s: unknown impl %d", op, (int)o.impl);
  }
  if (st != GCAP_OK) ran->impl = NULL;
  return st;
}
