/*
** common.cuh: what every file of the cuda backend shares: the error macros,
** the dtype helpers, the backend state and the per-family launchers.
** Internal to engine/src/cuda; nothing here is exported from the library.
*/
#ifndef GC_CUDA_COMMON_CUH
#define GC_CUDA_COMMON_CUH

#include <stddef.h>
#include <stdint.h>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "attn_cudnn.h"
#include "runtime/backend.h" /* C linkage through its own __cplusplus guard */

/* Return a device error through gc_fail, naming the call; never abort.
** cudaGetLastError consumes the error, so that a later launch check does not
** report it a second time (sticky errors stay and keep being reported). */
#define CUDA_TRY(e, call)                                                                          \
  do {                                                                                             \
    cudaError_t err_ = (call);                                                                     \
    if (err_ != cudaSuccess) {                                                                     \
      (void)cudaGetLastError();                                                                    \
      return gc_fail((e), GCAP_EDEVICE, "%s: %s (%s:%d)", #call, cudaGetErrorString(err_),         \
                     __FILE__, __LINE__);                                                          \
    }                                                                                              \
  } while (0)

/* The same for cuBLAS and cuBLASLt, which share cublasStatus_t. */
#define CUBLAS_TRY(e, call)                                                                        \
  do {                                                                                             \
    cublasStatus_t st_ = (call);                                                                   \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                              \
      return gc_fail((e), GCAP_EDEVICE, "%s: %s (%s:%d)", #call, cublasGetStatusString(st_),       \
                     __FILE__, __LINE__);                                                          \
  } while (0)

/* Teardown paths return nothing: drop their error, and consume it. */
static inline void cu_drop(cudaError_t err) {
  if (err != cudaSuccess) (void)cudaGetLastError();
}

/* Launch shape of the grid-stride kernels. */
#define CU_THREADS 256
#define CU_MAX_BLOCKS 65535

static inline unsigned cu_blocks(int64_t n) {
  int64_t b = (n + CU_THREADS - 1) / CU_THREADS;
  return (unsigned)(b < CU_MAX_BLOCKS ? b : CU_MAX_BLOCKS);
}

/* for (i = this thread's first index; i < n; i += all threads of the grid) */
#define CU_GRID_LOOP(i, n)                                                                         \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                        \
       i += (int64_t)gridDim.x * blockDim.x)

/* Element i of f32 or bf16 storage (dt = GCAP_F32 or GCAP_BF16), as a float;
** stores round to nearest even. */
__device__ __forceinline__ float cu_load(const void *p, int64_t i, int dt) {
  if (dt == GCAP_BF16) return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
  return ((const float *)p)[i];
}

__device__ __forceinline__ void cu_store(void *p, int64_t i, int dt, float v) {
  if (dt == GCAP_BF16)
    ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
  else
    ((float *)p)[i] = v;
}

/* Note bad id v at position i of an op's ids (GC_BADID_*) in graph gid, of
** which count are valid, in the bad-id flag f (NULL: none), unless an
** earlier one is there: the first thread to claim the flag writes its words,
** makes them visible to the host, then marks the flag set. */
__device__ __forceinline__ void cu_badid_note(void *f, int op, int64_t gid, int64_t i, float v,
                                              int64_t count) {
  volatile unsigned *w = (volatile unsigned *)f;
  if (f == NULL || atomicCAS((unsigned *)f, 0u, 1u) != 0u) return;
  w[GC_BADID_OP] = (unsigned)op;
  w[GC_BADID_GRAPH] = (unsigned)gid;
  w[GC_BADID_GRAPH + 1] = (unsigned)((unsigned long long)gid >> 32);
  w[GC_BADID_INDEX] = (unsigned)i;
  w[GC_BADID_INDEX + 1] = (unsigned)((unsigned long long)i >> 32);
  w[GC_BADID_VALUE] = __float_as_uint(v);
  w[GC_BADID_COUNT] = (unsigned)count;
  __threadfence_system();
  atomicExch((unsigned *)f, 2u);
}

/* v as dt stores it (bf16: rounded to nearest even). */
__device__ __forceinline__ float cu_round(float v, int dt) {
  return dt == GCAP_BF16 ? __bfloat162float(__float2bfloat16_rn(v)) : v;
}

/* 16 bytes of f32 or bf16 elements, loaded and stored at once. */
union cu_pack {
  uint4 v;
  float f[4];
  __nv_bfloat162 h[4];
};

/* The number of 16-byte packs of a launch over n elements of dt whose
** pointers (NULL: unused) are all 16-byte aligned; 0 when it does not split
** into whole packs. */
static inline int64_t cu_packs(int64_t n, int dt, const void *p0, const void *p1, const void *p2) {
  int64_t per = dt == GCAP_BF16 ? 8 : 4;
  uintptr_t any = (uintptr_t)p0 | (uintptr_t)p1 | (uintptr_t)p2;
  return n % per == 0 && any % 16 == 0 ? n / per : 0;
}

/* Row kernels (layernorm, softmax, cross entropy): one block of
** CU_ROW_THREADS threads per row, blocks looping over rows when there are
** more rows than blocks. A row is always reduced by one block in one order,
** so the result does not depend on the grid nor on timing. */
#define CU_ROW_THREADS 256

static inline unsigned cu_row_blocks(int64_t rows) {
  return (unsigned)(rows < CU_MAX_BLOCKS ? rows : CU_MAX_BLOCKS);
}

/* for (r = this block's first row; r < rows; r += all blocks): every thread
** of a block takes the same rows, so all reach the block reductions' barriers. */
#define CU_ROW_LOOP(r, rows) for (int64_t r = blockIdx.x; r < (rows); r += gridDim.x)

/* v combined over the block's CU_ROW_THREADS threads by op (a fixed
** shared-memory tree: the same order on every call), returned to every
** thread; sh holds CU_ROW_THREADS floats. Every thread of the block must
** call it; sh may be reused right after. */
template <typename Op> __device__ __forceinline__ float cu_block_reduce(float v, float *sh, Op op) {
  int t = (int)threadIdx.x;
  sh[t] = v;
  __syncthreads();
  for (int w = CU_ROW_THREADS / 2; w > 0; w /= 2) {
    if (t < w) sh[t] = op(sh[t], sh[t + w]);
    __syncthreads();
  }
  float r = sh[0];
  __syncthreads(); /* all have read sh[0] before anyone writes sh again */
  return r;
}

__device__ __forceinline__ float cu_block_sum(float v, float *sh) {
  return cu_block_reduce(v, sh, [](float a, float b) { return __fadd_rn(a, b); });
}

/* fmaxf: a NaN loses to a number, as on the host. */
__device__ __forceinline__ float cu_block_max(float v, float *sh) {
  return cu_block_reduce(v, sh, [](float a, float b) { return fmaxf(a, b); });
}

/* One block per row: the row's max and the sum of exp(x - max) over its
** cols elements at offset o, in a fixed order (the same on every call). */
__device__ __forceinline__ void cu_row_exp_stats(const void *x, int64_t o, int64_t cols, int dt,
                                                 float *sh, float *mx_out, float *s_out) {
  float mx = -INFINITY, s = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += CU_ROW_THREADS)
    mx = fmaxf(mx, cu_load(x, o + c, dt));
  mx = cu_block_max(mx, sh);
  for (int64_t c = threadIdx.x; c < cols; c += CU_ROW_THREADS)
    s = __fadd_rn(s, expf(__fsub_rn(cu_load(x, o + c, dt), mx)));
  *mx_out = mx;
  *s_out = cu_block_sum(s, sh);
}

/* cuBLAS workspace: 32 MiB, what Hopper wants. */
#define CU_WORKSPACE ((size_t)32 << 20)

/* The backend state (the `bs` of every gc_backend call). */
typedef struct cu_state {
  int dev;                  /* device id */
  cublasHandle_t blas;      /* created at init, before any capture */
  cublasLtHandle_t lt;      /* idem; its calls take ws explicitly */
  void *ws;                 /* CU_WORKSPACE bytes of device memory */
  cudaStream_t upload;      /* non-blocking stream for cudaGraphUpload */
  cudaStream_t blas_stream; /* the stream the cuBLAS handle is pointed at */
  struct cu_plan *plans;    /* GEMMs planned so far (k_linalg.cu) */
  int nplans, capplans;
  struct cu_fp8_plan *fp8plans; /* FP8 GEMMs planned so far (k_fp8_gemm.cu) */
  int nfp8plans, capfp8plans;
  cu_dnn *dnn; /* cuDNN's attention (attn_cudnn.cpp): NULL until first asked for */
} cu_state;

/* Free the GEMM plans (k_linalg.cu) and the FP8 GEMM plans (k_fp8_gemm.cu). */
void cu_plans_free(cu_state *st);
void cu_fp8_plans_free(cu_state *st);

/* Point the cuBLAS handle at stream s, when it is not already. cublasSetStream
** resets the handle's workspace (cuBLAS would then allocate during capture and
** put memory nodes into the graph), so the workspace is set again right after. */
static inline gcap_status cu_blas_stream(gcap_engine *e, cu_state *st, cudaStream_t s) {
  if (st->blas_stream == s) return GCAP_OK;
  CUBLAS_TRY(e, cublasSetStream(st->blas, s));
  CUBLAS_TRY(e, cublasSetWorkspace(st->blas, st->ws, CU_WORKSPACE));
  st->blas_stream = s;
  return GCAP_OK;
}

/* y[j] = part[0][j] + part[1][j] + ... (chunks rows of cols f32 partial
** column sums, added in an order fixed by chunks), stored as dt
** (k_reduce.cu). */
void cu_join_chunks(cudaStream_t s, void *y, const float *part, int dt, int64_t cols, int chunks);

/* y (cols, dt) = the columns of x [rows x cols] (dt) summed: with part (a
** scratch of chunks * cols floats, chunks > 1), in chunks of rows joined in
** a fixed order; else one thread a column over all rows (k_linalg.cu). */
void cu_sum_rows(cudaStream_t s, void *y, const void *x, int dt, int64_t rows, int64_t cols,
                 float *part, int chunks);

/* c [n / cols rows x cols] = alpha * (a sum of no products) + beta * c
** (beta 0: c not read) + the bias row (NULL: none): a GEMM whose inner dim
** is 0, as the host computes it (k_linalg.cu). */
void cu_matmul_k0(cudaStream_t s, void *c, const void *bias, int dt, int64_t n, int64_t cols,
                  float alpha, float beta);

/* The alignment, up to 256 bytes, of every pointer of a GEMM's launch (its
** p[0] .. p[5]); and the algorithm cuBLASLt's heuristic puts first for op
** over la, lb and lc (C and D) with operands aligned to align bytes,
** CU_WORKSPACE of workspace and reductions that do not depend on timing:
** *ok 1 and *algo, or *ok 0 where it has none or refuses the preference
** (the caller runs its fallback). k_linalg.cu. */
uint32_t cu_gemm_align(const gc_kargs *a);
gcap_status cu_lt_pick(gcap_engine *e, cu_state *st, cublasLtMatmulDesc_t op,
                       cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb,
                       cublasLtMatrixLayout_t lc, uint32_t align, cublasLtMatmulAlgo_t *algo,
                       int *ok);

/* A new zeroed element of sz bytes at the end of the array *v of *n (its
** room *cap doubled when full): the plan caches' growth. NULL: out of host
** memory, with nothing changed. backend.cu. */
void *cu_push(void **v, int *n, int *cap, size_t sz);
/* Destroy a cuBLASLt plan's descriptors (NULL ones skipped). backend.cu. */
void cu_lt_release(cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb,
                   cublasLtMatrixLayout_t lc);

/* Kernel families, one file each. A launcher enqueues kernel k (one of its
** family) on s; backend.cu checks cudaGetLastError after it. */
gcap_status cu_elementwise(gcap_engine *e, cu_state *st, cudaStream_t s, int k,
                           const gc_kargs *a); /* k_elementwise.cu */
gcap_status cu_reduce(gcap_engine *e, cu_state *st, cudaStream_t s, int k,
                      const gc_kargs *a); /* k_reduce.cu */
gcap_status cu_rand(gcap_engine *e, cu_state *st, cudaStream_t s, int k,
                    const gc_kargs *a); /* k_rand.cu */
gcap_status cu_linalg(gcap_engine *e, cu_state *st, cudaStream_t s, int k,
                      const gc_kargs *a); /* k_linalg.cu */
gcap_status cu_activation(gcap_engine *e, cu_state *st, cudaStream_t s, int k,
                          const gc_kargs *a); /* k_activation.cu */
gcap_status cu_norm(gcap_engine *e, cu_state *st, cudaStream_t s, int k,
                    const gc_kargs *a); /* k_norm.cu */
gcap_status cu_loss(gcap_engine *e, cu_state *st, cudaStream_t s, int k,
                    const gc_kargs *a); /* k_loss.cu */
gcap_status cu_optim(gcap_engine *e, cu_state *st, cudaStream_t s, int k,
                     const gc_kargs *a); /* k_optim.cu */
gcap_status cu_arith(gcap_engine *e, cu_state *st, cudaStream_t s, int k,
                     const gc_kargs *a); /* k_arith.cu */
gcap_status cu_shape(gcap_engine *e, cu_state *st, cudaStream_t s, int k,
                     const gc_kargs *a); /* k_shape.cu */
gcap_status cu_mask(gcap_engine *e, cu_state *st, cudaStream_t s, int k,
                    const gc_kargs *a); /* k_mask.cu */
gcap_status cu_embed(gcap_engine *e, cu_state *st, cudaStream_t s, int k,
                     const gc_kargs *a); /* k_embed.cu */
gcap_status cu_attn(gcap_engine *e, cu_state *st, cudaStream_t s, int k,
                    const gc_kargs *a); /* k_attn.cu */
gcap_status cu_fp8(gcap_engine *e, cu_state *st, cudaStream_t s, int k,
                   const gc_kargs *a); /* k_fp8.cu */
gcap_status cu_fp8_gemm(gcap_engine *e, cu_state *st, cudaStream_t s, int k,
                        const gc_kargs *a); /* k_fp8_gemm.cu */

/* The backend table's communicators and collectives (nccl.cu). */
gcap_status cu_comm_id(gcap_engine *e, void *bs, unsigned char id[GC_COMM_ID_BYTES]);
gcap_status cu_comm_new(gcap_engine *e, void *bs, const unsigned char id[GC_COMM_ID_BYTES],
                        int nranks, int rank, int local_rank, void **comm);
void cu_comm_free(void *bs, void *comm);
gcap_status cu_collective(gcap_engine *e, void *bs, void *s, const gc_coll *c);

#endif
