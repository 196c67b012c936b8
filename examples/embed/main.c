/*
** embed: a C host that builds a small MLP, graphs its two layers with
** make_graphed_callables and capture-time hooks, trains it against a fixed
** target, and checks that the loss falls and that the hooks ran exactly
** (num_warmup_iters + 1) times per pass and never on replay.
*/
#include <stdio.h>
#include <string.h>

#include "graphcap.h"

#define TRY(call)                                                                                  \
  do {                                                                                             \
    gcap_status st_ = (call);                                                                      \
    if (st_ != GCAP_OK) {                                                                          \
      fprintf(stderr, "embed: %s: %s\n  at %s\n", gcap_status_str(st_), gcap_errmsg(e), #call);    \
      return 1;                                                                                    \
    }                                                                                              \
  } while (0)

static int hook_calls[2][4]; /* per callable, per hook group */

typedef struct hook_ud {
  int callable, group;
} hook_ud;

static gcap_status count_hook(void *ud, gcap_module *m) {
  hook_ud *h = (hook_ud *)ud;
  (void)m;
  hook_calls[h->callable][h->group]++;
  return GCAP_OK;
}

static gcap_status progress(void *ud, const char *phase, int done, int total) {
  (void)ud;
  if (done == total) printf("  %s: %d passes\n", phase, total);
  return GCAP_OK;
}

int main(void) {
  enum { B = 32, IN = 8, HID = 32, OUT = 4, STEPS = 200, WARMUP = 3 };
  gcap_engine *e = NULL;
  gcap_module *l1, *act, *l2, *mlp1, *mods[2];
  gcap_tensor *x, *target, *h0;
  gcap_graphed *G;
  gcap_optim *opt;
  gcap_capture_hooks hooks[2];
  gcap_capture_hook fns[1] = {count_hook};
  hook_ud uds[2][4];
  void *udp[2][4][1];
  gcap_graphed_opts o;
  int64_t xs[2] = {B, IN}, ts[2] = {B, OUT}, hs[2] = {B, HID};
  float first = 0, last = 0;
  int c, g, step, fails = 0;

  if (gcap_engine_new(GCAP_DEVICE_DEFAULT, &e) != GCAP_OK) {
    fprintf(stderr, "embed: %s\n", gcap_last_open_error());
    return 1;
  }
  printf("embed: graphcap %s on %s\n", gcap_version(), gcap_engine_device(e));
  TRY(gcap_manual_seed(e, 42));
  TRY(gcap_nn_linear(e, IN, HID, 1, 0, &l1));
  TRY(gcap_nn_gelu(e, &act));
  TRY(gcap_nn_linear(e, HID, OUT, 1, 0, &l2));
  mods[0] = l1;
  mods[1] = act;
  TRY(gcap_nn_sequential(e, 2, mods, &mlp1)); /* callable 1: Linear + GELU */
  mods[0] = mlp1;
  mods[1] = l2; /* callable 2: Linear */
  TRY(gcap_tensor_rand(e, GCAP_F32, 2, xs, 1, &x));
  TRY(gcap_tensor_rand(e, GCAP_F32, 2, ts, 0, &target));
  TRY(gcap_tensor_rand(e, GCAP_F32, 2, hs, 1, &h0));
  TRY(gcap_tensor_set_requires_grad(h0, 1));

  memset(hooks, 0, sizeof hooks);
  for (c = 0; c < 2; c++)
    for (g = 0; g < 4; g++) {
      uds[c][g].callable = c;
      uds[c][g].group = g;
      udp[c][g][0] = &uds[c][g];
      hooks[c].n[g] = 1;
      hooks[c].fn[g] = fns;
      hooks[c].ud[g] = udp[c][g];
    }
  gcap_graphed_opts_init(&o);
  o.num_warmup_iters = WARMUP;
  o.capture_time_hooks = hooks;
  o.num_capture_time_hooks = 2;
  o.progress = progress;
  {
    gcap_tensor *a0[1] = {x}, *a1[1] = {h0};
    gcap_tensor *const *args[2] = {a0, a1};
    int nargs[2] = {1, 1};
    TRY(gcap_make_graphed_callables(e, 2, mods, 2, nargs, args, &o, &G));
  }
  {
    gcap_tensor *params[4];
    int n = 0, i;
    for (c = 0; c < 2; c++)
      for (i = 0; i < gcap_module_num_parameters(mods[c]); i++)
        params[n++] = gcap_module_parameter(mods[c], i, NULL, 0);
    TRY(gcap_optim_sgd(e, n, params, 0.05, 0.9, 0.0, &opt));
  }

  for (step = 0; step < STEPS; step++) {
    gcap_tensor *h, *y, *loss;
    float l;
    TRY(gcap_optim_zero_grad(opt, 1));
    TRY(gcap_module_call(mlp1, 1, &x, &h)); /* replays callable 1's forward graph */
    TRY(gcap_module_call(l2, 1, &h, &y));   /* and callable 2's */
    TRY(gcap_mse_loss(y, target, &loss));
    TRY(gcap_backward(loss, NULL, 0)); /* replays both backward graphs */
    TRY(gcap_optim_step(opt));
    TRY(gcap_tensor_read(loss, &l, 1));
    if (step == 0) first = l;
    last = l;
    if (step % 50 == 0 || step == STEPS - 1) printf("  step %3d  loss %.6f\n", step, (double)l);
    gcap_tensor_free(h);
    gcap_tensor_free(y);
    gcap_tensor_free(loss);
  }

  printf("embed: loss %.6f -> %.6f\n", (double)first, (double)last);
  if (!(last < first / 10)) {
    fprintf(stderr, "embed: the loss did not fall tenfold\n");
    fails++;
  }
  for (c = 0; c < 2; c++)
    for (g = 0; g < 4; g++)
      if (hook_calls[c][g] != WARMUP + 1) {
        fprintf(stderr, "embed: callable %d hook group %d ran %d times, expected %d\n", c + 1, g,
                hook_calls[c][g], WARMUP + 1);
        fails++;
      }
  if (fails == 0) printf("embed: hooks ran %d times per pass, none on replay: ok\n", WARMUP + 1);
  gcap_optim_free(opt);
  gcap_graphed_free(G);
  gcap_tensor_free(x);
  gcap_tensor_free(target);
  gcap_tensor_free(h0);
  gcap_module_free(mlp1);
  gcap_module_free(l1);
  gcap_module_free(act);
  gcap_module_free(l2);
  gcap_engine_free(e);
  return fails ? 1 : 0;
}
