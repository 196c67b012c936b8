/*
** k_shape.cu: GC_K_PERMUTE, GC_K_NARROW and GC_K_SUM_MID: the copies behind
** transpose, permute, split and cat, and the sum over a middle dim that
** reduces a broadcast batch's grads.
**
** Copies move values unchanged (bitwise equal to the host; a permute that
** keeps the last dim moves whole rows, and a narrow whose rows split into
** aligned 16-byte pieces moves those, 16 bytes at a time); sum_mid has one
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

/* The common permute that keeps the last dim last (heads split from or merged
** into [S, B, H, D]): y's rows of vrow units V move whole. y's first three
** dims have sizes n0..n2 and x's row strides t0..t2; a unit is 16 bytes where
** rows split into aligned 16-byte pieces, else one element. */
template <typename V>
static __global__ void k_permute_rows(V *y, const V *x, int64_t n1, int64_t n2, int64_t t0,
                                      int64_t t1, int64_t t2, int64_t vrow, int64_t n) {
  CU_GRID_LOOP(i, n) {
    int64_t v = i % vrow, r = i / vrow;
    int64_t c = r % n2, b = (r / n2) % n1, a = r / (n2 * n1);
    y[i] = x[(a * t0 + b * t1 + c * t2) * vrow + v];
  }
}

/* Launch k_permute_rows for a permute of x [s0..s3] by p0..p2 (p3 = 3). */
static void cu_permute_rows(cudaStream_t s, void *y, const void *x, int dt, const int64_t *sh,
                            const int *p) {
  const int64_t xs[3] = {sh[1] * sh[2], sh[2], 1}; /* x's row strides, in rows */
  const int64_t esz = dt == GCAP_BF16 ? 2 : 4, rows = sh[0] * sh[1] * sh[2];
  const int64_t n1 = sh[p[1]], n2 = sh[p[2]];
  if ((sh[3] * esz) % 16 == 0 && ((uintptr_t)y | (uintptr_t)x) % 16 == 0) {
    int64_t vrow = sh[3] * esz / 16;
    k_permute_rows<uint4><<<cu_blocks(rows * vrow), CU_THREADS, 0, s>>>(
        (uint4 *)y, (const uint4 *)x, n1, n2, xs[p[0]], xs[p[1]], xs[p[2]], vrow, rows * vrow);
  } else if (esz == 2)
    k_permute_rows<unsigned short><<<cu_blocks(rows * sh[3]), CU_THREADS, 0, s>>>(
        (unsigned short *)y, (const unsigned short *)x, n1, n2, xs[p[0]], xs[p[1]], xs[p[2]], sh[3],
        rows * sh[3]);
  else
    k_permute_rows<unsigned><<<cu_blocks(rows * sh[3]), CU_THREADS, 0, s>>>(
        (unsigned *)y, (const unsigned *)x, n1, n2, xs[p[0]], xs[p[1]], xs[p[2]], sh[3],
        rows * sh[3]);
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

/* k_narrow with inner = 1 over 16-byte units: a slice whose rows (len
** elements of inner each, at offset off of rows of full) split into aligned
** 16-byte pieces moves them whole. */
static __global__ void k_narrow_rows(uint4 *dst, const uint4 *src, int64_t len, int64_t full,
                                     int64_t off, int insert, int64_t n) {
  CU_GRID_LOOP(part, n) {
    int64_t whole = (part / len) * full + off + part % len;
    if (insert)
      dst[whole] = src[part];
    else
      dst[part] = src[whole];
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
      const int p[4] = {(int)a->n[4], (int)a->n[5], (int)a->n[6], (int)a->n[7]};
      if (n > 0 && p[3] == 3)
        cu_permute_rows(s, a->p[0], a->p[1], dt, a->n, p);
      else if (n > 0)
        k_permute<<<cu_blocks(n), CU_THREADS, 0, s>>>(a->p[0], a->p[1], dt, a->n[0], a->n[1],
                                                      a->n[2], a->n[3], (int)a->n[4], (int)a->n[5],
                                                      (int)a->n[6], (int)a->n[7], n);
      return GCAP_OK;
    }
    case GC_K_NARROW: {
      int64_t n = a->n[0] * a->n[1] * a->n[2];
      const int64_t esz = dt == GCAP_BF16 ? 2 : 4, unit = a->n[2] * esz; /* bytes an index */
      if (n <= 0) return GCAP_OK;
      if ((a->n[1] * unit) % 16 == 0 && (a->n[3] * unit) % 16 == 0 && (a->n[4] * unit) % 16 == 0 &&
          ((uintptr_t)a->p[0] | (uintptr_t)a->p[1]) % 16 == 0) {
        const int64_t len = a->n[1] * unit / 16;
        k_narrow_rows<<<cu_blocks(a->n[0] * len), CU_THREADS, 0, s>>>(
            (uint4 *)a->p[0], (const uint4 *)a->p[1], len, a->n[3] * unit / 16, a->n[4] * unit / 16,
            (int)a->n[5], a->n[0] * len);
      } else
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
