/*
** side.c: a graphed call's replay options, TransformerEngine's
** cuda_graph_stream and cuda_graph_event: the graph replays on the caller's
** stream after the current stream's work, and the current stream then waits
** on the event the graph records (work after it overlaps the graph's rest)
** or on all of that stream's work. A call keeps both for its backward,
** which replays the same way.
*/
#include "graphed.h"

gcap_status gc_graphed_check_opts(gcap_graphed *G, int entry, const gcap_replay_opts *o,
                                  int replay) {
  const ge_entry *x = &G->v[entry];
  char why[GC_NAMELEN + 64];
  if (o == NULL || (o->stream == NULL && o->event == NULL)) return GCAP_OK;
  if (!replay) {
    gc_graphed_mode_change(x, why, sizeof why);
    return gc_fail(G->e, GCAP_EINVAL,
                   "graphed call of entry %d (callable %d, %s): cuda_graph_stream and "
                   "cuda_graph_event are options of a replay, but %s (it runs eagerly)",
                   entry + 1, x->callable + 1, gcap_module_type(x->m), why);
  }
  if (o->stream != NULL && o->stream->e != G->e)
    return gc_foreign(G->e, "graphed call", "cuda_graph_stream");
  if (o->event == NULL) return GCAP_OK;
  if (o->event->e != G->e) return gc_foreign(G->e, "graphed call", "cuda_graph_event");
  if (!o->event->external || !gc_graph_records(x->fwd, o->event))
    return gc_fail(G->e, GCAP_EINVAL,
                   "graphed call of entry %d (callable %d, %s): cuda_graph_event is %s; record "
                   "an external event (gc.Event{external = true}, gcap_event_new_external) inside "
                   "the callable, so that its forward graph records it at each replay",
                   entry + 1, x->callable + 1, gcap_module_type(x->m),
                   o->event->external ? "not recorded by its forward graph"
                                      : "not an external event");
  return GCAP_OK;
}

void gc_graphed_hold_opts(const gcap_replay_opts *o) {
  if (o->stream) gc_stream_hold(o->stream);
  if (o->event) gc_event_hold(o->event);
}

void gc_graphed_drop_opts(const gcap_replay_opts *o) {
  if (o->stream) gc_stream_drop(o->stream);
  if (o->event) gc_event_drop(o->event);
}

gcap_status gc_graphed_replay_on(gcap_graphed *G, gcap_graph *g, const gcap_replay_opts *o) {
  gcap_engine *e = G->e;
  gcap_stream *cur = e->current, *s = o ? o->stream : NULL;
  gcap_status st;
  if (s == NULL || s == cur) return gc_graph_replay(g);
  if (G->sync == NULL && (st = gcap_event_new(e, &G->sync)) != GCAP_OK) return st;
  if ((st = gc_stream_wait_stream(s, cur, G->sync)) != GCAP_OK) return st;
  e->current = s;
  st = gc_graph_replay(g);
  e->current = cur;
  if (st != GCAP_OK) return st;
  if (o->event != NULL && gc_graph_records(g, o->event))
    return gcap_stream_wait_event(cur, o->event);
  return gc_stream_wait_stream(cur, s, G->sync);
}
