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
** LayerNorm's forward and input grad hold rows of up to 8 packs a lane in
** registers the same way, a warp per row (k_layernorm_regs,
** k_layernorm_bwd_regs); longer rows take the block-per-row kernels.
**
** The parameter gradients are sums over rows in two stages (chunks of rows,
** then the chunks by a fixed tree; k_layernorm_bwd_params_regs where rows
** are up to 8 16-byte packs a lane, k_layernorm_bwd_params otherwise): no atomics,
** an order fixed by the shape, so the same bits on every run, within float
** tolerance of the host's running sums. Per-element arithmetic uses
** round-to-nearest intrinsics in the host's order, so no FMA contraction
** adds a difference of its own.
*/
#include <math.h>

#include "common.cuh"
#include "rows.cuh"

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

/* The parameter grads dw[c] = sum_r dy * xh and db[c] = sum_r dy (either
** may be NULL), in two stages. A block of CU_LNP_X x CU_LNP_Y threads takes
** CU_LNP_COLS columns (lane x: x, x + 32, ... of them) of chunk blockIdx.y of
** the rows (chunk c: rows * c / chunks up to rows * (c + 1) / chunks); warp
** y adds the rows lo + y, lo + y + CU_LNP_Y, ... in order, then the warps'
** sums are added in warp order through shared memory, into part (dw's
** partials, then db's: chunks x cols each) or, with one chunk, into the
** outputs. cu_join_chunks adds the chunks in a fixed order. The order depends on rows
** and cols alone: the same bits on every run. */
#define CU_LNP_X 32
#define CU_LNP_Y 8
#define CU_LNP_PER 4  /* columns a lane */
#define CU_LNP_ROWS 4 /* rows a warp loads at once */
#define CU_LNP_COLS (CU_LNP_X * CU_LNP_PER)

static __global__ void __launch_bounds__(CU_LNP_X *CU_LNP_Y)
    k_layernorm_bwd_params(void *dw, void *db, float *part, const void *dy, const void *x,
                           const float *mean_in, const float *rstd_in, int dt, int64_t rows,
                           int64_t cols, int chunks) {
  __shared__ float sh[2][CU_LNP_Y][CU_LNP_COLS];
  const int tx = (int)threadIdx.x, ty = (int)threadIdx.y;
  const int64_t c0 = (int64_t)blockIdx.x * CU_LNP_COLS + tx;
  const int64_t lo = rows * blockIdx.y / chunks, hi = rows * (blockIdx.y + 1) / chunks;
  float sw[CU_LNP_PER] = {0.0f}, sb[CU_LNP_PER] = {0.0f};
  /* CU_LNP_ROWS rows loaded at once, then added in row order */
  for (int64_t r0 = lo + ty; r0 < hi; r0 += CU_LNP_ROWS * CU_LNP_Y) {
    float g[CU_LNP_ROWS][CU_LNP_PER], xh[CU_LNP_ROWS][CU_LNP_PER];
#pragma unroll
    for (int u = 0; u < CU_LNP_ROWS; u++) {
      const int64_t r = r0 + u * CU_LNP_Y;
      const float mean = r < hi ? mean_in[r] : 0.0f, rstd = r < hi ? rstd_in[r] : 0.0f;
#pragma unroll
      for (int j = 0; j < CU_LNP_PER; j++) {
        const int64_t c = c0 + j * CU_LNP_X;
        const bool ok = r < hi && c < cols;
        g[u][j] = ok ? cu_load(dy, r * cols + c, dt) : 0.0f;
        xh[u][j] = ok ? __fmul_rn(__fsub_rn(cu_load(x, r * cols + c, dt), mean), rstd) : 0.0f;
      }
    }
#pragma unroll
    for (int u = 0; u < CU_LNP_ROWS; u++)
#pragma unroll
      for (int j = 0; j < CU_LNP_PER; j++)
        if (r0 + u * CU_LNP_Y < hi) {
          sw[j] = __fadd_rn(sw[j], __fmul_rn(g[u][j], xh[u][j]));
          sb[j] = __fadd_rn(sb[j], g[u][j]);
        }
  }
#pragma unroll
  for (int j = 0; j < CU_LNP_PER; j++) {
    sh[0][ty][tx + j * CU_LNP_X] = sw[j];
    sh[1][ty][tx + j * CU_LNP_X] = sb[j];
  }
  __syncthreads();
  /* thread (tx, ty) joins one column of one output: 2 x CU_LNP_COLS of them */
  const int i = ty * CU_LNP_X + tx, which = i / CU_LNP_COLS, col = i % CU_LNP_COLS;
  const int64_t c = (int64_t)blockIdx.x * CU_LNP_COLS + col;
  void *out = which == 0 ? dw : db;
  if (i >= 2 * CU_LNP_COLS || c >= cols || (chunks == 1 && !out)) return;
  float s = sh[which][0][col];
#pragma unroll
  for (int y = 1; y < CU_LNP_Y; y++)
    s = __fadd_rn(s, sh[which][y][col]);
  if (chunks == 1)
    cu_store(out, c, dt, s);
  else
    part[((int64_t)which * chunks + blockIdx.y) * cols + c] = s;
}

/* launch(K) (a std::integral_constant) for LayerNorm's register layout: a
** warp a row, K the first of the packs 1, 2, 3, 4, 6 or 8 a lane that holds
** cols columns (5 and 7 round up: fewer kernels to build); false when cols
** is 0 or longer than 8 packs a lane (2048 bf16 or 1024 f32). */
template <int... Ks, typename L> static inline bool cu_ln_first(int64_t per, L &&launch) {
  return per > 0 && ((per <= Ks && (launch(std::integral_constant<int, Ks>()), true)) || ...);
}

template <typename T, typename L> static inline bool cu_ln_pick(int64_t cols, L &&launch) {
  constexpr int P = 16 / sizeof(T);
  return cu_ln_first<1, 2, 3, 4, 6, 8>((cols + 32 * P - 1) / (32 * P), launch);
}

/* The parameter grads where a row is up to 8 16-byte packs a lane
** (cu_ln_fast's layout): a block of CU_LNPR_W warps takes chunk
** blockIdx.x of the rows, warp w adding rows lo + w, lo + w + CU_LNPR_W, ...
** in order, lane t its columns cu_sm_col(i, t); then the warps' sums are
** added in warp order through shared memory, dw's and then db's, into the
** outputs (one chunk) or part, as k_layernorm_bwd_params. A warp reads whole
** rows in 16-byte loads, and GC_LN_PARAMS_CHUNKS gives enough blocks to keep
** the memory busy: the narrow column tiles above reach a fraction of it. */
#define CU_LNPR_W 4

template <typename T, int N>
static __device__ __forceinline__ void cu_lnpr_join(T *out, float *part, float (*sh)[32 * N],
                                                    const float *v, int64_t slot, int cols,
                                                    int chunks) {
  const int t = (int)threadIdx.x % 32, w = (int)threadIdx.x / 32;
  __syncthreads(); /* the last join has read sh */
#pragma unroll
  for (int i = 0; i < N; i++)
    sh[w][cu_sm_col<T, 32>(i, t)] = v[i];
  __syncthreads();
  for (int c = (int)threadIdx.x; c < cols; c += 32 * CU_LNPR_W) {
    float s = sh[0][c];
#pragma unroll
    for (int j = 1; j < CU_LNPR_W; j++)
      s = __fadd_rn(s, sh[j][c]);
    if (chunks == 1)
      out[c] = cu_sm_elt<T>::put(s);
    else
      part[slot * cols + c] = s;
  }
}

template <typename T, int K>
static __global__ void __launch_bounds__(32 * CU_LNPR_W)
    k_layernorm_bwd_params_regs(T *dw, T *db, float *part, const T *dy, const T *x,
                                const float *mean_in, const float *rstd_in, int64_t rows, int cols,
                                int chunks, bool vec) {
  constexpr int P = 16 / (int)sizeof(T), N = K * P;
  __shared__ float sh[CU_LNPR_W][32 * N];
  const int t = (int)threadIdx.x % 32;
  const int64_t lo = rows * blockIdx.x / chunks, hi = rows * (blockIdx.x + 1) / chunks;
  float sw[N], sb[N];
#pragma unroll
  for (int i = 0; i < N; i++)
    sw[i] = sb[i] = 0.0f;
  for (int64_t r = lo + (int)threadIdx.x / 32; r < hi; r += CU_LNPR_W) {
    const float mean = mean_in[r], rstd = rstd_in[r];
    /* a pack at a time (pack k of lane t: cu_sm_col's columns), so that
    ** only the sums stay whole in registers */
#pragma unroll
    for (int k = 0; k < K; k++) {
      const int64_t o = r * cols + k * 32 * P;
      float xh[P], g[P];
      cu_sm_load<T, 32, 1>(xh, x + o, cols - k * 32 * P, t, vec);
      cu_sm_load<T, 32, 1>(g, dy + o, cols - k * 32 * P, t, vec);
#pragma unroll
      for (int j = 0; j < P; j++) {
        const float v = __fmul_rn(__fsub_rn(xh[j], mean), rstd);
        sw[k * P + j] = __fadd_rn(sw[k * P + j], __fmul_rn(g[j], v));
        sb[k * P + j] = __fadd_rn(sb[k * P + j], g[j]);
      }
    }
  }
  if (dw) cu_lnpr_join<T, N>(dw, part, sh, sw, blockIdx.x, cols, chunks);
  if (db) cu_lnpr_join<T, N>(db, part, sh, sb, (int64_t)chunks + blockIdx.x, cols, chunks);
}

template <typename T, int K>
static void cu_lnpr_launch(cudaStream_t s, const gc_kargs *a, int chunks, bool vec) {
  k_layernorm_bwd_params_regs<T, K><<<chunks, 32 * CU_LNPR_W, 0, s>>>(
      (T *)a->p[0], (T *)a->p[1], (float *)a->p[6], (const T *)a->p[2], (const T *)a->p[3],
      (const float *)a->p[4], (const float *)a->p[5], a->n[0], (int)a->n[1], chunks, vec);
}

/* k_layernorm_bwd_params_regs where the rows are up to 8 packs a lane,
** chosen on the shape alone (whole aligned packs only pick the loads, as in
** cu_ln_fast: the bits do not depend on the addresses); false otherwise. */
template <typename T> static bool cu_lnpr_fast(cudaStream_t s, const gc_kargs *a, int chunks) {
  const bool vec = cu_packs(a->n[1], a->dt, a->p[2], a->p[3], NULL) != 0;
  return a->n[0] > 0 && cu_ln_pick<T>(a->n[1], [&](auto kp) {
           cu_lnpr_launch<T, decltype(kp)::value>(s, a, chunks, vec);
         });
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

/* LayerNorm rows held in registers as the softmax's, a warp per row (four
** rows a block): x is read once and y written once, the lane's columns of the
** weight and bias loaded once per thread. The sums are a lane's registers in
** order, then the warp's butterfly; mean and var as k_layernorm computes them. */
template <typename T, int K>
static __global__ void __launch_bounds__(32 * CU_SM_RB(1))
    k_layernorm_regs(T *y, const T *x, const T *w, const T *b, float *mean_out, float *rstd_out,
                     int64_t rows, int cols, float eps, bool vec) {
  constexpr int N = K * 16 / (int)sizeof(T);
  const int t = (int)threadIdx.x % 32;
  const auto add = [](float u, float v) { return __fadd_rn(u, v); };
  float wv[N], bv[N];
  if (w) cu_sm_load<T, 32, K>(wv, w, cols, t, vec);
  if (b) cu_sm_load<T, 32, K>(bv, b, cols, t, vec);
  CU_SM_ROW_LOOP(r, rows, 1) {
    float v[N], s = 0.0f, q = 0.0f;
    cu_sm_load<T, 32, K>(v, x + r * cols, cols, t, vec);
#pragma unroll
    for (int i = 0; i < N; i++) /* past cols: 0 */
      s = __fadd_rn(s, v[i]);
    const float mean = __fdiv_rn(cu_sm_reduce<1>(s, NULL, add), (float)cols);
#pragma unroll
    for (int i = 0; i < N; i++) {
      const float d = __fsub_rn(v[i], mean);
      if (cu_sm_col<T, 32>(i, t) < cols) q = __fadd_rn(q, __fmul_rn(d, d));
    }
    const float var = __fdiv_rn(cu_sm_reduce<1>(q, NULL, add), (float)cols);
    const float rstd = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(var, eps)));
#pragma unroll
    for (int i = 0; i < N; i++) {
      v[i] = __fmul_rn(__fsub_rn(v[i], mean), rstd);
      if (w) v[i] = __fmul_rn(v[i], wv[i]);
      if (b) v[i] = __fadd_rn(v[i], bv[i]);
    }
    cu_sm_store<T, 32, K>(y + r * cols, v, cols, t, vec);
    if (t == 0) {
      if (mean_out) mean_out[r] = mean;
      if (rstd_out) rstd_out[r] = rstd;
    }
  }
}

/* dx of k_layernorm_bwd with rows held in registers: x and dy read once, dx
** written once. */
template <typename T, int K>
static __global__ void __launch_bounds__(32 * CU_SM_RB(1))
    k_layernorm_bwd_regs(T *dx, const T *dy, const T *x, const T *w, const float *mean_in,
                         const float *rstd_in, int64_t rows, int cols, bool vec) {
  constexpr int N = K * 16 / (int)sizeof(T);
  const int t = (int)threadIdx.x % 32;
  const auto add = [](float u, float v) { return __fadd_rn(u, v); };
  float wv[N];
  if (w) cu_sm_load<T, 32, K>(wv, w, cols, t, vec);
  CU_SM_ROW_LOOP(r, rows, 1) {
    const float mean = mean_in[r], rstd = rstd_in[r];
    float xh[N], g[N], sg = 0.0f, sgx = 0.0f;
    cu_sm_load<T, 32, K>(xh, x + r * cols, cols, t, vec);
    cu_sm_load<T, 32, K>(g, dy + r * cols, cols, t, vec);
#pragma unroll
    for (int i = 0; i < N; i++) {
      xh[i] = __fmul_rn(__fsub_rn(xh[i], mean), rstd);
      if (w) g[i] = __fmul_rn(g[i], wv[i]);
      if (cu_sm_col<T, 32>(i, t) < cols) {
        sg = __fadd_rn(sg, g[i]);
        sgx = __fadd_rn(sgx, __fmul_rn(g[i], xh[i]));
      }
    }
    sg = __fdiv_rn(cu_sm_reduce<1>(sg, NULL, add), (float)cols);
    sgx = __fdiv_rn(cu_sm_reduce<1>(sgx, NULL, add), (float)cols);
#pragma unroll
    for (int i = 0; i < N; i++)
      g[i] = __fmul_rn(rstd, __fsub_rn(__fsub_rn(g[i], sg), __fmul_rn(xh[i], sgx)));
    cu_sm_store<T, 32, K>(dx + r * cols, g, cols, t, vec);
  }
}

template <typename T, int K> static void cu_ln_launch(cudaStream_t s, int k, const gc_kargs *a) {
  const int64_t rows = a->n[0], groups = (rows + CU_SM_RB(1) - 1) / CU_SM_RB(1);
  const unsigned g = (unsigned)(groups < CU_MAX_BLOCKS ? groups : CU_MAX_BLOCKS);
  const int cols = (int)a->n[1], nt = 32 * CU_SM_RB(1);
  const T *w = (const T *)a->p[k == GC_K_LAYERNORM ? 2 : 3];
  const bool vec = cu_packs(cols, a->dt, a->p[0], a->p[1], a->p[2]) != 0 &&
                   cu_packs(cols, a->dt, a->p[3], NULL, NULL) != 0;
  if (k == GC_K_LAYERNORM)
    k_layernorm_regs<T, K><<<g, nt, 0, s>>>((T *)a->p[0], (const T *)a->p[1], w, (const T *)a->p[3],
                                            (float *)a->p[4], (float *)a->p[5], rows, cols, a->f[0],
                                            vec);
  else
    k_layernorm_bwd_regs<T, K><<<g, nt, 0, s>>>((T *)a->p[0], (const T *)a->p[1],
                                                (const T *)a->p[2], w, (const float *)a->p[4],
                                                (const float *)a->p[5], rows, cols, vec);
}

/* The register kernel with the fewest packs a lane that hold the row; false
** when cols is 0 or longer than 8 packs a lane (2048 bf16 or 1024 f32). */
template <typename T> static bool cu_ln_fast(cudaStream_t s, int k, const gc_kargs *a) {
  return cu_ln_pick<T>(a->n[1], [&](auto kp) { cu_ln_launch<T, decltype(kp)::value>(s, k, a); });
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
  return cu_rows_pick(packs, [&](auto w, auto kp) {
    cu_sm_launch<T, decltype(w)::value, decltype(kp)::value>(s, k, a, vec);
  });
}

/* GC_K_LAYERNORM_BWD_PARAMS: dw and db (either may be NULL) in
** GC_LN_PARAMS_CHUNKS(rows) chunks (the column tiles: GC_COLSUM_CHUNKS,
** no more), joined from the scratch p[6]. */
static void cu_ln_params(cudaStream_t s, const gc_kargs *a) {
  const int64_t rows = a->n[0] > 0 ? a->n[0] : 0, cols = a->n[1];
  float *part = (float *)a->p[6];
  int chunks = part ? GC_LN_PARAMS_CHUNKS(rows) : 1;
  if (!a->p[0] && !a->p[1]) return;
  if (!(a->dt == GCAP_BF16 ? cu_lnpr_fast<__nv_bfloat16>(s, a, chunks)
                           : cu_lnpr_fast<float>(s, a, chunks))) {
    /* the column tiles take fewer chunks (each reads a narrow strip of many
    ** rows), in the same scratch */
    chunks = part ? GC_COLSUM_CHUNKS(rows) : 1;
    dim3 grid((unsigned)((cols + CU_LNP_COLS - 1) / CU_LNP_COLS), (unsigned)chunks);
    k_layernorm_bwd_params<<<grid, dim3(CU_LNP_X, CU_LNP_Y), 0, s>>>(
        a->p[0], a->p[1], part, a->p[2], a->p[3], (const float *)a->p[4], (const float *)a->p[5],
        a->dt, rows, cols, chunks);
  }
  if (chunks == 1) return;
  if (a->p[0]) cu_join_chunks(s, a->p[0], part, a->dt, cols, chunks);
  if (a->p[1]) cu_join_chunks(s, a->p[1], part + (int64_t)chunks * cols, a->dt, cols, chunks);
}

gcap_status cu_norm(gcap_engine *, cu_state *, cudaStream_t s, int k, const gc_kargs *a) {
  int64_t rows = a->n[0], cols = a->n[1];
  int dt = a->dt;
  if (cols <= 0 && k != GC_K_LAYERNORM) return GCAP_OK;
  if (k == GC_K_LAYERNORM_BWD_PARAMS) { /* rows = 0 writes zero grads, as the host */
    cu_ln_params(s, a);
    return GCAP_OK;
  }
  if (rows <= 0 || cols < 0) return GCAP_OK;
  unsigned g = cu_row_blocks(rows);
  switch (k) {
    case GC_K_LAYERNORM: /* cols = 0 still writes mean and rstd (NaN), as the host */
      if (dt == GCAP_BF16 ? cu_ln_fast<__nv_bfloat16>(s, k, a) : cu_ln_fast<float>(s, k, a)) break;
      k_layernorm<<<g, CU_ROW_THREADS, 0, s>>>(a->p[0], a->p[1], a->p[2], a->p[3], (float *)a->p[4],
                                               (float *)a->p[5], dt, rows, cols, a->f[0]);
      break;
    case GC_K_LAYERNORM_BWD:
      if (dt == GCAP_BF16 ? cu_ln_fast<__nv_bfloat16>(s, k, a) : cu_ln_fast<float>(s, k, a)) break;
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
