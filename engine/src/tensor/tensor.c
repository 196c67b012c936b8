/*
** tensor.c: tensor bookkeeping (shape, dtype, aliases over refcounted
** blocks), and the lifetime of tensors and of the autograd nodes they hold.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor.h"

const char *gc_dtype_name(gcap_dtype dt) {
  return dt == GCAP_BF16 ? "bf16" : "f32";
}

const char *gc_dims_str(int ndim, const int64_t *shape, char *buf, size_t n) {
  size_t at = 0;
  int i;
  at += (size_t)snprintf(buf, n, "[");
  for (i = 0; i < ndim && at < n; i++)
    at += (size_t)snprintf(buf + at, n - at, i ? ", %lld" : "%lld", (long long)shape[i]);
  if (at < n) snprintf(buf + at, n - at, "]");
  return buf;
}

const char *gc_shape_str(const gcap_tensor *t, char *buf, size_t n) {
  return gc_dims_str(t->ndim, t->shape, buf, n);
}

gcap_status gc_check_shape(gcap_engine *e, const char *op, int ndim, const int64_t *shape,
                           int64_t *numel) {
  int64_t n = 1;
  int i;
  if (ndim < 0 || ndim > GCAP_MAXDIM)
    return gc_fail(e, GCAP_EINVAL, "%s: ndim is %d; a tensor has 0 to %d dimensions", op, ndim,
                   GCAP_MAXDIM);
  if (ndim > 0 && shape == NULL) return gc_fail(e, GCAP_EINVAL, "%s: shape is NULL", op);
  for (i = 0; i < ndim; i++) {
    if (shape[i] < 0)
      return gc_fail(e, GCAP_EINVAL, "%s: shape entry #%d must be non-negative, got %lld", op,
                     i + 1, (long long)shape[i]);
    if (shape[i] > 0 && n > GCAP_MAXNUMEL / shape[i])
      return gc_fail(e, GCAP_EINVAL, "%s: shape is too large (more than 2^40 elements)", op);
    n *= shape[i];
  }
  *numel = n;
  return GCAP_OK;
}

gcap_status gc_op_start(const char *op, gcap_tensor *t, const char *name, const gcap_tensor *alt) {
  if (t == NULL) return alt ? gc_null(alt->e, op, name) : GCAP_EINVAL;
  gc_clear(t->e);
  if (!t->e->op.backward) t->e->op.name = op; /* a node's backward keeps its own label */
  t->e->nargnotes = 0;
  return GCAP_OK;
}

gcap_status gc_op_start_out(const char *op, gcap_tensor *t, const char *name,
                            const gcap_tensor *alt, gcap_tensor **out) {
  gcap_status st;
  if (out != NULL) *out = NULL;
  if ((st = gc_op_start(op, t, name, alt)) != GCAP_OK) return st;
  return out ? GCAP_OK : gc_null(t->e, op, "out");
}

gcap_status gc_operand(gcap_engine *e, const char *op, const char *name, const gcap_tensor *t) {
  if (t == NULL) return gc_null(e, op, name);
  return t->e == e ? GCAP_OK : gc_foreign(e, op, name);
}

static gcap_tensor *tensor_wrap(gcap_engine *e, gc_blk *b, size_t off, gcap_dtype dt, int ndim,
                                const int64_t *shape, int64_t numel) {
  gcap_tensor *t = (gcap_tensor *)gc_calloc(1, sizeof *t);
  if (t == NULL) return NULL;
  t->refs = 1;
  t->e = e;
  t->blk = b;
  t->off = off;
  t->dt = dt;
  t->ndim = ndim;
  if (ndim > 0) memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
  t->numel = numel;
  gc_engine_ref(e);
  return t;
}

gcap_status gc_tensor_alloc(gcap_engine *e, const char *op, gcap_dtype dt, int ndim,
                            const int64_t *shape, gcap_tensor **out) {
  int64_t numel;
  gcap_pool *pool = e->heap;
  gcap_stream *s = e->current;
  gc_blk *b;
  gcap_status st;
  *out = NULL;
  if (dt != GCAP_F32 && dt != GCAP_BF16)
    return gc_fail(e, GCAP_EINVAL, "%s: unknown dtype %d", op, (int)dt);
  if ((st = gc_check_shape(e, op, ndim, shape, &numel)) != GCAP_OK) return st;
  if (e->closed) return gc_check_open(e, op);
  if (e->cap != NULL) {
    if (e->cap->invalid)
      return gc_fail(e, GCAP_ECAPTURE, "%s: the open capture was invalidated earlier: %s", op,
                     e->cap->why);
    if (!s->in_capture)
      return gc_capture_refuse(e,
                               "%s: allocation outside the capture's pool (on a stream that is "
                               "not part of the open capture)",
                               op);
    pool = e->cap->pool;
  }
  if ((st = gc_pool_alloc(pool, s, (size_t)numel * gc_dtype_size(dt), op, &b)) != GCAP_OK)
    return st;
  if ((*out = tensor_wrap(e, b, 0, dt, ndim, shape, numel)) == NULL) {
    gc_blk_release(b);
    return gc_fail(e, GCAP_ENOMEM, "%s: out of host memory", op);
  }
  return GCAP_OK;
}

gcap_status gcap_tensor_empty(gcap_engine *e, gcap_dtype dt, int ndim, const int64_t *shape,
                              gcap_tensor **out) {
  if (out != NULL) *out = NULL;
  if (e == NULL) return GCAP_EINVAL;
  gc_clear(e);
  if (out == NULL) return gc_null(e, "empty", "out");
  return gc_tensor_alloc(e, "empty", dt, ndim, shape, out);
}

gcap_tensor *gcap_tensor_retain(gcap_tensor *t) {
  if (t) t->refs++;
  return t;
}

/* A tensor holds the node that made it, a node the tensors it saved, its
** leaves and its pending grad: the two free each other, both here. */
void gcap_tensor_free(gcap_tensor *t) {
  gcap_engine *e;
  if (t == NULL || --t->refs > 0) return;
  e = t->e;
  gcap_tensor_free(t->grad);
  if (t->grad_fn) gc_node_release(t->grad_fn);
  gc_blk_release(t->blk);
  free(t);
  gc_engine_unref(e);
}

gcap_status gc_keep_or_free(gcap_tensor **out, gcap_status st) {
  if (st != GCAP_OK) {
    gcap_tensor_free(*out);
    *out = NULL;
  }
  return st;
}

int gc_node_free_saved(gc_node *n) {
  int i, freed = 0;
  for (i = 0; i < n->nsaved; i++) {
    freed += n->saved[i] != NULL;
    gcap_tensor_free(n->saved[i]);
    n->saved[i] = NULL;
  }
  return freed;
}

/* Iterative, so that dropping a long chain cannot overflow the C stack. */
void gc_node_release(gc_node *n) {
  gc_node *todo;
  if (n == NULL || --n->refs > 0) return;
  n->free_next = NULL;
  todo = n;
  while (todo != NULL) {
    gc_node *x = todo;
    int i;
    todo = x->free_next;
    for (i = 0; i < x->nin; i++) {
      if (x->next[i] && --x->next[i]->refs == 0) {
        x->next[i]->free_next = todo;
        todo = x->next[i];
      }
      gcap_tensor_free(x->leaf[i]);
    }
    gc_node_free_saved(x);
    gcap_tensor_free(x->acc);
    if (x->ud_free) x->ud_free(x->ud);
    free(x->where);
    free(x);
  }
}

gcap_status gc_tensor_convert(gcap_tensor *t, gcap_dtype dt) {
  gcap_engine *e = t->e;
  gc_blk *b;
  gc_kargs a;
  gcap_status st;
  if (t->dt == dt) return GCAP_OK;
  if ((st = gc_check_not_capturing(e, "converting a tensor's dtype")) != GCAP_OK) return st;
  if ((st = gc_pool_alloc(e->heap, e->current, (size_t)t->numel * gc_dtype_size(dt), "to", &b)) !=
      GCAP_OK)
    return st;
  memset(&a, 0, sizeof a);
  a.p[0] = b->ptr;
  a.p[1] = gc_tensor_ptr(t);
  a.n[0] = t->numel;
  a.n[1] = t->dt;
  a.dt = (int)dt;
  if (t->numel > 0 && (st = gc_launch(e, GC_K_COPY, &a)) != GCAP_OK) {
    gc_blk_release(b);
    return st;
  }
  gc_blk_release(t->blk); /* its views keep the old storage */
  t->blk = b;
  t->off = 0;
  t->dt = dt;
  return GCAP_OK;
}

gcap_status gc_tensor_weaken(gcap_tensor *t) {
  gc_blk *w;
  if (t->blk->weak) return GCAP_OK;
  if ((w = (gc_blk *)gc_calloc(1, sizeof *w)) == NULL)
    return gc_fail(t->e, GCAP_ENOMEM, "reuse_graph_input_output_buffers: out of host memory");
  w->ptr = t->blk->ptr;
  w->size = t->blk->size;
  w->pool = t->blk->pool;
  w->stream = t->blk->stream;
  w->refs = 1;
  w->weak = 1;
  w->version = t->blk->version;
  w->pool->weak++;        /* the address must stay valid: the pool stays */
  gc_blk_release(t->blk); /* other holders of the block keep it; this tensor no longer does */
  t->blk = w;
  return GCAP_OK;
}

gcap_tensor *gc_tensor_alias(gcap_tensor *t, int ndim, const int64_t *shape) {
  gcap_tensor *a = tensor_wrap(t->e, t->blk, t->off, t->dt, ndim, shape, t->numel);
  if (a != NULL) gc_blk_retain(t->blk);
  return a;
}

gcap_tensor *gc_tensor_slice(gcap_tensor *t, int64_t first, int ndim, const int64_t *shape) {
  int64_t numel = 1;
  gcap_tensor *a;
  int d;
  for (d = 0; d < ndim; d++)
    numel *= shape[d];
  a = tensor_wrap(t->e, t->blk, t->off + (size_t)first * gc_dtype_size(t->dt), t->dt, ndim, shape,
                  numel);
  if (a != NULL) gc_blk_retain(t->blk);
  return a;
}

gcap_engine *gcap_tensor_engine(const gcap_tensor *t) {
  return t ? t->e : NULL;
}

int gcap_tensor_ndim(const gcap_tensor *t) {
  return t ? t->ndim : 0;
}

const int64_t *gcap_tensor_shape(const gcap_tensor *t) {
  return t ? t->shape : NULL;
}

int64_t gcap_tensor_numel(const gcap_tensor *t) {
  return t ? t->numel : 0;
}

gcap_dtype gcap_tensor_dtype(const gcap_tensor *t) {
  return t ? t->dt : GCAP_F32;
}

uintptr_t gcap_tensor_data_ptr(const gcap_tensor *t) {
  return t ? (uintptr_t)gc_tensor_ptr(t) : 0;
}

uint64_t gcap_tensor_version(const gcap_tensor *t) {
  return t ? t->blk->version : 0;
}

gcap_status gcap_tensor_set_version(gcap_tensor *t, uint64_t v) {
  gcap_status st;
  if (t == NULL) return GCAP_EINVAL;
  gc_clear(t->e);
  if ((st = gc_check_not_capturing(t->e, "setting a tensor's version")) != GCAP_OK) return st;
  t->blk->version = v;
  return GCAP_OK;
}

gcap_status gcap_tensor_set_(gcap_tensor *t, gcap_tensor *src, int64_t offset) {
  gcap_engine *e;
  gcap_status st;
  if ((st = gc_op_start("set_", t, "t", src)) != GCAP_OK) return st;
  e = t->e;
  if ((st = gc_operand(e, "set_", "the source src", src)) != GCAP_OK) return st;
  if (src->dt != t->dt)
    return gc_fail(e, GCAP_EINVAL, "set_: the source is %s, the tensor %s", gc_dtype_name(src->dt),
                   gc_dtype_name(t->dt));
  /* offset is any int64_t: the last element, offset + numel - 1, is written
  ** only where it cannot overflow (offset between -2^62 and the source's size) */
  if (offset < -((int64_t)1 << 62) || offset > src->numel)
    return gc_fail(e, GCAP_EINVAL,
                   "set_: offset %lld (counting from 0) is outside a source of %lld elements (the "
                   "tensor has %lld)",
                   (long long)offset, (long long)src->numel, (long long)t->numel);
  if (offset < 0 || t->numel > src->numel - offset)
    return gc_fail(
        e, GCAP_EINVAL,
        "set_: elements %lld .. %lld (counting from 0) of a source of %lld elements (the "
        "tensor has %lld), from offset %lld",
        (long long)offset, (long long)(offset + t->numel - 1), (long long)src->numel,
        (long long)t->numel, (long long)offset);
  if ((st = gc_check_not_capturing(e, "set_ (moving a tensor onto other storage)")) != GCAP_OK)
    return st;
  gc_blk_retain(src->blk); /* before the release: src may share t's block */
  gc_blk_release(t->blk);
  t->blk = src->blk;
  t->off = src->off + (size_t)offset * gc_dtype_size(t->dt);
  return GCAP_OK;
}
