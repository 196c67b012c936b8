/*
** lhook.c: module hooks: registration, handles, and the call of a hook by
** the core.
*/

#include "lgc.h"

/* A module hook, called by the core */
typedef struct LHookCall {
  LCall c;
  const LHandle *h;
  gcap_module *m;
  const gcap_hook_args *a;
} LHookCall;

/* Raise "<type>: a <kind> <msg> (hook defined at <where>)" about the hook
** function at fi. */
static int l_hookerror(lua_State *L, const LHookCall *c, int fi, const char *msg) {
  lua_Debug ar;
  lua_pushvalue(L, fi);
  lua_getinfo(L, ">S", &ar);
  return l_error(L, "%s: a %s %s (hook defined at %s:%d)", gcap_module_type(c->m),
                 gcap_hook_kind_name(c->a->kind), msg, ar.short_src, ar.linedefined);
}

/* The open tensor at i, else an error naming what the hook returned: the
** value (k = 0) or element #k of its sequence; `what`, what it may return. */
static gcap_tensor *l_rettensor(lua_State *L, const LHookCall *c, int fi, int i, int k,
                                const char *what) {
  LTensor *p = (LTensor *)luaL_testudata(L, i, TENSOR_MT);
  const char *got;
  if (p != NULL && p->t != NULL) {
    l_keeptensor(L, i); /* who is given it sees this same value */
    return p->t;
  }
  got = (p == NULL) ? l_typename(L, i) : "a closed tensor";
  l_hookerror(L, c, fi,
              k == 0 ? lua_pushfstring(L, "must return %s, got %s", what, got)
                     : lua_pushfstring(L, "must return %s, got %s as element #%d of its sequence",
                                       what, got, k));
  return NULL; /* not reached: l_hookerror raises */
}

/* The table at i (a hook's return) is a sequence 1..n, else an error
** naming its first other key. */
static void l_retsequence(lua_State *L, const LHookCall *c, int fi, int i, int n,
                          const char *what) {
  lua_pushnil(L);
  while (lua_next(L, i)) {
    lua_Integer k;
    int isnum;
    lua_pop(L, 1);
    k = lua_tointegerx(L, -1, &isnum);
    if (lua_type(L, -1) != LUA_TNUMBER || !isnum || k < 1 || k > n)
      l_hookerror(L, c, fi,
                  lua_pushfstring(L, "must return %s, got a table that is not a sequence (key %s)",
                                  what,
                                  lua_type(L, -1) == LUA_TSTRING
                                      ? lua_pushfstring(L, "'%s'", lua_tostring(L, -1))
                                      : luaL_tolstring(L, -1, NULL)));
  }
}

/*
** What the hook at fi returned, the values from fi + 1 on: nothing or nil
** keeps the values; a tensor, or (but for a forward hook, whose return is
** the output) a sequence of tensors, goes to the core, which checks count,
** shape and dtype when the hook returns. A forward pre-hook's return is the
** call's new arguments: from then on the module's hooks and Lua forward get
** the core's tensors, not the call's Lua values.
*/
static void l_hookreturn(lua_State *L, LHookCall *c, int fi) {
  int nres = lua_gettop(L) - fi, n, i;
  const char *what = (c->a->kind == GCAP_HOOK_FORWARD)
                         ? "a tensor or nothing"
                         : "a tensor, a sequence of tensors or nothing";
  gcap_tensor **t;
  gcap_status st;
  if (nres == 0 || (nres == 1 && lua_isnil(L, fi + 1))) return;
  if (nres > 1)
    l_hookerror(L, c, fi, lua_pushfstring(L, "must return %s, got %d values", what, nres));
  if (lua_type(L, fi + 1) == LUA_TTABLE && c->a->kind != GCAP_HOOK_FORWARD) {
    n = (int)lua_rawlen(L, fi + 1);
    l_retsequence(L, c, fi, fi + 1, n, what);
    t = l_inbuf(L, n);
    for (i = 1; i <= n; i++) {
      lua_rawgeti(L, fi + 1, i);
      t[i - 1] = l_rettensor(L, c, fi, -1, i, what);
      lua_pop(L, 1);
    }
  } else {
    n = 1;
    t = l_inbuf(L, 1);
    t[0] = l_rettensor(L, c, fi, fi + 1, 0, what);
  }
  if ((st = gcap_hook_return(c->a, n, t)) != GCAP_OK)
    l_hookerror(L, c, fi,
                lua_pushfstring(L, "could not return its values (%s)", gcap_status_str(st)));
  if (c->a->kind == GCAP_HOOK_FORWARD_PRE && c->h->le->cur != NULL && c->h->le->cur->m == c->m)
    c->h->le->cur->replaced = 1;
}

/* The protected part: f(module, ...) by kind */
int l_phook(lua_State *L) {
  LHookCall *c = (LHookCall *)lua_touserdata(L, 1);
  const gcap_hook_args *a = c->a;
  int mi, fi, n = 1;
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
      if (a->out != NULL)
        l_pushborrowed(L, a->out);
      else
        lua_pushnil(L);
      n += 2;
      break;
    }
    case GCAP_HOOK_BACKWARD_PRE:
      if (a->grad_out != NULL)
        l_pushborrowed(L, a->grad_out);
      else
        lua_pushnil(L);
      n += 1;
      break;
    case GCAP_HOOK_BACKWARD:
      if (a->grad_in != NULL)
        l_pushborrowed(L, a->grad_in);
      else
        lua_pushnil(L);
      if (a->grad_out != NULL)
        l_pushborrowed(L, a->grad_out);
      else
        lua_pushnil(L);
      n += 2;
      break;
  }
  lua_call(L, n, LUA_MULTRET);
  l_hookreturn(L, c, fi);
  return 0;
}

/* gcap_module_hook of every hook registered from Lua; ud is its LHandle */
static gcap_status l_hook(void *ud, gcap_module *m, const gcap_hook_args *a) {
  const LHandle *h = (const LHandle *)ud;
  const LFrame *f = h->le->cur;
  int fwd = (a->kind == GCAP_HOOK_FORWARD_PRE || a->kind == GCAP_HOOK_FORWARD);
  LHookCall c = {{0}, h, m, a};
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
