/*
** loptim.c: the optimizers (_optim, for graphcap.optim): SGD, Adam, AdamW,
** their steps and their learning rate.
*/

#include <limits.h>

#include "lbind.h"

/*
** {======================================================
** Optimizers
** =======================================================
*/

/* The tensors of the sequence at 1, in a GC-owned array left on the stack */
static gcap_tensor **l_checkparams(lua_State *L, const char *op, int *n) {
  lua_Integer i, len;
  gcap_tensor **v;
  if (!lua_istable(L, 1))
    l_error(L, "%s: params must be a sequence of tensors, got %s", op, l_typename(L, 1));
  len = luaL_len(L, 1);
  if (len > INT_MAX / (lua_Integer)sizeof *v) l_error(L, "%s: too many params", op);
  v = (gcap_tensor **)lua_newuserdatauv(L, (size_t)(len + 1) * sizeof *v, 0);
  for (i = 1; i <= len; i++) {
    LTensor *p;
    lua_geti(L, 1, i);
    p = (LTensor *)luaL_testudata(L, -1, TENSOR_MT);
    if (p == NULL)
      l_error(L, "%s: params[%I] must be a tensor, got %s", op, (LUAI_UACINT)i, l_typename(L, -1));
    else if (p->t == NULL)
      l_error(L, "%s: params[%I] is a closed tensor", op, (LUAI_UACINT)i);
    else
      v[i - 1] = p->t;
    lua_pop(L, 1);
  }
  *n = (int)len;
  return v;
}

/* _optim.sgd(params, lr, momentum, weight_decay) */
static int l_optim_sgd(lua_State *L) {
  gcap_engine *e = l_engine(L);
  double lr = (double)luaL_checknumber(L, 2);
  double momentum = (double)luaL_checknumber(L, 3);
  double wd = (double)luaL_checknumber(L, 4);
  int n;
  gcap_tensor **v = l_checkparams(L, "SGD", &n);
  LOptim *p = (LOptim *)l_newbox(L, sizeof *p, 1, OPTIM_MT);
  p->e = e;
  p->name = "SGD";
  l_check(L, e, gcap_optim_sgd(e, n, v, lr, momentum, wd, &p->o), "SGD");
  return 1;
}

/* Adam or AdamW (decoupled weight decay): (params, lr, beta1, beta2, eps,
** weight_decay) */
static int l_optim_adam_kind(lua_State *L, int decoupled) {
  const char *name = decoupled ? "AdamW" : "Adam";
  gcap_engine *e = l_engine(L);
  double lr = (double)luaL_checknumber(L, 2);
  double b1 = (double)luaL_checknumber(L, 3);
  double b2 = (double)luaL_checknumber(L, 4);
  double eps = (double)luaL_checknumber(L, 5);
  double wd = (double)luaL_checknumber(L, 6);
  int n;
  gcap_tensor **v = l_checkparams(L, name, &n);
  LOptim *p = (LOptim *)l_newbox(L, sizeof *p, 1, OPTIM_MT);
  p->e = e;
  p->name = name;
  l_check(L, e,
          decoupled ? gcap_optim_adamw(e, n, v, lr, b1, b2, eps, wd, &p->o)
                    : gcap_optim_adam(e, n, v, lr, b1, b2, eps, wd, &p->o),
          name);
  return 1;
}

/* _optim.adam(params, lr, beta1, beta2, eps, weight_decay) */
static int l_optim_adam(lua_State *L) {
  return l_optim_adam_kind(L, 0);
}

/* _optim.adamw(params, lr, beta1, beta2, eps, weight_decay) */
static int l_optim_adamw(lua_State *L) {
  return l_optim_adam_kind(L, 1);
}

static LOptim *l_checkoptim(lua_State *L, int i) {
  return (LOptim *)l_checkbox(L, i, &l_optim_class);
}

static void l_optim_close(lua_State *L, void *box) {
  LOptim *p = (LOptim *)box;
  (void)L;
  gcap_optim_free(p->o);
  p->o = NULL;
}

static void l_optim_describe(lua_State *L, void *box) {
  LOptim *p = (LOptim *)box;
  lua_pushfstring(L, OPTIM_MT "(%s, lr=%f)", p->name, gcap_optim_lr(p->o));
}

static int l_optim_isopen(const void *box) {
  return ((const LOptim *)box)->o != NULL;
}

static int l_optim_step(lua_State *L) {
  LOptim *p = l_checkoptim(L, 1);
  l_check(L, p->e, gcap_optim_step(p->o), "step");
  return 0;
}

/* opt:get_lr(): the learning rate the next step reads */
static int l_optim_get_lr(lua_State *L) {
  lua_pushnumber(L, (lua_Number)gcap_optim_lr(l_checkoptim(L, 1)->o));
  return 1;
}

/* opt:set_lr(lr): written to the device, where every step reads it */
static int l_optim_set_lr(lua_State *L) {
  LOptim *p = l_checkoptim(L, 1);
  l_check(L, p->e, gcap_optim_set_lr(p->o, (double)luaL_checknumber(L, 2)), "set_lr");
  return 0;
}

/* opt:zero_grad([set_to_none = true]) (the facade takes an options table) */
static int l_optim_zero_grad(lua_State *L) {
  LOptim *p = l_checkoptim(L, 1);
  int none = lua_isnoneornil(L, 2) || lua_toboolean(L, 2);
  l_check(L, p->e, gcap_optim_zero_grad(p->o, none), "zero_grad");
  return 0;
}

/* opt:_state() -> a sequence of {param, {name = state tensor, ...}}, one
** per parameter in order (gcap_optim_state: the optimizer's own tensors) */
static int l_optim_state(lua_State *L) {
  LOptim *p = l_checkoptim(L, 1);
  int i, k, n = gcap_optim_num_params(p->o);
  lua_createtable(L, n, 0);
  for (i = 0; i < n; i++) {
    const char *name;
    gcap_tensor *t;
    lua_createtable(L, 2, 0);
    l_pushborrowed(L, gcap_optim_param(p->o, i));
    lua_rawseti(L, -2, 1);
    lua_newtable(L);
    for (k = 0; (t = gcap_optim_state(p->o, i, k, &name)) != NULL; k++) {
      l_pushborrowed(L, t);
      lua_setfield(L, -2, name);
    }
    lua_rawseti(L, -2, 2);
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

/* opt:_hyper() -> {name = value} of its hyperparameters */
static int l_optim_hyper(lua_State *L) {
  static const char *const names[] = {"lr", "momentum", "beta1", "beta2", "eps", "weight_decay"};
  LOptim *p = l_checkoptim(L, 1);
  size_t i;
  lua_newtable(L);
  for (i = 0; i < sizeof names / sizeof names[0]; i++) {
    double v;
    if (gcap_optim_hyper(p->o, names[i], &v) != GCAP_OK) continue; /* not one of its own */
    lua_pushnumber(L, (lua_Number)v);
    lua_setfield(L, -2, names[i]);
  }
  return 1;
}

/* opt:_set_hyper(name, v) */
static int l_optim_set_hyper(lua_State *L) {
  LOptim *p = l_checkoptim(L, 1);
  const char *name = luaL_checkstring(L, 2);
  double v = (double)luaL_checknumber(L, 3);
  l_check(L, p->e, gcap_optim_set_hyper(p->o, name, v), "load_state_dict");
  return 0;
}

static const luaL_Reg l_optim_meta[] = {{NULL, NULL}};

static const luaL_Reg l_optim_methods[] = {{"step", l_optim_step},
                                           {"zero_grad", l_optim_zero_grad},
                                           {"get_lr", l_optim_get_lr},
                                           {"set_lr", l_optim_set_lr},
                                           {"_state", l_optim_state},
                                           {"_hyper", l_optim_hyper},
                                           {"_set_hyper", l_optim_set_hyper},
                                           {NULL, NULL}};

LUAI_DDEF const LClass l_optim_class = {"Optimizer",      OPTIM_MT,       "optimizer is closed",
                                        "closed",         l_optim_isopen, l_optim_close,
                                        l_optim_describe, l_optim_meta,   l_optim_methods};

LUAI_DDEF const luaL_Reg l_optim_funcs[] = {
    {"sgd", l_optim_sgd}, {"adam", l_optim_adam}, {"adamw", l_optim_adamw}, {NULL, NULL}};

/* }====================================================== */
