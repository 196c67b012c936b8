/*
** dist.h: the distributed layer's structures (groups) and its transport
** (mpi.c), for the files of dist/. The layer sits above the tensor layer:
** it checks and notes tensors as ops do, and launches collectives through
** the backend table (gc_backend.collective), which runs them on the host
** through gc_mpi_collective or as NCCL calls on cuda.
*/
#ifndef GC_DIST_H
#define GC_DIST_H

#include <string.h>

#include "tensor/tensor.h"

/* The first 8 bytes of every debug-mode descriptor: four bf16 (two f32) NaNs
** with payloads no arithmetic makes, so that a rank can tell a descriptor
** from a tensor's bytes. A rank in debug mode and one that is not exchange
** one's descriptor for the other's data: the one finds no mark where a
** descriptor should be, the other finds the mark in its data. */
#define GC_DEBUG_MARK 0x7fd77fc37fb17fa5LL

/* Does p (at least 8 bytes) start with GC_DEBUG_MARK? (inline: both
** dist.c and mpi.c ask, and neither calls into the other for it) */
static inline int gc_debug_marked(const void *p) {
  int64_t m;
  memcpy(&m, p, sizeof m);
  return m == GC_DEBUG_MARK;
}

/* A communicator of the transport (an MPI communicator). */
typedef struct gc_mpi gc_mpi;

struct gcap_dist_group {
  int size;
  int rank;    /* the caller's rank in it, -1: not a member */
  int *ranks;  /* world ranks, by group rank */
  gc_mpi *mpi; /* NULL for a non-member, and after finalize */
  void *comm;  /* the backend's communicator (NULL on host) */
  gcap_dist_group *next;
};

/* 1 when built with MPI. */
int gc_mpi_built(void);
/* Initialise MPI unless it is (*owns: 1 when this call did), and give this
** process's world rank, the world size, its local rank (among the ranks of
** its machine) and a communicator of the world of its own. */
gcap_status gc_mpi_start(gcap_engine *e, int *rank, int *size, int *local, int *owns,
                         gc_mpi **world);
/* Finalize MPI when owns (gc_mpi_start initialised it). */
void gc_mpi_stop(int owns);
/* Collective over world: the members (member = 1) get a communicator of
** their own, ordered by key; the others NULL. */
gcap_status gc_mpi_split(gcap_engine *e, gc_mpi *world, int member, int key, gc_mpi **out);
void gc_mpi_free(gc_mpi *c);
gcap_status gc_mpi_barrier(gcap_engine *e, gc_mpi *c, const char *op);
/* n bytes of buf from rank root of c to every rank of c. */
gcap_status gc_mpi_bcast(gcap_engine *e, gc_mpi *c, void *buf, int n, int root, const char *op);
/* The n bytes of mine of every rank of c into all, by rank. */
gcap_status gc_mpi_allgather(gcap_engine *e, gc_mpi *c, const void *mine, void *all, int n,
                             const char *op);
/* Swap n bytes with rank peer of c: mine goes there, theirs comes here. */
gcap_status gc_mpi_exchange(gcap_engine *e, gc_mpi *c, const void *mine, void *theirs, int n,
                            int peer, const char *op);
/* MPI_Abort of the world when MPI is up, else exit(code). */
void gc_mpi_abort(int code);
/* Run collective c (c->group a gcap_dist_group) on the host: the host
** backend's gc_coll.run. */
gcap_status gc_mpi_collective(gcap_engine *e, const gc_coll *c);

#endif
