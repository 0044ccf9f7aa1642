#include "graph_replay.h"

#include <torch/extension.h>

#include <ATen/EmptyTensor.h>

#include <chrono>
#include <cstring>

#include "cuda_driver.h"

namespace py = pybind11;

namespace trident::graphs {

// Note [Graph replay]
// ~~~~~~~~~~~~~~~~~~~
// A decode step is hundreds of launches and library calls; even at 1-10 µs of host time each,
// the host, not the GPU, sets the pace. A CUDA graph replays all of them for the cost of one
// cuGraphLaunch. Graphs bake every pointer and every scalar, so a replay is only the call it
// was recorded from when:
//   * the facts of every input (Note [Host ABI]: dtype, device, rank, sizes, strides, address)
//     equal those of the recorded call -- they decide which specialization runs and what it
//     does, so equal facts mean the same kernels, grids, operator calls and allocations --
//     except the address of a *staged* input, whose contents are copied (one cuMemcpyDtoDAsync
//     of the bytes its elements span) into the buffer the graph reads before each replay;
//   * the call runs on the stream the graph was recorded for (its cuBLAS workspace and staged
//     buffers are that stream's: replays of one graph stay ordered), and that stream is not
//     itself being captured (then the ordinary path runs, so a user's own capture sees launches);
//   * no staged input shares storage with a written input (a staged copy would hide the write).
// Staged inputs are those whose address moved between the calls observed before recording and
// that the region does not write (a fresh token or position tensor each step); every other input
// is pinned (weights, KV caches: written inputs are always pinned, in place, at their address).
// The graph's intermediates live in its private memory pool (torch.cuda.graph); its outputs
// are overwritten by the next replay, so each replay returns fresh copies (one allocation and
// one copy per output storage, aliasing between outputs kept by copying storages, not tensors).
// Recording (trident/runtime/graphs.py) happens after `record_after` consecutive ordinary calls
// with equal facts but addresses; it captures the host program without running it, so no
// written input is changed twice. Regions with seeded random operators, inputs off the GPU, or
// outputs aliasing inputs are never recorded (the recorder says why; explain() shows it).
// With the emulate flag (TRIDENT_GRAPHS=all, tests) a CPU "graph" reruns the host program on the
// static inputs, so the policy, staging and copy-out are exercised without a GPU.

namespace {

ProfCounter& replay_prof() {
  static auto* c = new ProfCounter();  // never destroyed (see scm_runtime.cpp)
  return *c;
}

bool shares_storage(const at::Tensor& a, const at::Tensor& b) {
  return a.defined() && b.defined() && a.storage().data() == b.storage().data() && a.storage().data() != nullptr;
}

// A staged input must not alias anything the region writes.
bool staged_inputs_independent(const State& s, const Entry& e, const std::vector<at::Tensor>& inputs) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!e.staged[i]) continue;
    for (size_t j = 0; j < inputs.size(); ++j)
      if (s.written[j] && shares_storage(inputs[i], inputs[j])) return false;
  }
  return true;
}

bool facts_match(const Entry& e, const int64_t* facts, int64_t n, int64_t stride) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t* row = facts + i * stride;
    const int64_t* want = e.facts.data() + i * stride;
    const int64_t from = e.staged[i] ? 1 : 0;  // a staged input's address does not matter
    if (std::memcmp(row + from, want + from, (stride - from) * sizeof(int64_t)) != 0) return false;
  }
  return true;
}

at::Tensor empty_bytes_like(const at::Tensor& like, int64_t bytes) {
  if (like.is_cuda()) {
    return at::detail::empty_generic({bytes}, c10::GetAllocator(c10::DeviceType::CUDA),
                                     c10::DispatchKeySet(c10::DispatchKey::CUDA), at::kByte, std::nullopt);
  }
  return at::detail::empty_cpu({bytes}, at::kByte);
}

// Fresh copies of the recorded outputs, storage by storage, so that outputs aliasing each other
// in the recorded call alias each other in the copies.
std::vector<at::Tensor> copy_out(const std::vector<at::Tensor>& outs, void* stream) {
  std::vector<at::Tensor> fresh(outs.size());
  std::vector<std::pair<const void*, at::Tensor>> copied;
  for (size_t i = 0; i < outs.size(); ++i) {
    const at::Tensor& s = outs[i];
    if (!s.defined()) continue;
    const void* key = s.storage().data();
    at::Tensor* bytes = nullptr;
    for (auto& [k, t] : copied)
      if (k == key) bytes = &t;
    if (!bytes) {
      const int64_t n = static_cast<int64_t>(s.storage().nbytes());
      at::Tensor t = empty_bytes_like(s, n);
      if (s.is_cuda()) {
        std::string error;
        TORCH_CHECK(cuda::copy_async(t.data_ptr(), key, n, stream, &error) == 0,
                    "trident: copying a replayed graph's output failed: ", error);
      } else if (n) {
        std::memcpy(t.data_ptr(), key, n);
      }
      copied.emplace_back(key, std::move(t));
      bytes = &copied.back().second;
    }
    auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(bytes->storage()), s.key_set(), s.dtype());
    impl->set_sizes_and_strides(s.sizes(), s.strides(), s.storage_offset());
    fresh[i] = at::Tensor(std::move(impl));
  }
  return fresh;
}

}  // namespace

bool try_replay(Region& r, const std::vector<at::Tensor>& inputs, const HostCtx& ctx,
                std::vector<at::Tensor>& outputs) {
  State& s = *r.graphs;
  const int64_t count = s.count.load(std::memory_order_acquire);
  if (count == 0) return false;
  const bool on_cuda = ctx.device_index >= 0;
  if (!on_cuda && !s.emulate) return false;
  if (on_cuda && cuda::stream_capturing(ctx.stream)) return false;
  const int64_t n = static_cast<int64_t>(inputs.size());
  const int64_t stride = r.facts_stride();
  Entry* e = nullptr;
  for (int64_t k = 0; k < count && !e; ++k) {
    Entry* c = s.entries[k].get();
    if (c->stream == ctx.stream && c->device == ctx.device_index && facts_match(*c, ctx.facts, n, stride) &&
        staged_inputs_independent(s, *c, inputs))
      e = c;
  }
  if (!e) {
    s.declined.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  const bool profiling = g_profiling.load(std::memory_order_relaxed);
  const auto t0 = profiling ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
  auto lock = lock_releasing_gil(e->replay_mutex);  // Note [Locks and the GIL]
  std::string error;
  for (int64_t i = 0; i < n; ++i) {
    if (!e->staged[i]) continue;
    void* dst = e->static_inputs[i].data_ptr();
    const void* src = inputs[i].data_ptr();
    if (dst == src) continue;
    if (on_cuda) {
      TORCH_CHECK(cuda::copy_async(dst, src, e->span_bytes[i], ctx.stream, &error) == 0,
                  "trident: staging input ", i, " of region '", r.name, "' for a graph replay failed: ", error);
    } else {
      std::memcpy(dst, src, e->span_bytes[i]);
    }
  }
  if (e->exec) {
    TORCH_CHECK(cuda::graph_launch(e->exec, ctx.stream, &error) == 0, "trident: replaying the graph of region '",
                r.name, "' failed: ", error);
    outputs = copy_out(e->static_outputs, ctx.stream);
  } else {
    std::vector<at::Tensor> static_inputs(n);
    for (int64_t i = 0; i < n; ++i) static_inputs[i] = e->staged[i] ? e->static_inputs[i] : inputs[i];
    outputs = copy_out(run_region_native(r.id, std::move(static_inputs)), nullptr);
  }
  e->replays.fetch_add(1, std::memory_order_relaxed);
  if (profiling)
    replay_prof().add(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
  return true;
}

void observe(Region& r, const std::vector<at::Tensor>& inputs, const HostCtx& ctx) {
  State& s = *r.graphs;
  if (s.off.load(std::memory_order_relaxed) || s.count.load(std::memory_order_relaxed) >= s.max_graphs) return;
  const bool on_cuda = ctx.device_index >= 0;
  if (!on_cuda && !s.emulate) return;
  const int64_t n = static_cast<int64_t>(inputs.size());
  const int64_t stride = r.facts_stride();
  std::vector<bool> staged;
  {
    std::unique_lock<std::mutex> lock(s.mutex, std::try_to_lock);
    if (!lock.owns_lock()) return;  // another thread is observing or recording
    const bool same = static_cast<int64_t>(s.prev_facts.size()) == n * stride && s.prev_stream == ctx.stream &&
                      [&] {
                        for (int64_t i = 0; i < n; ++i)
                          if (std::memcmp(ctx.facts + i * stride + 1, s.prev_facts.data() + i * stride + 1,
                                          (stride - 1) * sizeof(int64_t)) != 0)
                            return false;
                        return true;
                      }();
    if (!same) {
      s.streak = 0;
      s.moved.assign(n, 0);
    }
    for (int64_t i = 0; same && i < n; ++i)
      if (ctx.facts[i * stride] != s.prev_facts[i * stride]) s.moved[i] = 1;
    s.prev_facts.assign(ctx.facts, ctx.facts + n * stride);
    s.prev_stream = ctx.stream;
    if (++s.streak < s.record_after) return;
    if (on_cuda && cuda::stream_capturing(ctx.stream)) return;
    s.streak = 0;
    staged.resize(n);
    for (int64_t i = 0; i < n; ++i) {
      bool stage = s.moved[i] && !s.written[i];
      for (int64_t j = 0; stage && j < n; ++j)
        if (s.written[j] && shares_storage(inputs[i], inputs[j])) stage = false;
      staged[i] = stage;
    }
    s.moved.assign(n, 0);
  }
  // The recorder runs Python (and captures this region, re-entering run_region_native).
  py::gil_scoped_acquire gil;
  auto lock = lock_releasing_gil(s.record_mutex);  // not miss_mutex: the capture may take the miss path
  if (s.off.load() || s.count.load() >= s.max_graphs) return;
  std::string why;
  try {
    py::list py_inputs;
    for (const at::Tensor& t : inputs) py_inputs.append(py::cast(t));
    py::list py_staged;
    for (bool b : staged) py_staged.append(py::bool_(b));
    py::object result = s.recorder(r.id, py_inputs, py_staged);
    if (result.is_none()) return;
    why = py::str(result);
  } catch (py::error_already_set& e) {
    why = std::string("recording failed: ") + e.what();
  } catch (const std::exception& e) {
    why = std::string("recording failed: ") + e.what();
  }
  s.off_reason = why;
  s.off.store(true);
}

void add_entry(int64_t region_id, const std::vector<at::Tensor>& static_inputs, const std::vector<bool>& staged,
               const std::vector<at::Tensor>& static_outputs, int64_t exec, int64_t stream, py::object keeper) {
  auto rp = get_region(region_id);
  Region& r = *rp;
  State& s = *r.graphs;
  const int64_t n = r.num_inputs;
  TORCH_CHECK(static_cast<int64_t>(static_inputs.size()) == n && static_cast<int64_t>(staged.size()) == n,
              "trident: a graph of region '", r.name, "' needs ", n, " inputs");
  auto e = std::make_shared<Entry>();
  const int64_t stride = r.facts_stride();
  e->facts.assign(n * stride, 0);
  e->staged.assign(n, 0);
  e->span_bytes.assign(n, 0);
  e->device = -1;
  for (int64_t i = 0; i < n; ++i) {
    fill_tensor_facts(static_inputs[i], r.max_rank, e->facts.data() + i * stride);
    e->staged[i] = staged[i];
    if (staged[i]) e->span_bytes[i] = span_bytes(static_inputs[i]);
    if (static_inputs[i].defined() && static_inputs[i].is_cuda()) e->device = static_inputs[i].device().index();
  }
  e->static_inputs = static_inputs;
  e->static_outputs = static_outputs;
  e->exec = reinterpret_cast<void*>(exec);
  e->stream = reinterpret_cast<void*>(stream);
  e->keeper = std::move(keeper);
  TORCH_CHECK(exec != 0 || e->device < 0, "trident: a CUDA graph entry needs its cudaGraphExec_t");
  std::lock_guard<std::mutex> lock(s.mutex);
  const int64_t k = s.count.load();
  TORCH_CHECK(k < kMaxGraphs && k < s.max_graphs, "trident: region '", r.name, "' has its ", k, " graphs already");
  s.entries[k] = std::move(e);
  s.count.store(k + 1, std::memory_order_release);
}

py::dict stats(int64_t region_id) {
  auto rp = get_region(region_id);
  State& s = *rp->graphs;
  py::dict d;
  d["enabled"] = s.enabled;
  d["emulated"] = s.emulate;
  d["off_reason"] = s.off.load() ? py::object(py::str(s.off_reason)) : py::object(py::none());
  d["declined"] = s.declined.load();
  py::list entries;
  for (int64_t k = 0; k < s.count.load(); ++k) {
    const Entry& e = *s.entries[k];
    py::dict x;
    py::list staged;
    for (size_t i = 0; i < e.staged.size(); ++i)
      if (e.staged[i]) staged.append(py::int_(i));
    x["staged"] = staged;
    x["replays"] = e.replays.load();
    x["device"] = e.device;
    x["stream"] = reinterpret_cast<int64_t>(e.stream);
    entries.append(x);
  }
  d["graphs"] = entries;
  return d;
}

ProfCounter& replay_counter() { return replay_prof(); }

}  // namespace trident::graphs
