/*
** capture.c: graph objects. Begin/end capture into a pool, instantiate,
** replay, reset; and the replay-order check for graphs sharing a pool.
**
** The check (docs/semantics.md, "Pools and the replay-order check"): at
** capture, each graph records the pool bytes it reads before writing them
** itself (its read set), each with the graph that last wrote them in capture
** order (its producer, from the pool's capture-order map), and the bytes it
** writes. At replay a second map says who really wrote each range last (replays
** and eager work only: a capture that failed, or a graph never replayed, wrote
** nothing); a read whose range was last written by another graph than its
** producer (and not by the reader itself, or by eager work) means a graph
** captured in between has reused that memory: the replay is refused.
*/
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

/* A slot for g in the registry (a destroyed graph's, if any) and a new id. */
static gcap_status graph_register(gcap_engine *e, gcap_graph *g) {
  if (e->nfree_slots == 0) { /* every slot is taken: twice as many */
    int old = e->graphs_cap, cap = old, k;
    if (!gc_growvector(e->graphs, cap, old + 1, 64) ||
        !gc_growvector(e->free_slots, e->graphs_cap, cap, 64))
      return gc_fail(e, GCAP_ENOMEM, "graph: out of host memory");
    for (k = cap - 1; k >= old; k--) { /* lowest slots first */
      e->graphs[k] = NULL;
      e->free_slots[e->nfree_slots++] = k;
    }
  }
  g->slot = e->free_slots[--e->nfree_slots];
  g->id = ++e->last_graph_id;
  e->graphs[g->slot] = g;
  return GCAP_OK;
}

gcap_status gcap_graph_new(gcap_engine *e, gcap_graph **out) {
  gcap_graph *g;
  gcap_status st;
  if (out != NULL) *out = NULL;
  if (e == NULL) return GCAP_EINVAL;
  if ((st = gc_check_open(e, "graph")) != GCAP_OK) return st;
  if (out == NULL) return gc_null(e, "graph_new", "out");
  if ((g = (gcap_graph *)gc_calloc(1, sizeof *g)) == NULL)
    return gc_fail(e, GCAP_ENOMEM, "graph: out of host memory");
  if ((st = graph_register(e, g)) != GCAP_OK) {
    free(g);
    return st;
  }
  g->e = e;
  snprintf(g->name, sizeof g->name, "graph #%lld", (long long)g->id);
  gc_engine_ref(e);
  *out = g;
  return GCAP_OK;
}

gcap_status gcap_graph_set_name(gcap_graph *g, const char *name) {
  if (g == NULL) return GCAP_EINVAL;
  gc_clear(g->e);
  if (name == NULL) return gc_null(g->e, "graph_set_name", "name");
  snprintf(g->name, sizeof g->name, "%s", name);
  return GCAP_OK;
}

const char *gcap_graph_name(const gcap_graph *g) {
  return g ? g->name : "";
}

int gcap_graph_is_captured(const gcap_graph *g) {
  return g != NULL && g->state == GC_GRAPH_READY;
}

gcap_pool *gcap_graph_pool(gcap_graph *g) {
  return g ? g->pool : NULL;
}

/* ------------------------------------------------------------------------ */
/* Access sets                                                               */

static int ranges_push(gc_ranges *r, uintptr_t lo, uintptr_t hi, gc_gid producer,
                       const char *what) {
  if (!gc_growvector(r->v, r->cap, r->n + 1, 16)) return 0;
  r->v[r->n].lo = lo;
  r->v[r->n].hi = hi;
  r->v[r->n].producer = producer;
  r->v[r->n].what = what;
  r->n++;
  return 1;
}

static void ranges_free(gc_ranges *r) {
  free(r->v);
  r->v = NULL;
  r->n = r->cap = 0;
}

/* Is [lo, hi) inside one range the graph wrote itself? */
static int ranges_cover(const gc_ranges *r, uintptr_t lo, uintptr_t hi) {
  int i;
  for (i = 0; i < r->n; i++)
    if (r->v[i].lo <= lo && hi <= r->v[i].hi) return 1;
  return 0;
}

static int ranges_has(const gc_ranges *r, uintptr_t lo, uintptr_t hi, gc_gid producer) {
  int i;
  for (i = r->n - 1; i >= 0; i--)
    if (r->v[i].lo == lo && r->v[i].hi == hi && r->v[i].producer == producer) return 1;
  return 0;
}

typedef struct read_ctx {
  gcap_graph *g;
  const char *what;
  int ok;
} read_ctx;

static int note_read_piece(void *ud, uintptr_t lo, uintptr_t hi, gc_gid writer) {
  read_ctx *rc = (read_ctx *)ud;
  if (!ranges_has(&rc->g->reads, lo, hi, writer) &&
      !ranges_push(&rc->g->reads, lo, hi, writer, rc->what))
    rc->ok = 0;
  return 0;
}

static gcap_status graph_hold(gcap_graph *g, gc_blk *b) {
  int i;
  for (i = g->nheld - 1; i >= 0; i--)
    if (g->held[i] == b) return GCAP_OK;
  if (!gc_growvector(g->held, g->capheld, g->nheld + 1, 16))
    return gc_fail(g->e, GCAP_ENOMEM, "capture: out of host memory");
  gc_blk_retain(b);
  g->held[g->nheld++] = b;
  return GCAP_OK;
}

/* Log a piece of the capture-order map about to be overwritten. */
static int undo_piece(void *ud, uintptr_t lo, uintptr_t hi, gc_gid writer) {
  return !ranges_push((gc_ranges *)ud, lo, hi, writer, NULL);
}

gcap_status gc_note_range(gcap_engine *e, gc_blk *b, uintptr_t lo, uintptr_t hi, int write) {
  gcap_pool *p = b->pool;
  gcap_graph *g;
  if (b->dead)
    return gc_fail(e, GCAP_ESTATE,
                   "%s output #%d of graphed entry %d refused: reuse_graph_input_output_buffers "
                   "gave its memory back after the entry's backward, and another entry's graph "
                   "has written it since; read or clone an output before then, or call its entry "
                   "again",
                   write ? "writing" : "reading", b->dead_k, b->dead);
  if (write) b->version++;
  if (lo == hi) return GCAP_OK;
  if (e->cap == NULL) { /* eager: only pool memory is tracked */
    if (write && !p->is_heap) {
      if (!gc_ivmap_reserve(&p->writers, 1) || !gc_ivmap_reserve(&p->cap_writers, 1))
        return gc_fail(e, GCAP_ENOMEM,
                       "recording a write: out of host memory (the pool's map of writers)");
      gc_ivmap_set(&p->writers, lo, hi, GC_WRITER_OUTSIDE);
      gc_ivmap_set(&p->cap_writers, lo, hi, GC_WRITER_OUTSIDE);
    }
    return GCAP_OK;
  }
  g = e->cap->g;
  if (p != e->cap->pool) return graph_hold(g, b); /* memory the graph uses, kept alive */
  if (write) {
    /* room for this write and for putting back every logged piece, should
    ** the capture fail (cap_free) */
    if ((!ranges_cover(&g->writes, lo, hi) && !ranges_push(&g->writes, lo, hi, g->id, NULL)) ||
        gc_ivmap_each(&p->cap_writers, lo, hi, undo_piece, &e->cap->undo) ||
        !gc_ivmap_reserve(&p->cap_writers, 1 + e->cap->undo.n))
      return gc_fail(e, GCAP_ENOMEM, "capture: out of host memory");
    gc_ivmap_set(&p->cap_writers, lo, hi, g->id);
  } else if (!ranges_cover(&g->writes, lo, hi)) {
    read_ctx rc = {g, e->note_what, 1};
    gc_ivmap_each(&p->cap_writers, lo, hi, note_read_piece, &rc);
    if (!rc.ok) return gc_fail(e, GCAP_ENOMEM, "capture: out of host memory");
  }
  return GCAP_OK;
}

gcap_status gc_graph_keep(gcap_engine *e, void *obj, void (*release)(void *obj)) {
  gcap_graph *g;
  if (e->cap == NULL) return GCAP_OK;
  g = e->cap->g;
  if (!gc_growvector(g->kept, g->capkept, g->nkept + 1, 4))
    return gc_fail(e, GCAP_ENOMEM, "capture: out of host memory");
  g->kept[g->nkept].obj = obj;
  g->kept[g->nkept].release = release;
  g->nkept++;
  return GCAP_OK;
}

/* Drop what a capture gathered; g becomes empty. */
static void graph_clear(gcap_graph *g) {
  gcap_engine *e = g->e;
  gcap_pool *pool = g->pool;
  int i;
  if (g->bgraph || g->bexec) e->be->graph_free(e->bs, g->bgraph, g->bexec);
  g->bgraph = g->bexec = NULL;
  for (i = 0; i < g->nheld; i++)
    gc_blk_release(g->held[i]);
  free(g->held);
  g->held = NULL;
  g->nheld = g->capheld = 0;
  for (i = 0; i < g->nkept; i++) /* after the backend's graph, whose nodes use them */
    g->kept[i].release(g->kept[i].obj);
  free(g->kept);
  g->kept = NULL;
  g->nkept = g->capkept = 0;
  ranges_free(&g->reads);
  ranges_free(&g->writes);
  memset(&g->stats, 0, sizeof g->stats);
  g->state = GC_GRAPH_EMPTY;
  g->pool = NULL;
  if (pool) {
    pool->graphs--;
    gc_pool_maybe_release(pool);
  }
}

void gc_graph_destroy(gcap_graph *g) {
  gcap_engine *e = g->e;
  graph_clear(g);
  e->graphs[g->slot] = NULL;
  e->free_slots[e->nfree_slots++] = g->slot; /* room: one per slot */
  free(g);
  gc_engine_unref(e);
}

int gc_graph_touches(const gcap_graph *g, const gc_blk *b, uintptr_t lo, uintptr_t hi, int write) {
  const gc_ranges *r = write ? &g->writes : &g->reads;
  int i;
  if (b->pool != g->pool) {
    for (i = 0; i < g->nheld; i++)
      if (g->held[i] == b) return 1;
    return 0;
  }
  for (i = 0; i < r->n; i++)
    if (r->v[i].lo < hi && lo < r->v[i].hi) return 1;
  return 0;
}

static void capture_abandon(gcap_graph *g);

void gcap_graph_free(gcap_graph *g) {
  gcap_engine *e;
  if (g == NULL) return;
  e = g->e;
  if (e->cap != NULL && e->cap->g == g) /* its own capture cannot end later: it ends now */
    capture_abandon(g);
  if (e->cap != NULL) { /* e.g. the Lua collector, mid-capture: after the capture */
    g->next_dead = e->dead_graphs;
    e->dead_graphs = g;
    return;
  }
  gc_graph_destroy(g);
}

/* ------------------------------------------------------------------------ */
/* Capture                                                                   */

gcap_status gcap_capture_begin(gcap_graph *g, gcap_pool *pool, gcap_stream *s) {
  gcap_engine *e;
  gc_capture *cap;
  gcap_status st;
  int private_pool = 0;
  if (g == NULL) { /* told to the engine of the pool or the stream */
    e = pool ? pool->e : s ? s->e : NULL;
    return e ? gc_null(e, "capture", "g") : GCAP_EINVAL;
  }
  e = g->e;
  gc_clear(e);
  if (e->closed) return gc_fail(e, GCAP_ESTATE, "capture: the engine is closed");
  if (e->cap != NULL)
    return gc_fail(e, GCAP_ESTATE, "capture: a capture is already open (%s); one at a time",
                   e->cap->g->name);
  if (g->state != GC_GRAPH_EMPTY)
    return gc_fail(e, GCAP_ESTATE, "capture: %s already holds a capture; reset it first", g->name);
  if (pool && pool->e != e) return gc_foreign(e, "capture", "the pool");
  if (s && s->e != e) return gc_foreign(e, "capture", "the stream s");
  if (pool && pool->handles <= 0) return gc_fail(e, GCAP_ESTATE, "capture: the pool is closed");
  if (pool == NULL) {
    if ((pool = gc_pool_create(e, 0)) == NULL)
      return gc_fail(e, GCAP_ENOMEM, "capture: out of host memory");
    gc_engine_ref(e);
    private_pool = 1;
  }
  if ((cap = (gc_capture *)gc_calloc(1, sizeof *cap)) == NULL) {
    st = gc_fail(e, GCAP_ENOMEM, "capture: out of host memory");
    goto fail;
  }
  if (s == NULL) s = e->capture_stream;
  if ((st = e->be->capture_begin(e, e->bs, s->bs)) != GCAP_OK) {
    free(cap);
    goto fail;
  }
  cap->g = g;
  cap->pool = pool;
  cap->origin = s;
  cap->prev_current = e->current;
  cap->t0 = gc_now_ms();
  gc_span_begin(e, &cap->span, "capture %s", g->name);
  e->cap = cap;
  e->cap_epoch++;
  e->current = s;
  s->in_capture = 1;
  pool->graphs++;
  g->pool = pool;
  g->state = GC_GRAPH_CAPTURING;
  return GCAP_OK;
fail:
  if (private_pool) gc_pool_maybe_release(pool);
  return st;
}

/* Did the origin come to wait for all of s's work, directly or through
** other streams of the capture? */
static int stream_joined(const gcap_stream *s, const gcap_stream *origin) {
  int hops;
  for (hops = 0; s != origin && hops < 1 << 16; hops++) { /* bounded: a wait cycle is no join */
    if (s->joined_seq != s->seq || s->absorber == NULL || !s->absorber->in_capture) return 0;
    s = s->absorber;
  }
  return s == origin;
}

/* Free a capture's record; a failed capture (restore) leaves the pool's
** capture-order map as it was at begin: what it wrote never happens (the
** pieces it overwrote go back, last first; a gap comes back as "outside",
** which is what a lookup of a gap answers). */
static void cap_free(gc_capture *cap, int restore) {
  int k;
  for (k = cap->undo.n - 1; restore && k >= 0; k--)
    gc_ivmap_set(&cap->pool->cap_writers, cap->undo.v[k].lo, cap->undo.v[k].hi,
                 cap->undo.v[k].producer);
  ranges_free(&cap->undo);
  free(cap);
}

/* End the open capture on the backend (its graph in *bgraph) and take it
** off the engine: no stream is in a capture, the stream current before it
** is current again. The backend's status. */
static gcap_status capture_detach(gcap_engine *e, void **bgraph) {
  gc_capture *cap = e->cap;
  gcap_stream *s;
  gcap_status st = e->be->capture_end(e, e->bs, cap->origin->bs, bgraph);
  for (s = e->streams; s != NULL; s = s->next)
    s->in_capture = 0;
  e->current = cap->prev_current;
  e->cap = NULL;
  return st;
}

/* Drop what a failed capture made: its backend graph, its record (the
** pool's capture-order map as before), g's gatherings; then run what was
** deferred while it was open. */
static void capture_discard(gcap_graph *g, gc_capture *cap, void *bgraph) {
  gcap_engine *e = g->e;
  if (bgraph) e->be->graph_free(e->bs, bgraph, NULL);
  cap_free(cap, 1);
  graph_clear(g);
  gc_run_deferred(e);
}

/* g is freed during its own capture (a <close> variable on an error, a
** collector): the capture ends, as a failed one, so that the engine is not
** left capturing. */
static void capture_abandon(gcap_graph *g) {
  gcap_engine *e = g->e;
  gc_capture *cap = e->cap;
  void *bgraph = NULL;
  cap->span.t0 = 0.0; /* no trace event: its range alone ends */
  gc_span_end(e, &cap->span, "capture", NULL);
  capture_detach(e, &bgraph);
  capture_discard(g, cap, bgraph);
}

gcap_status gcap_capture_end(gcap_graph *g) {
  gcap_engine *e;
  gc_capture *cap;
  gcap_stream *s;
  gcap_status st;
  void *bgraph = NULL;
  gc_span sp;
  double t1;
  if (g == NULL) return GCAP_EINVAL;
  e = g->e;
  gc_clear(e);
  cap = e->cap;
  if (cap == NULL || cap->g != g)
    return gc_fail(e, GCAP_ESTATE, "capture_end: %s is not capturing", g->name);
  if (e->current != cap->origin)
    gc_capture_refuse(e, "capture_end: the capture must end on the stream it began on");
  for (s = e->streams; s != NULL; s = s->next)
    if (s->in_capture && s != cap->origin && !stream_joined(s, cap->origin))
      gc_capture_refuse(e, "capture_end: a stream forked into the capture was not joined back "
                           "(the capture stream must wait on an event recorded on it after its "
                           "last work)");
  st = capture_detach(e, &bgraph);
  t1 = gc_now_ms();
  gc_span_end(e, &cap->span, "capture", cap->invalid || st != GCAP_OK ? " (failed)" : "");
  if (cap->invalid || st != GCAP_OK) {
    char why[GC_ERRLEN];
    snprintf(why, sizeof why, "%s", cap->invalid ? cap->why : e->err);
    capture_discard(g, cap, bgraph);
    return gc_fail(e, GCAP_ECAPTURE, "capture of %s failed: %s", g->name, why);
  }
  g->bgraph = bgraph;
  g->stats.capture_ms = t1 - cap->t0;
  gc_span_begin(e, &sp, "instantiate %s", g->name);
  st = e->be->instantiate(e, e->bs, g->bgraph, &g->bexec, &g->stats.nodes);
  g->stats.instantiate_ms = gc_now_ms() - t1;
  gc_span_end(e, &sp, "capture", NULL);
  g->stats.pool_bytes = g->pool->reserved;
  cap_free(cap, st != GCAP_OK);
  if (st != GCAP_OK) {
    char why[GC_ERRLEN];
    snprintf(why, sizeof why, "%s", e->err);
    graph_clear(g);
    gc_run_deferred(e);
    return gc_fail(e, st, "capture of %s: instantiate failed: %s", g->name, why);
  }
  g->state = GC_GRAPH_READY;
  gc_run_deferred(e);
  return GCAP_OK;
}

/* ------------------------------------------------------------------------ */
/* Replay                                                                    */

typedef struct check_ctx {
  gcap_graph *g;
  gc_gid producer;
  uintptr_t lo, hi;
  gc_gid culprit;
} check_ctx;

static int check_piece(void *ud, uintptr_t lo, uintptr_t hi, gc_gid writer) {
  check_ctx *cc = (check_ctx *)ud;
  if (writer == cc->producer || writer == GC_WRITER_OUTSIDE || writer == cc->g->id) return 0;
  cc->lo = lo;
  cc->hi = hi;
  cc->culprit = writer;
  return 1;
}

static const char *graph_label(gcap_engine *e, gc_gid id, char *buf, size_t n) {
  const gcap_graph *g = id == GC_WRITER_OUTSIDE ? NULL : gc_graph_of(e, id);
  if (id == GC_WRITER_OUTSIDE)
    snprintf(buf, n, "eager work");
  else if (g != NULL)
    snprintf(buf, n, "'%s'", g->name);
  else
    snprintf(buf, n, "graph #%lld (destroyed)", (long long)id);
  return buf;
}

static gcap_status replay_check(gcap_graph *g) {
  gc_ivmap *m = &g->pool->writers;
  int i;
  for (i = 0; i < g->reads.n; i++) {
    check_ctx cc = {g, g->reads.v[i].producer, 0, 0, 0};
    if (gc_ivmap_each(m, g->reads.v[i].lo, g->reads.v[i].hi, check_piece, &cc)) {
      char a[GC_NAMELEN + 32], b[GC_NAMELEN + 32], c[GC_NAMELEN + 32];
      char by[GC_NAMELEN + 32] = "";
      if (g->reads.v[i].what) snprintf(by, sizeof by, " (read by %s)", g->reads.v[i].what);
      return gc_fail(g->e, GCAP_EREPLAY,
                     "replay: %s refused: it reads %zu bytes at 0x%llx%s that %s wrote at "
                     "capture, but %s (sharing the pool) has overwritten them since; replay "
                     "graphs that share a pool in the order they were captured",
                     graph_label(g->e, g->id, c, sizeof c), (size_t)(cc.hi - cc.lo),
                     (unsigned long long)cc.lo, by, graph_label(g->e, cc.producer, a, sizeof a),
                     graph_label(g->e, cc.culprit, b, sizeof b));
    }
  }
  return GCAP_OK;
}

/* Why g cannot be replayed or dumped: it holds no captured graph. */
static gcap_status not_captured(gcap_graph *g, const char *op) {
  return gc_fail(g->e, GCAP_ESTATE, "%s: %s is not captured (%s)", op, g->name,
                 g->state == GC_GRAPH_CAPTURING ? "its capture is still open"
                                                : "never captured, or reset");
}

static gcap_status graph_replay(gcap_graph *g) {
  gcap_engine *e = g->e;
  gcap_stream *s;
  gcap_status st;
  int i;
  if (g->state != GC_GRAPH_READY) return not_captured(g, "replay");
  if ((st = gc_check_not_capturing(e, "graph replay")) != GCAP_OK) return st;
  s = e->current;
  if ((st = gc_check_stream(e, s, "replay")) != GCAP_OK || (st = gc_badid_check(e)) != GCAP_OK)
    return st;
  if (e->replay_check && (st = replay_check(g)) != GCAP_OK) return st;
  if (!gc_ivmap_reserve(&g->pool->writers, g->writes.n)) /* before the launch: all or nothing */
    return gc_fail(e, GCAP_ENOMEM, "replay of %s: out of host memory recording its writes",
                   g->name);
  if ((st = e->be->graph_launch(e, e->bs, g->bexec, s->bs)) != GCAP_OK) return st;
  s->seq++;
  for (i = 0; i < g->writes.n; i++)
    gc_ivmap_set(&g->pool->writers, g->writes.v[i].lo, g->writes.v[i].hi, g->id);
  g->stats.replays++;
  return GCAP_OK;
}

gcap_status gc_graph_replay(gcap_graph *g) {
  gcap_engine *e = g->e;
  gcap_status st;
  gc_span sp;
  gc_clear(e);
  gc_span_begin(e, &sp, "replay %s", g->name);
  if ((st = graph_replay(g)) != GCAP_OK) sp.t0 = 0.0; /* traced when it ran */
  gc_span_end(e, &sp, "replay", NULL);
  return st;
}

gcap_status gcap_graph_replay(gcap_graph *g) {
  gcap_status st;
  if (g == NULL) return GCAP_EINVAL;
  if ((st = gc_graph_replay(g)) != GCAP_OK) return st;
  return gc_badid_check(g->e); /* on a backend that ran it at once, this replay's */
}

gcap_status gcap_graph_debug_dump(gcap_graph *g, const char *path) {
  gcap_engine *e;
  char why[GC_ERRLEN];
  gcap_status st;
  FILE *f;
  if (g == NULL) return GCAP_EINVAL;
  e = g->e;
  gc_clear(e);
  if (path == NULL) return gc_null(e, "debug_dump", "path");
  if (*path == '\0') return gc_fail(e, GCAP_EINVAL, "debug_dump: the path is empty");
  if (g->state != GC_GRAPH_READY) return not_captured(g, "debug_dump");
  if ((f = fopen(path, "w")) == NULL)
    return gc_fail(e, GCAP_EINVAL, "debug_dump: cannot write '%s': %s", path, strerror(errno));
  fclose(f);
  if ((st = e->be->debug_dump(e, e->bs, g->bgraph, g->name, path)) == GCAP_OK) return GCAP_OK;
  snprintf(why, sizeof why, "%s", e->err);
  return gc_fail(e, st, "debug_dump of %s: %s", g->name, why);
}

gcap_status gcap_graph_reset(gcap_graph *g) {
  gcap_engine *e;
  if (g == NULL) return GCAP_EINVAL;
  e = g->e;
  gc_clear(e);
  if (g->state == GC_GRAPH_CAPTURING)
    return gc_fail(e, GCAP_ESTATE, "reset: %s is capturing; end the capture first", g->name);
  if (e->cap != NULL)
    return gc_fail(e, GCAP_ESTATE, "reset: not allowed while a capture is open (%s)",
                   e->cap->g->name);
  graph_clear(g);
  return GCAP_OK;
}

gcap_status gcap_graph_get_stats(gcap_graph *g, gcap_graph_stats *out) {
  if (g == NULL) return GCAP_EINVAL;
  gc_clear(g->e);
  if (out == NULL) return gc_null(g->e, "graph_get_stats", "out");
  *out = g->stats;
  return GCAP_OK;
}
