/*
** badid.c: the bad-id flag. Embedding and cross_entropy refuse an id that
** names no row before an eager launch, but a graph's ids are data of each
** replay: its kernel gives such a row NaN, drops its grad and writes the
** first bad id into this flag (host-visible memory, so that reading it costs
** no copy and no synchronization). The engine looks at the flag at the
** start of every replay and after every synchronization (synchronize, a
** read-back such as item or tolist), and turns what it finds into the op's
** eager message, naming the graph and its replays, once.
*/
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "runtime.h"

gcap_status gc_badid_init(gcap_engine *e) {
  void *host = NULL;
  gcap_status st =
      e->be->mapped_alloc(e, e->bs, GC_BADID_WORDS * sizeof(uint32_t), &host, &e->badid_dev);
  e->badid = (uint32_t *)host;
  return st;
}

void gc_badid_free(gcap_engine *e) {
  if (e->badid != NULL) e->be->mapped_free(e->bs, e->badid);
  e->badid = NULL;
  e->badid_dev = NULL;
}

void *gc_badid_site(gcap_engine *e, int64_t *gid) {
  *gid = e->cap != NULL ? e->cap->g->id : 0;
  return e->cap != NULL ? e->badid_dev : NULL;
}

/* The two words of w from i on as one 64-bit number. */
static int64_t word64(const volatile uint32_t *w, int i) {
  return (int64_t)((uint64_t)w[i] | (uint64_t)w[i + 1] << 32);
}

gcap_status gc_badid_check(gcap_engine *e) {
  volatile uint32_t *w = e->badid;
  const gcap_graph *g;
  char val[32], where[GC_NAMELEN + 96];
  uint32_t bits;
  float v;
  int64_t index, count;
  int op;
  if (w == NULL || w[GC_BADID_STATE] != 2) return GCAP_OK;
  op = (int)w[GC_BADID_OP];
  index = word64(w, GC_BADID_INDEX);
  count = (int64_t)w[GC_BADID_COUNT];
  bits = w[GC_BADID_VALUE];
  memcpy(&v, &bits, sizeof v);
  g = gc_graph_of(e, (gc_gid)word64(w, GC_BADID_GRAPH));
  if (g != NULL)
    snprintf(where, sizeof where, "in a replay of graph '%s' (found after its replay %lld)",
             g->name, (long long)g->stats.replays);
  else
    snprintf(where, sizeof where, "in a replay of a graph freed since");
  memset((void *)w, 0, GC_BADID_WORDS * sizeof *w); /* raised once */
  snprintf(val, sizeof val, isnan(v) ? "NaN" : "%g", (double)v);
  if (op == GC_BADID_XENT)
    return gc_fail(e, GCAP_EINVAL,
                   "cross_entropy: the target of row %lld (counting from 1) is %s, not a class id "
                   "(an integer in 0..%lld), %s: that row's loss is NaN; give class ids, or run "
                   "the step eagerly to stop before it",
                   (long long)index + 1, val, (long long)count - 1, where);
  return gc_fail(e, GCAP_EINVAL,
                 "embedding: the id at %lld (counting from 1) is %s, not a row of the weight (an "
                 "integer in 0..%lld), %s: its row is NaN and its grad dropped; give ids of rows, "
                 "or run the call eagerly to stop before it",
                 (long long)index + 1, val, (long long)count - 1, where);
}
