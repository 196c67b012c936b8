/*
** lgraphcap.c: the Lua binding of graphcap, module "graphcap.core".
** It translates arguments, lifetimes and errors between Lua and graphcap.h
** and holds no numerics; the facade (graphcap/init.lua) builds on it.
**
** Every object is a box holding a core handle; a NULL handle means closed.
** Boxes are born closed, and one idempotent close serves __gc, __close and
** :close(). One engine per Lua state lives in an Engine box (registry slot
** ENGINE_KEY); it is upvalue 1 of every function here except the Engine's
** own, and uservalue 1 of every other box, which keeps it alive.
**
** Modules and autograd call back into Lua (a Lua module's forward, module
** hooks) while a core call that Lua started is in progress. Each such core
** call is made inside a frame (LFrame) that records its lua_State; the
** callbacks run under lua_pcall on that state, and an error is kept
** (l_errkey) and returned to the core as GCAP_EABORTED; once the core call
** returns, the binding raises the kept error object itself, unchanged (a
** message keeps the position where it was raised; the interpreter adds the
** one traceback). No Lua error unwinds through the engine.
*/

#include <ctype.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

#define ENGINE_KEY "graphcap.engine" /* registry slot of the engine box */
#define ENGINEIDX lua_upvalueindex(1)

/* uservalues of the engine box */
#define UV_STREAMS 1 /* weak map: stream address -> its Stream box */
#define UV_CURRENT 2 /* Stream box made current (kept alive while it is) */
#define UV_CAPTURE 3 /* Stream box of the open capture (likewise) */
#define UV_MODULES 4 /* weak map: module address -> its Module box */
#define UV_TENSORS 5 /* weak map: tensor address -> a box of it (identity) */
#define UV_PMARKS 6  /* weak set of tensor boxes marked by nn.Parameter */
#define UV_CLASSES 7 /* type name -> class table of the built-in modules */
#define NUV_ENGINE 7

/* uservalues of the other boxes */
#define UV_ENGINE 1 /* the engine box */
#define UV_POOL 2   /* a graph's Pool box, what g:pool() returns */

/* uservalues of a Module box */
#define UV_FIELDS 2 /* field name -> the value assigned */
#define UV_CLASS 3  /* its class table (methods, forward), or nil */
#define UV_HOOKS 4  /* key -> HookHandle box, for every hook registered */
#define UV_REG 5    /* registered name -> "parameter" | "buffer" | "child" */
#define NUV_MODULE 5

/* uservalues of a HookHandle box */
#define UV_HOOKFN 2  /* the hook function */
#define UV_HOOKMOD 3 /* the Module box it was registered on */

/* a tensor's bytes must fit an int64 */
#define MAXNUMEL (INT64_MAX / (int64_t)sizeof(float))

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
  int muted; /* m:forward(...): m's own forward hooks are skipped */
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
** alive by its module's UV_HOOKS table while it is registered (m != NULL). */
typedef struct LHandle {
  LEngine *le;
  gcap_module *m;  /* NULL once removed */
  int id;          /* the core's hook id */
  lua_Integer key; /* its key in the module's UV_HOOKS */
} LHandle;
typedef struct LOptim {
  gcap_optim *o;
  gcap_engine *e;
  int adam;
} LOptim;
/* Holder of the error of a failed callback (its uservalue 1) */
typedef struct LErr {
  int set;
} LErr;

/* registry keys (their addresses) */
static const char l_errkey = 'e';  /* the LErr holder */
static const char l_fwdkey = 'f';  /* the protected part of a Lua forward */
static const char l_hookkey = 'h'; /* the protected part of a hook */
static const char l_capkey = 'c';  /* the protected part of a capture-time hook */
static const char l_mgckey = 'm';  /* the hooks of the make_graphed_callables in progress */
static const char l_progkey = 'p'; /* the protected part of a progress function */

typedef gcap_status (*l_unop)(gcap_tensor *a, gcap_tensor **out);
typedef gcap_status (*l_binop)(gcap_tensor *a, gcap_tensor *b, gcap_tensor **out);

static const int64_t l_noshape[1] = {0}; /* shape of a 0-D tensor (unread) */

/*
** {======================================================
** Errors, boxes, argument checks
** =======================================================
*/

/* Does 'msg' start with the name of an op ("linear: ...", "set grad: ")? */
static int l_hasop(const char *msg) {
  const char *s = msg;
  if (!isalpha((unsigned char)*s) && *s != '_') return 0;
  while (s - msg < 32 && (isalnum((unsigned char)*s) || *s == '_' || *s == '.' || *s == ' '))
    s++;
  return s[0] == ':' && s[1] == ' ';
}

/* Is 'src' the source of a chunk of the facade (embedded: "=graphcap",
** "=graphcap.nn"; from files: ".../graphcap/nn.lua")? */
static int l_isfacade(const char *src) {
  const char *slash = strrchr(src, '/');
  size_t n;
  if (strncmp(src, "=graphcap", 9) == 0) return src[9] == '\0' || src[9] == '.';
  if (src[0] != '@' || slash == NULL || strchr(slash, '.') == NULL ||
      strcmp(strchr(slash, '.'), ".lua") != 0)
    return 0;
  n = (size_t)(slash - src);
  return n >= 9 && strncmp(slash - 8, "graphcap", 8) == 0 && (n == 9 || slash[-9] == '/');
}

/* Push "chunk:line: " of the caller, as luaL_where(L, 1) does, but of the
** first Lua caller outside the facade, so that an error names the user's
** line (also from a callback, whose caller is the binding's C function). */
static void l_where(lua_State *L) {
  lua_Debug ar;
  int level;
  for (level = 1; lua_getstack(L, level, &ar); level++) {
    lua_getinfo(L, "Sl", &ar);
    if (ar.currentline <= 0) continue; /* a C function (pcall, a callback's caller) */
    if (!l_isfacade(ar.source)) {
      lua_pushfstring(L, "%s:%d: ", ar.short_src, ar.currentline);
      return;
    }
  }
  lua_pushliteral(L, "");
}

/* luaL_error, with the position of l_where */
static int l_error(lua_State *L, const char *fmt, ...) {
  va_list argp;
  va_start(argp, fmt);
  l_where(L);
  lua_pushvfstring(L, fmt, argp);
  va_end(argp);
  lua_concat(L, 2);
  return lua_error(L);
}

/* Raise the core's message 'msg' of status 'st', prefixed by "op: " unless
** it names an op already. */
static void l_fail(lua_State *L, gcap_status st, const char *msg, const char *op) {
  size_t n = strlen(op);
  if (msg == NULL || *msg == '\0') msg = gcap_status_str(st);
  l_where(L);
  if ((strncmp(msg, op, n) == 0 && msg[n] == ':') || l_hasop(msg))
    lua_pushstring(L, msg);
  else
    lua_pushfstring(L, "%s: %s", op, msg);
  lua_concat(L, 2);
  lua_error(L);
}

/* Raise "op: message" when a core call returned 'st' != GCAP_OK. */
static void l_check(lua_State *L, const gcap_engine *e, gcap_status st, const char *op) {
  if (st != GCAP_OK) l_fail(L, st, gcap_errmsg(e), op);
}

static gcap_engine *l_engine(lua_State *L) {
  gcap_engine *e = ((LEngine *)lua_touserdata(L, ENGINEIDX))->e;
  if (e == NULL) luaL_error(L, "graphcap engine is closed");
  return e;
}

/* The type of the value at i for messages: __name of userdata. */
static const char *l_typename(lua_State *L, int i) {
  int t = (lua_type(L, i) == LUA_TUSERDATA) ? luaL_getmetafield(L, i, "__name") : LUA_TNIL;
  if (t == LUA_TSTRING) {
    const char *s = lua_tostring(L, -1); /* kept alive by the metatable */
    lua_pop(L, 1);
    return s;
  }
  if (t != LUA_TNIL) lua_pop(L, 1);
  return luaL_typename(L, i);
}

/* A new box in its closed state, linked to the engine box. */
static void *l_newbox(lua_State *L, size_t size, int nuv, const char *mt) {
  void *p = lua_newuserdatauv(L, size, nuv);
  memset(p, 0, size); /* NULL handle: closed */
  luaL_setmetatable(L, mt);
  lua_pushvalue(L, ENGINEIDX);
  lua_setiuservalue(L, -2, UV_ENGINE);
  return p;
}

#define l_newtensor(L) ((LTensor *)l_newbox(L, sizeof(LTensor), 1, TENSOR_MT))

static gcap_tensor *l_checktensor(lua_State *L, int i) {
  LTensor *p = (LTensor *)luaL_checkudata(L, i, TENSOR_MT);
  luaL_argcheck(L, p->t != NULL, i, "tensor is closed");
  return p->t;
}

static LStream *l_checkstream(lua_State *L, int i) {
  LStream *p = (LStream *)luaL_checkudata(L, i, STREAM_MT);
  luaL_argcheck(L, p->s != NULL, i, "stream is closed");
  return p;
}

static LEvent *l_checkevent(lua_State *L, int i) {
  LEvent *p = (LEvent *)luaL_checkudata(L, i, EVENT_MT);
  luaL_argcheck(L, p->ev != NULL, i, "event is closed");
  return p;
}

static LPool *l_checkpool(lua_State *L, int i) {
  LPool *p = (LPool *)luaL_checkudata(L, i, POOL_MT);
  luaL_argcheck(L, p->p != NULL, i, "pool is closed");
  return p;
}

static LGraph *l_checkgraph(lua_State *L, int i) {
  LGraph *p = (LGraph *)luaL_checkudata(L, i, GRAPH_MT);
  luaL_argcheck(L, p->g != NULL, i, "graph is closed");
  return p;
}

/* The dtype named at i (absent or nil: f32); errors name op. */
static gcap_dtype l_optdtype(lua_State *L, int i, const char *op) {
  int str = lua_type(L, i) == LUA_TSTRING;
  const char *s = str ? lua_tostring(L, i) : "";
  if (lua_isnoneornil(L, i) || strcmp(s, "f32") == 0) return GCAP_F32;
  if (strcmp(s, "bf16") == 0) return GCAP_BF16;
  l_error(L, "%s: unknown dtype %s (expected 'f32' or 'bf16')", op,
          str ? lua_pushfstring(L, "'%s'", s) : l_typename(L, i));
  return GCAP_F32;
}

static const char *l_dtypename(gcap_dtype dt) {
  return (dt == GCAP_BF16) ? "bf16" : "f32";
}

/* What a bad value was, for messages: the number itself or its type. */
static const char *l_got(lua_State *L, int i) {
  return (lua_type(L, i) == LUA_TNUMBER) ? luaL_tolstring(L, i, NULL) : luaL_typename(L, i);
}

/* Read the shape table at 'arg' into 'shape'; return its length. Errors
** name op and the user's line (the facade calls these for the user). */
static int l_checkshape(lua_State *L, int arg, int64_t *shape, const char *op) {
  lua_Unsigned n;
  int i;
  int64_t numel = 1;
  if (lua_type(L, arg) != LUA_TTABLE)
    l_error(L, "%s: shape must be a table of sizes, got %s", op, l_typename(L, arg));
  n = lua_rawlen(L, arg);
  if (n > GCAP_MAXDIM)
    l_error(L, "%s: shape has %I entries (at most %d)", op, (LUAI_UACINT)n, GCAP_MAXDIM);
  for (i = 0; i < (int)n; i++) {
    int isint;
    lua_Integer v;
    lua_rawgeti(L, arg, i + 1);
    v = lua_tointegerx(L, -1, &isint);
    if (lua_type(L, -1) != LUA_TNUMBER || !isint || v < 0)
      l_error(L, "%s: shape entry #%d must be a non-negative integer, got %s", op, i + 1,
              l_got(L, -1));
    if (v > 0 && numel > MAXNUMEL / v) l_error(L, "%s: shape has too many elements", op);
    numel *= v;
    shape[i] = v;
    lua_pop(L, 1);
  }
  return (int)n;
}

/* }====================================================== */

/*
** {======================================================
** Tensors
** =======================================================
*/

/* Nested tables being read by 'tensor' */
typedef struct LNest {
  int ndim;
  int64_t shape[GCAP_MAXDIM];
  lua_Integer pos[GCAP_MAXDIM]; /* index path of the entry being read */
  float *x;                     /* next element to fill */
} LNest;

/* Push the index path "[i][j]..." of the first 'depth' levels. */
static const char *l_pushpath(lua_State *L, const LNest *n, int depth) {
  int i;
  lua_pushliteral(L, "");
  for (i = 0; i < depth; i++)
    lua_pushfstring(L, "[%I]", (LUAI_UACINT)n->pos[i]);
  lua_concat(L, depth + 1);
  return lua_tostring(L, -1);
}

/* Infer the shape from the first entry of each level. */
static void l_nestshape(lua_State *L, LNest *n) {
  int64_t numel = 1;
  n->ndim = 0;
  lua_pushvalue(L, 1);
  while (lua_type(L, -1) == LUA_TTABLE) {
    int64_t len = (int64_t)lua_rawlen(L, -1);
    if (n->ndim == GCAP_MAXDIM)
      l_error(L, "tensor: entry %s is a table: more than %d dimensions", l_pushpath(L, n, n->ndim),
              GCAP_MAXDIM);
    if (len > 0 && numel > MAXNUMEL / len) l_error(L, "tensor: nested table has too many elements");
    numel *= len;
    n->shape[n->ndim] = len;
    n->pos[n->ndim++] = 1;
    if (len == 0) break;
    lua_rawgeti(L, -1, 1);
    lua_remove(L, -2);
  }
  lua_pop(L, 1);
}

/* Copy the numbers of the table on top (level 'd') into n->x, checking
** that every level has the inferred shape. */
static void l_nestfill(lua_State *L, LNest *n, int d) {
  lua_Integer i;
  for (i = 1; i <= n->shape[d]; i++) {
    int t = lua_rawgeti(L, -1, i);
    int v = lua_gettop(L); /* absolute: messages push before using it */
    n->pos[d] = i;
    if (d + 1 < n->ndim) {
      lua_Unsigned len = lua_rawlen(L, v);
      if (t != LUA_TTABLE)
        l_error(L, "tensor: entry %s must be a table, got %s", l_pushpath(L, n, d + 1),
                l_got(L, v));
      if ((int64_t)len != n->shape[d + 1])
        l_error(L, "tensor: ragged nested table: entry %s has %I entries, expected %I",
                l_pushpath(L, n, d + 1), (LUAI_UACINT)len, (LUAI_UACINT)n->shape[d + 1]);
      l_nestfill(L, n, d + 1);
    } else if (t != LUA_TNUMBER)
      l_error(L, "tensor: entry %s must be a number, got %s", l_pushpath(L, n, d + 1), l_got(L, v));
    else
      *n->x++ = (float)lua_tonumber(L, v);
    lua_pop(L, 1);
  }
}

/* tensor(nested_table_or_number [, dtype]) */
static int l_tensor(lua_State *L) {
  gcap_engine *e = l_engine(L);
  gcap_dtype dt = l_optdtype(L, 2, "tensor");
  LNest n;
  float scalar, *data = &scalar;
  LTensor *r;
  if (lua_type(L, 1) == LUA_TNUMBER) {
    n.ndim = 0;
    scalar = (float)lua_tonumber(L, 1);
  } else {
    int d;
    size_t numel = 1;
    if (lua_type(L, 1) != LUA_TTABLE)
      l_error(L, "tensor: data must be a number or a nested table of numbers, got %s",
              l_typename(L, 1));
    l_nestshape(L, &n);
    for (d = 0; d < n.ndim; d++)
      numel *= (size_t)n.shape[d];
    data = n.x = (float *)lua_newuserdatauv(L, numel * sizeof(float), 0);
    lua_pushvalue(L, 1);
    l_nestfill(L, &n, 0);
    lua_pop(L, 1);
  }
  r = l_newtensor(L);
  l_check(L, e, gcap_tensor_from_f32(e, dt, n.ndim, n.shape, data, &r->t), "tensor");
  return 1;
}

/* A new tensor of the shape at 1 and dtype at 'dtarg', filled with v
** (empty: uninitialised). */
static int l_newfilled(lua_State *L, int dtarg, int empty, double v, const char *op) {
  gcap_engine *e = l_engine(L);
  int64_t shape[GCAP_MAXDIM];
  int ndim = l_checkshape(L, 1, shape, op);
  gcap_dtype dt = l_optdtype(L, dtarg, op);
  LTensor *r = l_newtensor(L);
  l_check(L, e,
          empty ? gcap_tensor_empty(e, dt, ndim, shape, &r->t)
                : gcap_tensor_full(e, dt, ndim, shape, v, &r->t),
          op);
  return 1;
}

static int l_empty(lua_State *L) {
  return l_newfilled(L, 2, 1, 0.0, "empty");
}
static int l_zeros(lua_State *L) {
  return l_newfilled(L, 2, 0, 0.0, "zeros");
}
static int l_ones(lua_State *L) {
  return l_newfilled(L, 2, 0, 1.0, "ones");
}

static int l_full(lua_State *L) {
  if (lua_type(L, 2) != LUA_TNUMBER)
    l_error(L, "full: the fill value must be a number, got %s", l_typename(L, 2));
  return l_newfilled(L, 3, 0, lua_tonumber(L, 2), "full");
}

static int l_newrand(lua_State *L, int normal, const char *op) {
  gcap_engine *e = l_engine(L);
  int64_t shape[GCAP_MAXDIM];
  int ndim = l_checkshape(L, 1, shape, op);
  gcap_dtype dt = l_optdtype(L, 2, op);
  LTensor *r = l_newtensor(L);
  l_check(L, e, gcap_tensor_rand(e, dt, ndim, shape, normal, &r->t), op);
  return 1;
}

static int l_rand(lua_State *L) {
  return l_newrand(L, 0, "rand");
}
static int l_randn(lua_State *L) {
  return l_newrand(L, 1, "randn");
}

static int l_tensor_close(lua_State *L) {
  LTensor *p = (LTensor *)luaL_checkudata(L, 1, TENSOR_MT);
  gcap_tensor_free(p->t);
  p->t = NULL;
  return 0;
}

static int l_tensor_tostring(lua_State *L) {
  LTensor *p = (LTensor *)luaL_checkudata(L, 1, TENSOR_MT);
  if (p->t == NULL)
    lua_pushliteral(L, TENSOR_MT " (closed)");
  else {
    luaL_Buffer b;
    int i, n = gcap_tensor_ndim(p->t);
    const int64_t *shape = gcap_tensor_shape(p->t);
    luaL_buffinit(L, &b);
    luaL_addstring(&b, TENSOR_MT "(shape={");
    for (i = 0; i < n; i++) {
      lua_pushfstring(L, (i > 0) ? ",%I" : "%I", (LUAI_UACINT)shape[i]);
      luaL_addvalue(&b);
    }
    lua_pushfstring(L, "}, dtype=%s)", l_dtypename(gcap_tensor_dtype(p->t)));
    luaL_addvalue(&b);
    luaL_pushresult(&b);
  }
  return 1;
}

static int l_shape(lua_State *L) {
  gcap_tensor *t = l_checktensor(L, 1);
  int i, n = gcap_tensor_ndim(t);
  const int64_t *shape = gcap_tensor_shape(t);
  lua_createtable(L, n, 0);
  for (i = 0; i < n; i++) {
    lua_pushinteger(L, (lua_Integer)shape[i]);
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

static int l_numel(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)gcap_tensor_numel(l_checktensor(L, 1)));
  return 1;
}

static int l_dim(lua_State *L) {
  lua_pushinteger(L, gcap_tensor_ndim(l_checktensor(L, 1)));
  return 1;
}

static int l_dtype(lua_State *L) {
  lua_pushstring(L, l_dtypename(gcap_tensor_dtype(l_checktensor(L, 1))));
  return 1;
}

static int l_data_ptr(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)gcap_tensor_data_ptr(l_checktensor(L, 1)));
  return 1;
}

/* Push the next elements from *x as nested sequences of 'shape' (its
** 'ndim' >= 1 entries). */
static void l_pushnested(lua_State *L, const float **x, const int64_t *shape, int ndim) {
  int64_t i, n = shape[0];
  lua_createtable(L, (n <= INT_MAX) ? (int)n : 0, 0);
  for (i = 1; i <= n; i++) {
    if (ndim == 1)
      lua_pushnumber(L, (lua_Number) * (*x)++);
    else
      l_pushnested(L, x, shape + 1, ndim - 1);
    lua_rawseti(L, -2, (lua_Integer)i);
  }
}

static int l_tolist(lua_State *L) {
  gcap_tensor *t = l_checktensor(L, 1);
  size_t n = (size_t)gcap_tensor_numel(t);
  int ndim = gcap_tensor_ndim(t);
  float *x = (float *)lua_newuserdatauv(L, n * sizeof(float), 0);
  const float *next = x;
  l_check(L, gcap_tensor_engine(t), gcap_tensor_read(t, x, n), "tolist");
  if (ndim == 0)
    lua_pushnumber(L, (lua_Number)x[0]);
  else
    l_pushnested(L, &next, gcap_tensor_shape(t), ndim);
  return 1;
}

static int l_item(lua_State *L) {
  gcap_tensor *t = l_checktensor(L, 1);
  int64_t n = gcap_tensor_numel(t);
  float x;
  if (n != 1) return luaL_error(L, "item: tensor has %I elements (expected 1)", (LUAI_UACINT)n);
  l_check(L, gcap_tensor_engine(t), gcap_tensor_read(t, &x, 1), "item");
  lua_pushnumber(L, (lua_Number)x);
  return 1;
}

static int l_view(lua_State *L) {
  gcap_tensor *t = l_checktensor(L, 1);
  int64_t shape[GCAP_MAXDIM];
  int ndim = l_checkshape(L, 2, shape, "view");
  LTensor *r = l_newtensor(L);
  l_check(L, gcap_tensor_engine(t), gcap_tensor_view(t, ndim, shape, &r->t), "view");
  return 1;
}

static int l_copy_(lua_State *L) {
  gcap_tensor *t = l_checktensor(L, 1), *u = l_checktensor(L, 2);
  l_check(L, gcap_tensor_engine(t), gcap_copy_(t, u), "copy_");
  lua_settop(L, 1);
  return 1;
}

static int l_zero_(lua_State *L) {
  gcap_tensor *t = l_checktensor(L, 1);
  l_check(L, gcap_tensor_engine(t), gcap_zero_(t), "zero_");
  lua_settop(L, 1);
  return 1;
}

static int l_fill_(lua_State *L) {
  gcap_tensor *t = l_checktensor(L, 1);
  l_check(L, gcap_tensor_engine(t), gcap_fill_(t, luaL_checknumber(L, 2)), "fill_");
  lua_settop(L, 1);
  return 1;
}

static int l_unary(lua_State *L, l_unop f, const char *op) {
  gcap_tensor *t = l_checktensor(L, 1);
  LTensor *r = l_newtensor(L);
  l_check(L, gcap_tensor_engine(t), f(t, &r->t), op);
  return 1;
}

static int l_clone(lua_State *L) {
  return l_unary(L, gcap_tensor_clone, "clone");
}
static int l_sum(lua_State *L) {
  return l_unary(L, gcap_sum, "sum");
}
static int l_mean(lua_State *L) {
  return l_unary(L, gcap_mean, "mean");
}
static int l_unm(lua_State *L) {
  return l_unary(L, gcap_neg, "neg");
}

/*
** Operand 'i' of a binary op whose tensor operand is 't': a number
** becomes a 0-D tensor of t's dtype, left on the stack in box *tmp.
*/
static gcap_tensor *l_operand(lua_State *L, int i, gcap_tensor *t, LTensor **tmp, const char *op) {
  if (lua_type(L, i) == LUA_TNUMBER) {
    gcap_engine *e = gcap_tensor_engine(t);
    LTensor *p = l_newtensor(L);
    l_check(L, e,
            gcap_tensor_full(e, gcap_tensor_dtype(t), 0, l_noshape, lua_tonumber(L, i), &p->t), op);
    *tmp = p;
    return p->t;
  }
  return l_checktensor(L, i);
}

/* a op b, where a tensor is on either side and a number may be the other */
static int l_arith(lua_State *L, l_binop f, const char *op) {
  LTensor *tmp = NULL, *r;
  int ti = (luaL_testudata(L, 1, TENSOR_MT) != NULL) ? 1 : 2;
  gcap_tensor *t = l_checktensor(L, ti);
  gcap_tensor *a = (ti == 1) ? t : l_operand(L, 1, t, &tmp, op);
  gcap_tensor *b = (ti == 2) ? t : l_operand(L, 2, t, &tmp, op);
  gcap_status st;
  r = l_newtensor(L);
  st = f(a, b, &r->t);
  if (tmp != NULL) { /* release the 0-D operand now, not at collection */
    gcap_tensor_free(tmp->t);
    tmp->t = NULL;
  }
  l_check(L, gcap_tensor_engine(t), st, op);
  return 1;
}

static int l_add(lua_State *L) {
  return l_arith(L, gcap_add, "add");
}
static int l_sub(lua_State *L) {
  return l_arith(L, gcap_sub, "sub");
}

static int l_mul(lua_State *L) { /* a number on either side is a scale */
  int ni = (lua_type(L, 1) == LUA_TNUMBER) ? 1 : (lua_type(L, 2) == LUA_TNUMBER) ? 2 : 0;
  if (ni != 0) {
    gcap_tensor *t = l_checktensor(L, 3 - ni);
    LTensor *r = l_newtensor(L);
    l_check(L, gcap_tensor_engine(t), gcap_scale(t, lua_tonumber(L, ni), &r->t), "mul");
    return 1;
  }
  return l_arith(L, gcap_mul, "mul");
}

/*
** Push a box of 't', a tensor the core lends (a .grad, a parameter, a
** hook argument): the box already known for it while that one lives and
** holds it, else a new box with its own reference, which becomes known.
*/
static void l_pushborrowed(lua_State *L, gcap_tensor *t) {
  LTensor *p;
  lua_getiuservalue(L, ENGINEIDX, UV_TENSORS);
  if (lua_rawgetp(L, -1, t) == LUA_TUSERDATA && ((LTensor *)lua_touserdata(L, -1))->t == t) {
    lua_remove(L, -2);
    return;
  }
  lua_pop(L, 1);
  p = l_newtensor(L);
  p->t = gcap_tensor_retain(t);
  lua_pushvalue(L, -1);
  lua_rawsetp(L, -3, t);
  lua_remove(L, -2);
}

/* Make the (open) tensor box at i the known box of its tensor. */
static void l_keeptensor(lua_State *L, int i) {
  LTensor *p = (LTensor *)lua_touserdata(L, i);
  i = lua_absindex(L, i);
  lua_getiuservalue(L, ENGINEIDX, UV_TENSORS);
  lua_pushvalue(L, i);
  lua_rawsetp(L, -2, p->t);
  lua_pop(L, 1);
}

/* The box on top holds a new tensor from the core: replace it by the
** known box of that tensor, if there is one (a module that returned a
** tensor it was given, or one of its own). */
static void l_knownresult(lua_State *L) {
  LTensor *r = (LTensor *)lua_touserdata(L, -1);
  lua_getiuservalue(L, ENGINEIDX, UV_TENSORS);
  if (lua_rawgetp(L, -1, r->t) == LUA_TUSERDATA && ((LTensor *)lua_touserdata(L, -1))->t == r->t) {
    gcap_tensor_free(r->t); /* the known box holds it */
    r->t = NULL;
    lua_replace(L, -3);
    lua_pop(L, 1);
    return;
  }
  lua_pop(L, 2);
}

/* A Lua boolean at i, or 'def' when absent or nil. */
static int l_optboolean(lua_State *L, int i, int def, const char *what) {
  if (lua_isnoneornil(L, i)) return def;
  if (!lua_isboolean(L, i))
    luaL_argerror(L, i, lua_pushfstring(L, "%s must be a boolean, got %s", what, l_typename(L, i)));
  return lua_toboolean(L, i);
}

/* }====================================================== */

/*
** {======================================================
** Autograd
** =======================================================
*/

/*
** Frames. Between l_enter and l_leave only the core call runs (nothing
** that can raise), so a frame never outlives its C function.
*/
static LEngine *l_enter(lua_State *L, LFrame *f, gcap_module *m, int args, int nargs, int muted) {
  LEngine *le = (LEngine *)lua_touserdata(L, ENGINEIDX);
  f->L = L;
  f->m = m;
  f->args = args;
  f->nargs = nargs;
  f->muted = muted;
  f->prev = le->cur;
  le->cur = f;
  return le;
}

static void l_leave(LEngine *le, LFrame *f) {
  le->cur = f->prev;
}

/* Raise the error object a callback left, if any, as it is; a message
** (a string) gets 'ctx', the core's account of where the callback ran
** ("warmup forward of entry 1 (callable 1, function)"), appended in
** parentheses. */
static void l_raisecb(lua_State *L, const char *ctx) {
  LErr *h;
  lua_rawgetp(L, LUA_REGISTRYINDEX, &l_errkey);
  h = (LErr *)lua_touserdata(L, -1);
  if (h != NULL && h->set) {
    h->set = 0;
    lua_getiuservalue(L, -1, 1);
    lua_pushnil(L);
    lua_setiuservalue(L, -3, 1);
    if (ctx != NULL && *ctx != '\0' && lua_type(L, -1) == LUA_TSTRING) {
      lua_pushfstring(L, " (%s)", ctx);
      lua_concat(L, 2);
    }
    lua_error(L);
  }
  lua_pop(L, 1);
}

/* The start of the context of a callback's protected part */
typedef struct LCall {
  int nargs; /* how many Lua arguments of a direct call follow the context */
} LCall;

/*
** Call, from a core callback about module m (NULL: none), the protected
** function kept in the registry at 'key' with 'ctx', on the state of the
** engine's current frame, the C function of which is running on it. When
** that frame is a direct call of m, its Lua arguments follow ctx. On a Lua
** error, keep the error object (the first one) for l_raisecb and tell the
** core to stop. Nothing here can raise.
*/
static gcap_status l_callback(LEngine *le, const char *key, LCall *ctx, const gcap_module *m) {
  LFrame *f = le->cur;
  lua_State *L;
  int i, top, st;
  if (f == NULL) return GCAP_EABORTED; /* no Lua call in progress */
  L = f->L;
  ctx->nargs = (m != NULL && f->m == m) ? f->nargs : 0;
  if (!lua_checkstack(L, 4 + ctx->nargs)) return GCAP_ENOMEM;
  top = lua_gettop(L);
  lua_rawgetp(L, LUA_REGISTRYINDEX, key);
  lua_pushlightuserdata(L, ctx);
  for (i = 0; i < ctx->nargs; i++)
    lua_pushvalue(L, f->args + i);
  st = lua_pcall(L, 1 + ctx->nargs, 0, 0);
  if (st != LUA_OK) {
    LErr *h;
    lua_rawgetp(L, LUA_REGISTRYINDEX, &l_errkey);
    h = (LErr *)lua_touserdata(L, -1);
    if (h != NULL && !h->set) {
      lua_pushvalue(L, -2);
      lua_setiuservalue(L, -2, 1);
      h->set = 1;
    }
  }
  lua_settop(L, top);
  return (st == LUA_OK) ? GCAP_OK : GCAP_EABORTED;
}

/* t:requires_grad_([b = true]) -> t */
static int l_requires_grad_(lua_State *L) {
  gcap_tensor *t = l_checktensor(L, 1);
  int on = l_optboolean(L, 2, 1, "requires_grad");
  l_check(L, gcap_tensor_engine(t), gcap_tensor_set_requires_grad(t, on), "requires_grad_");
  lua_settop(L, 1);
  return 1;
}

static int l_detach(lua_State *L) {
  return l_unary(L, gcap_tensor_detach, "detach");
}

/* t:backward([grad [, retain_graph]]) (the facade takes an options table) */
static int l_backward(lua_State *L) {
  gcap_tensor *t = l_checktensor(L, 1);
  gcap_tensor *g = lua_isnoneornil(L, 2) ? NULL : l_checktensor(L, 2);
  int retain = lua_toboolean(L, 3);
  gcap_engine *e = gcap_tensor_engine(t);
  char msg[1024];
  LFrame f;
  LEngine *le;
  gcap_status st;
  gcap_tensor_retain(t); /* a hook may close their boxes */
  gcap_tensor_retain(g);
  le = l_enter(L, &f, NULL, 0, 0, 0);
  st = gcap_backward(t, g, retain);
  l_leave(le, &f);
  if (st != GCAP_OK) snprintf(msg, sizeof msg, "%s", gcap_errmsg(e));
  gcap_tensor_free(g);
  gcap_tensor_free(t);
  l_raisecb(L, NULL);
  if (st != GCAP_OK) l_fail(L, st, msg, "backward");
  return 0;
}

/* t.requires_grad, t.grad, t.grad_fn, t.is_leaf, and the methods */
static int l_tensor_index(lua_State *L) {
  const char *k;
  gcap_tensor *t;
  lua_settop(L, 2);
  lua_pushvalue(L, 2);
  if (lua_rawget(L, lua_upvalueindex(2)) != LUA_TNIL || lua_type(L, 2) != LUA_TSTRING) return 1;
  k = lua_tostring(L, 2);
  if (strcmp(k, "requires_grad") == 0)
    lua_pushboolean(L, gcap_tensor_requires_grad(l_checktensor(L, 1)));
  else if (strcmp(k, "grad") == 0) {
    t = gcap_tensor_grad(l_checktensor(L, 1));
    if (t == NULL)
      lua_pushnil(L);
    else
      l_pushborrowed(L, t);
  } else if (strcmp(k, "grad_fn") == 0)
    lua_pushstring(L, gcap_tensor_grad_fn_name(l_checktensor(L, 1)));
  else if (strcmp(k, "is_leaf") == 0)
    lua_pushboolean(L, gcap_tensor_is_leaf(l_checktensor(L, 1)));
  else if (strcmp(k, "_version") == 0)
    lua_pushinteger(L, (lua_Integer)gcap_tensor_version(l_checktensor(L, 1)));
  return 1; /* nil for other names, as a table would */
}

/* t.requires_grad = b; t.grad = nil | tensor */
static int l_tensor_newindex(lua_State *L) {
  gcap_tensor *t = l_checktensor(L, 1);
  const char *k = (lua_type(L, 2) == LUA_TSTRING) ? lua_tostring(L, 2) : "";
  if (strcmp(k, "requires_grad") == 0) {
    if (!lua_isboolean(L, 3))
      return l_error(L, "requires_grad must be a boolean, got %s", l_typename(L, 3));
    l_check(L, gcap_tensor_engine(t), gcap_tensor_set_requires_grad(t, lua_toboolean(L, 3)),
            "requires_grad");
  } else if (strcmp(k, "grad") == 0) {
    gcap_tensor *g = NULL;
    if (!lua_isnil(L, 3)) {
      if (luaL_testudata(L, 3, TENSOR_MT) == NULL)
        return l_error(L, "grad must be a tensor or nil, got %s", l_typename(L, 3));
      g = l_checktensor(L, 3);
    }
    l_check(L, gcap_tensor_engine(t), gcap_tensor_set_grad(t, g), "grad");
    if (g != NULL) l_keeptensor(L, 3); /* t.grad reads back this same value */
  } else
    return l_error(L,
                   TENSOR_MT " has no assignable field '%s' "
                             "(only requires_grad and grad)",
                   luaL_tolstring(L, 2, NULL));
  return 0;
}

/* }====================================================== */

/*
** {======================================================
** Ops (gc.matmul, gc.F.*, and their tensor methods)
** =======================================================
*/

static int l_binary(lua_State *L, l_binop f, const char *op) {
  gcap_tensor *a = l_checktensor(L, 1), *b = l_checktensor(L, 2);
  LTensor *r = l_newtensor(L);
  l_check(L, gcap_tensor_engine(a), f(a, b, &r->t), op);
  return 1;
}

static int l_matmul(lua_State *L) {
  return l_binary(L, gcap_matmul, "matmul");
}

static int l_relu(lua_State *L) {
  return l_unary(L, gcap_relu, "relu");
}
static int l_gelu(lua_State *L) {
  return l_unary(L, gcap_gelu, "gelu");
}

static int l_mse_loss(lua_State *L) {
  return l_binary(L, gcap_mse_loss, "mse_loss");
}

static int l_cross_entropy(lua_State *L) {
  return l_binary(L, gcap_cross_entropy, "cross_entropy");
}

/* linear(x, w [, b]) and linear_gelu(x, w [, b]) */
static int l_linear_op(lua_State *L,
                       gcap_status (*op)(gcap_tensor *, gcap_tensor *, gcap_tensor *,
                                         gcap_tensor **),
                       const char *name) {
  gcap_tensor *x = l_checktensor(L, 1), *w = l_checktensor(L, 2);
  gcap_tensor *b = lua_isnoneornil(L, 3) ? NULL : l_checktensor(L, 3);
  LTensor *r = l_newtensor(L);
  l_check(L, gcap_tensor_engine(x), op(x, w, b, &r->t), name);
  return 1;
}

static int l_linear(lua_State *L) {
  return l_linear_op(L, gcap_linear, "linear");
}

static int l_linear_gelu(lua_State *L) {
  return l_linear_op(L, gcap_linear_gelu, "linear_gelu");
}

/* layer_norm(x [, w [, b [, eps = 1e-5]]]) */
static int l_layer_norm(lua_State *L) {
  gcap_tensor *x = l_checktensor(L, 1);
  gcap_tensor *w = lua_isnoneornil(L, 2) ? NULL : l_checktensor(L, 2);
  gcap_tensor *b = lua_isnoneornil(L, 3) ? NULL : l_checktensor(L, 3);
  double eps = (double)luaL_optnumber(L, 4, 1e-5);
  LTensor *r = l_newtensor(L);
  l_check(L, gcap_tensor_engine(x), gcap_layer_norm(x, w, b, eps, &r->t), "layer_norm");
  return 1;
}

/* softmax(x [, dim = -1]): Lua dims count from 1; -1 is the last one */
static int l_softmax(lua_State *L) {
  gcap_tensor *x = l_checktensor(L, 1);
  lua_Integer d = luaL_optinteger(L, 2, -1);
  int n = gcap_tensor_ndim(x);
  LTensor *r;
  if (n > 0) {
    lua_Integer p = (d < 0) ? d + n + 1 : d; /* 1-based */
    if (d == 0 || p < 1 || p > n)
      return l_error(L,
                     "softmax: dim %I is out of range for a %d-D tensor "
                     "(dims count from 1; -1 is the last)",
                     (LUAI_UACINT)d, n);
    if (p != n)
      return l_error(L,
                     "softmax: only the last dimension is supported "
                     "(dim -1 or %d), got dim %I",
                     n, (LUAI_UACINT)d);
  }
  r = l_newtensor(L);
  l_check(L, gcap_tensor_engine(x), gcap_softmax(x, -1, &r->t), "softmax");
  return 1;
}

/* dropout(x [, p = 0.5 [, training = true]]) */
static int l_dropout(lua_State *L) {
  gcap_tensor *x = l_checktensor(L, 1);
  double p = (double)luaL_optnumber(L, 2, 0.5);
  int training = l_optboolean(L, 3, 1, "training");
  LTensor *r = l_newtensor(L);
  l_check(L, gcap_tensor_engine(x), gcap_dropout(x, p, training, &r->t), "dropout");
  return 1;
}

static int l_set_grad_enabled(lua_State *L) {
  gcap_engine *e = l_engine(L);
  luaL_checktype(L, 1, LUA_TBOOLEAN);
  lua_pushboolean(L, gcap_set_grad_enabled(e, lua_toboolean(L, 1)));
  return 1;
}

static int l_is_grad_enabled(lua_State *L) {
  lua_pushboolean(L, gcap_is_grad_enabled(l_engine(L)));
  return 1;
}

static const luaL_Reg l_F_funcs[] = {{"linear", l_linear},
                                     {"linear_gelu", l_linear_gelu},
                                     {"relu", l_relu},
                                     {"gelu", l_gelu},
                                     {"layer_norm", l_layer_norm},
                                     {"softmax", l_softmax},
                                     {"dropout", l_dropout},
                                     {"mse_loss", l_mse_loss},
                                     {"cross_entropy", l_cross_entropy},
                                     {NULL, NULL}};

/* The Tensor metatable; l_tensor_index and l_tensor_newindex replace its
** __index by a function over these methods (luaopen_graphcap_core). */
static const luaL_Reg l_tensor_meta[] = {{"__gc", l_tensor_close},
                                         {"__close", l_tensor_close},
                                         {"__tostring", l_tensor_tostring},
                                         {"__add", l_add},
                                         {"__sub", l_sub},
                                         {"__mul", l_mul},
                                         {"__unm", l_unm},
                                         {NULL, NULL}};

static const luaL_Reg l_tensor_methods[] = {{"shape", l_shape},
                                            {"numel", l_numel},
                                            {"dim", l_dim},
                                            {"dtype", l_dtype},
                                            {"tolist", l_tolist},
                                            {"item", l_item},
                                            {"data_ptr", l_data_ptr},
                                            {"clone", l_clone},
                                            {"view", l_view},
                                            {"copy_", l_copy_},
                                            {"zero_", l_zero_},
                                            {"fill_", l_fill_},
                                            {"sum", l_sum},
                                            {"mean", l_mean},
                                            {"requires_grad_", l_requires_grad_},
                                            {"detach", l_detach},
                                            {"backward", l_backward},
                                            {"matmul", l_matmul},
                                            {"relu", l_relu},
                                            {"gelu", l_gelu},
                                            {"softmax", l_softmax},
                                            {"close", l_tensor_close},
                                            {NULL, NULL}};

/* }====================================================== */

/*
** {======================================================
** Modules
** =======================================================
*/

static int l_module_forward(lua_State *L);

static LModule *l_checkmodule(lua_State *L, int i) {
  LModule *p = (LModule *)luaL_checkudata(L, i, MODULE_MT);
  luaL_argcheck(L, p->m != NULL, i, "module is closed");
  return p;
}

/* A new Module box in its closed state, of the class at index 'cls' (0:
** none). */
static LModule *l_newmodule(lua_State *L, int cls) {
  LModule *p;
  cls = (cls != 0) ? lua_absindex(L, cls) : 0;
  p = (LModule *)l_newbox(L, sizeof *p, NUV_MODULE, MODULE_MT);
  lua_newtable(L);
  lua_setiuservalue(L, -2, UV_FIELDS);
  if (cls != 0) {
    lua_pushvalue(L, cls);
    lua_setiuservalue(L, -2, UV_CLASS);
  }
  lua_newtable(L);
  lua_setiuservalue(L, -2, UV_HOOKS);
  lua_newtable(L);
  lua_setiuservalue(L, -2, UV_REG);
  return p;
}

/* Make the (open) Module box on top the Lua value of its module. */
static void l_keepmodule(lua_State *L) {
  LModule *p = (LModule *)lua_touserdata(L, -1);
  lua_getiuservalue(L, ENGINEIDX, UV_MODULES);
  lua_pushvalue(L, -2);
  lua_rawsetp(L, -2, p->m);
  lua_pop(L, 1);
}

/* Push the Lua value of module m and return 1, or push nothing and return
** 0 when it has none (collected or closed). */
static int l_findmodule(lua_State *L, gcap_module *m) {
  lua_getiuservalue(L, ENGINEIDX, UV_MODULES);
  if (lua_rawgetp(L, -1, m) == LUA_TUSERDATA && ((LModule *)lua_touserdata(L, -1))->m == m) {
    lua_remove(L, -2);
    return 1;
  }
  lua_pop(L, 2);
  return 0;
}

static void l_adoptfields(lua_State *L, int i);

/* Push the Lua value of module m, making one (of the built-in class of its
** type, if any) for a module that has none. */
static void l_pushmodule(lua_State *L, gcap_module *m) {
  LModule *p;
  if (l_findmodule(L, m)) return;
  lua_getiuservalue(L, ENGINEIDX, UV_CLASSES);
  lua_getfield(L, -1, gcap_module_type(m));
  p = l_newmodule(L, lua_istable(L, -1) ? -1 : 0);
  p->m = gcap_module_retain(m);
  lua_replace(L, -3);
  lua_pop(L, 1);
  l_keepmodule(L);
  l_adoptfields(L, -1);
}

/* Register a name of the module box at 'mi' as 'kind' and as a field whose
** value is on top (popped). */
static void l_setfield(lua_State *L, int mi, const char *name, const char *kind) {
  lua_getiuservalue(L, mi, UV_FIELDS);
  lua_pushvalue(L, -2);
  lua_setfield(L, -2, name);
  lua_pop(L, 2);
  lua_getiuservalue(L, mi, UV_REG);
  lua_pushstring(L, kind);
  lua_setfield(L, -2, name);
  lua_pop(L, 1);
}

/* Give the module box at i (one that the binding did not build field by
** field: a built-in) its own parameters, buffers and children as fields,
** as if they had been assigned. */
static void l_adoptfields(lua_State *L, int i) {
  gcap_module *m = ((LModule *)lua_touserdata(L, i))->m;
  char name[256];
  int j, n;
  i = lua_absindex(L, i);
  n = gcap_module_num_parameters(m);
  for (j = 0; j < n; j++) {
    gcap_tensor *t = gcap_module_parameter(m, j, name, sizeof name);
    if (strchr(name, '.') != NULL) break; /* the children's come last */
    l_pushborrowed(L, t);
    l_setfield(L, i, name, "parameter");
  }
  n = gcap_module_num_buffers(m);
  for (j = 0; j < n; j++) {
    gcap_tensor *t = gcap_module_buffer(m, j, name, sizeof name);
    if (strchr(name, '.') != NULL) break;
    l_pushborrowed(L, t);
    l_setfield(L, i, name, "buffer");
  }
  n = gcap_module_num_children(m);
  for (j = 0; j < n; j++) {
    const char *cname;
    gcap_module *c = gcap_module_child(m, j, &cname);
    l_pushmodule(L, c);
    l_setfield(L, i, cname, "child");
  }
}

static int l_module_close(lua_State *L) {
  LModule *p = (LModule *)luaL_checkudata(L, 1, MODULE_MT);
  if (p->m != NULL) {
    /* its hooks live in its uservalue: they go with it */
    if (lua_getiuservalue(L, 1, UV_HOOKS) == LUA_TTABLE) {
      lua_pushnil(L);
      while (lua_next(L, -2) != 0) {
        LHandle *h = (LHandle *)lua_touserdata(L, -1);
        if (h != NULL && h->m != NULL) {
          gcap_module_remove_hook(h->m, h->id);
          h->m = NULL;
        }
        lua_pop(L, 1);
      }
    }
    gcap_module_free(p->m);
    p->m = NULL;
  }
  return 0;
}

static int l_module_tostring(lua_State *L) {
  LModule *p = (LModule *)luaL_checkudata(L, 1, MODULE_MT);
  if (p->m == NULL)
    lua_pushliteral(L, MODULE_MT " (closed)");
  else
    lua_pushstring(L, gcap_module_type(p->m));
  return 1;
}

/*
** Push the arguments of a module's forward or forward-pre hooks: 'in' (nin
** tensors). In a direct call of the module, c->nargs Lua arguments of that
** call are at 2.. (after the context): those are pushed (non-tensor ones
** too), each tensor the same Lua value unless the core passes another
** tensor in its place.
*/
static int l_pushargs(lua_State *L, const LCall *c, int nin, gcap_tensor *const *in) {
  int i;
  if (c->nargs > 0) {
    int k = 0;
    luaL_checkstack(L, c->nargs, "too many arguments");
    for (i = 0; i < c->nargs; i++) {
      LTensor *p = (LTensor *)luaL_testudata(L, 2 + i, TENSOR_MT);
      if (p != NULL && k < nin) {
        if (p->t == in[k])
          lua_pushvalue(L, 2 + i);
        else
          l_pushborrowed(L, in[k]);
        k++;
      } else
        lua_pushvalue(L, 2 + i);
    }
    return c->nargs;
  }
  luaL_checkstack(L, nin, "too many arguments");
  for (i = 0; i < nin; i++)
    l_pushborrowed(L, in[i]);
  return nin;
}

/* A Lua module's forward, called by the core */
typedef struct LFwdCall {
  LCall c;
  gcap_module *m;
  int nin;
  gcap_tensor *const *in;
  gcap_tensor **out;
} LFwdCall;

/* A module graphed with sample_kwargs (field graphed_kwargs: its sorted
** keys) called by the core gets its trailing tensors back as the kwargs map,
** as its Lua caller passed it. Returns the new argument count. */
static int l_packkwargs(lua_State *L, int mi, int n) {
  int nk, i;
  lua_getiuservalue(L, mi, UV_FIELDS);
  if (lua_getfield(L, -1, "graphed_kwargs") != LUA_TTABLE) {
    lua_pop(L, 2);
    return n;
  }
  nk = (int)lua_rawlen(L, -1);
  lua_replace(L, -2); /* keys */
  if (nk == 0 || nk > n) {
    lua_pop(L, 1);
    return n;
  }
  lua_createtable(L, 0, nk); /* map */
  for (i = nk; i >= 1; i--) {
    lua_rawgeti(L, -2, i);                 /* key */
    lua_pushvalue(L, -(3 + (nk - i) + 1)); /* the i-th trailing tensor */
    lua_settable(L, -3);
  }
  lua_replace(L, -(nk + 2)); /* the map where the first kwarg tensor was */
  lua_pop(L, nk);            /* keys and the other kwarg tensors */
  return n - nk + 1;
}

/* The protected part: out = Class.forward(self, args...) */
static int l_pforward(lua_State *L) {
  LFwdCall *c = (LFwdCall *)lua_touserdata(L, 1);
  const char *type = gcap_module_type(c->m);
  int mi, fi, n;
  LTensor *r;
  if (!l_findmodule(L, c->m))
    return l_error(L, "%s: the module's Lua value was closed or collected", type);
  mi = lua_gettop(L);
  if (lua_getfield(L, mi, "forward") != LUA_TFUNCTION /* its class's */
      || lua_tocfunction(L, -1) == l_module_forward)
    return l_error(L, "%s:forward is not defined", type);
  fi = lua_gettop(L);
  lua_pushvalue(L, mi);
  n = l_pushargs(L, &c->c, c->nin, c->in);
  if (c->c.nargs == 0) n = l_packkwargs(L, mi, n);
  lua_call(L, n + 1, LUA_MULTRET);
  n = lua_gettop(L) - fi + 1; /* results */
  if (n != 1)
    return l_error(L, "%s:forward must return a tensor, got %s", type,
                   (n == 0) ? "no value" : lua_pushfstring(L, "%d values", n));
  r = (LTensor *)luaL_testudata(L, fi, TENSOR_MT);
  if (r == NULL || r->t == NULL)
    return l_error(L, "%s:forward must return a tensor, got %s", type,
                   (r == NULL) ? l_typename(L, fi) : "a closed tensor");
  l_keeptensor(L, fi); /* m(...) returns this same value */
  *c->out = gcap_tensor_retain(r->t);
  return 0;
}

/* gcap_forward_fn of Lua modules; ud is the engine box's LEngine */
static gcap_status l_lua_forward(void *ud, gcap_module *m, int nin, gcap_tensor *const *in,
                                 gcap_tensor **out) {
  LFwdCall c = {{0}, m, nin, in, out};
  return l_callback((LEngine *)ud, &l_fwdkey, &c.c, m);
}

/* A module hook, called by the core */
typedef struct LHookCall {
  LCall c;
  const LHandle *h;
  gcap_module *m;
  const gcap_hook_args *a;
} LHookCall;

/* The protected part: f(module, ...) by kind */
static int l_phook(lua_State *L) {
  LHookCall *c = (LHookCall *)lua_touserdata(L, 1);
  const gcap_hook_args *a = c->a;
  int mi, n = 1;
  if (!l_findmodule(L, c->m)) return 0; /* gone, and its hooks with it */
  mi = lua_gettop(L);
  lua_getiuservalue(L, mi, UV_HOOKS);
  if (lua_rawgeti(L, -1, c->h->key) != LUA_TUSERDATA) return 0;
  lua_getiuservalue(L, -1, UV_HOOKFN);
  lua_pushvalue(L, mi);
  switch (a->kind) {
    case GCAP_HOOK_FORWARD_PRE:
      n += l_pushargs(L, &c->c, a->nin, a->in);
      break;
    case GCAP_HOOK_FORWARD: {
      int i, k = l_pushargs(L, &c->c, a->nin, a->in);
      lua_createtable(L, k, 0); /* args_table */
      lua_insert(L, -(k + 1));
      for (i = k; i >= 1; i--)
        lua_rawseti(L, -(i + 1), i);
      if (a->out != NULL)
        l_pushborrowed(L, a->out);
      else
        lua_pushnil(L);
      n += 2;
      break;
    }
    case GCAP_HOOK_BACKWARD_PRE:
      if (a->grad_out != NULL)
        l_pushborrowed(L, a->grad_out);
      else
        lua_pushnil(L);
      n += 1;
      break;
    case GCAP_HOOK_BACKWARD:
      if (a->grad_in != NULL)
        l_pushborrowed(L, a->grad_in);
      else
        lua_pushnil(L);
      if (a->grad_out != NULL)
        l_pushborrowed(L, a->grad_out);
      else
        lua_pushnil(L);
      n += 2;
      break;
  }
  lua_call(L, n, 0); /* what it returns is ignored */
  return 0;
}

/* gcap_module_hook of every hook registered from Lua; ud is its LHandle */
static gcap_status l_hook(void *ud, gcap_module *m, const gcap_hook_args *a) {
  const LHandle *h = (const LHandle *)ud;
  const LFrame *f = h->le->cur;
  int fwd = (a->kind == GCAP_HOOK_FORWARD_PRE || a->kind == GCAP_HOOK_FORWARD);
  LHookCall c = {{0}, h, m, a};
  if (fwd && f != NULL && f->muted && f->m == m) return GCAP_OK; /* m:forward(...) */
  return l_callback(h->le, &l_hookkey, &c.c, fwd ? m : NULL);
}

/* How many tensors a call of the module at mi passes, with n arguments:
** n, plus its kwargs when it was graphed with sample_kwargs. */
static int l_maxin(lua_State *L, int mi, int n) {
  lua_getiuservalue(L, mi, UV_FIELDS);
  if (lua_getfield(L, -1, "graphed_kwargs") == LUA_TTABLE) n += (int)lua_rawlen(L, -1);
  lua_pop(L, 2);
  return n;
}

/* Room for n tensor pointers, on the stack (collected with the call) */
static gcap_tensor **l_inbuf(lua_State *L, int n) {
  return (gcap_tensor **)lua_newuserdatauv(L, sizeof(gcap_tensor *) * (size_t)(n + 1), 0);
}

/* A module graphed with sample_kwargs: the kwargs map (its last argument)
** adds its tensors to in[] (room from l_maxin), in the sample's sorted key
** order. */
static int l_flatkwargs(lua_State *L, int mi, int kwi, gcap_tensor **in, int nin,
                        const char *type) {
  int nk, i;
  lua_getiuservalue(L, mi, UV_FIELDS);
  if (lua_getfield(L, -1, "graphed_kwargs") != LUA_TTABLE) {
    lua_pop(L, 2);
    return nin;
  }
  if (kwi == 0 || lua_type(L, kwi) != LUA_TTABLE || luaL_testudata(L, kwi, TENSOR_MT))
    l_error(L, "%s was graphed with sample_kwargs: pass them as a table, its last argument", type);
  nk = (int)lua_rawlen(L, -1);
  for (i = 1; i <= nk; i++) {
    LTensor *t;
    lua_rawgeti(L, -1, i);
    lua_pushvalue(L, -1);
    lua_rawget(L, kwi); /* raw: no Lua code runs while in[] fills */
    t = (LTensor *)luaL_testudata(L, -1, TENSOR_MT);
    if (t == NULL || t->t == NULL)
      return l_error(L,
                     "%s was graphed with kwarg '%s', but it was not given "
                     "(as a tensor) in this call",
                     type, lua_tostring(L, -2));
    in[nin++] = t->t;
    lua_pop(L, 2);
  }
  lua_pop(L, 2);
  return nin;
}

/* m(...) (muted = 0) and, for built-ins, m:forward(...) (muted = 1) */
static int l_modcall(lua_State *L, int muted) {
  LModule *p = l_checkmodule(L, 1);
  gcap_module *m = p->m;
  gcap_engine *e = l_engine(L);
  int islua = (gcap_module_userdata(m) == lua_touserdata(L, ENGINEIDX));
  int i, nargs = lua_gettop(L) - 1, nin = 0;
  gcap_tensor **in = l_inbuf(L, l_maxin(L, 1, nargs));
  char msg[1024], op[256];
  LFrame f;
  LEngine *le;
  LTensor *r;
  gcap_status st;
  for (i = 2; i <= nargs + 1; i++) {
    LTensor *t = (LTensor *)luaL_testudata(L, i, TENSOR_MT);
    if (t == NULL) {
      if (!islua) /* a Lua forward takes any value; the core, tensors */
        return l_error(L, "%s: argument #%d must be a tensor, got %s", gcap_module_type(m), i - 1,
                       l_typename(L, i));
      continue;
    }
    luaL_argcheck(L, t->t != NULL, i, "tensor is closed");
    in[nin++] = t->t;
    l_keeptensor(L, i); /* children and hooks see this same value */
  }
  nin = l_flatkwargs(L, 1, nargs > 0 ? nargs + 1 : 0, in, nin, gcap_module_type(m));
  r = l_newtensor(L);
  gcap_module_retain(m); /* callbacks may close the boxes of m and 'in' */
  for (i = 0; i < nin; i++)
    gcap_tensor_retain(in[i]);
  le = l_enter(L, &f, m, 2, nargs, muted);
  st = gcap_module_call(m, nin, in, &r->t);
  l_leave(le, &f);
  if (st != GCAP_OK) { /* m may go with its retain: copy what the message needs */
    snprintf(msg, sizeof msg, "%s", gcap_errmsg(e));
    snprintf(op, sizeof op, "%s", gcap_module_type(m));
  }
  for (i = 0; i < nin; i++)
    gcap_tensor_free(in[i]);
  gcap_module_free(m);
  l_raisecb(L, NULL);
  if (st != GCAP_OK) l_fail(L, st, msg, op);
  l_knownresult(L);
  return 1;
}

static int l_module_call(lua_State *L) {
  return l_modcall(L, 0);
}

/* m:forward(...) of a built-in or of a class without forward (a class's
** own forward is found first, and called as a plain Lua function) */
static int l_module_forward(lua_State *L) {
  return l_modcall(L, 1);
}

/* m.training, fields, then the class (its methods), then the methods of
** every module (upvalue 2) */
static int l_module_index(lua_State *L) {
  LModule *p = (LModule *)luaL_checkudata(L, 1, MODULE_MT);
  lua_settop(L, 2);
  if (lua_type(L, 2) == LUA_TSTRING && strcmp(lua_tostring(L, 2), "training") == 0) {
    luaL_argcheck(L, p->m != NULL, 1, "module is closed");
    lua_pushboolean(L, gcap_module_training(p->m));
    return 1;
  }
  lua_getiuservalue(L, 1, UV_FIELDS);
  lua_pushvalue(L, 2);
  if (lua_rawget(L, -2) != LUA_TNIL) return 1;
  if (lua_getiuservalue(L, 1, UV_CLASS) == LUA_TTABLE) {
    lua_pushvalue(L, 2);
    if (lua_gettable(L, -2) != LUA_TNIL) return 1;
  }
  lua_pushvalue(L, 2);
  lua_rawget(L, lua_upvalueindex(2));
  return 1;
}

/* Is the tensor box at i one to register as a parameter? */
static int l_isparam(lua_State *L, int i, gcap_tensor *t) {
  int marked;
  if (gcap_tensor_requires_grad(t) && gcap_tensor_is_leaf(t)) return 1;
  lua_getiuservalue(L, ENGINEIDX, UV_PMARKS);
  lua_pushvalue(L, i);
  marked = (lua_rawget(L, -2) != LUA_TNIL);
  lua_pop(L, 2);
  return marked;
}

/*
** m.k = v: a module registers a child named k, a tensor that requires grad
** (a leaf) or that nn.Parameter marked registers a parameter, in the order
** of assignment; any value is kept as a field, read back as it is.
** Registered names cannot be reassigned (graphcap.h cannot unregister).
*/
static int l_module_newindex(lua_State *L) {
  LModule *p = l_checkmodule(L, 1);
  const char *type = gcap_module_type(p->m);
  const char *kind = NULL;
  LModule *child = NULL;
  LTensor *t = NULL;
  gcap_status st;
  lua_settop(L, 3);
  if (lua_type(L, 2) == LUA_TSTRING && strcmp(lua_tostring(L, 2), "training") == 0)
    return l_error(L,
                   "%s: training cannot be assigned; use m:train(b) "
                   "or m:eval()",
                   type);
  lua_getiuservalue(L, 1, UV_REG);    /* 4 */
  lua_getiuservalue(L, 1, UV_FIELDS); /* 5 */
  lua_pushvalue(L, 2);
  if (lua_rawget(L, 4) != LUA_TNIL) { /* a registered name */
    lua_pushvalue(L, 2);
    lua_rawget(L, 5);
    if (lua_rawequal(L, -1, 3)) return 0; /* the same value again */
    return l_error(L,
                   "%s: '%s' is a registered %s and cannot be "
                   "reassigned",
                   type, lua_tostring(L, 2), lua_tostring(L, 6));
  }
  lua_pop(L, 1);
  if (luaL_testudata(L, 3, MODULE_MT) != NULL) {
    child = l_checkmodule(L, 3);
    kind = "child";
  } else if ((t = (LTensor *)luaL_testudata(L, 3, TENSOR_MT)) != NULL && t->t != NULL &&
             l_isparam(L, 3, t->t))
    kind = "parameter";
  if (kind != NULL && lua_type(L, 2) != LUA_TSTRING)
    return l_error(L, "%s: a %s needs a string name, got %s", type, kind, l_typename(L, 2));
  lua_pushvalue(L, 2);
  lua_pushvalue(L, 3);
  lua_rawset(L, 5);
  if (kind == NULL) return 0;
  lua_pushvalue(L, 2);
  lua_pushstring(L, kind);
  lua_rawset(L, 4);
  if (child != NULL)
    st = gcap_module_add_child(p->m, lua_tostring(L, 2), child->m);
  else {
    l_keeptensor(L, 3); /* m:parameters() gives this value */
    st = gcap_module_add_parameter(p->m, lua_tostring(L, 2), t->t);
  }
  if (st != GCAP_OK) { /* undo (no allocation: the keys exist) */
    lua_pushvalue(L, 2);
    lua_pushnil(L);
    lua_rawset(L, 4);
    lua_pushvalue(L, 2);
    lua_pushnil(L);
    lua_rawset(L, 5);
    l_check(L, l_engine(L), st, type);
  }
  return 0;
}

/* m:register_buffer(name, t) */
static int l_register_buffer(lua_State *L) {
  LModule *p = l_checkmodule(L, 1);
  const char *name = luaL_checkstring(L, 2);
  gcap_tensor *t = l_checktensor(L, 3);
  gcap_status st;
  lua_settop(L, 3);
  lua_getiuservalue(L, 1, UV_REG);    /* 4 */
  lua_getiuservalue(L, 1, UV_FIELDS); /* 5 */
  if (lua_getfield(L, 4, name) != LUA_TNIL)
    return l_error(L, "%s: '%s' is a registered %s already", gcap_module_type(p->m), name,
                   lua_tostring(L, -1));
  lua_pop(L, 1);
  lua_pushvalue(L, 3);
  lua_setfield(L, 5, name);
  lua_pushliteral(L, "buffer");
  lua_setfield(L, 4, name);
  st = gcap_module_add_buffer(p->m, name, t);
  if (st != GCAP_OK) {
    lua_pushnil(L);
    lua_setfield(L, 4, name);
    lua_pushnil(L);
    lua_setfield(L, 5, name);
    l_check(L, l_engine(L), st, "register_buffer");
  }
  l_keeptensor(L, 3);
  return 0;
}

/* m:parameters(), m:buffers() and their named_ forms: a sequence of
** tensors, or of {name, tensor} pairs, in the core's order */
static int l_tensorlist(lua_State *L, int buffers, int named) {
  gcap_module *m = l_checkmodule(L, 1)->m;
  char name[512];
  int i, n = buffers ? gcap_module_num_buffers(m) : gcap_module_num_parameters(m);
  lua_createtable(L, n, 0);
  for (i = 0; i < n; i++) {
    char *nm = named ? name : NULL;
    gcap_tensor *t = buffers ? gcap_module_buffer(m, i, nm, sizeof name)
                             : gcap_module_parameter(m, i, nm, sizeof name);
    if (named) {
      lua_createtable(L, 2, 0);
      lua_pushstring(L, name);
      lua_rawseti(L, -2, 1);
      l_pushborrowed(L, t);
      lua_rawseti(L, -2, 2);
    } else
      l_pushborrowed(L, t);
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

static int l_parameters(lua_State *L) {
  return l_tensorlist(L, 0, 0);
}
static int l_named_parameters(lua_State *L) {
  return l_tensorlist(L, 0, 1);
}
static int l_buffers(lua_State *L) {
  return l_tensorlist(L, 1, 0);
}
static int l_named_buffers(lua_State *L) {
  return l_tensorlist(L, 1, 1);
}

static int l_childlist(lua_State *L, int named) {
  gcap_module *m = l_checkmodule(L, 1)->m;
  int i, n = gcap_module_num_children(m);
  lua_createtable(L, n, 0);
  for (i = 0; i < n; i++) {
    const char *name;
    gcap_module *c = gcap_module_child(m, i, &name);
    if (named) {
      lua_createtable(L, 2, 0);
      lua_pushstring(L, name);
      lua_rawseti(L, -2, 1);
      l_pushmodule(L, c);
      lua_rawseti(L, -2, 2);
    } else
      l_pushmodule(L, c);
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

static int l_children(lua_State *L) {
  return l_childlist(L, 0);
}
static int l_named_children(lua_State *L) {
  return l_childlist(L, 1);
}

/* m:train([b = true]) -> m */
static int l_train(lua_State *L) {
  LModule *p = l_checkmodule(L, 1);
  gcap_module_train(p->m, l_optboolean(L, 2, 1, "mode"));
  lua_settop(L, 1);
  return 1;
}

static int l_eval(lua_State *L) {
  gcap_module_train(l_checkmodule(L, 1)->m, 0);
  lua_settop(L, 1);
  return 1;
}

/* m:zero_grad([set_to_none = true]) (the facade takes an options table) */
static int l_module_zero_grad(lua_State *L) {
  LModule *p = l_checkmodule(L, 1);
  int none = lua_isnoneornil(L, 2) || lua_toboolean(L, 2);
  l_check(L, l_engine(L), gcap_module_zero_grad(p->m, none), "zero_grad");
  return 0;
}

/* m:to(dtype) -> m: parameters, grads and buffers converted in place */
static int l_module_to(lua_State *L) {
  LModule *p = l_checkmodule(L, 1);
  gcap_dtype dt;
  luaL_checkstring(L, 2);
  dt = l_optdtype(L, 2, "to");
  l_check(L, l_engine(L), gcap_module_to(p->m, dt), "to");
  lua_settop(L, 1);
  return 1;
}

static int l_backward_dw(lua_State *L) {
  LModule *p = l_checkmodule(L, 1);
  gcap_module *m = p->m;
  gcap_engine *e = l_engine(L);
  char msg[1024];
  LFrame f;
  LEngine *le;
  gcap_status st;
  gcap_module_retain(m);
  le = l_enter(L, &f, NULL, 0, 0, 0);
  st = gcap_module_backward_dw(m);
  l_leave(le, &f);
  if (st != GCAP_OK) snprintf(msg, sizeof msg, "%s", gcap_errmsg(e));
  gcap_module_free(m);
  l_raisecb(L, NULL);
  if (st != GCAP_OK) l_fail(L, st, msg, "backward_dw");
  return 0;
}

static int l_module_type(lua_State *L) {
  lua_pushstring(L, gcap_module_type(l_checkmodule(L, 1)->m));
  return 1;
}

/*
** m:register_..._hook(f) -> handle. The handle is kept in m's UV_HOOKS
** before the core knows it, so that nothing can raise while the core
** holds a hook the binding does not.
*/
static int l_register(lua_State *L, gcap_hook_kind kind) {
  LModule *p = l_checkmodule(L, 1);
  LHandle *h;
  int id;
  gcap_status st;
  luaL_checktype(L, 2, LUA_TFUNCTION);
  lua_settop(L, 2);
  h = (LHandle *)l_newbox(L, sizeof *h, 3, HANDLE_MT); /* 3 */
  h->le = (LEngine *)lua_touserdata(L, ENGINEIDX);
  lua_pushvalue(L, 2);
  lua_setiuservalue(L, 3, UV_HOOKFN);
  lua_pushvalue(L, 1);
  lua_setiuservalue(L, 3, UV_HOOKMOD);
  h->key = ++p->nexthook;
  lua_getiuservalue(L, 1, UV_HOOKS); /* 4 */
  lua_pushvalue(L, 3);
  lua_rawseti(L, 4, h->key);
  st = gcap_module_register_hook(p->m, kind, l_hook, h, NULL, &id);
  if (st != GCAP_OK) {
    lua_pushnil(L);
    lua_rawseti(L, 4, h->key);
    l_check(L, l_engine(L), st, "register_hook");
  }
  h->m = p->m;
  h->id = id;
  lua_settop(L, 3);
  return 1;
}

static int l_register_forward_pre_hook(lua_State *L) {
  return l_register(L, GCAP_HOOK_FORWARD_PRE);
}

static int l_register_forward_hook(lua_State *L) {
  return l_register(L, GCAP_HOOK_FORWARD);
}

static int l_register_full_backward_pre_hook(lua_State *L) {
  return l_register(L, GCAP_HOOK_BACKWARD_PRE);
}

static int l_register_full_backward_hook(lua_State *L) {
  return l_register(L, GCAP_HOOK_BACKWARD);
}

/* handle:remove(), idempotent */
static int l_handle_remove(lua_State *L) {
  LHandle *h = (LHandle *)luaL_checkudata(L, 1, HANDLE_MT);
  if (h->m != NULL) {
    gcap_module_remove_hook(h->m, h->id);
    h->m = NULL;
    if (lua_getiuservalue(L, 1, UV_HOOKMOD) == LUA_TUSERDATA &&
        lua_getiuservalue(L, -1, UV_HOOKS) == LUA_TTABLE) {
      lua_pushnil(L);
      lua_rawseti(L, -2, h->key);
    }
  }
  return 0;
}

static int l_handle_tostring(lua_State *L) {
  LHandle *h = (LHandle *)luaL_checkudata(L, 1, HANDLE_MT);
  if (h->m == NULL)
    lua_pushliteral(L, HANDLE_MT " (removed)");
  else
    lua_pushfstring(L, HANDLE_MT "(%d)", h->id);
  return 1;
}

static const luaL_Reg l_module_meta[] = {{"__gc", l_module_close},
                                         {"__close", l_module_close},
                                         {"__tostring", l_module_tostring},
                                         {"__call", l_module_call},
                                         {NULL, NULL}};

static const luaL_Reg l_module_methods[] = {
    {"forward", l_module_forward},
    {"parameters", l_parameters},
    {"named_parameters", l_named_parameters},
    {"buffers", l_buffers},
    {"named_buffers", l_named_buffers},
    {"children", l_children},
    {"named_children", l_named_children},
    {"register_buffer", l_register_buffer},
    {"train", l_train},
    {"eval", l_eval},
    {"zero_grad", l_module_zero_grad},
    {"to", l_module_to},
    {"backward_dw", l_backward_dw},
    {"register_forward_pre_hook", l_register_forward_pre_hook},
    {"register_forward_hook", l_register_forward_hook},
    {"register_full_backward_pre_hook", l_register_full_backward_pre_hook},
    {"register_full_backward_hook", l_register_full_backward_hook},
    {"type", l_module_type},
    {"close", l_module_close},
    {NULL, NULL}};

static const luaL_Reg l_handle_meta[] = {{"__tostring", l_handle_tostring}, {NULL, NULL}};

static const luaL_Reg l_handle_methods[] = {{"remove", l_handle_remove}, {NULL, NULL}};

/* Finish the built-in module box at -1 made for class 'cls': check the
** core's status, make it the module's Lua value, give it its fields. */
static int l_newbuiltin(lua_State *L, gcap_engine *e, gcap_status st, const char *op) {
  l_check(L, e, st, op);
  l_keepmodule(L);
  l_adoptfields(L, -1);
  return 1;
}

/* _nn.module(class, name): an instance of a Lua class, forward in Lua */
static int l_nn_module(lua_State *L) {
  gcap_engine *e = l_engine(L);
  const char *name = luaL_checkstring(L, 2);
  LModule *p;
  luaL_checktype(L, 1, LUA_TTABLE);
  p = l_newmodule(L, 1);
  l_check(L, e, gcap_module_new(e, name, l_lua_forward, lua_touserdata(L, ENGINEIDX), NULL, &p->m),
          name);
  l_keepmodule(L);
  return 1;
}

/* _nn.linear(class, in, out, bias, delay_wgrad, fuse_wgrad_accumulation) */
static int l_nn_linear(lua_State *L) {
  gcap_engine *e = l_engine(L);
  lua_Integer in = luaL_checkinteger(L, 2), out = luaL_checkinteger(L, 3);
  unsigned flags = (lua_toboolean(L, 5) ? GCAP_LINEAR_DELAY_WGRAD : 0u) |
                   (lua_toboolean(L, 6) ? GCAP_LINEAR_FUSE_WGRAD : 0u);
  LModule *p = l_newmodule(L, 1);
  return l_newbuiltin(L, e, gcap_nn_linear(e, in, out, lua_toboolean(L, 4), flags, &p->m),
                      "Linear");
}

static int l_nn_relu(lua_State *L) {
  gcap_engine *e = l_engine(L);
  LModule *p = l_newmodule(L, 1);
  return l_newbuiltin(L, e, gcap_nn_relu(e, &p->m), "ReLU");
}

static int l_nn_gelu(lua_State *L) {
  gcap_engine *e = l_engine(L);
  LModule *p = l_newmodule(L, 1);
  return l_newbuiltin(L, e, gcap_nn_gelu(e, &p->m), "GELU");
}

/* _nn.layer_norm(class, n, eps) */
static int l_nn_layer_norm(lua_State *L) {
  gcap_engine *e = l_engine(L);
  lua_Integer n = luaL_checkinteger(L, 2);
  double eps = (double)luaL_checknumber(L, 3);
  LModule *p = l_newmodule(L, 1);
  return l_newbuiltin(L, e, gcap_nn_layer_norm(e, n, eps, &p->m), "LayerNorm");
}

/* _nn.dropout(class, p) */
static int l_nn_dropout(lua_State *L) {
  gcap_engine *e = l_engine(L);
  double prob = (double)luaL_checknumber(L, 2);
  LModule *p = l_newmodule(L, 1);
  return l_newbuiltin(L, e, gcap_nn_dropout(e, prob, &p->m), "Dropout");
}

/* _nn.sequential(class, modules, n): modules[1..n] are open modules */
static int l_nn_sequential(lua_State *L) {
  gcap_engine *e = l_engine(L);
  lua_Integer i, n = luaL_checkinteger(L, 3);
  gcap_module **mods;
  LModule *p;
  luaL_checktype(L, 2, LUA_TTABLE);
  luaL_argcheck(L, n >= 0 && n <= INT_MAX / (lua_Integer)sizeof *mods, 3, "too many modules");
  mods = (gcap_module **)lua_newuserdatauv(L, (size_t)(n + 1) * sizeof *mods, 0);
  for (i = 1; i <= n; i++) {
    LModule *c;
    lua_rawgeti(L, 2, i);
    c = (LModule *)luaL_testudata(L, -1, MODULE_MT);
    if (c == NULL || c->m == NULL)
      return l_error(L, "Sequential: module #%I must be a module, got %s", (LUAI_UACINT)i,
                     (c == NULL) ? l_typename(L, -1) : "a closed module");
    mods[i - 1] = c->m;
    lua_pop(L, 1);
  }
  p = l_newmodule(L, 1);
  l_newbuiltin(L, e, gcap_nn_sequential(e, (int)n, mods, &p->m), "Sequential");
  lua_getiuservalue(L, -1, UV_FIELDS); /* seq[i] is child i too */
  for (i = 1; i <= n; i++) {
    lua_rawgeti(L, 2, i);
    lua_rawseti(L, -2, i);
  }
  lua_pop(L, 1);
  return 1;
}

/* _nn.parameter(t): t marked as a parameter (a leaf that requires grad),
** or such a leaf sharing t's storage when t is not a leaf */
static int l_nn_parameter(lua_State *L) {
  gcap_tensor *t = l_checktensor(L, 1);
  lua_settop(L, 1);
  if (!gcap_tensor_is_leaf(t)) {
    LTensor *r = l_newtensor(L);
    l_check(L, gcap_tensor_engine(t), gcap_tensor_detach(t, &r->t), "Parameter");
    t = r->t;
  }
  l_check(L, gcap_tensor_engine(t), gcap_tensor_set_requires_grad(t, 1), "Parameter");
  lua_getiuservalue(L, ENGINEIDX, UV_PMARKS);
  lua_pushvalue(L, -2);
  lua_pushboolean(L, 1);
  lua_rawset(L, -3);
  lua_pop(L, 1);
  return 1;
}

static int l_nn_is_module(lua_State *L) {
  lua_pushboolean(L, luaL_testudata(L, 1, MODULE_MT) != NULL);
  return 1;
}

/* _nn.class_of(m): the class of module m, or nil */
static int l_nn_class_of(lua_State *L) {
  luaL_checkudata(L, 1, MODULE_MT);
  lua_getiuservalue(L, 1, UV_CLASS);
  return 1;
}

static const luaL_Reg l_nn_funcs[] = {{"module", l_nn_module},
                                      {"linear", l_nn_linear},
                                      {"relu", l_nn_relu},
                                      {"gelu", l_nn_gelu},
                                      {"layer_norm", l_nn_layer_norm},
                                      {"dropout", l_nn_dropout},
                                      {"sequential", l_nn_sequential},
                                      {"parameter", l_nn_parameter},
                                      {"is_module", l_nn_is_module},
                                      {"class_of", l_nn_class_of},
                                      {NULL, NULL}};

/* }====================================================== */

/*
** {======================================================
** Optimizers
** =======================================================
*/

/* The tensors of the sequence at 1, in a GC-owned array left on the stack */
static gcap_tensor **l_checkparams(lua_State *L, const char *op, int *n) {
  lua_Integer i, len;
  gcap_tensor **v;
  if (!lua_istable(L, 1))
    l_error(L, "%s: params must be a sequence of tensors, got %s", op, l_typename(L, 1));
  len = luaL_len(L, 1);
  if (len > INT_MAX / (lua_Integer)sizeof *v) l_error(L, "%s: too many params", op);
  v = (gcap_tensor **)lua_newuserdatauv(L, (size_t)(len + 1) * sizeof *v, 0);
  for (i = 1; i <= len; i++) {
    LTensor *p;
    lua_geti(L, 1, i);
    p = (LTensor *)luaL_testudata(L, -1, TENSOR_MT);
    if (p == NULL)
      l_error(L, "%s: params[%I] must be a tensor, got %s", op, (LUAI_UACINT)i, l_typename(L, -1));
    else if (p->t == NULL)
      l_error(L, "%s: params[%I] is a closed tensor", op, (LUAI_UACINT)i);
    else
      v[i - 1] = p->t;
    lua_pop(L, 1);
  }
  *n = (int)len;
  return v;
}

/* _optim.sgd(params, lr, momentum, weight_decay) */
static int l_optim_sgd(lua_State *L) {
  gcap_engine *e = l_engine(L);
  double lr = (double)luaL_checknumber(L, 2);
  double momentum = (double)luaL_checknumber(L, 3);
  double wd = (double)luaL_checknumber(L, 4);
  int n;
  gcap_tensor **v = l_checkparams(L, "SGD", &n);
  LOptim *p = (LOptim *)l_newbox(L, sizeof *p, 1, OPTIM_MT);
  p->e = e;
  l_check(L, e, gcap_optim_sgd(e, n, v, lr, momentum, wd, &p->o), "SGD");
  return 1;
}

/* _optim.adam(params, lr, beta1, beta2, eps, weight_decay) */
static int l_optim_adam(lua_State *L) {
  gcap_engine *e = l_engine(L);
  double lr = (double)luaL_checknumber(L, 2);
  double b1 = (double)luaL_checknumber(L, 3);
  double b2 = (double)luaL_checknumber(L, 4);
  double eps = (double)luaL_checknumber(L, 5);
  double wd = (double)luaL_checknumber(L, 6);
  int n;
  gcap_tensor **v = l_checkparams(L, "Adam", &n);
  LOptim *p = (LOptim *)l_newbox(L, sizeof *p, 1, OPTIM_MT);
  p->e = e;
  p->adam = 1;
  l_check(L, e, gcap_optim_adam(e, n, v, lr, b1, b2, eps, wd, &p->o), "Adam");
  return 1;
}

static LOptim *l_checkoptim(lua_State *L, int i) {
  LOptim *p = (LOptim *)luaL_checkudata(L, i, OPTIM_MT);
  luaL_argcheck(L, p->o != NULL, i, "optimizer is closed");
  return p;
}

static int l_optim_close(lua_State *L) {
  LOptim *p = (LOptim *)luaL_checkudata(L, 1, OPTIM_MT);
  gcap_optim_free(p->o);
  p->o = NULL;
  return 0;
}

static int l_optim_tostring(lua_State *L) {
  LOptim *p = (LOptim *)luaL_checkudata(L, 1, OPTIM_MT);
  if (p->o == NULL)
    lua_pushliteral(L, OPTIM_MT " (closed)");
  else
    lua_pushfstring(L, OPTIM_MT "(%s)", p->adam ? "Adam" : "SGD");
  return 1;
}

static int l_optim_step(lua_State *L) {
  LOptim *p = l_checkoptim(L, 1);
  l_check(L, p->e, gcap_optim_step(p->o), "step");
  return 0;
}

/* opt:zero_grad([set_to_none = true]) (the facade takes an options table) */
static int l_optim_zero_grad(lua_State *L) {
  LOptim *p = l_checkoptim(L, 1);
  int none = lua_isnoneornil(L, 2) || lua_toboolean(L, 2);
  l_check(L, p->e, gcap_optim_zero_grad(p->o, none), "zero_grad");
  return 0;
}

static const luaL_Reg l_optim_meta[] = {{"__gc", l_optim_close},
                                        {"__close", l_optim_close},
                                        {"__tostring", l_optim_tostring},
                                        {NULL, NULL}};

static const luaL_Reg l_optim_methods[] = {{"step", l_optim_step},
                                           {"zero_grad", l_optim_zero_grad},
                                           {"close", l_optim_close},
                                           {NULL, NULL}};

static const luaL_Reg l_optim_funcs[] = {
    {"sgd", l_optim_sgd}, {"adam", l_optim_adam}, {NULL, NULL}};

/* }====================================================== */

/*
** {======================================================
** Streams and events
** =======================================================
*/

/* Record the Stream box on top as the box of its stream. */
static void l_keepstream(lua_State *L) {
  LStream *p = (LStream *)lua_touserdata(L, -1);
  lua_getiuservalue(L, ENGINEIDX, UV_STREAMS);
  lua_pushvalue(L, -2);
  lua_rawsetp(L, -2, p->s);
  lua_pop(L, 1);
}

/*
** Push the box of stream 's', the same Lua value while it lives. A box
** made here is for one of the engine's own streams (user streams have
** theirs from Stream()) and does not own it: closing it frees nothing.
*/
static void l_pushstream(lua_State *L, gcap_engine *e, gcap_stream *s) {
  LStream *p;
  lua_getiuservalue(L, ENGINEIDX, UV_STREAMS);
  if (lua_rawgetp(L, -1, s) == LUA_TUSERDATA && ((LStream *)lua_touserdata(L, -1))->s == s) {
    lua_remove(L, -2);
    return;
  }
  lua_pop(L, 2);
  p = (LStream *)l_newbox(L, sizeof *p, 1, STREAM_MT);
  p->e = e;
  p->s = s;
  l_keepstream(L);
}

static int l_stream_new(lua_State *L) {
  gcap_engine *e = l_engine(L);
  LStream *p = (LStream *)l_newbox(L, sizeof *p, 1, STREAM_MT);
  p->e = e;
  p->own = 1;
  l_check(L, e, gcap_stream_new(e, &p->s), "Stream");
  l_keepstream(L);
  return 1;
}

static int l_current_stream(lua_State *L) {
  gcap_engine *e = l_engine(L);
  l_pushstream(L, e, gcap_current_stream(e));
  return 1;
}

static int l_default_stream(lua_State *L) {
  gcap_engine *e = l_engine(L);
  l_pushstream(L, e, gcap_default_stream(e));
  return 1;
}

static int l_capture_stream(lua_State *L) {
  gcap_engine *e = l_engine(L);
  l_pushstream(L, e, gcap_capture_stream(e));
  return 1;
}

/* set_current_stream(s | nil): nil selects the default stream */
static int l_set_current_stream(lua_State *L) {
  gcap_engine *e = l_engine(L);
  gcap_stream *s = lua_isnoneornil(L, 1) ? NULL : l_checkstream(L, 1)->s;
  l_check(L, e, gcap_set_current_stream(e, s), "set_current_stream");
  lua_settop(L, 1);
  lua_setiuservalue(L, ENGINEIDX, UV_CURRENT);
  return 0;
}

static int l_stream_close(lua_State *L) {
  LStream *p = (LStream *)luaL_checkudata(L, 1, STREAM_MT);
  if (p->own) gcap_stream_free(p->s); /* the default becomes current */
  p->s = NULL;
  return 0;
}

static int l_stream_tostring(lua_State *L) {
  LStream *p = (LStream *)luaL_checkudata(L, 1, STREAM_MT);
  if (p->s == NULL)
    lua_pushliteral(L, STREAM_MT " (closed)");
  else if (p->s == gcap_default_stream(p->e))
    lua_pushliteral(L, STREAM_MT "(default)");
  else if (p->s == gcap_capture_stream(p->e))
    lua_pushliteral(L, STREAM_MT "(capture)");
  else
    lua_pushfstring(L, STREAM_MT "(%p)", (void *)p->s);
  return 1;
}

static int l_stream_synchronize(lua_State *L) {
  LStream *p = l_checkstream(L, 1);
  l_check(L, p->e, gcap_stream_synchronize(p->s), "synchronize");
  return 0;
}

static int l_stream_wait_event(lua_State *L) {
  LStream *p = l_checkstream(L, 1);
  LEvent *ev = l_checkevent(L, 2);
  l_check(L, p->e, gcap_stream_wait_event(p->s, ev->ev), "wait_event");
  return 0;
}

static const luaL_Reg l_stream_meta[] = {{"__gc", l_stream_close},
                                         {"__close", l_stream_close},
                                         {"__tostring", l_stream_tostring},
                                         {NULL, NULL}};

static const luaL_Reg l_stream_methods[] = {{"synchronize", l_stream_synchronize},
                                            {"wait_event", l_stream_wait_event},
                                            {"close", l_stream_close},
                                            {NULL, NULL}};

static int l_event_new(lua_State *L) {
  gcap_engine *e = l_engine(L);
  LEvent *p = (LEvent *)l_newbox(L, sizeof *p, 1, EVENT_MT);
  p->e = e;
  l_check(L, e, gcap_event_new(e, &p->ev), "Event");
  return 1;
}

static int l_event_close(lua_State *L) {
  LEvent *p = (LEvent *)luaL_checkudata(L, 1, EVENT_MT);
  gcap_event_free(p->ev);
  p->ev = NULL;
  return 0;
}

static int l_event_tostring(lua_State *L) {
  LEvent *p = (LEvent *)luaL_checkudata(L, 1, EVENT_MT);
  if (p->ev == NULL)
    lua_pushliteral(L, EVENT_MT " (closed)");
  else
    lua_pushfstring(L, EVENT_MT "(%p)", (void *)p->ev);
  return 1;
}

/* ev:record([s]): at the end of s, by default the current stream */
static int l_event_record(lua_State *L) {
  LEvent *p = l_checkevent(L, 1);
  gcap_stream *s = lua_isnoneornil(L, 2) ? gcap_current_stream(p->e) : l_checkstream(L, 2)->s;
  l_check(L, p->e, gcap_event_record(p->ev, s), "record");
  return 0;
}

static int l_event_synchronize(lua_State *L) {
  LEvent *p = l_checkevent(L, 1);
  l_check(L, p->e, gcap_event_synchronize(p->ev), "synchronize");
  return 0;
}

static const luaL_Reg l_event_meta[] = {{"__gc", l_event_close},
                                        {"__close", l_event_close},
                                        {"__tostring", l_event_tostring},
                                        {NULL, NULL}};

static const luaL_Reg l_event_methods[] = {{"record", l_event_record},
                                           {"synchronize", l_event_synchronize},
                                           {"close", l_event_close},
                                           {NULL, NULL}};

/* }====================================================== */

/*
** {======================================================
** Pools and graphs
** =======================================================
*/

static void l_pushmemstats(lua_State *L, const gcap_mem_stats *m) {
  lua_createtable(L, 0, 5);
  lua_pushinteger(L, (lua_Integer)m->reserved_bytes);
  lua_setfield(L, -2, "reserved_bytes");
  lua_pushinteger(L, (lua_Integer)m->in_use_bytes);
  lua_setfield(L, -2, "in_use_bytes");
  lua_pushinteger(L, (lua_Integer)m->peak_bytes);
  lua_setfield(L, -2, "peak_bytes");
  lua_pushinteger(L, (lua_Integer)m->blocks);
  lua_setfield(L, -2, "blocks");
  lua_pushinteger(L, (lua_Integer)m->graphs);
  lua_setfield(L, -2, "graphs");
}

static int l_memory_stats(lua_State *L) {
  gcap_engine *e = l_engine(L);
  gcap_mem_stats m;
  l_check(L, e, gcap_engine_mem_stats(e, &m), "memory_stats");
  l_pushmemstats(L, &m);
  return 1;
}

/* gc._test: for the library's own tests only. fail_alloc(n) makes the n-th
** allocation from now fail (0: off) and tells whether the previous one was
** injected; live() gives what the engine still holds (gcap_engine_stats). */
static int l_test_fail_alloc(lua_State *L) {
  lua_Integer n = luaL_checkinteger(L, 1);
  lua_pushboolean(L, gcap_test_fail_alloc(n < 0 ? 0 : (long)n) != 0);
  return 1;
}

static int l_test_live(lua_State *L) {
  gcap_engine *e = l_engine(L);
  gcap_engine_stats s;
  l_check(L, e, gcap_engine_get_stats(e, &s), "live");
  lua_createtable(L, 0, 4);
  lua_pushinteger(L, (lua_Integer)s.objects);
  lua_setfield(L, -2, "objects");
  lua_pushinteger(L, (lua_Integer)s.blocks);
  lua_setfield(L, -2, "blocks");
  lua_pushinteger(L, (lua_Integer)s.in_use_bytes);
  lua_setfield(L, -2, "in_use_bytes");
  lua_pushinteger(L, (lua_Integer)s.pool_reserved_bytes);
  lua_setfield(L, -2, "pool_reserved_bytes");
  return 1;
}

static const luaL_Reg l_test_funcs[] = {
    {"fail_alloc", l_test_fail_alloc}, {"live", l_test_live}, {NULL, NULL}};

static int l_pool_new(lua_State *L) {
  gcap_engine *e = l_engine(L);
  LPool *p = (LPool *)l_newbox(L, sizeof *p, 1, POOL_MT);
  p->e = e;
  l_check(L, e, gcap_pool_new(e, &p->p), "graph_pool_handle");
  return 1;
}

static int l_pool_close(lua_State *L) {
  LPool *p = (LPool *)luaL_checkudata(L, 1, POOL_MT);
  gcap_pool_free(p->p); /* during a capture, the core defers the release */
  p->p = NULL;
  return 0;
}

static int l_pool_tostring(lua_State *L) {
  LPool *p = (LPool *)luaL_checkudata(L, 1, POOL_MT);
  if (p->p == NULL)
    lua_pushliteral(L, POOL_MT " (closed)");
  else
    lua_pushfstring(L, POOL_MT "(%p)", (void *)p->p);
  return 1;
}

static int l_pool_stats(lua_State *L) {
  LPool *p = l_checkpool(L, 1);
  gcap_mem_stats m;
  l_check(L, p->e, gcap_pool_get_stats(p->p, &m), "stats");
  l_pushmemstats(L, &m);
  return 1;
}

static const luaL_Reg l_pool_meta[] = {{"__gc", l_pool_close},
                                       {"__close", l_pool_close},
                                       {"__tostring", l_pool_tostring},
                                       {NULL, NULL}};

static const luaL_Reg l_pool_methods[] = {
    {"stats", l_pool_stats}, {"close", l_pool_close}, {NULL, NULL}};

static int l_graph_new(lua_State *L) {
  gcap_engine *e = l_engine(L);
  LGraph *p = (LGraph *)l_newbox(L, sizeof *p, 2, GRAPH_MT);
  p->e = e;
  l_check(L, e, gcap_graph_new(e, &p->g), "Graph");
  return 1;
}

static int l_graph_close(lua_State *L) {
  LGraph *p = (LGraph *)luaL_checkudata(L, 1, GRAPH_MT);
  gcap_graph_free(p->g); /* during a capture, the core defers it; during its own, ends it */
  p->g = NULL;
  if (p->e != NULL && !gcap_is_capturing(p->e)) { /* no capture: drop its stream */
    lua_pushnil(L);
    lua_setiuservalue(L, ENGINEIDX, UV_CAPTURE);
  }
  return 0;
}

static int l_graph_tostring(lua_State *L) {
  LGraph *p = (LGraph *)luaL_checkudata(L, 1, GRAPH_MT);
  if (p->g == NULL)
    lua_pushliteral(L, GRAPH_MT " (closed)");
  else
    lua_pushfstring(L, GRAPH_MT "(name='%s', captured=%s)", gcap_graph_name(p->g),
                    gcap_graph_is_captured(p->g) ? "true" : "false");
  return 1;
}

static LGraph *l_checkcaptured(lua_State *L, const char *op) {
  LGraph *p = l_checkgraph(L, 1);
  if (!gcap_graph_is_captured(p->g))
    luaL_error(L, "%s: graph is not captured (reset or never captured)", op);
  return p;
}

/* g:capture_begin([pool [, stream]]) */
static int l_capture_begin(lua_State *L) {
  LGraph *p = l_checkgraph(L, 1);
  gcap_pool *pool = lua_isnoneornil(L, 2) ? NULL : l_checkpool(L, 2)->p;
  gcap_stream *s = lua_isnoneornil(L, 3) ? NULL : l_checkstream(L, 3)->s;
  l_check(L, p->e, gcap_capture_begin(p->g, pool, s), "capture_begin");
  lua_settop(L, 3);
  lua_setiuservalue(L, ENGINEIDX, UV_CAPTURE);
  lua_setiuservalue(L, 1, UV_POOL);
  return 0;
}

static int l_capture_end(lua_State *L) {
  LGraph *p = l_checkgraph(L, 1);
  gcap_status st = gcap_capture_end(p->g);
  if (!gcap_is_capturing(p->e)) { /* the capture is over: drop its stream */
    lua_pushnil(L);
    lua_setiuservalue(L, ENGINEIDX, UV_CAPTURE);
  }
  l_check(L, p->e, st, "capture_end");
  return 0;
}

static int l_replay(lua_State *L) {
  LGraph *p = l_checkcaptured(L, "replay");
  l_check(L, p->e, gcap_graph_replay(p->g), "replay");
  return 0;
}

static int l_reset(lua_State *L) {
  LGraph *p = l_checkgraph(L, 1);
  l_check(L, p->e, gcap_graph_reset(p->g), "reset");
  lua_pushnil(L);
  lua_setiuservalue(L, 1, UV_POOL);
  return 0;
}

static int l_graph_stats(lua_State *L) {
  LGraph *p = l_checkcaptured(L, "stats");
  gcap_graph_stats gs;
  l_check(L, p->e, gcap_graph_get_stats(p->g, &gs), "stats");
  lua_createtable(L, 0, 5);
  lua_pushinteger(L, (lua_Integer)gs.nodes);
  lua_setfield(L, -2, "nodes");
  lua_pushnumber(L, gs.capture_ms);
  lua_setfield(L, -2, "capture_ms");
  lua_pushnumber(L, gs.instantiate_ms);
  lua_setfield(L, -2, "instantiate_ms");
  lua_pushinteger(L, (lua_Integer)gs.pool_bytes);
  lua_setfield(L, -2, "pool_bytes");
  lua_pushinteger(L, (lua_Integer)gs.replays);
  lua_setfield(L, -2, "replays");
  return 1;
}

/* g:pool(): the pool g captured into (nil while empty), the same box
** every time: the one given to capture_begin, or one made here */
static int l_graph_pool(lua_State *L) {
  LGraph *p = l_checkgraph(L, 1);
  gcap_pool *pool = gcap_graph_pool(p->g);
  LPool *b;
  if (pool == NULL) {
    lua_pushnil(L);
    return 1;
  }
  if (lua_getiuservalue(L, 1, UV_POOL) == LUA_TUSERDATA &&
      ((LPool *)lua_touserdata(L, -1))->p == pool)
    return 1;
  b = (LPool *)l_newbox(L, sizeof *b, 1, POOL_MT);
  b->e = p->e;
  b->p = gcap_pool_retain(pool);
  lua_pushvalue(L, -1);
  lua_setiuservalue(L, 1, UV_POOL);
  return 1;
}

static int l_set_name(lua_State *L) {
  LGraph *p = l_checkgraph(L, 1);
  l_check(L, p->e, gcap_graph_set_name(p->g, luaL_checkstring(L, 2)), "set_name");
  lua_settop(L, 1);
  return 1;
}

static int l_name(lua_State *L) {
  lua_pushstring(L, gcap_graph_name(l_checkgraph(L, 1)->g));
  return 1;
}

static int l_is_captured(lua_State *L) {
  lua_pushboolean(L, gcap_graph_is_captured(l_checkgraph(L, 1)->g));
  return 1;
}

/* g:debug_dump(path): the captured graph as Graphviz DOT */
static int l_graph_debug_dump(lua_State *L) {
  LGraph *p = l_checkgraph(L, 1);
  l_check(L, p->e, gcap_graph_debug_dump(p->g, luaL_checkstring(L, 2)), "debug_dump");
  return 0;
}

static const luaL_Reg l_graph_meta[] = {{"__gc", l_graph_close},
                                        {"__close", l_graph_close},
                                        {"__tostring", l_graph_tostring},
                                        {NULL, NULL}};

static const luaL_Reg l_graph_methods[] = {{"capture_begin", l_capture_begin},
                                           {"capture_end", l_capture_end},
                                           {"replay", l_replay},
                                           {"reset", l_reset},
                                           {"stats", l_graph_stats},
                                           {"pool", l_graph_pool},
                                           {"set_name", l_set_name},
                                           {"name", l_name},
                                           {"is_captured", l_is_captured},
                                           {"debug_dump", l_graph_debug_dump},
                                           {"close", l_graph_close},
                                           {NULL, NULL}};

/* }====================================================== */

/*
** {======================================================
** The engine
** =======================================================
*/

static int l_engine_close(lua_State *L) {
  LEngine *p = (LEngine *)luaL_checkudata(L, 1, ENGINE_MT);
  if (p->e != NULL) {
    /* boxes of the engine's own streams must not outlive them */
    lua_getiuservalue(L, 1, UV_STREAMS);
    lua_pushnil(L);
    while (lua_next(L, -2) != 0) {
      LStream *s = (LStream *)lua_touserdata(L, -1);
      if (!s->own) s->s = NULL;
      lua_pop(L, 1);
    }
    gcap_engine_free(p->e); /* the core keeps it while objects live */
    p->e = NULL;
  }
  return 0;
}

static int l_engine_tostring(lua_State *L) {
  LEngine *p = (LEngine *)luaL_checkudata(L, 1, ENGINE_MT);
  if (p->e == NULL)
    lua_pushliteral(L, ENGINE_MT " (closed)");
  else
    lua_pushfstring(L, ENGINE_MT "(device=%s)", gcap_engine_device(p->e));
  return 1;
}

static const luaL_Reg l_engine_meta[] = {{"__gc", l_engine_close},
                                         {"__close", l_engine_close},
                                         {"__tostring", l_engine_tostring},
                                         {NULL, NULL}};

static const luaL_Reg l_engine_methods[] = {{"close", l_engine_close}, {NULL, NULL}};

/* Push a new table with weak keys or values (mode "k" or "v"). */
static void l_weaktable(lua_State *L, const char *mode) {
  lua_newtable(L);
  lua_createtable(L, 0, 1);
  lua_pushstring(L, mode);
  lua_setfield(L, -2, "__mode");
  lua_setmetatable(L, -2);
}

/* Push the state's engine box, opening the engine on first use on the
** device that GRAPHCAP_DEVICE names (unset or empty: the default). */
static void l_pushengine(lua_State *L) {
  const char *name = getenv("GRAPHCAP_DEVICE");
  gcap_device dev = GCAP_DEVICE_DEFAULT;
  LEngine *p;
  if (lua_getfield(L, LUA_REGISTRYINDEX, ENGINE_KEY) == LUA_TUSERDATA) return;
  lua_pop(L, 1);
  if (name == NULL || *name == '\0')
    name = "default";
  else if (strcmp(name, "host") == 0)
    dev = GCAP_DEVICE_HOST;
  else if (strcmp(name, "cuda") == 0)
    dev = GCAP_DEVICE_CUDA;
  else
    luaL_error(L, "GRAPHCAP_DEVICE='%s' is not a device (expected host or cuda)", name);
  p = (LEngine *)lua_newuserdatauv(L, sizeof *p, NUV_ENGINE);
  p->e = NULL;
  p->cur = NULL;
  luaL_setmetatable(L, ENGINE_MT);
  l_weaktable(L, "v");
  lua_setiuservalue(L, -2, UV_STREAMS);
  l_weaktable(L, "v");
  lua_setiuservalue(L, -2, UV_MODULES);
  l_weaktable(L, "v");
  lua_setiuservalue(L, -2, UV_TENSORS);
  l_weaktable(L, "k");
  lua_setiuservalue(L, -2, UV_PMARKS);
  lua_newtable(L);
  lua_setiuservalue(L, -2, UV_CLASSES);
  if (gcap_engine_new(dev, &p->e) != GCAP_OK)
    luaL_error(L, "cannot open graphcap device '%s': %s", name, gcap_last_open_error());
  lua_pushvalue(L, -1);
  lua_setfield(L, LUA_REGISTRYINDEX, ENGINE_KEY);
}

static int l_device(lua_State *L) {
  lua_pushstring(L, gcap_engine_device(l_engine(L)));
  return 1;
}

static int l_version(lua_State *L) {
  lua_pushstring(L, gcap_version());
  return 1;
}

static int l_cuda_available(lua_State *L) {
  lua_pushboolean(L, gcap_cuda_available());
  return 1;
}

static int l_synchronize(lua_State *L) {
  gcap_engine *e = l_engine(L);
  l_check(L, e, gcap_synchronize(e), "synchronize");
  return 0;
}

static int l_is_capturing(lua_State *L) {
  lua_pushboolean(L, gcap_is_capturing(l_engine(L)));
  return 1;
}

static int l_set_replay_check(lua_State *L) {
  gcap_engine *e = l_engine(L);
  luaL_checkany(L, 1);
  gcap_set_replay_check(e, lua_toboolean(L, 1));
  return 0;
}

static int l_manual_seed(lua_State *L) {
  gcap_engine *e = l_engine(L);
  uint64_t seed = (uint64_t)luaL_checkinteger(L, 1);
  l_check(L, e, gcap_manual_seed(e, seed), "manual_seed");
  return 0;
}

/* }====================================================== */

/*
** {======================================================
** make_graphed_callables
** =======================================================
*/

typedef struct LGraphed {
  gcap_graphed *g;
  gcap_engine *e;
} LGraphed;

static LGraphed *l_checkgraphed(lua_State *L, int i) {
  LGraphed *p = (LGraphed *)luaL_checkudata(L, i, GRAPHED_MT);
  luaL_argcheck(L, p->g != NULL, i, "graphed callables are closed");
  return p;
}

/* A capture-time hook (or the pre/post warmup hook: group < 0), as the
** core sees it: its place in the hook table of the call in progress. */
typedef struct LCapHook {
  LEngine *le;
  int callable, group, index;
} LCapHook;

typedef struct LCapCall {
  LCall c;
  const LCapHook *h;
} LCapCall;

static const char *const l_groups[4] = {"forward_pre_hooks", "forward_hooks", "backward_pre_hooks",
                                        "backward_hooks"};

/* The protected part: hooks[callable].group[index](callable's value), or
** hooks.pre_warmup_hook(); a hook must return nothing or nil. The error
** says where the hook is defined (the call site is the user's line). */
static int l_pcaphook(lua_State *L) {
  LCapCall *c = (LCapCall *)lua_touserdata(L, 1);
  const char *name;
  lua_Debug ar;
  int fn, i;
  lua_rawgetp(L, LUA_REGISTRYINDEX, &l_mgckey);
  if (c->h->group < 0) {
    name = (c->h->group == -1) ? "pre_warmup_hook" : "post_warmup_hook";
    lua_getfield(L, -1, name);
    fn = lua_gettop(L);
    lua_pushvalue(L, fn);
    lua_call(L, 0, LUA_MULTRET);
  } else {
    name = l_groups[c->h->group];
    lua_getfield(L, -1, "capture_time_hooks");
    lua_rawgeti(L, -1, c->h->callable + 1); /* {callable = v, group = {...}} */
    lua_getfield(L, -1, name);
    lua_rawgeti(L, -1, c->h->index + 1);
    fn = lua_gettop(L);
    lua_pushvalue(L, fn);
    lua_getfield(L, fn - 2, "callable");
    lua_call(L, 1, LUA_MULTRET);
  }
  for (i = fn + 1; i <= lua_gettop(L); i++)
    if (!lua_isnil(L, i)) {
      lua_pushvalue(L, fn);
      lua_getinfo(L, ">S", &ar);
      if (c->h->group < 0)
        return l_error(L, "%s must not return a value (it returned %s; defined at %s:%d)", name,
                       l_typename(L, i), ar.short_src, ar.linedefined);
      return l_error(L,
                     "capture_time_hooks %s must not return a value (callable %d, hook #%d "
                     "defined at %s:%d, returned %s)",
                     name, c->h->callable + 1, c->h->index + 1, ar.short_src, ar.linedefined,
                     l_typename(L, i));
    }
  return 0;
}

static gcap_status l_caphook(void *ud, gcap_module *m) {
  LCapCall c;
  (void)m;
  c.h = (const LCapHook *)ud;
  return l_callback(c.h->le, &l_capkey, &c.c, NULL);
}

static gcap_status l_warmhook(void *ud) {
  return l_caphook(ud, NULL);
}

/*
** Progress of make_graphed_callables. Option progress = true: one line on
** stderr, rewritten in place; a function: progress(phase, done, total),
** whose error stops the call as a hook's does. Without the option, the
** registry's PROGRESS_KEY (the graphcap program sets it true on a terminal)
** decides.
*/
#define PROGRESS_KEY "graphcap.progress"

static gcap_status l_progress_line(void *ud, const char *phase, int done, int total) {
  (void)ud;
  fprintf(stderr, "\rgraphcap: %s %d/%d", phase, done, total);
  if (done == total) fputs("\n", stderr);
  fflush(stderr);
  return GCAP_OK;
}

typedef struct LProgress {
  LCall c;
  const char *phase;
  int done, total;
} LProgress;

/* The protected part: opts.progress(phase, done, total) */
static int l_pprogress(lua_State *L) {
  LProgress *p = (LProgress *)lua_touserdata(L, 1);
  lua_rawgetp(L, LUA_REGISTRYINDEX, &l_mgckey);
  lua_getfield(L, -1, "progress");
  lua_pushstring(L, p->phase);
  lua_pushinteger(L, p->done);
  lua_pushinteger(L, p->total);
  lua_call(L, 3, 0);
  return 0;
}

static gcap_status l_progress_fn(void *ud, const char *phase, int done, int total) {
  LProgress p = {{0}, phase, done, total};
  return l_callback((LEngine *)ud, &l_progkey, &p.c, NULL);
}

/* Set o's progress from option 'progress' of the table at index t. */
static void l_optprogress(lua_State *L, int t, gcap_graphed_opts *o) {
  int kind = lua_getfield(L, t, "progress");
  if (kind == LUA_TNIL) {
    lua_pop(L, 1);
    kind = lua_getfield(L, LUA_REGISTRYINDEX, PROGRESS_KEY);
  }
  if (kind == LUA_TFUNCTION) {
    o->progress = l_progress_fn;
    o->progress_ud = lua_touserdata(L, ENGINEIDX);
  } else if (lua_toboolean(L, -1))
    o->progress = l_progress_line;
  lua_pop(L, 1);
}

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

/*
** core.make_graphed_callables(modules, args, opts): modules a sequence of
** Module boxes; args a sequence (one per entry) of sequences of tensors;
** opts as the facade normalized them (hooks: per callable {callable = v,
** forward_pre_hooks = {f, ...}, ...}). Returns a Graphed box.
*/
/* gc.clock() -> seconds of a monotonic clock, for timing to completion */
static int l_clock(lua_State *L) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  lua_pushnumber(L, (lua_Number)ts.tv_sec + (lua_Number)ts.tv_nsec * 1e-9);
  return 1;
}

/* gc.trace.start(path): trace the engine's work into path (Chrome JSON) */
static int l_trace_start(lua_State *L) {
  gcap_engine *e = l_engine(L);
  l_check(L, e, gcap_trace_start(e, luaL_checkstring(L, 1)), "trace.start");
  return 0;
}

/* gc.trace.stop(): finish the file (also done when the engine goes) */
static int l_trace_stop(lua_State *L) {
  gcap_engine *e = l_engine(L);
  l_check(L, e, gcap_trace_stop(e), "trace.stop");
  return 0;
}

static int l_make_graphed(lua_State *L) {
  gcap_engine *e = l_engine(L);
  int nmod, nent, i, k, total = 0, nhooks = 0, hooksi, prev;
  gcap_module **mods;
  int *nargs;
  gcap_tensor ***args, **flat;
  double *order = NULL;
  int *nlpc = NULL;
  gcap_capture_hooks *hooks = NULL;
  gcap_capture_hook *fns;
  void **uds;
  LCapHook *cap, warm[2];
  gcap_graphed_opts o;
  LGraphed *r;
  LFrame f;
  LEngine *le;
  gcap_status st;
  char msg[1024];
  luaL_checktype(L, 1, LUA_TTABLE);
  luaL_checktype(L, 2, LUA_TTABLE);
  luaL_checktype(L, 3, LUA_TTABLE);
  nmod = (int)lua_rawlen(L, 1);
  nent = (int)lua_rawlen(L, 2);
  gcap_graphed_opts_init(&o);
  /* all C arrays live in one userdata, collected with the call's stack */
  for (i = 1; i <= nent; i++) {
    lua_rawgeti(L, 2, i);
    luaL_checktype(L, -1, LUA_TTABLE);
    total += (int)lua_rawlen(L, -1);
    lua_pop(L, 1);
  }
  lua_getfield(L, 3, "capture_time_hooks");
  hooksi = lua_gettop(L);
  if (lua_istable(L, hooksi))
    for (i = 1; i <= nmod; i++) {
      int g;
      lua_rawgeti(L, hooksi, i);
      for (g = 0; g < 4; g++) {
        lua_getfield(L, -1, l_groups[g]);
        nhooks += lua_istable(L, -1) ? (int)lua_rawlen(L, -1) : 0;
        lua_pop(L, 1);
      }
      lua_pop(L, 1);
    }
  {
    size_t sz =
        sizeof(gcap_module *) * (size_t)(nmod + 1) + sizeof(int) * (size_t)(nent + 1) +
        sizeof(gcap_tensor **) * (size_t)(nent + 1) + sizeof(gcap_tensor *) * (size_t)(total + 1) +
        sizeof(gcap_capture_hooks) * (size_t)(nmod + 1) +
        (sizeof(gcap_capture_hook) + sizeof(void *) + sizeof(LCapHook)) * (size_t)(nhooks + 1);
    char *mem = (char *)lua_newuserdatauv(L, sz, 0);
    memset(mem, 0, sz);
    mods = (gcap_module **)mem;
    hooks = (gcap_capture_hooks *)(mods + nmod + 1);
    args = (gcap_tensor ***)(hooks + nmod + 1);
    flat = (gcap_tensor **)(args + nent + 1);
    fns = (gcap_capture_hook *)(flat + total + 1);
    uds = (void **)(fns + nhooks + 1);
    cap = (LCapHook *)(uds + nhooks + 1);
    nargs = (int *)(cap + nhooks + 1);
  }
  for (i = 0; i < nmod; i++) {
    lua_rawgeti(L, 1, i + 1);
    mods[i] = l_checkmodule(L, -1)->m;
    lua_pop(L, 1);
  }
  for (i = 0, total = 0; i < nent; i++) {
    lua_rawgeti(L, 2, i + 1);
    nargs[i] = (int)lua_rawlen(L, -1);
    args[i] = flat + total;
    for (k = 0; k < nargs[i]; k++) {
      LTensor *t;
      lua_rawgeti(L, -1, k + 1);
      t = (LTensor *)luaL_testudata(L, -1, TENSOR_MT);
      if (t == NULL)
        return l_error(L,
                       "make_graphed_callables: sample_args[%d][%d] must "
                       "be a tensor, got %s (sample_args hold only tensors)",
                       i + 1, k + 1, l_typename(L, -1));
      if (t->t == NULL)
        return l_error(L,
                       "make_graphed_callables: sample_args[%d][%d] is a "
                       "closed tensor",
                       i + 1, k + 1);
      flat[total++] = t->t;
      lua_pop(L, 1);
    }
    lua_pop(L, 1);
  }
  if (lua_istable(L, hooksi)) {
    int j = 0;
    for (i = 0; i < nmod; i++) {
      int g;
      lua_rawgeti(L, hooksi, i + 1);
      for (g = 0; g < 4; g++) {
        int n;
        lua_getfield(L, -1, l_groups[g]);
        n = lua_istable(L, -1) ? (int)lua_rawlen(L, -1) : 0;
        hooks[i].n[g] = n;
        hooks[i].fn[g] = fns + j;
        hooks[i].ud[g] = uds + j;
        for (k = 0; k < n; k++, j++) {
          cap[j].le = (LEngine *)lua_touserdata(L, ENGINEIDX);
          cap[j].callable = i;
          cap[j].group = g;
          cap[j].index = k;
          fns[j] = l_caphook;
          uds[j] = &cap[j];
        }
        lua_pop(L, 1);
      }
      lua_pop(L, 1);
    }
    o.capture_time_hooks = hooks;
    o.num_capture_time_hooks = nmod;
  }
  o.num_warmup_iters = (int)l_optnumber(L, 3, "num_warmup_iters", 3);
  o.allow_unused_input = l_optflag(L, 3, "allow_unused_input", 0);
  o.retain_graph_in_backward = l_optflag(L, 3, "retain_graph_in_backward", 0);
  o.reuse_graph_input_output_buffers = l_optflag(L, 3, "reuse_graph_input_output_buffers", 0);
  o.clone_param_grads_on_return = l_optflag(L, 3, "clone_param_grads_on_return", 1);
  if (lua_getfield(L, 3, "order") == LUA_TTABLE) {
    o.order_len = (int)lua_rawlen(L, -1);
    order = (double *)lua_newuserdatauv(L, sizeof(double) * (size_t)(o.order_len + 1), 0);
    for (k = 0; k < o.order_len; k++) {
      lua_rawgeti(L, -2, k + 1);
      order[k] = lua_tonumber(L, -1);
      lua_pop(L, 1);
    }
    o.order = order;
  }
  if (lua_getfield(L, 3, "num_layers_per_chunk") == LUA_TTABLE) {
    o.num_chunks = (int)lua_rawlen(L, -1);
    nlpc = (int *)lua_newuserdatauv(L, sizeof(int) * (size_t)(o.num_chunks + 1), 0);
    for (k = 0; k < o.num_chunks; k++) {
      lua_rawgeti(L, -2, k + 1);
      nlpc[k] = (int)lua_tointeger(L, -1);
      lua_pop(L, 1);
    }
    o.num_layers_per_chunk = nlpc;
  }
  if (lua_getfield(L, 3, "pool") != LUA_TNIL) {
    LPool *pl = (LPool *)luaL_testudata(L, -1, POOL_MT);
    if (pl == NULL || pl->p == NULL)
      return l_error(L, "make_graphed_callables: option pool must be an open graph pool, got %s",
                     pl ? "a closed pool" : l_typename(L, -1));
    o.pool = pl->p;
  }
  memset(warm, 0, sizeof warm);
  warm[0].le = warm[1].le = (LEngine *)lua_touserdata(L, ENGINEIDX);
  warm[0].group = -1;
  warm[1].group = -2;
  if (lua_getfield(L, 3, "pre_warmup_hook") == LUA_TFUNCTION) {
    o.pre_warmup_hook = l_warmhook;
    o.pre_warmup_ud = &warm[0];
  }
  if (lua_getfield(L, 3, "post_warmup_hook") == LUA_TFUNCTION) {
    o.post_warmup_hook = l_warmhook;
    o.post_warmup_ud = &warm[1];
  }
  l_optprogress(L, 3, &o);
  r = (LGraphed *)l_newbox(L, sizeof *r, 1, GRAPHED_MT);
  r->g = NULL;
  r->e = e;
  /* the hooks of this call, for l_pcaphook (calls may nest through hooks) */
  lua_rawgetp(L, LUA_REGISTRYINDEX, &l_mgckey);
  prev = lua_gettop(L);
  lua_pushvalue(L, 3);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &l_mgckey);
  le = l_enter(L, &f, NULL, 0, 0, 0);
  st = gcap_make_graphed_callables(e, nmod, mods, nent, nargs, (gcap_tensor *const *const *)args,
                                   &o, &r->g);
  l_leave(le, &f);
  lua_pushvalue(L, prev);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &l_mgckey);
  if (st != GCAP_OK) snprintf(msg, sizeof msg, "%s", gcap_errmsg(e));
  l_raisecb(L, msg);
  if (st != GCAP_OK) l_fail(L, st, msg, "make_graphed_callables");
  lua_pushvalue(L, prev - 1); /* the Graphed box */
  return 1;
}

static int l_graphed_close(lua_State *L) {
  LGraphed *p = (LGraphed *)luaL_checkudata(L, 1, GRAPHED_MT);
  if (p->g != NULL) {
    gcap_graphed_free(p->g);
    p->g = NULL;
  }
  return 0;
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

/* G:call(entry, tensors...) -> output (replays; eager in another mode) */
static int l_graphed_call(lua_State *L) {
  LGraphed *p = l_checkgraphed(L, 1);
  int entry = l_checkentry(L, p, 2), nin = lua_gettop(L) - 2, i, mi;
  gcap_tensor **in;
  gcap_graphed *g;
  gcap_module *m;
  char msg[1024];
  LFrame f;
  LEngine *le;
  LTensor *r;
  gcap_status st;
  int kwi = 0;
  if (nin > 0 && lua_type(L, nin + 2) == LUA_TTABLE) kwi = 2 + nin--; /* a kwargs map, last */
  m = gcap_graphed_module(p->g, entry);
  l_pushmodule(L, m); /* its graphed_kwargs say how a kwargs map flattens */
  mi = lua_gettop(L);
  in = l_inbuf(L, l_maxin(L, mi, nin));
  for (i = 0; i < nin; i++) {
    LTensor *t = (LTensor *)luaL_testudata(L, i + 3, TENSOR_MT);
    if (t == NULL)
      return l_error(L,
                     "graphed call of entry %d: argument #%d must be a "
                     "tensor, got %s",
                     entry + 1, i + 1, l_typename(L, i + 3));
    luaL_argcheck(L, t->t != NULL, i + 3, "tensor is closed");
    in[i] = t->t;
  }
  nin = l_flatkwargs(L, mi, kwi, in, nin, gcap_module_type(m));
  r = l_newtensor(L);
  g = gcap_graphed_retain(p->g); /* callbacks may close the boxes of g, its module and in */
  m = gcap_module_retain(gcap_graphed_module(g, entry));
  for (i = 0; i < nin; i++)
    gcap_tensor_retain(in[i]);
  le = l_enter(L, &f, NULL, 0, 0, 0);
  st = gcap_graphed_call(g, entry, nin, in, &r->t);
  l_leave(le, &f);
  if (st != GCAP_OK) snprintf(msg, sizeof msg, "%s", gcap_errmsg(p->e));
  for (i = 0; i < nin; i++)
    gcap_tensor_free(in[i]);
  gcap_module_free(m);
  gcap_graphed_free(g);
  l_raisecb(L, NULL);
  if (st != GCAP_OK) l_fail(L, st, msg, "graphed call");
  l_knownresult(L);
  return 1;
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

static void l_pushgstats(lua_State *L, const gcap_graph_stats *s) {
  lua_createtable(L, 0, 5);
  lua_pushinteger(L, (lua_Integer)s->nodes);
  lua_setfield(L, -2, "nodes");
  lua_pushnumber(L, s->capture_ms);
  lua_setfield(L, -2, "capture_ms");
  lua_pushnumber(L, s->instantiate_ms);
  lua_setfield(L, -2, "instantiate_ms");
  lua_pushinteger(L, (lua_Integer)s->pool_bytes);
  lua_setfield(L, -2, "pool_bytes");
  lua_pushinteger(L, (lua_Integer)s->replays);
  lua_setfield(L, -2, "replays");
}

/* G:stats(entry) -> {fwd, bwd (or nil), bwd_dw (or nil), pool_reserved_bytes} */
static int l_graphed_stats(lua_State *L) {
  LGraphed *p = l_checkgraphed(L, 1);
  gcap_graphed_stats s;
  l_check(L, p->e, gcap_graphed_get_stats(p->g, l_checkentry(L, p, 2), &s), "stats");
  lua_createtable(L, 0, 4);
  l_pushgstats(L, &s.fwd);
  lua_setfield(L, -2, "fwd");
  if (s.has_bwd) {
    l_pushgstats(L, &s.bwd);
    lua_setfield(L, -2, "bwd");
  }
  if (s.has_dw) {
    l_pushgstats(L, &s.dw);
    lua_setfield(L, -2, "bwd_dw");
  }
  lua_pushinteger(L, (lua_Integer)s.pool_reserved_bytes);
  lua_setfield(L, -2, "pool_reserved_bytes");
  return 1;
}

static const luaL_Reg l_graphed_meta[] = {{"__gc", l_graphed_close},
                                          {"__close", l_graphed_close},
                                          {"__len", l_graphed_len},
                                          {NULL, NULL}};

static const luaL_Reg l_graphed_methods[] = {{"call", l_graphed_call},
                                             {"backward_dw", l_graphed_backward_dw},
                                             {"reset", l_graphed_reset},
                                             {"stats", l_graphed_stats},
                                             {"debug_dump", l_graphed_debug_dump},
                                             {"close", l_graphed_close},
                                             {NULL, NULL}};

/* }====================================================== */

static const luaL_Reg l_funcs[] = {{"device", l_device},
                                   {"version", l_version},
                                   {"cuda_available", l_cuda_available},
                                   {"synchronize", l_synchronize},
                                   {"is_capturing", l_is_capturing},
                                   {"set_replay_check", l_set_replay_check},
                                   {"manual_seed", l_manual_seed},
                                   {"memory_stats", l_memory_stats},
                                   {"tensor", l_tensor},
                                   {"empty", l_empty},
                                   {"zeros", l_zeros},
                                   {"ones", l_ones},
                                   {"full", l_full},
                                   {"rand", l_rand},
                                   {"randn", l_randn},
                                   {"Stream", l_stream_new},
                                   {"current_stream", l_current_stream},
                                   {"default_stream", l_default_stream},
                                   {"capture_stream", l_capture_stream},
                                   {"set_current_stream", l_set_current_stream},
                                   {"Event", l_event_new},
                                   {"graph_pool_handle", l_pool_new},
                                   {"Graph", l_graph_new},
                                   {"set_grad_enabled", l_set_grad_enabled},
                                   {"is_grad_enabled", l_is_grad_enabled},
                                   {"matmul", l_matmul},
                                   {"make_graphed_callables", l_make_graphed},
                                   {"clock", l_clock},
                                   {"trace_start", l_trace_start},
                                   {"trace_stop", l_trace_stop},
                                   {NULL, NULL}};

static const struct {
  const char *key, *tname;
  const luaL_Reg *meta, *methods;
} l_classes[] = {{"Tensor", TENSOR_MT, l_tensor_meta, l_tensor_methods},
                 {"Stream", STREAM_MT, l_stream_meta, l_stream_methods},
                 {"Event", EVENT_MT, l_event_meta, l_event_methods},
                 {"Pool", POOL_MT, l_pool_meta, l_pool_methods},
                 {"Graph", GRAPH_MT, l_graph_meta, l_graph_methods},
                 {"Module", MODULE_MT, l_module_meta, l_module_methods},
                 {"HookHandle", HANDLE_MT, l_handle_meta, l_handle_methods},
                 {"Optimizer", OPTIM_MT, l_optim_meta, l_optim_methods},
                 {"Graphed", GRAPHED_MT, l_graphed_meta, l_graphed_methods},
                 {NULL, NULL, NULL, NULL}};

/*
** Create (or refill) metatable 'tname' and leave it on the stack: the
** metamethods, and the methods as __index. With up != 0, the value at
** index 'up' is the upvalue of all of them.
*/
static void l_newclass(lua_State *L, const char *tname, const luaL_Reg *meta,
                       const luaL_Reg *methods, int up) {
  int nup = (up != 0);
  luaL_newmetatable(L, tname); /* also sets __name */
  if (nup) lua_pushvalue(L, up);
  luaL_setfuncs(L, meta, nup);
  lua_newtable(L);
  if (nup) lua_pushvalue(L, up);
  luaL_setfuncs(L, methods, nup);
  lua_setfield(L, -2, "__index");
}

/*
** Give metatable 'tname' field access: __index = index(engine, methods),
** __newindex = newindex(engine), and __methods = the method table.
*/
static void l_fieldaccess(lua_State *L, const char *tname, int eng, lua_CFunction index,
                          lua_CFunction newindex) {
  luaL_getmetatable(L, tname);
  lua_getfield(L, -1, "__index"); /* the method table */
  lua_pushvalue(L, -1);
  lua_setfield(L, -3, "__methods");
  lua_pushvalue(L, eng);
  lua_insert(L, -2);
  lua_pushcclosure(L, index, 2);
  lua_setfield(L, -2, "__index");
  lua_pushvalue(L, eng);
  lua_pushcclosure(L, newindex, 1);
  lua_setfield(L, -2, "__newindex");
  lua_pop(L, 1);
}

/* Set field 'name' of the table on top to a new table of 'funcs', each
** with the engine box (at eng) as upvalue. */
static void l_subtable(lua_State *L, const char *name, const luaL_Reg *funcs, int eng) {
  lua_newtable(L);
  lua_pushvalue(L, eng);
  luaL_setfuncs(L, funcs, 1);
  lua_setfield(L, -2, name);
}

/* Registry entries of the callbacks: their protected parts (closures over
** the engine box) and the error holder, made before any callback runs so
** that a callback never allocates outside lua_pcall. */
static void l_callbacks(lua_State *L, int eng) {
  lua_pushvalue(L, eng);
  lua_pushcclosure(L, l_pforward, 1);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &l_fwdkey);
  lua_pushvalue(L, eng);
  lua_pushcclosure(L, l_phook, 1);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &l_hookkey);
  lua_pushvalue(L, eng);
  lua_pushcclosure(L, l_pcaphook, 1);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &l_capkey);
  lua_pushcfunction(L, l_pprogress);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &l_progkey);
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &l_errkey) != LUA_TUSERDATA) {
    LErr *h = (LErr *)lua_newuserdatauv(L, sizeof *h, 1);
    h->set = 0;
    lua_rawsetp(L, LUA_REGISTRYINDEX, &l_errkey);
  }
  lua_pop(L, 1);
}

LUAMOD_API int luaopen_graphcap_core(lua_State *L);

LUAMOD_API int luaopen_graphcap_core(lua_State *L) {
  int i, mts, eng;
  luaL_checkversion(L);
  lua_newtable(L); /* _metatables */
  mts = lua_gettop(L);
  l_newclass(L, ENGINE_MT, l_engine_meta, l_engine_methods, 0);
  lua_setfield(L, mts, "Engine");
  l_pushengine(L);
  eng = lua_gettop(L);
  for (i = 0; l_classes[i].key != NULL; i++) {
    l_newclass(L, l_classes[i].tname, l_classes[i].meta, l_classes[i].methods, eng);
    lua_setfield(L, mts, l_classes[i].key);
  }
  l_fieldaccess(L, TENSOR_MT, eng, l_tensor_index, l_tensor_newindex);
  l_fieldaccess(L, MODULE_MT, eng, l_module_index, l_module_newindex);
  l_callbacks(L, eng);
  luaL_newlibtable(L, l_funcs);
  lua_pushvalue(L, eng);
  luaL_setfuncs(L, l_funcs, 1);
  l_subtable(L, "F", l_F_funcs, eng);
  l_subtable(L, "_nn", l_nn_funcs, eng);
  l_subtable(L, "_optim", l_optim_funcs, eng);
  l_subtable(L, "_test", l_test_funcs, eng);
  lua_getiuservalue(L, eng, UV_CLASSES);
  lua_setfield(L, -2, "_classes");
  lua_pushvalue(L, mts);
  lua_setfield(L, -2, "_metatables");
  lua_pushvalue(L, eng);
  lua_setfield(L, -2, "_engine");
  return 1;
}
