/*
** build.c: one gcap_make_graphed_callables call: the options' defaults,
** the snapshot of everything the call may touch, the entries, and the call
** itself, check -> aside -> entries -> warmup -> capture -> put back. A
** failure at any point rolls back: graphs freed, .grad values, the
** generator and the modules as they were.
*/
#include <stdlib.h>

#include "graphed.h"

void gcap_graphed_opts_init(gcap_graphed_opts *o) {
  if (o == NULL) return;
  memset(o, 0, sizeof *o);
  o->num_warmup_iters = 3;
  o->clone_param_grads_on_return = 1;
}

/* ------------------------------------------------------------------------ */
/* Snapshot and rollback                                                     */

/* Every .grad the call may touch, taken away at the start and given back at
** the end, whatever happens in between. */
typedef struct grad_snap {
  gcap_tensor **t, **grad;
  int n, cap;
  int taken; /* the .grad values are in grad[] */
} grad_snap;

static gcap_status snap_add(gcap_engine *e, grad_snap *s, gcap_tensor *t) {
  int cap = s->cap; /* grad[] grows to what t[] grows to */
  if (!gc_growvector(s->t, cap, s->n + 1, 32) || !gc_growvector(s->grad, s->cap, cap, 32))
    return gc_fail(e, GCAP_ENOMEM, "make_graphed_callables: out of host memory");
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

/* What a call sets aside, put back whatever happens. */
typedef struct ge_aside {
  grad_snap snap;
  gc_rng_snap rng; /* the generators' states, and the one in use */
  int rng_taken;
  gc_seg *segs_before; /* the option pool's segments before the call */
} ge_aside;

/* The replay object, empty until everything worked. */
static gcap_status graphed_new(ge_build *b) {
  if ((b->G = (gcap_graphed *)gc_calloc(1, sizeof *b->G)) == NULL ||
      (b->G->v = (ge_entry *)gc_calloc((size_t)b->nentries, sizeof *b->G->v)) == NULL ||
      (b->warm_out = (ge_outs *)gc_calloc((size_t)b->nentries, sizeof *b->warm_out)) == NULL) {
    if (b->G) free(b->G->v);
    free(b->G);
    b->G = NULL;
    return gc_fail(b->e, GCAP_ENOMEM, "make_graphed_callables: out of host memory");
  }
  b->G->refs = 1;
  b->G->e = b->e;
  b->G->n = b->nentries;
  b->G->training = b->training;
  b->G->clone = b->o->clone_param_grads_on_return;
  b->G->reuse = b->o->reuse_graph_input_output_buffers;
  b->G->retain = b->o->retain_graph_in_backward;
  gc_engine_ref(b->e);
  return GCAP_OK;
}

/* The object, then aside: the generators' states (every generator's, as TE
** saves its tracked states too) and the delayed-wgrad queues of the Linears
** (the sinks start empty); the .grad values go aside as the entries are
** made. */
static gcap_status aside(ge_build *b, ge_aside *a) {
  gcap_engine *e = b->e;
  gcap_status st;
  int i;
  a->segs_before = b->o->pool ? b->o->pool->segs : NULL;
  if ((st = graphed_new(b)) != GCAP_OK) return st;
  a->rng_taken = 1;
  if ((st = gc_rng_snap_take(e, &a->rng)) != GCAP_OK) return st;
  for (i = 0; i < b->ncallables; i++)
    gc_module_wgrad_aside(b->callables[i], 1);
  return GCAP_OK;
}

/* ------------------------------------------------------------------------ */
/* Entries                                                                   */

/* Do the bytes of a and b meet? */
static int overlap(const gcap_tensor *a, const gcap_tensor *b) {
  uintptr_t a0 = (uintptr_t)gc_tensor_ptr(a), b0 = (uintptr_t)gc_tensor_ptr(b);
  return a->blk == b->blk && a0 < b0 + (uintptr_t)b->numel * gc_dtype_size(b->dt) &&
         b0 < a0 + (uintptr_t)a->numel * gc_dtype_size(a->dt);
}

/* Was the memory of argument k of entry i given for an earlier place (an
** argument before k, or one of an earlier entry)? */
static int given_before(const ge_build *b, int i, int k) {
  int j, kk;
  for (j = 0; j <= i; j++)
    for (kk = 0; kk < (j < i ? b->nargs[j] : k); kk++)
      if (overlap(b->args[j][kk], b->args[i][k])) return 1;
  return 0;
}

/* The static input of argument k of entry i: the sample itself, or a copy
** of it when its memory was given for an earlier place. One buffer for two
** places would make a call g(a, b) compute f(b, b), and a call of one entry
** overwrite another's input. */
static gcap_status static_input(ge_build *b, int i, int k, gcap_tensor **out) {
  gcap_tensor *t = b->args[i][k];
  gcap_status st;
  int was;
  if (!given_before(b, i, k)) {
    *out = gcap_tensor_retain(t);
    return GCAP_OK;
  }
  was = gcap_set_grad_enabled(b->e, 0);
  st = gcap_tensor_clone(t, out);
  gcap_set_grad_enabled(b->e, was);
  if (st == GCAP_OK && t->requires_grad) st = gcap_tensor_set_requires_grad(*out, 1);
  return st;
}

/* One entry per sample, its .grad values and its parameters' taken aside;
** with reuse, a forward takes the static inputs of an entry whose backward
** came before it (reuse.c). */
static gcap_status build_entries(ge_build *b, grad_snap *snap) {
  gcap_graphed *G = b->G;
  int i, k;
  gcap_status st;
  for (i = 0; i < G->n; i++) {
    ge_entry *x = &G->v[i];
    x->callable = b->sched.entry_callable[i];
    x->m = gcap_module_retain(b->callables[x->callable]);
    x->nargs = b->nargs[i];
    x->nparams = gcap_module_num_parameters(x->m);
    x->need_dw = G->training && gcap_module_has_delayed_wgrad(x->m);
    x->args = (gcap_tensor **)gc_calloc((size_t)x->nargs + 1, sizeof *x->args);
    x->params = (gcap_tensor **)gc_calloc((size_t)x->nparams + 1, sizeof *x->params);
    if (x->args == NULL || x->params == NULL)
      return gc_fail(b->e, GCAP_ENOMEM, "make_graphed_callables: out of host memory");
    for (k = 0; k < x->nargs; k++) {
      if ((st = static_input(b, i, k, &x->args[k])) != GCAP_OK ||
          (st = snap_add(b->e, snap, x->args[k])) != GCAP_OK)
        return st;
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
  return b->o->reuse_graph_input_output_buffers ? gc_graphed_share_inputs(b) : GCAP_OK;
}

/* ------------------------------------------------------------------------ */
/* The call                                                                  */

/* Put back what the call set aside, on success and on failure; on failure
** the object goes with its graphs, the option pool gives back what the call
** added, and the error is the one that stopped the call. On success, without
** an order each module gets its route, so gcap_module_call replays. */
static gcap_status put_back(ge_build *b, ge_aside *a, gcap_status st, gcap_graphed **out) {
  gcap_engine *e = b->e;
  char msg[GC_ERRLEN];
  gcap_status rng;
  int i;
  if (b->G != NULL) {
    if (st != GCAP_OK) snprintf(msg, sizeof msg, "%s", e->err);
    snap_restore(&a->snap);
    for (i = 0; i < b->ncallables; i++)
      gc_module_wgrad_aside(b->callables[i], 0);
    for (i = 0; i < b->nentries; i++)
      gc_graphed_outs_clear(&b->warm_out[i]);
    free(b->warm_out);
    if (st != GCAP_OK) {
      gc_graphed_destroy(b->G);
      if (b->o->pool) gc_pool_trim_since(b->o->pool, a->segs_before);
    }
    /* the generators as they were: warmup drew nothing */
    rng = a->rng_taken ? gc_rng_snap_put(e, &a->rng) : GCAP_OK;
    if (st != GCAP_OK)
      gc_fail(e, st, "%s", msg);
    else if ((st = rng) != GCAP_OK)
      gcap_graphed_free(b->G);
  }
  gc_schedule_free(&b->sched);
  if (st != GCAP_OK) return st;
  if (b->o->order == NULL)
    for (i = 0; i < b->nentries; i++)
      gc_module_set_route(b->G->v[i].m, b->G->training, gc_graphed_route, b->G, i);
  *out = b->G;
  return GCAP_OK;
}

static gcap_status make_graphed(gcap_engine *e, int ncallables, gcap_module *const *callables,
                                int nentries, const int *nargs, gcap_tensor *const *const *args,
                                const gcap_graphed_opts *opts, gcap_graphed **out) {
  gcap_graphed_opts defaults;
  ge_build b;
  ge_aside a;
  gcap_status st;
  if (out != NULL) *out = NULL;
  if (e == NULL) return GCAP_EINVAL;
  if (out == NULL) return gc_null(e, "make_graphed_callables", "out");
  if (opts == NULL) {
    gcap_graphed_opts_init(&defaults);
    opts = &defaults;
  }
  memset(&b, 0, sizeof b);
  memset(&a, 0, sizeof a);
  b.e = e;
  b.o = opts;
  b.ncallables = ncallables;
  b.callables = callables;
  b.nentries = nentries;
  b.nargs = nargs;
  b.args = args;
  st = gc_graphed_check(&b);
  if (st == GCAP_OK) st = aside(&b, &a);
  if (st == GCAP_OK) st = gc_graphed_fp8_aside(&b); /* the FP8 options: fp8.c */
  if (st == GCAP_OK) st = build_entries(&b, &a.snap);
  if (st == GCAP_OK) st = gc_graphed_warmup(&b);
  if (st == GCAP_OK) st = gc_graphed_capture(&b);
  st = gc_graphed_fp8_put_back(&b, st);
  return put_back(&b, &a, st, out);
}

gcap_status gcap_make_graphed_callables(gcap_engine *e, int ncallables,
                                        gcap_module *const *callables, int nentries,
                                        const int *nargs, gcap_tensor *const *const *args,
                                        const gcap_graphed_opts *opts, gcap_graphed **out) {
  gcap_status st;
  gc_span sp;
  if (e == NULL) return make_graphed(e, ncallables, callables, nentries, nargs, args, opts, out);
  gc_span_begin(e, &sp, "make_graphed_callables");
  e->graphing++; /* is_graph_capturing: the whole call, warmup and hooks included */
  st = make_graphed(e, ncallables, callables, nentries, nargs, args, opts, out);
  e->graphing--;
  gc_span_end(e, &sp, "graphed", st ? " (failed)" : NULL);
  return st;
}
