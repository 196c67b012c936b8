/*
** check.c: the static checks of make_graphed_callables, run before any
** work: the engine's state, the callables and their mode, the sample
** arguments, the options, the hook tables and (schedule.c) the order.
** Nothing has changed when one fails.
*/
#include "graphed.h"

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
  if (ncallables <= 0) return gc_bad_count(e, "make_graphed_callables", "ncallables", ncallables);
  if (callables == NULL) return gc_null(e, "make_graphed_callables", "callables");
  if (nentries <= 0) return gc_bad_count(e, "make_graphed_callables", "nentries", nentries);
  if (nargs == NULL || args == NULL)
    return gc_null(e, "make_graphed_callables", nargs ? "args (the sample_args)" : "nargs");
  if (o->num_warmup_iters < 0)
    return gc_fail(e, GCAP_EINVAL, "make_graphed_callables: num_warmup_iters must be >= 0, got %d",
                   o->num_warmup_iters);
  for (c = 0; c < ncallables; c++) {
    if (callables[c] == NULL || gc_module_engine(callables[c]) != e)
      return gc_fail(e, GCAP_EINVAL, "make_graphed_callables: callable %d %s", c + 1,
                     callables[c] ? "belongs to another engine" : "is NULL");
    if ((st = gc_module_check_graphable(callables[c], "make_graphed_callables")) != GCAP_OK)
      return st;
    /* graphed, backward_dw replays graphs: what an eager backward queued
    ** would never be computed */
    if ((k = gc_module_pending_wgrads(callables[c])) > 0)
      return gc_fail(e, GCAP_ESTATE,
                     "make_graphed_callables: callable %d (%s) has %d delayed weight grad%s "
                     "queued by an earlier backward: call its backward_dw() first (graphed, "
                     "backward_dw replays the graphs and would never compute them)",
                     c + 1, gcap_module_type(callables[c]), k, k == 1 ? "" : "s");
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
      return gc_fail(e, GCAP_EINVAL, "make_graphed_callables: sample_args[%d] is malformed (%s)",
                     i + 1, nargs[i] < 0 ? "a negative count in nargs" : "NULL in args");
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

gcap_status gc_graphed_check(ge_build *b) {
  gcap_engine *e = b->e;
  const gcap_graphed_opts *o = b->o;
  gcap_status st;
  if ((st = gc_check_open(e, "make_graphed_callables")) != GCAP_OK) return st;
  if ((st = gc_check_not_capturing(e, "make_graphed_callables")) != GCAP_OK) return st;
  if (e->warm_prev != NULL)
    return gc_fail(e, GCAP_ESTATE,
                   "make_graphed_callables: not allowed inside another make_graphed_callables' "
                   "warmup (from its hooks or forwards)");
  if (o->pool != NULL && o->pool->e != e)
    return gc_foreign(e, "make_graphed_callables", "the pool of opts");
  if ((st = check_inputs(e, b->ncallables, b->callables, b->nentries, b->nargs, b->args, o,
                         &b->training)) != GCAP_OK)
    return st;
  if ((st = gc_graphed_fp8_check(b)) != GCAP_OK) return st; /* the FP8 options: fp8.c */
  return gc_schedule_build(e, o->order, o->order_len, o->num_layers_per_chunk, o->num_chunks,
                           b->ncallables, b->nentries, b->training, &b->sched);
}
