/*
** k_attn.c: the host's fused attention, in the order of the composition
** it replaces (matmul, softmax, dropout, matmul and their backward), so that
** f32 results equal the composition's bit for bit on this backend. Shapes:
** bh slices (batch x heads) of sq queries and sk keys, dh the head dim of q
** and k, dhv v's.
*/
#include <math.h>
#include <string.h>

#include "runtime/rng.h"
#include "kernels.h"

/* The score z of query i and key j of slice bh: q.k summed in order, scaled,
** then the mask and causal as softmax_in's (-INFINITY: masked out). */
static float attn_z(const gc_kargs *a, const void *q, const void *k, const void *mask, int64_t bh,
                    int64_t i, int64_t j) {
  int64_t nbh = a->n[0], sq = a->n[1], sk = a->n[2], dh = a->n[3], flags = a->n[5];
  int64_t heads = a->n[6], l;
  float scale = a->f[0], s = 0.0f, z;
  int dt = a->dt;
  for (l = 0; l < dh; l++)
    s += gc_load(q, dt, (bh * sq + i) * dh + l) * gc_load(k, dt, (bh * sk + j) * dh + l);
  z = s * scale;
  if ((flags & GC_MASK_CAUSAL) && j > i) return -INFINITY;
  if (mask) {
    int64_t sh4[4];
    float m;
    sh4[0] = nbh / heads, sh4[1] = heads, sh4[2] = sq, sh4[3] = sk;
    m = gc_load(mask, flags & GC_MASK_BF16 ? GCAP_BF16 : GCAP_F32,
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
static float attn_dp(const gc_kargs *a, const void *dout, const void *v, const float *stats,
                     int64_t bh, int64_t i, int64_t j) {
  int64_t sq = a->n[1], sk = a->n[2], dhv = a->n[4], c;
  float p = a->f[1], s = 0.0f;
  int dt = a->dt;
  for (c = 0; c < dhv; c++)
    s += gc_load(dout, dt, (bh * sq + i) * dhv + c) * gc_load(v, dt, (bh * sk + j) * dhv + c);
  return p == 0.0f ? s : s * attn_keep(a, stats, (bh * sq + i) * sk + j);
}

void hk_attn(const gc_kargs *a) {
  void *out = a->p[0];
  const void *q = a->p[1], *k = a->p[2], *v = a->p[3], *mask = a->p[5], *rng = a->p[6];
  float *stats = (float *)a->p[4];
  int64_t nbh = a->n[0], sq = a->n[1], sk = a->n[2], dhv = a->n[4], rows = nbh * sq;
  int64_t bh, i, j, c;
  float p = a->f[1];
  int dt = a->dt;
  uint64_t head[2] = {0, 0};
  if (rng) memcpy(head, rng, sizeof head);
  memcpy(stats, head, sizeof head);
  for (bh = 0; bh < nbh; bh++)
    for (i = 0; i < sq; i++) {
      int64_t row = bh * sq + i;
      float mx = -INFINITY, sum = 0.0f;
      for (j = 0; j < sk; j++)
        mx = fmaxf(mx, attn_z(a, q, k, mask, bh, i, j));
      for (j = 0; j < sk; j++)
        sum += expf(attn_z(a, q, k, mask, bh, i, j) - mx);
      stats[GC_ATTN_HEAD + row] = mx;
      stats[GC_ATTN_HEAD + rows + row] = sum;
      for (c = 0; c < dhv; c++) {
        float o = 0.0f;
        for (j = 0; j < sk; j++) {
          float w = attn_p(stats, rows, row, attn_z(a, q, k, mask, bh, i, j));
          if (p != 0.0f) w *= attn_keep(a, stats, row * sk + j);
          o += w * gc_load(v, dt, (bh * sk + j) * dhv + c);
        }
        gc_store(out, dt, row * dhv + c, o);
      }
    }
}

/* dz of (i, j) = scale * P (dP - D_i), as the softmax's backward */
static float attn_dz(const gc_kargs *a, const void *dout, const void *q, const void *k,
                     const void *v, const void *mask, const float *stats, int64_t bh, int64_t i,
                     int64_t j) {
  int64_t sq = a->n[1], rows = a->n[0] * sq, row = bh * sq + i;
  float scale = a->f[0];
  float y = attn_p(stats, rows, row, attn_z(a, q, k, mask, bh, i, j));
  return scale *
         (y * (attn_dp(a, dout, v, stats, bh, i, j) - stats[GC_ATTN_HEAD + 2 * rows + row]));
}

void hk_attn_bwd_dq(const gc_kargs *a) {
  void *dq = a->p[0];
  const void *dout = a->p[1], *q = a->p[2], *k = a->p[3], *v = a->p[4], *mask = a->p[6];
  float *stats = (float *)a->p[5];
  int64_t nbh = a->n[0], sq = a->n[1], sk = a->n[2], dh = a->n[3], rows = nbh * sq;
  int64_t bh, i, j, l;
  int dt = a->dt;
  for (bh = 0; bh < nbh; bh++)
    for (i = 0; i < sq; i++) {
      int64_t row = bh * sq + i;
      float dsum = 0.0f;
      for (j = 0; j < sk; j++)
        dsum += attn_dp(a, dout, v, stats, bh, i, j) *
                attn_p(stats, rows, row, attn_z(a, q, k, mask, bh, i, j));
      stats[GC_ATTN_HEAD + 2 * rows + row] = dsum;
      for (l = 0; l < dh; l++) {
        float s = 0.0f;
        for (j = 0; j < sk; j++)
          s += attn_dz(a, dout, q, k, v, mask, stats, bh, i, j) *
               gc_load(k, dt, (bh * sk + j) * dh + l);
        gc_store(dq, dt, row * dh + l, s);
      }
    }
}

void hk_attn_bwd_dkv(const gc_kargs *a) {
  void *dk = a->p[0], *dv = a->p[1];
  const void *dout = a->p[2], *q = a->p[3], *k = a->p[4], *v = a->p[5], *mask = a->p[7];
  const float *stats = (const float *)a->p[6];
  int64_t nbh = a->n[0], sq = a->n[1], sk = a->n[2], dh = a->n[3], dhv = a->n[4];
  int64_t rows = nbh * sq, bh, i, j, c;
  float p = a->f[1];
  int dt = a->dt;
  for (bh = 0; bh < nbh; bh++)
    for (j = 0; j < sk; j++) {
      for (c = 0; c < dhv; c++) { /* dv_j = sum_i P_ij keep_ij do_i */
        float s = 0.0f;
        for (i = 0; i < sq; i++) {
          int64_t row = bh * sq + i;
          float w = attn_p(stats, rows, row, attn_z(a, q, k, mask, bh, i, j));
          if (p != 0.0f) w *= attn_keep(a, stats, row * sk + j);
          s += w * gc_load(dout, dt, row * dhv + c);
        }
        gc_store(dv, dt, (bh * sk + j) * dhv + c, s);
      }
      for (c = 0; c < dh; c++) { /* dk_j = sum_i dz_ij q_i */
        float s = 0.0f;
        for (i = 0; i < sq; i++)
          s += attn_dz(a, dout, q, k, v, mask, stats, bh, i, j) *
               gc_load(q, dt, (bh * sq + i) * dh + c);
        gc_store(dk, dt, (bh * sk + j) * dh + c, s);
      }
    }
}
