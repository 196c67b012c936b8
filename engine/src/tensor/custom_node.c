/*
** custom_node.c: autograd nodes whose backward the caller supplies (a C host's
** op, or a Lua autograd.Function). The node is an ordinary one: its saved
** tensors get the version check, it runs once per backward with the sum of
** its output's grads. Its ud (a fn_node) carries the caller's callback,
** ud and destructor, the name, and the inputs' layouts, against which the
** grads the callback returns are checked. Also anchors: inputs that make a
** custom node record without an edge into anything.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor.h"

typedef struct fn_node {
  gcap_autograd_backward bw;
  void *ud;
  void (*ud_free)(void *ud);
  char name[GC_NAMELEN];
  struct {
    int tensor; /* 0: not a tensor (a NULL input), whose grad is dropped unchecked */
    int ndim;
    int64_t shape[GCAP_MAXDIM];
    gcap_dtype dt;
  } in[1]; /* [nin] */
} fn_node;

static void fn_free(void *p) {
  fn_node *f = (fn_node *)p;
  if (f->ud_free) f->ud_free(f->ud);
  free(f);
}

/* Is g shaped as input i was? */
static int fn_fits(const fn_node *f, int i, const gcap_tensor *g) {
  int d;
  if (g->ndim != f->in[i].ndim || g->dt != f->in[i].dt) return 0;
  for (d = 0; d < g->ndim; d++)
    if (g->shape[d] != f->in[i].shape[d]) return 0;
  return 1;
}

static gcap_status fn_backward(gc_node *n, gcap_tensor *g, gcap_tensor **gin) {
  fn_node *f = (fn_node *)n->ud;
  gcap_status st;
  int i;
  st = f->bw(f->ud, n->nsaved, n->saved, g, n->nin, gin);
  for (i = 0; st == GCAP_OK && i < n->nin; i++) {
    char b1[64], b2[64];
    if (gin[i] == NULL || !f->in[i].tensor || fn_fits(f, i, gin[i])) continue;
    st = gc_fail(
        g->e, GCAP_EINVAL, "backward of '%s': the grad of input #%d is %s %s; the input is %s %s",
        f->name, i + 1, gc_shape_str(gin[i], b1, sizeof b1), gc_dtype_name(gin[i]->dt),
        gc_dims_str(f->in[i].ndim, f->in[i].shape, b2, sizeof b2), gc_dtype_name(f->in[i].dt));
  }
  for (i = 0; i < n->nin; i++) /* none for inputs that need none; all on failure */
    if (gin[i] != NULL && (st != GCAP_OK || !gc_node_needs(n, i))) {
      gcap_tensor_free(gin[i]);
      gin[i] = NULL;
    }
  if (st != GCAP_OK && gcap_errmsg(g->e)[0] == '\0')
    gc_fail(g->e, st, "backward of '%s' failed", f->name);
  return st;
}

/* The arguments of gcap_autograd_record on result's engine e; op names the
** call in errors (its node's name, once there is one). */
static gcap_status record_check(gcap_engine *e, const char *name, int nin, gcap_tensor *const *in,
                                int nsave, gcap_tensor *const *save, gcap_autograd_backward bw,
                                gcap_tensor **out) {
  const char *op = name ? name : "autograd_record";
  int i;
  if (out == NULL) return gc_null(e, op, "out");
  if (name == NULL) return gc_null(e, op, "name");
  if (bw == NULL) return gc_null(e, op, "bw");
  if (nin < 0) return gc_bad_count(e, op, "nin", nin);
  if (nsave < 0) return gc_bad_count(e, op, "nsave", nsave);
  if (nin > 0 && in == NULL) return gc_null(e, op, "in");
  if (nsave > 0 && save == NULL) return gc_null(e, op, "save");
  if (nsave > GC_NODE_MAXSAVED) /* before save[] is read */
    return gc_fail(e, GCAP_EINVAL, "%s: %d tensors saved for backward; at most %d", name, nsave,
                   GC_NODE_MAXSAVED);
  for (i = 0; i < nin; i++)
    if (in[i] != NULL && in[i]->e != e)
      return gc_fail(e, GCAP_EINVAL, "%s: input #%d belongs to another engine", name, i + 1);
  for (i = 0; i < nsave; i++)
    if (save[i] == NULL || save[i]->e != e)
      return gc_fail(e, GCAP_EINVAL, "%s: saved tensor #%d is %s", name, i + 1,
                     save[i] == NULL ? "NULL" : "of another engine");
  if (name[0] == '\0' || strlen(name) >= GC_NAMELEN)
    return gc_fail(e, GCAP_EINVAL, "a custom node's name must be 1 to %d bytes, got %d",
                   GC_NAMELEN - 1, (int)strlen(name));
  return GCAP_OK;
}

gcap_status gcap_autograd_record(const char *name, gcap_tensor *result, int nin,
                                 gcap_tensor *const *in, int nsave, gcap_tensor *const *save,
                                 gcap_autograd_backward bw, void *ud, void (*ud_free)(void *ud),
                                 gcap_tensor **out) {
  gcap_engine *e;
  fn_node *f;
  gcap_status st;
  int i;
  if (out != NULL) *out = NULL;
  if (result == NULL) { /* no engine to tell */
    if (ud_free) ud_free(ud);
    return GCAP_EINVAL;
  }
  e = result->e;
  gc_clear(e);
  if ((st = record_check(e, name, nin, in, nsave, save, bw, out)) != GCAP_OK) {
    if (ud_free) ud_free(ud);
    return st;
  }
  f = (fn_node *)gc_calloc(1, sizeof *f + (size_t)(nin > 0 ? nin - 1 : 0) * sizeof f->in[0]);
  if (f == NULL || (*out = gc_tensor_alias(result, result->ndim, result->shape)) == NULL) {
    free(f);
    if (ud_free) ud_free(ud);
    return gc_fail(e, GCAP_ENOMEM, "%s: out of host memory", name);
  }
  f->bw = bw;
  f->ud = ud;
  f->ud_free = ud_free;
  snprintf(f->name, sizeof f->name, "%s", name);
  for (i = 0; i < nin; i++)
    if (in[i] != NULL) {
      f->in[i].tensor = 1;
      f->in[i].ndim = in[i]->ndim;
      memcpy(f->in[i].shape, in[i]->shape, sizeof f->in[i].shape);
      f->in[i].dt = in[i]->dt;
    }
  if (!gc_grad_needed(e, in, nin)) { /* nothing to differentiate */
    fn_free(f);
    return GCAP_OK;
  }
  if ((st = gc_record(*out, f->name, fn_backward, in, nin, save, nsave, NULL)) != GCAP_OK) {
    fn_free(f);
    return gc_keep_or_free(out, st);
  }
  (*out)->grad_fn->ud = f;
  (*out)->grad_fn->ud_free = fn_free;
  return GCAP_OK;
}

/* An anchor's node: a grad reaching it goes nowhere. */
static gcap_status anchor_backward(gc_node *n, gcap_tensor *g, gcap_tensor **gin) {
  (void)n, (void)g, (void)gin;
  return GCAP_OK;
}

gcap_status gcap_autograd_anchor(gcap_tensor *t, gcap_tensor **out) {
  gcap_status st;
  if ((st = gc_op_start_out("anchor", t, "t", NULL, out)) != GCAP_OK) return st;
  if ((*out = gc_tensor_alias(t, t->ndim, t->shape)) == NULL)
    return gc_fail(t->e, GCAP_ENOMEM, "anchor: out of host memory");
  if (t->e->grad_enabled &&
      (st = gc_record(*out, "anchor", anchor_backward, NULL, 0, NULL, 0, NULL)) != GCAP_OK) {
    gcap_tensor_free(*out);
    *out = NULL;
    return st;
  }
  return GCAP_OK;
}
