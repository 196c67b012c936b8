/*
** test_multi_hooks.c: module hooks on a call of several inputs and outputs,
** as PyTorch's full hooks: a module Pair(x, z) gives x * z, an absent
** output, gelu(x) and x detached. A forward hook sees the four outputs and
** may replace them whole; a backward pre-hook is given the grads of the
** three tensor outputs at once (NULL for the detached one) and may replace
** them; a backward hook is given the grads of both inputs and may replace
** them. Replaced grads are compared bit for bit with the hook-free ones
** (scaling by 2 is exact); returns of the wrong count, shape or kind, or a
** grad for what needs none, fail with a message naming the module, the hook
** kind and the entry, and the module works afterwards.
*/
#include "t.h"

#define ROWS 2
#define COLS 3
#define N (ROWS * COLS)

static const int64_t shape[2] = {ROWS, COLS};

/* x * z, absent, gelu(x), x detached */
static gcap_status pair_forward(void *ud, gcap_module *m, int nin, gcap_tensor *const *in,
                                int *nout, gcap_tensor **out) {
  gcap_status st;
  (void)ud, (void)m;
  if (nin != 2) return GCAP_EINVAL;
  out[0] = out[1] = out[2] = out[3] = NULL;
  if ((st = gcap_mul(in[0], in[1], &out[0])) != GCAP_OK ||
      (st = gcap_gelu(in[0], &out[2])) != GCAP_OK ||
      (st = gcap_tensor_detach(in[0], &out[3])) != GCAP_OK) {
    gcap_tensor_free(out[0]);
    gcap_tensor_free(out[2]);
    return st;
  }
  *nout = 4;
  return GCAP_OK;
}

typedef struct fx {
  gcap_engine *e;
  gcap_module *m;
  gcap_tensor *x, *z, *c; /* inputs; c: the loss's weights */
} fx;

static gcap_tensor *values(gcap_engine *e, double phase, int grad) {
  float v[N];
  gcap_tensor *t;
  int i;
  for (i = 0; i < N; i++)
    v[i] = (float)(1.3 * sin(0.9 * i + phase));
  t = t_from(e, 2, shape, v);
  if (t != NULL && gcap_tensor_set_requires_grad(t, grad) != GCAP_OK) {
    gcap_tensor_free(t);
    return NULL;
  }
  return t;
}

static int fx_open(fx *f, int z_grad) {
  memset(f, 0, sizeof *f);
  return (f->e = t_engine()) != NULL &&
         gcap_module_new_n(f->e, "Pair", pair_forward, NULL, NULL, &f->m) == GCAP_OK &&
         (f->x = values(f->e, 0.2, 1)) != NULL && (f->z = values(f->e, 1.1, z_grad)) != NULL &&
         (f->c = values(f->e, 2.3, 0)) != NULL;
}

static void fx_close(fx *f) {
  gcap_tensor_free(f->x);
  gcap_tensor_free(f->z);
  gcap_tensor_free(f->c);
  gcap_module_free(f->m);
  gcap_engine_free(f->e);
}

/* The call's outputs o[4] and the loss sum(o[0] * c) (+ sum(o[2]) when
** `both`), backward; *n: the count of outputs. */
static gcap_status call_bwd(fx *f, int both, gcap_tensor **o, int *n) {
  gcap_tensor *in[2] = {f->x, f->z}, *p = NULL, *s = NULL, *g = NULL, *l = NULL;
  gcap_status st = gcap_module_call_n(f->m, 2, in, 4, n, o);
  if (st == GCAP_OK) st = gcap_mul(o[0], f->c, &p);
  if (st == GCAP_OK) st = gcap_sum(p, &s);
  if (st == GCAP_OK && both) st = gcap_sum(o[2], &g);
  if (st == GCAP_OK && both) st = gcap_add(s, g, &l);
  if (st == GCAP_OK) st = gcap_backward(both ? l : s, NULL, 0);
  gcap_tensor_free(p);
  gcap_tensor_free(s);
  gcap_tensor_free(g);
  gcap_tensor_free(l);
  return st;
}

static void outs_free(gcap_tensor **o, int n) {
  int k;
  for (k = 0; k < n; k++)
    gcap_tensor_free(o[k]), o[k] = NULL;
}

/* Clones of the grads of x and z (NULL: none), then cleared. */
static int grads_of(fx *f, gcap_tensor **gx, gcap_tensor **gz) {
  gcap_tensor *a = gcap_tensor_grad(f->x), *b = gcap_tensor_grad(f->z);
  *gx = *gz = NULL;
  return (a == NULL || gcap_tensor_clone(a, gx) == GCAP_OK) &&
         (b == NULL || gcap_tensor_clone(b, gz) == GCAP_OK) &&
         gcap_tensor_set_grad(f->x, NULL) == GCAP_OK && gcap_tensor_set_grad(f->z, NULL) == GCAP_OK;
}

/* The grads of a hook-free call (loss with both outputs or not). */
static int reference(fx *f, int both, gcap_tensor **gx, gcap_tensor **gz) {
  gcap_tensor *o[4] = {NULL};
  int n = 0, ok = call_bwd(f, both, o, &n) == GCAP_OK && grads_of(f, gx, gz);
  outs_free(o, n);
  return ok;
}

/* a == k * b bit for bit (NULL both or neither). */
static int scaled_bits(gcap_tensor *a, gcap_tensor *b, float k) {
  float va[N], vb[N];
  int i;
  if (a == NULL || b == NULL) return a == b;
  if (!t_read(a, va, N) || !t_read(b, vb, N)) return 0;
  for (i = 0; i < N; i++) {
    float want = k * vb[i];
    if (memcmp(&va[i], &want, sizeof want) != 0) return 0;
  }
  return 1;
}

/* A hook that records what it is given and returns, by kind, ret[0..nret)
** (nret < 0: nothing); scale != 0: 2 * the grads it is given instead, with
** drop[i] set: NULL in place of grad i. */
typedef struct rec_hook {
  int calls, n;
  gcap_tensor *seen[8]; /* clones of what it was given (NULL where NULL) */
  gcap_tensor *const *given_out;
  int nret;
  gcap_tensor *ret[8];
  int scale;
  int drop[8];
} rec_hook;

static gcap_status rec_fn(void *ud, gcap_module *m, const gcap_hook_args *a) {
  rec_hook *h = (rec_hook *)ud;
  gcap_tensor *const *v = a->kind == GCAP_HOOK_FORWARD        ? a->out
                          : a->kind == GCAP_HOOK_BACKWARD_PRE ? a->grad_out
                                                              : a->grad_in;
  int n = a->kind == GCAP_HOOK_FORWARD        ? a->nout
          : a->kind == GCAP_HOOK_BACKWARD_PRE ? a->ngrad_out
                                              : a->ngrad_in;
  gcap_tensor *r[8] = {NULL};
  gcap_status st = GCAP_OK;
  int i;
  (void)m;
  h->calls++;
  h->n = n;
  h->given_out = a->grad_out;
  for (i = 0; i < n && i < 8; i++) {
    gcap_tensor_free(h->seen[i]), h->seen[i] = NULL;
    if (v[i] != NULL && (st = gcap_tensor_clone(v[i], &h->seen[i])) != GCAP_OK) return st;
  }
  if (h->scale) {
    for (i = 0; i < n && st == GCAP_OK; i++)
      if (v[i] != NULL && !h->drop[i]) st = gcap_scale(v[i], 2.0, &r[i]);
    if (st == GCAP_OK) st = gcap_hook_return(a, n, r);
    for (i = 0; i < n; i++)
      gcap_tensor_free(r[i]);
    return st;
  }
  return h->nret < 0 ? GCAP_OK : gcap_hook_return(a, h->nret, h->ret);
}

static void rec_free(rec_hook *h) {
  int i;
  for (i = 0; i < 8; i++)
    gcap_tensor_free(h->seen[i]);
}

static gcap_status add(fx *f, gcap_hook_kind k, rec_hook *h, int *id) {
  return gcap_module_register_hook(f->m, k, rec_fn, h, NULL, id);
}

/* A forward hook sees the four outputs (NULL for the absent one) and its
** return, of another count, is what the call gives. */
static void test_forward_hook_outputs(void) {
  fx f;
  rec_hook h = {0};
  gcap_tensor *o[4] = {NULL}, *in[2];
  int n = -1;
  T_SETUP(fx_open(&f, 1), fx_close(&f));
  in[0] = f.x, in[1] = f.z;
  h.nret = -1;
  T_CHECK_OK(f.e, add(&f, GCAP_HOOK_FORWARD, &h, NULL));
  T_CHECK_OK(f.e, gcap_module_call_n(f.m, 2, in, 4, &n, o));
  T_CHECK(h.calls == 1 && h.n == 4 && h.seen[0] && !h.seen[1] && h.seen[2] && h.seen[3]);
  T_CHECK(n == 4 && scaled_bits(o[0], h.seen[0], 1.0f) && o[1] == NULL);
  /* replaced whole: (gelu(x), absent) */
  h.nret = 2;
  h.ret[0] = o[2];
  h.ret[1] = NULL;
  {
    gcap_tensor *p[4] = {NULL};
    int np = -1;
    T_CHECK_OK(f.e, gcap_module_call_n(f.m, 2, in, 4, &np, p));
    T_CHECK(np == 2 && p[0] == o[2] && p[1] == NULL);
    outs_free(p, np > 0 ? np : 0);
    /* more than the caller has room for */
    T_CHECK_ST(f.e, gcap_module_call_n(f.m, 2, in, 1, &np, p), GCAP_EINVAL);
    T_CHECK(np == 0 && t_msg_has(f.e, "Pair: a forward hook returned 2 outputs, room for 1"));
  }
  outs_free(o, 4);
  rec_free(&h);
  fx_close(&f);
}

/* The backward pre-hook gets the grads of the three tensor outputs at once
** (NULL for the detached one); doubling them doubles every grad; returning
** NULL for gelu(x)'s drops its share; the backward hook is given the grads
** the pre-hook left. */
static void test_backward_pre_hook(void) {
  fx f;
  rec_hook pre = {0}, bw = {0};
  gcap_tensor *gx = NULL, *gz = NULL, *gx1 = NULL, *gz1 = NULL, *o[4] = {NULL}, *hx, *hz;
  int n = 0;
  T_SETUP(fx_open(&f, 1), fx_close(&f));
  T_CHECK(reference(&f, 1, &gx, &gz) && reference(&f, 0, &gx1, &gz1));
  pre.scale = 1;
  bw.nret = -1;
  T_CHECK_OK(f.e, add(&f, GCAP_HOOK_BACKWARD_PRE, &pre, NULL));
  T_CHECK_OK(f.e, add(&f, GCAP_HOOK_BACKWARD, &bw, NULL));
  T_CHECK_OK(f.e, call_bwd(&f, 1, o, &n));
  outs_free(o, n);
  T_CHECK(pre.calls == 1 && pre.n == 3 && pre.seen[0] && pre.seen[1] && !pre.seen[2]);
  T_CHECK(bw.calls == 1 && bw.n == 2);
  T_CHECK(scaled_bits(gcap_tensor_grad(f.x), gx, 2.0f));
  T_CHECK(scaled_bits(gcap_tensor_grad(f.z), gz, 2.0f));
  /* what the backward hook got as grad_in is what x and z get */
  T_CHECK(scaled_bits(bw.seen[0], gcap_tensor_grad(f.x), 1.0f));
  T_CHECK(scaled_bits(bw.seen[1], gcap_tensor_grad(f.z), 1.0f));
  T_CHECK(grads_of(&f, &hx, &hz));
  gcap_tensor_free(hx), gcap_tensor_free(hz);
  /* gelu(x)'s grad dropped: the grads of the loss without it, doubled */
  pre.drop[1] = 1;
  T_CHECK_OK(f.e, call_bwd(&f, 1, o, &n));
  outs_free(o, n);
  T_CHECK(scaled_bits(gcap_tensor_grad(f.x), gx1, 2.0f));
  T_CHECK(scaled_bits(gcap_tensor_grad(f.z), gz1, 2.0f));
  gcap_tensor_free(gx), gcap_tensor_free(gz), gcap_tensor_free(gx1), gcap_tensor_free(gz1);
  rec_free(&pre);
  rec_free(&bw);
  fx_close(&f);
}

/* The backward hook gets the grads of both inputs and replaces each:
** doubled x's, NULL for z's (z then gets none). */
static void test_backward_hook_all_inputs(void) {
  fx f;
  rec_hook bw = {0};
  gcap_tensor *gx = NULL, *gz = NULL, *o[4] = {NULL};
  int n = 0;
  T_SETUP(fx_open(&f, 1), fx_close(&f));
  T_CHECK(reference(&f, 1, &gx, &gz));
  bw.scale = 1;
  bw.drop[1] = 1;
  T_CHECK_OK(f.e, add(&f, GCAP_HOOK_BACKWARD, &bw, NULL));
  T_CHECK_OK(f.e, call_bwd(&f, 1, o, &n));
  outs_free(o, n);
  T_CHECK(bw.calls == 1 && bw.n == 2);
  T_CHECK(scaled_bits(bw.seen[0], gx, 1.0f) && scaled_bits(bw.seen[1], gz, 1.0f));
  T_CHECK(scaled_bits(gcap_tensor_grad(f.x), gx, 2.0f));
  T_CHECK(gcap_tensor_grad(f.z) == NULL);
  gcap_tensor_free(gx), gcap_tensor_free(gz);
  rec_free(&bw);
  fx_close(&f);
}

/* z needs no grad: the backward hook is given NULL for it. */
static void test_input_without_grad(void) {
  fx f;
  rec_hook bw = {0};
  gcap_tensor *gx = NULL, *gz = NULL, *o[4] = {NULL};
  int n = 0;
  T_SETUP(fx_open(&f, 0), fx_close(&f));
  T_CHECK(reference(&f, 1, &gx, &gz) && gz == NULL);
  bw.nret = -1;
  T_CHECK_OK(f.e, add(&f, GCAP_HOOK_BACKWARD, &bw, NULL));
  T_CHECK_OK(f.e, call_bwd(&f, 1, o, &n));
  outs_free(o, n);
  T_CHECK(bw.calls == 1 && bw.n == 2 && bw.seen[0] != NULL && bw.seen[1] == NULL);
  T_CHECK(scaled_bits(gcap_tensor_grad(f.x), gx, 1.0f));
  gcap_tensor_free(gx);
  rec_free(&bw);
  fx_close(&f);
}

/* The call (and backward) with a hook of kind k returning ret[0..nret)
** fails with GCAP_EINVAL, naming Pair, the kind and `what`; removed, the
** hook-free grads come back. */
static void refused(fx *f, gcap_hook_kind k, int nret, gcap_tensor *const *ret, const char *what) {
  rec_hook h = {0};
  gcap_tensor *o[4] = {NULL}, *gx = NULL, *gz = NULL, *hx = NULL, *hz = NULL;
  int n = 0, id = 0, i;
  T_CHECK(reference(f, 1, &gx, &gz));
  h.nret = nret;
  for (i = 0; i < nret; i++)
    h.ret[i] = ret[i];
  T_CHECK_OK(f->e, add(f, k, &h, &id));
  T_CHECK_ST(f->e, call_bwd(f, 1, o, &n), GCAP_EINVAL);
  outs_free(o, n), n = 0;
  if (!t_msg_has(f->e, "Pair: a ") || !t_msg_has(f->e, gcap_hook_kind_name(k)) ||
      !t_msg_has(f->e, what))
    T_FAILF("message", "'%s' should name Pair, the %s and '%s'", gcap_errmsg(f->e),
            gcap_hook_kind_name(k), what);
  T_CHECK_OK(f->e, gcap_module_remove_hook(f->m, id));
  T_CHECK(grads_of(f, &hx, &hz));
  gcap_tensor_free(hx), gcap_tensor_free(hz);
  T_CHECK_OK(f->e, call_bwd(f, 1, o, &n));
  outs_free(o, n);
  T_CHECK(scaled_bits(gcap_tensor_grad(f->x), gx, 1.0f));
  T_CHECK(scaled_bits(gcap_tensor_grad(f->z), gz, 1.0f));
  T_CHECK(grads_of(f, &hx, &hz));
  gcap_tensor_free(hx), gcap_tensor_free(hz);
  gcap_tensor_free(gx), gcap_tensor_free(gz);
  rec_free(&h);
}

static void test_wrong_returns(void) {
  fx f;
  gcap_tensor *ok = NULL, *small = NULL, *r[3];
  const int64_t one[1] = {COLS};
  T_SETUP(fx_open(&f, 0), fx_close(&f));
  T_SETUP((ok = values(f.e, 0.5, 0)) != NULL &&
              gcap_tensor_full(f.e, GCAP_F32, 1, one, 1.0, &small) == GCAP_OK,
          (gcap_tensor_free(ok), fx_close(&f)));
  r[0] = ok, r[1] = ok, r[2] = ok;
  refused(&f, GCAP_HOOK_BACKWARD_PRE, 1, r,
          "must return 3 grad_outputs (one per tensor output) or nothing, got 1");
  r[1] = small;
  refused(&f, GCAP_HOOK_BACKWARD_PRE, 3, r, "returned grad_output #2 of shape [3] f32; expected");
  r[1] = ok; /* the detached output takes none */
  refused(&f, GCAP_HOOK_BACKWARD_PRE, 3, r,
          "returned a tensor as grad_output #3, but tensor output #3 needs no grad");
  refused(&f, GCAP_HOOK_BACKWARD, 3, r,
          "must return 2 grad_inputs (one per input) or nothing, got 3");
  refused(&f, GCAP_HOOK_BACKWARD, 2, r, "grad_input #2, but input #2 needs no grad");
  r[0] = small;
  r[1] = NULL;
  refused(&f, GCAP_HOOK_BACKWARD, 2, r, "grad_input #1 of shape [3] f32; expected shape [2, 3]");
  gcap_tensor_free(ok);
  gcap_tensor_free(small);
  fx_close(&f);
}

/* A second backward over the same graph (retain_graph) gets fresh grads:
** the hooks run again and see this pass's grads, not the first's. */
static void test_two_backwards(void) {
  fx f;
  rec_hook bw = {0};
  gcap_tensor *in[2], *o[4] = {NULL}, *s = NULL, *gx = NULL, *gz = NULL;
  int n = 0;
  T_SETUP(fx_open(&f, 1), fx_close(&f));
  in[0] = f.x, in[1] = f.z;
  T_CHECK(reference(&f, 0, &gx, &gz));
  bw.nret = -1;
  T_CHECK_OK(f.e, add(&f, GCAP_HOOK_BACKWARD, &bw, NULL));
  T_CHECK_OK(f.e, gcap_module_call_n(f.m, 2, in, 4, &n, o));
  T_CHECK_OK(f.e, gcap_sum(o[0], &s));
  T_CHECK_OK(f.e, gcap_backward(s, NULL, 1));
  T_CHECK_OK(f.e, gcap_backward(s, NULL, 0));
  T_CHECK(bw.calls == 2 && bw.seen[0] != NULL);
  /* sum(x * z): d/dx = z; the second pass saw z, not 2 z */
  T_CHECK(scaled_bits(bw.seen[0], f.z, 1.0f));
  T_CHECK(scaled_bits(gcap_tensor_grad(f.x), f.z, 2.0f));
  gcap_tensor_free(s);
  outs_free(o, n);
  gcap_tensor_free(gx), gcap_tensor_free(gz);
  rec_free(&bw);
  fx_close(&f);
}

/* Hooks registered on a graphed module run around its replay: the forward
** hook sees the replayed outputs (NULL for the absent one), the backward
** pre-hook's doubled grads reach both inputs, bit for bit as eagerly. */
static void test_graphed_module(void) {
  fx f;
  rec_hook fw = {0}, pre = {0};
  gcap_tensor *gx = NULL, *gz = NULL, *o[4] = {NULL}, *sx = NULL, *sz = NULL, *sample[2];
  gcap_tensor *const *args[1];
  gcap_graphed *G = NULL;
  int n = 0, nargs = 2;
  T_SETUP(fx_open(&f, 1), fx_close(&f));
  T_CHECK(reference(&f, 1, &gx, &gz));
  T_SETUP((sx = values(f.e, 0.7, 1)) != NULL && (sz = values(f.e, 0.1, 1)) != NULL,
          (gcap_tensor_free(sx), gcap_tensor_free(gx), gcap_tensor_free(gz), fx_close(&f)));
  sample[0] = sx, sample[1] = sz;
  args[0] = sample;
  T_CHECK_OK(f.e, gcap_make_graphed_callables(f.e, 1, &f.m, 1, &nargs, args, NULL, &G));
  fw.nret = -1;
  pre.scale = 1;
  T_CHECK_OK(f.e, add(&f, GCAP_HOOK_FORWARD, &fw, NULL));
  T_CHECK_OK(f.e, add(&f, GCAP_HOOK_BACKWARD_PRE, &pre, NULL));
  T_CHECK_OK(f.e, call_bwd(&f, 1, o, &n));
  T_CHECK(fw.calls == 1 && fw.n == 4 && fw.seen[0] && !fw.seen[1] && fw.seen[2]);
  T_CHECK(pre.calls == 1 && pre.n == 3);
  T_CHECK(scaled_bits(gcap_tensor_grad(f.x), gx, 2.0f));
  T_CHECK(scaled_bits(gcap_tensor_grad(f.z), gz, 2.0f));
  outs_free(o, n);
  gcap_graphed_free(G);
  gcap_tensor_free(sx), gcap_tensor_free(sz), gcap_tensor_free(gx), gcap_tensor_free(gz);
  rec_free(&fw);
  rec_free(&pre);
  fx_close(&f);
}

int main(void) {
  T_RUN(test_forward_hook_outputs);
  T_RUN(test_backward_pre_hook);
  T_RUN(test_backward_hook_all_inputs);
  T_RUN(test_input_without_grad);
  T_RUN(test_wrong_returns);
  T_RUN(test_two_backwards);
  T_RUN(test_graphed_module);
  return t_done();
}
