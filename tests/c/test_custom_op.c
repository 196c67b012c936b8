/*
** test_custom_op.c: custom ops (graphcap.h, "Custom ops"). The op under
** test reverses the rows of a matrix: row copies, which the host callback
** makes with memcpy and the cuda callback with cudaMemcpyAsync on the
** stream it is given, and its backward is the same op on the grad. It is
** checked eagerly, captured and replayed with new inputs, with its backward
** captured; its ud lives while a graph holds it; failing callbacks (eager,
** in a capture, at a host replay) and bad calls are errors naming the op;
** the replay check names a custom op and gcap_note_access's work.
*/
#include "t.h"

/* The cuda runtime's copy, present when the cuda backend is built in (the
** library links it); NULL otherwise. */
extern int cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, void *stream)
    __attribute__((weak));
extern int cudaStreamSynchronize(void *stream) __attribute__((weak));
#define T_D2D 3 /* cudaMemcpyDeviceToDevice */

typedef struct rev_ud {
  int fail;             /* the callbacks return GCAP_EDEVICE */
  int sync;             /* the cuda callback synchronizes its stream (forbidden in capture) */
  int calls;            /* host callback calls */
  int *freed;           /* incremented by the destructor */
  gcap_custom_op *self; /* for the backward: the same op */
} rev_ud;

/* out[0] = in[0] with its rows (first dimension) in reverse order */
static gcap_status rev_host(void *ud, void *stream, int nin, const gcap_custom_arg *in, int nout,
                            const gcap_custom_arg *out) {
  rev_ud *u = (rev_ud *)ud;
  int64_t rows = in[0].shape[0], row = in[0].numel / rows, i;
  (void)stream;
  u->calls++;
  if (u->fail) return GCAP_EDEVICE;
  if (nin != 1 || nout != 1) return GCAP_EINVAL;
  for (i = 0; i < rows; i++)
    memcpy((float *)out[0].data + i * row, (const float *)in[0].data + (rows - 1 - i) * row,
           (size_t)row * sizeof(float));
  return GCAP_OK;
}

static gcap_status rev_cuda(void *ud, void *stream, int nin, const gcap_custom_arg *in, int nout,
                            const gcap_custom_arg *out) {
  rev_ud *u = (rev_ud *)ud;
  int64_t rows = in[0].shape[0], row = in[0].numel / rows, i;
  if (cudaMemcpyAsync == NULL) return GCAP_EUNSUPPORTED;
  if (u->fail) return GCAP_EDEVICE;
  if (nin != 1 || nout != 1) return GCAP_EINVAL;
  for (i = 0; i < rows; i++)
    if (cudaMemcpyAsync((float *)out[0].data + i * row,
                        (const float *)in[0].data + (rows - 1 - i) * row,
                        (size_t)row * sizeof(float), T_D2D, stream) != 0)
      return GCAP_EDEVICE;
  if (u->sync && cudaStreamSynchronize(stream) != 0) return GCAP_EDEVICE;
  return GCAP_OK;
}

static gcap_status rev_call(gcap_custom_op *op, gcap_tensor *x, gcap_tensor **y) {
  gcap_custom_out spec;
  int d;
  memset(&spec, 0, sizeof spec);
  spec.dtype = GCAP_F32;
  spec.ndim = gcap_tensor_ndim(x);
  for (d = 0; d < spec.ndim; d++)
    spec.shape[d] = gcap_tensor_shape(x)[d];
  return gcap_custom_call(op, 1, &x, 1, &spec, 0, NULL, y);
}

/* The grad of a row reversal is the reversal of the grad: the op itself. */
static gcap_status rev_backward(void *ud, int nsaved, gcap_tensor *const *saved, gcap_tensor *g,
                                int nin, gcap_tensor **gin) {
  (void)nsaved, (void)saved, (void)nin;
  return rev_call(((rev_ud *)ud)->self, g, &gin[0]);
}

static void rev_free(void *ud) {
  (*((rev_ud *)ud)->freed)++;
}

/* A row reversal op "rev" with ud u (freed into *freed). */
static gcap_custom_op *rev_op(gcap_engine *e, rev_ud *u, int *freed) {
  gcap_custom_desc d;
  gcap_custom_op *op = NULL;
  memset(&d, 0, sizeof d);
  d.name = "rev";
  d.cuda = rev_cuda;
  d.host = rev_host;
  d.backward = rev_backward;
  d.ud = u;
  d.ud_free = rev_free;
  u->freed = freed;
  if (gcap_custom_op_new(e, &d, &op) != GCAP_OK)
    t_fail_(__FILE__, __LINE__, "rev_op", gcap_errmsg(e));
  u->self = op;
  return op;
}

static const int64_t S[2] = {3, 2};
static const float X[6] = {1, 2, 3, 4, 5, 6};
static const float REV[6] = {5, 6, 3, 4, 1, 2};
static const float W[6] = {0.5f, -1, 2, 0.25f, -3, 7};

/* Eager: the rows reversed; sum(rev(x) * w) has grad rev(w), by the op's
** backward (the same op); the ud is freed once, with the last holder. */
static void test_eager_and_backward(void) {
  gcap_engine *e = t_engine();
  rev_ud u = {0};
  int freed = 0, i;
  float r[6];
  gcap_tensor *x, *w, *y = NULL, *p = NULL, *l = NULL;
  gcap_custom_op *op;
  T_REQUIRE(e != NULL);
  op = rev_op(e, &u, &freed);
  x = t_from(e, 2, S, X);
  w = t_from(e, 2, S, W);
  T_SETUP(op && x && w, (gcap_tensor_free(x), gcap_tensor_free(w), gcap_engine_free(e)));
  T_CHECK_OK(e, gcap_tensor_set_requires_grad(x, 1));
  T_CHECK_OK(e, rev_call(op, x, &y));
  T_CHECK(strcmp(gcap_tensor_grad_fn_name(y), "rev") == 0);
  if (t_read(y, r, 6))
    for (i = 0; i < 6; i++)
      if (r[i] != REV[i]) T_FAILF("y", "y[%d] = %g, want %g", i, (double)r[i], (double)REV[i]);
  T_CHECK_OK(e, gcap_mul(y, w, &p));
  T_CHECK_OK(e, gcap_sum(p, &l));
  gcap_custom_op_free(op); /* the node keeps it */
  T_CHECK(freed == 0);
  T_CHECK_OK(e, gcap_backward(l, NULL, 0));
  if (t_read(gcap_tensor_grad(x), r, 6))
    for (i = 0; i < 6; i++) {
      float want = W[(2 - i / 2) * 2 + i % 2];
      if (r[i] != want)
        T_FAILF("x.grad", "x.grad[%d] = %g, want %g", i, (double)r[i], (double)want);
    }
  gcap_tensor_free(y), gcap_tensor_free(p), gcap_tensor_free(l);
  T_CHECK(freed == 1);
  gcap_tensor_free(x), gcap_tensor_free(w);
  gcap_engine_free(e);
}

/* Captured: a replay runs the op on the static input's new values, equal
** to the eager result bit for bit; the graph keeps the op (and its ud)
** after the handle is freed; a host replay calls the host callback. */
static void test_captured(void) {
  gcap_engine *e = t_engine();
  rev_ud u = {0};
  int freed = 0, i, calls;
  float r[6], ref[6], x2[6];
  gcap_tensor *x, *x2t, *y = NULL, *ye = NULL;
  gcap_graph *g = NULL;
  gcap_custom_op *op;
  T_REQUIRE(e != NULL);
  op = rev_op(e, &u, &freed);
  x = t_from(e, 2, S, X);
  for (i = 0; i < 6; i++)
    x2[i] = 0.1f * (float)i - 3;
  x2t = t_from(e, 2, S, x2);
  T_SETUP(op && x && x2t, (gcap_tensor_free(x), gcap_tensor_free(x2t), gcap_engine_free(e)));
  T_CHECK_OK(e, gcap_graph_new(e, &g));
  T_CHECK_OK(e, gcap_capture_begin(g, NULL, NULL));
  T_CHECK_OK(e, rev_call(op, x, &y));
  T_CHECK_OK(e, gcap_capture_end(g));
  calls = u.calls;
  gcap_custom_op_free(op);
  T_CHECK(freed == 0);
  T_CHECK_OK(e, gcap_copy_(x, x2t));
  T_CHECK_OK(e, gcap_graph_replay(g));
  if (t_device() == GCAP_DEVICE_HOST) T_CHECK(u.calls == calls + 1);
  T_CHECK_OK(e, rev_call(u.self, x2t, &ye)); /* the op lives on in the graph */
  if (t_read(y, r, 6) && t_read(ye, ref, 6)) T_CHECK(memcmp(r, ref, sizeof r) == 0);
  T_CHECK(ref[0] == x2[4] && ref[5] == x2[1]);
  gcap_graph_free(g);
  T_CHECK(freed == 1); /* the graph held the last reference */
  gcap_tensor_free(y), gcap_tensor_free(ye), gcap_tensor_free(x), gcap_tensor_free(x2t);
  gcap_engine_free(e);
}

/* A captured backward replays the op's backward (the op again) on new
** values of the tensor its grad reads: x.grad = rev(w) for the new w. */
static void test_captured_backward(void) {
  gcap_engine *e = t_engine();
  rev_ud u = {0};
  int freed = 0, i;
  float r[6], w2[6];
  gcap_tensor *x, *w, *w2t, *y = NULL, *p = NULL, *l = NULL;
  gcap_graph *g = NULL;
  gcap_custom_op *op;
  T_REQUIRE(e != NULL);
  op = rev_op(e, &u, &freed);
  x = t_from(e, 2, S, X);
  w = t_from(e, 2, S, W);
  for (i = 0; i < 6; i++)
    w2[i] = (float)(i * i) - 4.5f;
  w2t = t_from(e, 2, S, w2);
  T_SETUP(op && x && w && w2t, (gcap_tensor_free(x), gcap_tensor_free(w), gcap_tensor_free(w2t),
                                gcap_custom_op_free(op), gcap_engine_free(e)));
  T_CHECK_OK(e, gcap_tensor_set_requires_grad(x, 1));
  T_CHECK_OK(e, rev_call(op, x, &y));
  T_CHECK_OK(e, gcap_mul(y, w, &p));
  T_CHECK_OK(e, gcap_sum(p, &l));
  T_CHECK_OK(e, gcap_graph_new(e, &g));
  T_CHECK_OK(e, gcap_capture_begin(g, NULL, NULL));
  T_CHECK_OK(e, gcap_backward(l, NULL, 0));
  T_CHECK_OK(e, gcap_capture_end(g));
  T_CHECK_OK(e, gcap_copy_(w, w2t));
  T_CHECK_OK(e, gcap_graph_replay(g));
  if (t_read(gcap_tensor_grad(x), r, 6))
    for (i = 0; i < 6; i++) {
      float want = w2[(2 - i / 2) * 2 + i % 2];
      if (r[i] != want)
        T_FAILF("x.grad", "x.grad[%d] = %g, want %g", i, (double)r[i], (double)want);
    }
  gcap_graph_free(g);
  gcap_tensor_free(y), gcap_tensor_free(p), gcap_tensor_free(l);
  gcap_tensor_free(x), gcap_tensor_free(w), gcap_tensor_free(w2t);
  gcap_custom_op_free(op);
  T_CHECK(freed == 1);
  gcap_engine_free(e);
}

/* In pool p: g1 writes y = 2x; g2 reads y (through `read`); g3 overwrites
** y. Replayed g1, g2, g3, g2: the last is refused, naming what read y. */
static void replay_check_names(gcap_status (*read)(gcap_custom_op *, gcap_tensor *, gcap_tensor **),
                               const char *want) {
  gcap_engine *e = t_engine();
  rev_ud u = {0};
  int freed = 0;
  gcap_tensor *x, *y = NULL, *z = NULL;
  gcap_graph *g[3] = {NULL, NULL, NULL};
  gcap_pool *p = NULL;
  gcap_custom_op *op;
  T_REQUIRE(e != NULL);
  op = rev_op(e, &u, &freed);
  x = t_from(e, 2, S, X);
  T_SETUP(op && x, (gcap_tensor_free(x), gcap_custom_op_free(op), gcap_engine_free(e)));
  T_CHECK_OK(e, gcap_pool_new(e, &p));
  for (int i = 0; i < 3; i++)
    T_CHECK_OK(e, gcap_graph_new(e, &g[i]));
  T_CHECK_OK(e, gcap_graph_set_name(g[1], "reader"));
  T_CHECK_OK(e, gcap_capture_begin(g[0], p, NULL));
  T_CHECK_OK(e, gcap_scale(x, 2.0, &y));
  T_CHECK_OK(e, gcap_capture_end(g[0]));
  T_CHECK_OK(e, gcap_capture_begin(g[1], p, NULL));
  T_CHECK_OK(e, read(op, y, &z));
  T_CHECK_OK(e, gcap_capture_end(g[1]));
  T_CHECK_OK(e, gcap_capture_begin(g[2], p, NULL));
  T_CHECK_OK(e, gcap_fill_(y, 100.0));
  T_CHECK_OK(e, gcap_capture_end(g[2]));
  T_CHECK_OK(e, gcap_graph_replay(g[0]));
  T_CHECK_OK(e, gcap_graph_replay(g[1]));
  T_CHECK_OK(e, gcap_graph_replay(g[2]));
  T_CHECK_ST(e, gcap_graph_replay(g[1]), GCAP_EREPLAY);
  if (!t_msg_has(e, want) || !t_msg_has(e, "'reader'")) T_FAILF("message", "%s", gcap_errmsg(e));
  gcap_tensor_free(x), gcap_tensor_free(y), gcap_tensor_free(z);
  for (int i = 0; i < 3; i++)
    gcap_graph_free(g[i]);
  gcap_pool_free(p);
  gcap_custom_op_free(op);
  gcap_engine_free(e);
}

/* A host's own library call on the stream's native handle, declared. */
static gcap_status lib_read(gcap_custom_op *op, gcap_tensor *y, gcap_tensor **z) {
  void *native = NULL;
  gcap_status st = gcap_stream_native(gcap_current_stream(gcap_tensor_engine(y)), &native);
  (void)op, (void)z;
  if (st == GCAP_OK && native == NULL) st = GCAP_EINVAL;
  return st == GCAP_OK ? gcap_note_access(y, 0, "my_lib_gemm") : st;
}

static void test_replay_check_names_custom_op(void) {
  replay_check_names(rev_call, "read by custom op 'rev'");
}

static void test_replay_check_names_declared_access(void) {
  replay_check_names(lib_read, "read by my_lib_gemm");
}

static gcap_status nop_fn(void *ud, void *stream, int nin, const gcap_custom_arg *in, int nout,
                          const gcap_custom_arg *out) {
  (void)ud, (void)stream, (void)nin, (void)in, (void)nout, (void)out;
  return GCAP_OK;
}

/* An op "elsewhere" whose only callback is the other backend's. */
static gcap_custom_op *elsewhere_op(gcap_engine *e) {
  gcap_custom_desc d;
  gcap_custom_op *op = NULL;
  memset(&d, 0, sizeof d);
  d.name = "elsewhere";
  if (t_device() == GCAP_DEVICE_HOST)
    d.cuda = nop_fn;
  else
    d.host = nop_fn;
  if (gcap_custom_op_new(e, &d, &op) != GCAP_OK)
    t_fail_(__FILE__, __LINE__, "elsewhere_op", gcap_errmsg(e));
  return op;
}

/* A failing op: eagerly an error naming the op, no outputs; in a capture
** (an op with no callback for this backend fails there on every backend)
** the capture is invalidated: later work is refused and its end fails,
** naming the op, and the engine captures again afterwards. */
static void test_callback_errors(void) {
  gcap_engine *e = t_engine();
  rev_ud u = {0};
  int freed = 0;
  gcap_tensor *x, *y = NULL, *z = NULL;
  gcap_graph *g = NULL;
  gcap_custom_op *op, *other;
  T_REQUIRE(e != NULL);
  op = rev_op(e, &u, &freed);
  other = elsewhere_op(e);
  x = t_from(e, 2, S, X);
  T_SETUP(op && other && x, (gcap_tensor_free(x), gcap_custom_op_free(op),
                             gcap_custom_op_free(other), gcap_engine_free(e)));
  u.fail = 1;
  T_CHECK_ST(e, rev_call(op, x, &y), GCAP_EDEVICE);
  T_CHECK(y == NULL && t_msg_has(e, "custom op 'rev'") && t_msg_has(e, "callback failed"));
  T_CHECK_ST(e, rev_call(other, x, &y), GCAP_EUNSUPPORTED);
  T_CHECK(y == NULL && t_msg_has(e, "custom op 'elsewhere' has no"));
  u.fail = 0;
  T_CHECK_OK(e, gcap_graph_new(e, &g));
  T_CHECK_OK(e, gcap_capture_begin(g, NULL, NULL));
  T_CHECK_OK(e, rev_call(op, x, &z));
  T_CHECK_ST(e, rev_call(other, z, &y), GCAP_EUNSUPPORTED);
  T_CHECK(y == NULL && t_msg_has(e, "'elsewhere'") && t_msg_has(e, "invalidated"));
  gcap_tensor_free(z);
  z = NULL;
  T_CHECK_ST(e, gcap_scale(x, 2.0, &z), GCAP_ECAPTURE);
  T_CHECK(t_msg_has(e, "'elsewhere'"));
  T_CHECK_ST(e, gcap_capture_end(g), GCAP_ECAPTURE);
  T_CHECK(t_msg_has(e, "'elsewhere'") && !gcap_is_capturing(e));
  T_CHECK_OK(e, gcap_capture_begin(g, NULL, NULL));
  T_CHECK_OK(e, rev_call(op, x, &y));
  T_CHECK_OK(e, gcap_capture_end(g));
  T_CHECK_OK(e, gcap_graph_replay(g));
  T_CHECK(t_value(y) == 5.0);
  gcap_graph_free(g);
  gcap_tensor_free(x), gcap_tensor_free(y), gcap_tensor_free(z);
  gcap_custom_op_free(op), gcap_custom_op_free(other);
  T_CHECK(freed == 1);
  gcap_engine_free(e);
}

/* The host backend runs the recorded callback at each replay: one that
** fails there fails the replay, naming the op; the next replay succeeds. */
static void test_host_replay_error(void) {
  gcap_engine *e = t_engine();
  rev_ud u = {0};
  int freed = 0;
  gcap_tensor *x, *y = NULL;
  gcap_graph *g = NULL;
  gcap_custom_op *op;
  T_REQUIRE(e != NULL);
  op = rev_op(e, &u, &freed);
  x = t_from(e, 2, S, X);
  T_SETUP(op && x, (gcap_tensor_free(x), gcap_custom_op_free(op), gcap_engine_free(e)));
  T_CHECK_OK(e, gcap_graph_new(e, &g));
  T_CHECK_OK(e, gcap_capture_begin(g, NULL, NULL));
  T_CHECK_OK(e, rev_call(op, x, &y));
  T_CHECK_OK(e, gcap_capture_end(g));
  u.fail = 1;
  T_CHECK_ST(e, gcap_graph_replay(g), GCAP_EDEVICE);
  T_CHECK(t_msg_has(e, "custom op 'rev'") && t_msg_has(e, "at replay"));
  u.fail = 0;
  T_CHECK_OK(e, gcap_graph_replay(g));
  T_CHECK(t_value(y) == 5.0);
  gcap_graph_free(g);
  gcap_tensor_free(x), gcap_tensor_free(y);
  gcap_custom_op_free(op);
  gcap_engine_free(e);
}

/* On cuda, where the callback runs at capture: one that synchronizes its
** capturing stream gets CUDA's refusal as GCAP_ECAPTURE naming the op, one
** that fails invalidates the capture; the engine captures again. */
static void test_cuda_sync_in_capture(void) {
  gcap_engine *e = t_engine();
  rev_ud u = {0};
  int freed = 0;
  gcap_tensor *x, *y = NULL;
  gcap_graph *g = NULL;
  gcap_custom_op *op;
  T_REQUIRE(e != NULL);
  op = rev_op(e, &u, &freed);
  x = t_from(e, 2, S, X);
  T_SETUP(op && x, (gcap_tensor_free(x), gcap_custom_op_free(op), gcap_engine_free(e)));
  u.sync = 1;
  T_CHECK_OK(e, rev_call(op, x, &y)); /* eagerly, a sync is fine */
  gcap_tensor_free(y);
  y = NULL;
  T_CHECK_OK(e, gcap_graph_new(e, &g));
  T_CHECK_OK(e, gcap_capture_begin(g, NULL, NULL));
  T_CHECK_ST(e, rev_call(op, x, &y), GCAP_ECAPTURE);
  T_CHECK(t_msg_has(e, "custom op 'rev'") && t_msg_has(e, "broke the capture"));
  T_CHECK_ST(e, gcap_capture_end(g), GCAP_ECAPTURE);
  u.sync = 0;
  u.fail = 1; /* a callback's own failure, in a capture */
  T_CHECK_OK(e, gcap_capture_begin(g, NULL, NULL));
  T_CHECK_ST(e, rev_call(op, x, &y), GCAP_EDEVICE);
  T_CHECK(t_msg_has(e, "custom op 'rev'") && t_msg_has(e, "invalidated"));
  T_CHECK_ST(e, gcap_capture_end(g), GCAP_ECAPTURE);
  u.fail = 0;
  T_CHECK_OK(e, gcap_capture_begin(g, NULL, NULL));
  T_CHECK_OK(e, rev_call(op, x, &y));
  T_CHECK_OK(e, gcap_capture_end(g));
  T_CHECK_OK(e, gcap_graph_replay(g));
  T_CHECK(t_value(y) == 5.0);
  gcap_graph_free(g);
  gcap_tensor_free(x), gcap_tensor_free(y);
  gcap_custom_op_free(op);
  gcap_engine_free(e);
}

/* Bad descriptors and calls: errors naming the op and what is wrong, the
** ud freed once when no op is made, nothing left allocated. */
static void test_bad_calls(void) {
  gcap_engine *e = t_engine(), *e2 = t_engine();
  rev_ud u = {0};
  int freed = 0, save = 5;
  gcap_custom_desc d;
  gcap_custom_op *op = NULL;
  gcap_custom_out spec[2];
  gcap_tensor *x, *x2, *y[2] = {NULL, NULL}, *in[1];
  T_REQUIRE(e != NULL && e2 != NULL);
  x = t_from(e, 2, S, X);
  x2 = t_from(e2, 2, S, X);
  memset(&d, 0, sizeof d);
  d.name = "";
  d.host = nop_fn;
  d.ud = &u;
  d.ud_free = rev_free;
  u.freed = &freed;
  T_CHECK_ST(e, gcap_custom_op_new(e, &d, &op), GCAP_EINVAL);
  T_CHECK(op == NULL && freed == 1 && t_msg_has(e, "name"));
  d.name = "none";
  d.host = NULL;
  T_CHECK_ST(e, gcap_custom_op_new(e, &d, &op), GCAP_EINVAL);
  T_CHECK(op == NULL && freed == 2 && t_msg_has(e, "'none'"));
  op = elsewhere_op(e);
  T_REQUIRE(op != NULL);
  memset(spec, 0, sizeof spec);
  spec[0].ndim = 1;
  spec[0].shape[0] = 4;
  spec[1] = spec[0];
  in[0] = x;
  T_CHECK_ST(e, gcap_custom_call(op, 1, in, 1, spec, 0, NULL, y), GCAP_EUNSUPPORTED);
  T_CHECK(y[0] == NULL && t_msg_has(e, "'elsewhere' has no"));
  gcap_custom_op_free(op);
  op = rev_op(e, &u, &freed);
  T_SETUP(op && x && x2, (gcap_tensor_free(x), gcap_tensor_free(x2), gcap_custom_op_free(op),
                          gcap_engine_free(e), gcap_engine_free(e2)));
  T_CHECK_ST(e, gcap_custom_call(op, 1, in, 0, spec, 0, NULL, y), GCAP_EINVAL);
  T_CHECK_ST(e, gcap_custom_call(op, 1, in, 2, spec, 0, NULL, y), GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "'rev'") && t_msg_has(e, "one output"));
  T_CHECK_ST(e, gcap_custom_call(op, 1, in, 1, spec, 1, &save, y), GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "'rev'") && t_msg_has(e, "save #1 is 5"));
  in[0] = x2;
  T_CHECK_ST(e, gcap_custom_call(op, 1, in, 1, spec, 0, NULL, y), GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "input #1 is of another engine"));
  in[0] = NULL;
  T_CHECK_ST(e, gcap_custom_call(op, 1, in, 1, spec, 0, NULL, y), GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "input #1 is NULL"));
  in[0] = x;
  spec[0].shape[0] = -1;
  T_CHECK_ST(e, gcap_custom_call(op, 1, in, 1, spec, 0, NULL, y), GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "'rev': output #1"));
  T_CHECK(y[0] == NULL && y[1] == NULL);
  T_CHECK_ST(e, gcap_note_access(x, 0, ""), GCAP_EINVAL);
  T_CHECK_ST(e, gcap_stream_native(NULL, NULL), GCAP_EINVAL);
  T_CHECK_OK(e, rev_call(op, x, &y[0])); /* the op is still usable */
  T_CHECK(t_value(y[0]) == 5.0);
  gcap_tensor_free(y[0]), gcap_tensor_free(x), gcap_tensor_free(x2);
  gcap_custom_op_free(op);
  T_CHECK(freed == 3);
  gcap_engine_free(e), gcap_engine_free(e2);
}

int main(void) {
  T_RUN(test_eager_and_backward);
  T_RUN(test_captured);
  T_RUN(test_captured_backward);
  T_RUN(test_replay_check_names_custom_op);
  T_RUN(test_replay_check_names_declared_access);
  T_RUN(test_callback_errors);
  T_RUN(test_bad_calls);
  /* the backend's own failure paths */
  if (t_device() == GCAP_DEVICE_HOST) T_RUN(test_host_replay_error);
  if (t_device() == GCAP_DEVICE_CUDA) T_RUN(test_cuda_sync_in_capture);
  return t_done();
}
