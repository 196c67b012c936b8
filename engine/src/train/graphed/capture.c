/*
** capture.c: the capture of make_graphed_callables: the schedule's passes
** once more, each into its own graph of the call's one pool in replay
** order, with the capture_time_hooks run before capture_begin and after
** capture_end (never recorded). The .grad tensors a captured backward
** allocates become the entry's static grads; with reuse, what no later pass
** reads goes back to the pool (reuse.c).
*/
#include <stdlib.h>

#include "graphed.h"

static gcap_status new_graph(ge_build *b, int i, const char *kind, gcap_graph **g) {
  char name[GC_NAMELEN];
  gcap_status st;
  if ((st = gcap_graph_new(b->e, g)) != GCAP_OK) return st;
  snprintf(name, sizeof name, "%s of entry %d", kind, i + 1);
  return gcap_graph_set_name(*g, name);
}

/* Capture fn(b, x) into a new graph of the call's pool; an error names the
** phase as "<kind> capture". */
static gcap_status capture(ge_build *b, int i, const char *kind, gcap_graph **g,
                           gcap_status (*fn)(ge_build *, ge_entry *)) {
  ge_entry *x = &b->G->v[i];
  gcap_status st, st2;
  char phase[32];
  snprintf(phase, sizeof phase, "%s capture", kind);
  if ((st = new_graph(b, i, kind, g)) != GCAP_OK) return st;
  if ((st = gcap_capture_begin(*g, b->G->pool, NULL)) != GCAP_OK) return ge_where(b, st, i, phase);
  st = fn(b, x);
  if (st != GCAP_OK) { /* capture_end clears the message: keep the op's reason */
    char why[GC_ERRLEN];
    snprintf(why, sizeof why, "%s", b->e->err);
    gcap_capture_end(*g); /* always ends, also after an error */
    gc_fail(b->e, st, "%s", why);
    return ge_where(b, st, i, phase);
  }
  if ((st2 = gcap_capture_end(*g)) != GCAP_OK) return ge_where(b, st2, i, phase);
  return GCAP_OK;
}

static gcap_status cap_fwd_body(ge_build *b, ge_entry *x) {
  return gc_graphed_forward(b, x, &x->out);
}

/* The backward; without clones, each parameter grad then copied into its
** home (homes_new), which the graph writes and nothing else does. */
static gcap_status cap_bwd_body(ge_build *b, ge_entry *x) {
  gcap_status st = gc_graphed_backward(&x->out, x->grad_out, b->o->retain_graph_in_backward);
  int k, was = gcap_set_grad_enabled(b->e, 0);
  for (k = 0; st == GCAP_OK && b->homes != NULL && k < x->nparams; k++)
    if (x->params[k]->grad != NULL) st = gcap_copy_(b->homes[k], x->params[k]->grad);
  gcap_set_grad_enabled(b->e, was);
  return st;
}

/* clone_param_grads_on_return = false hands a parameter its static grad as
** .grad, to be added into by later backwards (replay.c): that buffer must
** be written by this backward alone. The grads a captured backward makes
** live in the pool, where the graphs captured before it left their scratch
** (the entry's own forward, another entry's backward), which their replays
** write over. So each kept parameter gets a home outside the pool, made
** here before the capture, into which the captured backward copies. */
static gcap_status homes_new(ge_build *b, ge_entry *x) {
  int k;
  if (b->o->clone_param_grads_on_return || x->nparams == 0) return GCAP_OK;
  if ((b->homes = (gcap_tensor **)gc_calloc((size_t)x->nparams, sizeof *b->homes)) == NULL)
    return gc_fail(b->e, GCAP_ENOMEM, "make_graphed_callables: out of host memory");
  for (k = 0; k < x->nparams; k++) {
    gcap_status st = ge_zeros_like(x->params[k], &b->homes[k]);
    if (st != GCAP_OK) return st;
  }
  return GCAP_OK;
}

/* The homes become the parameters' static grads, where the backward gave
** the parameter a grad (its pool grad goes); the others are dropped. */
static void homes_take(ge_build *b, ge_entry *x) {
  int k;
  for (k = 0; b->homes != NULL && k < x->nparams; k++) {
    gcap_tensor **g = &x->grad_in[x->nargs + k];
    if (*g != NULL) {
      gcap_tensor_free(*g);
      *g = b->homes[k];
    } else {
      gcap_tensor_free(b->homes[k]);
    }
    b->homes[k] = NULL;
  }
}

static void homes_free(ge_build *b, const ge_entry *x) {
  int k;
  for (k = 0; b->homes != NULL && k < x->nparams; k++)
    gcap_tensor_free(b->homes[k]);
  free(b->homes);
  b->homes = NULL;
}

static gcap_status cap_dw_body(ge_build *b, ge_entry *x) {
  (void)b;
  return gcap_module_backward_dw(x->m);
}

static gcap_status cap_fwd(ge_build *b, int i) {
  ge_entry *x = &b->G->v[i];
  gcap_status st;
  int was = gcap_set_grad_enabled(b->e, b->G->training);
  if ((st = ge_run_hooks(b, x->callable, GCAP_HOOK_FORWARD_PRE)) == GCAP_OK &&
      (st = capture(b, i, "forward", &x->fwd, cap_fwd_body)) == GCAP_OK)
    st = ge_run_hooks(b, x->callable, GCAP_HOOK_FORWARD);
  gcap_set_grad_enabled(b->e, was);
  return st;
}

/* The grads a captured backward left in .grad become the static grad
** buffers (they live in the pool); the user's grads come back at the end. */
static gcap_status take_grads(ge_build *b, ge_entry *x, gcap_tensor ***dst, int from, int n) {
  int k;
  if ((*dst = (gcap_tensor **)gc_calloc((size_t)n + 1, sizeof **dst)) == NULL)
    return gc_fail(b->e, GCAP_ENOMEM, "make_graphed_callables: out of host memory");
  for (k = 0; k < n; k++) {
    gcap_tensor *t = ge_surface(x, from + k);
    (*dst)[k] = t->grad;
    t->grad = NULL;
  }
  return GCAP_OK;
}

static gcap_status cap_dw(ge_build *b, int i) {
  ge_entry *x = &b->G->v[i];
  gcap_status st;
  if (x->dw != NULL)
    return gc_fail(b->e, GCAP_EINVAL,
                   "make_graphed_callables: the delayed wgrad of entry %d is captured twice",
                   i + 1);
  if ((st = capture(b, i, "delayed wgrad", &x->dw, cap_dw_body)) != GCAP_OK ||
      (st = take_grads(b, x, &x->dw_grad, x->nargs, x->nparams)) != GCAP_OK)
    return st;
  return x->params_known ? gc_graphed_params_agree(b, i, -1, 0, x->dw_grad) : GCAP_OK;
}

/* The static grads of x's outputs that require grad: allocated outside
** capture (or shared, with reuse). */
static gcap_status grad_outs(ge_build *b, ge_entry *x) {
  int k;
  if ((x->grad_out = (gcap_tensor **)gc_calloc((size_t)x->out.n + 1, sizeof *x->grad_out)) == NULL)
    return gc_fail(b->e, GCAP_ENOMEM, "make_graphed_callables: out of host memory");
  for (k = 0; k < x->out.n; k++) {
    gcap_status st;
    if (x->out.t[k] == NULL || !x->out.t[k]->requires_grad) continue;
    if (x->ngrad++ == 0) x->grad1 = k;
    if (b->o->reuse_graph_input_output_buffers)
      x->grad_out[k] = gc_graphed_shared_grad_out(b, x, k);
    if (x->grad_out[k] == NULL && (st = ge_zeros_like(x->out.t[k], &x->grad_out[k])) != GCAP_OK)
      return st;
  }
  return GCAP_OK;
}

static gcap_status cap_bwd(ge_build *b, int i) {
  ge_entry *x = &b->G->v[i];
  gcap_status st;
  int k;
  if ((st = grad_outs(b, x)) != GCAP_OK) return ge_where(b, st, i, "backward capture");
  if (x->ngrad > 0) {
    if ((st = ge_run_hooks(b, x->callable, GCAP_HOOK_BACKWARD_PRE)) != GCAP_OK ||
        (st = homes_new(b, x)) != GCAP_OK ||
        (st = capture(b, i, "backward", &x->bwd, cap_bwd_body)) != GCAP_OK) {
      homes_free(b, x);
      return st;
    }
    /* a parameter whose grad comes or goes only now would never be replayed
    ** (a delayed wgrad's come in its own pass) */
    if ((st = take_grads(b, x, &x->grad_in, 0, x->nargs + x->nparams)) == GCAP_OK &&
        x->params_known)
      st = gc_graphed_params_agree(b, i, -1, !x->need_dw, x->grad_in + x->nargs);
    if (st == GCAP_OK) homes_take(b, x);
    homes_free(b, x);
    if (st != GCAP_OK || (st = gc_graphed_note_reads(b, x)) != GCAP_OK) return st;
    if ((st = ge_run_hooks(b, x->callable, GCAP_HOOK_BACKWARD)) != GCAP_OK) return st;
  }
  /* the static outputs keep their memory but no longer the captured graph */
  for (k = 0; k < x->out.n; k++) {
    gcap_tensor *t = x->out.t[k], *alias;
    if (t == NULL) continue;
    if ((alias = gc_tensor_alias(t, t->ndim, t->shape)) == NULL)
      return gc_fail(b->e, GCAP_ENOMEM, "make_graphed_callables: out of host memory");
    gcap_tensor_free(t);
    x->out.t[k] = alias;
  }
  if (x->need_dw && b->sched.delayed_wgrad == 0 && (st = cap_dw(b, i)) != GCAP_OK)
    return st; /* right after, as TE */
  return b->o->reuse_graph_input_output_buffers ? gc_graphed_release_dead(b, i) : GCAP_OK;
}

/* The passes into the call's pool (the option's, or a new one), in replay
** order; every delayed-wgrad entry must have had its wgrad captured. */
gcap_status gc_graphed_capture(ge_build *b) {
  gcap_graphed *G = b->G;
  gcap_status st = GCAP_OK;
  int i;
  b->done = 0;
  b->total = b->sched.n;
  if (b->o->pool)
    G->pool = gcap_pool_retain(b->o->pool);
  else if ((st = gcap_pool_new(b->e, &G->pool)) != GCAP_OK)
    return st;
  b->phase = "capture";
  b->prev_bwd = b->last_l0 = -1;
  for (i = 0; i < b->sched.n && st == GCAP_OK; i++, st = ge_progress(b, st)) {
    gc_pass *p = &b->sched.v[i];
    b->pass = i;
    if (p->kind == GC_PASS_FWD)
      st = cap_fwd(b, p->entry);
    else if (p->kind == GC_PASS_BWD)
      st = cap_bwd(b, p->entry);
    else
      st = cap_dw(b, p->entry);
  }
  for (i = 0; i < G->n && st == GCAP_OK; i++)
    if (G->v[i].need_dw && G->v[i].dw == NULL)
      st = gc_fail(b->e, GCAP_EINVAL,
                   "make_graphed_callables: entry %d has a delayed-wgrad Linear, but the order "
                   "holds no wgrad entry -(k + 0.5) after its backward",
                   i + 1);
  if (st == GCAP_OK && G->reuse) st = gc_graphed_note_kills(b);
  if (st == GCAP_OK) st = gc_graphed_note_homes(b);
  return st;
}
