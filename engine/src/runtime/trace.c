/*
** trace.c: a trace of the engine's work as Chrome trace-event JSON (the
** {"traceEvents": [...]} form that Perfetto and chrome://tracing open).
**
** Each span is one complete event ("ph": "X") written when it ends, with its
** start and duration in microseconds of the monotonic clock. Events go to
** the file as they happen (stdio buffers them), so a trace of any length
** takes constant memory; gcap_trace_stop, or the engine's release, closes
** the array and the file. Nothing is traced, and nothing costs more than a
** NULL test, while no trace is open.
**
** Spans (gc_span_begin, gc_span_end) are also the backend's profiler ranges
** (NVTX on cuda, opened only while a profiler listens), so that a timeline
** of Nsight Systems shows the phases the trace shows.
*/
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime.h"

struct gc_trace {
  FILE *f;
  char path[256];
  int pid;
  int failed; /* a write failed: reported by gcap_trace_stop */
};

/* Write s as the inside of a JSON string. */
static void tr_escape(FILE *f, const char *s) {
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\')
      fprintf(f, "\\%c", c);
    else if (c < 0x20)
      fprintf(f, "\\u%04x", c);
    else
      fputc(c, f);
  }
}

gcap_status gcap_trace_start(gcap_engine *e, const char *path) {
  gc_trace *t;
  if (e == NULL) return GCAP_EINVAL;
  gc_clear(e);
  if (path == NULL) return gc_null(e, "trace", "path");
  if (*path == '\0') return gc_fail(e, GCAP_EINVAL, "trace: the path is empty");
  if (e->trace != NULL)
    return gc_fail(e, GCAP_ESTATE, "trace: already tracing into '%s'; stop that trace first",
                   e->trace->path);
  if ((t = (gc_trace *)gc_calloc(1, sizeof *t)) == NULL)
    return gc_fail(e, GCAP_ENOMEM, "trace: out of host memory");
  if ((t->f = fopen(path, "w")) == NULL) {
    int err = errno;
    free(t);
    return gc_fail(e, GCAP_EINVAL, "trace: cannot write '%s': %s", path, strerror(err));
  }
  snprintf(t->path, sizeof t->path, "%s", path);
  t->pid = (int)getpid();
  fprintf(t->f,
          "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n"
          "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":1,"
          "\"args\":{\"name\":\"graphcap (%s)\"}}",
          t->pid, e->be->name);
  e->trace = t;
  return GCAP_OK;
}

gcap_status gcap_trace_stop(gcap_engine *e) {
  gc_trace *t;
  int bad;
  if (e == NULL) return GCAP_EINVAL;
  gc_clear(e);
  if ((t = e->trace) == NULL) return GCAP_OK;
  e->trace = NULL;
  fputs("\n]}\n", t->f);
  bad = t->failed || ferror(t->f);
  bad |= fclose(t->f) != 0;
  if (bad) gc_fail(e, GCAP_EINVAL, "trace: writing '%s' failed: %s", t->path, strerror(errno));
  free(t);
  return bad ? GCAP_EINVAL : GCAP_OK;
}

void gc_trace_span(gcap_engine *e, double t0, const char *cat, const char *fmt, ...) {
  gc_trace *t = e->trace;
  char name[GC_ERRLEN];
  va_list ap;
  double t1;
  if (t == NULL || t0 == 0.0) return; /* not tracing, or not when the span began */
  t1 = gc_now_ms() * 1e3;
  va_start(ap, fmt);
  vsnprintf(name, sizeof name, fmt, ap);
  va_end(ap);
  fputs(",\n{\"name\":\"", t->f);
  tr_escape(t->f, name);
  if (fprintf(t->f, "\",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":%d,\"tid\":1}",
              cat, t0, t1 - t0, t->pid) < 0)
    t->failed = 1;
}

void gc_span_open(gcap_engine *e, gc_span *s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(s->name, sizeof s->name, fmt, ap);
  va_end(ap);
  s->t0 = gc_trace_clock(e);
  s->ranged = e->ranges;
  if (s->ranged) e->be->range_push(e->bs, s->name);
}

void gc_span_close(gcap_engine *e, gc_span *s, const char *cat, const char *suffix) {
  if (s->ranged) e->be->range_pop(e->bs);
  gc_trace_span(e, s->t0, cat, "%s%s", s->name, suffix ? suffix : "");
}
