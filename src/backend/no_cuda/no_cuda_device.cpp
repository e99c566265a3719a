// Stand-in for the CUDA backend in a build without nvcc.
#include "backend/devices.h"

namespace moeserve::backend {

Result<std::unique_ptr<Device>> open_cuda_device(int) {
  return make_error(StatusCode::kUnsupported,
                    "this moeserve was built without CUDA; install the CUDA toolkit (nvcc) and rebuild, or use --device cpu");
}

}  // namespace moeserve::backend
