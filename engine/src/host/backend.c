/*
** backend.c: the host backend, the reference and the embedded default.
** Work runs synchronously on the calling thread, in queue order. During a
** capture, launches on the capturing stream (and on streams forked into it)
** are recorded as (kernel, arguments by value) and not run; instantiate
** freezes the record; a replay runs it. Raw pointers are baked at capture,
** exactly as in a CUDA graph.
*/
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

typedef struct hb_node {
  int k;
  gc_kargs a;
} hb_node;

/* A capture in progress, then a captured graph, then an exec: one list. */
typedef struct hb_rec {
  hb_node *v;
  int64_t n, cap;
  struct hb_stream **members; /* streams recording into it while open */
  int nmembers, capmembers;
} hb_rec;

typedef struct hb_stream {
  hb_rec *rec; /* the capture this stream records into, or NULL */
} hb_stream;

typedef struct hb_event {
  uint64_t epoch; /* the capture it was recorded in, 0 if none */
} hb_event;

typedef struct hb_state {
  hb_rec *open;   /* the capture in progress */
  uint64_t epoch; /* counts captures, so stale events never fork */
} hb_state;

static gcap_status hb_init(gcap_engine *e, void **bs) {
  if ((*bs = gc_calloc(1, sizeof(hb_state))) == NULL)
    return gc_fail(e, GCAP_ENOMEM, "host backend: out of memory");
  return GCAP_OK;
}

static void hb_shutdown(void *bs) {
  free(bs);
}

static gcap_status hb_malloc(gcap_engine *e, void *bs, size_t n, void **p) {
  (void)bs;
  *p = gc_fault() ? NULL : aligned_alloc(256, (n + 255) / 256 * 256);
  if (*p == NULL)
    return gc_fail(e, GCAP_ENOMEM, "host backend: out of memory allocating %zu bytes", n);
  return GCAP_OK;
}

static void hb_free(void *bs, void *p) {
  (void)bs;
  free(p);
}

static gcap_status hb_stream_new(gcap_engine *e, void *bs, void **s) {
  (void)bs;
  if ((*s = gc_calloc(1, sizeof(hb_stream))) == NULL)
    return gc_fail(e, GCAP_ENOMEM, "host backend: out of memory");
  return GCAP_OK;
}

static void hb_stream_free(void *bs, void *s) {
  (void)bs;
  free(s);
}

/* Work is synchronous: nothing is ever pending. */
static gcap_status hb_sync(gcap_engine *e, void *bs, void *s) {
  (void)e, (void)bs, (void)s;
  return GCAP_OK;
}

static gcap_status hb_device_sync(gcap_engine *e, void *bs) {
  (void)e, (void)bs;
  return GCAP_OK;
}

static gcap_status hb_event_new(gcap_engine *e, void *bs, void **ev) {
  (void)bs;
  if ((*ev = gc_calloc(1, sizeof(hb_event))) == NULL)
    return gc_fail(e, GCAP_ENOMEM, "host backend: out of memory");
  return GCAP_OK;
}

static void hb_event_free(void *bs, void *ev) {
  (void)bs;
  free(ev);
}

static gcap_status hb_event_record(gcap_engine *e, void *bs, void *ev, void *s) {
  (void)e;
  ((hb_event *)ev)->epoch = ((hb_stream *)s)->rec ? ((hb_state *)bs)->epoch : 0;
  return GCAP_OK;
}

/* Waiting on an event recorded in the open capture forks s into it. */
static gcap_status hb_stream_wait(gcap_engine *e, void *bs, void *s, void *ev) {
  hb_state *hs = (hb_state *)bs;
  hb_stream *st = (hb_stream *)s;
  hb_rec *rec = hs->open;
  if (rec == NULL || ((hb_event *)ev)->epoch != hs->epoch || st->rec == rec) return GCAP_OK;
  if (rec->nmembers == rec->capmembers) {
    int cap = rec->capmembers ? 2 * rec->capmembers : 4;
    hb_stream **v = (hb_stream **)gc_realloc(rec->members, (size_t)cap * sizeof *v);
    if (v == NULL) return gc_fail(e, GCAP_ENOMEM, "host backend: out of memory");
    rec->members = v;
    rec->capmembers = cap;
  }
  rec->members[rec->nmembers++] = st;
  st->rec = rec;
  return GCAP_OK;
}

static gcap_status hb_copy(gcap_engine *e, void *bs, void *s, void *dst, const void *src,
                           size_t n) {
  (void)e, (void)bs, (void)s;
  memcpy(dst, src, n);
  return GCAP_OK;
}

static gcap_status hb_launch(gcap_engine *e, void *bs, void *s, int k, const gc_kargs *a) {
  hb_rec *rec = ((hb_stream *)s)->rec;
  hk_fn fn = hk_kernel(k);
  (void)bs;
  if (fn == NULL) return gc_fail(e, GCAP_EINVAL, "host backend: unknown kernel %d", k);
  if (rec == NULL) {
    fn(a);
    return GCAP_OK;
  }
  if (rec->n == rec->cap) {
    int64_t cap = rec->cap ? 2 * rec->cap : 64;
    hb_node *v = (hb_node *)gc_realloc(rec->v, (size_t)cap * sizeof *v);
    if (v == NULL)
      return gc_fail(e, GCAP_ENOMEM, "host backend: out of memory recording a capture");
    rec->v = v;
    rec->cap = cap;
  }
  rec->v[rec->n].k = k;
  rec->v[rec->n].a = *a;
  rec->n++;
  return GCAP_OK;
}

static gcap_status hb_capture_begin(gcap_engine *e, void *bs, void *s) {
  hb_state *hs = (hb_state *)bs;
  hb_rec *rec = (hb_rec *)gc_calloc(1, sizeof(hb_rec));
  if (rec == NULL) return gc_fail(e, GCAP_ENOMEM, "host backend: out of memory");
  ((hb_stream *)s)->rec = rec;
  hs->open = rec;
  hs->epoch++;
  return GCAP_OK;
}

/* Every stream leaves the capture: the origin and those forked in. */
static gcap_status hb_capture_end(gcap_engine *e, void *bs, void *s, void **graph) {
  hb_state *hs = (hb_state *)bs;
  hb_rec *rec = ((hb_stream *)s)->rec;
  int i;
  (void)e;
  for (i = 0; i < rec->nmembers; i++)
    rec->members[i]->rec = NULL;
  free(rec->members);
  rec->members = NULL;
  rec->nmembers = rec->capmembers = 0;
  ((hb_stream *)s)->rec = NULL;
  hs->open = NULL;
  *graph = rec;
  return GCAP_OK;
}

static gcap_status hb_instantiate(gcap_engine *e, void *bs, void *graph, void **exec,
                                  int64_t *nodes) {
  (void)bs;
  *exec = NULL;
  if (gc_fault()) return gc_fail(e, GCAP_EDEVICE, "host backend: instantiate: out of resources");
  *exec = graph; /* the record is immutable from here on */
  *nodes = ((hb_rec *)graph)->n;
  return GCAP_OK;
}

static gcap_status hb_graph_launch(gcap_engine *e, void *bs, void *exec, void *s) {
  const hb_rec *rec = (const hb_rec *)exec;
  int64_t i;
  (void)bs;
  if (((hb_stream *)s)->rec != NULL)
    return gc_fail(e, GCAP_ECAPTURE, "host backend: graph launch into a capturing stream");
  for (i = 0; i < rec->n; i++)
    hk_kernel(rec->v[i].k)(&rec->v[i].a);
  return GCAP_OK;
}

static void hb_graph_free(void *bs, void *graph, void *exec) {
  hb_rec *rec = (hb_rec *)(graph ? graph : exec);
  (void)bs;
  if (rec == NULL) return;
  free(rec->v);
  free(rec);
}

static gcap_status hb_event_sync(gcap_engine *e, void *bs, void *ev) {
  (void)e, (void)bs, (void)ev;
  return GCAP_OK;
}

static const gc_backend hb_backend = {
    "host",         hb_init,        hb_shutdown,     hb_malloc,    hb_free,       hb_stream_new,
    hb_stream_free, hb_sync,        hb_device_sync,  hb_event_new, hb_event_free, hb_event_record,
    hb_stream_wait, hb_event_sync,  hb_copy,         hb_copy,      hb_launch,     hb_capture_begin,
    hb_capture_end, hb_instantiate, hb_graph_launch, hb_graph_free};

const gc_backend *gc_host_backend(void) {
  return &hb_backend;
}
