/*
** test_capture.c: capture and replay of one graph at a time (docs/semantics.md;
** graphcap.h "Pools and graphs", "Capture and the replay check"): replay
** equals eager bitwise, capture records and does not run, pointers and
** scalars are baked at capture while replay reads the current contents of
** its inputs, streams (capture stream, user streams, fork/join), random
** numbers in graphs, stats, names, reset.
*/
#include "t.h"

/* A deterministic, not-too-regular input. */
static void fill_input(float *d, int n, float phase) {
  for (int i = 0; i < n; i++)
    d[i] = sinf(0.37f * (float)i + phase) * 1.5f + 0.25f;
}

/* Replace *y by op(*y) and drop the old reference. */
#define STEP(call, y, tmp)                                                                         \
  do {                                                                                             \
    gcap_status st_ = (call);                                                                      \
    if (st_ != GCAP_OK) return st_;                                                                \
    gcap_tensor_free(y);                                                                           \
    (y) = (tmp);                                                                                   \
  } while (0)

/* A few ops of every kind, temporaries freed as they go (during a capture they
** go back to the pool at once and are reused by the later ops). */
static gcap_status chain(gcap_tensor *x, gcap_tensor **out) {
  gcap_tensor *y = gcap_tensor_retain(x), *t = NULL, *m = NULL;
  gcap_status st;
  STEP(gcap_mul(y, x, &t), y, t); /* x*x */
  STEP(gcap_add(y, x, &t), y, t); /* + x */
  STEP(gcap_scale(y, 0.37, &t), y, t);
  STEP(gcap_sub(y, x, &t), y, t);
  if ((st = gcap_mean(y, &m)) != GCAP_OK) return st;
  STEP(gcap_sub(y, m, &t), y, t); /* centre: 0-D broadcast */
  gcap_tensor_free(m);
  if ((st = gcap_sum(x, &m)) != GCAP_OK) return st;
  STEP(gcap_mul(y, m, &t), y, t);
  gcap_tensor_free(m);
  STEP(gcap_neg(y, &t), y, t);
  *out = y;
  return GCAP_OK;
}

static void test_replay_equals_eager_bitwise(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  enum { N = 512 };
  static float d[N], d2[N], eager[N], replay[N];
  const int64_t s[2] = {16, 32};
  fill_input(d, N, 0.0f), fill_input(d2, N, 1.0f);
  gcap_tensor *x = t_from(e, 2, s, d), *x2 = t_from(e, 2, s, d2), *ye = NULL, *yg = NULL;
  gcap_graph *g = NULL;
  T_REQUIRE(x && x2);
  T_CHECK_OK(e, chain(x, &ye));
  T_REQUIRE(t_read(ye, eager, N));
  gcap_tensor_free(ye), ye = NULL;

  T_CHECK_OK(e, gcap_graph_new(e, &g));
  T_CHECK_OK(e, gcap_capture_begin(g, NULL, NULL));
  T_CHECK_OK(e, chain(x, &yg));
  T_CHECK_OK(e, gcap_capture_end(g));
  for (int k = 0; k < 2; k++) { /* replaying twice changes nothing */
    T_CHECK_OK(e, gcap_graph_replay(g));
    if (t_read(yg, replay, N)) T_CHECK(memcmp(eager, replay, sizeof eager) == 0);
  }
  /* New input contents: eager and replay still agree bit for bit. */
  T_CHECK_OK(e, gcap_copy_(x, x2));
  T_CHECK_OK(e, chain(x, &ye));
  T_REQUIRE(t_read(ye, eager, N));
  T_CHECK_OK(e, gcap_graph_replay(g));
  if (t_read(yg, replay, N)) T_CHECK(memcmp(eager, replay, sizeof eager) == 0);
  T_CHECK(eager[0] != 0.0f || eager[1] != 0.0f); /* not trivially zero */
  gcap_tensor_free(x), gcap_tensor_free(x2), gcap_tensor_free(ye), gcap_tensor_free(yg);
  gcap_graph_free(g);
  gcap_engine_free(e);
}

/* 1,000 small ops (a little more than 1,000 nodes) of every kind. */
static gcap_status thousand_ops(gcap_tensor *x, gcap_tensor **out) {
  gcap_tensor *y = gcap_tensor_retain(x), *t = NULL, *m = NULL;
  gcap_status st;
  for (int i = 0; i < 1000; i++) {
    switch (i % 5) {
      case 0:
        STEP(gcap_add(y, x, &t), y, t);
        break;
      case 1:
        STEP(gcap_scale(y, 0.5, &t), y, t);
        break;
      case 2:
        STEP(gcap_mul(y, x, &t), y, t);
        break;
      case 3:
        STEP(gcap_neg(y, &t), y, t);
        break;
      default:
        if (i % 50 != 4) {
          STEP(gcap_sub(y, x, &t), y, t);
          break;
        }
        if ((st = gcap_mean(y, &m)) != GCAP_OK) return st;
        STEP(gcap_sub(y, m, &t), y, t);
        gcap_tensor_free(m);
    }
  }
  *out = y;
  return GCAP_OK;
}

static void test_thousand_ops_bitwise(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  enum { N = 64 };
  float d[N], eager[N], replay[N];
  const int64_t s[1] = {N};
  for (int i = 0; i < N; i++)
    d[i] = 0.9f + 0.2f * (float)((i * 37) % N) / N;
  gcap_tensor *x = t_from(e, 1, s, d), *ye = NULL, *yg = NULL;
  gcap_graph *g = NULL;
  gcap_graph_stats gs;
  T_REQUIRE(x != NULL);
  T_CHECK_OK(e, thousand_ops(x, &ye));
  T_REQUIRE(t_read(ye, eager, N));
  T_CHECK_OK(e, gcap_graph_new(e, &g));
  T_CHECK_OK(e, gcap_capture_begin(g, NULL, NULL));
  T_CHECK_OK(e, thousand_ops(x, &yg));
  T_CHECK_OK(e, gcap_capture_end(g));
  T_CHECK_OK(e, gcap_graph_replay(g));
  if (t_read(yg, replay, N)) T_CHECK(memcmp(eager, replay, sizeof eager) == 0);
  int finite = 1;
  for (int i = 0; i < N; i++)
    finite &= isfinite(eager[i]) != 0;
  T_CHECK(finite);
  T_CHECK_OK(e, gcap_graph_get_stats(g, &gs));
  T_CHECK(gs.nodes >= 1000);
  printf("# 1000-op graph: %lld nodes, capture %.3f ms, instantiate %.3f ms\n", (long long)gs.nodes,
         gs.capture_ms, gs.instantiate_ms);
  gcap_tensor_free(x), gcap_tensor_free(ye), gcap_tensor_free(yg);
  gcap_graph_free(g);
  gcap_engine_free(e);
}

/* Capture records work and does not run it; replay runs it, rewriting the
** static outputs and reading the inputs' contents as they are at replay. */
static void test_static_outputs_and_current_inputs(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[1] = {4};
  const float dx[4] = {1, 2, 3, 4}, dsrc[4] = {-1, 0, 1, 2};
  float r[4];
  gcap_tensor *x = t_from(e, 1, s, dx), *src = t_from(e, 1, s, dsrc), *z = NULL, *u = NULL,
              *y = NULL;
  gcap_graph *g = NULL;
  T_REQUIRE(x && src);
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 1, s, 1.0, &z));
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 1, s, 0.0, &u)); /* never read by g */
  T_CHECK_OK(e, gcap_graph_new(e, &g));
  T_CHECK_OK(e, gcap_capture_begin(g, NULL, NULL));
  T_CHECK_OK(e, gcap_fill_(z, 5.0));     /* writes an eager tensor */
  T_CHECK_OK(e, gcap_scale(x, 2.0, &y)); /* static output */
  T_CHECK_OK(e, gcap_capture_end(g));
  if (t_read(z, r, 4)) T_CHECK(r[0] == 1.0f && r[3] == 1.0f); /* not run at capture */
  T_CHECK_OK(e, gcap_graph_replay(g));
  if (t_read(z, r, 4)) T_CHECK(r[0] == 5.0f && r[3] == 5.0f);
  if (t_read(y, r, 4)) T_CHECK(r[0] == 2 && r[1] == 4 && r[2] == 6 && r[3] == 8);
  T_CHECK_OK(e, gcap_fill_(x, 3.0)); /* new contents, same memory */
  T_CHECK_OK(e, gcap_graph_replay(g));
  if (t_read(y, r, 4)) T_CHECK(r[0] == 6 && r[3] == 6);
  T_CHECK_OK(e, gcap_copy_(x, src));
  T_CHECK_OK(e, gcap_graph_replay(g));
  if (t_read(y, r, 4)) T_CHECK(r[0] == -2 && r[1] == 0 && r[2] == 2 && r[3] == 4);
  T_CHECK_OK(e, gcap_zero_(y));        /* an eager write to the output ... */
  T_CHECK_OK(e, gcap_fill_(u, 100.0)); /* ... and to a tensor g never reads */
  T_CHECK_OK(e, gcap_graph_replay(g));
  if (t_read(y, r, 4)) T_CHECK(r[0] == -2 && r[1] == 0 && r[2] == 2 && r[3] == 4);
  gcap_tensor_free(x), gcap_tensor_free(src), gcap_tensor_free(z), gcap_tensor_free(u);
  gcap_tensor_free(y);
  gcap_graph_free(g);
  gcap_engine_free(e);
}

/* "Late binding hides bugs": what a graph uses is fixed at capture. */
static void test_pointers_and_scalars_baked(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[1] = {4}, s22[2] = {2, 2};
  const float dx[4] = {1, 2, 3, 4};
  float r[4];
  gcap_tensor *x = t_from(e, 1, s, dx), *v = NULL, *y1 = NULL, *y2 = NULL, *y3 = NULL, *y4 = NULL,
              *yv = NULL;
  gcap_graph *g1 = NULL, *g2 = NULL, *g3 = NULL, *g4 = NULL;
  T_REQUIRE(x != NULL);
  T_CHECK_OK(e, gcap_graph_new(e, &g1));
  T_CHECK_OK(e, gcap_graph_new(e, &g2));
  T_CHECK_OK(e, gcap_graph_new(e, &g3));
  T_CHECK_OK(e, gcap_graph_new(e, &g4));
  double scalar = 3.0;
  T_CHECK_OK(e, gcap_capture_begin(g1, NULL, NULL));
  T_CHECK_OK(e, gcap_scale(x, scalar, &y1));
  T_CHECK_OK(e, gcap_capture_end(g1));
  scalar = 4.0; /* a second graph with another value: each keeps its own */
  T_CHECK_OK(e, gcap_capture_begin(g2, NULL, NULL));
  T_CHECK_OK(e, gcap_scale(x, scalar, &y2));
  T_CHECK_OK(e, gcap_capture_end(g2));
  /* g3 reads x through a view handle that is freed after capture. */
  T_CHECK_OK(e, gcap_tensor_view(x, 2, s22, &v));
  T_CHECK_OK(e, gcap_capture_begin(g3, NULL, NULL));
  T_CHECK_OK(e, gcap_add(v, v, &y3));
  T_CHECK_OK(e, gcap_capture_end(g3));
  gcap_tensor_free(v);
  /* g4's output is read through a view made after capture; its handle freed. */
  T_CHECK_OK(e, gcap_capture_begin(g4, NULL, NULL));
  T_CHECK_OK(e, gcap_neg(x, &y4));
  T_CHECK_OK(e, gcap_capture_end(g4));
  T_CHECK_OK(e, gcap_tensor_view(y4, 2, s22, &yv));
  gcap_tensor_free(y4);

  T_CHECK_OK(e, gcap_graph_replay(g1));
  T_CHECK_OK(e, gcap_graph_replay(g2));
  if (t_read(y1, r, 4)) T_CHECK(r[0] == 3 && r[3] == 12);
  if (t_read(y2, r, 4)) T_CHECK(r[0] == 4 && r[3] == 16);
  T_CHECK_OK(e, gcap_graph_replay(g1));
  if (t_read(y1, r, 4)) T_CHECK(r[0] == 3 && r[3] == 12);
  T_CHECK_OK(e, gcap_fill_(x, 1.5));
  T_CHECK_OK(e, gcap_graph_replay(g3));
  T_CHECK_OK(e, gcap_graph_replay(g4));
  if (t_read(y3, r, 4)) T_CHECK(r[0] == 3.0f && r[3] == 3.0f);
  if (t_read(yv, r, 4)) T_CHECK(r[0] == -1.5f && r[3] == -1.5f);
  gcap_tensor_free(x), gcap_tensor_free(y1), gcap_tensor_free(y2), gcap_tensor_free(y3);
  gcap_tensor_free(yv);
  gcap_graph_free(g1), gcap_graph_free(g2), gcap_graph_free(g3), gcap_graph_free(g4);
  gcap_engine_free(e);
}

static void test_capture_state_and_streams(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[1] = {4};
  gcap_tensor *x = NULL, *y = NULL;
  gcap_graph *g = NULL;
  gcap_stream *def = gcap_default_stream(e), *cap = gcap_capture_stream(e);
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 1, s, 2.0, &x));
  T_CHECK_OK(e, gcap_graph_new(e, &g));
  T_CHECK(gcap_graph_is_captured(g) == 0 && gcap_graph_pool(g) == NULL);
  T_CHECK_OK(e, gcap_capture_begin(g, NULL, NULL));
  T_CHECK(gcap_is_capturing(e) == 1);
  T_CHECK(gcap_current_stream(e) == cap);
  T_CHECK(gcap_graph_is_captured(g) == 0);
  T_CHECK_OK(e, gcap_scale(x, 2.0, &y));
  T_CHECK_OK(e, gcap_capture_end(g));
  T_CHECK(gcap_is_capturing(e) == 0);
  gcap_stream *cur = gcap_current_stream(e);
  T_CHECK(cur == def || cur == NULL); /* the stream current before begin */
  T_CHECK(gcap_graph_is_captured(g) == 1 && gcap_graph_pool(g) != NULL);
  T_CHECK_OK(e, gcap_graph_replay(g));
  T_CHECK(t_value(y) == 4.0);
  gcap_tensor_free(x), gcap_tensor_free(y);
  gcap_graph_free(g);
  gcap_engine_free(e);
}

static void test_user_streams(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[1] = {4};
  const float dx[4] = {1, 2, 3, 4};
  float r[4];
  gcap_tensor *x = t_from(e, 1, s, dx), *y = NULL;
  gcap_stream *cs = NULL, *rs = NULL;
  gcap_graph *g = NULL;
  T_REQUIRE(x != NULL);
  T_CHECK_OK(e, gcap_stream_new(e, &cs));
  T_CHECK_OK(e, gcap_stream_new(e, &rs));
  T_CHECK_OK(e, gcap_graph_new(e, &g));
  T_CHECK_OK(e, gcap_capture_begin(g, NULL, cs)); /* capture on a stream of ours */
  T_CHECK(gcap_current_stream(e) == cs);
  T_CHECK_OK(e, gcap_scale(x, -1.0, &y));
  T_CHECK_OK(e, gcap_capture_end(g));
  T_CHECK_OK(e, gcap_set_current_stream(e, rs)); /* replay on another stream */
  T_CHECK_OK(e, gcap_graph_replay(g));
  T_CHECK_OK(e, gcap_stream_synchronize(rs));
  T_CHECK_OK(e, gcap_set_current_stream(e, NULL)); /* back to the default stream */
  T_CHECK(gcap_current_stream(e) == gcap_default_stream(e) || gcap_current_stream(e) == NULL);
  if (t_read(y, r, 4)) T_CHECK(r[0] == -1 && r[3] == -4);
  T_CHECK_OK(e, gcap_fill_(x, 7.0));
  T_CHECK_OK(e, gcap_graph_replay(g));
  T_CHECK_OK(e, gcap_synchronize(e));
  if (t_read(y, r, 4)) T_CHECK(r[0] == -7 && r[3] == -7);
  gcap_tensor_free(x), gcap_tensor_free(y);
  gcap_graph_free(g);
  gcap_stream_free(cs), gcap_stream_free(rs);
  gcap_engine_free(e);
}

/* Fork s2 into the capture, work on both streams, join: one graph. */
static void test_fork_join_replayed(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[1] = {4};
  const float dx[4] = {1, 2, 3, 4};
  float r[4];
  gcap_tensor *x = t_from(e, 1, s, dx), *y1 = NULL, *y2 = NULL, *z = NULL;
  gcap_stream *s2 = NULL;
  gcap_event *fork = NULL, *join = NULL;
  gcap_graph *g = NULL;
  gcap_graph_stats gs;
  T_REQUIRE(x != NULL);
  T_CHECK_OK(e, gcap_stream_new(e, &s2));
  T_CHECK_OK(e, gcap_event_new(e, &fork));
  T_CHECK_OK(e, gcap_event_new(e, &join));
  T_CHECK_OK(e, gcap_graph_new(e, &g));
  T_CHECK_OK(e, gcap_capture_begin(g, NULL, NULL));
  gcap_stream *cs = gcap_current_stream(e);
  T_CHECK_OK(e, gcap_scale(x, 2.0, &y1));
  T_CHECK_OK(e, gcap_event_record(fork, cs));
  T_CHECK_OK(e, gcap_stream_wait_event(s2, fork)); /* s2 joins the capture */
  T_CHECK_OK(e, gcap_set_current_stream(e, s2));
  T_CHECK_OK(e, gcap_scale(x, 3.0, &y2));
  T_CHECK_OK(e, gcap_event_record(join, s2));
  T_CHECK_OK(e, gcap_set_current_stream(e, cs));
  T_CHECK_OK(e, gcap_stream_wait_event(cs, join)); /* and rejoins it */
  T_CHECK_OK(e, gcap_add(y1, y2, &z));
  T_CHECK_OK(e, gcap_capture_end(g));
  T_CHECK(gcap_graph_is_captured(g) == 1);
  T_CHECK_OK(e, gcap_graph_replay(g));
  if (t_read(z, r, 4)) T_CHECK(r[0] == 5 && r[1] == 10 && r[3] == 20);
  T_CHECK_OK(e, gcap_fill_(x, -2.0));
  T_CHECK_OK(e, gcap_graph_replay(g));
  if (t_read(z, r, 4)) T_CHECK(r[0] == -10 && r[3] == -10);
  if (t_read(y2, r, 4)) T_CHECK(r[0] == -6); /* the forked branch ran */
  T_CHECK_OK(e, gcap_graph_get_stats(g, &gs));
  T_CHECK(gs.nodes >= 3 && gs.replays == 2);
  gcap_tensor_free(x), gcap_tensor_free(y1), gcap_tensor_free(y2), gcap_tensor_free(z);
  gcap_event_free(fork), gcap_event_free(join);
  gcap_graph_free(g);
  gcap_stream_free(s2);
  gcap_engine_free(e);
}

/* A fork that is not joined makes the capture fail; everything stays usable. */
static void test_fork_not_joined_fails(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[1] = {4};
  const float dx[4] = {1, 2, 3, 4};
  float r[4];
  gcap_tensor *x = t_from(e, 1, s, dx), *y1 = NULL, *y2 = NULL, *y3 = NULL;
  gcap_stream *s2 = NULL;
  gcap_event *fork = NULL;
  gcap_graph *g = NULL;
  T_REQUIRE(x != NULL);
  T_CHECK_OK(e, gcap_stream_new(e, &s2));
  T_CHECK_OK(e, gcap_event_new(e, &fork));
  T_CHECK_OK(e, gcap_graph_new(e, &g));
  T_CHECK_OK(e, gcap_capture_begin(g, NULL, NULL));
  gcap_stream *cs = gcap_current_stream(e);
  T_CHECK_OK(e, gcap_scale(x, 2.0, &y1));
  T_CHECK_OK(e, gcap_event_record(fork, cs));
  T_CHECK_OK(e, gcap_stream_wait_event(s2, fork));
  T_CHECK_OK(e, gcap_set_current_stream(e, s2));
  T_CHECK_OK(e, gcap_scale(x, 3.0, &y2));
  T_CHECK_OK(e, gcap_set_current_stream(e, cs));
  T_CHECK_ST(e, gcap_capture_end(g), GCAP_ECAPTURE); /* no join */
  T_CHECK(strlen(gcap_errmsg(e)) > 0);
  T_CHECK(gcap_is_capturing(e) == 0 && gcap_graph_is_captured(g) == 0);
  T_CHECK_ST(e, gcap_graph_replay(g), GCAP_ESTATE);
  gcap_tensor_free(y1), gcap_tensor_free(y2), y1 = y2 = NULL;
  /* s2 left the capture: eager work on it runs. */
  T_CHECK_OK(e, gcap_set_current_stream(e, s2));
  T_CHECK_OK(e, gcap_scale(x, 4.0, &y3));
  T_CHECK_OK(e, gcap_stream_synchronize(s2));
  T_CHECK_OK(e, gcap_set_current_stream(e, NULL));
  if (t_read(y3, r, 4)) T_CHECK(r[0] == 4 && r[3] == 16);
  /* The same graph captures again. */
  T_CHECK_OK(e, gcap_capture_begin(g, NULL, NULL));
  T_CHECK_OK(e, gcap_scale(x, 5.0, &y1));
  T_CHECK_OK(e, gcap_capture_end(g));
  T_CHECK_OK(e, gcap_graph_replay(g));
  if (t_read(y1, r, 4)) T_CHECK(r[0] == 5 && r[3] == 20);
  gcap_tensor_free(x), gcap_tensor_free(y1), gcap_tensor_free(y3);
  gcap_event_free(fork);
  gcap_graph_free(g);
  gcap_stream_free(s2);
  gcap_engine_free(e);
}

/* The generator's seed and offset live in device memory: each replay draws
** fresh numbers, the same ones eager code draws from the same state. */
static void test_rand_in_graph_draws_fresh(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  enum { N = 256 };
  static float r1[N], r2[N], r3[N], got[N];
  const int64_t s[1] = {N};
  gcap_tensor *a = NULL, *b = NULL, *c = NULL, *r = NULL, *q = NULL;
  gcap_graph *g = NULL;
  T_CHECK_OK(e, gcap_manual_seed(e, 7));
  T_CHECK_OK(e, gcap_tensor_rand(e, GCAP_F32, 1, s, 0, &a));
  T_CHECK_OK(e, gcap_tensor_rand(e, GCAP_F32, 1, s, 0, &b));
  T_CHECK_OK(e, gcap_tensor_rand(e, GCAP_F32, 1, s, 0, &c));
  T_REQUIRE(t_read(a, r1, N) && t_read(b, r2, N) && t_read(c, r3, N));
  T_CHECK_OK(e, gcap_manual_seed(e, 7));
  T_CHECK_OK(e, gcap_graph_new(e, &g));
  T_CHECK_OK(e, gcap_capture_begin(g, NULL, NULL));
  T_CHECK_OK(e, gcap_tensor_rand(e, GCAP_F32, 1, s, 0, &r));
  T_CHECK_OK(e, gcap_capture_end(g));
  T_CHECK_OK(e, gcap_graph_replay(g));
  if (t_read(r, got, N)) T_CHECK(memcmp(got, r1, sizeof got) == 0);
  T_CHECK_OK(e, gcap_graph_replay(g));
  if (t_read(r, got, N)) T_CHECK(memcmp(got, r2, sizeof got) == 0);
  T_CHECK_OK(e, gcap_tensor_rand(e, GCAP_F32, 1, s, 0, &q)); /* eager, after two replays */
  if (t_read(q, got, N)) T_CHECK(memcmp(got, r3, sizeof got) == 0);
  gcap_tensor_free(a), gcap_tensor_free(b), gcap_tensor_free(c), gcap_tensor_free(r);
  gcap_tensor_free(q);
  gcap_graph_free(g);
  gcap_engine_free(e);
}

static void test_graph_stats(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[1] = {256};
  gcap_tensor *x = NULL, *a = NULL, *b = NULL, *c = NULL;
  gcap_graph *g = NULL;
  gcap_graph_stats gs;
  gcap_mem_stats ps;
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 1, s, 1.0, &x));
  T_CHECK_OK(e, gcap_graph_new(e, &g));
  T_CHECK_OK(e, gcap_capture_begin(g, NULL, NULL));
  T_CHECK_OK(e, gcap_add(x, x, &a));
  T_CHECK_OK(e, gcap_mul(a, x, &b));
  T_CHECK_OK(e, gcap_sum(b, &c));
  T_CHECK_OK(e, gcap_capture_end(g));
  T_CHECK_OK(e, gcap_graph_get_stats(g, &gs));
  T_CHECK(gs.nodes >= 3);
  T_CHECK(gs.capture_ms >= 0.0 && gs.instantiate_ms >= 0.0);
  T_CHECK(gs.replays == 0);
  T_REQUIRE(gcap_graph_pool(g) != NULL);
  T_CHECK_OK(e, gcap_pool_get_stats(gcap_graph_pool(g), &ps));
  T_CHECK(gs.pool_bytes > 0 && gs.pool_bytes == ps.reserved_bytes);
  T_CHECK(ps.graphs == 1 && ps.blocks >= 3 && ps.in_use_bytes >= 2 * 1024 + 4);
  for (int i = 0; i < 3; i++)
    T_CHECK_OK(e, gcap_graph_replay(g));
  T_CHECK_OK(e, gcap_graph_get_stats(g, &gs));
  T_CHECK(gs.replays == 3);
  T_CHECK(t_value(c) == 512.0);
  gcap_tensor_free(x), gcap_tensor_free(a), gcap_tensor_free(b), gcap_tensor_free(c);
  gcap_graph_free(g);
  gcap_engine_free(e);
}

static void test_graph_name(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  gcap_graph *g = NULL;
  char name[128];
  T_CHECK_OK(e, gcap_graph_new(e, &g));
  T_CHECK(gcap_graph_name(g) != NULL);
  strcpy(name, "fwd 3");
  T_CHECK_OK(e, gcap_graph_set_name(g, name));
  name[0] = 'X'; /* the name was copied */
  T_CHECK(strcmp(gcap_graph_name(g), "fwd 3") == 0);
  memset(name, 'n', 100), name[100] = '\0';
  T_CHECK_OK(e, gcap_graph_set_name(g, name));
  T_CHECK(strlen(gcap_graph_name(g)) == 63 && strncmp(gcap_graph_name(g), name, 63) == 0);
  gcap_graph_free(g);
  gcap_engine_free(e);
}

static void test_reset_and_recapture(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[1] = {4};
  gcap_tensor *x = NULL, *y = NULL, *y2 = NULL;
  gcap_graph *g = NULL;
  gcap_graph_stats gs;
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 1, s, 1.0, &x));
  T_CHECK_OK(e, gcap_graph_new(e, &g));
  T_CHECK_OK(e, gcap_capture_begin(g, NULL, NULL));
  T_CHECK_OK(e, gcap_scale(x, 2.0, &y));
  T_CHECK_OK(e, gcap_capture_end(g));
  T_CHECK_OK(e, gcap_graph_replay(g));
  T_CHECK(t_value(y) == 2.0);
  T_CHECK_OK(e, gcap_graph_reset(g));
  T_CHECK(gcap_graph_is_captured(g) == 0 && gcap_graph_pool(g) == NULL);
  T_CHECK_ST(e, gcap_graph_replay(g), GCAP_ESTATE);
  T_CHECK(t_value(y) == 2.0); /* outputs stay readable after reset */
  gcap_tensor_free(y);
  T_CHECK_OK(e, gcap_capture_begin(g, NULL, NULL));
  T_CHECK_OK(e, gcap_scale(x, 5.0, &y2));
  T_CHECK_OK(e, gcap_capture_end(g));
  T_CHECK_OK(e, gcap_graph_get_stats(g, &gs));
  T_CHECK(gs.replays == 0);
  T_CHECK_OK(e, gcap_graph_replay(g));
  T_CHECK(t_value(y2) == 5.0);
  gcap_tensor_free(x), gcap_tensor_free(y2);
  gcap_graph_free(g);
  gcap_engine_free(e);
}

int main(void) {
  T_RUN(test_replay_equals_eager_bitwise);
  T_RUN(test_thousand_ops_bitwise);
  T_RUN(test_static_outputs_and_current_inputs);
  T_RUN(test_pointers_and_scalars_baked);
  T_RUN(test_capture_state_and_streams);
  T_RUN(test_user_streams);
  T_RUN(test_fork_join_replayed);
  T_RUN(test_fork_not_joined_fails);
  T_RUN(test_rand_in_graph_draws_fresh);
  T_RUN(test_graph_stats);
  T_RUN(test_graph_name);
  T_RUN(test_reset_and_recapture);
  return t_done();
}
