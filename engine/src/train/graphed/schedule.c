/*
** schedule.c: the replay schedule of make_graphed_callables. It validates
** `order` (TE's _order, fully: every error names the position and the rule)
** and expands it into passes over entries: forward of (chunk, microbatch,
** layer) for layers 0..n-1, backward for layers n-1..0, delayed wgrad after
** a backward. Without an order: all forwards, then all backwards reversed.
**
** Entry index of (chunk m, microbatch b, layer l): prefix[m]*M + b*n[m] + l;
** its callable: prefix[m] + l.
*/
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graphed.h"

static gcap_status sched_push(gcap_engine *e, gc_schedule *s, int kind, int entry, int callable,
                              int chunk, int pos) {
  if (!gc_growvector(s->v, s->cap, s->n + 1, 32))
    return gc_fail(e, GCAP_ENOMEM, "make_graphed_callables: out of host memory");
  s->v[s->n].kind = kind;
  s->v[s->n].entry = entry;
  s->v[s->n].callable = callable;
  s->v[s->n].chunk = chunk;
  s->v[s->n].pos = pos;
  s->n++;
  return GCAP_OK;
}

void gc_schedule_free(gc_schedule *s) {
  free(s->v);
  free(s->entry_callable);
  memset(s, 0, sizeof *s);
}

static const char *ordinal(int b) {
  static _Thread_local char buf[16];
  const char *suf = (b % 100 >= 11 && b % 100 <= 13) ? "th"
                    : b % 10 == 1                    ? "st"
                    : b % 10 == 2                    ? "nd"
                    : b % 10 == 3                    ? "rd"
                                                     : "th";
  snprintf(buf, sizeof buf, "%d%s", b, suf);
  return buf;
}

/* An order error naming the 1-based position, its value and the rule. */
static gcap_status order_fail(gcap_engine *e, int pos, double val, const char *fmt, ...)
#ifdef __GNUC__
    __attribute__((format(printf, 4, 5)))
#endif
    ;
static gcap_status order_fail(gcap_engine *e, int pos, double val, const char *fmt, ...) {
  char rule[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(rule, sizeof rule, fmt, ap);
  va_end(ap);
  return gc_fail(e, GCAP_EINVAL, "make_graphed_callables: order position %d (value %g): %s",
                 pos + 1, val, rule);
}

/* No order: forwards 0..N-1, then (training) backwards N-1..0. */
static gcap_status sched_plain(gcap_engine *e, int ncallables, int nentries, int training,
                               gc_schedule *s) {
  int i;
  gcap_status st;
  if (nentries != ncallables)
    return gc_fail(e, GCAP_EINVAL,
                   "make_graphed_callables: expected sample_args to have the same length as "
                   "callables (%d), got %d",
                   ncallables, nentries);
  for (i = 0; i < nentries; i++) {
    s->entry_callable[i] = i;
    if ((st = sched_push(e, s, GC_PASS_FWD, i, i, i, -1)) != GCAP_OK) return st;
  }
  for (i = nentries - 1; training && i >= 0; i--)
    if ((st = sched_push(e, s, GC_PASS_BWD, i, i, i, -1)) != GCAP_OK) return st;
  return GCAP_OK;
}

/* The chunks of an order while it is checked and expanded. */
typedef struct sched_chunks {
  int K, M;             /* chunks (the largest forward entry), microbatches of each */
  int *fwd, *bwd;       /* [K] forwards and backwards seen so far */
  int *prefix, *layers; /* [K + 1] callables before each chunk, [K] its layers */
  int *last_bwd_pos;    /* [K] position of the chunk's last backward (-1: none yet) */
  int *dw_done;         /* [K] that backward has had its wgrad */
} sched_chunks;

static gcap_status chunks_new(gcap_engine *e, sched_chunks *c) {
  int m;
  c->fwd = (int *)gc_calloc((size_t)c->K, sizeof(int));
  c->bwd = (int *)gc_calloc((size_t)c->K, sizeof(int));
  c->prefix = (int *)gc_calloc((size_t)c->K + 1, sizeof(int));
  c->layers = (int *)gc_calloc((size_t)c->K, sizeof(int));
  c->last_bwd_pos = (int *)gc_calloc((size_t)c->K, sizeof(int));
  c->dw_done = (int *)gc_calloc((size_t)c->K, sizeof(int));
  if (!c->fwd || !c->bwd || !c->prefix || !c->layers || !c->last_bwd_pos || !c->dw_done)
    return gc_fail(e, GCAP_ENOMEM, "make_graphed_callables: out of host memory");
  for (m = 0; m < c->K; m++)
    c->last_bwd_pos[m] = -1;
  return GCAP_OK;
}

static void chunks_free(sched_chunks *c) {
  free(c->fwd);
  free(c->bwd);
  free(c->prefix);
  free(c->layers);
  free(c->last_bwd_pos);
  free(c->dw_done);
}

/* rule 1: integers, or -(k + 0.5) for delayed wgrad; *K = largest forward */
static gcap_status sched_entries(gcap_engine *e, const double *order, int len, int *K) {
  int p;
  *K = 0;
  for (p = 0; p < len; p++) {
    double v = order[p], a = fabs(v);
    if (!isfinite(v) || v == 0.0)
      return order_fail(e, p, v, "entries are non-zero chunk numbers (+k forward, -k backward)");
    if (a > (double)len) /* K <= len: no chunk can be numbered higher (and ints stay ints) */
      return order_fail(e, p, v, "|entry| must be a chunk number, at most the order's length %d",
                        len);
    if (a != floor(a)) {
      if (a - floor(a) != 0.5)
        return order_fail(e, p, v,
                          "a non-integer entry must be -(k + 0.5), the delayed wgrad of chunk k");
      if (v > 0) return order_fail(e, p, v, "forward entries must be integers");
    }
    if (v > 0 && v > *K) *K = (int)v;
  }
  if (*K == 0) return order_fail(e, 0, order[0], "the order holds no forward entry");
  for (p = 0; p < len; p++)
    if ((int)floor(fabs(order[p])) > *K)
      return order_fail(e, p, order[p], "|entry| must be in 1..%d (the largest forward entry)", *K);
  return GCAP_OK;
}

/* rules 3-4: backward b after forward b, a wgrad right after (per chunk) a
** backward of its chunk; counts each chunk's forwards and backwards */
static gcap_status sched_pairs(gcap_engine *e, const double *order, int len, sched_chunks *c) {
  int p;
  for (p = 0; p < len; p++) {
    double v = order[p];
    int k = (int)floor(fabs(v)) - 1;
    if (v > 0) {
      c->fwd[k]++;
    } else if (v == floor(v)) {
      if (c->bwd[k] >= c->fwd[k])
        return order_fail(e, p, v, "the %s backward of chunk %d comes before its %s forward",
                          ordinal(c->bwd[k] + 1), k + 1, ordinal(c->bwd[k] + 1));
      c->bwd[k]++;
      c->last_bwd_pos[k] = p;
      c->dw_done[k] = 0;
    } else {
      if (c->last_bwd_pos[k] < 0 || c->dw_done[k])
        return order_fail(e, p, v,
                          "a delayed wgrad -(%d + 0.5) must follow a backward of chunk %d, with "
                          "no other wgrad of that chunk between",
                          k + 1, k + 1);
      c->dw_done[k] = 1;
    }
  }
  return GCAP_OK;
}

/* rule 2: every chunk has forwards, as many as chunk 1 (c->M), and in
** training as many backwards */
static gcap_status sched_counts(gcap_engine *e, const double *order, int len, int training,
                                sched_chunks *c) {
  int m, p;
  c->M = -1;
  for (m = 0; m < c->K; m++) {
    if (c->fwd[m] == 0)
      return gc_fail(e, GCAP_EINVAL,
                     "make_graphed_callables: order has no forward of chunk %d (chunks are 1..%d)",
                     m + 1, c->K);
    if (c->M < 0) c->M = c->fwd[m];
    if (c->fwd[m] != c->M || (training && c->bwd[m] != c->fwd[m])) {
      int last = 0; /* the chunk's last entry: where its count ended up wrong */
      for (p = 0; p < len; p++)
        if ((int)floor(fabs(order[p])) == m + 1) last = p;
      return order_fail(e, last, order[last],
                        "every chunk needs the same number of forwards and as many backwards; "
                        "chunk %d has %d forwards and %d backwards, chunk 1 has %d forwards",
                        m + 1, c->fwd[m], c->bwd[m], c->M);
    }
  }
  return GCAP_OK;
}

/* rule 5: layers per chunk (given, or the entries divided evenly), summing
** to the callables; each entry's callable into s */
static gcap_status sched_layers(gcap_engine *e, const int *nlpc, int nchunks, int ncallables,
                                int nentries, sched_chunks *c, gc_schedule *s) {
  int m, b, l, K = c->K, M = c->M, total = 0;
  if (nlpc != NULL) {
    if (nchunks != K)
      return gc_fail(
          e, GCAP_EINVAL,
          "make_graphed_callables: num_layers_per_chunk has %d entries, the order has %d chunks",
          nchunks, K);
    for (m = 0; m < K; m++) {
      if (nlpc[m] < 0)
        return gc_fail(e, GCAP_EINVAL,
                       "make_graphed_callables: num_layers_per_chunk[%d] is negative", m + 1);
      c->layers[m] = nlpc[m];
    }
  } else {
    if (nentries % (K * M) != 0)
      return gc_fail(
          e, GCAP_EINVAL,
          "make_graphed_callables: %d sample_args entries do not divide into %d chunks x %d "
          "microbatches; give num_layers_per_chunk",
          nentries, K, M);
    for (m = 0; m < K; m++)
      c->layers[m] = nentries / K / M;
  }
  for (m = 0; m < K; m++) {
    c->prefix[m + 1] = c->prefix[m] + c->layers[m];
    total += c->layers[m];
  }
  if (total != ncallables)
    return gc_fail(
        e, GCAP_EINVAL,
        "make_graphed_callables: num_layers_per_chunk sums to %d, but there are %d callables",
        total, ncallables);
  if (nentries != total * M)
    return gc_fail(e, GCAP_EINVAL,
                   "make_graphed_callables: expected %d sample_args entries (%d layers x %d "
                   "microbatches), got %d",
                   total * M, total, M, nentries);
  for (m = 0; m < K; m++)
    for (b = 0; b < M; b++)
      for (l = 0; l < c->layers[m]; l++)
        s->entry_callable[c->prefix[m] * M + b * c->layers[m] + l] = c->prefix[m] + l;
  return GCAP_OK;
}

/* Expansion: each order value into its chunk's layers, forwards 0..n-1,
** backwards and wgrads n-1..0 (eval: forwards only) */
static gcap_status sched_expand(gcap_engine *e, const double *order, int len, int training,
                                sched_chunks *c, gc_schedule *s) {
  gcap_status st = GCAP_OK;
  int m, p, M = c->M;
  for (m = 0; m < c->K; m++)
    c->fwd[m] = c->bwd[m] = 0;
  for (p = 0; p < len && st == GCAP_OK; p++) {
    double v = order[p];
    int k = (int)floor(fabs(v)) - 1, n = c->layers[k], base = c->prefix[k], l;
    if (v > 0) {
      for (l = 0; l < n && st == GCAP_OK; l++)
        st = sched_push(e, s, GC_PASS_FWD, base * M + c->fwd[k] * n + l, base + l, k, p);
      c->fwd[k]++;
    } else if (!training) {
      continue; /* eval: forwards only */
    } else if (v == floor(v)) {
      for (l = n - 1; l >= 0 && st == GCAP_OK; l--)
        st = sched_push(e, s, GC_PASS_BWD, base * M + c->bwd[k] * n + l, base + l, k, p);
      c->bwd[k]++;
    } else {
      for (l = n - 1; l >= 0 && st == GCAP_OK; l--)
        st = sched_push(e, s, GC_PASS_DW, base * M + (c->bwd[k] - 1) * n + l, base + l, k, p);
    }
  }
  s->delayed_wgrad = 0;
  for (p = 0; p < len; p++)
    if (order[p] != floor(order[p])) s->delayed_wgrad = 1;
  return st;
}

gcap_status gc_schedule_build(gcap_engine *e, const double *order, int len, const int *nlpc,
                              int nchunks, int ncallables, int nentries, int training,
                              gc_schedule *s) {
  sched_chunks c;
  gcap_status st;
  memset(s, 0, sizeof *s);
  memset(&c, 0, sizeof c);
  if (nentries <= 0 || ncallables <= 0)
    return gc_fail(e, GCAP_EINVAL, "make_graphed_callables: no callables or no sample_args");
  if ((s->entry_callable = (int *)gc_calloc((size_t)nentries, sizeof(int))) == NULL)
    return gc_fail(e, GCAP_ENOMEM, "make_graphed_callables: out of host memory");
  if (order == NULL) {
    if (nlpc != NULL)
      return gc_fail(e, GCAP_EINVAL, "make_graphed_callables: num_layers_per_chunk needs order");
    return sched_plain(e, ncallables, nentries, training, s);
  }
  if (len <= 0) return gc_fail(e, GCAP_EINVAL, "make_graphed_callables: order is empty");
  if ((st = sched_entries(e, order, len, &c.K)) != GCAP_OK) return st;
  if ((st = chunks_new(e, &c)) == GCAP_OK && (st = sched_pairs(e, order, len, &c)) == GCAP_OK &&
      (st = sched_counts(e, order, len, training, &c)) == GCAP_OK &&
      (st = sched_layers(e, nlpc, nchunks, ncallables, nentries, &c, s)) == GCAP_OK)
    st = sched_expand(e, order, len, training, &c, s);
  chunks_free(&c);
  return st;
}
