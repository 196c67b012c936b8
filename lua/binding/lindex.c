/*
** lindex.c: tensors measured and indexed as PyTorch's are: t.shape (a
** sequence of sizes that t:shape() also calls), t:size([d]), #t, t[i] (a
** view of entry i of the first dim) and t[i] = v. Lua counts from 1; a
** negative index counts from the end (-1 is the last).
*/

#include <stdint.h>

#include "lbind.h"

#define SIZE_MT "graphcap.Size"

/* Push a new plain sequence of the sizes of the sequence at i. */
static void l_copysizes(lua_State *L, int i) {
  lua_Integer k, n = (lua_Integer)lua_rawlen(L, i);
  lua_createtable(L, (int)n, 0);
  for (k = 1; k <= n; k++) {
    lua_rawgeti(L, i, k);
    lua_rawseti(L, -2, k);
  }
}

/* size(...) -> a new plain sequence: t:shape() calls t.shape with t */
static int l_size_call(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  l_copysizes(L, 1);
  return 1;
}

/* a == b for two sequences of sizes (t.shape == u.shape, t.shape == {2, 3}) */
static int l_size_eq(lua_State *L) {
  lua_Unsigned k, n = lua_rawlen(L, 1);
  int eq = lua_istable(L, 1) && lua_istable(L, 2) && lua_rawlen(L, 2) == n;
  for (k = 1; eq && k <= n; k++) {
    lua_rawgeti(L, 1, (lua_Integer)k);
    lua_rawgeti(L, 2, (lua_Integer)k);
    eq = lua_rawequal(L, -1, -2);
    lua_pop(L, 2);
  }
  lua_pushboolean(L, eq);
  return 1;
}

/* "{2, 3}" */
static int l_size_tostring(lua_State *L) {
  luaL_Buffer b;
  lua_Unsigned k, n = lua_rawlen(L, 1);
  luaL_buffinit(L, &b);
  luaL_addchar(&b, '{');
  for (k = 1; k <= n; k++) {
    if (k > 1) luaL_addstring(&b, ", ");
    lua_rawgeti(L, 1, (lua_Integer)k);
    luaL_addvalue(&b);
  }
  luaL_addchar(&b, '}');
  luaL_pushresult(&b);
  return 1;
}

/* Push t's sizes: a sequence whose metatable makes it callable (returning
** a plain copy), comparable with == and printable. */
void l_pushsize(lua_State *L, gcap_tensor *t) {
  static const luaL_Reg size_meta[] = {
      {"__call", l_size_call}, {"__eq", l_size_eq}, {"__tostring", l_size_tostring}, {NULL, NULL}};
  int i, n = gcap_tensor_ndim(t);
  const int64_t *shape = gcap_tensor_shape(t);
  lua_createtable(L, n, 0);
  for (i = 0; i < n; i++) {
    lua_pushinteger(L, (lua_Integer)shape[i]);
    lua_rawseti(L, -2, i + 1);
  }
  if (luaL_newmetatable(L, SIZE_MT)) luaL_setfuncs(L, size_meta, 0);
  lua_setmetatable(L, -2);
}

/* t:size([d]): the size of dim d (from 1; -1 is the last), or t.shape */
int l_size(lua_State *L) {
  gcap_tensor *t = l_checktensor(L, 1);
  if (lua_isnoneornil(L, 2))
    l_pushsize(L, t);
  else
    lua_pushinteger(
        L, (lua_Integer)gcap_tensor_shape(t)[l_checkdim(L, 2, gcap_tensor_ndim(t), "size")]);
  return 1;
}

/* #t: the size of the first dim, as PyTorch's len(t) */
int l_len(lua_State *L) {
  gcap_tensor *t = l_checktensor(L, 1);
  if (gcap_tensor_ndim(t) == 0) return l_error(L, "#t: a 0-D tensor has no length");
  lua_pushinteger(L, (lua_Integer)gcap_tensor_shape(t)[0]);
  return 1;
}

/* The entry (from 0) of t's first dim that the Lua index at 2 names; an
** error naming the size when there is none (`what`: "t[i]" or "t[i] = v"). */
static int64_t l_checkentry(lua_State *L, gcap_tensor *t, const char *what) {
  int isint;
  lua_Integer i = lua_tointegerx(L, 2, &isint), size, p;
  if (!isint)
    l_error(L, "%s: a tensor's index is an integer (from 1; -1 is the last), got %s", what,
            luaL_tolstring(L, 2, NULL));
  if (gcap_tensor_ndim(t) == 0)
    l_error(L, "%s: index %I of a 0-D tensor (it has no dims to index)", what, (LUAI_UACINT)i);
  size = (lua_Integer)gcap_tensor_shape(t)[0];
  p = i < 0 ? i + size + 1 : i;
  if (i == 0 || p < 1 || p > size)
    l_error(L,
            "%s: index %I is out of range for dim 1 of size %I (indices count from 1; -1 is the "
            "last)",
            what, (LUAI_UACINT)i, (LUAI_UACINT)size);
  return (int64_t)(p - 1);
}

/* t[i]: a view of entry i of the first dim (index 2 a number) */
int l_index_get(lua_State *L) {
  gcap_tensor *t = l_checktensor(L, 1);
  int64_t k = l_checkentry(L, t, "t[i]");
  LTensor *r = l_newtensor(L);
  l_check(L, gcap_tensor_engine(t), gcap_select(t, k, &r->t), "t[i]");
  return 1;
}

/* t[i] = v: a number fills entry i, a tensor of its shape (or of its number
** of elements) is copied into it; the writes of fill_ and copy_, under
** their autograd rules. */
int l_index_set(lua_State *L) {
  gcap_tensor *t = l_checktensor(L, 1), *v = NULL, *entry;
  gcap_engine *e = gcap_tensor_engine(t);
  int64_t k = l_checkentry(L, t, "t[i] = v");
  LTensor *r;
  gcap_status st;
  if (lua_type(L, 3) != LUA_TNUMBER) {
    if (luaL_testudata(L, 3, TENSOR_MT) == NULL)
      return l_error(L, "t[i] = v: v must be a number or a tensor, got %s", l_typename(L, 3));
    v = l_checktensor(L, 3);
  }
  r = l_newtensor(L);
  l_check(L, e, gcap_select(t, k, &r->t), "t[i] = v");
  entry = r->t;
  if (v != NULL && gcap_tensor_numel(v) != gcap_tensor_numel(entry)) {
    lua_pushfstring(L, "%I", (LUAI_UACINT)gcap_tensor_numel(entry));
    return l_error(L,
                   "t[i] = v: v has %I elements, entry %I of the tensor has %s (give a number, "
                   "or a tensor of the entry's elements)",
                   (LUAI_UACINT)gcap_tensor_numel(v), (LUAI_UACINT)(k + 1), lua_tostring(L, -1));
  }
  st = v != NULL ? gcap_copy_(entry, v) : gcap_fill_(entry, lua_tonumber(L, 3));
  if (st != GCAP_OK) return l_error(L, "t[i] = v: %s", gcap_errmsg(e));
  gcap_tensor_free(r->t); /* the view now, not at collection */
  r->t = NULL;
  return 0;
}

/* Lua's < and <= must give a boolean: masks are methods */
int l_compare_refused(lua_State *L) {
  return l_error(L, "tensors do not compare with Lua's <, <=, > or >= (they give a boolean): "
                    "t:lt(u), t:le(u), t:gt(u), t:ge(u), t:eq(u), t:ne(u) give masks of 0 and 1");
}
