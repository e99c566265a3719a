// backend/expert_compute.h's ExpertBackend on a GPU: the jobs' rows (host
// memory) go up in one copy, the expert kernels run over the batch's
// stacks (views this device placed: every expert id of a job indexes its
// stack), and the unweighted outputs come back in one copy. What an expert
// worker started with --device cuda:N computes with (ipc/worker_experts.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "backend/expert_compute.h"

namespace moeserve::backend {

class CudaDevice;

class CudaExpertBackend final : public ExpertBackend {
 public:
  static Result<std::unique_ptr<CudaExpertBackend>> create(CudaDevice& device);
  ~CudaExpertBackend() override;
  CudaExpertBackend(const CudaExpertBackend&) = delete;
  CudaExpertBackend& operator=(const CudaExpertBackend&) = delete;

  // Calls from one thread at a time (it owns its stream and buffers).
  Status compute(const ExpertBatch& batch) override;

 private:
  explicit CudaExpertBackend(CudaDevice& device) : device_(device) {}
  Status reserve_pinned(size_t bytes);
  Status reserve_device(DeviceMemory& m, size_t bytes, const char* what);

  CudaDevice& device_;
  cudaStream_t stream_ = nullptr;
  void* pinned_ = nullptr;  // the rows in and out, the groups
  size_t pinned_bytes_ = 0;
  DeviceMemory inputs_, hidden_, outputs_, scratch_;
  std::vector<int32_t> order_;  // jobs by expert id
};

}  // namespace moeserve::backend
