/*
** test_errors.c: what capture forbids (docs/semantics.md, "Capture rules"),
** each giving GCAP_ECAPTURE, invalidating the capture (sticky until
** gcap_capture_end, which then fails and leaves the graph empty) and leaving
** the engine usable; wrong states; bad arguments; objects of two engines.
** Nothing here may crash.
*/
#include <stdint.h>

#include "t.h"

/* A non-NULL `out` value: a failed call must set *out to NULL. */
#define BOGUS ((gcap_tensor *)(uintptr_t)0x10)
/* Check that p came back NULL, and arm it again. */
#define T_NULLED(p)                                                                                \
  do {                                                                                             \
    T_CHECK((p) == NULL);                                                                          \
    (p) = BOGUS;                                                                                   \
  } while (0)

/* ------------------------------------------------------------------------ */
/* Forbidden during capture                                                  */

typedef struct fctx {
  gcap_engine *e;
  gcap_tensor *x;  /* eager input */
  gcap_tensor *y;  /* made inside the capture */
  gcap_stream *s2; /* a stream not forked into the capture */
  gcap_stream *cs; /* the capture stream */
  gcap_event *ev;  /* recorded on the default stream before the capture */
} fctx;

static gcap_status act_synchronize(fctx *c) {
  return gcap_synchronize(c->e);
}
static gcap_status act_stream_sync(fctx *c) {
  return gcap_stream_synchronize(c->cs);
}
static gcap_status act_other_stream_sync(fctx *c) {
  return gcap_stream_synchronize(c->s2);
}
static gcap_status act_event_sync(fctx *c) {
  return gcap_event_synchronize(c->ev);
}
static gcap_status act_read_input(fctx *c) {
  float v[4];
  return gcap_tensor_read(c->x, v, 4);
}
static gcap_status act_read_captured(fctx *c) {
  float v[4];
  return gcap_tensor_read(c->y, v, 4);
}
static gcap_status act_from_f32(fctx *c) {
  const int64_t s[1] = {2};
  const float d[2] = {1, 2};
  gcap_tensor *t = BOGUS;
  gcap_status st = gcap_tensor_from_f32(c->e, GCAP_F32, 1, s, d, &t);
  T_CHECK(st == GCAP_OK || t == NULL); /* a failed call clears out */
  if (st == GCAP_OK) gcap_tensor_free(t);
  return st;
}
static gcap_status act_unforked_stream_work(fctx *c) {
  T_CHECK_ST(c->e, gcap_set_current_stream(c->e, c->s2), GCAP_OK); /* switching is allowed */
  return gcap_fill_(c->x, 9.0);                                    /* the caller switches back */
}
static gcap_status act_alloc_outside_pool(fctx *c) {
  const int64_t s[1] = {16};
  gcap_tensor *t = NULL;
  T_CHECK_ST(c->e, gcap_set_current_stream(c->e, NULL), GCAP_OK); /* the default stream */
  gcap_status st = gcap_tensor_empty(c->e, GCAP_F32, 1, s, &t);
  gcap_tensor_free(t);
  return st; /* the caller switches back */
}
static gcap_status act_manual_seed(fctx *c) {
  return gcap_manual_seed(c->e, 5);
}
static gcap_status act_wait_uncaptured_event(fctx *c) {
  return gcap_stream_wait_event(c->cs, c->ev); /* would depend on uncaptured work */
}

/* Begin a capture, do one legal op, then `act`: it must be refused with
** GCAP_ECAPTURE, later work in the capture too, and gcap_capture_end must end
** the capture with GCAP_ECAPTURE and an empty graph. Then eager work and a new
** capture of the same graph into the same pool succeed. */
static void forbidden_case(gcap_status (*act)(fctx *)) {
  fctx c = {0};
  c.e = t_engine();
  T_REQUIRE(c.e != NULL);
  gcap_engine *e = c.e;
  const int64_t s[1] = {4};
  const float dx[4] = {1, 2, 3, 4};
  float r[4];
  gcap_tensor *y2 = NULL, *z = NULL, *y3 = NULL;
  gcap_graph *g = NULL;
  gcap_pool *p = NULL;
  gcap_mem_stats ps;
  c.x = t_from(e, 1, s, dx);
  T_REQUIRE(c.x != NULL);
  T_CHECK_OK(e, gcap_stream_new(e, &c.s2));
  T_CHECK_OK(e, gcap_event_new(e, &c.ev));
  T_CHECK_OK(e, gcap_event_record(c.ev, gcap_default_stream(e)));
  T_CHECK_OK(e, gcap_pool_new(e, &p));
  T_CHECK_OK(e, gcap_graph_new(e, &g));
  T_CHECK_OK(e, gcap_capture_begin(g, p, NULL));
  c.cs = gcap_current_stream(e);
  T_CHECK_OK(e, gcap_scale(c.x, 2.0, &c.y));

  T_CHECK_ST(e, act(&c), GCAP_ECAPTURE);
  T_CHECK(strlen(gcap_errmsg(e)) > 0);
  printf("#   refused: %s\n", gcap_errmsg(e));
  T_CHECK(gcap_is_capturing(e) == 1);                      /* open until gcap_capture_end */
  gcap_set_current_stream(e, c.cs);                        /* some actions switched streams */
  T_CHECK_ST(e, gcap_scale(c.x, 3.0, &y2), GCAP_ECAPTURE); /* invalidation is sticky */
  T_CHECK(y2 == NULL);
  T_CHECK_ST(e, gcap_capture_end(g), GCAP_ECAPTURE);
  T_CHECK(gcap_is_capturing(e) == 0 && gcap_graph_is_captured(g) == 0);
  gcap_stream *cur = gcap_current_stream(e);
  T_CHECK(cur == gcap_default_stream(e) || cur == NULL);
  T_CHECK_ST(e, gcap_graph_replay(g), GCAP_ESTATE);
  T_CHECK_OK(e, gcap_pool_get_stats(p, &ps));
  T_CHECK(ps.graphs == 0);
  gcap_tensor_free(c.y), c.y = NULL;

  /* Eager work, including everything capture forbids, works again. */
  T_CHECK_OK(e, gcap_add(c.x, c.x, &z));
  if (t_read(z, r, 4)) T_CHECK(r[0] == 2 && r[3] == 8);
  T_CHECK_OK(e, gcap_synchronize(e));
  T_CHECK_OK(e, gcap_stream_synchronize(c.s2));
  T_CHECK_OK(e, gcap_event_synchronize(c.ev));
  T_CHECK_OK(e, gcap_manual_seed(e, 1));
  gcap_tensor_free(z), z = NULL;
  z = t_from(e, 1, s, dx);
  T_CHECK(z != NULL);

  /* And so does a new capture of the same graph into the same pool. */
  T_CHECK_OK(e, gcap_capture_begin(g, p, NULL));
  T_CHECK_OK(e, gcap_scale(c.x, 5.0, &y3));
  T_CHECK_OK(e, gcap_capture_end(g));
  T_CHECK_OK(e, gcap_graph_replay(g));
  if (t_read(y3, r, 4)) T_CHECK(r[0] == 5 && r[3] == 20);
  T_CHECK_OK(e, gcap_pool_get_stats(p, &ps));
  T_CHECK(ps.graphs == 1);
  gcap_tensor_free(c.x), gcap_tensor_free(z), gcap_tensor_free(y3);
  gcap_graph_free(g);
  gcap_pool_free(p);
  gcap_stream_free(c.s2);
  gcap_event_free(c.ev);
  gcap_engine_free(e);
}

static void test_forbidden_synchronize(void) {
  forbidden_case(act_synchronize);
}
static void test_forbidden_stream_synchronize(void) {
  forbidden_case(act_stream_sync);
}
static void test_forbidden_other_stream_synchronize(void) {
  forbidden_case(act_other_stream_sync);
}
static void test_forbidden_event_synchronize(void) {
  forbidden_case(act_event_sync);
}
static void test_forbidden_read_input(void) {
  forbidden_case(act_read_input);
}
static void test_forbidden_read_captured(void) {
  forbidden_case(act_read_captured);
}
static void test_forbidden_from_f32(void) {
  forbidden_case(act_from_f32);
}
static void test_forbidden_unforked_stream_work(void) {
  forbidden_case(act_unforked_stream_work);
}
static void test_forbidden_alloc_outside_pool(void) {
  forbidden_case(act_alloc_outside_pool);
}
static void test_forbidden_manual_seed(void) {
  forbidden_case(act_manual_seed);
}
static void test_forbidden_wait_uncaptured_event(void) {
  forbidden_case(act_wait_uncaptured_event);
}

/* ------------------------------------------------------------------------ */
/* Wrong states                                                              */

static void test_graph_states(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[1] = {4};
  gcap_tensor *x = NULL, *y = NULL, *y2 = NULL;
  gcap_graph *g1 = NULL, *g2 = NULL;
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 1, s, 1.0, &x));
  T_CHECK_OK(e, gcap_graph_new(e, &g1));
  T_CHECK_OK(e, gcap_graph_new(e, &g2));
  T_CHECK_ST(e, gcap_graph_replay(g1), GCAP_ESTATE); /* never captured */
  T_CHECK(strlen(gcap_errmsg(e)) > 0);
  T_CHECK_ST(e, gcap_capture_end(g1), GCAP_ESTATE); /* not capturing */
  T_CHECK_OK(e, gcap_capture_begin(g1, NULL, NULL));
  T_CHECK_ST(e, gcap_capture_begin(g2, NULL, NULL), GCAP_ESTATE); /* one at a time */
  T_CHECK_ST(e, gcap_capture_begin(g1, NULL, NULL), GCAP_ESTATE);
  T_CHECK_ST(e, gcap_capture_end(g2), GCAP_ESTATE); /* g2 is not the one capturing */
  T_CHECK(gcap_is_capturing(e) == 1);
  T_CHECK_OK(e, gcap_scale(x, 2.0, &y)); /* the open capture goes on */
  T_CHECK_OK(e, gcap_capture_end(g1));
  T_CHECK_OK(e, gcap_graph_replay(g1));
  T_CHECK(t_value(y) == 2.0);
  T_CHECK_ST(e, gcap_capture_begin(g1, NULL, NULL), GCAP_ESTATE); /* not empty */
  T_CHECK(gcap_is_capturing(e) == 0);
  T_CHECK_OK(e, gcap_graph_replay(g1)); /* still fine */
  T_CHECK_OK(e, gcap_graph_reset(g1));
  T_CHECK_ST(e, gcap_graph_replay(g1), GCAP_ESTATE); /* reset */
  T_CHECK_OK(e, gcap_capture_begin(g2, NULL, NULL)); /* g2 was never disturbed */
  T_CHECK_OK(e, gcap_scale(x, 3.0, &y2));
  T_CHECK_OK(e, gcap_capture_end(g2));
  T_CHECK_OK(e, gcap_graph_replay(g2));
  T_CHECK(t_value(y2) == 3.0);
  gcap_tensor_free(x), gcap_tensor_free(y), gcap_tensor_free(y2);
  gcap_graph_free(g1), gcap_graph_free(g2);
  gcap_engine_free(e);
}

/* A bad argument inside a capture is refused before anything is recorded
** (GCAP_EINVAL, not GCAP_ECAPTURE): the capture is not invalidated. */
static void test_bad_op_inside_capture(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s23[2] = {2, 3}, s32[2] = {3, 2};
  gcap_tensor *a = NULL, *b = NULL, *o = NULL, *y = NULL;
  gcap_graph *g = NULL;
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 2, s23, 1.0, &a));
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 2, s32, 1.0, &b));
  T_CHECK_OK(e, gcap_graph_new(e, &g));
  T_CHECK_OK(e, gcap_capture_begin(g, NULL, NULL));
  T_CHECK_ST(e, gcap_add(a, b, &o), GCAP_EINVAL);
  T_CHECK(o == NULL);
  T_CHECK_OK(e, gcap_scale(a, 4.0, &y));
  T_CHECK_OK(e, gcap_capture_end(g));
  T_CHECK_OK(e, gcap_graph_replay(g));
  T_CHECK(y && gcap_tensor_numel(y) == 6);
  float r[6];
  if (t_read(y, r, 6)) T_CHECK(r[0] == 4 && r[5] == 4);
  gcap_tensor_free(a), gcap_tensor_free(b), gcap_tensor_free(y);
  gcap_graph_free(g);
  gcap_engine_free(e);
}

static void test_engine_closed_with_live_objects(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[1] = {6};
  gcap_tensor *t = NULL, *y = NULL, *o = NULL;
  gcap_graph *g = NULL;
  gcap_pool *p = NULL;
  gcap_stream *st = NULL;
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 1, s, 1.0, &t));
  T_CHECK_OK(e, gcap_pool_new(e, &p));
  T_CHECK_OK(e, gcap_stream_new(e, &st));
  T_CHECK_OK(e, gcap_graph_new(e, &g));
  T_CHECK_OK(e, gcap_capture_begin(g, p, NULL));
  T_CHECK_OK(e, gcap_scale(t, 2.0, &y));
  T_CHECK_OK(e, gcap_capture_end(g));
  gcap_engine_free(e); /* closed: lives on until its last object goes */
  T_CHECK(gcap_tensor_numel(t) == 6 && gcap_tensor_engine(t) == e);
  T_CHECK(gcap_add(t, t, &o) == GCAP_ESTATE && o == NULL); /* no new work */
  T_CHECK(gcap_graph_replay(g) == GCAP_ESTATE);
  gcap_tensor_free(t), gcap_tensor_free(y), gcap_tensor_free(o);
  gcap_graph_free(g);
  gcap_stream_free(st);
  gcap_pool_free(p); /* the last object: the engine goes now */
}

static gcap_status id_forward(void *ud, gcap_module *m, int nin, gcap_tensor *const *in,
                              gcap_tensor **out) {
  (void)ud, (void)m, (void)nin;
  return gcap_scale(in[0], 1.0, out);
}

/* regression: graphs, pools, modules, ... were still made on a closed engine */
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

/* ------------------------------------------------------------------------ */
/* Bad arguments                                                             */

static void test_bad_shapes(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t neg[2] = {2, -1}, five[5] = {1, 1, 1, 1, 1}, ok[2] = {2, 3};
  const int64_t ovf[2] = {INT64_C(1) << 62, INT64_C(1) << 62},
                ovf3[3] = {1 << 30, 1 << 30, 1 << 30};
  const int64_t huge[1] = {INT64_MAX};
  float d[6] = {0};
  gcap_tensor *t = BOGUS, *x = NULL;
  T_CHECK_ST(e, gcap_tensor_empty(e, GCAP_F32, 2, neg, &t), GCAP_EINVAL);
  T_NULLED(t);
  T_CHECK(strlen(gcap_errmsg(e)) > 0);
  T_CHECK_ST(e, gcap_tensor_full(e, GCAP_F32, 5, five, 1.0, &t), GCAP_EINVAL);
  T_NULLED(t);
  T_CHECK_ST(e, gcap_tensor_empty(e, GCAP_F32, -1, ok, &t), GCAP_EINVAL);
  T_NULLED(t);
  T_CHECK_ST(e, gcap_tensor_empty(e, GCAP_F32, 2, NULL, &t), GCAP_EINVAL);
  T_NULLED(t);
  T_CHECK_ST(e, gcap_tensor_empty(e, GCAP_F32, 2, ovf, &t), GCAP_EINVAL); /* numel overflows */
  T_NULLED(t);
  T_CHECK_ST(e, gcap_tensor_full(e, GCAP_F32, 3, ovf3, 0.0, &t), GCAP_EINVAL);
  T_NULLED(t);
  gcap_status st = gcap_tensor_empty(e, GCAP_F32, 1, huge, &t); /* bytes overflow */
  T_CHECK(st == GCAP_EINVAL || st == GCAP_ENOMEM);
  T_NULLED(t);
  T_CHECK_ST(e, gcap_tensor_rand(e, GCAP_F32, 2, neg, 0, &t), GCAP_EINVAL);
  T_NULLED(t);
  T_CHECK_ST(e, gcap_tensor_from_f32(e, GCAP_F32, 5, five, d, &t), GCAP_EINVAL);
  T_NULLED(t);
  T_CHECK_ST(e, gcap_tensor_from_f32(e, GCAP_F32, 2, ok, NULL, &t), GCAP_EINVAL);
  T_NULLED(t);
  T_CHECK_ST(e, gcap_tensor_empty(e, (gcap_dtype)77, 2, ok, &t), GCAP_EINVAL);
  T_NULLED(t);
  T_CHECK_ST(e, gcap_tensor_empty(e, GCAP_F32, 2, ok, NULL), GCAP_EINVAL);
  T_CHECK_ST(e, gcap_tensor_empty(NULL, GCAP_F32, 2, ok, &t), GCAP_EINVAL);
  T_NULLED(t);
  /* Views: numel must match, shapes follow the same rules. */
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 2, ok, 1.0, &x));
  const int64_t v5[1] = {5}, vneg[2] = {-2, -3}, v6[5] = {1, 1, 1, 1, 6};
  T_CHECK_ST(e, gcap_tensor_view(x, 1, v5, &t), GCAP_EINVAL);
  T_NULLED(t);
  T_CHECK_ST(e, gcap_tensor_view(x, 2, vneg, &t), GCAP_EINVAL); /* numel 6, but negative */
  T_NULLED(t);
  T_CHECK_ST(e, gcap_tensor_view(x, 5, v6, &t), GCAP_EINVAL);
  T_NULLED(t);
  T_CHECK_ST(e, gcap_tensor_view(x, 0, v6, &t), GCAP_EINVAL); /* 0-D has one element */
  T_CHECK(t == NULL);
  /* The engine is fine afterwards. */
  float r[6];
  if (t_read(x, r, 6)) T_CHECK(r[0] == 1.0f && r[5] == 1.0f);
  gcap_tensor_free(x);
  gcap_engine_free(e);
}

static void test_shape_mismatch(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s23[2] = {2, 3}, s32[2] = {3, 2}, s2[1] = {2}, s6[1] = {6}, s231[3] = {2, 3, 1};
  const int64_t s5[1] = {5};
  gcap_tensor *a = NULL, *b = NULL, *r2 = NULL, *v6 = NULL, *c = NULL, *v5 = NULL, *o = BOGUS;
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 2, s23, 1.0, &a));
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 2, s32, 1.0, &b));
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 1, s2, 1.0, &r2));
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 1, s6, 1.0, &v6));
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 3, s231, 1.0, &c));
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 1, s5, 1.0, &v5));
  T_CHECK_ST(e, gcap_add(a, b, &o), GCAP_EINVAL); /* same numel, other shape */
  T_NULLED(o);
  T_CHECK(strlen(gcap_errmsg(e)) > 0);
  T_CHECK_ST(e, gcap_sub(a, r2, &o), GCAP_EINVAL); /* a row of the wrong length */
  T_NULLED(o);
  T_CHECK_ST(e, gcap_mul(r2, a, &o), GCAP_EINVAL);
  T_NULLED(o);
  T_CHECK_ST(e, gcap_mul(a, v6, &o), GCAP_EINVAL); /* numel 6, but not a row of a */
  T_NULLED(o);
  T_CHECK_ST(e, gcap_add(v6, a, &o), GCAP_EINVAL);
  T_NULLED(o);
  T_CHECK_ST(e, gcap_add(a, c, &o), GCAP_EINVAL);
  T_NULLED(o);
  T_CHECK_ST(e, gcap_copy_(a, v5), GCAP_EINVAL); /* numel differs */
  T_CHECK_ST(e, gcap_add(a, NULL, &o), GCAP_EINVAL);
  T_NULLED(o);
  T_CHECK_ST(e, gcap_add(a, a, NULL), GCAP_EINVAL);
  T_CHECK_ST(e, gcap_sum(NULL, &o), GCAP_EINVAL);
  T_CHECK(o == NULL);
  o = NULL;
  /* Nothing was written: a still holds ones. */
  T_CHECK_OK(e, gcap_sum(a, &o));
  T_CHECK(t_value(o) == 6.0);
  gcap_tensor_free(a), gcap_tensor_free(b), gcap_tensor_free(r2), gcap_tensor_free(v6);
  gcap_tensor_free(c), gcap_tensor_free(v5), gcap_tensor_free(o);
  gcap_engine_free(e);
}

static void test_bad_calls(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[1] = {4};
  float r[5];
  gcap_tensor *x = NULL;
  gcap_graph *g = NULL;
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 1, s, 2.0, &x));
  T_CHECK_ST(e, gcap_tensor_read(x, r, 3), GCAP_EINVAL); /* n must be numel */
  T_CHECK_ST(e, gcap_tensor_read(x, r, 5), GCAP_EINVAL);
  T_CHECK_ST(e, gcap_tensor_read(x, NULL, 4), GCAP_EINVAL);
  T_CHECK_ST(e, gcap_tensor_read(NULL, r, 4), GCAP_EINVAL);
  T_CHECK_ST(e, gcap_fill_(NULL, 1.0), GCAP_EINVAL);
  T_CHECK_ST(e, gcap_graph_new(e, NULL), GCAP_EINVAL);
  T_CHECK_ST(e, gcap_graph_replay(NULL), GCAP_EINVAL);
  T_CHECK_ST(e, gcap_capture_begin(NULL, NULL, NULL), GCAP_EINVAL);
  T_CHECK_ST(e, gcap_pool_new(e, NULL), GCAP_EINVAL);
  T_CHECK_ST(e, gcap_engine_new(GCAP_DEVICE_HOST, NULL), GCAP_EINVAL);
  /* The last error's text; "" once a call succeeds. */
  T_CHECK_ST(e, gcap_graph_new(e, NULL), GCAP_EINVAL);
  T_CHECK(strlen(gcap_errmsg(e)) > 0);
  T_CHECK_OK(e, gcap_fill_(x, 3.0));
  T_CHECK(strcmp(gcap_errmsg(e), "") == 0);
  (void)gcap_errmsg(NULL); /* NULL-safe */
  for (int st = GCAP_OK; st <= GCAP_EABORTED; st++) {
    const char *txt = gcap_status_str((gcap_status)st);
    T_CHECK(txt != NULL && strlen(txt) > 0);
    if (st != GCAP_OK) T_CHECK(strcmp(txt, gcap_status_str(GCAP_OK)) != 0);
  }
  T_CHECK(gcap_status_str((gcap_status)1000) != NULL);
  /* Destructors take NULL; the engine's own streams are not freed. */
  gcap_tensor_free(NULL), gcap_graph_free(NULL), gcap_pool_free(NULL);
  gcap_stream_free(NULL), gcap_event_free(NULL), gcap_engine_free(NULL);
  gcap_stream_free(gcap_default_stream(e));
  gcap_stream_free(gcap_capture_stream(e));
  T_CHECK_OK(e, gcap_graph_new(e, &g));
  T_CHECK_OK(e, gcap_capture_begin(g, NULL, NULL));
  T_CHECK_OK(e, gcap_fill_(x, 4.0));
  T_CHECK_OK(e, gcap_capture_end(g));
  T_CHECK_OK(e, gcap_fill_(x, 0.0));
  T_CHECK_OK(e, gcap_graph_replay(g));
  T_CHECK_OK(e, gcap_synchronize(e));
  if (t_read(x, r, 4)) T_CHECK(r[0] == 4.0f && r[3] == 4.0f);
  gcap_tensor_free(x);
  gcap_graph_free(g);
  gcap_engine_free(e);
}

static void test_open_device(void) {
  gcap_engine *e = NULL;
  if (!gcap_cuda_available()) {
    e = (gcap_engine *)(uintptr_t)0x10;
    T_CHECK(gcap_engine_new(GCAP_DEVICE_CUDA, &e) == GCAP_EUNSUPPORTED);
    T_CHECK(e == NULL);
    T_CHECK(strlen(gcap_last_open_error()) > 0);
  } else {
    T_CHECK(gcap_engine_new(GCAP_DEVICE_CUDA, &e) == GCAP_OK);
    T_CHECK(e && strcmp(gcap_engine_device(e), "cuda") == 0);
    gcap_engine_free(e), e = NULL;
  }
  T_CHECK(gcap_engine_new((gcap_device)42, &e) != GCAP_OK && e == NULL);
  T_CHECK(strlen(gcap_last_open_error()) > 0);
  T_CHECK(gcap_engine_new(GCAP_DEVICE_HOST, &e) == GCAP_OK);
  T_CHECK(e && strcmp(gcap_engine_device(e), "host") == 0);
  T_CHECK(strcmp(gcap_last_open_error(), "") == 0);
  gcap_engine_free(e), e = NULL;
  T_CHECK(gcap_engine_new(GCAP_DEVICE_DEFAULT, &e) == GCAP_OK);
  T_CHECK(e && strcmp(gcap_engine_device(e), gcap_cuda_available() ? "cuda" : "host") == 0);
  gcap_engine_free(e);
}

/* Objects of one engine given to another: GCAP_EINVAL, never a crash. */
static void test_two_engines(void) {
  gcap_engine *e1 = t_engine(), *e2 = t_engine();
  T_REQUIRE(e1 && e2);
  const int64_t s[1] = {4};
  gcap_tensor *a = NULL, *b = NULL, *o = BOGUS, *y = NULL;
  gcap_pool *p2 = NULL;
  gcap_stream *s1 = NULL, *s2 = NULL;
  gcap_event *ev1 = NULL, *ev2 = NULL;
  gcap_graph *g1 = NULL;
  T_CHECK_OK(e1, gcap_tensor_full(e1, GCAP_F32, 1, s, 1.0, &a));
  T_CHECK_OK(e2, gcap_tensor_full(e2, GCAP_F32, 1, s, 2.0, &b));
  T_CHECK_OK(e2, gcap_pool_new(e2, &p2));
  T_CHECK_OK(e1, gcap_stream_new(e1, &s1));
  T_CHECK_OK(e2, gcap_stream_new(e2, &s2));
  T_CHECK_OK(e1, gcap_event_new(e1, &ev1));
  T_CHECK_OK(e2, gcap_event_new(e2, &ev2));
  T_CHECK_OK(e1, gcap_graph_new(e1, &g1));
  T_CHECK(gcap_tensor_engine(a) == e1 && gcap_tensor_engine(b) == e2);
  T_CHECK_ST(e1, gcap_add(a, b, &o), GCAP_EINVAL);
  T_NULLED(o);
  T_CHECK_ST(e2, gcap_mul(b, a, &o), GCAP_EINVAL);
  T_NULLED(o);
  T_CHECK_ST(e1, gcap_copy_(a, b), GCAP_EINVAL);
  T_CHECK_ST(e1, gcap_set_current_stream(e1, s2), GCAP_EINVAL);
  T_CHECK_ST(e1, gcap_event_record(ev1, s2), GCAP_EINVAL);
  T_CHECK_ST(e1, gcap_stream_wait_event(s1, ev2), GCAP_EINVAL);
  T_CHECK_ST(e1, gcap_capture_begin(g1, p2, NULL), GCAP_EINVAL);
  T_CHECK(gcap_is_capturing(e1) == 0);
  T_CHECK_ST(e1, gcap_capture_begin(g1, NULL, s2), GCAP_EINVAL);
  T_CHECK(gcap_is_capturing(e1) == 0 && gcap_is_capturing(e2) == 0);
  /* Both engines still work. */
  T_CHECK_OK(e1, gcap_capture_begin(g1, NULL, s1));
  T_CHECK_OK(e1, gcap_scale(a, 3.0, &y));
  T_CHECK_OK(e1, gcap_capture_end(g1));
  T_CHECK_OK(e1, gcap_graph_replay(g1));
  T_CHECK(t_value(y) == 3.0);
  T_CHECK_OK(e2, gcap_add(b, b, &o));
  T_CHECK(t_value(o) == 4.0);
  gcap_tensor_free(a), gcap_tensor_free(b), gcap_tensor_free(o), gcap_tensor_free(y);
  gcap_pool_free(p2);
  gcap_stream_free(s1), gcap_stream_free(s2);
  gcap_event_free(ev1), gcap_event_free(ev2);
  gcap_graph_free(g1);
  gcap_engine_free(e1), gcap_engine_free(e2);
}

/* regression: a target of 1.5 was class 1; NaN or bad ids gave finite grads */
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
  /* captured: a target turned 1.5 after capture gives NaN in its row only, and an error */
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
  /* the replay (on cuda the synchronization after it) names the target */
  {
    gcap_status rs = gcap_graph_replay(g);
    if (rs == GCAP_OK) rs = gcap_synchronize(e);
    T_CHECK(rs == GCAP_EINVAL && t_msg_has(e, "the target of row 2 (counting from 1) is 1.5") &&
            t_msg_has(e, "in a replay of graph 'graph #1'"));
  }
  T_CHECK(isnan(t_value(loss))); /* raised once: the read works */
  if (gcap_tensor_grad(logits) && t_read(gcap_tensor_grad(logits), r, 6))
    T_CHECK(!isnan(r[0]) && !isnan(r[2]) && isnan(r[3]) && isnan(r[5]));
  gcap_graph_free(g);
  gcap_tensor_free(logits), gcap_tensor_free(t), gcap_tensor_free(tg), gcap_tensor_free(loss);
  gcap_engine_free(e);
}

int main(void) {
  T_RUN(test_forbidden_synchronize);
  T_RUN(test_forbidden_stream_synchronize);
  T_RUN(test_forbidden_other_stream_synchronize);
  T_RUN(test_forbidden_event_synchronize);
  T_RUN(test_forbidden_read_input);
  T_RUN(test_forbidden_read_captured);
  T_RUN(test_forbidden_from_f32);
  T_RUN(test_forbidden_unforked_stream_work);
  T_RUN(test_forbidden_alloc_outside_pool);
  T_RUN(test_forbidden_manual_seed);
  T_RUN(test_forbidden_wait_uncaptured_event);
  T_RUN(test_graph_states);
  T_RUN(test_bad_op_inside_capture);
  T_RUN(test_engine_closed_with_live_objects);
  T_RUN(test_closed_engine_refuses_constructors);
  T_RUN(test_bad_shapes);
  T_RUN(test_shape_mismatch);
  T_RUN(test_bad_calls);
  T_RUN(test_open_device);
  T_RUN(test_two_engines);
  T_RUN(test_cross_entropy_checks_targets);
  return t_done();
}
