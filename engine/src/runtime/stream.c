/*
** stream.c: streams and events, and the fork/join bookkeeping of captures.
** A stream joins the open capture by waiting on an event recorded in it
** (CUDA's rule); it is joined back when a stream of the capture that is
** itself joined (or the origin) waits on an event recorded on it after its
** last work, as CUDA allows joins through other streams.
*/
#include <stdlib.h>

#include "runtime.h"

gcap_status gc_stream_create(gcap_engine *e, int owned, gcap_stream **out) {
  gcap_stream *s = (gcap_stream *)gc_calloc(1, sizeof *s);
  gcap_status st;
  *out = NULL;
  if (s == NULL) return gc_fail(e, GCAP_ENOMEM, "stream: out of host memory");
  if ((st = e->be->stream_new(e, e->bs, &s->bs)) != GCAP_OK) {
    free(s);
    return st;
  }
  s->e = e;
  s->owned_by_engine = owned;
  s->next = e->streams;
  if (e->streams) e->streams->prev = s;
  e->streams = s;
  *out = s;
  return GCAP_OK;
}

void gc_stream_destroy(gcap_stream *s) {
  gcap_engine *e = s->e;
  if (!s->owned_by_engine && e->default_stream != NULL) { /* its blocks: the default stream's */
    e->be->stream_sync(e, e->bs, s->bs);
    gc_pools_retag(e, s, e->default_stream);
  }
  if (s->prev)
    s->prev->next = s->next;
  else
    e->streams = s->next;
  if (s->next) s->next->prev = s->prev;
  e->be->stream_free(e->bs, s->bs);
  free(s);
}

gcap_status gcap_stream_new(gcap_engine *e, gcap_stream **out) {
  gcap_status st;
  if (out != NULL) *out = NULL;
  if (e == NULL) return GCAP_EINVAL;
  if ((st = gc_check_open(e, "stream")) != GCAP_OK) return st;
  if (out == NULL) return gc_null(e, "stream_new", "out");
  if ((st = gc_stream_create(e, 0, out)) == GCAP_OK) gc_engine_ref(e);
  return st;
}

/* The user's stream s goes: now, or when the open capture ends. */
static void stream_release(gcap_stream *s) {
  gcap_engine *e = s->e;
  if (e->cap != NULL) { /* no synchronizing in a capture: it goes when the capture ends */
    s->dead = 1;
    return;
  }
  gc_stream_destroy(s);
  gc_engine_unref(e);
}

void gcap_stream_free(gcap_stream *s) {
  gcap_engine *e;
  if (s == NULL || s->owned_by_engine || s->freed) return;
  e = s->e;
  if (e->current == s) e->current = e->default_stream;
  if (e->cap && e->cap->prev_current == s) e->cap->prev_current = e->default_stream;
  if (e->warm_prev == s) e->warm_prev = e->default_stream;
  if (s->holds > 0) { /* the engine still uses it: it goes with the last hold */
    s->freed = 1;
    return;
  }
  stream_release(s);
}

void gc_stream_hold(gcap_stream *s) {
  s->holds++;
}

void gc_stream_drop(gcap_stream *s) {
  if (--s->holds == 0 && s->freed) stream_release(s);
}

gcap_status gc_stream_wait_stream(gcap_stream *waiter, gcap_stream *s, gcap_event *ev) {
  gcap_status st;
  if ((st = gcap_event_record(ev, s)) != GCAP_OK) return st;
  return gcap_stream_wait_event(waiter, ev);
}

gcap_stream *gcap_default_stream(gcap_engine *e) {
  return e ? e->default_stream : NULL;
}

gcap_stream *gcap_capture_stream(gcap_engine *e) {
  return e ? e->capture_stream : NULL;
}

gcap_stream *gcap_current_stream(gcap_engine *e) {
  return e ? e->current : NULL;
}

gcap_status gcap_set_current_stream(gcap_engine *e, gcap_stream *s) {
  if (e == NULL) return s ? gc_null(s->e, "set_current_stream", "e") : GCAP_EINVAL;
  gc_clear(e);
  if (s != NULL && s->e != e) return gc_foreign(e, "set_current_stream", "the stream s");
  e->current = s ? s : e->default_stream;
  return GCAP_OK;
}

gcap_status gcap_stream_synchronize(gcap_stream *s) {
  gcap_engine *e;
  gcap_status st;
  if (s == NULL) return GCAP_EINVAL;
  e = s->e;
  gc_clear(e);
  if ((st = gc_check_not_capturing(e, "stream synchronize")) != GCAP_OK ||
      (st = e->be->stream_sync(e, e->bs, s->bs)) != GCAP_OK)
    return st;
  return gc_badid_check(e);
}

gcap_status gcap_stream_native(gcap_stream *s, void **out) {
  if (out != NULL) *out = NULL;
  if (s == NULL) return GCAP_EINVAL;
  gc_clear(s->e);
  if (out == NULL) return gc_null(s->e, "stream_native", "out");
  *out = s->bs;
  return GCAP_OK;
}

gcap_status gcap_event_new(gcap_engine *e, gcap_event **out) {
  gcap_event *ev;
  gcap_status st;
  if (out != NULL) *out = NULL;
  if (e == NULL) return GCAP_EINVAL;
  if ((st = gc_check_open(e, "event")) != GCAP_OK) return st;
  if (out == NULL) return gc_null(e, "event_new", "out");
  if ((ev = (gcap_event *)gc_calloc(1, sizeof *ev)) == NULL)
    return gc_fail(e, GCAP_ENOMEM, "event: out of host memory");
  if ((st = e->be->event_new(e, e->bs, &ev->bs)) != GCAP_OK) {
    free(ev);
    return st;
  }
  ev->e = e;
  gc_engine_ref(e);
  *out = ev;
  return GCAP_OK;
}

gcap_status gcap_event_new_external(gcap_engine *e, gcap_event **out) {
  gcap_status st = gcap_event_new(e, out);
  if (st == GCAP_OK) (*out)->external = 1;
  return st;
}

static void event_release(gcap_event *ev) {
  gcap_engine *e = ev->e;
  e->be->event_free(e->bs, ev->bs);
  free(ev);
  gc_engine_unref(e);
}

void gcap_event_free(gcap_event *ev) {
  if (ev == NULL || ev->freed) return;
  if (ev->holds > 0) { /* a graph records it, or a backward will wait on it */
    ev->freed = 1;
    return;
  }
  event_release(ev);
}

void gc_event_hold(gcap_event *ev) {
  ev->holds++;
}

void gc_event_drop(gcap_event *ev) {
  if (--ev->holds == 0 && ev->freed) event_release(ev);
}

/* A graph that recorded an external event drops it when cleared. */
static void event_unkeep(void *ev) {
  gc_event_drop((gcap_event *)ev);
}

int gc_graph_records(const gcap_graph *g, const gcap_event *ev) {
  int i;
  for (i = 0; i < g->nkept; i++)
    if (g->kept[i].obj == ev && g->kept[i].release == event_unkeep) return 1;
  return 0;
}

/* An external event recorded in a capture: a node of the graph, which
** holds the event while it lives (once, however often it records it). */
static gcap_status record_external(gcap_engine *e, gcap_event *ev, gcap_stream *s) {
  gcap_status st = e->be->event_record_external
                       ? e->be->event_record_external(e, e->bs, ev->bs, s->bs)
                       : e->be->event_record(e, e->bs, ev->bs, s->bs);
  if (st != GCAP_OK) return st;
  if (gc_graph_records(e->cap->g, ev)) return GCAP_OK;
  if ((st = gc_graph_keep(e, ev, event_unkeep)) != GCAP_OK) return st;
  gc_event_hold(ev);
  return GCAP_OK;
}

gcap_status gcap_event_record(gcap_event *ev, gcap_stream *s) {
  gcap_engine *e;
  gcap_status st;
  if (ev == NULL) return s ? gc_null(s->e, "event record", "ev") : GCAP_EINVAL;
  e = ev->e;
  gc_clear(e);
  if (s == NULL) s = e->current;
  if (s->e != e) return gc_foreign(e, "event record", "the stream s");
  if ((st = gc_check_stream(e, s, "event record")) != GCAP_OK) return st;
  if (ev->external && s->in_capture)
    st = record_external(e, ev, s);
  else
    st = e->be->event_record(e, e->bs, ev->bs, s->bs);
  if (st != GCAP_OK) return st;
  ev->stream = s;
  ev->seq = s->seq;
  ev->epoch = s->in_capture ? e->cap_epoch : 0;
  return GCAP_OK;
}

gcap_status gcap_stream_wait_event(gcap_stream *s, gcap_event *ev) {
  gcap_engine *e;
  gcap_status st;
  int captured_ev;
  if (s == NULL) return ev ? gc_null(ev->e, "wait_event", "s") : GCAP_EINVAL;
  e = s->e;
  gc_clear(e);
  if (ev == NULL) return gc_null(e, "wait_event", "ev");
  if (ev->e != e) return gc_foreign(e, "wait_event", "the event ev");
  if (ev->stream == NULL) return GCAP_OK; /* never recorded: nothing to wait for */
  captured_ev = e->cap != NULL && ev->epoch == e->cap_epoch;
  if (e->cap != NULL && e->cap->invalid)
    return gc_fail(e, GCAP_ECAPTURE, "wait_event: the open capture was invalidated earlier: %s",
                   e->cap->why);
  if (s->in_capture && !captured_ev)
    return gc_capture_refuse(e, "wait_event: a capturing stream cannot wait on an event recorded "
                                "outside the capture (it would depend on uncaptured work)");
  if (captured_ev && ev->external)
    return gc_capture_refuse(e, "wait_event: an external event recorded in the capture is "
                                "waited on after a replay, not inside the capture (fork and "
                                "join streams with an event made without `external`)");
  if ((st = e->be->stream_wait(e, e->bs, s->bs, ev->bs)) != GCAP_OK) return st;
  if (captured_ev) {
    if (!s->in_capture) { /* fork s into the capture */
      s->in_capture = 1;
      s->joined_seq = (uint64_t)-1;
      s->absorber = NULL;
    }
    if (ev->stream != s && ev->seq == ev->stream->seq) { /* s now waits for all of ev's stream */
      ev->stream->joined_seq = ev->seq;
      ev->stream->absorber = s;
    }
  }
  return GCAP_OK;
}

gcap_status gcap_event_synchronize(gcap_event *ev) {
  gcap_engine *e;
  gcap_status st;
  if (ev == NULL) return GCAP_EINVAL;
  e = ev->e;
  gc_clear(e);
  if ((st = gc_check_not_capturing(e, "event synchronize")) != GCAP_OK) return st;
  if (ev->stream == NULL) return GCAP_OK;
  return e->be->event_sync(e, e->bs, ev->bs);
}
