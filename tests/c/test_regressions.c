/*
** test_regressions.c: one test per defect found by trying to break the
** engine through its C API (bad arguments, lifetimes, failures inside
** captures), each failing before its fix. `test_regressions NAME` runs only
** the tests whose name contains NAME.
*/
#include "t.h"

#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
#include <malloc.h>
/* Bytes of host memory in use by malloc (-1: not known here). */
static long long t_heap_bytes(void) {
  struct mallinfo2 mi = mallinfo2();
  return (long long)mi.uordblks + (long long)mi.hblkhd;
}
#else
static long long t_heap_bytes(void) {
  return -1;
}
#endif

/* A Linear(3, 4) graphed from a [2, 3] sample that requires grad. */
typedef struct fixture {
  gcap_engine *e;
  gcap_module *m;
  gcap_tensor *x;
  gcap_graphed *G;
} fixture;

static int fx_open(fixture *f) {
  const int64_t s[2] = {2, 3};
  const float dx[6] = {0.5f, -1.0f, 2.0f, 0.25f, -0.75f, 1.5f};
  gcap_graphed_opts o;
  memset(f, 0, sizeof *f);
  if ((f->e = t_engine()) == NULL) return 0;
  if ((f->x = t_from(f->e, 2, s, dx)) == NULL) return 0;
  if (gcap_tensor_set_requires_grad(f->x, 1) != GCAP_OK) return 0;
  if (gcap_nn_linear(f->e, 3, 4, 1, 0, &f->m) != GCAP_OK) return 0;
  gcap_tensor *const a0[1] = {f->x};
  gcap_tensor *const *args[1] = {a0};
  const int nargs[1] = {1};
  gcap_graphed_opts_init(&o);
  o.num_warmup_iters = 1;
  return gcap_make_graphed_callables(f->e, 1, &f->m, 1, nargs, args, &o, &f->G) == GCAP_OK;
}

static void fx_close(fixture *f) {
  gcap_graphed_free(f->G);
  gcap_tensor_free(f->x);
  gcap_module_free(f->m);
  gcap_engine_free(f->e);
}

/* gcap_graphed_call with n > 0 and no input array: an error with a
** message, on the replay path and on the eager fallback (eval mode). */
static void test_graphed_call_null_inputs(void) {
  fixture f;
  gcap_tensor *y = NULL;
  T_SETUP(fx_open(&f), fx_close(&f));
  T_CHECK_ST(f.e, gcap_graphed_call(f.G, 0, 1, NULL, &y), GCAP_EINVAL);
  T_CHECK(y == NULL && gcap_errmsg(f.e)[0] != '\0');
  gcap_module_train(f.m, 0); /* another mode than captured: the eager path */
  T_CHECK_ST(f.e, gcap_graphed_call(f.G, 0, 1, NULL, &y), GCAP_EINVAL);
  T_CHECK(y == NULL && gcap_errmsg(f.e)[0] != '\0');
  T_CHECK_ST(f.e, gcap_graphed_call(f.G, 0, -1, NULL, &y), GCAP_EINVAL);
  gcap_module_train(f.m, 1);
  T_CHECK_OK(f.e, gcap_graphed_call(f.G, 0, 1, &f.x, &y)); /* still usable */
  gcap_tensor_free(y);
  fx_close(&f);
}

/* The eager fallback names a NULL tensor and a tensor of another engine. */
static void test_graphed_eager_fallback_messages(void) {
  fixture f;
  gcap_engine *e2 = NULL;
  gcap_tensor *y = NULL, *other = NULL, *none = NULL;
  const int64_t s[2] = {2, 3};
  T_SETUP(fx_open(&f), fx_close(&f));
  T_SETUP((e2 = t_engine()) != NULL, fx_close(&f));
  T_CHECK_OK(e2, gcap_tensor_full(e2, GCAP_F32, 2, s, 1.0, &other));
  gcap_module_train(f.m, 0);
  T_CHECK_ST(f.e, gcap_graphed_call(f.G, 0, 1, &other, &y), GCAP_EINVAL);
  T_CHECK(t_msg_has(f.e, "argument #1") && t_msg_has(f.e, "another engine"));
  T_CHECK_ST(f.e, gcap_graphed_call(f.G, 0, 1, &none, &y), GCAP_EINVAL);
  T_CHECK(t_msg_has(f.e, "argument #1") && t_msg_has(f.e, "NULL"));
  T_CHECK(y == NULL);
  gcap_tensor_free(other);
  gcap_engine_free(e2);
  fx_close(&f);
}

/* A graphed callable refuses an input of another shape or dtype (same
** element count), naming the argument and both shapes. */
static void test_graphed_call_checks_shape(void) {
  fixture f;
  gcap_tensor *y = NULL, *t32 = NULL, *t6 = NULL, *tb = NULL;
  const int64_t s32[2] = {3, 2}, s6[1] = {6}, s23[2] = {2, 3};
  T_SETUP(fx_open(&f), fx_close(&f));
  T_CHECK_OK(f.e, gcap_tensor_full(f.e, GCAP_F32, 2, s32, 1.0, &t32));
  T_CHECK_OK(f.e, gcap_tensor_full(f.e, GCAP_F32, 1, s6, 1.0, &t6));
  T_CHECK_OK(f.e, gcap_tensor_full(f.e, GCAP_BF16, 2, s23, 1.0, &tb));
  T_CHECK_ST(f.e, gcap_graphed_call(f.G, 0, 1, &t32, &y), GCAP_EINVAL);
  T_CHECK(t_msg_has(f.e, "argument #1") && t_msg_has(f.e, "[3, 2]") && t_msg_has(f.e, "[2, 3]"));
  T_CHECK(t_msg_has(f.e, "Linear"));
  T_CHECK_ST(f.e, gcap_graphed_call(f.G, 0, 1, &t6, &y), GCAP_EINVAL);
  T_CHECK(t_msg_has(f.e, "[6]") && t_msg_has(f.e, "[2, 3]"));
  T_CHECK_ST(f.e, gcap_graphed_call(f.G, 0, 1, &tb, &y), GCAP_EINVAL);
  T_CHECK(t_msg_has(f.e, "bf16") && t_msg_has(f.e, "f32"));
  T_CHECK(y == NULL);
  T_CHECK_OK(f.e, gcap_graphed_call(f.G, 0, 1, &f.x, &y));
  gcap_tensor_free(y), gcap_tensor_free(t32), gcap_tensor_free(t6), gcap_tensor_free(tb);
  fx_close(&f);
}

/* A forward whose op fails only at the capture (its second call). */
static gcap_status late_bad_forward(void *ud, gcap_module *m, int nin, gcap_tensor *const *in,
                                    gcap_tensor **out) {
  int *calls = (int *)ud;
  const int64_t s5[1] = {5};
  gcap_tensor *odd = NULL;
  gcap_status st;
  (void)m, (void)nin;
  if (++*calls < 2) return gcap_scale(in[0], 2.0, out);
  if ((st = gcap_tensor_full(gcap_tensor_engine(in[0]), GCAP_F32, 1, s5, 1.0, &odd)) != GCAP_OK)
    return st;
  st = gcap_add(in[0], odd, out); /* [2, 3] + [5]: refused */
  gcap_tensor_free(odd);
  return st;
}

/* An op error inside a make_graphed_callables capture keeps its reason
** after the entry and phase. */
static void test_capture_op_error_keeps_reason(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[2] = {2, 3};
  int calls = 0;
  gcap_module *m = NULL;
  gcap_tensor *x = NULL;
  gcap_graphed *G = NULL;
  gcap_graphed_opts o;
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 2, s, 1.0, &x));
  T_CHECK_OK(e, gcap_module_new(e, "LateBad", late_bad_forward, &calls, NULL, &m));
  gcap_tensor *const a0[1] = {x};
  gcap_tensor *const *args[1] = {a0};
  const int nargs[1] = {1};
  gcap_graphed_opts_init(&o);
  o.num_warmup_iters = 1;
  T_CHECK_ST(e, gcap_make_graphed_callables(e, 1, &m, 1, nargs, args, &o, &G), GCAP_EINVAL);
  T_CHECK(calls == 2 && G == NULL);
  T_CHECK(t_msg_has(e, "forward capture of entry 1 (callable 1, LateBad): "));
  T_CHECK(t_msg_has(e, "add") && t_msg_has(e, "[5]"));
  T_CHECK(!gcap_is_capturing(e));
  gcap_tensor_free(x);
  gcap_module_free(m);
  gcap_engine_free(e);
}

static gcap_status id_forward(void *ud, gcap_module *m, int nin, gcap_tensor *const *in,
                              gcap_tensor **out) {
  (void)ud, (void)m, (void)nin;
  return gcap_scale(in[0], 1.0, out);
}

/* After gcap_engine_free with a live object, every constructor refuses
** with a message; what is alive can still be freed. */
static void test_closed_engine_refuses_constructors(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[1] = {4};
  const float d[4] = {1, 2, 3, 4};
  gcap_tensor *x = t_from(e, 1, s, d), *t = NULL;
  gcap_graph *g = NULL;
  gcap_pool *p = NULL;
  gcap_stream *st = NULL;
  gcap_event *ev = NULL;
  gcap_module *m = NULL;
  gcap_optim *o = NULL;
  gcap_graphed *G = NULL;
  T_REQUIRE(x != NULL);
  gcap_engine_free(e); /* x keeps it alive, closed */
#define T_REFUSES(call, obj)                                                                       \
  do {                                                                                             \
    T_CHECK_ST(e, call, GCAP_ESTATE);                                                              \
    T_CHECK((obj) == NULL && t_msg_has(e, "closed"));                                              \
  } while (0)
  T_REFUSES(gcap_graph_new(e, &g), g);
  T_REFUSES(gcap_pool_new(e, &p), p);
  T_REFUSES(gcap_stream_new(e, &st), st);
  T_REFUSES(gcap_event_new(e, &ev), ev);
  T_REFUSES(gcap_module_new(e, "Id", id_forward, NULL, NULL, &m), m);
  T_REFUSES(gcap_nn_linear(e, 2, 2, 1, 0, &m), m);
  T_REFUSES(gcap_nn_relu(e, &m), m);
  T_REFUSES(gcap_nn_gelu(e, &m), m);
  T_REFUSES(gcap_nn_layer_norm(e, 4, 1e-5, &m), m);
  T_REFUSES(gcap_nn_dropout(e, 0.5, &m), m);
  T_REFUSES(gcap_nn_sequential(e, 0, NULL, &m), m);
  T_REFUSES(gcap_optim_sgd(e, 1, &x, 0.1, 0, 0, &o), o);
  T_REFUSES(gcap_optim_adam(e, 1, &x, 0.1, 0.9, 0.999, 1e-8, 0, &o), o);
  T_REFUSES(gcap_tensor_empty(e, GCAP_F32, 1, s, &t), t);
  T_REFUSES(gcap_tensor_full(e, GCAP_F32, 1, s, 1.0, &t), t);
  T_REFUSES(gcap_tensor_from_f32(e, GCAP_F32, 1, s, d, &t), t);
  T_REFUSES(gcap_tensor_rand(e, GCAP_F32, 1, s, 0, &t), t);
  T_REFUSES(gcap_tensor_view(x, 1, s, &t), t);
  T_REFUSES(gcap_tensor_detach(x, &t), t);
  T_REFUSES(gcap_tensor_clone(x, &t), t);
  {
    gcap_tensor *const a0[1] = {x};
    gcap_tensor *const *args[1] = {a0};
    const int nargs[1] = {1};
    gcap_module *none = NULL;
    T_REFUSES(gcap_make_graphed_callables(e, 1, &none, 1, nargs, args, NULL, &G), G);
  }
#undef T_REFUSES
  gcap_tensor_free(x); /* the last object: the engine goes */
}

/* Sum of in[0..nin). */
static gcap_status sum_forward(void *ud, gcap_module *m, int nin, gcap_tensor *const *in,
                               gcap_tensor **out) {
  gcap_tensor *acc = NULL, *next = NULL;
  gcap_status st;
  (void)ud, (void)m;
  if ((st = gcap_scale(in[0], 1.0, &acc)) != GCAP_OK) return st;
  for (int k = 1; k < nin; k++) {
    if ((st = gcap_add(acc, in[k], &next)) != GCAP_OK) break;
    gcap_tensor_free(acc);
    acc = next;
  }
  if (st != GCAP_OK) {
    gcap_tensor_free(acc);
    return st;
  }
  *out = acc;
  return GCAP_OK;
}

/* A callable of 11 tensor arguments: called directly, graphed, replayed
** and backpropagated through. */
static void test_many_tensor_arguments(void) {
  enum { N = 11 };
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[1] = {3};
  gcap_tensor *in[N] = {0}, *y = NULL;
  gcap_module *m = NULL;
  gcap_graphed *G = NULL;
  gcap_graphed_opts o;
  float r[3];
  for (int k = 0; k < N; k++) {
    T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 1, s, (double)(k + 1), &in[k]));
    T_CHECK_OK(e, gcap_tensor_set_requires_grad(in[k], 1));
  }
  T_CHECK_OK(e, gcap_module_new(e, "SumAll", sum_forward, NULL, NULL, &m));
  T_CHECK_OK(e, gcap_module_call(m, N, in, &y));
  if (t_read(y, r, 3)) T_CHECK(r[0] == 66 && r[2] == 66);
  gcap_tensor_free(y), y = NULL;
  gcap_tensor *const *args[1] = {in};
  const int nargs[1] = {N};
  gcap_graphed_opts_init(&o);
  o.num_warmup_iters = 1;
  T_CHECK_OK(e, gcap_make_graphed_callables(e, 1, &m, 1, nargs, args, &o, &G));
  T_CHECK_OK(e, gcap_graphed_call(G, 0, N, in, &y));
  if (t_read(y, r, 3)) T_CHECK(r[0] == 66 && r[2] == 66);
  gcap_tensor_free(y), y = NULL;
  T_CHECK_OK(e, gcap_module_call(m, N, in, &y)); /* routed to the replay */
  if (t_read(y, r, 3)) T_CHECK(r[1] == 66);
  T_CHECK_OK(e, gcap_backward(y, y, 0));
  T_CHECK(gcap_tensor_grad(in[N - 1]) != NULL);
  if (gcap_tensor_grad(in[N - 1]) && t_read(gcap_tensor_grad(in[N - 1]), r, 3)) T_CHECK(r[0] == 66);
  gcap_tensor_free(y);
  gcap_graphed_free(G);
  for (int k = 0; k < N; k++)
    gcap_tensor_free(in[k]);
  gcap_module_free(m);
  gcap_engine_free(e);
}

/* A graph freed during its own capture ends that capture: the engine is
** not left capturing, and the next capture works. */
static void test_graph_freed_during_its_capture(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[1] = {4};
  gcap_tensor *x = NULL, *y = NULL;
  gcap_graph *g = NULL, *g2 = NULL;
  gcap_pool *p = NULL;
  gcap_mem_stats ms;
  float r[4];
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 1, s, 2.0, &x));
  T_CHECK_OK(e, gcap_pool_new(e, &p));
  T_CHECK_OK(e, gcap_graph_new(e, &g));
  T_CHECK_OK(e, gcap_capture_begin(g, p, NULL));
  T_CHECK_OK(e, gcap_scale(x, 3.0, &y));
  gcap_graph_free(g); /* as a collector would, or a <close> variable on an error */
  T_CHECK(!gcap_is_capturing(e));
  gcap_tensor_free(y), y = NULL;
  T_CHECK_OK(e, gcap_pool_get_stats(p, &ms));
  T_CHECK(ms.graphs == 0 && ms.in_use_bytes == 0);
  T_CHECK_OK(e, gcap_graph_new(e, &g2));
  T_CHECK_OK(e, gcap_capture_begin(g2, p, NULL));
  T_CHECK_OK(e, gcap_scale(x, 3.0, &y));
  T_CHECK_OK(e, gcap_capture_end(g2));
  T_CHECK_OK(e, gcap_graph_replay(g2));
  if (t_read(y, r, 4)) T_CHECK(r[0] == 6 && r[3] == 6);
  T_CHECK_OK(e, gcap_synchronize(e));
  gcap_tensor_free(x), gcap_tensor_free(y);
  gcap_graph_free(g2);
  gcap_pool_free(p);
  gcap_engine_free(e);
}

/* One capture of y = x * 2 into g (a private pool), one replay, freed. */
static int capture_cycle(gcap_engine *e, gcap_tensor *x) {
  gcap_graph *g = NULL;
  gcap_tensor *y = NULL;
  int ok = gcap_graph_new(e, &g) == GCAP_OK && gcap_capture_begin(g, NULL, NULL) == GCAP_OK &&
           gcap_scale(x, 2.0, &y) == GCAP_OK && gcap_capture_end(g) == GCAP_OK &&
           gcap_graph_replay(g) == GCAP_OK;
  gcap_tensor_free(y);
  gcap_graph_free(g);
  return ok;
}

/* 10,000 capture/free cycles grow neither the graph registry nor the host
** heap (measured by malloc's statistics where glibc gives them); two graphs
** alive at once have distinct default names. */
static void test_graph_registry_stays_small(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[1] = {4};
  gcap_tensor *x = NULL;
  gcap_graph *a = NULL, *b = NULL;
  long long before, after;
  int i, ok = 1;
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 1, s, 1.0, &x));
  for (i = 0; i < 100 && ok; i++) /* the steady state: caches, maps */
    ok = capture_cycle(e, x);
  before = t_heap_bytes();
  for (i = 0; i < 10000 && ok; i++)
    ok = capture_cycle(e, x);
  after = t_heap_bytes();
  T_REQUIRE(ok);
  if (before >= 0 && after - before > 16384) /* 10,000 cycles: < 2 B each */
    T_FAILF("heap growth", "%lld bytes after 10,000 capture/free cycles", after - before);
  T_CHECK_OK(e, gcap_graph_new(e, &a));
  T_CHECK_OK(e, gcap_graph_new(e, &b));
  T_CHECK(strcmp(gcap_graph_name(a), gcap_graph_name(b)) != 0);
  gcap_graph_free(a), gcap_graph_free(b);
  gcap_tensor_free(x);
  gcap_engine_free(e);
}

/* cross_entropy refuses targets that are no class id (non-integer, NaN,
** negative, too large), naming the row; inside a capture (no read-back)
** such a row's loss and grads come out NaN, the others' as eagerly. */
static void test_cross_entropy_checks_targets(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t sl[2] = {2, 3}, st[1] = {2};
  const float dl[6] = {0.5f, -1.0f, 2.0f, 0.25f, -0.75f, 1.5f};
  const float bad[4][2] = {{0, 1.5f}, {0, NAN}, {0, 3}, {-1, 0}};
  const float good[2] = {2, 1};
  float r[6];
  gcap_tensor *logits = t_from(e, 2, sl, dl), *t = NULL, *loss = NULL, *tg = NULL;
  gcap_graph *g = NULL;
  T_REQUIRE(logits != NULL);
  T_CHECK_OK(e, gcap_tensor_set_requires_grad(logits, 1));
  for (int k = 0; k < 4; k++) {
    T_REQUIRE((t = t_from(e, 1, st, bad[k])) != NULL);
    T_CHECK_ST(e, gcap_cross_entropy(logits, t, &loss), GCAP_EINVAL);
    T_CHECK(loss == NULL && t_msg_has(e, k == 3 ? "row 1 " : "row 2 ") && t_msg_has(e, "class id"));
    if (k == 1) T_CHECK(t_msg_has(e, "NaN"));
    gcap_tensor_free(t);
  }
  T_REQUIRE((tg = t_from(e, 1, st, good)) != NULL);
  T_CHECK_OK(e, gcap_cross_entropy(logits, tg, &loss));
  gcap_tensor_free(loss), loss = NULL;
  /* captured: a target turned 1.5 after capture gives NaN in its row only */
  T_REQUIRE((t = t_from(e, 1, st, good)) != NULL);
  T_CHECK_OK(e, gcap_graph_new(e, &g));
  T_CHECK_OK(e, gcap_capture_begin(g, NULL, NULL));
  T_CHECK_OK(e, gcap_cross_entropy(logits, t, &loss));
  T_CHECK_OK(e, gcap_backward(loss, NULL, 0));
  T_CHECK_OK(e, gcap_capture_end(g));
  {
    const float half[2] = {2, 1.5f};
    gcap_tensor *h = t_from(e, 1, st, half);
    T_CHECK_OK(e, gcap_copy_(t, h));
    gcap_tensor_free(h);
  }
  T_CHECK_OK(e, gcap_graph_replay(g));
  T_CHECK(isnan(t_value(loss)));
  if (gcap_tensor_grad(logits) && t_read(gcap_tensor_grad(logits), r, 6))
    T_CHECK(!isnan(r[0]) && !isnan(r[2]) && isnan(r[3]) && isnan(r[5]));
  gcap_graph_free(g);
  gcap_tensor_free(logits), gcap_tensor_free(t), gcap_tensor_free(tg), gcap_tensor_free(loss);
  gcap_engine_free(e);
}

/* Storage versions: each in-place op bumps one counter shared by views;
** a backward through a tensor changed in place since it was saved fails
** with PyTorch's message (the op and both versions); a training loop
** (backward, step, again) and graphed replays see no false alarm. */
static void test_inplace_after_save_is_detected(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[2] = {2, 3}, flat[1] = {6};
  const float d[6] = {1, 2, 3, 4, 5, 6};
  gcap_tensor *a = t_from(e, 2, s, d), *h = NULL, *y = NULL, *loss = NULL, *v = NULL, *z = NULL;
  uint64_t v0;
  T_REQUIRE(a != NULL);
  /* every in-place op counts, on the storage */
  v0 = gcap_tensor_version(a);
  T_CHECK_OK(e, gcap_tensor_view(a, 1, flat, &v));
  T_CHECK(gcap_tensor_version(v) == v0);
  T_CHECK_OK(e, gcap_fill_(a, 1.0));
  T_CHECK(gcap_tensor_version(a) == v0 + 1 && gcap_tensor_version(v) == v0 + 1);
  T_CHECK_OK(e, gcap_zero_(v));
  T_CHECK(gcap_tensor_version(a) == v0 + 2);
  T_CHECK_OK(e, gcap_copy_(a, a));
  T_CHECK(gcap_tensor_version(a) == v0 + 3);
  T_CHECK_OK(e, gcap_scale(a, 2.0, &z)); /* reading does not count */
  T_CHECK(gcap_tensor_version(a) == v0 + 3);
  gcap_tensor_free(z), z = NULL;
  /* a saved non-leaf changed in place, then backward */
  T_CHECK_OK(e, gcap_tensor_set_requires_grad(a, 1));
  T_CHECK_OK(e, gcap_scale(a, 2.0, &h));
  T_CHECK_OK(e, gcap_mul(h, h, &y)); /* saves h */
  T_CHECK_OK(e, gcap_sum(y, &loss));
  T_CHECK_OK(e, gcap_fill_(h, 3.0));
  T_CHECK_ST(e, gcap_backward(loss, NULL, 0), GCAP_ESTATE);
  T_CHECK(t_msg_has(e, "modified by an inplace operation") && t_msg_has(e, "'mul'") &&
          t_msg_has(e, "version") && t_msg_has(e, "[2, 3]"));
  T_CHECK(gcap_tensor_grad(a) == NULL);
  gcap_tensor_free(h), gcap_tensor_free(y), gcap_tensor_free(loss), gcap_tensor_free(v);
  gcap_tensor_free(a);
  gcap_engine_free(e);
}

/* A leaf parameter changed by an optimizer step after its use was saved:
** a second backward (retain_graph) fails; the ordinary loop does not. */
static void test_optimizer_step_versions(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[2] = {2, 3};
  const float d[6] = {1, 2, 3, 4, 5, 6};
  gcap_module *m = NULL;
  gcap_optim *o = NULL;
  gcap_tensor *x = t_from(e, 2, s, d), *y = NULL, *loss = NULL, *w;
  T_REQUIRE(x != NULL);
  T_CHECK_OK(e, gcap_nn_linear(e, 3, 2, 1, 0, &m));
  w = gcap_module_parameter(m, 0, NULL, 0);
  T_CHECK_OK(e, gcap_optim_sgd(e, 1, &w, 0.1, 0, 0, &o));
  for (int it = 0; it < 3; it++) { /* forward, backward, step: no alarm */
    uint64_t before = gcap_tensor_version(w);
    T_CHECK_OK(e, gcap_module_call(m, 1, &x, &y));
    T_CHECK_OK(e, gcap_sum(y, &loss));
    T_CHECK_OK(e, gcap_backward(loss, NULL, 0));
    T_CHECK_OK(e, gcap_optim_step(o));
    T_CHECK(gcap_tensor_version(w) > before); /* the step wrote w in place */
    T_CHECK_OK(e, gcap_optim_zero_grad(o, 1));
    gcap_tensor_free(y), gcap_tensor_free(loss);
  }
  T_CHECK_OK(e, gcap_module_call(m, 1, &x, &y));
  T_CHECK_OK(e, gcap_sum(y, &loss));
  T_CHECK_OK(e, gcap_backward(loss, NULL, 1)); /* keeps what linear saved */
  T_CHECK_OK(e, gcap_optim_step(o));
  T_CHECK_ST(e, gcap_backward(loss, NULL, 0), GCAP_ESTATE);
  T_CHECK(t_msg_has(e, "inplace") && t_msg_has(e, "'linear'"));
  gcap_tensor_free(y), gcap_tensor_free(loss), gcap_tensor_free(x);
  gcap_optim_free(o);
  gcap_module_free(m);
  gcap_engine_free(e);
}

/* A graphed Linear trained with its optimizer: replays, copy-ins and steps
** bump versions, and no backward raises. */
static void test_graphed_training_no_false_alarm(void) {
  fixture f;
  gcap_optim *o = NULL;
  gcap_tensor *y = NULL, *loss = NULL, *p[2];
  T_SETUP(fx_open(&f), fx_close(&f));
  p[0] = gcap_module_parameter(f.m, 0, NULL, 0);
  p[1] = gcap_module_parameter(f.m, 1, NULL, 0);
  T_CHECK_OK(f.e, gcap_optim_adam(f.e, 2, p, 0.01, 0.9, 0.999, 1e-8, 0, &o));
  for (int it = 0; it < 4; it++) {
    gcap_tensor *xi = NULL;
    T_CHECK_OK(f.e, gcap_tensor_clone(f.x, &xi)); /* another address: a copy-in */
    T_CHECK_OK(f.e, gcap_graphed_call(f.G, 0, 1, it % 2 ? &xi : &f.x, &y));
    T_CHECK_OK(f.e, gcap_sum(y, &loss));
    T_CHECK_OK(f.e, gcap_backward(loss, NULL, 0));
    T_CHECK_OK(f.e, gcap_optim_step(o));
    T_CHECK_OK(f.e, gcap_optim_zero_grad(o, 0));
    gcap_tensor_free(y), gcap_tensor_free(loss), gcap_tensor_free(xi);
  }
  gcap_optim_free(o);
  fx_close(&f);
}

/* A forward that fails without setting a message (a status only). */
static gcap_status silent_forward(void *ud, gcap_module *m, int nin, gcap_tensor *const *in,
                                  gcap_tensor **out) {
  (void)ud, (void)m, (void)nin, (void)in, (void)out;
  return GCAP_EINVAL;
}
static gcap_status silent_forward_n(void *ud, gcap_module *m, int nin, gcap_tensor *const *in,
                                    int *nout, gcap_tensor **out) {
  (void)ud, (void)m, (void)nin, (void)in, (void)nout, (void)out;
  return GCAP_ESTATE;
}

/* A module whose forward fails with a status and no message: the call's
** error names the module and the status (it was empty), with one output and
** with several; the module is usable afterwards. */
static void test_silent_forward_failure_is_named(void) {
  const int64_t s[1] = {2};
  const float d[2] = {1, 2};
  gcap_engine *e = t_engine();
  gcap_module *one = NULL, *many = NULL;
  gcap_tensor *x = NULL, *y = NULL, *ys[4] = {NULL};
  int n = -1;
  T_SETUP(e != NULL && (x = t_from(e, 1, s, d)) != NULL &&
              gcap_module_new(e, "Quiet", silent_forward, NULL, NULL, &one) == GCAP_OK &&
              gcap_module_new_n(e, "QuietN", silent_forward_n, NULL, NULL, &many) == GCAP_OK,
          goto out);
  T_CHECK_ST(e, gcap_module_call(one, 1, &x, &y), GCAP_EINVAL);
  T_CHECK(y == NULL && t_msg_has(e, "Quiet: forward failed (invalid argument)"));
  T_CHECK_ST(e, gcap_module_call_n(many, 1, &x, 4, &n, ys), GCAP_ESTATE);
  T_CHECK(n == 0 && ys[0] == NULL && t_msg_has(e, "QuietN: forward failed (wrong state)"));
  T_CHECK_ST(e, gcap_module_call_n(many, 1, &x, 4, &n, ys), GCAP_ESTATE);
  T_CHECK(t_msg_has(e, "QuietN: forward failed"));
out:
  gcap_module_free(one);
  gcap_module_free(many);
  gcap_tensor_free(x);
  gcap_engine_free(e);
}

static gcap_status never_backward(void *ud, int nsaved, gcap_tensor *const *saved, gcap_tensor *g,
                                  int nin, gcap_tensor **gin) {
  (void)ud, (void)nsaved, (void)saved, (void)g, (void)nin, (void)gin;
  return GCAP_ESTATE;
}

/* A custom node's name that does not fit its grad_fn (64 bytes) is refused;
** it was cut to 63 bytes. */
static void test_custom_node_name_fits(void) {
  const int64_t s[1] = {2};
  const float d[2] = {1, 2};
  char name[65];
  gcap_engine *e = t_engine();
  gcap_tensor *x = NULL, *y = NULL;
  T_SETUP(e != NULL && (x = t_from(e, 1, s, d)) != NULL &&
              gcap_tensor_set_requires_grad(x, 1) == GCAP_OK,
          goto out);
  memset(name, 'n', 64);
  name[64] = '\0';
  T_CHECK_ST(e, gcap_autograd_record(name, x, 1, &x, 0, NULL, never_backward, NULL, NULL, &y),
             GCAP_EINVAL);
  T_CHECK(y == NULL && t_msg_has(e, "name must be 1 to 63 bytes, got 64"));
  name[63] = '\0';
  T_CHECK_OK(e, gcap_autograd_record(name, x, 1, &x, 0, NULL, never_backward, NULL, NULL, &y));
  T_CHECK(strcmp(gcap_tensor_grad_fn_name(y), name) == 0);
out:
  gcap_tensor_free(y);
  gcap_tensor_free(x);
  gcap_engine_free(e);
}

/* An sdpa scale that is NaN, negative or beyond a float ran from C (the
** Lua binding alone checked it): every output NaN or inf, silently. */
static void test_sdpa_scale_checked(void) {
  const int64_t s[3] = {1, 2, 3};
  const float d[6] = {1, 2, 3, 4, 5, 6};
  const double bad[3] = {NAN, -0.5, 1e300};
  gcap_engine *e = t_engine();
  gcap_tensor *q = NULL, *y = NULL;
  int i;
  T_SETUP(e != NULL && (q = t_from(e, 3, s, d)) != NULL, goto out);
  for (i = 0; i < 3; i++) {
    gcap_sdpa_opts o = {.scale = bad[i]};
    T_CHECK_ST(e, gcap_scaled_dot_product_attention(q, q, q, &o, &y), GCAP_EINVAL);
    T_CHECK(y == NULL && t_msg_has(e, "scaled_dot_product_attention: the scale must be positive"));
    o.impl = GCAP_SDPA_FUSED;
    T_CHECK_ST(e, gcap_scaled_dot_product_attention(q, q, q, &o, &y), GCAP_EINVAL);
  }
  T_CHECK_ST(e, gcap_softmax_masked(q, 1e300, NULL, GCAP_MASK_ADD, 0, &y), GCAP_EINVAL);
  T_CHECK(y == NULL && t_msg_has(e, "softmax: the scale must be finite as a float, got 1e+300"));
  {
    gcap_sdpa_opts o = {.scale = 0.5};
    T_CHECK_OK(e, gcap_scaled_dot_product_attention(q, q, q, &o, &y));
  }
out:
  gcap_tensor_free(y);
  gcap_tensor_free(q);
  gcap_engine_free(e);
}

static const struct {
  const char *name;
  void (*fn)(void);
} tests[] = {
#define T_ENTRY(fn)                                                                                \
  { #fn, fn }
    T_ENTRY(test_graphed_call_null_inputs),
    T_ENTRY(test_graphed_eager_fallback_messages),
    T_ENTRY(test_graphed_call_checks_shape),
    T_ENTRY(test_capture_op_error_keeps_reason),
    T_ENTRY(test_closed_engine_refuses_constructors),
    T_ENTRY(test_many_tensor_arguments),
    T_ENTRY(test_graph_freed_during_its_capture),
    T_ENTRY(test_graph_registry_stays_small),
    T_ENTRY(test_cross_entropy_checks_targets),
    T_ENTRY(test_inplace_after_save_is_detected),
    T_ENTRY(test_optimizer_step_versions),
    T_ENTRY(test_graphed_training_no_false_alarm),
    T_ENTRY(test_silent_forward_failure_is_named),
    T_ENTRY(test_custom_node_name_fits),
    T_ENTRY(test_sdpa_scale_checked),
};

int main(int argc, char **argv) {
  for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++)
    if (argc < 2 || strstr(tests[i].name, argv[1])) t_run_(tests[i].name, tests[i].fn);
  return t_done();
}
