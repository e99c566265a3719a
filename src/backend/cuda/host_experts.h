// The host's share of a MoE layer whose experts are split between this GPU
// and the host (backend/expert_split.h). start() enqueues the download of
// the layer's selections and normed rows to pinned memory right after the
// routing; the GPU then computes its own experts while finish() waits for
// the download, has the host compute its experts (their rows gathered by
// expert), and enqueues the upload of the outputs and their scatter into
// the pair rows of y, so the weighted combine that follows sees every
// slot, in slot order, wherever it was computed. Only activations and ids
// cross PCIe.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "backend/expert_split.h"

namespace moeserve::backend {

class CudaDevice;

class HostExpertStage {
 public:
  HostExpertStage(CudaDevice& device, cudaStream_t stream) : device_(device), stream_(stream) {}
  ~HostExpertStage();
  HostExpertStage(const HostExpertStage&) = delete;
  HostExpertStage& operator=(const HostExpertStage&) = delete;

  // Enqueues the downloads: selected [n_tokens][n_used] ids and xn [n_tokens][n_embd].
  Status start(const int32_t* selected, const float* xn, int64_t n_tokens, int64_t n_used, int64_t n_embd);
  // Waits for them; the host computes the pairs whose expert is not local;
  // their outputs are uploaded and scattered into y ([pairs][n_embd], device).
  Status finish(const ExpertSplit& split, int layer, int64_t n_ff, float* y);

 private:
  struct Pinned {
    void* data = nullptr;
    size_t bytes = 0;
  };
  Status reserve(Pinned& p, size_t bytes);
  Status reserve_device(size_t bytes);

  CudaDevice& device_;
  cudaStream_t stream_;
  cudaEvent_t inputs_ready_ = nullptr;
  Pinned ids_, xn_, y_, rows_;
  DeviceMemory device_y_;  // [host pairs][n_embd] then [host pairs] row ids
  int64_t n_tokens_ = 0, n_used_ = 0, n_embd_ = 0;
  // Host pairs grouped by expert.
  std::vector<int32_t> count_, order_;
  std::vector<float> gathered_;
  std::vector<ExpertJob> jobs_;
};

}  // namespace moeserve::backend
