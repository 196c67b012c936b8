/*
** k_optim.c: the optimizers' reference kernels (GC_K_SGD, GC_K_ADAM,
** GC_K_COUNTER_INC). The learning rate and the step count are read from
** device memory when a kernel runs, so that a replayed step follows what was
** written there since the capture (a schedule, the bias correction).
*/
#include <math.h>

#include "kernels.h"

void hk_sgd(const gc_kargs *a) {
  void *param = a->p[0], *buf = a->p[2];
  const void *grad = a->p[1];
  const float *lrp = (const float *)a->p[3];
  int64_t n = a->n[0], i;
  float lr = lrp[0], momentum = a->f[1], wd = a->f[2];
  int dt = a->dt;
  for (i = 0; i < n; i++) {
    float p = gc_load(param, dt, i), d = gc_load(grad, dt, i);
    if (wd != 0.0f) d += wd * p;
    if (buf) {
      float b = momentum * gc_load(buf, dt, i) + d;
      gc_store(buf, dt, i, b);
      d = b;
    }
    gc_store(param, dt, i, p - lr * d);
  }
}

/* PyTorch's Adam: p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps); AdamW
** (decoupled) first p *= 1 - lr * wd, and adds no wd * p to the grad. */
void hk_adam(const gc_kargs *a) {
  void *param = a->p[0], *exp_avg = a->p[2], *exp_avg_sq = a->p[3];
  const void *grad = a->p[1];
  const float *step = (const float *)a->p[4], *lrp = (const float *)a->p[5];
  int64_t n = a->n[0], i;
  float lr = lrp[0], beta1 = a->f[1], beta2 = a->f[2], eps = a->f[3], wd = a->f[4];
  int dt = a->dt, decoupled = a->n[1] != 0;
  float t = step[0];
  float bc1 = 1.0f - powf(beta1, t), bc2 = 1.0f - powf(beta2, t);
  float decay = 1.0f - lr * wd;
  for (i = 0; i < n; i++) {
    float p = gc_load(param, dt, i), g = gc_load(grad, dt, i);
    float m, v;
    if (decoupled)
      p = p * decay;
    else if (wd != 0.0f)
      g += wd * p;
    m = beta1 * gc_load(exp_avg, dt, i) + (1.0f - beta1) * g;
    v = beta2 * gc_load(exp_avg_sq, dt, i) + (1.0f - beta2) * g * g;
    gc_store(exp_avg, dt, i, m);
    gc_store(exp_avg_sq, dt, i, v);
    gc_store(param, dt, i, p - (lr / bc1) * m / (sqrtf(v) / sqrtf(bc2) + eps));
  }
}

void hk_counter_inc(const gc_kargs *a) {
  float *count = (float *)a->p[0];
  count[0] += 1.0f;
}
