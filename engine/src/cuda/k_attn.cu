/*
** k_attn.cu: GC_K_ATTN, GC_K_ATTN_BWD_DQ and GC_K_ATTN_BWD_DKV: attention in
** three kernels that never store the weights [BH, Sq, Sk] (flash attention:
** the forward keeps a row's max and sum, the backward recomputes the
** weights from them, tile by tile).
**
** A block of ATT_THREADS threads takes one tile of T rows of one (batch,
** head): query rows (forward, dq) or key rows (dk, dv). The other side's rows
** go through shared memory in tiles of T as well, and each tile product
** (scores q k^T, dP = do v^T, then weights times v, dS times k, ...) is
** shared out: the threads form a 16 x 8 grid, thread (ty, tx) owning rows
** ty + 16 r and columns tx + 8 c of every [T, T] and [T, DM] tile. The
** softmax is online: a tile's row max and sum are combined over the 8
** threads of a row by shuffles (lanes of one warp), and what was summed is
** rescaled when the max grows. Head dims up to DM (32, 64 or 128), f32 or
** bf16 in memory, f32 arithmetic.
**
** Every sum runs in a fixed order and no atomics are used (dq and dk, dv
** are separate kernels): a run, and a replay, gives the same bits every
** time. The order differs from the host's (the composition's), so results
** match within tolerance. Dropout draws what GC_K_DROPOUT draws for the same
** element of the weights.
*/
#include <math.h>

#include "common.cuh"
#include "runtime/rng.h"

#define ATT_THREADS 128 /* a block: 16 x 8 threads */
#define ATT_FULL 0xffffffffu

/* The problem, as the kernels read it from gc_kargs. */
struct cu_att {
  int64_t bh, sq, sk, d, dv, flags, heads;
  float scale, p;
  int dt;
};

/* The tiles of head dim DM and T rows: a [T, DM] tile's rows are LD floats
** apart, a [T, T] tile's PL (odd: a column's rows fall in distinct banks);
** a thread's patch is R rows by C columns of a [T, T] tile, R by CD of a
** [T, DM] one. */
template <int DM, int T> struct att_dims {
  static constexpr int LD = DM + 1, PL = T + 1, R = T / 16, C = T / 8, CD = DM / 8;
};

/* Tiles per head dim: 64 rows, 32 at 128 (registers and shared memory). */
template <int DM> struct att_rows { static constexpr int T = DM > 64 ? 32 : 64; };

/* z, the scaled score of query i and key j, with causal and the mask:
** -INFINITY where masked out, and past the rows (i >= Sq or j >= Sk). */
__device__ __forceinline__ float att_mask(const cu_att &c, float z, const void *mask, int64_t bh,
                                          int64_t i, int64_t j) {
  if (i >= c.sq || j >= c.sk || ((c.flags & GC_MASK_CAUSAL) && j > i)) return -INFINITY;
  if (mask) {
    const int64_t sh4[4] = {c.bh / c.heads, c.heads, c.sq, c.sk};
    float m = cu_load(mask, gc_mask_index((bh * c.sq + i) * c.sk + j, sh4, c.flags),
                      c.flags & GC_MASK_BF16 ? GCAP_BF16 : GCAP_F32);
    if (c.flags & GC_MASK_BOOL) return m != 0.0f ? -INFINITY : z;
    z += m;
  }
  return z;
}

/* The dropout's factor of element e of the weights (1 without dropout). */
__device__ __forceinline__ float att_keep(const cu_att &c, const uint64_t *head, int64_t e) {
  if (c.p == 0.0f) return 1.0f;
  return gc_rng_uniform(head[0], head[1] + (uint64_t)e) >= c.p ? 1.0f / (1.0f - c.p) : 0.0f;
}

/* The weight of z in a row with stats (mx, sum). */
__device__ __forceinline__ float att_p(float z, float mx, float sum) {
  return mx == -INFINITY || z == -INFINITY ? 0.0f : expf(z - mx) / sum;
}

/* v combined over the 8 threads of a patch row (lanes tx = 0..7 of one
** warp): the same butterfly, so the same bits, in each of them. */
__device__ __forceinline__ float att_row_sum(float v) {
  for (int w = 1; w < 8; w *= 2)
    v += __shfl_xor_sync(ATT_FULL, v, w);
  return v;
}
__device__ __forceinline__ float att_row_max(float v) {
  for (int w = 1; w < 8; w *= 2)
    v = fmaxf(v, __shfl_xor_sync(ATT_FULL, v, w));
  return v;
}

/* Rows [r0, r0 + T) of x [.., n, w] of slice bh into the [T, DM] tile sh, as
** floats (zeros past n and w); every thread of the block calls it. */
template <int DM, int T>
__device__ __forceinline__ void att_load(float *sh, const void *x, int dt, int64_t bh, int64_t n,
                                         int64_t w, int64_t r0) {
  for (int t = threadIdx.x; t < T * DM; t += ATT_THREADS) {
    int r = t / DM, col = t % DM;
    sh[r * att_dims<DM, T>::LD + col] =
        r0 + r < n && col < w ? cu_load(x, (bh * n + r0 + r) * w + col, dt) : 0.0f;
  }
}

/* s[r][c] = a_i . b_j over DM for the thread's (i, j) of a [T, T] product:
** a and b [T, DM] tiles, both read along their rows. */
template <int DM, int T>
__device__ __forceinline__ void att_nt(float (&s)[T / 16][T / 8], const float *a, const float *b) {
  typedef att_dims<DM, T> A;
  const int ty = threadIdx.x / 8, tx = threadIdx.x % 8;
#pragma unroll
  for (int r = 0; r < A::R; r++)
#pragma unroll
    for (int c = 0; c < A::C; c++)
      s[r][c] = 0.0f;
#pragma unroll 4
  for (int l = 0; l < DM; l++) {
    float av[A::R], bv[A::C];
#pragma unroll
    for (int r = 0; r < A::R; r++)
      av[r] = a[(ty + 16 * r) * A::LD + l];
#pragma unroll
    for (int c = 0; c < A::C; c++)
      bv[c] = b[(tx + 8 * c) * A::LD + l];
#pragma unroll
    for (int r = 0; r < A::R; r++)
#pragma unroll
      for (int c = 0; c < A::C; c++)
        s[r][c] += av[r] * bv[c];
  }
}

/* acc[r][c] += sum_k p[i][k] b[k][l] for the thread's (i, l) of a [T, DM]
** product: p a [T, T] tile, b a [T, DM] one. */
template <int DM, int T>
__device__ __forceinline__ void att_nn(float (&acc)[T / 16][DM / 8], const float *p,
                                       const float *b) {
  typedef att_dims<DM, T> A;
  const int ty = threadIdx.x / 8, tx = threadIdx.x % 8;
#pragma unroll 4
  for (int k = 0; k < T; k++) {
    float pv[A::R], bv[A::CD];
#pragma unroll
    for (int r = 0; r < A::R; r++)
      pv[r] = p[(ty + 16 * r) * A::PL + k];
#pragma unroll
    for (int c = 0; c < A::CD; c++)
      bv[c] = b[k * A::LD + tx + 8 * c];
#pragma unroll
    for (int r = 0; r < A::R; r++)
#pragma unroll
      for (int c = 0; c < A::CD; c++)
        acc[r][c] += pv[r] * bv[c];
  }
}

/* The thread's patch of a [T, DM] result, rows [r0, ..) of slice bh of x
** [.., n, w], stored where inside n and w. */
template <int DM, int T>
__device__ __forceinline__ void att_store(void *x, int dt, int64_t bh, int64_t n, int64_t w,
                                          int64_t r0, const float (&acc)[T / 16][DM / 8]) {
  const int ty = threadIdx.x / 8, tx = threadIdx.x % 8;
#pragma unroll
  for (int r = 0; r < T / 16; r++) {
    int64_t i = r0 + ty + 16 * r;
#pragma unroll
    for (int c = 0; c < DM / 8; c++)
      if (i < n && tx + 8 * c < w) cu_store(x, (bh * n + i) * w + tx + 8 * c, dt, acc[r][c]);
  }
}

/* Shared memory of each kernel, in floats. */
template <int DM, int T> static constexpr int att_smem(int k) {
  typedef att_dims<DM, T> A;
  return k == GC_K_ATTN          ? 3 * T * A::LD + T * A::PL
         : k == GC_K_ATTN_BWD_DQ ? 4 * T * A::LD + T * A::PL
                                 : 4 * T * A::LD + 2 * T * A::PL + 3 * T;
}

/* The forward: the block's query tile against every key tile up to the
** last one causal leaves unmasked; per row its max m, sum l and output,
** rescaled by exp(m_old - m_new) when a tile raises the max. */
template <int DM, int T>
static __global__ void __launch_bounds__(ATT_THREADS)
    k_attn(void *o, const void *q, const void *k, const void *v, float *stats, const void *mask,
           const uint64_t *rng, cu_att c) {
  typedef att_dims<DM, T> A;
  extern __shared__ float sm[];
  float *qs = sm, *ks = qs + T * A::LD, *vs = ks + T * A::LD, *ps = vs + T * A::LD;
  const int ty = threadIdx.x / 8, tx = threadIdx.x % 8;
  const int64_t rows = c.bh * c.sq, i0 = (int64_t)blockIdx.x * T;
  const int64_t jend = (c.flags & GC_MASK_CAUSAL) && i0 + T < c.sk ? i0 + T : c.sk;
  uint64_t head[2] = {0, 0};
  if (rng) head[0] = rng[0], head[1] = rng[1];
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) {
    uint64_t *h = (uint64_t *)stats;
    h[0] = head[0], h[1] = head[1];
  }
  for (int64_t bh = blockIdx.y; bh < c.bh; bh += gridDim.y) {
    float acc[A::R][A::CD], mx[A::R], sum[A::R];
#pragma unroll
    for (int r = 0; r < A::R; r++) {
      mx[r] = -INFINITY, sum[r] = 0.0f;
#pragma unroll
      for (int l = 0; l < A::CD; l++)
        acc[r][l] = 0.0f;
    }
    __syncthreads(); /* the last slice's readers are done */
    att_load<DM, T>(qs, q, c.dt, bh, c.sq, c.d, i0);
    for (int64_t j0 = 0; j0 < jend; j0 += T) {
      float s[A::R][A::C];
      __syncthreads();
      att_load<DM, T>(ks, k, c.dt, bh, c.sk, c.d, j0);
      att_load<DM, T>(vs, v, c.dt, bh, c.sk, c.dv, j0);
      __syncthreads();
      att_nt<DM, T>(s, qs, ks);
#pragma unroll
      for (int r = 0; r < A::R; r++) {
        const int64_t i = i0 + ty + 16 * r;
        float tmax = -INFINITY, part = 0.0f;
#pragma unroll
        for (int cc = 0; cc < A::C; cc++) {
          s[r][cc] = att_mask(c, s[r][cc] * c.scale, mask, bh, i, j0 + tx + 8 * cc);
          tmax = fmaxf(tmax, s[r][cc]);
        }
        const float m = fmaxf(mx[r], att_row_max(tmax));
        const float corr = m == -INFINITY ? 1.0f : expf(mx[r] - m);
#pragma unroll
        for (int cc = 0; cc < A::C; cc++) {
          const int64_t j = j0 + tx + 8 * cc;
          float w = s[r][cc] == -INFINITY ? 0.0f : expf(s[r][cc] - m);
          part += w;
          if (w != 0.0f) w *= att_keep(c, head, (bh * c.sq + i) * c.sk + j);
          ps[(ty + 16 * r) * A::PL + tx + 8 * cc] = w;
        }
        sum[r] = sum[r] * corr + att_row_sum(part);
        mx[r] = m;
#pragma unroll
        for (int l = 0; l < A::CD; l++)
          acc[r][l] *= corr;
      }
      __syncthreads();
      att_nn<DM, T>(acc, ps, vs);
    }
#pragma unroll
    for (int r = 0; r < A::R; r++) {
      const int64_t i = i0 + ty + 16 * r;
#pragma unroll
      for (int l = 0; l < A::CD; l++)
        acc[r][l] = mx[r] == -INFINITY ? 0.0f : acc[r][l] / sum[r];
      if (tx == 0 && i < c.sq) {
        stats[GC_ATTN_HEAD + bh * c.sq + i] = mx[r];
        stats[GC_ATTN_HEAD + rows + bh * c.sq + i] = sum[r];
      }
    }
    att_store<DM, T>(o, c.dt, bh, c.sq, c.dv, i0, acc);
  }
}

/* D_i = do_i . o_i (equal to sum_j dP_ij P_ij, which the host sums) into
** stats, then dq_i = scale sum_j P (dP keep - D_i) k_j over the key tiles. */
template <int DM, int T>
static __global__ void __launch_bounds__(ATT_THREADS)
    k_attn_bwd_dq(void *dq, const void *dO, const void *q, const void *k, const void *v,
                  float *stats, const void *mask, const void *o, cu_att c) {
  typedef att_dims<DM, T> A;
  extern __shared__ float sm[];
  float *qs = sm, *dos = qs + T * A::LD, *ks = dos + T * A::LD, *vs = ks + T * A::LD;
  float *ps = vs + T * A::LD;
  const int ty = threadIdx.x / 8, tx = threadIdx.x % 8;
  const int64_t rows = c.bh * c.sq, i0 = (int64_t)blockIdx.x * T;
  const int64_t jend = (c.flags & GC_MASK_CAUSAL) && i0 + T < c.sk ? i0 + T : c.sk;
  const uint64_t *head = (const uint64_t *)stats;
  for (int64_t bh = blockIdx.y; bh < c.bh; bh += gridDim.y) {
    float acc[A::R][A::CD], mx[A::R], sum[A::R], dd[A::R];
    __syncthreads();
    att_load<DM, T>(qs, q, c.dt, bh, c.sq, c.d, i0);
    att_load<DM, T>(dos, dO, c.dt, bh, c.sq, c.dv, i0);
    __syncthreads();
#pragma unroll
    for (int r = 0; r < A::R; r++) {
      const int64_t i = i0 + ty + 16 * r, row = bh * c.sq + i;
      float part = 0.0f;
#pragma unroll
      for (int l = 0; l < A::CD; l++) {
        const int col = tx + 8 * l;
        if (i < c.sq && col < c.dv)
          part += dos[(ty + 16 * r) * A::LD + col] * cu_load(o, row * c.dv + col, c.dt);
        acc[r][l] = 0.0f;
      }
      dd[r] = att_row_sum(part);
      mx[r] = i < c.sq ? stats[GC_ATTN_HEAD + row] : 0.0f;
      sum[r] = i < c.sq ? stats[GC_ATTN_HEAD + rows + row] : 1.0f;
      if (tx == 0 && i < c.sq) stats[GC_ATTN_HEAD + 2 * rows + row] = dd[r];
    }
    for (int64_t j0 = 0; j0 < jend; j0 += T) {
      float s[A::R][A::C], dp[A::R][A::C];
      __syncthreads();
      att_load<DM, T>(ks, k, c.dt, bh, c.sk, c.d, j0);
      att_load<DM, T>(vs, v, c.dt, bh, c.sk, c.dv, j0);
      __syncthreads();
      att_nt<DM, T>(s, qs, ks);
      att_nt<DM, T>(dp, dos, vs);
#pragma unroll
      for (int r = 0; r < A::R; r++) {
        const int64_t i = i0 + ty + 16 * r;
#pragma unroll
        for (int cc = 0; cc < A::C; cc++) {
          const int64_t j = j0 + tx + 8 * cc;
          float p = att_p(att_mask(c, s[r][cc] * c.scale, mask, bh, i, j), mx[r], sum[r]),
                ds = 0.0f;
          if (p != 0.0f)
            ds =
                c.scale * (p * (dp[r][cc] * att_keep(c, head, (bh * c.sq + i) * c.sk + j) - dd[r]));
          ps[(ty + 16 * r) * A::PL + tx + 8 * cc] = ds;
        }
      }
      __syncthreads();
      att_nn<DM, T>(acc, ps, ks);
    }
    att_store<DM, T>(dq, c.dt, bh, c.sq, c.d, i0, acc);
  }
}

/* dv_j = sum_i P_ij keep_ij do_i, dk_j = scale sum_i P (dP keep - D_i) q_i:
** the block's key tile against every query tile from the first one causal
** leaves unmasked; the weights' tiles are transposed, [keys, queries]. */
template <int DM, int T>
static __global__ void __launch_bounds__(ATT_THREADS)
    k_attn_bwd_dkv(void *dk, void *dv, const void *dO, const void *q, const void *k, const void *v,
                   const float *stats, const void *mask, cu_att c) {
  typedef att_dims<DM, T> A;
  extern __shared__ float sm[];
  float *ks = sm, *vs = ks + T * A::LD, *qs = vs + T * A::LD, *dos = qs + T * A::LD;
  float *pt = dos + T * A::LD, *dst = pt + T * A::PL, *st3 = dst + T * A::PL;
  const int ty = threadIdx.x / 8, tx = threadIdx.x % 8;
  const int64_t rows = c.bh * c.sq, j0 = (int64_t)blockIdx.x * T;
  const int64_t ibeg = (c.flags & GC_MASK_CAUSAL) ? j0 : 0;
  const uint64_t *head = (const uint64_t *)stats;
  for (int64_t bh = blockIdx.y; bh < c.bh; bh += gridDim.y) {
    float dka[A::R][A::CD], dva[A::R][A::CD];
#pragma unroll
    for (int r = 0; r < A::R; r++)
#pragma unroll
      for (int l = 0; l < A::CD; l++)
        dka[r][l] = dva[r][l] = 0.0f;
    __syncthreads();
    att_load<DM, T>(ks, k, c.dt, bh, c.sk, c.d, j0);
    att_load<DM, T>(vs, v, c.dt, bh, c.sk, c.dv, j0);
    for (int64_t i0 = ibeg; i0 < c.sq; i0 += T) {
      float s[A::R][A::C], dp[A::R][A::C];
      __syncthreads();
      att_load<DM, T>(qs, q, c.dt, bh, c.sq, c.d, i0);
      att_load<DM, T>(dos, dO, c.dt, bh, c.sq, c.dv, i0);
      for (int t = threadIdx.x; t < 3 * T; t += ATT_THREADS) { /* max, sum, D of the rows */
        int64_t i = i0 + t % T;
        st3[t] = i < c.sq ? stats[GC_ATTN_HEAD + (t / T) * rows + bh * c.sq + i] : 0.0f;
      }
      __syncthreads();
      att_nt<DM, T>(s, ks, qs);
      att_nt<DM, T>(dp, vs, dos);
#pragma unroll
      for (int r = 0; r < A::R; r++) {
        const int64_t j = j0 + ty + 16 * r;
#pragma unroll
        for (int cc = 0; cc < A::C; cc++) {
          const int ii = tx + 8 * cc;
          const int64_t i = i0 + ii;
          float p = att_p(att_mask(c, s[r][cc] * c.scale, mask, bh, i, j), st3[ii], st3[T + ii]);
          float keep = p != 0.0f ? att_keep(c, head, (bh * c.sq + i) * c.sk + j) : 0.0f;
          pt[(ty + 16 * r) * A::PL + ii] = p * keep;
          dst[(ty + 16 * r) * A::PL + ii] = c.scale * (p * (dp[r][cc] * keep - st3[2 * T + ii]));
        }
      }
      __syncthreads();
      att_nn<DM, T>(dva, pt, dos);
      att_nn<DM, T>(dka, dst, qs);
    }
    att_store<DM, T>(dk, c.dt, bh, c.sk, c.d, j0, dka);
    att_store<DM, T>(dv, c.dt, bh, c.sk, c.dv, j0, dva);
  }
}

/* Launch kernel k with head dims up to DM. */
template <int DM>
static gcap_status att_launch(gcap_engine *e, cudaStream_t s, int k, const gc_kargs *a,
                              const cu_att &c) {
  constexpr int T = att_rows<DM>::T;
  const int64_t n = k == GC_K_ATTN_BWD_DKV ? c.sk : c.sq;
  const size_t bytes = (size_t)att_smem<DM, T>(k) * sizeof(float);
  dim3 grid((unsigned)((n + T - 1) / T), (unsigned)(c.bh < CU_MAX_BLOCKS ? c.bh : CU_MAX_BLOCKS));
  switch (k) {
    case GC_K_ATTN:
      CUDA_TRY(e, cudaFuncSetAttribute(k_attn<DM, T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)bytes));
      k_attn<DM, T><<<grid, ATT_THREADS, bytes, s>>>(a->p[0], a->p[1], a->p[2], a->p[3],
                                                     (float *)a->p[4], a->p[5],
                                                     (const uint64_t *)a->p[6], c);
      break;
    case GC_K_ATTN_BWD_DQ:
      CUDA_TRY(e, cudaFuncSetAttribute(k_attn_bwd_dq<DM, T>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
      k_attn_bwd_dq<DM, T><<<grid, ATT_THREADS, bytes, s>>>(
          a->p[0], a->p[1], a->p[2], a->p[3], a->p[4], (float *)a->p[5], a->p[6], a->p[7], c);
      break;
    default: /* GC_K_ATTN_BWD_DKV */
      CUDA_TRY(e, cudaFuncSetAttribute(k_attn_bwd_dkv<DM, T>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
      k_attn_bwd_dkv<DM, T><<<grid, ATT_THREADS, bytes, s>>>(
          a->p[0], a->p[1], a->p[2], a->p[3], a->p[4], a->p[5], (const float *)a->p[6], a->p[7], c);
      break;
  }
  return GCAP_OK;
}

gcap_status cu_attn(gcap_engine *e, cu_state *, cudaStream_t s, int k, const gc_kargs *a) {
  cu_att c;
  c.bh = a->n[0], c.sq = a->n[1], c.sk = a->n[2], c.d = a->n[3], c.dv = a->n[4];
  c.flags = a->n[5], c.heads = a->n[6] > 0 ? a->n[6] : 1;
  c.scale = a->f[0], c.p = a->f[1], c.dt = a->dt;
  int64_t dm = c.d > c.dv ? c.d : c.dv;
  if (dm > GCAP_SDPA_FUSED_DMAX)
    return gc_fail(e, GCAP_EINVAL, "cuda: attention of head dims %lld and %lld (at most %d)",
                   (long long)c.d, (long long)c.dv, GCAP_SDPA_FUSED_DMAX);
  if (c.bh <= 0 || (k == GC_K_ATTN_BWD_DKV ? c.sk : c.sq) <= 0) {
    if (k == GC_K_ATTN && a->p[6] != NULL) /* no rows: the head still says the draws */
      CUDA_TRY(
          e, cudaMemcpyAsync(a->p[4], a->p[6], 2 * sizeof(uint64_t), cudaMemcpyDeviceToDevice, s));
    return GCAP_OK;
  }
  if (dm <= 32) return att_launch<32>(e, s, k, a, c);
  if (dm <= 64) return att_launch<64>(e, s, k, a, c);
  return att_launch<128>(e, s, k, a, c);
}
