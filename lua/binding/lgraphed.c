/*
** lgraphed.c: make_graphed_callables and the calls of graphed callables.
*/

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "lbind.h"

/*
** {======================================================
** make_graphed_callables
** =======================================================
*/

static LGraphed *l_checkgraphed(lua_State *L, int i) {
  return (LGraphed *)l_checkbox(L, i, &l_graphed_class);
}

/*
** The Lua functions a make_graphed_callables call may run (capture-time
** hooks, the warmup hooks, a progress function) cross as one flat sequence,
** kept by the Graphed box (GDV_HOOKS); the core holds each one's ud, its
** index there. The facade wraps each function: a hook gets its callable and
** its return value is checked there.
*/
typedef struct LCapHook {
  LEngine *le;
  int index; /* in the Graphed box's GDV_HOOKS */
} LCapHook;

typedef struct LCapCall {
  LCall c;
  int index;
  const char *phase; /* progress(phase, done, total); NULL: a hook, no arguments */
  int done, total;
} LCapCall;

/* The protected part: hooks[index](...) of the Graphed box that the frame
** of make_graphed_callables passes (at 2) */
int l_pcaphook(lua_State *L) {
  LCapCall *c = (LCapCall *)lua_touserdata(L, 1);
  if (c->c.nargs != 1) return luaL_error(L, "capture-time hook outside make_graphed_callables");
  lua_getiuservalue(L, 2, GDV_HOOKS);
  lua_rawgeti(L, -1, c->index);
  if (c->phase == NULL)
    lua_call(L, 0, 0);
  else {
    lua_pushstring(L, c->phase);
    lua_pushinteger(L, c->done);
    lua_pushinteger(L, c->total);
    lua_call(L, 3, 0);
  }
  return 0;
}

static gcap_status l_runhook(const LCapHook *h, const char *phase, int done, int total) {
  LCapCall c = {{0}, h->index, phase, done, total};
  return l_callback(h->le, &l_capkey, &c.c, NULL);
}

static gcap_status l_caphook(void *ud, gcap_module *m) {
  (void)m;
  return l_runhook((const LCapHook *)ud, NULL, 0, 0);
}

static gcap_status l_warmhook(void *ud) {
  return l_runhook((const LCapHook *)ud, NULL, 0, 0);
}

static gcap_status l_progress_fn(void *ud, const char *phase, int done, int total) {
  return l_runhook((const LCapHook *)ud, phase, done, total);
}

/*
** Progress of make_graphed_callables. Option progress = true: one line on
** stderr, rewritten in place; a function: progress(phase, done, total),
** whose error stops the call as a hook's does. Without the option, the
** registry's PROGRESS_KEY (the graphcap program sets it true on a terminal)
** decides.
*/
#define PROGRESS_KEY "graphcap.progress"

/* The line's state during one call: when it was last drawn, and what. */
typedef struct LLine {
  double drawn; /* seconds of the monotonic clock; 0: never */
  const char *phase;
} LLine;

/* About ten updates a second: a graphing of thousands of passes would
** otherwise spend its time writing to the terminal. The first and last
** pass of each phase are always drawn. */
#define PROGRESS_PERIOD 0.1

static gcap_status l_progress_line(void *ud, const char *phase, int done, int total) {
  LLine *ln = (LLine *)ud;
  struct timespec ts;
  double now;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  now = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
  if (done != total && phase == ln->phase && now - ln->drawn < PROGRESS_PERIOD) return GCAP_OK;
  ln->drawn = now;
  ln->phase = phase;
  fprintf(stderr, "\rgraphcap: %s %d/%d", phase, done, total);
  if (done == total) fputs("\n", stderr);
  fflush(stderr);
  return GCAP_OK;
}

/* Option k of the table at t as a number (nil: def), a flag, or an index
** into the hooks (nil: 0). */
static double l_optnumber(lua_State *L, int t, const char *k, double def) {
  double v;
  if (lua_getfield(L, t, k) == LUA_TNIL)
    v = def;
  else
    v = lua_tonumber(L, -1);
  lua_pop(L, 1);
  return v;
}

static int l_optflag(lua_State *L, int t, const char *k, int def) {
  int v;
  if (lua_getfield(L, t, k) == LUA_TNIL)
    v = def;
  else
    v = lua_toboolean(L, -1);
  lua_pop(L, 1);
  return v;
}

static int l_optindex(lua_State *L, int t, const char *k) {
  int v = (lua_getfield(L, t, k) == LUA_TNUMBER) ? (int)lua_tointeger(L, -1) : 0;
  lua_pop(L, 1);
  return v;
}

/* Set o's progress from the options at t: a function (its index in the
** hooks, its LCapHook in *h), a boolean (the line, its state in *ln), or
** nil (the registry's default). */
static void l_optprogress(lua_State *L, int t, gcap_graphed_opts *o, LCapHook *h, LLine *ln) {
  int kind = lua_getfield(L, t, "progress");
  if (kind == LUA_TNIL) {
    lua_pop(L, 1);
    kind = lua_getfield(L, LUA_REGISTRYINDEX, PROGRESS_KEY);
  }
  if (kind == LUA_TNUMBER) {
    h->index = (int)lua_tointeger(L, -1);
    o->progress = l_progress_fn;
    o->progress_ud = h;
  } else if (lua_toboolean(L, -1)) {
    o->progress = l_progress_line;
    o->progress_ud = ln;
  }
  lua_pop(L, 1);
}

/* One call: its arrays, laid out in one userdata collected with the call's
** stack (l_mkarrays), and its options */
typedef struct LMake {
  lua_State *L;
  int nmod, nent, *nargs;
  gcap_module **mods;
  gcap_tensor ***args;
  int ntensors, nhooks;      /* the tensors of all entries, the hooks of all callables */
  gcap_tensor **flat;        /* [ntensors]: args[i] points into it */
  gcap_capture_hooks *hooks; /* [nmod] */
  gcap_capture_hook *fns;    /* [nhooks] */
  void **uds;                /* [nhooks]: each its LCapHook in cap */
  LCapHook *cap;             /* [nhooks] */
  LCapHook other[3];         /* pre_warmup_hook, post_warmup_hook, progress */
  LLine line;                /* the progress line's state */
  int oldkw;                 /* stack index: the modules' MV_KWARGS before the call */
  gcap_fp8_recipe recipe;    /* fp8_recipe, when given */
  gcap_graphed_opts o;
  gcap_graphed **out;
} LMake;

/* Set each module's MV_KWARGS from opts.kwargs (at kw), keeping the old
** ones in a table left on the stack (mk->oldkw). */
static void l_setkwargs(lua_State *L, LMake *mk, int kw) {
  int i;
  lua_createtable(L, mk->nmod, 0);
  mk->oldkw = lua_gettop(L);
  for (i = 1; i <= mk->nmod; i++) {
    lua_rawgeti(L, 1, i);
    lua_getiuservalue(L, -1, MV_KWARGS);
    lua_rawseti(L, mk->oldkw, i);
    if (lua_rawgeti(L, kw, i) != LUA_TTABLE) {
      lua_pop(L, 1);
      lua_pushnil(L);
    }
    lua_setiuservalue(L, -2, MV_KWARGS);
    lua_pop(L, 1);
  }
}

/* The call failed: the modules' MV_KWARGS as they were (in reverse, for a
** module given twice). Nothing here allocates. */
static void l_restorekwargs(lua_State *L, const LMake *mk) {
  int i;
  for (i = mk->nmod; i >= 1; i--) {
    lua_rawgeti(L, 1, i);
    lua_rawgeti(L, mk->oldkw, i);
    lua_setiuservalue(L, -2, MV_KWARGS);
    lua_pop(L, 1);
  }
}

static gcap_status l_callmake(const LRun *r, void *ud) {
  LMake *mk = (LMake *)ud;
  gcap_status st =
      gcap_make_graphed_callables(r->e, mk->nmod, mk->mods, mk->nent, mk->nargs,
                                  (gcap_tensor *const *const *)mk->args, &mk->o, mk->out);
  if (st != GCAP_OK) l_restorekwargs(mk->L, mk);
  return st;
}

/* Count the entries' tensors (each entry a sequence) and, from the counts of
** opts.capture_time_hooks, the hooks; returns the stack index of that
** option (nil: no hooks). */
static int l_mkcount(lua_State *L, LMake *mk) {
  int i, k, hooksi;
  mk->nmod = (int)lua_rawlen(L, 1);
  mk->nent = (int)lua_rawlen(L, 2);
  for (i = 1; i <= mk->nent; i++) {
    lua_rawgeti(L, 2, i);
    luaL_checktype(L, -1, LUA_TTABLE);
    mk->ntensors += (int)lua_rawlen(L, -1);
    lua_pop(L, 1);
  }
  lua_getfield(L, 3, "capture_time_hooks");
  hooksi = lua_gettop(L);
  if (lua_istable(L, hooksi))
    for (i = 1; i <= mk->nmod; i++) {
      lua_rawgeti(L, hooksi, i);
      for (k = 1; k <= 4; k++) {
        lua_rawgeti(L, -1, k);
        mk->nhooks += (int)lua_tointeger(L, -1);
        lua_pop(L, 1);
      }
      lua_pop(L, 1);
    }
  return hooksi;
}

/* Lay the call's arrays out in one userdata (left on the stack), and fill
** in the modules and the sample tensors. */
static void l_mkarrays(lua_State *L, LMake *mk) {
  size_t sz =
      sizeof(gcap_module *) * (size_t)(mk->nmod + 1) + sizeof(int) * (size_t)(mk->nent + 1) +
      sizeof(gcap_tensor **) * (size_t)(mk->nent + 1) +
      sizeof(gcap_tensor *) * (size_t)(mk->ntensors + 1) +
      sizeof(gcap_capture_hooks) * (size_t)(mk->nmod + 1) +
      (sizeof(gcap_capture_hook) + sizeof(void *) + sizeof(LCapHook)) * (size_t)(mk->nhooks + 1);
  char *mem = (char *)lua_newuserdatauv(L, sz, 0);
  int i, k, n = 0;
  memset(mem, 0, sz);
  mk->mods = (gcap_module **)mem;
  mk->hooks = (gcap_capture_hooks *)(mk->mods + mk->nmod + 1);
  mk->args = (gcap_tensor ***)(mk->hooks + mk->nmod + 1);
  mk->flat = (gcap_tensor **)(mk->args + mk->nent + 1);
  mk->fns = (gcap_capture_hook *)(mk->flat + mk->ntensors + 1);
  mk->uds = (void **)(mk->fns + mk->nhooks + 1);
  mk->cap = (LCapHook *)(mk->uds + mk->nhooks + 1);
  mk->nargs = (int *)(mk->cap + mk->nhooks + 1);
  for (i = 0; i < mk->nmod; i++) {
    lua_rawgeti(L, 1, i + 1);
    mk->mods[i] = l_checkmodule(L, -1)->m;
    lua_pop(L, 1);
  }
  for (i = 0; i < mk->nent; i++) {
    lua_rawgeti(L, 2, i + 1);
    mk->nargs[i] = (int)lua_rawlen(L, -1);
    mk->args[i] = mk->flat + n;
    for (k = 0; k < mk->nargs[i]; k++) {
      LTensor *t;
      lua_rawgeti(L, -1, k + 1);
      t = (LTensor *)luaL_testudata(L, -1, TENSOR_MT);
      if (t == NULL || t->t == NULL) /* l_error does not return */
        l_error(L, "make_graphed_callables: sample_args[%d][%d] is %s", i + 1, k + 1,
                (t == NULL) ? "not a tensor" : "a closed tensor");
      else
        mk->flat[n++] = t->t;
      lua_pop(L, 1);
    }
    lua_pop(L, 1);
  }
}

/* The capture_time_hooks (at hooksi, if a table): per callable, the count
** of each group's hooks, which are the call's hooks[1..] in that order,
** callable after callable; each one's ud its LCapHook, its index there. */
static void l_mkhooks(lua_State *L, LMake *mk, int hooksi) {
  LEngine *le = (LEngine *)lua_touserdata(L, ENGINEIDX);
  int i, k, j = 0;
  if (!lua_istable(L, hooksi)) return;
  for (i = 0; i < mk->nmod; i++) {
    lua_rawgeti(L, hooksi, i + 1);
    for (k = 0; k < 4; k++) {
      int n, h;
      lua_rawgeti(L, -1, k + 1);
      n = (int)lua_tointeger(L, -1);
      lua_pop(L, 1);
      mk->hooks[i].n[k] = n;
      mk->hooks[i].fn[k] = mk->fns + j;
      mk->hooks[i].ud[k] = mk->uds + j;
      for (h = 0; h < n; h++, j++) {
        mk->cap[j].le = le;
        mk->cap[j].index = j + 1;
        mk->fns[j] = l_caphook;
        mk->uds[j] = &mk->cap[j];
      }
    }
    lua_pop(L, 1);
  }
  mk->o.capture_time_hooks = mk->hooks;
  mk->o.num_capture_time_hooks = mk->nmod;
}

/* The other options (at 3) into mk->o; order and num_layers_per_chunk are
** copied into userdata left on the stack, as is the pool's box. */
/* The FP8 options as the facade normalized them: fp8_enabled one boolean
** per callable, fp8_recipe {kind, format, margin, amax_history_len,
** amax_compute_algo} as the core numbers them, fp8_group a group box. */
static void l_mkfp8(lua_State *L, LMake *mk) {
  gcap_graphed_opts *o = &mk->o;
  int k;
  if (lua_getfield(L, 3, "fp8_enabled") == LUA_TTABLE) {
    int *en = (int *)lua_newuserdatauv(L, sizeof(int) * (size_t)(mk->nmod + 1), 0);
    for (k = 0; k < mk->nmod; k++) {
      lua_rawgeti(L, -2, k + 1);
      en[k] = lua_toboolean(L, -1);
      lua_pop(L, 1);
    }
    o->fp8_enabled = en;
  }
  if (lua_getfield(L, 3, "fp8_recipe") == LUA_TTABLE) {
    double v[5];
    for (k = 0; k < 5; k++) {
      lua_rawgeti(L, -1, k + 1);
      v[k] = lua_tonumber(L, -1);
      lua_pop(L, 1);
    }
    mk->recipe.kind = (gcap_fp8_recipe_kind)v[0];
    mk->recipe.fp8_format = (gcap_fp8_recipe_format)v[1];
    mk->recipe.margin = v[2];
    mk->recipe.amax_history_len = (int)v[3];
    mk->recipe.amax_compute_algo = (gcap_amax_algo)v[4];
    o->fp8_recipe = &mk->recipe;
  }
  if (lua_getfield(L, 3, "fp8_group") != LUA_TNIL)
    o->fp8_group = ((LGroup *)l_checkbox(L, lua_gettop(L), &l_group_class))->g;
  o->fp8_weight_caching = l_optflag(L, 3, "fp8_weight_caching", 0);
}

static void l_mkoptions(lua_State *L, LMake *mk) {
  gcap_graphed_opts *o = &mk->o;
  int k;
  o->num_warmup_iters = (int)l_optnumber(L, 3, "num_warmup_iters", 3);
  o->allow_unused_input = l_optflag(L, 3, "allow_unused_input", 0);
  o->retain_graph_in_backward = l_optflag(L, 3, "retain_graph_in_backward", 0);
  o->reuse_graph_input_output_buffers = l_optflag(L, 3, "reuse_graph_input_output_buffers", 0);
  o->clone_param_grads_on_return = l_optflag(L, 3, "clone_param_grads_on_return", 1);
  if (lua_getfield(L, 3, "order") == LUA_TTABLE) {
    double *order;
    o->order_len = (int)lua_rawlen(L, -1);
    order = (double *)lua_newuserdatauv(L, sizeof(double) * (size_t)(o->order_len + 1), 0);
    for (k = 0; k < o->order_len; k++) {
      lua_rawgeti(L, -2, k + 1);
      order[k] = lua_tonumber(L, -1);
      lua_pop(L, 1);
    }
    o->order = order;
  }
  if (lua_getfield(L, 3, "num_layers_per_chunk") == LUA_TTABLE) {
    int *nlpc;
    o->num_chunks = (int)lua_rawlen(L, -1);
    nlpc = (int *)lua_newuserdatauv(L, sizeof(int) * (size_t)(o->num_chunks + 1), 0);
    for (k = 0; k < o->num_chunks; k++) {
      lua_rawgeti(L, -2, k + 1);
      nlpc[k] = (int)lua_tointeger(L, -1);
      lua_pop(L, 1);
    }
    o->num_layers_per_chunk = nlpc;
  }
  if (lua_getfield(L, 3, "pool") != LUA_TNIL) {
    LPool *pl = (LPool *)luaL_testudata(L, -1, POOL_MT);
    if (pl == NULL || pl->p == NULL) /* l_error does not return */
      l_error(L, "make_graphed_callables: option pool must be an open graph pool, got %s",
              pl ? "a closed pool" : l_typename(L, -1));
    else
      o->pool = pl->p;
  }
  l_mkfp8(L, mk);
  for (k = 0; k < 3; k++)
    mk->other[k].le = (LEngine *)lua_touserdata(L, ENGINEIDX);
  if ((mk->other[0].index = l_optindex(L, 3, "pre_warmup_hook")) > 0) {
    o->pre_warmup_hook = l_warmhook;
    o->pre_warmup_ud = &mk->other[0];
  }
  if ((mk->other[1].index = l_optindex(L, 3, "post_warmup_hook")) > 0) {
    o->post_warmup_hook = l_warmhook;
    o->post_warmup_ud = &mk->other[1];
  }
  l_optprogress(L, 3, o, &mk->other[2], &mk->line);
}

/* The call itself, with the Graphed box (at box) as its frame's value and the
** modules' MV_KWARGS set from opts.kwargs meanwhile. */
static void l_mkcall(lua_State *L, LMake *mk, gcap_engine *e, int box) {
  LRun run = {.call = l_callmake, .op = "make_graphed_callables", .ctx = 1};
  lua_getfield(L, 3, "kwargs");
  l_setkwargs(L, mk, lua_gettop(L));
  run.ud = mk;
  run.e = e;
  run.args = box; /* the hooks' callbacks find the Graphed box here */
  run.nargs = 1;
  run.graphing = 1;
  l_run(L, &run);
}

/* After the call: a callable whose box a hook or a forward closed meanwhile
** cannot be returned or replay. Refused, naming it, with the graphed object
** at box closed (its modules no longer replay) and the kwargs put back. */
static void l_mkopen(lua_State *L, LMake *mk, int box) {
  LGraphed *r = (LGraphed *)lua_touserdata(L, box);
  char type[64];
  int i;
  for (i = 1; i <= mk->nmod; i++) {
    lua_rawgeti(L, 1, i);
    if (((LModule *)lua_touserdata(L, -1))->m == NULL) {
      snprintf(type, sizeof type, "%s", gcap_module_type(mk->mods[i - 1]));
      l_restorekwargs(L, mk);
      gcap_graphed_free(r->g); /* the graphs, the routes, the module */
      r->g = NULL;
      l_error(L,
              "make_graphed_callables: callable %d (%s) was closed during the call (by a hook or "
              "a forward); close a module only once it is no longer called",
              i, type);
    }
    lua_pop(L, 1);
  }
}

/*
** core.make_graphed_callables(modules, args, opts): modules a sequence of
** Module boxes, one per callable; args a sequence (one per entry) of
** sequences of tensors (kwargs appended). opts, as the facade normalized
** them: num_warmup_iters, allow_unused_input, retain_graph_in_backward,
** reuse_graph_input_output_buffers, clone_param_grads_on_return; order (a
** sequence of numbers) and num_layers_per_chunk (of integers); pool; hooks,
** the flat sequence of the Lua functions the call may run; capture_time_hooks,
** per callable the counts {forward_pre, forward, backward_pre, backward} of
** its hooks, which are hooks[1..] in that order, callable after callable;
** pre_warmup_hook, post_warmup_hook and progress, an index into hooks
** (progress may be a boolean); kwargs, per callable its sorted kwargs keys
** or false. Returns a Graphed box.
*/
static int l_make_graphed(lua_State *L) {
  gcap_engine *e = l_engine(L);
  LGraphed *r;
  LMake mk;
  int hooksi, box;
  luaL_checktype(L, 1, LUA_TTABLE);
  luaL_checktype(L, 2, LUA_TTABLE);
  luaL_checktype(L, 3, LUA_TTABLE);
  memset(&mk, 0, sizeof mk);
  mk.L = L;
  gcap_graphed_opts_init(&mk.o);
  hooksi = l_mkcount(L, &mk);
  l_mkarrays(L, &mk);
  l_mkhooks(L, &mk, hooksi);
  l_mkoptions(L, &mk);
  r = (LGraphed *)l_newbox(L, sizeof *r, NGDV, GRAPHED_MT);
  r->e = e;
  box = lua_gettop(L);
  lua_getfield(L, 3, "hooks");
  lua_setiuservalue(L, box, GDV_HOOKS);
  mk.out = &r->g;
  l_mkcall(L, &mk, e, box);
  l_mkopen(L, &mk, box);
  lua_pushvalue(L, box);
  return 1;
}

static void l_graphed_close(lua_State *L, void *box) {
  LGraphed *p = (LGraphed *)box;
  (void)L;
  gcap_graphed_free(p->g);
  p->g = NULL;
}

static int l_graphed_isopen(const void *box) {
  return ((const LGraphed *)box)->g != NULL;
}

static int l_graphed_len(lua_State *L) {
  lua_pushinteger(L, gcap_graphed_num_entries(l_checkgraphed(L, 1)->g));
  return 1;
}

static int l_checkentry(lua_State *L, LGraphed *p, int i) {
  lua_Integer k = luaL_checkinteger(L, i);
  luaL_argcheck(L, k >= 1 && k <= gcap_graphed_num_entries(p->g), i, "entry out of range");
  return (int)k - 1;
}

/* The names of TransformerEngine's replay options in a keyword map */
static const char *const l_replaykeys[] = {"cuda_graph_stream", "cuda_graph_event"};

int l_isreplaykey(lua_State *L, int i) {
  return lua_type(L, i) == LUA_TSTRING && (strcmp(lua_tostring(L, i), l_replaykeys[0]) == 0 ||
                                           strcmp(lua_tostring(L, i), l_replaykeys[1]) == 0);
}

int l_onlyreplaykeys(lua_State *L, int kwi) {
  int any = 0;
  if (lua_type(L, kwi) != LUA_TTABLE || luaL_testudata(L, kwi, TENSOR_MT)) return 0;
  kwi = lua_absindex(L, kwi);
  lua_pushnil(L);
  while (lua_next(L, kwi) != 0) {
    lua_pop(L, 1);
    if (!l_isreplaykey(L, -1)) {
      lua_pop(L, 1);
      return 0;
    }
    any = 1;
  }
  return any;
}

int l_replayopts(lua_State *L, int kwi, gcap_replay_opts *o, const char *who) {
  void *box[2];
  int k;
  memset(o, 0, sizeof *o);
  if (kwi == 0 || lua_type(L, kwi) != LUA_TTABLE || luaL_testudata(L, kwi, TENSOR_MT)) return 0;
  for (k = 0; k < 2; k++) {
    const char *mt = k == 0 ? STREAM_MT : EVENT_MT;
    lua_pushstring(L, l_replaykeys[k]);
    box[k] = lua_rawget(L, kwi) == LUA_TNIL ? NULL : luaL_testudata(L, -1, mt);
    if (!lua_isnil(L, -1) && (box[k] == NULL || (k == 0 ? ((LStream *)box[k])->s == NULL
                                                        : ((LEvent *)box[k])->ev == NULL)))
      return l_error(L, "%s: keyword argument '%s' must be a%s %s, got %s", who, l_replaykeys[k],
                     k == 0 ? "" : "n", k == 0 ? "Stream" : "Event",
                     box[k] ? (k == 0 ? "a closed stream" : "a closed event") : l_typename(L, -1));
    lua_pop(L, 1);
  }
  o->stream = box[0] ? ((LStream *)box[0])->s : NULL;
  o->event = box[1] ? ((LEvent *)box[1])->ev : NULL;
  return box[0] != NULL || box[1] != NULL;
}

typedef struct LGraphedCall {
  int entry;
  int nout;
  gcap_tensor *out[GCAP_MAX_OUTPUTS];
  gcap_replay_opts opts;
  int hasopts;
} LGraphedCall;

static gcap_status l_callgraphed(const LRun *r, void *ud) {
  LGraphedCall *c = (LGraphedCall *)ud;
  return gcap_graphed_call_opts(r->g, c->entry, c->hasopts ? &c->opts : NULL, r->nin, r->in,
                                GCAP_MAX_OUTPUTS, &c->nout, c->out);
}

/* G:call(entry, tensors...) -> the outputs, as the callable returned them
** at capture (replays; eager in another mode) */
static int l_graphed_call(lua_State *L) {
  LGraphed *p = l_checkgraphed(L, 1);
  int entry = l_checkentry(L, p, 2), nin = lua_gettop(L) - 2, nargs = nin, i, mi;
  gcap_tensor **in;
  gcap_module *m;
  LGraphedCall c;
  LRun r = {.call = l_callgraphed, .op = "graphed call"};
  int kwi = 0, first = -1;
  m = gcap_graphed_module(p->g, entry);
  if (nin > 0) nin -= l_takefirstmb(L, nin + 2, m, entry, &first);
  if (nin > 0 && lua_type(L, nin + 2) == LUA_TTABLE) kwi = 2 + nin--; /* a kwargs map, last */
  l_pushmodule(L, m); /* its MV_KWARGS say how a kwargs map flattens */
  mi = lua_gettop(L);
  in = l_inbuf(L, l_maxin(L, mi, nin));
  for (i = 0; i < nin; i++) {
    LTensor *t = (LTensor *)luaL_testudata(L, i + 3, TENSOR_MT);
    if (t == NULL)
      return l_error(L,
                     "graphed call of entry %d: argument #%d must be a "
                     "tensor, got %s",
                     entry + 1, i + 1, l_typename(L, i + 3));
    if (t->t == NULL)
      return l_error(L, "graphed call of entry %d: argument #%d is a closed tensor", entry + 1,
                     i + 1);
    in[i] = t->t;
  }
  if (kwi != 0 && lua_getiuservalue(L, mi, MV_KWARGS) != LUA_TTABLE &&
      !l_onlyreplaykeys(L, kwi)) /* no kwargs to take */
    return l_error(L, "graphed call of entry %d: argument #%d must be a tensor, got table",
                   entry + 1, kwi - 2);
  if (kwi != 0) lua_pop(L, 1);
  c.hasopts = l_replayopts(L, kwi, &c.opts, "graphed call");
  nin = l_flatkwargs(L, mi, kwi, in, nin, gcap_module_type(m));
  lua_createtable(L, 0, 0); /* an eager call (another mode) leaves its results here */
  c.entry = entry;
  c.nout = 0;
  r.ud = &c;
  r.e = p->e;
  r.g = p->g;
  r.m = m;
  r.nin = nin;
  r.in = in;
  r.subject = m; /* its forward gets the call's own Lua values */
  r.args = 3;
  r.nargs = nargs;
  r.results = lua_gettop(L);
  if (first >= 0) gcap_module_set_is_first_microbatch(m, first);
  l_run(L, &r);
  if ((i = l_pushresults(L, r.results, c.nout, c.out, gcap_module_type(m))) >= 0) return i;
  return l_pushouts(L, mi, c.nout, c.out, "graphed call");
}

static int l_graphed_backward_dw(lua_State *L) {
  LGraphed *p = l_checkgraphed(L, 1);
  l_check(L, p->e, gcap_graphed_backward_dw(p->g, l_checkentry(L, p, 2)), "backward_dw");
  return 0;
}

static int l_graphed_reset(lua_State *L) {
  LGraphed *p = l_checkgraphed(L, 1);
  l_check(L, p->e, gcap_graphed_reset(p->g, l_checkentry(L, p, 2)), "reset");
  return 0;
}

/* G:debug_dump(entry, prefix) -> {paths written}: prefix.fwd.dot, and
** prefix.bwd.dot and prefix.bwd_dw.dot for the graphs the entry has */
static int l_graphed_debug_dump(lua_State *L) {
  LGraphed *p = l_checkgraphed(L, 1);
  int entry = l_checkentry(L, p, 2), n = 0;
  const char *prefix = luaL_checkstring(L, 3);
  gcap_graphed_stats s;
  l_check(L, p->e, gcap_graphed_debug_dump(p->g, entry, prefix), "debug_dump");
  l_check(L, p->e, gcap_graphed_get_stats(p->g, entry, &s), "debug_dump");
  lua_createtable(L, 3, 0);
  lua_pushfstring(L, "%s.fwd.dot", prefix);
  lua_rawseti(L, -2, ++n);
  if (s.has_bwd) {
    lua_pushfstring(L, "%s.bwd.dot", prefix);
    lua_rawseti(L, -2, ++n);
  }
  if (s.has_dw) {
    lua_pushfstring(L, "%s.bwd_dw.dot", prefix);
    lua_rawseti(L, -2, ++n);
  }
  return 1;
}

/* G:stats(entry) -> {fwd, bwd (or nil), bwd_dw (or nil), pool_reserved_bytes, outputs,
** grad_outputs} */
static int l_graphed_stats(lua_State *L) {
  LGraphed *p = l_checkgraphed(L, 1);
  gcap_graphed_stats s;
  l_check(L, p->e, gcap_graphed_get_stats(p->g, l_checkentry(L, p, 2), &s), "stats");
  lua_createtable(L, 0, 4);
  l_pushgraphstats(L, &s.fwd);
  lua_setfield(L, -2, "fwd");
  if (s.has_bwd) {
    l_pushgraphstats(L, &s.bwd);
    lua_setfield(L, -2, "bwd");
  }
  if (s.has_dw) {
    l_pushgraphstats(L, &s.dw);
    lua_setfield(L, -2, "bwd_dw");
  }
  lua_pushinteger(L, (lua_Integer)s.pool_reserved_bytes);
  lua_setfield(L, -2, "pool_reserved_bytes");
  lua_pushinteger(L, s.num_outputs);
  lua_setfield(L, -2, "outputs");
  lua_pushinteger(L, s.num_grad_outputs);
  lua_setfield(L, -2, "grad_outputs");
  return 1;
}

static const luaL_Reg l_graphed_meta[] = {{"__len", l_graphed_len}, {NULL, NULL}};

static const luaL_Reg l_graphed_methods[] = {
    {"call", l_graphed_call},   {"backward_dw", l_graphed_backward_dw}, {"reset", l_graphed_reset},
    {"stats", l_graphed_stats}, {"debug_dump", l_graphed_debug_dump},   {NULL, NULL}};

LUAI_DDEF const LClass l_graphed_class = {
    "Graphed", GRAPHED_MT,       "graphed callables are closed",
    "closed",  l_graphed_isopen, l_graphed_close,
    NULL,      l_graphed_meta,   l_graphed_methods};

/* }====================================================== */

/* functions of the module */
LUAI_DDEF const luaL_Reg l_graphed_funcs[] = {{"make_graphed_callables", l_make_graphed},
                                              {NULL, NULL}};
