/*
** mpi.c: the distributed layer's transport, MPI: start and stop, the
** communicators of groups, the small exchanges of bootstrap and debug mode,
** and the host backend's collectives. Those run with a fixed order of
** reduction, so that results are the same bits on every rank and at every
** run: each rank gathers every rank's contribution, then folds them in rank
** order, in float. Built without MPI (no GC_WITH_MPI), gc_mpi_start fails
** and nothing else is reached.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist.h"

#ifdef GC_WITH_MPI

#include <mpi.h>

struct gc_mpi {
  MPI_Comm comm;
};

int gc_mpi_built(void) {
  return 1;
}

/* The error of MPI call `call` for op, as GCAP_EDEVICE. With `hint` (a
** transfer of a collective), a truncated message is said to mean that the
** ranks disagree on the call, which debug mode (on every rank) names. */
static gcap_status mpi_fail(gcap_engine *e, int err, const char *op, const char *call, int hint) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0, cls = 0;
  if (MPI_Error_string(err, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "error %d", err);
  if (MPI_Error_class(err, &cls) != MPI_SUCCESS) cls = 0;
  return gc_fail(e, GCAP_EDEVICE, "%s: %s failed: %s%s", op, call, msg,
                 hint && cls == MPI_ERR_TRUNCATE
                     ? " (a rank of the group sent more than this one expects: the ranks made "
                       "different calls here, or debug mode is on on some of them only; "
                       "gc.dist.set_debug(true) on every rank names the calls)"
                     : "");
}

#define MPI_TRY(e, op, call)                                                                       \
  do {                                                                                             \
    int err_ = (call);                                                                             \
    if (err_ != MPI_SUCCESS) return mpi_fail(e, err_, op, #call, 0);                               \
  } while (0)

/* A communicator of ours for c (errors returned, not fatal), or NULL. */
static gcap_status mpi_box(gcap_engine *e, MPI_Comm c, gc_mpi **out) {
  *out = NULL;
  if (c == MPI_COMM_NULL) return GCAP_OK;
  if ((*out = (gc_mpi *)gc_malloc(sizeof **out)) == NULL) {
    MPI_Comm_free(&c);
    return gc_fail(e, GCAP_ENOMEM, "dist: out of memory");
  }
  (*out)->comm = c;
  MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
  return GCAP_OK;
}

gcap_status gc_mpi_start(gcap_engine *e, int *rank, int *size, int *local, int *owns,
                         gc_mpi **world) {
  int up = 0, down = 0, provided;
  MPI_Comm dup, node;
  MPI_Finalized(&down);
  if (down) return gc_fail(e, GCAP_ESTATE, "init: MPI was finalized; it cannot start again");
  MPI_Initialized(&up);
  *owns = !up;
  if (!up) MPI_TRY(e, "init", MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided));
  MPI_TRY(e, "init", MPI_Comm_dup(MPI_COMM_WORLD, &dup));
  MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
  MPI_TRY(e, "init", MPI_Comm_rank(dup, rank));
  MPI_TRY(e, "init", MPI_Comm_size(dup, size));
  MPI_TRY(e, "init", MPI_Comm_split_type(dup, MPI_COMM_TYPE_SHARED, *rank, MPI_INFO_NULL, &node));
  MPI_TRY(e, "init", MPI_Comm_rank(node, local));
  MPI_Comm_free(&node);
  return mpi_box(e, dup, world);
}

void gc_mpi_stop(int owns) {
  if (owns) MPI_Finalize();
}

gcap_status gc_mpi_split(gcap_engine *e, gc_mpi *world, int member, int key, gc_mpi **out) {
  MPI_Comm c;
  MPI_TRY(e, "new_group", MPI_Comm_split(world->comm, member ? 0 : MPI_UNDEFINED, key, &c));
  return mpi_box(e, c, out);
}

void gc_mpi_free(gc_mpi *c) {
  if (c == NULL) return;
  MPI_Comm_free(&c->comm);
  free(c);
}

gcap_status gc_mpi_barrier(gcap_engine *e, gc_mpi *c, const char *op) {
  MPI_TRY(e, op, MPI_Barrier(c->comm));
  return GCAP_OK;
}

gcap_status gc_mpi_bcast(gcap_engine *e, gc_mpi *c, void *buf, int n, int root, const char *op) {
  MPI_TRY(e, op, MPI_Bcast(buf, n, MPI_BYTE, root, c->comm));
  return GCAP_OK;
}

gcap_status gc_mpi_allgather(gcap_engine *e, gc_mpi *c, const void *mine, void *all, int n,
                             const char *op) {
  int err = MPI_Allgather(mine, n, MPI_BYTE, all, n, MPI_BYTE, c->comm);
  return err == MPI_SUCCESS ? GCAP_OK : mpi_fail(e, err, op, "MPI_Allgather", 0);
}

/* With the tag of send and recv (0): a peer not in debug mode then fails on
** the descriptor it receives instead of both waiting for ever. */
gcap_status gc_mpi_exchange(gcap_engine *e, gc_mpi *c, const void *mine, void *theirs, int n,
                            int peer, const char *op) {
  int err = MPI_Sendrecv(mine, n, MPI_BYTE, peer, 0, theirs, n, MPI_BYTE, peer, 0, c->comm,
                         MPI_STATUS_IGNORE);
  return err == MPI_SUCCESS ? GCAP_OK : mpi_fail(e, err, op, "MPI_Sendrecv", 0);
}

void gc_mpi_abort(int code) {
  int up = 0, down = 0;
  MPI_Initialized(&up);
  MPI_Finalized(&down);
  if (up && !down) MPI_Abort(MPI_COMM_WORLD, code);
  exit(code);
}

/* dst[i] = the fold of the n contributions all[r * count + i], r in rank
** order, in float (avg: the sum divided by n). */
static void mpi_fold(const gc_coll *c, const void *all, int n) {
  int64_t i;
  int r;
  for (i = 0; i < c->count; i++) {
    float acc = gc_load(all, c->dt, i);
    for (r = 1; r < n; r++) {
      float x = gc_load(all, c->dt, (int64_t)r * c->count + i);
      acc = c->red == GC_RED_MAX ? (x > acc || x != x ? x : acc) : acc + x;
    }
    gc_store(c->dst, c->dt, i, c->red == GC_RED_AVG ? acc / (float)n : acc);
  }
}

/* Did a rank of g send a debug-mode descriptor where this rank, not in
** debug mode, expects its tensor? p holds n blocks of `bytes`, block k from
** group rank r0 + k (this rank's own block skipped). Then an error of op
** that names the first such rank. */
static gcap_status mpi_from_debug(gcap_engine *e, const gcap_dist_group *g, const char *op,
                                  const void *p, size_t bytes, int r0, int n) {
  int k;
  for (k = 0; bytes >= 8 && k < n; k++)
    if (r0 + k != g->rank && gc_debug_marked((const char *)p + (size_t)k * bytes))
      return gc_fail(e, GCAP_EINVAL,
                     "%s: rank %d is in debug mode and rank %d is not (it sent a debug-mode "
                     "descriptor in place of its tensor): call gc.dist.set_debug(true) on every "
                     "rank",
                     op, g->ranks[r0 + k], g->ranks[g->rank]);
  return GCAP_OK;
}

gcap_status gc_mpi_collective(gcap_engine *e, const gc_coll *c) {
  const gcap_dist_group *g = (const gcap_dist_group *)c->group;
  const char *op = gc_coll_name(c->kind);
  size_t bytes = (size_t)c->count * (c->dt == GCAP_BF16 ? 2 : 4);
  int n = g->size, nb = (int)bytes, err, got = 0;
  gcap_status st = GCAP_OK;
  MPI_Status status;
  void *tmp = NULL;
  if (g->mpi == NULL)
    return gc_fail(e, GCAP_ESTATE, "%s: the distributed runtime was finalized", op);
  if (bytes > (size_t)(0x7fffffff / n))
    return gc_fail(e, GCAP_EINVAL, "%s: %zu bytes per rank is more than one MPI message takes", op,
                   bytes);
  switch (c->kind) {
    case GC_COLL_ALL_REDUCE:
    case GC_COLL_REDUCE_SCATTER:
    case GC_COLL_ALL_GATHER:
      if ((tmp = gc_malloc(bytes * (size_t)n)) == NULL)
        return gc_fail(e, GCAP_ENOMEM, "%s: out of memory (%zu bytes)", op, bytes * (size_t)n);
      break;
    default:
      break;
  }
  switch (c->kind) {
    case GC_COLL_ALL_REDUCE:
      err = MPI_Allgather(c->src, nb, MPI_BYTE, tmp, nb, MPI_BYTE, g->mpi->comm);
      if (err == MPI_SUCCESS && (st = mpi_from_debug(e, g, op, tmp, bytes, 0, n)) == GCAP_OK)
        mpi_fold(c, tmp, n);
      break;
    case GC_COLL_REDUCE_SCATTER: /* chunk r of every rank's src comes to rank r */
      err = MPI_Alltoall(c->src, nb, MPI_BYTE, tmp, nb, MPI_BYTE, g->mpi->comm);
      if (err == MPI_SUCCESS && (st = mpi_from_debug(e, g, op, tmp, bytes, 0, n)) == GCAP_OK)
        mpi_fold(c, tmp, n);
      break;
    case GC_COLL_ALL_GATHER: /* through tmp: src may be a part of dst */
      err = MPI_Allgather(c->src, nb, MPI_BYTE, tmp, nb, MPI_BYTE, g->mpi->comm);
      if (err == MPI_SUCCESS && (st = mpi_from_debug(e, g, op, tmp, bytes, 0, n)) == GCAP_OK)
        memcpy(c->dst, tmp, bytes * (size_t)n);
      break;
    case GC_COLL_BROADCAST:
      err = MPI_Bcast(c->dst, nb, MPI_BYTE, c->peer, g->mpi->comm);
      if (err == MPI_SUCCESS) st = mpi_from_debug(e, g, op, c->dst, bytes, c->peer, 1);
      break;
    case GC_COLL_SEND:
      err = MPI_Send(c->src, nb, MPI_BYTE, c->peer, 0, g->mpi->comm);
      break;
    default:
      err = MPI_Recv(c->dst, nb, MPI_BYTE, c->peer, 0, g->mpi->comm, &status);
      if (err == MPI_SUCCESS && (err = MPI_Get_count(&status, MPI_BYTE, &got)) == MPI_SUCCESS &&
          (st = mpi_from_debug(e, g, op, c->dst, (size_t)got, c->peer, 1)) != GCAP_OK)
        return st;
      /* a shorter message is no MPI error: t would be left partly old */
      if (err == MPI_SUCCESS && got != nb)
        return gc_fail(e, GCAP_EINVAL,
                       "%s: got %d bytes from rank %d, expected %d (t's %lld %s elements): the "
                       "sender's t has another dtype or element count",
                       op, got, g->ranks[c->peer], nb, (long long)c->count,
                       gc_dtype_name((gcap_dtype)c->dt));
      break;
  }
  free(tmp);
  return err == MPI_SUCCESS ? st : mpi_fail(e, err, op, "the MPI transfer", 1);
}

#else /* built without MPI: gc_mpi stays an incomplete type */

int gc_mpi_built(void) {
  return 0;
}

gcap_status gc_mpi_start(gcap_engine *e, int *rank, int *size, int *local, int *owns,
                         gc_mpi **world) {
  *rank = *size = *local = -1;
  *owns = 0;
  *world = NULL;
  return gc_fail(e, GCAP_EUNSUPPORTED,
                 "init: graphcap was built without MPI (install libopenmpi-dev and rebuild)");
}

/* Unreachable without a start: there is no communicator to use. */
void gc_mpi_stop(int owns) {
  (void)owns;
}

gcap_status gc_mpi_split(gcap_engine *e, gc_mpi *world, int member, int key, gc_mpi **out) {
  (void)world, (void)member, (void)key;
  *out = NULL;
  return gc_fail(e, GCAP_EUNSUPPORTED, "new_group: built without MPI");
}

void gc_mpi_free(gc_mpi *c) {
  (void)c;
}

gcap_status gc_mpi_barrier(gcap_engine *e, gc_mpi *c, const char *op) {
  (void)c;
  return gc_fail(e, GCAP_EUNSUPPORTED, "%s: built without MPI", op);
}

gcap_status gc_mpi_bcast(gcap_engine *e, gc_mpi *c, void *buf, int n, int root, const char *op) {
  (void)c, (void)buf, (void)n, (void)root;
  return gc_fail(e, GCAP_EUNSUPPORTED, "%s: built without MPI", op);
}

gcap_status gc_mpi_allgather(gcap_engine *e, gc_mpi *c, const void *mine, void *all, int n,
                             const char *op) {
  (void)c, (void)mine, (void)all, (void)n;
  return gc_fail(e, GCAP_EUNSUPPORTED, "%s: built without MPI", op);
}

gcap_status gc_mpi_exchange(gcap_engine *e, gc_mpi *c, const void *mine, void *theirs, int n,
                            int peer, const char *op) {
  (void)c, (void)mine, (void)theirs, (void)n, (void)peer;
  return gc_fail(e, GCAP_EUNSUPPORTED, "%s: built without MPI", op);
}

void gc_mpi_abort(int code) {
  exit(code);
}

gcap_status gc_mpi_collective(gcap_engine *e, const gc_coll *c) {
  return gc_fail(e, GCAP_EUNSUPPORTED, "%s: built without MPI", gc_coll_name(c->kind));
}

#endif
