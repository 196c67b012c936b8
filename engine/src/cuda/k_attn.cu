/*
** k_attn.cu: GC_K_ATTN, GC_K_ATTN_BWD_DQ and GC_K_ATTN_BWD_DKV: attention in
** three kernels that never store the weights [BH, Sq, Sk] (flash attention:
** the forward keeps a row's max and sum, the backward recomputes the
** weights from them, tile by tile).
**
** A block of ATT_THREADS threads takes one tile of T rows of one (batch,
** head): query rows (forward, dq) or key rows (dk, dv). The other side's rows
** go through shared memory in tiles of T as well. The threads form a 16 x 8
** grid, thread (ty, tx) owning rows ty + 16 r and columns tx + 8 c of every
** [T, T] and [T, DM] tile: the element-wise work (masks, softmax, dropout,
** dS) is done on these patches, held in registers. The tile products
** (scores q k^T, dP = do v^T, then weights times v, dS times k, ...) are
** made by the threads in f32 on f32 data (att_simt), on the tensor cores on
** bf16 data (att_tc: bf16 operands, the weights and dS rounded to bf16 as the
** composition rounds them, f32 sums). The backward's sums over tiles (dq,
** dk, dv) stay in the form their products make them in (registers, or
** fragments held by the warps), and its weights and dS tiles take the
** place of the scratch that the score products use. The softmax is
** online: a tile's row max and sum are combined over the 8 threads of a row
** by shuffles (lanes of one warp), and what was summed is rescaled when the
** max grows. Head dims up to DM (32, 64 or 128).
**
** Every sum runs in a fixed order and no atomics are used (dq and dk, dv
** are separate kernels): a run, and a replay, gives the same bits every
** time. The order differs from the host's (the composition's), so results
** match within tolerance. Dropout draws what GC_K_DROPOUT draws for the same
** element of the weights. Launches carrying GC_ATTN_CUDNN run on cuDNN
** instead (attn_cudnn.cpp).
*/
#include <math.h>
#include <mma.h>

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

/* A tile element as a float, and a float stored as one. */
__device__ __forceinline__ float att_get(float x) {
  return x;
}
__device__ __forceinline__ float att_get(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
__device__ __forceinline__ void att_put(float *p, float v) {
  *p = v;
}
__device__ __forceinline__ void att_put(__nv_bfloat16 *p, float v) {
  *p = __float2bfloat16_rn(v);
}

/* The tiles of head dim DM: T rows (64, 32 at DM 128, for registers and
** shared memory); a thread's patch is R rows by C columns of a [T, T] tile,
** R by CD of a [T, DM] one. */
template <int DM_> struct att_patch {
  static constexpr int DM = DM_, T = DM > 64 ? 32 : 64, R = T / 16, C = T / 8, CD = DM / 8;
};

/* The tile products in f32 by the threads, each computing its own patch:
** rows of [T, DM] tiles are LD floats apart, of [T, T] tiles PL (odd: a
** column's rows fall in distinct banks). */
template <int DM_> struct att_simt : att_patch<DM_> {
  typedef att_patch<DM_> B;
  typedef float E;
  static constexpr int LD = DM_ + 1, PL = B::T + 1, SCR = 0, SCR2 = 0;

  /* s = a_i . b_j over DM for the thread's (i, j) of a [T, T] product: a and
  ** b [T, DM] tiles, both read along their rows */
  static __device__ __forceinline__ void nt(float (&s)[B::R][B::C], const E *a, const E *b,
                                            float *) {
    const int ty = threadIdx.x / 8, tx = threadIdx.x % 8;
#pragma unroll
    for (int r = 0; r < B::R; r++)
#pragma unroll
      for (int c = 0; c < B::C; c++)
        s[r][c] = 0.0f;
#pragma unroll 4
    for (int l = 0; l < B::DM; l++) {
      float av[B::R], bv[B::C];
#pragma unroll
      for (int r = 0; r < B::R; r++)
        av[r] = a[(ty + 16 * r) * LD + l];
#pragma unroll
      for (int c = 0; c < B::C; c++)
        bv[c] = b[(tx + 8 * c) * LD + l];
#pragma unroll
      for (int r = 0; r < B::R; r++)
#pragma unroll
        for (int c = 0; c < B::C; c++)
          s[r][c] += av[r] * bv[c];
    }
  }

  /* s = a1 b1^T and t = a2 b2^T, as nt */
  static __device__ __forceinline__ void nt2(float (&s)[B::R][B::C], const E *a1, const E *b1,
                                             float (&t)[B::R][B::C], const E *a2, const E *b2,
                                             float *) {
    nt(s, a1, b1, nullptr);
    nt(t, a2, b2, nullptr);
  }

  /* acc += sum_k p[i][k] b[k][l] for the thread's (i, l) of a [T, DM]
  ** product: p a [T, T] tile, b a [T, DM] one */
  static __device__ __forceinline__ void nn(float (&acc)[B::R][B::CD], const E *p, const E *b,
                                            float *) {
    const int ty = threadIdx.x / 8, tx = threadIdx.x % 8;
#pragma unroll 4
    for (int k = 0; k < B::T; k++) {
      float pv[B::R], bv[B::CD];
#pragma unroll
      for (int r = 0; r < B::R; r++)
        pv[r] = p[(ty + 16 * r) * PL + k];
#pragma unroll
      for (int c = 0; c < B::CD; c++)
        bv[c] = b[k * LD + tx + 8 * c];
#pragma unroll
      for (int r = 0; r < B::R; r++)
#pragma unroll
        for (int c = 0; c < B::CD; c++)
          acc[r][c] += pv[r] * bv[c];
    }
  }

  /* A [T, DM] sum over tiles (the backward's dq, dk, dv): the thread's
  ** patch, in registers */
  struct acc {
    float v[B::R][B::CD];
  };
  static __device__ __forceinline__ void zero(acc &a) {
#pragma unroll
    for (int r = 0; r < B::R; r++)
#pragma unroll
      for (int c = 0; c < B::CD; c++)
        a.v[r][c] = 0.0f;
  }
  /* a += p b, as nn */
  static __device__ __forceinline__ void mm(acc &a, const E *p, const E *b) {
    nn(a.v, p, b, nullptr);
  }
  /* the thread's patch of a */
  static __device__ __forceinline__ void patch(float (&out)[B::R][B::CD], const acc &a, float *) {
#pragma unroll
    for (int r = 0; r < B::R; r++)
#pragma unroll
      for (int c = 0; c < B::CD; c++)
        out[r][c] = a.v[r][c];
  }
};

/* The tile products of bf16 data on the tensor cores (16 x 16 x 16
** fragments, f32 sums): the warps share out the result's fragments and
** store them to the f32 scratch scr, from which each thread takes its patch.
** Rows of bf16 tiles are LD or PL elements apart, of the scratch SL or SD
** floats (multiples of 8: the fragments' rows stay 32-byte aligned). */
template <int DM_> struct att_tc : att_patch<DM_> {
  typedef att_patch<DM_> B;
  typedef __nv_bfloat16 E;
  static constexpr int LD = DM_ + 8, PL = B::T + 8, SL = B::T + 8, SD = DM_ + 8;
  static constexpr int SCR = B::T * (SL > SD ? SL : SD), WARPS = ATT_THREADS / 32;
  static constexpr int SCR2 = SCR + B::T * SL; /* nt2's: two [T, T] results */
  typedef nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> acc_frag;
  typedef nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, E, nvcuda::wmma::row_major>
      a_frag;

  /* The fragments of a b^T, a and b [T, DM], b read as b^T
  ** (column-major), to scr as [T, T] (rows SL apart); no barrier */
  static __device__ __forceinline__ void nt_frags(const E *a, const E *b, float *scr) {
    using namespace nvcuda;
    const int n = B::T / 16;
    for (int f = threadIdx.x / 32; f < n * n; f += WARPS) {
      const int fi = f / n, fj = f % n;
      acc_frag fc;
      a_frag fa;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, E, wmma::col_major> fb;
      wmma::fill_fragment(fc, 0.0f);
#pragma unroll
      for (int k0 = 0; k0 < B::DM; k0 += 16) {
        wmma::load_matrix_sync(fa, a + fi * 16 * LD + k0, LD);
        wmma::load_matrix_sync(fb, b + fj * 16 * LD + k0, LD);
        wmma::mma_sync(fc, fa, fb, fc);
      }
      wmma::store_matrix_sync(scr + fi * 16 * SL + fj * 16, fc, SL, wmma::mem_row_major);
    }
  }
  /* The thread's patch of a [T, T] result in scr */
  static __device__ __forceinline__ void nt_patch(float (&s)[B::R][B::C], const float *scr) {
    const int ty = threadIdx.x / 8, tx = threadIdx.x % 8;
#pragma unroll
    for (int r = 0; r < B::R; r++)
#pragma unroll
      for (int c = 0; c < B::C; c++)
        s[r][c] = scr[(ty + 16 * r) * SL + tx + 8 * c];
  }

  /* s = a_i . b_j: the fragment products of a and b [T, DM] */
  static __device__ __forceinline__ void nt(float (&s)[B::R][B::C], const E *a, const E *b,
                                            float *scr) {
    nt_frags(a, b, scr);
    __syncthreads();
    nt_patch(s, scr);
    __syncthreads(); /* scr free again */
  }
  /* s = a1 b1^T and t = a2 b2^T with one pair of barriers: both results in
  ** scr at once (SCR2 floats) */
  static __device__ __forceinline__ void nt2(float (&s)[B::R][B::C], const E *a1, const E *b1,
                                             float (&t)[B::R][B::C], const E *a2, const E *b2,
                                             float *scr) {
    nt_frags(a1, b1, scr);
    nt_frags(a2, b2, scr + B::T * SL);
    __syncthreads();
    nt_patch(s, scr);
    nt_patch(t, scr + B::T * SL);
    __syncthreads();
  }

  /* fc += fragment (fi, fj) of p b, p [T, T] and b [T, DM] */
  static __device__ __forceinline__ void pb(acc_frag &fc, const E *p, const E *b, int fi, int fj) {
    using namespace nvcuda;
    a_frag fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, E, wmma::row_major> fb;
#pragma unroll
    for (int k0 = 0; k0 < B::T; k0 += 16) {
      wmma::load_matrix_sync(fa, p + fi * 16 * PL + k0, PL);
      wmma::load_matrix_sync(fb, b + k0 * LD + fj * 16, LD);
      wmma::mma_sync(fc, fa, fb, fc);
    }
  }

  /* acc += p b: the fragment products of p [T, T] and b [T, DM] */
  static __device__ __forceinline__ void nn(float (&acc)[B::R][B::CD], const E *p, const E *b,
                                            float *scr) {
    const int ty = threadIdx.x / 8, tx = threadIdx.x % 8, n = B::DM / 16;
    for (int f = threadIdx.x / 32; f < B::T / 16 * n; f += WARPS) {
      acc_frag fc;
      nvcuda::wmma::fill_fragment(fc, 0.0f);
      pb(fc, p, b, f / n, f % n);
      nvcuda::wmma::store_matrix_sync(scr + f / n * 16 * SD + f % n * 16, fc, SD,
                                      nvcuda::wmma::mem_row_major);
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < B::R; r++)
#pragma unroll
      for (int c = 0; c < B::CD; c++)
        acc[r][c] += scr[(ty + 16 * r) * SD + tx + 8 * c];
    __syncthreads();
  }

  /* A [T, DM] sum over tiles (the backward's dq, dk, dv) as fragments that
  ** stay in the warps across tiles: warp w holds fragments w, w + WARPS,
  ** ... of the (T / 16) x (DM / 16), so a tile's product adds to them with
  ** no trip through the scratch */
  static constexpr int NF = B::T / 16 * (DM_ / 16) / WARPS;
  static_assert(B::T / 16 * (DM_ / 16) % WARPS == 0, "the warps share the fragments evenly");
  struct acc {
    acc_frag f[NF];
  };
  static __device__ __forceinline__ void zero(acc &a) {
#pragma unroll
    for (int x = 0; x < NF; x++)
      nvcuda::wmma::fill_fragment(a.f[x], 0.0f);
  }
  /* a += p b */
  static __device__ __forceinline__ void mm(acc &a, const E *p, const E *b) {
    const int w = threadIdx.x / 32, n = B::DM / 16;
#pragma unroll
    for (int x = 0; x < NF; x++)
      pb(a.f[x], p, b, (w + x * WARPS) / n, (w + x * WARPS) % n);
  }
  /* the thread's patch of a, through scr (free on return; on entry other
  ** warps may still read the last tile's weights kept there: att_pscr) */
  static __device__ __forceinline__ void patch(float (&out)[B::R][B::CD], const acc &a,
                                               float *scr) {
    const int ty = threadIdx.x / 8, tx = threadIdx.x % 8, w = threadIdx.x / 32, n = B::DM / 16;
    __syncthreads();
#pragma unroll
    for (int x = 0; x < NF; x++)
      nvcuda::wmma::store_matrix_sync(scr + (w + x * WARPS) / n * 16 * SD +
                                          (w + x * WARPS) % n * 16,
                                      a.f[x], SD, nvcuda::wmma::mem_row_major);
    __syncthreads();
#pragma unroll
    for (int r = 0; r < B::R; r++)
#pragma unroll
      for (int c = 0; c < B::CD; c++)
        out[r][c] = scr[(ty + 16 * r) * SD + tx + 8 * c];
    __syncthreads();
  }
};

/* Rows [r0, r0 + T) of x [.., n, w] of slice bh into the [T, DM] tile sh
** (zeros past n and w); every thread of the block calls it. bf16 rows as
** wide as the tile, 16-byte aligned, are copied 16 bytes at a time. */
template <class P>
__device__ __forceinline__ void att_load(typename P::E *sh, const void *x, int dt, int64_t bh,
                                         int64_t n, int64_t w, int64_t r0) {
  if constexpr (sizeof(typename P::E) == 2) { /* att_tc: bf16 data */
    if (w == P::DM && (uintptr_t)x % 16 == 0) {
      constexpr int PR = P::DM / 8; /* packs of a row */
      for (int t = threadIdx.x; t < P::T * PR; t += ATT_THREADS) {
        int r = t / PR, c8 = t % PR;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (r0 + r < n) v = ((const uint4 *)x)[(bh * n + r0 + r) * PR + c8];
        *(uint4 *)(sh + r * P::LD + c8 * 8) = v;
      }
      return;
    }
  }
  for (int t = threadIdx.x; t < P::T * P::DM; t += ATT_THREADS) {
    int r = t / P::DM, col = t % P::DM;
    att_put(sh + r * P::LD + col,
            r0 + r < n && col < w ? cu_load(x, (bh * n + r0 + r) * w + col, dt) : 0.0f);
  }
}

/* The thread's patch of a [T, DM] result, rows [r0, ..) of slice bh of x
** [.., n, w], stored where inside n and w. */
template <class P>
__device__ __forceinline__ void att_store(void *x, int dt, int64_t bh, int64_t n, int64_t w,
                                          int64_t r0, const float (&acc)[P::R][P::CD]) {
  const int ty = threadIdx.x / 8, tx = threadIdx.x % 8;
#pragma unroll
  for (int r = 0; r < P::R; r++) {
    int64_t i = r0 + ty + 16 * r;
#pragma unroll
    for (int c = 0; c < P::CD; c++)
      if (i < n && tx + 8 * c < w) cu_store(x, (bh * n + i) * w + tx + 8 * c, dt, acc[r][c]);
  }
}

/* att_store of a backward's sum (every thread of the block calls it; the
** scratch scr is free) */
template <class P>
__device__ __forceinline__ void att_store_acc(void *x, int dt, int64_t bh, int64_t n, int64_t w,
                                              int64_t r0, const typename P::acc &a, float *scr) {
  float out[P::R][P::CD];
  P::patch(out, a, scr);
  att_store<P>(x, dt, bh, n, w, r0, out);
}

/* Bytes of the backward's n [T, T] tiles (the weights, dS), which take the
** scratch's place: a tile product's result stays in the scratch only until
** the threads have read it, the tiles are written after that and read by
** the summing products (P::mm), which leave the scratch alone. Less shared
** memory a block, more blocks on a multiprocessor. */
template <class P> static constexpr __host__ __device__ size_t att_pscr(int n) {
  size_t t = (size_t)n * P::T * P::PL * sizeof(typename P::E), f = (size_t)P::SCR2 * sizeof(float);
  return t > f ? t : f;
}

/* Shared memory of kernel k in bytes: [T, DM] tiles, [T, T] tiles, the
** scratch, and (dk, dv) the query rows' stats. Every part's size is a
** multiple of 32 bytes, so each starts aligned as the fragments need. */
template <class P> static constexpr size_t att_smem(int k) {
  if (k == GC_K_ATTN)
    return (3 * P::T * P::LD + P::T * P::PL) * sizeof(typename P::E) + P::SCR * sizeof(float);
  return 4 * P::T * P::LD * sizeof(typename P::E) + att_pscr<P>(k == GC_K_ATTN_BWD_DKV ? 2 : 1) +
         (k == GC_K_ATTN_BWD_DKV ? 3 * P::T * sizeof(float) : 0);
}

/* The forward: the block's query tile against every key tile up to the
** last one causal leaves unmasked; per row its max m, sum l and output,
** rescaled by exp(m_old - m_new) when a tile raises the max. */
template <class P>
static __global__ void __launch_bounds__(ATT_THREADS)
    k_attn(void *o, const void *q, const void *k, const void *v, float *stats, const void *mask,
           const uint64_t *rng, cu_att c) {
  typedef typename P::E E;
  constexpr int T = P::T;
  extern __shared__ __align__(128) unsigned char att_sm[];
  E *qs = (E *)att_sm, *ks = qs + T * P::LD, *vs = ks + T * P::LD, *ps = vs + T * P::LD;
  float *scr = (float *)(ps + T * P::PL);
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
    float acc[P::R][P::CD], mx[P::R], sum[P::R];
#pragma unroll
    for (int r = 0; r < P::R; r++) {
      mx[r] = -INFINITY, sum[r] = 0.0f;
#pragma unroll
      for (int l = 0; l < P::CD; l++)
        acc[r][l] = 0.0f;
    }
    __syncthreads(); /* the last slice's readers are done */
    att_load<P>(qs, q, c.dt, bh, c.sq, c.d, i0);
    for (int64_t j0 = 0; j0 < jend; j0 += T) {
      float s[P::R][P::C];
      __syncthreads();
      att_load<P>(ks, k, c.dt, bh, c.sk, c.d, j0);
      att_load<P>(vs, v, c.dt, bh, c.sk, c.dv, j0);
      __syncthreads();
      P::nt(s, qs, ks, scr);
#pragma unroll
      for (int r = 0; r < P::R; r++) {
        const int64_t i = i0 + ty + 16 * r;
        float tmax = -INFINITY, part = 0.0f;
#pragma unroll
        for (int cc = 0; cc < P::C; cc++) {
          s[r][cc] = att_mask(c, s[r][cc] * c.scale, mask, bh, i, j0 + tx + 8 * cc);
          tmax = fmaxf(tmax, s[r][cc]);
        }
        const float m = fmaxf(mx[r], att_row_max(tmax));
        const float corr = m == -INFINITY ? 1.0f : expf(mx[r] - m);
#pragma unroll
        for (int cc = 0; cc < P::C; cc++) {
          const int64_t j = j0 + tx + 8 * cc;
          float w = s[r][cc] == -INFINITY ? 0.0f : expf(s[r][cc] - m);
          part += w;
          if (w != 0.0f) w *= att_keep(c, head, (bh * c.sq + i) * c.sk + j);
          att_put(ps + (ty + 16 * r) * P::PL + tx + 8 * cc, w);
        }
        sum[r] = sum[r] * corr + att_row_sum(part);
        mx[r] = m;
#pragma unroll
        for (int l = 0; l < P::CD; l++)
          acc[r][l] *= corr;
      }
      __syncthreads();
      P::nn(acc, ps, vs, scr);
    }
#pragma unroll
    for (int r = 0; r < P::R; r++) {
      const int64_t i = i0 + ty + 16 * r;
#pragma unroll
      for (int l = 0; l < P::CD; l++)
        acc[r][l] = mx[r] == -INFINITY ? 0.0f : acc[r][l] / sum[r];
      if (tx == 0 && i < c.sq) {
        stats[GC_ATTN_HEAD + bh * c.sq + i] = mx[r];
        stats[GC_ATTN_HEAD + rows + bh * c.sq + i] = sum[r];
      }
    }
    att_store<P>(o, c.dt, bh, c.sq, c.dv, i0, acc);
  }
}

/* D_i = do_i . o_i (equal to sum_j dP_ij P_ij, which the host sums) into
** stats, then dq_i = scale sum_j P (dP keep - D_i) k_j over the key tiles. */
template <class P>
static __global__ void __launch_bounds__(ATT_THREADS)
    k_attn_bwd_dq(void *dq, const void *dO, const void *q, const void *k, const void *v,
                  float *stats, const void *mask, const void *o, cu_att c) {
  typedef typename P::E E;
  constexpr int T = P::T;
  extern __shared__ __align__(128) unsigned char att_sm[];
  E *qs = (E *)att_sm, *dos = qs + T * P::LD, *ks = dos + T * P::LD, *vs = ks + T * P::LD;
  E *ps = vs + T * P::LD; /* in the scratch's place (att_pscr) */
  float *scr = (float *)ps;
  const int ty = threadIdx.x / 8, tx = threadIdx.x % 8;
  const int64_t rows = c.bh * c.sq, i0 = (int64_t)blockIdx.x * T;
  const int64_t jend = (c.flags & GC_MASK_CAUSAL) && i0 + T < c.sk ? i0 + T : c.sk;
  const uint64_t *head = (const uint64_t *)stats;
  for (int64_t bh = blockIdx.y; bh < c.bh; bh += gridDim.y) {
    typename P::acc acc;
    float mx[P::R], sum[P::R], dd[P::R];
    P::zero(acc);
    __syncthreads();
    att_load<P>(qs, q, c.dt, bh, c.sq, c.d, i0);
    att_load<P>(dos, dO, c.dt, bh, c.sq, c.dv, i0);
    __syncthreads();
#pragma unroll
    for (int r = 0; r < P::R; r++) {
      const int64_t i = i0 + ty + 16 * r, row = bh * c.sq + i;
      float part = 0.0f;
#pragma unroll
      for (int l = 0; l < P::CD; l++) {
        const int col = tx + 8 * l;
        if (i < c.sq && col < c.dv)
          part += att_get(dos[(ty + 16 * r) * P::LD + col]) * cu_load(o, row * c.dv + col, c.dt);
      }
      dd[r] = att_row_sum(part);
      mx[r] = i < c.sq ? stats[GC_ATTN_HEAD + row] : 0.0f;
      sum[r] = i < c.sq ? stats[GC_ATTN_HEAD + rows + row] : 1.0f;
      if (tx == 0 && i < c.sq) stats[GC_ATTN_HEAD + 2 * rows + row] = dd[r];
    }
    for (int64_t j0 = 0; j0 < jend; j0 += T) {
      float s[P::R][P::C], dp[P::R][P::C];
      __syncthreads();
      att_load<P>(ks, k, c.dt, bh, c.sk, c.d, j0);
      att_load<P>(vs, v, c.dt, bh, c.sk, c.dv, j0);
      __syncthreads();
      P::nt2(s, qs, ks, dp, dos, vs, scr);
#pragma unroll
      for (int r = 0; r < P::R; r++) {
        const int64_t i = i0 + ty + 16 * r;
#pragma unroll
        for (int cc = 0; cc < P::C; cc++) {
          const int64_t j = j0 + tx + 8 * cc;
          float p = att_p(att_mask(c, s[r][cc] * c.scale, mask, bh, i, j), mx[r], sum[r]),
                ds = 0.0f;
          if (p != 0.0f)
            ds =
                c.scale * (p * (dp[r][cc] * att_keep(c, head, (bh * c.sq + i) * c.sk + j) - dd[r]));
          att_put(ps + (ty + 16 * r) * P::PL + tx + 8 * cc, ds);
        }
      }
      __syncthreads();
      P::mm(acc, ps, ks);
    }
    att_store_acc<P>(dq, c.dt, bh, c.sq, c.d, i0, acc, scr);
  }
}

/* dv_j = sum_i P_ij keep_ij do_i, dk_j = scale sum_i P (dP keep - D_i) q_i:
** the block's key tile against every query tile from the first one causal
** leaves unmasked; the weights' tiles are transposed, [keys, queries]. */
template <class P>
static __global__ void __launch_bounds__(ATT_THREADS)
    k_attn_bwd_dkv(void *dk, void *dv, const void *dO, const void *q, const void *k, const void *v,
                   const float *stats, const void *mask, cu_att c) {
  typedef typename P::E E;
  constexpr int T = P::T;
  extern __shared__ __align__(128) unsigned char att_sm[];
  E *ks = (E *)att_sm, *vs = ks + T * P::LD, *qs = vs + T * P::LD, *dos = qs + T * P::LD;
  E *pt = dos + T * P::LD, *dst = pt + T * P::PL; /* in the scratch's place (att_pscr) */
  float *scr = (float *)pt, *st3 = (float *)((unsigned char *)pt + att_pscr<P>(2));
  const int ty = threadIdx.x / 8, tx = threadIdx.x % 8;
  const int64_t rows = c.bh * c.sq, j0 = (int64_t)blockIdx.x * T;
  const int64_t ibeg = (c.flags & GC_MASK_CAUSAL) ? j0 : 0;
  const uint64_t *head = (const uint64_t *)stats;
  for (int64_t bh = blockIdx.y; bh < c.bh; bh += gridDim.y) {
    typename P::acc dka, dva;
    P::zero(dka);
    P::zero(dva);
    __syncthreads();
    att_load<P>(ks, k, c.dt, bh, c.sk, c.d, j0);
    att_load<P>(vs, v, c.dt, bh, c.sk, c.dv, j0);
    for (int64_t i0 = ibeg; i0 < c.sq; i0 += T) {
      float s[P::R][P::C], dp[P::R][P::C];
      __syncthreads();
      att_load<P>(qs, q, c.dt, bh, c.sq, c.d, i0);
      att_load<P>(dos, dO, c.dt, bh, c.sq, c.dv, i0);
      for (int t = threadIdx.x; t < 3 * T; t += ATT_THREADS) { /* max, sum, D of the rows */
        int64_t i = i0 + t % T;
        st3[t] = i < c.sq ? stats[GC_ATTN_HEAD + (t / T) * rows + bh * c.sq + i] : 0.0f;
      }
      __syncthreads();
      P::nt2(s, ks, qs, dp, vs, dos, scr);
#pragma unroll
      for (int r = 0; r < P::R; r++) {
        const int64_t j = j0 + ty + 16 * r;
#pragma unroll
        for (int cc = 0; cc < P::C; cc++) {
          const int ii = tx + 8 * cc;
          const int64_t i = i0 + ii;
          float p = att_p(att_mask(c, s[r][cc] * c.scale, mask, bh, i, j), st3[ii], st3[T + ii]);
          float keep = p != 0.0f ? att_keep(c, head, (bh * c.sq + i) * c.sk + j) : 0.0f;
          att_put(pt + (ty + 16 * r) * P::PL + ii, p * keep);
          att_put(dst + (ty + 16 * r) * P::PL + ii,
                  c.scale * (p * (dp[r][cc] * keep - st3[2 * T + ii])));
        }
      }
      __syncthreads();
      P::mm(dva, pt, dos);
      P::mm(dka, dst, qs);
    }
    att_store_acc<P>(dk, c.dt, bh, c.sk, c.d, j0, dka, scr);
    att_store_acc<P>(dv, c.dt, bh, c.sk, c.dv, j0, dva, scr);
  }
}

/* Let kernel f take `bytes` of dynamic shared memory (past the 48 KiB
** default). Not a stream operation: allowed while capturing. */
template <typename F> static cudaError_t att_smem_limit(F *f, size_t bytes) {
  return cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}

/* Launch kernel k with the tiles and products of P. */
template <class P>
static gcap_status att_launch(gcap_engine *e, cudaStream_t s, int k, const gc_kargs *a,
                              const cu_att &c) {
  const int64_t n = k == GC_K_ATTN_BWD_DKV ? c.sk : c.sq;
  const size_t bytes = att_smem<P>(k);
  dim3 grid((unsigned)((n + P::T - 1) / P::T),
            (unsigned)(c.bh < CU_MAX_BLOCKS ? c.bh : CU_MAX_BLOCKS));
  switch (k) {
    case GC_K_ATTN:
      CUDA_TRY(e, att_smem_limit(k_attn<P>, bytes));
      k_attn<P><<<grid, ATT_THREADS, bytes, s>>>(a->p[0], a->p[1], a->p[2], a->p[3],
                                                 (float *)a->p[4], a->p[5],
                                                 (const uint64_t *)a->p[6], c);
      break;
    case GC_K_ATTN_BWD_DQ:
      CUDA_TRY(e, att_smem_limit(k_attn_bwd_dq<P>, bytes));
      k_attn_bwd_dq<P><<<grid, ATT_THREADS, bytes, s>>>(a->p[0], a->p[1], a->p[2], a->p[3], a->p[4],
                                                        (float *)a->p[5], a->p[6], a->p[7], c);
      break;
    default: /* GC_K_ATTN_BWD_DKV */
      CUDA_TRY(e, att_smem_limit(k_attn_bwd_dkv<P>, bytes));
      k_attn_bwd_dkv<P><<<grid, ATT_THREADS, bytes, s>>>(
          a->p[0], a->p[1], a->p[2], a->p[3], a->p[4], a->p[5], (const float *)a->p[6], a->p[7], c);
      break;
  }
  return GCAP_OK;
}

/* bf16 on the tensor cores, f32 by the threads. */
template <int DM>
static gcap_status att_dispatch(gcap_engine *e, cudaStream_t s, int k, const gc_kargs *a,
                                const cu_att &c) {
  if (c.dt == GCAP_BF16) return att_launch<att_tc<DM>>(e, s, k, a, c);
  return att_launch<att_simt<DM>>(e, s, k, a, c);
}

/* The launches carrying GC_ATTN_CUDNN run on cuDNN (attn_cudnn.cpp), the
** others on the kernels above. */
gcap_status cu_attn(gcap_engine *e, cu_state *st, cudaStream_t s, int k, const gc_kargs *a) {
  cu_att c;
  if (a->n[5] & GC_ATTN_CUDNN) return cu_dnn_run(e, st->dnn, s, k, a);
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
  if (dm <= 32) return att_dispatch<32>(e, s, k, a, c);
  if (dm <= 64) return att_dispatch<64>(e, s, k, a, c);
  return att_dispatch<128>(e, s, k, a, c);
}
