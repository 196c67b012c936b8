/*
** t_module.h: helpers the module suites share (test_module.c,
** test_module_hooks.c, test_builtin.c). Include it after t.h; every helper
** is static inline, so a suite that leaves one unused gets no warning.
*/
#ifndef T_MODULE_H
#define T_MODULE_H

#include <stdint.h>

#include "t.h"
#include "t_data.h"

/* The values of a and b are bitwise equal (both readable, same numel). */
static inline int t_bitwise_equal(gcap_tensor *a, gcap_tensor *b) {
  int64_t n = gcap_tensor_numel(a);
  if (a == NULL || b == NULL || n != gcap_tensor_numel(b)) return 0;
  float *x = malloc((size_t)(n + 1) * sizeof *x), *y = malloc((size_t)(n + 1) * sizeof *y);
  int eq = x && y && t_read(a, x, (size_t)n) && t_read(b, y, (size_t)n) &&
           memcmp(x, y, (size_t)n * sizeof *x) == 0;
  free(x), free(y);
  return eq;
}

/* Copy every parameter of src into dst's (same structure), grad mode off. */
static inline gcap_status t_copy_params(gcap_module *dst, gcap_module *src) {
  int n = gcap_module_num_parameters(src);
  if (n != gcap_module_num_parameters(dst)) return GCAP_EINVAL;
  gcap_engine *e = gcap_tensor_engine(gcap_module_parameter(src, 0, NULL, 0));
  int was = gcap_set_grad_enabled(e, 0);
  gcap_status st = GCAP_OK;
  for (int i = 0; i < n && st == GCAP_OK; i++)
    st = gcap_copy_(gcap_module_parameter(dst, i, NULL, 0), gcap_module_parameter(src, i, NULL, 0));
  gcap_set_grad_enabled(e, was);
  return st;
}

/* loss = sum(y * r) with r = i-th value a fixed pattern, and its backward. */
static inline gcap_status t_backward_weighted(gcap_tensor *y) {
  gcap_engine *e = gcap_tensor_engine(y);
  int64_t n = gcap_tensor_numel(y);
  float *r = malloc((size_t)(n + 1) * sizeof *r);
  gcap_tensor *rt = NULL, *p = NULL, *l = NULL;
  gcap_status st = GCAP_ENOMEM;
  if (r != NULL) {
    for (int64_t i = 0; i < n; i++)
      r[i] = sinf(0.77f * (float)i + 0.3f);
    if ((st = gcap_tensor_from_f32(e, GCAP_F32, gcap_tensor_ndim(y), gcap_tensor_shape(y), r,
                                   &rt)) == GCAP_OK &&
        (st = gcap_mul(y, rt, &p)) == GCAP_OK && (st = gcap_sum(p, &l)) == GCAP_OK)
      st = gcap_backward(l, NULL, 0);
  }
  free(r);
  gcap_tensor_free(rt), gcap_tensor_free(p), gcap_tensor_free(l);
  return st;
}

/* A new tensor of shape holding cos(0.53 i + phase) * 1.2, requiring grad
** if asked (NULL on error). */
static inline gcap_tensor *t_input(gcap_engine *e, int nd, const int64_t *shape, int requires_grad,
                                   float phase) {
  int64_t n = t_numel(nd, shape);
  float *d = malloc((size_t)(n + 1) * sizeof *d);
  gcap_tensor *t = NULL;
  if (d == NULL) return NULL;
  for (int64_t i = 0; i < n; i++)
    d[i] = cosf(0.53f * (float)i + phase) * 1.2f;
  t = t_from(e, nd, shape, d);
  free(d);
  if (t && requires_grad) gcap_tensor_set_requires_grad(t, 1);
  return t;
}

#endif
