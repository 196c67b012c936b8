/*
** test_regressions.c: one test per defect found by trying to break the
** engine through its C API (bad arguments, lifetimes, failures inside
** captures), each failing before its fix. `test_regressions NAME` runs only
** the tests whose name contains NAME.
*/
#include "t.h"

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

static const struct {
  const char *name;
  void (*fn)(void);
} tests[] = {
#define T_ENTRY(fn)                                                                                \
  { #fn, fn }
    T_ENTRY(test_graphed_call_null_inputs),
    T_ENTRY(test_graphed_eager_fallback_messages),
    T_ENTRY(test_graphed_call_checks_shape),
};

int main(int argc, char **argv) {
  for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++)
    if (argc < 2 || strstr(tests[i].name, argv[1])) t_run_(tests[i].name, tests[i].fn);
  return t_done();
}
