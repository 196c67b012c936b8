/*
** nvrtc.c: kernels compiled at run time with NVRTC and launched as custom
** ops. NVRTC and the driver (libcuda) are opened with dlopen on first use,
** so that the library loads where neither exists (a machine without a GPU
** still compiles, when the toolkit is there); the few entry points are
** declared here with plain C types. The kernel's parameter types come
** from nvrtc_args.c; a launch is a custom op made for it, whose ud holds the
** arguments converted to those types, by value: its cuda callback calls
** cuLaunchKernel on the stream it is given (a kernel node inside a
** capture), its host callback is the launch's host twin.
*/
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor.h"

#ifndef GC_CUDA_LIBDIR
#define GC_CUDA_LIBDIR "/usr/local/cuda/lib64"
#endif

typedef void *kl_prog;
typedef struct kl_api {
  int tried, ok;
  char why[256];
  /* NVRTC */
  int (*create)(kl_prog *p, const char *src, const char *name, int nh, const char *const *h,
                const char *const *hn);
  int (*compile)(kl_prog p, int n, const char *const *opts);
  int (*log_size)(kl_prog p, size_t *n);
  int (*log)(kl_prog p, char *log);
  int (*ptx_size)(kl_prog p, size_t *n);
  int (*ptx)(kl_prog p, char *ptx);
  int (*add_name)(kl_prog p, const char *name);
  int (*lowered)(kl_prog p, const char *name, const char **lowered);
  int (*destroy)(kl_prog *p);
  const char *(*errstr)(int r);
} kl_api;

typedef struct kl_drv {
  int tried, ok;
  char why[256];
  int (*init)(unsigned flags);
  int (*load)(void **mod, const void *image);
  int (*unload)(void *mod);
  int (*function)(void **fn, void *mod, const char *name);
  int (*launch)(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                unsigned bz, unsigned shmem, void *stream, void **params, void **extra);
  int (*errstr)(int r, const char **s);
  int (*param_info)(void *fn, size_t i, size_t *offset, size_t *size); /* NULL before 12.4 */
} kl_drv;

static kl_api kl_nvrtc;
static kl_drv kl_cuda;

/* dlopen the first of names that opens; its handle, or NULL (why in why). */
static void *kl_open(const char *const *names, int n, char *why, size_t nwhy) {
  int i;
  for (i = 0; i < n; i++) {
    void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (h != NULL) return h;
  }
  snprintf(why, nwhy, "%s", dlerror());
  return NULL;
}

/* Resolve sym into *fp; 0 when missing. */
static int kl_sym(void *h, const char *sym, void *fp) {
  void *p = dlsym(h, sym);
  memcpy(fp, &p, sizeof p);
  return p != NULL;
}

static int kl_load_nvrtc(void) {
  static const char *const names[] = {"libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12",
                                      GC_CUDA_LIBDIR "/libnvrtc.so"};
  kl_api *a = &kl_nvrtc;
  void *h;
  if (a->tried) return a->ok;
  a->tried = 1;
  if ((h = kl_open(names, (int)(sizeof names / sizeof names[0]), a->why, sizeof a->why)) == NULL)
    return 0;
  a->ok = kl_sym(h, "nvrtcCreateProgram", &a->create) &&
          kl_sym(h, "nvrtcCompileProgram", &a->compile) &&
          kl_sym(h, "nvrtcGetProgramLogSize", &a->log_size) &&
          kl_sym(h, "nvrtcGetProgramLog", &a->log) && kl_sym(h, "nvrtcGetPTXSize", &a->ptx_size) &&
          kl_sym(h, "nvrtcGetPTX", &a->ptx) && kl_sym(h, "nvrtcAddNameExpression", &a->add_name) &&
          kl_sym(h, "nvrtcGetLoweredName", &a->lowered) &&
          kl_sym(h, "nvrtcDestroyProgram", &a->destroy) &&
          kl_sym(h, "nvrtcGetErrorString", &a->errstr);
  if (!a->ok) snprintf(a->why, sizeof a->why, "libnvrtc lacks an entry point");
  return a->ok;
}

static int kl_load_driver(void) {
  static const char *const names[] = {"libcuda.so.1", "libcuda.so"};
  kl_drv *d = &kl_cuda;
  void *h;
  if (d->tried) return d->ok;
  d->tried = 1;
  if ((h = kl_open(names, 2, d->why, sizeof d->why)) == NULL) return 0;
  d->ok = kl_sym(h, "cuInit", &d->init) && kl_sym(h, "cuModuleLoadData", &d->load) &&
          kl_sym(h, "cuModuleUnload", &d->unload) &&
          kl_sym(h, "cuModuleGetFunction", &d->function) &&
          kl_sym(h, "cuLaunchKernel", &d->launch) && kl_sym(h, "cuGetErrorString", &d->errstr);
  if (d->ok && !kl_sym(h, "cuFuncGetParamInfo", &d->param_info)) d->param_info = NULL;
  if (!d->ok)
    snprintf(d->why, sizeof d->why, "libcuda lacks an entry point");
  else if (d->init(0) != 0) {
    snprintf(d->why, sizeof d->why, "cuInit failed");
    d->ok = 0;
  }
  return d->ok;
}

static const char *kl_drverr(int r) {
  const char *s = NULL;
  if (kl_cuda.errstr == NULL || kl_cuda.errstr(r, &s) != 0 || s == NULL) return "unknown error";
  return s;
}

struct gcap_kernel {
  int refs; /* the user's handle and the launches that use it */
  gcap_engine *e;
  char name[GC_NAMELEN];
  char label[GC_NAMELEN + 16]; /* "kernel 'name'", in errors */
  char *lowered;               /* the function's name in the PTX */
  char *ptx;
  void *mod, *fn; /* loaded on a cuda engine */
  int nparams;
  gcap_kparam params[GC_KMAXPARAMS];
};

static void kl_release(gcap_kernel *k) {
  gcap_engine *e;
  if (--k->refs > 0) return;
  e = k->e;
  if (k->mod) kl_cuda.unload(k->mod);
  free(k->lowered);
  free(k->ptx);
  free(k);
  gc_engine_unref(e);
}

void gcap_kernel_free(gcap_kernel *k) {
  if (k != NULL) kl_release(k);
}

/* Copy s into a new string; NULL when out of memory. */
static char *kl_strdup(const char *s) {
  char *p = (char *)gc_malloc(strlen(s) + 1);
  if (p != NULL) strcpy(p, s);
  return p;
}

/* Compile k's source into k->ptx and k->lowered; a compile error's message
** carries NVRTC's log. */
static gcap_status kl_compile(gcap_kernel *k, const char *src, int nopts, const char *const *opts) {
  gcap_engine *e = k->e;
  kl_api *a = &kl_nvrtc;
  kl_prog p = NULL;
  char file[GC_NAMELEN + 4], *log = NULL;
  const char *lowered = NULL;
  size_t n = 0;
  gcap_status st = GCAP_OK;
  int r;
  snprintf(file, sizeof file, "%s.cu", k->name);
  if ((r = a->create(&p, src, file, 0, NULL, NULL)) != 0)
    return gc_fail(e, GCAP_EINVAL, "kernel '%s': nvrtcCreateProgram: %s", k->name, a->errstr(r));
  if ((r = a->add_name(p, k->name)) == 0) r = a->compile(p, nopts, opts);
  if (r != 0) {
    if (a->log_size(p, &n) == 0 && (log = (char *)gc_malloc(n + 1)) != NULL && a->log(p, log) == 0)
      log[n] = '\0';
    st = gc_fail(e, GCAP_EINVAL, "kernel '%s' does not compile (%s):\n%s", k->name, a->errstr(r),
                 log ? log : "(no log)");
    free(log);
  } else if (a->lowered(p, k->name, &lowered) != 0 || lowered == NULL)
    st = gc_fail(e, GCAP_EINVAL, "kernel '%s': no __global__ function of that name", k->name);
  else if ((k->lowered = kl_strdup(lowered)) == NULL || a->ptx_size(p, &n) != 0 ||
           (k->ptx = (char *)gc_malloc(n)) == NULL || a->ptx(p, k->ptx) != 0)
    st = gc_fail(e, GCAP_ENOMEM, "kernel '%s': out of host memory", k->name);
  a->destroy(&p);
  return st;
}

#define KL_EINVALID 1 /* CUDA_ERROR_INVALID_VALUE: no parameter of that index */

/* Check k's parameter types against the compiled function's parameters,
** where the driver tells them (cuFuncGetParamInfo: CUDA 12.4 and later;
** another error than an index out of range: it cannot tell). */
static gcap_status kl_check_params(gcap_kernel *k) {
  size_t off, size;
  int i, r = 0;
  if (kl_cuda.param_info == NULL) return GCAP_OK;
  for (i = 0; i <= k->nparams; i++) {
    if ((r = kl_cuda.param_info(k->fn, (size_t)i, &off, &size)) != 0) break;
    if (i < k->nparams && size != gc_kparam_size(k->params[i]))
      return gc_fail(k->e, GCAP_EINVAL,
                     "kernel '%s': parameter %d is %zu bytes in the compiled kernel, but its "
                     "signature's %s is %zu",
                     k->name, i + 1, size, gcap_kparam_name(k->params[i]),
                     gc_kparam_size(k->params[i]));
  }
  if (r != 0 && (r != KL_EINVALID || i == k->nparams)) return GCAP_OK; /* as many, or no word */
  return gc_fail(k->e, GCAP_EINVAL,
                 "kernel '%s': the compiled kernel has %s%d parameters, its "
                 "signature %d",
                 k->name, r == 0 ? "more than " : "", r == 0 ? k->nparams : i, k->nparams);
}

/* Load k's PTX on the engine's device (the runtime's current context). */
static gcap_status kl_load(gcap_kernel *k) {
  int r;
  if (!kl_load_driver())
    return gc_fail(k->e, GCAP_EUNSUPPORTED, "kernel '%s': no CUDA driver (%s)", k->name,
                   kl_cuda.why);
  if ((r = kl_cuda.load(&k->mod, k->ptx)) != 0) {
    k->mod = NULL;
    return gc_fail(k->e, GCAP_EDEVICE, "kernel '%s': cuModuleLoadData: %s", k->name, kl_drverr(r));
  }
  if ((r = kl_cuda.function(&k->fn, k->mod, k->lowered)) != 0)
    return gc_fail(k->e, GCAP_EDEVICE, "kernel '%s': cuModuleGetFunction: %s", k->name,
                   kl_drverr(r));
  return kl_check_params(k);
}

gcap_status gcap_kernel_new(gcap_engine *e, const char *source, const char *name, int nopts,
                            const char *const *opts, int nparams, const gcap_kparam *params,
                            gcap_kernel **out) {
  gcap_kernel *k;
  gcap_status st;
  int i;
  if (out != NULL) *out = NULL;
  if (e == NULL) return GCAP_EINVAL;
  if ((st = gc_check_open(e, "gcap_kernel_new")) != GCAP_OK) return st;
  if (out == NULL) return gc_null(e, "gcap_kernel_new", "out");
  if (source == NULL) return gc_null(e, "gcap_kernel_new", "source");
  if (name == NULL) return gc_null(e, "gcap_kernel_new", "name");
  if (name[0] == '\0' || strlen(name) >= GC_NAMELEN)
    return gc_fail(e, GCAP_EINVAL, "gcap_kernel_new: a kernel's name must be 1 to %d bytes",
                   GC_NAMELEN - 1);
  if (nopts < 0) return gc_bad_count(e, "gcap_kernel_new", "nopts", nopts);
  if (nopts > 0 && opts == NULL) return gc_null(e, "gcap_kernel_new", "opts");
  if (params != NULL && nparams < 0) return gc_bad_count(e, "gcap_kernel_new", "nparams", nparams);
  for (i = 0; i < nopts; i++)
    if (opts[i] == NULL)
      return gc_fail(e, GCAP_EINVAL, "kernel '%s': option #%d is NULL", name, i + 1);
  if (params != NULL && nparams > GC_KMAXPARAMS)
    return gc_fail(e, GCAP_EINVAL, "kernel '%s': %d parameters; at most %d", name, nparams,
                   GC_KMAXPARAMS);
  for (i = 0; params != NULL && i < nparams; i++)
    if (gcap_kparam_name(params[i]) == NULL)
      return gc_fail(e, GCAP_EINVAL, "kernel '%s': parameter %d has no type (%d)", name, i + 1,
                     (int)params[i]);
  if (!kl_load_nvrtc())
    return gc_fail(e, GCAP_EUNSUPPORTED, "kernel '%s': NVRTC is not available (%s)", name,
                   kl_nvrtc.why);
  if ((k = (gcap_kernel *)gc_calloc(1, sizeof *k)) == NULL)
    return gc_fail(e, GCAP_ENOMEM, "kernel '%s': out of host memory", name);
  k->refs = 1;
  k->e = e;
  gc_engine_ref(e);
  snprintf(k->name, sizeof k->name, "%s", name);
  snprintf(k->label, sizeof k->label, "kernel '%s'", name);
  st = kl_compile(k, source, nopts, opts);
  if (st == GCAP_OK && params != NULL) {
    k->nparams = nparams;
    memcpy(k->params, params, (size_t)nparams * sizeof *params);
  } else if (st == GCAP_OK)
    st = gc_kparam_parse(e, source, name, &k->nparams, k->params);
  if (st == GCAP_OK && e->be == gc_cuda_backend()) st = kl_load(k);
  if (st != GCAP_OK) {
    kl_release(k);
    return st;
  }
  *out = k;
  return GCAP_OK;
}

gcap_status gcap_kernel_params(const gcap_kernel *k, int *nparams, const gcap_kparam **params) {
  if (k == NULL) return GCAP_EINVAL;
  gc_clear(k->e);
  if (nparams == NULL) return gc_null(k->e, k->label, "nparams");
  if (params == NULL) return gc_null(k->e, k->label, "params");
  *nparams = k->nparams;
  *params = k->params;
  return GCAP_OK;
}

/* Convert args[nargs] for k's parameters into val and out (may be NULL). */
static gcap_status kl_convert(gcap_kernel *k, int nargs, const gcap_karg *args, gc_kval *val,
                              gcap_karg *out) {
  gcap_karg conv;
  gcap_status st;
  int i;
  if (nargs != k->nparams)
    return gc_fail(k->e, GCAP_EINVAL, "kernel '%s' takes %d arguments, got %d", k->name, k->nparams,
                   nargs);
  for (i = 0; i < nargs; i++) {
    if ((st = gc_karg_convert(k->e, k->name, i, k->params[i], &args[i], &val[i], &conv)) != GCAP_OK)
      return st;
    if (out != NULL) out[i] = conv;
  }
  return GCAP_OK;
}

gcap_status gcap_kernel_args(gcap_kernel *k, int nargs, const gcap_karg *args, gcap_karg *out) {
  gc_kval val[GC_KMAXPARAMS];
  if (k == NULL) return GCAP_EINVAL;
  gc_clear(k->e);
  if (nargs < 0) return gc_bad_count(k->e, k->label, "nargs", nargs);
  if (nargs > 0 && args == NULL) return gc_null(k->e, k->label, "args");
  if (nargs > 0 && out == NULL) return gc_null(k->e, k->label, "out");
  return kl_convert(k, nargs, args, val, out);
}

/* One launch: the kernel, its dimensions and its arguments by value. */
typedef struct kl_launch {
  gcap_kernel *k;
  unsigned grid[3], block[3], shmem;
  gc_kval val[GC_KMAXPARAMS];
  void *params[GC_KMAXPARAMS]; /* &val[i] */
  gcap_custom_fn host;
  void *host_ud;
  void (*host_ud_free)(void *ud);
} kl_launch;

static void kl_launch_free(void *ud) {
  kl_launch *l = (kl_launch *)ud;
  if (l->host_ud_free) l->host_ud_free(l->host_ud);
  kl_release(l->k);
  free(l);
}

static gcap_status kl_cuda_fn(void *ud, void *stream, int nin, const gcap_custom_arg *in, int nout,
                              const gcap_custom_arg *out) {
  kl_launch *l = (kl_launch *)ud;
  (void)nin, (void)in, (void)nout, (void)out;
  if (l->k->fn == NULL) return GCAP_EUNSUPPORTED;
  return kl_cuda.launch(l->k->fn, l->grid[0], l->grid[1], l->grid[2], l->block[0], l->block[1],
                        l->block[2], l->shmem, stream, l->params, NULL) == 0
             ? GCAP_OK
             : GCAP_EDEVICE;
}

static gcap_status kl_host_fn(void *ud, void *stream, int nin, const gcap_custom_arg *in, int nout,
                              const gcap_custom_arg *out) {
  kl_launch *l = (kl_launch *)ud;
  if (l->host == NULL) return GCAP_EUNSUPPORTED;
  return l->host(l->host_ud, stream, nin, in, nout, out);
}

/* Is t among v[n]? */
static int kl_among(const gcap_tensor *t, int n, gcap_tensor *const *v) {
  int i;
  for (i = 0; i < n; i++)
    if (v[i] == t) return 1;
  return 0;
}

static gcap_status kl_check(gcap_kernel *k, const gcap_launch_desc *l) {
  gcap_engine *e = k->e;
  int i;
  for (i = 0; i < 3; i++)
    if (l->grid[i] < 1 || l->block[i] < 1)
      return gc_fail(e, GCAP_EINVAL, "kernel '%s': grid and block sizes must be at least 1",
                     k->name);
  if (l->nargs < 0) return gc_bad_count(e, k->label, "nargs", l->nargs);
  if (l->nreads < 0) return gc_bad_count(e, k->label, "nreads", l->nreads);
  if (l->nwrites < 0) return gc_bad_count(e, k->label, "nwrites", l->nwrites);
  if (l->nargs > 0 && l->args == NULL) return gc_null(e, k->label, "args");
  if (l->nreads > 0 && l->reads == NULL) return gc_null(e, k->label, "reads");
  if (l->nwrites > 0 && l->writes == NULL) return gc_null(e, k->label, "writes");
  for (i = 0; i < l->nreads + l->nwrites; i++) {
    const gcap_tensor *t = i < l->nreads ? l->reads[i] : l->writes[i - l->nreads];
    if (t == NULL || t->e != e)
      return gc_fail(e, GCAP_EINVAL, "kernel '%s': %s #%d is %s", k->name,
                     i < l->nreads ? "read" : "write", i < l->nreads ? i + 1 : i - l->nreads + 1,
                     t ? "of another engine" : "NULL");
  }
  for (i = 0; i < l->nargs; i++) {
    const gcap_karg *a = &l->args[i];
    if (a->kind == GCAP_KARG_TENSOR && !kl_among(a->t, l->nreads, l->reads) &&
        !kl_among(a->t, l->nwrites, l->writes))
      return gc_fail(e, GCAP_EINVAL,
                     "kernel '%s': tensor argument #%d is in neither reads nor writes", k->name,
                     i + 1);
  }
  return GCAP_OK;
}

gcap_status gcap_kernel_launch(gcap_kernel *k, const gcap_launch_desc *l) {
  gcap_engine *e;
  gcap_custom_desc d;
  gcap_custom_op *op = NULL;
  kl_launch *kl;
  gcap_status st;
  int i;
  if (k == NULL || l == NULL) {
    if (l != NULL && l->host_ud_free) l->host_ud_free(l->host_ud);
    return k ? gc_null(k->e, "kernel launch", "l") : GCAP_EINVAL;
  }
  e = k->e;
  gc_clear(e);
  kl = NULL;
  if ((st = kl_check(k, l)) == GCAP_OK && (kl = (kl_launch *)gc_calloc(1, sizeof *kl)) == NULL)
    st = gc_fail(e, GCAP_ENOMEM, "kernel '%s': out of host memory", k->name);
  if (st == GCAP_OK) st = kl_convert(k, l->nargs, l->args, kl->val, NULL);
  if (st == GCAP_OK && l->host == NULL && e->be == gc_host_backend())
    st = gc_fail(e, GCAP_EUNSUPPORTED,
                 "kernel '%s': a launch on the host backend needs a host twin", k->name);
  if (st != GCAP_OK) {
    free(kl);
    if (l->host_ud_free) l->host_ud_free(l->host_ud);
    return st;
  }
  kl->k = k;
  k->refs++;
  memcpy(kl->grid, l->grid, sizeof kl->grid);
  memcpy(kl->block, l->block, sizeof kl->block);
  kl->shmem = l->shmem;
  for (i = 0; i < l->nargs; i++)
    kl->params[i] = &kl->val[i];
  kl->host = l->host;
  kl->host_ud = l->host_ud;
  kl->host_ud_free = l->host_ud_free;
  memset(&d, 0, sizeof d);
  d.name = k->name;
  d.cuda = kl_cuda_fn;
  d.host = l->host ? kl_host_fn : NULL;
  d.ud = kl;
  d.ud_free = kl_launch_free;
  if ((st = gcap_custom_op_new(e, &d, &op)) != GCAP_OK) return st; /* kl freed */
  st = gc_custom_launch(op, l->nreads, l->reads, l->nwrites, l->writes);
  gcap_custom_op_free(op); /* an open capture's graph keeps it */
  return st;
}
