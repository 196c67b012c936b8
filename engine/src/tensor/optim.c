/*
** optim.c: SGD, Adam and AdamW. State (momentum buffers, moments,
** per-parameter step counts, as in PyTorch, and the learning rate) lives in
** device tensors allocated and zeroed when the optimizer is made, and the
** update is one kernel per parameter that reads them when it runs, so a step
** captured even as the very first one replays exactly: each replay reads and
** advances the same device state an eager step would, and follows the
** learning rate set since (PyTorch's capturable = True).
*/
#include <stdlib.h>
#include <string.h>

#include "tensor.h"

enum { SGD, ADAM, ADAMW };

struct gcap_optim {
  gcap_engine *e;
  int kind; /* SGD, ADAM or ADAMW */
  int n;
  gcap_tensor **params;
  gcap_tensor **s1, **s2; /* momentum buffer / Adam m, v */
  gcap_tensor **step;     /* Adam: per-parameter step count (f32, one element) */
  gcap_tensor *lr_t;      /* the learning rate the kernels read (f32, 0-D) */
  double lr, momentum, beta1, beta2, eps, weight_decay;
};

/* The hyperparameters v[n], named name[n]: each >= 0, and below 1 where bit i
** of below1 is set; else GCAP_EINVAL naming the first that is not, and `rule`. */
static gcap_status hyper_check(gcap_engine *e, const char *op, int n, const double *v,
                               const char *const *name, unsigned below1, const char *rule) {
  int i;
  for (i = 0; i < n; i++)
    if (!(v[i] >= 0.0 && (!(below1 >> i & 1u) || v[i] < 1.0)))
      return gc_fail(e, GCAP_EINVAL, "%s: %s is %g; %s", op, name[i], v[i], rule);
  return GCAP_OK;
}

static gcap_status zeros_like(gcap_tensor *p, gcap_tensor **out) {
  return gcap_tensor_full(p->e, p->dt, p->ndim, p->shape, 0.0, out);
}

/* All state, zeroed now (outside any capture, normally), so that no captured
** step carries its own initialization. */
static gcap_status optim_state(gcap_optim *o, gcap_optim **out) {
  int adam = o->kind != SGD;
  gcap_status st = gcap_tensor_full(o->e, GCAP_F32, 0, NULL, o->lr, &o->lr_t);
  int i;
  for (i = 0; i < o->n && st == GCAP_OK; i++) {
    if (adam || o->momentum != 0.0) st = zeros_like(o->params[i], &o->s1[i]);
    if (st == GCAP_OK && adam) st = zeros_like(o->params[i], &o->s2[i]);
    if (st == GCAP_OK && adam) st = gcap_tensor_full(o->e, GCAP_F32, 0, NULL, 0.0, &o->step[i]);
  }
  if (st != GCAP_OK) {
    gcap_optim_free(o);
    return st;
  }
  *out = o;
  return GCAP_OK;
}

/* SGD (h: lr, momentum, weight_decay), Adam or AdamW (h: lr, beta1, beta2,
** eps, weight_decay) over params[n], into *out. */
static gcap_status optim_new(gcap_engine *e, int kind, int n, gcap_tensor *const *params,
                             const double *h, gcap_optim **out) {
  static const char *const sgd_names[3] = {"lr", "momentum", "weight_decay"};
  static const char *const adam_names[5] = {"lr", "beta1", "beta2", "eps", "weight_decay"};
  static const char *const ops[3] = {"SGD", "Adam", "AdamW"};
  const char *op = ops[kind];
  int adam = kind != SGD;
  gcap_optim *o;
  gcap_status st;
  int i;
  if (out != NULL) *out = NULL;
  if (e == NULL) return GCAP_EINVAL;
  if ((st = gc_check_open(e, op)) != GCAP_OK) return st;
  if (out == NULL) return gc_null(e, op, "out");
  if ((st = adam ? hyper_check(e, op, 5, h, adam_names, 6u,
                               "need lr >= 0, betas in [0, 1), eps >= 0, weight_decay >= 0")
                 : hyper_check(e, op, 3, h, sgd_names, 0u,
                               "lr, momentum and weight_decay must be >= 0")) != GCAP_OK)
    return st;
  if (n < 0) return gc_bad_count(e, op, "n", n);
  if (n > 0 && params == NULL) return gc_null(e, op, "params");
  for (i = 0; i < n; i++) {
    if (params[i] == NULL || params[i]->e != e)
      return gc_fail(e, GCAP_EINVAL, "%s: parameter #%d %s", op, i + 1,
                     params[i] ? "belongs to another engine" : "is NULL");
    if (params[i]->grad_fn != NULL)
      return gc_fail(e, GCAP_EINVAL, "%s: parameter #%d is not a leaf (made by '%s')", op, i + 1,
                     params[i]->grad_fn->name);
  }
  if ((o = (gcap_optim *)gc_calloc(1, sizeof *o)) == NULL ||
      (o->params = (gcap_tensor **)gc_calloc((size_t)n + 1, sizeof *o->params)) == NULL ||
      (o->s1 = (gcap_tensor **)gc_calloc((size_t)n + 1, sizeof *o->s1)) == NULL ||
      (o->s2 = (gcap_tensor **)gc_calloc((size_t)n + 1, sizeof *o->s2)) == NULL ||
      (o->step = (gcap_tensor **)gc_calloc((size_t)n + 1, sizeof *o->step)) == NULL) {
    if (o) {
      free(o->params);
      free(o->s1);
      free(o->s2);
    }
    free(o);
    return gc_fail(e, GCAP_ENOMEM, "%s: out of host memory", op);
  }
  o->e = e;
  o->kind = kind;
  o->n = n;
  for (i = 0; i < n; i++)
    o->params[i] = gcap_tensor_retain(params[i]);
  o->lr = h[0];
  o->momentum = adam ? 0.0 : h[1];
  o->beta1 = adam ? h[1] : 0.0;
  o->beta2 = adam ? h[2] : 0.0;
  o->eps = adam ? h[3] : 0.0;
  o->weight_decay = h[adam ? 4 : 2];
  gc_engine_ref(e);
  return optim_state(o, out);
}

gcap_status gcap_optim_sgd(gcap_engine *e, int n, gcap_tensor *const *params, double lr,
                           double momentum, double weight_decay, gcap_optim **out) {
  const double h[3] = {lr, momentum, weight_decay};
  return optim_new(e, SGD, n, params, h, out);
}

gcap_status gcap_optim_adam(gcap_engine *e, int n, gcap_tensor *const *params, double lr,
                            double beta1, double beta2, double eps, double weight_decay,
                            gcap_optim **out) {
  const double h[5] = {lr, beta1, beta2, eps, weight_decay};
  return optim_new(e, ADAM, n, params, h, out);
}

gcap_status gcap_optim_adamw(gcap_engine *e, int n, gcap_tensor *const *params, double lr,
                             double beta1, double beta2, double eps, double weight_decay,
                             gcap_optim **out) {
  const double h[5] = {lr, beta1, beta2, eps, weight_decay};
  return optim_new(e, ADAMW, n, params, h, out);
}

gcap_status gcap_optim_set_lr(gcap_optim *o, double lr) {
  static const char *const name[1] = {"lr"};
  gcap_status st;
  if (o == NULL) return GCAP_EINVAL;
  gc_clear(o->e);
  if ((st = hyper_check(o->e, "set_lr", 1, &lr, name, 0u, "need lr >= 0")) != GCAP_OK ||
      (st = gc_check_not_capturing(o->e, "set_lr: setting the learning rate")) != GCAP_OK ||
      (st = gcap_fill_(o->lr_t, lr)) != GCAP_OK)
    return st;
  o->lr = lr;
  return GCAP_OK;
}

double gcap_optim_lr(const gcap_optim *o) {
  return o != NULL ? o->lr : 0.0;
}

void gcap_optim_free(gcap_optim *o) {
  gcap_engine *e;
  int i;
  if (o == NULL) return;
  e = o->e;
  for (i = 0; i < o->n; i++) {
    gcap_tensor_free(o->params[i]);
    gcap_tensor_free(o->s1[i]);
    gcap_tensor_free(o->s2[i]);
    gcap_tensor_free(o->step[i]);
  }
  gcap_tensor_free(o->lr_t);
  free(o->params);
  free(o->s1);
  free(o->s2);
  free(o->step);
  free(o);
  gc_engine_unref(e);
}

gcap_status gcap_optim_step(gcap_optim *o) {
  gcap_engine *e;
  gcap_status st;
  gc_kargs a;
  int i;
  if (o == NULL) return GCAP_EINVAL;
  e = o->e;
  gc_clear(e);
  for (i = 0; i < o->n; i++) {
    gcap_tensor *p = o->params[i], *in[5];
    if (p->grad == NULL) continue;
    if (o->kind != SGD) { /* this parameter's step count, as PyTorch keeps one per parameter */
      memset(&a, 0, sizeof a);
      a.p[0] = gc_tensor_ptr(o->step[i]);
      if ((st = gc_run(e, GC_K_COUNTER_INC, &a, &o->step[i], 1, o->step[i])) != GCAP_OK) return st;
    }
    memset(&a, 0, sizeof a);
    a.p[0] = gc_tensor_ptr(p);
    a.p[1] = gc_tensor_ptr(p->grad);
    a.p[2] = o->s1[i] ? gc_tensor_ptr(o->s1[i]) : NULL;
    a.n[0] = p->numel;
    in[0] = p->grad;
    in[1] = o->s1[i] ? o->s1[i] : p->grad;
    in[4] = o->lr_t;
    if (o->kind != SGD) {
      a.p[3] = gc_tensor_ptr(o->s2[i]);
      a.p[4] = gc_tensor_ptr(o->step[i]);
      a.p[5] = gc_tensor_ptr(o->lr_t);
      a.n[1] = o->kind == ADAMW;
      a.f[1] = (float)o->beta1;
      a.f[2] = (float)o->beta2;
      a.f[3] = (float)o->eps;
      a.f[4] = (float)o->weight_decay;
      in[2] = o->s2[i];
      in[3] = o->step[i];
      if ((st = gc_note_access(e, o->s2[i], 1)) != GCAP_OK) return st;
    } else {
      a.p[3] = gc_tensor_ptr(o->lr_t);
      a.f[1] = (float)o->momentum;
      a.f[2] = (float)o->weight_decay;
      in[2] = in[3] = p->grad;
    }
    if (o->s1[i] && (st = gc_note_access(e, o->s1[i], 1)) != GCAP_OK) return st;
    if ((st = gc_run(e, o->kind != SGD ? GC_K_ADAM : GC_K_SGD, &a, in, 5, p)) != GCAP_OK) return st;
  }
  return GCAP_OK;
}

gcap_status gcap_optim_zero_grad(gcap_optim *o, int set_to_none) {
  gcap_status st;
  int i;
  if (o == NULL) return GCAP_EINVAL;
  gc_clear(o->e);
  for (i = 0; i < o->n; i++) {
    if ((st = gc_zero_grad(o->params[i], set_to_none)) != GCAP_OK) return st;
  }
  return GCAP_OK;
}

int gcap_optim_num_params(const gcap_optim *o) {
  return o ? o->n : 0;
}

gcap_tensor *gcap_optim_param(const gcap_optim *o, int i) {
  return o && i >= 0 && i < o->n ? o->params[i] : NULL;
}

gcap_tensor *gcap_optim_state(const gcap_optim *o, int i, int k, const char **name) {
  static const char *const sgd_names[1] = {"momentum_buffer"};
  static const char *const adam_names[3] = {"step", "exp_avg", "exp_avg_sq"};
  gcap_tensor *t = NULL;
  if (o == NULL || i < 0 || i >= o->n || k < 0) return NULL;
  if (o->kind != SGD)
    t = k == 0 ? o->step[i] : k == 1 ? o->s1[i] : k == 2 ? o->s2[i] : NULL;
  else if (k == 0)
    t = o->s1[i];
  if (t != NULL && name != NULL) *name = o->kind != SGD ? adam_names[k] : sgd_names[k];
  return t;
}

/* PyTorch's name of o's kind, for messages. */
static const char *optim_name(const gcap_optim *o) {
  return o->kind == SGD ? "SGD" : o->kind == ADAM ? "Adam" : "AdamW";
}

/* The hyperparameter `name` of o, or NULL when o has none of that name. */
static double *hyper_of(gcap_optim *o, const char *name) {
  if (strcmp(name, "lr") == 0) return &o->lr;
  if (strcmp(name, "weight_decay") == 0) return &o->weight_decay;
  if (o->kind == SGD) return strcmp(name, "momentum") == 0 ? &o->momentum : NULL;
  if (strcmp(name, "beta1") == 0) return &o->beta1;
  if (strcmp(name, "beta2") == 0) return &o->beta2;
  return strcmp(name, "eps") == 0 ? &o->eps : NULL;
}

gcap_status gcap_optim_hyper(const gcap_optim *o, const char *name, double *v) {
  const double *h;
  if (o == NULL) return GCAP_EINVAL;
  gc_clear(o->e);
  if (name == NULL) return gc_null(o->e, "hyper", "name");
  if (v == NULL) return gc_null(o->e, "hyper", "v");
  if ((h = hyper_of((gcap_optim *)o, name)) == NULL)
    return gc_fail(o->e, GCAP_EINVAL, "hyper: %s has no hyperparameter '%s'", optim_name(o), name);
  *v = *h;
  return GCAP_OK;
}

gcap_status gcap_optim_set_hyper(gcap_optim *o, const char *name, double v) {
  const char *op;
  double *h;
  gcap_status st;
  int i, beta;
  if (o == NULL) return GCAP_EINVAL;
  gc_clear(o->e);
  op = optim_name(o);
  if (name == NULL) return gc_null(o->e, "set_hyper", "name");
  if (strcmp(name, "lr") == 0) return gcap_optim_set_lr(o, v); /* where the kernels read it */
  if ((h = hyper_of(o, name)) == NULL)
    return gc_fail(o->e, GCAP_EINVAL, "set_hyper: %s has no hyperparameter '%s'", op, name);
  beta = h == &o->beta1 || h == &o->beta2;
  if ((st = hyper_check(o->e, op, 1, &v, &name, beta ? 1u : 0u,
                        beta ? "betas must be in [0, 1)" : "it must be >= 0")) != GCAP_OK)
    return st;
  /* SGD given momentum: its buffers, zeroed now (outside a capture) */
  for (i = 0; h == &o->momentum && v != 0.0 && i < o->n; i++)
    if (o->s1[i] == NULL &&
        ((st = gc_check_not_capturing(o->e, "set_hyper: allocating SGD's momentum buffers")) !=
             GCAP_OK ||
         (st = zeros_like(o->params[i], &o->s1[i])) != GCAP_OK))
      return st;
  *h = v;
  return GCAP_OK;
}
