/*
** linalg.c: matmul and linear, forward and backward. Matrices are row-major;
** the backends take op(A) op(B) with transpose flags (cuda maps this to
** column-major cuBLAS in one place).
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* C[m x n] = alpha op(A) op(B) + beta C (+ bias row); C allocated as `shape`
** when *c is NULL; bgrad (may be NULL): the sums over k of op(A)'s rows. */
static gcap_status mm_ex(gcap_tensor *A, int ta, gcap_tensor *B, int tb, int64_t m, int64_t n,
                         int64_t k, float alpha, float beta, gcap_tensor *bias, gcap_tensor *bgrad,
                         int ndim, const int64_t *shape, gcap_tensor **c) {
  gcap_tensor *in[3];
  gc_kargs a;
  gcap_status st = GCAP_OK;
  int fresh = *c == NULL;
  if (fresh && (st = gc_tensor_alloc(A->e, "matmul", A->dt, ndim, shape, c)) != GCAP_OK) return st;
  memset(&a, 0, sizeof a);
  a.p[0] = gc_tensor_ptr(*c);
  a.p[1] = gc_tensor_ptr(A);
  a.p[2] = gc_tensor_ptr(B);
  a.n[0] = m;
  a.n[1] = n;
  a.n[2] = k;
  a.n[3] = ta;
  a.n[4] = tb;
  a.f[0] = alpha;
  a.f[1] = beta;
  in[0] = A;
  in[1] = B;
  in[2] = bias;
  a.p[3] = bias ? gc_tensor_ptr(bias) : NULL;
  a.p[4] = bgrad ? gc_tensor_ptr(bgrad) : NULL;
  if (bgrad) st = gc_note_access(A->e, bgrad, 1);
  if (st == GCAP_OK) st = gc_run(A->e, GC_K_MATMUL, &a, in, bias ? 3 : 2, *c);
  if (st != GCAP_OK && fresh) {
    gcap_tensor_free(*c);
    *c = NULL;
  }
  return st;
}

static gcap_status mm(gcap_tensor *A, int ta, gcap_tensor *B, int tb, int64_t m, int64_t n,
                      int64_t k, float alpha, float beta, int ndim, const int64_t *shape,
                      gcap_tensor **c) {
  return mm_ex(A, ta, B, tb, m, n, k, alpha, beta, NULL, NULL, ndim, shape, c);
}

static gcap_status mm_check(gcap_tensor *a, gcap_tensor *b, const char *op) {
  if (a == NULL || b == NULL) return GCAP_EINVAL;
  gc_clear(a->e);
  if (a->e != b->e)
    return gc_fail(a->e, GCAP_EINVAL, "%s: the operands belong to different engines", op);
  if (a->dt != b->dt)
    return gc_fail(a->e, GCAP_EINVAL, "%s: dtypes differ (%s and %s)", op, gc_dtype_name(a->dt),
                   gc_dtype_name(b->dt));
  return GCAP_OK;
}

static gcap_status matmul_backward(gc_node *n, gcap_tensor *g, gcap_tensor **gin) {
  gcap_tensor *a = n->saved[0], *b = n->saved[1];
  int64_t m = a->shape[0], k = a->shape[1], nn = b->shape[1];
  gcap_status st = GCAP_OK;
  if (gc_node_needs(n, 0)) st = mm(g, 0, b, 1, m, k, nn, 1.0f, 0.0f, 2, a->shape, &gin[0]);
  if (st == GCAP_OK && gc_node_needs(n, 1))
    st = mm(a, 1, g, 0, k, nn, m, 1.0f, 0.0f, 2, b->shape, &gin[1]);
  return st;
}

gcap_status gcap_matmul(gcap_tensor *a, gcap_tensor *b, gcap_tensor **out) {
  gcap_tensor *in[2];
  int64_t shape[2];
  gcap_status st;
  if (out == NULL) return GCAP_EINVAL;
  *out = NULL;
  if ((st = mm_check(a, b, "matmul")) != GCAP_OK) return st;
  if (a->ndim != 2 || b->ndim != 2 || a->shape[1] != b->shape[0]) {
    char b1[64], b2[64];
    return gc_fail(a->e, GCAP_EINVAL, "matmul: expected [m, k] x [k, n], got %s x %s",
                   gc_shape_str(a, b1, sizeof b1), gc_shape_str(b, b2, sizeof b2));
  }
  shape[0] = a->shape[0];
  shape[1] = b->shape[1];
  if ((st = mm(a, 0, b, 0, shape[0], shape[1], a->shape[1], 1.0f, 0.0f, 2, shape, out)) != GCAP_OK)
    return st;
  in[0] = a;
  in[1] = b;
  if (gc_grad_needed(a->e, in, 2) &&
      (st = gc_record(*out, "matmul", matmul_backward, in, 2, in, 2, NULL)) != GCAP_OK) {
    gcap_tensor_free(*out);
    *out = NULL;
  }
  return st;
}

/* ------------------------------------------------------------------------ */
/* linear: y = x W^T + b, x [..., in] seen as [rows, in], W [out, in].      */

/* Weight and bias grads: gw = g^T x and gb = sum_rows(g), in one GEMM when
** both are wanted (the bias grad rides on the weight grad's GEMM). */
gcap_status gc_linear_wgrad(gcap_tensor *g, gcap_tensor *x, gcap_tensor *w, gcap_tensor *b,
                            gcap_tensor **gw, gcap_tensor **gb) {
  int64_t out = w->shape[0], in = w->shape[1], rows = out > 0 ? g->numel / out : 0;
  gcap_status st = GCAP_OK;
  if (gw && gb && b) {
    if ((st = gc_tensor_alloc(g->e, "linear backward", b->dt, b->ndim, b->shape, gb)) != GCAP_OK)
      return st;
    if ((st = mm_ex(g, 1, x, 0, out, in, rows, 1.0f, 0.0f, NULL, *gb, 2, w->shape, gw)) !=
        GCAP_OK) {
      gcap_tensor_free(*gb);
      *gb = NULL;
    }
    return st;
  }
  if (gw) st = mm(g, 1, x, 0, out, in, rows, 1.0f, 0.0f, 2, w->shape, gw);
  if (st == GCAP_OK && gb && b) {
    gcap_tensor *r;
    if ((st = gc_sum_rows(g, out, &r)) == GCAP_OK) {
      *gb = gc_tensor_alias(r, b->ndim, b->shape);
      gcap_tensor_free(r);
      if (*gb == NULL) st = gc_fail(g->e, GCAP_ENOMEM, "linear backward: out of host memory");
    }
  }
  return st;
}

static gcap_status linear_backward(gc_node *n, gcap_tensor *g, gcap_tensor **gin) {
  gcap_tensor *x = n->saved[0], *w = n->saved[1], *b = n->saved[2];
  int64_t out = w->shape[0], in = w->shape[1], rows = out > 0 ? g->numel / out : 0;
  gcap_status st = GCAP_OK;
  if (gc_node_needs(n, 0))
    st = mm(g, 0, w, 0, rows, in, out, 1.0f, 0.0f, x->ndim, x->shape, &gin[0]);
  if (st != GCAP_OK) return st;
  if (n->ud != NULL) /* delayed wgrad: the module computes them in backward_dw */
    return gc_wgrad_defer(n->ud, g, x);
  return gc_linear_wgrad(g, x, w, b, gc_node_needs(n, 1) ? &gin[1] : NULL,
                         gc_node_needs(n, 2) ? &gin[2] : NULL);
}

gcap_status gc_linear(gcap_tensor *x, gcap_tensor *w, gcap_tensor *b, gcap_tensor **out) {
  gcap_tensor *in[3];
  int64_t shape[GCAP_MAXDIM], rows;
  gcap_status st;
  if (out == NULL) return GCAP_EINVAL;
  *out = NULL;
  if ((st = mm_check(x, w, "linear")) != GCAP_OK) return st;
  if (b != NULL && (st = mm_check(x, b, "linear")) != GCAP_OK) return st;
  if (x->ndim < 1 || w->ndim != 2 || x->shape[x->ndim - 1] != w->shape[1] ||
      (b != NULL && (b->ndim != 1 || b->shape[0] != w->shape[0]))) {
    char b1[64], b2[64], b3[64] = "none";
    if (b) gc_shape_str(b, b3, sizeof b3);
    return gc_fail(x->e, GCAP_EINVAL,
                   "linear: expected input [..., in], weight [out, in], bias [out]; got input %s, "
                   "weight %s, bias %s",
                   gc_shape_str(x, b1, sizeof b1), gc_shape_str(w, b2, sizeof b2), b3);
  }
  memcpy(shape, x->shape, sizeof shape);
  shape[x->ndim - 1] = w->shape[0];
  rows = x->shape[x->ndim - 1] > 0 ? x->numel / x->shape[x->ndim - 1] : 0;
  st = mm_ex(x, 0, w, 1, rows, w->shape[0], w->shape[1], 1.0f, 0.0f, b, NULL, x->ndim, shape,
             out); /* the bias rides on the GEMM */
  if (st != GCAP_OK) goto fail;
  in[0] = x;
  in[1] = w;
  in[2] = b;
  if (!gc_grad_needed(x->e, in, 3)) return GCAP_OK;
  if ((st = gc_record(*out, "linear", linear_backward, in, 3, in, 3, NULL)) != GCAP_OK) goto fail;
  return GCAP_OK;
fail:
  gcap_tensor_free(*out);
  *out = NULL;
  return st;
}

gcap_status gcap_linear(gcap_tensor *x, gcap_tensor *w, gcap_tensor *b, gcap_tensor **out) {
  return gc_linear(x, w, b, out);
}
