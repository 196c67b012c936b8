/*
** nn.c: modules. A module is a forward function with named parameters,
** buffers, children, a training flag and four hook lists; the built-ins
** (Linear, ReLU, GELU, LayerNorm, Dropout, Sequential) are modules whose
** forward is C. Backward hooks ride on the autograd graph: calling a module
** with backward hooks puts its inputs and tensor outputs that require grad
** behind identity nodes whose backward runs them (see hook_call). A hook may
** replace what it is given (gcap_hook_return): the inputs, the outputs,
** grad_out or grad_in.
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train.h"

typedef struct mod_entry {
  char *name;
  gcap_tensor *t; /* parameters, buffers */
  gcap_module *m; /* children */
} mod_entry;

typedef struct mod_list {
  mod_entry *v;
  int n, cap;
} mod_list;

typedef struct mod_flat {
  uint64_t gen; /* the engine's module generation it was made at; 0: none */
  int n, cap;
  gcap_tensor **t;
  char **name;
} mod_flat;

typedef struct mod_hook {
  int id;
  gcap_hook_kind kind;
  gcap_module_hook fn;
  void *ud;
  void (*ud_free)(void *);
} mod_hook;

struct gcap_module {
  int refs;
  gcap_engine *e;
  char type[GC_NAMELEN];
  gcap_forward_fn forward;     /* one output, or NULL */
  gcap_forward_n_fn forward_n; /* several outputs, or NULL */
  void *ud;
  void (*ud_free)(void *);
  mod_list params, buffers, children;
  int training;
  mod_hook *hooks;
  int nhooks, caphooks, next_hook_id;
  /* built-ins */
  double eps, p;
  gc_wgrad_sink *wgrad;    /* a Linear that delays or fuses wgrad: its sink, else NULL */
  gc_wgrad_queue wq_aside; /* the user's delayed wgrads while make_graphed_callables runs */
  int aside;
  gc_route_fn route; /* where calls go instead of forward (a graphed replay), or NULL */
  void *route_ud;    /* its state (weak: the graphed object owns m) */
  int route_entry;
  mod_flat flat[2]; /* parameters, buffers: see flat_of */
};

static void flat_free(mod_flat *f);

static gcap_status module_new(gcap_engine *e, const char *type, gcap_forward_fn fwd,
                              gcap_forward_n_fn fwd_n, void *ud, void (*ud_free)(void *),
                              gcap_module **out) {
  gcap_module *m;
  gcap_status st;
  if (out == NULL) return GCAP_EINVAL;
  *out = NULL;
  if (e == NULL) return GCAP_EINVAL;
  if ((st = gc_check_open(e, type ? type : "module")) != GCAP_OK) return st;
  if (fwd == NULL && fwd_n == NULL)
    return gc_fail(e, GCAP_EINVAL, "module: forward function is NULL");
  if ((m = (gcap_module *)gc_calloc(1, sizeof *m)) == NULL)
    return gc_fail(e, GCAP_ENOMEM, "module: out of host memory");
  m->refs = 1;
  m->e = e;
  snprintf(m->type, sizeof m->type, "%s", type ? type : "Module");
  m->forward = fwd;
  m->forward_n = fwd_n;
  m->ud = ud;
  m->ud_free = ud_free;
  m->training = 1;
  m->next_hook_id = 1;
  gc_engine_ref(e);
  *out = m;
  return GCAP_OK;
}

gcap_status gcap_module_new(gcap_engine *e, const char *type, gcap_forward_fn fwd, void *ud,
                            void (*ud_free)(void *), gcap_module **out) {
  return module_new(e, type, fwd, NULL, ud, ud_free, out);
}

gcap_status gcap_module_new_n(gcap_engine *e, const char *type, gcap_forward_n_fn fwd, void *ud,
                              void (*ud_free)(void *), gcap_module **out) {
  return module_new(e, type, NULL, fwd, ud, ud_free, out);
}

gcap_module *gcap_module_retain(gcap_module *m) {
  if (m) m->refs++;
  return m;
}

static void list_free(mod_list *l) {
  int i;
  for (i = 0; i < l->n; i++) {
    free(l->v[i].name);
    gcap_tensor_free(l->v[i].t);
    gcap_module_free(l->v[i].m);
  }
  free(l->v);
}

void gcap_module_free(gcap_module *m) {
  gcap_engine *e;
  int i;
  if (m == NULL || --m->refs > 0) return;
  e = m->e;
  list_free(&m->params);
  list_free(&m->buffers);
  list_free(&m->children);
  for (i = 0; i < m->nhooks; i++)
    if (m->hooks[i].ud_free) m->hooks[i].ud_free(m->hooks[i].ud);
  free(m->hooks);
  gc_wgrad_sink_release(m->wgrad);
  flat_free(&m->flat[0]);
  flat_free(&m->flat[1]);
  if (m->ud_free) m->ud_free(m->ud);
  free(m);
  gc_engine_unref(e);
}

const char *gcap_module_type(const gcap_module *m) {
  return m ? m->type : "";
}

void *gcap_module_userdata(const gcap_module *m) {
  return m ? m->ud : NULL;
}

static int list_find(const mod_list *l, const char *name) {
  int i;
  for (i = 0; i < l->n; i++)
    if (strcmp(l->v[i].name, name) == 0) return i;
  return -1;
}

static gcap_status list_add(gcap_module *m, mod_list *l, const char *what, const char *name,
                            gcap_tensor *t, gcap_module *c) {
  char *copy;
  if (name == NULL || name[0] == '\0' || strchr(name, '.'))
    return gc_fail(m->e, GCAP_EINVAL, "%s: %s name must be non-empty, without '.'", m->type, what);
  if (list_find(&m->params, name) >= 0 || list_find(&m->buffers, name) >= 0 ||
      list_find(&m->children, name) >= 0)
    return gc_fail(m->e, GCAP_EINVAL, "%s: '%s' is already registered", m->type, name);
  if (l->n == l->cap) {
    int cap = l->cap ? 2 * l->cap : 4;
    mod_entry *v = (mod_entry *)gc_realloc(l->v, (size_t)cap * sizeof *v);
    if (v == NULL) return gc_fail(m->e, GCAP_ENOMEM, "%s: out of host memory", m->type);
    l->v = v;
    l->cap = cap;
  }
  if ((copy = (char *)gc_malloc(strlen(name) + 1)) == NULL)
    return gc_fail(m->e, GCAP_ENOMEM, "%s: out of host memory", m->type);
  strcpy(copy, name);
  l->v[l->n].name = copy;
  l->v[l->n].t = gcap_tensor_retain(t);
  l->v[l->n].m = gcap_module_retain(c);
  l->n++;
  m->e->module_gen++; /* every module's flattened lists may have changed */
  return GCAP_OK;
}

gcap_status gcap_module_add_parameter(gcap_module *m, const char *name, gcap_tensor *t) {
  if (m == NULL || t == NULL) return GCAP_EINVAL;
  gc_clear(m->e);
  if (t->e != m->e)
    return gc_fail(m->e, GCAP_EINVAL, "%s: parameter '%s' belongs to another engine", m->type,
                   name ? name : "?");
  if (t->grad_fn != NULL)
    return gc_fail(m->e, GCAP_EINVAL, "%s: parameter '%s' must be a leaf (it was made by '%s')",
                   m->type, name ? name : "?", t->grad_fn->name);
  t->requires_grad = 1;
  return list_add(m, &m->params, "parameter", name, t, NULL);
}

gcap_status gcap_module_add_buffer(gcap_module *m, const char *name, gcap_tensor *t) {
  if (m == NULL || t == NULL) return GCAP_EINVAL;
  gc_clear(m->e);
  if (t->e != m->e)
    return gc_fail(m->e, GCAP_EINVAL, "%s: buffer '%s' belongs to another engine", m->type,
                   name ? name : "?");
  return list_add(m, &m->buffers, "buffer", name, t, NULL);
}

static int module_contains(const gcap_module *m, const gcap_module *c) {
  int i;
  if (m == c) return 1;
  for (i = 0; i < m->children.n; i++)
    if (module_contains(m->children.v[i].m, c)) return 1;
  return 0;
}

gcap_status gcap_module_add_child(gcap_module *m, const char *name, gcap_module *child) {
  if (m == NULL || child == NULL) return GCAP_EINVAL;
  gc_clear(m->e);
  if (child->e != m->e)
    return gc_fail(m->e, GCAP_EINVAL, "%s: child '%s' belongs to another engine", m->type,
                   name ? name : "?");
  if (module_contains(child, m))
    return gc_fail(m->e, GCAP_EINVAL, "%s: child '%s' would make a cycle", m->type,
                   name ? name : "?");
  return list_add(m, &m->children, "child", name, NULL, child);
}

/*
** The parameters (buffers = 0) or buffers of m and its children, depth
** first, each module and each tensor once, under the first dotted name it is
** reached by (as PyTorch's named_parameters): a tied weight or a child
** registered twice is listed, and so stepped by an optimizer, once. The list
** is made once and kept until a module of the engine registers something
** (the engine's module generation changes), so that walking it by index is
** cheap: zero_grad, optimizers and graphing all do.
*/
typedef struct walk_state {
  mod_flat *f;
  int buffers;
  const void **seen; /* modules met so far */
  int nseen, capseen;
  char path[256];
} walk_state;

/* 1 when p is in v[0..n); 0 otherwise. */
static int seen_in(const void *const *v, int n, const void *p) {
  int k;
  for (k = 0; k < n; k++)
    if (v[k] == p) return 1;
  return 0;
}

static int walk(const gcap_module *m, walk_state *w, size_t at) {
  const mod_list *l = w->buffers ? &m->buffers : &m->params;
  mod_flat *f = w->f;
  int j;
  if (seen_in(w->seen, w->nseen, m)) return 1;
  if (w->nseen == w->capseen) {
    int cap = w->capseen ? 2 * w->capseen : 16;
    const void **v = (const void **)gc_realloc((void *)w->seen, (size_t)cap * sizeof *v);
    if (v == NULL) return 0;
    w->seen = v;
    w->capseen = cap;
  }
  w->seen[w->nseen++] = m;
  for (j = 0; j < l->n; j++) {
    if (seen_in((const void *const *)f->t, f->n, l->v[j].t)) continue;
    if (f->n == f->cap) {
      int cap = f->cap ? 2 * f->cap : 16;
      gcap_tensor **t = (gcap_tensor **)gc_realloc(f->t, (size_t)cap * sizeof *t);
      char **nm;
      if (t == NULL) return 0;
      f->t = t;
      if ((nm = (char **)gc_realloc(f->name, (size_t)cap * sizeof *nm)) == NULL) return 0;
      f->name = nm;
      f->cap = cap;
    }
    snprintf(w->path + at, sizeof w->path - at, "%s", l->v[j].name);
    if ((f->name[f->n] = (char *)gc_malloc(strlen(w->path) + 1)) == NULL) return 0;
    strcpy(f->name[f->n], w->path);
    f->t[f->n++] = l->v[j].t;
  }
  for (j = 0; j < m->children.n; j++) {
    int len = snprintf(w->path + at, sizeof w->path - at, "%s.", m->children.v[j].name);
    size_t next = at + (len > 0 ? (size_t)len : 0);
    if (!walk(m->children.v[j].m, w, next < sizeof w->path ? next : sizeof w->path - 1)) return 0;
  }
  return 1;
}

static void flat_clear(mod_flat *f) {
  int k;
  for (k = 0; k < f->n; k++)
    free(f->name[k]);
  f->n = 0;
  f->gen = 0;
}

static void flat_free(mod_flat *f) {
  flat_clear(f);
  free(f->t);
  free(f->name);
}

/* m's list, made anew when the engine's modules changed since. The cache is
** not part of what m means: filling it through a const pointer is fine. */
static const mod_flat *flat_of(const gcap_module *m, int buffers) {
  mod_flat *f = (mod_flat *)&m->flat[buffers];
  if (f->gen != m->e->module_gen) {
    walk_state w;
    flat_clear(f);
    memset(&w, 0, sizeof w);
    w.f = f;
    w.buffers = buffers;
    if (walk(m, &w, 0))
      f->gen = m->e->module_gen;
    else
      flat_clear(f); /* out of memory: an empty list, made again next time */
    free((void *)w.seen);
  }
  return f;
}

static gcap_tensor *flat_at(const gcap_module *m, int buffers, int i, char *name, size_t n) {
  const mod_flat *f;
  if (m == NULL || i < 0) return NULL;
  f = flat_of(m, buffers);
  if (i >= f->n) return NULL;
  if (name && n > 0) snprintf(name, n, "%s", f->name[i]);
  return f->t[i];
}

int gcap_module_num_parameters(const gcap_module *m) {
  return m ? flat_of(m, 0)->n : 0;
}

gcap_tensor *gcap_module_parameter(const gcap_module *m, int i, char *name, size_t n) {
  return flat_at(m, 0, i, name, n);
}

int gcap_module_num_buffers(const gcap_module *m) {
  return m ? flat_of(m, 1)->n : 0;
}

gcap_tensor *gcap_module_buffer(const gcap_module *m, int i, char *name, size_t n) {
  return flat_at(m, 1, i, name, n);
}

int gcap_module_num_children(const gcap_module *m) {
  return m ? m->children.n : 0;
}

gcap_module *gcap_module_child(const gcap_module *m, int i, const char **name) {
  if (m == NULL || i < 0 || i >= m->children.n) return NULL;
  if (name) *name = m->children.v[i].name;
  return m->children.v[i].m;
}

void gcap_module_train(gcap_module *m, int on) {
  int j;
  if (m == NULL) return;
  m->training = on != 0;
  for (j = 0; j < m->children.n; j++)
    gcap_module_train(m->children.v[j].m, on);
}

int gcap_module_training(const gcap_module *m) {
  return m != NULL && m->training;
}

/* ------------------------------------------------------------------------ */
/* Hooks                                                                     */

/* The one table of the hook kinds' names, by gcap_hook_kind. */
static const struct {
  const char *name, *group_key;
} hook_kinds[GCAP_HOOK_KINDS] = {
    {"forward pre-hook", "forward_pre_hooks"},
    {"forward hook", "forward_hooks"},
    {"backward pre-hook", "backward_pre_hooks"},
    {"backward hook", "backward_hooks"},
};

const char *gcap_hook_kind_name(gcap_hook_kind kind) {
  return kind >= 0 && kind < GCAP_HOOK_KINDS ? hook_kinds[kind].name : "";
}

const char *gcap_hook_group_key(gcap_hook_kind kind) {
  return kind >= 0 && kind < GCAP_HOOK_KINDS ? hook_kinds[kind].group_key : "";
}

gcap_status gcap_module_register_hook(gcap_module *m, gcap_hook_kind kind, gcap_module_hook fn,
                                      void *ud, void (*ud_free)(void *), int *id) {
  if (id) *id = 0;
  if (m == NULL) return GCAP_EINVAL;
  gc_clear(m->e);
  if (fn == NULL || kind < GCAP_HOOK_FORWARD_PRE || kind > GCAP_HOOK_BACKWARD)
    return gc_fail(m->e, GCAP_EINVAL, "%s: register hook: bad kind or NULL function", m->type);
  if (m->nhooks == m->caphooks) {
    int cap = m->caphooks ? 2 * m->caphooks : 4;
    mod_hook *v = (mod_hook *)gc_realloc(m->hooks, (size_t)cap * sizeof *v);
    if (v == NULL) return gc_fail(m->e, GCAP_ENOMEM, "%s: out of host memory", m->type);
    m->hooks = v;
    m->caphooks = cap;
  }
  m->hooks[m->nhooks].id = m->next_hook_id;
  m->hooks[m->nhooks].kind = kind;
  m->hooks[m->nhooks].fn = fn;
  m->hooks[m->nhooks].ud = ud;
  m->hooks[m->nhooks].ud_free = ud_free;
  m->nhooks++;
  if (id) *id = m->next_hook_id;
  m->next_hook_id++;
  return GCAP_OK;
}

gcap_status gcap_module_remove_hook(gcap_module *m, int id) {
  int i;
  if (m == NULL) return GCAP_EINVAL;
  gc_clear(m->e);
  for (i = 0; i < m->nhooks; i++)
    if (m->hooks[i].id == id) {
      if (m->hooks[i].ud_free) m->hooks[i].ud_free(m->hooks[i].ud);
      memmove(m->hooks + i, m->hooks + i + 1, (size_t)(m->nhooks - i - 1) * sizeof *m->hooks);
      m->nhooks--;
      return GCAP_OK;
    }
  return GCAP_OK; /* removing twice is harmless, as in PyTorch */
}

int gcap_module_num_hooks(const gcap_module *m, gcap_hook_kind kind) {
  int i, c = 0;
  for (i = 0; m && i < m->nhooks; i++)
    c += m->hooks[i].kind == kind;
  return c;
}

/* The shape and dtype a grad must have, and whether its tensor takes one. */
typedef struct hook_slot {
  int needs; /* the tensor requires grad */
  int ndim;
  int64_t shape[GCAP_MAXDIM];
  gcap_dtype dt;
} hook_slot;

/* What the running hook returned through gcap_hook_return (references),
** and what its kind may return: for the backward kinds, nwant grads laid
** out as want[] (NULL for the forward kinds). */
struct gcap_hook_ret {
  int set; /* it called gcap_hook_return */
  int n, cap;
  gcap_tensor **t;
  gcap_module *m;
  const hook_slot *want;
  int nwant;
};

/* What the hooks of one kind returned: the last values accepted
** (references; the hook arguments point into t), and the running hook's. */
typedef struct hook_vals {
  int n;
  gcap_tensor **t;
  gcap_hook_ret ret;
} hook_vals;

/* Drop n references (NULL ones included). */
static void outs_free(int n, gcap_tensor **t) {
  int i;
  for (i = 0; i < n; i++)
    gcap_tensor_free(t[i]);
}

/* Drop n references and their array. */
static void refs_free(gcap_tensor **t, int n) {
  outs_free(n, t);
  free(t);
}

static void ret_free(gcap_hook_ret *r) {
  refs_free(r->t, r->n);
  r->t = NULL;
  r->n = r->cap = r->set = 0;
}

static void vals_free(hook_vals *v) {
  refs_free(v->t, v->n);
  v->n = 0;
  v->t = NULL;
  ret_free(&v->ret);
}

/* Is what a hook of a->kind returned (r) what that kind may return? */
static gcap_status check_return(const gcap_hook_args *a, const gcap_hook_ret *r) {
  static const char *const what[GCAP_HOOK_KINDS] = {"input", "output", "grad_output", "grad_input"};
  gcap_module *m = r->m;
  const char *kind = gcap_hook_kind_name(a->kind), *of = what[a->kind];
  const char *whose = a->kind == GCAP_HOOK_BACKWARD ? "input" : "tensor output";
  char b1[64], b2[64];
  int i;
  if (a->kind == GCAP_HOOK_FORWARD && r->n > GCAP_MAX_OUTPUTS)
    return gc_fail(m->e, GCAP_EINVAL, "%s: a %s returned %d outputs; at most %d", m->type, kind,
                   r->n, GCAP_MAX_OUTPUTS);
  if (r->want != NULL && r->n != r->nwant)
    return gc_fail(m->e, GCAP_EINVAL,
                   "%s: a %s must return %d %s%s (one per %s) or nothing, got %d", m->type, kind,
                   r->nwant, of, r->nwant == 1 ? "" : "s", whose, r->n);
  for (i = 0; i < r->n; i++) {
    const gcap_tensor *t = r->t[i];
    const hook_slot *w = r->want != NULL ? &r->want[i] : NULL;
    if (t == NULL) {
      if (a->kind == GCAP_HOOK_FORWARD_PRE)
        return gc_fail(m->e, GCAP_EINVAL, "%s: a %s returned NULL as input #%d; expected a tensor",
                       m->type, kind, i + 1);
      continue; /* an absent output, or no grad */
    }
    if (t->e != m->e)
      return gc_fail(m->e, GCAP_EINVAL, "%s: a %s returned a tensor of another engine as %s #%d",
                     m->type, kind, of, i + 1);
    if (w == NULL) continue;
    if (!w->needs)
      return gc_fail(m->e, GCAP_EINVAL,
                     "%s: a %s returned a tensor as %s #%d, but %s #%d needs no grad: the entry "
                     "must be absent (nil)",
                     m->type, kind, of, i + 1, whose, i + 1);
    if (t->ndim != w->ndim || t->dt != w->dt ||
        memcmp(t->shape, w->shape, (size_t)t->ndim * sizeof *t->shape) != 0)
      return gc_fail(m->e, GCAP_EINVAL,
                     "%s: a %s returned %s #%d of shape %s %s; expected shape %s %s, as the grad "
                     "it replaces",
                     m->type, kind, of, i + 1, gc_shape_str(t, b1, sizeof b1), gc_dtype_name(t->dt),
                     gc_dims_str(w->ndim, w->shape, b2, sizeof b2), gc_dtype_name(w->dt));
  }
  return GCAP_OK;
}

gcap_status gcap_hook_return(const gcap_hook_args *a, int n, gcap_tensor *const *t) {
  gcap_hook_ret *r;
  int i;
  if (a == NULL || (r = a->ret) == NULL || n < 0 || (n > 0 && t == NULL)) return GCAP_EINVAL;
  gc_clear(r->m->e);
  if (n > r->cap) {
    gcap_tensor **v = (gcap_tensor **)gc_realloc(r->t, (size_t)n * sizeof *v);
    if (v == NULL) return GCAP_ENOMEM;
    r->t = v;
    r->cap = n;
  }
  for (i = 0; i < n; i++) /* first: t may hold what the hook returned before */
    gcap_tensor_retain(t[i]);
  outs_free(r->n, r->t);
  for (i = 0; i < n; i++)
    r->t[i] = t[i];
  r->n = n;
  r->set = 1;
  return check_return(a, r); /* checked again when the hook returns */
}

/* Make what the hook returned (v->ret) the current values of a. */
static void accept_return(gcap_hook_args *a, hook_vals *v) {
  refs_free(v->t, v->n);
  v->n = v->ret.n;
  v->t = v->ret.t;
  v->ret.t = NULL;
  v->ret.n = v->ret.cap = v->ret.set = 0;
  switch (a->kind) {
    case GCAP_HOOK_FORWARD_PRE:
      a->nin = v->n;
      a->in = v->t;
      break;
    case GCAP_HOOK_FORWARD:
      a->nout = v->n;
      a->out = v->t;
      break;
    case GCAP_HOOK_BACKWARD_PRE:
      a->ngrad_out = v->n;
      a->grad_out = v->t;
      break;
    case GCAP_HOOK_BACKWARD:
      a->ngrad_in = v->n;
      a->grad_in = v->t;
      break;
  }
}

/* Run m's hooks of one kind in registration order; a hook may remove hooks,
** so the list is walked by id. A hook's returned values, once checked
** (backward kinds: nwant grads laid out as want[]), replace those in a for
** the next hooks and the caller; v keeps them (the caller frees it with
** vals_free, after its last use of a). */
static gcap_status run_hooks(gcap_module *m, gcap_hook_args *a, hook_vals *v, const hook_slot *want,
                             int nwant) {
  gcap_status st = GCAP_OK;
  int last = 0;
  a->ret = &v->ret;
  v->ret.m = m;
  v->ret.want = want;
  v->ret.nwant = nwant;
  for (;;) {
    int i, next = -1;
    for (i = 0; i < m->nhooks; i++)
      if (m->hooks[i].kind == a->kind && m->hooks[i].id > last &&
          (next < 0 || m->hooks[i].id < m->hooks[next].id))
        next = i;
    if (next < 0) break;
    last = m->hooks[next].id;
    v->ret.set = 0;
    if ((st = m->hooks[next].fn(m->hooks[next].ud, m, a)) != GCAP_OK) {
      if (m->e->err[0] == '\0')
        gc_fail(m->e, st, "%s: a %s failed (%s)", m->type, gcap_hook_kind_name(a->kind),
                gcap_status_str(st));
      break;
    }
    if (a->ret->set) { /* the hook called gcap_hook_return */
      if ((st = check_return(a, &v->ret)) != GCAP_OK) break;
      accept_return(a, v);
    }
  }
  ret_free(&v->ret); /* a return refused */
  a->ret = NULL;
  return st;
}

/*
** Backward hooks, as PyTorch's full ones: the inputs of a call that require
** grad are passed to the forward behind alias nodes, and so are its tensor
** outputs that require grad to the caller. The alias nodes of one side keep
** the grads they receive and lead to one join node, which runs once after
** all of them: the outputs' join runs the backward pre-hooks on the grads
** of all tensor outputs, the inputs' join the backward hooks on the grads of
** all inputs. A call whose inputs need no grad runs its backward hooks in
** the outputs' join, with no grad_input.
*/
typedef struct hook_call {
  int refs;
  gcap_module *m;
  int nin, nout;                 /* inputs, tensor outputs */
  hook_slot *in_slot, *out_slot; /* [nin], [nout] */
  gcap_tensor **gin, **gout;     /* [nin], [nout]: grads received (then as the hooks left them) */
  int inputs_tracked;            /* an input requires grad: the inputs' join runs the hooks */
} hook_call;

static void hook_call_release(void *ud) {
  hook_call *hc = (hook_call *)ud;
  if (--hc->refs > 0) return;
  refs_free(hc->gin, hc->nin);
  refs_free(hc->gout, hc->nout);
  free(hc->in_slot);
  free(hc->out_slot);
  gcap_module_free(hc->m);
  free(hc);
}

/* The n tensors t[] of one side of hc's call (NULL ones are no tensors):
** their slots and room for their grads. */
static int hook_slots(hook_call *hc, int side, int n, gcap_tensor *const *t) {
  hook_slot *s;
  gcap_tensor **g;
  int i, k = 0;
  for (i = 0; i < n; i++)
    k += t[i] != NULL;
  s = (hook_slot *)gc_calloc((size_t)k + 1, sizeof *s);
  g = (gcap_tensor **)gc_calloc((size_t)k + 1, sizeof *g);
  if (s == NULL || g == NULL) {
    free(s);
    free(g);
    return 0;
  }
  for (i = 0, k = 0; i < n; i++) {
    if (t[i] == NULL) continue;
    s[k].needs = t[i]->requires_grad;
    s[k].ndim = t[i]->ndim;
    memcpy(s[k].shape, t[i]->shape, sizeof s[k].shape);
    s[k].dt = t[i]->dt;
    k++;
  }
  if (side) {
    hc->out_slot = s, hc->gout = g, hc->nout = k;
  } else {
    hc->in_slot = s, hc->gin = g, hc->nin = k;
  }
  return 1;
}

/* Backward of the alias of slot n->k[0] of side n->k[1] (0: inputs, 1:
** outputs): keep its grad for the join. The first alias a pass reaches
** clears what an earlier pass left, and hands the join a grad (a 0-dim
** alias of its own: the join reads none), so that the join runs once. */
static gcap_status alias_backward(gc_node *n, gcap_tensor *g, gcap_tensor **gin) {
  hook_call *hc = (hook_call *)n->ud;
  int side = (int)n->k[1], slot = (int)n->k[0];
  gcap_tensor **gs = side ? hc->gout : hc->gin;
  if (gc_node_first_delivery(n->next[0])) {
    int i, ns = side ? hc->nout : hc->nin;
    for (i = 0; i < ns; i++) {
      gcap_tensor_free(gs[i]);
      gs[i] = NULL;
    }
    if ((gin[0] = gc_tensor_alias(g, 0, NULL)) == NULL)
      return gc_fail(g->e, GCAP_ENOMEM, "backward hook: out of host memory");
  }
  gcap_tensor_free(gs[slot]);
  gs[slot] = gcap_tensor_retain(g);
  return GCAP_OK;
}

/* Hand the grads of the slots that need one, gs[], to the join's inputs. */
static void join_pass(const hook_slot *slot, int n, gcap_tensor *const *gs, gcap_tensor **gin) {
  int i, k = 0;
  for (i = 0; i < n; i++)
    if (slot[i].needs) gin[k++] = gcap_tensor_retain(gs[i]);
}

/* Keep the n grads g[] in gs[] (references), unless they are gs[] already. */
static void grads_keep(gcap_tensor **gs, int n, gcap_tensor *const *g) {
  int i;
  if (g == gs) return;
  for (i = 0; i < n; i++) {
    gcap_tensor_retain(g[i]);
    gcap_tensor_free(gs[i]);
    gs[i] = g[i];
  }
}

/* The backward hooks of hc's call on the grads it holds. */
static gcap_status run_backward_hooks(hook_call *hc, gcap_hook_args *a, hook_vals *v) {
  gcap_status st;
  a->kind = GCAP_HOOK_BACKWARD;
  a->ngrad_in = hc->nin;
  a->grad_in = hc->gin;
  a->ngrad_out = hc->nout;
  a->grad_out = hc->gout;
  if ((st = run_hooks(hc->m, a, v, hc->in_slot, hc->nin)) == GCAP_OK)
    grads_keep(hc->gin, hc->nin, a->grad_in);
  return st;
}

static gcap_status out_join_backward(gc_node *n, gcap_tensor *g, gcap_tensor **gin) {
  hook_call *hc = (hook_call *)n->ud;
  hook_vals pre, post;
  gcap_hook_args a;
  gcap_status st;
  (void)g;
  memset(&pre, 0, sizeof pre);
  memset(&post, 0, sizeof post);
  memset(&a, 0, sizeof a);
  a.kind = GCAP_HOOK_BACKWARD_PRE;
  a.ngrad_out = hc->nout;
  a.grad_out = hc->gout;
  if ((st = run_hooks(hc->m, &a, &pre, hc->out_slot, hc->nout)) != GCAP_OK) goto done;
  grads_keep(hc->gout, hc->nout, a.grad_out); /* the backward hooks see these */
  if (!hc->inputs_tracked && (st = run_backward_hooks(hc, &a, &post)) != GCAP_OK) goto done;
  join_pass(hc->out_slot, hc->nout, hc->gout, gin);
done:
  vals_free(&pre);
  vals_free(&post);
  return st;
}

static gcap_status in_join_backward(gc_node *n, gcap_tensor *g, gcap_tensor **gin) {
  hook_call *hc = (hook_call *)n->ud;
  hook_vals v;
  gcap_hook_args a;
  gcap_status st;
  (void)g;
  memset(&v, 0, sizeof v);
  memset(&a, 0, sizeof a);
  if ((st = run_backward_hooks(hc, &a, &v)) == GCAP_OK)
    join_pass(hc->in_slot, hc->nin, hc->gin, gin);
  vals_free(&v);
  return st;
}

/* Record a node bw with ud hc on t. */
static gcap_status hook_record(gcap_tensor *t, const char *name, gc_backward_fn bw,
                               gcap_tensor *const *in, int nin, hook_call *hc, gc_node **n) {
  gcap_status st = gc_record(t, name, bw, in, nin, NULL, 0, n);
  if (st != GCAP_OK) return st;
  (*n)->ud = hc;
  (*n)->ud_free = hook_call_release;
  hc->refs++;
  return GCAP_OK;
}

/* Put the tensors of one side of hc's call (t[0..n), references; NULL ones
** skipped) that require grad behind alias nodes leading to one join,
** replacing them in t[]. The slots of the side are made already. */
static gcap_status hook_track(hook_call *hc, int side, int n, gcap_tensor **t) {
  gcap_tensor *small[8], **need = small, *join = NULL;
  gcap_status st = GCAP_OK;
  gc_node *jn;
  int i, k = 0, slot = 0;
  for (i = 0; i < n; i++)
    k += t[i] != NULL && t[i]->requires_grad;
  if (k == 0) return GCAP_OK;
  if (k > 8 && (need = (gcap_tensor **)gc_malloc((size_t)k * sizeof *need)) == NULL)
    return gc_fail(hc->m->e, GCAP_ENOMEM, "%s: out of host memory", hc->m->type);
  for (i = 0, k = 0; i < n; i++)
    if (t[i] != NULL && t[i]->requires_grad) need[k++] = t[i];
  if ((join = gc_tensor_alias(need[0], 0, NULL)) == NULL) {
    st = gc_fail(hc->m->e, GCAP_ENOMEM, "%s: out of host memory", hc->m->type);
    goto done;
  }
  st = hook_record(join, side ? "backward_hook outputs" : "backward_hook inputs",
                   side ? out_join_backward : in_join_backward, need, k, hc, &jn);
  for (i = 0; st == GCAP_OK && i < n; i++) {
    gcap_tensor *al;
    gc_node *an;
    if (t[i] == NULL) continue;
    if (t[i]->requires_grad) {
      if ((al = gc_tensor_alias(t[i], t[i]->ndim, t[i]->shape)) == NULL) {
        st = gc_fail(hc->m->e, GCAP_ENOMEM, "%s: out of host memory", hc->m->type);
        break;
      }
      if ((st = hook_record(al, "backward_hook", alias_backward, &join, 1, hc, &an)) != GCAP_OK) {
        gcap_tensor_free(al);
        break;
      }
      an->k[0] = slot;
      an->k[1] = side;
      gcap_tensor_free(t[i]);
      t[i] = al;
    }
    slot++;
  }
  if (st == GCAP_OK && !side) hc->inputs_tracked = 1;
done:
  gcap_tensor_free(join); /* the aliases' nodes hold its node */
  if (need != small) free(need);
  return st;
}

/* A forward that failed with a status and no message is named by its module. */
static gcap_status forward_failed(gcap_module *m, gcap_status st) {
  if (m->e->err[0] == '\0')
    gc_fail(m->e, st, "%s: forward failed (%s)", m->type, gcap_status_str(st));
  return st;
}

gcap_status gc_module_forward(gcap_module *m, int nin, gcap_tensor *const *in, int *nout,
                              gcap_tensor **out) {
  gcap_status st;
  *nout = 0;
  if (m->forward != NULL) {
    out[0] = NULL;
    if ((st = m->forward(m->ud, m, nin, in, out)) != GCAP_OK) return forward_failed(m, st);
    if (out[0] == NULL)
      return gc_fail(m->e, GCAP_EINVAL, "%s: forward returned no tensor", m->type);
    *nout = 1;
    return GCAP_OK;
  }
  if ((st = m->forward_n(m->ud, m, nin, in, nout, out)) != GCAP_OK) {
    *nout = 0; /* a failed forward gives no references */
    return forward_failed(m, st);
  }
  if (*nout < 0 || *nout > GCAP_MAX_OUTPUTS) {
    int n = *nout;
    *nout = 0;
    return gc_fail(m->e, GCAP_EINVAL, "%s: forward gave %d outputs; expected 0..%d", m->type, n,
                   GCAP_MAX_OUTPUTS);
  }
  return GCAP_OK;
}

/* The forward hooks of m on its outputs ys[0..*ny) (references, room for
** GCAP_MAX_OUTPUTS), which they may replace, and which must then fit
** maxout. */
static gcap_status run_forward_hooks(gcap_module *m, gcap_hook_args *a, hook_vals *v, int maxout,
                                     int *ny, gcap_tensor **ys) {
  gcap_status st;
  int i;
  a->kind = GCAP_HOOK_FORWARD;
  a->nout = *ny;
  a->out = ys;
  if ((st = run_hooks(m, a, v, NULL, 0)) != GCAP_OK) return st;
  if (a->out == ys) {
    if (*ny <= maxout) return GCAP_OK;
    return gc_fail(m->e, GCAP_EINVAL, "%s: forward gave %d outputs, room for %d", m->type, *ny,
                   maxout);
  }
  if (a->nout > maxout)
    return gc_fail(m->e, GCAP_EINVAL, "%s: a forward hook returned %d outputs, room for %d",
                   m->type, a->nout, maxout);
  outs_free(*ny, ys);
  for (i = 0; i < a->nout; i++)
    ys[i] = gcap_tensor_retain(a->out[i]);
  *ny = a->nout;
  return GCAP_OK;
}

gcap_status gcap_module_call_n(gcap_module *m, int nin, gcap_tensor *const *in, int maxout,
                               int *nout, gcap_tensor **out) {
  gcap_tensor *small[8], **args = small, *ys[GCAP_MAX_OUTPUTS];
  hook_vals pre, post;
  hook_call *hc = NULL;
  gcap_hook_args a;
  gcap_status st;
  int i, ny = 0, nargs = 0;
  memset(&pre, 0, sizeof pre);
  memset(&post, 0, sizeof post);
  if (out == NULL || nout == NULL) return GCAP_EINVAL;
  *nout = 0;
  if (m == NULL) return GCAP_EINVAL;
  gc_clear(m->e);
  if (maxout < 0) return gc_fail(m->e, GCAP_EINVAL, "%s: room for %d outputs", m->type, maxout);
  if (nin < 0 || (nin > 0 && in == NULL))
    return gc_fail(m->e, GCAP_EINVAL, "%s: %d inputs %s", m->type, nin,
                   nin < 0 ? "(a negative count)" : "but the input array is NULL");
  for (i = 0; i < nin; i++) {
    if (in[i] == NULL) return gc_fail(m->e, GCAP_EINVAL, "%s: input #%d is NULL", m->type, i + 1);
    if (in[i]->e != m->e)
      return gc_fail(m->e, GCAP_EINVAL, "%s: input #%d belongs to another engine", m->type, i + 1);
  }
  memset(&a, 0, sizeof a);
  a.kind = GCAP_HOOK_FORWARD_PRE;
  a.nin = nin;
  a.in = in;
  if ((st = run_hooks(m, &a, &pre, NULL, 0)) != GCAP_OK) goto done;
  /* the inputs the pre-hooks left, as references: backward hooks put
  ** aliases in their place */
  if (a.nin > 8 && (args = (gcap_tensor **)gc_malloc((size_t)a.nin * sizeof *args)) == NULL) {
    st = gc_fail(m->e, GCAP_ENOMEM, "%s: out of host memory", m->type);
    goto done;
  }
  for (nargs = 0; nargs < a.nin; nargs++)
    args[nargs] = gcap_tensor_retain(a.in[nargs]);
  if (m->e->grad_enabled && (gcap_module_num_hooks(m, GCAP_HOOK_BACKWARD_PRE) +
                             gcap_module_num_hooks(m, GCAP_HOOK_BACKWARD)) > 0) {
    if ((hc = (hook_call *)gc_calloc(1, sizeof *hc)) == NULL) {
      st = gc_fail(m->e, GCAP_ENOMEM, "%s: out of host memory", m->type);
      goto done;
    }
    hc->refs = 1;
    hc->m = gcap_module_retain(m);
    if (!hook_slots(hc, 0, nargs, args)) {
      st = gc_fail(m->e, GCAP_ENOMEM, "%s: out of host memory", m->type);
      goto done;
    }
    if ((st = hook_track(hc, 0, nargs, args)) != GCAP_OK) goto done;
  }
  st = m->route ? m->route(m->route_ud, m->route_entry, nargs, args, &ny, ys)
                : gc_module_forward(m, nargs, args, &ny, ys);
  if (st != GCAP_OK) goto done;
  if ((st = run_forward_hooks(m, &a, &post, maxout, &ny, ys)) != GCAP_OK) goto done;
  if (hc != NULL) {
    if (!hook_slots(hc, 1, ny, ys)) {
      st = gc_fail(m->e, GCAP_ENOMEM, "%s: out of host memory", m->type);
      goto done;
    }
    if ((st = hook_track(hc, 1, ny, ys)) != GCAP_OK) goto done;
  }
  for (i = 0; i < ny; i++)
    out[i] = ys[i];
  *nout = ny;
  ny = 0;
done:
  outs_free(ny, ys);
  outs_free(nargs, args);
  if (hc) hook_call_release(hc);
  if (args != small) free(args);
  vals_free(&pre);
  vals_free(&post);
  return st;
}

gcap_status gcap_module_call(gcap_module *m, int nin, gcap_tensor *const *in, gcap_tensor **out) {
  gcap_tensor *ys[GCAP_MAX_OUTPUTS];
  gcap_status st;
  int n;
  if (out == NULL) return GCAP_EINVAL;
  *out = NULL;
  if ((st = gcap_module_call_n(m, nin, in, GCAP_MAX_OUTPUTS, &n, ys)) != GCAP_OK) return st;
  if (n == 1 && ys[0] != NULL) {
    *out = ys[0];
    return GCAP_OK;
  }
  outs_free(n, ys);
  return gc_fail(m->e, GCAP_EINVAL,
                 "%s: forward gave %d outputs%s; this call takes one tensor (gcap_module_call_n "
                 "takes several)",
                 m->type, n, n == 1 ? " (absent)" : "");
}

void gc_module_set_route(gcap_module *m, gc_route_fn fn, void *ud, int entry) {
  m->route = fn;
  m->route_ud = ud;
  m->route_entry = entry;
}

void gc_module_unroute(gcap_module *m, const void *ud, int entry) {
  if (m->route != NULL && m->route_ud == ud && m->route_entry == entry) m->route = NULL;
}

static gcap_status check_graphable(gcap_module *m, const char *where, const char *path) {
  int i, j;
  if (m->nhooks > 0)
    return gc_fail(m->e, GCAP_EINVAL,
                   "%s: %s%s%s (%s) has a registered %s; modules must not have hooks when "
                   "they are graphed (their work would be captured once and their Lua side effects "
                   "never replayed). Register hooks after graphing (they then run eagerly around "
                   "each replay), or pass them in capture_time_hooks",
                   where, path[0] ? "module '" : "the callable", path, path[0] ? "'" : "", m->type,
                   gcap_hook_kind_name(m->hooks[0].kind));
  for (i = 0; i < m->buffers.n; i++)
    if (m->buffers.v[i].t->requires_grad)
      return gc_fail(m->e, GCAP_EINVAL,
                     "%s: buffer '%s%s%s' of %s requires grad; only parameters may be trainable, "
                     "buffers must have requires_grad = false",
                     where, path, path[0] ? "." : "", m->buffers.v[i].name, m->type);
  for (j = 0; j < m->children.n; j++) {
    char sub[256];
    gcap_status st;
    snprintf(sub, sizeof sub, "%s%s%s", path, path[0] ? "." : "", m->children.v[j].name);
    if ((st = check_graphable(m->children.v[j].m, where, sub)) != GCAP_OK) return st;
  }
  return GCAP_OK;
}

gcap_status gc_module_check_graphable(gcap_module *m, const char *where) {
  return check_graphable(m, where, "");
}

/* ------------------------------------------------------------------------ */
/* Grads                                                                     */

/* Zero the main_grad of every fused-wgrad Linear in m (once each). */
static gcap_status zero_main_grads(gcap_module *m) {
  gcap_status st;
  int j;
  if (m->wgrad != NULL && m->wgrad->main_grad != NULL &&
      (st = gcap_fill_(m->wgrad->main_grad, 0.0)) != GCAP_OK)
    return st;
  for (j = 0; j < m->children.n; j++)
    if ((st = zero_main_grads(m->children.v[j].m)) != GCAP_OK) return st;
  return GCAP_OK;
}

gcap_status gcap_module_zero_grad(gcap_module *m, int set_to_none) {
  int i, n;
  gcap_status st;
  if (m == NULL) return GCAP_EINVAL;
  gc_clear(m->e);
  n = gcap_module_num_parameters(m);
  for (i = 0; i < n; i++) {
    if ((st = gc_zero_grad(gcap_module_parameter(m, i, NULL, 0), set_to_none)) != GCAP_OK)
      return st;
  }
  return zero_main_grads(m);
}

/* Is m a Linear that delays its wgrad? */
static int linear_delays(const gcap_module *m) {
  return m->wgrad != NULL && m->wgrad->delay;
}

/* The delayed wgrads of m's sink, oldest first. */
static gcap_status linear_dw(gcap_module *m) {
  gcap_tensor *w = m->params.v[0].t, *b = m->params.n > 1 ? m->params.v[1].t : NULL;
  gcap_status st = GCAP_OK;
  int was = gcap_set_grad_enabled(m->e, 0);
  gc_wgrad_queue *q = &m->wgrad->q;
  while (st == GCAP_OK && q->n > 0) {
    gcap_tensor *g = q->v[0], *x = q->v[1], *done_gb = q->v[2], *gw = NULL, *gb = NULL;
    /* frozen parameters get nothing, as in the ordinary backward */
    st = gc_linear_param_grads(g, x, w, b, m->wgrad->main_grad, done_gb,
                               w->requires_grad ? &gw : NULL,
                               b != NULL && b->requires_grad ? &gb : NULL);
    if (st == GCAP_OK && gw != NULL) st = gc_acc_grad(w, gw, 1);
    if (st == GCAP_OK && gb != NULL) st = gc_acc_grad(b, gb, 1);
    gcap_tensor_free(gw);
    gcap_tensor_free(gb);
    if (st != GCAP_OK) break;
    gcap_tensor_free(g);
    gcap_tensor_free(x);
    gcap_tensor_free(done_gb);
    memmove(q->v, q->v + 3, (size_t)(q->n - 3) * sizeof *q->v);
    q->n -= 3;
  }
  gcap_set_grad_enabled(m->e, was);
  return st;
}

void gc_module_wgrad_aside(gcap_module *m, int aside) {
  int j;
  if (linear_delays(m) && m->aside != aside) {
    gc_wgrad_queue *q = &m->wgrad->q;
    if (aside) { /* the user's pending wgrads wait; the call starts empty */
      m->wq_aside = *q;
      memset(q, 0, sizeof *q);
    } else { /* whatever the call left is dropped; the user's come back */
      gc_wgrad_queue_free(q);
      *q = m->wq_aside;
      memset(&m->wq_aside, 0, sizeof m->wq_aside);
    }
    m->aside = aside;
  }
  for (j = 0; j < m->children.n; j++)
    gc_module_wgrad_aside(m->children.v[j].m, aside);
}

gcap_status gcap_module_backward_dw(gcap_module *m) {
  gcap_status st;
  int j;
  if (m == NULL) return GCAP_EINVAL;
  gc_clear(m->e);
  if (linear_delays(m) && (st = linear_dw(m)) != GCAP_OK) return st;
  for (j = 0; j < m->children.n; j++)
    if ((st = gcap_module_backward_dw(m->children.v[j].m)) != GCAP_OK) return st;
  return GCAP_OK;
}

gcap_status gcap_module_to(gcap_module *m, gcap_dtype dt) {
  int i, n;
  gcap_status st;
  if (m == NULL) return GCAP_EINVAL;
  gc_clear(m->e);
  if (dt != GCAP_F32 && dt != GCAP_BF16)
    return gc_fail(m->e, GCAP_EINVAL, "%s: to: unknown dtype %d", m->type, (int)dt);
  for (n = gcap_module_num_parameters(m), i = 0; i < n; i++) {
    gcap_tensor *p = gcap_module_parameter(m, i, NULL, 0);
    if ((st = gc_tensor_convert(p, dt)) != GCAP_OK ||
        (p->grad && (st = gc_tensor_convert(p->grad, dt)) != GCAP_OK))
      return st;
  }
  for (n = gcap_module_num_buffers(m), i = 0; i < n; i++)
    if ((st = gc_tensor_convert(gcap_module_buffer(m, i, NULL, 0), dt)) != GCAP_OK) return st;
  return GCAP_OK;
}

int gcap_module_has_delayed_wgrad(const gcap_module *m) {
  int j;
  if (m == NULL) return 0;
  if (linear_delays(m)) return 1;
  for (j = 0; j < m->children.n; j++)
    if (gcap_module_has_delayed_wgrad(m->children.v[j].m)) return 1;
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Built-ins                                                                 */

static gcap_status one_input(gcap_module *m, int nin) {
  if (nin != 1) return gc_fail(m->e, GCAP_EINVAL, "%s: expected 1 input, got %d", m->type, nin);
  return GCAP_OK;
}

/* Linear m on x, followed by a gelu when `gelu`. */
static gcap_status linear_run(gcap_module *m, gcap_tensor *x, int gelu, gcap_tensor **out) {
  gcap_tensor *b = m->params.n > 1 ? m->params.v[1].t : NULL;
  gcap_status st =
      gelu ? gc_linear_gelu(x, m->params.v[0].t, b, out) : gc_linear(x, m->params.v[0].t, b, out);
  if (st != GCAP_OK) return st;
  if (m->wgrad != NULL && (*out)->grad_fn != NULL) /* its parameter grads go to the sink */
    (*out)->grad_fn->wgrad = gc_wgrad_sink_retain(m->wgrad);
  return GCAP_OK;
}

static gcap_status linear_forward(void *ud, gcap_module *m, int nin, gcap_tensor *const *in,
                                  gcap_tensor **out) {
  gcap_status st;
  (void)ud;
  return (st = one_input(m, nin)) != GCAP_OK ? st : linear_run(m, in[0], 0, out);
}

gcap_status gc_uniform(gcap_engine *e, int ndim, const int64_t *shape, double bound,
                       gcap_tensor **out) {
  gcap_tensor *u;
  gcap_status st;
  int was = gcap_set_grad_enabled(e, 0);
  *out = NULL;
  if ((st = gcap_tensor_rand(e, GCAP_F32, ndim, shape, 0, &u)) == GCAP_OK) {
    gcap_tensor *two_u;
    if ((st = gc_unary(u, GC_K_SCALE, (float)(2.0 * bound), "init", 0, &two_u)) == GCAP_OK) {
      gcap_tensor *shift;
      if ((st = gcap_tensor_full(e, GCAP_F32, 0, NULL, -bound, &shift)) == GCAP_OK) {
        st = gc_binary(two_u, shift, GC_K_ADD, "init", out);
        gcap_tensor_free(shift);
      }
      gcap_tensor_free(two_u);
    }
    gcap_tensor_free(u);
  }
  gcap_set_grad_enabled(e, was);
  return st;
}

gcap_status gcap_nn_linear(gcap_engine *e, int64_t in, int64_t out, int bias, unsigned flags,
                           gcap_module **m) {
  gcap_tensor *w = NULL, *b = NULL, *mg = NULL;
  int64_t ws[2], bs[1];
  double bound;
  gcap_status st;
  if (m == NULL) return GCAP_EINVAL;
  *m = NULL;
  if (e == NULL) return GCAP_EINVAL;
  if ((st = gc_check_open(e, "Linear")) != GCAP_OK) return st;
  if (in <= 0 || out <= 0)
    return gc_fail(e, GCAP_EINVAL,
                   "Linear: in and out features must be positive, got %lld and %lld", (long long)in,
                   (long long)out);
  if (flags & ~(GCAP_LINEAR_DELAY_WGRAD | GCAP_LINEAR_FUSE_WGRAD))
    return gc_fail(e, GCAP_EINVAL, "Linear: unknown flags 0x%x", flags);
  ws[0] = out;
  ws[1] = in;
  bs[0] = out;
  bound = 1.0 / sqrt((double)in);
  if ((st = gcap_module_new(e, "Linear", linear_forward, NULL, NULL, m)) != GCAP_OK) return st;
  if ((flags & GCAP_LINEAR_FUSE_WGRAD) &&
      ((st = gcap_tensor_full(e, GCAP_F32, 2, ws, 0.0, &mg)) != GCAP_OK ||
       (st = gcap_module_add_buffer(*m, "main_grad", mg)) != GCAP_OK))
    goto fail;
  if ((flags & (GCAP_LINEAR_DELAY_WGRAD | GCAP_LINEAR_FUSE_WGRAD)) &&
      (st = gc_wgrad_sink_new(e, (flags & GCAP_LINEAR_DELAY_WGRAD) != 0, mg, &(*m)->wgrad)) !=
          GCAP_OK)
    goto fail;
  if ((st = gc_uniform(e, 2, ws, bound, &w)) != GCAP_OK ||
      (st = gcap_module_add_parameter(*m, "weight", w)) != GCAP_OK)
    goto fail;
  if (bias && ((st = gc_uniform(e, 1, bs, bound, &b)) != GCAP_OK ||
               (st = gcap_module_add_parameter(*m, "bias", b)) != GCAP_OK))
    goto fail;
  gcap_tensor_free(w);
  gcap_tensor_free(b);
  gcap_tensor_free(mg);
  return GCAP_OK;
fail:
  gcap_tensor_free(w);
  gcap_tensor_free(b);
  gcap_tensor_free(mg);
  gcap_module_free(*m);
  *m = NULL;
  return st;
}

static gcap_status relu_forward(void *ud, gcap_module *m, int nin, gcap_tensor *const *in,
                                gcap_tensor **out) {
  gcap_status st;
  (void)ud;
  return (st = one_input(m, nin)) != GCAP_OK ? st : gcap_relu(in[0], out);
}

static gcap_status gelu_forward(void *ud, gcap_module *m, int nin, gcap_tensor *const *in,
                                gcap_tensor **out) {
  gcap_status st;
  (void)ud;
  return (st = one_input(m, nin)) != GCAP_OK ? st : gcap_gelu(in[0], out);
}

static gcap_status ln_forward(void *ud, gcap_module *m, int nin, gcap_tensor *const *in,
                              gcap_tensor **out) {
  gcap_status st;
  (void)ud;
  if ((st = one_input(m, nin)) != GCAP_OK) return st;
  return gcap_layer_norm(in[0], m->params.v[0].t, m->params.v[1].t, m->eps, out);
}

static gcap_status dropout_forward(void *ud, gcap_module *m, int nin, gcap_tensor *const *in,
                                   gcap_tensor **out) {
  gcap_status st;
  (void)ud;
  return (st = one_input(m, nin)) != GCAP_OK ? st : gcap_dropout(in[0], m->p, m->training, out);
}

/* A module whose call is its bare forward: no hooks, not graphed. */
static int bare(const gcap_module *m) {
  return m->nhooks == 0 && m->route == NULL;
}

/* Children j and j + 1 are a bare Linear then a bare GELU: nothing can see
** the Linear's output, so the pair runs as one GEMM with a gelu epilogue. */
static int linear_gelu_at(gcap_module *m, int j) {
  gcap_module *a = m->children.v[j].m, *b;
  if (j + 1 >= m->children.n || a->forward != linear_forward) return 0;
  b = m->children.v[j + 1].m;
  return b->forward == gelu_forward && bare(a) && bare(b);
}

/* Child j of Sequential m on x: one tensor out, passed on as PyTorch's. */
static gcap_status seq_call(gcap_module *m, int j, gcap_tensor *x, gcap_tensor **y) {
  gcap_module *c = m->children.v[j].m;
  gcap_tensor *ys[GCAP_MAX_OUTPUTS];
  gcap_status st;
  int n;
  *y = NULL;
  if ((st = gcap_module_call_n(c, 1, &x, GCAP_MAX_OUTPUTS, &n, ys)) != GCAP_OK) return st;
  if (n == 1 && ys[0] != NULL) {
    *y = ys[0];
    return GCAP_OK;
  }
  outs_free(n, ys);
  return gc_fail(m->e, GCAP_EINVAL,
                 "%s: module #%d (%s) gave %d outputs%s; a Sequential passes one tensor from "
                 "module to module",
                 m->type, j + 1, c->type, n, n == 1 ? " (absent)" : "");
}

static gcap_status seq_forward(void *ud, gcap_module *m, int nin, gcap_tensor *const *in,
                               gcap_tensor **out) {
  gcap_tensor *x;
  gcap_status st;
  int j;
  (void)ud;
  if ((st = one_input(m, nin)) != GCAP_OK) return st;
  x = gcap_tensor_retain(in[0]);
  for (j = 0; j < m->children.n; j++) {
    gcap_tensor *y;
    if (linear_gelu_at(m, j)) {
      gc_clear(m->e);
      st = linear_run(m->children.v[j++].m, x, 1, &y);
    } else {
      st = seq_call(m, j, x, &y);
    }
    gcap_tensor_free(x);
    if (st != GCAP_OK) return st;
    x = y;
  }
  *out = x;
  return GCAP_OK;
}

gcap_status gcap_nn_relu(gcap_engine *e, gcap_module **m) {
  return gcap_module_new(e, "ReLU", relu_forward, NULL, NULL, m);
}

gcap_status gcap_nn_gelu(gcap_engine *e, gcap_module **m) {
  return gcap_module_new(e, "GELU", gelu_forward, NULL, NULL, m);
}

gcap_status gcap_nn_layer_norm(gcap_engine *e, int64_t n, double eps, gcap_module **m) {
  gcap_tensor *w = NULL, *b = NULL;
  gcap_status st;
  if (m == NULL) return GCAP_EINVAL;
  *m = NULL;
  if (e == NULL) return GCAP_EINVAL;
  if (n <= 0)
    return gc_fail(e, GCAP_EINVAL, "LayerNorm: size must be positive, got %lld", (long long)n);
  if ((st = gcap_module_new(e, "LayerNorm", ln_forward, NULL, NULL, m)) != GCAP_OK) return st;
  (*m)->eps = eps;
  if ((st = gcap_tensor_full(e, GCAP_F32, 1, &n, 1.0, &w)) != GCAP_OK ||
      (st = gcap_tensor_full(e, GCAP_F32, 1, &n, 0.0, &b)) != GCAP_OK ||
      (st = gcap_module_add_parameter(*m, "weight", w)) != GCAP_OK ||
      (st = gcap_module_add_parameter(*m, "bias", b)) != GCAP_OK) {
    gcap_module_free(*m);
    *m = NULL;
  }
  gcap_tensor_free(w);
  gcap_tensor_free(b);
  return st;
}

gcap_status gcap_nn_dropout(gcap_engine *e, double p, gcap_module **m) {
  gcap_status st;
  if (m == NULL) return GCAP_EINVAL;
  *m = NULL;
  if (e == NULL) return GCAP_EINVAL;
  if (!(p >= 0.0 && p <= 1.0))
    return gc_fail(e, GCAP_EINVAL, "Dropout: probability must be in [0, 1], got %g", p);
  if ((st = gcap_module_new(e, "Dropout", dropout_forward, NULL, NULL, m)) == GCAP_OK) (*m)->p = p;
  return st;
}

gcap_status gcap_nn_sequential(gcap_engine *e, int n, gcap_module *const *mods, gcap_module **m) {
  gcap_status st;
  int j;
  if (m == NULL) return GCAP_EINVAL;
  *m = NULL;
  if (e == NULL || n < 0 || (n > 0 && mods == NULL)) return GCAP_EINVAL;
  if ((st = gcap_module_new(e, "Sequential", seq_forward, NULL, NULL, m)) != GCAP_OK) return st;
  for (j = 0; j < n; j++) {
    char name[16];
    snprintf(name, sizeof name, "%d", j);
    if ((st = gcap_module_add_child(*m, name, mods[j])) != GCAP_OK) {
      gcap_module_free(*m);
      *m = NULL;
      return st;
    }
  }
  return GCAP_OK;
}
