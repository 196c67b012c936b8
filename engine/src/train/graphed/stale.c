/*
** stale.c: what the backward of a graphed call checks before it replays.
** The backward graph reads what its call left behind (the activations in
** the pool, the static inputs, the parameters); anything that rewrote them
** since would make it compute another call's grads without a word, where an
** eager node would refuse. Each check names the entry and the call, and
** says what to do.
*/
#include <stdio.h>

#include "graphed.h"

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
  return GCAP_OK;
}
