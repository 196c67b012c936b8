/*
** runtime.h: the runtime layer's structures (engine, pools, streams,
** capture and graphs, trace), shared by the files of runtime/ and by the
** layers above (tensor/tensor.h includes it). Backends do not include this
** (they see backend.h only).
*/
#ifndef GC_RUNTIME_H
#define GC_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "graphcap.h"

#define GC_NAMELEN 64
#define GC_WRITER_OUTSIDE 0 /* "written by eager work or copy-in", not by a graph */

/* A graph's id: 1, 2, ... in creation order, never reused (the pools' maps
** of who wrote what may name a destroyed graph); 64 bits, so never spent. */
typedef int64_t gc_gid;

/* ------------------------------------------------------------------------ */
/* Allocator (alloc.c)                                                       */

typedef struct gc_seg gc_seg;

/* A block of a segment: a tensor storage while in use, a free-list entry
** otherwise. Views share a block through its refcount. */
typedef struct gc_blk {
  char *ptr;
  size_t size;
  int refs;            /* 0: free */
  int weak;            /* a detached copy: the memory went back to the pool */
  int dead, dead_k;    /* weak, its memory since written by other work: any access is refused,
                          naming it output dead_k of graphed entry dead (1-based); 0: usable */
  uint64_t version;    /* writes to the storage so far (every tensor over it shares it) */
  gcap_pool *pool;     /* the pool (or the engine heap) it belongs to */
  gcap_stream *stream; /* blocks are reused on the stream they were freed on */
  gc_seg *seg;
  struct gc_blk *prev, *next;   /* neighbours in the segment, by address */
  struct gc_blk *fprev, *fnext; /* free list */
} gc_blk;

struct gc_seg {
  char *base;
  size_t size;
  gc_seg *next;
  gc_blk *first; /* its blocks, by address (merges keep the leftmost) */
  int trim;      /* goes back to the device once entirely free, unless something allocates
                    from it first: a dead stream's leftover, a failed call's growth */
};

/* Last writer of each byte range of a pool: sorted, disjoint intervals. */
typedef struct gc_ivl {
  uintptr_t lo, hi;
  gc_gid writer; /* graph id, or GC_WRITER_OUTSIDE */
} gc_ivl;

typedef struct gc_ivmap {
  gc_ivl *v;
  int n, cap;
} gc_ivmap;

struct gcap_pool {
  gcap_engine *e;
  int handles;    /* user references (gcap_pool_new, retain) */
  int graphs;     /* graphs holding the pool: captured or capturing */
  int64_t blocks; /* live blocks */
  int64_t weak;   /* weak references to its memory (gc_tensor_weaken) */
  int is_heap;    /* the engine's ordinary allocator */
  gc_seg *segs;
  gc_blk *freelist;
  size_t reserved, in_use, peak;
  gc_ivmap writers;              /* replay check: who really wrote what last (replays, eager) */
  gc_ivmap cap_writers;          /* the same in capture order: the producers of reads */
  struct gcap_pool *next_dead;   /* deferred release list */
  struct gcap_pool *prev, *next; /* the engine's pools */
};

gcap_pool *gc_pool_create(gcap_engine *e, int is_heap);
/* Allocate n bytes for stream s from pool p: a block with refs = 1. A
** failure's message starts with op, the call that asked. */
gcap_status gc_pool_alloc(gcap_pool *p, gcap_stream *s, size_t n, const char *op, gc_blk **out);
void gc_blk_retain(gc_blk *b);
void gc_blk_release(gc_blk *b);
/* The free blocks of stream s, in every pool, go to stream to (s is going
** away: its work must be finished); in-use ones will return to `to`. */
void gc_pools_retag(gcap_engine *e, const gcap_stream *s, gcap_stream *to);
/* Free p once nothing holds it (no handle, graph or block). */
void gc_pool_maybe_release(gcap_pool *p);
/* Release every segment of p to the device and free p. */
void gc_pool_destroy(gcap_pool *p);
void gc_pool_stats_of(const gcap_pool *p, gcap_mem_stats *out);
/* Give back to the device the segments p gained after `since` (its segment
** list head then): now those entirely free, later the others, once blocks
** still held (by a collector's tensors) are freed. */
void gc_pool_trim_since(gcap_pool *p, const gc_seg *since);

/* Make room for n more gc_ivmap_set calls; 0 when out of memory. A set
** without room may need memory, and is dropped when there is none. */
int gc_ivmap_reserve(gc_ivmap *m, int n);
void gc_ivmap_set(gc_ivmap *m, uintptr_t lo, uintptr_t hi, gc_gid writer);
/* Calls fn for each piece of [lo, hi) with its writer (gaps: OUTSIDE);
** stops and returns the first non-zero result. */
int gc_ivmap_each(const gc_ivmap *m, uintptr_t lo, uintptr_t hi,
                  int (*fn)(void *ud, uintptr_t lo, uintptr_t hi, gc_gid writer), void *ud);
void gc_ivmap_free(gc_ivmap *m);

/* ------------------------------------------------------------------------ */
/* Streams and events (stream.c)                                             */

struct gcap_stream {
  gcap_engine *e;
  void *bs;                     /* the backend's stream */
  int owned_by_engine;          /* default and capture streams */
  int dead;                     /* freed during a capture: destroyed when it ends */
  int in_capture;               /* origin of, or forked into, the open capture */
  uint64_t seq;                 /* work items queued so far */
  uint64_t joined_seq;          /* seq when another capture stream last waited for all its work */
  struct gcap_stream *absorber; /* that stream (joined when it is, or is the origin) */
  gcap_stream *prev, *next;     /* the engine's list of streams */
  int holds;                    /* engine references (a graphed call's backward to come) */
  int freed;                    /* gcap_stream_free ran while held: it goes with the last hold */
};

struct gcap_event {
  gcap_engine *e;
  void *bs;
  gcap_stream *stream; /* where it was last recorded, NULL if never */
  uint64_t seq;        /* that stream's seq at the record */
  uint64_t epoch;      /* capture epoch of the record, 0 outside capture */
  int external;        /* recorded in a capture, a node of the graph (recorded at each replay) */
  int holds;           /* engine references (graphs that record it, a backward to come) */
  int freed;           /* gcap_event_free ran while held: it goes with the last hold */
};

gcap_status gc_stream_create(gcap_engine *e, int owned, gcap_stream **out);
void gc_stream_destroy(gcap_stream *s);
/* References the engine keeps on a user's stream or event (a graphed call
** keeps its cuda_graph_stream and cuda_graph_event for its backward): freed
** by the user meanwhile, it goes when the last hold is dropped. The engine's
** own streams need none. */
void gc_stream_hold(gcap_stream *s);
void gc_stream_drop(gcap_stream *s);
void gc_event_hold(gcap_event *ev);
void gc_event_drop(gcap_event *ev);
/* Does graph g record the external event ev at each replay? */
int gc_graph_records(const gcap_graph *g, const gcap_event *ev);
/* Make `waiter` wait for the work queued on s so far, through ev (PyTorch's
** wait_stream). */
gcap_status gc_stream_wait_stream(gcap_stream *waiter, gcap_stream *s, gcap_event *ev);

/* ------------------------------------------------------------------------ */
/* Capture and graphs (capture.c)                                            */

typedef struct gc_range {
  uintptr_t lo, hi;
  gc_gid producer;  /* reads: the writer expected at replay */
  const char *what; /* reads: the op that read them first (e->note_what then), or NULL */
} gc_range;

/* Something a graph keeps alive while it lives (a custom op it recorded). */
typedef struct gc_kept {
  void *obj;
  void (*release)(void *obj);
} gc_kept;

typedef struct gc_ranges {
  gc_range *v;
  int n, cap;
} gc_ranges;

typedef enum { GC_GRAPH_EMPTY, GC_GRAPH_CAPTURING, GC_GRAPH_READY } gc_graph_state;

struct gcap_graph {
  gcap_engine *e;
  gc_gid id;
  int slot; /* its place in the engine's registry */
  char name[GC_NAMELEN];
  gc_graph_state state;
  gcap_pool *pool; /* holds pool->graphs while capturing or ready */
  void *bgraph, *bexec;
  gc_ranges reads, writes; /* pool bytes read before written; bytes written */
  gc_blk **held;           /* blocks outside the pool the graph touches, kept alive */
  int nheld, capheld;
  gc_kept *kept; /* objects its nodes use, released when it is cleared */
  int nkept, capkept;
  gcap_graph_stats stats;
  struct gcap_graph *next_dead;
};

/* A span named at its start: a trace event and a profiler range (NVTX on
** cuda, so that Nsight Systems shows the trace's phases). gc_span_begin
** costs a test and nothing more while neither is on; gc_span_end closes it
** (the trace's name takes `suffix`, as " (failed)"). */
typedef struct gc_span {
  double t0;      /* the trace's start, 0: not traced */
  int ranged;     /* a range was opened */
  char name[112]; /* what it is named */
} gc_span;
void gc_span_open(gcap_engine *e, gc_span *s, const char *fmt, ...)
#ifdef __GNUC__
    __attribute__((format(printf, 3, 4)))
#endif
    ;
void gc_span_close(gcap_engine *e, gc_span *s, const char *cat, const char *suffix);
#define gc_span_begin(e, s, ...)                                                                   \
  ((e)->trace != NULL || (e)->ranges ? gc_span_open((e), (s), __VA_ARGS__)                         \
                                     : (void)((s)->t0 = 0.0, (s)->ranged = 0))
static inline void gc_span_end(gcap_engine *e, gc_span *s, const char *cat, const char *suffix) {
  if (s->t0 != 0.0 || s->ranged) gc_span_close(e, s, cat, suffix);
}

typedef struct gc_capture {
  gcap_graph *g;
  gcap_pool *pool;
  gcap_stream *origin;
  gcap_stream *prev_current;
  int invalid;
  char why[GC_ERRLEN];
  double t0;
  gc_span span;   /* "capture <graph>", from begin to end */
  gc_ranges undo; /* what the capture overwrote in the pool's capture-order map, in order,
                     for a failure to put back */
} gc_capture;

/* Note that the launch about to happen reads (write = 0) or writes the
** bytes [lo, hi) of block b: feeds the capture's access sets or, outside
** capture, the pool's writers; a write bumps the version of b's storage
** (gc_note_access, tensor.h, brings every write of the engine's kernels
** here, so the in-place ones are counted). Any access to a dead block is
** refused, naming the graphed output it was. */
gcap_status gc_note_range(gcap_engine *e, gc_blk *b, uintptr_t lo, uintptr_t hi, int write);
/* The open capture's graph keeps obj until it is cleared, then calls
** release(obj); without a capture, or failing (out of memory), nothing is
** kept and the caller keeps its reference. */
gcap_status gc_graph_keep(gcap_engine *e, void *obj, void (*release)(void *obj));
void gc_graph_destroy(gcap_graph *g);
/* May a replay of g read (write = 0) or write (1) the bytes [lo, hi) of
** block b? Bytes of g's pool: when its read or write set holds some of
** them; another block: when g holds it (reads and writes alike: outside its
** pool a graph keeps blocks, not ranges). */
int gc_graph_touches(const gcap_graph *g, const gc_blk *b, uintptr_t lo, uintptr_t hi, int write);

/* ------------------------------------------------------------------------ */
/* Random generators (generator.c)                                           */

/* A generator's state {seed, offset}, two u64 in device memory (a block of
** the engine's heap) that kernels read and advance, so that a graph draws
** from the state as it is at each replay. A graph that draws from it holds
** the block (gc_note_range), so its replays outlive the generator object. */
struct gcap_generator {
  gcap_engine *e;
  int refs;
  gc_blk *blk;
  gcap_generator *prev, *next; /* the engine's generators */
};

/* A new generator of state {seed, 0} (its block from the heap), linked into
** the engine's list; refs 1. It holds no reference to the engine (the
** default one is the engine's own). */
gcap_status gc_generator_create(gcap_engine *e, uint64_t seed, const char *op,
                                gcap_generator **out);
/* Unlink g and release its block (graphs may still hold the block). */
void gc_generator_destroy(gcap_generator *g);

/* The state of every generator of an engine, and which one is in use: taken
** at the start of work that must leave them as they were
** (make_graphed_callables), put back at its end. */
typedef struct gc_rng_snap {
  int n;
  gcap_generator **g; /* [n], each held */
  uint64_t *state;    /* [2n] */
  gcap_generator *current;
} gc_rng_snap;
gcap_status gc_rng_snap_take(gcap_engine *e, gc_rng_snap *s);
/* Put the states and the generator in use back, and free s (also after a
** failed take); the first failure is the result. */
gcap_status gc_rng_snap_put(gcap_engine *e, gc_rng_snap *s);

/* ------------------------------------------------------------------------ */
/* What a launch is, for the host's dumps (label.c)                          */

/* The op running: a public op (gc_op_start), or a node's backward, and where
** it runs: the module path ("Sequential.0") and type ("Linear") of a forward,
** or the "path (Type)" a node noted when it was recorded. */
typedef struct gc_oplabel {
  const char *name;
  int backward; /* name is a node's: its backward runs (ops it calls keep the label) */
  const char *where, *type;
  const void *module; /* the module of where, whose children name the next level */
} gc_oplabel;

/* A tensor the launch about to happen reads or writes, noted while a
** capture is open. */
typedef struct gc_argnote {
  const void *ptr;
  int write, ndim, dt;
  int64_t shape[GCAP_MAXDIM];
} gc_argnote;
#define GC_ARGNOTES 16
/* A copy of "where (type)" of label l, for a node recorded there (NULL when
** out of memory). */
char *gc_where_str(const gc_oplabel *l);

/* A step a backward took beyond its grads (a delayed wgrad queued): fn(ud,
** 1) takes it back when the backward fails, fn(ud, 0) keeps it; either
** way ud is released. */
typedef struct gc_undo {
  void (*fn)(void *ud, int undo);
  void *ud;
} gc_undo;

/* ------------------------------------------------------------------------ */
/* The engine (engine.c)                                                     */

struct gcap_engine {
  const gc_backend *be;
  void *bs;
  int refs; /* live objects + 1 while the user holds it */
  int closed;
  char err[GC_ERRLEN];
  gcap_stream *streams; /* every live stream */
  gcap_stream *default_stream, *capture_stream, *current;
  gcap_stream *warm_prev; /* the current stream to restore after a warmup */
  gcap_pool *pools;       /* every pool, the heap included */
  gcap_pool *heap;
  gc_capture *cap; /* the open capture, or NULL */
  uint64_t cap_epoch;
  int replay_check;
  const char *note_what; /* the op whose accesses are being noted, for the replay check's
                            message (a kernel's name, or a name the open capture keeps) */
  int grad_enabled;
  uint64_t module_gen;  /* bumped whenever a module registers something */
  uint64_t bw_mark;     /* backward pass counter (node marks) */
  int bw_depth;         /* backwards running (a recompute's runs inside a node's) */
  struct gc_undo *undo; /* what they did beyond grads, to take back if one fails (autograd.c) */
  int nundo, capundo;
  gc_blk *rng;          /* the state of the generator in use, gen->blk */
  gcap_generator *gen0; /* the default generator (the engine's own) */
  gcap_generator *gen;  /* the generator in use, held */
  gcap_generator *gens; /* every live generator */
  int graphing;         /* make_graphed_callables calls under way (is_graph_capturing) */
  gc_gid last_graph_id;
  gcap_graph **graphs; /* live graphs, by slot (names for messages); NULL: a free slot */
  int graphs_cap;
  int *free_slots; /* slots of destroyed graphs, reused first: the registry stays as large
                      as the most graphs alive at once */
  int nfree_slots;
  /* destruction deferred while a capture is open */
  gcap_graph *dead_graphs;
  gcap_pool *dead_pools;
  void **dead_ptrs;
  int ndead_ptrs, capdead_ptrs;
  struct gc_trace *trace;           /* the open trace (trace.c), or NULL */
  int ranges;                       /* the backend opens profiler ranges (NVTX on cuda) for spans */
  gc_oplabel op;                    /* the op running, for the host's dumps */
  gc_argnote argnotes[GC_ARGNOTES]; /* the tensors of the launch about to be recorded */
  int nargnotes;
  uint32_t *badid;       /* the bad-id flag, GC_BADID_WORDS, as the host reads it */
  void *badid_dev;       /* the same, as kernels write it */
  gcap_fp8_autocast fp8; /* the FP8 autocast (train/fp8.c) */
  /* the all-reduce (max) of an FP8 autocast's amax_reduction_group: set by
  ** gcap_dist_init, so that the training layer reaches it without a link
  ** to the distributed layer; NULL while that is not initialised */
  gcap_status (*fp8_all_reduce)(gcap_tensor *t, gcap_dist_group *g);
  gcap_tensor *fp8_skip;   /* while make_graphed_callables with FP8 weight caching runs: the
                              flag (one f32) its weights' quantizations read, else NULL */
  gcap_tensor *fp8_frozen; /* while a checkpoint recomputes an FP8 forward: the scales of the
                              module's roles as that forward read them (DelayedScaling), which
                              its quantizations take, noting no amax and updating no role;
                              else NULL */
};

/* The bad-id flag (badid.c): made with the engine, freed with it. */
gcap_status gc_badid_init(gcap_engine *e);
void gc_badid_free(gcap_engine *e);
/* The flag a kernel that looks rows up by id gets, with the id of the graph
** being captured into *gid: NULL outside capture (the op checked its ids). */
void *gc_badid_site(gcap_engine *e, int64_t *gid);
/* A bad id a graph's kernel met since the last look: an error naming the
** op, the id, the graph and its replays, and the flag cleared; else OK.
** Cheap (a read of host memory): called at the start of each replay and
** after every synchronization. */
gcap_status gc_badid_check(gcap_engine *e);
/* gcap_graph_replay without its last look at the bad-id flag, for a caller
** that has its own state to update after the launch before it looks. */
gcap_status gc_graph_replay(gcap_graph *g);
/* The live graph of id `id`, or NULL (destroyed): a scan, for messages. */
const gcap_graph *gc_graph_of(const gcap_engine *e, gc_gid id);

void gc_engine_ref(gcap_engine *e);
void gc_engine_unref(gcap_engine *e);
/* Free raw device memory now, or after the open capture ends. */
void gc_raw_free(gcap_engine *e, void *p);
/* Run the destructions deferred during a capture. */
void gc_run_deferred(gcap_engine *e);
/* Refuse an action forbidden during capture: invalidates the capture. */
gcap_status gc_capture_refuse(gcap_engine *e, const char *fmt, ...)
#ifdef __GNUC__
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* OK outside capture; otherwise refuse `what` (a sync, a read-back). */
gcap_status gc_check_not_capturing(gcap_engine *e, const char *what);
/* Check that work may go to stream s now (capture membership rules). */
gcap_status gc_check_stream(gcap_engine *e, gcap_stream *s, const char *what);
/* The start of every constructor: clear the message, and refuse to make
** anything on a closed engine (gcap_engine_free ran; live objects keep it
** only so that they can be freed). `what` names the object. */
gcap_status gc_check_open(gcap_engine *e, const char *what);
/* Clear the error message (start of a public call; inline, as every call
** pays it, beside error.c's gc_fail that sets it). */
static inline void gc_clear(gcap_engine *e) {
  e->err[0] = '\0';
}
/* Refuse argument `arg` of call `op` on engine e: GCAP_EINVAL with the
** message "op: arg is NULL" (gc_null), "op: arg belongs to another engine"
** (gc_foreign) or "op: arg is N" (gc_bad_count, a count out of range), the
** argument named as graphcap.h declares it. */
gcap_status gc_null(gcap_engine *e, const char *op, const char *arg);
gcap_status gc_foreign(gcap_engine *e, const char *op, const char *arg);
gcap_status gc_bad_count(gcap_engine *e, const char *op, const char *arg, int n);
double gc_now_ms(void);

/* ------------------------------------------------------------------------ */
/* Trace (trace.c)                                                           */

typedef struct gc_trace gc_trace;

/* The start of a span: now in microseconds while a trace is open, else 0
** (inline: replays ask it, and pay a NULL test when nothing is traced). */
static inline double gc_trace_clock(const gcap_engine *e) {
  return e->trace ? gc_now_ms() * 1e3 : 0.0;
}
/* Write the span of category cat begun at t0 (from gc_trace_clock), ending
** now, named by fmt; nothing when t0 is 0 or no trace is open. */
void gc_trace_span(gcap_engine *e, double t0, const char *cat, const char *fmt, ...)
#ifdef __GNUC__
    __attribute__((format(printf, 4, 5)))
#endif
    ;

#endif
