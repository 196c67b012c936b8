/*
** lhook.c: module hooks: registration, handles, and the call of a hook by
** the core.
*/

#include <limits.h>

#include "lbind.h"

/* A module hook, called by the core */
typedef struct LHookCall {
  LCall c;
  const LHandle *h;
  gcap_module *m;
  const gcap_hook_args *a;
} LHookCall;

/* Push " (hook defined at <source>:<line>)" of the hook function at fi. */
static const char *l_hookwhere(lua_State *L, int fi) {
  lua_Debug ar;
  lua_pushvalue(L, fi);
  lua_getinfo(L, ">S", &ar);
  return lua_pushfstring(L, " (hook defined at %s:%d)", ar.short_src, ar.linedefined);
}

/* Raise "<type>: a <kind> <msg> (hook defined at <where>)" about the hook
** function at fi. */
static int l_hookerror(lua_State *L, const LHookCall *c, int fi, const char *msg) {
  return l_error(L, "%s: a %s %s%s", gcap_module_type(c->m), gcap_hook_kind_name(c->a->kind), msg,
                 l_hookwhere(L, fi));
}

/* Raise the core's refusal (st) of what the hook at fi returned, its
** message without the "<type>: a <kind> " that l_hookerror puts back. */
static int l_refused(lua_State *L, const LHookCall *c, int fi, gcap_status st) {
  const char *msg = gcap_errmsg(c->h->le->e);
  const char *pre =
      lua_pushfstring(L, "%s: a %s ", gcap_module_type(c->m), gcap_hook_kind_name(c->a->kind));
  size_t k = strlen(pre);
  if (msg[0] == '\0')
    msg = lua_pushfstring(L, "could not return its values (%s)", gcap_status_str(st));
  else if (strncmp(msg, pre, k) == 0)
    msg += k;
  return l_hookerror(L, c, fi, lua_pushstring(L, msg));
}

/* The open tensor at i, else an error naming what the hook returned: the
** value (k = 0) or element #k of its sequence; `what`, what it may return.
** A nil element is NULL where `nils` (no grad). */
static gcap_tensor *l_rettensor(lua_State *L, const LHookCall *c, int fi, int i, int k,
                                const char *what, int nils) {
  LTensor *p = (LTensor *)luaL_testudata(L, i, TENSOR_MT);
  const char *got;
  if (p != NULL && p->t != NULL) {
    l_keeptensor(L, i); /* who is given it sees this same value */
    return p->t;
  }
  if (nils && k > 0 && lua_isnil(L, i)) return NULL;
  got = (p == NULL) ? l_typename(L, i) : "a closed tensor";
  l_hookerror(L, c, fi,
              k == 0 ? lua_pushfstring(L, "must return %s, got %s", what, got)
                     : lua_pushfstring(L, "must return %s, got %s as element #%d of its sequence",
                                       what, got, k));
  return NULL; /* not reached: l_hookerror raises */
}

/* The length of the table at i, a hook's return: its field n when it has
** one (so that trailing nils count), else its largest key. Any key but
** 1..length and n is an error naming it. */
static int l_retlength(lua_State *L, const LHookCall *c, int fi, int i, const char *what) {
  lua_Integer n = 0;
  int isnum, field = lua_getfield(L, i, "n") != LUA_TNIL;
  if (field) {
    n = lua_tointegerx(L, -1, &isnum);
    if (!isnum || n < 0 || n > INT_MAX)
      l_hookerror(L, c, fi,
                  lua_pushfstring(L, "must return %s, got a table whose n is %s", what,
                                  luaL_tolstring(L, -1, NULL)));
  }
  lua_pop(L, 1);
  lua_pushnil(L);
  while (lua_next(L, i)) {
    lua_Integer k;
    lua_pop(L, 1);
    if (lua_type(L, -1) == LUA_TSTRING && strcmp(lua_tostring(L, -1), "n") == 0 && field) continue;
    k = lua_tointegerx(L, -1, &isnum);
    if (lua_type(L, -1) != LUA_TNUMBER || !isnum || k < 1 || (field && k > n) || k > INT_MAX)
      l_hookerror(L, c, fi,
                  lua_pushfstring(L, "must return %s, got a table that is not a sequence (key %s)",
                                  what,
                                  lua_type(L, -1) == LUA_TSTRING
                                      ? lua_pushfstring(L, "'%s'", lua_tostring(L, -1))
                                      : luaL_tolstring(L, -1, NULL)));
    if (!field && k > n) n = k;
  }
  return (int)n;
}

/* What a forward pre-hook or backward hook at fi returned (the values from
** fi + 1 on): nothing or nil keeps the values; a tensor or a sequence of
** tensors (backward kinds: want grads, nil where none) goes to the core,
** which checks count, shape and dtype. A forward pre-hook's return is the
** call's new arguments: from then on the module's hooks and Lua forward get
** the core's tensors, not the call's Lua values. */
static void l_rettensors(lua_State *L, LHookCall *c, int fi, int want) {
  int nres = lua_gettop(L) - fi, nils = c->a->kind != GCAP_HOOK_FORWARD_PRE, n, i;
  int bw = c->a->kind == GCAP_HOOK_BACKWARD;
  const char *what = (!nils || want == 1) ? "a tensor, a sequence of tensors or nothing"
                                          : "a sequence of tensors (nil where none) or nothing";
  gcap_tensor **t;
  gcap_status st;
  if (nres == 0 || (nres == 1 && lua_isnil(L, fi + 1))) return;
  if (nres > 1)
    l_hookerror(L, c, fi, lua_pushfstring(L, "must return %s, got %d values", what, nres));
  if (lua_type(L, fi + 1) == LUA_TTABLE) {
    n = l_retlength(L, c, fi, fi + 1, what);
    if (nils && n != want) /* checked here too: n may be far too many to read */
      l_hookerror(L, c, fi,
                  lua_pushfstring(L, "must return %d %s%s (one per %s) or nothing, got %d", want,
                                  bw ? "grad_input" : "grad_output", want == 1 ? "" : "s",
                                  bw ? "input" : "tensor output", n));
    t = l_inbuf(L, n);
    for (i = 1; i <= n; i++) {
      lua_rawgeti(L, fi + 1, i);
      t[i - 1] = l_rettensor(L, c, fi, -1, i, what, nils);
      lua_pop(L, 1);
    }
  } else {
    n = 1;
    t = l_inbuf(L, 1);
    t[0] = l_rettensor(L, c, fi, fi + 1, 0, what, nils);
  }
  if ((st = gcap_hook_return(c->a, n, t)) != GCAP_OK) l_refused(L, c, fi, st);
  if (c->a->kind == GCAP_HOOK_FORWARD_PRE && c->h->le->cur != NULL && c->h->le->cur->m == c->m)
    c->h->le->cur->replaced = 1;
}

/* What a forward hook at fi returned: nothing or nil keeps the outputs;
** other values (tensors, nil, tables of them) are the call's results in
** their place, whole. rt: the call's results table (0: none), where they
** are kept for the caller. */
static void l_retoutputs(lua_State *L, LHookCall *c, int fi, int rt) {
  int nres = lua_gettop(L) - fi;
  gcap_status st;
  LFlat fl;
  if (nres == 0 || (nres == 1 && lua_isnil(L, fi + 1))) return;
  fl.out = l_inbuf(L, GCAP_MAX_OUTPUTS);
  fl.who = lua_pushfstring(L, "%s: a forward hook", gcap_module_type(c->m));
  fl.where = l_hookwhere(L, fi);
  l_flatresults(L, &fl, fi + 1, nres);
  if ((st = gcap_hook_return(c->a, fl.n, fl.out)) != GCAP_OK) l_refused(L, c, fi, st);
  if (rt != 0) l_keepresults(L, rt, fi + 1, nres, &fl);
}

/* Push the outputs a forward hook is given, returning their count: the
** results of the call's table rt (0: none) when the core's outputs are
** theirs (a Lua forward or a hook left them), else the outputs in the
** structure the module was graphed with in its mode (MV_OUTS of the module
** at mi), else as they come (nil where absent). */
static int l_pushoutputs(lua_State *L, const LHookCall *c, int rt, int mi) {
  const gcap_hook_args *a = c->a;
  int i, n, base;
  if (rt != 0 && lua_getfield(L, rt, "n") == LUA_TNUMBER && l_sameleaves(L, rt, a->nout, a->out)) {
    n = (int)lua_tointeger(L, -1);
    lua_pop(L, 1);
    luaL_checkstack(L, n, "too many outputs");
    for (i = 1; i <= n; i++)
      lua_rawgeti(L, rt, i);
    return n;
  }
  if (rt != 0) lua_pop(L, 1);
  luaL_checkstack(L, a->nout + 4, "too many outputs");
  base = lua_gettop(L) + 1;
  for (i = 0; i < a->nout; i++)
    if (a->out[i] != NULL)
      l_pushborrowed(L, a->out[i]);
    else
      lua_pushnil(L);
  if (l_getouts(L, mi) == LUA_TTABLE && lua_getfield(L, -1, "leaves") &&
      lua_tointeger(L, -1) == a->nout) {
    lua_pop(L, 1);
    return l_structure(L, lua_gettop(L), base, a->nout, "forward hook", gcap_module_type(c->m));
  }
  lua_settop(L, base + a->nout - 1);
  return a->nout;
}

/* Push n grads g[] as a hook is given them: one alone as itself (nil: no
** grad), several as a sequence with its field n (nil where none). */
static void l_pushgrads(lua_State *L, int n, gcap_tensor *const *g) {
  int i;
  if (n == 1) {
    if (g[0] != NULL)
      l_pushborrowed(L, g[0]);
    else
      lua_pushnil(L);
    return;
  }
  lua_createtable(L, n, 1);
  for (i = 0; i < n; i++)
    if (g[i] != NULL) {
      l_pushborrowed(L, g[i]);
      lua_rawseti(L, -2, i + 1);
    }
  lua_pushinteger(L, n);
  lua_setfield(L, -2, "n");
}

/* The protected part: f(module, ...) by kind */
int l_phook(lua_State *L) {
  LHookCall *c = (LHookCall *)lua_touserdata(L, 1);
  const gcap_hook_args *a = c->a;
  int rt = c->c.results ? 2 + c->c.nargs : 0, mi, fi, n = 1;
  if (!l_findmodule(L, c->m)) return 0; /* gone, and its hooks with it */
  mi = lua_gettop(L);
  lua_getiuservalue(L, mi, MV_HOOKS);
  if (lua_rawgeti(L, -1, c->h->key) != LUA_TUSERDATA) return 0;
  lua_getiuservalue(L, -1, HV_FN);
  fi = lua_gettop(L);
  lua_pushvalue(L, fi); /* the function stays at fi, for messages */
  lua_pushvalue(L, mi);
  switch (a->kind) {
    case GCAP_HOOK_FORWARD_PRE:
      n += l_pushargs(L, &c->c, a->nin, a->in);
      break;
    case GCAP_HOOK_FORWARD: {
      int i, k = l_pushargs(L, &c->c, a->nin, a->in);
      lua_createtable(L, k, 0); /* args_table */
      lua_insert(L, -(k + 1));
      for (i = k; i >= 1; i--)
        lua_rawseti(L, -(i + 1), i);
      n += 1 + l_pushoutputs(L, c, rt, mi);
      break;
    }
    case GCAP_HOOK_BACKWARD_PRE:
      l_pushgrads(L, a->ngrad_out, a->grad_out);
      n += 1;
      break;
    case GCAP_HOOK_BACKWARD:
      l_pushgrads(L, a->ngrad_in, a->grad_in);
      l_pushgrads(L, a->ngrad_out, a->grad_out);
      n += 2;
      break;
  }
  lua_call(L, n, LUA_MULTRET);
  switch (a->kind) {
    case GCAP_HOOK_FORWARD:
      l_retoutputs(L, c, fi, rt);
      break;
    case GCAP_HOOK_BACKWARD_PRE:
      l_rettensors(L, c, fi, a->ngrad_out);
      break;
    case GCAP_HOOK_BACKWARD:
      l_rettensors(L, c, fi, a->ngrad_in);
      break;
    default:
      l_rettensors(L, c, fi, 0);
      break;
  }
  return 0;
}

/* gcap_module_hook of every hook registered from Lua; ud is its LHandle */
static gcap_status l_hook(void *ud, gcap_module *m, const gcap_hook_args *a) {
  const LHandle *h = (const LHandle *)ud;
  const LFrame *f = h->le->cur;
  int fwd = (a->kind == GCAP_HOOK_FORWARD_PRE || a->kind == GCAP_HOOK_FORWARD);
  LHookCall c = {{0, a->kind == GCAP_HOOK_FORWARD}, h, m, a}; /* its outputs: the call's results */
  if (fwd && f != NULL && f->muted && f->m == m) return GCAP_OK; /* m:forward(...) */
  return l_callback(h->le, &l_hookkey, &c.c, fwd ? m : NULL);
}

/*
** m:register_..._hook(f) -> handle. The handle is kept in m's MV_HOOKS
** before the core knows it, so that nothing can raise while the core
** holds a hook the binding does not.
*/
static int l_register(lua_State *L, gcap_hook_kind kind) {
  LModule *p = l_checkmodule(L, 1);
  LHandle *h;
  int id;
  gcap_status st;
  luaL_checktype(L, 2, LUA_TFUNCTION);
  if (lua_gettop(L) > 3 || !lua_isnoneornil(L, 3)) /* not dropped without a word */
    return l_error(L,
                   "%s: a %s takes no options (PyTorch's prepend, with_kwargs, always_call are "
                   "not supported), got %s after the function",
                   gcap_module_type(p->m), gcap_hook_kind_name(kind), l_typename(L, 3));
  lua_settop(L, 2);
  h = (LHandle *)l_newbox(L, sizeof *h, NHV, HANDLE_MT); /* 3 */
  h->le = (LEngine *)lua_touserdata(L, ENGINEIDX);
  lua_pushvalue(L, 2);
  lua_setiuservalue(L, 3, HV_FN);
  lua_pushvalue(L, 1);
  lua_setiuservalue(L, 3, HV_MOD);
  h->key = ++p->nexthook;
  lua_getiuservalue(L, 1, MV_HOOKS); /* 4 */
  lua_pushvalue(L, 3);
  lua_rawseti(L, 4, h->key);
  st = gcap_module_register_hook(p->m, kind, l_hook, h, NULL, &id);
  if (st != GCAP_OK) {
    lua_pushnil(L);
    lua_rawseti(L, 4, h->key);
    l_check(L, l_engine(L), st, "register_hook");
  }
  h->m = p->m;
  h->id = id;
  lua_settop(L, 3);
  return 1;
}

int l_register_forward_pre_hook(lua_State *L) {
  return l_register(L, GCAP_HOOK_FORWARD_PRE);
}

int l_register_forward_hook(lua_State *L) {
  return l_register(L, GCAP_HOOK_FORWARD);
}

int l_register_full_backward_pre_hook(lua_State *L) {
  return l_register(L, GCAP_HOOK_BACKWARD_PRE);
}

int l_register_full_backward_hook(lua_State *L) {
  return l_register(L, GCAP_HOOK_BACKWARD);
}

/* handle:remove(), idempotent */
static int l_handle_remove(lua_State *L) {
  LHandle *h = (LHandle *)luaL_checkudata(L, 1, HANDLE_MT);
  if (h->m != NULL) {
    gcap_module_remove_hook(h->m, h->id);
    h->m = NULL;
    if (lua_getiuservalue(L, 1, HV_MOD) == LUA_TUSERDATA &&
        lua_getiuservalue(L, -1, MV_HOOKS) == LUA_TTABLE) {
      lua_pushnil(L);
      lua_rawseti(L, -2, h->key);
    }
  }
  return 0;
}

static void l_handle_describe(lua_State *L, void *box) {
  lua_pushfstring(L, HANDLE_MT "(%d)", ((LHandle *)box)->id);
}

static int l_handle_isopen(const void *box) {
  return ((const LHandle *)box)->m != NULL;
}

static const luaL_Reg l_handle_meta[] = {{NULL, NULL}};

static const luaL_Reg l_handle_methods[] = {{"remove", l_handle_remove}, {NULL, NULL}};

/* removed by remove() alone: no close */
LUAI_DDEF const LClass l_handle_class = {
    "HookHandle",      HANDLE_MT,     "hook handle is removed", "removed", l_handle_isopen, NULL,
    l_handle_describe, l_handle_meta, l_handle_methods};
