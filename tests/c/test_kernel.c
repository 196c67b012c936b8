/*
** test_kernel.c: kernels compiled at run time (graphcap.h, "Runtime-compiled
** kernels"): a scaling kernel compiled with NVRTC on every backend, launched
** with its host twin (host) or as itself (cuda), eagerly and captured, its
** replay reading the static input's new values; a compile error carries
** NVRTC's log with the line; bad launches are errors naming the kernel.
** Without NVRTC the suite is skipped (exit 77).
*/
#include "t.h"

static const char *SRC = "extern \"C\" __global__ void scale(const float *x, float *y, float a,\n"
                         "                                  int n) {\n"
                         "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                         "  if (i < n) y[i] = a * x[i];\n"
                         "}\n";

/* The twin: out[0] = a * in[0], a from the ud. */
static gcap_status scale_twin(void *ud, void *stream, int nin, const gcap_custom_arg *in, int nout,
                              const gcap_custom_arg *out) {
  float a = *(const float *)ud;
  int64_t i;
  (void)stream;
  if (nin != 1 || nout != 1) return GCAP_EINVAL;
  for (i = 0; i < in[0].numel; i++)
    ((float *)out[0].data)[i] = a * ((const float *)in[0].data)[i];
  return GCAP_OK;
}

static int twin_frees;
static void twin_free(void *ud) {
  (void)ud;
  twin_frees++;
}

static gcap_status launch(gcap_kernel *k, gcap_tensor *x, gcap_tensor *y, float *a) {
  gcap_karg args[4];
  gcap_launch_desc l;
  memset(args, 0, sizeof args);
  memset(&l, 0, sizeof l);
  args[0].kind = GCAP_KARG_TENSOR, args[0].t = x;
  args[1].kind = GCAP_KARG_TENSOR, args[1].t = y;
  args[2].kind = GCAP_KARG_FLOAT, args[2].f = *a;
  args[3].kind = GCAP_KARG_INT, args[3].i = (int32_t)gcap_tensor_numel(x);
  l.grid[0] = l.grid[1] = l.grid[2] = 1;
  l.block[0] = 256, l.block[1] = l.block[2] = 1;
  l.nargs = 4, l.args = args;
  l.nreads = 1, l.reads = &x;
  l.nwrites = 1, l.writes = &y;
  l.host = scale_twin, l.host_ud = a, l.host_ud_free = twin_free;
  return gcap_kernel_launch(k, &l);
}

static const int64_t S[1] = {5};
static const float X[5] = {1, -2, 3.5f, 0.25f, 8};

static void test_eager_and_captured(void) {
  gcap_engine *e = t_engine();
  gcap_kernel *k = NULL;
  gcap_tensor *x, *y = NULL, *x2;
  gcap_graph *g = NULL;
  float a = 3, r[5], x2d[5] = {-1, 0, 1, 2, 3};
  int i;
  T_REQUIRE(e != NULL);
  x = t_from(e, 1, S, X);
  x2 = t_from(e, 1, S, x2d);
  T_CHECK_OK(e, gcap_kernel_new(e, SRC, "scale", 0, NULL, 0, NULL, &k));
  T_CHECK_OK(e, gcap_tensor_empty(e, GCAP_F32, 1, S, &y));
  twin_frees = 0;
  T_CHECK_OK(e, launch(k, x, y, &a));
  T_CHECK(twin_frees == 1);
  if (t_read(y, r, 5))
    for (i = 0; i < 5; i++)
      T_CHECK(r[i] == 3 * X[i]);
  T_CHECK_OK(e, gcap_graph_new(e, &g));
  T_CHECK_OK(e, gcap_capture_begin(g, NULL, NULL));
  T_CHECK_OK(e, launch(k, x, y, &a));
  T_CHECK_OK(e, gcap_capture_end(g));
  gcap_kernel_free(k); /* the graph keeps it */
  T_CHECK_OK(e, gcap_copy_(x, x2));
  T_CHECK_OK(e, gcap_graph_replay(g));
  if (t_read(y, r, 5))
    for (i = 0; i < 5; i++)
      T_CHECK(r[i] == 3 * x2d[i]);
  T_CHECK(twin_frees == 1);
  gcap_graph_free(g);
  T_CHECK(twin_frees == 2);
  gcap_tensor_free(x), gcap_tensor_free(x2), gcap_tensor_free(y);
  gcap_engine_free(e);
}

/* A compile error names the kernel and holds NVRTC's log with the line of
** the error in the kernel's source. */
static void test_compile_error(void) {
  gcap_engine *e = t_engine();
  gcap_kernel *k = NULL;
  const char *bad = "extern \"C\" __global__ void oops(float *y) {\n"
                    "  y[0] = undefined_thing;\n"
                    "}\n";
  T_REQUIRE(e != NULL);
  T_CHECK_ST(e, gcap_kernel_new(e, bad, "oops", 0, NULL, 0, NULL, &k), GCAP_EINVAL);
  T_CHECK(k == NULL);
  if (!t_msg_has(e, "kernel 'oops' does not compile") || !t_msg_has(e, "oops.cu(2)") ||
      !t_msg_has(e, "undefined_thing"))
    T_FAILF("message", "%s", gcap_errmsg(e));
  T_CHECK_ST(e, gcap_kernel_new(e, SRC, "nothere", 0, NULL, 0, NULL, &k), GCAP_EINVAL);
  T_CHECK(k == NULL && t_msg_has(e, "nothere"));
  gcap_engine_free(e);
}

/* Bad launches: errors naming the kernel; the twin's ud freed once. */
static void test_bad_launch(void) {
  gcap_engine *e = t_engine();
  gcap_kernel *k = NULL;
  gcap_tensor *x, *y = NULL;
  gcap_karg arg;
  gcap_launch_desc l;
  float a = 2;
  T_REQUIRE(e != NULL);
  x = t_from(e, 1, S, X);
  T_CHECK_OK(e, gcap_kernel_new(e, SRC, "scale", 0, NULL, 0, NULL, &k));
  T_CHECK_OK(e, gcap_tensor_empty(e, GCAP_F32, 1, S, &y));
  memset(&l, 0, sizeof l);
  memset(&arg, 0, sizeof arg);
  arg.kind = GCAP_KARG_TENSOR, arg.t = y;
  l.grid[0] = l.grid[1] = l.grid[2] = 1;
  l.block[0] = l.block[1] = l.block[2] = 1;
  l.nargs = 1, l.args = &arg;
  l.nreads = 1, l.reads = &x;
  l.host = scale_twin, l.host_ud = &a, l.host_ud_free = twin_free;
  twin_frees = 0;
  T_CHECK_ST(e, gcap_kernel_launch(k, &l), GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "kernel 'scale': tensor argument #1 is in neither reads nor writes"));
  T_CHECK(twin_frees == 1);
  l.block[1] = 0;
  T_CHECK_ST(e, gcap_kernel_launch(k, &l), GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "kernel 'scale': grid and block"));
  T_CHECK(twin_frees == 2);
  gcap_kernel_free(k);
  gcap_tensor_free(x), gcap_tensor_free(y);
  gcap_engine_free(e);
}

int main(void) {
  gcap_engine *e = t_engine();
  gcap_kernel *k = NULL;
  gcap_status st = e ? gcap_kernel_new(e, SRC, "scale", 0, NULL, 0, NULL, &k) : GCAP_EINVAL;
  gcap_kernel_free(k);
  if (st == GCAP_EUNSUPPORTED) {
    printf("# skipped: %s\n", gcap_errmsg(e));
    gcap_engine_free(e);
    return 77;
  }
  gcap_engine_free(e);
  T_RUN(test_eager_and_captured);
  T_RUN(test_compile_error);
  T_RUN(test_bad_launch);
  return t_done();
}
