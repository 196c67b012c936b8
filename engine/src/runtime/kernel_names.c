/*
** kernel_names.c: the kernels' names, from the catalogue in backend.h.
*/
#include "backend.h"

#define GC_K_NAME(id, name, family, writes) [GC_K_##id] = #name,
const char *const gc_kernel_names[GC_K_COUNT] = {GC_KERNELS(GC_K_NAME)};
#undef GC_K_NAME
