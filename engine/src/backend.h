/*
** backend.h: the one table a backend implements, and the kernel catalogue.
**
** The core reaches a backend only through gc_backend. A kernel launch is a
** kernel id plus a gc_kargs taken by value: the host backend records exactly
** that during capture and replays it; the cuda backend launches the matching
** CUDA kernel on the stream. Every kernel has a readable host reference in
** host/kernels.c and a CUDA version in cuda/; parity tests compare them.
**
** Backends never include each other and never see the engine's layout; they
** report errors through gc_fail (which sets the engine's message).
*/
#ifndef GC_BACKEND_H
#define GC_BACKEND_H

#include <stdint.h>

#include "graphcap.h"

/* Kernel catalogue. Element counts are int64; pointers are device addresses;
** dt is the gcap_dtype of the tensors (all operands of one launch share it). */
typedef enum gc_kernel {
  GC_K_FILL,        /* p[0][i] = f[0]                        i < n[0] */
  GC_K_COPY,        /* p[0][i] = p[1][i], i < n[0]; dt: destination dtype, n[1]: source dtype */
  GC_K_ADD,         /* p[0][i] = p[1][i % n[1]] + p[2][i % n[2]], i < n[0] */
  GC_K_SUB,         /* p[0][i] = p[1][i % n[1]] - p[2][i % n[2]] */
  GC_K_MUL,         /* p[0][i] = p[1][i % n[1]] * p[2][i % n[2]] */
  GC_K_SCALE,       /* p[0][i] = p[1][i] * f[0]              i < n[0] */
  GC_K_SUM,         /* p[0][0] = f[0] * sum(p[1][0 .. n[0]))  (mean: f[0] = 1/n) */
  GC_K_RAND,        /* p[0][i] = draw(seed, offset + i), i < n[0]; p[1] = u64
                       state {seed, offset}; n[1] = 1 for normal, 0 uniform */
  GC_K_RNG_ADVANCE, /* state p[0] = {seed, offset}: offset += n[0] */
  GC_K_COUNT
} gc_kernel;

#define GC_KPTRS 8
#define GC_KINTS 8
#define GC_KFLOATS 4

/* The arguments of one launch, taken by value (baked at capture). */
typedef struct gc_kargs {
  void *p[GC_KPTRS];
  int64_t n[GC_KINTS];
  float f[GC_KFLOATS];
  int dt;
} gc_kargs;

/* The name of a kernel, for error messages ("add", "sum", ...). */
const char *gc_kernel_name(int k);

/* Set the engine's error message (printf-style) and return st. */
gcap_status gc_fail(gcap_engine *e, gcap_status st, const char *fmt, ...)
#ifdef __GNUC__
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/*
** The backend table. `bs` is the backend's state from init. Streams, events,
** graphs and execs are the backend's own opaque pointers. Every function that
** can fail returns a status and sets the engine's message through gc_fail.
** The core has already checked capture rules before calling in; the backend
** only does the work (and reports what the device itself refuses).
*/
typedef struct gc_backend {
  const char *name;
  gcap_status (*init)(gcap_engine *e, void **bs);
  void (*shutdown)(void *bs);

  /* Raw device memory, 256-byte aligned at least. malloc must work while a
  ** capture is open (cuda: under the relaxed capture mode). */
  gcap_status (*malloc)(gcap_engine *e, void *bs, size_t n, void **p);
  void (*free)(void *bs, void *p);

  gcap_status (*stream_new)(gcap_engine *e, void *bs, void **s);
  void (*stream_free)(void *bs, void *s);
  gcap_status (*stream_sync)(gcap_engine *e, void *bs, void *s);
  gcap_status (*device_sync)(gcap_engine *e, void *bs);

  gcap_status (*event_new)(gcap_engine *e, void *bs, void **ev);
  void (*event_free)(void *bs, void *ev);
  gcap_status (*event_record)(gcap_engine *e, void *bs, void *ev, void *s);
  gcap_status (*stream_wait)(gcap_engine *e, void *bs, void *s, void *ev);
  gcap_status (*event_sync)(gcap_engine *e, void *bs, void *ev);

  /* Synchronous host<->device copies of n bytes, ordered after work on s. */
  gcap_status (*upload)(gcap_engine *e, void *bs, void *s, void *dst,
                        const void *src, size_t n);
  gcap_status (*download)(gcap_engine *e, void *bs, void *s, void *dst,
                          const void *src, size_t n);

  /* Launch (or, on a capturing stream, record) kernel k. */
  gcap_status (*launch)(gcap_engine *e, void *bs, void *s, int k,
                        const gc_kargs *a);

  /* Capture: begin on s; end on s, giving the captured graph (NULL and an
  ** error when the device refused it). Streams forked in by waiting on an
  ** event recorded during the capture leave it at end. */
  gcap_status (*capture_begin)(gcap_engine *e, void *bs, void *s);
  gcap_status (*capture_end)(gcap_engine *e, void *bs, void *s, void **graph);
  /* Instantiate (and upload) a captured graph; nodes = its node count. */
  gcap_status (*instantiate)(gcap_engine *e, void *bs, void *graph,
                             void **exec, int64_t *nodes);
  gcap_status (*graph_launch)(gcap_engine *e, void *bs, void *exec, void *s);
  /* Free a graph and/or its exec; either may be NULL. */
  void (*graph_free)(void *bs, void *graph, void *exec);
} gc_backend;

/* The backends built in; gc_cuda_backend() is NULL in a CUDA=0 build. */
const gc_backend *gc_host_backend(void);
const gc_backend *gc_cuda_backend(void);
/* 1 when the cuda backend is built and a device is visible. */
int gc_cuda_probe(void);

#endif
