/*
** lmodule.c: modules: boxes, fields, calls m(...), parameters, buffers and
** children (a Lua forward as the core calls it is in lforward.c).
*/

#include <stdio.h>
#include <string.h>

#include "lbind.h"

/*
** {======================================================
** Modules
** =======================================================
*/

LModule *l_checkmodule(lua_State *L, int i) {
  return (LModule *)l_checkbox(L, i, &l_module_class);
}

/* A new Module box in its closed state, of the class at index 'cls' (0:
** none). */
LModule *l_newmodule(lua_State *L, int cls) {
  LModule *p;
  cls = (cls != 0) ? lua_absindex(L, cls) : 0;
  p = (LModule *)l_newbox(L, sizeof *p, NMV, MODULE_MT);
  lua_newtable(L);
  lua_setiuservalue(L, -2, MV_FIELDS);
  if (cls != 0) {
    lua_pushvalue(L, cls);
    lua_setiuservalue(L, -2, MV_CLASS);
  }
  lua_newtable(L);
  lua_setiuservalue(L, -2, MV_HOOKS);
  lua_newtable(L);
  lua_setiuservalue(L, -2, MV_REG);
  return p;
}

/* Make the (open) Module box on top the Lua value of its module. */
void l_keepmodule(lua_State *L) {
  LModule *p = (LModule *)lua_touserdata(L, -1);
  lua_getiuservalue(L, ENGINEIDX, EV_MODULES);
  lua_pushvalue(L, -2);
  lua_rawsetp(L, -2, p->m);
  lua_pop(L, 1);
}

/* Push the Lua value of module m and return 1, or push nothing and return
** 0 when it has none (collected or closed). */
int l_findmodule(lua_State *L, gcap_module *m) {
  lua_getiuservalue(L, ENGINEIDX, EV_MODULES);
  if (lua_rawgetp(L, -1, m) == LUA_TUSERDATA && ((LModule *)lua_touserdata(L, -1))->m == m) {
    lua_remove(L, -2);
    return 1;
  }
  lua_pop(L, 2);
  return 0;
}

/* Push the Lua value of module m, making one (of the built-in class of its
** type, if any) for a module that has none. */
void l_pushmodule(lua_State *L, gcap_module *m) {
  LModule *p;
  if (l_findmodule(L, m)) return;
  lua_getiuservalue(L, ENGINEIDX, EV_CLASSES);
  lua_getfield(L, -1, gcap_module_type(m));
  p = l_newmodule(L, lua_istable(L, -1) ? -1 : 0);
  p->m = gcap_module_retain(m);
  lua_replace(L, -3);
  lua_pop(L, 1);
  l_keepmodule(L);
  l_adoptfields(L, -1);
}

/* Register a name of the module box at 'mi' as 'kind' and as a field whose
** value is on top (popped). */
static void l_setfield(lua_State *L, int mi, const char *name, const char *kind) {
  lua_getiuservalue(L, mi, MV_FIELDS);
  lua_pushvalue(L, -2);
  lua_setfield(L, -2, name);
  lua_pop(L, 2);
  lua_getiuservalue(L, mi, MV_REG);
  lua_pushstring(L, kind);
  lua_setfield(L, -2, name);
  lua_pop(L, 1);
}

/* Give the module box at i (one that the binding did not build field by
** field: a built-in) its own parameters, buffers and children as fields,
** as if they had been assigned. */
void l_adoptfields(lua_State *L, int i) {
  gcap_module *m = ((LModule *)lua_touserdata(L, i))->m;
  char name[256];
  int j, n;
  i = lua_absindex(L, i);
  n = gcap_module_num_parameters(m);
  for (j = 0; j < n; j++) {
    gcap_tensor *t = gcap_module_parameter(m, j, name, sizeof name);
    if (strchr(name, '.') != NULL) break; /* the children's come last */
    l_pushborrowed(L, t);
    l_setfield(L, i, name, "parameter");
  }
  n = gcap_module_num_buffers(m);
  for (j = 0; j < n; j++) {
    gcap_tensor *t = gcap_module_buffer(m, j, name, sizeof name);
    if (strchr(name, '.') != NULL) break;
    l_pushborrowed(L, t);
    l_setfield(L, i, name, "buffer");
  }
  n = gcap_module_num_children(m);
  for (j = 0; j < n; j++) {
    const char *cname;
    gcap_module *c = gcap_module_child(m, j, &cname);
    l_pushmodule(L, c);
    l_setfield(L, i, cname, "child");
  }
}

static void l_module_close(lua_State *L, void *box) {
  LModule *p = (LModule *)box;
  /* its hooks live in its uservalue: they go with it */
  if (lua_getiuservalue(L, 1, MV_HOOKS) == LUA_TTABLE) {
    lua_pushnil(L);
    while (lua_next(L, -2) != 0) {
      LHandle *h = (LHandle *)lua_touserdata(L, -1);
      if (h != NULL && h->m != NULL) {
        gcap_module_remove_hook(h->m, h->id);
        h->m = NULL;
      }
      lua_pop(L, 1);
    }
  }
  gcap_module_free(p->m);
  p->m = NULL;
}

static void l_module_describe(lua_State *L, void *box) {
  LModule *p = (LModule *)box;
  lua_pushstring(L, gcap_module_type(p->m));
}

static int l_module_isopen(const void *box) {
  return ((const LModule *)box)->m != NULL;
}

/*
** Push the arguments of a module's forward or forward-pre hooks: 'in' (nin
** tensors). In a direct call of the module, c->nargs Lua arguments of that
** call are at 2.. (after the context): those are pushed (non-tensor ones
** too), each tensor the same Lua value unless the core passes another
** tensor in its place.
*/
int l_pushargs(lua_State *L, const LCall *c, int nin, gcap_tensor *const *in) {
  int i;
  if (c->nargs > 0) {
    int k = 0;
    luaL_checkstack(L, c->nargs, "too many arguments");
    for (i = 0; i < c->nargs; i++) {
      LTensor *p = (LTensor *)luaL_testudata(L, 2 + i, TENSOR_MT);
      if (p != NULL && k < nin) {
        if (p->t == in[k])
          lua_pushvalue(L, 2 + i);
        else
          l_pushborrowed(L, in[k]);
        k++;
      } else
        lua_pushvalue(L, 2 + i);
    }
    return c->nargs;
  }
  luaL_checkstack(L, nin, "too many arguments");
  for (i = 0; i < nin; i++)
    l_pushborrowed(L, in[i]);
  return nin;
}

/* The outputs of a module call */
typedef struct LOuts {
  int n;
  gcap_tensor *t[GCAP_MAX_OUTPUTS];
  gcap_replay_opts opts; /* a graphed module's replay options */
  int hasopts;
} LOuts;

static gcap_status l_callmodule(const LRun *r, void *ud) {
  LOuts *o = (LOuts *)ud;
  return gcap_module_call_opts(r->m, o->hasopts ? &o->opts : NULL, r->nin, r->in, GCAP_MAX_OUTPUTS,
                               &o->n, o->t);
}

/* A graphed call's keyword is_first_microbatch (FP8 weight caching), in the
** keyword map at i (a table that is no tensor): taken out of it into *first
** (1, 0; -1 when absent), which the caller gives m's flag just before the
** call, so that an error in the arguments leaves no flag for the next call
** (entry: the entry's number from 0 for messages, -1 for a module's own
** call); the map goes when nothing else is in it. Returns how many
** arguments went (0 or 1). */
int l_takefirstmb(lua_State *L, int i, gcap_module *m, int entry, int *first) {
  int n = 0;
  *first = -1;
  if (lua_type(L, i) != LUA_TTABLE) return 0;
  if (lua_getfield(L, i, "is_first_microbatch") == LUA_TNIL) {
    lua_pop(L, 1);
    return 0;
  }
  if (!lua_isboolean(L, -1)) {
    if (entry >= 0)
      return l_error(L, "graphed call of entry %d: is_first_microbatch must be a boolean, got %s",
                     entry + 1, l_typename(L, -1));
    return l_error(L, "%s: is_first_microbatch must be a boolean, got %s", gcap_module_type(m),
                   l_typename(L, -1));
  }
  *first = lua_toboolean(L, -1);
  lua_pop(L, 1);
  lua_newtable(L); /* the map without it */
  lua_pushnil(L);
  while (lua_next(L, i) != 0) {
    if (lua_type(L, -2) == LUA_TSTRING && strcmp(lua_tostring(L, -2), "is_first_microbatch") == 0) {
      lua_pop(L, 1);
      continue;
    }
    lua_pushvalue(L, -2);
    lua_insert(L, -2);
    lua_rawset(L, -4);
    n++;
  }
  if (n > 0) {
    lua_replace(L, i);
    return 0;
  }
  lua_pop(L, 1);
  lua_remove(L, i);
  return 1;
}

/* m(...) (muted = 0) and, for built-ins, m:forward(...) (muted = 1) */
static int l_modcall(lua_State *L, int muted) {
  LModule *p = l_checkmodule(L, 1);
  gcap_module *m = p->m;
  int islua = (gcap_module_userdata(m) == lua_touserdata(L, ENGINEIDX));
  int i, nargs, nin = 0, first = -1;
  if (gcap_module_is_graphed(m) && lua_gettop(L) > 1)
    l_takefirstmb(L, lua_gettop(L), m, -1, &first);
  nargs = lua_gettop(L) - 1;
  gcap_tensor **in = l_inbuf(L, l_maxin(L, 1, nargs));
  LOuts o;
  LRun r = {.call = l_callmodule, .m = m, .in = in, .subject = m, .args = 2};
  for (i = 2; i <= nargs + 1; i++) {
    LTensor *t = (LTensor *)luaL_testudata(L, i, TENSOR_MT);
    if (t == NULL) {
      /* a Lua forward takes any value; the core, tensors and a keyword map, last */
      if (!islua && !(i == nargs + 1 && lua_type(L, i) == LUA_TTABLE &&
                      (l_takeskwargs(L, 1) || l_onlyreplaykeys(L, i))))
        return l_error(L, "%s: argument #%d must be a tensor, got %s", gcap_module_type(m), i - 1,
                       l_typename(L, i));
      continue;
    }
    if (t->t == NULL)
      return l_error(L, "%s: argument #%d is a closed tensor", gcap_module_type(m), i - 1);
    in[nin++] = t->t;
    l_keeptensor(L, i); /* children and hooks see this same value */
  }
  o.hasopts = l_replayopts(L, nargs > 0 ? nargs + 1 : 0, &o.opts, gcap_module_type(m));
  nin = l_flatkwargs(L, 1, nargs > 0 ? nargs + 1 : 0, in, nin, gcap_module_type(m));
  if (!islua) nin = l_builtinkwargs(L, 1, nargs > 0 ? nargs + 1 : 0, in, nin, gcap_module_type(m));
  lua_createtable(L, 0, 0); /* where its forward or hooks leave results other than one tensor */
  r.results = lua_gettop(L);
  o.n = 0;
  r.ud = &o;
  r.e = l_engine(L);
  r.nin = nin;
  r.nargs = nargs;
  r.muted = muted;
  if (first >= 0) gcap_module_set_is_first_microbatch(m, first);
  l_run(L, &r);
  if ((i = l_pushresults(L, r.results, o.n, o.t, gcap_module_type(m))) >= 0) return i;
  if (!islua && o.n == 1 && o.t[0] != NULL) { /* a built-in's one tensor: no structure */
    l_newtensor(L)->t = o.t[0];
    l_knownresult(L);
    return 1;
  }
  return l_pushouts(L, 1, o.n, o.t, "call");
}

static int l_module_call(lua_State *L) {
  return l_modcall(L, 0);
}

/* m:forward(...) of a built-in or of a class without forward (a class's
** own forward is found first, and called as a plain Lua function) */
int l_module_forward(lua_State *L) {
  return l_modcall(L, 1);
}

/* m.training, fields, then the class (its methods), then the methods of
** every module (upvalue 2) */
int l_module_index(lua_State *L) {
  LModule *p = (LModule *)luaL_checkudata(L, 1, MODULE_MT);
  lua_settop(L, 2);
  if (lua_type(L, 2) == LUA_TSTRING && strcmp(lua_tostring(L, 2), "training") == 0) {
    luaL_argcheck(L, p->m != NULL, 1, "module is closed");
    lua_pushboolean(L, gcap_module_training(p->m));
    return 1;
  }
  lua_getiuservalue(L, 1, MV_FIELDS);
  lua_pushvalue(L, 2);
  if (lua_rawget(L, -2) != LUA_TNIL) return 1;
  if (lua_getiuservalue(L, 1, MV_CLASS) == LUA_TTABLE) {
    lua_pushvalue(L, 2);
    if (lua_gettable(L, -2) != LUA_TNIL) return 1;
  }
  lua_pushvalue(L, 2);
  lua_rawget(L, lua_upvalueindex(2));
  return 1;
}

/* Is the tensor box at i one to register as a parameter? */
static int l_isparam(lua_State *L, int i, gcap_tensor *t) {
  int marked;
  if (gcap_tensor_requires_grad(t) && gcap_tensor_is_leaf(t)) return 1;
  lua_getiuservalue(L, ENGINEIDX, EV_PMARKS);
  lua_pushvalue(L, i);
  marked = (lua_rawget(L, -2) != LUA_TNIL);
  lua_pop(L, 2);
  return marked;
}

/*
** m.k = v: a module registers a child named k, a tensor that requires grad
** (a leaf) or that nn.Parameter marked registers a parameter, in the order
** of assignment; any value is kept as a field, read back as it is.
** Registered names cannot be reassigned (graphcap.h cannot unregister).
*/
int l_module_newindex(lua_State *L) {
  LModule *p = l_checkmodule(L, 1);
  const char *type = gcap_module_type(p->m);
  const char *kind = NULL;
  LModule *child = NULL;
  LTensor *t = NULL;
  gcap_status st;
  lua_settop(L, 3);
  if (lua_type(L, 2) == LUA_TSTRING && strcmp(lua_tostring(L, 2), "training") == 0)
    return l_error(L,
                   "%s: training cannot be assigned; use m:train(b) "
                   "or m:eval()",
                   type);
  lua_getiuservalue(L, 1, MV_REG);    /* 4 */
  lua_getiuservalue(L, 1, MV_FIELDS); /* 5 */
  lua_pushvalue(L, 2);
  if (lua_rawget(L, 4) != LUA_TNIL) { /* a registered name */
    lua_pushvalue(L, 2);
    lua_rawget(L, 5);
    if (lua_rawequal(L, -1, 3)) return 0; /* the same value again */
    return l_error(L,
                   "%s: '%s' is a registered %s and cannot be "
                   "reassigned",
                   type, lua_tostring(L, 2), lua_tostring(L, 6));
  }
  lua_pop(L, 1);
  if (luaL_testudata(L, 3, MODULE_MT) != NULL) {
    child = l_checkmodule(L, 3);
    kind = "child";
  } else if ((t = (LTensor *)luaL_testudata(L, 3, TENSOR_MT)) != NULL && t->t != NULL &&
             l_isparam(L, 3, t->t))
    kind = "parameter";
  if (kind != NULL && lua_type(L, 2) != LUA_TSTRING)
    return l_error(L, "%s: a %s needs a string name, got %s", type, kind, l_typename(L, 2));
  lua_pushvalue(L, 2);
  lua_pushvalue(L, 3);
  lua_rawset(L, 5);
  if (kind == NULL) return 0;
  lua_pushvalue(L, 2);
  lua_pushstring(L, kind);
  lua_rawset(L, 4);
  if (child != NULL)
    st = gcap_module_add_child(p->m, lua_tostring(L, 2), child->m);
  else {
    l_keeptensor(L, 3); /* m:parameters() gives this value */
    st = gcap_module_add_parameter(p->m, lua_tostring(L, 2), t->t);
  }
  if (st != GCAP_OK) { /* undo (no allocation: the keys exist) */
    lua_pushvalue(L, 2);
    lua_pushnil(L);
    lua_rawset(L, 4);
    lua_pushvalue(L, 2);
    lua_pushnil(L);
    lua_rawset(L, 5);
    l_check(L, l_engine(L), st, type);
  }
  return 0;
}

/* m:register_buffer(name, t [, persistent = true]) (the facade takes an
** options table) */
static int l_register_buffer(lua_State *L) {
  LModule *p = l_checkmodule(L, 1);
  const char *name = luaL_checkstring(L, 2);
  gcap_tensor *t = l_checktensor(L, 3);
  int persistent = lua_isnoneornil(L, 4) || lua_toboolean(L, 4);
  gcap_status st;
  lua_settop(L, 3);
  lua_getiuservalue(L, 1, MV_REG);    /* 4 */
  lua_getiuservalue(L, 1, MV_FIELDS); /* 5 */
  if (lua_getfield(L, 4, name) != LUA_TNIL)
    return l_error(L, "%s: '%s' is a registered %s already", gcap_module_type(p->m), name,
                   lua_tostring(L, -1));
  lua_pop(L, 1);
  lua_pushvalue(L, 3);
  lua_setfield(L, 5, name);
  lua_pushliteral(L, "buffer");
  lua_setfield(L, 4, name);
  st = gcap_module_add_buffer(p->m, name, t);
  if (st == GCAP_OK && !persistent) st = gcap_module_set_buffer_persistent(p->m, name, 0);
  if (st != GCAP_OK) {
    lua_pushnil(L);
    lua_setfield(L, 4, name);
    lua_pushnil(L);
    lua_setfield(L, 5, name);
    l_check(L, l_engine(L), st, "register_buffer");
  }
  l_keeptensor(L, 3);
  return 0;
}

/* m:parameters(), m:buffers() and their named_ forms: a sequence of
** tensors, or of {name, tensor} pairs, in the core's order */
static int l_tensorlist(lua_State *L, int buffers, int named) {
  gcap_module *m = l_checkmodule(L, 1)->m;
  char name[512];
  int i, n = buffers ? gcap_module_num_buffers(m) : gcap_module_num_parameters(m);
  lua_createtable(L, n, 0);
  for (i = 0; i < n; i++) {
    char *nm = named ? name : NULL;
    gcap_tensor *t = buffers ? gcap_module_buffer(m, i, nm, sizeof name)
                             : gcap_module_parameter(m, i, nm, sizeof name);
    if (named) {
      lua_createtable(L, 2, 0);
      lua_pushstring(L, name);
      lua_rawseti(L, -2, 1);
      l_pushborrowed(L, t);
      lua_rawseti(L, -2, 2);
    } else
      l_pushborrowed(L, t);
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

static int l_parameters(lua_State *L) {
  return l_tensorlist(L, 0, 0);
}
static int l_named_parameters(lua_State *L) {
  return l_tensorlist(L, 0, 1);
}
static int l_buffers(lua_State *L) {
  return l_tensorlist(L, 1, 0);
}
static int l_named_buffers(lua_State *L) {
  return l_tensorlist(L, 1, 1);
}

/* m:_persistent(name) -> whether m's own buffer 'name' is in its state
** dict (nil: m has no such buffer) */
static int l_buffer_persistent(lua_State *L) {
  int on = gcap_module_buffer_persistent(l_checkmodule(L, 1)->m, luaL_checkstring(L, 2));
  if (on < 0) return 0;
  lua_pushboolean(L, on);
  return 1;
}

static int l_childlist(lua_State *L, int named) {
  gcap_module *m = l_checkmodule(L, 1)->m;
  int i, n = gcap_module_num_children(m);
  lua_createtable(L, n, 0);
  for (i = 0; i < n; i++) {
    const char *name;
    gcap_module *c = gcap_module_child(m, i, &name);
    if (named) {
      lua_createtable(L, 2, 0);
      lua_pushstring(L, name);
      lua_rawseti(L, -2, 1);
      l_pushmodule(L, c);
      lua_rawseti(L, -2, 2);
    } else
      l_pushmodule(L, c);
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

static int l_children(lua_State *L) {
  return l_childlist(L, 0);
}
static int l_named_children(lua_State *L) {
  return l_childlist(L, 1);
}

/* m:train([b = true]) -> m */
static int l_train(lua_State *L) {
  LModule *p = l_checkmodule(L, 1);
  gcap_module_train(p->m, l_optboolean(L, 2, 1, "mode"));
  lua_settop(L, 1);
  return 1;
}

static int l_eval(lua_State *L) {
  gcap_module_train(l_checkmodule(L, 1)->m, 0);
  lua_settop(L, 1);
  return 1;
}

/* m:zero_grad([set_to_none = true]) (the facade takes an options table) */
static int l_module_zero_grad(lua_State *L) {
  LModule *p = l_checkmodule(L, 1);
  int none = lua_isnoneornil(L, 2) || lua_toboolean(L, 2);
  l_check(L, l_engine(L), gcap_module_zero_grad(p->m, none), "zero_grad");
  return 0;
}

/* m:to(dtype) -> m: parameters, grads and buffers converted in place */
static int l_module_to(lua_State *L) {
  LModule *p = l_checkmodule(L, 1);
  gcap_dtype dt;
  luaL_checkstring(L, 2);
  dt = l_optdtype(L, 2, "to");
  l_check(L, l_engine(L), gcap_module_to(p->m, dt), "to");
  lua_settop(L, 1);
  return 1;
}

static gcap_status l_callbackward_dw(const LRun *r, void *ud) {
  (void)ud;
  return gcap_module_backward_dw(r->m);
}

static int l_backward_dw(lua_State *L) {
  LRun r = {.call = l_callbackward_dw, .op = "backward_dw"};
  r.m = l_checkmodule(L, 1)->m;
  r.e = l_engine(L);
  l_run(L, &r);
  return 0;
}

/* m:_has_delayed_wgrad() -> whether m or a child is a delayed-wgrad Linear
** (gc.ddp reduces their grads after backward_dw) */
static int l_has_delayed_wgrad(lua_State *L) {
  lua_pushboolean(L, gcap_module_has_delayed_wgrad(l_checkmodule(L, 1)->m));
  return 1;
}

/* m:attention_stats() -> {impl = "cudnn" | "fused" | "composed", packed =
** bool, why = string or nil}, how attention module m ran its last call; nil
** before one, and for modules that run no attention */
static int l_attention_stats(lua_State *L) {
  gcap_attn_stats s;
  (void)gcap_module_attention_stats(l_checkmodule(L, 1)->m, &s);
  if (s.impl == NULL) return 0;
  lua_createtable(L, 0, 3);
  lua_pushstring(L, s.impl);
  lua_setfield(L, -2, "impl");
  lua_pushboolean(L, s.packed);
  lua_setfield(L, -2, "packed");
  if (s.why[0] != '\0') {
    lua_pushstring(L, s.why);
    lua_setfield(L, -2, "why");
  }
  return 1;
}

static int l_module_type(lua_State *L) {
  lua_pushstring(L, gcap_module_type(l_checkmodule(L, 1)->m));
  return 1;
}

static const luaL_Reg l_module_meta[] = {{"__call", l_module_call}, {NULL, NULL}};

static const luaL_Reg l_module_methods[] = {
    {"forward", l_module_forward},
    {"parameters", l_parameters},
    {"named_parameters", l_named_parameters},
    {"buffers", l_buffers},
    {"named_buffers", l_named_buffers},
    {"_persistent", l_buffer_persistent},
    {"children", l_children},
    {"named_children", l_named_children},
    {"register_buffer", l_register_buffer},
    {"train", l_train},
    {"eval", l_eval},
    {"zero_grad", l_module_zero_grad},
    {"to", l_module_to},
    {"backward_dw", l_backward_dw},
    {"_has_delayed_wgrad", l_has_delayed_wgrad},
    {"register_forward_pre_hook", l_register_forward_pre_hook},
    {"register_forward_hook", l_register_forward_hook},
    {"register_full_backward_pre_hook", l_register_full_backward_pre_hook},
    {"register_full_backward_hook", l_register_full_backward_hook},
    {"type", l_module_type},
    {"attention_stats", l_attention_stats},
    {NULL, NULL}};

LUAI_DDEF const LClass l_module_class = {"Module",          MODULE_MT,       "module is closed",
                                         "closed",          l_module_isopen, l_module_close,
                                         l_module_describe, l_module_meta,   l_module_methods};
