#include <cuda_runtime.h>

#include <algorithm>

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

Result<double> measure_device_bandwidth(int device) {
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  constexpr size_t kBytes = size_t(1) << 30;  // far past the L2, so the copy runs from HBM
  void *a = nullptr, *b = nullptr;
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaMalloc(&a, kBytes));
  if (cudaMalloc(&b, kBytes) != cudaSuccess) {
    cudaFree(a);
    cudaGetLastError();
    return make_error(StatusCode::kResourceExhausted, "measure_device_bandwidth: no room for 2 GiB of buffers");
  }
  cudaEvent_t start = nullptr, stop = nullptr;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaMemset(a, 1, kBytes);
  float best_ms = 1e30f;
  for (int i = 0; i < 6; ++i) {
    cudaEventRecord(start);
    cudaMemcpy(b, a, kBytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, start, stop);
    if (i > 0) best_ms = std::min(best_ms, ms);  // the first run warms up
  }
  const cudaError_t err = cudaGetLastError();
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(a);
  cudaFree(b);
  if (err != cudaSuccess) return make_error(StatusCode::kInternal, "measure_device_bandwidth: {}", cudaGetErrorString(err));
  return 2.0 * double(kBytes) / (double(best_ms) * 1e-3) / 1e9;
}

}  // namespace moeserve::gpu
