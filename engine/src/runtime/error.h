/*
** error.h: the bottom of the runtime layer, the error reporting every other
** file uses (error.c): an engine's last-error message, the message of a
** failed gcap_engine_new, and the status strings. Nothing here knows the
** engine's life cycle; the backends reach it through backend.h.
*/
#ifndef GC_ERROR_H
#define GC_ERROR_H

#include "graphcap_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of a message, its terminating zero included. */
#define GC_ERRLEN 1024

/* Set e's error message (printf-style; e NULL: the message of a failed
** gcap_engine_new, per thread) and return st. */
gcap_status gc_fail(gcap_engine *e, gcap_status st, const char *fmt, ...)
#ifdef __GNUC__
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* Set the failed-open message of this thread: to "" (msg NULL) at the start
** of gcap_engine_new, or to msg, the message of the engine it failed to build. */
void gc_set_open_error(const char *msg);

#ifdef __cplusplus
}
#endif

#endif
