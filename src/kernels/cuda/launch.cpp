#include "kernels/cuda/launch.cuh"

#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <string>

namespace moeserve::cuda::detail {

bool pdl_enabled() {
  static const bool allowed = [] {
    const char* v = std::getenv("MOESERVE_CUDA_PDL");
    return v == nullptr || std::string(v) != "0";
  }();
  if (!allowed) return false;
  // 0: not asked yet, 1: no, 2: yes.
  static std::atomic<int> by_device[64];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
    cudaGetLastError();
    return false;
  }
  int state = by_device[dev].load(std::memory_order_relaxed);
  if (state == 0) {
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
      cudaGetLastError();
      major = 0;
    }
    state = major >= 9 ? 2 : 1;
    by_device[dev].store(state, std::memory_order_relaxed);
  }
  return state == 2;
}

}  // namespace moeserve::cuda::detail
