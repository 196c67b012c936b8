/*
** launch.c: the launch path every op takes: the capture rules of the current
** stream, the notes of what the kernel reads and writes (gc_note_access, an
** inline in tensor.h over capture.c's gc_note_range), then the backend's
** launch.
*/
#include <string.h>

#include "tensor.h"

/* Launch k on the current stream, its capture rules already checked. */
static gcap_status launch(gcap_engine *e, int k, const gc_kargs *a) {
  gcap_stream *s = e->current;
  gcap_status st;
  st = e->be->launch(e, e->bs, s->bs, k, a);
  e->nargnotes = 0; /* the next launch notes its own */
  if (st != GCAP_OK) return st;
  s->seq++;
  return GCAP_OK;
}

void gc_note_arg(gcap_engine *e, const gcap_tensor *t, int write) {
  gc_argnote *a;
  if (e->nargnotes == GC_ARGNOTES) return; /* labels only: the rest go unnamed */
  a = &e->argnotes[e->nargnotes++];
  a->ptr = gc_tensor_ptr(t);
  a->write = write;
  a->ndim = t->ndim;
  a->dt = (int)t->dt;
  memcpy(a->shape, t->shape, sizeof a->shape);
}

gcap_status gc_launch(gcap_engine *e, int k, const gc_kargs *a) {
  gcap_status st = gc_check_stream(e, e->current, gc_kernel_name(k));
  return st != GCAP_OK ? st : launch(e, k, a);
}

/* Launch k after noting its reads and writes. */
gcap_status gc_run(gcap_engine *e, int k, gc_kargs *a, gcap_tensor *const *in, int nin,
                   gcap_tensor *out) {
  gcap_status st;
  int i;
  if ((st = gc_check_stream(e, e->current, gc_kernel_name(k))) != GCAP_OK) return st;
  e->note_what = gc_kernel_name(k);
  for (i = 0; i < nin; i++)
    if ((st = gc_note_access(e, in[i], 0)) != GCAP_OK) return st;
  if (out && (st = gc_note_access(e, out, 1)) != GCAP_OK) return st;
  a->dt = (int)(out ? out->dt : in[0]->dt);
  return launch(e, k, a); /* checked above, before the notes */
}

gcap_status gc_rng_advance(gcap_engine *e, int64_t n) {
  gc_blk *b = e->rng;
  gc_kargs a;
  gcap_status st;
  if ((st = gc_check_stream(e, e->current, gc_kernel_name(GC_K_RNG_ADVANCE))) != GCAP_OK ||
      (st = gc_note_range(e, b, (uintptr_t)b->ptr, (uintptr_t)b->ptr + b->size, 1)) != GCAP_OK)
    return st;
  memset(&a, 0, sizeof a);
  a.p[0] = b->ptr;
  a.n[0] = n;
  return launch(e, GC_K_RNG_ADVANCE, &a);
}

gcap_status gc_foreach_add(gcap_engine *e, int n, gcap_tensor *const *dst, gcap_tensor *const *src,
                           const int *add) {
  gc_kargs a;
  gcap_status st;
  int j;
  if ((st = gc_check_stream(e, e->current, gc_kernel_name(GC_K_FOREACH_ADD))) != GCAP_OK) return st;
  memset(&a, 0, sizeof a);
  e->note_what = gc_kernel_name(GC_K_FOREACH_ADD);
  for (j = 0; j < n; j++) { /* the notes of n in-place adds or copies, in order */
    if ((add[j] && (st = gc_note_access(e, dst[j], 0)) != GCAP_OK) ||
        (st = gc_note_access(e, src[j], 0)) != GCAP_OK ||
        (st = gc_note_access(e, dst[j], 1)) != GCAP_OK)
      return st;
    a.p[2 * j] = gc_tensor_ptr(dst[j]);
    a.p[2 * j + 1] = gc_tensor_ptr(src[j]);
    a.n[j] = dst[j]->numel;
    a.n[GC_FOREACH_MAX + j] = add[j];
  }
  a.dt = (int)dst[0]->dt;
  return launch(e, GC_K_FOREACH_ADD, &a);
}
