#include "runtime/model.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string_view>

#include "backend/devices.h"
#include "core/log.h"
#include "core/memory_bandwidth.h"
#include "format/model_keys.h"
#include "models/forward_common.h"
#include "models/registry.h"
#include "tokenizer/vocab_gguf.h"

namespace moeserve::runtime {

Result<std::unique_ptr<Model>> Model::load(const std::string& path, const ModelLoadOptions& options) {
  MOESERVE_ASSIGN_OR_RETURN(GgufFile file, GgufFile::open(path));
  return from_gguf(std::move(file), options);
}

Result<std::unique_ptr<Model>> Model::from_gguf(GgufFile file, const ModelLoadOptions& options) {
  std::unique_ptr<Model> m(new Model(std::move(file)));
  const bool split = !options.layer_shards.empty();
  MOESERVE_ASSIGN_OR_RETURN(backend::DeviceChoice choice,
                            backend::choose_device(split ? "cpu" : options.device));
  m->device_reason_ = choice.reason;
  m->pool_ = std::make_unique<ThreadPool>(options.n_threads);
  // A layer split packs for the CPU whenever one of its shards is the CPU.
  const bool on_cpu = split ? std::any_of(options.layer_shards.begin(), options.layer_shards.end(),
                                          [](const LayerShard& s) { return s.device == "cpu"; })
                            : choice.spec.kind == backend::DeviceKind::kCpu;
  m->cpu_ = std::make_unique<backend::CpuDevice>(
      backend::CpuDeviceOptions{.pool = m->pool_.get(),
                                .pack_weights = options.pack_weights && on_cpu,
                                .release_source = m->file_.file_backed()});
  models::Placement placement;
  placement.io = m->cpu_.get();
  if (split) {
    MOESERVE_RETURN_IF_ERROR(m->place_layer_shards(options, placement));
  } else if (!on_cpu) {
    if (options.expert_worker != nullptr && !options.split_experts) {
      return make_error(StatusCode::kInvalidArgument,
                        "an expert worker, but every expert is on the GPU: leave some off it (--n-cpu-moe, "
                        "--cpu-moe, --gpu-mem, --placement)");
    }
    MOESERVE_ASSIGN_OR_RETURN(m->gpu_, backend::open_cuda_device(choice.spec.index));
    placement.io = m->gpu_.get();
    if (options.split_experts) MOESERVE_RETURN_IF_ERROR(m->split_experts(options, placement));
  } else if (options.expert_worker != nullptr) {
    MOESERVE_RETURN_IF_ERROR(m->give_experts_to_worker(options, placement));
  } else if (options.split_experts) {
    // The CPU takes splits too (its own experts by id, the others through
    // the split's backend, the same kernels): how CI checks the splits'
    // bookkeeping and promotion without a GPU. The serve flags never ask
    // for it on the CPU.
    MOESERVE_RETURN_IF_ERROR(m->split_experts(options, placement));
  }
  if (!split && (options.first_layer != 0 || options.end_layer >= 0))
    MOESERVE_RETURN_IF_ERROR(m->place_shard_range(options, placement));
  if (options.populate && m->file_.file_backed() && on_cpu) MappedFile::populate(m->file_.bytes());
  const auto t0 = std::chrono::steady_clock::now();
  Result<std::unique_ptr<models::LanguageModel>> net = models::create_model(m->file_, placement);
  const bool auto_device = !split && (options.device.empty() || options.device == "auto");
  if (!net.is_ok() && net.status().code() == StatusCode::kUnsupported && !on_cpu && auto_device) {
    // The architecture has layers this GPU's backend cannot run yet: the
    // CPU runs everything (--device auto promises a device that works).
    MOESERVE_LOG_WARN("{}; running on the CPU instead", net.status().message());
    ModelLoadOptions cpu = options;
    cpu.device = "cpu";
    cpu.split_experts = false;
    cpu.gpu_experts.clear();
    GgufFile file = std::move(m->file_);
    m.reset();
    return from_gguf(std::move(file), cpu);
  }
  MOESERVE_ASSIGN_OR_RETURN(m->net_, std::move(net));
  // Copies of cold experts to a GPU (hybrid placement): not for an expert
  // worker's splits of CPU layers beside a GPU shard, which have no cost model.
  if (!m->splits_.empty() && m->expert_gpu() != nullptr && m->expert_cost_ != nullptr)
    m->pin_for_expert_copies(options.pin_file);
  if (m->packed().tensors > 0) {
    MOESERVE_LOG_INFO("packed {} weight tensors ({:.2f} GiB) for the {} kernels in {:.2f} s",
                      m->packed().tensors, double(m->packed().bytes) / double(1 << 30),
                      cpu::simd_level_name(cpu::cpu_kernels().level),
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  MOESERVE_ASSIGN_OR_RETURN(tok::VocabData vocab, tok::vocab_from_gguf(m->file_));
  if (int64_t(vocab.tokens.size()) > m->info().n_vocab) {
    return make_error(StatusCode::kInvalidFormat,
                      "{}: the tokenizer has {} tokens but token_embd only {} rows", m->file_.name(),
                      vocab.tokens.size(), m->info().n_vocab);
  }
  MOESERVE_ASSIGN_OR_RETURN(m->tokenizer_, tok::Tokenizer::create(std::move(vocab)));
  return m;
}

// Layers that keep only some of their experts on the GPU get a split whose
// other experts the CPU computes (its threads, the file's mapping).
Status Model::split_experts(const ModelLoadOptions& options, models::Placement& placement) {
  const std::vector<std::vector<int32_t>>& gpu_experts = options.gpu_experts;
  const int64_t n_expert = file_.get_int(file_.arch_key(keys::kExpertCount)).value_or(0);
  const int64_t n_layer = file_.get_int(file_.arch_key(keys::kBlockCount)).value_or(0);
  if (n_expert <= 0) {
    return make_error(StatusCode::kInvalidArgument,
                      "{}: experts placed on the GPU, but the model has no experts", file_.name());
  }
  if (int64_t(gpu_experts.size()) > n_layer) {
    return make_error(StatusCode::kInvalidArgument, "{}: an expert placement for {} layers, the model has {}",
                      file_.name(), gpu_experts.size(), n_layer);
  }
  host_experts_ = std::make_unique<backend::CpuExpertBackend>(pool_.get());
  // An expert worker computes the host experts it owns (the CPU threads the
  // rest, and its own ones when it is gone).
  backend::ExpertBackend* host = host_experts_.get();
  if (options.expert_worker != nullptr) {
    expert_router_ = std::make_unique<backend::ExpertRouter>(options.expert_worker, host_experts_.get(),
                                                             options.worker_experts, n_expert);
    host = expert_router_.get();
    worker_splits_ = true;
  }
  // The cost model's CPU side: DRAM measured now; the arithmetic guessed
  // (about 50 GFLOP/s a thread with the integer dot products) until it is
  // measured on the placed experts, then refined from the host calls; PCIe
  // once the file is pinned (after placement).
  backend::ExpertCostInputs in;
  if (Result<double> dram = measure_read_bandwidth({.pool = pool_.get()}); dram.is_ok())
    in.dram_bytes_per_s = *dram * 1e9;
  in.cpu_flops_per_s = 50e9 * double(pool_->size());
  auto policy = [](const char* env) {
    const char* v = std::getenv(env);
    const std::string p = v == nullptr ? "" : v;
    return p == "never"    ? backend::ExpertCopyPolicy::kNever
           : p == "always" ? backend::ExpertCopyPolicy::kAlways
                           : backend::ExpertCopyPolicy::kAuto;
  };
  // With a worker too: a prefill chunk may copy the cold experts here when
  // that is quicker than the worker computing them (the model learns the
  // worker's speed from its calls); decode leaves them to the worker.
  in.policy = policy("MOESERVE_EXPERT_COPIES");
  // A prefetched prefill layer leaves its least selected cold experts to
  // the CPU threads, which are idle while the GPU waits for the copies
  // (MOESERVE_PREFETCH_SHARE=0: copy them all, for comparison; a fraction
  // such as 0.3: always leave that share, for tests).
  if (const char* share_env = std::getenv("MOESERVE_PREFETCH_SHARE"); share_env != nullptr) {
    const double share = std::atof(share_env);
    in.prefetch_host_share = share > 0.0;
    if (share > 0.0 && share < 1.0) in.prefetch_share_fixed = share;
  }
  // Streaming cold experts through the GPU during decode is opt-in
  // (MOESERVE_EXPERT_STREAM=auto|always): measured on an H100 host it gained
  // 2% with every expert on the CPU and cost 10% where few experts are
  // cold (docs/BENCHMARKS.md); the CPU's reads slow down while the GPU's run.
  const char* stream_env = std::getenv("MOESERVE_EXPERT_STREAM");
  in.stream_policy =
      stream_env != nullptr && (std::string(stream_env) == "auto" || std::string(stream_env) == "always")
          ? policy("MOESERVE_EXPERT_STREAM")
          : backend::ExpertCopyPolicy::kNever;
  expert_cost_ = std::make_unique<backend::ExpertCostModel>(in);
  splits_.resize(size_t(n_layer));
  placement.expert_splits.assign(size_t(n_layer), nullptr);
  for (int64_t l = 0; l < n_layer; ++l) {
    const std::vector<int32_t> none;
    std::vector<int32_t>
        every;  // a layer without experts (Laguna's dense first layer): nothing leaves the GPU
    if (file_.find_tensor(keys::blk(int(l), keys::kFfnGateExps)) == nullptr) {
      for (int32_t e = 0; e < int32_t(n_expert); ++e) every.push_back(e);
    }
    const std::vector<int32_t>& ids = !every.empty()                   ? every
                                      : size_t(l) < gpu_experts.size() ? gpu_experts[size_t(l)]
                                                                       : none;
    for (int32_t e : ids) {
      if (e < 0 || e >= n_expert) {
        return make_error(StatusCode::kInvalidArgument, "{}: layer {}: expert {} is outside 0..{}",
                          file_.name(), l, e, n_expert - 1);
      }
    }
    splits_[size_t(l)] = std::make_unique<backend::ExpertSplit>(n_expert, ids, host);
    splits_[size_t(l)]->set_cost(expert_cost_.get());
    set_split_router(*splits_[size_t(l)], int(l), n_expert);
    placement.expert_splits[size_t(l)] = splits_[size_t(l)].get();
  }
  return Status::ok();
}

// The layer's router from the file, when it is plain f32 (as converters
// write it): the host guesses the layer's experts a layer early with it.
void Model::set_split_router(backend::ExpertSplit& split, int layer, int64_t n_expert) const {
  const GgufTensorInfo* router = file_.find_tensor(keys::blk(layer, keys::kFfnGateInp));
  if (router == nullptr || router->type != DType::F32 || router->ne[1] != n_expert || router->n_dims != 2)
    return;
  const GgufTensorInfo* bias = file_.find_tensor(keys::blk(layer, keys::kFfnExpProbsB, "bias"));
  const bool bias_ok = bias != nullptr && bias->type == DType::F32 && bias->n_elements() == n_expert;
  split.set_router(reinterpret_cast<const float*>(router->data), router->ne[0],
                   bias_ok ? reinterpret_cast<const float*>(bias->data) : nullptr);
}

// On the CPU, a split per layer whose `host` is the worker: the device
// keeps every expert (it computes the worker's when the worker is gone) and
// computes all but the worker's.
Status Model::give_experts_to_worker(const ModelLoadOptions& options, models::Placement& placement) {
  const int64_t n_expert = file_.get_int(file_.arch_key(keys::kExpertCount)).value_or(0);
  const int64_t n_layer = file_.get_int(file_.arch_key(keys::kBlockCount)).value_or(0);
  if (n_expert <= 0) {
    return make_error(StatusCode::kInvalidArgument, "{}: an expert worker, but the model has no experts",
                      file_.name());
  }
  if (int64_t(options.worker_experts.size()) > n_layer) {
    return make_error(StatusCode::kInvalidArgument, "{}: worker experts for {} layers, the model has {}",
                      file_.name(), options.worker_experts.size(), n_layer);
  }
  splits_.resize(size_t(n_layer));
  placement.expert_splits.assign(size_t(n_layer), nullptr);
  for (int64_t l = 0; l < n_layer; ++l) MOESERVE_RETURN_IF_ERROR(give_layer_to_worker(options, placement, l));
  worker_splits_ = true;
  return Status::ok();
}

// Layer l's split of give_experts_to_worker (splits_ and the placement's
// lists sized already).
Status Model::give_layer_to_worker(const ModelLoadOptions& options, models::Placement& placement, int64_t l) {
  const int64_t n_expert = file_.get_int(file_.arch_key(keys::kExpertCount)).value_or(0);
  std::vector<bool> remote(size_t(n_expert), false);
  if (size_t(l) < options.worker_experts.size()) {
    for (int32_t e : options.worker_experts[size_t(l)]) {
      if (e < 0 || e >= n_expert) {
        return make_error(StatusCode::kInvalidArgument, "{}: layer {}: worker expert {} is outside 0..{}",
                          file_.name(), l, e, n_expert - 1);
      }
      remote[size_t(e)] = true;
    }
  }
  std::vector<int32_t> local;
  for (int32_t e = 0; e < int32_t(n_expert); ++e) {
    if (!remote[size_t(e)]) local.push_back(e);
  }
  splits_[size_t(l)] =
      std::make_unique<backend::ExpertSplit>(n_expert, std::move(local), options.expert_worker);
  placement.expert_splits[size_t(l)] = splits_[size_t(l)].get();
  return Status::ok();
}

// A prefill chunk may copy cold experts to the GPU: their source (the
// file's mapping) is pinned for full-speed asynchronous copies; unpinned
// (pinning failed, or pin false) they go through staging buffers, and the
// cost model weighs them at the rate measured that way.
void Model::pin_for_expert_copies(bool pin) {
  const auto t0 = std::chrono::steady_clock::now();
  backend::Device* gpu = expert_gpu();
  Result<double> pcie = pin ? gpu->pin_host_memory(file_.bytes())
                            : Result<double>(make_error(StatusCode::kUnsupported, "--no-pin"));
  const bool pinned = pcie.is_ok() && *pcie > 0.0;
  std::string why_not;
  if (!pinned) {
    why_not = pcie.is_ok() ? std::string("the GPU does not copy from host memory") : pcie.status().message();
    pcie = gpu->probe_staged_copies(file_.bytes());
  }
  if (!pcie.is_ok() || *pcie <= 0.0) {
    MOESERVE_LOG_INFO("cold experts are computed on the CPU at every batch size: {}",
                      pcie.is_ok() ? why_not : pcie.status().message());
    return;
  }
  expert_cost_->set_pcie(*pcie);
  measure_cpu_experts();
  const backend::ExpertCostInputs in = expert_cost_->inputs();
  if (!pinned) {
    MOESERVE_LOG_INFO(
        "cold experts: the file is not pinned ({}); copies go through pinned staging at {:.1f} GB/s, DRAM "
        "{:.1f} GB/s, CPU {:.0f} GFLOP/s: a chunk copies a layer's cold experts to the GPU when that is "
        "quicker than the CPU computing them",
        why_not, *pcie / 1e9, in.dram_bytes_per_s / 1e9, in.cpu_flops_per_s / 1e9);
    return;
  }
  // The GPU's own kernels read pinned host memory at ~90% of the copy
  // engines' rate (H100 host: 47-50 against 55 GB/s).
  if (gpu->reads_pinned_host_memory()) expert_cost_->set_stream(0.9 * *pcie);
  const backend::ExpertCostInputs streamed = expert_cost_->inputs();
  MOESERVE_LOG_INFO(
      "cold experts: the file pinned in {:.1f} s; PCIe {:.1f} GB/s, DRAM {:.1f} GB/s, CPU {:.0f} GFLOP/s "
      "(refined as it runs): a chunk copies a layer's cold experts to the GPU when that is quicker "
      "than the CPU computing them{}",
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), *pcie / 1e9,
      in.dram_bytes_per_s / 1e9, in.cpu_flops_per_s / 1e9,
      streamed.stream_bytes_per_s > 0.0 && streamed.stream_policy != backend::ExpertCopyPolicy::kNever
          ? "; a decode step's GPU streams some cold experts from host memory while the CPU computes the "
            "rest "
            "(MOESERVE_EXPERT_STREAM)"
          : "");
}

// The CPU threads' expert arithmetic for the cost model's first chunk
// (later host calls refine it): 32 rows through two experts of the first
// layer with host experts, about what a 512-token chunk gives each expert.
// An expert worker's speed is learned from its calls instead.
void Model::measure_cpu_experts() {
  if (worker_splits_) return;
  for (size_t l = 0; l < splits_.size(); ++l) {
    if (splits_[l] == nullptr || splits_[l]->all_local()) continue;
    const auto t0 = std::chrono::steady_clock::now();
    Result<double> flops = splits_[l]->probe_host_flops(int(l), 32);
    if (flops.is_ok() && *flops > 0.0) {
      expert_cost_->set_cpu_flops(*flops);
      MOESERVE_LOG_DEBUG("CPU experts: {:.0f} GFLOP/s measured on layer {} in {:.1f} ms", *flops / 1e9, l,
                         1e3 * std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return;
  }
}

Result<std::vector<ExpertSwap>> Model::promote_experts(const PromotionOptions& options) {
  std::vector<ExpertSwap> done;
  if (worker_splits_) return done;  // the placement names the worker's experts; they stay there
  for (size_t l = 0; l < splits_.size(); ++l) {
    if (splits_[l] == nullptr) continue;  // a layer split's CPU shard keeps every expert
    backend::ExpertSplit& split = *splits_[l];
    for (const ExpertSwap& s : plan_swaps(split, int(l), options)) {
      // (The layer's device: a layer split's GPU shard holds its experts.)
      MOESERVE_RETURN_IF_ERROR(
          net_->placement().layer(int64_t(l))->replace_local_expert(split, s.slot, s.expert_in));
      done.push_back(s);
    }
    split.start_window();
  }
  if (!done.empty()) {
    MOESERVE_LOG_INFO(
        "promoted {} experts to the GPU (e.g. layer {}: expert {}, {} selections, for expert {}, {})",
        done.size(), done[0].layer, done[0].expert_in, done[0].selections_in, done[0].expert_out,
        done[0].selections_out);
  }
  return done;
}

Result<KvCache> Model::new_kv_cache(int64_t capacity, std::shared_ptr<KvBlockPool> pool) {
  return KvCache::allocate(net_->placement(), info(), capacity, std::move(pool));
}

bool Model::pages_kv() const {
  const models::Placement& p = net_->placement();
  for (int64_t l = 0; l < info().n_layer; ++l) {
    backend::Device* d = p.layer(l);
    if (d != nullptr && info().layer_cache(l).kv && !d->supports_paged_kv()) return false;
  }
  return true;
}

bool Model::tree_verify() const {
  // MOESERVE_SPEC_TREES=0: no draft trees (chains only; a hybrid model rolls
  // back by snapshot and replay), to compare the two.
  static const bool allowed = [] {
    const char* v = std::getenv("MOESERVE_SPEC_TREES");
    return v == nullptr || std::string_view(v) != "0";
  }();
  if (!allowed) return false;
  for (const backend::Device* d : devices()) {
    if (!d->supports_tree_verify()) return false;
  }
  return true;
}

std::vector<backend::Device*> Model::devices() const {
  return models::placement_devices(net_->placement(), info().n_layer);
}

}  // namespace moeserve::runtime
