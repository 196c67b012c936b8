/*
** train.h: the training layer's shared declarations: modules (nn.c) as
** make_graphed_callables (graphed.c) uses them.
*/
#ifndef GC_TRAIN_H
#define GC_TRAIN_H

#include "tensor/tensor.h"

/* ------------------------------------------------------------------------ */
/* Modules (nn.c) for make_graphed_callables (graphed.c)                     */

/* Run m's forward itself: no hooks, no graphed replay. */
gcap_status gc_module_forward(gcap_module *m, int nin, gcap_tensor *const *in, gcap_tensor **out);
/* GCAP_OK when neither m nor a submodule has module hooks or a buffer that
** requires grad; otherwise an error naming the module and the problem. */
gcap_status gc_module_check_graphable(gcap_module *m, const char *where);
/* Put the delayed-wgrad queues of m's Linears aside (aside = 1) for the
** length of a make_graphed_callables, or drop what the call left in them and
** bring the user's back (0). */
void gc_module_wgrad_aside(gcap_module *m, int aside);
/* Route m's calls to entry `entry` of g (g NULL: back to m's forward). */
void gc_module_set_graphed(gcap_module *m, gcap_graphed *g, int entry);
/* Back to m's own forward, if m is still routed to entry `entry` of g (a
** later make_graphed_callables may have routed it elsewhere). */
void gc_module_unroute(gcap_module *m, const gcap_graphed *g, int entry);

/* Of the Linear module `mod` a linear node's ud points to: does it delay
** wgrad, and its main_grad when it fuses wgrad accumulation (else NULL). */
int gc_linear_delays_wgrad(void *mod);
gcap_tensor *gc_linear_main_grad(void *mod);
/* Queue (g, x) for a later backward_dw of the delayed-wgrad Linear `mod`,
** with its bias grad when already computed (gb; NULL: backward_dw does it). */
gcap_status gc_wgrad_defer(void *mod, gcap_tensor *g, gcap_tensor *x, gcap_tensor *gb);

#endif
