/*
** graphcap.h: the public C API of the graphcap engine.
**
** Conventions (SQLite's): every fallible call returns a gcap_status and hands
** objects back through a last `**out` argument (set to NULL on failure); the
** text of the last error is gcap_errmsg(engine); destructors accept NULL.
** The library never prints, exits or aborts on a user or device error.
** No Lua and no CUDA types appear here.
**
** One engine drives one device through one backend ("host" or "cuda").
** Objects (tensors, streams, events, pools, graphs) belong to one engine and
** keep it alive: gcap_engine_free with live objects only marks the engine
** closed, and it is freed when the last object goes.
*/
#ifndef GRAPHCAP_H
#define GRAPHCAP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GCAP_VERSION "0.1.0"
#define GCAP_MAXDIM 4 /* tensors have 0 to 4 dimensions */

typedef struct gcap_engine gcap_engine;
typedef struct gcap_tensor gcap_tensor;
typedef struct gcap_stream gcap_stream;
typedef struct gcap_event gcap_event;
typedef struct gcap_pool gcap_pool;
typedef struct gcap_graph gcap_graph;

typedef enum gcap_status {
  GCAP_OK = 0,
  GCAP_EINVAL,       /* bad argument: shape, dtype, range, NULL, another engine */
  GCAP_ENOMEM,       /* host or device memory exhausted */
  GCAP_EDEVICE,      /* the device or its runtime failed */
  GCAP_ECAPTURE,     /* forbidden while a capture is open; the capture is invalidated */
  GCAP_ESTATE,       /* wrong state: closed, reset, not captured, capture open */
  GCAP_EREPLAY,      /* replay refused: it would read memory another graph overwrote */
  GCAP_EUNSUPPORTED, /* backend not built, or no such device */
  GCAP_EABORTED      /* a callback asked to stop */
} gcap_status;

typedef enum gcap_device {
  GCAP_DEVICE_DEFAULT = 0, /* cuda when a GPU is present, host otherwise */
  GCAP_DEVICE_HOST,
  GCAP_DEVICE_CUDA
} gcap_device;

typedef enum gcap_dtype { GCAP_F32 = 0, GCAP_BF16 } gcap_dtype;

/* ------------------------------------------------------------------------ */
/* Library and engine                                                        */

/* The version string, GCAP_VERSION. */
const char *gcap_version(void);

/* A static, human-readable name for a status ("invalid argument", ...). */
const char *gcap_status_str(gcap_status st);

/* 1 when the library was built with the cuda backend and a GPU is visible. */
int gcap_cuda_available(void);

/* Create an engine on `dev`. GCAP_DEVICE_CUDA without a GPU (or without the
** cuda backend built in) is GCAP_EUNSUPPORTED; there is then no engine to ask,
** so the reason is in gcap_last_open_error(). */
gcap_status gcap_engine_new(gcap_device dev, gcap_engine **out);

/* The reason the last gcap_engine_new of this thread failed ("" if none). */
const char *gcap_last_open_error(void);

/* Release the caller's reference. NULL is fine. The engine lives on, closed
** to new work, until its last tensor, stream, event, pool and graph is freed. */
void gcap_engine_free(gcap_engine *e);

/* Text of the engine's last error; owned by the engine, valid until its next
** call. "" when the last call succeeded or set no message. NULL-safe. */
const char *gcap_errmsg(const gcap_engine *e);

/* "host" or "cuda". */
const char *gcap_engine_device(const gcap_engine *e);

/* Wait until all work queued on every stream has finished. Refused while a
** capture is open (GCAP_ECAPTURE, capture invalidated). */
gcap_status gcap_synchronize(gcap_engine *e);

/* 1 while a capture is open on this engine, 0 otherwise. */
int gcap_is_capturing(const gcap_engine *e);

/* Turn the shared-pool replay-order check on (default) or off. */
void gcap_set_replay_check(gcap_engine *e, int on);

/* Seed the engine's random generator (its seed and offset live in device
** memory; the offset is reset to 0). Allowed outside capture only. */
gcap_status gcap_manual_seed(gcap_engine *e, uint64_t seed);

/* Memory statistics of a pool or of the engine's ordinary allocator. */
typedef struct gcap_mem_stats {
  size_t reserved_bytes; /* obtained from the device */
  size_t in_use_bytes;   /* handed out in live blocks */
  size_t peak_bytes;     /* high-water mark of in_use_bytes */
  int64_t blocks;        /* live blocks */
  int64_t graphs;        /* live (captured, not reset) graphs using the pool */
} gcap_mem_stats;

/* Statistics of the engine's ordinary (non-graph) allocator. */
gcap_status gcap_engine_mem_stats(gcap_engine *e, gcap_mem_stats *out);

/* ------------------------------------------------------------------------ */
/* Tensors: contiguous, 0-D to 4-D, refcounted storage; views share storage. */

/* A new uninitialised tensor of `shape` (ndim entries, each >= 0), allocated
** on the current stream (in the capture's pool while capturing). */
gcap_status gcap_tensor_empty(gcap_engine *e, gcap_dtype dt, int ndim,
                              const int64_t *shape, gcap_tensor **out);

/* A new tensor filled with `v`. */
gcap_status gcap_tensor_full(gcap_engine *e, gcap_dtype dt, int ndim,
                             const int64_t *shape, double v, gcap_tensor **out);

/* A new tensor holding numel(shape) floats copied from host memory `data`.
** A synchronous upload: refused while capturing. */
gcap_status gcap_tensor_from_f32(gcap_engine *e, gcap_dtype dt, int ndim,
                                 const int64_t *shape, const float *data,
                                 gcap_tensor **out);

/* A new tensor of uniform [0, 1) (normal = 0) or standard normal (normal = 1)
** numbers drawn from the engine's generator, which advances. */
gcap_status gcap_tensor_rand(gcap_engine *e, gcap_dtype dt, int ndim,
                             const int64_t *shape, int normal, gcap_tensor **out);

/* Take another reference; returns t. */
gcap_tensor *gcap_tensor_retain(gcap_tensor *t);

/* Drop a reference. NULL is fine. */
void gcap_tensor_free(gcap_tensor *t);

gcap_engine *gcap_tensor_engine(const gcap_tensor *t);
int gcap_tensor_ndim(const gcap_tensor *t);
/* The shape (gcap_tensor_ndim entries), owned by the tensor. */
const int64_t *gcap_tensor_shape(const gcap_tensor *t);
int64_t gcap_tensor_numel(const gcap_tensor *t);
gcap_dtype gcap_tensor_dtype(const gcap_tensor *t);
/* The device address of the first element, for identity checks. */
uintptr_t gcap_tensor_data_ptr(const gcap_tensor *t);

/* Copy the tensor to host memory as n = numel floats; waits for the data.
** Refused while capturing (a read-back synchronizes). */
gcap_status gcap_tensor_read(gcap_tensor *t, float *dst, size_t n);

/* A view of t with another shape of the same numel; shares storage. */
gcap_status gcap_tensor_view(gcap_tensor *t, int ndim, const int64_t *shape,
                             gcap_tensor **out);

/* A new tensor with a copy of t's data. */
gcap_status gcap_tensor_clone(gcap_tensor *t, gcap_tensor **out);

/* In place: dst = src (same numel), t = 0, t = v. */
gcap_status gcap_copy_(gcap_tensor *dst, gcap_tensor *src);
gcap_status gcap_zero_(gcap_tensor *t);
gcap_status gcap_fill_(gcap_tensor *t, double v);

/* Elementwise ops into a new tensor. Binary ops accept equal shapes, a 0-D or
** one-element operand, or a row matching the other's last dimension. */
gcap_status gcap_add(gcap_tensor *a, gcap_tensor *b, gcap_tensor **out);
gcap_status gcap_sub(gcap_tensor *a, gcap_tensor *b, gcap_tensor **out);
gcap_status gcap_mul(gcap_tensor *a, gcap_tensor *b, gcap_tensor **out);
gcap_status gcap_scale(gcap_tensor *a, double s, gcap_tensor **out);
gcap_status gcap_neg(gcap_tensor *a, gcap_tensor **out);
/* Reductions over all elements into a 0-D tensor. */
gcap_status gcap_sum(gcap_tensor *a, gcap_tensor **out);
gcap_status gcap_mean(gcap_tensor *a, gcap_tensor **out);

/* ------------------------------------------------------------------------ */
/* Streams and events                                                        */

/* A new stream. Work on one stream runs in order. */
gcap_status gcap_stream_new(gcap_engine *e, gcap_stream **out);
/* NULL is fine; the engine's own streams are never freed by this. */
void gcap_stream_free(gcap_stream *s);
/* The engine's default stream and the side stream used for captures. */
gcap_stream *gcap_default_stream(gcap_engine *e);
gcap_stream *gcap_capture_stream(gcap_engine *e);
/* The stream new work goes to; NULL selects the default stream. */
gcap_stream *gcap_current_stream(gcap_engine *e);
gcap_status gcap_set_current_stream(gcap_engine *e, gcap_stream *s);
/* Wait for all work on s. Refused while capturing. */
gcap_status gcap_stream_synchronize(gcap_stream *s);

gcap_status gcap_event_new(gcap_engine *e, gcap_event **out);
void gcap_event_free(gcap_event *ev);
/* Record ev at the current end of s. */
gcap_status gcap_event_record(gcap_event *ev, gcap_stream *s);
/* Make later work on s wait for ev. Waiting on an event recorded in a capture
** forks s into that capture; s must then be joined back (the capture stream
** waits on an event recorded on s after its last work) before the capture ends. */
gcap_status gcap_stream_wait_event(gcap_stream *s, gcap_event *ev);
/* Wait on the host for ev. Refused while capturing. */
gcap_status gcap_event_synchronize(gcap_event *ev);

/* ------------------------------------------------------------------------ */
/* Pools and graphs                                                          */

/* A private memory pool that several graphs can share (graph_pool_handle). */
gcap_status gcap_pool_new(gcap_engine *e, gcap_pool **out);
/* Release the handle. The pool's memory returns to the device once no graph
** uses it and no tensor allocated from it is alive. NULL is fine. */
void gcap_pool_free(gcap_pool *p);
/* Take another handle reference; returns p. */
gcap_pool *gcap_pool_retain(gcap_pool *p);
gcap_status gcap_pool_get_stats(gcap_pool *p, gcap_mem_stats *out);

typedef struct gcap_graph_stats {
  int64_t nodes;         /* kernel and copy nodes in the captured graph */
  double capture_ms;     /* begin to end of capture */
  double instantiate_ms; /* instantiate and upload */
  size_t pool_bytes;     /* bytes the pool reserved when this capture ended */
  int64_t replays;       /* successful replays since capture */
} gcap_graph_stats;

/* A new, empty graph. */
gcap_status gcap_graph_new(gcap_engine *e, gcap_graph **out);
/* Destroy the graph. While a capture is open this is deferred until it ends.
** NULL is fine. */
void gcap_graph_free(gcap_graph *g);
/* A name used in error messages (copied; at most 63 bytes kept). */
gcap_status gcap_graph_set_name(gcap_graph *g, const char *name);
const char *gcap_graph_name(const gcap_graph *g);

/* Begin capturing into g. All allocations of the capture come from `pool`
** (NULL: a new private pool). Work goes to `s` (NULL: the engine's capture
** stream), which becomes the current stream until gcap_capture_end. The graph
** must be empty (new or reset); one capture at a time per engine. */
gcap_status gcap_capture_begin(gcap_graph *g, gcap_pool *pool, gcap_stream *s);

/* End the capture and instantiate the graph. The capture always ends: when
** it was invalidated (a forbidden action during capture), or a forked stream
** was not joined, the result is GCAP_ECAPTURE and g is empty again. */
gcap_status gcap_capture_end(gcap_graph *g);

/* Launch the captured work on the current stream. With the replay check on,
** a replay that would read pool memory overwritten since its capture-time
** producer wrote it is refused with GCAP_EREPLAY naming both graphs. */
gcap_status gcap_graph_replay(gcap_graph *g);

/* Free the captured graph; g is empty and can capture again. */
gcap_status gcap_graph_reset(gcap_graph *g);

gcap_status gcap_graph_get_stats(gcap_graph *g, gcap_graph_stats *out);

/* The pool g captured into (NULL while empty); not a new reference. */
gcap_pool *gcap_graph_pool(gcap_graph *g);

/* 1 when g holds a captured, instantiated graph. */
int gcap_graph_is_captured(const gcap_graph *g);

#ifdef __cplusplus
}
#endif
#endif
