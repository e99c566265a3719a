// The CPU backend: host memory, the SIMD kernel table and the thread pool.
// Weights are used in place from the memory-mapped file, or re-laid-out
// into the packed layout where this CPU has packed kernels; every op is the
// CPU kernels the engine had before backends existed, called in the same
// order, so results are bit-identical to them.
#pragma once

#include <memory>

#include "backend/activation_observer.h"
#include "backend/backend.h"
#include "backend/cpu/expert_backend.h"
#include "backend/cpu/weight_packing.h"
#include "core/progress.h"
#include "core/thread_pool.h"

namespace moeserve::backend {

struct CpuDeviceOptions {
  ThreadPool* pool = nullptr;  // null: the calling thread only
  // Re-lay-out the weights this CPU has packed kernels for.
  bool pack_weights = true;
  // Drop the copied pages of the file mapping after packing (only for views
  // into a file mapping: on other memory it would zero them).
  bool release_source = false;
  ProgressOptions::Mode progress = ProgressOptions::Mode::kAuto;
};

class CpuDevice final : public Device {
 public:
  explicit CpuDevice(const CpuDeviceOptions& options) : options_(options) {}

  DeviceKind kind() const override { return DeviceKind::kCpu; }
  std::string name() const override { return "cpu"; }
  std::string description() const override;
  bool host_memory() const override { return true; }
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
  Result<std::unique_ptr<ExpertBackend>> create_expert_backend() override;

  ThreadPool* pool() const { return options_.pool; }
  // Where create_ops()'s ops compute experts; null: a CpuExpertBackend on
  // the pool (per ops). Set before create_ops(); must outlive the ops.
  void set_expert_backend(ExpertBackend* experts) { experts_ = experts; }
  // Shown the inputs of every weight product of the ops create_ops() makes
  // from now on (activation_observer.h; null: none). Must outlive them.
  void set_activation_observer(ActivationObserver* observer) { observer_ = observer; }
  const PackedWeights& packed() const { return packed_; }

 protected:
  void release(void* data, size_t bytes) override;

 private:
  CpuDeviceOptions options_;
  ExpertBackend* experts_ = nullptr;
  ActivationObserver* observer_ = nullptr;
  PackedWeights packed_;
};

// A CPU device without threads or packing, for host-memory buffers that
// belong to no model (test caches, staging).
CpuDevice& host_device();

// The ops of the CPU device (also used directly by tests).
// With an observer, ops show it their products' inputs; their own expert
// backend (experts null) too.
std::unique_ptr<Ops> make_cpu_ops(ThreadPool* pool, ExpertBackend* experts,
                                  ActivationObserver* observer = nullptr);

}  // namespace moeserve::backend
