/*
** test_kernel_args.c: a runtime-compiled kernel's parameter types
** (graphcap.h, "Runtime-compiled kernels"): read from the source's
** parameter list (qualifiers, comments, unnamed parameters, attributes),
** given explicitly (which wins, and is asked for by name where the source
** cannot tell: a macro, a template, a type of no gcap_kparam), and the
** launch arguments checked and converted against them (gcap_kernel_args),
** an integer for a float parameter giving the float result on every
** backend; on cuda, given types checked against the driver's. Without
** NVRTC the suite is skipped (exit 77).
*/
#include "t.h"

static const char *MANY =
    "typedef long long int64_t;\n"
    "struct __nv_bfloat16;\n"
    "#define UNUSED(x) (void)(x)\n"
    "extern \"C\" __global__ void __launch_bounds__(128)\n"
    "many(const float *__restrict__ a, __nv_bfloat16 *b, /* a comment, (x, y) */ float c,\n"
    "     int d, unsigned e, int64_t f, long long g, size_t h, double, bool j,\n"
    "     const unsigned int k, unsigned long long m, long n, signed s) {}\n";

static const gcap_kparam MANY_P[] = {
    GCAP_KPARAM_PTR, GCAP_KPARAM_PTR, GCAP_KPARAM_F32, GCAP_KPARAM_I32, GCAP_KPARAM_U32,
    GCAP_KPARAM_I64, GCAP_KPARAM_I64, GCAP_KPARAM_U64, GCAP_KPARAM_F64, GCAP_KPARAM_BOOL,
    GCAP_KPARAM_U32, GCAP_KPARAM_U64, GCAP_KPARAM_I64, GCAP_KPARAM_I32};

static const char *SCALE = "extern \"C\" __global__ void scale(const float *x, float *y, float a,\n"
                           "                                  int n) {\n"
                           "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                           "  if (i < n) y[i] = a * x[i];\n"
                           "}\n";

/* The parameter types of a new kernel equal want[n]. */
static void check_params(gcap_engine *e, const char *src, const char *name, int nparams,
                         const gcap_kparam *params, int n, const gcap_kparam *want) {
  gcap_kernel *k = NULL;
  const gcap_kparam *got = NULL;
  int i, ngot = -1;
  T_CHECK_OK(e, gcap_kernel_new(e, src, name, 0, NULL, nparams, params, &k));
  T_CHECK_OK(e, gcap_kernel_params(k, &ngot, &got));
  T_CHECK(ngot == n);
  for (i = 0; i < n && i < ngot; i++)
    if (got[i] != want[i])
      T_FAILF("parameter", "%s: #%d is %s, not %s", name, i + 1, gcap_kparam_name(got[i]),
              gcap_kparam_name(want[i]));
  gcap_kernel_free(k);
}

static void test_parsed(void) {
  gcap_engine *e = t_engine();
  static const gcap_kparam SCALE_P[] = {GCAP_KPARAM_PTR, GCAP_KPARAM_PTR, GCAP_KPARAM_F32,
                                        GCAP_KPARAM_I32};
  T_REQUIRE(e != NULL);
  check_params(e, MANY, "many", 0, NULL, (int)(sizeof MANY_P / sizeof MANY_P[0]), MANY_P);
  check_params(e, SCALE, "scale", 0, NULL, 4, SCALE_P);
  check_params(e, "extern \"C\" __global__ void none(void) {}", "none", 0, NULL, 0, NULL);
  check_params(e, "extern \"C\" __global__ void none() {}", "none", 0, NULL, 0, NULL);
  /* the declaration of another function first, then a second kernel */
  check_params(e,
               "extern \"C\" __global__ void a(int n);\n"
               "extern \"C\" __global__ void b(double x, float *y) {}\n"
               "extern \"C\" __global__ void a(int n) {}\n",
               "b", 0, NULL, 2, (const gcap_kparam[]){GCAP_KPARAM_F64, GCAP_KPARAM_PTR});
  gcap_engine_free(e);
}

static const char *MACRO = "#define KERNEL(n) extern \"C\" __global__ void n(float *y, float a)\n"
                           "KERNEL(fill) { y[0] = a; }\n";
static const char *TEMPLATE = "template <typename T> __global__ void tfill(T *y, T a) {\n"
                              "  y[0] = a;\n"
                              "}\n";

/* Where the source cannot tell, an error names the kernel and asks for the
** types; given, they win. */
static void test_explicit(void) {
  gcap_engine *e = t_engine();
  gcap_kernel *k = NULL;
  static const gcap_kparam FILL_P[] = {GCAP_KPARAM_PTR, GCAP_KPARAM_F32};
  static const gcap_kparam BAD[] = {GCAP_KPARAM_PTR, (gcap_kparam)42};
  static const gcap_kparam SCALE_U[] = {GCAP_KPARAM_PTR, GCAP_KPARAM_PTR, GCAP_KPARAM_F32,
                                        GCAP_KPARAM_U32};
  T_REQUIRE(e != NULL);
  T_CHECK_ST(e, gcap_kernel_new(e, MACRO, "fill", 0, NULL, 0, NULL, &k), GCAP_EINVAL);
  T_CHECK(k == NULL);
  if (!t_msg_has(e, "kernel 'fill': no parameter list of a __global__ function 'fill'") ||
      !t_msg_has(e, "params of gcap_kernel_new") || !t_msg_has(e, "option signature"))
    T_FAILF("message", "%s", gcap_errmsg(e));
  check_params(e, MACRO, "fill", 2, FILL_P, 2, FILL_P);
  T_CHECK_ST(e, gcap_kernel_new(e, TEMPLATE, "tfill<float>", 0, NULL, 0, NULL, &k), GCAP_EINVAL);
  T_CHECK(k == NULL && t_msg_has(e, "kernel 'tfill<float>'") && t_msg_has(e, "params of"));
  check_params(e, TEMPLATE, "tfill<float>", 2, FILL_P, 2, FILL_P);
  /* a type the scanner does not know: the parameter named with its text */
  T_CHECK_ST(e,
             gcap_kernel_new(e,
                             "typedef float real;\n"
                             "extern \"C\" __global__ void tr(float *y, real a) { y[0] = a; }",
                             "tr", 0, NULL, 0, NULL, &k),
             GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "kernel 'tr': cannot tell the type of parameter #2 (`real a`)"));
  T_CHECK_ST(e,
             gcap_kernel_new(e, "extern \"C\" __global__ void sh(float *y, short n) {}", "sh", 0,
                             NULL, 0, NULL, &k),
             GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "kernel 'sh': cannot tell the type of parameter #2 (`short n`)"));
  /* the given types win over the source's (of the same sizes: on cuda the driver checks
  ** those against the compiled kernel) */
  check_params(e, SCALE, "scale", 4, SCALE_U, 4, SCALE_U);
  T_CHECK_ST(e, gcap_kernel_new(e, SCALE, "scale", 0, NULL, 2, BAD, &k), GCAP_EINVAL);
  T_CHECK(k == NULL && t_msg_has(e, "kernel 'scale': parameter 2 has no type (42)"));
  T_CHECK_ST(e, gcap_kernel_new(e, SCALE, "scale", 0, NULL, -1, FILL_P, &k), GCAP_EINVAL);
  T_CHECK(gcap_kparam_name(GCAP_KPARAM_BOOL) != NULL &&
          strcmp(gcap_kparam_name(GCAP_KPARAM_BOOL), "bool") == 0);
  T_CHECK(gcap_kparam_name((gcap_kparam)8) == NULL);
  gcap_engine_free(e);
}

/* On cuda (run there only), where the driver tells the compiled kernel's parameters (CUDA
** 12.4 and later), given types that disagree with them are refused; with
** an older driver they are taken as given. */
static void test_driver_check(void) {
  gcap_engine *e;
  gcap_kernel *k = NULL;
  gcap_status st;
  static const gcap_kparam FEWER[] = {GCAP_KPARAM_PTR, GCAP_KPARAM_PTR, GCAP_KPARAM_F32};
  static const gcap_kparam MORE[] = {GCAP_KPARAM_PTR, GCAP_KPARAM_PTR, GCAP_KPARAM_F32,
                                     GCAP_KPARAM_I32, GCAP_KPARAM_I32};
  static const gcap_kparam WIDER[] = {GCAP_KPARAM_PTR, GCAP_KPARAM_PTR, GCAP_KPARAM_F64,
                                      GCAP_KPARAM_I32};
  T_REQUIRE((e = t_engine()) != NULL);
  st = gcap_kernel_new(e, SCALE, "scale", 0, NULL, 3, FEWER, &k);
  T_CHECK(st == GCAP_OK ||
          (st == GCAP_EINVAL && t_msg_has(e, "kernel 'scale': the compiled kernel has more than 3 "
                                             "parameters, its signature 3")));
  gcap_kernel_free(k);
  k = NULL;
  st = gcap_kernel_new(e, SCALE, "scale", 0, NULL, 5, MORE, &k);
  T_CHECK(st == GCAP_OK || (st == GCAP_EINVAL && t_msg_has(e, "the compiled kernel has 4 "
                                                              "parameters, its signature 5")));
  gcap_kernel_free(k);
  k = NULL;
  st = gcap_kernel_new(e, SCALE, "scale", 0, NULL, 4, WIDER, &k);
  T_CHECK(st == GCAP_OK || (st == GCAP_EINVAL && t_msg_has(e, "parameter 3 is 4 bytes in the "
                                                              "compiled kernel, but its "
                                                              "signature's f64 is 8")));
  gcap_kernel_free(k);
  gcap_engine_free(e);
}

static gcap_karg num_i(int64_t i) {
  gcap_karg a = {GCAP_KARG_INT, NULL, i, 0};
  return a;
}
static gcap_karg num_f(double f) {
  gcap_karg a = {GCAP_KARG_FLOAT, NULL, 0, f};
  return a;
}

/* Convert `a` for parameter #pi (from 0) of kernel "many" as argument;
** the other arguments are valid. Its status, the conversion into *out. */
static gcap_status convert(gcap_kernel *k, gcap_tensor *t, int pi, gcap_karg a, gcap_karg *out) {
  enum { N = sizeof MANY_P / sizeof MANY_P[0] };
  gcap_karg args[N], conv[N];
  int i;
  for (i = 0; i < N; i++) {
    args[i] = MANY_P[i] == GCAP_KPARAM_PTR ? (gcap_karg){GCAP_KARG_TENSOR, t, 0, 0} : num_i(0);
    if (i == pi) args[i] = a;
  }
  memset(conv, 0, sizeof conv);
  gcap_status st = gcap_kernel_args(k, N, args, conv);
  *out = conv[pi];
  return st;
}

/* Each argument is checked against its parameter and converted; an error
** names the kernel, the argument and the parameter's type. */
static void test_conversions(void) {
  gcap_engine *e = t_engine();
  gcap_kernel *k = NULL;
  gcap_tensor *t = NULL;
  gcap_karg c, one = num_i(1);
  static const int64_t S1[1] = {1};
  T_REQUIRE(e != NULL);
  T_CHECK_OK(e, gcap_kernel_new(e, MANY, "many", 0, NULL, 0, NULL, &k));
  T_CHECK_OK(e, gcap_tensor_empty(e, GCAP_F32, 1, S1, &t));
  /* c: f32. An integer becomes that float; a double is rounded to float. */
  T_CHECK_OK(e, convert(k, t, 2, num_i(2), &c));
  T_CHECK(c.kind == GCAP_KARG_FLOAT && c.f == 2.0);
  T_CHECK_OK(e, convert(k, t, 2, num_f(0.1), &c));
  T_CHECK(c.kind == GCAP_KARG_FLOAT && c.f == (double)0.1f && c.f != 0.1);
  T_CHECK_ST(e, convert(k, t, 2, num_f(1e300), &c), GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "kernel 'many': argument #3 (1.0000000000000001e+300) is out of the range "
                       "of f32"));
  /* i: f64 keeps the double */
  T_CHECK_OK(e, convert(k, t, 8, num_f(0.1), &c));
  T_CHECK(c.kind == GCAP_KARG_FLOAT && c.f == 0.1);
  /* d: i32. An integral float becomes that integer; others are errors. */
  T_CHECK_OK(e, convert(k, t, 3, num_f(-3.0), &c));
  T_CHECK(c.kind == GCAP_KARG_INT && c.i == -3);
  T_CHECK_ST(e, convert(k, t, 3, num_f(2.5), &c), GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "kernel 'many': argument #4 must be an integer (parameter 4 is i32), "
                       "got 2.5"));
  T_CHECK_ST(e, convert(k, t, 3, num_i((int64_t)1 << 31), &c), GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "kernel 'many': argument #4 (2147483648) is out of the range of i32"));
  T_CHECK_OK(e, convert(k, t, 3, num_i(INT32_MIN), &c));
  T_CHECK(c.i == INT32_MIN);
  /* e: u32; j: bool; h: size_t; f: int64_t */
  T_CHECK_ST(e, convert(k, t, 4, num_i(-1), &c), GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "argument #5 (-1) is out of the range of u32"));
  T_CHECK_OK(e, convert(k, t, 4, num_i(UINT32_MAX), &c));
  T_CHECK(c.i == UINT32_MAX);
  T_CHECK_ST(e, convert(k, t, 9, num_i(2), &c), GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "argument #10 (2) is out of the range of bool"));
  T_CHECK_OK(e, convert(k, t, 9, one, &c));
  T_CHECK(c.kind == GCAP_KARG_INT && c.i == 1);
  T_CHECK_ST(e, convert(k, t, 7, num_i(-1), &c), GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "out of the range of u64"));
  T_CHECK_OK(e, convert(k, t, 5, num_i(INT64_MAX), &c));
  T_CHECK(c.i == INT64_MAX);
  T_CHECK_ST(e, convert(k, t, 5, num_f(9.3e18), &c), GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "is out of the range of i64"));
  /* a tensor for a number, a number for a pointer */
  T_CHECK_ST(e, convert(k, t, 2, (gcap_karg){GCAP_KARG_TENSOR, t, 0, 0}, &c), GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "kernel 'many': argument #3 must be a number (parameter 3 is f32), got a "
                       "tensor"));
  T_CHECK_ST(e, convert(k, t, 1, one, &c), GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "kernel 'many': argument #2 must be a tensor (parameter 2 is a pointer), "
                       "got a number"));
  T_CHECK_ST(e, convert(k, t, 0, (gcap_karg){GCAP_KARG_TENSOR, NULL, 0, 0}, &c), GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "argument #1 is NULL"));
  T_CHECK_ST(e, convert(k, t, 0, (gcap_karg){(gcap_karg_kind)7, NULL, 0, 0}, &c), GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "argument #1 has no kind"));
  /* the count */
  T_CHECK_ST(e, gcap_kernel_args(k, 1, &one, &c), GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "kernel 'many' takes 14 arguments, got 1"));
  T_CHECK_ST(e, gcap_kernel_args(NULL, 1, &one, &c), GCAP_EINVAL);
  gcap_tensor_free(t);
  gcap_kernel_free(k);
  gcap_engine_free(e);
}

/* out[0] = a * in[0], a from the ud: what the kernel computes. */
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

/* An integer for the float parameter gives the float result (on cuda the
** kernel reads 2.0f, not the int 2's bits); a wrong count is refused with
** the twin's ud freed, and the kernel still launches afterwards. */
static void test_launch_converts(void) {
  gcap_engine *e = t_engine();
  gcap_kernel *k = NULL;
  gcap_tensor *x, *y = NULL;
  gcap_karg args[4];
  gcap_launch_desc l;
  static const int64_t S[1] = {4};
  static const float X[4] = {1, -2, 3.5f, 0.25f};
  float a = 2, r[4];
  int i;
  T_REQUIRE(e != NULL);
  x = t_from(e, 1, S, X);
  T_CHECK_OK(e, gcap_kernel_new(e, SCALE, "scale", 0, NULL, 0, NULL, &k));
  T_CHECK_OK(e, gcap_tensor_empty(e, GCAP_F32, 1, S, &y));
  args[0] = (gcap_karg){GCAP_KARG_TENSOR, x, 0, 0};
  args[1] = (gcap_karg){GCAP_KARG_TENSOR, y, 0, 0};
  args[2] = num_i(2);
  args[3] = num_i(4);
  memset(&l, 0, sizeof l);
  l.grid[0] = l.grid[1] = l.grid[2] = 1;
  l.block[0] = 32, l.block[1] = l.block[2] = 1;
  l.nargs = 3, l.args = args;
  l.nreads = 1, l.reads = &x;
  l.nwrites = 1, l.writes = &y;
  l.host = scale_twin, l.host_ud = &a;
  T_CHECK_ST(e, gcap_kernel_launch(k, &l), GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "kernel 'scale' takes 4 arguments, got 3"));
  args[3] = num_f(4.5);
  l.nargs = 4;
  T_CHECK_ST(e, gcap_kernel_launch(k, &l), GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "argument #4 must be an integer (parameter 4 is i32), got 4.5"));
  args[3] = num_f(4.0); /* integral: fine */
  T_CHECK_OK(e, gcap_kernel_launch(k, &l));
  if (t_read(y, r, 4))
    for (i = 0; i < 4; i++)
      if (r[i] != 2 * X[i])
        T_FAILF("y", "y[%d] = %g, want %g", i, (double)r[i], 2.0 * (double)X[i]);
  gcap_kernel_free(k);
  gcap_tensor_free(x), gcap_tensor_free(y);
  gcap_engine_free(e);
}

int main(void) {
  gcap_engine *e = t_engine();
  gcap_kernel *k = NULL;
  gcap_status st = e ? gcap_kernel_new(e, SCALE, "scale", 0, NULL, 0, NULL, &k) : GCAP_EINVAL;
  gcap_kernel_free(k);
  if (st == GCAP_EUNSUPPORTED) {
    printf("# skipped: %s\n", gcap_errmsg(e));
    gcap_engine_free(e);
    return 77;
  }
  gcap_engine_free(e);
  T_RUN(test_parsed);
  T_RUN(test_explicit);
  if (t_device() == GCAP_DEVICE_CUDA) T_RUN(test_driver_check); /* host loads nothing */
  T_RUN(test_conversions);
  T_RUN(test_launch_converts);
  return t_done();
}
