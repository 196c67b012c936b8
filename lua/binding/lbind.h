/*
** lbind.h: what the files of the Lua binding (module "graphcap.core") share:
** the box structs, one uservalue numbering per box type, the registry keys
** and the functions one family of objects lends another. Private: nothing
** outside lua/binding/ includes it, and nothing here is exported from the
** module (LUAI_FUNC), whose one public entry is luaopen_graphcap_core.
**
** Every object is a box holding a core handle; a NULL handle means closed.
** Boxes are born closed, and one idempotent close serves __gc, __close and
** :close(). One engine per Lua state lives in an Engine box (registry slot
** ENGINE_KEY); it is upvalue 1 of every function of the binding except the
** Engine's own, and uservalue 1 of every other box, which keeps it alive.
*/

#ifndef LBIND_H
#define LBIND_H

#include <string.h>

#include "lua.h"
#include "lauxlib.h"

#include "graphcap.h"

#define TENSOR_MT "graphcap.Tensor"
#define STREAM_MT "graphcap.Stream"
#define EVENT_MT "graphcap.Event"
#define POOL_MT "graphcap.Pool"
#define GRAPH_MT "graphcap.Graph"
#define MODULE_MT "graphcap.Module"
#define HANDLE_MT "graphcap.HookHandle"
#define OPTIM_MT "graphcap.Optimizer"
#define GRAPHED_MT "graphcap.Graphed"
#define ENGINE_MT "graphcap.Engine"
#define KERNEL_MT "graphcap.Kernel"
#define DISTGROUP_MT "graphcap.DistGroup"
#define GENERATOR_MT "graphcap.Generator"

#define ENGINE_KEY "graphcap.engine" /* registry slot of the engine box */
#define ENGINEIDX lua_upvalueindex(1)

/* Uservalue 1 of every box but the engine's: the engine box */
#define UV_ENGINE 1

/* uservalues of the engine box */
enum {
  EV_STREAMS = 1, /* weak map: stream address -> its Stream box */
  EV_CURRENT,     /* Stream box made current (kept alive while it is) */
  EV_CAPTURE,     /* Stream box of the open capture (likewise) */
  EV_MODULES,     /* weak map: module address -> its Module box */
  EV_TENSORS,     /* weak map: tensor address -> a box of it (identity) */
  EV_PMARKS,      /* weak set of tensor boxes marked by nn.Parameter */
  EV_CLASSES,     /* type name -> class table of the built-in modules */
  EV_GENERATORS,  /* weak map: generator address -> its Generator box */
  NEV
};

/* uservalues of a Graph box */
enum {
  GV_ENGINE = UV_ENGINE,
  GV_POOL, /* its Pool box, what g:pool() returns */
  NGV
};

/* uservalues of a Module box */
enum {
  MV_ENGINE = UV_ENGINE,
  MV_FIELDS, /* field name -> the value assigned */
  MV_CLASS,  /* its class table (methods, forward), or nil */
  MV_HOOKS,  /* key -> HookHandle box, for every hook registered */
  MV_REG,    /* registered name -> "parameter" | "buffer" | "child" */
  MV_KWARGS, /* the sorted kwargs keys it was graphed with, or nil */
  MV_OUTS,   /* per mode graphed in ([true] training, [false] eval), the structure of its
                outputs (l_pushouts), or nil: one tensor; or nil: never graphed */
  NMV
};

/* uservalues of a HookHandle box */
enum {
  HV_ENGINE = UV_ENGINE,
  HV_FN,  /* the hook function */
  HV_MOD, /* the Module box it was registered on */
  NHV
};

/* uservalues of a Graphed box */
enum {
  GDV_ENGINE = UV_ENGINE,
  GDV_HOOKS, /* the Lua functions its make_graphed_callables could run */
  NGDV
};

/*
** A core call that may call back into Lua, in progress: the frames of the
** engine form a stack (callbacks can start core calls of their own). For a
** module call, its Lua arguments are at stack indices args..args+nargs-1
** of L, so that the module's forward and hooks see the same Lua values.
*/
typedef struct LFrame {
  lua_State *L;
  gcap_module *m; /* the module of m(...) or m:forward(...), or NULL */
  int args, nargs;
  int muted;    /* m:forward(...): m's own forward hooks are skipped */
  int replaced; /* a forward pre-hook replaced m's inputs: m's callbacks get the core's tensors */
  int results;  /* a table where m's Lua forward leaves results other than one tensor, or 0 */
  int graphing; /* make_graphed_callables: Lua forwards record their outputs' structure */
  struct LFrame *prev;
} LFrame;

typedef struct LEngine {
  gcap_engine *e;
  LFrame *cur;
} LEngine;
typedef struct LTensor {
  gcap_tensor *t;
} LTensor;
typedef struct LStream {
  gcap_stream *s;
  gcap_engine *e;
  int own;
} LStream;
typedef struct LEvent {
  gcap_event *ev;
  gcap_engine *e;
} LEvent;
typedef struct LPool {
  gcap_pool *p;
  gcap_engine *e;
} LPool;
typedef struct LGraph {
  gcap_graph *g;
  gcap_engine *e;
} LGraph;
typedef struct LModule {
  gcap_module *m;
  lua_Integer nexthook;
} LModule;
/* A hook; its address is the hook's ud in the core, so the box is kept
** alive by its module's MV_HOOKS table while it is registered (m != NULL). */
typedef struct LHandle {
  LEngine *le;
  gcap_module *m;  /* NULL once removed */
  int id;          /* the core's hook id */
  lua_Integer key; /* its key in the module's MV_HOOKS */
} LHandle;
typedef struct LOptim {
  gcap_optim *o;
  gcap_engine *e;
  const char *name; /* "SGD", "Adam", "AdamW" */
} LOptim;
typedef struct LGraphed {
  gcap_graphed *g;
  gcap_engine *e;
} LGraphed;
typedef struct LGenerator {
  gcap_generator *g;
  gcap_engine *e;
  int own; /* holds a reference (every generator's box but the default one's) */
} LGenerator;

/*
** A class of boxes, its boilerplate driven by this descriptor: check
** (l_checkbox), __gc, __close and :close() (one idempotent close, where
** close != NULL), __tostring ("<tname> (<gone>)" once closed, describe's
** string while open, the default where describe is NULL).
*/
typedef struct LClass {
  const char *name;   /* its key in core._metatables */
  const char *tname;  /* its metatable's name */
  const char *closed; /* the argument error of a closed box */
  const char *gone;   /* what tostring says of a closed box */
  int (*isopen)(const void *box);
  void (*close)(lua_State *L, void *box);    /* release the handle of an open box (at index 1) */
  void (*describe)(lua_State *L, void *box); /* push what tostring says of an open box */
  const luaL_Reg *meta, *methods;            /* the class's own metamethods and methods */
} LClass;

/* The start of the context of a callback's protected part */
typedef struct LCall {
  int nargs;   /* how many Lua values of the frame follow the context (l_callback) */
  int results; /* in: push the frame's results table after them, if it has one; out: pushed */
} LCall;

/* Values flattened into outputs (lforward.c): out[0..n), borrowed (room
** for GCAP_MAX_OUTPUTS); an error reads "<who> returned ...<where>". */
typedef struct LFlat {
  gcap_tensor **out;
  int n;
  const char *who, *where;
} LFlat;

/* An engine call that may call back into Lua, for l_run */
typedef struct LRun LRun;
struct LRun {
  gcap_status (*call)(const LRun *r, void *ud); /* the engine call */
  void *ud;
  gcap_engine *e; /* whose message its error is */
  const char *op; /* the op its error names; NULL: the type of module m */
  /* kept alive during the call (a callback may close their boxes) */
  gcap_module *m;
  gcap_graphed *g;
  int nin;
  gcap_tensor *const *in;
  /* the frame: m(...) or m:forward(...) of module 'subject' (NULL: none),
  ** its Lua values at args..args+nargs-1 */
  gcap_module *subject;
  int args, nargs, muted;
  int results;  /* the frame's results table (LFrame), or 0 */
  int graphing; /* the frame's flag (LFrame) */
  int ctx;      /* a callback's error message gets the engine's account appended */
};

typedef gcap_status (*l_unop)(gcap_tensor *a, gcap_tensor **out);
typedef gcap_status (*l_binop)(gcap_tensor *a, gcap_tensor *b, gcap_tensor **out);

/* registry keys (their addresses), lcall.c */
LUAI_DDEC(const char l_errkey);  /* the LErr holder */
LUAI_DDEC(const char l_fwdkey);  /* the protected part of a Lua forward */
LUAI_DDEC(const char l_hookkey); /* the protected part of a hook */
LUAI_DDEC(const char l_capkey);  /* the protected part of a capture-time hook */
LUAI_DDEC(const char l_fnkey);   /* the protected part of a Function's backward (lfunction.c) */
LUAI_DDEC(const char l_twinkey); /* the protected part of a kernel's host twin (lkernel.c) */

/* lerror.c: errors that name the user's line */
LUAI_FUNC int l_error(lua_State *L, const char *fmt, ...);
LUAI_FUNC int l_argerror(lua_State *L, int arg, const char *extramsg);
LUAI_FUNC void l_fail(lua_State *L, gcap_status st, const char *msg, const char *op);
LUAI_FUNC void l_check(lua_State *L, const gcap_engine *e, gcap_status st, const char *op);
LUAI_FUNC const char *l_typename(lua_State *L, int i);
LUAI_DDEC(const luaL_Reg l_error_funcs[]);

/* lcall.c: engine calls that may call back into Lua */
LUAI_FUNC void l_run(lua_State *L, const LRun *r);
LUAI_FUNC gcap_status l_callback(LEngine *le, const char *key, LCall *ctx, const gcap_module *m);
LUAI_FUNC void l_errholder(lua_State *L);

/* lgraphcap.c: boxes */

/* The open box of class c at i; either error names the user's line, also
** when the facade passed the value on. */
static inline void *l_checkbox(lua_State *L, int i, const LClass *c) {
  void *p = luaL_testudata(L, i, c->tname);
  if (p == NULL)
    l_argerror(L, i, lua_pushfstring(L, "%s expected, got %s", c->tname, l_typename(L, i)));
  if (!c->isopen(p)) l_argerror(L, i, c->closed);
  return p;
}

/* The engine of the running function (upvalue 1), which must be open */
static inline gcap_engine *l_engine(lua_State *L) {
  gcap_engine *e = ((LEngine *)lua_touserdata(L, ENGINEIDX))->e;
  if (e == NULL) luaL_error(L, "graphcap engine is closed");
  return e;
}

/* A new box in its closed state, linked to the engine box. */
static inline void *l_newbox(lua_State *L, size_t size, int nuv, const char *mt) {
  void *p = lua_newuserdatauv(L, size, nuv);
  memset(p, 0, size); /* NULL handle: closed */
  luaL_setmetatable(L, mt);
  lua_pushvalue(L, ENGINEIDX);
  lua_setiuservalue(L, -2, UV_ENGINE);
  return p;
}
#define l_newtensor(L) ((LTensor *)l_newbox(L, sizeof(LTensor), 1, TENSOR_MT))

/* ltensor.c */
LUAI_DDEC(const LClass l_tensor_class);
LUAI_FUNC gcap_tensor *l_checktensor(lua_State *L, int i);
LUAI_FUNC gcap_tensor *l_entrytensor(lua_State *L, int i, const char *op, const char *what,
                                     lua_Integer k);
LUAI_FUNC gcap_dtype l_optdtype(lua_State *L, int i, const char *op);
LUAI_FUNC int l_optboolean(lua_State *L, int i, int def, const char *what);
LUAI_FUNC void l_pushborrowed(lua_State *L, gcap_tensor *t);
LUAI_FUNC void l_keeptensor(lua_State *L, int i);
LUAI_FUNC void l_knownresult(lua_State *L);
LUAI_FUNC int l_unary(lua_State *L, l_unop f, const char *op);
LUAI_FUNC int l_arith(lua_State *L, l_binop f, const char *op);
LUAI_FUNC int l_tensor_index(lua_State *L);
LUAI_FUNC int l_tensor_newindex(lua_State *L);
LUAI_DDEC(const luaL_Reg l_tensor_funcs[]);

/* lindex.c */
LUAI_FUNC void l_pushsize(lua_State *L, gcap_tensor *t);
LUAI_FUNC int l_size(lua_State *L);
LUAI_FUNC int l_len(lua_State *L);
LUAI_FUNC int l_index_get(lua_State *L);
LUAI_FUNC int l_index_set(lua_State *L);
LUAI_FUNC int l_compare_refused(lua_State *L);

/* lbytes.c */
LUAI_FUNC int l_tobytes(lua_State *L);
LUAI_FUNC int l_write_bytes(lua_State *L);

/* lshape.c */
LUAI_FUNC int l_checkdim(lua_State *L, int arg, int ndim, const char *op);
LUAI_FUNC int l_reshape(lua_State *L);
LUAI_FUNC int l_transpose(lua_State *L);
LUAI_FUNC int l_permute(lua_State *L);
LUAI_DDEC(const luaL_Reg l_shape_funcs[]);

/* lattn.c */
LUAI_FUNC int l_softmax(lua_State *L);
LUAI_FUNC int l_masked_fill(lua_State *L);
LUAI_FUNC int l_sdpa(lua_State *L);

/* lops.c */
LUAI_FUNC int l_matmul(lua_State *L);
LUAI_FUNC int l_lt(lua_State *L);
LUAI_FUNC int l_le(lua_State *L);
LUAI_FUNC int l_gt(lua_State *L);
LUAI_FUNC int l_ge(lua_State *L);
LUAI_FUNC int l_eq(lua_State *L);
LUAI_FUNC int l_ne(lua_State *L);
LUAI_FUNC int l_relu(lua_State *L);
LUAI_FUNC int l_gelu(lua_State *L);
LUAI_DDEC(const luaL_Reg l_ops_funcs[]);
LUAI_DDEC(const luaL_Reg l_F_funcs[]);

/* lmodule.c */
LUAI_DDEC(const LClass l_module_class);
LUAI_FUNC LModule *l_checkmodule(lua_State *L, int i);
LUAI_FUNC int l_takefirstmb(lua_State *L, int i, gcap_module *m, int entry, int *first);
LUAI_FUNC LModule *l_newmodule(lua_State *L, int cls);
LUAI_FUNC void l_keepmodule(lua_State *L);
LUAI_FUNC int l_findmodule(lua_State *L, gcap_module *m);
LUAI_FUNC void l_pushmodule(lua_State *L, gcap_module *m);
LUAI_FUNC void l_adoptfields(lua_State *L, int i);
LUAI_FUNC int l_pushargs(lua_State *L, const LCall *c, int nin, gcap_tensor *const *in);
LUAI_FUNC int l_module_forward(lua_State *L); /* m:forward of a class with none of its own */
LUAI_FUNC int l_module_index(lua_State *L);
LUAI_FUNC int l_module_newindex(lua_State *L);

/* lforward.c: a Lua forward as the core calls it, kwargs, outputs */
LUAI_FUNC gcap_status l_lua_forward(void *ud, gcap_module *m, int nin, gcap_tensor *const *in,
                                    int *nout, gcap_tensor **out);
LUAI_FUNC int l_pforward(lua_State *L);
LUAI_FUNC int l_pushouts(lua_State *L, int mi, int n, gcap_tensor **t, const char *what);
LUAI_FUNC int l_getouts(lua_State *L, int mi);
LUAI_FUNC int l_pushresults(lua_State *L, int rt, int n, gcap_tensor **t, const char *type);
LUAI_FUNC int l_structure(lua_State *L, int tmpl, int base, int n, const char *what,
                          const char *type);
LUAI_FUNC void l_flatresults(lua_State *L, LFlat *fl, int fi, int n);
LUAI_FUNC void l_keepresults(lua_State *L, int rt, int fi, int n, const LFlat *fl);
LUAI_FUNC int l_sameleaves(lua_State *L, int rt, int n, gcap_tensor *const *t);
LUAI_FUNC int l_maxin(lua_State *L, int mi, int n);
LUAI_FUNC gcap_tensor **l_inbuf(lua_State *L, int n);
LUAI_FUNC int l_flatkwargs(lua_State *L, int mi, int kwi, gcap_tensor **in, int nin,
                           const char *type);
LUAI_FUNC int l_takeskwargs(lua_State *L, int mi);
LUAI_FUNC int l_builtinkwargs(lua_State *L, int mi, int kwi, gcap_tensor **in, int nin,
                              const char *type);

/* lhook.c */
LUAI_DDEC(const LClass l_handle_class);
LUAI_FUNC int l_phook(lua_State *L);
LUAI_FUNC int l_register_forward_pre_hook(lua_State *L);
LUAI_FUNC int l_register_forward_hook(lua_State *L);
LUAI_FUNC int l_register_full_backward_pre_hook(lua_State *L);
LUAI_FUNC int l_register_full_backward_hook(lua_State *L);

/* lnn.c */
LUAI_DDEC(const luaL_Reg l_nn_funcs[]);

/* lengine.c: the engine box, the engine as a whole, the clock, the trace */
LUAI_DDEC(const LClass l_engine_class);
LUAI_FUNC void l_pushengine(lua_State *L);
LUAI_DDEC(const luaL_Reg l_engine_funcs[]);
LUAI_DDEC(const luaL_Reg l_test_funcs[]);

/* lstream.c: streams and events */
LUAI_DDEC(const LClass l_stream_class);
LUAI_DDEC(const LClass l_event_class);
LUAI_FUNC LStream *l_checkstream(lua_State *L, int i);
LUAI_DDEC(const luaL_Reg l_stream_funcs[]);

/* lgraph.c: graphs, pools and memory statistics */
LUAI_DDEC(const LClass l_pool_class);
LUAI_DDEC(const LClass l_graph_class);
LUAI_DDEC(const luaL_Reg l_graph_funcs[]);
/* Push a graph's statistics as {nodes, capture_ms, instantiate_ms,
** pool_bytes, replays} (g:stats(), and each graph of G:stats(entry)). */
LUAI_FUNC void l_pushgraphstats(lua_State *L, const gcap_graph_stats *s);

/* lfunction.c: gc.autograd.Function's nodes */
LUAI_FUNC int l_pfnbackward(lua_State *L);
LUAI_DDEC(const luaL_Reg l_function_funcs[]);

/* lkernel.c: runtime-compiled kernels and their host twins */
LUAI_FUNC int l_ptwin(lua_State *L);
LUAI_DDEC(const LClass l_kernel_class);
LUAI_DDEC(const luaL_Reg l_kernel_funcs[]);

/* loptim.c */
LUAI_DDEC(const LClass l_optim_class);
LUAI_DDEC(const luaL_Reg l_optim_funcs[]);

/* ldist.c */
typedef struct LGroup {
  gcap_dist_group *g; /* lives until finalize, and then as a handle whose calls fail */
} LGroup;
LUAI_DDEC(const LClass l_group_class);
LUAI_DDEC(const luaL_Reg l_dist_funcs[]);

/* lrandom.c: random generators */
LUAI_DDEC(const LClass l_generator_class);
LUAI_DDEC(const luaL_Reg l_random_funcs[]);
/* lfp8.c */
LUAI_DDEC(const luaL_Reg l_fp8_funcs[]);

/* lgraphed.c */
LUAI_DDEC(const LClass l_graphed_class);
/* TransformerEngine's replay options of a graphed call in the keyword map
** at kwi (0: none): cuda_graph_stream (a Stream) and cuda_graph_event (an
** Event) into *o; 1 when the map holds either (errors start with who). */
LUAI_FUNC int l_replayopts(lua_State *L, int kwi, gcap_replay_opts *o, const char *who);
/* Is the key at i the name of one of them? Does the table at kwi hold them
** and nothing else? */
LUAI_FUNC int l_isreplaykey(lua_State *L, int i);
LUAI_FUNC int l_onlyreplaykeys(lua_State *L, int kwi);
LUAI_FUNC int l_pcaphook(lua_State *L);
LUAI_DDEC(const luaL_Reg l_graphed_funcs[]);

#endif
