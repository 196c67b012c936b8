/*
** engine.c: engine lifecycle, capture-rule checks shared by every file, and
** destruction deferred past an open capture (the messages are error.c's).
*/
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime.h"

static _Atomic long long live_engines; /* built and not yet destroyed */

const char *gcap_version(void) {
  return GCAP_VERSION;
}

double gc_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

int gcap_cuda_available(void) {
  return gc_cuda_backend() != NULL && gc_cuda_probe();
}

static gcap_status eng_seed(gcap_engine *e, uint64_t seed) {
  uint64_t st[2] = {seed, 0};
  return e->be->upload(e, e->bs, e->current->bs, e->rng->ptr, st, sizeof st);
}

gcap_status gcap_engine_new(gcap_device dev, gcap_engine **out) {
  const gc_backend *be = NULL;
  gcap_engine *e;
  gcap_status st;
  if (out == NULL) return gc_fail(NULL, GCAP_EINVAL, "gcap_engine_new: out is NULL");
  *out = NULL;
  gc_set_open_error(NULL);
  switch (dev) {
    case GCAP_DEVICE_DEFAULT:
      be = gcap_cuda_available() ? gc_cuda_backend() : gc_host_backend();
      break;
    case GCAP_DEVICE_HOST:
      be = gc_host_backend();
      break;
    case GCAP_DEVICE_CUDA:
      if (gc_cuda_backend() == NULL)
        return gc_fail(NULL, GCAP_EUNSUPPORTED,
                       "device 'cuda': this build has no cuda backend (built with CUDA=0)");
      if (!gc_cuda_probe())
        return gc_fail(NULL, GCAP_EUNSUPPORTED, "device 'cuda': no CUDA GPU is visible");
      be = gc_cuda_backend();
      break;
    default:
      return gc_fail(NULL, GCAP_EINVAL, "gcap_engine_new: unknown device %d", (int)dev);
  }
  e = (gcap_engine *)gc_calloc(1, sizeof *e);
  if (e == NULL) return gc_fail(NULL, GCAP_ENOMEM, "gcap_engine_new: out of host memory");
  e->be = be;
  e->refs = 1;
  e->replay_check = 1;
  e->grad_enabled = 1;
  e->module_gen = 1;
  live_engines++;
  if ((st = be->init(e, &e->bs)) != GCAP_OK) goto fail;
  e->ranges = be->ranges != NULL && be->ranges(e->bs);
  if ((e->heap = gc_pool_create(e, 1)) == NULL) {
    st = gc_fail(e, GCAP_ENOMEM, "gcap_engine_new: out of host memory");
    goto fail;
  }
  if ((st = gc_stream_create(e, 1, &e->default_stream)) != GCAP_OK) goto fail;
  if ((st = gc_stream_create(e, 1, &e->capture_stream)) != GCAP_OK) goto fail;
  e->current = e->default_stream;
  if ((st = gc_generator_create(e, 0, "gcap_engine_new", &e->gen0)) != GCAP_OK) goto fail;
  e->gen = gcap_generator_retain(e->gen0);
  e->rng = e->gen->blk;
  if ((st = gc_badid_init(e)) != GCAP_OK) goto fail;
  *out = e;
  return GCAP_OK;
fail:
  gc_set_open_error(e->err);
  e->refs = 0;
  gc_engine_unref(e); /* refs 0 -> destroy what was built */
  return st;
}

static void eng_destroy(gcap_engine *e) {
  if (e->gen0) gc_generator_destroy(e->gen0); /* the last one: the others held e */
  if (e->bs) gc_badid_free(e);
  e->default_stream = NULL; /* the memory goes too: no retagging of blocks */
  while (e->streams)
    gc_stream_destroy(e->streams);
  if (e->heap) gc_pool_destroy(e->heap);
  if (e->bs) e->be->shutdown(e->bs);
  free(e->graphs);
  free(e->free_slots);
  free(e->dead_ptrs);
  free(e->undo);
  free(e);
  live_engines--;
}

void gc_engine_ref(gcap_engine *e) {
  e->refs++;
}

void gc_engine_unref(gcap_engine *e) {
  if (--e->refs <= 0) eng_destroy(e);
}

void gcap_engine_free(gcap_engine *e) {
  if (e == NULL || e->closed) return;
  gcap_trace_stop(e);
  gcap_set_generator(e, NULL); /* a generator in use no longer holds e through it */
  e->closed = 1;
  gc_engine_unref(e);
}

const char *gcap_engine_device(const gcap_engine *e) {
  return e ? e->be->name : "";
}

int gcap_is_capturing(const gcap_engine *e) {
  return e != NULL && e->cap != NULL;
}

int gcap_is_graph_capturing(const gcap_engine *e) {
  return e != NULL && e->graphing > 0;
}

void gcap_set_replay_check(gcap_engine *e, int on) {
  if (e) e->replay_check = on != 0;
}

gcap_status gc_capture_refuse(gcap_engine *e, const char *fmt, ...) {
  va_list ap;
  char msg[GC_ERRLEN];
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (e->cap && !e->cap->invalid) {
    e->cap->invalid = 1;
    snprintf(e->cap->why, sizeof e->cap->why, "%s", msg);
  }
  return gc_fail(e, GCAP_ECAPTURE, "%s (the capture is invalidated)", msg);
}

gcap_status gc_check_not_capturing(gcap_engine *e, const char *what) {
  if (e->cap == NULL) return GCAP_OK;
  return gc_capture_refuse(e, "%s is not allowed while a capture is open", what);
}

const gcap_graph *gc_graph_of(const gcap_engine *e, gc_gid id) {
  int k;
  for (k = 0; k < e->graphs_cap; k++)
    if (e->graphs[k] != NULL && e->graphs[k]->id == id) return e->graphs[k];
  return NULL;
}

gcap_status gc_check_open(gcap_engine *e, const char *what) {
  gc_clear(e);
  if (e->closed)
    return gc_fail(e, GCAP_ESTATE, "%s: the engine is closed (its objects can only be freed)",
                   what);
  return GCAP_OK;
}

gcap_status gc_check_stream(gcap_engine *e, gcap_stream *s, const char *what) {
  if (e->closed)
    return gc_fail(e, GCAP_ESTATE, "%s: the engine is closed (its objects can only be freed)",
                   what);
  if (e->cap == NULL) return GCAP_OK;
  if (e->cap->invalid)
    return gc_fail(e, GCAP_ECAPTURE, "%s: the open capture was invalidated earlier: %s", what,
                   e->cap->why);
  if (!s->in_capture)
    return gc_capture_refuse(e,
                             "%s on a stream that is not part of the open capture (fork it in by "
                             "waiting on an event recorded in the capture)",
                             what);
  return GCAP_OK;
}

gcap_status gcap_synchronize(gcap_engine *e) {
  gcap_status st;
  if (e == NULL) return GCAP_EINVAL;
  gc_clear(e);
  if ((st = gc_check_not_capturing(e, "synchronize")) != GCAP_OK ||
      (st = e->be->device_sync(e, e->bs)) != GCAP_OK)
    return st;
  return gc_badid_check(e);
}

gcap_status gcap_manual_seed(gcap_engine *e, uint64_t seed) {
  gcap_status st;
  if (e == NULL) return GCAP_EINVAL;
  gc_clear(e);
  if ((st = gc_check_not_capturing(e, "manual_seed (a host-to-device copy)")) != GCAP_OK) return st;
  return eng_seed(e, seed);
}

gcap_status gcap_engine_mem_stats(gcap_engine *e, gcap_mem_stats *out) {
  if (e == NULL) return GCAP_EINVAL;
  gc_clear(e);
  if (out == NULL) return gc_null(e, "engine_mem_stats", "out");
  gc_pool_stats_of(e->heap, out);
  return GCAP_OK;
}

gcap_status gcap_engine_reset_peak(gcap_engine *e) {
  if (e == NULL) return GCAP_EINVAL;
  gc_clear(e);
  e->heap->peak = e->heap->in_use;
  return GCAP_OK;
}

gcap_status gcap_engine_get_stats(gcap_engine *e, gcap_engine_stats *out) {
  const gcap_pool *p;
  if (e == NULL) return GCAP_EINVAL;
  gc_clear(e);
  if (out == NULL) return gc_null(e, "engine_get_stats", "out");
  memset(out, 0, sizeof *out);
  out->objects = e->refs - !e->closed;
  for (p = e->pools; p != NULL; p = p->next) {
    out->blocks += p->blocks + p->weak;
    out->in_use_bytes += p->in_use;
    if (!p->is_heap) out->pool_reserved_bytes += p->reserved;
  }
  out->blocks--; /* the default generator's state */
  out->in_use_bytes -= e->gen0->blk->size;
  return GCAP_OK;
}

int64_t gcap_live_engines(void) {
  return live_engines;
}

void gc_raw_free(gcap_engine *e, void *p) {
  if (e->cap == NULL) {
    e->be->free(e->bs, p);
    return;
  }
  if (!gc_growvector(e->dead_ptrs, e->capdead_ptrs, e->ndead_ptrs + 1, 16))
    return; /* leak rather than free inside a capture */
  e->dead_ptrs[e->ndead_ptrs++] = p;
}

void gc_run_deferred(gcap_engine *e) {
  gc_engine_ref(e); /* the last deferred object may hold the last reference */
  while (e->dead_graphs) {
    gcap_graph *g = e->dead_graphs;
    e->dead_graphs = g->next_dead;
    gc_graph_destroy(g);
  }
  while (e->dead_pools) {
    gcap_pool *p = e->dead_pools;
    e->dead_pools = p->next_dead;
    p->next_dead = NULL;
    gc_pool_maybe_release(p);
  }
  {
    gcap_stream *s = e->streams, *next;
    for (; s != NULL; s = next) { /* streams freed during the capture */
      next = s->next;
      if (s->dead) {
        gc_stream_destroy(s);
        gc_engine_unref(e);
      }
    }
  }
  while (e->ndead_ptrs > 0)
    e->be->free(e->bs, e->dead_ptrs[--e->ndead_ptrs]);
  gc_engine_unref(e);
}
