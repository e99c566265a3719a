// A loaded model, ready to run: the mapped GGUF file, the device(s) that
// compute it, the network (an architecture from models/registry.h) and the
// tokenizer.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_device.h"
#include "backend/expert_router.h"
#include "backend/expert_split.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "format/gguf.h"
#include "models/language_model.h"
#include "runtime/expert_promotion.h"
#include "runtime/kv_cache.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::runtime {

// Layers [begin, end) computed on `device` ("cpu", "cuda:N"): one shard of
// a layer split (split/layer_split.h plans them).
struct LayerShard {
  std::string device;
  int64_t begin = 0, end = 0;
  // A shard another process computes (proc:, mpi:): not owned, outlives
  // the model. `device` then only names it.
  backend::RemoteLayers* remote = nullptr;
};

struct ModelLoadOptions {
  int n_threads = 0;  // <= 0: one per physical core
  // Re-lay-out the weights this CPU has packed kernels for (see
  // backend/cpu/weight_packing.h). Off: every weight is used in place from the file.
  bool pack_weights = true;
  // Fault every page of the file in before use (MADV_POPULATE_READ), so the
  // first requests do not pay a page fault per 4 KiB (the server wants this).
  bool populate = false;
  // cpu, cuda, cuda:N or auto (the first GPU when there is one).
  std::string device = "cpu";
  // On a GPU: the experts each MoE layer keeps in GPU memory ([layer]:
  // expert ids; moe/placement.h reads them from a placement file or plans
  // them); every other expert is computed on the CPU threads from the
  // file's mapping, at the same time as the GPU's. Empty: all on the GPU.
  // On the CPU (tests): the same split, both halves computed by the CPU.
  std::vector<std::vector<int32_t>> gpu_experts{};
  bool split_experts = false;  // gpu_experts applies (an empty list: no expert on the GPU)
  // With experts on the CPU: pin the file's mapping, so a prefill chunk's
  // copies of cold experts to the GPU run asynchronously at full PCIe
  // speed (and decode may stream some). Off (--no-pin: the pinned pages
  // cannot be swapped or dropped, which a machine with little RAM to
  // spare may not afford), or where pinning fails: the copies go through
  // two pinned staging buffers, at the slower of memcpy and PCIe.
  bool pin_file = true;
  // Experts another executor computes, an expert worker process
  // (ipc/worker_backend.h): [layer] -> expert ids, the model's device
  // computes every other one (on a GPU: of the experts gpu_experts leaves
  // off the GPU, the worker's go to it and the CPU threads compute the
  // rest). A call the executor answers kUnavailable (the worker died or
  // timed out) is computed here instead (the CPU device with its own
  // weights; a GPU's CPU threads from the file's mapping).
  // Null: none. Must outlive the model.
  backend::ExpertBackend* expert_worker = nullptr;
  std::vector<std::vector<int32_t>> worker_experts{};
  // A layer split (non-empty: `device` is not used): consecutive shards
  // covering every layer, each on its own device object — two shards on
  // "cpu", or on one GPU, still hand their boundary rows over as two
  // devices would. The embedding sits with the first shard, the output head
  // with the last.
  std::vector<LayerShard> layer_shards{};
  // A layer split whose shards can compute at once (two GPUs, a GPU and the
  // CPU, another process) pipelines a forward of many rows in this many
  // micro-batches; the prefill then hands it this many batches of rows a
  // forward (--micro-batches; 1: off).
  int64_t micro_batches = 4;
  // ... of at least this many rows each (--micro-batch-rows; smaller batches
  // are pipelined in fewer micro-batches, or not at all).
  int64_t min_micro_batch_rows = 512;
  // A shard process (`moeserve shard`): only layers [first_layer,
  // end_layer) (-1: to the last) are placed, on `device`; the embedding
  // when it begins at 0, the output head when it ends at the last layer.
  int64_t first_layer = 0, end_layer = -1;
};

class Model {
 public:
  // open GGUF -> device -> architecture (hparams, weights placed) ->
  // tokenizer. Errors name the file and the key or tensor at fault.
  static Result<std::unique_ptr<Model>> load(const std::string& path, const ModelLoadOptions& options = {});
  // The same from an already parsed file (tests build files in memory).
  static Result<std::unique_ptr<Model>> from_gguf(GgufFile file, const ModelLoadOptions& options = {});

  const GgufFile& file() const { return file_; }
  models::LanguageModel& net() { return *net_; }
  const models::LanguageModel& net() const { return *net_; }
  const models::ModelInfo& info() const { return net_->info(); }
  const tok::Tokenizer& tokenizer() const { return *tokenizer_; }
  ThreadPool& pool() { return *pool_; }
  // Every device of the model runs draft trees (speculative decoding's tree
  // verify; backend::Device::supports_tree_verify).
  bool tree_verify() const;
  // The device that computes the model (a layer split's first shard), and
  // why it was chosen.
  backend::Device& device() { return *net_->placement().io; }
  // Every device the model computes on, each once (io first).
  std::vector<backend::Device*> devices() const;
  const std::string& device_reason() const { return device_reason_; }
  // The CPU device (always there: it also serves host-side work).
  backend::CpuDevice& cpu_device() { return *cpu_; }
  // What weight packing did at load (0 tensors when off, not supported here,
  // or the model is on a GPU).
  const backend::PackedWeights& packed() const { return cpu_->packed(); }
  // Layers whose experts are shared between the GPU and the CPU ([layer],
  // null: all on the layer's device), with their hit counters.
  const std::vector<std::unique_ptr<backend::ExpertSplit>>& expert_splits() const { return splits_; }
  // Promotion (runtime/expert_promotion.h): swaps every split layer's
  // busiest cold experts in for its idlest hot ones where the window's
  // counts call for it, then starts a new window. Only between forwards, on
  // the thread that runs them. Returns the swaps made.
  Result<std::vector<ExpertSwap>> promote_experts(const PromotionOptions& options = {});

  // A KV cache of `capacity` positions on the devices of the layers; with
  // a pool (new_kv_pool), its rows come from there as it grows.
  Result<KvCache> new_kv_cache(int64_t capacity, std::shared_ptr<KvBlockPool> pool = nullptr);
  // A block pool for paged KV on this model's devices (KvBlockPool::create:
  // kUnsupported where a device cannot page).
  Result<std::shared_ptr<KvBlockPool>> new_kv_pool(const KvPoolOptions& options) {
    return KvBlockPool::create(net_->placement(), info(), options);
  }
  // Every attention layer computed here is on a device that pages KV.
  bool pages_kv() const;
  Result<std::unique_ptr<models::Workspace>> new_workspace(int64_t max_tokens) {
    return net_->create_workspace(max_tokens);
  }

 private:
  explicit Model(GgufFile file) : file_(std::move(file)) {}
  Status split_experts(const ModelLoadOptions& options, models::Placement& placement);
  void set_split_router(backend::ExpertSplit& split, int layer, int64_t n_expert) const;
  Status give_experts_to_worker(const ModelLoadOptions& options, models::Placement& placement);
  Status give_layer_to_worker(const ModelLoadOptions& options, models::Placement& placement, int64_t l);
  Status place_layer_shards(const ModelLoadOptions& options,
                            models::Placement& placement);  // model_shards.cpp
  Status place_shard_range(const ModelLoadOptions& options,
                           models::Placement& placement);  // model_shards.cpp
  Status split_shard_experts(const ModelLoadOptions& options,
                             models::Placement& placement);  // model_shards.cpp
  Status give_shard_experts_to_worker(const ModelLoadOptions& options,
                                      models::Placement& placement);  // model_shards.cpp
  void pin_for_expert_copies(bool pin);
  // The GPU whose cold experts the CPU computes (a layer split's first GPU
  // shard: the file's pinning serves them all); null on the CPU alone.
  backend::Device* expert_gpu() const;
  void measure_cpu_experts();
  GgufFile file_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<backend::CpuDevice> cpu_;  // declared before net_: outlives the views into it
  std::unique_ptr<backend::Device> gpu_;
  std::vector<std::unique_ptr<backend::Device>> shard_devices_;  // a layer split's devices besides cpu_
  std::unique_ptr<backend::ExpertBackend> host_experts_;         // computes the splits' CPU experts
  std::unique_ptr<backend::ExpertRouter> expert_router_;         // a GPU's host experts shared with a worker
  std::unique_ptr<backend::ExpertCostModel> expert_cost_;        // CPU or a copy to the GPU, per call
  std::vector<std::unique_ptr<backend::ExpertSplit>> splits_;    // declared before net_: outlive it
  bool worker_splits_ = false;  // the splits follow a worker's placement: never promoted
  std::string device_reason_;
  std::unique_ptr<models::LanguageModel> net_;
  std::unique_ptr<tok::Tokenizer> tokenizer_;
};

}  // namespace moeserve::runtime
