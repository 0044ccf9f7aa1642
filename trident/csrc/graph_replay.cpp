#include "check.h"
#include "graph_replay.h"

#include <algorithm>

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
// Staged inputs are those seen at two addresses with otherwise equal facts (a fresh token or
// position tensor each step, a hidden state that is the previous step's output); every other
// input is pinned (weights, KV caches). Staged inputs the region writes are copied back after
// the replay (Note [Staging written inputs]).
// The graph's intermediates live in its private memory pool (torch.cuda.graph); its outputs
// are overwritten by the next replay, so each replay returns fresh copies (one allocation and
// one copy per output storage, aliasing between outputs kept by copying storages, not tensors),
// except the outputs it lends (Note [Lent outputs]).
// Recording (trident/runtime/graphs.py) happens after `record_after` consecutive ordinary calls
// with equal facts but addresses; it captures the host program without running it, so no
// written input is changed twice. Regions with seeded random operators, inputs off the GPU, or
// outputs aliasing inputs are never recorded (the recorder says why; explain() shows it).
// With the emulate flag (TRIDENT_GRAPHS=all, tests) a CPU "graph" reruns the host program on the
// static inputs, so the policy, staging and copy-out are exercised without a GPU.
//
// Note [Staging written inputs]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A decode loop passes a fresh hidden state each step, and a region may write it in place (a
// residual stream updated with +=). Pinning it would make every call miss the graph. A written
// input that moves is therefore staged both ways: its bytes are copied into the graph's buffer
// before the replay and back into the caller's tensor after it, both on the caller's stream, so
// the caller sees exactly the ordinary call's writes. Copying back the bytes the elements span
// is only exact when they are all the tensor's (no gaps another tensor may own, no overlap):
// written inputs are staged only when non-overlapping and dense, when no other input shares
// their storage, and when they span at most TRIDENT_GRAPH_STAGE_WRITTEN_BYTES (large written
// inputs, KV caches, stay pinned: two copies of them per call would cost more device time than
// the replay saves host time). Read-only inputs are staged up to 64 MiB, any layout.
//
// Note [Pinned inputs are not held]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A graph bakes a pinned input's address, and replays only when a call brings a tensor with
// equal facts at that very address: the caller's tensor owns that memory for the call, so the
// entry need not keep the recorded tensor alive. Holding it would be worse than useless: a
// transient input that the caching allocator happened to give the same address during the
// observed calls (an embedding lookup) could then never get that address again, and the graph
// would never replay.
//
// Note [Graph lifetimes]
// ~~~~~~~~~~~~~~~~~~~~~~
// A graph is recorded only when replays are expected: the observed calls agree on every fact
// but the addresses of inputs that can be staged; an input that moves and cannot be staged
// restarts the observation (explain() says which). Inputs seen moving once stay "moving" for the
// region, so a graph recorded later stages them too. When a new graph serves every call an
// older live one serves (same stream and device, every input either staged in the new one with
// equal facts but address, or pinned in both with equal facts), the older one is retired: its
// pending work is waited for, its pool, buffers and outputs are released, it never replays
// again. So a graph that pinned a transient input by the allocator's chance is replaced by one
// that stages it, instead of holding memory with no replay to come; at TRIDENT_GRAPH_LIMIT such a
// replacement is still recorded, another graph is not. An older graph whose calls brought a pinned
// input sharing storage with a written one is not replaced by a graph staging that input (it
// would decline those calls).

// Note [Lent outputs]
// ~~~~~~~~~~~~~~~~~~~
// A symbolic capture's static pieces (Note [Pieces of a symbolic region]) hand each other their
// outputs: a residual stream, q, k and v, rotary tables, each read by a later region of the same
// call and then dropped. Copying each out of the graph's pool (an allocation and a copy each,
// ~44 µs of host time per replay on the H200 for a decode layer's piece) buys nothing there.
// So an output that only later regions of the same call read (the optimized graph says which:
// trident/optimize.py `_lend_handoffs`) is *lent*: the replay returns a tensor on the graph's own
// memory, through a storage made for this replay (non-owning pointer; its deleter keeps the
// graph's output alive, so a retired graph's memory outlives a tensor still lent). A replay
// overwrites that memory, so before it the entry checks that no tensor holds the storage it lent
// last time (a weak reference has expired); if one does (a traceback, a hook, a caller keeping a
// value it should not see), the call takes the ordinary path, whose outputs are fresh, and the
// lent tensor keeps its values. Holders are thus never overwritten, whatever the analysis said.
// (The ordinary calls then record a new graph, with its own memory, which lends again; an older
// matching graph whose lent storages nobody holds replays instead of the held one.) Once
// kLentHeldLimit graphs of a region found a lent output held, its new graphs copy out as before. A storage shared by a
// lent output and one that is not is copied out whole (aliasing kept).

// Note [Carried state in rotation]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A recurrent model's cache replaces its state every step: the call returns the new state, the
// caller stores it (trident.compile replays that store: Note [State the function is passed]) and
// passes it back on the next call, dropping the old one. Copied out, each state costs an
// allocation and a device copy per step on top of the staging copy into the graph (12 layers of
// 1024 x 1024 bf16 state: 48 MiB moved per step). So the front door marks the outputs the call
// stores over one of its tensor inputs as *carried* (trident/optimize.py `lend_carried`), and
// replays lend them like handoffs (Note [Lent outputs]). The next call then brings the lent
// storage back as its input, still held (by the caller's cache, and by the call itself): the
// graph that lent it cannot replay without overwriting it. Such a graph is skipped, marked
// *rotating*, and the call goes to another matching graph whose lent storages nobody holds; when
// there is none it runs the ordinary path, and the graph recorded from those calls is the first
// one's partner (a rotating graph is never superseded by it, Note [Graph lifetimes]). Two graphs
// then alternate, each staging the state the other lent (one copy per state, no allocation, no
// copy out). A caller that keeps an old state is never overwritten: a storage held by anything but
// the call's own inputs sends the call elsewhere, as for any lent output, and counts towards
// kLentHeldLimit. Carried storages carry their own deleter, so pinning (next Note) never takes
// state that alternates between two addresses for a handoff that stopped moving.

// Note [Pinning what stopped moving]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Which inputs a graph stages is decided when it is recorded, from the calls before it: an input
// seen at two addresses is staged (Note [Graph lifetimes]). A lent output (Note [Lent outputs])
// moves until its producer's graph replays, then sits at one address for good: the consumer's
// graph, recorded in the same step as the producer's, keeps copying it in although it no longer
// moves (three such inputs per decode layer: the residual stream and the rotary tables). So when
// a replay finds staged inputs that are lent outputs of another graph (their storage's deleter
// is the lending one) at the same address for kRepinAfter replays in a row, the region records
// another graph for this call that pins them. The older graph stays: it still serves calls where
// they move (the newest matching graph replays first), and asks again (at most kMaxRepins times)
// only after a pinned address moved. Fresh tensors the allocator happens to place at one address
// are never pinned this way: they may move on any call.

// Note [Graph bound]
// ~~~~~~~~~~~~~~~~~~
// A region with symbolic sizes (Note [Symbolic sizes], trident/scm/sizes.py) sees many shapes,
// and a graph replays one shape only, so graphs are recorded per shape (after record_after calls
// of that shape in a row) and bounded: at most TRIDENT_GRAPH_LIMIT live graphs per region, holding
// at most TRIDENT_GRAPH_BYTES together (private pool and staging buffers). A new graph is always
// recorded; the least recently used live graphs (by their latest replay or their recording) are
// retired until the bound holds again -- never the new one, so a graph larger than the byte
// bound alone still replays until the next one comes. explain() counts the graphs evicted.

namespace {

ProfCounter& replay_prof() {
  static auto* c = new ProfCounter();  // never destroyed (see scm_runtime.cpp)
  return *c;
}

bool shares_storage(const at::Tensor& a, const at::Tensor& b) {
  return a.defined() && b.defined() && a.storage().data() == b.storage().data() && a.storage().data() != nullptr;
}

// Whether staging input i would hide or clobber a write: it shares storage with an input the
// region writes, or it is written and shares storage with any other input.
bool staging_conflicts(const std::vector<uint8_t>& written, const std::vector<at::Tensor>& inputs, size_t i) {
  for (size_t j = 0; j < inputs.size(); ++j)
    if (j != i && (written[i] || written[j]) && shares_storage(inputs[i], inputs[j])) return true;
  return false;
}

// The first staged input that conflicts (Note [Staging written inputs]), or -1.
int64_t staged_conflict(const State& s, const Entry& e, const std::vector<at::Tensor>& inputs) {
  for (size_t i = 0; i < inputs.size(); ++i)
    if (e.staged[i] && staging_conflicts(s.written, inputs, i)) return static_cast<int64_t>(i);
  return -1;
}

// Whether a moving input can be staged at all (Pinned::kNone), else why not: its residue mod 16
// must be a whole number of elements (so a buffer with the same residue exists), it must span few
// enough bytes, and when written be non-overlapping and dense (Note [Staging written inputs]).
Pinned why_pinned(const State& s, const at::Tensor& t, bool written) {
  if (!t.defined()) return Pinned::kUndefined;
  const int64_t item = static_cast<int64_t>(t.element_size());
  if ((reinterpret_cast<uintptr_t>(t.data_ptr()) % 16) % item) return Pinned::kResidue;
  const int64_t span = span_bytes(t);
  if (!written) return span <= s.stage_read_limit ? Pinned::kNone : Pinned::kReadTooLarge;
  if (span > s.stage_written_limit) return Pinned::kWrittenTooLarge;
  return t.is_non_overlapping_and_dense() ? Pinned::kNone : Pinned::kWrittenNotDense;
}

// Compares one facts row with an entry's: 0 equal, 1 only the address differs, 2 more differs.
int row_diff(const int64_t* row, const int64_t* want, int64_t stride) {
  if (std::memcmp(row + 1, want + 1, (stride - 1) * sizeof(int64_t)) != 0) return 2;
  return row[0] == want[0] ? 0 : 1;
}

// Whether a call with these facts may replay e; else `why`/`input` say what stood in the way.
bool facts_match(const Entry& e, const int64_t* facts, int64_t n, int64_t stride, Ordinary* why, int64_t* input) {
  for (int64_t i = 0; i < n; ++i) {
    const int d = row_diff(facts + i * stride, e.facts.data() + i * stride, stride);
    if (d == 0 || (d == 1 && e.staged[i])) continue;  // a staged input's address does not matter
    *why = d == 2 ? Ordinary::kFacts : Ordinary::kPinnedMoved;
    *input = i;
    return false;
  }
  return true;
}

void note_ordinary(State& s, Ordinary why, int64_t input) {
  s.ordinary_why.store(static_cast<int64_t>(why), std::memory_order_relaxed);
  s.ordinary_input.store(input, std::memory_order_relaxed);
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
        TRIDENT_CHECK(cuda::copy_async(t.data_ptr(), key, n, stream, &error) == 0,
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

// Note [Lent outputs]: which outputs are lent, grouped by storage; a group is lent when all of
// its outputs may be, and carried when one of them is (Note [Carried state in rotation]). Called
// once per entry, with the outputs of its first replay.
void init_lending(const State& s, Entry& e, const std::vector<at::Tensor>& outs) {
  e.lent_ready = true;
  e.lent_group.assign(outs.size(), -1);
  if (s.lend.size() != outs.size() || s.lent_held.load() >= kLentHeldLimit) return;
  std::vector<const void*> keys;
  std::vector<uint8_t> ok, carried;
  for (size_t i = 0; i < outs.size(); ++i) {
    if (!outs[i].defined() || !outs[i].has_storage()) continue;
    const void* key = outs[i].storage().data();
    size_t g = std::find(keys.begin(), keys.end(), key) - keys.begin();
    if (g == keys.size()) {
      keys.push_back(key);
      ok.push_back(1);
      carried.push_back(0);
    }
    ok[g] = ok[g] && s.lend[i] != kCopied && key != nullptr;
    carried[g] = carried[g] || s.lend[i] == kCarried;
    e.lent_group[i] = static_cast<int64_t>(g);
  }
  std::vector<int64_t> renumber(keys.size(), -1);
  int64_t groups = 0;
  for (size_t g = 0; g < keys.size(); ++g)
    if (ok[g]) {
      renumber[g] = groups++;
      e.lent_carried.push_back(carried[g]);
    }
  for (auto& g : e.lent_group)
    if (g >= 0) g = renumber[g];
  e.lent.assign(groups, std::nullopt);
}

// Who still holds a storage this entry lent (Note [Lent outputs]).
enum class Held { kNone, kByInput, kOther };

// kByInput when every held storage is carried state this call passes back as one of its inputs
// (Note [Carried state in rotation]); kOther when anything else holds one.
Held lent_held(const Entry& e, const std::vector<at::Tensor>& inputs) {
  Held held = Held::kNone;
  for (size_t g = 0; g < e.lent.size(); ++g) {
    const auto& w = e.lent[g];
    if (!w || w->expired()) continue;
    auto strong = w->lock();
    if (!strong) continue;  // released since expired() was asked
    if (!e.lent_carried[g]) return Held::kOther;
    const c10::StorageImpl* impl = strong.get();
    bool input = false;
    for (const at::Tensor& t : inputs)
      input = input || (t.defined() && t.has_storage() && t.storage().unsafeGetStorageImpl() == impl);
    if (!input) return Held::kOther;
    held = Held::kByInput;
  }
  return held;
}

void release_lent_storage(void* keep) { delete static_cast<at::Tensor*>(keep); }
// The same for carried state: a distinct deleter, so that pinning never mistakes state that
// rotates between graphs for a handoff that stopped moving (Note [Pinning what stopped moving]).
void release_carried_storage(void* keep) { delete static_cast<at::Tensor*>(keep); }

// The replay's outputs: lent ones on the graph's memory, the others copied out (Note [Lent outputs]).
std::vector<at::Tensor> lend_or_copy(Entry& e, const std::vector<at::Tensor>& outs, void* stream) {
  std::vector<at::Tensor> copied = outs;
  for (size_t i = 0; i < outs.size(); ++i)
    if (e.lent_group[i] >= 0) copied[i] = at::Tensor();
  std::vector<at::Tensor> result = copy_out(copied, stream);
  std::vector<c10::intrusive_ptr<c10::StorageImpl>> made(e.lent.size());
  for (size_t i = 0; i < outs.size(); ++i) {
    const int64_t g = e.lent_group[i];
    if (g < 0) continue;
    const at::Tensor& s = outs[i];
    if (!made[g]) {
      auto* keep = new at::Tensor(s);  // the graph's output stays alive while this storage does
      c10::DataPtr ptr(s.storage().mutable_data(), keep,
                       e.lent_carried[g] ? &release_carried_storage : &release_lent_storage, s.device());
      made[g] = c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(),
                                                      static_cast<int64_t>(s.storage().nbytes()), std::move(ptr),
                                                      /*allocator=*/nullptr, /*resizable=*/false);
      e.lent[g] = c10::weak_intrusive_ptr<c10::StorageImpl>(made[g]);
    }
    auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(made[g]), s.key_set(), s.dtype());
    impl->set_sizes_and_strides(s.sizes(), s.strides(), s.storage_offset());
    result[i] = at::Tensor(std::move(impl));
  }
  return result;
}

// Emulated graphs (CPU) lend too: the host program's fresh outputs that are lent are copied into
// buffers the entry keeps, which play the graph's memory; the others are returned as copies.
std::vector<at::Tensor> emulated_outputs(Entry& e, const std::vector<at::Tensor>& fresh) {
  if (e.static_outputs.empty()) e.static_outputs = copy_out(fresh, nullptr);
  std::vector<at::Tensor> outs = fresh;
  std::vector<const void*> done;
  for (size_t i = 0; i < fresh.size(); ++i) {
    if (e.lent_group[i] < 0) continue;
    outs[i] = e.static_outputs[i];
    void* dst = e.static_outputs[i].storage().mutable_data();
    if (std::find(done.begin(), done.end(), dst) != done.end()) continue;
    TRIDENT_CHECK(fresh[i].storage().nbytes() == e.static_outputs[i].storage().nbytes(),
                "trident: an emulated graph's output changed size between replays");
    if (dst != fresh[i].storage().data() && fresh[i].storage().nbytes())
      std::memcpy(dst, fresh[i].storage().data(), fresh[i].storage().nbytes());
    done.push_back(dst);
  }
  return outs;
}

// The live entries a graph with these facts and staged inputs would serve every call of (Note
// [Graph lifetimes]): same stream and device, and every input either staged in the new graph with
// equal facts but address, or pinned in both with equal facts. A pinned input that shared storage
// with a written input in the older graph's calls keeps it (the new graph, staging it, would
// decline those calls).
std::vector<Entry*> superseded_by(const State& s, const int64_t* facts, const std::vector<uint8_t>& staged,
                                  void* stream, int64_t device, int64_t n, int64_t stride) {
  std::vector<Entry*> out;
  const int64_t count = s.count.load(std::memory_order_acquire);
  for (int64_t k = 0; k < count; ++k) {
    Entry& older = *s.entries[k];
    if (older.retired.load() || older.stream != stream || older.device != device) continue;
    if (older.rotating.load()) continue;  // Note [Carried state in rotation]: a partner, not a successor
    bool serves = true;
    for (int64_t i = 0; serves && i < n; ++i) {
      const int d = row_diff(older.facts.data() + i * stride, facts + i * stride, stride);
      serves = d != 2 && (staged[i] ? !older.pinned_aliased[i] : (!older.staged[i] && d == 0));
    }
    if (serves) out.push_back(&older);
  }
  return out;
}

// Waits for the entry's pending work and releases what it holds (GIL held: the keeper is a
// Python object). Never throws: a failed wait is reported in the region's stats.
void retire(State& s, Entry& e) {
  auto lock = lock_releasing_gil(e.replay_mutex);  // no replay of it in flight on the host
  if (e.retired.exchange(true)) return;
  if (e.exec) {
    // Its private pool returns to the allocator: the GPU must be done with it first.
    std::string error;
    c10::OptionalDeviceGuard device_guard;
    device_guard.reset_device(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(e.device)));
    if (cuda::stream_synchronize(e.stream, &error) != 0) s.retire_error = error;
  }
  e.static_inputs.clear();
  e.static_outputs.clear();
  e.exec = nullptr;
  e.keeper = py::none();
  e.bytes = 0;
  s.live.fetch_sub(1);
}

}  // namespace

bool try_replay(Region& r, const std::vector<at::Tensor>& inputs, const HostCtx& ctx,
                std::vector<at::Tensor>& outputs, std::vector<bool>& repin) {
  State& s = *r.graphs;
  const int64_t count = s.count.load(std::memory_order_acquire);
  const bool on_cuda = ctx.device_index >= 0;
  if (!on_cuda && !s.emulate) return false;
  if (s.live.load(std::memory_order_relaxed) == 0) {
    note_ordinary(s, Ordinary::kNoGraph, -1);
    return false;
  }
  if (on_cuda && ctx.capturing) {
    note_ordinary(s, Ordinary::kCapturing, -1);
    return false;
  }
  const int64_t n = static_cast<int64_t>(inputs.size());
  const int64_t stride = r.facts_stride();
  Entry* e = nullptr;
  Ordinary why = Ordinary::kStream;
  int64_t why_input = -1;
  for (int64_t k = count - 1; k >= 0 && !e; --k) {  // newest first: it stages the most
    Entry* c = s.entries[k].get();
    if (c->retired.load(std::memory_order_acquire) || c->stream != ctx.stream || c->device != ctx.device_index)
      continue;
    if (!facts_match(*c, ctx.facts, n, stride, &why, &why_input)) continue;
    const int64_t conflict = staged_conflict(s, *c, inputs);
    if (conflict >= 0) {
      why = Ordinary::kAliased;
      why_input = conflict;
      continue;
    }
    if (c->lent_ready) {  // Note [Lent outputs]: a replay would overwrite what it lent last time
      const Held held = lent_held(*c, inputs);
      if (held == Held::kByInput) c->rotating.store(true, std::memory_order_relaxed);  // Note [Carried state in rotation]
      if (held == Held::kOther && !c->found_held) {
        c->found_held = true;
        s.lent_held.fetch_add(1, std::memory_order_relaxed);
      }
      if (held != Held::kNone) {
        why = Ordinary::kLentHeld;
        why_input = -1;
        continue;
      }
    }
    e = c;
  }
  if (!e) {
    s.declined.fetch_add(1, std::memory_order_relaxed);
    note_ordinary(s, why, why_input);
    return false;
  }
  const bool profiling = g_profiling.load(std::memory_order_relaxed);
  const auto t0 = profiling ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
  auto lock = lock_releasing_gil(e->replay_mutex);  // Note [Locks and the GIL]
  if (e->retired.load(std::memory_order_relaxed)) {  // retired while this call waited
    note_ordinary(s, Ordinary::kNoGraph, -1);
    return false;
  }
  if (e->lent_ready && lent_held(*e, inputs) != Held::kNone) {  // taken while this call waited for the lock
    note_ordinary(s, Ordinary::kLentHeld, -1);
    return false;
  }
  e->last_used.store(s.clock.fetch_add(1, std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  std::string error;
  auto copy = [&](void* dst, const void* src, int64_t bytes, int64_t i, const char* what) {
    if (dst == src) return;
    if (on_cuda) {
      TRIDENT_CHECK(cuda::copy_async(dst, src, bytes, ctx.stream, &error) == 0, "trident: ", what, " input ", i,
                  " of region '", r.name, "' for a graph replay failed: ", error);
    } else {
      std::memcpy(dst, src, bytes);
    }
  };
  for (int64_t i = 0; i < n; ++i)
    if (e->staged[i]) copy(e->static_inputs[i].data_ptr(), inputs[i].data_ptr(), e->span_bytes[i], i, "staging");
  if (e->exec) {
    TRIDENT_CHECK(cuda::graph_launch(e->exec, ctx.stream, &error) == 0, "trident: replaying the graph of region '",
                r.name, "' failed: ", error);
    if (!e->lent_ready) init_lending(s, *e, e->static_outputs);
    outputs = lend_or_copy(*e, e->static_outputs, ctx.stream);
  } else {
    std::vector<at::Tensor> static_inputs(n);
    for (int64_t i = 0; i < n; ++i) static_inputs[i] = e->staged[i] ? e->static_inputs[i] : inputs[i];
    std::vector<at::Tensor> fresh = run_region_native(r.id, std::move(static_inputs));
    if (!e->lent_ready) init_lending(s, *e, fresh);
    outputs = e->lent.empty() ? copy_out(fresh, nullptr) : lend_or_copy(*e, emulated_outputs(*e, fresh), nullptr);
  }
  // Written staged inputs back into the caller's tensors (Note [Staging written inputs]);
  // ordered after the replay on the same stream.
  for (int64_t i = 0; i < n; ++i)
    if (e->written_back[i]) copy(inputs[i].data_ptr(), e->static_inputs[i].data_ptr(), e->span_bytes[i], i, "writing back");
  e->replays.fetch_add(1, std::memory_order_relaxed);
  note_ordinary(s, Ordinary::kNone, -1);
  if (e->repins < kMaxRepins) {  // Note [Pinning what stopped moving]
    if (e->last_address.size() != static_cast<size_t>(n)) {
      e->last_address.assign(n, 0);
      e->still.assign(n, 0);
    }
    bool stopped = false;
    for (int64_t i = 0; i < n; ++i) {
      if (!e->staged[i]) continue;
      const auto address = reinterpret_cast<int64_t>(inputs[i].data_ptr());
      // only another graph's lent output (its storage's deleter says so) stays put by design
      const bool lent = inputs[i].has_storage() && inputs[i].storage().data_ptr().get_deleter() == &release_lent_storage;
      const bool moved = !lent || address != e->last_address[i];
      if (moved && e->still[i] >= kRepinAfter) e->rearmed = true;  // a graph pinning it serves no more
      e->still[i] = moved ? 0 : e->still[i] + 1;
      e->last_address[i] = address;
      stopped = stopped || e->still[i] == kRepinAfter;
    }
    if (stopped && (e->repins == 0 || e->rearmed) && !s.off.load() && s.max_graphs > 0) {
      ++e->repins;
      e->rearmed = false;
      repin.assign(n, false);
      for (int64_t i = 0; i < n; ++i) repin[i] = e->staged[i] && e->still[i] < kRepinAfter;
    }
  }
  if (profiling)
    replay_prof().add(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
  return true;
}

namespace {

void record(State& s, Region& r, const std::vector<at::Tensor>& inputs, const std::vector<bool>& staged) {
  // The recorder runs Python (and captures this region, re-entering run_region_native).
  py::gil_scoped_acquire gil;
  auto lock = lock_releasing_gil(s.record_mutex);  // not miss_mutex: the capture may take the miss path
  if (s.off.load() || s.count.load() >= kMaxRecorded) return;
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

}  // namespace

void observe(Region& r, const std::vector<at::Tensor>& inputs, const HostCtx& ctx) {
  State& s = *r.graphs;
  if (s.off.load(std::memory_order_relaxed) || s.count.load(std::memory_order_relaxed) >= kMaxRecorded) return;
  const bool on_cuda = ctx.device_index >= 0;
  if (!on_cuda && !s.emulate) return;
  const int64_t n = static_cast<int64_t>(inputs.size());
  const int64_t stride = r.facts_stride();
  std::vector<bool> staged;
  {
    std::unique_lock<std::mutex> lock(s.mutex, std::try_to_lock);
    if (!lock.owns_lock()) return;  // another thread is observing or recording
    bool same = static_cast<int64_t>(s.prev_facts.size()) == n * stride && s.prev_stream == ctx.stream;
    for (int64_t i = 0; same && i < n; ++i)
      same = row_diff(ctx.facts + i * stride, s.prev_facts.data() + i * stride, stride) < 2;
    if (s.moving.size() != static_cast<size_t>(n)) {
      s.moving.assign(n, 0);
      s.pinned.assign(n, 0);
      s.pinned_span.assign(n, 0);
    }
    int64_t pinned_moving = -1;
    for (int64_t i = 0; same && i < n; ++i) {
      if (ctx.facts[i * stride] == s.prev_facts[i * stride]) continue;
      s.moving[i] = 1;  // Note [Graph lifetimes]
      Pinned why = why_pinned(s, inputs[i], s.written[i]);
      if (why == Pinned::kNone && staging_conflicts(s.written, inputs, i)) why = Pinned::kAliased;
      s.pinned[i] = static_cast<uint8_t>(why);
      s.pinned_span[i] = span_bytes(inputs[i]);
      if (why != Pinned::kNone && pinned_moving < 0) pinned_moving = i;
    }
    s.prev_facts.assign(ctx.facts, ctx.facts + n * stride);
    s.prev_stream = ctx.stream;
    if (pinned_moving >= 0) {
      // A graph would pin it, and it moves: no replay to expect (Note [Graph lifetimes]).
      s.streak = 0;
      note_ordinary(s, s.pinned[pinned_moving] == static_cast<uint8_t>(Pinned::kAliased) ? Ordinary::kAliased
                                                                                          : Ordinary::kUnstageable,
                    pinned_moving);
      return;
    }
    s.streak = same ? s.streak + 1 : 1;
    if (s.streak < s.record_after) return;
    if (on_cuda && ctx.capturing) return;
    std::vector<uint8_t> stage(n);
    for (int64_t i = 0; i < n; ++i)
      stage[i] = s.moving[i] && why_pinned(s, inputs[i], s.written[i]) == Pinned::kNone &&
                 !staging_conflicts(s.written, inputs, i);
    // At the limit a new graph is still recorded: the least recently used one goes (Note [Graph bound]).
    if (s.max_graphs == 0) return;
    s.streak = 0;
    staged.assign(stage.begin(), stage.end());
  }
  record(s, r, inputs, staged);
}

void record_pinned(Region& r, const std::vector<at::Tensor>& inputs, const HostCtx& ctx, const std::vector<bool>& staged) {
  State& s = *r.graphs;
  if (ctx.device_index >= 0 && ctx.capturing) return;
  record(s, r, inputs, staged);
}

void add_entry(int64_t region_id, const std::vector<at::Tensor>& static_inputs, const std::vector<bool>& staged,
               const std::vector<at::Tensor>& static_outputs, int64_t exec, int64_t stream, int64_t bytes,
               py::object keeper) {
  auto rp = get_region(region_id);
  Region& r = *rp;
  State& s = *r.graphs;
  const int64_t n = r.num_inputs;
  TRIDENT_CHECK(static_cast<int64_t>(static_inputs.size()) == n && static_cast<int64_t>(staged.size()) == n,
              "trident: a graph of region '", r.name, "' needs ", n, " inputs");
  auto e = std::make_shared<Entry>();
  const int64_t stride = r.facts_stride();
  e->facts.assign(n * stride, 0);
  e->staged.assign(n, 0);
  e->written_back.assign(n, 0);
  e->pinned_aliased.assign(n, 0);
  e->span_bytes.assign(n, 0);
  e->static_inputs.resize(n);
  e->device = -1;
  for (int64_t i = 0; i < n; ++i) {
    fill_tensor_facts(static_inputs[i], r.max_rank, e->facts.data() + i * stride);
    e->staged[i] = staged[i];
    if (static_inputs[i].defined() && static_inputs[i].is_cuda()) e->device = static_inputs[i].device().index();
    if (!staged[i]) {  // Note [Pinned inputs are not held]
      e->pinned_aliased[i] = staging_conflicts(s.written, static_inputs, i);
      continue;
    }
    e->span_bytes[i] = span_bytes(static_inputs[i]);
    e->written_back[i] = s.written[i];
    e->static_inputs[i] = static_inputs[i];
  }
  e->static_outputs = static_outputs;
  e->exec = reinterpret_cast<void*>(exec);
  e->stream = reinterpret_cast<void*>(stream);
  e->bytes = bytes;
  e->keeper = std::move(keeper);
  TRIDENT_CHECK(exec != 0 || e->device < 0, "trident: a CUDA graph entry needs its cudaGraphExec_t");
  std::vector<Entry*> superseded;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    const int64_t k = s.count.load();
    superseded = superseded_by(s, e->facts.data(), e->staged, e->stream, e->device, n, stride);
    TRIDENT_CHECK(k < kMaxRecorded, "trident: region '", r.name, "' has recorded ", k, " graphs already");
    e->last_used.store(s.clock.fetch_add(1) + 1);
    Entry* added = e.get();
    s.entries[k] = std::move(e);
    s.live.fetch_add(1);
    s.count.store(k + 1, std::memory_order_release);
    // Note [Graph bound]: the least recently used live graphs go while the live ones (the
    // superseded excepted) are more than max_graphs or hold more than max_bytes; never the new one.
    auto going = [&](const Entry* x) { return std::find(superseded.begin(), superseded.end(), x) != superseded.end(); };
    while (true) {
      int64_t live = 0, bytes = 0;
      Entry* lru = nullptr;
      for (int64_t j = 0; j <= k; ++j) {
        Entry* x = s.entries[j].get();
        if (x->retired.load() || going(x)) continue;
        ++live;
        bytes += x->bytes;
        if (x != added && (!lru || x->last_used.load() < lru->last_used.load())) lru = x;
      }
      if (!lru || (live <= s.max_graphs && (s.max_bytes <= 0 || bytes <= s.max_bytes))) break;
      lru->evicted = true;
      s.evicted.fetch_add(1);
      superseded.push_back(lru);
    }
  }
  for (Entry* old : superseded) retire(s, *old);  // outside s.mutex: it waits for replays
}

py::dict stats(int64_t region_id) {
  auto rp = get_region(region_id);
  State& s = *rp->graphs;
  py::dict d;
  d["enabled"] = s.enabled;
  d["emulated"] = s.emulate;
  d["off_reason"] = s.off.load() ? py::object(py::str(s.off_reason)) : py::object(py::none());
  d["declined"] = s.declined.load();
  d["evicted"] = s.evicted.load();
  d["max_graphs"] = s.max_graphs;
  d["max_bytes"] = s.max_bytes;
  d["stage_written_limit"] = s.stage_written_limit;
  d["stage_read_limit"] = s.stage_read_limit;
  static const char* kWhy[] = {"none", "no_graph", "capturing", "stream", "facts", "pinned_moved", "aliased",
                               "unstageable", "lent_held"};
  d["last_ordinary"] = py::make_tuple(kWhy[s.ordinary_why.load()], s.ordinary_input.load());
  static const char* kPinned[] = {"none", "undefined", "residue", "read_too_large", "written_too_large",
                                   "written_not_dense", "aliased"};
  py::list moving, pinned_moving;  // pinned_moving: (input, why, bytes spanned) as last observed
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    for (size_t i = 0; i < s.moving.size(); ++i) {
      if (!s.moving[i]) continue;
      moving.append(py::int_(i));
      if (s.pinned[i]) pinned_moving.append(py::make_tuple(i, kPinned[s.pinned[i]], s.pinned_span[i]));
    }
  }
  d["moving"] = moving;
  d["pinned_moving"] = pinned_moving;
  d["lent_held"] = s.lent_held.load();
  d["retire_error"] = s.retire_error.empty() ? py::object(py::none()) : py::object(py::str(s.retire_error));
  py::list entries;
  int64_t bytes = 0;
  for (int64_t k = 0; k < s.count.load(); ++k) {
    const Entry& e = *s.entries[k];
    py::dict x;
    py::list staged, written_back;
    for (size_t i = 0; i < e.staged.size(); ++i) {
      if (e.staged[i]) staged.append(py::int_(i));
      if (e.written_back[i]) written_back.append(py::int_(i));
    }
    x["staged"] = staged;
    x["written_back"] = written_back;
    x["replays"] = e.replays.load();
    x["retired"] = e.retired.load();
    x["evicted"] = e.evicted;
    x["bytes"] = e.bytes;
    x["device"] = e.device;
    x["stream"] = reinterpret_cast<int64_t>(e.stream);
    x["lent"] = static_cast<int64_t>(e.lent.size());  // storages lent per replay (Note [Lent outputs])
    x["carried"] = static_cast<int64_t>(std::count(e.lent_carried.begin(), e.lent_carried.end(), 1));
    x["rotating"] = e.rotating.load();  // Note [Carried state in rotation]
    bytes += e.bytes;
    entries.append(x);
  }
  d["graphs"] = entries;
  d["bytes"] = bytes;
  return d;
}

ProfCounter& replay_counter() { return replay_prof(); }

void release(Region& r) {
  State& s = *r.graphs;
  const int64_t count = s.count.load(std::memory_order_acquire);
  for (int64_t k = 0; k < count; ++k)
    if (!s.entries[k]->retired.load()) retire(s, *s.entries[k]);
  s.recorder = py::none();
}

}  // namespace trident::graphs
