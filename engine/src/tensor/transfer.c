/*
** transfer.c: the host<->device transfers, which capture forbids: a tensor
** from host floats, and a tensor read back into them (a bf16 tensor goes
** through an f32 one, converted on the device); a tensor's raw bytes, read
** or written in place, in the dtype it has.
*/
#include "tensor.h"

gcap_status gcap_tensor_from_f32(gcap_engine *e, gcap_dtype dt, int ndim, const int64_t *shape,
                                 const float *data, gcap_tensor **out) {
  gcap_tensor *t = NULL, *f = NULL;
  gcap_status st;
  if (out != NULL) *out = NULL;
  if (e == NULL) return GCAP_EINVAL;
  gc_clear(e);
  if (out == NULL) return gc_null(e, "tensor", "out");
  if ((st = gc_check_not_capturing(e, "tensor from host data (a synchronous upload)")) != GCAP_OK)
    return st;
  if ((st = gc_tensor_alloc(e, "tensor", GCAP_F32, ndim, shape, &f)) != GCAP_OK) return st;
  if (f->numel > 0 && data == NULL) {
    gcap_tensor_free(f);
    return gc_fail(e, GCAP_EINVAL, "tensor: data is NULL");
  }
  if ((st = gc_note_access(e, f, 1)) != GCAP_OK ||
      (f->numel > 0 && (st = e->be->upload(e, e->bs, e->current->bs, gc_tensor_ptr(f), data,
                                           (size_t)f->numel * sizeof(float))) != GCAP_OK)) {
    gcap_tensor_free(f);
    return st;
  }
  if (dt == GCAP_F32) {
    *out = f;
    return GCAP_OK;
  }
  if ((st = gc_tensor_alloc(e, "tensor", dt, ndim, shape, &t)) == GCAP_OK &&
      (st = gcap_copy_(t, f)) != GCAP_OK) {
    gcap_tensor_free(t);
    t = NULL;
  }
  gcap_tensor_free(f);
  *out = t;
  return st;
}

gcap_status gcap_tensor_read(gcap_tensor *t, float *dst, size_t n) {
  gcap_engine *e;
  gcap_tensor *f = NULL;
  gcap_status st;
  if (t == NULL) return GCAP_EINVAL;
  e = t->e;
  gc_clear(e);
  if ((st = gc_check_not_capturing(e, "reading a tensor back to the host (tolist/item)")) !=
      GCAP_OK)
    return st;
  if (n != (size_t)t->numel)
    return gc_fail(e, GCAP_EINVAL, "read: n is %zu, but the tensor has %lld elements", n,
                   (long long)t->numel);
  if (n == 0) return GCAP_OK;
  if (dst == NULL) return gc_null(e, "read", "dst");
  if ((st = gc_note_access(e, t, 0)) != GCAP_OK) return st; /* a dead block refuses it */
  /* a bf16 tensor is widened on the device, then copied */
  if (t->dt != GCAP_F32) {
    if ((st = gc_tensor_alloc(e, "read", GCAP_F32, t->ndim, t->shape, &f)) != GCAP_OK) return st;
    if ((st = gc_copy(f, t)) != GCAP_OK) {
      gcap_tensor_free(f);
      return st;
    }
    t = f;
  }
  st = e->be->download(e, e->bs, e->current->bs, dst, gc_tensor_ptr(t), n * sizeof(float));
  gcap_tensor_free(f);
  return st != GCAP_OK ? st : gc_badid_check(e); /* the work before it has run */
}

/* The start of a transfer of t's raw bytes: the capture rule, n the size of
** its elements, p not NULL where there are some, and t's bytes noted as read
** or written (a dead block refuses them; a write counts as one). */
static gcap_status bytes_start(gcap_tensor *t, const char *op, const char *pname, const void *p,
                               size_t n, int write) {
  gcap_engine *e = t->e;
  size_t size = (size_t)t->numel * gc_dtype_size(t->dt);
  gcap_status st;
  gc_clear(e);
  if ((st = gc_check_not_capturing(
           e, write ? "write_bytes: writing a tensor's bytes from the host (a synchronous upload)"
                    : "read_bytes: reading a tensor's bytes back to the host")) != GCAP_OK)
    return st;
  if (n != size)
    return gc_fail(e, GCAP_EINVAL,
                   "%s: n is %zu bytes, but the tensor holds %zu (%lld %s elements)", op, n, size,
                   (long long)t->numel, gc_dtype_name(t->dt));
  if (n > 0 && p == NULL) return gc_null(e, op, pname);
  return n > 0 ? gc_note_access(e, t, write) : GCAP_OK;
}

gcap_status gcap_tensor_read_bytes(gcap_tensor *t, void *dst, size_t n) {
  gcap_engine *e;
  gcap_status st;
  if (t == NULL) return GCAP_EINVAL;
  e = t->e;
  if ((st = bytes_start(t, "read_bytes", "dst", dst, n, 0)) != GCAP_OK || n == 0) return st;
  st = e->be->download(e, e->bs, e->current->bs, dst, gc_tensor_ptr(t), n);
  return st != GCAP_OK ? st : gc_badid_check(e);
}

gcap_status gcap_tensor_write_bytes(gcap_tensor *t, const void *src, size_t n) {
  gcap_engine *e;
  gcap_status st;
  if (t == NULL) return GCAP_EINVAL;
  e = t->e;
  if ((st = bytes_start(t, "write_bytes", "src", src, n, 1)) != GCAP_OK || n == 0) return st;
  return e->be->upload(e, e->bs, e->current->bs, gc_tensor_ptr(t), src, n);
}
