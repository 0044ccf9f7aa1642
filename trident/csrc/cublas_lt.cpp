#include "check.h"
#include "cublas_lt.h"

#include <ATen/EmptyTensor.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/Allocator.h>

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <dlfcn.h>

#include <chrono>

#include <map>
#include <vector>
#include <type_traits>
#include <utility>

namespace trident::blas {
namespace {

// The subset of cublasLt.h / library_types.h used here (values from the CUDA 12/13 headers).
using Status = int;
using Handle = void*;
using Desc = void*;
using Layout = void*;
using Pref = void*;
struct Algo {
  uint64_t data[8];
};
struct HeuristicResult {
  Algo algo;
  size_t workspace_size;
  Status state;
  float waves_count;
  int reserved[4];
};
constexpr int CUDA_R_16F = 2, CUDA_R_32F = 0, CUDA_R_16BF = 14;
constexpr int CUBLAS_COMPUTE_32F = 68;
constexpr int DESC_TRANSA = 3, DESC_TRANSB = 4;
constexpr int PREF_MAX_WORKSPACE_BYTES = 1, PREF_REDUCTION_SCHEME_MASK = 3;
constexpr int PREF_MIN_ALIGNMENT_A = 5, PREF_MIN_ALIGNMENT_B = 6, PREF_MIN_ALIGNMENT_C = 7, PREF_MIN_ALIGNMENT_D = 8;
constexpr uint32_t REDUCTION_NONE = 0, REDUCTION_COMPUTE_TYPE = 2;
constexpr int OP_N = 0, OP_T = 1;
constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // cuBLAS' recommendation for Hopper

struct Api {
  Status (*create)(Handle*);
  Status (*desc_create)(Desc*, int, int);
  Status (*desc_set)(Desc, int, const void*, size_t);
  Status (*layout_create)(Layout*, int, uint64_t, uint64_t, int64_t);
  Status (*pref_create)(Pref*);
  Status (*pref_set)(Pref, int, const void*, size_t);
  Status (*pref_destroy)(Pref);
  Status (*desc_destroy)(Desc);
  Status (*layout_destroy)(Layout);
  Status (*heuristic)(Handle, Desc, Layout, Layout, Layout, Layout, Pref, int, HeuristicResult*, int*);
  Status (*matmul)(Handle, Desc, const void*, const void*, Layout, const void*, Layout, const void*, const void*,
                   Layout, void*, Layout, const Algo*, void*, size_t, void*);
  const char* (*status_name)(Status);
  bool ok = false;
};

const Api& api() {
  static Api a;
  static std::once_flag once;
  std::call_once(once, [] {
    void* h = nullptr;
    // Prefer the library torch already loaded (same version as its cuBLAS calls).
    for (const char* name : {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so.11", "libcublasLt.so"}) {
      if ((h = dlopen(name, RTLD_NOW | RTLD_NOLOAD))) break;
    }
    for (const char* name : {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"}) {
      if (h || (h = dlopen(name, RTLD_NOW | RTLD_LOCAL))) break;
    }
    if (!h) return;
    bool all = true;
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
      all = all && fn != nullptr;
    };
    sym(a.create, "cublasLtCreate");
    sym(a.desc_create, "cublasLtMatmulDescCreate");
    sym(a.desc_set, "cublasLtMatmulDescSetAttribute");
    sym(a.layout_create, "cublasLtMatrixLayoutCreate");
    sym(a.pref_create, "cublasLtMatmulPreferenceCreate");
    sym(a.pref_set, "cublasLtMatmulPreferenceSetAttribute");
    sym(a.pref_destroy, "cublasLtMatmulPreferenceDestroy");
    sym(a.desc_destroy, "cublasLtMatmulDescDestroy");
    sym(a.layout_destroy, "cublasLtMatrixLayoutDestroy");
    sym(a.heuristic, "cublasLtMatmulAlgoGetHeuristic");
    sym(a.matmul, "cublasLtMatmul");
    a.status_name = reinterpret_cast<const char* (*)(Status)>(dlsym(h, "cublasLtGetStatusName"));
    a.ok = all;
  });
  return a;
}

void check(Status s, const char* what) {
  if (s == 0) return;
  const char* name = api().status_name ? api().status_name(s) : nullptr;
  TRIDENT_CHECK(false, "trident: cuBLASLt ", what, " failed with status ", s, " (", name ? name : "?", ")");
}

// One cuBLASLt handle per device (handles are not bound to a stream).
Handle handle_for(int64_t device) {
  static std::array<std::atomic<Handle>, 64> handles{};
  static std::mutex mutex;
  TRIDENT_CHECK(device >= 0 && device < 64, "trident: CUDA device index ", device, " out of range");
  Handle h = handles[device].load(std::memory_order_acquire);
  if (h) return h;
  std::lock_guard<std::mutex> lock(mutex);
  if (!(h = handles[device].load())) {
    check(api().create(&h), "cublasLtCreate");
    handles[device].store(h, std::memory_order_release);
  }
  return h;
}

// One workspace per (device, stream): calls on one stream are ordered, so they can share it.
// The hit path asks for the same (device, stream) call after call: a per-thread memo of the last
// answer keeps the table's lock and lookup off it (table entries are never freed).
void* workspace_from_table(int64_t device, void* stream);

// Note [Graph replay]: while a graph is recorded, its gemms use the caller's stream's workspace.
thread_local void* tls_workspace_stream = nullptr;

void* workspace_for(int64_t device, void* stream) {
  if (tls_workspace_stream) stream = tls_workspace_stream;
  thread_local int64_t last_device = -1;
  thread_local void* last_stream = nullptr;
  thread_local void* last_workspace = nullptr;
  if (last_workspace && last_device == device && last_stream == stream) return last_workspace;
  last_workspace = workspace_from_table(device, stream);
  last_device = device;
  last_stream = stream;
  return last_workspace;
}

void* workspace_from_table(int64_t device, void* stream) {
  static std::mutex mutex;
  static auto* table = new std::map<std::pair<int64_t, void*>, at::Tensor>();  // never destroyed
  std::lock_guard<std::mutex> lock(mutex);
  auto it = table->find({device, stream});
  if (it == table->end()) {
    at::Tensor t = at::detail::empty_generic({static_cast<int64_t>(kWorkspaceBytes)}, c10::GetAllocator(c10::DeviceType::CUDA),
                                             c10::DispatchKeySet(c10::DispatchKey::CUDA), at::kByte, std::nullopt);
    it = table->emplace(std::make_pair(device, stream), std::move(t)).first;
  }
  return it->second.data_ptr();
}

template <typename T>
int reduction_code(T v) {  // torch >= 2.8 returns CuBLASReductionOption, older a bool
  if constexpr (std::is_same_v<T, bool>) {
    return v ? 0 : 2;
  } else {
    return static_cast<int>(v);
  }
}

int alignment(const void* p) {
  uintptr_t a = reinterpret_cast<uintptr_t>(p);
  int align = 1;
  while (align < 256 && (a % (2 * align)) == 0) align *= 2;
  return align;
}

// How a row-major-indexed 2-D tensor X[r, c] is seen by column-major cuBLAS as op(M) = X^T.
struct Operand {
  int op = OP_N;
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
  bool ok = false;
};

Operand transposed_view(const at::Tensor& x) {
  const int64_t r = x.size(0), c = x.size(1), sr = x.stride(0), sc = x.stride(1);
  if (sc == 1 || c == 1) {  // row-major: the memory is X^T, column-major [c, r]
    const int64_t ld = r == 1 ? std::max<int64_t>(c, 1) : sr;
    if (ld >= std::max<int64_t>(c, 1)) return {OP_N, static_cast<uint64_t>(c), static_cast<uint64_t>(r), ld, true};
  }
  if (sr == 1 || r == 1) {  // column-major: the memory is X, column-major [r, c]; op T gives X^T
    const int64_t ld = c == 1 ? std::max<int64_t>(r, 1) : sc;
    if (ld >= std::max<int64_t>(r, 1)) return {OP_T, static_cast<uint64_t>(r), static_cast<uint64_t>(c), ld, true};
  }
  return {};  // neither dimension is unit-stride: ATen copies it first, so let ATen do it
}

}  // namespace

struct Plan {
  // key
  at::ScalarType dtype;
  int64_t device, m, n, k;
  Operand a, b;  // cuBLAS operands: A = weight side (our b^T), B = our a^T
  int align_a, align_b, align_d;
  int reduction;
  // resolved
  Desc desc = nullptr;
  Layout la = nullptr, lb = nullptr, ld = nullptr;
  Algo algo{};
  size_t workspace = 0;

  bool matches(at::ScalarType dt, int64_t dev, int64_t m_, int64_t n_, int64_t k_, const Operand& oa, const Operand& ob,
               int aa, int ab, int ad, int red) const {
    return dtype == dt && device == dev && m == m_ && n == n_ && k == k_ && a.op == oa.op && a.ld == oa.ld &&
           b.op == ob.op && b.ld == ob.ld && align_a <= aa && align_b <= ab && align_d <= ad && reduction == red;
  }
};

bool available() { return api().ok; }

// Note [Recycled table slots]: an operator entry recycled takes its plans with it.
GemmCache::~GemmCache() {
  for (auto& slot : plans) {
    Plan* p = slot.exchange(nullptr);
    if (!p) continue;
    if (api().ok) {
      if (p->desc) api().desc_destroy(p->desc);
      for (Layout l : {p->la, p->lb, p->ld})
        if (l) api().layout_destroy(l);
    }
    delete p;
  }
}

namespace {

Plan* build_plan(at::ScalarType dtype, int64_t device, int64_t m, int64_t n, int64_t k, const Operand& oa,
                 const Operand& ob, int aa, int ab, int ad, int red, std::vector<HeuristicResult>* ranked = nullptr) {
  const Api& x = api();
  const int dt = dtype == at::kBFloat16 ? CUDA_R_16BF : CUDA_R_16F;
  auto p = std::make_unique<Plan>();
  p->dtype = dtype;
  p->device = device;
  p->m = m;
  p->n = n;
  p->k = k;
  p->a = oa;
  p->b = ob;
  p->align_a = aa;
  p->align_b = ab;
  p->align_d = ad;
  p->reduction = red;
  check(x.desc_create(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  check(x.desc_set(p->desc, DESC_TRANSA, &oa.op, sizeof(int)), "set TRANSA");
  check(x.desc_set(p->desc, DESC_TRANSB, &ob.op, sizeof(int)), "set TRANSB");
  check(x.layout_create(&p->la, dt, oa.rows, oa.cols, oa.ld), "layout A");
  check(x.layout_create(&p->lb, dt, ob.rows, ob.cols, ob.ld), "layout B");
  check(x.layout_create(&p->ld, dt, n, m, n), "layout D");  // out [m, n] row-major = D [n, m] col-major
  Pref pref = nullptr;
  check(x.pref_create(&pref), "cublasLtMatmulPreferenceCreate");
  uint64_t ws = kWorkspaceBytes;
  check(x.pref_set(pref, PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)), "set workspace");
  if (red != 0) {
    uint32_t mask = red == 1 ? REDUCTION_COMPUTE_TYPE : REDUCTION_NONE;
    check(x.pref_set(pref, PREF_REDUCTION_SCHEME_MASK, &mask, sizeof(mask)), "set reduction mask");
  }
  uint32_t al[4] = {static_cast<uint32_t>(aa), static_cast<uint32_t>(ab), static_cast<uint32_t>(ad), static_cast<uint32_t>(ad)};
  check(x.pref_set(pref, PREF_MIN_ALIGNMENT_A, &al[0], 4), "set alignment A");
  check(x.pref_set(pref, PREF_MIN_ALIGNMENT_B, &al[1], 4), "set alignment B");
  check(x.pref_set(pref, PREF_MIN_ALIGNMENT_C, &al[2], 4), "set alignment C");
  check(x.pref_set(pref, PREF_MIN_ALIGNMENT_D, &al[3], 4), "set alignment D");
  // Room for one result of any future, larger record layout; the prefix read below is stable.
  alignas(16) unsigned char results[4096] = {};
  const int requested = ranked ? static_cast<int>(sizeof(results) / sizeof(HeuristicResult)) - 8 : 1;
  int found = 0;
  Status s = x.heuristic(handle_for(device), p->desc, p->la, p->lb, p->ld, p->ld, pref, requested,
                         reinterpret_cast<HeuristicResult*>(results), &found);
  if (ranked && s == 0)
    for (int i = 0; i < found; ++i) ranked->push_back(reinterpret_cast<const HeuristicResult*>(results)[i]);
  x.pref_destroy(pref);
  if (s != 0 || found == 0) return nullptr;  // no algorithm: ATen decides
  const auto* result = reinterpret_cast<const HeuristicResult*>(results);
  p->algo = result->algo;
  p->workspace = result->workspace_size;
  return p.release();  // owned by the cache, never freed (like the runtime tables)
}

}  // namespace

bool try_mm(GemmCache& cache, const at::Tensor& a, const at::Tensor& b, int64_t device, void* stream,
            at::Tensor& out, const at::Tensor* c) {
  if (!a.defined() || !b.defined() || a.dim() != 2 || b.dim() != 2) return false;
  const at::ScalarType dtype = a.scalar_type();
  if ((dtype != at::kBFloat16 && dtype != at::kHalf) || b.scalar_type() != dtype) return false;
  if (a.layout() != at::kStrided || b.layout() != at::kStrided || !a.is_cuda() || !b.is_cuda()) return false;
  if (a.device().index() != device || b.device().index() != device) return false;
  if (at::GradMode::is_enabled() && (a.requires_grad() || b.requires_grad())) return false;
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  if (b.size(0) != k || m <= 0 || n <= 0 || k <= 0) return false;
  if (dtype == at::kHalf && at::globalContext().allowFP16AccumulationCuBLAS()) return false;  // fp16 accumulation
  if (c) {  // C: the same [m, n] row-major layout as D (layout D serves both)
    if (!c->defined() || c->dim() != 2 || c->scalar_type() != dtype || c->layout() != at::kStrided || !c->is_cuda() ||
        c->device().index() != device || c->size(0) != m || c->size(1) != n)
      return false;
    if ((c->stride(1) != 1 && n != 1) || (c->stride(0) != n && m != 1)) return false;
    if (at::GradMode::is_enabled() && c->requires_grad()) return false;
  }
  if (!api().ok) return false;
  // cuBLAS computes D[n, m] = op(A)[n, k] * op(B)[k, m] with A = b^T-view, B = a^T-view.
  const Operand oa = transposed_view(b), ob = transposed_view(a);
  if (!oa.ok || !ob.ok) {
    cache.declined.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  const int red = dtype == at::kBFloat16 ? reduction_code(at::globalContext().allowBF16ReductionCuBLAS())
                                         : reduction_code(at::globalContext().allowFP16ReductionCuBLAS());
  const int aa = alignment(b.data_ptr()), ab = alignment(a.data_ptr());
  out = at::detail::empty_generic({m, n}, c10::GetAllocator(c10::DeviceType::CUDA),
                                  c10::DispatchKeySet(c10::DispatchKey::CUDA), dtype, std::nullopt);
  // with C apart from D, the plan's C/D alignment is the smaller of the two
  const int ad = c ? std::min(alignment(out.data_ptr()), alignment(c->data_ptr())) : alignment(out.data_ptr());
  Plan* plan = nullptr;
  for (auto& slot : cache.plans) {
    Plan* p = slot.load(std::memory_order_acquire);
    if (!p) break;
    if (p->matches(dtype, device, m, n, k, oa, ob, aa, ab, ad, red)) {
      plan = p;
      break;
    }
  }
  if (!plan) {
    std::lock_guard<std::mutex> lock(cache.mutex);
    int free_slot = -1;
    for (int i = 0; i < GemmCache::kMaxPlans; ++i) {
      Plan* p = cache.plans[i].load();
      if (!p) {
        free_slot = i;
        break;
      }
      if (p->matches(dtype, device, m, n, k, oa, ob, aa, ab, ad, red)) plan = p;
    }
    if (!plan) {
      if (free_slot < 0 || !(plan = build_plan(dtype, device, m, n, k, oa, ob, aa, ab, ad, red))) {
        cache.declined.fetch_add(1, std::memory_order_relaxed);
        out = at::Tensor();
        return false;
      }
      cache.plans[free_slot].store(plan, std::memory_order_release);
    }
  }
  const float alpha = 1.0f, beta = c ? 1.0f : 0.0f;
  void* ws = plan->workspace ? workspace_for(device, stream) : nullptr;
  const void* cp = c ? c->data_ptr() : out.data_ptr();
  check(api().matmul(handle_for(device), plan->desc, &alpha, b.data_ptr(), plan->la, a.data_ptr(), plan->lb, &beta,
                     cp, plan->ld, out.data_ptr(), plan->ld, &plan->algo, ws, plan->workspace, stream),
        "cublasLtMatmul");
  cache.taken.fetch_add(1, std::memory_order_relaxed);
  return true;
}

std::vector<std::array<double, 4>> survey(const at::Tensor& a, const at::Tensor& b, int64_t iters) {
  TRIDENT_CHECK(api().ok, "trident: libcublasLt is not available");
  TRIDENT_CHECK(a.is_cuda() && b.is_cuda() && a.dim() == 2 && b.dim() == 2 && a.scalar_type() == b.scalar_type() &&
                  (a.scalar_type() == at::kBFloat16 || a.scalar_type() == at::kHalf),
              "trident: survey takes two 2-D CUDA bf16/fp16 matrices");
  const int64_t device = a.device().index(), m = a.size(0), k = a.size(1), n = b.size(1);
  const Operand oa = transposed_view(b), ob = transposed_view(a);
  TRIDENT_CHECK(oa.ok && ob.ok, "trident: survey needs unit-stride operands");
  void* stream = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(a.device()).native_handle();
  auto empty = [&] {
    return at::detail::empty_generic({m, n}, c10::GetAllocator(c10::DeviceType::CUDA),
                                     c10::DispatchKeySet(c10::DispatchKey::CUDA), a.scalar_type(), std::nullopt);
  };
  at::Tensor first = empty();
  std::vector<HeuristicResult> ranked;
  Plan* plan = build_plan(a.scalar_type(), device, m, n, k, oa, ob, alignment(b.data_ptr()), alignment(a.data_ptr()),
                          alignment(first.data_ptr()), 0, &ranked);
  TRIDENT_CHECK(plan, "trident: cuBLASLt found no algorithm");
  std::vector<std::array<double, 4>> out;
  const float alpha = 1.0f, beta = 0.0f;
  for (size_t i = 0; i < ranked.size(); ++i) {
    at::Tensor d = i == 0 ? first : empty();
    void* ws = ranked[i].workspace_size ? workspace_for(device, stream) : nullptr;
    auto run = [&] {
      return api().matmul(handle_for(device), plan->desc, &alpha, b.data_ptr(), plan->la, a.data_ptr(), plan->lb, &beta,
                          d.data_ptr(), plan->ld, d.data_ptr(), plan->ld, &ranked[i].algo, ws,
                          ranked[i].workspace_size, stream);
    };
    if (run() != 0) continue;  // this algorithm does not run here
    auto t0 = std::chrono::steady_clock::now();
    for (int64_t it = 0; it < iters; ++it) run();
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
    out.push_back({static_cast<double>(i), us, at::equal(d, first) ? 1.0 : 0.0,
                   static_cast<double>(ranked[i].workspace_size)});
  }
  return out;
}

std::vector<std::array<int64_t, 8>> plans_of(const GemmCache& cache) {
  std::vector<std::array<int64_t, 8>> out;
  for (const auto& slot : cache.plans) {
    const Plan* p = slot.load(std::memory_order_acquire);
    if (!p) break;
    out.push_back({static_cast<int64_t>(p->dtype), p->m, p->n, p->k, p->a.op, p->b.op,
                   static_cast<int64_t>(p->workspace), p->device});
  }
  return out;
}

void* reserve_workspace(int64_t device, void* stream) { return workspace_from_table(device, stream); }

void set_workspace_stream(void* stream) { tls_workspace_stream = stream; }

}  // namespace trident::blas
