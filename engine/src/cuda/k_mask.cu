/*
** k_mask.cu: GC_K_MASKED_FILL: elements whose (broadcast) mask entry is
** nonzero take a value, the others are copied; bitwise equal to the host.
*/
#include "common.cuh"

static __global__ void k_masked_fill(void *y, const void *x, const void *mask, int dt, int64_t s0,
                                     int64_t s1, int64_t s2, int64_t s3, int64_t flags, float v,
                                     int64_t n) {
  const int64_t s[4] = {s0, s1, s2, s3};
  const int mdt = flags & GC_MASK_BF16 ? GCAP_BF16 : GCAP_F32;
  CU_GRID_LOOP(i, n) {
    float m = cu_load(mask, gc_mask_index(i, s, flags), mdt);
    cu_store(y, i, dt, m != 0.0f ? v : cu_load(x, i, dt));
  }
}

gcap_status cu_mask(gcap_engine *, cu_state *, cudaStream_t s, int, const gc_kargs *a) {
  int64_t n = a->n[0];
  if (n > 0)
    k_masked_fill<<<cu_blocks(n), CU_THREADS, 0, s>>>(
        a->p[0], a->p[1], a->p[2], a->dt, a->n[1], a->n[2], a->n[3], a->n[4], a->n[5], a->f[0], n);
  return GCAP_OK;
}
