/*
** k_fp8.c: the host's FP8 kernels, the reference of the cuda ones: the casts
** between float and the two FP8 formats (E4M3: 4 exponent bits, bias 7, 3
** mantissa bits, no infinity, 0x7f NaN; E5M2: 5 exponent bits, bias 15, 2
** mantissa bits), quantize with a scale, dequantize, amax, and delayed
** scaling's update of amax histories and scales. A cast rounds to nearest,
** ties to even, saturates to the largest finite value (infinities too) and
** turns NaN into 0x7f, as CUDA's saturating conversion does.
*/
#include <float.h>
#include <math.h>
#include <string.h>

#include "kernels.h"

/* The layout of format f: mantissa bits, exponent bias, largest finite byte. */
static int fp8_mbits(int f) {
  return f == GCAP_FP8_E5M2 ? 2 : 3;
}
static int fp8_bias(int f) {
  return f == GCAP_FP8_E5M2 ? 15 : 7;
}
static unsigned fp8_maxbyte(int f) {
  return f == GCAP_FP8_E5M2 ? 0x7bu : 0x7eu;
}

/* x as an FP8 byte of format f. */
static unsigned char fp8_from_float(float x, int f) {
  uint32_t u, a, sign;
  int m = fp8_mbits(f), bias = fp8_bias(f);
  unsigned code;
  memcpy(&u, &x, sizeof u);
  sign = (u >> 24) & 0x80u;
  a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7f;        /* NaN */
  if (a >= (uint32_t)(128 - bias) << 23) { /* at least the smallest normal 2^(1 - bias) */
    int shift = 23 - m;
    uint32_t rem = a & ((1u << shift) - 1u), half = 1u << (shift - 1);
    int exp = (int)(a >> 23) - 127 + bias;
    if (exp > 31) exp = 31; /* far beyond the range: saturated below */
    code = ((unsigned)exp << m) | ((a & 0x7fffffu) >> shift);
    if (rem > half || (rem == half && (code & 1u))) code++; /* a carry moves the exponent */
    if (code > fp8_maxbyte(f)) code = fp8_maxbyte(f);
  } else { /* subnormal or zero: multiples of 2^(1 - bias - m), exact products in float */
    float q = rintf(ldexpf(fabsf(x), bias - 1 + m)); /* the default rounding: to nearest even */
    code = (unsigned)q;
  }
  return (unsigned char)(code | sign);
}

/* FP8 byte q of format f as a float (exact). */
static float fp8_to_float(unsigned char q, int f) {
  int m = fp8_mbits(f), bias = fp8_bias(f);
  int exp = (q & 0x7f) >> m;
  unsigned man = q & ((1u << m) - 1u);
  float v;
  if (f == GCAP_FP8_E4M3 && (q & 0x7f) == 0x7f) return NAN;
  if (f == GCAP_FP8_E5M2 && exp == 31) return man ? NAN : (q & 0x80 ? -INFINITY : INFINITY);
  if (exp == 0)
    v = ldexpf((float)man, 1 - bias - m);
  else
    v = ldexpf((float)((1u << m) | man), exp - bias - m);
  return q & 0x80 ? -v : v;
}

/* The largest |x| of n elements, NaN left out. */
static float amax_of(const void *x, int dt, int64_t n) {
  float m = 0.0f;
  int64_t i;
  for (i = 0; i < n; i++)
    m = fmaxf(m, fabsf(gc_load(x, dt, i)));
  return m;
}

/* Current scaling's scale from an amax (TE's compute_scale_from_amax). */
static float scale_from_amax(float amax, int f) {
  float s;
  if (!isfinite(amax) || amax == 0.0f) return 1.0f;
  s = GC_FP8_MAX(f) / amax;
  return isinf(s) ? FLT_MAX : s;
}

/* y [cols x ld] = q [rows x cols] transposed, zeros after each row's rows bytes. */
static void transpose_bytes(unsigned char *y, const unsigned char *q, int64_t rows, int64_t cols,
                            int64_t ld) {
  int64_t i, j;
  for (j = 0; j < cols; j++) {
    for (i = 0; i < rows; i++)
      y[j * ld + i] = q[i * cols + j];
    memset(y + j * ld + rows, 0, (size_t)(ld - rows));
  }
}

void hk_fp8_quantize(const gc_kargs *a) {
  unsigned char *q = (unsigned char *)a->p[0];
  const void *x = a->p[1];
  const float *scale_src = (const float *)a->p[2], *skip = (const float *)a->p[5];
  float *amax = (float *)a->p[3], *scale_inv = (float *)a->p[4], scale;
  int64_t n = a->n[0], i;
  int f = (int)a->n[1], current = a->n[2] == 1, dt = a->dt;
  if (skip != NULL && skip[0] != 0.0f) return;
  scale = current ? scale_from_amax(scale_src[0], f) : scale_src[0];
  for (i = 0; i < n; i++)
    q[i] = fp8_from_float(gc_load(x, dt, i) * scale, f);
  if (amax != NULL) *amax = fmaxf(*amax, amax_of(x, dt, n));
  if (scale_inv != NULL) *scale_inv = 1.0f / scale;
  if (a->p[6] != NULL) transpose_bytes((unsigned char *)a->p[6], q, a->n[3], a->n[4], a->n[5]);
  if (a->p[7] != NULL) { /* the column sums, in sum_rows's order */
    gc_kargs s;
    memset(&s, 0, sizeof s);
    s.p[0] = a->p[7];
    s.p[1] = a->p[1];
    s.n[0] = a->n[3];
    s.n[1] = a->n[4];
    s.dt = dt;
    hk_sum_rows(&s);
  }
}

void hk_fp8_dequantize(const gc_kargs *a) {
  void *y = a->p[0];
  const unsigned char *q = (const unsigned char *)a->p[1];
  float scale_inv = ((const float *)a->p[2])[0];
  int64_t n = a->n[0], i;
  int f = (int)a->n[1], dt = a->dt;
  for (i = 0; i < n; i++)
    gc_store(y, dt, i, fp8_to_float(q[i], f) * scale_inv);
}

void hk_fp8_amax(const gc_kargs *a) {
  float *amax = (float *)a->p[0];
  *amax = fmaxf(*amax, amax_of(a->p[1], a->dt, a->n[0]));
}

void hk_fp8_update(const gc_kargs *a) {
  float *state = (float *)a->p[0];
  int64_t len = a->n[0], r0 = a->n[1], count = a->n[2], roles = a->n[3], r, j;
  int most_recent = a->n[4] == 1;
  for (r = r0; r < r0 + count; r++) {
    float *amax = &state[r], *scale = &state[roles + r];
    float *hist = &state[2 * roles + r * len], last = *amax, m = 0.0f;
    *amax = 0.0f;
    if (last != 0.0f) { /* a step that quantized nothing (amax 0) leaves the history */
      for (j = len - 1; j > 0; j--)
        hist[j] = hist[j - 1];
      hist[0] = last;
      for (j = 0; j < len; j++)
        m = fmaxf(m, hist[j]);
      if (most_recent) m = last;
    }
    if (isfinite(m) && m > 0.0f) {
      float s = a->f[r - r0] / m;
      *scale = isinf(s) ? FLT_MAX : s;
    }
  }
}

void hk_fp8_pad(const gc_kargs *a) {
  unsigned char *y = (unsigned char *)a->p[0];
  const unsigned char *q = (const unsigned char *)a->p[1];
  int64_t rows = a->n[0], cols = a->n[1], ld = a->n[2], i;
  for (i = 0; i < rows; i++) { /* y [rows x ld] = q's rows, then zeros */
    memcpy(y + i * ld, q + i * cols, (size_t)cols);
    memset(y + i * ld + cols, 0, (size_t)(ld - cols));
  }
}

void hk_fp8_table(int f, float scale_inv, float t[256]) {
  int b;
  for (b = 0; b < 256; b++)
    t[b] = fp8_to_float((unsigned char)b, f) * scale_inv;
}
