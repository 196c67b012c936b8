/*
** test_faults.c: allocation-failure injection, SQLite's way. For each call
** under test, N = 1, 2, ... : the N-th allocation of the call fails (host
** memory, device memory, backend objects; gcap_test_fail_alloc). Every such
** call must return an error with a message, leave the parameters, their
** .grad, the random generator, the live objects and the memory in use as
** they were, and the same call must then succeed with injection off. The walk
** ends when the call makes fewer than N allocations (it then succeeded with
** injection on). Run under `make asan`, LeakSanitizer checks that nothing
** leaked on any of these paths.
*/
#include "t.h"

#define FX_MAXP 8
#define FX_MAXV 256

/* A small model: Sequential(Linear(4, 8), GELU) then Linear(8, 4), its
** parameters, and the inputs of the calls under test. */
typedef struct fx {
  gcap_engine *e;
  gcap_module *l1, *act, *seq, *l2, *mods[2];
  gcap_tensor *p[FX_MAXP];
  int np;
  gcap_tensor *x, *target, *sx[4];
  gcap_pool *pool;
  gcap_optim *opt;
  gcap_graphed *G;  /* what a successful make_graphed_callables made */
  gcap_graph *g;    /* what a successful manual capture made */
  gcap_tensor *out; /* ... and its output */
  int hook_calls;
  char why[600];       /* the message of the call's failure */
  const char *phase;   /* the API function the call is in */
  struct fx_snap *ref; /* what a successful call leaves, when it is always the same */
} fx;

/* What must not change across a failed call. */
typedef struct fx_snap {
  float pv[FX_MAXP][FX_MAXV], gv[FX_MAXP][FX_MAXV];
  int has_grad[FX_MAXP];
  float out; /* the value of f->out, when there is one */
  gcap_engine_stats live;
  gcap_mem_stats heap, pool;
} fx_snap;

static const int64_t fx_xs[2] = {2, 4};

static int fx_open(fx *f) {
  memset(f, 0, sizeof *f);
  if ((f->e = t_engine()) == NULL) return 0;
  gcap_engine *e = f->e;
  if (gcap_manual_seed(e, 3) || gcap_nn_linear(e, 4, 8, 1, 0, &f->l1) || gcap_nn_gelu(e, &f->act) ||
      gcap_nn_linear(e, 8, 4, 1, 0, &f->l2))
    return 0;
  gcap_module *const two[2] = {f->l1, f->act};
  if (gcap_nn_sequential(e, 2, two, &f->seq)) return 0;
  f->mods[0] = f->seq, f->mods[1] = f->l2;
  for (int i = 0; i < gcap_module_num_parameters(f->l1); i++)
    f->p[f->np++] = gcap_module_parameter(f->l1, i, NULL, 0);
  for (int i = 0; i < gcap_module_num_parameters(f->l2); i++)
    f->p[f->np++] = gcap_module_parameter(f->l2, i, NULL, 0);
  if (gcap_tensor_rand(e, GCAP_F32, 2, fx_xs, 1, &f->x) ||
      gcap_tensor_rand(e, GCAP_F32, 2, fx_xs, 1, &f->target) || gcap_pool_new(e, &f->pool))
    return 0;
  for (int i = 0; i < 4; i++) {
    const int64_t s[2] = {2, i % 2 ? 8 : 4};
    if (gcap_tensor_rand(e, GCAP_F32, 2, s, 1, &f->sx[i]) ||
        gcap_tensor_set_requires_grad(f->sx[i], 1))
      return 0;
  }
  return gcap_optim_adam(e, f->np, f->p, 1e-2, 0.9, 0.999, 1e-8, 0.0, &f->opt) == GCAP_OK;
}

static void fx_close(fx *f) {
  gcap_graphed_free(f->G);
  gcap_graph_free(f->g);
  gcap_tensor_free(f->out);
  gcap_optim_free(f->opt);
  for (int i = 0; i < 4; i++)
    gcap_tensor_free(f->sx[i]);
  gcap_tensor_free(f->x);
  gcap_tensor_free(f->target);
  gcap_pool_free(f->pool);
  gcap_module_free(f->seq);
  gcap_module_free(f->l1);
  gcap_module_free(f->act);
  gcap_module_free(f->l2);
  gcap_engine_free(f->e);
}

/* Read t (at most FX_MAXV values) into v. */
static int fx_read(gcap_tensor *t, float *v) {
  int64_t n = gcap_tensor_numel(t);
  return n <= FX_MAXV && gcap_tensor_read(t, v, (size_t)n) == GCAP_OK;
}

static int fx_take(fx *f, fx_snap *s) {
  memset(s, 0, sizeof *s);
  for (int i = 0; i < f->np; i++) {
    gcap_tensor *g = gcap_tensor_grad(f->p[i]);
    if (!fx_read(f->p[i], s->pv[i])) return 0;
    s->has_grad[i] = g != NULL;
    if (g && !fx_read(g, s->gv[i])) return 0;
  }
  if (f->out && !fx_read(f->out, &s->out)) return 0;
  return gcap_engine_get_stats(f->e, &s->live) == GCAP_OK &&
         gcap_engine_mem_stats(f->e, &s->heap) == GCAP_OK &&
         gcap_pool_get_stats(f->pool, &s->pool) == GCAP_OK;
}

/* Compare the state now with `was`; report the first difference, naming
** the case and N. */
static long fx_checked; /* successful calls whose results were compared */

/* After a successful call: its results (parameters, .grad, output) are the
** reference's, when the case has one. */
static void fx_result(fx *f, const char *name, long n, const char *when) {
  fx_snap now;
  if (f->ref == NULL) return;
  fx_checked++;
  if (!fx_take(f, &now)) {
    T_FAILF("fx_take", "%s, N=%ld: cannot read the results: %s", name, n, gcap_errmsg(f->e));
    return;
  }
  for (int i = 0; i < f->np; i++)
    if (memcmp(now.pv[i], f->ref->pv[i], sizeof now.pv[i]) != 0 ||
        now.has_grad[i] != f->ref->has_grad[i] ||
        memcmp(now.gv[i], f->ref->gv[i], sizeof now.gv[i]) != 0) {
      T_FAILF(name, "N=%ld, %s: parameter %d or its .grad differs from a clean call's", n, when, i);
      return;
    }
  if (memcmp(&now.out, &f->ref->out, sizeof now.out) != 0)
    T_FAILF(name, "N=%ld, %s: the output differs from a clean call's", n, when);
}

static void fx_same(fx *f, const fx_snap *was, const char *name, long n) {
  fx_snap now;
  char what[160] = "";
  if (!fx_take(f, &now)) {
    T_FAILF("fx_take", "%s, N=%ld: cannot read the state: %s", name, n, gcap_errmsg(f->e));
    return;
  }
  for (int i = 0; i < f->np && !what[0]; i++) {
    if (memcmp(now.pv[i], was->pv[i], sizeof now.pv[i]) != 0)
      snprintf(what, sizeof what, "parameter %d changed", i);
    else if (now.has_grad[i] != was->has_grad[i] ||
             memcmp(now.gv[i], was->gv[i], sizeof now.gv[i]) != 0)
      snprintf(what, sizeof what, "the .grad of parameter %d changed", i);
  }
  if (what[0]) {
  } else if (now.live.objects != was->live.objects || now.live.blocks != was->live.blocks ||
             now.live.in_use_bytes != was->live.in_use_bytes)
    snprintf(what, sizeof what, "live objects %lld -> %lld, blocks %lld -> %lld, bytes %zu -> %zu",
             (long long)was->live.objects, (long long)now.live.objects, (long long)was->live.blocks,
             (long long)now.live.blocks, was->live.in_use_bytes, now.live.in_use_bytes);
  else if (now.heap.in_use_bytes != was->heap.in_use_bytes || now.heap.blocks != was->heap.blocks)
    snprintf(what, sizeof what, "ordinary memory in use %zu -> %zu", was->heap.in_use_bytes,
             now.heap.in_use_bytes);
  else if (now.pool.reserved_bytes != was->pool.reserved_bytes ||
           now.pool.in_use_bytes != was->pool.in_use_bytes || now.pool.graphs != was->pool.graphs)
    snprintf(what, sizeof what, "the pool's reserved bytes %zu -> %zu (in use %zu -> %zu)",
             was->pool.reserved_bytes, now.pool.reserved_bytes, was->pool.in_use_bytes,
             now.pool.in_use_bytes);
  if (what[0]) T_FAILF("state as before", "%s, N=%ld, in %s: %s", name, n, f->phase, what);
}

/* The random generator after a call made with seed 42 is where seed 42
** left it: the call drew nothing. */
static int fx_rng_untouched(fx *f) {
  float a[8], b[8];
  gcap_tensor *r = NULL;
  int ok = gcap_tensor_rand(f->e, GCAP_F32, 2, fx_xs, 1, &r) == GCAP_OK && fx_read(r, a);
  gcap_tensor_free(r), r = NULL;
  ok = ok && gcap_manual_seed(f->e, 42) == GCAP_OK &&
       gcap_tensor_rand(f->e, GCAP_F32, 2, fx_xs, 1, &r) == GCAP_OK && fx_read(r, b);
  gcap_tensor_free(r);
  return ok && memcmp(a, b, sizeof a) == 0;
}

typedef gcap_status (*fx_call)(fx *f);
typedef void (*fx_undo)(fx *f);

/* Walk N = 1, 2, ... through call; undo frees what a successful call made.
** Returns the number of failures injected. */
static long fx_walk(fx *f, const char *name, fx_call call, fx_undo undo) {
  long n;
  for (n = 1; n < 100000; n++) {
    fx_snap was;
    if (!fx_take(f, &was) || gcap_manual_seed(f->e, 42) != GCAP_OK) {
      T_FAILF("fx_take", "%s, N=%ld: set-up: %s", name, n, gcap_errmsg(f->e));
      return n;
    }
    f->why[0] = '\0';
    f->phase = "the call";
    gcap_test_fail_alloc(n);
    gcap_status st = call(f);
    int injected = (int)gcap_test_fail_alloc(0);
    if (st != GCAP_OK && f->why[0] == '\0')
      snprintf(f->why, sizeof f->why, "%s", gcap_errmsg(f->e));
    if (!injected) { /* past the last allocation: the walk is over */
      if (st != GCAP_OK) T_FAILF(name, "N=%ld, nothing injected: %s", n, gcap_errmsg(f->e));
      if (st == GCAP_OK) fx_result(f, name, n, "with nothing injected");
      undo(f);
      return n - 1;
    }
    if (st == GCAP_OK) { /* the failure was absorbed (a cache, a fallback) */
      fx_result(f, name, n, "a failure absorbed");
      undo(f);
      continue;
    }
    if (f->why[0] == '\0')
      T_FAILF(name, "N=%ld, in %s: %s with an empty message", n, f->phase, gcap_status_str(st));
    if (gcap_is_capturing(f->e)) {
      T_FAILF(name, "N=%ld: a capture was left open: %s", n, gcap_errmsg(f->e));
      return n;
    }
    fx_same(f, &was, name, n);
    if (!fx_rng_untouched(f)) T_FAILF(name, "N=%ld: the random generator moved", n);
    if (gcap_manual_seed(f->e, 42) != GCAP_OK || (st = call(f)) != GCAP_OK) {
      T_FAILF(name, "N=%ld: the call without injection failed: %s", n, gcap_errmsg(f->e));
      return n;
    }
    fx_result(f, name, n, "the call again");
    undo(f);
  }
  return n;
}

static long fx_total; /* failures injected over all walks */

/* Open a model, walk call through it, close it. stable: every successful
** call leaves the same results (no optimizer step): a clean call's are the
** reference that every successful call of the walk must give. */
static void fx_run(const char *name, fx_call call, fx_undo undo, int stable) {
  fx f;
  fx_snap ref;
  if (!fx_open(&f)) {
    T_FAILF("fx_open", "%s: %s", name, f.e ? gcap_errmsg(f.e) : gcap_last_open_error());
    if (f.e) fx_close(&f);
    return;
  }
  if (stable) {
    if (gcap_manual_seed(f.e, 42) != GCAP_OK || call(&f) != GCAP_OK || !fx_take(&f, &ref)) {
      T_FAILF(name, "the clean call failed: %s", gcap_errmsg(f.e));
      fx_close(&f);
      return;
    }
    f.ref = &ref;
    undo(&f);
  }
  long k = fx_walk(&f, name, call, undo);
  T_CHECK(k > 0);
  fx_total += k;
  fx_close(&f);
}

/* ---- a manual capture, replayed once ---------------------------------- */

static gcap_status capture_call(fx *f) {
  gcap_status st;
  gcap_tensor *h = NULL, *y = NULL, *w = f->p[0];
  f->phase = "capture";
  if ((st = gcap_graph_new(f->e, &f->g)) != GCAP_OK) return st;
  if ((st = gcap_capture_begin(f->g, f->pool, NULL)) != GCAP_OK) goto fail;
  st = gcap_linear(f->x, w, NULL, &h);
  if (st == GCAP_OK) st = gcap_relu(h, &y);
  if (st == GCAP_OK) st = gcap_sum(y, &f->out);
  gcap_tensor_free(h), gcap_tensor_free(y);
  if (st != GCAP_OK) { /* the op's reason, not capture_end's */
    snprintf(f->why, sizeof f->why, "%s", gcap_errmsg(f->e));
    gcap_capture_end(f->g);
    gcap_tensor_free(f->out), f->out = NULL;
    gcap_graph_free(f->g), f->g = NULL;
    return st;
  }
  if ((st = gcap_capture_end(f->g)) != GCAP_OK || (st = gcap_graph_replay(f->g)) != GCAP_OK)
    goto fail;
  return GCAP_OK;
fail:
  gcap_tensor_free(f->out), f->out = NULL;
  gcap_graph_free(f->g), f->g = NULL;
  return st;
}

static void capture_undo(fx *f) {
  gcap_tensor_free(f->out), f->out = NULL;
  gcap_graph_free(f->g), f->g = NULL;
}

static void test_fault_manual_capture(void) {
  fx_run("manual capture", capture_call, capture_undo, 1);
}

/* ---- make_graphed_callables ------------------------------------------- */

static gcap_status count_hook(void *ud, gcap_module *m) {
  (void)m;
  ((fx *)ud)->hook_calls++;
  return GCAP_OK;
}

/* Graph the two callables with `o` (order: 2 entries), then run one
** forward and backward through the graphed entries. */
static gcap_status graphed_call(fx *f, gcap_graphed_opts *o) {
  gcap_tensor *const a0[1] = {f->sx[0]}, *const a1[1] = {f->sx[1]};
  gcap_tensor *const *args[2] = {a0, a1};
  const int nargs[2] = {1, 1};
  gcap_tensor *h = NULL, *y = NULL, *l = NULL;
  gcap_status st;
  f->phase = "make_graphed_callables";
  if ((st = gcap_make_graphed_callables(f->e, 2, f->mods, 2, nargs, args, o, &f->G)) != GCAP_OK)
    return st;
  f->phase = "graphed_call";
  st = gcap_graphed_call(f->G, 0, 1, &f->x, &h);
  if (st == GCAP_OK) st = gcap_graphed_call(f->G, 1, 1, &h, &y);
  if (st == GCAP_OK) f->phase = "mse_loss", st = gcap_mse_loss(y, f->target, &l);
  if (st == GCAP_OK) f->phase = "backward", st = gcap_backward(l, NULL, 0);
  gcap_tensor_free(h), gcap_tensor_free(y), gcap_tensor_free(l);
  if (st != GCAP_OK) snprintf(f->why, sizeof f->why, "%s", gcap_errmsg(f->e));
  if (st != GCAP_OK) gcap_graphed_free(f->G), f->G = NULL;
  return st;
}

static void graphed_undo(fx *f) {
  gcap_graphed_free(f->G), f->G = NULL;
  gcap_module_zero_grad(f->seq, 1);
  gcap_module_zero_grad(f->l2, 1);
  gcap_tensor_set_grad(f->sx[0], NULL);
  gcap_tensor_set_grad(f->sx[1], NULL);
}

static gcap_status graphed_plain(fx *f) {
  gcap_graphed_opts o;
  gcap_graphed_opts_init(&o);
  o.num_warmup_iters = 2;
  o.pool = f->pool;
  return graphed_call(f, &o);
}

static const double fx_order[4] = {1, 2, -2, -1};

static gcap_status graphed_order(fx *f) {
  gcap_graphed_opts o;
  gcap_graphed_opts_init(&o);
  o.num_warmup_iters = 1;
  o.order = fx_order, o.order_len = 4;
  o.pool = f->pool;
  return graphed_call(f, &o);
}

static gcap_status graphed_hooks(fx *f) {
  static const gcap_capture_hook fns[1] = {count_hook};
  void *const uds[1] = {f};
  gcap_capture_hooks h[2];
  gcap_graphed_opts o;
  memset(h, 0, sizeof h);
  for (int c = 0; c < 2; c++)
    for (int k = 0; k < 4; k++)
      h[c].n[k] = 1, h[c].fn[k] = fns, h[c].ud[k] = uds;
  gcap_graphed_opts_init(&o);
  o.num_warmup_iters = 1;
  o.capture_time_hooks = h, o.num_capture_time_hooks = 2;
  o.pool = f->pool;
  return graphed_call(f, &o);
}

static gcap_status graphed_reuse(fx *f) {
  gcap_graphed_opts o;
  gcap_graphed_opts_init(&o);
  o.num_warmup_iters = 1;
  o.order = fx_order, o.order_len = 4;
  o.reuse_graph_input_output_buffers = 1;
  o.pool = f->pool;
  return graphed_call(f, &o);
}

static void test_fault_graphed(void) {
  fx_run("make_graphed_callables", graphed_plain, graphed_undo, 1);
}
static void test_fault_graphed_order(void) {
  fx_run("make_graphed_callables with order", graphed_order, graphed_undo, 1);
}
static void test_fault_graphed_hooks(void) {
  fx_run("make_graphed_callables with capture_time_hooks", graphed_hooks, graphed_undo, 1);
}
/* Parameter grads that are the static grad buffers themselves (as TE's). */
static gcap_status graphed_noclone(fx *f) {
  gcap_graphed_opts o;
  gcap_graphed_opts_init(&o);
  o.num_warmup_iters = 1;
  o.clone_param_grads_on_return = 0;
  o.pool = f->pool;
  return graphed_call(f, &o);
}

static void test_fault_graphed_noclone(void) {
  fx_run("make_graphed_callables without cloned grads", graphed_noclone, graphed_undo, 1);
}

static void test_fault_graphed_reuse(void) {
  fx_run("make_graphed_callables reusing buffers", graphed_reuse, graphed_undo, 1);
}

/* ---- a training step: forward, backward, Adam ------------------------- */

static gcap_status train_call(fx *f) {
  gcap_tensor *h = NULL, *y = NULL, *l = NULL;
  gcap_status st;
  f->phase = "module_call";
  st = gcap_module_call(f->seq, 1, &f->x, &h);
  if (st == GCAP_OK) st = gcap_module_call(f->l2, 1, &h, &y);
  if (st == GCAP_OK) f->phase = "mse_loss", st = gcap_mse_loss(y, f->target, &l);
  if (st == GCAP_OK) f->phase = "backward", st = gcap_backward(l, NULL, 0);
  if (st != GCAP_OK) snprintf(f->why, sizeof f->why, "%s", gcap_errmsg(f->e));
  gcap_tensor_free(h), gcap_tensor_free(y), gcap_tensor_free(l);
  if (st == GCAP_OK) f->phase = "optim_step", st = gcap_optim_step(f->opt);
  return st;
}

static void train_undo(fx *f) {
  gcap_optim_zero_grad(f->opt, 1);
}

static void test_fault_training_step(void) {
  fx_run("training step", train_call, train_undo, 0);
}

/* ---- the replay-order check's record of who wrote what ------------------ */

/* In one pool: w writes v, r reads v (expecting w's values), o overwrites
** v; nothing replayed yet, so the record of real writes is empty. */
typedef struct rc {
  gcap_engine *e;
  gcap_pool *p;
  gcap_graph *w, *o, *r;
  gcap_tensor *x, *v, *z;
} rc;

static int rc_open(rc *c) {
  const int64_t s[1] = {4};
  memset(c, 0, sizeof *c);
  if ((c->e = t_engine()) == NULL) return 0;
  gcap_engine *e = c->e;
  return gcap_tensor_rand(e, GCAP_F32, 1, s, 1, &c->x) == GCAP_OK &&
         gcap_pool_new(e, &c->p) == GCAP_OK && gcap_graph_new(e, &c->w) == GCAP_OK &&
         gcap_graph_new(e, &c->o) == GCAP_OK && gcap_graph_new(e, &c->r) == GCAP_OK &&
         gcap_capture_begin(c->w, c->p, NULL) == GCAP_OK &&
         gcap_scale(c->x, 2.0, &c->v) == GCAP_OK && gcap_capture_end(c->w) == GCAP_OK &&
         gcap_capture_begin(c->r, c->p, NULL) == GCAP_OK &&
         gcap_scale(c->v, 2.0, &c->z) == GCAP_OK && gcap_capture_end(c->r) == GCAP_OK &&
         gcap_capture_begin(c->o, c->p, NULL) == GCAP_OK && gcap_fill_(c->v, 0.0) == GCAP_OK &&
         gcap_capture_end(c->o) == GCAP_OK;
}

static void rc_close(rc *c) {
  gcap_tensor_free(c->x), gcap_tensor_free(c->v), gcap_tensor_free(c->z);
  gcap_graph_free(c->w), gcap_graph_free(c->o), gcap_graph_free(c->r);
  gcap_pool_free(c->p);
  gcap_engine_free(c->e);
}

/* o's first replay, with the N-th allocation failing: it either fails and
** then works, or works; either way o overwrote what r reads, and r's replay
** is refused. */
static void test_fault_replay_record(void) {
  long n;
  for (n = 1; n < 1000; n++) {
    rc c;
    if (!rc_open(&c)) {
      T_FAILF("rc_open", "N=%ld: %s", n, c.e ? gcap_errmsg(c.e) : gcap_last_open_error());
      if (c.e) rc_close(&c);
      return;
    }
    gcap_test_fail_alloc(n);
    gcap_status st = gcap_graph_replay(c.o);
    int injected = (int)gcap_test_fail_alloc(0);
    if (st != GCAP_OK) {
      T_CHECK(gcap_errmsg(c.e)[0] != '\0');
      T_CHECK_ST(c.e, gcap_graph_replay(c.o), GCAP_OK);
    }
    if (gcap_graph_replay(c.r) != GCAP_EREPLAY)
      T_FAILF("replay of r", "N=%ld (%s): r replayed over what o overwrote", n,
              injected ? "a failure injected" : "nothing injected");
    rc_close(&c);
    fx_total += injected;
    if (!injected) break;
  }
  T_CHECK(n > 1);
}

/* Teardown of the whole file: report how many failures were injected. */
static void test_fault_total(void) {
  printf("# %ld allocation failures injected; %ld successful calls' results compared with a "
         "clean call's\n",
         fx_total, fx_checked);
  T_CHECK(fx_total > 0);
}

int main(void) {
  T_RUN(test_fault_manual_capture);
  T_RUN(test_fault_graphed);
  T_RUN(test_fault_graphed_order);
  T_RUN(test_fault_graphed_hooks);
  T_RUN(test_fault_graphed_reuse);
  T_RUN(test_fault_graphed_noclone);
  T_RUN(test_fault_training_step);
  T_RUN(test_fault_replay_record);
  T_RUN(test_fault_total);
  return t_done();
}
