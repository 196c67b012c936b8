/*
** test_lifetimes.c: objects that outlive the objects they came from (review
** regressions): a replay output of a graphed entry whose static buffers are
** reused (reuse_graph_input_output_buffers) stays readable after the graphed
** object is freed; the stream that was current when a capture began can be
** freed during the capture and a valid stream is current after it; streams
** that come and go (user streams, make_graphed_callables' warmup stream) do
** not leave their cached memory behind.
*/
#include "t.h"

/* A weak (reused) static output keeps its pool: after gcap_graphed_free the
** caller's replay output still reads what the replay wrote, also once new
** ordinary memory has been taken and written. */
static void test_reused_output_outlives_graphed(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[2] = {2, 4}, big[1] = {1 << 19}; /* 2 MiB of f32 */
  const float dx[8] = {0.5f, -1.0f, 2.0f, 0.25f, -0.75f, 1.5f, 3.0f, -2.0f};
  const double order[2] = {1, -1};
  float want[8], before[8], got[8];
  gcap_module *m = NULL;
  gcap_tensor *x = t_from(e, 2, s, dx), *ye = NULL, *y = NULL, *fill1 = NULL, *fill2 = NULL;
  gcap_graphed *G = NULL;
  gcap_graphed_opts o;
  T_REQUIRE(x != NULL);
  T_CHECK_OK(e, gcap_nn_linear(e, 4, 4, 1, 0, &m));
  int was = gcap_set_grad_enabled(e, 0);
  T_CHECK_OK(e, gcap_module_call(m, 1, &x, &ye)); /* the eager reference */
  gcap_set_grad_enabled(e, was);
  T_REQUIRE(t_read(ye, want, 8));
  gcap_tensor *const a0[1] = {x};
  gcap_tensor *const *args[1] = {a0};
  const int nargs[1] = {1};
  gcap_graphed_opts_init(&o);
  o.order = order, o.order_len = 2;
  o.reuse_graph_input_output_buffers = 1;
  T_CHECK_OK(e, gcap_make_graphed_callables(e, 1, &m, 1, nargs, args, &o, &G));
  was = gcap_set_grad_enabled(e, 0); /* an inference-style call: no autograd node */
  T_CHECK_OK(e, gcap_graphed_call(G, 0, 1, &x, &y));
  gcap_set_grad_enabled(e, was);
  T_REQUIRE(y != NULL);
  T_REQUIRE(t_read(y, before, 8));
  for (int i = 0; i < 8; i++)
    T_CHECK_NEAR(before[i], want[i], 1e-6, 1e-5);
  gcap_graphed_free(G), G = NULL; /* the caller is done with the graphed object ... */
  /* ... but not with its output. New ordinary memory must not be y's. */
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 1, big, -7.0, &fill1));
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 2, s, -7.0, &fill2));
  if (t_read(y, got, 8)) T_CHECK(memcmp(got, before, sizeof got) == 0);
  if (t_read(fill2, got, 8)) T_CHECK(got[0] == -7.0f && got[7] == -7.0f);
  T_CHECK(gcap_tensor_data_ptr(fill2) != gcap_tensor_data_ptr(y));
  gcap_tensor_free(y); /* the last reference to the pool's memory */
  T_CHECK_OK(e, gcap_synchronize(e));
  gcap_tensor_free(x), gcap_tensor_free(ye), gcap_tensor_free(fill1), gcap_tensor_free(fill2);
  gcap_module_free(m);
  gcap_engine_free(e);
}

/* The capture saved the current stream s to restore it at capture_end; s is
** freed during the capture (a collector may do that): the default stream is
** current afterwards, and the graph and later eager work run. */
static void test_current_stream_freed_during_capture(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[1] = {4};
  const float dx[4] = {1, 2, 3, 4};
  float r[4];
  gcap_tensor *x = t_from(e, 1, s, dx), *y = NULL, *t = NULL, *u = NULL;
  gcap_stream *us = NULL;
  gcap_graph *g = NULL;
  T_REQUIRE(x != NULL);
  T_CHECK_OK(e, gcap_stream_new(e, &us));
  T_CHECK_OK(e, gcap_set_current_stream(e, us));
  T_CHECK_OK(e, gcap_graph_new(e, &g));
  T_CHECK_OK(e, gcap_capture_begin(g, NULL, NULL)); /* current: the capture stream */
  T_CHECK(gcap_current_stream(e) == gcap_capture_stream(e));
  T_CHECK_OK(e, gcap_scale(x, 2.0, &y));
  gcap_stream_free(us); /* the stream capture_end would make current again */
  T_CHECK(gcap_current_stream(e) == gcap_capture_stream(e)); /* the capture goes on */
  T_CHECK_OK(e, gcap_add(y, x, &u));
  T_CHECK_OK(e, gcap_capture_end(g));
  T_CHECK(gcap_is_capturing(e) == 0);
  T_REQUIRE(gcap_current_stream(e) == gcap_default_stream(e)); /* not the freed one */
  T_CHECK_OK(e, gcap_graph_replay(g));
  if (t_read(u, r, 4)) T_CHECK(r[0] == 3 && r[1] == 6 && r[3] == 12);
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 1, s, 1.5, &t)); /* on the current stream */
  T_CHECK_OK(e, gcap_synchronize(e));
  if (t_read(t, r, 4)) T_CHECK(r[0] == 1.5f && r[3] == 1.5f);
  T_CHECK_OK(e, gcap_fill_(x, -1.0));
  T_CHECK_OK(e, gcap_graph_replay(g));
  if (t_read(u, r, 4)) T_CHECK(r[0] == -3 && r[3] == -3);
  gcap_tensor_free(x), gcap_tensor_free(y), gcap_tensor_free(t), gcap_tensor_free(u);
  gcap_graph_free(g);
  gcap_engine_free(e);
}

/* Create a stream, allocate and free 1 MiB on it, free the stream: from the
** second time on the engine reserves nothing more (the dead stream's cache is
** not stranded under its tag). */
static void test_short_lived_streams_keep_reserved(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[1] = {1 << 18}; /* 1 MiB of f32 */
  gcap_mem_stats ms, first = {0};
  for (int i = 0; i < 5; i++) {
    gcap_stream *st = NULL;
    gcap_tensor *t = NULL, *u = NULL;
    T_CHECK_OK(e, gcap_stream_new(e, &st));
    T_CHECK_OK(e, gcap_set_current_stream(e, st));
    T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 1, s, 1.0, &t));
    T_CHECK_OK(e, gcap_scale(t, 2.0, &u));
    gcap_tensor_free(t);
    gcap_tensor_free(u);
    T_CHECK_OK(e, gcap_stream_synchronize(st));
    T_CHECK_OK(e, gcap_set_current_stream(e, NULL));
    gcap_stream_free(st);
    T_CHECK_OK(e, gcap_engine_mem_stats(e, &ms));
    if (i == 0)
      first = ms;
    else {
      T_CHECK_NEAR((double)ms.reserved_bytes, (double)first.reserved_bytes, 0, 0);
      T_CHECK(ms.in_use_bytes == first.in_use_bytes && ms.blocks == first.blocks);
    }
  }
  gcap_engine_free(e);
}

/* out = in[0] * w, w the module's one parameter. */
static gcap_status mul_forward(void *ud, gcap_module *m, int nin, gcap_tensor *const *in,
                               gcap_tensor **out) {
  (void)ud, (void)nin;
  return gcap_mul(in[0], gcap_module_parameter(m, 0, NULL, 0), out);
}

/* Each make_graphed_callables warms up on a side stream of its own; the
** graphed object is freed every time: from the second call on the engine
** reserves nothing more. */
static void test_repeated_graphed_callables_keep_reserved(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[1] = {1 << 18}; /* 1 MiB of f32 */
  gcap_module *m = NULL;
  gcap_tensor *w = NULL, *x = NULL;
  gcap_mem_stats ms, first = {0};
  T_CHECK_OK(e, gcap_module_new(e, "Mul", mul_forward, NULL, NULL, &m));
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 1, s, 0.5, &w));
  T_CHECK_OK(e, gcap_module_add_parameter(m, "w", w));
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 1, s, 2.0, &x));
  T_CHECK_OK(e, gcap_tensor_set_requires_grad(x, 1));
  gcap_tensor *const a0[1] = {x};
  gcap_tensor *const *args[1] = {a0};
  const int nargs[1] = {1};
  for (int i = 0; i < 4; i++) {
    gcap_graphed *G = NULL;
    T_CHECK_OK(e, gcap_make_graphed_callables(e, 1, &m, 1, nargs, args, NULL, &G));
    gcap_graphed_free(G);
    T_CHECK_OK(e, gcap_engine_mem_stats(e, &ms));
    if (i == 0)
      first = ms;
    else {
      T_CHECK_NEAR((double)ms.reserved_bytes, (double)first.reserved_bytes, 0, 0);
      T_CHECK(ms.in_use_bytes == first.in_use_bytes && ms.blocks == first.blocks);
    }
  }
  gcap_tensor_free(w), gcap_tensor_free(x);
  gcap_module_free(m);
  gcap_engine_free(e);
}

int main(void) {
  T_RUN(test_reused_output_outlives_graphed);
  T_RUN(test_current_stream_freed_during_capture);
  T_RUN(test_short_lived_streams_keep_reserved);
  T_RUN(test_repeated_graphed_callables_keep_reserved);
  return t_done();
}
