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

static float ld(const void *p, int dt, int64_t i) {
  if (dt == GCAP_BF16) {
    uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
  }
  return ((const float *)p)[i];
}

static void st(void *p, int dt, int64_t i, float v) {
  if (dt == GCAP_BF16) {
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
      u = 0x7fc00000u; /* NaN stays a quiet NaN */
    else
      u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
    ((uint16_t *)p)[i] = (uint16_t)(u >> 16);
    return;
  }
  ((float *)p)[i] = v;
}

static void hk_fill(const gc_kargs *a) {
  int64_t i;
  for (i = 0; i < a->n[0]; i++)
    st(a->p[0], a->dt, i, a->f[0]);
}

/* dt is the destination's dtype, n[1] the source's. */
static void hk_copy(const gc_kargs *a) {
  int64_t i;
  if (a->p[0] == a->p[1]) return;
  for (i = 0; i < a->n[0]; i++)
    st(a->p[0], a->dt, i, ld(a->p[1], (int)a->n[1], i));
}

/* out[i] = x[i % nx] OP y[i % ny]: equal shapes, one element, or a row. */
#define HK_BINARY(name, OP)                                                                        \
  static void name(const gc_kargs *a) {                                                            \
    int64_t i;                                                                                     \
    for (i = 0; i < a->n[0]; i++) {                                                                \
      float x = ld(a->p[1], a->dt, i % a->n[1]), y = ld(a->p[2], a->dt, i % a->n[2]);              \
      st(a->p[0], a->dt, i, x OP y);                                                               \
    }                                                                                              \
  }
HK_BINARY(hk_add, +)
HK_BINARY(hk_sub, -)
HK_BINARY(hk_mul, *)

static void hk_scale(const gc_kargs *a) {
  int64_t i;
  for (i = 0; i < a->n[0]; i++)
    st(a->p[0], a->dt, i, ld(a->p[1], a->dt, i) * a->f[0]);
}

/* A float sum in the order of a binary tree over 256-element leaves, so that
** the result does not drift with n the way a running sum does. */
static float tree_sum(const void *p, int dt, int64_t lo, int64_t hi) {
  if (hi - lo <= 256) {
    float s = 0.0f;
    int64_t i;
    for (i = lo; i < hi; i++)
      s += ld(p, dt, i);
    return s;
  }
  {
    int64_t mid = lo + (hi - lo) / 2;
    return tree_sum(p, dt, lo, mid) + tree_sum(p, dt, mid, hi);
  }
}

static void hk_sum(const gc_kargs *a) {
  st(a->p[0], a->dt, 0, a->f[0] * tree_sum(a->p[1], a->dt, 0, a->n[0]));
}

static void hk_rand(const gc_kargs *a) {
  const uint64_t *state = (const uint64_t *)a->p[1];
  uint64_t seed = state[0], off = state[1];
  int64_t i;
  for (i = 0; i < a->n[0]; i++)
    st(a->p[0], a->dt, i,
       a->n[1] ? gc_rng_normal(seed, off + (uint64_t)i) : gc_rng_uniform(seed, off + (uint64_t)i));
}

static void hk_rng_advance(const gc_kargs *a) {
  ((uint64_t *)a->p[0])[1] += (uint64_t)a->n[0];
}

static void hk_expand(const gc_kargs *a) {
  int64_t i;
  for (i = 0; i < a->n[0]; i++)
    st(a->p[0], a->dt, i, a->f[0] * ld(a->p[1], a->dt, i % a->n[1]));
}

/* (The scratch of p[2] is for backends that sum chunks in parallel.) */
static void hk_sum_rows(const gc_kargs *a) {
  int64_t i, j, rows = a->n[0], cols = a->n[1];
  for (j = 0; j < cols; j++) {
    float s = 0.0f;
    for (i = 0; i < rows; i++)
      s += ld(a->p[1], a->dt, i * cols + j);
    st(a->p[0], a->dt, j, s);
  }
}

#define GELU_C 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_K 0.044715f

static float gelu(float x) {
  float t = tanhf(GELU_C * (x + GELU_K * x * x * x));
  return 0.5f * x * (1.0f + t);
}

/* One product C[m x n] = alpha op(A) op(B) + beta C, the sum over k in
** ascending order. */
static void matmul_one(const gc_kargs *a) {
  int64_t m = a->n[0], n = a->n[1], k = a->n[2], i, j, l;
  int ta = a->n[3] != 0, tb = a->n[4] != 0;
  for (i = 0; i < m; i++)
    for (j = 0; j < n; j++) {
      float s = 0.0f;
      for (l = 0; l < k; l++) {
        float x = ld(a->p[1], a->dt, ta ? l * m + i : i * k + l);
        float y = ld(a->p[2], a->dt, tb ? j * k + l : l * n + j);
        s += x * y;
      }
      s *= a->f[0];
      if (a->f[1] != 0.0f) s += a->f[1] * ld(a->p[0], a->dt, i * n + j);
      if (a->p[3]) s += ld(a->p[3], a->dt, j);
      if (a->p[5]) { /* the pre-activation as stored, then its gelu */
        st(a->p[5], a->dt, i * n + j, s);
        s = gelu(ld(a->p[5], a->dt, i * n + j));
      }
      st(a->p[0], a->dt, i * n + j, s);
    }
  for (i = 0; a->p[4] && i < m; i++) { /* bias grad: the rows of op(A) summed over k */
    float s = 0.0f;
    for (l = 0; l < k; l++)
      s += ld(a->p[1], a->dt, ta ? l * m + i : i * k + l);
    st(a->p[4], a->dt, i, s);
  }
}

/* Batched: one product after the other, at their strides. */
static void hk_matmul(const gc_kargs *a) {
  int64_t m = a->n[0], n = a->n[1], batch = a->n[5] > 1 ? a->n[5] : 1, b;
  size_t es = a->dt == GCAP_BF16 ? 2 : 4;
  for (b = 0; b < batch; b++) {
    gc_kargs one = *a;
    one.p[0] = (char *)a->p[0] + (size_t)(b * m * n) * es;
    one.p[1] = (char *)a->p[1] + (size_t)(b * a->n[6]) * es;
    one.p[2] = (char *)a->p[2] + (size_t)(b * a->n[7]) * es;
    matmul_one(&one);
  }
}

static void hk_relu(const gc_kargs *a) {
  int64_t i;
  for (i = 0; i < a->n[0]; i++) {
    float x = ld(a->p[1], a->dt, i);
    st(a->p[0], a->dt, i, x > 0.0f ? x : 0.0f);
  }
}

static void hk_relu_bwd(const gc_kargs *a) {
  int64_t i;
  for (i = 0; i < a->n[0]; i++)
    st(a->p[0], a->dt, i, ld(a->p[2], a->dt, i) > 0.0f ? ld(a->p[1], a->dt, i) : 0.0f);
}

static void hk_gelu(const gc_kargs *a) {
  int64_t i;
  for (i = 0; i < a->n[0]; i++)
    st(a->p[0], a->dt, i, gelu(ld(a->p[1], a->dt, i)));
}

static void hk_gelu_bwd(const gc_kargs *a) {
  int64_t i, j, cols = a->n[1];
  for (i = 0; i < a->n[0]; i++) {
    float x = ld(a->p[2], a->dt, i);
    float t = tanhf(GELU_C * (x + GELU_K * x * x * x));
    float d =
        0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * GELU_C * (1.0f + 3.0f * GELU_K * x * x);
    st(a->p[0], a->dt, i, ld(a->p[1], a->dt, i) * d);
  }
  for (j = 0; a->p[3] && j < cols; j++) { /* column sums, rows in order */
    float s = 0.0f;
    for (i = j; i < a->n[0]; i += cols)
      s += ld(a->p[0], a->dt, i);
    st(a->p[3], a->dt, j, s);
  }
}

static void hk_layer_norm(const gc_kargs *a) {
  int64_t r, c, rows = a->n[0], cols = a->n[1];
  for (r = 0; r < rows; r++) {
    float mean = 0.0f, var = 0.0f, rstd;
    for (c = 0; c < cols; c++)
      mean += ld(a->p[1], a->dt, r * cols + c);
    mean /= (float)cols;
    for (c = 0; c < cols; c++) {
      float d = ld(a->p[1], a->dt, r * cols + c) - mean;
      var += d * d;
    }
    var /= (float)cols;
    rstd = 1.0f / sqrtf(var + a->f[0]);
    for (c = 0; c < cols; c++) {
      float y = (ld(a->p[1], a->dt, r * cols + c) - mean) * rstd;
      if (a->p[2]) y *= ld(a->p[2], a->dt, c);
      if (a->p[3]) y += ld(a->p[3], a->dt, c);
      st(a->p[0], a->dt, r * cols + c, y);
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
      float xh = (ld(a->p[2], a->dt, r * cols + c) - mean) * rstd;
      float g = ld(a->p[1], a->dt, r * cols + c) * (a->p[3] ? ld(a->p[3], a->dt, c) : 1.0f);
      sg += g;
      sgx += g * xh;
    }
    sg /= (float)cols;
    sgx /= (float)cols;
    for (c = 0; c < cols; c++) {
      float xh = (ld(a->p[2], a->dt, r * cols + c) - mean) * rstd;
      float g = ld(a->p[1], a->dt, r * cols + c) * (a->p[3] ? ld(a->p[3], a->dt, c) : 1.0f);
      st(a->p[0], a->dt, r * cols + c, rstd * (g - sg - xh * sgx));
    }
  }
}

static void hk_layer_norm_bwd_params(const gc_kargs *a) {
  int64_t r, c, rows = a->n[0], cols = a->n[1];
  for (c = 0; c < cols; c++) {
    float dw = 0.0f, db = 0.0f;
    for (r = 0; r < rows; r++) {
      float dy = ld(a->p[2], a->dt, r * cols + c);
      float xh = (ld(a->p[3], a->dt, r * cols + c) - ((const float *)a->p[4])[r]) *
                 ((const float *)a->p[5])[r];
      dw += dy * xh;
      db += dy;
    }
    if (a->p[0]) st(a->p[0], a->dt, c, dw);
    if (a->p[1]) st(a->p[1], a->dt, c, db);
  }
}

/* y[c] = softmax(x)[c] over one row of cols elements (at element r * cols);
** returns log(sum(exp(x))), the row's log-partition. */
static float row_softmax(void *y, const void *x, int dt, int64_t r, int64_t cols) {
  float mx = -INFINITY, s = 0.0f;
  int64_t c;
  for (c = 0; c < cols; c++)
    mx = fmaxf(mx, ld(x, dt, r * cols + c));
  for (c = 0; c < cols; c++)
    s += expf(ld(x, dt, r * cols + c) - mx);
  for (c = 0; c < cols; c++)
    st(y, dt, r * cols + c, expf(ld(x, dt, r * cols + c) - mx) / s);
  return cols > 0 ? logf(s) + mx : -INFINITY; /* an empty row: log(0) */
}

/* The softmax's input z at row r, column c: f[0] * x, then the mask
** (-INFINITY: masked out). */
static float softmax_in(const gc_kargs *a, int64_t r, int64_t c) {
  int64_t cols = a->n[1], flags = a->n[2];
  float z = ld(a->p[1], a->dt, r * cols + c) * a->f[0];
  if ((flags & GC_MASK_CAUSAL) && c > r % a->n[4]) return -INFINITY;
  if (a->p[2]) {
    int64_t s[4];
    float m;
    s[1] = a->n[3], s[2] = a->n[4], s[3] = cols;
    s[0] = a->n[0] / (s[1] * s[2]);
    m = ld(a->p[2], flags & GC_MASK_BF16 ? GCAP_BF16 : GCAP_F32,
           gc_mask_index(r * cols + c, s, flags));
    if (flags & GC_MASK_BOOL) return m != 0.0f ? -INFINITY : z;
    z += m;
  }
  return z;
}

static void hk_softmax(const gc_kargs *a) {
  int64_t r, c, cols = a->n[1];
  for (r = 0; r < a->n[0]; r++) {
    float mx = -INFINITY, s = 0.0f;
    for (c = 0; c < cols; c++)
      mx = fmaxf(mx, softmax_in(a, r, c));
    for (c = 0; c < cols; c++)
      s += expf(softmax_in(a, r, c) - mx);
    for (c = 0; c < cols; c++) /* every column masked out: zeros */
      st(a->p[0], a->dt, r * cols + c, mx == -INFINITY ? 0.0f : expf(softmax_in(a, r, c) - mx) / s);
  }
}

static void hk_softmax_bwd(const gc_kargs *a) {
  int64_t r, c, rows = a->n[0], cols = a->n[1];
  for (r = 0; r < rows; r++) {
    float dot = 0.0f;
    for (c = 0; c < cols; c++)
      dot += ld(a->p[1], a->dt, r * cols + c) * ld(a->p[2], a->dt, r * cols + c);
    for (c = 0; c < cols; c++) {
      float y = ld(a->p[2], a->dt, r * cols + c);
      st(a->p[0], a->dt, r * cols + c, a->f[0] * (y * (ld(a->p[1], a->dt, r * cols + c) - dot)));
    }
  }
}

static void hk_dropout(const gc_kargs *a) {
  const uint64_t *state = (const uint64_t *)a->p[3];
  float p = a->f[0], scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  int64_t i;
  for (i = 0; i < a->n[0]; i++) {
    float m = gc_rng_uniform(state[0], state[1] + (uint64_t)i) >= p ? scale : 0.0f;
    st(a->p[2], a->dt, i, m);
    st(a->p[0], a->dt, i, ld(a->p[1], a->dt, i) * m);
  }
}

/* The class id of row r, or -1 when the target is no column of the row:
** not an integer (1.5, NaN), negative or too large. Checked before the cast
** (a NaN or huge float cast to an integer is undefined). */
static int64_t class_id(const gc_kargs *a, int64_t r, int64_t cols) {
  float t = ld(a->p[2], a->dt, r);
  return t >= 0.0f && t < (float)cols && t == floorf(t) ? (int64_t)t : -1;
}

static void hk_cross_entropy(const gc_kargs *a) {
  int64_t r, rows = a->n[0], cols = a->n[1];
  for (r = 0; r < rows; r++) {
    int64_t t = class_id(a, r, cols);
    float lse = row_softmax(a->p[3], a->p[1], a->dt, r, cols);
    /* no class id: NaN, never an out-of-bounds read */
    st(a->p[0], a->dt, r, t >= 0 ? lse - ld(a->p[1], a->dt, r * cols + t) : NAN);
  }
}

static void hk_cross_entropy_bwd(const gc_kargs *a) {
  int64_t r, c, rows = a->n[0], cols = a->n[1];
  float g = ld(a->p[3], a->dt, 0) * a->f[0];
  for (r = 0; r < rows; r++) {
    int64_t t = class_id(a, r, cols);
    for (c = 0; c < cols; c++) /* no class id: NaN grads, as the loss */
      st(a->p[0], a->dt, r * cols + c,
         t < 0 ? NAN : (ld(a->p[1], a->dt, r * cols + c) - (c == t ? 1.0f : 0.0f)) * g);
  }
}

static void hk_sgd(const gc_kargs *a) {
  int64_t i;
  for (i = 0; i < a->n[0]; i++) {
    float p = ld(a->p[0], a->dt, i), d = ld(a->p[1], a->dt, i);
    if (a->f[2] != 0.0f) d += a->f[2] * p;
    if (a->p[2]) {
      float b = a->f[1] * ld(a->p[2], a->dt, i) + d;
      st(a->p[2], a->dt, i, b);
      d = b;
    }
    st(a->p[0], a->dt, i, p - a->f[0] * d);
  }
}

/* PyTorch's Adam: p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps). */
static void hk_adam(const gc_kargs *a) {
  float t = ((const float *)a->p[4])[0];
  float bc1 = 1.0f - powf(a->f[1], t), bc2 = 1.0f - powf(a->f[2], t);
  int64_t i;
  for (i = 0; i < a->n[0]; i++) {
    float p = ld(a->p[0], a->dt, i), g = ld(a->p[1], a->dt, i);
    float m, v;
    if (a->f[4] != 0.0f) g += a->f[4] * p;
    m = a->f[1] * ld(a->p[2], a->dt, i) + (1.0f - a->f[1]) * g;
    v = a->f[2] * ld(a->p[3], a->dt, i) + (1.0f - a->f[2]) * g * g;
    st(a->p[2], a->dt, i, m);
    st(a->p[3], a->dt, i, v);
    st(a->p[0], a->dt, i, p - (a->f[0] / bc1) * m / (sqrtf(v) / sqrtf(bc2) + a->f[3]));
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
        st(y, a->dt, i, ld(y, a->dt, i) + ld(x, a->dt, i));
    else
      for (i = 0; i < a->n[j]; i++)
        st(y, a->dt, i, ld(x, a->dt, i));
  }
}

/* y[i] = x at the 4-D index whose dim perm[d] is y's index in dim d. */
static void hk_permute(const gc_kargs *a) {
  const int64_t *s = a->n, *perm = a->n + 4;
  int64_t xstride[4], ys[4], n = s[0] * s[1] * s[2] * s[3], i;
  int d;
  xstride[3] = 1;
  for (d = 2; d >= 0; d--)
    xstride[d] = xstride[d + 1] * s[d + 1];
  for (d = 0; d < 4; d++)
    ys[d] = s[perm[d]];
  for (i = 0; i < n; i++) {
    int64_t rest = i, x = 0;
    for (d = 3; d >= 0; d--) {
      x += (rest % ys[d]) * xstride[perm[d]];
      rest /= ys[d];
    }
    st(a->p[0], a->dt, i, ld(a->p[1], a->dt, x));
  }
}

static void hk_narrow(const gc_kargs *a) {
  int64_t outer = a->n[0], len = a->n[1], inner = a->n[2], full = a->n[3], off = a->n[4];
  int64_t o, j, i;
  for (o = 0; o < outer; o++)
    for (j = 0; j < len; j++)
      for (i = 0; i < inner; i++) {
        int64_t part = (o * len + j) * inner + i, whole = (o * full + off + j) * inner + i;
        if (a->n[5])
          st(a->p[0], a->dt, whole, ld(a->p[1], a->dt, part));
        else
          st(a->p[0], a->dt, part, ld(a->p[1], a->dt, whole));
      }
}

static void hk_sum_mid(const gc_kargs *a) {
  int64_t outer = a->n[0], mid = a->n[1], inner = a->n[2], o, j, i;
  for (o = 0; o < outer; o++)
    for (i = 0; i < inner; i++) {
      float s = 0.0f;
      for (j = 0; j < mid; j++)
        s += ld(a->p[1], a->dt, (o * mid + j) * inner + i);
      st(a->p[0], a->dt, o * inner + i, s);
    }
}

static void hk_masked_fill(const gc_kargs *a) {
  int mdt = a->n[5] & GC_MASK_BF16 ? GCAP_BF16 : GCAP_F32;
  int64_t i;
  for (i = 0; i < a->n[0]; i++) {
    float m = ld(a->p[2], mdt, gc_mask_index(i, a->n + 1, a->n[5]));
    st(a->p[0], a->dt, i, m != 0.0f ? a->f[0] : ld(a->p[1], a->dt, i));
  }
}

/* The row of a table of `rows` that id i names, or -1 (as class_id). */
static int64_t row_id(const void *ids, int64_t i, int64_t rows) {
  float t = ((const float *)ids)[i];
  return t >= 0.0f && t < (float)rows && t == floorf(t) ? (int64_t)t : -1;
}

static void hk_embedding(const gc_kargs *a) {
  int64_t n = a->n[0], cols = a->n[1], rows = a->n[2], i, c;
  for (i = 0; i < n; i++) {
    int64_t r = row_id(a->p[2], i, rows);
    for (c = 0; c < cols; c++)
      st(a->p[0], a->dt, i * cols + c, r < 0 ? NAN : ld(a->p[1], a->dt, r * cols + c));
  }
}

static void hk_embedding_bwd(const gc_kargs *a) {
  int64_t n = a->n[0], cols = a->n[1], rows = a->n[2], i, c;
  float *acc = (float *)a->p[3];
  for (i = 0; i < rows * cols; i++)
    acc[i] = 0.0f;
  for (i = 0; i < n; i++) {
    int64_t r = row_id(a->p[2], i, rows);
    for (c = 0; r >= 0 && c < cols; c++)
      acc[r * cols + c] += ld(a->p[1], a->dt, i * cols + c);
  }
  for (i = 0; i < rows * cols; i++)
    st(a->p[0], a->dt, i, acc[i]);
}

/* Fused attention, in the order of the composition it replaces (matmul,
** softmax, dropout, matmul and their backward), so that f32 results equal
** the composition's bit for bit on this backend. */

/* The score z of query i and key j of slice bh: q.k summed in order, scaled,
** then the mask and causal as softmax_in's (-INFINITY: masked out). */
static float attn_z(const gc_kargs *a, const void *q, const void *k, const void *mask, int64_t bh,
                    int64_t i, int64_t j) {
  int64_t sq = a->n[1], sk = a->n[2], d = a->n[3], flags = a->n[5], l;
  float s = 0.0f, z;
  for (l = 0; l < d; l++)
    s += ld(q, a->dt, (bh * sq + i) * d + l) * ld(k, a->dt, (bh * sk + j) * d + l);
  z = s * a->f[0];
  if ((flags & GC_MASK_CAUSAL) && j > i) return -INFINITY;
  if (mask) {
    int64_t sh4[4];
    float m;
    sh4[0] = a->n[0] / a->n[6], sh4[1] = a->n[6], sh4[2] = sq, sh4[3] = sk;
    m = ld(mask, flags & GC_MASK_BF16 ? GCAP_BF16 : GCAP_F32,
           gc_mask_index((bh * sq + i) * sk + j, sh4, flags));
    if (flags & GC_MASK_BOOL) return m != 0.0f ? -INFINITY : z;
    z += m;
  }
  return z;
}

/* The weight P of (i, j): exp(z - max) / sum with the row's stats. */
static float attn_p(const float *stats, int64_t rows, int64_t row, float z) {
  float mx = stats[GC_ATTN_HEAD + row], sum = stats[GC_ATTN_HEAD + rows + row];
  return mx == -INFINITY ? 0.0f : expf(z - mx) / sum;
}

/* The dropout's factor of element e of the weights (1 without dropout). */
static float attn_keep(const gc_kargs *a, const float *stats, int64_t e) {
  uint64_t state[2];
  float p = a->f[1];
  if (p == 0.0f) return 1.0f;
  memcpy(state, stats, sizeof state);
  return gc_rng_uniform(state[0], state[1] + (uint64_t)e) >= p ? 1.0f / (1.0f - p) : 0.0f;
}

/* dP of (i, j): do_i . v_j (summed in order) times the dropout's factor. */
static float attn_dp(const gc_kargs *a, const void *dO, const void *v, const float *stats,
                     int64_t bh, int64_t i, int64_t j) {
  int64_t sq = a->n[1], sk = a->n[2], dv = a->n[4], c;
  float s = 0.0f;
  for (c = 0; c < dv; c++)
    s += ld(dO, a->dt, (bh * sq + i) * dv + c) * ld(v, a->dt, (bh * sk + j) * dv + c);
  return a->f[1] == 0.0f ? s : s * attn_keep(a, stats, (bh * sq + i) * sk + j);
}

static void hk_attn(const gc_kargs *a) {
  int64_t bh, i, j, c, sq = a->n[1], sk = a->n[2], dv = a->n[4], rows = a->n[0] * sq;
  float *stats = (float *)a->p[4];
  uint64_t head[2] = {0, 0};
  if (a->p[6]) memcpy(head, a->p[6], sizeof head);
  memcpy(stats, head, sizeof head);
  for (bh = 0; bh < a->n[0]; bh++)
    for (i = 0; i < sq; i++) {
      int64_t row = bh * sq + i;
      float mx = -INFINITY, sum = 0.0f;
      for (j = 0; j < sk; j++)
        mx = fmaxf(mx, attn_z(a, a->p[1], a->p[2], a->p[5], bh, i, j));
      for (j = 0; j < sk; j++)
        sum += expf(attn_z(a, a->p[1], a->p[2], a->p[5], bh, i, j) - mx);
      stats[GC_ATTN_HEAD + row] = mx;
      stats[GC_ATTN_HEAD + rows + row] = sum;
      for (c = 0; c < dv; c++) {
        float o = 0.0f;
        for (j = 0; j < sk; j++) {
          float w = attn_p(stats, rows, row, attn_z(a, a->p[1], a->p[2], a->p[5], bh, i, j));
          if (a->f[1] != 0.0f) w *= attn_keep(a, stats, row * sk + j);
          o += w * ld(a->p[3], a->dt, (bh * sk + j) * dv + c);
        }
        st(a->p[0], a->dt, row * dv + c, o);
      }
    }
}

/* dz of (i, j) = scale * P (dP - D_i), as the softmax's backward */
static float attn_dz(const gc_kargs *a, const void *dO, const void *q, const void *k, const void *v,
                     const void *mask, const float *stats, int64_t bh, int64_t i, int64_t j) {
  int64_t rows = a->n[0] * a->n[1], row = bh * a->n[1] + i;
  float y = attn_p(stats, rows, row, attn_z(a, q, k, mask, bh, i, j));
  return a->f[0] *
         (y * (attn_dp(a, dO, v, stats, bh, i, j) - stats[GC_ATTN_HEAD + 2 * rows + row]));
}

static void hk_attn_bwd_dq(const gc_kargs *a) {
  int64_t bh, i, j, l, sq = a->n[1], sk = a->n[2], d = a->n[3], rows = a->n[0] * sq;
  float *stats = (float *)a->p[5];
  for (bh = 0; bh < a->n[0]; bh++)
    for (i = 0; i < sq; i++) {
      int64_t row = bh * sq + i;
      float dsum = 0.0f;
      for (j = 0; j < sk; j++)
        dsum += attn_dp(a, a->p[1], a->p[4], stats, bh, i, j) *
                attn_p(stats, rows, row, attn_z(a, a->p[2], a->p[3], a->p[6], bh, i, j));
      stats[GC_ATTN_HEAD + 2 * rows + row] = dsum;
      for (l = 0; l < d; l++) {
        float s = 0.0f;
        for (j = 0; j < sk; j++)
          s += attn_dz(a, a->p[1], a->p[2], a->p[3], a->p[4], a->p[6], stats, bh, i, j) *
               ld(a->p[3], a->dt, (bh * sk + j) * d + l);
        st(a->p[0], a->dt, row * d + l, s);
      }
    }
}

static void hk_attn_bwd_dkv(const gc_kargs *a) {
  int64_t bh, i, j, c, sq = a->n[1], sk = a->n[2], d = a->n[3], dv = a->n[4], rows = a->n[0] * sq;
  const float *stats = (const float *)a->p[6];
  for (bh = 0; bh < a->n[0]; bh++)
    for (j = 0; j < sk; j++) {
      for (c = 0; c < dv; c++) { /* dv_j = sum_i P_ij keep_ij do_i */
        float s = 0.0f;
        for (i = 0; i < sq; i++) {
          int64_t row = bh * sq + i;
          float w = attn_p(stats, rows, row, attn_z(a, a->p[3], a->p[4], a->p[7], bh, i, j));
          if (a->f[1] != 0.0f) w *= attn_keep(a, stats, row * sk + j);
          s += w * ld(a->p[2], a->dt, row * dv + c);
        }
        st(a->p[1], a->dt, (bh * sk + j) * dv + c, s);
      }
      for (c = 0; c < d; c++) { /* dk_j = sum_i dz_ij q_i */
        float s = 0.0f;
        for (i = 0; i < sq; i++)
          s += attn_dz(a, a->p[2], a->p[3], a->p[4], a->p[5], a->p[7], stats, bh, i, j) *
               ld(a->p[3], a->dt, (bh * sq + i) * d + c);
        st(a->p[0], a->dt, (bh * sk + j) * d + c, s);
      }
    }
}

hk_fn hk_kernel(int k) {
#define HK_ROW(id, name, family, writes) [GC_K_##id] = hk_##name,
  static const hk_fn table[GC_K_COUNT] = {GC_KERNELS(HK_ROW)};
#undef HK_ROW
  return k >= 0 && k < GC_K_COUNT ? table[k] : NULL;
}
