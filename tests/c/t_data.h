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

#endif
