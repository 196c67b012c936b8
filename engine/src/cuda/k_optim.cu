/*
** k_optim.cu: GC_K_SGD, GC_K_ADAM and GC_K_COUNTER_INC.
**
** Elementwise updates with round-to-nearest intrinsics in the host's order
** (never fused into an FMA): sgd and the counter equal the host bit for bit
** in f32. The kernels read the learning rate and Adam's step count from
** device memory when they run, so a replayed graph applies the rate set
** since and the bias correction of the current step; only Adam's powers of
** beta1 and beta2 can differ from the C library's by an ulp.
*/
#include <math.h>

#include "common.cuh"

/* d = grad (+ wd * param); with momentum, buf = mom * buf + d and d = buf
** (unrounded, as the host); param -= lr * d. */
static __global__ void k_sgd(void *param, const void *grad, void *buf, int dt, int64_t n,
                             const float *lrp, float mom, float wd) {
  float lr = lrp[0];
  CU_GRID_LOOP(i, n) {
    float p = cu_load(param, i, dt), d = cu_load(grad, i, dt);
    if (wd != 0.0f) d = __fadd_rn(d, __fmul_rn(wd, p));
    if (buf) {
      float b = __fadd_rn(__fmul_rn(mom, cu_load(buf, i, dt)), d);
      cu_store(buf, i, dt, b);
      d = b;
    }
    cu_store(param, i, dt, __fsub_rn(p, __fmul_rn(lr, d)));
  }
}

/* beta^t for the bias corrections: in double, then rounded, so that it is
** the correctly rounded float almost always, as the host's powf. */
__device__ __forceinline__ float cu_powf(float b, float t) {
  return (float)pow((double)b, (double)t);
}

/* PyTorch's Adam, as the host: g = grad (+ wd * param), or with decoupled
** decay (AdamW) param *= 1 - lr wd instead; m = b1 m + (1 - b1) g;
** v = b2 v + (1 - b2) g g; param -= (lr / bc1) m / (sqrt(v) / sqrt(bc2) + eps),
** bc = 1 - beta^step. */
static __global__ void k_adam(void *param, const void *grad, void *m_, void *v_, const float *step,
                              const float *lrp, int decoupled, int dt, int64_t n, float b1,
                              float b2, float eps, float wd) {
  float t = step[0], lr = lrp[0];
  float bc1 = __fsub_rn(1.0f, cu_powf(b1, t)), bc2 = __fsub_rn(1.0f, cu_powf(b2, t));
  float lr1 = __fdiv_rn(lr, bc1), sbc2 = __fsqrt_rn(bc2);
  float decay = __fsub_rn(1.0f, __fmul_rn(lr, wd));
  CU_GRID_LOOP(i, n) {
    float p = cu_load(param, i, dt), g = cu_load(grad, i, dt);
    if (decoupled)
      p = __fmul_rn(p, decay);
    else if (wd != 0.0f)
      g = __fadd_rn(g, __fmul_rn(wd, p));
    float m = __fadd_rn(__fmul_rn(b1, cu_load(m_, i, dt)), __fmul_rn(__fsub_rn(1.0f, b1), g));
    float v = __fadd_rn(__fmul_rn(b2, cu_load(v_, i, dt)),
                        __fmul_rn(__fmul_rn(__fsub_rn(1.0f, b2), g), g));
    cu_store(m_, i, dt, m);
    cu_store(v_, i, dt, v);
    float den = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), sbc2), eps);
    cu_store(param, i, dt, __fsub_rn(p, __fdiv_rn(__fmul_rn(lr1, m), den)));
  }
}

static __global__ void k_counter_inc(float *c) {
  c[0] = __fadd_rn(c[0], 1.0f);
}

gcap_status cu_optim(gcap_engine *, cu_state *, cudaStream_t s, int k, const gc_kargs *a) {
  int64_t n = a->n[0];
  switch (k) {
    case GC_K_SGD:
      if (n <= 0) break;
      k_sgd<<<cu_blocks(n), CU_THREADS, 0, s>>>(a->p[0], a->p[1], a->p[2], a->dt, n,
                                                (const float *)a->p[3], a->f[1], a->f[2]);
      break;
    case GC_K_ADAM:
      if (n <= 0) break;
      k_adam<<<cu_blocks(n), CU_THREADS, 0, s>>>(
          a->p[0], a->p[1], a->p[2], a->p[3], (const float *)a->p[4], (const float *)a->p[5],
          a->n[1] != 0, a->dt, n, a->f[1], a->f[2], a->f[3], a->f[4]);
      break;
    default: /* GC_K_COUNTER_INC */
      k_counter_inc<<<1, 1, 0, s>>>((float *)a->p[0]);
      break;
  }
  return GCAP_OK;
}
