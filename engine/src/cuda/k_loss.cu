/*
** k_loss.cu: GC_K_DROPOUT, GC_K_XENT and GC_K_XENT_BWD.
**
** dropout draws gc_rng_uniform(seed, offset + i) from the state in device
** memory, read when the kernel runs, exactly as the host does: masks are
** equal bit for bit across backends, and a replay draws from the current
** state as an eager run does. It does not advance the state (the core
** launches GC_K_RNG_ADVANCE for that).
**
** Cross entropy runs one block per logits row, reduced in a fixed order
** (common.cuh's cu_block_max and cu_block_sum); its backward is elementwise
** and, with round-to-nearest intrinsics in the host's order, equals the host
** bit for bit in f32.
*/
#include <math.h>

#include "common.cuh"
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
                              int dt, int64_t rows, int64_t cols) {
  __shared__ float sh[CU_ROW_THREADS];
  CU_ROW_LOOP(r, rows) {
    const int64_t o = r * cols;
    float mx, s;
    cu_row_exp_stats(logits, o, cols, dt, sh, &mx, &s);
    if (threadIdx.x == 0) { /* before the probs are written, should they alias the logits */
      int64_t t = cu_target(target, r, dt, cols);
      float xt = t >= 0 ? cu_load(logits, o + t, dt) : NAN;
      cu_store(loss, r, dt, __fsub_rn(__fadd_rn(logf(s), mx), xt));
    }
    __syncthreads();
    for (int64_t c = threadIdx.x; c < cols; c += CU_ROW_THREADS)
      cu_store(probs, o + c, dt, __fdiv_rn(expf(__fsub_rn(cu_load(logits, o + c, dt), mx)), s));
  }
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
      k_xent<<<cu_row_blocks(rows), CU_ROW_THREADS, 0, s>>>(a->p[0], a->p[1], a->p[2], a->p[3], dt,
                                                            rows, cols);
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
