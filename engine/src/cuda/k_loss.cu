/*
** k_loss.cu: GC_K_DROPOUT, GC_K_XENT and GC_K_XENT_BWD.
**
** dropout draws gc_rng_uniform(seed, offset + i) from the state in device
** memory, read when the kernel runs, exactly as the host does: masks are
** equal bit for bit across backends, and a replay draws from the current
** state as an eager run does. It does not advance the state (the core
** launches GC_K_RNG_ADVANCE for that).
**
** Cross entropy holds a logits row in registers where it fits (rows.cuh:
** one read of the row, one write of its probs), else runs one block per row
** in three passes; both reduce in a fixed order; its backward is elementwise
** and, with round-to-nearest intrinsics in the host's order, equals the host
** bit for bit in f32.
*/
#include <math.h>

#include "common.cuh"
#include "rows.cuh"
#include "runtime/rng.h"

/* mask[i] = u(seed, offset + i) >= p ? scale : 0; y[i] = x[i] * mask[i], the
** product taken with the unrounded float mask (as the host). */
static __global__ void k_dropout(void *y, const void *x, void *mask, const uint64_t *state, int dt,
                                 int64_t n, float p, float scale) {
  uint64_t seed = state[0], off = state[1];
  CU_GRID_LOOP(i, n) {
    float m = gc_rng_uniform(seed, off + (uint64_t)i) >= p ? scale : 0.0f;
    cu_store(mask, i, dt, m);
    cu_store(y, i, dt, __fmul_rn(cu_load(x, i, dt), m));
  }
}

/* The class id of row r, or -1 when it is no column of the row: not an
** integer (1.5, NaN), negative or too large (the host's class_id); the loss
** and grads of such a row are NaN, rather than a read out of bounds. */
__device__ __forceinline__ int64_t cu_target(const void *target, int64_t r, int dt, int64_t cols) {
  float t = cu_load(target, r, dt);
  if (!(t >= 0.0f && t < (float)cols && t == floorf(t))) return -1;
  return (int64_t)t;
}

/* probs = softmax(logits); loss[r] = log(sum) + max - logits[r][target]. */
static __global__ void k_xent(void *loss, const void *logits, const void *target, void *probs,
                              void *badid, int64_t graph, int dt, int64_t rows, int64_t cols) {
  __shared__ float sh[CU_ROW_THREADS];
  CU_ROW_LOOP(r, rows) {
    const int64_t o = r * cols;
    float mx, s;
    cu_row_exp_stats(logits, o, cols, dt, sh, &mx, &s);
    if (threadIdx.x == 0) { /* before the probs are written, should they alias the logits */
      int64_t t = cu_target(target, r, dt, cols);
      float xt = t >= 0 ? cu_load(logits, o + t, dt) : NAN;
      cu_store(loss, r, dt, __fsub_rn(__fadd_rn(logf(s), mx), xt));
      if (t < 0) cu_badid_note(badid, GC_BADID_XENT, graph, r, cu_load(target, r, dt), cols);
    }
    __syncthreads();
    for (int64_t c = threadIdx.x; c < cols; c += CU_ROW_THREADS)
      cu_store(probs, o + c, dt, __fdiv_rn(expf(__fsub_rn(cu_load(logits, o + c, dt), mx)), s));
  }
}

/* k_xent with the row held in registers (rows.cuh); the target's logit is
** read before the first reduction, so before any probs (which may alias
** the logits) are written. */
template <typename T, int W, int K>
static __global__ void __launch_bounds__(32 * W * CU_SM_RB(W))
    k_xent_regs(T *loss, const T *logits, const void *target, T *probs, void *badid, int64_t graph,
                int dt, int64_t rows, int cols, bool vec) {
  constexpr int NT = 32 * W, N = K * 16 / (int)sizeof(T);
  __shared__ float sh[W];
  const int t = (int)threadIdx.x % NT;
  CU_SM_ROW_LOOP(r, rows, W) {
    float v[N], mx = -INFINITY, s = 0.0f, xt = NAN;
    cu_sm_load<T, NT, K>(v, logits + r * cols, cols, t, vec);
    if (t == 0) {
      const int64_t tc = cu_target(target, r, dt, cols);
      if (tc >= 0)
        xt = cu_sm_elt<T>::get(logits[r * cols + tc]);
      else
        cu_badid_note(badid, GC_BADID_XENT, graph, r, cu_load(target, r, dt), cols);
    }
#pragma unroll
    for (int i = 0; i < N; i++)
      if (cu_sm_col<T, NT>(i, t) < cols) mx = fmaxf(mx, v[i]);
    mx = cu_sm_reduce<W>(mx, sh, [](float u, float w) { return fmaxf(u, w); });
#pragma unroll
    for (int i = 0; i < N; i++) {
      v[i] = cu_sm_col<T, NT>(i, t) < cols ? expf(__fsub_rn(v[i], mx)) : 0.0f;
      s = __fadd_rn(s, v[i]);
    }
    s = cu_sm_reduce<W>(s, sh, [](float u, float w) { return __fadd_rn(u, w); });
#pragma unroll
    for (int i = 0; i < N; i++)
      v[i] = __fdiv_rn(v[i], s);
    cu_sm_store<T, NT, K>(probs + r * cols, v, cols, t, vec);
    if (t == 0) loss[r] = cu_sm_elt<T>::put(__fsub_rn(__fadd_rn(logf(s), mx), xt));
  }
}

/* Launch k_xent_regs; false when the row is too long for registers. */
template <typename T> static bool cu_xent_fast(cudaStream_t s, const gc_kargs *a) {
  constexpr int P = 16 / sizeof(T);
  const int64_t rows = a->n[0], cols = a->n[1], packs = (cols + P - 1) / P;
  const bool vec = cu_packs(cols, a->dt, a->p[1], a->p[3], NULL) != 0;
  return cu_rows_pick(packs, [&](auto w, auto kp) {
    constexpr int W = decltype(w)::value, K = decltype(kp)::value;
    const int64_t groups = (rows + CU_SM_RB(W) - 1) / CU_SM_RB(W);
    const unsigned g = (unsigned)(groups < CU_MAX_BLOCKS ? groups : CU_MAX_BLOCKS);
    k_xent_regs<T, W, K><<<g, 32 * W * CU_SM_RB(W), 0, s>>>((T *)a->p[0], (const T *)a->p[1],
                                                            a->p[2], (T *)a->p[3], a->p[4], a->n[2],
                                                            a->dt, rows, (int)cols, vec);
  });
}

/* dlogits = (probs - onehot(target)) * (up[0] * f); up is read on the device,
** so a replay uses the upstream grad of its own run. */
static __global__ void k_xent_bwd(void *dx, const void *probs, const void *target, const void *up,
                                  int dt, int64_t rows, int64_t cols, float f) {
  float g = __fmul_rn(cu_load(up, 0, dt), f);
  CU_GRID_LOOP(i, rows * cols) {
    int64_t r = i / cols, c = i - r * cols, t = cu_target(target, r, dt, cols);
    float hot = c == t ? 1.0f : 0.0f;
    cu_store(dx, i, dt, t < 0 ? NAN : __fmul_rn(__fsub_rn(cu_load(probs, i, dt), hot), g));
  }
}

gcap_status cu_loss(gcap_engine *, cu_state *, cudaStream_t s, int k, const gc_kargs *a) {
  int dt = a->dt;
  switch (k) {
    case GC_K_DROPOUT: {
      int64_t n = a->n[0];
      float p = a->f[0], scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f; /* the host's, in float */
      if (n <= 0) break;
      k_dropout<<<cu_blocks(n), CU_THREADS, 0, s>>>(a->p[0], a->p[1], a->p[2],
                                                    (const uint64_t *)a->p[3], dt, n, p, scale);
      break;
    }
    case GC_K_XENT: {
      int64_t rows = a->n[0], cols = a->n[1];
      if (rows <= 0 || cols <= 0) break;
      if (dt == GCAP_BF16 ? cu_xent_fast<__nv_bfloat16>(s, a) : cu_xent_fast<float>(s, a)) break;
      k_xent<<<cu_row_blocks(rows), CU_ROW_THREADS, 0, s>>>(a->p[0], a->p[1], a->p[2], a->p[3],
                                                            a->p[4], a->n[2], dt, rows, cols);
      break;
    }
    default: { /* GC_K_XENT_BWD */
      int64_t rows = a->n[0], cols = a->n[1];
      if (rows <= 0 || cols <= 0) break;
      k_xent_bwd<<<cu_blocks(rows * cols), CU_THREADS, 0, s>>>(a->p[0], a->p[1], a->p[2], a->p[3],
                                                               dt, rows, cols, a->f[0]);
      break;
    }
  }
  return GCAP_OK;
}
