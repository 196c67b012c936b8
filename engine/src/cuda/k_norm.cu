/*
** k_norm.cu: GC_K_LAYERNORM, GC_K_LAYERNORM_BWD, GC_K_LAYERNORM_BWD_PARAMS,
** GC_K_SOFTMAX (scaled, with a mask or causal) and GC_K_SOFTMAX_BWD over rows
** x cols, row-major.
**
** The row kernels run one block per row (common.cuh's CU_ROW_THREADS): thread
** t adds columns t, t + CU_ROW_THREADS, ... in order, then cu_block_sum adds
** the partial sums in a fixed tree. The order differs from the host's running
** sums, so results match within float tolerance, and never depend on timing.
** Each thread writes only the columns it read after the row's last
** reduction, so y may be x (and dx may be dy) in place.
**
** The parameter gradients are sums over rows: one thread per column adds the
** rows in order, as the host does, bit for bit in f32 and without atomics.
** Per-element arithmetic uses round-to-nearest intrinsics in the host's
** order, so no FMA contraction adds a difference of its own.
*/
#include <math.h>

#include "common.cuh"

/* mean = sum(x) / cols; var = sum((x - mean)^2) / cols (two passes, as the
** host); rstd = 1 / sqrt(var + eps); y = (x - mean) * rstd * w + b. */
static __global__ void k_layernorm(void *y, const void *x, const void *w, const void *b,
                                   float *mean_out, float *rstd_out, int dt, int64_t rows,
                                   int64_t cols, float eps) {
  __shared__ float sh[CU_ROW_THREADS];
  CU_ROW_LOOP(r, rows) {
    const int64_t o = r * cols;
    float s = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += CU_ROW_THREADS)
      s = __fadd_rn(s, cu_load(x, o + c, dt));
    float mean = __fdiv_rn(cu_block_sum(s, sh), (float)cols);
    s = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += CU_ROW_THREADS) {
      float d = __fsub_rn(cu_load(x, o + c, dt), mean);
      s = __fadd_rn(s, __fmul_rn(d, d));
    }
    float var = __fdiv_rn(cu_block_sum(s, sh), (float)cols);
    float rstd = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(var, eps)));
    for (int64_t c = threadIdx.x; c < cols; c += CU_ROW_THREADS) {
      float v = __fmul_rn(__fsub_rn(cu_load(x, o + c, dt), mean), rstd);
      if (w) v = __fmul_rn(v, cu_load(w, c, dt));
      if (b) v = __fadd_rn(v, cu_load(b, c, dt));
      cu_store(y, o + c, dt, v);
    }
    if (threadIdx.x == 0) {
      if (mean_out) mean_out[r] = mean;
      if (rstd_out) rstd_out[r] = rstd;
    }
  }
}

/* g = dy * w, xh = (x - mean) * rstd; sg and sgx: the row means of g and
** g * xh; dx = rstd * (g - sg - xh * sgx). */
static __global__ void k_layernorm_bwd(void *dx, const void *dy, const void *x, const void *w,
                                       const float *mean_in, const float *rstd_in, int dt,
                                       int64_t rows, int64_t cols) {
  __shared__ float sh[CU_ROW_THREADS];
  CU_ROW_LOOP(r, rows) {
    const int64_t o = r * cols;
    const float mean = mean_in[r], rstd = rstd_in[r];
    float sg = 0.0f, sgx = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += CU_ROW_THREADS) {
      float xh = __fmul_rn(__fsub_rn(cu_load(x, o + c, dt), mean), rstd);
      float g = __fmul_rn(cu_load(dy, o + c, dt), w ? cu_load(w, c, dt) : 1.0f);
      sg = __fadd_rn(sg, g);
      sgx = __fadd_rn(sgx, __fmul_rn(g, xh));
    }
    sg = __fdiv_rn(cu_block_sum(sg, sh), (float)cols);
    sgx = __fdiv_rn(cu_block_sum(sgx, sh), (float)cols);
    for (int64_t c = threadIdx.x; c < cols; c += CU_ROW_THREADS) {
      float xh = __fmul_rn(__fsub_rn(cu_load(x, o + c, dt), mean), rstd);
      float g = __fmul_rn(cu_load(dy, o + c, dt), w ? cu_load(w, c, dt) : 1.0f);
      cu_store(dx, o + c, dt, __fmul_rn(rstd, __fsub_rn(__fsub_rn(g, sg), __fmul_rn(xh, sgx))));
    }
  }
}

/* dw[c] = sum_r dy * xh, db[c] = sum_r dy; either output may be NULL. */
static __global__ void k_layernorm_bwd_params(void *dw, void *db, const void *dy, const void *x,
                                              const float *mean_in, const float *rstd_in, int dt,
                                              int64_t rows, int64_t cols) {
  CU_GRID_LOOP(c, cols) {
    float sw = 0.0f, sb = 0.0f;
    for (int64_t r = 0; r < rows; r++) {
      float g = cu_load(dy, r * cols + c, dt);
      float xh = __fmul_rn(__fsub_rn(cu_load(x, r * cols + c, dt), mean_in[r]), rstd_in[r]);
      sw = __fadd_rn(sw, __fmul_rn(g, xh));
      sb = __fadd_rn(sb, g);
    }
    if (dw) cu_store(dw, c, dt, sw);
    if (db) cu_store(db, c, dt, sb);
  }
}

/* The softmax's input z at row r, column c (the host's softmax_in): f[0] * x,
** then the mask (-INFINITY: masked out); sh4 is the 4-D shape it broadcasts over. */
__device__ __forceinline__ float cu_softmax_in(const void *x, const void *mask, int dt, int64_t r,
                                               int64_t c, int64_t cols, float scale, int64_t flags,
                                               const int64_t *sh4) {
  float z = __fmul_rn(cu_load(x, r * cols + c, dt), scale);
  if ((flags & GC_MASK_CAUSAL) && c > r % sh4[2]) return -INFINITY;
  if (mask) {
    float m = cu_load(mask, gc_mask_index(r * cols + c, sh4, flags),
                      flags & GC_MASK_BF16 ? GCAP_BF16 : GCAP_F32);
    if (flags & GC_MASK_BOOL) return m != 0.0f ? -INFINITY : z;
    z = __fadd_rn(z, m);
  }
  return z;
}

/* y = exp(z - max) / sum(exp(z - max)), z = scale * x (+ mask); a row whose
** every column is masked out is zeros. */
static __global__ void k_softmax(void *y, const void *x, const void *mask, int dt, int64_t rows,
                                 int64_t cols, float scale, int64_t flags, int64_t s1, int64_t s2) {
  __shared__ float sh[CU_ROW_THREADS];
  const int64_t sh4[4] = {rows / (s1 * s2), s1, s2, cols};
  CU_ROW_LOOP(r, rows) {
    const int64_t o = r * cols;
    float mx = -INFINITY, s = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += CU_ROW_THREADS)
      mx = fmaxf(mx, cu_softmax_in(x, mask, dt, r, c, cols, scale, flags, sh4));
    mx = cu_block_max(mx, sh);
    for (int64_t c = threadIdx.x; c < cols; c += CU_ROW_THREADS)
      s = __fadd_rn(s,
                    expf(__fsub_rn(cu_softmax_in(x, mask, dt, r, c, cols, scale, flags, sh4), mx)));
    s = cu_block_sum(s, sh);
    for (int64_t c = threadIdx.x; c < cols; c += CU_ROW_THREADS)
      cu_store(y, o + c, dt,
               mx == -INFINITY
                   ? 0.0f
                   : __fdiv_rn(expf(__fsub_rn(
                                   cu_softmax_in(x, mask, dt, r, c, cols, scale, flags, sh4), mx)),
                               s));
  }
}

/* dx = scale * (y * (dy - sum_row(dy * y))) */
static __global__ void k_softmax_bwd(void *dx, const void *dy, const void *y, int dt, int64_t rows,
                                     int64_t cols, float scale) {
  __shared__ float sh[CU_ROW_THREADS];
  CU_ROW_LOOP(r, rows) {
    const int64_t o = r * cols;
    float dot = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += CU_ROW_THREADS)
      dot = __fadd_rn(dot, __fmul_rn(cu_load(dy, o + c, dt), cu_load(y, o + c, dt)));
    dot = cu_block_sum(dot, sh);
    for (int64_t c = threadIdx.x; c < cols; c += CU_ROW_THREADS) {
      float v = cu_load(y, o + c, dt);
      cu_store(dx, o + c, dt,
               __fmul_rn(scale, __fmul_rn(v, __fsub_rn(cu_load(dy, o + c, dt), dot))));
    }
  }
}

gcap_status cu_norm(gcap_engine *, cu_state *, cudaStream_t s, int k, const gc_kargs *a) {
  int64_t rows = a->n[0], cols = a->n[1];
  int dt = a->dt;
  if (cols <= 0 && k != GC_K_LAYERNORM) return GCAP_OK;
  if (k == GC_K_LAYERNORM_BWD_PARAMS) { /* rows = 0 writes zero grads, as the host */
    if (a->p[0] || a->p[1])
      k_layernorm_bwd_params<<<cu_blocks(cols), CU_THREADS, 0, s>>>(
          a->p[0], a->p[1], a->p[2], a->p[3], (const float *)a->p[4], (const float *)a->p[5], dt,
          rows > 0 ? rows : 0, cols);
    return GCAP_OK;
  }
  if (rows <= 0 || cols < 0) return GCAP_OK;
  unsigned g = cu_row_blocks(rows);
  switch (k) {
    case GC_K_LAYERNORM: /* cols = 0 still writes mean and rstd (NaN), as the host */
      k_layernorm<<<g, CU_ROW_THREADS, 0, s>>>(a->p[0], a->p[1], a->p[2], a->p[3], (float *)a->p[4],
                                               (float *)a->p[5], dt, rows, cols, a->f[0]);
      break;
    case GC_K_LAYERNORM_BWD:
      k_layernorm_bwd<<<g, CU_ROW_THREADS, 0, s>>>(a->p[0], a->p[1], a->p[2], a->p[3],
                                                   (const float *)a->p[4], (const float *)a->p[5],
                                                   dt, rows, cols);
      break;
    case GC_K_SOFTMAX:
      k_softmax<<<g, CU_ROW_THREADS, 0, s>>>(a->p[0], a->p[1], a->p[2], dt, rows, cols, a->f[0],
                                             a->n[2], a->n[3], a->n[4]);
      break;
    default: /* GC_K_SOFTMAX_BWD */
      k_softmax_bwd<<<g, CU_ROW_THREADS, 0, s>>>(a->p[0], a->p[1], a->p[2], dt, rows, cols,
                                                 a->f[0]);
      break;
  }
  return GCAP_OK;
}
