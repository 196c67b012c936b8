/*
** k_embed.cu: GC_K_EMBEDDING and GC_K_EMBEDDING_BWD.
**
** The lookup copies rows (bitwise equal to the host). The backward is
** deterministic without atomics: one thread per column walks the ids in
** order and adds each row's entry of that column into the f32 scratch, so
** every sum is taken in the host's order (f32 and bf16 results equal the
** host's bit for bit), whatever the timing.
*/
#include <math.h>

#include "common.cuh"

/* The row that id i names, or -1 (not an integer, out of range, NaN). */
__device__ __forceinline__ int64_t cu_row_id(const void *ids, int64_t i, int64_t rows) {
  float t = ((const float *)ids)[i];
  if (!(t >= 0.0f && t < (float)rows && t == floorf(t))) return -1;
  return (int64_t)t;
}

static __global__ void k_embedding(void *y, const void *w, const void *ids, void *badid,
                                   int64_t graph, int dt, int64_t cols, int64_t rows, int64_t n) {
  CU_GRID_LOOP(t, n) {
    int64_t i = t / cols, c = t % cols, r = cu_row_id(ids, i, rows);
    cu_store(y, t, dt, r < 0 ? NAN : cu_load(w, r * cols + c, dt));
    if (r < 0 && c == 0)
      cu_badid_note(badid, GC_BADID_EMBEDDING, graph, i, ((const float *)ids)[i], rows);
  }
}

static __global__ void k_embedding_bwd(void *dw, const void *g, const void *ids, float *acc, int dt,
                                       int64_t n, int64_t cols, int64_t rows) {
  CU_GRID_LOOP(c, cols) {
    for (int64_t r = 0; r < rows; r++)
      acc[r * cols + c] = 0.0f;
    for (int64_t i = 0; i < n; i++) {
      int64_t r = cu_row_id(ids, i, rows);
      if (r >= 0) acc[r * cols + c] = __fadd_rn(acc[r * cols + c], cu_load(g, i * cols + c, dt));
    }
    for (int64_t r = 0; r < rows; r++)
      cu_store(dw, r * cols + c, dt, acc[r * cols + c]);
  }
}

gcap_status cu_embed(gcap_engine *, cu_state *, cudaStream_t s, int k, const gc_kargs *a) {
  int64_t n = a->n[0], cols = a->n[1], rows = a->n[2];
  if (cols <= 0) return GCAP_OK;
  if (k == GC_K_EMBEDDING) {
    if (n > 0)
      k_embedding<<<cu_blocks(n * cols), CU_THREADS, 0, s>>>(a->p[0], a->p[1], a->p[2], a->p[3],
                                                             a->n[3], a->dt, cols, rows, n * cols);
    return GCAP_OK;
  }
  if (rows > 0)
    k_embedding_bwd<<<cu_blocks(cols), CU_THREADS, 0, s>>>(a->p[0], a->p[1], a->p[2],
                                                           (float *)a->p[3], a->dt, n, cols, rows);
  return GCAP_OK;
}
