/*
** linalg.c: matmul and linear, forward and backward; a linear node with a
** wgrad sink (wgrad.c) sends its parameter grads there. Matrices are row-major;
** the backends take op(A) op(B) with transpose flags (cuda maps this to
** column-major cuBLAS in one place).
*/
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
  return fresh ? gc_keep_or_free(c, st) : st;
}

static gcap_status mm(gcap_tensor *A, int ta, gcap_tensor *B, int tb, int64_t m, int64_t n,
                      int64_t k, float alpha, float beta, int ndim, const int64_t *shape,
                      gcap_tensor **c) {
  return mm_ex(A, ta, B, tb, m, n, k, alpha, beta, NULL, NULL, NULL, ndim, shape, c);
}

static gcap_status same_dtype(gcap_tensor *a, gcap_tensor *b, const char *op) {
  if (a->dt != b->dt)
    return gc_fail(a->e, GCAP_EINVAL, "%s: dtypes differ (%s and %s)", op, gc_dtype_name(a->dt),
                   gc_dtype_name(b->dt));
  return GCAP_OK;
}

/* ------------------------------------------------------------------------ */
/* matmul: op(A) op(B) over batch dims that broadcast                        */

/* A product's batch: out's batch dims and each operand's (right-aligned,
** padded with leading 1s to 2), and the matrices' sizes. */
typedef struct mm_batch {
  int nb;           /* out's batch dims (0 to 2) */
  int64_t ob[2];    /* out's */
  int64_t xb[2][2]; /* A's and B's */
  int64_t m, n, k;  /* op(A) is m x k, op(B) k x n */
} mm_batch;

/* The batch layout of op(A) op(B) for operands of shapes A and B, or an
** error naming op. */
static gcap_status mm_plan(gcap_engine *e, const gc_meta *A, int ta, const gc_meta *B, int tb,
                           const char *op, mm_batch *bt) {
  char b1[64], b2[64];
  const gc_meta *x[2];
  int i, d, ok = A->ndim >= 2 && B->ndim >= 2;
  x[0] = A, x[1] = B;
  if (ok) {
    bt->m = A->shape[A->ndim - (ta ? 1 : 2)];
    bt->k = A->shape[A->ndim - (ta ? 2 : 1)];
    bt->n = B->shape[B->ndim - (tb ? 2 : 1)];
    ok = B->shape[B->ndim - (tb ? 1 : 2)] == bt->k;
  }
  for (i = 0; ok && i < 2; i++)
    for (d = 0; d < 2; d++) {
      int at = x[i]->ndim - 4 + d; /* the batch dim aligned with d, if any */
      bt->xb[i][d] = at >= 0 ? x[i]->shape[at] : 1;
    }
  for (d = 0; ok && d < 2; d++) {
    int64_t a = bt->xb[0][d], b = bt->xb[1][d];
    ok = a == b || a == 1 || b == 1;
    bt->ob[d] = a == 1 ? b : a;
  }
  if (ok) {
    bt->nb = (A->ndim > B->ndim ? A->ndim : B->ndim) - 2;
    return GCAP_OK;
  }
  gc_dims_str(A->ndim, A->shape, b1, sizeof b1);
  gc_dims_str(B->ndim, B->shape, b2, sizeof b2);
  if (A->ndim == 2 && B->ndim == 2)
    return gc_fail(e, GCAP_EINVAL, "%s: expected [m, k] x [k, n], got %s x %s", op, b1, b2);
  return gc_fail(e, GCAP_EINVAL,
                 "%s: expected [..., m, k] x [..., k, n] with batch dims that broadcast, got %s "
                 "x %s",
                 op, b1, b2);
}

/* mm_plan of tensors A and B. */
static gcap_status mm_plan_of(gcap_tensor *A, int ta, gcap_tensor *B, int tb, const char *op,
                              mm_batch *bt) {
  gc_meta a, b;
  gc_meta_of(A, &a);
  gc_meta_of(B, &b);
  return mm_plan(A->e, &a, ta, &b, tb, op, bt);
}

/* C = op(A) op(B) (not recorded), C of out's batch and [m, n]: one strided
** launch when each operand is one matrix or a whole batch, else one per
** index of the first batch dim. */
static gcap_status bmm(gcap_tensor *A, int ta, gcap_tensor *B, int tb, const mm_batch *bt,
                       gcap_tensor **c) {
  int64_t shape[GCAP_MAXDIM], mat[2], all = bt->ob[0] * bt->ob[1], i, launches = 1;
  size_t es = gc_dtype_size(A->dt);
  gcap_tensor *in[2];
  int whole[2], one[2], j;
  gc_kargs a;
  gcap_status st = GCAP_OK;
  for (j = 0; j < bt->nb; j++)
    shape[j] = bt->ob[2 - bt->nb + j];
  shape[bt->nb] = bt->m;
  shape[bt->nb + 1] = bt->n;
  if ((st = gc_tensor_alloc(A->e, "matmul", A->dt, bt->nb + 2, shape, c)) != GCAP_OK) return st;
  mat[0] = bt->m * bt->k, mat[1] = bt->k * bt->n;
  for (j = 0; j < 2; j++) {
    one[j] = bt->xb[j][0] * bt->xb[j][1] == 1;
    whole[j] = bt->xb[j][0] * bt->xb[j][1] == all;
    if (!one[j] && !whole[j]) launches = bt->ob[0];
  }
  in[0] = A, in[1] = B;
  for (i = 0; i < launches && st == GCAP_OK; i++) {
    memset(&a, 0, sizeof a);
    a.n[0] = bt->m, a.n[1] = bt->n, a.n[2] = bt->k, a.n[3] = ta, a.n[4] = tb;
    a.n[5] = launches > 1 ? bt->ob[1] : all;
    a.f[0] = 1.0f;
    a.p[0] = (char *)gc_tensor_ptr(*c) + (size_t)(i * a.n[5] * bt->m * bt->n) * es;
    for (j = 0; j < 2; j++) {
      int64_t off = 0, stride = one[j] ? 0 : mat[j];
      if (launches > 1) { /* per index of the first batch dim: along the second */
        off = bt->xb[j][0] == 1 ? 0 : i * bt->xb[j][1] * mat[j];
        stride = bt->xb[j][1] == 1 ? 0 : mat[j];
      }
      a.p[1 + j] = (char *)gc_tensor_ptr(in[j]) + (size_t)off * es;
      a.n[6 + j] = stride;
    }
    st = gc_run(A->e, GC_K_MATMUL, &a, in, 2, *c);
  }
  return gc_keep_or_free(c, st);
}

/* The grad g of a product's operand of shape x, computed over out's whole
** batch, summed over the batch dims where x has 1 (GC_K_SUM_MID), as x's
** shape. */
static gcap_status batch_reduce(gcap_tensor *g, const gc_meta *x, const mm_batch *bt, int which,
                                gcap_tensor **out) {
  int64_t mat = x->shape[x->ndim - 2] * x->shape[x->ndim - 1], dims[2], len;
  gcap_tensor *cur = gcap_tensor_retain(g);
  gcap_status st = GCAP_OK;
  int d;
  dims[0] = bt->ob[0], dims[1] = bt->ob[1];
  for (d = 0; d < 2 && st == GCAP_OK; d++) {
    gcap_tensor *r = NULL;
    gc_kargs a;
    if (bt->xb[which][d] != 1 || dims[d] == 1) continue;
    len = (d == 0 ? 1 : dims[0]) * (d == 0 ? dims[1] : 1) * mat;
    if ((st = gc_tensor_alloc(g->e, "matmul backward", g->dt, 1, &len, &r)) != GCAP_OK) break;
    memset(&a, 0, sizeof a);
    a.p[0] = gc_tensor_ptr(r);
    a.p[1] = gc_tensor_ptr(cur);
    a.n[0] = d == 0 ? 1 : dims[0];
    a.n[1] = dims[d];
    a.n[2] = d == 0 ? dims[1] * mat : mat;
    st = gc_run(g->e, GC_K_SUM_MID, &a, &cur, 1, r);
    gcap_tensor_free(cur);
    cur = r;
    dims[d] = 1;
  }
  if (st == GCAP_OK && (*out = gc_tensor_alias(cur, x->ndim, x->shape)) == NULL)
    st = gc_fail(g->e, GCAP_ENOMEM, "matmul backward: out of host memory");
  gcap_tensor_free(cur);
  return st;
}

/* saved: A when B needs its grad, B when A does; k[0] = ta, k[1] = tb. dA
** and dB are products of g with the other operand (transposed as each
** operand's flag says), reduced over the batch dims it was broadcast along. */
static gcap_status matmul_backward(gc_node *n, gcap_tensor *g, gcap_tensor **gin) {
  gcap_tensor *A = n->saved[0], *B = n->saved[1], *full = NULL;
  int ta = (int)n->k[0], tb = (int)n->k[1];
  mm_batch fw, bt;
  gcap_status st = GCAP_OK;
  if ((st = mm_plan(g->e, &n->meta[0], ta, &n->meta[1], tb, "matmul backward", &fw)) != GCAP_OK)
    return st;
  if (gc_node_needs(n, 0)) {
    st = ta ? mm_plan_of(B, tb, g, 1, "matmul backward", &bt)
            : mm_plan_of(g, 0, B, !tb, "matmul backward", &bt);
    if (st == GCAP_OK) st = ta ? bmm(B, tb, g, 1, &bt, &full) : bmm(g, 0, B, !tb, &bt, &full);
    if (st == GCAP_OK) st = batch_reduce(full, &n->meta[0], &fw, 0, &gin[0]);
    gcap_tensor_free(full);
    full = NULL;
  }
  if (st == GCAP_OK && gc_node_needs(n, 1)) {
    st = tb ? mm_plan_of(g, 1, A, ta, "matmul backward", &bt)
            : mm_plan_of(A, !ta, g, 0, "matmul backward", &bt);
    if (st == GCAP_OK) st = tb ? bmm(g, 1, A, ta, &bt, &full) : bmm(A, !ta, g, 0, &bt, &full);
    if (st == GCAP_OK) st = batch_reduce(full, &n->meta[1], &fw, 1, &gin[1]);
    gcap_tensor_free(full);
  }
  return st;
}

gcap_status gc_matmul(gcap_tensor *a, int ta, gcap_tensor *b, int tb, gcap_tensor **out) {
  gcap_tensor *in[2], *save[2];
  mm_batch bt;
  gc_node *n;
  gcap_status st;
  if ((st = gc_op_start_out("matmul", a, "a", b, out)) != GCAP_OK ||
      (st = gc_operand(a->e, "matmul", "b", b)) != GCAP_OK ||
      (st = same_dtype(a, b, "matmul")) != GCAP_OK ||
      (st = mm_plan_of(a, ta, b, tb, "matmul", &bt)) != GCAP_OK ||
      (st = bmm(a, ta, b, tb, &bt, out)) != GCAP_OK)
    return st;
  in[0] = a;
  in[1] = b;
  if (!gc_grad_needed(a->e, in, 2)) return GCAP_OK;
  save[0] = b->requires_grad ? a : NULL; /* what the other's grad reads */
  save[1] = a->requires_grad ? b : NULL;
  if ((st = gc_record(*out, "matmul", matmul_backward, in, 2, save, 2, &n)) != GCAP_OK) {
    gcap_tensor_free(*out);
    *out = NULL;
    return st;
  }
  n->k[0] = ta;
  n->k[1] = tb;
  return GCAP_OK;
}

gcap_status gcap_matmul(gcap_tensor *a, gcap_tensor *b, gcap_tensor **out) {
  return gc_matmul(a, 0, b, 0, out);
}

/* ------------------------------------------------------------------------ */
/* linear: y = x W^T + b, x [..., in] seen as [rows, in], W [out, in].      */

/* Weight and bias grads of a linear of weight [out, in]: gw = g^T x and gb =
** sum_rows(g) (NULL: not wanted), in one GEMM when both are wanted (the
** bias grad rides on the weight grad's GEMM). */
static gcap_status linear_wgrad(gcap_tensor *g, gcap_tensor *x, int64_t out, int64_t in,
                                gcap_tensor **gw, gcap_tensor **gb) {
  int64_t rows = out > 0 ? g->numel / out : 0, wshape[2];
  gcap_status st = GCAP_OK;
  wshape[0] = out, wshape[1] = in;
  if (gw && gb) {
    if ((st = gc_tensor_alloc(g->e, "linear backward", g->dt, 1, &out, gb)) != GCAP_OK) return st;
    if ((st = mm_ex(g, 1, x, 0, out, in, rows, 1.0f, 0.0f, NULL, *gb, NULL, 2, wshape, gw)) !=
        GCAP_OK) {
      gcap_tensor_free(*gb);
      *gb = NULL;
    }
    return st;
  }
  if (gw) st = mm(g, 1, x, 0, out, in, rows, 1.0f, 0.0f, 2, wshape, gw);
  if (st == GCAP_OK && gb) st = gc_sum_rows(g, out, gb);
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

gcap_status gc_linear_param_grads(gcap_tensor *g, gcap_tensor *x, int64_t out, int64_t in,
                                  gcap_tensor *main_grad, gcap_tensor *db, gcap_tensor **gw,
                                  gcap_tensor **gb) {
  gcap_status st = GCAP_OK;
  if (gw != NULL && main_grad != NULL) { /* fused: the GEMM accumulates, no grad to return */
    st = wgrad_into(g, x, main_grad);
    gw = NULL;
  }
  if (st == GCAP_OK && gb != NULL && db != NULL) { /* summed by the gelu's backward */
    *gb = gcap_tensor_retain(db);
    gb = NULL;
  }
  if (st == GCAP_OK && (gw != NULL || gb != NULL)) st = linear_wgrad(g, x, out, in, gw, gb);
  return st;
}

/* saved: x when the weight needs its grad, w when x does (the bias: never);
** linear_gelu adds the pre-activation z = x W^T + b. */
static gcap_status linear_backward(gc_node *n, gcap_tensor *g, gcap_tensor **gin) {
  gcap_tensor *x = n->saved[0], *w = n->saved[1], *dz = NULL, *db = NULL;
  const gc_meta *xm = &n->meta[0];
  int64_t out = n->meta[1].shape[0], in = n->meta[1].shape[1], rows = out > 0 ? g->numel / out : 0;
  /* a delayed-wgrad Linear computes its grads in backward_dw; a fused one
  ** accumulates the weight's into its main_grad */
  gc_wgrad_sink *sink = (gc_wgrad_sink *)n->ud;
  int delayed = sink != NULL && sink->delay, bias = n->meta[2].numel > 0;
  int want_db = bias && (delayed || gc_node_needs(n, 2));
  gcap_status st = GCAP_OK;
  if (n->nsaved > 2) { /* through the gelu first: dz = g gelu'(z), and the bias grad with it */
    if ((st = gc_gelu_backward(g, n->saved[2], out, &dz, want_db ? &db : NULL)) != GCAP_OK)
      return st;
    g = dz;
  }
  if (gc_node_needs(n, 0))
    st = mm(g, 0, w, 0, rows, in, out, 1.0f, 0.0f, xm->ndim, xm->shape, &gin[0]);
  if (st != GCAP_OK) goto done;
  if (delayed) /* with the bias grad, when the gelu's backward made it */
    st = gc_wgrad_defer(sink, g, x, db);
  else
    st = gc_linear_param_grads(g, x, out, in, sink != NULL ? sink->main_grad : NULL, db,
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
  gcap_tensor *in[3], *save[3], *pre = NULL;
  int64_t shape[GCAP_MAXDIM], rows;
  const char *op = gelu ? "linear_gelu" : "linear";
  gcap_status st;
  if ((st = gc_op_start_out(op, x, "x", w ? w : b, out)) != GCAP_OK ||
      (st = gc_operand(x->e, op, "w", w)) != GCAP_OK ||
      (b && (st = gc_operand(x->e, op, "b", b)) != GCAP_OK) ||
      (st = same_dtype(x, w, op)) != GCAP_OK || (b && (st = same_dtype(x, b, op)) != GCAP_OK))
    return st;
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
  if (!gc_grad_needed(x->e, in, 3)) goto done;
  save[0] = w->requires_grad ? x : NULL; /* what the other's grad reads */
  save[1] = x->requires_grad ? w : NULL;
  save[2] = pre;
  if ((st = gc_record(*out, op, linear_backward, in, 3, save, gelu ? 3 : 2, NULL)) != GCAP_OK)
    goto fail;
done:
  gcap_tensor_free(pre);
  return GCAP_OK;
fail:
  gcap_tensor_free(pre);
  return gc_keep_or_free(out, st);
}

gcap_status gc_linear(gcap_tensor *x, gcap_tensor *w, gcap_tensor *b, gcap_tensor **out) {
  return linear_act(x, w, b, 0, out);
}

gcap_status gc_linear_gemm(gcap_tensor *x, gcap_tensor *w, gcap_tensor *b, gcap_tensor *pre,
                           gcap_tensor **out) {
  int64_t shape[GCAP_MAXDIM],
      rows = x->shape[x->ndim - 1] > 0 ? x->numel / x->shape[x->ndim - 1] : 0;
  memcpy(shape, x->shape, sizeof shape);
  shape[x->ndim - 1] = w->shape[0];
  *out = NULL;
  return mm_ex(x, 0, w, 1, rows, w->shape[0], w->shape[1], 1.0f, 0.0f, b, NULL, pre, x->ndim, shape,
               out);
}

gcap_status gc_linear_dgrad(gcap_tensor *g, gcap_tensor *w, int ndim, const int64_t *xshape,
                            gcap_tensor **dx) {
  int64_t out = w->shape[0], in = w->shape[1], rows = out > 0 ? g->numel / out : 0;
  *dx = NULL;
  return mm(g, 0, w, 0, rows, in, out, 1.0f, 0.0f, ndim, xshape, dx);
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
