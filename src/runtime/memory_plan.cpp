#include "runtime/memory_plan.h"

#include <algorithm>

#include "core/host_memory.h"

namespace moeserve::runtime {

namespace {
double gib(uint64_t b) { return double(b) / double(1ull << 30); }

// Activation bytes a forward keeps per batch row on a device (an upper estimate).
uint64_t workspace_bytes_per_row(const models::ModelInfo& info) {
  return uint64_t(std::max<int64_t>(8 * info.n_embd + 4 * info.kv_dim + 4 * info.n_expert +
                                        (info.n_expert_used + 1) * 2 * info.n_embd,
                                    info.workspace_floats_per_row)) *
         sizeof(float);
}

// One layer's cache of one sequence of `capacity` positions.
uint64_t layer_cache_bytes(const models::ModelInfo& info, int64_t l, int64_t capacity) {
  const models::LayerCache c = info.layer_cache(l);
  return (c.kv ? uint64_t(2 * capacity * info.kv_dim) * sizeof(uint16_t) : 0) +
         uint64_t(c.state_floats) * sizeof(float);
}

// A layer split: each GPU device against its own free memory, the host
// devices together against the host's.
Result<MemoryPlan> plan_split_memory(Model& model, const MemoryPlanRequest& r) {
  const models::ModelInfo& info = model.info();
  const models::Placement& p = model.net().placement();
  MemoryPlan plan;
  uint64_t host_need = r.prefix_cache_bytes + (uint64_t(64) << 20);
  for (backend::Device* d : model.devices()) {
    uint64_t kv = 0;
    int64_t first = -1, last = -1;
    for (int64_t l = 0; l < info.n_layer; ++l) {
      if (p.layer(l) != d) continue;
      kv += uint64_t(r.n_sequences) * layer_cache_bytes(info, l, r.n_ctx);
      first = first < 0 ? l : first;
      last = l;
    }
    if (d == p.io)
      kv += uint64_t(r.n_sequences) * r.extra_bytes_per_token * uint64_t(std::max<int64_t>(r.n_ctx, 0));
    uint64_t workspace = uint64_t(r.n_batch) * workspace_bytes_per_row(info);
    if (d == p.output()) workspace += uint64_t(r.n_sequences) * uint64_t(info.n_vocab) * 4;
    plan.kv_bytes += kv;
    plan.workspace_bytes += workspace;
    if (d->host_memory()) {
      host_need += kv + workspace;
      continue;
    }
    const uint64_t free = d->memory_info().free_bytes, margin = uint64_t(256) << 20;
    if (kv + workspace + margin > free) {
      return make_error(
          StatusCode::kResourceExhausted,
          "not enough memory on {} (layers {}:{} of the layer split): the KV cache for --parallel {} x "
          "--ctx-size {} needs {:.2f} GiB and the workspace about {:.2f} GiB, but only {:.2f} GiB are "
          "free after the weights; move layers off it (--layer-split weights or ranges), or lower "
          "--ctx-size or --parallel",
          d->name(), first, last + 1, r.n_sequences, r.n_ctx, gib(kv), gib(workspace), gib(free));
    }
  }
  const HostMemory host = host_memory_available();
  plan.free_bytes = host.available_bytes;
  if (host_need > host.available_bytes) {
    return make_error(
        StatusCode::kResourceExhausted,
        "not enough memory for the layer split's CPU shards: their KV cache, workspace and the prefix "
        "cache need {:.2f} GiB, but only {:.2f} GiB are available (bound by {}); lower --ctx-size, "
        "--parallel or --prefix-cache-mb, or move layers to a GPU shard",
        gib(host_need), gib(host.available_bytes), host.bound_by);
  }
  return plan;
}
}  // namespace

Result<MemoryPlan> plan_device_memory(Model& model, const MemoryPlanRequest& r) {
  if (model.devices().size() > 1) return plan_split_memory(model, r);
  const models::ModelInfo& info = model.info();
  MemoryPlan plan;
  // Recurrent states (bytes_for(info, 0)) stay per sequence with a pool.
  const uint64_t rows_per_sequence = KvCache::bytes_for(info, r.n_ctx) - KvCache::bytes_for(info, 0);
  plan.kv_bytes =
      uint64_t(r.n_sequences) *
          (KvCache::bytes_for(info, 0) + r.extra_bytes_per_token * uint64_t(std::max<int64_t>(r.n_ctx, 0))) +
      (r.kv_pool_bytes > 0 ? r.kv_pool_bytes : uint64_t(r.n_sequences) * rows_per_sequence);
  // Hidden, normed, q/k/v, attention and output rows, router or FFN rows,
  // the experts' (token, slot) rows, logits: an upper estimate per row.
  const uint64_t per_row = workspace_bytes_per_row(info);
  plan.workspace_bytes = uint64_t(r.n_batch) * per_row + uint64_t(r.n_sequences) * uint64_t(info.n_vocab) * 4;
  backend::Device& device = model.device();
  if (device.host_memory()) {
    const HostMemory host = host_memory_available();
    plan.free_bytes = host.available_bytes;
    const uint64_t margin = uint64_t(64) << 20;  // threads' stacks, request buffers
    const uint64_t need = plan.kv_bytes + plan.workspace_bytes + r.prefix_cache_bytes + margin;
    if (need > plan.free_bytes && r.kv_pool_bytes > 0) {
      return make_error(
          StatusCode::kResourceExhausted,
          "not enough memory: the KV pool (--kv-mem) takes {:.2f} GiB, the workspace for --batch {} "
          "about {:.2f} GiB and the prefix cache {:.2f} GiB, but only {:.2f} GiB are available "
          "(bound by {}); lower --kv-mem or --prefix-cache-mb",
          gib(plan.kv_bytes), r.n_batch, gib(plan.workspace_bytes), gib(r.prefix_cache_bytes),
          gib(plan.free_bytes), host.bound_by);
    }
    if (need > plan.free_bytes) {
      return make_error(
          StatusCode::kResourceExhausted,
          "not enough memory: the KV cache for --parallel {} x --ctx-size {} needs {:.2f} GiB ({} "
          "bytes per token), the workspace for --batch {} about {:.2f} GiB and the prefix cache "
          "{:.2f} GiB, but only {:.2f} GiB are available (bound by {}); lower --ctx-size, "
          "--parallel or --prefix-cache-mb",
          r.n_sequences, r.n_ctx, gib(plan.kv_bytes),
          KvCache::bytes_for(info, 2) - KvCache::bytes_for(info, 1) + r.extra_bytes_per_token, r.n_batch,
          gib(plan.workspace_bytes), gib(r.prefix_cache_bytes), gib(plan.free_bytes), host.bound_by);
    }
    return plan;
  }
  plan.free_bytes = device.memory_info().free_bytes;
  const uint64_t margin = uint64_t(256) << 20;  // CUDA context growth, graph and library buffers
  if (plan.kv_bytes + plan.workspace_bytes + margin > plan.free_bytes && r.kv_pool_bytes > 0) {
    return make_error(
        StatusCode::kResourceExhausted,
        "not enough memory on {}: the KV pool (--kv-mem) takes {:.2f} GiB and the workspace for --batch {} "
        "about {:.2f} GiB, but only {:.2f} GiB are free after the weights; lower --kv-mem",
        device.name(), gib(plan.kv_bytes), r.n_batch, gib(plan.workspace_bytes), gib(plan.free_bytes));
  }
  if (plan.kv_bytes + plan.workspace_bytes + margin > plan.free_bytes) {
    return make_error(
        StatusCode::kResourceExhausted,
        "not enough memory on {}: the KV cache for --parallel {} x --ctx-size {} needs {:.2f} GiB and "
        "the workspace for --batch {} about {:.2f} GiB, but only {:.2f} GiB are free after the "
        "weights; lower --ctx-size or --parallel, use a smaller quantization, or --device cpu",
        device.name(), r.n_sequences, r.n_ctx, gib(plan.kv_bytes), r.n_batch, gib(plan.workspace_bytes),
        gib(plan.free_bytes));
  }
  return plan;
}

int64_t largest_fitting_context(Model& model, const MemoryPlanRequest& request) {
  constexpr int64_t kStep = 256;
  int64_t lo = 0, hi = request.n_ctx / kStep;  // in steps; lo fits (0: nothing does)
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    MemoryPlanRequest r = request;
    r.n_ctx = mid * kStep;
    if (plan_device_memory(model, r).is_ok()) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo * kStep;
}

}  // namespace moeserve::runtime
