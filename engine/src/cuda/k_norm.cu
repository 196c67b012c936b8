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
** The softmax and its backward hold rows of up to 1024 16-byte packs in
** registers instead (k_softmax_regs, k_softmax_bwd_regs): one read and one
** write of each element, a warp or a block per row, with the same
** fixed-order rules; longer rows take the block-per-row loop above.
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

/* What the softmax's input z needs of row r, worked out once per row: the
** mask element of column c is mbase + c * mstep (mstep 0: the mask's last
** dim broadcasts), and columns past lim are masked out by causal. */
typedef struct cu_smrow {
  int64_t mbase, mstep, lim;
} cu_smrow;

/* sh4 is the 4-D shape the mask broadcasts over. */
__device__ __forceinline__ cu_smrow cu_softmax_row(int64_t r, const void *mask, int64_t flags,
                                                   const int64_t *sh4) {
  cu_smrow w;
  w.mbase = mask ? gc_mask_index(r * sh4[3], sh4, flags) : 0;
  w.mstep = flags & GC_MASK_BCAST(3) ? 0 : 1;
  w.lim = flags & GC_MASK_CAUSAL ? r % sh4[2] : sh4[3];
  return w;
}

/* The softmax's input z at column c of a row (the host's softmax_in) from
** its element xv: scale * xv, then the mask (-INFINITY: masked out). */
__device__ __forceinline__ float cu_softmax_in(float xv, int64_t c, const cu_smrow &w,
                                               const void *mask, float scale, int64_t flags) {
  float z = __fmul_rn(xv, scale);
  if (c > w.lim) return -INFINITY;
  if (mask) {
    float m = cu_load(mask, w.mbase + c * w.mstep, flags & GC_MASK_BF16 ? GCAP_BF16 : GCAP_F32);
    if (flags & GC_MASK_BOOL) return m != 0.0f ? -INFINITY : z;
    z = __fadd_rn(z, m);
  }
  return z;
}

/* y = exp(z - max) / sum(exp(z - max)), z = scale * x (+ mask); a row whose
** every column is masked out is zeros. Rows too long for k_softmax_regs: x is
** read three times. */
static __global__ void k_softmax(void *y, const void *x, const void *mask, int dt, int64_t rows,
                                 int64_t cols, float scale, int64_t flags, int64_t s1, int64_t s2) {
  __shared__ float sh[CU_ROW_THREADS];
  const int64_t sh4[4] = {rows / (s1 * s2), s1, s2, cols};
  CU_ROW_LOOP(r, rows) {
    const int64_t o = r * cols;
    const cu_smrow w = cu_softmax_row(r, mask, flags, sh4);
    float mx = -INFINITY, s = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += CU_ROW_THREADS)
      mx = fmaxf(mx, cu_softmax_in(cu_load(x, o + c, dt), c, w, mask, scale, flags));
    mx = cu_block_max(mx, sh);
    for (int64_t c = threadIdx.x; c < cols; c += CU_ROW_THREADS)
      s = __fadd_rn(
          s, expf(__fsub_rn(cu_softmax_in(cu_load(x, o + c, dt), c, w, mask, scale, flags), mx)));
    s = cu_block_sum(s, sh);
    for (int64_t c = threadIdx.x; c < cols; c += CU_ROW_THREADS)
      cu_store(
          y, o + c, dt,
          mx == -INFINITY
              ? 0.0f
              : __fdiv_rn(expf(__fsub_rn(
                              cu_softmax_in(cu_load(x, o + c, dt), c, w, mask, scale, flags), mx)),
                          s));
  }
}

/* dx = scale * (y * (dy - sum_row(dy * y))); rows too long for k_softmax_bwd_regs. */
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

/*
** Softmax rows held in registers: a row is read once and written once. W
** warps share a row (W = 1: a warp per row, four rows per block; W > 1: a
** block of W warps per row), and each of its NT = 32 W threads holds K packs
** of P = 16 / sizeof(T) elements: thread t's pack k is columns
** (k NT + t) P ... (k NT + t) P + P - 1. The packs are loaded at once where
** the row splits into whole packs at 16-byte aligned addresses, element by
** element otherwise; either way a thread owns the same columns and adds them
** in the same order, so the bits do not depend on the addresses.
*/
template <typename T> struct cu_sm_elt;

template <> struct cu_sm_elt<float> {
  static __device__ __forceinline__ float get(float v) {
    return v;
  }
  static __device__ __forceinline__ float put(float v) {
    return v;
  }
  static __device__ __forceinline__ void unpack(float *v, const cu_pack &u) {
    for (int j = 0; j < 4; j++)
      v[j] = u.f[j];
  }
  static __device__ __forceinline__ void pack(cu_pack &u, const float *v) {
    for (int j = 0; j < 4; j++)
      u.f[j] = v[j];
  }
};

template <> struct cu_sm_elt<__nv_bfloat16> {
  static __device__ __forceinline__ float get(__nv_bfloat16 v) {
    return __bfloat162float(v);
  }
  static __device__ __forceinline__ __nv_bfloat16 put(float v) {
    return __float2bfloat16_rn(v);
  }
  static __device__ __forceinline__ void unpack(float *v, const cu_pack &u) {
    for (int j = 0; j < 4; j++) { /* .x is the element at the lower address */
      v[2 * j] = __bfloat162float(u.h[j].x);
      v[2 * j + 1] = __bfloat162float(u.h[j].y);
    }
  }
  static __device__ __forceinline__ void pack(cu_pack &u, const float *v) {
    for (int j = 0; j < 4; j++) {
      u.h[j].x = __float2bfloat16_rn(v[2 * j]);
      u.h[j].y = __float2bfloat16_rn(v[2 * j + 1]);
    }
  }
};

/* Column of register i of thread t (see above). */
template <typename T, int NT> __device__ __forceinline__ int cu_sm_col(int i, int t) {
  constexpr int P = 16 / sizeof(T);
  return ((i / P) * NT + t) * P + i % P;
}

/* v[i] = the row p's element at column cu_sm_col(i, t) for the first n
** columns, 0 past them (not read); vec: the row's whole packs are aligned. */
template <typename T, int NT, int K>
__device__ __forceinline__ void cu_sm_load(float *v, const T *p, int n, int t, bool vec) {
  constexpr int P = 16 / sizeof(T);
#pragma unroll
  for (int k = 0; k < K; k++) {
    const int c0 = (k * NT + t) * P;
    if (vec && c0 + P <= n) {
      cu_pack u;
      u.v = *(const uint4 *)(p + c0);
      cu_sm_elt<T>::unpack(v + k * P, u);
    } else {
#pragma unroll
      for (int j = 0; j < P; j++)
        v[k * P + j] = c0 + j < n ? cu_sm_elt<T>::get(p[c0 + j]) : 0.0f;
    }
  }
}

/* The row p's element at column cu_sm_col(i, t) = v[i], for those below cols. */
template <typename T, int NT, int K>
__device__ __forceinline__ void cu_sm_store(T *p, const float *v, int cols, int t, bool vec) {
  constexpr int P = 16 / sizeof(T);
#pragma unroll
  for (int k = 0; k < K; k++) {
    const int c0 = (k * NT + t) * P;
    if (vec && c0 < cols) {
      cu_pack u;
      cu_sm_elt<T>::pack(u, v + k * P);
      *(uint4 *)(p + c0) = u.v;
    } else {
#pragma unroll
      for (int j = 0; j < P; j++)
        if (c0 + j < cols) p[c0 + j] = cu_sm_elt<T>::put(v[k * P + j]);
    }
  }
}

/* v combined by op over the NT = 32 W threads of a row, the same on each of
** them: a butterfly over the warp (op commutes, so every lane gets the same
** bits), then the W warps' results in warp order through sh (W floats).
** Every thread of the row must call it. */
template <int W, typename Op>
__device__ __forceinline__ float cu_sm_reduce(float v, float *sh, Op op) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2)
    v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (W == 1) return v;
  if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = v;
  __syncthreads();
  v = sh[0];
#pragma unroll
  for (int i = 1; i < W; i++)
    v = op(v, sh[i]);
  __syncthreads(); /* all have read sh before anyone writes it again */
  return v;
}

/* Rows of a block (RB), threads of a launch (NT * RB); for r = this row
** group's first row; r < rows; r += all row groups of the grid. W = 1: the
** warps of a block loop apart (no barrier); W > 1: the whole block together. */
#define CU_SM_RB(W) ((W) == 1 ? 4 : 1)
#define CU_SM_ROW_LOOP(r, rows, W)                                                                 \
  for (int64_t r = (int64_t)blockIdx.x * CU_SM_RB(W) + ((W) == 1 ? threadIdx.x / 32 : 0);          \
       r < (rows); r += (int64_t)gridDim.x * CU_SM_RB(W))

template <typename T, int W, int K>
static __global__ void __launch_bounds__(32 * W * CU_SM_RB(W))
    k_softmax_regs(T *y, const T *x, const void *mask, int64_t rows, int cols, float scale,
                   int64_t flags, int64_t s1, int64_t s2, bool vec) {
  constexpr int NT = 32 * W, N = K * 16 / (int)sizeof(T);
  __shared__ float sh[W];
  const int t = (int)threadIdx.x % NT;
  const int64_t sh4[4] = {rows / (s1 * s2), s1, s2, cols};
  CU_SM_ROW_LOOP(r, rows, W) {
    const cu_smrow w = cu_softmax_row(r, mask, flags, sh4);
    float v[N], mx = -INFINITY, s = 0.0f;
    /* columns past the causal limit are masked out whatever x holds: not read */
    cu_sm_load<T, NT, K>(v, x + r * cols, (int)(w.lim < cols ? w.lim + 1 : cols), t, vec);
#pragma unroll
    for (int i = 0; i < N; i++) {
      const int c = cu_sm_col<T, NT>(i, t);
      v[i] = c < cols ? cu_softmax_in(v[i], c, w, mask, scale, flags) : -INFINITY;
      mx = fmaxf(mx, v[i]);
    }
    mx = cu_sm_reduce<W>(mx, sh, [](float a, float b) { return fmaxf(a, b); });
#pragma unroll
    for (int i = 0; i < N; i++) { /* past cols: exp(-inf) = 0, adding nothing */
      v[i] = expf(__fsub_rn(v[i], mx));
      s = __fadd_rn(s, v[i]);
    }
    s = cu_sm_reduce<W>(s, sh, [](float a, float b) { return __fadd_rn(a, b); });
#pragma unroll
    for (int i = 0; i < N; i++) /* every column masked out: zeros */
      v[i] = mx == -INFINITY ? 0.0f : __fdiv_rn(v[i], s);
    cu_sm_store<T, NT, K>(y + r * cols, v, cols, t, vec);
  }
}

template <typename T, int W, int K>
static __global__ void __launch_bounds__(32 * W * CU_SM_RB(W))
    k_softmax_bwd_regs(T *dx, const T *dy, const T *y, int64_t rows, int cols, float scale,
                       bool vec) {
  constexpr int NT = 32 * W, N = K * 16 / (int)sizeof(T);
  __shared__ float sh[W];
  const int t = (int)threadIdx.x % NT;
  CU_SM_ROW_LOOP(r, rows, W) {
    float g[N], p[N], dot = 0.0f;
    cu_sm_load<T, NT, K>(g, dy + r * cols, cols, t, vec);
    cu_sm_load<T, NT, K>(p, y + r * cols, cols, t, vec);
#pragma unroll
    for (int i = 0; i < N; i++) /* past cols: 0 * 0 */
      dot = __fadd_rn(dot, __fmul_rn(g[i], p[i]));
    dot = cu_sm_reduce<W>(dot, sh, [](float a, float b) { return __fadd_rn(a, b); });
#pragma unroll
    for (int i = 0; i < N; i++)
      g[i] = __fmul_rn(scale, __fmul_rn(p[i], __fsub_rn(g[i], dot)));
    cu_sm_store<T, NT, K>(dx + r * cols, g, cols, t, vec);
  }
}

/* Launch GC_K_SOFTMAX or GC_K_SOFTMAX_BWD with rows held in registers. */
template <typename T, int W, int K>
static void cu_sm_launch(cudaStream_t s, int k, const gc_kargs *a, bool vec) {
  const int64_t rows = a->n[0], groups = (rows + CU_SM_RB(W) - 1) / CU_SM_RB(W);
  const unsigned g = (unsigned)(groups < CU_MAX_BLOCKS ? groups : CU_MAX_BLOCKS);
  const int cols = (int)a->n[1], nt = 32 * W * CU_SM_RB(W);
  if (k == GC_K_SOFTMAX)
    k_softmax_regs<T, W, K><<<g, nt, 0, s>>>((T *)a->p[0], (const T *)a->p[1], a->p[2], rows, cols,
                                             a->f[0], a->n[2], a->n[3], a->n[4], vec);
  else
    k_softmax_bwd_regs<T, W, K><<<g, nt, 0, s>>>((T *)a->p[0], (const T *)a->p[1],
                                                 (const T *)a->p[2], rows, cols, a->f[0], vec);
}

/* The register kernel whose threads hold the whole row, with as few idle
** registers as the shapes allow; false when the row is longer than 1024
** packs (4096 f32 or 8192 bf16 columns). */
template <typename T> static bool cu_sm_fast(cudaStream_t s, int k, const gc_kargs *a) {
  constexpr int P = 16 / sizeof(T);
  const int64_t cols = a->n[1], packs = (cols + P - 1) / P;
  /* the forward's mask is read element by element: its alignment does not matter */
  const bool vec = cu_packs(cols, a->dt, a->p[0], a->p[1], k == GC_K_SOFTMAX ? NULL : a->p[2]) != 0;
  if (packs <= 32)
    cu_sm_launch<T, 1, 1>(s, k, a, vec);
  else if (packs <= 64)
    cu_sm_launch<T, 1, 2>(s, k, a, vec);
  else if (packs <= 128)
    cu_sm_launch<T, 1, 4>(s, k, a, vec);
  else if (packs <= 256)
    cu_sm_launch<T, 8, 1>(s, k, a, vec);
  else if (packs <= 512)
    cu_sm_launch<T, 8, 2>(s, k, a, vec);
  else if (packs <= 1024)
    cu_sm_launch<T, 8, 4>(s, k, a, vec);
  else
    return false;
  return true;
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
      if (dt == GCAP_BF16 ? cu_sm_fast<__nv_bfloat16>(s, k, a) : cu_sm_fast<float>(s, k, a)) break;
      k_softmax<<<g, CU_ROW_THREADS, 0, s>>>(a->p[0], a->p[1], a->p[2], dt, rows, cols, a->f[0],
                                             a->n[2], a->n[3], a->n[4]);
      break;
    default: /* GC_K_SOFTMAX_BWD */
      if (dt == GCAP_BF16 ? cu_sm_fast<__nv_bfloat16>(s, k, a) : cu_sm_fast<float>(s, k, a)) break;
      k_softmax_bwd<<<g, CU_ROW_THREADS, 0, s>>>(a->p[0], a->p[1], a->p[2], dt, rows, cols,
                                                 a->f[0]);
      break;
  }
  return GCAP_OK;
}
