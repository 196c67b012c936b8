/*
** sqplus.h: the example's own op, y = x + x*x/2 elementwise on f32, as a
** graphcap custom op: its CUDA launch (sqplus.cu, built with the cuda
** backend) and its host twin (sqplus_host.c), the same callback type.
*/
#ifndef SQPLUS_H
#define SQPLUS_H

#include "graphcap.h"

gcap_status sqplus_host(void *ud, void *stream, int nin, const gcap_custom_arg *in, int nout,
                        const gcap_custom_arg *out);
#ifdef SQPLUS_CUDA
gcap_status sqplus_cuda(void *ud, void *stream, int nin, const gcap_custom_arg *in, int nout,
                        const gcap_custom_arg *out);
#endif

#endif
