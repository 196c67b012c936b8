/*
** k_attn.cu: GC_K_ATTN, GC_K_ATTN_BWD_DQ and GC_K_ATTN_BWD_DKV: attention in
** three kernels that never store the weights [BH, Sq, Sk].
**
** One thread per query row (forward, dq) or key row (dk, dv), its vectors in
** registers (head dims up to DM, a template of 32, 64 or 128); the other
** side's rows go through shared memory in tiles of ATT_T. The forward makes
** the row's max, sum of exp(z - max) and output in one pass over the keys
** (the output rescaled when the max grows); the backward recomputes the
** weights from those two floats, with D_i = do_i . o_i. Every sum runs in a fixed order and no
*atomics are used: a replay
** computes what an eager call does, bit for bit. The sums' order differs from
** the host's (the composition's), so results match within tolerance.
** Dropout draws what GC_K_DROPOUT draws for the same element of the weights.
*/
#include <math.h>

#include "common.cuh"
#include "runtime/rng.h"

#define ATT_ROWS 64 /* threads (rows) per block */
#define ATT_T 32    /* rows of the other side per shared tile */

/* The problem, as the kernels read it from gc_kargs. */
struct cu_att {
  int64_t bh, sq, sk, d, dv, flags, heads;
  float scale, p;
  int dt;
};

/* z = scale q.k_j (q in registers, k_j in shared memory), then the mask and
** causal (-INFINITY: masked out). */
template <int DM>
__device__ __forceinline__ float att_z(const cu_att &c, const float *q, const float *kj,
                                       const void *mask, int64_t bh, int64_t i, int64_t j) {
  float s = 0.0f;
#pragma unroll
  for (int l = 0; l < DM; l++)
    if (l < c.d) s += q[l] * kj[l];
  float z = s * c.scale;
  if ((c.flags & GC_MASK_CAUSAL) && j > i) return -INFINITY;
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

/* rows [r0, r0 + ATT_T) of x [.., n, w] of slice bh into sh [ATT_T][DM] as
** floats (zeros past n and w); every thread of the block calls it. */
template <int DM>
__device__ __forceinline__ void att_tile(float *sh, const void *x, int dt, int64_t bh, int64_t n,
                                         int64_t w, int64_t r0) {
  for (int t = threadIdx.x; t < ATT_T * DM; t += blockDim.x) {
    int64_t r = r0 + t / DM, col = t % DM;
    sh[t] = r < n && col < w ? cu_load(x, (bh * n + r) * w + col, dt) : 0.0f;
  }
}

/* this thread's row r of x [.., n, w] of slice bh into v[DM] */
template <int DM>
__device__ __forceinline__ void att_row(float *v, const void *x, int dt, int64_t bh, int64_t n,
                                        int64_t w, int64_t r) {
#pragma unroll
  for (int l = 0; l < DM; l++)
    v[l] = r < n && l < w ? cu_load(x, (bh * n + r) * w + l, dt) : 0.0f;
}

template <int DM>
static __global__ void k_attn(void *o, const void *q, const void *k, const void *v, float *stats,
                              const void *mask, const uint64_t *rng, cu_att c) {
  __shared__ __align__(16) float ks[ATT_T * DM], vs[ATT_T * DM];
  const int64_t rows = c.bh * c.sq;
  uint64_t head[2] = {0, 0};
  if (rng) head[0] = rng[0], head[1] = rng[1];
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) {
    uint64_t *h = (uint64_t *)stats;
    h[0] = head[0], h[1] = head[1];
  }
  for (int64_t bh = blockIdx.y; bh < c.bh; bh += gridDim.y) {
    const int64_t i = (int64_t)blockIdx.x * ATT_ROWS + threadIdx.x;
    float qr[DM], acc[DM];
    att_row<DM>(qr, q, c.dt, bh, c.sq, c.d, i);
    float mx = -INFINITY, sum = 0.0f;
#pragma unroll
    for (int l = 0; l < DM; l++)
      acc[l] = 0.0f;
    for (int64_t j0 = 0; j0 < c.sk; j0 += ATT_T) { /* one pass: the max, sum and output online */
      __syncthreads();
      att_tile<DM>(ks, k, c.dt, bh, c.sk, c.d, j0);
      att_tile<DM>(vs, v, c.dt, bh, c.sk, c.dv, j0);
      __syncthreads();
      for (int jj = 0; jj < ATT_T && j0 + jj < c.sk && i < c.sq; jj++) {
        float z = att_z<DM>(c, qr, ks + jj * DM, mask, bh, i, j0 + jj), w;
        if (z == -INFINITY) continue;
        if (z > mx) { /* a new max: what was summed so far is rescaled */
          float corr = expf(mx - z);
          sum = sum * corr + 1.0f;
#pragma unroll
          for (int l = 0; l < DM; l++)
            acc[l] *= corr;
          mx = z;
          w = 1.0f;
        } else {
          w = expf(z - mx);
          sum += w;
        }
        w *= att_keep(c, head, (bh * c.sq + i) * c.sk + j0 + jj);
#pragma unroll
        for (int l = 0; l < DM; l++)
          acc[l] += w * vs[jj * DM + l];
      }
    }
#pragma unroll
    for (int l = 0; l < DM; l++)
      acc[l] = mx == -INFINITY ? 0.0f : acc[l] / sum;
    if (i < c.sq) {
#pragma unroll
      for (int l = 0; l < DM; l++) /* constant indices: acc stays in registers */
        if (l < c.dv) cu_store(o, (bh * c.sq + i) * c.dv + l, c.dt, acc[l]);
      stats[GC_ATTN_HEAD + bh * c.sq + i] = mx;
      stats[GC_ATTN_HEAD + rows + bh * c.sq + i] = sum;
    }
  }
}

/* The weight of z in a row with stats (mx, sum). */
__device__ __forceinline__ float att_p(float z, float mx, float sum) {
  return mx == -INFINITY ? 0.0f : expf(z - mx) / sum;
}

/* D_i = do_i . o_i (equal to sum_j dP_ij P_ij, which the host sums) into
** stats, then dq_i = scale sum_j P (dP - D_i) k_j. */
template <int DM>
static __global__ void k_attn_bwd_dq(void *dq, const void *dO, const void *q, const void *k,
                                     const void *v, float *stats, const void *mask, const void *o,
                                     cu_att c) {
  __shared__ __align__(16) float ks[ATT_T * DM], vs[ATT_T * DM];
  const int64_t rows = c.bh * c.sq;
  const uint64_t *head = (const uint64_t *)stats;
  for (int64_t bh = blockIdx.y; bh < c.bh; bh += gridDim.y) {
    const int64_t i = (int64_t)blockIdx.x * ATT_ROWS + threadIdx.x, row = bh * c.sq + i;
    float qr[DM], dor[DM], acc[DM];
    att_row<DM>(qr, o, c.dt, bh, c.sq, c.dv, i); /* o first, for D */
    att_row<DM>(dor, dO, c.dt, bh, c.sq, c.dv, i);
    float dd = 0.0f;
#pragma unroll
    for (int l = 0; l < DM; l++) {
      dd += dor[l] * qr[l];
      acc[l] = 0.0f;
    }
    att_row<DM>(qr, q, c.dt, bh, c.sq, c.d, i);
    float mx = i < c.sq ? stats[GC_ATTN_HEAD + row] : 0.0f;
    float sum = i < c.sq ? stats[GC_ATTN_HEAD + rows + row] : 1.0f;
    for (int64_t j0 = 0; j0 < c.sk; j0 += ATT_T) {
      __syncthreads();
      att_tile<DM>(ks, k, c.dt, bh, c.sk, c.d, j0);
      att_tile<DM>(vs, v, c.dt, bh, c.sk, c.dv, j0);
      __syncthreads();
      for (int jj = 0; jj < ATT_T && j0 + jj < c.sk && i < c.sq; jj++) {
        float p = att_p(att_z<DM>(c, qr, ks + jj * DM, mask, bh, i, j0 + jj), mx, sum);
        float dp = 0.0f;
#pragma unroll
        for (int l = 0; l < DM; l++)
          dp += dor[l] * vs[jj * DM + l];
        float dz = c.scale * (p * (dp * att_keep(c, head, row * c.sk + j0 + jj) - dd));
#pragma unroll
        for (int l = 0; l < DM; l++)
          acc[l] += dz * ks[jj * DM + l];
      }
    }
    if (i < c.sq) {
      stats[GC_ATTN_HEAD + 2 * rows + row] = dd;
#pragma unroll
      for (int l = 0; l < DM; l++)
        if (l < c.d) cu_store(dq, row * c.d + l, c.dt, acc[l]);
    }
  }
}

/* dv_j = sum_i P_ij keep_ij do_i, dk_j = scale sum_i P (dP - D_i) q_i:
** one thread per key row, the queries in tiles. */
template <int DM>
static __global__ void k_attn_bwd_dkv(void *dk, void *dv, const void *dO, const void *q,
                                      const void *k, const void *v, const float *stats,
                                      const void *mask, cu_att c) {
  __shared__ __align__(16) float qs[ATT_T * DM], dos[ATT_T * DM], st3[3 * ATT_T];
  const int64_t rows = c.bh * c.sq;
  const uint64_t *head = (const uint64_t *)stats;
  for (int64_t bh = blockIdx.y; bh < c.bh; bh += gridDim.y) {
    const int64_t j = (int64_t)blockIdx.x * ATT_ROWS + threadIdx.x;
    float kr[DM], vr[DM], dka[DM], dva[DM];
    att_row<DM>(kr, k, c.dt, bh, c.sk, c.d, j);
    att_row<DM>(vr, v, c.dt, bh, c.sk, c.dv, j);
#pragma unroll
    for (int l = 0; l < DM; l++)
      dka[l] = dva[l] = 0.0f;
    for (int64_t i0 = 0; i0 < c.sq; i0 += ATT_T) {
      __syncthreads();
      att_tile<DM>(qs, q, c.dt, bh, c.sq, c.d, i0);
      att_tile<DM>(dos, dO, c.dt, bh, c.sq, c.dv, i0);
      for (int t = threadIdx.x; t < 3 * ATT_T; t += blockDim.x) { /* max, sum, D of the rows */
        int64_t r = i0 + t % ATT_T;
        st3[t] = r < c.sq ? stats[GC_ATTN_HEAD + (t / ATT_T) * rows + bh * c.sq + r] : 0.0f;
      }
      __syncthreads();
      for (int ii = 0; ii < ATT_T && i0 + ii < c.sq && j < c.sk; ii++) {
        const int64_t i = i0 + ii;
        /* the score with q_i from shared memory and k_j from registers */
        float z = att_z<DM>(c, kr, qs + ii * DM, mask, bh, i, j);
        float p = att_p(z, st3[ii], st3[ATT_T + ii]);
        float keep = att_keep(c, head, (bh * c.sq + i) * c.sk + j), dp = 0.0f;
#pragma unroll
        for (int l = 0; l < DM; l++) {
          dva[l] += p * keep * dos[ii * DM + l];
          dp += dos[ii * DM + l] * vr[l];
        }
        float dz = c.scale * (p * (dp * keep - st3[2 * ATT_T + ii]));
#pragma unroll
        for (int l = 0; l < DM; l++)
          dka[l] += dz * qs[ii * DM + l];
      }
    }
    if (j < c.sk) {
#pragma unroll
      for (int l = 0; l < DM; l++) {
        if (l < c.d) cu_store(dk, (bh * c.sk + j) * c.d + l, c.dt, dka[l]);
        if (l < c.dv) cu_store(dv, (bh * c.sk + j) * c.dv + l, c.dt, dva[l]);
      }
    }
  }
}

/* Launch kernel k with head dims up to DM. */
template <int DM>
static void att_launch(cudaStream_t s, int k, const gc_kargs *a, const cu_att &c) {
  int64_t n = k == GC_K_ATTN_BWD_DKV ? c.sk : c.sq;
  dim3 grid((unsigned)((n + ATT_ROWS - 1) / ATT_ROWS),
            (unsigned)(c.bh < CU_MAX_BLOCKS ? c.bh : CU_MAX_BLOCKS));
  switch (k) {
    case GC_K_ATTN:
      k_attn<DM><<<grid, ATT_ROWS, 0, s>>>(a->p[0], a->p[1], a->p[2], a->p[3], (float *)a->p[4],
                                           a->p[5], (const uint64_t *)a->p[6], c);
      break;
    case GC_K_ATTN_BWD_DQ:
      k_attn_bwd_dq<DM><<<grid, ATT_ROWS, 0, s>>>(a->p[0], a->p[1], a->p[2], a->p[3], a->p[4],
                                                  (float *)a->p[5], a->p[6], a->p[7], c);
      break;
    default: /* GC_K_ATTN_BWD_DKV */
      k_attn_bwd_dkv<DM><<<grid, ATT_ROWS, 0, s>>>(a->p[0], a->p[1], a->p[2], a->p[3], a->p[4],
                                                   a->p[5], (const float *)a->p[6], a->p[7], c);
      break;
  }
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
  if (dm <= 32)
    att_launch<32>(s, k, a, c);
  else if (dm <= 64)
    att_launch<64>(s, k, a, c);
  else
    att_launch<128>(s, k, a, c);
  return GCAP_OK;
}
