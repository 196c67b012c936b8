/*
** graphed.c: make_graphed_callables. Checks everything that can be checked
** before any work; warms up iteration-major on a side stream (or walks the
** order exactly); captures forwards and backwards into one pool in replay
** order, with capture_time_hooks run outside capture around each pass; and
** builds replay entries whose forward copies inputs in only when their
** address differs and whose backward replays the backward graph.
**
** A failure at any point rolls back: graphs freed, .grad values, the
** generator and the modules as they were.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/train.h"
#include "schedule.h"

/* The outputs of one call: n of them, NULL where absent. */
typedef struct ge_outs {
  int n;
  gcap_tensor **t;
} ge_outs;

typedef struct ge_entry {
  int callable;
  gcap_module *m;
  int nargs;
  gcap_tensor **args; /* static inputs: the sample tensors */
  int nparams;
  gcap_tensor **params;   /* parameters fed to the graphs (pruned in warmup) */
  int params_known;       /* pruning done (warmup iteration 0) */
  int trainable;          /* a parameter requires grad (pruned or not: a fused-wgrad weight's
                             grad goes to main_grad, never to .grad) */
  ge_outs out;            /* static outputs */
  gcap_tensor **grad_out; /* [out.n] static grads of the outputs that require grad, else NULL */
  int ngrad, grad1;       /* how many have one; the first that has */
  gcap_tensor **grad_in;  /* [nargs + nparams] static grads, or NULL */
  gcap_tensor **dw_grad;  /* [nparams] static wgrads of the delayed-wgrad graph */
  gcap_graph *fwd, *bwd, *dw;
  int need_dw;
  int reset;
  int fwd_pending; /* replayed forwards whose backward is still to come */
  int *sharers;    /* reuse: the entries sharing a static input with this one */
  int nsharers;
} ge_entry;

struct gcap_graphed {
  int refs;
  gcap_engine *e;
  int n;
  ge_entry *v;
  gcap_pool *pool;
  int training;
  int clone;
  int reuse; /* entries may share static inputs */
};

void gcap_graphed_opts_init(gcap_graphed_opts *o) {
  if (o == NULL) return;
  memset(o, 0, sizeof *o);
  o->num_warmup_iters = 3;
  o->clone_param_grads_on_return = 1;
}

static void outs_clear(ge_outs *o) {
  int k;
  for (k = 0; k < o->n; k++)
    gcap_tensor_free(o->t[k]);
  free(o->t);
  o->n = 0;
  o->t = NULL;
}

/* Also for an entry left half-built by a failed allocation (args or params
** NULL while their counts are set). */
static void entry_clear(ge_entry *x) {
  int k;
  for (k = 0; x->args && k < x->nargs; k++)
    gcap_tensor_free(x->args[k]);
  for (k = 0; x->grad_in && k < x->nargs + x->nparams; k++)
    gcap_tensor_free(x->grad_in[k]);
  for (k = 0; x->params && k < x->nparams; k++) {
    gcap_tensor_free(x->params[k]);
    if (x->dw_grad) gcap_tensor_free(x->dw_grad[k]);
  }
  free(x->args);
  free(x->params);
  free(x->grad_in);
  free(x->dw_grad);
  free(x->sharers);
  for (k = 0; x->grad_out && k < x->out.n; k++)
    gcap_tensor_free(x->grad_out[k]);
  free(x->grad_out);
  outs_clear(&x->out);
  gcap_graph_free(x->fwd);
  gcap_graph_free(x->bwd);
  gcap_graph_free(x->dw);
  gcap_module_free(x->m);
  memset(x, 0, sizeof *x);
}

static void graphed_destroy(gcap_graphed *G) {
  gcap_engine *e = G->e;
  int i;
  for (i = 0; i < G->n; i++)
    entry_clear(&G->v[i]);
  free(G->v);
  gcap_pool_free(G->pool);
  free(G);
  gc_engine_unref(e);
}

gcap_graphed *gcap_graphed_retain(gcap_graphed *g) {
  if (g) g->refs++;
  return g;
}

void gcap_graphed_free(gcap_graphed *g) {
  int i;
  if (g == NULL || --g->refs > 0) return;
  for (i = 0; i < g->n; i++) /* modules no longer replay through us */
    if (g->v[i].m) gc_module_unroute(g->v[i].m, g, i);
  graphed_destroy(g);
}

int gcap_graphed_num_entries(const gcap_graphed *g) {
  return g ? g->n : 0;
}

gcap_module *gcap_graphed_module(const gcap_graphed *g, int entry) {
  return g && entry >= 0 && entry < g->n ? g->v[entry].m : NULL;
}

/* ------------------------------------------------------------------------ */
/* Construction state                                                        */

typedef struct ge_build {
  gcap_engine *e;
  gcap_graphed *G;
  const gcap_graphed_opts *o;
  gc_schedule sched;
  ge_outs *warm_out; /* [n] warmup outputs */
  int done, total;   /* progress within the phase */
  const char *phase;
  int pass;     /* index of the pass being captured */
  int prev_bwd; /* reuse: last backward entry captured, and its order position */
  int prev_bwd_pos;
  int last_l0; /* reuse: the l == 0 entry of the previous backward order value */
} ge_build;

static gcap_status run_hooks(ge_build *b, int c, gcap_hook_kind group) {
  const gcap_capture_hooks *h;
  gcap_module *m = b->G->v[0].m;
  int j;
  if (b->o->capture_time_hooks == NULL) return GCAP_OK;
  h = &b->o->capture_time_hooks[c];
  for (j = 0; j < b->G->n; j++)
    if (b->G->v[j].callable == c) {
      m = b->G->v[j].m;
      break;
    }
  for (j = 0; j < h->n[group]; j++) {
    gcap_status st;
    double t0 = gc_trace_clock(b->e);
    gc_clear(b->e);
    st = h->fn[group][j](h->ud[group] ? h->ud[group][j] : NULL, m);
    gc_trace_span(b->e, t0, "hook", "%s #%d of callable %d (%s)", gcap_hook_group_key(group), j + 1,
                  c + 1, gcap_module_type(m));
    if (st != GCAP_OK) {
      if (gcap_errmsg(b->e)[0] == '\0') /* the hook said nothing itself */
        gc_fail(b->e, st,
                "make_graphed_callables: capture_time_hooks %s #%d of callable %d (%s) failed in "
                "the %s%s%s%s",
                gcap_hook_group_key(group), j + 1, c + 1, gcap_module_type(m), b->phase,
                st == GCAP_EABORTED ? "" : " (", st == GCAP_EABORTED ? "" : gcap_status_str(st),
                st == GCAP_EABORTED ? "" : ")"); /* aborted: the hook's own error says why */
      return st;
    }
  }
  return GCAP_OK;
}

/* After a pass that ended with st: count it and tell the progress callback,
** whose non-OK status stops the work. */
static gcap_status progress(ge_build *b, gcap_status st) {
  if (st != GCAP_OK) return st;
  b->done++;
  if (b->o->progress == NULL) return GCAP_OK;
  gc_clear(b->e);
  st = b->o->progress(b->o->progress_ud, b->phase, b->done, b->total);
  if (st != GCAP_OK && gcap_errmsg(b->e)[0] == '\0') /* the callback said nothing itself */
    gc_fail(b->e, st, "make_graphed_callables: the progress callback stopped the %s at %d of %d",
            b->phase, b->done, b->total);
  return st;
}

/* Prefix the engine's message with the phase, entry and callable; only the
** place when a callback stopped the pass (GCAP_EABORTED: the callback's own
** error says why, and the engine's message may be an older one). */
static gcap_status where(ge_build *b, gcap_status st, int entry, const char *phase) {
  char msg[GC_ERRLEN + 2];
  const char *head = "make_graphed_callables: ";
  const char *text = st == GCAP_EABORTED ? "" : b->e->err;
  if (strncmp(text, head, strlen(head)) == 0) text += strlen(head);
  snprintf(msg, sizeof msg, "%s%s", *text ? ": " : "", text);
  return gc_fail(b->e, st, "make_graphed_callables: %s of entry %d (callable %d, %s)%s", phase,
                 entry + 1, b->G->v[entry].callable + 1, gcap_module_type(b->G->v[entry].m), msg);
}

/* Slot k of an entry's input surface: its args, then its params. */
static gcap_tensor *surface(const ge_entry *x, int k) {
  return k < x->nargs ? x->args[k] : x->params[k - x->nargs];
}

/* Drop the grads a pass left on the entry's surface. */
static void clear_grads(ge_entry *x) {
  int k;
  for (k = 0; k < x->nargs + x->nparams; k++) {
    gcap_tensor *t = surface(x, k);
    gcap_tensor_free(t->grad);
    t->grad = NULL;
  }
}

static gcap_status zeros_like(gcap_tensor *t, gcap_tensor **out) {
  return gcap_tensor_full(t->e, t->dt, t->ndim, t->shape, 0.0, out);
}

/* ------------------------------------------------------------------------ */
/* Warmup                                                                    */

/* Entry x's forward itself, its outputs into o (cleared first). */
static gcap_status forward_outs(ge_build *b, ge_entry *x, ge_outs *o) {
  gcap_tensor *ys[GCAP_MAX_OUTPUTS];
  gcap_status st;
  int n, k;
  outs_clear(o);
  if ((st = gc_module_forward(x->m, x->nargs, x->args, &n, ys)) != GCAP_OK) return st;
  if ((o->t = (gcap_tensor **)gc_calloc((size_t)n + 1, sizeof *o->t)) == NULL) {
    for (k = 0; k < n; k++)
      gcap_tensor_free(ys[k]);
    return gc_fail(b->e, GCAP_ENOMEM, "make_graphed_callables: out of host memory");
  }
  for (k = 0; k < n; k++)
    o->t[k] = ys[k];
  o->n = n;
  return GCAP_OK;
}

/* Backpropagate from the outputs of o that require grad, grads[k] output
** k's. */
static gcap_status outs_backward(const ge_outs *o, gcap_tensor *const *grads, int retain) {
  gcap_tensor *t[GCAP_MAX_OUTPUTS], *g[GCAP_MAX_OUTPUTS];
  int k, n = 0;
  for (k = 0; k < o->n; k++)
    if (o->t[k] != NULL && o->t[k]->requires_grad) {
      t[n] = o->t[k];
      g[n++] = grads[k];
    }
  return n > 0 ? gc_backward_many(n, t, g, retain) : GCAP_OK;
}

/* Is t on entry x's surface (an argument or a parameter)? */
static int on_surface(const ge_entry *x, const gcap_tensor *t) {
  int k;
  for (k = 0; k < x->nargs + x->nparams; k++)
    if (surface(x, k) == t) return 1;
  return 0;
}

/* Every leaf that requires grad behind the outputs o of entry i must be on
** its surface: a graphed backward gives grads to arguments and parameters
** only, so a tensor reached another way (a module or tensor a function
** closes over, a module not registered as a child) would get grads in
** warmup and never again. Refused, naming it, rather than lost. */
static gcap_status check_leaves(ge_build *b, int i, const ge_outs *o) {
  ge_entry *x = &b->G->v[i];
  uint64_t mark = ++b->e->bw_mark; /* the scheduler's marks, a fresh one */
  gc_node **stack = NULL;
  int n = 0, cap = 0, k;
  gcap_status st = GCAP_OK;
  for (k = 0; k < o->n; k++) {
    gc_node *r = o->t[k] != NULL ? o->t[k]->grad_fn : NULL;
    if (r == NULL || r->mark == mark) continue;
    r->mark = mark;
    for (stack = NULL, n = 0, cap = 0;;) {
      int j;
      for (j = 0; r != NULL && j < r->nin && st == GCAP_OK; j++) {
        gcap_tensor *leaf = r->leaf[j];
        gc_node *nx = r->next[j];
        if (leaf != NULL && !on_surface(x, leaf)) {
          char sh[64];
          st = gc_fail(b->e, GCAP_EINVAL,
                       "make_graphed_callables: warmup forward of entry %d (callable %d, %s): its "
                       "output depends on a %s %s tensor that requires grad and is neither an "
                       "argument nor a parameter of the callable (a module or tensor it reaches "
                       "through a closure, or a module not registered as a child?); its grad would "
                       "not be replayed: pass the module itself, register it as a child, pass the "
                       "tensor as an argument, or detach it",
                       i + 1, x->callable + 1, gcap_module_type(x->m),
                       gc_shape_str(leaf, sh, sizeof sh), gc_dtype_name(leaf->dt));
        }
        if (nx != NULL && nx->mark != mark) {
          nx->mark = mark;
          if (n == cap) {
            gc_node **v = (gc_node **)gc_realloc(stack, (size_t)(cap ? 2 * cap : 64) * sizeof *v);
            if (v == NULL) {
              st = gc_fail(b->e, GCAP_ENOMEM, "make_graphed_callables: out of host memory");
              break;
            }
            stack = v;
            cap = cap ? 2 * cap : 64;
          }
          stack[n++] = nx;
        }
      }
      if (st != GCAP_OK || n == 0) break;
      r = stack[--n];
    }
    free(stack);
    stack = NULL;
    if (st != GCAP_OK) break;
  }
  return st;
}

static gcap_status warm_fwd(ge_build *b, int i) {
  ge_entry *x = &b->G->v[i];
  gcap_status st;
  double t0;
  if ((st = run_hooks(b, x->callable, GCAP_HOOK_FORWARD_PRE)) != GCAP_OK) return st;
  t0 = gc_trace_clock(b->e);
  st = forward_outs(b, x, &b->warm_out[i]);
  gc_trace_span(b->e, t0, "warmup", "warmup forward of entry %d", i + 1);
  if (st != GCAP_OK) return where(b, st, i, "warmup forward");
  /* once, while the parameters are all there (before those that get no
  ** grad, such as a fused-wgrad weight, are pruned) */
  if (b->G->training && !x->params_known && (st = check_leaves(b, i, &b->warm_out[i])) != GCAP_OK)
    return st;
  return run_hooks(b, x->callable, GCAP_HOOK_FORWARD);
}

/* Keep only the params that got a grad (iteration 0); later iterations must
** agree. */
static gcap_status prune_params(ge_build *b, int i, int it) {
  ge_entry *x = &b->G->v[i];
  int k, kept = 0;
  for (k = 0; k < x->nargs; k++)
    if (x->args[k]->requires_grad && x->args[k]->grad == NULL && !b->o->allow_unused_input)
      return gc_fail(b->e, GCAP_EINVAL,
                     "make_graphed_callables: warmup backward of entry %d: sample argument #%d "
                     "requires grad, but its grad is None after the backward pass (set "
                     "allow_unused_input to allow it)",
                     i + 1, k + 1);
  for (k = 0; k < x->nparams; k++)
    kept += x->params[k]->grad != NULL;
  if (kept == x->nparams) {
    x->params_known = 1;
    return GCAP_OK;
  }
  if (x->params_known || it > 0)
    return gc_fail(b->e, GCAP_EINVAL,
                   "make_graphed_callables: warmup backward of entry %d: the set of parameters "
                   "getting a grad changed after warmup iteration 1 (no-grad parameters may only "
                   "appear in the first iteration)",
                   i + 1);
  for (k = 0, kept = 0; k < x->nparams; k++) {
    if (x->params[k]->grad != NULL)
      x->params[kept++] = x->params[k];
    else
      gcap_tensor_free(x->params[k]);
  }
  x->nparams = kept;
  x->params_known = 1;
  return GCAP_OK;
}

static gcap_status warm_bwd(ge_build *b, int i, int it) {
  ge_entry *x = &b->G->v[i];
  ge_outs *o = &b->warm_out[i], gout = {0, NULL};
  gcap_status st;
  int k, any = 0;
  if ((st = run_hooks(b, x->callable, GCAP_HOOK_BACKWARD_PRE)) != GCAP_OK) goto done;
  for (k = 0; k < o->n; k++)
    any |= o->t[k] != NULL && o->t[k]->requires_grad;
  if (any) {
    double t0 = gc_trace_clock(b->e);
    if ((gout.t = (gcap_tensor **)gc_calloc((size_t)o->n, sizeof *gout.t)) == NULL)
      st = gc_fail(b->e, GCAP_ENOMEM, "make_graphed_callables: out of host memory");
    gout.n = gout.t ? o->n : 0;
    for (k = 0; st == GCAP_OK && k < o->n; k++)
      if (o->t[k] != NULL && o->t[k]->requires_grad) st = zeros_like(o->t[k], &gout.t[k]);
    if (st == GCAP_OK) st = outs_backward(o, gout.t, 0);
    if (st == GCAP_OK && x->need_dw) st = gcap_module_backward_dw(x->m);
    gc_trace_span(b->e, t0, "warmup", "warmup backward of entry %d", i + 1);
    if (st != GCAP_OK) {
      st = where(b, st, i, "warmup backward");
      goto done;
    }
  }
  if ((st = prune_params(b, i, it)) != GCAP_OK) goto done;
  clear_grads(x);
  st = run_hooks(b, x->callable, GCAP_HOOK_BACKWARD);
done:
  clear_grads(x);
  outs_clear(&gout);
  outs_clear(o);
  return st;
}

/* ------------------------------------------------------------------------ */
/* Capture                                                                   */

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
  if ((st = gcap_capture_begin(*g, b->G->pool, NULL)) != GCAP_OK) return where(b, st, i, phase);
  st = fn(b, x);
  if (st != GCAP_OK) { /* capture_end clears the message: keep the op's reason */
    char why[GC_ERRLEN];
    snprintf(why, sizeof why, "%s", b->e->err);
    gcap_capture_end(*g); /* always ends, also after an error */
    gc_fail(b->e, st, "%s", why);
    return where(b, st, i, phase);
  }
  if ((st2 = gcap_capture_end(*g)) != GCAP_OK) return where(b, st2, i, phase);
  return GCAP_OK;
}

static gcap_status cap_fwd_body(ge_build *b, ge_entry *x) {
  return forward_outs(b, x, &x->out);
}

static gcap_status cap_bwd_body(ge_build *b, ge_entry *x) {
  return outs_backward(&x->out, x->grad_out, b->o->retain_graph_in_backward);
}

static gcap_status cap_dw_body(ge_build *b, ge_entry *x) {
  (void)b;
  return gcap_module_backward_dw(x->m);
}

static gcap_status cap_fwd(ge_build *b, int i) {
  ge_entry *x = &b->G->v[i];
  gcap_status st;
  int was = gcap_set_grad_enabled(b->e, b->G->training);
  if ((st = run_hooks(b, x->callable, GCAP_HOOK_FORWARD_PRE)) == GCAP_OK &&
      (st = capture(b, i, "forward", &x->fwd, cap_fwd_body)) == GCAP_OK)
    st = run_hooks(b, x->callable, GCAP_HOOK_FORWARD);
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
    gcap_tensor *t = surface(x, from + k);
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
  if ((st = capture(b, i, "delayed wgrad", &x->dw, cap_dw_body)) != GCAP_OK) return st;
  return take_grads(b, x, &x->dw_grad, x->nargs, x->nparams);
}

/* Reuse: grad outputs are read only inside a backward replay, after their
** copy-in, so entries whose outputs look alike share buffers (output k of x
** one that x's other outputs do not use). */
static gcap_tensor *shared_grad_out(ge_build *b, const ge_entry *x, int k) {
  int j, l, m;
  for (j = 0; j < b->G->n; j++) {
    const ge_entry *y = &b->G->v[j];
    for (l = 0; y != x && y->grad_out && l < y->out.n; l++) {
      gcap_tensor *g = y->grad_out[l];
      int taken = 0;
      if (g == NULL || !gc_same_layout(g, x->out.t[k])) continue;
      for (m = 0; m < k; m++)
        taken |= x->grad_out[m] == g;
      if (!taken) return gcap_tensor_retain(g);
    }
  }
  return NULL;
}

static gcap_status weaken_grads(ge_entry *x, int from) {
  int k;
  for (k = from; x->grad_in && k < x->nargs + x->nparams; k++) {
    gcap_status st = x->grad_in[k] ? gc_tensor_weaken(x->grad_in[k]) : GCAP_OK;
    if (st != GCAP_OK) return st;
  }
  return GCAP_OK;
}

/* Reuse (TE's rules): once entry i's backward is captured, its static output,
** its cloned parameter grads, the grads of the layer processed before it in
** the same backward, and (at the chunk's first layer) the grads of the
** previous backward's first layer are dead: their memory goes back to the
** pool while the captured graphs keep the addresses. */
static gcap_status release_dead(ge_build *b, int i) {
  ge_entry *x = &b->G->v[i];
  const gc_pass *p = &b->sched.v[b->pass];
  int last_layer = b->pass + 1 >= b->sched.n || b->sched.v[b->pass + 1].kind != GC_PASS_BWD ||
                   b->sched.v[b->pass + 1].pos != p->pos;
  gcap_status st;
  int k;
  for (k = 0; k < x->out.n; k++)
    if (x->out.t[k] && (st = gc_tensor_weaken(x->out.t[k])) != GCAP_OK) return st;
  if (b->G->clone && (st = weaken_grads(x, x->nargs)) != GCAP_OK) return st;
  if (b->prev_bwd >= 0 && b->prev_bwd_pos == p->pos &&
      (st = weaken_grads(&b->G->v[b->prev_bwd], 0)) != GCAP_OK)
    return st;
  b->prev_bwd = i;
  b->prev_bwd_pos = p->pos;
  if (last_layer) {
    if (b->last_l0 >= 0 && (st = weaken_grads(&b->G->v[b->last_l0], 0)) != GCAP_OK) return st;
    b->last_l0 = i;
  }
  return GCAP_OK;
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
    if (b->o->reuse_graph_input_output_buffers) x->grad_out[k] = shared_grad_out(b, x, k);
    if (x->grad_out[k] == NULL && (st = zeros_like(x->out.t[k], &x->grad_out[k])) != GCAP_OK)
      return st;
  }
  return GCAP_OK;
}

static gcap_status cap_bwd(ge_build *b, int i) {
  ge_entry *x = &b->G->v[i];
  gcap_status st;
  int k;
  if ((st = grad_outs(b, x)) != GCAP_OK) return where(b, st, i, "backward capture");
  if (x->ngrad > 0) {
    if ((st = run_hooks(b, x->callable, GCAP_HOOK_BACKWARD_PRE)) != GCAP_OK ||
        (st = capture(b, i, "backward", &x->bwd, cap_bwd_body)) != GCAP_OK)
      return st;
    if ((st = take_grads(b, x, &x->grad_in, 0, x->nargs + x->nparams)) != GCAP_OK) return st;
    if ((st = run_hooks(b, x->callable, GCAP_HOOK_BACKWARD)) != GCAP_OK) return st;
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
  return b->o->reuse_graph_input_output_buffers ? release_dead(b, i) : GCAP_OK;
}

/* ------------------------------------------------------------------------ */
/* Validation                                                                */

static gcap_status check_hooks(gcap_engine *e, int ncallables, const gcap_graphed_opts *o) {
  int c, g, j;
  if (o->capture_time_hooks == NULL) return GCAP_OK;
  if (o->num_capture_time_hooks != ncallables)
    return gc_fail(e, GCAP_EINVAL,
                   "make_graphed_callables: capture_time_hooks has %d entries, but there are %d "
                   "callables (one entry per callable, not per sample_args entry)",
                   o->num_capture_time_hooks, ncallables);
  for (c = 0; c < ncallables; c++)
    for (g = 0; g < GCAP_HOOK_KINDS; g++) {
      const gcap_capture_hooks *h = &o->capture_time_hooks[c];
      if (h->n[g] < 0 || (h->n[g] > 0 && h->fn[g] == NULL))
        return gc_fail(e, GCAP_EINVAL,
                       "make_graphed_callables: capture_time_hooks[%d].%s is malformed", c + 1,
                       gcap_hook_group_key(g));
      for (j = 0; j < h->n[g]; j++)
        if (h->fn[g][j] == NULL)
          return gc_fail(e, GCAP_EINVAL,
                         "make_graphed_callables: capture_time_hooks[%d].%s #%d is NULL", c + 1,
                         gcap_hook_group_key(g), j + 1);
    }
  return GCAP_OK;
}

static gcap_status check_inputs(gcap_engine *e, int ncallables, gcap_module *const *callables,
                                int nentries, const int *nargs, gcap_tensor *const *const *args,
                                const gcap_graphed_opts *o, int *training) {
  int c, i, k;
  gcap_status st;
  if (ncallables <= 0 || callables == NULL)
    return gc_fail(e, GCAP_EINVAL, "make_graphed_callables: no callables");
  if (nentries <= 0 || nargs == NULL || args == NULL)
    return gc_fail(e, GCAP_EINVAL, "make_graphed_callables: no sample_args");
  if (o->num_warmup_iters < 0)
    return gc_fail(e, GCAP_EINVAL, "make_graphed_callables: num_warmup_iters must be >= 0, got %d",
                   o->num_warmup_iters);
  for (c = 0; c < ncallables; c++) {
    if (callables[c] == NULL)
      return gc_fail(e, GCAP_EINVAL, "make_graphed_callables: callable %d is NULL", c + 1);
    if ((st = gc_module_check_graphable(callables[c], "make_graphed_callables")) != GCAP_OK)
      return st;
    if (gcap_module_training(callables[c]) != gcap_module_training(callables[0]))
      return gc_fail(e, GCAP_EINVAL,
                     "make_graphed_callables: modules must be all in training or all in eval "
                     "mode; callable 1 is in %s mode, callable %d in %s mode",
                     gcap_module_training(callables[0]) ? "training" : "eval", c + 1,
                     gcap_module_training(callables[c]) ? "training" : "eval");
  }
  *training = gcap_module_training(callables[0]);
  for (i = 0; i < nentries; i++) {
    if (nargs[i] < 0 || (nargs[i] > 0 && args[i] == NULL))
      return gc_fail(e, GCAP_EINVAL, "make_graphed_callables: sample_args[%d] is malformed", i + 1);
    for (k = 0; k < nargs[i]; k++) {
      gcap_tensor *t = args[i][k];
      if (t == NULL)
        return gc_fail(e, GCAP_EINVAL,
                       "make_graphed_callables: sample_args[%d][%d] is not a tensor", i + 1, k + 1);
      if (t->e != e)
        return gc_fail(e, GCAP_EINVAL,
                       "make_graphed_callables: sample_args[%d][%d] belongs to another engine",
                       i + 1, k + 1);
      if (t->requires_grad && t->grad_fn != NULL)
        return gc_fail(
            e, GCAP_EINVAL,
            "make_graphed_callables: sample_args[%d][%d] requires grad but is not a leaf "
            "(made by '%s'); pass a leaf (detach it and set requires_grad)",
            i + 1, k + 1, t->grad_fn->name);
    }
  }
  if (o->reuse_graph_input_output_buffers && o->order == NULL)
    return gc_fail(e, GCAP_EINVAL,
                   "make_graphed_callables: reuse_graph_input_output_buffers needs order");
  if (o->reuse_graph_input_output_buffers && !*training)
    return gc_fail(e, GCAP_EINVAL,
                   "make_graphed_callables: reuse_graph_input_output_buffers needs training mode");
  return check_hooks(e, ncallables, o);
}

/* ------------------------------------------------------------------------ */
/* The call                                                                  */

/* Every .grad the call may touch, taken away at the start and given back at
** the end, whatever happens in between. */
typedef struct grad_snap {
  gcap_tensor **t, **grad;
  int n, cap;
  int taken; /* the .grad values are in grad[] */
} grad_snap;

static gcap_status snap_add(gcap_engine *e, grad_snap *s, gcap_tensor *t) {
  if (s->n == s->cap) {
    int cap = s->cap ? 2 * s->cap : 32;
    gcap_tensor **a = (gcap_tensor **)gc_realloc(s->t, (size_t)cap * sizeof *a);
    if (a == NULL) return gc_fail(e, GCAP_ENOMEM, "make_graphed_callables: out of host memory");
    s->t = a;
    if ((a = (gcap_tensor **)gc_realloc(s->grad, (size_t)cap * sizeof *a)) == NULL)
      return gc_fail(e, GCAP_ENOMEM, "make_graphed_callables: out of host memory");
    s->grad = a;
    s->cap = cap;
  }
  s->t[s->n++] = gcap_tensor_retain(t);
  return GCAP_OK;
}

static int cmp_addr(const void *a, const void *b) {
  const gcap_tensor *ta = *(gcap_tensor *const *)a, *tb = *(gcap_tensor *const *)b;
  uintptr_t x = (uintptr_t)ta, y = (uintptr_t)tb;
  return (x > y) - (x < y);
}

/* Take the .grad of every tensor added, each once (a parameter shared by
** several callables is added once per callable): sorted, so in n log n. */
static void snap_take(grad_snap *s) {
  int k, n = 0;
  if (s->n > 1) qsort(s->t, (size_t)s->n, sizeof *s->t, cmp_addr); /* t is NULL when n is 0 */
  for (k = 0; k < s->n; k++) {
    if (n > 0 && s->t[n - 1] == s->t[k]) {
      gcap_tensor_free(s->t[k]);
      continue;
    }
    s->t[n] = s->t[k];
    s->grad[n] = s->t[n]->grad;
    s->t[n]->grad = NULL;
    n++;
  }
  s->n = n;
  s->taken = 1;
}

static void snap_restore(grad_snap *s) {
  int k;
  for (k = 0; k < s->n; k++) {
    if (s->taken) {
      gcap_tensor_free(s->t[k]->grad);
      s->t[k]->grad = s->grad[k];
    }
    gcap_tensor_free(s->t[k]);
  }
  free(s->t);
  free(s->grad);
}

static gcap_status build_entries(ge_build *b, gcap_module *const *callables, const int *nargs,
                                 gcap_tensor *const *const *args, grad_snap *snap) {
  gcap_graphed *G = b->G;
  int i, k;
  gcap_status st;
  for (i = 0; i < G->n; i++) {
    ge_entry *x = &G->v[i];
    x->callable = b->sched.entry_callable[i];
    x->m = gcap_module_retain(callables[x->callable]);
    x->nargs = nargs[i];
    x->nparams = gcap_module_num_parameters(x->m);
    x->need_dw = G->training && gcap_module_has_delayed_wgrad(x->m);
    x->args = (gcap_tensor **)gc_calloc((size_t)x->nargs + 1, sizeof *x->args);
    x->params = (gcap_tensor **)gc_calloc((size_t)x->nparams + 1, sizeof *x->params);
    if (x->args == NULL || x->params == NULL)
      return gc_fail(b->e, GCAP_ENOMEM, "make_graphed_callables: out of host memory");
    for (k = 0; k < x->nargs; k++) {
      x->args[k] = gcap_tensor_retain(args[i][k]);
      if ((st = snap_add(b->e, snap, x->args[k])) != GCAP_OK) return st;
    }
    for (k = 0; k < x->nparams; k++) {
      x->params[k] = gcap_tensor_retain(gcap_module_parameter(x->m, k, NULL, 0));
      x->trainable |= x->params[k]->requires_grad;
      if ((st = snap_add(b->e, snap, x->params[k])) != GCAP_OK) return st;
    }
  }
  snap_take(snap);
  for (i = 0; i < b->sched.n; i++) {
    gc_pass *p = &b->sched.v[i];
    if (p->kind == GC_PASS_DW && !G->v[p->entry].need_dw)
      return gc_fail(b->e, GCAP_EINVAL,
                     "make_graphed_callables: the order has a delayed wgrad for entry %d, but its "
                     "module (%s) has no Linear with delay_wgrad",
                     p->entry + 1, gcap_module_type(G->v[p->entry].m));
  }
  return GCAP_OK;
}

static int same_inputs(const ge_entry *a, const ge_entry *c) {
  int k;
  if (a->nargs != c->nargs) return 0;
  for (k = 0; k < a->nargs; k++)
    if (!gc_same_layout(a->args[k], c->args[k])) return 0;
  return 1;
}

/* Reuse, TE's pre-pass: a forward takes the static inputs of an entry whose
** backward is done (same shapes and dtypes), oldest first. */
static gcap_status share_inputs(ge_build *b) {
  gcap_graphed *G = b->G;
  int *fq = (int *)gc_malloc(sizeof(int) * (size_t)G->n * 3 + sizeof(int)), *done, *chunk;
  int nfq = 0, ndone = 0, i, j, k;
  if (fq == NULL) return gc_fail(b->e, GCAP_ENOMEM, "make_graphed_callables: out of host memory");
  done = fq + G->n;
  chunk = done + G->n;
  for (i = 0; i < b->sched.n; i++)
    chunk[b->sched.v[i].entry] = b->sched.v[i].chunk;
  for (i = 0; i < b->sched.n; i++) {
    const gc_pass *p = &b->sched.v[i];
    if (p->kind == GC_PASS_FWD) {
      ge_entry *x = &G->v[p->entry];
      fq[nfq++] = p->entry;
      for (j = 0; j < ndone; j++)
        if (same_inputs(&G->v[done[j]], x)) {
          ge_entry *y = &G->v[done[j]];
          for (k = 0; k < x->nargs; k++) {
            gcap_tensor_free(x->args[k]);
            x->args[k] = gcap_tensor_retain(y->args[k]);
          }
          memmove(done + j, done + j + 1, (size_t)(ndone - j - 1) * sizeof *done);
          ndone--;
          break;
        }
    } else if (p->kind == GC_PASS_BWD) { /* frees the oldest forward of its chunk */
      for (j = 0; j < nfq; j++)
        if (chunk[fq[j]] == p->chunk) {
          done[ndone++] = fq[j];
          memmove(fq + j, fq + j + 1, (size_t)(nfq - j - 1) * sizeof *fq);
          nfq--;
          break;
        }
    }
  }
  free(fq);
  for (i = 0; i < G->n; i++) { /* who shares with whom, once, for the replay-time check */
    ge_entry *x = &G->v[i];
    for (j = 0; j < G->n; j++) {
      int shared = 0, kk;
      for (k = 0; j != i && !shared && k < x->nargs; k++)
        for (kk = 0; !shared && kk < G->v[j].nargs; kk++)
          shared = x->args[k] == G->v[j].args[kk];
      if (!shared) continue;
      if (x->sharers == NULL &&
          (x->sharers = (int *)gc_malloc((size_t)G->n * sizeof *x->sharers)) == NULL)
        return gc_fail(b->e, GCAP_ENOMEM, "make_graphed_callables: out of host memory");
      x->sharers[x->nsharers++] = j;
    }
  }
  return GCAP_OK;
}

/* The pre or post warmup hook, traced. */
static gcap_status warm_hook(ge_build *b, const char *name, gcap_status (*fn)(void *), void *ud) {
  double t0 = gc_trace_clock(b->e);
  gcap_status st = fn(ud);
  gc_trace_span(b->e, t0, "hook", "%s", name);
  return st;
}

static gcap_status warmup(ge_build *b) {
  const gcap_graphed_opts *o = b->o;
  gcap_graphed *G = b->G;
  gcap_stream *side = NULL;
  gcap_event *ready = NULL;
  gcap_status st;
  double t0 = gc_trace_clock(b->e), ti;
  int it, i;
  if ((st = gcap_stream_new(b->e, &side)) != GCAP_OK) return st;
  /* the side stream starts after the caller's pending work (inputs, weights) */
  if ((st = gcap_event_new(b->e, &ready)) != GCAP_OK ||
      (st = gcap_event_record(ready, b->e->current)) != GCAP_OK ||
      (st = gcap_stream_wait_event(side, ready)) != GCAP_OK) {
    gcap_event_free(ready);
    gcap_stream_free(side);
    return st;
  }
  gcap_event_free(ready);
  b->e->warm_prev = b->e->current; /* a hook may free it: stream.c redirects this */
  b->e->current = side;
  b->phase = "warmup";
  if (o->pre_warmup_hook &&
      (st = warm_hook(b, "pre_warmup_hook", o->pre_warmup_hook, o->pre_warmup_ud)) != GCAP_OK)
    goto done;
  for (it = 0; it < o->num_warmup_iters && st == GCAP_OK; it++) {
    ti = gc_trace_clock(b->e);
    if (o->order == NULL) {
      for (i = 0; i < G->n && st == GCAP_OK; i++, st = progress(b, st))
        st = warm_fwd(b, i);
      for (i = G->n - 1; G->training && i >= 0 && st == GCAP_OK; i--, st = progress(b, st))
        st = warm_bwd(b, i, it);
    } else
      for (i = 0; i < b->sched.n && st == GCAP_OK; i++, st = progress(b, st)) {
        gc_pass *p = &b->sched.v[i];
        if (p->kind == GC_PASS_FWD)
          st = warm_fwd(b, p->entry);
        else if (p->kind == GC_PASS_BWD)
          st = warm_bwd(b, p->entry, it);
      }
    gc_trace_span(b->e, ti, "warmup", "warmup iteration %d", it + 1);
  }
  if (st == GCAP_OK && o->post_warmup_hook)
    st = warm_hook(b, "post_warmup_hook", o->post_warmup_hook, o->post_warmup_ud);
  if (st == GCAP_OK) st = gcap_stream_synchronize(side);
done:
  b->e->current = b->e->warm_prev;
  b->e->warm_prev = NULL;
  gcap_stream_free(side);
  gc_trace_span(b->e, t0, "warmup", "warmup");
  return st;
}

static gcap_status capture_all(ge_build *b) {
  gcap_graphed *G = b->G;
  gcap_status st = GCAP_OK;
  int i;
  b->phase = "capture";
  b->prev_bwd = b->last_l0 = -1;
  for (i = 0; i < b->sched.n && st == GCAP_OK; i++, st = progress(b, st)) {
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
  return st;
}

/* The route a graphed module's calls take (gc_module_set_route): the replay
** of entry `entry` of the graphed object ud. */
static gcap_status route_call(void *ud, int entry, int nin, gcap_tensor *const *in, int *nout,
                              gcap_tensor **out) {
  return gcap_graphed_call_n((gcap_graphed *)ud, entry, nin, in, GCAP_MAX_OUTPUTS, nout, out);
}

static gcap_status make_graphed(gcap_engine *e, int ncallables, gcap_module *const *callables,
                                int nentries, const int *nargs, gcap_tensor *const *const *args,
                                const gcap_graphed_opts *opts, gcap_graphed **out) {
  gcap_graphed_opts defaults;
  gc_seg *segs_before = opts && opts->pool ? opts->pool->segs : NULL;
  ge_build b;
  grad_snap snap = {NULL, NULL, 0, 0, 0};
  uint64_t rng[2];
  int training = 1, i, warm_passes;
  gcap_status st;
  if (out == NULL) return GCAP_EINVAL;
  *out = NULL;
  if (e == NULL) return GCAP_EINVAL;
  if ((st = gc_check_open(e, "make_graphed_callables")) != GCAP_OK) return st;
  if (opts == NULL) {
    gcap_graphed_opts_init(&defaults);
    opts = &defaults;
  }
  if ((st = gc_check_not_capturing(e, "make_graphed_callables")) != GCAP_OK) return st;
  if (e->warm_prev != NULL)
    return gc_fail(e, GCAP_ESTATE,
                   "make_graphed_callables: not allowed inside another make_graphed_callables' "
                   "warmup (from its hooks or forwards)");
  if ((st = check_inputs(e, ncallables, callables, nentries, nargs, args, opts, &training)) !=
      GCAP_OK)
    return st;
  memset(&b, 0, sizeof b);
  b.e = e;
  b.o = opts;
  if ((st = gc_schedule_build(e, opts->order, opts->order_len, opts->num_layers_per_chunk,
                              opts->num_chunks, ncallables, nentries, training, &b.sched)) !=
      GCAP_OK)
    goto fail0;
  /* the replay object, empty until everything worked */
  if ((b.G = (gcap_graphed *)gc_calloc(1, sizeof *b.G)) == NULL ||
      (b.G->v = (ge_entry *)gc_calloc((size_t)nentries, sizeof *b.G->v)) == NULL ||
      (b.warm_out = (ge_outs *)gc_calloc((size_t)nentries, sizeof *b.warm_out)) == NULL) {
    if (b.G) free(b.G->v);
    free(b.G);
    b.G = NULL;
    st = gc_fail(e, GCAP_ENOMEM, "make_graphed_callables: out of host memory");
    goto fail0;
  }
  b.G->refs = 1;
  b.G->e = e;
  b.G->n = nentries;
  b.G->training = training;
  b.G->clone = opts->clone_param_grads_on_return;
  b.G->reuse = opts->reuse_graph_input_output_buffers;
  gc_engine_ref(e);
  if ((st = e->be->download(e, e->bs, e->current->bs, rng, e->rng->ptr, sizeof rng)) != GCAP_OK)
    goto fail;
  for (i = 0; i < ncallables; i++)
    gc_module_wgrad_aside(callables[i], 1);
  if ((st = build_entries(&b, callables, nargs, args, &snap)) != GCAP_OK) goto fail;
  if (opts->reuse_graph_input_output_buffers && (st = share_inputs(&b)) != GCAP_OK) goto fail;
  warm_passes = opts->order ? b.sched.n : nentries * (training ? 2 : 1);
  b.total = warm_passes * opts->num_warmup_iters;
  if ((st = warmup(&b)) != GCAP_OK) goto fail;
  b.done = 0;
  b.total = b.sched.n;
  if (opts->pool)
    b.G->pool = gcap_pool_retain(opts->pool);
  else if ((st = gcap_pool_new(e, &b.G->pool)) != GCAP_OK)
    goto fail;
  if ((st = capture_all(&b)) != GCAP_OK) goto fail;
  for (i = 0; i < ncallables; i++)
    gc_module_wgrad_aside(callables[i], 0);
  snap_restore(&snap);
  st = e->be->upload(e, e->bs, e->current->bs, e->rng->ptr, rng,
                     sizeof rng); /* warmup drew nothing */
  for (i = 0; i < nentries; i++)
    outs_clear(&b.warm_out[i]);
  free(b.warm_out);
  gc_schedule_free(&b.sched);
  if (st != GCAP_OK) {
    gcap_graphed_free(b.G);
    return st;
  }
  if (opts->order == NULL)
    for (i = 0; i < nentries; i++)
      gc_module_set_route(b.G->v[i].m, route_call, b.G, i);
  *out = b.G;
  return GCAP_OK;
fail : {
  char msg[GC_ERRLEN];
  snprintf(msg, sizeof msg, "%s", e->err);
  snap_restore(&snap);
  for (i = 0; i < ncallables; i++)
    gc_module_wgrad_aside(callables[i], 0);
  for (i = 0; i < nentries; i++)
    outs_clear(&b.warm_out[i]);
  free(b.warm_out);
  graphed_destroy(b.G);
  if (opts->pool) gc_pool_trim_since(opts->pool, segs_before);
  e->be->upload(e, e->bs, e->current->bs, e->rng->ptr, rng, sizeof rng);
  gc_fail(e, st, "%s", msg);
}
fail0:
  gc_schedule_free(&b.sched);
  return st;
}

gcap_status gcap_make_graphed_callables(gcap_engine *e, int ncallables,
                                        gcap_module *const *callables, int nentries,
                                        const int *nargs, gcap_tensor *const *const *args,
                                        const gcap_graphed_opts *opts, gcap_graphed **out) {
  double t0 = e ? gc_trace_clock(e) : 0.0;
  gcap_status st = make_graphed(e, ncallables, callables, nentries, nargs, args, opts, out);
  if (e) gc_trace_span(e, t0, "graphed", "make_graphed_callables%s", st ? " (failed)" : "");
  return st;
}

/* ------------------------------------------------------------------------ */
/* Replay                                                                    */

/* The autograd node of a replayed forward: its backward is pending until it
** runs, or until the node is dropped (then it never will). With several
** outputs that require grad, each output's node keeps its grad in got[]
** until the replay's node runs. */
typedef struct ge_ref {
  gcap_graphed *G;
  int entry;
  int pending;
  gcap_tensor **got; /* [out.n] grads arrived, or NULL (one grad output) */
} ge_ref;

static void ge_ref_free(void *ud) {
  ge_ref *r = (ge_ref *)ud;
  ge_entry *x = &r->G->v[r->entry];
  int k;
  if (r->pending) x->fwd_pending--;
  for (k = 0; r->got && k < x->out.n; k++)
    gcap_tensor_free(r->got[k]);
  free(r->got);
  gcap_graphed_free(r->G);
  free(r);
}

static gcap_status entry_ok(gcap_graphed *G, int entry, const char *what) {
  if (G == NULL) return GCAP_EINVAL;
  gc_clear(G->e);
  if (entry < 0 || entry >= G->n)
    return gc_fail(G->e, GCAP_EINVAL, "%s: entry %d out of range 1..%d", what, entry + 1, G->n);
  if (G->v[entry].reset)
    return gc_fail(G->e, GCAP_ESTATE,
                   "%s: entry %d (callable %d, %s) was reset; its graphs are gone (graph it "
                   "again with make_graphed_callables)",
                   what, entry + 1, G->v[entry].callable + 1, gcap_module_type(G->v[entry].m));
  return GCAP_OK;
}

/* The grads of the outputs into their static buffers: g (one grad output),
** or what each output's node kept, zeros where none arrived (as TE's). */
static gcap_status grads_in(ge_entry *x, ge_ref *r, gcap_tensor *g) {
  gcap_status st = GCAP_OK;
  int k;
  if (r->got == NULL)
    return gc_tensor_ptr(g) != gc_tensor_ptr(x->grad_out[x->grad1])
               ? gcap_copy_(x->grad_out[x->grad1], g)
               : GCAP_OK;
  for (k = 0; k < x->out.n && st == GCAP_OK; k++) {
    gcap_tensor *s = x->grad_out[k], *got = r->got[k];
    if (s == NULL) continue;
    r->got[k] = NULL;
    if (got == NULL)
      st = gcap_zero_(s);
    else if (gc_tensor_ptr(got) != gc_tensor_ptr(s))
      st = gcap_copy_(s, got);
    gcap_tensor_free(got);
  }
  return st;
}

/* Backward of a replayed forward: grads in, backward graph, grads out. */
static gcap_status ge_backward(gc_node *n, gcap_tensor *g, gcap_tensor **gin) {
  ge_ref *r = (ge_ref *)n->ud;
  gcap_graphed *G = r->G;
  ge_entry *x = &G->v[r->entry];
  gcap_status st;
  double t0 = gc_trace_clock(G->e);
  int k;
  if (x->reset)
    return gc_fail(G->e, GCAP_ESTATE, "graphed backward: entry %d was reset", r->entry + 1);
  if (x->bwd == NULL)
    return gc_fail(G->e, GCAP_ESTATE, "graphed backward: entry %d has no backward graph",
                   r->entry + 1);
  if ((st = grads_in(x, r, g)) != GCAP_OK) return st;
  if ((st = gcap_graph_replay(x->bwd)) != GCAP_OK) return st;
  gc_trace_span(G->e, t0, "replay", "graphed backward of entry %d", r->entry + 1);
  if (r->pending) {
    r->pending = 0;
    x->fwd_pending--;
  }
  for (k = 0; k < x->nargs + x->nparams; k++) {
    gcap_tensor *s = x->grad_in[k];
    if (s == NULL || !gc_node_needs(n, k)) continue;
    if (k >= x->nargs && !G->clone && n->leaf[k] != NULL && n->leaf[k]->grad == NULL &&
        !s->blk->weak) {
      n->leaf[k]->grad =
          gc_tensor_alias(s, s->ndim, s->shape); /* the static buffer itself, as TE */
      if (n->leaf[k]->grad == NULL)
        return gc_fail(G->e, GCAP_ENOMEM, "graphed backward: out of host memory");
      continue;
    }
    if (n->leaf[k] != NULL) { /* only read, into .grad: no alias needed */
      gin[k] = gcap_tensor_retain(s);
      continue;
    }
    if ((gin[k] = gc_tensor_alias(s, s->ndim, s->shape)) == NULL)
      return gc_fail(G->e, GCAP_ENOMEM, "graphed backward: out of host memory");
  }
  return GCAP_OK;
}

/* Backward of output k (n->k[0]) of a replay of several grad outputs: keep
** its grad for the replay's stand-in node (ge_backward), which runs once
** after every output node this backward reaches. The first output node that
** gets a grad clears what an earlier pass left and passes the stand-in a
** grad (of its shape; it reads none): an output node that gets none does not
** run, so waiting for the last one would lose the others' grads. */
static gcap_status ge_out_backward(gc_node *n, gcap_tensor *g, gcap_tensor **gin) {
  gc_node *join = n->next[0];
  ge_ref *r = (ge_ref *)join->ud;
  ge_entry *x = &r->G->v[r->entry];
  int k = (int)n->k[0], i;
  if (gc_node_first_delivery(join)) {
    for (i = 0; i < x->out.n; i++) {
      gcap_tensor_free(r->got[i]);
      r->got[i] = NULL;
    }
    gin[0] = gcap_tensor_retain(x->grad_out[x->grad1]);
  }
  gcap_tensor_free(r->got[k]);
  r->got[k] = gcap_tensor_retain(g);
  return GCAP_OK;
}

/* Reuse: entries share static inputs, which a backward may still read (saved
** activations). A forward into a shared input while another entry's backward
** is pending would overwrite it: refused, like a replay out of pool order. */
static gcap_status check_shared_inputs(gcap_graphed *G, int entry) {
  const ge_entry *x = &G->v[entry];
  int s;
  for (s = 0; s < x->nsharers; s++)
    if (G->v[x->sharers[s]].fwd_pending)
      return gc_fail(G->e, GCAP_EREPLAY,
                     "graphed call of entry %d refused: it shares a static input with entry %d "
                     "(reuse_graph_input_output_buffers), whose backward has not run yet; replay "
                     "in the order the schedule was captured",
                     entry + 1, x->sharers[s] + 1);
  return GCAP_OK;
}

/* The arguments of a call of entry i: tensors of this engine, and for a
** replay (`replay`) as many as captured, each of its static input's shape
** and dtype (a copy-in of another shape would be read as the captured one). */
static gcap_status check_call_args(gcap_graphed *G, int entry, int nin, gcap_tensor *const *in,
                                   int replay) {
  const ge_entry *x = &G->v[entry];
  int k;
  if (nin < 0 || (nin > 0 && in == NULL))
    return gc_fail(G->e, GCAP_EINVAL, "graphed call of entry %d: %d arguments %s", entry + 1, nin,
                   nin < 0 ? "(a negative count)" : "but the argument array is NULL");
  for (k = 0; k < nin; k++)
    if (in[k] == NULL || in[k]->e != G->e)
      return gc_fail(G->e, GCAP_EINVAL, "graphed call of entry %d: argument #%d is %s", entry + 1,
                     k + 1, in[k] == NULL ? "NULL" : "a tensor of another engine");
  if (!replay) return GCAP_OK;
  if (nin != x->nargs)
    return gc_fail(G->e, GCAP_EINVAL,
                   "graphed call of entry %d: expected %d tensor arguments, got %d", entry + 1,
                   x->nargs, nin);
  for (k = 0; k < nin; k++)
    if (!gc_same_layout(in[k], x->args[k])) {
      char b1[64], b2[64];
      return gc_fail(G->e, GCAP_EINVAL,
                     "graphed call of entry %d (callable %d, %s), argument #%d: shape %s %s does "
                     "not match the captured %s %s",
                     entry + 1, x->callable + 1, gcap_module_type(x->m), k + 1,
                     gc_shape_str(in[k], b1, sizeof b1), gc_dtype_name(in[k]->dt),
                     gc_shape_str(x->args[k], b2, sizeof b2), gc_dtype_name(x->args[k]->dt));
    }
  return GCAP_OK;
}

/* Record the replay's node on y (its inputs: the call's, then the
** parameters) with state r, which the node owns from then on (freed here
** if the node could not be made). */
static gcap_status record_replay(gcap_graphed *G, ge_entry *x, int nin, gcap_tensor *const *in,
                                 gcap_tensor *y, ge_ref *r) {
  gcap_tensor **surf, *small[16] = {NULL};
  gc_node *n;
  gcap_status st;
  int k, ns = x->nargs + x->nparams;
  surf = ns <= 16 ? small : (gcap_tensor **)gc_malloc((size_t)ns * sizeof *surf);
  if (surf == NULL) {
    ge_ref_free(r);
    return gc_fail(G->e, GCAP_ENOMEM, "graphed call: out of host memory");
  }
  for (k = 0; k < ns; k++)
    surf[k] = k < nin ? in[k] : x->params[k - nin];
  st = gc_record(y, "graphed", ge_backward, surf, ns, NULL, 0, &n);
  if (surf != small) free(surf);
  if (st != GCAP_OK) {
    ge_ref_free(r);
    return st;
  }
  n->ud = r;
  n->ud_free = ge_ref_free;
  return GCAP_OK;
}

/* Several outputs that require grad: the replay's node goes on a stand-in
** tensor, and each such output gets a node passing its grad on to it. r as
** for record_replay. */
static gcap_status record_outputs(gcap_graphed *G, ge_entry *x, int nin, gcap_tensor *const *in,
                                  gcap_tensor **out, ge_ref *r) {
  gcap_tensor *base = x->out.t[x->grad1], *join;
  gcap_status st;
  int k;
  if ((r->got = (gcap_tensor **)gc_calloc((size_t)x->out.n, sizeof *r->got)) == NULL ||
      (join = gc_tensor_alias(base, base->ndim, base->shape)) == NULL) {
    ge_ref_free(r);
    return gc_fail(G->e, GCAP_ENOMEM, "graphed call: out of host memory");
  }
  if ((st = record_replay(G, x, nin, in, join, r)) != GCAP_OK) {
    gcap_tensor_free(join);
    return st;
  }
  for (k = 0; k < x->out.n && st == GCAP_OK; k++) {
    gc_node *n;
    if (x->grad_out[k] == NULL) continue;
    if ((st = gc_record(out[k], "graphed output", ge_out_backward, &join, 1, NULL, 0, &n)) ==
        GCAP_OK)
      n->k[0] = k;
  }
  gcap_tensor_free(join); /* the outputs' nodes hold its node (and r) */
  return st;
}

/* The eager call of a module in another mode than at capture: its own
** forward, its outputs into out (room for maxout). */
static gcap_status eager_call(gcap_graphed *G, ge_entry *x, int nin, gcap_tensor *const *in,
                              int maxout, int *nout, gcap_tensor **out) {
  gcap_tensor *ys[GCAP_MAX_OUTPUTS];
  gcap_status st;
  int n, k;
  if ((st = gc_module_forward(x->m, nin, in, &n, ys)) != GCAP_OK) return st;
  if (n > maxout) {
    for (k = 0; k < n; k++)
      gcap_tensor_free(ys[k]);
    return gc_fail(G->e, GCAP_EINVAL, "graphed call: %s gave %d outputs, room for %d",
                   gcap_module_type(x->m), n, maxout);
  }
  for (k = 0; k < n; k++)
    out[k] = ys[k];
  *nout = n;
  return GCAP_OK;
}

static void drop_outs(int n, gcap_tensor **out) {
  int k;
  for (k = 0; k < n; k++) {
    gcap_tensor_free(out[k]);
    out[k] = NULL;
  }
}

static gcap_status graphed_call(gcap_graphed *G, int entry, int nin, gcap_tensor *const *in,
                                int maxout, int *nout, gcap_tensor **out) {
  ge_entry *x;
  gcap_status st;
  int k, was, replay;
  if (out == NULL || nout == NULL) return GCAP_EINVAL;
  *nout = 0;
  if ((st = entry_ok(G, entry, "graphed call")) != GCAP_OK) return st;
  x = &G->v[entry];
  replay = gcap_module_training(x->m) == G->training; /* else: eager, as in another mode */
  if ((st = check_call_args(G, entry, nin, in, replay)) != GCAP_OK) return st;
  if (!replay) return eager_call(G, x, nin, in, maxout, nout, out);
  if (x->out.n > maxout)
    return gc_fail(G->e, GCAP_EINVAL,
                   "graphed call of entry %d (callable %d, %s): it has %d outputs, room for %d%s",
                   entry + 1, x->callable + 1, gcap_module_type(x->m), x->out.n, maxout,
                   maxout == 1 ? " (gcap_graphed_call_n takes several)" : "");
  if (G->reuse && (st = check_shared_inputs(G, entry)) != GCAP_OK) return st;
  was = gcap_set_grad_enabled(G->e, 0);
  for (k = 0; k < nin; k++) {
    if (gc_tensor_ptr(in[k]) != gc_tensor_ptr(x->args[k]) &&
        (st = gcap_copy_(x->args[k], in[k])) != GCAP_OK) {
      gcap_set_grad_enabled(G->e, was);
      return st;
    }
  }
  gcap_set_grad_enabled(G->e, was);
  if ((st = gcap_graph_replay(x->fwd)) != GCAP_OK) return st;

  for (k = 0; k < x->out.n; k++) {
    gcap_tensor *t = x->out.t[k];
    out[k] = NULL;
    if (t != NULL && (out[k] = gc_tensor_alias(t, t->ndim, t->shape)) == NULL) {
      drop_outs(k, out);
      return gc_fail(G->e, GCAP_ENOMEM, "graphed call: out of host memory");
    }
  }
  if (x->bwd != NULL && G->e->grad_enabled) {
    int any = x->trainable;
    for (k = 0; k < nin; k++)
      any |= in[k]->requires_grad;
    if (any) {
      ge_ref *r = (ge_ref *)gc_calloc(1, sizeof *r);
      if (r == NULL) {
        drop_outs(x->out.n, out);
        return gc_fail(G->e, GCAP_ENOMEM, "graphed call: out of host memory");
      }
      r->G = gcap_graphed_retain(G);
      r->entry = entry;
      st = x->ngrad == 1 ? record_replay(G, x, nin, in, out[x->grad1], r)
                         : record_outputs(G, x, nin, in, out, r);
      if (st != GCAP_OK) { /* r went with its node, or was freed */
        drop_outs(x->out.n, out);
        return st;
      }
      r->pending = 1;
      x->fwd_pending++;
    }
  }
  *nout = x->out.n;
  return GCAP_OK;
}

gcap_status gcap_graphed_call_n(gcap_graphed *G, int entry, int nin, gcap_tensor *const *in,
                                int maxout, int *nout, gcap_tensor **out) {
  double t0 = G ? gc_trace_clock(G->e) : 0.0;
  gcap_status st = graphed_call(G, entry, nin, in, maxout, nout, out);
  if (G) gc_trace_span(G->e, t0, "replay", "graphed forward of entry %d", entry + 1);
  return st;
}

gcap_status gcap_graphed_call(gcap_graphed *G, int entry, int nin, gcap_tensor *const *in,
                              gcap_tensor **out) {
  gcap_status st;
  int n;
  if (out == NULL) return GCAP_EINVAL;
  *out = NULL;
  if ((st = gcap_graphed_call_n(G, entry, nin, in, 1, &n, out)) != GCAP_OK) return st;
  if (n == 1 && *out != NULL) return GCAP_OK;
  drop_outs(n, out);
  return gc_fail(G->e, GCAP_EINVAL,
                 "graphed call of entry %d: its output is absent; gcap_graphed_call takes one "
                 "tensor",
                 entry + 1);
}

int gcap_graphed_num_outputs(const gcap_graphed *g, int entry) {
  return g && entry >= 0 && entry < g->n ? g->v[entry].out.n : -1;
}

gcap_status gcap_graphed_backward_dw(gcap_graphed *G, int entry) {
  ge_entry *x;
  gc_acc_run run;
  gcap_status st, st2;
  double t0;
  int k, was;
  if ((st = entry_ok(G, entry, "backward_dw")) != GCAP_OK) return st;
  x = &G->v[entry];
  if (x->dw == NULL) return GCAP_OK;
  t0 = gc_trace_clock(G->e);
  if ((st = gcap_graph_replay(x->dw)) != GCAP_OK) return st;
  was = gcap_set_grad_enabled(G->e, 0);
  run.n = 0;
  for (k = 0; k < x->nparams && st == GCAP_OK; k++)
    if (x->dw_grad[k]) st = gc_acc_grad_run(&run, x->params[k], x->dw_grad[k], 0);
  if ((st2 = gc_acc_end(&run)) != GCAP_OK && st == GCAP_OK) st = st2;
  gcap_set_grad_enabled(G->e, was);
  gc_trace_span(G->e, t0, "replay", "graphed backward_dw of entry %d", entry + 1);
  return st;
}

gcap_status gcap_graphed_reset(gcap_graphed *G, int entry) {
  ge_entry *x;
  gcap_status st;
  if ((st = entry_ok(G, entry, "reset")) != GCAP_OK) return st;
  x = &G->v[entry];
  if (G->e->cap != NULL)
    return gc_fail(G->e, GCAP_ESTATE, "reset: not allowed while a capture is open");
  /* the module keeps its route: a call of it is then an error that says it
  ** was reset (as TransformerEngine's), not a silent eager forward */
  gcap_graph_free(x->fwd);
  gcap_graph_free(x->bwd);
  gcap_graph_free(x->dw);
  x->fwd = x->bwd = x->dw = NULL;
  x->reset = 1;
  return GCAP_OK;
}

gcap_status gcap_graphed_debug_dump(gcap_graphed *G, int entry, const char *prefix) {
  static const char *const suffix[3] = {"fwd", "bwd", "bwd_dw"};
  gcap_graph *gs[3];
  gcap_status st;
  int k;
  if ((st = entry_ok(G, entry, "debug_dump")) != GCAP_OK) return st;
  if (prefix == NULL) return gc_fail(G->e, GCAP_EINVAL, "debug_dump: the prefix is NULL");
  gs[0] = G->v[entry].fwd;
  gs[1] = G->v[entry].bwd;
  gs[2] = G->v[entry].dw;
  for (k = 0; k < 3; k++) {
    char path[4096];
    if (gs[k] == NULL) continue;
    if (snprintf(path, sizeof path, "%s.%s.dot", prefix, suffix[k]) >= (int)sizeof path)
      return gc_fail(G->e, GCAP_EINVAL, "debug_dump: the prefix is too long");
    if ((st = gcap_graph_debug_dump(gs[k], path)) != GCAP_OK) return st;
  }
  return GCAP_OK;
}

gcap_status gcap_graphed_get_stats(gcap_graphed *G, int entry, gcap_graphed_stats *out) {
  ge_entry *x;
  gcap_status st;
  gcap_mem_stats ms;
  if (out == NULL) return GCAP_EINVAL;
  memset(out, 0, sizeof *out);
  if ((st = entry_ok(G, entry, "stats")) != GCAP_OK) return st;
  x = &G->v[entry];
  gcap_graph_get_stats(x->fwd, &out->fwd);
  if ((out->has_bwd = x->bwd != NULL)) gcap_graph_get_stats(x->bwd, &out->bwd);
  if ((out->has_dw = x->dw != NULL)) gcap_graph_get_stats(x->dw, &out->dw);
  gcap_pool_get_stats(G->pool, &ms);
  out->pool_reserved_bytes = ms.reserved_bytes;
  out->num_outputs = x->out.n;
  out->num_grad_outputs = x->ngrad;
  return GCAP_OK;
}
