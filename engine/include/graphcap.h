/*
** graphcap.h: the public C API of the graphcap engine.
**
** Conventions (SQLite's): every fallible call returns a gcap_status and hands
** objects back through a last `**out` argument (set to NULL on failure); the
** text of the last error is gcap_errmsg(engine); destructors accept NULL.
** A failed call sets a message of its own, naming the argument at fault as
** it is declared here ("add: b is NULL", "custom op 'f': nin is -1", "set
** grad: the grad belongs to another engine"), on the engine the call is
** made on: its engine argument, else the engine of its first handle (tensor,
** stream, graph, module, ...) that is not NULL. A call whose handles are all
** NULL has no engine to tell: it returns what its declaration says (a
** fallible call GCAP_EINVAL) and sets no message.
** The library never prints, exits or aborts on a user or device error.
** No Lua and no CUDA types appear here.
**
** One engine drives one device through one backend ("host" or "cuda").
** Objects (tensors, streams, events, pools, graphs) belong to one engine and
** keep it alive: gcap_engine_free with live objects only marks the engine
** closed, and it is freed when the last object goes.
**
** The header leads with the product: the engine, streams and events, pools
** and graphs, capture and the replay check, make_graphed_callables, seeing
** what was captured and what ran. Then what graphed work is made of:
** tensors, autograd, modules, optimizers, custom ops and runtime-compiled
** kernels, and the distributed layer. graphcap_types.h, included here, holds
** the status codes, devices, dtypes, limits and the objects' types.
**
** Threads. Nothing in an engine is locked: an engine and its objects are
** used by one thread at a time (any thread, where the calls do not overlap;
** on cuda one whose current CUDA device is the engine's: gcap_engine_new sets
** it in the thread that calls it, and under mpirun it is the rank's GPU, not
** device 0). Several engines, one per thread, keep their own state and
** messages (gcap_errmsg is per engine), but a capture is not isolated from
** other threads: on cuda, another engine's work while it is open (a new
** engine, allocation, ops, synchronize) can invalidate it, and its
** gcap_capture_end then fails with GCAP_ECAPTURE; capture while no other
** thread works on the device. Per thread: the message of a failed
** gcap_engine_new (gcap_last_open_error, also gcap_errmsg(NULL)) and
** allocation-failure injection (gcap_test_fail_alloc). Per process:
** gcap_live_engines (counted atomically), the distributed layer's one world
** (gcap_dist_*, bound to one engine), and NVRTC and the driver, which the
** first gcap_kernel_new loads without a lock: make that call before several
** threads compile kernels. Functions that only name constants
** (gcap_version, gcap_status_str, gcap_hook_kind_name, ...) may be called
** from any thread.
*/
#ifndef GRAPHCAP_H
#define GRAPHCAP_H

#include <stddef.h>
#include <stdint.h>

#include "graphcap_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The version of this header: GCAP_VERSION is "X.Y.Z", and
** GCAP_VERSION_NUMBER is X*1000000 + Y*1000 + Z (0.1.0 is 1000, 1.2.3 would
** be 1002003), as SQLite's SQLITE_VERSION_NUMBER, for preprocessor tests:
** #if GCAP_VERSION_NUMBER >= 1000. gcap_version() is the library's. */
#define GCAP_VERSION "0.1.0"
#define GCAP_VERSION_NUMBER 1000

/* ------------------------------------------------------------------------ */
/* The engine                                                                */

/* The version string, GCAP_VERSION. */
const char *gcap_version(void);

/* 1 when the library was built with the cuda backend and a GPU is visible. */
int gcap_cuda_available(void);

/* Create an engine on `dev`. GCAP_DEVICE_CUDA without a GPU (or without the
** cuda backend built in) is GCAP_EUNSUPPORTED; there is then no engine to ask,
** so the reason is in gcap_last_open_error(). */
gcap_status gcap_engine_new(gcap_device dev, gcap_engine **out);

/* The reason the last gcap_engine_new of this thread failed ("" if none). */
const char *gcap_last_open_error(void);

/* Release the caller's reference. NULL is fine. The engine lives on, closed
** to new work, until its last tensor, stream, event, pool and graph is freed:
** meanwhile every constructor on it (tensors, graphs, pools, streams, events,
** modules, optimizers, make_graphed_callables) fails with GCAP_ESTATE. */
void gcap_engine_free(gcap_engine *e);

/* Text of the engine's last error; owned by the engine, valid until its next
** call. "" when the last call succeeded. e NULL: gcap_last_open_error(). */
const char *gcap_errmsg(const gcap_engine *e);

/* "host" or "cuda"; "" for e NULL. */
const char *gcap_engine_device(const gcap_engine *e);

/* Wait until all work queued on every stream has finished. Refused while a
** capture is open (GCAP_ECAPTURE, capture invalidated). e NULL: GCAP_EINVAL. */
gcap_status gcap_synchronize(gcap_engine *e);

/* 1 while a capture is open on this engine, 0 otherwise (e NULL too). */
int gcap_is_capturing(const gcap_engine *e);

/* 1 during a gcap_make_graphed_callables call on this engine, the whole of
** it: checks, warmup, captures, and every hook and callable it runs
** (TransformerEngine's is_graph_capturing); 0 otherwise (e NULL too). A
** module may read it to take a graph-safe path also in the warmup, where
** gcap_is_capturing is 0. */
int gcap_is_graph_capturing(const gcap_engine *e);

/* Seed the random generator in use (gcap_current_generator: the default one
** unless another was set): its seed and offset live in device memory; the
** offset is reset to 0. Allowed outside capture only. e NULL: GCAP_EINVAL. */
gcap_status gcap_manual_seed(gcap_engine *e, uint64_t seed);

/* Random generators. A generator is a state {seed, offset} in device
** memory: ops that draw (dropout, rand, randn, attention's dropout) read the
** state of the generator in use and advance its offset on the device, so a
** graph that captured them draws fresh numbers at each replay and advances
** that generator as eager work would (a graph holds the state's memory while
** it lives, whatever happens to the generator object). An engine has a
** default generator and any number of others, such as the tracked states of
** Megatron's CudaRNGStatesTracker; gcap_make_graphed_callables saves and
** restores every generator's state (its warmup draws nothing). */

/* A new generator of state {seed, 0}. Refused while a capture is open (an
** upload). e NULL: GCAP_EINVAL. */
gcap_status gcap_generator_new(gcap_engine *e, uint64_t seed, gcap_generator **out);
/* Another reference (NULL for NULL); release a reference held. NULL is fine.
** The default generator is the engine's: free only references retained. */
gcap_generator *gcap_generator_retain(gcap_generator *g);
void gcap_generator_free(gcap_generator *g);
/* The default generator, and the one in use; not new references (NULL for e
** NULL). */
gcap_generator *gcap_default_generator(gcap_engine *e);
gcap_generator *gcap_current_generator(gcap_engine *e);
/* Draw from g from now on (NULL: the default generator); the engine holds g
** while it is in use. Allowed in a capture (it changes nothing on the
** device): work captured afterwards draws from g at each replay. To draw
** from g for a while (a tracker's fork), keep the generator in use before,
** retained, and set it back after. g of another engine: GCAP_EINVAL. */
gcap_status gcap_set_generator(gcap_engine *e, gcap_generator *g);
/* g's state, read back (ordered after the current stream's work), or set
** (later work on the current stream draws from it; graphs that draw from g
** too). Refused while a capture is open (GCAP_ECAPTURE, capture
** invalidated). g NULL: GCAP_EINVAL. */
gcap_status gcap_generator_get_state(gcap_generator *g, uint64_t *seed, uint64_t *offset);
gcap_status gcap_generator_set_state(gcap_generator *g, uint64_t seed, uint64_t offset);
/* g's state copied on the device into a new 4-element f32 tensor (its 16
** bytes; not numbers), and back from such a tensor into g: on the current
** stream, allowed in a capture, so a checkpoint's recomputation in a graphed
** backward draws what its forward drew. restore refuses a tensor of another
** dtype or size. g NULL: GCAP_EINVAL. */
gcap_status gcap_generator_save(gcap_generator *g, gcap_tensor **out);
gcap_status gcap_generator_restore(gcap_generator *g, gcap_tensor *state);

/* Memory statistics of a pool or of the engine's ordinary allocator. */
typedef struct gcap_mem_stats {
  size_t reserved_bytes; /* obtained from the device */
  size_t in_use_bytes;   /* handed out in live blocks */
  size_t peak_bytes;     /* high-water mark of in_use_bytes */
  int64_t blocks;        /* live blocks */
  int64_t graphs;        /* live (captured, not reset) graphs using the pool */
} gcap_mem_stats;

/* Statistics of the engine's ordinary (non-graph) allocator. e NULL: GCAP_EINVAL. */
gcap_status gcap_engine_mem_stats(gcap_engine *e, gcap_mem_stats *out);
/* Start the ordinary allocator's peak_bytes again from its in_use_bytes
** (PyTorch's reset_peak_memory_stats), to measure the peak of a stretch of
** work. e NULL: GCAP_EINVAL. */
gcap_status gcap_engine_reset_peak(gcap_engine *e);

/* What an engine still holds, for leak checks: after a program has freed
** everything it made, every field is 0 (the engine's own streams and state
** are not counted). */
typedef struct gcap_engine_stats {
  int64_t objects;            /* live objects holding the engine: tensors, modules, graphs, pools,
                                 streams, events, generators, optimizers, graphed sets */
  int64_t blocks;             /* live allocator blocks, every pool */
  size_t in_use_bytes;        /* their bytes */
  size_t pool_reserved_bytes; /* device memory held by private pools */
} gcap_engine_stats;
/* e's stats into *out (a closed engine's too); GCAP_EINVAL when either is
** NULL (e NULL: no message). */
gcap_status gcap_engine_get_stats(gcap_engine *e, gcap_engine_stats *out);
/* Engines alive in the process: a closed engine (gcap_engine_free) lives
** on until the last object holding it is freed. */
int64_t gcap_live_engines(void);

/* ------------------------------------------------------------------------ */
/* Streams and events                                                        */

/* A new stream. Work on one stream runs in order. e NULL: GCAP_EINVAL. */
gcap_status gcap_stream_new(gcap_engine *e, gcap_stream **out);
/* NULL is fine; the engine's own streams are never freed by this. */
void gcap_stream_free(gcap_stream *s);
/* The engine's default stream and the side stream used for captures (NULL
** for e NULL). */
gcap_stream *gcap_default_stream(gcap_engine *e);
gcap_stream *gcap_capture_stream(gcap_engine *e);
/* The stream new work goes to (NULL for e NULL); setting s NULL selects the
** default stream. e and s NULL: GCAP_EINVAL. */
gcap_stream *gcap_current_stream(gcap_engine *e);
gcap_status gcap_set_current_stream(gcap_engine *e, gcap_stream *s);
/* Wait for all work on s. Refused while capturing. s NULL: GCAP_EINVAL. */
gcap_status gcap_stream_synchronize(gcap_stream *s);

/* A new event. e NULL: GCAP_EINVAL. */
gcap_status gcap_event_new(gcap_engine *e, gcap_event **out);
/* A new external event (PyTorch's Event(external=True)): recorded inside a
** capture, it becomes a node of the graph, which records it at each replay,
** so that work after a replay can wait on part of the graph's work (a
** graphed call's cuda_graph_event). A capturing stream cannot wait on it
** (fork and join streams with plain events). e NULL: GCAP_EINVAL. */
gcap_status gcap_event_new_external(gcap_engine *e, gcap_event **out);
/* The caller's reference; a graph that records the event keeps it until the
** graph goes. NULL is fine. */
void gcap_event_free(gcap_event *ev);
/* Record ev at the current end of s (NULL: the current stream). ev and s
** NULL: GCAP_EINVAL. */
gcap_status gcap_event_record(gcap_event *ev, gcap_stream *s);
/* Make later work on s wait for ev. Waiting on an event recorded in a capture
** forks s into that capture; s must then be joined back (the capture stream
** waits on an event recorded on s after its last work) before the capture
** ends. s and ev NULL: GCAP_EINVAL. */
gcap_status gcap_stream_wait_event(gcap_stream *s, gcap_event *ev);
/* Wait on the host for ev. Refused while capturing. ev NULL: GCAP_EINVAL. */
gcap_status gcap_event_synchronize(gcap_event *ev);

/* ------------------------------------------------------------------------ */
/* Pools and graphs                                                          */

/* A private memory pool that several graphs can share (graph_pool_handle).
** e NULL: GCAP_EINVAL. */
gcap_status gcap_pool_new(gcap_engine *e, gcap_pool **out);
/* Release the handle. The pool's memory returns to the device once no graph
** uses it and no tensor allocated from it is alive. NULL is fine. */
void gcap_pool_free(gcap_pool *p);
/* Take another handle reference; returns p (NULL for NULL). */
gcap_pool *gcap_pool_retain(gcap_pool *p);
/* p's statistics. p NULL: GCAP_EINVAL. */
gcap_status gcap_pool_get_stats(gcap_pool *p, gcap_mem_stats *out);

/* A new, empty graph. e NULL: GCAP_EINVAL. */
gcap_status gcap_graph_new(gcap_engine *e, gcap_graph **out);
/* Destroy the graph. While a capture is open this is deferred until it ends;
** freeing the graph that is capturing ends that capture (as a failed one).
** NULL is fine. */
void gcap_graph_free(gcap_graph *g);
/* A name used in error messages (copied; at most 63 bytes kept). g NULL:
** GCAP_EINVAL; gcap_graph_name(NULL) is "". */
gcap_status gcap_graph_set_name(gcap_graph *g, const char *name);
const char *gcap_graph_name(const gcap_graph *g);

/* ------------------------------------------------------------------------ */
/* Capture and the replay check                                              */

/* Begin capturing into g. All allocations of the capture come from `pool`
** (NULL: a new private pool). Work goes to `s` (NULL: the engine's capture
** stream), which becomes the current stream until gcap_capture_end. The graph
** must be empty (new or reset); one capture at a time per engine. g, pool and
** s NULL: GCAP_EINVAL. */
gcap_status gcap_capture_begin(gcap_graph *g, gcap_pool *pool, gcap_stream *s);

/* End the capture and instantiate the graph. The capture always ends: when
** it was invalidated (a forbidden action during capture), or a forked stream
** was not joined, the result is GCAP_ECAPTURE and g is empty again. g NULL:
** GCAP_EINVAL (as for every call on a graph below). */
gcap_status gcap_capture_end(gcap_graph *g);

/* Launch the captured work on the current stream. With the replay check on,
** a replay that would read pool memory overwritten since its capture-time
** producer wrote it is refused with GCAP_EREPLAY naming both graphs. */
gcap_status gcap_graph_replay(gcap_graph *g);

/* Turn the shared-pool replay-order check on (default) or off; nothing for e NULL. */
void gcap_set_replay_check(gcap_engine *e, int on);

/* Free the captured graph; g is empty and can capture again. */
gcap_status gcap_graph_reset(gcap_graph *g);

/* Statistics of a captured graph. */
typedef struct gcap_graph_stats {
  int64_t nodes;         /* kernel and copy nodes in the captured graph */
  double capture_ms;     /* begin to end of capture */
  double instantiate_ms; /* instantiate and upload */
  size_t pool_bytes;     /* bytes the pool reserved when this capture ended */
  int64_t replays;       /* successful replays since capture */
} gcap_graph_stats;
gcap_status gcap_graph_get_stats(gcap_graph *g, gcap_graph_stats *out);

/* The pool g captured into (NULL while empty, and for g NULL); not a new
** reference. */
gcap_pool *gcap_graph_pool(gcap_graph *g);

/* 1 when g holds a captured, instantiated graph (0 for g NULL). */
int gcap_graph_is_captured(const gcap_graph *g);

/* ------------------------------------------------------------------------ */
/* make_graphed_callables (TransformerEngine's, with capture_time_hooks).    */

/* The four kinds of hooks, of modules and of capture_time_hooks alike. */
typedef enum gcap_hook_kind {
  GCAP_HOOK_FORWARD_PRE = 0, /* before forward: inputs */
  GCAP_HOOK_FORWARD,         /* after forward: inputs and outputs */
  GCAP_HOOK_BACKWARD_PRE,    /* when the grads of the outputs arrive */
  GCAP_HOOK_BACKWARD         /* when the grads of the inputs are computed */
} gcap_hook_kind;
#define GCAP_HOOK_KINDS 4

/* The name of a hook kind as messages write it: "forward pre-hook",
** "forward hook", "backward pre-hook", "backward hook"; "" for a value that is
** no kind. */
const char *gcap_hook_kind_name(gcap_hook_kind kind);
/* The key of a kind's group in capture_time_hooks: "forward_pre_hooks",
** "forward_hooks", "backward_pre_hooks", "backward_hooks"; "" for no kind. */
const char *gcap_hook_group_key(gcap_hook_kind kind);

/* A capture-time hook: run outside capture with the original module; a
** non-OK status aborts graph construction (everything is rolled back). The
** message then names the hook, its callable and the phase
** ("capture_time_hooks forward_hooks #1 of callable 1 (Linear) failed in
** the warmup", after "make_graphed_callables: "), then says why: ": " and
** the message a failed call of the hook left, else the status's text; with
** GCAP_EABORTED the hook has its own account, and the message is the place
** alone. The warmup hooks and the progress callback fail the same way
** ("pre_warmup_hook failed", "the progress callback stopped the capture at
** 1 of 2"). */
typedef gcap_status (*gcap_capture_hook)(void *ud, gcap_module *m);

/* The hooks of one callable: n[k] functions in the group of hook kind k
** (gcap_hook_kind, which is also their call order around a pass), run in
** index order. */
typedef struct gcap_capture_hooks {
  int n[GCAP_HOOK_KINDS];
  const gcap_capture_hook *fn[GCAP_HOOK_KINDS];
  void *const *ud[GCAP_HOOK_KINDS];
} gcap_capture_hooks;

/* Progress of long work: `done` of `total` passes of `phase` ("warmup",
** "capture"), after each pass. A non-OK status stops the work, as a failing
** hook does (everything is rolled back). */
typedef gcap_status (*gcap_progress_fn)(void *ud, const char *phase, int done, int total);

typedef struct gcap_graphed_opts {
  int num_warmup_iters;   /* 3 */
  int allow_unused_input; /* 0 */
  const double *order;    /* NULL, or order_len entries: +k fwd, -k bwd, -(k+0.5) wgrad */
  int order_len;
  const int *num_layers_per_chunk; /* NULL, or num_chunks entries */
  int num_chunks;
  gcap_pool *pool;                          /* NULL: a new pool shared by all graphs of the call */
  int retain_graph_in_backward;             /* 0 */
  int reuse_graph_input_output_buffers;     /* 0; needs order and training */
  int clone_param_grads_on_return;          /* 1 */
  gcap_status (*pre_warmup_hook)(void *ud); /* once, before all warmup */
  void *pre_warmup_ud;
  gcap_status (*post_warmup_hook)(void *ud); /* once, after all warmup */
  void *post_warmup_ud;
  const gcap_capture_hooks *capture_time_hooks; /* NULL, or one per callable */
  int num_capture_time_hooks;                   /* must equal the number of callables when given */
  gcap_progress_fn progress;                    /* NULL: none */
  void *progress_ud;
  /* FP8 (TransformerEngine's options, "FP8" below): each callable's
  ** warmup and capture run under an FP8 autocast with fp8_recipe and
  ** fp8_group where its fp8_enabled flag is set, and graphing leaves every
  ** module's FP8 state as it was. With fp8_weight_caching each graphed call
  ** must say first gcap_module_set_is_first_microbatch: true quantizes the
  ** weights afresh into their cached FP8 copies, false uses the copies. */
  const int *fp8_enabled;                   /* NULL: none; else one flag per callable */
  const struct gcap_fp8_recipe *fp8_recipe; /* NULL: DelayedScaling's defaults */
  gcap_dist_group *fp8_group;               /* NULL: no amax reduction */
  int fp8_weight_caching;                   /* 0; needs fp8_enabled for some callable */
} gcap_graphed_opts;

/* Fill *o with the defaults above (nothing for o NULL). */
void gcap_graphed_opts_init(gcap_graphed_opts *o);

/* Graph `callables` (modules; all in training or all in eval mode, with no
** module hooks registered) from sample arguments: entry i takes nargs[i]
** tensors args[i][0..nargs[i]). Without an order there is one entry per
** callable; with one, chunks x microbatches x layers (docs/semantics.md,
** "order"). On success *out holds one replayable entry per sample_args entry,
** and without an order gcap_module_call of each callable in the mode it was
** graphed in replays its entry while *out lives (a module graphed in both
** modes replays the graph of its mode at each call); on failure modules,
** .grad values, the generator and pools are as before. e NULL: GCAP_EINVAL. */
gcap_status gcap_make_graphed_callables(gcap_engine *e, int ncallables,
                                        gcap_module *const *callables, int nentries,
                                        const int *nargs, gcap_tensor *const *const *args,
                                        const gcap_graphed_opts *opts, gcap_graphed **out);
/* Another reference (NULL for NULL); the entries' count (0 for NULL). The
** calls below on a NULL g return GCAP_EINVAL with no message, and an entry
** that is none (entry < 0 or >= the count) is GCAP_EINVAL naming it. */
gcap_graphed *gcap_graphed_retain(gcap_graphed *g);
void gcap_graphed_free(gcap_graphed *g);
int gcap_graphed_num_entries(const gcap_graphed *g);
/* The module entry i was captured from; NULL for a bad g or entry. */
gcap_module *gcap_graphed_module(const gcap_graphed *g, int entry);
/* Replay entry i's forward: copy inputs whose address differs from the
** static ones, launch, and return a view of the static output (valid until
** the next replay; with reuse_graph_input_output_buffers, until another
** entry's graph writes its memory, after which any access to it is
** GCAP_ESTATE) whose backward replays the backward graph. That backward
** is GCAP_ESTATE, naming the entry and the call, after a later call of the
** entry (it overwrote the activations), for a second backward of the call
** without retain_graph_in_backward, and when a static input, a parameter or
** a static output the backward graph reads was written since the call. The
** inputs must have the captured count, shapes and dtypes (GCAP_EINVAL names
** the argument and both shapes otherwise); an input that needed no grad at
** capture gets none from that backward, as in TE. An entry one of whose
** static inputs or module's parameters moved since graphing (other storage,
** dtype or shape) is GCAP_ESTATE, naming it. A module whose training flag, or a submodule's,
** differs from capture time runs eagerly instead. */
gcap_status gcap_graphed_call(gcap_graphed *g, int entry, int nin, gcap_tensor *const *in,
                              gcap_tensor **out);
/* How many outputs entry i's callable gave at capture (absent ones
** included); -1 for a bad g or entry. */
int gcap_graphed_num_outputs(const gcap_graphed *g, int entry);
/* Replay entry i's forward as gcap_graphed_call does, for any number of
** outputs: out[0..n-1] (n = gcap_graphed_num_outputs, *nout set to it) are
** views of the static outputs, NULL where the capture's output was absent.
** Each output that required grad at capture has its own static grad buffer;
** one backward takes the grads of all of them (zeros for those whose grad did
** not arrive), as TE's; an output that required none gets no grad buffer and
** passes no grad back. n > maxout (the room in out) is GCAP_EINVAL.
** gcap_graphed_call is this call for an entry of one output (an entry of
** several is refused with GCAP_EINVAL). */
gcap_status gcap_graphed_call_n(gcap_graphed *g, int entry, int nin, gcap_tensor *const *in,
                                int maxout, int *nout, gcap_tensor **out);
/* TransformerEngine's replay options of a graphed call, cuda_graph_stream
** and cuda_graph_event. With a stream other than the current one, the
** inputs are copied in on the current stream, the stream waits for the
** current stream's work, the graph replays on it, and the current stream
** then waits on the event (an external event that the graph records,
** gcap_event_new_external, recorded by the callable at capture: work after
** the call overlaps the graph's work after the event) or, without one, on
** all the stream's work. The call's backward replays its graph the same
** way, with the same stream and event (on the whole stream when the
** backward graph does not record the event); the engine keeps both until
** then. With no stream, or the current one, the graph replays on the
** current stream. */
typedef struct gcap_replay_opts {
  gcap_stream *stream; /* NULL: the current stream */
  gcap_event *event;   /* NULL: wait for all of stream's work */
} gcap_replay_opts;
/* gcap_graphed_call_n with replay options (opts NULL: none). The stream and
** event must be this engine's, and an event external and recorded by the
** entry's forward graph (GCAP_EINVAL names the option otherwise); options
** for a call that runs eagerly (a module in another mode than at capture)
** are GCAP_EINVAL. */
gcap_status gcap_graphed_call_opts(gcap_graphed *g, int entry, const gcap_replay_opts *opts,
                                   int nin, gcap_tensor *const *in, int maxout, int *nout,
                                   gcap_tensor **out);
/* Replay entry i's delayed-wgrad graph and accumulate into .grad (no-op
** when the entry has none). */
gcap_status gcap_graphed_backward_dw(gcap_graphed *g, int entry);
/* Free entry i's graphs and drop its static buffers (inputs, outputs,
** grads), which go back to the pool while g lives; calling it afterwards,
** or the backward of a call made before, is GCAP_ESTATE. */
gcap_status gcap_graphed_reset(gcap_graphed *g, int entry);
/* Stats of entry i's graphs (bwd/dw zeroed when absent: has_bwd, has_dw). */
typedef struct gcap_graphed_stats {
  gcap_graph_stats fwd, bwd, dw;
  int has_bwd, has_dw;
  size_t pool_reserved_bytes;
  int num_outputs;      /* the callable's outputs at capture, absent ones included */
  int num_grad_outputs; /* those with a static grad buffer (they required grad) */
} gcap_graphed_stats;
gcap_status gcap_graphed_get_stats(gcap_graphed *g, int entry, gcap_graphed_stats *out);

/* ------------------------------------------------------------------------ */
/* Seeing what was captured and what ran                                     */

/* Write the captured graph g as Graphviz DOT to the file `path` (replaced).
** cuda: CUDA's own description of the graph (cudaGraphDebugDotPrint, every
** node with its parameters); host: the recorded launches in order, each with
** its kernel, the op that launched it and where (the module path of a
** forward, "Sequential.0 (Linear)", or the node whose backward ran it), its
** constants, and the memory it reads and writes (pool blocks and offsets)
** with the shape and dtype of the tensor there, edges in stream order plus
** the forks and joins of streams. GCAP_ESTATE when g is not captured (never, reset, or capturing);
** GCAP_EINVAL naming the path and the system's reason when it cannot be
** written. Render with `dot -Tsvg file.dot -o file.svg`. */
gcap_status gcap_graph_debug_dump(gcap_graph *g, const char *path);

/* Dump every graph entry i of g has, as gcap_graph_debug_dump does, to
** "<prefix>.fwd.dot", "<prefix>.bwd.dot" and "<prefix>.bwd_dw.dot" (the
** backward and delayed-wgrad graphs only when the entry has them). */
gcap_status gcap_graphed_debug_dump(gcap_graphed *g, int entry, const char *prefix);

/* Trace the engine's work into the file `path` as Chrome trace-event JSON
** (open it in Perfetto, ui.perfetto.dev, or chrome://tracing): one span per
** make_graphed_callables, warmup, warmup iteration, warmup forward and
** backward of each entry, capture and instantiate of each graph, call of a
** capture-time hook (named by its group, index and callable) and of the
** pre/post warmup hooks, graph replay, and graphed forward, backward and
** backward_dw call. Times are microseconds of a monotonic clock. Events are
** written as they happen (constant memory). On cuda the same spans are also
** NVTX ranges, trace or no trace, whenever a profiler listens (Nsight
** Systems sets NVTX_INJECTION64_PATH); with none, no range is made.
** GCAP_ESTATE when a trace is already open; GCAP_EINVAL naming the path and
** the reason when the file cannot be written. e NULL: GCAP_EINVAL. */
gcap_status gcap_trace_start(gcap_engine *e, const char *path);

/* Finish the trace: close the JSON and the file. GCAP_OK when no trace is
** open; GCAP_EINVAL when writing the file failed (or e is NULL).
** gcap_engine_free stops an open trace, so the file is complete whenever the
** engine is released. */
gcap_status gcap_trace_stop(gcap_engine *e);

/* ------------------------------------------------------------------------ */
/* Tensors: contiguous, 0-D to 4-D, refcounted storage; views share storage.
** Each call below on tensors returns GCAP_EINVAL, with no message, when all
** of its tensor arguments are NULL (a NULL one beside another is told to the
** other's engine); the constructors do when e is NULL.                     */

/* A new uninitialised tensor of `shape` (ndim entries, each >= 0), allocated
** on the current stream (in the capture's pool while capturing). */
gcap_status gcap_tensor_empty(gcap_engine *e, gcap_dtype dt, int ndim, const int64_t *shape,
                              gcap_tensor **out);

/* A new tensor filled with `v`. */
gcap_status gcap_tensor_full(gcap_engine *e, gcap_dtype dt, int ndim, const int64_t *shape,
                             double v, gcap_tensor **out);

/* A new tensor holding numel(shape) floats copied from host memory `data`.
** A synchronous upload: refused while capturing. */
gcap_status gcap_tensor_from_f32(gcap_engine *e, gcap_dtype dt, int ndim, const int64_t *shape,
                                 const float *data, gcap_tensor **out);

/* A new tensor of uniform [0, 1) (normal = 0) or standard normal (normal = 1)
** numbers drawn from the engine's generator, which advances. */
gcap_status gcap_tensor_rand(gcap_engine *e, gcap_dtype dt, int ndim, const int64_t *shape,
                             int normal, gcap_tensor **out);

/* Take another reference; returns t (NULL for NULL). */
gcap_tensor *gcap_tensor_retain(gcap_tensor *t);

/* Drop a reference. NULL is fine. */
void gcap_tensor_free(gcap_tensor *t);

/* The getters of a NULL tensor give NULL, 0 or GCAP_F32. */
gcap_engine *gcap_tensor_engine(const gcap_tensor *t);
int gcap_tensor_ndim(const gcap_tensor *t);
/* The shape (gcap_tensor_ndim entries), owned by the tensor. */
const int64_t *gcap_tensor_shape(const gcap_tensor *t);
int64_t gcap_tensor_numel(const gcap_tensor *t);
gcap_dtype gcap_tensor_dtype(const gcap_tensor *t);
/* The device address of the first element, for identity checks. */
uintptr_t gcap_tensor_data_ptr(const gcap_tensor *t);
/* The version of t's storage (PyTorch's _version), shared by its views and
** detached copies: every write into it counts, in-place ops (copy_, zero_,
** fill_, optimizer steps, .grad accumulation) included. Autograd notes it
** for each tensor it saves; a backward finding a saved tensor at another
** version fails with GCAP_ESTATE ("modified by an inplace operation").
** Graph replays do not count (their outputs are overwritten by design). 0
** for t NULL. */
uint64_t gcap_tensor_version(const gcap_tensor *t);
/* Set the version of t's storage to v, refused while capturing. Only for
** code that wrote back the very values a backward saved (a sharded
** parameter gathered again between its forward and backward): the saved
** tensors then pass the version check. Any other use hides a real write. */
gcap_status gcap_tensor_set_version(gcap_tensor *t, uint64_t v);
/* Make t a tensor over src's storage (PyTorch's set_): t keeps its shape,
** grad and identity, its old storage is released (views of it keep it),
** and from then on its elements are src's elements offset .. offset +
** numel(t) - 1, at their address. src must have t's dtype and at least
** offset + numel(t) elements; refused while capturing. */
gcap_status gcap_tensor_set_(gcap_tensor *t, gcap_tensor *src, int64_t offset);

/* Copy the tensor to host memory as n = numel floats; waits for the data.
** Refused while capturing (a read-back synchronizes). */
gcap_status gcap_tensor_read(gcap_tensor *t, float *dst, size_t n);

/* The raw bytes of t's elements as the device stores them: numel x 4 for
** f32, numel x 2 for bf16 (the top half of the f32 bits), little-endian, in
** row-major order; n must be that size. read_bytes copies them to dst and
** waits for the data; write_bytes overwrites t's elements in place from src
** (t keeps its storage, so graphs captured on it stay valid; an in-place
** write: its storage's version counts it, autograd records nothing). No
** conversion: a bf16 value goes to and from the host bit for bit. Both
** refused while capturing. */
gcap_status gcap_tensor_read_bytes(gcap_tensor *t, void *dst, size_t n);
gcap_status gcap_tensor_write_bytes(gcap_tensor *t, const void *src, size_t n);

/* A view of t with another shape of the same numel; shares storage. */
gcap_status gcap_tensor_view(gcap_tensor *t, int ndim, const int64_t *shape, gcap_tensor **out);

/* A new tensor with a copy of t's data; autograd records it, passing the
** grad on to t (PyTorch's clone). */
gcap_status gcap_tensor_clone(gcap_tensor *t, gcap_tensor **out);

/* Shape ops. Tensors have no strides: each result is a contiguous copy, and
** its grad flows back through the inverse copy. Dims count from 0; a negative
** dim counts from the end (-1 is the last). */

/* out's dim d is t's dim perm[d] (perm: t's ndim entries, each dim once). */
gcap_status gcap_permute(gcap_tensor *t, const int *perm, gcap_tensor **out);
/* t with dims d0 and d1 swapped. */
gcap_status gcap_transpose(gcap_tensor *t, int d0, int d1, gcap_tensor **out);
/* Entry `index` (from 0; a negative index counts from the end) of t's first
** dim: a view (t's storage at an offset, not a copy) of t's other dims,
** recorded by autograd as a view (its grad goes into that entry of t's). */
gcap_status gcap_select(gcap_tensor *t, int64_t index, gcap_tensor **out);
/* Entries start .. start + length - 1 of dim `dim`. */
gcap_status gcap_narrow(gcap_tensor *t, int dim, int64_t start, int64_t length, gcap_tensor **out);
/* Split dim `dim` into pieces of `size` entries (the last may be shorter):
** *n pieces (ceil(size of dim / size); none for a dim of size 0) into
** outs[0 .. *n - 1], each a narrow of t. cap is the room in outs; too little
** room is GCAP_EINVAL, with nothing made. */
gcap_status gcap_split(gcap_tensor *t, int64_t size, int dim, int cap, gcap_tensor **outs, int *n);
/* Split dim `dim` into at most `chunks` pieces of ceil(size / chunks) entries
** (PyTorch's chunk: fewer when the sizes do not fill them), as gcap_split. */
gcap_status gcap_chunk(gcap_tensor *t, int chunks, int dim, int cap, gcap_tensor **outs, int *n);
/* The most tensors one gcap_cat joins. */
#define GCAP_CAT_MAX 64
/* ts[0 .. n - 1] joined along dim `dim`: one engine and dtype, equal sizes
** in every other dim. n < 1, ts NULL or every ts[i] NULL: GCAP_EINVAL with no
** message; else the engine of the first tensor hears of what is wrong. */
gcap_status gcap_cat(int n, gcap_tensor *const *ts, int dim, gcap_tensor **out);

/* In place: dst = src (same numel; it converts dtypes), t = 0, t = v. While
** grad is recorded and the written tensor (or src) requires grad, autograd
** records the write (PyTorch's CopyBackwards, FillBackward): src gets the
** grad, the written tensor's history before the write zeros; into a view
** such a write is GCAP_EINVAL, nothing written. */
gcap_status gcap_copy_(gcap_tensor *dst, gcap_tensor *src);
gcap_status gcap_zero_(gcap_tensor *t);
gcap_status gcap_fill_(gcap_tensor *t, double v);

/* Elementwise ops into a new tensor. Binary ops accept equal shapes, a 0-D or
** one-element operand, or a row matching the other's last dimension. */
gcap_status gcap_add(gcap_tensor *a, gcap_tensor *b, gcap_tensor **out);
gcap_status gcap_sub(gcap_tensor *a, gcap_tensor *b, gcap_tensor **out);
gcap_status gcap_mul(gcap_tensor *a, gcap_tensor *b, gcap_tensor **out);
/* a / b; a to the power b (pow in double, rounded; PyTorch's grads: none
** through b = 0 into a, none through a = 0 with b >= 0 into b). */
gcap_status gcap_div(gcap_tensor *a, gcap_tensor *b, gcap_tensor **out);
gcap_status gcap_pow(gcap_tensor *a, gcap_tensor *b, gcap_tensor **out);
/* a OP b as a mask: an f32 tensor of 1 where it holds, 0 elsewhere (also
** for bf16 operands), which records no autograd (PyTorch's lt, le, gt, ge,
** eq, ne, whose results are bool). */
gcap_status gcap_compare(gcap_tensor *a, gcap_tensor *b, gcap_cmp op, gcap_tensor **out);
gcap_status gcap_scale(gcap_tensor *a, double s, gcap_tensor **out);
gcap_status gcap_neg(gcap_tensor *a, gcap_tensor **out);
/* Reductions over all elements into a 0-D tensor. */
gcap_status gcap_sum(gcap_tensor *a, gcap_tensor **out);
gcap_status gcap_mean(gcap_tensor *a, gcap_tensor **out);

/* Matrix product [..., m, k] x [..., k, n] -> [..., m, n]: 2-D to 4-D
** operands whose batch dims (those before the last two, right-aligned)
** are equal or 1 in one of them (broadcast, its grad summed over them). */
gcap_status gcap_matmul(gcap_tensor *a, gcap_tensor *b, gcap_tensor **out);
/* y = x W^T + b: x [..., in], w [out, in], b [out] or NULL -> [..., out]. */
gcap_status gcap_linear(gcap_tensor *x, gcap_tensor *w, gcap_tensor *b, gcap_tensor **out);
/* gelu(linear(x, w, b)) as one op: one GEMM whose epilogue adds the bias and
** applies the gelu, keeping the pre-activation for backward, whose bias grad
** comes out of the gelu's backward pass. The values of the two ops (bitwise
** on the host); a Sequential runs a hook-free Linear and GELU pair this way. */
gcap_status gcap_linear_gelu(gcap_tensor *x, gcap_tensor *w, gcap_tensor *b, gcap_tensor **out);
gcap_status gcap_relu(gcap_tensor *x, gcap_tensor **out);
/* GELU, tanh approximation. */
gcap_status gcap_gelu(gcap_tensor *x, gcap_tensor **out);
/* Normalize over the last dimension n; w and b ([n]) may be NULL. */
gcap_status gcap_layer_norm(gcap_tensor *x, gcap_tensor *w, gcap_tensor *b, double eps,
                            gcap_tensor **out);
/* Softmax over dimension dim, which must be the last (-1 or ndim - 1). */
gcap_status gcap_softmax(gcap_tensor *x, int dim, gcap_tensor **out);
/* How a mask of softmax or attention is read: added to the scores
** (GCAP_MASK_ADD: 0 keeps, -inf masks out), or a boolean where nonzero masks
** out (GCAP_MASK_BOOL, TransformerEngine's convention for attention masks). */
typedef enum gcap_mask_kind { GCAP_MASK_ADD = 0, GCAP_MASK_BOOL = 1 } gcap_mask_kind;
/* Softmax over the last dim of z = scale * x (|scale| <= FLT_MAX: the
** kernels take it as a float), then the mask (NULL: none)
** read as `kind` and broadcast over x (at most x's dims, each equal or 1,
** aligned at the last; f32 or bf16 whatever x's dtype), then, when causal,
** column j > row i of each [.., i, j] matrix of the last two dims masked out
** (the upper-left triangle kept, PyTorch's is_causal). A row with every
** column masked out is all zeros (its grads too). The mask gets no grad. */
gcap_status gcap_softmax_masked(gcap_tensor *x, double scale, gcap_tensor *mask,
                                gcap_mask_kind kind, int causal, gcap_tensor **out);
/* How attention runs. The composition (matmul, softmax, dropout, matmul,
** each its own op and node) keeps the weights [..., Sq, Sk] for its
** backward; the fused kernels (GCAP_SDPA_FUSED, head dims up to
** GCAP_SDPA_FUSED_DMAX) keep two floats a row and recompute the weights
** tile by tile, and on the host equal the composition bit for bit in f32;
** GCAP_SDPA_CUDNN is cuDNN's fused flash attention on the cuda backend
** (bf16, no dropout, no attn_mask or causal, D = Dv a multiple of 8 up to
** 128, libcudnn loaded at run time; keeps one float a row; its backward
** deterministic), an error naming the case or the library where it cannot
** run. GCAP_SDPA_AUTO takes cuDNN where it runs, the composition elsewhere
** (the host always: the reference). docs/lua-api.md has the details. */
typedef enum gcap_sdpa_impl {
  GCAP_SDPA_AUTO = 0,
  GCAP_SDPA_COMPOSED = 1,
  GCAP_SDPA_FUSED = 2,
  GCAP_SDPA_CUDNN = 3
} gcap_sdpa_impl;
/* The options of gcap_scaled_dot_product_attention; all zeros (or NULL
** options) are the defaults. */
typedef struct gcap_sdpa_opts {
  gcap_tensor *attn_mask;   /* NULL, or a mask over the scores [..., Sq, Sk] as softmax's */
  gcap_mask_kind mask_kind; /* how attn_mask is read */
  int is_causal;            /* key j > query i masked out (the upper-left triangle kept) */
  double dropout_p;         /* dropout on the attention weights, in [0, 1) */
  double scale;             /* of the scores, positive, at most FLT_MAX; 0: 1 / sqrt(D) */
  gcap_sdpa_impl impl;      /* which implementation */
} gcap_sdpa_opts;
/* Attention softmax(scale q k^T + mask, causal) v with dropout on the
** weights: q [..., Sq, D], k [..., Sk, D], v [..., Sk, Dv] (2-D to 4-D, equal
** batch dims, D >= 1 for every impl) -> [..., Sq, Dv]. Grads for q, k and v. The dropout draws from
** the engine's generator as gcap_dropout over the weights [..., Sq, Sk]. */
gcap_status gcap_scaled_dot_product_attention(gcap_tensor *q, gcap_tensor *k, gcap_tensor *v,
                                              const gcap_sdpa_opts *opts, gcap_tensor **out);
/* out = t where the mask (broadcast over t as softmax's) is 0, `value`
** where it is nonzero; the filled elements get no grad, the mask none. */
gcap_status gcap_masked_fill(gcap_tensor *t, gcap_tensor *mask, double value, gcap_tensor **out);
/* Zero each element with probability p and scale the rest by 1/(1-p) when
** training; the identity otherwise. Masks come from the engine's generator. */
gcap_status gcap_dropout(gcap_tensor *x, double p, int training, gcap_tensor **out);
/* Rows of weight [rows, dim] looked up by ids (0-D to 3-D, integers held as
** f32 numbers whatever weight's dtype) into ids' shape + [dim]. An id that is
** no row (1.5, NaN, -1, rows) is refused (GCAP_EINVAL, naming it): outside
** capture the ids are read back and checked, which waits for them; inside a
** capture they cannot be, and such an id's row is NaN (its grad dropped).
** The weight's grad adds each id's row grads in the order of the ids, with
** no atomics: the same bits at every run. */
gcap_status gcap_embedding(gcap_tensor *ids, gcap_tensor *weight, gcap_tensor **out);
/* mean((input - target)^2) into a 0-D tensor. */
gcap_status gcap_mse_loss(gcap_tensor *input, gcap_tensor *target, gcap_tensor **out);
/* Mean cross entropy of logits [N, C] against target [N] (class indices
** held as floats) into a 0-D tensor. A target that is not an integer in
** 0..C-1 (1.5, NaN, -1, C) is refused (GCAP_EINVAL, naming it): outside
** capture the targets are read back and checked, which waits for them;
** inside a capture they cannot be, and such a row's loss and grads are NaN. */
gcap_status gcap_cross_entropy(gcap_tensor *logits, gcap_tensor *target, gcap_tensor **out);

/* ------------------------------------------------------------------------ */
/* Autograd. Ops on tensors that require grad record how to differentiate
** them; gcap_backward runs those records in reverse topological order and
** accumulates into the .grad of leaves. As for the tensor ops, a call whose
** tensors are all NULL returns GCAP_EINVAL with no message.                */

/* Mark a leaf as requiring grad (or not). Refused on non-leaves. */
gcap_status gcap_tensor_set_requires_grad(gcap_tensor *t, int on);
/* 0 for t NULL, as gcap_tensor_is_leaf. */
int gcap_tensor_requires_grad(const gcap_tensor *t);
/* 1 for tensors not produced by a recorded op. */
int gcap_tensor_is_leaf(const gcap_tensor *t);
/* The accumulated gradient of a leaf (borrowed; NULL when none, or t NULL). */
gcap_tensor *gcap_tensor_grad(const gcap_tensor *t);
/* Replace (grad != NULL: same engine, shape and dtype) or clear (NULL) the
** gradient. */
gcap_status gcap_tensor_set_grad(gcap_tensor *t, gcap_tensor *grad);
/* The name of the op that produced t ("mul", "linear", ...), or NULL (t NULL too). */
const char *gcap_tensor_grad_fn_name(const gcap_tensor *t);
/* A new tensor sharing t's storage, cut from the autograd graph. */
gcap_status gcap_tensor_detach(gcap_tensor *t, gcap_tensor **out);

/* Backpropagate from t. grad: the gradient of t (NULL: t must have one
** element, grad 1). Without retain_graph, saved tensors are freed and a second
** backward through the same ops is an error. */
gcap_status gcap_backward(gcap_tensor *t, gcap_tensor *grad, int retain_graph);

/* Turn recording on or off; returns the previous setting (0, and nothing
** set, for e NULL; gcap_is_grad_enabled(NULL) is 0). */
int gcap_set_grad_enabled(gcap_engine *e, int on);
int gcap_is_grad_enabled(const gcap_engine *e);

/* Custom autograd nodes: an op the caller composed of graphcap calls, with a
** backward of its own (PyTorch's autograd.Function). The caller runs the
** forward with recording off (gcap_set_grad_enabled(e, 0)), then records
** the node on its result.
**
** The backward gets the saved tensors (checked first: one written in place
** since it was saved is an error naming the node, as for built-in ops), the
** grad of the output, and grad_in[nin], all NULL: it sets grad_in[i] to a
** new reference (the input's shape and dtype) or leaves it NULL (no grad).
** It runs with recording off, in the capture when the backward is captured,
** so it must launch its work through graphcap calls. Grads of inputs that
** need none (NULL inputs included) are dropped; a grad of another shape or
** dtype than a tensor input's, or a status
** other than GCAP_OK, fails the backward (the callback may set no message:
** one naming the node is given). */
typedef gcap_status (*gcap_autograd_backward)(void *ud, int nsaved, gcap_tensor *const *saved,
                                              gcap_tensor *grad_out, int nin,
                                              gcap_tensor **grad_in);

/* Attach `result`, computed from in[nin] (NULL entries: inputs that are no
** tensors), to the autograd graph as the output of node `name` (1 to 63
** bytes, its grad_fn; a longer one is GCAP_EINVAL): *out is a
** new tensor sharing result's storage whose grad_fn is the node when grad
** is enabled and an input requires grad (else a plain tensor). save[nsave]
** (at most 6) are kept for bw with their storage's version. ud is handed to
** bw; ud_free (may be NULL) is called on it once the node is gone, and at
** once when no node is recorded or on failure. Errors go to result's
** engine; result NULL is GCAP_EINVAL with no message. */
gcap_status gcap_autograd_record(const char *name, gcap_tensor *result, int nin,
                                 gcap_tensor *const *in, int nsave, gcap_tensor *const *save,
                                 gcap_autograd_backward bw, void *ud, void (*ud_free)(void *ud),
                                 gcap_tensor **out);

/* A new tensor sharing t's storage that, while grad is enabled, requires
** grad as the output of a node "anchor" with no inputs (else a plain
** tensor): given to gcap_autograd_record as an input, it makes the node
** record when no other input requires grad, and a grad the node gives it
** goes nowhere. Unlike t itself it is no edge into t's grad: a leaf's .grad
** gets its grads once all its edges ran, so an edge from the node would hold
** it back until the node's backward. t NULL: GCAP_EINVAL with no message. */
gcap_status gcap_autograd_anchor(gcap_tensor *t, gcap_tensor **out);

/* ------------------------------------------------------------------------ */
/* Modules: a forward function with named parameters (in registration
** order, then the children's, prefixed "child."), buffers, children, a
** training flag, and four hook lists run around each call.                 */

/* A module's forward: one tensor out (a new reference in *out). */
typedef gcap_status (*gcap_forward_fn)(void *ud, gcap_module *m, int nin, gcap_tensor *const *in,
                                       gcap_tensor **out);

/* The most outputs one call of a module may have. */
#define GCAP_MAX_OUTPUTS 64

/* A forward of several outputs: it sets *nout (0..GCAP_MAX_OUTPUTS) and
** out[0..*nout-1], each a new reference or NULL (an absent output, as a
** Python callable's None); out has room for GCAP_MAX_OUTPUTS. A forward
** that fails holds no references in out (whatever *nout says). */
typedef gcap_status (*gcap_forward_n_fn)(void *ud, gcap_module *m, int nin, gcap_tensor *const *in,
                                         int *nout, gcap_tensor **out);

/* A module hook is of one of the four kinds of gcap_hook_kind
** (make_graphed_callables, above). */

/* Where a running hook's gcap_hook_return puts its values (the engine's). */
typedef struct gcap_hook_ret gcap_hook_ret;

/* What a module hook sees: the current values, which an earlier hook of the
** same kind may have replaced (gcap_hook_return). The "tensor outputs" of a
** call are its outputs that are not absent, in order; its inputs are all
** tensors. As PyTorch's full backward hooks, the backward hooks of one call
** see the grads of all its tensor outputs at once, and the backward hooks
** the grads of all its inputs at once. */
typedef struct gcap_hook_args {
  gcap_hook_kind kind;
  int nin;
  gcap_tensor *const *in; /* forward hooks: the inputs */
  int nout;
  gcap_tensor *const *out; /* forward hook: the outputs, NULL where absent */
  int ngrad_out;
  gcap_tensor *const *grad_out; /* backward hooks: one per tensor output, NULL: no grad */
  int ngrad_in;
  gcap_tensor *const *grad_in; /* backward hook: one per input, NULL: no grad */
  gcap_hook_ret *ret;          /* for gcap_hook_return; not for the hook to touch */
} gcap_hook_args;

/* A module hook; a non-OK status stops the call (or the backward). It
** observes, or replaces values by calling gcap_hook_return before it
** returns GCAP_OK (what a PyTorch hook does by returning them). */
typedef gcap_status (*gcap_module_hook)(void *ud, gcap_module *m, const gcap_hook_args *a);

/*
** Return values from a running module hook, as a PyTorch hook returns them:
** call it inside the hook with the hook's own `a`; the n tensors t[0..n)
** are retained (the caller keeps its references), and a second call in the
** same hook replaces the first. A hook that does not call it keeps the
** values. By a->kind, the tensors replace:
**   GCAP_HOOK_FORWARD_PRE   the inputs: n >= 0 tensors, what the forward
**                           (and the later hooks) get in their place;
**   GCAP_HOOK_FORWARD       the outputs, whole: 0..GCAP_MAX_OUTPUTS tensors,
**                           NULL where absent, what the call returns;
**   GCAP_HOOK_BACKWARD_PRE  grad_out: n = ngrad_out, each NULL (no grad) or
**                           of its output's shape and dtype, the grads the
**                           module's backward (and its backward hooks) get;
**   GCAP_HOOK_BACKWARD      grad_in: n = ngrad_in, each NULL (no grad) or of
**                           its input's shape and dtype, the grads the inputs
**                           get; an input that needs no grad takes NULL only.
** Each later hook of the same kind sees the values the one before returned.
** They are checked at once and again when the hook returns: a wrong count,
** a NULL where a tensor is needed, a tensor of another engine, a grad of
** another shape or dtype or for an input that needs none returns
** GCAP_EINVAL with a message naming the module type, the hook kind, the
** entry, what was expected and what was returned, and fails the call (or
** the backward) even if the hook then returns GCAP_OK; the module is left
** as it was. Returns GCAP_EINVAL when `a` is not the argument of a running
** hook (NULL, or a->ret NULL: no engine to tell, so no message), n < 0, or t
** is NULL with n > 0; GCAP_ENOMEM. */
gcap_status gcap_hook_return(const gcap_hook_args *a, int n, gcap_tensor *const *t);

/* A module of type name `type` whose forward is fwd(ud, ...). ud_free (may be
** NULL) is called on ud when the module is freed. e NULL: GCAP_EINVAL. Every
** call below on a NULL module returns GCAP_EINVAL with no message (one that
** adds a tensor or child tells its engine), and the getters of a NULL
** module give 0, NULL or "". */
gcap_status gcap_module_new(gcap_engine *e, const char *type, gcap_forward_fn fwd, void *ud,
                            void (*ud_free)(void *), gcap_module **out);
/* The same, for a forward of several outputs (gcap_forward_n_fn). */
gcap_status gcap_module_new_n(gcap_engine *e, const char *type, gcap_forward_n_fn fwd, void *ud,
                              void (*ud_free)(void *), gcap_module **out);
gcap_module *gcap_module_retain(gcap_module *m);
void gcap_module_free(gcap_module *m);
const char *gcap_module_type(const gcap_module *m);
void *gcap_module_userdata(const gcap_module *m);

/* Register a parameter (t is retained and marked requires_grad), a buffer
** (retained; not a parameter) or a child. Names are unique per module. */
gcap_status gcap_module_add_parameter(gcap_module *m, const char *name, gcap_tensor *t);
gcap_status gcap_module_add_buffer(gcap_module *m, const char *name, gcap_tensor *t);
gcap_status gcap_module_add_child(gcap_module *m, const char *name, gcap_module *child);
/* Whether m's own buffer `name` belongs in m's state dict (PyTorch's
** `persistent`): a buffer is persistent when registered; a non-persistent
** one (Linear's main_grad) is state a checkpoint leaves out. Setting it on
** a name that is not a buffer of m itself is GCAP_EINVAL; the getter gives
** 1, 0, or -1 for no such buffer (or m or name NULL). */
gcap_status gcap_module_set_buffer_persistent(gcap_module *m, const char *name, int persistent);
int gcap_module_buffer_persistent(const gcap_module *m, const char *name);

/* Parameters of m and its children, depth first, each tensor (and each
** module) once under the first name it is reached by: count, then the i-th
** with its dotted name copied into name[n] (may be NULL). Borrowed tensor;
** NULL for an i out of range. */
int gcap_module_num_parameters(const gcap_module *m);
gcap_tensor *gcap_module_parameter(const gcap_module *m, int i, char *name, size_t n);
/* Buffers of m and its children, the same way. */
int gcap_module_num_buffers(const gcap_module *m);
gcap_tensor *gcap_module_buffer(const gcap_module *m, int i, char *name, size_t n);
/* Direct children (NULL, *name untouched, for an i out of range). */
int gcap_module_num_children(const gcap_module *m);
gcap_module *gcap_module_child(const gcap_module *m, int i, const char **name);

/* Set training (on = 1) or eval mode on m and its children. */
void gcap_module_train(gcap_module *m, int on);
int gcap_module_training(const gcap_module *m);

/* Add a hook; *id (may be NULL) identifies it for gcap_module_remove_hook.
** Hooks of one kind run in registration order; one registered while hooks
** of its kind run (by one of them) runs from the next call on, one removed
** meanwhile no longer runs. */
gcap_status gcap_module_register_hook(gcap_module *m, gcap_hook_kind kind, gcap_module_hook fn,
                                      void *ud, void (*ud_free)(void *), int *id);
gcap_status gcap_module_remove_hook(gcap_module *m, int id);
/* Hooks of one kind registered on m itself (0 for a kind that is none). */
int gcap_module_num_hooks(const gcap_module *m, gcap_hook_kind kind);

/* Call m: forward-pre hooks, forward, forward hooks; backward hooks are
** attached to the autograd graph. The forward must give one tensor: a module
** of several outputs (or an absent one) is refused with GCAP_EINVAL. */
gcap_status gcap_module_call(gcap_module *m, int nin, gcap_tensor *const *in, gcap_tensor **out);
/* Call m as gcap_module_call does, for any number of outputs: *nout is set
** to their count and out[0..*nout-1] to new references, NULL where an
** output is absent. More outputs than maxout (the room in out), as the
** forward hooks leave them, is GCAP_EINVAL. */
gcap_status gcap_module_call_n(gcap_module *m, int nin, gcap_tensor *const *in, int maxout,
                               int *nout, gcap_tensor **out);
/* gcap_module_call_n of a module graphed in place (make_graphed_callables
** without an order) with the replay options of its graphed call
** (gcap_replay_opts; NULL: none); options for a call that does not replay
** (m not graphed in its mode) are GCAP_EINVAL. */
gcap_status gcap_module_call_opts(gcap_module *m, const gcap_replay_opts *opts, int nin,
                                  gcap_tensor *const *in, int maxout, int *nout, gcap_tensor **out);
/* Clear (set_to_none) or zero the .grad of every parameter. */
gcap_status gcap_module_zero_grad(gcap_module *m, int set_to_none);
/* Compute the weight grads that delayed-wgrad Linears (in m or below) left
** pending, oldest first, accumulating into .grad (main_grad when fused).
** On failure what was applied stays applied and the rest stays pending, so
** a second call gives a clean call's grads; a failed gcap_backward takes
** back what it queued. */
gcap_status gcap_module_backward_dw(gcap_module *m);
/* Convert every parameter (and its .grad) and buffer of m and its children to
** dtype dt in place (the tensors stay the same objects). Outside capture. */
gcap_status gcap_module_to(gcap_module *m, gcap_dtype dt);
/* 1 when m or a child has a delayed-wgrad Linear. */
int gcap_module_has_delayed_wgrad(const gcap_module *m);

/* Built-in modules. Linear's weight and bias are drawn from U(-1/sqrt(in),
** 1/sqrt(in)) by the engine's generator. Linear's flags:
** GCAP_LINEAR_DELAY_WGRAD: its backward leaves the weight and bias grads to
**   gcap_module_backward_dw (TE's delay_wgrad_compute);
** GCAP_LINEAR_FUSE_WGRAD: the weight grad is accumulated by the weight-grad
**   GEMM itself (beta = 1) into the module's buffer "main_grad" ([out, in],
**   the weight's dtype, zeros at first) instead of weight.grad, which stays
**   NULL (TE's fuse_wgrad_accumulation); gcap_module_zero_grad zeroes it.
**   Optimizers read .grad: as with Megatron's main_grad, the caller hands it
**   over. Unlike TE's fp32 main_grad, it has the weight's dtype. It is not
**   persistent: a state dict leaves it out, as TE's holds no main_grad.
** Each constructor here and below, the transformer modules', returns
** GCAP_EINVAL with no message for e NULL. */
#define GCAP_LINEAR_DELAY_WGRAD 1u
#define GCAP_LINEAR_FUSE_WGRAD 2u
gcap_status gcap_nn_linear(gcap_engine *e, int64_t in, int64_t out, int bias, unsigned flags,
                           gcap_module **m);
gcap_status gcap_nn_relu(gcap_engine *e, gcap_module **m);
gcap_status gcap_nn_gelu(gcap_engine *e, gcap_module **m);
gcap_status gcap_nn_layer_norm(gcap_engine *e, int64_t n, double eps, gcap_module **m);
gcap_status gcap_nn_dropout(gcap_engine *e, double p, gcap_module **m);
/* Children named "0", "1", ... (as in PyTorch); each takes the previous output. */
gcap_status gcap_nn_sequential(gcap_engine *e, int n, gcap_module *const *mods, gcap_module **m);

/* Transformer modules, with TransformerEngine's names and parameter names.
** Inputs are [..., hidden] (TE's default layout [seq, batch, hidden] in
** particular); layer norms start at weight 1, bias 0; linear weights and
** biases are drawn as Linear's. A layer norm's eps (layernorm_epsilon)
** must be finite and >= 0 (GCAP_EINVAL otherwise).
**
** LayerNormLinear: linear(layer_norm(x)). Parameters layer_norm_weight,
** layer_norm_bias [in], weight [out, in], bias [out] (when `bias`). With
** return_layernorm_output, a call gives two outputs: y, then the layer
** norm's output (gcap_module_call_n). */
gcap_status gcap_nn_layer_norm_linear(gcap_engine *e, int64_t in, int64_t out, double eps, int bias,
                                      int return_layernorm_output, gcap_module **m);
/* LayerNormMLP: fc2(gelu(fc1(layer_norm(x)))), gelu's tanh approximation.
** Parameters layer_norm_weight, layer_norm_bias [hidden], fc1_weight
** [ffn_hidden, hidden], fc1_bias, fc2_weight [hidden, ffn_hidden], fc2_bias
** (biases when `bias`). With checkpoint, a call keeps only its input for
** backward (one node, "LayerNormMLP"), which runs the forward again to
** backpropagate through it; the parameters' values at backward are used. */
gcap_status gcap_nn_layer_norm_mlp(gcap_engine *e, int64_t hidden, int64_t ffn_hidden, double eps,
                                   int bias, int checkpoint, gcap_module **m);

/* The attention masks (TE's attn_mask_type): none, causal (a query sees
** the keys at and before its position), or an arbitrary mask given with
** each call. */
typedef enum gcap_attn_mask {
  GCAP_ATTN_NO_MASK = 0, /* "no_mask" */
  GCAP_ATTN_CAUSAL,      /* "causal" */
  GCAP_ATTN_ARBITRARY    /* "arbitrary" */
} gcap_attn_mask;

/* DotProductAttention: softmax(q k^T / sqrt(kv_channels) + mask) v, with
** dropout of p = attention_dropout on the attention weights in training.
** A call takes q, k, v [seq, batch, num_heads, kv_channels] (TE's "sbhd"),
** and with GCAP_ATTN_ARBITRARY a fourth input, the attention_mask: a
** tensor broadcast to [batch, num_heads, seq_q, seq_kv] whose nonzero
** entries mask a key out (TE's convention, True = masked); it gives
** [seq, batch, num_heads * kv_channels]. attn_impl picks the attention's
** implementation as gcap_sdpa_opts.impl does (GCAP_SDPA_FUSED takes
** kv_channels up to GCAP_SDPA_FUSED_DMAX). No parameters. */
gcap_status gcap_nn_dot_product_attention(gcap_engine *e, int num_heads, int64_t kv_channels,
                                          gcap_attn_mask mask, double attention_dropout,
                                          gcap_sdpa_impl attn_impl, gcap_module **m);

/* Options of MultiheadAttention and TransformerLayer (TE's names). */
typedef struct gcap_transformer_opts {
  gcap_attn_mask attn_mask_type; /* GCAP_ATTN_CAUSAL (TransformerLayer's self_attn_mask_type) */
  double attention_dropout;      /* 0.1 */
  double hidden_dropout;         /* 0.1; TransformerLayer: after attention and after the MLP */
  double layernorm_epsilon;      /* 1e-5 */
  int bias;                      /* 1: the linears have biases */
  int input_layernorm;           /* MultiheadAttention: 0; a layer norm before the qkv projection */
  gcap_sdpa_impl attn_impl;      /* GCAP_SDPA_AUTO: the core attention's implementation */
} gcap_transformer_opts;

/* Fill *o with the defaults above (nothing for o NULL). */
void gcap_transformer_opts_init(gcap_transformer_opts *o);

/* MultiheadAttention (self-attention) on x [seq, batch, hidden], with the
** attention_mask as a second input for GCAP_ATTN_ARBITRARY: children "qkv"
** (Linear(hidden, 3 hidden); "layernorm_qkv", a LayerNormLinear, with
** input_layernorm), whose output per head is q, k, v side by side (TE's
** interleaved layout), "core_attention" (DotProductAttention of hidden /
** num_heads channels) and "proj" (Linear(hidden, hidden)). o NULL: the
** defaults. hidden must be a multiple of num_heads. */
gcap_status gcap_nn_multihead_attention(gcap_engine *e, int64_t hidden, int num_heads,
                                        const gcap_transformer_opts *o, gcap_module **m);

/* TransformerLayer, pre-LN, on x [seq, batch, hidden] (and the
** attention_mask as a second input for GCAP_ATTN_ARBITRARY):
**   h = x + dropout(self_attention(x)), out = h + dropout(layernorm_mlp(h))
** with children "self_attention" (MultiheadAttention with input_layernorm)
** and "layernorm_mlp" (LayerNormMLP(hidden, ffn_hidden)); the dropouts are
** hidden_dropout, in training. o NULL: the defaults. */
gcap_status gcap_nn_transformer_layer(gcap_engine *e, int64_t hidden, int64_t ffn_hidden,
                                      int num_heads, const gcap_transformer_opts *o,
                                      gcap_module **m);

/* How an attention module (DotProductAttention, MultiheadAttention,
** TransformerLayer) ran its last call. */
typedef struct gcap_attn_stats {
  const char *impl; /* "cudnn", "fused" or "composed" (static); NULL before a first call, and
                       for modules that run no attention */
  int packed;       /* 1: cuDNN read q, k and v in place from the qkv projection (no copies) */
  char why[512];    /* why cuDNN did not run it, or why q, k and v were split; "" when neither */
} gcap_attn_stats;

/* Copy m's gcap_attn_stats into *out. GCAP_EINVAL for m or out NULL. */
gcap_status gcap_module_attention_stats(const gcap_module *m, gcap_attn_stats *out);

/* Embedding: a table `weight` [num_embeddings, embedding_dim] drawn from
** N(0, 1); a call takes ids of any shape (integers held as numbers, as
** cross_entropy's targets) and gives [..., embedding_dim]. */
gcap_status gcap_nn_embedding(gcap_engine *e, int64_t num_embeddings, int64_t embedding_dim,
                              gcap_module **m);

/* ------------------------------------------------------------------------ */
/* Optimizers: update parameters in place with device-side state, so a step
** can be captured and replayed. e NULL, or o NULL: GCAP_EINVAL with no
** message.                                                                 */

/* SGD: lr, momentum (0: none), weight_decay. */
gcap_status gcap_optim_sgd(gcap_engine *e, int n, gcap_tensor *const *params, double lr,
                           double momentum, double weight_decay, gcap_optim **out);
/* Adam: lr, betas, eps, weight_decay (L2). */
gcap_status gcap_optim_adam(gcap_engine *e, int n, gcap_tensor *const *params, double lr,
                            double beta1, double beta2, double eps, double weight_decay,
                            gcap_optim **out);
/* AdamW: Adam with decoupled weight decay (each step first multiplies a
** parameter by 1 - lr * weight_decay; nothing is added to the grad). */
gcap_status gcap_optim_adamw(gcap_engine *e, int n, gcap_tensor *const *params, double lr,
                             double beta1, double beta2, double eps, double weight_decay,
                             gcap_optim **out);
/* The learning rate lives on the device, as the step counts do: a step reads
** it when it runs, so a captured step replays with the rate set since.
** set_lr writes it (on the current stream; lr >= 0; refused while a capture
** is open); gcap_optim_lr is the rate last set (0 for NULL). */
gcap_status gcap_optim_set_lr(gcap_optim *o, double lr);
double gcap_optim_lr(const gcap_optim *o);
void gcap_optim_free(gcap_optim *o);
/* Update every parameter that has a .grad. */
gcap_status gcap_optim_step(gcap_optim *o);
/* Clear (set_to_none) or zero every parameter's .grad. */
gcap_status gcap_optim_zero_grad(gcap_optim *o, int set_to_none);
/* Its parameters: count, and the i-th (from 0, in the order given;
** borrowed; NULL out of range). 0 and NULL for o NULL. */
int gcap_optim_num_params(const gcap_optim *o);
gcap_tensor *gcap_optim_param(const gcap_optim *o, int i);
/* The state of parameter i, under PyTorch's names: k = 0, 1, ... gives its
** tensors (borrowed: the device tensors the steps update in place, so a
** state is restored by writing into them), *name (may be NULL) set to the
** name; NULL, *name untouched, past the last one. SGD: "momentum_buffer"
** (with momentum; one of the parameter's shape and dtype, zeros before the
** first step, as a buffer PyTorch has not made yet acts); Adam: "step" (f32,
** 0-D: the steps taken), "exp_avg", "exp_avg_sq". */
gcap_tensor *gcap_optim_state(const gcap_optim *o, int i, int k, const char **name);
/* A hyperparameter by name: SGD "lr", "momentum", "weight_decay"; Adam
** "lr", "beta1", "beta2", "eps", "weight_decay" (another name is
** GCAP_EINVAL). set_hyper checks v as the constructor does; giving SGD a
** momentum it was made without allocates its momentum buffers (zeros;
** refused while capturing). A step captured earlier keeps the values it was
** captured with. */
gcap_status gcap_optim_hyper(const gcap_optim *o, const char *name, double *v);
gcap_status gcap_optim_set_hyper(gcap_optim *o, const char *name, double v);

/* ------------------------------------------------------------------------ */
/* Custom ops: a C host's own kernel (or library call) launched by the
** engine like one of its own. The engine checks the capture rules,
** allocates the outputs on the current stream (in the capture's pool while
** a capture is open), notes what the op reads (its inputs) and writes (its
** outputs) for the replay check, and hands the device pointers to one of the
** op's callbacks: `cuda` on the cuda backend, `host` on the host backend.
**
** On cuda the callback runs at once and launches its work on `stream` (a
** cudaStream_t): inside a capture, what it launches becomes nodes of the
** graph, and a replay runs those nodes (the callback is not called again).
** It must not synchronize, read back or allocate device memory while the
** stream captures: CUDA refuses, the call fails with GCAP_ECAPTURE naming
** the op and the capture is invalidated. On the host backend the callback
** is the reference: it runs at once outside a capture; in a capture it is
** recorded with its arguments and runs at each replay (so the op, and its
** ud, live as long as a graph that recorded it).
**
** A callback returns GCAP_OK or a status, which fails the call (naming the
** op) and invalidates an open capture; its outputs are then freed. An op
** with a backward records an autograd node on its output (an op with a
** backward has exactly one output); the backward is a gcap_autograd_backward
** (composed of graphcap calls, or of calls of other custom ops) given the
** op's ud and the tensors the call saved. */

/* A callback's operands (gcap_custom_arg) and its type (gcap_custom_fn) are
** in graphcap_types.h, which the backends that call them include. */

typedef struct gcap_custom_desc {
  const char *name;                /* 1 to 63 bytes: in errors, grad_fn and dumps */
  gcap_custom_fn cuda;             /* the cuda launch; NULL: none (the op fails on cuda) */
  gcap_custom_fn host;             /* the host reference; NULL: none (fails on host) */
  gcap_autograd_backward backward; /* NULL: the op is not differentiable */
  void *ud;                        /* handed to the callbacks and the backward */
  void (*ud_free)(void *ud);       /* called once on ud when the op is gone (may be NULL) */
} gcap_custom_desc;

/* The shape and dtype of one output of a call. */
typedef struct gcap_custom_out {
  gcap_dtype dtype;
  int ndim;
  int64_t shape[GCAP_MAXDIM];
} gcap_custom_out;

/* A new op described by *d (copied; its name too). On failure ud_free is
** called on d->ud at once. The op is reference-counted: graphs that
** recorded it and autograd nodes keep it after gcap_custom_op_free. e NULL:
** GCAP_EINVAL with no message (ud_free is called all the same). */
gcap_status gcap_custom_op_new(gcap_engine *e, const gcap_custom_desc *d, gcap_custom_op **out);
/* NULL is fine. */
void gcap_custom_op_free(gcap_custom_op *op);
/* Run op on in[nin] (tensors of its engine), giving out[nout] new tensors
** shaped as spec[nout]. save[nsave] (at most 6) picks the tensors its
** backward gets: i < nin is input i, nin + j is output j. op NULL:
** GCAP_EINVAL with no message. */
gcap_status gcap_custom_call(gcap_custom_op *op, int nin, gcap_tensor *const *in, int nout,
                             const gcap_custom_out *spec, int nsave, const int *save,
                             gcap_tensor **out);

/* For a host that launches work of its own (a library call) on a graphcap
** stream: the native handle of s (cuda: its cudaStream_t; host: the host
** backend's queue, meaningful only to a custom op's callback). Work
** launched on it directly is invisible to the engine: on the host backend
** it runs now and is never replayed (use a custom op there). s NULL:
** GCAP_EINVAL with no message. */
gcap_status gcap_stream_native(gcap_stream *s, void **out);
/* Declare that work about to be launched on the current stream, outside
** graphcap, reads (write = 0) or writes t: the open capture's read and
** write sets (and, eagerly, the pool's writers) take it, so the replay
** check sees it and names `what` (1 to 63 bytes). Refused, as a launch is,
** on a stream outside the open capture. t NULL: GCAP_EINVAL with no message. */
gcap_status gcap_note_access(gcap_tensor *t, int write, const char *what);

/* ------------------------------------------------------------------------ */
/* Runtime-compiled kernels: CUDA C++ source compiled with NVRTC (found at
** run time: libnvrtc from the CUDA toolkit; the driver, libcuda, only on a
** cuda engine), launched as a custom op. Compilation needs no GPU, so a
** host engine compiles too (its errors show everywhere); a host engine
** runs the launch's host twin in the kernel's place.                       */

/* The type of a kernel parameter: what a launch passes for it. */
typedef enum gcap_kparam {
  GCAP_KPARAM_PTR = 0, /* any pointer: a tensor's device address */
  GCAP_KPARAM_I32,     /* int, int32_t */
  GCAP_KPARAM_U32,     /* unsigned, uint32_t */
  GCAP_KPARAM_I64,     /* long, long long, int64_t, ptrdiff_t */
  GCAP_KPARAM_U64,     /* unsigned long (long), uint64_t, size_t */
  GCAP_KPARAM_F32,     /* float */
  GCAP_KPARAM_F64,     /* double */
  GCAP_KPARAM_BOOL     /* bool: 0 or 1 */
} gcap_kparam;

/* The name of a parameter type ("ptr", "i32", "u32", "i64", "u64", "f32",
** "f64", "bool"); NULL for a value out of the enum. */
const char *gcap_kparam_name(gcap_kparam p);

/* Compile `source` and find its __global__ function `name` (an extern "C"
** name, or a C++ name expression); opts[nopts] are NVRTC options. The
** kernel's parameters are params[nparams] where params is not NULL; with
** params NULL they are read from the parameter list of the __global__
** function `name` in the source, and where that cannot be done (a macro, a
** template, a type other than a pointer or one of gcap_kparam's) the call
** fails with GCAP_EINVAL naming the parameter and asking for params. On a
** cuda engine whose driver can tell (CUDA 12.4 and later) the compiled
** kernel's parameter count and sizes are checked against them. A compile
** error is GCAP_EINVAL whose message holds NVRTC's log (lines as
** "<name>.cu(LINE): error: ..."); no NVRTC is GCAP_EUNSUPPORTED. On a cuda
** engine the kernel is loaded on its device at once. e NULL: GCAP_EINVAL
** with no message, as for k NULL in the calls on a kernel below. */
gcap_status gcap_kernel_new(gcap_engine *e, const char *source, const char *name, int nopts,
                            const char *const *opts, int nparams, const gcap_kparam *params,
                            gcap_kernel **out);
/* NULL is fine; graphs that recorded a launch keep the kernel. */
void gcap_kernel_free(gcap_kernel *k);
/* k's parameters: *nparams of them, in *params (owned by k). */
gcap_status gcap_kernel_params(const gcap_kernel *k, int *nparams, const gcap_kparam **params);

/* An argument of a launch, in the kernel's parameter order: a tensor (for a
** pointer parameter, its device address), an integer or a float (for a
** number parameter, converted to its type). */
typedef enum gcap_karg_kind { GCAP_KARG_TENSOR = 0, GCAP_KARG_INT, GCAP_KARG_FLOAT } gcap_karg_kind;
typedef struct gcap_karg {
  gcap_karg_kind kind;
  gcap_tensor *t;
  int64_t i;
  double f;
} gcap_karg;

/* Check args[nargs] against k's parameters and write in out[nargs] what
** the kernel receives: tensors as they are, integer parameters as
** GCAP_KARG_INT, float parameters as GCAP_KARG_FLOAT (an f32's value
** rounded to float). A count other than k's, a number for a pointer, a
** tensor for a number, a non-integral number for an integer parameter and
** a value out of the parameter's range are GCAP_EINVAL naming the kernel
** and the argument. gcap_kernel_launch converts so; this tells a host twin
** the values the kernel sees. */
gcap_status gcap_kernel_args(gcap_kernel *k, int nargs, const gcap_karg *args, gcap_karg *out);

typedef struct gcap_launch_desc {
  unsigned grid[3], block[3]; /* each at least 1 */
  unsigned shmem;             /* dynamic shared memory, bytes */
  int nargs;                  /* one per parameter of the kernel */
  const gcap_karg *args;
  /* What the kernel reads and writes: every tensor argument is in one of
  ** them (a tensor written in place is in writes only). */
  int nreads;
  gcap_tensor *const *reads;
  int nwrites;
  gcap_tensor *const *writes;
  /* The host twin, run by a host engine in the kernel's place (now, or at
  ** each replay of a graph that recorded it) with in = reads, out =
  ** writes; NULL: the launch fails on a host engine. host_ud_free (may be
  ** NULL) is called once on host_ud when the launch is gone, at once on a
  ** failure. */
  gcap_custom_fn host;
  void *host_ud;
  void (*host_ud_free)(void *ud);
} gcap_launch_desc;

/* Launch k on the current stream as custom op k's name: captured as a
** kernel node on cuda, its host twin recorded on the host backend. The
** arguments are checked and converted as gcap_kernel_args does. Every
** failure, k or l NULL included, calls host_ud_free on host_ud. */
gcap_status gcap_kernel_launch(gcap_kernel *k, const gcap_launch_desc *l);

/* ------------------------------------------------------------------------ */
/* Distributed: several processes on MPI (and NCCL on cuda)                  */
/*
** One process per rank, launched by mpirun. gcap_dist_init binds the
** process's ranks to one engine; collectives then run on that engine's
** tensors, on its current stream, asynchronously like kernels: on cuda they
** are NCCL calls (recorded into a graph when the stream is capturing), on
** host MPI transfers with a fixed reduction order (the host backend records
** them as nodes at capture and runs them at each replay). Every rank of a
** group must make the same collectives in the same order. Ranks given as
** `root` or `peer` are global ranks (of the world), as in PyTorch.
**
** Errors set the message of the engine (gcap_errmsg) and name the op. A
** failed collective on one rank leaves the others waiting in it: a program
** ends the job then (gcap_dist_abort), as the graphcap program does.
*/

typedef enum gcap_reduce_op {
  GCAP_REDUCE_SUM = 0,
  GCAP_REDUCE_AVG, /* the sum divided by the group's size */
  GCAP_REDUCE_MAX
} gcap_reduce_op;

/* 1 when the library was built with MPI. */
int gcap_dist_available(void);

/* Initialise MPI (unless the host already did), find this process's rank,
** the world size and the local rank (its number among the ranks of its
** machine), and bind the world to engine e (which it keeps alive until
** finalize). On cuda the engine must run on GPU number local rank (an
** engine picks it under mpirun), and a machine needs a GPU per rank
** (GCAP_EUNSUPPORTED otherwise, as NCCL refuses two ranks on one GPU); the
** world's NCCL communicator is made from a unique id that rank 0
** broadcasts over MPI. Collective: every rank calls it. GCAP_EUNSUPPORTED
** in a build without MPI; GCAP_ESTATE when already initialised, or after
** gcap_dist_finalize (MPI cannot start twice). e NULL: GCAP_EINVAL with no
** message, as in every call below that takes an engine. */
gcap_status gcap_dist_init(gcap_engine *e);

/* 1 between gcap_dist_init and gcap_dist_finalize. */
int gcap_dist_is_initialized(void);

/* This process's rank, the world size, the local rank; -1 when not
** initialised. */
int gcap_dist_rank(void);
int gcap_dist_world_size(void);
int gcap_dist_local_rank(void);

/* Free every communicator, release the engine and finalize MPI when
** gcap_dist_init initialised it. Groups stay valid handles whose calls fail
** (GCAP_ESTATE), and so do graphs that recorded collectives, at replay.
** Collective. GCAP_ESTATE when not initialised; GCAP_ECAPTURE (the
** message on the bound engine) while a capture is open. */
gcap_status gcap_dist_finalize(void);

/* End the whole job now, from any rank, with exit status `code` (MPI_Abort
** of the world), so that no rank is left waiting in a collective. Not
** initialised: exit(code). Never returns. */
void gcap_dist_abort(int code);

/* Debug mode: before each collective, the ranks of its group exchange a
** descriptor (op, reduction, dtype, shapes, root; for send/recv the two
** peers) and fail with GCAP_EINVAL naming the op and the ranks that
** disagree; barrier and finalize take part (a rank there while others make
** a collective is named; the refused finalize leaves the runtime as it
** was), and new_group compares its rank lists. Checked when the call is
** made (eagerly, or while capturing), not at replay. Off by default; on,
** each call costs one more exchange. Local: each rank sets its own (set it
** alike on all). */
gcap_status gcap_dist_set_debug(gcap_engine *e, int on);

/* The group of the world ranks ranks[0..n) (distinct, in range), group rank
** i being ranks[i]. Collective over the world: every rank calls it with the
** same list, members or not; a rank not in it gets a group whose
** gcap_dist_group_rank is -1 and whose collectives are errors. Groups live
** until gcap_dist_finalize (there is no free). */
gcap_status gcap_dist_new_group(gcap_engine *e, int n, const int *ranks, gcap_dist_group **out);

/* The world group (NULL before init). */
gcap_dist_group *gcap_dist_world(void);

/* The caller's rank in g (-1: not a member), g's size, and its world ranks
** (size entries, in group-rank order). g NULL: the world (before init -1, 0
** and NULL). */
int gcap_dist_group_rank(const gcap_dist_group *g);
int gcap_dist_group_size(const gcap_dist_group *g);
const int *gcap_dist_group_ranks(const gcap_dist_group *g);

/* Wait until every rank of g (NULL: the world) has called it, after the
** work already queued on e's current stream is done. Not during capture. */
gcap_status gcap_dist_barrier(gcap_engine *e, gcap_dist_group *g);

/* Which of n flags are set on some rank of g (NULL: the world): flags[k],
** 0 or 1 on entry, becomes 1 when any rank's flags[k] is 1. The ranks
** exchange them on the host at once, also while a capture is open: it is no
** op of a stream, so nothing is recorded and replays do not repeat it. Every
** rank of g calls it with the same n; other counts are GCAP_EINVAL on every
** rank, naming two of them. gc.ddp learns so which parameters got a grad on
** some rank. In debug mode it takes part in the comparison of calls. */
gcap_status gcap_dist_any(gcap_engine *e, int n, unsigned char *flags, gcap_dist_group *g);

/* In the collectives below, g NULL is the world, and tensors are those of
** the engine gcap_dist_init was given, contiguous, f32 or bf16 alike. A
** collective whose tensors are all NULL returns GCAP_EINVAL with no
** message; a NULL one beside another is told to the other's engine. */

/* t = op over the ranks of g of t, in place. Host: summed (or maxed) in
** rank order, in float, so every rank gets the same bits. */
gcap_status gcap_dist_all_reduce(gcap_tensor *t, gcap_reduce_op op, gcap_dist_group *g);

/* out = the t of each rank of g, concatenated in group-rank order: out has
** size(g) x numel(t) elements of t's dtype (any shape). */
gcap_status gcap_dist_all_gather(gcap_tensor *out, gcap_tensor *t, gcap_dist_group *g);

/* out = op over the ranks of g of this rank's chunk of t: t has size(g) x
** numel(out) elements, chunk i (rank-major) going to group rank i. */
gcap_status gcap_dist_reduce_scatter(gcap_tensor *out, gcap_tensor *t, gcap_reduce_op op,
                                     gcap_dist_group *g);

/* t = root's t, on every rank of g; root is a world rank in g. */
gcap_status gcap_dist_broadcast(gcap_tensor *t, int root, gcap_dist_group *g);

/* Send t to world rank peer of g, which receives it with gcap_dist_recv
** into a tensor of the same dtype and element count. Blocking on host
** (MPI_Send), stream-ordered on cuda. */
gcap_status gcap_dist_send(gcap_tensor *t, int peer, gcap_dist_group *g);
gcap_status gcap_dist_recv(gcap_tensor *t, int peer, gcap_dist_group *g);

/* ------------------------------------------------------------------------ */
/* FP8                                                                       */

/* Casts to FP8 (gcap_fp8_format: E4M3, largest finite 448; E5M2, 57344)
** round to nearest, ties to even, saturate to the largest finite value
** (infinities too) and keep NaN a NaN. The host backend emulates them
** exactly; it is the reference of the cuda backend, whose bytes are the
** same. */

/* The FP8 round trip of x at `scale` (finite, > 0): *out (x's shape and
** dtype) = cast(x * scale) / scale, each FP8 value times the float 1 /
** scale, as a GEMM on the FP8 copy reads it; *amax (a 0-D f32 tensor; NULL:
** not wanted) = the largest |x|, NaN elements left out. Not recorded by
** autograd. */
gcap_status gcap_fp8_cast(gcap_tensor *x, gcap_fp8_format format, double scale, gcap_tensor **out,
                          gcap_tensor **amax);

/* Recipes, TransformerEngine's: DelayedScaling keeps per module, per role
** (input, weight and grad_output of each FP8 GEMM) a scale and a history
** of amaxes on the device; each use quantizes with the role's scale and
** notes its amax, then one small kernel per module and pass updates the
** role: the amax joins the history (most recent first, at most
** amax_history_len), and the scale becomes fp8_max / m / 2^margin, m the
** largest amax of the history ("max") or the amax itself ("most_recent");
** where m is 0 or not finite the scale stays, and a pass that quantized
** nothing (amax 0: a cached weight) leaves the role as it was. Scales start
** at 1. Float8CurrentScaling takes each tensor's own amax right before its
** cast: scale = fp8_max / amax (1 where the amax is 0 or not finite).
** HYBRID: E4M3 for inputs and weights, E5M2 for grads; E4M3: E4M3 for all. */
typedef enum gcap_fp8_recipe_kind {
  GCAP_FP8_DELAYED_SCALING = 0, /* DelayedScaling */
  GCAP_FP8_CURRENT_SCALING      /* Float8CurrentScaling */
} gcap_fp8_recipe_kind;
typedef enum gcap_fp8_recipe_format {
  GCAP_FP8_HYBRID = 0,
  GCAP_FP8_ALL_E4M3
} gcap_fp8_recipe_format;
typedef enum gcap_amax_algo { GCAP_AMAX_MAX = 0, GCAP_AMAX_MOST_RECENT } gcap_amax_algo;

typedef struct gcap_fp8_recipe {
  gcap_fp8_recipe_kind kind;
  gcap_fp8_recipe_format fp8_format; /* GCAP_FP8_HYBRID */
  double margin;                     /* 0; finite (DelayedScaling) */
  int amax_history_len;              /* 1024; >= 1 (DelayedScaling) */
  gcap_amax_algo amax_compute_algo;  /* GCAP_AMAX_MAX (DelayedScaling) */
} gcap_fp8_recipe;

/* Fill *r with the defaults of recipe `kind` (nothing for r NULL). */
void gcap_fp8_recipe_init(gcap_fp8_recipe *r, gcap_fp8_recipe_kind kind);

/* Whether FP8 runs on e: 1, or 0 with the reason in why[n] (the host backend
** always emulates; cuda needs compute capability 8.9, or 9.0 and later). A
** NULL e is 0 with no reason. */
int gcap_fp8_is_available(gcap_engine *e, char *why, size_t n);

/* The FP8 autocast of an engine (TransformerEngine's autocast): while
** enabled, the FP8-capable modules (Linear, LayerNormLinear, LayerNormMLP,
** and so the linears of MultiheadAttention and TransformerLayer) run their
** GEMMs in FP8 with `recipe`: forward E4M3 x E4M3, backward (dgrad, wgrad)
** with the grad in E5M2 under HYBRID; they return the dtype they return
** outside. An FP8 GEMM takes inputs whose dims but the last multiply to a
** multiple of 8 and whose last dim is a multiple of 16 (the weight's
** likewise); others are GCAP_EINVAL naming the module and the shape. A
** backward runs with what its forward ran with. With amax_reduction_group,
** each update first takes the max of the amaxes over the group's ranks
** (an all-reduce on the device), so that every rank holds the same scales.
** The GEMMs are FP8 GEMMs: cuBLASLt's on cuda, the f32 GEMM of the
** dequantized values on the host (the reference). */
typedef struct gcap_fp8_autocast {
  int enabled;
  gcap_fp8_recipe recipe;
  gcap_dist_group *amax_reduction_group; /* NULL: none */
} gcap_fp8_autocast;

/* Set e's autocast to *a (NULL: disabled), its previous one into *prev
** (NULL: not wanted), to restore it with. Enabling checks the recipe
** (GCAP_EINVAL naming the field: margin not finite, amax_history_len < 1,
** an unknown kind, format or amax_compute_algo) and the device
** (gcap_fp8_is_available); nothing changes when it fails, and a success
** leaves the engine's last message as it was (restoring the previous
** autocast after a failed call keeps that call's message). */
gcap_status gcap_fp8_set_autocast(gcap_engine *e, const gcap_fp8_autocast *a,
                                  gcap_fp8_autocast *prev);

/* The FP8 state of module m (TransformerEngine's fp8_meta, readable):
** gcap_module_fp8_gemms gives how many FP8 GEMMs it runs itself (Linear and
** LayerNormLinear 1, LayerNormMLP 2: fc1, fc2; 0 for the others, whose
** children hold theirs; -1 for m NULL). gcap_module_fp8_state reads role
** `role` (0 input, 1 weight, 2 grad_output) of GEMM `gemm`: its scale, and
** up to `max` amaxes of its history, most recent first, into history; *len
** gets the history's length (0 before the module first ran under a
** DelayedScaling autocast: then the scale is 1). It reads device memory:
** refused while capturing. */
int gcap_module_fp8_gemms(const gcap_module *m);
/* is_first_microbatch for the next graphed call of m (its own entry, or an
** entry of order): needed by a call graphed with fp8_weight_caching, refused
** (GCAP_EINVAL naming the entry, at that call) without. An eager call
** leaves it for the next graphed one. m NULL: GCAP_EINVAL. */
gcap_status gcap_module_set_is_first_microbatch(gcap_module *m, int first);
/* Whether m's calls in its current mode replay a graph. */
int gcap_module_is_graphed(const gcap_module *m);
gcap_status gcap_module_fp8_state(gcap_module *m, int gemm, int role, int max, float *scale,
                                  float *history, int *len);

/* ------------------------------------------------------------------------ */
/* Testing only: for the library's own tests, not for programs.              */

/* Allocation-failure injection in the calling thread: the n-th allocation
** from now (n >= 1) fails as if memory had run out. Counted are host memory
** of the engine and its backend, device memory, and the backend objects
** that can fail to be made (streams, events, graph instantiation); n <= 0
** turns injection off. Returns 1 when the failure the previous call asked
** for was injected, 0 when fewer allocations happened since. */
long gcap_test_fail_alloc(long n);

#ifdef __cplusplus
}
#endif
#endif
