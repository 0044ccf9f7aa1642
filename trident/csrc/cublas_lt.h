// Matrix products through cuBLASLt with the plan resolved once per shape (Note [Cached GEMM plans]).
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace trident::blas {

// Note [Cached GEMM plans]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// at::mm spends ~12 µs of host time per call on an H200 (dispatch, output allocation, cuBLAS
// handle and workspace lookup, and cuBLAS choosing an algorithm for the shape on every call),
// while the decode-step products it serves run for a few µs on the device. An operator entry
// for aten::mm owns a GemmCache: the first call with a given layout (dtype, m/n/k, transposes,
// leading dimensions, pointer alignments, device, reduction setting) builds a plan -- the
// cuBLASLt matmul and layout descriptors and the algorithm cuBLASLt's heuristic ranks first
// under the same preferences ATen sets (fp32 accumulation; the pointers' real alignment; no
// reduced-precision split-K reduction unless torch allows it; a 32 MiB workspace) -- and every
// later call with that layout is one allocation plus one cublasLtMatmul on the current stream.
// A call whose layout has no plan and no free plan slot, or that ATen would treat differently
// (autograd recording, non-strided tensors, dtypes other than bf16/fp16, empty sizes), is not
// taken: the caller runs ATen's operator instead. libcublasLt is found at run time (the one
// torch already loaded), so CPU builds carry no CUDA dependency.
struct Plan;

struct GemmCache {
  GemmCache() = default;
  GemmCache(const GemmCache&) = delete;
  GemmCache& operator=(const GemmCache&) = delete;
  ~GemmCache();  // destroys its plans (cublas_lt.cpp)
  static constexpr int kMaxPlans = 8;
  std::mutex mutex;
  std::array<std::atomic<Plan*>, kMaxPlans> plans{};
  std::atomic<int64_t> taken{0}, declined{0};
};

// True when libcublasLt could be loaded and every entry point resolved.
bool available();

// out = a @ b on `stream` (device `device`, already current) when this call can take the
// cached-plan path; returns false (out untouched) when the caller must run aten::mm instead.
// With `c` (a row-major [m, n] matrix of a's dtype): out = c + a @ b, cuBLASLt's beta = 1 with C
// = c -- aten::addmm(c, a, b) as ATen computes it on CUDA (C added in the fp32 accumulation, one
// rounding). Throws c10::Error when cuBLASLt itself fails.
bool try_mm(GemmCache& cache, const at::Tensor& a, const at::Tensor& b, int64_t device, void* stream,
            at::Tensor& out, const at::Tensor* c = nullptr);

// Experiment (tools/bench_gemm.py): every algorithm cuBLASLt's heuristic ranks for a @ b, in rank
// order: (rank, host µs per cublasLtMatmul over `iters` calls, bitwise equal to rank 0, workspace).
std::vector<std::array<double, 4>> survey(const at::Tensor& a, const at::Tensor& b, int64_t iters);

// The workspace of (device, stream), allocated now if it does not exist yet: a graph recording
// reserves its capture stream's outside the capture (Note [Graph replay]).
void* reserve_workspace(int64_t device, void* stream);

// Until reset with nullptr, gemms on this thread use `stream`'s workspace whatever stream they
// run on (a graph recording: Note [Graph replay]).
void set_workspace_stream(void* stream);

// The plans built so far: (scalar type, m, n, k, op A, op B, workspace bytes, device) each.
std::vector<std::array<int64_t, 8>> plans_of(const GemmCache& cache);

}  // namespace trident::blas
