/*
** k_fp8.cu: the FP8 kernels (backend.h's GC_K_FP8_*, the GEMM aside in
** k_fp8_gemm.cu): quantize with a scale (the amax of x noted in the same
** pass, and with it the transpose an FP8 GEMM operand needs and the column
** sums of a grad's bias grad), dequantize,
** amax, delayed scaling's update, and the padded copy of an operand's rows.
** Casts are CUDA's saturating conversion
** (__nv_cvt_float_to_fp8 with __NV_SATFINITE: round to nearest even; the
** hardware's cvt on sm_89 and later, the same rounding in software before),
** so the bytes equal the host's. x * scale and q * scale_inv are one
** rounded product each (__fmul_rn). Large tensors go 16 bytes per load.
** The amax is a block max, then one integer atomicMax per block on the
** float's bits (non-negative floats order as their bits do): max is exact,
** so the result does not depend on the order the blocks finish in.
*/
#include <cfloat>

#include <cuda_fp8.h>

#include "common.cuh"

static __device__ __forceinline__ unsigned char cu_to_fp8(float v, int f) {
  return (unsigned char)__nv_cvt_float_to_fp8(v, __NV_SATFINITE,
                                              f == GCAP_FP8_E5M2 ? __NV_E5M2 : __NV_E4M3);
}

static __device__ __forceinline__ float cu_from_fp8(unsigned char q, int f) {
  __half_raw h =
      __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)q, f == GCAP_FP8_E5M2 ? __NV_E5M2 : __NV_E4M3);
  return __half2float(__half(h));
}

/* The scale of a quantize: the value at p, or (current) the one its amax gives. */
static __device__ __forceinline__ float cu_scale(const float *p, int current, int f) {
  float amax = p[0];
  if (!current) return amax;
  if (!isfinite(amax) || amax == 0.0f) return 1.0f;
  float s = __fdiv_rn(GC_FP8_MAX(f), amax);
  return isinf(s) ? FLT_MAX : s;
}

/* The kernels over 16-byte packs are templates on PER, the elements of a
** pack (8 bf16, 4 f32), so that their loops over a pack unroll and the pack
** and its FP8 bytes stay in registers (a run-time width put both in local
** memory). PER_DT: the dtype of a width; element j of a pack. */
#define PER_DT(per) ((per) == 8 ? GCAP_BF16 : GCAP_F32)
template <int PER> static __device__ __forceinline__ float cu_pack_at(const cu_pack &u, int j) {
  return PER == 8 ? __bfloat162float(((const __nv_bfloat16 *)u.h)[j]) : u.f[j];
}

/* A pack of x scaled and cast to FP8 format f, its bytes in order from the
** low one; its largest |x| joins m. */
template <int PER>
static __device__ __forceinline__ uint64_t cu_cast_pack(const cu_pack &u, float s, int f,
                                                        float *m) {
  uint64_t w = 0;
#pragma unroll
  for (int j = 0; j < PER; j++) {
    const float v = cu_pack_at<PER>(u, j);
    *m = fmaxf(*m, fabsf(v));
    w |= (uint64_t)cu_to_fp8(__fmul_rn(v, s), f) << (8 * j);
  }
  return w;
}

/* The PER bytes of a cast pack (cu_cast_pack) to q, one store. */
template <int PER>
static __device__ __forceinline__ void cu_put_pack(unsigned char *q, uint64_t w) {
  if (PER == 8)
    *(uint2 *)q = make_uint2((unsigned)w, (unsigned)(w >> 32));
  else
    *(unsigned *)q = (unsigned)w;
}

/* One block's max of m into *amax (NULL: none): each warp's by shuffles,
** then the block's 8 by thread 0, one atomic a block. The amax kernels run
** at most CU_FP8_BLOCKS blocks, each looping over its share: a block a few
** KB of data paid a tree of barriers and an atomic on the one amax word,
** which serialised thousands of them. */
#define CU_FP8_BLOCKS 1024
static __device__ __forceinline__ void cu_amax_note(float m, float *amax) {
  __shared__ float sh[CU_THREADS / 32];
  if (amax == NULL) return; /* the same on every thread of the block */
  for (int o = 16; o > 0; o /= 2)
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 1; w < CU_THREADS / 32; w++)
    m = fmaxf(m, sh[w]);
  atomicMax((int *)amax, __float_as_int(m));
}

/* Element i of x (dt) scaled and cast; its |x| joins m. */
static __device__ __forceinline__ unsigned char cu_q1(const void *x, int64_t i, int dt, float s,
                                                      int f, float *m) {
  float v = cu_load(x, i, dt);
  *m = fmaxf(*m, fabsf(v));
  return cu_to_fp8(__fmul_rn(v, s), f);
}

template <int PER> static __global__ void k_fp8_quantize(gc_kargs a) {
  unsigned char *q = (unsigned char *)a.p[0];
  const float *skip = (const float *)a.p[5];
  const int f = (int)a.n[1];
  if (skip != NULL && skip[0] != 0.0f) return;
  float s = cu_scale((const float *)a.p[2], a.n[2] == 1, f), m = 0.0f;
  int64_t n = a.n[0];
  int64_t packs = ((uintptr_t)a.p[1] % 16 == 0 && (uintptr_t)q % PER == 0) ? n / PER : 0;
  CU_GRID_LOOP(i, packs) { /* 16 bytes of x in, 4 or 8 bytes out */
    cu_pack u;
    u.v = ((const uint4 *)a.p[1])[i];
    cu_put_pack<PER>(q + i * PER, cu_cast_pack<PER>(u, s, f, &m));
  }
  CU_GRID_LOOP(i, n - packs * PER) {
    int64_t k = packs * PER + i;
    q[k] = cu_q1(a.p[1], k, PER_DT(PER), s, f, &m);
  }
  cu_amax_note(m, (float *)a.p[3]);
  if (blockIdx.x == 0 && threadIdx.x == 0 && a.p[4] != NULL) *(float *)a.p[4] = __fdiv_rn(1.0f, s);
}

/* Quantize and transpose in one read of x (GC_K_FP8_QUANTIZE with p[6]),
** TransformerEngine's cast-transpose: a block takes 64 x 64 tiles of x
** [rows x cols] in turn, 16 bytes a load, writes their FP8 bytes in place
** and keeps them in shared memory, then writes the tile's columns as rows
** of t [cols x ld] a word at a time (the zeros of the padding, rows to
** ld, from tiles past x's rows). The shared rows are 65 bytes apart, so
** that a warp reading down a column meets distinct banks. Consecutive
** tiles go down x's rows, so that the blocks running at once write t's
** rows side by side: across x's columns, their writes were ld bytes apart,
** a power of two, and queued on a few memory channels. Wants cols a
** multiple of PER, x 16-byte, q 8-byte and t 4-byte aligned, ld a multiple
** of 4.
** With p[8], the tile's column sums of x too (TE's cast_transpose_dbias):
** a thread's packs all lie in one column slot, so it sums its rows of the
** tile in order, then the slot's lanes are added in order and the tile's
** partial sums go to part[row tile][column], which cu_join_chunks adds in
** a fixed order: the same bits every run. */
#define CU_CT GC_FP8_TILE
template <int PER>
static __global__ void __launch_bounds__(CU_THREADS) k_fp8_cast_transpose(gc_kargs a) {
  constexpr int SLOTS = CU_CT / PER, LANES = CU_THREADS / SLOTS; /* packs a row; rows a pass */
  static_assert(CU_THREADS % SLOTS == 0, "a thread keeps one column slot");
  __shared__ unsigned char tile[CU_CT][CU_CT + 1];
  __shared__ float lane_sums[LANES][CU_CT + 1];
  unsigned char *q = (unsigned char *)a.p[0], *t = (unsigned char *)a.p[6];
  const float *skip = (const float *)a.p[5];
  float *part = (float *)a.p[8];
  const int f = (int)a.n[1];
  const int64_t rows = a.n[3], cols = a.n[4], ld = a.n[5];
  const int64_t rtiles = (ld + CU_CT - 1) / CU_CT, ctiles = (cols + CU_CT - 1) / CU_CT;
  if (skip != NULL && skip[0] != 0.0f) return;
  const float s = cu_scale((const float *)a.p[2], a.n[2] == 1, f);
  float m = 0.0f;
  for (int64_t k = blockIdx.x; k < rtiles * ctiles; k += gridDim.x) {
    const int64_t r0 = k % rtiles * CU_CT, c0 = k / rtiles * CU_CT;
    float sum[PER];
#pragma unroll
    for (int j = 0; j < PER; j++)
      sum[j] = 0.0f;
    for (int u = threadIdx.x; u < CU_CT * CU_CT / PER; u += CU_THREADS) {
      const int i = u / SLOTS, cj = u % SLOTS * PER;
      const int64_t r = r0 + i, c = c0 + cj;
      uint64_t w = 0;
      if (r < rows && c < cols) {
        cu_pack v;
        v.v = *(const uint4 *)((const char *)a.p[1] + (r * cols + c) * (16 / PER));
        w = cu_cast_pack<PER>(v, s, f, &m);
        cu_put_pack<PER>(q + r * cols + c, w);
        if (part != NULL)
#pragma unroll
          for (int j = 0; j < PER; j++)
            sum[j] = __fadd_rn(sum[j], cu_pack_at<PER>(v, j));
      }
#pragma unroll
      for (int j = 0; j < PER; j++)
        tile[i][cj + j] = (unsigned char)(w >> (8 * j));
    }
    if (part != NULL)
#pragma unroll
      for (int j = 0; j < PER; j++)
        lane_sums[threadIdx.x / SLOTS][threadIdx.x % SLOTS * PER + j] = sum[j];
    __syncthreads();
    if (part != NULL && threadIdx.x < CU_CT && c0 + threadIdx.x < cols) {
      float c_sum = 0.0f;
      for (int l = 0; l < LANES; l++)
        c_sum = __fadd_rn(c_sum, lane_sums[l][threadIdx.x]);
      part[k % rtiles * cols + c0 + threadIdx.x] = c_sum;
    }
    for (int u = threadIdx.x; u < CU_CT * CU_CT / 4; u += CU_THREADS) {
      const int oc = u / (CU_CT / 4), ow = u % (CU_CT / 4);
      const int64_t c = c0 + oc, r = r0 + 4 * ow;
      if (c >= cols || r >= ld) continue;
      unsigned w = 0;
      for (int j = 0; j < 4; j++)
        w |= (unsigned)tile[4 * ow + j][oc] << (8 * j);
      *(unsigned *)(t + c * ld + r) = w;
    }
    __syncthreads();
  }
  cu_amax_note(m, (float *)a.p[3]);
  if (blockIdx.x == 0 && threadIdx.x == 0 && a.p[4] != NULL) *(float *)a.p[4] = __fdiv_rn(1.0f, s);
}

template <int PER> static __global__ void k_fp8_dequantize(gc_kargs a) {
  const unsigned char *q = (const unsigned char *)a.p[1];
  const float si = ((const float *)a.p[2])[0];
  const int f = (int)a.n[1];
  const int64_t n = a.n[0];
  const int64_t packs = ((uintptr_t)a.p[0] % 16 == 0 && (uintptr_t)q % PER == 0) ? n / PER : 0;
  CU_GRID_LOOP(i, packs) {
    cu_pack u;
    uint64_t w;
    if (PER == 8) {
      const uint2 b = *(const uint2 *)(q + i * 8);
      w = (uint64_t)b.x | (uint64_t)b.y << 32;
    } else {
      w = *(const unsigned *)(q + i * 4);
    }
#pragma unroll
    for (int j = 0; j < PER; j++) {
      const float v = __fmul_rn(cu_from_fp8((unsigned char)(w >> (8 * j)), f), si);
      if (PER == 8)
        ((__nv_bfloat16 *)u.h)[j] = __float2bfloat16_rn(v);
      else
        u.f[j] = v;
    }
    ((uint4 *)a.p[0])[i] = u.v;
  }
  CU_GRID_LOOP(i, n - packs * PER) {
    int64_t k = packs * PER + i;
    cu_store(a.p[0], k, PER_DT(PER), __fmul_rn(cu_from_fp8(q[k], f), si));
  }
}

template <int PER> static __global__ void k_fp8_amax(gc_kargs a) {
  const int64_t n = a.n[0];
  const int64_t packs = (uintptr_t)a.p[1] % 16 == 0 ? n / PER : 0;
  float m = 0.0f;
  CU_GRID_LOOP(i, packs) { /* 16 bytes a load */
    cu_pack u;
    u.v = ((const uint4 *)a.p[1])[i];
#pragma unroll
    for (int j = 0; j < PER; j++)
      m = fmaxf(m, fabsf(cu_pack_at<PER>(u, j)));
  }
  CU_GRID_LOOP(i, n - packs * PER) {
    m = fmaxf(m, fabsf(cu_load(a.p[1], packs * PER + i, PER_DT(PER))));
  }
  cu_amax_note(m, (float *)a.p[0]);
}

/* A block of CU_ROW_THREADS threads per role (role n[1] + blockIdx.x): the
** history shifts one place in chunks of a block's threads from its end
** (a chunk is read whole before it is written, and reads only entries below
** those that the chunks after it wrote), then its max is a block reduction
** (a max is exact: any order gives the host's bits). One thread walking a
** history of 1024 amaxes paid a memory round trip an entry, a quarter of a
** millisecond each update. */
static __global__ void __launch_bounds__(CU_ROW_THREADS) k_fp8_update(gc_kargs a) {
  __shared__ float sh[CU_ROW_THREADS];
  const int64_t r = a.n[1] + blockIdx.x, len = a.n[0], roles = a.n[3];
  float *state = (float *)a.p[0];
  float *amax = &state[r], *scale = &state[roles + r], *hist = &state[2 * roles + r * len];
  const float last = *amax;
  float m = 0.0f;
  if (last != 0.0f) { /* the same on every thread: the barriers below are the block's */
    for (int64_t hi = len; hi > 1; hi -= CU_ROW_THREADS) {
      const int64_t j = hi - 1 - threadIdx.x; /* this thread writes entry j */
      const float v = j >= 1 ? hist[j - 1] : 0.0f;
      __syncthreads();
      if (j >= 1) hist[j] = v;
    }
    __syncthreads();
    if (threadIdx.x == 0) hist[0] = last;
    __syncthreads();
    for (int64_t j = threadIdx.x; j < len; j += CU_ROW_THREADS)
      m = fmaxf(m, hist[j]);
  }
  m = cu_block_max(m, sh);
  if (threadIdx.x != 0) return;
  *amax = 0.0f;
  if (last != 0.0f && a.n[4] == 1) m = last;
  if (isfinite(m) && m > 0.0f) {
    float s = __fdiv_rn(a.f[blockIdx.x], m);
    *scale = isinf(s) ? FLT_MAX : s;
  }
}

/* FP8 bytes [rows x cols] transposed into [cols x ld], zeros after each
** row's rows bytes: 32 x 32 tiles through shared memory, so that reads and
** writes both go along rows. blockIdx.x walks the output's columns (the
** input's rows, padding included), blockIdx.y its rows. */
static __global__ void k_fp8_transpose(unsigned char *y, const unsigned char *q, int64_t rows,
                                       int64_t cols, int64_t ld) {
  __shared__ unsigned char t[32][33];
  int64_t r0 = (int64_t)blockIdx.x * 32, c0 = (int64_t)blockIdx.y * 32;
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    int64_t r = r0 + i, c = c0 + threadIdx.x;
    t[i][threadIdx.x] = r < rows && c < cols ? q[r * cols + c] : 0;
  }
  __syncthreads();
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    int64_t c = c0 + i, r = r0 + threadIdx.x;
    if (c < cols && r < ld) y[c * ld + r] = t[threadIdx.x][i];
  }
}

/* The same in 64 x 64 tiles of 4-byte words, when cols and ld are
** multiples of 4 and both pointers 4-byte aligned (the FP8 GEMMs' operands:
** their dims are multiples of 8 and ld of 16): a thread reads a word of an
** input row and writes a word of an output row, the 4 input rows' bytes of
** its column, where byte accesses took four times the instructions and
** a quarter of each memory transaction. */
#define CU_T8 64
static __global__ void __launch_bounds__(CU_THREADS)
    k_fp8_transpose_words(unsigned char *y, const unsigned char *q, int64_t rows, int64_t cols,
                          int64_t ld) {
  __shared__ unsigned t[CU_T8][CU_T8 / 4 + 1]; /* the tile's input rows, in words */
  const int64_t r0 = (int64_t)blockIdx.x * CU_T8, c0 = (int64_t)blockIdx.y * CU_T8;
  for (int k = threadIdx.x; k < CU_T8 * CU_T8 / 4; k += CU_THREADS) {
    const int i = k / (CU_T8 / 4), w = k % (CU_T8 / 4);
    const int64_t r = r0 + i, c = c0 + 4 * w;
    t[i][w] = r < rows && c < cols ? *(const unsigned *)(q + r * cols + c) : 0u;
  }
  __syncthreads();
  for (int k = threadIdx.x; k < CU_T8 * CU_T8 / 4; k += CU_THREADS) {
    const int oc = k / (CU_T8 / 4), ow = k % (CU_T8 / 4), sh = 8 * (oc % 4);
    const int64_t c = c0 + oc, r = r0 + 4 * ow;
    if (c >= cols || r >= ld) continue;
    unsigned v = 0;
    for (int j = 0; j < 4; j++)
      v |= ((t[4 * ow + j][oc / 4] >> sh) & 0xffu) << (8 * j);
    *(unsigned *)(y + c * ld + r) = v;
  }
}

/* The rows of q [rows x cols] into y [rows x ld], zeros after each. */
static __global__ void k_fp8_pad(unsigned char *y, const unsigned char *q, int64_t rows,
                                 int64_t cols, int64_t ld) {
  CU_GRID_LOOP(i, rows * ld) {
    int64_t r = i / ld, c = i % ld;
    y[i] = c < cols ? q[r * cols + c] : 0;
  }
}

/* y [cols x ld] = the bytes q [rows x cols] transposed, zeros after each
** row's rows bytes: the word kernel where the layout allows it. The
** quantize's transpose where the cast-transpose cannot take the layout. */
static void cu_fp8_transpose(cudaStream_t s, unsigned char *y, const unsigned char *q, int64_t rows,
                             int64_t cols, int64_t ld) {
  if (cols % 4 == 0 && ld % 4 == 0 && (uintptr_t)y % 4 == 0 && (uintptr_t)q % 4 == 0) {
    dim3 grid((unsigned)((ld + CU_T8 - 1) / CU_T8), (unsigned)((cols + CU_T8 - 1) / CU_T8));
    k_fp8_transpose_words<<<grid, CU_THREADS, 0, s>>>(y, q, rows, cols, ld);
  } else {
    dim3 grid((unsigned)((ld + 31) / 32), (unsigned)((cols + 31) / 32)), block(32, 8);
    k_fp8_transpose<<<grid, block, 0, s>>>(y, q, rows, cols, ld);
  }
}

gcap_status cu_fp8(gcap_engine *, cu_state *, cudaStream_t s, int k, const gc_kargs *a) {
  unsigned g = cu_blocks(a->n[0] / 4 > 0 ? a->n[0] / 4 : 1);
  unsigned ga = g < CU_FP8_BLOCKS ? g : CU_FP8_BLOCKS; /* the kernels that note an amax */
  const bool bf = a->dt == GCAP_BF16;
  void (*quantize)(gc_kargs) = bf ? k_fp8_quantize<8> : k_fp8_quantize<4>;
  switch (k) {
    case GC_K_FP8_QUANTIZE: {
      int64_t rows = a->n[3], cols = a->n[4], ld = a->n[5], per = bf ? 8 : 4;
      if (a->p[6] == NULL || rows <= 0 || cols <= 0) {
        quantize<<<ga, CU_THREADS, 0, s>>>(*a);
      } else if (cols % per == 0 && ld % 4 == 0 && (uintptr_t)a->p[1] % 16 == 0 &&
                 (uintptr_t)a->p[0] % 8 == 0 && (uintptr_t)a->p[6] % 4 == 0) {
        int64_t tiles = (ld + CU_CT - 1) / CU_CT * ((cols + CU_CT - 1) / CU_CT);
        unsigned gt = (unsigned)(tiles < CU_FP8_BLOCKS ? tiles : CU_FP8_BLOCKS);
        (bf ? k_fp8_cast_transpose<8> : k_fp8_cast_transpose<4>)<<<gt, CU_THREADS, 0, s>>>(*a);
        if (a->p[7] != NULL && a->p[8] != NULL) { /* the tiles' column sums joined */
          cu_join_chunks(s, a->p[7], (const float *)a->p[8], a->dt, cols,
                         (int)GC_FP8_DBIAS_CHUNKS(ld));
          break;
        }
      } else { /* the cast, then its bytes transposed */
        quantize<<<ga, CU_THREADS, 0, s>>>(*a);
        cu_fp8_transpose(s, (unsigned char *)a->p[6], (const unsigned char *)a->p[0], rows, cols,
                         ld);
      }
      if (a->p[7] != NULL) /* column sums the cast did not make */
        cu_sum_rows(s, a->p[7], a->p[1], a->dt, rows, cols, (float *)a->p[8],
                    (int)GC_FP8_DBIAS_CHUNKS(ld));
      break;
    }
    case GC_K_FP8_DEQUANTIZE:
      if (a->n[0] > 0)
        (bf ? k_fp8_dequantize<8> : k_fp8_dequantize<4>)<<<g, CU_THREADS, 0, s>>>(*a);
      break;
    case GC_K_FP8_AMAX:
      (bf ? k_fp8_amax<8> : k_fp8_amax<4>)<<<ga, CU_THREADS, 0, s>>>(*a);
      break;
    case GC_K_FP8_PAD:
      if (a->n[0] > 0 && a->n[2] > 0)
        k_fp8_pad<<<cu_blocks(a->n[0] * a->n[2]), CU_THREADS, 0, s>>>(
            (unsigned char *)a->p[0], (const unsigned char *)a->p[1], a->n[0], a->n[1], a->n[2]);
      break;
    default: /* GC_K_FP8_UPDATE */
      if (a->n[2] > 0) k_fp8_update<<<(unsigned)a->n[2], CU_ROW_THREADS, 0, s>>>(*a);
      break;
  }
  return GCAP_OK;
}
