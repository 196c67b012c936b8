/*
** k_arith.c: reference kernels of pow, its grads and the comparisons
** (GC_K_POW, GC_K_POW_BWD, GC_K_CMP). Operands broadcast as the binary
** elementwise kernels' do (element i reads a[i % na], b[i % nb]); pow and
** log are taken in double and rounded, so that a backend whose float pow
** differs by an ulp still agrees within rounding.
*/
#include <math.h>

#include "kernels.h"

static float pow_f(float a, float b) {
  return (float)pow((double)a, (double)b);
}

void hk_pow(const gc_kargs *a) {
  void *y = a->p[0];
  const void *u = a->p[1], *w = a->p[2];
  int64_t n = a->n[0], nu = a->n[1], nw = a->n[2], i;
  int dt = a->dt;
  for (i = 0; i < n; i++)
    gc_store(y, dt, i, pow_f(gc_load(u, dt, i % nu), gc_load(w, dt, i % nw)));
}

/* PyTorch's pow_backward and pow_backward_exponent, op by op in float. */
void hk_pow_bwd(const gc_kargs *a) {
  void *da = a->p[0], *db = a->p[1];
  const void *dy = a->p[2], *u = a->p[3], *w = a->p[4];
  int64_t n = a->n[0], nu = a->n[3], nw = a->n[4], i;
  int dt = a->dt;
  for (i = 0; i < n; i++) {
    float g = gc_load(dy, dt, i), x = gc_load(u, dt, i % nu), e = gc_load(w, dt, i % nw);
    if (da) gc_store(da, dt, i, e == 0.0f ? 0.0f : g * (e * pow_f(x, e - 1.0f)));
    if (db)
      gc_store(db, dt, i,
               x == 0.0f && e >= 0.0f ? 0.0f : g * (pow_f(x, e) * (float)log((double)x)));
  }
}

void hk_cmp(const gc_kargs *a) {
  void *y = a->p[0];
  const void *u = a->p[1], *w = a->p[2];
  int64_t n = a->n[0], nu = a->n[1], nw = a->n[2], i;
  int xdt = (int)a->n[3], op = (int)a->n[4];
  for (i = 0; i < n; i++) {
    float x = gc_load(u, xdt, i % nu), z = gc_load(w, xdt, i % nw);
    int r;
    switch (op) {
      case GCAP_LT:
        r = x < z;
        break;
      case GCAP_LE:
        r = x <= z;
        break;
      case GCAP_GT:
        r = x > z;
        break;
      case GCAP_GE:
        r = x >= z;
        break;
      case GCAP_EQ:
        r = x == z;
        break;
      default: /* GCAP_NE */
        r = x != z;
        break;
    }
    gc_store(y, a->dt, i, r ? 1.0f : 0.0f);
  }
}
