/*
** lgraphcap.c: the Lua binding of graphcap, module "graphcap.core": its one
** public entry, luaopen_graphcap_core, and the boxes. The binding
** translates arguments, lifetimes and errors between Lua and graphcap.h and
** holds no numerics; the facade (graphcap/init.lua) builds on it. Its
** files (lgc.h) are cut by object family.
*/

#include <string.h>

#include "lgc.h"

gcap_engine *l_engine(lua_State *L) {
  gcap_engine *e = ((LEngine *)lua_touserdata(L, ENGINEIDX))->e;
  if (e == NULL) luaL_error(L, "graphcap engine is closed");
  return e;
}

/* A new box in its closed state, linked to the engine box. */
void *l_newbox(lua_State *L, size_t size, int nuv, const char *mt) {
  void *p = lua_newuserdatauv(L, size, nuv);
  memset(p, 0, size); /* NULL handle: closed */
  luaL_setmetatable(L, mt);
  lua_pushvalue(L, ENGINEIDX);
  lua_setiuservalue(L, -2, UV_ENGINE);
  return p;
}

/* The module's functions, by the family that holds them */
static const luaL_Reg *const l_funcs[] = {l_runtime_funcs, l_tensor_funcs, l_ops_funcs,
                                          l_graphed_funcs, NULL};

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
  l_errholder(L);
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
  lua_newtable(L);
  for (i = 0; l_funcs[i] != NULL; i++) {
    lua_pushvalue(L, eng);
    luaL_setfuncs(L, l_funcs[i], 1);
  }
  l_subtable(L, "F", l_F_funcs, eng);
  l_subtable(L, "_nn", l_nn_funcs, eng);
  l_subtable(L, "_optim", l_optim_funcs, eng);
  l_subtable(L, "_test", l_test_funcs, eng);
  lua_getiuservalue(L, eng, EV_CLASSES);
  lua_setfield(L, -2, "_classes");
  lua_pushvalue(L, mts);
  lua_setfield(L, -2, "_metatables");
  lua_pushvalue(L, eng);
  lua_setfield(L, -2, "_engine");
  return 1;
}
