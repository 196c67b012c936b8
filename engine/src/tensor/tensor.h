/*
** tensor.h: the tensor layer's structures (tensors, autograd nodes) and the
** ops' shared building blocks, for the files of tensor/ and the layer above
** (train/train.h includes it).
*/
#ifndef GC_TENSOR_H
#define GC_TENSOR_H

#include <stdint.h>
#include <string.h>

#include "runtime/runtime.h"

/* ------------------------------------------------------------------------ */
/* Tensors (tensor.c)                                                        */

typedef struct gc_node gc_node;

struct gcap_tensor {
  int refs;
  gcap_engine *e;
  gc_blk *blk;
  size_t off; /* bytes from blk->ptr to element 0 */
  gcap_dtype dt;
  int ndim;
  int64_t shape[GCAP_MAXDIM];
  int64_t numel;
  int requires_grad;
  gcap_tensor *grad; /* leaves: accumulated gradient, or NULL */
  gc_node *grad_fn;  /* non-leaves: the node that made it */
  int view; /* made by gcap_tensor_view (or an identity dropout): shares another's storage */
};

/* Change t's dtype in place: new storage holding the converted values (the
** same tensor object, so modules and optimizers keep it). */
gcap_status gc_tensor_convert(gcap_tensor *t, gcap_dtype dt);
/* A new tensor struct over t's storage with another shape: no grad, no grad_fn. */
gcap_tensor *gc_tensor_alias(gcap_tensor *t, int ndim, const int64_t *shape);
/* The same over t's elements first .. first + numel(shape) - 1 (they must
** be t's). */
gcap_tensor *gc_tensor_slice(gcap_tensor *t, int64_t first, int ndim, const int64_t *shape);
/* Drop a reference to node n; the last frees it, what it holds (saved
** tensors, leaves, its ud) and the nodes only it held, iteratively. */
void gc_node_release(gc_node *n);
/* Free n's saved tensors (after its backward, without retain_graph); how
** many there were. */
int gc_node_free_saved(gc_node *n);

/* Bytes per element (inline: every launch notes its operands' byte ranges). */
static inline size_t gc_dtype_size(gcap_dtype dt) {
  return dt == GCAP_BF16 ? 2 : 4;
}
const char *gc_dtype_name(gcap_dtype dt);
/* Validate a shape; on success *numel is its element count. */
gcap_status gc_check_shape(gcap_engine *e, const char *op, int ndim, const int64_t *shape,
                           int64_t *numel);
/* The start of public call `op` on tensor t, its argument `name`: t's
** engine's message cleared. t NULL is GCAP_EINVAL told to the engine of
** `alt`, another tensor argument of the call (NULL: there is no engine to
** tell). gc_op_start_out is the start of a call handing a tensor back
** through out: *out = NULL first, and a NULL out is refused naming it. */
gcap_status gc_op_start(const char *op, gcap_tensor *t, const char *name, const gcap_tensor *alt);
gcap_status gc_op_start_out(const char *op, gcap_tensor *t, const char *name,
                            const gcap_tensor *alt, gcap_tensor **out);
/* Tensor argument `name` of call op on engine e: NULL or of another engine
** is GCAP_EINVAL naming it. */
gcap_status gc_operand(gcap_engine *e, const char *op, const char *name, const gcap_tensor *t);
/* A new tensor on the current stream, uninitialised. */
gcap_status gc_tensor_alloc(gcap_engine *e, const char *op, gcap_dtype dt, int ndim,
                            const int64_t *shape, gcap_tensor **out);
static inline void *gc_tensor_ptr(const gcap_tensor *t) {
  return t->blk->ptr + t->off;
}
/* Give t's block back to its pool but keep t's address valid for graphs
** already captured (a weak reference, for reused graph buffers). */
gcap_status gc_tensor_weaken(gcap_tensor *t);
/* "[2, 3]" into buf: of t, or of a shape of ndim dims. */
const char *gc_shape_str(const gcap_tensor *t, char *buf, size_t n);
const char *gc_dims_str(int ndim, const int64_t *shape, char *buf, size_t n);
/* Dim `dim` of an ndim-D tensor, counted from the end when negative, into
** *out; out of range: GCAP_EINVAL naming op (shape.c). */
gcap_status gc_dim(gcap_engine *e, const char *op, int dim, int ndim, int *out);
/* The end of a call that made *out: when st is an error, *out is freed and
** set to NULL, so that a failed call leaves nothing behind. Returns st. */
gcap_status gc_keep_or_free(gcap_tensor **out, gcap_status st);
/* Do a and b have the same shape and dtype? */
static inline int gc_same_layout(const gcap_tensor *a, const gcap_tensor *b) {
  int d;
  if (a->ndim != b->ndim || a->dt != b->dt) return 0;
  for (d = 0; d < a->ndim; d++)
    if (a->shape[d] != b->shape[d]) return 0;
  return 1;
}

/* ------------------------------------------------------------------------ */
/* The launch path (launch.c)                                                */

/* While a capture is open, t's shape for the label of the launch about to
** be recorded (runtime/label.c). */
void gc_note_arg(gcap_engine *e, const gcap_tensor *t, int write);
/* Note that the launch about to happen reads (write = 0) or writes t's
** elements (gc_note_range on t's bytes); inline: every launch notes its
** operands. */
static inline gcap_status gc_note_access(gcap_engine *e, const gcap_tensor *t, int write) {
  uintptr_t lo = (uintptr_t)gc_tensor_ptr(t);
  if (e->cap != NULL) gc_note_arg(e, t, write);
  return gc_note_range(e, t->blk, lo, lo + (uintptr_t)t->numel * gc_dtype_size(t->dt), write);
}
/* Launch kernel k on the current stream: capture checks, then the backend. */
gcap_status gc_launch(gcap_engine *e, int k, const gc_kargs *a);
/* The generator in use advances by n draws (after the kernel that drew them
** from e->rng): noted as a write of its state, so that a graph capturing it
** holds the state's memory and advances it at each replay. */
gcap_status gc_rng_advance(gcap_engine *e, int64_t n);
/* Note the reads of in[] and the write of out (may be NULL), set a->dt from
** out (or in[0]), then gc_launch. */
gcap_status gc_run(gcap_engine *e, int k, gc_kargs *a, gcap_tensor *const *in, int nin,
                   gcap_tensor *out);
/* dst[j] += src[j] (add[j]) or dst[j] = src[j], j < n <= GC_FOREACH_MAX, in one
** launch: same dtype and size per pair, no memory shared between pairs. */
gcap_status gc_foreach_add(gcap_engine *e, int n, gcap_tensor *const *dst, gcap_tensor *const *src,
                           const int *add);

/* ------------------------------------------------------------------------ */
/* Autograd's records (record.c)                                             */

#define GC_NODE_MAXSAVED 6

/* An input's shape as its node recorded it: what a backward needs to know of
** an input whose values it does not read (PyTorch's input metadata). */
typedef struct gc_meta {
  int ndim;
  int64_t shape[GCAP_MAXDIM];
  int64_t numel; /* 0 (and ndim 0) for an absent (NULL) input */
  gcap_dtype dt;
} gc_meta;

static inline void gc_meta_of(const gcap_tensor *t, gc_meta *m) {
  m->ndim = t->ndim;
  memcpy(m->shape, t->shape, sizeof t->shape);
  m->numel = t->numel;
  m->dt = t->dt;
}

/* Computes the grads of a node's inputs from the grad of its output; sets
** gin[i] (a new reference) only for inputs that need one (gc_node_needs). */
typedef gcap_status (*gc_backward_fn)(gc_node *n, gcap_tensor *g, gcap_tensor **gin);

struct gc_node {
  int refs;
  const char *name;
  gc_backward_fn backward;
  int nin;
  gc_node **next;     /* [nin]: producer of input i, or NULL */
  gcap_tensor **leaf; /* [nin]: input i when it is a leaf that requires grad */
  gc_meta *meta;      /* [nin]: input i's shape */
  gcap_tensor *saved[GC_NODE_MAXSAVED];
  uint64_t saved_version[GC_NODE_MAXSAVED]; /* their storage's version when saved */
  int nsaved;
  int released;    /* saved tensors freed by a backward without retain_graph */
  int holds_state; /* released so even with no tensor saved (a graphed call's buffers) */
  int ndim;        /* the output's shape and dtype, to check incoming grads */
  int64_t shape[GCAP_MAXDIM];
  gcap_dtype dt;
  float f[4]; /* op constants */
  int64_t k[4];
  int is_view; /* a view's node (view, select): its output shares its input's storage */
  void *ud;    /* op state (e.g. a view's shape; a linear node's wgrad sink) */
  void (*ud_free)(void *ud);
  gc_node *free_next; /* release worklist */
  uint64_t mark;      /* scheduling scratch */
  int deps;
  gcap_tensor *acc;
  char *where; /* recorded in a capture: where it was, "path (Type)" (the host's dumps) */
};

/* Should the op producing a tensor from these inputs record a node? */
int gc_grad_needed(gcap_engine *e, gcap_tensor *const *in, int nin);
/* Record node `name` as out's grad_fn, its inputs in[] (their shapes in its
** meta[]), saving save[] (as aliases, so saved outputs make no cycle; a NULL
** entry saves nothing). An op saves only the tensors its backward reads, as
** PyTorch's derivative formulas do (docs/semantics.md): a write into any
** other before backward is no error. */
gcap_status gc_record(gcap_tensor *out, const char *name, gc_backward_fn bw, gcap_tensor *const *in,
                      int nin, gcap_tensor *const *save, int nsave, gc_node **node);
static inline int gc_node_needs(const gc_node *n, int i) {
  return n->next[i] != NULL || n->leaf[i] != NULL;
}
/* Record `view` as a view of src (grads flow back reshaped). */
gcap_status gc_view_record(gcap_tensor *src, gcap_tensor *view);
/* Refuse in-place writes to a leaf that requires grad while recording. */
gcap_status gc_check_inplace(gcap_tensor *t, const char *op);

/* ------------------------------------------------------------------------ */
/* Custom ops (custom_op.c)                                                  */

/* Launch op on the current stream reading in[nin] and writing out[nout]
** (existing tensors: new outputs, or tensors written in place): the capture
** rules, the notes of its accesses, the op kept by the open capture's
** graph; a failure invalidates the open capture. */
gcap_status gc_custom_launch(gcap_custom_op *op, int nin, gcap_tensor *const *in, int nout,
                             gcap_tensor *const *out);

/* ------------------------------------------------------------------------ */
/* Runtime-compiled kernels' parameters (nvrtc_args.c)                       */

#define GC_KMAXPARAMS 64 /* parameters of one kernel */

/* A parameter's value as the kernel reads it */
typedef union gc_kval {
  void *p;
  int32_t i32;
  uint32_t u32;
  int64_t i64;
  uint64_t u64;
  float f32;
  double f64;
  unsigned char b;
} gc_kval;

/* Bytes of a parameter of type p. */
size_t gc_kparam_size(gcap_kparam p);
/* Read the parameter types of __global__ function `name` in src into
** out[GC_KMAXPARAMS], their count into *n; a failure names the kernel and
** the parameter, and asks for the types. */
gcap_status gc_kparam_parse(gcap_engine *e, const char *src, const char *name, int *n,
                            gcap_kparam *out);
/* Check argument #i (from 0) `a` of kernel kname against parameter type p:
** the bytes the kernel reads into *v, the value it sees into *out. */
gcap_status gc_karg_convert(gcap_engine *e, const char *kname, int i, gcap_kparam p,
                            const gcap_karg *a, gc_kval *v, gcap_karg *out);

/* ------------------------------------------------------------------------ */
/* The ops' building blocks (ops.c)                                          */

/* Non-recording building blocks shared by forward and backward code. */
/* dst = src converted to dst's dtype (same numel; not recorded, not checked). */
gcap_status gc_copy(gcap_tensor *dst, gcap_tensor *src);
/* out = x OP y (kernel k; a 0-D or one-element operand, or a row, broadcasts), not recorded. */
gcap_status gc_binary(gcap_tensor *x, gcap_tensor *y, int k, const char *op, gcap_tensor **out);
/* The same with a result of dtype dt, the launch also carrying x's dtype
** (n[3]) and arg (n[4]): a comparison's operands and code. */
gcap_status gc_binary_as(gcap_tensor *x, gcap_tensor *y, int k, const char *op, gcap_dtype dt,
                         int64_t arg, gcap_tensor **out);
/* The grad g of a broadcast result, reduced to the shape t of an operand: g
** itself, its sum, or the sums of its rows. */
gcap_status gc_reduce_to(gcap_tensor *g, const gc_meta *t, gcap_tensor **out);
gcap_status gc_binary_inplace(gcap_tensor *dst, gcap_tensor *y, int k, const char *op);
gcap_status gc_unary(gcap_tensor *x, int k, float f, const char *op, int scalar_out,
                     gcap_tensor **out);
gcap_status gc_expand(gcap_tensor *x, int ndim, const int64_t *shape, float f, gcap_tensor **out);
gcap_status gc_sum_rows(gcap_tensor *x, int64_t cols, gcap_tensor **out);
/* Scratch of n floats (none when n <= 0) for a reduction that a backend may
** run in chunks (GC_SUM_CHUNKS, GC_SUM_ROWS_CHUNKS): from the current pool,
** noted as written; *p gets its address or NULL. The caller frees *t right
** after its launch, as later work on the stream runs after it. */
gcap_status gc_scratch(gcap_engine *e, const char *op, int64_t n, gcap_tensor **t, void **p);

/* ------------------------------------------------------------------------ */
/* Linear algebra (linalg.c)                                                 */

/* op(a) op(b) (ta, tb: transposed), the batch dims broadcast, recorded as
** "matmul" (gcap_matmul is ta = tb = 0). */
gcap_status gc_matmul(gcap_tensor *a, int ta, gcap_tensor *b, int tb, gcap_tensor **out);
/* linear. A linear node whose ud is a wgrad sink leaves the parameter grads
** to its Linear's backward_dw (delayed wgrad), or adds the weight grad into
** its main_grad (fused wgrad). */
gcap_status gc_linear(gcap_tensor *x, gcap_tensor *w, gcap_tensor *b, gcap_tensor **out);
/* gelu(linear(x, w, b)) in one GEMM (a Linear followed by a GELU): the same
** values as the two ops, one node, the pre-activation saved for backward. */
gcap_status gc_linear_gelu(gcap_tensor *x, gcap_tensor *w, gcap_tensor *b, gcap_tensor **out);
/* The GEMMs of a linear, not recorded: *out = x W^T + b with x [..., in]
** (pre NULL), or its gelu with the pre-activation into pre (x's shape with
** out as the last dim); *dx (ndim, xshape) = g W, g [..., out]. */
gcap_status gc_linear_gemm(gcap_tensor *x, gcap_tensor *w, gcap_tensor *b, gcap_tensor *pre,
                           gcap_tensor **out);
gcap_status gc_linear_dgrad(gcap_tensor *g, gcap_tensor *w, int ndim, const int64_t *xshape,
                            gcap_tensor **dx);
/* The parameter grads of a linear of weight [out, in] from its output grad g
** and input x, for the ones asked for (gw, gb; NULL: not wanted, as gb for
** a linear without bias): the weight's added into main_grad when there is
** one (a fused-wgrad Linear; *gw stays NULL), else in *gw; the bias's in
** *gb, db itself when the gelu's backward already summed it. Both from one
** GEMM when both are computed. */
gcap_status gc_linear_param_grads(gcap_tensor *g, gcap_tensor *x, int64_t out, int64_t in,
                                  gcap_tensor *main_grad, gcap_tensor *db, gcap_tensor **gw,
                                  gcap_tensor **gb);

/* ------------------------------------------------------------------------ */
/* FP8 (fp8.c)                                                               */

/* An FP8 copy of n elements: the bytes (in an f32 tensor of ceil(n / 4)
** elements, never read as floats) and the inverse of the scale they were
** made with (one f32), which dequantizing multiplies by. */
typedef struct gc_fp8 {
  gcap_tensor *data, *scale_inv;
  int64_t n;
  gcap_fp8_format format;
} gc_fp8;

gcap_status gc_fp8_alloc(gcap_engine *e, const char *op, int64_t n, gcap_fp8_format format,
                         gc_fp8 *q);
/* Drop q's tensors (NULL ones too); q is empty afterwards. */
void gc_fp8_free(gc_fp8 *q);
/* A 1-D f32 tensor over elements k .. k + n - 1 of t's storage (NULL: out
** of host memory). */
gcap_tensor *gc_elems(gcap_tensor *t, int64_t k, int64_t n);
/* t's bytes for the transpose of q's as [rows x cols] ([cols x
** GC_FP8_LD(rows)]), allocated unless t holds them already; t shares q's
** scale_inv. */
gcap_status gc_fp8_transposed(gcap_engine *e, const gc_fp8 *q, int64_t rows, int64_t cols,
                              gc_fp8 *t);
/* q = cast(x * scale) (GC_K_FP8_QUANTIZE), q->n = numel of x: scale one
** element, an amax (current != 0) from which the kernel takes the scale;
** amax (NULL: none) becomes max(amax, amax of x); skip (NULL: none) set
** nonzero makes the launch do nothing. t (NULL: none) receives, from the
** same launch, q's bytes seen as [numel / cols x cols] transposed into
** [cols x GC_FP8_LD(numel / cols)], each row zero-padded (allocated unless
** t->data is set: a cached copy), sharing q's scale_inv. *dbias (dbias
** NULL: not wanted) becomes a new [cols] tensor of x's dtype, x's columns
** summed (a grad's bias grad), from the same launch. */
gcap_status gc_fp8_quantize(gcap_tensor *x, gc_fp8 *q, gcap_tensor *scale, int current,
                            gcap_tensor *amax, gcap_tensor *skip, gc_fp8 *t, int64_t cols,
                            gcap_tensor **dbias);
/* *out (dt, shape) = q's values times its scale_inv. */
gcap_status gc_fp8_dequantize(const gc_fp8 *q, gcap_dtype dt, int ndim, const int64_t *shape,
                              gcap_tensor **out);
/* amax (one f32) = max(amax, the largest |x|). */
gcap_status gc_fp8_amax(gcap_tensor *x, gcap_tensor *amax);
/* The row length, in bytes, of an FP8 GEMM operand whose rows hold k
** values: k rounded up to 16 (the zeros after k pad it), as cuBLASLt's FP8
** GEMMs take their operands. */
#define GC_FP8_LD(k) (((k) + 15) / 16 * 16)
/* *out = q's bytes, seen as [rows x cols], with their rows padded as an FP8
** GEMM operand's ([rows x GC_FP8_LD(cols)], GC_K_FP8_PAD); out shares q's
** scale_inv. (Transposed operands come from gc_fp8_quantize.) */
gcap_status gc_fp8_pad(const gc_fp8 *q, int64_t rows, int64_t cols, gc_fp8 *out);
/* C [m x n] = A B^T (+ beta C, + bias; the gelu with its pre-activation
** into pre) of the FP8 operands A [m x k] and B [n x k], rows ld bytes
** apart (GC_K_FP8_GEMM); C allocated as dt (ndim, shape) when *c is NULL;
** fast: the backend may accumulate with less precision (the forward's). */
gcap_status gc_fp8_gemm(const gc_fp8 *A, const gc_fp8 *B, int64_t m, int64_t n, int64_t k,
                        int64_t ld, float beta, gcap_tensor *bias, gcap_tensor *pre, int fast,
                        gcap_dtype dt, int ndim, const int64_t *shape, gcap_tensor **c);
/* Delayed scaling's update (GC_K_FP8_UPDATE) of roles r0 .. r0 + count - 1
** of state (roles roles, histories of len), scaled_max[count] each role's
** fp8_max / 2^margin. */
gcap_status gc_fp8_update(gcap_tensor *state, int roles, int len, int r0, int count,
                          int most_recent, const float *scaled_max);

/* A module's FP8 state (TransformerEngine's fp8_meta): per FP8 GEMM of the
** module (at most GC_FP8_MAX_GEMMS), three roles (input, weight,
** grad_output: role 3 g + k), their amaxes, scales and histories of len
** amaxes in one f32 tensor laid out as GC_K_FP8_UPDATE reads it, made
** outside any capture so that graphs may read and write it at every
** replay; and per GEMM the FP8 copy of the weight cached for later
** microbatches (weight caching) and its transpose (the dgrad's operand),
** made on first need. Counted references:
** the module holds one, and each FP8 node of its GEMMs one. */
#define GC_FP8_MAX_GEMMS 2
typedef struct gc_fp8_meta {
  int refs;
  int gemms, len;
  gcap_tensor *state;
  gc_fp8 wcache[GC_FP8_MAX_GEMMS], wcache_t[GC_FP8_MAX_GEMMS];
} gc_fp8_meta;

/* A new state of `gemms` GEMMs with histories of len (scales 1, the rest
** 0), uploaded on the current stream; who names the module in errors. */
gcap_status gc_fp8_meta_new(gcap_engine *e, const char *who, int gemms, int len, gc_fp8_meta **out);
gc_fp8_meta *gc_fp8_meta_retain(gc_fp8_meta *m);
void gc_fp8_meta_release(gc_fp8_meta *m);

/* ------------------------------------------------------------------------ */
/* Attention (attention.c)                                                   */

/* gcap_scaled_dot_product_attention, noting in *ran the implementation that
** ran it and why cuDNN did not (impl NULL when the call failed). */
gcap_status gc_sdpa(gcap_tensor *q, gcap_tensor *k, gcap_tensor *v, const gcap_sdpa_opts *opts,
                    gcap_attn_stats *ran, gcap_tensor **out);
/* Self-attention over the packed projection qkv [S, B, H, 3D] (each head's
** q, k and v side by side) into *out [S, B, H * D], as the sdpa of q, k and v
** split and permuted to [B, H, S, D] (o's is_causal, scale and impl), with
** the backend's library reading them in place and writing their grads into
** one tensor (GC_ATTN_PACKED): no copies. Where the library declines (or o
** asks for a mask, dropout or an impl other than auto and cudnn), *out is
** NULL, why[n] says why and the status is GCAP_OK: the caller splits. */
gcap_status gc_sdpa_packed(gcap_tensor *qkv, const gcap_sdpa_opts *o, char *why, size_t n,
                           gcap_tensor **out);

/* ------------------------------------------------------------------------ */
/* Masks (mask.c)                                                            */

/* The GC_MASK_* broadcast and dtype flags of `mask` read over a tensor of
** shape [ndim] as 4-D; a mask that does not broadcast to it
** is an error naming op and what (the mask's role, "mask"). */
gcap_status gc_mask_flags(gcap_engine *e, int ndim, const int64_t *shape, gcap_tensor *mask,
                          const char *op, const char *what, int64_t *flags);

/* ------------------------------------------------------------------------ */
/* Layers (layers.c)                                                         */

/* Outside capture, every value of ids must be an integer in 0..count-1: read
** back and checked on the host (a capture cannot read back; there the
** kernels make such an entry NaN); else an error "op: what N (counting from
** 1) is V, not want (an integer in 0..count-1)". */
gcap_status gc_check_ids(gcap_tensor *ids, int64_t count, const char *op, const char *what,
                         const char *want);
/* dx = g gelu'(x) (not recorded); colsum (may be NULL) receives dx's column
** sums over its rows of `cols` elements, in the same launch. */
gcap_status gc_gelu_backward(gcap_tensor *g, gcap_tensor *x, int64_t cols, gcap_tensor **dx,
                             gcap_tensor **colsum);

/* ------------------------------------------------------------------------ */
/* Wgrad sinks (wgrad.c)                                                     */

/* A Linear's wgrad sink: where the backward of a linear node sends the
** parameter grads instead of .grad. The Linear module (train/builtin.c) owns
** it, attaches it to the nodes it records (their ud) and drains its queue in
** backward_dw; the op fills it: the weight grad added into main_grad (fused
** wgrad), or the wgrad's operands queued (delayed wgrad). Counted
** references: a node keeps its sink after the module is gone. */
typedef struct gc_wgrad_item {
  gcap_tensor *g, *x; /* the grad and the input (NULL: the weight is frozen); NULL under FP8 */
  gcap_tensor *gb;    /* the bias grad when already computed, or NULL */
  int fp8;            /* an FP8 linear's: gt and xt instead of g and x */
  gc_fp8 gt, xt;      /* FP8: the quantized grad and input, transposed (empty: frozen weight) */
  int64_t rows;       /* FP8: the rows the wgrad GEMM sums over */
  gcap_dtype dt;      /* FP8: the weight grad's dtype */
  int w_done;         /* the weight grad is applied (a backward_dw failed after it) */
} gc_wgrad_item;

typedef struct gc_wgrad_queue {
  gc_wgrad_item *v; /* oldest first */
  int n, cap;
} gc_wgrad_queue;

typedef struct gc_wgrad_sink {
  int refs;
  int delay;              /* queue the grads for backward_dw */
  gcap_tensor *main_grad; /* fused: the weight grad accumulates here (a reference), or NULL */
  gc_wgrad_queue q;       /* delayed: the grads still to compute */
} gc_wgrad_sink;

/* A sink with one reference, delaying wgrad or not, fusing into main_grad
** (NULL: not fused). */
gcap_status gc_wgrad_sink_new(gcap_engine *e, int delay, gcap_tensor *main_grad,
                              gc_wgrad_sink **out);
gc_wgrad_sink *gc_wgrad_sink_retain(gc_wgrad_sink *s);
/* Drop a reference (NULL: nothing); the last frees the queue and main_grad's reference. */
void gc_wgrad_sink_release(gc_wgrad_sink *s);
/* Free the items of q and its array; q is empty afterwards. */
void gc_wgrad_queue_free(gc_wgrad_queue *q);
/* Drop item 0 of q (its references), the others moving up. */
void gc_wgrad_queue_pop(gc_wgrad_queue *q);
/* Queue (g, x) for a later backward_dw of s's Linear, with its bias grad
** when already computed (gb; NULL: backward_dw does it). */
gcap_status gc_wgrad_defer(gc_wgrad_sink *s, gcap_tensor *g, gcap_tensor *x, gcap_tensor *gb);
/* The same for an FP8 linear of e: its wgrad GEMM's operands, the quantized
** grad and input transposed (gt, xt: [out x ld], [in x ld], summing rows;
** both empty when the weight is frozen), the grad's dtype dt. The queue
** takes gt's and xt's references (they are empty afterwards), also on
** failure. */
gcap_status gc_wgrad_defer_fp8(gc_wgrad_sink *s, gcap_engine *e, gc_fp8 *gt, gc_fp8 *xt,
                               int64_t rows, gcap_dtype dt, gcap_tensor *gb);
/* Make s linear node n's sink: n's ud, with a reference that n's release drops. */
void gc_wgrad_sink_attach(gc_node *n, gc_wgrad_sink *s);

/* ------------------------------------------------------------------------ */
/* Backward and the grads of leaves (autograd.c)                             */

/* Backpropagate from n tensors at once (each requires grad), grad[i] the
** grad of t[i], each node running once with the sum of what reached it. */
gcap_status gc_backward_many(int n, gcap_tensor *const *t, gcap_tensor *const *grad, int retain);
/* PyTorch's error, from `where`, for a tensor a backward needs that was
** written since it was kept: t, named "the <shape> <dtype> <what>", now at
** version `now`, kept at `want`. */
gcap_status gc_fail_written(const gcap_tensor *t, const char *where, const char *what, uint64_t now,
                            uint64_t want);
/* Note a step the running backward took beyond its grads (see gc_undo):
** taken back with fn(ud, 1) if that backward (or one it runs inside) fails,
** kept with fn(ud, 0) when the outermost one succeeds; outside a backward,
** kept at once. Out of memory: ENOMEM and nothing noted (fn not called). */
gcap_status gc_backward_undo(gcap_engine *e, void (*fn)(void *ud, int undo), void *ud);
/* Called from the backward of a consumer of n during a backward pass: has
** no grad reached n yet in this pass? */
int gc_node_first_delivery(const gc_node *n);
/* Clear (set_to_none) or zero t's .grad. */
gcap_status gc_zero_grad(gcap_tensor *t, int set_to_none);
/* leaf.grad += g. On first use .grad is a copy of g, or g itself when
** `steal` and nothing else can see g (the caller holds the only reference). */
gcap_status gc_acc_grad(gcap_tensor *leaf, gcap_tensor *g, int steal);

/* A run of .grad accumulations (gc_acc_grad) that go out as one foreach_add
** launch: those that add into a .grad, or copy into a new one when stealing
** was never possible. The run ends (is launched) when it is full, when the
** next accumulation is of another kind or touches memory the run writes or
** reads, and at gc_acc_end, which the owner must call before any other work;
** so the launches happen in the order gc_acc_grad would make them. */
typedef struct gc_acc_run {
  gcap_tensor *leaf[GC_FOREACH_MAX], *dst[GC_FOREACH_MAX], *src[GC_FOREACH_MAX];
  int add[GC_FOREACH_MAX];
  int n;
} gc_acc_run;

/* gc_acc_grad(leaf, g, steal), joining run r where it may. */
gcap_status gc_acc_grad_run(gc_acc_run *r, gcap_tensor *leaf, gcap_tensor *g, int steal);
/* Launch what r holds; r is empty afterwards, also on failure (then the
** .grad tensors its copies would have made are gone again). */
gcap_status gc_acc_end(gc_acc_run *r);

#endif
