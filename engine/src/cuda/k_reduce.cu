/*
** k_reduce.cu: GC_K_SUM, y[0] = f * sum(x[0 .. n)).
**
** Deterministic: a block of CU_SUM_THREADS threads sums a range, thread t
** adding elements t, t + CU_SUM_THREADS, ... in order, then a fixed
** shared-memory tree adds the partial sums. Up to GC_SUM_CHUNKS(n) elements
** one block sums them all; a longer sum gives each of GC_SUM_CHUNKS(n)
** blocks a fixed range, writing its sum to the scratch the core passes, and
** one block then sums those in the same way. The result depends on n only:
** not on timing, nor on the GPU; sums running at once on several streams
** share no buffer. Accumulation is in float; f is applied at the end.
*/
#include "common.cuh"

#define CU_SUM_THREADS 1024

/* The sum of x[lo .. hi) (stored as dt), returned to thread 0. */
static __device__ float cu_range_sum(const void *x, int dt, int64_t lo, int64_t hi) {
  __shared__ float part[CU_SUM_THREADS];
  float s = 0.0f;
  for (int64_t i = lo + threadIdx.x; i < hi; i += CU_SUM_THREADS)
    s = __fadd_rn(s, cu_load(x, i, dt));
  part[threadIdx.x] = s;
  __syncthreads();
  for (int w = CU_SUM_THREADS / 2; w > 0; w /= 2) {
    if ((int)threadIdx.x < w)
      part[threadIdx.x] = __fadd_rn(part[threadIdx.x], part[threadIdx.x + w]);
    __syncthreads();
  }
  return part[0];
}

/* y[0] = f * sum(x[0 .. n)), one block; y is stored as ydt, x read as xdt. */
static __global__ void k_sum(void *y, int ydt, const void *x, int xdt, int64_t n, float f) {
  float s = cu_range_sum(x, xdt, 0, n);
  if (threadIdx.x == 0) cu_store(y, 0, ydt, __fmul_rn(f, s));
}

/* part[c] = sum of chunk c (blockIdx.x) of chunks equal ranges of x. */
static __global__ void k_sum_chunks(float *part, const void *x, int dt, int64_t n, int chunks) {
  int64_t c = blockIdx.x;
  float s = cu_range_sum(x, dt, n * c / chunks, n * (c + 1) / chunks);
  if (threadIdx.x == 0) part[c] = s;
}

/* The second stage of the column sums in chunks (sum_rows, gelu_bwd's bias
** grad, layer_norm's parameter grads). A block of CU_JOIN_COLS columns by
** CU_JOIN_LANES lanes: lane l adds chunks l, l + CU_JOIN_LANES, ... of its
** column in order, then a fixed tree adds the lanes; an order fixed by
** chunks alone, and a column's hundreds of chunks read by many threads. */
#define CU_JOIN_COLS 32
#define CU_JOIN_LANES 32

static __global__ void __launch_bounds__(CU_JOIN_COLS *CU_JOIN_LANES)
    k_sum_rows_join(void *y, const float *part, int dt, int64_t cols, int chunks) {
  __shared__ float sh[CU_JOIN_LANES][CU_JOIN_COLS + 1];
  const int tx = (int)threadIdx.x, ty = (int)threadIdx.y;
  for (int64_t j0 = (int64_t)blockIdx.x * CU_JOIN_COLS; j0 < cols;
       j0 += (int64_t)gridDim.x * CU_JOIN_COLS) {
    const int64_t j = j0 + tx;
    float s = 0.0f;
    if (j < cols)
#pragma unroll 4
      for (int c = ty; c < chunks; c += CU_JOIN_LANES)
        s = __fadd_rn(s, part[c * cols + j]);
    __syncthreads(); /* the last tile's tree has read sh */
    sh[ty][tx] = s;
    for (int w = CU_JOIN_LANES / 2; w > 0; w /= 2) {
      __syncthreads();
      if (ty < w) sh[ty][tx] = __fadd_rn(sh[ty][tx], sh[ty + w][tx]);
    }
    if (ty == 0 && j < cols) cu_store(y, j, dt, sh[0][tx]);
  }
}

void cu_join_chunks(cudaStream_t s, void *y, const float *part, int dt, int64_t cols, int chunks) {
  const int64_t tiles = (cols + CU_JOIN_COLS - 1) / CU_JOIN_COLS;
  const unsigned g = (unsigned)(tiles < CU_MAX_BLOCKS ? tiles : CU_MAX_BLOCKS);
  if (g > 0)
    k_sum_rows_join<<<g, dim3(CU_JOIN_COLS, CU_JOIN_LANES), 0, s>>>(y, part, dt, cols, chunks);
}

gcap_status cu_reduce(gcap_engine *, cu_state *, cudaStream_t s, int, const gc_kargs *a) {
  int64_t n = a->n[0];
  int chunks = GC_SUM_CHUNKS(n);
  if (chunks > 1 && a->p[2] != NULL) {
    k_sum_chunks<<<chunks, CU_SUM_THREADS, 0, s>>>((float *)a->p[2], a->p[1], a->dt, n, chunks);
    k_sum<<<1, CU_SUM_THREADS, 0, s>>>(a->p[0], a->dt, a->p[2], GCAP_F32, chunks, a->f[0]);
    return GCAP_OK;
  }
  /* n = 0 still writes y[0] = f * 0 */
  k_sum<<<1, CU_SUM_THREADS, 0, s>>>(a->p[0], a->dt, a->p[1], a->dt, n, a->f[0]);
  return GCAP_OK;
}
