/*
** k_activation.cu: GC_K_RELU, GC_K_RELU_BWD, GC_K_GELU and GC_K_GELU_BWD (with
** the column sums of its result when asked: a bias grad in the same pass).
**
** relu and its backward only select, so they equal the host bit for bit
** (a NaN input gives 0, as on the host). gelu is the tanh form with the
** host's constants, its products and sums in the host's order with
** round-to-nearest intrinsics (never fused into an FMA); only tanhf differs
** from the C library's by an ulp or two, so gelu matches within float
** tolerance.
*/
#include <string.h>

#include "common.cuh"

#define CU_GELU_C 0.7978845608028654f /* sqrt(2 / pi) */
#define CU_GELU_K 0.044715f

/* tanh(c * (x + k x^3)), the inner product taken as ((k * x) * x) * x. */
static __device__ __forceinline__ float cu_gelu_tanh(float x) {
  float x3 = __fmul_rn(__fmul_rn(__fmul_rn(CU_GELU_K, x), x), x);
  return tanhf(__fmul_rn(CU_GELU_C, __fadd_rn(x, x3)));
}

/* (0.5 x) (1 + t) */
static __device__ __forceinline__ float cu_gelu(float x) {
  return __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, cu_gelu_tanh(x)));
}

static __global__ void k_relu(void *y, const void *x, int dt, int64_t n) {
  CU_GRID_LOOP(i, n) {
    float v = cu_load(x, i, dt);
    cu_store(y, i, dt, v > 0.0f ? v : 0.0f);
  }
}

/* dx[i] = x[i] > 0 ? dy[i] : 0 */
static __global__ void k_relu_bwd(void *dx, const void *dy, const void *x, int dt, int64_t n) {
  CU_GRID_LOOP(i, n) cu_store(dx, i, dt, cu_load(x, i, dt) > 0.0f ? cu_load(dy, i, dt) : 0.0f);
}

static __global__ void k_gelu(void *y, const void *x, int dt, int64_t n) {
  CU_GRID_LOOP(i, n) cu_store(y, i, dt, cu_gelu(cu_load(x, i, dt)));
}

/* gelu'(x) = 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 k x^2) */
__device__ __forceinline__ float cu_gelu_grad(float v) {
  float t = cu_gelu_tanh(v);
  float a = __fmul_rn(0.5f, __fadd_rn(1.0f, t));
  float b = __fmul_rn(__fmul_rn(0.5f, v), __fsub_rn(1.0f, __fmul_rn(t, t)));
  float c = __fadd_rn(1.0f, __fmul_rn(__fmul_rn(3.0f * CU_GELU_K, v), v));
  return __fadd_rn(a, __fmul_rn(__fmul_rn(b, CU_GELU_C), c));
}

static __global__ void k_gelu_bwd(void *dx, const void *dy, const void *x, int dt, int64_t n) {
  CU_GRID_LOOP(i, n)
  cu_store(dx, i, dt, __fmul_rn(cu_load(dy, i, dt), cu_gelu_grad(cu_load(x, i, dt))));
}

/* The same, with the column sums of the stored dx (rows x cols) in the same
** pass: a block is COLS columns by LANES lanes (COLS * LANES = CU_THREADS);
** lane r adds rows r, r + LANES, ... of its chunk (blockIdx.y), then the
** lanes are added by a fixed tree: a fixed order, whatever the timing. Up
** to 32 rows a chunk take 8 columns by 32 lanes (a row a thread: more
** blocks, less latency); more rows 32 by 8 (a warp reads 32 adjacent
** elements of a row). One chunk stores its sums to sum; several store f32
** partials to part, joined afterwards. */
template <int COLS, int LANES>
static __global__ void k_gelu_bwd_colsum(void *__restrict__ dx, const void *__restrict__ dy,
                                         const void *__restrict__ x, int dt, int64_t rows,
                                         int64_t cols, int chunks, void *sum, float *part) {
  __shared__ float sh[LANES][COLS + 1];
  int64_t j = (int64_t)blockIdx.x * COLS + threadIdx.x;
  int64_t lo = rows * blockIdx.y / chunks, hi = rows * (blockIdx.y + 1) / chunks;
  float acc = 0.0f;
  if (j < cols)
#pragma unroll 4
    for (int64_t i = lo + threadIdx.y; i < hi; i += LANES) {
      int64_t o = i * cols + j;
      float v = __fmul_rn(cu_load(dy, o, dt), cu_gelu_grad(cu_load(x, o, dt)));
      cu_store(dx, o, dt, v);
      acc = __fadd_rn(acc, cu_round(v, dt));
    }
  sh[threadIdx.y][threadIdx.x] = acc;
  for (int w = LANES / 2; w > 0; w /= 2) {
    __syncthreads();
    if ((int)threadIdx.y < w)
      sh[threadIdx.y][threadIdx.x] =
          __fadd_rn(sh[threadIdx.y][threadIdx.x], sh[threadIdx.y + w][threadIdx.x]);
  }
  if (threadIdx.y != 0 || j >= cols) return;
  if (chunks == 1)
    cu_store(sum, j, dt, sh[0][threadIdx.x]);
  else
    part[blockIdx.y * cols + j] = sh[0][threadIdx.x];
}

template <int COLS, int LANES>
static void cu_gelu_bwd_colsum(cudaStream_t s, const gc_kargs *a, int64_t rows, int64_t cols,
                               int chunks) {
  dim3 grid((unsigned)((cols + COLS - 1) / COLS), (unsigned)chunks);
  k_gelu_bwd_colsum<COLS, LANES><<<grid, dim3(COLS, LANES), 0, s>>>(
      a->p[0], a->p[1], a->p[2], a->dt, rows, cols, chunks, a->p[3], (float *)a->p[4]);
}

gcap_status cu_activation(gcap_engine *e, cu_state *st, cudaStream_t s, int k, const gc_kargs *a) {
  int64_t n = a->n[0];
  if (n <= 0 && k == GC_K_GELU_BWD && a->p[3] != NULL && a->n[1] > 0) {
    gc_kargs zero; /* column sums over no rows */
    memset(&zero, 0, sizeof zero);
    zero.p[0] = a->p[3];
    zero.n[0] = a->n[1];
    zero.dt = a->dt;
    return cu_elementwise(e, st, s, GC_K_FILL, &zero);
  }
  if (n <= 0) return GCAP_OK;
  unsigned g = cu_blocks(n);
  switch (k) {
    case GC_K_RELU:
      k_relu<<<g, CU_THREADS, 0, s>>>(a->p[0], a->p[1], a->dt, n);
      break;
    case GC_K_RELU_BWD:
      k_relu_bwd<<<g, CU_THREADS, 0, s>>>(a->p[0], a->p[1], a->p[2], a->dt, n);
      break;
    case GC_K_GELU:
      k_gelu<<<g, CU_THREADS, 0, s>>>(a->p[0], a->p[1], a->dt, n);
      break;
    default: { /* GC_K_GELU_BWD */
      int64_t cols = a->n[1], rows = cols > 0 ? n / cols : 0;
      int chunks = a->p[4] != NULL ? GC_COLSUM_CHUNKS(rows) : 1;
      if (a->p[3] == NULL || cols <= 0) {
        k_gelu_bwd<<<g, CU_THREADS, 0, s>>>(a->p[0], a->p[1], a->p[2], a->dt, n);
        break;
      }
      if (rows / chunks <= 32)
        cu_gelu_bwd_colsum<8, 32>(s, a, rows, cols, chunks);
      else
        cu_gelu_bwd_colsum<32, 8>(s, a, rows, cols, chunks);
      if (chunks > 1) cu_join_chunks(s, a->p[3], (const float *)a->p[4], a->dt, cols, chunks);
      break;
    }
  }
  return GCAP_OK;
}
