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

#include "train/train.h"
#include "schedule.h"

static gcap_status sched_push(gcap_engine *e, gc_schedule *s, int kind, int entry, int callable,
                              int chunk, int pos) {
  if (s->n == s->cap) {
    int cap = s->cap ? 2 * s->cap : 32;
    gc_pass *v = (gc_pass *)gc_realloc(s->v, (size_t)cap * sizeof *v);
    if (v == NULL) return gc_fail(e, GCAP_ENOMEM, "make_graphed_callables: out of host memory");
    s->v = v;
    s->cap = cap;
  }
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

gcap_status gc_schedule_build(gcap_engine *e, const double *order, int len, const int *nlpc,
                              int nchunks, int ncallables, int nentries, int training,
                              gc_schedule *s) {
  int K = 0, M = -1, p, m, total = 0;
  int *fwd = NULL, *bwd = NULL, *prefix = NULL, *layers = NULL, *last_bwd_pos = NULL,
      *dw_done = NULL;
  gcap_status st = GCAP_OK;
  memset(s, 0, sizeof *s);
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
  /* rule 1: integers, or -(k + 0.5) for delayed wgrad; K = largest forward */
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
    if (v > 0 && v > K) K = (int)v;
  }
  if (K == 0) return order_fail(e, 0, order[0], "the order holds no forward entry");
  for (p = 0; p < len; p++)
    if ((int)floor(fabs(order[p])) > K)
      return order_fail(e, p, order[p], "|entry| must be in 1..%d (the largest forward entry)", K);
  fwd = (int *)gc_calloc((size_t)K, sizeof(int));
  bwd = (int *)gc_calloc((size_t)K, sizeof(int));
  prefix = (int *)gc_calloc((size_t)K + 1, sizeof(int));
  layers = (int *)gc_calloc((size_t)K, sizeof(int));
  last_bwd_pos = (int *)gc_calloc((size_t)K, sizeof(int));
  dw_done = (int *)gc_calloc((size_t)K, sizeof(int));
  if (!fwd || !bwd || !prefix || !layers || !last_bwd_pos || !dw_done) {
    st = gc_fail(e, GCAP_ENOMEM, "make_graphed_callables: out of host memory");
    goto done;
  }
  /* rules 2-4: equal forward/backward counts, backward b after forward b,
  ** a wgrad right after (per chunk) a backward of its chunk */
  for (m = 0; m < K; m++)
    last_bwd_pos[m] = -1;
  for (p = 0; p < len; p++) {
    double v = order[p];
    int k = (int)floor(fabs(v)) - 1;
    if (v > 0) {
      fwd[k]++;
    } else if (v == floor(v)) {
      if (bwd[k] >= fwd[k]) {
        st = order_fail(e, p, v, "the %s backward of chunk %d comes before its %s forward",
                        ordinal(bwd[k] + 1), k + 1, ordinal(bwd[k] + 1));
        goto done;
      }
      bwd[k]++;
      last_bwd_pos[k] = p;
      dw_done[k] = 0;
    } else {
      if (last_bwd_pos[k] < 0 || dw_done[k]) {
        st = order_fail(e, p, v,
                        "a delayed wgrad -(%d + 0.5) must follow a backward of chunk %d, with "
                        "no other wgrad of that chunk between",
                        k + 1, k + 1);
        goto done;
      }
      dw_done[k] = 1;
    }
  }
  for (m = 0; m < K; m++) {
    if (fwd[m] == 0) {
      st = gc_fail(e, GCAP_EINVAL,
                   "make_graphed_callables: order has no forward of chunk %d (chunks are 1..%d)",
                   m + 1, K);
      goto done;
    }
    if (M < 0) M = fwd[m];
    if (fwd[m] != M || (training && bwd[m] != fwd[m])) {
      int last = 0; /* the chunk's last entry: where its count ended up wrong */
      for (p = 0; p < len; p++)
        if ((int)floor(fabs(order[p])) == m + 1) last = p;
      st = order_fail(e, last, order[last],
                      "every chunk needs the same number of forwards and as many backwards; "
                      "chunk %d has %d forwards and %d backwards, chunk 1 has %d forwards",
                      m + 1, fwd[m], bwd[m], M);
      goto done;
    }
  }
  /* rule 5: layers per chunk */
  if (nlpc != NULL) {
    if (nchunks != K) {
      st = gc_fail(
          e, GCAP_EINVAL,
          "make_graphed_callables: num_layers_per_chunk has %d entries, the order has %d chunks",
          nchunks, K);
      goto done;
    }
    for (m = 0; m < K; m++) {
      if (nlpc[m] < 0) {
        st = gc_fail(e, GCAP_EINVAL, "make_graphed_callables: num_layers_per_chunk[%d] is negative",
                     m + 1);
        goto done;
      }
      layers[m] = nlpc[m];
    }
  } else {
    if (nentries % (K * M) != 0) {
      st = gc_fail(
          e, GCAP_EINVAL,
          "make_graphed_callables: %d sample_args entries do not divide into %d chunks x %d "
          "microbatches; give num_layers_per_chunk",
          nentries, K, M);
      goto done;
    }
    for (m = 0; m < K; m++)
      layers[m] = nentries / K / M;
  }
  for (m = 0; m < K; m++) {
    prefix[m + 1] = prefix[m] + layers[m];
    total += layers[m];
  }
  if (total != ncallables) {
    st = gc_fail(
        e, GCAP_EINVAL,
        "make_graphed_callables: num_layers_per_chunk sums to %d, but there are %d callables",
        total, ncallables);
    goto done;
  }
  if (nentries != total * M) {
    st = gc_fail(e, GCAP_EINVAL,
                 "make_graphed_callables: expected %d sample_args entries (%d layers x %d "
                 "microbatches), got %d",
                 total * M, total, M, nentries);
    goto done;
  }
  for (m = 0; m < K; m++) {
    int b, l;
    for (b = 0; b < M; b++)
      for (l = 0; l < layers[m]; l++)
        s->entry_callable[prefix[m] * M + b * layers[m] + l] = prefix[m] + l;
    fwd[m] = bwd[m] = 0;
  }
  /* expand */
  for (p = 0; p < len && st == GCAP_OK; p++) {
    double v = order[p];
    int k = (int)floor(fabs(v)) - 1, n = layers[k], l;
    if (v > 0) {
      for (l = 0; l < n && st == GCAP_OK; l++)
        st = sched_push(e, s, GC_PASS_FWD, prefix[k] * M + fwd[k] * n + l, prefix[k] + l, k, p);
      fwd[k]++;
    } else if (!training) {
      continue; /* eval: forwards only */
    } else if (v == floor(v)) {
      for (l = n - 1; l >= 0 && st == GCAP_OK; l--)
        st = sched_push(e, s, GC_PASS_BWD, prefix[k] * M + bwd[k] * n + l, prefix[k] + l, k, p);
      bwd[k]++;
    } else {
      for (l = n - 1; l >= 0 && st == GCAP_OK; l--)
        st =
            sched_push(e, s, GC_PASS_DW, prefix[k] * M + (bwd[k] - 1) * n + l, prefix[k] + l, k, p);
    }
  }
  s->delayed_wgrad = 0;
  for (p = 0; p < len; p++)
    if (order[p] != floor(order[p])) s->delayed_wgrad = 1;
done:
  free(fwd);
  free(bwd);
  free(prefix);
  free(layers);
  free(last_bwd_pos);
  free(dw_done);
  return st;
}
