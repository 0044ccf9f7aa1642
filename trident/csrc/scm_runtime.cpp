#include "check.h"
#include "scm_runtime.h"

#include <torch/extension.h>

#include <ATen/EmptyTensor.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "cuda_driver.h"

namespace py = pybind11;

namespace trident {
namespace {

// Tables never move, and their capacity is reserved up front, so the hit path can index them
// without a lock while a miss on another thread appends. They are never destroyed either: at
// exit, Python and the CUDA driver may already be gone, and entries hold Python callables and
// device tensors (cached constants).
//
// Note [Recycled table slots]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A released region's entries (Note [Released regions]) would otherwise stay for the process: a
// server that keeps replacing captures (new shapes under a capture bound, dropped modules) filled
// the 65536 slots of a table and then could plan nothing. So slots are recycled, in two steps:
//   1. when a Region object is destroyed -- after its release AND after the last call that held
//      it returned, so nothing runs it any more -- its destructor lists every entry it bound as
//      a candidate (`dead_bindings`, no GIL needed: integers under a mutex);
//   2. Python drains the candidates at a safe point, under the lock every registration and
//      binding takes (trident/runtime/native.py `recycle_entries`), and recycles those no living
//      region binds (`live_bindings` covers released regions a call still holds), dropping them
//      from its de-duplication maps first, so nothing can bind them again; the CUDA devices are
//      synchronized first (an operator's cached constant may be read on another stream than
//      the one that allocated it).
// A recycled slot is overwritten by the next `add` of its table, which the registering Python
// call makes with the GIL held: the old entry's Python objects, tensors and cuBLASLt plans go
// then, after the table's mutex is released. Kernel entries are never recycled (one per compiled
// kernel: they hold the CUDA modules loaded for it). Region slots are reused under new ids (Note
// [Region ids]).
constexpr size_t kTableCapacity = 1 << 16;

template <typename T>
struct Table {
  std::mutex mutex;
  std::vector<T> items;
  std::vector<int64_t> free;     // Note [Recycled table slots]: slots to overwrite
  std::vector<uint8_t> is_free;  // per slot: listed in `free`
  Table() { items.reserve(kTableCapacity); }
  int64_t add(T item) {
    T old{};  // a recycled entry, destroyed after the mutex is released (GIL held by the caller)
    int64_t slot;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!free.empty()) {
        slot = free.back();
        free.pop_back();
        is_free[slot] = 0;
        std::swap(old, items[slot]);
        items[slot] = std::move(item);
      } else {
        TRIDENT_CHECK(items.size() < kTableCapacity, "trident: runtime table is full (", kTableCapacity,
                      " entries); this process created too many SCM specializations");
        items.push_back(std::move(item));
        is_free.push_back(0);
        slot = static_cast<int64_t>(items.size() - 1);
      }
    }
    return slot;
  }
  void recycle(int64_t slot) {
    std::lock_guard<std::mutex> lock(mutex);
    TRIDENT_CHECK(slot >= 0 && static_cast<size_t>(slot) < items.size(), "trident: no table entry ", slot);
    if (is_free[slot]) return;
    is_free[slot] = 1;
    free.push_back(slot);
  }
  std::pair<int64_t, int64_t> usage() {  // (slots used, of which free)
    std::lock_guard<std::mutex> lock(mutex);
    return {static_cast<int64_t>(items.size()), static_cast<int64_t>(free.size())};
  }
};

Table<std::shared_ptr<Region>>& regions() {
  static auto* t = new Table<std::shared_ptr<Region>>();  // never destroyed: see above
  return *t;
}
Table<std::shared_ptr<KernelEntry>>& kernels() {
  static auto* t = new Table<std::shared_ptr<KernelEntry>>();  // never destroyed: see above
  return *t;
}
Table<AllocEntry>& allocs() {
  static auto* t = new Table<AllocEntry>();  // never destroyed: see above
  return *t;
}
Table<ViewEntry>& views() {
  static auto* t = new Table<ViewEntry>();  // never destroyed: see above
  return *t;
}
Table<HostPlan>& plans() {
  static auto* t = new Table<HostPlan>();  // never destroyed: see above
  return *t;
}
Table<std::shared_ptr<AtenEntry>>& atens() {
  static auto* t = new Table<std::shared_ptr<AtenEntry>>();  // never destroyed: see above
  return *t;
}

// Counters of the services that have no table entry of their own (Note [Host-time profile]).
enum class Service { kAlloc, kView, kHost, kCall, kCount };
ProfCounter& service_prof(Service s) {
  static auto* c = new std::array<ProfCounter, static_cast<size_t>(Service::kCount)>();  // never destroyed
  return (*c)[static_cast<size_t>(s)];
}
ProfCounter& alloc_prof() { return service_prof(Service::kAlloc); }
ProfCounter& view_prof() { return service_prof(Service::kView); }
ProfCounter& host_prof() { return service_prof(Service::kHost); }
ProfCounter& call_prof() { return service_prof(Service::kCall); }


constexpr int64_t kAllocFailed = -1;

// Note [Allocation arena]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// Every allocation of a call lives until the call returns (the value table holds it), so the
// buffers that cannot leave the region -- neither an output nor aliased by one (the plan's
// escape analysis, trident/scm/specialize.py `plan_arena`) -- are carved out of ONE allocation
// per call, at byte offsets fixed per specialization (256-byte aligned; buffers whose lifetimes
// do not overlap share bytes, `plan_arena`, so the arena is the peak of live temporaries, not
// their sum -- the steps run in order on one stream). Each is a real tensor
// sharing the arena's storage, made without dispatch like a native view. That replaces one
// caching-allocator round trip per buffer (~1 µs on CUDA) with one per call; buffers that
// leave the region keep their own allocation so that outputs never pin the arena.
at::Tensor empty_on(const AllocEntry& a, c10::IntArrayRef sizes, c10::IntArrayRef strides, at::ScalarType dtype) {
  if (a.device.is_cuda()) {
    return at::detail::empty_strided_generic(sizes, strides, c10::GetAllocator(c10::DeviceType::CUDA),
                                             c10::DispatchKeySet(c10::DispatchKey::CUDA), dtype);
  }
  if (a.device.is_cpu()) return at::detail::empty_strided_cpu(sizes, strides, dtype);
  return at::empty_strided(sizes, strides, at::TensorOptions().dtype(dtype).device(a.device));
}

int64_t rt_alloc(HostCtx* ctx, int64_t index) noexcept {
  ProfScope prof(alloc_prof());
  try {
    const AllocEntry& a = allocs().items[ctx->region->alloc_handles[index]];
    if (a.device.is_cuda() && a.device.index() != ctx->device_index) {
      ctx->error = "allocation planned on " + a.device.str() + " but the region runs on cuda:" +
                   std::to_string(ctx->device_index);
      return kAllocFailed;
    }
    at::Tensor t;
    if (a.arena_slot >= 0) {  // Note [Symbolic arena]: placed by run_plan for this call's sizes
      const int64_t rank = static_cast<int64_t>(a.sizes.size());
      if (a.dynamic && ctx->sizes == nullptr) {
        ctx->error = "allocation with symbolic sizes called without its sizes";
        return kAllocFailed;
      }
      if (a.arena_slot >= ctx->arena_count) {
        ctx->error = "arena buffer " + std::to_string(a.arena_slot) + " was not placed";
        return kAllocFailed;
      }
      if (!ctx->arena.defined()) ctx->arena = empty_on(a, {ctx->arena_total}, {1}, at::kByte);
      const int64_t item = static_cast<int64_t>(c10::elementSize(a.dtype));
      auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(ctx->arena.storage()), ctx->arena.key_set(),
                                                      caffe2::TypeMeta::fromScalarType(a.dtype));
      const int64_t offset = ctx->arena_placed[2 * a.arena_slot] / item;
      if (a.dynamic) {
        impl->set_sizes_and_strides(c10::IntArrayRef(ctx->sizes, rank), c10::IntArrayRef(ctx->sizes + rank, rank), offset);
      } else {
        impl->set_sizes_and_strides(a.sizes, a.strides, offset);
      }
      t = at::Tensor(std::move(impl));
    } else if (a.dynamic) {  // Note [Symbolic sizes]: this call's sizes, then strides
      const int64_t rank = static_cast<int64_t>(a.sizes.size());
      if (ctx->sizes == nullptr) {
        ctx->error = "allocation with symbolic sizes called without its sizes";
        return kAllocFailed;
      }
      c10::IntArrayRef sizes(ctx->sizes, rank), strides(ctx->sizes + rank, rank);
      for (int64_t d = 0; d < rank; ++d) {
        if (sizes[d] < 0) {
          ctx->error = "allocation with a negative size " + std::to_string(sizes[d]) + " at dimension " + std::to_string(d);
          return kAllocFailed;
        }
      }
      t = empty_on(a, sizes, strides, a.dtype);
    } else if (a.arena_offset >= 0) {
      if (!ctx->arena.defined()) {
        const int64_t bytes = a.arena_bytes;
        ctx->arena = empty_on(a, {bytes}, {1}, at::kByte);
      }
      const int64_t item = static_cast<int64_t>(c10::elementSize(a.dtype));
      auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(ctx->arena.storage()), ctx->arena.key_set(),
                                                      caffe2::TypeMeta::fromScalarType(a.dtype));
      impl->set_sizes_and_strides(a.sizes, a.strides, a.arena_offset / item);
      t = at::Tensor(std::move(impl));
    } else {
      // Straight to the device's allocator (what at::empty_strided ends in), no dispatch.
      t = empty_on(a, a.sizes, a.strides, a.dtype);
    }
    if (a.zero) t.zero_();
    int64_t ptr = reinterpret_cast<int64_t>(t.data_ptr());
    ctx->values[a.slot] = std::move(t);
    return ptr;
  } catch (const std::exception& e) {
    ctx->error = std::string("allocation failed: ") + e.what();
    return kAllocFailed;
  }
}

py::object decode_slot(const std::string& ty, int64_t bits) {
  if (ty[0] == '*') return py::int_(static_cast<uint64_t>(bits));
  if (ty == "i1" || ty == "u1") return py::bool_(bits & 1);
  if (ty == "i8") return py::int_(static_cast<int8_t>(bits));
  if (ty == "i16") return py::int_(static_cast<int16_t>(bits));
  if (ty == "i32") return py::int_(static_cast<int32_t>(bits));
  if (ty == "i64") return py::int_(bits);
  if (ty == "u8") return py::int_(static_cast<uint8_t>(bits));
  if (ty == "u16") return py::int_(static_cast<uint16_t>(bits));
  if (ty == "u32") return py::int_(static_cast<uint32_t>(bits));
  if (ty == "u64") return py::int_(static_cast<uint64_t>(bits));
  if (ty == "fp32") {
    float f;
    uint32_t b = static_cast<uint32_t>(bits);
    std::memcpy(&f, &b, 4);
    return py::float_(f);
  }
  if (ty == "fp64") {
    double d;
    std::memcpy(&d, &bits, 8);
    return py::float_(d);
  }
  if (ty == "fp16") {
    c10::Half h(static_cast<uint16_t>(bits), c10::Half::from_bits());
    return py::float_(static_cast<float>(h));
  }
  if (ty == "bf16") {
    c10::BFloat16 h(static_cast<uint16_t>(bits), c10::BFloat16::from_bits());
    return py::float_(static_cast<float>(h));
  }
  throw std::runtime_error("kernel parameter type '" + ty + "' has no CPU decoding");
}

int64_t launch_cpu(HostCtx* ctx, KernelEntry& k, int64_t gx, int64_t gy, int64_t gz,
                   const int64_t* slots) {
  py::gil_scoped_acquire gil;
  try {
    py::list args(k.param_types.size());
    for (size_t i = 0; i < k.param_types.size(); ++i) args[i] = decode_slot(k.param_types[i], slots[i]);
    k.cpu_runner(py::make_tuple(gx, gy, gz), args);
    return 0;
  } catch (const std::exception& e) {
    ctx->error = "kernel '" + k.name + "' failed in Triton's interpreter: " + e.what();
    return -2;
  }
}

void* load_kernel(KernelEntry& k, int64_t dev, std::string* error) {
  if (dev < 0 || dev >= KernelEntry::kMaxDevices) {
    *error = "CUDA device index " + std::to_string(dev) + " is out of range";
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(k.load_mutex);
  void* fn = k.functions[dev].load();
  if (!fn) {
    if (k.cubin.empty()) {
      *error = "kernel '" + k.name + "' has no cubin; it was compiled for the CPU interpreter only";
      return nullptr;
    }
    fn = cuda::load_function(dev, k.cubin, k.name, k.shared, error);
    k.functions[dev].store(fn);
  }
  return fn;
}

int64_t launch_cuda(HostCtx* ctx, KernelEntry& k, int64_t gx, int64_t gy, int64_t gz,
                    const int64_t* slots) {
  const int64_t dev = ctx->device_index;
  void* fn = (dev >= 0 && dev < KernelEntry::kMaxDevices) ? k.functions[dev].load(std::memory_order_acquire) : nullptr;
  if (!fn && !(fn = load_kernel(k, dev, &ctx->error))) return -2;
  const size_t n = k.param_types.size();
  constexpr size_t kMaxParams = 254;
  if (n > kMaxParams) {
    ctx->error = "kernel '" + k.name + "' has more than 254 parameters";
    return -2;
  }
  std::array<void*, kMaxParams + 2> params;
  for (size_t i = 0; i < n; ++i) params[i] = const_cast<int64_t*>(slots + i);
  // Triton 3.6 appends two scratch pointers to every kernel (see nvidia/driver.py).
  int64_t global_scratch = 0, profile_scratch = 0;
  try {
    auto scratch = [&](int64_t size, int64_t align) -> int64_t {
      if (size <= 0) return 0;
      int64_t bytes = gx * gy * gz * k.num_ctas * size + align;
      at::Tensor t = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(at::kCUDA, dev));
      int64_t p = reinterpret_cast<int64_t>(t.data_ptr());
      ctx->temps.push_back(std::move(t));
      return (p + align - 1) / align * align;
    };
    global_scratch = scratch(k.global_scratch_size, k.global_scratch_align);
    profile_scratch = scratch(k.profile_scratch_size, k.profile_scratch_align);
  } catch (const std::exception& e) {
    ctx->error = std::string("scratch allocation failed: ") + e.what();
    return -2;
  }
  params[n] = &global_scratch;
  params[n + 1] = &profile_scratch;
  // Note [Programmatic edges only in graphs]: an ordinary call's launches keep stream order
  if (cuda::launch(fn, gx, gy, gz, k.num_warps, k.num_ctas, k.shared, k.cooperative, k.pdl && ctx->capturing, ctx->stream,
                   params.data(), &ctx->error)) {
    ctx->error = "kernel '" + k.name + "': " + ctx->error;
    return -2;
  }
  return 0;
}

int64_t rt_launch(HostCtx* ctx, int64_t index, int64_t gx, int64_t gy, int64_t gz,
                  const int64_t* slots) noexcept {
  try {
    KernelEntry* k = kernels().items[ctx->region->kernel_handles[index]].get();
    if (ctx->device_index >= 0) {
      // Note [Programmatic edges only in graphs]: an ordinary call runs the user's own kernel, a
      // recording its waiting twin
      if (!ctx->capturing && k->ordinary >= 0) {
        // the twin's module is loaded here, outside any capture: a recording only launches it
        const int64_t dev = ctx->device_index;
        if (dev < KernelEntry::kMaxDevices && !k->functions[dev].load(std::memory_order_acquire) &&
            !load_kernel(*k, dev, &ctx->error))
          return -2;
        k = kernels().items[k->ordinary].get();
      }
      ProfScope prof(k->prof);
      return launch_cuda(ctx, *k, gx, gy, gz, slots);
    }
    ProfScope prof(k->prof);
    return launch_cpu(ctx, *k, gx, gy, gz, slots);
  } catch (const std::exception& e) {
    ctx->error = e.what();
    return -2;
  }
}

c10::IValue materialize(const AtenArg& a, HostCtx* ctx) {
  switch (a.kind) {
    case AtenArg::kInput:
      return (*ctx->inputs)[a.index];
    case AtenArg::kValue:
      return ctx->values[a.index];
    case AtenArg::kSym: {
      if (!a.wrap_number) return c10::IValue(ctx->sizes[a.index]);
      at::Tensor w = at::scalar_to_tensor(c10::Scalar(ctx->sizes[a.index]));
      w.unsafeGetTensorImpl()->set_wrapped_number(true);
      return w;
    }
    case AtenArg::kIntList: {
      std::vector<int64_t> values;
      values.reserve(a.items.size());
      for (const AtenArg& item : a.items)
        values.push_back(item.kind == AtenArg::kSym ? ctx->sizes[item.index] : item.constant.toInt());
      return c10::IValue(std::move(values));
    }
    case AtenArg::kList: {
      if (a.optional_items) {
        c10::List<std::optional<at::Tensor>> list;
        for (const AtenArg& item : a.items) {
          c10::IValue v = materialize(item, ctx);
          list.push_back(v.isNone() ? std::optional<at::Tensor>() : std::optional<at::Tensor>(v.toTensor()));
        }
        return list;
      }
      c10::List<at::Tensor> list;
      for (const AtenArg& item : a.items) list.push_back(materialize(item, ctx).toTensor());
      return list;
    }
    default:
      return a.constant;
  }
}

// The tensor an argument template names, without materializing an IValue; null otherwise.
const at::Tensor* tensor_arg(const AtenArg& a, HostCtx* ctx) {
  switch (a.kind) {
    case AtenArg::kInput:
      return &(*ctx->inputs)[a.index];
    case AtenArg::kValue:
      return &ctx->values[a.index];
    default:
      return a.constant.isTensor() ? &a.constant.toTensor() : nullptr;
  }
}

// A constant Scalar argument equal to 1 (addmm's beta and alpha).
bool unit_scalar(const AtenArg& a) {
  if (a.kind != AtenArg::kConst) return false;
  const c10::IValue& v = a.constant;
  return (v.isInt() && v.toInt() == 1) || (v.isDouble() && v.toDouble() == 1.0) ||
         (v.isScalar() && !v.toScalar().isComplex() && !v.toScalar().isBoolean() && v.toScalar().toDouble() == 1.0);
}

int64_t rt_aten(HostCtx* ctx, int64_t index) noexcept {
  AtenEntry* e = nullptr;
  try {
    e = atens().items[ctx->region->aten_handles[index]].get();
    ProfScope prof(e->prof);
    if (e->cached) {
      std::lock_guard<std::mutex> lock(e->cache_mutex);
      for (const auto& [device, results] : e->cache) {
        if (device != ctx->device_index) continue;
        for (size_t k = 0; k < results.size(); ++k)
          if (e->out_slots[k] >= 0) ctx->values[e->out_slots[k]] = results[k];
        return 0;
      }
    }
    if (e->gemm && ctx->device_index >= 0) {
      at::Tensor out;
      bool taken = false;
      if (!e->gemm_c) {
        const at::Tensor* a = tensor_arg(e->args[0], ctx);
        const at::Tensor* b = tensor_arg(e->args[1], ctx);
        taken = a && b && blas::try_mm(*e->gemm, *a, *b, ctx->device_index, ctx->stream, out);
      } else if (e->args.size() == 3 || (unit_scalar(e->args[3]) && unit_scalar(e->args[4]))) {
        // trident::residual_mm(x, a, b), or addmm(self, a, b, beta=1, alpha=1); try_mm declines
        // when dtypes or the layout of C differ, and the operator then runs (residual_mm: x + mm)
        const at::Tensor* c = tensor_arg(e->args[0], ctx);
        const at::Tensor* a = tensor_arg(e->args[1], ctx);
        const at::Tensor* b = tensor_arg(e->args[2], ctx);
        taken = a && b && c && c->dim() == 2 && blas::try_mm(*e->gemm, *a, *b, ctx->device_index, ctx->stream, out, c);
      }
      if (taken) {
        if (e->out_slots[0] >= 0) ctx->values[e->out_slots[0]] = std::move(out);
        return 0;
      }
    }
    torch::jit::Stack stack;
    stack.reserve(e->args.size());
    for (const AtenArg& a : e->args) stack.push_back(materialize(a, ctx));
    if (e->fast) {
      std::vector<at::Tensor> results;
      e->fast(stack, results);
      stack.clear();
      for (at::Tensor& t : results) stack.emplace_back(std::move(t));
    } else {
      e->op->callBoxed(stack);
    }
    // out_slots has one entry per returned value (list elements flattened); -1 = not kept.
    size_t k = 0;
    auto slot_at = [&](size_t i) { return i < e->out_slots.size() ? e->out_slots[i] : int64_t{-1}; };
    for (c10::IValue& r : stack) {
      if (r.isTensorList()) {
        for (const at::Tensor& t : r.toTensorVector()) {
          if (int64_t slot = slot_at(k++); slot >= 0) ctx->values[slot] = t;
        }
      } else {
        if (int64_t slot = slot_at(k++); slot >= 0 && r.isTensor()) ctx->values[slot] = r.toTensor();
      }
    }
    if (e->cached) {
      std::vector<at::Tensor> results;
      for (int64_t slot : e->out_slots) results.push_back(slot >= 0 ? ctx->values[slot] : at::Tensor());
      std::lock_guard<std::mutex> lock(e->cache_mutex);
      e->cache.emplace_back(ctx->device_index, std::move(results));
    }
    return 0;
  } catch (const c10::Error& ex) {  // the operator's own message, as eager shows it: no C++ frames
    ctx->error = std::string(e ? e->name : "aten call") + " failed: " + ex.what_without_backtrace();
    return -2;
  } catch (const std::exception& ex) {
    ctx->error = std::string(e ? e->name : "aten call") + " failed: " + ex.what();
    return -2;
  }
}

int64_t rt_value_ptr(HostCtx* ctx, int64_t slot) noexcept {
  const at::Tensor& t = ctx->values[slot];
  return t.defined() ? reinterpret_cast<int64_t>(t.data_ptr()) : 0;
}

int64_t rt_view(HostCtx* ctx, int64_t index) noexcept {
  try {
    const ViewEntry& v = views().items[ctx->region->view_handles[index]];
    ProfScope prof(view_prof());  // a fallback operator call is also counted under its entry
    const at::Tensor& base = v.base_is_input ? (*ctx->inputs)[v.base_index] : ctx->values[v.base_index];
    const int64_t base_rank = static_cast<int64_t>(v.base_sizes.size());
    const int64_t rank = static_cast<int64_t>(v.sizes.size());
    c10::IntArrayRef base_sizes(v.base_sizes), base_strides(v.base_strides), sizes(v.sizes), strides(v.strides);
    int64_t delta = v.offset_delta;
    if (v.layout_at >= 0) {  // Note [Symbolic views]: this call's layout, from the size program
      if (ctx->sizes == nullptr) {
        ctx->error = "view with symbolic sizes called without its sizes";
        return -2;
      }
      const int64_t* l = ctx->sizes + v.layout_at;
      base_sizes = c10::IntArrayRef(l, base_rank);
      base_strides = c10::IntArrayRef(l + base_rank, base_rank);
      sizes = c10::IntArrayRef(l + 2 * base_rank, rank);
      strides = c10::IntArrayRef(l + 2 * base_rank + rank, rank);
      delta = l[2 * base_rank + 2 * rank];
    }
    if (!base.defined() || base.sizes() != base_sizes || base.strides() != base_strides) {
      return rt_aten(ctx, v.fallback_aten);  // not the planned base: let the operator decide
    }
    // What at::alias / as_strided build, without dispatch: a TensorImpl sharing the storage.
    auto impl = c10::make_intrusive<c10::TensorImpl>(c10::TensorImpl::VIEW, c10::Storage(base.storage()),
                                                    base.key_set(), base.dtype());
    impl->set_sizes_and_strides(sizes, strides, base.storage_offset() + delta);
    ctx->values[v.slot] = at::Tensor(std::move(impl));
    return 0;
  } catch (const std::exception& e) {
    ctx->error = std::string("native view failed: ") + e.what();
    return -2;
  }
}

// Note [Early release] (trident/scm/specialize.py): drops a value after the last step touching
// its storage, so its memory returns to the allocator as eager's would.
int64_t rt_release(HostCtx* ctx, int64_t slot) noexcept {
  ctx->values[slot].reset();
  return 0;
}

int64_t rt_set_sizes(HostCtx* ctx, const int64_t* values) noexcept {
  ctx->sizes = values;
  return 0;
}

std::string hex(int64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

inline int64_t source_value(HostCtx* ctx, const PlanSource& s, const int64_t* sizes, int64_t stride) noexcept {
  switch (s.kind) {
    case PlanSource::kConst:
      return s.a;
    case PlanSource::kInput:
      return ctx->facts[s.a * stride];
    case PlanSource::kValue:
      return rt_value_ptr(ctx, s.a);
    case PlanSource::kAddress:
      return (s.a < 0 ? ctx->facts[(-s.a - 1) * stride] : rt_value_ptr(ctx, s.a)) + s.b;
    default:
      return sizes[s.a] & s.b;
  }
}

// Bytes a buffer of these sizes and strides takes in the arena: its span rounded up to 256
// (trident/scm/specialize.py `arena_bytes`); -1 for a negative size or stride or an overflow.
int64_t arena_span(const int64_t* sizes, const int64_t* strides, int64_t rank, int64_t itemsize) noexcept {
  int64_t extent = 1;
  for (int64_t d = 0; d < rank; ++d) {
    if (sizes[d] < 0 || strides[d] < 0) return -1;
    if (sizes[d] == 0) return 0;
  }
  for (int64_t d = 0; d < rank; ++d) {
    int64_t term = 0;
    if (__builtin_mul_overflow(sizes[d] - 1, strides[d], &term) || __builtin_add_overflow(extent, term, &extent)) return -1;
  }
  int64_t bytes = 0;
  if (__builtin_mul_overflow(extent, itemsize, &bytes) || __builtin_add_overflow(bytes, int64_t{255}, &bytes)) return -1;
  return bytes / 256 * 256;
}

// Note [Symbolic arena] (trident/scm/specialize.py `place_arena` is the Python twin): each buffer
// at the highest end of the buffers it is placed above, in table order.
bool place_arena(HostCtx* ctx, const HostPlan& p, const int64_t* sizes) noexcept {
  thread_local std::vector<int64_t> placed;  // (offset, bytes) per entry
  const size_t n = p.arena.size();
  try {
    placed.resize(2 * n);  // grows on a thread's first calls only
  } catch (const std::exception& e) {
    ctx->error = std::string("arena placement: ") + e.what();
    return false;
  }
  int64_t total = 0;
  for (size_t k = 0; k < n; ++k) {
    const ArenaBuffer& b = p.arena[k];
    int64_t bytes = b.bytes;
    if (b.sizes_at >= 0) {
      bytes = arena_span(sizes + b.sizes_at, sizes + b.sizes_at + b.rank, b.rank, b.itemsize);
      if (bytes < 0) {
        ctx->error = "arena buffer " + std::to_string(k) + " of plan " + p.name +
                     ": a negative size or stride, or a span beyond 2**63 bytes";
        return false;
      }
    }
    int64_t offset = 0;
    for (int64_t j : b.below) offset = std::max(offset, placed[2 * j] + placed[2 * j + 1]);
    placed[2 * k] = offset;
    placed[2 * k + 1] = bytes;
    if (__builtin_add_overflow(offset, bytes, &bytes)) {
      ctx->error = "arena of plan " + p.name + " beyond 2**63 bytes";
      return false;
    }
    total = std::max(total, bytes);
  }
  ctx->arena_placed = placed.data();
  ctx->arena_count = static_cast<int64_t>(n);
  ctx->arena_total = total;
  return true;
}

// Note [Host plans]: the specialization's steps, in order; the services report their own errors.
int64_t rt_run_plan(HostCtx* ctx, int64_t index, const int64_t* sizes) noexcept {
  const HostPlan& p = plans().items[ctx->region->plan_handles[index]];
  const int64_t stride = ctx->region->facts_stride();
  std::array<int64_t, HostPlan::kMaxParams> slots;
  if (!p.arena.empty() && !place_arena(ctx, p, sizes)) return -2;
  for (const PlanOp& op : p.ops) {
    if (op.sizes >= 0) ctx->sizes = sizes + op.sizes;
    switch (op.kind) {
      case PlanOp::kAlloc:
        if (rt_alloc(ctx, op.index) == kAllocFailed) return -2;
        break;
      case PlanOp::kAten:
        if (rt_aten(ctx, op.index) != 0) return -2;
        break;
      case PlanOp::kView:
        if (rt_view(ctx, op.index) != 0) return -2;
        break;
      case PlanOp::kRelease:
        rt_release(ctx, op.index);
        break;
      default: {  // kLaunch
        for (size_t i = 0; i < op.params.size(); ++i) {
          const int64_t v = source_value(ctx, op.params[i], sizes, stride);
          if (op.params[i].aligned && (v & 15) != 0) {
            ctx->error = "kernel '" + kernels().items[ctx->region->kernel_handles[op.index]]->name + "': parameter " +
                         std::to_string(i) + " was specialized as a 16-byte aligned pointer but is " + hex(v);
            return -2;
          }
          slots[i] = v;
        }
        const int64_t gx = source_value(ctx, op.grid[0], sizes, stride);
        const int64_t gy = source_value(ctx, op.grid[1], sizes, stride);
        const int64_t gz = source_value(ctx, op.grid[2], sizes, stride);
        if (rt_launch(ctx, op.index, gx, gy, gz, slots.data()) != 0) return -2;
      }
    }
  }
  return 0;
}

RuntimeTable kRuntimeTable{&rt_alloc, &rt_launch,  &rt_aten,      &rt_value_ptr,
                           &rt_view,  &rt_release, &rt_set_sizes, &rt_run_plan};

thread_local std::vector<int64_t> tls_facts;

}  // namespace

void never_matches(void**) {}  // the result stays -1

namespace {

int64_t run_host(Region& r, const std::vector<at::Tensor>& inputs, HostCtx& ctx) {
  const HostTable* hosts = r.hosts.load(std::memory_order_acquire);
  if (!hosts) return -1;  // nothing compiled yet: the first call is a miss
  RuntimeTable* table = &kRuntimeTable;
  HostCtx* ctx_ptr = &ctx;
  int64_t result = -1;
  void* args[3] = {&table, &ctx_ptr, &result};
  ProfScope prof(host_prof());
  const size_t n = hosts->host.size();
  for (size_t i = 0; i < n; ++i) {  // in order: the first specialization whose guards hold
    hosts->host[i](args);
    if (result != -1) {
      ctx.ran = static_cast<int64_t>(i);
      return result;
    }
  }
  return -1;
}

// Note [A specialization proves itself]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A specialization is planned from facts; whether its operators accept the inputs (an fp16
// input to an fp32 weight's mm) is known when it first runs. The first run of each one that
// returns -- an ordinary call, a miss, a graph's recording -- is marked; one that failed tells
// the region's Python side (GIL taken, once per specialization) and is retired (its host and select
// functions replaced by never_matches, its index kept; its persistent record removed) and the
// error reaches the caller, so the next call misses and plans again instead of selecting what
// failed -- once per input facts: a specialization planned again for facts whose first one
// failed is kept, so a call that fails as eager fails costs no planning after the first. The
// check on the hit path is one relaxed load.
void first_run(Region& r, int64_t region_id, int64_t index, bool ok, const std::string& error) {
  const HostTable* hosts = r.hosts.load(std::memory_order_acquire);
  if (!hosts || index >= static_cast<int64_t>(hosts->proven.size())) return;
  if (ok) {  // nothing to tell: the handler acts on failures only (no GIL taken)
    hosts->proven[index]->store(1, std::memory_order_relaxed);
    return;
  }
  py::gil_scoped_acquire gil;
  if (hosts->proven[index]->exchange(1)) return;
  if (!r.first_run_handler || r.first_run_handler.is_none()) return;
  try {
    r.first_run_handler(region_id, index, py::str(error));
  } catch (py::error_already_set& e) {
    // the call's own outcome stands; a failing listener is a bug reported without hiding it
    // (with warnings as errors the warning itself raises: the call's outcome still stands)
    if (PyErr_WarnEx(PyExc_RuntimeWarning, (std::string("trident: first-run handler failed: ") + e.what()).c_str(), 1) < 0)
      PyErr_Clear();
  }
}

}  // namespace

std::atomic<bool> g_profiling{false};

ProfCounter& native_call_counter() { return call_prof(); }

namespace {

struct ExtraCounter {
  std::string kind, name;
  ProfCounter* counter;
};

std::vector<ExtraCounter>& extra_counters() {
  static auto* v = new std::vector<ExtraCounter>();  // never destroyed (see above)
  return *v;
}

}  // namespace

void add_profile_counter(std::string kind, std::string name, ProfCounter* counter) {
  extra_counters().push_back({std::move(kind), std::move(name), counter});
}

std::vector<std::tuple<std::string, std::string, int64_t, int64_t>> profile_report() {
  std::vector<std::tuple<std::string, std::string, int64_t, int64_t>> out;
  auto add = [&](const char* kind, const std::string& name, const ProfCounter& c) {
    if (int64_t n = c.calls.load()) out.emplace_back(kind, name, n, c.ns.load());
  };
  add("call", "native call (facts, host program, teardown)", call_prof());
  add("host", "host program (all services included)", host_prof());
  add("alloc", "allocation", alloc_prof());
  add("view", "native view", view_prof());
  for (const ExtraCounter& c : extra_counters()) add(c.kind.c_str(), c.name, *c.counter);
  {
    std::lock_guard<std::mutex> lock(kernels().mutex);
    for (const auto& k : kernels().items) add("launch", k->name, k->prof);
  }
  {
    std::lock_guard<std::mutex> lock(atens().mutex);
    for (const auto& e : atens().items) add(e->gemm ? "gemm" : e->fast ? "typed" : (e->cached ? "constant" : "boxed"), e->name, e->prof);
  }
  return out;
}

void profile_reset() {
  host_prof().reset();
  call_prof().reset();
  alloc_prof().reset();
  view_prof().reset();
  for (const ExtraCounter& c : extra_counters()) c.counter->reset();
  {
    std::lock_guard<std::mutex> lock(kernels().mutex);
    for (const auto& k : kernels().items) k->prof.reset();
  }
  std::lock_guard<std::mutex> lock(atens().mutex);
  for (const auto& e : atens().items) e->prof.reset();
}

int64_t span_bytes(const at::Tensor& t) {
  if (!t.defined() || t.numel() == 0) return 0;
  int64_t last = 0;
  for (int64_t i = 0; i < t.dim(); ++i) last += (t.size(i) - 1) * t.stride(i);
  return (last + 1) * static_cast<int64_t>(t.element_size());
}

int64_t encode_meta(const at::Tensor& t) {
  if (!t.defined()) return -1;
  const at::Device d = t.device();
  return static_cast<int64_t>(t.scalar_type()) | (static_cast<int64_t>(d.type()) << 8) |
         (static_cast<int64_t>(d.index() + 1) << 16);
}

void fill_tensor_facts(const at::Tensor& t, int64_t max_rank, int64_t* out) {
  if (!t.defined()) {
    out[0] = 0;
    out[1] = -1;
    out[2] = -1;
    return;
  }
  out[0] = reinterpret_cast<int64_t>(t.data_ptr());
  out[1] = encode_meta(t);
  const int64_t ndim = t.dim();
  out[2] = ndim;
  const int64_t n = std::min(ndim, max_rank);
  auto sizes = t.sizes();
  auto strides = t.strides();
  for (int64_t i = 0; i < n; ++i) {
    out[kFactsFixed + i] = sizes[i];
    out[kFactsFixed + max_rank + i] = strides[i];
  }
}

// Note [Region ids]: a region's id is its registry slot plus a generation above the slot bits:
// a released slot is taken by a later region under a new id, so the registry holds as many
// regions as are alive, while the id of a released region still names nothing (its slot holds
// another id, or none). Slots are published and read atomically (get_region on the hit path).
constexpr int64_t kSlotBits = 16;
static_assert((size_t{1} << kSlotBits) == kTableCapacity, "a region slot is an index of the registry");

int64_t register_region(std::shared_ptr<Region> region) {
  static std::atomic<int64_t> generation{0};
  auto& t = regions();
  std::lock_guard<std::mutex> lock(t.mutex);
  int64_t slot;
  if (!t.free.empty()) {
    slot = t.free.back();
    t.free.pop_back();
    t.is_free[slot] = 0;
  } else {
    TRIDENT_CHECK(t.items.size() < kTableCapacity, "trident: more than ", kTableCapacity,
                  " SCM regions alive in this process");
    t.items.emplace_back();
    t.is_free.push_back(0);
    slot = static_cast<int64_t>(t.items.size() - 1);
  }
  region->id = (generation.fetch_add(1) + 1) << kSlotBits | slot;
  std::atomic_store(&t.items[slot], region);
  return region->id;
}

std::shared_ptr<Region> get_region(int64_t id) {
  const int64_t slot = id & ((int64_t{1} << kSlotBits) - 1);
  TRIDENT_CHECK(id >= 0 && static_cast<size_t>(slot) < regions().items.size(),
              "trident: no SCM region with id ", id,
              " in this process; the graph was optimized in another process or the id is corrupt");
  // slots never move (capacity reserved) and are published atomically (Note [Region ids])
  std::shared_ptr<Region> r = std::atomic_load(&regions().items[slot]);
  TRIDENT_CHECK(r && r->id == id, "trident: SCM region ", id, " was released: the optimized graph it belonged to "
              "was garbage collected (a copy of that graph cannot run without it; optimize the function again)");
  return r;
}

// Note [Released regions]
// ~~~~~~~~~~~~~~~~~~~~~~~
// A region belongs to the optimized graph that outlined it; when that graph is garbage collected
// (trident.compile's capture bound evicting a capture, torch._dynamo.reset(), a dropped module),
// trident/optimize.py releases its regions: their graphs are retired (pending work waited for,
// private pools freed), and the registry's reference goes, with it the specializations, host
// programs and miss handler. A call in flight holds its own reference. Slots are not reused:
// the id of a released region names nothing.
std::shared_ptr<Region> unregister_region(int64_t id) {
  const int64_t slot = id & ((int64_t{1} << kSlotBits) - 1);
  auto& t = regions();
  TRIDENT_CHECK(id >= 0 && static_cast<size_t>(slot) < t.items.size(), "trident: no SCM region with id ", id);
  std::lock_guard<std::mutex> lock(t.mutex);
  std::shared_ptr<Region> r = std::atomic_load(&t.items[slot]);
  if (!r || r->id != id) return nullptr;  // released already
  std::atomic_store(&t.items[slot], std::shared_ptr<Region>());
  t.is_free[slot] = 1;
  t.free.push_back(slot);  // Note [Region ids]: a later region takes the slot under a new id
  return r;
}

namespace {
// Note [Recycled table slots]: every Region object alive (registered, or released and still held
// by a call), and the entries of destroyed ones, candidates for recycling.
struct Bindings {
  std::mutex mutex;
  std::vector<std::weak_ptr<Region>> alive;
  std::vector<std::pair<int64_t, int64_t>> dead;  // (table, entry)
};
Bindings& bindings() {
  static auto* b = new Bindings();  // never destroyed: see the tables
  return *b;
}
const std::vector<int64_t>* handles_of(const Region& r, int64_t table) {
  switch (table) {
    case kTableKernel: return &r.kernel_handles;
    case kTableAlloc: return &r.alloc_handles;
    case kTableAten: return &r.aten_handles;
    case kTableView: return &r.view_handles;
    case kTablePlan: return &r.plan_handles;
    default: return nullptr;
  }
}
}  // namespace

void track_region(const std::shared_ptr<Region>& region) {
  auto& b = bindings();
  std::lock_guard<std::mutex> lock(b.mutex);
  b.alive.push_back(region);
}

Region::~Region() {
  auto& b = bindings();
  std::lock_guard<std::mutex> lock(b.mutex);
  for (int64_t t = 0; t < kTables; ++t)
    for (int64_t h : *handles_of(*this, t)) b.dead.emplace_back(t, h);
}

std::vector<std::pair<int64_t, int64_t>> dead_bindings() {
  auto& b = bindings();
  std::lock_guard<std::mutex> lock(b.mutex);
  std::vector<std::pair<int64_t, int64_t>> out;
  out.swap(b.dead);
  return out;
}

std::vector<std::pair<int64_t, int64_t>> live_bindings() {
  std::vector<std::shared_ptr<Region>> alive;
  {
    auto& b = bindings();
    std::lock_guard<std::mutex> lock(b.mutex);
    std::vector<std::weak_ptr<Region>> kept;
    for (auto& w : b.alive)
      if (auto r = w.lock()) {
        alive.push_back(std::move(r));
        kept.push_back(w);
      }
    b.alive.swap(kept);
  }
  std::vector<std::pair<int64_t, int64_t>> out;
  for (auto& r : alive) {
    std::lock_guard<std::mutex> lock(r->bind_mutex);
    for (int64_t t = 0; t < kTables; ++t)
      for (int64_t h : *handles_of(*r, t)) out.emplace_back(t, h);
  }
  return out;  // the last references to destroyed regions go here, outside the mutex
}

void recycle_entry(int64_t table, int64_t entry) {
  switch (table) {
    case kTableKernel: kernels().recycle(entry); break;
    case kTableAlloc: allocs().recycle(entry); break;
    case kTableAten: atens().recycle(entry); break;
    case kTableView: views().recycle(entry); break;
    case kTablePlan: plans().recycle(entry); break;
    default: TRIDENT_CHECK(false, "trident: no table ", table);
  }
}

std::vector<std::pair<int64_t, int64_t>> table_usage() {
  return {kernels().usage(), allocs().usage(), atens().usage(), views().usage(), plans().usage(), regions().usage()};
}

int64_t register_kernel(std::shared_ptr<KernelEntry> kernel) { return kernels().add(std::move(kernel)); }

int64_t register_alloc(AllocEntry alloc) { return allocs().add(std::move(alloc)); }

int64_t register_aten(std::shared_ptr<AtenEntry> entry) { return atens().add(std::move(entry)); }

int64_t register_view(ViewEntry entry) { return views().add(std::move(entry)); }

int64_t register_plan(HostPlan plan) {
  for (const PlanOp& op : plan.ops)
    TRIDENT_CHECK(op.params.size() <= HostPlan::kMaxParams, "trident: a launch of ", plan.name, " has ", op.params.size(),
                " parameters; at most ", HostPlan::kMaxParams, " are supported");
  return plans().add(std::move(plan));
}

const AtenEntry& aten_entry(int64_t index) {
  TRIDENT_CHECK(index >= 0 && static_cast<size_t>(index) < atens().items.size(), "trident: no operator entry ", index);
  return *atens().items[index];
}

const KernelEntry& kernel_entry(int64_t index) {
  TRIDENT_CHECK(index >= 0 && static_cast<size_t>(index) < kernels().items.size(), "trident: no kernel ", index);
  return *kernels().items[index];
}

void set_kernel_ordinary(int64_t index, int64_t ordinary) {
  const KernelEntry& k = kernel_entry(index);
  const KernelEntry& o = kernel_entry(ordinary);
  TRIDENT_CHECK(index != ordinary && o.ordinary < 0, "trident: kernel ", ordinary, " cannot stand for kernel ", index);
  TRIDENT_CHECK(o.param_types == k.param_types && o.num_warps == k.num_warps && o.num_ctas == k.num_ctas &&
                  o.cooperative == k.cooperative,
              "trident: kernel '", o.name, "' cannot take the launches of kernel '", k.name,
              "': their parameters, warps or CTAs differ");
  kernels().items[index]->ordinary = ordinary;
}

int64_t kernel_ordinary(int64_t index) { return kernel_entry(index).ordinary; }

void* kernel_function(int64_t index, int64_t device, std::string* error) {
  kernel_entry(index);
  return load_kernel(*kernels().items[index], device, error);
}

std::pair<std::vector<int64_t>, int64_t> arena_placement(const std::vector<ArenaBuffer>& arena,
                                                         const std::vector<int64_t>& sizes) {
  for (const ArenaBuffer& b : arena) {
    TRIDENT_CHECK(b.sizes_at < 0 || b.sizes_at + 2 * b.rank <= static_cast<int64_t>(sizes.size()),
                "trident: arena buffer reads sizes beyond the ", sizes.size(), " given");
  }
  HostPlan p;
  p.name = "placement";
  p.arena = arena;
  HostCtx ctx;
  TRIDENT_CHECK(place_arena(&ctx, p, sizes.data()), "trident: ", ctx.error);
  std::vector<int64_t> offsets;
  for (int64_t k = 0; k < ctx.arena_count; ++k) offsets.push_back(ctx.arena_placed[2 * k]);
  return {offsets, ctx.arena_total};
}

// Note [Inputs with too little storage]
// A tensor can address more bytes than its storage holds: a storage freed in place
// (`t.untyped_storage().resize_(0)`, how FSDP frees parameters between uses) keeps the tensor's
// sizes and strides. Eager operators check the storage and raise; a kernel launched on such a
// tensor reads or writes memory it does not own. So before any step, every input that addresses
// at least one element must lie within its storage; else the call fails, nothing having run.
static void check_storage(const Region& r, const std::vector<at::Tensor>& inputs) {
  // int64_t, not size_t: formatting an unsigned long into the message crashed inside the
  // extension's own copy of libstdc++'s ostream on the GPU machine (cuda-gdb, 2026-12-02)
  for (int64_t i = 0; i < static_cast<int64_t>(inputs.size()); ++i) {
    const at::Tensor& t = inputs[i];
    if (!t.defined()) continue;
    TRIDENT_CHECK(!t.is_meta(), "trident: input ", i, " of region '", r.name,
                "' is a meta tensor, which holds no data (eager operators refuse it too); nothing ran. "
                "Pass a tensor on the device the graph was captured for.");
    if (t.numel() == 0 || !t.has_storage()) continue;
    int64_t last = t.storage_offset();
    for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
    const int64_t need = (last + 1) * static_cast<int64_t>(t.element_size());
    const int64_t have = static_cast<int64_t>(t.storage().nbytes());
    TRIDENT_CHECK(need <= have, "trident: input ", i, " of region '", r.name, "' addresses ", need,
                " bytes of its storage, which holds ", have,
                " (a storage freed with resize_(0), as FSDP frees parameters?); nothing ran. "
                "Pass a tensor whose storage holds its elements.");
  }
}

void prepare(Region& r, const std::vector<at::Tensor>& inputs, HostCtx& ctx, c10::OptionalDeviceGuard& guard) {
  check_storage(r, inputs);  // Note [Inputs with too little storage]
  const int64_t stride = r.facts_stride();
  tls_facts.assign(inputs.size() * stride, 0);
  for (size_t i = 0; i < inputs.size(); ++i) fill_tensor_facts(inputs[i], r.max_rank, tls_facts.data() + i * stride);
  ctx.facts = tls_facts.data();
  ctx.region = &r;
  ctx.inputs = &inputs;
  ctx.values.assign(r.num_values, at::Tensor());
  ctx.temps.clear();
  ctx.arena.reset();
  ctx.arena_placed = nullptr;
  ctx.arena_count = 0;
  ctx.arena_total = 0;
  ctx.error.clear();
  ctx.device_index = -1;
  ctx.stream = nullptr;
  ctx.capturing = false;
  for (const at::Tensor& t : inputs) {
    if (t.defined() && t.is_cuda()) {
      ctx.device_index = t.device().index();
      guard.reset_device(t.device());
      ctx.stream = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(t.device()).native_handle();
      ctx.capturing = cuda::stream_capturing(ctx.stream);
      break;
    }
  }
}

// The generated guard-and-select function on prepared facts: a specialization index or -1.
static int64_t select_specialization(Region& r, HostCtx& ctx) {
  const HostTable* hosts = r.hosts.load(std::memory_order_acquire);
  if (!hosts) return -1;
  RuntimeTable* table = &kRuntimeTable;
  HostCtx* ctx_ptr = &ctx;
  int64_t result = -1;
  void* args[3] = {&table, &ctx_ptr, &result};
  for (HostFn select : hosts->select) {
    select(args);
    if (result >= 0) return result;
  }
  return -1;
}

int64_t probe_region(int64_t region_id, const std::vector<at::Tensor>& inputs) {
  // Runs the generated guard-and-select function: nothing is allocated or launched.
  auto r = get_region(region_id);
  TRIDENT_CHECK(static_cast<int64_t>(inputs.size()) == r->num_inputs, "trident: region '", r->name,
              "' expected ", r->num_inputs, " tensor inputs, got ", inputs.size());
  HostCtx ctx;
  c10::OptionalDeviceGuard guard;
  prepare(*r, inputs, ctx, guard);
  return select_specialization(*r, ctx);
}

// The host program on prepared inputs, with the miss path; the region's outputs.
// `count`: a user's call (hits and misses counted), not a graph's recording or emulated replay.
std::vector<at::Tensor> run_prepared(Region& r, int64_t region_id, const std::vector<at::Tensor>& inputs, HostCtx& ctx,
                                     c10::OptionalDeviceGuard& guard, bool count) {
  int64_t result = run_host(r, inputs, ctx);
  if (result == -1) {
    {
      // GIL first, then the region's lock, waited for without the GIL (Note [Locks and the GIL]).
      py::gil_scoped_acquire gil;
      auto lock = lock_releasing_gil(r.miss_mutex);
      // Another thread may have specialized for these facts while this one waited: then this
      // call compiled nothing and counts as a hit.
      if (select_specialization(r, ctx) < 0) {
        if (count) r.misses.fetch_add(1, std::memory_order_relaxed);
        py::list py_inputs;
        for (const at::Tensor& t : inputs) py_inputs.append(py::cast(t));
        r.miss_handler(region_id, py_inputs);  // raises TridentError when it cannot specialize
      } else if (count) {
        r.hits.fetch_add(1, std::memory_order_relaxed);
      }
    }
    prepare(r, inputs, ctx, guard);
    result = run_host(r, inputs, ctx);
    TRIDENT_CHECK(result != -1, "trident: region '", r.name,
                "' still has no matching specialization after compiling one for these inputs; "
                "this is a bug in Trident's guards, please report it with trident.explain(gm)");
  } else if (result >= 0 && count) {
    r.hits.fetch_add(1, std::memory_order_relaxed);
  }
  if (ctx.ran >= 0) {  // Note [A specialization proves itself]
    const HostTable* hosts = r.hosts.load(std::memory_order_acquire);
    if (ctx.ran < static_cast<int64_t>(hosts->proven.size()) && !hosts->proven[ctx.ran]->load(std::memory_order_relaxed))
      first_run(r, region_id, ctx.ran, result >= 0, ctx.error);
  }
  TRIDENT_CHECK(result >= 0, "trident: region '", r.name, "' failed: ", ctx.error);
  r.last_spec.store(result, std::memory_order_relaxed);
  std::vector<at::Tensor> outputs;
  outputs.reserve(r.output_slots.size());
  for (int64_t slot : r.output_slots) outputs.push_back(ctx.values[slot]);
  return outputs;
}

std::vector<at::Tensor> run_region_native(int64_t region_id, std::vector<at::Tensor> inputs) {
  auto rp = get_region(region_id);
  Region& r = *rp;
  TRIDENT_CHECK(static_cast<int64_t>(inputs.size()) == r.num_inputs, "trident: region '", r.name,
              "' expected ", r.num_inputs, " tensor inputs, got ", inputs.size());
  HostCtx ctx;
  c10::OptionalDeviceGuard guard;
  prepare(r, inputs, ctx, guard);
  return run_prepared(r, region_id, inputs, ctx, guard, /*count=*/false);
}

void check_disjoint_inputs(const Region& r, const std::vector<at::Tensor>& inputs) {
  for (size_t k = 0; k < r.disjoint.size(); ++k) {
    const auto [w, rd] = r.disjoint[k];
    const at::Tensor& a = inputs[w];
    const at::Tensor& b = inputs[rd];
    if (!a.defined() || !b.defined() || a.device() != b.device()) continue;
    const auto a0 = reinterpret_cast<uintptr_t>(a.data_ptr()), a1 = a0 + static_cast<uintptr_t>(span_bytes(a));
    const auto b0 = reinterpret_cast<uintptr_t>(b.data_ptr()), b1 = b0 + static_cast<uintptr_t>(span_bytes(b));
    // the message is the DisjointInputs guard's failure() (trident/scm/guards.py)
    TRIDENT_CHECK(a0 == a1 || b0 == b1 || a1 <= b0 || b1 <= a0, "trident: region '", r.name, "': ", r.disjoint_what[k]);
  }
}

}  // namespace trident
