/*
** replay.c: the graphed object make_graphed_callables returns: its
** lifetime, and its entries' calls. A call copies inputs in only when their
** address differs, replays the forward graph and returns views of the
** static outputs, whose autograd node copies the incoming grads in, replays
** the backward graph and hands the static grads on; backward_dw replays the
** delayed-wgrad graph; reset drops an entry's graphs; dump and stats.
*/
#include <stdlib.h>

#include "graphed.h"

/* ------------------------------------------------------------------------ */
/* The object                                                                */

void gc_graphed_outs_clear(ge_outs *o) {
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
  for (k = 0; k < GE_NGRAPHS; k++)
    free(x->kills[k]);
  for (k = 0; k < x->nreads; k++) {
    gcap_tensor_free(x->reads[k].t);
    if (x->reads[k].blk) gc_blk_release(x->reads[k].blk);
  }
  free(x->reads);
  free(x->homes);
  free(x->modes);
  for (k = 0; x->grad_out && k < x->out.n; k++)
    gcap_tensor_free(x->grad_out[k]);
  free(x->grad_out);
  gc_graphed_outs_clear(&x->out);
  gcap_graph_free(x->fwd);
  gcap_graph_free(x->bwd);
  gcap_graph_free(x->dw);
  gcap_module_free(x->m);
  memset(x, 0, sizeof *x);
}

void gc_graphed_destroy(gcap_graphed *G) {
  gcap_engine *e = G->e;
  int i;
  for (i = 0; i < G->n; i++)
    entry_clear(&G->v[i]);
  free(G->v);
  gcap_tensor_free(G->fp8_skip);
  gcap_pool_free(G->pool);
  gcap_event_free(G->sync);
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
  gc_graphed_destroy(g);
}

int gcap_graphed_num_entries(const gcap_graphed *g) {
  return g ? g->n : 0;
}

gcap_module *gcap_graphed_module(const gcap_graphed *g, int entry) {
  return g && entry >= 0 && entry < g->n ? g->v[entry].m : NULL;
}

/* ------------------------------------------------------------------------ */
/* Replay                                                                    */

static void ge_ref_free(void *ud) {
  ge_ref *r = (ge_ref *)ud;
  ge_entry *x = &r->G->v[r->entry];
  int k;
  if (r->pending && !x->reset) x->fwd_pending--; /* reset: its pending were let go */
  for (k = 0; r->got && k < x->out.n; k++)
    gcap_tensor_free(r->got[k]);
  free(r->got);
  gc_graphed_drop_opts(&r->opts);
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

/* clone_param_grads_on_return = false: the .grad of a parameter may be its
** static grad buffer itself (an earlier backward handed it on), which the
** replay is about to overwrite where eager would add the new grad to it.
** Each such .grad's value goes aside, into (*old)[k - nargs] (a copy; NULL
** for the others), to be added back after the replay. */
static gcap_status grads_aside(gcap_graphed *G, ge_entry *x, gc_node *n, gcap_tensor ***old) {
  int k;
  *old = NULL;
  if (G->clone) return GCAP_OK;
  for (k = x->nargs; k < x->nargs + x->nparams; k++) {
    gcap_tensor *s = x->grad_in[k], *leaf = n->leaf[k];
    gcap_status st;
    if (s == NULL || leaf == NULL || leaf->grad == NULL ||
        gc_tensor_ptr(leaf->grad) != gc_tensor_ptr(s))
      continue;
    if (*old == NULL &&
        (*old = (gcap_tensor **)gc_calloc((size_t)x->nparams, sizeof **old)) == NULL)
      return gc_fail(G->e, GCAP_ENOMEM, "graphed backward: out of host memory");
    if ((st = gcap_tensor_clone(leaf->grad, &(*old)[k - x->nargs])) != GCAP_OK) return st;
  }
  return GCAP_OK;
}

static void drop_aside(const ge_entry *x, gcap_tensor **old) {
  int k;
  for (k = 0; old != NULL && k < x->nparams; k++)
    gcap_tensor_free(old[k]);
  free(old);
}

/* The static grads on to the inputs (gin) and the parameters (old: what
** grads_aside kept). */
static gcap_status grads_out(gcap_graphed *G, ge_entry *x, gc_node *n, gcap_tensor **gin,
                             gcap_tensor *const *old) {
  gcap_status st;
  int k;
  for (k = 0; k < x->nargs + x->nparams; k++) {
    gcap_tensor *s = x->grad_in[k];
    if (s == NULL || !gc_node_needs(n, k)) continue;
    if (k >= x->nargs && old != NULL && old[k - x->nargs] != NULL) {
      /* .grad is s, the replay's grad: the value it had goes back on top */
      if ((st = gc_acc_grad(n->leaf[k], old[k - x->nargs], 0)) != GCAP_OK) return st;
      continue;
    }
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

/* The backward of a replay whose entry was reset since: its graphs and
** static buffers are gone. */
static gcap_status reset_since(const ge_ref *r) {
  const ge_entry *x = &r->G->v[r->entry];
  return gc_fail(r->G->e, GCAP_ESTATE,
                 "graphed backward: entry %d was reset after call %llu (callable %d, %s), which "
                 "took its backward graph and saved activations; run a call's backward before "
                 "resetting its entry",
                 r->entry + 1, (unsigned long long)r->call, x->callable + 1,
                 gcap_module_type(x->m));
}

/* Backward of a replayed forward: grads in, backward graph, grads out. */
static gcap_status ge_backward(gc_node *n, gcap_tensor *g, gcap_tensor **gin) {
  ge_ref *r = (ge_ref *)n->ud;
  gcap_graphed *G = r->G;
  ge_entry *x = &G->v[r->entry];
  gcap_tensor **old = NULL;
  gcap_status st;
  gc_span sp;
  if (x->reset) return reset_since(r);
  if (x->bwd == NULL)
    return gc_fail(G->e, GCAP_ESTATE, "graphed backward: entry %d has no backward graph",
                   r->entry + 1);
  if (x->dw_due != 0)
    return gc_fail(G->e, GCAP_ESTATE,
                   "graphed backward of call %llu of entry %d (callable %d, %s): the delayed wgrad "
                   "of call %llu's backward has not run, and this backward would overwrite the "
                   "grads it reads; call backward_dw() of the entry between two backwards",
                   (unsigned long long)r->call, r->entry + 1, x->callable + 1,
                   gcap_module_type(x->m), (unsigned long long)x->dw_due);
  gc_span_begin(G->e, &sp, "graphed backward of entry %d", r->entry + 1);
  if ((st = gc_graphed_check_backward(r)) != GCAP_OK ||
      (st = grads_aside(G, x, n, &old)) != GCAP_OK || (st = grads_in(x, r, g)) != GCAP_OK ||
      (st = gc_graphed_replay_on(G, x->bwd, &r->opts)) != GCAP_OK) {
    drop_aside(x, old);
    sp.t0 = 0.0; /* traced when it ran */
    gc_span_end(G->e, &sp, "replay", NULL);
    return st;
  }
  if (G->reuse) gc_graphed_replayed(G, x, GE_BWD);
  gc_span_end(G->e, &sp, "replay", NULL);
  r->backwards++;
  if (x->dw != NULL) x->dw_due = r->call; /* backward_dw's, as a Linear's queue */
  if (r->pending) {
    r->pending = 0;
    x->fwd_pending--;
  }
  st = grads_out(G, x, n, gin, old);
  drop_aside(x, old);
  return st;
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
  if (x->reset) return reset_since(r);
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
    return gc_fail(G->e, GCAP_EINVAL, "graphed call of entry %d: %s", entry + 1,
                   nin < 0 ? "nin is negative" : "in is NULL");
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
  gcap_tensor **surf, *small[16] = {NULL}, *none = NULL;
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
  /* what the node saved is in the entry's static buffers: holds_state makes a
  ** backward without retain_graph release the node, so that a second one is
  ** eager's error */
  st = gc_record(y, "graphed", ge_backward, surf, ns, &none, 1, &n);
  if (surf != small) free(surf);
  if (st != GCAP_OK) {
    ge_ref_free(r);
    return st;
  }
  n->holds_state = 1;
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
  for (k = 0; out != NULL && k < n; k++) {
    gcap_tensor_free(out[k]);
    out[k] = NULL;
  }
}

static int overlap(const gcap_tensor *a, const gcap_tensor *b) {
  uintptr_t alo = (uintptr_t)gc_tensor_ptr(a), blo = (uintptr_t)gc_tensor_ptr(b);
  return alo < blo + (uintptr_t)b->numel * gc_dtype_size(b->dt) &&
         blo < alo + (uintptr_t)a->numel * gc_dtype_size(a->dt);
}

/* Copy the arguments into the static inputs (grad off), each only where it
** is not the static input itself. An argument that is (memory of) the
** static input of an earlier place, which that place's copy overwrites
** first, is read before: g(x, s) with sample_args {s, s} (s the static
** input of #1 only), or g(s2, s1) with {s1, s2}, computes f(x, s) and
** f(s2, s1), not f(x, x) and f(s2, s2). */
static gcap_status copy_in(gcap_graphed *G, ge_entry *x, int nin, gcap_tensor *const *in) {
  gcap_tensor **src = NULL;
  gcap_status st = GCAP_OK;
  int k, j;
  for (k = 1; k < nin && st == GCAP_OK; k++) {
    if (gc_tensor_ptr(in[k]) == gc_tensor_ptr(x->args[k])) continue;
    for (j = 0; j < k; j++)
      if (gc_tensor_ptr(in[j]) != gc_tensor_ptr(x->args[j]) && overlap(in[k], x->args[j])) break;
    if (j == k) continue;
    if (src == NULL && (src = (gcap_tensor **)gc_calloc((size_t)nin, sizeof *src)) == NULL)
      return gc_fail(G->e, GCAP_ENOMEM, "graphed call: out of host memory");
    st = gcap_tensor_clone(in[k], &src[k]);
  }
  for (k = 0; k < nin && st == GCAP_OK; k++)
    if (gc_tensor_ptr(in[k]) != gc_tensor_ptr(x->args[k]))
      st = gcap_copy_(x->args[k], src && src[k] ? src[k] : in[k]);
  for (k = 0; src != NULL && k < nin; k++)
    gcap_tensor_free(src[k]);
  free(src);
  return st;
}

static gcap_status graphed_call(gcap_graphed *G, int entry, const gcap_replay_opts *opts, int nin,
                                gcap_tensor *const *in, int maxout, int *nout, gcap_tensor **out) {
  ge_entry *x;
  gcap_status st;
  int k, was, replay, first;
  if (nout != NULL) *nout = 0;
  if ((st = entry_ok(G, entry, "graphed call")) != GCAP_OK) return st;
  first = gc_module_take_first_microbatch(G->v[entry].m); /* is_first_microbatch, or -1 */
  if (out == NULL) return gc_null(G->e, "graphed call", "out");
  if (nout == NULL) return gc_null(G->e, "graphed call", "nout");
  if (maxout < 0) return gc_bad_count(G->e, "graphed call", "maxout", maxout);
  x = &G->v[entry];
  /* else eager, as in another mode: the module, or one of its submodules (a
  ** Dropout put in eval) */
  replay = gcap_module_training(x->m) == G->training && gc_graphed_modes_match(x);
  if ((st = check_call_args(G, entry, nin, in, replay)) != GCAP_OK ||
      (st = gc_graphed_check_opts(G, entry, opts, replay)) != GCAP_OK)
    return st;
  if (!replay) return eager_call(G, x, nin, in, maxout, nout, out);
  if ((st = gc_badid_check(G->e)) != GCAP_OK || /* an earlier replay's, before copy-in */
      (st = gc_graphed_check_homes(G, entry)) != GCAP_OK)
    return st;
  if (x->out.n > maxout)
    return gc_fail(G->e, GCAP_EINVAL,
                   "graphed call of entry %d (callable %d, %s): it has %d outputs, room for %d%s",
                   entry + 1, x->callable + 1, gcap_module_type(x->m), x->out.n, maxout,
                   maxout == 1 ? " (gcap_graphed_call_n takes several)" : "");
  if (G->reuse && (st = check_shared_inputs(G, entry)) != GCAP_OK) return st;
  if (x->dw_due != 0)
    return gc_fail(G->e, GCAP_ESTATE,
                   "graphed call of entry %d (callable %d, %s): the delayed wgrad of call %llu has "
                   "not run, and its graph reads that call's activations, which this call would "
                   "overwrite; call backward_dw() of the entry before its next call",
                   entry + 1, x->callable + 1, gcap_module_type(x->m),
                   (unsigned long long)x->dw_due);
  if ((st = gc_graphed_fp8_first(G, entry, first)) != GCAP_OK) return st; /* fp8.c */
  was = gcap_set_grad_enabled(G->e, 0);
  st = copy_in(G, x, nin, in);
  gcap_set_grad_enabled(G->e, was);
  if (st != GCAP_OK) return st;
  if ((st = gc_graphed_replay_on(G, x->fwd, opts)) != GCAP_OK) return st;
  x->calls++; /* the activations of earlier calls are gone */
  if (G->reuse) gc_graphed_replayed(G, x, GE_FWD);
  if ((st = gc_badid_check(G->e)) != GCAP_OK) return st; /* this call's, where it ran at once */

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
      ge_ref *r = (ge_ref *)gc_calloc(1, sizeof *r + (size_t)x->nreads * sizeof *r->ver);
      if (r == NULL) {
        drop_outs(x->out.n, out);
        return gc_fail(G->e, GCAP_ENOMEM, "graphed call: out of host memory");
      }
      r->G = gcap_graphed_retain(G);
      r->entry = entry;
      r->call = x->calls;
      if (opts != NULL) {
        r->opts = *opts;
        gc_graphed_hold_opts(&r->opts);
      }
      gc_graphed_note_versions(x, r->ver);
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
  return gcap_graphed_call_opts(G, entry, NULL, nin, in, maxout, nout, out);
}

gcap_status gcap_graphed_call_opts(gcap_graphed *G, int entry, const gcap_replay_opts *opts,
                                   int nin, gcap_tensor *const *in, int maxout, int *nout,
                                   gcap_tensor **out) {
  gcap_status st;
  gc_span sp;
  if (G == NULL) return graphed_call(G, entry, opts, nin, in, maxout, nout, out);
  gc_span_begin(G->e, &sp, "graphed forward of entry %d", entry + 1);
  st = graphed_call(G, entry, opts, nin, in, maxout, nout, out);
  if (entry >= 0 && entry < G->n && G->v[entry].m != NULL) /* this call's flag, also on failure */
    (void)gc_module_take_first_microbatch(G->v[entry].m);
  gc_span_end(G->e, &sp, "replay", NULL);
  return st;
}

gcap_status gcap_graphed_call(gcap_graphed *G, int entry, int nin, gcap_tensor *const *in,
                              gcap_tensor **out) {
  gcap_status st;
  int n;
  if (out != NULL) *out = NULL;
  if (G != NULL && out == NULL) return gc_null(G->e, "graphed call", "out");
  if ((st = gcap_graphed_call_n(G, entry, nin, in, 1, &n, out)) != GCAP_OK) return st;
  if (n == 1 && *out != NULL) return GCAP_OK;
  drop_outs(n, out);
  return gc_fail(G->e, GCAP_EINVAL,
                 "graphed call of entry %d: its output is absent; gcap_graphed_call takes one "
                 "tensor",
                 entry + 1);
}

/* The route a graphed module's calls take (gc_module_set_route): the replay
** of entry `entry` of the graphed object ud. */
gcap_status gc_graphed_route(void *ud, int entry, const gcap_replay_opts *opts, int nin,
                             gcap_tensor *const *in, int *nout, gcap_tensor **out) {
  return gcap_graphed_call_opts((gcap_graphed *)ud, entry, opts, nin, in, GCAP_MAX_OUTPUTS, nout,
                                out);
}

int gcap_graphed_num_outputs(const gcap_graphed *g, int entry) {
  return g && entry >= 0 && entry < g->n ? g->v[entry].out.n : -1;
}

gcap_status gcap_graphed_backward_dw(gcap_graphed *G, int entry) {
  ge_entry *x;
  gc_acc_run run;
  gcap_status st, st2;
  gc_span sp;
  int k, was;
  if ((st = entry_ok(G, entry, "backward_dw")) != GCAP_OK) return st;
  x = &G->v[entry];
  if (x->dw == NULL || x->dw_due == 0) return GCAP_OK; /* none due: as eager's empty queue */
  gc_span_begin(G->e, &sp, "graphed backward_dw of entry %d", entry + 1);
  if ((st = gc_graph_replay(x->dw)) != GCAP_OK) {
    sp.t0 = 0.0; /* traced when it ran */
    gc_span_end(G->e, &sp, "replay", NULL);
    return st;
  }
  if (G->reuse) gc_graphed_replayed(G, x, GE_DW);
  x->dw_due = 0;
  was = gcap_set_grad_enabled(G->e, 0);
  run.n = 0;
  for (k = 0; k < x->nparams && st == GCAP_OK; k++)
    if (x->dw_grad[k]) st = gc_acc_grad_run(&run, x->params[k], x->dw_grad[k], 0);
  if ((st2 = gc_acc_end(&run)) != GCAP_OK && st == GCAP_OK) st = st2;
  gcap_set_grad_enabled(G->e, was);
  gc_span_end(G->e, &sp, "replay", NULL);
  return st;
}

gcap_status gcap_graphed_reset(gcap_graphed *G, int entry) {
  ge_entry *x;
  gcap_status st;
  int k;
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
  /* the static buffers go back now, not with the object (as TE's since its
  ** #3427); the arrays stay, sized as replays still pending know them */
  drop_outs(x->nargs, x->args);
  drop_outs(x->nargs + x->nparams, x->grad_in);
  drop_outs(x->nparams, x->dw_grad);
  drop_outs(x->out.n, x->grad_out);
  /* an output reuse gave back (weak) holds no memory, and stays: the other
  ** entries' replays still mark it dead for the views the user kept */
  for (k = 0; k < x->out.n; k++)
    if (x->out.t[k] != NULL && !x->out.t[k]->blk->weak) {
      gcap_tensor_free(x->out.t[k]);
      x->out.t[k] = NULL;
    }
  x->reset = 1;
  x->dw_due = 0;
  /* its pending backwards can no longer run (reset_since): they no longer
  ** hold back the entries that share its static inputs (reuse) */
  x->fwd_pending = 0;
  return GCAP_OK;
}

gcap_status gcap_graphed_debug_dump(gcap_graphed *G, int entry, const char *prefix) {
  static const char *const suffix[3] = {"fwd", "bwd", "bwd_dw"};
  gcap_graph *gs[3];
  gcap_status st;
  int k;
  if ((st = entry_ok(G, entry, "debug_dump")) != GCAP_OK) return st;
  if (prefix == NULL) return gc_null(G->e, "debug_dump", "prefix");
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
  if (out != NULL) memset(out, 0, sizeof *out);
  if ((st = entry_ok(G, entry, "stats")) != GCAP_OK) return st;
  if (out == NULL) return gc_null(G->e, "stats", "out");
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
