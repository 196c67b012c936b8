/*
** lops.c: ops: gc.matmul, gc.F.* and their tensor methods.
*/

#include "lbind.h"

/*
** {======================================================
** Ops (gc.matmul, gc.F.*, and their tensor methods)
** =======================================================
*/

static int l_binary(lua_State *L, l_binop f, const char *op) {
  gcap_tensor *a = l_checktensor(L, 1), *b = l_checktensor(L, 2);
  LTensor *r = l_newtensor(L);
  l_check(L, gcap_tensor_engine(a), f(a, b, &r->t), op);
  return 1;
}

int l_matmul(lua_State *L) {
  return l_binary(L, gcap_matmul, "matmul");
}

/* t:lt(u) ... t:ne(u): masks of 0 and 1 (a number is a 0-D tensor) */
static gcap_status l_cmp_lt(gcap_tensor *a, gcap_tensor *b, gcap_tensor **out) {
  return gcap_compare(a, b, GCAP_LT, out);
}
static gcap_status l_cmp_le(gcap_tensor *a, gcap_tensor *b, gcap_tensor **out) {
  return gcap_compare(a, b, GCAP_LE, out);
}
static gcap_status l_cmp_gt(gcap_tensor *a, gcap_tensor *b, gcap_tensor **out) {
  return gcap_compare(a, b, GCAP_GT, out);
}
static gcap_status l_cmp_ge(gcap_tensor *a, gcap_tensor *b, gcap_tensor **out) {
  return gcap_compare(a, b, GCAP_GE, out);
}
static gcap_status l_cmp_eq(gcap_tensor *a, gcap_tensor *b, gcap_tensor **out) {
  return gcap_compare(a, b, GCAP_EQ, out);
}
static gcap_status l_cmp_ne(gcap_tensor *a, gcap_tensor *b, gcap_tensor **out) {
  return gcap_compare(a, b, GCAP_NE, out);
}
int l_lt(lua_State *L) {
  return l_arith(L, l_cmp_lt, "lt");
}
int l_le(lua_State *L) {
  return l_arith(L, l_cmp_le, "le");
}
int l_gt(lua_State *L) {
  return l_arith(L, l_cmp_gt, "gt");
}
int l_ge(lua_State *L) {
  return l_arith(L, l_cmp_ge, "ge");
}
int l_eq(lua_State *L) {
  return l_arith(L, l_cmp_eq, "eq");
}
int l_ne(lua_State *L) {
  return l_arith(L, l_cmp_ne, "ne");
}

int l_relu(lua_State *L) {
  return l_unary(L, gcap_relu, "relu");
}
int l_gelu(lua_State *L) {
  return l_unary(L, gcap_gelu, "gelu");
}

static int l_mse_loss(lua_State *L) {
  return l_binary(L, gcap_mse_loss, "mse_loss");
}

static int l_cross_entropy(lua_State *L) {
  return l_binary(L, gcap_cross_entropy, "cross_entropy");
}

/* embedding(ids, weight) */
static int l_embedding(lua_State *L) {
  return l_binary(L, gcap_embedding, "embedding");
}

/* linear(x, w [, b]) and linear_gelu(x, w [, b]) */
static int l_linear_op(lua_State *L,
                       gcap_status (*op)(gcap_tensor *, gcap_tensor *, gcap_tensor *,
                                         gcap_tensor **),
                       const char *name) {
  gcap_tensor *x = l_checktensor(L, 1), *w = l_checktensor(L, 2);
  gcap_tensor *b = lua_isnoneornil(L, 3) ? NULL : l_checktensor(L, 3);
  LTensor *r = l_newtensor(L);
  l_check(L, gcap_tensor_engine(x), op(x, w, b, &r->t), name);
  return 1;
}

static int l_linear(lua_State *L) {
  return l_linear_op(L, gcap_linear, "linear");
}

static int l_linear_gelu(lua_State *L) {
  return l_linear_op(L, gcap_linear_gelu, "linear_gelu");
}

/* layer_norm(x [, w [, b [, eps = 1e-5]]]) */
static int l_layer_norm(lua_State *L) {
  gcap_tensor *x = l_checktensor(L, 1);
  gcap_tensor *w = lua_isnoneornil(L, 2) ? NULL : l_checktensor(L, 2);
  gcap_tensor *b = lua_isnoneornil(L, 3) ? NULL : l_checktensor(L, 3);
  double eps = (double)luaL_optnumber(L, 4, 1e-5);
  LTensor *r = l_newtensor(L);
  l_check(L, gcap_tensor_engine(x), gcap_layer_norm(x, w, b, eps, &r->t), "layer_norm");
  return 1;
}

/* dropout(x [, p = 0.5 [, training = true]]) */
static int l_dropout(lua_State *L) {
  gcap_tensor *x = l_checktensor(L, 1);
  double p = (double)luaL_optnumber(L, 2, 0.5);
  int training = l_optboolean(L, 3, 1, "training");
  LTensor *r = l_newtensor(L);
  l_check(L, gcap_tensor_engine(x), gcap_dropout(x, p, training, &r->t), "dropout");
  return 1;
}

static int l_set_grad_enabled(lua_State *L) {
  gcap_engine *e = l_engine(L);
  luaL_checktype(L, 1, LUA_TBOOLEAN);
  lua_pushboolean(L, gcap_set_grad_enabled(e, lua_toboolean(L, 1)));
  return 1;
}

static int l_is_grad_enabled(lua_State *L) {
  lua_pushboolean(L, gcap_is_grad_enabled(l_engine(L)));
  return 1;
}

LUAI_DDEF const luaL_Reg l_F_funcs[] = {{"linear", l_linear},
                                        {"linear_gelu", l_linear_gelu},
                                        {"relu", l_relu},
                                        {"gelu", l_gelu},
                                        {"layer_norm", l_layer_norm},
                                        {"softmax", l_softmax},
                                        {"dropout", l_dropout},
                                        {"mse_loss", l_mse_loss},
                                        {"cross_entropy", l_cross_entropy},
                                        {"embedding", l_embedding},
                                        {"scaled_dot_product_attention", l_sdpa},
                                        {NULL, NULL}};

/* functions of the module */
LUAI_DDEF const luaL_Reg l_ops_funcs[] = {{"set_grad_enabled", l_set_grad_enabled},
                                          {"is_grad_enabled", l_is_grad_enabled},
                                          {"matmul", l_matmul},
                                          {"masked_fill", l_masked_fill},
                                          {NULL, NULL}};
