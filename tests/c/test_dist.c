/*
** test_dist.c: the distributed runtime from C at world size 1, without
** mpirun (MPI starts as a singleton in gcap_dist_init): calls before init,
** init twice, ranks, a tensor of another engine, all_gather in place (t is
** this rank's chunk of out), a collective recorded into a graph and run at
** each replay, groups, and calls after finalize. In a build without MPI,
** init's error says so. The multi-rank tests are the Lua files of tests/dist.
*/
#include "t.h"

static gcap_engine *E; /* the engine the world is bound to (made by main) */

static void test_before_init(void) {
  gcap_engine *e = t_engine();
  const int64_t s[1] = {2};
  const float d[2] = {1, 2};
  gcap_tensor *t = t_from(e, 1, s, d);
  T_REQUIRE(t != NULL);
  T_CHECK(!gcap_dist_is_initialized());
  T_CHECK(gcap_dist_rank() == -1 && gcap_dist_world_size() == -1 && gcap_dist_local_rank() == -1);
  T_CHECK(gcap_dist_world() == NULL);
  T_CHECK_ST(e, gcap_dist_all_reduce(t, GCAP_REDUCE_SUM, NULL), GCAP_ESTATE);
  T_CHECK(t_msg_has(e, "all_reduce: the distributed runtime is not initialised"));
  T_CHECK_ST(e, gcap_dist_barrier(e, NULL), GCAP_ESTATE);
  T_CHECK(t_msg_has(e, "barrier: the distributed runtime is not initialised"));
  T_CHECK_ST(e, gcap_dist_finalize(), GCAP_ESTATE);
  T_CHECK_ST(e, gcap_dist_init(NULL), GCAP_EINVAL);
  T_CHECK_ST(e, gcap_dist_all_reduce(NULL, GCAP_REDUCE_SUM, NULL), GCAP_EINVAL);
  T_CHECK_ST(e, gcap_dist_all_gather(NULL, t, NULL), GCAP_EINVAL);
  gcap_tensor_free(t);
  gcap_engine_free(e);
}

/* Binds the world to E; when that fails, E is freed and the tests after skip. */
static void test_init(void) {
  gcap_engine *e = E;
  if (!gcap_dist_available()) {
    T_CHECK_ST(e, gcap_dist_init(e), GCAP_EUNSUPPORTED);
    T_CHECK(t_msg_has(e, "init: graphcap was built without MPI"));
    gcap_engine_free(E);
    E = NULL;
    return;
  }
  T_SETUP(gcap_dist_init(e) == GCAP_OK, (gcap_engine_free(E), E = NULL));
  T_CHECK(gcap_dist_is_initialized());
  T_CHECK(gcap_dist_rank() == 0 && gcap_dist_world_size() == 1 && gcap_dist_local_rank() == 0);
  T_CHECK_ST(e, gcap_dist_init(e), GCAP_ESTATE);
  T_CHECK(t_msg_has(e, "init: the distributed runtime is already initialised"));
  T_CHECK(gcap_dist_group_size(NULL) == 1 && gcap_dist_group_rank(gcap_dist_world()) == 0);
  T_CHECK_OK(e, gcap_dist_barrier(e, NULL));
}

static void test_another_engine(void) {
  gcap_engine *e2;
  const int64_t s[1] = {3};
  const float d[3] = {1, 2, 3};
  gcap_tensor *t, *u;
  if (E == NULL) return;
  e2 = t_engine();
  T_REQUIRE(e2 != NULL);
  t = t_from(e2, 1, s, d);
  u = t_from(E, 1, s, d);
  T_SETUP(t != NULL && u != NULL, (gcap_tensor_free(t), gcap_tensor_free(u), gcap_engine_free(e2)));
  T_CHECK_ST(e2, gcap_dist_all_reduce(t, GCAP_REDUCE_SUM, NULL), GCAP_EINVAL);
  T_CHECK(t_msg_has(e2, "all_reduce: this engine is not the one"));
  T_CHECK_ST(E, gcap_dist_all_gather(t, u, NULL), GCAP_EINVAL);
  T_CHECK(t_msg_has(E, "all_gather: out and t belong to different engines"));
  T_CHECK_ST(e2, gcap_dist_barrier(e2, NULL), GCAP_EINVAL);
  gcap_tensor_free(t);
  gcap_tensor_free(u);
  gcap_engine_free(e2);
}

static void test_in_place_and_values(void) {
  const int64_t s[1] = {3};
  const float d[3] = {1.5f, -2, 3};
  float got[3];
  gcap_tensor *t, *v = NULL;
  if (E == NULL) return;
  t = t_from(E, 1, s, d);
  T_REQUIRE(t != NULL);
  T_CHECK_OK(E, gcap_dist_all_gather(t, t, NULL)); /* t is this rank's chunk of itself */
  T_CHECK_OK(E, gcap_tensor_view(t, 1, s, &v));
  T_CHECK_OK(E, gcap_dist_reduce_scatter(v, t, GCAP_REDUCE_AVG, NULL));
  T_CHECK_OK(E, gcap_dist_all_reduce(t, GCAP_REDUCE_MAX, NULL));
  T_CHECK_OK(E, gcap_dist_broadcast(t, 0, NULL));
  T_CHECK(t_read(t, got, 3) && memcmp(got, d, sizeof d) == 0);
  T_CHECK_ST(E, gcap_dist_all_reduce(t, (gcap_reduce_op)7, NULL), GCAP_EINVAL);
  T_CHECK(t_msg_has(E, "all_reduce: unknown reduction 7"));
  T_CHECK_ST(E, gcap_dist_broadcast(t, 1, NULL), GCAP_EINVAL);
  T_CHECK(t_msg_has(E, "broadcast: root 1 is out of range (world size 1)"));
  T_CHECK_ST(E, gcap_dist_send(t, 0, NULL), GCAP_EINVAL);
  T_CHECK(t_msg_has(E, "send: peer 0 is this rank itself"));
  gcap_tensor_free(v);
  gcap_tensor_free(t);
}

/* x2 = x * 2 then all_reduce(x2), captured: each replay runs both. */
static void test_captured(void) {
  const int64_t s[1] = {4};
  const float d[4] = {1, 2, 3, 4};
  float got[4];
  gcap_tensor *x, *y = NULL;
  gcap_graph *g = NULL;
  gcap_graph_stats st;
  int i;
  if (E == NULL) return;
  x = t_from(E, 1, s, d);
  T_REQUIRE(x != NULL);
  T_SETUP(gcap_graph_new(E, &g) == GCAP_OK, gcap_tensor_free(x));
  T_SETUP(gcap_capture_begin(g, NULL, NULL) == GCAP_OK, (gcap_graph_free(g), gcap_tensor_free(x)));
  T_CHECK_OK(E, gcap_scale(x, 2.0, &y));
  T_CHECK_OK(E, gcap_dist_all_reduce(y, GCAP_REDUCE_SUM, NULL));
  T_CHECK_ST(E, gcap_dist_barrier(E, NULL), GCAP_ECAPTURE);
  T_CHECK_ST(E, gcap_capture_end(g), GCAP_ECAPTURE); /* the barrier invalidated it */
  gcap_tensor_free(y);
  gcap_graph_free(g);
  g = NULL, y = NULL;
  T_SETUP(gcap_graph_new(E, &g) == GCAP_OK, gcap_tensor_free(x));
  T_SETUP(gcap_capture_begin(g, NULL, NULL) == GCAP_OK, (gcap_graph_free(g), gcap_tensor_free(x)));
  T_CHECK_OK(E, gcap_scale(x, 2.0, &y));
  T_CHECK_OK(E, gcap_dist_all_reduce(y, GCAP_REDUCE_SUM, NULL));
  T_CHECK_OK(E, gcap_capture_end(g));
  T_CHECK_OK(E, gcap_graph_get_stats(g, &st));
  T_CHECK(st.nodes >= 1);
  T_CHECK_OK(E, gcap_fill_(x, 5));
  T_CHECK_OK(E, gcap_graph_replay(g));
  T_CHECK(t_read(y, got, 4));
  for (i = 0; i < 4; i++)
    T_CHECK(got[i] == 10);
  gcap_tensor_free(y);
  gcap_graph_free(g);
  gcap_tensor_free(x);
}

static void test_groups(void) {
  const int r0[1] = {0}, bad[2] = {0, 0}, far[1] = {1};
  gcap_dist_group *g = NULL;
  if (E == NULL) return;
  T_CHECK_OK(E, gcap_dist_new_group(E, 1, r0, &g));
  T_CHECK(g != NULL && gcap_dist_group_rank(g) == 0 && gcap_dist_group_size(g) == 1 &&
          gcap_dist_group_ranks(g)[0] == 0);
  T_CHECK_OK(E, gcap_dist_barrier(E, g));
  T_CHECK_ST(E, gcap_dist_new_group(E, 2, bad, &g), GCAP_EINVAL);
  T_CHECK(g == NULL && t_msg_has(E, "new_group: rank 0 is given twice (ranks[1], ranks[2])"));
  T_CHECK_ST(E, gcap_dist_new_group(E, 1, far, &g), GCAP_EINVAL);
  T_CHECK(t_msg_has(E, "new_group: ranks[1] = 1 is out of range (world size 1)"));
  T_CHECK_ST(E, gcap_dist_new_group(E, 0, r0, &g), GCAP_EINVAL);
  T_CHECK_ST(E, gcap_dist_set_debug(E, 1), GCAP_OK);
  T_CHECK_OK(E, gcap_dist_barrier(E, NULL));
  T_CHECK_ST(E, gcap_dist_set_debug(E, 0), GCAP_OK);
}

static void test_finalize(void) {
  const int64_t s[1] = {2};
  const float d[2] = {1, 2};
  gcap_tensor *t;
  if (E == NULL) return;
  t = t_from(E, 1, s, d);
  T_REQUIRE(t != NULL);
  T_CHECK_OK(E, gcap_dist_finalize());
  T_CHECK(!gcap_dist_is_initialized() && gcap_dist_rank() == -1);
  T_CHECK_ST(E, gcap_dist_all_reduce(t, GCAP_REDUCE_SUM, NULL), GCAP_ESTATE);
  T_CHECK(t_msg_has(E, "(it was finalized)"));
  T_CHECK_ST(E, gcap_dist_init(E), GCAP_ESTATE);
  T_CHECK(t_msg_has(E, "init: the distributed runtime was finalized"));
  gcap_tensor_free(t);
}

int main(void) {
  int r;
  E = t_engine();
  T_RUN(test_before_init);
  T_RUN(test_init);
  T_RUN(test_another_engine);
  T_RUN(test_in_place_and_values);
  T_RUN(test_captured);
  T_RUN(test_groups);
  T_RUN(test_finalize);
  r = t_done();
  gcap_engine_free(E); /* finalize released the runtime's reference: this frees it */
  return r;
}
