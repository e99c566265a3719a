// The GPU side of the kernel layer, as seen from the rest of the engine.
// Built from src/kernels/cuda when nvcc is present; otherwise from
// src/kernels/no_cuda, whose functions report "not built" — callers never
// need #ifdef.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "tensor/dtype.h"

namespace moeserve::gpu {

struct DeviceInfo {
  int index = 0;
  std::string name;
  int cc_major = 0;
  int cc_minor = 0;
  int sm_count = 0;
  uint64_t total_bytes = 0;
  uint64_t free_bytes = 0;
};

// True when this binary was built with CUDA kernels.
bool built_with_cuda();
// The visible GPUs; an empty list (not an error) when there are none.
Result<std::vector<DeviceInfo>> list_devices();
// The device-memory bandwidth of GPU `device` now, in GB/s: a large
// device-to-device copy timed with events, counting bytes read plus written
// (the roofline `moeserve bench` prints decode against).
Result<double> measure_device_bandwidth(int device);
// Dequantize n elements of weight type `type` on GPU `device`: host bytes in,
// host floats out. Used by the GPU-vs-CPU-reference kernel tests.
Status dequantize_on_gpu(int device, DType type, const void* src, float* dst, int64_t n);

}  // namespace moeserve::gpu
