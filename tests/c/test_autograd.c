/*
** test_autograd.c: backward scheduling and autograd state (graphcap.h
** "Autograd"): a node runs once after all its grads arrived (diamonds), deep
** chains need no recursion, leaves accumulate, retain_graph, the errors of
** backward (non-scalar without grad, wrong grad, second backward),
** requires_grad only on leaves, grad mode, detach, in-place writes to leaves,
** and a backward captured into a graph replaying bitwise equal to eager.
*/
#include <pthread.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include "t.h"

/* got[i] == want[i] for i < n (as floats); names the first difference. */
#define T_CHECK_VALUES(what, got, want, n)                                                         \
  do {                                                                                             \
    for (int t_i_ = 0; t_i_ < (int)(n); t_i_++)                                                    \
      if ((float)(got)[t_i_] != (float)(want)[t_i_]) {                                             \
        T_FAILF(what, "element %d: got %.9g, want %.9g", t_i_, (double)(got)[t_i_],                \
                (double)(want)[t_i_]);                                                             \
        break;                                                                                     \
      }                                                                                            \
  } while (0)

/* A leaf that requires grad, from host data. */
static gcap_tensor *leaf(gcap_engine *e, int nd, const int64_t *shape, const float *d) {
  gcap_tensor *t = t_from(e, nd, shape, d);
  if (t && gcap_tensor_set_requires_grad(t, 1) != GCAP_OK) T_CHECK(!"set_requires_grad");
  return t;
}

/* ------------------------------------------------------------------------ */

/* x feeds two branches that join: the join's grad is summed and x's grad
** arrives once: d/dx sum(2x + x*x) = 2 + 2x. */
static void test_diamond(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[1] = {4};
  const float dx[4] = {-1.5f, 0.0f, 0.5f, 2.0f};
  float g[4], want[4];
  gcap_tensor *x = leaf(e, 1, s, dx), *a = NULL, *b = NULL, *c = NULL, *l = NULL;
  T_REQUIRE(x != NULL);
  T_CHECK_OK(e, gcap_scale(x, 2.0, &a));
  T_CHECK_OK(e, gcap_mul(x, x, &b));
  T_CHECK_OK(e, gcap_add(a, b, &c));
  T_CHECK_OK(e, gcap_sum(c, &l));
  T_CHECK_OK(e, gcap_backward(l, NULL, 0));
  T_REQUIRE(gcap_tensor_grad(x) != NULL);
  for (int i = 0; i < 4; i++)
    want[i] = 2.0f + 2.0f * dx[i];
  if (t_read(gcap_tensor_grad(x), g, 4)) T_CHECK_VALUES("grad of 2x + x*x", g, want, 4);
  gcap_tensor_free(x), gcap_tensor_free(a), gcap_tensor_free(b), gcap_tensor_free(c),
      gcap_tensor_free(l);
  gcap_engine_free(e);
}

/* A non-leaf y = 3x used by three consumers joined in two steps: y's node must
** run once, after all three grads arrived: d/dx sum(y*y - y + 0.5 y) = 3(2y - 0.5). */
static void test_diamond_deep_join(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[2] = {2, 2};
  const float dx[4] = {1.0f, -2.0f, 0.25f, 3.0f};
  float g[4], want[4];
  gcap_tensor *x = leaf(e, 2, s, dx), *y = NULL, *p = NULL, *q = NULL, *h = NULL, *j1 = NULL,
              *j2 = NULL, *l = NULL;
  T_REQUIRE(x != NULL);
  T_CHECK_OK(e, gcap_scale(x, 3.0, &y));
  T_CHECK_OK(e, gcap_mul(y, y, &p));     /* consumer 1 (twice) */
  T_CHECK_OK(e, gcap_neg(y, &q));        /* consumer 2 */
  T_CHECK_OK(e, gcap_scale(y, 0.5, &h)); /* consumer 3 */
  T_CHECK_OK(e, gcap_add(p, q, &j1));
  T_CHECK_OK(e, gcap_add(j1, h, &j2));
  T_CHECK_OK(e, gcap_sum(j2, &l));
  T_CHECK_OK(e, gcap_backward(l, NULL, 0));
  T_REQUIRE(gcap_tensor_grad(x) != NULL);
  for (int i = 0; i < 4; i++)
    want[i] = 3.0f * (2.0f * (3.0f * dx[i]) - 0.5f);
  if (t_read(gcap_tensor_grad(x), g, 4)) T_CHECK_VALUES("grad", g, want, 4);
  gcap_tensor_free(x), gcap_tensor_free(y), gcap_tensor_free(p), gcap_tensor_free(q);
  gcap_tensor_free(h), gcap_tensor_free(j1), gcap_tensor_free(j2), gcap_tensor_free(l);
  gcap_engine_free(e);
}

/* 1,000 ops in a chain of every kind (neg, add of a constant, mul by ones,
** views), intermediate handles dropped as they go. */
static void test_deep_chain(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  enum { DEPTH = 1000 };
  const int64_t s2[2] = {2, 3}, s1[1] = {6};
  const float dx[6] = {1, 2, 3, 4, 5, 6};
  float g[6], v[6], ones_v[6] = {1, 1, 1, 1, 1, 1};
  gcap_tensor *x = leaf(e, 2, s2, dx), *c = NULL, *one2 = NULL, *one1 = NULL, *y, *t = NULL,
              *l = NULL;
  T_REQUIRE(x != NULL);
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 0, NULL, 0.5, &c));
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 2, s2, 1.0, &one2));
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 1, s1, 1.0, &one1));
  y = gcap_tensor_retain(x);
  double shift = 0.0; /* y = sign * x + shift */
  int sign = 1;
  for (int i = 0; i < DEPTH; i++) {
    gcap_status st;
    int nd = gcap_tensor_ndim(y);
    switch (i % 4) {
      case 0:
        st = gcap_neg(y, &t), sign = -sign, shift = -shift;
        break;
      case 1:
        st = gcap_add(y, c, &t), shift += 0.5;
        break;
      case 2:
        st = gcap_mul(y, nd == 2 ? one2 : one1, &t);
        break;
      default:
        st = nd == 2 ? gcap_tensor_view(y, 1, s1, &t) : gcap_tensor_view(y, 2, s2, &t);
        break;
    }
    if (st != GCAP_OK) {
      T_FAILF("chain op", "op %d: %s (%s)", i, gcap_status_str(st), gcap_errmsg(e));
      gcap_tensor_free(y);
      goto done;
    }
    gcap_tensor_free(y);
    y = t;
  }
  T_CHECK(gcap_tensor_grad_fn_name(y) != NULL);
  if (t_read(y, v, 6))
    for (int i = 0; i < 6; i++)
      T_CHECK_NEAR(v[i], sign * (double)dx[i] + shift, 1e-3, 1e-6);
  T_CHECK_OK(e, gcap_sum(y, &l));
  gcap_tensor_free(y);
  T_CHECK_OK(e, gcap_backward(l, NULL, 0));
  T_REQUIRE(gcap_tensor_grad(x) != NULL);
  for (int i = 0; i < 6; i++)
    ones_v[i] = (float)sign;
  if (t_read(gcap_tensor_grad(x), g, 6)) T_CHECK_VALUES("grad through 1,000 ops", g, ones_v, 6);
done:
  gcap_tensor_free(x), gcap_tensor_free(c), gcap_tensor_free(one2), gcap_tensor_free(one1);
  gcap_tensor_free(l);
  gcap_engine_free(e);
}

/* A very deep chain, built, backpropagated and freed on a thread with a
** 1 MiB stack: neither backward nor freeing the graph may need stack in
** proportion to its depth. Run in a child process, so that a stack overflow
** is reported as a failure rather than ending the suite; on the host
** backend (the code under test is the core's, and a forked child cannot use
** a cuda context its parent opened). The child reports its progress through
** a pipe: 'b' once backward has succeeded, 'f' once the graph is freed. */
enum { VERY_DEEP = 200000 };
static int deep_pipe = -1;
static void *very_deep_body(void *arg) {
  int *result = (int *)arg; /* 0 ok, 1 an op failed, 2 a wrong grad */
  gcap_engine *e = NULL;
  const int64_t s[1] = {1};
  gcap_tensor *x = NULL, *y, *t, *l = NULL;
  *result = 1;
  if (gcap_engine_new(GCAP_DEVICE_HOST, &e) != GCAP_OK) return NULL;
  if (gcap_tensor_full(e, GCAP_F32, 1, s, 2.0, &x) != GCAP_OK ||
      gcap_tensor_set_requires_grad(x, 1) != GCAP_OK)
    return NULL;
  y = gcap_tensor_retain(x);
  for (int i = 0; i < VERY_DEEP; i++) {
    if (gcap_neg(y, &t) != GCAP_OK) return NULL;
    gcap_tensor_free(y);
    y = t;
  }
  if (gcap_sum(y, &l) != GCAP_OK || gcap_backward(l, NULL, 0) != GCAP_OK) return NULL;
  float g = 0.0f;
  if (gcap_tensor_grad(x) == NULL || gcap_tensor_read(gcap_tensor_grad(x), &g, 1) != GCAP_OK)
    return NULL;
  if (write(deep_pipe, "b", 1) != 1) return NULL;
  gcap_tensor_free(l); /* the last references to VERY_DEEP nodes */
  gcap_tensor_free(y);
  if (write(deep_pipe, "f", 1) != 1) return NULL;
  *result = g == 1.0f ? 0 : 2;
  gcap_tensor_free(x);
  gcap_engine_free(e);
  return NULL;
}

static void test_very_deep_chain_small_stack(void) {
  int fds[2];
  T_REQUIRE(pipe(fds) == 0);
  fflush(stdout);
  pid_t pid = fork();
  T_REQUIRE(pid >= 0);
  if (pid == 0) {
    pthread_attr_t at;
    pthread_t th;
    int result = 3;
    close(fds[0]);
    deep_pipe = fds[1];
    if (pthread_attr_init(&at) != 0 || pthread_attr_setstacksize(&at, (size_t)1 << 20) != 0 ||
        pthread_create(&th, &at, very_deep_body, &result) != 0 || pthread_join(th, NULL) != 0)
      _exit(4);
    _exit(result);
  }
  close(fds[1]);
  char stage[4] = "";
  ssize_t got = 0, r;
  while (got < 2 && (r = read(fds[0], stage + got, (size_t)(2 - got))) > 0)
    got += r;
  close(fds[0]);
  int status = 0;
  T_REQUIRE(waitpid(pid, &status, 0) == pid);
  const char *where = got == 0   ? "building or backpropagating it"
                      : got == 1 ? "freeing it (after backward succeeded)"
                                 : "?";
  if (WIFSIGNALED(status))
    T_FAILF("no stack overflow", "a chain of %d ops on a 1 MiB stack: killed by signal %d while %s",
            VERY_DEEP, WTERMSIG(status), where);
  else if (WEXITSTATUS(status) != 0)
    T_FAILF("deep chain", "child exited with %d (1: an op failed, 2: wrong grad, 4: no thread)",
            WEXITSTATUS(status));
}

/* Two backwards through two graphs: the leaf's grad is the sum, kept at the
** same address (accumulated in place); a backward straight into a leaf too. */
static void test_leaf_accumulates(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[1] = {3};
  const float dx[3] = {1.0f, -2.0f, 0.5f}, dg[3] = {10.0f, 20.0f, 30.0f};
  float g[3], want[3];
  gcap_tensor *x = leaf(e, 1, s, dx), *sq = NULL, *l1 = NULL, *sc = NULL, *l2 = NULL, *gx = NULL;
  T_REQUIRE(x != NULL);
  T_CHECK(gcap_tensor_grad(x) == NULL);
  T_CHECK_OK(e, gcap_mul(x, x, &sq));
  T_CHECK_OK(e, gcap_sum(sq, &l1));
  T_CHECK_OK(e, gcap_backward(l1, NULL, 0));
  T_REQUIRE(gcap_tensor_grad(x) != NULL);
  uintptr_t addr = gcap_tensor_data_ptr(gcap_tensor_grad(x));
  T_CHECK_OK(e, gcap_scale(x, 3.0, &sc));
  T_CHECK_OK(e, gcap_sum(sc, &l2));
  T_CHECK_OK(e, gcap_backward(l2, NULL, 0));
  T_CHECK(gcap_tensor_data_ptr(gcap_tensor_grad(x)) == addr);
  for (int i = 0; i < 3; i++)
    want[i] = 2.0f * dx[i] + 3.0f;
  if (t_read(gcap_tensor_grad(x), g, 3)) T_CHECK_VALUES("2x + 3", g, want, 3);
  /* backward on the leaf itself adds the given grad */
  gx = t_from(e, 1, s, dg);
  T_REQUIRE(gx != NULL);
  T_CHECK_OK(e, gcap_backward(x, gx, 0));
  for (int i = 0; i < 3; i++)
    want[i] += dg[i];
  if (t_read(gcap_tensor_grad(x), g, 3)) T_CHECK_VALUES("2x + 3 + g", g, want, 3);
  /* set_grad(NULL) clears; the next backward allocates afresh */
  T_CHECK_OK(e, gcap_tensor_set_grad(x, NULL));
  T_CHECK(gcap_tensor_grad(x) == NULL);
  T_CHECK_OK(e, gcap_backward(x, gx, 0));
  if (t_read(gcap_tensor_grad(x), g, 3)) T_CHECK_VALUES("g", g, dg, 3);
  gcap_tensor_free(x), gcap_tensor_free(sq), gcap_tensor_free(l1), gcap_tensor_free(sc);
  gcap_tensor_free(l2), gcap_tensor_free(gx);
  gcap_engine_free(e);
}

/* set_grad installs a tensor of the same shape and dtype (later backwards
** accumulate into it), and refuses others. */
static void test_set_grad(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[2] = {2, 2}, s4[1] = {4};
  const float dx[4] = {1, 2, 3, 4}, d0[4] = {100, 200, 300, 400};
  float g[4], want[4];
  gcap_tensor *x = leaf(e, 2, s, dx), *g0 = t_from(e, 2, s, d0), *bad = NULL, *bf = NULL, *y = NULL,
              *l = NULL;
  T_REQUIRE(x && g0);
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 1, s4, 0.0, &bad));
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_BF16, 2, s, 0.0, &bf));
  T_CHECK_ST(e, gcap_tensor_set_grad(x, bad), GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "[4]") && t_msg_has(e, "[2, 2]"));
  T_CHECK_ST(e, gcap_tensor_set_grad(x, bf), GCAP_EINVAL);
  T_CHECK(gcap_tensor_grad(x) == NULL);
  T_CHECK_OK(e, gcap_tensor_set_grad(x, g0));
  T_CHECK(gcap_tensor_grad(x) == g0);
  T_CHECK_OK(e, gcap_mul(x, x, &y));
  T_CHECK_OK(e, gcap_sum(y, &l));
  T_CHECK_OK(e, gcap_backward(l, NULL, 0));
  T_CHECK(gcap_tensor_grad(x) == g0);
  for (int i = 0; i < 4; i++)
    want[i] = d0[i] + 2.0f * dx[i];
  if (t_read(g0, g, 4)) T_CHECK_VALUES("installed grad accumulates", g, want, 4);
  gcap_tensor_free(x), gcap_tensor_free(g0), gcap_tensor_free(bad), gcap_tensor_free(bf);
  gcap_tensor_free(y), gcap_tensor_free(l);
  gcap_engine_free(e);
}

/* retain_graph = 1 keeps saved tensors: a second backward works and
** accumulates; without it, a third is GCAP_ESTATE naming the problem, and
** changes nothing. */
static void test_retain_graph(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[1] = {3};
  const float dx[3] = {1.0f, -1.0f, 2.0f}, dw[3] = {0.5f, 2.0f, -3.0f};
  float g[3], want[3];
  gcap_tensor *x = leaf(e, 1, s, dx), *w = leaf(e, 1, s, dw), *y = NULL, *z = NULL, *l = NULL;
  T_REQUIRE(x && w);
  T_CHECK_OK(e, gcap_mul(x, w, &y)); /* saves x and w */
  T_CHECK_OK(e, gcap_gelu(y, &z));   /* saves y */
  T_CHECK_OK(e, gcap_sum(z, &l));
  T_CHECK_OK(e, gcap_backward(l, NULL, 1));
  T_REQUIRE(gcap_tensor_grad(x) != NULL);
  float g1[3];
  T_REQUIRE(t_read(gcap_tensor_grad(x), g1, 3));
  T_CHECK_OK(e, gcap_backward(l, NULL, 0)); /* allowed: the graph was retained */
  for (int i = 0; i < 3; i++)
    want[i] = g1[i] + g1[i];
  if (t_read(gcap_tensor_grad(x), g, 3)) T_CHECK_VALUES("two backwards", g, want, 3);
  T_CHECK_ST(e, gcap_backward(l, NULL, 0), GCAP_ESTATE);
  T_CHECK(t_msg_has(e, "second time") || t_msg_has(e, "retain_graph"));
  T_CHECK(t_msg_has(e, "retain_graph"));
  if (t_read(gcap_tensor_grad(x), g, 3))
    T_CHECK_VALUES("unchanged by the refused backward", g, want, 3);
  /* a new graph over the same leaves works */
  gcap_tensor_free(y), gcap_tensor_free(z), gcap_tensor_free(l);
  y = z = l = NULL;
  T_CHECK_OK(e, gcap_mul(x, w, &y));
  T_CHECK_OK(e, gcap_sum(y, &l));
  T_CHECK_OK(e, gcap_backward(l, NULL, 0));
  T_CHECK_ST(e, gcap_backward(l, NULL, 0), GCAP_ESTATE); /* sum and mul freed their saved tensors */
  T_CHECK(t_msg_has(e, "retain_graph"));
  gcap_tensor_free(x), gcap_tensor_free(w), gcap_tensor_free(y), gcap_tensor_free(z),
      gcap_tensor_free(l);
  gcap_engine_free(e);
}

/* The grad of a non-scalar output must be given, with its shape and dtype. */
static void test_backward_grad_errors(void) {
  gcap_engine *e = t_engine(), *e2 = NULL;
  T_REQUIRE(e != NULL);
  T_CHECK_OK(e, gcap_engine_new(t_device(), &e2));
  const int64_t s[2] = {2, 3}, s6[1] = {6}, s32[2] = {3, 2};
  const float dx[6] = {1, 2, 3, 4, 5, 6}, dg[6] = {1, -1, 2, -2, 3, -3};
  float g[6], want[6];
  gcap_tensor *x = leaf(e, 2, s, dx), *y = NULL, *flat = NULL, *tr = NULL, *bf = NULL,
              *other = NULL, *ok = NULL, *c = NULL;
  T_REQUIRE(x != NULL);
  T_CHECK_OK(e, gcap_scale(x, 2.0, &y));
  T_CHECK_ST(e, gcap_backward(y, NULL, 0), GCAP_EINVAL); /* 6 elements, no grad */
  T_CHECK(t_msg_has(e, "[2, 3]"));
  flat = t_from(e, 1, s6, dg);
  tr = t_from(e, 2, s32, dg);
  T_REQUIRE(flat && tr);
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_BF16, 2, s, 1.0, &bf));
  T_CHECK_OK(e2, gcap_tensor_full(e2, GCAP_F32, 2, s, 1.0, &other));
  T_CHECK_ST(e, gcap_backward(y, flat, 0), GCAP_EINVAL); /* same numel, other shape */
  T_CHECK(t_msg_has(e, "[6]") && t_msg_has(e, "[2, 3]"));
  T_CHECK_ST(e, gcap_backward(y, tr, 0), GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "[3, 2]"));
  T_CHECK_ST(e, gcap_backward(y, bf, 0), GCAP_EINVAL);    /* other dtype */
  T_CHECK_ST(e, gcap_backward(y, other, 0), GCAP_EINVAL); /* other engine */
  T_CHECK(gcap_tensor_grad(x) == NULL);                   /* nothing ran */
  /* the right grad works: d(2x)/dx * g = 2g */
  ok = t_from(e, 2, s, dg);
  T_REQUIRE(ok != NULL);
  T_CHECK_OK(e, gcap_backward(y, ok, 0));
  for (int i = 0; i < 6; i++)
    want[i] = 2.0f * dg[i];
  if (gcap_tensor_grad(x) && t_read(gcap_tensor_grad(x), g, 6)) T_CHECK_VALUES("2g", g, want, 6);
  /* a tensor that does not require grad cannot be backpropagated */
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 0, NULL, 1.0, &c));
  T_CHECK_ST(e, gcap_backward(c, NULL, 0), GCAP_EINVAL);
  T_CHECK(strlen(gcap_errmsg(e)) > 0);
  T_CHECK_ST(e, gcap_backward(NULL, NULL, 0), GCAP_EINVAL);
  gcap_tensor_free(x), gcap_tensor_free(y), gcap_tensor_free(flat), gcap_tensor_free(tr);
  gcap_tensor_free(bf), gcap_tensor_free(other), gcap_tensor_free(ok), gcap_tensor_free(c);
  gcap_engine_free(e2);
  gcap_engine_free(e);
}

/* A one-element output of any shape needs no grad ([1, 1] here). */
static void test_one_element_implicit_grad(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[2] = {1, 1};
  const float dx[1] = {3.0f};
  gcap_tensor *x = leaf(e, 2, s, dx), *y = NULL;
  T_REQUIRE(x != NULL);
  T_CHECK_OK(e, gcap_mul(x, x, &y));
  T_CHECK_OK(e, gcap_backward(y, NULL, 0));
  T_REQUIRE(gcap_tensor_grad(x) != NULL);
  T_CHECK(t_value(gcap_tensor_grad(x)) == 6.0);
  gcap_tensor_free(x), gcap_tensor_free(y);
  gcap_engine_free(e);
}

/* requires_grad is set on leaves only; ops mark their outputs. */
static void test_requires_grad_leaves_only(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[1] = {2};
  const float d[2] = {1, 2};
  gcap_tensor *x = t_from(e, 1, s, d), *c = t_from(e, 1, s, d), *y = NULL, *z = NULL;
  T_REQUIRE(x && c);
  T_CHECK(gcap_tensor_requires_grad(x) == 0 && gcap_tensor_is_leaf(x) == 1);
  T_CHECK_OK(e, gcap_add(x, c, &z)); /* nothing requires grad: nothing recorded */
  T_CHECK(gcap_tensor_requires_grad(z) == 0 && gcap_tensor_is_leaf(z) &&
          gcap_tensor_grad_fn_name(z) == NULL);
  gcap_tensor_free(z), z = NULL;
  T_CHECK_OK(e, gcap_tensor_set_requires_grad(x, 1));
  T_CHECK(gcap_tensor_requires_grad(x) == 1 && gcap_tensor_is_leaf(x) == 1);
  T_CHECK(gcap_tensor_grad_fn_name(x) == NULL);
  T_CHECK_OK(e, gcap_mul(x, c, &y));
  T_CHECK(gcap_tensor_requires_grad(y) == 1 && gcap_tensor_is_leaf(y) == 0);
  T_CHECK(gcap_tensor_grad_fn_name(y) != NULL && strcmp(gcap_tensor_grad_fn_name(y), "mul") == 0);
  T_CHECK_ST(e, gcap_tensor_set_requires_grad(y, 0), GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "leaves") || t_msg_has(e, "leaf"));
  T_CHECK(t_msg_has(e, "mul"));
  T_CHECK_ST(e, gcap_tensor_set_requires_grad(y, 1), GCAP_EINVAL);
  T_CHECK(gcap_tensor_requires_grad(y) == 1);
  T_CHECK_ST(e, gcap_tensor_set_requires_grad(NULL, 1), GCAP_EINVAL);
  /* switching a leaf off and on */
  T_CHECK_OK(e, gcap_tensor_set_requires_grad(x, 0));
  T_CHECK(gcap_tensor_requires_grad(x) == 0);
  T_CHECK_OK(e, gcap_add(x, c, &z));
  T_CHECK(gcap_tensor_grad_fn_name(z) == NULL && gcap_tensor_requires_grad(z) == 0);
  gcap_tensor_free(x), gcap_tensor_free(c), gcap_tensor_free(y), gcap_tensor_free(z);
  gcap_engine_free(e);
}

/* With grad mode off, ops on tensors that require grad record nothing. */
static void test_grad_mode_off(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[2] = {2, 3}, sw[2] = {4, 3}, sv[1] = {6};
  const float d[6] = {1, -2, 3, -4, 5, -6};
  float w[12];
  for (int i = 0; i < 12; i++)
    w[i] = 0.1f * (float)i;
  gcap_tensor *x = leaf(e, 2, s, d), *wt = leaf(e, 2, sw, w), *outs[8] = {0};
  T_REQUIRE(x && wt);
  T_CHECK(gcap_is_grad_enabled(e) == 1);
  T_CHECK(gcap_set_grad_enabled(e, 0) == 1);
  T_CHECK(gcap_is_grad_enabled(e) == 0);
  T_CHECK(gcap_set_grad_enabled(e, 0) == 0); /* returns the previous setting */
  T_CHECK_OK(e, gcap_mul(x, x, &outs[0]));
  T_CHECK_OK(e, gcap_linear(x, wt, NULL, &outs[1]));
  T_CHECK_OK(e, gcap_sum(x, &outs[2]));
  T_CHECK_OK(e, gcap_softmax(x, -1, &outs[3]));
  T_CHECK_OK(e, gcap_tensor_view(x, 1, sv, &outs[4]));
  T_CHECK_OK(e, gcap_dropout(x, 0.5, 1, &outs[5]));
  T_CHECK_OK(e, gcap_layer_norm(x, NULL, NULL, 1e-5, &outs[6]));
  T_CHECK_OK(e, gcap_gelu(x, &outs[7]));
  for (int i = 0; i < 8; i++) {
    if (gcap_tensor_grad_fn_name(outs[i]) != NULL || gcap_tensor_requires_grad(outs[i]) ||
        !gcap_tensor_is_leaf(outs[i]))
      T_FAILF("nothing recorded", "output %d: grad_fn %s, requires_grad %d", i,
              gcap_tensor_grad_fn_name(outs[i]) ? gcap_tensor_grad_fn_name(outs[i]) : "NULL",
              gcap_tensor_requires_grad(outs[i]));
  }
  T_CHECK_ST(e, gcap_backward(outs[2], NULL, 0), GCAP_EINVAL);
  T_CHECK(gcap_set_grad_enabled(e, 1) == 0);
  T_CHECK(gcap_is_grad_enabled(e) == 1);
  T_CHECK(gcap_tensor_grad(x) == NULL && gcap_tensor_grad(wt) == NULL);
  for (int i = 0; i < 8; i++)
    gcap_tensor_free(outs[i]);
  gcap_tensor_free(x), gcap_tensor_free(wt);
  gcap_engine_free(e);
}

/* detach: a leaf sharing storage, cut from the graph; grads stop there. */
static void test_detach(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[1] = {3};
  const float dw[3] = {1, 2, 3}, dx[3] = {-1, 0.5f, 4};
  float g[3], want[3];
  gcap_tensor *w = leaf(e, 1, s, dw), *x = leaf(e, 1, s, dx), *y = NULL, *d = NULL, *z = NULL,
              *l = NULL;
  T_REQUIRE(w && x);
  T_CHECK_OK(e, gcap_scale(w, 2.0, &y));
  T_CHECK_OK(e, gcap_tensor_detach(y, &d));
  T_CHECK(gcap_tensor_is_leaf(d) && !gcap_tensor_requires_grad(d) &&
          gcap_tensor_grad_fn_name(d) == NULL);
  T_CHECK(gcap_tensor_data_ptr(d) == gcap_tensor_data_ptr(y)); /* shared storage */
  T_CHECK(gcap_tensor_ndim(d) == 1 && gcap_tensor_shape(d)[0] == 3);
  T_CHECK(gcap_tensor_is_leaf(y) == 0); /* y itself is unchanged */
  T_CHECK_OK(e, gcap_mul(d, x, &z));
  T_CHECK_OK(e, gcap_sum(z, &l));
  T_CHECK_OK(e, gcap_backward(l, NULL, 0));
  T_CHECK(gcap_tensor_grad(w) == NULL); /* cut */
  T_REQUIRE(gcap_tensor_grad(x) != NULL);
  for (int i = 0; i < 3; i++)
    want[i] = 2.0f * dw[i];
  if (t_read(gcap_tensor_grad(x), g, 3)) T_CHECK_VALUES("grad = detached values", g, want, 3);
  /* writes through the detached tensor are seen by the original */
  T_CHECK_OK(e, gcap_fill_(d, 7.0));
  T_CHECK(t_value(y) == 7.0);
  /* detaching a leaf that requires grad gives one that does not */
  gcap_tensor *dw2 = NULL;
  T_CHECK_OK(e, gcap_tensor_detach(w, &dw2));
  T_CHECK(!gcap_tensor_requires_grad(dw2) && gcap_tensor_data_ptr(dw2) == gcap_tensor_data_ptr(w));
  T_CHECK_OK(e, gcap_fill_(dw2, 1.0)); /* allowed: not the leaf itself */
  gcap_tensor_free(dw2);
  gcap_tensor_free(w), gcap_tensor_free(x), gcap_tensor_free(y), gcap_tensor_free(d),
      gcap_tensor_free(z);
  gcap_tensor_free(l);
  gcap_engine_free(e);
}

/* In-place writes to a leaf that requires grad are refused while recording
** and allowed with grad mode off. */
static void test_inplace_on_leaf(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[1] = {4};
  const float d[4] = {1, 2, 3, 4}, d2[4] = {5, 6, 7, 8};
  float v[4];
  gcap_tensor *x = leaf(e, 1, s, d), *src = t_from(e, 1, s, d2), *y = NULL;
  T_REQUIRE(x && src);
  T_CHECK_ST(e, gcap_fill_(x, 9.0), GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "fill_") && t_msg_has(e, "grad"));
  T_CHECK_ST(e, gcap_zero_(x), GCAP_EINVAL);
  T_CHECK_ST(e, gcap_copy_(x, src), GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "copy_"));
  if (t_read(x, v, 4)) T_CHECK_VALUES("untouched", v, d, 4);
  int was = gcap_set_grad_enabled(e, 0);
  T_CHECK_OK(e, gcap_fill_(x, 9.0));
  T_CHECK(t_value(x) == 9.0);
  T_CHECK_OK(e, gcap_copy_(x, src));
  if (t_read(x, v, 4)) T_CHECK_VALUES("copied", v, d2, 4);
  T_CHECK_OK(e, gcap_zero_(x));
  T_CHECK(t_value(x) == 0.0);
  gcap_set_grad_enabled(e, was);
  T_CHECK(gcap_tensor_requires_grad(x) &&
          gcap_tensor_is_leaf(x)); /* still a leaf that requires grad */
  /* non-leaves and leaves without requires_grad can be written */
  T_CHECK_OK(e, gcap_fill_(src, 1.0));
  T_CHECK_OK(e, gcap_scale(x, 2.0, &y));
  T_CHECK_OK(e, gcap_fill_(y, 3.0));
  gcap_tensor_free(x), gcap_tensor_free(src), gcap_tensor_free(y);
  gcap_engine_free(e);
}

/* regression: a saved tensor changed in place gave a silently wrong grad */
/* Storage versions: each in-place op bumps one counter shared by views;
** a backward through a tensor changed in place since it was saved fails
** with PyTorch's message (the op and both versions); a training loop
** (backward, step, again) and graphed replays see no false alarm. */
static void test_inplace_after_save_is_detected(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[2] = {2, 3}, flat[1] = {6};
  const float d[6] = {1, 2, 3, 4, 5, 6};
  gcap_tensor *a = t_from(e, 2, s, d), *h = NULL, *y = NULL, *loss = NULL, *v = NULL, *z = NULL;
  uint64_t v0;
  T_REQUIRE(a != NULL);
  /* every in-place op counts, on the storage */
  v0 = gcap_tensor_version(a);
  T_CHECK_OK(e, gcap_tensor_view(a, 1, flat, &v));
  T_CHECK(gcap_tensor_version(v) == v0);
  T_CHECK_OK(e, gcap_fill_(a, 1.0));
  T_CHECK(gcap_tensor_version(a) == v0 + 1 && gcap_tensor_version(v) == v0 + 1);
  T_CHECK_OK(e, gcap_zero_(v));
  T_CHECK(gcap_tensor_version(a) == v0 + 2);
  T_CHECK_OK(e, gcap_copy_(a, a));
  T_CHECK(gcap_tensor_version(a) == v0 + 3);
  T_CHECK_OK(e, gcap_scale(a, 2.0, &z)); /* reading does not count */
  T_CHECK(gcap_tensor_version(a) == v0 + 3);
  gcap_tensor_free(z), z = NULL;
  /* a saved non-leaf changed in place, then backward */
  T_CHECK_OK(e, gcap_tensor_set_requires_grad(a, 1));
  T_CHECK_OK(e, gcap_scale(a, 2.0, &h));
  T_CHECK_OK(e, gcap_mul(h, h, &y)); /* saves h */
  T_CHECK_OK(e, gcap_sum(y, &loss));
  T_CHECK_OK(e, gcap_fill_(h, 3.0));
  T_CHECK_ST(e, gcap_backward(loss, NULL, 0), GCAP_ESTATE);
  T_CHECK(t_msg_has(e, "modified by an inplace operation") && t_msg_has(e, "'mul'") &&
          t_msg_has(e, "version") && t_msg_has(e, "[2, 3]"));
  T_CHECK(gcap_tensor_grad(a) == NULL);
  gcap_tensor_free(h), gcap_tensor_free(y), gcap_tensor_free(loss), gcap_tensor_free(v);
  gcap_tensor_free(a);
  gcap_engine_free(e);
}

/* regression: clone and copy_ cut the graph (x's grad stayed zero) */
/* clone and copy_ are recorded: the grad reaches their source (PyTorch's
** CloneBackward and CopyBackwards), and the history a copy_ overwrote
** gets zeros. */
static void test_clone_and_copy_grads(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[1] = {3};
  const float dx[3] = {1, 2, 3}, dw[3] = {0.5f, -2, 4}, zero[3] = {0, 0, 0};
  float g[3];
  gcap_tensor *x = leaf(e, 1, s, dx), *a = leaf(e, 1, s, dx), *w = t_from(e, 1, s, dw);
  gcap_tensor *c = NULL, *h = NULL, *p = NULL, *l = NULL;
  T_REQUIRE(x && a && w);
  T_CHECK_OK(e, gcap_tensor_clone(x, &c));
  T_CHECK(!gcap_tensor_is_leaf(c) && strcmp(gcap_tensor_grad_fn_name(c), "clone") == 0);
  T_CHECK_OK(e, gcap_mul(c, w, &p));
  T_CHECK_OK(e, gcap_sum(p, &l));
  T_CHECK_OK(e, gcap_backward(l, NULL, 0));
  T_REQUIRE(gcap_tensor_grad(x) != NULL);
  if (t_read(gcap_tensor_grad(x), g, 3)) T_CHECK_VALUES("clone's grad", g, dw, 3);
  gcap_tensor_free(p), gcap_tensor_free(l), p = l = NULL;
  T_CHECK_OK(e, gcap_tensor_set_grad(x, NULL));
  T_CHECK_OK(e, gcap_scale(a, 2.0, &h));
  T_CHECK_OK(e, gcap_copy_(h, x));
  T_CHECK(strcmp(gcap_tensor_grad_fn_name(h), "copy_") == 0);
  T_CHECK_OK(e, gcap_mul(h, w, &p));
  T_CHECK_OK(e, gcap_sum(p, &l));
  T_CHECK_OK(e, gcap_backward(l, NULL, 0));
  T_REQUIRE(gcap_tensor_grad(x) != NULL && gcap_tensor_grad(a) != NULL);
  if (t_read(gcap_tensor_grad(x), g, 3)) T_CHECK_VALUES("copy_'s source grad", g, dw, 3);
  if (t_read(gcap_tensor_grad(a), g, 3)) T_CHECK_VALUES("the overwritten history", g, zero, 3);
  gcap_tensor_free(x), gcap_tensor_free(a), gcap_tensor_free(w), gcap_tensor_free(c);
  gcap_tensor_free(h), gcap_tensor_free(p), gcap_tensor_free(l);
  gcap_engine_free(e);
}

/* ------------------------------------------------------------------------ */
/* Backward captured into a graph                                            */

typedef struct net {
  gcap_tensor *x, *w1, *b1, *w2, *t; /* x and t: inputs; w1, b1, w2: leaves */
} net;

/* mse(linear(gelu(layer_norm(linear(x, w1, b1))), w2), t) and its backward. */
static gcap_status net_step(net *n) {
  gcap_tensor *h = NULL, *ln = NULL, *a = NULL, *o = NULL, *l = NULL;
  gcap_status st;
  if ((st = gcap_linear(n->x, n->w1, n->b1, &h)) == GCAP_OK &&
      (st = gcap_layer_norm(h, NULL, NULL, 1e-5, &ln)) == GCAP_OK &&
      (st = gcap_gelu(ln, &a)) == GCAP_OK && (st = gcap_linear(a, n->w2, NULL, &o)) == GCAP_OK &&
      (st = gcap_mse_loss(o, n->t, &l)) == GCAP_OK)
    st = gcap_backward(l, NULL, 0);
  gcap_tensor_free(h), gcap_tensor_free(ln), gcap_tensor_free(a), gcap_tensor_free(o),
      gcap_tensor_free(l);
  return st;
}

enum { NB = 6, NI = 5, NH = 8, NO = 3 };

static void net_data(float *x, float *w1, float *b1, float *w2, float *t, float phase) {
  for (int i = 0; i < NB * NI; i++)
    x[i] = sinf(0.7f * (float)i + phase);
  for (int i = 0; i < NH * NI; i++)
    w1[i] = 0.4f * cosf(0.31f * (float)i);
  for (int i = 0; i < NH; i++)
    b1[i] = 0.05f * (float)i - 0.2f;
  for (int i = 0; i < NO * NH; i++)
    w2[i] = 0.3f * sinf(1.3f * (float)i + 0.5f);
  for (int i = 0; i < NB * NO; i++)
    t[i] = cosf(0.9f * (float)i + phase);
}

static int net_make(gcap_engine *e, net *n, float phase) {
  static float x[NB * NI], w1[NH * NI], b1[NH], w2[NO * NH], t[NB * NO];
  const int64_t sx[2] = {NB, NI}, sw1[2] = {NH, NI}, sb1[1] = {NH}, sw2[2] = {NO, NH},
                st[2] = {NB, NO};
  net_data(x, w1, b1, w2, t, phase);
  n->x = t_from(e, 2, sx, x), n->t = t_from(e, 2, st, t);
  n->w1 = leaf(e, 2, sw1, w1), n->b1 = leaf(e, 1, sb1, b1), n->w2 = leaf(e, 2, sw2, w2);
  return n->x && n->t && n->w1 && n->b1 && n->w2;
}

static void net_free(net *n) {
  gcap_tensor_free(n->x), gcap_tensor_free(n->w1), gcap_tensor_free(n->b1), gcap_tensor_free(n->w2);
  gcap_tensor_free(n->t);
}

/* All grads of n, concatenated, into buf (NH*NI + NH + NO*NH floats). */
enum { NG = NH * NI + NH + NO * NH };
static int net_grads(net *n, float *buf) {
  gcap_tensor *g[3] = {gcap_tensor_grad(n->w1), gcap_tensor_grad(n->b1), gcap_tensor_grad(n->w2)};
  const int sz[3] = {NH * NI, NH, NO * NH};
  for (int i = 0, at = 0; i < 3; at += sz[i], i++)
    if (g[i] == NULL || !t_read(g[i], buf + at, (size_t)sz[i])) return 0;
  return 1;
}

static gcap_status net_zero_grads(net *n) {
  gcap_tensor *p[3] = {n->w1, n->b1, n->w2};
  for (int i = 0; i < 3; i++)
    if (gcap_tensor_grad(p[i]) && gcap_zero_(gcap_tensor_grad(p[i])) != GCAP_OK) return GCAP_EINVAL;
  return GCAP_OK;
}

/* New input contents, written into n's input tensors in place. */
static gcap_status net_new_input(gcap_engine *e, net *n, float phase) {
  static float x[NB * NI], w1[NH * NI], b1[NH], w2[NO * NH], t[NB * NO];
  const int64_t sx[2] = {NB, NI}, st2[2] = {NB, NO};
  gcap_tensor *tx, *tt;
  gcap_status st;
  net_data(x, w1, b1, w2, t, phase);
  tx = t_from(e, 2, sx, x), tt = t_from(e, 2, st2, t);
  st = tx && tt ? gcap_copy_(n->x, tx) : GCAP_EINVAL;
  if (st == GCAP_OK) st = gcap_copy_(n->t, tt);
  gcap_tensor_free(tx), gcap_tensor_free(tt);
  return st;
}

/* The first backward happens under capture: .grad is allocated in the pool,
** and each replay writes single-step grads into it (a copy, not a sum). */
static void test_captured_backward_first(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  static float eager[NG], replay[NG];
  net a = {0}, b = {0};
  gcap_graph *g = NULL;
  if (!net_make(e, &a, 0.0f) || !net_make(e, &b, 0.0f)) goto done;
  T_CHECK_OK(e, net_step(&a));
  T_REQUIRE(net_grads(&a, eager));
  T_CHECK_OK(e, gcap_graph_new(e, &g));
  T_CHECK_OK(e, gcap_capture_begin(g, NULL, NULL));
  T_CHECK_OK(e, net_step(&b));
  T_CHECK_OK(e, gcap_capture_end(g));
  T_REQUIRE(gcap_tensor_grad(b.w1) != NULL); /* allocated, not yet computed */
  for (int k = 0; k < 2; k++) {
    T_CHECK_OK(e, gcap_graph_replay(g));
    if (net_grads(&b, replay) && memcmp(eager, replay, sizeof eager) != 0)
      T_FAILF("replayed grads == eager grads (bitwise)", "replay %d differs", k + 1);
  }
  /* new inputs: eager (grads zeroed first) and replay agree again */
  int was = gcap_set_grad_enabled(e, 0);
  T_CHECK_OK(e, net_new_input(e, &a, 1.0f));
  T_CHECK_OK(e, net_new_input(e, &b, 1.0f));
  gcap_set_grad_enabled(e, was);
  T_CHECK_OK(e, net_zero_grads(&a));
  T_CHECK_OK(e, net_step(&a));
  T_REQUIRE(net_grads(&a, eager));
  T_CHECK_OK(e, gcap_graph_replay(g));
  if (net_grads(&b, replay)) T_CHECK(memcmp(eager, replay, sizeof eager) == 0);
  T_CHECK(eager[0] != 0.0f || eager[1] != 0.0f);
done:
  net_free(&a), net_free(&b);
  gcap_graph_free(g);
  gcap_engine_free(e);
}

/* .grad exists before the capture: the captured backward accumulates into
** it in place, so replays accumulate like eager backwards do. */
static void test_captured_backward_accumulates(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  static float eager[NG], replay[NG];
  net a = {0}, b = {0};
  gcap_graph *g = NULL;
  uintptr_t addr;
  if (!net_make(e, &a, 0.5f) || !net_make(e, &b, 0.5f)) goto done;
  T_CHECK_OK(e, net_step(&b)); /* eager warm-up: allocates .grad */
  T_REQUIRE(gcap_tensor_grad(b.w1) != NULL);
  addr = gcap_tensor_data_ptr(gcap_tensor_grad(b.w1));
  T_CHECK_OK(e, gcap_graph_new(e, &g));
  T_CHECK_OK(e, gcap_capture_begin(g, NULL, NULL));
  T_CHECK_OK(e, net_step(&b));
  T_CHECK_OK(e, gcap_capture_end(g));
  T_CHECK(gcap_tensor_data_ptr(gcap_tensor_grad(b.w1)) == addr);
  /* single steps: zero eagerly before each replay */
  T_CHECK_OK(e, net_step(&a));
  T_REQUIRE(net_grads(&a, eager));
  for (int k = 0; k < 2; k++) {
    T_CHECK_OK(e, net_zero_grads(&b));
    T_CHECK_OK(e, gcap_graph_replay(g));
    if (net_grads(&b, replay) && memcmp(eager, replay, sizeof eager) != 0)
      T_FAILF("zeroed + replay == one eager backward (bitwise)", "replay %d differs", k + 1);
  }
  /* two replays without zeroing == two eager backwards */
  T_CHECK_OK(e, net_zero_grads(&a));
  T_CHECK_OK(e, net_zero_grads(&b));
  T_CHECK_OK(e, net_step(&a));
  T_CHECK_OK(e, net_step(&a));
  T_REQUIRE(net_grads(&a, eager));
  T_CHECK_OK(e, gcap_graph_replay(g));
  T_CHECK_OK(e, gcap_graph_replay(g));
  if (net_grads(&b, replay)) T_CHECK(memcmp(eager, replay, sizeof eager) == 0);
done:
  net_free(&a), net_free(&b);
  gcap_graph_free(g);
  gcap_engine_free(e);
}

/* A backward with retain_graph inside a capture and a second one after it,
** eagerly, through the same (retained) nodes. */
static void test_captured_backward_retained(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[1] = {8};
  float dx[8], g1[8], g2[8];
  for (int i = 0; i < 8; i++)
    dx[i] = 0.3f * (float)i - 1.0f;
  gcap_tensor *x = leaf(e, 1, s, dx), *y = NULL, *l = NULL;
  gcap_graph *g = NULL;
  T_REQUIRE(x != NULL);
  T_CHECK_OK(e, gcap_graph_new(e, &g));
  T_CHECK_OK(e, gcap_capture_begin(g, NULL, NULL));
  T_CHECK_OK(e, gcap_gelu(x, &y));
  T_CHECK_OK(e, gcap_sum(y, &l));
  T_CHECK_OK(e, gcap_backward(l, NULL, 1));
  T_CHECK_OK(e, gcap_capture_end(g));
  T_CHECK_OK(e, gcap_graph_replay(g));
  T_REQUIRE(gcap_tensor_grad(x) && t_read(gcap_tensor_grad(x), g1, 8));
  T_CHECK_OK(e, gcap_backward(l, NULL, 0)); /* eager, through the captured-time nodes */
  T_REQUIRE(t_read(gcap_tensor_grad(x), g2, 8));
  for (int i = 0; i < 8; i++)
    T_CHECK(g2[i] == g1[i] + g1[i]);
  gcap_tensor_free(x), gcap_tensor_free(y), gcap_tensor_free(l);
  gcap_graph_free(g);
  gcap_engine_free(e);
}

int main(void) {
  T_RUN(test_diamond);
  T_RUN(test_diamond_deep_join);
  T_RUN(test_deep_chain);
  T_RUN(test_very_deep_chain_small_stack);
  T_RUN(test_leaf_accumulates);
  T_RUN(test_set_grad);
  T_RUN(test_retain_graph);
  T_RUN(test_backward_grad_errors);
  T_RUN(test_one_element_implicit_grad);
  T_RUN(test_requires_grad_leaves_only);
  T_RUN(test_grad_mode_off);
  T_RUN(test_detach);
  T_RUN(test_inplace_on_leaf);
  T_RUN(test_inplace_after_save_is_detected);
  T_RUN(test_clone_and_copy_grads);
  T_RUN(test_captured_backward_first);
  T_RUN(test_captured_backward_accumulates);
  T_RUN(test_captured_backward_retained);
  return t_done();
}
