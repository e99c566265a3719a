#include <cuda_runtime.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/gpu_api.h"

namespace moeserve::gpu {

bool built_with_cuda() { return true; }

Result<std::vector<DeviceInfo>> list_devices() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // no driver / no device: that is an empty list, not an error
    return std::vector<DeviceInfo>{};
  }
  std::vector<DeviceInfo> out;
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    MOESERVE_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, i));
    DeviceInfo info;
    info.index = i;
    info.name = prop.name;
    info.cc_major = prop.major;
    info.cc_minor = prop.minor;
    info.sm_count = prop.multiProcessorCount;
    info.total_bytes = prop.totalGlobalMem;
    size_t free_b = 0, total_b = 0;
    if (cudaSetDevice(i) == cudaSuccess && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
      info.free_bytes = free_b;
    }
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace moeserve::gpu
