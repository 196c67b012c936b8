/*
** fp8_linear.c: the GEMMs of the FP8-capable modules (Linear,
** LayerNormLinear, LayerNormMLP) under an FP8 autocast, as
** TransformerEngine runs them: the input and the weight quantized to E4M3
** with their roles' scales (their amaxes noted), the backward's grad to
** E5M2 under HYBRID (E4M3 otherwise); with DelayedScaling each pass then
** updates its roles (one kernel, after the amaxes' all-reduce over the
** amax_reduction_group). The GEMMs are FP8 GEMMs (GC_K_FP8_GEMM: cuBLASLt's
** on cuda; on the host the f32 GEMM of the dequantized values, the
** reference) over operands laid out as they take them, each row holding the
** summed dim, as TE's: the forward's x and w as quantized; the dgrad's
** grad as quantized (padded) and w transposed; the wgrad's grad and x
** transposed. Each transpose comes from its operand's quantize launch (TE's
** cast-transpose), and the node saves the transposes the backward reads.
** The bias grad comes from the unquantized grad, as TE's: summed by the
** grad's cast-transpose (TE's cast_transpose_dbias). A delayed wgrad
** queues the wgrad GEMM's FP8 operands, and backward_dw runs that GEMM: the
** grads of the immediate one.
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "train.h"

/* What an FP8 linear's backward needs of its forward. */
typedef struct fp8_ctx {
  gc_fp8_meta *meta; /* DelayedScaling: the module's state (a reference); else NULL */
  int gemm, gelu;
  gcap_fp8_recipe recipe;
  gcap_dist_group *group;
  gc_wgrad_sink *sink; /* a reference, or NULL */
  char who[GC_NAMELEN];
} fp8_ctx;

static void ctx_free(void *ud) {
  fp8_ctx *c = (fp8_ctx *)ud;
  gc_fp8_meta_release(c->meta);
  gc_wgrad_sink_release(c->sink);
  free(c);
}

/* Role r (0 input, 1 weight, 2 grad_output) of c's GEMM: its format. */
static gcap_fp8_format role_format(const fp8_ctx *c, int r) {
  return r == 2 && c->recipe.fp8_format == GCAP_FP8_HYBRID ? GCAP_FP8_E5M2 : GCAP_FP8_E4M3;
}

/* TE's shapes of an FP8 GEMM operand: the product of the dims but the last
** a multiple of 8, the last a multiple of 16. */
static gcap_status check_dims(gcap_engine *e, const char *who, const char *what, gcap_tensor *t) {
  int64_t last = t->ndim > 0 ? t->shape[t->ndim - 1] : 1, lead = last > 0 ? t->numel / last : 0;
  char b[64];
  if (t->ndim >= 1 && lead % 8 == 0 && last % 16 == 0) return GCAP_OK;
  return gc_fail(e, GCAP_EINVAL,
                 "%s: FP8 execution requires the product of all dimensions except the last to "
                 "be divisible by 8 and the last dimension to be divisible by 16, but got %s "
                 "with dims=%s (product of leading dims = %lld, last dim = %lld)",
                 who, what, gc_shape_str(t, b, sizeof b), (long long)lead, (long long)last);
}

/* The all-reduce (max) of the amaxes `amax` over c's group. */
static gcap_status reduce_amax(fp8_ctx *c, gcap_engine *e, gcap_tensor *amax) {
  if (c->group == NULL) return GCAP_OK;
  if (e->fp8_all_reduce == NULL)
    return gc_fail(e, GCAP_ESTATE,
                   "%s: the FP8 amax_reduction_group needs the distributed runtime, which is not "
                   "initialised (any more)",
                   c->who);
  return e->fp8_all_reduce(amax, c->group);
}

/* DelayedScaling's pass end for roles r0 .. r0 + n - 1: their amaxes
** reduced over the group, then the update kernel. */
static gcap_status update_roles(fp8_ctx *c, int r0, int n) {
  gc_fp8_meta *m = c->meta;
  float scaled[3];
  gcap_tensor *amax;
  gcap_status st;
  int j;
  if (m == NULL) return GCAP_OK;
  if ((amax = gc_elems(m->state, r0, n)) == NULL)
    return gc_fail(m->state->e, GCAP_ENOMEM, "%s: out of host memory", c->who);
  st = reduce_amax(c, m->state->e, amax);
  gcap_tensor_free(amax);
  for (j = 0; j < n; j++)
    scaled[j] =
        GC_FP8_MAX(role_format(c, r0 - 3 * c->gemm + j)) * powf(2.0f, -(float)c->recipe.margin);
  if (st == GCAP_OK)
    st = gc_fp8_update(m->state, 3 * m->gemms, m->len, r0, n,
                       c->recipe.amax_compute_algo == GCAP_AMAX_MOST_RECENT, scaled);
  return st;
}

/* q = x quantized as role r of c's GEMM (q allocated unless it holds data
** already: a cached weight), skip the flag of a cached weight (NULL:
** none), t (NULL: none) its transpose as [numel / cols x cols], *db (db
** NULL: not wanted) x's column sums from the same launch.
** DelayedScaling: the role's scale, its amax noted (in a checkpoint's
** recomputed forward, e->fp8_frozen's scale of an input or weight role, no
** amax noted); current scaling: x's own amax first (reduced over the
** group). */
static gcap_status quantize(fp8_ctx *c, gcap_tensor *x, int r, gcap_tensor *skip, gc_fp8 *q,
                            gc_fp8 *t, int64_t cols, gcap_tensor **db) {
  gcap_engine *e = x->e;
  int role = 3 * c->gemm + r;
  gcap_tensor *scale = NULL, *amax = NULL;
  int64_t one = 1;
  gcap_status st = GCAP_OK;
  if (q->data == NULL && (st = gc_fp8_alloc(e, c->who, x->numel, role_format(c, r), q)) != GCAP_OK)
    return st;
  if (c->meta != NULL && e->fp8_frozen != NULL && r != 2) {
    if ((scale = gc_elems(e->fp8_frozen, role, 1)) == NULL)
      st = gc_fail(e, GCAP_ENOMEM, "%s: out of host memory", c->who);
    else
      st = gc_fp8_quantize(x, q, scale, 0, NULL, skip, t, cols, db);
  } else if (c->meta != NULL) {
    int roles = 3 * c->meta->gemms;
    scale = gc_elems(c->meta->state, roles + role, 1);
    amax = gc_elems(c->meta->state, role, 1);
    if (scale == NULL || amax == NULL)
      st = gc_fail(e, GCAP_ENOMEM, "%s: out of host memory", c->who);
    else
      st = gc_fp8_quantize(x, q, scale, 0, amax, skip, t, cols, db);
  } else if ((st = gcap_tensor_full(e, GCAP_F32, 1, &one, 0.0, &amax)) == GCAP_OK &&
             (st = gc_fp8_amax(x, amax)) == GCAP_OK && (st = reduce_amax(c, e, amax)) == GCAP_OK) {
    st = gc_fp8_quantize(x, q, amax, 1, NULL, NULL, t, cols, db);
  }
  gcap_tensor_free(scale);
  gcap_tensor_free(amax);
  return st;
}

/* The transposed FP8 copy [cols x GC_FP8_LD(rows)] of a saved operand, as
** the node saved it (a reference of its own). */
static gc_fp8 saved_fp8(gc_node *n, int at, int64_t rows, int64_t cols) {
  gc_fp8 q;
  q.data = gcap_tensor_retain(n->saved[at]);
  q.scale_inv = gcap_tensor_retain(n->saved[at + 1]);
  q.n = cols * GC_FP8_LD(rows);
  q.format = GCAP_FP8_E4M3;
  return q;
}

/* dx = g W: the grad gq [rows x out] (its rows padded when out is no
** multiple of 16) times W [out x in], saved transposed to [in x out]. */
static gcap_status dgrad(gc_node *n, const gc_fp8 *gq, gcap_tensor **dx) {
  const gc_meta *xm = &n->meta[0];
  int64_t out = n->meta[1].shape[0], in = n->meta[1].shape[1], rows = gq->n / out;
  gc_fp8 wt = saved_fp8(n, 2, out, in), gp;
  gcap_status st = GCAP_OK;
  memset(&gp, 0, sizeof gp);
  if (GC_FP8_LD(out) != out) st = gc_fp8_pad(gq, rows, out, &gp);
  if (st == GCAP_OK)
    st = gc_fp8_gemm(gp.data ? &gp : gq, &wt, rows, in, out, GC_FP8_LD(out), 0.0f, NULL, NULL, 0,
                     xm->dt, xm->ndim, xm->shape, dx);
  gc_fp8_free(&wt);
  gc_fp8_free(&gp);
  return st;
}

gcap_status gc_fp8_wgrad(const gc_fp8 *gt, const gc_fp8 *xt, int64_t out, int64_t in, int64_t rows,
                         gcap_dtype dt, gcap_tensor *main_grad, gcap_tensor **gw) {
  int64_t shape[2];
  if (main_grad != NULL && main_grad->dt != dt)
    return gc_fail(gt->data->e, GCAP_EINVAL, "Linear backward: main_grad is %s, the grads are %s",
                   gc_dtype_name(main_grad->dt), gc_dtype_name(dt));
  if (main_grad != NULL)
    return gc_fp8_gemm(gt, xt, out, in, rows, GC_FP8_LD(rows), 1.0f, NULL, NULL, 0, dt, 2,
                       main_grad->shape, &main_grad);
  shape[0] = out;
  shape[1] = in;
  return gc_fp8_gemm(gt, xt, out, in, rows, GC_FP8_LD(rows), 0.0f, NULL, NULL, 0, dt, 2, shape, gw);
}

/* Weight and bias grads from gt, the quantized grad transposed (empty when
** the weight takes no grad), and db, the bias grad of the unquantized grad
** (or NULL), to the sink or to gin. A delayed wgrad queues the GEMM's
** operands (none when the weight is frozen: the input was not saved) for
** backward_dw, which runs the same GEMM; the queue takes gt. */
static gcap_status param_grads(gcap_engine *e, gc_node *n, fp8_ctx *c, gc_fp8 *gt, gcap_tensor *db,
                               gcap_tensor **gin) {
  const gc_meta *xm = &n->meta[0];
  int64_t out = n->meta[1].shape[0], in = n->meta[1].shape[1], rows = xm->numel / in;
  gc_fp8 xt;
  gcap_status st = GCAP_OK;
  memset(&xt, 0, sizeof xt);
  if (n->saved[0] != NULL) xt = saved_fp8(n, 0, rows, in);
  if (c->sink != NULL && c->sink->delay)
    return gc_wgrad_defer_fp8(c->sink, e, gt, &xt, rows, xm->dt, db);
  if (gc_node_needs(n, 1) && n->saved[0] != NULL)
    st = gc_fp8_wgrad(gt, &xt, out, in, rows, xm->dt, c->sink ? c->sink->main_grad : NULL, &gin[1]);
  gc_fp8_free(&xt);
  if (st == GCAP_OK && db != NULL && gc_node_needs(n, 2)) gin[2] = gcap_tensor_retain(db);
  return st;
}

/* A backward's DelayedScaling state as it was before the node's grad was
** quantized (its amax noted) and its role updated: put back if that
** backward fails (gc_backward_undo), so that running it again updates the
** role once, as a clean run does. */
typedef struct state_undo {
  gc_fp8_meta *meta;
  gcap_tensor *was;
} state_undo;

static void state_put_back(void *ud, int undo) {
  state_undo *u = (state_undo *)ud;
  if (undo) (void)gc_copy(u->meta->state, u->was); /* bytes into a live tensor: no allocation */
  gcap_tensor_free(u->was);
  gc_fp8_meta_release(u->meta);
  free(u);
}

/* Keep c's state for its backward's undo (eagerly: a capture runs nothing,
** and outside a backward there is nothing to undo). */
static gcap_status keep_state(fp8_ctx *c, gcap_engine *e) {
  state_undo *u;
  gcap_status st;
  if (c->meta == NULL || e->cap != NULL || e->bw_depth == 0) return GCAP_OK;
  if ((u = (state_undo *)gc_calloc(1, sizeof *u)) == NULL)
    return gc_fail(e, GCAP_ENOMEM, "%s backward: out of host memory", c->who);
  if ((st = gc_tensor_alloc(e, c->who, GCAP_F32, 1, &c->meta->state->numel, &u->was)) != GCAP_OK ||
      (st = gc_copy(u->was, c->meta->state)) != GCAP_OK) {
    gcap_tensor_free(u->was);
    free(u);
    return st;
  }
  u->meta = gc_fp8_meta_retain(c->meta);
  if ((st = gc_backward_undo(e, state_put_back, u)) != GCAP_OK) state_put_back(u, 0);
  return st;
}

/* saved: x's FP8 copy transposed (data, scale_inv) when the weight needs a
** grad, w's when x does, the pre-activation of a gelu. The grad is
** quantized with its transpose when the weight's grad is wanted. */
static gcap_status fp8_backward(gc_node *n, gcap_tensor *g, gcap_tensor **gin) {
  fp8_ctx *c = (fp8_ctx *)n->ud;
  gcap_engine *e = g->e;
  int64_t out = n->meta[1].shape[0];
  int bias = n->meta[2].numel > 0, delayed = c->sink != NULL && c->sink->delay;
  int wgrad = n->saved[0] != NULL && (delayed || gc_node_needs(n, 1));
  gcap_tensor *dz = NULL, *db = NULL;
  gc_fp8 gq, gt;
  gcap_status st = GCAP_OK;
  int want_db = bias && (delayed || gc_node_needs(n, 2));
  memset(&gq, 0, sizeof gq);
  memset(&gt, 0, sizeof gt);
  if (c->gelu) { /* dz = g gelu'(z), and the bias grad with it */
    st = gc_gelu_backward(g, n->saved[4], out, &dz, want_db ? &db : NULL);
    g = dz;
  }
  if (st == GCAP_OK) st = keep_state(c, e);
  if (st == GCAP_OK && (st = quantize(c, g, 2, NULL, &gq, wgrad ? &gt : NULL, out,
                                      want_db && !c->gelu ? &db : NULL)) == GCAP_OK)
    st = update_roles(c, 3 * c->gemm + 2, 1);
  if (st == GCAP_OK && gc_node_needs(n, 0)) st = dgrad(n, &gq, &gin[0]);
  if (st == GCAP_OK) st = param_grads(e, n, c, &gt, db, gin);
  gc_fp8_free(&gq);
  gc_fp8_free(&gt);
  gcap_tensor_free(dz);
  gcap_tensor_free(db);
  return st;
}

/* A context for GEMM `gemm` of m under e's autocast. */
static gcap_status ctx_new(gcap_module *m, int gemm, int gelu, gc_wgrad_sink *sink, fp8_ctx **out) {
  gcap_engine *e = gc_module_engine(m);
  fp8_ctx *c = (fp8_ctx *)gc_calloc(1, sizeof *c);
  gcap_status st;
  *out = NULL;
  if (c == NULL) return gc_fail(e, GCAP_ENOMEM, "%s: out of host memory", gcap_module_type(m));
  c->gemm = gemm;
  c->gelu = gelu;
  c->recipe = e->fp8.recipe;
  c->group = e->fp8.amax_reduction_group;
  snprintf(c->who, sizeof c->who, "%s", gcap_module_type(m));
  if (c->recipe.kind == GCAP_FP8_DELAYED_SCALING) {
    gc_fp8_meta *meta;
    if ((st = gc_fp8_module_meta(m, &c->recipe, &meta)) != GCAP_OK) {
      free(c);
      return st;
    }
    c->meta = gc_fp8_meta_retain(meta);
  }
  c->sink = sink ? gc_wgrad_sink_retain(sink) : NULL;
  *out = c;
  return GCAP_OK;
}

/* The weight's FP8 copy and its transpose: the module's cached ones while
** weight caching is on (made outside capture, at the first call), else
** new ones. */
static gcap_status weight_copy(fp8_ctx *c, gcap_tensor *w, gc_fp8 *wq, gc_fp8 *wt, int *cached) {
  gcap_engine *e = w->e;
  gc_fp8 *cache, *cache_t;
  gcap_status st;
  *cached = e->fp8_skip != NULL && c->meta != NULL && e->fp8_frozen == NULL;
  if (!*cached) return GCAP_OK;
  cache = &c->meta->wcache[c->gemm];
  cache_t = &c->meta->wcache_t[c->gemm];
  if (cache->data == NULL || cache->n != w->numel || cache_t->data == NULL) {
    if (e->cap != NULL)
      return gc_fail(e, GCAP_ECAPTURE,
                     "%s: its cached FP8 weight is made at its first call, outside a capture",
                     c->who);
    gc_fp8_free(cache);
    gc_fp8_free(cache_t);
    if ((st = gc_fp8_alloc(e, c->who, w->numel, GCAP_FP8_E4M3, cache)) != GCAP_OK ||
        (st = gc_fp8_transposed(e, cache, w->shape[0], w->shape[1], cache_t)) != GCAP_OK) {
      gc_fp8_free(cache);
      return st;
    }
  }
  *wq = *cache;
  *wt = *cache_t;
  return GCAP_OK;
}

/* The FP8 forward: both operands quantized (with the transposes the
** backward reads), the roles updated, the FP8 GEMM y = x W^T (+ b, the
** gelu), the node. */
static gcap_status fp8_forward(fp8_ctx *c, gcap_tensor *x, gcap_tensor *w, gcap_tensor *b,
                               gcap_tensor **out) {
  gcap_engine *e = x->e;
  gcap_tensor *pre = NULL, *in[3], *save[5];
  int64_t shape[GCAP_MAXDIM], k = w->shape[1];
  gc_fp8 xq, wq, xt, wt;
  int cached = 0, grad;
  gcap_status st;
  memset(&xq, 0, sizeof xq);
  memset(&wq, 0, sizeof wq);
  memset(&xt, 0, sizeof xt);
  memset(&wt, 0, sizeof wt);
  memcpy(shape, x->shape, sizeof shape);
  shape[x->ndim - 1] = w->shape[0];
  in[0] = x, in[1] = w, in[2] = b;
  grad = gc_grad_needed(e, in, 3);
  if ((st = weight_copy(c, w, &wq, &wt, &cached)) == GCAP_OK &&
      (st = quantize(c, x, 0, NULL, &xq, grad && w->requires_grad ? &xt : NULL, k, NULL)) ==
          GCAP_OK &&
      (st = quantize(c, w, 1, cached ? e->fp8_skip : NULL, &wq,
                     cached || (grad && x->requires_grad) ? &wt : NULL, k, NULL)) == GCAP_OK &&
      (e->fp8_frozen != NULL || (st = update_roles(c, 3 * c->gemm, 2)) == GCAP_OK)) {
    if (c->gelu) st = gc_tensor_alloc(e, c->who, x->dt, x->ndim, shape, &pre);
    if (st == GCAP_OK) /* k is a multiple of 16 (check_dims): the rows need no padding */
      st = gc_fp8_gemm(&xq, &wq, x->numel / k, w->shape[0], k, k, 0.0f, b, pre, 1, x->dt, x->ndim,
                       shape, out);
  }
  if (st == GCAP_OK && grad) {
    gc_node *n;
    save[0] = w->requires_grad ? xt.data : NULL;
    save[1] = w->requires_grad ? xt.scale_inv : NULL;
    save[2] = x->requires_grad ? wt.data : NULL;
    save[3] = x->requires_grad ? wt.scale_inv : NULL;
    save[4] = pre;
    st = gc_record(*out, c->gelu ? "fp8_linear_gelu" : "fp8_linear", fp8_backward, in, 3, save, 5,
                   &n);
    if (st == GCAP_OK) {
      n->ud = c;
      n->ud_free = ctx_free;
      c = NULL;
    } else {
      gcap_tensor_free(*out);
      *out = NULL;
    }
  }
  if (c != NULL) ctx_free(c);
  gc_fp8_free(&xq);
  gc_fp8_free(&xt);
  if (!cached) {
    gc_fp8_free(&wq);
    gc_fp8_free(&wt);
  }
  gcap_tensor_free(pre);
  return st;
}

gcap_status gc_fp8_linear(gcap_module *m, int gemm, gcap_tensor *x, gcap_tensor *w, gcap_tensor *b,
                          int gelu, gc_wgrad_sink *sink, gcap_tensor **out) {
  gcap_engine *e = gc_module_engine(m);
  fp8_ctx *c;
  gcap_status st;
  *out = NULL;
  if (!e->fp8.enabled) {
    st = gelu ? gc_linear_gelu(x, w, b, out) : gc_linear(x, w, b, out);
    if (st == GCAP_OK && sink != NULL && (*out)->grad_fn != NULL)
      gc_wgrad_sink_attach((*out)->grad_fn, sink);
    return st;
  }
  /* the linear's own checks first: operands, dtypes and shapes */
  if (x == NULL || w == NULL || x->ndim < 1 || w->ndim != 2 || x->dt != w->dt ||
      x->shape[x->ndim - 1] != w->shape[1] ||
      (b != NULL && (b->dt != x->dt || b->ndim != 1 || b->shape[0] != w->shape[0])))
    return gelu ? gc_linear_gelu(x, w, b, out) : gc_linear(x, w, b, out);
  if ((st = check_dims(e, gcap_module_type(m), "input", x)) != GCAP_OK ||
      (st = check_dims(e, gcap_module_type(m), "weight", w)) != GCAP_OK ||
      (st = ctx_new(m, gemm, gelu, sink, &c)) != GCAP_OK)
    return st;
  return fp8_forward(c, x, w, b, out);
}
