/*
** lruntime.c: runtime objects: the engine, streams, events, pools and graphs.
*/

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lbind.h"

LStream *l_checkstream(lua_State *L, int i) {
  return (LStream *)l_checkbox(L, i, &l_stream_class);
}

static LEvent *l_checkevent(lua_State *L, int i) {
  return (LEvent *)l_checkbox(L, i, &l_event_class);
}

LPool *l_checkpool(lua_State *L, int i) {
  return (LPool *)l_checkbox(L, i, &l_pool_class);
}

static LGraph *l_checkgraph(lua_State *L, int i) {
  return (LGraph *)l_checkbox(L, i, &l_graph_class);
}

/*
** {======================================================
** Streams and events
** =======================================================
*/

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

static int l_event_new(lua_State *L) {
  gcap_engine *e = l_engine(L);
  LEvent *p = (LEvent *)l_newbox(L, sizeof *p, 1, EVENT_MT);
  p->e = e;
  l_check(L, e, gcap_event_new(e, &p->ev), "Event");
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

/* }====================================================== */

/*
** {======================================================
** Pools and graphs
** =======================================================
*/

static void l_pushmemstats(lua_State *L, const gcap_mem_stats *m) {
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

static int l_memory_stats(lua_State *L) {
  gcap_engine *e = l_engine(L);
  gcap_mem_stats m;
  l_check(L, e, gcap_engine_mem_stats(e, &m), "memory_stats");
  l_pushmemstats(L, &m);
  return 1;
}

static int l_reset_peak(lua_State *L) {
  gcap_engine *e = l_engine(L);
  l_check(L, e, gcap_engine_reset_peak(e), "reset_peak_memory_stats");
  return 0;
}

/* gc._test: for the library's own tests only. fail_alloc(n) makes the n-th
** allocation from now fail (0: off) and tells whether the previous one was
** injected; live() gives what the engine still holds (gcap_engine_stats). */
static int l_test_fail_alloc(lua_State *L) {
  lua_Integer n = luaL_checkinteger(L, 1);
  lua_pushboolean(L, gcap_test_fail_alloc(n < 0 ? 0 : (long)n) != 0);
  return 1;
}

static int l_test_live(lua_State *L) {
  gcap_engine *e = l_engine(L);
  gcap_engine_stats s;
  l_check(L, e, gcap_engine_get_stats(e, &s), "live");
  lua_createtable(L, 0, 4);
  lua_pushinteger(L, (lua_Integer)s.objects);
  lua_setfield(L, -2, "objects");
  lua_pushinteger(L, (lua_Integer)s.blocks);
  lua_setfield(L, -2, "blocks");
  lua_pushinteger(L, (lua_Integer)s.in_use_bytes);
  lua_setfield(L, -2, "in_use_bytes");
  lua_pushinteger(L, (lua_Integer)s.pool_reserved_bytes);
  lua_setfield(L, -2, "pool_reserved_bytes");
  return 1;
}

LUAI_DDEF const luaL_Reg l_test_funcs[] = {
    {"fail_alloc", l_test_fail_alloc}, {"live", l_test_live}, {NULL, NULL}};

static int l_pool_new(lua_State *L) {
  gcap_engine *e = l_engine(L);
  LPool *p = (LPool *)l_newbox(L, sizeof *p, 1, POOL_MT);
  p->e = e;
  l_check(L, e, gcap_pool_new(e, &p->p), "graph_pool_handle");
  return 1;
}

static void l_pool_close(lua_State *L, void *box) {
  (void)L;
  LPool *p = (LPool *)box;
  gcap_pool_free(p->p); /* during a capture, the core defers the release */
  p->p = NULL;
}

static void l_pool_describe(lua_State *L, void *box) {
  LPool *p = (LPool *)box;
  lua_pushfstring(L, POOL_MT "(%p)", (void *)p->p);
}

static int l_pool_isopen(const void *box) {
  return ((const LPool *)box)->p != NULL;
}

static int l_pool_stats(lua_State *L) {
  LPool *p = l_checkpool(L, 1);
  gcap_mem_stats m;
  l_check(L, p->e, gcap_pool_get_stats(p->p, &m), "stats");
  l_pushmemstats(L, &m);
  return 1;
}

static const luaL_Reg l_pool_meta[] = {{NULL, NULL}};

static const luaL_Reg l_pool_methods[] = {{"stats", l_pool_stats}, {NULL, NULL}};

LUAI_DDEF const LClass l_pool_class = {"Pool",          POOL_MT,       "pool is closed",
                                       "closed",        l_pool_isopen, l_pool_close,
                                       l_pool_describe, l_pool_meta,   l_pool_methods};

static int l_graph_new(lua_State *L) {
  gcap_engine *e = l_engine(L);
  LGraph *p = (LGraph *)l_newbox(L, sizeof *p, NGV, GRAPH_MT);
  p->e = e;
  l_check(L, e, gcap_graph_new(e, &p->g), "Graph");
  return 1;
}

static void l_graph_close(lua_State *L, void *box) {
  LGraph *p = (LGraph *)box;
  gcap_graph_free(p->g); /* during a capture, the core defers it; during its own, ends it */
  p->g = NULL;
  if (p->e != NULL && !gcap_is_capturing(p->e)) { /* no capture: drop its stream */
    lua_pushnil(L);
    lua_setiuservalue(L, ENGINEIDX, EV_CAPTURE);
  }
}

static void l_graph_describe(lua_State *L, void *box) {
  LGraph *p = (LGraph *)box;
  lua_pushfstring(L, GRAPH_MT "(name='%s', captured=%s)", gcap_graph_name(p->g),
                  gcap_graph_is_captured(p->g) ? "true" : "false");
}

static int l_graph_isopen(const void *box) {
  return ((const LGraph *)box)->g != NULL;
}

static LGraph *l_checkcaptured(lua_State *L, const char *op) {
  LGraph *p = l_checkgraph(L, 1);
  if (!gcap_graph_is_captured(p->g))
    l_error(L, "%s: %s is not captured (reset or never captured)", op, gcap_graph_name(p->g));
  return p;
}

/* g:capture_begin([pool [, stream]]) */
static int l_capture_begin(lua_State *L) {
  LGraph *p = l_checkgraph(L, 1);
  gcap_pool *pool = lua_isnoneornil(L, 2) ? NULL : l_checkpool(L, 2)->p;
  gcap_stream *s = lua_isnoneornil(L, 3) ? NULL : l_checkstream(L, 3)->s;
  l_check(L, p->e, gcap_capture_begin(p->g, pool, s), "capture_begin");
  lua_settop(L, 3);
  lua_setiuservalue(L, ENGINEIDX, EV_CAPTURE);
  lua_setiuservalue(L, 1, GV_POOL);
  return 0;
}

static int l_capture_end(lua_State *L) {
  LGraph *p = l_checkgraph(L, 1);
  gcap_status st = gcap_capture_end(p->g);
  if (!gcap_is_capturing(p->e)) { /* the capture is over: drop its stream */
    lua_pushnil(L);
    lua_setiuservalue(L, ENGINEIDX, EV_CAPTURE);
  }
  l_check(L, p->e, st, "capture_end");
  return 0;
}

static gcap_status l_callreplay(const LRun *r, void *ud) {
  (void)r;
  return gcap_graph_replay((gcap_graph *)ud);
}

/* g:replay(): on the host backend a kernel's Lua twin may run */
static int l_replay(lua_State *L) {
  LGraph *p = l_checkcaptured(L, "replay");
  LRun r = {.call = l_callreplay, .ud = p->g, .e = p->e, .op = "replay"};
  l_run(L, &r);
  return 0;
}

static int l_reset(lua_State *L) {
  LGraph *p = l_checkgraph(L, 1);
  l_check(L, p->e, gcap_graph_reset(p->g), "reset");
  lua_pushnil(L);
  lua_setiuservalue(L, 1, GV_POOL);
  return 0;
}

static int l_graph_stats(lua_State *L) {
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
static int l_graph_pool(lua_State *L) {
  LGraph *p = l_checkgraph(L, 1);
  gcap_pool *pool = gcap_graph_pool(p->g);
  LPool *b;
  if (pool == NULL) {
    lua_pushnil(L);
    return 1;
  }
  if (lua_getiuservalue(L, 1, GV_POOL) == LUA_TUSERDATA &&
      ((LPool *)lua_touserdata(L, -1))->p == pool)
    return 1;
  b = (LPool *)l_newbox(L, sizeof *b, 1, POOL_MT);
  b->e = p->e;
  b->p = gcap_pool_retain(pool);
  lua_pushvalue(L, -1);
  lua_setiuservalue(L, 1, GV_POOL);
  return 1;
}

static int l_set_name(lua_State *L) {
  LGraph *p = l_checkgraph(L, 1);
  l_check(L, p->e, gcap_graph_set_name(p->g, luaL_checkstring(L, 2)), "set_name");
  lua_settop(L, 1);
  return 1;
}

static int l_name(lua_State *L) {
  lua_pushstring(L, gcap_graph_name(l_checkgraph(L, 1)->g));
  return 1;
}

static int l_is_captured(lua_State *L) {
  lua_pushboolean(L, gcap_graph_is_captured(l_checkgraph(L, 1)->g));
  return 1;
}

/* g:debug_dump(path): the captured graph as Graphviz DOT */
static int l_graph_debug_dump(lua_State *L) {
  LGraph *p = l_checkgraph(L, 1);
  l_check(L, p->e, gcap_graph_debug_dump(p->g, luaL_checkstring(L, 2)), "debug_dump");
  return 0;
}

static const luaL_Reg l_graph_meta[] = {{NULL, NULL}};

static const luaL_Reg l_graph_methods[] = {{"capture_begin", l_capture_begin},
                                           {"capture_end", l_capture_end},
                                           {"replay", l_replay},
                                           {"reset", l_reset},
                                           {"stats", l_graph_stats},
                                           {"pool", l_graph_pool},
                                           {"set_name", l_set_name},
                                           {"name", l_name},
                                           {"is_captured", l_is_captured},
                                           {"debug_dump", l_graph_debug_dump},
                                           {NULL, NULL}};

LUAI_DDEF const LClass l_graph_class = {"Graph",          GRAPH_MT,       "graph is closed",
                                        "closed",         l_graph_isopen, l_graph_close,
                                        l_graph_describe, l_graph_meta,   l_graph_methods};

/* }====================================================== */

/*
** {======================================================
** The engine
** =======================================================
*/

static void l_engine_close(lua_State *L, void *box) {
  LEngine *p = (LEngine *)box;
  /* boxes of the engine's own streams must not outlive them */
  lua_getiuservalue(L, 1, EV_STREAMS);
  lua_pushnil(L);
  while (lua_next(L, -2) != 0) {
    LStream *s = (LStream *)lua_touserdata(L, -1);
    if (!s->own) s->s = NULL;
    lua_pop(L, 1);
  }
  gcap_engine_free(p->e); /* the core keeps it while objects live */
  p->e = NULL;
}

static void l_engine_describe(lua_State *L, void *box) {
  LEngine *p = (LEngine *)box;
  lua_pushfstring(L, ENGINE_MT "(device=%s)", gcap_engine_device(p->e));
}

static int l_engine_isopen(const void *box) {
  return ((const LEngine *)box)->e != NULL;
}

static const luaL_Reg l_engine_meta[] = {{NULL, NULL}};

static const luaL_Reg l_engine_methods[] = {{NULL, NULL}};

LUAI_DDEF const LClass l_engine_class = {
    "Engine",          ENGINE_MT,       "graphcap engine is closed",
    "closed",          l_engine_isopen, l_engine_close,
    l_engine_describe, l_engine_meta,   l_engine_methods};

/* Push a new table with weak keys or values (mode "k" or "v"). */
static void l_weaktable(lua_State *L, const char *mode) {
  lua_newtable(L);
  lua_createtable(L, 0, 1);
  lua_pushstring(L, mode);
  lua_setfield(L, -2, "__mode");
  lua_setmetatable(L, -2);
}

/* Push the state's engine box, opening the engine on first use on the
** device that GRAPHCAP_DEVICE names (unset or empty: the default). */
void l_pushengine(lua_State *L) {
  const char *name = getenv("GRAPHCAP_DEVICE");
  gcap_device dev = GCAP_DEVICE_DEFAULT;
  LEngine *p;
  if (lua_getfield(L, LUA_REGISTRYINDEX, ENGINE_KEY) == LUA_TUSERDATA) return;
  lua_pop(L, 1);
  if (name == NULL || *name == '\0')
    name = "default";
  else if (strcmp(name, "host") == 0)
    dev = GCAP_DEVICE_HOST;
  else if (strcmp(name, "cuda") == 0)
    dev = GCAP_DEVICE_CUDA;
  else
    luaL_error(L, "GRAPHCAP_DEVICE='%s' is not a device (expected host or cuda)", name);
  p = (LEngine *)lua_newuserdatauv(L, sizeof *p, NEV);
  p->e = NULL;
  p->cur = NULL;
  luaL_setmetatable(L, ENGINE_MT);
  l_weaktable(L, "v");
  lua_setiuservalue(L, -2, EV_STREAMS);
  l_weaktable(L, "v");
  lua_setiuservalue(L, -2, EV_MODULES);
  l_weaktable(L, "v");
  lua_setiuservalue(L, -2, EV_TENSORS);
  l_weaktable(L, "k");
  lua_setiuservalue(L, -2, EV_PMARKS);
  lua_newtable(L);
  lua_setiuservalue(L, -2, EV_CLASSES);
  if (gcap_engine_new(dev, &p->e) != GCAP_OK)
    luaL_error(L, "cannot open graphcap device '%s': %s", name, gcap_last_open_error());
  lua_pushvalue(L, -1);
  lua_setfield(L, LUA_REGISTRYINDEX, ENGINE_KEY);
}

static int l_device(lua_State *L) {
  lua_pushstring(L, gcap_engine_device(l_engine(L)));
  return 1;
}

static int l_version(lua_State *L) {
  lua_pushstring(L, gcap_version());
  return 1;
}

static int l_cuda_available(lua_State *L) {
  lua_pushboolean(L, gcap_cuda_available());
  return 1;
}

static int l_synchronize(lua_State *L) {
  gcap_engine *e = l_engine(L);
  l_check(L, e, gcap_synchronize(e), "synchronize");
  return 0;
}

static int l_is_capturing(lua_State *L) {
  lua_pushboolean(L, gcap_is_capturing(l_engine(L)));
  return 1;
}

static int l_set_replay_check(lua_State *L) {
  gcap_engine *e = l_engine(L);
  luaL_checkany(L, 1);
  gcap_set_replay_check(e, lua_toboolean(L, 1));
  return 0;
}

static int l_manual_seed(lua_State *L) {
  gcap_engine *e = l_engine(L);
  uint64_t seed = (uint64_t)luaL_checkinteger(L, 1);
  l_check(L, e, gcap_manual_seed(e, seed), "manual_seed");
  return 0;
}

/* }====================================================== */

/* gc.clock() -> seconds of a monotonic clock, for timing to completion */
static int l_clock(lua_State *L) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  lua_pushnumber(L, (lua_Number)ts.tv_sec + (lua_Number)ts.tv_nsec * 1e-9);
  return 1;
}

/* gc.trace.start(path): trace the engine's work into path (Chrome JSON) */
static int l_trace_start(lua_State *L) {
  gcap_engine *e = l_engine(L);
  l_check(L, e, gcap_trace_start(e, luaL_checkstring(L, 1)), "trace.start");
  return 0;
}

/* gc.trace.stop(): finish the file (also done when the engine goes) */
static int l_trace_stop(lua_State *L) {
  gcap_engine *e = l_engine(L);
  l_check(L, e, gcap_trace_stop(e), "trace.stop");
  return 0;
}

/* functions of the module */
LUAI_DDEF const luaL_Reg l_runtime_funcs[] = {{"device", l_device},
                                              {"version", l_version},
                                              {"cuda_available", l_cuda_available},
                                              {"synchronize", l_synchronize},
                                              {"is_capturing", l_is_capturing},
                                              {"set_replay_check", l_set_replay_check},
                                              {"manual_seed", l_manual_seed},
                                              {"memory_stats", l_memory_stats},
                                              {"reset_peak_memory_stats", l_reset_peak},
                                              {"Stream", l_stream_new},
                                              {"current_stream", l_current_stream},
                                              {"default_stream", l_default_stream},
                                              {"capture_stream", l_capture_stream},
                                              {"set_current_stream", l_set_current_stream},
                                              {"Event", l_event_new},
                                              {"graph_pool_handle", l_pool_new},
                                              {"Graph", l_graph_new},
                                              {"clock", l_clock},
                                              {"trace_start", l_trace_start},
                                              {"trace_stop", l_trace_stop},
                                              {NULL, NULL}};
