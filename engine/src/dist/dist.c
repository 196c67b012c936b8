/*
** dist.c: the distributed runtime (gcap_dist_*): init and finalize, ranks,
** groups, and the collectives on tensors. A collective is checked as an op
** is (engine, dtype, sizes, group membership, root and peer), optionally
** compared across its group (debug mode), its reads and writes noted for
** the replay check, and launched through the backend table on the current
** stream: the host backend runs it through MPI (gc_mpi_collective) or
** records it into the open capture; cuda enqueues NCCL.
**
** MPI is one per process, so is this state: one world, bound to one engine.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist.h"

typedef struct gc_dist {
  int on;   /* between init and finalize */
  int done; /* finalized: MPI cannot start again */
  int owns; /* init started MPI, finalize stops it */
  int rank, size, local;
  int debug;
  gcap_engine *e; /* the engine of the collectives (a reference) */
  gcap_dist_group *world;
  gcap_dist_group *groups; /* every group, the world's included; never freed */
} gc_dist;

static gc_dist D = {0, 0, 0, -1, -1, -1, 0, NULL, NULL, NULL};

/* Calls that debug mode compares besides the collectives (gc_coll_kind). */
enum { CALL_BARRIER = GC_COLL_RECV + 1, CALL_FINALIZE, CALL_ANY };

static gcap_status debug_call(gcap_engine *e, const gcap_dist_group *g, int kind, int64_t n);
static gcap_status debug_group(gcap_engine *e, int n, const int *ranks);

int gcap_dist_available(void) {
  return gc_mpi_built();
}

int gcap_dist_is_initialized(void) {
  return D.on;
}

int gcap_dist_rank(void) {
  return D.on ? D.rank : -1;
}

int gcap_dist_world_size(void) {
  return D.on ? D.size : -1;
}

int gcap_dist_local_rank(void) {
  return D.on ? D.local : -1;
}

gcap_dist_group *gcap_dist_world(void) {
  return D.on ? D.world : NULL;
}

void gcap_dist_abort(int code) {
  gc_mpi_abort(code);
}

/* The start of a call of op on engine e: initialised, and on the engine
** the world was bound to. */
static gcap_status dist_begin(gcap_engine *e, const char *op) {
  gc_clear(e);
  if (!D.on)
    return gc_fail(e, GCAP_ESTATE, "%s: the distributed runtime is not initialised%s", op,
                   D.done ? " (it was finalized)" : " (call init first)");
  if (e != D.e)
    return gc_fail(e, GCAP_EINVAL,
                   "%s: this engine is not the one the distributed runtime was initialised with",
                   op);
  return GCAP_OK;
}

/* "[0, 1, 3]": the ranks v[0..nv), into buf. */
static const char *ranks_str(const int *v, int nv, char *buf, size_t n) {
  size_t k = 0;
  int i;
  k += (size_t)snprintf(buf, n, "[");
  for (i = 0; i < nv && k < n; i++)
    k += (size_t)snprintf(buf + k, n - k, "%s%d", i ? ", " : "", v[i]);
  if (k < n) snprintf(buf + k, n - k, "]");
  return buf;
}

/* Where rank r (a world rank) is in g, or -1. */
static int group_index(const gcap_dist_group *g, int r) {
  int i;
  for (i = 0; i < g->size; i++)
    if (g->ranks[i] == r) return i;
  return -1;
}

/* A group of the world ranks ranks[0..n) (checked), joined by every rank:
** its transport communicator and its backend communicator, whose unique id
** group rank 0 makes and broadcasts. */
static gcap_status group_make(gcap_engine *e, gc_mpi *world, int n, const int *ranks,
                              const char *op, gcap_dist_group **out) {
  unsigned char id[GC_COMM_ID_BYTES];
  gcap_dist_group *g;
  gcap_status st;
  *out = NULL;
  if ((g = (gcap_dist_group *)gc_calloc(1, sizeof *g)) == NULL ||
      (g->ranks = (int *)gc_malloc((size_t)n * sizeof(int))) == NULL) {
    free(g);
    return gc_fail(e, GCAP_ENOMEM, "%s: out of memory", op);
  }
  memcpy(g->ranks, ranks, (size_t)n * sizeof(int));
  g->size = n;
  g->rank = group_index(g, D.rank);
  if ((st = gc_mpi_split(e, world, g->rank >= 0, g->rank, &g->mpi)) != GCAP_OK) goto fail;
  if (g->mpi != NULL) {
    memset(id, 0, sizeof id);
    if ((g->rank == 0 && (st = e->be->comm_id(e, e->bs, id)) != GCAP_OK) ||
        (st = gc_mpi_bcast(e, g->mpi, id, (int)sizeof id, 0, op)) != GCAP_OK ||
        (st = e->be->comm_new(e, e->bs, id, n, g->rank, D.local, &g->comm)) != GCAP_OK)
      goto fail;
  }
  g->next = D.groups;
  D.groups = g;
  *out = g;
  return GCAP_OK;
fail:
  gc_mpi_free(g->mpi);
  free(g->ranks);
  free(g);
  return st;
}

/* The all-reduce an FP8 autocast's amax_reduction_group takes its amaxes
** max with (the engine's fp8_all_reduce while the runtime is initialised). */
static gcap_status fp8_all_reduce(gcap_tensor *t, gcap_dist_group *g) {
  return gcap_dist_all_reduce(t, GCAP_REDUCE_MAX, g);
}

gcap_status gcap_dist_init(gcap_engine *e) {
  gc_mpi *world = NULL;
  int *all = NULL, i;
  gcap_status st;
  if (e == NULL) return GCAP_EINVAL;
  gc_clear(e);
  if (D.on) return gc_fail(e, GCAP_ESTATE, "init: the distributed runtime is already initialised");
  if (D.done)
    return gc_fail(e, GCAP_ESTATE,
                   "init: the distributed runtime was finalized; MPI cannot "
                   "start again in this process");
  if ((st = gc_check_open(e, "init")) != GCAP_OK ||
      (st = gc_check_not_capturing(e, "init")) != GCAP_OK)
    return st;
  if ((st = gc_mpi_start(e, &D.rank, &D.size, &D.local, &D.owns, &world)) != GCAP_OK) return st;
  if ((all = (int *)gc_malloc((size_t)D.size * sizeof(int))) == NULL) {
    st = gc_fail(e, GCAP_ENOMEM, "init: out of memory");
    goto fail;
  }
  for (i = 0; i < D.size; i++)
    all[i] = i;
  if ((st = group_make(e, world, D.size, all, "init", &D.world)) != GCAP_OK) goto fail;
  free(all);
  gc_mpi_free(world); /* the world group holds a communicator of its own */
  gc_engine_ref(e);
  D.e = e;
  D.on = 1;
  e->fp8_all_reduce = fp8_all_reduce;
  return GCAP_OK;
fail:
  free(all);
  gc_mpi_free(world);
  gc_mpi_stop(D.owns);
  D.done = D.owns; /* MPI stopped: it cannot start again */
  D.rank = D.size = D.local = -1;
  return st;
}

gcap_status gcap_dist_finalize(void) {
  gcap_dist_group *g;
  gcap_engine *e = D.e;
  gcap_status st;
  if (!D.on) return GCAP_ESTATE;
  if ((st = gc_check_not_capturing(e, "finalize")) != GCAP_OK ||
      (D.debug && (st = debug_call(e, D.world, CALL_FINALIZE, 0)) != GCAP_OK))
    return st;
  (void)e->be->device_sync(e, e->bs); /* collectives in flight finish before their comms go */
  for (g = D.groups; g != NULL; g = g->next) {
    e->be->comm_free(e->bs, g->comm);
    gc_mpi_free(g->mpi);
    g->comm = NULL;
    g->mpi = NULL;
  }
  gc_mpi_stop(D.owns);
  D.on = 0;
  D.done = 1;
  D.e = NULL;
  e->fp8_all_reduce = NULL;
  gc_engine_unref(e);
  return GCAP_OK;
}

gcap_status gcap_dist_set_debug(gcap_engine *e, int on) {
  gcap_status st;
  if (e == NULL) return GCAP_EINVAL;
  if ((st = dist_begin(e, "set_debug")) != GCAP_OK) return st;
  D.debug = on != 0;
  return GCAP_OK;
}

gcap_status gcap_dist_new_group(gcap_engine *e, int n, const int *ranks, gcap_dist_group **out) {
  gcap_status st;
  int i, j;
  if (out) *out = NULL;
  if (e == NULL) return GCAP_EINVAL;
  if (out == NULL) return gc_null(e, "new_group", "out");
  if ((st = dist_begin(e, "new_group")) != GCAP_OK ||
      (st = gc_check_not_capturing(e, "new_group")) != GCAP_OK)
    return st;
  if (n < 1) return gc_bad_count(e, "new_group", "n (a group needs at least one rank)", n);
  if (ranks == NULL) return gc_null(e, "new_group", "ranks");
  for (i = 0; i < n; i++) {
    if (ranks[i] < 0 || ranks[i] >= D.size)
      return gc_fail(e, GCAP_EINVAL, "new_group: ranks[%d] = %d is out of range (world size %d)",
                     i + 1, ranks[i], D.size);
    for (j = 0; j < i; j++)
      if (ranks[j] == ranks[i])
        return gc_fail(e, GCAP_EINVAL, "new_group: rank %d is given twice (ranks[%d], ranks[%d])",
                       ranks[i], j + 1, i + 1);
  }
  if (D.debug && (st = debug_group(e, n, ranks)) != GCAP_OK) return st;
  return group_make(e, D.world->mpi, n, ranks, "new_group", out);
}

int gcap_dist_group_rank(const gcap_dist_group *g) {
  if (g == NULL) g = D.world;
  return g ? g->rank : -1;
}

int gcap_dist_group_size(const gcap_dist_group *g) {
  if (g == NULL) g = D.world;
  return g ? g->size : 0;
}

const int *gcap_dist_group_ranks(const gcap_dist_group *g) {
  if (g == NULL) g = D.world;
  return g ? g->ranks : NULL;
}

/* g (NULL: the world) usable by the caller for op. */
static gcap_status group_check(gcap_engine *e, gcap_dist_group **g, const char *op) {
  char buf[256];
  if (*g == NULL) *g = D.world;
  if ((*g)->rank < 0)
    return gc_fail(e, GCAP_EINVAL, "%s: rank %d is not in the group %s", op, D.rank,
                   ranks_str((*g)->ranks, (*g)->size, buf, sizeof buf));
  return GCAP_OK;
}

gcap_status gcap_dist_barrier(gcap_engine *e, gcap_dist_group *g) {
  gcap_status st;
  if (e == NULL) return GCAP_EINVAL;
  if ((st = dist_begin(e, "barrier")) != GCAP_OK ||
      (st = gc_check_not_capturing(e, "barrier")) != GCAP_OK ||
      (st = group_check(e, &g, "barrier")) != GCAP_OK ||
      (st = e->be->stream_sync(e, e->bs, e->current->bs)) != GCAP_OK ||
      (D.debug && (st = debug_call(e, g, CALL_BARRIER, 0)) != GCAP_OK))
    return st;
  return gc_mpi_barrier(e, g->mpi, "barrier");
}

gcap_status gcap_dist_any(gcap_engine *e, int n, unsigned char *flags, gcap_dist_group *g) {
  unsigned char *all = NULL;
  int *ns = NULL, i, r;
  gcap_status st;
  if (e == NULL) return GCAP_EINVAL;
  if ((st = dist_begin(e, "any")) != GCAP_OK || (st = group_check(e, &g, "any")) != GCAP_OK)
    return st;
  if (n < 0 || (n > 0 && flags == NULL))
    return gc_fail(e, GCAP_EINVAL, "any: n is %d and flags %s; n must be >= 0, flags not NULL", n,
                   flags ? "given" : "NULL");
  if (D.debug && (st = debug_call(e, g, CALL_ANY, n)) != GCAP_OK) return st;
  if ((ns = (int *)gc_malloc((size_t)g->size * sizeof *ns)) == NULL)
    return gc_fail(e, GCAP_ENOMEM, "any: out of memory");
  /* the counts first, so that the flags' exchange has one size */
  if ((st = gc_mpi_allgather(e, g->mpi, &n, ns, (int)sizeof n, "any")) != GCAP_OK) goto done;
  for (r = 1; r < g->size && ns[r] == ns[0]; r++)
    ;
  if (r < g->size) {
    st = gc_fail(e, GCAP_EINVAL,
                 "any: the ranks of the group give different numbers of flags: rank %d gives %d, "
                 "rank %d gives %d",
                 g->ranks[0], ns[0], g->ranks[r], ns[r]);
    goto done;
  }
  if (n == 0) goto done;
  if ((all = (unsigned char *)gc_malloc((size_t)g->size * (size_t)n)) == NULL) {
    st = gc_fail(e, GCAP_ENOMEM, "any: out of memory");
    goto done;
  }
  if ((st = gc_mpi_allgather(e, g->mpi, flags, all, n, "any")) != GCAP_OK) goto done;
  for (i = 0; i < n; i++)
    for (r = 0, flags[i] = 0; r < g->size; r++)
      flags[i] |= all[(size_t)r * (size_t)n + (size_t)i] != 0;
done:
  free(all);
  free(ns);
  return st;
}

/* ------------------------------------------------------------------------ */
/* Debug mode: every rank of the group describes its call; all must agree   */

/* A call's descriptor: int64 fields, the same on every rank that agrees. */
enum {
  DD_MARK, /* GC_DEBUG_MARK */
  DD_KIND,
  DD_RED,
  DD_DT,
  DD_NUMEL,
  DD_NDIM,
  DD_SHAPE,
  DD_OUT = DD_SHAPE + GCAP_MAXDIM,
  DD_PEER,
  DD_N
};

static void desc_make(int64_t *d, const gc_coll *c, const gcap_tensor *t, const gcap_tensor *out,
                      int peer) {
  int i;
  memset(d, 0, DD_N * sizeof *d);
  d[DD_MARK] = GC_DEBUG_MARK;
  d[DD_KIND] = c->kind;
  d[DD_RED] =
      c->kind == GC_COLL_ALL_REDUCE || c->kind == GC_COLL_REDUCE_SCATTER ? (int64_t)c->red : -1;
  d[DD_DT] = t->dt;
  d[DD_NUMEL] = t->numel;
  d[DD_NDIM] = t->ndim;
  for (i = 0; i < t->ndim; i++)
    d[DD_SHAPE + i] = t->shape[i];
  d[DD_OUT] = out ? out->numel : -1;
  d[DD_PEER] = c->kind == GC_COLL_BROADCAST ? peer : -1;
}

/* "all_reduce(sum) f32 [2, 3]", "broadcast f32 [4] root 1", "barrier", into buf. */
static const char *desc_str(const int64_t *d, char *buf, size_t n) {
  char shape[96];
  int64_t dims[GCAP_MAXDIM];
  int i, nd = (int)d[DD_NDIM];
  size_t k;
  if (d[DD_KIND] == CALL_ANY) {
    snprintf(buf, n, "any of %lld flags", (long long)d[DD_NUMEL]);
    return buf;
  }
  if (d[DD_KIND] > GC_COLL_RECV) {
    snprintf(buf, n, "%s", d[DD_KIND] == CALL_BARRIER ? "barrier" : "finalize");
    return buf;
  }
  for (i = 0; i < GCAP_MAXDIM; i++)
    dims[i] = d[DD_SHAPE + i];
  k = (size_t)snprintf(buf, n, "%s", gc_coll_name((int)d[DD_KIND]));
  if (d[DD_RED] >= 0 && k < n)
    k += (size_t)snprintf(buf + k, n - k, "(%s)", gc_red_name((int)d[DD_RED]));
  if (k < n)
    k += (size_t)snprintf(
        buf + k, n - k, " %s %s", gc_dtype_name((gcap_dtype)d[DD_DT]),
        gc_dims_str(nd < 0 || nd > GCAP_MAXDIM ? 0 : nd, dims, shape, sizeof shape));
  if (d[DD_OUT] >= 0 && k < n)
    k += (size_t)snprintf(buf + k, n - k, " into %lld elements", (long long)d[DD_OUT]);
  if (d[DD_PEER] >= 0 && k < n) snprintf(buf + k, n - k, " root %lld", (long long)d[DD_PEER]);
  return buf;
}

/* The ranks of g, grouped by what they called: "rank 0 called ...; ranks
** 1, 2 called ...". */
static gcap_status desc_mismatch(gcap_engine *e, const gcap_dist_group *g, const int64_t *all,
                                 const char *op) {
  char msg[GC_ERRLEN], who[128], what[160];
  size_t k = 0;
  int i, j;
  k += (size_t)snprintf(msg, sizeof msg, "ranks of the group disagree (debug mode):");
  for (i = 0; i < g->size && k < sizeof msg; i++) {
    size_t w = 0;
    int seen = 0, count = 0;
    for (j = 0; j < i && !seen; j++)
      seen = memcmp(all + j * DD_N, all + i * DD_N, DD_N * sizeof *all) == 0;
    if (seen) continue;
    for (j = i; j < g->size && w < sizeof who; j++)
      if (memcmp(all + j * DD_N, all + i * DD_N, DD_N * sizeof *all) == 0)
        w += (size_t)snprintf(who + w, sizeof who - w, "%s%d", count++ ? ", " : "", g->ranks[j]);
    k += (size_t)snprintf(msg + k, sizeof msg - k, "%s %s %s called %s", i ? ";" : "",
                          count > 1 ? "ranks" : "rank", who,
                          desc_str(all + i * DD_N, what, sizeof what));
  }
  return gc_fail(e, GCAP_EINVAL, "%s: %s", op, msg);
}

/* The ranks of g whose slot of all holds no descriptor (their call is no
** debug-mode exchange: they are not in debug mode), named in an error of
** op; GCAP_OK when every slot holds one. */
static gcap_status desc_unmarked(gcap_engine *e, const gcap_dist_group *g, const int64_t *all,
                                 const int64_t *mine, const char *op) {
  char who[128], what[160];
  size_t w = 0;
  int i, count = 0;
  for (i = 0; i < g->size; i++)
    if (!gc_debug_marked(all + i * DD_N) && w < sizeof who)
      w += (size_t)snprintf(who + w, sizeof who - w, "%s%d", count++ ? ", " : "", g->ranks[i]);
  if (count == 0) return GCAP_OK;
  return gc_fail(e, GCAP_EINVAL,
                 "%s: %s %s of the group %s not in debug mode and rank %d is (it called %s): "
                 "call gc.dist.set_debug(true) on every rank",
                 op, count > 1 ? "ranks" : "rank", who, count > 1 ? "are" : "is", D.rank,
                 desc_str(mine, what, sizeof what));
}

/* The failure st of op's exchange of descriptors with the group, or with
** world rank peer (>= 0), MPI's message in e: in debug mode a rank that is
** not sends its tensor where a descriptor is expected, which MPI refuses
** when it is larger: say so. */
static gcap_status debug_lost(gcap_engine *e, gcap_status st, const char *op, int peer) {
  char why[GC_ERRLEN], who[64];
  size_t k = strlen(op);
  const char *m = gcap_errmsg(e);
  if (st != GCAP_EDEVICE) return st;
  if (strncmp(m, op, k) == 0 && strncmp(m + k, ": ", 2) == 0) m += k + 2;
  snprintf(why, sizeof why, "%s", m);
  if (peer >= 0)
    snprintf(who, sizeof who, "its peer rank %d", peer);
  else
    snprintf(who, sizeof who, "its group");
  return gc_fail(e, st,
                 "%s: rank %d is in debug mode, and the exchange of descriptors with %s failed "
                 "(%s): a rank that is not in debug mode sent its tensor in place of a "
                 "descriptor; call gc.dist.set_debug(true) on every rank",
                 op, D.rank, who, why);
}

/* Compare descriptor mine (of a call of op) across the ranks of g. A rank
** not in debug mode sends its tensor where the others send descriptors:
** a slot without the mark names it (all starts zeroed, for a shorter
** message). */
static gcap_status debug_agree(gcap_engine *e, const gcap_dist_group *g, const int64_t *mine,
                               const char *op) {
  size_t bytes = DD_N * sizeof *mine;
  int64_t *all;
  gcap_status st;
  int i, bad = 0;
  if ((all = (int64_t *)gc_calloc((size_t)g->size, bytes)) == NULL)
    return gc_fail(e, GCAP_ENOMEM, "%s: out of memory", op);
  if ((st = gc_mpi_allgather(e, g->mpi, mine, all, (int)bytes, op)) != GCAP_OK)
    st = debug_lost(e, st, op, -1);
  else if ((st = desc_unmarked(e, g, all, mine, op)) == GCAP_OK) {
    for (i = 1; i < g->size; i++)
      bad |= memcmp(all, all + i * DD_N, bytes) != 0;
    if (bad) st = desc_mismatch(e, g, all, op);
  }
  free(all);
  return st;
}

/* Debug mode for barrier, finalize and any (of n flags), which take no
** tensor: a rank that calls one while another makes a collective is
** named, not left waiting. */
static gcap_status debug_call(gcap_engine *e, const gcap_dist_group *g, int kind, int64_t n) {
  int64_t mine[DD_N];
  memset(mine, 0, sizeof mine);
  mine[DD_MARK] = GC_DEBUG_MARK;
  mine[DD_KIND] = kind;
  mine[DD_NUMEL] = n;
  mine[DD_RED] = mine[DD_OUT] = mine[DD_PEER] = -1;
  return debug_agree(e, g, mine,
                     kind == CALL_BARRIER ? "barrier"
                     : kind == CALL_ANY   ? "any"
                                          : "finalize");
}

/* Debug mode for new_group: every rank must give the same list. The sizes
** first (so that the lists' exchange has one size), then the lists; an
** error names each rank that gave another list than rank 0. */
static gcap_status debug_group(gcap_engine *e, int n, const int *ranks) {
  char msg[GC_ERRLEN], buf[128];
  int *ns, *all = NULL, r, k = 0;
  gcap_status st;
  if ((ns = (int *)gc_malloc((size_t)D.size * sizeof *ns)) == NULL)
    return gc_fail(e, GCAP_ENOMEM, "new_group: out of memory");
  if ((st = gc_mpi_allgather(e, D.world->mpi, &n, ns, (int)sizeof n, "new_group")) != GCAP_OK)
    goto done;
  for (r = 1; r < D.size && ns[r] == ns[0]; r++)
    ;
  if (r < D.size) {
    st = gc_fail(e, GCAP_EINVAL,
                 "new_group: ranks disagree on the group (debug mode): rank 0 gave a list of %d, "
                 "rank %d of %d",
                 ns[0], r, ns[r]);
    goto done;
  }
  if ((all = (int *)gc_malloc((size_t)D.size * (size_t)n * sizeof *all)) == NULL) {
    st = gc_fail(e, GCAP_ENOMEM, "new_group: out of memory");
    goto done;
  }
  if ((st = gc_mpi_allgather(e, D.world->mpi, ranks, all, n * (int)sizeof *all, "new_group")) !=
      GCAP_OK)
    goto done;
  for (r = 1; r < D.size; r++)
    if (memcmp(all, all + (size_t)r * (size_t)n, (size_t)n * sizeof *all) != 0 &&
        k < (int)sizeof msg)
      k += snprintf(msg + k, sizeof msg - (size_t)k, "; rank %d gave %s", r,
                    ranks_str(all + (size_t)r * (size_t)n, n, buf, sizeof buf));
  if (k > 0)
    st = gc_fail(e, GCAP_EINVAL,
                 "new_group: ranks disagree on the group (debug mode): rank 0 gave %s%s",
                 ranks_str(all, n, buf, sizeof buf), msg);
done:
  free(all);
  free(ns);
  return st;
}

/* Compare this call with the other ranks': the whole group, or for
** send/recv the peer (whose call must be the matching recv/send of the
** same dtype and element count). */
static gcap_status debug_check(gcap_engine *e, const gcap_dist_group *g, const gc_coll *c,
                               const gcap_tensor *t, const gcap_tensor *out, int peer) {
  const char *op = gc_coll_name(c->kind);
  int64_t mine[DD_N];
  desc_make(mine, c, t, out, peer);
  if (c->kind == GC_COLL_SEND || c->kind == GC_COLL_RECV) {
    int64_t theirs[DD_N] = {0};
    char a[160], b[160];
    gcap_status st = gc_mpi_exchange(e, g->mpi, mine, theirs, (int)sizeof mine, c->peer, op);
    if (st != GCAP_OK) return debug_lost(e, st, op, g->ranks[c->peer]);
    if (!gc_debug_marked(theirs))
      return gc_fail(e, GCAP_EINVAL,
                     "%s: its peer rank %d is not in debug mode and rank %d is (it called %s): "
                     "call gc.dist.set_debug(true) on every rank",
                     op, g->ranks[c->peer], D.rank, desc_str(mine, a, sizeof a));
    if (theirs[DD_KIND] == (c->kind == GC_COLL_SEND ? GC_COLL_RECV : GC_COLL_SEND) &&
        theirs[DD_DT] == mine[DD_DT] && theirs[DD_NUMEL] == mine[DD_NUMEL])
      return GCAP_OK;
    return gc_fail(e, GCAP_EINVAL, "%s: rank %d called %s, its peer rank %d called %s (debug mode)",
                   op, D.rank, desc_str(mine, a, sizeof a), g->ranks[c->peer],
                   desc_str(theirs, b, sizeof b));
  }
  return debug_agree(e, g, mine, op);
}

/* ------------------------------------------------------------------------ */
/* Collectives                                                               */

/* Do the bytes of a and b overlap? */
static int overlap(const gcap_tensor *a, const gcap_tensor *b) {
  uintptr_t a0 = (uintptr_t)gc_tensor_ptr(a), b0 = (uintptr_t)gc_tensor_ptr(b);
  uintptr_t a1 = a0 + (uintptr_t)a->numel * gc_dtype_size(a->dt);
  uintptr_t b1 = b0 + (uintptr_t)b->numel * gc_dtype_size(b->dt);
  return a0 < b1 && b0 < a1;
}

/* For all_gather and reduce_scatter: the large tensor of the two may hold
** the small one only as this rank's chunk (in place); else no overlap. */
static gcap_status chunk_check(gcap_engine *e, const gcap_tensor *big, const gcap_tensor *small,
                               int rank, const char *op) {
  const char *at = (const char *)gc_tensor_ptr(big) +
                   (size_t)rank * (size_t)small->numel * gc_dtype_size(small->dt);
  if (!overlap(big, small) || (const char *)gc_tensor_ptr(small) == at) return GCAP_OK;
  return gc_fail(e, GCAP_EINVAL,
                 "%s: out and t overlap; the smaller may only be this rank's chunk of the larger "
                 "(group rank %d)",
                 op, rank);
}

/* The checks shared by every collective: tensors of the bound engine,
** dtypes alike, sizes that fit the group, root or peer in range and in the
** group (as its group rank into *gpeer). */
static gcap_status coll_check(gcap_tensor *t, gcap_tensor *out, gc_coll_kind kind,
                              gcap_reduce_op red, int peer, gcap_dist_group **g, int *gpeer) {
  const char *op = gc_coll_name(kind);
  gcap_engine *e = t->e;
  char buf[256];
  gcap_status st;
  int64_t n;
  if ((st = dist_begin(e, op)) != GCAP_OK) return st;
  if (out != NULL && out->e != e)
    return gc_fail(e, GCAP_EINVAL, "%s: out and t belong to different engines", op);
  if ((st = group_check(e, g, op)) != GCAP_OK) return st;
  if ((int)red < GCAP_REDUCE_SUM || red > GCAP_REDUCE_MAX)
    return gc_fail(e, GCAP_EINVAL, "%s: unknown reduction %d", op, (int)red);
  n = (*g)->size;
  if (out != NULL) {
    if (out->dt != t->dt)
      return gc_fail(e, GCAP_EINVAL, "%s: out is %s and t is %s; they must have one dtype", op,
                     gc_dtype_name(out->dt), gc_dtype_name(t->dt));
    if (kind == GC_COLL_ALL_GATHER && out->numel != n * t->numel)
      return gc_fail(e, GCAP_EINVAL,
                     "%s: out has %lld elements, expected %lld (the group's %lld ranks x t's %lld)",
                     op, (long long)out->numel, (long long)(n * t->numel), (long long)n,
                     (long long)t->numel);
    if (kind == GC_COLL_REDUCE_SCATTER && t->numel != n * out->numel)
      return gc_fail(e, GCAP_EINVAL,
                     "%s: t has %lld elements, expected %lld (the group's %lld ranks x out's %lld)",
                     op, (long long)t->numel, (long long)(n * out->numel), (long long)n,
                     (long long)out->numel);
    st = kind == GC_COLL_ALL_GATHER ? chunk_check(e, out, t, (*g)->rank, op)
                                    : chunk_check(e, t, out, (*g)->rank, op);
    if (st != GCAP_OK) return st;
  }
  *gpeer = -1;
  if (kind >= GC_COLL_BROADCAST) {
    const char *what = kind == GC_COLL_BROADCAST ? "root" : "peer";
    if (peer < 0 || peer >= D.size)
      return gc_fail(e, GCAP_EINVAL, "%s: %s %d is out of range (world size %d)", op, what, peer,
                     D.size);
    if ((*gpeer = group_index(*g, peer)) < 0)
      return gc_fail(e, GCAP_EINVAL, "%s: %s %d is not in the group %s", op, what, peer,
                     ranks_str((*g)->ranks, (*g)->size, buf, sizeof buf));
    if (kind != GC_COLL_BROADCAST && peer == D.rank)
      return gc_fail(e, GCAP_EINVAL, "%s: %s %d is this rank itself", op, what, peer);
  }
  return GCAP_OK;
}

/* One collective: checks, the debug comparison, the notes of what it reads
** and writes, the launch on the current stream. */
static gcap_status collective(gcap_tensor *t, gcap_tensor *out, gc_coll_kind kind,
                              gcap_reduce_op red, int peer, gcap_dist_group *g) {
  const char *op = gc_coll_name(kind);
  gcap_engine *e;
  gcap_stream *s;
  gc_coll c;
  gcap_status st;
  int gpeer = -1, two = kind == GC_COLL_ALL_GATHER || kind == GC_COLL_REDUCE_SCATTER;
  if (t == NULL) return two && out ? gc_null(out->e, op, "t") : GCAP_EINVAL;
  e = t->e;
  if (two && out == NULL) return gc_null(e, op, "out");
  if ((st = coll_check(t, out, kind, red, peer, &g, &gpeer)) != GCAP_OK) return st;
  s = e->current;
  if ((st = gc_check_stream(e, s, op)) != GCAP_OK) return st;
  memset(&c, 0, sizeof c);
  c.kind = kind;
  c.red = (gc_red)red;
  c.dt = (int)t->dt;
  c.peer = gpeer;
  c.src = gc_tensor_ptr(t);
  c.dst = out ? gc_tensor_ptr(out) : gc_tensor_ptr(t);
  c.count = out != NULL && kind == GC_COLL_REDUCE_SCATTER ? out->numel : t->numel;
  c.comm = g->comm;
  c.group = g;
  c.run = gc_mpi_collective;
  if (D.debug && (st = debug_check(e, g, &c, t, out, peer)) != GCAP_OK) return st;
  /* reads, then writes: the sender's t is read, the receiver's written, a
  ** broadcast's both (the root reads, the others write) */
  if ((kind != GC_COLL_RECV && (st = gc_note_access(e, t, 0)) != GCAP_OK) ||
      (out != NULL && (st = gc_note_access(e, out, 1)) != GCAP_OK) ||
      (out == NULL && kind != GC_COLL_SEND && (st = gc_note_access(e, t, 1)) != GCAP_OK))
    return st;
  if ((st = e->be->collective(e, e->bs, s->bs, &c)) != GCAP_OK) return st;
  s->seq++;
  return GCAP_OK;
}

gcap_status gcap_dist_all_reduce(gcap_tensor *t, gcap_reduce_op op, gcap_dist_group *g) {
  return collective(t, NULL, GC_COLL_ALL_REDUCE, op, 0, g);
}

gcap_status gcap_dist_all_gather(gcap_tensor *out, gcap_tensor *t, gcap_dist_group *g) {
  return collective(t, out, GC_COLL_ALL_GATHER, GCAP_REDUCE_SUM, 0, g);
}

gcap_status gcap_dist_reduce_scatter(gcap_tensor *out, gcap_tensor *t, gcap_reduce_op op,
                                     gcap_dist_group *g) {
  return collective(t, out, GC_COLL_REDUCE_SCATTER, op, 0, g);
}

gcap_status gcap_dist_broadcast(gcap_tensor *t, int root, gcap_dist_group *g) {
  return collective(t, NULL, GC_COLL_BROADCAST, GCAP_REDUCE_SUM, root, g);
}

gcap_status gcap_dist_send(gcap_tensor *t, int peer, gcap_dist_group *g) {
  return collective(t, NULL, GC_COLL_SEND, GCAP_REDUCE_SUM, peer, g);
}

gcap_status gcap_dist_recv(gcap_tensor *t, int peer, gcap_dist_group *g) {
  return collective(t, NULL, GC_COLL_RECV, GCAP_REDUCE_SUM, peer, g);
}
