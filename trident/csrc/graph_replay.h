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
#include <string>
#include <vector>

#include "scm_runtime.h"

namespace trident::graphs {

// One recorded call.
struct Entry {
  std::vector<int64_t> facts;             // the facts of the recorded call (Note [Host ABI] layout)
  std::vector<uint8_t> staged;            // per input: copied into static_inputs[i] before each replay
  std::vector<int64_t> span_bytes;        // per staged input: the bytes its elements span
  std::vector<at::Tensor> static_inputs;  // per input: what the recorded call read (staged: the buffer)
  std::vector<at::Tensor> static_outputs; // what the recorded call returned (empty when emulated)
  void* exec = nullptr;                   // CUgraphExec; null = emulated (CPU: the host program reruns)
  void* stream = nullptr;                 // the stream it replays on (the caller's at recording time)
  int64_t device = -1;
  pybind11::object keeper;                // torch.cuda.CUDAGraph: owns exec and its private memory pool
  std::atomic<int64_t> replays{0};
  // Staging, launch and copy-out of one replay are enqueued as one unit: two threads replaying
  // on the stream must not interleave (a second staging copy before the first launch).
  std::mutex replay_mutex;
};

constexpr int64_t kMaxGraphs = 16;

// Per region.
struct State {
  bool enabled = false;
  bool emulate = false;        // also on the CPU (tests): the "graph" reruns the host program
  int64_t max_graphs = 4;
  int64_t record_after = 2;    // consecutive ordinary calls with equal facts (but addresses)
  std::vector<uint8_t> written;  // per input: the region writes it
  pybind11::object recorder;     // callable(region_id, inputs, staged) -> None | str (why never)
  std::atomic<bool> off{false};  // recording failed or was refused for good
  std::string off_reason;
  std::array<std::shared_ptr<Entry>, kMaxGraphs> entries;
  std::atomic<int64_t> count{0};
  std::atomic<int64_t> declined{0};  // calls that found entries but matched none
  // Observation between recordings (under mutex).
  std::mutex mutex;
  std::mutex record_mutex;  // taken after the GIL
  std::vector<int64_t> prev_facts;
  void* prev_stream = nullptr;
  int64_t streak = 0;
  std::vector<uint8_t> moved;
};

// Replays a recorded graph matching this call, if any; true when it did (outputs filled).
// `ctx` must come from prepare() for `inputs`.
bool try_replay(Region& r, const std::vector<at::Tensor>& inputs, const HostCtx& ctx,
                std::vector<at::Tensor>& outputs);

// After an ordinary (non-replayed) successful call: updates the observation and, when the
// policy says so, asks Python to record a graph for calls like this one.
void observe(Region& r, const std::vector<at::Tensor>& inputs, const HostCtx& ctx);

// Registers a recording (called by the Python recorder).
void add_entry(int64_t region_id, const std::vector<at::Tensor>& static_inputs, const std::vector<bool>& staged,
               const std::vector<at::Tensor>& static_outputs, int64_t exec, int64_t stream, pybind11::object keeper);

pybind11::dict stats(int64_t region_id);

// Note [Host-time profile]: replays, with their staging and output copies.
ProfCounter& replay_counter();

}  // namespace trident::graphs
