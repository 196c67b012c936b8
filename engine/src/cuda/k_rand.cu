/*
** k_rand.cu: GC_K_RAND, GC_K_RNG_ADVANCE and GC_K_RNG_COPY. A generator's
** {seed, offset} lives in device memory and is read when the kernel runs, so
** a replayed graph draws from the current state, as eager code does (rng.h).
*/
#include "common.cuh"
#include "runtime/rng.h"

/* y[i] = draw(seed, offset + i); the state is not changed. */
static __global__ void k_rand(void *y, const uint64_t *state, int dt, int64_t n, int normal) {
  uint64_t seed = state[0], off = state[1];
  CU_GRID_LOOP(i, n) {
    uint64_t c = off + (uint64_t)i;
    cu_store(y, i, dt, normal ? gc_rng_normal(seed, c) : gc_rng_uniform(seed, c));
  }
}

static __global__ void k_rng_advance(uint64_t *state, uint64_t n) {
  state[1] += n;
}

static __global__ void k_rng_copy(uint64_t *dst, const uint64_t *src) {
  dst[0] = src[0];
  dst[1] = src[1];
}

gcap_status cu_rand(gcap_engine *, cu_state *, cudaStream_t s, int k, const gc_kargs *a) {
  int64_t n = a->n[0];
  if (k == GC_K_RNG_ADVANCE) {
    k_rng_advance<<<1, 1, 0, s>>>((uint64_t *)a->p[0], (uint64_t)n);
  } else if (k == GC_K_RNG_COPY) {
    k_rng_copy<<<1, 1, 0, s>>>((uint64_t *)a->p[0], (const uint64_t *)a->p[1]);
  } else if (n > 0) { /* GC_K_RAND */
    k_rand<<<cu_blocks(n), CU_THREADS, 0, s>>>(a->p[0], (const uint64_t *)a->p[1], a->dt, n,
                                               a->n[1] == 1);
  }
  return GCAP_OK;
}
