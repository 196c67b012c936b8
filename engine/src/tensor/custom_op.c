/*
** custom_op.c: custom ops (a C host's kernel or library call) launched as
** the engine's own: capture rules, outputs from the current pool, the notes
** of what they read and write, one launch through the backend table (whose
** `custom` entry calls the op's callback for that backend), an autograd
** node through gcap_autograd_record. A graph that recorded an op keeps it
** (gc_graph_keep), so that its callbacks and ud outlive the graph's replays;
** so does its autograd node. Also the declared accesses of work a host
** launches itself on a graphcap stream (gcap_note_access).
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor.h"

#define CO_MAXARGS 64 /* operands of one call, inputs and outputs */

struct gcap_custom_op {
  int refs; /* the user's handle, graphs that recorded it, autograd nodes */
  gcap_engine *e;
  gcap_custom_desc d; /* d.name points at name */
  char name[GC_NAMELEN];
  char label[GC_NAMELEN + 16]; /* "custom op 'name'", for the replay check's messages */
};

static void co_release(void *p) {
  gcap_custom_op *op = (gcap_custom_op *)p;
  gcap_engine *e;
  if (--op->refs > 0) return;
  e = op->e;
  if (op->d.ud_free) op->d.ud_free(op->d.ud);
  free(op);
  gc_engine_unref(e);
}

gcap_status gcap_custom_op_new(gcap_engine *e, const gcap_custom_desc *d, gcap_custom_op **out) {
  gcap_custom_op *op;
  gcap_status st;
  if (out != NULL) *out = NULL;
  if (e == NULL || d == NULL) {
    if (d != NULL && d->ud_free) d->ud_free(d->ud);
    return e ? gc_null(e, "gcap_custom_op_new", "d") : GCAP_EINVAL;
  }
  st = gc_check_open(e, "gcap_custom_op_new");
  if (st == GCAP_OK && out == NULL) st = gc_null(e, "gcap_custom_op_new", "out");
  if (st == GCAP_OK && (d->name == NULL || d->name[0] == '\0' || strlen(d->name) >= GC_NAMELEN))
    st = gc_fail(e, GCAP_EINVAL, "gcap_custom_op_new: a custom op's name must be 1 to %d bytes",
                 GC_NAMELEN - 1);
  if (st == GCAP_OK && d->cuda == NULL && d->host == NULL)
    st = gc_fail(e, GCAP_EINVAL, "custom op '%s': neither a cuda nor a host callback", d->name);
  if (st == GCAP_OK && (op = (gcap_custom_op *)gc_calloc(1, sizeof *op)) == NULL)
    st = gc_fail(e, GCAP_ENOMEM, "custom op '%s': out of host memory", d->name);
  if (st != GCAP_OK) {
    if (d->ud_free) d->ud_free(d->ud);
    return st;
  }
  op->refs = 1;
  op->e = e;
  op->d = *d;
  snprintf(op->name, sizeof op->name, "%s", d->name);
  snprintf(op->label, sizeof op->label, "custom op '%s'", d->name);
  op->d.name = op->name;
  gc_engine_ref(e);
  *out = op;
  return GCAP_OK;
}

void gcap_custom_op_free(gcap_custom_op *op) {
  if (op != NULL) co_release(op);
}

/* The op's backward, with its own ud, as the autograd node's callback. */
static gcap_status co_backward(void *ud, int nsaved, gcap_tensor *const *saved, gcap_tensor *g,
                               int nin, gcap_tensor **gin) {
  const gcap_custom_op *op = (const gcap_custom_op *)ud;
  return op->d.backward(op->d.ud, nsaved, saved, g, nin, gin);
}

/* Everything about a call that can be checked before its outputs are made
** (gc_custom_launch checks the count of operands). */
static gcap_status co_check(gcap_custom_op *op, int nin, gcap_tensor *const *in, int nout,
                            const gcap_custom_out *spec, int nsave, const int *save,
                            gcap_tensor *const *out) {
  gcap_engine *e = op->e;
  int i;
  int64_t numel;
  gcap_status st;
  if (nin < 0) return gc_bad_count(e, op->label, "nin", nin);
  if (nout < 1) return gc_bad_count(e, op->label, "nout (at least one output)", nout);
  if (nsave < 0) return gc_bad_count(e, op->label, "nsave", nsave);
  if (out == NULL) return gc_null(e, op->label, "out");
  if (nin > 0 && in == NULL) return gc_null(e, op->label, "in");
  if (spec == NULL) return gc_null(e, op->label, "spec");
  if (nsave > 0 && save == NULL) return gc_null(e, op->label, "save");
  if (nin + nout > CO_MAXARGS)
    return gc_fail(e, GCAP_EINVAL, "custom op '%s': %d operands; at most %d", op->name, nin + nout,
                   CO_MAXARGS);
  if (op->d.backward && nout != 1)
    return gc_fail(e, GCAP_EINVAL, "custom op '%s': an op with a backward has one output, got %d",
                   op->name, nout);
  if (nsave > GC_NODE_MAXSAVED)
    return gc_fail(e, GCAP_EINVAL, "custom op '%s': %d tensors saved for backward; at most %d",
                   op->name, nsave, GC_NODE_MAXSAVED);
  for (i = 0; i < nsave; i++)
    if (save[i] < 0 || save[i] >= nin + nout)
      return gc_fail(e, GCAP_EINVAL,
                     "custom op '%s': save #%d is %d; an input (0 to %d) or an output (%d to %d)",
                     op->name, i + 1, save[i], nin - 1, nin, nin + nout - 1);
  for (i = 0; i < nin; i++)
    if (in[i] == NULL || in[i]->e != e)
      return gc_fail(e, GCAP_EINVAL, "custom op '%s': input #%d is %s", op->name, i + 1,
                     in[i] == NULL ? "NULL" : "of another engine");
  for (i = 0; i < nout; i++) {
    char what[GC_NAMELEN + 48];
    snprintf(what, sizeof what, "custom op '%s': output #%d", op->name, i + 1);
    if ((unsigned)spec[i].dtype > GCAP_BF16)
      return gc_fail(e, GCAP_EINVAL, "%s: unknown dtype %d", what, (int)spec[i].dtype);
    if ((st = gc_check_shape(e, what, spec[i].ndim, spec[i].shape, &numel)) != GCAP_OK) return st;
  }
  return gc_check_stream(e, e->current, op->label);
}

static void co_arg(gcap_custom_arg *a, const gcap_tensor *t) {
  memset(a, 0, sizeof *a);
  a->data = gc_tensor_ptr(t);
  a->dtype = t->dt;
  a->ndim = t->ndim;
  memcpy(a->shape, t->shape, (size_t)t->ndim * sizeof t->shape[0]);
  a->numel = t->numel;
}

gcap_status gc_custom_launch(gcap_custom_op *op, int nin, gcap_tensor *const *in, int nout,
                             gcap_tensor *const *out) {
  gcap_engine *e = op->e;
  gcap_custom_arg arg[CO_MAXARGS];
  gc_custom c;
  gcap_status st;
  int i;
  if (nin + nout > CO_MAXARGS)
    return gc_fail(e, GCAP_EINVAL, "custom op '%s': %d operands; at most %d", op->name, nin + nout,
                   CO_MAXARGS);
  if ((st = gc_check_stream(e, e->current, op->label)) != GCAP_OK) return st;
  e->note_what = op->label;
  for (i = 0; st == GCAP_OK && i < nin + nout; i++) {
    const gcap_tensor *t = i < nin ? in[i] : out[i - nin];
    co_arg(&arg[i], t);
    st = gc_note_access(e, t, i >= nin);
  }
  if (st == GCAP_OK && e->cap != NULL && (st = gc_graph_keep(e, op, co_release)) == GCAP_OK)
    op->refs++;
  if (st == GCAP_OK) {
    c.name = op->name;
    c.host = op->d.host;
    c.cuda = op->d.cuda;
    c.ud = op->d.ud;
    c.nin = nin;
    c.nout = nout;
    c.arg = arg;
    st = e->be->custom(e, e->bs, e->current->bs, &c);
  }
  if (st == GCAP_OK) {
    e->current->seq++;
    return GCAP_OK;
  }
  if (e->cap != NULL) {
    char msg[GC_ERRLEN];
    snprintf(msg, sizeof msg, "%s", e->err);
    gc_capture_refuse(e, "%s", msg);
  }
  return st;
}

gcap_status gcap_custom_call(gcap_custom_op *op, int nin, gcap_tensor *const *in, int nout,
                             const gcap_custom_out *spec, int nsave, const int *save,
                             gcap_tensor **out) {
  gcap_engine *e;
  gcap_tensor *saved[GC_NODE_MAXSAVED], *rec;
  gcap_status st;
  int i;
  if (out != NULL)
    for (i = 0; i < nout; i++)
      out[i] = NULL;
  if (op == NULL) return GCAP_EINVAL;
  e = op->e;
  gc_clear(e);
  if ((st = co_check(op, nin, in, nout, spec, nsave, save, out)) != GCAP_OK) return st;
  for (i = 0; st == GCAP_OK && i < nout; i++)
    st = gc_tensor_alloc(e, op->name, spec[i].dtype, spec[i].ndim, spec[i].shape, &out[i]);
  if (st == GCAP_OK) st = gc_custom_launch(op, nin, in, nout, out);
  if (st == GCAP_OK && op->d.backward && gc_grad_needed(e, in, nin)) {
    for (i = 0; i < nsave; i++)
      saved[i] = save[i] < nin ? in[save[i]] : out[save[i] - nin];
    op->refs++; /* the node's, released with it (or now, on failure) */
    st = gcap_autograd_record(op->name, out[0], nin, in, nsave, saved, co_backward, op, co_release,
                              &rec);
    if (st == GCAP_OK) {
      gcap_tensor_free(out[0]);
      out[0] = rec;
    }
  }
  if (st != GCAP_OK)
    for (i = 0; i < nout; i++) {
      gcap_tensor_free(out[i]);
      out[i] = NULL;
    }
  return st;
}

gcap_status gcap_note_access(gcap_tensor *t, int write, const char *what) {
  gcap_engine *e;
  gcap_status st;
  char *name;
  if (t == NULL) return GCAP_EINVAL;
  e = t->e;
  gc_clear(e);
  if (what == NULL || what[0] == '\0' || strlen(what) >= GC_NAMELEN)
    return gc_fail(e, GCAP_EINVAL, "gcap_note_access: `what` must be 1 to %d bytes",
                   GC_NAMELEN - 1);
  if ((st = gc_check_stream(e, e->current, what)) != GCAP_OK) return st;
  e->note_what = NULL;
  if (e->cap != NULL) { /* the graph keeps the name its read set points at */
    if ((name = (char *)gc_malloc(strlen(what) + 1)) == NULL)
      return gc_fail(e, GCAP_ENOMEM, "%s: out of host memory", what);
    strcpy(name, what);
    if ((st = gc_graph_keep(e, name, free)) != GCAP_OK) {
      free(name);
      return st;
    }
    e->note_what = name;
  }
  if ((st = gc_note_access(e, t, write != 0)) != GCAP_OK) return st;
  e->current->seq++; /* work on it, for the capture's join check */
  return GCAP_OK;
}
