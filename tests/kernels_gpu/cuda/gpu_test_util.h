// Helpers of the CUDA op tests: whether a GPU is here, device buffers that
// free themselves, poisoned outputs, and a relative error measure.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/gpu_api.h"
#include "tensor/quantize.h"
#include "weight_bytes.h"

namespace moeserve::testing {

inline bool have_gpu() {
  static const bool yes = [] {
    auto devices = gpu::list_devices();
    return gpu::built_with_cuda() && devices.is_ok() && !devices.value().empty();
  }();
  return yes;
}

#define MOESERVE_REQUIRE_GPU() \
  if (!::moeserve::testing::have_gpu()) GTEST_SKIP() << "no CUDA GPU here"

#define MOESERVE_CUDA_ASSERT(call)                                                             \
  do {                                                                                         \
    cudaError_t _e = (call);                                                                   \
    ASSERT_EQ(_e, cudaSuccess) << #call << ": " << cudaGetErrorString(_e);                     \
  } while (0)

// A device array of T that frees itself.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(size_t n) : n_(n) {
    if (n > 0 && cudaMalloc(&p_, n * sizeof(T)) != cudaSuccess) p_ = nullptr;
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) { upload(host); }
  ~DeviceArray() { if (p_ != nullptr) cudaFree(p_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  DeviceArray(DeviceArray&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr; o.n_ = 0; }

  T* get() const { return p_; }
  size_t size() const { return n_; }
  void upload(const std::vector<T>& host) { cudaMemcpy(p_, host.data(), std::min(n_, host.size()) * sizeof(T), cudaMemcpyHostToDevice); }
  std::vector<T> download() const {
    std::vector<T> out(n_);
    cudaDeviceSynchronize();
    cudaMemcpy(out.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
    return out;
  }
  // Fills every byte with 0xFF (a NaN pattern for floats), so unwritten outputs show.
  void poison() { cudaMemset(p_, 0xFF, n_ * sizeof(T)); }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

// ||got - want|| / ||want|| in double; NaN anywhere gives +inf.
inline double relative_error(const float* got, const float* want, size_t n) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    const double d = double(got[i]) - double(want[i]);
    num += d * d;
    den += double(want[i]) * double(want[i]);
  }
  return den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
}

inline std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// A row of n elements of type t at dst: src quantized where t has a
// quantizer, else random bytes with finite scales (the codebook i-quants,
// read only: weight_bytes.h). Either way, dequantize_row gives its values.
inline void weight_row(DType t, const float* src, uint8_t* dst, int64_t n, uint32_t seed) {
  if (dtype_has_quantizer(t)) {
    quantize_row(t, src, dst, n);
    return;
  }
  const std::vector<uint8_t> w = weight_rows(t, {}, 1, n, seed);
  std::memcpy(dst, w.data(), w.size());
}

}  // namespace moeserve::testing
