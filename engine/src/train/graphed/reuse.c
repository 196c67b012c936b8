/*
** reuse.c: reuse_graph_input_output_buffers, TE's rules. Before warmup, a
** forward takes the static inputs of an entry whose backward came before it
** (same shapes and dtypes); at capture, entries share grad-output buffers,
** and once a backward is captured the buffers no later pass reads go back
** to the pool as weak blocks, the captured graphs keeping their addresses.
*/
#include <stdlib.h>

#include "graphed.h"

static int same_inputs(const ge_entry *a, const ge_entry *c) {
  int k;
  if (a->nargs != c->nargs) return 0;
  for (k = 0; k < a->nargs; k++)
    if (!gc_same_layout(a->args[k], c->args[k])) return 0;
  return 1;
}

/* Who shares a static input with whom, once, for the replay-time check
** (replay.c, check_shared_inputs). */
static gcap_status note_sharers(ge_build *b) {
  gcap_graphed *G = b->G;
  int i, j, k;
  for (i = 0; i < G->n; i++) {
    ge_entry *x = &G->v[i];
    for (j = 0; j < G->n; j++) {
      int shared = 0, kk;
      for (k = 0; j != i && !shared && k < x->nargs; k++)
        for (kk = 0; !shared && kk < G->v[j].nargs; kk++)
          shared = x->args[k] == G->v[j].args[kk];
      if (!shared) continue;
      if (x->sharers == NULL &&
          (x->sharers = (int *)gc_malloc((size_t)G->n * sizeof *x->sharers)) == NULL)
        return gc_fail(b->e, GCAP_ENOMEM, "make_graphed_callables: out of host memory");
      x->sharers[x->nsharers++] = j;
    }
  }
  return GCAP_OK;
}

/* Reuse, TE's pre-pass: a forward takes the static inputs of an entry whose
** backward is done (same shapes and dtypes), oldest first. */
gcap_status gc_graphed_share_inputs(ge_build *b) {
  gcap_graphed *G = b->G;
  int *fq = (int *)gc_malloc(sizeof(int) * (size_t)G->n * 3 + sizeof(int)), *done, *chunk;
  int nfq = 0, ndone = 0, i, j, k;
  if (fq == NULL) return gc_fail(b->e, GCAP_ENOMEM, "make_graphed_callables: out of host memory");
  done = fq + G->n;
  chunk = done + G->n;
  for (i = 0; i < b->sched.n; i++)
    chunk[b->sched.v[i].entry] = b->sched.v[i].chunk;
  for (i = 0; i < b->sched.n; i++) {
    const gc_pass *p = &b->sched.v[i];
    if (p->kind == GC_PASS_FWD) {
      ge_entry *x = &G->v[p->entry];
      fq[nfq++] = p->entry;
      for (j = 0; j < ndone; j++)
        if (same_inputs(&G->v[done[j]], x)) {
          ge_entry *y = &G->v[done[j]];
          for (k = 0; k < x->nargs; k++) {
            gcap_tensor_free(x->args[k]);
            x->args[k] = gcap_tensor_retain(y->args[k]);
          }
          memmove(done + j, done + j + 1, (size_t)(ndone - j - 1) * sizeof *done);
          ndone--;
          break;
        }
    } else if (p->kind == GC_PASS_BWD) { /* frees the oldest forward of its chunk */
      for (j = 0; j < nfq; j++)
        if (chunk[fq[j]] == p->chunk) {
          done[ndone++] = fq[j];
          memmove(fq + j, fq + j + 1, (size_t)(nfq - j - 1) * sizeof *fq);
          nfq--;
          break;
        }
    }
  }
  free(fq);
  return note_sharers(b);
}

/* Reuse: grad outputs are read only inside a backward replay, after their
** copy-in, so entries whose outputs look alike share buffers (output k of x
** one that x's other outputs do not use). */
gcap_tensor *gc_graphed_shared_grad_out(ge_build *b, const ge_entry *x, int k) {
  int j, l, m;
  for (j = 0; j < b->G->n; j++) {
    const ge_entry *y = &b->G->v[j];
    for (l = 0; y != x && y->grad_out && l < y->out.n; l++) {
      gcap_tensor *g = y->grad_out[l];
      int taken = 0;
      if (g == NULL || !gc_same_layout(g, x->out.t[k])) continue;
      for (m = 0; m < k; m++)
        taken |= x->grad_out[m] == g;
      if (!taken) return gcap_tensor_retain(g);
    }
  }
  return NULL;
}

static gcap_status weaken_grads(ge_entry *x, int from) {
  int k;
  for (k = from; x->grad_in && k < x->nargs + x->nparams; k++) {
    gcap_status st = x->grad_in[k] ? gc_tensor_weaken(x->grad_in[k]) : GCAP_OK;
    if (st != GCAP_OK) return st;
  }
  return GCAP_OK;
}

/* Reuse (TE's rules): once entry i's backward is captured, its static output,
** its cloned parameter grads, the grads of the layer processed before it in
** the same backward, and (at the chunk's first layer) the grads of the
** previous backward's first layer are dead: their memory goes back to the
** pool while the captured graphs keep the addresses. */
gcap_status gc_graphed_release_dead(ge_build *b, int i) {
  ge_entry *x = &b->G->v[i];
  const gc_pass *p = &b->sched.v[b->pass];
  int last_layer = b->pass + 1 >= b->sched.n || b->sched.v[b->pass + 1].kind != GC_PASS_BWD ||
                   b->sched.v[b->pass + 1].pos != p->pos;
  gcap_status st;
  int k;
  for (k = 0; k < x->out.n; k++)
    if (x->out.t[k] && (st = gc_tensor_weaken(x->out.t[k])) != GCAP_OK) return st;
  if (b->G->clone && (st = weaken_grads(x, x->nargs)) != GCAP_OK) return st;
  if (b->prev_bwd >= 0 && b->prev_bwd_pos == p->pos &&
      (st = weaken_grads(&b->G->v[b->prev_bwd], 0)) != GCAP_OK)
    return st;
  b->prev_bwd = i;
  b->prev_bwd_pos = p->pos;
  if (last_layer) {
    if (b->last_l0 >= 0 && (st = weaken_grads(&b->G->v[b->last_l0], 0)) != GCAP_OK) return st;
    b->last_l0 = i;
  }
  return GCAP_OK;
}
