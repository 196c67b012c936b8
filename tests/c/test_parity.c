/*
** test_parity.c: every kernel-backed op on the cuda backend against the host
** backend (docs/semantics.md, "Backends": every op has a parity test, cuda vs
** host, |d| <= atol + rtol*|ref|). Two engines live in one process; the same
** inputs are uploaded to both; each op runs forward and, where it has one,
** backward (loss = sum(op(x) * r) for a fixed r), and the output and every
** input grad are read back and compared, the host's value the reference. f32:
** atol 1e-5, rtol 1e-4. bf16 (elementwise ops and matmul): looser. Without a
** GPU (or a cuda build) the suite is skipped (exit 77).
** GRAPHCAP_PARITY_VERBOSE=1 prints each comparison's worst error as a fraction
** of its tolerance.
*/
#include <stdint.h>

#include "t.h"
#include "t_data.h"

#define F32_ATOL 1e-5
#define F32_RTOL 1e-4
#define BF16_ATOL 1e-2
#define BF16_RTOL 1.6e-2

static gcap_engine *eh, *ec; /* host, cuda */
static int verbose;          /* GRAPHCAP_PARITY_VERBOSE=1: print each comparison's worst error */

static uint32_t rng_state = 777u;
static float urand(void) { /* uniform in [-1, 1) */
  return t_urand(&rng_state);
}

typedef enum { FILL_NORMAL, FILL_AWAY, FILL_POS, FILL_CLASS } fill_kind;

typedef struct pin {
  int ndim;
  int64_t shape[GCAP_MAXDIM];
  fill_kind fill;
  int classes;
  int grad;
} pin;

#define MAXIN 4

typedef struct pcase {
  const char *name;
  op_fn f;
  gcap_dtype dt;
  int backward;  /* 0: forward only */
  uint64_t seed; /* seed both engines before the op when non-zero */
  int nin;
  pin in[MAXIN];
} pcase;

static int64_t numel_of(const pin *p) {
  return t_numel(p->ndim, p->shape);
}

static void fill(const pin *p, float *d, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    float u = urand();
    switch (p->fill) {
      case FILL_NORMAL:
        d[i] = 2.0f * u;
        break;
      case FILL_AWAY:
        d[i] = (u < 0 ? -1.0f : 1.0f) * (0.05f + 1.5f * fabsf(u));
        break;
      case FILL_POS:
        d[i] = 0.5f + 0.5f * (u + 1.0f);
        break;
      case FILL_CLASS:
        d[i] = (float)((i * 7 + 3) % p->classes);
        break;
    }
  }
}

/* |got - ref| <= atol + rtol*|ref|, and that bound (lim). */
static int within(float got, float ref, double atol, double rtol, double *lim) {
  *lim = atol + rtol * fabs((double)ref);
  return fabs((double)got - (double)ref) <= *lim;
}

/* Compare n values of `got` (cuda) with `ref` (host); report the first
** mismatch and the count. Returns 1 when all are within tolerance. */
static int compare(const char *what, const char *part, const float *got, const float *ref,
                   int64_t n, double atol, double rtol) {
  int64_t bad = 0, first = -1;
  double worst = 0.0;
  for (int64_t i = 0; i < n; i++) {
    double lim, d = fabs((double)got[i] - (double)ref[i]);
    if (!within(got[i], ref[i], atol, rtol, &lim)) {
      if (first < 0) first = i;
      bad++;
    }
    if (lim > 0 && d / lim > worst) worst = d / lim;
  }
  if (verbose)
    printf("#   %s: %s: worst |d| = %.3g x tolerance over %lld elements\n", what, part, worst,
           (long long)n);
  if (bad) {
    T_FAILF("|cuda - host| <= atol + rtol*|host|",
            "%s: %s element %lld of %lld: cuda %.9g, host %.9g (%lld elements out of tolerance; "
            "worst %.3g x tolerance)",
            what, part, (long long)first, (long long)n, (double)got[first], (double)ref[first],
            (long long)bad, worst);
    return 0;
  }
  return 1;
}

typedef struct run_out {
  float *y, *g[MAXIN];
  int64_t ny;
  int ndim;
  int64_t shape[GCAP_MAXDIM];
} run_out;

static void run_out_free(run_out *o) {
  free(o->y);
  for (int i = 0; i < MAXIN; i++)
    free(o->g[i]);
}

/* Run case c on engine e with inputs data[] and weights r (r: NULL the
** first time: then filled and returned through *r). */
static int run_on(gcap_engine *e, const pcase *c, float *const *data, float **r, run_out *o) {
  gcap_tensor *x[MAXIN] = {0}, *y = NULL, *rt = NULL, *p = NULL, *l = NULL;
  int ok = 0;
  memset(o, 0, sizeof *o);
  for (int i = 0; i < c->nin; i++) {
    if (gcap_tensor_from_f32(e, c->dt, c->in[i].ndim, c->in[i].shape, data[i], &x[i]) != GCAP_OK)
      goto done;
    if (c->backward && c->in[i].grad && gcap_tensor_set_requires_grad(x[i], 1) != GCAP_OK)
      goto done;
  }
  if (c->seed && gcap_manual_seed(e, c->seed) != GCAP_OK) goto done;
  if (c->f(x, &y) != GCAP_OK) goto done;
  o->ny = gcap_tensor_numel(y);
  o->ndim = gcap_tensor_ndim(y);
  memcpy(o->shape, gcap_tensor_shape(y), sizeof(int64_t) * (size_t)o->ndim);
  o->y = malloc((size_t)(o->ny + 1) * sizeof(float));
  if (o->y == NULL || gcap_tensor_read(y, o->y, (size_t)o->ny) != GCAP_OK) goto done;
  if (c->backward) {
    if (*r == NULL) {
      *r = malloc((size_t)(o->ny + 1) * sizeof(float));
      if (*r == NULL) goto done;
      for (int64_t i = 0; i < o->ny; i++)
        (*r)[i] = urand();
    }
    if (gcap_tensor_from_f32(e, c->dt, o->ndim, o->shape, *r, &rt) != GCAP_OK ||
        gcap_mul(y, rt, &p) != GCAP_OK || gcap_sum(p, &l) != GCAP_OK ||
        gcap_backward(l, NULL, 0) != GCAP_OK)
      goto done;
    for (int i = 0; i < c->nin; i++) {
      if (!c->in[i].grad) continue;
      gcap_tensor *g = gcap_tensor_grad(x[i]);
      int64_t n = numel_of(&c->in[i]);
      if (g == NULL || gcap_tensor_numel(g) != n) goto done;
      o->g[i] = malloc((size_t)n * sizeof(float));
      if (o->g[i] == NULL || gcap_tensor_read(g, o->g[i], (size_t)n) != GCAP_OK) goto done;
    }
  }
  ok = 1;
done:
  if (!ok) T_FAILF("run", "%s on %s: %s", c->name, gcap_engine_device(e), gcap_errmsg(e));
  for (int i = 0; i < c->nin; i++)
    gcap_tensor_free(x[i]);
  gcap_tensor_free(y), gcap_tensor_free(rt), gcap_tensor_free(p), gcap_tensor_free(l);
  return ok;
}

static void parity_check_tol(const pcase *c, double atol, double rtol) {
  float *data[MAXIN] = {0}, *r = NULL;
  run_out oh, oc;
  memset(&oh, 0, sizeof oh), memset(&oc, 0, sizeof oc);
  for (int i = 0; i < c->nin; i++) {
    int64_t n = numel_of(&c->in[i]);
    data[i] = malloc((size_t)(n + 1) * sizeof(float));
    if (data[i] == NULL) goto done;
    fill(&c->in[i], data[i], n);
  }
  if (!run_on(eh, c, data, &r, &oh) || !run_on(ec, c, data, &r, &oc)) goto done;
  if (oh.ny != oc.ny || oh.ndim != oc.ndim) {
    T_FAILF("same output shape", "%s: %lld elements on the host, %lld on cuda", c->name,
            (long long)oh.ny, (long long)oc.ny);
    goto done;
  }
  compare(c->name, "output", oc.y, oh.y, oh.ny, atol, rtol);
  for (int i = 0; c->backward && i < c->nin; i++) {
    char part[32];
    if (!c->in[i].grad) continue;
    snprintf(part, sizeof part, "grad of input %d", i);
    compare(c->name, part, oc.g[i], oh.g[i], numel_of(&c->in[i]), atol, rtol);
  }
done:
  for (int i = 0; i < c->nin; i++)
    free(data[i]);
  free(r);
  run_out_free(&oh), run_out_free(&oc);
}

static void parity_check(const pcase *c) {
  if (c->dt == GCAP_BF16)
    parity_check_tol(c, BF16_ATOL, BF16_RTOL);
  else
    parity_check_tol(c, F32_ATOL, F32_RTOL);
}

/* ------------------------------------------------------------------------ */
/* Ops (the ones test_grad.c runs too are in t_data.h)                      */

static gcap_status f_scale(gcap_tensor *const *x, gcap_tensor **y) {
  return gcap_scale(x[0], 0.3, y);
}
static gcap_status f_dropout(gcap_tensor *const *x, gcap_tensor **y) {
  return gcap_dropout(x[0], 0.4, 1, y);
}
static gcap_status f_clone(gcap_tensor *const *x, gcap_tensor **y) {
  return gcap_tensor_clone(x[0], y);
}
static gcap_status f_rand(gcap_tensor *const *x, gcap_tensor **y) {
  return gcap_tensor_rand(gcap_tensor_engine(x[0]), gcap_tensor_dtype(x[0]), gcap_tensor_ndim(x[0]),
                          gcap_tensor_shape(x[0]), 0, y);
}
static gcap_status f_randn(gcap_tensor *const *x, gcap_tensor **y) {
  return gcap_tensor_rand(gcap_tensor_engine(x[0]), gcap_tensor_dtype(x[0]), gcap_tensor_ndim(x[0]),
                          gcap_tensor_shape(x[0]), 1, y);
}
static gcap_status f_full(gcap_tensor *const *x, gcap_tensor **y) {
  return gcap_tensor_full(gcap_tensor_engine(x[0]), gcap_tensor_dtype(x[0]), gcap_tensor_ndim(x[0]),
                          gcap_tensor_shape(x[0]), -2.75, y);
}
static gcap_status f_lt(gcap_tensor *const *x, gcap_tensor **y) {
  return gcap_compare(x[0], x[1], GCAP_LT, y);
}
static gcap_status f_ge(gcap_tensor *const *x, gcap_tensor **y) {
  return gcap_compare(x[0], x[1], GCAP_GE, y);
}
static gcap_status f_eq(gcap_tensor *const *x, gcap_tensor **y) {
  return gcap_compare(x[0], x[1], GCAP_EQ, y);
}
static gcap_status f_ne(gcap_tensor *const *x, gcap_tensor **y) {
  return gcap_compare(x[0], x[1], GCAP_NE, y);
}
/* f32 -> bf16 -> f32 conversions through copy_. */
/* (a * b) * (a + b): a and b get grads from two nodes, the second one's
** added into the .grads the first made, both in one foreach_add. */
static gcap_status f_mul_add(gcap_tensor *const *x, gcap_tensor **y) {
  gcap_tensor *p = NULL, *s = NULL;
  gcap_status st;
  if ((st = gcap_mul(x[0], x[1], &p)) == GCAP_OK && (st = gcap_add(x[0], x[1], &s)) == GCAP_OK)
    st = gcap_mul(p, s, y);
  gcap_tensor_free(p);
  gcap_tensor_free(s);
  return st;
}

static gcap_status f_to_bf16(gcap_tensor *const *x, gcap_tensor **y) {
  gcap_tensor *b = NULL;
  gcap_status st = gcap_tensor_empty(gcap_tensor_engine(x[0]), GCAP_BF16, gcap_tensor_ndim(x[0]),
                                     gcap_tensor_shape(x[0]), &b);
  if (st == GCAP_OK && (st = gcap_copy_(b, x[0])) == GCAP_OK) {
    *y = b;
    return GCAP_OK;
  }
  gcap_tensor_free(b);
  return st;
}

#define P0(f, g)                                                                                   \
  { 0, {0}, f, 0, g }
#define P1(a, f, g)                                                                                \
  { 1, {a}, f, 0, g }
#define P2(a, b, f, g)                                                                             \
  { 2, {a, b}, f, 0, g }
#define P3(a, b, c, f, g)                                                                          \
  { 3, {a, b, c}, f, 0, g }
#define P4(a, b, c, d, f, g)                                                                       \
  { 4, {a, b, c, d}, f, 0, g }
#define PC(n, classes)                                                                             \
  { 1, {n}, FILL_CLASS, classes, 0 }
#define PC2(a, b, classes)                                                                         \
  { 2, {a, b}, FILL_CLASS, classes, 0 }
/* 0/1 masks: (i * 7 + 3) % 2 */
#define PM2(a, b)                                                                                  \
  { 2, {a, b}, FILL_CLASS, 2, 0 }
#define PM3(a, b, c)                                                                               \
  { 3, {a, b, c}, FILL_CLASS, 2, 0 }
#define N FILL_NORMAL
#define F32 GCAP_F32
#define BF GCAP_BF16

static const pcase cases[] = {
    /* elementwise, f32 */
    {"add", f_add, F32, 1, 0, 2, {P2(33, 70, N, 1), P2(33, 70, N, 1)}},
    {"add 0-D", f_add, F32, 1, 0, 2, {P2(33, 70, N, 1), P0(N, 1)}},
    {"add row", f_add, F32, 1, 0, 2, {P3(3, 33, 70, N, 1), P1(70, N, 1)}},
    {"add row first", f_add, F32, 1, 0, 2, {P1(70, N, 1), P2(33, 70, N, 1)}},
    {"add [64,96] (16-byte packs)", f_add, F32, 1, 0, 2, {P2(64, 96, N, 1), P2(64, 96, N, 1)}},
    {"sub", f_sub, F32, 1, 0, 2, {P2(33, 70, N, 1), P2(33, 70, N, 1)}},
    {"sub 0-D first", f_sub, F32, 1, 0, 2, {P0(N, 1), P2(33, 70, N, 1)}},
    {"sub row", f_sub, F32, 1, 0, 2, {P2(33, 70, N, 1), P1(70, N, 1)}},
    {"mul", f_mul, F32, 1, 0, 2, {P2(33, 70, N, 1), P2(33, 70, N, 1)}},
    {"mul [1]", f_mul, F32, 1, 0, 2, {P2(33, 70, N, 1), P1(1, N, 1)}},
    {"mul row", f_mul, F32, 1, 0, 2, {P2(33, 70, N, 1), P1(70, N, 1)}},
    {"(a * b) * (a + b)", f_mul_add, F32, 1, 0, 2, {P2(33, 70, N, 1), P2(33, 70, N, 1)}},
    {"div", f_div, F32, 1, 0, 2, {P2(33, 70, N, 1), P2(33, 70, FILL_AWAY, 1)}},
    {"div [64,96] (16-byte packs)",
     f_div,
     F32,
     1,
     0,
     2,
     {P2(64, 96, N, 1), P2(64, 96, FILL_AWAY, 1)}},
    {"div 0-D first", f_div, F32, 1, 0, 2, {P0(N, 1), P2(33, 70, FILL_AWAY, 1)}},
    {"div row", f_div, F32, 1, 0, 2, {P2(33, 70, N, 1), P1(70, FILL_AWAY, 1)}},
    {"pow", f_pow, F32, 1, 0, 2, {P2(33, 70, FILL_POS, 1), P2(33, 70, N, 1)}},
    {"pow 0-D exponent", f_pow, F32, 1, 0, 2, {P2(33, 70, FILL_POS, 1), P0(N, 1)}},
    {"pow 0-D base", f_pow, F32, 1, 0, 2, {P0(FILL_POS, 1), P2(33, 70, N, 1)}},
    {"pow row exponent", f_pow, F32, 1, 0, 2, {P2(33, 70, FILL_POS, 1), P1(70, N, 1)}},
    {"lt", f_lt, F32, 0, 0, 2, {P2(33, 70, N, 0), P2(33, 70, N, 0)}},
    {"ge row", f_ge, F32, 0, 0, 2, {P2(33, 70, N, 0), P1(70, N, 0)}},
    {"eq 0/1 masks", f_eq, F32, 0, 0, 2, {PM2(33, 70), PM2(33, 70)}},
    {"scale", f_scale, F32, 1, 0, 1, {P1(5000, N, 1)}},
    {"neg", f_neg, F32, 1, 0, 1, {P2(33, 70, N, 1)}},
    {"sum [33,70]", f_sum, F32, 1, 0, 1, {P2(33, 70, N, 1)}},
    {"sum [100003]", f_sum, F32, 1, 0, 1, {P1(100003, FILL_POS, 1)}},
    {"sum [64,96] (grad spread in packs)", f_sum, F32, 1, 0, 1, {P2(64, 96, N, 1)}},
    {"mean [257,129]", f_mean, F32, 1, 0, 1, {P2(257, 129, FILL_POS, 1)}},
    {"sum [1048579] (in chunks)", f_sum, F32, 1, 0, 1, {P1(1048579, FILL_POS, 1)}},
    {"relu", f_relu, F32, 1, 0, 1, {P2(33, 70, FILL_AWAY, 1)}},
    {"gelu", f_gelu, F32, 1, 0, 1, {P2(33, 70, N, 1)}},
    {"clone", f_clone, F32, 0, 0, 1, {P1(1000, N, 0)}},
    {"fill", f_full, F32, 0, 0, 1, {P2(10, 10, N, 0)}},
    {"fill [3,7] (not whole packs)", f_full, F32, 0, 0, 1, {P2(3, 7, N, 0)}},
    {"bf16 fill", f_full, BF, 0, 0, 1, {P2(8, 16, N, 0)}},
    {"copy f32 -> bf16", f_to_bf16, F32, 0, 0, 1, {P1(4099, N, 0)}},
    /* linear algebra */
    {"matmul [37,53]x[53,29]", f_matmul, F32, 1, 0, 2, {P2(37, 53, N, 1), P2(53, 29, N, 1)}},
    {"matmul [128,64]x[64,96]", f_matmul, F32, 1, 0, 2, {P2(128, 64, N, 1), P2(64, 96, N, 1)}},
    {"matmul [1,17]x[17,1]", f_matmul, F32, 1, 0, 2, {P2(1, 17, N, 1), P2(17, 1, N, 1)}},
    {"linear 2-D bias", f_linear, F32, 1, 0, 3, {P2(40, 24, N, 1), P2(48, 24, N, 1), P1(48, N, 1)}},
    {"linear 2-D no bias", f_linear_nb, F32, 1, 0, 2, {P2(40, 24, N, 1), P2(48, 24, N, 1)}},
    {"linear 3-D bias",
     f_linear,
     F32,
     1,
     0,
     3,
     {P3(3, 7, 32, N, 1), P2(20, 32, N, 1), P1(20, N, 1)}},
    {"linear 3-D no bias", f_linear_nb, F32, 1, 0, 2, {P3(3, 7, 32, N, 1), P2(20, 32, N, 1)}},
    /* linear then gelu in one GEMM: out 48 and 64 have cuBLASLt's gelu epilogue,
       out 20 is not a multiple of 8 and takes the GEMM-then-gelu path; 2048
       rows sum the bias grad in chunks */
    {"linear_gelu 2-D bias",
     f_linear_gelu,
     F32,
     1,
     0,
     3,
     {P2(40, 24, N, 1), P2(48, 24, N, 1), P1(48, N, 1)}},
    {"linear_gelu 2-D no bias",
     f_linear_gelu_nb,
     F32,
     1,
     0,
     2,
     {P2(40, 24, N, 1), P2(48, 24, N, 1)}},
    {"linear_gelu out 20",
     f_linear_gelu,
     F32,
     1,
     0,
     3,
     {P3(3, 7, 32, N, 1), P2(20, 32, N, 1), P1(20, N, 1)}},
    /* rows */
    {"layer_norm weight bias",
     f_ln_wb,
     F32,
     1,
     0,
     3,
     {P2(33, 70, N, 1), P1(70, N, 1), P1(70, N, 1)}},
    {"layer_norm [4,1024]",
     f_ln_wb,
     F32,
     1,
     0,
     3,
     {P2(4, 1024, N, 1), P1(1024, N, 1), P1(1024, N, 1)}},
    {"layer_norm no params", f_ln, F32, 1, 0, 1, {P3(2, 5, 96, N, 1)}},
    /* rows held by a warp (1 to 8 packs of 16 bytes a lane), aligned and not, and
       too long for it; the parameter grads in chunks of rows (f32 over a thousand
       rows: test_layer_norm_many_rows) */
    {"layer_norm [40,1000]",
     f_ln_wb,
     F32,
     1,
     0,
     3,
     {P2(40, 1000, N, 1), P1(1000, N, 1), P1(1000, N, 1)}},
    {"layer_norm [6,1500]",
     f_ln_wb,
     F32,
     1,
     0,
     3,
     {P2(6, 1500, N, 1), P1(1500, N, 1), P1(1500, N, 1)}},
    {"bf16 layer_norm [1100,768]",
     f_ln_wb,
     BF,
     1,
     0,
     3,
     {P2(1100, 768, N, 1), P1(768, N, 1), P1(768, N, 1)}},
    {"bf16 layer_norm [64,256]",
     f_ln_wb,
     BF,
     1,
     0,
     3,
     {P2(64, 256, N, 1), P1(256, N, 1), P1(256, N, 1)}},
    {"bf16 layer_norm [20,600]",
     f_ln_wb,
     BF,
     1,
     0,
     3,
     {P2(20, 600, N, 1), P1(600, N, 1), P1(600, N, 1)}},
    {"bf16 layer_norm [20,1030]",
     f_ln_wb,
     BF,
     1,
     0,
     3,
     {P2(20, 1030, N, 1), P1(1030, N, 1), P1(1030, N, 1)}},
    {"bf16 layer_norm [8,2048]",
     f_ln_wb,
     BF,
     1,
     0,
     3,
     {P2(8, 2048, N, 1), P1(2048, N, 1), P1(2048, N, 1)}},
    /* the parameter grads in several chunks of rows held 8, 6 and (rows not
    ** whole packs) 4 packs a lane */
    {"bf16 layer_norm [300,2048]",
     f_ln_wb,
     BF,
     1,
     0,
     3,
     {P2(300, 2048, N, 1), P1(2048, N, 1), P1(2048, N, 1)}},
    {"bf16 layer_norm [200,1280]",
     f_ln_wb,
     BF,
     1,
     0,
     3,
     {P2(200, 1280, N, 1), P1(1280, N, 1), P1(1280, N, 1)}},
    {"bf16 layer_norm [130,775]",
     f_ln_wb,
     BF,
     1,
     0,
     3,
     {P2(130, 775, N, 1), P1(775, N, 1), P1(775, N, 1)}},
    {"bf16 layer_norm [4,3000]",
     f_ln_wb,
     BF,
     1,
     0,
     3,
     {P2(4, 3000, N, 1), P1(3000, N, 1), P1(3000, N, 1)}},
    {"bf16 layer_norm no params [1024,64]", f_ln, BF, 1, 0, 1, {P2(1024, 64, N, 1)}},
    {"softmax [33,70]", f_softmax, F32, 1, 0, 1, {P2(33, 70, N, 1)}},
    {"softmax [8,1000]", f_softmax, F32, 1, 0, 1, {P2(8, 1000, N, 1)}},
    /* rows held by a warp (1, 2 or 4 packs of 16 bytes a lane), by a block
       (1, 2 or 4 a thread), and too long for either; rows of whole aligned
       packs and rows that are not */
    {"softmax [16,200]", f_softmax, F32, 1, 0, 1, {P2(16, 200, N, 1)}},
    {"softmax [3,1800]", f_softmax, F32, 1, 0, 1, {P2(3, 1800, N, 1)}},
    {"softmax [5,3000]", f_softmax, F32, 1, 0, 1, {P2(5, 3000, N, 1)}},
    {"softmax [7,2047]", f_softmax, F32, 1, 0, 1, {P2(7, 2047, N, 1)}},
    {"softmax [3,4500]", f_softmax, F32, 1, 0, 1, {P2(3, 4500, N, 1)}},
    {"bf16 softmax [6,1024]", f_softmax, BF, 1, 0, 1, {P2(6, 1024, N, 1)}},
    {"bf16 softmax [4,2050]", f_softmax, BF, 1, 0, 1, {P2(4, 2050, N, 1)}},
    {"bf16 softmax [2,8192]", f_softmax, BF, 1, 0, 1, {P2(2, 8192, N, 1)}},
    {"bf16 softmax [2,9000]", f_softmax, BF, 1, 0, 1, {P2(2, 9000, N, 1)}},
    {"dropout (seeded)", f_dropout, F32, 1, 4242, 1, {P2(64, 64, N, 1)}},
    {"mse_loss", f_mse, F32, 1, 0, 2, {P2(33, 70, N, 1), P2(33, 70, N, 1)}},
    {"cross_entropy [16,10]", f_xent, F32, 1, 0, 2, {P2(16, 10, N, 1), PC(16, 10)}},
    {"cross_entropy [64,1000]", f_xent, F32, 1, 0, 2, {P2(64, 1000, N, 1), PC(64, 1000)}},
    /* rows held by a warp and by a block, aligned and not, and too long for either */
    {"cross_entropy [40,128]", f_xent, F32, 1, 0, 2, {P2(40, 128, N, 1), PC(40, 128)}},
    {"cross_entropy [9,3000]", f_xent, F32, 1, 0, 2, {P2(9, 3000, N, 1), PC(9, 3000)}},
    {"cross_entropy [3,5000]", f_xent, F32, 1, 0, 2, {P2(3, 5000, N, 1), PC(3, 5000)}},
    {"bf16 cross_entropy [33,64]", f_xent, BF, 1, 0, 2, {P2(33, 64, N, 1), PC(33, 64)}},
    {"bf16 cross_entropy [8,250]", f_xent, BF, 1, 0, 2, {P2(8, 250, N, 1), PC(8, 250)}},
    {"rand uniform (seeded)", f_rand, F32, 0, 99, 1, {P1(10000, N, 0)}},
    {"rand normal (seeded)", f_randn, F32, 0, 99, 1, {P1(10000, N, 0)}},
    /* batched matmul: one strided launch, a broadcast operand (stride 0), and a
       broadcast along one batch dim each (one launch per first index) */
    {"matmul [2,3,17,9]x[2,3,9,13]",
     f_matmul,
     F32,
     1,
     0,
     2,
     {P4(2, 3, 17, 9, N, 1), P4(2, 3, 9, 13, N, 1)}},
    {"matmul [2,3,17,9]x[9,13]", f_matmul, F32, 1, 0, 2, {P4(2, 3, 17, 9, N, 1), P2(9, 13, N, 1)}},
    {"matmul [2,1,17,9]x[1,3,9,13]",
     f_matmul,
     F32,
     1,
     0,
     2,
     {P4(2, 1, 17, 9, N, 1), P4(1, 3, 9, 13, N, 1)}},
    {"matmul [4,64,32]x[4,32,64]",
     f_matmul,
     F32,
     1,
     0,
     2,
     {P3(4, 64, 32, N, 1), P3(4, 32, 64, N, 1)}},
    /* masks */
    {"softmax scaled, additive mask [2,1,33,70]",
     f_softmax_add,
     F32,
     1,
     0,
     2,
     {P4(2, 3, 33, 70, N, 1), P4(2, 1, 33, 70, N, 0)}},
    {"softmax causal, boolean mask [17,17]",
     f_softmax_bool_causal,
     F32,
     1,
     0,
     2,
     {P4(2, 3, 17, 17, N, 1), PM2(17, 17)}},
    {"softmax causal [4,300,300]", f_softmax_causal, F32, 1, 0, 1, {P3(4, 300, 300, N, 1)}},
    {"softmax scaled, additive mask [2,1,33,1]",
     f_softmax_add,
     F32,
     1,
     0,
     2,
     {P4(2, 3, 33, 70, N, 1), P4(2, 1, 33, 1, N, 0)}},
    {"softmax causal, boolean mask [40,4500]",
     f_softmax_bool_causal,
     F32,
     1,
     0,
     2,
     {P4(1, 2, 40, 4500, N, 1), PM2(40, 4500)}},
    {"bf16 softmax causal [4,300,300]", f_softmax_causal, BF, 1, 0, 1, {P3(4, 300, 300, N, 1)}},
    {"masked_fill [3,1,70] over [2,3,33,70]",
     f_masked_fill,
     F32,
     1,
     0,
     2,
     {P4(2, 3, 33, 70, N, 1), PM3(3, 1, 70)}},
    {"bf16 softmax scaled, additive mask",
     f_softmax_add,
     BF,
     1,
     0,
     2,
     {P4(2, 3, 33, 70, N, 1), P4(2, 1, 33, 70, N, 0)}},
    {"bf16 softmax causal, boolean mask",
     f_softmax_bool_causal,
     BF,
     1,
     0,
     2,
     {P4(2, 3, 17, 17, N, 1), PM2(17, 17)}},
    {"bf16 masked_fill", f_masked_fill, BF, 1, 0, 2, {P4(2, 3, 33, 70, N, 1), PM3(3, 1, 70)}},
    {"embedding [4,33] ids into [50,70]",
     f_embedding,
     F32,
     1,
     0,
     2,
     {PC2(4, 33, 50), P2(50, 70, N, 1)}},
    {"bf16 embedding [4,33] ids into [50,70]",
     f_embedding,
     BF,
     1,
     0,
     2,
     {PC2(4, 33, 50), P2(50, 70, N, 1)}},

    /* shapes */
    {"permute [3,4,5,6] (2,0,3,1)", f_permute, F32, 1, 0, 1, {P4(3, 4, 5, 6, N, 1)}},
    {"permute heads [5,3,4,8] (16-byte rows)",
     f_permute_heads,
     F32,
     1,
     0,
     1,
     {P4(5, 3, 4, 8, N, 1)}},
    {"permute heads [5,3,4,6] (element rows)",
     f_permute_heads,
     F32,
     1,
     0,
     1,
     {P4(5, 3, 4, 6, N, 1)}},
    {"merge heads [3,4,5,6]", f_merge_heads, F32, 1, 0, 1, {P4(3, 4, 5, 6, N, 1)}},
    {"transpose [2,33,70] (-1,-2)", f_transpose, F32, 1, 0, 1, {P3(2, 33, 70, N, 1)}},
    {"split [2,7,5] dim 1 then cat", f_split_cat, F32, 1, 0, 1, {P3(2, 7, 5, N, 1)}},
    {"split [2,8,4] dim 1 then cat (16-byte rows)", f_split_cat, F32, 1, 0, 1, {P3(2, 8, 4, N, 1)}},
    /* bf16 */
    {"bf16 matmul [2,3,17,9]x[2,3,9,13]",
     f_matmul,
     BF,
     1,
     0,
     2,
     {P4(2, 3, 17, 9, N, 1), P4(2, 3, 9, 13, N, 1)}},
    {"bf16 matmul [2,1,17,9]x[1,3,9,13]",
     f_matmul,
     BF,
     1,
     0,
     2,
     {P4(2, 1, 17, 9, N, 1), P4(1, 3, 9, 13, N, 1)}},
    {"bf16 matmul [4,64,32]x[32,64]",
     f_matmul,
     BF,
     1,
     0,
     2,
     {P3(4, 64, 32, N, 1), P2(32, 64, N, 1)}},
    {"bf16 permute [3,4,5,6] (2,0,3,1)", f_permute, BF, 1, 0, 1, {P4(3, 4, 5, 6, N, 1)}},
    {"bf16 permute heads [5,3,4,16] (16-byte rows)",
     f_permute_heads,
     BF,
     1,
     0,
     1,
     {P4(5, 3, 4, 16, N, 1)}},
    {"bf16 permute heads [5,3,4,6] (element rows)",
     f_permute_heads,
     BF,
     1,
     0,
     1,
     {P4(5, 3, 4, 6, N, 1)}},
    {"bf16 merge heads [3,4,5,64]", f_merge_heads, BF, 1, 0, 1, {P4(3, 4, 5, 64, N, 1)}},
    {"bf16 transpose [2,33,70]", f_transpose, BF, 1, 0, 1, {P3(2, 33, 70, N, 1)}},
    {"bf16 split then cat", f_split_cat, BF, 1, 0, 1, {P3(2, 7, 5, N, 1)}},
    {"bf16 split [3,9,16] then cat (16-byte rows)", f_split_cat, BF, 1, 0, 1, {P3(3, 9, 16, N, 1)}},
    {"bf16 add", f_add, BF, 1, 0, 2, {P2(33, 70, N, 1), P2(33, 70, N, 1)}},
    {"bf16 add row", f_add, BF, 1, 0, 2, {P2(33, 70, N, 1), P1(70, N, 1)}},
    {"bf16 sub 0-D", f_sub, BF, 1, 0, 2, {P2(33, 70, N, 1), P0(N, 1)}},
    {"bf16 mul", f_mul, BF, 1, 0, 2, {P2(33, 70, N, 1), P2(33, 70, N, 1)}},
    {"bf16 ne 0-D", f_ne, BF, 0, 0, 2, {P2(33, 70, N, 0), P0(N, 0)}},
    {"bf16 div", f_div, BF, 1, 0, 2, {P2(33, 70, N, 1), P2(33, 70, FILL_AWAY, 1)}},
    {"bf16 pow", f_pow, BF, 1, 0, 2, {P2(33, 70, FILL_POS, 1), P2(33, 70, N, 1)}},
    {"bf16 mul [64,96] (16-byte packs)", f_mul, BF, 1, 0, 2, {P2(64, 96, N, 1), P2(64, 96, N, 1)}},
    {"bf16 sub [64,96] (16-byte packs)", f_sub, BF, 1, 0, 2, {P2(64, 96, N, 1), P2(64, 96, N, 1)}},
    {"bf16 scale", f_scale, BF, 1, 0, 1, {P1(5000, N, 1)}},
    {"bf16 neg", f_neg, BF, 1, 0, 1, {P1(5000, N, 1)}},
    {"bf16 relu", f_relu, BF, 1, 0, 1, {P2(33, 70, FILL_AWAY, 1)}},
    {"bf16 gelu", f_gelu, BF, 1, 0, 1, {P2(33, 70, N, 1)}},
    {"bf16 sum", f_sum, BF, 1, 0, 1, {P2(33, 70, FILL_POS, 1)}},
    {"bf16 sum [64,96] (grad spread in packs)", f_sum, BF, 1, 0, 1, {P2(64, 96, FILL_POS, 1)}},
    {"bf16 sum [1048579] (in chunks)", f_sum, BF, 1, 0, 1, {P1(1048579, FILL_POS, 1)}},
    {"bf16 matmul [37,53]x[53,29]", f_matmul, BF, 1, 0, 2, {P2(37, 53, N, 1), P2(53, 29, N, 1)}},
    {"bf16 matmul [64,128]x[128,32]",
     f_matmul,
     BF,
     1,
     0,
     2,
     {P2(64, 128, N, 1), P2(128, 32, N, 1)}},
    {"bf16 linear", f_linear, BF, 1, 0, 3, {P2(40, 24, N, 1), P2(48, 24, N, 1), P1(48, N, 1)}},
    {"bf16 linear_gelu",
     f_linear_gelu,
     BF,
     1,
     0,
     3,
     {P2(40, 24, N, 1), P2(48, 24, N, 1), P1(48, N, 1)}},
    {"bf16 linear_gelu 2048 rows",
     f_linear_gelu,
     BF,
     1,
     0,
     3,
     {P2(2048, 32, N, 1), P2(64, 32, N, 1), P1(64, N, 1)}},
};

#define NCASES ((int)(sizeof cases / sizeof cases[0]))

static const pcase *cur_case;
static void run_cur_case(void) {
  parity_check(cur_case);
}

/* Linear then gelu over 2048 rows: the bias grad summed in chunks. The
** weight grad sums 2048 products of O(1) into values near 0.1, and the
** rounding of such a sum grows with the square root of its length: atol
** 2e-4 here, against the 1e-5 of short sums. */
static void test_linear_gelu_many_rows(void) {
  static const pcase c = {.name = "linear_gelu 2048 rows",
                          .f = f_linear_gelu,
                          .dt = F32,
                          .backward = 1,
                          .nin = 3,
                          .in = {P2(2048, 32, N, 1), P2(64, 32, N, 1), P1(64, N, 1)}};
  parity_check_tol(&c, 2e-4, F32_RTOL);
}

/* LayerNorm over about a thousand rows, f32: its weight and bias grads are
** such long sums (in chunks on cuda), so atol 2e-4 as above; rows of a warp
** of 6 packs a lane, and of unaligned rows of 1 pack; then 8200 rows. */
static void test_layer_norm_many_rows(void) {
  static const pcase c[] = {{"layer_norm [1100,768]",
                             f_ln_wb,
                             F32,
                             1,
                             0,
                             3,
                             {P2(1100, 768, N, 1), P1(768, N, 1), P1(768, N, 1)}},
                            {"layer_norm [1030,101]",
                             f_ln_wb,
                             F32,
                             1,
                             0,
                             3,
                             {P2(1030, 101, N, 1), P1(101, N, 1), P1(101, N, 1)}}};
  /* the most chunks cuda sums the parameter grads in (GC_LN_PARAMS_CHUNKS):
  ** sums of 8200 rows, atol 1e-3 */
  static const pcase most = {"layer_norm [8200,96]",
                             f_ln_wb,
                             F32,
                             1,
                             0,
                             3,
                             {P2(8200, 96, N, 1), P1(96, N, 1), P1(96, N, 1)}};
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++)
    parity_check_tol(&c[i], 2e-4, F32_RTOL);
  parity_check_tol(&most, 1e-3, F32_RTOL);
}

/* Attention: the fused kernels on cuda against the host's (which equal the
** composition bit for bit in f32), then the composition (impl "auto") on
** both. The softmax's sums run in another order (tile by tile) and bf16 is
** rounded at other points (the host's fused kernels keep f32 weights, cuda's
** round them for the tensor cores, the composition rounds its scores and
** weights): f32 atol 1e-4, bf16 3e-2. */
static const pcase attn_cases[] = {
    {"sdpa [2,3,40,16]",
     f_sdpa_fz,
     F32,
     1,
     0,
     3,
     {P4(2, 3, 40, 16, N, 1), P4(2, 3, 40, 16, N, 1), P4(2, 3, 40, 16, N, 1)}},
    {"sdpa causal dropout (seeded) [2,2,70,32]",
     f_sdpa_fz_causal_dropout,
     F32,
     1,
     4242,
     3,
     {P4(2, 2, 70, 32, N, 1), P4(2, 2, 70, 32, N, 1), P4(2, 2, 70, 32, N, 1)}},
    {"sdpa boolean mask, Sq 24 Sk 40",
     f_sdpa_fz_mask,
     F32,
     1,
     0,
     4,
     {P4(2, 3, 24, 16, N, 1), P4(2, 3, 40, 16, N, 1), P4(2, 3, 40, 8, N, 1), PM2(24, 40)}},
    {"sdpa [2,2,200,64] (tiles, blocks)",
     f_sdpa_fz,
     F32,
     1,
     0,
     3,
     {P4(2, 2, 200, 64, N, 1), P4(2, 2, 200, 64, N, 1), P4(2, 2, 200, 64, N, 1)}},
    {"sdpa causal dropout D 128, Sq 130 Sk 77",
     f_sdpa_fz_causal_dropout,
     F32,
     1,
     77,
     3,
     {P3(3, 130, 128, N, 1), P3(3, 77, 128, N, 1), P3(3, 77, 100, N, 1)}},
    {"bf16 sdpa [2,2,200,64]",
     f_sdpa_fz,
     BF,
     1,
     0,
     3,
     {P4(2, 2, 200, 64, N, 1), P4(2, 2, 200, 64, N, 1), P4(2, 2, 200, 64, N, 1)}},
    {"bf16 sdpa [2,3,40,16]",
     f_sdpa_fz,
     BF,
     1,
     0,
     3,
     {P4(2, 3, 40, 16, N, 1), P4(2, 3, 40, 16, N, 1), P4(2, 3, 40, 16, N, 1)}},
    {"bf16 sdpa causal dropout (seeded)",
     f_sdpa_fz_causal_dropout,
     BF,
     1,
     4242,
     3,
     {P4(2, 2, 70, 32, N, 1), P4(2, 2, 70, 32, N, 1), P4(2, 2, 70, 32, N, 1)}},
    {"bf16 sdpa causal dropout D 128, Sq 130 Sk 77",
     f_sdpa_fz_causal_dropout,
     BF,
     1,
     77,
     3,
     {P3(3, 130, 128, N, 1), P3(3, 77, 128, N, 1), P3(3, 77, 100, N, 1)}},
    {"bf16 sdpa boolean mask",
     f_sdpa_fz_mask,
     BF,
     1,
     0,
     4,
     {P4(2, 3, 24, 16, N, 1), P4(2, 3, 40, 16, N, 1), P4(2, 3, 40, 8, N, 1), PM2(24, 40)}},
    {"sdpa composed causal dropout (seeded) [2,2,70,32]",
     f_sdpa_causal_dropout,
     F32,
     1,
     4242,
     3,
     {P4(2, 2, 70, 32, N, 1), P4(2, 2, 70, 32, N, 1), P4(2, 2, 70, 32, N, 1)}},
    {"sdpa composed boolean mask, Sq 24 Sk 40",
     f_sdpa_mask,
     F32,
     1,
     0,
     4,
     {P4(2, 3, 24, 16, N, 1), P4(2, 3, 40, 16, N, 1), P4(2, 3, 40, 8, N, 1), PM2(24, 40)}},
    {"bf16 sdpa composed [2,2,200,64]",
     f_sdpa,
     BF,
     1,
     0,
     3,
     {P4(2, 2, 200, 64, N, 1), P4(2, 2, 200, 64, N, 1), P4(2, 2, 200, 64, N, 1)}},
};

static void test_attention_parity(void) {
  for (size_t i = 0; i < sizeof attn_cases / sizeof attn_cases[0]; i++) {
    const pcase *c = &attn_cases[i];
    if (c->dt == GCAP_BF16)
      parity_check_tol(c, 3e-2, 3e-2);
    else
      parity_check_tol(c, 1e-4, F32_RTOL);
  }
}

/* cuDNN's attention on cuda (impl cudnn, which fails where it cannot run)
** against the composition on the host, the reference; causal or not, no
** dropout. */
static gcap_status sdpa_dnn(gcap_tensor *const *x, int causal, gcap_tensor **y) {
  gcap_sdpa_opts o = {.is_causal = causal, .impl = GCAP_SDPA_COMPOSED};
  if (strcmp(gcap_engine_device(gcap_tensor_engine(x[0])), "cuda") == 0) o.impl = GCAP_SDPA_CUDNN;
  return gcap_scaled_dot_product_attention(x[0], x[1], x[2], &o, y);
}
static gcap_status f_sdpa_dnn(gcap_tensor *const *x, gcap_tensor **y) {
  return sdpa_dnn(x, 0, y);
}
static gcap_status f_sdpa_dnn_causal(gcap_tensor *const *x, gcap_tensor **y) {
  return sdpa_dnn(x, 1, y);
}

#define DNN(name, f, b, h, sq, sk, d)                                                              \
  {                                                                                                \
    name, f, BF, 1, 0, 3, {                                                                        \
      P4(b, h, sq, d, N, 1), P4(b, h, sk, d, N, 1), P4(b, h, sk, d, N, 1)                          \
    }                                                                                              \
  }
static const pcase dnn_cases[] = {
    DNN("bf16 sdpa cudnn [2,3,128,64]", f_sdpa_dnn, 2, 3, 128, 128, 64),
    DNN("bf16 sdpa cudnn causal [2,3,128,64]", f_sdpa_dnn_causal, 2, 3, 128, 128, 64),
    DNN("bf16 sdpa cudnn [2,3,128,128]", f_sdpa_dnn, 2, 3, 128, 128, 128),
    DNN("bf16 sdpa cudnn causal [2,3,128,128]", f_sdpa_dnn_causal, 2, 3, 128, 128, 128),
    DNN("bf16 sdpa cudnn [1,2,1024,64]", f_sdpa_dnn, 1, 2, 1024, 1024, 64),
    DNN("bf16 sdpa cudnn causal [1,2,1024,64]", f_sdpa_dnn_causal, 1, 2, 1024, 1024, 64),
    DNN("bf16 sdpa cudnn [1,2,1024,128]", f_sdpa_dnn, 1, 2, 1024, 1024, 128),
    DNN("bf16 sdpa cudnn causal [1,2,1024,128]", f_sdpa_dnn_causal, 1, 2, 1024, 1024, 128),
    DNN("bf16 sdpa cudnn causal Sq 136 Sk 200 D 64", f_sdpa_dnn_causal, 1, 2, 136, 200, 64),
};
#undef DNN

/* Why cuDNN cannot run on the cuda engine at all (this build has none, or
** libcudnn.so.9 does not load), or NULL: then each case must pass. */
static const char *cudnn_missing(void) {
  static const int64_t s[4] = {1, 1, 16, 8};
  static char why[1024];
  gcap_sdpa_opts o = {.impl = GCAP_SDPA_CUDNN};
  gcap_tensor *q = NULL, *y = NULL;
  gcap_status st = gcap_tensor_rand(ec, GCAP_BF16, 4, s, 1, &q);
  if (st == GCAP_OK) st = gcap_scaled_dot_product_attention(q, q, q, &o, &y);
  snprintf(why, sizeof why, "%s", gcap_errmsg(ec));
  gcap_tensor_free(y);
  gcap_tensor_free(q);
  if (st != GCAP_OK &&
      (strstr(why, "this build has no cuDNN") || strstr(why, "could not be loaded")))
    return why;
  return NULL;
}

/* cuDNN forward and backward within the bf16 tolerance of the attention
** cases above (cuDNN keeps f32 scores and rounds the weights to bf16 for
** its products; the composition rounds its scores and weights). */
static void test_cudnn_attention_parity(void) {
  for (size_t i = 0; i < sizeof dnn_cases / sizeof dnn_cases[0]; i++)
    parity_check_tol(&dnn_cases[i], 3e-2, 3e-2);
}

/* Bitwise: the dropout masks of both backends are the same (a pure function
** of seed and counter); so are uniform draws. */
static void test_dropout_masks_identical(void) {
  enum { NX = 4096 };
  static float dx[NX], yh[NX], yc[NX];
  const int64_t s[1] = {NX};
  for (int i = 0; i < NX; i++)
    dx[i] = 1.0f + (float)(i % 7);
  gcap_tensor *xh = t_from(eh, 1, s, dx), *xc = t_from(ec, 1, s, dx), *oh = NULL, *oc = NULL;
  T_REQUIRE(xh && xc);
  for (int k = 0; k < 3; k++) { /* the generator advances alike too */
    if (k == 0) {
      T_CHECK_OK(eh, gcap_manual_seed(eh, 31));
      T_CHECK_OK(ec, gcap_manual_seed(ec, 31));
    }
    T_CHECK_OK(eh, gcap_dropout(xh, 0.5, 1, &oh));
    T_CHECK_OK(ec, gcap_dropout(xc, 0.5, 1, &oc));
    if (t_read(oh, yh, NX) && t_read(oc, yc, NX)) {
      int diff = 0, first = -1;
      for (int i = 0; i < NX; i++)
        if ((yh[i] == 0.0f) != (yc[i] == 0.0f)) diff++, first = first < 0 ? i : first;
      if (diff)
        T_FAILF("same masks", "draw %d: %d of %d mask entries differ (first at %d)", k + 1, diff,
                NX, first);
    }
    gcap_tensor_free(oh), gcap_tensor_free(oc);
    oh = oc = NULL;
  }
  gcap_tensor_free(xh), gcap_tensor_free(xc);
}

/* Optimizer steps (SGD with momentum and weight decay; Adam; AdamW) on
** both, the learning rate changed between steps (set_lr), as a schedule. */
static void optim_parity(int kind) {
  static const char *const names[3] = {"SGD momentum", "Adam", "AdamW"};
  enum { NPAR = 1000, STEPS = 3 };
  static float d[NPAR], g[NPAR], ph[NPAR], pc[NPAR];
  const int64_t s[1] = {NPAR};
  for (int i = 0; i < NPAR; i++)
    d[i] = urand();
  gcap_tensor *p[2] = {t_from(eh, 1, s, d), t_from(ec, 1, s, d)};
  gcap_optim *o[2] = {NULL, NULL};
  gcap_engine *es[2] = {eh, ec};
  T_REQUIRE(p[0] && p[1]);
  for (int b = 0; b < 2; b++) {
    T_CHECK_OK(es[b], gcap_tensor_set_requires_grad(p[b], 1));
    if (kind == 1)
      T_CHECK_OK(es[b], gcap_optim_adam(es[b], 1, &p[b], 0.01, 0.9, 0.999, 1e-8, 0.01, &o[b]));
    else if (kind == 2)
      T_CHECK_OK(es[b], gcap_optim_adamw(es[b], 1, &p[b], 0.01, 0.9, 0.999, 1e-8, 0.1, &o[b]));
    else
      T_CHECK_OK(es[b], gcap_optim_sgd(es[b], 1, &p[b], 0.1, 0.9, 0.01, &o[b]));
  }
  for (int k = 0; k < STEPS; k++) {
    for (int b = 0; b < 2 && k > 0; b++)
      T_CHECK_OK(es[b], gcap_optim_set_lr(o[b], gcap_optim_lr(o[b]) * 0.5));
    for (int i = 0; i < NPAR; i++)
      g[i] = urand();
    for (int b = 0; b < 2; b++) {
      gcap_tensor *gt = t_from(es[b], 1, s, g);
      T_REQUIRE(gt != NULL);
      T_CHECK_OK(es[b], gcap_tensor_set_grad(p[b], gt));
      gcap_tensor_free(gt);
      T_CHECK_OK(es[b], gcap_optim_step(o[b]));
    }
    if (t_read(p[0], ph, NPAR) && t_read(p[1], pc, NPAR)) {
      char what[48];
      snprintf(what, sizeof what, "%s step %d", names[kind], k + 1);
      compare(what, "parameter", pc, ph, NPAR, F32_ATOL, F32_RTOL);
    }
  }
  for (int b = 0; b < 2; b++)
    gcap_optim_free(o[b]), gcap_tensor_free(p[b]);
}
static void test_sgd_parity(void) {
  optim_parity(0);
}
static void test_adam_parity(void) {
  optim_parity(1);
}
static void test_adamw_parity(void) {
  optim_parity(2);
}

/* FP8 modules under a DelayedScaling autocast (history 4), cuda's
** cuBLASLt FP8 GEMMs against the host's f32 GEMMs of the dequantized
** values: the same parameters (bytes copied from the host's), inputs and
** output weights on both; `steps` steps of forward and backward, each step's
** output, input grad and parameter grads compared, then the modules' FP8
** state. A Linear's quantized operands are the same bytes on both (the grad
** is the fixed weights r), and both multiply the FP8 values unrounded, so
** only the accumulation order differs: FP8_F32 1e-3 + 1e-3|ref|, FP8_BF16
** 2e-2 + 2e-2|ref|. In a LayerNormMLP fc2's input and fc1's grad come from
** each backend's own results (layer norm and gelu kernels differ in the last
** bf16 bit): 0.1 + 0.05|ref|, and the weight grads room for the FP8
** rounding flips that follow (fp8_mlp_param_grads). */
typedef struct fp8_case {
  const char *name;
  int mlp; /* 0: Linear(in, out); 1: LayerNormMLP(in, out) */
  gcap_dtype dt;
  int64_t rows, in, out;
  int steps;
  double atol, rtol;
} fp8_case;

static const fp8_case fp8_cases[] = {
    {"f32 Linear [32, 64] -> 48", 0, GCAP_F32, 32, 64, 48, 3, 1e-3, 1e-3},
    {"bf16 Linear [32, 64] -> 48", 0, GCAP_BF16, 32, 64, 48, 3, 2e-2, 2e-2},
    {"f32 Linear [24, 32] -> 40 (padded operands)", 0, GCAP_F32, 24, 32, 40, 3, 1e-3, 1e-3},
    /* transposes over several 64-byte tiles, the last ones partial */
    {"f32 Linear [200, 144] -> 88 (tiled transposes)", 0, GCAP_F32, 200, 144, 88, 2, 1e-3, 1e-3},
    {"bf16 Linear [200, 144] -> 88 (tiled cast-transposes)", 0, GCAP_BF16, 200, 144, 88, 2, 2e-2,
     2e-2},
    {"bf16 LayerNormMLP [64, 64] -> 128", 1, GCAP_BF16, 64, 64, 128, 1, 0.1, 0.05},
};

#define FP8_HIST 4 /* the recipe's amax_history_len */

/* compare() of an FP8 case; where it fails, the first few elements out of
** tolerance: index, cuda's value and the host's. */
static void fp8_compare(const char *what, const char *part, const float *got, const float *ref,
                        int64_t n, const fp8_case *c) {
  int shown = 0;
  double lim;
  if (compare(what, part, got, ref, n, c->atol, c->rtol)) return;
  for (int64_t i = 0; i < n && shown < 5; i++) {
    if (within(got[i], ref[i], c->atol, c->rtol, &lim)) continue;
    printf("#     %s element %lld: cuda %.9g, host %.9g\n", part, (long long)i, (double)got[i],
           (double)ref[i]);
    shown++;
  }
}

/* After a step, each FP8 role's scale and amax history on cuda against the
** host's. A role whose tensor is the same bytes on both (a Linear's input,
** weight and grad, which is r; LayerNormMLP's weights and fc2's grad) must
** equal bit for bit: its amaxes are exact maxima and its scales one
** division of them, so a difference is in the casts or the scaling, never
** in the GEMMs. LayerNormMLP's other roles quantize each backend's own
** results (the layer norm, the gelu, fc2's dgrad): within the case's
** tolerance. */
static void fp8_state_parity(const char *what, gcap_module *const *m, const fp8_case *c) {
  static const char *const roles[3] = {"input", "weight", "grad_output"};
  for (int g = 0; g < gcap_module_fp8_gemms(m[0]); g++)
    for (int r = 0; r < 3; r++) {
      float s[2], h[2][FP8_HIST] = {{0}};
      int len[2], same = !c->mlp || r == 1 || (g == 1 && r == 2), ok;
      double lim;
      for (int b = 0; b < 2; b++)
        if (gcap_module_fp8_state(m[b], g, r, FP8_HIST, &s[b], h[b], &len[b]) != GCAP_OK) {
          T_FAILF("fp8 state", "%s: %s", what, gcap_errmsg(b ? ec : eh));
          return;
        }
      ok = len[0] == len[1];
      if (same)
        ok = ok && memcmp(&s[0], &s[1], sizeof s[0]) == 0 && memcmp(h[0], h[1], sizeof h[0]) == 0;
      for (int j = 0; !same && j < FP8_HIST; j++)
        ok = ok && within(s[1], s[0], c->atol, c->rtol, &lim) &&
             within(h[1][j], h[0][j], c->atol, c->rtol, &lim);
      if (!ok)
        T_FAILF(same ? "cuda's FP8 state == host's, bit for bit" : "cuda's FP8 state ~ host's",
                "%s: GEMM %d %s: scale cuda %a host %a; amax history (length %d, %d) cuda "
                "{%a, %a, %a, %a} host {%a, %a, %a, %a}",
                what, g, roles[r], (double)s[1], (double)s[0], len[1], len[0], (double)h[1][0],
                (double)h[1][1], (double)h[1][2], (double)h[1][3], (double)h[0][0], (double)h[0][1],
                (double)h[0][2], (double)h[0][3]);
    }
}

/* A LayerNormMLP's parameter grads (host module m), each parameter against
** the case's tolerance, and the weights' with room for FP8 rounding flips:
** fc2's input (the gelu) and fc1's grad (through the gelu's backward) are
** each backend's own bf16 results, so an element near an FP8 rounding
** boundary may round to the neighbouring value on one side only. A flip
** moves one term of a weight grad's sum by one FP8 step of an operand: at
** most |v| / 8 in E4M3 and |v| / 4 in E5M2, so at most amax(input) *
** amax(grad) / 8 for fc2 (its grad is r, the same bytes on both) and 13/32
** of it for fc1 (a flip in each operand: 1/8 + 1/4 + 1/32); two flips a
** sum are allowed. The amaxes are the host's latest, from its FP8 state.
** Flips are rare, so each weight grad as a whole is also within 2% of the
** host's (the L2 norm of the difference): a bug in the module's wiring
** that moves many elements by less than the flip room still fails. */
static void fp8_mlp_param_grads(const char *what, const float *got, const float *ref,
                                const fp8_case *c, gcap_module *m) {
  float amax[2][2]; /* [GEMM][input, grad] */
  for (int g = 0; g < 2; g++)
    for (int r = 0; r < 2; r++) {
      float scale, h[1];
      int len;
      if (gcap_module_fp8_state(m, g, r ? 2 : 0, 1, &scale, h, &len) != GCAP_OK || len < 1) {
        T_FAILF("fp8 state", "%s: %s", what, gcap_errmsg(eh));
        return;
      }
      amax[g][r] = h[0];
    }
  for (int i = 0, at = 0; i < gcap_module_num_parameters(m); i++) {
    char name[64], part[96];
    gcap_tensor *t = gcap_module_parameter(m, i, name, sizeof name);
    int n = (int)gcap_tensor_numel(t);
    fp8_case tol = *c;
    int weight = strcmp(name, "fc1_weight") == 0 || strcmp(name, "fc2_weight") == 0;
    if (strcmp(name, "fc1_weight") == 0)
      tol.atol += 2.0 * 13.0 / 32.0 * (double)amax[0][0] * (double)amax[0][1];
    else if (strcmp(name, "fc2_weight") == 0)
      tol.atol += 2.0 / 8.0 * (double)amax[1][0] * (double)amax[1][1];
    snprintf(part, sizeof part, "%s grad", name);
    fp8_compare(what, part, got + at, ref + at, n, &tol);
    if (weight) {
      double d2 = 0.0, r2 = 0.0;
      for (int j = 0; j < n; j++) {
        double d = (double)got[at + j] - (double)ref[at + j];
        d2 += d * d;
        r2 += (double)ref[at + j] * (double)ref[at + j];
      }
      if (!(d2 <= 0.02 * 0.02 * r2))
        T_FAILF("cuda's weight grad ~ host's as a whole",
                "%s: %s: |cuda - host| = %.4g, 2%% of "
                "|host| = %.4g (L2 norms)",
                what, part, sqrt(d2), 0.02 * sqrt(r2));
    }
    at += n;
  }
}

/* A Linear's parameter grads (weight [out x in], then bias): the weight's
** with room for the FP8 GEMM's accumulation on the GPU, whose tensor cores
** keep about 14 bits of a partial sum between its promotions to f32 (NVIDIA
** documents the promotion, DeepSeek-V3's report the width): an element's
** error then scales with the sum of its terms' magnitudes, S = sum over
** rows of |r[row, o]| |x[row, i]| (the unquantized operands; quantizing moves
** each by at most a quarter), not with its value, which cancellation makes
** small. So each weight grad element gets atol + rtol |host| + 2^-11 S (of
** the order of 2^-14 per promotion); the bias grad (from the unquantized
** grad, no FP8 GEMM) the case's tolerance. */
static void fp8_linear_param_grads(const char *what, const float *got, const float *ref,
                                   const fp8_case *c, const float *xd, const float *rd) {
  int64_t bad = 0, first = -1, nw = c->out * c->in;
  double worst = 0.0;
  for (int64_t o = 0; o < c->out; o++)
    for (int64_t i = 0; i < c->in; i++) {
      double sum = 0.0, d, lim;
      int64_t k = o * c->in + i;
      for (int64_t r = 0; r < c->rows; r++)
        sum += fabs((double)rd[r * c->out + o]) * fabs((double)xd[r * c->in + i]);
      lim = c->atol + c->rtol * fabs((double)ref[k]) + ldexp(sum, -11);
      d = fabs((double)got[k] - (double)ref[k]);
      if (!(d <= lim) && bad++ == 0) first = k;
      if (d / lim > worst) worst = d / lim;
    }
  if (bad)
    T_FAILF("|cuda - host| <= atol + rtol*|host| + 2^-11 sum|r||x|",
            "%s: weight grad element %lld of %lld: cuda %.9g, host %.9g (%lld elements out of "
            "tolerance; worst %.3g x tolerance)",
            what, (long long)first, (long long)nw, (double)got[first], (double)ref[first],
            (long long)bad, worst);
  else if (verbose)
    printf("#   %s: weight grad: worst |d| = %.3g x tolerance\n", what, worst);
  fp8_compare(what, "bias grad", got + nw, ref + nw, c->out, c);
}

/* One step on e: y = m(x), loss sum(y * r), backward; y, x's grad and the
** parameters' grads (concatenated) into out (numel each, NULL: skipped). */
static int fp8_step(gcap_engine *e, gcap_module *m, const fp8_case *c, const float *xd,
                    const float *rd, float *y, float *gx, float *gp) {
  const int64_t xs[2] = {c->rows, c->in};
  gcap_tensor *x = NULL, *out = NULL, *r = NULL, *p = NULL, *l = NULL;
  gcap_fp8_autocast a, prev;
  int ok = 0, np = gcap_module_num_parameters(m);
  memset(&a, 0, sizeof a);
  a.enabled = 1;
  gcap_fp8_recipe_init(&a.recipe, GCAP_FP8_DELAYED_SCALING);
  a.recipe.amax_history_len = FP8_HIST;
  if (gcap_tensor_from_f32(e, c->dt, 2, xs, xd, &x) != GCAP_OK ||
      gcap_tensor_set_requires_grad(x, 1) != GCAP_OK ||
      gcap_fp8_set_autocast(e, &a, &prev) != GCAP_OK)
    goto done;
  if (gcap_module_call(m, 1, &x, &out) != GCAP_OK) {
    gcap_fp8_set_autocast(e, &prev, NULL);
    goto done;
  }
  gcap_fp8_set_autocast(e, &prev, NULL);
  if (gcap_tensor_from_f32(e, c->dt, gcap_tensor_ndim(out), gcap_tensor_shape(out), rd, &r) !=
          GCAP_OK ||
      gcap_mul(out, r, &p) != GCAP_OK || gcap_sum(p, &l) != GCAP_OK ||
      gcap_backward(l, NULL, 0) != GCAP_OK || !t_read(out, y, (size_t)gcap_tensor_numel(out)) ||
      !t_read(gcap_tensor_grad(x), gx, (size_t)(c->rows * c->in)))
    goto done;
  for (int i = 0; i < np; i++) {
    gcap_tensor *w = gcap_module_parameter(m, i, NULL, 0), *g = gcap_tensor_grad(w);
    int64_t n = gcap_tensor_numel(w);
    if (g == NULL || !t_read(g, gp, (size_t)n) || gcap_tensor_set_grad(w, NULL) != GCAP_OK)
      goto done;
    gp += n;
  }
  ok = 1;
done:
  if (!ok) T_FAILF("run", "%s on %s: %s", c->name, gcap_engine_device(e), gcap_errmsg(e));
  gcap_tensor_free(x), gcap_tensor_free(out), gcap_tensor_free(r), gcap_tensor_free(p);
  gcap_tensor_free(l);
  return ok;
}

static void fp8_parity(const fp8_case *c) {
  gcap_module *m[2] = {NULL, NULL};
  gcap_engine *es[2] = {eh, ec};
  int64_t nx = c->rows * c->in, ny = c->rows * (c->mlp ? c->in : c->out), npar = 0;
  float *xd = NULL, *rd = NULL, *buf[2][3] = {{NULL}};
  for (int b = 0; b < 2; b++) {
    gcap_status st = c->mlp ? gcap_nn_layer_norm_mlp(es[b], c->in, c->out, 1e-5, 1, 0, &m[b])
                            : gcap_nn_linear(es[b], c->in, c->out, 1, 0, &m[b]);
    if (st != GCAP_OK) {
      T_FAILF("make the module", "%s on %s: %s", c->name, gcap_engine_device(es[b]),
              gcap_errmsg(es[b]));
      goto done;
    }
  }
  for (int i = 0; i < gcap_module_num_parameters(m[0]); i++) { /* the host's values on cuda */
    gcap_tensor *w = gcap_module_parameter(m[0], i, NULL, 0);
    size_t n = (size_t)gcap_tensor_numel(w) * 4;
    void *bytes = malloc(n);
    int ok = bytes && gcap_tensor_read_bytes(w, bytes, n) == GCAP_OK &&
             gcap_tensor_write_bytes(gcap_module_parameter(m[1], i, NULL, 0), bytes, n) == GCAP_OK;
    free(bytes);
    if (!ok) {
      T_FAILF("copy the parameters", "%s: %s", c->name, gcap_errmsg(ec));
      goto done;
    }
    npar += gcap_tensor_numel(w);
  }
  for (int b = 0; b < 2; b++)
    if (gcap_module_to(m[b], c->dt) != GCAP_OK) {
      T_FAILF("module_to", "%s: %s", c->name, gcap_errmsg(es[b]));
      goto done;
    }
  xd = malloc((size_t)nx * sizeof *xd), rd = malloc((size_t)ny * sizeof *rd);
  for (int b = 0; b < 2; b++) {
    buf[b][0] = malloc((size_t)ny * sizeof(float));
    buf[b][1] = malloc((size_t)nx * sizeof(float));
    buf[b][2] = malloc((size_t)npar * sizeof(float));
  }
  for (int k = 0; k < c->steps; k++) {
    char what[160];
    for (int64_t i = 0; i < nx; i++)
      xd[i] = 2.0f * (float)(k + 1) * urand();
    for (int64_t i = 0; i < ny; i++)
      rd[i] = urand();
    for (int b = 0; b < 2; b++)
      if (!fp8_step(es[b], m[b], c, xd, rd, buf[b][0], buf[b][1], buf[b][2])) goto done;
    snprintf(what, sizeof what, "fp8 %s step %d", c->name, k + 1);
    fp8_compare(what, "output", buf[1][0], buf[0][0], ny, c);
    fp8_compare(what, "input grad", buf[1][1], buf[0][1], nx, c);
    if (c->mlp)
      fp8_mlp_param_grads(what, buf[1][2], buf[0][2], c, m[0]);
    else
      fp8_linear_param_grads(what, buf[1][2], buf[0][2], c, xd, rd);
    fp8_state_parity(what, m, c);
  }
done:
  free(xd), free(rd);
  for (int b = 0; b < 2; b++) {
    for (int j = 0; j < 3; j++)
      free(buf[b][j]);
    gcap_module_free(m[b]);
  }
}

static void test_fp8_parity(void) {
  for (size_t i = 0; i < sizeof fp8_cases / sizeof fp8_cases[0]; i++)
    fp8_parity(&fp8_cases[i]);
}

int main(void) {
  const char *missing;
  verbose = getenv("GRAPHCAP_PARITY_VERBOSE") != NULL;
  if (!gcap_cuda_available()) {
    printf("1..0 # SKIP no CUDA device\n");
    return 77;
  }
  if (gcap_engine_new(GCAP_DEVICE_HOST, &eh) != GCAP_OK ||
      gcap_engine_new(GCAP_DEVICE_CUDA, &ec) != GCAP_OK) {
    printf("not ok 1 - open the host and cuda engines (%s)\n1..1\n# 0 passed, 1 failed\n",
           gcap_last_open_error());
    return 1;
  }
  for (int i = 0; i < NCASES; i++) {
    char name[160];
    cur_case = &cases[i];
    snprintf(name, sizeof name, "parity: %s%s", cases[i].name,
             cases[i].backward ? " (forward, backward)" : "");
    t_run_(name, run_cur_case);
  }
  T_RUN(test_linear_gelu_many_rows);
  T_RUN(test_layer_norm_many_rows);
  T_RUN(test_attention_parity);
  if ((missing = cudnn_missing()) != NULL)
    t_skip("test_cudnn_attention_parity", missing);
  else
    T_RUN(test_cudnn_attention_parity);
  {
    char why[256];
    if (!gcap_fp8_is_available(ec, why, sizeof why))
      t_skip("test_fp8_parity", why);
    else
      T_RUN(test_fp8_parity);
  }
  T_RUN(test_dropout_masks_identical);
  T_RUN(test_sgd_parity);
  T_RUN(test_adam_parity);
  T_RUN(test_adamw_parity);
  gcap_engine_free(eh);
  gcap_engine_free(ec);
  return t_done();
}
