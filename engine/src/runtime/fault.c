/*
** fault.c: every host allocation of the engine and its backends goes through
** gc_malloc, gc_calloc and gc_realloc, and the backends ask gc_fault before
** making device memory or objects, so that a test can make any one of them
** fail (gcap_test_fail_alloc, graphcap.h) and check that the failure is handled.
** The growable arrays grow through gc_growvector, so a test reaches them too.
*/
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

/* Allocations still to go before the injected failure (0: off). */
static _Thread_local long fault_left;
static _Thread_local int fault_hit;

long gcap_test_fail_alloc(long n) {
  long hit = fault_hit;
  fault_left = n > 0 ? n : 0;
  fault_hit = 0;
  return hit;
}

int gc_fault(void) {
  if (fault_left == 0 || --fault_left > 0) return 0;
  fault_hit = 1;
  return 1;
}

void *gc_malloc(size_t n) {
  return gc_fault() ? NULL : malloc(n);
}

void *gc_calloc(size_t n, size_t size) {
  return gc_fault() ? NULL : calloc(n, size);
}

void *gc_realloc(void *p, size_t n) {
  return gc_fault() ? NULL : realloc(p, n);
}

/* The body of gc_growvector (backend.h). *pv is the vector, read and written
** through memcpy because it may be a pointer to any object type (all have
** void *'s representation where graphcap runs). */
int gc_growaux(void *pv, int *cap, int need, size_t size, int min) {
  void *v;
  int n;
  if (need <= *cap) return 1;
  n = *cap > 0 ? *cap : min > 0 ? min : 1;
  while (n < need) /* twice as many, or as many as an int can count */
    n = n <= INT_MAX / 2 ? 2 * n : INT_MAX;
  if ((size_t)n > SIZE_MAX / size) return 0;
  memcpy(&v, pv, sizeof v);
  if ((v = gc_realloc(v, (size_t)n * size)) == NULL) return 0;
  memcpy(pv, &v, sizeof v);
  *cap = n;
  return 1;
}
