/*
** rows.cuh: rows of f32 or bf16 held in registers by a warp or a block, for
** the row kernels of k_norm.cu and k_loss.cu. Internal to engine/src/cuda.
*/
#ifndef GC_CUDA_ROWS_CUH
#define GC_CUDA_ROWS_CUH

#include <type_traits>

#include "common.cuh"

/*
** Rows held in registers (the softmax, LayerNorm and cross entropy): a row
** is read once and written once. W
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

/* launch(W, K) (two std::integral_constant) for the layout whose threads
** hold a row of `packs` 16-byte packs with as few idle registers as the
** shapes allow: a warp of 1, 2 or 4 packs a lane, else a block of 8 warps of
** 1, 2 or 4 packs a thread; false when the row is longer than 1024 packs. */
template <typename L> static inline bool cu_rows_pick(int64_t packs, L &&launch) {
  using std::integral_constant;
  if (packs <= 32)
    launch(integral_constant<int, 1>(), integral_constant<int, 1>());
  else if (packs <= 64)
    launch(integral_constant<int, 1>(), integral_constant<int, 2>());
  else if (packs <= 128)
    launch(integral_constant<int, 1>(), integral_constant<int, 4>());
  else if (packs <= 256)
    launch(integral_constant<int, 8>(), integral_constant<int, 1>());
  else if (packs <= 512)
    launch(integral_constant<int, 8>(), integral_constant<int, 2>());
  else if (packs <= 1024)
    launch(integral_constant<int, 8>(), integral_constant<int, 4>());
  else
    return false;
  return true;
}

#endif
