/*
** alloc.c: the caching allocator (PyTorch's model). Memory comes from the
** backend in segments and is split into blocks; freed blocks go back to their
** pool's free list, never to the device, and are reused on the same stream.
** A private pool (graph_pool_handle) is the same structure with its own
** segments: during a capture every allocation comes from the capture's pool,
** and a block freed in capture is reusable at once by later allocations of the
** same capture and of later captures sharing the pool. A pool's segments go
** back to the device only when no handle, graph or block holds it.
**
** The interval map at the end records, per pool, which graph last wrote each
** byte range: the replay-order check of capture.c reads it.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

#define ALLOC_ROUND 512              /* block sizes: multiples of 512 (256-aligned) */
#define ALLOC_SMALL (1u << 20)       /* requests up to 1 MiB share ... */
#define ALLOC_SMALL_SEG (2u << 20)   /* ... 2 MiB segments */
#define ALLOC_LARGE_ROUND (2u << 20) /* larger ones get whole 2 MiB multiples */

gcap_pool *gc_pool_create(gcap_engine *e, int is_heap) {
  gcap_pool *p = (gcap_pool *)gc_calloc(1, sizeof *p);
  if (p == NULL) return NULL;
  p->e = e;
  p->is_heap = is_heap;
  p->next = e->pools;
  if (e->pools) e->pools->prev = p;
  e->pools = p;
  return p;
}

static void fl_push(gcap_pool *p, gc_blk *b) {
  b->fprev = NULL;
  b->fnext = p->freelist;
  if (p->freelist) p->freelist->fprev = b;
  p->freelist = b;
}

static void fl_remove(gcap_pool *p, gc_blk *b) {
  if (b->fprev)
    b->fprev->fnext = b->fnext;
  else
    p->freelist = b->fnext;
  if (b->fnext) b->fnext->fprev = b->fprev;
  b->fprev = b->fnext = NULL;
}

static gcap_status pool_grow(gcap_pool *p, gcap_stream *s, size_t n, const char *op, gc_blk **out) {
  gcap_engine *e = p->e;
  size_t segsize = n <= ALLOC_SMALL
                       ? ALLOC_SMALL_SEG
                       : (n + ALLOC_LARGE_ROUND - 1) / ALLOC_LARGE_ROUND * ALLOC_LARGE_ROUND;
  gc_seg *seg = (gc_seg *)gc_calloc(1, sizeof *seg);
  gc_blk *b = (gc_blk *)gc_calloc(1, sizeof *b);
  void *mem = NULL;
  gcap_status st;
  if (seg == NULL || b == NULL) {
    free(seg);
    free(b);
    return gc_fail(e, GCAP_ENOMEM, "%s: out of host memory", op);
  }
  if ((st = e->be->malloc(e, e->bs, segsize, &mem)) != GCAP_OK) {
    gcap_mem_stats ms;
    char why[GC_ERRLEN]; /* the backend's reason */
    snprintf(why, sizeof why, "%s", e->err);
    gc_pool_stats_of(p, &ms);
    free(seg);
    free(b);
    return gc_fail(e, st,
                   "%s: %s [asking for %zu bytes; %s: reserved %zu, in use %zu, peak %zu, "
                   "blocks %lld]",
                   op, why, segsize, p->is_heap ? "ordinary allocator" : "pool", ms.reserved_bytes,
                   ms.in_use_bytes, ms.peak_bytes, (long long)ms.blocks);
  }
  seg->base = (char *)mem;
  seg->size = segsize;
  seg->next = p->segs;
  p->segs = seg;
  p->reserved += segsize;
  b->ptr = seg->base;
  b->size = segsize;
  b->pool = p;
  b->stream = s;
  b->seg = seg;
  seg->first = b;
  fl_push(p, b);
  *out = b;
  return GCAP_OK;
}

gcap_status gc_pool_alloc(gcap_pool *p, gcap_stream *s, size_t n, const char *op, gc_blk **out) {
  gc_blk *b, *best = NULL;
  n = n == 0 ? ALLOC_ROUND : (n + ALLOC_ROUND - 1) / ALLOC_ROUND * ALLOC_ROUND;
  for (b = p->freelist; b != NULL; b = b->fnext) /* best fit on this stream */
    if (b->stream == s && b->size >= n && (best == NULL || b->size < best->size)) best = b;
  if (best == NULL) {
    gcap_status st = pool_grow(p, s, n, op, &best);
    if (st != GCAP_OK) return st;
  }
  fl_remove(p, best);
  best->seg->trim = 0;                 /* in use again: it follows the pool's own life */
  if (best->size - n >= ALLOC_ROUND) { /* split off the tail as a free block */
    gc_blk *rest = (gc_blk *)gc_calloc(1, sizeof *rest);
    if (rest != NULL) {
      rest->ptr = best->ptr + n;
      rest->size = best->size - n;
      rest->pool = p;
      rest->stream = s;
      rest->seg = best->seg;
      rest->prev = best;
      rest->next = best->next;
      if (best->next) best->next->prev = rest;
      best->next = rest;
      best->size = n;
      fl_push(p, rest);
    }
  }
  best->refs = 1;
  best->stream = s;
  p->in_use += best->size;
  if (p->in_use > p->peak) p->peak = p->in_use;
  p->blocks++;
  *out = best;
  return GCAP_OK;
}

void gc_blk_retain(gc_blk *b) {
  b->refs++;
}

/* Merge b with its free neighbour `n` (n follows b in the segment). */
static void blk_merge_next(gcap_pool *p, gc_blk *b) {
  gc_blk *n = b->next;
  fl_remove(p, n);
  b->size += n->size;
  b->next = n->next;
  if (n->next) n->next->prev = b;
  free(n);
}

/* Give seg (entirely free: one free block) back to the device. */
static void seg_release(gcap_pool *p, gc_seg *seg) {
  gc_seg **link = &p->segs;
  while (*link != seg)
    link = &(*link)->next;
  *link = seg->next;
  fl_remove(p, seg->first);
  free(seg->first);
  p->reserved -= seg->size;
  gc_raw_free(p->e, seg->base);
  free(seg);
}

/* Release the segments flagged trim that are entirely free; not while a
** weak reference may still point into one. */
static void pool_trim(gcap_pool *p) {
  gc_seg *seg = p->segs, *next;
  if (p->weak > 0) return;
  for (; seg != NULL; seg = next) {
    next = seg->next;
    if (seg->trim && seg->first->refs == 0 && seg->first->next == NULL) seg_release(p, seg);
  }
}

void gc_blk_release(gc_blk *b) {
  gcap_pool *p;
  gc_seg *seg;
  if (b == NULL || --b->refs > 0) return;
  if (b->weak) { /* its memory was given back already; the pool may go now */
    p = b->pool;
    free(b);
    if (--p->weak == 0) pool_trim(p);
    gc_pool_maybe_release(p);
    return;
  }
  p = b->pool;
  seg = b->seg; /* b may merge away below */
  p->in_use -= b->size;
  p->blocks--;
  if (b->next && b->next->refs == 0 && b->next->stream == b->stream) blk_merge_next(p, b);
  if (b->prev && b->prev->refs == 0 && b->prev->stream == b->stream) {
    gc_blk *prev = b->prev;
    fl_push(p, b);
    blk_merge_next(p, prev);
  } else {
    fl_push(p, b);
  }
  if (seg->trim && p->weak == 0 && seg->first->refs == 0 && seg->first->next == NULL)
    seg_release(p, seg);
  gc_pool_maybe_release(p);
}

void gc_pool_maybe_release(gcap_pool *p) {
  gcap_engine *e = p->e;
  if (p->is_heap || p->handles > 0 || p->graphs > 0 || p->blocks > 0 || p->weak > 0) return;
  if (e->cap != NULL) { /* no device frees inside a capture: later */
    gcap_pool *q;
    for (q = e->dead_pools; q != NULL; q = q->next_dead)
      if (q == p) return;
    p->next_dead = e->dead_pools;
    e->dead_pools = p;
    return;
  }
  gc_pool_destroy(p);
  gc_engine_unref(e);
}

void gc_pool_destroy(gcap_pool *p) {
  gcap_engine *e = p->e;
  while (p->freelist) {
    gc_blk *b = p->freelist;
    fl_remove(p, b);
    free(b);
  }
  /* blocks still in use (only at engine teardown) are leaked as structs but
  ** their memory goes back with the segments */
  while (p->segs) {
    gc_seg *s = p->segs;
    p->segs = s->next;
    gc_raw_free(e, s->base);
    free(s);
  }
  gc_ivmap_free(&p->writers);
  gc_ivmap_free(&p->cap_writers);
  if (p->prev)
    p->prev->next = p->next;
  else
    e->pools = p->next;
  if (p->next) p->next->prev = p->prev;
  free(p);
}

void gc_pools_retag(gcap_engine *e, const gcap_stream *s, gcap_stream *to) {
  gcap_pool *p;
  for (p = e->pools; p != NULL; p = p->next) {
    gc_seg *seg;
    for (seg = p->segs; seg != NULL; seg = seg->next) {
      gc_blk *b;
      int had = 0;
      for (b = seg->first; b != NULL; b = b->next)
        if (b->stream == s) b->stream = to, had = 1;
      for (b = seg->first; b != NULL; b = b->next) /* neighbours free on one stream now merge */
        while (b->refs == 0 && b->next && b->next->refs == 0 && b->next->stream == b->stream)
          blk_merge_next(p, b);
      /* ordinary memory a stream leaves goes back once entirely free (now, or
      ** when its last tensor goes): streams come and go (a warmup's), their
      ** caches must not pile up */
      if (had && p->is_heap) seg->trim = 1;
    }
    pool_trim(p);
  }
}

void gc_pool_trim_since(gcap_pool *p, const gc_seg *since) {
  gc_seg *s;
  for (s = p->segs; s != NULL && s != since; s = s->next)
    s->trim = 1;
  pool_trim(p);
}

const char *gc_describe_ptr(gcap_engine *e, const void *ptr, char *buf, size_t n) {
  const char *c = (const char *)ptr;
  const gcap_pool *p;
  const gc_seg *s;
  const gc_blk *b;
  for (p = e->pools; p != NULL; p = p->next)
    for (s = p->segs; s != NULL; s = s->next) {
      if (c < s->base || c >= s->base + s->size) continue;
      for (b = s->first; b != NULL && b->ptr + b->size <= c; b = b->next)
        ;
      if (b != NULL)
        snprintf(buf, n, "%s block %p + %zu of %zu B", p->is_heap ? "heap" : "pool", (void *)b->ptr,
                 (size_t)(c - b->ptr), b->size);
      else
        snprintf(buf, n, "%s segment %p + %zu", p->is_heap ? "heap" : "pool", (void *)s->base,
                 (size_t)(c - s->base));
      return buf;
    }
  snprintf(buf, n, "%p (not engine memory)", ptr);
  return buf;
}

void gc_pool_stats_of(const gcap_pool *p, gcap_mem_stats *out) {
  out->reserved_bytes = p->reserved;
  out->in_use_bytes = p->in_use;
  out->peak_bytes = p->peak;
  out->blocks = p->blocks;
  out->graphs = p->graphs;
}

/* ------------------------------------------------------------------------ */
/* Public pool handles                                                       */

gcap_status gcap_pool_new(gcap_engine *e, gcap_pool **out) {
  gcap_pool *p;
  gcap_status st;
  if (out != NULL) *out = NULL;
  if (e == NULL) return GCAP_EINVAL;
  if ((st = gc_check_open(e, "graph_pool_handle")) != GCAP_OK) return st;
  if (out == NULL) return gc_null(e, "graph_pool_handle", "out");
  if ((p = gc_pool_create(e, 0)) == NULL)
    return gc_fail(e, GCAP_ENOMEM, "graph_pool_handle: out of host memory");
  p->handles = 1;
  gc_engine_ref(e);
  *out = p;
  return GCAP_OK;
}

gcap_pool *gcap_pool_retain(gcap_pool *p) {
  if (p) p->handles++;
  return p;
}

void gcap_pool_free(gcap_pool *p) {
  if (p == NULL || p->handles <= 0) return;
  p->handles--;
  gc_pool_maybe_release(p);
}

gcap_status gcap_pool_get_stats(gcap_pool *p, gcap_mem_stats *out) {
  if (p == NULL) return GCAP_EINVAL;
  gc_clear(p->e);
  if (out == NULL) return gc_null(p->e, "pool_get_stats", "out");
  gc_pool_stats_of(p, out);
  return GCAP_OK;
}

/* ------------------------------------------------------------------------ */
/* Interval map: last writer per byte range                                  */

/* Index of the first interval with hi > x. */
static int iv_lower(const gc_ivmap *m, uintptr_t x) {
  int lo = 0, hi = m->n;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (m->v[mid].hi <= x)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

static int iv_reserve(gc_ivmap *m, int extra) {
  return gc_growvector(m->v, m->cap, m->n + extra, 16);
}

/* A set adds at most two intervals and asks for room for three. */
int gc_ivmap_reserve(gc_ivmap *m, int n) {
  return iv_reserve(m, 2 * n + 1);
}

void gc_ivmap_set(gc_ivmap *m, uintptr_t lo, uintptr_t hi, gc_gid writer) {
  int i, j, nkeep = 0;
  gc_ivl left = {0, 0, 0}, right = {0, 0, 0};
  int hasl = 0, hasr = 0;
  if (lo >= hi) return;
  i = iv_lower(m, lo);
  if (i < m->n && m->v[i].lo == lo && m->v[i].hi == hi) { /* a replay's own range again */
    m->v[i].writer = writer;
    return;
  }
  if (!iv_reserve(m, 3)) return;
  j = i;
  while (j < m->n && m->v[j].lo < hi)
    j++; /* [i, j) overlap [lo, hi) */
  if (i < j && m->v[i].lo < lo) {
    left = m->v[i];
    left.hi = lo;
    hasl = 1;
  }
  if (i < j && m->v[j - 1].hi > hi) {
    right = m->v[j - 1];
    right.lo = hi;
    hasr = 1;
  }
  nkeep = hasl + 1 + hasr;
  if (nkeep != j - i) { /* ranges replaced by as many move nothing */
    memmove(m->v + i + nkeep, m->v + j, (size_t)(m->n - j) * sizeof *m->v);
    m->n += nkeep - (j - i);
  }
  if (hasl) m->v[i++] = left;
  m->v[i].lo = lo;
  m->v[i].hi = hi;
  m->v[i].writer = writer;
  if (hasr) m->v[i + 1] = right;
}

int gc_ivmap_each(const gc_ivmap *m, uintptr_t lo, uintptr_t hi,
                  int (*fn)(void *ud, uintptr_t lo, uintptr_t hi, gc_gid writer), void *ud) {
  int i = iv_lower(m, lo), r;
  uintptr_t at = lo;
  for (; at < hi; i++) {
    if (i >= m->n || m->v[i].lo >= hi) return fn(ud, at, hi, GC_WRITER_OUTSIDE);
    if (m->v[i].lo > at) {
      if ((r = fn(ud, at, m->v[i].lo, GC_WRITER_OUTSIDE)) != 0) return r;
      at = m->v[i].lo;
    }
    {
      uintptr_t end = m->v[i].hi < hi ? m->v[i].hi : hi;
      if ((r = fn(ud, at, end, m->v[i].writer)) != 0) return r;
      at = end;
    }
  }
  return 0;
}

void gc_ivmap_free(gc_ivmap *m) {
  free(m->v);
  m->v = NULL;
  m->n = m->cap = 0;
}
