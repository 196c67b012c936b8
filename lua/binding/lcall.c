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

#include <stdio.h>

#include "lbind.h"

/* Holder of the error of a failed callback (its uservalue 1) */
typedef struct LErr {
  int set;
} LErr;

/* registry keys (their addresses) */
LUAI_DDEF const char l_errkey = 'e';  /* the LErr holder */
LUAI_DDEF const char l_fwdkey = 'f';  /* the protected part of a Lua forward */
LUAI_DDEF const char l_hookkey = 'h'; /* the protected part of a hook */
LUAI_DDEF const char l_capkey = 'c';  /* the protected part of a capture-time hook */

/*
** The engine calls that may run Lua, each made through l_run (the others
** run no Lua and raise through l_check):
**
**   gcap_backward                 t:backward()        module hooks, Function backwards
**   gcap_module_call              m(...), m:forward() a Lua forward, module hooks
**   gcap_module_backward_dw       m:backward_dw()     backward hooks
**   gcap_make_graphed_callables   make_graphed_...    forwards, Function backwards, module
**                                                     and capture-time hooks, warmup hooks,
**                                                     progress
**   gcap_graphed_call             G:call()            module hooks (eager modes)
**   gcap_graph_replay             g:replay()          kernels' host twins (host backend)
**   gcap_kernel_launch            k:launch()          its host twin (host backend)
**
** A callback reaches Lua through l_callback, the one caller of lua_pcall.
*/

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

/*
** Run r->call(r->ud), an engine call that may call back into Lua: keep its
** objects alive (a callback may close their boxes), make the call inside a
** frame, copy the engine's message while its objects live, release them,
** then raise: a callback's error object as it is (a message gets the
** engine's account of where it ran appended, with r->ctx), else the
** engine's message naming r->op (NULL: the type of module r->m). Between
** entering and leaving the frame only the engine call runs (nothing that
** can raise), so a frame never outlives its C function.
*/
void l_run(lua_State *L, const LRun *r) {
  LEngine *le = (LEngine *)lua_touserdata(L, ENGINEIDX);
  char msg[1024], op[256];
  LFrame f;
  gcap_status st;
  int i;
  gcap_module_retain(r->m);
  if (r->g != NULL) gcap_graphed_retain(r->g);
  for (i = 0; i < r->nin; i++)
    gcap_tensor_retain(r->in[i]);
  f.L = L;
  f.m = r->subject;
  f.args = r->args;
  f.nargs = r->nargs;
  f.muted = r->muted;
  f.replaced = 0;
  f.results = r->results;
  f.graphing = r->graphing;
  f.prev = le->cur;
  le->cur = &f;
  st = r->call(r, r->ud);
  le->cur = f.prev;
  if (st != GCAP_OK) {
    snprintf(msg, sizeof msg, "%s", gcap_errmsg(r->e));
    snprintf(op, sizeof op, "%s", (r->op != NULL) ? r->op : gcap_module_type(r->m));
  }
  for (i = 0; i < r->nin; i++)
    gcap_tensor_free(r->in[i]);
  if (r->g != NULL) gcap_graphed_free(r->g);
  gcap_module_free(r->m);
  l_raisecb(L, (r->ctx && st != GCAP_OK) ? msg : NULL);
  if (st != GCAP_OK) l_fail(L, st, msg, op);
}

/*
** Call, from a core callback about module m (NULL: none), the protected
** function kept in the registry at 'key' with 'ctx', on the state of the
** engine's current frame, the C function of which is running on it. When
** that frame is about m (a direct call of m, or, m NULL, a call about no
** module), its Lua values follow ctx: m's arguments, or the Graphed box of
** make_graphed_callables. On a Lua
** error, keep the error object (the first one) for l_raisecb and tell the
** core to stop. Nothing here can raise.
*/
gcap_status l_callback(LEngine *le, const char *key, LCall *ctx, const gcap_module *m) {
  LFrame *f = le->cur;
  lua_State *L;
  int i, top, st;
  if (f == NULL) return GCAP_EABORTED; /* no Lua call in progress */
  L = f->L;
  /* about the frame's module (while its call's Lua values are its inputs), or both none */
  ctx->nargs = (f->m == m && !f->replaced) ? f->nargs : 0;
  ctx->results = ctx->results && f->m == m && f->results != 0;
  if (!lua_checkstack(L, 5 + ctx->nargs)) return GCAP_ENOMEM;
  top = lua_gettop(L);
  lua_rawgetp(L, LUA_REGISTRYINDEX, key);
  lua_pushlightuserdata(L, ctx);
  for (i = 0; i < ctx->nargs; i++)
    lua_pushvalue(L, f->args + i);
  if (ctx->results) lua_pushvalue(L, f->results);
  st = lua_pcall(L, 1 + ctx->nargs + ctx->results, 0, 0);
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
