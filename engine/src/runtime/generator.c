/*
** generator.c: random generators. Each is a state {seed, offset} in device
** memory that the kernels which draw read and advance (rng.h), so that a
** graph draws from the state as it is at each replay, as eager work does.
** The engine has a default generator and any number of others (Megatron's
** tracked states, TransformerEngine's graph-safe generators); one is in use
** at a time, and ops draw from it. Switching is a pointer swap, allowed in a
** capture: a graph captured while a generator is in use advances that
** generator at each replay.
*/
#include <stdlib.h>

#include "runtime.h"

gcap_status gc_generator_create(gcap_engine *e, uint64_t seed, const char *op,
                                gcap_generator **out) {
  gcap_generator *g;
  uint64_t st[2] = {seed, 0};
  gcap_status s;
  *out = NULL;
  if ((g = (gcap_generator *)gc_calloc(1, sizeof *g)) == NULL)
    return gc_fail(e, GCAP_ENOMEM, "%s: out of host memory", op);
  if ((s = gc_pool_alloc(e->heap, e->default_stream, sizeof st, op, &g->blk)) != GCAP_OK) {
    free(g);
    return s;
  }
  if ((s = e->be->upload(e, e->bs, e->default_stream->bs, g->blk->ptr, st, sizeof st)) != GCAP_OK) {
    gc_blk_release(g->blk);
    free(g);
    return s;
  }
  g->e = e;
  g->refs = 1;
  g->next = e->gens;
  if (e->gens) e->gens->prev = g;
  e->gens = g;
  *out = g;
  return GCAP_OK;
}

void gc_generator_destroy(gcap_generator *g) {
  gcap_engine *e = g->e;
  if (g->prev)
    g->prev->next = g->next;
  else
    e->gens = g->next;
  if (g->next) g->next->prev = g->prev;
  gc_blk_release(g->blk);
  free(g);
}

gcap_status gcap_generator_new(gcap_engine *e, uint64_t seed, gcap_generator **out) {
  gcap_status st;
  if (out != NULL) *out = NULL;
  if (e == NULL) return GCAP_EINVAL;
  if ((st = gc_check_open(e, "generator")) != GCAP_OK) return st;
  if (out == NULL) return gc_null(e, "generator_new", "out");
  if ((st = gc_check_not_capturing(e, "generator_new (a host-to-device copy of its seed)")) !=
      GCAP_OK)
    return st;
  if ((st = gc_generator_create(e, seed, "generator", out)) == GCAP_OK) gc_engine_ref(e);
  return st;
}

gcap_generator *gcap_generator_retain(gcap_generator *g) {
  if (g) g->refs++;
  return g;
}

void gcap_generator_free(gcap_generator *g) {
  gcap_engine *e;
  if (g == NULL || --g->refs > 0) return;
  e = g->e;
  gc_generator_destroy(g); /* the default one is never here: the engine holds it */
  gc_engine_unref(e);
}

gcap_generator *gcap_default_generator(gcap_engine *e) {
  return e ? e->gen0 : NULL;
}

gcap_generator *gcap_current_generator(gcap_engine *e) {
  return e ? e->gen : NULL;
}

gcap_status gcap_set_generator(gcap_engine *e, gcap_generator *g) {
  gcap_generator *old;
  if (e == NULL) return g ? gc_null(g->e, "set_generator", "e") : GCAP_EINVAL;
  gc_clear(e);
  if (g != NULL && g->e != e) return gc_foreign(e, "set_generator", "the generator g");
  old = e->gen;
  e->gen = gcap_generator_retain(g ? g : e->gen0);
  e->rng = e->gen->blk;
  gcap_generator_free(old);
  return GCAP_OK;
}

gcap_status gcap_generator_get_state(gcap_generator *g, uint64_t *seed, uint64_t *offset) {
  gcap_engine *e;
  uint64_t st[2];
  gcap_status s;
  if (g == NULL) return GCAP_EINVAL;
  e = g->e;
  gc_clear(e);
  if (seed == NULL) return gc_null(e, "generator_get_state", "seed");
  if (offset == NULL) return gc_null(e, "generator_get_state", "offset");
  if ((s = gc_check_not_capturing(e, "generator_get_state (a read-back)")) != GCAP_OK ||
      (s = e->be->download(e, e->bs, e->current->bs, st, g->blk->ptr, sizeof st)) != GCAP_OK)
    return s;
  *seed = st[0];
  *offset = st[1];
  return GCAP_OK;
}

gcap_status gcap_generator_set_state(gcap_generator *g, uint64_t seed, uint64_t offset) {
  gcap_engine *e;
  uint64_t st[2];
  gcap_status s;
  if (g == NULL) return GCAP_EINVAL;
  e = g->e;
  gc_clear(e);
  if ((s = gc_check_not_capturing(e, "generator_set_state (a host-to-device copy)")) != GCAP_OK)
    return s;
  st[0] = seed;
  st[1] = offset;
  return e->be->upload(e, e->bs, e->current->bs, g->blk->ptr, st, sizeof st);
}

gcap_status gc_rng_snap_take(gcap_engine *e, gc_rng_snap *s) {
  gcap_generator *g;
  gcap_status st = GCAP_OK;
  int n = 0;
  memset(s, 0, sizeof *s);
  for (g = e->gens; g != NULL; g = g->next)
    n++;
  s->g = (gcap_generator **)gc_calloc((size_t)n, sizeof *s->g);
  s->state = (uint64_t *)gc_calloc((size_t)n * 2, sizeof *s->state);
  if (s->g == NULL || s->state == NULL)
    return gc_fail(e, GCAP_ENOMEM, "make_graphed_callables: out of host memory");
  for (g = e->gens; g != NULL && st == GCAP_OK; g = g->next)
    if ((st = e->be->download(e, e->bs, e->current->bs, &s->state[2 * s->n], g->blk->ptr,
                              2 * sizeof *s->state)) == GCAP_OK)
      s->g[s->n++] = gcap_generator_retain(g);
  s->current = gcap_generator_retain(e->gen);
  return st;
}

gcap_status gc_rng_snap_put(gcap_engine *e, gc_rng_snap *s) {
  gcap_status st = GCAP_OK, st2;
  int i;
  for (i = 0; i < s->n; i++) {
    st2 = e->be->upload(e, e->bs, e->current->bs, s->g[i]->blk->ptr, &s->state[2 * i],
                        2 * sizeof *s->state);
    if (st == GCAP_OK) st = st2;
    gcap_generator_free(s->g[i]);
  }
  if (s->current != NULL) {
    gcap_set_generator(e, s->current);
    gcap_generator_free(s->current);
  }
  free(s->g);
  free(s->state);
  memset(s, 0, sizeof *s);
  return st;
}
