/*
** lattn.c: the ops of attention with options: gc.F.softmax (dim or an
** options table), gc.masked_fill (and their tensor methods) and
** gc.F.scaled_dot_product_attention.
*/

#include <math.h>

#include "lbind.h"

/*
** {======================================================
** Options tables
** =======================================================
*/

/* The options table at t has no key but those of `known` (NULL-ended). */
static void l_checkkeys(lua_State *L, int t, const char *const *known, const char *op) {
  lua_pushnil(L);
  while (lua_next(L, t) != 0) {
    int i, ok = lua_type(L, -2) == LUA_TSTRING;
    for (i = 0; ok && known[i] != NULL; i++)
      if (strcmp(lua_tostring(L, -2), known[i]) == 0) break;
    if (!ok || known[i] == NULL) {
      lua_pushvalue(L, -2); /* tostring of a copy: lua_next needs the key as it is */
      l_error(L, "%s: unknown option '%s'", op, luaL_tolstring(L, -1, NULL));
    }
    lua_pop(L, 1);
  }
}

/* Option k of the table at t: a number (nil: def). */
static double l_numopt(lua_State *L, int t, const char *k, double def, const char *op) {
  double v = def;
  int type = lua_getfield(L, t, k);
  if (type == LUA_TNUMBER)
    v = (double)lua_tonumber(L, -1);
  else if (type != LUA_TNIL)
    l_error(L, "%s: option '%s' must be a number, got %s", op, k, l_typename(L, -1));
  lua_pop(L, 1);
  return v;
}

/* Option k: a boolean (nil: def). */
static int l_boolopt(lua_State *L, int t, const char *k, int def, const char *op) {
  int v = def, type = lua_getfield(L, t, k);
  if (type == LUA_TBOOLEAN)
    v = lua_toboolean(L, -1);
  else if (type != LUA_TNIL)
    l_error(L, "%s: option '%s' must be a boolean, got %s", op, k, l_typename(L, -1));
  lua_pop(L, 1);
  return v;
}

/* Option k: a tensor, borrowed from the table (which the caller keeps), or NULL for nil. */
static gcap_tensor *l_tensoropt(lua_State *L, int t, const char *k, const char *op) {
  gcap_tensor *v = NULL;
  int type = lua_getfield(L, t, k);
  if (type != LUA_TNIL) {
    LTensor *b = (LTensor *)luaL_testudata(L, -1, TENSOR_MT);
    if (b == NULL)
      l_error(L, "%s: option '%s' must be a tensor, got %s", op, k, l_typename(L, -1));
    else if (b->t == NULL)
      l_error(L, "%s: option '%s' is a closed tensor", op, k);
    else
      v = b->t;
  }
  lua_pop(L, 1);
  return v;
}

/* The mask of an options table: `add` (additive) or `boolean` (nonzero
** masks out), at most one of them, into *mask and *kind. */
static void l_maskopt(lua_State *L, int t, const char *add, const char *boolean, const char *op,
                      gcap_tensor **mask, gcap_mask_kind *kind) {
  gcap_tensor *a = l_tensoropt(L, t, add, op), *b = l_tensoropt(L, t, boolean, op);
  if (a != NULL && b != NULL)
    l_error(L, "%s: options '%s' and '%s' exclude each other (give one mask)", op, add, boolean);
  *mask = a != NULL ? a : b;
  *kind = b != NULL ? GCAP_MASK_BOOL : GCAP_MASK_ADD;
}

/* }====================================================== */

/*
** {======================================================
** softmax, masked_fill
** =======================================================
*/

/* softmax(x [, dim = -1]) or softmax(x, {dim = -1, scale = 1, mask = m |
** mask_bool = m, causal = false}) */
int l_softmax(lua_State *L) {
  static const char *const keys[] = {"dim", "scale", "mask", "mask_bool", "causal", NULL};
  gcap_tensor *x = l_checktensor(L, 1), *mask = NULL;
  gcap_mask_kind kind = GCAP_MASK_ADD;
  double scale = 1.0;
  int causal = 0, n = gcap_tensor_ndim(x);
  lua_Integer d = -1;
  LTensor *r;
  if (lua_istable(L, 2)) {
    l_checkkeys(L, 2, keys, "softmax");
    if (lua_getfield(L, 2, "dim") != LUA_TNIL) {
      if (!lua_isinteger(L, -1))
        return l_error(L, "softmax: option 'dim' must be an integer, got %s", l_typename(L, -1));
      d = lua_tointeger(L, -1);
    }
    lua_pop(L, 1);
    scale = l_numopt(L, 2, "scale", 1.0, "softmax");
    causal = l_boolopt(L, 2, "causal", 0, "softmax");
    l_maskopt(L, 2, "mask", "mask_bool", "softmax", &mask, &kind);
  } else
    d = luaL_optinteger(L, 2, -1);
  if (n > 0) {
    lua_Integer p = (d < 0) ? d + n + 1 : d; /* 1-based */
    if (d == 0 || p < 1 || p > n)
      return l_error(L,
                     "softmax: dim %I is out of range for a %d-D tensor "
                     "(dims count from 1; -1 is the last)",
                     (LUAI_UACINT)d, n);
    if (p != n)
      return l_error(L,
                     "softmax: only the last dimension is supported "
                     "(dim -1 or %d), got dim %I",
                     n, (LUAI_UACINT)d);
  }
  r = l_newtensor(L);
  l_check(L, gcap_tensor_engine(x), gcap_softmax_masked(x, scale, mask, kind, causal, &r->t),
          "softmax");
  return 1;
}

/* masked_fill(t, mask, value): value where the mask is nonzero */
int l_masked_fill(lua_State *L) {
  gcap_tensor *t = l_checktensor(L, 1), *mask = l_checktensor(L, 2);
  double v = (double)luaL_checknumber(L, 3);
  LTensor *r = l_newtensor(L);
  l_check(L, gcap_tensor_engine(t), gcap_masked_fill(t, mask, v, &r->t), "masked_fill");
  return 1;
}

/* scaled_dot_product_attention(q, k, v [, {attn_mask = m | attn_mask_bool = m,
** is_causal = false, dropout_p = 0, scale = 1 / sqrt(D), impl = "auto"}]) */
int l_sdpa(lua_State *L) {
  static const char op[] = "scaled_dot_product_attention";
  static const char *const keys[] = {"attn_mask", "attn_mask_bool", "is_causal", "dropout_p",
                                     "scale",     "impl",           NULL};
  static const char *const impls[] = {"auto", "composed", "fused", "cudnn", NULL};
  gcap_tensor *q = l_checktensor(L, 1), *k = l_checktensor(L, 2), *v = l_checktensor(L, 3);
  gcap_sdpa_opts o;
  LTensor *r;
  memset(&o, 0, sizeof o);
  if (!lua_isnoneornil(L, 4)) {
    luaL_checktype(L, 4, LUA_TTABLE);
    l_checkkeys(L, 4, keys, op);
    l_maskopt(L, 4, "attn_mask", "attn_mask_bool", op, &o.attn_mask, &o.mask_kind);
    o.is_causal = l_boolopt(L, 4, "is_causal", 0, op);
    o.dropout_p = l_numopt(L, 4, "dropout_p", 0.0, op);
    o.scale = l_numopt(L, 4, "scale", 0.0, op);
    if (lua_getfield(L, 4, "scale") != LUA_TNIL && !(o.scale > 0.0 && o.scale < HUGE_VAL))
      return l_error(L, "%s: option 'scale' must be a positive finite number, got %f", op,
                     (LUAI_UACNUMBER)o.scale);
    lua_pop(L, 1);
    if (lua_getfield(L, 4, "impl") != LUA_TNIL) {
      const char *name = lua_tostring(L, -1);
      int i;
      for (i = 0; name != NULL && lua_type(L, -1) == LUA_TSTRING && impls[i] != NULL; i++)
        if (strcmp(name, impls[i]) == 0) break;
      if (name == NULL || lua_type(L, -1) != LUA_TSTRING || impls[i] == NULL)
        return l_error(L,
                       "%s: option 'impl' must be 'auto', 'composed', 'fused' or 'cudnn', got %s",
                       op, luaL_tolstring(L, -1, NULL));
      o.impl = (gcap_sdpa_impl)i; /* the names in the enum's order */
    }
    lua_pop(L, 1);
  }
  r = l_newtensor(L);
  l_check(L, gcap_tensor_engine(q), gcap_scaled_dot_product_attention(q, k, v, &o, &r->t), op);
  return 1;
}

/* }====================================================== */
