/*
** k_shape.cu: GC_K_PERMUTE, GC_K_NARROW and GC_K_SUM_MID: the copies behind
** transpose, permute, split and cat, and the sum over a middle dim that
** reduces a broadcast batch's grads.
**
** Copies move values unchanged (bitwise equal to the host); sum_mid has one
** thread per output element adding the middle dim in order, as the host,
** without atomics: f32 results equal the host's bit for bit.
*/
#include "common.cuh"

/* y[i] = x at the 4-D index whose dim perm[d] is y's index in dim d. */
static __global__ void k_permute(void *y, const void *x, int dt, int64_t s0, int64_t s1, int64_t s2,
                                 int64_t s3, int p0, int p1, int p2, int p3, int64_t n) {
  const int64_t s[4] = {s0, s1, s2, s3};
  const int perm[4] = {p0, p1, p2, p3};
  const int64_t xstride[4] = {s1 * s2 * s3, s2 * s3, s3, 1};
  CU_GRID_LOOP(i, n) {
    int64_t rest = i, xi = 0;
    for (int d = 3; d >= 0; d--) {
      int64_t ys = s[perm[d]];
      xi += (rest % ys) * xstride[perm[d]];
      rest /= ys;
    }
    cu_store(y, i, dt, cu_load(x, xi, dt));
  }
}

/* One thread per element of the slice [outer, len, inner]. */
static __global__ void k_narrow(void *dst, const void *src, int dt, int64_t len, int64_t inner,
                                int64_t full, int64_t off, int insert, int64_t n) {
  CU_GRID_LOOP(part, n) {
    int64_t i = part % inner, j = (part / inner) % len, o = part / (inner * len);
    int64_t whole = (o * full + off + j) * inner + i;
    if (insert)
      cu_store(dst, whole, dt, cu_load(src, part, dt));
    else
      cu_store(dst, part, dt, cu_load(src, whole, dt));
  }
}

static __global__ void k_sum_mid(void *y, const void *x, int dt, int64_t mid, int64_t inner,
                                 int64_t n) {
  CU_GRID_LOOP(t, n) {
    int64_t o = t / inner, i = t % inner;
    float s = 0.0f;
    for (int64_t j = 0; j < mid; j++)
      s = __fadd_rn(s, cu_load(x, (o * mid + j) * inner + i, dt));
    cu_store(y, t, dt, s);
  }
}

gcap_status cu_shape(gcap_engine *, cu_state *, cudaStream_t s, int k, const gc_kargs *a) {
  int dt = a->dt;
  switch (k) {
    case GC_K_PERMUTE: {
      int64_t n = a->n[0] * a->n[1] * a->n[2] * a->n[3];
      if (n > 0)
        k_permute<<<cu_blocks(n), CU_THREADS, 0, s>>>(a->p[0], a->p[1], dt, a->n[0], a->n[1],
                                                      a->n[2], a->n[3], (int)a->n[4], (int)a->n[5],
                                                      (int)a->n[6], (int)a->n[7], n);
      return GCAP_OK;
    }
    case GC_K_NARROW: {
      int64_t n = a->n[0] * a->n[1] * a->n[2];
      if (n > 0)
        k_narrow<<<cu_blocks(n), CU_THREADS, 0, s>>>(a->p[0], a->p[1], dt, a->n[1], a->n[2],
                                                     a->n[3], a->n[4], (int)a->n[5], n);
      return GCAP_OK;
    }
    default: { /* GC_K_SUM_MID */
      int64_t n = a->n[0] * a->n[2];
      if (n > 0)
        k_sum_mid<<<cu_blocks(n), CU_THREADS, 0, s>>>(a->p[0], a->p[1], dt, a->n[1], a->n[2], n);
      return GCAP_OK;
    }
  }
}
