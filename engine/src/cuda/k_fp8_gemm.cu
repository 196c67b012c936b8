/*
** k_fp8_gemm.cu: GC_K_FP8_GEMM, cuBLASLt's FP8 GEMM (compute capability
** 8.9 and later).
**
** C [m x n] = A B^T with A [m x k] and B [n x k] row-major, each row ld
** bytes: read column-major, B is cuBLAS's first operand (k x n, transposed)
** and A its second (k x m, not), the "TN" layout its FP8 GEMMs require,
** and C^T (n x m, ld n) its D. The operands' scale inverses are its A and B
** scale pointers (B's and A's, in that order), f32 compute, D (and C) of the
** module's dtype. The bias and gelu (+ pre-activation) ride on the epilogue
** where cuBLASLt has a plan for them; otherwise the plain FP8 GEMM runs and
** our kernels do the rest (the bias filled into the target and added with
** beta = 1; the gelu from the pre-activation). One plan per shape, built at
** the first launch (outside capture in a warmup) and cached, so eager calls
** and replays run the same kernel; reductions without atomics. A shape
** cuBLASLt has no FP8 GEMM for is an error naming it: never a silent
** fallback to another precision.
*/
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "common.cuh"

/* Epilogues: none, a bias row, gelu with the pre-activation kept, both. */
enum { F8_EPI_NONE, F8_EPI_BIAS, F8_EPI_GELU, F8_EPI_GELU_BIAS };

typedef struct cu_fp8_plan {
  int64_t m, n, ld;
  int fa, fb, dt, epi, fast;
  uint32_t align;
  int ok; /* 0: the heuristic found no algorithm */
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, lc;
  cublasLtMatmulAlgo_t algo;
} cu_fp8_plan;

void cu_fp8_plans_free(cu_state *st) {
  for (int i = 0; i < st->nfp8plans; i++) {
    cu_fp8_plan *p = &st->fp8plans[i];
    cu_lt_release(p->op, p->la, p->lb, p->lc);
  }
  free(st->fp8plans);
  st->fp8plans = NULL;
  st->nfp8plans = st->capfp8plans = 0;
}

static cudaDataType_t f8_type(int64_t f) {
  return f == GCAP_FP8_E5M2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3;
}

/* The plan of a's shape with epilogue epi: found in the cache or built
** (p->ok says whether the heuristic found an algorithm). */
static gcap_status f8_plan_build(gcap_engine *e, cu_state *st, cu_fp8_plan *p);

static gcap_status f8_plan_for(gcap_engine *e, cu_state *st, const gc_kargs *a, int epi,
                               cu_fp8_plan **out) {
  int64_t m = a->n[0], n = a->n[1], ld = a->n[3];
  int fa = (int)a->n[5], fb = (int)a->n[6], dt = a->dt, fast = a->n[4] == 1;
  uint32_t align = cu_gemm_align(a);
  cu_fp8_plan *p;
  gcap_status r;
  for (int i = 0; i < st->nfp8plans; i++) {
    p = &st->fp8plans[i];
    if (p->m == m && p->n == n && p->ld == ld && p->fa == fa && p->fb == fb && p->dt == dt &&
        p->epi == epi && p->fast == fast && p->align == align) {
      *out = p;
      return GCAP_OK;
    }
  }
  p = (cu_fp8_plan *)cu_push((void **)&st->fp8plans, &st->nfp8plans, &st->capfp8plans, sizeof *p);
  if (p == NULL) return gc_fail(e, GCAP_ENOMEM, "cuda: out of host memory");
  p->m = m, p->n = n, p->ld = ld, p->fa = fa, p->fb = fb, p->dt = dt, p->epi = epi;
  p->fast = fast, p->align = align;
  *out = p;
  if (align < 16) return GCAP_OK;                 /* FP8 operands want 16 bytes: no plan */
  if ((r = f8_plan_build(e, st, p)) != GCAP_OK) { /* no half-made plan is kept */
    cu_lt_release(p->op, p->la, p->lb, p->lc);
    st->nfp8plans--;
    *out = NULL;
  }
  return r;
}

/* The descriptors of plan p (its shape set) and its algorithm. */
static gcap_status f8_plan_build(gcap_engine *e, cu_state *st, cu_fp8_plan *p) {
  int64_t m = p->m, n = p->n, ld = p->ld;
  int fa = p->fa, fb = p->fb, epi = p->epi;
  cudaDataType_t t = p->dt == GCAP_BF16 ? CUDA_R_16BF : CUDA_R_32F;
  cublasOperation_t opt = CUBLAS_OP_T, opn = CUBLAS_OP_N;
  int8_t fa8 = (int8_t)p->fast;
  CUBLAS_TRY(e, cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  CUBLAS_TRY(e,
             cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &opt, sizeof opt));
  CUBLAS_TRY(e,
             cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &opn, sizeof opn));
  CUBLAS_TRY(
      e, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fa8, sizeof fa8));
  if (epi != F8_EPI_NONE) {
    static const cublasLtEpilogue_t eps[] = {CUBLASLT_EPILOGUE_DEFAULT, CUBLASLT_EPILOGUE_BIAS,
                                             CUBLASLT_EPILOGUE_GELU_AUX,
                                             CUBLASLT_EPILOGUE_GELU_AUX_BIAS};
    cublasLtEpilogue_t ep = eps[epi];
    int64_t aux_ld = n; /* the pre-activation is laid out as D */
    CUBLAS_TRY(
        e, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep));
    if (epi != F8_EPI_GELU)
      CUBLAS_TRY(e, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &t,
                                                   sizeof t));
    if (epi != F8_EPI_BIAS)
      CUBLAS_TRY(e, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                   &aux_ld, sizeof aux_ld));
  }
  CUBLAS_TRY(e, cublasLtMatrixLayoutCreate(&p->la, f8_type(fb), ld, n, ld));
  CUBLAS_TRY(e, cublasLtMatrixLayoutCreate(&p->lb, f8_type(fa), ld, m, ld));
  CUBLAS_TRY(e, cublasLtMatrixLayoutCreate(&p->lc, t, n, m, n));
  return cu_lt_pick(e, st, p->op, p->la, p->lb, p->lc, p->align, &p->algo, &p->ok);
}

/* Run plan p into C (dst, beta) with a's operands; vec: the bias, aux: the
** pre-activation (either NULL where the plan has none). */
static gcap_status f8_run(gcap_engine *e, cu_state *st, cudaStream_t s, cu_fp8_plan *p,
                          const gc_kargs *a, void *dst, float beta, const void *vec, void *aux) {
  /* per-call settings of the plan: cuBLAS's A is our B, its B our A */
  CUBLAS_TRY(e, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                               &a->p[7], sizeof a->p[7]));
  CUBLAS_TRY(e, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                               &a->p[6], sizeof a->p[6]));
  if (vec != NULL)
    CUBLAS_TRY(e, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &vec,
                                                 sizeof vec));
  if (aux != NULL)
    CUBLAS_TRY(e, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                 &aux, sizeof aux));
  CUBLAS_TRY(e, cublasLtMatmul(st->lt, p->op, &a->f[0], a->p[2], p->la, a->p[1], p->lb, &beta, dst,
                               p->lc, dst, p->lc, &p->algo, st->ws, CU_WORKSPACE, s));
  return GCAP_OK;
}

/* y [rows x cols] = the bias row b in every row. */
static __global__ void k_f8_bias_rows(void *y, const void *b, int dt, int64_t n, int64_t cols) {
  CU_GRID_LOOP(i, n) cu_store(y, i, dt, cu_load(b, i % cols, dt));
}

static gcap_status f8_fail(gcap_engine *e, const gc_kargs *a, const char *why) {
  static const char *const fmt[] = {"E4M3", "E5M2"};
  return gc_fail(e, GCAP_EDEVICE,
                 "cuda: cuBLASLt has no FP8 GEMM for [%lld x %lld] = %s [%lld x %lld] x %s "
                 "[%lld x %lld]^T (rows %lld bytes, output %s)%s",
                 (long long)a->n[0], (long long)a->n[1], fmt[a->n[5] == GCAP_FP8_E5M2],
                 (long long)a->n[0], (long long)a->n[2], fmt[a->n[6] == GCAP_FP8_E5M2],
                 (long long)a->n[1], (long long)a->n[2], (long long)a->n[3],
                 a->dt == GCAP_BF16 ? "bf16" : "f32", why);
}

/* C = gelu(pre), pre written by the GEMM with its bias. */
static gcap_status f8_gelu(gcap_engine *e, cu_state *st, cudaStream_t s, const gc_kargs *a) {
  gc_kargs act;
  memset(&act, 0, sizeof act);
  act.p[0] = a->p[0];
  act.p[1] = a->p[5];
  act.n[0] = a->n[0] * a->n[1];
  act.dt = a->dt;
  return cu_activation(e, st, s, GC_K_GELU, &act);
}

gcap_status cu_fp8_gemm(gcap_engine *e, cu_state *st, cudaStream_t s, int, const gc_kargs *a) {
  int64_t m = a->n[0], n = a->n[1], ld = a->n[3];
  void *bias = a->p[3], *pre = a->p[5];
  cu_fp8_plan *p = NULL;
  gcap_status r;
  if (m <= 0 || n <= 0) return GCAP_OK;
  if (a->n[2] <= 0) { /* no products (the wgrad of an empty batch): as the host */
    cu_matmul_k0(s, pre != NULL ? pre : a->p[0], bias, a->dt, m * n, n, a->f[0],
                 pre != NULL ? 0.0f : a->f[1]);
    return pre != NULL ? f8_gelu(e, st, s, a) : GCAP_OK;
  }
  if (m > INT_MAX || n > INT_MAX || ld > INT_MAX || ld % 16 != 0 || ld < a->n[2])
    return f8_fail(e, a, ": its rows must be a multiple of 16 bytes, its dims in int range");
  /* The epilogue first: cuBLASLt's FP8 GEMMs with an f32 output take a
  ** bf16 bias only, so an f32 bias is added by the fallback. */
  if (bias != NULL || pre != NULL) {
    int epi = pre != NULL ? (bias != NULL ? F8_EPI_GELU_BIAS : F8_EPI_GELU) : F8_EPI_BIAS;
    if ((bias == NULL || a->dt == GCAP_BF16) && (pre == NULL || n % 8 == 0)) {
      if ((r = f8_plan_for(e, st, a, epi, &p)) != GCAP_OK) return r;
      if (p->ok) return f8_run(e, st, s, p, a, a->p[0], a->f[1], bias, pre);
    }
  }
  if ((r = f8_plan_for(e, st, a, F8_EPI_NONE, &p)) != GCAP_OK) return r;
  if (!p->ok)
    return f8_fail(e, a, cu_gemm_align(a) < 16 ? ": its operands are not 16-byte aligned" : "");
  if (bias == NULL && pre == NULL) return f8_run(e, st, s, p, a, a->p[0], a->f[1], NULL, NULL);
  /* the target (C, or the pre-activation) = the bias rows, then += A B^T */
  void *dst = pre != NULL ? pre : a->p[0];
  float beta = a->f[1];
  if (bias != NULL) {
    k_f8_bias_rows<<<cu_blocks(m * n), CU_THREADS, 0, s>>>(dst, bias, a->dt, m * n, n);
    beta = 1.0f;
  }
  if ((r = f8_run(e, st, s, p, a, dst, beta, NULL, NULL)) != GCAP_OK || pre == NULL) return r;
  return f8_gelu(e, st, s, a);
}
