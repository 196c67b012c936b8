/*
** lcall.c: engine calls that may call back into Lua. Modules and autograd
** call back into Lua (a Lua module's forward, module hooks) while a core
** call that Lua started is in progress. Each such core call is made inside
** a frame (LFrame) that records its lua_State; the callbacks run under
** lua_pcall on that state, and an error is kept (l_errkey) and returned to
** the core as GCAP_EABORTED; once the core call returns, the binding raises
** the kept error object itself, unchanged (a message keeps the position
** where it was raised; the interpreter adds the one traceback). No Lua
** error unwinds through the engine.
*/

#include "lgc.h"

/* Holder of the error of a failed callback (its uservalue 1) */
typedef struct LErr {
  int set;
} LErr;

/* registry keys (their addresses) */
LUAI_DDEF const char l_errkey = 'e';  /* the LErr holder */
LUAI_DDEF const char l_fwdkey = 'f';  /* the protected part of a Lua forward */
LUAI_DDEF const char l_hookkey = 'h'; /* the protected part of a hook */
LUAI_DDEF const char l_capkey = 'c';  /* the protected part of a capture-time hook */
LUAI_DDEF const char l_mgckey = 'm';  /* the hooks of the make_graphed_callables in progress */
LUAI_DDEF const char l_progkey = 'p'; /* the protected part of a progress function */

/*
** {======================================================
** Autograd
** =======================================================
*/

/*
** Frames. Between l_enter and l_leave only the core call runs (nothing
** that can raise), so a frame never outlives its C function.
*/
LEngine *l_enter(lua_State *L, LFrame *f, gcap_module *m, int args, int nargs, int muted) {
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

void l_leave(LEngine *le, LFrame *f) {
  le->cur = f->prev;
}

/* Raise the error object a callback left, if any, as it is; a message
** (a string) gets 'ctx', the core's account of where the callback ran
** ("warmup forward of entry 1 (callable 1, function)"), appended in
** parentheses. */
void l_raisecb(lua_State *L, const char *ctx) {
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

/*
** Call, from a core callback about module m (NULL: none), the protected
** function kept in the registry at 'key' with 'ctx', on the state of the
** engine's current frame, the C function of which is running on it. When
** that frame is a direct call of m, its Lua arguments follow ctx. On a Lua
** error, keep the error object (the first one) for l_raisecb and tell the
** core to stop. Nothing here can raise.
*/
gcap_status l_callback(LEngine *le, const char *key, LCall *ctx, const gcap_module *m) {
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

/* Make the registry's error holder, before any callback runs, so that a
** callback never allocates outside lua_pcall. */
void l_errholder(lua_State *L) {
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &l_errkey) != LUA_TUSERDATA) {
    LErr *h = (LErr *)lua_newuserdatauv(L, sizeof *h, 1);
    h->set = 0;
    lua_rawsetp(L, LUA_REGISTRYINDEX, &l_errkey);
  }
  lua_pop(L, 1);
}
