#include "cuda_driver.h"

#include <dlfcn.h>

#include <mutex>

namespace trident::cuda {
namespace {

using CUresult = int;
using CUdevice = int;
using CUcontext = void*;
using CUmodule = void*;
using CUfunction = void*;
using CUstream = void*;

constexpr int CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97;
constexpr int CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1;
constexpr int CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8;

struct Api {
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuCtxGetCurrent)(CUcontext*);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuModuleLoadData)(CUmodule*, const void*);
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*cuFuncGetAttribute)(int*, int, CUfunction);
  CUresult (*cuFuncSetAttribute)(CUfunction, int, int);
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, unsigned, CUstream, void**, void**);
  CUresult (*cuGetErrorString)(CUresult, const char**);
  CUresult (*cuGraphLaunch)(void*, CUstream);
  CUresult (*cuMemcpyDtoDAsync)(uint64_t, uint64_t, size_t, CUstream);
  CUresult (*cuStreamIsCapturing)(CUstream, int*);
  CUresult (*cuStreamSynchronize)(CUstream);
  bool ok = false;
};

const Api& api() {
  static Api a;
  static std::once_flag once;
  std::call_once(once, [] {
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) return;
    bool all = true;
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
      all = all && fn != nullptr;
    };
    sym(a.cuInit, "cuInit");
    sym(a.cuDeviceGet, "cuDeviceGet");
    sym(a.cuCtxGetCurrent, "cuCtxGetCurrent");
    sym(a.cuCtxSetCurrent, "cuCtxSetCurrent");
    sym(a.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    sym(a.cuModuleLoadData, "cuModuleLoadData");
    sym(a.cuModuleGetFunction, "cuModuleGetFunction");
    sym(a.cuFuncGetAttribute, "cuFuncGetAttribute");
    sym(a.cuFuncSetAttribute, "cuFuncSetAttribute");
    sym(a.cuDeviceGetAttribute, "cuDeviceGetAttribute");
    sym(a.cuLaunchKernel, "cuLaunchKernel");
    sym(a.cuGetErrorString, "cuGetErrorString");
    sym(a.cuGraphLaunch, "cuGraphLaunch");
    sym(a.cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2");
    sym(a.cuStreamIsCapturing, "cuStreamIsCapturing");
    sym(a.cuStreamSynchronize, "cuStreamSynchronize");
    a.ok = all && a.cuInit(0) == 0;
  });
  return a;
}

std::string describe(CUresult r, const std::string& what) {
  const char* text = nullptr;
  if (api().cuGetErrorString) api().cuGetErrorString(r, &text);
  return what + " failed with CUresult " + std::to_string(r) + " (" +
         (text ? text : "unknown") + ")";
}

}  // namespace

bool available() { return api().ok; }

void* load_function(int64_t device, const std::string& cubin, const std::string& name,
                    int64_t shared, std::string* error) {
  const Api& a = api();
  if (!a.ok) {
    *error = "libcuda.so.1 could not be loaded; a CUDA kernel cannot run on this machine";
    return nullptr;
  }
  CUdevice dev = 0;
  CUresult r = a.cuDeviceGet(&dev, static_cast<int>(device));
  if (r) return *error = describe(r, "cuDeviceGet"), nullptr;
  CUcontext ctx = nullptr;
  a.cuCtxGetCurrent(&ctx);
  if (!ctx) {
    // torch made the device current through the runtime API; make sure the primary context
    // is bound for this thread the same way Triton does.
    if ((r = a.cuDevicePrimaryCtxRetain(&ctx, dev))) return *error = describe(r, "cuDevicePrimaryCtxRetain"), nullptr;
    if ((r = a.cuCtxSetCurrent(ctx))) return *error = describe(r, "cuCtxSetCurrent"), nullptr;
  }
  CUmodule mod = nullptr;
  if ((r = a.cuModuleLoadData(&mod, cubin.data()))) return *error = describe(r, "cuModuleLoadData"), nullptr;
  CUfunction fn = nullptr;
  if ((r = a.cuModuleGetFunction(&fn, mod, name.c_str())))
    return *error = describe(r, "cuModuleGetFunction(" + name + ")"), nullptr;
  // Same rule as triton/backends/nvidia/driver.c: opt in to large dynamic shared memory.
  int optin = 0;
  a.cuDeviceGetAttribute(&optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev);
  if (shared > 49152 && optin > 49152) {
    int static_shared = 0;
    a.cuFuncGetAttribute(&static_shared, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, fn);
    if ((r = a.cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                  optin - static_shared)))
      return *error = describe(r, "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)"), nullptr;
  }
  return fn;
}

int launch(void* function, int64_t gx, int64_t gy, int64_t gz, int64_t num_warps, int64_t shared,
           void* stream, void** params, std::string* error) {
  if (gx * gy * gz == 0) return 0;  // Triton skips empty grids too
  CUresult r = api().cuLaunchKernel(function, static_cast<unsigned>(gx), static_cast<unsigned>(gy),
                                    static_cast<unsigned>(gz), static_cast<unsigned>(32 * num_warps),
                                    1, 1, static_cast<unsigned>(shared), stream, params, nullptr);
  if (r) *error = describe(r, "cuLaunchKernel");
  return r;
}

int graph_launch(void* exec, void* stream, std::string* error) {
  if (!api().ok) return *error = "libcuda.so.1 could not be loaded", -1;
  CUresult r = api().cuGraphLaunch(exec, stream);
  if (r) *error = describe(r, "cuGraphLaunch");
  return r;
}

int copy_async(void* dst, const void* src, int64_t bytes, void* stream, std::string* error) {
  if (bytes <= 0) return 0;
  if (!api().ok) return *error = "libcuda.so.1 could not be loaded", -1;
  CUresult r = api().cuMemcpyDtoDAsync(reinterpret_cast<uint64_t>(dst), reinterpret_cast<uint64_t>(src),
                                       static_cast<size_t>(bytes), stream);
  if (r) *error = describe(r, "cuMemcpyDtoDAsync");
  return r;
}

bool stream_capturing(void* stream) {
  if (!api().ok) return false;
  int status = 0;  // CU_STREAM_CAPTURE_STATUS_NONE
  // An error (e.g. the legacy stream while another stream captures in global mode) also means
  // "do not replay here": the caller then takes the ordinary path.
  return api().cuStreamIsCapturing(stream, &status) != 0 || status != 0;
}

int stream_synchronize(void* stream, std::string* error) {
  if (!api().ok) {
    if (error) *error = "the CUDA driver is not available";
    return -1;
  }
  const CUresult r = api().cuStreamSynchronize(stream);
  if (r != 0 && error) *error = describe(r, "cuStreamSynchronize");
  return r;
}

}  // namespace trident::cuda
