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
