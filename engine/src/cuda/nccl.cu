/*
** nccl.cu: the cuda backend's communicators and collectives, on NCCL. A
** collective is one NCCL call on the stream, so inside a capture it becomes
** nodes of the graph and runs at every replay. NCCL needs one GPU per rank:
** the engine's device must be the one numbered by the local rank.
*/
#include <nccl.h>

#include "common.cuh"

#define NCCL_TRY(e, call)                                                                          \
  do {                                                                                             \
    ncclResult_t r_ = (call);                                                                      \
    if (r_ != ncclSuccess)                                                                         \
      return gc_fail((e), GCAP_EDEVICE, "%s: %s", #call, ncclGetErrorString(r_));                  \
  } while (0)

static_assert(sizeof(ncclUniqueId) == GC_COMM_ID_BYTES, "NCCL's unique id size");

gcap_status cu_comm_id(gcap_engine *e, void *, unsigned char id[GC_COMM_ID_BYTES]) {
  ncclUniqueId u;
  NCCL_TRY(e, ncclGetUniqueId(&u));
  memcpy(id, &u, sizeof u);
  return GCAP_OK;
}

gcap_status cu_comm_new(gcap_engine *e, void *bs, const unsigned char id[GC_COMM_ID_BYTES],
                        int nranks, int rank, int local_rank, void **comm) {
  cu_state *st = (cu_state *)bs;
  ncclUniqueId u;
  ncclComm_t c = NULL;
  int ndev = 0;
  *comm = NULL;
  CUDA_TRY(e, cudaGetDeviceCount(&ndev));
  if (local_rank >= ndev)
    return gc_fail(e, GCAP_EUNSUPPORTED,
                   "init: local rank %d has no GPU of its own (%d here): NCCL needs one GPU per "
                   "rank; start fewer ranks per machine, or use --device host",
                   local_rank, ndev);
  if (st->dev != local_rank)
    return gc_fail(e, GCAP_EINVAL,
                   "init: local rank %d should run on GPU %d, but the engine runs on GPU %d",
                   local_rank, local_rank, st->dev);
  memcpy(&u, id, sizeof u);
  CUDA_TRY(e, cudaSetDevice(st->dev));
  NCCL_TRY(e, ncclCommInitRank(&c, nranks, u, rank));
  *comm = c;
  return GCAP_OK;
}

void cu_comm_free(void *, void *comm) {
  if (comm != NULL) (void)ncclCommDestroy((ncclComm_t)comm);
}

gcap_status cu_collective(gcap_engine *e, void *, void *s, const gc_coll *c) {
  static const ncclRedOp_t reds[] = {ncclSum, ncclAvg, ncclMax};
  ncclComm_t comm = (ncclComm_t)c->comm;
  cudaStream_t cs = (cudaStream_t)s;
  ncclDataType_t dt = c->dt == GCAP_BF16 ? ncclBfloat16 : ncclFloat32;
  size_t n = (size_t)c->count;
  switch (c->kind) {
    case GC_COLL_ALL_REDUCE:
      NCCL_TRY(e, ncclAllReduce(c->src, c->dst, n, dt, reds[c->red], comm, cs));
      break;
    case GC_COLL_ALL_GATHER:
      NCCL_TRY(e, ncclAllGather(c->src, c->dst, n, dt, comm, cs));
      break;
    case GC_COLL_REDUCE_SCATTER:
      NCCL_TRY(e, ncclReduceScatter(c->src, c->dst, n, dt, reds[c->red], comm, cs));
      break;
    case GC_COLL_BROADCAST:
      NCCL_TRY(e, ncclBroadcast(c->src, c->dst, n, dt, c->peer, comm, cs));
      break;
    case GC_COLL_SEND:
      NCCL_TRY(e, ncclSend(c->src, n, dt, c->peer, comm, cs));
      break;
    case GC_COLL_RECV:
      NCCL_TRY(e, ncclRecv(c->dst, n, dt, c->peer, comm, cs));
      break;
  }
  return GCAP_OK;
}
