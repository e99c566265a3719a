#include "runtime/memory_plan.h"

namespace moeserve::runtime {

namespace {
double gib(uint64_t b) { return double(b) / double(1ull << 30); }
}  // namespace

Result<MemoryPlan> plan_device_memory(Model& model, const MemoryPlanRequest& r) {
  const models::ModelInfo& info = model.info();
  MemoryPlan plan;
  plan.kv_bytes = uint64_t(r.n_sequences) * KvCache::bytes_for(info.n_layer, info.kv_dim, r.n_ctx);
  // Hidden, normed, q/k/v, attention and output rows, router or FFN rows,
  // the experts' (token, slot) rows, logits: an upper estimate per row.
  const uint64_t per_row = uint64_t(8 * info.n_embd + 4 * info.kv_dim + 4 * info.n_expert +
                                    (info.n_expert_used + 1) * 2 * info.n_embd) * sizeof(float);
  plan.workspace_bytes = uint64_t(r.n_batch) * per_row + uint64_t(r.n_sequences) * uint64_t(info.n_vocab) * 4;
  backend::Device& device = model.device();
  if (device.host_memory()) return plan;
  plan.free_bytes = device.memory_info().free_bytes;
  const uint64_t margin = uint64_t(256) << 20;  // CUDA context growth, graph and library buffers
  if (plan.kv_bytes + plan.workspace_bytes + margin > plan.free_bytes) {
    return make_error(StatusCode::kResourceExhausted,
                      "not enough memory on {}: the KV cache for --parallel {} x --ctx-size {} needs {:.2f} GiB and "
                      "the workspace for --batch {} about {:.2f} GiB, but only {:.2f} GiB are free after the "
                      "weights; lower --ctx-size or --parallel, use a smaller quantization, or --device cpu",
                      device.name(), r.n_sequences, r.n_ctx, gib(plan.kv_bytes), r.n_batch, gib(plan.workspace_bytes),
                      gib(plan.free_bytes));
  }
  return plan;
}

}  // namespace moeserve::runtime
