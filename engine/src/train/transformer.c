/*
** transformer.c: the transformer modules, under TransformerEngine's names
** and parameter names: LayerNormLinear, LayerNormMLP (optionally
** checkpointed: its activations recomputed in backward). Each is a module
** whose forward is C over graphcap's ops, its parameters registered on the
** module itself (layer_norm_weight, fc1_weight, ...) and borrowed by its ud.
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train.h"

/* Parameter slots of a module's ud */
enum { TF_LNW, TF_LNB, TF_W1, TF_B1, TF_W2, TF_B2, TF_NP };

/* Children slots of a module's ud: MultiheadAttention's, TransformerLayer's */
enum { TF_QKV, TF_CORE, TF_PROJ, TF_NC };
enum { TF_ATTN, TF_MLP };

typedef struct tf_mod {
  gcap_engine *e;
  const char *type; /* the module's type name (static) */
  double eps;
  int ret_ln;     /* LayerNormLinear: also return the layer norm's output */
  int checkpoint; /* LayerNormMLP: recompute activations in backward */
  int heads;      /* attention: heads and channels per head */
  int64_t kv;
  gcap_attn_mask mask;   /* attention: the mask type */
  const char *mask_opt;  /* the option that set it, for messages */
  double p_attn, p_hid;  /* dropout of attention weights, of hidden states */
  gcap_sdpa_impl impl;   /* attention: its implementation */
  gcap_tensor *p[TF_NP]; /* borrowed from the module's parameters; NULL: none */
  gcap_module *c[TF_NC]; /* borrowed from the module's children */
} tf_mod;

/* A module of type `type` with a fresh tf_mod as ud (freed with it). */
static gcap_status tf_new(gcap_engine *e, const char *type, gcap_forward_fn fwd,
                          gcap_forward_n_fn fwd_n, gcap_module **m, tf_mod **t) {
  gcap_status st;
  *t = NULL;
  if ((st = gc_check_open(e, type)) != GCAP_OK) return st;
  if ((*t = (tf_mod *)gc_calloc(1, sizeof **t)) == NULL)
    return gc_fail(e, GCAP_ENOMEM, "%s: out of host memory", type);
  (*t)->e = e;
  (*t)->type = type;
  st = fwd ? gcap_module_new(e, type, fwd, *t, free, m)
           : gcap_module_new_n(e, type, fwd_n, *t, free, m);
  if (st != GCAP_OK) free(*t);
  return st;
}

/* Register t as parameter `name` of m in slot `slot` (borrowed there); t's
** reference passes to m. */
static gcap_status tf_add(gcap_module *m, tf_mod *u, int slot, const char *name, gcap_tensor *t,
                          gcap_status st) {
  if (st == GCAP_OK) st = gcap_module_add_parameter(m, name, t);
  if (st == GCAP_OK) u->p[slot] = t;
  gcap_tensor_free(t);
  return st;
}

/* layer_norm_weight (ones) and layer_norm_bias (zeros) of size n. */
static gcap_status tf_ln_params(gcap_engine *e, gcap_module *m, tf_mod *u, int64_t n) {
  gcap_tensor *t = NULL;
  gcap_status st = gcap_tensor_full(e, GCAP_F32, 1, &n, 1.0, &t);
  if ((st = tf_add(m, u, TF_LNW, "layer_norm_weight", t, st)) != GCAP_OK) return st;
  t = NULL;
  st = gcap_tensor_full(e, GCAP_F32, 1, &n, 0.0, &t);
  return tf_add(m, u, TF_LNB, "layer_norm_bias", t, st);
}

/* A linear's weight [out, in] and bias [out] (when `bias`) in slots
** slot, slot + 1, drawn as Linear's are: U(-1/sqrt(in), 1/sqrt(in)). */
static gcap_status tf_linear_params(gcap_engine *e, gcap_module *m, tf_mod *u, int slot,
                                    const char *wname, const char *bname, int64_t in, int64_t out,
                                    int bias) {
  int64_t ws[2];
  gcap_tensor *t = NULL;
  double bound = 1.0 / sqrt((double)in);
  gcap_status st;
  ws[0] = out;
  ws[1] = in;
  st = gc_uniform(e, 2, ws, bound, &t);
  if ((st = tf_add(m, u, slot, wname, t, st)) != GCAP_OK || !bias) return st;
  t = NULL;
  st = gc_uniform(e, 1, &out, bound, &t);
  return tf_add(m, u, slot + 1, bname, t, st);
}

/* Sizes must be positive: an error naming the module and the size. */
static gcap_status tf_positive(gcap_engine *e, const char *type, const char *what, int64_t v) {
  if (v > 0) return GCAP_OK;
  return gc_fail(e, GCAP_EINVAL, "%s: %s must be positive, got %lld", type, what, (long long)v);
}

/* A layer norm's epsilon must be finite and not negative (a NaN or a
** negative one makes every output NaN, silently). */
static gcap_status tf_eps(gcap_engine *e, const char *type, const char *what, double eps) {
  if (eps >= 0.0 && isfinite(eps)) return GCAP_OK;
  return gc_fail(e, GCAP_EINVAL, "%s: %s must be a finite number >= 0, got %g", type, what, eps);
}

/* A call of u's module with nin inputs, of which it takes lo to hi. */
static gcap_status tf_inputs(const tf_mod *u, int nin, int lo, int hi) {
  if (nin >= lo && nin <= hi) return GCAP_OK;
  if (lo == hi)
    return gc_fail(u->e, GCAP_EINVAL, "%s: expected %d input%s, got %d", u->type, lo,
                   lo == 1 ? "" : "s", nin);
  return gc_fail(u->e, GCAP_EINVAL, "%s: expected %d to %d inputs, got %d", u->type, lo, hi, nin);
}

/* ------------------------------------------------------------------------ */
/* LayerNormLinear                                                           */

static gcap_status lnl_forward(void *ud, gcap_module *m, int nin, gcap_tensor *const *in, int *nout,
                               gcap_tensor **out) {
  tf_mod *u = (tf_mod *)ud;
  gcap_tensor *ln;
  gcap_status st;
  *nout = 0;
  if ((st = tf_inputs(u, nin, 1, 1)) != GCAP_OK) return st;
  if ((st = gcap_layer_norm(in[0], u->p[TF_LNW], u->p[TF_LNB], u->eps, &ln)) != GCAP_OK) return st;
  if ((st = gc_fp8_linear(m, 0, ln, u->p[TF_W1], u->p[TF_B1], 0, NULL, &out[0])) != GCAP_OK) {
    gcap_tensor_free(ln);
    return st;
  }
  if (u->ret_ln) {
    out[1] = ln;
    *nout = 2;
  } else {
    gcap_tensor_free(ln);
    *nout = 1;
  }
  return GCAP_OK;
}

gcap_status gcap_nn_layer_norm_linear(gcap_engine *e, int64_t in, int64_t out, double eps, int bias,
                                      int return_layernorm_output, gcap_module **m) {
  static const char type[] = "LayerNormLinear";
  tf_mod *u;
  gcap_status st;
  if ((st = gc_module_start(e, type, m)) != GCAP_OK) return st;
  if ((st = tf_positive(e, type, "in_features", in)) != GCAP_OK ||
      (st = tf_positive(e, type, "out_features", out)) != GCAP_OK ||
      (st = tf_eps(e, type, "eps", eps)) != GCAP_OK ||
      (st = tf_new(e, type, NULL, lnl_forward, m, &u)) != GCAP_OK)
    return st;
  u->eps = eps;
  u->ret_ln = return_layernorm_output != 0;
  gc_module_set_fp8_gemms(*m, 1);
  if ((st = tf_ln_params(e, *m, u, in)) != GCAP_OK ||
      (st = tf_linear_params(e, *m, u, TF_W1, "weight", "bias", in, out, bias)) != GCAP_OK)
    return gc_module_keep_or_free(m, st);
  return GCAP_OK;
}

/* ------------------------------------------------------------------------ */
/* LayerNormMLP                                                              */

/* fc2(gelu(fc1(layer_norm(x)))) with the parameters p[TF_NP]; the fc1 and
** gelu pair is one op (gcap_linear_gelu); in FP8 as m's GEMMs 0 and 1 under
** an FP8 autocast (m NULL: never, a checkpoint's recomputation). */
static gcap_status mlp_run(gcap_module *m, gcap_tensor *x, gcap_tensor *const *p, double eps,
                           gcap_tensor **out) {
  gcap_tensor *ln, *h;
  gcap_status st;
  *out = NULL;
  if ((st = gcap_layer_norm(x, p[TF_LNW], p[TF_LNB], eps, &ln)) != GCAP_OK) return st;
  st = m ? gc_fp8_linear(m, 0, ln, p[TF_W1], p[TF_B1], 1, NULL, &h)
         : gcap_linear_gelu(ln, p[TF_W1], p[TF_B1], &h);
  gcap_tensor_free(ln);
  if (st != GCAP_OK) return st;
  st = m ? gc_fp8_linear(m, 1, h, p[TF_W2], p[TF_B2], 0, NULL, out)
         : gcap_linear(h, p[TF_W2], p[TF_B2], out);
  gcap_tensor_free(h);
  return st;
}

/* A checkpointed call's node: the parameters it ran with (held) and
** whether x needed a grad; x itself is its saved tensor. Run under an FP8
** autocast: the module (held), that autocast, and with DelayedScaling the
** scales of its roles as the forward read them (a copy). */
typedef struct mlp_ckpt {
  gcap_tensor *p[TF_NP];
  uint64_t version[TF_NP]; /* the parameters' storage versions the forward read */
  double eps;
  int xgrad;
  gcap_module *m;
  gcap_fp8_autocast fp8;
  gc_fp8_meta *meta; /* the FP8 state the forward updated (held), DelayedScaling's */
  gcap_tensor *scales;
} mlp_ckpt;

static void ckpt_free(void *ud) {
  mlp_ckpt *c = (mlp_ckpt *)ud;
  int i;
  for (i = 0; i < TF_NP; i++)
    gcap_tensor_free(c->p[i]);
  gcap_module_free(c->m);
  gc_fp8_meta_release(c->meta);
  gcap_tensor_free(c->scales);
  free(c);
}

/* The names of LayerNormMLP's parameters, by slot. */
static const char *const mlp_param_names[TF_NP] = {
    "layer_norm_weight", "layer_norm_bias", "fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias"};

/* Before recomputing: the parameters as the forward read them (PyTorch's
** check of saved tensors), and under FP8 the module's state the one the
** forward updated. */
static gcap_status ckpt_check(const mlp_ckpt *c) {
  int i;
  for (i = 0; i < TF_NP; i++) {
    const gcap_tensor *t = c->p[i];
    char what[96];
    if (t == NULL || t->blk->version == c->version[i]) continue;
    snprintf(what, sizeof what, "parameter %s of the checkpointed 'LayerNormMLP'",
             mlp_param_names[i]);
    return gc_fail_written(t, "backward", what, t->blk->version, c->version[i]);
  }
  if (c->meta != NULL && *gc_module_fp8_slot(c->m) != c->meta)
    return gc_fail(gc_module_engine(c->m), GCAP_ESTATE,
                   "backward: the checkpointed 'LayerNormMLP' has another FP8 state than its "
                   "forward updated (a call under a recipe of another amax_history_len made a "
                   "new one): its recomputation cannot repeat that forward; run the backward "
                   "before calling it under another recipe");
  return GCAP_OK;
}

/* The recomputed forward of checkpoint c on the leaves: under the FP8
** autocast the forward ran in, its quantizations taking the scales that
** forward read and updating no role (their amaxes were noted then), so
** that it gives the forward's values; the backward of what it records
** quantizes the grads as a forward not checkpointed would. */
static gcap_status ckpt_recompute(mlp_ckpt *c, gcap_tensor *const *leaf, gcap_tensor **y) {
  gcap_engine *e = gcap_tensor_engine(leaf[0]);
  gcap_fp8_autocast prev;
  gcap_tensor *frozen = e->fp8_frozen;
  gcap_status st;
  if (c->m == NULL) return mlp_run(NULL, leaf[0], leaf + 1, c->eps, y);
  if ((st = gcap_fp8_set_autocast(e, &c->fp8, &prev)) != GCAP_OK) return st;
  e->fp8_frozen = c->scales;
  st = mlp_run(c->m, leaf[0], leaf + 1, c->eps, y);
  e->fp8_frozen = frozen;
  gcap_fp8_set_autocast(e, &prev, NULL);
  return st;
}

/* A leaf sharing t's storage that requires grad when `grad`. */
static gcap_status leaf_of(gcap_tensor *t, int grad, gcap_tensor **out) {
  gcap_status st;
  *out = NULL;
  if (t == NULL) return GCAP_OK;
  if ((st = gcap_tensor_detach(t, out)) == GCAP_OK && grad)
    st = gcap_tensor_set_requires_grad(*out, 1);
  return st;
}

/* The checkpoint's backward: run the forward again, recording, on leaves
** sharing x's and the parameters' storage, and backpropagate g through it;
** the leaves' grads are the node's. */
static gcap_status ckpt_backward(void *ud, int nsaved, gcap_tensor *const *saved, gcap_tensor *g,
                                 int nin, gcap_tensor **gin) {
  mlp_ckpt *c = (mlp_ckpt *)ud;
  gcap_engine *e = gcap_tensor_engine(g);
  gcap_tensor *leaf[1 + TF_NP] = {NULL}, *y = NULL;
  gcap_status st;
  int i, was;
  (void)nsaved;
  if ((st = ckpt_check(c)) != GCAP_OK) return st;
  st = leaf_of(saved[0], c->xgrad, &leaf[0]);
  for (i = 0; st == GCAP_OK && i < TF_NP; i++)
    st = leaf_of(c->p[i], 1, &leaf[1 + i]);
  if (st == GCAP_OK) {
    was = gcap_set_grad_enabled(e, 1);
    if ((st = ckpt_recompute(c, leaf, &y)) == GCAP_OK) st = gcap_backward(y, g, 0);
    gcap_set_grad_enabled(e, was);
  }
  for (i = 0; i < nin; i++) {
    gcap_tensor *lg = (st == GCAP_OK && leaf[i] != NULL) ? gcap_tensor_grad(leaf[i]) : NULL;
    gin[i] = lg ? gcap_tensor_retain(lg) : NULL;
  }
  gcap_tensor_free(y);
  for (i = 0; i < 1 + TF_NP; i++)
    gcap_tensor_free(leaf[i]);
  return st;
}

/* The scales of m's FP8 roles as they stand (DelayedScaling's: a copy of
** that part of its state, made before the forward updates them), or NULL
** for current scaling. */
static gcap_status fp8_scales(gcap_module *m, gcap_tensor **out) {
  gcap_engine *e = gc_module_engine(m);
  gc_fp8_meta *meta;
  gcap_tensor *part;
  gcap_status st;
  *out = NULL;
  if (e->fp8.recipe.kind != GCAP_FP8_DELAYED_SCALING) return GCAP_OK;
  if ((st = gc_fp8_module_meta(m, &e->fp8.recipe, &meta)) != GCAP_OK) return st;
  if ((part = gc_elems(meta->state, 3 * meta->gemms, 3 * meta->gemms)) == NULL)
    return gc_fail(e, GCAP_ENOMEM, "%s: out of host memory", gcap_module_type(m));
  st = gcap_tensor_clone(part, out);
  gcap_tensor_free(part);
  return st;
}

/* The checkpointed forward: run without recording (under an FP8 autocast
** in FP8, its roles' scales kept first), then record one node whose inputs
** are x and the parameters, saving x alone. */
static gcap_status mlp_checkpointed(tf_mod *u, gcap_module *m, gcap_tensor *x, gcap_tensor **out) {
  gcap_tensor *y, *in[1 + TF_NP], *scales = NULL;
  mlp_ckpt *c;
  gcap_status st;
  int i, fp8 = u->e->fp8.enabled, was;
  /* a cached weight may change before the recomputation: it would not see it */
  if (fp8 && u->e->fp8_skip != NULL)
    return gc_fail(u->e, GCAP_EINVAL,
                   "%s: checkpoint = true does not run with fp8_weight_caching (the recomputation "
                   "in backward would quantize the weight anew, not use the cached copy the "
                   "forward used); graph it without fp8_weight_caching, or build it with "
                   "checkpoint = false",
                   u->type);
  if (fp8 && (st = fp8_scales(m, &scales)) != GCAP_OK) return st;
  was = gcap_set_grad_enabled(u->e, 0);
  st = mlp_run(fp8 ? m : NULL, x, u->p, u->eps, &y);
  gcap_set_grad_enabled(u->e, was);
  if (st != GCAP_OK) {
    gcap_tensor_free(scales);
    return st;
  }
  if ((c = (mlp_ckpt *)gc_calloc(1, sizeof *c)) == NULL) {
    gcap_tensor_free(y);
    gcap_tensor_free(scales);
    return gc_fail(u->e, GCAP_ENOMEM, "%s: out of host memory", u->type);
  }
  if (fp8) {
    c->m = gcap_module_retain(m);
    c->fp8 = u->e->fp8;
    c->scales = scales;
    if (scales != NULL) c->meta = gc_fp8_meta_retain(*gc_module_fp8_slot(m));
  }
  c->eps = u->eps;
  c->xgrad = gcap_tensor_requires_grad(x);
  in[0] = x;
  for (i = 0; i < TF_NP; i++) {
    in[1 + i] = u->p[i];
    c->p[i] = u->p[i] ? gcap_tensor_retain(u->p[i]) : NULL;
    c->version[i] = u->p[i] ? u->p[i]->blk->version : 0;
  }
  st = gcap_autograd_record(u->type, y, 1 + TF_NP, in, 1, &x, ckpt_backward, c, ckpt_free, out);
  gcap_tensor_free(y);
  return st;
}

static gcap_status mlp_forward(void *ud, gcap_module *m, int nin, gcap_tensor *const *in,
                               gcap_tensor **out) {
  tf_mod *u = (tf_mod *)ud;
  gcap_status st;
  if ((st = tf_inputs(u, nin, 1, 1)) != GCAP_OK) return st;
  return u->checkpoint ? mlp_checkpointed(u, m, in[0], out) : mlp_run(m, in[0], u->p, u->eps, out);
}

gcap_status gcap_nn_layer_norm_mlp(gcap_engine *e, int64_t hidden, int64_t ffn_hidden, double eps,
                                   int bias, int checkpoint, gcap_module **m) {
  static const char type[] = "LayerNormMLP";
  tf_mod *u;
  gcap_status st;
  if ((st = gc_module_start(e, type, m)) != GCAP_OK) return st;
  if ((st = tf_positive(e, type, "hidden_size", hidden)) != GCAP_OK ||
      (st = tf_positive(e, type, "ffn_hidden_size", ffn_hidden)) != GCAP_OK ||
      (st = tf_eps(e, type, "eps", eps)) != GCAP_OK ||
      (st = tf_new(e, type, mlp_forward, NULL, m, &u)) != GCAP_OK)
    return st;
  u->eps = eps;
  u->checkpoint = checkpoint != 0;
  gc_module_set_fp8_gemms(*m, 2);
  if ((st = tf_ln_params(e, *m, u, hidden)) != GCAP_OK ||
      (st = tf_linear_params(e, *m, u, TF_W1, "fc1_weight", "fc1_bias", hidden, ffn_hidden,
                             bias)) != GCAP_OK ||
      (st = tf_linear_params(e, *m, u, TF_W2, "fc2_weight", "fc2_bias", ffn_hidden, hidden,
                             bias)) != GCAP_OK)
    return gc_module_keep_or_free(m, st);
  return GCAP_OK;
}

/* ------------------------------------------------------------------------ */
/* DotProductAttention                                                       */

static const char *mask_name(gcap_attn_mask k) {
  return k == GCAP_ATTN_CAUSAL ? "causal" : k == GCAP_ATTN_ARBITRARY ? "arbitrary" : "no_mask";
}

/* The inputs a call of u's module takes with its mask type: a mask only
** for "arbitrary"; an error naming them otherwise. */
static gcap_status tf_mask_inputs(const tf_mod *u, int nin, int base, const char *names) {
  int want = base + (u->mask == GCAP_ATTN_ARBITRARY);
  if (nin == want) return GCAP_OK;
  if (u->mask == GCAP_ATTN_ARBITRARY)
    return gc_fail(u->e, GCAP_EINVAL,
                   "%s: %s 'arbitrary' takes %s and attention_mask (%d inputs), got %d", u->type,
                   u->mask_opt, names, want, nin);
  return gc_fail(u->e, GCAP_EINVAL,
                 "%s: %s '%s' takes %s (%d input%s) and no attention_mask, got %d", u->type,
                 u->mask_opt, mask_name(u->mask), names, want, want == 1 ? "" : "s", nin);
}

/* t is [seq, batch, heads, channels] of u's sizes, or an error naming it. */
static gcap_status check_sbhd(const tf_mod *u, const char *what, gcap_tensor *t) {
  const int64_t *sh = gcap_tensor_shape(t);
  char b[64];
  if (gcap_tensor_ndim(t) == 4 && sh[2] == u->heads && sh[3] == u->kv) return GCAP_OK;
  return gc_fail(u->e, GCAP_EINVAL, "%s: %s must be [seq, batch, %d heads, %lld channels], got %s",
                 u->type, what, u->heads, (long long)u->kv, gc_shape_str(t, b, sizeof b));
}

/* softmax(q k^T / sqrt(D) + mask) v over q, k, v [B, H, S, D], the mask
** boolean (nonzero: masked out) or causal as u's type says; dropout of the
** weights with u's p_attn in training. */
static gcap_status tf_attention(const tf_mod *u, gcap_tensor *q, gcap_tensor *k, gcap_tensor *v,
                                gcap_tensor *mask, int training, gcap_attn_stats *ran,
                                gcap_tensor **out) {
  gcap_sdpa_opts o;
  memset(&o, 0, sizeof o);
  o.attn_mask = mask;
  o.mask_kind = GCAP_MASK_BOOL;
  o.is_causal = u->mask == GCAP_ATTN_CAUSAL;
  o.dropout_p = training ? u->p_attn : 0.0;
  o.impl = u->impl;
  return gc_sdpa(q, k, v, &o, ran, out);
}

/* q, k, v [S, B, H, D] -> [S, B, H * D]: attention over [B, H, S, D]. */
static gcap_status dpa_forward(void *ud, gcap_module *m, int nin, gcap_tensor *const *in,
                               gcap_tensor **out) {
  static const int to_bhsd[4] = {1, 2, 0, 3}, to_sbhd[4] = {2, 0, 1, 3};
  static const char *what[3] = {"q", "k", "v"};
  tf_mod *u = (tf_mod *)ud;
  gcap_tensor *t[3] = {NULL, NULL, NULL}, *o = NULL, *os = NULL;
  gcap_attn_stats ran;
  gcap_status st;
  int i;
  if ((st = tf_mask_inputs(u, nin, 3, "q, k, v")) != GCAP_OK) return st;
  for (i = 0; i < 3; i++)
    if ((st = check_sbhd(u, what[i], in[i])) != GCAP_OK) return st;
  for (i = 0; st == GCAP_OK && i < 3; i++)
    st = gcap_permute(in[i], to_bhsd, &t[i]);
  if (st == GCAP_OK)
    st = tf_attention(u, t[0], t[1], t[2], nin > 3 ? in[3] : NULL, gcap_module_training(m), &ran,
                      &o);
  if (st == GCAP_OK && (st = gcap_permute(o, to_sbhd, &os)) == GCAP_OK) {
    int64_t shape[3];
    shape[0] = gcap_tensor_shape(os)[0];
    shape[1] = gcap_tensor_shape(os)[1];
    shape[2] = u->heads * u->kv;
    st = gcap_tensor_view(os, 3, shape, out);
  }
  if (st == GCAP_OK) *gc_module_attn_slot(m) = ran; /* a failed call leaves them as they were */
  for (i = 0; i < 3; i++)
    gcap_tensor_free(t[i]);
  gcap_tensor_free(o);
  gcap_tensor_free(os);
  return st;
}

/* Check an attention module's sizes and options. */
static gcap_status check_attn(gcap_engine *e, const char *type, int heads, int64_t ch,
                              gcap_attn_mask mask, double p, gcap_sdpa_impl impl) {
  gcap_status st;
  if ((st = tf_positive(e, type, "num_attention_heads", heads)) != GCAP_OK ||
      (st = tf_positive(e, type, "kv_channels", ch)) != GCAP_OK)
    return st;
  if (mask != GCAP_ATTN_NO_MASK && mask != GCAP_ATTN_CAUSAL && mask != GCAP_ATTN_ARBITRARY)
    return gc_fail(e, GCAP_EINVAL, "%s: unknown attn_mask_type %d", type, (int)mask);
  if (!(p >= 0.0 && p < 1.0))
    return gc_fail(e, GCAP_EINVAL, "%s: attention_dropout must be in [0, 1), got %g", type, p);
  if (impl != GCAP_SDPA_AUTO && impl != GCAP_SDPA_COMPOSED && impl != GCAP_SDPA_FUSED &&
      impl != GCAP_SDPA_CUDNN)
    return gc_fail(e, GCAP_EINVAL, "%s: unknown attn_impl %d", type, (int)impl);
  if (impl == GCAP_SDPA_FUSED && ch > GCAP_SDPA_FUSED_DMAX)
    return gc_fail(e, GCAP_EINVAL, "%s: attn_impl fused takes kv_channels up to %d, got %lld", type,
                   GCAP_SDPA_FUSED_DMAX, (long long)ch);
  return GCAP_OK;
}

gcap_status gcap_nn_dot_product_attention(gcap_engine *e, int num_heads, int64_t kv_channels,
                                          gcap_attn_mask mask, double attention_dropout,
                                          gcap_sdpa_impl attn_impl, gcap_module **m) {
  static const char type[] = "DotProductAttention";
  tf_mod *u;
  gcap_status st;
  if ((st = gc_module_start(e, type, m)) != GCAP_OK) return st;
  if ((st = check_attn(e, type, num_heads, kv_channels, mask, attention_dropout, attn_impl)) !=
          GCAP_OK ||
      (st = tf_new(e, type, dpa_forward, NULL, m, &u)) != GCAP_OK)
    return st;
  u->heads = num_heads;
  u->kv = kv_channels;
  u->mask = mask;
  u->mask_opt = "attn_mask_type";
  u->p_attn = attention_dropout;
  u->impl = attn_impl;
  return GCAP_OK;
}

/* ------------------------------------------------------------------------ */
/* MultiheadAttention, TransformerLayer                                      */

void gcap_transformer_opts_init(gcap_transformer_opts *o) {
  if (o == NULL) return;
  o->attn_mask_type = GCAP_ATTN_CAUSAL;
  o->attention_dropout = 0.1;
  o->hidden_dropout = 0.1;
  o->layernorm_epsilon = 1e-5;
  o->bias = 1;
  o->input_layernorm = 0;
  o->attn_impl = GCAP_SDPA_AUTO;
}

/* Register `child` (made with status st) as child `name` of m in slot
** `slot` (borrowed there); the caller's reference passes to m. */
static gcap_status tf_child(gcap_module *m, tf_mod *u, int slot, const char *name,
                            gcap_module *child, gcap_status st) {
  if (st == GCAP_OK) st = gcap_module_add_child(m, name, child);
  if (st == GCAP_OK) u->c[slot] = child;
  gcap_module_free(child);
  return st;
}

/* The core attention over the packed q4 [S, B, heads, 3 * channels]
** without splitting it (gc_sdpa_packed), when a call of the core would run
** its own forward and nothing else and the backend's library takes it;
** *out NULL otherwise, with why into ran. */
static gcap_status mha_packed(const tf_mod *u, gcap_tensor *q4, gcap_attn_stats *ran,
                              gcap_tensor **out) {
  gcap_module *core = u->c[TF_CORE];
  gcap_sdpa_opts o;
  gcap_status st;
  *out = NULL;
  memset(ran, 0, sizeof *ran);
  if (u->mask == GCAP_ATTN_ARBITRARY) {
    snprintf(ran->why, sizeof ran->why,
             "attn_mask_type 'arbitrary' takes a mask, so q, k and v "
             "are split for core_attention");
    return GCAP_OK;
  }
  if (!gc_module_plain(core)) {
    snprintf(ran->why, sizeof ran->why,
             "core_attention has hooks or a graph of its own, so q, k "
             "and v are split for its call");
    return GCAP_OK;
  }
  memset(&o, 0, sizeof o);
  o.is_causal = u->mask == GCAP_ATTN_CAUSAL;
  o.dropout_p = gcap_module_training(core) ? u->p_attn : 0.0;
  o.impl = u->impl;
  st = gc_sdpa_packed(q4, &o, ran->why, sizeof ran->why, out);
  if (st == GCAP_OK && *out != NULL) { /* the core's attention ran, here */
    ran->impl = "cudnn", ran->packed = 1;
    *gc_module_attn_slot(core) = *ran;
  }
  return st;
}

/* ran: how the split path's core attention ran, with why the packed path
** was not taken where cuDNN ran it. */
static void mha_split_ran(const tf_mod *u, gcap_attn_stats *ran) {
  char packed_why[sizeof ran->why];
  memcpy(packed_why, ran->why, sizeof packed_why);
  *ran = *gc_module_attn_slot(u->c[TF_CORE]);
  ran->packed = 0;
  if (ran->why[0] == '\0') memcpy(ran->why, packed_why, sizeof ran->why);
}

/* x [S, B, hidden] (and a mask) -> [S, B, hidden]: the qkv projection,
** its [S, B, heads, 3 * channels] split into q, k, v (each head's three
** blocks side by side, TE's interleaved layout), attention, projection;
** the split skipped where the core attention reads the packed projection
** in place (mha_packed). */
static gcap_status mha_forward(void *ud, gcap_module *m, int nin, gcap_tensor *const *in,
                               gcap_tensor **out) {
  tf_mod *u = (tf_mod *)ud;
  gcap_tensor *qkv = NULL, *q4 = NULL, *a = NULL, *part[4] = {NULL, NULL, NULL, NULL};
  gcap_attn_stats ran;
  gcap_status st;
  int i, n = 0;
  if ((st = tf_mask_inputs(u, nin, 1, "x")) != GCAP_OK) return st;
  if (gcap_tensor_ndim(in[0]) != 3 || gcap_tensor_shape(in[0])[2] != u->heads * u->kv) {
    char b[64];
    return gc_fail(u->e, GCAP_EINVAL, "%s: x must be [seq, batch, hidden %lld], got %s", u->type,
                   (long long)(u->heads * u->kv), gc_shape_str(in[0], b, sizeof b));
  }
  if ((st = gcap_module_call(u->c[TF_QKV], 1, in, &qkv)) == GCAP_OK) {
    int64_t shape[4];
    shape[0] = gcap_tensor_shape(in[0])[0];
    shape[1] = gcap_tensor_shape(in[0])[1];
    shape[2] = u->heads;
    shape[3] = 3 * u->kv;
    st = gcap_tensor_view(qkv, 4, shape, &q4);
  }
  if (st == GCAP_OK) st = mha_packed(u, q4, &ran, &a);
  if (st == GCAP_OK && a == NULL) st = gcap_split(q4, u->kv, 3, 3, part, &n);
  if (st == GCAP_OK && a == NULL) {
    part[3] = nin > 1 ? in[1] : NULL;
    st = gcap_module_call(u->c[TF_CORE], nin + 2, part, &a);
    if (st == GCAP_OK) mha_split_ran(u, &ran);
  }
  if (st == GCAP_OK) st = gcap_module_call(u->c[TF_PROJ], 1, &a, out);
  if (st == GCAP_OK) *gc_module_attn_slot(m) = ran;
  for (i = 0; i < n; i++)
    gcap_tensor_free(part[i]);
  gcap_tensor_free(qkv);
  gcap_tensor_free(q4);
  gcap_tensor_free(a);
  return st;
}

/* Options common to MultiheadAttention and TransformerLayer. */
static gcap_status check_layer(gcap_engine *e, const char *type, int64_t hidden, int heads,
                               const gcap_transformer_opts *o) {
  gcap_status st;
  if ((st = tf_positive(e, type, "hidden_size", hidden)) != GCAP_OK ||
      (st = tf_positive(e, type, "num_attention_heads", heads)) != GCAP_OK ||
      (st = tf_eps(e, type, "layernorm_epsilon", o->layernorm_epsilon)) != GCAP_OK)
    return st;
  if (hidden % heads != 0)
    return gc_fail(e, GCAP_EINVAL,
                   "%s: hidden_size %lld is not a multiple of num_attention_heads %d", type,
                   (long long)hidden, heads);
  if (!(o->hidden_dropout >= 0.0 && o->hidden_dropout < 1.0))
    return gc_fail(e, GCAP_EINVAL, "%s: hidden_dropout must be in [0, 1), got %g", type,
                   o->hidden_dropout);
  return check_attn(e, type, heads, hidden / heads, o->attn_mask_type, o->attention_dropout,
                    o->attn_impl);
}

gcap_status gcap_nn_multihead_attention(gcap_engine *e, int64_t hidden, int num_heads,
                                        const gcap_transformer_opts *o, gcap_module **m) {
  static const char type[] = "MultiheadAttention";
  gcap_transformer_opts def;
  gcap_module *c = NULL;
  tf_mod *u;
  gcap_status st;
  if ((st = gc_module_start(e, type, m)) != GCAP_OK) return st;
  if (o == NULL) {
    gcap_transformer_opts_init(&def);
    o = &def;
  }
  if ((st = check_layer(e, type, hidden, num_heads, o)) != GCAP_OK ||
      (st = tf_new(e, type, mha_forward, NULL, m, &u)) != GCAP_OK)
    return st;
  u->heads = num_heads;
  u->kv = hidden / num_heads;
  u->mask = o->attn_mask_type;
  u->mask_opt = "attn_mask_type";
  u->p_attn = o->attention_dropout; /* the core's, for mha_packed */
  u->impl = o->attn_impl;
  if (o->input_layernorm) {
    st = gcap_nn_layer_norm_linear(e, hidden, 3 * hidden, o->layernorm_epsilon, o->bias, 0, &c);
    st = tf_child(*m, u, TF_QKV, "layernorm_qkv", c, st);
  } else {
    st = gcap_nn_linear(e, hidden, 3 * hidden, o->bias, 0, &c);
    st = tf_child(*m, u, TF_QKV, "qkv", c, st);
  }
  if (st == GCAP_OK) {
    st = gcap_nn_dot_product_attention(e, num_heads, u->kv, o->attn_mask_type, o->attention_dropout,
                                       o->attn_impl, &c);
    st = tf_child(*m, u, TF_CORE, "core_attention", c, st);
  }
  if (st == GCAP_OK) {
    st = gcap_nn_linear(e, hidden, hidden, o->bias, 0, &c);
    st = tf_child(*m, u, TF_PROJ, "proj", c, st);
  }
  return gc_module_keep_or_free(m, st);
}

/* dropout(y) + r, the dropout skipped when p is 0. */
static gcap_status residual(gcap_tensor *y, double p, int training, gcap_tensor *r,
                            gcap_tensor **out) {
  gcap_tensor *d;
  gcap_status st;
  if (p == 0.0 || !training) return gcap_add(y, r, out);
  if ((st = gcap_dropout(y, p, training, &d)) != GCAP_OK) return st;
  st = gcap_add(d, r, out);
  gcap_tensor_free(d);
  return st;
}

/* Pre-LN: h = x + dropout(attention(x)); out = h + dropout(mlp(h)). */
static gcap_status tl_forward(void *ud, gcap_module *m, int nin, gcap_tensor *const *in,
                              gcap_tensor **out) {
  tf_mod *u = (tf_mod *)ud;
  gcap_tensor *a = NULL, *h = NULL, *f = NULL;
  int training = gcap_module_training(m);
  gcap_status st;
  if ((st = tf_mask_inputs(u, nin, 1, "x")) != GCAP_OK) return st;
  if ((st = gcap_module_call(u->c[TF_ATTN], nin, in, &a)) == GCAP_OK &&
      (st = residual(a, u->p_hid, training, in[0], &h)) == GCAP_OK &&
      (st = gcap_module_call(u->c[TF_MLP], 1, &h, &f)) == GCAP_OK)
    st = residual(f, u->p_hid, training, h, out);
  if (st == GCAP_OK) *gc_module_attn_slot(m) = *gc_module_attn_slot(u->c[TF_ATTN]);
  gcap_tensor_free(a);
  gcap_tensor_free(h);
  gcap_tensor_free(f);
  return st;
}

gcap_status gcap_nn_transformer_layer(gcap_engine *e, int64_t hidden, int64_t ffn_hidden,
                                      int num_heads, const gcap_transformer_opts *o,
                                      gcap_module **m) {
  static const char type[] = "TransformerLayer";
  gcap_transformer_opts def, attn;
  gcap_module *c = NULL;
  tf_mod *u;
  gcap_status st;
  if ((st = gc_module_start(e, type, m)) != GCAP_OK) return st;
  if (o == NULL) {
    gcap_transformer_opts_init(&def);
    o = &def;
  }
  if ((st = check_layer(e, type, hidden, num_heads, o)) != GCAP_OK ||
      (st = tf_positive(e, type, "ffn_hidden_size", ffn_hidden)) != GCAP_OK ||
      (st = tf_new(e, type, tl_forward, NULL, m, &u)) != GCAP_OK)
    return st;
  u->mask = o->attn_mask_type;
  u->mask_opt = "self_attn_mask_type";
  u->p_hid = o->hidden_dropout;
  attn = *o;
  attn.input_layernorm = 1;
  st = gcap_nn_multihead_attention(e, hidden, num_heads, &attn, &c);
  st = tf_child(*m, u, TF_ATTN, "self_attention", c, st);
  if (st == GCAP_OK) {
    st = gcap_nn_layer_norm_mlp(e, hidden, ffn_hidden, o->layernorm_epsilon, o->bias, 0, &c);
    st = tf_child(*m, u, TF_MLP, "layernorm_mlp", c, st);
  }
  return gc_module_keep_or_free(m, st);
}

/* ------------------------------------------------------------------------ */
/* Embedding                                                                 */

static gcap_status emb_forward(void *ud, gcap_module *m, int nin, gcap_tensor *const *in,
                               gcap_tensor **out) {
  tf_mod *u = (tf_mod *)ud;
  gcap_status st;
  (void)m;
  if ((st = tf_inputs(u, nin, 1, 1)) != GCAP_OK) return st;
  return gcap_embedding(in[0], u->p[TF_W1], out);
}

gcap_status gcap_nn_embedding(gcap_engine *e, int64_t num_embeddings, int64_t embedding_dim,
                              gcap_module **m) {
  static const char type[] = "Embedding";
  int64_t shape[2];
  gcap_tensor *w = NULL;
  tf_mod *u;
  gcap_status st;
  if ((st = gc_module_start(e, type, m)) != GCAP_OK) return st;
  if ((st = tf_positive(e, type, "num_embeddings", num_embeddings)) != GCAP_OK ||
      (st = tf_positive(e, type, "embedding_dim", embedding_dim)) != GCAP_OK ||
      (st = tf_new(e, type, emb_forward, NULL, m, &u)) != GCAP_OK)
    return st;
  shape[0] = num_embeddings;
  shape[1] = embedding_dim;
  st = gcap_tensor_rand(e, GCAP_F32, 2, shape, 1, &w);
  return gc_module_keep_or_free(m, tf_add(*m, u, TF_W1, "weight", w, st));
}
