/*
** test_optim_lr.c: optimizers (graphcap.h "Optimizers") whose learning rate
** changes between steps (gcap_optim_set_lr, what a schedule does): AdamW and
** Adam against references computed in double on the host (PyTorch's update
** rules), a step captured once that replays with the rate set since and the
** step count it reaches, bitwise equal to eager steps, and the refusals.
*/
#include <stdint.h>

#include "t.h"
#include "t_optim.h"

/* Adam (decoupled 0) or AdamW (1) whose learning rate a schedule sets
** before every step after the first: lr / (k + 1) for step k. */
static void adam_sched_case(const char *what, int decoupled, double lr, double wd, int steps) {
  fixture f;
  gcap_optim *o = NULL;
  adam_ref a;
  memset(&a, 0, sizeof a);
  T_SETUP(fixture_make(&f), fixture_free(&f));
  gcap_engine *e = f.e;
  T_CHECK_OK(e, decoupled ? gcap_optim_adamw(e, NP, f.p, lr, 0.9, 0.999, 1e-8, wd, &o)
                          : gcap_optim_adam(e, NP, f.p, lr, 0.9, 0.999, 1e-8, wd, &o));
  for (int k = 0; k < steps; k++) {
    double lk = lr / (k + 1);
    if (k > 0) T_CHECK_OK(e, gcap_optim_set_lr(o, lk));
    T_CHECK(gcap_optim_lr(o) == lk);
    for (int j = 0; j < NP; j++) {
      T_REQUIRE(set_step_grad(&f, j, k));
      adam_ref_step(&f, &a, j, k, lk, 0.9, 0.999, 1e-8, wd, decoupled);
    }
    T_CHECK_OK(e, gcap_optim_step(o));
    check_params(&f, what, k + 1);
  }
  gcap_optim_free(o);
  fixture_free(&f);
}

static void test_adamw_steps(void) {
  adam_sched_case("AdamW lr 0.01 wd 0.01 (PyTorch's defaults but lr)", 1, 0.01, 0.01, 1);
  adam_sched_case("AdamW lr 0.05 wd 0.1, lr scheduled", 1, 0.05, 0.1, 5);
}
static void test_adam_scheduled(void) {
  adam_sched_case("Adam lr 0.05 wd 0.1, lr scheduled", 0, 0.05, 0.1, 5);
}

/* A step captured once replays with the learning rate set since and the
** step count it reaches (bias correction), bitwise equal to eager steps. */
static void test_captured_step_follows_lr(void) {
  static const char *const names[3] = {"SGD momentum", "Adam", "AdamW"};
  for (int kind = 0; kind < 3; kind++) {
    fixture a, b;
    gcap_optim *oa = NULL, *ob = NULL;
    gcap_graph *g = NULL;
    T_SETUP(fixture_make(&a), fixture_free(&a));
    T_SETUP(fixture_make(&b), (fixture_free(&a), fixture_free(&b)));
    for (int m = 0; m < 2; m++) {
      fixture *f = m ? &b : &a;
      gcap_optim **o = m ? &ob : &oa;
      T_CHECK_OK(f->e, kind == 0 ? gcap_optim_sgd(f->e, NP, f->p, 0.1, 0.9, 0.01, o)
                       : kind == 1
                           ? gcap_optim_adam(f->e, NP, f->p, 0.01, 0.9, 0.999, 1e-8, 0.1, o)
                           : gcap_optim_adamw(f->e, NP, f->p, 0.01, 0.9, 0.999, 1e-8, 0.1, o));
    }
    for (int j = 0; j < NP; j++) /* b's .grad tensors, whose addresses the graph reads */
      T_REQUIRE(set_step_grad(&b, j, 0));
    T_CHECK_OK(b.e, gcap_graph_new(b.e, &g));
    T_CHECK_OK(b.e, gcap_capture_begin(g, NULL, NULL));
    T_CHECK_OK(b.e, gcap_optim_step(ob));
    T_CHECK_OK(b.e, gcap_capture_end(g));
    for (int k = 0; k < 5; k++) {
      double lr = (kind == 0 ? 0.1 : 0.01) * (k + 1) / 5.0; /* a warmup schedule */
      T_CHECK_OK(a.e, gcap_optim_set_lr(oa, lr));
      T_CHECK_OK(b.e, gcap_optim_set_lr(ob, lr));
      for (int j = 0; j < NP; j++) {
        float d[MAXN];
        gcap_tensor *tmp;
        T_REQUIRE(set_step_grad(&a, j, k));
        for (int i = 0; i < pn[j]; i++)
          d[i] = grad_value(j, i, k);
        T_REQUIRE((tmp = t_from(b.e, pnd[j], pshape[j], d)) != NULL);
        T_CHECK_OK(b.e, gcap_copy_(gcap_tensor_grad(b.p[j]), tmp));
        gcap_tensor_free(tmp);
      }
      T_CHECK_OK(a.e, gcap_optim_step(oa));
      T_CHECK_OK(b.e, gcap_graph_replay(g));
      for (int j = 0; j < NP; j++) {
        float pa[MAXN], pb[MAXN];
        if (t_read(a.p[j], pa, (size_t)pn[j]) && t_read(b.p[j], pb, (size_t)pn[j]) &&
            memcmp(pa, pb, sizeof(float) * (size_t)pn[j]) != 0)
          T_FAILF("replayed step == eager step (bitwise)", "%s, step %d, parameter %d", names[kind],
                  k + 1, j);
      }
    }
    gcap_graph_free(g);
    gcap_optim_free(oa), gcap_optim_free(ob);
    fixture_free(&a), fixture_free(&b);
  }
}

/* set_lr refuses a negative rate, and a capture in progress (invalidated). */
static void test_set_lr_refused(void) {
  fixture f;
  gcap_optim *o = NULL;
  gcap_graph *g = NULL;
  T_SETUP(fixture_make(&f), fixture_free(&f));
  T_CHECK_OK(f.e, gcap_optim_sgd(f.e, NP, f.p, 0.1, 0, 0, &o));
  T_CHECK_ST(f.e, gcap_optim_set_lr(o, -0.5), GCAP_EINVAL);
  T_CHECK(t_msg_has(f.e, "set_lr: lr is -0.5"));
  T_CHECK(gcap_optim_lr(o) == 0.1);
  T_CHECK_OK(f.e, gcap_graph_new(f.e, &g));
  T_CHECK_OK(f.e, gcap_capture_begin(g, NULL, NULL));
  T_CHECK_ST(f.e, gcap_optim_set_lr(o, 0.5), GCAP_ECAPTURE);
  T_CHECK(t_msg_has(f.e, "set_lr: setting the learning rate is not allowed while a capture"));
  T_CHECK(gcap_capture_end(g) != GCAP_OK);
  T_CHECK(gcap_optim_lr(o) == 0.1);
  gcap_graph_free(g);
  gcap_optim_free(o);
  fixture_free(&f);
}

int main(void) {
  T_RUN(test_adamw_steps);
  T_RUN(test_adam_scheduled);
  T_RUN(test_captured_step_follows_lr);
  T_RUN(test_set_lr_refused);
  return t_done();
}
