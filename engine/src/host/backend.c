/*
** backend.c: the host backend, the reference and the embedded default.
** Work runs synchronously on the calling thread, in queue order. During a
** capture, launches on the capturing stream (and on streams forked into it)
** are recorded as (kernel, arguments by value) and not run; instantiate
** freezes the record; a replay runs it. Raw pointers are baked at capture,
** exactly as in a CUDA graph.
**
** The record also keeps the dependencies CUDA would build, for dumps: each
** node follows the previous node of its stream, and the node an event was
** recorded after, for a stream that waited on the event (forks and joins).
** Replay needs none of it: the record's order is a valid order of the graph.
**
** A collective of the distributed layer is a node like a kernel: its
** descriptor (with the layer's function that does the transfer) is recorded
** by value and run at each replay, in record order.
*/
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

typedef struct hb_node {
  int k;         /* kernel id, HB_COLL or HB_CUSTOM */
  int stream;    /* which stream of the capture recorded it: 0 the origin, i the i-th forked */
  gc_kargs a;    /* a kernel's arguments */
  gc_coll *coll; /* a collective's descriptor (owned), or NULL */
  gc_custom *c;  /* a custom op: a copy owned by the record, its operands after it; or NULL */
  gc_launch_info *info; /* a kernel's: what launched it, and its tensors (dumps); or NULL */
} hb_node;

#define HB_COLL (-1)   /* hb_node.k of a collective */
#define HB_CUSTOM (-2) /* hb_node.k of a custom op */

typedef struct hb_edge {
  int64_t from, to;
} hb_edge;

/* A capture in progress, then a captured graph, then an exec: one list. */
typedef struct hb_rec {
  hb_node *v;
  int n, cap;
  hb_edge *edges; /* dependencies, for dumps */
  int nedges, capedges;
  struct hb_stream **members; /* streams forked into it while open */
  int nmembers, capmembers;
} hb_rec;

typedef struct hb_stream {
  hb_rec *rec;   /* the capture this stream records into, or NULL */
  int idx;       /* its number in that capture (hb_node.stream) */
  int64_t tail;  /* its last node in that capture, -1 if none */
  int64_t *wait; /* nodes its next node must follow (events it waited on) */
  int nwait, capwait;
} hb_stream;

typedef struct hb_event {
  uint64_t epoch; /* the capture it was recorded in, 0 if none */
  int64_t node;   /* the tail of its stream then, -1 if none */
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

/* Host memory is what the kernels write: one pointer for both sides. */
static gcap_status hb_mapped_alloc(gcap_engine *e, void *bs, size_t n, void **host, void **dev) {
  (void)bs;
  *host = *dev = gc_fault() ? NULL : calloc(1, n);
  if (*host == NULL)
    return gc_fail(e, GCAP_ENOMEM, "host backend: out of memory (%zu mapped bytes)", n);
  return GCAP_OK;
}

static gcap_status hb_stream_new(gcap_engine *e, void *bs, void **s) {
  (void)bs;
  if ((*s = gc_calloc(1, sizeof(hb_stream))) == NULL)
    return gc_fail(e, GCAP_ENOMEM, "host backend: out of memory");
  return GCAP_OK;
}

static void hb_stream_free(void *bs, void *s) {
  (void)bs;
  free(((hb_stream *)s)->wait);
  free(s);
}

/* Start stream s in capture rec as its stream number idx. */
static void hb_join_rec(hb_stream *s, hb_rec *rec, int idx) {
  s->rec = rec;
  s->idx = idx;
  s->tail = -1;
  s->nwait = 0;
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
  ((hb_event *)ev)->node = ((hb_stream *)s)->rec ? ((hb_stream *)s)->tail : -1;
  return GCAP_OK;
}

/* Waiting on an event recorded in the open capture forks s into it (or,
** for a stream already in it, joins the event's stream into s). */
static gcap_status hb_stream_wait(gcap_engine *e, void *bs, void *s, void *ev) {
  hb_state *hs = (hb_state *)bs;
  hb_stream *st = (hb_stream *)s;
  hb_rec *rec = hs->open;
  int64_t node = ((hb_event *)ev)->node;
  if (rec == NULL || ((hb_event *)ev)->epoch != hs->epoch) return GCAP_OK;
  if (st->rec != rec) {
    if (!gc_growvector(rec->members, rec->capmembers, rec->nmembers + 1, 4))
      return gc_fail(e, GCAP_ENOMEM, "host backend: out of memory");
    rec->members[rec->nmembers++] = st;
    hb_join_rec(st, rec, rec->nmembers);
  }
  if (node < 0 || node == st->tail) return GCAP_OK;
  if (!gc_growvector(st->wait, st->capwait, st->nwait + 1, 4))
    return gc_fail(e, GCAP_ENOMEM, "host backend: out of memory");
  st->wait[st->nwait++] = node;
  return GCAP_OK;
}

/* Note that node `to` follows node `from`. */
static int hb_edge_add(hb_rec *rec, int64_t from, int64_t to) {
  if (!gc_growvector(rec->edges, rec->capedges, rec->nedges + 1, 64)) return 0;
  rec->edges[rec->nedges].from = from;
  rec->edges[rec->nedges].to = to;
  rec->nedges++;
  return 1;
}

static gcap_status hb_copy(gcap_engine *e, void *bs, void *s, void *dst, const void *src,
                           size_t n) {
  (void)e, (void)bs, (void)s;
  memcpy(dst, src, n);
  return GCAP_OK;
}

/* Append a node to the capture st records into, after st's last node and
** the events st waited on; *nd is the new node, zeroed. */
static gcap_status hb_record(gcap_engine *e, hb_stream *st, hb_node **nd) {
  hb_rec *rec = st->rec;
  int i;
  if (!gc_growvector(rec->v, rec->cap, rec->n + 1, 64))
    return gc_fail(e, GCAP_ENOMEM, "host backend: out of memory recording a capture");
  if (st->tail >= 0 && !hb_edge_add(rec, st->tail, rec->n))
    return gc_fail(e, GCAP_ENOMEM, "host backend: out of memory recording a capture");
  for (i = 0; i < st->nwait; i++)
    if (!hb_edge_add(rec, st->wait[i], rec->n))
      return gc_fail(e, GCAP_ENOMEM, "host backend: out of memory recording a capture");
  st->nwait = 0;
  st->tail = rec->n;
  *nd = &rec->v[rec->n++];
  memset(*nd, 0, sizeof **nd);
  (*nd)->stream = st->idx;
  return GCAP_OK;
}

static gcap_status hb_launch(gcap_engine *e, void *bs, void *s, int k, const gc_kargs *a) {
  hb_stream *st = (hb_stream *)s;
  hk_fn fn = hk_kernel(k);
  gc_launch_info *info;
  hb_node *nd;
  gcap_status r;
  (void)bs;
  if (fn == NULL) return gc_fail(e, GCAP_EINVAL, "host backend: unknown kernel %d", k);
  if (st->rec == NULL) {
    fn(a);
    return GCAP_OK;
  }
  if ((info = (gc_launch_info *)gc_malloc(sizeof *info)) == NULL)
    return gc_fail(e, GCAP_ENOMEM, "host backend: out of memory recording a capture");
  if ((r = hb_record(e, st, &nd)) != GCAP_OK) {
    free(info);
    return r;
  }
  nd->k = k;
  nd->a = *a;
  gc_launch_describe(e, a, info);
  nd->info = info;
  return GCAP_OK;
}

/* Call custom op c's host reference on queue s (now, or at a replay). */
static gcap_status hb_custom_run(gcap_engine *e, void *s, const gc_custom *c, const char *when) {
  gcap_status st;
  if (c->host == NULL)
    return gc_fail(e, GCAP_EUNSUPPORTED, "custom op '%s' has no host callback", c->name);
  st = c->host(c->ud, s, c->nin, c->arg, c->nout, c->arg + c->nin);
  if (st != GCAP_OK)
    return gc_fail(e, st, "custom op '%s': its host callback failed%s (%s)", c->name, when,
                   gcap_status_str(st));
  return GCAP_OK;
}

/* Outside a capture the reference runs now; in one, a copy of c and its
** operands is recorded, to run at each replay. */
static gcap_status hb_custom(gcap_engine *e, void *bs, void *s, const gc_custom *c) {
  hb_stream *st = (hb_stream *)s;
  size_t nargs = (size_t)(c->nin + c->nout);
  gc_custom *copy;
  hb_node *nd;
  gcap_status r;
  (void)bs;
  if (st->rec == NULL || c->host == NULL) return hb_custom_run(e, s, c, "");
  copy = (gc_custom *)gc_malloc(sizeof *copy + nargs * sizeof c->arg[0]);
  if (copy == NULL)
    return gc_fail(e, GCAP_ENOMEM, "host backend: out of memory recording custom op '%s'", c->name);
  *copy = *c;
  copy->arg = (const gcap_custom_arg *)(copy + 1);
  memcpy(copy + 1, c->arg, nargs * sizeof c->arg[0]);
  if ((r = hb_record(e, st, &nd)) != GCAP_OK) {
    free(copy);
    return r;
  }
  nd->k = HB_CUSTOM;
  nd->c = copy;
  return GCAP_OK;
}

/* A collective runs at once, or is recorded with its descriptor. */
static gcap_status hb_collective(gcap_engine *e, void *bs, void *s, const gc_coll *c) {
  hb_stream *st = (hb_stream *)s;
  gc_coll *copy;
  hb_node *nd;
  gcap_status r;
  (void)bs;
  if (st->rec == NULL) return c->run(e, c);
  if ((copy = (gc_coll *)gc_malloc(sizeof *copy)) == NULL)
    return gc_fail(e, GCAP_ENOMEM, "host backend: out of memory recording a capture");
  if ((r = hb_record(e, st, &nd)) != GCAP_OK) {
    free(copy);
    return r;
  }
  *copy = *c;
  nd->k = HB_COLL;
  nd->coll = copy;
  return GCAP_OK;
}

/* No communicators: the collectives' own run functions do the transfers. */
static gcap_status hb_comm_id(gcap_engine *e, void *bs, unsigned char id[GC_COMM_ID_BYTES]) {
  (void)e, (void)bs;
  memset(id, 0, GC_COMM_ID_BYTES);
  return GCAP_OK;
}

static gcap_status hb_comm_new(gcap_engine *e, void *bs, const unsigned char id[GC_COMM_ID_BYTES],
                               int nranks, int rank, int local_rank, void **comm) {
  (void)e, (void)bs, (void)id, (void)nranks, (void)rank, (void)local_rank;
  *comm = NULL;
  return GCAP_OK;
}

static void hb_comm_free(void *bs, void *comm) {
  (void)bs, (void)comm;
}

static gcap_status hb_capture_begin(gcap_engine *e, void *bs, void *s) {
  hb_state *hs = (hb_state *)bs;
  hb_rec *rec = (hb_rec *)gc_calloc(1, sizeof(hb_rec));
  if (rec == NULL) return gc_fail(e, GCAP_ENOMEM, "host backend: out of memory");
  hb_join_rec((hb_stream *)s, rec, 0);
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
    hb_join_rec(rec->members[i], NULL, 0);
  free(rec->members);
  rec->members = NULL;
  rec->nmembers = rec->capmembers = 0;
  hb_join_rec((hb_stream *)s, NULL, 0);
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
  for (i = 0; i < rec->n; i++) {
    const hb_node *nd = &rec->v[i];
    gcap_status r = GCAP_OK;
    if (nd->coll != NULL)
      r = nd->coll->run(e, nd->coll);
    else if (nd->c != NULL)
      r = hb_custom_run(e, s, nd->c, " at replay");
    else
      hk_kernel(nd->k)(&nd->a);
    if (r != GCAP_OK) return r;
  }
  return GCAP_OK;
}

static void hb_graph_free(void *bs, void *graph, void *exec) {
  hb_rec *rec = (hb_rec *)(graph ? graph : exec);
  int64_t i;
  (void)bs;
  if (rec == NULL) return;
  for (i = 0; i < rec->n; i++) {
    free(rec->v[i].coll);
    free(rec->v[i].c);
    free(rec->v[i].info);
  }
  free(rec->v);
  free(rec->edges);
  free(rec);
}

/* Which pointer arguments each kernel writes (bit i: p[i]), as the
** catalogue in backend.h says; the others it reads. */
#define HB_WRITES(id, name, family, writes) [GC_K_##id] = writes,
static const unsigned hb_writes[GC_K_COUNT] = {GC_KERNELS(HB_WRITES)};
#undef HB_WRITES

/* Write s as the inside of a DOT string. */
static void hb_dot_escape(FILE *f, const char *s) {
  for (; *s; s++)
    if (*s == '"' || *s == '\\')
      fprintf(f, "\\%c", *s);
    else
      fputc(*s, f);
}

/* A pointer argument: whether it is read or written, the tensor it is
** (its shape; "" or NULL when unknown), and what memory it is. */
static void hb_dot_ptr(gcap_engine *e, FILE *f, const char *name, int write, const char *shape,
                       const void *p) {
  char where[160];
  fprintf(f, "%s %s%s%s: ", write ? "writes" : "reads ", name, shape && *shape ? " " : "",
          shape ? shape : "");
  hb_dot_escape(f, gc_describe_ptr(e, p, where, sizeof where));
  fputs("\\l", f);
}

/* A collective's node: its kind, count, the peer or root it names, and its buffers. */
static void hb_dot_coll(gcap_engine *e, FILE *f, const gc_coll *c) {
  if (c->kind == GC_COLL_ALL_REDUCE || c->kind == GC_COLL_REDUCE_SCATTER)
    fprintf(f, "op: %s\\l", gc_red_name(c->red));
  fprintf(f, "count: %lld\\l", (long long)c->count);
  if (c->kind >= GC_COLL_BROADCAST) fprintf(f, "peer: %d\\l", c->peer);
  if (c->kind != GC_COLL_RECV) hb_dot_ptr(e, f, "src", 0, NULL, c->src);
  if (c->kind != GC_COLL_SEND && c->dst != c->src) hb_dot_ptr(e, f, "dst", 1, NULL, c->dst);
}

/* A custom op's operands, each with its shape and dtype. */
static void hb_dot_custom(gcap_engine *e, FILE *f, const gc_custom *c) {
  int j, d;
  for (j = 0; j < c->nin + c->nout; j++) {
    const gcap_custom_arg *a = &c->arg[j];
    char name[16], shape[64];
    size_t len = 0;
    int out = j >= c->nin;
    snprintf(name, sizeof name, "%s%d", out ? "out" : "in", out ? j - c->nin : j);
    len += (size_t)snprintf(shape, sizeof shape, "[");
    for (d = 0; d < a->ndim && len < sizeof shape; d++)
      len += (size_t)snprintf(shape + len, sizeof shape - len, "%s%lld", d ? ", " : "",
                              (long long)a->shape[d]);
    if (len < sizeof shape)
      snprintf(shape + len, sizeof shape - len, "] %s", a->dtype == GCAP_BF16 ? "bf16" : "f32");
    hb_dot_ptr(e, f, name, out, shape, a->data);
  }
}

/* A kernel's constants (up to the last non-zero): its sizes only when no
** pointer argument names a tensor (the tensors' shapes say them). */
static void hb_dot_consts(FILE *f, const hb_node *nd) {
  int j, last, named = 0;
  for (j = 0; nd->info != NULL && j < GC_KPTRS; j++)
    named |= nd->info->arg[j][0] != '\0';
  for (last = GC_KINTS - 1; !named && last >= 0 && nd->a.n[last] == 0; last--)
    ;
  if (!named && last >= 0) fputs("n:", f);
  for (j = 0; !named && j <= last; j++)
    fprintf(f, " %lld%s", (long long)nd->a.n[j], j == last ? "\\l" : "");
  for (last = GC_KFLOATS - 1; last >= 0 && nd->a.f[last] == 0.0f; last--)
    ;
  if (last >= 0) fputs("f:", f);
  for (j = 0; j <= last; j++)
    fprintf(f, " %g%s", (double)nd->a.f[j], j == last ? "\\l" : "");
}

/* One node: its kernel and what launched it where (the op, the module or
** the node of a backward), its constants, and each pointer it reads or
** writes with the tensor it is. */
static void hb_dot_node(gcap_engine *e, FILE *f, int64_t i, const hb_node *nd) {
  int j;
  fprintf(f, "  n%lld [label=\"#%lld ", (long long)i, (long long)i);
  if (nd->c) {
    fputs("custom ", f);
    hb_dot_escape(f, nd->c->name);
  } else
    fputs(nd->coll ? gc_coll_name(nd->coll->kind) : gc_kernel_name(nd->k), f);
  if (nd->stream > 0) fprintf(f, " (stream %d)", nd->stream);
  fputs("\\n", f); /* the head lines centred, the others left-aligned (\l ends each) */
  if (nd->info != NULL && nd->info->what[0] != '\0' &&
      strcmp(nd->info->what, gc_kernel_name(nd->k)) != 0) { /* an op of another name */
    hb_dot_escape(f, nd->info->what);
    fputs("\\n", f);
  }
  if (nd->coll) {
    hb_dot_coll(e, f, nd->coll);
    fputs("\", shape=hexagon];\n", f);
    return;
  }
  if (nd->c) hb_dot_custom(e, f, nd->c);
  hb_dot_consts(f, nd);
  for (j = 0; j < GC_KPTRS; j++) {
    char name[16];
    if (nd->a.p[j] == NULL) continue;
    snprintf(name, sizeof name, "p%d", j);
    hb_dot_ptr(e, f, name, hb_writes[nd->k] >> j & 1, nd->info ? nd->info->arg[j] : NULL,
               nd->a.p[j]);
  }
  fprintf(f, "\"%s];\n", nd->stream > 0 ? ", style=filled, fillcolor=lightyellow" : "");
}

static gcap_status hb_debug_dump(gcap_engine *e, void *bs, void *graph, const char *name,
                                 const char *path) {
  const hb_rec *rec = (const hb_rec *)graph;
  FILE *f = fopen(path, "w");
  int64_t i;
  int bad;
  (void)bs;
  if (f == NULL) return gc_fail(e, GCAP_EINVAL, "cannot write '%s': %s", path, strerror(errno));
  fputs("digraph graphcap {\n  labelloc=t;\n  label=\"", f);
  hb_dot_escape(f, name);
  fprintf(f,
          " (host, %lld nodes)\";\n"
          "  node [shape=box, fontname=\"monospace\", fontsize=10];\n",
          (long long)rec->n);
  for (i = 0; i < rec->n; i++)
    hb_dot_node(e, f, i, &rec->v[i]);
  for (i = 0; i < rec->nedges; i++) {
    const hb_edge *d = &rec->edges[i];
    fprintf(f, "  n%lld -> n%lld%s;\n", (long long)d->from, (long long)d->to,
            rec->v[d->from].stream != rec->v[d->to].stream ? " [style=dashed]" : "");
  }
  fputs("}\n", f);
  bad = ferror(f);
  bad |= fclose(f) != 0;
  if (bad) return gc_fail(e, GCAP_EINVAL, "writing '%s' failed: %s", path, strerror(errno));
  return GCAP_OK;
}

static gcap_status hb_event_sync(gcap_engine *e, void *bs, void *ev) {
  (void)e, (void)bs, (void)ev;
  return GCAP_OK;
}

/* No library attention: the host runs the composition, the reference the
** other backends are compared with. */
static int hb_attn_supported(void *bs, const gc_kargs *a, int backward, int capturing, char *why,
                             size_t n) {
  (void)bs, (void)a, (void)backward, (void)capturing;
  snprintf(why, n, "the host backend has no cuDNN (it runs the composition, the reference)");
  return 0;
}

/* The host emulates FP8 exactly: it is the reference. */
static int hb_fp8_supported(void *bs, char *why, size_t n) {
  (void)bs;
  if (n > 0) why[0] = '\0';
  return 1;
}

/* In gc_backend's field order. No event_record_external (a replay runs at
** once, so event_record serves) and no ranges (the trace shows the spans). */
static const gc_backend hb_backend = {
    "host",            /* name */
    hb_init,           /* init */
    hb_shutdown,       /* shutdown */
    hb_malloc,         /* malloc */
    hb_free,           /* free */
    hb_mapped_alloc,   /* mapped_alloc */
    hb_free,           /* mapped_free */
    hb_stream_new,     /* stream_new */
    hb_stream_free,    /* stream_free */
    hb_sync,           /* stream_sync */
    hb_device_sync,    /* device_sync */
    hb_event_new,      /* event_new */
    hb_event_free,     /* event_free */
    hb_event_record,   /* event_record */
    hb_stream_wait,    /* stream_wait */
    hb_event_sync,     /* event_sync */
    hb_copy,           /* upload */
    hb_copy,           /* download */
    hb_launch,         /* launch */
    hb_custom,         /* custom */
    hb_capture_begin,  /* capture_begin */
    hb_capture_end,    /* capture_end */
    hb_instantiate,    /* instantiate */
    hb_graph_launch,   /* graph_launch */
    hb_graph_free,     /* graph_free */
    hb_debug_dump,     /* debug_dump */
    hb_comm_id,        /* comm_id */
    hb_comm_new,       /* comm_new */
    hb_comm_free,      /* comm_free */
    hb_collective,     /* collective */
    hb_attn_supported, /* attn_supported */
    hb_fp8_supported,  /* fp8_supported */
    NULL,              /* event_record_external */
    NULL,              /* ranges */
    NULL,              /* range_push */
    NULL,              /* range_pop */
};

const gc_backend *gc_host_backend(void) {
  return &hb_backend;
}
