/*
** test_grad.c: the analytic gradient of every differentiable op (graphcap.h
** "Autograd") against central finite differences. For each case the loss is L =
** sum(op(inputs) * r) for a fixed random r of op's output shape; gcap_backward
** gives dL/dx, and dL/dx[j] is also estimated on the host as (L(x + h e_j) -
** L(x - h e_j)) / 2h, one element at a time, with L summed in double from the
** op's output read back. Dropout runs from a fixed seed (re-seeded before every
** evaluation, so the mask is fixed) and its grad is also checked against the
** mask implied by its output.
**
** Finite differences are the host backend's job (the cuda backend is held to
** the host's results by test_parity); under GRAPHCAP_DEVICE=cuda this suite
** reports itself skipped.
*/
#include <stdint.h>

#include "t.h"
#include "t_data.h"

/* f32 finite differences: step and tolerance |d| <= ATOL + RTOL * |ref|. */
#define H 1e-2
#define ATOL 5e-4
#define RTOL 5e-3

/* A small deterministic generator: uniform in [-1, 1). */
static uint32_t rng_state = 12345u;
static float urand(void) {
  return t_urand(&rng_state);
}

typedef enum {
  FILL_NORMAL, /* uniform in [-1.5, 1.5) */
  FILL_AWAY,   /* |x| in [0.2, 1.5]: away from relu's kink and from 0 */
  FILL_WIDE,   /* uniform in [-3, 3) */
  FILL_POS,    /* uniform in [0.5, 2): pow's bases */
  FILL_CLASS   /* class indices 0 .. classes - 1, as floats */
} fill_kind;

typedef struct gin {
  int ndim;
  int64_t shape[GCAP_MAXDIM];
  fill_kind fill;
  int classes;
  int grad; /* requires grad; its gradient is checked */
} gin;

#define MAXIN 6

typedef struct gcase {
  const char *name;
  op_fn f;
  const char *grad_fn; /* expected gcap_tensor_grad_fn_name of f's output, or NULL */
  uint64_t seed;       /* re-seed before each evaluation when non-zero */
  int nin;
  gin in[MAXIN];
} gcase;

static int64_t numel_of(const gin *g) {
  return t_numel(g->ndim, g->shape);
}

static void fill(const gin *g, float *d, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    float u = urand();
    switch (g->fill) {
      case FILL_NORMAL:
        d[i] = 1.5f * u;
        break;
      case FILL_WIDE:
        d[i] = 3.0f * u;
        break;
      case FILL_AWAY:
        d[i] = (u < 0 ? -1.0f : 1.0f) * (0.2f + 1.3f * fabsf(u));
        break;
      case FILL_POS:
        d[i] = 1.25f + 0.75f * u;
        break;
      case FILL_CLASS:
        d[i] = (float)(i * 7 % g->classes);
        break;
    }
  }
}

/* L = sum(f(x) * r) in double on the host; NaN on error. */
static double eval_loss(gcap_engine *e, const gcase *c, gcap_tensor *const *x, const float *r,
                        int64_t nr) {
  gcap_tensor *y = NULL;
  double L = 0.0;
  if (c->seed && gcap_manual_seed(e, c->seed) != GCAP_OK) return NAN;
  if (c->f(x, &y) != GCAP_OK || y == NULL || gcap_tensor_numel(y) != nr) {
    gcap_tensor_free(y);
    return NAN;
  }
  float *v = malloc((size_t)(nr > 0 ? nr : 1) * sizeof *v);
  if (v == NULL || gcap_tensor_read(y, v, (size_t)nr) != GCAP_OK)
    L = NAN;
  else
    for (int64_t i = 0; i < nr; i++)
      L += (double)v[i] * (double)r[i];
  free(v);
  gcap_tensor_free(y);
  return L;
}

/* Runs case c: analytic grads from gcap_backward vs central differences. */
static void grad_check(const gcase *c) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  float *data[MAXIN] = {0}, *r = NULL, *ga = NULL;
  gcap_tensor *x[MAXIN] = {0}, *y = NULL, *rt = NULL, *prod = NULL, *loss = NULL;
  int64_t nr = 0;
  int bad = 0;

  for (int i = 0; i < c->nin; i++) {
    int64_t n = numel_of(&c->in[i]);
    data[i] = malloc((size_t)n * sizeof(float));
    if (data[i] == NULL) goto done;
    fill(&c->in[i], data[i], n);
    x[i] = t_from(e, c->in[i].ndim, c->in[i].shape, data[i]);
    if (x[i] == NULL) goto done;
    if (c->in[i].grad && gcap_tensor_set_requires_grad(x[i], 1) != GCAP_OK) {
      T_FAILF("set_requires_grad", "%s: %s", c->name, gcap_errmsg(e));
      goto done;
    }
  }
  if (c->seed && gcap_manual_seed(e, c->seed) != GCAP_OK) goto done;
  if (c->f(x, &y) != GCAP_OK) {
    T_FAILF("forward", "%s: %s", c->name, gcap_errmsg(e));
    goto done;
  }
  if (!gcap_tensor_requires_grad(y))
    T_FAILF("requires_grad", "%s: output does not require grad", c->name);
  if (c->grad_fn) {
    const char *fn = gcap_tensor_grad_fn_name(y);
    if (fn == NULL || strcmp(fn, c->grad_fn) != 0)
      T_FAILF("grad_fn", "%s: grad_fn '%s', want '%s'", c->name, fn ? fn : "(null)", c->grad_fn);
  }
  nr = gcap_tensor_numel(y);
  r = malloc((size_t)(nr > 0 ? nr : 1) * sizeof *r);
  if (r == NULL) goto done;
  for (int64_t i = 0; i < nr; i++)
    r[i] = urand();
  rt = t_from(e, gcap_tensor_ndim(y), gcap_tensor_shape(y), r);
  if (rt == NULL) goto done;
  if (gcap_mul(y, rt, &prod) != GCAP_OK || gcap_sum(prod, &loss) != GCAP_OK ||
      gcap_backward(loss, NULL, 0) != GCAP_OK) {
    T_FAILF("backward", "%s: %s", c->name, gcap_errmsg(e));
    goto done;
  }
  gcap_tensor_free(y), gcap_tensor_free(prod), gcap_tensor_free(loss);
  y = prod = loss = NULL;

  int was = gcap_set_grad_enabled(e, 0); /* the finite differences record nothing */
  for (int i = 0; i < c->nin; i++) {
    gcap_tensor *g = gcap_tensor_grad(x[i]);
    int64_t n = numel_of(&c->in[i]);
    if (!c->in[i].grad) {
      if (g != NULL)
        T_FAILF("grad == NULL", "%s: input %d has a grad but does not require one", c->name, i);
      continue;
    }
    if (g == NULL) {
      T_FAILF("grad != NULL", "%s: input %d got no grad", c->name, i);
      continue;
    }
    int same = gcap_tensor_ndim(g) == c->in[i].ndim && gcap_tensor_dtype(g) == GCAP_F32;
    for (int d = 0; same && d < c->in[i].ndim; d++)
      same = gcap_tensor_shape(g)[d] == c->in[i].shape[d];
    if (!same) {
      T_FAILF("grad shape", "%s: input %d: grad has another shape or dtype", c->name, i);
      continue;
    }
    free(ga);
    ga = malloc((size_t)n * sizeof *ga);
    if (ga == NULL || !t_read(g, ga, (size_t)n)) continue;
    gcap_tensor *orig = x[i];
    for (int64_t j = 0; j < n; j++) {
      float v = data[i][j], vp = (float)((double)v + H), vm = (float)((double)v - H);
      double lp, lm;
      data[i][j] = vp;
      x[i] = t_from(e, c->in[i].ndim, c->in[i].shape, data[i]);
      lp = x[i] ? eval_loss(e, c, x, r, nr) : (double)NAN;
      gcap_tensor_free(x[i]);
      data[i][j] = vm;
      x[i] = t_from(e, c->in[i].ndim, c->in[i].shape, data[i]);
      lm = x[i] ? eval_loss(e, c, x, r, nr) : (double)NAN;
      gcap_tensor_free(x[i]);
      data[i][j] = v;
      x[i] = orig;
      double num = (lp - lm) / ((double)vp - (double)vm), an = (double)ga[j];
      if (!(fabs(an - num) <= ATOL + RTOL * fabs(num))) {
        if (++bad <= 4)
          T_FAILF("|analytic - numeric| <= atol + rtol*|numeric|",
                  "%s: input %d element %lld: analytic %.7g, numeric %.7g", c->name, i,
                  (long long)j, an, num);
      }
    }
  }
  if (bad > 4) printf("#   %s: %d mismatches in all\n", c->name, bad);
  gcap_set_grad_enabled(e, was);
done:
  for (int i = 0; i < c->nin; i++) {
    gcap_tensor_free(x[i]);
    free(data[i]);
  }
  free(r), free(ga);
  gcap_tensor_free(y), gcap_tensor_free(rt), gcap_tensor_free(prod), gcap_tensor_free(loss);
  gcap_engine_free(e);
}

/* ------------------------------------------------------------------------ */
/* The ops under test (the ones test_parity.c runs too are in t_data.h)      */

static gcap_status f_select(gcap_tensor *const *x, gcap_tensor **y) {
  return gcap_select(x[0], 1, y);
}
static gcap_status f_select_last(gcap_tensor *const *x, gcap_tensor **y) {
  return gcap_select(x[0], -1, y);
}
static gcap_status f_mul_self(gcap_tensor *const *x, gcap_tensor **y) {
  return gcap_mul(x[0], x[0], y);
}
static gcap_status f_scale(gcap_tensor *const *x, gcap_tensor **y) {
  return gcap_scale(x[0], -0.7, y);
}
static gcap_status f_ln_w(gcap_tensor *const *x, gcap_tensor **y) {
  return gcap_layer_norm(x[0], x[1], NULL, 1e-5, y);
}
static gcap_status f_ln_b(gcap_tensor *const *x, gcap_tensor **y) {
  return gcap_layer_norm(x[0], NULL, x[1], 1e-5, y);
}
static gcap_status f_softmax_dim(gcap_tensor *const *x, gcap_tensor **y) {
  return gcap_softmax(x[0], gcap_tensor_ndim(x[0]) - 1, y);
}
static gcap_status f_dropout(gcap_tensor *const *x, gcap_tensor **y) {
  return gcap_dropout(x[0], 0.3, 1, y);
}
static gcap_status f_dropout_eval(gcap_tensor *const *x, gcap_tensor **y) {
  return gcap_dropout(x[0], 0.3, 0, y);
}
static gcap_status f_view(gcap_tensor *const *x, gcap_tensor **y) {
  const int64_t s[2] = {3, 4};
  return gcap_tensor_view(x[0], 2, s, y);
}
/* A view of a non-leaf, then an op on the view. */
static gcap_status f_view_chain(gcap_tensor *const *x, gcap_tensor **y) {
  const int64_t s[1] = {12};
  gcap_tensor *a = NULL, *v = NULL;
  gcap_status st;
  if ((st = gcap_scale(x[0], 2.0, &a)) == GCAP_OK &&
      (st = gcap_tensor_view(a, 1, s, &v)) == GCAP_OK)
    st = gcap_mul(v, v, y);
  gcap_tensor_free(a), gcap_tensor_free(v);
  return st;
}
/* mse(linear(gelu(linear(x, w1, b1)), w2, b2), t): ops chained, grads summed. */
static gcap_status f_mlp(gcap_tensor *const *x, gcap_tensor **y) {
  gcap_tensor *h = NULL, *a = NULL, *o = NULL;
  gcap_status st;
  if ((st = gcap_linear(x[0], x[1], x[2], &h)) == GCAP_OK && (st = gcap_gelu(h, &a)) == GCAP_OK &&
      (st = gcap_linear(a, x[3], x[4], &o)) == GCAP_OK)
    st = gcap_mse_loss(o, x[5], y);
  gcap_tensor_free(h), gcap_tensor_free(a), gcap_tensor_free(o);
  return st;
}
/* softmax -> layer_norm -> relu-free chain through every row op at once. */
static gcap_status f_rows(gcap_tensor *const *x, gcap_tensor **y) {
  gcap_tensor *s = NULL, *l = NULL;
  gcap_status st;
  if ((st = gcap_softmax(x[0], -1, &s)) == GCAP_OK &&
      (st = gcap_layer_norm(s, x[1], x[2], 1e-5, &l)) == GCAP_OK)
    st = gcap_cross_entropy(l, x[3], y);
  gcap_tensor_free(s), gcap_tensor_free(l);
  return st;
}

/* Inputs: G(ndim, d0, d1, d2, fill, grad). */
#define G1(a, f, g)                                                                                \
  { 1, {a}, f, 0, g }
#define G2(a, b, f, g)                                                                             \
  { 2, {a, b}, f, 0, g }
#define G3(a, b, c, f, g)                                                                          \
  { 3, {a, b, c}, f, 0, g }
#define G0(f, g)                                                                                   \
  { 0, {0}, f, 0, g }
#define G4(a, b, c, d, f, g)                                                                       \
  { 4, {a, b, c, d}, f, 0, g }
#define GC2(a, b, classes)                                                                         \
  { 2, {a, b}, FILL_CLASS, classes, 0 }
#define GC(n, classes)                                                                             \
  { 1, {n}, FILL_CLASS, classes, 0 }
#define N FILL_NORMAL

static const gcase cases_elementwise[] = {
    {"add [3,4] + [3,4]", f_add, "add", 0, 2, {G2(3, 4, N, 1), G2(3, 4, N, 1)}},
    {"add [3,4] + 0-D", f_add, "add", 0, 2, {G2(3, 4, N, 1), G0(N, 1)}},
    {"add 0-D + [3,4]", f_add, "add", 0, 2, {G0(N, 1), G2(3, 4, N, 1)}},
    {"add [3,4] + [1]", f_add, "add", 0, 2, {G2(3, 4, N, 1), G1(1, N, 1)}},
    {"add [2,3,4] + row [4]", f_add, "add", 0, 2, {G3(2, 3, 4, N, 1), G1(4, N, 1)}},
    {"add row [4] + [2,3,4]", f_add, "add", 0, 2, {G1(4, N, 1), G3(2, 3, 4, N, 1)}},
    {"add [3,4] + row [1,4]", f_add, "add", 0, 2, {G2(3, 4, N, 1), G2(1, 4, N, 1)}},
    {"add [3,4] + [3,4] (only a)", f_add, "add", 0, 2, {G2(3, 4, N, 1), G2(3, 4, N, 0)}},
    {"sub [3,4] - [3,4]", f_sub, "sub", 0, 2, {G2(3, 4, N, 1), G2(3, 4, N, 1)}},
    {"sub [3,4] - 0-D", f_sub, "sub", 0, 2, {G2(3, 4, N, 1), G0(N, 1)}},
    {"sub 0-D - [3,4]", f_sub, "sub", 0, 2, {G0(N, 1), G2(3, 4, N, 1)}},
    {"sub [2,3,4] - row [4]", f_sub, "sub", 0, 2, {G3(2, 3, 4, N, 1), G1(4, N, 1)}},
    {"sub row [4] - [3,4]", f_sub, "sub", 0, 2, {G1(4, N, 1), G2(3, 4, N, 1)}},
    {"sub [3,4] - [3,4] (only b)", f_sub, "sub", 0, 2, {G2(3, 4, N, 0), G2(3, 4, N, 1)}},
    {"mul [3,4] * [3,4]", f_mul, "mul", 0, 2, {G2(3, 4, N, 1), G2(3, 4, N, 1)}},
    {"mul [3,4] * 0-D", f_mul, "mul", 0, 2, {G2(3, 4, N, 1), G0(N, 1)}},
    {"mul 0-D * [2,3,4]", f_mul, "mul", 0, 2, {G0(N, 1), G3(2, 3, 4, N, 1)}},
    {"mul [3,4] * [1,1]", f_mul, "mul", 0, 2, {G2(3, 4, N, 1), G2(1, 1, N, 1)}},
    {"mul [2,3,4] * row [4]", f_mul, "mul", 0, 2, {G3(2, 3, 4, N, 1), G1(4, N, 1)}},
    {"mul row [4] * [3,4]", f_mul, "mul", 0, 2, {G1(4, N, 1), G2(3, 4, N, 1)}},
    {"mul x * x", f_mul_self, "mul", 0, 1, {G2(3, 4, N, 1)}},
    {"div [3,4] / [3,4]", f_div, "div", 0, 2, {G2(3, 4, N, 1), G2(3, 4, FILL_AWAY, 1)}},
    {"div [3,4] / 0-D", f_div, "div", 0, 2, {G2(3, 4, N, 1), G0(FILL_AWAY, 1)}},
    {"div 0-D / [3,4]", f_div, "div", 0, 2, {G0(N, 1), G2(3, 4, FILL_AWAY, 1)}},
    {"div [2,3,4] / row [4]", f_div, "div", 0, 2, {G3(2, 3, 4, N, 1), G1(4, FILL_AWAY, 1)}},
    {"div [3,4] / [3,4] (only a)", f_div, "div", 0, 2, {G2(3, 4, N, 1), G2(3, 4, FILL_AWAY, 0)}},
    {"pow [3,4] ^ [3,4]", f_pow, "pow", 0, 2, {G2(3, 4, FILL_POS, 1), G2(3, 4, N, 1)}},
    {"pow [3,4] ^ 0-D", f_pow, "pow", 0, 2, {G2(3, 4, FILL_POS, 1), G0(N, 1)}},
    {"pow 0-D ^ [3,4]", f_pow, "pow", 0, 2, {G0(FILL_POS, 1), G2(3, 4, N, 1)}},
    {"pow row [4] ^ [3,4] (only b)", f_pow, "pow", 0, 2, {G1(4, FILL_POS, 0), G2(3, 4, N, 1)}},
    {"select [3,4] entry 2", f_select, "select", 0, 1, {G2(3, 4, N, 1)}},
    {"select [2,3,4] entry -1", f_select_last, "select", 0, 1, {G3(2, 3, 4, N, 1)}},
    {"scale [3,4] by -0.7", f_scale, "scale", 0, 1, {G2(3, 4, N, 1)}},
    {"neg [2,3,4]", f_neg, "neg", 0, 1, {G3(2, 3, 4, N, 1)}},
    {"sum [3,4]", f_sum, "sum", 0, 1, {G2(3, 4, N, 1)}},
    {"sum 0-D", f_sum, "sum", 0, 1, {G0(N, 1)}},
    {"mean [2,3,4]", f_mean, "mean", 0, 1, {G3(2, 3, 4, N, 1)}},
    {"mean [5]", f_mean, "mean", 0, 1, {G1(5, N, 1)}},
    {"view [2,6] as [3,4]", f_view, "view", 0, 1, {G2(2, 6, N, 1)}},
    {"view of a non-leaf", f_view_chain, "mul", 0, 1, {G2(3, 4, N, 1)}},
};

static const gcase cases_linalg[] = {
    {"matmul [3,5] x [5,2]", f_matmul, "matmul", 0, 2, {G2(3, 5, N, 1), G2(5, 2, N, 1)}},
    {"matmul [1,4] x [4,1]", f_matmul, "matmul", 0, 2, {G2(1, 4, N, 1), G2(4, 1, N, 1)}},
    {"matmul [4,3] x [3,6] (only b)", f_matmul, "matmul", 0, 2, {G2(4, 3, N, 0), G2(3, 6, N, 1)}},
    {"linear 2-D with bias",
     f_linear,
     "linear",
     0,
     3,
     {G2(4, 3, N, 1), G2(5, 3, N, 1), G1(5, N, 1)}},
    {"linear 2-D without bias", f_linear_nb, "linear", 0, 2, {G2(4, 3, N, 1), G2(5, 3, N, 1)}},
    {"linear 3-D with bias",
     f_linear,
     "linear",
     0,
     3,
     {G3(2, 3, 4, N, 1), G2(5, 4, N, 1), G1(5, N, 1)}},
    {"linear 3-D without bias", f_linear_nb, "linear", 0, 2, {G3(2, 3, 4, N, 1), G2(5, 4, N, 1)}},
    {"linear 1-D input", f_linear, "linear", 0, 3, {G1(3, N, 1), G2(2, 3, N, 1), G1(2, N, 1)}},
    {"linear (weight only)",
     f_linear,
     "linear",
     0,
     3,
     {G2(4, 3, N, 0), G2(5, 3, N, 1), G1(5, N, 0)}},
    {"linear_gelu 2-D with bias",
     f_linear_gelu,
     "linear_gelu",
     0,
     3,
     {G2(4, 3, N, 1), G2(5, 3, N, 1), G1(5, N, 1)}},
    {"linear_gelu 3-D without bias",
     f_linear_gelu_nb,
     "linear_gelu",
     0,
     2,
     {G3(2, 3, 4, N, 1), G2(5, 4, N, 1)}},
    {"linear_gelu (weight only)",
     f_linear_gelu,
     "linear_gelu",
     0,
     3,
     {G2(4, 3, N, 0), G2(5, 3, N, 1), G1(5, N, 0)}},
    {"linear (input only)",
     f_linear,
     "linear",
     0,
     3,
     {G2(4, 3, N, 1), G2(5, 3, N, 0), G1(5, N, 0)}},
};

static const gcase cases_layers[] = {
    {"relu [3,5]", f_relu, "relu", 0, 1, {G2(3, 5, FILL_AWAY, 1)}},
    {"gelu [3,5]", f_gelu, "gelu", 0, 1, {G2(3, 5, FILL_WIDE, 1)}},
    {"gelu [2,2,4]", f_gelu, "gelu", 0, 1, {G3(2, 2, 4, N, 1)}},
    {"layer_norm [3,6] weight, bias",
     f_ln_wb,
     "layer_norm",
     0,
     3,
     {G2(3, 6, N, 1), G1(6, N, 1), G1(6, N, 1)}},
    {"layer_norm [3,6] no weight, bias", f_ln, "layer_norm", 0, 1, {G2(3, 6, N, 1)}},
    {"layer_norm [2,2,5] weight only",
     f_ln_w,
     "layer_norm",
     0,
     2,
     {G3(2, 2, 5, N, 1), G1(5, N, 1)}},
    {"layer_norm [4,5] bias only", f_ln_b, "layer_norm", 0, 2, {G2(4, 5, N, 1), G1(5, N, 1)}},
    {"layer_norm [3,6] params only",
     f_ln_wb,
     "layer_norm",
     0,
     3,
     {G2(3, 6, N, 0), G1(6, N, 1), G1(6, N, 1)}},
    {"softmax [3,5]", f_softmax, "softmax", 0, 1, {G2(3, 5, FILL_WIDE, 1)}},
    {"softmax [2,2,4] dim 2", f_softmax_dim, "softmax", 0, 1, {G3(2, 2, 4, N, 1)}},
    {"softmax [7]", f_softmax, "softmax", 0, 1, {G1(7, FILL_WIDE, 1)}},
    {"dropout p=0.3 training (seeded)", f_dropout, "dropout", 99, 1, {G2(4, 16, FILL_AWAY, 1)}},
    {"dropout eval", f_dropout_eval, NULL, 0, 1, {G2(3, 4, N, 1)}},
    {"mse_loss [3,4]", f_mse, "mean", 0, 2, {G2(3, 4, N, 1), G2(3, 4, N, 1)}},
    {"mse_loss [2,3,2] (input only)", f_mse, "mean", 0, 2, {G3(2, 3, 2, N, 1), G3(2, 3, 2, N, 0)}},
    {"cross_entropy [4,5]", f_xent, "cross_entropy", 0, 2, {G2(4, 5, FILL_WIDE, 1), GC(4, 5)}},
    {"cross_entropy [1,3]", f_xent, "cross_entropy", 0, 2, {G2(1, 3, N, 1), GC(1, 3)}},
    {"mlp: mse(linear(gelu(linear)))",
     f_mlp,
     "mean",
     0,
     6,
     {G2(4, 3, N, 1), G2(5, 3, N, 1), G1(5, N, 1), G2(2, 5, N, 1), G1(2, N, 1), G2(4, 2, N, 0)}},
    {"rows: cross_entropy(layer_norm(softmax))",
     f_rows,
     "cross_entropy",
     0,
     4,
     {G2(3, 4, FILL_WIDE, 1), G1(4, N, 1), G1(4, N, 1), GC(3, 4)}},
};

/* The ops of attention; masks and ids are class fills (0/1 for masks). */
static const gcase cases_attention[] = {
    {"permute [2,3,4,2] (2,0,3,1)", f_permute, "permute", 0, 1, {G4(2, 3, 4, 2, N, 1)}},
    {"transpose [2,3,4] (-1,-2)", f_transpose, "permute", 0, 1, {G3(2, 3, 4, N, 1)}},
    {"split [2,7,3] then cat", f_split_cat, "cat", 0, 1, {G3(2, 7, 3, N, 1)}},
    {"matmul [2,3,4,5] x [5,2]", f_matmul, "matmul", 0, 2, {G4(2, 3, 4, 5, N, 1), G2(5, 2, N, 1)}},
    {"matmul [2,1,3,4] x [1,2,4,3]",
     f_matmul,
     "matmul",
     0,
     2,
     {G4(2, 1, 3, 4, N, 1), G4(1, 2, 4, 3, N, 1)}},
    {"matmul [3,4] x [2,4,3] (only b)",
     f_matmul,
     "matmul",
     0,
     2,
     {G2(3, 4, N, 0), G3(2, 4, 3, N, 1)}},
    {"softmax scaled, additive mask [2,1,3,5]",
     f_softmax_add,
     "softmax",
     0,
     2,
     {G4(2, 2, 3, 5, FILL_WIDE, 1), G4(2, 1, 3, 5, N, 0)}},
    {"softmax causal, boolean mask [4,4]",
     f_softmax_bool_causal,
     "softmax",
     0,
     2,
     {G4(2, 2, 4, 4, FILL_WIDE, 1), GC2(4, 4, 2)}},
    {"softmax causal [3,6,6]", f_softmax_causal, "softmax", 0, 1, {G3(3, 6, 6, FILL_WIDE, 1)}},
    {"masked_fill [2,3,4], mask [3,1]",
     f_masked_fill,
     "masked_fill",
     0,
     2,
     {G3(2, 3, 4, N, 1), GC2(3, 1, 2)}},
    {"embedding [2,3] ids into [5,4]",
     f_embedding,
     "embedding",
     0,
     2,
     {GC2(2, 3, 5), G2(5, 4, N, 1)}},
    {"sdpa [2,2,3,4]",
     f_sdpa,
     "matmul",
     0,
     3,
     {G4(2, 2, 3, 4, N, 1), G4(2, 2, 3, 4, N, 1), G4(2, 2, 3, 4, N, 1)}},
    {"sdpa causal, dropout (seeded)",
     f_sdpa_causal_dropout,
     "matmul",
     7,
     3,
     {G4(2, 2, 4, 4, N, 1), G4(2, 2, 4, 4, N, 1), G4(2, 2, 4, 4, N, 1)}},
    {"sdpa boolean mask, Sq 3 Sk 5",
     f_sdpa_mask,
     "matmul",
     0,
     4,
     {G4(2, 2, 3, 4, N, 1), G4(2, 2, 5, 4, N, 1), G4(2, 2, 5, 3, N, 1), GC2(3, 5, 2)}},
    {"sdpa fused, causal, mask, dropout (seeded)",
     f_sdpa_fused,
     "scaled_dot_product_attention",
     7,
     4,
     {G4(2, 2, 4, 4, N, 1), G4(2, 2, 4, 4, N, 1), G4(2, 2, 4, 3, N, 1), GC2(4, 4, 2)}},
};

#define NCASES(a) ((int)(sizeof(a) / sizeof(a)[0]))

/* One TAP line per case, named after it. */
static const gcase *cur_case;
static void run_cur_case(void) {
  grad_check(cur_case);
}
static void run_cases(const char *group, const gcase *cs, int n) {
  char name[160];
  for (int i = 0; i < n; i++) {
    cur_case = &cs[i];
    snprintf(name, sizeof name, "%s: %s", group, cs[i].name);
    t_run_(name, run_cur_case);
  }
}

/* Dropout: the output is x * mask with mask in {0, 1/(1-p)}; its grad is
** r * mask, the mask read off the output. */
static void test_dropout_mask_grad(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  enum { NX = 256 };
  static float dx[NX], dr[NX], dy[NX], dg[NX];
  const int64_t s[2] = {8, 32};
  const double p = 0.3;
  const float scale = 1.0f / (1.0f - (float)p);
  for (int i = 0; i < NX; i++)
    dx[i] = (i % 2 ? 1.0f : -1.0f) * (0.25f + (float)(i % 13) * 0.1f);
  for (int i = 0; i < NX; i++)
    dr[i] = urand();
  gcap_tensor *x = t_from(e, 2, s, dx), *r = t_from(e, 2, s, dr), *y = NULL, *yr = NULL, *l = NULL;
  T_REQUIRE(x && r);
  T_CHECK_OK(e, gcap_tensor_set_requires_grad(x, 1));
  T_CHECK_OK(e, gcap_manual_seed(e, 2024));
  T_CHECK_OK(e, gcap_dropout(x, p, 1, &y));
  T_CHECK_OK(e, gcap_mul(y, r, &yr));
  T_CHECK_OK(e, gcap_sum(yr, &l));
  T_CHECK_OK(e, gcap_backward(l, NULL, 0));
  T_REQUIRE(t_read(y, dy, NX));
  T_REQUIRE(gcap_tensor_grad(x) != NULL && t_read(gcap_tensor_grad(x), dg, NX));
  int kept = 0, dropped = 0, bad = 0;
  for (int i = 0; i < NX; i++) {
    double m;
    if (dy[i] == 0.0f)
      m = 0.0, dropped++;
    else
      m = (double)dy[i] / (double)dx[i], kept++;
    if (m != 0.0 && fabs(m - (double)scale) > 1e-6 * (double)scale && ++bad <= 3)
      T_FAILF("mask in {0, 1/(1-p)}",
              "dropout element %d: y %.9g, x %.9g: mask %.9g, want 0 or %.9g", i, (double)dy[i],
              (double)dx[i], m, (double)scale);
    double want = (double)dr[i] * (m == 0.0 ? 0.0 : (double)scale);
    if (fabs((double)dg[i] - want) > 1e-6 + 1e-6 * fabs(want) && ++bad <= 3)
      T_FAILF("grad = r * mask", "dropout element %d: grad %.9g, want %.9g", i, (double)dg[i],
              want);
  }
  /* p = 0.3 over 256 elements: both kinds present, roughly in proportion. */
  T_CHECK(dropped > 256 * 0.15 && dropped < 256 * 0.45);
  T_CHECK(kept + dropped == NX);
  gcap_tensor_free(x), gcap_tensor_free(r), gcap_tensor_free(y), gcap_tensor_free(yr),
      gcap_tensor_free(l);
  gcap_engine_free(e);
}

/* p = 1 drops everything (grad 0); p = 0 and eval are the identity (grad r). */
static void test_dropout_extremes(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[1] = {16};
  float dx[16], dr[16], g[16], y[16];
  for (int i = 0; i < 16; i++)
    dx[i] = 0.5f + (float)i, dr[i] = urand();
  const double ps[3] = {1.0, 0.0, 0.5};
  const int training[3] = {1, 1, 0};
  for (int k = 0; k < 3; k++) {
    gcap_tensor *x = t_from(e, 1, s, dx), *r = t_from(e, 1, s, dr), *o = NULL, *m = NULL, *l = NULL;
    T_REQUIRE(x && r);
    T_CHECK_OK(e, gcap_tensor_set_requires_grad(x, 1));
    T_CHECK_OK(e, gcap_dropout(x, ps[k], training[k], &o));
    T_CHECK_OK(e, gcap_mul(o, r, &m));
    T_CHECK_OK(e, gcap_sum(m, &l));
    T_CHECK_OK(e, gcap_backward(l, NULL, 0));
    T_REQUIRE(gcap_tensor_grad(x) != NULL);
    if (t_read(o, y, 16) && t_read(gcap_tensor_grad(x), g, 16))
      for (int i = 0; i < 16; i++) {
        float wy = ps[k] == 1.0 ? 0.0f : dx[i], wg = ps[k] == 1.0 ? 0.0f : dr[i];
        if (y[i] != wy || g[i] != wg) {
          T_FAILF("identity or zero",
                  "dropout p=%g training=%d element %d: y %g (want %g), grad %g (want %g)", ps[k],
                  training[k], i, (double)y[i], (double)wy, (double)g[i], (double)wg);
          break;
        }
      }
    gcap_tensor_free(x), gcap_tensor_free(r), gcap_tensor_free(o), gcap_tensor_free(m),
        gcap_tensor_free(l);
  }
  gcap_engine_free(e);
}

/* Loss values against double references (the same numbers the finite
** differences difference). */
static void test_loss_values(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t sl[2] = {3, 4}, st[1] = {3};
  const float logits[12] = {0.5f, -1.0f, 2.0f,  0.0f, 1.0f, 1.0f,
                            1.0f, 1.0f,  -2.0f, 3.0f, 0.5f, -0.5f};
  const float tgt[3] = {2, 0, 1};
  const float a[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  float b[12];
  for (int i = 0; i < 12; i++)
    b[i] = a[i] * 0.5f - 1.0f;
  gcap_tensor *tl = t_from(e, 2, sl, logits), *tt = t_from(e, 1, st, tgt),
              *ta = t_from(e, 2, sl, a), *tb = t_from(e, 2, sl, b), *xe = NULL, *mse = NULL;
  T_REQUIRE(tl && tt && ta && tb);
  T_CHECK_OK(e, gcap_cross_entropy(tl, tt, &xe));
  T_CHECK_OK(e, gcap_mse_loss(ta, tb, &mse));
  T_CHECK(gcap_tensor_ndim(xe) == 0 && gcap_tensor_ndim(mse) == 0);
  double ref = 0.0;
  for (int r = 0; r < 3; r++) {
    double mx = -1e30, s = 0.0;
    for (int c = 0; c < 4; c++)
      mx = fmax(mx, (double)logits[r * 4 + c]);
    for (int c = 0; c < 4; c++)
      s += exp((double)logits[r * 4 + c] - mx);
    ref += log(s) + mx - (double)logits[r * 4 + (int)tgt[r]];
  }
  T_CHECK_NEAR(t_value(xe), ref / 3.0, 1e-6, 1e-6);
  ref = 0.0;
  for (int i = 0; i < 12; i++)
    ref += ((double)a[i] - (double)b[i]) * ((double)a[i] - (double)b[i]);
  T_CHECK_NEAR(t_value(mse), ref / 12.0, 1e-6, 1e-6);
  gcap_tensor_free(tl), gcap_tensor_free(tt), gcap_tensor_free(ta), gcap_tensor_free(tb);
  gcap_tensor_free(xe), gcap_tensor_free(mse);
  gcap_engine_free(e);
}

int main(void) {
  if (t_device() != GCAP_DEVICE_HOST) {
    printf(
        "1..0 # SKIP finite differences run on the host backend (test_parity holds cuda to it)\n");
    return 77;
  }
  run_cases("grad", cases_elementwise, NCASES(cases_elementwise));
  run_cases("grad", cases_linalg, NCASES(cases_linalg));
  run_cases("grad", cases_layers, NCASES(cases_layers));
  run_cases("grad", cases_attention, NCASES(cases_attention));
  T_RUN(test_dropout_mask_grad);
  T_RUN(test_dropout_extremes);
  T_RUN(test_loss_values);
  return t_done();
}
