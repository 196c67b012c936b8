/*
** test_hook_returns.c: module hooks that return values (gcap_hook_return), as
** PyTorch's hooks do: a forward pre-hook replaces the inputs, a forward hook
** the outputs, a backward pre-hook grad_out, a backward hook grad_in. Each
** replacement is checked bit for bit against the same computation done
** without hooks (scaling by 2 is exact); a hook that returns nothing keeps
** the values; returns of the wrong count, shape or kind fail with a message
** naming the module and the hook kind, and the module works afterwards.
*/
#include "t.h"

#define IN 4
#define OUT 3
#define ROWS 2

/* A hook that returns `scale` times the value it is given (scale 0:
** nothing), `count` copies of it, or (`scalar`) its sum, of another shape. */
typedef struct ret_hook {
  double scale;
  int count;
  int scalar;
  gcap_tensor *given;    /* the value it was last given (borrowed) */
  gcap_tensor *returned; /* what it last returned (borrowed: identity only) */
  int calls;
} ret_hook;

/* The value a hook of a->kind may replace (a backward hook without grad_in:
** grad_out, to return something where nothing may be returned). */
static gcap_tensor *given(const gcap_hook_args *a) {
  switch (a->kind) {
    case GCAP_HOOK_FORWARD_PRE:
      return a->nin > 0 ? a->in[0] : NULL;
    case GCAP_HOOK_FORWARD:
      return a->nout > 0 ? a->out[0] : NULL;
    case GCAP_HOOK_BACKWARD_PRE:
      return a->grad_out[0];
    case GCAP_HOOK_BACKWARD:
      return a->grad_in[0] ? a->grad_in[0] : a->grad_out[0];
  }
  return NULL;
}

static gcap_status ret_hook_fn(void *ud, gcap_module *m, const gcap_hook_args *a) {
  ret_hook *h = (ret_hook *)ud;
  gcap_tensor *v = given(a), *r = NULL, *rs[2];
  gcap_status st;
  (void)m;
  h->calls++;
  h->given = v;
  if (h->scale == 0.0) return GCAP_OK;
  st = h->scalar ? gcap_sum(v, &r) : gcap_scale(v, h->scale, &r);
  if (st != GCAP_OK) return st;
  rs[0] = rs[1] = r;
  st = gcap_hook_return(a, h->count, rs);
  h->returned = r;
  gcap_tensor_free(r); /* gcap_hook_return keeps its own reference */
  return st;
}

static gcap_status add(gcap_module *m, gcap_hook_kind k, ret_hook *h, int *id) {
  return gcap_module_register_hook(m, k, ret_hook_fn, h, NULL, id);
}

typedef struct fx {
  gcap_engine *e;
  gcap_module *lin;
  gcap_tensor *x;
} fx;

/* A Linear(IN, OUT) and an input x [ROWS, IN] that requires grad or not. */
static int fx_open(fx *f, int x_grad) {
  const int64_t s[2] = {ROWS, IN};
  memset(f, 0, sizeof *f);
  return (f->e = t_engine()) != NULL &&
         gcap_tensor_rand(f->e, GCAP_F32, 2, s, 1, &f->x) == GCAP_OK &&
         gcap_tensor_set_requires_grad(f->x, x_grad) == GCAP_OK &&
         gcap_nn_linear(f->e, IN, OUT, 1, 0, &f->lin) == GCAP_OK;
}

static void fx_close(fx *f) {
  gcap_module_free(f->lin);
  gcap_tensor_free(f->x);
  gcap_engine_free(f->e);
}

/* 1 when a == k * b element for element, bit for bit (n values). */
static int scaled_bits(gcap_tensor *a, gcap_tensor *b, float k, size_t n) {
  float va[ROWS * IN * OUT], vb[ROWS * IN * OUT];
  size_t i;
  if (a == NULL || b == NULL || n > ROWS * IN * OUT || !t_read(a, va, n) || !t_read(b, vb, n))
    return 0;
  for (i = 0; i < n; i++) {
    float want = k * vb[i];
    if (memcmp(&va[i], &want, sizeof want) != 0) return 0;
  }
  return 1;
}

/* y = lin(x); sum(y) backward. Leaves y to the caller (may be NULL). */
static gcap_status call_bwd(fx *f, gcap_tensor **y) {
  gcap_tensor *l = NULL;
  gcap_status st = gcap_module_call(f->lin, 1, &f->x, y);
  if (st == GCAP_OK) st = gcap_sum(*y, &l);
  if (st == GCAP_OK) st = gcap_backward(l, NULL, 0);
  gcap_tensor_free(l);
  return st;
}

/* Copies of the grads of x and the weight after a hook-free call, then
** cleared; 0 on error. */
static int reference_grads(fx *f, gcap_tensor **gx, gcap_tensor **gw) {
  gcap_tensor *y = NULL, *w = gcap_module_parameter(f->lin, 0, NULL, 0);
  int ok =
      call_bwd(f, &y) == GCAP_OK && gcap_tensor_clone(gcap_tensor_grad(w), gw) == GCAP_OK &&
      (gcap_tensor_grad(f->x) == NULL || gcap_tensor_clone(gcap_tensor_grad(f->x), gx) == GCAP_OK);
  gcap_tensor_free(y);
  return ok && gcap_module_zero_grad(f->lin, 1) == GCAP_OK &&
         gcap_tensor_set_grad(f->x, NULL) == GCAP_OK;
}

/* Pre-hooks replace the inputs: lin(2 * 3 * x); the second sees the first's
** return; one returning nothing keeps them. */
static void test_forward_pre_replaces_inputs(void) {
  fx f;
  ret_hook h1 = {2.0, 1, 0, NULL, NULL, 0}, keep = {0.0, 0, 0, NULL, NULL, 0},
           h2 = {3.0, 1, 0, NULL, NULL, 0};
  gcap_tensor *x2 = NULL, *x6 = NULL, *want = NULL, *y = NULL;
  T_SETUP(fx_open(&f, 0), fx_close(&f));
  T_CHECK_OK(f.e, gcap_scale(f.x, 2.0, &x2));
  T_CHECK_OK(f.e, gcap_scale(x2, 3.0, &x6)); /* 3 * (2 * x), as the hooks make it */
  T_CHECK_OK(f.e, gcap_module_call(f.lin, 1, &x6, &want));
  T_CHECK_OK(f.e, add(f.lin, GCAP_HOOK_FORWARD_PRE, &h1, NULL));
  T_CHECK_OK(f.e, add(f.lin, GCAP_HOOK_FORWARD_PRE, &keep, NULL));
  T_CHECK_OK(f.e, add(f.lin, GCAP_HOOK_FORWARD_PRE, &h2, NULL));
  T_CHECK_OK(f.e, gcap_module_call(f.lin, 1, &f.x, &y));
  T_CHECK(h1.given == f.x && keep.given == h1.returned && h2.given == h1.returned);
  T_CHECK(scaled_bits(y, want, 1.0f, ROWS * OUT));
  gcap_tensor_free(x2);
  gcap_tensor_free(x6);
  gcap_tensor_free(want);
  gcap_tensor_free(y);
  fx_close(&f);
}

/* A forward hook replaces the output: what the call returns is 2 * lin(x),
** and a later forward hook is given it. */
static void test_forward_replaces_output(void) {
  fx f;
  ret_hook h = {2.0, 1, 0, NULL, NULL, 0}, after = {0.0, 0, 0, NULL, NULL, 0};
  gcap_tensor *want = NULL, *y = NULL;
  T_SETUP(fx_open(&f, 0), fx_close(&f));
  T_CHECK_OK(f.e, gcap_module_call(f.lin, 1, &f.x, &want));
  T_CHECK_OK(f.e, add(f.lin, GCAP_HOOK_FORWARD, &h, NULL));
  T_CHECK_OK(f.e, add(f.lin, GCAP_HOOK_FORWARD, &after, NULL));
  T_CHECK_OK(f.e, gcap_module_call(f.lin, 1, &f.x, &y));
  T_CHECK(y == h.returned && after.given == h.returned);
  T_CHECK(scaled_bits(y, want, 2.0f, ROWS * OUT));
  gcap_tensor_free(want);
  gcap_tensor_free(y);
  fx_close(&f);
}

/* A backward pre-hook doubling grad_out doubles every grad below (x and the
** weight), and the backward hook is given the doubled grad_out. */
static void test_backward_pre_replaces_grad_out(void) {
  fx f;
  ret_hook h = {2.0, 1, 0, NULL, NULL, 0}, bw = {0.0, 0, 0, NULL, NULL, 0};
  gcap_tensor *gx = NULL, *gw = NULL, *y = NULL, *w;
  T_SETUP(fx_open(&f, 1), fx_close(&f));
  w = gcap_module_parameter(f.lin, 0, NULL, 0);
  T_SETUP(reference_grads(&f, &gx, &gw),
          (gcap_tensor_free(gx), gcap_tensor_free(gw), fx_close(&f)));
  T_CHECK_OK(f.e, add(f.lin, GCAP_HOOK_BACKWARD_PRE, &h, NULL));
  T_CHECK_OK(f.e, add(f.lin, GCAP_HOOK_BACKWARD, &bw, NULL));
  T_CHECK_ST(f.e, call_bwd(&f, &y), GCAP_OK);
  T_CHECK(h.calls == 1 && bw.calls == 1);
  T_CHECK(scaled_bits(gcap_tensor_grad(w), gw, 2.0f, OUT * IN));
  T_CHECK(scaled_bits(gcap_tensor_grad(f.x), gx, 2.0f, ROWS * IN));
  gcap_tensor_free(y);
  gcap_tensor_free(gx);
  gcap_tensor_free(gw);
  fx_close(&f);
}

/* A backward hook doubling grad_in doubles x's grad and nothing else. */
static void test_backward_replaces_grad_in(void) {
  fx f;
  ret_hook h = {2.0, 1, 0, NULL, NULL, 0};
  gcap_tensor *gx = NULL, *gw = NULL, *y = NULL, *w;
  T_SETUP(fx_open(&f, 1), fx_close(&f));
  w = gcap_module_parameter(f.lin, 0, NULL, 0);
  T_SETUP(reference_grads(&f, &gx, &gw),
          (gcap_tensor_free(gx), gcap_tensor_free(gw), fx_close(&f)));
  T_CHECK_OK(f.e, add(f.lin, GCAP_HOOK_BACKWARD, &h, NULL));
  T_CHECK_ST(f.e, call_bwd(&f, &y), GCAP_OK);
  T_CHECK(h.calls == 1);
  T_CHECK(scaled_bits(gcap_tensor_grad(f.x), gx, 2.0f, ROWS * IN));
  T_CHECK(scaled_bits(gcap_tensor_grad(w), gw, 1.0f, OUT * IN));
  gcap_tensor_free(y);
  gcap_tensor_free(gx);
  gcap_tensor_free(gw);
  fx_close(&f);
}

/* The call with hook h of kind k registered fails with GCAP_EINVAL and a
** message holding `what` (and, `named`, the hook kind); removed, the module
** gives the hook-free output. */
static void refused(fx *f, gcap_hook_kind k, ret_hook *h, int named, const char *what) {
  gcap_tensor *want = NULL, *y = NULL;
  int id = 0;
  T_CHECK_OK(f->e, gcap_module_call(f->lin, 1, &f->x, &want));
  T_CHECK_OK(f->e, add(f->lin, k, h, &id));
  T_CHECK_ST(f->e, call_bwd(f, &y), GCAP_EINVAL);
  if (!t_msg_has(f->e, "Linear") || (named && !t_msg_has(f->e, gcap_hook_kind_name(k))) ||
      !t_msg_has(f->e, what))
    T_FAILF("message", "'%s' should name Linear, the %s (%d) and '%s'", gcap_errmsg(f->e),
            gcap_hook_kind_name(k), named, what);
  gcap_tensor_free(y), y = NULL;
  T_CHECK_OK(f->e, gcap_module_remove_hook(f->lin, id));
  T_CHECK_OK(f->e, gcap_module_zero_grad(f->lin, 1));
  T_CHECK_OK(f->e, gcap_tensor_set_grad(f->x, NULL));
  T_CHECK_ST(f->e, call_bwd(f, &y), GCAP_OK);
  T_CHECK(scaled_bits(y, want, 1.0f, ROWS * OUT));
  gcap_tensor_free(y);
  gcap_tensor_free(want);
}

static void test_wrong_returns(void) {
  fx f;
  ret_hook two = {1.0, 2, 0, NULL, NULL, 0}, none = {1.0, 0, 0, NULL, NULL, 0},
           scalar = {1.0, 1, 1, NULL, NULL, 0};
  T_SETUP(fx_open(&f, 1), fx_close(&f));
  /* a forward hook may change the count; gcap_module_call refuses other than one */
  refused(&f, GCAP_HOOK_FORWARD, &two, 0, "gave 2 outputs; this call takes one tensor");
  refused(&f, GCAP_HOOK_FORWARD, &none, 0, "gave 0 outputs");
  refused(&f, GCAP_HOOK_BACKWARD_PRE, &two, 1,
          "must return 1 grad_output (one per tensor output) or nothing, got 2");
  refused(&f, GCAP_HOOK_BACKWARD_PRE, &scalar, 1,
          "grad_output #1 of shape [] f32; expected shape [2, 3]");
  refused(&f, GCAP_HOOK_BACKWARD, &scalar, 1,
          "grad_input #1 of shape [] f32; expected shape [2, 4]");
  refused(&f, GCAP_HOOK_BACKWARD, &two, 1,
          "must return 1 grad_input (one per input) or nothing, got 2");
  /* a pre-hook may change the count; Linear's forward refuses two inputs */
  refused(&f, GCAP_HOOK_FORWARD_PRE, &two, 0, "expected 1 input, got 2");
  fx_close(&f);
}

/* No input requires grad: a backward hook's grad_in is NULL and stays so. */
static void test_backward_without_grad_in(void) {
  fx f;
  ret_hook h = {2.0, 1, 0, NULL, NULL, 0};
  T_SETUP(fx_open(&f, 0), fx_close(&f));
  refused(&f, GCAP_HOOK_BACKWARD, &h, 1,
          "returned a tensor as grad_input #1, but input #1 needs no grad");
  fx_close(&f);
}

/* gcap_hook_return outside a hook, or with bad arguments; a return refused
** fails the call though the hook ignores the refusal. */
static gcap_status misuse_hook(void *ud, gcap_module *m, const gcap_hook_args *a) {
  int *bad = (int *)ud;
  gcap_tensor *none[1] = {NULL};
  (void)m;
  *bad = gcap_hook_return(a, -1, none) != GCAP_EINVAL ||
         gcap_hook_return(a, 1, NULL) != GCAP_EINVAL || gcap_hook_return(a, 1, none) != GCAP_EINVAL;
  return GCAP_OK;
}

static void test_misuse(void) {
  fx f;
  gcap_hook_args a;
  gcap_tensor *y = NULL;
  int bad = -1, id = 0;
  T_SETUP(fx_open(&f, 0), fx_close(&f));
  memset(&a, 0, sizeof a);
  T_CHECK(gcap_hook_return(NULL, 0, NULL) == GCAP_EINVAL);
  T_CHECK(gcap_hook_return(&a, 1, &f.x) == GCAP_EINVAL); /* not a running hook's */
  T_CHECK_OK(f.e,
             gcap_module_register_hook(f.lin, GCAP_HOOK_FORWARD_PRE, misuse_hook, &bad, NULL, &id));
  T_CHECK_ST(f.e, gcap_module_call(f.lin, 1, &f.x, &y), GCAP_EINVAL);
  T_CHECK(bad == 0);
  T_CHECK(
      t_msg_has(f.e, "Linear: a forward pre-hook returned NULL as input #1; expected a tensor"));
  T_CHECK(y == NULL);
  T_CHECK_OK(f.e, gcap_module_remove_hook(f.lin, id));
  T_CHECK_OK(f.e, gcap_module_call(f.lin, 1, &f.x, &y));
  gcap_tensor_free(y);
  fx_close(&f);
}

/* Are y and the grads of x and the weight those given, bit for bit? */
static int same_as(fx *f, gcap_tensor *y, gcap_tensor *want_y, gcap_tensor *want_gx,
                   gcap_tensor *want_gw) {
  gcap_tensor *w = gcap_module_parameter(f->lin, 0, NULL, 0);
  return scaled_bits(y, want_y, 1.0f, ROWS * OUT) &&
         scaled_bits(gcap_tensor_grad(f->x), want_gx, 1.0f, ROWS * IN) &&
         scaled_bits(gcap_tensor_grad(w), want_gw, 1.0f, OUT * IN);
}

/* Hooks of all four kinds doubling what they are given, under allocation
** failure: for N = 1, 2, ... the N-th allocation of a call and its backward
** fails; the failure is an error with a message (or, absorbed, the call
** gives the right values), and a clean call after it gives the output and
** grads of a call that never failed, bit for bit. */
static void test_allocation_failures(void) {
  fx f;
  ret_hook h[4] = {{2.0, 1, 0, NULL, NULL, 0},
                   {2.0, 1, 0, NULL, NULL, 0},
                   {2.0, 1, 0, NULL, NULL, 0},
                   {2.0, 1, 0, NULL, NULL, 0}};
  gcap_tensor *y = NULL, *want_y = NULL, *want_gx = NULL, *want_gw = NULL, *w;
  long n;
  int k, injected = 1;
  T_SETUP(fx_open(&f, 1), fx_close(&f));
  w = gcap_module_parameter(f.lin, 0, NULL, 0);
  for (k = 0; k < 4; k++)
    T_CHECK_OK(f.e, add(f.lin, (gcap_hook_kind)k, &h[k], NULL));
  T_CHECK_OK(f.e, call_bwd(&f, &want_y));
  T_CHECK_OK(f.e, gcap_tensor_clone(gcap_tensor_grad(f.x), &want_gx));
  T_CHECK_OK(f.e, gcap_tensor_clone(gcap_tensor_grad(w), &want_gw));
  for (n = 1; injected && n < 10000 && !t_bad; n++) {
    gcap_status st;
    T_CHECK_OK(f.e, gcap_module_zero_grad(f.lin, 1));
    T_CHECK_OK(f.e, gcap_tensor_set_grad(f.x, NULL));
    gcap_test_fail_alloc(n);
    st = call_bwd(&f, &y);
    injected = (int)gcap_test_fail_alloc(0);
    if (st != GCAP_OK && gcap_errmsg(f.e)[0] == '\0')
      T_FAILF("failure", "allocation %ld failed: %s without a message", n, gcap_status_str(st));
    if (st == GCAP_OK && !same_as(&f, y, want_y, want_gx, want_gw)) /* a failure absorbed */
      T_FAILF("absorbed", "the call that absorbed allocation failure %ld differs", n);
    gcap_tensor_free(y), y = NULL;
    T_CHECK_OK(f.e, gcap_module_zero_grad(f.lin, 1));
    T_CHECK_OK(f.e, gcap_tensor_set_grad(f.x, NULL));
    T_CHECK_OK(f.e, call_bwd(&f, &y));
    if (!same_as(&f, y, want_y, want_gx, want_gw))
      T_FAILF("after failure", "a clean call after allocation %ld failed differs", n);
    gcap_tensor_free(y), y = NULL;
  }
  T_CHECK(!injected); /* the walk ended: the call makes fewer than n allocations */
  T_CHECK(n > 5);
  gcap_tensor_free(want_y);
  gcap_tensor_free(want_gx);
  gcap_tensor_free(want_gw);
  fx_close(&f);
}

int main(void) {
  T_RUN(test_forward_pre_replaces_inputs);
  T_RUN(test_forward_replaces_output);
  T_RUN(test_backward_pre_replaces_grad_out);
  T_RUN(test_backward_replaces_grad_in);
  T_RUN(test_wrong_returns);
  T_RUN(test_backward_without_grad_in);
  T_RUN(test_misuse);
  T_RUN(test_allocation_failures);
  return t_done();
}
