/*
** backend.h: the one table a backend implements, and the kernel catalogue
** (its names in kernel_names.c).
**
** The core reaches a backend only through gc_backend. A kernel launch is a
** kernel id plus a gc_kargs taken by value: the host backend records exactly
** that during capture and replays it; the cuda backend launches the matching
** CUDA kernel on the stream. Every kernel has a readable host reference in
** host/kernels.c and a CUDA version in cuda/; parity tests compare them.
**
** Backends never include each other and never see the engine's layout; they
** report errors through gc_fail (error.h, which sets the engine's message).
*/
#ifndef GC_BACKEND_H
#define GC_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "error.h"
#include "graphcap_types.h"
#include "rng.h"

/* C linkage for the C++ of the cuda backend (cuda/common.cuh). */
#ifdef __cplusplus
extern "C" {
#endif

/* The kernel catalogue: one row per kernel, X(ID, name, family, writes), the
** one list that the enum, the names, the host table and the cuda dispatch are
** made from (a new kernel: a row here, its host reference, its case in its cuda family):
**   ID      the kernel's id, GC_K_<ID>;
**   name    its name in messages ("add"), and its host reference hk_<name>
**           (host/kernels.c);
**   family  the cuda launcher cu_<family> that runs it (cuda/k_<family>.cu);
**   writes  the pointer arguments it writes, bit i for p[i]; it reads the others.
** Element counts are int64; pointers are device addresses; dt is the gcap_dtype
** of the tensors (all operands of one launch share it). */
#define GC_KERNELS(X)                                                                              \
  /* p[0][i] = f[0], i < n[0] */                                                                   \
  X(FILL, fill, elementwise, 0x01)                                                                 \
  /* p[0][i] = p[1][i], i < n[0]; dt: destination dtype, n[1]: source dtype */                     \
  X(COPY, copy, elementwise, 0x01)                                                                 \
  /* p[0][i] = p[1][i % n[1]] + p[2][i % n[2]], i < n[0] */                                        \
  X(ADD, add, elementwise, 0x01)                                                                   \
  /* p[0][i] = p[1][i % n[1]] - p[2][i % n[2]] */                                                  \
  X(SUB, sub, elementwise, 0x01)                                                                   \
  /* p[0][i] = p[1][i % n[1]] * p[2][i % n[2]] */                                                  \
  X(MUL, mul, elementwise, 0x01)                                                                   \
  /* p[0][i] = p[1][i % n[1]] / p[2][i % n[2]] */                                                  \
  X(DIV, div, elementwise, 0x01)                                                                   \
  /* p[0][i] = p[1][i] * f[0], i < n[0] */                                                         \
  X(SCALE, scale, elementwise, 0x01)                                                               \
  /* p[0][i] = pow(p[1][i % n[1]], p[2][i % n[2]]), i < n[0] (in double, then rounded) */          \
  X(POW, pow, arith, 0x01)                                                                         \
  /* the grads of y = pow(a, b), i < n[0], from p[2] = dy (n[0] elements), a = p[3][i % n[3]],     \
     b = p[4][i % n[4]]: p[0] (NULL: not wanted) = dy b pow(a, b - 1), 0 where b = 0; p[1]         \
     (NULL: not wanted) = dy pow(a, b) log(a), 0 where a = 0 and b >= 0 (PyTorch's rules) */       \
  X(POW_BWD, pow_bwd, arith, 0x03)                                                                 \
  /* p[0][i] = p[1][i % n[1]] OP p[2][i % n[2]] ? 1 : 0, i < n[0]: OP the gcap_cmp n[4]; the       \
     operands are of dtype n[3], the result f32 (dt) */                                            \
  X(CMP, cmp, arith, 0x01)                                                                         \
  /* p[0][0] = f[0] * sum(p[1][0 .. n[0]))  (mean: f[0] = 1/n); p[2]: NULL, or f32 scratch of      \
     GC_SUM_CHUNKS(n[0]) floats for a backend that sums chunks of the elements, then the           \
     chunks */                                                                                     \
  X(SUM, sum, reduce, 0x05)                                                                        \
  /* p[0][i] = draw(seed, offset + i), i < n[0]; p[1] = u64 state {seed, offset}; n[1] = 1         \
     for normal, 0 uniform */                                                                      \
  X(RAND, rand, rand, 0x01)                                                                        \
  /* state p[0] = {seed, offset}: offset += n[0] */                                                \
  X(RNG_ADVANCE, rng_advance, rand, 0x01)                                                          \
  /* state p[0] = state p[1]: a generator's {seed, offset} saved or restored */                    \
  X(RNG_COPY, rng_copy, rand, 0x01)                                                                \
  /* -- autograd, layers and optimizers (row-major matrices, "rows x cols") -- */                  \
  /* p[0][i] = f[0] * p[1][i % n[1]], i < n[0] (grad of sum/mean/broadcast) */                     \
  X(EXPAND, expand, linalg, 0x01)                                                                  \
  /* p[0][j] = sum_i p[1][i*n[1] + j], i < n[0], j < n[1] (grad of a bias row); p[2]: NULL,        \
     or f32 scratch of GC_SUM_ROWS_CHUNKS(n[0]) * n[1] floats for a backend that sums chunks       \
     of rows, then the chunks in a fixed order */                                                  \
  X(SUM_ROWS, sum_rows, linalg, 0x05)                                                              \
  /* C = f[0] * op(A) op(B) + f[1] * C (+ bias); p[0] = C [n[0] x n[1]], p[1] = A, p[2] = B,       \
     n[2] = k; n[3] = 1: op(A) = A^T (A stored k x m), n[4] = 1: op(B) = B^T (B stored n x         \
     k). Float accumulation. p[3]: NULL, or a bias row of n added to every row of C (with          \
     f[1] = 0); p[4]: NULL, or a vector of m receiving the sums over k of op(A)'s rows (the        \
     bias grad of a linear's weight-grad GEMM; only with n[3] = 1); p[5]: NULL, or a matrix        \
     like C receiving op(A) op(B) + bias while C receives its gelu_tanh (a Linear followed by      \
     a GELU; with f[1] = 0): the host applies it to the value as stored, cuBLASLt's epilogue       \
     to the float before rounding (bf16 results differ within tolerance). Batched: n[5] > 1        \
     products, A at p[1] + b * n[6] elements, B at p[2] + b * n[7] (a stride 0 reuses one          \
     matrix), C at p[0] + b * m * n; no bias, bias grad nor gelu then */                           \
  X(MATMUL, matmul, linalg, 0x31)                                                                  \
  /* p[0][i] = max(p[1][i], 0) */                                                                  \
  X(RELU, relu, activation, 0x01)                                                                  \
  /* p[0][i] = p[2][i] > 0 ? p[1][i] : 0  (p[1] = dy, p[2] = x) */                                 \
  X(RELU_BWD, relu_bwd, activation, 0x01)                                                          \
  /* p[0][i] = gelu_tanh(p[1][i]) */                                                               \
  X(GELU, gelu, activation, 0x01)                                                                  \
  /* p[0][i] = p[1][i] * gelu_tanh'(p[2][i])  (p[1] = dy, p[2] = x); p[3]: NULL, or the sums       \
     of the stored p[0] seen as rows of n[1] columns, p[3][j] = sum_i p[0][i*n[1] + j] (the        \
     bias grad of the linear before the gelu); p[4]: NULL, or f32 scratch of                       \
     GC_COLSUM_CHUNKS(n[0] / n[1]) * n[1] floats */                                                \
  X(GELU_BWD, gelu_bwd, activation, 0x19)                                                          \
  /* rows n[0] x cols n[1], eps f[0]: p[0] = y, p[1] = x, p[2] = weight or NULL, p[3] = bias       \
     or NULL, p[4] = mean [rows] (f32), p[5] = rstd [rows] (f32) */                                \
  X(LAYERNORM, layer_norm, norm, 0x31)                                                             \
  /* p[0] = dx, p[1] = dy, p[2] = x, p[3] = weight or NULL, p[4] = mean, p[5] = rstd; rows         \
     n[0], cols n[1] */                                                                            \
  X(LAYERNORM_BWD, layer_norm_bwd, norm, 0x01)                                                     \
  /* p[0] = dweight, p[1] = dbias (either may be NULL), p[2] = dy, p[3] = x, p[4] = mean,          \
     p[5] = rstd; rows n[0], cols n[1]; p[6]: NULL, or f32 scratch of 2 *                          \
     GC_LN_PARAMS_CHUNKS(n[0]) * n[1] floats for a backend that sums chunks of rows */             \
  X(LAYERNORM_BWD_PARAMS, layer_norm_bwd_params, norm, 0x43)                                       \
  /* softmax over the last dim of z = f[0] * x (+ mask): p[0] = y, p[1] = x; rows n[0], cols       \
     n[1]; p[2]: NULL, or a mask broadcast over x seen as 4-D [rows / (n[3] n[4]), n[3], n[4],     \
     n[1]]; n[2]: GC_MASK_* flags (the mask's dims that broadcast, its dtype, additive or          \
     boolean, causal: column c > row r % n[4] masked out); a row with every column masked out      \
     is all zeros */                                                                               \
  X(SOFTMAX, softmax, norm, 0x01)                                                                  \
  /* p[0] = dx = f[0] * y * (dy - sum_row(dy * y)); p[1] = dy, p[2] = y; f[0]: the forward's       \
     scale */                                                                                      \
  X(SOFTMAX_BWD, softmax_bwd, norm, 0x01)                                                          \
  /* p[0] = y, p[1] = x, p[2] = mask (same dtype: 0 or 1/(1-f[0])), p[3] = rng state {seed,        \
     offset}; keep element i when gc_rng_uniform(seed, offset + i) >= f[0]; n[0] elements */       \
  X(DROPOUT, dropout, loss, 0x05)                                                                  \
  /* cross entropy: logits p[1] [n[0] x n[1]], targets p[2] (class ids as floats, n[0]); p[3]      \
     = probs out [n[0] x n[1]]; p[0] = loss per row [n[0]], NaN for a target that is no class,     \
     the first such to the bad-id flag p[4] (NULL: checked) with graph id n[2] */                  \
  X(XENT, cross_entropy, loss, 0x09)                                                               \
  /* p[0] = dlogits = (probs - onehot(target)) * p[3][0] * f[0]; p[1] = probs, p[2] =              \
     targets, p[3] = upstream grad (one element); rows n[0], cols n[1] */                          \
  X(XENT_BWD, cross_entropy_bwd, loss, 0x01)                                                       \
  /* param p[0] -= lr * d, d = grad p[1] (+ f[2] * param), lr = p[3][0] (f32, one element, read    \
     when the kernel runs); with momentum (p[2] != NULL): buf = f[1] * buf + d, d = buf; n[0]      \
     elements */                                                                                   \
  X(SGD, sgd, optim, 0x05)                                                                         \
  /* p[0] param, p[1] grad, p[2] m, p[3] v, p[4] step count (f32, one element, already             \
     incremented), p[5] lr (f32, one element); beta1 f[1], beta2 f[2], eps f[3], weight decay      \
     f[4]: n[1] = 0, L2 (added to the grad); 1, decoupled (AdamW: param *= 1 - lr * f[4]           \
     first); bias-corrected; n[0] elements */                                                      \
  X(ADAM, adam, optim, 0x0d)                                                                       \
  /* p[0][0] += 1 (f32 counter) */                                                                 \
  X(COUNTER_INC, counter_inc, optim, 0x01)                                                         \
  /* -- shapes (contiguous copies) -- */                                                           \
  /* p[0] = x permuted: x p[1] of shape n[0..3] (padded with leading 1s to 4-D), dim d of y        \
     is dim n[4 + d] of x */                                                                       \
  X(PERMUTE, permute, shape, 0x01)                                                                 \
  /* a slice of a tensor seen as [outer n[0], full n[3], inner n[2]]: the n[1] entries from        \
     n[4] of its middle dim; n[5] = 0: p[0] = the slice of p[1]; 1: the slice of p[0] = p[1]       \
     (the rest of p[0] untouched) */                                                               \
  X(NARROW, narrow, shape, 0x01)                                                                   \
  /* p[0][o, i] = sum_j p[1][o, j, i] over j < n[1] in order; [outer n[0], n[1], inner n[2]] */    \
  X(SUM_MID, sum_mid, shape, 0x01)                                                                 \
  /* p[0][i] = mask(i) != 0 ? f[0] : p[1][i], i < n[0] elements of 4-D shape n[1..4]; the mask     \
     p[2] broadcast as the GC_MASK_* flags n[5] say */                                             \
  X(MASKED_FILL, masked_fill, mask, 0x01)                                                          \
  /* rows p[0][i] = p[1][id_i] of a table [n[2] rows x n[1]], ids p[2] (f32 integers), i <         \
     n[0]; a row whose id is no row of the table is NaN, and the first such id goes to the         \
     bad-id flag p[3] (NULL: the ids were checked) with graph id n[3] */                           \
  X(EMBEDDING, embedding, embed, 0x01)                                                             \
  /* p[0] [n[2] x n[1]] = the sum over i in order of rows p[1][i] into row id_i, in the f32        \
     scratch p[3] of n[2] x n[1] floats, then stored; ids as embedding's, others skipped */        \
  X(EMBEDDING_BWD, embedding_bwd, embed, 0x09)                                                     \
  /* -- fused attention: q p[1] [BH, Sq, D], k p[2] [BH, Sk, D], v p[3] [BH, Sk, Dv]; n[0] = BH,   \
     n[1] = Sq, n[2] = Sk, n[3] = D, n[4] = Dv, n[5] = GC_MASK_* flags of the mask (over           \
     [BH / n[6], n[6], Sq, Sk]) with causal, n[6] = H; f[0] = scale, f[1] = dropout p; the         \
     scores z = f[0] q.k, then the mask, as softmax's. stats (f32): GC_ATTN_HEAD floats (the       \
     dropout's {seed, offset} as the forward read them), then per row of BH * Sq its max z,        \
     its sum of exp(z - max), and the backward's D = sum_j dP P. With GC_ATTN_CUDNN in n[5]        \
     (only where the backend's attn_supported said yes for these arguments): the backend's         \
     library runs all three (cuda: cuDNN's fused SDPA, whose dropout draws from its own Philox     \
     generator seeded with that {seed, offset}: other elements than GC_K_DROPOUT's), and stats     \
     holds the head, then per row of BH * Sq its log-sum-exp max + log(sum) of z (cuDNN's Stats    \
     [B, H, Sq, 1] of f32, B = BH / H), nothing more -- */                                         \
  /* forward: p[0] = o [BH, Sq, Dv] = dropout(softmax(z)) v, dropping element (bh, i, j)           \
     as GC_K_DROPOUT drops element (bh * Sq + i) * Sk + j of the weights; p[4] = stats             \
     (written: head, max, sum), p[5] = mask or NULL, p[6] = rng state {seed, offset} (NULL:        \
     no dropout) */                                                                                \
  X(ATTN, attn, attn, 0x11)                                                                        \
  /* backward, first: p[0] = dq, p[1] = do, p[2..4] = q, k, v, p[5] = stats                        \
     (D written), p[6] = mask, p[7] = o (a backend may take D as do . o, equal to sum_j dP P       \
     in exact arithmetic); with GC_ATTN_CUDNN also p[8] = dk, p[9] = dv: this launch writes        \
     all three grads (stats only read) and GC_K_ATTN_BWD_DKV is not launched */                    \
  X(ATTN_BWD_DQ, attn_bwd_dq, attn, 0x321)                                                         \
  /* backward, second: p[0] = dk, p[1] = dv, p[2] = do, p[3..5] = q, k, v, p[6] = stats,           \
     p[7] = mask */                                                                                \
  X(ATTN_BWD_DKV, attn_bwd_dkv, attn, 0x03)                                                        \
  /* .grad accumulation of several tensors in one launch: for each pair j < GC_FOREACH_MAX         \
     with n[j] > 0 elements (the used pairs come first), p[2j][i] = p[2j][i] + p[2j+1][i]          \
     when n[GC_FOREACH_MAX + j] = 1, or p[2j][i] = p[2j+1][i] (a copy, same dtype) when it is      \
     0; one pair's memory never overlaps another's, so the pairs may run in any order */           \
  X(FOREACH_ADD, foreach_add, elementwise, 0x55)                                                   \
  /* -- FP8: n[1] the gcap_fp8_format; casts round to nearest even, saturate to the largest        \
     finite value (infinities too) and keep NaN a NaN (0x7f); the amax of x is the largest |x|     \
     (NaN elements left out, as fmaxf does) -- */                                                  \
  /* p[0] = n[0] FP8 bytes, cast(x * scale) of x p[1] (dt); p[2]: the scale (f32, one              \
     element), or with n[2] = 1 an amax (one element) from which the launch takes the scale:       \
     fp8_max / amax, 1 where the amax is 0 or not finite, FLT_MAX where the quotient is            \
     infinite (current scaling); p[3]: NULL, or one f32 that becomes max(itself, amax of x);       \
     p[4]: NULL, or one f32 receiving 1 / scale; p[5]: NULL, or one f32 flag: nonzero, the         \
     launch does nothing (a weight whose cached FP8 copy is kept); p[6]: NULL, or [n[4] rows x     \
     n[5] bytes] = the bytes of p[0] read as [n[3] rows x n[4] cols], transposed (n[5] >= n[3]),   \
     zeros after each row's n[3] bytes: an FP8_GEMM operand summing over the n[3] rows;            \
     p[7]: NULL, or n[4] sums (dt) = the columns of x read as [n[3] x n[4]] summed (a grad's       \
     bias grad, TransformerEngine's cast_transpose_dbias), p[8] then NULL or the scratch of        \
     GC_FP8_DBIAS_CHUNKS(n[5]) * n[4] f32 partial sums for backends that sum in parallel; n[3]     \
     .. n[5] are set when p[6] or p[7] is */                                                       \
  X(FP8_QUANTIZE, fp8_quantize, fp8, 0x1d9)                                                        \
  /* p[0][i] (dt) = the FP8 byte p[1][i] times p[2][0] (f32: the scale's inverse), i < n[0] */     \
  X(FP8_DEQUANTIZE, fp8_dequantize, fp8, 0x01)                                                     \
  /* p[0][0] (f32) = max(p[0][0], amax of x p[1] of n[0] elements) */                              \
  X(FP8_AMAX, fp8_amax, fp8, 0x01)                                                                 \
  /* delayed scaling's update of roles n[1] .. n[1] + n[2] - 1 of the state p[0] (f32,             \
     GC_FP8_STATE_FLOATS(R = n[3] roles, L = n[0]): amax[R], scale[R], history[R][L], most         \
     recent first); per role r: a = amax[r]; amax[r] = 0; when a != 0 the history shifts one       \
     place and history[r][0] = a; then m = the fmaxf of history[r] (n[4] = 0, "max") or a          \
     (n[4] = 1, "most_recent"), and scale[r] = f[r - n[1]] / m (f: fp8_max / 2^margin) where m     \
     is finite and > 0, FLT_MAX where that is infinite; otherwise scale[r] stays */                \
  X(FP8_UPDATE, fp8_update, fp8, 0x01)                                                             \
  /* the bytes of an FP8 copy laid out for FP8_GEMM: p[0] [n[0] rows x n[2] bytes] = p[1]          \
     [n[0] rows x n[1] cols], zeros after each row's n[1] bytes (n[2] >= n[1]) */                  \
  X(FP8_PAD, fp8_pad, fp8, 0x01)                                                                   \
  /* C p[0] [m = n[0] x n = n[1]] (dt) = f[0] A B^T + f[1] C (+ bias): A [m x k] and B [n x k],    \
     k = n[2], the FP8 bytes p[1] and p[2] of formats n[5] and n[6], rows n[3] bytes apart         \
     (n[3] >= k, the bytes from k to n[3] of each row 0, in both), each element its byte times     \
     its operand's scale inverse (p[6] for A, p[7] for B: one f32 each); p[3]: NULL, or a bias     \
     row of n (dt, with f[1] = 0); p[5]: NULL, or the pre-activation as GC_K_MATMUL's (C its       \
     gelu_tanh); n[4] = 1: the backend may accumulate with less than f32 precision                 \
     (cuBLASLt's fast accumulation, TransformerEngine's forward GEMM). The host dequantizes        \
     each operand to dt (GC_K_FP8_DEQUANTIZE's values) and sums as GC_K_MATMUL does; cuda runs     \
     cuBLASLt's FP8 GEMM with the scale inverses as its A and B scale pointers and f32             \
     accumulation, over n[3] (a multiple of 16 there), within tolerance of the host */             \
  X(FP8_GEMM, fp8_gemm, fp8_gemm, 0x21)

/* The largest finite value of FP8 format f (gcap_fp8_format), and the
** floats of a delayed-scaling state of r roles with histories of l amaxes
** (GC_K_FP8_UPDATE): amax[r], scale[r], history[r][l]. */
#define GC_FP8_MAX(f) ((f) == GCAP_FP8_E5M2 ? 57344.0f : 448.0f)
#define GC_FP8_STATE_FLOATS(r, l) ((r) * (2 + (l)))

/* The chunks of rows of a quantize's column sums (GC_K_FP8_QUANTIZE's p[8]),
** ld its transpose's rows padded: one per GC_FP8_TILE rows, the tiles of
** cuda's cast-transpose. */
#define GC_FP8_TILE 64
#define GC_FP8_DBIAS_CHUNKS(ld) (((ld) + GC_FP8_TILE - 1) / GC_FP8_TILE)

/* The flags of a mask read by softmax and masked_fill: bit d (d < 4) set when
** the mask has size 1 in dim d of the 4-D shape it is broadcast over. */
#define GC_MASK_BCAST(d) (1 << (d))
#define GC_MASK_BF16 0x10   /* the mask is stored as bf16 (f32 otherwise) */
#define GC_MASK_BOOL 0x20   /* nonzero: masked out (additive otherwise) */
#define GC_MASK_CAUSAL 0x40 /* softmax: column c > row r % n[4] masked out */
/* The fused attention's launches run on the backend's library attention
** (the catalogue's fused attention; gc_backend.attn_supported). Its
** pointers are GC_ATTN_CUDNN_ALIGN-byte aligned: attn_supported checks q, k
** and v, the engine's allocations are, and the core copies a do that is not. */
#define GC_ATTN_CUDNN 0x80
#define GC_ATTN_CUDNN_ALIGN 16
/* With GC_ATTN_CUDNN, self-attention over a packed projection (Sq = Sk = S,
** D = Dv, no mask, n[0] = B * H): q p[1], k p[2] = q + D and v p[3] = q + 2D
** are read in place from qkv [S, B, H, 3D] (each head's q, k and v side by
** side), o and do are [S, B, H * D], and dq p[0], dk p[8] = dq + D and dv
** p[9] = dq + 2D are written into one [S, B, H, 3D] tensor. */
#define GC_ATTN_PACKED 0x100

/* The floats before the rows of an attention's stats: the dropout's
** {seed, offset} (two u64). */
#define GC_ATTN_HEAD 4

/* Shared by the host and the cuda kernels (GC_HD, from rng.h: there a
** device function too). */

/* x OP z for the gcap_cmp OP (GC_K_CMP's elements). */
GC_HD int gc_compare(float x, float z, int op) {
  switch (op) {
    case GCAP_LT:
      return x < z;
    case GCAP_LE:
      return x <= z;
    case GCAP_GT:
      return x > z;
    case GCAP_GE:
      return x >= z;
    case GCAP_EQ:
      return x == z;
    default: /* GCAP_NE */
      return x != z;
  }
}

/* The element of a mask broadcast over the 4-D shape s that element i reads. */
GC_HD int64_t gc_mask_index(int64_t i, const int64_t *s, int64_t flags) {
  int64_t m = 0, stride = 1;
  int d;
  for (d = 3; d >= 0; d--) {
    int64_t c = i % s[d];
    i /= s[d];
    if (!(flags & GC_MASK_BCAST(d))) {
      m += c * stride;
      stride *= s[d];
    }
  }
  return m;
}

#define GC_K_ID(id, name, family, writes) GC_K_##id,
typedef enum gc_kernel { GC_KERNELS(GC_K_ID) GC_K_COUNT } gc_kernel;
#undef GC_K_ID

/* How many chunks a sum of n elements may use its scratch for (1: none). */
#define GC_SUM_CHUNKS(n) ((n) >= (1 << 20) ? 256 : 1)

/* Pairs of one GC_K_FOREACH_ADD launch: two pointers and two ints each. */
#define GC_FOREACH_MAX 4

/* How many chunks of rows a sum_rows may use its scratch for (1: none). */
#define GC_SUM_ROWS_CHUNKS(rows) ((rows) >= 1024 ? 64 : 1)

/* How many chunks of rows the column sums that do not keep the host's row
** order (gelu_bwd's bias grad) may use their scratch for (1: none): about 32
** rows a chunk, at most 64 chunks. */
#define GC_COLSUM_CHUNKS(rows) ((rows) >= 2048 ? 64 : (rows) >= 64 ? (rows) / 32 : 1)

/* The same for layer_norm's parameter grads, whose chunks read whole rows:
** about 16 rows a chunk, at most 512 chunks, enough blocks to fill a GPU. */
#define GC_LN_PARAMS_CHUNKS(rows) ((rows) >= 8192 ? 512 : (rows) >= 64 ? (rows) / 16 : 1)

/* Element i of storage p of dtype dt as a float, and v stored there: f32, or
** bf16 as the upper half of an f32, rounded to nearest even (NaN stays a
** quiet NaN). Host code's one way to read and write elements. */
static inline float gc_load(const void *p, int dt, int64_t i) {
  if (dt == GCAP_BF16) {
    uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
  }
  return ((const float *)p)[i];
}

static inline void gc_store(void *p, int dt, int64_t i, float v) {
  if (dt == GCAP_BF16) {
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
      u = 0x7fc00000u;
    else
      u += 0x7fffu + ((u >> 16) & 1u);
    ((uint16_t *)p)[i] = (uint16_t)(u >> 16);
    return;
  }
  ((float *)p)[i] = v;
}

/* The bad-id flag. Ops that look rows up by id (embedding, cross_entropy)
** check their ids before an eager launch; inside a graph the ids are data
** of each replay, so the kernel writes the first bad id it meets into this
** flag, host-visible memory the engine reads at its next sync point and at
** the next replay (badid.c). Words of u32: */
#define GC_BADID_STATE 0 /* 0 clear, 1 being written, 2 set */
#define GC_BADID_OP 1    /* GC_BADID_EMBEDDING or GC_BADID_XENT */
#define GC_BADID_GRAPH 2 /* the graph's id, low then high word */
#define GC_BADID_INDEX 4 /* the position of the id, low then high word */
#define GC_BADID_VALUE 6 /* the id's float bits */
#define GC_BADID_COUNT 7 /* the ids that are valid: 0 .. count - 1 */
#define GC_BADID_WORDS 8
#define GC_BADID_EMBEDDING 1
#define GC_BADID_XENT 2

#define GC_KPTRS 10
#define GC_KINTS 8
#define GC_KFLOATS 8

/* The arguments of one launch, taken by value (baked at capture). */
typedef struct gc_kargs {
  void *p[GC_KPTRS];
  int64_t n[GC_KINTS];
  float f[GC_KFLOATS];
  int dt;
} gc_kargs;

/* A custom op's launch (graphcap.h, "Custom ops"): its callbacks and ud,
** and its operands, inputs first. The host backend copies it when it
** records it; name, ud and the callbacks stay valid while a graph holds it
** (the core keeps the op alive for every graph that recorded it). */
typedef struct gc_custom {
  const char *name;
  gcap_custom_fn host, cuda;
  void *ud;
  int nin, nout;
  const gcap_custom_arg *arg; /* [nin + nout] */
} gc_custom;

/* The name of kernel k, for messages ("add", "sum", ...; "?" when k is no
** kernel id): inline, as every launch names its kernel to the capture checks. */
extern const char *const gc_kernel_names[GC_K_COUNT];
static inline const char *gc_kernel_name(int k) {
  return k >= 0 && k < GC_K_COUNT ? gc_kernel_names[k] : "?";
}

/* A collective of the distributed layer (dist/), launched like a kernel on a
** stream. src and dst are device addresses of `count` elements of dtype dt per
** rank (all_gather: dst holds nranks x count; reduce_scatter: src holds
** nranks x count); peer is the root of a broadcast or the other side of a
** send/recv, as a rank of the group. comm is the backend's communicator of
** the group (comm_new; NULL on host); `run` does the transfer on the host
** (MPI) with `group` for its state: the host backend calls it at launch, or
** records the descriptor by value during a capture and calls it at each
** replay. */
typedef enum gc_coll_kind {
  GC_COLL_ALL_REDUCE,
  GC_COLL_ALL_GATHER,
  GC_COLL_REDUCE_SCATTER,
  GC_COLL_BROADCAST,
  GC_COLL_SEND,
  GC_COLL_RECV
} gc_coll_kind;

typedef enum gc_red { GC_RED_SUM, GC_RED_AVG, GC_RED_MAX } gc_red;

typedef struct gc_coll gc_coll;
struct gc_coll {
  gc_coll_kind kind;
  gc_red red;
  int dt;
  int peer;
  const void *src;
  void *dst;
  int64_t count;
  void *comm;
  void *group;
  gcap_status (*run)(gcap_engine *e, const gc_coll *c);
};

/* The name of collective kind k and of reduction r, for messages. */
static inline const char *gc_coll_name(int k) {
  static const char *const names[] = {"all_reduce", "all_gather", "reduce_scatter",
                                      "broadcast",  "send",       "recv"};
  return k >= 0 && k <= GC_COLL_RECV ? names[k] : "?";
}
static inline const char *gc_red_name(int r) {
  static const char *const names[] = {"sum", "avg", "max"};
  return r >= 0 && r <= GC_RED_MAX ? names[r] : "?";
}

/* Bytes of a communicator's unique id (NCCL's), made by one rank and
** broadcast by the distributed layer to the others. */
#define GC_COMM_ID_BYTES 128

/* What device address p is, for a dump: "pool block 0x... + 64 of 512 B",
** "heap block ...", or "0x... (not engine memory)", into buf. */
const char *gc_describe_ptr(gcap_engine *e, const void *p, char *buf, size_t n);

/* What a launch being recorded is, for a dump: the op and where it runs
** ("linear in Sequential.0 (Linear)", "backward of gelu in Sequential.1
** (GELU)"; "" when unknown), and for each pointer argument the tensor it
** is ("[4, 16] f32"; "" for memory that is no tensor's). */
typedef struct gc_launch_info {
  char what[160];
  char arg[GC_KPTRS][40];
} gc_launch_info;
void gc_launch_describe(gcap_engine *e, const gc_kargs *a, gc_launch_info *out);

/*
** The backend table. `bs` is the backend's state from init. Streams, events,
** graphs and execs are the backend's own opaque pointers. Every function that
** can fail returns a status and sets the engine's message through gc_fail.
** The core has already checked capture rules before calling in; the backend
** only does the work (and reports what the device itself refuses).
*/
typedef struct gc_backend {
  const char *name;
  gcap_status (*init)(gcap_engine *e, void **bs);
  void (*shutdown)(void *bs);

  /* Raw device memory, 256-byte aligned at least. malloc must work while a
  ** capture is open (cuda: under the relaxed capture mode). */
  gcap_status (*malloc)(gcap_engine *e, void *bs, size_t n, void **p);
  void (*free)(void *bs, void *p);
  /* n zeroed bytes of host memory that kernels write through *dev and the
  ** host reads through *host without a copy (cuda: mapped pinned memory). */
  gcap_status (*mapped_alloc)(gcap_engine *e, void *bs, size_t n, void **host, void **dev);
  void (*mapped_free)(void *bs, void *host);

  gcap_status (*stream_new)(gcap_engine *e, void *bs, void **s);
  void (*stream_free)(void *bs, void *s);
  gcap_status (*stream_sync)(gcap_engine *e, void *bs, void *s);
  gcap_status (*device_sync)(gcap_engine *e, void *bs);

  gcap_status (*event_new)(gcap_engine *e, void *bs, void **ev);
  void (*event_free)(void *bs, void *ev);
  gcap_status (*event_record)(gcap_engine *e, void *bs, void *ev, void *s);
  gcap_status (*stream_wait)(gcap_engine *e, void *bs, void *s, void *ev);
  gcap_status (*event_sync)(gcap_engine *e, void *bs, void *ev);

  /* Synchronous host<->device copies of n bytes, ordered after work on s. */
  gcap_status (*upload)(gcap_engine *e, void *bs, void *s, void *dst, const void *src, size_t n);
  gcap_status (*download)(gcap_engine *e, void *bs, void *s, void *dst, const void *src, size_t n);

  /* Launch (or, on a capturing stream, record) kernel k. */
  gcap_status (*launch)(gcap_engine *e, void *bs, void *s, int k, const gc_kargs *a);

  /* Run (or, on a capturing stream, record) custom op c: the backend's
  ** callback gets its native stream s; a status other than GCAP_OK comes
  ** with the message set, GCAP_ECAPTURE when the device invalidated the
  ** capture meanwhile. */
  gcap_status (*custom)(gcap_engine *e, void *bs, void *s, const gc_custom *c);

  /* Capture: begin on s; end on s, giving the captured graph (NULL and an
  ** error when the device refused it). Streams forked in by waiting on an
  ** event recorded during the capture leave it at end. */
  gcap_status (*capture_begin)(gcap_engine *e, void *bs, void *s);
  gcap_status (*capture_end)(gcap_engine *e, void *bs, void *s, void **graph);
  /* Instantiate (and upload) a captured graph; nodes = its node count. */
  gcap_status (*instantiate)(gcap_engine *e, void *bs, void *graph, void **exec, int64_t *nodes);
  gcap_status (*graph_launch)(gcap_engine *e, void *bs, void *exec, void *s);
  /* Free a graph and/or its exec; either may be NULL. */
  void (*graph_free)(void *bs, void *graph, void *exec);
  /* Write a captured graph (and its exec, which the host's graph is) as
  ** Graphviz DOT titled `name` to the file `path`, which the core has found
  ** writable. */
  gcap_status (*debug_dump)(gcap_engine *e, void *bs, void *graph, const char *name,
                            const char *path);

  /* Communicators of the distributed layer. comm_id makes a unique id on
  ** one rank; comm_new joins rank `rank` of `nranks` to the communicator of
  ** that id (every rank of the group calls it, collectively); local_rank is
  ** the rank's number among those on its machine (cuda: it must run on GPU
  ** local_rank, and fails when there is none). A backend that needs none (host) gives
  ** NULL; comm_free accepts NULL. */
  gcap_status (*comm_id)(gcap_engine *e, void *bs, unsigned char id[GC_COMM_ID_BYTES]);
  gcap_status (*comm_new)(gcap_engine *e, void *bs, const unsigned char id[GC_COMM_ID_BYTES],
                          int nranks, int rank, int local_rank, void **comm);
  void (*comm_free)(void *bs, void *comm);
  /* Launch (or, on a capturing stream, record) collective c on s. */
  gcap_status (*collective)(gcap_engine *e, void *bs, void *s, const gc_coll *c);

  /* Whether the fused attention of *a (GC_K_ATTN's arguments, dt set, p[0]
  ** and p[4] not yet) may run on the backend's library attention, its
  ** launches carrying GC_ATTN_CUDNN; backward: whether the backward will
  ** follow. Where it says 1 it has built and cached what these arguments'
  ** launches need (while a capture is open, capturing != 0, it builds
  ** nothing: it says 1 only for what earlier calls built), so that those
  ** launches cannot be declined; 0 otherwise, with why (a sentence naming
  ** the library, or the case and what it takes) into why[n]. The same
  ** arguments get the same answer, save for a call under a capture before
  ** any outside it, and one whose workspace could not be allocated. */
  int (*attn_supported)(void *bs, const gc_kargs *a, int backward, int capturing, char *why,
                        size_t n);

  /* Whether the device has FP8 GEMMs (cuda: compute capability 8.9, or 9.0
  ** and later; the host emulates FP8): 1, or 0 with why (a sentence naming
  ** the device and its compute capability) into why[n]. */
  int (*fp8_supported)(void *bs, char *why, size_t n);
  /* Record ev on the capturing stream s as a node of the graph, which then
  ** records ev at each replay (an external event: CUDA's
  ** cudaEventRecordExternal). NULL where a replay runs at once on the host:
  ** there event_record serves, as the graph's work is done when the replay
  ** returns. */
  gcap_status (*event_record_external)(gcap_engine *e, void *bs, void *ev, void *s);
  /* Ranges of a profiler's timeline (cuda: NVTX, shown by Nsight Systems):
  ** ranges says once, at the engine's start, whether to open any (a tool
  ** listens); push opens a range named `name` in the calling thread, pop
  ** closes the innermost. NULL where the backend has none. */
  int (*ranges)(void *bs);
  void (*range_push)(void *bs, const char *name);
  void (*range_pop)(void *bs);
} gc_backend;

/* Host memory for the core and the backends: malloc, calloc and realloc,
** save that a test may make any one of them fail (gcap_test_fail_alloc). */
void *gc_malloc(size_t n);
void *gc_calloc(size_t n, size_t size);
void *gc_realloc(void *p, size_t n);
/* Room for need elements in the vector v of capacity cap (both lvalues, as
** in Lua's luaM_growvector): when need > cap, v grows through gc_realloc to
** min elements or to twice its capacity, as often as need asks, and cap
** follows. 1 when there is room; 0, with v and cap as they were, when the
** memory or an int count runs out: the caller reports that as its own. Two
** vectors of one capacity: grow the first with a copy of cap, then the
** second to that copy (need), with cap itself. */
#define gc_growvector(v, cap, need, min) gc_growaux(&(v), &(cap), (need), sizeof *(v), (min))
int gc_growaux(void *pv, int *cap, int need, size_t size, int min);
/* 1 when the allocation about to happen is the one a test asked to fail: a
** backend asks before it makes device memory or an object (stream, event,
** graph, exec) and then fails as if the device had run out of resources. */
int gc_fault(void);

/* The backends built in; gc_cuda_backend() is NULL in a CUDA=0 build. */
const gc_backend *gc_host_backend(void);
const gc_backend *gc_cuda_backend(void);
/* 1 when the cuda backend is built and a device is visible. */
int gc_cuda_probe(void);

#ifdef __cplusplus
}
#endif

#endif
