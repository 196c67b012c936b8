/*
** test_tensor.c: tensors outside capture (docs/semantics.md; graphcap.h
** "Tensors"): shapes 0-D to 4-D, host round trips, views and clones, in-place
** ops, elementwise ops and their broadcasting rules, reductions, random
** numbers, reference counts and the ordinary allocator's statistics; the
** version number.
*/
#include <float.h>

#include "t.h"
#include "t_data.h"

static const int64_t SHAPE4[4] = {2, 3, 4, 5};

static void test_engine_basics(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  T_CHECK(strcmp(gcap_engine_device(e), t_device() == GCAP_DEVICE_CUDA ? "cuda" : "host") == 0);
  T_CHECK(strcmp(gcap_version(), GCAP_VERSION) == 0);
  T_CHECK(gcap_is_capturing(e) == 0);
  gcap_stream *def = gcap_default_stream(e), *cap = gcap_capture_stream(e);
  T_CHECK(def != NULL && cap != NULL && def != cap);
  gcap_stream *cur = gcap_current_stream(e);
  T_CHECK(cur == def || cur == NULL); /* new work goes to the default stream */
  T_CHECK(gcap_cuda_available() == 0 || gcap_cuda_available() == 1);
  gcap_engine_free(e);
}

/* GCAP_VERSION_NUMBER is GCAP_VERSION "X.Y.Z" as X*1000000 + Y*1000 + Z. */
static void test_version_number(void) {
  int x = -1, y = -1, z = -1, end = 0;
  T_REQUIRE(sscanf(GCAP_VERSION, "%d.%d.%d%n", &x, &y, &z, &end) == 3);
  T_CHECK(GCAP_VERSION[end] == '\0');
  T_CHECK(x >= 0 && y >= 0 && y < 1000 && z >= 0 && z < 1000);
  T_CHECK(GCAP_VERSION_NUMBER == x * 1000000L + y * 1000L + z);
}

static void test_shapes_0d_to_4d(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  for (int nd = 0; nd <= GCAP_MAXDIM; nd++) {
    gcap_tensor *f = NULL, *m = NULL;
    int64_t n = t_numel(nd, SHAPE4);
    T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, nd, SHAPE4, 1.5, &f));
    T_CHECK_OK(e, gcap_tensor_empty(e, GCAP_F32, nd, SHAPE4, &m));
    T_CHECK(t_has_shape(f, nd, SHAPE4) && t_has_shape(m, nd, SHAPE4));
    T_CHECK(gcap_tensor_numel(f) == n && gcap_tensor_numel(m) == n);
    T_CHECK(gcap_tensor_dtype(f) == GCAP_F32 && gcap_tensor_dtype(m) == GCAP_F32);
    T_CHECK(gcap_tensor_engine(f) == e);
    float buf[120];
    if (t_read(f, buf, (size_t)n)) {
      int all = 1;
      for (int64_t i = 0; i < n; i++)
        all &= buf[i] == 1.5f;
      T_CHECK(all);
    }
    gcap_tensor_free(f);
    gcap_tensor_free(m);
  }
  gcap_engine_free(e);
}

static void test_from_f32_roundtrip_bitwise(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  float src[120], dst[120];
  for (int i = 0; i < 120; i++)
    src[i] = (float)i * 0.1f - 3.0f;                                    /* not exact in binary */
  src[0] = -0.0f, src[1] = FLT_MAX, src[2] = -FLT_MIN, src[3] = 1e-40f; /* subnormal */
  src[4] = INFINITY, src[5] = -INFINITY;
  for (int nd = 0; nd <= GCAP_MAXDIM; nd++) {
    size_t n = (size_t)t_numel(nd, SHAPE4);
    gcap_tensor *t = t_from(e, nd, SHAPE4, src);
    T_REQUIRE(t != NULL);
    T_CHECK(t_has_shape(t, nd, SHAPE4));
    memset(dst, 0x55, sizeof dst);
    if (t_read(t, dst, n)) T_CHECK(memcmp(src, dst, n * sizeof(float)) == 0);
    float sentinel;
    memset(&sentinel, 0x55, sizeof sentinel);
    if (n < 120) T_CHECK(memcmp(&dst[n], &sentinel, sizeof sentinel) == 0); /* nothing past n */
    gcap_tensor_free(t);
  }
  gcap_engine_free(e);
}

static void test_zero_size_tensors(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s1[1] = {0}, s3[3] = {2, 0, 3};
  gcap_tensor *a = NULL, *b = NULL, *c = NULL, *s = NULL;
  T_CHECK_OK(e, gcap_tensor_empty(e, GCAP_F32, 1, s1, &a));
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 3, s3, 2.0, &b));
  T_CHECK(gcap_tensor_numel(a) == 0 && gcap_tensor_numel(b) == 0 && t_has_shape(b, 3, s3));
  float dummy = 7.0f;
  T_CHECK_OK(e, gcap_tensor_read(b, &dummy, 0));
  T_CHECK(dummy == 7.0f);
  T_CHECK_OK(e, gcap_add(b, b, &c));
  T_CHECK(t_has_shape(c, 3, s3));
  T_CHECK_OK(e, gcap_sum(b, &s));
  T_CHECK(gcap_tensor_ndim(s) == 0 && t_value(s) == 0.0);
  gcap_tensor_free(a), gcap_tensor_free(b), gcap_tensor_free(c), gcap_tensor_free(s);
  gcap_engine_free(e);
}

static void test_view_clone_data_ptr(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s23[2] = {2, 3}, s32[2] = {3, 2}, s6[1] = {6};
  const float d[6] = {1, 2, 3, 4, 5, 6};
  float buf[6];
  gcap_tensor *x = t_from(e, 2, s23, d), *v = NULL, *w = NULL, *c = NULL;
  T_REQUIRE(x != NULL);
  T_CHECK_OK(e, gcap_tensor_view(x, 2, s32, &v));
  T_CHECK_OK(e, gcap_tensor_view(v, 1, s6, &w));
  T_CHECK_OK(e, gcap_tensor_clone(x, &c));
  T_CHECK(t_has_shape(v, 2, s32) && t_has_shape(w, 1, s6) && t_has_shape(c, 2, s23));
  uintptr_t px = gcap_tensor_data_ptr(x);
  T_CHECK(px != 0 && px % 256 == 0); /* blocks are aligned to >= 256 bytes */
  T_CHECK(gcap_tensor_data_ptr(v) == px && gcap_tensor_data_ptr(w) == px);
  T_CHECK(gcap_tensor_data_ptr(c) != px && gcap_tensor_data_ptr(c) % 256 == 0);
  if (t_read(c, buf, 6)) T_CHECK(memcmp(buf, d, sizeof d) == 0);
  /* A write through a view shows in x, not in the clone. */
  T_CHECK_OK(e, gcap_fill_(w, 7.0));
  if (t_read(x, buf, 6)) T_CHECK(buf[0] == 7.0f && buf[5] == 7.0f);
  if (t_read(c, buf, 6)) T_CHECK(memcmp(buf, d, sizeof d) == 0);
  /* The storage lives as long as any view of it. */
  gcap_tensor_free(x);
  gcap_tensor_free(v);
  if (t_read(w, buf, 6)) T_CHECK(buf[3] == 7.0f);
  T_CHECK(gcap_tensor_data_ptr(w) == px);
  gcap_tensor_free(w), gcap_tensor_free(c);
  gcap_engine_free(e);
}

static void test_copy_zero_fill(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s23[2] = {2, 3}, s6[1] = {6};
  const float d[6] = {1, -2, 3, -4, 5, -6};
  float buf[6];
  gcap_tensor *a = t_from(e, 2, s23, d), *b = NULL;
  T_REQUIRE(a != NULL);
  T_CHECK_OK(e, gcap_tensor_empty(e, GCAP_F32, 1, s6, &b));
  T_CHECK_OK(e, gcap_copy_(b, a)); /* same numel, other shape */
  if (t_read(b, buf, 6)) T_CHECK(memcmp(buf, d, sizeof d) == 0);
  T_CHECK_OK(e, gcap_zero_(a));
  if (t_read(a, buf, 6)) T_CHECK(buf[0] == 0.0f && buf[2] == 0.0f && buf[5] == 0.0f);
  if (t_read(b, buf, 6)) T_CHECK(memcmp(buf, d, sizeof d) == 0); /* a copy, not an alias */
  T_CHECK_OK(e, gcap_fill_(a, -2.5));
  if (t_read(a, buf, 6)) T_CHECK(buf[1] == -2.5f && buf[4] == -2.5f);
  T_CHECK_OK(e, gcap_copy_(a, b));
  if (t_read(a, buf, 6)) T_CHECK(memcmp(buf, d, sizeof d) == 0);
  gcap_tensor_free(a), gcap_tensor_free(b);
  gcap_engine_free(e);
}

/* A tensor's raw bytes go to and from the device as they are: every bf16
** pattern (NaN payloads, -0, subnormals) and f32 NaN payloads come back bit
** for bit, a write is in place and counts as a write, and a copy within one
** dtype keeps the bits too. */
static void test_raw_bytes(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  enum { N = 65536 };
  static uint16_t bits[N], back[N];
  const int64_t sn[1] = {N}, s2[1] = {2};
  const uint32_t f32bits[2] = {0x7fc00123u, 0xff800001u}; /* NaNs with payloads */
  uint32_t f32back[2];
  gcap_tensor *b = NULL, *c = NULL, *f = NULL;
  uintptr_t addr;
  uint64_t v;
  int i;
  for (i = 0; i < N; i++)
    bits[i] = (uint16_t)i;
  T_CHECK_OK(e, gcap_tensor_empty(e, GCAP_BF16, 1, sn, &b));
  addr = gcap_tensor_data_ptr(b);
  v = gcap_tensor_version(b);
  T_CHECK_OK(e, gcap_tensor_write_bytes(b, bits, sizeof bits));
  T_CHECK(gcap_tensor_data_ptr(b) == addr && gcap_tensor_version(b) == v + 1);
  T_CHECK_OK(e, gcap_tensor_read_bytes(b, back, sizeof back));
  T_CHECK(memcmp(bits, back, sizeof bits) == 0);
  T_CHECK_OK(e, gcap_tensor_empty(e, GCAP_BF16, 1, sn, &c));
  T_CHECK_OK(e, gcap_copy_(c, b));
  memset(back, 0, sizeof back);
  T_CHECK_OK(e, gcap_tensor_read_bytes(c, back, sizeof back));
  T_CHECK(memcmp(bits, back, sizeof bits) == 0);
  T_CHECK_OK(e, gcap_tensor_empty(e, GCAP_F32, 1, s2, &f));
  T_CHECK_OK(e, gcap_tensor_write_bytes(f, f32bits, sizeof f32bits));
  T_CHECK_OK(e, gcap_tensor_read_bytes(f, f32back, sizeof f32back));
  T_CHECK(memcmp(f32bits, f32back, sizeof f32bits) == 0);
  T_CHECK_ST(e, gcap_tensor_write_bytes(f, f32bits, 4), GCAP_EINVAL); /* 8 bytes, not 4 */
  T_CHECK(t_msg_has(e, "write_bytes: n is 4 bytes, but the tensor holds 8 (2 f32 elements)"));
  T_CHECK_ST(e, gcap_tensor_read_bytes(b, back, 2), GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "read_bytes: n is 2 bytes, but the tensor holds 131072 (65536 bf16"));
  gcap_tensor_free(b), gcap_tensor_free(c), gcap_tensor_free(f);
  gcap_engine_free(e);
}

static void test_elementwise_values(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s23[2] = {2, 3};
  const float da[6] = {1, 2, 3, 4, 5, 6}, db[6] = {6, -5, 4, -3, 2, -1};
  float r[6];
  gcap_tensor *a = t_from(e, 2, s23, da), *b = t_from(e, 2, s23, db);
  gcap_tensor *o[5] = {NULL};
  T_REQUIRE(a && b);
  T_CHECK_OK(e, gcap_add(a, b, &o[0]));
  T_CHECK_OK(e, gcap_sub(a, b, &o[1]));
  T_CHECK_OK(e, gcap_mul(a, b, &o[2]));
  T_CHECK_OK(e, gcap_scale(a, -0.5, &o[3]));
  T_CHECK_OK(e, gcap_neg(b, &o[4]));
  for (int k = 0; k < 5; k++) {
    T_CHECK(t_has_shape(o[k], 2, s23));
    if (!t_read(o[k], r, 6)) continue;
    int all = 1;
    for (int i = 0; i < 6; i++) {
      float want = k == 0   ? da[i] + db[i]
                   : k == 1 ? da[i] - db[i]
                   : k == 2 ? da[i] * db[i]
                   : k == 3 ? da[i] * -0.5f
                            : -db[i];
      all &= r[i] == want;
    }
    T_CHECK(all);
    gcap_tensor_free(o[k]);
  }
  gcap_tensor_free(a), gcap_tensor_free(b);
  gcap_engine_free(e);
}

/* docs/semantics.md, "Tensors, broadcasting and autograd": a 0-D or one-element
** operand, or a row matching the other's last dimension, broadcast (on either
** side); other mismatches are errors (those are in test_errors.c). */
static void test_broadcast(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s23[2] = {2, 3}, s1[1] = {1}, s11[2] = {1, 1}, s3[1] = {3};
  const int64_t s4d[4] = {2, 1, 2, 3}, s4[1] = {4};
  const float dm[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, d10 = 10, d100 = 100, d1000 = 1000,
              drow[3] = {10, 20, 30};
  float r[12];
  gcap_tensor *m = t_from(e, 2, s23, dm), *z = t_from(e, 0, s1, &d10); /* 0-D */
  gcap_tensor *one = t_from(e, 1, s1, &d100), *one2 = t_from(e, 2, s11, &d1000);
  gcap_tensor *row = t_from(e, 1, s3, drow), *m4 = t_from(e, 4, s4d, dm),
              *v4 = t_from(e, 1, s4, dm);
  gcap_tensor *o = NULL;
  T_REQUIRE(m && z && one && one2 && row && m4 && v4);
  T_CHECK(gcap_tensor_ndim(z) == 0 && gcap_tensor_numel(z) == 1);

  T_CHECK_OK(e, gcap_add(m, z, &o)); /* matrix + 0-D */
  T_CHECK(t_has_shape(o, 2, s23));
  if (t_read(o, r, 6)) T_CHECK(r[0] == 11 && r[5] == 16);
  gcap_tensor_free(o), o = NULL;
  T_CHECK_OK(e, gcap_sub(z, m, &o)); /* 0-D - matrix */
  T_CHECK(t_has_shape(o, 2, s23));
  if (t_read(o, r, 6)) T_CHECK(r[0] == 9 && r[5] == 4);
  gcap_tensor_free(o), o = NULL;
  T_CHECK_OK(e, gcap_sub(one, m, &o)); /* one-element [1] on the left */
  T_CHECK(t_has_shape(o, 2, s23));
  if (t_read(o, r, 6)) T_CHECK(r[0] == 99 && r[5] == 94);
  gcap_tensor_free(o), o = NULL;
  T_CHECK_OK(e, gcap_mul(m, one2, &o)); /* one-element [1, 1] on the right */
  T_CHECK(t_has_shape(o, 2, s23));
  if (t_read(o, r, 6)) T_CHECK(r[0] == 1000 && r[5] == 6000);
  gcap_tensor_free(o), o = NULL;
  T_CHECK_OK(e, gcap_add(m, row, &o)); /* bias row */
  T_CHECK(t_has_shape(o, 2, s23));
  if (t_read(o, r, 6)) T_CHECK(r[0] == 11 && r[1] == 22 && r[2] == 33 && r[3] == 14 && r[5] == 36);
  gcap_tensor_free(o), o = NULL;
  T_CHECK_OK(e, gcap_sub(row, m, &o)); /* row on the left */
  T_CHECK(t_has_shape(o, 2, s23));
  if (t_read(o, r, 6)) T_CHECK(r[0] == 9 && r[1] == 18 && r[3] == 6 && r[5] == 24);
  gcap_tensor_free(o), o = NULL;
  T_CHECK_OK(e, gcap_mul(m4, row, &o)); /* 4-D times a row */
  T_CHECK(t_has_shape(o, 4, s4d));
  if (t_read(o, r, 12)) T_CHECK(r[0] == 10 && r[4] == 100 && r[11] == 360);
  gcap_tensor_free(o), o = NULL;
  T_CHECK_OK(e, gcap_add(one, v4, &o)); /* [1] + [4] */
  T_CHECK(t_has_shape(o, 1, s4));
  if (t_read(o, r, 4)) T_CHECK(r[0] == 101 && r[3] == 104);
  gcap_tensor_free(o), o = NULL;
  T_CHECK_OK(e, gcap_mul(z, z, &o)); /* 0-D * 0-D is 0-D */
  T_CHECK(o && gcap_tensor_ndim(o) == 0 && t_value(o) == 100.0);
  gcap_tensor_free(o), o = NULL;

  gcap_tensor_free(m), gcap_tensor_free(z), gcap_tensor_free(one), gcap_tensor_free(one2);
  gcap_tensor_free(row), gcap_tensor_free(m4), gcap_tensor_free(v4);
  gcap_engine_free(e);
}

static void test_sum_mean(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  static float d[1000];
  for (int i = 0; i < 1000; i++)
    d[i] = (float)(i + 1) * (i % 2 ? -1.0f : 1.0f) + 1000.0f;
  const int64_t s[2] = {10, 100};
  gcap_tensor *x = t_from(e, 2, s, d), *su = NULL, *me = NULL, *ones = NULL, *s1 = NULL, *s0 = NULL;
  T_REQUIRE(x != NULL);
  T_CHECK_OK(e, gcap_sum(x, &su));
  T_CHECK_OK(e, gcap_mean(x, &me));
  T_CHECK(gcap_tensor_ndim(su) == 0 && gcap_tensor_ndim(me) == 0);
  /* sum = 1000 * 1000 + (1 - 2 + 3 - ... - 1000) = 1000000 - 500; every partial
  ** sum is an integer below 2^24, so it is exact in any order. */
  T_CHECK(t_value(su) == 999500.0);
  T_CHECK_NEAR(t_value(me), 999.5, 0.0, 1e-6);
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 4, SHAPE4, 1.0, &ones));
  T_CHECK_OK(e, gcap_sum(ones, &s1));
  T_CHECK(t_value(s1) == 120.0);
  T_CHECK_OK(e, gcap_sum(su, &s0)); /* the sum of a 0-D tensor is itself */
  T_CHECK(gcap_tensor_ndim(s0) == 0 && t_value(s0) == 999500.0);
  gcap_tensor_free(x), gcap_tensor_free(su), gcap_tensor_free(me);
  gcap_tensor_free(ones), gcap_tensor_free(s1), gcap_tensor_free(s0);
  gcap_engine_free(e);
}

static void test_rand_reproducible(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  enum { N = 4096 };
  static float a[N], b[N], a2[N], n1[N], n2[N];
  const int64_t s[1] = {N}, s3[3] = {2, 3, 4};
  gcap_tensor *ta = NULL, *tb = NULL, *ta2 = NULL, *tn1 = NULL, *tn2 = NULL, *t3 = NULL;
  T_CHECK_OK(e, gcap_manual_seed(e, 1234));
  T_CHECK_OK(e, gcap_tensor_rand(e, GCAP_F32, 1, s, 0, &ta));
  T_CHECK_OK(e, gcap_tensor_rand(e, GCAP_F32, 1, s, 0, &tb));
  T_CHECK_OK(e, gcap_manual_seed(e, 1234));
  T_CHECK_OK(e, gcap_tensor_rand(e, GCAP_F32, 1, s, 0, &ta2));
  T_REQUIRE(t_read(ta, a, N) && t_read(tb, b, N) && t_read(ta2, a2, N));
  T_CHECK(memcmp(a, a2, sizeof a) == 0); /* same seed, same numbers */
  T_CHECK(memcmp(a, b, sizeof a) != 0);  /* the generator advances */
  double mean = 0;
  int in_range = 1;
  for (int i = 0; i < N; i++) {
    in_range &= a[i] >= 0.0f && a[i] < 1.0f;
    mean += (double)a[i];
  }
  T_CHECK(in_range);
  T_CHECK_NEAR(mean / N, 0.5, 0.03, 0.0);

  T_CHECK_OK(e, gcap_manual_seed(e, 99));
  T_CHECK_OK(e, gcap_tensor_rand(e, GCAP_F32, 1, s, 1, &tn1));
  T_CHECK_OK(e, gcap_manual_seed(e, 99));
  T_CHECK_OK(e, gcap_tensor_rand(e, GCAP_F32, 1, s, 1, &tn2));
  T_REQUIRE(t_read(tn1, n1, N) && t_read(tn2, n2, N));
  T_CHECK(memcmp(n1, n2, sizeof n1) == 0);
  double m = 0, v = 0;
  int finite = 1;
  for (int i = 0; i < N; i++) {
    m += (double)n1[i];
    finite &= isfinite(n1[i]) != 0;
  }
  m /= N;
  for (int i = 0; i < N; i++)
    v += ((double)n1[i] - m) * ((double)n1[i] - m);
  v /= N;
  T_CHECK(finite);
  T_CHECK_NEAR(m, 0.0, 0.1, 0.0);
  T_CHECK_NEAR(v, 1.0, 0.1, 0.0);
  T_CHECK(memcmp(n1, a, sizeof n1) != 0);

  T_CHECK_OK(e, gcap_tensor_rand(e, GCAP_F32, 3, s3, 0, &t3));
  T_CHECK(t_has_shape(t3, 3, s3));
  gcap_tensor_free(ta), gcap_tensor_free(tb), gcap_tensor_free(ta2);
  gcap_tensor_free(tn1), gcap_tensor_free(tn2), gcap_tensor_free(t3);
  gcap_engine_free(e);
}

static void test_refcount(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  const int64_t s[1] = {3};
  gcap_tensor *t = NULL;
  T_CHECK_OK(e, gcap_tensor_full(e, GCAP_F32, 1, s, 4.0, &t));
  T_CHECK(gcap_tensor_retain(t) == t);
  gcap_tensor_free(t); /* one reference left */
  float buf[3];
  if (t_read(t, buf, 3)) T_CHECK(buf[2] == 4.0f);
  gcap_tensor_free(t);
  gcap_tensor_free(NULL);
  gcap_engine_free(NULL);
  gcap_engine_free(e);
}

static void test_engine_mem_stats(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  gcap_mem_stats s0, s1, s2;
  const int64_t s[1] = {1000};
  gcap_tensor *t = NULL;
  T_CHECK_OK(e, gcap_engine_mem_stats(e, &s0));
  T_CHECK_OK(e, gcap_tensor_empty(e, GCAP_F32, 1, s, &t));
  T_CHECK_OK(e, gcap_engine_mem_stats(e, &s1));
  T_CHECK(s1.in_use_bytes >= s0.in_use_bytes + 4000);
  T_CHECK(s1.blocks == s0.blocks + 1);
  T_CHECK(s1.reserved_bytes >= s1.in_use_bytes && s1.peak_bytes >= s1.in_use_bytes);
  gcap_tensor_free(t);
  T_CHECK_OK(e, gcap_engine_mem_stats(e, &s2));
  T_CHECK(s2.in_use_bytes == s0.in_use_bytes && s2.blocks == s0.blocks);
  T_CHECK(s2.peak_bytes >= s1.in_use_bytes);
  gcap_engine_free(e);
}

int main(void) {
  T_RUN(test_engine_basics);
  T_RUN(test_version_number);
  T_RUN(test_shapes_0d_to_4d);
  T_RUN(test_from_f32_roundtrip_bitwise);
  T_RUN(test_zero_size_tensors);
  T_RUN(test_view_clone_data_ptr);
  T_RUN(test_copy_zero_fill);
  T_RUN(test_raw_bytes);
  T_RUN(test_elementwise_values);
  T_RUN(test_broadcast);
  T_RUN(test_sum_mean);
  T_RUN(test_rand_reproducible);
  T_RUN(test_refcount);
  T_RUN(test_engine_mem_stats);
  return t_done();
}
