/*
** t_data.h: data helpers that several C suites share: a deterministic
** generator, element counts and shapes, and the ops of the case tables of
** test_grad.c and test_parity.c (op_fn: y = op(x[0], x[1], ...)). Include it
** after t.h. Every helper is static inline, so a suite that leaves one unused
** gets no warning; ops whose constants differ between suites stay in them.
*/
#ifndef T_DATA_H
#define T_DATA_H

#include <stdint.h>

#include "t.h"

/* A small deterministic generator (an LCG on *state): uniform in [-1, 1). */
static inline float t_urand(uint32_t *state) {
  *state = *state * 1664525u + 1013904223u;
  return (float)((*state >> 8) & 0xffffffu) / 8388608.0f - 1.0f;
}

/* The element count of the shape (nd, shape): 1 for nd = 0. */
static inline int64_t t_numel(int nd, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < nd; i++)
    n *= shape[i];
  return n;
}

/* 1 when t has exactly the shape (nd, shape). */
static inline int t_has_shape(gcap_tensor *t, int nd, const int64_t *shape) {
  if (t == NULL || gcap_tensor_ndim(t) != nd) return 0;
  const int64_t *s = gcap_tensor_shape(t);
  for (int i = 0; i < nd; i++)
    if (s[i] != shape[i]) return 0;
  return 1;
}

/* ------------------------------------------------------------------------ */
/* The ops of a case table                                                   */

typedef gcap_status (*op_fn)(gcap_tensor *const *x, gcap_tensor **y);

static inline gcap_status f_add(gcap_tensor *const *x, gcap_tensor **y) {
  return gcap_add(x[0], x[1], y);
}
static inline gcap_status f_sub(gcap_tensor *const *x, gcap_tensor **y) {
  return gcap_sub(x[0], x[1], y);
}
static inline gcap_status f_mul(gcap_tensor *const *x, gcap_tensor **y) {
  return gcap_mul(x[0], x[1], y);
}
static inline gcap_status f_div(gcap_tensor *const *x, gcap_tensor **y) {
  return gcap_div(x[0], x[1], y);
}
static inline gcap_status f_pow(gcap_tensor *const *x, gcap_tensor **y) {
  return gcap_pow(x[0], x[1], y);
}
static inline gcap_status f_neg(gcap_tensor *const *x, gcap_tensor **y) {
  return gcap_neg(x[0], y);
}
static inline gcap_status f_sum(gcap_tensor *const *x, gcap_tensor **y) {
  return gcap_sum(x[0], y);
}
static inline gcap_status f_mean(gcap_tensor *const *x, gcap_tensor **y) {
  return gcap_mean(x[0], y);
}
static inline gcap_status f_matmul(gcap_tensor *const *x, gcap_tensor **y) {
  return gcap_matmul(x[0], x[1], y);
}
static inline gcap_status f_linear(gcap_tensor *const *x, gcap_tensor **y) {
  return gcap_linear(x[0], x[1], x[2], y);
}
static inline gcap_status f_linear_nb(gcap_tensor *const *x, gcap_tensor **y) {
  return gcap_linear(x[0], x[1], NULL, y);
}
static inline gcap_status f_linear_gelu(gcap_tensor *const *x, gcap_tensor **y) {
  return gcap_linear_gelu(x[0], x[1], x[2], y);
}
static inline gcap_status f_linear_gelu_nb(gcap_tensor *const *x, gcap_tensor **y) {
  return gcap_linear_gelu(x[0], x[1], NULL, y);
}
static inline gcap_status f_relu(gcap_tensor *const *x, gcap_tensor **y) {
  return gcap_relu(x[0], y);
}
static inline gcap_status f_gelu(gcap_tensor *const *x, gcap_tensor **y) {
  return gcap_gelu(x[0], y);
}
static inline gcap_status f_ln_wb(gcap_tensor *const *x, gcap_tensor **y) {
  return gcap_layer_norm(x[0], x[1], x[2], 1e-5, y);
}
static inline gcap_status f_ln(gcap_tensor *const *x, gcap_tensor **y) {
  return gcap_layer_norm(x[0], NULL, NULL, 1e-5, y);
}
static inline gcap_status f_softmax(gcap_tensor *const *x, gcap_tensor **y) {
  return gcap_softmax(x[0], -1, y);
}
static inline gcap_status f_mse(gcap_tensor *const *x, gcap_tensor **y) {
  return gcap_mse_loss(x[0], x[1], y);
}
static inline gcap_status f_xent(gcap_tensor *const *x, gcap_tensor **y) {
  return gcap_cross_entropy(x[0], x[1], y);
}

/* The ops of attention and the shape ops around it. */
static inline gcap_status f_permute(gcap_tensor *const *x, gcap_tensor **y) {
  static const int perm[4] = {2, 0, 3, 1};
  return gcap_permute(x[0], perm, y);
}
/* [S, B, H, D] -> [B, H, S, D] and back: permutes that keep the last dim (whole rows move) */
static inline gcap_status f_permute_heads(gcap_tensor *const *x, gcap_tensor **y) {
  static const int perm[4] = {1, 2, 0, 3};
  return gcap_permute(x[0], perm, y);
}
static inline gcap_status f_merge_heads(gcap_tensor *const *x, gcap_tensor **y) {
  static const int perm[4] = {2, 0, 1, 3};
  return gcap_permute(x[0], perm, y);
}
static inline gcap_status f_transpose(gcap_tensor *const *x, gcap_tensor **y) {
  return gcap_transpose(x[0], -1, -2, y);
}
/* cat of x's pieces (3 + 3 + 1 along dim 1) in another order, one scaled */
static inline gcap_status f_split_cat(gcap_tensor *const *x, gcap_tensor **y) {
  gcap_tensor *p[3] = {0}, *s = NULL, *order[3];
  int n = 0;
  gcap_status st = gcap_split(x[0], 3, 1, 3, p, &n);
  if (st == GCAP_OK && (st = gcap_scale(p[0], 2.0, &s)) == GCAP_OK) {
    order[0] = p[2], order[1] = s, order[2] = p[1];
    st = gcap_cat(3, order, 1, y);
  }
  for (int i = 0; i < n; i++)
    gcap_tensor_free(p[i]);
  gcap_tensor_free(s);
  return st;
}

/* softmax of 0.125 x plus an additive mask x[1]; the same causal, with a
** boolean mask x[1] (0/1 values) */
static inline gcap_status f_softmax_add(gcap_tensor *const *x, gcap_tensor **y) {
  return gcap_softmax_masked(x[0], 0.125, x[1], GCAP_MASK_ADD, 0, y);
}
static inline gcap_status f_softmax_bool_causal(gcap_tensor *const *x, gcap_tensor **y) {
  return gcap_softmax_masked(x[0], 0.125, x[1], GCAP_MASK_BOOL, 1, y);
}
static inline gcap_status f_softmax_causal(gcap_tensor *const *x, gcap_tensor **y) {
  return gcap_softmax_masked(x[0], 1.0, NULL, GCAP_MASK_ADD, 1, y);
}
static inline gcap_status f_masked_fill(gcap_tensor *const *x, gcap_tensor **y) {
  return gcap_masked_fill(x[0], x[1], -3.5, y);
}

/* embedding of ids x[0] (class-id fill, converted to the f32 ids are held
** in) into the table x[1] */
static inline gcap_status f_embedding(gcap_tensor *const *x, gcap_tensor **y) {
  gcap_tensor *ids = NULL;
  gcap_status st = gcap_tensor_empty(gcap_tensor_engine(x[0]), GCAP_F32, gcap_tensor_ndim(x[0]),
                                     gcap_tensor_shape(x[0]), &ids);
  if (st == GCAP_OK && (st = gcap_copy_(ids, x[0])) == GCAP_OK) st = gcap_embedding(ids, x[1], y);
  gcap_tensor_free(ids);
  return st;
}

/* attention by impl: plain, or causal with dropout (seeded), with a boolean
** mask when given */
static inline gcap_status t_sdpa(gcap_tensor *const *x, int causal_dropout, gcap_tensor *mask,
                                 gcap_sdpa_impl impl, gcap_tensor **y) {
  gcap_sdpa_opts o = {.attn_mask = mask,
                      .mask_kind = GCAP_MASK_BOOL,
                      .is_causal = causal_dropout,
                      .dropout_p = causal_dropout ? 0.2 : 0.0,
                      .impl = impl};
  return gcap_scaled_dot_product_attention(x[0], x[1], x[2], &o, y);
}
/* the default impl: plain; causal with dropout; with a boolean mask x[3] */
static inline gcap_status f_sdpa(gcap_tensor *const *x, gcap_tensor **y) {
  return t_sdpa(x, 0, NULL, GCAP_SDPA_AUTO, y);
}
static inline gcap_status f_sdpa_causal_dropout(gcap_tensor *const *x, gcap_tensor **y) {
  return t_sdpa(x, 1, NULL, GCAP_SDPA_AUTO, y);
}
static inline gcap_status f_sdpa_mask(gcap_tensor *const *x, gcap_tensor **y) {
  return t_sdpa(x, 0, x[3], GCAP_SDPA_AUTO, y);
}
/* the fused kernels: the same three, and all at once (mask x[3]) */
static inline gcap_status f_sdpa_fz(gcap_tensor *const *x, gcap_tensor **y) {
  return t_sdpa(x, 0, NULL, GCAP_SDPA_FUSED, y);
}
static inline gcap_status f_sdpa_fz_causal_dropout(gcap_tensor *const *x, gcap_tensor **y) {
  return t_sdpa(x, 1, NULL, GCAP_SDPA_FUSED, y);
}
static inline gcap_status f_sdpa_fz_mask(gcap_tensor *const *x, gcap_tensor **y) {
  return t_sdpa(x, 0, x[3], GCAP_SDPA_FUSED, y);
}
static inline gcap_status f_sdpa_fused(gcap_tensor *const *x, gcap_tensor **y) {
  return t_sdpa(x, 1, x[3], GCAP_SDPA_FUSED, y);
}

#endif
