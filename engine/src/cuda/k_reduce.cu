/*
** k_reduce.cu: GC_K_SUM, y[0] = f * sum(x[0 .. n)).
**
** Deterministic: one block of CU_SUM_THREADS threads, thread t adds elements
** t, t + CU_SUM_THREADS, ... in order, then a fixed shared-memory tree adds
** the partial sums. The result depends on n only: not on timing, nor on the
** GPU. One block and no scratch memory also means that sums running at once
** on several streams (forked in a capture, or concurrent replays) share no
** buffer. Accumulation is in float; f is applied at the end.
*/
#include "common.cuh"

#define CU_SUM_THREADS 1024

static __global__ void k_sum(void *y, const void *x, int dt, int64_t n, float f) {
  __shared__ float part[CU_SUM_THREADS];
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += CU_SUM_THREADS)
    s = __fadd_rn(s, cu_load(x, i, dt));
  part[threadIdx.x] = s;
  __syncthreads();
  for (int w = CU_SUM_THREADS / 2; w > 0; w /= 2) {
    if ((int)threadIdx.x < w)
      part[threadIdx.x] = __fadd_rn(part[threadIdx.x], part[threadIdx.x + w]);
    __syncthreads();
  }
  if (threadIdx.x == 0) cu_store(y, 0, dt, __fmul_rn(f, part[0]));
}

gcap_status cu_reduce(gcap_engine *, cu_state *, cudaStream_t s, int, const gc_kargs *a) {
  /* n = 0 still writes y[0] = f * 0 */
  k_sum<<<1, CU_SUM_THREADS, 0, s>>>(a->p[0], a->p[1], a->dt, a->n[0], a->f[0]);
  return GCAP_OK;
}
