/*
** warmup.c: the warmup of make_graphed_callables: num_warmup_iters walks of
** the schedule on a side stream that starts after the caller's pending
** work, each forward and backward the callable's own (kernels run eagerly)
** between its capture_time_hooks. Iteration 0 prunes the parameters that
** get no grad, and later ones must give grads to the same parameters; the
** first forward checks that every leaf behind the outputs is on the entry's
** surface. An entry's outputs live from its forward until its backward
** consumed them (in eval, until its forward hooks ran).
*/
#include <stdlib.h>

#include "graphed.h"

/* Entry x's forward itself, its outputs into o (cleared first). */
gcap_status gc_graphed_forward(ge_build *b, ge_entry *x, ge_outs *o) {
  gcap_tensor *ys[GCAP_MAX_OUTPUTS];
  gcap_fp8_autocast prev;
  gcap_status st;
  int n, k;
  gc_graphed_outs_clear(o);
  gc_graphed_fp8_enter(b, x->callable, &prev); /* the callable's FP8 autocast: fp8.c */
  st = gc_module_forward(x->m, x->nargs, x->args, &n, ys);
  gc_graphed_fp8_exit(b, &prev);
  if (st != GCAP_OK) return st;
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
gcap_status gc_graphed_backward(const ge_outs *o, gcap_tensor *const *grads, int retain) {
  gcap_tensor *t[GCAP_MAX_OUTPUTS], *g[GCAP_MAX_OUTPUTS];
  int k, n = 0;
  for (k = 0; k < o->n; k++)
    if (o->t[k] != NULL && o->t[k]->requires_grad) {
      t[n] = o->t[k];
      g[n++] = grads[k];
    }
  return n > 0 ? gc_backward_many(n, t, g, retain) : GCAP_OK;
}

/* Drop the grads a pass left on the entry's surface. */
static void clear_grads(ge_entry *x) {
  int k;
  for (k = 0; k < x->nargs + x->nparams; k++) {
    gcap_tensor *t = ge_surface(x, k);
    gcap_tensor_free(t->grad);
    t->grad = NULL;
  }
}

/* Is t on entry x's surface (an argument or a parameter)? */
static int on_surface(const ge_entry *x, const gcap_tensor *t) {
  int k;
  for (k = 0; k < x->nargs + x->nparams; k++)
    if (ge_surface(x, k) == t) return 1;
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
          if (!gc_growvector(stack, cap, n + 1, 64)) {
            st = gc_fail(b->e, GCAP_ENOMEM, "make_graphed_callables: out of host memory");
            break;
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
  gc_span sp;
  if ((st = ge_run_hooks(b, x->callable, GCAP_HOOK_FORWARD_PRE)) != GCAP_OK) return st;
  gc_span_begin(b->e, &sp, "warmup forward of entry %d", i + 1);
  st = gc_graphed_forward(b, x, &b->warm_out[i]);
  gc_span_end(b->e, &sp, "warmup", NULL);
  if (st != GCAP_OK) return ge_where(b, st, i, "warmup forward");
  /* once, while the parameters are all there (before those that get no
  ** grad, such as a fused-wgrad weight, are pruned) */
  if (b->G->training && !x->params_known && (st = check_leaves(b, i, &b->warm_out[i])) != GCAP_OK)
    return st;
  st = ge_run_hooks(b, x->callable, GCAP_HOOK_FORWARD);
  /* in eval no backward reads them: at most one callable's outputs alive */
  if (!b->G->training) gc_graphed_outs_clear(&b->warm_out[i]);
  return st;
}

/* Does every parameter of x's module have a grad if and only if it was kept
** (where `vanish` is 0, only: no parameter that was not kept has one)? The
** first that does not is named: after warmup iteration `it` (it > 0), or at
** capture (it < 0), where the kept parameters' grads were taken into
** taken[0..nparams). */
gcap_status gc_graphed_params_agree(ge_build *b, int i, int it, int vanish,
                                    gcap_tensor *const *taken) {
  ge_entry *x = &b->G->v[i];
  int j, k, np = gcap_module_num_parameters(x->m);
  char name[128], first[48], second[48];
  for (j = 0; j < np; j++) {
    gcap_tensor *p = gcap_module_parameter(x->m, j, name, sizeof name);
    int kept, got;
    for (k = 0; k < x->nparams && x->params[k] != p; k++) {
    }
    kept = k < x->nparams;
    got = (kept && taken != NULL ? taken[k] : p->grad) != NULL;
    if (got == kept || (!got && !vanish)) continue;
    if (it >= 0) { /* one iteration is 1, the other it + 1 */
      snprintf(first, sizeof first, "in warmup iteration %d", got ? it + 1 : 1);
      snprintf(second, sizeof second, "in iteration %d", got ? 1 : it + 1);
    } else {
      char warm[48];
      snprintf(warm, sizeof warm, "in the warmup (%d iteration%s)", b->o->num_warmup_iters,
               b->o->num_warmup_iters == 1 ? "" : "s");
      snprintf(first, sizeof first, "%s", got ? "at capture" : warm);
      snprintf(second, sizeof second, "%s", got ? warm : "at capture");
    }
    return gc_fail(b->e, GCAP_EINVAL,
                   "make_graphed_callables: %s of entry %d (callable %d, %s): the set of "
                   "parameters getting a grad changed %s: parameter '%s' got a grad %s but none "
                   "%s (a parameter gets its grad from the first warmup iteration on, or never)",
                   it >= 0 ? "warmup backward" : "backward capture", i + 1, x->callable + 1,
                   gcap_module_type(x->m),
                   it >= 0 ? "between warmup iterations" : "between the warmup and the capture",
                   name, first, second);
  }
  return GCAP_OK;
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
  if (x->params_known) return gc_graphed_params_agree(b, i, it, 1, NULL);
  for (k = 0; k < x->nparams; k++) {
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
  if ((st = ge_run_hooks(b, x->callable, GCAP_HOOK_BACKWARD_PRE)) != GCAP_OK) goto done;
  for (k = 0; k < o->n; k++)
    any |= o->t[k] != NULL && o->t[k]->requires_grad;
  if (any) {
    gc_span sp;
    gc_span_begin(b->e, &sp, "warmup backward of entry %d", i + 1);
    if ((gout.t = (gcap_tensor **)gc_calloc((size_t)o->n, sizeof *gout.t)) == NULL)
      st = gc_fail(b->e, GCAP_ENOMEM, "make_graphed_callables: out of host memory");
    gout.n = gout.t ? o->n : 0;
    for (k = 0; st == GCAP_OK && k < o->n; k++)
      if (o->t[k] != NULL && o->t[k]->requires_grad) st = ge_zeros_like(o->t[k], &gout.t[k]);
    if (st == GCAP_OK) st = gc_graphed_backward(o, gout.t, 0);
    if (st == GCAP_OK && x->need_dw) st = gcap_module_backward_dw(x->m);
    gc_span_end(b->e, &sp, "warmup", NULL);
    gc_graphed_outs_clear(&gout); /* consumed: gone before the hooks run */
    gc_graphed_outs_clear(o);
    if (st != GCAP_OK) {
      st = ge_where(b, st, i, "warmup backward");
      goto done;
    }
  }
  if ((st = prune_params(b, i, it)) != GCAP_OK) goto done;
  clear_grads(x);
  st = ge_run_hooks(b, x->callable, GCAP_HOOK_BACKWARD);
done:
  clear_grads(x);
  gc_graphed_outs_clear(&gout);
  gc_graphed_outs_clear(o);
  return st;
}

/* The pre or post warmup hook, traced; its failure names it. */
static gcap_status warm_hook(ge_build *b, const char *name, gcap_status (*fn)(void *), void *ud) {
  gcap_status st;
  char where[64];
  gc_span sp;
  gc_span_begin(b->e, &sp, "%s", name);
  gc_clear(b->e);
  st = fn(ud);
  gc_span_end(b->e, &sp, "hook", NULL);
  if (st == GCAP_OK) return GCAP_OK;
  snprintf(where, sizeof where, "%s failed", name);
  return ge_callback_failed(b->e, st, where);
}

/* num_warmup_iters walks of the schedule on a side stream, between the pre
** and post warmup hooks; the caller's stream is current again after. One
** walk, with or without an order: without one the schedule is all forwards,
** then all backwards reversed (schedule.c). A delayed-wgrad pass has nothing
** to do here: warm_bwd ran the wgrad with its backward. */
gcap_status gc_graphed_warmup(ge_build *b) {
  const gcap_graphed_opts *o = b->o;
  gcap_stream *side = NULL;
  gcap_event *ready = NULL;
  gcap_status st;
  gc_span sp, si;
  int it, i;
  b->total = b->sched.n * o->num_warmup_iters;
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
  gc_span_begin(b->e, &sp, "warmup");
  b->phase = "warmup";
  if (o->pre_warmup_hook &&
      (st = warm_hook(b, "pre_warmup_hook", o->pre_warmup_hook, o->pre_warmup_ud)) != GCAP_OK)
    goto done;
  for (it = 0; it < o->num_warmup_iters && st == GCAP_OK; it++) {
    gc_span_begin(b->e, &si, "warmup iteration %d", it + 1);
    for (i = 0; i < b->sched.n && st == GCAP_OK; i++, st = ge_progress(b, st)) {
      gc_pass *p = &b->sched.v[i];
      if (p->kind == GC_PASS_FWD)
        st = warm_fwd(b, p->entry);
      else if (p->kind == GC_PASS_BWD)
        st = warm_bwd(b, p->entry, it);
    }
    gc_span_end(b->e, &si, "warmup", NULL);
  }
  if (st == GCAP_OK && o->post_warmup_hook)
    st = warm_hook(b, "post_warmup_hook", o->post_warmup_hook, o->post_warmup_ud);
  if (st == GCAP_OK) st = gcap_stream_synchronize(side);
done:
  b->e->current = b->e->warm_prev;
  b->e->warm_prev = NULL;
  gcap_stream_free(side);
  gc_span_end(b->e, &sp, "warmup", NULL);
  return st;
}
