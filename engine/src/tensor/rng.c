/*
** rng.c: a generator's state saved into a tensor and restored from it, on
** the device: a checkpoint saves the states its forward drew from and
** restores them for the recomputation in backward, so that dropout draws the
** same masks, eagerly and inside a capture alike (no host copy).
*/
#include "tensor.h"

/* The bytes of a generator's state, as a tensor holds them. */
static const int64_t state_shape[1] = {4};

/* Copy the state {seed, offset} from `src` to `dst` (device addresses),
** noting what it reads and writes. */
static gcap_status copy_state(gcap_engine *e, void *dst, void *src) {
  gc_kargs a;
  memset(&a, 0, sizeof a);
  a.p[0] = dst;
  a.p[1] = src;
  return gc_launch(e, GC_K_RNG_COPY, &a);
}

gcap_status gcap_generator_save(gcap_generator *g, gcap_tensor **out) {
  gcap_engine *e;
  gc_blk *b;
  gcap_status st;
  if (out != NULL) *out = NULL;
  if (g == NULL) return GCAP_EINVAL;
  e = g->e;
  gc_clear(e);
  if (out == NULL) return gc_null(e, "generator_save", "out");
  b = g->blk;
  if ((st = gc_check_stream(e, e->current, "generator_save")) != GCAP_OK ||
      (st = gc_tensor_alloc(e, "generator_save", GCAP_F32, 1, state_shape, out)) != GCAP_OK)
    return st;
  e->note_what = "generator_save";
  if ((st = gc_note_range(e, b, (uintptr_t)b->ptr, (uintptr_t)b->ptr + b->size, 0)) != GCAP_OK ||
      (st = gc_note_access(e, *out, 1)) != GCAP_OK ||
      (st = copy_state(e, gc_tensor_ptr(*out), b->ptr)) != GCAP_OK)
    return gc_keep_or_free(out, st);
  return GCAP_OK;
}

gcap_status gcap_generator_restore(gcap_generator *g, gcap_tensor *state) {
  gcap_engine *e;
  gc_blk *b;
  gcap_status st;
  if (g == NULL) return state ? gc_null(state->e, "generator_restore", "g") : GCAP_EINVAL;
  e = g->e;
  gc_clear(e);
  if (state == NULL) return gc_null(e, "generator_restore", "state");
  if (state->e != e) return gc_foreign(e, "generator_restore", "state");
  if (state->dt != GCAP_F32 || state->numel != 4) {
    char sh[64];
    return gc_fail(e, GCAP_EINVAL,
                   "generator_restore: the state must be the 4-element f32 tensor that "
                   "generator_save made, got %s %s",
                   gc_shape_str(state, sh, sizeof sh), gc_dtype_name(state->dt));
  }
  b = g->blk;
  if ((st = gc_check_stream(e, e->current, "generator_restore")) != GCAP_OK) return st;
  e->note_what = "generator_restore";
  if ((st = gc_note_access(e, state, 0)) != GCAP_OK ||
      (st = gc_note_range(e, b, (uintptr_t)b->ptr, (uintptr_t)b->ptr + b->size, 1)) != GCAP_OK)
    return st;
  return copy_state(e, b->ptr, gc_tensor_ptr(state));
}
