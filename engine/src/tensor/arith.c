/*
** arith.c: division and powers with their backward, and the comparisons,
** whose results are masks of 0 and 1 (f32, no grad). Operands broadcast as
** add's do (ops.c): equal shapes, a one-element operand, or a row matching
** the other's last dimension.
*/
#include <string.h>

#include "tensor.h"

/* The start of binary op `op` on a and b. */
static gcap_status binary_start(const char *op, gcap_tensor *a, gcap_tensor *b, gcap_tensor **out) {
  gcap_status st;
  if ((st = gc_op_start_out(op, a, "a", b, out)) != GCAP_OK) return st;
  return gc_operand(a->e, op, "b", b);
}

/* The node of out = a OP b when autograd needs one, saving a (where
** save_a) and b, as the backward reads them. On failure out is freed. */
static gcap_status record2(gcap_tensor *a, gcap_tensor *b, int save_a, const char *op,
                           gc_backward_fn bw, gcap_tensor **out) {
  gcap_tensor *in[2], *save[2];
  in[0] = a;
  in[1] = b;
  if (!gc_grad_needed(a->e, in, 2)) return GCAP_OK;
  save[0] = save_a ? a : NULL;
  save[1] = b;
  return gc_keep_or_free(out, gc_record(*out, op, bw, in, 2, save, 2, NULL));
}

/* ------------------------------------------------------------------------ */
/* Division                                                                  */

/* As PyTorch's div backward: da = g / b, db = -g ((a / b) / b). */
static gcap_status div_backward(gc_node *n, gcap_tensor *g, gcap_tensor **gin) {
  gcap_tensor *a = n->saved[0], *b = n->saved[1], *q = NULL, *r = NULL, *p = NULL, *m = NULL;
  gcap_status st = GCAP_OK;
  if (gc_node_needs(n, 0)) {
    if ((st = gc_binary(g, b, GC_K_DIV, "div backward", &q)) != GCAP_OK) return st;
    st = gc_reduce_to(q, &n->meta[0], &gin[0]);
    gcap_tensor_free(q);
    q = NULL;
    if (st != GCAP_OK) return st;
  }
  if (!gc_node_needs(n, 1)) return GCAP_OK;
  if ((st = gc_binary(a, b, GC_K_DIV, "div backward", &q)) == GCAP_OK &&
      (st = gc_binary(q, b, GC_K_DIV, "div backward", &r)) == GCAP_OK &&
      (st = gc_binary(g, r, GC_K_MUL, "div backward", &p)) == GCAP_OK &&
      (st = gc_unary(p, GC_K_SCALE, -1.0f, "div backward", 0, &m)) == GCAP_OK)
    st = gc_reduce_to(m, &n->meta[1], &gin[1]);
  gcap_tensor_free(q);
  gcap_tensor_free(r);
  gcap_tensor_free(p);
  gcap_tensor_free(m);
  return st;
}

gcap_status gcap_div(gcap_tensor *a, gcap_tensor *b, gcap_tensor **out) {
  gcap_status st;
  if ((st = binary_start("div", a, b, out)) != GCAP_OK ||
      (st = gc_binary(a, b, GC_K_DIV, "div", out)) != GCAP_OK)
    return st;
  return record2(a, b, b->requires_grad, "div", div_backward, out); /* a: for b's grad */
}

/* ------------------------------------------------------------------------ */
/* Powers                                                                    */

/* Both grads of one launch (GC_K_POW_BWD), each where it is needed. */
static gcap_status pow_backward(gc_node *n, gcap_tensor *g, gcap_tensor **gin) {
  gcap_tensor *a = n->saved[0], *b = n->saved[1], *d[2] = {NULL, NULL}, *in[3], *out = NULL;
  gcap_status st = GCAP_OK;
  gc_kargs k;
  int i;
  memset(&k, 0, sizeof k);
  for (i = 0; i < 2 && st == GCAP_OK; i++) {
    if (!gc_node_needs(n, i)) continue;
    if ((st = gc_tensor_alloc(g->e, "pow backward", g->dt, g->ndim, g->shape, &d[i])) != GCAP_OK)
      break;
    k.p[i] = gc_tensor_ptr(d[i]);
    if (out == NULL)
      out = d[i];
    else
      st = gc_note_access(g->e, d[i], 1); /* the second grad the launch writes */
  }
  if (st == GCAP_OK && out != NULL) {
    k.p[2] = gc_tensor_ptr(g);
    k.p[3] = gc_tensor_ptr(a);
    k.p[4] = gc_tensor_ptr(b);
    k.n[0] = g->numel;
    k.n[3] = a->numel;
    k.n[4] = b->numel;
    in[0] = g;
    in[1] = a;
    in[2] = b;
    st = gc_run(g->e, GC_K_POW_BWD, &k, in, 3, out);
  }
  for (i = 0; i < 2 && st == GCAP_OK; i++)
    if (d[i] != NULL) st = gc_reduce_to(d[i], &n->meta[i], &gin[i]);
  gcap_tensor_free(d[0]);
  gcap_tensor_free(d[1]);
  return st;
}

gcap_status gcap_pow(gcap_tensor *a, gcap_tensor *b, gcap_tensor **out) {
  gcap_status st;
  if ((st = binary_start("pow", a, b, out)) != GCAP_OK ||
      (st = gc_binary(a, b, GC_K_POW, "pow", out)) != GCAP_OK)
    return st;
  return record2(a, b, 1, "pow", pow_backward, out);
}

/* ------------------------------------------------------------------------ */
/* Comparisons                                                               */

gcap_status gcap_compare(gcap_tensor *a, gcap_tensor *b, gcap_cmp op, gcap_tensor **out) {
  static const char *const names[] = {"lt", "le", "gt", "ge", "eq", "ne"};
  const char *name = op >= GCAP_LT && op <= GCAP_NE ? names[op] : "compare";
  gcap_status st;
  if ((st = binary_start(name, a, b, out)) != GCAP_OK) return st;
  if (op < GCAP_LT || op > GCAP_NE)
    return gc_fail(a->e, GCAP_EINVAL, "compare: op %d is no comparison (GCAP_LT .. GCAP_NE)",
                   (int)op);
  return gc_binary_as(a, b, GC_K_CMP, name, GCAP_F32, op, out);
}
