/*
** k_elementwise.cu: fill, copy, add, sub, mul, scale (backend.h's GC_K_FILL
** .. GC_K_SCALE; copy also converts f32 <-> bf16). Each element is one float
** operation with round-to-nearest intrinsics (__fadd_rn, ...), which the
** compiler never fuses into an FMA, so f32 results equal the host reference
** bit for bit.
*/
#include "common.cuh"

static __global__ void k_fill(void *y, int dt, int64_t n, float v) {
  CU_GRID_LOOP(i, n) cu_store(y, i, dt, v);
}

/* Converts between dtypes: ydt is the destination's, xdt the source's. */
static __global__ void k_copy(void *y, int ydt, const void *x, int xdt, int64_t n) {
  CU_GRID_LOOP(i, n) cu_store(y, i, ydt, cu_load(x, i, xdt));
}

/* y[i] = a[i % na] op b[i % nb]: the modulo broadcasts a 0-D or one-element
** operand and a row matching the last dimension. */
static __global__ void k_binary(int op, void *y, const void *a, int64_t na, const void *b,
                                int64_t nb, int dt, int64_t n) {
  CU_GRID_LOOP(i, n) {
    float u = cu_load(a, i % na, dt), v = cu_load(b, i % nb, dt), r;
    switch (op) {
      case GC_K_ADD:
        r = __fadd_rn(u, v);
        break;
      case GC_K_SUB:
        r = __fsub_rn(u, v);
        break;
      default: /* GC_K_MUL */
        r = __fmul_rn(u, v);
        break;
    }
    cu_store(y, i, dt, r);
  }
}

static __global__ void k_scale(void *y, const void *x, int dt, int64_t n, float f) {
  CU_GRID_LOOP(i, n) cu_store(y, i, dt, __fmul_rn(cu_load(x, i, dt), f));
}

gcap_status cu_elementwise(gcap_engine *, cu_state *, cudaStream_t s, int k, const gc_kargs *a) {
  int64_t n = a->n[0];
  if (n <= 0) return GCAP_OK;
  unsigned g = cu_blocks(n);
  switch (k) {
    case GC_K_FILL:
      k_fill<<<g, CU_THREADS, 0, s>>>(a->p[0], a->dt, n, a->f[0]);
      break;
    case GC_K_COPY: /* dt: the destination's dtype, n[1]: the source's */
      if (a->p[0] == a->p[1]) break; /* as the host: a copy onto itself is a no-op */
      k_copy<<<g, CU_THREADS, 0, s>>>(a->p[0], a->dt, a->p[1], (int)a->n[1], n);
      break;
    case GC_K_ADD:
    case GC_K_SUB:
    case GC_K_MUL:
      k_binary<<<g, CU_THREADS, 0, s>>>(k, a->p[0], a->p[1], a->n[1], a->p[2], a->n[2], a->dt, n);
      break;
    default: /* GC_K_SCALE */
      k_scale<<<g, CU_THREADS, 0, s>>>(a->p[0], a->p[1], a->dt, n, a->f[0]);
      break;
  }
  return GCAP_OK;
}
