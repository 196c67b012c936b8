/*
** module.h: the module object as the files of modules share it: module.c
** (the object, its registry and flattened lists), module_hooks.c (hooks and
** the call path) and builtin.c (the built-in modules). Private to those
** three; the rest of train/ sees modules through train.h.
*/
#ifndef GC_MODULE_H
#define GC_MODULE_H

#include "train.h"

typedef struct mod_entry {
  char *name;
  gcap_tensor *t; /* parameters, buffers */
  gcap_module *m; /* children */
  int transient;  /* a buffer left out of state dicts (PyTorch's persistent = False) */
} mod_entry;

typedef struct mod_list {
  mod_entry *v;
  int n, cap;
} mod_list;

typedef struct mod_flat {
  uint64_t gen; /* the engine's module generation it was made at; 0: none */
  int n, cap;
  gcap_tensor **t;
  char **name;
} mod_flat;

/* Where a graphed module's calls in one mode go instead of its forward. */
typedef struct mod_route {
  gc_route_fn fn; /* a graphed replay, or NULL: the module's own forward */
  void *ud;       /* its state (weak: the graphed object owns the module) */
  int entry;
} mod_route;

typedef struct mod_hook {
  int id;
  gcap_hook_kind kind;
  gcap_module_hook fn;
  void *ud;
  void (*ud_free)(void *);
} mod_hook;

struct gcap_module {
  int refs;
  gcap_engine *e;
  char type[GC_NAMELEN];
  gcap_forward_fn forward;     /* one output, or NULL */
  gcap_forward_n_fn forward_n; /* several outputs, or NULL */
  void *ud;
  void (*ud_free)(void *);
  mod_list params, buffers, children;
  int training;
  mod_hook *hooks;
  int nhooks, caphooks, next_hook_id;
  /* built-ins */
  double eps, p;
  gc_wgrad_sink *wgrad;    /* a Linear that delays or fuses wgrad: its sink, else NULL */
  gc_wgrad_queue wq_aside; /* the user's delayed wgrads while make_graphed_callables runs */
  int aside;
  mod_route route[2];   /* by training flag: graphed in both modes, each call replays its own */
  gcap_attn_stats attn; /* an attention module's last call (gc_module_attn_slot) */
  mod_flat flat[2];     /* parameters, buffers: see flat_of */
  int fp8_gemms;        /* the FP8 GEMMs it runs itself (gc_module_set_fp8_gemms) */
  gc_fp8_meta *fp8;     /* their FP8 state, made at the first FP8 call, or NULL */
  int first_mb;         /* is_first_microbatch for the next graphed call: 2 true, 1 false, 0 none */
};

/* While a capture is open, where a module's forward runs, for the labels of
** the host's dumps: "Sequential.0" (a child by its name in the module that
** called it), type "Linear" (module.c). */
typedef struct mod_where {
  gc_oplabel was;
  int entered;
  char path[96];
} mod_where;
void gc_module_where_enter(gcap_module *m, mod_where *w);
void gc_module_where_leave(gcap_module *m, const mod_where *w);

/* Drop n references (NULL ones included), as a call's outputs are dropped
** (module_hooks.c). */
void gc_outs_free(int n, gcap_tensor **t);

#endif
