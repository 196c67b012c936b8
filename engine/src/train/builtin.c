/*
** builtin.c: the built-in modules, whose forward is C: Linear (with its
** wgrad sink: the delayed wgrads it queues and drains in backward_dw, or the
** main_grad it fuses into), ReLU, GELU, LayerNorm, Dropout and Sequential
** (which runs a hook-free Linear then GELU as one op).
*/
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "module.h"

/* ------------------------------------------------------------------------ */
/* Delayed and fused wgrad                                                   */

/* Is m a Linear that delays its wgrad? */
static int linear_delays(const gcap_module *m) {
  return m->wgrad != NULL && m->wgrad->delay;
}

/* The delayed wgrads of m's sink, oldest first: an FP8 linear's from its
** FP8 GEMM's operands, the others from the grad and input. An item leaves
** the queue once both grads are applied; one whose bias grad failed after
** its weight grad was applied keeps only the bias grad to do, and the bias
** grad itself once it was computed. */
static gcap_status linear_dw(gcap_module *m) {
  gcap_tensor *w = m->params.v[0].t, *b = m->params.n > 1 ? m->params.v[1].t : NULL;
  gcap_tensor *main_grad = m->wgrad->main_grad;
  gcap_status st = GCAP_OK;
  int was = gcap_set_grad_enabled(m->e, 0);
  gc_wgrad_queue *q = &m->wgrad->q;
  while (st == GCAP_OK && q->n > 0) {
    gc_wgrad_item *it = &q->v[0];
    gcap_tensor *gw = NULL, *gb = NULL, **want_gb = b != NULL && b->requires_grad ? &gb : NULL;
    /* frozen parameters get nothing, as in the ordinary backward; the input
    ** was not kept when the weight was frozen at the forward */
    int want_w = w->requires_grad && !it->w_done && (it->fp8 ? it->xt.data : it->x) != NULL;
    if (it->fp8) {
      if (want_w)
        st = gc_fp8_wgrad(&it->gt, &it->xt, w->shape[0], w->shape[1], it->rows, it->dt, main_grad,
                          &gw);
      if (want_gb != NULL) gb = gcap_tensor_retain(it->gb);
    } else if (main_grad != NULL) { /* fused: the weight's lands at once, so apart */
      if (want_w)
        st = gc_linear_param_grads(it->g, it->x, w->shape[0], w->shape[1], main_grad, NULL, &gw,
                                   NULL);
      if (st == GCAP_OK && want_w) it->w_done = 1;
      if (st == GCAP_OK && want_gb != NULL)
        st = gc_linear_param_grads(it->g, it->x, w->shape[0], w->shape[1], NULL, it->gb, NULL,
                                   want_gb);
    } else { /* both from one GEMM */
      st = gc_linear_param_grads(it->g, it->x, w->shape[0], w->shape[1], NULL, it->gb,
                                 want_w ? &gw : NULL, want_gb);
    }
    if (st == GCAP_OK && gw != NULL) st = gc_acc_grad(w, gw, 1);
    if (st == GCAP_OK && want_w) it->w_done = 1;
    if (st == GCAP_OK && gb != NULL) st = gc_acc_grad(b, gb, 1);
    /* the weight's applied and the bias's not: the retry applies these bits,
    ** where computing it alone would take another kernel (cuda sums the
    ** rows apart from the GEMM's epilogue: other bits) */
    if (st != GCAP_OK && it->w_done && gb != NULL && it->gb == NULL)
      it->gb = gcap_tensor_retain(gb);
    gcap_tensor_free(gw);
    gcap_tensor_free(gb);
    if (st == GCAP_OK) gc_wgrad_queue_pop(q);
  }
  gcap_set_grad_enabled(m->e, was);
  return st;
}

void gc_module_wgrad_aside(gcap_module *m, int aside) {
  int j;
  if (linear_delays(m) && m->aside != aside) {
    gc_wgrad_queue *q = &m->wgrad->q;
    if (aside) { /* the user's pending wgrads wait; the call starts empty */
      m->wq_aside = *q;
      memset(q, 0, sizeof *q);
    } else { /* whatever the call left is dropped; the user's come back */
      gc_wgrad_queue_free(q);
      *q = m->wq_aside;
      memset(&m->wq_aside, 0, sizeof m->wq_aside);
    }
    m->aside = aside;
  }
  for (j = 0; j < m->children.n; j++)
    gc_module_wgrad_aside(m->children.v[j].m, aside);
}

gcap_status gcap_module_backward_dw(gcap_module *m) {
  gcap_status st;
  int j;
  if (m == NULL) return GCAP_EINVAL;
  gc_clear(m->e);
  if (linear_delays(m) && (st = linear_dw(m)) != GCAP_OK) return st;
  for (j = 0; j < m->children.n; j++)
    if ((st = gcap_module_backward_dw(m->children.v[j].m)) != GCAP_OK) return st;
  return GCAP_OK;
}

int gc_module_pending_wgrads(const gcap_module *m) {
  int j, n = linear_delays(m) ? m->wgrad->q.n : 0;
  for (j = 0; j < m->children.n; j++)
    n += gc_module_pending_wgrads(m->children.v[j].m);
  return n;
}

int gcap_module_has_delayed_wgrad(const gcap_module *m) {
  int j;
  if (m == NULL) return 0;
  if (linear_delays(m)) return 1;
  for (j = 0; j < m->children.n; j++)
    if (gcap_module_has_delayed_wgrad(m->children.v[j].m)) return 1;
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Built-ins                                                                 */

static gcap_status one_input(gcap_module *m, int nin) {
  if (nin != 1) return gc_fail(m->e, GCAP_EINVAL, "%s: expected 1 input, got %d", m->type, nin);
  return GCAP_OK;
}

/* Linear m on x, followed by a gelu when `gelu`. */
static gcap_status linear_run(gcap_module *m, gcap_tensor *x, int gelu, gcap_tensor **out) {
  gcap_tensor *b = m->params.n > 1 ? m->params.v[1].t : NULL;
  /* in FP8 under an FP8 autocast; its parameter grads go to its sink */
  return gc_fp8_linear(m, 0, x, m->params.v[0].t, b, gelu, m->wgrad, out);
}

static gcap_status linear_forward(void *ud, gcap_module *m, int nin, gcap_tensor *const *in,
                                  gcap_tensor **out) {
  gcap_status st;
  (void)ud;
  return (st = one_input(m, nin)) != GCAP_OK ? st : linear_run(m, in[0], 0, out);
}

gcap_status gc_uniform(gcap_engine *e, int ndim, const int64_t *shape, double bound,
                       gcap_tensor **out) {
  gcap_tensor *u;
  gcap_status st;
  int was = gcap_set_grad_enabled(e, 0);
  *out = NULL;
  if ((st = gcap_tensor_rand(e, GCAP_F32, ndim, shape, 0, &u)) == GCAP_OK) {
    gcap_tensor *two_u;
    if ((st = gc_unary(u, GC_K_SCALE, (float)(2.0 * bound), "init", 0, &two_u)) == GCAP_OK) {
      gcap_tensor *shift;
      if ((st = gcap_tensor_full(e, GCAP_F32, 0, NULL, -bound, &shift)) == GCAP_OK) {
        st = gc_binary(two_u, shift, GC_K_ADD, "init", out);
        gcap_tensor_free(shift);
      }
      gcap_tensor_free(two_u);
    }
    gcap_tensor_free(u);
  }
  gcap_set_grad_enabled(e, was);
  return st;
}

gcap_status gcap_nn_linear(gcap_engine *e, int64_t in, int64_t out, int bias, unsigned flags,
                           gcap_module **m) {
  gcap_tensor *w = NULL, *b = NULL, *mg = NULL;
  int64_t ws[2], bs[1];
  double bound;
  gcap_status st;
  if ((st = gc_module_start(e, "Linear", m)) != GCAP_OK ||
      (st = gc_check_open(e, "Linear")) != GCAP_OK)
    return st;
  if (in <= 0 || out <= 0)
    return gc_fail(e, GCAP_EINVAL,
                   "Linear: in and out features must be positive, got %lld and %lld", (long long)in,
                   (long long)out);
  if (flags & ~(GCAP_LINEAR_DELAY_WGRAD | GCAP_LINEAR_FUSE_WGRAD))
    return gc_fail(e, GCAP_EINVAL, "Linear: unknown flags 0x%x", flags);
  ws[0] = out;
  ws[1] = in;
  bs[0] = out;
  bound = 1.0 / sqrt((double)in);
  if ((st = gcap_module_new(e, "Linear", linear_forward, NULL, NULL, m)) != GCAP_OK) return st;
  gc_module_set_fp8_gemms(*m, 1);
  if ((flags & GCAP_LINEAR_FUSE_WGRAD) &&
      ((st = gcap_tensor_full(e, GCAP_F32, 2, ws, 0.0, &mg)) != GCAP_OK ||
       (st = gcap_module_add_buffer(*m, "main_grad", mg)) != GCAP_OK ||
       (st = gcap_module_set_buffer_persistent(*m, "main_grad", 0)) != GCAP_OK))
    goto fail;
  if ((flags & (GCAP_LINEAR_DELAY_WGRAD | GCAP_LINEAR_FUSE_WGRAD)) &&
      (st = gc_wgrad_sink_new(e, (flags & GCAP_LINEAR_DELAY_WGRAD) != 0, mg, &(*m)->wgrad)) !=
          GCAP_OK)
    goto fail;
  if ((st = gc_uniform(e, 2, ws, bound, &w)) != GCAP_OK ||
      (st = gcap_module_add_parameter(*m, "weight", w)) != GCAP_OK)
    goto fail;
  if (bias && ((st = gc_uniform(e, 1, bs, bound, &b)) != GCAP_OK ||
               (st = gcap_module_add_parameter(*m, "bias", b)) != GCAP_OK))
    goto fail;
  gcap_tensor_free(w);
  gcap_tensor_free(b);
  gcap_tensor_free(mg);
  return GCAP_OK;
fail:
  gcap_tensor_free(w);
  gcap_tensor_free(b);
  gcap_tensor_free(mg);
  return gc_module_keep_or_free(m, st);
}

static gcap_status relu_forward(void *ud, gcap_module *m, int nin, gcap_tensor *const *in,
                                gcap_tensor **out) {
  gcap_status st;
  (void)ud;
  return (st = one_input(m, nin)) != GCAP_OK ? st : gcap_relu(in[0], out);
}

static gcap_status gelu_forward(void *ud, gcap_module *m, int nin, gcap_tensor *const *in,
                                gcap_tensor **out) {
  gcap_status st;
  (void)ud;
  return (st = one_input(m, nin)) != GCAP_OK ? st : gcap_gelu(in[0], out);
}

static gcap_status ln_forward(void *ud, gcap_module *m, int nin, gcap_tensor *const *in,
                              gcap_tensor **out) {
  gcap_status st;
  (void)ud;
  if ((st = one_input(m, nin)) != GCAP_OK) return st;
  return gcap_layer_norm(in[0], m->params.v[0].t, m->params.v[1].t, m->eps, out);
}

static gcap_status dropout_forward(void *ud, gcap_module *m, int nin, gcap_tensor *const *in,
                                   gcap_tensor **out) {
  gcap_status st;
  (void)ud;
  return (st = one_input(m, nin)) != GCAP_OK ? st : gcap_dropout(in[0], m->p, m->training, out);
}

/* A module whose call is its bare forward: no hooks, not graphed in its
** current mode. */
static int bare(const gcap_module *m) {
  return m->nhooks == 0 && m->route[m->training != 0].fn == NULL;
}

/* Children j and j + 1 are a bare Linear then a bare GELU: nothing can see
** the Linear's output, so the pair runs as one GEMM with a gelu epilogue. */
static int linear_gelu_at(gcap_module *m, int j) {
  gcap_module *a = m->children.v[j].m, *b;
  if (j + 1 >= m->children.n || a->forward != linear_forward) return 0;
  b = m->children.v[j + 1].m;
  return b->forward == gelu_forward && bare(a) && bare(b);
}

/* Child j of Sequential m on x: one tensor out, passed on as PyTorch's. */
static gcap_status seq_call(gcap_module *m, int j, gcap_tensor *x, gcap_tensor **y) {
  gcap_module *c = m->children.v[j].m;
  gcap_tensor *ys[GCAP_MAX_OUTPUTS];
  gcap_status st;
  int n;
  *y = NULL;
  if ((st = gcap_module_call_n(c, 1, &x, GCAP_MAX_OUTPUTS, &n, ys)) != GCAP_OK) return st;
  if (n == 1 && ys[0] != NULL) {
    *y = ys[0];
    return GCAP_OK;
  }
  gc_outs_free(n, ys);
  return gc_fail(m->e, GCAP_EINVAL,
                 "%s: module #%d (%s) gave %d outputs%s; a Sequential passes one tensor from "
                 "module to module",
                 m->type, j + 1, c->type, n, n == 1 ? " (absent)" : "");
}

static gcap_status seq_forward(void *ud, gcap_module *m, int nin, gcap_tensor *const *in,
                               gcap_tensor **out) {
  gcap_tensor *x;
  gcap_status st;
  int j;
  (void)ud;
  if ((st = one_input(m, nin)) != GCAP_OK) return st;
  x = gcap_tensor_retain(in[0]);
  for (j = 0; j < m->children.n; j++) {
    gcap_tensor *y;
    if (linear_gelu_at(m, j)) {
      gc_clear(m->e);
      st = linear_run(m->children.v[j++].m, x, 1, &y);
    } else {
      st = seq_call(m, j, x, &y);
    }
    gcap_tensor_free(x);
    if (st != GCAP_OK) return st;
    x = y;
  }
  *out = x;
  return GCAP_OK;
}

gcap_status gcap_nn_relu(gcap_engine *e, gcap_module **m) {
  gcap_status st = gc_module_start(e, "ReLU", m);
  return st ? st : gcap_module_new(e, "ReLU", relu_forward, NULL, NULL, m);
}

gcap_status gcap_nn_gelu(gcap_engine *e, gcap_module **m) {
  gcap_status st = gc_module_start(e, "GELU", m);
  return st ? st : gcap_module_new(e, "GELU", gelu_forward, NULL, NULL, m);
}

gcap_status gcap_nn_layer_norm(gcap_engine *e, int64_t n, double eps, gcap_module **m) {
  gcap_tensor *w = NULL, *b = NULL;
  gcap_status st;
  if ((st = gc_module_start(e, "LayerNorm", m)) != GCAP_OK) return st;
  if (n <= 0)
    return gc_fail(e, GCAP_EINVAL, "LayerNorm: size must be positive, got %lld", (long long)n);
  if ((st = gcap_module_new(e, "LayerNorm", ln_forward, NULL, NULL, m)) != GCAP_OK) return st;
  (*m)->eps = eps;
  if ((st = gcap_tensor_full(e, GCAP_F32, 1, &n, 1.0, &w)) != GCAP_OK ||
      (st = gcap_tensor_full(e, GCAP_F32, 1, &n, 0.0, &b)) != GCAP_OK ||
      (st = gcap_module_add_parameter(*m, "weight", w)) != GCAP_OK ||
      (st = gcap_module_add_parameter(*m, "bias", b)) != GCAP_OK)
    gc_module_keep_or_free(m, st);
  gcap_tensor_free(w);
  gcap_tensor_free(b);
  return st;
}

gcap_status gcap_nn_dropout(gcap_engine *e, double p, gcap_module **m) {
  gcap_status st;
  if ((st = gc_module_start(e, "Dropout", m)) != GCAP_OK) return st;
  if (!(p >= 0.0 && p <= 1.0))
    return gc_fail(e, GCAP_EINVAL, "Dropout: probability must be in [0, 1], got %g", p);
  if ((st = gcap_module_new(e, "Dropout", dropout_forward, NULL, NULL, m)) == GCAP_OK) (*m)->p = p;
  return st;
}

gcap_status gcap_nn_sequential(gcap_engine *e, int n, gcap_module *const *mods, gcap_module **m) {
  gcap_status st;
  int j;
  if ((st = gc_module_start(e, "Sequential", m)) != GCAP_OK) return st;
  if (n < 0) return gc_bad_count(e, "Sequential", "n", n);
  if (n > 0 && mods == NULL) return gc_null(e, "Sequential", "mods");
  for (j = 0; j < n; j++)
    if (mods[j] == NULL || mods[j]->e != e)
      return gc_fail(e, GCAP_EINVAL, "Sequential: module #%d %s", j + 1,
                     mods[j] ? "belongs to another engine" : "is NULL");
  if ((st = gcap_module_new(e, "Sequential", seq_forward, NULL, NULL, m)) != GCAP_OK) return st;
  for (j = 0; j < n; j++) {
    char name[16];
    snprintf(name, sizeof name, "%d", j);
    if ((st = gcap_module_add_child(*m, name, mods[j])) != GCAP_OK)
      return gc_module_keep_or_free(m, st);
  }
  return GCAP_OK;
}
