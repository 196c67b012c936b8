/*
** label.c: what a launch is, for the host backend's dumps of a graph: the
** op that launched it and where it ran (the module of a forward, or the
** node of a backward), and the shapes of the tensors behind its pointer
** arguments, so that a node reads "matmul: linear in Sequential.0
** (Linear)" with "[4, 16] f32" beside each buffer, not a row of raw slots.
** The layers above set the label and note the tensors while a capture is
** open (nothing is kept otherwise); the backend asks as it records.
*/
#include <stdio.h>

#include "runtime.h"

/* The type l names beside its path: none for an outermost module, whose
** path is its type. */
static const char *type_of(const gc_oplabel *l) {
  return l->type != NULL && strcmp(l->type, l->where) != 0 ? l->type : NULL;
}

/* "[4, 16] f32" of note a into buf. */
static void note_str(const gc_argnote *a, char *buf, size_t n) {
  size_t len = 0;
  int d;
  len += (size_t)snprintf(buf, n, "[");
  for (d = 0; d < a->ndim && len < n; d++)
    len += (size_t)snprintf(buf + len, n - len, "%s%lld", d ? ", " : "", (long long)a->shape[d]);
  if (len < n) snprintf(buf + len, n - len, "] %s", a->dt == GCAP_BF16 ? "bf16" : "f32");
}

void gc_launch_describe(gcap_engine *e, const gc_kargs *a, gc_launch_info *out) {
  const gc_oplabel *l = &e->op;
  int j, k;
  size_t len = 0;
  memset(out, 0, sizeof *out);
  if (l->name != NULL)
    len = (size_t)snprintf(out->what, sizeof out->what, "%s%s", l->backward ? "backward of " : "",
                           l->name);
  if (l->where != NULL && len < sizeof out->what)
    snprintf(out->what + len, sizeof out->what - len, "%sin %s", len ? " " : "", l->where);
  if (l->where != NULL && type_of(l) != NULL && strlen(out->what) < sizeof out->what)
    snprintf(out->what + strlen(out->what), sizeof out->what - strlen(out->what), " (%s)",
             type_of(l));
  for (j = 0; j < GC_KPTRS; j++)
    for (k = e->nargnotes - 1; a->p[j] != NULL && k >= 0; k--)
      if (e->argnotes[k].ptr == a->p[j]) {
        note_str(&e->argnotes[k], out->arg[j], sizeof out->arg[j]);
        break;
      }
}

char *gc_where_str(const gc_oplabel *l) {
  const char *type = type_of(l);
  size_t n = strlen(l->where) + (type ? strlen(type) + 3 : 0) + 1;
  char *s = (char *)gc_malloc(n);
  if (s != NULL)
    snprintf(s, n, "%s%s%s%s", l->where, type ? " (" : "", type ? type : "", type ? ")" : "");
  return s;
}
