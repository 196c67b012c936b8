/*
** record.c: what autograd records. An op whose inputs require grad records a
** node: the producers of its inputs (or the leaves themselves), aliases of
** the tensors its backward needs, and its backward function; a view records
** one that reshapes its grad. Also grad mode, the autograd state of leaves
** (requires_grad, .grad, detach) and the rule against writing a leaf in
** place. Backward runs in autograd.c.
*/
#include <stdlib.h>
#include <string.h>

#include "tensor.h"

int gcap_set_grad_enabled(gcap_engine *e, int on) {
  int was;
  if (e == NULL) return 0;
  was = e->grad_enabled;
  e->grad_enabled = on != 0;
  return was;
}

int gcap_is_grad_enabled(const gcap_engine *e) {
  return e != NULL && e->grad_enabled;
}

int gc_grad_needed(gcap_engine *e, gcap_tensor *const *in, int nin) {
  int i;
  if (!e->grad_enabled) return 0;
  for (i = 0; i < nin; i++)
    if (in[i] != NULL && in[i]->requires_grad) return 1;
  return 0;
}

gcap_status gc_record(gcap_tensor *out, const char *name, gc_backward_fn bw, gcap_tensor *const *in,
                      int nin, gcap_tensor *const *save, int nsave, gc_node **node) {
  gcap_engine *e = out->e;
  /* one block: the node, then its meta[], next[] and leaf[] arrays */
  gc_node *n =
      (gc_node *)gc_calloc(1, sizeof *n + (size_t)nin * (sizeof(gc_meta) + 2 * sizeof(void *)));
  int i;
  if (node) *node = NULL;
  if (n == NULL) return gc_fail(e, GCAP_ENOMEM, "%s: out of host memory", name);
  n->meta = (gc_meta *)(n + 1);
  n->next = (gc_node **)(n->meta + nin);
  n->leaf = (gcap_tensor **)(n->next + nin);
  n->refs = 1;
  n->name = name;
  n->backward = bw;
  n->nin = nin;
  for (i = 0; i < nin; i++) {
    gcap_tensor *t = in[i];
    if (t != NULL) gc_meta_of(t, &n->meta[i]);
    if (t == NULL || !t->requires_grad) continue;
    if (t->grad_fn) {
      n->next[i] = t->grad_fn;
      t->grad_fn->refs++;
    } else {
      n->leaf[i] = gcap_tensor_retain(t);
    }
  }
  for (i = 0; i < nsave; i++) {
    if (save[i] == NULL) continue;
    if ((n->saved[i] = gc_tensor_alias(save[i], save[i]->ndim, save[i]->shape)) == NULL) {
      n->nsaved = i;
      gc_node_release(n);
      return gc_fail(e, GCAP_ENOMEM, "%s: out of host memory", name);
    }
    n->saved_version[i] = save[i]->blk->version;
  }
  n->nsaved = nsave;
  if (e->cap != NULL && e->op.where != NULL && (n->where = gc_where_str(&e->op)) == NULL) {
    gc_node_release(n);
    return gc_fail(e, GCAP_ENOMEM, "%s: out of host memory", name);
  }
  n->ndim = out->ndim;
  memcpy(n->shape, out->shape, sizeof n->shape);
  n->dt = out->dt;
  out->requires_grad = 1;
  out->grad_fn = n;
  if (node) *node = n;
  return GCAP_OK;
}

/* ------------------------------------------------------------------------ */
/* Views                                                                     */

static gcap_status view_backward(gc_node *n, gcap_tensor *g, gcap_tensor **gin) {
  if ((gin[0] = gc_tensor_alias(g, (int)n->k[0], (const int64_t *)n->ud)) == NULL)
    return gc_fail(g->e, GCAP_ENOMEM, "view backward: out of host memory");
  return GCAP_OK;
}

gcap_status gc_view_record(gcap_tensor *src, gcap_tensor *view) {
  gc_node *n;
  int64_t *shape;
  gcap_status st;
  if (!gc_grad_needed(src->e, &src, 1)) return GCAP_OK;
  if ((shape = (int64_t *)gc_malloc(sizeof(int64_t) * GCAP_MAXDIM)) == NULL)
    return gc_fail(src->e, GCAP_ENOMEM, "view: out of host memory");
  memcpy(shape, src->shape, sizeof(int64_t) * GCAP_MAXDIM);
  if ((st = gc_record(view, "view", view_backward, &src, 1, NULL, 0, &n)) != GCAP_OK) {
    free(shape);
    return st;
  }
  n->k[0] = src->ndim;
  n->is_view = 1;
  n->ud = shape;
  n->ud_free = free;
  return GCAP_OK;
}

gcap_status gcap_tensor_view(gcap_tensor *t, int ndim, const int64_t *shape, gcap_tensor **out) {
  gcap_engine *e;
  int64_t numel;
  gcap_status st;
  if (out != NULL) *out = NULL;
  if (t == NULL) return GCAP_EINVAL;
  e = t->e;
  if ((st = gc_check_open(e, "view")) != GCAP_OK) return st;
  if (out == NULL) return gc_null(e, "view", "out");
  if ((st = gc_check_shape(e, "view", ndim, shape, &numel)) != GCAP_OK) return st;
  if (numel != t->numel) {
    char buf[64];
    return gc_fail(e, GCAP_EINVAL,
                   "view: cannot view a tensor of shape %s (%lld elements) with %lld elements",
                   gc_shape_str(t, buf, sizeof buf), (long long)t->numel, (long long)numel);
  }
  if ((*out = gc_tensor_alias(t, ndim, shape)) == NULL)
    return gc_fail(e, GCAP_ENOMEM, "view: out of host memory");
  (*out)->view = 1;
  if ((st = gc_view_record(t, *out)) != GCAP_OK) { /* the caller gets nothing */
    gcap_tensor_free(*out);
    *out = NULL;
  }
  return st;
}

/* ------------------------------------------------------------------------ */
/* Leaves                                                                    */

gcap_status gcap_tensor_set_requires_grad(gcap_tensor *t, int on) {
  if (t == NULL) return GCAP_EINVAL;
  gc_clear(t->e);
  if (t->grad_fn != NULL)
    return gc_fail(t->e, GCAP_EINVAL,
                   "requires_grad: only leaves can be set (this tensor was made by '%s'); use "
                   "detach() for a leaf copy",
                   t->grad_fn->name);
  t->requires_grad = on != 0;
  return GCAP_OK;
}

int gcap_tensor_requires_grad(const gcap_tensor *t) {
  return t != NULL && t->requires_grad;
}

int gcap_tensor_is_leaf(const gcap_tensor *t) {
  return t != NULL && t->grad_fn == NULL;
}

gcap_tensor *gcap_tensor_grad(const gcap_tensor *t) {
  return t ? t->grad : NULL;
}

const char *gcap_tensor_grad_fn_name(const gcap_tensor *t) {
  return t && t->grad_fn ? t->grad_fn->name : NULL;
}

gcap_status gcap_tensor_set_grad(gcap_tensor *t, gcap_tensor *grad) {
  gcap_status st;
  if ((st = gc_op_start("set grad", t, "t", grad)) != GCAP_OK) return st;
  if (grad == t) return gc_fail(t->e, GCAP_EINVAL, "set grad: a tensor cannot be its own grad");
  if (grad != NULL && grad->e != t->e) return gc_foreign(t->e, "set grad", "the grad");
  if (grad != NULL) {
    int i, same = grad->ndim == t->ndim && grad->dt == t->dt;
    for (i = 0; same && i < t->ndim; i++)
      same = grad->shape[i] == t->shape[i];
    if (!same) {
      char b1[64], b2[64];
      return gc_fail(t->e, GCAP_EINVAL, "set grad: the grad (%s %s) must match the tensor (%s %s)",
                     gc_shape_str(grad, b1, sizeof b1), gc_dtype_name(grad->dt),
                     gc_shape_str(t, b2, sizeof b2), gc_dtype_name(t->dt));
    }
    gcap_tensor_retain(grad);
  }
  gcap_tensor_free(t->grad);
  t->grad = grad;
  return GCAP_OK;
}

/* Is t a view (through views only) of a leaf that requires grad? */
static int view_of_leaf(const gcap_tensor *t) {
  const gc_node *n;
  for (n = t->grad_fn; n != NULL && n->is_view; n = n->next[0])
    if (n->leaf[0] != NULL) return 1;
  return 0;
}

gcap_status gc_check_inplace(gcap_tensor *t, const char *op) {
  if (!t->requires_grad || !t->e->grad_enabled) return GCAP_OK;
  if (t->grad_fn == NULL || view_of_leaf(t)) /* as PyTorch: the leaf would change unseen */
    return gc_fail(t->e, GCAP_EINVAL,
                   "%s: a leaf that requires grad%s cannot be modified in place while grad is "
                   "recorded (wrap it in no_grad)",
                   op, t->grad_fn == NULL ? "" : ", or a view of one,");
  return GCAP_OK;
}

gcap_status gcap_tensor_detach(gcap_tensor *t, gcap_tensor **out) {
  gcap_status st;
  if (out != NULL) *out = NULL;
  if (t == NULL) return GCAP_EINVAL;
  if ((st = gc_check_open(t->e, "detach")) != GCAP_OK) return st;
  if (out == NULL) return gc_null(t->e, "detach", "out");
  if ((*out = gc_tensor_alias(t, t->ndim, t->shape)) == NULL)
    return gc_fail(t->e, GCAP_ENOMEM, "detach: out of host memory");
  return GCAP_OK;
}
