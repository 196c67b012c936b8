/*
** test_attention_ops.c: the ops of attention from C: permute, transpose,
** split, chunk and cat (values, grads, errors), batched matmul, the masked
** softmax (causal, boolean and additive masks, a row masked out everywhere),
** masked_fill, embedding (bad ids refused, a deterministic backward) and
** scaled dot-product attention with dropout, whose captured forward and
** backward replay to eager values bit for bit. Finite-difference checks of
** every grad are in tests/lua (test_shape_ops.lua, test_attention_ops.lua).
*/
#include "t.h"

/* n values i * step + lo, i = 0 .. n - 1 */
static void ramp(float *d, int64_t n, float lo, float step) {
  for (int64_t i = 0; i < n; i++)
    d[i] = lo + step * (float)i;
}

static void test_permute_transpose_values(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  float d[24], y[24];
  const int64_t s[3] = {2, 3, 4};
  const int perm[3] = {2, 0, 1};
  ramp(d, 24, 0.0f, 1.0f);
  gcap_tensor *x = t_from(e, 3, s, d), *p = NULL, *t = NULL;
  T_REQUIRE(x != NULL);
  T_CHECK_OK(e, gcap_permute(x, perm, &p));
  T_CHECK(gcap_tensor_shape(p)[0] == 4 && gcap_tensor_shape(p)[1] == 2 &&
          gcap_tensor_shape(p)[2] == 3);
  if (t_read(p, y, 24)) /* p[c][a][b] = x[a][b][c] */
    for (int a = 0; a < 2; a++)
      for (int b = 0; b < 3; b++)
        for (int c = 0; c < 4; c++)
          T_CHECK(y[(c * 2 + a) * 3 + b] == d[(a * 3 + b) * 4 + c]);
  T_CHECK_OK(e, gcap_transpose(x, -1, 0, &t)); /* [4, 3, 2] */
  if (t_read(t, y, 24))
    for (int a = 0; a < 2; a++)
      for (int b = 0; b < 3; b++)
        for (int c = 0; c < 4; c++)
          T_CHECK(y[(c * 3 + b) * 2 + a] == d[(a * 3 + b) * 4 + c]);
  gcap_tensor_free(p), gcap_tensor_free(t);
  /* errors: named, nothing made */
  const int twice[3] = {0, 2, 0};
  p = x;
  T_CHECK_ST(e, gcap_permute(x, twice, &p), GCAP_EINVAL);
  T_CHECK(p == NULL && t_msg_has(e, "permute: dim 0 appears twice in the permutation"));
  T_CHECK_ST(e, gcap_transpose(x, 3, 0, &t), GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "transpose: dim 3 is out of range for a 3-D tensor (-3..2)"));
  T_CHECK(gcap_permute(NULL, perm, &p) == GCAP_EINVAL && p == NULL);
  T_CHECK(gcap_transpose(x, 0, 1, NULL) == GCAP_EINVAL);
  gcap_tensor_free(x);
  gcap_engine_free(e);
}

/* split into pieces, cat them back: the input again, grads of ones. */
static void test_split_chunk_cat(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  float d[42], y[42], g[42];
  const int64_t s[3] = {2, 7, 3};
  ramp(d, 42, -5.0f, 0.25f);
  gcap_tensor *x = t_from(e, 3, s, d), *p[4] = {0}, *c = NULL, *l = NULL, *q[3] = {0};
  int n = -1;
  T_REQUIRE(x != NULL);
  T_CHECK_OK(e, gcap_tensor_set_requires_grad(x, 1));
  T_CHECK_OK(e, gcap_split(x, 3, -2, 4, p, &n));
  T_REQUIRE(n == 3);
  T_CHECK(gcap_tensor_shape(p[2])[1] == 1);
  T_CHECK_OK(e, gcap_cat(3, p, 1, &c));
  if (t_read(c, y, 42)) T_CHECK(memcmp(y, d, sizeof d) == 0);
  T_CHECK_OK(e, gcap_sum(c, &l));
  T_CHECK_OK(e, gcap_backward(l, NULL, 0));
  if (t_read(gcap_tensor_grad(x), g, 42))
    for (int i = 0; i < 42; i++)
      T_CHECK(g[i] == 1.0f);
  /* too little room: an error, nothing made */
  T_CHECK_ST(e, gcap_split(x, 2, 1, 3, q, &n), GCAP_EINVAL);
  T_CHECK(n == 0 && q[0] == NULL && q[2] == NULL);
  T_CHECK(t_msg_has(e, "split: dim 1 of size 7 makes 4 pieces, room for 3"));
  T_CHECK_OK(e, gcap_chunk(x, 3, 0, 3, q, &n)); /* 2 entries in 3 chunks: 2 pieces of 1 */
  T_CHECK(n == 2 && gcap_tensor_shape(q[1])[0] == 1);
  gcap_tensor *bad[2] = {x, q[0]};
  gcap_tensor *o = x;
  T_CHECK_ST(e, gcap_cat(2, bad, 2, &o), GCAP_EINVAL); /* [2, 7, 3] and [1, 7, 3] along dim 2 */
  T_CHECK(o == NULL && t_msg_has(e, "cat: tensor 2 is f32 [1, 7, 3], tensor 1 is f32 [2, 7, 3]"));
  for (int i = 0; i < 4; i++)
    gcap_tensor_free(p[i]);
  for (int i = 0; i < 3; i++)
    gcap_tensor_free(q[i]);
  gcap_tensor_free(c), gcap_tensor_free(l), gcap_tensor_free(x);
  gcap_engine_free(e);
}

/* [2, 2, 3] x [3, 2]: the 2-D operand used by both batches. */
static void test_batched_matmul(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  float a[12], b[6], y[8];
  const int64_t sa[3] = {2, 2, 3}, sb[2] = {3, 2};
  ramp(a, 12, 1.0f, 1.0f), ramp(b, 6, -2.0f, 1.0f);
  gcap_tensor *ta = t_from(e, 3, sa, a), *tb = t_from(e, 2, sb, b), *c = NULL;
  T_REQUIRE(ta && tb);
  T_CHECK_OK(e, gcap_matmul(ta, tb, &c));
  T_CHECK(gcap_tensor_ndim(c) == 3 && gcap_tensor_shape(c)[0] == 2);
  if (t_read(c, y, 8))
    for (int bt = 0; bt < 2; bt++)
      for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) {
          float s = 0.0f;
          for (int l = 0; l < 3; l++)
            s += a[(bt * 2 + i) * 3 + l] * b[l * 2 + j];
          T_CHECK(y[(bt * 2 + i) * 2 + j] == s); /* small integers: exact */
        }
  gcap_tensor_free(c), c = NULL;
  T_CHECK_ST(e, gcap_matmul(tb, tb, &c), GCAP_EINVAL);
  T_CHECK(t_msg_has(e, "matmul: expected [m, k] x [k, n], got [3, 2] x [3, 2]"));
  gcap_tensor_free(ta), gcap_tensor_free(tb);
  gcap_engine_free(e);
}

/* Row 0 causal (one column kept), row 1 masked out everywhere (zeros),
** row 2 an additive mask; scaled. */
static void test_softmax_masks(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  float x[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, y[9];
  float mb[9] = {0, 0, 0, 1, 1, 1, 0, 0, 0};
  const int64_t s[2] = {3, 3};
  gcap_tensor *tx = t_from(e, 2, s, x), *tm = t_from(e, 2, s, mb), *out = NULL, *f = NULL;
  T_REQUIRE(tx && tm);
  T_CHECK_OK(e, gcap_softmax_masked(tx, 0.5, tm, GCAP_MASK_BOOL, 1, &out));
  if (t_read(out, y, 9)) {
    T_CHECK(y[0] == 1.0f && y[1] == 0.0f && y[2] == 0.0f);
    T_CHECK(y[3] == 0.0f && y[4] == 0.0f && y[5] == 0.0f);
    double z = exp(3.5) + exp(4.0) + exp(4.5);
    T_CHECK_NEAR(y[6], exp(3.5) / z, 1e-7, 1e-6);
    T_CHECK_NEAR(y[8], exp(4.5) / z, 1e-7, 1e-6);
  }
  gcap_tensor_free(out), out = NULL;
  T_CHECK_OK(e, gcap_masked_fill(tx, tm, -1.0, &f));
  if (t_read(f, y, 9)) T_CHECK(y[0] == 1.0f && y[3] == -1.0f && y[5] == -1.0f && y[8] == 9.0f);
  T_CHECK_ST(e, gcap_softmax_masked(tx, 1.0, tm, (gcap_mask_kind)7, 0, &out), GCAP_EINVAL);
  T_CHECK(out == NULL && t_msg_has(e, "softmax: unknown mask kind 7"));
  gcap_tensor_free(f), gcap_tensor_free(tx), gcap_tensor_free(tm);
  gcap_engine_free(e);
}

/* Repeated ids add their grads; a bad id is refused before any work. */
static void test_embedding(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  float w[8], ids[5] = {3, 0, 3, 3, 1}, bad[2] = {1, 4}, g[8];
  const int64_t sw[2] = {4, 2}, si[1] = {5}, sb[1] = {2};
  ramp(w, 8, 0.5f, 1.0f);
  gcap_tensor *tw = t_from(e, 2, sw, w), *ti = t_from(e, 1, si, ids), *tb = t_from(e, 1, sb, bad);
  gcap_tensor *y = NULL, *l = NULL;
  T_REQUIRE(tw && ti && tb);
  T_CHECK_OK(e, gcap_tensor_set_requires_grad(tw, 1));
  T_CHECK_OK(e, gcap_embedding(ti, tw, &y));
  T_CHECK(gcap_tensor_shape(y)[0] == 5 && gcap_tensor_shape(y)[1] == 2);
  T_CHECK_OK(e, gcap_sum(y, &l));
  T_CHECK_OK(e, gcap_backward(l, NULL, 0));
  if (t_read(gcap_tensor_grad(tw), g, 8)) /* counts of each id: 1, 1, 0, 3 */
    T_CHECK(g[0] == 1 && g[1] == 1 && g[2] == 1 && g[4] == 0 && g[6] == 3 && g[7] == 3);
  gcap_tensor_free(y), y = tw;
  T_CHECK_ST(e, gcap_embedding(tb, tw, &y), GCAP_EINVAL);
  T_CHECK(y == NULL && t_msg_has(e, "embedding: the id at 2 (counting from 1) is 4, not a row of "
                                    "the weight (an integer in 0..3)"));
  gcap_tensor_free(l), gcap_tensor_free(tw), gcap_tensor_free(ti), gcap_tensor_free(tb);
  gcap_engine_free(e);
}

/* loss = sum(attention(q, k, v) * r), with causal masking and dropout */
static gcap_status sdpa_loss(gcap_tensor *const *in, gcap_tensor *r, gcap_tensor **out) {
  gcap_sdpa_opts o = {.is_causal = 1, .dropout_p = 0.25, .scale = 0.3};
  gcap_tensor *a = NULL, *p = NULL;
  gcap_status st = gcap_scaled_dot_product_attention(in[0], in[1], in[2], &o, &a);
  if (st == GCAP_OK && (st = gcap_mul(a, r, &p)) == GCAP_OK) st = gcap_sum(p, out);
  gcap_tensor_free(a), gcap_tensor_free(p);
  return st;
}

/* Attention's forward and backward (three inputs that require grad),
** captured: each replay equals an eager step from the same seed. */
static void test_sdpa_capture_replay(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  enum { N = 2 * 2 * 8 * 4 };
  static float d[3][N], eager[3][N], replay[3][N];
  const int64_t s[4] = {2, 2, 8, 4};
  gcap_tensor *in[3] = {0}, *r = NULL, *l = NULL;
  gcap_graph *g = NULL;
  for (int i = 0; i < 3; i++) {
    for (int j = 0; j < N; j++)
      d[i][j] = sinf(0.37f * (float)j + (float)i);
    in[i] = t_from(e, 4, s, d[i]);
    T_REQUIRE(in[i] != NULL);
    T_CHECK_OK(e, gcap_tensor_set_requires_grad(in[i], 1));
  }
  r = t_from(e, 4, s, d[2]);
  T_REQUIRE(r != NULL);
  T_CHECK_OK(e, gcap_manual_seed(e, 99));
  T_CHECK_OK(e, sdpa_loss(in, r, &l));
  T_CHECK_OK(e, gcap_backward(l, NULL, 0));
  for (int i = 0; i < 3; i++) {
    T_REQUIRE(t_read(gcap_tensor_grad(in[i]), eager[i], N));
    T_CHECK_OK(e, gcap_tensor_set_grad(in[i], NULL));
  }
  gcap_tensor_free(l), l = NULL;
  T_CHECK_OK(e, gcap_graph_new(e, &g));
  T_CHECK_OK(e, gcap_capture_begin(g, NULL, NULL));
  T_CHECK_OK(e, sdpa_loss(in, r, &l));
  T_CHECK_OK(e, gcap_backward(l, NULL, 0));
  T_CHECK_OK(e, gcap_capture_end(g));
  for (int k = 0; k < 2; k++) {
    T_CHECK_OK(e, gcap_manual_seed(e, 99));
    T_CHECK_OK(e, gcap_graph_replay(g));
    for (int i = 0; i < 3; i++)
      if (t_read(gcap_tensor_grad(in[i]), replay[i], N))
        T_CHECK(memcmp(replay[i], eager[i], sizeof eager[i]) == 0);
  }
  int nonzero = 0;
  for (int j = 0; j < N; j++)
    nonzero += eager[0][j] != 0.0f;
  T_CHECK(nonzero > N / 2);
  for (int i = 0; i < 3; i++)
    gcap_tensor_free(in[i]);
  gcap_tensor_free(r), gcap_tensor_free(l);
  gcap_graph_free(g);
  gcap_engine_free(e);
}

/* The fused kernels and the composition give the same f32 bits on the host
** (output and the three grads), with a causal boolean mask and dropout; on
** cuda they agree within a tolerance. */
static void test_sdpa_fused_equals_composed(void) {
  gcap_engine *e = t_engine();
  T_REQUIRE(e != NULL);
  enum { N = 2 * 3 * 7 * 8 };
  static float d[3][N], got[2][4][N];
  float mb[49];
  const int64_t s[4] = {2, 3, 7, 8}, sm[2] = {7, 7};
  gcap_tensor *in[3] = {0}, *r = NULL, *m = NULL;
  for (int j = 0; j < 49; j++)
    mb[j] = (float)(j % 5 == 0);
  m = t_from(e, 2, sm, mb);
  for (int i = 0; i < 3; i++) {
    for (int j = 0; j < N; j++)
      d[i][j] = cosf(0.21f * (float)j - (float)i);
    in[i] = t_from(e, 4, s, d[i]);
    T_REQUIRE(in[i] != NULL);
    T_CHECK_OK(e, gcap_tensor_set_requires_grad(in[i], 1));
  }
  r = t_from(e, 4, s, d[1]);
  T_REQUIRE(r && m);
  for (int impl = 0; impl < 2; impl++) {
    gcap_sdpa_opts o = {.attn_mask = m,
                        .mask_kind = GCAP_MASK_BOOL,
                        .is_causal = 1,
                        .dropout_p = 0.2,
                        .impl = impl ? GCAP_SDPA_FUSED : GCAP_SDPA_COMPOSED};
    gcap_tensor *y = NULL, *p = NULL, *l = NULL;
    T_CHECK_OK(e, gcap_manual_seed(e, 4));
    T_CHECK_OK(e, gcap_scaled_dot_product_attention(in[0], in[1], in[2], &o, &y));
    T_CHECK_OK(e, gcap_mul(y, r, &p));
    T_CHECK_OK(e, gcap_sum(p, &l));
    T_CHECK_OK(e, gcap_backward(l, NULL, 0));
    T_CHECK(t_read(y, got[impl][0], N));
    for (int i = 0; i < 3; i++) {
      T_CHECK(t_read(gcap_tensor_grad(in[i]), got[impl][i + 1], N));
      T_CHECK_OK(e, gcap_tensor_set_grad(in[i], NULL));
    }
    gcap_tensor_free(y), gcap_tensor_free(p), gcap_tensor_free(l);
  }
  for (int k = 0; k < 4; k++) {
    if (t_device() == GCAP_DEVICE_HOST) {
      if (memcmp(got[0][k], got[1][k], sizeof got[0][k]) != 0)
        T_FAILF("fused == composed", "part %d (output, then the grads of q, k, v) differs", k);
      continue;
    }
    /* cuda's fused kernels sum the keys in another order than its GEMMs: within
    ** the parity rows' f32 tolerance */
    for (int j = 0; j < N; j++)
      if (!(fabsf(got[1][k][j] - got[0][k][j]) <= 1e-4f + 1e-4f * fabsf(got[0][k][j]))) {
        T_FAILF("fused ~ composed",
                "part %d (output, then the grads of q, k, v) [%d]: %.9g vs %.9g", k, j,
                (double)got[1][k][j], (double)got[0][k][j]);
        break;
      }
  }
  for (int i = 0; i < 3; i++)
    gcap_tensor_free(in[i]);
  gcap_tensor_free(r), gcap_tensor_free(m);
  gcap_engine_free(e);
}

/* regression: a C caller's NaN or negative sdpa scale made NaN outputs */
/* An sdpa scale that is NaN, negative or beyond a float ran from C (the
** Lua binding alone checked it): every output NaN or inf, silently. */
static void test_sdpa_scale_checked(void) {
  const int64_t s[3] = {1, 2, 3};
  const float d[6] = {1, 2, 3, 4, 5, 6};
  const double bad[3] = {NAN, -0.5, 1e300};
  gcap_engine *e = t_engine();
  gcap_tensor *q = NULL, *y = NULL;
  int i;
  T_SETUP(e != NULL && (q = t_from(e, 3, s, d)) != NULL, goto out);
  for (i = 0; i < 3; i++) {
    gcap_sdpa_opts o = {.scale = bad[i]};
    T_CHECK_ST(e, gcap_scaled_dot_product_attention(q, q, q, &o, &y), GCAP_EINVAL);
    T_CHECK(y == NULL && t_msg_has(e, "scaled_dot_product_attention: the scale must be positive"));
    o.impl = GCAP_SDPA_FUSED;
    T_CHECK_ST(e, gcap_scaled_dot_product_attention(q, q, q, &o, &y), GCAP_EINVAL);
  }
  T_CHECK_ST(e, gcap_softmax_masked(q, 1e300, NULL, GCAP_MASK_ADD, 0, &y), GCAP_EINVAL);
  T_CHECK(y == NULL && t_msg_has(e, "softmax: the scale must be finite as a float, got 1e+300"));
  {
    gcap_sdpa_opts o = {.scale = 0.5};
    T_CHECK_OK(e, gcap_scaled_dot_product_attention(q, q, q, &o, &y));
  }
out:
  gcap_tensor_free(y);
  gcap_tensor_free(q);
  gcap_engine_free(e);
}

int main(void) {
  T_RUN(test_permute_transpose_values);
  T_RUN(test_split_chunk_cat);
  T_RUN(test_batched_matmul);
  T_RUN(test_softmax_masks);
  T_RUN(test_embedding);
  T_RUN(test_sdpa_capture_replay);
  T_RUN(test_sdpa_fused_equals_composed);
  T_RUN(test_sdpa_scale_checked);
  return t_done();
}
