// Stand-in for the CUDA kernels in a build without nvcc.
#include "kernels/gpu_api.h"

namespace moeserve::gpu {

namespace {
Status not_built() {
  return make_error(StatusCode::kUnsupported,
                    "this moeserve was built without CUDA; install the CUDA toolkit (nvcc) and rebuild");
}
}  // namespace

bool built_with_cuda() { return false; }
Result<std::vector<DeviceInfo>> list_devices() { return std::vector<DeviceInfo>{}; }
Result<double> measure_device_bandwidth(int) { return not_built(); }
Status dequantize_on_gpu(int, DType, const void*, float*, int64_t) { return not_built(); }

}  // namespace moeserve::gpu
