// Graph replay: an SCM mode that records a specialization's whole call as one CUDA graph and
// replays it behind native guards. See Note [Graph replay] in graph_replay.cpp.
#pragma once

#include <ATen/ATen.h>
#include <pybind11/pybind11.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "scm_runtime.h"

namespace trident::graphs {

// One recorded call.
struct Entry {
  std::vector<int64_t> facts;             // the facts of the recorded call (Note [Host ABI] layout)
  std::vector<uint8_t> staged;            // per input: copied into static_inputs[i] before each replay
  std::vector<uint8_t> written_back;      // per staged input the region writes: copied back after it
  std::vector<uint8_t> pinned_aliased;    // per pinned input: shared storage with a written input
  std::vector<int64_t> span_bytes;        // per staged input: the bytes its elements span
  // Per staged input: the graph's buffer; undefined for pinned inputs, which the entry does not
  // hold (Note [Pinned inputs are not held]).
  std::vector<at::Tensor> static_inputs;
  // What the recorded call returned; emulated: buffers made at the first replay when it lends.
  std::vector<at::Tensor> static_outputs;
  // Note [Lent outputs]: per output, the storage group it is lent with (-1: copied out), and per
  // group the storage the latest replay lent (a replay waits until no tensor holds it).
  std::vector<int64_t> lent_group;
  std::vector<std::optional<c10::weak_intrusive_ptr<c10::StorageImpl>>> lent;
  std::vector<uint8_t> lent_carried;  // per group: carried state (Note [Carried state in rotation])
  bool lent_ready = false;
  bool found_held = false;  // a replay found a storage it lent still held (counted once per graph)
  // Note [Carried state in rotation]: a call brought back, as its input, a carried output this
  // graph lent; a graph recorded for such calls is its partner, not its successor.
  std::atomic<bool> rotating{false};
  // Note [Pinning what stopped moving]: per staged input, its address at the latest replay and
  // for how many replays in a row it has not changed; whether this entry asked for a graph that
  // pins the ones that stopped.
  std::vector<int64_t> last_address;
  std::vector<int64_t> still;
  int64_t repins = 0;   // graphs it asked for; another only after a pinned address moved again
  bool rearmed = false;
  void* exec = nullptr;                   // CUgraphExec; null = emulated (CPU: the host program reruns)
  void* stream = nullptr;                 // the stream it replays on (the caller's at recording time)
  int64_t device = -1;
  int64_t bytes = 0;                      // device memory it holds: private pool + staging buffers
  pybind11::object keeper;                // torch.cuda.CUDAGraph: owns exec and its private memory pool
  std::atomic<int64_t> replays{0};
  std::atomic<int64_t> last_used{0};  // State::clock at its recording or latest replay (LRU order)
  bool evicted = false;               // retired by the bound (Note [Graph bound]), not superseded
  // Superseded by a later graph that serves every call this one serves (Note [Graph
  // lifetimes]): its memory is released, it never replays again. Set under replay_mutex.
  std::atomic<bool> retired{false};
  // Staging, launch and copy-out of one replay are enqueued as one unit: two threads replaying
  // on the stream must not interleave (a second staging copy before the first launch).
  std::mutex replay_mutex;
};

// How a region output may be lent (State::lend).
enum Lend : uint8_t { kCopied = 0, kHandoff = 1, kCarried = 2 };

constexpr int64_t kMaxGraphs = 16;  // graphs alive per region at most (TRIDENT_GRAPH_LIMIT <= this)
constexpr int64_t kMaxRecorded = 1024;
constexpr int64_t kLentHeldLimit = 2;
constexpr int64_t kRepinAfter = 3;
constexpr int64_t kMaxRepins = 4;  // per graph  // replays with a staged input at one address (Note [Pinning what stopped moving])  // graphs ever recorded per region (retired ones included)

// Why an input that moves is not staged (graph_stats' pinned_moving; explain()).
enum class Pinned : uint8_t {
  kNone = 0,          // stageable
  kUndefined,         // not a tensor (an absent optional)
  kResidue,           // address % 16 not a whole number of elements: no buffer can match it
  kReadTooLarge,      // read-only, spans more than stage_read_limit
  kWrittenTooLarge,   // written, spans more than stage_written_limit (TRIDENT_GRAPH_STAGE_WRITTEN_BYTES)
  kWrittenNotDense,   // written, its elements do not cover its span exactly
  kAliased,           // shares storage with an input the region writes (or, written, with any input)
};

// Why the last ordinary call of a region did not replay a graph (graph_stats, explain()).
enum class Ordinary : int64_t {
  kNone = 0,
  kNoGraph,          // none recorded (yet)
  kCapturing,        // the caller's stream is being captured (a user's own torch.cuda.graph)
  kStream,           // no graph for this stream / device
  kFacts,            // input `input`: dtype, rank, sizes or strides differ from every graph's
  kPinnedMoved,      // input `input` is pinned in the graph and came at another address
  kAliased,          // staged input `input` shares memory with an input the region writes, or is
                     // written and shares memory with another input
  kUnstageable,      // input `input` moves between calls and cannot be staged (too large, not dense)
  kLentHeld,         // an output the graph lent at its previous replay is still held (Note [Lent outputs])
};

// Per region.
struct State {
  bool enabled = false;
  bool emulate = false;        // also on the CPU (tests): the "graph" reruns the host program
  int64_t max_graphs = 4;
  // Note [Graph bound]: live graphs hold at most this many bytes together (0: no byte bound);
  // past it, or past max_graphs, the least recently used live graphs are retired.
  int64_t max_bytes = 0;
  std::atomic<int64_t> clock{0};
  std::atomic<int64_t> evicted{0};  // graphs retired by the bound
  int64_t record_after = 2;    // consecutive ordinary calls with equal facts (but addresses)
  std::vector<uint8_t> written;  // per input: the region writes it
  // Note [Lent outputs]: per output, whether replays may lend it instead of copying it out: kHandoff
  // (only later regions of the same call read it) or kCarried (state the caller keeps until it
  // passes it back: Note [Carried state in rotation]); lending stops for new graphs once
  // kLentHeldLimit graphs found an output they lent held by something other than a call's input.
  std::vector<uint8_t> lend;
  std::atomic<int64_t> lent_held{0};
  // Note [Staging written inputs]: the most bytes a moving input may span to be staged.
  int64_t stage_read_limit = 64 << 20;
  int64_t stage_written_limit = 0;
  pybind11::object recorder;     // callable(region_id, inputs, staged) -> None | str (why never)
  std::atomic<bool> off{false};  // recording failed or was refused for good
  std::string off_reason;
  // Entries are appended (count: how many), never removed: a retired entry stays, empty, so
  // that readers without a lock never see a slot change under them.
  std::array<std::shared_ptr<Entry>, kMaxRecorded> entries;
  std::atomic<int64_t> count{0};
  std::atomic<int64_t> live{0};      // entries not retired
  std::atomic<int64_t> declined{0};  // calls that found entries but matched none
  std::atomic<int64_t> ordinary_why{0};    // Ordinary: why the last ordinary call did not replay
  std::atomic<int64_t> ordinary_input{-1}; // ... and the input it is about (-1: none)
  // Observation between recordings (under mutex).
  std::mutex mutex;
  std::mutex record_mutex;  // taken after the GIL
  std::vector<int64_t> prev_facts;
  void* prev_stream = nullptr;
  int64_t streak = 0;
  std::vector<uint8_t> moving;  // per input: seen at two addresses with equal other facts, ever
  std::vector<uint8_t> pinned;  // per moving input: Pinned, as last observed
  std::vector<int64_t> pinned_span;  // ... and the bytes its elements spanned then
  std::string retire_error;     // a failed wait while retiring a graph (under the GIL)
};

// Replays a recorded graph matching this call, if any; true when it did (outputs filled).
// `ctx` must come from prepare() for `inputs`.
// `repin`: filled (one flag per input: stage it) when the graph that replayed has staged inputs
// that stopped moving, for record_pinned (Note [Pinning what stopped moving]).
bool try_replay(Region& r, const std::vector<at::Tensor>& inputs, const HostCtx& ctx,
                std::vector<at::Tensor>& outputs, std::vector<bool>& repin);

// Records a graph of the region for this call, staging the inputs `staged` says (the others pinned).
void record_pinned(Region& r, const std::vector<at::Tensor>& inputs, const HostCtx& ctx, const std::vector<bool>& staged);

// After an ordinary (non-replayed) successful call: updates the observation and, when the
// policy says so, asks Python to record a graph for calls like this one.
void observe(Region& r, const std::vector<at::Tensor>& inputs, const HostCtx& ctx);

// Registers a recording (called by the Python recorder).
// Retires every live graph the new one serves all calls of (Note [Graph lifetimes]).
void add_entry(int64_t region_id, const std::vector<at::Tensor>& static_inputs, const std::vector<bool>& staged,
               const std::vector<at::Tensor>& static_outputs, int64_t exec, int64_t stream, int64_t bytes,
               pybind11::object keeper);

pybind11::dict stats(int64_t region_id);

// Note [Host-time profile]: replays, with their staging and output copies.
ProfCounter& replay_counter();

// Retires every live graph of a region being released (Note [Released regions]); GIL held.
void release(Region& r);

}  // namespace trident::graphs
