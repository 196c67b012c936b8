/*
** test_custom_autograd.c: custom autograd nodes (graphcap.h, "Custom
** autograd nodes"): a product recorded with gcap_autograd_record whose
** backward is composed of graphcap calls gives the built-in mul's grads bit
** for bit, eagerly and replayed from a captured backward; the destructor runs
** once in every case; a grad of the wrong shape, a failing callback, a saved
** tensor written in place and bad arguments are errors naming the node. An
** anchor makes a node record without an edge into the tensor it is over.
*/
#include "t.h"

static int t_freed; /* destructor calls */

static void count_free(void *ud) {
  (void)ud;
  t_freed++;
}

/* mode 0: the product's grads from the saved a and b; 1: a grad of the
** wrong shape; 2: a failure without a message */
static gcap_status mul_backward(void *ud, int nsaved, gcap_tensor *const *saved, gcap_tensor *g,
                                int nin, gcap_tensor **gin) {
  int mode = *(const int *)ud;
  gcap_status st = GCAP_OK;
  if (nsaved != 2 || nin != 3) return GCAP_EINVAL;
  if (mode == 2) return GCAP_ESTATE;
  if (mode == 1) return gcap_sum(g, &gin[0]);
  st = gcap_mul(g, saved[1], &gin[0]);
  if (st == GCAP_OK) st = gcap_mul(g, saved[0], &gin[1]);
  return st; /* gin[2]: the NULL input gets none */
}

/* *y = a * b as a custom node "cmul" (third input: not a tensor) */
static gcap_status cmul(gcap_tensor *a, gcap_tensor *b, const int *mode, gcap_tensor **y) {
  gcap_engine *e = gcap_tensor_engine(a);
  gcap_tensor *in[3] = {a, b, NULL}, *r = NULL;
  int was = gcap_set_grad_enabled(e, 0);
  gcap_status st = gcap_mul(a, b, &r);
  gcap_set_grad_enabled(e, was);
  if (st != GCAP_OK) return st;
  st = gcap_autograd_record("cmul", r, 3, in, 2, in, mul_backward, (void *)mode, count_free, y);
  gcap_tensor_free(r);
  return st;
}

static const int64_t S[2] = {2, 3};
static const float DA[6] = {0.5f, -1.25f, 3.0f, 0.1f, -2.0f, 7.5f};
static const float DB[6] = {1.5f, 0.3f, -0.7f, 2.25f, 4.0f, -0.125f};

/* a, b: leaves requiring grad */
static int leaves(gcap_engine *e, gcap_tensor **a, gcap_tensor **b) {
  *a = t_from(e, 2, S, DA);
  *b = t_from(e, 2, S, DB);
  return *a && *b && gcap_tensor_set_requires_grad(*a, 1) == GCAP_OK &&
         gcap_tensor_set_requires_grad(*b, 1) == GCAP_OK;
}

/* sum(op(a, b) * a) backward; the grads of a and b into ga, gb */
static gcap_status run(gcap_tensor *a, gcap_tensor *b, int custom, float *ga, float *gb) {
  static const int mode = 0;
  gcap_tensor *y = NULL, *z = NULL, *l = NULL;
  gcap_status st = custom ? cmul(a, b, &mode, &y) : gcap_mul(a, b, &y);
  if (st == GCAP_OK) st = gcap_mul(y, a, &z);
  if (st == GCAP_OK) st = gcap_sum(z, &l);
  if (st == GCAP_OK) st = gcap_backward(l, NULL, 0);
  gcap_tensor_free(y), gcap_tensor_free(z), gcap_tensor_free(l);
  if (st == GCAP_OK && ga && !t_read(gcap_tensor_grad(a), ga, 6)) st = GCAP_EINVAL;
  if (st == GCAP_OK && gb && !t_read(gcap_tensor_grad(b), gb, 6)) st = GCAP_EINVAL;
  return st;
}

static void test_equals_builtin_mul(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  gcap_tensor *a = NULL, *b = NULL, *a2 = NULL, *b2 = NULL, *y = NULL;
  float ga[6], gb[6], wa[6], wb[6];
  static const int mode = 0;
  t_freed = 0;
  if (!leaves(e, &a, &b) || !leaves(e, &a2, &b2)) goto done;
  T_CHECK_OK(e, cmul(a, b, &mode, &y));
  T_CHECK(strcmp(gcap_tensor_grad_fn_name(y), "cmul") == 0);
  gcap_tensor_free(y);
  y = NULL;
  T_CHECK(t_freed == 1); /* the node went with its output */
  T_CHECK_OK(e, run(a, b, 1, ga, gb));
  T_CHECK_OK(e, run(a2, b2, 0, wa, wb));
  T_CHECK(memcmp(ga, wa, sizeof ga) == 0);
  T_CHECK(memcmp(gb, wb, sizeof gb) == 0);
  T_CHECK(t_freed == 2);
  /* nothing requires grad (grad off): a plain tensor, ud freed at once */
  int was = gcap_set_grad_enabled(e, 0);
  T_CHECK_OK(e, cmul(a, b, &mode, &y));
  gcap_set_grad_enabled(e, was);
  T_CHECK(t_freed == 3 && gcap_tensor_grad_fn_name(y) == NULL);
done:
  gcap_tensor_free(y);
  gcap_tensor_free(a), gcap_tensor_free(b), gcap_tensor_free(a2), gcap_tensor_free(b2);
  gcap_engine_free(e);
}

static void test_captured_backward(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  gcap_tensor *a = NULL, *b = NULL, *a2 = NULL, *b2 = NULL;
  gcap_graph *g = NULL;
  float ga[6], gb[6], wa[6], wb[6];
  if (!leaves(e, &a, &b) || !leaves(e, &a2, &b2)) goto done;
  T_CHECK_OK(e, run(a, b, 1, NULL, NULL)); /* .grad allocated before the capture */
  T_CHECK_OK(e, run(a2, b2, 0, wa, wb));
  T_CHECK_OK(e, gcap_graph_new(e, &g));
  T_CHECK_OK(e, gcap_capture_begin(g, NULL, NULL));
  T_CHECK_OK(e, run(a, b, 1, NULL, NULL));
  T_CHECK_OK(e, gcap_capture_end(g));
  T_CHECK_OK(e, gcap_zero_(gcap_tensor_grad(a)));
  T_CHECK_OK(e, gcap_zero_(gcap_tensor_grad(b)));
  T_CHECK_OK(e, gcap_graph_replay(g)); /* one backward, into the zeroed .grad */
  if (t_read(gcap_tensor_grad(a), ga, 6) && t_read(gcap_tensor_grad(b), gb, 6))
    T_CHECK(memcmp(ga, wa, sizeof ga) == 0 && memcmp(gb, wb, sizeof gb) == 0);
done:
  gcap_graph_free(g);
  gcap_tensor_free(a), gcap_tensor_free(b), gcap_tensor_free(a2), gcap_tensor_free(b2);
  gcap_engine_free(e);
}

/* A backward that fails: an error naming the node, no .grad made */
static void check_fails(gcap_engine *e, int mode, gcap_status want, const char *what) {
  gcap_tensor *a = NULL, *b = NULL, *y = NULL, *l = NULL;
  if (!leaves(e, &a, &b)) goto done;
  T_CHECK_OK(e, cmul(a, b, &mode, &y));
  T_CHECK_OK(e, gcap_sum(y, &l));
  T_CHECK_ST(e, gcap_backward(l, NULL, 0), want);
  T_CHECK(t_msg_has(e, "cmul") && t_msg_has(e, what));
  T_CHECK(gcap_tensor_grad(a) == NULL && gcap_tensor_grad(b) == NULL);
done:
  gcap_tensor_free(a), gcap_tensor_free(b), gcap_tensor_free(y), gcap_tensor_free(l);
}

static void test_errors(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  gcap_tensor *a = NULL, *b = NULL, *y = NULL, *l = NULL, *many[7], *out = (gcap_tensor *)&out;
  static const int mode = 0;
  t_freed = 0;
  check_fails(e, 1, GCAP_EINVAL, "grad of input #1 is [] f32; the input is [2, 3] f32");
  check_fails(e, 2, GCAP_ESTATE, "failed");
  T_CHECK(t_freed == 2);
  if (!leaves(e, &a, &b)) goto done;
  /* a saved tensor written in place before backward */
  T_CHECK_OK(e, cmul(a, b, &mode, &y));
  T_CHECK_OK(e, gcap_sum(y, &l));
  int was = gcap_set_grad_enabled(e, 0);
  T_CHECK_OK(e, gcap_fill_(b, 1.0));
  gcap_set_grad_enabled(e, was);
  T_CHECK_ST(e, gcap_backward(l, NULL, 0), GCAP_ESTATE);
  T_CHECK(t_msg_has(e, "modified by an inplace operation") && t_msg_has(e, "cmul"));
  /* bad arguments: EINVAL, *out NULL, the ud freed */
  t_freed = 0;
  T_CHECK_ST(
      e, gcap_autograd_record("x", NULL, 0, NULL, 0, NULL, mul_backward, NULL, count_free, &out),
      GCAP_EINVAL);
  T_CHECK(out == NULL);
  T_CHECK_ST(e, gcap_autograd_record("x", a, 1, &a, 0, NULL, NULL, NULL, count_free, &out),
             GCAP_EINVAL);
  for (int i = 0; i < 7; i++)
    many[i] = a;
  T_CHECK_ST(e, gcap_autograd_record("x", a, 1, &a, 7, many, mul_backward, NULL, count_free, &out),
             GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "at most 6") && out == NULL);
  T_CHECK(t_freed == 3);
done:
  gcap_tensor_free(a), gcap_tensor_free(b), gcap_tensor_free(y), gcap_tensor_free(l);
  gcap_engine_free(e);
}

static gcap_status never_backward(void *ud, int nsaved, gcap_tensor *const *saved, gcap_tensor *g,
                                  int nin, gcap_tensor **gin) {
  (void)ud, (void)nsaved, (void)saved, (void)g, (void)nin, (void)gin;
  return GCAP_ESTATE;
}

/* regression: a name too long for grad_fn was cut short */
/* A custom node's name that does not fit its grad_fn (64 bytes) is refused;
** it was cut to 63 bytes. */
static void test_custom_node_name_fits(void) {
  const int64_t s[1] = {2};
  const float d[2] = {1, 2};
  char name[65];
  gcap_engine *e = t_engine();
  gcap_tensor *x = NULL, *y = NULL;
  T_SETUP(e != NULL && (x = t_from(e, 1, s, d)) != NULL &&
              gcap_tensor_set_requires_grad(x, 1) == GCAP_OK,
          goto out);
  memset(name, 'n', 64);
  name[64] = '\0';
  T_CHECK_ST(e, gcap_autograd_record(name, x, 1, &x, 0, NULL, never_backward, NULL, NULL, &y),
             GCAP_EINVAL);
  T_CHECK(y == NULL && t_msg_has(e, "name must be 1 to 63 bytes, got 64"));
  name[63] = '\0';
  T_CHECK_OK(e, gcap_autograd_record(name, x, 1, &x, 0, NULL, never_backward, NULL, NULL, &y));
  T_CHECK(strcmp(gcap_tensor_grad_fn_name(y), name) == 0);
out:
  gcap_tensor_free(y);
  gcap_tensor_free(x);
  gcap_engine_free(e);
}

/* The probe's backward: passes g on to input 0 when it needs one, notes
** whether the weight (ud) had its .grad by then. */
static int t_probe_saw_grad;
static gcap_status probe_backward(void *ud, int nsaved, gcap_tensor *const *saved, gcap_tensor *g,
                                  int nin, gcap_tensor **gin) {
  (void)nsaved, (void)saved, (void)nin;
  t_probe_saw_grad = gcap_tensor_grad((gcap_tensor *)ud) != NULL;
  gin[0] = gcap_tensor_retain(g);
  return GCAP_OK;
}

/* sum(probe(x, anchor) * w), x needing no grad: through an anchor of w the
** probe records, and runs after w's .grad is made (its one edge, the mul,
** has run); with w itself as the probe's input, w's .grad waits for the
** probe. Either way w's grad is x, and the anchor gets none. */
static void test_anchor(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  for (int anchored = 1; anchored >= 0; anchored--) {
    gcap_tensor *x = t_from(e, 2, S, DA), *w = t_from(e, 2, S, DB), *an = NULL, *p = NULL;
    gcap_tensor *z = NULL, *l = NULL;
    float g[6];
    T_REQUIRE(x && w);
    T_CHECK_OK(e, gcap_tensor_set_requires_grad(w, 1));
    if (anchored) {
      T_CHECK_OK(e, gcap_autograd_anchor(w, &an));
      T_CHECK(gcap_tensor_requires_grad(an) && !gcap_tensor_is_leaf(an) &&
              strcmp(gcap_tensor_grad_fn_name(an), "anchor") == 0);
      T_CHECK(gcap_tensor_data_ptr(an) == gcap_tensor_data_ptr(w));
    }
    gcap_tensor *in[2] = {x, anchored ? an : w};
    T_CHECK_OK(e, gcap_autograd_record("probe", x, 2, in, 0, NULL, probe_backward, w, NULL, &p));
    T_CHECK(strcmp(gcap_tensor_grad_fn_name(p), "probe") == 0);
    T_CHECK_OK(e, gcap_mul(p, w, &z));
    T_CHECK_OK(e, gcap_sum(z, &l));
    t_probe_saw_grad = -1;
    T_CHECK_OK(e, gcap_backward(l, NULL, 0));
    T_CHECK(t_probe_saw_grad == anchored);
    T_REQUIRE(gcap_tensor_grad(w) != NULL);
    if (t_read(gcap_tensor_grad(w), g, 6))
      for (int i = 0; i < 6; i++)
        T_CHECK(g[i] == DA[i]);
    T_CHECK(an == NULL || gcap_tensor_grad(an) == NULL);
    gcap_tensor_free(x), gcap_tensor_free(w), gcap_tensor_free(an), gcap_tensor_free(p);
    gcap_tensor_free(z), gcap_tensor_free(l);
  }
  /* with grad disabled: a plain tensor, which makes nothing record */
  gcap_tensor *w = t_from(e, 2, S, DB), *an = NULL;
  T_REQUIRE(w != NULL);
  T_CHECK_OK(e, gcap_tensor_set_requires_grad(w, 1));
  int was = gcap_set_grad_enabled(e, 0);
  T_CHECK_OK(e, gcap_autograd_anchor(w, &an));
  gcap_set_grad_enabled(e, was);
  T_CHECK(!gcap_tensor_requires_grad(an) && gcap_tensor_is_leaf(an));
  gcap_tensor *none = w;
  T_CHECK(gcap_autograd_anchor(NULL, &none) == GCAP_EINVAL && none == NULL);
  gcap_tensor_free(w), gcap_tensor_free(an);
  gcap_engine_free(e);
}

int main(void) {
  T_RUN(test_equals_builtin_mul);
  T_RUN(test_captured_backward);
  T_RUN(test_errors);
  T_RUN(test_custom_node_name_fits);
  T_RUN(test_anchor);
  return t_done();
}
