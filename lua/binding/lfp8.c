/*
** lfp8.c: FP8 (_fp8, for graphcap.fp8): the casts, the device's FP8, the
** engine's autocast and a module's FP8 state. The facade (graphcap/fp8.lua)
** reads the names of formats and the recipe objects; here arguments are
** positional numbers.
*/

#include "lbind.h"

/* cast(x, format, scale) -> y, amax: the FP8 round trip at a scale */
static int l_fp8_cast(lua_State *L) {
  gcap_tensor *x = l_checktensor(L, 1);
  gcap_fp8_format f = (gcap_fp8_format)luaL_checkinteger(L, 2);
  double scale = luaL_checknumber(L, 3);
  LTensor *y = l_newtensor(L), *amax = l_newtensor(L);
  l_check(L, gcap_tensor_engine(x), gcap_fp8_cast(x, f, scale, &y->t, &amax->t), "fp8.cast");
  return 2;
}

/* is_available() -> true, or false and the reason */
static int l_fp8_is_available(lua_State *L) {
  char why[256];
  int ok = gcap_fp8_is_available(l_engine(L), why, sizeof why);
  lua_pushboolean(L, ok);
  if (ok) return 1;
  lua_pushstring(L, why);
  return 2;
}

/* set_autocast(enabled [, kind, format, margin, len, algo, group]): the
** engine's autocast (the facade restores the previous one itself) */
static int l_fp8_set_autocast(lua_State *L) {
  gcap_engine *e = l_engine(L);
  gcap_fp8_autocast a;
  memset(&a, 0, sizeof a);
  a.enabled = lua_toboolean(L, 1);
  if (a.enabled) {
    a.recipe.kind = (gcap_fp8_recipe_kind)luaL_checkinteger(L, 2);
    a.recipe.fp8_format = (gcap_fp8_recipe_format)luaL_checkinteger(L, 3);
    a.recipe.margin = luaL_checknumber(L, 4);
    a.recipe.amax_history_len = (int)luaL_checkinteger(L, 5);
    a.recipe.amax_compute_algo = (gcap_amax_algo)luaL_checkinteger(L, 6);
    if (!lua_isnoneornil(L, 7))
      a.amax_reduction_group = ((LGroup *)l_checkbox(L, 7, &l_group_class))->g;
  }
  l_check(L, e, gcap_fp8_set_autocast(e, &a, NULL), "fp8.autocast");
  return 0;
}

/* gemms(m) -> the FP8 GEMMs module m runs itself */
static int l_fp8_gemms(lua_State *L) {
  lua_pushinteger(L, gcap_module_fp8_gemms(l_checkmodule(L, 1)->m));
  return 1;
}

/* state(m, gemm, role) -> scale, {amax history, most recent first} (gemm
** and role from 0) */
static int l_fp8_state(lua_State *L) {
  gcap_module *m = l_checkmodule(L, 1)->m;
  int gemm = (int)luaL_checkinteger(L, 2), role = (int)luaL_checkinteger(L, 3), len = 0, j;
  float scale = 1.0f, *hist;
  gcap_status st = gcap_module_fp8_state(m, gemm, role, 0, &scale, NULL, &len);
  l_check(L, l_engine(L), st, "fp8_state");
  hist = (float *)lua_newuserdatauv(L, (size_t)(len > 0 ? len : 1) * sizeof *hist, 0);
  st = gcap_module_fp8_state(m, gemm, role, len, &scale, hist, &len);
  l_check(L, l_engine(L), st, "fp8_state");
  lua_pushnumber(L, scale);
  lua_createtable(L, len, 0);
  for (j = 0; j < len; j++) {
    lua_pushnumber(L, hist[j]);
    lua_rawseti(L, -2, j + 1);
  }
  return 2;
}

LUAI_DDEF const luaL_Reg l_fp8_funcs[] = {{"cast", l_fp8_cast},
                                          {"is_available", l_fp8_is_available},
                                          {"set_autocast", l_fp8_set_autocast},
                                          {"gemms", l_fp8_gemms},
                                          {"state", l_fp8_state},
                                          {NULL, NULL}};
