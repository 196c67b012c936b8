/*
** test_graphed_stale.c: the checks a graphed backward makes through the C
** API (docs/semantics.md, "What a graphed backward checks"): a backward after
** a later call of its entry, and a backward after a static input or a
** parameter it reads was written, are GCAP_ESTATE with a message naming the
** entry, and nothing gets a grad; one sample tensor given for several
** arguments still makes each argument its own input; without cloning
** parameter grads, a .grad that is the static buffer gets the next
** backward's grad added, as eager's.
*/
#include "t.h"

static const int64_t xshape[2] = {2, 4};

/* A Linear(4, 3) graphed from one [2, 4] sample that requires grad. */
typedef struct fixture {
  gcap_engine *e;
  gcap_module *lin;
  gcap_tensor *sample;
  gcap_graphed *G;
} fixture;

static void fixture_free(fixture *f) {
  gcap_graphed_free(f->G);
  gcap_tensor_free(f->sample);
  gcap_module_free(f->lin);
  if (f->e) gcap_engine_free(f->e);
}

static int fixture_new(fixture *f) {
  gcap_module *const *mods = &f->lin;
  const int nargs = 1;
  gcap_tensor *const *args[1];
  memset(f, 0, sizeof *f);
  if ((f->e = t_engine()) == NULL) return 0;
  if (gcap_nn_linear(f->e, 4, 3, 1, 0, &f->lin) != GCAP_OK ||
      gcap_tensor_full(f->e, GCAP_F32, 2, xshape, 0.5, &f->sample) != GCAP_OK ||
      gcap_tensor_set_requires_grad(f->sample, 1) != GCAP_OK)
    return 0;
  args[0] = &f->sample;
  return gcap_make_graphed_callables(f->e, 1, mods, 1, &nargs, args, NULL, &f->G) == GCAP_OK;
}

/* sum(y):backward() */
static gcap_status backward_sum(gcap_tensor *y) {
  gcap_tensor *s = NULL;
  gcap_status st = gcap_sum(y, &s);
  if (st == GCAP_OK) st = gcap_backward(s, NULL, 0);
  gcap_tensor_free(s);
  return st;
}

/* The Linear's parameters have no grad. */
static int no_param_grads(gcap_module *m) {
  int k;
  for (k = 0; k < gcap_module_num_parameters(m); k++)
    if (gcap_tensor_grad(gcap_module_parameter(m, k, NULL, 0)) != NULL) return 0;
  return 1;
}

static void test_backward_after_next_call(void) {
  fixture f;
  gcap_tensor *x1 = NULL, *x2 = NULL, *y1 = NULL, *y2 = NULL;
  T_SETUP(fixture_new(&f), fixture_free(&f));
  T_CHECK_OK(f.e, gcap_tensor_full(f.e, GCAP_F32, 2, xshape, 1.0, &x1));
  T_CHECK_OK(f.e, gcap_tensor_full(f.e, GCAP_F32, 2, xshape, 2.0, &x2));
  T_CHECK_OK(f.e, gcap_graphed_call(f.G, 0, 1, &x1, &y1));
  T_CHECK_OK(f.e, gcap_graphed_call(f.G, 0, 1, &x2, &y2));
  T_CHECK_ST(f.e, backward_sum(y1), GCAP_ESTATE);
  T_CHECK(t_msg_has(f.e, "graphed backward of call 1 of entry 1 (callable 1, Linear)"));
  T_CHECK(t_msg_has(f.e, "overwritten by call 2 of that entry's forward"));
  T_CHECK(no_param_grads(f.lin));
  T_CHECK_ST(f.e, backward_sum(y2), GCAP_OK);
  T_CHECK(!no_param_grads(f.lin));
  gcap_tensor_free(y1);
  gcap_tensor_free(y2);
  gcap_tensor_free(x1);
  gcap_tensor_free(x2);
  fixture_free(&f);
}

static void test_backward_after_write(void) {
  fixture f;
  gcap_tensor *y = NULL, *w;
  int was;
  T_SETUP(fixture_new(&f), fixture_free(&f));
  /* the sample itself is the call's input, written before backward */
  T_CHECK_OK(f.e, gcap_graphed_call(f.G, 0, 1, &f.sample, &y));
  was = gcap_set_grad_enabled(f.e, 0);
  T_CHECK_OK(f.e, gcap_fill_(f.sample, 0.0));
  gcap_set_grad_enabled(f.e, was);
  T_CHECK_ST(f.e, backward_sum(y), GCAP_ESTATE);
  T_CHECK(t_msg_has(f.e, "graphed backward of call 1 of entry 1 (callable 1, Linear)"));
  T_CHECK(t_msg_has(f.e, "has been modified by an inplace operation"));
  T_CHECK(t_msg_has(f.e, "the [2, 4] f32 tensor it read as the static input of argument #1"));
  T_CHECK(no_param_grads(f.lin) && gcap_tensor_grad(f.sample) == NULL);
  gcap_tensor_free(y);
  /* a parameter written between the call and its backward */
  y = NULL;
  T_CHECK_OK(f.e, gcap_graphed_call(f.G, 0, 1, &f.sample, &y));
  w = gcap_module_parameter(f.lin, 0, NULL, 0);
  was = gcap_set_grad_enabled(f.e, 0);
  T_CHECK_OK(f.e, gcap_fill_(w, 0.25));
  gcap_set_grad_enabled(f.e, was);
  T_CHECK_ST(f.e, backward_sum(y), GCAP_ESTATE);
  T_CHECK(t_msg_has(f.e, "the [3, 4] f32 tensor it read as parameter 'weight' is at version"));
  T_CHECK(no_param_grads(f.lin));
  gcap_tensor_free(y);
  fixture_free(&f);
}

/* Self-attention graphed from one sample given as q, k and v: a call with
** three different tensors must compute what the eager module does. */
static void test_one_sample_for_three_arguments(void) {
  static const int64_t shape[4] = {3, 1, 2, 4};
  gcap_engine *e;
  gcap_module *dpa = NULL;
  gcap_tensor *s = NULL, *qkv[3] = {NULL}, *y = NULL, *want = NULL;
  gcap_graphed *G = NULL;
  float got[24], ref[24];
  int k, nargs = 3;
  T_REQUIRE((e = t_engine()) != NULL);
  T_CHECK_OK(e,
             gcap_nn_dot_product_attention(e, 2, 4, GCAP_ATTN_NO_MASK, 0.0, GCAP_SDPA_AUTO, &dpa));
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 4, shape, 0.5, &s));
  for (k = 0; k < 3; k++)
    T_CHECK_OK(e, gcap_tensor_rand(e, GCAP_F32, 4, shape, 1, &qkv[k]));
  {
    gcap_tensor *const same[3] = {s, s, s};
    gcap_tensor *const *args[1] = {same};
    T_CHECK_OK(e, gcap_make_graphed_callables(e, 1, &dpa, 1, &nargs, args, NULL, &G));
  }
  T_CHECK_OK(e, gcap_graphed_call(G, 0, 3, qkv, &y));
  gcap_graphed_free(G); /* the module runs its own forward again */
  T_CHECK_OK(e, gcap_module_call(dpa, 3, qkv, &want));
  if (t_read(y, got, 24) && t_read(want, ref, 24))
    for (k = 0; k < 24; k++)
      if (got[k] != ref[k]) {
        T_FAILF("got[k] == ref[k]", "element %d: graphed %.9g, eager %.9g", k, (double)got[k],
                (double)ref[k]);
        break;
      }
  gcap_tensor_free(y);
  gcap_tensor_free(want);
  for (k = 0; k < 3; k++)
    gcap_tensor_free(qkv[k]);
  gcap_tensor_free(s);
  gcap_module_free(dpa);
  gcap_engine_free(e);
}

/* clone_param_grads_on_return = 0: Linear(1, 1) without bias, weight 1, so
** the weight's grad is the input; two backwards add up, 1 + 100. */
static void test_no_clone_grads_add(void) {
  static const int64_t one[2] = {1, 1};
  gcap_engine *e;
  gcap_module *lin = NULL;
  gcap_tensor *s = NULL, *x = NULL, *y = NULL, *w, *const * args[1];
  gcap_graphed *G = NULL;
  gcap_graphed_opts o;
  const int nargs = 1;
  int was, i;
  T_REQUIRE((e = t_engine()) != NULL);
  T_CHECK_OK(e, gcap_nn_linear(e, 1, 1, 0, 0, &lin));
  w = gcap_module_parameter(lin, 0, NULL, 0);
  was = gcap_set_grad_enabled(e, 0);
  T_CHECK_OK(e, gcap_fill_(w, 1.0));
  gcap_set_grad_enabled(e, was);
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 2, one, 0.0, &s));
  args[0] = &s;
  gcap_graphed_opts_init(&o);
  o.clone_param_grads_on_return = 0;
  T_CHECK_OK(e, gcap_make_graphed_callables(e, 1, &lin, 1, &nargs, args, &o, &G));
  for (i = 0; i < 2; i++) {
    T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 2, one, i == 0 ? 1.0 : 100.0, &x));
    T_CHECK_OK(e, gcap_graphed_call(G, 0, 1, &x, &y));
    T_CHECK_ST(e, backward_sum(y), GCAP_OK);
    gcap_tensor_free(x);
    gcap_tensor_free(y);
    x = y = NULL;
  }
  T_CHECK(gcap_tensor_grad(w) != NULL && t_value(gcap_tensor_grad(w)) == 101.0);
  gcap_graphed_free(G);
  gcap_tensor_free(s);
  gcap_module_free(lin);
  gcap_engine_free(e);
}

int main(void) {
  T_RUN(test_backward_after_next_call);
  T_RUN(test_backward_after_write);
  T_RUN(test_one_sample_for_three_arguments);
  T_RUN(test_no_clone_grads_add);
  return t_done();
}
