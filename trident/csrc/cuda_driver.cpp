#include "cuda_driver.h"

// The driver API's own declarations: the cuda.h Triton's NVIDIA backend ships and compiles its
// launcher against (setup.py puts its folder on the include path). Only types and enums are
// used from it; the functions are resolved with dlsym, so nothing links against libcuda.
#include <cuda.h>
#include <dlfcn.h>

#include <mutex>

namespace trident::cuda {
namespace {

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
  // Optional (CUDA >= 11.8 drivers): only launches with clusters, cooperative grids or
  // programmatic dependent launch need it.
  CUresult (*cuLaunchKernelEx)(const CUlaunchConfig*, CUfunction, void**, void**) = nullptr;
  CUresult (*cuGetErrorString)(CUresult, const char**);
  CUresult (*cuGraphLaunch)(void*, CUstream);
  CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
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
    a.cuLaunchKernelEx = reinterpret_cast<decltype(a.cuLaunchKernelEx)>(dlsym(h, "cuLaunchKernelEx"));
    a.ok = all && a.cuInit(0) == CUDA_SUCCESS;
  });
  return a;
}

std::string describe(CUresult r, const std::string& what) {
  const char* text = nullptr;
  if (api().cuGetErrorString) api().cuGetErrorString(r, &text);
  return what + " failed with CUresult " + std::to_string(static_cast<int>(r)) + " (" +
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

int launch(void* function, int64_t gx, int64_t gy, int64_t gz, int64_t num_warps, int64_t num_ctas,
           int64_t shared, bool cooperative, bool pdl, void* stream, void** params,
           std::string* error) {
  if (gx * gy * gz == 0) return 0;  // Triton skips empty grids too
  auto fn = static_cast<CUfunction>(function);
  auto st = static_cast<CUstream>(stream);
  if (num_ctas == 1 && !cooperative && !pdl) {
    CUresult r = api().cuLaunchKernel(fn, static_cast<unsigned>(gx), static_cast<unsigned>(gy),
                                      static_cast<unsigned>(gz), static_cast<unsigned>(32 * num_warps),
                                      1, 1, static_cast<unsigned>(shared), st, params, nullptr);
    if (r) *error = describe(r, "cuLaunchKernel");
    return r;
  }
  // Note [Cluster launches]: what triton/backends/nvidia/driver.py's _launch does for kernels
  // compiled with num_ctas > 1 (a grid point is a cluster of num_ctas CTAs along x, spread
  // scheduling; 16 needs the non-portable size opt-in), launch_cooperative_grid and launch_pdl.
  if (!api().cuLaunchKernelEx) {
    *error = "this kernel needs cuLaunchKernelEx (clusters, cooperative grid or PDL), which the "
             "installed CUDA driver does not export";
    return -1;
  }
  CUlaunchAttribute attrs[4] = {};
  unsigned n = 0;
  if (pdl) {
    attrs[n].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attrs[n++].value.programmaticStreamSerializationAllowed = 1;
  }
  if (cooperative) {
    attrs[n].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    attrs[n++].value.cooperative = 1;
  }
  if (num_ctas != 1) {
    attrs[n].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attrs[n].value.clusterDim.x = static_cast<unsigned>(num_ctas);
    attrs[n].value.clusterDim.y = 1;
    attrs[n++].value.clusterDim.z = 1;
    attrs[n].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE;
    attrs[n++].value.clusterSchedulingPolicyPreference = CU_CLUSTER_SCHEDULING_POLICY_SPREAD;
    if (num_ctas == 16) {
      CUresult r = api().cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1);
      if (r) return *error = describe(r, "cuFuncSetAttribute(NON_PORTABLE_CLUSTER_SIZE_ALLOWED)"), r;
    }
  }
  CUlaunchConfig config = {};
  config.gridDimX = static_cast<unsigned>(gx * num_ctas);
  config.gridDimY = static_cast<unsigned>(gy);
  config.gridDimZ = static_cast<unsigned>(gz);
  config.blockDimX = static_cast<unsigned>(32 * num_warps);
  config.blockDimY = 1;
  config.blockDimZ = 1;
  config.sharedMemBytes = static_cast<unsigned>(shared);
  config.hStream = st;
  config.attrs = attrs;
  config.numAttrs = n;
  CUresult r = api().cuLaunchKernelEx(&config, fn, params, nullptr);
  if (r) *error = describe(r, "cuLaunchKernelEx");
  return r;
}

int graph_launch(void* exec, void* stream, std::string* error) {
  if (!api().ok) return *error = "libcuda.so.1 could not be loaded", -1;
  CUresult r = api().cuGraphLaunch(exec, static_cast<CUstream>(stream));
  if (r) *error = describe(r, "cuGraphLaunch");
  return r;
}

int copy_async(void* dst, const void* src, int64_t bytes, void* stream, std::string* error) {
  if (bytes <= 0) return 0;
  if (!api().ok) return *error = "libcuda.so.1 could not be loaded", -1;
  CUresult r = api().cuMemcpyDtoDAsync(reinterpret_cast<uint64_t>(dst), reinterpret_cast<uint64_t>(src),
                                       static_cast<size_t>(bytes), static_cast<CUstream>(stream));
  if (r) *error = describe(r, "cuMemcpyDtoDAsync");
  return r;
}

bool stream_capturing(void* stream) {
  if (!api().ok) return false;
  int status = 0;  // CU_STREAM_CAPTURE_STATUS_NONE
  // An error (e.g. the legacy stream while another stream captures in global mode) also means
  // "do not replay here": the caller then takes the ordinary path.
  return api().cuStreamIsCapturing(static_cast<CUstream>(stream), &status) != 0 || status != 0;
}

int stream_synchronize(void* stream, std::string* error) {
  if (!api().ok) {
    if (error) *error = "the CUDA driver is not available";
    return -1;
  }
  const CUresult r = api().cuStreamSynchronize(static_cast<CUstream>(stream));
  if (r != 0 && error) *error = describe(r, "cuStreamSynchronize");
  return r;
}

}  // namespace trident::cuda
