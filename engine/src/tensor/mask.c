/*
** mask.c: a mask read over a tensor, as the kernels that take one (the
** masked softmax, masked_fill, fused attention) see it: which of its dims
** broadcast, and its dtype, as GC_MASK_* flags.
*/
#include "tensor.h"

gcap_status gc_mask_flags(gcap_engine *e, int ndim, const int64_t *shape, gcap_tensor *mask,
                          const char *op, const char *what, int64_t *flags) {
  int64_t xs[4], ms[4];
  int d, ok = mask->e == e && mask->ndim <= ndim;
  for (d = 0; d < 4; d++) { /* both as 4-D, right-aligned */
    int xd = ndim - 4 + d, md = mask->ndim - 4 + d;
    xs[d] = xd >= 0 ? shape[xd] : 1;
    ms[d] = md >= 0 ? mask->shape[md] : 1;
  }
  *flags = mask->dt == GCAP_BF16 ? GC_MASK_BF16 : 0;
  for (d = 0; ok && d < 4; d++) {
    ok = ms[d] == xs[d] || ms[d] == 1;
    if (ms[d] == 1) *flags |= GC_MASK_BCAST(d);
  }
  if (!ok) {
    char b1[64], b2[64];
    if (mask->e != e)
      return gc_fail(e, GCAP_EINVAL, "%s: the %s belongs to another engine", op, what);
    return gc_fail(e, GCAP_EINVAL,
                   "%s: the %s %s does not broadcast to %s (expected at most its dims, each "
                   "equal or 1, aligned at the last)",
                   op, what, gc_shape_str(mask, b1, sizeof b1),
                   gc_dims_str(ndim, shape, b2, sizeof b2));
  }
  return GCAP_OK;
}
