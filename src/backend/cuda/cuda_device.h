// The CUDA backend: one GPU's memory, the weights uploaded once (through
// pinned staging, with a progress bar), and the ops of backend.h as CUDA
// kernels (kernels/cuda) enqueued on a stream per workspace.
#pragma once

#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"

namespace moeserve::backend {

class StagedUpload;

class CudaDevice final : public Device {
 public:
  static Result<std::unique_ptr<CudaDevice>> open(int index);
  ~CudaDevice() override;

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string name() const override { return "cuda:" + std::to_string(index_); }
  std::string description() const override;
  bool host_memory() const override { return false; }
  DeviceMemoryInfo memory_info() const override;
  Result<DeviceMemory> allocate(size_t bytes, std::string_view what) override;
  Status copy_to_device(void* dst, const void* host, size_t bytes) override;
  Status copy_to_host(void* host, const void* src, size_t bytes) override;
  Status fill_zero(void* dst, size_t bytes) override;
  Status copy_within(void* dst, const void* src, size_t bytes) override;
  bool supports_tree_verify() const override { return true; }
  bool supports_paged_kv() const override { return true; }
  Result<PlacedWeights> place_weights(std::span<const WeightRef> weights) override;
  Result<std::unique_ptr<Ops>> create_ops() override;
  Result<double> pin_host_memory(std::span<const uint8_t> bytes) override;
  bool reads_pinned_host_memory() const override { return host_pointers_usable_ && !pinned_spans_.empty(); }
  Result<double> probe_staged_copies(std::span<const uint8_t> bytes) override;
  // Whether [p, p + bytes) lies in memory pin_host_memory pinned (copies
  // from it run asynchronously at full speed; others go through staging).
  bool host_memory_pinned(const void* p, size_t bytes) const;
  // Whether [p, p + bytes) lies in pinned memory this GPU's kernels read through p.
  bool kernels_read_host(const uint8_t* p, size_t bytes) const {
    return host_pointers_usable_ && host_memory_pinned(p, bytes);
  }
  Status replace_local_expert(ExpertSplit& split, size_t slot, int32_t expert) override;
  Result<std::unique_ptr<ExpertBackend>> create_expert_backend() override;
  bool supports_attention_head_dim(int64_t head_dim) const override;

  int index() const { return index_; }
  // Some layer shares its experts with the host (a prefill chunk's forward
  // then runs eagerly, waiting for the host mid-way; a decode step's stays
  // one graph, trading with the host through mailboxes).
  bool has_host_experts() const { return has_host_experts_; }
  // A split's local expert ids in device memory (null: none, or not placed here).
  const int32_t* local_expert_ids(const ExpertSplit* split) const;
  // The split layer placed after this one (layer order), null after the last.
  // The splits placed here, in layer order.
  std::span<const ExpertSplit* const> splits() const { return split_order_; }
  const ExpertSplit* next_split(const ExpertSplit* split) const;
  Status activate() const;  // makes this GPU current on the calling thread
  // Lets this GPU's copies read GPU `source`'s memory directly (peer access
  // over NVLink or PCIe) where the two can; false: peer copies go through
  // the host. Decided once per pair, and said in the log.
  bool reads_peer(int source) const;

 protected:
  void release(void* data, size_t bytes) override;

 private:
  explicit CudaDevice(int index) : index_(index) {}
  Status upload_weight(const WeightRef& ref, StagedUpload& staging);
  Status upload_split_stack(const WeightRef& ref, StagedUpload& staging);

  int index_;
  cudaDeviceProp props_{};
  std::vector<DeviceMemory> weights_;  // the uploaded copies
  // Source bytes already uploaded (a tied output shares the embedding's).
  std::map<std::pair<const uint8_t*, size_t>, const uint8_t*> uploaded_;
  std::map<const ExpertSplit*, DeviceMemory> split_ids_;
  std::vector<const ExpertSplit*> split_order_;  // as placed: layer order
  struct CompactStack {
    uint8_t* data = nullptr;
    size_t matrix_bytes = 0;
    WeightUse use = WeightUse::kExpertGate;
  };
  std::map<const ExpertSplit*, std::vector<CompactStack>> split_stacks_;  // for promotion
  std::vector<void*> pinned_ranges_;                           // host memory registered by pin_host_memory
  std::vector<std::pair<uintptr_t, uintptr_t>> pinned_spans_;  // their [begin, end)
  bool host_pointers_usable_ = false;  // kernels read registered memory through host pointers
  bool has_host_experts_ = false;
  mutable std::mutex peer_mu_;
  mutable std::map<int, bool> peer_;  // reads_peer's answers
};

std::unique_ptr<Ops> make_cuda_ops(CudaDevice& device, cudaStream_t stream);

}  // namespace moeserve::backend
