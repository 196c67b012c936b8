/*
** backend.cu: the cuda backend's gc_backend table: memory, streams, events,
** copies, kernel dispatch and CUDA graphs captured from a stream.
**
** Captures run in thread-local mode on the engine's non-blocking streams.
** The engine owns all memory (cudaMalloc under the relaxed capture mode, so
** its pools can grow while a capture is open): a graph holding memory-alloc
** or memory-free nodes means a library allocated during capture, an error.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nvtx3/nvToolsExt.h>

#include "common.cuh"

static void cu_shutdown(void *bs) {
  cu_state *st = (cu_state *)bs;
  if (!st) return;
  cu_plans_free(st);
  cu_fp8_plans_free(st);
  cu_dnn_free(st->dnn);
  if (st->lt) cublasLtDestroy(st->lt);
  if (st->blas) cublasDestroy(st->blas);
  if (st->ws) cu_drop(cudaFree(st->ws));
  if (st->upload) cu_drop(cudaStreamDestroy(st->upload));
  free(st);
}

/* The device of this process: 0, or under mpirun one GPU per rank of a
** machine, the launcher's local rank mod the device count (gcap_dist_init
** checks that it is the local rank MPI reports). */
static int cu_pick_device(void) {
  const char *v = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  int n = 0;
  if (v == NULL || cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
    (void)cudaGetLastError();
    return 0;
  }
  return atoi(v) % n;
}

/* The device (cu_pick_device), its cuBLAS handles and workspace (before any
** capture: creating them during one would invalidate it), and the upload
** stream. The handle gets the workspace at once, so that it never allocates
** one of its own. */
static gcap_status cu_setup(gcap_engine *e, cu_state *st) {
  st->dev = cu_pick_device();
  CUDA_TRY(e, cudaSetDevice(st->dev));
  CUDA_TRY(e, cudaStreamCreateWithFlags(&st->upload, cudaStreamNonBlocking));
  CUDA_TRY(e, cudaMalloc(&st->ws, CU_WORKSPACE));
  CUBLAS_TRY(e, cublasCreate(&st->blas));
  CUBLAS_TRY(e, cublasLtCreate(&st->lt));
  /* The handle's settings, once: alpha and beta are host values baked into a
  ** captured graph; plain float math (no TF32: results are compared with the
  ** host at rtol 1e-4), and bf16 GEMMs reduce split-K partial sums in float;
  ** no atomics, so that a replay equals the eager run bit for bit. */
  CUBLAS_TRY(e, cublasSetPointerMode(st->blas, CUBLAS_POINTER_MODE_HOST));
  CUBLAS_TRY(e, cublasSetMathMode(
                    st->blas, (cublasMath_t)(CUBLAS_DEFAULT_MATH |
                                             CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
  CUBLAS_TRY(e, cublasSetAtomicsMode(st->blas, CUBLAS_ATOMICS_NOT_ALLOWED));
  return cu_blas_stream(e, st, st->upload);
}

static gcap_status cu_init(gcap_engine *e, void **bs) {
  *bs = NULL;
  cu_state *st = (cu_state *)calloc(1, sizeof *st);
  if (!st) return gc_fail(e, GCAP_ENOMEM, "cuda: out of host memory");
  gcap_status r = cu_setup(e, st);
  if (r != GCAP_OK) {
    cu_shutdown(st);
    return r;
  }
  *bs = st;
  return GCAP_OK;
}

/* ------------------------------------------------------------------------ */
/* Memory                                                                    */

void cu_lt_release(cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb,
                   cublasLtMatrixLayout_t lc) {
  if (op) cublasLtMatmulDescDestroy(op);
  if (la) cublasLtMatrixLayoutDestroy(la);
  if (lb) cublasLtMatrixLayoutDestroy(lb);
  if (lc) cublasLtMatrixLayoutDestroy(lc);
}

void *cu_push(void **v, int *n, int *cap, size_t sz) {
  char *p;
  if (*n == *cap) {
    int c = *cap ? 2 * *cap : 16;
    void *w = realloc(*v, (size_t)c * sz);
    if (w == NULL) return NULL;
    *v = w;
    *cap = c;
  }
  p = (char *)*v + (size_t)(*n)++ * sz;
  memset(p, 0, sz);
  return p;
}

/* cudaMalloc runs at once, outside any graph; the relaxed mode lets it run
** while this thread has a capture open. Out of memory is GCAP_ENOMEM, so
** that the engine's allocator can release cached blocks and retry. */
static gcap_status cu_malloc(gcap_engine *e, void *, size_t n, void **p) {
  cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
  *p = NULL;
  if (gc_fault())
    return gc_fail(e, GCAP_ENOMEM, "cudaMalloc(%zu bytes): out of memory (injected)", n);
  CUDA_TRY(e, cudaThreadExchangeStreamCaptureMode(&m));
  cudaError_t err = cudaMalloc(p, n);
  cu_drop(cudaThreadExchangeStreamCaptureMode(&m)); /* restore this thread's mode */
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    *p = NULL;
    return gc_fail(e, err == cudaErrorMemoryAllocation ? GCAP_ENOMEM : GCAP_EDEVICE,
                   "cudaMalloc(%zu bytes): %s", n, cudaGetErrorString(err));
  }
  return GCAP_OK;
}

static void cu_free(void *, void *p) {
  cu_drop(cudaFree(p));
}

/* Pinned host memory mapped into the device's address space: kernels write
** it through *dev, the host reads it through *host without a copy. */
static gcap_status cu_mapped_alloc(gcap_engine *e, void *, size_t n, void **host, void **dev) {
  *host = *dev = NULL;
  if (gc_fault()) return gc_fail(e, GCAP_ENOMEM, "cudaHostAlloc(%zu bytes): injected", n);
  CUDA_TRY(e, cudaHostAlloc(host, n, cudaHostAllocMapped));
  memset(*host, 0, n);
  cudaError_t err = cudaHostGetDevicePointer(dev, *host, 0);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    cu_drop(cudaFreeHost(*host));
    *host = *dev = NULL;
    return gc_fail(e, GCAP_EDEVICE, "cudaHostGetDevicePointer: %s", cudaGetErrorString(err));
  }
  return GCAP_OK;
}

static void cu_mapped_free(void *, void *host) {
  if (host != NULL) cu_drop(cudaFreeHost(host));
}

/* ------------------------------------------------------------------------ */
/* Streams and events                                                        */

static gcap_status cu_stream_new(gcap_engine *e, void *, void **s) {
  cudaStream_t cs = NULL;
  *s = NULL;
  if (gc_fault())
    return gc_fail(e, GCAP_EDEVICE, "cudaStreamCreateWithFlags: out of resources (injected)");
  CUDA_TRY(e, cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
  *s = cs;
  return GCAP_OK;
}

static void cu_stream_free(void *, void *s) {
  cu_drop(cudaStreamDestroy((cudaStream_t)s));
}

static gcap_status cu_stream_sync(gcap_engine *e, void *, void *s) {
  CUDA_TRY(e, cudaStreamSynchronize((cudaStream_t)s));
  return GCAP_OK;
}

static gcap_status cu_device_sync(gcap_engine *e, void *) {
  CUDA_TRY(e, cudaDeviceSynchronize());
  return GCAP_OK;
}

static gcap_status cu_event_new(gcap_engine *e, void *, void **ev) {
  cudaEvent_t ce = NULL;
  *ev = NULL;
  if (gc_fault())
    return gc_fail(e, GCAP_EDEVICE, "cudaEventCreateWithFlags: out of resources (injected)");
  CUDA_TRY(e, cudaEventCreateWithFlags(&ce, cudaEventDisableTiming));
  *ev = ce;
  return GCAP_OK;
}

static void cu_event_free(void *, void *ev) {
  cu_drop(cudaEventDestroy((cudaEvent_t)ev));
}

static gcap_status cu_event_record(gcap_engine *e, void *, void *ev, void *s) {
  CUDA_TRY(e, cudaEventRecord((cudaEvent_t)ev, (cudaStream_t)s));
  return GCAP_OK;
}

/* An external event's record in a capture: a node of the graph. */
static gcap_status cu_record_ext(gcap_engine *e, void *, void *ev, void *s) {
  CUDA_TRY(e, cudaEventRecordWithFlags((cudaEvent_t)ev, (cudaStream_t)s, cudaEventRecordExternal));
  return GCAP_OK;
}

static gcap_status cu_stream_wait(gcap_engine *e, void *, void *s, void *ev) {
  CUDA_TRY(e, cudaStreamWaitEvent((cudaStream_t)s, (cudaEvent_t)ev, 0));
  return GCAP_OK;
}

static gcap_status cu_event_sync(gcap_engine *e, void *, void *ev) {
  CUDA_TRY(e, cudaEventSynchronize((cudaEvent_t)ev));
  return GCAP_OK;
}

/* ------------------------------------------------------------------------ */
/* Copies (never during capture: the core refuses them; host memory is
** pageable, so each copy waits for the stream before returning).           */

static gcap_status cu_upload(gcap_engine *e, void *, void *s, void *dst, const void *src,
                             size_t n) {
  if (n == 0) return GCAP_OK;
  CUDA_TRY(e, cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, (cudaStream_t)s));
  CUDA_TRY(e, cudaStreamSynchronize((cudaStream_t)s));
  return GCAP_OK;
}

static gcap_status cu_download(gcap_engine *e, void *, void *s, void *dst, const void *src,
                               size_t n) {
  if (n == 0) return GCAP_OK;
  CUDA_TRY(e, cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, (cudaStream_t)s));
  CUDA_TRY(e, cudaStreamSynchronize((cudaStream_t)s));
  return GCAP_OK;
}

/* ------------------------------------------------------------------------ */
/* Kernels                                                                   */

/* The launcher of each kernel's family, from the catalogue (backend.h). */
typedef gcap_status (*cu_family_fn)(gcap_engine *e, cu_state *st, cudaStream_t s, int k,
                                    const gc_kargs *a);
#define CU_FAMILY(id, name, family, writes) cu_##family,
static const cu_family_fn cu_families[GC_K_COUNT] = {GC_KERNELS(CU_FAMILY)};
#undef CU_FAMILY

static gcap_status cu_launch(gcap_engine *e, void *bs, void *s, int k, const gc_kargs *a) {
  cu_state *st = (cu_state *)bs;
  cudaStream_t cs = (cudaStream_t)s;
  gcap_status r;
  if (k < 0 || k >= GC_K_COUNT) return gc_fail(e, GCAP_EINVAL, "cuda: no kernel with id %d", k);
  r = cu_families[k](e, st, cs, k, a);
  if (r != GCAP_OK) return r;
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    return gc_fail(e, GCAP_EDEVICE, "cuda: kernel %s: %s", gc_kernel_name(k),
                   cudaGetErrorString(err));
  return GCAP_OK;
}

/* A custom op's cuda callback, launching on s (capturing or not). What it
** launches joins the capture; a sync, read-back or allocation in it makes
** CUDA invalidate the capture, which is GCAP_ECAPTURE naming the op. */
static gcap_status cu_custom(gcap_engine *e, void *, void *s, const gc_custom *c) {
  cudaStream_t cs = (cudaStream_t)s;
  cudaStreamCaptureStatus before = cudaStreamCaptureStatusNone, after;
  if (c->cuda == NULL)
    return gc_fail(e, GCAP_EUNSUPPORTED, "custom op '%s' has no cuda callback", c->name);
  CUDA_TRY(e, cudaStreamIsCapturing(cs, &before));
  gcap_status r = c->cuda(c->ud, s, c->nin, c->arg, c->nout, c->arg + c->nin);
  cudaError_t err = cudaGetLastError();
  cudaError_t cerr = cudaStreamIsCapturing(cs, &after);
  if (before == cudaStreamCaptureStatusActive &&
      (cerr != cudaSuccess || after != cudaStreamCaptureStatusActive)) {
    (void)cudaGetLastError();
    return gc_fail(e, GCAP_ECAPTURE,
                   "custom op '%s': its cuda callback broke the capture (%s): it must not "
                   "synchronize, read back or allocate device memory while the stream captures",
                   c->name, cudaGetErrorString(err != cudaSuccess ? err : cerr));
  }
  if (r != GCAP_OK)
    return gc_fail(e, r, "custom op '%s': its cuda callback failed (%s%s%s)", c->name,
                   gcap_status_str(r), err != cudaSuccess ? ", " : "",
                   err != cudaSuccess ? cudaGetErrorString(err) : "");
  if (err != cudaSuccess)
    return gc_fail(e, GCAP_EDEVICE, "custom op '%s': %s", c->name, cudaGetErrorString(err));
  return GCAP_OK;
}

/* ------------------------------------------------------------------------ */
/* Graphs                                                                    */

static gcap_status cu_capture_begin(gcap_engine *e, void *, void *s) {
  CUDA_TRY(e, cudaStreamBeginCapture((cudaStream_t)s, cudaStreamCaptureModeThreadLocal));
  return GCAP_OK;
}

/* Fail with the error err that `what` returned. */
static gcap_status cu_fail(gcap_engine *e, cudaError_t err, const char *what) {
  (void)cudaGetLastError();
  return gc_fail(e, GCAP_EDEVICE, "%s: %s", what, cudaGetErrorString(err));
}

/* The number of memory-alloc and memory-free nodes of g, in *n. */
static gcap_status cu_count_mem_nodes(gcap_engine *e, cudaGraph_t g, size_t *n) {
  size_t nodes = 0;
  *n = 0;
  CUDA_TRY(e, cudaGraphGetNodes(g, NULL, &nodes));
  if (nodes == 0) return GCAP_OK;
  cudaGraphNode_t *v = (cudaGraphNode_t *)malloc(nodes * sizeof *v);
  if (!v) return gc_fail(e, GCAP_ENOMEM, "cuda: out of host memory");
  cudaError_t err = cudaGraphGetNodes(g, v, &nodes);
  for (size_t i = 0; err == cudaSuccess && i < nodes; i++) {
    cudaGraphNodeType t;
    err = cudaGraphNodeGetType(v[i], &t);
    if (err == cudaSuccess && (t == cudaGraphNodeTypeMemAlloc || t == cudaGraphNodeTypeMemFree))
      (*n)++;
  }
  free(v);
  if (err != cudaSuccess) return cu_fail(e, err, "cuda: reading the captured graph's nodes");
  return GCAP_OK;
}

static gcap_status cu_capture_end(gcap_engine *e, void *, void *s, void **graph) {
  cudaGraph_t g = NULL;
  size_t mem = 0;
  *graph = NULL;
  /* On failure (invalidated, unjoined fork, ...) g stays NULL. */
  CUDA_TRY(e, cudaStreamEndCapture((cudaStream_t)s, &g));
  gcap_status r = cu_count_mem_nodes(e, g, &mem);
  if (r == GCAP_OK && mem > 0)
    r = gc_fail(e, GCAP_EDEVICE,
                "captured graph holds %zu memory-alloc/free nodes: some library "
                "allocated during capture",
                mem);
  if (r != GCAP_OK) {
    cu_drop(cudaGraphDestroy(g));
    return r;
  }
  *graph = g;
  return GCAP_OK;
}

/* Instantiate, then upload on the backend's own stream and wait, so that the
** first replay costs what the others do. */
static gcap_status cu_instantiate(gcap_engine *e, void *bs, void *graph, void **exec,
                                  int64_t *nodes) {
  cu_state *st = (cu_state *)bs;
  cudaGraph_t g = (cudaGraph_t)graph;
  cudaGraphExec_t x = NULL;
  size_t n = 0;
  *exec = NULL;
  *nodes = 0;
  if (gc_fault())
    return gc_fail(e, GCAP_EDEVICE, "cudaGraphInstantiate: out of resources (injected)");
  CUDA_TRY(e, cudaGraphGetNodes(g, NULL, &n));
  CUDA_TRY(e, cudaGraphInstantiate(&x, g, 0));
  cudaError_t err = cudaGraphUpload(x, st->upload);
  if (err == cudaSuccess) err = cudaStreamSynchronize(st->upload);
  if (err != cudaSuccess) {
    cu_drop(cudaGraphExecDestroy(x));
    return cu_fail(e, err, "cudaGraphUpload");
  }
  *exec = x;
  *nodes = (int64_t)n;
  return GCAP_OK;
}

static gcap_status cu_graph_launch(gcap_engine *e, void *, void *exec, void *s) {
  CUDA_TRY(e, cudaGraphLaunch((cudaGraphExec_t)exec, (cudaStream_t)s));
  return GCAP_OK;
}

static void cu_graph_free(void *, void *graph, void *exec) {
  if (exec) cu_drop(cudaGraphExecDestroy((cudaGraphExec_t)exec));
  if (graph) cu_drop(cudaGraphDestroy((cudaGraph_t)graph));
}

/* CUDA's own DOT description of the graph, every node's parameters
** included; the graph's name is the core's (CUDA's dump has none). */
static gcap_status cu_debug_dump(gcap_engine *e, void *, void *graph, const char *,
                                 const char *path) {
  cudaError_t err = cudaGraphDebugDotPrint((cudaGraph_t)graph, path, cudaGraphDebugDotFlagsVerbose);
  if (err != cudaSuccess) return cu_fail(e, err, "cudaGraphDebugDotPrint");
  return GCAP_OK;
}

/* gc_backend.attn_supported: cuDNN's attention (attn_cudnn.cpp), its state
** made on first need. */
static int cu_attn_cudnn(void *bs, const gc_kargs *a, int backward, int capturing, char *why,
                         size_t n) {
  return cu_dnn_supported(&((cu_state *)bs)->dnn, a, backward, capturing, why, n);
}

/* gc_backend.fp8_supported: FP8 GEMMs need compute capability 8.9 (Ada) or
** 9.0 and later (Hopper on). */
static int cu_fp8_supported(void *bs, char *why, size_t n) {
  cudaDeviceProp p;
  if (cudaGetDeviceProperties(&p, ((cu_state *)bs)->dev) != cudaSuccess) {
    (void)cudaGetLastError();
    snprintf(why, n, "the compute capability of device %d could not be read",
             ((cu_state *)bs)->dev);
    return 0;
  }
  if (p.major > 8 || (p.major == 8 && p.minor >= 9)) {
    if (n > 0) why[0] = '\0';
    return 1;
  }
  snprintf(why, n,
           "Device compute capability 8.9 or higher required for FP8 execution: device %d (%s) "
           "has %d.%d",
           ((cu_state *)bs)->dev, p.name, p.major, p.minor);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* NVTX ranges (the header-only NVTX 3 of the toolkit: it loads the tool that
** listens, if any, on first use). Opened only when a tool is attached:
** Nsight Systems names its injection library in NVTX_INJECTION64_PATH, so
** without one the engine formats no range name at all.                     */

static int cu_ranges(void *) {
  const char *v = getenv("NVTX_INJECTION64_PATH");
  return v != NULL && *v != '\0';
}

static void cu_range_push(void *, const char *name) {
  nvtxRangePushA(name);
}

static void cu_range_pop(void *) {
  nvtxRangePop();
}

/* ------------------------------------------------------------------------ */

/* In gc_backend's field order (C++17 has no designated initializers). */
static const gc_backend cu_backend = {
    "cuda",           /* name */
    cu_init,          /* init */
    cu_shutdown,      /* shutdown */
    cu_malloc,        /* malloc */
    cu_free,          /* free */
    cu_mapped_alloc,  /* mapped_alloc */
    cu_mapped_free,   /* mapped_free */
    cu_stream_new,    /* stream_new */
    cu_stream_free,   /* stream_free */
    cu_stream_sync,   /* stream_sync */
    cu_device_sync,   /* device_sync */
    cu_event_new,     /* event_new */
    cu_event_free,    /* event_free */
    cu_event_record,  /* event_record */
    cu_stream_wait,   /* stream_wait */
    cu_event_sync,    /* event_sync */
    cu_upload,        /* upload */
    cu_download,      /* download */
    cu_launch,        /* launch */
    cu_custom,        /* custom */
    cu_capture_begin, /* capture_begin */
    cu_capture_end,   /* capture_end */
    cu_instantiate,   /* instantiate */
    cu_graph_launch,  /* graph_launch */
    cu_graph_free,    /* graph_free */
    cu_debug_dump,    /* debug_dump */
    cu_comm_id,       /* comm_id */
    cu_comm_new,      /* comm_new */
    cu_comm_free,     /* comm_free */
    cu_collective,    /* collective */
    cu_attn_cudnn,    /* attn_supported */
    cu_fp8_supported, /* fp8_supported */
    cu_record_ext,    /* event_record_external */
    cu_ranges,        /* ranges */
    cu_range_push,    /* range_push */
    cu_range_pop,     /* range_pop */
};

extern "C" const gc_backend *gc_cuda_backend(void) {
  return &cu_backend;
}

/* Never prints: a machine without a driver or device answers 0. */
extern "C" int gc_cuda_probe(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n >= 1;
}
