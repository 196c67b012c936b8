/*
** test_replay_check.c: what replay and capture_end accept and refuse (review
** regressions): only real writes count for the shared-pool replay check (a
** failed capture, or one never replayed, overwrote nothing); a stream joined
** back through another stream of the capture is joined; a pipeline with
** reuse_graph_input_output_buffers replays in its captured order with the
** eager grads and is refused (GCAP_EREPLAY) in another order; order entries
** far out of range are refused naming their position.
*/
#include "t.h"

/* ------------------------------------------------------------------------ */
/* The replay check counts real writes only                                  */

/* In pool p: g1 writes y = 2x, g2 reads y into z = 3y; both replayed. */
typedef struct chk {
  gcap_engine *e;
  gcap_pool *p;
  gcap_graph *g1, *g2, *g3;
  gcap_tensor *x, *y, *z;
} chk;

static int chk_open(chk *c) {
  const int64_t s[1] = {4};
  const float dx[4] = {1, 2, 3, 4};
  memset(c, 0, sizeof *c);
  if ((c->e = t_engine()) == NULL) return 0;
  gcap_engine *e = c->e;
  if ((c->x = t_from(e, 1, s, dx)) == NULL) return 0;
  T_CHECK_ST(e, gcap_pool_new(e, &c->p), GCAP_OK);
  T_CHECK_ST(e, gcap_graph_new(e, &c->g1), GCAP_OK);
  T_CHECK_ST(e, gcap_graph_new(e, &c->g2), GCAP_OK);
  T_CHECK_ST(e, gcap_graph_new(e, &c->g3), GCAP_OK);
  T_CHECK_ST(e, gcap_capture_begin(c->g1, c->p, NULL), GCAP_OK);
  T_CHECK_ST(e, gcap_scale(c->x, 2.0, &c->y), GCAP_OK);
  T_CHECK_ST(e, gcap_capture_end(c->g1), GCAP_OK);
  T_CHECK_ST(e, gcap_capture_begin(c->g2, c->p, NULL), GCAP_OK);
  T_CHECK_ST(e, gcap_scale(c->y, 3.0, &c->z), GCAP_OK);
  T_CHECK_ST(e, gcap_capture_end(c->g2), GCAP_OK);
  T_CHECK_ST(e, gcap_graph_replay(c->g1), GCAP_OK);
  T_CHECK_ST(e, gcap_graph_replay(c->g2), GCAP_OK);
  T_CHECK_ST(e, gcap_graph_replay(c->g1), GCAP_OK); /* y = 2x again */
  return c->y != NULL && c->z != NULL && gcap_graph_is_captured(c->g2);
}

static void chk_close(chk *c) {
  gcap_tensor_free(c->x), gcap_tensor_free(c->y), gcap_tensor_free(c->z);
  gcap_graph_free(c->g1), gcap_graph_free(c->g2), gcap_graph_free(c->g3);
  gcap_pool_free(c->p);
  gcap_engine_free(c->e);
}

/* y holds g1's values and g2 replays from them: z = 6x. */
static void chk_g2_replays(chk *c) {
  float r[4];
  if (t_read(c->y, r, 4)) T_CHECK(r[0] == 2 && r[1] == 4 && r[2] == 6 && r[3] == 8);
  T_CHECK_ST(c->e, gcap_graph_replay(c->g2), GCAP_OK);
  if (t_read(c->z, r, 4)) T_CHECK(r[0] == 6 && r[1] == 12 && r[2] == 18 && r[3] == 24);
}

/* g3's capture writes y and is invalidated (a synchronize): it wrote nothing,
** g2 still replays; the same g3 captured again and replayed is a real write
** of y, and g2 is refused. */
static void test_failed_capture_writes_nothing(void) {
  chk c;
  T_SETUP(chk_open(&c), chk_close(&c));
  gcap_engine *e = c.e;
  T_CHECK_OK(e, gcap_capture_begin(c.g3, c.p, NULL));
  T_CHECK_OK(e, gcap_fill_(c.y, 100.0));
  T_CHECK_ST(e, gcap_synchronize(e), GCAP_ECAPTURE); /* forbidden: invalidates */
  T_CHECK_ST(e, gcap_capture_end(c.g3), GCAP_ECAPTURE);
  T_CHECK(gcap_graph_is_captured(c.g3) == 0);
  chk_g2_replays(&c);
  T_CHECK_OK(e, gcap_capture_begin(c.g3, c.p, NULL)); /* the check is still on */
  T_CHECK_OK(e, gcap_fill_(c.y, 100.0));
  T_CHECK_OK(e, gcap_capture_end(c.g3));
  T_CHECK_OK(e, gcap_graph_replay(c.g3));
  T_CHECK_ST(e, gcap_graph_replay(c.g2), GCAP_EREPLAY);
  T_CHECK_OK(e, gcap_graph_replay(c.g1));
  chk_g2_replays(&c);
  chk_close(&c);
}

/* A failed capture leaves the producers of later captures alone: g3 wrote
** y before failing, so g4, captured next and reading y, still gets y from
** g1, and replays after g1. */
static void test_failed_capture_keeps_producers(void) {
  chk c;
  gcap_graph *g4 = NULL;
  gcap_tensor *w = NULL;
  T_SETUP(chk_open(&c), chk_close(&c));
  gcap_engine *e = c.e;
  T_CHECK_OK(e, gcap_capture_begin(c.g3, c.p, NULL));
  T_CHECK_OK(e, gcap_fill_(c.y, 100.0));
  T_CHECK_OK(e, gcap_fill_(c.z, 100.0));
  T_CHECK_ST(e, gcap_synchronize(e), GCAP_ECAPTURE); /* forbidden: invalidates */
  T_CHECK_ST(e, gcap_capture_end(c.g3), GCAP_ECAPTURE);
  T_CHECK_OK(e, gcap_graph_new(e, &g4));
  T_CHECK_OK(e, gcap_capture_begin(g4, c.p, NULL));
  T_CHECK_OK(e, gcap_scale(c.y, 0.5, &w));
  T_CHECK_OK(e, gcap_capture_end(g4));
  T_CHECK_OK(e, gcap_graph_replay(c.g1));
  T_CHECK_OK(e, gcap_graph_replay(g4));
  float r[4];
  if (t_read(w, r, 4)) T_CHECK(r[0] == 1 && r[1] == 2 && r[2] == 3 && r[3] == 4);
  gcap_tensor_free(w);
  gcap_graph_free(g4);
  chk_close(&c);
}

/* g3's capture writes y and succeeds, but g3 never replays: g2 replays while
** g3 lives and after g3 is freed. */
static void test_unreplayed_capture_writes_nothing(void) {
  chk c;
  T_SETUP(chk_open(&c), chk_close(&c));
  gcap_engine *e = c.e;
  T_CHECK_OK(e, gcap_capture_begin(c.g3, c.p, NULL));
  T_CHECK_OK(e, gcap_fill_(c.y, 100.0));
  T_CHECK_OK(e, gcap_capture_end(c.g3));
  chk_g2_replays(&c);
  gcap_graph_free(c.g3), c.g3 = NULL; /* never replayed */
  chk_g2_replays(&c);
  chk_close(&c);
}

/* ------------------------------------------------------------------------ */
/* Joins through other capture streams                                        */

/* s1 and s2 fork from the origin; s1 waits for s2, the origin waits for s1:
** s2 is joined through s1 (CUDA accepts this), and the graph replays. */
static void test_join_through_another_stream(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[1] = {4};
  const float dx[4] = {1, 2, 3, 4};
  float r[4];
  gcap_tensor *x = t_from(e, 1, s, dx), *t = NULL, *u = NULL, *w = NULL;
  gcap_stream *s1 = NULL, *s2 = NULL;
  gcap_event *ev0 = NULL, *ev1 = NULL, *ev2 = NULL;
  gcap_graph *g = NULL;
  T_REQUIRE(x != NULL);
  T_CHECK_OK(e, gcap_stream_new(e, &s1));
  T_CHECK_OK(e, gcap_stream_new(e, &s2));
  T_CHECK_OK(e, gcap_event_new(e, &ev0));
  T_CHECK_OK(e, gcap_event_new(e, &ev1));
  T_CHECK_OK(e, gcap_event_new(e, &ev2));
  T_CHECK_OK(e, gcap_graph_new(e, &g));
  T_CHECK_OK(e, gcap_capture_begin(g, NULL, NULL));
  gcap_stream *origin = gcap_current_stream(e);
  T_CHECK_OK(e, gcap_event_record(ev0, origin));
  T_CHECK_OK(e, gcap_stream_wait_event(s1, ev0)); /* fork s1 */
  T_CHECK_OK(e, gcap_stream_wait_event(s2, ev0)); /* fork s2 */
  T_CHECK_OK(e, gcap_set_current_stream(e, s2));
  T_CHECK_OK(e, gcap_scale(x, 3.0, &t)); /* s2's work */
  T_CHECK_OK(e, gcap_event_record(ev2, s2));
  T_CHECK_OK(e, gcap_stream_wait_event(s1, ev2)); /* s1 joins s2 */
  T_CHECK_OK(e, gcap_set_current_stream(e, s1));
  T_CHECK_OK(e, gcap_add(t, x, &u)); /* s1's work, after s2's */
  T_CHECK_OK(e, gcap_event_record(ev1, s1));
  T_CHECK_OK(e, gcap_stream_wait_event(origin, ev1)); /* the origin joins s1, so s2 */
  T_CHECK_OK(e, gcap_set_current_stream(e, origin));
  T_CHECK_OK(e, gcap_sub(u, x, &w));
  T_CHECK_OK(e, gcap_capture_end(g));
  T_CHECK(gcap_graph_is_captured(g) == 1 && gcap_is_capturing(e) == 0);
  T_CHECK_OK(e, gcap_graph_replay(g));
  if (t_read(w, r, 4)) T_CHECK(r[0] == 3 && r[1] == 6 && r[3] == 12);
  T_CHECK_OK(e, gcap_fill_(x, -2.0));
  T_CHECK_OK(e, gcap_graph_replay(g));
  if (t_read(w, r, 4)) T_CHECK(r[0] == -6 && r[3] == -6);
  if (t_read(u, r, 4)) T_CHECK(r[0] == -8 && r[3] == -8); /* both side streams ran */
  gcap_tensor_free(x), gcap_tensor_free(t), gcap_tensor_free(u), gcap_tensor_free(w);
  gcap_event_free(ev0), gcap_event_free(ev1), gcap_event_free(ev2);
  gcap_graph_free(g);
  gcap_stream_free(s1), gcap_stream_free(s2);
  gcap_engine_free(e);
}

/* ------------------------------------------------------------------------ */
/* A pipeline with reused graph buffers replays in its captured order only    */

enum { MB = 3, NPOS = 12, NGRAD = 40 }; /* microbatches; order length; 2 x (4x4 + 4) */

/* 1F1B-like, as captured; and GPipe-like: all forwards, then all backwards. */
static const double captured_order[NPOS] = {1, 2, 1, 2, -2, -1, 1, 2, -2, -1, -2, -1};
static const double all_fwd_then_bwd[NPOS] = {1, 2, 1, 2, 1, 2, -2, -1, -2, -1, -2, -1};

/* Chunk c (0 or 1) of microbatch b: eagerly (G NULL) or entry c*MB + b of G. */
typedef struct pipe {
  gcap_module *l[2];
  gcap_graphed *G;
} pipe;

static gcap_status pipe_call(pipe *p, int c, int b, gcap_tensor *in, gcap_tensor **out) {
  return p->G ? gcap_graphed_call(p->G, c * MB + b, 1, &in, out)
              : gcap_module_call(p->l[c], 1, &in, out);
}

/* Walk an order. Chunk 1's output is cloned (replay outputs live until the
** next replay) and detached into chunk 2's input; chunk 2's backward starts
** from sum(out); chunk 1's from the grad of its detached output. Stops at the
** first error, which it returns. */
static gcap_status pipe_walk(pipe *p, const double *order, gcap_tensor *const *x) {
  gcap_tensor *y[MB] = {0}, *yd[MB] = {0}, *z[MB] = {0}, *t = NULL;
  int fw[2] = {0, 0}, bw[2] = {0, 0};
  gcap_status st = GCAP_OK;
  for (int k = 0; k < NPOS && st == GCAP_OK; k++) {
    int c = (int)fabs(order[k]) - 1;
    if (order[k] > 0) {
      int b = fw[c]++;
      if (c == 0) {
        if ((st = pipe_call(p, 0, b, x[b], &y[b])) == GCAP_OK &&
            (st = gcap_tensor_clone(y[b], &t)) == GCAP_OK &&
            (st = gcap_tensor_detach(t, &yd[b])) == GCAP_OK)
          st = gcap_tensor_set_requires_grad(yd[b], 1);
      } else if ((st = pipe_call(p, 1, b, yd[b], &t)) == GCAP_OK)
        st = gcap_sum(t, &z[b]);
    } else {
      int b = bw[c]++;
      if (c == 1)
        st = gcap_backward(z[b], NULL, 0);
      else if ((st = gcap_tensor_clone(gcap_tensor_grad(yd[b]), &t)) == GCAP_OK)
        st = gcap_backward(y[b], t, 0);
    }
    gcap_tensor_free(t), t = NULL;
  }
  for (int b = 0; b < MB; b++)
    gcap_tensor_free(y[b]), gcap_tensor_free(yd[b]), gcap_tensor_free(z[b]);
  return st;
}

/* The .grad of every parameter of both chunks, in order, into g[NGRAD]. */
static int pipe_grads(pipe *p, float *g) {
  int n = 0;
  for (int c = 0; c < 2; c++)
    for (int k = 0; k < gcap_module_num_parameters(p->l[c]); k++) {
      gcap_tensor *w = gcap_module_parameter(p->l[c], k, NULL, 0);
      int64_t ne = gcap_tensor_numel(w);
      if (n + ne > NGRAD || gcap_tensor_grad(w) == NULL ||
          !t_read(gcap_tensor_grad(w), g + n, (size_t)ne))
        return 0;
      n += (int)ne;
    }
  return n == NGRAD;
}

/* The grads equal the eager ones (up to rounding on a device); the worst
** element is named. */
static void check_grads(pipe *p, const float *eager) {
  float got[NGRAD];
  int worst = 0;
  if (!pipe_grads(p, got)) {
    T_CHECK(!"every parameter has a grad");
    return;
  }
  for (int i = 1; i < NGRAD; i++)
    if (fabsf(got[i] - eager[i]) > fabsf(got[worst] - eager[worst])) worst = i;
  T_CHECK_NEAR(got[worst], eager[worst], 1e-6, 1e-5);
}

static void test_reuse_replays_in_captured_order_only(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[2] = {2, 4};
  float eager[NGRAD];
  pipe p = {{NULL, NULL}, NULL};
  gcap_tensor *x[MB] = {0}, *sx[2 * MB] = {0};
  gcap_tensor *const *args[2 * MB];
  int nargs[2 * MB];
  gcap_graphed_opts o;
  T_CHECK_OK(e, gcap_manual_seed(e, 7));
  T_CHECK_OK(e, gcap_nn_linear(e, 4, 4, 1, 0, &p.l[0]));
  T_CHECK_OK(e, gcap_nn_linear(e, 4, 4, 1, 0, &p.l[1]));
  for (int b = 0; b < MB; b++)
    T_CHECK_OK(e, gcap_tensor_rand(e, GCAP_F32, 2, s, 1, &x[b]));
  T_CHECK_OK(e, pipe_walk(&p, captured_order, x)); /* the eager reference */
  T_REQUIRE(pipe_grads(&p, eager));
  for (int i = 0; i < 2 * MB; i++) {
    T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 2, s, 0.0, &sx[i]));
    T_CHECK_OK(e, gcap_tensor_set_requires_grad(sx[i], 1));
    args[i] = &sx[i], nargs[i] = 1;
  }
  gcap_graphed_opts_init(&o);
  o.order = captured_order, o.order_len = NPOS;
  o.reuse_graph_input_output_buffers = 1;
  T_CHECK_OK(e, gcap_make_graphed_callables(e, 2, p.l, 2 * MB, nargs, args, &o, &p.G));
  for (int it = 0; it < 2; it++) { /* the captured order: the eager grads */
    T_CHECK_OK(e, gcap_module_zero_grad(p.l[0], 1));
    T_CHECK_OK(e, gcap_module_zero_grad(p.l[1], 1));
    T_CHECK_OK(e, pipe_walk(&p, captured_order, x));
    check_grads(&p, eager);
  }
  /* All forwards first: the third forward of chunk 1 would overwrite the
  ** static input chunk 2's first backward still needs. */
  T_CHECK_OK(e, gcap_module_zero_grad(p.l[0], 1));
  T_CHECK_OK(e, gcap_module_zero_grad(p.l[1], 1));
  T_CHECK_ST(e, pipe_walk(&p, all_fwd_then_bwd, x), GCAP_EREPLAY);
  T_CHECK(strlen(gcap_errmsg(e)) > 0);
  /* The refusal changed nothing: the captured order still gives the eager grads. */
  T_CHECK_OK(e, gcap_module_zero_grad(p.l[0], 1));
  T_CHECK_OK(e, gcap_module_zero_grad(p.l[1], 1));
  T_CHECK_OK(e, pipe_walk(&p, captured_order, x));
  check_grads(&p, eager);
  gcap_graphed_free(p.G);
  for (int i = 0; i < 2 * MB; i++)
    gcap_tensor_free(sx[i]);
  for (int b = 0; b < MB; b++)
    gcap_tensor_free(x[b]);
  gcap_module_free(p.l[0]), gcap_module_free(p.l[1]);
  gcap_engine_free(e);
}

/* ------------------------------------------------------------------------ */
/* Order entries out of any integer range                                    */

static void test_order_entry_out_of_range(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[2] = {2, 4};
  static const double o1[2] = {1e10, -1e10}, o2[2] = {1, -1e10}, o3[4] = {1, -1, 1e10, -1e10},
                      o4[4] = {1, 2147483648.0, -2147483648.0, -1};
  static const struct {
    const double *order;
    int len;
    const char *pos;
  } cases[4] = {{o1, 2, "position 1 "},
                {o2, 2, "position 2 "},
                {o3, 4, "position 3 "},
                {o4, 4, "position 2 "}};
  gcap_module *m = NULL;
  gcap_tensor *x = NULL;
  T_CHECK_OK(e, gcap_nn_linear(e, 4, 4, 1, 0, &m));
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 2, s, 1.0, &x));
  gcap_tensor *const a0[1] = {x};
  gcap_tensor *const *args[1] = {a0};
  const int nargs[1] = {1};
  for (int i = 0; i < 4; i++) {
    gcap_graphed_opts o;
    gcap_graphed *G = (gcap_graphed *)(uintptr_t)0x10; /* must come back NULL */
    gcap_graphed_opts_init(&o);
    o.order = cases[i].order, o.order_len = cases[i].len;
    T_CHECK_ST(e, gcap_make_graphed_callables(e, 1, &m, 1, nargs, args, &o, &G), GCAP_EINVAL);
    T_CHECK(G == NULL);
    T_CHECK(t_msg_has(e, cases[i].pos));
    if (!t_msg_has(e, cases[i].pos)) printf("#   case %d: %s\n", i + 1, gcap_errmsg(e));
  }
  gcap_tensor_free(x);
  gcap_module_free(m);
  gcap_engine_free(e);
}

int main(void) {
  T_RUN(test_failed_capture_writes_nothing);
  T_RUN(test_failed_capture_keeps_producers);
  T_RUN(test_unreplayed_capture_writes_nothing);
  T_RUN(test_join_through_another_stream);
  T_RUN(test_reuse_replays_in_captured_order_only);
  T_RUN(test_order_entry_out_of_range);
  return t_done();
}
