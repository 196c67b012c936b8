/*
** lgraph.c: graphs and the memory pools they capture into: Graph boxes
** (capture, replay, reset, stats, the pool, name, DOT dumps), Pool boxes
** (graph_pool_handle), and the memory statistics of a pool and of the engine.
*/

#include "lbind.h"

static LPool *l_checkpool(lua_State *L, int i) {
  return (LPool *)l_checkbox(L, i, &l_pool_class);
}

static LGraph *l_checkgraph(lua_State *L, int i) {
  return (LGraph *)l_checkbox(L, i, &l_graph_class);
}

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

void l_pushgraphstats(lua_State *L, const gcap_graph_stats *s) {
  lua_createtable(L, 0, 5);
  lua_pushinteger(L, (lua_Integer)s->nodes);
  lua_setfield(L, -2, "nodes");
  lua_pushnumber(L, s->capture_ms);
  lua_setfield(L, -2, "capture_ms");
  lua_pushnumber(L, s->instantiate_ms);
  lua_setfield(L, -2, "instantiate_ms");
  lua_pushinteger(L, (lua_Integer)s->pool_bytes);
  lua_setfield(L, -2, "pool_bytes");
  lua_pushinteger(L, (lua_Integer)s->replays);
  lua_setfield(L, -2, "replays");
}

static int l_graph_stats(lua_State *L) {
  LGraph *p = l_checkcaptured(L, "stats");
  gcap_graph_stats gs;
  l_check(L, p->e, gcap_graph_get_stats(p->g, &gs), "stats");
  l_pushgraphstats(L, &gs);
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

/* functions of the module */
LUAI_DDEF const luaL_Reg l_graph_funcs[] = {{"memory_stats", l_memory_stats},
                                            {"reset_peak_memory_stats", l_reset_peak},
                                            {"graph_pool_handle", l_pool_new},
                                            {"Graph", l_graph_new},
                                            {NULL, NULL}};
