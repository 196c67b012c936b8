/*
** lgraphcap.c: the Lua binding of graphcap, module "graphcap.core": its one
** public entry, luaopen_graphcap_core, and the boxes. The binding
** translates arguments, lifetimes and errors between Lua and graphcap.h and
** holds no numerics; the facade (graphcap/init.lua) builds on it. Its
** files (lbind.h) are cut by object family.
*/

#include <string.h>

#include "lbind.h"

/* The module's functions, by the family that holds them */
static const luaL_Reg *const l_funcs[] = {
    l_engine_funcs,  l_stream_funcs, l_graph_funcs,    l_tensor_funcs, l_ops_funcs, l_shape_funcs,
    l_graphed_funcs, l_error_funcs,  l_function_funcs, l_kernel_funcs, NULL};

/* The classes of boxes, the engine's first */
static const LClass *const l_classes[] = {&l_engine_class,    &l_tensor_class,
                                          &l_stream_class,    &l_event_class,
                                          &l_pool_class,      &l_graph_class,
                                          &l_module_class,    &l_handle_class,
                                          &l_optim_class,     &l_graphed_class,
                                          &l_kernel_class,    &l_group_class,
                                          &l_generator_class, NULL};

/* The class of the box at 1: upvalue 2 of its generic methods */
#define l_class(L) ((const LClass *)lua_touserdata(L, lua_upvalueindex(2)))

/* __gc, __close and :close(), idempotent */
static int l_box_close(lua_State *L) {
  const LClass *c = l_class(L);
  void *p = luaL_checkudata(L, 1, c->tname);
  if (c->isopen(p)) c->close(L, p);
  return 0;
}

static int l_box_tostring(lua_State *L) {
  const LClass *c = l_class(L);
  void *p = luaL_checkudata(L, 1, c->tname);
  if (c->isopen(p))
    c->describe(L, p);
  else
    lua_pushfstring(L, "%s (%s)", c->tname, c->gone);
  return 1;
}

/* Set field k of the table on top to function f with upvalues the value
** at index up (nil when up is 0) and class c. */
static void l_setgeneric(lua_State *L, const char *k, lua_CFunction f, int up, const LClass *c) {
  if (up != 0)
    lua_pushvalue(L, up);
  else
    lua_pushnil(L);
  lua_pushlightuserdata(L, (void *)c);
  lua_pushcclosure(L, f, 2);
  lua_setfield(L, -2, k);
}

/*
** Create metatable c->tname and leave it on the stack: the class's
** metamethods, its methods as __index, and the generic ones its descriptor
** asks for. With up != 0, the value at index 'up' is the upvalue of all of
** them (the first one of the generic ones).
*/
static void l_newclass(lua_State *L, const LClass *c, int up) {
  int nup = (up != 0);
  luaL_newmetatable(L, c->tname); /* also sets __name */
  if (nup) lua_pushvalue(L, up);
  luaL_setfuncs(L, c->meta, nup);
  if (c->close != NULL) {
    l_setgeneric(L, "__gc", l_box_close, up, c);
    l_setgeneric(L, "__close", l_box_close, up, c);
  }
  if (c->describe != NULL) l_setgeneric(L, "__tostring", l_box_tostring, up, c);
  lua_newtable(L);
  if (nup) lua_pushvalue(L, up);
  luaL_setfuncs(L, c->methods, nup);
  if (c->close != NULL) l_setgeneric(L, "close", l_box_close, up, c);
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
  static const struct {
    lua_CFunction fn;
    const char *key;
  } cb[] = {{l_pforward, &l_fwdkey},
            {l_phook, &l_hookkey},
            {l_pcaphook, &l_capkey},
            {l_pfnbackward, &l_fnkey},
            {l_ptwin, &l_twinkey}};
  size_t i;
  for (i = 0; i < sizeof cb / sizeof cb[0]; i++) {
    lua_pushvalue(L, eng);
    lua_pushcclosure(L, cb[i].fn, 1);
    lua_rawsetp(L, LUA_REGISTRYINDEX, cb[i].key);
  }
  l_errholder(L);
}

LUAMOD_API int luaopen_graphcap_core(lua_State *L);

LUAMOD_API int luaopen_graphcap_core(lua_State *L) {
  int i, mts, eng;
  luaL_checkversion(L);
  lua_newtable(L); /* _metatables */
  mts = lua_gettop(L);
  l_newclass(L, l_classes[0], 0); /* the engine's, before its box */
  lua_setfield(L, mts, l_classes[0]->name);
  l_pushengine(L);
  eng = lua_gettop(L);
  for (i = 1; l_classes[i] != NULL; i++) {
    l_newclass(L, l_classes[i], eng);
    lua_setfield(L, mts, l_classes[i]->name);
  }
  l_fieldaccess(L, TENSOR_MT, eng, l_tensor_index, l_tensor_newindex);
  l_fieldaccess(L, MODULE_MT, eng, l_module_index, l_module_newindex);
  l_callbacks(L, eng);
  lua_newtable(L);
  for (i = 0; l_funcs[i] != NULL; i++) {
    lua_pushvalue(L, eng);
    luaL_setfuncs(L, l_funcs[i], 1);
  }
  l_subtable(L, "F", l_F_funcs, eng);
  l_subtable(L, "_nn", l_nn_funcs, eng);
  l_subtable(L, "_optim", l_optim_funcs, eng);
  l_subtable(L, "_dist", l_dist_funcs, eng);
  l_subtable(L, "_random", l_random_funcs, eng);
  l_subtable(L, "_fp8", l_fp8_funcs, eng);
  l_subtable(L, "_test", l_test_funcs, eng);
  lua_getiuservalue(L, eng, EV_CLASSES);
  lua_setfield(L, -2, "_classes");
  lua_pushvalue(L, mts);
  lua_setfield(L, -2, "_metatables");
  lua_pushvalue(L, eng);
  lua_setfield(L, -2, "_engine");
  lua_createtable(L, GCAP_HOOK_KINDS, 0); /* the capture_time_hooks groups, in call order */
  for (i = 0; i < GCAP_HOOK_KINDS; i++) {
    lua_pushstring(L, gcap_hook_group_key((gcap_hook_kind)i));
    lua_rawseti(L, -2, i + 1);
  }
  lua_setfield(L, -2, "hook_groups");
  return 1;
}
