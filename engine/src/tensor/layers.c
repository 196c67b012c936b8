/*
** layers.c: activations, normalization, softmax, dropout and losses,
** forward and backward. Row ops work over the last dimension.
*/
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor.h"

/* y = kernel(x) elementwise; backward: dx = bwkernel(dy, saved), the saved
** tensor x for gelu, y for relu (as PyTorch: y > 0 exactly where x > 0). */
static gcap_status act_backward(gc_node *n, gcap_tensor *g, gcap_tensor **gin) {
  gcap_tensor *x = n->saved[0], *in[2];
  gc_kargs a;
  gcap_status st;
  if ((st = gc_tensor_alloc(g->e, n->name, x->dt, x->ndim, x->shape, &gin[0])) != GCAP_OK)
    return st;
  memset(&a, 0, sizeof a);
  a.p[0] = gc_tensor_ptr(gin[0]);
  a.p[1] = gc_tensor_ptr(g);
  a.p[2] = gc_tensor_ptr(x);
  a.n[0] = x->numel;
  in[0] = g;
  in[1] = x;
  if ((st = gc_run(g->e, (int)n->k[0], &a, in, 2, gin[0])) != GCAP_OK)
    return gc_keep_or_free(&gin[0], st);
  return GCAP_OK;
}

static gcap_status activation(gcap_tensor *x, int k, int kbw, const char *op, gcap_tensor **out) {
  gcap_status st;
  gc_node *n;
  if ((st = gc_op_start_out(op, x, "x", NULL, out)) != GCAP_OK ||
      (st = gc_unary(x, k, 0.0f, op, 0, out)) != GCAP_OK)
    return st;
  if (!gc_grad_needed(x->e, &x, 1)) return GCAP_OK;
  if ((st = gc_record(*out, op, act_backward, &x, 1, k == GC_K_RELU ? out : &x, 1, &n)) != GCAP_OK)
    return gc_keep_or_free(out, st);
  n->k[0] = kbw;
  return GCAP_OK;
}

gcap_status gcap_relu(gcap_tensor *x, gcap_tensor **out) {
  return activation(x, GC_K_RELU, GC_K_RELU_BWD, "relu", out);
}

gcap_status gcap_gelu(gcap_tensor *x, gcap_tensor **out) {
  return activation(x, GC_K_GELU, GC_K_GELU_BWD, "gelu", out);
}

gcap_status gc_gelu_backward(gcap_tensor *g, gcap_tensor *x, int64_t cols, gcap_tensor **dx,
                             gcap_tensor **colsum) {
  int64_t rows = cols > 0 ? x->numel / cols : 0, chunks = GC_COLSUM_CHUNKS(rows);
  gcap_tensor *in[2], *scratch = NULL;
  gc_kargs a;
  gcap_status st;
  if (colsum) *colsum = NULL;
  if ((st = gc_tensor_alloc(g->e, "gelu backward", x->dt, x->ndim, x->shape, dx)) != GCAP_OK)
    return st;
  memset(&a, 0, sizeof a);
  if (colsum) {
    if ((st = gc_tensor_alloc(g->e, "gelu backward", x->dt, 1, &cols, colsum)) != GCAP_OK ||
        (st = gc_note_access(g->e, *colsum, 1)) != GCAP_OK)
      goto done;
    if ((st = gc_scratch(g->e, "gelu backward", chunks > 1 ? chunks * cols : 0, &scratch,
                         &a.p[4])) != GCAP_OK)
      goto done;
    a.p[3] = gc_tensor_ptr(*colsum);
  }
  a.p[0] = gc_tensor_ptr(*dx);
  a.p[1] = gc_tensor_ptr(g);
  a.p[2] = gc_tensor_ptr(x);
  a.n[0] = x->numel;
  a.n[1] = cols;
  in[0] = g;
  in[1] = x;
  st = gc_run(g->e, GC_K_GELU_BWD, &a, in, 2, *dx);
done:
  gcap_tensor_free(scratch);
  if (colsum) gc_keep_or_free(colsum, st);
  return gc_keep_or_free(dx, st);
}

/* ------------------------------------------------------------------------ */
/* layer_norm over the last dimension                                        */

static int64_t last_dim(const gcap_tensor *x) {
  return x->ndim > 0 ? x->shape[x->ndim - 1] : 1;
}

/* saved: x, weight, bias, mean, rstd */
static gcap_status ln_backward(gc_node *n, gcap_tensor *g, gcap_tensor **gin) {
  gcap_tensor *x = n->saved[0], *w = n->saved[1], *b = n->saved[2];
  gcap_tensor *mean = n->saved[3], *rstd = n->saved[4], *in[5];
  int64_t cols = last_dim(x), rows = cols > 0 ? x->numel / cols : 0;
  gc_kargs a;
  gcap_status st = GCAP_OK;
  in[0] = g;
  in[1] = x;
  in[2] = mean;
  in[3] = rstd;
  in[4] = w; /* the input's grad reads it: a graph's reads include it */
  if (gc_node_needs(n, 0)) {
    if ((st = gc_tensor_alloc(g->e, "layer_norm backward", x->dt, x->ndim, x->shape, &gin[0])) !=
        GCAP_OK)
      return st;
    memset(&a, 0, sizeof a);
    a.p[0] = gc_tensor_ptr(gin[0]);
    a.p[1] = gc_tensor_ptr(g);
    a.p[2] = gc_tensor_ptr(x);
    a.p[3] = w ? gc_tensor_ptr(w) : NULL;
    a.p[4] = gc_tensor_ptr(mean);
    a.p[5] = gc_tensor_ptr(rstd);
    a.n[0] = rows;
    a.n[1] = cols;
    if ((st = gc_run(g->e, GC_K_LAYERNORM_BWD, &a, in, w ? 5 : 4, gin[0])) != GCAP_OK) return st;
  }
  if ((w && gc_node_needs(n, 1)) || (b && gc_node_needs(n, 2))) {
    gcap_tensor *dw = NULL, *db = NULL, *scratch = NULL;
    int64_t chunks = GC_LN_PARAMS_CHUNKS(rows);
    if (w && gc_node_needs(n, 1) &&
        (st = gc_tensor_alloc(g->e, "layer_norm backward", w->dt, 1, w->shape, &dw)) != GCAP_OK)
      return st;
    if (b && gc_node_needs(n, 2) &&
        (st = gc_tensor_alloc(g->e, "layer_norm backward", b->dt, 1, b->shape, &db)) != GCAP_OK) {
      gcap_tensor_free(dw);
      return st;
    }
    memset(&a, 0, sizeof a);
    a.p[0] = dw ? gc_tensor_ptr(dw) : NULL;
    a.p[1] = db ? gc_tensor_ptr(db) : NULL;
    a.p[2] = gc_tensor_ptr(g);
    a.p[3] = gc_tensor_ptr(x);
    a.p[4] = gc_tensor_ptr(mean);
    a.p[5] = gc_tensor_ptr(rstd);
    a.n[0] = rows;
    a.n[1] = cols;
    if (dw) st = gc_note_access(g->e, dw, 1);
    if (st == GCAP_OK && db) st = gc_note_access(g->e, db, 1);
    if (st == GCAP_OK)
      st = gc_scratch(g->e, "layer_norm backward", chunks > 1 ? 2 * chunks * cols : 0, &scratch,
                      &a.p[6]);
    if (st == GCAP_OK) st = gc_run(g->e, GC_K_LAYERNORM_BWD_PARAMS, &a, in, 4, NULL);
    gcap_tensor_free(scratch);
    if (st != GCAP_OK) {
      gcap_tensor_free(dw);
      gcap_tensor_free(db);
      return st;
    }
    gin[1] = dw;
    gin[2] = db;
  }
  return st;
}

gcap_status gcap_layer_norm(gcap_tensor *x, gcap_tensor *w, gcap_tensor *b, double eps,
                            gcap_tensor **out) {
  gcap_tensor *mean = NULL, *rstd = NULL, *in[5];
  int64_t cols, rows;
  gc_kargs a;
  gcap_status st;
  if ((st = gc_op_start_out("layer_norm", x, "x", w ? w : b, out)) != GCAP_OK ||
      (w && (st = gc_operand(x->e, "layer_norm", "w", w)) != GCAP_OK) ||
      (b && (st = gc_operand(x->e, "layer_norm", "b", b)) != GCAP_OK))
    return st;
  cols = last_dim(x);
  rows = cols > 0 ? x->numel / cols : 0;
  if ((w && (w->dt != x->dt || w->ndim != 1 || w->shape[0] != cols)) ||
      (b && (b->dt != x->dt || b->ndim != 1 || b->shape[0] != cols)) || x->ndim < 1) {
    char b1[64], b2[64] = "", b3[64] = "";
    if (w) gc_shape_str(w, b2, sizeof b2);
    if (b) gc_shape_str(b, b3, sizeof b3);
    return gc_fail(x->e, GCAP_EINVAL,
                   "layer_norm: expected input [..., n] with weight and bias [n] of its dtype and "
                   "engine; got input %s %s, weight %s %s, bias %s %s",
                   gc_dtype_name(x->dt), gc_shape_str(x, b1, sizeof b1),
                   w ? gc_dtype_name(w->dt) : "none", b2, b ? gc_dtype_name(b->dt) : "none", b3);
  }
  if ((st = gc_tensor_alloc(x->e, "layer_norm", x->dt, x->ndim, x->shape, out)) != GCAP_OK)
    return st;
  if ((st = gc_tensor_alloc(x->e, "layer_norm", GCAP_F32, 1, &rows, &mean)) != GCAP_OK ||
      (st = gc_tensor_alloc(x->e, "layer_norm", GCAP_F32, 1, &rows, &rstd)) != GCAP_OK)
    goto fail;
  memset(&a, 0, sizeof a);
  a.p[0] = gc_tensor_ptr(*out);
  a.p[1] = gc_tensor_ptr(x);
  a.p[2] = w ? gc_tensor_ptr(w) : NULL;
  a.p[3] = b ? gc_tensor_ptr(b) : NULL;
  a.p[4] = gc_tensor_ptr(mean);
  a.p[5] = gc_tensor_ptr(rstd);
  a.n[0] = rows;
  a.n[1] = cols;
  a.f[0] = (float)eps;
  in[0] = x;
  in[1] = w ? w : x;
  in[2] = b ? b : x;
  if ((st = gc_note_access(x->e, mean, 1)) != GCAP_OK ||
      (st = gc_note_access(x->e, rstd, 1)) != GCAP_OK ||
      (st = gc_run(x->e, GC_K_LAYERNORM, &a, in, 3, *out)) != GCAP_OK)
    goto fail;
  in[1] = w;
  in[2] = b;
  if (gc_grad_needed(x->e, in, 3)) {
    in[3] = mean;
    in[4] = rstd;
    if ((st = gc_record(*out, "layer_norm", ln_backward, in, 3, in, 5, NULL)) != GCAP_OK) goto fail;
  }
  gcap_tensor_free(mean);
  gcap_tensor_free(rstd);
  return GCAP_OK;
fail:
  gcap_tensor_free(mean);
  gcap_tensor_free(rstd);
  return gc_keep_or_free(out, st);
}

/* ------------------------------------------------------------------------ */
/* softmax over the last dimension                                           */

/* softmax of z = scale * x (+ mask, causal) over the last dim into y, not
** recorded; flags: the mask's GC_MASK_* flags (with GC_MASK_CAUSAL). */
static gcap_status softmax_run(gcap_tensor *y, gcap_tensor *x, float scale, gcap_tensor *mask,
                               int64_t flags) {
  gcap_tensor *in[2];
  int64_t cols = last_dim(y);
  gc_kargs a;
  memset(&a, 0, sizeof a);
  a.p[0] = gc_tensor_ptr(y);
  a.p[1] = gc_tensor_ptr(x);
  a.p[2] = mask ? gc_tensor_ptr(mask) : NULL;
  a.n[0] = cols > 0 ? y->numel / cols : 0;
  a.n[1] = cols;
  a.n[2] = flags;
  a.n[3] = x->ndim >= 3 ? x->shape[x->ndim - 3] : 1; /* x as 4-D [.., n[3], n[4], cols] */
  a.n[4] = x->ndim >= 2 ? x->shape[x->ndim - 2] : 1;
  if (a.n[3] == 0 || a.n[4] == 0) return GCAP_OK; /* no rows */
  a.f[0] = scale;
  in[0] = x;
  in[1] = mask;
  return gc_run(y->e, GC_K_SOFTMAX, &a, in, mask ? 2 : 1, y);
}

/* saved: y; f[0] = the scale */
static gcap_status softmax_backward(gc_node *n, gcap_tensor *g, gcap_tensor **gin) {
  gcap_tensor *y = n->saved[0], *in[2];
  int64_t cols = last_dim(y);
  gc_kargs a;
  gcap_status st;
  if ((st = gc_tensor_alloc(g->e, "softmax backward", y->dt, y->ndim, y->shape, &gin[0])) !=
      GCAP_OK)
    return st;
  memset(&a, 0, sizeof a);
  a.p[0] = gc_tensor_ptr(gin[0]);
  a.p[1] = gc_tensor_ptr(g);
  a.p[2] = gc_tensor_ptr(y);
  a.n[0] = cols > 0 ? y->numel / cols : 0;
  a.n[1] = cols;
  a.f[0] = n->f[0];
  in[0] = g;
  in[1] = y;
  if ((st = gc_run(g->e, GC_K_SOFTMAX_BWD, &a, in, 2, gin[0])) != GCAP_OK)
    return gc_keep_or_free(&gin[0], st);
  return GCAP_OK;
}

gcap_status gcap_softmax_masked(gcap_tensor *x, double scale, gcap_tensor *mask,
                                gcap_mask_kind kind, int causal, gcap_tensor **out) {
  int64_t flags = 0;
  gc_node *n;
  gcap_status st;
  if ((st = gc_op_start_out("softmax", x, "x", mask, out)) != GCAP_OK) return st;
  if (x->ndim < (causal ? 2 : 1))
    return gc_fail(x->e, GCAP_EINVAL, "softmax: %s needs a tensor of at least %d dims, got %d-D",
                   causal ? "causal" : "a softmax", causal ? 2 : 1, x->ndim);
  if (!(fabs(scale) <= (double)FLT_MAX)) /* the kernels take it as a float */
    return gc_fail(x->e, GCAP_EINVAL, "softmax: the scale must be finite as a float, got %g",
                   scale);
  if (mask != NULL) {
    if (kind != GCAP_MASK_ADD && kind != GCAP_MASK_BOOL)
      return gc_fail(x->e, GCAP_EINVAL, "softmax: unknown mask kind %d", (int)kind);
    if ((st = gc_mask_flags(x->e, x->ndim, x->shape, mask, "softmax", "mask", &flags)) != GCAP_OK)
      return st;
    if (kind == GCAP_MASK_BOOL) flags |= GC_MASK_BOOL;
  }
  if (causal) flags |= GC_MASK_CAUSAL;
  if ((st = gc_tensor_alloc(x->e, "softmax", x->dt, x->ndim, x->shape, out)) != GCAP_OK) return st;
  if ((st = softmax_run(*out, x, (float)scale, mask, flags)) != GCAP_OK)
    return gc_keep_or_free(out, st);
  if (!gc_grad_needed(x->e, &x, 1)) return GCAP_OK;
  if ((st = gc_record(*out, "softmax", softmax_backward, &x, 1, out, 1, &n)) != GCAP_OK)
    return gc_keep_or_free(out, st);
  n->f[0] = (float)scale;
  return GCAP_OK;
}

gcap_status gcap_softmax(gcap_tensor *x, int dim, gcap_tensor **out) {
  gcap_status st;
  if ((st = gc_op_start_out("softmax", x, "x", NULL, out)) != GCAP_OK) return st;
  if (x->ndim < 1 || (dim != -1 && dim != x->ndim - 1))
    return gc_fail(x->e, GCAP_EINVAL,
                   "softmax: only the last dimension is supported (dim -1 or %d), got dim %d of a "
                   "%d-D tensor",
                   x->ndim - 1, dim, x->ndim);
  return gcap_softmax_masked(x, 1.0, NULL, GCAP_MASK_ADD, 0, out);
}

/* ------------------------------------------------------------------------ */
/* dropout: the mask is drawn from the engine's generator (seed and offset in */
/* device memory), so eager and replayed graphs agree and replays advance.   */

static gcap_status dropout_backward(gc_node *n, gcap_tensor *g, gcap_tensor **gin) {
  return gc_binary(g, n->saved[0], GC_K_MUL, "dropout backward", &gin[0]);
}

gcap_status gcap_dropout(gcap_tensor *x, double p, int training, gcap_tensor **out) {
  gcap_tensor *mask = NULL;
  gcap_engine *e;
  gc_kargs a;
  gcap_status st;
  if ((st = gc_op_start_out("dropout", x, "x", NULL, out)) != GCAP_OK) return st;
  e = x->e;
  if (!(p >= 0.0 && p <= 1.0))
    return gc_fail(e, GCAP_EINVAL, "dropout: probability must be in [0, 1], got %g", p);
  if (!training || p == 0.0) { /* identity: a view that keeps the graph */
    if ((*out = gc_tensor_alias(x, x->ndim, x->shape)) == NULL)
      return gc_fail(e, GCAP_ENOMEM, "dropout: out of host memory");
    (*out)->view = 1;
    return gc_view_record(x, *out) == GCAP_OK ? GCAP_OK : gc_keep_or_free(out, GCAP_ENOMEM);
  }
  if ((st = gc_tensor_alloc(e, "dropout", x->dt, x->ndim, x->shape, out)) != GCAP_OK) return st;
  if ((st = gc_tensor_alloc(e, "dropout", x->dt, x->ndim, x->shape, &mask)) != GCAP_OK) goto fail;
  memset(&a, 0, sizeof a);
  a.p[0] = gc_tensor_ptr(*out);
  a.p[1] = gc_tensor_ptr(x);
  a.p[2] = gc_tensor_ptr(mask);
  a.p[3] = e->rng->ptr;
  a.n[0] = x->numel;
  a.f[0] = (float)p;
  if ((st = gc_note_access(e, mask, 1)) != GCAP_OK ||
      (st = gc_run(e, GC_K_DROPOUT, &a, &x, 1, *out)) != GCAP_OK)
    goto fail;
  if ((st = gc_rng_advance(e, x->numel)) != GCAP_OK) goto fail;
  if (gc_grad_needed(e, &x, 1) &&
      (st = gc_record(*out, "dropout", dropout_backward, &x, 1, &mask, 1, NULL)) != GCAP_OK)
    goto fail;
  gcap_tensor_free(mask);
  return GCAP_OK;
fail:
  gcap_tensor_free(mask);
  return gc_keep_or_free(out, st);
}

/* ------------------------------------------------------------------------ */
/* Losses                                                                    */

gcap_status gcap_mse_loss(gcap_tensor *input, gcap_tensor *target, gcap_tensor **out) {
  gcap_tensor *d = NULL, *sq = NULL;
  gcap_status st;
  int i, same;
  if ((st = gc_op_start_out("mse_loss", input, "input", target, out)) != GCAP_OK ||
      (st = gc_operand(input->e, "mse_loss", "target", target)) != GCAP_OK)
    return st;
  if (target->dt != input->dt)
    return gc_fail(input->e, GCAP_EINVAL,
                   "mse_loss: input and target must be of one dtype (got %s and %s)",
                   gc_dtype_name(input->dt), gc_dtype_name(target->dt));
  same = input->ndim == target->ndim;
  for (i = 0; same && i < input->ndim; i++)
    same = input->shape[i] == target->shape[i];
  if (!same) {
    char b1[64], b2[64];
    return gc_fail(input->e, GCAP_EINVAL,
                   "mse_loss: input %s and target %s must have the same shape",
                   gc_shape_str(input, b1, sizeof b1), gc_shape_str(target, b2, sizeof b2));
  }
  /* mean((input - target)^2), recorded through the elementwise ops */
  if ((st = gcap_sub(input, target, &d)) == GCAP_OK && (st = gcap_mul(d, d, &sq)) == GCAP_OK)
    st = gcap_mean(sq, out);
  gcap_tensor_free(d);
  gcap_tensor_free(sq);
  return st;
}

/* saved: probs, targets */
static gcap_status xent_backward(gc_node *n, gcap_tensor *g, gcap_tensor **gin) {
  gcap_tensor *probs = n->saved[0], *tgt = n->saved[1], *in[3];
  gc_kargs a;
  gcap_status st;
  if ((st = gc_tensor_alloc(g->e, "cross_entropy backward", probs->dt, probs->ndim, probs->shape,
                            &gin[0])) != GCAP_OK)
    return st;
  memset(&a, 0, sizeof a);
  a.p[0] = gc_tensor_ptr(gin[0]);
  a.p[1] = gc_tensor_ptr(probs);
  a.p[2] = gc_tensor_ptr(tgt);
  a.p[3] = gc_tensor_ptr(g);
  a.n[0] = probs->shape[0];
  a.n[1] = probs->shape[1];
  a.f[0] = n->f[0];
  in[0] = probs;
  in[1] = tgt;
  in[2] = g;
  if ((st = gc_run(g->e, GC_K_XENT_BWD, &a, in, 3, gin[0])) != GCAP_OK)
    return gc_keep_or_free(&gin[0], st);
  return GCAP_OK;
}

gcap_status gc_check_ids(gcap_tensor *ids, int64_t count, const char *op, const char *what,
                         const char *want) {
  gcap_engine *e = ids->e;
  float *v;
  int64_t i;
  gcap_status st;
  if (e->cap != NULL || ids->numel == 0) return GCAP_OK;
  if ((v = (float *)gc_malloc((size_t)ids->numel * sizeof *v)) == NULL)
    return gc_fail(e, GCAP_ENOMEM, "%s: out of host memory", op);
  if ((st = gcap_tensor_read(ids, v, (size_t)ids->numel)) != GCAP_OK) {
    free(v);
    return st;
  }
  for (i = 0; i < ids->numel; i++)
    if (!(v[i] >= 0.0f && v[i] < (float)count && v[i] == floorf(v[i]))) {
      char val[32];
      snprintf(val, sizeof val, v[i] != v[i] ? "NaN" : "%g", (double)v[i]);
      st = gc_fail(e, GCAP_EINVAL,
                   "%s: %s %lld (counting from 1) is %s, not %s (an integer in 0..%lld)", op, what,
                   (long long)i + 1, val, want, (long long)count - 1);
      break;
    }
  free(v);
  return st;
}

/* logits [N, C]; target [N] of class indices stored as floats; mean over N. */
gcap_status gcap_cross_entropy(gcap_tensor *logits, gcap_tensor *target, gcap_tensor **out) {
  gcap_tensor *probs = NULL, *rows = NULL, *in[2];
  gcap_engine *e;
  gc_kargs a;
  gcap_status st;
  gc_node *n;
  if ((st = gc_op_start_out("cross_entropy", logits, "logits", target, out)) != GCAP_OK ||
      (st = gc_operand(logits->e, "cross_entropy", "target", target)) != GCAP_OK)
    return st;
  e = logits->e;
  if (logits->ndim != 2 || target->ndim != 1 || target->shape[0] != logits->shape[0] ||
      target->dt != logits->dt) {
    char b1[64], b2[64];
    return gc_fail(e, GCAP_EINVAL,
                   "cross_entropy: expected logits [N, C] and target [N] (class indices) of one "
                   "dtype; got %s %s and %s %s%s",
                   gc_dtype_name(logits->dt), gc_shape_str(logits, b1, sizeof b1),
                   gc_dtype_name(target->dt), gc_shape_str(target, b2, sizeof b2),
                   target->dt != logits->dt && logits->dt == GCAP_BF16
                       ? " (bf16 holds integers exactly only up to 256: take the loss of the "
                         "logits converted to f32, logits:float() in Lua)"
                       : "");
  }
  if ((st = gc_check_ids(target, logits->shape[1], "cross_entropy", "the target of row",
                         "a class id")) != GCAP_OK)
    return st;
  if ((st = gc_tensor_alloc(e, "cross_entropy", logits->dt, 2, logits->shape, &probs)) != GCAP_OK ||
      (st = gc_tensor_alloc(e, "cross_entropy", logits->dt, 1, logits->shape, &rows)) != GCAP_OK)
    goto done;
  memset(&a, 0, sizeof a);
  a.p[0] = gc_tensor_ptr(rows);
  a.p[1] = gc_tensor_ptr(logits);
  a.p[2] = gc_tensor_ptr(target);
  a.p[3] = gc_tensor_ptr(probs);
  a.n[0] = logits->shape[0];
  a.n[1] = logits->shape[1];
  a.p[4] = gc_badid_site(e, &a.n[2]); /* in a graph the targets are checked by the kernel */
  in[0] = logits;
  in[1] = target;
  if ((st = gc_note_access(e, probs, 1)) != GCAP_OK ||
      (st = gc_run(e, GC_K_XENT, &a, in, 2, rows)) != GCAP_OK)
    goto done;
  if ((st = gc_unary(rows, GC_K_SUM, rows->numel > 0 ? 1.0f / (float)rows->numel : NAN,
                     "cross_entropy", 1, out)) != GCAP_OK)
    goto done;
  if (gc_grad_needed(e, &logits, 1)) {
    in[0] = probs;
    in[1] = target;
    if ((st = gc_record(*out, "cross_entropy", xent_backward, &logits, 1, in, 2, &n)) != GCAP_OK) {
      gc_keep_or_free(out, st);
      goto done;
    }
    n->f[0] = rows->numel > 0 ? 1.0f / (float)rows->numel : NAN;
  }
done:
  gcap_tensor_free(probs);
  gcap_tensor_free(rows);
  return st;
}
