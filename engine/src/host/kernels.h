/*
** kernels.h: the host backend's reference kernels, one per gc_kernel id.
*/
#ifndef GC_HOST_KERNELS_H
#define GC_HOST_KERNELS_H

#include "runtime/backend.h"

typedef void (*hk_fn)(const gc_kargs *a);

/* The fused attention's kernels, forward and backward (attention.c). */
void hk_attn(const gc_kargs *a);
void hk_attn_bwd_dq(const gc_kargs *a);
void hk_attn_bwd_dkv(const gc_kargs *a);

/* The FP8 kernels: casts, amax, delayed scaling's update (fp8.c). */
void hk_fp8_quantize(const gc_kargs *a);
void hk_fp8_dequantize(const gc_kargs *a);
void hk_fp8_amax(const gc_kargs *a);
void hk_fp8_update(const gc_kargs *a);

/* The reference kernel for id k (NULL when k is out of range). */
hk_fn hk_kernel(int k);

#endif
