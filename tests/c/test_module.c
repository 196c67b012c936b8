/*
** test_module.c: the module object (graphcap.h "Modules"): parameters in a
** deterministic order with dotted names, buffers, children, train/eval,
** modules defined in C (their parameters, ud and its destructor), and the
** errors of a bad call or of a forward that fails.
*/
#include <stdint.h>

#include "t.h"
#include "t_module.h"

/* ------------------------------------------------------------------------ */
/* Parameters, buffers, children                                            */

static void test_parameter_order_and_names(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  gcap_module *l0 = NULL, *r1 = NULL, *l2 = NULL, *n3 = NULL, *seq = NULL, *inner = NULL,
              *outer = NULL, *l4 = NULL, *relu = NULL;
  char name[64];
  T_CHECK_OK(e, gcap_nn_linear(e, 3, 4, 1, 0, &l0));
  T_CHECK_OK(e, gcap_nn_relu(e, &r1));
  T_CHECK_OK(e, gcap_nn_linear(e, 4, 2, 1, 0, &l2));
  T_CHECK_OK(e, gcap_nn_layer_norm(e, 2, 1e-5, &n3));
  gcap_module *mods[4] = {l0, r1, l2, n3};
  T_CHECK_OK(e, gcap_nn_sequential(e, 4, mods, &seq));
  static const char *const want[6] = {"0.weight", "0.bias",   "2.weight",
                                      "2.bias",   "3.weight", "3.bias"};
  const int64_t shapes[6][2] = {{4, 3}, {4, 0}, {2, 4}, {2, 0}, {2, 0}, {2, 0}};
  const int nds[6] = {2, 1, 2, 1, 1, 1};
  T_CHECK(gcap_module_num_parameters(seq) == 6);
  for (int i = 0; i < 6; i++) {
    gcap_tensor *p = gcap_module_parameter(seq, i, name, sizeof name);
    if (p == NULL || strcmp(name, want[i]) != 0 || !t_has_shape(p, nds[i], shapes[i]) ||
        !gcap_tensor_requires_grad(p) || !gcap_tensor_is_leaf(p))
      T_FAILF("parameter", "#%d: name '%s' (want '%s'), shape ok %d", i, p ? name : "(none)",
              want[i], t_has_shape(p, nds[i], shapes[i]));
  }
  T_CHECK(gcap_module_parameter(seq, 6, name, sizeof name) == NULL);
  T_CHECK(gcap_module_parameter(seq, -1, name, sizeof name) == NULL);
  T_CHECK(gcap_module_parameter(seq, 0, NULL, 0) ==
          gcap_module_parameter(l0, 0, NULL, 0)); /* the same tensor */
  T_CHECK(gcap_module_parameter(seq, 4, NULL, 0) == gcap_module_parameter(n3, 0, NULL, 0));
  /* a short buffer: truncated, terminated */
  memset(name, 'X', sizeof name);
  T_CHECK(gcap_module_parameter(seq, 2, name, 5) != NULL);
  T_CHECK(strcmp(name, "2.we") == 0);
  /* children */
  T_CHECK(gcap_module_num_children(seq) == 4);
  for (int i = 0; i < 4; i++) {
    const char *cn = NULL;
    char wn[16];
    snprintf(wn, sizeof wn, "%d", i);
    T_CHECK(gcap_module_child(seq, i, &cn) == mods[i] && cn && strcmp(cn, wn) == 0);
  }
  T_CHECK(gcap_module_child(seq, 4, NULL) == NULL);
  T_CHECK(strcmp(gcap_module_type(seq), "Sequential") == 0 &&
          strcmp(gcap_module_type(l0), "Linear") == 0);
  T_CHECK(strcmp(gcap_module_type(r1), "ReLU") == 0 &&
          strcmp(gcap_module_type(n3), "LayerNorm") == 0);
  /* nesting: Sequential(Linear, Sequential(Linear, ReLU)) */
  T_CHECK_OK(e, gcap_nn_linear(e, 2, 2, 0, 0, &l4));
  T_CHECK_OK(e, gcap_nn_relu(e, &relu));
  gcap_module *im[2] = {l4, relu};
  T_CHECK_OK(e, gcap_nn_sequential(e, 2, im, &inner));
  gcap_module *om[2] = {l2, inner};
  T_CHECK_OK(e, gcap_nn_sequential(e, 2, om, &outer));
  static const char *const want2[3] = {"0.weight", "0.bias", "1.0.weight"};
  T_CHECK(gcap_module_num_parameters(outer) == 3);
  for (int i = 0; i < 3; i++)
    if (gcap_module_parameter(outer, i, name, sizeof name) == NULL || strcmp(name, want2[i]) != 0)
      T_FAILF("nested name", "#%d: '%s', want '%s'", i, name, want2[i]);
  /* the order is stable across calls */
  T_CHECK(gcap_module_parameter(outer, 2, NULL, 0) == gcap_module_parameter(l4, 0, NULL, 0));
  gcap_module_free(l0), gcap_module_free(r1), gcap_module_free(l2), gcap_module_free(n3);
  gcap_module_free(l4), gcap_module_free(relu), gcap_module_free(inner);
  gcap_module_free(seq), gcap_module_free(outer);
  gcap_engine_free(e);
}

static gcap_status fwd_identity(void *ud, gcap_module *m, int nin, gcap_tensor *const *in,
                                gcap_tensor **out) {
  (void)ud, (void)m;
  if (nin < 1) return GCAP_EINVAL;
  *out = gcap_tensor_retain(in[0]);
  return GCAP_OK;
}

/* Registration order, then children's; buffers apart; names checked. */
static void test_custom_registration_and_buffers(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s2[1] = {2}, s3[1] = {3};
  gcap_module *m = NULL, *sub = NULL, *lin = NULL;
  gcap_tensor *a = NULL, *b = NULL, *buf = NULL, *buf2 = NULL, *dup = NULL, *y = NULL, *x = NULL;
  char name[64];
  T_CHECK_OK(e, gcap_module_new(e, "Block", fwd_identity, NULL, NULL, &m));
  T_CHECK_OK(e, gcap_module_new(e, "Sub", fwd_identity, NULL, NULL, &sub));
  T_CHECK_OK(e, gcap_nn_linear(e, 2, 3, 1, 0, &lin));
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 1, s2, 1.0, &b));
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 1, s3, 2.0, &a));
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 1, s3, 0.0, &buf));
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 1, s2, 0.0, &buf2));
  T_CHECK(gcap_tensor_requires_grad(b) == 0);
  T_CHECK_OK(e, gcap_module_add_parameter(m, "zeta", b)); /* registration order, not alphabetical */
  T_CHECK(gcap_tensor_requires_grad(b) == 1);             /* marked */
  T_CHECK_OK(e, gcap_module_add_child(m, "sub", sub));
  T_CHECK_OK(e, gcap_module_add_parameter(m, "alpha", a));
  T_CHECK_OK(e, gcap_module_add_buffer(m, "running", buf));
  T_CHECK_OK(e, gcap_module_add_child(sub, "lin", lin));
  T_CHECK_OK(e, gcap_module_add_buffer(sub, "count", buf2));
  T_CHECK(gcap_tensor_requires_grad(buf) == 0); /* a buffer is not a parameter */
  /* own parameters first (in registration order), then the children's */
  static const char *const want[4] = {"zeta", "alpha", "sub.lin.weight", "sub.lin.bias"};
  T_CHECK(gcap_module_num_parameters(m) == 4);
  for (int i = 0; i < 4; i++)
    if (gcap_module_parameter(m, i, name, sizeof name) == NULL || strcmp(name, want[i]) != 0)
      T_FAILF("name", "#%d: '%s', want '%s'", i, name, want[i]);
  T_CHECK(gcap_module_parameter(m, 0, NULL, 0) == b && gcap_module_parameter(m, 1, NULL, 0) == a);
  T_CHECK(gcap_module_num_buffers(m) == 2);
  T_CHECK(gcap_module_buffer(m, 0, name, sizeof name) == buf && strcmp(name, "running") == 0);
  T_CHECK(gcap_module_buffer(m, 1, name, sizeof name) == buf2 && strcmp(name, "sub.count") == 0);
  T_CHECK(gcap_module_buffer(m, 2, name, sizeof name) == NULL);
  for (int i = 0; i < gcap_module_num_parameters(m); i++)
    T_CHECK(gcap_module_parameter(m, i, NULL, 0) != buf &&
            gcap_module_parameter(m, i, NULL, 0) != buf2);
  /* names are unique per module across parameters, buffers and children; no dots */
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 1, s2, 0.0, &dup));
  T_CHECK_ST(e, gcap_module_add_parameter(m, "alpha", dup), GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "alpha"));
  T_CHECK_ST(e, gcap_module_add_buffer(m, "sub", dup), GCAP_EINVAL);
  T_CHECK_ST(e, gcap_module_add_parameter(m, "running", dup), GCAP_EINVAL);
  T_CHECK_ST(e, gcap_module_add_parameter(m, "a.b", dup), GCAP_EINVAL);
  T_CHECK_ST(e, gcap_module_add_parameter(m, "", dup), GCAP_EINVAL);
  T_CHECK_ST(e, gcap_module_add_child(sub, "up", m), GCAP_EINVAL); /* a cycle */
  T_CHECK(gcap_module_num_parameters(m) == 4 && gcap_module_num_buffers(m) == 2);
  /* a parameter must be a leaf */
  x = t_input(e, 1, s2, 1, 0.0f);
  T_REQUIRE(x != NULL);
  T_CHECK_OK(e, gcap_scale(x, 2.0, &y));
  T_CHECK_ST(e, gcap_module_add_parameter(m, "made", y), GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "leaf"));
  /* the module holds its tensors and children */
  gcap_tensor_free(a), gcap_tensor_free(b), gcap_tensor_free(buf), gcap_tensor_free(buf2);
  gcap_module_free(sub), gcap_module_free(lin);
  T_CHECK(gcap_module_num_parameters(m) == 4);
  T_CHECK(gcap_tensor_numel(gcap_module_parameter(m, 2, NULL, 0)) == 6);
  gcap_tensor_free(dup), gcap_tensor_free(x), gcap_tensor_free(y);
  gcap_module_free(m);
  gcap_engine_free(e);
}

static void test_train_eval_propagate(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  gcap_module *d = NULL, *l = NULL, *inner = NULL, *seq = NULL;
  T_CHECK_OK(e, gcap_nn_dropout(e, 0.5, &d));
  T_CHECK_OK(e, gcap_nn_linear(e, 2, 2, 1, 0, &l));
  gcap_module *im[1] = {d};
  T_CHECK_OK(e, gcap_nn_sequential(e, 1, im, &inner));
  gcap_module *om[2] = {l, inner};
  T_CHECK_OK(e, gcap_nn_sequential(e, 2, om, &seq));
  T_CHECK(gcap_module_training(seq) && gcap_module_training(l) &&
          gcap_module_training(d)); /* default */
  gcap_module_train(seq, 0);
  T_CHECK(!gcap_module_training(seq) && !gcap_module_training(l) && !gcap_module_training(inner) &&
          !gcap_module_training(d));
  gcap_module_train(inner, 1); /* a child alone */
  T_CHECK(!gcap_module_training(seq) && !gcap_module_training(l) && gcap_module_training(inner) &&
          gcap_module_training(d));
  gcap_module_train(seq, 1);
  T_CHECK(gcap_module_training(seq) && gcap_module_training(l) && gcap_module_training(d));
  gcap_module_free(d), gcap_module_free(l), gcap_module_free(inner), gcap_module_free(seq);
  gcap_engine_free(e);
}

/* ------------------------------------------------------------------------ */
/* A module defined in C                                                     */

typedef struct scaled_ud {
  int calls;
  int *freed;
} scaled_ud;

static void scaled_free(void *p) {
  scaled_ud *u = (scaled_ud *)p;
  (*u->freed)++;
}

/* y = norm(gelu(x W^T + b)) * s (+ in[1] when given): own parameters weight,
** bias, s, child "norm". */
static gcap_status scaled_forward(void *ud, gcap_module *m, int nin, gcap_tensor *const *in,
                                  gcap_tensor **out) {
  scaled_ud *u = (scaled_ud *)ud;
  gcap_tensor *h = NULL, *a = NULL, *n = NULL, *y = NULL;
  gcap_status st;
  u->calls++;
  if (nin < 1 || nin > 2) return GCAP_EINVAL;
  if ((st = gcap_linear(in[0], gcap_module_parameter(m, 0, NULL, 0),
                        gcap_module_parameter(m, 1, NULL, 0), &h)) == GCAP_OK &&
      (st = gcap_gelu(h, &a)) == GCAP_OK &&
      (st = gcap_module_call(gcap_module_child(m, 0, NULL), 1, &a, &n)) == GCAP_OK &&
      (st = gcap_mul(n, gcap_module_parameter(m, 2, NULL, 0), &y)) == GCAP_OK && nin == 2) {
    gcap_tensor *z = NULL;
    st = gcap_add(y, in[1], &z);
    gcap_tensor_free(y);
    y = z;
  }
  gcap_tensor_free(h), gcap_tensor_free(a), gcap_tensor_free(n);
  if (st != GCAP_OK) {
    gcap_tensor_free(y);
    return st;
  }
  *out = y;
  return GCAP_OK;
}

static void test_c_module(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t sx[2] = {4, 3}, sw[2] = {5, 3}, sb[1] = {5}, sy[2] = {4, 5};
  int freed = 0;
  scaled_ud *u = calloc(1, sizeof *u);
  T_REQUIRE(u != NULL);
  u->freed = &freed;
  gcap_module *m = NULL, *norm = NULL;
  gcap_tensor *w = t_input(e, 2, sw, 0, 0.3f), *b = t_input(e, 1, sb, 0, 0.9f), *s = NULL,
              *x = t_input(e, 2, sx, 1, 0.0f), *x2 = t_input(e, 2, sx, 1, 0.0f),
              *res = t_input(e, 2, sy, 1, 2.0f), *res2 = t_input(e, 2, sy, 1, 2.0f), *y = NULL,
              *h = NULL, *a = NULL, *n = NULL, *y2 = NULL, *z2 = NULL;
  gcap_tensor *w2 = NULL, *b2 = NULL, *s2 = NULL, *nw = NULL, *nb = NULL;
  T_REQUIRE(w && b && x && x2 && res && res2);
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 0, NULL, 1.5, &s));
  T_CHECK_OK(e, gcap_module_new(e, "Scaled", scaled_forward, u, scaled_free, &m));
  T_CHECK(strcmp(gcap_module_type(m), "Scaled") == 0 && gcap_module_userdata(m) == u);
  T_CHECK(gcap_module_training(m) == 1);
  T_CHECK_OK(e, gcap_nn_layer_norm(e, 5, 1e-5, &norm));
  T_CHECK_OK(e, gcap_module_add_parameter(m, "weight", w));
  T_CHECK_OK(e, gcap_module_add_parameter(m, "bias", b));
  T_CHECK_OK(e, gcap_module_add_parameter(m, "s", s));
  T_CHECK_OK(e, gcap_module_add_child(m, "norm", norm));
  static const char *const want[5] = {"weight", "bias", "s", "norm.weight", "norm.bias"};
  char name[32];
  T_CHECK(gcap_module_num_parameters(m) == 5);
  for (int i = 0; i < 5; i++)
    if (gcap_module_parameter(m, i, name, sizeof name) == NULL || strcmp(name, want[i]) != 0)
      T_FAILF("name", "#%d: '%s', want '%s'", i, name, want[i]);
  /* the module, with two inputs */
  gcap_tensor *ins[2] = {x, res};
  T_CHECK_OK(e, gcap_module_call(m, 2, ins, &y));
  T_CHECK(u->calls == 1);
  T_CHECK(t_has_shape(y, 2, sy));
  T_CHECK_OK(e, t_backward_weighted(y));
  for (int i = 0; i < 5; i++)
    if (gcap_tensor_grad(gcap_module_parameter(m, i, NULL, 0)) == NULL)
      T_FAILF("grad", "parameter %s has no grad", want[i]);
  /* the same ops by hand on clones of the parameters (leaves: made without
  ** grad recording, as clone is differentiable): equal bitwise */
  int was = gcap_set_grad_enabled(e, 0);
  T_CHECK_OK(e, gcap_tensor_clone(w, &w2));
  T_CHECK_OK(e, gcap_tensor_clone(b, &b2));
  T_CHECK_OK(e, gcap_tensor_clone(s, &s2));
  T_CHECK_OK(e, gcap_tensor_clone(gcap_module_parameter(norm, 0, NULL, 0), &nw));
  T_CHECK_OK(e, gcap_tensor_clone(gcap_module_parameter(norm, 1, NULL, 0), &nb));
  gcap_set_grad_enabled(e, was);
  gcap_tensor *clones[5] = {w2, b2, s2, nw, nb};
  for (int i = 0; i < 5; i++)
    T_CHECK_OK(e, gcap_tensor_set_requires_grad(clones[i], 1));
  T_CHECK_OK(e, gcap_linear(x2, w2, b2, &h));
  T_CHECK_OK(e, gcap_gelu(h, &a));
  T_CHECK_OK(e, gcap_layer_norm(a, nw, nb, 1e-5, &n));
  T_CHECK_OK(e, gcap_mul(n, s2, &y2));
  T_CHECK_OK(e, gcap_add(y2, res2, &z2));
  T_CHECK(t_bitwise_equal(y, z2));
  T_CHECK_OK(e, t_backward_weighted(z2));
  for (int i = 0; i < 5; i++)
    if (!t_bitwise_equal(gcap_tensor_grad(gcap_module_parameter(m, i, NULL, 0)),
                         gcap_tensor_grad(clones[i])))
      T_FAILF("grad", "parameter %s: the module's grad differs from the functional one", want[i]);
  T_CHECK(t_bitwise_equal(gcap_tensor_grad(x), gcap_tensor_grad(x2)));
  T_CHECK(t_bitwise_equal(gcap_tensor_grad(res), gcap_tensor_grad(res2)));
  /* a forward error reaches the caller */
  gcap_tensor *none = (gcap_tensor *)(uintptr_t)0x10;
  T_CHECK_ST(e, gcap_module_call(m, 0, NULL, &none), GCAP_EINVAL);
  T_CHECK(none == NULL);
  gcap_tensor_free(w), gcap_tensor_free(b), gcap_tensor_free(s), gcap_tensor_free(x),
      gcap_tensor_free(x2);
  gcap_tensor_free(res), gcap_tensor_free(res2), gcap_tensor_free(y), gcap_tensor_free(h),
      gcap_tensor_free(a);
  gcap_tensor_free(n), gcap_tensor_free(y2), gcap_tensor_free(z2);
  for (int i = 0; i < 5; i++)
    gcap_tensor_free(clones[i]);
  gcap_module_free(norm);
  T_CHECK(freed == 0);
  gcap_module *held = gcap_module_retain(m);
  gcap_module_free(m);
  T_CHECK(freed == 0); /* still held */
  gcap_module_free(held);
  T_CHECK(freed == 1); /* ud_free ran once, with the last reference */
  free(u);
  gcap_engine_free(e);
}

/* A forward function that returns no tensor. */
static gcap_status fwd_nothing(void *ud, gcap_module *m, int nin, gcap_tensor *const *in,
                               gcap_tensor **out) {
  (void)ud, (void)m, (void)nin, (void)in, (void)out;
  return GCAP_OK;
}

/* Bad calls: a wrong inner dimension names linear and both shapes. */
static void test_bad_input(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[2] = {2, 5}, s4[2] = {2, 4};
  gcap_module *lin = NULL, *relu = NULL, *seq = NULL, *empty = NULL;
  gcap_tensor *x = t_input(e, 2, s, 1, 0.0f), *x4 = t_input(e, 2, s4, 0, 0.0f),
              *y = (gcap_tensor *)(uintptr_t)0x10;
  T_REQUIRE(x && x4);
  T_CHECK_OK(e, gcap_nn_linear(e, 4, 3, 1, 0, &lin));
  T_CHECK_ST(e, gcap_module_call(lin, 1, &x, &y), GCAP_EINVAL);
  T_CHECK(y == NULL);
  if (!(t_msg_has(e, "linear") && t_msg_has(e, "[2, 5]") && t_msg_has(e, "[3, 4]")))
    T_FAILF("message names linear and both shapes", "got \"%s\"", gcap_errmsg(e));
  T_CHECK(gcap_tensor_grad(x) == NULL);
  /* inside a Sequential the message survives */
  T_CHECK_OK(e, gcap_nn_relu(e, &relu));
  gcap_module *mods[2] = {relu, lin};
  T_CHECK_OK(e, gcap_nn_sequential(e, 2, mods, &seq));
  y = (gcap_tensor *)(uintptr_t)0x10;
  T_CHECK_ST(e, gcap_module_call(seq, 1, &x, &y), GCAP_EINVAL);
  T_CHECK(y == NULL);
  if (!(t_msg_has(e, "linear") && t_msg_has(e, "[2, 5]") && t_msg_has(e, "[3, 4]")))
    T_FAILF("message names linear and both shapes", "got \"%s\"", gcap_errmsg(e));
  /* wrong number of inputs */
  gcap_tensor *two[2] = {x4, x4};
  T_CHECK_ST(e, gcap_module_call(lin, 2, two, &y), GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "Linear") && t_msg_has(e, "input"));
  T_CHECK_ST(e, gcap_module_call(lin, 1, NULL, &y), GCAP_EINVAL);
  gcap_tensor *nul[1] = {NULL};
  T_CHECK_ST(e, gcap_module_call(lin, 1, nul, &y), GCAP_EINVAL);
  /* a forward that produces nothing */
  T_CHECK_OK(e, gcap_module_new(e, "Empty", fwd_nothing, NULL, NULL, &empty));
  T_CHECK_ST(e, gcap_module_call(empty, 1, &x4, &y), GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "Empty"));
  /* still usable */
  gcap_tensor *ok = NULL;
  T_CHECK_OK(e, gcap_module_call(seq, 1, &x4, &ok));
  T_CHECK(gcap_tensor_ndim(ok) == 2 && gcap_tensor_shape(ok)[1] == 3);
  gcap_tensor_free(ok);
  gcap_tensor_free(x), gcap_tensor_free(x4);
  gcap_module_free(lin), gcap_module_free(relu), gcap_module_free(seq), gcap_module_free(empty);
  gcap_engine_free(e);
}

/* A forward that fails without setting a message (a status only). */
static gcap_status silent_forward(void *ud, gcap_module *m, int nin, gcap_tensor *const *in,
                                  gcap_tensor **out) {
  (void)ud, (void)m, (void)nin, (void)in, (void)out;
  return GCAP_EINVAL;
}

static gcap_status silent_forward_n(void *ud, gcap_module *m, int nin, gcap_tensor *const *in,
                                    int *nout, gcap_tensor **out) {
  (void)ud, (void)m, (void)nin, (void)in, (void)nout, (void)out;
  return GCAP_ESTATE;
}

/* regression: a forward failing without a message left the error empty */
/* A module whose forward fails with a status and no message: the call's
** error names the module and the status (it was empty), with one output and
** with several; the module is usable afterwards. */
static void test_silent_forward_failure_is_named(void) {
  const int64_t s[1] = {2};
  const float d[2] = {1, 2};
  gcap_engine *e = t_engine();
  gcap_module *one = NULL, *many = NULL;
  gcap_tensor *x = NULL, *y = NULL, *ys[4] = {NULL};
  int n = -1;
  T_SETUP(e != NULL && (x = t_from(e, 1, s, d)) != NULL &&
              gcap_module_new(e, "Quiet", silent_forward, NULL, NULL, &one) == GCAP_OK &&
              gcap_module_new_n(e, "QuietN", silent_forward_n, NULL, NULL, &many) == GCAP_OK,
          goto out);
  T_CHECK_ST(e, gcap_module_call(one, 1, &x, &y), GCAP_EINVAL);
  T_CHECK(y == NULL && t_msg_has(e, "Quiet: forward failed (invalid argument)"));
  T_CHECK_ST(e, gcap_module_call_n(many, 1, &x, 4, &n, ys), GCAP_ESTATE);
  T_CHECK(n == 0 && ys[0] == NULL && t_msg_has(e, "QuietN: forward failed (wrong state)"));
  T_CHECK_ST(e, gcap_module_call_n(many, 1, &x, 4, &n, ys), GCAP_ESTATE);
  T_CHECK(t_msg_has(e, "QuietN: forward failed"));
out:
  gcap_module_free(one);
  gcap_module_free(many);
  gcap_tensor_free(x);
  gcap_engine_free(e);
}

int main(void) {
  T_RUN(test_parameter_order_and_names);
  T_RUN(test_custom_registration_and_buffers);
  T_RUN(test_train_eval_propagate);
  T_RUN(test_c_module);
  T_RUN(test_bad_input);
  T_RUN(test_silent_forward_failure_is_named);
  return t_done();
}
