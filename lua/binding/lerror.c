/*
** lerror.c: the binding's errors: a message names the user's line (the first
** Lua caller outside the facade), the op, and the core's account.
*/

#include <stdarg.h>
#include <string.h>

#include "lbind.h"

/* The registry's set of the facade's chunk sources (core._facade) */
static const char l_facadekey = 'F';

/*
** Push "chunk:line: " of the caller, as luaL_where(L, 1) does, but of the
** first Lua caller outside the facade, so that an error names the user's
** line (also from a callback, whose caller is the binding's C function).
** This is the one way the user's line is found: the facade's errors take
** it from core._where.
*/
static void l_where(lua_State *L) {
  lua_Debug ar;
  int level, set, facade;
  lua_rawgetp(L, LUA_REGISTRYINDEX, &l_facadekey);
  set = lua_gettop(L);
  for (level = 1; lua_getstack(L, level, &ar); level++) {
    lua_getinfo(L, "Sl", &ar);
    if (ar.currentline <= 0) continue; /* a C function (pcall, a callback's caller) */
    facade = lua_istable(L, set) && lua_getfield(L, set, ar.source) != LUA_TNIL;
    lua_settop(L, set);
    if (!facade) {
      lua_pushfstring(L, "%s:%d: ", ar.short_src, ar.currentline);
      lua_remove(L, set);
      return;
    }
  }
  lua_pop(L, 1);
  lua_pushliteral(L, "");
}

/* core._where() -> "chunk:line: " of the user's line, for the facade's errors */
static int l_where_fn(lua_State *L) {
  l_where(L);
  return 1;
}

/* core._facade(): the chunk calling it is part of the facade, whose lines an
** error never names */
static int l_facade(lua_State *L) {
  lua_Debug ar;
  if (!lua_getstack(L, 1, &ar)) return 0;
  lua_getinfo(L, "S", &ar);
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &l_facadekey) != LUA_TTABLE) {
    lua_pop(L, 1);
    lua_newtable(L);
    lua_pushvalue(L, -1);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &l_facadekey);
  }
  lua_pushboolean(L, 1);
  lua_setfield(L, -2, ar.source);
  return 0;
}

/* The continuation of l_entry (after a yield in the facade function): the
** results of its call. */
static int l_entryk(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  (void)ctx;
  return lua_gettop(L);
}

/* A function of the facade as scripts call it: its upvalue f called with
** the arguments, its results returned. Lua reuses the frame of a function
** that tail-calls a Lua function (`return gc.nn.Linear(0, 2)`), so l_where
** would find the caller's caller; a tail call of a C function keeps the
** caller's frame, and with it the user's line. */
static int l_entry(lua_State *L) {
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_callk(L, lua_gettop(L) - 1, LUA_MULTRET, 0, l_entryk);
  return lua_gettop(L);
}

/* core._entry(f) -> f entered through C (l_entry) */
static int l_entry_fn(lua_State *L) {
  luaL_checktype(L, 1, LUA_TFUNCTION);
  lua_settop(L, 1);
  lua_pushcclosure(L, l_entry, 1);
  return 1;
}

LUAI_DDEF const luaL_Reg l_error_funcs[] = {
    {"_where", l_where_fn}, {"_facade", l_facade}, {"_entry", l_entry_fn}, {NULL, NULL}};

/* luaL_error, with the position of l_where */
int l_error(lua_State *L, const char *fmt, ...) {
  va_list argp;
  va_start(argp, fmt);
  l_where(L);
  lua_pushvfstring(L, fmt, argp);
  va_end(argp);
  lua_concat(L, 2);
  return lua_error(L);
}

/* luaL_argerror, with the position of l_where: a closed box passed on by
** the facade is named at the user's line, not at the facade's. */
int l_argerror(lua_State *L, int arg, const char *extramsg) {
  lua_Debug ar;
  if (!lua_getstack(L, 0, &ar)) return l_error(L, "bad argument #%d (%s)", arg, extramsg);
  lua_getinfo(L, "n", &ar);
  if (ar.namewhat != NULL && strcmp(ar.namewhat, "method") == 0 && --arg == 0)
    return l_error(L, "calling '%s' on bad self (%s)", ar.name ? ar.name : "?", extramsg);
  return l_error(L, "bad argument #%d to '%s' (%s)", arg, ar.name ? ar.name : "?", extramsg);
}

/* Raise the core's message 'msg' of status 'st' as it is: the engine names
** the op where it raises the error. Only a call that left no message is
** named here, by 'op' and the status. */
void l_fail(lua_State *L, gcap_status st, const char *msg, const char *op) {
  l_where(L);
  if (msg == NULL || *msg == '\0')
    lua_pushfstring(L, "%s: %s", op, gcap_status_str(st));
  else
    lua_pushstring(L, msg);
  lua_concat(L, 2);
  lua_error(L);
}

/* Raise the core's message when a call returned 'st' != GCAP_OK. */
void l_check(lua_State *L, const gcap_engine *e, gcap_status st, const char *op) {
  if (st != GCAP_OK) l_fail(L, st, gcap_errmsg(e), op);
}

/* The type of the value at i for messages: __name of userdata. */
const char *l_typename(lua_State *L, int i) {
  int t = (lua_type(L, i) == LUA_TUSERDATA) ? luaL_getmetafield(L, i, "__name") : LUA_TNIL;
  if (t == LUA_TSTRING) {
    const char *s = lua_tostring(L, -1); /* kept alive by the metatable */
    lua_pop(L, 1);
    return s;
  }
  if (t != LUA_TNIL) lua_pop(L, 1);
  return luaL_typename(L, i);
}
