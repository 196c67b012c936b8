/*
** module.c: the module object. A module is a forward function with named
** parameters, buffers, children, a training flag and four hook lists
** (module_hooks.c runs them); this file makes and frees it, registers its
** parameters, buffers and children, flattens them (the walk every
** optimizer and graphing indexes), and zeroes, converts and checks them
** before graphing. The built-ins are in builtin.c.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "module.h"

static void flat_free(mod_flat *f);

static gcap_status module_new(gcap_engine *e, const char *type, gcap_forward_fn fwd,
                              gcap_forward_n_fn fwd_n, void *ud, void (*ud_free)(void *),
                              gcap_module **out) {
  gcap_module *m;
  gcap_status st;
  if (out != NULL) *out = NULL;
  if (e == NULL) return GCAP_EINVAL;
  if ((st = gc_check_open(e, type ? type : "module")) != GCAP_OK) return st;
  if (out == NULL) return gc_null(e, type ? type : "module", "out");
  if (fwd == NULL && fwd_n == NULL) return gc_null(e, "module", "fwd (the forward function)");
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

gcap_engine *gc_module_engine(const gcap_module *m) {
  return m->e;
}

gcap_status gc_module_start(gcap_engine *e, const char *type, gcap_module **m) {
  if (m != NULL) *m = NULL;
  if (e == NULL) return GCAP_EINVAL;
  gc_clear(e);
  return m ? GCAP_OK : gc_null(e, type, "m");
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
  gc_fp8_meta_release(m->fp8);
  flat_free(&m->flat[0]);
  flat_free(&m->flat[1]);
  if (m->ud_free) m->ud_free(m->ud);
  free(m);
  gc_engine_unref(e);
}

gcap_status gc_module_keep_or_free(gcap_module **m, gcap_status st) {
  if (st != GCAP_OK) {
    gcap_module_free(*m);
    *m = NULL;
  }
  return st;
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
  if (!gc_growvector(l->v, l->cap, l->n + 1, 4))
    return gc_fail(m->e, GCAP_ENOMEM, "%s: out of host memory", m->type);
  if ((copy = (char *)gc_malloc(strlen(name) + 1)) == NULL)
    return gc_fail(m->e, GCAP_ENOMEM, "%s: out of host memory", m->type);
  strcpy(copy, name);
  l->v[l->n].name = copy;
  l->v[l->n].t = gcap_tensor_retain(t);
  l->v[l->n].m = gcap_module_retain(c);
  l->v[l->n].transient = 0;
  l->n++;
  m->e->module_gen++; /* every module's flattened lists may have changed */
  return GCAP_OK;
}

/* The start of call op adding obj, its argument `arg` of engine obj_e (NULL
** when obj is), to m: m NULL is told to obj's engine. */
static gcap_status add_start(gcap_module *m, const char *op, const char *arg, const void *obj,
                             gcap_engine *obj_e) {
  if (m == NULL) return obj_e ? gc_null(obj_e, op, "m") : GCAP_EINVAL;
  gc_clear(m->e);
  return obj ? GCAP_OK : gc_null(m->e, m->type, arg);
}

gcap_status gcap_module_add_parameter(gcap_module *m, const char *name, gcap_tensor *t) {
  gcap_status st;
  if ((st = add_start(m, "add_parameter", "t", t, t ? t->e : NULL)) != GCAP_OK) return st;
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
  gcap_status st;
  if ((st = add_start(m, "add_buffer", "t", t, t ? t->e : NULL)) != GCAP_OK) return st;
  if (t->e != m->e)
    return gc_fail(m->e, GCAP_EINVAL, "%s: buffer '%s' belongs to another engine", m->type,
                   name ? name : "?");
  return list_add(m, &m->buffers, "buffer", name, t, NULL);
}

gcap_status gcap_module_set_buffer_persistent(gcap_module *m, const char *name, int persistent) {
  int i;
  if (m == NULL) return GCAP_EINVAL;
  gc_clear(m->e);
  if (name == NULL) return gc_null(m->e, "set_buffer_persistent", "name");
  if ((i = list_find(&m->buffers, name)) < 0)
    return gc_fail(m->e, GCAP_EINVAL, "set_buffer_persistent: %s has no buffer '%s'", m->type,
                   name);
  m->buffers.v[i].transient = !persistent;
  return GCAP_OK;
}

int gcap_module_buffer_persistent(const gcap_module *m, const char *name) {
  int i;
  if (m == NULL || name == NULL || (i = list_find(&m->buffers, name)) < 0) return -1;
  return !m->buffers.v[i].transient;
}

static int module_contains(const gcap_module *m, const gcap_module *c) {
  int i;
  if (m == c) return 1;
  for (i = 0; i < m->children.n; i++)
    if (module_contains(m->children.v[i].m, c)) return 1;
  return 0;
}

gcap_status gcap_module_add_child(gcap_module *m, const char *name, gcap_module *child) {
  gcap_status st;
  if ((st = add_start(m, "add_child", "child", child, child ? child->e : NULL)) != GCAP_OK)
    return st;
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
  int j, cap;
  if (seen_in(w->seen, w->nseen, m)) return 1;
  if (!gc_growvector(w->seen, w->capseen, w->nseen + 1, 16)) return 0;
  w->seen[w->nseen++] = m;
  for (j = 0; j < l->n; j++) {
    if (seen_in((const void *const *)f->t, f->n, l->v[j].t)) continue;
    cap = f->cap; /* name[] grows to what t[] grows to */
    if (!gc_growvector(f->t, cap, f->n + 1, 16) || !gc_growvector(f->name, f->cap, cap, 16))
      return 0;
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
/* Hook kinds                                                                */

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

/* ------------------------------------------------------------------------ */
/* Before graphing                                                           */

/* m and its children (path: m's dotted name, "" for the callable itself)
** have no hooks and no buffer that requires grad. */
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
/* Grads and dtype                                                           */

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

void gc_module_where_enter(gcap_module *m, mod_where *w) {
  gcap_engine *e = m->e;
  const gcap_module *parent = (const gcap_module *)e->op.module;
  const char *name = m->type;
  int i;
  w->was = e->op;
  if (!(w->entered = e->cap != NULL)) return;
  for (i = 0; parent != NULL && e->op.where != NULL && i < parent->children.n; i++)
    if (parent->children.v[i].m == m) name = parent->children.v[i].name;
  if (parent != NULL && e->op.where != NULL)
    snprintf(w->path, sizeof w->path, "%s.%s", e->op.where, name);
  else
    snprintf(w->path, sizeof w->path, "%s", m->type);
  e->op.where = w->path;
  e->op.type = m->type;
  e->op.module = m;
}

void gc_module_where_leave(gcap_module *m, const mod_where *w) {
  if (w->entered) m->e->op = w->was;
}

void gc_module_set_fp8_gemms(gcap_module *m, int n) {
  m->fp8_gemms = n;
}

int gcap_module_fp8_gemms(const gcap_module *m) {
  return m ? m->fp8_gemms : -1;
}

gc_fp8_meta **gc_module_fp8_slot(gcap_module *m) {
  return &m->fp8;
}

gcap_attn_stats *gc_module_attn_slot(gcap_module *m) {
  return &m->attn;
}

gcap_status gcap_module_attention_stats(const gcap_module *m, gcap_attn_stats *out) {
  if (m == NULL || out == NULL) return GCAP_EINVAL;
  *out = m->attn;
  return GCAP_OK;
}

gcap_status gcap_module_set_is_first_microbatch(gcap_module *m, int first) {
  if (m == NULL) return GCAP_EINVAL;
  m->first_mb = first ? 2 : 1;
  return GCAP_OK;
}

int gc_module_take_first_microbatch(gcap_module *m) {
  int f = m->first_mb - 1;
  m->first_mb = 0;
  return f;
}

int gcap_module_is_graphed(const gcap_module *m) {
  return m != NULL && m->route[m->training != 0].fn != NULL;
}
