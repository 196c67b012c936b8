/*
** embedding.c: rows of a table looked up by id, and the backward that adds
** the grads of each id's rows into the table's grad in a fixed order.
*/
#include <string.h>

#include "tensor.h"

/* saved: the ids; k[0], k[1]: the weight's shape (rows, dim). */
static gcap_status embedding_backward(gc_node *n, gcap_tensor *g, gcap_tensor **gin) {
  gcap_tensor *ids = n->saved[0], *scratch = NULL, *in[2];
  gc_kargs a;
  gcap_status st;
  if ((st = gc_tensor_alloc(g->e, "embedding backward", g->dt, 2, n->k, &gin[0])) != GCAP_OK)
    return st;
  memset(&a, 0, sizeof a);
  if ((st = gc_scratch(g->e, "embedding backward", n->k[0] * n->k[1], &scratch, &a.p[3])) !=
      GCAP_OK)
    return st; /* the caller frees gin[0] */
  a.p[0] = gc_tensor_ptr(gin[0]);
  a.p[1] = gc_tensor_ptr(g);
  a.p[2] = gc_tensor_ptr(ids);
  a.n[0] = ids->numel;
  a.n[1] = n->k[1];
  a.n[2] = n->k[0];
  in[0] = g;
  in[1] = ids;
  st = gc_run(g->e, GC_K_EMBEDDING_BWD, &a, in, 2, gin[0]);
  gcap_tensor_free(scratch);
  return st;
}

gcap_status gcap_embedding(gcap_tensor *ids, gcap_tensor *weight, gcap_tensor **out) {
  int64_t shape[GCAP_MAXDIM];
  gcap_tensor *in[2];
  gc_node *n;
  gc_kargs a;
  gcap_status st;
  if ((st = gc_op_start_out("embedding", ids, "ids", weight, out)) != GCAP_OK ||
      (st = gc_operand(ids->e, "embedding", "weight", weight)) != GCAP_OK)
    return st;
  if (ids->dt != GCAP_F32 || weight->ndim != 2 || ids->ndim > GCAP_MAXDIM - 1) {
    char b1[64], b2[64];
    return gc_fail(ids->e, GCAP_EINVAL,
                   "embedding: expected ids of 0 to 3 dims held as f32 numbers and a weight [rows, "
                   "dim]; got ids %s %s and weight %s",
                   gc_dtype_name(ids->dt), gc_shape_str(ids, b1, sizeof b1),
                   gc_shape_str(weight, b2, sizeof b2));
  }
  if ((st = gc_check_ids(ids, weight->shape[0], "embedding", "the id at", "a row of the weight")) !=
      GCAP_OK)
    return st;
  memcpy(shape, ids->shape, sizeof(int64_t) * (size_t)ids->ndim);
  shape[ids->ndim] = weight->shape[1];
  if ((st = gc_tensor_alloc(ids->e, "embedding", weight->dt, ids->ndim + 1, shape, out)) != GCAP_OK)
    return st;
  memset(&a, 0, sizeof a);
  a.p[0] = gc_tensor_ptr(*out);
  a.p[1] = gc_tensor_ptr(weight);
  a.p[2] = gc_tensor_ptr(ids);
  a.n[0] = ids->numel;
  a.n[1] = weight->shape[1];
  a.n[2] = weight->shape[0];
  a.p[3] = gc_badid_site(ids->e, &a.n[3]); /* in a graph the ids are checked by the kernel */
  in[0] = weight;
  in[1] = ids;
  if ((st = gc_run(ids->e, GC_K_EMBEDDING, &a, in, 2, *out)) != GCAP_OK) goto fail;
  if (!gc_grad_needed(ids->e, &weight, 1)) return GCAP_OK;
  if ((st = gc_record(*out, "embedding", embedding_backward, &weight, 1, &ids, 1, &n)) != GCAP_OK)
    goto fail;
  n->k[0] = weight->shape[0];
  n->k[1] = weight->shape[1];
  return GCAP_OK;
fail:
  return gc_keep_or_free(out, st);
}
