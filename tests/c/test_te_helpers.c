/*
** test_te_helpers.c: TransformerEngine's helpers through the C API:
** gcap_is_graph_capturing for the whole of gcap_make_graphed_callables;
** random generators (a tracked state drawn from in a capture advances at
** each replay, the graph keeps its memory, saving and restoring a state on
** the device, graphing leaves every state as it found it); and a graphed
** call's replay options (cuda_graph_stream, cuda_graph_event: an external
** event the forward graph records), with the errors of each.
*/
#include "t.h"

static const int64_t shape4[1] = {4};

/* ------------------------------------------------------------------------ */
/* is_graph_capturing                                                        */

typedef struct probe {
  gcap_engine *e;
  int calls, graphing, capturing; /* forwards seen, how many with each flag set */
  int hooks, hooks_graphing, hooks_capturing;
} probe;

/* y = 2x, noting the flags */
static gcap_status probe_fwd(void *ud, gcap_module *m, int nin, gcap_tensor *const *in,
                             gcap_tensor **out) {
  probe *p = (probe *)ud;
  (void)m, (void)nin;
  p->calls++;
  p->graphing += gcap_is_graph_capturing(p->e);
  p->capturing += gcap_is_capturing(p->e);
  return gcap_scale(in[0], 2.0, out);
}

static gcap_status probe_hook(void *ud, gcap_module *m) {
  probe *p = (probe *)ud;
  (void)m;
  p->hooks++;
  p->hooks_graphing += gcap_is_graph_capturing(p->e);
  p->hooks_capturing += gcap_is_capturing(p->e);
  return GCAP_OK;
}

static void test_is_graph_capturing(void) {
  gcap_engine *e = t_engine();
  probe p = {0};
  gcap_module *m = NULL;
  gcap_tensor *x = NULL, *args[1];
  gcap_graphed *G = NULL;
  gcap_graphed_opts o;
  gcap_capture_hooks h;
  gcap_capture_hook fn[1] = {probe_hook};
  void *uds[1] = {&p};
  int nargs = 1, k;
  gcap_tensor *const *argv[1] = {args};
  T_REQUIRE(e != NULL);
  p.e = e;
  T_CHECK(gcap_is_graph_capturing(e) == 0 && gcap_is_graph_capturing(NULL) == 0);
  if (gcap_module_new(e, "Probe", probe_fwd, &p, NULL, &m) != GCAP_OK ||
      gcap_tensor_full(e, GCAP_F32, 1, shape4, 1.0, &x) != GCAP_OK ||
      gcap_tensor_set_requires_grad(x, 1) != GCAP_OK) {
    T_FAILF("set-up", "%s", gcap_errmsg(e));
    goto done;
  }
  args[0] = x;
  memset(&h, 0, sizeof h);
  for (k = 0; k < GCAP_HOOK_KINDS; k++) {
    h.n[k] = 1;
    h.fn[k] = fn;
    h.ud[k] = uds;
  }
  gcap_graphed_opts_init(&o);
  o.num_warmup_iters = 2;
  o.capture_time_hooks = &h;
  o.num_capture_time_hooks = 1;
  T_CHECK_ST(e, gcap_make_graphed_callables(e, 1, &m, 1, &nargs, argv, &o, &G), GCAP_OK);
  T_CHECK(gcap_is_graph_capturing(e) == 0);
  T_CHECK(p.calls == 3 && p.graphing == 3 && p.capturing == 1); /* 2 warmups and the capture */
  T_CHECK(p.hooks == 3 * GCAP_HOOK_KINDS && p.hooks_graphing == p.hooks);
  T_CHECK(p.hooks_capturing == 0);
done:
  gcap_graphed_free(G);
  gcap_tensor_free(x);
  gcap_module_free(m);
  gcap_engine_free(e);
}

/* ------------------------------------------------------------------------ */
/* Generators                                                                */

static int read4(gcap_tensor *t, float v[4]) {
  return t != NULL && gcap_tensor_read(t, v, 4) == GCAP_OK;
}

/* A generator in use gives what its seed gives the default one; the other
** keeps its state; save and restore on the device repeat the draws. */
static void test_generators(void) {
  gcap_engine *e = t_engine();
  gcap_generator *g = NULL;
  gcap_tensor *a = NULL, *b = NULL, *ref = NULL, *saved = NULL;
  uint64_t seed = 0, off = 0;
  float va[4], vb[4], vr[4];
  T_REQUIRE(e != NULL);
  T_CHECK(gcap_current_generator(e) == gcap_default_generator(e));
  T_CHECK_ST(e, gcap_generator_new(e, 77, &g), GCAP_OK);
  if (g == NULL) goto done;
  T_CHECK_ST(e, gcap_set_generator(e, g), GCAP_OK);
  T_CHECK(gcap_current_generator(e) == g);
  T_CHECK_ST(e, gcap_generator_save(g, &saved), GCAP_OK);
  T_CHECK_ST(e, gcap_tensor_rand(e, GCAP_F32, 1, shape4, 0, &a), GCAP_OK);
  T_CHECK_ST(e, gcap_generator_get_state(g, &seed, &off), GCAP_OK);
  T_CHECK(seed == 77 && off == 4);
  T_CHECK_ST(e, gcap_generator_restore(g, saved), GCAP_OK);
  T_CHECK_ST(e, gcap_tensor_rand(e, GCAP_F32, 1, shape4, 0, &b), GCAP_OK);
  T_CHECK(read4(a, va) && read4(b, vb) && memcmp(va, vb, sizeof va) == 0);
  T_CHECK_ST(e, gcap_set_generator(e, NULL), GCAP_OK);
  T_CHECK_ST(e, gcap_generator_get_state(gcap_default_generator(e), &seed, &off), GCAP_OK);
  T_CHECK(seed == 0 && off == 0); /* the default one drew nothing */
  T_CHECK_ST(e, gcap_manual_seed(e, 77), GCAP_OK);
  T_CHECK_ST(e, gcap_tensor_rand(e, GCAP_F32, 1, shape4, 0, &ref), GCAP_OK);
  T_CHECK(read4(ref, vr) && memcmp(va, vr, sizeof va) == 0);
  T_CHECK_ST(e, gcap_generator_restore(g, a), GCAP_OK); /* any 4-element f32 tensor */
  gcap_tensor_free(b);
  b = NULL;
  T_CHECK_ST(e, gcap_tensor_full(e, GCAP_F32, 1, (const int64_t[]){3}, 0.0, &b), GCAP_OK);
  T_CHECK_ST(e, gcap_generator_restore(g, b), GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "generator_restore: the state must be the 4-element f32 tensor"));
done:
  gcap_tensor_free(a);
  gcap_tensor_free(b);
  gcap_tensor_free(ref);
  gcap_tensor_free(saved);
  gcap_generator_free(g);
  gcap_engine_free(e);
}

/* A graph captured while g is in use draws from g at each replay, advances
** it, and keeps its memory after g is freed; the default one is untouched. */
static void test_graph_draws_from_generator(void) {
  gcap_engine *e = t_engine();
  gcap_generator *g = NULL;
  gcap_graph *gr = NULL;
  gcap_tensor *r = NULL;
  uint64_t seed = 0, off = 0;
  float v1[4], v2[4];
  T_REQUIRE(e != NULL);
  T_CHECK_OK(e, gcap_generator_new(e, 5, &g));
  T_CHECK_OK(e, gcap_graph_new(e, &gr));
  T_CHECK_OK(e, gcap_capture_begin(gr, NULL, NULL));
  T_CHECK_ST(e, gcap_set_generator(e, g), GCAP_OK); /* allowed in a capture */
  T_CHECK_ST(e, gcap_tensor_rand(e, GCAP_F32, 1, shape4, 0, &r), GCAP_OK);
  T_CHECK_ST(e, gcap_set_generator(e, NULL), GCAP_OK);
  T_CHECK_ST(e, gcap_generator_get_state(g, &seed, &off), GCAP_ECAPTURE); /* a read-back */
  T_CHECK_ST(e, gcap_capture_end(gr), GCAP_ECAPTURE);
  T_CHECK_OK(e, gcap_capture_begin(gr, NULL, NULL)); /* again, cleanly */
  gcap_tensor_free(r);
  r = NULL;
  T_CHECK_ST(e, gcap_set_generator(e, g), GCAP_OK);
  T_CHECK_ST(e, gcap_tensor_rand(e, GCAP_F32, 1, shape4, 0, &r), GCAP_OK);
  T_CHECK_ST(e, gcap_set_generator(e, NULL), GCAP_OK);
  T_CHECK_OK(e, gcap_capture_end(gr));
  T_CHECK_ST(e, gcap_graph_replay(gr), GCAP_OK);
  T_CHECK(read4(r, v1));
  T_CHECK_ST(e, gcap_generator_get_state(g, &seed, &off), GCAP_OK);
  T_CHECK(seed == 5 && off == 4);
  gcap_generator_free(g); /* the graph keeps its state's memory */
  g = NULL;
  T_CHECK_ST(e, gcap_graph_replay(gr), GCAP_OK);
  T_CHECK(read4(r, v2) && memcmp(v1, v2, sizeof v1) != 0); /* fresh draws */
  T_CHECK_ST(e, gcap_generator_get_state(gcap_default_generator(e), &seed, &off), GCAP_OK);
  T_CHECK(seed == 0 && off == 0);
  gcap_tensor_free(r);
  gcap_graph_free(gr);
  gcap_generator_free(g);
  gcap_engine_free(e);
}

/* dropout(x) drawing from the generator in ud. */
static gcap_status drop_fwd(void *ud, gcap_module *m, int nin, gcap_tensor *const *in,
                            gcap_tensor **out) {
  gcap_engine *e = gcap_tensor_engine(in[0]);
  gcap_status st;
  (void)m, (void)nin;
  if ((st = gcap_set_generator(e, (gcap_generator *)ud)) != GCAP_OK) return st;
  st = gcap_dropout(in[0], 0.5, 1, out);
  gcap_set_generator(e, NULL);
  return st;
}

/* make_graphed_callables leaves every generator's state as it found it. */
static void test_graphing_leaves_generators(void) {
  gcap_engine *e = t_engine();
  gcap_generator *g = NULL;
  gcap_module *m = NULL;
  gcap_tensor *x = NULL, *y = NULL, *args[1];
  gcap_tensor *const *argv[1] = {args};
  gcap_graphed *G = NULL;
  uint64_t seed = 0, off = 0;
  int nargs = 1;
  T_REQUIRE(e != NULL);
  T_CHECK_OK(e, gcap_generator_new(e, 9, &g));
  T_CHECK_OK(e, gcap_module_new(e, "Drop", drop_fwd, g, NULL, &m));
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 1, shape4, 1.0, &x));
  args[0] = x;
  T_CHECK_ST(e, gcap_make_graphed_callables(e, 1, &m, 1, &nargs, argv, NULL, &G), GCAP_OK);
  T_CHECK_ST(e, gcap_generator_get_state(g, &seed, &off), GCAP_OK);
  T_CHECK(seed == 9 && off == 0);
  T_CHECK_ST(e, gcap_module_call(m, 1, args, &y), GCAP_OK); /* a replay draws */
  T_CHECK_ST(e, gcap_generator_get_state(g, &seed, &off), GCAP_OK);
  T_CHECK(off == 4);
  gcap_tensor_free(y);
  gcap_graphed_free(G);
  gcap_tensor_free(x);
  gcap_module_free(m);
  gcap_generator_free(g);
  gcap_engine_free(e);
}

/* ------------------------------------------------------------------------ */
/* Replay options                                                            */

/* y = relu(2x), recording the external event in ud between the two */
static gcap_status rec_fwd(void *ud, gcap_module *m, int nin, gcap_tensor *const *in,
                           gcap_tensor **out) {
  gcap_tensor *h = NULL;
  gcap_status st;
  (void)m, (void)nin;
  if ((st = gcap_scale(in[0], 2.0, &h)) != GCAP_OK) return st;
  if (ud != NULL && (st = gcap_event_record((gcap_event *)ud, NULL)) == GCAP_OK)
    st = gcap_relu(h, out);
  else if (st == GCAP_OK)
    st = gcap_relu(h, out);
  gcap_tensor_free(h);
  return st;
}

static void test_replay_options(void) {
  gcap_engine *e = t_engine();
  gcap_event *ext = NULL, *plain = NULL;
  gcap_stream *s = NULL;
  gcap_module *m = NULL, *other = NULL;
  gcap_tensor *x = NULL, *y1 = NULL, *y2[1] = {NULL}, *args[1];
  gcap_tensor *const *argv[1] = {args};
  gcap_graphed *G = NULL;
  gcap_replay_opts o;
  float v1[4], v2[4];
  int nargs = 1, nout = 0;
  T_REQUIRE(e != NULL);
  T_CHECK_OK(e, gcap_event_new_external(e, &ext));
  T_CHECK_OK(e, gcap_event_new(e, &plain));
  T_CHECK_OK(e, gcap_stream_new(e, &s));
  T_CHECK_OK(e, gcap_module_new(e, "Rec", rec_fwd, ext, NULL, &m));
  T_CHECK_OK(e, gcap_module_new(e, "Plain", rec_fwd, NULL, NULL, &other));
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 1, shape4, -0.5, &x));
  args[0] = x;
  T_CHECK_OK(e, gcap_make_graphed_callables(e, 1, &m, 1, &nargs, argv, NULL, &G));
  T_CHECK_ST(e, gcap_graphed_call(G, 0, 1, args, &y1), GCAP_OK);
  T_CHECK(read4(y1, v1));
  o.stream = s;
  o.event = ext;
  T_CHECK_ST(e, gcap_graphed_call_opts(G, 0, &o, 1, args, 1, &nout, y2), GCAP_OK);
  T_CHECK(nout == 1 && read4(y2[0], v2) && memcmp(v1, v2, sizeof v1) == 0);
  gcap_tensor_free(y2[0]);
  y2[0] = NULL;
  T_CHECK_ST(e, gcap_module_call_opts(m, &o, 1, args, 1, &nout, y2), GCAP_OK);
  gcap_tensor_free(y2[0]);
  y2[0] = NULL;
  o.event = plain;
  T_CHECK_ST(e, gcap_graphed_call_opts(G, 0, &o, 1, args, 1, &nout, y2), GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "cuda_graph_event is not an external event"));
  o.event = NULL;
  T_CHECK_ST(e, gcap_module_call_opts(other, &o, 1, args, 1, &nout, y2), GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "Plain: cuda_graph_stream and cuda_graph_event are options of a graphed"));
  T_CHECK_ST(e, gcap_graphed_call_opts(G, 0, NULL, 1, args, 1, &nout, y2), GCAP_OK);
  gcap_tensor_free(y2[0]);
  gcap_tensor_free(y1);
  gcap_graphed_free(G);
  gcap_tensor_free(x);
  gcap_module_free(m);
  gcap_module_free(other);
  gcap_stream_free(s);
  gcap_event_free(plain);
  gcap_event_free(ext);
  gcap_engine_free(e);
}

int main(void) {
  T_RUN(test_is_graph_capturing);
  T_RUN(test_generators);
  T_RUN(test_graph_draws_from_generator);
  T_RUN(test_graphing_leaves_generators);
  T_RUN(test_replay_options);
  return t_done();
}
