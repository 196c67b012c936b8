/*
** lshape.c: shape ops: t:reshape (a -1 entry inferred), t:transpose, t:permute, gc.split,
** gc.chunk, gc.cat. Lua dims count from 1; a negative dim counts from the
** end (-1 is the last).
*/

#include <limits.h>
#include <stdint.h>

#include "lbind.h"

/*
** {======================================================
** Dims
** =======================================================
*/

/* Argument arg as a dim of an ndim-D tensor, 0-based for the C API; an
** error naming op when it is no dim of it. */
int l_checkdim(lua_State *L, int arg, int ndim, const char *op) {
  lua_Integer d = luaL_checkinteger(L, arg);
  lua_Integer p = d < 0 ? d + ndim + 1 : d; /* 1-based */
  if (d == 0 || p < 1 || p > ndim)
    l_error(L, "%s: dim %I is out of range for a %d-D tensor (dims count from 1; -1 is the last)",
            op, (LUAI_UACINT)d, ndim);
  return (int)(p - 1);
}

/* }====================================================== */

/*
** {======================================================
** Copies with another layout
** =======================================================
*/

/* t:reshape(shape): a view (tensors are contiguous); one entry may be -1,
** the size that makes the element count t's. */
int l_reshape(lua_State *L) {
  gcap_tensor *t = l_checktensor(L, 1);
  int64_t shape[GCAP_MAXDIM], known = 1, numel = gcap_tensor_numel(t);
  int n, i, infer = -1;
  LTensor *r;
  luaL_checktype(L, 2, LUA_TTABLE);
  n = (int)(lua_rawlen(L, 2) < GCAP_MAXDIM + 1 ? lua_rawlen(L, 2) : GCAP_MAXDIM + 1);
  if (n > GCAP_MAXDIM) return l_error(L, "reshape: shape has more than %d entries", GCAP_MAXDIM);
  for (i = 0; i < n; i++) {
    int isint;
    lua_Integer v;
    lua_rawgeti(L, 2, i + 1);
    v = lua_tointegerx(L, -1, &isint);
    if (lua_type(L, -1) != LUA_TNUMBER || !isint || v < -1)
      return l_error(L, "reshape: shape entry #%d must be a non-negative integer or -1, got %s",
                     i + 1, luaL_tolstring(L, -1, NULL));
    if (v == -1 && infer >= 0)
      return l_error(L, "reshape: entries #%d and #%d are both -1 (one may be)", infer + 1, i + 1);
    if (v == -1)
      infer = i;
    else if (v > 0 && known > INT64_MAX / v)
      return l_error(L, "reshape: shape has too many elements");
    else
      known *= v;
    shape[i] = v;
    lua_pop(L, 1);
  }
  if (infer >= 0) {
    if (known == 0 || numel % known != 0)
      return l_error(L, "reshape: no size for entry #%d makes %I elements", infer + 1,
                     (LUAI_UACINT)numel);
    shape[infer] = numel / known;
  }
  r = l_newtensor(L);
  l_check(L, gcap_tensor_engine(t), gcap_tensor_view(t, n, shape, &r->t), "reshape");
  return 1;
}

/* t:transpose(d0, d1) */
int l_transpose(lua_State *L) {
  gcap_tensor *t = l_checktensor(L, 1);
  int n = gcap_tensor_ndim(t);
  int d0 = l_checkdim(L, 2, n, "transpose"), d1 = l_checkdim(L, 3, n, "transpose");
  LTensor *r = l_newtensor(L);
  l_check(L, gcap_tensor_engine(t), gcap_transpose(t, d0, d1, &r->t), "transpose");
  return 1;
}

/* t:permute(p1, ..., pn): one dim of t for each of its dims */
int l_permute(lua_State *L) {
  gcap_tensor *t = l_checktensor(L, 1);
  int n = gcap_tensor_ndim(t), perm[GCAP_MAXDIM], i;
  LTensor *r;
  if (lua_gettop(L) - 1 != n)
    return l_error(L, "permute: expected %d dims for a %d-D tensor, got %d", n, n,
                   lua_gettop(L) - 1);
  for (i = 0; i < n; i++) {
    int j;
    perm[i] = l_checkdim(L, i + 2, n, "permute");
    for (j = 0; j < i; j++)
      if (perm[j] == perm[i])
        return l_error(L, "permute: dim %d appears twice (arguments %d and %d)", perm[i] + 1, j + 1,
                       i + 1);
  }
  r = l_newtensor(L);
  l_check(L, gcap_tensor_engine(t), gcap_permute(t, perm, &r->t), "permute");
  return 1;
}

/* }====================================================== */

/*
** {======================================================
** Pieces and joins
** =======================================================
*/

/* The pieces of a split or chunk of t: `count` new tensors in a sequence
** (made before the call, so that no error comes between the call and
** their boxes). */
static int l_pieces(lua_State *L, gcap_tensor *t, int64_t size, int chunks, int dim,
                    const char *op) {
  int64_t len = gcap_tensor_shape(t)[dim];
  int count = (int)(len == 0 ? 0 : (len - 1) / size + 1), got = 0, i; /* no overflow */
  gcap_tensor **outs = (gcap_tensor **)lua_newuserdatauv(L, sizeof *outs * (size_t)(count + 1), 0);
  gcap_status st;
  lua_createtable(L, count, 0);
  for (i = 1; i <= count; i++) {
    l_newtensor(L);
    lua_rawseti(L, -2, i);
  }
  st = chunks > 0 ? gcap_chunk(t, chunks, dim, count, outs, &got)
                  : gcap_split(t, size, dim, count, outs, &got);
  l_check(L, gcap_tensor_engine(t), st, op);
  for (i = 0; i < got; i++) {
    lua_rawgeti(L, -1, i + 1);
    ((LTensor *)lua_touserdata(L, -1))->t = outs[i];
    lua_pop(L, 1);
  }
  return 1;
}

/* gc.split(t, size [, dim = 1]) -> {pieces of `size` entries of dim} */
static int l_split(lua_State *L) {
  gcap_tensor *t = l_checktensor(L, 1);
  lua_Integer size = luaL_checkinteger(L, 2);
  int n = gcap_tensor_ndim(t), dim;
  if (n == 0) return l_error(L, "split: a 0-D tensor has no dim to split");
  dim = lua_isnoneornil(L, 3) ? 0 : l_checkdim(L, 3, n, "split");
  if (size <= 0)
    return l_error(L, "split: the size of a piece must be positive, got %I", (LUAI_UACINT)size);
  return l_pieces(L, t, (int64_t)size, 0, dim, "split");
}

/* gc.narrow(t, dim, start, length) -> entries start .. start + length - 1
** (from 1) of dim, a copy */
static int l_narrow(lua_State *L) {
  gcap_tensor *t = l_checktensor(L, 1);
  int n = gcap_tensor_ndim(t), dim;
  lua_Integer start, len;
  LTensor *r;
  if (n == 0) return l_error(L, "narrow: a 0-D tensor has no dim to narrow");
  dim = l_checkdim(L, 2, n, "narrow");
  start = luaL_checkinteger(L, 3);
  len = luaL_checkinteger(L, 4);
  /* checked here, in Lua's terms: the engine counts dims and entries from 0 */
  if (start < 1 || len < 0 || start - 1 > gcap_tensor_shape(t)[dim] - len)
    return l_error(
        L, "narrow: start %I and length %I do not fit dim %d of size %I (entries count from 1)",
        (LUAI_UACINT)start, (LUAI_UACINT)len, dim + 1, (LUAI_UACINT)gcap_tensor_shape(t)[dim]);
  r = l_newtensor(L);
  l_check(L, gcap_tensor_engine(t), gcap_narrow(t, dim, (int64_t)start - 1, (int64_t)len, &r->t),
          "narrow");
  return 1;
}

/* gc.chunk(t, n [, dim = 1]) -> {at most n pieces of dim} */
static int l_chunk(lua_State *L) {
  gcap_tensor *t = l_checktensor(L, 1);
  lua_Integer chunks = luaL_checkinteger(L, 2);
  int n = gcap_tensor_ndim(t), dim;
  int64_t len;
  if (n == 0) return l_error(L, "chunk: a 0-D tensor has no dim to split");
  dim = lua_isnoneornil(L, 3) ? 0 : l_checkdim(L, 3, n, "chunk");
  if (chunks <= 0 || chunks > INT_MAX)
    return l_error(L, "chunk: the number of chunks must be a positive int, got %I",
                   (LUAI_UACINT)chunks);
  len = gcap_tensor_shape(t)[dim];
  return l_pieces(L, t, len == 0 ? 1 : (len + chunks - 1) / chunks, (int)chunks, dim, "chunk");
}

/* gc.cat({t1, t2, ...} [, dim = 1]) */
static int l_cat(lua_State *L) {
  gcap_tensor *ts[GCAP_CAT_MAX];
  lua_Integer n, i;
  int dim;
  LTensor *r;
  luaL_checktype(L, 1, LUA_TTABLE);
  n = (lua_Integer)lua_rawlen(L, 1);
  if (n < 1 || n > GCAP_CAT_MAX)
    return l_error(L, "cat: expected a sequence of 1 to %d tensors, got %I entries", GCAP_CAT_MAX,
                   (LUAI_UACINT)n);
  for (i = 1; i <= n; i++) {
    lua_rawgeti(L, 1, i);
    if (!luaL_testudata(L, -1, TENSOR_MT))
      return l_error(L, "cat: entry %I of the sequence is a %s, not a tensor", (LUAI_UACINT)i,
                     l_typename(L, -1));
    ts[i - 1] = l_entrytensor(L, -1, "cat", "tensors", i);
    lua_pop(L, 1); /* the table keeps it alive */
  }
  dim = lua_isnoneornil(L, 2) ? 0 : l_checkdim(L, 2, gcap_tensor_ndim(ts[0]), "cat");
  r = l_newtensor(L);
  l_check(L, gcap_tensor_engine(ts[0]), gcap_cat((int)n, ts, dim, &r->t), "cat");
  return 1;
}

/* }====================================================== */

/* functions of the module (gc.split, gc.chunk, gc.cat) */
LUAI_DDEF const luaL_Reg l_shape_funcs[] = {
    {"split", l_split}, {"narrow", l_narrow}, {"chunk", l_chunk}, {"cat", l_cat}, {NULL, NULL}};
