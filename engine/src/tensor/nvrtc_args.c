/*
** nvrtc_args.c: the parameters of a runtime-compiled kernel. Their types are
** read from the __global__ function's parameter list in the kernel's
** source (a small scanner: comments, literals and preprocessor lines are
** skipped, nothing is expanded), or given by the caller; each launch
** argument is then checked against its parameter and converted to the
** bytes the kernel reads, the same conversion for the cuda launch and for
** what a host twin is told.
*/
#include <ctype.h>
#include <math.h>
#include <string.h>

#include "tensor.h"

#define KP_TOKLEN 64 /* identifiers longer than this are cut */
#define KP_WORDS 8   /* identifiers kept of one parameter */

static const char *const kp_names[] = {"ptr", "i32", "u32", "i64", "u64", "f32", "f64", "bool"};

const char *gcap_kparam_name(gcap_kparam p) {
  return (unsigned)p < sizeof kp_names / sizeof kp_names[0] ? kp_names[p] : NULL;
}

size_t gc_kparam_size(gcap_kparam p) {
  switch (p) {
    case GCAP_KPARAM_I32:
    case GCAP_KPARAM_U32:
    case GCAP_KPARAM_F32:
      return 4;
    case GCAP_KPARAM_BOOL:
      return 1;
    default:
      return 8;
  }
}

/* ------------------------------------------------------------------------ */
/* Scanning the source                                                       */

typedef struct kp_tok {
  int c;         /* 'a': an identifier, '0': a number, '"': a literal, 0: the end, else the char */
  const char *s; /* where it starts in the source */
  size_t len;
} kp_tok;

/* The token at *pp, *pp moved past it. */
static kp_tok kp_next(const char **pp) {
  const char *p = *pp;
  kp_tok t = {0, NULL, 0};
  for (;;) {
    while (isspace((unsigned char)*p))
      p++;
    if (p[0] == '/' && p[1] == '/')
      p += strcspn(p, "\n");
    else if (p[0] == '/' && p[1] == '*') {
      const char *q = strstr(p + 2, "*/");
      p = q ? q + 2 : p + strlen(p);
    } else if (*p == '#') { /* a preprocessor line, with its continuations */
      while (*p && (*p != '\n' || p[-1] == '\\'))
        p++;
    } else
      break;
  }
  t.s = p;
  if (*p == '\0')
    t.c = 0;
  else if (isalpha((unsigned char)*p) || *p == '_') {
    t.c = 'a';
    while (isalnum((unsigned char)*p) || *p == '_')
      p++;
  } else if (isdigit((unsigned char)*p)) {
    t.c = '0';
    while (isalnum((unsigned char)*p) || *p == '.' || *p == '_')
      p++;
  } else if (*p == '"' || *p == '\'') {
    char q = *p++;
    t.c = '"';
    while (*p && *p != q)
      p += (*p == '\\' && p[1]) ? 2 : 1;
    if (*p) p++;
  } else
    t.c = (unsigned char)*p++;
  t.len = (size_t)(p - t.s);
  *pp = p;
  return t;
}

static int kp_is(const kp_tok *t, const char *word) {
  return t->c == 'a' && t->len == strlen(word) && strncmp(t->s, word, t->len) == 0;
}

/* Skip a parenthesized group whose '(' is the next token; 0 when unbalanced. */
static int kp_skipgroup(const char **pp) {
  int depth = 0;
  do {
    kp_tok t = kp_next(pp);
    if (t.c == '(')
      depth++;
    else if (t.c == ')' && depth > 0)
      depth--;
    else if (t.c == 0 || depth == 0)
      return 0;
  } while (depth > 0);
  return 1;
}

/* Find `__global__ ... name (` in src; *pp just past the '(' and 1, or 0. */
static int kp_find(const char *src, const char *name, const char **pp) {
  const char *p = src;
  kp_tok t;
  while ((t = kp_next(&p)).c != 0) {
    const char *q = p;
    kp_tok last = {0, NULL, 0};
    if (!kp_is(&t, "__global__")) continue;
    for (;;) { /* the declarator: its last identifier before '(' */
      kp_tok u = kp_next(&q);
      if (kp_is(&u, "__launch_bounds__") || kp_is(&u, "__attribute__")) {
        if (!kp_skipgroup(&q)) break;
      } else if (u.c == 'a')
        last = u;
      else if (u.c == '(') {
        if (kp_is(&last, name)) {
          *pp = q;
          return 1;
        }
        break;
      } else if (u.c != ':' && u.c != '*')
        break;
    }
  }
  return 0;
}

static const char *const kp_quals[] = {"const",      "volatile", "__restrict__",
                                       "__restrict", "restrict", "__grid_constant__"};

static int kp_among(const char *w, const char *const *set, size_t n) {
  size_t i;
  for (i = 0; i < n; i++)
    if (strcmp(w, set[i]) == 0) return 1;
  return 0;
}

/* The fixed-name types and what they are */
static const struct {
  const char *name;
  gcap_kparam p;
} kp_fixed[] = {
    {"float", GCAP_KPARAM_F32},    {"double", GCAP_KPARAM_F64},   {"bool", GCAP_KPARAM_BOOL},
    {"int32_t", GCAP_KPARAM_I32},  {"uint32_t", GCAP_KPARAM_U32}, {"int64_t", GCAP_KPARAM_I64},
    {"uint64_t", GCAP_KPARAM_U64}, {"size_t", GCAP_KPARAM_U64},   {"ptrdiff_t", GCAP_KPARAM_I64}};

static int kp_fixedtype(const char *w) {
  size_t i;
  for (i = 0; i < sizeof kp_fixed / sizeof kp_fixed[0]; i++)
    if (strcmp(w, kp_fixed[i].name) == 0) return (int)i;
  return -1;
}

/* Is w a word of a type's name? */
static int kp_typeword(const char *w) {
  static const char *const words[] = {"signed", "unsigned", "int", "long", "short", "char"};
  return kp_fixedtype(w) >= 0 || kp_among(w, words, sizeof words / sizeof words[0]);
}

/* The type of a parameter without '*' from its words w[n] (qualifiers
** dropped); -1 when it is none of gcap_kparam's. */
static int kp_classify(char (*w)[KP_TOKLEN], int n) {
  int i, uns = 0, sgn = 0, nlong = 0, nint = 0, fixed = -1;
  if (n >= 2 && !kp_typeword(w[n - 1])) n--; /* the parameter's name */
  if (n == 0) return -1;
  for (i = 0; i < n; i++) {
    if (strcmp(w[i], "unsigned") == 0)
      uns++;
    else if (strcmp(w[i], "signed") == 0)
      sgn++;
    else if (strcmp(w[i], "long") == 0)
      nlong++;
    else if (strcmp(w[i], "int") == 0)
      nint++;
    else if (fixed >= 0 || (fixed = kp_fixedtype(w[i])) < 0)
      return -1;
  }
  if (fixed >= 0) return (uns || sgn || nlong || nint) ? -1 : (int)kp_fixed[fixed].p;
  if ((uns && sgn) || uns > 1 || sgn > 1 || nint > 1 || nlong > 2) return -1;
  if (nlong) return uns ? GCAP_KPARAM_U64 : GCAP_KPARAM_I64;
  return uns ? GCAP_KPARAM_U32 : GCAP_KPARAM_I32;
}

/* The failure for parameter #i (from 0) spanning s[len]. */
static gcap_status kp_undecided(gcap_engine *e, const char *name, int i, const char *s,
                                size_t len) {
  return gc_fail(e, GCAP_EINVAL,
                 "kernel '%s': cannot tell the type of parameter #%d (`%.*s`); give the "
                 "parameter types (option signature of gc.cuda.kernel, params of "
                 "gcap_kernel_new)",
                 name, i + 1, (int)(len > 60 ? 60 : len), s);
}

gcap_status gc_kparam_parse(gcap_engine *e, const char *src, const char *name, int *n,
                            gcap_kparam *out) {
  const char *p;
  int np = 0, depth = 0, star = 0, other = 0, nw = 0, done = 0;
  char w[KP_WORDS][KP_TOKLEN];
  const char *start = NULL, *end = NULL;
  *n = 0;
  if (!kp_find(src, name, &p))
    return gc_fail(e, GCAP_EINVAL,
                   "kernel '%s': no parameter list of a __global__ function '%s' in the source "
                   "(made by a macro or a template?); give the parameter types (option "
                   "signature of gc.cuda.kernel, params of gcap_kernel_new)",
                   name, name);
  while (!done) { /* one token of the list; ',' or ')' at depth 0 ends a parameter */
    kp_tok t = kp_next(&p);
    if (t.c == 0) return gc_fail(e, GCAP_EINVAL, "kernel '%s': unterminated parameter list", name);
    if (depth == 0 && (t.c == ',' || t.c == ')')) {
      done = t.c == ')';
      if (start == NULL && done && np == 0) break; /* () */
      if (nw == 1 && !star && !other && strcmp(w[0], "void") == 0 && done && np == 0) break;
      if (np == GC_KMAXPARAMS)
        return gc_fail(e, GCAP_EINVAL, "kernel '%s': more than %d parameters", name, GC_KMAXPARAMS);
      if (start == NULL) return kp_undecided(e, name, np, "", 0);
      if (other) return kp_undecided(e, name, np, start, (size_t)(end - start));
      if (star)
        out[np] = GCAP_KPARAM_PTR;
      else {
        int c = kp_classify(w, nw);
        if (c < 0) return kp_undecided(e, name, np, start, (size_t)(end - start));
        out[np] = (gcap_kparam)c;
      }
      np++;
      start = NULL, star = other = nw = 0;
      continue;
    }
    if (start == NULL) start = t.s;
    end = t.s + t.len;
    if (t.c == '<') /* template arguments: only a pointer of such a type is known */
      depth++;
    else if (t.c == '(' || t.c == '[')
      depth++, other = 1;
    else if (t.c == ')' || t.c == '>' || t.c == ']')
      depth--;
    else if (t.c == '*')
      star = 1;
    else if (t.c == 'a') {
      if (t.len >= KP_TOKLEN || nw == KP_WORDS)
        other = 1;
      else {
        memcpy(w[nw], t.s, t.len);
        w[nw][t.len] = '\0';
        if (!kp_among(w[nw], kp_quals, sizeof kp_quals / sizeof kp_quals[0])) nw++;
      }
    } else
      other = 1;
  }
  *n = np;
  return GCAP_OK;
}

/* ------------------------------------------------------------------------ */
/* Converting arguments                                                      */

/* The range [lo, hi) of integer parameter p */
static void kp_range(gcap_kparam p, double *lo, double *hi) {
  switch (p) {
    case GCAP_KPARAM_I32:
      *lo = -ldexp(1, 31), *hi = ldexp(1, 31);
      break;
    case GCAP_KPARAM_U32:
      *lo = 0, *hi = ldexp(1, 32);
      break;
    case GCAP_KPARAM_BOOL:
      *lo = 0, *hi = 2;
      break;
    case GCAP_KPARAM_I64:
      *lo = -ldexp(1, 63), *hi = ldexp(1, 63);
      break;
    default:
      *lo = 0, *hi = ldexp(1, 64);
      break;
  }
}

gcap_status gc_karg_convert(gcap_engine *e, const char *kname, int i, gcap_kparam p,
                            const gcap_karg *a, gc_kval *v, gcap_karg *out) {
  const char *pn = gcap_kparam_name(p);
  double lo, hi;
  memset(out, 0, sizeof *out);
  if ((unsigned)a->kind > GCAP_KARG_FLOAT)
    return gc_fail(e, GCAP_EINVAL, "kernel '%s': argument #%d has no kind", kname, i + 1);
  if (p == GCAP_KPARAM_PTR) {
    if (a->kind != GCAP_KARG_TENSOR)
      return gc_fail(e, GCAP_EINVAL,
                     "kernel '%s': argument #%d must be a tensor (parameter %d is a pointer), "
                     "got a number",
                     kname, i + 1, i + 1);
    if (a->t == NULL || a->t->e != e)
      return gc_fail(e, GCAP_EINVAL, "kernel '%s': argument #%d is %s", kname, i + 1,
                     a->t ? "a tensor of another engine" : "NULL");
    *out = *a;
    v->p = gc_tensor_ptr(a->t);
    return GCAP_OK;
  }
  if (a->kind == GCAP_KARG_TENSOR)
    return gc_fail(e, GCAP_EINVAL,
                   "kernel '%s': argument #%d must be a number (parameter %d is %s), got a tensor",
                   kname, i + 1, i + 1, pn);
  if (p == GCAP_KPARAM_F32 || p == GCAP_KPARAM_F64) {
    double d = a->kind == GCAP_KARG_INT ? (double)a->i : a->f;
    out->kind = GCAP_KARG_FLOAT;
    if (p == GCAP_KPARAM_F64) {
      v->f64 = out->f = d;
      return GCAP_OK;
    }
    v->f32 = a->kind == GCAP_KARG_INT ? (float)a->i : (float)a->f; /* rounded once */
    if (isinf(v->f32) && !isinf(d))
      return gc_fail(e, GCAP_EINVAL, "kernel '%s': argument #%d (%.17g) is out of the range of f32",
                     kname, i + 1, d);
    out->f = v->f32;
    return GCAP_OK;
  }
  out->kind = GCAP_KARG_INT;
  kp_range(p, &lo, &hi);
  if (a->kind == GCAP_KARG_FLOAT) {
    if (!isfinite(a->f) || floor(a->f) != a->f)
      return gc_fail(e, GCAP_EINVAL,
                     "kernel '%s': argument #%d must be an integer (parameter %d is %s), got %.17g",
                     kname, i + 1, i + 1, pn, a->f);
    if (a->f < lo || a->f >= hi)
      return gc_fail(e, GCAP_EINVAL, "kernel '%s': argument #%d (%.17g) is out of the range of %s",
                     kname, i + 1, a->f, pn);
    if (p == GCAP_KPARAM_U64)
      v->u64 = (uint64_t)a->f;
    else
      v->i64 = (int64_t)a->f;
    out->i = v->i64; /* a u64 past INT64_MAX reads negative here: the same bits */
  } else {
    /* as a double, an i64's largest values round up to hi: every int64 fits */
    if (p != GCAP_KPARAM_I64 && ((double)a->i < lo || (double)a->i >= hi))
      return gc_fail(e, GCAP_EINVAL, "kernel '%s': argument #%d (%lld) is out of the range of %s",
                     kname, i + 1, (long long)a->i, pn);
    v->i64 = out->i = a->i;
  }
  switch (p) { /* the bytes the kernel reads, from the value in range */
    case GCAP_KPARAM_I32:
      v->i32 = (int32_t)out->i;
      break;
    case GCAP_KPARAM_U32:
      v->u32 = (uint32_t)out->i;
      break;
    case GCAP_KPARAM_BOOL:
      v->b = (unsigned char)out->i;
      break;
    default:
      break;
  }
  return GCAP_OK;
}
