/*
** test_fp8.c: FP8 through the C API: gcap_fp8_cast (saturation, rounding,
** the amax), the recipes' defaults and the autocast's checks naming the
** field, a Linear's FP8 state after steps under an autocast, and
** make_graphed_callables' FP8 options: the state as before the call,
** graphed = eager bit for bit, is_first_microbatch with weight caching.
*/
#include "t.h"

#define ROWS 8
#define IN 16
#define OUT 16

static void test_cast(void) {
  gcap_engine *e = t_engine();
  const int64_t n = 5;
  const float x[5] = {1.0f, 500.0f, -1e30f, 0.3f, 3.0f * 0.0009765625f};
  const float want[5] = {1.0f, 448.0f, -448.0f, 0.3125f, 0.00390625f};
  float got[5];
  gcap_tensor *t, *y = NULL, *amax = NULL;
  int i;
  T_SETUP(e != NULL, (void)0);
  t = t_from(e, 1, &n, x);
  T_CHECK_OK(e, gcap_fp8_cast(t, GCAP_FP8_E4M3, 1.0, &y, &amax));
  if (y != NULL && t_read(y, got, 5))
    for (i = 0; i < 5; i++)
      T_CHECK(got[i] == want[i]);
  if (amax != NULL) T_CHECK(t_value(amax) == (double)1e30f);
  gcap_tensor_free(y);
  T_CHECK_ST(e, gcap_fp8_cast(t, GCAP_FP8_E4M3, 0.0, &y, NULL), GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "fp8.cast: scale must be a finite number > 0"));
  T_CHECK_ST(e, gcap_fp8_cast(t, (gcap_fp8_format)7, 1.0, &y, NULL), GCAP_EINVAL);
  T_CHECK(y == NULL);
  gcap_tensor_free(t);
  gcap_tensor_free(amax);
  gcap_engine_free(e);
}

static void test_recipes_and_autocast(void) {
  gcap_engine *e = t_engine();
  gcap_fp8_autocast a, prev;
  char why[200];
  T_SETUP(e != NULL, (void)0);
  memset(&a, 0, sizeof a);
  gcap_fp8_recipe_init(&a.recipe, GCAP_FP8_DELAYED_SCALING);
  T_CHECK(a.recipe.fp8_format == GCAP_FP8_HYBRID && a.recipe.margin == 0.0 &&
          a.recipe.amax_history_len == 1024 && a.recipe.amax_compute_algo == GCAP_AMAX_MAX);
  if (t_device() == GCAP_DEVICE_HOST) T_CHECK(gcap_fp8_is_available(e, why, sizeof why) == 1);
  a.enabled = 1;
  a.recipe.amax_history_len = 0;
  T_CHECK_ST(e, gcap_fp8_set_autocast(e, &a, &prev), GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "amax_history_len must be >= 1, got 0"));
  a.recipe.amax_history_len = 4;
  a.recipe.margin = NAN;
  T_CHECK_ST(e, gcap_fp8_set_autocast(e, &a, &prev), GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "margin must be a finite number"));
  a.recipe.margin = 0.0;
  a.recipe.amax_compute_algo = (gcap_amax_algo)9;
  T_CHECK_ST(e, gcap_fp8_set_autocast(e, &a, &prev), GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "amax_compute_algo"));
  gcap_engine_free(e);
}

/* n steps of sum(m(x)) backward, under an FP8 autocast of history 4 when
** `fp8` (the graphed module replays its own). */
static gcap_status steps(gcap_engine *e, gcap_module *m, gcap_tensor *x, int n, int fp8) {
  gcap_fp8_autocast a, prev;
  gcap_status st = GCAP_OK;
  int k;
  memset(&a, 0, sizeof a);
  a.enabled = fp8;
  gcap_fp8_recipe_init(&a.recipe, GCAP_FP8_DELAYED_SCALING);
  a.recipe.amax_history_len = 4;
  for (k = 0; k < n && st == GCAP_OK; k++) {
    gcap_tensor *y = NULL, *l = NULL;
    if ((st = gcap_fp8_set_autocast(e, &a, &prev)) != GCAP_OK) break;
    st = gcap_module_call(m, 1, &x, &y);
    gcap_fp8_set_autocast(e, &prev, NULL);
    if (st == GCAP_OK) st = gcap_sum(y, &l);
    if (st == GCAP_OK) st = gcap_backward(l, NULL, 0);
    gcap_tensor_free(y);
    gcap_tensor_free(l);
  }
  return st;
}

static void test_graphed_equals_eager(void) {
  gcap_engine *e = t_engine();
  gcap_module *m[2] = {NULL, NULL};
  gcap_tensor *x = NULL;
  gcap_graphed *g = NULL;
  gcap_graphed_opts o;
  gcap_fp8_recipe r;
  const int64_t shape[2] = {ROWS, IN};
  const int on = 1;
  float s[2], h[2][4], w[2][IN * OUT];
  int len, i, j;
  T_SETUP(e != NULL, (void)0);
  for (i = 0; i < 2; i++) {
    gcap_manual_seed(e, 5);
    T_CHECK_OK(e, gcap_nn_linear(e, IN, OUT, 1, 0, &m[i]));
  }
  T_SETUP(m[0] != NULL && m[1] != NULL && gcap_tensor_rand(e, GCAP_F32, 2, shape, 1, &x) == GCAP_OK,
          (gcap_module_free(m[0]), gcap_module_free(m[1]), gcap_engine_free(e)));
  T_CHECK(gcap_module_fp8_gemms(m[0]) == 1);
  gcap_graphed_opts_init(&o);
  gcap_fp8_recipe_init(&r, GCAP_FP8_DELAYED_SCALING);
  r.amax_history_len = 4;
  o.fp8_enabled = &on;
  o.fp8_recipe = &r;
  T_CHECK_OK(e, gcap_make_graphed_callables(e, 1, &m[1], 1, (const int[]){1},
                                            (gcap_tensor *const *const[]){&x}, &o, &g));
  T_CHECK_OK(e, gcap_module_fp8_state(m[1], 0, 0, 4, &s[1], h[1], &len));
  T_CHECK(len == 4 && s[1] == 1.0f && h[1][0] == 0.0f); /* as before the call */
  T_CHECK_OK(e, steps(e, m[0], x, 3, 1));
  T_CHECK_OK(e, steps(e, m[1], x, 3, 0)); /* replays: FP8 as captured */
  for (i = 0; i < 3; i++) {
    T_CHECK_OK(e, gcap_module_fp8_state(m[0], 0, i, 4, &s[0], h[0], &len));
    T_CHECK_OK(e, gcap_module_fp8_state(m[1], 0, i, 4, &s[1], h[1], &len));
    T_CHECK(s[0] == s[1] && s[0] != 1.0f);
    for (j = 0; j < 4; j++)
      T_CHECK(h[0][j] == h[1][j]);
  }
  for (i = 0; i < 2; i++)
    T_CHECK(t_read(gcap_tensor_grad(gcap_module_parameter(m[i], 0, NULL, 0)), w[i], IN * OUT));
  T_CHECK(memcmp(w[0], w[1], sizeof w[0]) == 0);
  T_CHECK_ST(e, gcap_module_set_is_first_microbatch(m[1], 1), GCAP_OK);
  T_CHECK_ST(e, steps(e, m[1], x, 1, 0), GCAP_EINVAL); /* no weight caching */
  T_CHECK(t_msg_has(e, "is_first_microbatch is taken only with fp8_weight_caching"));
  gcap_graphed_free(g);
  gcap_tensor_free(x);
  gcap_module_free(m[0]);
  gcap_module_free(m[1]);
  gcap_engine_free(e);
}

int main(void) {
  T_RUN(test_cast);
  T_RUN(test_recipes_and_autocast);
  T_RUN(test_graphed_equals_eager);
  return t_done();
}
