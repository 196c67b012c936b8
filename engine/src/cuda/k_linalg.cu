/*
** k_linalg.cu: GC_K_EXPAND, GC_K_SUM_ROWS and GC_K_MATMUL.
**
** expand and sum_rows use round-to-nearest intrinsics in the host's order
** (sum_rows: one thread per column adding the rows in order, no atomics), so
** their f32 results equal the host reference bit for bit. matmul is
** cuBLASLt with one plan per shape (cuBLAS when no plan is found): float
** accumulation in its own order (within float tolerance of the host), the
** same kernel eagerly and in a replay.
*/
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "common.cuh"

/* y[i] = f * x[i % nx]: the gradient of sum/mean, or of a broadcast. */
static __global__ void k_expand(void *y, const void *x, int64_t nx, int dt, int64_t n, float f) {
  CU_GRID_LOOP(i, n) cu_store(y, i, dt, __fmul_rn(f, cu_load(x, i % nx, dt)));
}

/* The same for one value spread over whole 16-byte packs (the grad of a
** sum): no modulo, 16 bytes per store. */
static __global__ void k_spread(uint4 *y, const void *x, int dt, int64_t npack, float f) {
  float v = __fmul_rn(f, cu_load(x, 0, dt));
  cu_pack p;
  for (int w = 0; w < 4; w++) {
    if (dt == GCAP_BF16)
      p.h[w] = __float22bfloat162_rn(make_float2(v, v));
    else
      p.f[w] = v;
  }
  CU_GRID_LOOP(i, npack) y[i] = p.v;
}

/* y[j] = x[0][j] + x[1][j] + ..., left to right. Adjacent threads read
** adjacent columns, so each row's reads are coalesced. */
static __global__ void k_sum_rows(void *y, const void *x, int dt, int64_t rows, int64_t cols) {
  CU_GRID_LOOP(j, cols) {
    float s = 0.0f;
    for (int64_t i = 0; i < rows; i++)
      s = __fadd_rn(s, cu_load(x, i * cols + j, dt));
    cu_store(y, j, dt, s);
  }
}

/* Many rows: chunk c (blockIdx.y) of the rows summed per column into
** part[c][j], then the chunks joined in a fixed order: parallel, and the same
** result whatever the timing. */
static __global__ void k_sum_rows_part(float *part, const void *x, int dt, int64_t rows,
                                       int64_t cols, int chunks) {
  int64_t lo = rows * blockIdx.y / chunks, hi = rows * (blockIdx.y + 1) / chunks;
  CU_GRID_LOOP(j, cols) {
    float s = 0.0f;
    for (int64_t i = lo; i < hi; i++)
      s = __fadd_rn(s, cu_load(x, i * cols + j, dt));
    part[blockIdx.y * cols + j] = s;
  }
}

void cu_sum_rows(cudaStream_t s, void *y, const void *x, int dt, int64_t rows, int64_t cols,
                 float *part, int chunks) {
  if (cols <= 0) return;
  if (chunks > 1 && part != NULL) {
    dim3 grid(cu_blocks(cols), (unsigned)chunks);
    k_sum_rows_part<<<grid, CU_THREADS, 0, s>>>(part, x, dt, rows, cols, chunks);
    cu_join_chunks(s, y, part, dt, cols, chunks);
    return;
  }
  k_sum_rows<<<cu_blocks(cols), CU_THREADS, 0, s>>>(y, x, dt, rows, cols);
}

/* matmul with k = 0: C = alpha * 0 + beta * C (+ bias row of n), as the host
** computes it (C is not read when beta = 0). cuBLAS is not asked, as it
** wants ld >= 1. */
static __global__ void k_matmul_k0(void *c, const void *bias, int dt, int64_t n, int64_t cols,
                                   float alpha, float beta) {
  CU_GRID_LOOP(i, n) {
    float s = __fmul_rn(0.0f, alpha);
    if (beta != 0.0f) s = __fadd_rn(s, __fmul_rn(beta, cu_load(c, i, dt)));
    if (bias != NULL) s = __fadd_rn(s, cu_load(bias, i % cols, dt));
    cu_store(c, i, dt, s);
  }
}

void cu_matmul_k0(cudaStream_t s, void *c, const void *bias, int dt, int64_t n, int64_t cols,
                  float alpha, float beta) {
  k_matmul_k0<<<cu_blocks(n), CU_THREADS, 0, s>>>(c, bias, dt, n, cols, alpha, beta);
}

/*
** A GEMM shape planned once: cuBLASLt descriptors and the algorithm its
** heuristic picked, reused by every later call of that shape, eager or
** captured, so both run the same kernel (bitwise equal results) and a call
** costs no heuristic search. Reductions are restricted to schemes without
** atomics, so results do not depend on timing. Batched products (strided,
** a stride 0 reusing one matrix) are planned the same way.
*/
typedef struct cu_plan {
  int64_t m, n, k;
  int64_t batch, sa, sb; /* batched: count, and A's and B's strides (elements) */
  int ta, tb, dt;
  int epi;        /* CU_EPI_*: what rides on the GEMM */
  uint32_t align; /* the bytes every pointer of its launches is aligned to, up to 256 */
  int ok;         /* 0: the heuristic found nothing; plain cuBLAS (and kernels) are used */
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, lc;
  cublasLtMatmulAlgo_t algo;
} cu_plan;

void cu_plans_free(cu_state *st) {
  int i;
  for (i = 0; i < st->nplans; i++) {
    cu_plan *p = &st->plans[i];
    cu_lt_release(p->op, p->la, p->lb, p->lc);
  }
  free(st->plans);
  st->plans = NULL;
  st->nplans = st->capplans = 0;
}

/* Epilogues: a bias row added to C (in cuBLAS's terms, one value per row of
** its column-major D), the bias grad of the second operand (summed over k,
** one value per column of D), or gelu with the pre-activation kept (aux),
** after a bias or without one. */
enum { CU_EPI_NONE, CU_EPI_BIAS, CU_EPI_BGRAD, CU_EPI_GELU, CU_EPI_GELU_BIAS };

/* Make layout l hold `count` matrices `stride` elements apart. */
static cublasStatus_t cu_layout_batch(cublasLtMatrixLayout_t l, int32_t count, int64_t stride) {
  cublasStatus_t r =
      cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count);
  if (r != CUBLAS_STATUS_SUCCESS) return r;
  return cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                          sizeof stride);
}

/* The alignment, up to 256 bytes, of every pointer of a GEMM's launch (C, A,
** B, the bias or its grad, the pre-activation). cuBLASLt picks algorithms
** for 256-byte aligned operands unless told less, and a view at an offset
** (an entry t[i] of a tensor) can be less aligned than the allocator's
** blocks. */
uint32_t cu_gemm_align(const gc_kargs *a) {
  uintptr_t any = 256;
  for (int i = 0; i < 6; i++)
    any |= (uintptr_t)a->p[i];
  return (uint32_t)(any & (~any + 1));
}

/* The plan of C^T (n x m) = op(B)^T op(A)^T in cuBLAS's column-major terms:
** first operand B (n x k after opb), second A (k x m after opa). One per
** shape and alignment: operands aligned less than 256 bytes get algorithms
** that take them, or none (then cuBLAS's own GEMM runs, which takes any),
** and an epilogue's vectors are not given to cuBLASLt below 16 bytes. */
static gcap_status cu_plan_build(gcap_engine *e, cu_state *st, cu_plan *p, cudaDataType_t t,
                                 cublasOperation_t opa, cublasOperation_t opb);

static gcap_status cu_plan_for(gcap_engine *e, cu_state *st, const gc_kargs *a, int epi,
                               cu_plan **out) {
  gcap_status r;
  int64_t m = a->n[0], n = a->n[1], k = a->n[2];
  uint32_t align = cu_gemm_align(a);
  int64_t batch = a->n[5] > 1 ? a->n[5] : 1, sa = batch > 1 ? a->n[6] : 0,
          sb = batch > 1 ? a->n[7] : 0;
  int ta = a->n[3] != 0, tb = a->n[4] != 0, dt = a->dt;
  cublasOperation_t opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  cudaDataType_t t = dt == GCAP_BF16 ? CUDA_R_16BF : CUDA_R_32F;
  cu_plan *p;
  for (int i = 0; i < st->nplans; i++) {
    p = &st->plans[i];
    if (p->m == m && p->n == n && p->k == k && p->batch == batch && p->sa == sa && p->sb == sb &&
        p->ta == ta && p->tb == tb && p->dt == dt && p->epi == epi && p->align == align) {
      *out = p;
      return GCAP_OK;
    }
  }
  p = (cu_plan *)cu_push((void **)&st->plans, &st->nplans, &st->capplans, sizeof *p);
  if (p == NULL) return gc_fail(e, GCAP_ENOMEM, "cuda: out of host memory");
  p->m = m, p->n = n, p->k = k, p->ta = ta, p->tb = tb, p->dt = dt, p->epi = epi;
  p->align = align;
  p->batch = batch, p->sa = sa, p->sb = sb;
  *out = p;
  if ((r = cu_plan_build(e, st, p, t, opa, opb)) != GCAP_OK) { /* no half-made plan is kept */
    cu_lt_release(p->op, p->la, p->lb, p->lc);
    st->nplans--;
    *out = NULL;
  }
  return r;
}

/* The descriptors of plan p (its shape set) and its algorithm. */
static gcap_status cu_plan_build(gcap_engine *e, cu_state *st, cu_plan *p, cudaDataType_t t,
                                 cublasOperation_t opa, cublasOperation_t opb) {
  int64_t m = p->m, n = p->n, k = p->k, batch = p->batch;
  int ta = p->ta, tb = p->tb, epi = p->epi;
  uint32_t align = p->align;
  CUBLAS_TRY(e, cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  if (epi != CU_EPI_NONE) {
    static const cublasLtEpilogue_t eps[] = {CUBLASLT_EPILOGUE_DEFAULT, CUBLASLT_EPILOGUE_BIAS,
                                             CUBLASLT_EPILOGUE_BGRADB, CUBLASLT_EPILOGUE_GELU_AUX,
                                             CUBLASLT_EPILOGUE_GELU_AUX_BIAS};
    cublasLtEpilogue_t ep = eps[epi];
    int64_t ld = n; /* the pre-activation is laid out as D */
    CUBLAS_TRY(
        e, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep));
    if (epi != CU_EPI_GELU)
      CUBLAS_TRY(e, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &t,
                                                   sizeof t));
    if (epi == CU_EPI_GELU || epi == CU_EPI_GELU_BIAS)
      CUBLAS_TRY(e, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld,
                                                   sizeof ld));
  }
  CUBLAS_TRY(e,
             cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &opb, sizeof opb));
  CUBLAS_TRY(e,
             cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &opa, sizeof opa));
  CUBLAS_TRY(e, cublasLtMatrixLayoutCreate(&p->la, t, tb ? k : n, tb ? n : k, tb ? k : n));
  CUBLAS_TRY(e, cublasLtMatrixLayoutCreate(&p->lb, t, ta ? m : k, ta ? k : m, ta ? m : k));
  CUBLAS_TRY(e, cublasLtMatrixLayoutCreate(&p->lc, t, n, m, n));
  if (batch > 1) { /* strided batches: B is cuBLAS's first operand, A its second */
    int32_t count = (int32_t)batch;
    int64_t sc = m * n;
    CUBLAS_TRY(e, cu_layout_batch(p->la, count, p->sb));
    CUBLAS_TRY(e, cu_layout_batch(p->lb, count, p->sa));
    CUBLAS_TRY(e, cu_layout_batch(p->lc, count, sc));
  }
  if (align < 16 && epi != CU_EPI_NONE) return GCAP_OK; /* our kernels do the epilogue */
  return cu_lt_pick(e, st, p->op, p->la, p->lb, p->lc, align, &p->algo, &p->ok);
}

gcap_status cu_lt_pick(gcap_engine *e, cu_state *st, cublasLtMatmulDesc_t op,
                       cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb,
                       cublasLtMatrixLayout_t lc, uint32_t align, cublasLtMatmulAlgo_t *algo,
                       int *ok) {
  static const cublasLtMatmulPreferenceAttributes_t mins[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  cublasLtMatmulPreference_t pref = NULL;
  cublasLtMatmulHeuristicResult_t res;
  uint64_t ws = CU_WORKSPACE;
  uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE |
                     CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;
  int found = 0, i;
  *ok = 0;
  CUBLAS_TRY(e, cublasLtMatmulPreferenceCreate(&pref));
  for (i = 0; align < 256 && i < 4; i++)
    if (cublasLtMatmulPreferenceSetAttribute(pref, mins[i], &align, sizeof align) !=
        CUBLAS_STATUS_SUCCESS) {
      cublasLtMatmulPreferenceDestroy(pref);
      return GCAP_OK; /* no plan */
    }
  if (cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                           sizeof ws) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                           &schemes, sizeof schemes) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatmulAlgoGetHeuristic(st->lt, op, la, lb, lc, lc, pref, 1, &res, &found) ==
          CUBLAS_STATUS_SUCCESS &&
      found > 0) {
    *algo = res.algo;
    *ok = 1;
  }
  cublasLtMatmulPreferenceDestroy(pref);
  return GCAP_OK;
}

/* Row-major C [m x n] = alpha op(A) op(B) + beta C, the one place where the
** engine's row-major layout meets cuBLAS's column-major one.
**
** A row-major r x c matrix read column-major is its c x r transpose, so C^T
** (n x m, ldc = n) = op(B)^T op(A)^T: cuBLAS gets B as its first operand and
** A as its second, with m and n swapped, and each operand keeps its own
** transpose flag. B's storage is k x n (ld n), or n x k (ld k) when
** transposed; A's is m x k (ld k), or k x m (ld m) when transposed. */
static gcap_status cu_blas_gemm(gcap_engine *e, cu_state *st, const gc_kargs *a,
                                cublasOperation_t opb, cublasOperation_t opa, int64_t m, int64_t n,
                                int64_t k, float alpha, float beta);

static gcap_status cu_matmul(gcap_engine *e, cu_state *st, cudaStream_t s, const gc_kargs *a);

/* C = gelu(op(A) op(B) + bias) with the pre-activation into p[5]: one GEMM
** whose epilogue applies the gelu, or, where cuBLASLt has no such plan (or
** the pre-activation's leading dimension is not a multiple of 8, as it
** wants), the GEMM into p[5] and our gelu kernel from there. */
static gcap_status cu_matmul_gelu(gcap_engine *e, cu_state *st, cudaStream_t s, const gc_kargs *a) {
  int64_t m = a->n[0], n = a->n[1], k = a->n[2];
  gc_kargs pre = *a, act;
  gcap_status r;
  if (k > 0 && n % 8 == 0) {
    int epi = a->p[3] ? CU_EPI_GELU_BIAS : CU_EPI_GELU;
    cu_plan *p = NULL;
    if ((r = cu_plan_for(e, st, a, epi, &p)) != GCAP_OK) return r;
    if (p->ok) {
      if (a->p[3])
        CUBLAS_TRY(e, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                     &a->p[3], sizeof a->p[3]));
      CUBLAS_TRY(e, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                   &a->p[5], sizeof a->p[5]));
      CUBLAS_TRY(e,
                 cublasLtMatmul(st->lt, p->op, &a->f[0], a->p[2], p->la, a->p[1], p->lb, &a->f[1],
                                a->p[0], p->lc, a->p[0], p->lc, &p->algo, st->ws, CU_WORKSPACE, s));
      return GCAP_OK;
    }
  }
  pre.p[0] = a->p[5];
  pre.p[5] = NULL;
  if ((r = cu_matmul(e, st, s, &pre)) != GCAP_OK) return r;
  memset(&act, 0, sizeof act);
  act.p[0] = a->p[0];
  act.p[1] = a->p[5];
  act.n[0] = m * n;
  act.dt = a->dt;
  return cu_activation(e, st, s, GC_K_GELU, &act);
}

static gcap_status cu_matmul(gcap_engine *e, cu_state *st, cudaStream_t s, const gc_kargs *a) {
  int64_t m = a->n[0], n = a->n[1], k = a->n[2], batch = a->n[5] > 1 ? a->n[5] : 1;
  int ta = a->n[3] != 0, tb = a->n[4] != 0;
  float alpha = a->f[0], beta = a->f[1];
  if (m < 0 || n < 0 || k < 0 || m > INT_MAX || n > INT_MAX || k > INT_MAX || batch > INT_MAX)
    return gc_fail(e, GCAP_EINVAL,
                   "cuda: matmul of %lld x %lld x %lld (%lld batches): outside cuBLAS's int range",
                   (long long)m, (long long)n, (long long)k, (long long)batch);
  if (m == 0 || n == 0) return GCAP_OK;
  if (a->p[5] != NULL) return cu_matmul_gelu(e, st, s, a);
  if (k == 0) { /* batches lie one after the other in C: one launch over them all */
    cu_matmul_k0(s, a->p[0], a->p[3], a->dt, batch * m * n, n, alpha, beta);
    if (a->p[4] != NULL) { /* the bias grad: sums over no rows */
      gc_kargs zero;
      memset(&zero, 0, sizeof zero);
      zero.p[0] = a->p[4];
      zero.n[0] = m;
      zero.dt = a->dt;
      return cu_elementwise(e, st, s, GC_K_FILL, &zero);
    }
    return GCAP_OK;
  }
  cublasOperation_t opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N;

  int epi = a->p[3] ? CU_EPI_BIAS : a->p[4] ? CU_EPI_BGRAD : CU_EPI_NONE;
  void *vec = a->p[3] ? a->p[3] : a->p[4];
  cu_plan *p = NULL;
  gcap_status r = cu_plan_for(e, st, a, epi, &p);
  if (r != GCAP_OK) return r;
  if (p->ok) {
    if (epi != CU_EPI_NONE) /* the vector's address: a per-call setting of the plan */
      CUBLAS_TRY(e, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &vec,
                                                   sizeof vec));
    CUBLAS_TRY(e,
               cublasLtMatmul(st->lt, p->op, &alpha, a->p[2], p->la, a->p[1], p->lb, &beta, a->p[0],
                              p->lc, a->p[0], p->lc, &p->algo, st->ws, CU_WORKSPACE, s));
    return GCAP_OK;
  }
  /* No plan with the epilogue: its work in kernels of ours, around the plain
  ** plan's GEMM (or cuBLAS's, when no plan at all was found). */
  if (epi == CU_EPI_BIAS) { /* C = the bias rows, then C += op(A) op(B) */
    k_expand<<<cu_blocks(m * n), CU_THREADS, 0, s>>>(a->p[0], a->p[3], n, a->dt, m * n, 1.0f);
    beta = 1.0f;
  }
  if (epi != CU_EPI_NONE && (r = cu_plan_for(e, st, a, CU_EPI_NONE, &p)) != GCAP_OK) return r;
  if (p->ok) {
    CUBLAS_TRY(e,
               cublasLtMatmul(st->lt, p->op, &alpha, a->p[2], p->la, a->p[1], p->lb, &beta, a->p[0],
                              p->lc, a->p[0], p->lc, &p->algo, st->ws, CU_WORKSPACE, s));
  } else {
    /* Every GEMM points the handle at its stream with the workspace set
    ** (cu_blas_stream), so that cuBLAS never allocates in a capture; the
    ** handle's other settings were made once at init (backend.cu). */
    if ((r = cu_blas_stream(e, st, s)) != GCAP_OK) return r;
    if ((r = cu_blas_gemm(e, st, a, opb, opa, m, n, k, alpha, beta)) != GCAP_OK) return r;
  }
  if (epi == CU_EPI_BGRAD) /* the bias grad sums A (stored k x m) over its k rows */
    k_sum_rows<<<cu_blocks(m), CU_THREADS, 0, s>>>(a->p[4], a->p[1], a->dt, k, m);
  return GCAP_OK;
}

/* cuBLAS's own GEMM, when cuBLASLt found no plan. */
static gcap_status cu_blas_gemm(gcap_engine *e, cu_state *st, const gc_kargs *a,
                                cublasOperation_t opb, cublasOperation_t opa, int64_t m, int64_t n,
                                int64_t k, float alpha, float beta) {
  int ldb = (int)(a->n[4] ? k : n), lda = (int)(a->n[3] ? m : k), ldc = (int)n;
  if (a->n[5] > 1) { /* strided batches; B is cuBLAS's first operand */
    cudaDataType_t t = a->dt == GCAP_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    CUBLAS_TRY(e, cublasGemmStridedBatchedEx(st->blas, opb, opa, (int)n, (int)m, (int)k, &alpha,
                                             a->p[2], t, ldb, a->n[7], a->p[1], t, lda, a->n[6],
                                             &beta, a->p[0], t, ldc, m * n, (int)a->n[5],
                                             CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return GCAP_OK;
  }
  if (a->dt == GCAP_BF16) {
    CUBLAS_TRY(e, cublasGemmEx(st->blas, opb, opa, (int)n, (int)m, (int)k, &alpha, a->p[2],
                               CUDA_R_16BF, ldb, a->p[1], CUDA_R_16BF, lda, &beta, a->p[0],
                               CUDA_R_16BF, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  } else {
    CUBLAS_TRY(e, cublasSgemm(st->blas, opb, opa, (int)n, (int)m, (int)k, &alpha,
                              (const float *)a->p[2], ldb, (const float *)a->p[1], lda, &beta,
                              (float *)a->p[0], ldc));
  }
  return GCAP_OK;
}

gcap_status cu_linalg(gcap_engine *e, cu_state *st, cudaStream_t s, int k, const gc_kargs *a) {
  switch (k) {
    case GC_K_EXPAND: {
      int64_t n = a->n[0];
      if (n <= 0) return GCAP_OK;
      if (a->n[1] <= 0)
        return gc_fail(e, GCAP_EINVAL, "cuda: expand of %lld elements from %lld", (long long)n,
                       (long long)a->n[1]);
      int64_t packs = a->n[1] == 1 ? cu_packs(n, a->dt, a->p[0], NULL, NULL) : 0;
      if (packs > 0)
        k_spread<<<cu_blocks(packs), CU_THREADS, 0, s>>>((uint4 *)a->p[0], a->p[1], a->dt, packs,
                                                         a->f[0]);
      else
        k_expand<<<cu_blocks(n), CU_THREADS, 0, s>>>(a->p[0], a->p[1], a->n[1], a->dt, n, a->f[0]);
      return GCAP_OK;
    }
    case GC_K_SUM_ROWS: {
      int64_t rows = a->n[0] > 0 ? a->n[0] : 0;
      cu_sum_rows(s, a->p[0], a->p[1], a->dt, rows, a->n[1], (float *)a->p[2],
                  GC_SUM_ROWS_CHUNKS(rows));
      return GCAP_OK;
    }
    default: /* GC_K_MATMUL */
      return cu_matmul(e, st, s, a);
  }
}
