/*
** reuse.c: reuse_graph_input_output_buffers, TE's rules. Before warmup, a
** forward takes the static inputs of an entry whose backward came before it
** (same shapes and dtypes); at capture, entries share grad-output buffers,
** and once a backward is captured the buffers no later pass reads go back
** to the pool as weak blocks, the captured graphs keeping their addresses.
** A static output given back is valid until a graph captured after it
** writes its memory: each replay of such a graph marks the output dead.
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

static gcap_graph *entry_graph(const ge_entry *x, int which) {
  return which == GE_FWD ? x->fwd : which == GE_BWD ? x->bwd : x->dw;
}

/* Note in x->kills[which] that its graph g writes over output k of entry i,
** if it does. */
static gcap_status note_kill(ge_build *b, ge_entry *x, int which, gcap_graph *g, int i, int k) {
  gcap_tensor *t = b->G->v[i].out.t[k];
  uintptr_t lo;
  int n = x->nkills[which];
  if (t == NULL || !t->blk->weak) return GCAP_OK;
  lo = (uintptr_t)gc_tensor_ptr(t);
  if (!gc_graph_touches(g, t->blk, lo, lo + (uintptr_t)t->numel * gc_dtype_size(t->dt), 1))
    return GCAP_OK;
  if ((n & (n - 1)) == 0) { /* 0, 1, 2, 4, ...: room doubles */
    ge_kill *v = (ge_kill *)gc_realloc(x->kills[which], (size_t)(n ? 2 * n : 1) * sizeof *v);
    if (v == NULL) return gc_fail(b->e, GCAP_ENOMEM, "make_graphed_callables: out of host memory");
    x->kills[which] = v;
  }
  x->kills[which][n].entry = i;
  x->kills[which][n].out = k;
  x->nkills[which]++;
  return GCAP_OK;
}

gcap_status gc_graphed_note_kills(ge_build *b) {
  gcap_graphed *G = b->G;
  gcap_status st = GCAP_OK;
  int j, w, i, k;
  for (j = 0; j < G->n; j++)
    for (w = 0; w < GE_NGRAPHS; w++) {
      gcap_graph *g = entry_graph(&G->v[j], w);
      for (i = 0; g != NULL && i < G->n; i++)
        for (k = 0; k < G->v[i].out.n && st == GCAP_OK; k++)
          if (i != j || w != GE_FWD) st = note_kill(b, &G->v[j], w, g, i, k);
      if (st != GCAP_OK) return st;
    }
  return GCAP_OK;
}

void gc_graphed_replayed(gcap_graphed *G, const ge_entry *x, int which) {
  int k;
  for (k = 0; which == GE_FWD && k < x->out.n; k++)
    if (x->out.t[k] != NULL) x->out.t[k]->blk->dead = 0;
  for (k = 0; k < x->nkills[which]; k++) {
    const ge_kill *d = &x->kills[which][k];
    gc_blk *blk = G->v[d->entry].out.t[d->out]->blk;
    blk->dead = d->entry + 1;
    blk->dead_k = d->out + 1;
  }
}
