// What an expert worker computes: the experts of each layer it owns. The
// protocol loop (worker_session.h) sees only this interface; FileExperts is
// the real one (the model file's expert stacks, computed by the CPU expert
// backend), tests and the fuzzer use small fakes.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/expert_backend.h"
#include "backend/expert_compute.h"
#include "backend/expert_split.h"
#include "core/page_buffer.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "format/gguf.h"

namespace moeserve::ipc {

class WorkerExperts {
 public:
  virtual ~WorkerExperts() = default;
  virtual uint32_t n_layer() const = 0;
  virtual uint32_t n_expert() const = 0;
  virtual uint32_t n_embd() const = 0;
  virtual uint32_t n_ff() const = 0;  // the widest layer's
  virtual bool owns(uint32_t layer, uint32_t expert) const = 0;
  // jobs: global expert ids (owned, checked by the caller), f32 rows in and out.
  virtual Status compute(uint32_t layer, std::span<const backend::ExpertJob> jobs) = 0;
};

struct FileExpertsOptions {
  const GgufFile* file = nullptr;  // must outlive the experts
  // [layer]: the expert ids this worker computes (moe::worker_experts).
  std::vector<std::vector<int32_t>> owned;
  // Re-lay-out the owned experts like the parent's CPU device does
  // (backend/cpu/weight_packing.h): the two must agree for identical results.
  bool pack_weights = true;
  ThreadPool* pool = nullptr;
  // A GPU (`worker --device cuda:N`): the owned experts are uploaded there
  // as compact stacks and computed with its kernels (pack_weights is then
  // ignored). Null: this machine's CPU threads. Must outlive the experts.
  backend::Device* device = nullptr;
};

// The owned experts of a GGUF file. Only their slices of the mapping are
// ever read: without packing the views point into the mapping (the other
// experts' pages are never touched), with packing the owned experts are
// copied into a compact packed stack per layer (local expert i = the i-th
// owned id) and nothing else is read; on a GPU they are uploaded the same
// way, compact.
class FileExperts final : public WorkerExperts {
 public:
  static Result<std::unique_ptr<FileExperts>> load(const FileExpertsOptions& options);

  uint32_t n_layer() const override { return uint32_t(layers_.size()); }
  uint32_t n_expert() const override { return n_expert_; }
  uint32_t n_embd() const override { return n_embd_; }
  uint32_t n_ff() const override { return n_ff_; }
  bool owns(uint32_t layer, uint32_t expert) const override;
  Status compute(uint32_t layer, std::span<const backend::ExpertJob> jobs) override;
  // Bytes of expert weights this worker keeps (its own copies; 0 in place).
  size_t copied_bytes() const { return copied_bytes_; }
  int64_t n_owned() const;

 private:
  struct Layer {
    WeightView gate, up, down;
    int64_t n_ff = 0;
    std::vector<int32_t> local;  // [n_expert]: index into the views, -1: not owned
    std::vector<PageBuffer> buffers;
    std::unique_ptr<backend::ExpertSplit> on_device;  // a GPU's compact stacks of the owned experts
  };
  FileExperts() = default;
  Status load_layer(const GgufFile& file, int layer, const std::vector<int32_t>& owned,
                    const FileExpertsOptions& o);
  Status place_on_device(backend::Device& device);

  std::vector<Layer> layers_;
  uint32_t n_expert_ = 0, n_embd_ = 0, n_ff_ = 0;
  size_t copied_bytes_ = 0;
  std::unique_ptr<backend::ExpertBackend> backend_;
  std::vector<backend::ExpertJob> local_jobs_;
};

}  // namespace moeserve::ipc
