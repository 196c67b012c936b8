/*
** stale.c: what a graphed call and its backward check before they replay.
** The backward graph reads what its call left behind (the activations in
** the pool, the static inputs and outputs, the parameters); anything that
** rewrote them since would make it compute another call's grads without a
** word, where an eager node would refuse. Every graph reads the parameters
** where they were when graphed, and computes in the modes the modules had
** then: a call checks both. Each check names the entry and the call or
** the parameter, and says what to do.
*/
#include <stdio.h>

#include "graphed.h"

/* ------------------------------------------------------------------------ */
/* Versions of what the backward graph reads                                */

/* Read k of x: the tensor itself, or the static output it names. */
static const gcap_tensor *read_tensor(const ge_entry *x, int k) {
  return x->reads[k].t ? x->reads[k].t : x->out.t[x->reads[k].out];
}

/* The version of the storage read k reads: the one the tensor had when
** graphed (a parameter moved since by set_ leaves the graph reading it). */
static uint64_t read_version(const ge_entry *x, int k) {
  return x->reads[k].blk ? x->reads[k].blk->version : read_tensor(x, k)->blk->version;
}

/* Keep t among x's reads, named `what`, when x's backward graph reads it;
** a static output (out >= 0) by its place, unretained. */
static void add_read(ge_entry *x, gcap_tensor *t, int out, const char *what) {
  uintptr_t lo = (uintptr_t)gc_tensor_ptr(t);
  int j;
  if (!gc_graph_touches(x->bwd, t->blk, lo, lo + (uintptr_t)t->numel * gc_dtype_size(t->dt), 0))
    return;
  for (j = 0; j < x->nreads; j++) /* a tensor given twice is checked once */
    if (read_tensor(x, j) == t) return;
  x->reads[x->nreads].t = out < 0 ? gcap_tensor_retain(t) : NULL;
  x->reads[x->nreads].blk = out < 0 ? t->blk : NULL;
  if (out < 0) gc_blk_retain(t->blk);
  x->reads[x->nreads].out = out;
  snprintf(x->reads[x->nreads].what, sizeof x->reads[0].what, "%s", what);
  x->nreads++;
}

gcap_status gc_graphed_note_reads(ge_build *b, ge_entry *x) {
  int np = gcap_module_num_parameters(x->m), k;
  size_t n = (size_t)(x->nargs + np + x->out.n) + 1;
  char what[sizeof x->reads[0].what], name[GC_NAMELEN];
  if ((x->reads = (ge_read *)gc_calloc(n, sizeof *x->reads)) == NULL)
    return gc_fail(b->e, GCAP_ENOMEM, "make_graphed_callables: out of host memory");
  for (k = 0; k < x->nargs; k++) {
    snprintf(what, sizeof what, "the static input of argument #%d", k + 1);
    add_read(x, x->args[k], -1, what);
  }
  for (k = 0; k < np; k++) { /* all of them: a frozen one is read too */
    gcap_tensor *p = gcap_module_parameter(x->m, k, name, sizeof name);
    snprintf(what, sizeof what, "parameter '%s'", name);
    add_read(x, p, -1, what);
  }
  /* an output whose node saved it (relu saves its result): the call returned
  ** views of it, which the user may write before the backward */
  for (k = 0; k < x->out.n; k++) {
    if (x->out.t[k] == NULL) continue;
    snprintf(what, sizeof what, "output #%d", k + 1);
    add_read(x, x->out.t[k], k, what);
  }
  return GCAP_OK;
}

void gc_graphed_note_versions(const ge_entry *x, uint64_t *ver) {
  int k;
  for (k = 0; k < x->nreads; k++)
    ver[k] = read_version(x, k);
}

/* As an eager node's check of what it saved, in the same words. */
static gcap_status version_check(const ge_ref *r, const char *where) {
  const ge_entry *x = &r->G->v[r->entry];
  int k;
  for (k = 0; k < x->nreads; k++) {
    const gcap_tensor *t = read_tensor(x, k);
    uint64_t v = read_version(x, k);
    char what[GC_NAMELEN + 64];
    if (v == r->ver[k]) continue;
    snprintf(what, sizeof what, "tensor it read as %s", x->reads[k].what);
    return gc_fail_written(t, where, what, v, r->ver[k]);
  }
  return GCAP_OK;
}

/* ------------------------------------------------------------------------ */
/* The checks                                                               */

gcap_status gc_graphed_check_backward(const ge_ref *r) {
  const ge_entry *x = &r->G->v[r->entry];
  char where[GC_NAMELEN + 96];
  snprintf(where, sizeof where, "graphed backward of call %llu of entry %d (callable %d, %s)",
           (unsigned long long)r->call, r->entry + 1, x->callable + 1, gcap_module_type(x->m));
  if (r->call != x->calls)
    return gc_fail(r->G->e, GCAP_ESTATE,
                   "%s: its saved activations were overwritten by call %llu of that entry's "
                   "forward; run a call's backward before the entry's next call, or graph one "
                   "entry per microbatch (order)",
                   where, (unsigned long long)r->call + 1);
  if (r->backwards > 0 && !r->G->retain)
    return gc_fail(r->G->e, GCAP_ESTATE,
                   "%s: a second backward of one call, but its captured backward freed the "
                   "tensors it saved, whose memory later work may reuse; graph it with "
                   "retain_graph_in_backward = true to backward a call more than once",
                   where);
  return version_check(r, where);
}

/* ------------------------------------------------------------------------ */
/* Parameters and modes as graphed                                          */

static int count_modes(const gcap_module *m) {
  int n = 1, i;
  for (i = 0; i < gcap_module_num_children(m); i++)
    n += count_modes(gcap_module_child(m, i, NULL));
  return n;
}

/* The flags of m and its submodules, depth first, into v from *n on. */
static void note_modes(const gcap_module *m, unsigned char *v, int *n) {
  int i;
  v[(*n)++] = (unsigned char)(gcap_module_training(m) != 0);
  for (i = 0; i < gcap_module_num_children(m); i++)
    note_modes(gcap_module_child(m, i, NULL), v, n);
}

/* Do the flags of m and its submodules, depth first, equal v's from *n on
** (nv in all)? */
static int same_modes(const gcap_module *m, const unsigned char *v, int nv, int *n) {
  int i;
  if (*n >= nv || v[(*n)++] != (gcap_module_training(m) != 0)) return 0;
  for (i = 0; i < gcap_module_num_children(m); i++)
    if (!same_modes(gcap_module_child(m, i, NULL), v, nv, n)) return 0;
  return 1;
}

static void note_home(ge_home *h, const gcap_tensor *t) {
  h->ptr = (uintptr_t)gc_tensor_ptr(t);
  h->dt = t->dt;
  h->ndim = t->ndim;
  memcpy(h->shape, t->shape, sizeof h->shape);
}

gcap_status gc_graphed_note_homes(ge_build *b) {
  int i, k;
  for (i = 0; i < b->G->n; i++) {
    ge_entry *x = &b->G->v[i];
    int np = gcap_module_num_parameters(x->m), n = 0;
    x->nmodes = count_modes(x->m);
    x->homes = (ge_home *)gc_calloc((size_t)(x->nargs + np) + 1, sizeof *x->homes);
    x->modes = (unsigned char *)gc_calloc((size_t)x->nmodes, 1);
    if (x->homes == NULL || x->modes == NULL)
      return gc_fail(b->e, GCAP_ENOMEM, "make_graphed_callables: out of host memory");
    note_modes(x->m, x->modes, &n);
    for (k = 0; k < x->nargs; k++)
      note_home(&x->homes[k], x->args[k]);
    for (k = 0; k < np; k++)
      note_home(&x->homes[x->nargs + k], gcap_module_parameter(x->m, k, NULL, 0));
    x->nhomes = np;
  }
  return GCAP_OK;
}

/* The first module of m's tree, depth first, whose flag differs from v's
** (from *n on): 1 with its dotted name in path (room: size; "" for m
** itself) and its flag as graphed in *was, else 0. */
static int mode_differs(const gcap_module *m, const unsigned char *v, int nv, int *n, char *path,
                        size_t size, int *was) {
  size_t len = strlen(path);
  int i;
  if (*n >= nv) return 0;
  if (v[*n] != (gcap_module_training(m) != 0)) {
    *was = v[*n];
    return 1;
  }
  (*n)++;
  for (i = 0; i < gcap_module_num_children(m); i++) {
    const char *name = NULL;
    const gcap_module *c = gcap_module_child(m, i, &name);
    snprintf(path + len, size - len, "%s%s", len ? "." : "", name ? name : "?");
    if (mode_differs(c, v, nv, n, path, size, was)) return 1;
    path[len] = '\0';
  }
  return 0;
}

void gc_graphed_mode_change(const ge_entry *x, char *buf, size_t size) {
  char path[GC_NAMELEN] = "";
  int n = 0, was = 0;
  if (!mode_differs(x->m, x->modes, x->nmodes, &n, path, sizeof path, &was)) {
    snprintf(buf, size, "its modules differ from those graphed");
    return;
  }
  snprintf(buf, size, "%s%s%s is in %s mode, graphed in %s mode",
           path[0] ? "submodule '" : "the module", path, path[0] ? "'" : "",
           was ? "eval" : "training", was ? "training" : "eval");
}

int gc_graphed_modes_match(const ge_entry *x) {
  int n = 0;
  return same_modes(x->m, x->modes, x->nmodes, &n) && n == x->nmodes;
}

/* Is t where h says? */
static int at_home(const gcap_tensor *t, const ge_home *h) {
  int d, same = (uintptr_t)gc_tensor_ptr(t) == h->ptr && t->dt == h->dt && t->ndim == h->ndim;
  for (d = 0; same && d < t->ndim; d++)
    same = t->shape[d] == h->shape[d];
  return same;
}

static gcap_status moved(const gcap_graphed *G, int entry, const char *what, const gcap_tensor *t,
                         const ge_home *h) {
  const ge_entry *x = &G->v[entry];
  char now[64], then[64];
  gc_shape_str(t, now, sizeof now);
  gc_dims_str(h->ndim, h->shape, then, sizeof then);
  return gc_fail(
      G->e, GCAP_ESTATE,
      "graphed call of entry %d (callable %d, %s): %s moved since it was graphed "
      "(now %s %s%s, graphed as %s %s): its graphs read the memory it had then; write "
      "new values into it in place (copy_), or graph it again with "
      "make_graphed_callables",
      entry + 1, x->callable + 1, gcap_module_type(x->m), what, now, gc_dtype_name(t->dt),
      (uintptr_t)gc_tensor_ptr(t) != h->ptr ? " on other storage" : "", then, gc_dtype_name(h->dt));
}

gcap_status gc_graphed_check_homes(const gcap_graphed *G, int entry) {
  const ge_entry *x = &G->v[entry];
  int np = gcap_module_num_parameters(x->m), k;
  char name[GC_NAMELEN], what[GC_NAMELEN + 32];
  for (k = 0; k < x->nargs; k++) {
    if (at_home(x->args[k], &x->homes[k])) continue;
    snprintf(what, sizeof what, "the static input of argument #%d (its sample)", k + 1);
    return moved(G, entry, what, x->args[k], &x->homes[k]);
  }
  if (np != x->nhomes)
    return gc_fail(G->e, GCAP_ESTATE,
                   "graphed call of entry %d (callable %d, %s): the module has %d parameters, "
                   "%d when graphed; graph it again with make_graphed_callables",
                   entry + 1, x->callable + 1, gcap_module_type(x->m), np, x->nhomes);
  for (k = 0; k < np; k++) {
    const gcap_tensor *p = gcap_module_parameter(x->m, k, name, sizeof name);
    if (at_home(p, &x->homes[x->nargs + k])) continue;
    snprintf(what, sizeof what, "parameter '%s'", name);
    return moved(G, entry, what, p, &x->homes[x->nargs + k]);
  }
  return GCAP_OK;
}
