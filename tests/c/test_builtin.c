/*
** test_builtin.c: the built-in modules (graphcap.h "Modules"): Dropout in
** eval, Linear's initialisation, Sequential against the composition of its
** children, and the delayed-wgrad Linear with backward_dw.
*/
#include <stdint.h>

#include "t.h"
#include "t_module.h"

/* Dropout in eval: the identity, bitwise, and grads pass through unchanged. */
static void test_dropout_eval_identity(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  enum { NX = 200 };
  const int64_t s[2] = {10, 20};
  static float xin[NX], yout[NX], g[NX];
  gcap_module *d = NULL;
  gcap_tensor *x = t_input(e, 2, s, 1, 0.1f), *y = NULL, *l = NULL;
  T_REQUIRE(x != NULL);
  T_CHECK_OK(e, gcap_nn_dropout(e, 0.5, &d));
  T_REQUIRE(t_read(x, xin, NX));
  /* training: some zeros */
  T_CHECK_OK(e, gcap_module_call(d, 1, &x, &y));
  T_REQUIRE(t_read(y, yout, NX));
  int zeros = 0;
  for (int i = 0; i < NX; i++)
    zeros += yout[i] == 0.0f;
  T_CHECK(zeros > 50 && zeros < 150);
  gcap_tensor_free(y), y = NULL;
  /* eval: identity */
  gcap_module_train(d, 0);
  T_CHECK_OK(e, gcap_module_call(d, 1, &x, &y));
  T_REQUIRE(t_read(y, yout, NX));
  T_CHECK(memcmp(xin, yout, sizeof xin) == 0);
  T_CHECK_OK(e, gcap_sum(y, &l));
  T_CHECK_OK(e, gcap_backward(l, NULL, 0));
  T_REQUIRE(gcap_tensor_grad(x) != NULL && t_read(gcap_tensor_grad(x), g, NX));
  int ones = 1;
  for (int i = 0; i < NX; i++)
    ones &= g[i] == 1.0f;
  T_CHECK(ones);
  /* p = 0 in training is the identity too */
  gcap_module *d0 = NULL;
  gcap_tensor *y0 = NULL;
  T_CHECK_OK(e, gcap_nn_dropout(e, 0.0, &d0));
  T_CHECK_OK(e, gcap_module_call(d0, 1, &x, &y0));
  if (t_read(y0, yout, NX)) T_CHECK(memcmp(xin, yout, sizeof xin) == 0);
  /* bad p */
  gcap_module *bad = (gcap_module *)(uintptr_t)0x10;
  T_CHECK_ST(e, gcap_nn_dropout(e, 1.5, &bad), GCAP_EINVAL);
  T_CHECK(bad == NULL);
  gcap_tensor_free(x), gcap_tensor_free(y), gcap_tensor_free(l), gcap_tensor_free(y0);
  gcap_module_free(d), gcap_module_free(d0);
  gcap_engine_free(e);
}

/* Linear's init: U(-1/sqrt(in), 1/sqrt(in)) from the engine's generator. */
static void test_linear_init(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  gcap_module *a = NULL, *b = NULL, *nb = NULL;
  float wa[64 * 16], wb[64 * 16];
  T_CHECK_OK(e, gcap_manual_seed(e, 11));
  T_CHECK_OK(e, gcap_nn_linear(e, 64, 16, 1, 0, &a));
  T_CHECK_OK(e, gcap_manual_seed(e, 11));
  T_CHECK_OK(e, gcap_nn_linear(e, 64, 16, 1, 0, &b));
  T_CHECK_OK(e, gcap_nn_linear(e, 64, 16, 0, 0, &nb));
  T_CHECK(gcap_module_num_parameters(a) == 2 && gcap_module_num_parameters(nb) == 1);
  T_REQUIRE(t_read(gcap_module_parameter(a, 0, NULL, 0), wa, 64 * 16));
  T_REQUIRE(t_read(gcap_module_parameter(b, 0, NULL, 0), wb, 64 * 16));
  T_CHECK(memcmp(wa, wb, sizeof wa) == 0); /* same seed, same weights */
  float lo = 1, hi = -1;
  for (int i = 0; i < 64 * 16; i++)
    lo = fminf(lo, wa[i]), hi = fmaxf(hi, wa[i]);
  T_CHECK(lo >= -0.125f && hi <= 0.125f); /* 1/sqrt(64) */
  T_CHECK(lo < -0.1f && hi > 0.1f);       /* spread over the range */
  T_CHECK(
      t_bitwise_equal(gcap_module_parameter(a, 1, NULL, 0), gcap_module_parameter(b, 1, NULL, 0)));
  gcap_module *bad = NULL;
  T_CHECK_ST(e, gcap_nn_linear(e, 0, 3, 1, 0, &bad), GCAP_EINVAL);
  T_CHECK(bad == NULL);
  gcap_module_free(a), gcap_module_free(b), gcap_module_free(nb);
  gcap_engine_free(e);
}

/* A Sequential computes the composition of its children; grads equal. */
static void test_sequential_equals_composition(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[2] = {5, 4};
  gcap_module *l1 = NULL, *g = NULL, *ln = NULL, *l2 = NULL, *seq = NULL, *c1 = NULL, *c2 = NULL;
  gcap_tensor *x = t_input(e, 2, s, 1, 0.0f), *x2 = t_input(e, 2, s, 1, 0.0f), *y = NULL,
              *h1 = NULL, *h2 = NULL, *h3 = NULL, *y2 = NULL;
  T_REQUIRE(x && x2);
  T_CHECK_OK(e, gcap_nn_linear(e, 4, 6, 1, 0, &l1));
  T_CHECK_OK(e, gcap_nn_gelu(e, &g));
  T_CHECK_OK(e, gcap_nn_layer_norm(e, 6, 1e-5, &ln));
  T_CHECK_OK(e, gcap_nn_linear(e, 6, 3, 0, 0, &l2));
  T_CHECK(strcmp(gcap_module_type(g), "GELU") == 0);
  gcap_module *mods[4] = {l1, g, ln, l2};
  T_CHECK_OK(e, gcap_nn_sequential(e, 4, mods, &seq));
  T_CHECK_OK(e, gcap_module_call(seq, 1, &x, &y));
  T_CHECK(gcap_tensor_ndim(y) == 2 && gcap_tensor_shape(y)[0] == 5 && gcap_tensor_shape(y)[1] == 3);
  T_CHECK_OK(e, t_backward_weighted(y));
  /* the same by hand, on copies of the parameters */
  T_CHECK_OK(e, gcap_nn_linear(e, 4, 6, 1, 0, &c1));
  T_CHECK_OK(e, gcap_nn_linear(e, 6, 3, 0, 0, &c2));
  T_CHECK_OK(e, t_copy_params(c1, l1));
  T_CHECK_OK(e, t_copy_params(c2, l2));
  T_CHECK_OK(e, gcap_linear(x2, gcap_module_parameter(c1, 0, NULL, 0),
                            gcap_module_parameter(c1, 1, NULL, 0), &h1));
  T_CHECK_OK(e, gcap_gelu(h1, &h2));
  T_CHECK_OK(e, gcap_layer_norm(h2, NULL, NULL, 1e-5, &h3)); /* weight 1, bias 0 */
  T_CHECK_OK(e, gcap_linear(h3, gcap_module_parameter(c2, 0, NULL, 0), NULL, &y2));
  T_CHECK(t_bitwise_equal(y, y2));
  T_CHECK_OK(e, t_backward_weighted(y2));
  T_CHECK(t_bitwise_equal(gcap_tensor_grad(x), gcap_tensor_grad(x2)));
  T_CHECK(t_bitwise_equal(gcap_tensor_grad(gcap_module_parameter(l1, 0, NULL, 0)),
                          gcap_tensor_grad(gcap_module_parameter(c1, 0, NULL, 0))));
  T_CHECK(t_bitwise_equal(gcap_tensor_grad(gcap_module_parameter(l2, 0, NULL, 0)),
                          gcap_tensor_grad(gcap_module_parameter(c2, 0, NULL, 0))));
  /* LayerNorm's own parameters got grads */
  T_CHECK(gcap_tensor_grad(gcap_module_parameter(ln, 0, NULL, 0)) != NULL);
  T_CHECK(gcap_tensor_grad(gcap_module_parameter(ln, 1, NULL, 0)) != NULL);
  /* zero_grad: zero in place, or clear */
  gcap_tensor *w1 = gcap_module_parameter(seq, 0, NULL, 0);
  uintptr_t addr = gcap_tensor_data_ptr(gcap_tensor_grad(w1));
  T_CHECK_OK(e, gcap_module_zero_grad(seq, 0));
  T_CHECK(gcap_tensor_grad(w1) != NULL && gcap_tensor_data_ptr(gcap_tensor_grad(w1)) == addr);
  float z[24];
  if (t_read(gcap_tensor_grad(w1), z, 24)) {
    int allz = 1;
    for (int i = 0; i < 24; i++)
      allz &= z[i] == 0.0f;
    T_CHECK(allz);
  }
  T_CHECK_OK(e, gcap_module_zero_grad(seq, 1));
  for (int i = 0; i < gcap_module_num_parameters(seq); i++)
    T_CHECK(gcap_tensor_grad(gcap_module_parameter(seq, i, NULL, 0)) == NULL);
  gcap_tensor_free(x), gcap_tensor_free(x2), gcap_tensor_free(y), gcap_tensor_free(h1),
      gcap_tensor_free(h2);
  gcap_tensor_free(h3), gcap_tensor_free(y2);
  gcap_module_free(l1), gcap_module_free(g), gcap_module_free(ln), gcap_module_free(l2);
  gcap_module_free(seq), gcap_module_free(c1), gcap_module_free(c2);
  gcap_engine_free(e);
}

/* ------------------------------------------------------------------------ */
/* Delayed wgrad                                                             */

static void test_delay_wgrad(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[3] = {2, 3, 4};
  gcap_module *d = NULL, *r = NULL, *seq = NULL;
  gcap_tensor *xd = t_input(e, 3, s, 1, 0.2f), *xr = t_input(e, 3, s, 1, 0.2f), *yd = NULL,
              *yr = NULL;
  T_REQUIRE(xd && xr);
  T_CHECK_OK(e, gcap_nn_linear(e, 4, 5, 1, 1, &d));
  T_CHECK_OK(e, gcap_nn_linear(e, 4, 5, 1, 0, &r));
  T_CHECK_OK(e, t_copy_params(r, d));
  T_CHECK(gcap_module_has_delayed_wgrad(d) == 1 && gcap_module_has_delayed_wgrad(r) == 0);
  T_CHECK_OK(e, gcap_nn_sequential(e, 1, &d, &seq));
  T_CHECK(gcap_module_has_delayed_wgrad(seq) == 1);
  gcap_tensor *wd = gcap_module_parameter(d, 0, NULL, 0),
              *bd = gcap_module_parameter(d, 1, NULL, 0);
  gcap_tensor *wr = gcap_module_parameter(r, 0, NULL, 0),
              *br = gcap_module_parameter(r, 1, NULL, 0);
  T_CHECK_OK(e, gcap_module_backward_dw(d)); /* nothing pending: nothing happens */
  T_CHECK(gcap_tensor_grad(wd) == NULL);
  T_CHECK_OK(e, gcap_module_call(d, 1, &xd, &yd));
  T_CHECK_OK(e, gcap_module_call(r, 1, &xr, &yr));
  T_CHECK(t_bitwise_equal(yd, yr));
  T_CHECK_OK(e, t_backward_weighted(yd));
  T_CHECK_OK(e, t_backward_weighted(yr));
  T_CHECK(gcap_tensor_grad(wd) == NULL && gcap_tensor_grad(bd) == NULL); /* deferred */
  T_CHECK(gcap_tensor_grad(xd) != NULL);                                 /* dgrad computed */
  T_CHECK(t_bitwise_equal(gcap_tensor_grad(xd), gcap_tensor_grad(xr)));
  T_CHECK_OK(e, gcap_module_backward_dw(d));
  T_REQUIRE(gcap_tensor_grad(wd) != NULL && gcap_tensor_grad(bd) != NULL);
  T_CHECK(t_has_shape(gcap_tensor_grad(wd), 2, gcap_tensor_shape(wd)));
  T_CHECK(t_bitwise_equal(gcap_tensor_grad(wd), gcap_tensor_grad(wr)));
  T_CHECK(t_bitwise_equal(gcap_tensor_grad(bd), gcap_tensor_grad(br)));
  T_CHECK_OK(e, gcap_module_backward_dw(d)); /* drained: a second call adds nothing */
  T_CHECK(t_bitwise_equal(gcap_tensor_grad(wd), gcap_tensor_grad(wr)));
  /* two steps before backward_dw (through the Sequential): both accumulate,
  ** oldest first, as two ordinary backwards do */
  gcap_tensor_free(yd), gcap_tensor_free(yr);
  yd = yr = NULL;
  for (int k = 0; k < 2; k++) {
    T_CHECK_OK(e, gcap_module_call(seq, 1, &xd, &yd));
    T_CHECK_OK(e, gcap_module_call(r, 1, &xr, &yr));
    T_CHECK_OK(e, t_backward_weighted(yd));
    T_CHECK_OK(e, t_backward_weighted(yr));
    gcap_tensor_free(yd), gcap_tensor_free(yr);
    yd = yr = NULL;
  }
  T_CHECK(!t_bitwise_equal(gcap_tensor_grad(wd), gcap_tensor_grad(wr))); /* pending */
  T_CHECK_OK(e, gcap_module_backward_dw(seq));
  T_CHECK(t_bitwise_equal(gcap_tensor_grad(wd), gcap_tensor_grad(wr)));
  T_CHECK(t_bitwise_equal(gcap_tensor_grad(bd), gcap_tensor_grad(br)));
  T_CHECK(t_bitwise_equal(gcap_tensor_grad(xd), gcap_tensor_grad(xr)));
  gcap_tensor_free(xd), gcap_tensor_free(xr);
  gcap_module_free(d), gcap_module_free(r), gcap_module_free(seq);
  gcap_engine_free(e);
}

/* Without bias, and with the input not requiring grad. */
static void test_delay_wgrad_no_bias(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[2] = {6, 3};
  gcap_module *d = NULL, *r = NULL;
  gcap_tensor *x = t_input(e, 2, s, 0, 1.0f), *yd = NULL, *yr = NULL;
  T_REQUIRE(x != NULL);
  T_CHECK_OK(e, gcap_nn_linear(e, 3, 2, 0, 1, &d));
  T_CHECK_OK(e, gcap_nn_linear(e, 3, 2, 0, 0, &r));
  T_CHECK_OK(e, t_copy_params(r, d));
  T_CHECK_OK(e, gcap_module_call(d, 1, &x, &yd));
  T_CHECK_OK(e, gcap_module_call(r, 1, &x, &yr));
  T_CHECK_OK(e, t_backward_weighted(yd));
  T_CHECK_OK(e, t_backward_weighted(yr));
  gcap_tensor *wd = gcap_module_parameter(d, 0, NULL, 0),
              *wr = gcap_module_parameter(r, 0, NULL, 0);
  T_CHECK(gcap_tensor_grad(wd) == NULL);
  T_CHECK_OK(e, gcap_module_backward_dw(d));
  T_CHECK(t_bitwise_equal(gcap_tensor_grad(wd), gcap_tensor_grad(wr)));
  gcap_tensor_free(x), gcap_tensor_free(yd), gcap_tensor_free(yr);
  gcap_module_free(d), gcap_module_free(r);
  gcap_engine_free(e);
}

int main(void) {
  T_RUN(test_dropout_eval_identity);
  T_RUN(test_linear_init);
  T_RUN(test_sequential_equals_composition);
  T_RUN(test_delay_wgrad);
  T_RUN(test_delay_wgrad_no_bias);
  return t_done();
}
