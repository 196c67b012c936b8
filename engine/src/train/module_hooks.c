/*
** module_hooks.c: module hooks and the call path. Hooks are registered per
** kind and run in registration order around a call; backward hooks ride on
** the autograd graph: calling a module with backward hooks puts its inputs
** and tensor outputs that require grad behind identity nodes whose backward
** runs them (see hook_call). A hook may replace what it is given
** (gcap_hook_return): the inputs, the outputs, grad_out or grad_in. A call
** runs the module's forward, or its route (a graphed replay).
*/
#include <stdlib.h>
#include <string.h>

#include "module.h"

/* ------------------------------------------------------------------------ */
/* Registration                                                              */

gcap_status gcap_module_register_hook(gcap_module *m, gcap_hook_kind kind, gcap_module_hook fn,
                                      void *ud, void (*ud_free)(void *), int *id) {
  if (id) *id = 0;
  if (m == NULL) return GCAP_EINVAL;
  gc_clear(m->e);
  if (kind < GCAP_HOOK_FORWARD_PRE || kind > GCAP_HOOK_BACKWARD)
    return gc_fail(m->e, GCAP_EINVAL, "%s: register hook: kind %d is no gcap_hook_kind", m->type,
                   (int)kind);
  if (fn == NULL) return gc_null(m->e, m->type, "fn (the hook)");
  if (!gc_growvector(m->hooks, m->caphooks, m->nhooks + 1, 4))
    return gc_fail(m->e, GCAP_ENOMEM, "%s: out of host memory", m->type);
  m->hooks[m->nhooks].id = m->next_hook_id;
  m->hooks[m->nhooks].kind = kind;
  m->hooks[m->nhooks].fn = fn;
  m->hooks[m->nhooks].ud = ud;
  m->hooks[m->nhooks].ud_free = ud_free;
  m->nhooks++;
  if (id) *id = m->next_hook_id;
  m->next_hook_id++;
  return GCAP_OK;
}

gcap_status gcap_module_remove_hook(gcap_module *m, int id) {
  int i;
  if (m == NULL) return GCAP_EINVAL;
  gc_clear(m->e);
  for (i = 0; i < m->nhooks; i++)
    if (m->hooks[i].id == id) {
      if (m->hooks[i].ud_free) m->hooks[i].ud_free(m->hooks[i].ud);
      memmove(m->hooks + i, m->hooks + i + 1, (size_t)(m->nhooks - i - 1) * sizeof *m->hooks);
      m->nhooks--;
      return GCAP_OK;
    }
  return GCAP_OK; /* removing twice is harmless, as in PyTorch */
}

int gcap_module_num_hooks(const gcap_module *m, gcap_hook_kind kind) {
  int i, c = 0;
  for (i = 0; m && i < m->nhooks; i++)
    c += m->hooks[i].kind == kind;
  return c;
}

/* ------------------------------------------------------------------------ */
/* What a hook returns                                                       */

/* The shape and dtype a grad must have, and whether its tensor takes one. */
typedef struct hook_slot {
  int needs; /* the tensor requires grad */
  int ndim;
  int64_t shape[GCAP_MAXDIM];
  gcap_dtype dt;
} hook_slot;

/* What the running hook returned through gcap_hook_return (references),
** and what its kind may return: for the backward kinds, nwant grads laid
** out as want[] (NULL for the forward kinds). */
struct gcap_hook_ret {
  int set; /* it called gcap_hook_return */
  int n, cap;
  gcap_tensor **t;
  gcap_module *m;
  const hook_slot *want;
  int nwant;
};

/* What the hooks of one kind returned: the last values accepted
** (references; the hook arguments point into t), and the running hook's. */
typedef struct hook_vals {
  int n;
  gcap_tensor **t;
  gcap_hook_ret ret;
} hook_vals;

void gc_outs_free(int n, gcap_tensor **t) {
  int i;
  for (i = 0; i < n; i++)
    gcap_tensor_free(t[i]);
}

/* Drop n references and their array. */
static void refs_free(gcap_tensor **t, int n) {
  gc_outs_free(n, t);
  free(t);
}

static void ret_free(gcap_hook_ret *r) {
  refs_free(r->t, r->n);
  r->t = NULL;
  r->n = r->cap = r->set = 0;
}

static void vals_free(hook_vals *v) {
  refs_free(v->t, v->n);
  v->n = 0;
  v->t = NULL;
  ret_free(&v->ret);
}

/* Is what a hook of a->kind returned (r) what that kind may return? */
static gcap_status check_return(const gcap_hook_args *a, const gcap_hook_ret *r) {
  static const char *const what[GCAP_HOOK_KINDS] = {"input", "output", "grad_output", "grad_input"};
  gcap_module *m = r->m;
  const char *kind = gcap_hook_kind_name(a->kind), *of = what[a->kind];
  const char *whose = a->kind == GCAP_HOOK_BACKWARD ? "input" : "tensor output";
  char b1[64], b2[64];
  int i;
  if (a->kind == GCAP_HOOK_FORWARD && r->n > GCAP_MAX_OUTPUTS)
    return gc_fail(m->e, GCAP_EINVAL, "%s: a %s returned %d outputs; at most %d", m->type, kind,
                   r->n, GCAP_MAX_OUTPUTS);
  if (r->want != NULL && r->n != r->nwant)
    return gc_fail(m->e, GCAP_EINVAL,
                   "%s: a %s must return %d %s%s (one per %s) or nothing, got %d", m->type, kind,
                   r->nwant, of, r->nwant == 1 ? "" : "s", whose, r->n);
  for (i = 0; i < r->n; i++) {
    const gcap_tensor *t = r->t[i];
    const hook_slot *w = r->want != NULL ? &r->want[i] : NULL;
    if (t == NULL) {
      if (a->kind == GCAP_HOOK_FORWARD_PRE)
        return gc_fail(m->e, GCAP_EINVAL, "%s: a %s returned NULL as input #%d; expected a tensor",
                       m->type, kind, i + 1);
      continue; /* an absent output, or no grad */
    }
    if (t->e != m->e)
      return gc_fail(m->e, GCAP_EINVAL, "%s: a %s returned a tensor of another engine as %s #%d",
                     m->type, kind, of, i + 1);
    if (w == NULL) continue;
    if (!w->needs)
      return gc_fail(m->e, GCAP_EINVAL,
                     "%s: a %s returned a tensor as %s #%d, but %s #%d needs no grad: the entry "
                     "must be absent (nil)",
                     m->type, kind, of, i + 1, whose, i + 1);
    if (t->ndim != w->ndim || t->dt != w->dt ||
        memcmp(t->shape, w->shape, (size_t)t->ndim * sizeof *t->shape) != 0)
      return gc_fail(m->e, GCAP_EINVAL,
                     "%s: a %s returned %s #%d of shape %s %s; expected shape %s %s, as the grad "
                     "it replaces",
                     m->type, kind, of, i + 1, gc_shape_str(t, b1, sizeof b1), gc_dtype_name(t->dt),
                     gc_dims_str(w->ndim, w->shape, b2, sizeof b2), gc_dtype_name(w->dt));
  }
  return GCAP_OK;
}

gcap_status gcap_hook_return(const gcap_hook_args *a, int n, gcap_tensor *const *t) {
  gcap_hook_ret *r;
  int i;
  if (a == NULL || (r = a->ret) == NULL) return GCAP_EINVAL; /* no running hook's: no engine */
  gc_clear(r->m->e);
  if (n < 0) return gc_bad_count(r->m->e, "hook_return", "n", n);
  if (n > 0 && t == NULL) return gc_null(r->m->e, "hook_return", "t");
  if (n > r->cap) {
    gcap_tensor **v = (gcap_tensor **)gc_realloc(r->t, (size_t)n * sizeof *v);
    if (v == NULL) return gc_fail(r->m->e, GCAP_ENOMEM, "hook_return: out of host memory");
    r->t = v;
    r->cap = n;
  }
  for (i = 0; i < n; i++) /* first: t may hold what the hook returned before */
    gcap_tensor_retain(t[i]);
  gc_outs_free(r->n, r->t);
  for (i = 0; i < n; i++)
    r->t[i] = t[i];
  r->n = n;
  r->set = 1;
  return check_return(a, r); /* checked again when the hook returns */
}

/* Make what the hook returned (v->ret) the current values of a. */
static void accept_return(gcap_hook_args *a, hook_vals *v) {
  refs_free(v->t, v->n);
  v->n = v->ret.n;
  v->t = v->ret.t;
  v->ret.t = NULL;
  v->ret.n = v->ret.cap = v->ret.set = 0;
  switch (a->kind) {
    case GCAP_HOOK_FORWARD_PRE:
      a->nin = v->n;
      a->in = v->t;
      break;
    case GCAP_HOOK_FORWARD:
      a->nout = v->n;
      a->out = v->t;
      break;
    case GCAP_HOOK_BACKWARD_PRE:
      a->ngrad_out = v->n;
      a->grad_out = v->t;
      break;
    case GCAP_HOOK_BACKWARD:
      a->ngrad_in = v->n;
      a->grad_in = v->t;
      break;
  }
}

/* Run m's hooks of one kind in registration order, those registered before
** the run began (PyTorch walks a snapshot: a hook registered by a hook runs
** from the next call on); a hook may remove hooks, so the list is walked by
** id (a hook removed meanwhile does not run). A hook's returned values, once
** checked (backward kinds: nwant grads laid out as want[]), replace those in
** a for the next hooks and the caller; v keeps them (the caller frees it
** with vals_free, after its last use of a). */
static gcap_status run_hooks(gcap_module *m, gcap_hook_args *a, hook_vals *v, const hook_slot *want,
                             int nwant) {
  gcap_status st = GCAP_OK;
  int last = 0, end = m->next_hook_id; /* hooks registered meanwhile run from the next call on */
  a->ret = &v->ret;
  v->ret.m = m;
  v->ret.want = want;
  v->ret.nwant = nwant;
  for (;;) {
    int i, next = -1;
    for (i = 0; i < m->nhooks; i++)
      if (m->hooks[i].kind == a->kind && m->hooks[i].id > last && m->hooks[i].id < end &&
          (next < 0 || m->hooks[i].id < m->hooks[next].id))
        next = i;
    if (next < 0) break;
    last = m->hooks[next].id;
    v->ret.set = 0;
    if ((st = m->hooks[next].fn(m->hooks[next].ud, m, a)) != GCAP_OK) {
      if (m->e->err[0] == '\0')
        gc_fail(m->e, st, "%s: a %s failed (%s)", m->type, gcap_hook_kind_name(a->kind),
                gcap_status_str(st));
      break;
    }
    if (a->ret->set) { /* the hook called gcap_hook_return */
      if ((st = check_return(a, &v->ret)) != GCAP_OK) break;
      accept_return(a, v);
    }
  }
  ret_free(&v->ret); /* a return refused */
  a->ret = NULL;
  return st;
}

/* ------------------------------------------------------------------------ */
/* Join nodes                                                                */

/*
** Backward hooks, as PyTorch's full ones: the inputs of a call that require
** grad are passed to the forward behind alias nodes, and so are its tensor
** outputs that require grad to the caller. The alias nodes of one side keep
** the grads they receive and lead to one join node, which runs once after
** all of them: the outputs' join runs the backward pre-hooks on the grads
** of all tensor outputs, the inputs' join the backward hooks on the grads of
** all inputs. A call whose inputs need no grad runs its backward hooks in
** the outputs' join, with no grad_input.
*/
typedef struct hook_call {
  int refs;
  gcap_module *m;
  int nin, nout;                 /* inputs, tensor outputs */
  hook_slot *in_slot, *out_slot; /* [nin], [nout] */
  gcap_tensor **gin, **gout;     /* [nin], [nout]: grads received (then as the hooks left them) */
  int inputs_tracked;            /* an input requires grad: the inputs' join runs the hooks */
} hook_call;

static void hook_call_release(void *ud) {
  hook_call *hc = (hook_call *)ud;
  if (--hc->refs > 0) return;
  refs_free(hc->gin, hc->nin);
  refs_free(hc->gout, hc->nout);
  free(hc->in_slot);
  free(hc->out_slot);
  gcap_module_free(hc->m);
  free(hc);
}

/* The n tensors t[] of one side of hc's call (NULL ones are no tensors):
** their slots and room for their grads. */
static int hook_slots(hook_call *hc, int side, int n, gcap_tensor *const *t) {
  hook_slot *s;
  gcap_tensor **g;
  int i, k = 0;
  for (i = 0; i < n; i++)
    k += t[i] != NULL;
  s = (hook_slot *)gc_calloc((size_t)k + 1, sizeof *s);
  g = (gcap_tensor **)gc_calloc((size_t)k + 1, sizeof *g);
  if (s == NULL || g == NULL) {
    free(s);
    free(g);
    return 0;
  }
  for (i = 0, k = 0; i < n; i++) {
    if (t[i] == NULL) continue;
    s[k].needs = t[i]->requires_grad;
    s[k].ndim = t[i]->ndim;
    memcpy(s[k].shape, t[i]->shape, sizeof s[k].shape);
    s[k].dt = t[i]->dt;
    k++;
  }
  if (side) {
    hc->out_slot = s, hc->gout = g, hc->nout = k;
  } else {
    hc->in_slot = s, hc->gin = g, hc->nin = k;
  }
  return 1;
}

/* Backward of the alias of slot n->k[0] of side n->k[1] (0: inputs, 1:
** outputs): keep its grad for the join. The first alias a pass reaches
** clears what an earlier pass left, and hands the join a grad (a 0-dim
** alias of its own: the join reads none), so that the join runs once. */
static gcap_status alias_backward(gc_node *n, gcap_tensor *g, gcap_tensor **gin) {
  hook_call *hc = (hook_call *)n->ud;
  int side = (int)n->k[1], slot = (int)n->k[0];
  gcap_tensor **gs = side ? hc->gout : hc->gin;
  if (gc_node_first_delivery(n->next[0])) {
    int i, ns = side ? hc->nout : hc->nin;
    for (i = 0; i < ns; i++) {
      gcap_tensor_free(gs[i]);
      gs[i] = NULL;
    }
    if ((gin[0] = gc_tensor_alias(g, 0, NULL)) == NULL)
      return gc_fail(g->e, GCAP_ENOMEM, "backward hook: out of host memory");
  }
  gcap_tensor_free(gs[slot]);
  gs[slot] = gcap_tensor_retain(g);
  return GCAP_OK;
}

/* Hand the grads of the slots that need one, gs[], to the join's inputs. */
static void join_pass(const hook_slot *slot, int n, gcap_tensor *const *gs, gcap_tensor **gin) {
  int i, k = 0;
  for (i = 0; i < n; i++)
    if (slot[i].needs) gin[k++] = gcap_tensor_retain(gs[i]);
}

/* Keep the n grads g[] in gs[] (references), unless they are gs[] already. */
static void grads_keep(gcap_tensor **gs, int n, gcap_tensor *const *g) {
  int i;
  if (g == gs) return;
  for (i = 0; i < n; i++) {
    gcap_tensor_retain(g[i]);
    gcap_tensor_free(gs[i]);
    gs[i] = g[i];
  }
}

/* The backward hooks of hc's call on the grads it holds. */
static gcap_status run_backward_hooks(hook_call *hc, gcap_hook_args *a, hook_vals *v) {
  gcap_status st;
  a->kind = GCAP_HOOK_BACKWARD;
  a->ngrad_in = hc->nin;
  a->grad_in = hc->gin;
  a->ngrad_out = hc->nout;
  a->grad_out = hc->gout;
  if ((st = run_hooks(hc->m, a, v, hc->in_slot, hc->nin)) == GCAP_OK)
    grads_keep(hc->gin, hc->nin, a->grad_in);
  return st;
}

static gcap_status out_join_backward(gc_node *n, gcap_tensor *g, gcap_tensor **gin) {
  hook_call *hc = (hook_call *)n->ud;
  hook_vals pre, post;
  gcap_hook_args a;
  gcap_status st;
  (void)g;
  memset(&pre, 0, sizeof pre);
  memset(&post, 0, sizeof post);
  memset(&a, 0, sizeof a);
  a.kind = GCAP_HOOK_BACKWARD_PRE;
  a.ngrad_out = hc->nout;
  a.grad_out = hc->gout;
  if ((st = run_hooks(hc->m, &a, &pre, hc->out_slot, hc->nout)) != GCAP_OK) goto done;
  grads_keep(hc->gout, hc->nout, a.grad_out); /* the backward hooks see these */
  if (!hc->inputs_tracked && (st = run_backward_hooks(hc, &a, &post)) != GCAP_OK) goto done;
  join_pass(hc->out_slot, hc->nout, hc->gout, gin);
done:
  vals_free(&pre);
  vals_free(&post);
  return st;
}

static gcap_status in_join_backward(gc_node *n, gcap_tensor *g, gcap_tensor **gin) {
  hook_call *hc = (hook_call *)n->ud;
  hook_vals v;
  gcap_hook_args a;
  gcap_status st;
  (void)g;
  memset(&v, 0, sizeof v);
  memset(&a, 0, sizeof a);
  if ((st = run_backward_hooks(hc, &a, &v)) == GCAP_OK)
    join_pass(hc->in_slot, hc->nin, hc->gin, gin);
  vals_free(&v);
  return st;
}

/* Record a node bw with ud hc on t. */
static gcap_status hook_record(gcap_tensor *t, const char *name, gc_backward_fn bw,
                               gcap_tensor *const *in, int nin, hook_call *hc, gc_node **n) {
  gcap_status st = gc_record(t, name, bw, in, nin, NULL, 0, n);
  if (st != GCAP_OK) return st;
  (*n)->ud = hc;
  (*n)->ud_free = hook_call_release;
  hc->refs++;
  return GCAP_OK;
}

/* Put the tensors of one side of hc's call (t[0..n), references; NULL ones
** skipped) that require grad behind alias nodes leading to one join,
** replacing them in t[]. The slots of the side are made already. */
static gcap_status hook_track(hook_call *hc, int side, int n, gcap_tensor **t) {
  gcap_tensor *small[8], **need = small, *join = NULL;
  gcap_status st = GCAP_OK;
  gc_node *jn;
  int i, k = 0, slot = 0;
  for (i = 0; i < n; i++)
    k += t[i] != NULL && t[i]->requires_grad;
  if (k == 0) return GCAP_OK;
  if (k > 8 && (need = (gcap_tensor **)gc_malloc((size_t)k * sizeof *need)) == NULL)
    return gc_fail(hc->m->e, GCAP_ENOMEM, "%s: out of host memory", hc->m->type);
  for (i = 0, k = 0; i < n; i++)
    if (t[i] != NULL && t[i]->requires_grad) need[k++] = t[i];
  if ((join = gc_tensor_alias(need[0], 0, NULL)) == NULL) {
    st = gc_fail(hc->m->e, GCAP_ENOMEM, "%s: out of host memory", hc->m->type);
    goto done;
  }
  st = hook_record(join, side ? "backward_hook outputs" : "backward_hook inputs",
                   side ? out_join_backward : in_join_backward, need, k, hc, &jn);
  for (i = 0; st == GCAP_OK && i < n; i++) {
    gcap_tensor *al;
    gc_node *an;
    if (t[i] == NULL) continue;
    if (t[i]->requires_grad) {
      if ((al = gc_tensor_alias(t[i], t[i]->ndim, t[i]->shape)) == NULL) {
        st = gc_fail(hc->m->e, GCAP_ENOMEM, "%s: out of host memory", hc->m->type);
        break;
      }
      if ((st = hook_record(al, "backward_hook", alias_backward, &join, 1, hc, &an)) != GCAP_OK) {
        gcap_tensor_free(al);
        break;
      }
      an->k[0] = slot;
      an->k[1] = side;
      gcap_tensor_free(t[i]);
      t[i] = al;
    }
    slot++;
  }
  if (st == GCAP_OK && !side) hc->inputs_tracked = 1;
done:
  gcap_tensor_free(join); /* the aliases' nodes hold its node */
  if (need != small) free(need);
  return st;
}

/* ------------------------------------------------------------------------ */
/* The call                                                                  */

/* A forward that failed with a status and no message is named by its module. */
static gcap_status forward_failed(gcap_module *m, gcap_status st) {
  if (m->e->err[0] == '\0')
    gc_fail(m->e, st, "%s: forward failed (%s)", m->type, gcap_status_str(st));
  return st;
}

static gcap_status module_forward(gcap_module *m, int nin, gcap_tensor *const *in, int *nout,
                                  gcap_tensor **out) {
  gcap_status st;
  *nout = 0;
  if (m->forward != NULL) {
    out[0] = NULL;
    if ((st = m->forward(m->ud, m, nin, in, out)) != GCAP_OK) return forward_failed(m, st);
    if (out[0] == NULL)
      return gc_fail(m->e, GCAP_EINVAL, "%s: forward returned no tensor", m->type);
    *nout = 1;
    return GCAP_OK;
  }
  if ((st = m->forward_n(m->ud, m, nin, in, nout, out)) != GCAP_OK) {
    *nout = 0; /* a failed forward gives no references */
    return forward_failed(m, st);
  }
  if (*nout < 0 || *nout > GCAP_MAX_OUTPUTS) {
    int n = *nout;
    *nout = 0;
    return gc_fail(m->e, GCAP_EINVAL, "%s: forward gave %d outputs; expected 0..%d", m->type, n,
                   GCAP_MAX_OUTPUTS);
  }
  return GCAP_OK;
}

gcap_status gc_module_forward(gcap_module *m, int nin, gcap_tensor *const *in, int *nout,
                              gcap_tensor **out) {
  mod_where w;
  gcap_status st;
  gc_module_where_enter(m, &w); /* the labels of what it launches in a capture */
  st = module_forward(m, nin, in, nout, out);
  gc_module_where_leave(m, &w);
  return st;
}

/* The forward hooks of m on its outputs ys[0..*ny) (references, room for
** GCAP_MAX_OUTPUTS), which they may replace, and which must then fit
** maxout. */
static gcap_status run_forward_hooks(gcap_module *m, gcap_hook_args *a, hook_vals *v, int maxout,
                                     int *ny, gcap_tensor **ys) {
  gcap_status st;
  int i;
  a->kind = GCAP_HOOK_FORWARD;
  a->nout = *ny;
  a->out = ys;
  if ((st = run_hooks(m, a, v, NULL, 0)) != GCAP_OK) return st;
  if (a->out == ys) {
    if (*ny <= maxout) return GCAP_OK;
    return gc_fail(m->e, GCAP_EINVAL, "%s: forward gave %d outputs, room for %d", m->type, *ny,
                   maxout);
  }
  if (a->nout > maxout)
    return gc_fail(m->e, GCAP_EINVAL, "%s: a forward hook returned %d outputs, room for %d",
                   m->type, a->nout, maxout);
  gc_outs_free(*ny, ys);
  for (i = 0; i < a->nout; i++)
    ys[i] = gcap_tensor_retain(a->out[i]);
  *ny = a->nout;
  return GCAP_OK;
}

/* The call between the hooks: the graphed replay of m's current mode, or
** its own forward. */
static gcap_status route_or_forward(gcap_module *m, const gcap_replay_opts *o, int nin,
                                    gcap_tensor *const *in, int *nout, gcap_tensor **out) {
  const mod_route *rt = &m->route[m->training != 0];
  if (rt->fn) return rt->fn(rt->ud, rt->entry, o, nin, in, nout, out);
  if (o != NULL && (o->stream != NULL || o->event != NULL))
    return gc_fail(m->e, GCAP_EINVAL,
                   "%s: cuda_graph_stream and cuda_graph_event are options of a graphed call, and "
                   "it is not graphed in %s mode (it runs its own forward)",
                   m->type, m->training ? "training" : "eval");
  return gc_module_forward(m, nin, in, nout, out);
}

gcap_status gcap_module_call_n(gcap_module *m, int nin, gcap_tensor *const *in, int maxout,
                               int *nout, gcap_tensor **out) {
  return gcap_module_call_opts(m, NULL, nin, in, maxout, nout, out);
}

gcap_status gcap_module_call_opts(gcap_module *m, const gcap_replay_opts *opts, int nin,
                                  gcap_tensor *const *in, int maxout, int *nout,
                                  gcap_tensor **out) {
  gcap_tensor *small[8], **args = small, *ys[GCAP_MAX_OUTPUTS];
  hook_vals pre, post;
  hook_call *hc = NULL;
  gcap_hook_args a;
  gcap_status st;
  int i, ny = 0, nargs = 0;
  memset(&pre, 0, sizeof pre);
  memset(&post, 0, sizeof post);
  if (nout != NULL) *nout = 0;
  if (m == NULL) return GCAP_EINVAL;
  gc_clear(m->e);
  if (out == NULL) return gc_null(m->e, m->type, "out");
  if (nout == NULL) return gc_null(m->e, m->type, "nout");
  if (maxout < 0) return gc_bad_count(m->e, m->type, "maxout", maxout);
  if (nin < 0) return gc_bad_count(m->e, m->type, "nin", nin);
  if (nin > 0 && in == NULL) return gc_null(m->e, m->type, "in");
  for (i = 0; i < nin; i++) {
    if (in[i] == NULL) return gc_fail(m->e, GCAP_EINVAL, "%s: input #%d is NULL", m->type, i + 1);
    if (in[i]->e != m->e)
      return gc_fail(m->e, GCAP_EINVAL, "%s: input #%d belongs to another engine", m->type, i + 1);
  }
  memset(&a, 0, sizeof a);
  a.kind = GCAP_HOOK_FORWARD_PRE;
  a.nin = nin;
  a.in = in;
  if ((st = run_hooks(m, &a, &pre, NULL, 0)) != GCAP_OK) goto done;
  /* the inputs the pre-hooks left, as references: backward hooks put
  ** aliases in their place */
  if (a.nin > 8 && (args = (gcap_tensor **)gc_malloc((size_t)a.nin * sizeof *args)) == NULL) {
    st = gc_fail(m->e, GCAP_ENOMEM, "%s: out of host memory", m->type);
    goto done;
  }
  for (nargs = 0; nargs < a.nin; nargs++)
    args[nargs] = gcap_tensor_retain(a.in[nargs]);
  if (m->e->grad_enabled && (gcap_module_num_hooks(m, GCAP_HOOK_BACKWARD_PRE) +
                             gcap_module_num_hooks(m, GCAP_HOOK_BACKWARD)) > 0) {
    if ((hc = (hook_call *)gc_calloc(1, sizeof *hc)) == NULL) {
      st = gc_fail(m->e, GCAP_ENOMEM, "%s: out of host memory", m->type);
      goto done;
    }
    hc->refs = 1;
    hc->m = gcap_module_retain(m);
    if (!hook_slots(hc, 0, nargs, args)) {
      st = gc_fail(m->e, GCAP_ENOMEM, "%s: out of host memory", m->type);
      goto done;
    }
    if ((st = hook_track(hc, 0, nargs, args)) != GCAP_OK) goto done;
  }
  st = route_or_forward(m, opts, nargs, args, &ny, ys);
  if (st != GCAP_OK) goto done;
  if ((st = run_forward_hooks(m, &a, &post, maxout, &ny, ys)) != GCAP_OK) goto done;
  if (hc != NULL) {
    if (!hook_slots(hc, 1, ny, ys)) {
      st = gc_fail(m->e, GCAP_ENOMEM, "%s: out of host memory", m->type);
      goto done;
    }
    if ((st = hook_track(hc, 1, ny, ys)) != GCAP_OK) goto done;
  }
  for (i = 0; i < ny; i++)
    out[i] = ys[i];
  *nout = ny;
  ny = 0;
done:
  (void)gc_module_take_first_microbatch(m); /* this call's, also where it failed before */
  gc_outs_free(ny, ys);
  gc_outs_free(nargs, args);
  if (hc) hook_call_release(hc);
  if (args != small) free(args);
  vals_free(&pre);
  vals_free(&post);
  return st;
}

gcap_status gcap_module_call(gcap_module *m, int nin, gcap_tensor *const *in, gcap_tensor **out) {
  gcap_tensor *ys[GCAP_MAX_OUTPUTS];
  gcap_status st;
  int n;
  if (out != NULL) *out = NULL;
  if (m != NULL && out == NULL) return gc_null(m->e, m->type, "out");
  if ((st = gcap_module_call_n(m, nin, in, GCAP_MAX_OUTPUTS, &n, ys)) != GCAP_OK) return st;
  if (n == 1 && ys[0] != NULL) {
    *out = ys[0];
    return GCAP_OK;
  }
  gc_outs_free(n, ys);
  return gc_fail(m->e, GCAP_EINVAL,
                 "%s: forward gave %d outputs%s; this call takes one tensor (gcap_module_call_n "
                 "takes several)",
                 m->type, n, n == 1 ? " (absent)" : "");
}

int gc_module_plain(const gcap_module *m) {
  return m->nhooks == 0 && m->route[0].fn == NULL && m->route[1].fn == NULL;
}

void gc_module_set_route(gcap_module *m, int training, gc_route_fn fn, void *ud, int entry) {
  mod_route *rt = &m->route[training != 0];
  rt->fn = fn;
  rt->ud = ud;
  rt->entry = entry;
}

void gc_module_unroute(gcap_module *m, const void *ud, int entry) {
  int k;
  for (k = 0; k < 2; k++)
    if (m->route[k].fn != NULL && m->route[k].ud == ud && m->route[k].entry == entry)
      m->route[k].fn = NULL;
}
