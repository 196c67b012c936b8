/*
** sqplus_host.c: the host twin of sqplus.cu, run by the host backend (at
** once, or at each replay of a graph that recorded it).
*/
#include "sqplus.h"

gcap_status sqplus_host(void *ud, void *stream, int nin, const gcap_custom_arg *in, int nout,
                        const gcap_custom_arg *out) {
  const float *x = (const float *)in[0].data;
  float *y = (float *)out[0].data;
  int64_t i;
  (void)ud, (void)stream;
  if (nin != 1 || nout != 1 || in[0].dtype != GCAP_F32) return GCAP_EINVAL;
  for (i = 0; i < in[0].numel; i++)
    y[i] = x[i] + 0.5f * x[i] * x[i];
  return GCAP_OK;
}
