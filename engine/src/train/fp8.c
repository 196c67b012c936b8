/*
** fp8.c: FP8 as TransformerEngine sets it up: the recipes (DelayedScaling,
** Float8CurrentScaling) and their checks, whether the device runs FP8, the
** engine's autocast, and each module's FP8 state: made at its first call
** under a DelayedScaling autocast, read back by gcap_module_fp8_state.
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "train.h"

void gcap_fp8_recipe_init(gcap_fp8_recipe *r, gcap_fp8_recipe_kind kind) {
  if (r == NULL) return;
  memset(r, 0, sizeof *r);
  r->kind = kind;
  r->fp8_format = GCAP_FP8_HYBRID;
  r->margin = 0.0;
  r->amax_history_len = 1024;
  r->amax_compute_algo = GCAP_AMAX_MAX;
}

gcap_status gc_fp8_recipe_check(gcap_engine *e, const char *where, const gcap_fp8_recipe *r) {
  if (r->kind != GCAP_FP8_DELAYED_SCALING && r->kind != GCAP_FP8_CURRENT_SCALING)
    return gc_fail(e, GCAP_EINVAL,
                   "%s: recipe kind %d is not a recipe (expected DelayedScaling or "
                   "Float8CurrentScaling)",
                   where, (int)r->kind);
  if (r->fp8_format != GCAP_FP8_HYBRID && r->fp8_format != GCAP_FP8_ALL_E4M3)
    return gc_fail(e, GCAP_EINVAL, "%s: fp8_format %d is not HYBRID or E4M3", where,
                   (int)r->fp8_format);
  if (r->kind == GCAP_FP8_CURRENT_SCALING) return GCAP_OK;
  if (!isfinite(r->margin))
    return gc_fail(e, GCAP_EINVAL, "%s: margin must be a finite number, got %g", where, r->margin);
  if (r->amax_history_len < 1)
    return gc_fail(e, GCAP_EINVAL, "%s: amax_history_len must be >= 1, got %d", where,
                   r->amax_history_len);
  if (r->amax_compute_algo != GCAP_AMAX_MAX && r->amax_compute_algo != GCAP_AMAX_MOST_RECENT)
    return gc_fail(e, GCAP_EINVAL, "%s: amax_compute_algo %d is not \"max\" or \"most_recent\"",
                   where, (int)r->amax_compute_algo);
  return GCAP_OK;
}

int gcap_fp8_is_available(gcap_engine *e, char *why, size_t n) {
  if (e == NULL) return 0;
  if (why == NULL) {
    char buf[GC_ERRLEN];
    return e->be->fp8_supported(e->bs, buf, sizeof buf);
  }
  return e->be->fp8_supported(e->bs, why, n);
}

gcap_status gcap_fp8_set_autocast(gcap_engine *e, const gcap_fp8_autocast *a,
                                  gcap_fp8_autocast *prev) {
  static const char where[] = "fp8 autocast";
  gcap_status st;
  if (e == NULL) return GCAP_EINVAL;
  /* no gc_clear: restoring the previous autocast after a failed call keeps its message */
  if (a != NULL && a->enabled) {
    char why[GC_ERRLEN];
    if ((st = gc_fp8_recipe_check(e, where, &a->recipe)) != GCAP_OK) return st;
    if (a->amax_reduction_group != NULL && e->fp8_all_reduce == NULL)
      return gc_fail(e, GCAP_ESTATE,
                     "%s: amax_reduction_group needs the distributed runtime (gc.dist.init)",
                     where);
    if (!gcap_fp8_is_available(e, why, sizeof why))
      return gc_fail(e, GCAP_EINVAL, "%s: %s", where, why);
  }
  if (prev != NULL) *prev = e->fp8;
  if (a != NULL)
    e->fp8 = *a;
  else
    memset(&e->fp8, 0, sizeof e->fp8);
  return GCAP_OK;
}

gcap_status gc_fp8_module_meta(gcap_module *m, const gcap_fp8_recipe *r, gc_fp8_meta **out) {
  gc_fp8_meta **slot = gc_module_fp8_slot(m), *fresh = NULL;
  gcap_engine *e = gc_module_engine(m);
  gcap_status st;
  int gemms = gcap_module_fp8_gemms(m);
  if (*slot != NULL && (*slot)->len == r->amax_history_len) {
    *out = *slot;
    return GCAP_OK;
  }
  if (e->cap != NULL)
    return gc_fail(e, GCAP_ECAPTURE,
                   "%s: its FP8 state (amax_history_len %d) is made at its first call under an "
                   "FP8 autocast with that recipe, which must not be inside a capture; call it "
                   "once before capturing",
                   gcap_module_type(m), r->amax_history_len);
  if ((st = gc_fp8_meta_new(e, gcap_module_type(m), gemms, r->amax_history_len, &fresh)) != GCAP_OK)
    return st;
  gc_fp8_meta_release(*slot);
  *out = *slot = fresh;
  return GCAP_OK;
}

gcap_status gcap_module_fp8_state(gcap_module *m, int gemm, int role, int max, float *scale,
                                  float *history, int *len) {
  static const char op[] = "fp8_state";
  gcap_engine *e;
  gc_fp8_meta *meta;
  float *all;
  int roles, r, j;
  gcap_status st;
  if (m == NULL) return GCAP_EINVAL;
  e = gc_module_engine(m);
  gc_clear(e);
  if (scale == NULL || len == NULL) return gc_null(e, op, scale ? "len" : "scale");
  if (gemm < 0 || gemm >= gcap_module_fp8_gemms(m) || role < 0 || role > 2)
    return gc_fail(e, GCAP_EINVAL, "%s: %s has %d FP8 GEMMs of 3 roles; no GEMM %d, role %d", op,
                   gcap_module_type(m), gcap_module_fp8_gemms(m), gemm, role);
  if (max > 0 && history == NULL) return gc_null(e, op, "history");
  meta = *gc_module_fp8_slot(m);
  *scale = 1.0f;
  *len = 0;
  if (meta == NULL) return GCAP_OK;
  roles = 3 * meta->gemms;
  if ((all = (float *)gc_calloc((size_t)meta->state->numel, sizeof *all)) == NULL)
    return gc_fail(e, GCAP_ENOMEM, "%s: out of host memory", op);
  st = gcap_tensor_read(meta->state, all, (size_t)meta->state->numel);
  if (st == GCAP_OK) {
    r = 3 * gemm + role;
    *scale = all[roles + r];
    *len = meta->len;
    for (j = 0; j < max && j < meta->len; j++)
      history[j] = all[2 * roles + r * meta->len + j];
  } else {
    char msg[GC_ERRLEN];
    snprintf(msg, sizeof msg, "%s", e->err);
    gc_fail(e, st, "%s: %s", op, msg);
  }
  free(all);
  return st;
}
