/*
** lbytes.c: a tensor's raw bytes as a Lua string, in the dtype it has
** (t:tobytes(), t:_write_bytes(s)): what gc.save and gc.load move between a
** file and the device, a bf16 value bit for bit.
*/

#include "lbind.h"

/* t:tobytes() -> the string of t's elements as the device stores them */
int l_tobytes(lua_State *L) {
  gcap_tensor *t = l_checktensor(L, 1);
  size_t n = (size_t)gcap_tensor_numel(t) * (gcap_tensor_dtype(t) == GCAP_BF16 ? 2 : 4);
  luaL_Buffer b;
  char *p = luaL_buffinitsize(L, &b, n);
  l_check(L, gcap_tensor_engine(t), gcap_tensor_read_bytes(t, p, n), "tobytes");
  luaL_pushresultsize(&b, n);
  return 1;
}

/* t:_write_bytes(s) -> t, its elements overwritten in place by the bytes of s */
int l_write_bytes(lua_State *L) {
  gcap_tensor *t = l_checktensor(L, 1);
  size_t n;
  const char *s = luaL_checklstring(L, 2, &n);
  l_check(L, gcap_tensor_engine(t), gcap_tensor_write_bytes(t, s, n), "frombytes");
  lua_settop(L, 1);
  return 1;
}
