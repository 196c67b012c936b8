/*
** test_multiout.c: modules of several outputs through the C API. A module
** whose forward (gcap_forward_n_fn) gives relu(h), an absent output, gelu(h)
** and h detached, h = Linear(x), is called eagerly (gcap_module_call_n) and
** graphed: each output that requires grad gets a static grad buffer, the one
** that requires none gets none, the absent one comes back NULL, and one
** backward over a loss of several outputs equals the eager one bit for bit,
** also when only one output's grad arrives, with a pipeline order and
** reuse_graph_input_output_buffers, and with delayed wgrad.
*/
#include "t.h"

#define ROWS 3
#define IN 4
#define OUT 5
#define NOUT 4

static const int64_t xshape[2] = {ROWS, IN}, yshape[2] = {ROWS, OUT};

#define MAXE 8 /* entries at most */

/* Deterministic values, different per phase. */
static void fill(float *v, int n, double phase) {
  int i;
  for (i = 0; i < n; i++)
    v[i] = (float)sin(0.37 * i + phase) * 1.5f;
}

/* A new leaf that requires grad: shape {ROWS, IN}, values of `phase`. */
static gcap_tensor *input(gcap_engine *e, double phase) {
  float v[ROWS * IN];
  gcap_tensor *t;
  fill(v, ROWS * IN, phase);
  t = t_from(e, 2, xshape, v);
  if (t != NULL && gcap_tensor_set_requires_grad(t, 1) != GCAP_OK) {
    gcap_tensor_free(t);
    return NULL;
  }
  return t;
}

/* relu(h), absent, gelu(h), h detached; h = child 'lin' of m on in[0]. */
static gcap_status multi_forward(void *ud, gcap_module *m, int nin, gcap_tensor *const *in,
                                 int *nout, gcap_tensor **out) {
  gcap_tensor *h = NULL;
  gcap_status st;
  int k;
  (void)ud;
  if (nin != 1) return GCAP_EINVAL;
  for (k = 0; k < NOUT; k++)
    out[k] = NULL;
  if ((st = gcap_module_call(gcap_module_child(m, 0, NULL), 1, in, &h)) == GCAP_OK &&
      (st = gcap_relu(h, &out[0])) == GCAP_OK && (st = gcap_gelu(h, &out[2])) == GCAP_OK)
    st = gcap_tensor_detach(h, &out[3]);
  gcap_tensor_free(h);
  if (st != GCAP_OK) {
    for (k = 0; k < NOUT; k++)
      gcap_tensor_free(out[k]);
    return st;
  }
  *nout = NOUT;
  return GCAP_OK;
}

/* A Multi whose Linear(IN, OUT) has weights of seed 5 (flags: its wgrad). */
static gcap_status multi_new(gcap_engine *e, unsigned flags, gcap_module **m) {
  gcap_module *lin = NULL;
  gcap_status st;
  *m = NULL;
  if ((st = gcap_manual_seed(e, 5)) != GCAP_OK ||
      (st = gcap_nn_linear(e, IN, OUT, 1, flags, &lin)) != GCAP_OK)
    return st;
  if ((st = gcap_module_new_n(e, "Multi", multi_forward, NULL, NULL, m)) == GCAP_OK)
    st = gcap_module_add_child(*m, "lin", lin);
  gcap_module_free(lin);
  return st;
}

/* The loss of outputs o: sum(o[0]) (when `both`) + sum(o[2] * c). */
static gcap_status loss(gcap_tensor *const *o, gcap_tensor *c, int both, gcap_tensor **out) {
  gcap_tensor *a = NULL, *p = NULL, *s = NULL;
  gcap_status st;
  *out = NULL;
  if ((st = gcap_mul(o[2], c, &p)) == GCAP_OK && (st = gcap_sum(p, &s)) == GCAP_OK) {
    if (!both) {
      *out = s;
      s = NULL;
    } else if ((st = gcap_sum(o[0], &a)) == GCAP_OK)
      st = gcap_add(a, s, out);
  }
  gcap_tensor_free(a);
  gcap_tensor_free(p);
  gcap_tensor_free(s);
  return st;
}

/* a and b hold the same values, compared with == (NULL both or neither). */
static int same_values(gcap_tensor *a, gcap_tensor *b) {
  float va[64], vb[64];
  int64_t n, i;
  if (a == NULL || b == NULL) return a == b;
  n = gcap_tensor_numel(a);
  if (n != gcap_tensor_numel(b) || n > 64 || !t_read(a, va, (size_t)n) || !t_read(b, vb, (size_t)n))
    return 0;
  for (i = 0; i < n; i++)
    if (!(va[i] == vb[i])) return 0;
  return 1;
}

static void outs_free(gcap_tensor **o, int n) {
  int k;
  for (k = 0; k < n; k++) {
    gcap_tensor_free(o[k]);
    o[k] = NULL;
  }
}

/* A forward that claims more outputs than there may be. */
static gcap_status too_many(void *ud, gcap_module *m, int nin, gcap_tensor *const *in, int *nout,
                            gcap_tensor **out) {
  (void)ud, (void)m, (void)nin, (void)in, (void)out;
  *nout = GCAP_MAX_OUTPUTS + 1;
  return GCAP_OK;
}

/* A forward that fails after writing a count: the count is not trusted. */
static gcap_status fails(void *ud, gcap_module *m, int nin, gcap_tensor *const *in, int *nout,
                         gcap_tensor **out) {
  (void)ud, (void)m, (void)nin, (void)in, (void)out;
  *nout = 3;
  return GCAP_EABORTED;
}

/* Bad forwards and bad arguments: errors, nothing returned. */
static void test_bad_forwards(void) {
  gcap_engine *e = t_engine();
  gcap_module *a = NULL, *b = NULL;
  gcap_tensor *x = NULL, *o[4] = {NULL};
  int n = -1;
  if (e == NULL) return;
  T_SETUP(gcap_module_new_n(e, "TooMany", too_many, NULL, NULL, &a) == GCAP_OK &&
              gcap_module_new_n(e, "Fails", fails, NULL, NULL, &b) == GCAP_OK &&
              (x = input(e, 0)) != NULL,
          (gcap_module_free(a), gcap_module_free(b), gcap_engine_free(e)));
  T_CHECK_ST(e, gcap_module_call_n(a, 1, &x, 4, &n, o), GCAP_EINVAL);
  T_CHECK(n == 0 && t_msg_has(e, "TooMany: forward gave 65 outputs; expected 0..64"));
  T_CHECK_ST(e, gcap_module_call_n(b, 1, &x, 4, &n, o), GCAP_EABORTED);
  T_CHECK(n == 0);
  T_CHECK_ST(e, gcap_module_call_n(b, 1, &x, 4, NULL, o), GCAP_EINVAL);
  T_CHECK_ST(e, gcap_module_call_n(b, 1, &x, 4, &n, NULL), GCAP_EINVAL);
  T_CHECK_ST(e, gcap_module_call_n(NULL, 1, &x, 4, &n, o), GCAP_EINVAL);
  T_CHECK_ST(e, gcap_module_call_n(b, 1, &x, -1, &n, o), GCAP_EINVAL);
  gcap_module_free(a);
  T_CHECK_ST(e, gcap_module_new_n(e, "NoForward", NULL, NULL, NULL, &a), GCAP_EINVAL);
  T_CHECK(a == NULL);
  gcap_tensor_free(x);
  gcap_module_free(b);
  gcap_engine_free(e);
}

static void test_eager_outputs(void) {
  gcap_engine *e = t_engine();
  gcap_module *m = NULL;
  gcap_tensor *x = NULL, *o[8] = {NULL}, *y = NULL;
  int n = -1;
  if (e == NULL) return;
  T_SETUP(multi_new(e, 0, &m) == GCAP_OK && (x = input(e, 0)) != NULL,
          (gcap_module_free(m), gcap_engine_free(e)));
  T_CHECK_ST(e, gcap_module_call_n(m, 1, &x, 8, &n, o), GCAP_OK);
  T_CHECK(n == NOUT && o[0] && !o[1] && o[2] && o[3]);
  T_CHECK(gcap_tensor_requires_grad(o[0]) && gcap_tensor_requires_grad(o[2]));
  T_CHECK(!gcap_tensor_requires_grad(o[3]));
  outs_free(o, 8);
  /* one tensor taken: refused, naming the count */
  T_CHECK_ST(e, gcap_module_call(m, 1, &x, &y), GCAP_EINVAL);
  T_CHECK(y == NULL && t_msg_has(e, "Multi: forward gave 4 outputs") &&
          t_msg_has(e, "gcap_module_call_n"));
  T_CHECK_ST(e, gcap_module_call_n(m, 1, &x, 2, &n, o), GCAP_EINVAL);
  T_CHECK(n == 0 && t_msg_has(e, "room for 2"));
  T_CHECK_ST(e, gcap_module_call_n(m, 1, &x, 8, &n, o), GCAP_OK); /* still usable */
  T_CHECK(n == NOUT);
  outs_free(o, 8);
  gcap_tensor_free(x);
  gcap_module_free(m);
  gcap_engine_free(e);
}

/* A schedule run twice, graphed and eager: `order` (NULL: two steps of one
** callable, graphed in place and called as a module), nchunks callables x
** mbs microbatches, Linear flags, reuse, and losses over both grad outputs
** or (both = 0) over gelu(h) only after the first forward. Each forward
** gets its own slot of inputs and losses. */
typedef struct run_spec {
  const double *order;
  int len, nchunks, mbs;
  unsigned flags;
  int reuse, both;
} run_spec;

typedef struct run_state {
  gcap_engine *e;
  gcap_module *mg[2], *me[2];
  gcap_graphed *G;
  gcap_tensor *c, *xg[MAXE], *xe[MAXE], *lg[MAXE], *le[MAXE];
} run_state;

static void run_free(run_state *r) {
  int k;
  for (k = 0; k < MAXE; k++) {
    gcap_tensor_free(r->xg[k]);
    gcap_tensor_free(r->xe[k]);
    gcap_tensor_free(r->lg[k]);
    gcap_tensor_free(r->le[k]);
  }
  for (k = 0; k < 2; k++) {
    gcap_module_free(r->mg[k]);
    gcap_module_free(r->me[k]);
  }
  gcap_tensor_free(r->c);
  gcap_graphed_free(r->G);
  gcap_engine_free(r->e);
}

/* The forward of entry `entry` (chunk k) into slot i: both calls, outputs
** compared, losses kept. */
static void run_fwd(run_state *r, const run_spec *sp, int k, int entry, int i) {
  int both = sp->both || i == 0;
  gcap_tensor *og[8] = {NULL}, *oe[8] = {NULL};
  int ng = -1, ne = -1, j;
  T_REQUIRE((r->xg[i] = input(r->e, i + 1)) != NULL && (r->xe[i] = input(r->e, i + 1)) != NULL);
  if (sp->order)
    T_CHECK_OK(r->e, gcap_graphed_call_n(r->G, entry, 1, &r->xg[i], 8, &ng, og));
  else
    T_CHECK_OK(r->e, gcap_module_call_n(r->mg[k], 1, &r->xg[i], 8, &ng, og));
  T_CHECK_OK(r->e, gcap_module_call_n(r->me[k], 1, &r->xe[i], 8, &ne, oe));
  T_CHECK(ng == NOUT && ne == NOUT && og[1] == NULL);
  for (j = 0; j < NOUT; j++)
    if (!same_values(og[j], oe[j]))
      T_FAILF("output", "entry %d, output %d differs", entry + 1, j + 1);
  T_CHECK(!gcap_tensor_requires_grad(og[3]) && gcap_tensor_requires_grad(og[0]));
  T_CHECK_OK(r->e, loss(og, r->c, both, &r->lg[i]));
  T_CHECK_OK(r->e, loss(oe, r->c, both, &r->le[i]));
  outs_free(og, 8);
  outs_free(oe, 8);
}

static void run_schedule(const run_spec *sp) {
  static const double plain[4] = {1, -1, 1, -1};
  const double *order = sp->order ? sp->order : plain;
  int len = sp->order ? sp->len : 4, nent = sp->nchunks * sp->mbs;
  int nf[2] = {0, 0}, nb[2] = {0, 0}, nd[2] = {0, 0}, slot[2][MAXE], nslots = 0;
  int nargs[MAXE], i, k, p;
  gcap_tensor *samples[MAXE] = {NULL}, *const * args[MAXE];
  gcap_graphed_opts o;
  gcap_graphed_stats stats;
  float cv[ROWS * OUT];
  run_state r;
  memset(&r, 0, sizeof r);
  if ((r.e = t_engine()) == NULL) return;
  fill(cv, ROWS * OUT, 9);
  for (k = 0; k < sp->nchunks; k++)
    T_SETUP(multi_new(r.e, sp->flags, &r.mg[k]) == GCAP_OK &&
                multi_new(r.e, sp->flags, &r.me[k]) == GCAP_OK,
            run_free(&r));
  T_SETUP((r.c = t_from(r.e, 2, yshape, cv)) != NULL, run_free(&r));
  for (i = 0; i < nent; i++) {
    samples[i] = input(r.e, 20 + i);
    args[i] = &samples[i];
    nargs[i] = 1;
  }
  gcap_graphed_opts_init(&o);
  o.num_warmup_iters = 2;
  o.order = sp->order;
  o.order_len = sp->order ? sp->len : 0;
  o.reuse_graph_input_output_buffers = sp->reuse;
  T_CHECK_ST(r.e, gcap_make_graphed_callables(r.e, sp->nchunks, r.mg, nent, nargs, args, &o, &r.G),
             GCAP_OK);
  for (i = 0; i < nent; i++)
    gcap_tensor_free(samples[i]);
  if (r.G == NULL) {
    run_free(&r);
    return;
  }
  T_CHECK(gcap_graphed_num_outputs(r.G, 0) == NOUT && gcap_graphed_num_outputs(r.G, nent) == -1);
  T_CHECK_ST(r.e, gcap_graphed_get_stats(r.G, 0, &stats), GCAP_OK);
  T_CHECK(stats.num_outputs == NOUT && stats.num_grad_outputs == 2); /* not the detached one */
  for (p = 0; p < len && !t_bad; p++) {
    double v = order[p];
    k = (int)fabs(v) - 1;
    if (v > 0) { /* forward of chunk k, its next microbatch */
      slot[k][nf[k]] = nslots;
      run_fwd(&r, sp, k, k * sp->mbs + nf[k]++ % sp->mbs, nslots++);
    } else if (fabs(v) == floor(fabs(v))) { /* backward of its oldest forward */
      i = slot[k][nb[k]++];
      T_CHECK_OK(r.e, gcap_backward(r.lg[i], NULL, 0));
      T_CHECK_OK(r.e, gcap_backward(r.le[i], NULL, 0));
      if (!same_values(gcap_tensor_grad(r.xg[i]), gcap_tensor_grad(r.xe[i])))
        T_FAILF("input grad", "entry %d: the input grads differ", i + 1);
    } else { /* delayed wgrad */
      i = k * sp->mbs + nd[k]++ % sp->mbs;
      T_CHECK_OK(r.e, gcap_graphed_backward_dw(r.G, i));
      T_CHECK_OK(r.e, gcap_module_backward_dw(r.me[k]));
    }
  }
  for (k = 0; k < sp->nchunks; k++)
    for (i = 0; i < gcap_module_num_parameters(r.mg[k]); i++) {
      gcap_tensor *pg = gcap_module_parameter(r.mg[k], i, NULL, 0);
      gcap_tensor *pe = gcap_module_parameter(r.me[k], i, NULL, 0);
      T_CHECK(gcap_tensor_grad(pe) != NULL);
      if (!same_values(gcap_tensor_grad(pg), gcap_tensor_grad(pe)))
        T_FAILF("param grad", "chunk %d, parameter %d: the grads differ", k + 1, i + 1);
    }
  run_free(&r);
}

/* No order: the module graphed in place replays its four outputs. */
static void test_graphed_equals_eager(void) {
  run_spec sp = {NULL, 0, 1, 1, 0, 0, 1};
  run_schedule(&sp);
}

/* A grad for gelu(h) only (after a step with both): relu(h)'s static grad
** is zeros again, as TE's. */
static void test_one_grad_arrives(void) {
  run_spec sp = {NULL, 0, 1, 1, 0, 0, 0};
  run_schedule(&sp);
}

/* 2 chunks x 2 microbatches in a pipeline order, static buffers reused. */
static void test_order_reuse(void) {
  static const double order[] = {1, 2, -2, 1, -1, 2, -2, -1};
  run_spec sp = {order, 8, 2, 2, 0, 1, 1};
  run_schedule(&sp);
}

/* Delayed wgrad in the order, after each backward. */
static void test_delayed_wgrad(void) {
  static const double order[] = {1, 2, -2, -2.5, -1, -1.5};
  run_spec sp = {order, 6, 2, 1, GCAP_LINEAR_DELAY_WGRAD, 0, 1};
  run_schedule(&sp);
}

/* gcap_graphed_call takes one output: an entry of four is refused, and
** room for fewer outputs than the entry has is refused. */
static void test_one_output_call_refused(void) {
  gcap_engine *e = t_engine();
  gcap_module *m = NULL;
  gcap_tensor *x = NULL, *y = NULL, *o[2] = {NULL};
  gcap_tensor *const *args[1];
  gcap_graphed *G = NULL;
  int nargs = 1, n = -1;
  if (e == NULL) return;
  T_SETUP(multi_new(e, 0, &m) == GCAP_OK && (x = input(e, 0)) != NULL,
          (gcap_module_free(m), gcap_engine_free(e)));
  args[0] = &x;
  T_CHECK_ST(e, gcap_make_graphed_callables(e, 1, &m, 1, &nargs, args, NULL, &G), GCAP_OK);
  if (G != NULL) {
    T_CHECK_ST(e, gcap_graphed_call(G, 0, 1, &x, &y), GCAP_EINVAL);
    T_CHECK(y == NULL && t_msg_has(e, "it has 4 outputs, room for 1") &&
            t_msg_has(e, "gcap_graphed_call_n"));
    T_CHECK_ST(e, gcap_graphed_call_n(G, 0, 1, &x, 2, &n, o), GCAP_EINVAL);
    T_CHECK(n == 0 && o[0] == NULL);
    T_CHECK_ST(e, gcap_module_call(m, 1, &x, &y), GCAP_EINVAL); /* routed: the same */
  }
  gcap_graphed_free(G);
  gcap_tensor_free(x);
  gcap_module_free(m);
  gcap_engine_free(e);
}

int main(void) {
  T_RUN(test_eager_outputs);
  T_RUN(test_bad_forwards);
  T_RUN(test_graphed_equals_eager);
  T_RUN(test_one_grad_arrives);
  T_RUN(test_order_reuse);
  T_RUN(test_delayed_wgrad);
  T_RUN(test_one_output_call_refused);
  return t_done();
}
