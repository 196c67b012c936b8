/*
** lkernel.c: kernels compiled at run time (graphcap/cuda.lua's
** gc.cuda.kernel). core.cuda_kernel compiles a Kernel box;
** core.kernel_launch launches it with its arguments and, for the host
** backend, a Lua host twin: the launch's host_ud, an LTwin, holds a
** registry reference to {twin, arg1, ..., argn}, the arguments as the
** kernel sees them (numbers converted to their parameters' types by
** gcap_kernel_args; the tensors, which so live as long as the launch, which
** a graph keeps), released when the launch goes. The twin reaches Lua
** through l_callback, as every callback does: now, from the launch's l_run,
** or at a replay (g:replay(), a graphed call, a backward), from theirs.
*/

#include <stdlib.h>
#include <string.h>

#include "lbind.h"

LUAI_DDEF const char l_twinkey = 'k'; /* the protected part of a kernel's host twin */

#define LK_MAXARGS 64 /* a launch's arguments */

typedef struct LKernel {
  gcap_kernel *k;
  gcap_engine *e;
} LKernel;

/* A launch's host_ud */
typedef struct LTwin {
  lua_State *L; /* the main thread: the destructor may run from any of the state's */
  LEngine *le;
  int ref;   /* {twin, args...} in the registry */
  int nargs; /* the launch's arguments */
} LTwin;

/* The context of l_ptwin */
typedef struct LTwinCall {
  LCall c;
  LTwin *tw;
} LTwinCall;

static void l_twinfree(void *ud) {
  LTwin *tw = (LTwin *)ud;
  luaL_unref(tw->L, LUA_REGISTRYINDEX, tw->ref);
  free(tw);
}

/* The protected part: twin(arg1, ..., argn). */
int l_ptwin(lua_State *L) {
  LTwinCall *c = (LTwinCall *)lua_touserdata(L, 1);
  int i, t;
  luaL_checkstack(L, c->tw->nargs + 2, "kernel arguments");
  lua_rawgeti(L, LUA_REGISTRYINDEX, c->tw->ref);
  t = lua_gettop(L);
  for (i = 0; i <= c->tw->nargs; i++)
    lua_rawgeti(L, t, i + 1);
  lua_call(L, c->tw->nargs, 0);
  return 0;
}

static gcap_status l_twin(void *ud, void *stream, int nin, const gcap_custom_arg *in, int nout,
                          const gcap_custom_arg *out) {
  LTwinCall c = {{0, 0}, (LTwin *)ud};
  (void)stream, (void)nin, (void)in, (void)nout, (void)out;
  return l_callback(c.tw->le, &l_twinkey, &c.c, NULL);
}

static LKernel *l_checkkernel(lua_State *L, int i) {
  return (LKernel *)l_checkbox(L, i, &l_kernel_class);
}

/* The parameter types of the sequence of names at t (nil: none) into
** sig[LK_MAXARGS]; their count, or -1 for nil. */
static int l_signature(lua_State *L, int t, gcap_kparam *sig) {
  int i, n;
  if (lua_isnil(L, t)) return -1;
  n = (int)luaL_len(L, t);
  if (n > LK_MAXARGS) return l_error(L, "gc.cuda.kernel: %d parameters; at most %d", n, LK_MAXARGS);
  for (i = 0; i < n; i++) {
    const char *s;
    int k;
    lua_rawgeti(L, t, i + 1);
    s = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
    for (k = 0; s != NULL && gcap_kparam_name((gcap_kparam)k) != NULL; k++)
      if (strcmp(s, gcap_kparam_name((gcap_kparam)k)) == 0) break;
    if (s == NULL || gcap_kparam_name((gcap_kparam)k) == NULL)
      return l_error(L,
                     "gc.cuda.kernel: signature[%d] must be one of \"ptr\", \"i32\", \"u32\", "
                     "\"i64\", \"u64\", \"f32\", \"f64\", \"bool\", got %s",
                     i + 1, s != NULL ? s : luaL_typename(L, -1));
    sig[i] = (gcap_kparam)k;
    lua_pop(L, 1);
  }
  return n;
}

/* The string at i, which NVRTC reads as a C string: a NUL inside would
** drop the rest of it silently. */
static const char *l_cstring(lua_State *L, int i, const char *what) {
  size_t len;
  const char *s = luaL_checklstring(L, i, &len);
  if (strlen(s) != len)
    l_error(L, "gc.cuda.kernel: %s holds a NUL byte at %d (it would end there)", what,
            (int)strlen(s) + 1);
  return s;
}

/* core.cuda_kernel(source, name, {options...}, signature) -> Kernel, where
** signature is a sequence of parameter type names or nil (read from the
** source). */
static int l_cuda_kernel(lua_State *L) {
  gcap_engine *e = l_engine(L);
  const char *src = l_cstring(L, 1, "source"), *name = l_cstring(L, 2, "name");
  const char **opts;
  gcap_kparam sig[LK_MAXARGS];
  int i, n, nsig;
  LKernel *p;
  luaL_checktype(L, 3, LUA_TTABLE);
  nsig = l_signature(L, 4, sig);
  n = (int)luaL_len(L, 3);
  if (n < 0 || n > LK_MAXARGS)
    return l_error(L, "gc.cuda.kernel: %d options; at most %d", n, LK_MAXARGS);
  opts = (const char **)lua_newuserdatauv(L, (size_t)(n > 0 ? n : 1) * sizeof *opts, 0);
  for (i = 0; i < n; i++) {
    lua_rawgeti(L, 3, i + 1);
    if (lua_type(L, -1) != LUA_TSTRING)
      return l_error(L, "gc.cuda.kernel: option #%d must be a string, got %s", i + 1,
                     luaL_typename(L, -1));
    opts[i] = l_cstring(L, -1, "an option"); /* kept by the table at 3 */
    lua_pop(L, 1);
  }
  p = (LKernel *)l_newbox(L, sizeof *p, 1, KERNEL_MT);
  p->e = e;
  l_check(L, e, gcap_kernel_new(e, src, name, n, opts, nsig, nsig < 0 ? NULL : sig, &p->k),
          "gc.cuda.kernel");
  return 1;
}

/* The tensors of the sequence `what` at t into v[n] (borrowed: t holds
** them). */
static void l_tensorseq(lua_State *L, int t, const char *what, int n, gcap_tensor **v) {
  int i;
  for (i = 0; i < n; i++) {
    lua_rawgeti(L, t, i + 1);
    v[i] = l_entrytensor(L, -1, "kernel launch", what, i + 1);
    lua_pop(L, 1);
  }
}

/* A launch in progress, for l_run */
typedef struct LLaunch {
  gcap_kernel *k;
  gcap_launch_desc d;
} LLaunch;

static gcap_status l_calllaunch(const LRun *r, void *ud) {
  (void)r;
  return gcap_kernel_launch(((LLaunch *)ud)->k, &((LLaunch *)ud)->d);
}

/* core.kernel_launch(k, {gx, gy, gz}, {bx, by, bz}, shmem, args, reads,
** writes, twin) where args is {n = count, ...} (tensors and numbers,
** converted to the kernel's parameter types), reads and writes sequences
** of tensors, twin a function or nil. */
static int l_kernel_launch(lua_State *L) {
  LKernel *p = l_checkkernel(L, 1);
  LLaunch ll;
  gcap_launch_desc *d = &ll.d;
  gcap_karg *args, *conv;
  gcap_tensor **tv;
  LRun r = {.call = l_calllaunch, .ud = &ll};
  int i, nargs, nr, nw;
  memset(&ll, 0, sizeof ll);
  ll.k = p->k;
  for (i = 0; i < 3; i++) {
    lua_Integer g, b;
    lua_rawgeti(L, 2, i + 1);
    lua_rawgeti(L, 3, i + 1);
    g = luaL_checkinteger(L, -2);
    b = luaL_checkinteger(L, -1);
    if (g < 1 || b < 1 || g > 0x7fffffff || b > 1024)
      return l_error(L, "kernel launch: grid and block sizes must be 1 to 2^31-1 (block: 1024)");
    d->grid[i] = (unsigned)g;
    d->block[i] = (unsigned)b;
    lua_pop(L, 2);
  }
  d->shmem = (unsigned)luaL_checkinteger(L, 4);
  luaL_checktype(L, 5, LUA_TTABLE);
  luaL_checktype(L, 6, LUA_TTABLE);
  luaL_checktype(L, 7, LUA_TTABLE);
  lua_getfield(L, 5, "n");
  nargs = (int)luaL_checkinteger(L, -1);
  lua_pop(L, 1);
  nr = (int)luaL_len(L, 6);
  nw = (int)luaL_len(L, 7);
  if (nargs < 0 || nargs > LK_MAXARGS || nr + nw > LK_MAXARGS)
    return l_error(L, "kernel launch: at most %d arguments and %d tensors read or written",
                   LK_MAXARGS, LK_MAXARGS);
  args = (gcap_karg *)lua_newuserdatauv(L, (size_t)(2 * nargs + 1) * sizeof *args, 0);
  conv = args + nargs;
  tv = (gcap_tensor **)lua_newuserdatauv(L, (size_t)(nr + nw + 1) * sizeof *tv, 0);
  memset(args, 0, (size_t)(2 * nargs + 1) * sizeof *args);
  for (i = 0; i < nargs; i++) {
    lua_rawgeti(L, 5, i + 1);
    if (lua_isinteger(L, -1)) {
      args[i].kind = GCAP_KARG_INT;
      args[i].i = (int64_t)lua_tointeger(L, -1);
    } else if (lua_type(L, -1) == LUA_TNUMBER) {
      args[i].kind = GCAP_KARG_FLOAT;
      args[i].f = (double)lua_tonumber(L, -1);
    } else if (luaL_testudata(L, -1, TENSOR_MT)) {
      args[i].kind = GCAP_KARG_TENSOR;
      args[i].t = l_entrytensor(L, -1, "kernel launch", "args", i + 1);
    } else
      return l_error(L, "kernel launch: argument #%d must be a tensor or a number, got %s", i + 1,
                     l_typename(L, -1));
    lua_pop(L, 1);
  }
  l_check(L, p->e, gcap_kernel_args(p->k, nargs, args, conv), "kernel launch");
  l_tensorseq(L, 6, "reads", nr, tv);
  l_tensorseq(L, 7, "writes", nw, tv + nr);
  d->nargs = nargs, d->args = args;
  d->nreads = nr, d->reads = tv;
  d->nwrites = nw, d->writes = tv + nr;
  if (!lua_isnoneornil(L, 8)) {
    LTwin *tw;
    luaL_checktype(L, 8, LUA_TFUNCTION);
    lua_createtable(L, nargs + 1, 0); /* {twin, args as the kernel sees them...} */
    lua_pushvalue(L, 8);
    lua_rawseti(L, -2, 1);
    for (i = 0; i < nargs; i++) {
      if (conv[i].kind == GCAP_KARG_TENSOR)
        lua_rawgeti(L, 5, i + 1);
      else if (conv[i].kind == GCAP_KARG_INT)
        lua_pushinteger(L, (lua_Integer)conv[i].i);
      else
        lua_pushnumber(L, (lua_Number)conv[i].f);
      lua_rawseti(L, -2, i + 2);
    }
    if ((tw = (LTwin *)malloc(sizeof *tw)) == NULL) return luaL_error(L, "out of memory");
    lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
    tw->L = lua_tothread(L, -1);
    lua_pop(L, 1);
    tw->le = (LEngine *)lua_touserdata(L, ENGINEIDX);
    tw->nargs = nargs;
    tw->ref = luaL_ref(L, LUA_REGISTRYINDEX); /* nothing raises from here to the launch */
    d->host = l_twin;
    d->host_ud = tw;
    d->host_ud_free = l_twinfree;
  }
  r.e = p->e;
  r.op = "kernel launch";
  r.nin = nr + nw;
  r.in = tv;
  l_run(L, &r);
  return 0;
}

static void l_kernel_close(lua_State *L, void *box) {
  (void)L;
  LKernel *p = (LKernel *)box;
  gcap_kernel_free(p->k); /* graphs that recorded a launch keep it */
  p->k = NULL;
}

static void l_kernel_describe(lua_State *L, void *box) {
  lua_pushfstring(L, KERNEL_MT "(%p)", (void *)((LKernel *)box)->k);
}

static int l_kernel_isopen(const void *box) {
  return ((const LKernel *)box)->k != NULL;
}

static const luaL_Reg l_kernel_meta[] = {{NULL, NULL}};
static const luaL_Reg l_kernel_methods[] = {{NULL, NULL}};

LUAI_DDEF const LClass l_kernel_class = {"Kernel",          KERNEL_MT,       "kernel is closed",
                                         "closed",          l_kernel_isopen, l_kernel_close,
                                         l_kernel_describe, l_kernel_meta,   l_kernel_methods};

LUAI_DDEF const luaL_Reg l_kernel_funcs[] = {
    {"cuda_kernel", l_cuda_kernel}, {"kernel_launch", l_kernel_launch}, {NULL, NULL}};
