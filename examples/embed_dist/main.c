/*
** embed_dist: a C host training on N ranks with sharded parameters (mpirun
** -np N build/embed_dist; alone it runs as one rank). Each rank keeps 1/N of
** every parameter of a two-layer MLP and trains on its rows of a global
** batch of 8. Before a layer's forward, its shards are all-gathered into the
** full parameter (un-shard); after backward the full grads are
** reduce-scattered (averaged) into the shards' grads, and SGD steps on the
** shards. Eagerly the un-shard is a forward pre-hook of each layer. Graphed,
** the layers go through make_graphed_callables with capture-time hooks that
** un-shard before each forward capture, and the same pre-hook is registered
** after graphing, so that it runs around each replay.
** Checks: graphed = eager bit for bit; N ranks = one process on the global
** batch within 1e-6 + 1e-5 |ref|.
*/
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "graphcap.h"

#define TRY(call)                                                                                  \
  do {                                                                                             \
    gcap_status st_ = (call);                                                                      \
    if (st_ != GCAP_OK) {                                                                          \
      fprintf(stderr, "embed_dist: rank %d: %s: %s\n  at %s\n", gcap_dist_rank(),                  \
              gcap_status_str(st_), gcap_errmsg(e), #call);                                        \
      gcap_dist_abort(1);                                                                          \
    }                                                                                              \
  } while (0)

enum { ROWS = 8, IN = 8, HID = 16, OUT = 4, STEPS = 3, NP = 4, MAXP = 4096 };

typedef struct mlp mlp;

/* A callable of an mlp: the user data of its un-shard hooks. */
typedef struct unit {
  mlp *m;
  int first, count; /* its parameters: p[first .. first+count) */
} unit;

/* A two-layer MLP: callable 1 = Linear + GELU, callable 2 = Linear. Its
** parameters p[k] (l1 weight, l1 bias, l2 weight, l2 bias), their flat
** views and, sharded, this rank's shards. */
struct mlp {
  gcap_engine *e;
  gcap_module *l1, *act, *seq, *l2, *mods[2];
  gcap_tensor *p[NP], *flat[NP], *shard[NP];
  unit units[2];
};

static gcap_status mlp_new(gcap_engine *e, mlp *m) {
  gcap_status st;
  int k;
  memset(m, 0, sizeof *m);
  m->e = e;
  if ((st = gcap_manual_seed(e, 42)) != GCAP_OK ||
      (st = gcap_nn_linear(e, IN, HID, 1, 0, &m->l1)) != GCAP_OK ||
      (st = gcap_nn_gelu(e, &m->act)) != GCAP_OK ||
      (st = gcap_nn_linear(e, HID, OUT, 1, 0, &m->l2)) != GCAP_OK)
    return st;
  m->mods[0] = m->l1;
  m->mods[1] = m->act;
  if ((st = gcap_nn_sequential(e, 2, m->mods, &m->seq)) != GCAP_OK) return st;
  m->mods[0] = m->seq;
  m->mods[1] = m->l2;
  for (k = 0; k < NP; k++) {
    int64_t n;
    m->p[k] = gcap_module_parameter(k < 2 ? m->l1 : m->l2, k % 2, NULL, 0);
    n = gcap_tensor_numel(m->p[k]);
    if ((st = gcap_tensor_view(m->p[k], 1, &n, &m->flat[k])) != GCAP_OK) return st;
  }
  for (k = 0; k < 2; k++) {
    m->units[k].m = m;
    m->units[k].first = 2 * k;
    m->units[k].count = 2;
  }
  return GCAP_OK;
}

static void mlp_free(mlp *m) {
  int k;
  for (k = 0; k < NP; k++) {
    gcap_tensor_free(m->flat[k]);
    gcap_tensor_free(m->shard[k]);
  }
  gcap_module_free(m->seq);
  gcap_module_free(m->l1);
  gcap_module_free(m->act);
  gcap_module_free(m->l2);
}

/* Every rank's parameters become rank 0's; each rank keeps its chunk of
** each (a reduce-scatter with max of equal values: the chunk exactly). */
static gcap_status mlp_shard(mlp *m, int N) {
  gcap_status st = GCAP_OK;
  int k, was = gcap_set_grad_enabled(m->e, 0);
  for (k = 0; k < NP && st == GCAP_OK; k++) {
    int64_t n = gcap_tensor_numel(m->p[k]) / N;
    if ((st = gcap_dist_broadcast(m->p[k], 0, NULL)) == GCAP_OK &&
        (st = gcap_tensor_empty(m->e, GCAP_F32, 1, &n, &m->shard[k])) == GCAP_OK &&
        (st = gcap_dist_reduce_scatter(m->shard[k], m->flat[k], GCAP_REDUCE_MAX, NULL)) == GCAP_OK)
      st = gcap_tensor_set_requires_grad(m->shard[k], 1);
  }
  gcap_set_grad_enabled(m->e, was);
  return st;
}

/* Un-shard a callable: gather its shards into its full parameters. */
static gcap_status unshard(const unit *u) {
  mlp *m = u->m;
  gcap_status st = GCAP_OK;
  int k, was = gcap_set_grad_enabled(m->e, 0);
  for (k = u->first; k < u->first + u->count && st == GCAP_OK; k++)
    st = gcap_dist_all_gather(m->flat[k], m->shard[k], NULL);
  gcap_set_grad_enabled(m->e, was);
  return st;
}

static gcap_status unshard_capture_hook(void *ud, gcap_module *mod) {
  (void)mod;
  return unshard((const unit *)ud);
}

static gcap_status unshard_module_hook(void *ud, gcap_module *mod, const gcap_hook_args *a) {
  (void)mod, (void)a;
  return unshard((const unit *)ud);
}

/* Average the full grads over the ranks into the shards' grads and drop
** them. */
static gcap_status reduce_grads(mlp *m) {
  int k;
  for (k = 0; k < NP; k++) {
    gcap_tensor *g = gcap_tensor_grad(m->p[k]), *gv = NULL, *part = NULL;
    int64_t n = gcap_tensor_numel(m->shard[k]), all = gcap_tensor_numel(m->p[k]);
    gcap_status st;
    if (g == NULL) continue;
    if ((st = gcap_tensor_view(g, 1, &all, &gv)) == GCAP_OK &&
        (st = gcap_tensor_empty(m->e, GCAP_F32, 1, &n, &part)) == GCAP_OK &&
        (st = gcap_dist_reduce_scatter(part, gv, GCAP_REDUCE_AVG, NULL)) == GCAP_OK &&
        (st = gcap_tensor_set_grad(m->shard[k], part)) == GCAP_OK)
      st = gcap_tensor_set_grad(m->p[k], NULL);
    gcap_tensor_free(gv);
    gcap_tensor_free(part);
    if (st != GCAP_OK) return st;
  }
  return GCAP_OK;
}

/* Rows first..last-1 of the global batch (width w, phase ph) as a tensor. */
static gcap_status rows(gcap_engine *e, int w, double ph, int first, int last, gcap_tensor **out) {
  float v[ROWS * HID];
  int64_t shape[2];
  int i, j;
  for (i = first; i < last; i++)
    for (j = 0; j < w; j++)
      v[(i - first) * w + j] = (float)sin(0.37 * ((i + 1) * w + j + 1) + ph);
  shape[0] = last - first;
  shape[1] = w;
  return gcap_tensor_from_f32(e, GCAP_F32, 2, shape, v, out);
}

/* STEPS SGD steps of m on (x, y): over the shards (sharded) or the whole
** parameters (one process). */
static gcap_status train(mlp *m, gcap_tensor *x, gcap_tensor *y, int sharded) {
  gcap_optim *opt;
  gcap_status st;
  int s;
  if ((st = gcap_optim_sgd(m->e, NP, sharded ? m->shard : m->p, 0.1, 0.0, 0.0, &opt)) != GCAP_OK)
    return st;
  for (s = 0; s < STEPS && st == GCAP_OK; s++) {
    gcap_tensor *h = NULL, *out = NULL, *loss = NULL;
    if ((st = gcap_optim_zero_grad(opt, 1)) == GCAP_OK &&
        (st = gcap_module_call(m->seq, 1, &x, &h)) == GCAP_OK &&
        (st = gcap_module_call(m->l2, 1, &h, &out)) == GCAP_OK &&
        (st = gcap_mse_loss(out, y, &loss)) == GCAP_OK &&
        (st = gcap_backward(loss, NULL, 0)) == GCAP_OK &&
        (!sharded || (st = reduce_grads(m)) == GCAP_OK))
      st = gcap_optim_step(opt);
    gcap_tensor_free(h);
    gcap_tensor_free(out);
    gcap_tensor_free(loss);
  }
  gcap_optim_free(opt);
  return st;
}

static gcap_status add_unshard_hooks(mlp *m) {
  gcap_status st = GCAP_OK;
  int c;
  for (c = 0; c < 2 && st == GCAP_OK; c++)
    st = gcap_module_register_hook(m->mods[c], GCAP_HOOK_FORWARD_PRE, unshard_module_hook,
                                   &m->units[c], NULL, NULL);
  return st;
}

/* The values of tensors t[0..NP) one after another into v; their count. */
static int values(gcap_engine *e, gcap_tensor *const *t, float *v) {
  int k, n = 0;
  for (k = 0; k < NP; k++) {
    TRY(gcap_tensor_read(t[k], v + n, (size_t)gcap_tensor_numel(t[k])));
    n += (int)gcap_tensor_numel(t[k]);
  }
  return n;
}

int main(void) {
  static float eager_v[MAXP], graphed_v[MAXP], ref_v[MAXP];
  gcap_engine *e = NULL;
  gcap_tensor *x, *y, *gx, *gy, *h0, *x0;
  gcap_graphed *G;
  mlp eager, graphed, ref;
  int rank, N, per, n, i, k, same, close = 1;
  double worst = 0;

  if (gcap_engine_new(GCAP_DEVICE_DEFAULT, &e) != GCAP_OK) {
    fprintf(stderr, "embed_dist: %s\n", gcap_last_open_error());
    return 1;
  }
  TRY(gcap_dist_init(e));
  rank = gcap_dist_rank();
  N = gcap_dist_world_size();
  if (ROWS % N != 0 || OUT % N != 0) {
    fprintf(stderr, "embed_dist: the world size must divide %d\n", OUT);
    gcap_dist_abort(1);
  }
  per = ROWS / N;
  TRY(rows(e, IN, 0.0, rank * per, (rank + 1) * per, &x));
  TRY(rows(e, OUT, 1.0, rank * per, (rank + 1) * per, &y));

  /* eager: the un-shard is a forward pre-hook of each callable */
  TRY(mlp_new(e, &eager));
  TRY(mlp_shard(&eager, N));
  TRY(add_unshard_hooks(&eager));
  TRY(train(&eager, x, y, 1));

  /* graphed: capture-time hooks un-shard before each forward capture; the
  ** same pre-hook, registered after graphing, runs around each replay */
  TRY(mlp_new(e, &graphed));
  TRY(mlp_shard(&graphed, N));
  {
    gcap_capture_hook fns[1] = {unshard_capture_hook};
    void *uds[2][1] = {{&graphed.units[0]}, {&graphed.units[1]}};
    gcap_capture_hooks hooks[2];
    gcap_graphed_opts o;
    int64_t xs[2] = {per, IN}, hs[2] = {per, HID};
    gcap_tensor *a0[1], *a1[1];
    gcap_tensor *const *args[2] = {a0, a1};
    int nargs[2] = {1, 1}, c;
    memset(hooks, 0, sizeof hooks);
    for (c = 0; c < 2; c++) {
      hooks[c].n[GCAP_HOOK_FORWARD_PRE] = 1;
      hooks[c].fn[GCAP_HOOK_FORWARD_PRE] = fns;
      hooks[c].ud[GCAP_HOOK_FORWARD_PRE] = uds[c];
    }
    TRY(gcap_tensor_full(e, GCAP_F32, 2, xs, 0.0, &x0));
    TRY(gcap_tensor_full(e, GCAP_F32, 2, hs, 0.0, &h0));
    TRY(gcap_tensor_set_requires_grad(h0, 1));
    a0[0] = x0;
    a1[0] = h0;
    gcap_graphed_opts_init(&o);
    o.capture_time_hooks = hooks;
    o.num_capture_time_hooks = 2;
    TRY(gcap_make_graphed_callables(e, 2, graphed.mods, 2, nargs, args, &o, &G));
  }
  TRY(add_unshard_hooks(&graphed));
  TRY(train(&graphed, x, y, 1));

  n = values(e, eager.shard, eager_v);
  values(e, graphed.shard, graphed_v);
  same = memcmp(eager_v, graphed_v, (size_t)n * sizeof(float)) == 0;

  /* one process on the global batch; this rank's shards are its chunks */
  TRY(rows(e, IN, 0.0, 0, ROWS, &gx));
  TRY(rows(e, OUT, 1.0, 0, ROWS, &gy));
  TRY(mlp_new(e, &ref));
  TRY(train(&ref, gx, gy, 0));
  values(e, ref.p, ref_v);
  for (k = 0, i = 0, n = 0; k < NP; k++) {
    int64_t all = gcap_tensor_numel(ref.p[k]), part = all / N, j;
    for (j = rank * part; j < (rank + 1) * part; j++, i++) {
      double d = fabs((double)eager_v[i] - (double)ref_v[n + j]);
      worst = d > worst ? d : worst;
      close &= d <= 1e-6 + 1e-5 * fabs((double)ref_v[n + j]);
    }
    n += (int)all;
  }

  printf("embed_dist rank %d of %d: graphed shards %s the eager ones bit for bit; vs one process "
         "on the global batch: largest difference %.3g (%s)\n",
         rank, N, same ? "equal" : "DIFFER from", worst,
         close ? "within 1e-6 + 1e-5|ref|" : "OUT OF TOLERANCE");
  gcap_graphed_free(G);
  mlp_free(&eager);
  mlp_free(&graphed);
  mlp_free(&ref);
  gcap_tensor_free(x);
  gcap_tensor_free(y);
  gcap_tensor_free(gx);
  gcap_tensor_free(gy);
  gcap_tensor_free(x0);
  gcap_tensor_free(h0);
  TRY(gcap_dist_finalize());
  gcap_engine_free(e);
  return same && close ? 0 : 1;
}
