/*
** sqplus.cu: the example's CUDA kernel and its launch on the stream graphcap
** hands the callback; inside a capture the launch becomes a graph node.
*/
#include <cuda_runtime.h>

extern "C" {
#include "sqplus.h"
}

static __global__ void sqplus_kernel(const float *x, float *y, int64_t n) {
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] + 0.5f * x[i] * x[i];
}

extern "C" gcap_status sqplus_cuda(void *, void *stream, int nin, const gcap_custom_arg *in,
                                   int nout, const gcap_custom_arg *out) {
  if (nin != 1 || nout != 1 || in[0].dtype != GCAP_F32) return GCAP_EINVAL;
  int64_t n = in[0].numel;
  unsigned blocks = (unsigned)((n + 255) / 256);
  if (n == 0) return GCAP_OK;
  sqplus_kernel<<<blocks, 256, 0, (cudaStream_t)stream>>>((const float *)in[0].data,
                                                          (float *)out[0].data, n);
  return cudaGetLastError() == cudaSuccess ? GCAP_OK : GCAP_EDEVICE;
}
