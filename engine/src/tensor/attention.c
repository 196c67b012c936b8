/*
** attention.c: masks (broadcast over a tensor), masked_fill, and scaled
** dot-product attention composed of batched matmuls, the masked softmax and
** dropout, each with its backward.
*/
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "tensor.h"

static gcap_status fail_free(gcap_tensor **out, gcap_status st) {
  gcap_tensor_free(*out);
  *out = NULL;
  return st;
}

gcap_status gc_mask_flags(gcap_tensor *x, gcap_tensor *mask, const char *op, const char *what,
                          int64_t *flags) {
  int64_t xs[4], ms[4];
  int d, ok = mask->e == x->e && mask->ndim <= x->ndim;
  for (d = 0; d < 4; d++) { /* both as 4-D, right-aligned */
    int xd = x->ndim - 4 + d, md = mask->ndim - 4 + d;
    xs[d] = xd >= 0 ? x->shape[xd] : 1;
    ms[d] = md >= 0 ? mask->shape[md] : 1;
  }
  *flags = mask->dt == GCAP_BF16 ? GC_MASK_BF16 : 0;
  for (d = 0; ok && d < 4; d++) {
    ok = ms[d] == xs[d] || ms[d] == 1;
    if (ms[d] == 1) *flags |= GC_MASK_BCAST(d);
  }
  if (!ok) {
    char b1[64], b2[64];
    if (mask->e != x->e)
      return gc_fail(x->e, GCAP_EINVAL, "%s: the %s belongs to another engine", op, what);
    return gc_fail(x->e, GCAP_EINVAL,
                   "%s: the %s %s does not broadcast to %s (expected at most its dims, each "
                   "equal or 1, aligned at the last)",
                   op, what, gc_shape_str(mask, b1, sizeof b1), gc_shape_str(x, b2, sizeof b2));
  }
  return GCAP_OK;
}

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
  if ((st = gc_run(x->e, GC_K_MASKED_FILL, &a, in, 2, *y)) != GCAP_OK) return fail_free(y, st);
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
  if (out == NULL) return GCAP_EINVAL;
  *out = NULL;
  if (t == NULL) return GCAP_EINVAL;
  gc_clear(t->e);
  if (mask == NULL) return gc_fail(t->e, GCAP_EINVAL, "masked_fill: the mask is NULL");
  if ((st = gc_mask_flags(t, mask, "masked_fill", "mask", &flags)) != GCAP_OK ||
      (st = masked_fill(t, mask, flags, (float)value, "masked_fill", out)) != GCAP_OK)
    return st;
  if (!gc_grad_needed(t->e, &t, 1)) return GCAP_OK;
  if ((st = gc_record(*out, "masked_fill", masked_fill_backward, &t, 1, &mask, 1, &n)) != GCAP_OK)
    return fail_free(out, st);
  n->k[0] = flags;
  return GCAP_OK;
}

/* ------------------------------------------------------------------------ */
/* scaled dot-product attention                                              */

/* q [..., Sq, D], k [..., Sk, D], v [..., Sk, Dv]: 2-D to 4-D, one ndim, equal
** batch dims, one engine and dtype. */
static gcap_status sdpa_check(gcap_tensor *q, gcap_tensor *k, gcap_tensor *v, double p) {
  static const char op[] = "scaled_dot_product_attention";
  int d, n = q->ndim,
         ok = k->ndim == n && v->ndim == n && n >= 2 && k->e == q->e && v->e == q->e &&
              k->dt == q->dt && v->dt == q->dt;
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
  int64_t flags;
  gcap_status st;
  if ((st = gc_matmul(q, 0, k, 1, &s)) != GCAP_OK) return st;
  if (o->attn_mask != NULL && (st = gc_mask_flags(s, o->attn_mask, "scaled_dot_product_attention",
                                                  "attn_mask", &flags)) != GCAP_OK)
    goto done;
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

gcap_status gcap_scaled_dot_product_attention(gcap_tensor *q, gcap_tensor *k, gcap_tensor *v,
                                              const gcap_sdpa_opts *opts, gcap_tensor **out) {
  gcap_sdpa_opts o;
  double scale;
  gcap_status st;
  if (out == NULL) return GCAP_EINVAL;
  *out = NULL;
  if (q == NULL || k == NULL || v == NULL) return GCAP_EINVAL;
  gc_clear(q->e);
  memset(&o, 0, sizeof o);
  if (opts != NULL) o = *opts;
  if ((st = sdpa_check(q, k, v, o.dropout_p)) != GCAP_OK) return st;
  scale = o.scale != 0.0 ? o.scale : 1.0 / sqrt((double)q->shape[q->ndim - 1]);
  return sdpa_composed(q, k, v, &o, scale, out);
}
