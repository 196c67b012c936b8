/*
** fp8.c: make_graphed_callables' FP8 options, as TransformerEngine's:
** fp8_enabled per callable, fp8_recipe, fp8_group and fp8_weight_caching.
** Their checks; each callable's forwards in warmup and capture under its
** autocast; the modules' FP8 state set aside before the warmup and put back
** after the capture (graphing leaves scales and histories as they were);
** and, with weight caching, the flag its weights' quantizations read, set
** before each replay from the call's is_first_microbatch.
*/
#include <stdlib.h>

#include "graphed.h"

/* A module's FP8 state as it was before the call (NULL: it had none). */
typedef struct fp8_snap {
  gcap_module *m;
  gcap_tensor *was;
} fp8_snap;

struct ge_fp8 {
  fp8_snap *v;
  int n, cap;
  gcap_tensor *skip_was; /* the engine's weight-caching flag before the call */
};

static int any_enabled(const ge_build *b) {
  int c;
  for (c = 0; b->o->fp8_enabled != NULL && c < b->ncallables; c++)
    if (b->o->fp8_enabled[c]) return 1;
  return 0;
}

gcap_status gc_graphed_fp8_check(ge_build *b) {
  gcap_engine *e = b->e;
  const char *W = "make_graphed_callables";
  char why[GC_ERRLEN];
  gcap_status st;
  if (!any_enabled(b)) {
    if (b->o->fp8_weight_caching)
      return gc_fail(e, GCAP_EINVAL, "%s: fp8_weight_caching needs fp8_enabled for some callable",
                     W);
    return GCAP_OK;
  }
  if (b->o->fp8_recipe != NULL && (st = gc_fp8_recipe_check(e, "make_graphed_callables: fp8_recipe",
                                                            b->o->fp8_recipe)) != GCAP_OK)
    return st;
  if (!gcap_fp8_is_available(e, why, sizeof why))
    return gc_fail(e, GCAP_EINVAL, "%s: fp8_enabled: %s", W, why);
  if (b->o->fp8_group != NULL && e->fp8_all_reduce == NULL)
    return gc_fail(e, GCAP_ESTATE, "%s: fp8_group needs the distributed runtime (gc.dist.init)", W);
  return GCAP_OK;
}

/* Add module m and its submodules to the snapshot. */
static gcap_status snap_tree(gcap_engine *e, struct ge_fp8 *f, gcap_module *m) {
  gc_fp8_meta *meta = *gc_module_fp8_slot(m);
  gcap_status st = GCAP_OK;
  int j;
  if (gcap_module_fp8_gemms(m) > 0) {
    fp8_snap *s;
    if (!gc_growvector(f->v, f->cap, f->n + 1, 8))
      return gc_fail(e, GCAP_ENOMEM, "make_graphed_callables: out of host memory");
    s = &f->v[f->n++];
    s->m = gcap_module_retain(m);
    s->was = NULL;
    if (meta != NULL) st = gcap_tensor_clone(meta->state, &s->was);
  }
  for (j = 0; st == GCAP_OK && j < gcap_module_num_children(m); j++)
    st = snap_tree(e, f, gcap_module_child(m, j, NULL));
  return st;
}

gcap_status gc_graphed_fp8_aside(ge_build *b) {
  gcap_engine *e = b->e;
  struct ge_fp8 *f;
  gcap_status st = GCAP_OK;
  int c, was;
  int64_t one = 1;
  if (!any_enabled(b)) return GCAP_OK;
  if ((f = (struct ge_fp8 *)gc_calloc(1, sizeof *f)) == NULL)
    return gc_fail(e, GCAP_ENOMEM, "make_graphed_callables: out of host memory");
  b->fp8 = f;
  f->skip_was = e->fp8_skip;
  was = gcap_set_grad_enabled(e, 0);
  for (c = 0; st == GCAP_OK && c < b->ncallables; c++)
    st = snap_tree(e, f, b->callables[c]);
  if (st == GCAP_OK && b->o->fp8_weight_caching) /* quantize during warmup: the flag is 0 */
    st = gcap_tensor_full(e, GCAP_F32, 1, &one, 0.0, &b->G->fp8_skip);
  gcap_set_grad_enabled(e, was);
  if (st == GCAP_OK) e->fp8_skip = b->G->fp8_skip;
  return st;
}

/* The state of s's module back as it was: its copy, or a new state's
** values (scales 1) for a module that had none before the call. */
static gcap_status restore_one(gcap_engine *e, const fp8_snap *s) {
  gc_fp8_meta *meta = *gc_module_fp8_slot(s->m), *fresh = NULL;
  gcap_status st;
  if (meta == NULL) return GCAP_OK;
  if (s->was != NULL && s->was->numel == meta->state->numel) return gcap_copy_(meta->state, s->was);
  if ((st = gc_fp8_meta_new(e, gcap_module_type(s->m), meta->gemms, meta->len, &fresh)) != GCAP_OK)
    return st;
  st = gcap_copy_(meta->state, fresh->state);
  gc_fp8_meta_release(fresh);
  return st;
}

gcap_status gc_graphed_fp8_put_back(ge_build *b, gcap_status st) {
  gcap_engine *e = b->e;
  struct ge_fp8 *f = b->fp8;
  int k, was;
  if (f == NULL) return st;
  was = gcap_set_grad_enabled(e, 0);
  for (k = 0; k < f->n; k++) {
    gcap_status r = restore_one(e, &f->v[k]);
    if (st == GCAP_OK) st = r;
    gcap_tensor_free(f->v[k].was);
    gcap_module_free(f->v[k].m);
  }
  gcap_set_grad_enabled(e, was);
  e->fp8_skip = f->skip_was;
  free(f->v);
  free(f);
  b->fp8 = NULL;
  return st;
}

void gc_graphed_fp8_enter(ge_build *b, int callable, gcap_fp8_autocast *prev) {
  gcap_engine *e = b->e;
  *prev = e->fp8;
  if (b->fp8 == NULL || !b->o->fp8_enabled[callable]) {
    memset(&e->fp8, 0, sizeof e->fp8);
    return;
  }
  e->fp8.enabled = 1;
  if (b->o->fp8_recipe != NULL)
    e->fp8.recipe = *b->o->fp8_recipe;
  else
    gcap_fp8_recipe_init(&e->fp8.recipe, GCAP_FP8_DELAYED_SCALING);
  e->fp8.amax_reduction_group = b->o->fp8_group;
}

void gc_graphed_fp8_exit(ge_build *b, const gcap_fp8_autocast *prev) {
  b->e->fp8 = *prev;
}

gcap_status gc_graphed_fp8_first(gcap_graphed *G, int entry, int first) {
  if (G->fp8_skip == NULL) {
    if (first < 0) return GCAP_OK;
    return gc_fail(G->e, GCAP_EINVAL,
                   "graphed call of entry %d: is_first_microbatch is taken only with "
                   "fp8_weight_caching (make_graphed_callables' option)",
                   entry + 1);
  }
  if (first < 0)
    return gc_fail(G->e, GCAP_EINVAL,
                   "graphed call of entry %d: `is_first_microbatch` boolean kwarg must be "
                   "provided for FP8 weight caching (true: the weights are quantized afresh into "
                   "their cached FP8 copies; false: the cached copies are used)",
                   entry + 1);
  return gcap_fill_(G->fp8_skip, first ? 0.0 : 1.0);
}
