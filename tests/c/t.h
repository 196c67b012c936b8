/*
** t.h: the C tests' harness. One TAP line per test function (a check group):
** "ok N - name" or "not ok N - name (file:line: expr)", later failures of the
** same group as "#" lines (a skipped test: "ok N - name # SKIP why"), then
** "1..N" and "# N passed, M failed" (", K skipped" when some were). main()
** returns t_done(): 0 iff nothing failed. Only graphcap.h is used.
*/
#ifndef T_H
#define T_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graphcap.h"

static int t_num, t_npass, t_nfail, t_nskip, t_bad; /* t_bad: this group has failed */
static char t_why[512];                             /* its first failure */

static void t_fail_(const char *file, int line, const char *expr, const char *msg) {
  char buf[sizeof t_why];
  snprintf(buf, sizeof buf, "%s:%d: %s%s%s", file, line, expr, msg ? ": " : "", msg ? msg : "");
  if (!t_bad)
    memcpy(t_why, buf, sizeof buf);
  else
    printf("#   also %s\n", buf);
  t_bad = 1;
}

/* A failed check marks the group failed and goes on. */
#define T_CHECK(c)                                                                                 \
  do {                                                                                             \
    if (!(c)) t_fail_(__FILE__, __LINE__, #c, NULL);                                               \
  } while (0)
/* A failed requirement also leaves the test function (which returns void). */
#define T_REQUIRE(c)                                                                               \
  do {                                                                                             \
    if (!(c)) {                                                                                    \
      t_fail_(__FILE__, __LINE__, #c, NULL);                                                       \
      return;                                                                                      \
    }                                                                                              \
  } while (0)
/* A set-up step `ok` (non-zero on success) must succeed; otherwise fail the
** group, run `undo` (freeing what the step made) and leave the test function. */
#define T_SETUP(ok, undo)                                                                          \
  do {                                                                                             \
    if (!(ok)) {                                                                                   \
      t_fail_(__FILE__, __LINE__, #ok, "set-up failed");                                           \
      undo;                                                                                        \
      return;                                                                                      \
    }                                                                                              \
  } while (0)
/* `call` must return `want`; otherwise print its status and gcap_errmsg(e). */
#define T_CHECK_ST(e, call, want)                                                                  \
  do {                                                                                             \
    gcap_status t_st_ = (call);                                                                    \
    if (t_st_ != (want)) {                                                                         \
      char t_m_[400];                                                                              \
      snprintf(t_m_, sizeof t_m_, "got %s, want %s (%s)", gcap_status_str(t_st_),                  \
               gcap_status_str(want), gcap_errmsg(e));                                             \
      t_fail_(__FILE__, __LINE__, #call, t_m_);                                                    \
    }                                                                                              \
  } while (0)
/* `call` must succeed; otherwise fail and leave the test function. */
#define T_CHECK_OK(e, call)                                                                        \
  do {                                                                                             \
    gcap_status t_st_ = (call);                                                                    \
    if (t_st_ != GCAP_OK) {                                                                        \
      char t_m_[400];                                                                              \
      snprintf(t_m_, sizeof t_m_, "%s (%s)", gcap_status_str(t_st_), gcap_errmsg(e));              \
      t_fail_(__FILE__, __LINE__, #call, t_m_);                                                    \
      return;                                                                                      \
    }                                                                                              \
  } while (0)
/* A failed check with a printf-formatted message (naming, say, op, index and values). */
#define T_FAILF(expr, ...)                                                                         \
  do {                                                                                             \
    char t_fm_[400];                                                                               \
    snprintf(t_fm_, sizeof t_fm_, __VA_ARGS__);                                                    \
    t_fail_(__FILE__, __LINE__, expr, t_fm_);                                                      \
  } while (0)
/* |a - b| <= atol + rtol * |b|, b the reference (NaN fails). */
#define T_CHECK_NEAR(a, b, atol, rtol)                                                             \
  do {                                                                                             \
    double t_a_ = (a), t_b_ = (b);                                                                 \
    if (!(fabs(t_a_ - t_b_) <= (atol) + (rtol)*fabs(t_b_))) {                                      \
      char t_m_[120];                                                                              \
      snprintf(t_m_, sizeof t_m_, "%.9g vs %.9g", t_a_, t_b_);                                     \
      t_fail_(__FILE__, __LINE__, #a " ~ " #b, t_m_);                                              \
    }                                                                                              \
  } while (0)

#define T_RUN(fn) t_run_(#fn, fn)
/* After each test function, no engine it opened may be left alive: a
** leaked object (tensor, module, graph, ...) keeps its closed engine alive. */
static void t_run_(const char *name, void (*fn)(void)) {
  int64_t engines = gcap_live_engines();
  t_bad = 0, t_why[0] = '\0';
  fn();
  if (gcap_live_engines() > engines)
    t_fail_(__FILE__, __LINE__, "gcap_live_engines() == before",
            "an engine was left alive: an object of it was not freed");
  ++t_num;
  if (t_bad)
    ++t_nfail, printf("not ok %d - %s (%s)\n", t_num, name, t_why);
  else
    ++t_npass, printf("ok %d - %s\n", t_num, name);
  fflush(stdout);
}
/* Count test `name` as skipped, saying why (TAP: "ok N - name # SKIP why"). */
static inline void t_skip(const char *name, const char *why) {
  ++t_num, ++t_nskip;
  printf("ok %d - %s # SKIP %s\n", t_num, name, why);
  fflush(stdout);
}
static int t_done(void) {
  printf("1..%d\n# %d passed, %d failed", t_num, t_npass, t_nfail);
  if (t_nskip) printf(", %d skipped", t_nskip);
  printf("\n");
  return t_nfail ? 1 : 0;
}

/* The backend under test: GRAPHCAP_DEVICE=cuda, otherwise host. */
static inline gcap_device t_device(void) {
  const char *d = getenv("GRAPHCAP_DEVICE");
  return d && strcmp(d, "cuda") == 0 ? GCAP_DEVICE_CUDA : GCAP_DEVICE_HOST;
}
/* A new engine on t_device(); NULL (and the group failed) if it cannot open. */
static inline gcap_engine *t_engine(void) {
  gcap_engine *e = NULL;
  gcap_status st = gcap_engine_new(t_device(), &e);
  if (st != GCAP_OK) t_fail_(__FILE__, __LINE__, "gcap_engine_new", gcap_last_open_error());
  return e;
}
/* 1 when e's last error message contains `what`. */
static inline int t_msg_has(gcap_engine *e, const char *what) {
  return strstr(gcap_errmsg(e), what) != NULL;
}
/* Helpers that report the caller's line. t_from: a new f32 tensor copied from
** `data` (NULL on error); t_read: all numel values into dst (0 on error);
** t_value: the first value of t (NaN on error). */
#define t_from(e, nd, shape, data) t_from_(e, nd, shape, data, __FILE__, __LINE__)
#define t_read(t, dst, n) t_read_(t, dst, n, __FILE__, __LINE__)
#define t_value(t) t_value_(t, __FILE__, __LINE__)
static inline gcap_tensor *t_from_(gcap_engine *e, int nd, const int64_t *shape, const float *data,
                                   const char *file, int line) {
  gcap_tensor *t = NULL;
  if (gcap_tensor_from_f32(e, GCAP_F32, nd, shape, data, &t) != GCAP_OK)
    t_fail_(file, line, "gcap_tensor_from_f32", gcap_errmsg(e));
  return t;
}
static inline int t_read_(gcap_tensor *t, float *dst, size_t n, const char *file, int line) {
  if (t && gcap_tensor_read(t, dst, n) == GCAP_OK) return 1;
  t_fail_(file, line, "gcap_tensor_read", t ? gcap_errmsg(gcap_tensor_engine(t)) : "NULL tensor");
  return 0;
}
static inline double t_value_(gcap_tensor *t, const char *file, int line) {
  int64_t n = t ? gcap_tensor_numel(t) : 0;
  float *buf = malloc((size_t)(n > 0 ? n : 1) * sizeof *buf);
  double v = buf && t_read_(t, buf, (size_t)n, file, line) && n > 0 ? (double)buf[0] : (double)NAN;
  free(buf);
  return v;
}

#endif
