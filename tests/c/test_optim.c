/*
** test_optim.c: optimizers (graphcap.h "Optimizers"): SGD with and without
** momentum and weight decay, and Adam, one and several steps, against
** references computed in double on the host (PyTorch's update rules);
** parameters without .grad are skipped; zero_grad; and a whole training step
** (forward, backward, optimizer step, with Dropout) captured into one graph and
** replayed N times, bitwise equal to N eager steps; the state under
** PyTorch's names, restored into another optimizer.
*/
#include <stdint.h>

#include "t.h"
#include "t_optim.h"

/* SGD as PyTorch (dampening 0, no nesterov): d = g + wd p;
** buf = d (first step) or momentum buf + d; p -= lr buf (or lr d). */
static void sgd_case(const char *what, double lr, double momentum, double wd, int steps) {
  fixture f;
  gcap_optim *o = NULL;
  double buf[NP][MAXN] = {{0}};
  int has_buf[NP] = {0};
  T_SETUP(fixture_make(&f), fixture_free(&f));
  gcap_engine *e = f.e;
  T_CHECK_OK(e, gcap_optim_sgd(e, NP, f.p, lr, momentum, wd, &o));
  for (int k = 0; k < steps; k++) {
    for (int j = 0; j < NP; j++) {
      T_REQUIRE(set_step_grad(&f, j, k));
      for (int i = 0; i < pn[j]; i++) {
        double d = (double)grad_value(j, i, k) + wd * f.ref[j][i];
        if (momentum != 0.0) {
          buf[j][i] = has_buf[j] ? momentum * buf[j][i] + d : d;
          d = buf[j][i];
        }
        f.ref[j][i] -= lr * d;
      }
      has_buf[j] = 1;
    }
    T_CHECK_OK(e, gcap_optim_step(o));
    check_params(&f, what, k + 1);
  }
  gcap_optim_free(o);
  fixture_free(&f);
}

static void test_sgd_plain(void) {
  sgd_case("SGD lr 0.1", 0.1, 0.0, 0.0, 1);
}
static void test_sgd_plain_steps(void) {
  sgd_case("SGD lr 0.1, 4 steps", 0.1, 0.0, 0.0, 4);
}
static void test_sgd_weight_decay(void) {
  sgd_case("SGD lr 0.05 wd 0.1", 0.05, 0.0, 0.1, 3);
}
static void test_sgd_momentum(void) {
  sgd_case("SGD lr 0.1 momentum 0.9", 0.1, 0.9, 0.0, 5);
}
static void test_sgd_momentum_wd(void) {
  sgd_case("SGD lr 0.05 momentum 0.8 wd 0.01", 0.05, 0.8, 0.01, 4);
}

static void adam_case(const char *what, double lr, double b1, double b2, double eps, double wd,
                      int steps) {
  fixture f;
  gcap_optim *o = NULL;
  adam_ref a;
  memset(&a, 0, sizeof a);
  T_SETUP(fixture_make(&f), fixture_free(&f));
  gcap_engine *e = f.e;
  T_CHECK_OK(e, gcap_optim_adam(e, NP, f.p, lr, b1, b2, eps, wd, &o));
  for (int k = 0; k < steps; k++) {
    for (int j = 0; j < NP; j++) {
      T_REQUIRE(set_step_grad(&f, j, k));
      adam_ref_step(&f, &a, j, k, lr, b1, b2, eps, wd, 0);
    }
    T_CHECK_OK(e, gcap_optim_step(o));
    check_params(&f, what, k + 1);
  }
  gcap_optim_free(o);
  fixture_free(&f);
}

static void test_adam_one_step(void) {
  adam_case("Adam lr 0.01", 0.01, 0.9, 0.999, 1e-8, 0.0, 1);
}
static void test_adam_steps(void) {
  adam_case("Adam lr 0.01, 6 steps", 0.01, 0.9, 0.999, 1e-8, 0.0, 6);
}
static void test_adam_betas_eps_wd(void) {
  adam_case("Adam lr 0.05 betas (0.5, 0.9) eps 1e-3 wd 0.1", 0.05, 0.5, 0.9, 1e-3, 0.1, 5);
}

/* Parameters without .grad are skipped: unchanged, bitwise. */
static void test_skips_params_without_grad(void) {
  for (int adam = 0; adam < 2; adam++) {
    fixture f;
    gcap_optim *o = NULL;
    float before[MAXN], after[MAXN];
    T_SETUP(fixture_make(&f), fixture_free(&f));
    gcap_engine *e = f.e;
    if (adam)
      T_CHECK_OK(e, gcap_optim_adam(e, NP, f.p, 0.01, 0.9, 0.999, 1e-8, 0.1, &o));
    else
      T_CHECK_OK(e, gcap_optim_sgd(e, NP, f.p, 0.1, 0.9, 0.1, &o)); /* weight decay would move it */
    T_REQUIRE(t_read(f.p[1], before, (size_t)pn[1]));
    T_REQUIRE(set_step_grad(&f, 0, 0));
    T_CHECK(gcap_tensor_grad(f.p[1]) == NULL);
    for (int k = 0; k < 3; k++)
      T_CHECK_OK(e, gcap_optim_step(o));
    T_REQUIRE(t_read(f.p[1], after, (size_t)pn[1]));
    if (memcmp(before, after, sizeof(float) * (size_t)pn[1]) != 0)
      T_FAILF("unchanged", "%s moved a parameter that has no grad", adam ? "Adam" : "SGD");
    T_CHECK(gcap_tensor_grad(f.p[1]) == NULL);
    T_REQUIRE(t_read(f.p[0], after, (size_t)pn[0]));
    T_CHECK((double)after[0] != f.ref[0][0]); /* the other one moved */
    gcap_optim_free(o);
    fixture_free(&f);
  }
}

/* A parameter whose grad appears only at the second step: its own first
** step (PyTorch keeps the step count per parameter, counting only steps in
** which the parameter had a grad; momentum starts as that step's d). */
static void late_grad_case(int adam) {
  fixture f;
  gcap_optim *o = NULL;
  adam_ref a;
  double buf[NP][MAXN] = {{0}};
  memset(&a, 0, sizeof a);
  T_SETUP(fixture_make(&f), fixture_free(&f));
  gcap_engine *e = f.e;
  if (adam)
    T_CHECK_OK(e, gcap_optim_adam(e, NP, f.p, 0.01, 0.9, 0.999, 1e-8, 0.0, &o));
  else
    T_CHECK_OK(e, gcap_optim_sgd(e, NP, f.p, 0.1, 0.9, 0.0, &o));
  for (int k = 0; k < 3; k++) {
    for (int j = 0; j < NP; j++) {
      if (j == 1 && k == 0) continue; /* parameter 1: no grad in step 1 */
      T_REQUIRE(set_step_grad(&f, j, k));
      if (adam) {
        adam_ref_step(&f, &a, j, k, 0.01, 0.9, 0.999, 1e-8, 0.0, 0);
      } else {
        int first = k == (j == 1 ? 1 : 0); /* the parameter's first step */
        for (int i = 0; i < pn[j]; i++) {
          double d = (double)grad_value(j, i, k);
          buf[j][i] = first ? d : 0.9 * buf[j][i] + d;
          f.ref[j][i] -= 0.1 * buf[j][i];
        }
      }
    }
    T_CHECK_OK(e, gcap_optim_step(o));
    check_params(&f,
                 adam ? "Adam (per-parameter step count), parameter 1 has a grad from step 2 on"
                      : "SGD momentum, parameter 1 has a grad from step 2 on",
                 k + 1);
  }
  gcap_optim_free(o);
  fixture_free(&f);
}

static void test_late_grad_sgd_momentum(void) {
  late_grad_case(0);
}
static void test_late_grad_adam(void) {
  late_grad_case(1);
}

/* zero_grad: set_to_none clears .grad; otherwise zeroes it in place. */
static void test_zero_grad(void) {
  fixture f;
  gcap_optim *o = NULL;
  float g[MAXN];
  T_SETUP(fixture_make(&f), fixture_free(&f));
  gcap_engine *e = f.e;
  T_CHECK_OK(e, gcap_optim_sgd(e, NP, f.p, 0.1, 0.0, 0.0, &o));
  T_CHECK_OK(e, gcap_optim_zero_grad(o, 1)); /* no grads yet: fine */
  T_CHECK_OK(e, gcap_optim_zero_grad(o, 0));
  T_REQUIRE(set_step_grad(&f, 0, 0) && set_step_grad(&f, 1, 0));
  uintptr_t a0 = gcap_tensor_data_ptr(gcap_tensor_grad(f.p[0]));
  T_CHECK_OK(e, gcap_optim_zero_grad(o, 0));
  T_REQUIRE(gcap_tensor_grad(f.p[0]) != NULL && gcap_tensor_grad(f.p[1]) != NULL);
  T_CHECK(gcap_tensor_data_ptr(gcap_tensor_grad(f.p[0])) == a0);
  for (int j = 0; j < NP; j++)
    if (t_read(gcap_tensor_grad(f.p[j]), g, (size_t)pn[j]))
      for (int i = 0; i < pn[j]; i++)
        T_CHECK(g[i] == 0.0f);
  /* a step with zero grads moves nothing (no weight decay) */
  float before[MAXN], after[MAXN];
  T_REQUIRE(t_read(f.p[1], before, (size_t)pn[1]));
  T_CHECK_OK(e, gcap_optim_step(o));
  T_REQUIRE(t_read(f.p[1], after, (size_t)pn[1]));
  T_CHECK(memcmp(before, after, sizeof(float) * (size_t)pn[1]) == 0);
  T_CHECK_OK(e, gcap_optim_zero_grad(o, 1));
  T_CHECK(gcap_tensor_grad(f.p[0]) == NULL && gcap_tensor_grad(f.p[1]) == NULL);
  gcap_optim_free(o);
  fixture_free(&f);
}

static void test_bad_arguments(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[1] = {3};
  const float d[3] = {1, 2, 3};
  gcap_tensor *p = t_from(e, 1, s, d), *y = NULL;
  gcap_optim *o = (gcap_optim *)(uintptr_t)0x10;
  T_REQUIRE(p != NULL);
  T_CHECK_OK(e, gcap_tensor_set_requires_grad(p, 1));
  T_CHECK_ST(e, gcap_optim_sgd(e, 1, &p, -0.1, 0.0, 0.0, &o), GCAP_EINVAL);
  T_CHECK(strlen(gcap_errmsg(e)) > 0);
  T_CHECK_ST(e, gcap_optim_sgd(e, 1, &p, 0.1, -0.5, 0.0, &o), GCAP_EINVAL);
  T_CHECK_ST(e, gcap_optim_sgd(e, 1, &p, 0.1, 0.0, -1.0, &o), GCAP_EINVAL);
  T_CHECK_ST(e, gcap_optim_adam(e, 1, &p, 0.1, 1.0, 0.999, 1e-8, 0.0, &o), GCAP_EINVAL);
  T_CHECK_ST(e, gcap_optim_adam(e, 1, &p, 0.1, 0.9, -0.1, 1e-8, 0.0, &o), GCAP_EINVAL);
  T_CHECK_ST(e, gcap_optim_adam(e, 1, &p, 0.1, 0.9, 0.999, -1.0, 0.0, &o), GCAP_EINVAL);
  T_CHECK_OK(e, gcap_scale(p, 2.0, &y));
  o = NULL;
  T_CHECK_ST(e, gcap_optim_sgd(e, 1, &y, 0.1, 0.0, 0.0, &o), GCAP_EINVAL); /* not a leaf */
  T_CHECK(o == NULL);
  T_CHECK(t_msg_has(e, "leaf"));
  gcap_tensor *nul[1] = {NULL};
  T_CHECK_ST(e, gcap_optim_sgd(e, 1, nul, 0.1, 0.0, 0.0, &o), GCAP_EINVAL);
  T_CHECK_ST(e, gcap_optim_step(NULL), GCAP_EINVAL);
  gcap_optim_free(NULL);
  gcap_tensor_free(p), gcap_tensor_free(y);
  gcap_engine_free(e);
}

/* A constructor that fails sets *out to NULL (graphcap.h's conventions), also
** when it rejects a hyperparameter. */
static void test_failed_constructor_clears_out(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[1] = {3};
  const float d[3] = {1, 2, 3};
  gcap_tensor *p = t_from(e, 1, s, d);
  gcap_optim *const armed = (gcap_optim *)(uintptr_t)0x10;
  gcap_optim *o;
  T_REQUIRE(p != NULL);
  T_CHECK_OK(e, gcap_tensor_set_requires_grad(p, 1));
  o = armed;
  T_CHECK_ST(e, gcap_optim_sgd(e, 1, &p, -0.1, 0.0, 0.0, &o), GCAP_EINVAL);
  if (o != NULL)
    T_FAILF("*out == NULL after a failed call", "gcap_optim_sgd(lr = -0.1) left *out unchanged");
  o = armed;
  T_CHECK_ST(e, gcap_optim_sgd(e, 1, &p, 0.1, -0.5, 0.0, &o), GCAP_EINVAL);
  if (o != NULL)
    T_FAILF("*out == NULL after a failed call",
            "gcap_optim_sgd(momentum = -0.5) left *out unchanged");
  o = armed;
  T_CHECK_ST(e, gcap_optim_adam(e, 1, &p, 0.1, 1.0, 0.999, 1e-8, 0.0, &o), GCAP_EINVAL);
  if (o != NULL)
    T_FAILF("*out == NULL after a failed call", "gcap_optim_adam(beta1 = 1) left *out unchanged");
  o = armed;
  T_CHECK_ST(e, gcap_optim_adam(e, 1, &p, 0.1, 0.9, -0.1, 1e-8, 0.0, &o), GCAP_EINVAL);
  if (o != NULL)
    T_FAILF("*out == NULL after a failed call",
            "gcap_optim_adam(beta2 = -0.1) left *out unchanged");
  o = armed;
  gcap_tensor *nul[1] = {NULL};
  T_CHECK_ST(e, gcap_optim_sgd(e, 1, nul, 0.1, 0.0, 0.0, &o),
             GCAP_EINVAL); /* rejected later: cleared */
  if (o != NULL)
    T_FAILF("*out == NULL after a failed call",
            "gcap_optim_sgd(NULL parameter) left *out unchanged");
  gcap_tensor_free(p);
  gcap_engine_free(e);
}

/* ------------------------------------------------------------------------ */
/* A training step captured into one graph                                   */

enum { NBATCH = 8, NIN = 6, NHID = 16, NCLS = 4, NSTEPS = 4, MAXP = 8, MAXPN = NHID * NIN };

typedef enum { OPT_SGD, OPT_MOMENTUM, OPT_ADAM } opt_kind;

typedef struct model {
  gcap_module *seq;
  gcap_optim *opt;
  int np;
  gcap_tensor *params[MAXP];
  gcap_tensor *x, *t; /* static inputs */
  gcap_tensor *loss;  /* the last step's loss */
} model;

static gcap_status model_make(gcap_engine *e, model *m, opt_kind k) {
  gcap_module *l1 = NULL, *g = NULL, *d = NULL, *l2 = NULL, *n = NULL;
  const int64_t sx[2] = {NBATCH, NIN}, st[1] = {NBATCH};
  gcap_status s;
  memset(m, 0, sizeof *m);
  if ((s = gcap_nn_linear(e, NIN, NHID, 1, 0, &l1)) != GCAP_OK ||
      (s = gcap_nn_gelu(e, &g)) != GCAP_OK || (s = gcap_nn_dropout(e, 0.25, &d)) != GCAP_OK ||
      (s = gcap_nn_linear(e, NHID, NCLS, 1, 0, &l2)) != GCAP_OK ||
      (s = gcap_nn_layer_norm(e, NCLS, 1e-5, &n)) != GCAP_OK)
    goto done;
  gcap_module *mods[5] = {l1, g, d, l2, n};
  if ((s = gcap_nn_sequential(e, 5, mods, &m->seq)) != GCAP_OK) goto done;
  m->np = gcap_module_num_parameters(m->seq);
  for (int i = 0; i < m->np && i < MAXP; i++)
    m->params[i] = gcap_module_parameter(m->seq, i, NULL, 0);
  if (k == OPT_ADAM)
    s = gcap_optim_adam(e, m->np, m->params, 0.01, 0.9, 0.999, 1e-8, 0.01, &m->opt);
  else
    s = gcap_optim_sgd(e, m->np, m->params, 0.1, k == OPT_MOMENTUM ? 0.9 : 0.0, 0.01, &m->opt);
  if (s != GCAP_OK) goto done;
  if ((s = gcap_tensor_full(e, GCAP_F32, 2, sx, 0.0, &m->x)) != GCAP_OK) goto done;
  s = gcap_tensor_full(e, GCAP_F32, 1, st, 0.0, &m->t);
done:
  gcap_module_free(l1), gcap_module_free(g), gcap_module_free(d), gcap_module_free(l2),
      gcap_module_free(n);
  return s;
}

static void model_free(model *m) {
  gcap_optim_free(m->opt);
  gcap_module_free(m->seq);
  gcap_tensor_free(m->x), gcap_tensor_free(m->t), gcap_tensor_free(m->loss);
}

/* forward, cross_entropy, backward, optimizer step. */
static gcap_status train_step(model *m) {
  gcap_tensor *y = NULL;
  gcap_status s;
  gcap_tensor_free(m->loss);
  m->loss = NULL;
  if ((s = gcap_module_call(m->seq, 1, &m->x, &y)) == GCAP_OK &&
      (s = gcap_cross_entropy(y, m->t, &m->loss)) == GCAP_OK &&
      (s = gcap_backward(m->loss, NULL, 0)) == GCAP_OK)
    s = gcap_optim_step(m->opt);
  gcap_tensor_free(y);
  return s;
}

/* Step k's batch, written into the static inputs (eagerly). */
static gcap_status load_batch(gcap_engine *e, model *m, int k) {
  float x[NBATCH * NIN], t[NBATCH];
  const int64_t sx[2] = {NBATCH, NIN}, st[1] = {NBATCH};
  gcap_tensor *tx = NULL, *tt = NULL;
  gcap_status s;
  for (int i = 0; i < NBATCH * NIN; i++)
    x[i] = sinf(0.41f * (float)i + 0.9f * (float)k) * 1.3f;
  for (int i = 0; i < NBATCH; i++)
    t[i] = (float)((i + k) % NCLS);
  if ((s = gcap_tensor_from_f32(e, GCAP_F32, 2, sx, x, &tx)) == GCAP_OK &&
      (s = gcap_tensor_from_f32(e, GCAP_F32, 1, st, t, &tt)) == GCAP_OK &&
      (s = gcap_copy_(m->x, tx)) == GCAP_OK)
    s = gcap_copy_(m->t, tt);
  gcap_tensor_free(tx), gcap_tensor_free(tt);
  return s;
}

/* All parameters concatenated (and the loss last) into buf. */
static int snapshot(model *m, float *buf, int *n) {
  int at = 0;
  for (int i = 0; i < m->np; i++) {
    int64_t k = gcap_tensor_numel(m->params[i]);
    if (!t_read(m->params[i], buf + at, (size_t)k)) return 0;
    at += (int)k;
  }
  if (m->loss == NULL || !t_read(m->loss, buf + at, 1)) return 0;
  *n = at + 1;
  return 1;
}

enum { SNAP = 2 * MAXP * MAXPN };
static const char *const opt_names[3] = {"SGD", "SGD momentum", "Adam"};

/* Model A trains NSTEPS eager steps; model B (same weights) captures one step
** and replays it NSTEPS times. Both start from the same generator state (the
** Dropout masks), the same batches. warmup: both first take one eager step,
** so optimizer state and .grad exist before the capture (PyTorch's recipe);
** without it, the first step ever is the captured one. */
static void captured_training_case(opt_kind k, int warmup) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  static float eager[NSTEPS][SNAP], replay[SNAP];
  int ne = 0, nr = 0;
  model a, b;
  gcap_graph *g = NULL;
  gcap_status s1 = model_make(e, &a, k), s2 = model_make(e, &b, k);
  if (s1 != GCAP_OK || s2 != GCAP_OK) {
    T_FAILF("model", "%s", gcap_errmsg(e));
    goto done;
  }
  int was = gcap_set_grad_enabled(e, 0); /* A and B drew different weights: make them equal */
  for (int i = 0; i < a.np; i++)
    T_CHECK_OK(e, gcap_copy_(b.params[i], a.params[i]));
  gcap_set_grad_enabled(e, was);

  /* A: eager */
  T_CHECK_OK(e, gcap_manual_seed(e, 1234));
  if (warmup) {
    T_CHECK_OK(e, load_batch(e, &a, 100));
    T_CHECK_OK(e, gcap_optim_zero_grad(a.opt, 1));
    T_CHECK_OK(e, train_step(&a));
  }
  for (int step = 0; step < NSTEPS; step++) {
    T_CHECK_OK(e, load_batch(e, &a, step));
    T_CHECK_OK(e, gcap_optim_zero_grad(a.opt, 1));
    T_CHECK_OK(e, train_step(&a));
    T_REQUIRE(snapshot(&a, eager[step], &ne));
  }
  /* B: captured */
  T_CHECK_OK(e, gcap_manual_seed(e, 1234));
  if (warmup) {
    T_CHECK_OK(e, load_batch(e, &b, 100));
    T_CHECK_OK(e, gcap_optim_zero_grad(b.opt, 1));
    T_CHECK_OK(e, train_step(&b));
  }
  T_CHECK_OK(e, gcap_optim_zero_grad(b.opt, 1));
  T_CHECK_OK(e, gcap_graph_new(e, &g));
  T_CHECK_OK(e, gcap_capture_begin(g, NULL, NULL));
  T_CHECK_OK(e, train_step(&b));
  T_CHECK_OK(e, gcap_capture_end(g));
  for (int step = 0; step < NSTEPS; step++) {
    T_CHECK_OK(e, load_batch(e, &b, step));
    T_CHECK_OK(e, gcap_graph_replay(g));
    T_REQUIRE(snapshot(&b, replay, &nr));
    T_REQUIRE(nr == ne);
    if (memcmp(replay, eager[step], sizeof(float) * (size_t)ne) != 0) {
      int i = 0;
      while (i < ne && memcmp(&replay[i], &eager[step][i], sizeof(float)) == 0)
        i++;
      char what[64] = "the loss";
      for (int j = 0, at = 0; j < b.np; at += (int)gcap_tensor_numel(b.params[j]), j++)
        if (i < at + gcap_tensor_numel(b.params[j])) {
          char pname[32];
          gcap_module_parameter(b.seq, j, pname, sizeof pname);
          snprintf(what, sizeof what, "parameter %s[%d]", pname, i - at);
          break;
        }
      T_FAILF("replayed step == eager step (bitwise)",
              "%s%s: after step %d, %s differs: replay %.9g, eager %.9g", opt_names[k],
              warmup ? " after an eager warm-up step" : ", first step captured", step + 1, what,
              (double)replay[i], (double)eager[step][i]);
      break;
    }
  }
  /* the steps did train: parameters moved */
  T_CHECK(memcmp(eager[0], eager[NSTEPS - 1], sizeof(float) * (size_t)(ne - 1)) != 0);
done:
  model_free(&a), model_free(&b);
  gcap_graph_free(g);
  gcap_engine_free(e);
}

static void test_captured_step_sgd_warmup(void) {
  captured_training_case(OPT_SGD, 1);
}
static void test_captured_step_momentum_warmup(void) {
  captured_training_case(OPT_MOMENTUM, 1);
}
static void test_captured_step_adam_warmup(void) {
  captured_training_case(OPT_ADAM, 1);
}
static void test_captured_first_step_sgd(void) {
  captured_training_case(OPT_SGD, 0);
}
static void test_captured_first_step_momentum(void) {
  captured_training_case(OPT_MOMENTUM, 0);
}
static void test_captured_first_step_adam(void) {
  captured_training_case(OPT_ADAM, 0);
}

/* regression: a step's in-place write under a saved parameter went unseen */
/* A leaf parameter changed by an optimizer step after its use was saved
** (the input requires grad, so linear keeps the weight for the input's
** grad): a second backward (retain_graph) fails; the ordinary loop does not. */
static void test_optimizer_step_versions(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[2] = {2, 3};
  const float d[6] = {1, 2, 3, 4, 5, 6};
  gcap_module *m = NULL;
  gcap_optim *o = NULL;
  gcap_tensor *x = t_from(e, 2, s, d), *y = NULL, *loss = NULL, *w;
  T_REQUIRE(x != NULL);
  T_CHECK_OK(e, gcap_tensor_set_requires_grad(x, 1));
  T_CHECK_OK(e, gcap_nn_linear(e, 3, 2, 1, 0, &m));
  w = gcap_module_parameter(m, 0, NULL, 0);
  T_CHECK_OK(e, gcap_optim_sgd(e, 1, &w, 0.1, 0, 0, &o));
  for (int it = 0; it < 3; it++) { /* forward, backward, step: no alarm */
    uint64_t before = gcap_tensor_version(w);
    T_CHECK_OK(e, gcap_module_call(m, 1, &x, &y));
    T_CHECK_OK(e, gcap_sum(y, &loss));
    T_CHECK_OK(e, gcap_backward(loss, NULL, 0));
    T_CHECK_OK(e, gcap_optim_step(o));
    T_CHECK(gcap_tensor_version(w) > before); /* the step wrote w in place */
    T_CHECK_OK(e, gcap_optim_zero_grad(o, 1));
    gcap_tensor_free(y), gcap_tensor_free(loss);
  }
  T_CHECK_OK(e, gcap_module_call(m, 1, &x, &y));
  T_CHECK_OK(e, gcap_sum(y, &loss));
  T_CHECK_OK(e, gcap_backward(loss, NULL, 1)); /* keeps what linear saved */
  T_CHECK_OK(e, gcap_optim_step(o));
  T_CHECK_ST(e, gcap_backward(loss, NULL, 0), GCAP_ESTATE);
  T_CHECK(t_msg_has(e, "inplace") && t_msg_has(e, "'linear'"));
  gcap_tensor_free(y), gcap_tensor_free(loss), gcap_tensor_free(x);
  gcap_optim_free(o);
  gcap_module_free(m);
  gcap_engine_free(e);
}

/* Copy the parameters, hyperparameters and state (gcap_optim_state) of
** `from` into `to`, an optimizer of the same kind on another engine over
** parameters of the same shapes, through host bytes as a checkpoint does. */
static int copy_optim(const gcap_optim *from, gcap_optim *to) {
  static const char *const hyper[6] = {"lr", "momentum", "beta1", "beta2", "eps", "weight_decay"};
  float buf[MAXN];
  const char *name, *name2;
  gcap_tensor *t, *u;
  double v;
  for (int h = 0; h < 6; h++)
    if (gcap_optim_hyper(from, hyper[h], &v) == GCAP_OK &&
        gcap_optim_set_hyper(to, hyper[h], v) != GCAP_OK)
      return 0;
  for (int i = 0; i < gcap_optim_num_params(from); i++) {
    t = gcap_optim_param(from, i), u = gcap_optim_param(to, i);
    size_t n = (size_t)gcap_tensor_numel(t) * sizeof(float);
    if (gcap_tensor_read_bytes(t, buf, n) != GCAP_OK ||
        gcap_tensor_write_bytes(u, buf, n) != GCAP_OK)
      return 0;
    for (int k = 0; (t = gcap_optim_state(from, i, k, &name)) != NULL; k++) {
      n = (size_t)gcap_tensor_numel(t) * sizeof(float);
      u = gcap_optim_state(to, i, k, &name2);
      if (u == NULL || strcmp(name, name2) != 0 || gcap_tensor_read_bytes(t, buf, n) != GCAP_OK ||
          gcap_tensor_write_bytes(u, buf, n) != GCAP_OK)
        return 0;
    }
  }
  return 1;
}

/* Two steps, then everything copied into an optimizer made with other
** hyperparameters (an SGD without momentum makes its buffers when given
** one): the next two steps of both are equal bit for bit. */
static void state_case(int adam) {
  static const char *const names[2][4] = {{"momentum_buffer", NULL},
                                          {"step", "exp_avg", "exp_avg_sq", NULL}};
  fixture a, b;
  gcap_optim *oa = NULL, *ob = NULL;
  const char *name = NULL;
  float pa[MAXN], pb[MAXN];
  T_SETUP(fixture_make(&a) && fixture_make(&b), (fixture_free(&a), fixture_free(&b)));
  if (adam) {
    T_CHECK(gcap_optim_adam(a.e, NP, a.p, 0.01, 0.8, 0.95, 1e-6, 0.01, &oa) == GCAP_OK &&
            gcap_optim_adam(b.e, NP, b.p, 1.0, 0.5, 0.5, 0.1, 0.0, &ob) == GCAP_OK);
  } else {
    T_CHECK(gcap_optim_sgd(a.e, NP, a.p, 0.05, 0.9, 0.01, &oa) == GCAP_OK &&
            gcap_optim_sgd(b.e, NP, b.p, 1.0, 0.0, 0.0, &ob) == GCAP_OK);
    T_CHECK(gcap_optim_state(ob, 0, 0, NULL) == NULL); /* no momentum, no buffer yet */
  }
  for (int k = 0; k < 4 && oa && ob; k++) {
    if (k == 2) T_CHECK(copy_optim(oa, ob));
    for (int j = 0; j < NP; j++)
      T_CHECK(set_step_grad(&a, j, k) && (k < 2 || set_step_grad(&b, j, k)));
    T_CHECK_OK(a.e, gcap_optim_step(oa));
    if (k >= 2) T_CHECK_OK(b.e, gcap_optim_step(ob));
  }
  for (int k = 0; k < 4; k++) {
    gcap_tensor *t = gcap_optim_state(oa, 1, k, &name);
    T_CHECK(names[adam][k] == NULL ? t == NULL : t != NULL && strcmp(name, names[adam][k]) == 0);
  }
  for (int j = 0; j < NP; j++)
    if (t_read(a.p[j], pa, (size_t)pn[j]) && t_read(b.p[j], pb, (size_t)pn[j]))
      T_CHECK(memcmp(pa, pb, (size_t)pn[j] * sizeof(float)) == 0);
  gcap_optim_free(oa), gcap_optim_free(ob);
  fixture_free(&a), fixture_free(&b);
}
static void test_state_restore_sgd(void) {
  state_case(0);
}
static void test_state_restore_adam(void) {
  state_case(1);
}

int main(void) {
  T_RUN(test_sgd_plain);
  T_RUN(test_sgd_plain_steps);
  T_RUN(test_sgd_weight_decay);
  T_RUN(test_sgd_momentum);
  T_RUN(test_sgd_momentum_wd);
  T_RUN(test_adam_one_step);
  T_RUN(test_adam_steps);
  T_RUN(test_adam_betas_eps_wd);
  T_RUN(test_skips_params_without_grad);
  T_RUN(test_late_grad_sgd_momentum);
  T_RUN(test_late_grad_adam);
  T_RUN(test_zero_grad);
  T_RUN(test_bad_arguments);
  T_RUN(test_failed_constructor_clears_out);
  T_RUN(test_captured_step_sgd_warmup);
  T_RUN(test_captured_step_momentum_warmup);
  T_RUN(test_captured_step_adam_warmup);
  T_RUN(test_captured_first_step_sgd);
  T_RUN(test_captured_first_step_momentum);
  T_RUN(test_captured_first_step_adam);
  T_RUN(test_optimizer_step_versions);
  T_RUN(test_state_restore_sgd);
  T_RUN(test_state_restore_adam);
  return t_done();
}
