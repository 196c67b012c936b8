/*
** linalg.c: matmul and linear, forward and backward, and the wgrad sink a
** Linear's linear nodes send their parameter grads to. Matrices are row-major;
** the backends take op(A) op(B) with transpose flags (cuda maps this to
** column-major cuBLAS in one place).
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor.h"

/* C[m x n] = alpha op(A) op(B) + beta C (+ bias row); C allocated as `shape`
** when *c is NULL; bgrad (may be NULL): the sums over k of op(A)'s rows;
** pre (may be NULL): receives that result while C receives its gelu. */
static gcap_status mm_ex(gcap_tensor *A, int ta, gcap_tensor *B, int tb, int64_t m, int64_t n,
                         int64_t k, float alpha, float beta, gcap_tensor *bias, gcap_tensor *bgrad,
                         gcap_tensor *pre, int ndim, const int64_t *shape, gcap_tensor **c) {
  gcap_tensor *in[4];
  gc_kargs a;
  gcap_status st = GCAP_OK;
  int fresh = *c == NULL, nin = 2;
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
  if (bias) in[nin++] = bias;
  if (beta != 0.0f && !fresh) in[nin++] = *c; /* C is read too */
  a.p[3] = bias ? gc_tensor_ptr(bias) : NULL;
  a.p[4] = bgrad ? gc_tensor_ptr(bgrad) : NULL;
  a.p[5] = pre ? gc_tensor_ptr(pre) : NULL;
  if (bgrad) st = gc_note_access(A->e, bgrad, 1);
  if (pre && st == GCAP_OK) st = gc_note_access(A->e, pre, 1);
  if (st == GCAP_OK) st = gc_run(A->e, GC_K_MATMUL, &a, in, nin, *c);
  if (st != GCAP_OK && fresh) {
    gcap_tensor_free(*c);
    *c = NULL;
  }
  return st;
}

static gcap_status mm(gcap_tensor *A, int ta, gcap_tensor *B, int tb, int64_t m, int64_t n,
                      int64_t k, float alpha, float beta, int ndim, const int64_t *shape,
                      gcap_tensor **c) {
  return mm_ex(A, ta, B, tb, m, n, k, alpha, beta, NULL, NULL, NULL, ndim, shape, c);
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
static gcap_status linear_wgrad(gcap_tensor *g, gcap_tensor *x, gcap_tensor *w, gcap_tensor *b,
                                gcap_tensor **gw, gcap_tensor **gb) {
  int64_t out = w->shape[0], in = w->shape[1], rows = out > 0 ? g->numel / out : 0;
  gcap_status st = GCAP_OK;
  if (gw && gb && b) {
    if ((st = gc_tensor_alloc(g->e, "linear backward", b->dt, b->ndim, b->shape, gb)) != GCAP_OK)
      return st;
    if ((st = mm_ex(g, 1, x, 0, out, in, rows, 1.0f, 0.0f, NULL, *gb, NULL, 2, w->shape, gw)) !=
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

/* The weight grad g^T x added into main_grad (beta = 1). */
static gcap_status wgrad_into(gcap_tensor *g, gcap_tensor *x, gcap_tensor *main_grad) {
  int64_t out = main_grad->shape[0], in = main_grad->shape[1], rows = out > 0 ? g->numel / out : 0;
  if (main_grad->dt != g->dt)
    return gc_fail(g->e, GCAP_EINVAL, "Linear backward: main_grad is %s, the grads are %s",
                   gc_dtype_name(main_grad->dt), gc_dtype_name(g->dt));
  return mm(g, 1, x, 0, out, in, rows, 1.0f, 1.0f, 2, main_grad->shape, &main_grad);
}

gcap_status gc_linear_param_grads(gcap_tensor *g, gcap_tensor *x, gcap_tensor *w, gcap_tensor *b,
                                  gcap_tensor *main_grad, gcap_tensor *db, gcap_tensor **gw,
                                  gcap_tensor **gb) {
  gcap_status st = GCAP_OK;
  if (gw != NULL && main_grad != NULL) { /* fused: the GEMM accumulates, no grad to return */
    st = wgrad_into(g, x, main_grad);
    gw = NULL;
  }
  if (st == GCAP_OK && gb != NULL && db != NULL) { /* summed by the gelu's backward */
    if ((*gb = gc_tensor_alias(db, b->ndim, b->shape)) == NULL)
      st = gc_fail(g->e, GCAP_ENOMEM, "linear backward: out of host memory");
    gb = NULL;
  }
  if (st == GCAP_OK && (gw != NULL || gb != NULL))
    st = linear_wgrad(g, x, w, gb != NULL ? b : NULL, gw, gb);
  return st;
}

/* ------------------------------------------------------------------------ */
/* Wgrad sinks                                                               */

gcap_status gc_wgrad_sink_new(gcap_engine *e, int delay, gcap_tensor *main_grad,
                              gc_wgrad_sink **out) {
  gc_wgrad_sink *s = (gc_wgrad_sink *)gc_calloc(1, sizeof *s);
  *out = NULL;
  if (s == NULL) return gc_fail(e, GCAP_ENOMEM, "Linear: out of host memory");
  s->refs = 1;
  s->delay = delay;
  s->main_grad = gcap_tensor_retain(main_grad);
  *out = s;
  return GCAP_OK;
}

gc_wgrad_sink *gc_wgrad_sink_retain(gc_wgrad_sink *s) {
  s->refs++;
  return s;
}

void gc_wgrad_queue_free(gc_wgrad_queue *q) {
  int i;
  for (i = 0; i < q->n; i++)
    gcap_tensor_free(q->v[i]);
  free(q->v);
  q->v = NULL;
  q->n = q->cap = 0;
}

void gc_wgrad_sink_release(gc_wgrad_sink *s) {
  if (s == NULL || --s->refs > 0) return;
  gc_wgrad_queue_free(&s->q);
  gcap_tensor_free(s->main_grad);
  free(s);
}

/* Queue (g, x) for a later backward_dw of s's Linear, with its bias grad
** when already computed (gb; NULL: backward_dw does it). */
static gcap_status wgrad_defer(gc_wgrad_sink *s, gcap_tensor *g, gcap_tensor *x, gcap_tensor *gb) {
  gc_wgrad_queue *q = &s->q;
  if (q->n + 3 > q->cap) {
    int cap = q->cap ? 2 * q->cap : 8;
    gcap_tensor **v = (gcap_tensor **)gc_realloc(q->v, (size_t)cap * sizeof *v);
    if (v == NULL) return gc_fail(g->e, GCAP_ENOMEM, "Linear: out of host memory");
    q->v = v;
    q->cap = cap;
  }
  q->v[q->n++] = gcap_tensor_retain(g);
  q->v[q->n++] = gcap_tensor_retain(x);
  q->v[q->n++] = gcap_tensor_retain(gb);
  return GCAP_OK;
}

/* saved: x, w, b; linear_gelu adds the pre-activation z = x W^T + b. */
static gcap_status linear_backward(gc_node *n, gcap_tensor *g, gcap_tensor **gin) {
  gcap_tensor *x = n->saved[0], *w = n->saved[1], *b = n->saved[2], *dz = NULL, *db = NULL;
  int64_t out = w->shape[0], in = w->shape[1], rows = out > 0 ? g->numel / out : 0;
  /* a delayed-wgrad Linear computes its grads in backward_dw; a fused one
  ** accumulates the weight's into its main_grad */
  int delayed = n->wgrad != NULL && n->wgrad->delay;
  int want_db = b != NULL && (delayed || gc_node_needs(n, 2));
  gcap_status st = GCAP_OK;
  if (n->nsaved > 3) { /* through the gelu first: dz = g gelu'(z), and the bias grad with it */
    if ((st = gc_gelu_backward(g, n->saved[3], out, &dz, want_db ? &db : NULL)) != GCAP_OK)
      return st;
    g = dz;
  }
  if (gc_node_needs(n, 0))
    st = mm(g, 0, w, 0, rows, in, out, 1.0f, 0.0f, x->ndim, x->shape, &gin[0]);
  if (st != GCAP_OK) goto done;
  if (delayed) /* with the bias grad, when the gelu's backward made it */
    st = wgrad_defer(n->wgrad, g, x, db);
  else
    st = gc_linear_param_grads(g, x, w, b, n->wgrad != NULL ? n->wgrad->main_grad : NULL, db,
                               gc_node_needs(n, 1) ? &gin[1] : NULL, want_db ? &gin[2] : NULL);
done:
  gcap_tensor_free(dz);
  gcap_tensor_free(db);
  return st;
}

/* y = x W^T + b, or its gelu with `gelu` (one GEMM whose epilogue keeps the
** pre-activation for the backward). */
static gcap_status linear_act(gcap_tensor *x, gcap_tensor *w, gcap_tensor *b, int gelu,
                              gcap_tensor **out) {
  gcap_tensor *in[4], *pre = NULL;
  int64_t shape[GCAP_MAXDIM], rows;
  const char *op = gelu ? "linear_gelu" : "linear";
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
  if (gelu && (st = gc_tensor_alloc(x->e, op, x->dt, x->ndim, shape, &pre)) != GCAP_OK) return st;
  st = mm_ex(x, 0, w, 1, rows, w->shape[0], w->shape[1], 1.0f, 0.0f, b, NULL, pre, x->ndim, shape,
             out); /* the bias (and the gelu) ride on the GEMM */
  if (st != GCAP_OK) goto fail;
  in[0] = x;
  in[1] = w;
  in[2] = b;
  in[3] = pre;
  if (!gc_grad_needed(x->e, in, 3)) goto done;
  if ((st = gc_record(*out, op, linear_backward, in, 3, in, gelu ? 4 : 3, NULL)) != GCAP_OK)
    goto fail;
done:
  gcap_tensor_free(pre);
  return GCAP_OK;
fail:
  gcap_tensor_free(pre);
  gcap_tensor_free(*out);
  *out = NULL;
  return st;
}

gcap_status gc_linear(gcap_tensor *x, gcap_tensor *w, gcap_tensor *b, gcap_tensor **out) {
  return linear_act(x, w, b, 0, out);
}

gcap_status gc_linear_gelu(gcap_tensor *x, gcap_tensor *w, gcap_tensor *b, gcap_tensor **out) {
  return linear_act(x, w, b, 1, out);
}

gcap_status gcap_linear(gcap_tensor *x, gcap_tensor *w, gcap_tensor *b, gcap_tensor **out) {
  return gc_linear(x, w, b, out);
}

gcap_status gcap_linear_gelu(gcap_tensor *x, gcap_tensor *w, gcap_tensor *b, gcap_tensor **out) {
  return gc_linear_gelu(x, w, b, out);
}
