/*
** t_optim.h: what the optimizer suites share (test_optim.c, test_optim_lr.c):
** two parameters, the grads of each step, and references computed in double
** on the host with PyTorch's update rules. Include it after t.h; every
** helper is static inline, so a suite that leaves one unused gets no warning.
*/
#ifndef T_OPTIM_H
#define T_OPTIM_H

#include <stdint.h>

#include "t.h"

/* Tolerance of a float update against the double reference. */
#define ATOL 2e-6
#define RTOL 2e-6

/* got (floats read back) vs want (double); names the first difference. */
static inline void check_close(const char *what, int step, const float *got, const double *want,
                               int n) {
  for (int i = 0; i < n; i++)
    if (!(fabs((double)got[i] - want[i]) <= ATOL + RTOL * fabs(want[i]))) {
      T_FAILF("|got - ref| <= atol + rtol*|ref|",
              "%s, step %d, element %d: got %.9g, reference %.9g", what, step, i, (double)got[i],
              want[i]);
      return;
    }
}

/* The k-th step's gradient for element i of parameter j. */
static inline float grad_value(int j, int i, int k) {
  return sinf(0.9f * (float)i + 1.7f * (float)j + 0.6f * (float)k) * (k % 2 ? 0.5f : 1.0f) +
         0.05f * (float)k;
}

enum { NP = 2, MAXN = 6 };
static const int pn[NP] = {5, 6}; /* numels */
static const int64_t pshape[NP][2] = {{5, 0}, {2, 3}};
static const int pnd[NP] = {1, 2};

typedef struct fixture {
  gcap_engine *e;
  gcap_tensor *p[NP];
  double ref[NP][MAXN];
} fixture;

static inline int fixture_make(fixture *f) {
  memset(f, 0, sizeof *f);
  f->e = t_engine();
  if (f->e == NULL) return 0;
  for (int j = 0; j < NP; j++) {
    float d[MAXN];
    for (int i = 0; i < pn[j]; i++)
      d[i] = 0.5f * cosf(1.1f * (float)i + (float)j) + 0.1f, f->ref[j][i] = (double)d[i];
    f->p[j] = t_from(f->e, pnd[j], pshape[j], d);
    if (f->p[j] == NULL || gcap_tensor_set_requires_grad(f->p[j], 1) != GCAP_OK) return 0;
  }
  return 1;
}

static inline void fixture_free(fixture *f) {
  for (int j = 0; j < NP; j++)
    gcap_tensor_free(f->p[j]);
  gcap_engine_free(f->e);
}

/* Install step k's grad on parameter j (a fresh tensor). */
static inline int set_step_grad(fixture *f, int j, int k) {
  float d[MAXN];
  gcap_tensor *g;
  for (int i = 0; i < pn[j]; i++)
    d[i] = grad_value(j, i, k);
  g = t_from(f->e, pnd[j], pshape[j], d);
  int ok = g && gcap_tensor_set_grad(f->p[j], g) == GCAP_OK;
  gcap_tensor_free(g);
  return ok;
}

static inline void check_params(fixture *f, const char *what, int step) {
  for (int j = 0; j < NP; j++) {
    float got[MAXN];
    char name[96];
    snprintf(name, sizeof name, "%s, parameter %d", what, j);
    if (t_read(f->p[j], got, (size_t)pn[j])) check_close(name, step, got, f->ref[j], pn[j]);
  }
}

/* Adam as PyTorch: g += wd p; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
** p -= (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps), with t the
** number of steps this parameter has taken. */
typedef struct adam_ref {
  double m[NP][MAXN], v[NP][MAXN];
  int t[NP];
} adam_ref;

static inline void adam_ref_step(fixture *f, adam_ref *a, int j, int k, double lr, double b1,
                                 double b2, double eps, double wd, int decoupled) {
  int t = ++a->t[j];
  double bc1 = 1.0 - pow(b1, t), bc2 = 1.0 - pow(b2, t);
  for (int i = 0; i < pn[j]; i++) {
    double g = (double)grad_value(j, i, k);
    if (decoupled) /* AdamW: p *= 1 - lr wd, nothing added to the grad */
      f->ref[j][i] *= 1.0 - lr * wd;
    else
      g += wd * f->ref[j][i];
    a->m[j][i] = b1 * a->m[j][i] + (1.0 - b1) * g;
    a->v[j][i] = b2 * a->v[j][i] + (1.0 - b2) * g * g;
    f->ref[j][i] -= (lr / bc1) * a->m[j][i] / (sqrt(a->v[j][i]) / sqrt(bc2) + eps);
  }
}

#endif
