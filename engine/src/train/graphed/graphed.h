/*
** graphed.h: make_graphed_callables, the private header of its folder: the
** entry and graphed structs, the construction state, and the helpers every
** phase uses. One file per step of a call (build.c runs them in turn):
**   check.c     the static checks (hooks, inputs, modes, options), before any work
**   schedule.c  `order`, validated and expanded into passes over entries
**   build.c     options, the .grad and generator snapshot and its rollback, the
**               entries, and the call: check, aside, entries, warmup, capture, put back
**   warmup.c    the warmup walk of the schedule on a side stream
**   capture.c   the capture walk: each pass into its own graph of one pool
**   reuse.c     static buffers shared between entries, and released once dead
**   replay.c    the graphed object: calls, backward, backward_dw, reset, dump, stats
**   side.c      a call's replay on the caller's stream, and its wait for the graph
**   stale.c     what a replayed backward checks: that its call's state is still its own
*/
#ifndef GC_GRAPHED_H
#define GC_GRAPHED_H

#include <stdio.h>
#include <string.h>

#include "train/train.h"

/* ------------------------------------------------------------------------ */
/* The schedule (schedule.c)                                                 */

enum { GC_PASS_FWD, GC_PASS_BWD, GC_PASS_DW };

typedef struct gc_pass {
  int kind;     /* GC_PASS_FWD, GC_PASS_BWD or GC_PASS_DW */
  int entry;    /* index into sample_args and the returned entries */
  int callable; /* index into callables (and capture_time_hooks) */
  int chunk;    /* 0-based chunk of the order (the entry without one) */
  int pos;      /* position in the order (-1 without one) */
} gc_pass;

typedef struct gc_schedule {
  gc_pass *v; /* in replay (and capture) order */
  int n, cap;
  int *entry_callable; /* [nentries] */
  int delayed_wgrad;   /* the order holds wgrad entries */
} gc_schedule;

/* Validate `order` (NULL: none) and expand it; errors name the position and
** the rule. Eval mode (training = 0) keeps forwards only. */
gcap_status gc_schedule_build(gcap_engine *e, const double *order, int len, const int *nlpc,
                              int nchunks, int ncallables, int nentries, int training,
                              gc_schedule *s);
void gc_schedule_free(gc_schedule *s);

/* ------------------------------------------------------------------------ */
/* Entries and the graphed object                                            */

/* The outputs of one call: n of them, NULL where absent. */
typedef struct ge_outs {
  int n;
  gcap_tensor **t;
} ge_outs;

/* A tensor that an entry's backward graph reads and does not own: a static
** input or a parameter. Each call notes its version, which its backward
** checks, as an eager node checks what it saved. */
typedef struct ge_read {
  gcap_tensor *t; /* NULL for a static output: the entry's out.t[out], held there (with reuse
                     its memory goes back to the pool, which a reference here would prevent) */
  gc_blk *blk;    /* t's storage when graphed, which the graph reads (held); t may have moved
                     since (set_), the graph still reads this */
  int out;
  char what[GC_NAMELEN + 32]; /* "the static input of argument #1", "parameter 'fc1.weight'",
                                 "output #1" */
} ge_read;

/* Where a static input or a parameter was when graphed: the graphs read
** that memory, so every call checks that the tensor is still there. */
typedef struct ge_home {
  uintptr_t ptr;
  gcap_dtype dt;
  int ndim;
  int64_t shape[GCAP_MAXDIM];
} ge_home;

/* The graphs of an entry, as indexes of its kills. */
enum { GE_FWD, GE_BWD, GE_DW, GE_NGRAPHS };

/* Reuse: output `out` of entry `entry`, whose memory a graph overwrites. */
typedef struct ge_kill {
  int entry, out;
} ge_kill;

typedef struct ge_entry {
  int callable;
  gcap_module *m;
  int nargs;
  gcap_tensor **args; /* static inputs: the sample tensors */
  int nparams;
  gcap_tensor **params;   /* parameters fed to the graphs (pruned in warmup) */
  int params_known;       /* pruning done (warmup iteration 0) */
  int trainable;          /* a parameter requires grad (pruned or not: a fused-wgrad weight's
                             grad goes to main_grad, never to .grad) */
  ge_outs out;            /* static outputs */
  gcap_tensor **grad_out; /* [out.n] static grads of the outputs that require grad, else NULL */
  int ngrad, grad1;       /* how many have one; the first that has */
  gcap_tensor **grad_in;  /* [nargs + nparams] static grads, or NULL */
  gcap_tensor **dw_grad;  /* [nparams] static wgrads of the delayed-wgrad graph */
  gcap_graph *fwd, *bwd, *dw;
  int need_dw;
  int reset;
  int fwd_pending; /* replayed forwards whose backward is still to come */
  uint64_t calls;  /* forward replays so far: the number of the latest call */
  uint64_t dw_due; /* the call whose backward replayed and whose delayed wgrad (backward_dw) is
                      still to run, or 0: the wgrad graph reads that call's activations and
                      grads, which its entry's next call or backward would overwrite */
  ge_read *reads;  /* what the backward graph reads (gc_graphed_note_reads) */
  int nreads;
  ge_home *homes; /* [nargs + nhomes] the static inputs, then every parameter of m (nhomes
                     of them), as graphed (gc_graphed_note_homes) */
  int nhomes;
  unsigned char *modes; /* [nmodes] the training flags of m and its submodules, depth first, as
                           graphed: a call finding other flags runs m's forward eagerly */
  int nmodes;
  int *sharers; /* reuse: the entries sharing a static input with this one */
  int nsharers;
  ge_kill *kills[GE_NGRAPHS]; /* reuse: the other entries' outputs each graph overwrites */
  int nkills[GE_NGRAPHS];
} ge_entry;

struct gcap_graphed {
  int refs;
  gcap_engine *e;
  int n;
  ge_entry *v;
  gcap_pool *pool;
  int training;
  int clone;
  int reuse;        /* entries may share static inputs */
  int retain;       /* the captured backwards kept their saved tensors: a call may backward twice */
  gcap_event *sync; /* a replay on another stream: the streams' waits (side.c), or NULL */
  gcap_tensor *fp8_skip; /* fp8_weight_caching: the flag its weights' quantizations read, set
                            from each call's is_first_microbatch (fp8.c); else NULL */
};

/* The autograd node of a replayed forward: its backward is pending until it
** runs, or until the node is dropped (then it never will). With several
** outputs that require grad, each output's node keeps its grad in got[]
** until the replay's node runs. */
typedef struct ge_ref {
  gcap_graphed *G;
  int entry;
  int pending;
  uint64_t call;         /* the entry's call this node is the backward of (ge_entry.calls) */
  int backwards;         /* backward replays it made */
  gcap_tensor **got;     /* [out.n] grads arrived, or NULL (one grad output) */
  gcap_replay_opts opts; /* the call's stream and event, held for its backward (side.c) */
  uint64_t ver[];        /* [nreads] the versions of the entry's reads at the call */
} ge_ref;

/* Drop the tensors of o and make it empty (replay.c). */
void gc_graphed_outs_clear(ge_outs *o);
/* Free G and everything it holds, whatever its references (replay.c). */
void gc_graphed_destroy(gcap_graphed *G);
/* The route a graphed module's calls take (gc_module_set_route): the replay
** of entry `entry` of the graphed object ud (replay.c). */
gcap_status gc_graphed_route(void *ud, int entry, const gcap_replay_opts *opts, int nin,
                             gcap_tensor *const *in, int *nout, gcap_tensor **out);

/* The backward of r may replay: no later forward of the entry overwrote the
** activations its call left in the static buffers, a second backward of the
** call finds the saved tensors its captured backward kept
** (retain_graph_in_backward), and what the graph reads outside the pool is
** at the version of the call; else an error naming the entry, the call and
** what to do (stale.c). */
gcap_status gc_graphed_check_backward(const ge_ref *r);
/* The versions of what entry x's backward graph reads, into ver (stale.c). */
void gc_graphed_note_versions(const ge_entry *x, uint64_t *ver);
/* Do m and its submodules have the training flags entry x was graphed
** with (stale.c)? */
int gc_graphed_modes_match(const ge_entry *x);
/* Which module of x's tree has another mode than graphed, and those modes,
** in words, into buf (for a call that runs eagerly). */
void gc_graphed_mode_change(const ge_entry *x, char *buf, size_t size);
/* Each static input of entry x and each parameter of its module is where
** it was when graphed: its storage, dtype and shape; else an error naming
** it (stale.c). */
gcap_status gc_graphed_check_homes(const gcap_graphed *G, int entry);

/* A call's replay options (gcap_replay_opts; o NULL: none) for entry
** `entry`: this engine's stream and event, an event external and recorded by
** the forward graph, and a call that replays (`replay`); else an error
** naming the option (side.c). */
gcap_status gc_graphed_check_opts(gcap_graphed *G, int entry, const gcap_replay_opts *o,
                                  int replay);
/* Replay g as a call with options o does (o NULL: on the current stream),
** and hold or drop o's stream and event for a backward to come (side.c). */
gcap_status gc_graphed_replay_on(gcap_graphed *G, gcap_graph *g, const gcap_replay_opts *o);
void gc_graphed_hold_opts(const gcap_replay_opts *o);
void gc_graphed_drop_opts(const gcap_replay_opts *o);

/* ------------------------------------------------------------------------ */
/* Construction state                                                        */

typedef struct ge_build {
  gcap_engine *e;
  gcap_graphed *G;
  const gcap_graphed_opts *o;
  int ncallables, nentries; /* the call's arguments */
  gcap_module *const *callables;
  const int *nargs;
  gcap_tensor *const *const *args;
  int training; /* the callables' mode, found by the checks */
  gc_schedule sched;
  ge_outs *warm_out; /* [n] warmup outputs */
  int done, total;   /* progress within the phase */
  const char *phase;
  int pass;     /* index of the pass being captured */
  int prev_bwd; /* reuse: last backward entry captured, and its order position */
  int prev_bwd_pos;
  int last_l0;         /* reuse: the l == 0 entry of the previous backward order value */
  struct ge_fp8 *fp8;  /* the FP8 options' state while the call runs (fp8.c), or NULL */
  gcap_tensor **homes; /* clone_param_grads_on_return = false: while a backward is captured,
                          the kept parameters' static grads outside the pool (capture.c) */
} ge_build;

/* The FP8 options (fp8.c): their checks; before the warmup, the modules'
** FP8 state set aside and the weight-caching flag made; after the capture,
** the state put back (st: the call's status, returned unless it was OK and
** this failed); callable c's forwards run between enter and exit under its
** autocast; before a replay, the flag from is_first_microbatch (first: 1, 0,
** or -1 when the call gave none). */
gcap_status gc_graphed_fp8_check(ge_build *b);
gcap_status gc_graphed_fp8_aside(ge_build *b);
gcap_status gc_graphed_fp8_put_back(ge_build *b, gcap_status st);
void gc_graphed_fp8_enter(ge_build *b, int callable, gcap_fp8_autocast *prev);
void gc_graphed_fp8_exit(ge_build *b, const gcap_fp8_autocast *prev);
gcap_status gc_graphed_fp8_first(gcap_graphed *G, int entry, int first);

/* Everything static, before any work: the engine's state, the callables and
** their mode (b->training), the sample arguments, the options, the hook
** tables, and the order, expanded into b->sched (check.c). */
gcap_status gc_graphed_check(ge_build *b);
/* Entry x's forward itself, its outputs into o (cleared first) (warmup.c). */
gcap_status gc_graphed_forward(ge_build *b, ge_entry *x, ge_outs *o);
/* Backpropagate from the outputs of o that require grad, grads[k] output
** k's (warmup.c). */
gcap_status gc_graphed_backward(const ge_outs *o, gcap_tensor *const *grads, int retain);
/* Every parameter of entry i's module has a grad if and only if warmup
** iteration 0 kept it (with vanish 0: none that it did not keep has one); the
** first that does not is named, after warmup iteration it, or at capture
** when it < 0, where the kept ones' grads are in taken[] (warmup.c). */
gcap_status gc_graphed_params_agree(ge_build *b, int i, int it, int vanish,
                                    gcap_tensor *const *taken);
/* num_warmup_iters walks of the schedule on a side stream (warmup.c). */
gcap_status gc_graphed_warmup(ge_build *b);
/* The schedule's passes, each into its own graph of the call's pool (capture.c). */
gcap_status gc_graphed_capture(ge_build *b);
/* Once entry x's backward is captured: the static inputs, parameters and
** static outputs its graph reads, into x->reads (stale.c). */
gcap_status gc_graphed_note_reads(ge_build *b, ge_entry *x);
/* Once every graph is captured: where each entry's static inputs and
** parameters are and its modules' training flags, into homes and modes
** (stale.c). */
gcap_status gc_graphed_note_homes(ge_build *b);
/* Reuse, before warmup: forwards take the static inputs of entries whose
** backward is done (reuse.c). */
gcap_status gc_graphed_share_inputs(ge_build *b);
/* Reuse: a static grad buffer of another entry that output k of x may
** share (a new reference), or NULL (reuse.c). */
gcap_tensor *gc_graphed_shared_grad_out(ge_build *b, const ge_entry *x, int k);
/* Reuse: once entry i's backward is captured, the buffers no later pass
** reads go back to the pool (reuse.c). */
gcap_status gc_graphed_release_dead(ge_build *b, int i);
/* Reuse, once every graph is captured: the outputs given back to the pool
** that each graph writes over, into the entries' kills (reuse.c). */
gcap_status gc_graphed_note_kills(ge_build *b);
/* Reuse, after a replay of graph `which` (GE_FWD, ...) of entry x: the
** outputs it wrote over are dead (any access to them is refused); after its
** forward, x's own outputs are live again (reuse.c). */
void gc_graphed_replayed(gcap_graphed *G, const ge_entry *x, int which);

/* ------------------------------------------------------------------------ */
/* Helpers of every phase                                                    */

/* Slot k of an entry's input surface: its args, then its params. */
static inline gcap_tensor *ge_surface(const ge_entry *x, int k) {
  return k < x->nargs ? x->args[k] : x->params[k - x->nargs];
}

static inline gcap_status ge_zeros_like(gcap_tensor *t, gcap_tensor **out) {
  return gcap_tensor_full(t->e, t->dt, t->ndim, t->shape, 0.0, out);
}

/* The engine's message without its "make_graphed_callables: " head. */
static inline const char *ge_msg_body(const gcap_engine *e) {
  const char *head = "make_graphed_callables: ";
  return strncmp(e->err, head, strlen(head)) == 0 ? e->err + strlen(head) : e->err;
}

/* A callback (a capture-time hook, a warmup hook, progress) ended with st:
** the message names it (`where`, as "pre_warmup_hook failed"). With
** GCAP_EABORTED its own error says why (the binding raises a Lua one with
** this message appended), so the place alone, whatever the ops it ran left;
** with another status (a C host's callback), the place and then the
** message the callback's calls left, else the status. */
static inline gcap_status ge_callback_failed(gcap_engine *e, gcap_status st, const char *where) {
  char why[GC_ERRLEN];
  snprintf(why, sizeof why, "%s", st == GCAP_EABORTED ? "" : ge_msg_body(e));
  if (st != GCAP_EABORTED && why[0] == '\0') snprintf(why, sizeof why, "%s", gcap_status_str(st));
  return gc_fail(e, st, "make_graphed_callables: %s%s%s", where, why[0] ? ": " : "", why);
}

/* The capture_time_hooks of group `group` of callable c, outside capture;
** a hook's failure names it, its callable and the phase. */
static inline gcap_status ge_run_hooks(ge_build *b, int c, gcap_hook_kind group) {
  const gcap_capture_hooks *h;
  gcap_module *m = b->G->v[0].m;
  int j;
  if (b->o->capture_time_hooks == NULL) return GCAP_OK;
  h = &b->o->capture_time_hooks[c];
  for (j = 0; j < b->G->n; j++)
    if (b->G->v[j].callable == c) {
      m = b->G->v[j].m;
      break;
    }
  for (j = 0; j < h->n[group]; j++) {
    gcap_status st;
    gc_span sp;
    gc_span_begin(b->e, &sp, "%s #%d of callable %d (%s)", gcap_hook_group_key(group), j + 1, c + 1,
                  gcap_module_type(m));
    gc_clear(b->e);
    st = h->fn[group][j](h->ud[group] ? h->ud[group][j] : NULL, m);
    gc_span_end(b->e, &sp, "hook", NULL);
    if (st != GCAP_OK) {
      char where[GC_NAMELEN + 96];
      snprintf(where, sizeof where,
               "capture_time_hooks %s #%d of callable %d (%s) failed in the %s",
               gcap_hook_group_key(group), j + 1, c + 1, gcap_module_type(m), b->phase);
      return ge_callback_failed(b->e, st, where);
    }
  }
  return GCAP_OK;
}

/* After a pass that ended with st: count it and tell the progress callback,
** whose non-OK status stops the work. */
static inline gcap_status ge_progress(ge_build *b, gcap_status st) {
  if (st != GCAP_OK) return st;
  b->done++;
  if (b->o->progress == NULL) return GCAP_OK;
  gc_clear(b->e);
  st = b->o->progress(b->o->progress_ud, b->phase, b->done, b->total);
  if (st != GCAP_OK) {
    char where[96];
    snprintf(where, sizeof where, "the progress callback stopped the %s at %d of %d", b->phase,
             b->done, b->total);
    return ge_callback_failed(b->e, st, where);
  }
  return GCAP_OK;
}

/* Prefix the engine's message with the phase, entry and callable; only the
** place when a callback stopped the pass (GCAP_EABORTED: the callback's own
** error says why, and the engine's message may be an older one). */
static inline gcap_status ge_where(ge_build *b, gcap_status st, int entry, const char *phase) {
  char msg[GC_ERRLEN + 2];
  const char *text = st == GCAP_EABORTED ? "" : ge_msg_body(b->e);
  snprintf(msg, sizeof msg, "%s%s", *text ? ": " : "", text);
  return gc_fail(b->e, st, "make_graphed_callables: %s of entry %d (callable %d, %s)%s", phase,
                 entry + 1, b->G->v[entry].callable + 1, gcap_module_type(b->G->v[entry].m), msg);
}

#endif
