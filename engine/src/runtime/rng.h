/*
** rng.h: the engine's counter-based random numbers, shared by the host and
** cuda kernels so both backends draw the same bits. A draw is a pure function
** of (seed, counter): no state lives in a thread, so a replayed graph draws
** what eager code draws from the same (seed, offset) held in device memory.
*/
#ifndef GC_RNG_H
#define GC_RNG_H

#include <math.h>
#include <stdint.h>

/* A function of the host and the cuda kernels alike (there a device function too). */
#ifdef __CUDACC__
#define GC_HD __host__ __device__ __forceinline__
#else
#define GC_HD static inline
#endif

/* splitmix64's finaliser: a bijective 64-bit mix. */
GC_HD uint64_t gc_rng_mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* A uniform float in [0, 1) with 24 random bits. */
GC_HD float gc_rng_uniform(uint64_t seed, uint64_t ctr) {
  return (float)(gc_rng_mix(seed ^ gc_rng_mix(ctr)) >> 40) * (1.0f / 16777216.0f);
}

/* A standard normal draw (Box-Muller on counters 2c and 2c + 1). */
GC_HD float gc_rng_normal(uint64_t seed, uint64_t ctr) {
  float u1 = gc_rng_uniform(seed, 2 * ctr), u2 = gc_rng_uniform(seed, 2 * ctr + 1);
  return sqrtf(-2.0f * logf(1.0f - u1)) * cosf(6.2831853071795864f * u2);
}

#endif
