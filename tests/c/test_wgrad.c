/*
** test_wgrad.c: a Linear's delayed and fused weight grads through the C API:
** the grads a backward leaves to backward_dw (delayed) or adds into the
** main_grad buffer (fused) equal bit for bit those of a plain Linear, and
** they outlive the module: a backward after the module is freed still works.
*/
#include "t.h"

#define IN 5
#define OUT 3
#define ROWS 4

/* A Linear with `flags` whose parameters are those of `like` (NULL: its own). */
static gcap_status linear_like(gcap_engine *e, unsigned flags, gcap_module *like,
                               gcap_module **out) {
  gcap_status st = gcap_nn_linear(e, IN, OUT, 1, flags, out);
  int i, was;
  if (st != GCAP_OK || like == NULL) return st;
  was = gcap_set_grad_enabled(e, 0);
  for (i = 0; i < 2 && st == GCAP_OK; i++)
    st = gcap_copy_(gcap_module_parameter(*out, i, NULL, 0),
                    gcap_module_parameter(like, i, NULL, 0));
  gcap_set_grad_enabled(e, was);
  return st;
}

/* sum(m(x)) backward; the loss's grad reaches m's parameters. */
static gcap_status fwd_bwd(gcap_module *m, gcap_tensor *x) {
  gcap_tensor *y = NULL, *l = NULL;
  gcap_status st = gcap_module_call(m, 1, &x, &y);
  if (st == GCAP_OK) st = gcap_sum(y, &l);
  if (st == GCAP_OK) st = gcap_backward(l, NULL, 0);
  gcap_tensor_free(y);
  gcap_tensor_free(l);
  return st;
}

/* 1 when a and b hold the same n floats bit for bit. */
static int same_bits(gcap_tensor *a, gcap_tensor *b, size_t n) {
  float va[IN * OUT], vb[IN * OUT];
  return a != NULL && b != NULL && n <= IN * OUT && gcap_tensor_read(a, va, n) == GCAP_OK &&
         gcap_tensor_read(b, vb, n) == GCAP_OK && memcmp(va, vb, n * sizeof *va) == 0;
}

typedef struct fx {
  gcap_engine *e;
  gcap_module *plain, *m;
  gcap_tensor *x;
} fx;

static int fx_open(fx *f, unsigned flags) {
  const int64_t s[2] = {ROWS, IN};
  memset(f, 0, sizeof *f);
  return (f->e = t_engine()) != NULL &&
         gcap_tensor_rand(f->e, GCAP_F32, 2, s, 1, &f->x) == GCAP_OK &&
         linear_like(f->e, 0, NULL, &f->plain) == GCAP_OK &&
         linear_like(f->e, flags, f->plain, &f->m) == GCAP_OK;
}

static void fx_close(fx *f) {
  gcap_module_free(f->plain);
  gcap_module_free(f->m);
  gcap_tensor_free(f->x);
  gcap_engine_free(f->e);
}

/* Two backwards queue two wgrads; backward_dw turns them into .grad, equal
** to the plain Linear's after the same two backwards. */
static void test_delayed_equals_plain(void) {
  fx f;
  gcap_tensor *w, *b;
  T_SETUP(fx_open(&f, GCAP_LINEAR_DELAY_WGRAD), fx_close(&f));
  w = gcap_module_parameter(f.m, 0, NULL, 0);
  b = gcap_module_parameter(f.m, 1, NULL, 0);
  T_CHECK(gcap_module_has_delayed_wgrad(f.m) && !gcap_module_has_delayed_wgrad(f.plain));
  T_CHECK_ST(f.e, fwd_bwd(f.plain, f.x), GCAP_OK);
  T_CHECK_ST(f.e, fwd_bwd(f.plain, f.x), GCAP_OK);
  T_CHECK_ST(f.e, fwd_bwd(f.m, f.x), GCAP_OK);
  T_CHECK_ST(f.e, fwd_bwd(f.m, f.x), GCAP_OK);
  T_CHECK(gcap_tensor_grad(w) == NULL && gcap_tensor_grad(b) == NULL); /* still queued */
  T_CHECK_ST(f.e, gcap_module_backward_dw(f.m), GCAP_OK);
  T_CHECK(same_bits(gcap_tensor_grad(w),
                    gcap_tensor_grad(gcap_module_parameter(f.plain, 0, NULL, 0)), IN * OUT));
  T_CHECK(same_bits(gcap_tensor_grad(b),
                    gcap_tensor_grad(gcap_module_parameter(f.plain, 1, NULL, 0)), OUT));
  /* the queue is drained: a second backward_dw adds nothing */
  T_CHECK_ST(f.e, gcap_module_backward_dw(f.m), GCAP_OK);
  T_CHECK(same_bits(gcap_tensor_grad(w),
                    gcap_tensor_grad(gcap_module_parameter(f.plain, 0, NULL, 0)), IN * OUT));
  fx_close(&f);
}

/* Fused: the weight grad goes into main_grad, never .grad; the bias grad to
** .grad as usual. */
static void test_fused_into_main_grad(void) {
  fx f;
  gcap_tensor *mg;
  T_SETUP(fx_open(&f, GCAP_LINEAR_FUSE_WGRAD), fx_close(&f));
  mg = gcap_module_buffer(f.m, 0, NULL, 0);
  T_REQUIRE(mg != NULL);
  T_CHECK_ST(f.e, fwd_bwd(f.plain, f.x), GCAP_OK);
  T_CHECK_ST(f.e, fwd_bwd(f.m, f.x), GCAP_OK);
  T_CHECK(gcap_tensor_grad(gcap_module_parameter(f.m, 0, NULL, 0)) == NULL);
  T_CHECK(same_bits(mg, gcap_tensor_grad(gcap_module_parameter(f.plain, 0, NULL, 0)), IN * OUT));
  T_CHECK(same_bits(gcap_tensor_grad(gcap_module_parameter(f.m, 1, NULL, 0)),
                    gcap_tensor_grad(gcap_module_parameter(f.plain, 1, NULL, 0)), OUT));
  fx_close(&f);
}

/* The grads' destination outlives the module: with the module freed after
** its forward, the backward still runs (delayed: into a queue no one
** drains; fused: into main_grad, kept alive by the graph) and reaches the
** input. */
static void test_backward_after_module_freed(void) {
  const unsigned flags[2] = {GCAP_LINEAR_DELAY_WGRAD, GCAP_LINEAR_FUSE_WGRAD};
  int i;
  for (i = 0; i < 2; i++) {
    fx f;
    gcap_tensor *y = NULL, *l = NULL, *mg = NULL;
    T_SETUP(fx_open(&f, flags[i]), fx_close(&f));
    T_CHECK_OK(f.e, gcap_tensor_set_requires_grad(f.x, 1));
    if (flags[i] == GCAP_LINEAR_FUSE_WGRAD)
      mg = gcap_tensor_retain(gcap_module_buffer(f.m, 0, NULL, 0));
    T_CHECK_ST(f.e, gcap_module_call(f.m, 1, &f.x, &y), GCAP_OK);
    gcap_module_free(f.m), f.m = NULL;
    T_CHECK_ST(f.e, gcap_sum(y, &l), GCAP_OK);
    T_CHECK_ST(f.e, gcap_backward(l, NULL, 0), GCAP_OK);
    T_CHECK(gcap_tensor_grad(f.x) != NULL);
    if (mg != NULL) T_CHECK(t_value(mg) != 0.0);
    gcap_tensor_free(mg);
    gcap_tensor_free(y);
    gcap_tensor_free(l);
    fx_close(&f);
  }
}

int main(void) {
  T_RUN(test_delayed_equals_plain);
  T_RUN(test_fused_into_main_grad);
  T_RUN(test_backward_after_module_freed);
  return t_done();
}
