/*
** graphcap_types.h: the vocabulary of graphcap's public C API: limits,
** status codes, devices, dtypes, the objects' opaque types, and a custom
** op's operands and callback. graphcap.h includes it, and programs include
** graphcap.h. The engine's backends include this header alone (through
** engine/src/runtime/backend.h), so that an edit of an API declaration in
** graphcap.h recompiles none of them.
*/
#ifndef GRAPHCAP_TYPES_H
#define GRAPHCAP_TYPES_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Limits */
#define GCAP_MAXDIM 4                    /* tensors have 0 to 4 dimensions */
#define GCAP_MAXNUMEL ((int64_t)1 << 40) /* and at most 2^40 elements */
#define GCAP_SDPA_FUSED_DMAX 128 /* head dims the fused attention kernels take (gcap_sdpa_impl) */

/* What every fallible call returns. */
typedef enum gcap_status {
  GCAP_OK = 0,
  GCAP_EINVAL,       /* bad argument: shape, dtype, range, NULL, another engine */
  GCAP_ENOMEM,       /* host or device memory exhausted */
  GCAP_EDEVICE,      /* the device or its runtime failed */
  GCAP_ECAPTURE,     /* forbidden while a capture is open; the capture is invalidated */
  GCAP_ESTATE,       /* wrong state: closed, reset, not captured, capture open */
  GCAP_EREPLAY,      /* replay refused: it would read memory another graph overwrote */
  GCAP_EUNSUPPORTED, /* backend not built, or no such device */
  GCAP_EABORTED      /* a callback asked to stop */
} gcap_status;

/* A static, human-readable name for a status ("invalid argument", ...);
** "unknown status" for a value that is none. */
const char *gcap_status_str(gcap_status st);

/* The device an engine drives (gcap_engine_new), and the element types. */
typedef enum gcap_device {
  GCAP_DEVICE_DEFAULT = 0, /* cuda when a GPU is present, host otherwise */
  GCAP_DEVICE_HOST,
  GCAP_DEVICE_CUDA
} gcap_device;

typedef enum gcap_dtype { GCAP_F32 = 0, GCAP_BF16 } gcap_dtype;

/* The comparisons of gcap_compare: a < b, a <= b, a > b, a >= b, a == b, a != b. */
typedef enum gcap_cmp { GCAP_LT = 0, GCAP_LE, GCAP_GT, GCAP_GE, GCAP_EQ, GCAP_NE } gcap_cmp;

/* The FP8 formats (graphcap.h, "FP8"): E4M3 (largest finite 448, no
** infinity) and E5M2 (largest finite 57344). */
typedef enum gcap_fp8_format { GCAP_FP8_E4M3 = 0, GCAP_FP8_E5M2 } gcap_fp8_format;

/* The objects, each of one engine; graphcap.h's section of each in the comment. */
typedef struct gcap_engine gcap_engine;         /* The engine */
typedef struct gcap_stream gcap_stream;         /* Streams and events */
typedef struct gcap_event gcap_event;           /* Streams and events */
typedef struct gcap_generator gcap_generator;   /* Random generators */
typedef struct gcap_pool gcap_pool;             /* Pools and graphs */
typedef struct gcap_graph gcap_graph;           /* Pools and graphs */
typedef struct gcap_graphed gcap_graphed;       /* make_graphed_callables */
typedef struct gcap_tensor gcap_tensor;         /* Tensors */
typedef struct gcap_module gcap_module;         /* Modules */
typedef struct gcap_optim gcap_optim;           /* Optimizers */
typedef struct gcap_custom_op gcap_custom_op;   /* Custom ops */
typedef struct gcap_kernel gcap_kernel;         /* Runtime-compiled kernels */
typedef struct gcap_dist_group gcap_dist_group; /* Distributed */

/* One operand of a custom op (graphcap.h, "Custom ops") as its callback
** sees it: device address, dtype and shape (contiguous, row-major). */
typedef struct gcap_custom_arg {
  void *data;
  gcap_dtype dtype;
  int ndim;
  int64_t shape[GCAP_MAXDIM];
  int64_t numel;
} gcap_custom_arg;

/* A callback: launch the op on `stream` (the backend's native stream, see
** gcap_stream_native), reading in[nin] and writing out[nout]. */
typedef gcap_status (*gcap_custom_fn)(void *ud, void *stream, int nin, const gcap_custom_arg *in,
                                      int nout, const gcap_custom_arg *out);

#ifdef __cplusplus
}
#endif
#endif
