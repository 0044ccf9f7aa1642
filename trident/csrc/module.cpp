// The trident._C extension: the trident::scm operator and the services Python uses to build
// SCMs (regions, kernels, allocation plans) and to test native pieces against their originals.
#include <torch/extension.h>
#include <torch/library.h>

#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/ScalarOps.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>

#include <chrono>

#include "check.h"
#include "cuda_driver.h"
#include "cublas_lt.h"
#include "graph_replay.h"
#include "region_call.h"
#include "scm_runtime.h"

namespace py = pybind11;

namespace trident {
namespace {

std::vector<at::Tensor> scm_kernel(int64_t region, at::TensorList mutated, at::TensorList inputs) {
  std::vector<at::Tensor> all;
  all.reserve(mutated.size() + inputs.size());
  all.insert(all.end(), mutated.begin(), mutated.end());
  all.insert(all.end(), inputs.begin(), inputs.end());
  return run_region(region, std::move(all));
}

// The functional form of scm, used when a graph is functionalized (AOT autograd, opcheck):
// the written inputs are cloned, the region runs on the clones, and their new values are
// returned after the region's outputs. See runtime/op.py.
std::vector<at::Tensor> scm_functional_kernel(int64_t region, at::TensorList mutated, at::TensorList inputs) {
  std::vector<at::Tensor> all;
  all.reserve(mutated.size() + inputs.size());
  for (const at::Tensor& t : mutated) all.push_back(at::empty_strided(t.sizes(), t.strides(), t.options()).copy_(t));
  all.insert(all.end(), inputs.begin(), inputs.end());
  std::vector<at::Tensor> clones(all.begin(), all.begin() + mutated.size());
  std::vector<at::Tensor> out = run_region(region, std::move(all));
  out.insert(out.end(), clones.begin(), clones.end());
  return out;
}

int64_t create_region(const std::string& name, int64_t num_inputs, int64_t max_rank,
                      int64_t num_values, std::vector<int64_t> output_slots, py::object miss_handler) {
  auto r = std::make_shared<Region>();
  r->name = name;
  r->num_inputs = num_inputs;
  r->max_rank = max_rank;
  r->num_values = num_values;
  r->output_slots = std::move(output_slots);
  r->miss_handler = std::move(miss_handler);
  r->graphs = std::make_shared<graphs::State>();
  const int64_t id = register_region(r);
  track_region(r);  // Note [Recycled table slots]
  return id;
}

int64_t add_kernel(const std::string& name, py::bytes cubin, int64_t num_warps, int64_t num_ctas,
                   bool cooperative, bool pdl, int64_t shared, int64_t gs_size, int64_t gs_align,
                   int64_t ps_size, int64_t ps_align, std::vector<std::string> param_types,
                   py::object cpu_runner) {
  auto k = std::make_shared<KernelEntry>();
  k->name = name;
  k->cubin = std::string(cubin);
  k->num_warps = num_warps;
  k->num_ctas = num_ctas;
  k->cooperative = cooperative;
  k->pdl = pdl;
  k->shared = shared;
  k->global_scratch_size = gs_size;
  k->global_scratch_align = std::max<int64_t>(gs_align, 1);
  k->profile_scratch_size = ps_size;
  k->profile_scratch_align = std::max<int64_t>(ps_align, 1);
  k->param_types = std::move(param_types);
  k->cpu_runner = std::move(cpu_runner);
  return register_kernel(std::move(k));
}

int64_t add_alloc(std::vector<int64_t> sizes, std::vector<int64_t> strides, const at::Tensor& dtype_of,
                  const std::string& device, bool zero, int64_t slot, int64_t arena_offset, int64_t arena_bytes,
                  bool dynamic, int64_t arena_slot) {
  TRIDENT_CHECK(arena_offset < 0 || (arena_offset % 256 == 0 && arena_offset < arena_bytes),
              "trident: arena offset ", arena_offset, " outside an arena of ", arena_bytes, " bytes");
  TRIDENT_CHECK(!dynamic || arena_offset < 0, "trident: an allocation with symbolic sizes has no fixed arena offset");
  TRIDENT_CHECK(arena_slot < 0 || arena_offset < 0, "trident: an arena buffer is placed per call or fixed, not both");
  AllocEntry a;
  a.dynamic = dynamic;
  a.arena_slot = arena_slot;
  a.arena_offset = arena_offset;
  a.arena_bytes = arena_bytes;
  a.sizes = std::move(sizes);
  a.strides = std::move(strides);
  a.dtype = dtype_of.scalar_type();
  a.device = at::Device(device);
  a.zero = zero;
  a.slot = slot;
  return register_alloc(std::move(a));
}

// Note [Symbolic arena]: (sizes_at, rank, itemsize, fixed bytes, below) per buffer.
using ArenaSpec = std::tuple<int64_t, int64_t, int64_t, int64_t, std::vector<int64_t>>;

std::vector<ArenaBuffer> parse_arena(const std::vector<ArenaSpec>& arena) {
  std::vector<ArenaBuffer> out;
  for (const auto& [sizes_at, rank, itemsize, bytes, below] : arena) {
    ArenaBuffer b;
    b.sizes_at = sizes_at;
    b.rank = rank;
    b.itemsize = itemsize;
    b.bytes = bytes;
    TRIDENT_CHECK(rank >= 0 && itemsize > 0 && bytes >= 0 && bytes % 256 == 0, "trident: bad arena buffer");
    for (int64_t j : below) {
      TRIDENT_CHECK(j >= 0 && j < static_cast<int64_t>(out.size()), "trident: an arena buffer is placed above ", j,
                  ", not an earlier buffer");
      b.below.push_back(j);
    }
    out.push_back(std::move(b));
  }
  return out;
}

// spec: one entry per schema argument, a tuple ("const", value) | ("input", i) |
// ("value", slot) | ("default",) | ("list", [entries]) | ("sym", k) (an int the host program
// computed, Note [Symbolic sizes]) | ("intlist", [("const", int) | ("sym", k)]).
AtenArg parse_arg(const py::handle& spec, const c10::TypePtr& type) {
  py::tuple t = py::reinterpret_borrow<py::tuple>(spec);
  std::string kind = t[0].cast<std::string>();
  AtenArg a;
  if (kind == "input" || kind == "value") {
    a.kind = kind == "input" ? AtenArg::kInput : AtenArg::kValue;
    a.index = t[1].cast<int64_t>();
  } else if (kind == "list") {
    a.kind = AtenArg::kList;
    c10::TypePtr elem = type;
    if (auto opt = type->cast<c10::OptionalType>()) elem = opt->getElementType();
    c10::TypePtr item_type = elem->castRaw<c10::ListType>()->getElementType();
    a.optional_items = item_type->kind() == c10::TypeKind::OptionalType;
    for (const py::handle& item : py::reinterpret_borrow<py::list>(t[1])) a.items.push_back(parse_arg(item, item_type));
  } else if (kind == "sym") {
    a.kind = AtenArg::kSym;
    a.index = t[1].cast<int64_t>();
    c10::TypePtr inner = type;
    if (auto opt = type->cast<c10::OptionalType>()) inner = opt->getElementType();
    a.wrap_number = inner->kind() == c10::TypeKind::TensorType;
  } else if (kind == "intlist") {
    a.kind = AtenArg::kIntList;
    for (const py::handle& item : py::reinterpret_borrow<py::list>(t[1])) {
      py::tuple it = py::reinterpret_borrow<py::tuple>(item);
      AtenArg x;
      if (it[0].cast<std::string>() == "sym") {
        x.kind = AtenArg::kSym;
        x.index = it[1].cast<int64_t>();
      } else {
        x.kind = AtenArg::kConst;
        x.constant = c10::IValue(it[1].cast<int64_t>());
      }
      a.items.push_back(std::move(x));
    }
  } else if (kind == "const") {
    a.kind = AtenArg::kConst;
    PyObject* v = t[1].ptr();
    const bool number = PyFloat_Check(v) || PyLong_Check(v) || PyBool_Check(v);
    if (number && type->kind() == c10::TypeKind::TensorType) {
      // A Python number where the schema takes a Tensor (x * 2.0 -> mul.Tensor): eager makes it
      // a wrapped-number tensor, which type promotion treats as a scalar.
      at::Tensor w = at::scalar_to_tensor(torch::jit::toIValue(t[1], c10::NumberType::get()).toScalar());
      w.unsafeGetTensorImpl()->set_wrapped_number(true);
      a.constant = w;
    } else {
      a.constant = torch::jit::toIValue(t[1], type);
    }
  } else {
    TRIDENT_CHECK(false, "trident: unknown argument kind ", kind);
  }
  return a;
}

int64_t add_aten(const std::string& name, const std::string& overload, py::list args, std::vector<int64_t> out_slots,
                 bool cached, bool typed, bool gemm) {
  auto e = std::make_shared<AtenEntry>();
  if (gemm && (name == "aten::mm" || name == "aten::addmm" || name == "trident::residual_mm") && overload.empty()) {
    e->gemm = std::make_unique<blas::GemmCache>();
    e->gemm_c = name != "aten::mm";
  }
  e->cached = cached;
  e->op = c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), overload.c_str());
  e->fast = typed ? find_fast_call(name, overload) : nullptr;
  e->name = name + (overload.empty() ? "" : "." + overload);
  const auto& schema = e->op->schema();
  TRIDENT_CHECK(args.size() == schema.arguments().size(), "trident: ", e->name, " expects ",
              schema.arguments().size(), " arguments, the plan has ", args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    const auto& arg = schema.arguments()[i];
    py::tuple t = py::reinterpret_borrow<py::tuple>(args[i]);
    if (t[0].cast<std::string>() == "default") {
      TRIDENT_CHECK(arg.default_value().has_value(), "trident: ", e->name, " argument ", arg.name(), " has no default");
      AtenArg a;
      a.kind = AtenArg::kConst;
      a.constant = *arg.default_value();
      e->args.push_back(std::move(a));
    } else {
      e->args.push_back(parse_arg(args[i], arg.type()));
    }
  }
  e->out_slots = std::move(out_slots);
  return register_aten(std::move(e));
}

std::vector<int64_t> tensor_facts(const at::Tensor& t, int64_t max_rank) {
  std::vector<int64_t> out(kFactsFixed + 2 * max_rank, 0);
  fill_tensor_facts(t, max_rank, out.data());
  return out;
}

// Host cost of a bare cuLaunchKernel loop over registered kernels: the benchmark's floor.
// `launches` lists (kernel index, gx, gy, gz, slot values). Returns total nanoseconds for
// `iters` passes over the list (launches only; the caller synchronizes).
int64_t bare_launch_loop(
    const std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t, std::vector<int64_t>>>& launches,
    int64_t device, int64_t iters) {
  TRIDENT_CHECK(cuda::available(), "bare_launch_loop needs the CUDA driver");
  c10::Device dev(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device));
  c10::OptionalDeviceGuard guard(dev);
  void* stream = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(dev).native_handle();
  struct Prepared {
    void* fn;
    const KernelEntry* k;
    int64_t gx, gy, gz;
    std::vector<int64_t> slots;
    std::vector<void*> params;
  };
  std::vector<Prepared> prepared(launches.size());
  int64_t zero = 0;
  for (size_t i = 0; i < launches.size(); ++i) {
    auto& p = prepared[i];
    std::string err;
    p.k = &kernel_entry(std::get<0>(launches[i]));
    p.fn = kernel_function(std::get<0>(launches[i]), device, &err);
    TRIDENT_CHECK(p.fn, err);
    p.gx = std::get<1>(launches[i]);
    p.gy = std::get<2>(launches[i]);
    p.gz = std::get<3>(launches[i]);
    p.slots = std::get<4>(launches[i]);
  }
  for (auto& p : prepared) {
    for (auto& v : p.slots) p.params.push_back(&v);
    p.params.push_back(&zero);
    p.params.push_back(&zero);
  }
  std::string err;
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t it = 0; it < iters; ++it) {
    for (auto& p : prepared) {
      // as an ordinary call launches (Note [Programmatic edges only in graphs]): no programmatic edges
      if (cuda::launch(p.fn, p.gx, p.gy, p.gz, p.k->num_warps, p.k->num_ctas, p.k->shared, p.k->cooperative,
                       false, stream, p.params.data(), &err))
        TRIDENT_CHECK(false, err);
    }
  }
  auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count();
}

// Note [Direct call of the SCM]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Calling torch.ops.trident.scm from Python costs ~4 us of argument parsing, boxing and
// dispatch before the kernel runs. When the dispatcher would do nothing but pick the CPU/CUDA
// kernel -- plain dense tensors, no dispatch or torch-function modes, no thread-local key
// changes, no autograd to record -- the optimized module calls the kernel's body directly.
// In every other case (tracing, fake tensors, subclasses, grad-requiring inputs, ...) it goes
// through the op, so the behaviour is the op's.
bool direct_call_allowed(const std::vector<at::Tensor>& tensors) {
  const auto tls = c10::impl::tls_local_dispatch_key_set();
  if (!(tls.included_ == c10::default_included_set) || !(tls.excluded_ == c10::default_excluded_set)) return false;
  if (at::impl::PythonTorchFunctionTLS::stack_len() > 0) return false;
  const bool grad = at::GradMode::is_enabled();
  for (const at::Tensor& t : tensors) {
    if (!t.defined() || t.layout() != at::kStrided) return false;
    if (!(t.is_cpu() || t.is_cuda()) || t.is_conj() || t.is_neg()) return false;
    if (grad && t.requires_grad()) return false;
  }
  return true;
}

bool unpack_exact(PyObject* list, std::vector<at::Tensor>& out) {
  const Py_ssize_t n = PyList_GET_SIZE(list);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = PyList_GET_ITEM(list, i);
    if (!THPVariable_CheckExact(item)) return false;  // subclasses (FakeTensor, ...) take the op
    out.push_back(THPVariable_Unpack(item));
  }
  return true;
}

py::object scm_call(int64_t region, py::list mutated, py::list inputs) {
  std::vector<at::Tensor> all;
  all.reserve(PyList_GET_SIZE(mutated.ptr()) + PyList_GET_SIZE(inputs.ptr()));
  if (unpack_exact(mutated.ptr(), all) && unpack_exact(inputs.ptr(), all) && direct_call_allowed(all)) {
    std::vector<at::Tensor> out = run_region(region, std::move(all));
    py::list result(out.size());
    for (size_t i = 0; i < out.size(); ++i) result[i] = py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(out[i])));
    return std::move(result);
  }
  static py::object op = py::module_::import("torch").attr("ops").attr("trident").attr("scm").attr("default");
  return op(region, mutated, inputs);
}

// METH_FASTCALL form of scm_call(region, mutated, inputs): the optimized module's hot entry.
// pybind11's generic argument dispatch costs more than the rest of the Python-side call.
PyObject* scm_call_fast(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  try {
    if (nargs != 3 || !PyLong_Check(args[0]) || !PyList_Check(args[1]) || !PyList_Check(args[2])) {
      PyErr_SetString(PyExc_TypeError, "scm_call(region: int, mutated: list[Tensor], inputs: list[Tensor])");
      return nullptr;
    }
    py::object r = scm_call(PyLong_AsLongLong(args[0]), py::reinterpret_borrow<py::list>(args[1]),
                            py::reinterpret_borrow<py::list>(args[2]));
    return r.release().ptr();
  } catch (py::error_already_set& e) {
    e.restore();
    return nullptr;
  } catch (const c10::Error& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
    return nullptr;
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

PyMethodDef kScmCallDef = {"scm_call_fast", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&scm_call_fast)),
                           METH_FASTCALL, "scm_call without pybind11's argument dispatch"};

}  // namespace
}  // namespace trident

TORCH_LIBRARY(trident, m) {
  m.def(
      "scm(int region, Tensor(a!)[] mutated, Tensor[] inputs) -> Tensor[]",
      {at::Tag::pt2_compliant_tag});
  // Stands for one Triton launch when a region is imported into torch-mlir's torch dialect:
  // value semantics, returning the new values of the tensors the kernel writes (the way
  // triton_kernel_wrapper_functional does). Never executed.
  m.def("triton_launch(int launch, Tensor[] reads, Tensor[] writes) -> Tensor[]");
  m.def("scm_functional(int region, Tensor[] mutated, Tensor[] inputs) -> Tensor[]", {at::Tag::pt2_compliant_tag});
  // x + a @ b with the sum formed in the product (Note [Residual adds in the GEMM]): addmm(x, a, b)
  // when x, a and b have one dtype and x is the product's [m, n], else eager's x + mm(a, b)
  // (type promotion, broadcasting). In regions the runtime runs it as one cuBLASLt matmul.
  m.def("residual_mm(Tensor x, Tensor a, Tensor b) -> Tensor", {at::Tag::pt2_compliant_tag});
}

namespace trident {
at::Tensor residual_mm(const at::Tensor& x, const at::Tensor& a, const at::Tensor& b) {
  const bool one_dtype = x.scalar_type() == a.scalar_type() && a.scalar_type() == b.scalar_type();
  if (one_dtype && x.dim() == 2 && a.dim() == 2 && b.dim() == 2 && x.size(0) == a.size(0) && x.size(1) == b.size(1))
    return at::addmm(x, a, b);
  return at::add(x, at::mm(a, b));
}
}  // namespace trident

TORCH_LIBRARY_IMPL(trident, CompositeExplicitAutograd, m) { m.impl("residual_mm", &trident::residual_mm); }

TORCH_LIBRARY_IMPL(trident, CPU, m) {
  m.impl("scm", &trident::scm_kernel);
  m.impl("scm_functional", &trident::scm_functional_kernel);
}
TORCH_LIBRARY_IMPL(trident, CUDA, m) {
  m.impl("scm", &trident::scm_kernel);
  m.impl("scm_functional", &trident::scm_functional_kernel);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  trident::add_profile_counter("graph", "graph replay (staging copies, cuGraphLaunch, output copies)",
                               &trident::graphs::replay_counter());
  m.def("create_region", &trident::create_region);
  // Note [One host program per specialization]: appends one specialization's compiled program.
  m.def("add_host", [](int64_t id, int64_t host, int64_t select) {
    auto r = trident::get_region(id);
    std::lock_guard<std::mutex> lock(r->host_mutex);
    const trident::HostTable* old = r->hosts.load(std::memory_order_acquire);
    auto table = old ? std::make_unique<trident::HostTable>(*old) : std::make_unique<trident::HostTable>();
    table->select.push_back(reinterpret_cast<trident::HostFn>(select));
    table->host.push_back(reinterpret_cast<trident::HostFn>(host));
    table->proven.push_back(std::make_shared<std::atomic<uint8_t>>(0));
    r->hosts.store(table.get(), std::memory_order_release);
    r->host_tables.push_back(std::move(table));
    return static_cast<int64_t>(r->host_tables.back()->host.size());
  });
  // Note [A specialization proves itself]: a retired specialization keeps its index and never matches.
  m.def("retire_host", [](int64_t id, int64_t index) {
    auto r = trident::get_region(id);
    std::lock_guard<std::mutex> lock(r->host_mutex);
    const trident::HostTable* old = r->hosts.load(std::memory_order_acquire);
    TRIDENT_CHECK(old && index >= 0 && index < static_cast<int64_t>(old->host.size()), "trident: region '", r->name,
                  "' has no specialization ", index);
    auto table = std::make_unique<trident::HostTable>(*old);
    table->select[index] = &trident::never_matches;
    table->host[index] = &trident::never_matches;
    r->hosts.store(table.get(), std::memory_order_release);
    r->host_tables.push_back(std::move(table));
  });
  m.def("set_first_run_handler", [](int64_t id, py::object handler) { trident::get_region(id)->first_run_handler = std::move(handler); });
  m.def("region_stats", [](int64_t id) {
    auto r = trident::get_region(id);
    return py::make_tuple(r->hits.load(), r->misses.load(), r->last_spec.load());
  });
  m.def("add_kernel", &trident::add_kernel);
  m.def("scm_call", &trident::scm_call, "torch.ops.trident.scm.default, called directly when allowed");
  m.add_object("scm_call_fast", py::reinterpret_steal<py::object>(PyCFunction_New(&trident::kScmCallDef, nullptr)));
  m.def("add_aten", &trident::add_aten);
  m.def("aten_is_typed", [](int64_t region, int64_t local) {
    return trident::aten_entry(trident::get_region(region)->aten_handles.at(local)).fast != nullptr;
  });
  m.def("gemm_stats", [](int64_t region, int64_t local) -> py::object {
    // None when the entry has no cuBLASLt path; else (taken, declined, [plan tuples]).
    auto r = trident::get_region(region);
    TRIDENT_CHECK(local >= 0 && static_cast<size_t>(local) < r->aten_handles.size(), "trident: no operator ", local);
    const auto& e = trident::aten_entry(r->aten_handles[local]);
    if (!e.gemm) return py::none();
    return py::make_tuple(e.gemm->taken.load(), e.gemm->declined.load(), trident::blas::plans_of(*e.gemm));
  });
  m.def("cublaslt_available", &trident::blas::available);
  m.def("gemm_survey", &trident::blas::survey);
  m.def("has_fast_call", [](const std::string& name, const std::string& overload) {
    return trident::find_fast_call(name, overload) != nullptr;
  });
  m.def("add_view", [](bool base_is_input, int64_t base_index, std::vector<int64_t> base_sizes,
                       std::vector<int64_t> base_strides, std::vector<int64_t> sizes, std::vector<int64_t> strides,
                       int64_t offset_delta, int64_t slot, int64_t fallback_aten, int64_t layout_at) {
    trident::ViewEntry v;
    v.layout_at = layout_at;
    v.base_is_input = base_is_input;
    v.base_index = base_index;
    v.base_sizes = std::move(base_sizes);
    v.base_strides = std::move(base_strides);
    v.sizes = std::move(sizes);
    v.strides = std::move(strides);
    v.offset_delta = offset_delta;
    v.slot = slot;
    v.fallback_aten = fallback_aten;
    return trident::register_view(std::move(v));
  });
  m.def("region_bind", [](int64_t region, const std::string& table, int64_t handle) {
    // Region-local index of a process-wide kernel, allocation plan or ATen call entry.
    auto r = trident::get_region(region);
    std::lock_guard<std::mutex> lock(r->bind_mutex);
    TRIDENT_CHECK(table == "kernel" || table == "alloc" || table == "aten" || table == "view" || table == "plan",
                "trident: no table ", table);
    auto& v = table == "kernel" ? r->kernel_handles
              : table == "alloc" ? r->alloc_handles
              : table == "aten"  ? r->aten_handles
              : table == "view"  ? r->view_handles
                                 : r->plan_handles;
    for (size_t i = 0; i < v.size(); ++i)
      if (v[i] == handle) return static_cast<int64_t>(i);
    TRIDENT_CHECK(v.size() < trident::Region::kMaxLocal, "trident: region table full");
    v.push_back(handle);
    return static_cast<int64_t>(v.size() - 1);
  });
  // Note [Host plans]: ops = [(kind, index, sizes, grid[3], params)], sources = (kind, a, b, aligned)
  using Source = std::tuple<int64_t, int64_t, int64_t, bool>;
  m.def("add_plan", [](const std::string& name,
                       const std::vector<std::tuple<int64_t, int64_t, int64_t, std::vector<Source>, std::vector<Source>>>& ops,
                       const std::vector<trident::ArenaSpec>& arena) {
    auto source = [](const Source& s) {
      trident::PlanSource out;
      out.kind = std::get<0>(s);
      out.a = std::get<1>(s);
      out.b = std::get<2>(s);
      out.aligned = std::get<3>(s);
      TRIDENT_CHECK(out.kind >= trident::PlanSource::kConst && out.kind <= trident::PlanSource::kSize,
                  "trident: no plan source kind ", out.kind);
      return out;
    };
    trident::HostPlan plan;
    plan.name = name;
    for (const auto& [kind, index, sizes, grid, params] : ops) {
      TRIDENT_CHECK(kind >= trident::PlanOp::kAlloc && kind <= trident::PlanOp::kRelease, "trident: no plan op kind ", kind);
      trident::PlanOp op;
      op.kind = kind;
      op.index = index;
      op.sizes = sizes;
      if (kind == trident::PlanOp::kLaunch) {
        TRIDENT_CHECK(grid.size() == 3, "trident: a launch's grid has 3 sources, got ", grid.size());
        for (int d = 0; d < 3; ++d) op.grid[d] = source(grid[d]);
      }
      for (const auto& p : params) op.params.push_back(source(p));
      plan.ops.push_back(std::move(op));
    }
    plan.arena = trident::parse_arena(arena);
    return trident::register_plan(std::move(plan));
  });
  m.def("add_alloc", &trident::add_alloc);
  m.def("place_arena", [](const std::vector<trident::ArenaSpec>& arena, const std::vector<int64_t>& sizes) {
    return trident::arena_placement(trident::parse_arena(arena), sizes);  // Note [Symbolic arena] (tests)
  });
  m.def("tensor_facts", &trident::tensor_facts);
  m.def("encode_meta", &trident::encode_meta);
  m.def("probe", &trident::probe_region);
  m.def("cuda_available", &trident::cuda::available);
  m.def("bare_launch_loop", &trident::bare_launch_loop);
  // Profiling entry points (tools/bench_launch.py): the op's native work without the
  // dispatcher (run), and the same in a C++ loop (run_loop, total nanoseconds).
  m.def("run", [](int64_t region, std::vector<at::Tensor> inputs) { return trident::run_region(region, std::move(inputs)); });
  m.def("run_loop", [](int64_t region, std::vector<at::Tensor> inputs, int64_t iters) {
    auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < iters; ++i) trident::run_region(region, inputs);
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  });
  m.def("set_disjoint_inputs", [](int64_t region, std::vector<std::tuple<int64_t, int64_t, std::string>> pairs) {
    // Note [Inputs a lowered index write must not overlap]; set before the region's first call.
    auto r = trident::get_region(region);
    TRIDENT_CHECK(r->hits.load() + r->misses.load() == 0, "trident: disjoint inputs are set before the first call");
    for (const auto& [w, rd, what] : pairs) {
      TRIDENT_CHECK(w >= 0 && w < r->num_inputs && rd >= 0 && rd < r->num_inputs, "trident: no input ", w, " or ", rd);
      r->disjoint.emplace_back(w, rd);
      r->disjoint_what.push_back(what);
    }
  });
  // Note [Graph replay]
  m.def("set_graph_policy", [](int64_t region, bool enabled, bool emulate, int64_t max_graphs, int64_t max_bytes,
                               int64_t record_after, std::vector<bool> written, int64_t stage_read_limit,
                               int64_t stage_written_limit, py::object recorder) {
    auto r = trident::get_region(region);
    auto& s = *r->graphs;
    TRIDENT_CHECK(static_cast<int64_t>(written.size()) == r->num_inputs, "trident: graph policy needs one flag per input");
    TRIDENT_CHECK(max_graphs >= 0 && max_graphs <= trident::graphs::kMaxGraphs, "trident: at most ",
                trident::graphs::kMaxGraphs, " graphs per region, got ", max_graphs);
    TRIDENT_CHECK(record_after >= 1, "trident: record_after must be >= 1");
    TRIDENT_CHECK(s.count.load() == 0 && r->hits.load() + r->misses.load() == 0,
                "trident: the graph policy is set before a region's first call");
    s.written.assign(written.begin(), written.end());
    s.emulate = emulate;
    s.max_graphs = max_graphs;
    s.max_bytes = max_bytes;
    s.record_after = record_after;
    s.stage_read_limit = stage_read_limit;
    s.stage_written_limit = stage_written_limit;
    s.recorder = std::move(recorder);
    s.enabled = enabled;
  });
  // Note [Lent outputs]: per output, how graph replays may lend it (graphs::Lend: 0 copied out,
  // 1 handed to a later region of the call, 2 carried state); set before the region's first call.
  m.def("set_lent_outputs", [](int64_t region, std::vector<int64_t> lend) {
    auto r = trident::get_region(region);
    auto& s = *r->graphs;
    TRIDENT_CHECK(static_cast<int64_t>(lend.size()) == static_cast<int64_t>(r->output_slots.size()),
                "trident: lent outputs need one flag per output of region '", r->name, "'");
    TRIDENT_CHECK(s.count.load() == 0 && r->hits.load() + r->misses.load() == 0,
                "trident: lent outputs are set before a region's first call");
    for (int64_t k : lend)
      TRIDENT_CHECK(k >= trident::graphs::kCopied && k <= trident::graphs::kCarried, "trident: no lending kind ", k);
    s.lend.assign(lend.begin(), lend.end());
  });
  m.def("release_region", &trident::release_region);  // Note [Released regions]
  // Note [Recycled table slots]: tables by number: kernel, alloc, aten, view, plan
  m.def("dead_bindings", &trident::dead_bindings);
  m.def("live_bindings", &trident::live_bindings);
  m.def("recycle_entry", &trident::recycle_entry);
  m.def("table_usage", &trident::table_usage);
  m.def("add_graph", &trident::graphs::add_entry);
  m.def("graph_stats", &trident::graphs::stats);
  m.def("run_native", [](int64_t region, std::vector<at::Tensor> inputs) {
    return trident::run_region_native(region, std::move(inputs));
  });
  m.def("reserve_gemm_workspace", [](int64_t device, int64_t stream) {
    return reinterpret_cast<int64_t>(trident::blas::reserve_workspace(device, reinterpret_cast<void*>(stream)));
  });
  m.def("set_workspace_stream", [](int64_t stream) { trident::blas::set_workspace_stream(reinterpret_cast<void*>(stream)); });
  m.def("stream_capturing", [](int64_t stream) { return trident::cuda::stream_capturing(reinterpret_cast<void*>(stream)); });
  m.def("set_kernel_ordinary", &trident::set_kernel_ordinary);
  m.def("kernel_ordinary", &trident::kernel_ordinary);
  // launches counted on an entry while profiling (trident.profile()): which entry a call launched
  m.def("kernel_launches", [](int64_t k) { return trident::kernel_entry(k).prof.calls.load(); });
  m.def("kernel_function", [](int64_t k, int64_t dev) {
    std::string err;
    void* fn = trident::kernel_function(k, dev, &err);
    TRIDENT_CHECK(fn, err);
    return reinterpret_cast<int64_t>(fn);
  });
  m.def("set_profiling", [](bool on) { return trident::g_profiling.exchange(on); });
  m.def("profile_report", &trident::profile_report);
  m.def("profile_reset", &trident::profile_reset);
  m.def("facts_fixed", [] { return trident::kFactsFixed; });
}
