/*
** k_elementwise.cu: fill, copy, add, sub, mul, div, scale (backend.h's
** GC_K_FILL .. GC_K_SCALE; copy also converts f32 <-> bf16), and foreach_add, the
** .grad accumulation of several tensors. Each element is one float
** operation with round-to-nearest intrinsics (__fadd_rn, ...), which the
** compiler never fuses into an FMA, so f32 results equal the host reference
** bit for bit. Large same-shape operands go 16 bytes at a time.
*/
#include <climits>

#include "common.cuh"

/* The kernels take their index type I: int when every index fits (the
** common case; 64-bit division and addressing cost a small kernel a third
** of its time), int64_t otherwise. */
#define CU_LOOP(I, i, n)                                                                           \
  for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (I)gridDim.x * blockDim.x)

template <typename I> static __global__ void k_fill(void *y, int dt, I n, float v) {
  CU_LOOP(I, i, n) cu_store(y, i, dt, v);
}

/* k_fill over n 16-byte packs: v as dt stores it, in every element. */
static __global__ void k_fill_packed(uint4 *y, int dt, int64_t n, float v) {
  cu_pack u;
  for (int j = 0; j < 4; j++)
    if (dt == GCAP_BF16)
      u.h[j] = __float2bfloat162_rn(v);
    else
      u.f[j] = v;
  CU_GRID_LOOP(i, n) y[i] = u.v;
}

/* Converts between dtypes: ydt is the destination's, xdt the source's. */
template <typename I> static __global__ void k_copy(void *y, int ydt, const void *x, int xdt, I n) {
  CU_LOOP(I, i, n) cu_store(y, i, ydt, cu_load(x, i, xdt));
}

/* A copy within one dtype moves the bits as they are (a NaN keeps its
** payload), as the host's does. */
template <typename T, typename I> static __global__ void k_copy_bits(T *y, const T *x, I n) {
  CU_LOOP(I, i, n) y[i] = x[i];
}

/* Index i of an operand of m elements broadcast over n (m = n, 1, or a row). */
template <typename I> static __device__ __forceinline__ I cu_bidx(I i, I m, I n) {
  return m == n ? i : m == 1 ? 0 : i % m;
}

static __device__ __forceinline__ float cu_binop(int op, float u, float v) {
  switch (op) {
    case GC_K_ADD:
      return __fadd_rn(u, v);
    case GC_K_SUB:
      return __fsub_rn(u, v);
    case GC_K_DIV:
      return __fdiv_rn(u, v);
    default: /* GC_K_MUL */
      return __fmul_rn(u, v);
  }
}

/* y[i] = a[i % na] op b[i % nb]: the modulo broadcasts a 0-D or one-element
** operand and a row matching the last dimension. */
template <typename I>
static __global__ void k_binary(int op, void *y, const void *a, I na, const void *b, I nb, int dt,
                                I n) {
  CU_LOOP(I, i, n) {
    float u = cu_load(a, cu_bidx(i, na, n), dt), v = cu_load(b, cu_bidx(i, nb, n), dt);
    cu_store(y, i, dt, cu_binop(op, u, v));
  }
}

/* Operands of the same shape, 16-byte aligned, whole packs: the same
** arithmetic as k_binary (so the same bits), 16 bytes per load and store,
** which a large tensor's bandwidth needs. */
static __global__ void k_binary_packed(int op, uint4 *y, const uint4 *a, const uint4 *b, int dt,
                                       int64_t npack) {
  CU_GRID_LOOP(i, npack) {
    cu_pack u, v, r;
    u.v = a[i];
    v.v = b[i];
    for (int w = 0; w < 4; w++) {
      if (dt == GCAP_BF16) {
        float2 x = __bfloat1622float2(u.h[w]), z = __bfloat1622float2(v.h[w]);
        r.h[w] = __float22bfloat162_rn(make_float2(cu_binop(op, x.x, z.x), cu_binop(op, x.y, z.y)));
      } else {
        r.f[w] = cu_binop(op, u.f[w], v.f[w]);
      }
    }
    y[i] = r.v;
  }
}

static __global__ void k_copy_packed(uint4 *y, const uint4 *x, int64_t npack) {
  CU_GRID_LOOP(i, npack) y[i] = x[i];
}

template <typename I> static __global__ void k_scale(void *y, const void *x, int dt, I n, float f) {
  CU_LOOP(I, i, n) cu_store(y, i, dt, __fmul_rn(cu_load(x, i, dt), f));
}

/* Pair blockIdx.y of a foreach_add: dst += src, or dst = src (see backend.h). */
template <typename I> static __global__ void k_foreach_add(gc_kargs a) {
  int j = (int)blockIdx.y, add = a.n[GC_FOREACH_MAX + j] != 0;
  void *y = a.p[2 * j];
  const void *x = a.p[2 * j + 1];
  I n = (I)a.n[j];
  CU_LOOP(I, i, n) {
    float v = cu_load(x, i, a.dt);
    cu_store(y, i, a.dt, add ? __fadd_rn(cu_load(y, i, a.dt), v) : v);
  }
}

/* The same over 16-byte packs, when every pair splits into them. */
static __global__ void k_foreach_add_packed(gc_kargs a) {
  int j = (int)blockIdx.y, add = a.n[GC_FOREACH_MAX + j] != 0;
  uint4 *y = (uint4 *)a.p[2 * j];
  const uint4 *x = (const uint4 *)a.p[2 * j + 1];
  int64_t npack = a.n[j] / (a.dt == GCAP_BF16 ? 8 : 4);
  CU_GRID_LOOP(i, npack) {
    cu_pack u, v;
    v.v = x[i];
    if (add) {
      u.v = y[i];
      for (int w = 0; w < 4; w++) {
        if (a.dt == GCAP_BF16) {
          float2 p = __bfloat1622float2(u.h[w]), q = __bfloat1622float2(v.h[w]);
          v.h[w] = __float22bfloat162_rn(make_float2(__fadd_rn(p.x, q.x), __fadd_rn(p.y, q.y)));
        } else {
          v.f[w] = __fadd_rn(u.f[w], v.f[w]);
        }
      }
    }
    y[i] = v.v;
  }
}

/* The used pairs of a foreach_add, and its largest pair's packs (0 when a
** pair does not split into 16-byte packs). */
static unsigned cu_foreach_pairs(const gc_kargs *a, int64_t *packs) {
  unsigned j = 0;
  *packs = 0;
  for (; j < GC_FOREACH_MAX && a->n[j] > 0; j++) {
    int64_t pj = cu_packs(a->n[j], a->dt, a->p[2 * j], a->p[2 * j + 1], NULL);
    if (pj == 0) {
      *packs = -1;
    } else if (*packs >= 0 && pj > *packs) {
      *packs = pj;
    }
  }
  if (*packs < 0) *packs = 0;
  return j;
}

/* total: the launch's element count (a foreach_add's largest pair). */
template <typename I>
static void cu_launch_elementwise(cudaStream_t s, int k, const gc_kargs *a, int64_t total) {
  I n = (I)a->n[0];
  unsigned g = cu_blocks(total);
  int64_t packs;
  if ((k == GC_K_ADD || k == GC_K_SUB || k == GC_K_MUL || k == GC_K_DIV) && a->n[1] == a->n[0] &&
      a->n[2] == a->n[0] && (packs = cu_packs(a->n[0], a->dt, a->p[0], a->p[1], a->p[2])) > 0) {
    k_binary_packed<<<cu_blocks(packs), CU_THREADS, 0, s>>>(
        k, (uint4 *)a->p[0], (const uint4 *)a->p[1], (const uint4 *)a->p[2], a->dt, packs);
    return;
  }
  if (k == GC_K_FILL && (packs = cu_packs(a->n[0], a->dt, a->p[0], NULL, NULL)) > 0) {
    k_fill_packed<<<cu_blocks(packs), CU_THREADS, 0, s>>>((uint4 *)a->p[0], a->dt, packs, a->f[0]);
    return;
  }
  if (k == GC_K_COPY && a->n[1] == a->dt && a->p[0] != a->p[1] &&
      (packs = cu_packs(a->n[0], a->dt, a->p[0], a->p[1], NULL)) > 0) {
    k_copy_packed<<<cu_blocks(packs), CU_THREADS, 0, s>>>((uint4 *)a->p[0], (const uint4 *)a->p[1],
                                                          packs);
    return;
  }
  switch (k) {
    case GC_K_FILL:
      k_fill<I><<<g, CU_THREADS, 0, s>>>(a->p[0], a->dt, n, a->f[0]);
      break;
    case GC_K_COPY:                  /* dt: the destination's dtype, n[1]: the source's */
      if (a->p[0] == a->p[1]) break; /* as the host: a copy onto itself is a no-op */
      if (a->n[1] == a->dt && a->dt == GCAP_BF16)
        k_copy_bits<uint16_t, I>
            <<<g, CU_THREADS, 0, s>>>((uint16_t *)a->p[0], (const uint16_t *)a->p[1], n);
      else if (a->n[1] == a->dt)
        k_copy_bits<uint32_t, I>
            <<<g, CU_THREADS, 0, s>>>((uint32_t *)a->p[0], (const uint32_t *)a->p[1], n);
      else
        k_copy<I><<<g, CU_THREADS, 0, s>>>(a->p[0], a->dt, a->p[1], (int)a->n[1], n);
      break;
    case GC_K_ADD:
    case GC_K_SUB:
    case GC_K_MUL:
    case GC_K_DIV:
      k_binary<I>
          <<<g, CU_THREADS, 0, s>>>(k, a->p[0], a->p[1], (I)a->n[1], a->p[2], (I)a->n[2], a->dt, n);
      break;
    case GC_K_FOREACH_ADD: {
      int64_t packs;
      unsigned pairs = cu_foreach_pairs(a, &packs);
      if (packs > 0)
        k_foreach_add_packed<<<dim3(cu_blocks(packs), pairs), CU_THREADS, 0, s>>>(*a);
      else
        k_foreach_add<I><<<dim3(g, pairs), CU_THREADS, 0, s>>>(*a);
      break;
    }
    default: /* GC_K_SCALE */
      k_scale<I><<<g, CU_THREADS, 0, s>>>(a->p[0], a->p[1], a->dt, n, a->f[0]);
      break;
  }
}

gcap_status cu_elementwise(gcap_engine *, cu_state *, cudaStream_t s, int k, const gc_kargs *a) {
  int64_t total = a->n[0];
  for (int j = 1; k == GC_K_FOREACH_ADD && j < GC_FOREACH_MAX; j++)
    if (a->n[j] > total) total = a->n[j];
  if (total <= 0) return GCAP_OK;
  /* int indices while i + the grid's stride cannot overflow */
  if (total <= INT_MAX - (int64_t)CU_THREADS * CU_MAX_BLOCKS)
    cu_launch_elementwise<int>(s, k, a, total);
  else
    cu_launch_elementwise<int64_t>(s, k, a, total);
  return GCAP_OK;
}
