/*
** shape.c: permute and transpose, narrow, split and chunk, cat. Tensors have
** no strides: each op makes a contiguous copy (GC_K_PERMUTE, GC_K_NARROW) and
** its backward the inverse copy. select, an entry of the first dim, is
** contiguous: a view at an offset. Dims count from 0; a negative dim counts
** from the end (-1 is the last).
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor.h"

/* Keep a copy of cnt sizes in n's ud (shapes for the backward, which need
** not keep the inputs' storage alive). */
static gcap_status node_sizes(gc_node *n, gcap_engine *e, const int64_t *v, int cnt) {
  int64_t *c = (int64_t *)gc_malloc(sizeof *c * (size_t)cnt);
  if (c == NULL) return gc_fail(e, GCAP_ENOMEM, "%s: out of host memory", n->name);
  memcpy(c, v, sizeof *c * (size_t)cnt);
  n->ud = c;
  n->ud_free = free;
  return GCAP_OK;
}

gcap_status gc_dim(gcap_engine *e, const char *op, int dim, int ndim, int *out) {
  int d = dim < 0 ? dim + ndim : dim;
  if (d < 0 || d >= ndim) {
    if (ndim == 0) return gc_fail(e, GCAP_EINVAL, "%s: a 0-D tensor has no dim %d", op, dim);
    return gc_fail(e, GCAP_EINVAL, "%s: dim %d is out of range for a %d-D tensor (%d..%d)", op, dim,
                   ndim, -ndim, ndim - 1);
  }
  *out = d;
  return GCAP_OK;
}

/* ------------------------------------------------------------------------ */
/* permute                                                                   */

/* y = x with dims permuted (y's dim d is x's dim perm[d]); not recorded. */
static gcap_status permute_copy(gcap_tensor *x, const int *perm, gcap_tensor **y) {
  int64_t shape[GCAP_MAXDIM];
  int pad = 4 - x->ndim, d;
  gc_kargs a;
  gcap_status st;
  for (d = 0; d < x->ndim; d++)
    shape[d] = x->shape[perm[d]];
  if ((st = gc_tensor_alloc(x->e, "permute", x->dt, x->ndim, shape, y)) != GCAP_OK) return st;
  memset(&a, 0, sizeof a);
  a.p[0] = gc_tensor_ptr(*y);
  a.p[1] = gc_tensor_ptr(x);
  for (d = 0; d < 4; d++) { /* as 4-D: leading dims of 1 stay in place */
    a.n[d] = d < pad ? 1 : x->shape[d - pad];
    a.n[4 + d] = d < pad ? d : perm[d - pad] + pad;
  }
  if ((st = gc_run(x->e, GC_K_PERMUTE, &a, &x, 1, *y)) != GCAP_OK) return gc_keep_or_free(y, st);
  return GCAP_OK;
}

/* The grad goes back through the inverse permutation (in k[]). */
static gcap_status permute_backward(gc_node *n, gcap_tensor *g, gcap_tensor **gin) {
  int inv[GCAP_MAXDIM], d;
  for (d = 0; d < g->ndim; d++)
    inv[d] = (int)n->k[d];
  return permute_copy(g, inv, &gin[0]);
}

gcap_status gcap_permute(gcap_tensor *t, const int *perm, gcap_tensor **out) {
  int p[GCAP_MAXDIM], seen = 0, d;
  gc_node *n;
  gcap_status st;
  if ((st = gc_op_start_out("permute", t, "t", NULL, out)) != GCAP_OK) return st;
  if (perm == NULL && t->ndim > 0) return gc_fail(t->e, GCAP_EINVAL, "permute: perm is NULL");
  for (d = 0; d < t->ndim; d++) {
    if ((st = gc_dim(t->e, "permute", perm[d], t->ndim, &p[d])) != GCAP_OK) return st;
    if (seen & (1 << p[d]))
      return gc_fail(t->e, GCAP_EINVAL, "permute: dim %d appears twice in the permutation", p[d]);
    seen |= 1 << p[d];
  }
  if ((st = permute_copy(t, p, out)) != GCAP_OK) return st;
  if (!gc_grad_needed(t->e, &t, 1)) return GCAP_OK;
  if ((st = gc_record(*out, "permute", permute_backward, &t, 1, NULL, 0, &n)) != GCAP_OK)
    return gc_keep_or_free(out, st);
  for (d = 0; d < t->ndim; d++)
    n->k[p[d]] = d;
  return GCAP_OK;
}

gcap_status gcap_transpose(gcap_tensor *t, int d0, int d1, gcap_tensor **out) {
  int p[GCAP_MAXDIM], a, b, d;
  gcap_status st;
  if ((st = gc_op_start_out("transpose", t, "t", NULL, out)) != GCAP_OK) return st;
  if ((st = gc_dim(t->e, "transpose", d0, t->ndim, &a)) != GCAP_OK ||
      (st = gc_dim(t->e, "transpose", d1, t->ndim, &b)) != GCAP_OK)
    return st;
  for (d = 0; d < t->ndim; d++)
    p[d] = d == a ? b : d == b ? a : d;
  return gcap_permute(t, p, out);
}

/* ------------------------------------------------------------------------ */
/* narrow, split, chunk, cat                                                 */

/* Copy between the slice `part` of `whole` (entries off.. of dim d) and the
** slice itself: into part (insert = 0), or into whole's slice (insert = 1). */
static gcap_status slice_copy(gcap_tensor *whole, gcap_tensor *part, int d, int64_t off,
                              int insert) {
  int64_t outer = 1, inner = 1;
  gcap_tensor *src = insert ? part : whole, *dst = insert ? whole : part;
  gc_kargs a;
  int i;
  for (i = 0; i < d; i++)
    outer *= whole->shape[i];
  for (i = d + 1; i < whole->ndim; i++)
    inner *= whole->shape[i];
  memset(&a, 0, sizeof a);
  a.p[0] = gc_tensor_ptr(dst);
  a.p[1] = gc_tensor_ptr(src);
  a.n[0] = outer;
  a.n[1] = part->shape[d];
  a.n[2] = inner;
  a.n[3] = whole->shape[d];
  a.n[4] = off;
  a.n[5] = insert;
  return gc_run(whole->e, GC_K_NARROW, &a, &src, 1, dst);
}

/* The grad of a slice: zeros with the slice's grad in place (k[0] = dim,
** k[1] = start; the whole's shape in ud). */
static gcap_status narrow_backward(gc_node *n, gcap_tensor *g, gcap_tensor **gin) {
  gcap_status st;
  gc_kargs a;
  if ((st = gc_tensor_alloc(g->e, "narrow backward", g->dt, g->ndim, (const int64_t *)n->ud,
                            &gin[0])) != GCAP_OK)
    return st;
  memset(&a, 0, sizeof a);
  a.p[0] = gc_tensor_ptr(gin[0]);
  a.n[0] = gin[0]->numel;
  if ((st = gc_run(g->e, GC_K_FILL, &a, NULL, 0, gin[0])) != GCAP_OK ||
      (st = slice_copy(gin[0], g, (int)n->k[0], n->k[1], 1)) != GCAP_OK)
    return gc_keep_or_free(&gin[0], st);
  return GCAP_OK;
}

/* narrow with its dim already normalized, named `op` in errors. */
static gcap_status narrow(gcap_tensor *t, int d, int64_t start, int64_t len, const char *op,
                          gcap_tensor **out) {
  int64_t shape[GCAP_MAXDIM];
  gc_node *n;
  gcap_status st;
  if (start < 0 || len < 0 || start > t->shape[d] - len)
    return gc_fail(t->e, GCAP_EINVAL,
                   "%s: start %lld and length %lld do not fit dim %d of size %lld", op,
                   (long long)start, (long long)len, d, (long long)t->shape[d]);
  memcpy(shape, t->shape, sizeof shape);
  shape[d] = len;
  if ((st = gc_tensor_alloc(t->e, op, t->dt, t->ndim, shape, out)) != GCAP_OK) return st;
  if ((st = slice_copy(t, *out, d, start, 0)) != GCAP_OK) return gc_keep_or_free(out, st);
  if (!gc_grad_needed(t->e, &t, 1)) return GCAP_OK;
  if ((st = gc_record(*out, op, narrow_backward, &t, 1, NULL, 0, &n)) != GCAP_OK ||
      (st = node_sizes(n, t->e, t->shape, t->ndim)) != GCAP_OK)
    return gc_keep_or_free(out, st); /* the node goes with out */
  n->k[0] = d;
  n->k[1] = start;
  return GCAP_OK;
}

gcap_status gcap_narrow(gcap_tensor *t, int dim, int64_t start, int64_t length, gcap_tensor **out) {
  int d;
  gcap_status st;
  if ((st = gc_op_start_out("narrow", t, "t", NULL, out)) != GCAP_OK) return st;
  if ((st = gc_dim(t->e, "narrow", dim, t->ndim, &d)) != GCAP_OK) return st;
  return narrow(t, d, start, length, "narrow", out);
}

/* The grad of entry k[0] of dim 0: zeros with g in that entry. */
static gcap_status select_backward(gc_node *n, gcap_tensor *g, gcap_tensor **gin) {
  const gc_meta *m = &n->meta[0];
  gcap_tensor *entry;
  gcap_status st;
  gc_kargs a;
  if ((st = gc_tensor_alloc(g->e, "select backward", g->dt, m->ndim, m->shape, &gin[0])) != GCAP_OK)
    return st;
  memset(&a, 0, sizeof a);
  a.p[0] = gc_tensor_ptr(gin[0]);
  a.n[0] = gin[0]->numel;
  if ((st = gc_run(g->e, GC_K_FILL, &a, NULL, 0, gin[0])) != GCAP_OK)
    return gc_keep_or_free(&gin[0], st);
  if ((entry = gc_tensor_slice(gin[0], n->k[0] * g->numel, g->ndim, g->shape)) == NULL)
    return gc_keep_or_free(&gin[0],
                           gc_fail(g->e, GCAP_ENOMEM, "select backward: out of host memory"));
  st = gc_copy(entry, g);
  gcap_tensor_free(entry);
  return gc_keep_or_free(&gin[0], st);
}

gcap_status gcap_select(gcap_tensor *t, int64_t index, gcap_tensor **out) {
  int64_t size, i;
  gc_node *n;
  gcap_status st;
  if ((st = gc_op_start_out("select", t, "t", NULL, out)) != GCAP_OK) return st;
  if (t->ndim == 0) return gc_fail(t->e, GCAP_EINVAL, "select: a 0-D tensor has no entries");
  size = t->shape[0];
  i = index < 0 ? index + size : index;
  if (i < 0 || i >= size)
    return gc_fail(t->e, GCAP_EINVAL,
                   "select: index %lld is out of range for dim 0 of size %lld (%lld..%lld)",
                   (long long)index, (long long)size, (long long)-size, (long long)(size - 1));
  if ((*out = gc_tensor_slice(t, i * (t->numel / size), t->ndim - 1, t->shape + 1)) == NULL)
    return gc_fail(t->e, GCAP_ENOMEM, "select: out of host memory");
  (*out)->view = 1;
  if (!gc_grad_needed(t->e, &t, 1)) return GCAP_OK;
  if ((st = gc_record(*out, "select", select_backward, &t, 1, NULL, 0, &n)) != GCAP_OK)
    return gc_keep_or_free(out, st);
  n->k[0] = i;
  n->is_view = 1;
  return GCAP_OK;
}

/* The start of split or chunk (op) on t: room for cap pieces in outs, their
** count into *n (0 until they are made). */
static gcap_status pieces_start(gcap_tensor *t, int cap, gcap_tensor **outs, int *n,
                                const char *op) {
  gcap_status st;
  if (n != NULL) *n = 0;
  if ((st = gc_op_start(op, t, "t", NULL)) != GCAP_OK) return st;
  if (n == NULL) return gc_null(t->e, op, "n");
  if (cap < 0) return gc_bad_count(t->e, op, "cap", cap);
  if (outs == NULL && cap > 0) return gc_null(t->e, op, "outs");
  return GCAP_OK;
}

/* Pieces of `size` entries of dim (the last may be shorter), into outs. */
static gcap_status split(gcap_tensor *t, int64_t size, int dim, int cap, gcap_tensor **outs, int *n,
                         const char *op) {
  int64_t len, count, i;
  int d;
  gcap_status st;
  if ((st = pieces_start(t, cap, outs, n, op)) != GCAP_OK) return st;
  if ((st = gc_dim(t->e, op, dim, t->ndim, &d)) != GCAP_OK) return st;
  len = t->shape[d];
  if (size <= 0) return gc_fail(t->e, GCAP_EINVAL, "%s: the size of a piece must be positive", op);
  count = len == 0 ? 0 : (len - 1) / size + 1; /* len + size - 1 may overflow */
  if (count > cap)
    return gc_fail(t->e, GCAP_EINVAL,
                   "%s: dim %d of size %lld makes %lld pieces, room for %d (cap)", op, d,
                   (long long)len, (long long)count, cap);
  for (i = 0; i < count; i++) {
    int64_t lo = i * size;
    if ((st = narrow(t, d, lo, len - lo < size ? len - lo : size, op, &outs[i])) != GCAP_OK) {
      while (i-- > 0) {
        gcap_tensor_free(outs[i]);
        outs[i] = NULL;
      }
      return st;
    }
  }
  *n = (int)count;
  return GCAP_OK;
}

gcap_status gcap_split(gcap_tensor *t, int64_t size, int dim, int cap, gcap_tensor **outs, int *n) {
  return split(t, size, dim, cap, outs, n, "split");
}

gcap_status gcap_chunk(gcap_tensor *t, int chunks, int dim, int cap, gcap_tensor **outs, int *n) {
  int d;
  gcap_status st;
  if ((st = pieces_start(t, cap, outs, n, "chunk")) != GCAP_OK) return st;
  if (chunks <= 0)
    return gc_fail(t->e, GCAP_EINVAL, "chunk: the number of chunks must be positive, got %d",
                   chunks);
  if ((st = gc_dim(t->e, "chunk", dim, t->ndim, &d)) != GCAP_OK) return st;
  if (t->shape[d] == 0) return GCAP_OK; /* nothing to split: no pieces */
  return split(t, (t->shape[d] + chunks - 1) / chunks, dim, cap, outs, n, "chunk");
}

/* The grads of cat's inputs: their slices of g (k[0] = dim; their sizes in
** it in ud). */
static gcap_status cat_backward(gc_node *n, gcap_tensor *g, gcap_tensor **gin) {
  const int64_t *size = (const int64_t *)n->ud;
  int64_t shape[GCAP_MAXDIM], off = 0;
  int i, d = (int)n->k[0];
  gcap_status st;
  memcpy(shape, g->shape, sizeof shape);
  for (i = 0; i < n->nin; i++) {
    shape[d] = size[i];
    if (gc_node_needs(n, i)) {
      if ((st = gc_tensor_alloc(g->e, "cat backward", g->dt, g->ndim, shape, &gin[i])) != GCAP_OK ||
          (st = slice_copy(g, gin[i], d, off, 0)) != GCAP_OK)
        return st; /* the caller frees what gin holds */
    }
    off += size[i];
  }
  return GCAP_OK;
}

gcap_status gcap_cat(int n, gcap_tensor *const *ts, int dim, gcap_tensor **out) {
  int64_t shape[GCAP_MAXDIM], size[GCAP_CAT_MAX], off = 0;
  gcap_tensor *t0 = NULL;
  gcap_engine *e;
  gc_node *node;
  gcap_status st;
  int i, j, d;
  if (out != NULL) *out = NULL;
  for (i = 0; ts != NULL && i < n && t0 == NULL; i++) /* the engine to tell */
    t0 = ts[i];
  if (t0 == NULL) return GCAP_EINVAL;
  e = t0->e;
  gc_clear(e);
  if (out == NULL) return gc_null(e, "cat", "out");
  if (n > GCAP_CAT_MAX)
    return gc_fail(e, GCAP_EINVAL, "cat: n is %d (at most %d)", n, GCAP_CAT_MAX);
  for (i = 0; i < n; i++)
    if (ts[i] == NULL || ts[i]->e != e)
      return gc_fail(e, GCAP_EINVAL, "cat: tensor %d %s", i + 1,
                     ts[i] ? "belongs to another engine" : "is NULL");
  t0 = ts[0];
  if ((st = gc_dim(t0->e, "cat", dim, t0->ndim, &d)) != GCAP_OK) return st;
  memcpy(shape, t0->shape, sizeof shape);
  shape[d] = 0;
  for (i = 0; i < n; i++) {
    gcap_tensor *t = ts[i];
    int same = t->dt == t0->dt && t->ndim == t0->ndim;
    for (j = 0; same && j < t0->ndim; j++)
      same = j == d || t->shape[j] == t0->shape[j];
    if (!same) {
      char b1[64], b2[64];
      return gc_fail(t0->e, GCAP_EINVAL,
                     "cat: tensor %d is %s %s, tensor 1 is %s %s: expected one engine and dtype "
                     "and equal sizes in every dim but the one joined (counting tensors from 1)",
                     i + 1, gc_dtype_name(t->dt), gc_shape_str(t, b2, sizeof b2),
                     gc_dtype_name(t0->dt), gc_shape_str(t0, b1, sizeof b1));
    }
    shape[d] += t->shape[d];
    size[i] = t->shape[d];
  }
  if ((st = gc_tensor_alloc(t0->e, "cat", t0->dt, t0->ndim, shape, out)) != GCAP_OK) return st;
  for (i = 0; i < n; i++) {
    if ((st = slice_copy(*out, ts[i], d, off, 1)) != GCAP_OK) return gc_keep_or_free(out, st);
    off += ts[i]->shape[d];
  }
  if (!gc_grad_needed(t0->e, ts, n)) return GCAP_OK;
  if ((st = gc_record(*out, "cat", cat_backward, ts, n, NULL, 0, &node)) != GCAP_OK ||
      (st = node_sizes(node, t0->e, size, n)) != GCAP_OK)
    return gc_keep_or_free(out, st);
  node->k[0] = d;
  return GCAP_OK;
}
