// Choosing and opening devices: `--device cpu|cuda[:N]|auto`.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "backend/backend.h"
#include "core/status.h"

namespace moeserve::backend {

struct DeviceSpec {
  DeviceKind kind = DeviceKind::kCpu;
  int index = 0;
  std::string to_string() const;
};

// "cpu", "cuda", "cuda:N", "gpu" (= cuda). Errors say what is accepted.
Result<DeviceSpec> parse_device_spec(std::string_view text);

struct DeviceChoice {
  DeviceSpec spec;
  std::string reason;  // for the start-up line: "the first GPU (NVIDIA H100 80GB HBM3)", "asked for"
};

// "auto" (or empty): the first CUDA GPU when this binary has CUDA and one
// is visible, else the CPU. Anything else: that device, checked to exist
// (a binary without CUDA, or no GPU, is a one-line error saying which).
Result<DeviceChoice> choose_device(std::string_view request);

// A CUDA device (backend/cuda; in a build without CUDA, backend/no_cuda
// answers that it was not built).
Result<std::unique_ptr<Device>> open_cuda_device(int index);

}  // namespace moeserve::backend
