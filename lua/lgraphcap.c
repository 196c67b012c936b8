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
*/

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lua.h"
#include "lauxlib.h"

#include "graphcap.h"


#define TENSOR_MT "graphcap.Tensor"
#define STREAM_MT "graphcap.Stream"
#define EVENT_MT "graphcap.Event"
#define POOL_MT "graphcap.Pool"
#define GRAPH_MT "graphcap.Graph"
#define ENGINE_MT "graphcap.Engine"

#define ENGINE_KEY "graphcap.engine"  /* registry slot of the engine box */
#define ENGINEIDX lua_upvalueindex(1)

/* uservalues of the engine box */
#define UV_STREAMS 1  /* weak map: stream address -> its Stream box */
#define UV_CURRENT 2  /* Stream box made current (kept alive while it is) */
#define UV_CAPTURE 3  /* Stream box of the open capture (likewise) */

/* uservalues of the other boxes */
#define UV_ENGINE 1  /* the engine box */
#define UV_POOL 2  /* a graph's Pool box, what g:pool() returns */

/* a tensor's bytes must fit an int64 */
#define MAXNUMEL (INT64_MAX / (int64_t)sizeof(float))

typedef struct LEngine { gcap_engine *e; } LEngine;
typedef struct LTensor { gcap_tensor *t; } LTensor;
typedef struct LStream { gcap_stream *s; gcap_engine *e; int own; } LStream;
typedef struct LEvent { gcap_event *ev; gcap_engine *e; } LEvent;
typedef struct LPool { gcap_pool *p; gcap_engine *e; } LPool;
typedef struct LGraph { gcap_graph *g; gcap_engine *e; } LGraph;

typedef gcap_status (*l_unop) (gcap_tensor *a, gcap_tensor **out);
typedef gcap_status (*l_binop) (gcap_tensor *a, gcap_tensor *b,
                                gcap_tensor **out);

static const int64_t l_noshape[1] = {0};  /* shape of a 0-D tensor (unread) */


/*
** {======================================================
** Errors, boxes, argument checks
** =======================================================
*/

/* Raise "op: message" when a core call returned 'st' != GCAP_OK. */
static void l_check (lua_State *L, const gcap_engine *e, gcap_status st,
                     const char *op) {
  if (st != GCAP_OK) {
    const char *msg = gcap_errmsg(e);
    size_t n = strlen(op);
    if (msg == NULL || *msg == '\0') msg = gcap_status_str(st);
    if (strncmp(msg, op, n) == 0 && msg[n] == ':')  /* the core named op */
      luaL_error(L, "%s", msg);
    luaL_error(L, "%s: %s", op, msg);
  }
}

static gcap_engine *l_engine (lua_State *L) {
  gcap_engine *e = ((LEngine *)lua_touserdata(L, ENGINEIDX))->e;
  if (e == NULL) luaL_error(L, "graphcap engine is closed");
  return e;
}

/* A new box in its closed state, linked to the engine box. */
static void *l_newbox (lua_State *L, size_t size, int nuv, const char *mt) {
  void *p = lua_newuserdatauv(L, size, nuv);
  memset(p, 0, size);  /* NULL handle: closed */
  luaL_setmetatable(L, mt);
  lua_pushvalue(L, ENGINEIDX);
  lua_setiuservalue(L, -2, UV_ENGINE);
  return p;
}

#define l_newtensor(L) ((LTensor *)l_newbox(L, sizeof(LTensor), 1, TENSOR_MT))

static gcap_tensor *l_checktensor (lua_State *L, int i) {
  LTensor *p = (LTensor *)luaL_checkudata(L, i, TENSOR_MT);
  luaL_argcheck(L, p->t != NULL, i, "tensor is closed");
  return p->t;
}

static LStream *l_checkstream (lua_State *L, int i) {
  LStream *p = (LStream *)luaL_checkudata(L, i, STREAM_MT);
  luaL_argcheck(L, p->s != NULL, i, "stream is closed");
  return p;
}

static LEvent *l_checkevent (lua_State *L, int i) {
  LEvent *p = (LEvent *)luaL_checkudata(L, i, EVENT_MT);
  luaL_argcheck(L, p->ev != NULL, i, "event is closed");
  return p;
}

static LPool *l_checkpool (lua_State *L, int i) {
  LPool *p = (LPool *)luaL_checkudata(L, i, POOL_MT);
  luaL_argcheck(L, p->p != NULL, i, "pool is closed");
  return p;
}

static LGraph *l_checkgraph (lua_State *L, int i) {
  LGraph *p = (LGraph *)luaL_checkudata(L, i, GRAPH_MT);
  luaL_argcheck(L, p->g != NULL, i, "graph is closed");
  return p;
}

static gcap_dtype l_optdtype (lua_State *L, int i) {
  const char *s = luaL_optstring(L, i, "f32");
  if (strcmp(s, "f32") == 0) return GCAP_F32;
  if (strcmp(s, "bf16") == 0) return GCAP_BF16;
  luaL_argerror(L, i, lua_pushfstring(L,
                "unknown dtype '%s' (expected f32 or bf16)", s));
  return GCAP_F32;
}

static const char *l_dtypename (gcap_dtype dt) {
  return (dt == GCAP_BF16) ? "bf16" : "f32";
}

/* What a bad value was, for messages: the number itself or its type. */
static const char *l_got (lua_State *L, int i) {
  return (lua_type(L, i) == LUA_TNUMBER) ? luaL_tolstring(L, i, NULL)
                                         : luaL_typename(L, i);
}

/* Read the shape table at 'arg' into 'shape'; return its length. */
static int l_checkshape (lua_State *L, int arg, int64_t *shape) {
  lua_Unsigned n;
  int i;
  int64_t numel = 1;
  luaL_checktype(L, arg, LUA_TTABLE);
  n = lua_rawlen(L, arg);
  if (n > GCAP_MAXDIM)
    luaL_argerror(L, arg, lua_pushfstring(L,
                  "shape has %I entries (at most %d)", (LUAI_UACINT)n,
                  GCAP_MAXDIM));
  for (i = 0; i < (int)n; i++) {
    int isint;
    lua_Integer v;
    lua_rawgeti(L, arg, i + 1);
    v = lua_tointegerx(L, -1, &isint);
    if (lua_type(L, -1) != LUA_TNUMBER || !isint || v < 0)
      luaL_argerror(L, arg, lua_pushfstring(L,
                    "shape entry #%d must be a non-negative integer, got %s",
                    i + 1, l_got(L, -1)));
    if (v > 0 && numel > MAXNUMEL / v)
      luaL_argerror(L, arg, "shape has too many elements");
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
  lua_Integer pos[GCAP_MAXDIM];  /* index path of the entry being read */
  float *x;  /* next element to fill */
} LNest;

/* Push the index path "[i][j]..." of the first 'depth' levels. */
static const char *l_pushpath (lua_State *L, const LNest *n, int depth) {
  int i;
  lua_pushliteral(L, "");
  for (i = 0; i < depth; i++)
    lua_pushfstring(L, "[%I]", (LUAI_UACINT)n->pos[i]);
  lua_concat(L, depth + 1);
  return lua_tostring(L, -1);
}

/* Infer the shape from the first entry of each level. */
static void l_nestshape (lua_State *L, LNest *n) {
  int64_t numel = 1;
  n->ndim = 0;
  lua_pushvalue(L, 1);
  while (lua_type(L, -1) == LUA_TTABLE) {
    int64_t len = (int64_t)lua_rawlen(L, -1);
    if (n->ndim == GCAP_MAXDIM)
      luaL_argerror(L, 1, lua_pushfstring(L,
                    "entry %s is a table: more than %d dimensions",
                    l_pushpath(L, n, n->ndim), GCAP_MAXDIM));
    if (len > 0 && numel > MAXNUMEL / len)
      luaL_argerror(L, 1, "nested table has too many elements");
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
static void l_nestfill (lua_State *L, LNest *n, int d) {
  lua_Integer i;
  for (i = 1; i <= n->shape[d]; i++) {
    int t = lua_rawgeti(L, -1, i);
    int v = lua_gettop(L);  /* absolute: messages push before using it */
    n->pos[d] = i;
    if (d + 1 < n->ndim) {
      lua_Unsigned len = lua_rawlen(L, v);
      if (t != LUA_TTABLE)
        luaL_argerror(L, 1, lua_pushfstring(L,
                      "entry %s must be a table, got %s",
                      l_pushpath(L, n, d + 1), l_got(L, v)));
      if ((int64_t)len != n->shape[d + 1])
        luaL_argerror(L, 1, lua_pushfstring(L,
                      "ragged nested table: entry %s has %I entries, expected %I",
                      l_pushpath(L, n, d + 1), (LUAI_UACINT)len,
                      (LUAI_UACINT)n->shape[d + 1]));
      l_nestfill(L, n, d + 1);
    }
    else if (t != LUA_TNUMBER)
      luaL_argerror(L, 1, lua_pushfstring(L,
                    "entry %s must be a number, got %s",
                    l_pushpath(L, n, d + 1), l_got(L, v)));
    else
      *n->x++ = (float)lua_tonumber(L, v);
    lua_pop(L, 1);
  }
}

/* tensor(nested_table_or_number [, dtype]) */
static int l_tensor (lua_State *L) {
  gcap_engine *e = l_engine(L);
  gcap_dtype dt = l_optdtype(L, 2);
  LNest n;
  float scalar, *data = &scalar;
  LTensor *r;
  if (lua_type(L, 1) == LUA_TNUMBER) {
    n.ndim = 0;
    scalar = (float)lua_tonumber(L, 1);
  }
  else {
    int d;
    size_t numel = 1;
    luaL_argexpected(L, lua_type(L, 1) == LUA_TTABLE, 1, "number or table");
    l_nestshape(L, &n);
    for (d = 0; d < n.ndim; d++) numel *= (size_t)n.shape[d];
    data = n.x = (float *)lua_newuserdatauv(L, numel * sizeof(float), 0);
    lua_pushvalue(L, 1);
    l_nestfill(L, &n, 0);
    lua_pop(L, 1);
  }
  r = l_newtensor(L);
  l_check(L, e, gcap_tensor_from_f32(e, dt, n.ndim, n.shape, data, &r->t),
          "tensor");
  return 1;
}

/* A new tensor of the shape at 1 and dtype at 'dtarg', filled with v
** (empty: uninitialised). */
static int l_newfilled (lua_State *L, int dtarg, int empty, double v,
                        const char *op) {
  gcap_engine *e = l_engine(L);
  int64_t shape[GCAP_MAXDIM];
  int ndim = l_checkshape(L, 1, shape);
  gcap_dtype dt = l_optdtype(L, dtarg);
  LTensor *r = l_newtensor(L);
  l_check(L, e, empty ? gcap_tensor_empty(e, dt, ndim, shape, &r->t)
                      : gcap_tensor_full(e, dt, ndim, shape, v, &r->t), op);
  return 1;
}

static int l_empty (lua_State *L) { return l_newfilled(L, 2, 1, 0.0, "empty"); }
static int l_zeros (lua_State *L) { return l_newfilled(L, 2, 0, 0.0, "zeros"); }
static int l_ones (lua_State *L) { return l_newfilled(L, 2, 0, 1.0, "ones"); }

static int l_full (lua_State *L) {
  return l_newfilled(L, 3, 0, luaL_checknumber(L, 2), "full");
}

static int l_newrand (lua_State *L, int normal, const char *op) {
  gcap_engine *e = l_engine(L);
  int64_t shape[GCAP_MAXDIM];
  int ndim = l_checkshape(L, 1, shape);
  gcap_dtype dt = l_optdtype(L, 2);
  LTensor *r = l_newtensor(L);
  l_check(L, e, gcap_tensor_rand(e, dt, ndim, shape, normal, &r->t), op);
  return 1;
}

static int l_rand (lua_State *L) { return l_newrand(L, 0, "rand"); }
static int l_randn (lua_State *L) { return l_newrand(L, 1, "randn"); }

static int l_tensor_close (lua_State *L) {
  LTensor *p = (LTensor *)luaL_checkudata(L, 1, TENSOR_MT);
  gcap_tensor_free(p->t);
  p->t = NULL;
  return 0;
}

static int l_tensor_tostring (lua_State *L) {
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

static int l_shape (lua_State *L) {
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

static int l_numel (lua_State *L) {
  lua_pushinteger(L, (lua_Integer)gcap_tensor_numel(l_checktensor(L, 1)));
  return 1;
}

static int l_dim (lua_State *L) {
  lua_pushinteger(L, gcap_tensor_ndim(l_checktensor(L, 1)));
  return 1;
}

static int l_dtype (lua_State *L) {
  lua_pushstring(L, l_dtypename(gcap_tensor_dtype(l_checktensor(L, 1))));
  return 1;
}

static int l_data_ptr (lua_State *L) {
  lua_pushinteger(L, (lua_Integer)gcap_tensor_data_ptr(l_checktensor(L, 1)));
  return 1;
}

/* Push the next elements from *x as nested sequences of 'shape' (its
** 'ndim' >= 1 entries). */
static void l_pushnested (lua_State *L, const float **x,
                          const int64_t *shape, int ndim) {
  int64_t i, n = shape[0];
  lua_createtable(L, (n <= INT_MAX) ? (int)n : 0, 0);
  for (i = 1; i <= n; i++) {
    if (ndim == 1) lua_pushnumber(L, (lua_Number)*(*x)++);
    else l_pushnested(L, x, shape + 1, ndim - 1);
    lua_rawseti(L, -2, (lua_Integer)i);
  }
}

static int l_tolist (lua_State *L) {
  gcap_tensor *t = l_checktensor(L, 1);
  size_t n = (size_t)gcap_tensor_numel(t);
  int ndim = gcap_tensor_ndim(t);
  float *x = (float *)lua_newuserdatauv(L, n * sizeof(float), 0);
  const float *next = x;
  l_check(L, gcap_tensor_engine(t), gcap_tensor_read(t, x, n), "tolist");
  if (ndim == 0) lua_pushnumber(L, (lua_Number)x[0]);
  else l_pushnested(L, &next, gcap_tensor_shape(t), ndim);
  return 1;
}

static int l_item (lua_State *L) {
  gcap_tensor *t = l_checktensor(L, 1);
  int64_t n = gcap_tensor_numel(t);
  float x;
  if (n != 1)
    return luaL_error(L, "item: tensor has %I elements (expected 1)",
                      (LUAI_UACINT)n);
  l_check(L, gcap_tensor_engine(t), gcap_tensor_read(t, &x, 1), "item");
  lua_pushnumber(L, (lua_Number)x);
  return 1;
}

static int l_view (lua_State *L) {
  gcap_tensor *t = l_checktensor(L, 1);
  int64_t shape[GCAP_MAXDIM];
  int ndim = l_checkshape(L, 2, shape);
  LTensor *r = l_newtensor(L);
  l_check(L, gcap_tensor_engine(t), gcap_tensor_view(t, ndim, shape, &r->t),
          "view");
  return 1;
}

static int l_copy_ (lua_State *L) {
  gcap_tensor *t = l_checktensor(L, 1), *u = l_checktensor(L, 2);
  l_check(L, gcap_tensor_engine(t), gcap_copy_(t, u), "copy_");
  lua_settop(L, 1);
  return 1;
}

static int l_zero_ (lua_State *L) {
  gcap_tensor *t = l_checktensor(L, 1);
  l_check(L, gcap_tensor_engine(t), gcap_zero_(t), "zero_");
  lua_settop(L, 1);
  return 1;
}

static int l_fill_ (lua_State *L) {
  gcap_tensor *t = l_checktensor(L, 1);
  l_check(L, gcap_tensor_engine(t), gcap_fill_(t, luaL_checknumber(L, 2)),
          "fill_");
  lua_settop(L, 1);
  return 1;
}

static int l_unary (lua_State *L, l_unop f, const char *op) {
  gcap_tensor *t = l_checktensor(L, 1);
  LTensor *r = l_newtensor(L);
  l_check(L, gcap_tensor_engine(t), f(t, &r->t), op);
  return 1;
}

static int l_clone (lua_State *L) { return l_unary(L, gcap_tensor_clone, "clone"); }
static int l_sum (lua_State *L) { return l_unary(L, gcap_sum, "sum"); }
static int l_mean (lua_State *L) { return l_unary(L, gcap_mean, "mean"); }
static int l_unm (lua_State *L) { return l_unary(L, gcap_neg, "neg"); }

/*
** Operand 'i' of a binary op whose tensor operand is 't': a number
** becomes a 0-D tensor of t's dtype, left on the stack in box *tmp.
*/
static gcap_tensor *l_operand (lua_State *L, int i, gcap_tensor *t,
                               LTensor **tmp, const char *op) {
  if (lua_type(L, i) == LUA_TNUMBER) {
    gcap_engine *e = gcap_tensor_engine(t);
    LTensor *p = l_newtensor(L);
    l_check(L, e, gcap_tensor_full(e, gcap_tensor_dtype(t), 0, l_noshape,
                                   lua_tonumber(L, i), &p->t), op);
    *tmp = p;
    return p->t;
  }
  return l_checktensor(L, i);
}

/* a op b, where a tensor is on either side and a number may be the other */
static int l_arith (lua_State *L, l_binop f, const char *op) {
  LTensor *tmp = NULL, *r;
  int ti = (luaL_testudata(L, 1, TENSOR_MT) != NULL) ? 1 : 2;
  gcap_tensor *t = l_checktensor(L, ti);
  gcap_tensor *a = (ti == 1) ? t : l_operand(L, 1, t, &tmp, op);
  gcap_tensor *b = (ti == 2) ? t : l_operand(L, 2, t, &tmp, op);
  gcap_status st;
  r = l_newtensor(L);
  st = f(a, b, &r->t);
  if (tmp != NULL) {  /* release the 0-D operand now, not at collection */
    gcap_tensor_free(tmp->t);
    tmp->t = NULL;
  }
  l_check(L, gcap_tensor_engine(t), st, op);
  return 1;
}

static int l_add (lua_State *L) { return l_arith(L, gcap_add, "add"); }
static int l_sub (lua_State *L) { return l_arith(L, gcap_sub, "sub"); }

static int l_mul (lua_State *L) {  /* a number on either side is a scale */
  int ni = (lua_type(L, 1) == LUA_TNUMBER) ? 1
         : (lua_type(L, 2) == LUA_TNUMBER) ? 2 : 0;
  if (ni != 0) {
    gcap_tensor *t = l_checktensor(L, 3 - ni);
    LTensor *r = l_newtensor(L);
    l_check(L, gcap_tensor_engine(t),
            gcap_scale(t, lua_tonumber(L, ni), &r->t), "mul");
    return 1;
  }
  return l_arith(L, gcap_mul, "mul");
}

static const luaL_Reg l_tensor_meta[] = {
  {"__gc", l_tensor_close},
  {"__close", l_tensor_close},
  {"__tostring", l_tensor_tostring},
  {"__add", l_add},
  {"__sub", l_sub},
  {"__mul", l_mul},
  {"__unm", l_unm},
  {NULL, NULL}
};

static const luaL_Reg l_tensor_methods[] = {
  {"shape", l_shape},
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
  {"close", l_tensor_close},
  {NULL, NULL}
};

/* }====================================================== */


/*
** {======================================================
** Streams and events
** =======================================================
*/

/* Record the Stream box on top as the box of its stream. */
static void l_keepstream (lua_State *L) {
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
static void l_pushstream (lua_State *L, gcap_engine *e, gcap_stream *s) {
  LStream *p;
  lua_getiuservalue(L, ENGINEIDX, UV_STREAMS);
  if (lua_rawgetp(L, -1, s) == LUA_TUSERDATA
      && ((LStream *)lua_touserdata(L, -1))->s == s) {
    lua_remove(L, -2);
    return;
  }
  lua_pop(L, 2);
  p = (LStream *)l_newbox(L, sizeof *p, 1, STREAM_MT);
  p->e = e;
  p->s = s;
  l_keepstream(L);
}

static int l_stream_new (lua_State *L) {
  gcap_engine *e = l_engine(L);
  LStream *p = (LStream *)l_newbox(L, sizeof *p, 1, STREAM_MT);
  p->e = e;
  p->own = 1;
  l_check(L, e, gcap_stream_new(e, &p->s), "Stream");
  l_keepstream(L);
  return 1;
}

static int l_current_stream (lua_State *L) {
  gcap_engine *e = l_engine(L);
  l_pushstream(L, e, gcap_current_stream(e));
  return 1;
}

static int l_default_stream (lua_State *L) {
  gcap_engine *e = l_engine(L);
  l_pushstream(L, e, gcap_default_stream(e));
  return 1;
}

static int l_capture_stream (lua_State *L) {
  gcap_engine *e = l_engine(L);
  l_pushstream(L, e, gcap_capture_stream(e));
  return 1;
}

/* set_current_stream(s | nil): nil selects the default stream */
static int l_set_current_stream (lua_State *L) {
  gcap_engine *e = l_engine(L);
  gcap_stream *s = lua_isnoneornil(L, 1) ? NULL : l_checkstream(L, 1)->s;
  l_check(L, e, gcap_set_current_stream(e, s), "set_current_stream");
  lua_settop(L, 1);
  lua_setiuservalue(L, ENGINEIDX, UV_CURRENT);
  return 0;
}

static int l_stream_close (lua_State *L) {
  LStream *p = (LStream *)luaL_checkudata(L, 1, STREAM_MT);
  if (p->own) gcap_stream_free(p->s);  /* the default becomes current */
  p->s = NULL;
  return 0;
}

static int l_stream_tostring (lua_State *L) {
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

static int l_stream_synchronize (lua_State *L) {
  LStream *p = l_checkstream(L, 1);
  l_check(L, p->e, gcap_stream_synchronize(p->s), "synchronize");
  return 0;
}

static int l_stream_wait_event (lua_State *L) {
  LStream *p = l_checkstream(L, 1);
  LEvent *ev = l_checkevent(L, 2);
  l_check(L, p->e, gcap_stream_wait_event(p->s, ev->ev), "wait_event");
  return 0;
}

static const luaL_Reg l_stream_meta[] = {
  {"__gc", l_stream_close},
  {"__close", l_stream_close},
  {"__tostring", l_stream_tostring},
  {NULL, NULL}
};

static const luaL_Reg l_stream_methods[] = {
  {"synchronize", l_stream_synchronize},
  {"wait_event", l_stream_wait_event},
  {"close", l_stream_close},
  {NULL, NULL}
};

static int l_event_new (lua_State *L) {
  gcap_engine *e = l_engine(L);
  LEvent *p = (LEvent *)l_newbox(L, sizeof *p, 1, EVENT_MT);
  p->e = e;
  l_check(L, e, gcap_event_new(e, &p->ev), "Event");
  return 1;
}

static int l_event_close (lua_State *L) {
  LEvent *p = (LEvent *)luaL_checkudata(L, 1, EVENT_MT);
  gcap_event_free(p->ev);
  p->ev = NULL;
  return 0;
}

static int l_event_tostring (lua_State *L) {
  LEvent *p = (LEvent *)luaL_checkudata(L, 1, EVENT_MT);
  if (p->ev == NULL) lua_pushliteral(L, EVENT_MT " (closed)");
  else lua_pushfstring(L, EVENT_MT "(%p)", (void *)p->ev);
  return 1;
}

/* ev:record([s]): at the end of s, by default the current stream */
static int l_event_record (lua_State *L) {
  LEvent *p = l_checkevent(L, 1);
  gcap_stream *s = lua_isnoneornil(L, 2) ? gcap_current_stream(p->e)
                                         : l_checkstream(L, 2)->s;
  l_check(L, p->e, gcap_event_record(p->ev, s), "record");
  return 0;
}

static int l_event_synchronize (lua_State *L) {
  LEvent *p = l_checkevent(L, 1);
  l_check(L, p->e, gcap_event_synchronize(p->ev), "synchronize");
  return 0;
}

static const luaL_Reg l_event_meta[] = {
  {"__gc", l_event_close},
  {"__close", l_event_close},
  {"__tostring", l_event_tostring},
  {NULL, NULL}
};

static const luaL_Reg l_event_methods[] = {
  {"record", l_event_record},
  {"synchronize", l_event_synchronize},
  {"close", l_event_close},
  {NULL, NULL}
};

/* }====================================================== */


/*
** {======================================================
** Pools and graphs
** =======================================================
*/

static void l_pushmemstats (lua_State *L, const gcap_mem_stats *m) {
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

static int l_memory_stats (lua_State *L) {
  gcap_engine *e = l_engine(L);
  gcap_mem_stats m;
  l_check(L, e, gcap_engine_mem_stats(e, &m), "memory_stats");
  l_pushmemstats(L, &m);
  return 1;
}

static int l_pool_new (lua_State *L) {
  gcap_engine *e = l_engine(L);
  LPool *p = (LPool *)l_newbox(L, sizeof *p, 1, POOL_MT);
  p->e = e;
  l_check(L, e, gcap_pool_new(e, &p->p), "graph_pool_handle");
  return 1;
}

static int l_pool_close (lua_State *L) {
  LPool *p = (LPool *)luaL_checkudata(L, 1, POOL_MT);
  gcap_pool_free(p->p);  /* during a capture, the core defers the release */
  p->p = NULL;
  return 0;
}

static int l_pool_tostring (lua_State *L) {
  LPool *p = (LPool *)luaL_checkudata(L, 1, POOL_MT);
  if (p->p == NULL) lua_pushliteral(L, POOL_MT " (closed)");
  else lua_pushfstring(L, POOL_MT "(%p)", (void *)p->p);
  return 1;
}

static int l_pool_stats (lua_State *L) {
  LPool *p = l_checkpool(L, 1);
  gcap_mem_stats m;
  l_check(L, p->e, gcap_pool_get_stats(p->p, &m), "stats");
  l_pushmemstats(L, &m);
  return 1;
}

static const luaL_Reg l_pool_meta[] = {
  {"__gc", l_pool_close},
  {"__close", l_pool_close},
  {"__tostring", l_pool_tostring},
  {NULL, NULL}
};

static const luaL_Reg l_pool_methods[] = {
  {"stats", l_pool_stats},
  {"close", l_pool_close},
  {NULL, NULL}
};

static int l_graph_new (lua_State *L) {
  gcap_engine *e = l_engine(L);
  LGraph *p = (LGraph *)l_newbox(L, sizeof *p, 2, GRAPH_MT);
  p->e = e;
  l_check(L, e, gcap_graph_new(e, &p->g), "Graph");
  return 1;
}

static int l_graph_close (lua_State *L) {
  LGraph *p = (LGraph *)luaL_checkudata(L, 1, GRAPH_MT);
  gcap_graph_free(p->g);  /* during a capture, the core defers it */
  p->g = NULL;
  return 0;
}

static int l_graph_tostring (lua_State *L) {
  LGraph *p = (LGraph *)luaL_checkudata(L, 1, GRAPH_MT);
  if (p->g == NULL)
    lua_pushliteral(L, GRAPH_MT " (closed)");
  else
    lua_pushfstring(L, GRAPH_MT "(name='%s', captured=%s)",
                    gcap_graph_name(p->g),
                    gcap_graph_is_captured(p->g) ? "true" : "false");
  return 1;
}

static LGraph *l_checkcaptured (lua_State *L, const char *op) {
  LGraph *p = l_checkgraph(L, 1);
  if (!gcap_graph_is_captured(p->g))
    luaL_error(L, "%s: graph is not captured (reset or never captured)", op);
  return p;
}

/* g:capture_begin([pool [, stream]]) */
static int l_capture_begin (lua_State *L) {
  LGraph *p = l_checkgraph(L, 1);
  gcap_pool *pool = lua_isnoneornil(L, 2) ? NULL : l_checkpool(L, 2)->p;
  gcap_stream *s = lua_isnoneornil(L, 3) ? NULL : l_checkstream(L, 3)->s;
  l_check(L, p->e, gcap_capture_begin(p->g, pool, s), "capture_begin");
  lua_settop(L, 3);
  lua_setiuservalue(L, ENGINEIDX, UV_CAPTURE);
  lua_setiuservalue(L, 1, UV_POOL);
  return 0;
}

static int l_capture_end (lua_State *L) {
  LGraph *p = l_checkgraph(L, 1);
  gcap_status st = gcap_capture_end(p->g);
  if (!gcap_is_capturing(p->e)) {  /* the capture is over: drop its stream */
    lua_pushnil(L);
    lua_setiuservalue(L, ENGINEIDX, UV_CAPTURE);
  }
  l_check(L, p->e, st, "capture_end");
  return 0;
}

static int l_replay (lua_State *L) {
  LGraph *p = l_checkcaptured(L, "replay");
  l_check(L, p->e, gcap_graph_replay(p->g), "replay");
  return 0;
}

static int l_reset (lua_State *L) {
  LGraph *p = l_checkgraph(L, 1);
  l_check(L, p->e, gcap_graph_reset(p->g), "reset");
  lua_pushnil(L);
  lua_setiuservalue(L, 1, UV_POOL);
  return 0;
}

static int l_graph_stats (lua_State *L) {
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
static int l_graph_pool (lua_State *L) {
  LGraph *p = l_checkgraph(L, 1);
  gcap_pool *pool = gcap_graph_pool(p->g);
  LPool *b;
  if (pool == NULL) {
    lua_pushnil(L);
    return 1;
  }
  if (lua_getiuservalue(L, 1, UV_POOL) == LUA_TUSERDATA
      && ((LPool *)lua_touserdata(L, -1))->p == pool)
    return 1;
  b = (LPool *)l_newbox(L, sizeof *b, 1, POOL_MT);
  b->e = p->e;
  b->p = gcap_pool_retain(pool);
  lua_pushvalue(L, -1);
  lua_setiuservalue(L, 1, UV_POOL);
  return 1;
}

static int l_set_name (lua_State *L) {
  LGraph *p = l_checkgraph(L, 1);
  l_check(L, p->e, gcap_graph_set_name(p->g, luaL_checkstring(L, 2)),
          "set_name");
  lua_settop(L, 1);
  return 1;
}

static int l_name (lua_State *L) {
  lua_pushstring(L, gcap_graph_name(l_checkgraph(L, 1)->g));
  return 1;
}

static int l_is_captured (lua_State *L) {
  lua_pushboolean(L, gcap_graph_is_captured(l_checkgraph(L, 1)->g));
  return 1;
}

static const luaL_Reg l_graph_meta[] = {
  {"__gc", l_graph_close},
  {"__close", l_graph_close},
  {"__tostring", l_graph_tostring},
  {NULL, NULL}
};

static const luaL_Reg l_graph_methods[] = {
  {"capture_begin", l_capture_begin},
  {"capture_end", l_capture_end},
  {"replay", l_replay},
  {"reset", l_reset},
  {"stats", l_graph_stats},
  {"pool", l_graph_pool},
  {"set_name", l_set_name},
  {"name", l_name},
  {"is_captured", l_is_captured},
  {"close", l_graph_close},
  {NULL, NULL}
};

/* }====================================================== */


/*
** {======================================================
** The engine
** =======================================================
*/

static int l_engine_close (lua_State *L) {
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
    gcap_engine_free(p->e);  /* the core keeps it while objects live */
    p->e = NULL;
  }
  return 0;
}

static int l_engine_tostring (lua_State *L) {
  LEngine *p = (LEngine *)luaL_checkudata(L, 1, ENGINE_MT);
  if (p->e == NULL) lua_pushliteral(L, ENGINE_MT " (closed)");
  else lua_pushfstring(L, ENGINE_MT "(device=%s)", gcap_engine_device(p->e));
  return 1;
}

static const luaL_Reg l_engine_meta[] = {
  {"__gc", l_engine_close},
  {"__close", l_engine_close},
  {"__tostring", l_engine_tostring},
  {NULL, NULL}
};

static const luaL_Reg l_engine_methods[] = {
  {"close", l_engine_close},
  {NULL, NULL}
};

/* Push the state's engine box, opening the engine on first use on the
** device that GRAPHCAP_DEVICE names (unset or empty: the default). */
static void l_pushengine (lua_State *L) {
  const char *name = getenv("GRAPHCAP_DEVICE");
  gcap_device dev = GCAP_DEVICE_DEFAULT;
  LEngine *p;
  if (lua_getfield(L, LUA_REGISTRYINDEX, ENGINE_KEY) == LUA_TUSERDATA)
    return;
  lua_pop(L, 1);
  if (name == NULL || *name == '\0')
    name = "default";
  else if (strcmp(name, "host") == 0)
    dev = GCAP_DEVICE_HOST;
  else if (strcmp(name, "cuda") == 0)
    dev = GCAP_DEVICE_CUDA;
  else
    luaL_error(L, "GRAPHCAP_DEVICE='%s' is not a device (expected host or cuda)",
               name);
  p = (LEngine *)lua_newuserdatauv(L, sizeof *p, 3);
  p->e = NULL;
  luaL_setmetatable(L, ENGINE_MT);
  lua_newtable(L);  /* UV_STREAMS, with weak values */
  lua_createtable(L, 0, 1);
  lua_pushliteral(L, "v");
  lua_setfield(L, -2, "__mode");
  lua_setmetatable(L, -2);
  lua_setiuservalue(L, -2, UV_STREAMS);
  if (gcap_engine_new(dev, &p->e) != GCAP_OK)
    luaL_error(L, "cannot open graphcap device '%s': %s", name,
               gcap_last_open_error());
  lua_pushvalue(L, -1);
  lua_setfield(L, LUA_REGISTRYINDEX, ENGINE_KEY);
}

static int l_device (lua_State *L) {
  lua_pushstring(L, gcap_engine_device(l_engine(L)));
  return 1;
}

static int l_version (lua_State *L) {
  lua_pushstring(L, gcap_version());
  return 1;
}

static int l_cuda_available (lua_State *L) {
  lua_pushboolean(L, gcap_cuda_available());
  return 1;
}

static int l_synchronize (lua_State *L) {
  gcap_engine *e = l_engine(L);
  l_check(L, e, gcap_synchronize(e), "synchronize");
  return 0;
}

static int l_is_capturing (lua_State *L) {
  lua_pushboolean(L, gcap_is_capturing(l_engine(L)));
  return 1;
}

static int l_set_replay_check (lua_State *L) {
  gcap_engine *e = l_engine(L);
  luaL_checkany(L, 1);
  gcap_set_replay_check(e, lua_toboolean(L, 1));
  return 0;
}

static int l_manual_seed (lua_State *L) {
  gcap_engine *e = l_engine(L);
  uint64_t seed = (uint64_t)luaL_checkinteger(L, 1);
  l_check(L, e, gcap_manual_seed(e, seed), "manual_seed");
  return 0;
}

/* }====================================================== */


static const luaL_Reg l_funcs[] = {
  {"device", l_device},
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
  {NULL, NULL}
};

static const struct {
  const char *key, *tname;
  const luaL_Reg *meta, *methods;
} l_classes[] = {
  {"Tensor", TENSOR_MT, l_tensor_meta, l_tensor_methods},
  {"Stream", STREAM_MT, l_stream_meta, l_stream_methods},
  {"Event", EVENT_MT, l_event_meta, l_event_methods},
  {"Pool", POOL_MT, l_pool_meta, l_pool_methods},
  {"Graph", GRAPH_MT, l_graph_meta, l_graph_methods},
  {NULL, NULL, NULL, NULL}
};

/*
** Create (or refill) metatable 'tname' and leave it on the stack: the
** metamethods, and the methods as __index. With up != 0, the value at
** index 'up' is the upvalue of all of them.
*/
static void l_newclass (lua_State *L, const char *tname, const luaL_Reg *meta,
                        const luaL_Reg *methods, int up) {
  int nup = (up != 0);
  luaL_newmetatable(L, tname);  /* also sets __name */
  if (nup) lua_pushvalue(L, up);
  luaL_setfuncs(L, meta, nup);
  lua_newtable(L);
  if (nup) lua_pushvalue(L, up);
  luaL_setfuncs(L, methods, nup);
  lua_setfield(L, -2, "__index");
}

LUAMOD_API int luaopen_graphcap_core (lua_State *L);

LUAMOD_API int luaopen_graphcap_core (lua_State *L) {
  int i, mts, eng;
  luaL_checkversion(L);
  lua_newtable(L);  /* _metatables */
  mts = lua_gettop(L);
  l_newclass(L, ENGINE_MT, l_engine_meta, l_engine_methods, 0);
  lua_setfield(L, mts, "Engine");
  l_pushengine(L);
  eng = lua_gettop(L);
  for (i = 0; l_classes[i].key != NULL; i++) {
    l_newclass(L, l_classes[i].tname, l_classes[i].meta,
               l_classes[i].methods, eng);
    lua_setfield(L, mts, l_classes[i].key);
  }
  luaL_newlibtable(L, l_funcs);
  lua_pushvalue(L, eng);
  luaL_setfuncs(L, l_funcs, 1);
  lua_pushvalue(L, mts);
  lua_setfield(L, -2, "_metatables");
  lua_pushvalue(L, eng);
  lua_setfield(L, -2, "_engine");
  return 1;
}
