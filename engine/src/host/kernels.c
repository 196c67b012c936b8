/*
** kernels.c: reference kernels in plain C. They define what every op
** computes; the cuda kernels are checked against them (parity tests).
** Storage is f32 or bf16 (the upper half of an f32, rounded to nearest even);
** arithmetic is always in float. Each kernel first names the slots of its
** gc_kargs as the catalogue lays them out (runtime/backend.h, GC_KERNELS),
** then computes with those names only.
*/
#include <math.h>
#include <string.h>

#include "runtime/rng.h"
#include "kernels.h"

static void hk_fill(const gc_kargs *a) {
  void *y = a->p[0];
  int64_t n = a->n[0], i;
  float value = a->f[0];
  int dt = a->dt;
  for (i = 0; i < n; i++)
    gc_store(y, dt, i, value);
}

/* dt is the destination's dtype, n[1] the source's. */
static void hk_copy(const gc_kargs *a) {
  void *y = a->p[0];
  const void *x = a->p[1];
  int64_t n = a->n[0], i;
  int dt = a->dt, xdt = (int)a->n[1];
  if (y == x) return;
  if (dt == xdt) { /* within one dtype the bits move as they are: a NaN keeps its payload */
    memmove(y, x, (size_t)n * (dt == GCAP_BF16 ? 2 : 4));
    return;
  }
  for (i = 0; i < n; i++)
    gc_store(y, dt, i, gc_load(x, xdt, i));
}

/* y[i] = u[i % nu] OP w[i % nw]: equal shapes, one element, or a row. */
#define HK_BINARY(name, OP)                                                                        \
  static void name(const gc_kargs *a) {                                                            \
    void *y = a->p[0];                                                                             \
    const void *u = a->p[1], *w = a->p[2];                                                         \
    int64_t n = a->n[0], nu = a->n[1], nw = a->n[2], i;                                            \
    int dt = a->dt;                                                                                \
    for (i = 0; i < n; i++) {                                                                      \
      float x = gc_load(u, dt, i % nu), z = gc_load(w, dt, i % nw);                                \
      gc_store(y, dt, i, x OP z);                                                                  \
    }                                                                                              \
  }
HK_BINARY(hk_add, +)
HK_BINARY(hk_sub, -)
HK_BINARY(hk_mul, *)
HK_BINARY(hk_div, /)

static void hk_scale(const gc_kargs *a) {
  void *y = a->p[0];
  const void *x = a->p[1];
  int64_t n = a->n[0], i;
  float s = a->f[0];
  int dt = a->dt;
  for (i = 0; i < n; i++)
    gc_store(y, dt, i, gc_load(x, dt, i) * s);
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

/* (The scratch of p[2] is for backends that sum chunks in parallel.) */
static void hk_sum(const gc_kargs *a) {
  void *y = a->p[0];
  const void *x = a->p[1];
  int64_t n = a->n[0];
  float s = a->f[0];
  int dt = a->dt;
  gc_store(y, dt, 0, s * tree_sum(x, dt, 0, n));
}

static void hk_rand(const gc_kargs *a) {
  void *y = a->p[0];
  const uint64_t *state = (const uint64_t *)a->p[1];
  int64_t n = a->n[0], normal = a->n[1], i;
  uint64_t seed = state[0], off = state[1];
  int dt = a->dt;
  for (i = 0; i < n; i++)
    gc_store(y, dt, i,
             normal ? gc_rng_normal(seed, off + (uint64_t)i)
                    : gc_rng_uniform(seed, off + (uint64_t)i));
}

static void hk_rng_advance(const gc_kargs *a) {
  uint64_t *state = (uint64_t *)a->p[0];
  int64_t n = a->n[0];
  state[1] += (uint64_t)n;
}

static void hk_rng_copy(const gc_kargs *a) {
  memcpy(a->p[0], a->p[1], 2 * sizeof(uint64_t));
}

static void hk_expand(const gc_kargs *a) {
  void *y = a->p[0];
  const void *x = a->p[1];
  int64_t n = a->n[0], nx = a->n[1], i;
  float s = a->f[0];
  int dt = a->dt;
  for (i = 0; i < n; i++)
    gc_store(y, dt, i, s * gc_load(x, dt, i % nx));
}

/* (The scratch of p[2] is for backends that sum chunks in parallel.) */
void hk_sum_rows(const gc_kargs *a) {
  void *y = a->p[0];
  const void *x = a->p[1];
  int64_t rows = a->n[0], cols = a->n[1], i, j;
  int dt = a->dt;
  for (j = 0; j < cols; j++) {
    float s = 0.0f;
    for (i = 0; i < rows; i++)
      s += gc_load(x, dt, i * cols + j);
    gc_store(y, dt, j, s);
  }
}

#define GELU_C 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_K 0.044715f

static float gelu(float x) {
  float t = tanhf(GELU_C * (x + GELU_K * x * x * x));
  return 0.5f * x * (1.0f + t);
}

/* Element (i, j) of a product's C from its sum s over k: times alpha, plus
** beta C, the bias, the gelu (GC_K_MATMUL's and GC_K_FP8_GEMM's order). */
static void matmul_store(const gc_kargs *a, int64_t i, int64_t j, float s) {
  void *C = a->p[0], *pre = a->p[5];
  const void *bias = a->p[3];
  int64_t n = a->n[1];
  int dt = a->dt;
  s *= a->f[0];
  if (a->f[1] != 0.0f) s += a->f[1] * gc_load(C, dt, i * n + j);
  if (bias) s += gc_load(bias, dt, j);
  if (pre) { /* the pre-activation as stored, then its gelu */
    gc_store(pre, dt, i * n + j, s);
    s = gelu(gc_load(pre, dt, i * n + j));
  }
  gc_store(C, dt, i * n + j, s);
}

/* One product C[m x n] = alpha op(A) op(B) + beta C, the sum over k in
** ascending order (the optional bias, bias grad and gelu as the catalogue
** says). */
static void matmul_one(const gc_kargs *a) {
  void *dbias = a->p[4];
  const void *A = a->p[1], *B = a->p[2];
  int64_t m = a->n[0], n = a->n[1], k = a->n[2], i, j, l;
  int ta = a->n[3] != 0, tb = a->n[4] != 0, dt = a->dt;
  for (i = 0; i < m; i++)
    for (j = 0; j < n; j++) {
      float s = 0.0f;
      for (l = 0; l < k; l++) {
        float x = gc_load(A, dt, ta ? l * m + i : i * k + l);
        float y = gc_load(B, dt, tb ? j * k + l : l * n + j);
        s += x * y;
      }
      matmul_store(a, i, j, s);
    }
  for (i = 0; dbias && i < m; i++) { /* bias grad: the rows of op(A) summed over k */
    float s = 0.0f;
    for (l = 0; l < k; l++)
      s += gc_load(A, dt, ta ? l * m + i : i * k + l);
    gc_store(dbias, dt, i, s);
  }
}

/* C = A B^T of FP8 operands: each byte dequantized to a float through its
** operand's table (the values GC_K_FP8_DEQUANTIZE gives in f32), then
** matmul's sums in matmul's order, C stored once in dt: the result equals
** the f32 matmul of the dequantized f32 operands, rounded to dt, bit for
** bit. As in an FP8 GEMM (cuBLASLt's), no operand is rounded to a bf16 C's
** dtype before the products: that rounding, up to 2^-9 of each operand,
** would move a sum that cancels far beyond the one rounding of its result.
** The zeros that pad rows beyond k are not read. */
void hk_fp8_gemm(const gc_kargs *a) {
  const unsigned char *A = (const unsigned char *)a->p[1], *B = (const unsigned char *)a->p[2];
  int64_t m = a->n[0], n = a->n[1], k = a->n[2], ld = a->n[3], i, j, l;
  float ta[256], tb[256];
  hk_fp8_table((int)a->n[5], ((const float *)a->p[6])[0], ta);
  hk_fp8_table((int)a->n[6], ((const float *)a->p[7])[0], tb);
  for (i = 0; i < m; i++)
    for (j = 0; j < n; j++) {
      float s = 0.0f;
      for (l = 0; l < k; l++)
        s += ta[A[i * ld + l]] * tb[B[j * ld + l]];
      matmul_store(a, i, j, s);
    }
}

/* Batched: one product after the other, at their strides. */
static void hk_matmul(const gc_kargs *a) {
  int64_t m = a->n[0], n = a->n[1], batch = a->n[5] > 1 ? a->n[5] : 1;
  int64_t astride = a->n[6], bstride = a->n[7], b;
  size_t es = a->dt == GCAP_BF16 ? 2 : 4;
  for (b = 0; b < batch; b++) {
    gc_kargs one = *a;
    one.p[0] = (char *)a->p[0] + (size_t)(b * m * n) * es;
    one.p[1] = (char *)a->p[1] + (size_t)(b * astride) * es;
    one.p[2] = (char *)a->p[2] + (size_t)(b * bstride) * es;
    matmul_one(&one);
  }
}

static void hk_relu(const gc_kargs *a) {
  void *y = a->p[0];
  const void *x = a->p[1];
  int64_t n = a->n[0], i;
  int dt = a->dt;
  for (i = 0; i < n; i++) {
    float v = gc_load(x, dt, i);
    gc_store(y, dt, i, v > 0.0f ? v : 0.0f);
  }
}

static void hk_relu_bwd(const gc_kargs *a) {
  void *dx = a->p[0];
  const void *dy = a->p[1], *x = a->p[2];
  int64_t n = a->n[0], i;
  int dt = a->dt;
  for (i = 0; i < n; i++)
    gc_store(dx, dt, i, gc_load(x, dt, i) > 0.0f ? gc_load(dy, dt, i) : 0.0f);
}

static void hk_gelu(const gc_kargs *a) {
  void *y = a->p[0];
  const void *x = a->p[1];
  int64_t n = a->n[0], i;
  int dt = a->dt;
  for (i = 0; i < n; i++)
    gc_store(y, dt, i, gelu(gc_load(x, dt, i)));
}

/* (The scratch of p[4] is for backends that sum chunks of rows in parallel.) */
static void hk_gelu_bwd(const gc_kargs *a) {
  void *dx = a->p[0], *dbias = a->p[3];
  const void *dy = a->p[1], *x = a->p[2];
  int64_t n = a->n[0], cols = a->n[1], i, j;
  int dt = a->dt;
  for (i = 0; i < n; i++) {
    float v = gc_load(x, dt, i);
    float t = tanhf(GELU_C * (v + GELU_K * v * v * v));
    float d =
        0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * GELU_C * (1.0f + 3.0f * GELU_K * v * v);
    gc_store(dx, dt, i, gc_load(dy, dt, i) * d);
  }
  for (j = 0; dbias && j < cols; j++) { /* column sums, rows in order */
    float s = 0.0f;
    for (i = j; i < n; i += cols)
      s += gc_load(dx, dt, i);
    gc_store(dbias, dt, j, s);
  }
}

static void hk_layer_norm(const gc_kargs *a) {
  void *y = a->p[0];
  const void *x = a->p[1], *weight = a->p[2], *bias = a->p[3];
  float *means = (float *)a->p[4], *rstds = (float *)a->p[5];
  int64_t rows = a->n[0], cols = a->n[1], r, c;
  float eps = a->f[0];
  int dt = a->dt;
  for (r = 0; r < rows; r++) {
    float mean = 0.0f, var = 0.0f, rstd;
    for (c = 0; c < cols; c++)
      mean += gc_load(x, dt, r * cols + c);
    mean /= (float)cols;
    for (c = 0; c < cols; c++) {
      float d = gc_load(x, dt, r * cols + c) - mean;
      var += d * d;
    }
    var /= (float)cols;
    rstd = 1.0f / sqrtf(var + eps);
    for (c = 0; c < cols; c++) {
      float v = (gc_load(x, dt, r * cols + c) - mean) * rstd;
      if (weight) v *= gc_load(weight, dt, c);
      if (bias) v += gc_load(bias, dt, c);
      gc_store(y, dt, r * cols + c, v);
    }
    means[r] = mean;
    rstds[r] = rstd;
  }
}

static void hk_layer_norm_bwd(const gc_kargs *a) {
  void *dx = a->p[0];
  const void *dy = a->p[1], *x = a->p[2], *weight = a->p[3];
  const float *means = (const float *)a->p[4], *rstds = (const float *)a->p[5];
  int64_t rows = a->n[0], cols = a->n[1], r, c;
  int dt = a->dt;
  for (r = 0; r < rows; r++) {
    float mean = means[r], rstd = rstds[r];
    float sg = 0.0f, sgx = 0.0f; /* sums of dxhat and dxhat * xhat over the row */
    for (c = 0; c < cols; c++) {
      float xh = (gc_load(x, dt, r * cols + c) - mean) * rstd;
      float g = gc_load(dy, dt, r * cols + c) * (weight ? gc_load(weight, dt, c) : 1.0f);
      sg += g;
      sgx += g * xh;
    }
    sg /= (float)cols;
    sgx /= (float)cols;
    for (c = 0; c < cols; c++) {
      float xh = (gc_load(x, dt, r * cols + c) - mean) * rstd;
      float g = gc_load(dy, dt, r * cols + c) * (weight ? gc_load(weight, dt, c) : 1.0f);
      gc_store(dx, dt, r * cols + c, rstd * (g - sg - xh * sgx));
    }
  }
}

static void hk_layer_norm_bwd_params(const gc_kargs *a) {
  void *dweight = a->p[0], *dbias = a->p[1];
  const void *dy = a->p[2], *x = a->p[3];
  const float *means = (const float *)a->p[4], *rstds = (const float *)a->p[5];
  int64_t rows = a->n[0], cols = a->n[1], r, c;
  int dt = a->dt;
  for (c = 0; c < cols; c++) {
    float dw = 0.0f, db = 0.0f;
    for (r = 0; r < rows; r++) {
      float g = gc_load(dy, dt, r * cols + c);
      float xh = (gc_load(x, dt, r * cols + c) - means[r]) * rstds[r];
      dw += g * xh;
      db += g;
    }
    if (dweight) gc_store(dweight, dt, c, dw);
    if (dbias) gc_store(dbias, dt, c, db);
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

/* The softmax's input z at row r, column c: scale * x, then the mask
** (-INFINITY: masked out), broadcast over x seen as [rows / (heads sq), heads,
** sq, cols]. */
static float softmax_in(const gc_kargs *a, int64_t r, int64_t c) {
  const void *x = a->p[1], *mask = a->p[2];
  int64_t rows = a->n[0], cols = a->n[1], flags = a->n[2], heads = a->n[3], sq = a->n[4];
  float scale = a->f[0];
  int dt = a->dt;
  float z = gc_load(x, dt, r * cols + c) * scale;
  if ((flags & GC_MASK_CAUSAL) && c > r % sq) return -INFINITY;
  if (mask) {
    int64_t s[4];
    float m;
    s[1] = heads, s[2] = sq, s[3] = cols;
    s[0] = rows / (s[1] * s[2]);
    m = gc_load(mask, flags & GC_MASK_BF16 ? GCAP_BF16 : GCAP_F32,
                gc_mask_index(r * cols + c, s, flags));
    if (flags & GC_MASK_BOOL) return m != 0.0f ? -INFINITY : z;
    z += m;
  }
  return z;
}

static void hk_softmax(const gc_kargs *a) {
  void *y = a->p[0];
  int64_t rows = a->n[0], cols = a->n[1], r, c;
  int dt = a->dt;
  for (r = 0; r < rows; r++) {
    float mx = -INFINITY, s = 0.0f;
    for (c = 0; c < cols; c++)
      mx = fmaxf(mx, softmax_in(a, r, c));
    for (c = 0; c < cols; c++)
      s += expf(softmax_in(a, r, c) - mx);
    for (c = 0; c < cols; c++) /* every column masked out: zeros */
      gc_store(y, dt, r * cols + c, mx == -INFINITY ? 0.0f : expf(softmax_in(a, r, c) - mx) / s);
  }
}

static void hk_softmax_bwd(const gc_kargs *a) {
  void *dx = a->p[0];
  const void *dy = a->p[1], *y = a->p[2];
  int64_t rows = a->n[0], cols = a->n[1], r, c;
  float scale = a->f[0];
  int dt = a->dt;
  for (r = 0; r < rows; r++) {
    float dot = 0.0f;
    for (c = 0; c < cols; c++)
      dot += gc_load(dy, dt, r * cols + c) * gc_load(y, dt, r * cols + c);
    for (c = 0; c < cols; c++) {
      float v = gc_load(y, dt, r * cols + c);
      gc_store(dx, dt, r * cols + c, scale * (v * (gc_load(dy, dt, r * cols + c) - dot)));
    }
  }
}

static void hk_dropout(const gc_kargs *a) {
  void *y = a->p[0], *mask = a->p[2];
  const void *x = a->p[1];
  const uint64_t *state = (const uint64_t *)a->p[3];
  int64_t n = a->n[0], i;
  float p = a->f[0], scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  int dt = a->dt;
  for (i = 0; i < n; i++) {
    float m = gc_rng_uniform(state[0], state[1] + (uint64_t)i) >= p ? scale : 0.0f;
    gc_store(mask, dt, i, m);
    gc_store(y, dt, i, gc_load(x, dt, i) * m);
  }
}

/* The class id of row r, or -1 when the target is no column of the row:
** not an integer (1.5, NaN), negative or too large. Checked before the cast
** (a NaN or huge float cast to an integer is undefined). */
static int64_t class_id(const void *targets, int dt, int64_t r, int64_t cols) {
  float t = gc_load(targets, dt, r);
  return t >= 0.0f && t < (float)cols && t == floorf(t) ? (int64_t)t : -1;
}

/* Note bad id v at position i of the ids of an op (GC_BADID_*) of graph
** gid, where count ids are valid, in flag f (NULL: none), unless an earlier
** one is there. */
static void badid_note(uint32_t *f, int op, int64_t gid, int64_t i, float v, int64_t count) {
  if (f == NULL || f[GC_BADID_STATE] != 0) return;
  f[GC_BADID_OP] = (uint32_t)op;
  f[GC_BADID_GRAPH] = (uint32_t)gid;
  f[GC_BADID_GRAPH + 1] = (uint32_t)((uint64_t)gid >> 32);
  f[GC_BADID_INDEX] = (uint32_t)i;
  f[GC_BADID_INDEX + 1] = (uint32_t)((uint64_t)i >> 32);
  memcpy(&f[GC_BADID_VALUE], &v, sizeof v);
  f[GC_BADID_COUNT] = (uint32_t)count;
  f[GC_BADID_STATE] = 2;
}

static void hk_cross_entropy(const gc_kargs *a) {
  void *loss = a->p[0], *probs = a->p[3];
  const void *logits = a->p[1], *targets = a->p[2];
  uint32_t *badid = (uint32_t *)a->p[4];
  int64_t rows = a->n[0], cols = a->n[1], graph = a->n[2], r;
  int dt = a->dt;
  for (r = 0; r < rows; r++) {
    int64_t t = class_id(targets, dt, r, cols);
    float lse = row_softmax(probs, logits, dt, r, cols);
    /* no class id: NaN, never an out-of-bounds read */
    gc_store(loss, dt, r, t >= 0 ? lse - gc_load(logits, dt, r * cols + t) : NAN);
    if (t < 0) badid_note(badid, GC_BADID_XENT, graph, r, gc_load(targets, dt, r), cols);
  }
}

static void hk_cross_entropy_bwd(const gc_kargs *a) {
  void *dlogits = a->p[0];
  const void *probs = a->p[1], *targets = a->p[2], *dloss = a->p[3];
  int64_t rows = a->n[0], cols = a->n[1], r, c;
  float scale = a->f[0];
  int dt = a->dt;
  float g = gc_load(dloss, dt, 0) * scale;
  for (r = 0; r < rows; r++) {
    int64_t t = class_id(targets, dt, r, cols);
    for (c = 0; c < cols; c++) /* no class id: NaN grads, as the loss */
      gc_store(dlogits, dt, r * cols + c,
               t < 0 ? NAN : (gc_load(probs, dt, r * cols + c) - (c == t ? 1.0f : 0.0f)) * g);
  }
}

/* Pair j: y = p[2j], x = p[2j + 1], n[j] elements, n[GC_FOREACH_MAX + j]: add
** (else copy). */
static void hk_foreach_add(const gc_kargs *a) {
  const int64_t *n = a->n, *add = a->n + GC_FOREACH_MAX;
  int dt = a->dt, j;
  int64_t i;
  for (j = 0; j < GC_FOREACH_MAX; j++) {
    void *y = a->p[2 * j];
    const void *x = a->p[2 * j + 1];
    if (add[j])
      for (i = 0; i < n[j]; i++)
        gc_store(y, dt, i, gc_load(y, dt, i) + gc_load(x, dt, i));
    else
      for (i = 0; i < n[j]; i++)
        gc_store(y, dt, i, gc_load(x, dt, i));
  }
}

/* y[i] = x at the 4-D index whose dim perm[d] is y's index in dim d. */
static void hk_permute(const gc_kargs *a) {
  void *y = a->p[0];
  const void *x = a->p[1];
  const int64_t *s = a->n, *perm = a->n + 4;
  int64_t xstride[4], ys[4], n = s[0] * s[1] * s[2] * s[3], i;
  int dt = a->dt, d;
  xstride[3] = 1;
  for (d = 2; d >= 0; d--)
    xstride[d] = xstride[d + 1] * s[d + 1];
  for (d = 0; d < 4; d++)
    ys[d] = s[perm[d]];
  for (i = 0; i < n; i++) {
    int64_t rest = i, at = 0;
    for (d = 3; d >= 0; d--) {
      at += (rest % ys[d]) * xstride[perm[d]];
      rest /= ys[d];
    }
    gc_store(y, dt, i, gc_load(x, dt, at));
  }
}

static void hk_narrow(const gc_kargs *a) {
  void *y = a->p[0];
  const void *x = a->p[1];
  int64_t outer = a->n[0], len = a->n[1], inner = a->n[2], full = a->n[3], off = a->n[4];
  int64_t into = a->n[5], o, j, i;
  int dt = a->dt;
  for (o = 0; o < outer; o++)
    for (j = 0; j < len; j++)
      for (i = 0; i < inner; i++) {
        int64_t part = (o * len + j) * inner + i, whole = (o * full + off + j) * inner + i;
        if (into)
          gc_store(y, dt, whole, gc_load(x, dt, part));
        else
          gc_store(y, dt, part, gc_load(x, dt, whole));
      }
}

static void hk_sum_mid(const gc_kargs *a) {
  void *y = a->p[0];
  const void *x = a->p[1];
  int64_t outer = a->n[0], mid = a->n[1], inner = a->n[2], o, j, i;
  int dt = a->dt;
  for (o = 0; o < outer; o++)
    for (i = 0; i < inner; i++) {
      float s = 0.0f;
      for (j = 0; j < mid; j++)
        s += gc_load(x, dt, (o * mid + j) * inner + i);
      gc_store(y, dt, o * inner + i, s);
    }
}

static void hk_masked_fill(const gc_kargs *a) {
  void *y = a->p[0];
  const void *x = a->p[1], *mask = a->p[2];
  const int64_t *shape = a->n + 1;
  int64_t n = a->n[0], flags = a->n[5], i;
  float value = a->f[0];
  int dt = a->dt, mdt = flags & GC_MASK_BF16 ? GCAP_BF16 : GCAP_F32;
  for (i = 0; i < n; i++) {
    float m = gc_load(mask, mdt, gc_mask_index(i, shape, flags));
    gc_store(y, dt, i, m != 0.0f ? value : gc_load(x, dt, i));
  }
}

/* The row of a table of `rows` that id i names, or -1 (as class_id). */
static int64_t row_id(const void *ids, int64_t i, int64_t rows) {
  float t = ((const float *)ids)[i];
  return t >= 0.0f && t < (float)rows && t == floorf(t) ? (int64_t)t : -1;
}

static void hk_embedding(const gc_kargs *a) {
  void *y = a->p[0];
  const void *table = a->p[1], *ids = a->p[2];
  uint32_t *badid = (uint32_t *)a->p[3];
  int64_t n = a->n[0], cols = a->n[1], rows = a->n[2], graph = a->n[3], i, c;
  int dt = a->dt;
  for (i = 0; i < n; i++) {
    int64_t r = row_id(ids, i, rows);
    for (c = 0; c < cols; c++)
      gc_store(y, dt, i * cols + c, r < 0 ? NAN : gc_load(table, dt, r * cols + c));
    if (r < 0) badid_note(badid, GC_BADID_EMBEDDING, graph, i, ((const float *)ids)[i], rows);
  }
}

static void hk_embedding_bwd(const gc_kargs *a) {
  void *dtable = a->p[0];
  const void *dy = a->p[1], *ids = a->p[2];
  float *acc = (float *)a->p[3];
  int64_t n = a->n[0], cols = a->n[1], rows = a->n[2], i, c;
  int dt = a->dt;
  for (i = 0; i < rows * cols; i++)
    acc[i] = 0.0f;
  for (i = 0; i < n; i++) {
    int64_t r = row_id(ids, i, rows);
    for (c = 0; r >= 0 && c < cols; c++)
      acc[r * cols + c] += gc_load(dy, dt, i * cols + c);
  }
  for (i = 0; i < rows * cols; i++)
    gc_store(dtable, dt, i, acc[i]);
}

hk_fn hk_kernel(int k) {
#define HK_ROW(id, name, family, writes) [GC_K_##id] = hk_##name,
  static const hk_fn table[GC_K_COUNT] = {GC_KERNELS(HK_ROW)};
#undef HK_ROW
  return k >= 0 && k < GC_K_COUNT ? table[k] : NULL;
}
