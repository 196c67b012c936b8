/*
** lforward.c: a Lua module's forward as the core calls it, and what crosses
** with it: the kwargs map rebuilt from trailing tensors, and the results
** flattened into the core's outputs (their structure kept for replays and
** rebuilt around the outputs of a call).
*/

#include <stdio.h>
#include <string.h>

#include "lbind.h"

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
** The results of a Lua forward (or of a forward hook) cross to the core as
** its outputs: every tensor (a leaf), in order, a nil result as an absent
** output, and the tensors inside tables (sequences and maps, nested), table
** by table, the keys of each in sorted order (integers ascending, then
** strings), as kwargs are. The structure is a template: the results with
** each tensor replaced by its output number, and n (the count of results)
** and leaves (of outputs) set; one tensor alone has none.
*/

/* Push the keys of the table at i in sorted order, as a sequence; a key
** other than a string or an integer is an error naming fl. */
static void l_sortedkeys(lua_State *L, const LFlat *fl, int i) {
  int n = 0, j, k;
  lua_newtable(L);
  lua_pushnil(L);
  while (lua_next(L, i) != 0) {
    lua_pop(L, 1);
    if (lua_type(L, -1) != LUA_TSTRING && !lua_isinteger(L, -1))
      l_error(L, "%s returned a table with a %s key (keys are strings or integers)%s", fl->who,
              l_typename(L, -1), fl->where);
    lua_pushvalue(L, -1);
    lua_rawseti(L, -3, ++n);
  }
  /* insertion sort: integers before strings, each in its own order */
  for (j = 2; j <= n; j++) {
    lua_rawgeti(L, -1, j);
    for (k = j - 1; k >= 1; k--) {
      int before;
      lua_rawgeti(L, -2, k);
      if (lua_type(L, -1) != lua_type(L, -2))
        before = lua_type(L, -2) == LUA_TNUMBER; /* the new key is an integer: it goes first */
      else
        before = lua_compare(L, -2, -1, LUA_OPLT);
      if (!before) {
        lua_pop(L, 1);
        break;
      }
      lua_rawseti(L, -3, k + 1);
    }
    lua_rawseti(L, -2, k + 1);
  }
}

/* Flatten the value at i (a result when top, else a table's value) into
** fl->out (borrowed: references are taken once all is checked); push its
** template. */
static void l_flatten(lua_State *L, LFlat *fl, int i, int top, int depth) {
  LTensor *t = (LTensor *)luaL_testudata(L, i, TENSOR_MT);
  luaL_checkstack(L, 6, "results too deep");
  if (t != NULL || (top && lua_isnil(L, i))) {
    if (fl->n == GCAP_MAX_OUTPUTS)
      l_error(L, "%s returned more than %d tensors%s", fl->who, GCAP_MAX_OUTPUTS, fl->where);
    if (t != NULL && t->t == NULL) l_error(L, "%s returned a closed tensor%s", fl->who, fl->where);
    if (t != NULL) l_keeptensor(L, i); /* a replay gives this same value back */
    fl->out[fl->n++] = t ? t->t : NULL;
    lua_pushinteger(L, fl->n);
  } else if (lua_type(L, i) == LUA_TTABLE) {
    int k, nk, keys;
    if (depth > 16) l_error(L, "%s returned tables nested deeper than 16%s", fl->who, fl->where);
    l_sortedkeys(L, fl, i);
    keys = lua_gettop(L);
    nk = (int)lua_rawlen(L, keys);
    lua_newtable(L);
    for (k = 1; k <= nk; k++) {
      lua_rawgeti(L, keys, k);
      lua_pushvalue(L, -1);
      lua_rawget(L, i);
      l_flatten(L, fl, lua_gettop(L), 0, depth + 1);
      lua_remove(L, -2); /* the value */
      lua_rawset(L, -3);
    }
    lua_remove(L, keys);
  } else
    l_error(L, "%s must return tensors, nil or tables of them, got %s%s", fl->who, l_typename(L, i),
            fl->where);
}

/* Flatten the n results at fi.. into fl (no references taken); push their
** template. */
void l_flatresults(lua_State *L, LFlat *fl, int fi, int n) {
  int i;
  fl->n = 0;
  lua_createtable(L, n, 2);
  for (i = 0; i < n; i++) {
    l_flatten(L, fl, fi + i, 1, 0);
    lua_rawseti(L, -2, i + 1);
  }
  lua_pushinteger(L, n);
  lua_setfield(L, -2, "n");
  lua_pushinteger(L, fl->n);
  lua_setfield(L, -2, "leaves");
}

/* Keep in a call's results table rt the n results at fi.., flattened into
** fl, with their template (on top): n, tmpl, and leaves (the outputs'
** addresses, false where absent) to tell whether the core's outputs are
** still theirs. */
void l_keepresults(lua_State *L, int rt, int fi, int n, const LFlat *fl) {
  int i, old;
  lua_getfield(L, rt, "n");
  old = (int)lua_tointeger(L, -1);
  lua_pop(L, 1);
  for (i = 1; i <= old; i++) { /* a forward hook's results replace the forward's */
    lua_pushnil(L);
    lua_rawseti(L, rt, i);
  }
  for (i = 0; i < n; i++) {
    lua_pushvalue(L, fi + i);
    lua_rawseti(L, rt, i + 1);
  }
  lua_pushinteger(L, n);
  lua_setfield(L, rt, "n");
  lua_pushvalue(L, -1); /* the template */
  lua_setfield(L, rt, "tmpl");
  lua_createtable(L, fl->n, 0);
  for (i = 0; i < fl->n; i++) {
    if (fl->out[i] != NULL)
      lua_pushlightuserdata(L, fl->out[i]);
    else
      lua_pushboolean(L, 0);
    lua_rawseti(L, -2, i + 1);
  }
  lua_setfield(L, rt, "leaves");
}

/* The structure at the top of the stack (popped) becomes that of the
** outputs of the module at mi graphed in its current mode. */
static void l_setouts(lua_State *L, int mi) {
  if (lua_getiuservalue(L, mi, MV_OUTS) != LUA_TTABLE) {
    lua_pop(L, 1);
    lua_createtable(L, 0, 2);
    lua_pushvalue(L, -1);
    lua_setiuservalue(L, mi, MV_OUTS);
  }
  lua_pushboolean(L, gcap_module_training(((LModule *)lua_touserdata(L, mi))->m));
  lua_pushvalue(L, -3);
  lua_rawset(L, -3);
  lua_pop(L, 2);
}

/* Push the structure of the outputs of the module at mi as graphed in its
** current mode, the one its replays give, or nil; returns its type. */
int l_getouts(lua_State *L, int mi) {
  if (lua_getiuservalue(L, mi, MV_OUTS) != LUA_TTABLE) return lua_type(L, -1);
  lua_pushboolean(L, gcap_module_training(((LModule *)lua_touserdata(L, mi))->m));
  lua_rawget(L, -2);
  lua_remove(L, -2);
  return lua_type(L, -1);
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
    LFlat fl;
    int i;
    fl.out = c->out;
    fl.where = "";
    fl.who = lua_pushfstring(L, "%s:forward", type); /* on the stack while in use */
    l_flatresults(L, &fl, fi, n);
    if (rt != 0) l_keepresults(L, rt, fi, n, &fl); /* m(...) returns them as they are */
    if (c->graphing) l_setouts(L, mi);
    for (i = 0; i < fl.n; i++) /* nothing raises from here on */
      gcap_tensor_retain(c->out[i]);
    *c->nout = fl.n;
    return 0;
  }
  if (c->graphing) l_setouts(L, mi);
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

/* The n values at base.. (outputs) in the structure of the template at
** tmpl: replaced by the results, whose count it returns. 'what' and 'type'
** name the call in an error. */
int l_structure(lua_State *L, int tmpl, int base, int n, const char *what, const char *type) {
  int i, nres;
  lua_getfield(L, tmpl, "leaves");
  if (lua_tointeger(L, -1) != n)
    return l_error(L, "%s: %s gave %d outputs, but %d when it was graphed", what, type, n,
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
    lua_copy(L, lua_gettop(L) - nres + 1 + i, base + i);
  lua_settop(L, base + nres - 1);
  return nres;
}

/* Push the n outputs t[] (references, taken over), nil where absent. */
static void l_pushowned(lua_State *L, int n, gcap_tensor **t) {
  int i;
  luaL_checkstack(L, n + 4, "too many outputs");
  for (i = 0; i < n; i++) {
    if (t[i] == NULL) {
      lua_pushnil(L);
      continue;
    }
    l_newtensor(L)->t = t[i];
    l_knownresult(L);
  }
}

/* Are the core's n outputs t[] those of the results table rt (its leaves)? */
int l_sameleaves(lua_State *L, int rt, int n, gcap_tensor *const *t) {
  int i, same = 1;
  lua_getfield(L, rt, "leaves");
  for (i = 0; same && i < n; i++) {
    lua_rawgeti(L, -1, i + 1);
    same = lua_touserdata(L, -1) == (void *)t[i];
    lua_pop(L, 1);
  }
  same = same && lua_rawlen(L, -1) == (lua_Unsigned)n;
  lua_pop(L, 1);
  return same;
}

/* When a call's Lua forward or forward hooks left results other than one
** tensor in the call's results table rt, push them and return their
** count: as they are when the core's n outputs t[] (references, taken over)
** are theirs, else (backward hooks put aliases in their place) the outputs
** in their structure; return -1 when rt holds none. */
int l_pushresults(lua_State *L, int rt, int n, gcap_tensor **t, const char *type) {
  int i, nres, base;
  if (lua_getfield(L, rt, "n") != LUA_TNUMBER) {
    lua_pop(L, 1);
    return -1;
  }
  nres = (int)lua_tointeger(L, -1);
  lua_pop(L, 1);
  if (!l_sameleaves(L, rt, n, t)) {
    base = lua_gettop(L) + 1;
    l_pushowned(L, n, t);
    lua_getfield(L, rt, "tmpl");
    return l_structure(L, lua_gettop(L), base, n, "call", type);
  }
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
** graphed in its current mode (MV_OUTS), else as they come (nil where
** absent). Returns the count of values pushed. 'what' names the call in an
** error.
*/
int l_pushouts(lua_State *L, int mi, int n, gcap_tensor **t, const char *what) {
  int base = lua_gettop(L) + 1;
  l_pushowned(L, n, t);
  if (l_getouts(L, mi) != LUA_TTABLE) {
    lua_pop(L, 1);
    return n;
  }
  return l_structure(L, lua_gettop(L), base, n, what,
                     gcap_module_type(((LModule *)lua_touserdata(L, mi))->m));
}

/* Push the keyword names the class of the built-in module at mi declares
** (its `kwargs`: the tensors its forward takes after the positional ones,
** in order); returns 0 with nothing pushed when it declares none. */
static int l_classkwargs(lua_State *L, int mi) {
  if (lua_getiuservalue(L, mi, MV_CLASS) == LUA_TTABLE) {
    lua_pushliteral(L, "kwargs");
    if (lua_rawget(L, -2) == LUA_TTABLE) {
      lua_remove(L, -2);
      return 1;
    }
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  return 0;
}

/* How many tensors a call of the module at mi passes, with n arguments:
** n, plus its kwargs when it was graphed with sample_kwargs, or those its
** class declares. */
int l_maxin(lua_State *L, int mi, int n) {
  if (lua_getiuservalue(L, mi, MV_KWARGS) == LUA_TTABLE) {
    n += (int)lua_rawlen(L, -1);
  } else if (l_classkwargs(L, mi)) {
    n += (int)lua_rawlen(L, -1);
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  return n;
}

/* 1 when the built-in module at mi takes a keyword map: it was graphed
** with sample_kwargs, or its class declares keyword names. */
int l_takeskwargs(lua_State *L, int mi) {
  int r = lua_getiuservalue(L, mi, MV_KWARGS) == LUA_TTABLE;
  lua_pop(L, 1);
  if (!r && (r = l_classkwargs(L, mi))) lua_pop(L, 1);
  return r;
}

/* A built-in module not graphed with sample_kwargs, whose class declares
** keyword names: the map at kwi (0: none) adds their tensors to in[] (room
** from l_maxin) in the declared order, up to the first name it lacks; a
** later name given, a value that is no tensor, or a key not declared is an
** error naming it. */
int l_builtinkwargs(lua_State *L, int mi, int kwi, gcap_tensor **in, int nin, const char *type) {
  int nk, i, end = 0;
  int graphed;
  if (kwi == 0 || lua_type(L, kwi) != LUA_TTABLE || luaL_testudata(L, kwi, TENSOR_MT)) return nin;
  graphed = lua_getiuservalue(L, mi, MV_KWARGS) == LUA_TTABLE;
  lua_pop(L, 1);
  if (graphed || !l_classkwargs(L, mi)) return nin; /* (l_flatkwargs took a graphed one's map) */
  nk = (int)lua_rawlen(L, -1);
  for (i = 1; i <= nk; i++) {
    LTensor *t;
    lua_rawgeti(L, -1, i);
    lua_pushvalue(L, -1);
    lua_rawget(L, kwi);
    t = (LTensor *)luaL_testudata(L, -1, TENSOR_MT);
    if (!lua_isnil(L, -1) && (t == NULL || t->t == NULL))
      return l_error(L, "%s: keyword argument '%s' must be a tensor, got %s", type,
                     lua_tostring(L, -2), t ? "a closed tensor" : l_typename(L, -1));
    if (t != NULL && end)
      return l_error(L, "%s: keyword argument '%s' is given without the ones before it", type,
                     lua_tostring(L, -2));
    if (t == NULL)
      end = 1;
    else
      in[nin++] = t->t;
    lua_pop(L, 2);
  }
  lua_pushnil(L);
  while (lua_next(L, kwi) != 0) { /* every key must be declared (or be a replay option) */
    int known = l_isreplaykey(L, -2);
    lua_pop(L, 1);
    for (i = 1; !known && i <= nk && lua_type(L, -1) == LUA_TSTRING; i++) {
      lua_rawgeti(L, -2, i);
      known = lua_rawequal(L, -1, -2);
      lua_pop(L, 1);
    }
    if (!known)
      return l_error(L, "%s: unknown keyword argument %s", type,
                     lua_type(L, -1) == LUA_TSTRING
                         ? lua_pushfstring(L, "'%s'", lua_tostring(L, -1))
                         : l_typename(L, -1));
  }
  lua_pop(L, 1);
  return nin;
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
