/*
** fp8.c: the FP8 ops over the catalogue's GC_K_FP8_* kernels: FP8 copies of
** tensors (bytes, and the inverse of the scale they were made with),
** quantize, dequantize, amax, delayed scaling's update of a state tensor,
** the layouts and the GEMM of FP8 operands, and the public round trip
** gcap_fp8_cast. None is recorded by autograd;
** the FP8 linear (train/fp8_linear.c) builds its node over them.
*/
#include <math.h>
#include <stdlib.h>

#include "tensor.h"

void gc_fp8_free(gc_fp8 *q) {
  gcap_tensor_free(q->data);
  gcap_tensor_free(q->scale_inv);
  memset(q, 0, sizeof *q);
}

gcap_status gc_fp8_alloc(gcap_engine *e, const char *op, int64_t n, gcap_fp8_format format,
                         gc_fp8 *q) {
  int64_t words = (n + 3) / 4, one = 1;
  gcap_status st;
  memset(q, 0, sizeof *q);
  q->n = n;
  q->format = format;
  if ((st = gc_tensor_alloc(e, op, GCAP_F32, 1, &words, &q->data)) != GCAP_OK ||
      (st = gc_tensor_alloc(e, op, GCAP_F32, 1, &one, &q->scale_inv)) != GCAP_OK)
    gc_fp8_free(q);
  return st;
}

gcap_tensor *gc_elems(gcap_tensor *t, int64_t k, int64_t n) {
  gcap_tensor *a = gc_tensor_alias(t, 1, &n);
  if (a != NULL) {
    a->off += (size_t)k * gc_dtype_size(t->dt);
    a->numel = n;
  }
  return a;
}

gcap_status gc_fp8_transposed(gcap_engine *e, const gc_fp8 *q, int64_t rows, int64_t cols,
                              gc_fp8 *t) {
  int64_t n = cols * GC_FP8_LD(rows), words = (n + 3) / 4;
  gcap_status st;
  if (t->data == NULL) {
    if ((st = gc_tensor_alloc(e, "fp8 transpose", GCAP_F32, 1, &words, &t->data)) != GCAP_OK)
      return st;
    t->n = n;
  }
  t->format = q->format;
  if (t->scale_inv != q->scale_inv) {
    gcap_tensor_free(t->scale_inv);
    t->scale_inv = gcap_tensor_retain(q->scale_inv);
  }
  return GCAP_OK;
}

gcap_status gc_fp8_quantize(gcap_tensor *x, gc_fp8 *q, gcap_tensor *scale, int current,
                            gcap_tensor *amax, gcap_tensor *skip, gc_fp8 *t, int64_t cols,
                            gcap_tensor **dbias) {
  gcap_engine *e = x->e;
  gcap_tensor *in[3], *scratch = NULL;
  gc_kargs a;
  gcap_status st;
  int nin = 0;
  if (dbias != NULL) *dbias = NULL;
  if (t != NULL && (st = gc_fp8_transposed(e, q, x->numel / cols, cols, t)) != GCAP_OK) return st;
  memset(&a, 0, sizeof a);
  if (dbias != NULL) {
    int64_t chunks = GC_FP8_DBIAS_CHUNKS(GC_FP8_LD(x->numel / cols));
    if ((st = gc_tensor_alloc(e, "fp8 quantize", x->dt, 1, &cols, dbias)) != GCAP_OK ||
        (st = gc_note_access(e, *dbias, 1)) != GCAP_OK ||
        (st = gc_scratch(e, "fp8 quantize", chunks * cols, &scratch, &a.p[8])) != GCAP_OK)
      return gc_keep_or_free(dbias, st);
    a.p[7] = gc_tensor_ptr(*dbias);
  }
  a.p[0] = gc_tensor_ptr(q->data);
  a.p[1] = gc_tensor_ptr(x);
  a.p[2] = gc_tensor_ptr(scale);
  a.p[3] = amax ? gc_tensor_ptr(amax) : NULL;
  a.p[4] = gc_tensor_ptr(q->scale_inv);
  a.p[5] = skip ? gc_tensor_ptr(skip) : NULL;
  a.n[0] = x->numel;
  a.n[1] = q->format;
  a.n[2] = current != 0;
  if (t != NULL) a.p[6] = gc_tensor_ptr(t->data);
  if (t != NULL || dbias != NULL) {
    a.n[3] = x->numel / cols;
    a.n[4] = cols;
    a.n[5] = GC_FP8_LD(a.n[3]);
  }
  in[nin++] = x;
  in[nin++] = scale;
  if (skip) in[nin++] = skip;
  if ((st = gc_note_access(e, q->data, 1)) != GCAP_OK ||
      (t != NULL && (st = gc_note_access(e, t->data, 1)) != GCAP_OK) ||
      (st = gc_note_access(e, q->scale_inv, 1)) != GCAP_OK ||
      (amax && (st = gc_note_access(e, amax, 0)) != GCAP_OK) ||
      (amax && (st = gc_note_access(e, amax, 1)) != GCAP_OK))
    goto done;
  st = gc_run(e, GC_K_FP8_QUANTIZE, &a, in, nin, NULL);
done:
  gcap_tensor_free(scratch);
  return dbias != NULL ? gc_keep_or_free(dbias, st) : st;
}

gcap_status gc_fp8_dequantize(const gc_fp8 *q, gcap_dtype dt, int ndim, const int64_t *shape,
                              gcap_tensor **out) {
  gcap_engine *e = q->data->e;
  gcap_tensor *in[2];
  gc_kargs a;
  gcap_status st;
  if ((st = gc_tensor_alloc(e, "fp8 dequantize", dt, ndim, shape, out)) != GCAP_OK) return st;
  memset(&a, 0, sizeof a);
  a.p[0] = gc_tensor_ptr(*out);
  a.p[1] = gc_tensor_ptr(q->data);
  a.p[2] = gc_tensor_ptr(q->scale_inv);
  a.n[0] = q->n;
  a.n[1] = q->format;
  in[0] = q->data;
  in[1] = q->scale_inv;
  return gc_keep_or_free(out, gc_run(e, GC_K_FP8_DEQUANTIZE, &a, in, 2, *out));
}

gcap_status gc_fp8_amax(gcap_tensor *x, gcap_tensor *amax) {
  gcap_tensor *in[2];
  gc_kargs a;
  gcap_status st;
  memset(&a, 0, sizeof a);
  a.p[0] = gc_tensor_ptr(amax);
  a.p[1] = gc_tensor_ptr(x);
  a.n[0] = x->numel;
  in[0] = x;
  in[1] = amax;
  if ((st = gc_note_access(x->e, amax, 1)) != GCAP_OK) return st;
  return gc_run(x->e, GC_K_FP8_AMAX, &a, in, 2, NULL);
}

gcap_status gc_fp8_update(gcap_tensor *state, int roles, int len, int r0, int count,
                          int most_recent, const float *scaled_max) {
  gc_kargs a;
  int j;
  memset(&a, 0, sizeof a);
  a.p[0] = gc_tensor_ptr(state);
  a.n[0] = len;
  a.n[1] = r0;
  a.n[2] = count;
  a.n[3] = roles;
  a.n[4] = most_recent != 0;
  for (j = 0; j < count && j < GC_KFLOATS; j++)
    a.f[j] = scaled_max[j];
  return gc_run(state->e, GC_K_FP8_UPDATE, &a, &state, 1, state);
}

gcap_status gc_fp8_pad(const gc_fp8 *q, int64_t rows, int64_t cols, gc_fp8 *out) {
  gcap_engine *e = q->data->e;
  int64_t ld = GC_FP8_LD(cols), words;
  gcap_tensor *in[1];
  gc_kargs a;
  gcap_status st;
  memset(out, 0, sizeof *out);
  out->n = rows * ld;
  out->format = q->format;
  words = (out->n + 3) / 4;
  if ((st = gc_tensor_alloc(e, "fp8 pad", GCAP_F32, 1, &words, &out->data)) != GCAP_OK) return st;
  out->scale_inv = gcap_tensor_retain(q->scale_inv);
  memset(&a, 0, sizeof a);
  a.p[0] = gc_tensor_ptr(out->data);
  a.p[1] = gc_tensor_ptr(q->data);
  a.n[0] = rows;
  a.n[1] = cols;
  a.n[2] = ld;
  in[0] = q->data;
  if ((st = gc_run(e, GC_K_FP8_PAD, &a, in, 1, out->data)) != GCAP_OK) gc_fp8_free(out);
  return st;
}

gcap_status gc_fp8_gemm(const gc_fp8 *A, const gc_fp8 *B, int64_t m, int64_t n, int64_t k,
                        int64_t ld, float beta, gcap_tensor *bias, gcap_tensor *pre, int fast,
                        gcap_dtype dt, int ndim, const int64_t *shape, gcap_tensor **c) {
  gcap_engine *e = A->data->e;
  gcap_tensor *in[6];
  gc_kargs a;
  gcap_status st = GCAP_OK;
  int fresh = *c == NULL, nin = 0;
  if (fresh && (st = gc_tensor_alloc(e, "fp8 gemm", dt, ndim, shape, c)) != GCAP_OK) return st;
  memset(&a, 0, sizeof a);
  a.p[0] = gc_tensor_ptr(*c);
  a.p[1] = gc_tensor_ptr(A->data);
  a.p[2] = gc_tensor_ptr(B->data);
  a.p[3] = bias ? gc_tensor_ptr(bias) : NULL;
  a.p[5] = pre ? gc_tensor_ptr(pre) : NULL;
  a.p[6] = gc_tensor_ptr(A->scale_inv);
  a.p[7] = gc_tensor_ptr(B->scale_inv);
  a.n[0] = m;
  a.n[1] = n;
  a.n[2] = k;
  a.n[3] = ld;
  a.n[4] = fast != 0;
  a.n[5] = A->format;
  a.n[6] = B->format;
  a.f[0] = 1.0f;
  a.f[1] = beta;
  in[nin++] = A->data;
  in[nin++] = B->data;
  in[nin++] = A->scale_inv;
  in[nin++] = B->scale_inv;
  if (bias) in[nin++] = bias;
  if (beta != 0.0f && !fresh) in[nin++] = *c; /* C is read too */
  if (pre) st = gc_note_access(e, pre, 1);
  if (st == GCAP_OK) st = gc_run(e, GC_K_FP8_GEMM, &a, in, nin, *c);
  return fresh ? gc_keep_or_free(c, st) : st;
}

/* ------------------------------------------------------------------------ */
/* A module's FP8 state                                                      */

gcap_status gc_fp8_meta_new(gcap_engine *e, const char *who, int gemms, int len,
                            gc_fp8_meta **out) {
  int roles = 3 * gemms, r;
  int64_t n = GC_FP8_STATE_FLOATS((int64_t)roles, len);
  float *init;
  gcap_status st;
  *out = NULL;
  if ((init = (float *)gc_calloc((size_t)n, sizeof *init)) == NULL ||
      (*out = (gc_fp8_meta *)gc_calloc(1, sizeof **out)) == NULL) {
    free(init);
    return gc_fail(e, GCAP_ENOMEM, "%s: out of host memory for its FP8 state", who);
  }
  for (r = 0; r < roles; r++)
    init[roles + r] = 1.0f; /* the scales start at 1, the amaxes and histories at 0 */
  (*out)->refs = 1;
  (*out)->gemms = gemms;
  (*out)->len = len;
  st = gcap_tensor_from_f32(e, GCAP_F32, 1, &n, init, &(*out)->state);
  free(init);
  if (st != GCAP_OK) {
    free(*out);
    *out = NULL;
  }
  return st;
}

gc_fp8_meta *gc_fp8_meta_retain(gc_fp8_meta *m) {
  if (m != NULL) m->refs++;
  return m;
}

void gc_fp8_meta_release(gc_fp8_meta *m) {
  int g;
  if (m == NULL || --m->refs > 0) return;
  gcap_tensor_free(m->state);
  for (g = 0; g < GC_FP8_MAX_GEMMS; g++) {
    gc_fp8_free(&m->wcache[g]);
    gc_fp8_free(&m->wcache_t[g]);
  }
  free(m);
}

/* ------------------------------------------------------------------------ */
/* The public round trip                                                     */

gcap_status gcap_fp8_cast(gcap_tensor *x, gcap_fp8_format format, double scale, gcap_tensor **out,
                          gcap_tensor **amax) {
  static const char op[] = "fp8.cast";
  gcap_tensor *s = NULL, *m = NULL;
  gc_fp8 q;
  gcap_status st;
  memset(&q, 0, sizeof q);
  if (amax != NULL) *amax = NULL;
  if ((st = gc_op_start_out(op, x, "x", NULL, out)) != GCAP_OK) return st;
  if (format != GCAP_FP8_E4M3 && format != GCAP_FP8_E5M2)
    return gc_fail(x->e, GCAP_EINVAL, "%s: unknown FP8 format %d (expected E4M3 or E5M2)", op,
                   (int)format);
  if (!(isfinite(scale) && scale > 0.0 && (float)scale > 0.0f && isfinite((float)scale)))
    return gc_fail(x->e, GCAP_EINVAL, "%s: scale must be a finite number > 0 (as a float), got %g",
                   op, scale);
  if ((st = gcap_tensor_full(x->e, GCAP_F32, 0, NULL, scale, &s)) == GCAP_OK &&
      (st = gcap_tensor_full(x->e, GCAP_F32, 0, NULL, 0.0, &m)) == GCAP_OK &&
      (st = gc_fp8_alloc(x->e, op, x->numel, format, &q)) == GCAP_OK &&
      (st = gc_fp8_quantize(x, &q, s, 0, m, NULL, NULL, 0, NULL)) == GCAP_OK)
    st = gc_fp8_dequantize(&q, x->dt, x->ndim, x->shape, out);
  gc_fp8_free(&q);
  gcap_tensor_free(s);
  if (st == GCAP_OK && amax != NULL) {
    *amax = m;
    m = NULL;
  }
  gcap_tensor_free(m);
  return st;
}
