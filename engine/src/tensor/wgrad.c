/*
** wgrad.c: a Linear's wgrad sink, where the backward of its linear nodes
** sends the parameter grads instead of .grad: queued for backward_dw
** (delayed wgrad), or the weight's added into main_grad (fused wgrad, by
** linalg.c). A node holds its sink as its ud, so that a node outlives the
** module that made it.
*/
#include <stdlib.h>
#include <string.h>

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

static void item_free(gc_wgrad_item *it) {
  gcap_tensor_free(it->g);
  gcap_tensor_free(it->x);
  gcap_tensor_free(it->gb);
  gc_fp8_free(&it->gt);
  gc_fp8_free(&it->xt);
}

void gc_wgrad_queue_free(gc_wgrad_queue *q) {
  int i;
  for (i = 0; i < q->n; i++)
    item_free(&q->v[i]);
  free(q->v);
  q->v = NULL;
  q->n = q->cap = 0;
}

void gc_wgrad_queue_pop(gc_wgrad_queue *q) {
  item_free(&q->v[0]);
  memmove(q->v, q->v + 1, (size_t)(q->n - 1) * sizeof *q->v);
  q->n--;
}

void gc_wgrad_sink_release(gc_wgrad_sink *s) {
  if (s == NULL || --s->refs > 0) return;
  gc_wgrad_queue_free(&s->q);
  gcap_tensor_free(s->main_grad);
  free(s);
}

/* The undo of a queued item (gc_backward_undo): a failed backward takes its
** item back, the newest of its sink's queue, so that running it again
** does not queue it twice. */
static void unqueue(void *ud, int undo) {
  gc_wgrad_sink *s = (gc_wgrad_sink *)ud;
  if (undo && s->q.n > 0) item_free(&s->q.v[--s->q.n]);
  gc_wgrad_sink_release(s);
}

/* A new item at the end of s's queue, zeroed, noted for the running
** backward to take back if it fails, or NULL (out of memory). */
static gc_wgrad_item *push(gcap_engine *e, gc_wgrad_sink *s) {
  gc_wgrad_queue *q = &s->q;
  if (!gc_growvector(q->v, q->cap, q->n + 1, 8)) return NULL;
  if (gc_backward_undo(e, unqueue, gc_wgrad_sink_retain(s)) != GCAP_OK) {
    gc_wgrad_sink_release(s); /* the reference the note would have held */
    return NULL;
  }
  memset(&q->v[q->n], 0, sizeof q->v[q->n]);
  return &q->v[q->n++];
}

gcap_status gc_wgrad_defer(gc_wgrad_sink *s, gcap_tensor *g, gcap_tensor *x, gcap_tensor *gb) {
  gc_wgrad_item *it = push(g->e, s);
  if (it == NULL) return gc_fail(g->e, GCAP_ENOMEM, "Linear: out of host memory");
  it->g = gcap_tensor_retain(g);
  it->x = gcap_tensor_retain(x);
  it->gb = gcap_tensor_retain(gb);
  return GCAP_OK;
}

gcap_status gc_wgrad_defer_fp8(gc_wgrad_sink *s, gcap_engine *e, gc_fp8 *gt, gc_fp8 *xt,
                               int64_t rows, gcap_dtype dt, gcap_tensor *gb) {
  gc_wgrad_item *it = push(e, s);
  if (it == NULL) {
    gc_fp8_free(gt);
    gc_fp8_free(xt);
    return gc_fail(e, GCAP_ENOMEM, "Linear: out of host memory");
  }
  it->fp8 = 1;
  it->gt = *gt;
  it->xt = *xt;
  it->rows = rows;
  it->dt = dt;
  it->gb = gcap_tensor_retain(gb);
  memset(gt, 0, sizeof *gt);
  memset(xt, 0, sizeof *xt);
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
