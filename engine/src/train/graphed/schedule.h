/*
** schedule.h: the pass list of make_graphed_callables (schedule.c).
*/
#ifndef GC_SCHEDULE_H
#define GC_SCHEDULE_H

#include "train/train.h"

enum { GC_PASS_FWD, GC_PASS_BWD, GC_PASS_DW };

typedef struct gc_pass {
  int kind;     /* GC_PASS_FWD, GC_PASS_BWD or GC_PASS_DW */
  int entry;    /* index into sample_args and the returned entries */
  int callable; /* index into callables (and capture_time_hooks) */
  int chunk;    /* 0-based chunk of the order (the entry without one) */
  int pos;      /* position in the order (-1 without one) */
} gc_pass;

typedef struct gc_schedule {
  gc_pass *v; /* in replay (and capture) order */
  int n, cap;
  int *entry_callable; /* [nentries] */
  int delayed_wgrad;   /* the order holds wgrad entries */
} gc_schedule;

/* Validate `order` (NULL: none) and expand it; errors name the position and
** the rule. Eval mode (training = 0) keeps forwards only. */
gcap_status gc_schedule_build(gcap_engine *e, const double *order, int len, const int *nlpc,
                              int nchunks, int ncallables, int nentries, int training,
                              gc_schedule *s);
void gc_schedule_free(gc_schedule *s);

#endif
