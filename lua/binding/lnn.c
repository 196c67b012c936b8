/*
** lnn.c: the built-in modules (_nn, for graphcap.nn).
*/

#include <limits.h>

#include "lbind.h"

/* Finish the built-in module box at -1 made for class 'cls': check the
** core's status, make it the module's Lua value, give it its fields. */
static int l_newbuiltin(lua_State *L, gcap_engine *e, gcap_status st, const char *op) {
  l_check(L, e, st, op);
  l_keepmodule(L);
  l_adoptfields(L, -1);
  return 1;
}

/* _nn.module(class, name): an instance of a Lua class, forward in Lua */
static int l_nn_module(lua_State *L) {
  gcap_engine *e = l_engine(L);
  const char *name = luaL_checkstring(L, 2);
  LModule *p;
  luaL_checktype(L, 1, LUA_TTABLE);
  p = l_newmodule(L, 1);
  l_check(L, e,
          gcap_module_new_n(e, name, l_lua_forward, lua_touserdata(L, ENGINEIDX), NULL, &p->m),
          name);
  l_keepmodule(L);
  return 1;
}

/* _nn.linear(class, in, out, bias, delay_wgrad, fuse_wgrad_accumulation) */
static int l_nn_linear(lua_State *L) {
  gcap_engine *e = l_engine(L);
  lua_Integer in = luaL_checkinteger(L, 2), out = luaL_checkinteger(L, 3);
  unsigned flags = (lua_toboolean(L, 5) ? GCAP_LINEAR_DELAY_WGRAD : 0u) |
                   (lua_toboolean(L, 6) ? GCAP_LINEAR_FUSE_WGRAD : 0u);
  LModule *p = l_newmodule(L, 1);
  return l_newbuiltin(L, e, gcap_nn_linear(e, in, out, lua_toboolean(L, 4), flags, &p->m),
                      "Linear");
}

static int l_nn_relu(lua_State *L) {
  gcap_engine *e = l_engine(L);
  LModule *p = l_newmodule(L, 1);
  return l_newbuiltin(L, e, gcap_nn_relu(e, &p->m), "ReLU");
}

static int l_nn_gelu(lua_State *L) {
  gcap_engine *e = l_engine(L);
  LModule *p = l_newmodule(L, 1);
  return l_newbuiltin(L, e, gcap_nn_gelu(e, &p->m), "GELU");
}

/* _nn.layer_norm(class, n, eps) */
static int l_nn_layer_norm(lua_State *L) {
  gcap_engine *e = l_engine(L);
  lua_Integer n = luaL_checkinteger(L, 2);
  double eps = (double)luaL_checknumber(L, 3);
  LModule *p = l_newmodule(L, 1);
  return l_newbuiltin(L, e, gcap_nn_layer_norm(e, n, eps, &p->m), "LayerNorm");
}

/* _nn.dropout(class, p) */
static int l_nn_dropout(lua_State *L) {
  gcap_engine *e = l_engine(L);
  double prob = (double)luaL_checknumber(L, 2);
  LModule *p = l_newmodule(L, 1);
  return l_newbuiltin(L, e, gcap_nn_dropout(e, prob, &p->m), "Dropout");
}

/* _nn.layer_norm_linear(class, in, out, eps, bias, return_layernorm_output) */
static int l_nn_layer_norm_linear(lua_State *L) {
  gcap_engine *e = l_engine(L);
  lua_Integer in = luaL_checkinteger(L, 2), out = luaL_checkinteger(L, 3);
  double eps = (double)luaL_checknumber(L, 4);
  LModule *p = l_newmodule(L, 1);
  return l_newbuiltin(
      L, e,
      gcap_nn_layer_norm_linear(e, in, out, eps, lua_toboolean(L, 5), lua_toboolean(L, 6), &p->m),
      "LayerNormLinear");
}

/* _nn.layer_norm_mlp(class, hidden, ffn_hidden, eps, bias, checkpoint) */
static int l_nn_layer_norm_mlp(lua_State *L) {
  gcap_engine *e = l_engine(L);
  lua_Integer h = luaL_checkinteger(L, 2), f = luaL_checkinteger(L, 3);
  double eps = (double)luaL_checknumber(L, 4);
  LModule *p = l_newmodule(L, 1);
  return l_newbuiltin(
      L, e, gcap_nn_layer_norm_mlp(e, h, f, eps, lua_toboolean(L, 5), lua_toboolean(L, 6), &p->m),
      "LayerNormMLP");
}

/* An int argument of C's range */
static int l_checkint(lua_State *L, int i) {
  lua_Integer v = luaL_checkinteger(L, i);
  luaL_argcheck(L, v >= INT_MIN && v <= INT_MAX, i, "out of range");
  return (int)v;
}

/* _nn.dot_product_attention(class, heads, kv_channels, mask, attention_dropout,
** attn_impl) */
static int l_nn_dot_product_attention(lua_State *L) {
  gcap_engine *e = l_engine(L);
  int heads = l_checkint(L, 2);
  lua_Integer kv = luaL_checkinteger(L, 3);
  gcap_attn_mask mask = (gcap_attn_mask)l_checkint(L, 4);
  double p = (double)luaL_checknumber(L, 5);
  gcap_sdpa_impl impl = (gcap_sdpa_impl)l_checkint(L, 6);
  LModule *r = l_newmodule(L, 1);
  return l_newbuiltin(L, e, gcap_nn_dot_product_attention(e, heads, kv, mask, p, impl, &r->m),
                      "DotProductAttention");
}

/* The options at i..i+4 (mask, attention_dropout, hidden_dropout,
** layernorm_epsilon, bias) into *o. */
static void l_tfopts(lua_State *L, int i, gcap_transformer_opts *o) {
  gcap_transformer_opts_init(o);
  o->attn_mask_type = (gcap_attn_mask)l_checkint(L, i);
  o->attention_dropout = (double)luaL_checknumber(L, i + 1);
  o->hidden_dropout = (double)luaL_checknumber(L, i + 2);
  o->layernorm_epsilon = (double)luaL_checknumber(L, i + 3);
  o->bias = lua_toboolean(L, i + 4);
}

/* _nn.multihead_attention(class, hidden, heads, mask, attention_dropout,
** hidden_dropout, eps, bias, input_layernorm, attn_impl) */
static int l_nn_multihead_attention(lua_State *L) {
  gcap_engine *e = l_engine(L);
  lua_Integer hidden = luaL_checkinteger(L, 2);
  int heads = l_checkint(L, 3);
  gcap_transformer_opts o;
  LModule *r;
  l_tfopts(L, 4, &o);
  o.input_layernorm = lua_toboolean(L, 9);
  o.attn_impl = (gcap_sdpa_impl)l_checkint(L, 10);
  r = l_newmodule(L, 1);
  return l_newbuiltin(L, e, gcap_nn_multihead_attention(e, hidden, heads, &o, &r->m),
                      "MultiheadAttention");
}

/* _nn.transformer_layer(class, hidden, ffn_hidden, heads, mask,
** attention_dropout, hidden_dropout, eps, bias, attn_impl) */
static int l_nn_transformer_layer(lua_State *L) {
  gcap_engine *e = l_engine(L);
  lua_Integer hidden = luaL_checkinteger(L, 2), ffn = luaL_checkinteger(L, 3);
  int heads = l_checkint(L, 4);
  gcap_transformer_opts o;
  LModule *r;
  l_tfopts(L, 5, &o);
  o.attn_impl = (gcap_sdpa_impl)l_checkint(L, 10);
  r = l_newmodule(L, 1);
  return l_newbuiltin(L, e, gcap_nn_transformer_layer(e, hidden, ffn, heads, &o, &r->m),
                      "TransformerLayer");
}

/* _nn.embedding(class, num_embeddings, embedding_dim) */
static int l_nn_embedding(lua_State *L) {
  gcap_engine *e = l_engine(L);
  lua_Integer n = luaL_checkinteger(L, 2), d = luaL_checkinteger(L, 3);
  LModule *r = l_newmodule(L, 1);
  return l_newbuiltin(L, e, gcap_nn_embedding(e, n, d, &r->m), "Embedding");
}

/* _nn.sequential(class, modules, n): modules[1..n] are open modules */
static int l_nn_sequential(lua_State *L) {
  gcap_engine *e = l_engine(L);
  lua_Integer i, n = luaL_checkinteger(L, 3);
  gcap_module **mods;
  LModule *p;
  luaL_checktype(L, 2, LUA_TTABLE);
  luaL_argcheck(L, n >= 0 && n <= INT_MAX / (lua_Integer)sizeof *mods, 3, "too many modules");
  mods = (gcap_module **)lua_newuserdatauv(L, (size_t)(n + 1) * sizeof *mods, 0);
  for (i = 1; i <= n; i++) {
    LModule *c;
    lua_rawgeti(L, 2, i);
    c = (LModule *)luaL_testudata(L, -1, MODULE_MT);
    if (c == NULL || c->m == NULL)
      return l_error(L, "Sequential: module #%I must be a module, got %s", (LUAI_UACINT)i,
                     (c == NULL) ? l_typename(L, -1) : "a closed module");
    mods[i - 1] = c->m;
    lua_pop(L, 1);
  }
  p = l_newmodule(L, 1);
  l_newbuiltin(L, e, gcap_nn_sequential(e, (int)n, mods, &p->m), "Sequential");
  lua_getiuservalue(L, -1, MV_FIELDS); /* seq[i] is child i too */
  for (i = 1; i <= n; i++) {
    lua_rawgeti(L, 2, i);
    lua_rawseti(L, -2, i);
  }
  lua_pop(L, 1);
  return 1;
}

/* _nn.parameter(t): t marked as a parameter (a leaf that requires grad),
** or such a leaf sharing t's storage when t is not a leaf */
static int l_nn_parameter(lua_State *L) {
  gcap_tensor *t = l_checktensor(L, 1);
  lua_settop(L, 1);
  if (!gcap_tensor_is_leaf(t)) {
    LTensor *r = l_newtensor(L);
    l_check(L, gcap_tensor_engine(t), gcap_tensor_detach(t, &r->t), "Parameter");
    t = r->t;
  }
  l_check(L, gcap_tensor_engine(t), gcap_tensor_set_requires_grad(t, 1), "Parameter");
  lua_getiuservalue(L, ENGINEIDX, EV_PMARKS);
  lua_pushvalue(L, -2);
  lua_pushboolean(L, 1);
  lua_rawset(L, -3);
  lua_pop(L, 1);
  return 1;
}

static int l_nn_is_module(lua_State *L) {
  lua_pushboolean(L, luaL_testudata(L, 1, MODULE_MT) != NULL);
  return 1;
}

/* _nn.class_of(m): the class of module m, or nil */
static int l_nn_class_of(lua_State *L) {
  luaL_checkudata(L, 1, MODULE_MT);
  lua_getiuservalue(L, 1, MV_CLASS);
  return 1;
}

LUAI_DDEF const luaL_Reg l_nn_funcs[] = {{"module", l_nn_module},
                                         {"linear", l_nn_linear},
                                         {"relu", l_nn_relu},
                                         {"gelu", l_nn_gelu},
                                         {"layer_norm", l_nn_layer_norm},
                                         {"dropout", l_nn_dropout},
                                         {"sequential", l_nn_sequential},
                                         {"layer_norm_linear", l_nn_layer_norm_linear},
                                         {"layer_norm_mlp", l_nn_layer_norm_mlp},
                                         {"dot_product_attention", l_nn_dot_product_attention},
                                         {"multihead_attention", l_nn_multihead_attention},
                                         {"transformer_layer", l_nn_transformer_layer},
                                         {"embedding", l_nn_embedding},
                                         {"parameter", l_nn_parameter},
                                         {"is_module", l_nn_is_module},
                                         {"class_of", l_nn_class_of},
                                         {NULL, NULL}};

/* }====================================================== */
