/*
** ops.c: tensor ops. Each op checks its operands (engine, dtype, shape) and
** says what it expected, allocates its result on the current stream, and
** launches one kernel, its reads and writes noted (launch.c).
*/
#include <math.h>
#include <string.h>

#include "tensor.h"

static gcap_status same_engine(gcap_tensor *a, gcap_tensor *b, const char *op) {
  if (a->e != b->e)
    return gc_fail(a->e, GCAP_EINVAL, "%s: the operands belong to different engines", op);
  if (a->dt != b->dt)
    return gc_fail(a->e, GCAP_EINVAL, "%s: dtypes differ (%s and %s); convert one with copy_", op,
                   gc_dtype_name(a->dt), gc_dtype_name(b->dt));
  return GCAP_OK;
}

/* ------------------------------------------------------------------------ */
/* In-place writes, as autograd sees them                                    */

/* The launch of a fill (src NULL, value f) or copy of src into t. */
static gcap_status write_run(gcap_tensor *t, gcap_tensor *src, float f) {
  gc_kargs a;
  memset(&a, 0, sizeof a);
  a.p[0] = gc_tensor_ptr(t);
  a.n[0] = t->numel;
  a.f[0] = f;
  if (src == NULL) return gc_run(t->e, GC_K_FILL, &a, NULL, 0, t);
  a.p[1] = gc_tensor_ptr(src);
  a.n[1] = src->dt;
  return gc_run(t->e, GC_K_COPY, &a, &src, 1, t);
}

gcap_status gc_copy(gcap_tensor *dst, gcap_tensor *src) {
  return write_run(dst, src, 0.0f);
}

/* The backward of an in-place write (PyTorch's CopyBackwards, FillBackward):
** the old values of the written tensor (input 0) are gone, so its history
** gets zeros; a copy's source (input 1) gets g, as its shape and dtype. */
static gcap_status write_backward(gc_node *n, gcap_tensor *g, gcap_tensor **gin) {
  const gc_meta *m = n->nin > 1 ? &n->meta[1] : NULL;
  gcap_status st = GCAP_OK;
  if (gc_node_needs(n, 0) &&
      (st = gc_tensor_alloc(g->e, "backward", g->dt, g->ndim, g->shape, &gin[0])) == GCAP_OK)
    st = write_run(gin[0], NULL, 0.0f);
  if (st != GCAP_OK || m == NULL || !gc_node_needs(n, 1)) return st;
  if (m->dt == g->dt) {
    if ((gin[1] = gc_tensor_alias(g, m->ndim, m->shape)) == NULL)
      return gc_fail(g->e, GCAP_ENOMEM, "backward: out of host memory");
    return GCAP_OK;
  }
  if ((st = gc_tensor_alloc(g->e, "backward", m->dt, m->ndim, m->shape, &gin[1])) != GCAP_OK)
    return st;
  return write_run(gin[1], g, 0.0f); /* the caller frees gin[1] on failure */
}

/* The in-place write `op` of t (from src; NULL: a fill with v), recorded
** first when autograd must see it: t's new node takes t's old history and
** src, and a failed launch takes the record back, so t is as it was. A view
** is refused there (PyTorch would give the tensor it views a new history). */
static gcap_status write_(gcap_tensor *t, gcap_tensor *src, double v, const char *op) {
  gcap_tensor *in[2];
  gc_node *old = t->grad_fn, *n;
  int nin = src ? 2 : 1, was = t->requires_grad;
  gcap_status st;
  in[0] = t;
  in[1] = src;
  if (!gc_grad_needed(t->e, in, nin)) return write_run(t, src, (float)v);
  if (t->view)
    return gc_fail(t->e, GCAP_EINVAL,
                   "%s: autograd cannot record an in-place write into a view (the tensor it views "
                   "would keep its history): write that tensor itself, or write under no_grad",
                   op);
  if ((st = gc_record(t, op, write_backward, in, nin, NULL, 0, &n)) != GCAP_OK) return st;
  if ((st = write_run(t, src, (float)v)) != GCAP_OK) {
    t->grad_fn = old;
    t->requires_grad = was;
    gc_node_release(n);
    return st;
  }
  gc_node_release(old); /* t's reference to its old history: n holds one */
  return GCAP_OK;
}

gcap_status gcap_fill_(gcap_tensor *t, double v) {
  gcap_status st;
  if ((st = gc_op_start("fill_", t, "t", NULL)) != GCAP_OK ||
      (st = gc_check_inplace(t, "fill_")) != GCAP_OK)
    return st;
  return write_(t, NULL, v, "fill_");
}

gcap_status gcap_zero_(gcap_tensor *t) {
  gcap_status st;
  if ((st = gc_op_start("zero_", t, "t", NULL)) != GCAP_OK ||
      (st = gc_check_inplace(t, "zero_")) != GCAP_OK)
    return st;
  return write_(t, NULL, 0.0, "zero_");
}

gcap_status gcap_copy_(gcap_tensor *dst, gcap_tensor *src) {
  gcap_status st;
  if ((st = gc_op_start("copy_", dst, "dst", src)) != GCAP_OK ||
      (st = gc_check_inplace(dst, "copy_")) != GCAP_OK ||
      (st = gc_operand(dst->e, "copy_", "src", src)) != GCAP_OK)
    return st;
  if (src->numel != dst->numel) {
    char b1[64], b2[64];
    return gc_fail(dst->e, GCAP_EINVAL,
                   "copy_: source %s has %lld elements, destination %s has %lld",
                   gc_shape_str(src, b1, sizeof b1), (long long)src->numel,
                   gc_shape_str(dst, b2, sizeof b2), (long long)dst->numel);
  }
  return write_(dst, src, 0.0, "copy_");
}

/* The broadcast rule (docs/semantics.md, "Tensors, broadcasting and autograd"):
** equal shapes, a one-element operand, or a row matching the other's last
** dimension. *big is the operand whose shape the result takes. */
static gcap_status bcast(gcap_tensor *a, gcap_tensor *b, const char *op, gcap_tensor **big) {
  char b1[64], b2[64];
  int i, same = a->ndim == b->ndim;
  for (i = 0; same && i < a->ndim; i++)
    same = a->shape[i] == b->shape[i];
  if (same) {
    *big = a;
    return GCAP_OK;
  }
  if (b->numel == 1 && (a->numel != 1 || a->ndim >= b->ndim)) {
    *big = a;
    return GCAP_OK;
  }
  if (a->numel == 1) {
    *big = b;
    return GCAP_OK;
  }
  if (b->ndim >= 1 && a->ndim >= 1 && b->numel == b->shape[b->ndim - 1] &&
      b->shape[b->ndim - 1] == a->shape[a->ndim - 1] && b->ndim <= a->ndim) {
    *big = a;
    return GCAP_OK;
  }
  if (a->ndim >= 1 && b->ndim >= 1 && a->numel == a->shape[a->ndim - 1] &&
      a->shape[a->ndim - 1] == b->shape[b->ndim - 1] && a->ndim <= b->ndim) {
    *big = b;
    return GCAP_OK;
  }
  return gc_fail(a->e, GCAP_EINVAL,
                 "%s: shapes %s and %s do not broadcast (expected equal shapes, a one-element "
                 "operand, or a row the size of the other's last dimension)",
                 op, gc_shape_str(a, b1, sizeof b1), gc_shape_str(b, b2, sizeof b2));
}

gcap_status gc_binary_as(gcap_tensor *x, gcap_tensor *y, int k, const char *op, gcap_dtype dt,
                         int64_t arg, gcap_tensor **out) {
  gcap_tensor *big = NULL, *in[2];
  gc_kargs a;
  gcap_status st;
  *out = NULL;
  if ((st = same_engine(x, y, op)) != GCAP_OK || (st = bcast(x, y, op, &big)) != GCAP_OK) return st;
  if ((st = gc_tensor_alloc(x->e, op, dt, big->ndim, big->shape, out)) != GCAP_OK) return st;
  memset(&a, 0, sizeof a);
  a.p[0] = gc_tensor_ptr(*out);
  a.p[1] = gc_tensor_ptr(x);
  a.p[2] = gc_tensor_ptr(y);
  a.n[0] = (*out)->numel;
  a.n[1] = x->numel;
  a.n[2] = y->numel;
  a.n[3] = x->dt; /* read by a comparison, with its code */
  a.n[4] = arg;
  in[0] = x;
  in[1] = y;
  return gc_keep_or_free(out, gc_run(x->e, k, &a, in, 2, *out));
}

gcap_status gc_binary(gcap_tensor *x, gcap_tensor *y, int k, const char *op, gcap_tensor **out) {
  return gc_binary_as(x, y, k, op, x->dt, 0, out);
}

/* dst = dst OP y in place (y: same numel, one element, or a row). */
gcap_status gc_binary_inplace(gcap_tensor *dst, gcap_tensor *y, int k, const char *op) {
  gcap_tensor *in[2];
  gc_kargs a;
  gcap_status st;
  if ((st = same_engine(dst, y, op)) != GCAP_OK) return st;
  if (y->numel != dst->numel && y->numel != 1 &&
      !(dst->ndim >= 1 && y->numel == dst->shape[dst->ndim - 1])) {
    char b1[64], b2[64];
    return gc_fail(dst->e, GCAP_EINVAL, "%s: %s does not broadcast to %s", op,
                   gc_shape_str(y, b1, sizeof b1), gc_shape_str(dst, b2, sizeof b2));
  }
  memset(&a, 0, sizeof a);
  a.p[0] = a.p[1] = gc_tensor_ptr(dst);
  a.p[2] = gc_tensor_ptr(y);
  a.n[0] = a.n[1] = dst->numel;
  a.n[2] = y->numel;
  in[0] = dst;
  in[1] = y;
  return gc_run(dst->e, k, &a, in, 2, dst);
}

/* out = f * x[i % n(x)] broadcast to shape (grad of sum, mean, broadcasts). */
gcap_status gc_expand(gcap_tensor *x, int ndim, const int64_t *shape, float f, gcap_tensor **out) {
  gc_kargs a;
  gcap_status st;
  if ((st = gc_tensor_alloc(x->e, "expand", x->dt, ndim, shape, out)) != GCAP_OK) return st;
  memset(&a, 0, sizeof a);
  a.p[0] = gc_tensor_ptr(*out);
  a.p[1] = gc_tensor_ptr(x);
  a.n[0] = (*out)->numel;
  a.n[1] = x->numel > 0 ? x->numel : 1;
  a.f[0] = f;
  return gc_keep_or_free(out, gc_run(x->e, GC_K_EXPAND, &a, &x, 1, *out));
}

gcap_status gc_scratch(gcap_engine *e, const char *op, int64_t n, gcap_tensor **t, void **p) {
  gcap_status st;
  *t = NULL;
  *p = NULL;
  if (n <= 0) return GCAP_OK;
  if ((st = gc_tensor_alloc(e, op, GCAP_F32, 1, &n, t)) != GCAP_OK ||
      (st = gc_note_access(e, *t, 1)) != GCAP_OK)
    return gc_keep_or_free(t, st);
  *p = gc_tensor_ptr(*t);
  return GCAP_OK;
}

/* out[j] = sum over rows of x viewed as [numel / cols, cols]; many rows sum
** in chunks (a scratch of partial sums). */
gcap_status gc_sum_rows(gcap_tensor *x, int64_t cols, gcap_tensor **out) {
  int64_t rows = cols > 0 ? x->numel / cols : 0, chunks = GC_SUM_ROWS_CHUNKS(rows);
  gcap_tensor *scratch = NULL;
  gc_kargs a;
  gcap_status st;
  if ((st = gc_tensor_alloc(x->e, "sum_rows", x->dt, 1, &cols, out)) != GCAP_OK) return st;
  memset(&a, 0, sizeof a);
  if ((st = gc_scratch(x->e, "sum_rows", chunks > 1 ? chunks * cols : 0, &scratch, &a.p[2])) !=
      GCAP_OK)
    goto done;
  a.p[0] = gc_tensor_ptr(*out);
  a.p[1] = gc_tensor_ptr(x);
  a.n[0] = rows;
  a.n[1] = cols;
  st = gc_run(x->e, GC_K_SUM_ROWS, &a, &x, 1, *out);
done:
  gcap_tensor_free(scratch);
  return gc_keep_or_free(out, st);
}

gcap_status gc_reduce_to(gcap_tensor *g, const gc_meta *t, gcap_tensor **out) {
  gcap_tensor *r = NULL;
  gcap_status st = GCAP_OK;
  if (g->numel == t->numel)
    r = gcap_tensor_retain(g);
  else if (t->numel == 1)
    st = gc_unary(g, GC_K_SUM, 1.0f, "sum", 1, &r);
  else
    st = gc_sum_rows(g, t->numel, &r);
  if (r == NULL) return st;
  *out = gc_tensor_alias(r, t->ndim, t->shape);
  gcap_tensor_free(r);
  return *out ? GCAP_OK : gc_fail(g->e, GCAP_ENOMEM, "backward: out of host memory");
}

/* add and sub read no operand: only their shapes */
static gcap_status add_backward(gc_node *n, gcap_tensor *g, gcap_tensor **gin) {
  gcap_status st = GCAP_OK;
  gcap_tensor *neg = NULL;
  if (gc_node_needs(n, 0)) st = gc_reduce_to(g, &n->meta[0], &gin[0]);
  if (st == GCAP_OK && gc_node_needs(n, 1)) {
    if (n->k[0] == GC_K_SUB) {
      if ((st = gc_unary(g, GC_K_SCALE, -1.0f, "neg", 0, &neg)) != GCAP_OK) return st;
      g = neg;
    }
    st = gc_reduce_to(g, &n->meta[1], &gin[1]);
  }
  gcap_tensor_free(neg);
  return st;
}

/* saved[i]: operand i, kept only when the other operand needs its grad */
static gcap_status mul_backward(gc_node *n, gcap_tensor *g, gcap_tensor **gin) {
  gcap_status st = GCAP_OK;
  int i;
  for (i = 0; i < 2 && st == GCAP_OK; i++) {
    gcap_tensor *p;
    if (!gc_node_needs(n, i)) continue;
    if ((st = gc_binary(g, n->saved[1 - i], GC_K_MUL, "mul backward", &p)) != GCAP_OK) break;
    st = gc_reduce_to(p, &n->meta[i], &gin[i]);
    gcap_tensor_free(p);
  }
  return st;
}

static gcap_status binary(gcap_tensor *x, gcap_tensor *y, int k, const char *op,
                          gcap_tensor **out) {
  gcap_tensor *in[2], *save[2];
  gc_node *n;
  gcap_status st;
  if ((st = gc_op_start_out(op, x, "a", y, out)) != GCAP_OK ||
      (st = gc_operand(x->e, op, "b", y)) != GCAP_OK ||
      (st = gc_binary(x, y, k, op, out)) != GCAP_OK)
    return st;
  in[0] = x;
  in[1] = y;
  if (!gc_grad_needed(x->e, in, 2)) return GCAP_OK;
  save[0] = y->requires_grad ? x : NULL; /* what the other's grad reads */
  save[1] = x->requires_grad ? y : NULL;
  st = k == GC_K_MUL ? gc_record(*out, op, mul_backward, in, 2, save, 2, &n)
                     : gc_record(*out, op, add_backward, in, 2, NULL, 0, &n);
  if (st == GCAP_OK)
    n->k[0] = k;
  else {
    gcap_tensor_free(*out);
    *out = NULL;
  }
  return st;
}

gcap_status gcap_add(gcap_tensor *a, gcap_tensor *b, gcap_tensor **out) {
  return binary(a, b, GC_K_ADD, "add", out);
}

gcap_status gcap_sub(gcap_tensor *a, gcap_tensor *b, gcap_tensor **out) {
  return binary(a, b, GC_K_SUB, "sub", out);
}

gcap_status gcap_mul(gcap_tensor *a, gcap_tensor *b, gcap_tensor **out) {
  return binary(a, b, GC_K_MUL, "mul", out);
}

/* One input, one kernel, no recording. scalar_out: a 0-D result. */
gcap_status gc_unary(gcap_tensor *x, int k, float f, const char *op, int scalar_out,
                     gcap_tensor **out) {
  int64_t chunks = k == GC_K_SUM ? GC_SUM_CHUNKS(x->numel) : 1;
  gcap_tensor *scratch = NULL;
  gc_kargs a;
  gcap_status st;
  if ((st = gc_tensor_alloc(x->e, op, x->dt, scalar_out ? 0 : x->ndim, x->shape, out)) != GCAP_OK)
    return st;
  memset(&a, 0, sizeof a); /* a long sum: partial sums of its chunks first */
  if ((st = gc_scratch(x->e, op, chunks > 1 ? chunks : 0, &scratch, &a.p[2])) != GCAP_OK) goto done;
  a.p[0] = gc_tensor_ptr(*out);
  a.p[1] = gc_tensor_ptr(x);
  a.n[0] = x->numel;
  a.f[0] = f;
  st = gc_run(x->e, k, &a, &x, 1, *out);
done:
  gcap_tensor_free(scratch);
  return gc_keep_or_free(out, st);
}

static gcap_status scale_backward(gc_node *n, gcap_tensor *g, gcap_tensor **gin) {
  return gc_unary(g, GC_K_SCALE, n->f[0], "scale backward", 0, &gin[0]);
}

/* sum and mean: the grad is g (one element) spread over the input's shape. */
static gcap_status sum_backward(gc_node *n, gcap_tensor *g, gcap_tensor **gin) {
  return gc_expand(g, n->meta[0].ndim, n->meta[0].shape, n->f[0], &gin[0]);
}

static gcap_status unary(gcap_tensor *x, int k, float f, const char *op, int scalar_out,
                         gc_backward_fn bw, gcap_tensor **out) {
  gc_node *n;
  gcap_status st;
  if ((st = gc_op_start_out(op, x, "a", NULL, out)) != GCAP_OK ||
      (st = gc_unary(x, k, f, op, scalar_out, out)) != GCAP_OK)
    return st;
  if (!gc_grad_needed(x->e, &x, 1)) return GCAP_OK;
  if ((st = gc_record(*out, op, bw, &x, 1, NULL, 0, &n)) == GCAP_OK) /* x's values unread */
    n->f[0] = f;
  else {
    gcap_tensor_free(*out);
    *out = NULL;
  }
  return gc_keep_or_free(out, st);
}

gcap_status gcap_scale(gcap_tensor *a, double s, gcap_tensor **out) {
  return unary(a, GC_K_SCALE, (float)s, "scale", 0, scale_backward, out);
}

gcap_status gcap_neg(gcap_tensor *a, gcap_tensor **out) {
  return unary(a, GC_K_SCALE, -1.0f, "neg", 0, scale_backward, out);
}

gcap_status gcap_sum(gcap_tensor *a, gcap_tensor **out) {
  return unary(a, GC_K_SUM, 1.0f, "sum", 1, sum_backward, out);
}

gcap_status gcap_mean(gcap_tensor *a, gcap_tensor **out) {
  float f = a && a->numel > 0 ? 1.0f / (float)a->numel : NAN;
  return unary(a, GC_K_SUM, f, "mean", 1, sum_backward, out);
}

gcap_status gcap_tensor_full(gcap_engine *e, gcap_dtype dt, int ndim, const int64_t *shape,
                             double v, gcap_tensor **out) {
  gcap_status st;
  if (out != NULL) *out = NULL;
  if (e == NULL) return GCAP_EINVAL;
  gc_clear(e);
  if (out == NULL) return gc_null(e, "full", "out");
  if ((st = gc_tensor_alloc(e, "full", dt, ndim, shape, out)) != GCAP_OK) return st;
  return gc_keep_or_free(out, gcap_fill_(*out, v));
}

/* clone's grad is g (PyTorch's CloneBackward) */
static gcap_status clone_backward(gc_node *n, gcap_tensor *g, gcap_tensor **gin) {
  (void)n;
  gin[0] = gcap_tensor_retain(g);
  return GCAP_OK;
}

gcap_status gcap_tensor_clone(gcap_tensor *t, gcap_tensor **out) {
  gcap_status st;
  if ((st = gc_op_start_out("clone", t, "t", NULL, out)) != GCAP_OK) return st;
  if ((st = gc_tensor_alloc(t->e, "clone", t->dt, t->ndim, t->shape, out)) != GCAP_OK) return st;
  if ((st = gc_copy(*out, t)) == GCAP_OK && gc_grad_needed(t->e, &t, 1))
    st = gc_record(*out, "clone", clone_backward, &t, 1, NULL, 0, NULL);
  if (st != GCAP_OK) {
    gcap_tensor_free(*out);
    *out = NULL;
  }
  return st;
}

gcap_status gcap_tensor_rand(gcap_engine *e, gcap_dtype dt, int ndim, const int64_t *shape,
                             int normal, gcap_tensor **out) {
  gc_kargs a;
  gcap_status st;
  if (out != NULL) *out = NULL;
  if (e == NULL) return GCAP_EINVAL;
  gc_clear(e);
  if (out == NULL) return gc_null(e, normal ? "randn" : "rand", "out");
  if ((st = gc_tensor_alloc(e, normal ? "randn" : "rand", dt, ndim, shape, out)) != GCAP_OK)
    return st;
  memset(&a, 0, sizeof a);
  a.p[0] = gc_tensor_ptr(*out);
  a.p[1] = e->rng->ptr;
  a.n[0] = (*out)->numel;
  a.n[1] = normal != 0;
  if ((st = gc_run(e, GC_K_RAND, &a, NULL, 0, *out)) == GCAP_OK)
    st = gc_rng_advance(e, (*out)->numel);
  return gc_keep_or_free(out, st);
}
