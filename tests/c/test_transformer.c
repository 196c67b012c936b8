/*
** test_transformer.c: the transformer modules from C (gcap_nn_*): each kind
** trained a few steps eagerly and graphed (gcap_make_graphed_callables, the
** module replayed through gcap_module_call) gives the same outputs and
** parameter grads bit for bit, f32 and bf16; their options, parameter names
** and errors.
*/
#include "t.h"

#define S 4
#define B 2
#define HID 16
#define FFN 32
#define HEADS 2
#define STEPS 3
#define MAXVALS 8192

typedef gcap_status (*maker)(gcap_engine *e, gcap_module **m);

static gcap_status mk_lnl(gcap_engine *e, gcap_module **m) {
  return gcap_nn_layer_norm_linear(e, HID, HID, 1e-5, 1, 0, m);
}
static gcap_status mk_mlp(gcap_engine *e, gcap_module **m) {
  return gcap_nn_layer_norm_mlp(e, HID, FFN, 1e-5, 1, 0, m);
}
static gcap_status mk_mlp_ckpt(gcap_engine *e, gcap_module **m) {
  return gcap_nn_layer_norm_mlp(e, HID, FFN, 1e-5, 1, 1, m);
}

static gcap_status mk_mha(gcap_engine *e, gcap_module **m) {
  gcap_transformer_opts o;
  gcap_transformer_opts_init(&o);
  o.attention_dropout = 0.0;
  return gcap_nn_multihead_attention(e, HID, HEADS, &o, m);
}
static gcap_status mk_tl(gcap_engine *e, gcap_module **m) {
  return gcap_nn_transformer_layer(e, HID, FFN, HEADS, NULL, m); /* TE's dropouts, 0.1 */
}

/* Values read back, appended to v[*n] (at most MAXVALS). */
static gcap_status take(gcap_tensor *t, float *v, int *n) {
  int64_t k = gcap_tensor_numel(t);
  gcap_status st;
  if (*n + k > MAXVALS) return GCAP_EINVAL;
  if ((st = gcap_tensor_read(t, v + *n, (size_t)k)) == GCAP_OK) *n += (int)k;
  return st;
}

/* One step: y = m(x) for a random x, backward of sum(y * r); y into v. */
static gcap_status step(gcap_engine *e, gcap_module *m, gcap_dtype dt, float *v, int *n) {
  static const int64_t shape[3] = {S, B, HID};
  gcap_tensor *x = NULL, *r = NULL, *y = NULL, *yr = NULL, *loss = NULL;
  gcap_status st;
  if ((st = gcap_tensor_rand(e, dt, 3, shape, 1, &x)) == GCAP_OK &&
      (st = gcap_tensor_set_requires_grad(x, 1)) == GCAP_OK &&
      (st = gcap_tensor_rand(e, dt, 3, shape, 1, &r)) == GCAP_OK &&
      (st = gcap_module_call(m, 1, &x, &y)) == GCAP_OK && (st = gcap_mul(y, r, &yr)) == GCAP_OK &&
      (st = gcap_sum(yr, &loss)) == GCAP_OK && (st = gcap_backward(loss, NULL, 0)) == GCAP_OK &&
      (st = take(y, v, n)) == GCAP_OK)
    st = take(gcap_tensor_grad(x), v, n);
  gcap_tensor_free(x);
  gcap_tensor_free(r);
  gcap_tensor_free(y);
  gcap_tensor_free(yr);
  gcap_tensor_free(loss);
  return st;
}

/* Train a module of `mk` in dtype dt, graphed or not, from seed 5: every
** output, input grad and (last) parameter grad into v[*n]. */
static void train(maker mk, gcap_dtype dt, int graphed, float *v, int *n) {
  gcap_engine *e = t_engine();
  gcap_module *m = NULL;
  gcap_graphed *G = NULL;
  gcap_tensor *sample = NULL;
  int i, np;
  *n = 0;
  if (e == NULL) return;
  T_SETUP(gcap_manual_seed(e, 5) == GCAP_OK && mk(e, &m) == GCAP_OK &&
              gcap_module_to(m, dt) == GCAP_OK,
          (gcap_module_free(m), gcap_engine_free(e)));
  if (graphed) {
    static const int64_t shape[3] = {S, B, HID};
    const int nargs = 1;
    gcap_tensor *const *args;
    gcap_graphed_opts o;
    gcap_graphed_opts_init(&o);
    o.num_warmup_iters = 10;
    T_SETUP(gcap_tensor_full(e, dt, 3, shape, 1.0, &sample) == GCAP_OK &&
                gcap_tensor_set_requires_grad(sample, 1) == GCAP_OK,
            (gcap_tensor_free(sample), gcap_module_free(m), gcap_engine_free(e)));
    args = &sample;
    T_CHECK_ST(e, gcap_make_graphed_callables(e, 1, &m, 1, &nargs, &args, &o, &G), GCAP_OK);
  }
  for (i = 0; i < STEPS; i++)
    T_CHECK_ST(e, step(e, m, dt, v, n), GCAP_OK);
  for (np = gcap_module_num_parameters(m), i = 0; i < np; i++) {
    gcap_tensor *g = gcap_tensor_grad(gcap_module_parameter(m, i, NULL, 0));
    T_CHECK(g != NULL);
    if (g != NULL) T_CHECK_ST(e, take(g, v, n), GCAP_OK);
  }
  if (G != NULL) {
    gcap_graphed_stats s;
    T_CHECK_ST(e, gcap_graphed_get_stats(G, 0, &s), GCAP_OK);
    T_CHECK(s.fwd.replays == STEPS && s.has_bwd && s.bwd.replays == STEPS);
  }
  gcap_graphed_free(G);
  gcap_tensor_free(sample);
  gcap_module_free(m);
  gcap_engine_free(e);
}

static void check_kind(const char *name, maker mk) {
  static float a[MAXVALS], b[MAXVALS];
  int dt, na, nb, i;
  for (dt = 0; dt < 2; dt++) {
    train(mk, (gcap_dtype)dt, 0, a, &na);
    train(mk, (gcap_dtype)dt, 1, b, &nb);
    T_CHECK(na > 0 && na == nb);
    for (i = 0; i < na && i < nb; i++)
      if (!(a[i] == b[i])) {
        T_FAILF("eager == graphed", "%s %s: value %d: eager %.9g, graphed %.9g", name,
                dt ? "bf16" : "f32", i, (double)a[i], (double)b[i]);
        break;
      }
  }
}

static void test_layer_norm_linear_graphed_bitwise(void) {
  check_kind("LayerNormLinear", mk_lnl);
}
static void test_layer_norm_mlp_graphed_bitwise(void) {
  check_kind("LayerNormMLP", mk_mlp);
}
static void test_layer_norm_mlp_checkpoint_graphed_bitwise(void) {
  check_kind("LayerNormMLP checkpoint", mk_mlp_ckpt);
}

static void test_multihead_attention_graphed_bitwise(void) {
  check_kind("MultiheadAttention", mk_mha);
}
static void test_transformer_layer_graphed_bitwise(void) {
  check_kind("TransformerLayer", mk_tl);
}

/* A TransformerLayer with an arbitrary mask (its second input): graphed
** with a sample mask, replays with other masks equal eager calls bit for
** bit; the outputs with two different masks differ. */
static void test_transformer_layer_mask(void) {
  static const int64_t xs[3] = {S, B, HID}, ms[4] = {B, 1, S, S};
  float want[2][S * B * HID], got[S * B * HID];
  gcap_engine *e = t_engine();
  gcap_module *m[2] = {NULL, NULL};
  gcap_graphed *G = NULL;
  gcap_tensor *x = NULL, *mask[2] = {NULL, NULL}, *sample[2] = {NULL, NULL};
  gcap_transformer_opts o;
  int i, k;
  if (e == NULL) return;
  gcap_transformer_opts_init(&o);
  o.attn_mask_type = GCAP_ATTN_ARBITRARY;
  o.hidden_dropout = o.attention_dropout = 0.0;
  for (k = 0; k < 2; k++)
    T_SETUP(gcap_manual_seed(e, 2) == GCAP_OK &&
                gcap_nn_transformer_layer(e, HID, FFN, HEADS, &o, &m[k]) == GCAP_OK,
            (gcap_module_free(m[0]), gcap_engine_free(e)));
  {
    float mv[2][B * S * S];
    for (i = 0; i < B * S * S; i++) { /* 1 above the diagonal; 1 on odd columns off it */
      int r = (i / S) % S, c = i % S;
      mv[0][i] = c > r ? 1.0f : 0.0f;
      mv[1][i] = (c != r && (c & 1)) ? 1.0f : 0.0f;
    }
    for (k = 0; k < 2; k++)
      T_SETUP(gcap_tensor_from_f32(e, GCAP_F32, 4, ms, mv[k], &mask[k]) == GCAP_OK,
              (gcap_tensor_free(mask[0]), gcap_module_free(m[0]), gcap_module_free(m[1]),
               gcap_engine_free(e)));
  }
  T_CHECK_OK(e, gcap_tensor_rand(e, GCAP_F32, 3, xs, 1, &x));
  for (k = 0; k < 2; k++) { /* eager: layer 0 */
    gcap_tensor *in[2], *y = NULL;
    in[0] = x;
    in[1] = mask[k];
    T_CHECK_OK(e, gcap_module_call(m[0], 2, in, &y));
    T_CHECK(gcap_tensor_read(y, want[k], S * B * HID) == GCAP_OK);
    gcap_tensor_free(y);
  }
  T_CHECK(memcmp(want[0], want[1], sizeof want[0]) != 0);
  {
    const int nargs = 2;
    gcap_tensor *const *args = sample;
    gcap_graphed_opts go;
    gcap_graphed_opts_init(&go);
    go.allow_unused_input = 1;
    T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 3, xs, 1.0, &sample[0]));
    T_CHECK_OK(e, gcap_tensor_set_requires_grad(sample[0], 1));
    T_CHECK_OK(e, gcap_tensor_clone(mask[1], &sample[1])); /* a static input of its own */
    T_CHECK_ST(e, gcap_make_graphed_callables(e, 1, &m[1], 1, &nargs, &args, &go, &G), GCAP_OK);
  }
  for (k = 0; G != NULL && k < 2; k++) { /* graphed: layer 1, masks swapped in */
    gcap_tensor *in[2], *y = NULL;
    in[0] = x;
    in[1] = mask[k];
    T_CHECK_OK(e, gcap_module_call(m[1], 2, in, &y));
    T_CHECK(gcap_tensor_read(y, got, S * B * HID) == GCAP_OK);
    T_CHECK(memcmp(got, want[k], sizeof got) == 0);
    gcap_tensor_free(y);
  }
  gcap_graphed_free(G);
  for (k = 0; k < 2; k++) {
    gcap_tensor_free(mask[k]);
    gcap_tensor_free(sample[k]);
    gcap_module_free(m[k]);
  }
  gcap_tensor_free(x);
  gcap_engine_free(e);
}

/* Parameter names and shapes are TE's. */
static void test_parameter_names(void) {
  static const char *lnl[] = {"layer_norm_weight", "layer_norm_bias", "weight", "bias"};
  static const char *mlp[] = {"layer_norm_weight", "layer_norm_bias", "fc1_weight",
                              "fc1_bias",          "fc2_weight",      "fc2_bias"};
  gcap_engine *e = t_engine();
  gcap_module *m = NULL;
  char name[64];
  int i;
  if (e == NULL) return;
  T_CHECK_OK(e, gcap_nn_layer_norm_linear(e, 8, 4, 1e-5, 1, 0, &m));
  T_CHECK(gcap_module_num_parameters(m) == 4);
  for (i = 0; i < 4 && i < gcap_module_num_parameters(m); i++) {
    gcap_module_parameter(m, i, name, sizeof name);
    T_CHECK(strcmp(name, lnl[i]) == 0);
  }
  T_CHECK(strcmp(gcap_module_type(m), "LayerNormLinear") == 0);
  gcap_module_free(m);
  T_CHECK_OK(e, gcap_nn_layer_norm_mlp(e, 8, 12, 1e-5, 1, 0, &m));
  T_CHECK(gcap_module_num_parameters(m) == 6);
  for (i = 0; i < 6 && i < gcap_module_num_parameters(m); i++) {
    gcap_tensor *p = gcap_module_parameter(m, i, name, sizeof name);
    T_CHECK(strcmp(name, mlp[i]) == 0);
    if (i == 4) T_CHECK(gcap_tensor_shape(p)[0] == 8 && gcap_tensor_shape(p)[1] == 12);
  }
  gcap_module_free(m);
  T_CHECK_OK(e, gcap_nn_layer_norm_mlp(e, 8, 12, 1e-5, 0, 0, &m)); /* no biases */
  T_CHECK(gcap_module_num_parameters(m) == 4);
  gcap_module_free(m);
  T_CHECK_OK(e, gcap_nn_embedding(e, 10, 3, &m));
  T_CHECK(gcap_module_num_parameters(m) == 1);
  if (gcap_module_num_parameters(m) == 1) {
    gcap_tensor *w = gcap_module_parameter(m, 0, name, sizeof name);
    T_CHECK(strcmp(name, "weight") == 0 && gcap_tensor_shape(w)[0] == 10 &&
            gcap_tensor_shape(w)[1] == 3);
  }
  gcap_module_free(m);
  m = NULL;
  T_CHECK_ST(e, gcap_nn_embedding(e, 10, 0, &m), GCAP_EINVAL);
  T_CHECK(m == NULL && t_msg_has(e, "Embedding: embedding_dim must be positive, got 0"));
  gcap_engine_free(e);
}

/* return_layernorm_output: two outputs, the second the layer norm's. */
static void test_return_layernorm_output(void) {
  static const int64_t shape[2] = {3, 8};
  gcap_engine *e = t_engine();
  gcap_module *m = NULL, *ln = NULL;
  gcap_tensor *x = NULL, *out[GCAP_MAX_OUTPUTS], *want = NULL;
  float a[24], b[24];
  int n = 0;
  if (e == NULL) return;
  T_SETUP(gcap_nn_layer_norm_linear(e, 8, 4, 1e-5, 1, 1, &m) == GCAP_OK &&
              gcap_nn_layer_norm(e, 8, 1e-5, &ln) == GCAP_OK &&
              gcap_tensor_rand(e, GCAP_F32, 2, shape, 1, &x) == GCAP_OK,
          (gcap_module_free(m), gcap_module_free(ln), gcap_engine_free(e)));
  T_CHECK_ST(e, gcap_module_call(m, 1, &x, &out[0]), GCAP_EINVAL); /* two outputs */
  T_CHECK_OK(e, gcap_module_call_n(m, 1, &x, GCAP_MAX_OUTPUTS, &n, out));
  T_CHECK(n == 2 && gcap_tensor_shape(out[0])[1] == 4 && gcap_tensor_shape(out[1])[1] == 8);
  T_CHECK_OK(e, gcap_module_call(ln, 1, &x, &want));
  T_CHECK(gcap_tensor_read(out[1], a, 24) == GCAP_OK && gcap_tensor_read(want, b, 24) == GCAP_OK);
  T_CHECK(memcmp(a, b, sizeof a) == 0);
  gcap_tensor_free(out[0]);
  gcap_tensor_free(out[1]);
  gcap_tensor_free(want);
  gcap_tensor_free(x);
  gcap_module_free(ln);
  gcap_module_free(m);
  gcap_engine_free(e);
}

/* Bad sizes and calls are errors naming the module and the thing. */
static void test_errors(void) {
  static const int64_t shape[2] = {3, 8};
  gcap_engine *e = t_engine();
  gcap_module *m = NULL;
  gcap_tensor *x = NULL, *y = NULL, *in[2];
  if (e == NULL) return;
  T_CHECK_ST(e, gcap_nn_layer_norm_linear(e, 0, 4, 1e-5, 1, 0, &m), GCAP_EINVAL);
  T_CHECK(m == NULL && t_msg_has(e, "LayerNormLinear: in_features must be positive, got 0"));
  T_CHECK_ST(e, gcap_nn_layer_norm_mlp(e, 8, -1, 1e-5, 1, 0, &m), GCAP_EINVAL);
  T_CHECK(m == NULL && t_msg_has(e, "LayerNormMLP: ffn_hidden_size must be positive, got -1"));
  T_CHECK_ST(e, gcap_nn_layer_norm_mlp(NULL, 8, 8, 1e-5, 1, 0, &m), GCAP_EINVAL);
  T_CHECK_ST(e, gcap_nn_layer_norm_mlp(e, 8, 8, 1e-5, 1, 0, NULL), GCAP_EINVAL);
  T_SETUP(gcap_nn_layer_norm_mlp(e, 8, 8, 1e-5, 1, 1, &m) == GCAP_OK &&
              gcap_tensor_rand(e, GCAP_F32, 2, shape, 1, &x) == GCAP_OK,
          (gcap_module_free(m), gcap_engine_free(e)));
  in[0] = in[1] = x;
  T_CHECK_ST(e, gcap_module_call(m, 2, in, &y), GCAP_EINVAL);
  T_CHECK(y == NULL && t_msg_has(e, "LayerNormMLP: expected 1 input, got 2"));
  gcap_tensor_free(x);
  x = NULL;
  {
    static const int64_t bad[2] = {3, 5};
    T_CHECK_OK(e, gcap_tensor_rand(e, GCAP_F32, 2, bad, 1, &x));
    T_CHECK_ST(e, gcap_module_call(m, 1, &x, &y), GCAP_EINVAL); /* layer_norm's check */
    T_CHECK(y == NULL);
  }
  gcap_tensor_free(x);
  gcap_module_free(m);
  gcap_engine_free(e);
}

/* The attention modules' sizes, masks and inputs are checked. */
static void test_attention_errors(void) {
  static const int64_t bad[4] = {S, B, 3, 8}, xs[3] = {S, B, HID};
  gcap_engine *e = t_engine();
  gcap_module *m = NULL;
  gcap_tensor *q = NULL, *x = NULL, *y = NULL, *in[4];
  gcap_transformer_opts o;
  if (e == NULL) return;
  gcap_transformer_opts_init(&o);
  T_CHECK_ST(e, gcap_nn_transformer_layer(e, 10, 16, 4, &o, &m), GCAP_EINVAL);
  T_CHECK(
      m == NULL &&
      t_msg_has(e, "TransformerLayer: hidden_size 10 is not a multiple of num_attention_heads 4"));
  o.attention_dropout = 1.0;
  T_CHECK_ST(e, gcap_nn_multihead_attention(e, 16, 2, &o, &m), GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "MultiheadAttention: attention_dropout must be in [0, 1), got 1"));
  T_CHECK_ST(e, gcap_nn_dot_product_attention(e, 2, 8, (gcap_attn_mask)7, 0.0, GCAP_SDPA_AUTO, &m),
             GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "DotProductAttention: unknown attn_mask_type 7"));
  T_CHECK_ST(e, gcap_nn_dot_product_attention(e, 0, 8, GCAP_ATTN_CAUSAL, 0.0, GCAP_SDPA_AUTO, &m),
             GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "DotProductAttention: num_attention_heads must be positive, got 0"));
  T_SETUP(gcap_nn_dot_product_attention(e, 2, 8, GCAP_ATTN_CAUSAL, 0.0, GCAP_SDPA_AUTO, &m) ==
                  GCAP_OK &&
              gcap_tensor_rand(e, GCAP_F32, 4, bad, 1, &q) == GCAP_OK &&
              gcap_tensor_rand(e, GCAP_F32, 3, xs, 1, &x) == GCAP_OK,
          (gcap_tensor_free(q), gcap_module_free(m), gcap_engine_free(e)));
  in[0] = in[1] = in[2] = in[3] = q;
  T_CHECK_ST(e, gcap_module_call(m, 3, in, &y), GCAP_EINVAL);
  T_CHECK(y == NULL &&
          t_msg_has(e, "DotProductAttention: q must be [seq, batch, 2 heads, 8 channels], got "
                       "[4, 2, 3, 8]"));
  T_CHECK_ST(e, gcap_module_call(m, 4, in, &y), GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "DotProductAttention: attn_mask_type 'causal' takes q, k, v (3 inputs) "
                       "and no attention_mask, got 4"));
  gcap_module_free(m);
  m = NULL;
  gcap_transformer_opts_init(&o);
  o.attn_mask_type = GCAP_ATTN_ARBITRARY;
  T_CHECK_OK(e, gcap_nn_transformer_layer(e, HID, FFN, HEADS, &o, &m));
  T_CHECK_ST(e, gcap_module_call(m, 1, &x, &y), GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "TransformerLayer: self_attn_mask_type 'arbitrary' takes x and "
                       "attention_mask (2 inputs), got 1"));
  gcap_tensor_free(q);
  gcap_tensor_free(x);
  gcap_module_free(m);
  gcap_engine_free(e);
}

/* Build a TransformerLayer (arbitrary mask, dropout) and a checkpointed
** LayerNormMLP, run x through both and backward; everything made is freed
** whatever fails. */
static gcap_status fault_case(gcap_engine *e) {
  static const int64_t xs[3] = {S, B, HID}, ms[4] = {1, 1, S, S};
  gcap_module *tl = NULL, *mlp = NULL;
  gcap_tensor *x = NULL, *mask = NULL, *in[2], *y = NULL, *z = NULL, *loss = NULL;
  gcap_transformer_opts o;
  gcap_status st;
  gcap_transformer_opts_init(&o);
  o.attn_mask_type = GCAP_ATTN_ARBITRARY;
  if ((st = gcap_nn_transformer_layer(e, HID, FFN, HEADS, &o, &tl)) == GCAP_OK &&
      (st = gcap_nn_layer_norm_mlp(e, HID, FFN, 1e-5, 1, 1, &mlp)) == GCAP_OK &&
      (st = gcap_tensor_rand(e, GCAP_F32, 3, xs, 1, &x)) == GCAP_OK &&
      (st = gcap_tensor_set_requires_grad(x, 1)) == GCAP_OK &&
      (st = gcap_tensor_full(e, GCAP_F32, 4, ms, 0.0, &mask)) == GCAP_OK) {
    in[0] = x;
    in[1] = mask;
    if ((st = gcap_module_call(tl, 2, in, &y)) == GCAP_OK &&
        (st = gcap_module_call(mlp, 1, &y, &z)) == GCAP_OK && (st = gcap_sum(z, &loss)) == GCAP_OK)
      st = gcap_backward(loss, NULL, 0);
  }
  gcap_tensor_free(loss);
  gcap_tensor_free(z);
  gcap_tensor_free(y);
  gcap_tensor_free(mask);
  gcap_tensor_free(x);
  gcap_module_free(mlp);
  gcap_module_free(tl);
  return st;
}

/* Every allocation of fault_case failing in turn: a clear status and
** message, nothing leaked (the engine is freed at the end: T_RUN checks
** no object kept it alive), and the same case succeeds afterwards. */
static void test_allocation_failures(void) {
  gcap_engine *e = t_engine();
  long n, injected = 0;
  if (e == NULL) return;
  for (n = 1; n < 100000; n++) {
    gcap_status st;
    gcap_test_fail_alloc(n);
    st = fault_case(e);
    if (!gcap_test_fail_alloc(0)) {
      T_CHECK_ST(e, st, GCAP_OK);
      break;
    }
    injected++;
    if (st == GCAP_OK) continue; /* absorbed (a cache, a fallback) */
    if (gcap_errmsg(e)[0] == '\0')
      T_FAILF("a message", "N=%ld: %s with no message", n, gcap_status_str(st));
  }
  T_CHECK(injected > 10);
  T_CHECK_ST(e, fault_case(e), GCAP_OK);
  gcap_engine_free(e);
}

int main(void) {
  T_RUN(test_layer_norm_linear_graphed_bitwise);
  T_RUN(test_layer_norm_mlp_graphed_bitwise);
  T_RUN(test_layer_norm_mlp_checkpoint_graphed_bitwise);
  T_RUN(test_multihead_attention_graphed_bitwise);
  T_RUN(test_transformer_layer_graphed_bitwise);
  T_RUN(test_transformer_layer_mask);
  T_RUN(test_attention_errors);
  T_RUN(test_parameter_names);
  T_RUN(test_return_layernorm_output);
  T_RUN(test_errors);
  T_RUN(test_allocation_failures);
  return t_done();
}
