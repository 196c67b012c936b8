/*
** kernels.c: reference kernels in plain C. They define what every op
** computes; the cuda kernels are checked against them (parity tests).
** Storage is f32 or bf16 (the upper half of an f32, rounded to nearest even);
** arithmetic is always in float.
*/
#include <math.h>
#include <string.h>

#include "../rng.h"
#include "kernels.h"

static float ld(const void *p, int dt, int64_t i) {
  if (dt == GCAP_BF16) {
    uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
  }
  return ((const float *)p)[i];
}

static void st(void *p, int dt, int64_t i, float v) {
  if (dt == GCAP_BF16) {
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) u = 0x7fc00000u; /* NaN stays a quiet NaN */
    else u += 0x7fffu + ((u >> 16) & 1u);                 /* round to nearest even */
    ((uint16_t *)p)[i] = (uint16_t)(u >> 16);
    return;
  }
  ((float *)p)[i] = v;
}

static void hk_fill(const gc_kargs *a) {
  int64_t i;
  for (i = 0; i < a->n[0]; i++) st(a->p[0], a->dt, i, a->f[0]);
}

/* dt is the destination's dtype, n[1] the source's. */
static void hk_copy(const gc_kargs *a) {
  int64_t i;
  if (a->p[0] == a->p[1]) return;
  for (i = 0; i < a->n[0]; i++) st(a->p[0], a->dt, i, ld(a->p[1], (int)a->n[1], i));
}

/* out[i] = x[i % nx] OP y[i % ny]: equal shapes, one element, or a row. */
#define HK_BINARY(name, OP)                                                   \
  static void name(const gc_kargs *a) {                                      \
    int64_t i;                                                                \
    for (i = 0; i < a->n[0]; i++) {                                           \
      float x = ld(a->p[1], a->dt, i % a->n[1]), y = ld(a->p[2], a->dt, i % a->n[2]); \
      st(a->p[0], a->dt, i, x OP y);                                          \
    }                                                                         \
  }
HK_BINARY(hk_add, +)
HK_BINARY(hk_sub, -)
HK_BINARY(hk_mul, *)

static void hk_scale(const gc_kargs *a) {
  int64_t i;
  for (i = 0; i < a->n[0]; i++) st(a->p[0], a->dt, i, ld(a->p[1], a->dt, i) * a->f[0]);
}

/* A float sum in the order of a binary tree over 256-element leaves, so that
** the result does not drift with n the way a running sum does. */
static float tree_sum(const void *p, int dt, int64_t lo, int64_t hi) {
  if (hi - lo <= 256) {
    float s = 0.0f;
    int64_t i;
    for (i = lo; i < hi; i++) s += ld(p, dt, i);
    return s;
  }
  {
    int64_t mid = lo + (hi - lo) / 2;
    return tree_sum(p, dt, lo, mid) + tree_sum(p, dt, mid, hi);
  }
}

static void hk_sum(const gc_kargs *a) {
  st(a->p[0], a->dt, 0, a->f[0] * tree_sum(a->p[1], a->dt, 0, a->n[0]));
}

static void hk_rand(const gc_kargs *a) {
  const uint64_t *state = (const uint64_t *)a->p[1];
  uint64_t seed = state[0], off = state[1];
  int64_t i;
  for (i = 0; i < a->n[0]; i++)
    st(a->p[0], a->dt, i,
       a->n[1] ? gc_rng_normal(seed, off + (uint64_t)i) : gc_rng_uniform(seed, off + (uint64_t)i));
}

static void hk_rng_advance(const gc_kargs *a) {
  ((uint64_t *)a->p[0])[1] += (uint64_t)a->n[0];
}

hk_fn hk_kernel(int k) {
  static const hk_fn table[GC_K_COUNT] = {hk_fill, hk_copy, hk_add,  hk_sub,        hk_mul,
                                          hk_scale, hk_sum, hk_rand, hk_rng_advance};
  return k >= 0 && k < GC_K_COUNT ? table[k] : NULL;
}
