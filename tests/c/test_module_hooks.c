/*
** test_module_hooks.c: the four module hook kinds (graphcap.h "Modules"):
** their order and arguments, nested modules, an input without grad, removal,
** and a hook that fails (the call stops with its status, the module keeps
** working). Hooks that return values: test_hook_returns.c; on calls of
** several inputs and outputs: test_multi_hooks.c.
*/
#include <stdint.h>

#include "t.h"
#include "t_module.h"

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
  gcap_tensor *x = t_input(e, 2, s, 1, 0.0f), *y = NULL;
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
  T_CHECK_OK(e, t_backward_weighted(y));
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
  gcap_tensor *x = t_input(e, 2, s, 1, 0.5f), *y = NULL;
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
  T_CHECK_OK(e, t_backward_weighted(y));
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
  gcap_tensor *x = t_input(e, 2, s, 0, 0.0f), *y = NULL;
  T_REQUIRE(x != NULL);
  T_CHECK_OK(e, gcap_nn_linear(e, 4, 3, 1, 0, &lin));
  for (int k = 0; k < 4; k++) {
    h[k] = (hook_ud){&log, k + 1, GCAP_OK};
    T_CHECK_OK(e, gcap_module_register_hook(lin, (gcap_hook_kind)k, log_hook, &h[k], NULL, NULL));
  }
  T_CHECK_OK(e, gcap_module_call(lin, 1, &x, &y));
  T_CHECK_OK(e, t_backward_weighted(y));
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
  gcap_tensor *x = t_input(e, 2, s, 1, 0.0f), *y = NULL;
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
  T_CHECK_OK(e, t_backward_weighted(y));
  T_CHECK_TAGS(&log, "2 4");
  gcap_tensor_free(y), y = NULL;
  T_CHECK_OK(e, gcap_module_remove_hook(lin, id4));
  T_CHECK_OK(e, gcap_module_remove_hook(lin, id2));
  T_CHECK(gcap_module_num_hooks(lin, GCAP_HOOK_FORWARD) == 0 &&
          gcap_module_num_hooks(lin, GCAP_HOOK_BACKWARD) == 0);
  log.n = 0;
  T_CHECK_OK(e, gcap_module_call(lin, 1, &x, &y));
  T_CHECK_OK(e, t_backward_weighted(y));
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
  gcap_tensor *x = t_input(e, 2, s, 1, 0.0f), *y = NULL;
  int ok = x && gcap_nn_linear(e, 4, 3, 1, 0, &ref) == GCAP_OK &&
           t_copy_params(ref, lin) == GCAP_OK && gcap_module_call(ref, 1, &x, &y) == GCAP_OK &&
           t_backward_weighted(y) == GCAP_OK &&
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
    gcap_tensor *x = t_input(e, 2, s, 1, 0.0f), *y = (gcap_tensor *)(uintptr_t)0x10;
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
      T_CHECK_ST(e, t_backward_weighted(y), GCAP_EABORTED);
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
    T_CHECK_OK(e, t_backward_weighted(y));
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

int main(void) {
  T_RUN(test_hook_order);
  T_RUN(test_hook_order_nested);
  T_RUN(test_hooks_without_input_grad);
  T_RUN(test_hook_removal);
  T_RUN(test_hook_failure_leaves_clean_state);
  return t_done();
}
