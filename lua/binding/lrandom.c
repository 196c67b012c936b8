/*
** lrandom.c: random generators (`_random`, for graphcap.random). Each
** generator has one Generator box while it lives, the default one's made
** here on first use (it does not own the generator: the engine does); the
** functions take a box, or nil for the generator in use.
*/

#include <stdint.h>

#include "lbind.h"

static LGenerator *l_checkgenerator(lua_State *L, int i) {
  return (LGenerator *)l_checkbox(L, i, &l_generator_class);
}

/* The generator of the box at i, or the one in use when it is nil. */
static gcap_generator *l_optgenerator(lua_State *L, int i) {
  return lua_isnoneornil(L, i) ? gcap_current_generator(l_engine(L)) : l_checkgenerator(L, i)->g;
}

/* Record the Generator box on top as the box of its generator. */
static void l_keepgenerator(lua_State *L) {
  LGenerator *p = (LGenerator *)lua_touserdata(L, -1);
  lua_getiuservalue(L, ENGINEIDX, EV_GENERATORS);
  lua_pushvalue(L, -2);
  lua_rawsetp(L, -2, p->g);
  lua_pop(L, 1);
}

/* Push the box of generator g, the same Lua value while it lives. One made
** here holds a reference (the generator in use may have lost its box), but
** for the default generator, which the engine owns (its box must not outlive
** the engine: the engine box's close closes it). */
static void l_pushgenerator(lua_State *L, gcap_engine *e, gcap_generator *g) {
  LGenerator *p;
  lua_getiuservalue(L, ENGINEIDX, EV_GENERATORS);
  if (lua_rawgetp(L, -1, g) == LUA_TUSERDATA && ((LGenerator *)lua_touserdata(L, -1))->g == g) {
    lua_remove(L, -2);
    return;
  }
  lua_pop(L, 2);
  p = (LGenerator *)l_newbox(L, sizeof *p, 1, GENERATOR_MT);
  p->e = e;
  p->g = g;
  if (g != gcap_default_generator(e)) p->own = gcap_generator_retain(g) != NULL;
  l_keepgenerator(L);
}

/* _random.new(seed) -> a new generator of state {seed, 0} */
static int l_generator_new(lua_State *L) {
  gcap_engine *e = l_engine(L);
  uint64_t seed = (uint64_t)luaL_checkinteger(L, 1);
  LGenerator *p = (LGenerator *)l_newbox(L, sizeof *p, 1, GENERATOR_MT);
  p->e = e;
  p->own = 1;
  l_check(L, e, gcap_generator_new(e, seed, &p->g), "RNGStatesTracker");
  l_keepgenerator(L);
  return 1;
}

/* _random.default() and _random.current(): their boxes */
static int l_generator_default(lua_State *L) {
  gcap_engine *e = l_engine(L);
  l_pushgenerator(L, e, gcap_default_generator(e));
  return 1;
}

static int l_generator_current(lua_State *L) {
  gcap_engine *e = l_engine(L);
  l_pushgenerator(L, e, gcap_current_generator(e));
  return 1;
}

/* _random.use(g | nil): draw from g (nil: the default) from now on */
static int l_generator_use(lua_State *L) {
  gcap_engine *e = l_engine(L);
  gcap_generator *g = lua_isnoneornil(L, 1) ? NULL : l_checkgenerator(L, 1)->g;
  l_check(L, e, gcap_set_generator(e, g), "fork");
  return 0;
}

/* _random.get_state([g], op) -> seed, offset (64-bit patterns as integers) */
static int l_generator_get_state(lua_State *L) {
  gcap_engine *e = l_engine(L);
  gcap_generator *g = l_optgenerator(L, 1);
  uint64_t seed, offset;
  l_check(L, e, gcap_generator_get_state(g, &seed, &offset), luaL_optstring(L, 2, "get_rng_state"));
  lua_pushinteger(L, (lua_Integer)seed);
  lua_pushinteger(L, (lua_Integer)offset);
  return 2;
}

/* _random.set_state(g | nil, seed, offset, op) */
static int l_generator_set_state(lua_State *L) {
  gcap_engine *e = l_engine(L);
  gcap_generator *g = l_optgenerator(L, 1);
  uint64_t seed = (uint64_t)luaL_checkinteger(L, 2), offset = (uint64_t)luaL_checkinteger(L, 3);
  l_check(L, e, gcap_generator_set_state(g, seed, offset), luaL_optstring(L, 4, "set_rng_state"));
  return 0;
}

/* _random.save(g | nil) -> a tensor holding its state, copied on the device */
static int l_generator_save(lua_State *L) {
  gcap_engine *e = l_engine(L);
  gcap_generator *g = l_optgenerator(L, 1);
  LTensor *r = l_newtensor(L);
  l_check(L, e, gcap_generator_save(g, &r->t), "checkpoint");
  return 1;
}

/* _random.restore(g | nil, t): its state from such a tensor, on the device */
static int l_generator_restore(lua_State *L) {
  gcap_engine *e = l_engine(L);
  gcap_generator *g = l_optgenerator(L, 1);
  l_check(L, e, gcap_generator_restore(g, l_checktensor(L, 2)), "checkpoint");
  return 0;
}

static void l_generator_close(lua_State *L, void *box) {
  LGenerator *p = (LGenerator *)box;
  (void)L;
  if (p->own) gcap_generator_free(p->g);
  p->g = NULL;
}

static void l_generator_describe(lua_State *L, void *box) {
  LGenerator *p = (LGenerator *)box;
  if (p->g == gcap_default_generator(p->e))
    lua_pushliteral(L, GENERATOR_MT "(default)");
  else
    lua_pushfstring(L, GENERATOR_MT "(%p)", (void *)p->g);
}

static int l_generator_isopen(const void *box) {
  return ((const LGenerator *)box)->g != NULL;
}

static const luaL_Reg l_generator_meta[] = {{NULL, NULL}};
static const luaL_Reg l_generator_methods[] = {{NULL, NULL}};

LUAI_DDEF const LClass l_generator_class = {
    "Generator",        GENERATOR_MT,      "generator is closed", "closed",
    l_generator_isopen, l_generator_close, l_generator_describe,  l_generator_meta,
    l_generator_methods};

LUAI_DDEF const luaL_Reg l_random_funcs[] = {{"new", l_generator_new},
                                             {"default", l_generator_default},
                                             {"current", l_generator_current},
                                             {"use", l_generator_use},
                                             {"get_state", l_generator_get_state},
                                             {"set_state", l_generator_set_state},
                                             {"save", l_generator_save},
                                             {"restore", l_generator_restore},
                                             {NULL, NULL}};
