/*
** none.c: the cuda backend of a CUDA=0 build: absent, and no device visible.
*/
#include <stddef.h>

#include "runtime/backend.h"

const gc_backend *gc_cuda_backend(void) {
  return NULL;
}

int gc_cuda_probe(void) {
  return 0;
}
