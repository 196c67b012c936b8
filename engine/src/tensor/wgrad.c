/*
** wgrad.c: a Linear's wgrad sink, where the backward of its linear nodes
** sends the parameter grads instead of .grad: queued for backward_dw
** (delayed wgrad), or the weight's added into main_grad (fused wgrad, by
** linalg.c). A node holds its sink as its ud, so that a node outlives the
** module that made it.
*/
#include <stdlib.h>

#include "tensor.h"

gcap_status gc_wgrad_sink_new(gcap_engine *e, int delay, gcap_tensor *main_grad,
                              gc_wgrad_sink **out) {
  gc_wgrad_sink *s = (gc_wgrad_sink *)gc_calloc(1, sizeof *s);
  *out = NULL;
  if (s == NULL) return gc_fail(e, GCAP_ENOMEM, "Linear: out of host memory");
  s->refs = 1;
  s->delay = delay;
  s->main_grad = gcap_tensor_retain(main_grad);
  *out = s;
  return GCAP_OK;
}

gc_wgrad_sink *gc_wgrad_sink_retain(gc_wgrad_sink *s) {
  s->refs++;
  return s;
}

void gc_wgrad_queue_free(gc_wgrad_queue *q) {
  int i;
  for (i = 0; i < q->n; i++)
    gcap_tensor_free(q->v[i]);
  free(q->v);
  q->v = NULL;
  q->n = q->cap = 0;
}

void gc_wgrad_sink_release(gc_wgrad_sink *s) {
  if (s == NULL || --s->refs > 0) return;
  gc_wgrad_queue_free(&s->q);
  gcap_tensor_free(s->main_grad);
  free(s);
}

gcap_status gc_wgrad_defer(gc_wgrad_sink *s, gcap_tensor *g, gcap_tensor *x, gcap_tensor *gb) {
  gc_wgrad_queue *q = &s->q;
  if (!gc_growvector(q->v, q->cap, q->n + 3, 8))
    return gc_fail(g->e, GCAP_ENOMEM, "Linear: out of host memory");
  q->v[q->n++] = gcap_tensor_retain(g);
  q->v[q->n++] = gcap_tensor_retain(x);
  q->v[q->n++] = gcap_tensor_retain(gb);
  return GCAP_OK;
}

/* A linear node's ud_free: its reference to the sink. */
static void sink_free(void *s) {
  gc_wgrad_sink_release((gc_wgrad_sink *)s);
}

void gc_wgrad_sink_attach(gc_node *n, gc_wgrad_sink *s) {
  n->ud = gc_wgrad_sink_retain(s);
  n->ud_free = sink_free;
}
