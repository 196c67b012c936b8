/*
** kernels.c: reference kernels in plain C. They define what every op
** computes; the cuda kernels are checked against them (parity tests).
** Storage is f32 or bf16 (the upper half of an f32, rounded to nearest even);
** arithmetic is always in float.
*/
#include <math.h>
#include <string.h>

#include "runtime/rng.h"
#include "kernels.h"

static void hk_fill(const gc_kargs *a) {
  int64_t i;
  for (i = 0; i < a->n[0]; i++)
    gc_store(a->p[0], a->dt, i, a->f[0]);
}

/* dt is the destination's dtype, n[1] the source's. */
static void hk_copy(const gc_kargs *a) {
  int64_t i;
  if (a->p[0] == a->p[1]) return;
  for (i = 0; i < a->n[0]; i++)
    gc_store(a->p[0], a->dt, i, gc_load(a->p[1], (int)a->n[1], i));
}

/* out[i] = x[i % nx] OP y[i % ny]: equal shapes, one element, or a row. */
#define HK_BINARY(name, OP)                                                                        \
  static void name(const gc_kargs *a) {                                                            \
    int64_t i;                                                                                     \
    for (i = 0; i < a->n[0]; i++) {                                                                \
      float x = gc_load(a->p[1], a->dt, i % a->n[1]), y = gc_load(a->p[2], a->dt, i % a->n[2]);    \
      gc_store(a->p[0], a->dt, i, x OP y);                                                         \
    }                                                                                              \
  }
HK_BINARY(hk_add, +)
HK_BINARY(hk_sub, -)
HK_BINARY(hk_mul, *)

static void hk_scale(const gc_kargs *a) {
  int64_t i;
  for (i = 0; i < a->n[0]; i++)
    gc_store(a->p[0], a->dt, i, gc_load(a->p[1], a->dt, i) * a->f[0]);
}

/* A float sum in the order of a binary tree over 256-element leaves, so that
** the result does not drift with n the way a running sum does. */
static float tree_sum(const void *p, int dt, int64_t lo, int64_t hi) {
  if (hi - lo <= 256) {
    float s = 0.0f;
    int64_t i;
    for (i = lo; i < hi; i++)
      s += gc_load(p, dt, i);
    return s;
  }
  {
    int64_t mid = lo + (hi - lo) / 2;
    return tree_sum(p, dt, lo, mid) + tree_sum(p, dt, mid, hi);
  }
}

static void hk_sum(const gc_kargs *a) {
  gc_store(a->p[0], a->dt, 0, a->f[0] * tree_sum(a->p[1], a->dt, 0, a->n[0]));
}

static void hk_rand(const gc_kargs *a) {
  const uint64_t *state = (const uint64_t *)a->p[1];
  uint64_t seed = state[0], off = state[1];
  int64_t i;
  for (i = 0; i < a->n[0]; i++)
    gc_store(a->p[0], a->dt, i,
             a->n[1] ? gc_rng_normal(seed, off + (uint64_t)i)
                     : gc_rng_uniform(seed, off + (uint64_t)i));
}

static void hk_rng_advance(const gc_kargs *a) {
  ((uint64_t *)a->p[0])[1] += (uint64_t)a->n[0];
}

static void hk_expand(const gc_kargs *a) {
  int64_t i;
  for (i = 0; i < a->n[0]; i++)
    gc_store(a->p[0], a->dt, i, a->f[0] * gc_load(a->p[1], a->dt, i % a->n[1]));
}

/* (The scratch of p[2] is for backends that sum chunks in parallel.) */
static void hk_sum_rows(const gc_kargs *a) {
  int64_t i, j, rows = a->n[0], cols = a->n[1];
  for (j = 0; j < cols; j++) {
    float s = 0.0f;
    for (i = 0; i < rows; i++)
      s += gc_load(a->p[1], a->dt, i * cols + j);
    gc_store(a->p[0], a->dt, j, s);
  }
}

#define GELU_C 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_K 0.044715f

static float gelu(float x) {
  float t = tanhf(GELU_C * (x + GELU_K * x * x * x));
  return 0.5f * x * (1.0f + t);
}

/* C[m x n] = alpha op(A) op(B) + beta C, the sum over k in ascending order. */
static void hk_matmul(const gc_kargs *a) {
  int64_t m = a->n[0], n = a->n[1], k = a->n[2], i, j, l;
  int ta = a->n[3] != 0, tb = a->n[4] != 0;
  for (i = 0; i < m; i++)
    for (j = 0; j < n; j++) {
      float s = 0.0f;
      for (l = 0; l < k; l++) {
        float x = gc_load(a->p[1], a->dt, ta ? l * m + i : i * k + l);
        float y = gc_load(a->p[2], a->dt, tb ? j * k + l : l * n + j);
        s += x * y;
      }
      s *= a->f[0];
      if (a->f[1] != 0.0f) s += a->f[1] * gc_load(a->p[0], a->dt, i * n + j);
      if (a->p[3]) s += gc_load(a->p[3], a->dt, j);
      if (a->p[5]) { /* the pre-activation as stored, then its gelu */
        gc_store(a->p[5], a->dt, i * n + j, s);
        s = gelu(gc_load(a->p[5], a->dt, i * n + j));
      }
      gc_store(a->p[0], a->dt, i * n + j, s);
    }
  for (i = 0; a->p[4] && i < m; i++) { /* bias grad: the rows of op(A) summed over k */
    float s = 0.0f;
    for (l = 0; l < k; l++)
      s += gc_load(a->p[1], a->dt, ta ? l * m + i : i * k + l);
    gc_store(a->p[4], a->dt, i, s);
  }
}

static void hk_relu(const gc_kargs *a) {
  int64_t i;
  for (i = 0; i < a->n[0]; i++) {
    float x = gc_load(a->p[1], a->dt, i);
    gc_store(a->p[0], a->dt, i, x > 0.0f ? x : 0.0f);
  }
}

static void hk_relu_bwd(const gc_kargs *a) {
  int64_t i;
  for (i = 0; i < a->n[0]; i++)
    gc_store(a->p[0], a->dt, i,
             gc_load(a->p[2], a->dt, i) > 0.0f ? gc_load(a->p[1], a->dt, i) : 0.0f);
}

static void hk_gelu(const gc_kargs *a) {
  int64_t i;
  for (i = 0; i < a->n[0]; i++)
    gc_store(a->p[0], a->dt, i, gelu(gc_load(a->p[1], a->dt, i)));
}

static void hk_gelu_bwd(const gc_kargs *a) {
  int64_t i, j, cols = a->n[1];
  for (i = 0; i < a->n[0]; i++) {
    float x = gc_load(a->p[2], a->dt, i);
    float t = tanhf(GELU_C * (x + GELU_K * x * x * x));
    float d =
        0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * GELU_C * (1.0f + 3.0f * GELU_K * x * x);
    gc_store(a->p[0], a->dt, i, gc_load(a->p[1], a->dt, i) * d);
  }
  for (j = 0; a->p[3] && j < cols; j++) { /* column sums, rows in order */
    float s = 0.0f;
    for (i = j; i < a->n[0]; i += cols)
      s += gc_load(a->p[0], a->dt, i);
    gc_store(a->p[3], a->dt, j, s);
  }
}

static void hk_layer_norm(const gc_kargs *a) {
  int64_t r, c, rows = a->n[0], cols = a->n[1];
  for (r = 0; r < rows; r++) {
    float mean = 0.0f, var = 0.0f, rstd;
    for (c = 0; c < cols; c++)
      mean += gc_load(a->p[1], a->dt, r * cols + c);
    mean /= (float)cols;
    for (c = 0; c < cols; c++) {
      float d = gc_load(a->p[1], a->dt, r * cols + c) - mean;
      var += d * d;
    }
    var /= (float)cols;
    rstd = 1.0f / sqrtf(var + a->f[0]);
    for (c = 0; c < cols; c++) {
      float y = (gc_load(a->p[1], a->dt, r * cols + c) - mean) * rstd;
      if (a->p[2]) y *= gc_load(a->p[2], a->dt, c);
      if (a->p[3]) y += gc_load(a->p[3], a->dt, c);
      gc_store(a->p[0], a->dt, r * cols + c, y);
    }
    ((float *)a->p[4])[r] = mean;
    ((float *)a->p[5])[r] = rstd;
  }
}

static void hk_layer_norm_bwd(const gc_kargs *a) {
  int64_t r, c, rows = a->n[0], cols = a->n[1];
  for (r = 0; r < rows; r++) {
    float mean = ((const float *)a->p[4])[r], rstd = ((const float *)a->p[5])[r];
    float sg = 0.0f, sgx = 0.0f; /* sums of dxhat and dxhat * xhat over the row */
    for (c = 0; c < cols; c++) {
      float xh = (gc_load(a->p[2], a->dt, r * cols + c) - mean) * rstd;
      float g =
          gc_load(a->p[1], a->dt, r * cols + c) * (a->p[3] ? gc_load(a->p[3], a->dt, c) : 1.0f);
      sg += g;
      sgx += g * xh;
    }
    sg /= (float)cols;
    sgx /= (float)cols;
    for (c = 0; c < cols; c++) {
      float xh = (gc_load(a->p[2], a->dt, r * cols + c) - mean) * rstd;
      float g =
          gc_load(a->p[1], a->dt, r * cols + c) * (a->p[3] ? gc_load(a->p[3], a->dt, c) : 1.0f);
      gc_store(a->p[0], a->dt, r * cols + c, rstd * (g - sg - xh * sgx));
    }
  }
}

static void hk_layer_norm_bwd_params(const gc_kargs *a) {
  int64_t r, c, rows = a->n[0], cols = a->n[1];
  for (c = 0; c < cols; c++) {
    float dw = 0.0f, db = 0.0f;
    for (r = 0; r < rows; r++) {
      float dy = gc_load(a->p[2], a->dt, r * cols + c);
      float xh = (gc_load(a->p[3], a->dt, r * cols + c) - ((const float *)a->p[4])[r]) *
                 ((const float *)a->p[5])[r];
      dw += dy * xh;
      db += dy;
    }
    if (a->p[0]) gc_store(a->p[0], a->dt, c, dw);
    if (a->p[1]) gc_store(a->p[1], a->dt, c, db);
  }
}

/* y[c] = softmax(x)[c] over one row of cols elements (at element r * cols);
** returns log(sum(exp(x))), the row's log-partition. */
static float row_softmax(void *y, const void *x, int dt, int64_t r, int64_t cols) {
  float mx = -INFINITY, s = 0.0f;
  int64_t c;
  for (c = 0; c < cols; c++)
    mx = fmaxf(mx, gc_load(x, dt, r * cols + c));
  for (c = 0; c < cols; c++)
    s += expf(gc_load(x, dt, r * cols + c) - mx);
  for (c = 0; c < cols; c++)
    gc_store(y, dt, r * cols + c, expf(gc_load(x, dt, r * cols + c) - mx) / s);
  return cols > 0 ? logf(s) + mx : -INFINITY; /* an empty row: log(0) */
}

static void hk_softmax(const gc_kargs *a) {
  int64_t r;
  for (r = 0; r < a->n[0]; r++)
    row_softmax(a->p[0], a->p[1], a->dt, r, a->n[1]);
}

static void hk_softmax_bwd(const gc_kargs *a) {
  int64_t r, c, rows = a->n[0], cols = a->n[1];
  for (r = 0; r < rows; r++) {
    float dot = 0.0f;
    for (c = 0; c < cols; c++)
      dot += gc_load(a->p[1], a->dt, r * cols + c) * gc_load(a->p[2], a->dt, r * cols + c);
    for (c = 0; c < cols; c++) {
      float y = gc_load(a->p[2], a->dt, r * cols + c);
      gc_store(a->p[0], a->dt, r * cols + c, y * (gc_load(a->p[1], a->dt, r * cols + c) - dot));
    }
  }
}

static void hk_dropout(const gc_kargs *a) {
  const uint64_t *state = (const uint64_t *)a->p[3];
  float p = a->f[0], scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  int64_t i;
  for (i = 0; i < a->n[0]; i++) {
    float m = gc_rng_uniform(state[0], state[1] + (uint64_t)i) >= p ? scale : 0.0f;
    gc_store(a->p[2], a->dt, i, m);
    gc_store(a->p[0], a->dt, i, gc_load(a->p[1], a->dt, i) * m);
  }
}

/* The class id of row r, or -1 when the target is no column of the row:
** not an integer (1.5, NaN), negative or too large. Checked before the cast
** (a NaN or huge float cast to an integer is undefined). */
static int64_t class_id(const gc_kargs *a, int64_t r, int64_t cols) {
  float t = gc_load(a->p[2], a->dt, r);
  return t >= 0.0f && t < (float)cols && t == floorf(t) ? (int64_t)t : -1;
}

static void hk_cross_entropy(const gc_kargs *a) {
  int64_t r, rows = a->n[0], cols = a->n[1];
  for (r = 0; r < rows; r++) {
    int64_t t = class_id(a, r, cols);
    float lse = row_softmax(a->p[3], a->p[1], a->dt, r, cols);
    /* no class id: NaN, never an out-of-bounds read */
    gc_store(a->p[0], a->dt, r, t >= 0 ? lse - gc_load(a->p[1], a->dt, r * cols + t) : NAN);
  }
}

static void hk_cross_entropy_bwd(const gc_kargs *a) {
  int64_t r, c, rows = a->n[0], cols = a->n[1];
  float g = gc_load(a->p[3], a->dt, 0) * a->f[0];
  for (r = 0; r < rows; r++) {
    int64_t t = class_id(a, r, cols);
    for (c = 0; c < cols; c++) /* no class id: NaN grads, as the loss */
      gc_store(a->p[0], a->dt, r * cols + c,
               t < 0 ? NAN : (gc_load(a->p[1], a->dt, r * cols + c) - (c == t ? 1.0f : 0.0f)) * g);
  }
}

static void hk_sgd(const gc_kargs *a) {
  int64_t i;
  for (i = 0; i < a->n[0]; i++) {
    float p = gc_load(a->p[0], a->dt, i), d = gc_load(a->p[1], a->dt, i);
    if (a->f[2] != 0.0f) d += a->f[2] * p;
    if (a->p[2]) {
      float b = a->f[1] * gc_load(a->p[2], a->dt, i) + d;
      gc_store(a->p[2], a->dt, i, b);
      d = b;
    }
    gc_store(a->p[0], a->dt, i, p - a->f[0] * d);
  }
}

/* PyTorch's Adam: p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps). */
static void hk_adam(const gc_kargs *a) {
  float t = ((const float *)a->p[4])[0];
  float bc1 = 1.0f - powf(a->f[1], t), bc2 = 1.0f - powf(a->f[2], t);
  int64_t i;
  for (i = 0; i < a->n[0]; i++) {
    float p = gc_load(a->p[0], a->dt, i), g = gc_load(a->p[1], a->dt, i);
    float m, v;
    if (a->f[4] != 0.0f) g += a->f[4] * p;
    m = a->f[1] * gc_load(a->p[2], a->dt, i) + (1.0f - a->f[1]) * g;
    v = a->f[2] * gc_load(a->p[3], a->dt, i) + (1.0f - a->f[2]) * g * g;
    gc_store(a->p[2], a->dt, i, m);
    gc_store(a->p[3], a->dt, i, v);
    gc_store(a->p[0], a->dt, i, p - (a->f[0] / bc1) * m / (sqrtf(v) / sqrtf(bc2) + a->f[3]));
  }
}

static void hk_counter_inc(const gc_kargs *a) {
  ((float *)a->p[0])[0] += 1.0f;
}

static void hk_foreach_add(const gc_kargs *a) {
  int j;
  int64_t i;
  for (j = 0; j < GC_FOREACH_MAX; j++) {
    void *y = a->p[2 * j];
    const void *x = a->p[2 * j + 1];
    if (a->n[GC_FOREACH_MAX + j])
      for (i = 0; i < a->n[j]; i++)
        gc_store(y, a->dt, i, gc_load(y, a->dt, i) + gc_load(x, a->dt, i));
    else
      for (i = 0; i < a->n[j]; i++)
        gc_store(y, a->dt, i, gc_load(x, a->dt, i));
  }
}

hk_fn hk_kernel(int k) {
#define HK_ROW(id, name, family, writes) [GC_K_##id] = hk_##name,
  static const hk_fn table[GC_K_COUNT] = {GC_KERNELS(HK_ROW)};
#undef HK_ROW
  return k >= 0 && k < GC_K_COUNT ? table[k] : NULL;
}
