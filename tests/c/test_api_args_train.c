/*
** test_api_args_train.c: as test_api_args.c, the functions of graphcap.h
** from make_graphed_callables on: the hook kinds, modules and their hooks,
** the built-in and transformer modules, graphing and the graphed entries,
** and the distributed layer (initialised at world size 1, without mpirun,
** as test_dist.c; gcap_dist_abort, which ends the process, is not called).
** Each bad argument returns its status and a message of its own naming the
** argument; a call with no engine to tell returns what its declaration
** says.
*/
#include "t_args.h"

static gcap_status fwd_id(void *ud, gcap_module *m, int nin, gcap_tensor *const *in,
                          gcap_tensor **out) {
  (void)ud, (void)m, (void)nin;
  *out = gcap_tensor_retain(in[0]);
  return GCAP_OK;
}

static gcap_status fwd_n_id(void *ud, gcap_module *m, int nin, gcap_tensor *const *in, int *nout,
                            gcap_tensor **out) {
  (void)ud, (void)m, (void)nin;
  out[0] = gcap_tensor_retain(in[0]);
  *nout = 1;
  return GCAP_OK;
}

static gcap_status hook_nop(void *ud, gcap_module *m, const gcap_hook_args *a) {
  (void)ud, (void)m, (void)a;
  return GCAP_OK;
}

/* A forward hook giving gcap_hook_return bad counts and arrays: each is
** refused naming them; the call goes on with its own output. */
static int hook_ran;
static gcap_status hook_bad_return(void *ud, gcap_module *m, const gcap_hook_args *a) {
  gcap_engine *e = (gcap_engine *)ud;
  (void)m;
  BAD(e, GCAP_EINVAL, "n", gcap_hook_return(a, -1, a->out));
  BAD(e, GCAP_EINVAL, "t", gcap_hook_return(a, 1, NULL));
  hook_ran++;
  return GCAP_OK;
}

/* ------------------------------------------------------------------------ */
/* Hook kinds, modules, module hooks                                         */

static void test_kinds_and_defaults(void) {
  T_CHECK(strcmp(gcap_hook_kind_name((gcap_hook_kind)GCAP_HOOK_KINDS), "") == 0);
  T_CHECK(strcmp(gcap_hook_kind_name((gcap_hook_kind)-1), "") == 0);
  T_CHECK(strcmp(gcap_hook_group_key((gcap_hook_kind)GCAP_HOOK_KINDS), "") == 0);
  T_CHECK(strcmp(gcap_hook_group_key((gcap_hook_kind)-1), "") == 0);
  gcap_graphed_opts_init(NULL); /* nothing to fill */
  gcap_transformer_opts_init(NULL);
}

static void test_modules(void) {
  gcap_module *m = NULL, *m2 = NULL, *mo = BOGUS(gcap_module);
  gcap_tensor *in[1], *o = BOGUS(gcap_tensor), *outs[2];
  int id = -1, n = -1;
  fx f;
  T_SETUP(fx_open(&f), fx_close(&f));
  BAD(f.e, GCAP_EINVAL, "out", gcap_module_new(f.e, "M", fwd_id, NULL, NULL, NULL));
  BAD(f.e, GCAP_EINVAL, "fwd", gcap_module_new(f.e, "M", NULL, NULL, NULL, &mo));
  BAD(f.e, GCAP_EINVAL, "out", gcap_module_new_n(f.e, "M", fwd_n_id, NULL, NULL, NULL));
  BAD(f.e, GCAP_EINVAL, "fwd", gcap_module_new_n(f.e, "M", NULL, NULL, NULL, &mo));
  NOENG(GCAP_EINVAL, gcap_module_new(NULL, "M", fwd_id, NULL, NULL, &mo));
  NOENG(GCAP_EINVAL, gcap_module_new_n(NULL, "M", fwd_n_id, NULL, NULL, &mo));
  T_CHECK(mo == NULL);
  T_SETUP(gcap_module_new(f.e, "M", fwd_id, NULL, NULL, &m) == GCAP_OK, fx_close(&f));
  T_SETUP(gcap_module_new(f.e2, "M2", fwd_id, NULL, NULL, &m2) == GCAP_OK,
          (gcap_module_free(m), fx_close(&f)));
  BAD(f.e, GCAP_EINVAL, "m", gcap_module_add_parameter(NULL, "w", f.x));
  BAD(f.e, GCAP_EINVAL, "t", gcap_module_add_parameter(m, "w", NULL));
  BAD(f.e, GCAP_EINVAL, "name", gcap_module_add_parameter(m, NULL, f.x));
  FOREIGN(f.e, "parameter", gcap_module_add_parameter(m, "w", f.y));
  BAD(f.e, GCAP_EINVAL, "m", gcap_module_add_buffer(NULL, "b", f.x));
  BAD(f.e, GCAP_EINVAL, "t", gcap_module_add_buffer(m, "b", NULL));
  FOREIGN(f.e, "buffer", gcap_module_add_buffer(m, "b", f.y));
  BAD(f.e, GCAP_EINVAL, "name", gcap_module_set_buffer_persistent(m, NULL, 0));
  BAD(f.e, GCAP_EINVAL, "nobuf", gcap_module_set_buffer_persistent(m, "nobuf", 0));
  T_CHECK(gcap_module_buffer_persistent(m, "nobuf") == -1 &&
          gcap_module_buffer_persistent(m, NULL) == -1 &&
          gcap_module_buffer_persistent(NULL, "b") == -1);
  BAD(f.e2, GCAP_EINVAL, "m", gcap_module_add_child(NULL, "c", m2));
  BAD(f.e, GCAP_EINVAL, "child", gcap_module_add_child(m, "c", NULL));
  FOREIGN(f.e, "child", gcap_module_add_child(m, "c", m2));
  T_CHECK(gcap_module_num_parameters(m) == 0 && gcap_module_num_children(m) == 0);
  BAD(f.e, GCAP_EINVAL, "kind",
      gcap_module_register_hook(m, (gcap_hook_kind)9, hook_nop, NULL, NULL, &id));
  BAD(f.e, GCAP_EINVAL, "fn",
      gcap_module_register_hook(m, GCAP_HOOK_FORWARD, NULL, NULL, NULL, &id));
  T_CHECK(id == 0 && gcap_module_num_hooks(m, (gcap_hook_kind)9) == 0);
  in[0] = f.x;
  BAD(f.e, GCAP_EINVAL, "nin", gcap_module_call(m, -1, in, &o));
  BAD(f.e, GCAP_EINVAL, "in", gcap_module_call(m, 1, NULL, &o));
  BAD(f.e, GCAP_EINVAL, "out", gcap_module_call(m, 1, in, NULL));
  BAD(f.e, GCAP_EINVAL, "maxout", gcap_module_call_n(m, 1, in, -1, &n, outs));
  BAD(f.e, GCAP_EINVAL, "nout", gcap_module_call_n(m, 1, in, 2, NULL, outs));
  BAD(f.e, GCAP_EINVAL, "out", gcap_module_call_n(m, 1, in, 2, &n, NULL));
  BAD(f.e, GCAP_EINVAL, "maxout", gcap_module_call_opts(m, NULL, 1, in, -1, &n, outs));
  in[0] = NULL;
  BAD(f.e, GCAP_EINVAL, "input #1", gcap_module_call(m, 1, in, &o));
  in[0] = f.y;
  FOREIGN(f.e, "input #1", gcap_module_call(m, 1, in, &o));
  BAD(f.e, GCAP_EINVAL, "dtype", gcap_module_to(m, (gcap_dtype)7));
  T_CHECK(o == NULL && n == 0);
  o = BOGUS(gcap_tensor);
  NOENG(GCAP_EINVAL, gcap_module_add_parameter(NULL, "w", NULL));
  NOENG(GCAP_EINVAL, gcap_module_add_buffer(NULL, "b", NULL));
  NOENG(GCAP_EINVAL, gcap_module_set_buffer_persistent(NULL, "b", 0));
  NOENG(GCAP_EINVAL, gcap_module_add_child(NULL, "c", NULL));
  NOENG(GCAP_EINVAL, gcap_module_register_hook(NULL, GCAP_HOOK_FORWARD, hook_nop, NULL, NULL, &id));
  NOENG(GCAP_EINVAL, gcap_module_remove_hook(NULL, 1));
  NOENG(GCAP_EINVAL, gcap_module_call(NULL, 1, in, &o));
  NOENG(GCAP_EINVAL, gcap_module_call_n(NULL, 1, in, 2, &n, outs));
  NOENG(GCAP_EINVAL, gcap_module_call_opts(NULL, NULL, 1, in, 2, &n, outs));
  NOENG(GCAP_EINVAL, gcap_module_zero_grad(NULL, 1));
  NOENG(GCAP_EINVAL, gcap_module_backward_dw(NULL));
  NOENG(GCAP_EINVAL, gcap_module_to(NULL, GCAP_F32));
  NOENG(GCAP_EINVAL, gcap_hook_return(NULL, 0, NULL));
  T_CHECK(o == NULL);
  gcap_module_free(m), gcap_module_free(m2);
  fx_close(&f);
}

/* The getters of no module and of an index that is none; gcap_hook_return
** from a running hook, and with the args of none. */
static void test_module_getters(void) {
  gcap_module *m = NULL;
  gcap_tensor *in[1], *o = NULL;
  const char *name = "unset";
  int id = -1;
  fx f;
  T_SETUP(fx_open(&f), fx_close(&f));
  T_SETUP(gcap_module_new(f.e, "M", fwd_id, NULL, NULL, &m) == GCAP_OK, fx_close(&f));
  T_CHECK(gcap_module_retain(NULL) == NULL && strcmp(gcap_module_type(NULL), "") == 0);
  T_CHECK(gcap_module_userdata(NULL) == NULL && gcap_module_training(NULL) == 0);
  T_CHECK(gcap_module_num_parameters(NULL) == 0 && gcap_module_num_buffers(NULL) == 0);
  T_CHECK(gcap_module_num_children(NULL) == 0 && gcap_module_num_hooks(NULL, 0) == 0);
  T_CHECK(gcap_module_parameter(NULL, 0, NULL, 0) == NULL &&
          gcap_module_parameter(m, -1, NULL, 0) == NULL);
  T_CHECK(gcap_module_buffer(NULL, 0, NULL, 0) == NULL &&
          gcap_module_buffer(m, 9, NULL, 0) == NULL);
  T_CHECK(gcap_module_child(NULL, 0, &name) == NULL && gcap_module_child(m, -1, &name) == NULL);
  T_CHECK(strcmp(name, "unset") == 0 && gcap_module_has_delayed_wgrad(NULL) == 0);
  gcap_module_train(NULL, 0), gcap_module_free(NULL);
  T_CHECK_OK(f.e, gcap_module_register_hook(m, GCAP_HOOK_FORWARD, hook_bad_return, f.e, NULL, &id));
  in[0] = f.x, hook_ran = 0;
  T_CHECK_OK(f.e, gcap_module_call(m, 1, in, &o));
  T_CHECK(hook_ran == 1 && o != NULL && gcap_tensor_data_ptr(o) == gcap_tensor_data_ptr(f.x));
  {
    gcap_hook_args a;
    memset(&a, 0, sizeof a);
    NOENG(GCAP_EINVAL, gcap_hook_return(&a, 1, in)); /* a->ret NULL: not a running hook's */
  }
  gcap_tensor_free(o);
  gcap_module_free(m);
  fx_close(&f);
}

/* ------------------------------------------------------------------------ */
/* Built-in and transformer modules                                          */

static void test_builtin_modules(void) {
  gcap_transformer_opts o;
  gcap_module *mo = BOGUS(gcap_module), *mods[1], *m2 = NULL;
  fx f;
  T_SETUP(fx_open(&f), fx_close(&f));
  T_SETUP(gcap_nn_relu(f.e2, &m2) == GCAP_OK, fx_close(&f));
  BAD(f.e, GCAP_EINVAL, "m", gcap_nn_linear(f.e, 2, 2, 1, 0, NULL));
  BAD(f.e, GCAP_EINVAL, "in", gcap_nn_linear(f.e, 0, 2, 1, 0, &mo));
  BAD(f.e, GCAP_EINVAL, "out", gcap_nn_linear(f.e, 2, -1, 1, 0, &mo));
  BAD(f.e, GCAP_EINVAL, "flags", gcap_nn_linear(f.e, 2, 2, 1, 0x80u, &mo));
  BAD(f.e, GCAP_EINVAL, "m", gcap_nn_relu(f.e, NULL));
  BAD(f.e, GCAP_EINVAL, "m", gcap_nn_gelu(f.e, NULL));
  BAD(f.e, GCAP_EINVAL, "m", gcap_nn_layer_norm(f.e, 2, 1e-5, NULL));
  BAD(f.e, GCAP_EINVAL, "size", gcap_nn_layer_norm(f.e, 0, 1e-5, &mo));
  BAD(f.e, GCAP_EINVAL, "m", gcap_nn_dropout(f.e, 0.5, NULL));
  BAD(f.e, GCAP_EINVAL, "probability", gcap_nn_dropout(f.e, 2.0, &mo));
  BAD(f.e, GCAP_EINVAL, "m", gcap_nn_sequential(f.e, 0, NULL, NULL));
  BAD(f.e, GCAP_EINVAL, "n", gcap_nn_sequential(f.e, -1, NULL, &mo));
  BAD(f.e, GCAP_EINVAL, "mods", gcap_nn_sequential(f.e, 1, NULL, &mo));
  mods[0] = NULL;
  BAD(f.e, GCAP_EINVAL, "module #1", gcap_nn_sequential(f.e, 1, mods, &mo));
  mods[0] = m2;
  FOREIGN(f.e, "module #1", gcap_nn_sequential(f.e, 1, mods, &mo));
  BAD(f.e, GCAP_EINVAL, "m", gcap_nn_layer_norm_linear(f.e, 2, 2, 1e-5, 1, 0, NULL));
  BAD(f.e, GCAP_EINVAL, "in_features", gcap_nn_layer_norm_linear(f.e, 0, 2, 1e-5, 1, 0, &mo));
  BAD(f.e, GCAP_EINVAL, "out_features", gcap_nn_layer_norm_linear(f.e, 2, 0, 1e-5, 1, 0, &mo));
  BAD(f.e, GCAP_EINVAL, "eps", gcap_nn_layer_norm_linear(f.e, 2, 2, -1.0, 1, 0, &mo));
  BAD(f.e, GCAP_EINVAL, "m", gcap_nn_layer_norm_mlp(f.e, 2, 4, 1e-5, 1, 0, NULL));
  BAD(f.e, GCAP_EINVAL, "hidden_size", gcap_nn_layer_norm_mlp(f.e, 0, 4, 1e-5, 1, 0, &mo));
  BAD(f.e, GCAP_EINVAL, "ffn_hidden_size", gcap_nn_layer_norm_mlp(f.e, 2, -4, 1e-5, 1, 0, &mo));
  BAD(f.e, GCAP_EINVAL, "eps", gcap_nn_layer_norm_mlp(f.e, 2, 4, NAN, 1, 0, &mo));
  BAD(f.e, GCAP_EINVAL, "m",
      gcap_nn_dot_product_attention(f.e, 1, 2, GCAP_ATTN_CAUSAL, 0, GCAP_SDPA_AUTO, NULL));
  BAD(f.e, GCAP_EINVAL, "num_attention_heads",
      gcap_nn_dot_product_attention(f.e, 0, 2, GCAP_ATTN_CAUSAL, 0, GCAP_SDPA_AUTO, &mo));
  BAD(f.e, GCAP_EINVAL, "kv_channels",
      gcap_nn_dot_product_attention(f.e, 1, 0, GCAP_ATTN_CAUSAL, 0, GCAP_SDPA_AUTO, &mo));
  BAD(f.e, GCAP_EINVAL, "attn_mask_type",
      gcap_nn_dot_product_attention(f.e, 1, 2, (gcap_attn_mask)9, 0, GCAP_SDPA_AUTO, &mo));
  BAD(f.e, GCAP_EINVAL, "attention_dropout",
      gcap_nn_dot_product_attention(f.e, 1, 2, GCAP_ATTN_CAUSAL, 1.0, GCAP_SDPA_AUTO, &mo));
  BAD(f.e, GCAP_EINVAL, "attn_impl",
      gcap_nn_dot_product_attention(f.e, 1, 2, GCAP_ATTN_CAUSAL, 0, (gcap_sdpa_impl)9, &mo));
  gcap_transformer_opts_init(&o);
  BAD(f.e, GCAP_EINVAL, "m", gcap_nn_multihead_attention(f.e, 4, 2, &o, NULL));
  BAD(f.e, GCAP_EINVAL, "hidden_size", gcap_nn_multihead_attention(f.e, 0, 2, &o, &mo));
  BAD(f.e, GCAP_EINVAL, "num_attention_heads", gcap_nn_multihead_attention(f.e, 4, -2, NULL, &mo));
  BAD(f.e, GCAP_EINVAL, "num_attention_heads", gcap_nn_multihead_attention(f.e, 4, 3, &o, &mo));
  o.hidden_dropout = 2.0;
  BAD(f.e, GCAP_EINVAL, "hidden_dropout", gcap_nn_multihead_attention(f.e, 4, 2, &o, &mo));
  o.hidden_dropout = 0.1, o.layernorm_epsilon = -1.0;
  BAD(f.e, GCAP_EINVAL, "layernorm_epsilon", gcap_nn_transformer_layer(f.e, 4, 8, 2, &o, &mo));
  o.layernorm_epsilon = 1e-5, o.attn_mask_type = (gcap_attn_mask)9;
  BAD(f.e, GCAP_EINVAL, "attn_mask_type", gcap_nn_transformer_layer(f.e, 4, 8, 2, &o, &mo));
  BAD(f.e, GCAP_EINVAL, "m", gcap_nn_transformer_layer(f.e, 4, 8, 2, NULL, NULL));
  BAD(f.e, GCAP_EINVAL, "ffn_hidden_size", gcap_nn_transformer_layer(f.e, 4, 0, 2, NULL, &mo));
  BAD(f.e, GCAP_EINVAL, "m", gcap_nn_embedding(f.e, 4, 2, NULL));
  BAD(f.e, GCAP_EINVAL, "num_embeddings", gcap_nn_embedding(f.e, 0, 2, &mo));
  BAD(f.e, GCAP_EINVAL, "embedding_dim", gcap_nn_embedding(f.e, 4, -1, &mo));
  T_CHECK(mo == NULL);
  mo = BOGUS(gcap_module);
  NOENG(GCAP_EINVAL, gcap_nn_linear(NULL, 2, 2, 1, 0, &mo));
  NOENG(GCAP_EINVAL, gcap_nn_relu(NULL, &mo));
  NOENG(GCAP_EINVAL, gcap_nn_gelu(NULL, &mo));
  NOENG(GCAP_EINVAL, gcap_nn_layer_norm(NULL, 2, 1e-5, &mo));
  NOENG(GCAP_EINVAL, gcap_nn_dropout(NULL, 0.5, &mo));
  NOENG(GCAP_EINVAL, gcap_nn_sequential(NULL, 0, NULL, &mo));
  NOENG(GCAP_EINVAL, gcap_nn_layer_norm_linear(NULL, 2, 2, 1e-5, 1, 0, &mo));
  NOENG(GCAP_EINVAL, gcap_nn_layer_norm_mlp(NULL, 2, 4, 1e-5, 1, 0, &mo));
  NOENG(GCAP_EINVAL,
        gcap_nn_dot_product_attention(NULL, 1, 2, GCAP_ATTN_CAUSAL, 0, GCAP_SDPA_AUTO, &mo));
  NOENG(GCAP_EINVAL, gcap_nn_multihead_attention(NULL, 4, 2, NULL, &mo));
  NOENG(GCAP_EINVAL, gcap_nn_transformer_layer(NULL, 4, 8, 2, NULL, &mo));
  NOENG(GCAP_EINVAL, gcap_nn_embedding(NULL, 4, 2, &mo));
  T_CHECK(mo == NULL);
  gcap_module_free(m2);
  fx_close(&f);
}

/* ------------------------------------------------------------------------ */
/* make_graphed_callables and the graphed entries                            */

/* The calls on graphed entries: entry 0 of G, a graphed Linear(3, 2) that
** took f->x; 9 and -1 are no entry. */
static void graphed_entries(fx *f, gcap_graphed *G) {
  gcap_tensor *in[1], *o = BOGUS(gcap_tensor), *outs[2];
  gcap_graphed_stats gs;
  int n = -1;
  in[0] = f->x;
  T_CHECK(gcap_graphed_module(G, 9) == NULL && gcap_graphed_module(NULL, 0) == NULL);
  T_CHECK(gcap_graphed_num_outputs(G, -1) == -1 && gcap_graphed_num_outputs(NULL, 0) == -1);
  BAD(f->e, GCAP_EINVAL, "entry", gcap_graphed_call(G, 9, 1, in, &o));
  BAD(f->e, GCAP_EINVAL, "entry", gcap_graphed_call(G, -1, 1, in, &o));
  BAD(f->e, GCAP_EINVAL, "nin", gcap_graphed_call(G, 0, -1, in, &o));
  BAD(f->e, GCAP_EINVAL, "in", gcap_graphed_call(G, 0, 1, NULL, &o));
  BAD(f->e, GCAP_EINVAL, "out", gcap_graphed_call(G, 0, 1, in, NULL));
  BAD(f->e, GCAP_EINVAL, "entry", gcap_graphed_call_n(G, 9, 1, in, 2, &n, outs));
  BAD(f->e, GCAP_EINVAL, "maxout", gcap_graphed_call_n(G, 0, 1, in, -1, &n, outs));
  BAD(f->e, GCAP_EINVAL, "nout", gcap_graphed_call_n(G, 0, 1, in, 2, NULL, outs));
  BAD(f->e, GCAP_EINVAL, "out", gcap_graphed_call_n(G, 0, 1, in, 2, &n, NULL));
  in[0] = NULL;
  BAD(f->e, GCAP_EINVAL, "argument #1", gcap_graphed_call(G, 0, 1, in, &o));
  in[0] = f->y;
  FOREIGN(f->e, "argument #1", gcap_graphed_call(G, 0, 1, in, &o));
  BAD(f->e, GCAP_EINVAL, "entry", gcap_graphed_backward_dw(G, 9));
  BAD(f->e, GCAP_EINVAL, "entry", gcap_graphed_reset(G, -1));
  BAD(f->e, GCAP_EINVAL, "entry", gcap_graphed_debug_dump(G, 9, "x"));
  BAD(f->e, GCAP_EINVAL, "prefix", gcap_graphed_debug_dump(G, 0, NULL));
  BAD(f->e, GCAP_EINVAL, "entry", gcap_graphed_get_stats(G, 9, &gs));
  BAD(f->e, GCAP_EINVAL, "out", gcap_graphed_get_stats(G, 0, NULL));
  T_CHECK(o == NULL && n == 0);
  o = BOGUS(gcap_tensor);
  NOENG(GCAP_EINVAL, gcap_graphed_call(NULL, 0, 1, in, &o));
  NOENG(GCAP_EINVAL, gcap_graphed_call_n(NULL, 0, 1, in, 2, &n, outs));
  NOENG(GCAP_EINVAL, gcap_graphed_backward_dw(NULL, 0));
  NOENG(GCAP_EINVAL, gcap_graphed_reset(NULL, 0));
  NOENG(GCAP_EINVAL, gcap_graphed_debug_dump(NULL, 0, "x"));
  NOENG(GCAP_EINVAL, gcap_graphed_get_stats(NULL, 0, &gs));
  T_CHECK(o == NULL);
  { /* the replay options: this engine's stream and event */
    gcap_stream *s2 = NULL;
    gcap_replay_opts ro = {NULL, NULL};
    T_CHECK_OK(f->e2, gcap_stream_new(f->e2, &s2));
    ro.stream = s2;
    in[0] = f->x;
    FOREIGN(f->e, "cuda_graph_stream", gcap_graphed_call_opts(G, 0, &ro, 1, in, 2, &n, outs));
    BAD(f->e, GCAP_EINVAL, "entry", gcap_graphed_call_opts(G, 9, &ro, 1, in, 2, &n, outs));
    NOENG(GCAP_EINVAL, gcap_graphed_call_opts(NULL, 0, &ro, 1, in, 2, &n, outs));
    gcap_stream_free(s2);
  }
  /* the entry still replays */
  in[0] = f->x;
  T_CHECK_OK(f->e, gcap_graphed_call(G, 0, 1, in, &o));
  T_CHECK(gcap_tensor_numel(o) == 4);
  gcap_tensor_free(o);
}

static void test_make_graphed(void) {
  gcap_graphed_opts opts;
  gcap_module *lin = NULL, *lin2 = NULL, *cal[1];
  gcap_tensor *x0[1], *const *args[1];
  gcap_graphed *G = NULL, *go = BOGUS(gcap_graphed);
  gcap_pool *p2 = NULL;
  int nargs[1] = {1}, neg[1] = {-1};
  fx f;
  T_SETUP(fx_open(&f), fx_close(&f));
  T_SETUP(gcap_nn_linear(f.e, 3, 2, 1, 0, &lin) == GCAP_OK &&
              gcap_nn_linear(f.e2, 3, 2, 1, 0, &lin2) == GCAP_OK &&
              gcap_pool_new(f.e2, &p2) == GCAP_OK,
          (gcap_module_free(lin), gcap_module_free(lin2), fx_close(&f)));
  cal[0] = lin, x0[0] = f.x, args[0] = x0;
  BAD(f.e, GCAP_EINVAL, "out",
      gcap_make_graphed_callables(f.e, 1, cal, 1, nargs, args, NULL, NULL));
  BAD(f.e, GCAP_EINVAL, "ncallables",
      gcap_make_graphed_callables(f.e, 0, cal, 1, nargs, args, NULL, &go));
  BAD(f.e, GCAP_EINVAL, "ncallables",
      gcap_make_graphed_callables(f.e, -1, cal, 1, nargs, args, NULL, &go));
  BAD(f.e, GCAP_EINVAL, "callables",
      gcap_make_graphed_callables(f.e, 1, NULL, 1, nargs, args, NULL, &go));
  BAD(f.e, GCAP_EINVAL, "nentries",
      gcap_make_graphed_callables(f.e, 1, cal, 0, nargs, args, NULL, &go));
  BAD(f.e, GCAP_EINVAL, "nargs",
      gcap_make_graphed_callables(f.e, 1, cal, 1, NULL, args, NULL, &go));
  BAD(f.e, GCAP_EINVAL, "args",
      gcap_make_graphed_callables(f.e, 1, cal, 1, nargs, NULL, NULL, &go));
  BAD(f.e, GCAP_EINVAL, "nargs", gcap_make_graphed_callables(f.e, 1, cal, 1, neg, args, NULL, &go));
  x0[0] = NULL;
  BAD(f.e, GCAP_EINVAL, "sample_args[1][1]",
      gcap_make_graphed_callables(f.e, 1, cal, 1, nargs, args, NULL, &go));
  x0[0] = f.y;
  FOREIGN(f.e, "sample_args[1][1]",
          gcap_make_graphed_callables(f.e, 1, cal, 1, nargs, args, NULL, &go));
  x0[0] = f.x, cal[0] = NULL;
  BAD(f.e, GCAP_EINVAL, "callable 1",
      gcap_make_graphed_callables(f.e, 1, cal, 1, nargs, args, NULL, &go));
  cal[0] = lin2;
  FOREIGN(f.e, "callable 1", gcap_make_graphed_callables(f.e, 1, cal, 1, nargs, args, NULL, &go));
  cal[0] = lin;
  gcap_graphed_opts_init(&opts);
  opts.num_warmup_iters = -1;
  BAD(f.e, GCAP_EINVAL, "num_warmup_iters",
      gcap_make_graphed_callables(f.e, 1, cal, 1, nargs, args, &opts, &go));
  gcap_graphed_opts_init(&opts);
  opts.pool = p2;
  FOREIGN(f.e, "pool", gcap_make_graphed_callables(f.e, 1, cal, 1, nargs, args, &opts, &go));
  gcap_graphed_opts_init(&opts);
  opts.num_capture_time_hooks = 2, opts.capture_time_hooks = (const gcap_capture_hooks *)&opts;
  BAD(f.e, GCAP_EINVAL, "capture_time_hooks",
      gcap_make_graphed_callables(f.e, 1, cal, 1, nargs, args, &opts, &go));
  gcap_graphed_opts_init(&opts);
  opts.order = (const double *)&opts, opts.order_len = -1;
  BAD(f.e, GCAP_EINVAL, "order",
      gcap_make_graphed_callables(f.e, 1, cal, 1, nargs, args, &opts, &go));
  gcap_graphed_opts_init(&opts);
  opts.num_layers_per_chunk = nargs, opts.num_chunks = 1;
  BAD(f.e, GCAP_EINVAL, "num_layers_per_chunk",
      gcap_make_graphed_callables(f.e, 1, cal, 1, nargs, args, &opts, &go));
  NOENG(GCAP_EINVAL, gcap_make_graphed_callables(NULL, 1, cal, 1, nargs, args, NULL, &go));
  T_CHECK(go == NULL);
  T_CHECK(gcap_graphed_retain(NULL) == NULL && gcap_graphed_num_entries(NULL) == 0);
  gcap_graphed_free(NULL);
  if (gcap_make_graphed_callables(f.e, 1, cal, 1, nargs, args, NULL, &G) == GCAP_OK)
    graphed_entries(&f, G);
  else
    T_FAILF("make_graphed_callables", "%s", gcap_errmsg(f.e));
  gcap_graphed_free(G);
  gcap_pool_free(p2);
  gcap_module_free(lin), gcap_module_free(lin2);
  fx_close(&f);
}

/* ------------------------------------------------------------------------ */
/* The distributed layer, at world size 1: last, as MPI starts once         */

static void test_dist(void) {
  const int r0[1] = {0}, far[1] = {3};
  unsigned char flags[2] = {0, 1};
  gcap_dist_group *g = (gcap_dist_group *)(uintptr_t)0x10;
  gcap_tensor *v = NULL;
  const int64_t s6[1] = {6};
  fx f;
  T_SETUP(fx_open(&f), fx_close(&f));
  NOENG(GCAP_EINVAL, gcap_dist_init(NULL));
  NOENG(GCAP_EINVAL, gcap_dist_set_debug(NULL, 1));
  NOENG(GCAP_EINVAL, gcap_dist_new_group(NULL, 1, r0, &g));
  NOENG(GCAP_EINVAL, gcap_dist_barrier(NULL, NULL));
  NOENG(GCAP_EINVAL, gcap_dist_any(NULL, 1, flags, NULL));
  NOENG(GCAP_EINVAL, gcap_dist_all_reduce(NULL, GCAP_REDUCE_SUM, NULL));
  NOENG(GCAP_EINVAL, gcap_dist_all_gather(NULL, NULL, NULL));
  NOENG(GCAP_EINVAL, gcap_dist_reduce_scatter(NULL, NULL, GCAP_REDUCE_SUM, NULL));
  NOENG(GCAP_EINVAL, gcap_dist_broadcast(NULL, 0, NULL));
  NOENG(GCAP_EINVAL, gcap_dist_send(NULL, 0, NULL));
  NOENG(GCAP_EINVAL, gcap_dist_recv(NULL, 0, NULL));
  T_CHECK(g == NULL);
  T_CHECK(gcap_dist_group_rank(NULL) == -1 && gcap_dist_group_size(NULL) == 0);
  T_CHECK(gcap_dist_group_ranks(NULL) == NULL && gcap_dist_world() == NULL);
  T_CHECK(!gcap_dist_is_initialized() && gcap_dist_rank() == -1);
  T_CHECK(gcap_dist_world_size() == -1 && gcap_dist_local_rank() == -1);
  BAD(f.e, GCAP_EINVAL, "out", gcap_dist_all_gather(NULL, f.x, NULL)); /* before init too */
  BAD(f.e, GCAP_EINVAL, "t", gcap_dist_reduce_scatter(f.x, NULL, GCAP_REDUCE_SUM, NULL));
  if (!gcap_dist_available()) {
    T_CHECK(gcap_dist_init(f.e) == GCAP_EUNSUPPORTED);
    printf("# no MPI in this build: the collectives' own checks are not reached\n");
    fx_close(&f);
    return;
  }
  T_SETUP(gcap_dist_init(f.e) == GCAP_OK &&
              gcap_tensor_full(f.e, GCAP_F32, 1, s6, 1.0, &v) == GCAP_OK,
          (gcap_dist_finalize(), fx_close(&f)));
  BAD(f.e, GCAP_EINVAL, "out", gcap_dist_new_group(f.e, 1, r0, NULL));
  BAD(f.e, GCAP_EINVAL, "n", gcap_dist_new_group(f.e, 0, r0, &g));
  BAD(f.e, GCAP_EINVAL, "ranks", gcap_dist_new_group(f.e, 1, NULL, &g));
  BAD(f.e, GCAP_EINVAL, "ranks[1]", gcap_dist_new_group(f.e, 1, far, &g));
  BAD(f.e, GCAP_EINVAL, "reduction", gcap_dist_all_reduce(f.x, (gcap_reduce_op)7, NULL));
  BAD(f.e, GCAP_EINVAL, "reduction", gcap_dist_reduce_scatter(v, v, (gcap_reduce_op)-1, NULL));
  BAD(f.e, GCAP_EINVAL, "out", gcap_dist_all_gather(f.y, v, NULL)); /* out of another engine */
  BAD(f.e2, GCAP_EINVAL, "engine", gcap_dist_all_reduce(f.y, GCAP_REDUCE_SUM, NULL));
  BAD(f.e, GCAP_EINVAL, "n", gcap_dist_any(f.e, -1, flags, NULL));
  BAD(f.e, GCAP_EINVAL, "flags", gcap_dist_any(f.e, 2, NULL, NULL));
  T_CHECK_OK(f.e, gcap_dist_any(f.e, 2, flags, NULL));
  T_CHECK(flags[0] == 0 && flags[1] == 1);
  BAD(f.e, GCAP_EINVAL, "root", gcap_dist_broadcast(v, 5, NULL));
  BAD(f.e, GCAP_EINVAL, "peer", gcap_dist_send(v, -1, NULL));
  BAD(f.e, GCAP_EINVAL, "peer", gcap_dist_recv(v, 1, NULL));
  T_CHECK(g == NULL);
  T_CHECK(gcap_dist_group_size(NULL) == 1 && gcap_dist_group_rank(NULL) == 0);
  T_CHECK(gcap_dist_is_initialized() && gcap_dist_rank() == 0);
  T_CHECK(gcap_dist_world_size() == 1 && gcap_dist_local_rank() == 0);
  T_CHECK_OK(f.e, gcap_dist_finalize());
  gcap_tensor_free(v);
  fx_close(&f);
}

int main(void) {
  T_RUN(test_kinds_and_defaults);
  T_RUN(test_modules);
  T_RUN(test_module_getters);
  T_RUN(test_builtin_modules);
  T_RUN(test_make_graphed);
  T_RUN(test_dist);
  return t_done();
}
