/*
** test_graphed.c: gcap_make_graphed_callables through the C API, with a
** pipeline `order` (2 chunks x 2 microbatches), capture-time hooks written
** in C and reuse_graph_input_output_buffers. A graphed model trains step for
** step beside an eager copy of it, in the schedule's order, and both must
** agree bit for bit: losses, grads of the pipeline's boundary, parameters.
** A graphed call checks its arguments (count, NULL, engine, shape, dtype) on
** the replay and the eager path, takes any number of tensors, and trains with
** an optimizer without a false alarm of the in-place check.
*/
#include "t.h"

#define CHUNKS 2
#define MBS 2
#define ROWS 2
#define WARMUP 2
#define STEPS 3

/* The schedule: a forward of chunk k is +k, its backward -k (1-based). */
static const double sched[] = {1, 2, -2, 1, -1, 2, -2, -1};
#define SCHED_LEN ((int)(sizeof sched / sizeof sched[0]))

/* Chunk 0: Linear(4, 6) + GELU; chunk 1: Linear(6, 3). */
static const int64_t width[CHUNKS + 1] = {4, 6, 3};

/* Capture-time hooks: how often each ran, per callable and kind, and how
** often one ran while a capture was open (never allowed). */
typedef struct hook_log {
  gcap_engine *e;
  int calls[CHUNKS][GCAP_HOOK_KINDS];
  int while_capturing;
} hook_log;

typedef struct hook_ud {
  hook_log *log;
  int callable;
  gcap_hook_kind kind;
  gcap_module *m; /* the callable the hook must be given */
} hook_ud;

static gcap_status count_hook(void *ud, gcap_module *m) {
  hook_ud *h = (hook_ud *)ud;
  if (m != h->m) return GCAP_EINVAL; /* another module than the callable's */
  h->log->calls[h->callable][h->kind]++;
  if (gcap_is_capturing(h->log->e)) h->log->while_capturing++;
  return GCAP_OK;
}

/* One model: its two chunk modules, graphed (G) or eager (G NULL), an SGD
** optimizer over all their parameters. */
typedef struct model {
  gcap_engine *e;
  gcap_module *chunk[CHUNKS];
  gcap_graphed *G;
  gcap_optim *opt;
  gcap_tensor *params[8];
  int nparams;
} model;

static gcap_status model_new(gcap_engine *e, model *md) {
  gcap_module *lin = NULL, *act = NULL;
  gcap_status st;
  int k, i;
  memset(md, 0, sizeof *md);
  md->e = e;
  if ((st = gcap_nn_linear(e, width[0], width[1], 1, 0, &lin)) != GCAP_OK ||
      (st = gcap_nn_gelu(e, &act)) != GCAP_OK) {
    gcap_module_free(lin);
    return st;
  }
  {
    gcap_module *const seq[2] = {lin, act};
    st = gcap_nn_sequential(e, 2, seq, &md->chunk[0]);
  }
  gcap_module_free(lin);
  gcap_module_free(act);
  if (st != GCAP_OK) return st;
  if ((st = gcap_nn_linear(e, width[1], width[2], 1, 0, &md->chunk[1])) != GCAP_OK) return st;
  for (k = 0; k < CHUNKS; k++)
    for (i = 0; i < gcap_module_num_parameters(md->chunk[k]); i++)
      md->params[md->nparams++] = gcap_module_parameter(md->chunk[k], i, NULL, 0);
  return gcap_optim_sgd(e, md->nparams, md->params, 0.1, 0.0, 0.0, &md->opt);
}

static void model_free(model *md) {
  int k;
  gcap_optim_free(md->opt);
  gcap_graphed_free(md->G);
  for (k = 0; k < CHUNKS; k++)
    gcap_module_free(md->chunk[k]);
}

/* dst's parameters take src's values (same architecture). */
static gcap_status model_copy(model *dst, const model *src) {
  gcap_status st = GCAP_OK;
  int was = gcap_set_grad_enabled(dst->e, 0), i;
  for (i = 0; i < dst->nparams && st == GCAP_OK; i++)
    st = gcap_copy_(dst->params[i], src->params[i]);
  gcap_set_grad_enabled(dst->e, was);
  return st;
}

/* The entry of chunk k, microbatch b (one layer per chunk: k * MBS + b). */
static gcap_status chunk_forward(model *md, int k, int b, gcap_tensor *x, gcap_tensor **y) {
  if (md->G) return gcap_graphed_call(md->G, k * MBS + b, 1, &x, y);
  return gcap_module_call(md->chunk[k], 1, &x, y);
}

/* The data of one training step. */
typedef struct batch {
  gcap_tensor *x[MBS], *target[MBS];
} batch;

/* What one step leaves to compare: the losses and the grads that crossed
** from chunk 1 back to chunk 0, per microbatch. */
typedef struct step_out {
  float loss[MBS];
  float boundary_grad[MBS][ROWS * 6];
} step_out;

/* One training step in the schedule's order: chunk 0's output is cut from
** the autograd graph (a leaf that requires grad) before chunk 1, as a
** pipeline stage boundary is, and chunk 0's backward takes that leaf's
** grad; then the optimizer steps and the grads are cleared. */
static gcap_status train_step(model *md, const batch *bt, step_out *so) {
  gcap_tensor *h[MBS] = {NULL}, *cut[MBS] = {NULL}, *loss[MBS] = {NULL}, *gcut[MBS] = {NULL};
  gcap_status st = GCAP_OK;
  int nf[CHUNKS] = {0}, nb[CHUNKS] = {0}, i, b;
  for (i = 0; i < SCHED_LEN && st == GCAP_OK; i++) {
    int k = (int)(sched[i] > 0 ? sched[i] : -sched[i]) - 1;
    if (sched[i] > 0 && k == 0) { /* chunk 0 forward */
      b = nf[0]++;
      if ((st = chunk_forward(md, 0, b, bt->x[b], &h[b])) == GCAP_OK &&
          (st = gcap_tensor_detach(h[b], &cut[b])) == GCAP_OK)
        st = gcap_tensor_set_requires_grad(cut[b], 1);
    } else if (sched[i] > 0) { /* chunk 1 forward and the loss */
      gcap_tensor *y = NULL;
      b = nf[1]++;
      if ((st = chunk_forward(md, 1, b, cut[b], &y)) == GCAP_OK)
        st = gcap_mse_loss(y, bt->target[b], &loss[b]);
      gcap_tensor_free(y);
    } else if (k == 1) { /* chunk 1 backward: the boundary's grad */
      b = nb[1]++;
      if ((st = gcap_backward(loss[b], NULL, 0)) == GCAP_OK &&
          (st = gcap_tensor_read(loss[b], &so->loss[b], 1)) == GCAP_OK &&
          (st = gcap_tensor_clone(gcap_tensor_grad(cut[b]), &gcut[b])) == GCAP_OK)
        st = gcap_tensor_read(gcut[b], so->boundary_grad[b], ROWS * (size_t)width[1]);
    } else { /* chunk 0 backward */
      b = nb[0]++;
      st = gcap_backward(h[b], gcut[b], 0);
    }
  }
  if (st == GCAP_OK) st = gcap_optim_step(md->opt);
  if (st == GCAP_OK) st = gcap_optim_zero_grad(md->opt, 1);
  for (b = 0; b < MBS; b++) {
    gcap_tensor_free(h[b]);
    gcap_tensor_free(cut[b]);
    gcap_tensor_free(loss[b]);
    gcap_tensor_free(gcut[b]);
  }
  return st;
}

/* Random inputs and targets for a step. */
static gcap_status batch_new(gcap_engine *e, batch *bt) {
  const int64_t xs[2] = {ROWS, width[0]}, ts[2] = {ROWS, width[2]};
  gcap_status st = GCAP_OK;
  int b;
  memset(bt, 0, sizeof *bt);
  for (b = 0; b < MBS && st == GCAP_OK; b++)
    if ((st = gcap_tensor_rand(e, GCAP_F32, 2, xs, 1, &bt->x[b])) == GCAP_OK)
      st = gcap_tensor_rand(e, GCAP_F32, 2, ts, 1, &bt->target[b]);
  return st;
}

static void batch_free(batch *bt) {
  int b;
  for (b = 0; b < MBS; b++) {
    gcap_tensor_free(bt->x[b]);
    gcap_tensor_free(bt->target[b]);
  }
}

/* 1 when the parameters of a and b are equal bit for bit. */
static int params_equal(const model *a, const model *b) {
  float va[64], vb[64];
  int i;
  for (i = 0; i < a->nparams; i++) {
    size_t n = (size_t)gcap_tensor_numel(a->params[i]);
    if (n > 64 || gcap_tensor_read(a->params[i], va, n) != GCAP_OK ||
        gcap_tensor_read(b->params[i], vb, n) != GCAP_OK || memcmp(va, vb, n * sizeof *va) != 0)
      return 0;
  }
  return 1;
}

/* The set-up both tests share: an eager model, a graphed copy of it graphed
** with the schedule, C hooks in all four groups of both callables, and
** `reuse` as reuse_graph_input_output_buffers. */
typedef struct bench {
  gcap_engine *e;
  model eager, graphed;
  hook_log log;
  hook_ud ud[CHUNKS][GCAP_HOOK_KINDS];
  gcap_tensor *sample[CHUNKS * MBS];
} bench;

static void bench_free(bench *bn) {
  int i;
  model_free(&bn->eager);
  model_free(&bn->graphed);
  for (i = 0; i < CHUNKS * MBS; i++)
    gcap_tensor_free(bn->sample[i]);
  gcap_engine_free(bn->e);
}

static gcap_status bench_open(bench *bn, int reuse) {
  static const gcap_capture_hook fns[1] = {count_hook};
  void *uds[CHUNKS][GCAP_HOOK_KINDS][1];
  gcap_capture_hooks hooks[CHUNKS];
  gcap_tensor *const *args[CHUNKS * MBS];
  int nargs[CHUNKS * MBS];
  gcap_graphed_opts o;
  gcap_status st;
  int k, g, i;
  memset(bn, 0, sizeof *bn);
  if ((bn->e = t_engine()) == NULL) return GCAP_EINVAL;
  bn->log.e = bn->e;
  if ((st = gcap_manual_seed(bn->e, 11)) != GCAP_OK ||
      (st = model_new(bn->e, &bn->eager)) != GCAP_OK ||
      (st = model_new(bn->e, &bn->graphed)) != GCAP_OK ||
      (st = model_copy(&bn->graphed, &bn->eager)) != GCAP_OK)
    return st;
  for (i = 0; i < CHUNKS * MBS; i++) { /* entry i: chunk i / MBS */
    int k0 = i / MBS;
    const int64_t s[2] = {ROWS, width[k0]};
    if ((st = gcap_tensor_rand(bn->e, GCAP_F32, 2, s, 1, &bn->sample[i])) != GCAP_OK ||
        (k0 > 0 && (st = gcap_tensor_set_requires_grad(bn->sample[i], 1)) != GCAP_OK))
      return st;
    args[i] = &bn->sample[i];
    nargs[i] = 1;
  }
  memset(hooks, 0, sizeof hooks);
  for (k = 0; k < CHUNKS; k++)
    for (g = 0; g < GCAP_HOOK_KINDS; g++) {
      bn->ud[k][g] = (hook_ud){&bn->log, k, (gcap_hook_kind)g, bn->graphed.chunk[k]};
      uds[k][g][0] = &bn->ud[k][g];
      hooks[k].n[g] = 1;
      hooks[k].fn[g] = fns;
      hooks[k].ud[g] = uds[k][g];
    }
  gcap_graphed_opts_init(&o);
  o.num_warmup_iters = WARMUP;
  o.order = sched;
  o.order_len = SCHED_LEN;
  o.capture_time_hooks = hooks;
  o.num_capture_time_hooks = CHUNKS;
  o.reuse_graph_input_output_buffers = reuse;
  return gcap_make_graphed_callables(bn->e, CHUNKS, bn->graphed.chunk, CHUNKS * MBS, nargs, args,
                                     &o, &bn->graphed.G);
}

/* Every hook ran once per warmup iteration and once around the capture, for
** each of the callable's MBS entries; none while a capture was open. */
static void check_hooks(const hook_log *log) {
  int k, g;
  for (k = 0; k < CHUNKS; k++)
    for (g = 0; g < GCAP_HOOK_KINDS; g++)
      if (log->calls[k][g] != (WARMUP + 1) * MBS)
        T_FAILF("hook count", "callable %d, %s: %d calls, want %d", k + 1,
                gcap_hook_kind_name((gcap_hook_kind)g), log->calls[k][g], (WARMUP + 1) * MBS);
  T_CHECK(log->while_capturing == 0);
}

/* Train both models STEPS steps on the same data; every step's losses and
** boundary grads, and the parameters after it, must be equal bit for bit. */
static void train_both(bench *bn) {
  hook_log before = bn->log;
  int s;
  for (s = 0; s < STEPS; s++) {
    batch bt;
    step_out eo, go;
    memset(&eo, 0, sizeof eo);
    memset(&go, 0, sizeof go);
    T_CHECK_OK(bn->e, batch_new(bn->e, &bt));
    T_CHECK_ST(bn->e, train_step(&bn->eager, &bt, &eo), GCAP_OK);
    T_CHECK_ST(bn->e, train_step(&bn->graphed, &bt, &go), GCAP_OK);
    batch_free(&bt);
    if (memcmp(eo.loss, go.loss, sizeof eo.loss) != 0)
      T_FAILF("losses", "step %d: eager %.9g %.9g, graphed %.9g %.9g", s + 1, (double)eo.loss[0],
              (double)eo.loss[1], (double)go.loss[0], (double)go.loss[1]);
    T_CHECK(memcmp(eo.boundary_grad, go.boundary_grad, sizeof eo.boundary_grad) == 0);
    if (!params_equal(&bn->eager, &bn->graphed)) T_FAILF("params", "differ after step %d", s + 1);
  }
  /* the replays ran no capture-time hook */
  T_CHECK(memcmp(before.calls, bn->log.calls, sizeof before.calls) == 0);
  /* and training changed the parameters at all (the comparison means something) */
  {
    model fresh;
    gcap_manual_seed(bn->e, 11);
    T_CHECK_OK(bn->e, model_new(bn->e, &fresh));
    T_CHECK(!params_equal(&fresh, &bn->graphed));
    model_free(&fresh);
  }
}

static void test_order_hooks_train_bitwise(void) {
  bench bn;
  gcap_status st = bench_open(&bn, 0);
  if (st != GCAP_OK) {
    T_FAILF("bench_open", "%s (%s)", gcap_status_str(st), bn.e ? gcap_errmsg(bn.e) : "");
    bench_free(&bn);
    return;
  }
  T_CHECK(gcap_graphed_num_entries(bn.graphed.G) == CHUNKS * MBS);
  T_CHECK(gcap_graphed_module(bn.graphed.G, 3) == bn.graphed.chunk[1]);
  check_hooks(&bn.log);
  train_both(&bn);
  bench_free(&bn);
}

/* With reuse, the same training bit for bit; entry 4 (chunk 2, microbatch
** 2) takes entry 3's static input, so calling it before entry 3's backward
** is refused, naming both, and the schedule still trains afterwards. */
static void test_reuse_buffers(void) {
  bench bn;
  gcap_tensor *y = NULL, *y2 = NULL, *in = NULL;
  const int64_t s[2] = {ROWS, 6};
  gcap_status st = bench_open(&bn, 1);
  if (st != GCAP_OK) {
    T_FAILF("bench_open", "%s (%s)", gcap_status_str(st), bn.e ? gcap_errmsg(bn.e) : "");
    bench_free(&bn);
    return;
  }
  check_hooks(&bn.log);
  train_both(&bn);
  if (gcap_tensor_rand(bn.e, GCAP_F32, 2, s, 1, &in) == GCAP_OK &&
      gcap_tensor_set_requires_grad(in, 1) == GCAP_OK) {
    T_CHECK_ST(bn.e, gcap_graphed_call(bn.graphed.G, 2, 1, &in, &y), GCAP_OK);
    st = gcap_graphed_call(bn.graphed.G, 3, 1, &in, &y2);
    T_CHECK(st != GCAP_OK && y2 == NULL);
    T_CHECK(t_msg_has(bn.e, "entry 4 refused") && t_msg_has(bn.e, "with entry 3"));
    if (y != NULL) { /* entry 3's backward runs: entry 4 may go */
      gcap_tensor *l = NULL;
      T_CHECK_ST(bn.e, gcap_sum(y, &l), GCAP_OK);
      T_CHECK_ST(bn.e, gcap_backward(l, NULL, 0), GCAP_OK);
      gcap_tensor_free(l);
      T_CHECK_ST(bn.e, gcap_graphed_call(bn.graphed.G, 3, 1, &in, &y2), GCAP_OK);
    }
  } else {
    T_FAILF("set-up", "%s", gcap_errmsg(bn.e));
  }
  gcap_tensor_free(y);
  gcap_tensor_free(y2);
  gcap_tensor_free(in);
  bench_free(&bn);
}

/* A Linear(3, 4) graphed from a [2, 3] sample that requires grad. */
typedef struct fixture {
  gcap_engine *e;
  gcap_module *m;
  gcap_tensor *x;
  gcap_graphed *G;
} fixture;

static int fx_open(fixture *f) {
  const int64_t s[2] = {2, 3};
  const float dx[6] = {0.5f, -1.0f, 2.0f, 0.25f, -0.75f, 1.5f};
  gcap_graphed_opts o;
  memset(f, 0, sizeof *f);
  if ((f->e = t_engine()) == NULL) return 0;
  if ((f->x = t_from(f->e, 2, s, dx)) == NULL) return 0;
  if (gcap_tensor_set_requires_grad(f->x, 1) != GCAP_OK) return 0;
  if (gcap_nn_linear(f->e, 3, 4, 1, 0, &f->m) != GCAP_OK) return 0;
  gcap_tensor *const a0[1] = {f->x};
  gcap_tensor *const *args[1] = {a0};
  const int nargs[1] = {1};
  gcap_graphed_opts_init(&o);
  o.num_warmup_iters = 1;
  return gcap_make_graphed_callables(f->e, 1, &f->m, 1, nargs, args, &o, &f->G) == GCAP_OK;
}

static void fx_close(fixture *f) {
  gcap_graphed_free(f->G);
  gcap_tensor_free(f->x);
  gcap_module_free(f->m);
  gcap_engine_free(f->e);
}

/* regression: a NULL input array with n > 0 was dereferenced */
/* gcap_graphed_call with n > 0 and no input array: an error with a
** message, on the replay path and on the eager fallback (eval mode). */
static void test_graphed_call_null_inputs(void) {
  fixture f;
  gcap_tensor *y = NULL;
  T_SETUP(fx_open(&f), fx_close(&f));
  T_CHECK_ST(f.e, gcap_graphed_call(f.G, 0, 1, NULL, &y), GCAP_EINVAL);
  T_CHECK(y == NULL && gcap_errmsg(f.e)[0] != '\0');
  gcap_module_train(f.m, 0); /* another mode than captured: the eager path */
  T_CHECK_ST(f.e, gcap_graphed_call(f.G, 0, 1, NULL, &y), GCAP_EINVAL);
  T_CHECK(y == NULL && gcap_errmsg(f.e)[0] != '\0');
  T_CHECK_ST(f.e, gcap_graphed_call(f.G, 0, -1, NULL, &y), GCAP_EINVAL);
  gcap_module_train(f.m, 1);
  T_CHECK_OK(f.e, gcap_graphed_call(f.G, 0, 1, &f.x, &y)); /* still usable */
  gcap_tensor_free(y);
  fx_close(&f);
}

/* regression: the eager fallback's errors had an empty message */
/* The eager fallback names a NULL tensor and a tensor of another engine. */
static void test_graphed_eager_fallback_messages(void) {
  fixture f;
  gcap_engine *e2 = NULL;
  gcap_tensor *y = NULL, *other = NULL, *none = NULL;
  const int64_t s[2] = {2, 3};
  T_SETUP(fx_open(&f), fx_close(&f));
  T_SETUP((e2 = t_engine()) != NULL, fx_close(&f));
  T_CHECK_OK(e2, gcap_tensor_full(e2, GCAP_F32, 2, s, 1.0, &other));
  gcap_module_train(f.m, 0);
  T_CHECK_ST(f.e, gcap_graphed_call(f.G, 0, 1, &other, &y), GCAP_EINVAL);
  T_CHECK(t_msg_has(f.e, "argument #1") && t_msg_has(f.e, "another engine"));
  T_CHECK_ST(f.e, gcap_graphed_call(f.G, 0, 1, &none, &y), GCAP_EINVAL);
  T_CHECK(t_msg_has(f.e, "argument #1") && t_msg_has(f.e, "NULL"));
  T_CHECK(y == NULL);
  gcap_tensor_free(other);
  gcap_engine_free(e2);
  fx_close(&f);
}

/* regression: a [3, 2] or [6] input was read as the captured [2, 3] */
/* A graphed callable refuses an input of another shape or dtype (same
** element count), naming the argument and both shapes. */
static void test_graphed_call_checks_shape(void) {
  fixture f;
  gcap_tensor *y = NULL, *t32 = NULL, *t6 = NULL, *tb = NULL;
  const int64_t s32[2] = {3, 2}, s6[1] = {6}, s23[2] = {2, 3};
  T_SETUP(fx_open(&f), fx_close(&f));
  T_CHECK_OK(f.e, gcap_tensor_full(f.e, GCAP_F32, 2, s32, 1.0, &t32));
  T_CHECK_OK(f.e, gcap_tensor_full(f.e, GCAP_F32, 1, s6, 1.0, &t6));
  T_CHECK_OK(f.e, gcap_tensor_full(f.e, GCAP_BF16, 2, s23, 1.0, &tb));
  T_CHECK_ST(f.e, gcap_graphed_call(f.G, 0, 1, &t32, &y), GCAP_EINVAL);
  T_CHECK(t_msg_has(f.e, "argument #1") && t_msg_has(f.e, "[3, 2]") && t_msg_has(f.e, "[2, 3]"));
  T_CHECK(t_msg_has(f.e, "Linear"));
  T_CHECK_ST(f.e, gcap_graphed_call(f.G, 0, 1, &t6, &y), GCAP_EINVAL);
  T_CHECK(t_msg_has(f.e, "[6]") && t_msg_has(f.e, "[2, 3]"));
  T_CHECK_ST(f.e, gcap_graphed_call(f.G, 0, 1, &tb, &y), GCAP_EINVAL);
  T_CHECK(t_msg_has(f.e, "bf16") && t_msg_has(f.e, "f32"));
  T_CHECK(y == NULL);
  T_CHECK_OK(f.e, gcap_graphed_call(f.G, 0, 1, &f.x, &y));
  gcap_tensor_free(y), gcap_tensor_free(t32), gcap_tensor_free(t6), gcap_tensor_free(tb);
  fx_close(&f);
}

/* A forward whose op fails only at the capture (its second call). */
static gcap_status late_bad_forward(void *ud, gcap_module *m, int nin, gcap_tensor *const *in,
                                    gcap_tensor **out) {
  int *calls = (int *)ud;
  const int64_t s5[1] = {5};
  gcap_tensor *odd = NULL;
  gcap_status st;
  (void)m, (void)nin;
  if (++*calls < 2) return gcap_scale(in[0], 2.0, out);
  if ((st = gcap_tensor_full(gcap_tensor_engine(in[0]), GCAP_F32, 1, s5, 1.0, &odd)) != GCAP_OK)
    return st;
  st = gcap_add(in[0], odd, out); /* [2, 3] + [5]: refused */
  gcap_tensor_free(odd);
  return st;
}

/* regression: ending the capture cleared the op's reason from the error */
/* An op error inside a make_graphed_callables capture keeps its reason
** after the entry and phase. */
static void test_capture_op_error_keeps_reason(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[2] = {2, 3};
  int calls = 0;
  gcap_module *m = NULL;
  gcap_tensor *x = NULL;
  gcap_graphed *G = NULL;
  gcap_graphed_opts o;
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 2, s, 1.0, &x));
  T_CHECK_OK(e, gcap_module_new(e, "LateBad", late_bad_forward, &calls, NULL, &m));
  gcap_tensor *const a0[1] = {x};
  gcap_tensor *const *args[1] = {a0};
  const int nargs[1] = {1};
  gcap_graphed_opts_init(&o);
  o.num_warmup_iters = 1;
  T_CHECK_ST(e, gcap_make_graphed_callables(e, 1, &m, 1, nargs, args, &o, &G), GCAP_EINVAL);
  T_CHECK(calls == 2 && G == NULL);
  T_CHECK(t_msg_has(e, "forward capture of entry 1 (callable 1, LateBad): "));
  T_CHECK(t_msg_has(e, "add") && t_msg_has(e, "[5]"));
  T_CHECK(!gcap_is_capturing(e));
  gcap_tensor_free(x);
  gcap_module_free(m);
  gcap_engine_free(e);
}

/* Sum of in[0..nin). */
static gcap_status sum_forward(void *ud, gcap_module *m, int nin, gcap_tensor *const *in,
                               gcap_tensor **out) {
  gcap_tensor *acc = NULL, *next = NULL;
  gcap_status st;
  (void)ud, (void)m;
  if ((st = gcap_scale(in[0], 1.0, &acc)) != GCAP_OK) return st;
  for (int k = 1; k < nin; k++) {
    if ((st = gcap_add(acc, in[k], &next)) != GCAP_OK) break;
    gcap_tensor_free(acc);
    acc = next;
  }
  if (st != GCAP_OK) {
    gcap_tensor_free(acc);
    return st;
  }
  *out = acc;
  return GCAP_OK;
}

/* regression: a call held its tensor arguments in an array of 8 */
/* A callable of 11 tensor arguments: called directly, graphed, replayed
** and backpropagated through. */
static void test_many_tensor_arguments(void) {
  enum { N = 11 };
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[1] = {3};
  gcap_tensor *in[N] = {0}, *y = NULL;
  gcap_module *m = NULL;
  gcap_graphed *G = NULL;
  gcap_graphed_opts o;
  float r[3];
  for (int k = 0; k < N; k++) {
    T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 1, s, (double)(k + 1), &in[k]));
    T_CHECK_OK(e, gcap_tensor_set_requires_grad(in[k], 1));
  }
  T_CHECK_OK(e, gcap_module_new(e, "SumAll", sum_forward, NULL, NULL, &m));
  T_CHECK_OK(e, gcap_module_call(m, N, in, &y));
  if (t_read(y, r, 3)) T_CHECK(r[0] == 66 && r[2] == 66);
  gcap_tensor_free(y), y = NULL;
  gcap_tensor *const *args[1] = {in};
  const int nargs[1] = {N};
  gcap_graphed_opts_init(&o);
  o.num_warmup_iters = 1;
  T_CHECK_OK(e, gcap_make_graphed_callables(e, 1, &m, 1, nargs, args, &o, &G));
  T_CHECK_OK(e, gcap_graphed_call(G, 0, N, in, &y));
  if (t_read(y, r, 3)) T_CHECK(r[0] == 66 && r[2] == 66);
  gcap_tensor_free(y), y = NULL;
  T_CHECK_OK(e, gcap_module_call(m, N, in, &y)); /* routed to the replay */
  if (t_read(y, r, 3)) T_CHECK(r[1] == 66);
  T_CHECK_OK(e, gcap_backward(y, y, 0));
  T_CHECK(gcap_tensor_grad(in[N - 1]) != NULL);
  if (gcap_tensor_grad(in[N - 1]) && t_read(gcap_tensor_grad(in[N - 1]), r, 3)) T_CHECK(r[0] == 66);
  gcap_tensor_free(y);
  gcap_graphed_free(G);
  for (int k = 0; k < N; k++)
    gcap_tensor_free(in[k]);
  gcap_module_free(m);
  gcap_engine_free(e);
}

/* regression: storage versions, when they came, must raise no false alarm here */
/* A graphed Linear trained with its optimizer: replays, copy-ins and steps
** bump versions, and no backward raises. */
static void test_graphed_training_no_false_alarm(void) {
  fixture f;
  gcap_optim *o = NULL;
  gcap_tensor *y = NULL, *loss = NULL, *p[2];
  T_SETUP(fx_open(&f), fx_close(&f));
  p[0] = gcap_module_parameter(f.m, 0, NULL, 0);
  p[1] = gcap_module_parameter(f.m, 1, NULL, 0);
  T_CHECK_OK(f.e, gcap_optim_adam(f.e, 2, p, 0.01, 0.9, 0.999, 1e-8, 0, &o));
  for (int it = 0; it < 4; it++) {
    gcap_tensor *xi = NULL;
    T_CHECK_OK(f.e, gcap_tensor_clone(f.x, &xi)); /* another address: a copy-in */
    T_CHECK_OK(f.e, gcap_graphed_call(f.G, 0, 1, it % 2 ? &xi : &f.x, &y));
    T_CHECK_OK(f.e, gcap_sum(y, &loss));
    T_CHECK_OK(f.e, gcap_backward(loss, NULL, 0));
    T_CHECK_OK(f.e, gcap_optim_step(o));
    T_CHECK_OK(f.e, gcap_optim_zero_grad(o, 0));
    gcap_tensor_free(y), gcap_tensor_free(loss), gcap_tensor_free(xi);
  }
  gcap_optim_free(o);
  fx_close(&f);
}

/* Call f's module in mode `training`, then read entry 0 of G: the replays of
** its forward into *n, whether it has a backward graph into *bwd. */
static gcap_status fwd_replays(fixture *f, gcap_graphed *G, int training, int64_t *n, int *bwd) {
  gcap_graphed_stats s;
  gcap_tensor *y = NULL;
  gcap_status st;
  gcap_module_train(f->m, training);
  if ((st = gcap_module_call(f->m, 1, &f->x, &y)) != GCAP_OK) return st;
  gcap_tensor_free(y);
  if ((st = gcap_graphed_get_stats(G, 0, &s)) != GCAP_OK) return st;
  *n = s.fwd.replays;
  *bwd = s.has_bwd;
  return GCAP_OK;
}

/* f's module graphed again in eval mode: a call of the module replays the
** graph of its mode (the graphing in the other mode used to replace the
** route, so training calls ran eagerly); freed, the eval graph sends eval
** calls back to the module's forward and leaves the training route. */
static void test_module_graphed_in_both_modes(void) {
  fixture f;
  gcap_graphed *Ge = NULL;
  gcap_graphed_opts o;
  int64_t n = -1;
  int bwd = -1;
  const int nargs[1] = {1};
  T_SETUP(fx_open(&f), fx_close(&f));
  gcap_tensor *const a0[1] = {f.x};
  gcap_tensor *const *args[1] = {a0};
  gcap_graphed_opts_init(&o);
  o.num_warmup_iters = 1;
  gcap_module_train(f.m, 0);
  T_CHECK_OK(f.e, gcap_make_graphed_callables(f.e, 1, &f.m, 1, nargs, args, &o, &Ge));
  T_CHECK_OK(f.e, fwd_replays(&f, f.G, 1, &n, &bwd));
  T_CHECK(n == 1 && bwd == 1);
  T_CHECK_OK(f.e, fwd_replays(&f, Ge, 0, &n, &bwd));
  T_CHECK_OK(f.e, fwd_replays(&f, Ge, 0, &n, &bwd));
  T_CHECK(n == 2 && bwd == 0);
  T_CHECK_OK(f.e, fwd_replays(&f, f.G, 1, &n, &bwd));
  T_CHECK(n == 2);
  gcap_graphed_free(Ge);
  T_CHECK_OK(f.e, fwd_replays(&f, f.G, 0, &n, &bwd)); /* eager: no replay */
  T_CHECK(n == 2);
  T_CHECK_OK(f.e, fwd_replays(&f, f.G, 1, &n, &bwd));
  T_CHECK(n == 3);
  fx_close(&f);
}

/* A capture-time hook that adds f's input and a [5] tensor (shapes that do
** not broadcast), returning the op's status. */
static gcap_status bad_op_hook(void *ud, gcap_module *m) {
  fixture *f = (fixture *)ud;
  const int64_t s[1] = {5};
  gcap_tensor *t = NULL, *y = NULL;
  gcap_status st;
  (void)m;
  if ((st = gcap_tensor_full(f->e, GCAP_F32, 1, s, 1.0, &t)) != GCAP_OK) return st;
  st = gcap_add(f->x, t, &y);
  gcap_tensor_free(t);
  gcap_tensor_free(y);
  return st;
}

/* Hooks that return the status ud points to, saying nothing. */
static gcap_status status_hook(void *ud, gcap_module *m) {
  (void)m;
  return *(const gcap_status *)ud;
}

static gcap_status status_warmup_hook(void *ud) {
  return *(const gcap_status *)ud;
}

/* A C host's callback that fails: the message names the hook, its callable
** and the phase, then says why: the message of the op that failed in it (it
** used to be that message alone), else the status; GCAP_EABORTED, the place
** alone. A warmup hook's failure names it (it used to leave no message). */
static void test_callback_failure_messages(void) {
  fixture f;
  gcap_graphed *G = NULL;
  gcap_graphed_opts o;
  gcap_capture_hooks h;
  gcap_capture_hook fn[1] = {bad_op_hook};
  void *ud[1];
  gcap_status inval = GCAP_EINVAL, aborted = GCAP_EABORTED;
  const int nargs[1] = {1};
  const char *place = "make_graphed_callables: capture_time_hooks forward_hooks #1 of callable 1 "
                      "(Linear) failed in the warmup";
  T_SETUP(fx_open(&f), fx_close(&f));
  gcap_tensor *const a0[1] = {f.x};
  gcap_tensor *const *args[1] = {a0};
  memset(&h, 0, sizeof h);
  h.n[GCAP_HOOK_FORWARD] = 1;
  h.fn[GCAP_HOOK_FORWARD] = fn;
  h.ud[GCAP_HOOK_FORWARD] = ud;
  ud[0] = &f;
  gcap_graphed_opts_init(&o);
  o.num_warmup_iters = 1;
  o.capture_time_hooks = &h;
  o.num_capture_time_hooks = 1;
  T_CHECK_ST(f.e, gcap_make_graphed_callables(f.e, 1, &f.m, 1, nargs, args, &o, &G), GCAP_EINVAL);
  T_CHECK(strncmp(gcap_errmsg(f.e), place, strlen(place)) == 0);
  T_CHECK(t_msg_has(f.e, "failed in the warmup: add: shapes [2, 3] and [5] do not broadcast"));
  fn[0] = status_hook;
  ud[0] = &inval;
  T_CHECK_ST(f.e, gcap_make_graphed_callables(f.e, 1, &f.m, 1, nargs, args, &o, &G), GCAP_EINVAL);
  T_CHECK(t_msg_has(f.e, "failed in the warmup: invalid argument"));
  ud[0] = &aborted;
  T_CHECK_ST(f.e, gcap_make_graphed_callables(f.e, 1, &f.m, 1, nargs, args, &o, &G), GCAP_EABORTED);
  T_CHECK(strcmp(gcap_errmsg(f.e), place) == 0);
  o.capture_time_hooks = NULL;
  o.num_capture_time_hooks = 0;
  o.post_warmup_hook = status_warmup_hook;
  o.post_warmup_ud = &inval;
  T_CHECK_ST(f.e, gcap_make_graphed_callables(f.e, 1, &f.m, 1, nargs, args, &o, &G), GCAP_EINVAL);
  T_CHECK(strcmp(gcap_errmsg(f.e), "make_graphed_callables: post_warmup_hook failed: invalid "
                                   "argument") == 0);
  T_CHECK(G == NULL);
  fx_close(&f);
}

int main(void) {
  T_RUN(test_order_hooks_train_bitwise);
  T_RUN(test_reuse_buffers);
  T_RUN(test_graphed_call_null_inputs);
  T_RUN(test_graphed_eager_fallback_messages);
  T_RUN(test_graphed_call_checks_shape);
  T_RUN(test_capture_op_error_keeps_reason);
  T_RUN(test_many_tensor_arguments);
  T_RUN(test_graphed_training_no_false_alarm);
  T_RUN(test_module_graphed_in_both_modes);
  T_RUN(test_callback_failure_messages);
  return t_done();
}
