/*
** autograd.c: running backward, and accumulating the grads of leaves.
**
** Ops record their nodes through record.c. gcap_backward counts, for every
** node reachable from the root, how many reachable nodes feed it a grad; it
** then runs a node once all of those have arrived (a dependency count, not
** recursion), sums grads arriving from several consumers, and accumulates
** the grads of leaves into their .grad: a leaf's too are summed first and
** added once, after its last edge ran (PyTorch's AccumulateGrad), so that a
** graphed backward, which hands on a parameter's sum, adds what eager
** backward adds. Backward runs with recording off;
** its allocations follow the usual rule (in the capture's pool when
** capturing).
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor.h"

/* ------------------------------------------------------------------------ */
/* Grads of leaves                                                           */

gcap_status gc_zero_grad(gcap_tensor *t, int set_to_none) {
  if (t->grad == NULL) return GCAP_OK;
  if (!set_to_none) return gcap_zero_(t->grad);
  gcap_tensor_free(t->grad);
  t->grad = NULL;
  return GCAP_OK;
}

/* leaf.grad += g; on first use a copy of g, or g itself (see tensor.h). */
gcap_status gc_acc_grad(gcap_tensor *leaf, gcap_tensor *g, int steal) {
  gcap_engine *e = leaf->e;
  gcap_status st;
  if (g->numel != leaf->numel) {
    char b1[64], b2[64];
    return gc_fail(e, GCAP_EINVAL, "backward: grad of shape %s for a leaf of shape %s",
                   gc_shape_str(g, b1, sizeof b1), gc_shape_str(leaf, b2, sizeof b2));
  }
  if (steal && leaf->grad == NULL && g->refs == 1 && g->blk->refs == 1 && g->dt == leaf->dt &&
      !g->blk->weak) { /* nobody else sees g: it becomes the grad, as PyTorch steals it */
    if ((leaf->grad = gc_tensor_alias(g, leaf->ndim, leaf->shape)) == NULL)
      return gc_fail(e, GCAP_ENOMEM, "backward: out of host memory");
    return GCAP_OK;
  }
  if (leaf->grad == NULL) {
    gcap_tensor *c;
    if ((st = gc_tensor_alloc(e, "backward", leaf->dt, leaf->ndim, leaf->shape, &c)) != GCAP_OK)
      return st;
    if ((st = gcap_copy_(c, g)) != GCAP_OK) {
      gcap_tensor_free(c);
      return st;
    }
    leaf->grad = c;
    return GCAP_OK;
  }
  /* in place, so .grad keeps its address (captured graphs hold it) */
  return gc_binary_inplace(leaf->grad, g, GC_K_ADD, "backward");
}

/* Do the bytes of a and b meet? */
static int acc_overlap(const gcap_tensor *a, const gcap_tensor *b) {
  uintptr_t a0 = (uintptr_t)gc_tensor_ptr(a), b0 = (uintptr_t)gc_tensor_ptr(b);
  return a0 < b0 + (uintptr_t)b->numel * gc_dtype_size(b->dt) &&
         b0 < a0 + (uintptr_t)a->numel * gc_dtype_size(a->dt);
}

/* Might gc_acc_grad steal g once r has let go of its references? (An upper
** bound: r's holds are counted as if they were the only ones.) */
static int acc_may_steal(const gc_acc_run *r, const gcap_tensor *leaf, const gcap_tensor *g) {
  int j, objs = 0, blks = 0;
  for (j = 0; j < r->n; j++) {
    objs += r->src[j] == g;
    blks += r->src[j]->blk == g->blk;
  }
  return g->refs - objs <= 1 && g->blk->refs - blks <= 1 && g->dt == leaf->dt && !g->blk->weak;
}

gcap_status gc_acc_end(gc_acc_run *r) {
  gcap_status st;
  int j;
  if (r->n == 0) return GCAP_OK;
  if (r->n > 1)
    st = gc_foreach_add(r->dst[0]->e, r->n, r->dst, r->src, r->add);
  else if (r->add[0]) /* alone: the very kernels of gc_acc_grad */
    st = gc_binary_inplace(r->dst[0], r->src[0], GC_K_ADD, "backward");
  else { /* gcap_copy_ clears the message: an earlier failure's must stay */
    gcap_engine *e = r->dst[0]->e;
    char why[GC_ERRLEN];
    memcpy(why, e->err, sizeof why);
    if ((st = gcap_copy_(r->dst[0], r->src[0])) == GCAP_OK) memcpy(e->err, why, sizeof why);
  }
  for (j = 0; j < r->n; j++) {
    if (st != GCAP_OK && !r->add[j]) { /* as gc_acc_grad: no .grad without its copy */
      gcap_tensor_free(r->leaf[j]->grad);
      r->leaf[j]->grad = NULL;
    }
    gcap_tensor_free(r->dst[j]);
    gcap_tensor_free(r->src[j]);
  }
  r->n = 0;
  return st;
}

gcap_status gc_acc_grad_run(gc_acc_run *r, gcap_tensor *leaf, gcap_tensor *g, int steal) {
  gcap_tensor *dst = leaf->grad;
  gcap_status st;
  int j, n, add = dst != NULL;
  if (r->n > 0 && r->dst[0]->dt != leaf->dt) { /* one launch, one dtype */
    if ((st = gc_acc_end(r)) != GCAP_OK) return st;
  }
  if (g->numel != leaf->numel || g->numel == 0 || g->dt != leaf->dt ||
      (add && (dst->dt != g->dt || dst->numel != g->numel)) ||
      (!add && steal && acc_may_steal(r, leaf, g))) {
    if ((st = gc_acc_end(r)) != GCAP_OK) return st;
    return gc_acc_grad(leaf, g, steal);
  }
  for (j = 0; j < r->n; j++) /* the run's pairs must not see each other's writes */
    if (acc_overlap(g, r->dst[j]) ||
        (add && (acc_overlap(dst, r->dst[j]) || acc_overlap(dst, r->src[j])))) {
      if ((st = gc_acc_end(r)) != GCAP_OK) return st;
      break;
    }
  if (!add) { /* the first grad: a copy into a new .grad */
    if ((st = gc_tensor_alloc(leaf->e, "backward", leaf->dt, leaf->ndim, leaf->shape, &dst)) !=
        GCAP_OK) {
      gcap_status st2 = gc_acc_end(r);
      return st2 != GCAP_OK ? st2 : st;
    }
    leaf->grad = dst;
  }
  n = r->n++;
  r->leaf[n] = leaf;
  r->dst[n] = gcap_tensor_retain(dst);
  r->src[n] = gcap_tensor_retain(g);
  r->add[n] = add;
  return r->n == GC_FOREACH_MAX ? gc_acc_end(r) : GCAP_OK;
}

/* ------------------------------------------------------------------------ */
/* Backward                                                                  */

typedef struct bw_stack {
  gc_node **v;
  int n, cap;
} bw_stack;

static int stack_push(bw_stack *s, gc_node *n) {
  if (!gc_growvector(s->v, s->cap, s->n + 1, 64)) return 0;
  s->v[s->n++] = n;
  return 1;
}

/* Mark every node reachable from root and count its incoming edges. */
static gcap_status bw_collect(gcap_engine *e, gc_node *root, uint64_t mark, bw_stack *all) {
  bw_stack todo = {NULL, 0, 0};
  gcap_status st = GCAP_OK;
  root->mark = mark;
  root->deps = 0;
  if (!stack_push(&todo, root) || !stack_push(all, root))
    st = gc_fail(e, GCAP_ENOMEM, "backward: out of host memory");
  while (st == GCAP_OK && todo.n > 0) {
    gc_node *n = todo.v[--todo.n];
    int i;
    if (n->released)
      st = gc_fail(e, GCAP_ESTATE,
                   "backward: trying to backward through the graph a second time ('%s' has freed "
                   "its saved tensors); pass retain_graph = true to the first backward",
                   n->name);
    for (i = 0; st == GCAP_OK && i < n->nin; i++) {
      gc_node *m = n->next[i];
      if (m == NULL) continue;
      if (m->mark != mark) {
        m->mark = mark;
        m->deps = 0;
        if (!stack_push(&todo, m) || !stack_push(all, m))
          st = gc_fail(e, GCAP_ENOMEM, "backward: out of host memory");
      }
      m->deps++;
    }
  }
  free(todo.v);
  return st;
}

/* Sum g into n's pending grad (out of place: g may be shared). */
static gcap_status bw_accumulate(gc_node *n, gcap_tensor *g) {
  gcap_tensor *s;
  gcap_status st;
  if (n->acc == NULL) {
    n->acc = gcap_tensor_retain(g);
    return GCAP_OK;
  }
  if ((st = gc_binary(n->acc, g, GC_K_ADD, "backward", &s)) != GCAP_OK) return st;
  gcap_tensor_free(n->acc);
  n->acc = s;
  return GCAP_OK;
}

static gcap_status bw_check_grad(gc_node *n, gcap_tensor *g) {
  int i, same = g->ndim == n->ndim || g->numel == 1;
  for (i = 0; same && g->ndim == n->ndim && i < n->ndim; i++)
    same = g->shape[i] == n->shape[i];
  if (!same) {
    char b[64];
    return gc_fail(g->e, GCAP_EINVAL,
                   "backward: '%s' expected a grad of its output's shape, got %s", n->name,
                   gc_shape_str(g, b, sizeof b));
  }
  return GCAP_OK;
}

/* PyTorch's check: a tensor n saved must not have been written since (an
** in-place op, an optimizer step, a copy_ into it): its backward would
** compute a wrong grad from the new values. */
static gcap_status bw_check_saved(gc_node *n) {
  int i;
  for (i = 0; i < n->nsaved; i++) {
    const gcap_tensor *t = n->saved[i];
    char what[GC_NAMELEN + 48];
    if (t == NULL || t->blk->version == n->saved_version[i]) continue;
    snprintf(what, sizeof what, "tensor saved by '%s' (#%d)", n->name, i + 1);
    return gc_fail_written(t, "backward", what, t->blk->version, n->saved_version[i]);
  }
  return GCAP_OK;
}

gcap_status gc_fail_written(const gcap_tensor *t, const char *where, const char *what, uint64_t now,
                            uint64_t want) {
  char b[64];
  return gc_fail(t->e, GCAP_ESTATE,
                 "%s: one of the variables needed for gradient computation has been modified by "
                 "an inplace operation: the %s %s %s is at version %llu; expected version %llu "
                 "instead",
                 where, gc_shape_str(t, b, sizeof b), gc_dtype_name(t->dt), what,
                 (unsigned long long)now, (unsigned long long)want);
}

/* A leaf of the pass, as PyTorch's AccumulateGrad node: its grads are
** summed as they arrive, and the sum goes into .grad once the last of its
** edges has run, so one .grad addition per pass whatever the edges. */
typedef struct bw_leaf {
  gcap_tensor *t;
  int left;         /* its edges from nodes that have not run yet */
  gcap_tensor *acc; /* the sum of the grads that arrived */
  int fresh;        /* no .grad at the start: a failed pass takes back the one it made */
} bw_leaf;

typedef struct bw_leaves {
  bw_leaf *v; /* sorted by address */
  int n;
} bw_leaves;

static int leaf_cmp(const void *a, const void *b) {
  uintptr_t x = (uintptr_t)((const bw_leaf *)a)->t, y = (uintptr_t)((const bw_leaf *)b)->t;
  return x < y ? -1 : x > y;
}

/* The leaves of the pass's nodes with their edge counts, into L (L->v is
** `few` when they fit in BW_SMALL entries). */
#define BW_SMALL 16
static gcap_status bw_leaves_of(gcap_engine *e, const bw_stack *all, bw_leaf *few, bw_leaves *L) {
  int i, k, c = 0;
  for (i = 0; i < all->n; i++)
    for (k = 0; k < all->v[i]->nin; k++)
      c += all->v[i]->leaf[k] != NULL;
  L->v = few;
  L->n = 0;
  if (c > BW_SMALL && (L->v = (bw_leaf *)gc_malloc((size_t)c * sizeof *L->v)) == NULL)
    return gc_fail(e, GCAP_ENOMEM, "backward: out of host memory");
  for (i = 0; i < all->n; i++)
    for (k = 0; k < all->v[i]->nin; k++)
      if (all->v[i]->leaf[k] != NULL) {
        bw_leaf *l = &L->v[L->n++];
        l->t = all->v[i]->leaf[k];
        l->left = 1;
        l->acc = NULL;
        l->fresh = l->t->grad == NULL;
      }
  qsort(L->v, (size_t)L->n, sizeof *L->v, leaf_cmp);
  for (i = k = 0; i < L->n; i++) /* one entry per leaf, counting its edges */
    if (k > 0 && L->v[k - 1].t == L->v[i].t)
      L->v[k - 1].left++;
    else
      L->v[k++] = L->v[i];
  L->n = k;
  return GCAP_OK;
}

static bw_leaf *bw_leaf_find(const bw_leaves *L, gcap_tensor *t) {
  bw_leaf key = {NULL, 0, NULL, 0};
  key.t = t;
  return (bw_leaf *)bsearch(&key, L->v, (size_t)L->n, sizeof *L->v, leaf_cmp);
}

/* Hand the grads gin[] that node n computed to its inputs (taking their
** references; st: how n's backward went, nothing handed on after a failure):
** a producer's pending grad, or a leaf's sum, which goes into its .grad
** (through run) when n was its last edge; a producer all of whose consumers
** ran is ready. */
static gcap_status bw_deliver(gcap_engine *e, gcap_status st, gc_node *n, gcap_tensor **gin,
                              gc_acc_run *run, bw_stack *ready, const bw_leaves *L) {
  int i;
  for (i = 0; i < n->nin; i++) {
    bw_leaf *l = n->leaf[i] ? bw_leaf_find(L, n->leaf[i]) : NULL;
    if (st == GCAP_OK && gin[i] != NULL) {
      if (l && l->acc == NULL) { /* the first: kept as it is */
        l->acc = gin[i];
        gin[i] = NULL;
      } else if ((st = gc_acc_end(run)) == GCAP_OK) {
        if (l) {
          gcap_tensor *s;
          if ((st = gc_binary(l->acc, gin[i], GC_K_ADD, "backward", &s)) == GCAP_OK) {
            gcap_tensor_free(l->acc);
            l->acc = s;
          }
        } else if (n->next[i])
          st = bw_accumulate(n->next[i], gin[i]);
      }
    }
    if (st == GCAP_OK && l && --l->left == 0 && l->acc != NULL) {
      st = gc_acc_grad_run(run, l->t, l->acc, 1);
      gcap_tensor_free(l->acc);
      l->acc = NULL;
    }
    if (st == GCAP_OK && n->next[i] && --n->next[i]->deps == 0 && !stack_push(ready, n->next[i]))
      st = gc_fail(e, GCAP_ENOMEM, "backward: out of host memory");
    gcap_tensor_free(gin[i]);
    gin[i] = NULL;
  }
  return st;
}

gcap_status gc_backward_undo(gcap_engine *e, void (*fn)(void *ud, int undo), void *ud) {
  if (e->bw_depth == 0) {
    fn(ud, 0);
    return GCAP_OK;
  }
  if (!gc_growvector(e->undo, e->capundo, e->nundo + 1, 8))
    return gc_fail(e, GCAP_ENOMEM, "backward: out of host memory");
  e->undo[e->nundo].fn = fn;
  e->undo[e->nundo++].ud = ud;
  return GCAP_OK;
}

/* The end of a backward whose undo notes start at `from`: failed, they are
** taken back, newest first, and the message stays the failure's (an undo
** whose copy fails, after a sticky device error, must not replace it);
** succeeded, the outermost backward keeps them (an inner one leaves them to
** it, which may still fail). */
static void bw_settle(gcap_engine *e, int from, gcap_status st) {
  char why[GC_ERRLEN];
  if (st == GCAP_OK && e->bw_depth > 0) return;
  if (st != GCAP_OK) memcpy(why, e->err, sizeof why);
  while (e->nundo > from) {
    gc_undo *u = &e->undo[--e->nundo];
    u->fn(u->ud, st != GCAP_OK);
  }
  if (st != GCAP_OK) memcpy(e->err, why, sizeof why);
}

static gcap_status bw_run(gcap_engine *e, gc_node *root, gcap_tensor *grad, int retain) {
  bw_stack all = {NULL, 0, 0}, ready = {NULL, 0, 0};
  gc_acc_run run; /* leaf grads, accumulated in as few launches as may be */
  bw_leaf few[BW_SMALL];
  bw_leaves leaves = {few, 0};
  uint64_t mark = ++e->bw_mark;
  gcap_status st, st2;
  int i, undo_from = e->nundo;
  run.n = 0;
  e->bw_depth++;
  if ((st = bw_collect(e, root, mark, &all)) != GCAP_OK ||
      (st = bw_leaves_of(e, &all, few, &leaves)) != GCAP_OK)
    goto done;
  root->acc = gcap_tensor_retain(grad);
  if (!stack_push(&ready, root)) {
    st = gc_fail(e, GCAP_ENOMEM, "backward: out of host memory");
    goto done;
  }
  while (ready.n > 0) {
    gc_node *n = ready.v[--ready.n];
    gcap_tensor *g = n->acc, *small[8], **gin = small;
    n->acc = NULL;
    if (n->nin > 8 && (gin = (gcap_tensor **)gc_malloc((size_t)n->nin * sizeof *gin)) == NULL) {
      gcap_tensor_free(g);
      st = gc_fail(e, GCAP_ENOMEM, "backward: out of host memory");
      goto done;
    }
    memset(gin, 0, (size_t)n->nin * sizeof *gin);
    /* no grad reached n (its consumers gave none to this input, as a graphed
    ** callable does for an input that needed none at capture): like
    ** PyTorch's undefined grad, n runs not and passes none on */
    if (g != NULL && (st = bw_check_grad(n, g)) == GCAP_OK && (st = bw_check_saved(n)) == GCAP_OK) {
      gc_oplabel was = e->op; /* the host's dumps name its kernels after n */
      e->op.name = n->name;
      e->op.backward = 1;
      e->op.where = n->where;
      e->op.type = NULL;
      st = n->backward(n, g, gin);
      e->op = was;
    }
    gcap_tensor_free(g);
    st = bw_deliver(e, st, n, gin, &run, &ready, &leaves);
    if ((st2 = gc_acc_end(&run)) != GCAP_OK && st == GCAP_OK) st = st2;
    if (gin != small) free(gin);
    if (st != GCAP_OK) goto done;
    /* as PyTorch, only a node that saved something cannot run again */
    if (!retain && (gc_node_free_saved(n) > 0 || n->holds_state)) n->released = 1;
  }
done:
  for (i = 0; i < all.n; i++) { /* drop grads left pending by an error */
    gcap_tensor_free(all.v[i]->acc);
    all.v[i]->acc = NULL;
  }
  for (i = 0; i < leaves.n; i++) { /* and the .grad it made */
    gcap_tensor_free(leaves.v[i].acc);
    if (st != GCAP_OK && leaves.v[i].fresh) {
      gcap_tensor_free(leaves.v[i].t->grad);
      leaves.v[i].t->grad = NULL;
    }
  }
  if (leaves.v != few) free(leaves.v);
  free(all.v);
  free(ready.v);
  e->bw_depth--;
  bw_settle(e, undo_from, st);
  return st;
}

gcap_status gcap_backward(gcap_tensor *t, gcap_tensor *grad, int retain_graph) {
  gcap_engine *e;
  gcap_tensor *ones = NULL;
  gcap_status st;
  int was;
  if ((st = gc_op_start("backward", t, "t", grad)) != GCAP_OK) return st;
  e = t->e;
  if (grad != NULL && grad->e != e) return gc_foreign(e, "backward", "the grad");
  if (!t->requires_grad)
    return gc_fail(e, GCAP_EINVAL, "backward: the tensor does not require grad and has no grad_fn");
  if (grad == NULL) {
    char b[64];
    if (t->numel != 1)
      return gc_fail(e, GCAP_EINVAL,
                     "backward: grad can be implicitly created only for one-element outputs "
                     "(got shape %s); pass a grad",
                     gc_shape_str(t, b, sizeof b));
    if ((st = gcap_tensor_full(e, t->dt, t->ndim, t->shape, 1.0, &ones)) != GCAP_OK) return st;
    grad = ones;
  } else {
    int i, same = grad->ndim == t->ndim && grad->dt == t->dt;
    for (i = 0; same && i < t->ndim; i++)
      same = grad->shape[i] == t->shape[i];
    if (!same) {
      char b1[64], b2[64];
      return gc_fail(e, GCAP_EINVAL, "backward: grad %s %s does not match the output %s %s",
                     gc_shape_str(grad, b1, sizeof b1), gc_dtype_name(grad->dt),
                     gc_shape_str(t, b2, sizeof b2), gc_dtype_name(t->dt));
    }
  }
  was = gcap_set_grad_enabled(e, 0);
  st = t->grad_fn ? bw_run(e, t->grad_fn, grad, retain_graph) : gc_acc_grad(t, grad, 0);
  gcap_set_grad_enabled(e, was);
  gcap_tensor_free(ones);
  return st;
}

/* The root of a backward from several tensors: its inputs are the tensors,
** and it hands each its grad (ud: the grads). */
static gcap_status roots_backward(gc_node *n, gcap_tensor *g, gcap_tensor **gin) {
  gcap_tensor *const *grads = (gcap_tensor *const *)n->ud;
  int i;
  (void)g;
  for (i = 0; i < n->nin; i++)
    if (gc_node_needs(n, i)) gin[i] = gcap_tensor_retain(grads[i]);
  return GCAP_OK;
}

gcap_status gc_backward_many(int n, gcap_tensor *const *t, gcap_tensor *const *grad, int retain) {
  gcap_engine *e = t[0]->e;
  gcap_tensor *root;
  gcap_status st;
  int was, i;
  if (n == 1) return gcap_backward(t[0], grad[0], retain);
  gc_clear(e);
  for (i = 0; i < n; i++)
    if (!gc_same_layout(t[i], grad[i])) {
      char b1[64], b2[64];
      return gc_fail(e, GCAP_EINVAL, "backward: grad %s %s does not match output #%d %s %s",
                     gc_shape_str(grad[i], b1, sizeof b1), gc_dtype_name(grad[i]->dt), i + 1,
                     gc_shape_str(t[i], b2, sizeof b2), gc_dtype_name(t[i]->dt));
    }
  /* a stand-in tensor (t[0]'s shape) whose node is the root */
  if ((root = gc_tensor_alias(t[0], t[0]->ndim, t[0]->shape)) == NULL)
    return gc_fail(e, GCAP_ENOMEM, "backward: out of host memory");
  if ((st = gc_record(root, "backward roots", roots_backward, t, n, NULL, 0, NULL)) == GCAP_OK) {
    root->grad_fn->ud = (void *)grad;
    was = gcap_set_grad_enabled(e, 0);
    st = bw_run(e, root->grad_fn, grad[0], retain);
    gcap_set_grad_enabled(e, was);
  }
  gcap_tensor_free(root);
  return st;
}

int gc_node_first_delivery(const gc_node *n) {
  return n->acc == NULL;
}
