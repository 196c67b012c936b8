/*
** test_pool.c: private pools and sharing (docs/semantics.md, "Pools and the
** replay-order check"): capture allocations come from the pool, freed blocks
** are reused at once, a shared pool reserves less than separate ones, the
** replay-order check refuses exactly the orders that would read overwritten
** memory, pool statistics, and graphs and pools destroyed during a capture.
*/
#include "t.h"

/* Capture g into pool: out = sum((x * k) * x), through two 4 KiB temporaries. */
static void capture_sum_kxx(gcap_engine *e, gcap_graph *g, gcap_pool *pool, gcap_tensor *x,
                            double k, gcap_tensor **out) {
  gcap_tensor *t = NULL, *u = NULL;
  T_CHECK_OK(e, gcap_capture_begin(g, pool, NULL));
  T_CHECK_OK(e, gcap_scale(x, k, &t));
  T_CHECK_OK(e, gcap_mul(t, x, &u));
  T_CHECK_OK(e, gcap_sum(u, out));
  gcap_tensor_free(t), gcap_tensor_free(u);
  T_CHECK_OK(e, gcap_capture_end(g));
}

static void test_capture_allocates_from_pool(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[1] = {256};
  gcap_tensor *x = NULL, *t = NULL, *u = NULL, *y = NULL;
  gcap_pool *p = NULL;
  gcap_graph *g = NULL;
  gcap_mem_stats e0, e1, p0, p1;
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 1, s, 1.0, &x));
  T_CHECK_OK(e, gcap_pool_new(e, &p));
  T_CHECK_OK(e, gcap_graph_new(e, &g));
  T_CHECK_OK(e, gcap_pool_get_stats(p, &p0));
  T_CHECK(p0.in_use_bytes == 0 && p0.blocks == 0 && p0.graphs == 0);
  T_CHECK_OK(e, gcap_engine_mem_stats(e, &e0));
  T_CHECK_OK(e, gcap_capture_begin(g, p, NULL));
  T_CHECK_OK(e, gcap_scale(x, 2.0, &t));
  uintptr_t pt = gcap_tensor_data_ptr(t);
  gcap_tensor_free(t);
  T_CHECK_OK(e, gcap_scale(x, 3.0, &u)); /* a block freed in capture is reused at once */
  T_CHECK(gcap_tensor_data_ptr(u) == pt);
  T_CHECK_OK(e, gcap_add(u, x, &y));
  T_CHECK(gcap_tensor_data_ptr(y) != pt && gcap_tensor_data_ptr(y) % 256 == 0);
  T_CHECK_OK(e, gcap_capture_end(g));
  T_CHECK_OK(e, gcap_engine_mem_stats(e, &e1));
  T_CHECK(e1.in_use_bytes == e0.in_use_bytes && e1.blocks == e0.blocks); /* nothing outside */
  T_CHECK_OK(e, gcap_pool_get_stats(p, &p1));
  T_CHECK(p1.blocks == 2 && p1.in_use_bytes >= 2 * 1024 && p1.graphs == 1);
  T_CHECK(p1.reserved_bytes >= p1.in_use_bytes && p1.peak_bytes >= p1.in_use_bytes);
  T_CHECK(gcap_graph_pool(g) == p);
  T_CHECK_OK(e, gcap_graph_replay(g));
  T_CHECK(t_value(y) == 4.0);
  gcap_tensor_free(x), gcap_tensor_free(u), gcap_tensor_free(y);
  gcap_graph_free(g);
  gcap_pool_free(p);
  gcap_engine_free(e);
}

static void test_shared_pool_reserves_less(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[1] = {1024};
  gcap_tensor *x = NULL, *oa = NULL, *ob = NULL, *oc = NULL, *od = NULL;
  gcap_pool *pa = NULL, *pb = NULL, *ps = NULL;
  gcap_graph *ga = NULL, *gb = NULL, *gc = NULL, *gd = NULL;
  gcap_mem_stats sa, sb, ss;
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 1, s, 1.0, &x));
  T_CHECK_OK(e, gcap_pool_new(e, &pa));
  T_CHECK_OK(e, gcap_pool_new(e, &pb));
  T_CHECK_OK(e, gcap_pool_new(e, &ps));
  T_CHECK_OK(e, gcap_graph_new(e, &ga));
  T_CHECK_OK(e, gcap_graph_new(e, &gb));
  T_CHECK_OK(e, gcap_graph_new(e, &gc));
  T_CHECK_OK(e, gcap_graph_new(e, &gd));
  capture_sum_kxx(e, ga, pa, x, 2.0, &oa); /* separate pools */
  capture_sum_kxx(e, gb, pb, x, 3.0, &ob);
  capture_sum_kxx(e, gc, ps, x, 2.0, &oc); /* one shared pool, same two graphs */
  capture_sum_kxx(e, gd, ps, x, 3.0, &od);
  T_REQUIRE(oa && ob && oc && od);
  T_CHECK_OK(e, gcap_pool_get_stats(pa, &sa));
  T_CHECK_OK(e, gcap_pool_get_stats(pb, &sb));
  T_CHECK_OK(e, gcap_pool_get_stats(ps, &ss));
  printf("# reserved: shared pool %zu bytes, separate pools %zu + %zu = %zu bytes\n",
         ss.reserved_bytes, sa.reserved_bytes, sb.reserved_bytes,
         sa.reserved_bytes + sb.reserved_bytes);
  T_CHECK(sa.reserved_bytes > 0 && sb.reserved_bytes > 0);
  T_CHECK(ss.reserved_bytes < sa.reserved_bytes + sb.reserved_bytes);
  T_CHECK(ss.graphs == 2 && sa.graphs == 1 && sb.graphs == 1);
  for (int round = 1; round <= 2; round++) { /* capture order, twice, new input */
    T_CHECK_OK(e, gcap_fill_(x, (double)round));
    T_CHECK_OK(e, gcap_graph_replay(gc));
    T_CHECK_OK(e, gcap_graph_replay(gd));
    T_CHECK_OK(e, gcap_graph_replay(ga));
    T_CHECK_OK(e, gcap_graph_replay(gb));
    double xx = 1024.0 * round * round;
    T_CHECK(t_value(oc) == 2.0 * xx && t_value(od) == 3.0 * xx);
    T_CHECK(t_value(oa) == 2.0 * xx && t_value(ob) == 3.0 * xx);
  }
  gcap_tensor_free(x), gcap_tensor_free(oa), gcap_tensor_free(ob), gcap_tensor_free(oc);
  gcap_tensor_free(od);
  gcap_graph_free(ga), gcap_graph_free(gb), gcap_graph_free(gc), gcap_graph_free(gd);
  gcap_pool_free(pa), gcap_pool_free(pb), gcap_pool_free(ps);
  gcap_engine_free(e);
}

/* The canonical case. Shared pool; G1 writes X and keeps it; G3 reads X and
** drops it; G4 allocates a temporary, which gets X's block, and writes it. */
typedef struct canon {
  gcap_engine *e;
  gcap_tensor *x, *y, *w; /* input; G3's output 10 * X; G4's output sum(T) */
  gcap_pool *p;
  gcap_graph *g1, *g3, *g4;
} canon;

#define CK(call)                                                                                   \
  do {                                                                                             \
    if ((call) != GCAP_OK) {                                                                       \
      t_fail_(__FILE__, __LINE__, #call, gcap_errmsg(e));                                          \
      return 0;                                                                                    \
    }                                                                                              \
  } while (0)

/* Build the case into c (c->e set, the rest zero); 0 and the group failed on
** error. With g4_own_pool, G4 captures into a pool of its own instead. */
static int canon_build(canon *c, int g4_own_pool) {
  const int64_t s[1] = {256};
  gcap_engine *e = c->e;
  gcap_tensor *X = NULL, *T = NULL;
  gcap_pool *q = NULL;
  CK(gcap_tensor_full(e, GCAP_F32, 1, s, 1.0, &c->x));
  CK(gcap_pool_new(e, &c->p));
  CK(gcap_graph_new(e, &c->g1));
  CK(gcap_graph_new(e, &c->g3));
  CK(gcap_graph_new(e, &c->g4));
  CK(gcap_graph_set_name(c->g1, "G1"));
  CK(gcap_graph_set_name(c->g3, "G3"));
  CK(gcap_graph_set_name(c->g4, "G4"));
  CK(gcap_capture_begin(c->g1, c->p, NULL));
  CK(gcap_scale(c->x, 2.0, &X)); /* G1 writes X = 2x and keeps it */
  CK(gcap_capture_end(c->g1));
  uintptr_t px = gcap_tensor_data_ptr(X);
  CK(gcap_capture_begin(c->g3, c->p, NULL));
  CK(gcap_scale(X, 10.0, &c->y)); /* G3 reads X ... */
  gcap_tensor_free(X);            /* ... and drops it: its block is free again */
  CK(gcap_capture_end(c->g3));
  if (g4_own_pool) CK(gcap_pool_new(e, &q));
  CK(gcap_capture_begin(c->g4, g4_own_pool ? q : c->p, NULL));
  CK(gcap_tensor_full(e, GCAP_F32, 1, s, 7.0, &T)); /* G4's temporary, written */
  CK(gcap_sum(T, &c->w));
  int reused = gcap_tensor_data_ptr(T) == px;
  gcap_tensor_free(T);
  gcap_pool_free(q); /* G4 keeps its pool */
  CK(gcap_capture_end(c->g4));
  if (reused != !g4_own_pool) {
    t_fail_(__FILE__, __LINE__,
            g4_own_pool ? "G4's temporary is not in X's block"
                        : "G4's temporary took X's freed block",
            NULL);
    return 0;
  }
  return 1;
}

static void canon_free(canon *c) {
  gcap_tensor_free(c->x), gcap_tensor_free(c->y), gcap_tensor_free(c->w);
  gcap_graph_free(c->g1), gcap_graph_free(c->g3), gcap_graph_free(c->g4);
  gcap_pool_free(c->p);
  gcap_engine_free(c->e);
}

static void test_replay_order_check(void) {
  canon c = {0};
  c.e = t_engine();
  T_REQUIRE(c.e != NULL);
  gcap_engine *e = c.e;
  gcap_graph_stats gs;
  T_REQUIRE(canon_build(&c, 0));
  /* Capture order, repeated, and a forward-only repeat of G1: allowed. */
  for (int k = 0; k < 2; k++) {
    T_CHECK_OK(e, gcap_graph_replay(c.g1));
    T_CHECK_OK(e, gcap_graph_replay(c.g3));
    T_CHECK_OK(e, gcap_graph_replay(c.g4));
    T_CHECK(t_value(c.y) == 20.0 && t_value(c.w) == 7.0 * 256);
  }
  T_CHECK_OK(e, gcap_graph_replay(c.g1));
  T_CHECK_OK(e, gcap_graph_replay(c.g1));
  T_CHECK_OK(e, gcap_graph_replay(c.g3));
  T_CHECK(t_value(c.y) == 20.0);
  T_CHECK_OK(e, gcap_graph_replay(c.g4));
  /* G1, G4, G3: G3 would read X after G4 overwrote it. */
  T_CHECK_OK(e, gcap_fill_(c.x, 3.0));
  T_CHECK_OK(e, gcap_graph_replay(c.g1));
  T_CHECK_OK(e, gcap_graph_replay(c.g4));
  T_CHECK_OK(e, gcap_graph_get_stats(c.g3, &gs));
  int64_t before = gs.replays;
  T_CHECK_ST(e, gcap_graph_replay(c.g3), GCAP_EREPLAY);
  T_CHECK(strstr(gcap_errmsg(e), "G3") != NULL && strstr(gcap_errmsg(e), "G4") != NULL);
  printf("#   refused: %s\n", gcap_errmsg(e));
  T_CHECK_OK(e, gcap_graph_get_stats(c.g3, &gs));
  T_CHECK(gs.replays == before);                        /* a refused replay does not count, */
  T_CHECK(t_value(c.y) == 20.0);                        /* and did not run */
  T_CHECK_ST(e, gcap_graph_replay(c.g3), GCAP_EREPLAY); /* still refused */
  /* G1 rewrites X: G3 may read it again. */
  T_CHECK_OK(e, gcap_graph_replay(c.g1));
  T_CHECK_OK(e, gcap_graph_replay(c.g3));
  T_CHECK(t_value(c.y) == 60.0);
  T_CHECK_OK(e, gcap_graph_replay(c.g4));
  T_CHECK_OK(e, gcap_graph_replay(c.g1));
  T_CHECK_OK(e, gcap_graph_replay(c.g3));
  T_CHECK_OK(e, gcap_graph_replay(c.g4));
  T_CHECK(t_value(c.y) == 60.0);
  canon_free(&c);
}

static void test_replay_check_off(void) {
  canon c = {0};
  c.e = t_engine();
  T_REQUIRE(c.e != NULL);
  gcap_engine *e = c.e;
  T_REQUIRE(canon_build(&c, 0));
  gcap_set_replay_check(e, 0);
  T_CHECK_OK(e, gcap_graph_replay(c.g1));
  T_CHECK_OK(e, gcap_graph_replay(c.g4));
  T_CHECK_OK(e, gcap_graph_replay(c.g3)); /* not checked: reads G4's temporary */
  T_CHECK(t_value(c.y) == 70.0);          /* the corruption the check catches */
  gcap_set_replay_check(e, 1);
  T_CHECK_OK(e, gcap_graph_replay(c.g1));
  T_CHECK_OK(e, gcap_graph_replay(c.g3));
  T_CHECK_OK(e, gcap_graph_replay(c.g4));
  T_CHECK(t_value(c.y) == 20.0);
  T_CHECK_OK(e, gcap_graph_replay(c.g1));
  T_CHECK_OK(e, gcap_graph_replay(c.g4));
  T_CHECK_ST(e, gcap_graph_replay(c.g3), GCAP_EREPLAY); /* on again */
  canon_free(&c);
}

/* The same graphs with G4 in a pool of its own: no order can hurt. */
static void test_replay_check_allows_disjoint(void) {
  canon c = {0};
  c.e = t_engine();
  T_REQUIRE(c.e != NULL);
  gcap_engine *e = c.e;
  T_REQUIRE(canon_build(&c, 1));
  T_CHECK_OK(e, gcap_graph_replay(c.g1));
  T_CHECK_OK(e, gcap_graph_replay(c.g4));
  T_CHECK_OK(e, gcap_graph_replay(c.g3));
  T_CHECK(t_value(c.y) == 20.0 && t_value(c.w) == 7.0 * 256);
  T_CHECK_OK(e, gcap_graph_replay(c.g4));
  T_CHECK_OK(e, gcap_graph_replay(c.g3));
  T_CHECK(t_value(c.y) == 20.0);
  canon_free(&c);
}

static void test_pool_stats_and_graph_count(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[1] = {256};
  gcap_tensor *y1 = NULL, *y2 = NULL;
  gcap_pool *p = NULL;
  gcap_graph *g1 = NULL, *g2 = NULL;
  gcap_mem_stats st;
  T_CHECK_OK(e, gcap_pool_new(e, &p));
  T_CHECK(gcap_pool_retain(p) == p);
  gcap_pool_free(p); /* one handle reference left */
  T_CHECK_OK(e, gcap_graph_new(e, &g1));
  T_CHECK_OK(e, gcap_graph_new(e, &g2));
  T_CHECK_OK(e, gcap_capture_begin(g1, p, NULL));
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 1, s, 1.0, &y1));
  T_CHECK_OK(e, gcap_capture_end(g1));
  T_CHECK_OK(e, gcap_capture_begin(g2, p, NULL));
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 1, s, 2.0, &y2));
  T_CHECK_OK(e, gcap_capture_end(g2));
  T_CHECK_OK(e, gcap_pool_get_stats(p, &st));
  T_CHECK(st.graphs == 2 && st.blocks == 2 && st.in_use_bytes >= 2 * 1024);
  T_CHECK(st.reserved_bytes >= st.in_use_bytes && st.peak_bytes >= st.in_use_bytes);
  size_t peak = st.peak_bytes;
  T_CHECK_OK(e, gcap_graph_reset(g1));
  T_CHECK_OK(e, gcap_pool_get_stats(p, &st));
  T_CHECK(st.graphs == 1);
  gcap_graph_free(g2), g2 = NULL;
  T_CHECK_OK(e, gcap_pool_get_stats(p, &st));
  T_CHECK(st.graphs == 0 && st.blocks == 2); /* the outputs are still alive */
  gcap_tensor_free(y1), gcap_tensor_free(y2);
  T_CHECK_OK(e, gcap_pool_get_stats(p, &st));
  T_CHECK(st.in_use_bytes == 0 && st.blocks == 0 && st.peak_bytes == peak);
  gcap_graph_free(g1);
  gcap_pool_free(p);
  gcap_engine_free(e);
}

/* Destroying a graph or releasing a pool while a capture is open is deferred
** until it ends; the capture goes on undisturbed. */
static void test_destroyed_during_capture(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[1] = {4};
  const float dx[4] = {1, 2, 3, 4};
  float r[4];
  gcap_tensor *x = t_from(e, 1, s, dx), *yold = NULL, *y = NULL, *z = NULL;
  gcap_pool *pold = NULL, *p = NULL;
  gcap_graph *gold = NULL, *gempty = NULL, *g = NULL;
  T_REQUIRE(x != NULL);
  T_CHECK_OK(e, gcap_pool_new(e, &pold));
  T_CHECK_OK(e, gcap_pool_new(e, &p));
  T_CHECK_OK(e, gcap_graph_new(e, &gold));
  T_CHECK_OK(e, gcap_graph_new(e, &gempty));
  T_CHECK_OK(e, gcap_graph_new(e, &g));
  T_CHECK_OK(e, gcap_capture_begin(gold, pold, NULL));
  T_CHECK_OK(e, gcap_scale(x, 3.0, &yold));
  T_CHECK_OK(e, gcap_capture_end(gold));
  T_CHECK_OK(e, gcap_graph_replay(gold));

  T_CHECK_OK(e, gcap_capture_begin(g, p, NULL));
  T_CHECK_OK(e, gcap_scale(x, 2.0, &y));
  gcap_graph_free(gold);   /* a captured graph */
  gcap_graph_free(gempty); /* an empty one */
  gcap_pool_free(pold);    /* a pool another graph used */
  gcap_pool_free(p);       /* the handle of the capture's own pool */
  T_CHECK(gcap_is_capturing(e) == 1);
  T_CHECK_OK(e, gcap_add(y, x, &z)); /* still allocates from the capture's pool */
  T_CHECK_OK(e, gcap_capture_end(g));
  T_CHECK_OK(e, gcap_graph_replay(g));
  if (t_read(z, r, 4)) T_CHECK(r[0] == 3 && r[3] == 12);
  if (t_read(yold, r, 4)) T_CHECK(r[0] == 3 && r[3] == 12); /* its memory lives on */
  gcap_mem_stats st;
  T_REQUIRE(gcap_graph_pool(g) != NULL);
  T_CHECK_OK(e, gcap_pool_get_stats(gcap_graph_pool(g), &st));
  T_CHECK(st.graphs == 1 && st.blocks == 2);
  gcap_tensor_free(x), gcap_tensor_free(yold), gcap_tensor_free(y), gcap_tensor_free(z);
  gcap_graph_free(g);
  gcap_engine_free(e);
}

/* regression: a graph freed during its own capture left the engine capturing */
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

int main(void) {
  T_RUN(test_capture_allocates_from_pool);
  T_RUN(test_shared_pool_reserves_less);
  T_RUN(test_replay_order_check);
  T_RUN(test_replay_check_off);
  T_RUN(test_replay_check_allows_disjoint);
  T_RUN(test_pool_stats_and_graph_count);
  T_RUN(test_destroyed_during_capture);
  T_RUN(test_graph_freed_during_its_capture);
  return t_done();
}
