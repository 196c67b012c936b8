/*
** error.c: the last-error messages and the status strings, apart from the
** engine's life cycle (engine.c): every file, the backends included, reports
** through gc_fail, and the public getters read what it wrote.
*/
#include <stdarg.h>
#include <stdio.h>

#include "runtime.h"

/* The message of this thread's last failed gcap_engine_new (no engine to hold it). */
static _Thread_local char open_err[GC_ERRLEN];

const char *gcap_status_str(gcap_status st) {
  switch (st) {
    case GCAP_OK:
      return "ok";
    case GCAP_EINVAL:
      return "invalid argument";
    case GCAP_ENOMEM:
      return "out of memory";
    case GCAP_EDEVICE:
      return "device error";
    case GCAP_ECAPTURE:
      return "not allowed during capture";
    case GCAP_ESTATE:
      return "wrong state";
    case GCAP_EREPLAY:
      return "replay order refused";
    case GCAP_EUNSUPPORTED:
      return "unsupported";
    case GCAP_EABORTED:
      return "aborted";
  }
  return "unknown status";
}

gcap_status gc_fail(gcap_engine *e, gcap_status st, const char *fmt, ...) {
  va_list ap;
  char *buf = e ? e->err : open_err;
  va_start(ap, fmt);
  vsnprintf(buf, GC_ERRLEN, fmt, ap);
  va_end(ap);
  return st;
}

gcap_status gc_null(gcap_engine *e, const char *op, const char *arg) {
  return gc_fail(e, GCAP_EINVAL, "%s: %s is NULL", op, arg);
}

gcap_status gc_foreign(gcap_engine *e, const char *op, const char *arg) {
  return gc_fail(e, GCAP_EINVAL, "%s: %s belongs to another engine", op, arg);
}

gcap_status gc_bad_count(gcap_engine *e, const char *op, const char *arg, int n) {
  return gc_fail(e, GCAP_EINVAL, "%s: %s is %d", op, arg, n);
}

void gc_set_open_error(const char *msg) {
  snprintf(open_err, sizeof open_err, "%s", msg ? msg : "");
}

const char *gcap_last_open_error(void) {
  return open_err;
}

const char *gcap_errmsg(const gcap_engine *e) {
  return e ? e->err : open_err;
}
