#include "runtime/memory_plan.h"

#include <algorithm>

#include "core/host_memory.h"

namespace moeserve::runtime {

namespace {
double gib(uint64_t b) { return double(b) / double(1ull << 30); }
}  // namespace

Result<MemoryPlan> plan_device_memory(Model& model, const MemoryPlanRequest& r) {
  const models::ModelInfo& info = model.info();
  MemoryPlan plan;
  plan.kv_bytes = uint64_t(r.n_sequences) * (KvCache::bytes_for(info, r.n_ctx) +
                                             r.extra_bytes_per_token * uint64_t(std::max<int64_t>(r.n_ctx, 0)));
  // Hidden, normed, q/k/v, attention and output rows, router or FFN rows,
  // the experts' (token, slot) rows, logits: an upper estimate per row.
  const uint64_t per_row = uint64_t(std::max<int64_t>(8 * info.n_embd + 4 * info.kv_dim + 4 * info.n_expert +
                                                         (info.n_expert_used + 1) * 2 * info.n_embd,
                                                     info.workspace_floats_per_row)) *
                           sizeof(float);
  plan.workspace_bytes = uint64_t(r.n_batch) * per_row + uint64_t(r.n_sequences) * uint64_t(info.n_vocab) * 4;
  backend::Device& device = model.device();
  if (device.host_memory()) {
    const HostMemory host = host_memory_available();
    plan.free_bytes = host.available_bytes;
    const uint64_t margin = uint64_t(64) << 20;  // threads' stacks, request buffers
    const uint64_t need = plan.kv_bytes + plan.workspace_bytes + r.prefix_cache_bytes + margin;
    if (need > plan.free_bytes) {
      return make_error(
          StatusCode::kResourceExhausted,
          "not enough memory: the KV cache for --parallel {} x --ctx-size {} needs {:.2f} GiB ({} "
          "bytes per token), the workspace for --batch {} about {:.2f} GiB and the prefix cache "
          "{:.2f} GiB, but only {:.2f} GiB are available (bound by {}); lower --ctx-size, "
          "--parallel or --prefix-cache-mb",
          r.n_sequences, r.n_ctx, gib(plan.kv_bytes),
          KvCache::bytes_for(info, 2) - KvCache::bytes_for(info, 1) + r.extra_bytes_per_token,
          r.n_batch, gib(plan.workspace_bytes), gib(r.prefix_cache_bytes), gib(plan.free_bytes),
          host.bound_by);
    }
    return plan;
  }
  plan.free_bytes = device.memory_info().free_bytes;
  const uint64_t margin = uint64_t(256) << 20;  // CUDA context growth, graph and library buffers
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
