/*
** lfunction.c: the core of gc.autograd.Function (graphcap/autograd.lua).
** core._fn_record attaches the output of a Lua forward to the autograd
** graph as a custom node (gcap_autograd_record) whose ud, an LFn, holds a
** registry reference to the Lua backward runner (a closure over the
** Function's ctx), released when the node goes. The node's backward
** reaches Lua through l_callback, as every callback does: a Lua error
** stops the backward and is raised, as it is, by the l_run of the call
** that started the backward (t:backward(), make_graphed_callables).
*/

#include <stdlib.h>
#include <string.h>

#include "lbind.h"

LUAI_DDEF const char l_fnkey = 'a'; /* the protected part of a Function's backward */

#define LFN_MAXARGS 4096 /* arguments of a Function's forward */

/* A custom node's ud */
typedef struct LFn {
  lua_State *L; /* the main thread: the destructor may run from any of the state's */
  LEngine *le;
  int ref;      /* the runner, in the registry */
  char name[1]; /* the Function's name, for errors (allocated to its length) */
} LFn;

/* A backward in progress, the context of l_pfnbackward */
typedef struct LFnCall {
  LCall c;
  LFn *fn;
  int nsaved;
  gcap_tensor *const *saved;
  gcap_tensor *g;
  int nin;
  gcap_tensor **gin;
} LFnCall;

/* The node is gone (a finalizer, a core call, or closing the state: all
** run while the registry lives). Nothing here can raise. */
static void l_fnfree(void *ud) {
  LFn *fn = (LFn *)ud;
  luaL_unref(fn->L, LUA_REGISTRYINDEX, fn->ref);
  free(fn);
}

/* The tensor at i, or NULL for nil; a closed one is an error naming the
** Function and the tensor ("F: saved tensor #2 was closed"), not an
** argument of this internal call. */
static gcap_tensor *l_fntensor(lua_State *L, int i, const char *name, const char *role, int k,
                               const char *closed) {
  LTensor *box;
  if (lua_isnil(L, i)) return NULL;
  box = (LTensor *)luaL_testudata(L, i, TENSOR_MT);
  if (box != NULL && box->t == NULL) l_error(L, "%s%s #%d %s", name, role, k, closed);
  return l_checktensor(L, i);
}

/* The protected part: runner(grad, {saved...}) returns the table of the
** grads, one per input of forward (checked by the runner), taken into gin. */
int l_pfnbackward(lua_State *L) {
  LFnCall *c = (LFnCall *)lua_touserdata(L, 1);
  int i;
  lua_rawgeti(L, LUA_REGISTRYINDEX, c->fn->ref);
  l_pushborrowed(L, c->g);
  lua_createtable(L, c->nsaved, 0);
  for (i = 0; i < c->nsaved; i++) {
    l_pushborrowed(L, c->saved[i]);
    lua_rawseti(L, -2, i + 1);
  }
  lua_call(L, 2, 1);
  for (i = 0; i < c->nin; i++) {
    gcap_tensor *t;
    lua_rawgeti(L, -1, i + 1);
    t = l_fntensor(L, -1, c->fn->name, ".backward: grad", i + 1, "is a closed tensor");
    if (t != NULL) c->gin[i] = gcap_tensor_retain(t);
    lua_pop(L, 1);
  }
  return 0;
}

static gcap_status l_fnbackward(void *ud, int nsaved, gcap_tensor *const *saved, gcap_tensor *g,
                                int nin, gcap_tensor **gin) {
  LFnCall c = {{0, 0}, (LFn *)ud, nsaved, saved, g, nin, gin};
  return l_callback(c.fn->le, &l_fnkey, &c.c, NULL);
}

/* The tensors (or nil) at t[1..n] into v (borrowed: t holds their boxes);
** errors name them as role #k. */
static void l_tensorlist(lua_State *L, int t, int n, gcap_tensor **v, const char *name,
                         const char *role, const char *closed) {
  int i;
  for (i = 0; i < n; i++) {
    lua_rawgeti(L, t, i + 1);
    v[i] = l_fntensor(L, -1, name, role, i + 1, closed);
    lua_pop(L, 1);
  }
}

/* core._fn_record(name, result, n, inputs, saved, runner) -> a tensor
** sharing result's storage, the output of the Function's node when one is
** recorded. inputs: the n arguments of forward that are tensors (others
** nil); saved: the tensors of save_for_backward. */
static int l_fn_record(lua_State *L) {
  gcap_engine *e = l_engine(L);
  const char *name = luaL_checkstring(L, 1);
  LTensor *rbox = (LTensor *)luaL_checkudata(L, 2, TENSOR_MT), *box;
  gcap_tensor **in;
  int nin = (int)luaL_checkinteger(L, 3), nsave, ref;
  LFn *fn;
  if (rbox->t == NULL) return l_error(L, "%s.forward returned a closed tensor", name);
  luaL_checktype(L, 4, LUA_TTABLE);
  luaL_checktype(L, 5, LUA_TTABLE);
  luaL_checktype(L, 6, LUA_TFUNCTION);
  nsave = (int)luaL_len(L, 5);
  if (nin < 0 || nin > LFN_MAXARGS)
    return l_error(L, "%s.apply: %d arguments; at most %d", name, nin, LFN_MAXARGS);
  if (nsave > LFN_MAXARGS) /* the core refuses more than a few; this bounds the buffer */
    return l_error(L, "%s: %d tensors saved for backward; too many", name, nsave);
  in = (gcap_tensor **)lua_newuserdatauv(L, sizeof *in * (size_t)(nin + nsave + 1), 0);
  l_tensorlist(L, 4, nin, in, name, ": input", "of forward was closed");
  l_tensorlist(L, 5, nsave, in + nin, name, ": saved tensor", "was closed");
  box = l_newtensor(L);
  lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
  lua_pushvalue(L, 6);
  ref = luaL_ref(L, LUA_REGISTRYINDEX);
  if ((fn = (LFn *)malloc(sizeof *fn + strlen(name))) == NULL) {
    luaL_unref(L, LUA_REGISTRYINDEX, ref);
    return luaL_error(L, "%s: out of memory", name);
  }
  fn->ref = ref; /* from here on, gcap_autograd_record owns fn */
  memcpy(fn->name, name, strlen(name) + 1);
  fn->L = lua_tothread(L, -1);
  fn->le = (LEngine *)lua_touserdata(L, ENGINEIDX);
  l_check(L, e,
          gcap_autograd_record(name, rbox->t, nin, in, nsave, in + nin, l_fnbackward, fn, l_fnfree,
                               &box->t),
          name);
  lua_pop(L, 1);
  return 1;
}

/* core._anchor(t) -> a tensor over t's storage that makes a Function's node
** record without an edge into t (gcap_autograd_anchor) */
static int l_anchor(lua_State *L) {
  LTensor *t = (LTensor *)luaL_checkudata(L, 1, TENSOR_MT), *box;
  if (t->t == NULL) return l_error(L, "anchor: the tensor is closed");
  box = l_newtensor(L);
  l_check(L, l_engine(L), gcap_autograd_anchor(t->t, &box->t), "anchor");
  return 1;
}

LUAI_DDEF const luaL_Reg l_function_funcs[] = {
    {"_fn_record", l_fn_record}, {"_anchor", l_anchor}, {NULL, NULL}};
