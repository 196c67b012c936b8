/*
** test_api_args.c: every function of graphcap.h from the engine to the
** runtime-compiled kernels (test_api_args_train.c: the rest) given each
** bad argument: a NULL handle where another argument has an engine, a NULL
** out pointer, a negative count, an out-of-range enum, another engine's
** object. Each returns its status and sets a message of its own naming the
** argument, on the engine of the call (its engine argument, else its first
** handle's); a stale message left there first catches a call that sets
** none. A call whose handles are all NULL has no engine to tell: it returns
** what its declaration says.
*/
#include "t_args.h"

/* ------------------------------------------------------------------------ */
/* Constants; the engine, streams, events, pools, graphs, capture, trace    */

/* The calls that only name constants take any value. */
static void test_constants(void) {
  T_CHECK(strcmp(gcap_version(), GCAP_VERSION) == 0);
  T_CHECK(strcmp(gcap_status_str((gcap_status)1000), "unknown status") == 0);
  T_CHECK(gcap_status_str((gcap_status)-1) != NULL && gcap_kparam_name((gcap_kparam)-1) == NULL);
  T_CHECK(gcap_cuda_available() == 0 || gcap_cuda_available() == 1);
  T_CHECK(gcap_live_engines() >= 0);
  T_CHECK(gcap_test_fail_alloc(-5) == 0); /* off, as 0 */
  T_CHECK(gcap_test_fail_alloc(0) == 0);
}

static void test_engine(void) {
  gcap_engine *e = NULL;
  gcap_mem_stats ms;
  gcap_engine_stats es;
  BAD(NULL, GCAP_EINVAL, "out", gcap_engine_new(GCAP_DEVICE_HOST, NULL));
  BAD(NULL, GCAP_EINVAL, "device", gcap_engine_new((gcap_device)42, &e));
  T_CHECK(e == NULL && strcmp(gcap_last_open_error(), gcap_errmsg(NULL)) == 0);
  T_REQUIRE((e = t_engine()) != NULL);
  BAD(e, GCAP_EINVAL, "out", gcap_engine_mem_stats(e, NULL));
  BAD(e, GCAP_EINVAL, "out", gcap_engine_get_stats(e, NULL));
  NOENG(GCAP_EINVAL, gcap_engine_mem_stats(NULL, &ms));
  NOENG(GCAP_EINVAL, gcap_engine_get_stats(NULL, &es));
  NOENG(GCAP_EINVAL, gcap_synchronize(NULL));
  NOENG(GCAP_EINVAL, gcap_manual_seed(NULL, 1));
  NOENG(GCAP_EINVAL, gcap_engine_reset_peak(NULL));
  T_CHECK(strcmp(gcap_engine_device(NULL), "") == 0 && gcap_is_capturing(NULL) == 0);
  T_CHECK(gcap_is_graph_capturing(NULL) == 0 && gcap_is_graph_capturing(e) == 0);
  T_CHECK(strcmp(gcap_errmsg(NULL), gcap_last_open_error()) == 0);
  gcap_set_replay_check(NULL, 0); /* nothing to set */
  gcap_engine_free(NULL);
  gcap_engine_free(e);
}

static void test_streams_events(void) {
  gcap_engine *e = t_engine(), *e2 = t_engine();
  gcap_stream *s = NULL, *s2 = NULL;
  gcap_event *ev = NULL, *ev2 = NULL;
  gcap_stream *so = BOGUS(gcap_stream);
  gcap_event *evo = BOGUS(gcap_event);
  void *native = BOGUS(void);
  T_REQUIRE(e && e2);
  T_CHECK_OK(e, gcap_stream_new(e, &s));
  T_CHECK_OK(e2, gcap_stream_new(e2, &s2));
  T_CHECK_OK(e, gcap_event_new(e, &ev));
  T_CHECK_OK(e2, gcap_event_new(e2, &ev2));
  BAD(e, GCAP_EINVAL, "out", gcap_stream_new(e, NULL));
  BAD(e, GCAP_EINVAL, "out", gcap_event_new(e, NULL));
  BAD(e, GCAP_EINVAL, "out", gcap_event_new_external(e, NULL));
  BAD(e, GCAP_EINVAL, "out", gcap_stream_native(s, NULL));
  BAD(e, GCAP_EINVAL, "e", gcap_set_current_stream(NULL, s));
  FOREIGN(e, "s", gcap_set_current_stream(e, s2));
  BAD(e, GCAP_EINVAL, "ev", gcap_event_record(NULL, s));
  FOREIGN(e, "s", gcap_event_record(ev, s2));
  BAD(e, GCAP_EINVAL, "s", gcap_stream_wait_event(NULL, ev));
  BAD(e, GCAP_EINVAL, "ev", gcap_stream_wait_event(s, NULL));
  FOREIGN(e, "ev", gcap_stream_wait_event(s, ev2));
  NOENG(GCAP_EINVAL, gcap_stream_new(NULL, &so));
  NOENG(GCAP_EINVAL, gcap_event_new(NULL, &evo));
  NOENG(GCAP_EINVAL, gcap_event_new_external(NULL, &evo));
  NOENG(GCAP_EINVAL, gcap_set_current_stream(NULL, NULL));
  NOENG(GCAP_EINVAL, gcap_stream_synchronize(NULL));
  NOENG(GCAP_EINVAL, gcap_stream_native(NULL, &native));
  NOENG(GCAP_EINVAL, gcap_event_record(NULL, NULL));
  NOENG(GCAP_EINVAL, gcap_stream_wait_event(NULL, NULL));
  NOENG(GCAP_EINVAL, gcap_event_synchronize(NULL));
  T_CHECK(so == NULL && evo == NULL && native == NULL); /* a failed call nulls out */
  T_CHECK(gcap_default_stream(NULL) == NULL && gcap_capture_stream(NULL) == NULL);
  T_CHECK(gcap_current_stream(NULL) == NULL && gcap_current_stream(e) == gcap_default_stream(e));
  gcap_stream_free(s), gcap_stream_free(s2), gcap_event_free(ev), gcap_event_free(ev2);
  gcap_engine_free(e), gcap_engine_free(e2);
}

/* Random generators: their own and another engine's. */
static void test_generators(void) {
  gcap_engine *e = t_engine(), *e2 = t_engine();
  gcap_generator *g = NULL, *g2 = NULL, *go = BOGUS(gcap_generator);
  gcap_tensor *t = BOGUS(gcap_tensor), *x = NULL;
  const int64_t four[1] = {4};
  uint64_t seed, off;
  T_REQUIRE(e && e2);
  T_CHECK_OK(e, gcap_generator_new(e, 1, &g));
  T_CHECK_OK(e2, gcap_generator_new(e2, 1, &g2));
  T_CHECK_OK(e2, gcap_tensor_full(e2, GCAP_F32, 1, four, 0.0, &x));
  BAD(e, GCAP_EINVAL, "out", gcap_generator_new(e, 1, NULL));
  BAD(e, GCAP_EINVAL, "e", gcap_set_generator(NULL, g));
  FOREIGN(e, "g", gcap_set_generator(e, g2));
  BAD(e, GCAP_EINVAL, "seed", gcap_generator_get_state(g, NULL, &off));
  BAD(e, GCAP_EINVAL, "offset", gcap_generator_get_state(g, &seed, NULL));
  BAD(e, GCAP_EINVAL, "out", gcap_generator_save(g, NULL));
  BAD(e, GCAP_EINVAL, "state", gcap_generator_restore(g, NULL));
  FOREIGN(e, "state", gcap_generator_restore(g, x));
  BAD(e2, GCAP_EINVAL, "g", gcap_generator_restore(NULL, x));
  NOENG(GCAP_EINVAL, gcap_generator_new(NULL, 1, &go));
  NOENG(GCAP_EINVAL, gcap_set_generator(NULL, NULL));
  NOENG(GCAP_EINVAL, gcap_generator_get_state(NULL, &seed, &off));
  NOENG(GCAP_EINVAL, gcap_generator_set_state(NULL, 1, 2));
  NOENG(GCAP_EINVAL, gcap_generator_save(NULL, &t));
  NOENG(GCAP_EINVAL, gcap_generator_restore(NULL, NULL));
  T_CHECK(go == NULL && t == NULL);
  T_CHECK(gcap_default_generator(NULL) == NULL && gcap_current_generator(NULL) == NULL);
  T_CHECK(gcap_generator_retain(NULL) == NULL && gcap_current_generator(e) != g);
  gcap_generator_free(NULL);
  gcap_tensor_free(x);
  gcap_generator_free(g), gcap_generator_free(g2);
  gcap_engine_free(e), gcap_engine_free(e2);
}

static void test_pools_graphs(void) {
  gcap_engine *e = t_engine(), *e2 = t_engine();
  gcap_pool *p = NULL, *p2 = NULL;
  gcap_graph *g = NULL;
  gcap_stream *s2 = NULL;
  gcap_mem_stats ms;
  gcap_graph_stats gs;
  gcap_pool *po = BOGUS(gcap_pool);
  gcap_graph *go = BOGUS(gcap_graph);
  T_REQUIRE(e && e2);
  T_CHECK_OK(e, gcap_pool_new(e, &p));
  T_CHECK_OK(e2, gcap_pool_new(e2, &p2));
  T_CHECK_OK(e2, gcap_stream_new(e2, &s2));
  T_CHECK_OK(e, gcap_graph_new(e, &g));
  BAD(e, GCAP_EINVAL, "out", gcap_pool_new(e, NULL));
  BAD(e, GCAP_EINVAL, "out", gcap_pool_get_stats(p, NULL));
  BAD(e, GCAP_EINVAL, "out", gcap_graph_new(e, NULL));
  BAD(e, GCAP_EINVAL, "name", gcap_graph_set_name(g, NULL));
  BAD(e, GCAP_EINVAL, "g", gcap_capture_begin(NULL, p, NULL));
  FOREIGN(e, "pool", gcap_capture_begin(g, p2, NULL));
  FOREIGN(e, "s", gcap_capture_begin(g, NULL, s2));
  BAD(e2, GCAP_EINVAL, "g", gcap_capture_begin(NULL, NULL, s2));
  BAD(e, GCAP_EINVAL, "out", gcap_graph_get_stats(g, NULL));
  BAD(e, GCAP_EINVAL, "path", gcap_graph_debug_dump(g, NULL));
  BAD(e, GCAP_EINVAL, "path", gcap_trace_start(e, NULL));
  T_CHECK(gcap_is_capturing(e) == 0 && gcap_is_capturing(e2) == 0);
  NOENG(GCAP_EINVAL, gcap_pool_new(NULL, &po));
  NOENG(GCAP_EINVAL, gcap_pool_get_stats(NULL, &ms));
  NOENG(GCAP_EINVAL, gcap_graph_new(NULL, &go));
  NOENG(GCAP_EINVAL, gcap_graph_set_name(NULL, "x"));
  NOENG(GCAP_EINVAL, gcap_capture_begin(NULL, NULL, NULL));
  NOENG(GCAP_EINVAL, gcap_capture_end(NULL));
  NOENG(GCAP_EINVAL, gcap_graph_replay(NULL));
  NOENG(GCAP_EINVAL, gcap_graph_reset(NULL));
  NOENG(GCAP_EINVAL, gcap_graph_get_stats(NULL, &gs));
  NOENG(GCAP_EINVAL, gcap_graph_debug_dump(NULL, "x.dot"));
  NOENG(GCAP_EINVAL, gcap_trace_start(NULL, "x.json"));
  NOENG(GCAP_EINVAL, gcap_trace_stop(NULL));
  T_CHECK(po == NULL && go == NULL); /* a failed call nulls out */
  T_CHECK(gcap_pool_retain(NULL) == NULL && gcap_graph_pool(NULL) == NULL);
  T_CHECK(strcmp(gcap_graph_name(NULL), "") == 0 && gcap_graph_is_captured(NULL) == 0);
  gcap_pool_free(NULL), gcap_graph_free(NULL);
  gcap_pool_free(p), gcap_pool_free(p2), gcap_graph_free(g), gcap_stream_free(s2);
  gcap_engine_free(e), gcap_engine_free(e2);
}

/* ------------------------------------------------------------------------ */
/* Tensors                                                                   */

static void test_tensor_new(void) {
  const int64_t s[1] = {2}, neg[1] = {-1};
  const float d[2] = {1, 2};
  gcap_tensor *o = BOGUS(gcap_tensor);
  fx f;
  T_SETUP(fx_open(&f), fx_close(&f));
  BAD(f.e, GCAP_EINVAL, "out", gcap_tensor_empty(f.e, GCAP_F32, 1, s, NULL));
  BAD(f.e, GCAP_EINVAL, "dtype", gcap_tensor_empty(f.e, (gcap_dtype)7, 1, s, &o));
  BAD(f.e, GCAP_EINVAL, "ndim", gcap_tensor_empty(f.e, GCAP_F32, -1, s, &o));
  BAD(f.e, GCAP_EINVAL, "ndim", gcap_tensor_empty(f.e, GCAP_F32, GCAP_MAXDIM + 1, s, &o));
  BAD(f.e, GCAP_EINVAL, "shape", gcap_tensor_empty(f.e, GCAP_F32, 1, NULL, &o));
  BAD(f.e, GCAP_EINVAL, "shape", gcap_tensor_empty(f.e, GCAP_F32, 1, neg, &o));
  BAD(f.e, GCAP_EINVAL, "out", gcap_tensor_full(f.e, GCAP_F32, 1, s, 1.0, NULL));
  BAD(f.e, GCAP_EINVAL, "dtype", gcap_tensor_full(f.e, (gcap_dtype)7, 1, s, 1.0, &o));
  BAD(f.e, GCAP_EINVAL, "ndim", gcap_tensor_full(f.e, GCAP_F32, -1, s, 1.0, &o));
  BAD(f.e, GCAP_EINVAL, "out", gcap_tensor_from_f32(f.e, GCAP_F32, 1, s, d, NULL));
  BAD(f.e, GCAP_EINVAL, "data", gcap_tensor_from_f32(f.e, GCAP_F32, 1, s, NULL, &o));
  BAD(f.e, GCAP_EINVAL, "dtype", gcap_tensor_from_f32(f.e, (gcap_dtype)7, 1, s, d, &o));
  BAD(f.e, GCAP_EINVAL, "shape", gcap_tensor_from_f32(f.e, GCAP_F32, 1, neg, d, &o));
  BAD(f.e, GCAP_EINVAL, "out", gcap_tensor_rand(f.e, GCAP_F32, 1, s, 0, NULL));
  BAD(f.e, GCAP_EINVAL, "dtype", gcap_tensor_rand(f.e, (gcap_dtype)7, 1, s, 1, &o));
  BAD(f.e, GCAP_EINVAL, "ndim", gcap_tensor_rand(f.e, GCAP_F32, 9, s, 0, &o));
  T_CHECK(o == NULL);
  o = BOGUS(gcap_tensor);
  NOENG(GCAP_EINVAL, gcap_tensor_empty(NULL, GCAP_F32, 1, s, &o));
  NOENG(GCAP_EINVAL, gcap_tensor_full(NULL, GCAP_F32, 1, s, 1.0, &o));
  NOENG(GCAP_EINVAL, gcap_tensor_from_f32(NULL, GCAP_F32, 1, s, d, &o));
  NOENG(GCAP_EINVAL, gcap_tensor_rand(NULL, GCAP_F32, 1, s, 0, &o));
  T_CHECK(o == NULL);
  /* the accessors of no tensor */
  T_CHECK(gcap_tensor_retain(NULL) == NULL && gcap_tensor_engine(NULL) == NULL);
  T_CHECK(gcap_tensor_ndim(NULL) == 0 && gcap_tensor_shape(NULL) == NULL);
  T_CHECK(gcap_tensor_numel(NULL) == 0 && gcap_tensor_dtype(NULL) == GCAP_F32);
  T_CHECK(gcap_tensor_data_ptr(NULL) == 0 && gcap_tensor_version(NULL) == 0);
  gcap_tensor_free(NULL);
  fx_close(&f);
}

static void test_tensor_storage(void) {
  const int64_t s1[1] = {6};
  float r[6];
  gcap_tensor *o = BOGUS(gcap_tensor), *src = NULL;
  fx f;
  T_SETUP(fx_open(&f), fx_close(&f));
  T_SETUP(gcap_tensor_full(f.e, GCAP_F32, 1, s1, 2.0, &src) == GCAP_OK, fx_close(&f));
  BAD(f.e, GCAP_EINVAL, "t", gcap_tensor_set_(NULL, src, 0));
  BAD(f.e, GCAP_EINVAL, "src", gcap_tensor_set_(f.x, NULL, 0));
  FOREIGN(f.e, "src", gcap_tensor_set_(f.x, f.y, 0));
  BAD(f.e, GCAP_EINVAL, "offset", gcap_tensor_set_(f.x, src, INT64_MAX)); /* no overflow */
  BAD(f.e, GCAP_EINVAL, "offset", gcap_tensor_set_(f.x, src, INT64_MIN));
  BAD(f.e, GCAP_EINVAL, "offset", gcap_tensor_set_(f.x, src, -1));
  BAD(f.e, GCAP_EINVAL, "offset", gcap_tensor_set_(f.x, src, 1));
  T_CHECK(t_value(f.x) == 1.0); /* still its own storage */
  BAD(f.e, GCAP_EINVAL, "n", gcap_tensor_read(f.x, r, 5));
  BAD(f.e, GCAP_EINVAL, "dst", gcap_tensor_read(f.x, NULL, 6));
  BAD(f.e, GCAP_EINVAL, "n", gcap_tensor_read_bytes(f.x, r, 6));
  BAD(f.e, GCAP_EINVAL, "dst", gcap_tensor_read_bytes(f.x, NULL, sizeof r));
  BAD(f.e, GCAP_EINVAL, "n", gcap_tensor_write_bytes(f.x, r, 6));
  BAD(f.e, GCAP_EINVAL, "src", gcap_tensor_write_bytes(f.x, NULL, sizeof r));
  BAD(f.e, GCAP_EINVAL, "out", gcap_tensor_view(f.x, 1, s1, NULL));
  BAD(f.e, GCAP_EINVAL, "ndim", gcap_tensor_view(f.x, -1, s1, &o));
  BAD(f.e, GCAP_EINVAL, "shape", gcap_tensor_view(f.x, 1, NULL, &o));
  BAD(f.e, GCAP_EINVAL, "out", gcap_tensor_clone(f.x, NULL));
  BAD(f.e, GCAP_EINVAL, "dst", gcap_copy_(NULL, f.x));
  BAD(f.e, GCAP_EINVAL, "src", gcap_copy_(f.x, NULL));
  FOREIGN(f.e, "src", gcap_copy_(f.x, f.y));
  T_CHECK(o == NULL);
  o = BOGUS(gcap_tensor);
  NOENG(GCAP_EINVAL, gcap_tensor_set_version(NULL, 1));
  NOENG(GCAP_EINVAL, gcap_tensor_set_(NULL, NULL, 0));
  NOENG(GCAP_EINVAL, gcap_tensor_read(NULL, r, 6));
  NOENG(GCAP_EINVAL, gcap_tensor_read_bytes(NULL, r, sizeof r));
  NOENG(GCAP_EINVAL, gcap_tensor_write_bytes(NULL, r, sizeof r));
  NOENG(GCAP_EINVAL, gcap_tensor_view(NULL, 1, s1, &o));
  NOENG(GCAP_EINVAL, gcap_tensor_clone(NULL, &o));
  NOENG(GCAP_EINVAL, gcap_copy_(NULL, NULL));
  NOENG(GCAP_EINVAL, gcap_zero_(NULL));
  NOENG(GCAP_EINVAL, gcap_fill_(NULL, 1.0));
  T_CHECK(o == NULL);
  gcap_tensor_free(src);
  fx_close(&f);
}

static void test_shape_ops(void) {
  const int perm5[2] = {0, 5}, perm[2] = {1, 0};
  gcap_tensor *o = BOGUS(gcap_tensor), *outs[4], *two[2], *many[GCAP_CAT_MAX + 1];
  int n = -1, i;
  fx f;
  T_SETUP(fx_open(&f), fx_close(&f));
  BAD(f.e, GCAP_EINVAL, "perm", gcap_permute(f.x, NULL, &o));
  BAD(f.e, GCAP_EINVAL, "dim", gcap_permute(f.x, perm5, &o));
  BAD(f.e, GCAP_EINVAL, "out", gcap_permute(f.x, perm, NULL));
  BAD(f.e, GCAP_EINVAL, "dim", gcap_transpose(f.x, 0, 5, &o));
  BAD(f.e, GCAP_EINVAL, "out", gcap_transpose(f.x, 0, 1, NULL));
  BAD(f.e, GCAP_EINVAL, "dim", gcap_narrow(f.x, 5, 0, 1, &o));
  BAD(f.e, GCAP_EINVAL, "start", gcap_narrow(f.x, 1, -1, 1, &o));
  BAD(f.e, GCAP_EINVAL, "length", gcap_narrow(f.x, 1, 0, -1, &o));
  BAD(f.e, GCAP_EINVAL, "out", gcap_narrow(f.x, 1, 0, 1, NULL));
  BAD(f.e, GCAP_EINVAL, "index", gcap_select(f.x, 2, &o));
  BAD(f.e, GCAP_EINVAL, "index", gcap_select(f.x, -3, &o));
  BAD(f.e, GCAP_EINVAL, "out", gcap_select(f.x, 0, NULL));
  BAD(f.e, GCAP_EINVAL, "size", gcap_split(f.x, 0, 1, 4, outs, &n));
  BAD(f.e, GCAP_EINVAL, "dim", gcap_split(f.x, 1, 5, 4, outs, &n));
  BAD(f.e, GCAP_EINVAL, "cap", gcap_split(f.x, 1, 1, -1, outs, &n));
  BAD(f.e, GCAP_EINVAL, "cap", gcap_split(f.x, 1, 1, 2, outs, &n)); /* 3 pieces */
  BAD(f.e, GCAP_EINVAL, "outs", gcap_split(f.x, 1, 1, 4, NULL, &n));
  BAD(f.e, GCAP_EINVAL, "n", gcap_split(f.x, 1, 1, 4, outs, NULL));
  BAD(f.e, GCAP_EINVAL, "chunks", gcap_chunk(f.x, 0, 1, 4, outs, &n));
  BAD(f.e, GCAP_EINVAL, "dim", gcap_chunk(f.x, 2, -5, 4, outs, &n));
  BAD(f.e, GCAP_EINVAL, "cap", gcap_chunk(f.x, 2, 1, -1, outs, &n));
  BAD(f.e, GCAP_EINVAL, "outs", gcap_chunk(f.x, 2, 1, 4, NULL, &n));
  BAD(f.e, GCAP_EINVAL, "n", gcap_chunk(f.x, 2, 1, 4, outs, NULL));
  T_CHECK(n == 0);
  two[0] = f.x, two[1] = NULL;
  BAD(f.e, GCAP_EINVAL, "tensor 2", gcap_cat(2, two, 0, &o));
  two[1] = f.y;
  FOREIGN(f.e, "tensor 2", gcap_cat(2, two, 0, &o));
  two[0] = NULL;
  BAD(f.e2, GCAP_EINVAL, "tensor 1", gcap_cat(2, two, 0, &o)); /* told to y's engine */
  two[0] = two[1] = f.x;
  BAD(f.e, GCAP_EINVAL, "dim", gcap_cat(2, two, 2, &o));
  BAD(f.e, GCAP_EINVAL, "out", gcap_cat(2, two, 0, NULL));
  for (i = 0; i <= GCAP_CAT_MAX; i++)
    many[i] = f.x;
  BAD(f.e, GCAP_EINVAL, "n", gcap_cat(GCAP_CAT_MAX + 1, many, 0, &o));
  T_CHECK(o == NULL);
  o = BOGUS(gcap_tensor);
  NOENG(GCAP_EINVAL, gcap_permute(NULL, perm, &o));
  NOENG(GCAP_EINVAL, gcap_transpose(NULL, 0, 1, &o));
  NOENG(GCAP_EINVAL, gcap_narrow(NULL, 0, 0, 1, &o));
  NOENG(GCAP_EINVAL, gcap_select(NULL, 0, &o));
  NOENG(GCAP_EINVAL, gcap_split(NULL, 1, 0, 4, outs, &n));
  NOENG(GCAP_EINVAL, gcap_chunk(NULL, 2, 0, 4, outs, &n));
  NOENG(GCAP_EINVAL, gcap_cat(0, two, 0, &o)); /* no tensor: n < 1, ts NULL or all NULL */
  NOENG(GCAP_EINVAL, gcap_cat(-1, two, 0, &o));
  NOENG(GCAP_EINVAL, gcap_cat(2, NULL, 0, &o));
  two[0] = two[1] = NULL;
  NOENG(GCAP_EINVAL, gcap_cat(2, two, 0, &o));
  T_CHECK(o == NULL);
  fx_close(&f);
}

/* Each op with one tensor argument x before out: a NULL out names it, a NULL
** x has no engine to tell. */
typedef gcap_status (*unary_fn)(gcap_tensor *, gcap_tensor **);
static gcap_status scale2(gcap_tensor *x, gcap_tensor **out) {
  return gcap_scale(x, 2.0, out);
}
static gcap_status softmax_last(gcap_tensor *x, gcap_tensor **out) {
  return gcap_softmax(x, -1, out);
}
static gcap_status dropout_half(gcap_tensor *x, gcap_tensor **out) {
  return gcap_dropout(x, 0.5, 1, out);
}

static void test_unary_ops(void) {
  static const unary_fn fn[] = {gcap_neg,  gcap_sum,     gcap_mean,    gcap_relu,
                                gcap_gelu, softmax_last, dropout_half, scale2};
  gcap_tensor *o = BOGUS(gcap_tensor);
  size_t i;
  fx f;
  T_SETUP(fx_open(&f), fx_close(&f));
  for (i = 0; i < sizeof fn / sizeof fn[0]; i++) {
    BAD(f.e, GCAP_EINVAL, "out", fn[i](f.x, NULL));
    NOENG(GCAP_EINVAL, fn[i](NULL, &o));
    T_CHECK(o == NULL);
    o = BOGUS(gcap_tensor);
  }
  BAD(f.e, GCAP_EINVAL, "dim", gcap_softmax(f.x, 0, &o));
  BAD(f.e, GCAP_EINVAL, "probability", gcap_dropout(f.x, 2.0, 1, &o));
  T_CHECK(o == NULL);
  fx_close(&f);
}

/* The ops of two tensors a and b: each NULL in turn (told to the other's
** engine), b of another engine, out NULL. */
typedef gcap_status (*binary_fn)(gcap_tensor *, gcap_tensor *, gcap_tensor **);
static gcap_status linear_nb(gcap_tensor *x, gcap_tensor *w, gcap_tensor **out) {
  return gcap_linear(x, w, NULL, out);
}
static gcap_status linear_gelu_nb(gcap_tensor *x, gcap_tensor *w, gcap_tensor **out) {
  return gcap_linear_gelu(x, w, NULL, out);
}
static gcap_status masked_fill_0(gcap_tensor *t, gcap_tensor *mask, gcap_tensor **out) {
  return gcap_masked_fill(t, mask, 0.0, out);
}
static gcap_status layer_norm_w(gcap_tensor *x, gcap_tensor *w, gcap_tensor **out) {
  return gcap_layer_norm(x, w, NULL, 1e-5, out);
}
static gcap_status layer_norm_b(gcap_tensor *x, gcap_tensor *b, gcap_tensor **out) {
  return gcap_layer_norm(x, NULL, b, 1e-5, out);
}
static gcap_status softmax_mask(gcap_tensor *x, gcap_tensor *mask, gcap_tensor **out) {
  return gcap_softmax_masked(x, 1.0, mask, GCAP_MASK_ADD, 0, out);
}
static gcap_status compare_ne(gcap_tensor *a, gcap_tensor *b, gcap_tensor **out) {
  return gcap_compare(a, b, GCAP_NE, out);
}

static void test_binary_ops(void) {
  static const struct {
    binary_fn fn;
    const char *a, *b;
    int b_optional; /* NULL is no weight, no bias, no mask */
  } ops[] = {{gcap_add, "a", "b", 0},
             {gcap_sub, "a", "b", 0},
             {gcap_mul, "a", "b", 0},
             {gcap_div, "a", "b", 0},
             {gcap_pow, "a", "b", 0},
             {compare_ne, "a", "b", 0},
             {gcap_matmul, "a", "b", 0},
             {linear_nb, "x", "w", 0},
             {linear_gelu_nb, "x", "w", 0},
             {masked_fill_0, "t", "mask", 0},
             {layer_norm_w, "x", "w", 1},
             {layer_norm_b, "x", "b", 1},
             {softmax_mask, "x", "mask", 1},
             {gcap_embedding, "ids", "weight", 0},
             {gcap_mse_loss, "input", "target", 0},
             {gcap_cross_entropy, "logits", "target", 0}};
  const int64_t s3[1] = {3};
  gcap_tensor *o = BOGUS(gcap_tensor), *b = NULL;
  size_t i;
  fx f;
  T_SETUP(fx_open(&f), fx_close(&f));
  T_SETUP(gcap_tensor_full(f.e, GCAP_F32, 1, s3, 1.0, &b) == GCAP_OK, fx_close(&f));
  for (i = 0; i < sizeof ops / sizeof ops[0]; i++) {
    BAD(f.e, GCAP_EINVAL, ops[i].a, ops[i].fn(NULL, b, &o));
    if (!ops[i].b_optional) BAD(f.e, GCAP_EINVAL, ops[i].b, ops[i].fn(f.x, NULL, &o));
    FOREIGN(f.e, ops[i].b, ops[i].fn(f.x, f.y, &o));
    BAD(f.e, GCAP_EINVAL, "out", ops[i].fn(f.x, b, NULL));
    NOENG(GCAP_EINVAL, ops[i].fn(NULL, NULL, &o));
    T_CHECK(o == NULL);
    o = BOGUS(gcap_tensor);
  }
  BAD(f.e, GCAP_EINVAL, "op", gcap_compare(f.x, b, (gcap_cmp)42, &o));
  T_CHECK(o == NULL);
  gcap_tensor_free(b);
  fx_close(&f);
}

/* Attention's tensors and options, and the masked softmax's. */
static void test_attention(void) {
  const int64_t s4[2] = {4, 4};
  gcap_tensor *o = BOGUS(gcap_tensor), *q = NULL;
  gcap_sdpa_opts opts;
  fx f;
  T_SETUP(fx_open(&f), fx_close(&f));
  T_SETUP(gcap_tensor_full(f.e, GCAP_F32, 2, s4, 0.5, &q) == GCAP_OK, fx_close(&f));
  memset(&opts, 0, sizeof opts);
  BAD(f.e, GCAP_EINVAL, "q", gcap_scaled_dot_product_attention(NULL, q, q, &opts, &o));
  BAD(f.e, GCAP_EINVAL, "k", gcap_scaled_dot_product_attention(q, NULL, q, &opts, &o));
  BAD(f.e, GCAP_EINVAL, "v", gcap_scaled_dot_product_attention(q, q, NULL, &opts, &o));
  FOREIGN(f.e, "k", gcap_scaled_dot_product_attention(q, f.y, q, &opts, &o));
  FOREIGN(f.e, "v", gcap_scaled_dot_product_attention(q, q, f.y, &opts, &o));
  BAD(f.e, GCAP_EINVAL, "out", gcap_scaled_dot_product_attention(q, q, q, &opts, NULL));
  opts.impl = (gcap_sdpa_impl)9;
  BAD(f.e, GCAP_EINVAL, "impl", gcap_scaled_dot_product_attention(q, q, q, &opts, &o));
  opts.impl = GCAP_SDPA_AUTO, opts.mask_kind = (gcap_mask_kind)9;
  BAD(f.e, GCAP_EINVAL, "mask kind", gcap_scaled_dot_product_attention(q, q, q, &opts, &o));
  opts.mask_kind = GCAP_MASK_ADD, opts.dropout_p = 1.5;
  BAD(f.e, GCAP_EINVAL, "dropout_p", gcap_scaled_dot_product_attention(q, q, q, &opts, &o));
  opts.dropout_p = 0, opts.scale = -1;
  BAD(f.e, GCAP_EINVAL, "scale", gcap_scaled_dot_product_attention(q, q, q, &opts, &o));
  opts.scale = 0, opts.attn_mask = f.y;
  FOREIGN(f.e, "attn_mask", gcap_scaled_dot_product_attention(q, q, q, &opts, &o));
  BAD(f.e, GCAP_EINVAL, "kind", gcap_softmax_masked(q, 1.0, q, (gcap_mask_kind)7, 0, &o));
  BAD(f.e, GCAP_EINVAL, "scale", gcap_softmax_masked(q, INFINITY, NULL, GCAP_MASK_ADD, 0, &o));
  FOREIGN(f.e, "mask", gcap_softmax_masked(q, 1.0, f.y, GCAP_MASK_BOOL, 1, &o));
  T_CHECK(o == NULL);
  o = BOGUS(gcap_tensor);
  NOENG(GCAP_EINVAL, gcap_scaled_dot_product_attention(NULL, NULL, NULL, NULL, &o));
  NOENG(GCAP_EINVAL, gcap_softmax_masked(NULL, 1.0, NULL, GCAP_MASK_ADD, 0, &o));
  T_CHECK(o == NULL);
  gcap_tensor_free(q);
  fx_close(&f);
}

/* ------------------------------------------------------------------------ */
/* Autograd                                                                  */

static gcap_status no_backward(void *ud, int nsaved, gcap_tensor *const *saved, gcap_tensor *g,
                               int nin, gcap_tensor **gin) {
  (void)ud, (void)nsaved, (void)saved, (void)g, (void)nin, (void)gin;
  return GCAP_OK;
}

static void test_autograd(void) {
  gcap_tensor *o = BOGUS(gcap_tensor), *in[1], *save[7], *g = NULL;
  int i;
  fx f;
  T_SETUP(fx_open(&f), fx_close(&f));
  T_SETUP(gcap_tensor_full(f.e, GCAP_F32, 0, NULL, 1.0, &g) == GCAP_OK, fx_close(&f));
  BAD(f.e, GCAP_EINVAL, "t", gcap_tensor_set_grad(NULL, f.x));
  FOREIGN(f.e, "grad", gcap_tensor_set_grad(f.x, f.y));
  T_CHECK(gcap_tensor_grad(f.x) == NULL);
  BAD(f.e, GCAP_EINVAL, "out", gcap_tensor_detach(f.x, NULL));
  BAD(f.e, GCAP_EINVAL, "t", gcap_backward(NULL, g, 0));
  T_CHECK_OK(f.e, gcap_tensor_set_requires_grad(f.x, 1));
  FOREIGN(f.e, "grad", gcap_backward(f.x, f.y, 0));
  NOENG(GCAP_EINVAL, gcap_tensor_set_requires_grad(NULL, 1));
  NOENG(GCAP_EINVAL, gcap_tensor_set_grad(NULL, NULL));
  NOENG(GCAP_EINVAL, gcap_tensor_detach(NULL, &o));
  NOENG(GCAP_EINVAL, gcap_backward(NULL, NULL, 0));
  T_CHECK(o == NULL);
  T_CHECK(gcap_tensor_requires_grad(NULL) == 0 && gcap_tensor_is_leaf(NULL) == 0);
  T_CHECK(gcap_tensor_grad(NULL) == NULL && gcap_tensor_grad_fn_name(NULL) == NULL);
  T_CHECK(gcap_set_grad_enabled(NULL, 1) == 0 && gcap_is_grad_enabled(NULL) == 0);
  /* a custom node: every refusal frees ud once */
  in[0] = f.x;
  for (i = 0; i < 7; i++)
    save[i] = f.x;
  n_ud_freed = 0;
  BAD(f.e, GCAP_EINVAL, "name",
      gcap_autograd_record(NULL, f.x, 1, in, 0, NULL, no_backward, NULL, count_ud_free, &o));
  BAD(f.e, GCAP_EINVAL, "out",
      gcap_autograd_record("f", f.x, 1, in, 0, NULL, no_backward, NULL, count_ud_free, NULL));
  BAD(f.e, GCAP_EINVAL, "bw",
      gcap_autograd_record("f", f.x, 1, in, 0, NULL, NULL, NULL, count_ud_free, &o));
  BAD(f.e, GCAP_EINVAL, "nin",
      gcap_autograd_record("f", f.x, -1, in, 0, NULL, no_backward, NULL, count_ud_free, &o));
  BAD(f.e, GCAP_EINVAL, "nsave",
      gcap_autograd_record("f", f.x, 1, in, -1, NULL, no_backward, NULL, count_ud_free, &o));
  BAD(f.e, GCAP_EINVAL, "in",
      gcap_autograd_record("f", f.x, 1, NULL, 0, NULL, no_backward, NULL, count_ud_free, &o));
  BAD(f.e, GCAP_EINVAL, "save",
      gcap_autograd_record("f", f.x, 1, in, 1, NULL, no_backward, NULL, count_ud_free, &o));
  BAD(f.e, GCAP_EINVAL, "saved",
      gcap_autograd_record("f", f.x, 1, in, 7, save, no_backward, NULL, count_ud_free, &o));
  in[0] = save[0] = f.y;
  FOREIGN(f.e, "input #1",
          gcap_autograd_record("f", f.x, 1, in, 0, NULL, no_backward, NULL, count_ud_free, &o));
  in[0] = f.x;
  FOREIGN(f.e, "saved tensor #1",
          gcap_autograd_record("f", f.x, 1, in, 1, save, no_backward, NULL, count_ud_free, &o));
  NOENG(GCAP_EINVAL,
        gcap_autograd_record("f", NULL, 1, in, 0, NULL, no_backward, NULL, count_ud_free, &o));
  T_CHECK(o == NULL && n_ud_freed == 11);
  BAD(f.e, GCAP_EINVAL, "out", gcap_autograd_anchor(f.x, NULL));
  NOENG(GCAP_EINVAL, gcap_autograd_anchor(NULL, &o));
  T_CHECK(o == NULL);
  gcap_tensor_free(g);
  fx_close(&f);
}

/* ------------------------------------------------------------------------ */
/* Optimizers, custom ops, runtime-compiled kernels                          */

static void test_optim(void) {
  gcap_optim *o = BOGUS(gcap_optim);
  gcap_tensor *p[1];
  double v = 0;
  fx f;
  T_SETUP(fx_open(&f), fx_close(&f));
  p[0] = f.x;
  BAD(f.e, GCAP_EINVAL, "out", gcap_optim_sgd(f.e, 1, p, 0.1, 0, 0, NULL));
  BAD(f.e, GCAP_EINVAL, "n", gcap_optim_sgd(f.e, -1, p, 0.1, 0, 0, &o));
  BAD(f.e, GCAP_EINVAL, "params", gcap_optim_sgd(f.e, 1, NULL, 0.1, 0, 0, &o));
  BAD(f.e, GCAP_EINVAL, "lr", gcap_optim_sgd(f.e, 1, p, -1, 0, 0, &o));
  BAD(f.e, GCAP_EINVAL, "momentum", gcap_optim_sgd(f.e, 1, p, 0.1, -1, 0, &o));
  BAD(f.e, GCAP_EINVAL, "weight_decay", gcap_optim_sgd(f.e, 1, p, 0.1, 0, -1, &o));
  BAD(f.e, GCAP_EINVAL, "out", gcap_optim_adam(f.e, 1, p, 0.1, 0.9, 0.99, 1e-8, 0, NULL));
  BAD(f.e, GCAP_EINVAL, "beta1", gcap_optim_adam(f.e, 1, p, 0.1, 1.0, 0.99, 1e-8, 0, &o));
  BAD(f.e, GCAP_EINVAL, "beta2", gcap_optim_adam(f.e, 1, p, 0.1, 0.9, 1.5, 1e-8, 0, &o));
  BAD(f.e, GCAP_EINVAL, "eps", gcap_optim_adam(f.e, 1, p, 0.1, 0.9, 0.99, -1, 0, &o));
  BAD(f.e, GCAP_EINVAL, "n", gcap_optim_adam(f.e, -2, p, 0.1, 0.9, 0.99, 1e-8, 0, &o));
  BAD(f.e, GCAP_EINVAL, "out", gcap_optim_adamw(f.e, 1, p, 0.1, 0.9, 0.99, 1e-8, 0, NULL));
  BAD(f.e, GCAP_EINVAL, "beta2", gcap_optim_adamw(f.e, 1, p, 0.1, 0.9, 1.0, 1e-8, 0, &o));
  BAD(f.e, GCAP_EINVAL, "weight_decay", gcap_optim_adamw(f.e, 1, p, 0.1, 0.9, 0.99, 1e-8, -1, &o));
  T_CHECK_OK(f.e, gcap_optim_adamw(f.e, 1, p, 0.1, 0.9, 0.99, 1e-8, 0.01, &o));
  BAD(f.e, GCAP_EINVAL, "lr", gcap_optim_set_lr(o, -1.0));
  T_CHECK(gcap_optim_lr(o) == 0.1);
  gcap_optim_free(o);
  o = BOGUS(gcap_optim);
  p[0] = NULL;
  BAD(f.e, GCAP_EINVAL, "parameter #1", gcap_optim_adam(f.e, 1, p, 0.1, 0.9, 0.99, 1e-8, 0, &o));
  p[0] = f.y;
  FOREIGN(f.e, "parameter #1", gcap_optim_sgd(f.e, 1, p, 0.1, 0, 0, &o));
  T_CHECK(o == NULL);
  p[0] = f.x;
  T_SETUP(gcap_optim_sgd(f.e, 1, p, 0.1, 0, 0, &o) == GCAP_OK, fx_close(&f));
  BAD(f.e, GCAP_EINVAL, "name", gcap_optim_hyper(o, NULL, &v));
  BAD(f.e, GCAP_EINVAL, "v", gcap_optim_hyper(o, "lr", NULL));
  BAD(f.e, GCAP_EINVAL, "beta1", gcap_optim_hyper(o, "beta1", &v)); /* an Adam's */
  BAD(f.e, GCAP_EINVAL, "name", gcap_optim_set_hyper(o, NULL, 1.0));
  BAD(f.e, GCAP_EINVAL, "eps", gcap_optim_set_hyper(o, "eps", 1.0));
  BAD(f.e, GCAP_EINVAL, "lr", gcap_optim_set_hyper(o, "lr", -1.0));
  T_CHECK(gcap_optim_hyper(o, "lr", &v) == GCAP_OK && v == 0.1); /* unchanged */
  T_CHECK(gcap_optim_param(o, -1) == NULL && gcap_optim_param(o, 1) == NULL);
  T_CHECK(gcap_optim_state(o, 0, 0, NULL) == NULL && gcap_optim_state(o, 1, 0, NULL) == NULL &&
          gcap_optim_state(o, 0, -1, NULL) == NULL); /* no momentum: no state */
  gcap_optim_free(o);
  o = BOGUS(gcap_optim);
  NOENG(GCAP_EINVAL, gcap_optim_hyper(NULL, "lr", &v));
  NOENG(GCAP_EINVAL, gcap_optim_set_hyper(NULL, "lr", 1.0));
  T_CHECK(gcap_optim_num_params(NULL) == 0 && gcap_optim_param(NULL, 0) == NULL &&
          gcap_optim_state(NULL, 0, 0, NULL) == NULL);
  NOENG(GCAP_EINVAL, gcap_optim_sgd(NULL, 1, p, 0.1, 0, 0, &o));
  NOENG(GCAP_EINVAL, gcap_optim_adam(NULL, 1, p, 0.1, 0.9, 0.99, 1e-8, 0, &o));
  NOENG(GCAP_EINVAL, gcap_optim_adamw(NULL, 1, p, 0.1, 0.9, 0.99, 1e-8, 0, &o));
  NOENG(GCAP_EINVAL, gcap_optim_set_lr(NULL, 0.1));
  T_CHECK(gcap_optim_lr(NULL) == 0.0);
  NOENG(GCAP_EINVAL, gcap_optim_step(NULL));
  NOENG(GCAP_EINVAL, gcap_optim_zero_grad(NULL, 1));
  T_CHECK(o == NULL);
  gcap_optim_free(NULL);
  fx_close(&f);
}

static gcap_status copy_host(void *ud, void *stream, int nin, const gcap_custom_arg *in, int nout,
                             const gcap_custom_arg *out) {
  (void)ud, (void)stream, (void)nin, (void)nout;
  memcpy(out[0].data, in[0].data, (size_t)in[0].numel * sizeof(float));
  return GCAP_OK;
}

static void test_custom_ops(void) {
  gcap_custom_desc d;
  gcap_custom_op *op = NULL, *opo = BOGUS(gcap_custom_op);
  gcap_custom_out spec[1] = {{GCAP_F32, 2, {2, 3, 0, 0}}}, bad = spec[0];
  gcap_tensor *in[1], *out[1];
  const int save[1] = {9};
  fx f;
  T_SETUP(fx_open(&f), fx_close(&f));
  memset(&d, 0, sizeof d);
  d.name = "copy", d.host = copy_host, d.cuda = copy_host, d.ud_free = count_ud_free;
  n_ud_freed = 0;
  BAD(f.e, GCAP_EINVAL, "d", gcap_custom_op_new(f.e, NULL, &opo));
  BAD(f.e, GCAP_EINVAL, "out", gcap_custom_op_new(f.e, &d, NULL));
  NOENG(GCAP_EINVAL, gcap_custom_op_new(NULL, &d, &opo));
  d.name = NULL;
  BAD(f.e, GCAP_EINVAL, "name", gcap_custom_op_new(f.e, &d, &opo));
  d.name = "copy", d.host = d.cuda = NULL;
  BAD(f.e, GCAP_EINVAL, "callback", gcap_custom_op_new(f.e, &d, &opo));
  T_CHECK(opo == NULL && n_ud_freed == 4);
  d.host = d.cuda = copy_host, d.ud_free = NULL;
  T_SETUP(gcap_custom_op_new(f.e, &d, &op) == GCAP_OK, fx_close(&f));
  in[0] = f.x;
  BAD(f.e, GCAP_EINVAL, "nin", gcap_custom_call(op, -1, in, 1, spec, 0, NULL, out));
  BAD(f.e, GCAP_EINVAL, "nout", gcap_custom_call(op, 1, in, 0, spec, 0, NULL, out));
  BAD(f.e, GCAP_EINVAL, "nout", gcap_custom_call(op, 1, in, 0, spec, 0, NULL, NULL));
  BAD(f.e, GCAP_EINVAL, "nsave", gcap_custom_call(op, 1, in, 1, spec, -1, NULL, out));
  BAD(f.e, GCAP_EINVAL, "in", gcap_custom_call(op, 1, NULL, 1, spec, 0, NULL, out));
  BAD(f.e, GCAP_EINVAL, "spec", gcap_custom_call(op, 1, in, 1, NULL, 0, NULL, out));
  BAD(f.e, GCAP_EINVAL, "save", gcap_custom_call(op, 1, in, 1, spec, 1, NULL, out));
  BAD(f.e, GCAP_EINVAL, "save #1", gcap_custom_call(op, 1, in, 1, spec, 1, save, out));
  BAD(f.e, GCAP_EINVAL, "out", gcap_custom_call(op, 1, in, 1, spec, 0, NULL, NULL));
  bad.dtype = (gcap_dtype)7;
  BAD(f.e, GCAP_EINVAL, "dtype", gcap_custom_call(op, 1, in, 1, &bad, 0, NULL, out));
  bad.dtype = GCAP_F32, bad.ndim = -1;
  BAD(f.e, GCAP_EINVAL, "ndim", gcap_custom_call(op, 1, in, 1, &bad, 0, NULL, out));
  in[0] = NULL;
  BAD(f.e, GCAP_EINVAL, "input #1", gcap_custom_call(op, 1, in, 1, spec, 0, NULL, out));
  in[0] = f.y;
  FOREIGN(f.e, "input #1", gcap_custom_call(op, 1, in, 1, spec, 0, NULL, out));
  T_CHECK(out[0] == NULL);
  NOENG(GCAP_EINVAL, gcap_custom_call(NULL, 1, in, 1, spec, 0, NULL, out));
  BAD(f.e, GCAP_EINVAL, "what", gcap_note_access(f.x, 0, NULL));
  NOENG(GCAP_EINVAL, gcap_note_access(NULL, 0, "x"));
  gcap_custom_op_free(op), gcap_custom_op_free(NULL);
  fx_close(&f);
}

static const char *KSRC = "extern \"C\" __global__ void k(float *x, int n) { if (n) x[0] = 1; }";

static void test_kernels(void) {
  const char *opts[1] = {NULL};
  const gcap_kparam pbad[1] = {(gcap_kparam)99};
  gcap_kernel *k = NULL, *ko = BOGUS(gcap_kernel);
  const gcap_kparam *params;
  gcap_karg args[2], conv[2];
  gcap_launch_desc l;
  int n;
  fx f;
  T_SETUP(fx_open(&f), fx_close(&f));
  BAD(f.e, GCAP_EINVAL, "out", gcap_kernel_new(f.e, KSRC, "k", 0, NULL, 0, NULL, NULL));
  BAD(f.e, GCAP_EINVAL, "source", gcap_kernel_new(f.e, NULL, "k", 0, NULL, 0, NULL, &ko));
  BAD(f.e, GCAP_EINVAL, "name", gcap_kernel_new(f.e, KSRC, NULL, 0, NULL, 0, NULL, &ko));
  BAD(f.e, GCAP_EINVAL, "nopts", gcap_kernel_new(f.e, KSRC, "k", -1, NULL, 0, NULL, &ko));
  BAD(f.e, GCAP_EINVAL, "opts", gcap_kernel_new(f.e, KSRC, "k", 1, NULL, 0, NULL, &ko));
  BAD(f.e, GCAP_EINVAL, "option #1", gcap_kernel_new(f.e, KSRC, "k", 1, opts, 0, NULL, &ko));
  BAD(f.e, GCAP_EINVAL, "nparams", gcap_kernel_new(f.e, KSRC, "k", 0, NULL, -1, pbad, &ko));
  BAD(f.e, GCAP_EINVAL, "parameter 1", gcap_kernel_new(f.e, KSRC, "k", 0, NULL, 1, pbad, &ko));
  NOENG(GCAP_EINVAL, gcap_kernel_new(NULL, KSRC, "k", 0, NULL, 0, NULL, &ko));
  T_CHECK(ko == NULL && gcap_kparam_name(pbad[0]) == NULL);
  NOENG(GCAP_EINVAL, gcap_kernel_params(NULL, &n, &params));
  NOENG(GCAP_EINVAL, gcap_kernel_args(NULL, 0, NULL, NULL));
  memset(&l, 0, sizeof l);
  NOENG(GCAP_EINVAL, gcap_kernel_launch(NULL, &l));
  gcap_kernel_free(NULL);
  if (gcap_kernel_new(f.e, KSRC, "k", 0, NULL, 0, NULL, &k) == GCAP_EUNSUPPORTED) {
    printf("# no NVRTC: a kernel's own calls are not tried (%s)\n", gcap_errmsg(f.e));
    fx_close(&f);
    return;
  }
  T_SETUP(k != NULL, fx_close(&f));
  BAD(f.e, GCAP_EINVAL, "nparams", gcap_kernel_params(k, NULL, &params));
  BAD(f.e, GCAP_EINVAL, "params", gcap_kernel_params(k, &n, NULL));
  memset(args, 0, sizeof args);
  args[0].t = f.x, args[1].kind = GCAP_KARG_INT;
  BAD(f.e, GCAP_EINVAL, "nargs", gcap_kernel_args(k, -1, args, conv));
  BAD(f.e, GCAP_EINVAL, "args", gcap_kernel_args(k, 2, NULL, conv));
  BAD(f.e, GCAP_EINVAL, "out", gcap_kernel_args(k, 2, args, NULL));
  args[1].kind = (gcap_karg_kind)9;
  BAD(f.e, GCAP_EINVAL, "argument #2", gcap_kernel_args(k, 2, args, conv));
  args[1].kind = GCAP_KARG_INT, args[0].t = f.y;
  FOREIGN(f.e, "argument #1", gcap_kernel_args(k, 2, args, conv));
  args[0].t = f.x;
  BAD(f.e, GCAP_EINVAL, "l", gcap_kernel_launch(k, NULL));
  l.grid[0] = l.grid[1] = l.grid[2] = l.block[0] = l.block[1] = l.block[2] = 1;
  l.host = copy_host;
  l.nargs = -1;
  BAD(f.e, GCAP_EINVAL, "nargs", gcap_kernel_launch(k, &l));
  l.nargs = 2;
  BAD(f.e, GCAP_EINVAL, "args", gcap_kernel_launch(k, &l));
  l.args = args, l.nwrites = -1;
  BAD(f.e, GCAP_EINVAL, "nwrites", gcap_kernel_launch(k, &l));
  l.nwrites = 1;
  BAD(f.e, GCAP_EINVAL, "writes", gcap_kernel_launch(k, &l));
  l.nwrites = 0, l.nreads = 1, l.reads = &f.y;
  FOREIGN(f.e, "read #1", gcap_kernel_launch(k, &l));
  l.block[2] = 0;
  BAD(f.e, GCAP_EINVAL, "block", gcap_kernel_launch(k, &l));
  gcap_kernel_free(k);
  fx_close(&f);
}

int main(void) {
  T_RUN(test_constants);
  T_RUN(test_engine);
  T_RUN(test_streams_events);
  T_RUN(test_generators);
  T_RUN(test_pools_graphs);
  T_RUN(test_tensor_new);
  T_RUN(test_tensor_storage);
  T_RUN(test_shape_ops);
  T_RUN(test_unary_ops);
  T_RUN(test_binary_ops);
  T_RUN(test_attention);
  T_RUN(test_autograd);
  T_RUN(test_optim);
  T_RUN(test_custom_ops);
  T_RUN(test_kernels);
  return t_done();
}
