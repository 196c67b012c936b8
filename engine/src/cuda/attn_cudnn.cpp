/*
** attn_cudnn.cpp: the fused attention through cuDNN's flash attention
** (the cuDNN frontend's graph API: sdpa forward, sdpa_backward), as PyTorch
** and TransformerEngine run it on Hopper.
**
** q, k, v, o and their grads are the engine's contiguous [BH, S, D], given
** to cuDNN as [B, H, S, D] (B = BH / H) with those strides; or, with
** GC_ATTN_PACKED, read in place from the packed [S, B, H, 3D] projection
** (and their grads written into one such tensor), o and do [S, B, H * D],
** as TransformerEngine's sbhd layouts give them, with no copies. The forward
** writes each row's log-sum-exp (cuDNN's Stats, [B, H, Sq, 1] f32) after the
** head of the engine's stats, and the backward reads it back, computing dq,
** dk and dv in one call with cuDNN's deterministic algorithm: every run,
** and every replay of a graph that captured it, gives the same bits.
**
** The frontend opens libcudnn itself (NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING)
** once libcudnn.so.9 is loaded here, so the library does not link it: where
** it is missing, attn_supported says so. A graph is built per key (sizes,
** causality, scale, dropout, layout, direction) on its first call outside a capture, with
** its own workspace, and kept until the backend shuts down: a captured
** graph replays cuDNN's kernels on that workspace, which never moves. Two
** launches of one key on streams that run at once would share it, as the
** GEMMs share cuBLAS's.
**
** Dropout draws from cuDNN's Philox generator, seeded with the engine's
** generator state {seed, offset} (copied into the head of the stats by the
** forward, read there by the backward): a replay draws what the eager call
** drew, and the engine's generator advances past it as after its own
** dropout; the weights dropped are cuDNN's, not those of the engine's own
** kernels (GC_K_DROPOUT's).
**
** Built without the frontend's headers (no GC_WITH_CUDNN), it declines every
** call, saying so.
*/
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "attn_cudnn.h"

#ifdef GC_WITH_CUDNN

#include <dlfcn.h>

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <cudnn_frontend.h>

namespace fe = cudnn_frontend;

/* The frontend finds libcudnn's functions through this handle: set once, by
** dnn_load. */
namespace cudnn_frontend {
void *cudnn_dlhandle = nullptr;
}

/* The tensors of the graphs, by uid. */
enum { U_Q = 1, U_K, U_V, U_O, U_STATS, U_DO, U_DQ, U_DK, U_DV, U_SEED, U_OFFSET };

/* What a graph is built for. */
struct dnn_key {
  int64_t b, h, sq, sk, d;
  int causal, backward, packed;
  uint32_t scale, dropout; /* the floats' bits */
  bool operator==(const dnn_key &o) const {
    return b == o.b && h == o.h && sq == o.sq && sk == o.sk && d == o.d && causal == o.causal &&
           backward == o.backward && packed == o.packed && scale == o.scale && dropout == o.dropout;
  }
};

/* A built graph and its workspace; or, where cuDNN declined the key, why. */
struct dnn_plan {
  dnn_key key;
  std::shared_ptr<fe::graph::Graph> g;
  void *ws;
  std::string why;
};

struct cu_dnn {
  cudnnHandle_t h = nullptr;
  std::vector<dnn_plan> plans;
};

/* libcudnn, loaded once a process: NULL, or why it cannot be used (said
** once on stderr too, as the reason "auto" runs the composition; each
** module's attention_stats keeps it). */
static const char *dnn_load(void) {
  static std::once_flag once;
  static std::string err;
  std::call_once(once, [] {
    void *lib = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char *m = dlerror();
      err = std::string("libcudnn.so.9 could not be loaded (") + (m ? m : "no reason given") + ")";
    } else {
      fe::cudnn_dlhandle = lib;
      try {
        size_t v = fe::detail::get_backend_version();
        if (v < 90000 || v >= 100000) err = "libcudnn.so.9 says it is version " + std::to_string(v);
      } catch (const std::exception &x) {
        err = std::string("libcudnn.so.9: ") + x.what();
      }
    }
    if (!err.empty())
      fprintf(stderr,
              "graphcap: cuDNN's fused attention is not available: %s; attn_impl \"auto\" runs "
              "the composition, \"cudnn\" is an error\n",
              err.c_str());
  });
  return err.empty() ? nullptr : err.c_str();
}

/* The key of launch arguments a (GC_K_ATTN's, or GC_K_ATTN_BWD_DQ's). */
static dnn_key dnn_key_of(const gc_kargs *a, int backward) {
  dnn_key k;
  float scale = a->f[0];
  k.h = a->n[6] > 0 ? a->n[6] : 1;
  k.b = a->n[0] / k.h, k.sq = a->n[1], k.sk = a->n[2], k.d = a->n[3];
  k.causal = (a->n[5] & GC_MASK_CAUSAL) != 0;
  k.backward = backward;
  k.packed = (a->n[5] & GC_ATTN_PACKED) != 0;
  memcpy(&k.scale, &scale, sizeof k.scale);
  memcpy(&k.dropout, &a->f[1], sizeof k.dropout);
  return k;
}

/* 1, with why, when cuDNN's attention is not for arguments a. */
#define DNN_TAKES "cuDNN's fused attention takes "
static int dnn_declines(const gc_kargs *a, char *why, size_t n) {
  static const char *const qkv[] = {"q", "k", "v"};
  const long long d = a->n[3], dv = a->n[4];
  int i;
  if (a->dt != GCAP_BF16)
    snprintf(why, n, DNN_TAKES "bf16 tensors, got f32");
  else if (a->f[1] > 0.0f && a->p[6] == NULL)
    snprintf(why, n, DNN_TAKES "dropout with the generator's state");
  else if (a->p[5] != NULL)
    snprintf(why, n, DNN_TAKES "no attn_mask (causal or none)");
  else if (d != dv)
    snprintf(why, n, DNN_TAKES "equal head dims, got D %lld and Dv %lld", d, dv);
  else if (d % 8 != 0 || d < 8 || d > 128)
    snprintf(why, n, DNN_TAKES "a head dim that is a multiple of 8 up to 128, got %lld", d);
  else if ((a->n[5] & GC_ATTN_PACKED) && a->n[1] != a->n[2])
    snprintf(why, n, DNN_TAKES "a packed qkv for self-attention only (Sq = Sk)");
  else if (a->n[0] < 1 || a->n[1] < 1 || a->n[2] < 1)
    snprintf(why, n, DNN_TAKES "non-empty q, k and v");
  else {
    for (i = 0; i < 3 && (uintptr_t)a->p[1 + i] % GC_ATTN_CUDNN_ALIGN == 0; i++)
      ;
    if (i == 3) return 0;
    snprintf(why, n, DNN_TAKES "%s at a %d-byte aligned address (not a view at another offset)",
             qkv[i], GC_ATTN_CUDNN_ALIGN);
  }
  return 1;
}

/* t as tensor uid of [b, h, s, d] stored contiguously (the stats: d = 1). */
static fe::graph::Tensor_attributes &dnn_bhsd(fe::graph::Tensor_attributes &t, int64_t uid,
                                              int64_t b, int64_t h, int64_t s, int64_t d) {
  return t.set_uid(uid).set_dim({b, h, s, d}).set_stride({h * s * d, s * d, d, 1});
}

/* t as tensor uid of [b, h, s, d] as key k lays out q, k, v and their
** grads (ways = 3), or o and do (ways = 1): contiguous, or packed, each
** (s, b, h) holding `ways` blocks of d side by side. */
static fe::graph::Tensor_attributes &dnn_operand(fe::graph::Tensor_attributes &t, int64_t uid,
                                                 const dnn_key &k, int64_t s, int ways) {
  if (!k.packed) return dnn_bhsd(t, uid, k.b, k.h, s, k.d);
  const int64_t row = ways * k.d;
  return t.set_uid(uid)
      .set_dim({k.b, k.h, s, k.d})
      .set_stride({k.h * row, row, k.b * k.h * row, 1});
}

/* The dropout's seed or offset: one int64 in device memory (the head of
** the stats, where the forward copies the generator's state). */
static std::shared_ptr<fe::graph::Tensor_attributes> dnn_rng(fe::graph::Graph &g, const char *name,
                                                             int64_t uid) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({1, 1, 1, 1})
                      .set_stride({1, 1, 1, 1})
                      .set_data_type(fe::DataType_t::INT64));
}

/* The graph of key k, not built yet. */
static std::shared_ptr<fe::graph::Graph> dnn_graph(const dnn_key &k) {
  typedef fe::graph::Tensor_attributes T;
  auto g = std::make_shared<fe::graph::Graph>();
  float scale, p;
  memcpy(&scale, &k.scale, sizeof scale);
  memcpy(&p, &k.dropout, sizeof p);
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto q = g->tensor(dnn_operand(T().set_name("q"), U_Q, k, k.sq, 3));
  auto kt = g->tensor(dnn_operand(T().set_name("k"), U_K, k, k.sk, 3));
  auto v = g->tensor(dnn_operand(T().set_name("v"), U_V, k, k.sk, 3));
  if (!k.backward) {
    auto opt = fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(true);
    opt.set_attn_scale(scale);
    if (p > 0.0f) opt.set_dropout(p, dnn_rng(*g, "seed", U_SEED), dnn_rng(*g, "offset", U_OFFSET));
    if (k.causal) /* key j > query i masked out */
      opt.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
          .set_diagonal_band_right_bound(0);
    auto [o, stats] = g->sdpa(q, kt, v, opt);
    dnn_operand(o->set_output(true), U_O, k, k.sq, 1);
    dnn_bhsd(stats->set_output(true).set_data_type(fe::DataType_t::FLOAT), U_STATS, k.b, k.h, k.sq,
             1);
    return g;
  }
  auto o = g->tensor(dnn_operand(T().set_name("o"), U_O, k, k.sq, 1));
  auto dO = g->tensor(dnn_operand(T().set_name("do"), U_DO, k, k.sq, 1));
  auto stats = g->tensor(dnn_bhsd(T().set_name("stats").set_data_type(fe::DataType_t::FLOAT),
                                  U_STATS, k.b, k.h, k.sq, 1));
  auto opt = fe::graph::SDPA_backward_attributes().set_name("sdpa_backward");
  opt.set_attn_scale(scale).set_deterministic_algorithm(true);
  if (p > 0.0f) opt.set_dropout(p, dnn_rng(*g, "seed", U_SEED), dnn_rng(*g, "offset", U_OFFSET));
  if (k.causal)
    opt.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT).set_diagonal_band_right_bound(0);
  auto [dq, dk, dv] = g->sdpa_backward(q, kt, v, o, dO, stats, opt);
  dnn_operand(dq->set_output(true), U_DQ, k, k.sq, 3);
  dnn_operand(dk->set_output(true), U_DK, k, k.sk, 3);
  dnn_operand(dv->set_output(true), U_DV, k, k.sk, 3);
  return g;
}

/* The cached plan of key k, or NULL. */
static const dnn_plan *dnn_find(const cu_dnn *d, const dnn_key &k) {
  for (const dnn_plan &p : d->plans)
    if (p.key == k) return &p;
  return nullptr;
}

/* The plan of key k: the cached one, or (outside a capture) a new one,
** built with its workspace; NULL with why when there is none to use. A
** key cuDNN declines is kept with its reason; a workspace that could not be
** allocated is not (a later call tries again). */
static const dnn_plan *dnn_plan_of(cu_dnn *d, const dnn_key &k, int capturing, std::string &why) {
  const dnn_plan *c = dnn_find(d, k);
  if (c != nullptr) {
    why = c->why;
    return c->g ? c : nullptr;
  }
  if (capturing) {
    why = "a capture is open, and cuDNN's graphs are built outside captures (call it once before "
          "capturing: make_graphed_callables' warmup does)";
    return nullptr;
  }
  dnn_plan p{k, dnn_graph(k), nullptr, ""};
  int64_t bytes = 0;
  fe::error_t st = p.g->build(d->h, {fe::HeurMode_t::A});
  if (st.is_good()) st = p.g->get_workspace_size(bytes);
  if (st.is_bad()) {
    p.g.reset();
    p.why = "cuDNN cannot build it: " + st.get_message();
  } else if (bytes > 0 && cudaMalloc(&p.ws, (size_t)bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    why = "cudaMalloc of cuDNN's workspace (" + std::to_string(bytes) + " bytes) failed";
    return nullptr;
  }
  d->plans.push_back(p);
  why = p.why;
  return p.g ? &d->plans.back() : nullptr;
}

/* dnn_plan_of for the forward, and the backward too when asked; the
** handle made first. */
static int dnn_prepare(cu_dnn *d, const gc_kargs *a, int backward, int capturing,
                       std::string &why) {
  if (d->h == nullptr) {
    if (capturing) {
      why = "a capture is open, and cuDNN's handle is made outside captures (call it once before "
            "capturing: make_graphed_callables' warmup does)";
      return 0;
    }
    cudnnStatus_t cs = fe::detail::create_handle(&d->h);
    if (cs != CUDNN_STATUS_SUCCESS) {
      d->h = nullptr;
      why = std::string("cudnnCreate failed: ") + fe::detail::get_error_string(cs);
      return 0;
    }
  }
  return dnn_plan_of(d, dnn_key_of(a, 0), capturing, why) != nullptr &&
         (!backward || dnn_plan_of(d, dnn_key_of(a, 1), capturing, why) != nullptr);
}

int cu_dnn_supported(cu_dnn **d, const gc_kargs *a, int backward, int capturing, char *why,
                     size_t n) {
  const char *err;
  std::string no;
  int ok = 0;
  if (dnn_declines(a, why, n)) return 0;
  if ((err = dnn_load()) != nullptr) return snprintf(why, n, "%s", err), 0;
  try {
    if (*d == nullptr) *d = new cu_dnn;
    ok = dnn_prepare(*d, a, backward, capturing, no);
  } catch (const std::exception &x) {
    no = std::string("cuDNN's frontend failed: ") + x.what();
  }
  if (!ok) snprintf(why, n, "%s", no.c_str());
  return ok;
}

/* The pointers of a launch, by uid; with dropout, its seed and offset from
** the head of the stats. */
static std::unordered_map<int64_t, void *> dnn_pack(int k, const gc_kargs *a) {
  std::unordered_map<int64_t, void *> m;
  uint64_t *head;
  if (k == GC_K_ATTN) {
    m = {{U_O, a->p[0]},
         {U_Q, a->p[1]},
         {U_K, a->p[2]},
         {U_V, a->p[3]},
         {U_STATS, (float *)a->p[4] + GC_ATTN_HEAD}};
    head = (uint64_t *)a->p[4];
  } else {
    m = {{U_DQ, a->p[0]}, {U_DO, a->p[1]}, {U_Q, a->p[2]},
         {U_K, a->p[3]},  {U_V, a->p[4]},  {U_STATS, (float *)a->p[5] + GC_ATTN_HEAD},
         {U_O, a->p[7]},  {U_DK, a->p[8]}, {U_DV, a->p[9]}};
    head = (uint64_t *)a->p[5];
  }
  if (a->f[1] > 0.0f) m[U_SEED] = head, m[U_OFFSET] = head + 1;
  return m;
}

gcap_status cu_dnn_run(gcap_engine *e, cu_dnn *d, cudaStream_t s, int k, const gc_kargs *a) {
  const char *name = gc_kernel_name(k);
  if (k == GC_K_ATTN_BWD_DKV)
    return gc_fail(e, GCAP_EINVAL, "cuda: %s with cuDNN: attn_bwd_dq's launch computed dk, dv",
                   name);
  try {
    const dnn_plan *p = d ? dnn_find(d, dnn_key_of(a, k != GC_K_ATTN)) : nullptr;
    if (p == nullptr || !p->g)
      return gc_fail(e, GCAP_EINVAL, "cuda: %s with cuDNN, which has no graph for it", name);
    cudnnStatus_t cs = fe::detail::set_stream(d->h, s);
    if (cs != CUDNN_STATUS_SUCCESS)
      return gc_fail(e, GCAP_EDEVICE, "cuda: %s: cudnnSetStream: %s", name,
                     fe::detail::get_error_string(cs));
    std::unordered_map<int64_t, void *> pack = dnn_pack(k, a);
    /* the forward keeps the generator's {seed, offset} in the head of the
    ** stats, for itself and for the backward */
    if (k == GC_K_ATTN && a->f[1] > 0.0f) {
      cudaError_t ce =
          cudaMemcpyAsync(a->p[4], a->p[6], 2 * sizeof(uint64_t), cudaMemcpyDeviceToDevice, s);
      if (ce != cudaSuccess) {
        (void)cudaGetLastError();
        return gc_fail(e, GCAP_EDEVICE, "cuda: %s: the copy of the dropout's state failed: %s",
                       name, cudaGetErrorString(ce));
      }
    }
    fe::error_t st = p->g->execute(d->h, pack, p->ws);
    if (st.is_bad())
      return gc_fail(e, GCAP_EDEVICE, "cuda: %s: cuDNN's execute failed: %s", name,
                     st.get_message().c_str());
  } catch (const std::exception &x) {
    return gc_fail(e, GCAP_EDEVICE, "cuda: %s: cuDNN's frontend failed: %s", name, x.what());
  }
  return GCAP_OK;
}

void cu_dnn_free(cu_dnn *d) {
  if (d == nullptr) return;
  for (dnn_plan &p : d->plans) {
    p.g.reset();
    if (p.ws) (void)cudaFree(p.ws);
  }
  d->plans.clear();
  if (d->h) (void)fe::detail::destroy_handle(d->h);
  delete d;
}

#else /* built without the cuDNN frontend's headers */

int cu_dnn_supported(cu_dnn **d, const gc_kargs *a, int backward, int capturing, char *why,
                     size_t n) {
  (void)d, (void)a, (void)backward, (void)capturing;
  snprintf(why, n,
           "this build has no cuDNN (the cuDNN frontend's headers were not found in "
           ".deps/cudnn-frontend: scripts/setup.sh fetches them; then rebuild)");
  return 0;
}

gcap_status cu_dnn_run(gcap_engine *e, cu_dnn *d, cudaStream_t s, int k, const gc_kargs *a) {
  (void)d, (void)s, (void)a;
  return gc_fail(e, GCAP_EUNSUPPORTED, "cuda: %s with cuDNN: this build has no cuDNN",
                 gc_kernel_name(k));
}

void cu_dnn_free(cu_dnn *d) {
  (void)d;
}

#endif
