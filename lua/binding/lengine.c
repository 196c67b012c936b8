/*
** lengine.c: the engine box (one per Lua state, opened on first use on the
** device GRAPHCAP_DEVICE names), the module's functions of the engine as a
** whole (device, version, synchronize, the replay check, the seed), the
** clock, the trace, and gc._test.
*/

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lbind.h"

static void l_engine_close(lua_State *L, void *box) {
  LEngine *p = (LEngine *)box;
  /* boxes of the engine's own streams and generator must not outlive them */
  lua_getiuservalue(L, 1, EV_STREAMS);
  lua_pushnil(L);
  while (lua_next(L, -2) != 0) {
    LStream *s = (LStream *)lua_touserdata(L, -1);
    if (!s->own) s->s = NULL;
    lua_pop(L, 1);
  }
  lua_getiuservalue(L, 1, EV_GENERATORS);
  lua_pushnil(L);
  while (lua_next(L, -2) != 0) {
    LGenerator *g = (LGenerator *)lua_touserdata(L, -1);
    if (!g->own) g->g = NULL;
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
  l_weaktable(L, "v");
  lua_setiuservalue(L, -2, EV_GENERATORS);
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

static int l_is_graph_capturing(lua_State *L) {
  lua_pushboolean(L, gcap_is_graph_capturing(l_engine(L)));
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

/* functions of the module */
LUAI_DDEF const luaL_Reg l_engine_funcs[] = {{"device", l_device},
                                             {"version", l_version},
                                             {"cuda_available", l_cuda_available},
                                             {"synchronize", l_synchronize},
                                             {"is_capturing", l_is_capturing},
                                             {"is_graph_capturing", l_is_graph_capturing},
                                             {"set_replay_check", l_set_replay_check},
                                             {"manual_seed", l_manual_seed},
                                             {"clock", l_clock},
                                             {"trace_start", l_trace_start},
                                             {"trace_stop", l_trace_stop},
                                             {NULL, NULL}};
