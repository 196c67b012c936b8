/*
** test_attn_impl.c: the attention modules' attn_impl option. A
** TransformerLayer with the fused attention gives the composed one's
** outputs and grads (within rounding) while keeping no attention weights
** for backward; bad choices are refused when the module is made, and
** cuDNN asked for where it cannot run when the call is made.
*/
#include "t.h"

#define S 128
#define B 2
#define HID 16
#define FFN 32
#define HEADS 2
#define NV 16384

/* Values of t appended to v[*n]. */
static int take(gcap_tensor *t, float *v, int *n) {
  int64_t k = t ? gcap_tensor_numel(t) : 0;
  if (t == NULL || *n + k > NV || !t_read(t, v + *n, (size_t)k)) return 0;
  *n += (int)k;
  return 1;
}

/* A TransformerLayer (no dropout) of attention `impl` from seed 5, one
** forward and backward of sum(y * r): y, x's grad and every parameter's
** grad into v[*n]; *kept: the bytes the forward left allocated. */
static void run(gcap_sdpa_impl impl, float *v, int *n, size_t *kept) {
  static const int64_t xs[3] = {S, B, HID};
  gcap_engine *e = t_engine();
  gcap_module *m = NULL;
  gcap_tensor *x = NULL, *r = NULL, *y = NULL, *yr = NULL, *loss = NULL;
  gcap_transformer_opts o;
  gcap_mem_stats before, after;
  int i, np;
  *n = 0;
  *kept = 0;
  if (e == NULL) return;
  gcap_transformer_opts_init(&o);
  o.attention_dropout = o.hidden_dropout = 0.0;
  o.attn_impl = impl;
  T_SETUP(gcap_manual_seed(e, 5) == GCAP_OK &&
              gcap_nn_transformer_layer(e, HID, FFN, HEADS, &o, &m) == GCAP_OK &&
              gcap_tensor_rand(e, GCAP_F32, 3, xs, 1, &x) == GCAP_OK &&
              gcap_tensor_set_requires_grad(x, 1) == GCAP_OK &&
              gcap_tensor_rand(e, GCAP_F32, 3, xs, 1, &r) == GCAP_OK,
          (gcap_tensor_free(x), gcap_tensor_free(r), gcap_module_free(m), gcap_engine_free(e)));
  T_CHECK_OK(e, gcap_engine_mem_stats(e, &before));
  T_CHECK_OK(e, gcap_module_call(m, 1, &x, &y));
  T_CHECK_OK(e, gcap_engine_mem_stats(e, &after));
  *kept = after.in_use_bytes - before.in_use_bytes;
  T_CHECK_OK(e, gcap_mul(y, r, &yr));
  T_CHECK_OK(e, gcap_sum(yr, &loss));
  T_CHECK_OK(e, gcap_backward(loss, NULL, 0));
  T_CHECK(take(y, v, n) && take(gcap_tensor_grad(x), v, n));
  for (np = gcap_module_num_parameters(m), i = 0; i < np; i++)
    T_CHECK(take(gcap_tensor_grad(gcap_module_parameter(m, i, NULL, 0)), v, n));
  gcap_tensor_free(loss);
  gcap_tensor_free(yr);
  gcap_tensor_free(y);
  gcap_tensor_free(r);
  gcap_tensor_free(x);
  gcap_module_free(m);
  gcap_engine_free(e);
}

/* Fused and composed agree; only the composition keeps the weights
** [B, HEADS, S, S] (f32) alive between forward and backward: it keeps at
** least half their bytes more (each also keeps small tensors of its own). */
static void test_transformer_layer_fused_vs_composed(void) {
  static float a[NV], f[NV];
  size_t ka, kf;
  int na, nf, i;
  run(GCAP_SDPA_COMPOSED, a, &na, &ka);
  run(GCAP_SDPA_FUSED, f, &nf, &kf);
  T_CHECK(na > S * B * HID && na == nf);
  for (i = 0; i < na && i < nf; i++)
    T_CHECK_NEAR(f[i], a[i], 1e-5, 1e-4);
  if (!(ka >= kf + (size_t)B * HEADS * S * S * sizeof(float) / 2))
    T_FAILF("composed keeps the weights", "composed kept %zu bytes, fused %zu", ka, kf);
}

/* An unknown attn_impl, and fused with head dims beyond its kernels, are
** refused naming the module and the option. */
static void test_attn_impl_errors(void) {
  gcap_engine *e = t_engine();
  gcap_module *m = NULL;
  gcap_transformer_opts o;
  if (e == NULL) return;
  T_CHECK_ST(e,
             gcap_nn_dot_product_attention(e, 2, 8, GCAP_ATTN_CAUSAL, 0.0, (gcap_sdpa_impl)9, &m),
             GCAP_EINVAL);
  T_CHECK(m == NULL && t_msg_has(e, "DotProductAttention: unknown attn_impl 9"));
  T_CHECK_ST(e,
             gcap_nn_dot_product_attention(e, 2, GCAP_SDPA_FUSED_DMAX + 1, GCAP_ATTN_CAUSAL, 0.0,
                                           GCAP_SDPA_FUSED, &m),
             GCAP_EINVAL);
  T_CHECK(
      t_msg_has(e, "DotProductAttention: attn_impl fused takes kv_channels up to 128, got 129"));
  gcap_transformer_opts_init(&o);
  o.attn_impl = (gcap_sdpa_impl)-1;
  T_CHECK_ST(e, gcap_nn_multihead_attention(e, HID, HEADS, &o, &m), GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "MultiheadAttention: unknown attn_impl -1"));
  o.attn_impl = GCAP_SDPA_FUSED;
  T_CHECK_ST(e, gcap_nn_transformer_layer(e, 512, 64, 2, &o, &m), GCAP_EINVAL);
  T_CHECK(m == NULL &&
          t_msg_has(e, "TransformerLayer: attn_impl fused takes kv_channels up to 128, got 256"));
  T_CHECK_OK(e, gcap_nn_transformer_layer(e, 512, 64, 4, &o, &m)); /* 128 channels: fine */
  gcap_module_free(m);
  gcap_engine_free(e);
}

/* impl cudnn where cuDNN cannot run is an error naming why, and makes
** nothing: every dtype on the host (it has no cuDNN), f32 everywhere; "auto"
** runs the same call composed. A module asks for cuDNN at its call. */
static void test_cudnn_where_it_cannot_run(void) {
  static const int64_t qs[4] = {2, 2, 16, 8},
                       xs[4] = {16, 2, 2, 8}; /* x: [seq, batch, heads, ch] */
  gcap_engine *e = t_engine();
  gcap_tensor *q[2] = {NULL, NULL}, *x = NULL, *y = NULL, *in[3];
  gcap_module *m = NULL;
  gcap_sdpa_opts o;
  int host, i;
  if (e == NULL) return;
  host = strcmp(gcap_engine_device(e), "host") == 0;
  T_SETUP(
      gcap_tensor_rand(e, GCAP_F32, 4, qs, 1, &q[0]) == GCAP_OK &&
          gcap_tensor_rand(e, GCAP_BF16, 4, qs, 1, &q[1]) == GCAP_OK &&
          gcap_tensor_rand(e, GCAP_F32, 4, xs, 1, &x) == GCAP_OK &&
          gcap_nn_dot_product_attention(e, 2, 8, GCAP_ATTN_CAUSAL, 0.0, GCAP_SDPA_CUDNN, &m) ==
              GCAP_OK,
      (gcap_tensor_free(q[0]), gcap_tensor_free(q[1]), gcap_tensor_free(x), gcap_engine_free(e)));
  memset(&o, 0, sizeof o);
  for (i = 0; i < (host ? 2 : 1); i++) { /* f32, and on the host bf16 */
    o.impl = GCAP_SDPA_CUDNN;
    T_CHECK_ST(e, gcap_scaled_dot_product_attention(q[i], q[i], q[i], &o, &y), GCAP_EUNSUPPORTED);
    T_CHECK(y == NULL);
    T_CHECK(t_msg_has(e, host ? "scaled_dot_product_attention: impl 'cudnn' cannot run this call: "
                                "the host backend has no cuDNN (it runs the composition, the "
                                "reference)"
                              : "scaled_dot_product_attention: impl 'cudnn' cannot run this call: "
                                "cuDNN's fused attention takes bf16 tensors, got f32"));
    o.impl = GCAP_SDPA_AUTO;
    T_CHECK_OK(e, gcap_scaled_dot_product_attention(q[i], q[i], q[i], &o, &y));
    gcap_tensor_free(y);
    y = NULL;
  }
  in[0] = in[1] = in[2] = x;
  T_CHECK_ST(e, gcap_module_call(m, 3, in, &y), GCAP_EUNSUPPORTED);
  T_CHECK(y == NULL && t_msg_has(e, "impl 'cudnn' cannot run this call"));
  { /* the refused call ran nothing: the module's stats say no call yet */
    gcap_attn_stats s;
    T_CHECK(gcap_module_attention_stats(NULL, &s) == GCAP_EINVAL &&
            gcap_module_attention_stats(m, NULL) == GCAP_EINVAL);
    T_CHECK(gcap_module_attention_stats(m, &s) == GCAP_OK && s.impl == NULL);
  }
  gcap_module_free(m);
  gcap_tensor_free(x);
  gcap_tensor_free(q[0]);
  gcap_tensor_free(q[1]);
  gcap_engine_free(e);
}

int main(void) {
  T_RUN(test_transformer_layer_fused_vs_composed);
  T_RUN(test_attn_impl_errors);
  T_RUN(test_cudnn_where_it_cannot_run);
  return t_done();
}
