/*
** kernels.h: the host backend's reference kernels, one per gc_kernel id
** (kernels.c, k_optim.c, k_arith.c, k_attn.c).
*/
#ifndef GC_HOST_KERNELS_H
#define GC_HOST_KERNELS_H

#include "runtime/backend.h"

typedef void (*hk_fn)(const gc_kargs *a);

/* The kernels of the other files: the optimizers' (k_optim.c), pow and the
** comparisons (k_arith.c), the fused attention's (k_attn.c); kernels.c holds
** the rest. */
void hk_sgd(const gc_kargs *a);
void hk_adam(const gc_kargs *a);
void hk_counter_inc(const gc_kargs *a);
void hk_pow(const gc_kargs *a);
void hk_pow_bwd(const gc_kargs *a);
void hk_cmp(const gc_kargs *a);
void hk_attn(const gc_kargs *a);
void hk_attn_bwd_dq(const gc_kargs *a);
void hk_attn_bwd_dkv(const gc_kargs *a);

/* The FP8 kernels: casts, amax, delayed scaling's update, the layouts of
** the FP8 GEMM's operands (k_fp8.c). */
void hk_fp8_quantize(const gc_kargs *a);
void hk_sum_rows(const gc_kargs *a); /* kernels.c's, also the quantize's column sums */
void hk_fp8_dequantize(const gc_kargs *a);
void hk_fp8_amax(const gc_kargs *a);
void hk_fp8_update(const gc_kargs *a);
void hk_fp8_pad(const gc_kargs *a);
/* The FP8 GEMM (kernels.c, beside the matmul it shares its sums with). */
void hk_fp8_gemm(const gc_kargs *a);
/* t[b] = FP8 byte b of format f dequantized with scale_inv, as a float
** (GC_K_FP8_DEQUANTIZE's value into an f32 tensor). */
void hk_fp8_table(int f, float scale_inv, float t[256]);

/* The reference kernel for id k (NULL when k is out of range). */
hk_fn hk_kernel(int k);

#endif
