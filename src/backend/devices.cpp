#include "backend/devices.h"

#include <charconv>

#include "kernels/gpu_api.h"

namespace moeserve::backend {

std::string DeviceSpec::to_string() const {
  return kind == DeviceKind::kCpu ? std::string("cpu") : "cuda:" + std::to_string(index);
}

Result<DeviceSpec> parse_device_spec(std::string_view text) {
  if (text == "cpu") return DeviceSpec{DeviceKind::kCpu, 0};
  if (text == "cuda" || text == "gpu") return DeviceSpec{DeviceKind::kCuda, 0};
  for (std::string_view prefix : {"cuda:", "gpu:"}) {
    if (text.substr(0, prefix.size()) == prefix) {
      const std::string_view num = text.substr(prefix.size());
      int index = -1;
      const auto [end, ec] = std::from_chars(num.data(), num.data() + num.size(), index);
      if (ec == std::errc() && end == num.data() + num.size() && index >= 0) return DeviceSpec{DeviceKind::kCuda, index};
    }
  }
  return make_error(StatusCode::kInvalidArgument, "unknown device '{}': use cpu, cuda, cuda:N or auto", text);
}

Result<DeviceChoice> choose_device(std::string_view request) {
  const bool automatic = request.empty() || request == "auto";
  MOESERVE_ASSIGN_OR_RETURN(std::vector<gpu::DeviceInfo> gpus, gpu::list_devices());
  if (automatic) {
    if (!gpu::built_with_cuda()) return DeviceChoice{{DeviceKind::kCpu, 0}, "this binary was built without CUDA"};
    if (gpus.empty()) return DeviceChoice{{DeviceKind::kCpu, 0}, "no CUDA GPU is visible"};
    return DeviceChoice{{DeviceKind::kCuda, 0}, "the first visible GPU (" + gpus[0].name + ")"};
  }
  MOESERVE_ASSIGN_OR_RETURN(DeviceSpec spec, parse_device_spec(request));
  if (spec.kind == DeviceKind::kCuda) {
    if (!gpu::built_with_cuda()) {
      return make_error(StatusCode::kUnsupported,
                        "--device {}: this moeserve was built without CUDA (install nvcc and rebuild, or use --device cpu)",
                        request);
    }
    if (gpus.empty()) {
      return make_error(StatusCode::kNotFound, "--device {}: no CUDA GPU is visible on this machine (use --device cpu)",
                        request);
    }
    if (spec.index >= int(gpus.size())) {
      return make_error(StatusCode::kInvalidArgument, "--device {}: only {} GPU(s) are visible (cuda:0..cuda:{})",
                        request, gpus.size(), gpus.size() - 1);
    }
  }
  return DeviceChoice{spec, "asked for"};
}

}  // namespace moeserve::backend
