/*
** test_observe.c: what a host sees of its work. gcap_errmsg follows the most
** recent call (a successful call leaves ""); graphs dumped as Graphviz DOT;
** traces of make_graphed_callables as Chrome trace-event JSON.
*/
#include <stdint.h>
#include <unistd.h>

#include "t.h"

/* ------------------------------------------------------------------------ */
/* gcap_errmsg follows the most recent call                                  */

/* Leave an error in e's message: a view with the wrong element count. */
static int provoke(gcap_engine *e, gcap_tensor *t) {
  const int64_t bad[1] = {999};
  gcap_tensor *v = NULL;
  return gcap_tensor_view(t, 1, bad, &v) != GCAP_OK && gcap_errmsg(e)[0] != '\0';
}

/* After an error, `call` must succeed and leave gcap_errmsg(e) empty. */
static gcap_status nop_hook(void *ud, gcap_module *m, const gcap_hook_args *a) {
  (void)ud, (void)m, (void)a;
  return GCAP_OK;
}

#define T_CLEARS(e, t, call)                                                                       \
  do {                                                                                             \
    T_CHECK(provoke(e, t));                                                                        \
    T_CHECK_ST(e, call, GCAP_OK);                                                                  \
    if (gcap_errmsg(e)[0] != '\0') T_FAILF(#call, "left the message '%s'", gcap_errmsg(e));        \
  } while (0)

static void test_errmsg_follows_last_call(void) {
  gcap_engine *e = t_engine();
  const int64_t s2[2] = {2, 3}, s1[1] = {2}, sw[2] = {3, 3};
  const float d[9] = {1, -2, 3, -4, 5, -6, 7, -8, 9}, tg[2] = {0, 2};
  gcap_tensor *x = NULL, *w = NULL, *b = NULL, *tgt = NULL, *r[32] = {NULL};
  gcap_module *lin = NULL, *ln = NULL, *dr = NULL, *seq = NULL;
  gcap_optim *o1 = NULL, *o2 = NULL;
  gcap_pool *pool = NULL;
  gcap_graph *g = NULL;
  gcap_mem_stats ms;
  gcap_graph_stats gs;
  int i, n = 0, id = -1;
  T_REQUIRE(e != NULL);
  x = t_from(e, 2, s2, d);
  w = t_from(e, 2, sw, d);
  tgt = t_from(e, 1, s1, tg);
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 1, sw, 0.5, &b));
  T_CHECK_OK(e, gcap_pool_new(e, &pool));
  T_CHECK_OK(e, gcap_graph_new(e, &g));
  T_CHECK_OK(e, gcap_nn_linear(e, 3, 3, 1, 0, &lin));
  T_CLEARS(e, x, gcap_add(x, x, &r[n++]));
  T_CLEARS(e, x, gcap_sub(x, x, &r[n++]));
  T_CLEARS(e, x, gcap_mul(x, x, &r[n++]));
  T_CLEARS(e, x, gcap_scale(x, 2.0, &r[n++]));
  T_CLEARS(e, x, gcap_neg(x, &r[n++]));
  T_CLEARS(e, x, gcap_sum(x, &r[n++]));
  T_CLEARS(e, x, gcap_mean(x, &r[n++]));
  T_CLEARS(e, x, gcap_matmul(x, w, &r[n++]));
  T_CLEARS(e, x, gcap_linear(x, w, b, &r[n++]));
  T_CLEARS(e, x, gcap_linear_gelu(x, w, b, &r[n++]));
  T_CLEARS(e, x, gcap_relu(x, &r[n++]));
  T_CLEARS(e, x, gcap_gelu(x, &r[n++]));
  T_CLEARS(e, x, gcap_layer_norm(x, NULL, NULL, 1e-5, &r[n++]));
  T_CLEARS(e, x, gcap_softmax(x, -1, &r[n++]));
  T_CLEARS(e, x, gcap_dropout(x, 0.5, 1, &r[n++]));
  T_CLEARS(e, x, gcap_mse_loss(x, x, &r[n++]));
  T_CLEARS(e, x, gcap_cross_entropy(x, tgt, &r[n++]));
  T_CLEARS(e, x, gcap_pool_get_stats(pool, &ms));
  T_CLEARS(e, x, gcap_engine_mem_stats(e, &ms));
  T_CLEARS(e, x, gcap_graph_set_name(g, "named"));
  T_CLEARS(e, x, gcap_graph_get_stats(g, &gs));
  T_CLEARS(e, x, gcap_nn_layer_norm(e, 3, 1e-5, &ln));
  T_CLEARS(e, x, gcap_nn_dropout(e, 0.1, &dr));
  T_CLEARS(e, x, gcap_nn_sequential(e, 1, &ln, &seq));
  T_CLEARS(e, x, gcap_optim_sgd(e, 1, &w, 0.1, 0, 0, &o1));
  T_CLEARS(e, x, gcap_optim_adam(e, 1, &w, 0.1, 0.9, 0.999, 1e-8, 0, &o2));
  T_CLEARS(e, x, gcap_tensor_set_requires_grad(w, 1));
  T_CLEARS(e, x, gcap_tensor_detach(x, &r[n++]));
  T_CLEARS(e, x, gcap_tensor_clone(x, &r[n++]));
  T_CLEARS(e, x, gcap_copy_(r[n - 1], x));
  T_CLEARS(e, x, gcap_fill_(r[n - 1], 1.0));
  T_CLEARS(e, x, gcap_set_current_stream(e, NULL));
  T_CLEARS(e, x, gcap_synchronize(e));
  T_CLEARS(e, x, gcap_manual_seed(e, 7));
  T_CLEARS(e, x, gcap_module_call(lin, 1, &x, &r[n++]));
  T_CLEARS(e, x, gcap_backward(r[n - 1], r[n - 1], 0));
  T_CLEARS(e, x, gcap_module_zero_grad(lin, 1));
  T_CLEARS(e, x, gcap_module_backward_dw(lin));
  T_CLEARS(e, x, gcap_capture_begin(g, pool, NULL));
  T_CHECK_OK(e, gcap_scale(x, 2.0, &r[n++]));
  T_CHECK_OK(e, gcap_capture_end(g));
  T_CLEARS(e, x, gcap_graph_replay(g));
  T_CLEARS(e, x, gcap_graph_reset(g));
  T_CHECK_OK(e, gcap_module_register_hook(lin, GCAP_HOOK_FORWARD, nop_hook, NULL, NULL, &id));
  T_CLEARS(e, x, gcap_module_remove_hook(lin, id));
  for (i = 0; i < n; i++)
    gcap_tensor_free(r[i]);
  gcap_optim_free(o1);
  gcap_optim_free(o2);
  gcap_module_free(seq);
  gcap_module_free(dr);
  gcap_module_free(ln);
  gcap_module_free(lin);
  gcap_graph_free(g);
  gcap_pool_free(pool);
  gcap_tensor_free(tgt);
  gcap_tensor_free(b);
  gcap_tensor_free(w);
  gcap_tensor_free(x);
  gcap_engine_free(e);
}

/* ------------------------------------------------------------------------ */
/* DOT dumps and traces                                                      */

/* The contents of the file at path (malloc'd, NUL-terminated), or NULL. */
static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  char *s = NULL;
  long n;
  if (f == NULL) return NULL;
  if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
      (s = malloc((size_t)n + 1)) != NULL) {
    s[fread(s, 1, (size_t)n, f)] = '\0';
  }
  fclose(f);
  return s;
}

static void test_graph_debug_dump(void) {
  gcap_engine *e = t_engine();
  const int64_t shape[1] = {4};
  gcap_tensor *x = NULL, *y = NULL;
  gcap_graph *g = NULL;
  char path[64], *text;
  T_REQUIRE(e != NULL);
  snprintf(path, sizeof path, "/tmp/graphcap-dump-%d.dot", (int)getpid());
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 1, shape, 1.0, &x));
  T_CHECK_OK(e, gcap_graph_new(e, &g));
  T_CHECK_ST(e, gcap_graph_debug_dump(g, path), GCAP_ESTATE);
  T_CHECK(t_msg_has(e, "not captured"));
  T_CHECK_OK(e, gcap_capture_begin(g, NULL, NULL));
  T_CHECK_ST(e, gcap_graph_debug_dump(g, path), GCAP_ESTATE); /* still capturing */
  T_CHECK(t_msg_has(e, "still open"));
  T_CHECK_OK(e, gcap_scale(x, 3.0, &y));
  T_CHECK_OK(e, gcap_capture_end(g));
  T_CHECK_ST(e, gcap_graph_debug_dump(g, "/nonexistent-dir/g.dot"), GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "/nonexistent-dir/g.dot") && t_msg_has(e, "No such file"));
  T_CHECK_ST(e, gcap_graph_debug_dump(g, NULL), GCAP_EINVAL);
  T_CHECK_OK(e, gcap_graph_debug_dump(g, path));
  T_CHECK(gcap_errmsg(e)[0] == '\0');
  text = slurp(path);
  T_CHECK(text != NULL && strstr(text, "digraph") != NULL);
  if (text && t_device() == GCAP_DEVICE_HOST) T_CHECK(strstr(text, "#0 scale") != NULL);
  free(text);
  remove(path);
  gcap_tensor_free(y);
  gcap_tensor_free(x);
  gcap_graph_free(g);
  gcap_engine_free(e);
}

/* A trace left open is completed by gcap_engine_free. */
static void test_trace_closed_by_engine_free(void) {
  gcap_engine *e = t_engine();
  const int64_t shape[1] = {4};
  gcap_tensor *x = NULL, *y = NULL;
  gcap_graph *g = NULL;
  const char *head = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[";
  char path[64], *text;
  size_t n;
  T_REQUIRE(e != NULL);
  snprintf(path, sizeof path, "/tmp/graphcap-trace-%d.json", (int)getpid());
  T_CHECK_ST(e, gcap_trace_start(e, "/nonexistent-dir/t.json"), GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "/nonexistent-dir/t.json"));
  T_CHECK_OK(e, gcap_trace_start(e, path));
  T_CHECK_ST(e, gcap_trace_start(e, path), GCAP_ESTATE);
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 1, shape, 1.0, &x));
  T_CHECK_OK(e, gcap_graph_new(e, &g));
  T_CHECK_OK(e, gcap_graph_set_name(g, "tab\there"));
  T_CHECK_OK(e, gcap_capture_begin(g, NULL, NULL));
  T_CHECK_OK(e, gcap_scale(x, 3.0, &y));
  T_CHECK_OK(e, gcap_capture_end(g));
  T_CHECK_OK(e, gcap_graph_replay(g));
  gcap_tensor_free(y);
  gcap_tensor_free(x);
  gcap_graph_free(g);
  gcap_engine_free(e); /* no gcap_trace_stop */
  text = slurp(path);
  T_REQUIRE(text != NULL);
  n = strlen(text);
  T_CHECK(strncmp(text, head, strlen(head)) == 0);
  T_CHECK(n > 4 && strcmp(text + n - 4, "\n]}\n") == 0);
  T_CHECK(strstr(text, "\"name\":\"capture tab\\u0009here\",\"cat\":\"capture\",\"ph\":\"X\"") !=
          NULL);
  T_CHECK(strstr(text, "\"name\":\"replay tab\\u0009here\"") != NULL);
  free(text);
  remove(path);
}

/* ------------------------------------------------------------------------ */
/* Progress                                                                  */

typedef struct prog_log {
  int warm, cap, stop_at_capture; /* passes seen; stop at this capture pass (0: never) */
} prog_log;

static gcap_status log_progress(void *ud, const char *phase, int done, int total) {
  prog_log *l = (prog_log *)ud;
  (void)total;
  if (strcmp(phase, "warmup") == 0) l->warm = done;
  if (strcmp(phase, "capture") == 0) l->cap = done;
  return l->cap != 0 && l->cap == l->stop_at_capture ? GCAP_EABORTED : GCAP_OK;
}

/* Every pass is reported; a callback's non-OK status stops the call, which
** leaves nothing graphed. */
static void test_progress_stops_the_call(void) {
  gcap_engine *e = t_engine();
  const int64_t shape[2] = {2, 4};
  gcap_module *m = NULL;
  gcap_tensor *x = NULL, *y = NULL, *args[1];
  gcap_graphed *G = NULL;
  gcap_graphed_opts o;
  prog_log log = {0, 0, 0};
  const int nargs[1] = {1};
  gcap_tensor *const *argv[1] = {args};
  T_REQUIRE(e != NULL);
  T_CHECK_OK(e, gcap_nn_linear(e, 4, 4, 1, 0, &m));
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 2, shape, 1.0, &x));
  T_CHECK_OK(e, gcap_tensor_set_requires_grad(x, 1));
  args[0] = x;
  gcap_graphed_opts_init(&o);
  o.num_warmup_iters = 2;
  o.progress = log_progress;
  o.progress_ud = &log;
  T_CHECK_OK(e, gcap_make_graphed_callables(e, 1, &m, 1, nargs, argv, &o, &G));
  T_CHECK(log.warm == 4 && log.cap == 2);
  gcap_graphed_free(G);
  G = NULL;
  log.warm = log.cap = 0;
  log.stop_at_capture = 1;
  T_CHECK_ST(e, gcap_make_graphed_callables(e, 1, &m, 1, nargs, argv, &o, &G), GCAP_EABORTED);
  T_CHECK(G == NULL && log.cap == 1);
  T_CHECK(t_msg_has(e, "the progress callback stopped the capture at 1 of 2"));
  T_CHECK_OK(e, gcap_module_call(m, 1, &x, &y)); /* m runs eagerly: not graphed */
  T_CHECK(gcap_tensor_grad_fn_name(y) != NULL &&
          strcmp(gcap_tensor_grad_fn_name(y), "graphed") != 0);
  gcap_tensor_free(y);
  gcap_tensor_free(x);
  gcap_module_free(m);
  gcap_engine_free(e);
}

int main(void) {
  T_RUN(test_errmsg_follows_last_call);
  T_RUN(test_graph_debug_dump);
  T_RUN(test_trace_closed_by_engine_free);
  T_RUN(test_progress_stops_the_call);
  return t_done();
}
