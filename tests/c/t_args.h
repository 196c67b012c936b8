/*
** t_args.h: the harness of the bad-argument suites (test_api_args.c,
** test_api_args_train.c): BAD checks that a call returns its status and
** leaves a message of its own naming the argument, FOREIGN that it also
** says whose the argument is, NOENG a call with no engine to tell. Include
** it after t.h; every helper is static inline.
*/
#ifndef T_ARGS_H
#define T_ARGS_H

#include <ctype.h>
#include <stdint.h>

#include "t.h"

/* The stale message: a trace that cannot be opened; with no engine, the
** message of a failed open (gcap_errmsg(NULL)). */
static char stale_msg[1024];

static inline void stale(gcap_engine *e) {
  gcap_engine *none = NULL;
  if (e != NULL)
    T_CHECK(gcap_trace_start(e, "/nonexistent-graphcap-dir/stale.json") == GCAP_EINVAL);
  else
    T_CHECK(gcap_engine_new((gcap_device)99, &none) == GCAP_EINVAL && none == NULL);
  snprintf(stale_msg, sizeof stale_msg, "%s", gcap_errmsg(e));
  T_CHECK(stale_msg[0] != '\0');
}

/* 1 when `word` is in s with no letter, digit or '_' on either side. */
static inline int has_word(const char *s, const char *word) {
  size_t n = strlen(word);
  const char *p;
  for (p = strstr(s, word); p != NULL; p = strstr(p + 1, word)) {
    int before = p > s && (isalnum((unsigned char)p[-1]) || p[-1] == '_');
    int after = isalnum((unsigned char)p[n]) || p[n] == '_';
    if (!before && !after) return 1;
  }
  return 0;
}

static inline void bad_(gcap_engine *e, gcap_status st, gcap_status want, const char *arg,
                        const char *call, int line) {
  const char *m = gcap_errmsg(e);
  char why[400];
  if (st == want && strcmp(m, stale_msg) != 0 && has_word(m, arg)) return;
  snprintf(why, sizeof why, "got %s, want %s naming '%s'; message \"%s\"", gcap_status_str(st),
           gcap_status_str(want), arg, m);
  t_fail_(__FILE__, line, call, why);
}
/* `call` returns `want`, and e's message is new and names `arg`. */
#define BAD(e, want, arg, call)                                                                    \
  do {                                                                                             \
    stale(e);                                                                                      \
    bad_((e), (call), (want), (arg), #call, __LINE__);                                             \
  } while (0)
/* As BAD, the message also saying whose the argument is. */
#define FOREIGN(e, arg, call)                                                                      \
  do {                                                                                             \
    BAD(e, GCAP_EINVAL, arg, call);                                                                \
    T_CHECK(t_msg_has(e, "another engine"));                                                       \
  } while (0)
/* A non-NULL value of an out pointer: a failed call must set it to NULL. */
#define BOGUS(type) ((type *)(uintptr_t)0x10)
/* No engine to tell: only the status. */
#define NOENG(want, call) T_CHECK((call) == (want))

/* Two engines and a tensor of each: x [2, 3] of ones on e, y [2, 3] on e2. */
typedef struct fx {
  gcap_engine *e, *e2;
  gcap_tensor *x, *y;
} fx;

static inline int fx_open(fx *f) {
  const int64_t s[2] = {2, 3};
  memset(f, 0, sizeof *f);
  f->e = t_engine(), f->e2 = t_engine();
  return f->e && f->e2 && gcap_tensor_full(f->e, GCAP_F32, 2, s, 1.0, &f->x) == GCAP_OK &&
         gcap_tensor_full(f->e2, GCAP_F32, 2, s, 1.0, &f->y) == GCAP_OK;
}

static inline void fx_close(fx *f) {
  gcap_tensor_free(f->x), gcap_tensor_free(f->y);
  gcap_engine_free(f->e), gcap_engine_free(f->e2);
}

/* A ud_free that counts its calls: every refusal must free a ud once. */
static int n_ud_freed;
static inline void count_ud_free(void *ud) {
  (void)ud;
  n_ud_freed++;
}
#endif
