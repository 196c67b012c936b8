/*
** k_arith.cu: GC_K_POW, GC_K_POW_BWD and GC_K_CMP. Operands broadcast by
** index modulo their element count (a 0-D or one-element operand, or a row),
** as the binary elementwise kernels'. pow and log are taken in double and
** rounded to float, as the host does, so that the two agree within an ulp
** (double's pow and log differ by a few ulps of a double at most); the
** products are round-to-nearest intrinsics in the host's order.
*/
#include <math.h>

#include "common.cuh"

__device__ __forceinline__ float cu_pow_f(float a, float b) {
  return (float)pow((double)a, (double)b);
}

static __global__ void k_pow(void *y, const void *u, int64_t nu, const void *w, int64_t nw, int dt,
                             int64_t n) {
  CU_GRID_LOOP(i, n) {
    cu_store(y, i, dt, cu_pow_f(cu_load(u, i % nu, dt), cu_load(w, i % nw, dt)));
  }
}

/* da = dy (b pow(a, b - 1)), 0 where b = 0; db = dy (pow(a, b) log(a)), 0
** where a = 0 and b >= 0; either pointer may be NULL. */
static __global__ void k_pow_bwd(void *da, void *db, const void *dy, const void *u, int64_t nu,
                                 const void *w, int64_t nw, int dt, int64_t n) {
  CU_GRID_LOOP(i, n) {
    float g = cu_load(dy, i, dt), x = cu_load(u, i % nu, dt), e = cu_load(w, i % nw, dt);
    if (da)
      cu_store(da, i, dt,
               e == 0.0f ? 0.0f : __fmul_rn(g, __fmul_rn(e, cu_pow_f(x, __fsub_rn(e, 1.0f)))));
    if (db)
      cu_store(db, i, dt,
               x == 0.0f && e >= 0.0f
                   ? 0.0f
                   : __fmul_rn(g, __fmul_rn(cu_pow_f(x, e), (float)log((double)x))));
  }
}

/* y = a OP b ? 1 : 0 (f32), the operands of dtype xdt; OP a gcap_cmp. */
static __global__ void k_cmp(float *y, const void *u, int64_t nu, const void *w, int64_t nw,
                             int xdt, int op, int64_t n) {
  CU_GRID_LOOP(i, n) {
    float x = cu_load(u, i % nu, xdt), z = cu_load(w, i % nw, xdt);
    bool r;
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
    y[i] = r ? 1.0f : 0.0f;
  }
}

gcap_status cu_arith(gcap_engine *, cu_state *, cudaStream_t s, int k, const gc_kargs *a) {
  int64_t n = a->n[0];
  if (n <= 0) return GCAP_OK;
  switch (k) {
    case GC_K_POW:
      k_pow<<<cu_blocks(n), CU_THREADS, 0, s>>>(a->p[0], a->p[1], a->n[1], a->p[2], a->n[2], a->dt,
                                                n);
      break;
    case GC_K_POW_BWD:
      k_pow_bwd<<<cu_blocks(n), CU_THREADS, 0, s>>>(a->p[0], a->p[1], a->p[2], a->p[3], a->n[3],
                                                    a->p[4], a->n[4], a->dt, n);
      break;
    default: /* GC_K_CMP */
      k_cmp<<<cu_blocks(n), CU_THREADS, 0, s>>>((float *)a->p[0], a->p[1], a->n[1], a->p[2],
                                                a->n[2], (int)a->n[3], (int)a->n[4], n);
      break;
  }
  return GCAP_OK;
}
