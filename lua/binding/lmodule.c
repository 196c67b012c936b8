/*
** lmodule.c: modules: boxes, fields, calls (a Lua forward called by the core),
** parameters, buffers and children.
*/

#include <stdio.h>
#include <string.h>

#include "lgc.h"

/*
** {======================================================
** Modules
** =======================================================
*/

static int l_module_forward(lua_State *L);

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

/* A Lua module's forward, called by the core */
typedef struct LFwdCall {
  LCall c;
  gcap_module *m;
  int nin;
  gcap_tensor *const *in;
  int *nout;
  gcap_tensor **out; /* room for GCAP_MAX_OUTPUTS */
  int graphing;      /* record the structure of the outputs (MV_OUTS) */
} LFwdCall;

/* A module graphed with sample_kwargs (MV_KWARGS: its sorted keys) called
** by the core gets its trailing tensors back as the kwargs map, as its Lua
** caller passed it. Returns the new argument count. */
static int l_packkwargs(lua_State *L, int mi, int n) {
  int nk, i;
  if (lua_getiuservalue(L, mi, MV_KWARGS) != LUA_TTABLE) {
    lua_pop(L, 1);
    return n;
  }
  nk = (int)lua_rawlen(L, -1); /* keys */
  if (nk == 0 || nk > n) {
    lua_pop(L, 1);
    return n;
  }
  lua_createtable(L, 0, nk); /* map */
  for (i = nk; i >= 1; i--) {
    lua_rawgeti(L, -2, i);                 /* key */
    lua_pushvalue(L, -(3 + (nk - i) + 1)); /* the i-th trailing tensor */
    lua_settable(L, -3);
  }
  lua_replace(L, -(nk + 2)); /* the map where the first kwarg tensor was */
  lua_pop(L, nk);            /* keys and the other kwarg tensors */
  return n - nk + 1;
}

/*
** The results of a Lua forward cross to the core as its outputs: every
** tensor (a leaf), in order, a nil result as an absent output, and the
** tensors inside tables (sequences and maps, nested), table by table. The
** structure is a template: the results with each tensor replaced by its
** output number, and n (the count of results) and leaves (of outputs) set;
** a forward that returns one tensor has none.
*/

/* Flatten the value at i (a result when top, else a table's value) into
** c->out (borrowed: references are taken once all is checked); push its
** template. */
static void l_flatten(lua_State *L, LFwdCall *c, int i, int top, int depth, const char *type) {
  LTensor *t = (LTensor *)luaL_testudata(L, i, TENSOR_MT);
  luaL_checkstack(L, 4, "results too deep");
  if (t != NULL || (top && lua_isnil(L, i))) {
    if (*c->nout == GCAP_MAX_OUTPUTS)
      l_error(L, "%s:forward returned more than %d tensors", type, GCAP_MAX_OUTPUTS);
    if (t != NULL && t->t == NULL) l_error(L, "%s:forward returned a closed tensor", type);
    if (t != NULL) l_keeptensor(L, i); /* a replay gives this same value back */
    c->out[(*c->nout)++] = t ? t->t : NULL;
    lua_pushinteger(L, *c->nout);
  } else if (lua_type(L, i) == LUA_TTABLE) {
    if (depth > 16) l_error(L, "%s:forward returned tables nested deeper than 16", type);
    lua_newtable(L);
    lua_pushnil(L);
    while (lua_next(L, i) != 0) {
      if (lua_type(L, -2) != LUA_TSTRING && !lua_isinteger(L, -2))
        l_error(L, "%s:forward returned a table with a %s key (keys are strings or integers)", type,
                l_typename(L, -2));
      l_flatten(L, c, lua_gettop(L), 0, depth + 1, type);
      lua_pushvalue(L, -3); /* key */
      lua_insert(L, -2);
      lua_rawset(L, -5);
      lua_pop(L, 1); /* the value */
    }
  } else
    l_error(L, "%s:forward must return tensors, nil or tables of them, got %s", type,
            l_typename(L, i));
}

/* The results of m's forward at fi..fi+n-1 (not one tensor) as outputs:
** flattened, their references taken; the template on top. */
static void l_flatresults(lua_State *L, LFwdCall *c, int fi, int n, const char *type) {
  int i;
  *c->nout = 0;
  lua_createtable(L, n, 2);
  for (i = 0; i < n; i++) {
    l_flatten(L, c, fi + i, 1, 0, type);
    lua_rawseti(L, -2, i + 1);
  }
  lua_pushinteger(L, n);
  lua_setfield(L, -2, "n");
  lua_pushinteger(L, *c->nout);
  lua_setfield(L, -2, "leaves");
  for (i = 0; i < *c->nout; i++)
    gcap_tensor_retain(c->out[i]);
}

/* The protected part: Class.forward(self, args...), its results into the
** core's outputs; a direct call m(...) also gets them as they are (its
** results table, c->c.results, follows the arguments), and under
** make_graphed_callables the module keeps their structure (MV_OUTS) */
int l_pforward(lua_State *L) {
  LFwdCall *c = (LFwdCall *)lua_touserdata(L, 1);
  const char *type = gcap_module_type(c->m);
  int mi, fi, n, rt = c->c.results ? 2 + c->c.nargs : 0;
  LTensor *r;
  if (!l_findmodule(L, c->m))
    return l_error(L, "%s: the module's Lua value was closed or collected", type);
  mi = lua_gettop(L);
  if (lua_getfield(L, mi, "forward") != LUA_TFUNCTION /* its class's */
      || lua_tocfunction(L, -1) == l_module_forward)
    return l_error(L, "%s:forward is not defined", type);
  fi = lua_gettop(L);
  lua_pushvalue(L, mi);
  n = l_pushargs(L, &c->c, c->nin, c->in);
  if (c->c.nargs == 0) n = l_packkwargs(L, mi, n);
  lua_call(L, n + 1, LUA_MULTRET);
  n = lua_gettop(L) - fi + 1; /* results */
  r = (n == 1) ? (LTensor *)luaL_testudata(L, fi, TENSOR_MT) : NULL;
  if (r != NULL) { /* one tensor */
    if (r->t == NULL) return l_error(L, "%s:forward returned a closed tensor", type);
    l_keeptensor(L, fi); /* m(...) returns this same value */
    lua_pushnil(L);      /* no structure */
    c->out[0] = gcap_tensor_retain(r->t);
    *c->nout = 1;
  } else {
    int i;
    l_flatresults(L, c, fi, n, type);
    for (i = 0; rt != 0 && i < n; i++) { /* m(...) returns them as they are */
      lua_pushvalue(L, fi + i);
      lua_rawseti(L, rt, i + 1);
    }
    if (rt != 0) {
      lua_pushinteger(L, n);
      lua_setfield(L, rt, "n");
    }
  }
  if (c->graphing) lua_setiuservalue(L, mi, MV_OUTS);
  return 0;
}

/* gcap_forward_n_fn of Lua modules; ud is the engine box's LEngine */
gcap_status l_lua_forward(void *ud, gcap_module *m, int nin, gcap_tensor *const *in, int *nout,
                          gcap_tensor **out) {
  LEngine *le = (LEngine *)ud;
  LFwdCall c = {{0, 1}, m, nin, in, nout, out, le->cur != NULL && le->cur->graphing};
  gcap_status st;
  *nout = 0;
  if ((st = l_callback(le, &l_fwdkey, &c.c, m)) != GCAP_OK) *nout = 0; /* none taken */
  return st;
}

/* Push the copy of template value i with each output number k replaced by
** the value at base + k - 1. */
static void l_unflatten(lua_State *L, int i, int base) {
  luaL_checkstack(L, 4, "outputs too deep");
  if (lua_isinteger(L, i)) {
    lua_pushvalue(L, base + (int)lua_tointeger(L, i) - 1);
    return;
  }
  if (lua_type(L, i) != LUA_TTABLE) {
    lua_pushnil(L);
    return;
  }
  lua_newtable(L);
  lua_pushnil(L);
  while (lua_next(L, i) != 0) {
    l_unflatten(L, lua_gettop(L), base);
    lua_pushvalue(L, -3); /* key */
    lua_insert(L, -2);
    lua_rawset(L, -5);
    lua_pop(L, 1);
  }
}

/* When the Lua forward of a call left its results in the call's results
** table rt (it ran eagerly), push them and return their count, dropping the
** core's n outputs t[]; else return -1. */
int l_pushresults(lua_State *L, int rt, int n, gcap_tensor **t) {
  int i, nres;
  if (lua_getfield(L, rt, "n") != LUA_TNUMBER) {
    lua_pop(L, 1);
    return -1;
  }
  nres = (int)lua_tointeger(L, -1);
  lua_pop(L, 1);
  for (i = 0; i < n; i++)
    gcap_tensor_free(t[i]);
  luaL_checkstack(L, nres, "too many results");
  for (i = 1; i <= nres; i++)
    lua_rawgeti(L, rt, i);
  return nres;
}

/*
** Push the n outputs t[] of a call of the module at mi (references, taken
** over) as Lua values: in the structure its forward returned when it was
** graphed (MV_OUTS), else as they come (nil where absent). Returns the
** count of values pushed. 'what' names the call in an error.
*/
int l_pushouts(lua_State *L, int mi, int n, gcap_tensor **t, const char *what) {
  int i, base, tmpl, nres;
  luaL_checkstack(L, n + 4, "too many outputs");
  base = lua_gettop(L) + 1;
  for (i = 0; i < n; i++) {
    if (t[i] == NULL) {
      lua_pushnil(L);
      continue;
    }
    l_newtensor(L)->t = t[i];
    l_knownresult(L);
  }
  if (lua_getiuservalue(L, mi, MV_OUTS) != LUA_TTABLE) {
    lua_pop(L, 1);
    return n;
  }
  tmpl = lua_gettop(L);
  lua_getfield(L, tmpl, "leaves");
  if (lua_tointeger(L, -1) != n)
    return l_error(L, "%s: %s gave %d outputs, but %d when it was graphed", what,
                   gcap_module_type(((LModule *)lua_touserdata(L, mi))->m), n,
                   (int)lua_tointeger(L, -1));
  lua_getfield(L, tmpl, "n");
  nres = (int)lua_tointeger(L, -1);
  lua_pop(L, 2);
  luaL_checkstack(L, nres + 4, "too many outputs");
  for (i = 1; i <= nres; i++) {
    lua_rawgeti(L, tmpl, i);
    l_unflatten(L, lua_gettop(L), base);
    lua_remove(L, -2);
  }
  /* the results in place of the outputs */
  for (i = 0; i < nres; i++)
    lua_copy(L, tmpl + 1 + i, base + i);
  lua_settop(L, base + nres - 1);
  return nres;
}

/* How many tensors a call of the module at mi passes, with n arguments:
** n, plus its kwargs when it was graphed with sample_kwargs. */
int l_maxin(lua_State *L, int mi, int n) {
  if (lua_getiuservalue(L, mi, MV_KWARGS) == LUA_TTABLE) n += (int)lua_rawlen(L, -1);
  lua_pop(L, 1);
  return n;
}

/* Room for n tensor pointers, on the stack (collected with the call) */
gcap_tensor **l_inbuf(lua_State *L, int n) {
  return (gcap_tensor **)lua_newuserdatauv(L, sizeof(gcap_tensor *) * (size_t)(n + 1), 0);
}

/* A module graphed with sample_kwargs: the kwargs map (its last argument)
** adds its tensors to in[] (room from l_maxin), in the sample's sorted key
** order. */
int l_flatkwargs(lua_State *L, int mi, int kwi, gcap_tensor **in, int nin, const char *type) {
  int nk, i;
  if (lua_getiuservalue(L, mi, MV_KWARGS) != LUA_TTABLE) {
    lua_pop(L, 1);
    return nin;
  }
  if (kwi == 0 || lua_type(L, kwi) != LUA_TTABLE || luaL_testudata(L, kwi, TENSOR_MT))
    l_error(L, "%s was graphed with sample_kwargs: pass them as a table, its last argument", type);
  nk = (int)lua_rawlen(L, -1);
  for (i = 1; i <= nk; i++) {
    LTensor *t;
    lua_rawgeti(L, -1, i);
    lua_pushvalue(L, -1);
    lua_rawget(L, kwi); /* raw: no Lua code runs while in[] fills */
    t = (LTensor *)luaL_testudata(L, -1, TENSOR_MT);
    if (t == NULL || t->t == NULL)
      return l_error(L,
                     "%s was graphed with kwarg '%s', but it was not given "
                     "(as a tensor) in this call",
                     type, lua_tostring(L, -2));
    in[nin++] = t->t;
    lua_pop(L, 2);
  }
  lua_pop(L, 1);
  return nin;
}

/* The outputs of a module call */
typedef struct LOuts {
  int n;
  gcap_tensor *t[GCAP_MAX_OUTPUTS];
} LOuts;

static gcap_status l_callmodule(const LRun *r, void *ud) {
  LOuts *o = (LOuts *)ud;
  return gcap_module_call_n(r->m, r->nin, r->in, GCAP_MAX_OUTPUTS, &o->n, o->t);
}

/* m(...) (muted = 0) and, for built-ins, m:forward(...) (muted = 1) */
static int l_modcall(lua_State *L, int muted) {
  LModule *p = l_checkmodule(L, 1);
  gcap_module *m = p->m;
  int islua = (gcap_module_userdata(m) == lua_touserdata(L, ENGINEIDX));
  int i, nargs = lua_gettop(L) - 1, nin = 0;
  gcap_tensor **in = l_inbuf(L, l_maxin(L, 1, nargs));
  LOuts o;
  LRun r = {.call = l_callmodule, .m = m, .in = in, .subject = m, .args = 2};
  for (i = 2; i <= nargs + 1; i++) {
    LTensor *t = (LTensor *)luaL_testudata(L, i, TENSOR_MT);
    if (t == NULL) {
      if (!islua) /* a Lua forward takes any value; the core, tensors */
        return l_error(L, "%s: argument #%d must be a tensor, got %s", gcap_module_type(m), i - 1,
                       l_typename(L, i));
      continue;
    }
    luaL_argcheck(L, t->t != NULL, i, "tensor is closed");
    in[nin++] = t->t;
    l_keeptensor(L, i); /* children and hooks see this same value */
  }
  nin = l_flatkwargs(L, 1, nargs > 0 ? nargs + 1 : 0, in, nin, gcap_module_type(m));
  if (islua) { /* where its forward leaves results other than one tensor */
    lua_createtable(L, 0, 0);
    r.results = lua_gettop(L);
  }
  o.n = 0;
  r.ud = &o;
  r.e = l_engine(L);
  r.nin = nin;
  r.nargs = nargs;
  r.muted = muted;
  l_run(L, &r);
  if (islua && (i = l_pushresults(L, r.results, o.n, o.t)) >= 0) return i;
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
static int l_module_forward(lua_State *L) {
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

/* m:register_buffer(name, t) */
static int l_register_buffer(lua_State *L) {
  LModule *p = l_checkmodule(L, 1);
  const char *name = luaL_checkstring(L, 2);
  gcap_tensor *t = l_checktensor(L, 3);
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
    {"children", l_children},
    {"named_children", l_named_children},
    {"register_buffer", l_register_buffer},
    {"train", l_train},
    {"eval", l_eval},
    {"zero_grad", l_module_zero_grad},
    {"to", l_module_to},
    {"backward_dw", l_backward_dw},
    {"register_forward_pre_hook", l_register_forward_pre_hook},
    {"register_forward_hook", l_register_forward_hook},
    {"register_full_backward_pre_hook", l_register_full_backward_pre_hook},
    {"register_full_backward_hook", l_register_full_backward_hook},
    {"type", l_module_type},
    {NULL, NULL}};

LUAI_DDEF const LClass l_module_class = {"Module",          MODULE_MT,       "module is closed",
                                         "closed",          l_module_isopen, l_module_close,
                                         l_module_describe, l_module_meta,   l_module_methods};
