/*
** transformer.c: the transformer modules, under TransformerEngine's names
** and parameter names: LayerNormLinear, LayerNormMLP (optionally
** checkpointed: its activations recomputed in backward). Each is a module
** whose forward is C over graphcap's ops, its parameters registered on the
** module itself (layer_norm_weight, fc1_weight, ...) and borrowed by its ud.
*/
#include <math.h>
#include <stdlib.h>

#include "train.h"

/* Parameter slots of a module's ud */
enum { TF_LNW, TF_LNB, TF_W1, TF_B1, TF_W2, TF_B2, TF_NP };

typedef struct tf_mod {
  gcap_engine *e;
  const char *type; /* the module's type name (static) */
  double eps;
  int ret_ln;            /* LayerNormLinear: also return the layer norm's output */
  int checkpoint;        /* LayerNormMLP: recompute activations in backward */
  gcap_tensor *p[TF_NP]; /* borrowed from the module's parameters; NULL: none */
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
  (void)m;
  *nout = 0;
  if ((st = tf_inputs(u, nin, 1, 1)) != GCAP_OK) return st;
  if ((st = gcap_layer_norm(in[0], u->p[TF_LNW], u->p[TF_LNB], u->eps, &ln)) != GCAP_OK) return st;
  if ((st = gcap_linear(ln, u->p[TF_W1], u->p[TF_B1], &out[0])) != GCAP_OK) {
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
  if (m == NULL) return GCAP_EINVAL;
  *m = NULL;
  if (e == NULL) return GCAP_EINVAL;
  if ((st = tf_positive(e, type, "in_features", in)) != GCAP_OK ||
      (st = tf_positive(e, type, "out_features", out)) != GCAP_OK ||
      (st = tf_new(e, type, NULL, lnl_forward, m, &u)) != GCAP_OK)
    return st;
  u->eps = eps;
  u->ret_ln = return_layernorm_output != 0;
  if ((st = tf_ln_params(e, *m, u, in)) != GCAP_OK ||
      (st = tf_linear_params(e, *m, u, TF_W1, "weight", "bias", in, out, bias)) != GCAP_OK) {
    gcap_module_free(*m);
    *m = NULL;
  }
  return st;
}

/* ------------------------------------------------------------------------ */
/* LayerNormMLP                                                              */

/* fc2(gelu(fc1(layer_norm(x)))) with the parameters p[TF_NP]; the fc1 and
** gelu pair is one op (gcap_linear_gelu). */
static gcap_status mlp_run(gcap_tensor *x, gcap_tensor *const *p, double eps, gcap_tensor **out) {
  gcap_tensor *ln, *h;
  gcap_status st;
  *out = NULL;
  if ((st = gcap_layer_norm(x, p[TF_LNW], p[TF_LNB], eps, &ln)) != GCAP_OK) return st;
  st = gcap_linear_gelu(ln, p[TF_W1], p[TF_B1], &h);
  gcap_tensor_free(ln);
  if (st != GCAP_OK) return st;
  st = gcap_linear(h, p[TF_W2], p[TF_B2], out);
  gcap_tensor_free(h);
  return st;
}

/* A checkpointed call's node: the parameters it ran with (held) and
** whether x needed a grad; x itself is its saved tensor. */
typedef struct mlp_ckpt {
  gcap_tensor *p[TF_NP];
  double eps;
  int xgrad;
} mlp_ckpt;

static void ckpt_free(void *ud) {
  mlp_ckpt *c = (mlp_ckpt *)ud;
  int i;
  for (i = 0; i < TF_NP; i++)
    gcap_tensor_free(c->p[i]);
  free(c);
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
  st = leaf_of(saved[0], c->xgrad, &leaf[0]);
  for (i = 0; st == GCAP_OK && i < TF_NP; i++)
    st = leaf_of(c->p[i], 1, &leaf[1 + i]);
  if (st == GCAP_OK) {
    was = gcap_set_grad_enabled(e, 1);
    if ((st = mlp_run(leaf[0], leaf + 1, c->eps, &y)) == GCAP_OK) st = gcap_backward(y, g, 0);
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

/* The checkpointed forward: run without recording, then record one node
** whose inputs are x and the parameters, saving x alone. */
static gcap_status mlp_checkpointed(tf_mod *u, gcap_tensor *x, gcap_tensor **out) {
  gcap_tensor *y, *in[1 + TF_NP];
  mlp_ckpt *c;
  gcap_status st;
  int i, was = gcap_set_grad_enabled(u->e, 0);
  st = mlp_run(x, u->p, u->eps, &y);
  gcap_set_grad_enabled(u->e, was);
  if (st != GCAP_OK) return st;
  if ((c = (mlp_ckpt *)gc_calloc(1, sizeof *c)) == NULL) {
    gcap_tensor_free(y);
    return gc_fail(u->e, GCAP_ENOMEM, "%s: out of host memory", u->type);
  }
  c->eps = u->eps;
  c->xgrad = gcap_tensor_requires_grad(x);
  in[0] = x;
  for (i = 0; i < TF_NP; i++) {
    in[1 + i] = u->p[i];
    c->p[i] = u->p[i] ? gcap_tensor_retain(u->p[i]) : NULL;
  }
  st = gcap_autograd_record(u->type, y, 1 + TF_NP, in, 1, &x, ckpt_backward, c, ckpt_free, out);
  gcap_tensor_free(y);
  return st;
}

static gcap_status mlp_forward(void *ud, gcap_module *m, int nin, gcap_tensor *const *in,
                               gcap_tensor **out) {
  tf_mod *u = (tf_mod *)ud;
  gcap_status st;
  (void)m;
  if ((st = tf_inputs(u, nin, 1, 1)) != GCAP_OK) return st;
  return u->checkpoint ? mlp_checkpointed(u, in[0], out) : mlp_run(in[0], u->p, u->eps, out);
}

gcap_status gcap_nn_layer_norm_mlp(gcap_engine *e, int64_t hidden, int64_t ffn_hidden, double eps,
                                   int bias, int checkpoint, gcap_module **m) {
  static const char type[] = "LayerNormMLP";
  tf_mod *u;
  gcap_status st;
  if (m == NULL) return GCAP_EINVAL;
  *m = NULL;
  if (e == NULL) return GCAP_EINVAL;
  if ((st = tf_positive(e, type, "hidden_size", hidden)) != GCAP_OK ||
      (st = tf_positive(e, type, "ffn_hidden_size", ffn_hidden)) != GCAP_OK ||
      (st = tf_new(e, type, mlp_forward, NULL, m, &u)) != GCAP_OK)
    return st;
  u->eps = eps;
  u->checkpoint = checkpoint != 0;
  if ((st = tf_ln_params(e, *m, u, hidden)) != GCAP_OK ||
      (st = tf_linear_params(e, *m, u, TF_W1, "fc1_weight", "fc1_bias", hidden, ffn_hidden,
                             bias)) != GCAP_OK ||
      (st = tf_linear_params(e, *m, u, TF_W2, "fc2_weight", "fc2_bias", ffn_hidden, hidden,
                             bias)) != GCAP_OK) {
    gcap_module_free(*m);
    *m = NULL;
  }
  return st;
}
