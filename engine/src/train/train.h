/*
** train.h: the training layer's shared declarations: modules (module.c,
** module_hooks.c, builtin.c) as make_graphed_callables (graphed/) uses them.
*/
#ifndef GC_TRAIN_H
#define GC_TRAIN_H

#include "tensor/tensor.h"

/* ------------------------------------------------------------------------ */
/* Modules for make_graphed_callables (graphed/)                            */

/* Run m's forward itself: no hooks, no graphed replay. Sets *nout and
** out[0..*nout-1] (new references, NULL for an absent output; room for
** GCAP_MAX_OUTPUTS); a one-output forward that gave none is an error. */
gcap_status gc_module_forward(gcap_module *m, int nin, gcap_tensor *const *in, int *nout,
                              gcap_tensor **out);
/* GCAP_OK when neither m nor a submodule has module hooks or a buffer that
** requires grad; otherwise an error naming the module and the problem. */
gcap_status gc_module_check_graphable(gcap_module *m, const char *where);
/* Put the delayed-wgrad queues of m's Linears aside (aside = 1) for the
** length of a make_graphed_callables, or drop what the call left in them and
** bring the user's back (0). */
void gc_module_wgrad_aside(gcap_module *m, int aside);
/* The delayed wgrads queued in m and below, waiting for backward_dw. */
int gc_module_pending_wgrads(const gcap_module *m);
/* Where a routed module's calls go instead of its forward: graphing sets
** it (a graphed replay of entry `entry` of the graphed object ud, with the
** call's replay options or NULL), so that modules know a function and its
** state, not graphing. */
typedef gcap_status (*gc_route_fn)(void *ud, int entry, const gcap_replay_opts *opts, int nin,
                                   gcap_tensor *const *in, int *nout, gcap_tensor **out);
/* Route m's calls in training mode (training = 1) or in eval mode (0) to
** fn(ud, entry, ...) (fn NULL: back to m's forward); the other mode's route
** stays, so that a module graphed in both modes replays the graph of its
** mode at each call, as TransformerEngine's wrapper of a wrapper does. */
void gc_module_set_route(gcap_module *m, int training, gc_route_fn fn, void *ud, int entry);
/* Back to m's own forward in the mode m is routed to entry `entry` of ud,
** if it still is (a later make_graphed_callables may have routed it
** elsewhere). */
void gc_module_unroute(gcap_module *m, const void *ud, int entry);
/* 1 when a call of m would run its own forward and nothing else: m has no
** hooks and no graphed route. Its parent may then compute m's result
** itself, from inputs in a layout m's arguments cannot carry. */
int gc_module_plain(const gcap_module *m);

/* The engine m belongs to. */
gcap_engine *gc_module_engine(const gcap_module *m);
/* The start of the constructor of a module of type `type` handing it back
** through m: *m = NULL, e's message cleared; e NULL is GCAP_EINVAL with no
** message, m NULL an error naming it. */
gcap_status gc_module_start(gcap_engine *e, const char *type, gcap_module **m);
/* The end of a constructor that made *m: when st is an error, the module
** made so far is freed and *m set to NULL. Returns st. */
gcap_status gc_module_keep_or_free(gcap_module **m, gcap_status st);

/* ------------------------------------------------------------------------ */
/* FP8 (fp8.c, fp8_linear.c)                                                 */

/* m runs n FP8 GEMMs of its own (its constructor says so), whose state is
** *gc_module_fp8_slot(m) (NULL until its first FP8 call; the module holds
** that reference). */
void gc_module_set_fp8_gemms(gcap_module *m, int n);
gc_fp8_meta **gc_module_fp8_slot(gcap_module *m);
/* Where an attention module notes how its last call ran
** (gcap_module_attention_stats). */
gcap_attn_stats *gc_module_attn_slot(gcap_module *m);
/* The is_first_microbatch the next graphed call of m was given (1 true, 0
** false, -1 none), cleared. */
int gc_module_take_first_microbatch(gcap_module *m);
/* m's FP8 state for a call under autocast with recipe r: made (outside any
** capture) at the first such call, made anew when r's amax_history_len
** differs from the state's. */
gcap_status gc_fp8_module_meta(gcap_module *m, const gcap_fp8_recipe *r, gc_fp8_meta **out);
/* A check of recipe r, naming `where` and the field. */
gcap_status gc_fp8_recipe_check(gcap_engine *e, const char *where, const gcap_fp8_recipe *r);
/* linear(x, w, b) (gelu: gelu(linear(...)), one GEMM) as GEMM `gemm` of
** module m: under an enabled FP8 autocast in FP8 with m's state, otherwise
** gc_linear or gc_linear_gelu; its node sends its parameter grads to sink
** (NULL: .grad) as a Linear's does. */
gcap_status gc_fp8_linear(gcap_module *m, int gemm, gcap_tensor *x, gcap_tensor *w, gcap_tensor *b,
                          int gelu, gc_wgrad_sink *sink, gcap_tensor **out);
/* An FP8 linear's weight grad [out x in] from its FP8 GEMM's operands, the
** quantized grad and input transposed (gt, xt), summing rows: added into
** main_grad when not NULL (which must be of the grads' dtype dt), else
** into a new *gw. The immediate backward and backward_dw share it. */
gcap_status gc_fp8_wgrad(const gc_fp8 *gt, const gc_fp8 *xt, int64_t out, int64_t in, int64_t rows,
                         gcap_dtype dt, gcap_tensor *main_grad, gcap_tensor **gw);

/* A new f32 tensor of U(-bound, bound) from the engine's generator, made
** with recording off (a parameter's initial value). */
gcap_status gc_uniform(gcap_engine *e, int ndim, const int64_t *shape, double bound,
                       gcap_tensor **out);

#endif
