// The few CUDA driver entry points Trident needs, resolved at run time from libcuda.so.1 so
// that one build serves the CPU and CUDA torch wheels (no CUDA toolkit at build time).
#pragma once

#include <cstdint>
#include <string>

namespace trident::cuda {

// True once libcuda.so.1 was found and every symbol resolved.
bool available();

// Loads `cubin` into the current context of `device` and returns the CUfunction for `name`,
// enabling large dynamic shared memory when `shared` needs it (Triton's rule).
void* load_function(int64_t device, const std::string& cubin, const std::string& name,
                    int64_t shared, std::string* error);

// One launch on `stream`: cuLaunchKernel, or cuLaunchKernelEx with Triton's attributes for a
// kernel compiled with num_ctas > 1 (clusters), launch_cooperative_grid or launch_pdl
// (Note [Cluster launches]). Returns 0 or the CUresult; `error` gets the driver's text.
int launch(void* function, int64_t gx, int64_t gy, int64_t gz, int64_t num_warps, int64_t num_ctas,
           int64_t shared, bool cooperative, bool pdl, void* stream, void** params,
           std::string* error);

// cuGraphLaunch of a CUgraphExec (a cudaGraphExec_t) on `stream`. Returns 0 or the CUresult.
int graph_launch(void* exec, void* stream, std::string* error);

// cuMemcpyDtoDAsync of `bytes` bytes on `stream`. Returns 0 or the CUresult.
int copy_async(void* dst, const void* src, int64_t bytes, void* stream, std::string* error);

// cuStreamSynchronize. Returns 0 or the CUresult.
int stream_synchronize(void* stream, std::string* error);

// True when `stream` is being captured into a CUDA graph (or its status cannot be read).
bool stream_capturing(void* stream);

}  // namespace trident::cuda
