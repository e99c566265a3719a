// Model::place_layer_shards: a layer split's devices and placement (every
// architecture alike: the models walk layer by layer and move the hidden
// rows wherever the next layer's device differs).
#include <fmt/format.h>

#include "backend/cpu/cpu_device.h"
#include "backend/devices.h"
#include "format/model_keys.h"
#include "runtime/model.h"

namespace moeserve::runtime {

namespace {

// The shards cover [0, n_layer) in order, each at least one layer.
Status check_shards(std::span<const LayerShard> shards, int64_t n_layer, std::string_view file) {
  int64_t next = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    const LayerShard& s = shards[i];
    if (s.begin != next || s.end <= s.begin || s.end > n_layer) {
      return make_error(
          StatusCode::kInvalidArgument,
          "layer split: shard {} ({}) covers layers {}:{}; shards must cover 0:{} of {} in order, "
          "each at least one layer",
          i, s.device, s.begin, s.end, n_layer, file);
    }
    next = s.end;
  }
  if (next != n_layer) {
    return make_error(StatusCode::kInvalidArgument, "layer split: the shards end at layer {}, {} has {}",
                      next, file, n_layer);
  }
  return Status::ok();
}

}  // namespace

Status Model::place_layer_shards(const ModelLoadOptions& options, models::Placement& placement) {
  MOESERVE_ASSIGN_OR_RETURN(int64_t n_layer, file_.require_int(file_.arch_key(keys::kBlockCount)));
  MOESERVE_RETURN_IF_ERROR(check_shards(options.layer_shards, n_layer, file_.name()));
  placement.layers.assign(size_t(n_layer), nullptr);
  bool cpu_taken = false;
  std::string reason = "layer split:";
  backend::Device* first_local = nullptr;
  for (const LayerShard& s : options.layer_shards) {
    if (s.remote != nullptr) {
      placement.remote.push_back({s.begin, s.end, s.remote});
      reason += fmt::format(" {} {}:{}", s.remote->name(), s.begin, s.end);
      continue;
    }
    MOESERVE_ASSIGN_OR_RETURN(backend::DeviceSpec spec, backend::parse_device_spec(s.device));
    backend::Device* d = nullptr;
    if (spec.kind == backend::DeviceKind::kCpu && !cpu_taken) {
      d = cpu_.get();  // the first CPU shard is the model's CPU device
      cpu_taken = true;
    } else if (spec.kind == backend::DeviceKind::kCpu) {
      shard_devices_.push_back(std::make_unique<backend::CpuDevice>(backend::CpuDeviceOptions{
          .pool = pool_.get(), .pack_weights = options.pack_weights, .release_source = file_.file_backed()}));
      d = shard_devices_.back().get();
    } else {
      MOESERVE_ASSIGN_OR_RETURN(std::unique_ptr<backend::Device> gpu, backend::open_cuda_device(spec.index));
      shard_devices_.push_back(std::move(gpu));
      d = shard_devices_.back().get();
    }
    for (int64_t l = s.begin; l < s.end; ++l) placement.layers[size_t(l)] = d;
    if (first_local == nullptr) first_local = d;
    reason += fmt::format(" {} {}:{}", d->name(), s.begin, s.end);
  }
  // The embedding with the first shard and the head with the last, when
  // they are here; io is also where the forward's bookkeeping starts.
  placement.io = placement.layers.front() != nullptr ? placement.layers.front()
                 : first_local != nullptr            ? first_local
                                                     : cpu_.get();
  placement.head = placement.layers.back() != nullptr ? placement.layers.back() : placement.io;
  device_reason_ = reason;
  placement.micro_batches = std::max<int64_t>(options.micro_batches, 1);
  placement.min_micro_batch_rows = std::max<int64_t>(options.min_micro_batch_rows, 1);
  if (options.split_experts) {
    MOESERVE_RETURN_IF_ERROR(split_shard_experts(options, placement));
  } else if (options.expert_worker != nullptr) {
    MOESERVE_RETURN_IF_ERROR(give_shard_experts_to_worker(options, placement));
  }
  return Status::ok();
}

// An expert worker beside a split without hybrid placement: the CPU
// shards' layers hand it their worker experts (as one CPU does); GPU
// shards keep all theirs, and other processes' layers are theirs.
Status Model::give_shard_experts_to_worker(const ModelLoadOptions& options, models::Placement& placement) {
  MOESERVE_RETURN_IF_ERROR(give_experts_to_worker(options, placement));
  bool used = false;
  for (size_t l = 0; l < placement.layers.size(); ++l) {
    const backend::Device* d = placement.layers[l];
    if (d != nullptr && d->kind() == backend::DeviceKind::kCpu) {
      used = true;
      continue;
    }
    placement.expert_splits[l] = nullptr;
    splits_[l].reset();
  }
  if (!used) {
    return make_error(StatusCode::kInvalidArgument,
                      "an expert worker, but no shard of the layer split computes experts on this host's CPU: "
                      "leave some experts off the GPU shards (--n-cpu-moe, --cpu-moe, --placement)");
  }
  return Status::ok();
}

// Hybrid expert placement over a layer split: a GPU shard's layers keep the
// placement's experts in its memory and have the rest computed by this
// host's CPU threads, as one GPU does. Beside a GPU, a CPU shard's layers
// keep all theirs (no split); on CPUs alone the splits stay (how CI checks
// their bookkeeping, as Model::split_experts on one CPU).
Status Model::split_shard_experts(const ModelLoadOptions& options, models::Placement& placement) {
  MOESERVE_RETURN_IF_ERROR(split_experts(options, placement));
  if (expert_gpu() == nullptr) return Status::ok();
  for (size_t l = 0; l < placement.layers.size(); ++l) {
    const backend::Device* d = placement.layers[l];
    if (d == nullptr || d->kind() == backend::DeviceKind::kCpu) {
      placement.expert_splits[l] = nullptr;
      splits_[l].reset();
      // A CPU shard's layer gives an expert worker its experts still.
      if (d != nullptr && options.expert_worker != nullptr)
        MOESERVE_RETURN_IF_ERROR(give_layer_to_worker(options, placement, int64_t(l)));
    }
  }
  return Status::ok();
}

backend::Device* Model::expert_gpu() const {
  if (gpu_ != nullptr) return gpu_.get();
  for (const auto& d : shard_devices_) {
    if (d->kind() == backend::DeviceKind::kCuda) return d.get();
  }
  return nullptr;
}

Status Model::place_shard_range(const ModelLoadOptions& options, models::Placement& placement) {
  MOESERVE_ASSIGN_OR_RETURN(int64_t n_layer, file_.require_int(file_.arch_key(keys::kBlockCount)));
  const int64_t end = options.end_layer < 0 ? n_layer : options.end_layer;
  if (options.first_layer < 0 || options.first_layer >= end || end > n_layer) {
    return make_error(StatusCode::kInvalidArgument, "shard: layers {}:{} are not a range of {}'s {} layers",
                      options.first_layer, end, file_.name(), n_layer);
  }
  backend::Device* d = placement.io;
  placement.layers.assign(size_t(n_layer), nullptr);
  for (int64_t l = options.first_layer; l < end; ++l) placement.layers[size_t(l)] = d;
  placement.first_layer = options.first_layer;
  placement.end_layer = end;
  device_reason_ += fmt::format(" (layers {}:{} of {})", options.first_layer, end, n_layer);
  return Status::ok();
}

}  // namespace moeserve::runtime
