/*
** embed_custom: a C host that puts its own CUDA kernel (sqplus.cu; on the
** host backend its twin, sqplus_host.c) into graphcap graphs next to a
** graphcap Linear, as a custom op with a backward composed of graphcap
** calls. Two copies of one model start from the same weights: one runs
** eagerly, the other is graphed with make_graphed_callables and
** capture-time hooks; both are trained the same steps, and their losses
** and weights must agree bit for bit.
**
** Model: Block (Linear IN->HID, then sqplus) -> Linear HID->OUT, MSE loss.
** GRAPHCAP_DEVICE=host|cuda picks the backend (default: cuda on a GPU).
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graphcap.h"
#include "sqplus.h"

#define TRY(call)                                                                                  \
  do {                                                                                             \
    gcap_status st_ = (call);                                                                      \
    if (st_ != GCAP_OK) {                                                                          \
      fprintf(stderr, "embed_custom: %s: %s\n  at %s\n", gcap_status_str(st_), gcap_errmsg(e),     \
              #call);                                                                              \
      return 1;                                                                                    \
    }                                                                                              \
  } while (0)

enum { B = 16, IN = 8, HID = 32, OUT = 4, STEPS = 20, WARMUP = 2 };

/* sqplus's grad: g * (1 + x) = g + g * x, x its saved input. */
static gcap_status sqplus_backward(void *ud, int nsaved, gcap_tensor *const *saved, gcap_tensor *g,
                                   int nin, gcap_tensor **gin) {
  gcap_tensor *gx = NULL;
  gcap_status st;
  (void)ud, (void)nsaved, (void)nin;
  if ((st = gcap_mul(g, saved[0], &gx)) == GCAP_OK) st = gcap_add(g, gx, &gin[0]);
  gcap_tensor_free(gx);
  return st;
}

typedef struct block {
  gcap_module *lin;
  gcap_custom_op *op;
} block;

/* Block's forward: sqplus(lin(x)). */
static gcap_status block_forward(void *ud, gcap_module *m, int nin, gcap_tensor *const *in,
                                 gcap_tensor **out) {
  block *b = (block *)ud;
  gcap_tensor *h = NULL;
  gcap_custom_out spec;
  int save = 0; /* the op's input */
  gcap_status st;
  (void)m, (void)nin;
  if ((st = gcap_module_call(b->lin, 1, in, &h)) != GCAP_OK) return st;
  memset(&spec, 0, sizeof spec);
  spec.dtype = GCAP_F32;
  spec.ndim = 2;
  spec.shape[0] = gcap_tensor_shape(h)[0];
  spec.shape[1] = gcap_tensor_shape(h)[1];
  st = gcap_custom_call(b->op, 1, &h, 1, &spec, 1, &save, out);
  gcap_tensor_free(h);
  return st;
}

typedef struct model {
  block blk;
  gcap_module *block, *head;
} model;

/* The model, its weights drawn from seed 7 (the same for every copy). */
static int model_new(gcap_engine *e, gcap_custom_op *op, model *md) {
  memset(md, 0, sizeof *md);
  md->blk.op = op;
  TRY(gcap_manual_seed(e, 7));
  TRY(gcap_nn_linear(e, IN, HID, 1, 0, &md->blk.lin));
  TRY(gcap_nn_linear(e, HID, OUT, 1, 0, &md->head));
  TRY(gcap_module_new(e, "Block", block_forward, &md->blk, NULL, &md->block));
  TRY(gcap_module_add_child(md->block, "lin", md->blk.lin));
  return 0;
}

static void model_free(model *md) {
  gcap_module_free(md->block);
  gcap_module_free(md->blk.lin);
  gcap_module_free(md->head);
}

/* Its parameters (4) into p. */
static int model_params(model *md, gcap_tensor **p) {
  gcap_module *ms[2] = {md->block, md->head};
  int c, i, n = 0;
  for (c = 0; c < 2; c++)
    for (i = 0; i < gcap_module_num_parameters(ms[c]); i++)
      p[n++] = gcap_module_parameter(ms[c], i, NULL, 0);
  return n;
}

/* One training step of md: the loss into *l. */
static int step(gcap_engine *e, model *md, gcap_optim *opt, gcap_tensor *x, gcap_tensor *target,
                float *l) {
  gcap_tensor *h = NULL, *y = NULL, *loss = NULL;
  TRY(gcap_optim_zero_grad(opt, 1));
  TRY(gcap_module_call(md->block, 1, &x, &h)); /* graphed: replays callable 1's forward */
  TRY(gcap_module_call(md->head, 1, &h, &y));
  TRY(gcap_mse_loss(y, target, &loss));
  TRY(gcap_backward(loss, NULL, 0));
  TRY(gcap_optim_step(opt));
  TRY(gcap_tensor_read(loss, l, 1));
  gcap_tensor_free(h), gcap_tensor_free(y), gcap_tensor_free(loss);
  return 0;
}

static int hook_calls[2];

static gcap_status count_hook(void *ud, gcap_module *m) {
  (void)m;
  hook_calls[*(int *)ud]++;
  return GCAP_OK;
}

/* Graph md's two modules, with a capture-time hook per callable before and
** after each forward capture. */
static int graph(gcap_engine *e, model *md, gcap_tensor *x, gcap_tensor *h0, gcap_graphed **G) {
  static int ids[2] = {0, 1};
  static gcap_capture_hook fns[1] = {count_hook};
  gcap_module *mods[2] = {md->block, md->head};
  gcap_capture_hooks hooks[2];
  void *uds[2][1] = {{&ids[0]}, {&ids[1]}};
  gcap_tensor *a0[1] = {x}, *a1[1] = {h0};
  gcap_tensor *const *args[2] = {a0, a1};
  int nargs[2] = {1, 1}, c;
  gcap_graphed_opts o;
  memset(hooks, 0, sizeof hooks);
  for (c = 0; c < 2; c++) {
    hooks[c].n[GCAP_HOOK_FORWARD_PRE] = 1;
    hooks[c].fn[GCAP_HOOK_FORWARD_PRE] = fns;
    hooks[c].ud[GCAP_HOOK_FORWARD_PRE] = uds[c];
  }
  gcap_graphed_opts_init(&o);
  o.num_warmup_iters = WARMUP;
  o.capture_time_hooks = hooks;
  o.num_capture_time_hooks = 2;
  TRY(gcap_make_graphed_callables(e, 2, mods, 2, nargs, args, &o, G));
  return 0;
}

static gcap_device device(void) {
  const char *d = getenv("GRAPHCAP_DEVICE");
  if (d && strcmp(d, "host") == 0) return GCAP_DEVICE_HOST;
  if (d && strcmp(d, "cuda") == 0) return GCAP_DEVICE_CUDA;
  return GCAP_DEVICE_DEFAULT;
}

int main(void) {
  gcap_engine *e = NULL;
  gcap_custom_op *op = NULL;
  gcap_custom_desc d;
  model eager, graphed;
  gcap_tensor *x, *target, *h0, *pe[4], *pg[4];
  gcap_optim *oe, *og;
  gcap_graphed *G = NULL;
  int64_t xs[2] = {B, IN}, ts[2] = {B, OUT}, hs[2] = {B, HID};
  float le = 0, lg = 0, first = 0, we[HID * IN], wg[HID * IN];
  int s, i, fails = 0;

  if (gcap_engine_new(device(), &e) != GCAP_OK) {
    fprintf(stderr, "embed_custom: %s\n", gcap_last_open_error());
    return 1;
  }
  printf("embed_custom: graphcap %s on %s\n", gcap_version(), gcap_engine_device(e));
  memset(&d, 0, sizeof d);
  d.name = "sqplus";
  d.host = sqplus_host;
#ifdef SQPLUS_CUDA
  d.cuda = sqplus_cuda;
#endif
  d.backward = sqplus_backward;
  TRY(gcap_custom_op_new(e, &d, &op));
  if (model_new(e, op, &eager) || model_new(e, op, &graphed)) return 1;
  TRY(gcap_manual_seed(e, 42));
  TRY(gcap_tensor_rand(e, GCAP_F32, 2, xs, 1, &x));
  TRY(gcap_tensor_rand(e, GCAP_F32, 2, ts, 0, &target));
  TRY(gcap_tensor_rand(e, GCAP_F32, 2, hs, 1, &h0));
  TRY(gcap_tensor_set_requires_grad(h0, 1));
  if (graph(e, &graphed, x, h0, &G)) return 1;
  model_params(&eager, pe);
  model_params(&graphed, pg);
  TRY(gcap_optim_sgd(e, 4, pe, 0.05, 0.9, 0.0, &oe));
  TRY(gcap_optim_sgd(e, 4, pg, 0.05, 0.9, 0.0, &og));

  for (s = 0; s < STEPS; s++) {
    if (step(e, &eager, oe, x, target, &le) || step(e, &graphed, og, x, target, &lg)) return 1;
    if (s == 0) first = le;
    if (memcmp(&le, &lg, sizeof le) != 0) {
      fprintf(stderr, "embed_custom: step %d: graphed loss %.9g, eager %.9g\n", s, (double)lg,
              (double)le);
      fails++;
    }
  }
  TRY(gcap_tensor_read(pe[0], we, HID * IN));
  TRY(gcap_tensor_read(pg[0], wg, HID * IN));
  for (i = 0; i < HID * IN; i++)
    if (memcmp(&we[i], &wg[i], sizeof we[i]) != 0) {
      fprintf(stderr, "embed_custom: weight %d: graphed %.9g, eager %.9g\n", i, (double)wg[i],
              (double)we[i]);
      fails++;
      break;
    }
  printf("embed_custom: loss %.6f -> %.6f in %d steps, graphed equal to eager bit for bit: %s\n",
         (double)first, (double)le, STEPS, fails ? "NO" : "yes");
  if (!(le < first)) {
    fprintf(stderr, "embed_custom: the loss did not fall\n");
    fails++;
  }
  for (i = 0; i < 2; i++)
    if (hook_calls[i] != WARMUP + 1) {
      fprintf(stderr, "embed_custom: callable %d's hook ran %d times, expected %d\n", i + 1,
              hook_calls[i], WARMUP + 1);
      fails++;
    }
  gcap_optim_free(oe), gcap_optim_free(og);
  gcap_graphed_free(G);
  gcap_tensor_free(x), gcap_tensor_free(target), gcap_tensor_free(h0);
  model_free(&eager), model_free(&graphed);
  gcap_custom_op_free(op);
  gcap_engine_free(e);
  return fails ? 1 : 0;
}
