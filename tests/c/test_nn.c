/*
** test_nn.c: modules (graphcap.h "Modules"): parameters in a deterministic
** order with dotted names, buffers, children, train/eval, Dropout in eval, the
** four hook kinds (order, arguments, removal, a hook that fails), delayed-wgrad
** Linear and backward_dw, C-defined modules, and the errors of a bad call.
*/
#include <stdint.h>

#include "t.h"
#include "t_data.h"

/* The values of a and b are bitwise equal (both readable, same numel). */
static int bitwise_equal(gcap_tensor *a, gcap_tensor *b) {
  int64_t n = gcap_tensor_numel(a);
  if (a == NULL || b == NULL || n != gcap_tensor_numel(b)) return 0;
  float *x = malloc((size_t)(n + 1) * sizeof *x), *y = malloc((size_t)(n + 1) * sizeof *y);
  int eq = x && y && t_read(a, x, (size_t)n) && t_read(b, y, (size_t)n) &&
           memcmp(x, y, (size_t)n * sizeof *x) == 0;
  free(x), free(y);
  return eq;
}

/* Copy every parameter of src into dst's (same structure), grad mode off. */
static gcap_status copy_params(gcap_module *dst, gcap_module *src) {
  int n = gcap_module_num_parameters(src);
  if (n != gcap_module_num_parameters(dst)) return GCAP_EINVAL;
  gcap_engine *e = gcap_tensor_engine(gcap_module_parameter(src, 0, NULL, 0));
  int was = gcap_set_grad_enabled(e, 0);
  gcap_status st = GCAP_OK;
  for (int i = 0; i < n && st == GCAP_OK; i++)
    st = gcap_copy_(gcap_module_parameter(dst, i, NULL, 0), gcap_module_parameter(src, i, NULL, 0));
  gcap_set_grad_enabled(e, was);
  return st;
}

/* loss = sum(y * r) with r = i-th value a fixed pattern, and its backward. */
static gcap_status backward_weighted(gcap_tensor *y) {
  gcap_engine *e = gcap_tensor_engine(y);
  int64_t n = gcap_tensor_numel(y);
  float *r = malloc((size_t)(n + 1) * sizeof *r);
  gcap_tensor *rt = NULL, *p = NULL, *l = NULL;
  gcap_status st = GCAP_ENOMEM;
  if (r != NULL) {
    for (int64_t i = 0; i < n; i++)
      r[i] = sinf(0.77f * (float)i + 0.3f);
    if ((st = gcap_tensor_from_f32(e, GCAP_F32, gcap_tensor_ndim(y), gcap_tensor_shape(y), r,
                                   &rt)) == GCAP_OK &&
        (st = gcap_mul(y, rt, &p)) == GCAP_OK && (st = gcap_sum(p, &l)) == GCAP_OK)
      st = gcap_backward(l, NULL, 0);
  }
  free(r);
  gcap_tensor_free(rt), gcap_tensor_free(p), gcap_tensor_free(l);
  return st;
}

static gcap_tensor *input(gcap_engine *e, int nd, const int64_t *shape, int requires_grad,
                          float phase) {
  int64_t n = t_numel(nd, shape);
  float *d = malloc((size_t)(n + 1) * sizeof *d);
  gcap_tensor *t = NULL;
  if (d == NULL) return NULL;
  for (int64_t i = 0; i < n; i++)
    d[i] = cosf(0.53f * (float)i + phase) * 1.2f;
  t = t_from(e, nd, shape, d);
  free(d);
  if (t && requires_grad) gcap_tensor_set_requires_grad(t, 1);
  return t;
}

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
  x = input(e, 1, s2, 1, 0.0f);
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

/* Dropout in eval: the identity, bitwise, and grads pass through unchanged. */
static void test_dropout_eval_identity(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  enum { NX = 200 };
  const int64_t s[2] = {10, 20};
  static float xin[NX], yout[NX], g[NX];
  gcap_module *d = NULL;
  gcap_tensor *x = input(e, 2, s, 1, 0.1f), *y = NULL, *l = NULL;
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
      bitwise_equal(gcap_module_parameter(a, 1, NULL, 0), gcap_module_parameter(b, 1, NULL, 0)));
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
  gcap_tensor *x = input(e, 2, s, 1, 0.0f), *x2 = input(e, 2, s, 1, 0.0f), *y = NULL, *h1 = NULL,
              *h2 = NULL, *h3 = NULL, *y2 = NULL;
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
  T_CHECK_OK(e, backward_weighted(y));
  /* the same by hand, on copies of the parameters */
  T_CHECK_OK(e, gcap_nn_linear(e, 4, 6, 1, 0, &c1));
  T_CHECK_OK(e, gcap_nn_linear(e, 6, 3, 0, 0, &c2));
  T_CHECK_OK(e, copy_params(c1, l1));
  T_CHECK_OK(e, copy_params(c2, l2));
  T_CHECK_OK(e, gcap_linear(x2, gcap_module_parameter(c1, 0, NULL, 0),
                            gcap_module_parameter(c1, 1, NULL, 0), &h1));
  T_CHECK_OK(e, gcap_gelu(h1, &h2));
  T_CHECK_OK(e, gcap_layer_norm(h2, NULL, NULL, 1e-5, &h3)); /* weight 1, bias 0 */
  T_CHECK_OK(e, gcap_linear(h3, gcap_module_parameter(c2, 0, NULL, 0), NULL, &y2));
  T_CHECK(bitwise_equal(y, y2));
  T_CHECK_OK(e, backward_weighted(y2));
  T_CHECK(bitwise_equal(gcap_tensor_grad(x), gcap_tensor_grad(x2)));
  T_CHECK(bitwise_equal(gcap_tensor_grad(gcap_module_parameter(l1, 0, NULL, 0)),
                        gcap_tensor_grad(gcap_module_parameter(c1, 0, NULL, 0))));
  T_CHECK(bitwise_equal(gcap_tensor_grad(gcap_module_parameter(l2, 0, NULL, 0)),
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
/* Hooks                                                                     */

typedef struct hook_log {
  int n;
  int tag[32];
  gcap_hook_kind kind[32];
  int64_t shape0[32]; /* first dim of the tensor the hook was given (-1: none) */
  int frees;          /* ud_free calls */
} hook_log;

typedef struct hook_ud {
  hook_log *log;
  int tag;
  gcap_status ret; /* what the hook returns */
} hook_ud;

static gcap_status log_hook(void *ud, gcap_module *m, const gcap_hook_args *a) {
  hook_ud *h = (hook_ud *)ud;
  hook_log *l = h->log;
  gcap_tensor *t = NULL;
  (void)m;
  switch (a->kind) {
    case GCAP_HOOK_FORWARD_PRE:
      t = a->nin > 0 ? a->in[0] : NULL;
      break;
    case GCAP_HOOK_FORWARD:
      t = a->nout > 0 ? a->out[0] : NULL;
      break;
    case GCAP_HOOK_BACKWARD_PRE:
      t = a->ngrad_out > 0 ? a->grad_out[0] : NULL;
      break;
    case GCAP_HOOK_BACKWARD:
      t = a->ngrad_in > 0 ? a->grad_in[0] : NULL;
      break;
  }
  if (l->n < 32) {
    l->tag[l->n] = h->tag;
    l->kind[l->n] = a->kind;
    l->shape0[l->n] =
        t && gcap_tensor_ndim(t) > 0 ? gcap_tensor_shape(t)[gcap_tensor_ndim(t) - 1] : -1;
    l->n++;
  }
  return h->ret;
}

static void count_free(void *ud) {
  ((hook_ud *)ud)->log->frees++;
}

static gcap_status add_hook(gcap_module *m, gcap_hook_kind k, hook_ud *h, int *id) {
  return gcap_module_register_hook(m, k, log_hook, h, count_free, id);
}

/* The log's tags, as a string "1 2 5 ...". */
static const char *tags(const hook_log *l) {
  static char buf[160];
  size_t at = 0;
  buf[0] = '\0';
  for (int i = 0; i < l->n && at < sizeof buf; i++)
    at += (size_t)snprintf(buf + at, sizeof buf - at, i ? " %d" : "%d", l->tag[i]);
  return buf;
}

#define T_CHECK_TAGS(l, want)                                                                      \
  do {                                                                                             \
    if (strcmp(tags(l), want) != 0) T_FAILF("hook order", "ran '%s', want '%s'", tags(l), want);   \
  } while (0)

static void test_hook_order(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[2] = {2, 4};
  hook_log log = {0};
  hook_ud h1 = {&log, 1, GCAP_OK}, h2 = {&log, 2, GCAP_OK}, h3 = {&log, 3, GCAP_OK},
          h4 = {&log, 4, GCAP_OK}, h5 = {&log, 5, GCAP_OK};
  gcap_module *lin = NULL;
  gcap_tensor *x = input(e, 2, s, 1, 0.0f), *y = NULL;
  T_REQUIRE(x != NULL);
  T_CHECK_OK(e, gcap_nn_linear(e, 4, 3, 1, 0, &lin));
  /* registered out of order: each kind runs at its point, same kind in order */
  T_CHECK_OK(e, add_hook(lin, GCAP_HOOK_BACKWARD, &h4, NULL));
  T_CHECK_OK(e, add_hook(lin, GCAP_HOOK_FORWARD, &h2, NULL));
  T_CHECK_OK(e, add_hook(lin, GCAP_HOOK_BACKWARD_PRE, &h3, NULL));
  T_CHECK_OK(e, add_hook(lin, GCAP_HOOK_FORWARD_PRE, &h1, NULL));
  T_CHECK_OK(e, add_hook(lin, GCAP_HOOK_FORWARD, &h5, NULL));
  T_CHECK(gcap_module_num_hooks(lin, GCAP_HOOK_FORWARD) == 2 &&
          gcap_module_num_hooks(lin, GCAP_HOOK_BACKWARD) == 1);
  T_CHECK_OK(e, gcap_module_call(lin, 1, &x, &y));
  T_CHECK_TAGS(&log, "1 2 5");
  T_CHECK_OK(e, backward_weighted(y));
  T_CHECK_TAGS(&log, "1 2 5 3 4");
  /* what each hook saw: input [2,4], output [2,3], grad_out [2,3], grad_in [2,4] */
  const int64_t want_last[5] = {4, 3, 3, 3, 4};
  for (int i = 0; i < log.n && i < 5; i++)
    if (log.shape0[i] != want_last[i])
      T_FAILF("hook arguments", "hook %d (kind %d) saw a last dim %lld, want %lld", log.tag[i],
              (int)log.kind[i], (long long)log.shape0[i], (long long)want_last[i]);
  /* the hooks did not change the result: the grad equals a hook-free call's */
  T_REQUIRE(gcap_tensor_grad(x) != NULL);
  gcap_tensor_free(y), y = NULL;
  gcap_module_free(lin);
  T_CHECK(log.frees == 5); /* ud_free ran for each hook when the module went */
  gcap_tensor_free(x);
  gcap_engine_free(e);
}

/* Nested modules: outer pre, inner pre, inner fwd, outer fwd; in backward
** outer bwd-pre, inner bwd-pre, inner bwd, outer bwd (PyTorch's order). */
static void test_hook_order_nested(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[2] = {3, 2};
  hook_log log = {0};
  hook_ud o[4], in[4];
  gcap_module *lin = NULL, *seq = NULL;
  gcap_tensor *x = input(e, 2, s, 1, 0.5f), *y = NULL;
  T_REQUIRE(x != NULL);
  T_CHECK_OK(e, gcap_nn_linear(e, 2, 2, 1, 0, &lin));
  T_CHECK_OK(e, gcap_nn_sequential(e, 1, &lin, &seq));
  for (int k = 0; k < 4; k++) {
    o[k] = (hook_ud){&log, 10 + k, GCAP_OK};
    in[k] = (hook_ud){&log, 20 + k, GCAP_OK};
    T_CHECK_OK(e, gcap_module_register_hook(seq, (gcap_hook_kind)k, log_hook, &o[k], NULL, NULL));
    T_CHECK_OK(e, gcap_module_register_hook(lin, (gcap_hook_kind)k, log_hook, &in[k], NULL, NULL));
  }
  T_CHECK_OK(e, gcap_module_call(seq, 1, &x, &y));
  T_CHECK_TAGS(&log, "10 20 21 11");
  T_CHECK_OK(e, backward_weighted(y));
  T_CHECK_TAGS(&log, "10 20 21 11 12 22 23 13");
  gcap_tensor_free(x), gcap_tensor_free(y);
  gcap_module_free(lin), gcap_module_free(seq);
  gcap_engine_free(e);
}

/* An input that needs no grad: the backward hook still runs, grad_in NULL;
** with grad mode off only the forward hooks run. */
static void test_hooks_without_input_grad(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[2] = {2, 4};
  hook_log log = {0};
  hook_ud h[4];
  gcap_module *lin = NULL;
  gcap_tensor *x = input(e, 2, s, 0, 0.0f), *y = NULL;
  T_REQUIRE(x != NULL);
  T_CHECK_OK(e, gcap_nn_linear(e, 4, 3, 1, 0, &lin));
  for (int k = 0; k < 4; k++) {
    h[k] = (hook_ud){&log, k + 1, GCAP_OK};
    T_CHECK_OK(e, gcap_module_register_hook(lin, (gcap_hook_kind)k, log_hook, &h[k], NULL, NULL));
  }
  T_CHECK_OK(e, gcap_module_call(lin, 1, &x, &y));
  T_CHECK_OK(e, backward_weighted(y));
  T_CHECK_TAGS(&log, "1 2 3 4");
  if (log.n == 4) T_CHECK(log.shape0[3] == -1); /* grad_in NULL */
  T_CHECK(gcap_tensor_grad(gcap_module_parameter(lin, 0, NULL, 0)) != NULL);
  gcap_tensor_free(y), y = NULL;
  log.n = 0;
  int was = gcap_set_grad_enabled(e, 0);
  T_CHECK_OK(e, gcap_module_call(lin, 1, &x, &y));
  gcap_set_grad_enabled(e, was);
  T_CHECK_TAGS(&log, "1 2");
  T_CHECK(gcap_tensor_grad_fn_name(y) == NULL);
  gcap_tensor_free(x), gcap_tensor_free(y);
  gcap_module_free(lin);
  gcap_engine_free(e);
}

static void test_hook_removal(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[2] = {2, 4};
  hook_log log = {0};
  hook_ud h1 = {&log, 1, GCAP_OK}, h2 = {&log, 2, GCAP_OK}, h3 = {&log, 3, GCAP_OK},
          h4 = {&log, 4, GCAP_OK};
  int id1 = 0, id2 = 0, id3 = 0, id4 = 0;
  gcap_module *lin = NULL;
  gcap_tensor *x = input(e, 2, s, 1, 0.0f), *y = NULL;
  T_REQUIRE(x != NULL);
  T_CHECK_OK(e, gcap_nn_linear(e, 4, 3, 1, 0, &lin));
  T_CHECK_OK(e, add_hook(lin, GCAP_HOOK_FORWARD, &h1, &id1));
  T_CHECK_OK(e, add_hook(lin, GCAP_HOOK_FORWARD, &h2, &id2));
  T_CHECK_OK(e, add_hook(lin, GCAP_HOOK_BACKWARD_PRE, &h3, &id3));
  T_CHECK_OK(e, add_hook(lin, GCAP_HOOK_BACKWARD, &h4, &id4));
  T_CHECK(id1 != id2 && id2 != id3 && id3 != id4 && id1 != id4);
  T_CHECK_OK(e, gcap_module_remove_hook(lin, id1));
  T_CHECK(log.frees == 1);
  T_CHECK(gcap_module_num_hooks(lin, GCAP_HOOK_FORWARD) == 1);
  T_CHECK_OK(e, gcap_module_remove_hook(lin, id3));
  T_CHECK_OK(e, gcap_module_remove_hook(lin, id1)); /* twice: harmless */
  T_CHECK(log.frees == 2);
  T_CHECK_OK(e, gcap_module_call(lin, 1, &x, &y));
  T_CHECK_OK(e, backward_weighted(y));
  T_CHECK_TAGS(&log, "2 4");
  gcap_tensor_free(y), y = NULL;
  T_CHECK_OK(e, gcap_module_remove_hook(lin, id4));
  T_CHECK_OK(e, gcap_module_remove_hook(lin, id2));
  T_CHECK(gcap_module_num_hooks(lin, GCAP_HOOK_FORWARD) == 0 &&
          gcap_module_num_hooks(lin, GCAP_HOOK_BACKWARD) == 0);
  log.n = 0;
  T_CHECK_OK(e, gcap_module_call(lin, 1, &x, &y));
  T_CHECK_OK(e, backward_weighted(y));
  T_CHECK(log.n == 0);
  T_CHECK(log.frees == 4);
  /* bad registrations */
  T_CHECK_ST(e, gcap_module_register_hook(lin, GCAP_HOOK_FORWARD, NULL, NULL, NULL, NULL),
             GCAP_EINVAL);
  T_CHECK_ST(e, gcap_module_register_hook(lin, (gcap_hook_kind)7, log_hook, &h1, NULL, NULL),
             GCAP_EINVAL);
  gcap_tensor_free(x), gcap_tensor_free(y);
  gcap_module_free(lin);
  gcap_engine_free(e);
}

/* Grads of a hook-free call of a Linear with lin's weights, for reference. */
static int reference_grads(gcap_engine *e, gcap_module *lin, const int64_t *s, float *gw, float *gx,
                           int nw, int nx) {
  gcap_module *ref = NULL;
  gcap_tensor *x = input(e, 2, s, 1, 0.0f), *y = NULL;
  int ok = x && gcap_nn_linear(e, 4, 3, 1, 0, &ref) == GCAP_OK &&
           copy_params(ref, lin) == GCAP_OK && gcap_module_call(ref, 1, &x, &y) == GCAP_OK &&
           backward_weighted(y) == GCAP_OK &&
           t_read(gcap_tensor_grad(gcap_module_parameter(ref, 0, NULL, 0)), gw, (size_t)nw) &&
           t_read(gcap_tensor_grad(x), gx, (size_t)nx);
  gcap_tensor_free(x), gcap_tensor_free(y);
  gcap_module_free(ref);
  return ok;
}

/* A hook that fails stops the call (or the backward) with its status; the
** module and autograd are left clean: a later call and backward give the
** grads of one clean step. */
static void test_hook_failure_leaves_clean_state(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[2] = {2, 4};
  float gw_ref[12], gx_ref[8], gw[12], gx[8];
  for (int k = 0; k < 4; k++) {
    hook_log log = {0};
    hook_ud bad = {&log, 9, GCAP_EABORTED}, good[4];
    int id = 0;
    gcap_module *lin = NULL;
    gcap_tensor *x = input(e, 2, s, 1, 0.0f), *y = (gcap_tensor *)(uintptr_t)0x10;
    T_REQUIRE(x != NULL);
    T_CHECK_OK(e, gcap_nn_linear(e, 4, 3, 1, 0, &lin));
    T_REQUIRE(reference_grads(e, lin, s, gw_ref, gx_ref, 12, 8));
    for (int j = 0; j < 4; j++) {
      good[j] = (hook_ud){&log, j + 1, GCAP_OK};
      T_CHECK_OK(e,
                 gcap_module_register_hook(lin, (gcap_hook_kind)j, log_hook, &good[j], NULL, NULL));
    }
    T_CHECK_OK(e, gcap_module_register_hook(lin, (gcap_hook_kind)k, log_hook, &bad, NULL, &id));
    gcap_tensor *w = gcap_module_parameter(lin, 0, NULL, 0);
    if (k <= GCAP_HOOK_FORWARD) {
      T_CHECK_ST(e, gcap_module_call(lin, 1, &x, &y), GCAP_EABORTED);
      T_CHECK(y == NULL);
      T_CHECK(t_msg_has(e, "hook") && t_msg_has(e, "Linear"));
      T_CHECK_TAGS(&log, k == 0 ? "1 9" : "1 2 9"); /* the forward hook runs after forward */
    } else {
      T_CHECK_OK(e, gcap_module_call(lin, 1, &x, &y));
      T_CHECK_ST(e, backward_weighted(y), GCAP_EABORTED);
      T_CHECK(t_msg_has(e, "hook"));
      if (k == GCAP_HOOK_BACKWARD_PRE) {
        T_CHECK_TAGS(&log, "1 2 3 9");
        T_CHECK(gcap_tensor_grad(w) == NULL); /* nothing reached the leaves */
      } else {
        T_CHECK_TAGS(&log, "1 2 3 4 9");
      }
      T_CHECK(gcap_tensor_grad(x) == NULL); /* x's grad comes after the backward hooks */
      gcap_tensor_free(y);
      y = NULL;
    }
    if (k <= GCAP_HOOK_BACKWARD_PRE) T_CHECK(gcap_tensor_grad(w) == NULL);
    /* remove the failing hook; clear grads (a failed backward hook may have
    ** left the weight grad of the step it stopped); call again */
    T_CHECK_OK(e, gcap_module_remove_hook(lin, id));
    T_CHECK_OK(e, gcap_module_zero_grad(lin, 1));
    log.n = 0;
    T_CHECK_OK(e, gcap_module_call(lin, 1, &x, &y));
    T_CHECK_OK(e, backward_weighted(y));
    T_CHECK_TAGS(&log, "1 2 3 4");
    if (gcap_tensor_grad(w) && t_read(gcap_tensor_grad(w), gw, 12) && gcap_tensor_grad(x) &&
        t_read(gcap_tensor_grad(x), gx, 8)) {
      if (memcmp(gw, gw_ref, sizeof gw) != 0)
        T_FAILF("weight grad", "after a failed %d hook: differs from a clean step", k);
      if (memcmp(gx, gx_ref, sizeof gx) != 0)
        T_FAILF("input grad", "after a failed %d hook: differs from a clean step", k);
    } else {
      T_FAILF("grads", "after a failed %d hook: missing", k);
    }
    gcap_tensor_free(x), gcap_tensor_free(y);
    gcap_module_free(lin);
  }
  gcap_engine_free(e);
}

/* ------------------------------------------------------------------------ */
/* Delayed wgrad                                                             */

static void test_delay_wgrad(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[3] = {2, 3, 4};
  gcap_module *d = NULL, *r = NULL, *seq = NULL;
  gcap_tensor *xd = input(e, 3, s, 1, 0.2f), *xr = input(e, 3, s, 1, 0.2f), *yd = NULL, *yr = NULL;
  T_REQUIRE(xd && xr);
  T_CHECK_OK(e, gcap_nn_linear(e, 4, 5, 1, 1, &d));
  T_CHECK_OK(e, gcap_nn_linear(e, 4, 5, 1, 0, &r));
  T_CHECK_OK(e, copy_params(r, d));
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
  T_CHECK(bitwise_equal(yd, yr));
  T_CHECK_OK(e, backward_weighted(yd));
  T_CHECK_OK(e, backward_weighted(yr));
  T_CHECK(gcap_tensor_grad(wd) == NULL && gcap_tensor_grad(bd) == NULL); /* deferred */
  T_CHECK(gcap_tensor_grad(xd) != NULL);                                 /* dgrad computed */
  T_CHECK(bitwise_equal(gcap_tensor_grad(xd), gcap_tensor_grad(xr)));
  T_CHECK_OK(e, gcap_module_backward_dw(d));
  T_REQUIRE(gcap_tensor_grad(wd) != NULL && gcap_tensor_grad(bd) != NULL);
  T_CHECK(t_has_shape(gcap_tensor_grad(wd), 2, gcap_tensor_shape(wd)));
  T_CHECK(bitwise_equal(gcap_tensor_grad(wd), gcap_tensor_grad(wr)));
  T_CHECK(bitwise_equal(gcap_tensor_grad(bd), gcap_tensor_grad(br)));
  T_CHECK_OK(e, gcap_module_backward_dw(d)); /* drained: a second call adds nothing */
  T_CHECK(bitwise_equal(gcap_tensor_grad(wd), gcap_tensor_grad(wr)));
  /* two steps before backward_dw (through the Sequential): both accumulate,
  ** oldest first, as two ordinary backwards do */
  gcap_tensor_free(yd), gcap_tensor_free(yr);
  yd = yr = NULL;
  for (int k = 0; k < 2; k++) {
    T_CHECK_OK(e, gcap_module_call(seq, 1, &xd, &yd));
    T_CHECK_OK(e, gcap_module_call(r, 1, &xr, &yr));
    T_CHECK_OK(e, backward_weighted(yd));
    T_CHECK_OK(e, backward_weighted(yr));
    gcap_tensor_free(yd), gcap_tensor_free(yr);
    yd = yr = NULL;
  }
  T_CHECK(!bitwise_equal(gcap_tensor_grad(wd), gcap_tensor_grad(wr))); /* pending */
  T_CHECK_OK(e, gcap_module_backward_dw(seq));
  T_CHECK(bitwise_equal(gcap_tensor_grad(wd), gcap_tensor_grad(wr)));
  T_CHECK(bitwise_equal(gcap_tensor_grad(bd), gcap_tensor_grad(br)));
  T_CHECK(bitwise_equal(gcap_tensor_grad(xd), gcap_tensor_grad(xr)));
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
  gcap_tensor *x = input(e, 2, s, 0, 1.0f), *yd = NULL, *yr = NULL;
  T_REQUIRE(x != NULL);
  T_CHECK_OK(e, gcap_nn_linear(e, 3, 2, 0, 1, &d));
  T_CHECK_OK(e, gcap_nn_linear(e, 3, 2, 0, 0, &r));
  T_CHECK_OK(e, copy_params(r, d));
  T_CHECK_OK(e, gcap_module_call(d, 1, &x, &yd));
  T_CHECK_OK(e, gcap_module_call(r, 1, &x, &yr));
  T_CHECK_OK(e, backward_weighted(yd));
  T_CHECK_OK(e, backward_weighted(yr));
  gcap_tensor *wd = gcap_module_parameter(d, 0, NULL, 0),
              *wr = gcap_module_parameter(r, 0, NULL, 0);
  T_CHECK(gcap_tensor_grad(wd) == NULL);
  T_CHECK_OK(e, gcap_module_backward_dw(d));
  T_CHECK(bitwise_equal(gcap_tensor_grad(wd), gcap_tensor_grad(wr)));
  gcap_tensor_free(x), gcap_tensor_free(yd), gcap_tensor_free(yr);
  gcap_module_free(d), gcap_module_free(r);
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
  gcap_tensor *w = input(e, 2, sw, 0, 0.3f), *b = input(e, 1, sb, 0, 0.9f), *s = NULL,
              *x = input(e, 2, sx, 1, 0.0f), *x2 = input(e, 2, sx, 1, 0.0f),
              *res = input(e, 2, sy, 1, 2.0f), *res2 = input(e, 2, sy, 1, 2.0f), *y = NULL,
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
  T_CHECK_OK(e, backward_weighted(y));
  for (int i = 0; i < 5; i++)
    if (gcap_tensor_grad(gcap_module_parameter(m, i, NULL, 0)) == NULL)
      T_FAILF("grad", "parameter %s has no grad", want[i]);
  /* the same ops by hand on clones of the parameters: equal bitwise */
  T_CHECK_OK(e, gcap_tensor_clone(w, &w2));
  T_CHECK_OK(e, gcap_tensor_clone(b, &b2));
  T_CHECK_OK(e, gcap_tensor_clone(s, &s2));
  T_CHECK_OK(e, gcap_tensor_clone(gcap_module_parameter(norm, 0, NULL, 0), &nw));
  T_CHECK_OK(e, gcap_tensor_clone(gcap_module_parameter(norm, 1, NULL, 0), &nb));
  gcap_tensor *clones[5] = {w2, b2, s2, nw, nb};
  for (int i = 0; i < 5; i++)
    T_CHECK_OK(e, gcap_tensor_set_requires_grad(clones[i], 1));
  T_CHECK_OK(e, gcap_linear(x2, w2, b2, &h));
  T_CHECK_OK(e, gcap_gelu(h, &a));
  T_CHECK_OK(e, gcap_layer_norm(a, nw, nb, 1e-5, &n));
  T_CHECK_OK(e, gcap_mul(n, s2, &y2));
  T_CHECK_OK(e, gcap_add(y2, res2, &z2));
  T_CHECK(bitwise_equal(y, z2));
  T_CHECK_OK(e, backward_weighted(z2));
  for (int i = 0; i < 5; i++)
    if (!bitwise_equal(gcap_tensor_grad(gcap_module_parameter(m, i, NULL, 0)),
                       gcap_tensor_grad(clones[i])))
      T_FAILF("grad", "parameter %s: the module's grad differs from the functional one", want[i]);
  T_CHECK(bitwise_equal(gcap_tensor_grad(x), gcap_tensor_grad(x2)));
  T_CHECK(bitwise_equal(gcap_tensor_grad(res), gcap_tensor_grad(res2)));
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
  gcap_tensor *x = input(e, 2, s, 1, 0.0f), *x4 = input(e, 2, s4, 0, 0.0f),
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
  T_RUN(test_dropout_eval_identity);
  T_RUN(test_linear_init);
  T_RUN(test_sequential_equals_composition);
  T_RUN(test_hook_order);
  T_RUN(test_hook_order_nested);
  T_RUN(test_hooks_without_input_grad);
  T_RUN(test_hook_removal);
  T_RUN(test_hook_failure_leaves_clean_state);
  T_RUN(test_delay_wgrad);
  T_RUN(test_delay_wgrad_no_bias);
  T_RUN(test_c_module);
  T_RUN(test_bad_input);
  T_RUN(test_silent_forward_failure_is_named);
  return t_done();
}
