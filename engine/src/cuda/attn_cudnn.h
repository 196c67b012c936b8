/*
** attn_cudnn.h: the cuda backend's attention through cuDNN's fused flash
** attention (attn_cudnn.cpp, plain C++ built by g++: the cuDNN frontend's
** headers hold no device code). The launches of the fused attention that
** carry GC_ATTN_CUDNN come here (backend.h says what they compute).
*/
#ifndef GC_CUDA_ATTN_CUDNN_H
#define GC_CUDA_ATTN_CUDNN_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#include "runtime/backend.h"

/* A backend's cuDNN state: its handle, and the graphs built so far with
** their workspaces. */
typedef struct cu_dnn cu_dnn;

/* gc_backend.attn_supported of the cuda backend. *d is the state, made on
** the first call that needs it (NULL before). The arguments it takes:
** bf16, dropout with the generator's state, no mask (causal or none), D = Dv a multiple of 8 up
** to 128, q, k, v non-empty and GC_ATTN_CUDNN_ALIGN-byte aligned, and
** libcudnn.so.9 loaded (once a process); then cuDNN must build the forward
** graph of these sizes, causality, scale, dropout and layout (and, with backward, the
** deterministic backward's). Graphs and their workspaces are built on the
** first call of a key outside a capture and kept until cu_dnn_free; under a
** capture nothing is built (nor allocated), and a key not built yet is
** declined. */
int cu_dnn_supported(cu_dnn **d, const gc_kargs *a, int backward, int capturing, char *why,
                     size_t n);

/* Launch kernel k (GC_K_ATTN, or GC_K_ATTN_BWD_DQ computing dq, dk and dv)
** of arguments a carrying GC_ATTN_CUDNN on stream s, through the graph
** cu_dnn_supported built for them. */
gcap_status cu_dnn_run(gcap_engine *e, cu_dnn *d, cudaStream_t s, int k, const gc_kargs *a);

/* Free the state (NULL: nothing): graphs, workspaces and the handle. */
void cu_dnn_free(cu_dnn *d);

#endif
