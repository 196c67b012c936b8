/*
** ltensor.c: tensors: constructors, methods, identity of boxes, autograd.
*/

#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "lbind.h"

static const int64_t l_noshape[1] = {0}; /* shape of a 0-D tensor (unread) */

gcap_tensor *l_checktensor(lua_State *L, int i) {
  return ((LTensor *)l_checkbox(L, i, &l_tensor_class))->t;
}

/* The open tensor at i, entry k of sequence `what` of op: its errors name
** the entry (a stack index would mean nothing to the caller). */
gcap_tensor *l_entrytensor(lua_State *L, int i, const char *op, const char *what, lua_Integer k) {
  LTensor *p = (LTensor *)luaL_testudata(L, i, TENSOR_MT);
  if (p == NULL)
    l_error(L, "%s: %s[%I] must be a tensor, got %s", op, what, (LUAI_UACINT)k, l_typename(L, i));
  else if (p->t == NULL)
    l_error(L, "%s: %s[%I] is a closed tensor", op, what, (LUAI_UACINT)k);
  return p != NULL ? p->t : NULL; /* l_error does not return */
}

/* The dtype named at i (absent or nil: f32); errors name op. */
gcap_dtype l_optdtype(lua_State *L, int i, const char *op) {
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
    if (v > 0 && numel > GCAP_MAXNUMEL / v)
      l_error(L, "%s: shape is too large (more than 2^40 elements)", op);
    numel *= v;
    shape[i] = v;
    lua_pop(L, 1);
  }
  return (int)n;
}

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
    if (len > 0 && numel > GCAP_MAXNUMEL / len)
      l_error(L, "tensor: nested table is too large (more than 2^40 elements)");
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

static void l_tensor_close(lua_State *L, void *box) {
  LTensor *p = (LTensor *)box;
  (void)L;
  gcap_tensor_free(p->t);
  p->t = NULL;
}

static void l_tensor_describe(lua_State *L, void *box) {
  LTensor *p = (LTensor *)box;
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

static int l_tensor_isopen(const void *box) {
  return ((const LTensor *)box)->t != NULL;
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

/* t:set_(src [, offset]): t moves onto src's storage (gcap_tensor_set_) */
static int l_set_(lua_State *L) {
  gcap_tensor *t = l_checktensor(L, 1), *src = l_checktensor(L, 2);
  lua_Integer off = luaL_optinteger(L, 3, 0);
  l_check(L, gcap_tensor_engine(t), gcap_tensor_set_(t, src, (int64_t)off), "set_");
  lua_settop(L, 1);
  return 1;
}

/* core._set_version(t, v): see gcap_tensor_set_version. Internal, for
** gc.fsdp's gather of the very values a backward saved; not a method, so
** that no script hides a real write with it. */
static int l_set_version(lua_State *L) {
  gcap_tensor *t = l_checktensor(L, 1);
  lua_Integer v = luaL_checkinteger(L, 2);
  luaL_argcheck(L, v >= 0, 2, "a version is not negative");
  l_check(L, gcap_tensor_engine(t), gcap_tensor_set_version(t, (uint64_t)v), "_set_version");
  return 0;
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

int l_unary(lua_State *L, l_unop f, const char *op) {
  gcap_tensor *t = l_checktensor(L, 1);
  LTensor *r = l_newtensor(L);
  l_check(L, gcap_tensor_engine(t), f(t, &r->t), op);
  return 1;
}

static int l_clone(lua_State *L) {
  return l_unary(L, gcap_tensor_clone, "clone");
}
/* sum and mean reduce every element: a dim argument (PyTorch's sum(dim))
** is refused rather than ignored. */
static int l_reduce(lua_State *L, l_unop f, const char *op) {
  if (!lua_isnoneornil(L, 2))
    return l_error(L, "%s: reduces every element (a dim argument is not supported), got a %s", op,
                   luaL_typename(L, 2));
  return l_unary(L, f, op);
}
static int l_sum(lua_State *L) {
  return l_reduce(L, gcap_sum, "sum");
}
static int l_mean(lua_State *L) {
  return l_reduce(L, gcap_mean, "mean");
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
int l_arith(lua_State *L, l_binop f, const char *op) {
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

static int l_div(lua_State *L) {
  return l_arith(L, gcap_div, "div");
}
static int l_pow(lua_State *L) {
  return l_arith(L, gcap_pow, "pow");
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
void l_pushborrowed(lua_State *L, gcap_tensor *t) {
  LTensor *p;
  lua_getiuservalue(L, ENGINEIDX, EV_TENSORS);
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
void l_keeptensor(lua_State *L, int i) {
  LTensor *p = (LTensor *)lua_touserdata(L, i);
  i = lua_absindex(L, i);
  lua_getiuservalue(L, ENGINEIDX, EV_TENSORS);
  lua_pushvalue(L, i);
  lua_rawsetp(L, -2, p->t);
  lua_pop(L, 1);
}

/* The box on top holds a new tensor from the core: replace it by the
** known box of that tensor, if there is one (a module that returned a
** tensor it was given, or one of its own). */
void l_knownresult(lua_State *L) {
  LTensor *r = (LTensor *)lua_touserdata(L, -1);
  lua_getiuservalue(L, ENGINEIDX, EV_TENSORS);
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
int l_optboolean(lua_State *L, int i, int def, const char *what) {
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

typedef struct LBackward {
  gcap_tensor *tg[2]; /* the tensor and its gradient (or NULL) */
  int retain;
} LBackward;

static gcap_status l_callbackward(const LRun *r, void *ud) {
  LBackward *b = (LBackward *)ud;
  (void)r;
  return gcap_backward(b->tg[0], b->tg[1], b->retain);
}

/* t:backward([grad [, retain_graph]]) (the facade takes an options table) */
static int l_backward(lua_State *L) {
  LBackward b;
  LRun r = {.call = l_callbackward, .ud = &b, .op = "backward", .in = b.tg};
  b.tg[0] = l_checktensor(L, 1);
  b.tg[1] = lua_isnoneornil(L, 2) ? NULL : l_checktensor(L, 2);
  b.retain = lua_toboolean(L, 3);
  r.e = gcap_tensor_engine(b.tg[0]);
  r.nin = (b.tg[1] != NULL) ? 2 : 1;
  l_run(L, &r);
  return 0;
}

/* t.requires_grad, t.grad, t.grad_fn, t.is_leaf, t.shape, the methods, and
** t[i] (lindex.c) */
int l_tensor_index(lua_State *L) {
  const char *k;
  gcap_tensor *t;
  lua_settop(L, 2);
  if (lua_type(L, 2) == LUA_TNUMBER) return l_index_get(L);
  lua_pushvalue(L, 2);
  if (lua_rawget(L, lua_upvalueindex(2)) != LUA_TNIL || lua_type(L, 2) != LUA_TSTRING) return 1;
  k = lua_tostring(L, 2);
  if (strcmp(k, "shape") == 0)
    l_pushsize(L, l_checktensor(L, 1));
  else if (strcmp(k, "requires_grad") == 0)
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

/* t.requires_grad = b; t.grad = nil | tensor; t[i] = v (lindex.c) */
int l_tensor_newindex(lua_State *L) {
  gcap_tensor *t = l_checktensor(L, 1);
  const char *k = (lua_type(L, 2) == LUA_TSTRING) ? lua_tostring(L, 2) : "";
  if (lua_type(L, 2) == LUA_TNUMBER) return l_index_set(L);
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
                             "(only requires_grad, grad and entries t[i])",
                   luaL_tolstring(L, 2, NULL));
  return 0;
}

/* }====================================================== */

/* The Tensor metatable; l_tensor_index and l_tensor_newindex replace its
** __index by a function over these methods (luaopen_graphcap_core). */
static const luaL_Reg l_tensor_meta[] = {{"__add", l_add},
                                         {"__sub", l_sub},
                                         {"__mul", l_mul},
                                         {"__div", l_div},
                                         {"__pow", l_pow},
                                         {"__unm", l_unm},
                                         {"__len", l_len},
                                         {"__lt", l_compare_refused},
                                         {"__le", l_compare_refused},
                                         {NULL, NULL}};

static const luaL_Reg l_tensor_methods[] = {{"size", l_size},
                                            {"numel", l_numel},
                                            {"dim", l_dim},
                                            {"dtype", l_dtype},
                                            {"tolist", l_tolist},
                                            {"item", l_item},
                                            {"data_ptr", l_data_ptr},
                                            {"clone", l_clone},
                                            {"view", l_view},
                                            {"reshape", l_reshape},
                                            {"transpose", l_transpose},
                                            {"permute", l_permute},
                                            {"copy_", l_copy_},
                                            {"set_", l_set_},
                                            {"tobytes", l_tobytes},
                                            {"_write_bytes", l_write_bytes},
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
                                            {"masked_fill", l_masked_fill},
                                            {"lt", l_lt},
                                            {"le", l_le},
                                            {"gt", l_gt},
                                            {"ge", l_ge},
                                            {"eq", l_eq},
                                            {"ne", l_ne},
                                            {NULL, NULL}};

LUAI_DDEF const LClass l_tensor_class = {"Tensor",          TENSOR_MT,       "tensor is closed",
                                         "closed",          l_tensor_isopen, l_tensor_close,
                                         l_tensor_describe, l_tensor_meta,   l_tensor_methods};

/* }====================================================== */

/* functions of the module */
LUAI_DDEF const luaL_Reg l_tensor_funcs[] = {
    {"tensor", l_tensor}, {"empty", l_empty}, {"zeros", l_zeros}, {"ones", l_ones},
    {"full", l_full},     {"rand", l_rand},   {"randn", l_randn}, {"_set_version", l_set_version},
    {NULL, NULL}};
