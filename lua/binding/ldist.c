/*
** ldist.c: the distributed runtime (_dist, for graphcap.dist): init, ranks,
** groups and the collectives. The facade (graphcap/dist.lua) reads the
** option tables; here arguments are positional.
*/

#include "lbind.h"

/*
** {======================================================
** Groups
** =======================================================
*/

static int l_group_isopen(const void *box) {
  return ((const LGroup *)box)->g != NULL;
}

static void l_pushranks(lua_State *L, const gcap_dist_group *g) {
  const int *r = gcap_dist_group_ranks(g);
  int i, n = gcap_dist_group_size(g);
  lua_createtable(L, n, 0);
  for (i = 0; i < n; i++) {
    lua_pushinteger(L, r[i]);
    lua_rawseti(L, -2, i + 1);
  }
}

static void l_group_describe(lua_State *L, void *box) {
  luaL_Buffer b;
  const gcap_dist_group *g = ((LGroup *)box)->g;
  const int *r = gcap_dist_group_ranks(g);
  int i, n = gcap_dist_group_size(g);
  luaL_buffinit(L, &b);
  luaL_addstring(&b, DISTGROUP_MT "({");
  for (i = 0; i < n; i++) {
    lua_pushfstring(L, "%s%d", i ? ", " : "", r[i]);
    luaL_addvalue(&b);
  }
  luaL_addstring(&b, "})");
  luaL_pushresult(&b);
}

static gcap_dist_group *l_checkgroup(lua_State *L, int i) {
  return ((LGroup *)l_checkbox(L, i, &l_group_class))->g;
}

/* The group at i, or NULL (the world) when it is nil or absent. */
static gcap_dist_group *l_optgroup(lua_State *L, int i) {
  return lua_isnoneornil(L, i) ? NULL : l_checkgroup(L, i);
}

/* g:rank() -> the caller's rank in g, -1 when it is not a member */
static int l_group_rank(lua_State *L) {
  lua_pushinteger(L, gcap_dist_group_rank(l_checkgroup(L, 1)));
  return 1;
}

static int l_group_size(lua_State *L) {
  lua_pushinteger(L, gcap_dist_group_size(l_checkgroup(L, 1)));
  return 1;
}

/* g:ranks() -> the world ranks of g, by group rank (a new sequence) */
static int l_group_ranks(lua_State *L) {
  l_pushranks(L, l_checkgroup(L, 1));
  return 1;
}

static const luaL_Reg l_group_meta[] = {{NULL, NULL}};

static const luaL_Reg l_group_methods[] = {
    {"rank", l_group_rank}, {"size", l_group_size}, {"ranks", l_group_ranks}, {NULL, NULL}};

LUAI_DDEF const LClass l_group_class = {"DistGroup",      DISTGROUP_MT,   "group is closed",
                                        "closed",         l_group_isopen, NULL,
                                        l_group_describe, l_group_meta,   l_group_methods};

/* }====================================================== */

/*
** {======================================================
** Runtime
** =======================================================
*/

static int l_dist_available(lua_State *L) {
  lua_pushboolean(L, gcap_dist_available());
  return 1;
}

static int l_dist_init(lua_State *L) {
  gcap_engine *e = l_engine(L);
  l_check(L, e, gcap_dist_init(e), "init");
  return 0;
}

static int l_dist_is_initialized(lua_State *L) {
  lua_pushboolean(L, gcap_dist_is_initialized());
  return 1;
}

/* A rank query: an error before init, as torch.distributed's */
static int l_rankof(lua_State *L, int (*f)(void), const char *op) {
  if (!gcap_dist_is_initialized())
    return l_error(L, "%s: the distributed runtime is not initialised (call init first)", op);
  lua_pushinteger(L, f());
  return 1;
}

static int l_dist_rank(lua_State *L) {
  return l_rankof(L, gcap_dist_rank, "rank");
}

static int l_dist_world_size(lua_State *L) {
  return l_rankof(L, gcap_dist_world_size, "world_size");
}

static int l_dist_local_rank(lua_State *L) {
  return l_rankof(L, gcap_dist_local_rank, "local_rank");
}

static int l_dist_finalize(lua_State *L) {
  if (!gcap_dist_is_initialized())
    return l_error(L, "finalize: the distributed runtime is not initialised");
  l_check(L, l_engine(L), gcap_dist_finalize(), "finalize");
  return 0;
}

static int l_dist_set_debug(lua_State *L) {
  gcap_engine *e = l_engine(L);
  luaL_checktype(L, 1, LUA_TBOOLEAN);
  l_check(L, e, gcap_dist_set_debug(e, lua_toboolean(L, 1)), "set_debug");
  return 0;
}

/* _dist.new_group(ranks) with ranks a sequence of integers */
static int l_dist_new_group(lua_State *L) {
  gcap_engine *e = l_engine(L);
  lua_Integer i, n;
  int *v;
  LGroup *p;
  if (!lua_istable(L, 1))
    return l_error(L, "new_group: ranks must be a sequence of integers, got %s", l_typename(L, 1));
  n = luaL_len(L, 1);
  if (n < 1 || n > 1 << 20) return l_error(L, "new_group: ranks must hold 1 to 2^20 ranks");
  v = (int *)lua_newuserdatauv(L, (size_t)n * sizeof *v, 0);
  for (i = 1; i <= n; i++) {
    lua_Integer r;
    lua_geti(L, 1, i);
    r = lua_isinteger(L, -1) ? lua_tointeger(L, -1) : -1;
    if (r < 0 || r > 1 << 30)
      return l_error(L, "new_group: ranks[%I] must be a rank (an integer >= 0), got %s",
                     (LUAI_UACINT)i, l_typename(L, -1));
    v[i - 1] = (int)r;
    lua_pop(L, 1);
  }
  p = (LGroup *)l_newbox(L, sizeof *p, 1, DISTGROUP_MT);
  l_check(L, e, gcap_dist_new_group(e, (int)n, v, &p->g), "new_group");
  return 1;
}

static int l_dist_world(lua_State *L) {
  LGroup *p;
  if (gcap_dist_world() == NULL) return 0;
  p = (LGroup *)l_newbox(L, sizeof *p, 1, DISTGROUP_MT);
  p->g = gcap_dist_world();
  return 1;
}

static int l_dist_barrier(lua_State *L) {
  gcap_engine *e = l_engine(L);
  l_check(L, e, gcap_dist_barrier(e, l_optgroup(L, 1)), "barrier");
  return 0;
}

/* _dist.any(flags, group) -> a new sequence: flags[k] (booleans) or'd
** over the ranks of group (nil: the world), at once (gcap_dist_any) */
static int l_dist_any(lua_State *L) {
  gcap_engine *e = l_engine(L);
  gcap_dist_group *g = l_optgroup(L, 2);
  lua_Integer i, n;
  unsigned char *v;
  luaL_checktype(L, 1, LUA_TTABLE);
  n = luaL_len(L, 1);
  if (n < 0 || n > 1 << 24) return l_error(L, "any: flags must hold at most 2^24 flags");
  v = (unsigned char *)lua_newuserdatauv(L, (size_t)n + 1, 0);
  for (i = 1; i <= n; i++) {
    lua_geti(L, 1, i);
    v[i - 1] = (unsigned char)lua_toboolean(L, -1);
    lua_pop(L, 1);
  }
  l_check(L, e, gcap_dist_any(e, (int)n, v, g), "any");
  lua_createtable(L, (int)n, 0);
  for (i = 1; i <= n; i++) {
    lua_pushboolean(L, v[i - 1]);
    lua_rawseti(L, -2, i);
  }
  return 1;
}

/* }====================================================== */

/*
** {======================================================
** Collectives
** =======================================================
*/

/* The reduction named at i: "sum", "avg" or "max" */
static gcap_reduce_op l_checkred(lua_State *L, int i, const char *op) {
  static const char *const names[] = {"sum", "avg", "max", NULL};
  const char *s = lua_tostring(L, i);
  int k;
  for (k = 0; s != NULL && names[k] != NULL; k++)
    if (strcmp(s, names[k]) == 0) return (gcap_reduce_op)k;
  l_error(L, "%s: op must be \"sum\", \"avg\" or \"max\", got %s%s%s", op, s ? "\"" : "",
          s ? s : l_typename(L, i), s ? "\"" : "");
  return GCAP_REDUCE_SUM;
}

/* _dist.all_reduce(t, op, group) */
static int l_dist_all_reduce(lua_State *L) {
  gcap_tensor *t = l_checktensor(L, 1);
  gcap_reduce_op op = l_checkred(L, 2, "all_reduce");
  l_check(L, l_engine(L), gcap_dist_all_reduce(t, op, l_optgroup(L, 3)), "all_reduce");
  return 0;
}

/* _dist.all_gather(out, t, group) */
static int l_dist_all_gather(lua_State *L) {
  gcap_tensor *out = l_checktensor(L, 1), *t = l_checktensor(L, 2);
  l_check(L, l_engine(L), gcap_dist_all_gather(out, t, l_optgroup(L, 3)), "all_gather");
  return 0;
}

/* _dist.reduce_scatter(out, t, op, group) */
static int l_dist_reduce_scatter(lua_State *L) {
  gcap_tensor *out = l_checktensor(L, 1), *t = l_checktensor(L, 2);
  gcap_reduce_op op = l_checkred(L, 3, "reduce_scatter");
  l_check(L, l_engine(L), gcap_dist_reduce_scatter(out, t, op, l_optgroup(L, 4)), "reduce_scatter");
  return 0;
}

/* The rank argument at i of op (a root or a peer): an integer */
static int l_checkrank(lua_State *L, int i, const char *op, const char *what) {
  lua_Integer r = lua_isinteger(L, i) ? lua_tointeger(L, i) : INT64_MIN;
  if (r < INT32_MIN || r > INT32_MAX)
    l_error(L, "%s: %s must be a rank (an integer), got %s", op, what, l_typename(L, i));
  return (int)r;
}

/* _dist.broadcast(t, root, group), and send and recv (t, peer, group) */
#define L_P2P(name, what)                                                                          \
  static int l_dist_##name(lua_State *L) {                                                         \
    gcap_tensor *t = l_checktensor(L, 1);                                                          \
    int r = l_checkrank(L, 2, #name, what);                                                        \
    l_check(L, l_engine(L), gcap_dist_##name(t, r, l_optgroup(L, 3)), #name);                      \
    return 0;                                                                                      \
  }
L_P2P(broadcast, "root")
L_P2P(send, "peer")
L_P2P(recv, "peer")

/* }====================================================== */

LUAI_DDEF const luaL_Reg l_dist_funcs[] = {{"available", l_dist_available},
                                           {"init", l_dist_init},
                                           {"is_initialized", l_dist_is_initialized},
                                           {"rank", l_dist_rank},
                                           {"world_size", l_dist_world_size},
                                           {"local_rank", l_dist_local_rank},
                                           {"finalize", l_dist_finalize},
                                           {"set_debug", l_dist_set_debug},
                                           {"new_group", l_dist_new_group},
                                           {"world", l_dist_world},
                                           {"barrier", l_dist_barrier},
                                           {"any", l_dist_any},
                                           {"all_reduce", l_dist_all_reduce},
                                           {"all_gather", l_dist_all_gather},
                                           {"reduce_scatter", l_dist_reduce_scatter},
                                           {"broadcast", l_dist_broadcast},
                                           {"send", l_dist_send},
                                           {"recv", l_dist_recv},
                                           {NULL, NULL}};
