/*
** lstream.c: streams and events. Each stream has one Stream box, the same
** Lua value while it lives (the engine's own streams too: default, capture);
** the current stream is the engine's, its box kept alive while it is.
*/

#include "lbind.h"

LStream *l_checkstream(lua_State *L, int i) {
  return (LStream *)l_checkbox(L, i, &l_stream_class);
}

static LEvent *l_checkevent(lua_State *L, int i) {
  return (LEvent *)l_checkbox(L, i, &l_event_class);
}

/* Record the Stream box on top as the box of its stream. */
static void l_keepstream(lua_State *L) {
  LStream *p = (LStream *)lua_touserdata(L, -1);
  lua_getiuservalue(L, ENGINEIDX, EV_STREAMS);
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
  lua_getiuservalue(L, ENGINEIDX, EV_STREAMS);
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
  lua_setiuservalue(L, ENGINEIDX, EV_CURRENT);
  return 0;
}

static void l_stream_close(lua_State *L, void *box) {
  LStream *p = (LStream *)box;
  (void)L;
  if (p->own) gcap_stream_free(p->s); /* the default becomes current */
  p->s = NULL;
}

static void l_stream_describe(lua_State *L, void *box) {
  LStream *p = (LStream *)box;
  if (p->s == gcap_default_stream(p->e))
    lua_pushliteral(L, STREAM_MT "(default)");
  else if (p->s == gcap_capture_stream(p->e))
    lua_pushliteral(L, STREAM_MT "(capture)");
  else
    lua_pushfstring(L, STREAM_MT "(%p)", (void *)p->s);
}

static int l_stream_isopen(const void *box) {
  return ((const LStream *)box)->s != NULL;
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

static const luaL_Reg l_stream_meta[] = {{NULL, NULL}};

static const luaL_Reg l_stream_methods[] = {
    {"synchronize", l_stream_synchronize}, {"wait_event", l_stream_wait_event}, {NULL, NULL}};

LUAI_DDEF const LClass l_stream_class = {"Stream",          STREAM_MT,       "stream is closed",
                                         "closed",          l_stream_isopen, l_stream_close,
                                         l_stream_describe, l_stream_meta,   l_stream_methods};

/* Event([external]): external, recorded in a capture, is a node of the graph */
static int l_event_new(lua_State *L) {
  gcap_engine *e = l_engine(L);
  int external = lua_toboolean(L, 1);
  LEvent *p = (LEvent *)l_newbox(L, sizeof *p, 1, EVENT_MT);
  p->e = e;
  l_check(L, e, external ? gcap_event_new_external(e, &p->ev) : gcap_event_new(e, &p->ev), "Event");
  return 1;
}

static void l_event_close(lua_State *L, void *box) {
  LEvent *p = (LEvent *)box;
  (void)L;
  gcap_event_free(p->ev);
  p->ev = NULL;
}

static void l_event_describe(lua_State *L, void *box) {
  LEvent *p = (LEvent *)box;
  lua_pushfstring(L, EVENT_MT "(%p)", (void *)p->ev);
}

static int l_event_isopen(const void *box) {
  return ((const LEvent *)box)->ev != NULL;
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

static const luaL_Reg l_event_meta[] = {{NULL, NULL}};

static const luaL_Reg l_event_methods[] = {
    {"record", l_event_record}, {"synchronize", l_event_synchronize}, {NULL, NULL}};

LUAI_DDEF const LClass l_event_class = {"Event",          EVENT_MT,       "event is closed",
                                        "closed",         l_event_isopen, l_event_close,
                                        l_event_describe, l_event_meta,   l_event_methods};

/* functions of the module */
LUAI_DDEF const luaL_Reg l_stream_funcs[] = {{"Stream", l_stream_new},
                                             {"current_stream", l_current_stream},
                                             {"default_stream", l_default_stream},
                                             {"capture_stream", l_capture_stream},
                                             {"set_current_stream", l_set_current_stream},
                                             {"Event", l_event_new},
                                             {NULL, NULL}};
