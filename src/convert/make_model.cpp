#include "convert/make_model.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "convert/laguna_gguf.h"
#include "convert/synthetic_vocab.h"
#include "core/thread_pool.h"
#include "format/model_keys.h"
#include "tensor/quantize.h"

namespace moeserve::convert {
namespace {

Status check_laguna(const ModelShape& s) {
  if (s.n_head_swa <= 0 || s.n_head_swa % s.n_head_kv != 0) {
    return make_error(
        StatusCode::kInvalidArgument,
        "model shape '{}': sliding-window head count {} is not a multiple of the KV head count {}", s.preset,
        s.n_head_swa, s.n_head_kv);
  }
  if (s.n_ff_shexp <= 0 || (s.n_dense_lead > 0 && s.n_ff <= 0) || s.n_dense_lead < 0) {
    return make_error(StatusCode::kInvalidArgument, "model shape '{}': bad FFN widths", s.preset);
  }
  if (s.n_rot_swa <= 0 || s.n_rot_swa > s.head_dim || s.n_rot_swa % 2 != 0 || !(s.rope_theta_swa > 0)) {
    return make_error(StatusCode::kInvalidArgument,
                      "model shape '{}': sliding-window rope dimension {} must be even and <= {}", s.preset,
                      s.n_rot_swa, s.head_dim);
  }
  if (s.sliding_window < 0 || (s.sliding_window > 0 && s.swa_period <= 0) ||
      (s.yarn_factor > 0 && s.yarn_orig_ctx <= 0) || !(s.expert_weights_scale > 0)) {
    return make_error(StatusCode::kInvalidArgument, "model shape '{}': bad window, YaRN or expert scale",
                      s.preset);
  }
  return Status::ok();
}

Status check_options(const MakeModelOptions& o) {
  const ModelShape& s = o.shape;
  if (!(o.router_skew >= 0.0) || !std::isfinite(o.router_skew)) {
    return make_error(StatusCode::kInvalidArgument, "router skew {} must be a finite number >= 0",
                      o.router_skew);
  }
  if (s.n_layer <= 0 || s.n_embd <= 0 || s.n_head <= 0 || s.n_head_kv <= 0 || s.head_dim <= 0 ||
      s.n_vocab <= 0) {
    return make_error(StatusCode::kInvalidArgument, "model shape '{}' has a non-positive dimension",
                      s.preset);
  }
  if (s.n_head % s.n_head_kv != 0) {
    return make_error(StatusCode::kInvalidArgument, "head count {} is not a multiple of the KV head count {}",
                      s.n_head, s.n_head_kv);
  }
  if (s.is_moe() &&
      (s.n_expert <= 0 || s.n_expert_used <= 0 || s.n_expert_used > s.n_expert || s.n_ff_exp <= 0)) {
    return make_error(StatusCode::kInvalidArgument, "model shape '{}': bad expert counts", s.preset);
  }
  if (!s.is_moe() && s.n_ff <= 0) {
    return make_error(StatusCode::kInvalidArgument, "model shape '{}': no FFN width", s.preset);
  }
  if (s.n_rot < 0 || s.rope_dim() > s.head_dim || s.rope_dim() % 2 != 0) {
    return make_error(StatusCode::kInvalidArgument,
                      "model shape '{}': rope dimension {} must be even and <= {}", s.preset, s.rope_dim(),
                      s.head_dim);
  }
  if (s.is_hybrid()) {
    if (s.ssm_conv_kernel <= 0 || s.ssm_n_k_heads <= 0 || s.ssm_n_v_heads <= 0 || s.ssm_head_k_dim <= 0 ||
        s.ssm_head_v_dim <= 0 || s.full_attention_interval <= 0) {
      return make_error(StatusCode::kInvalidArgument, "model shape '{}': bad DeltaNet dimensions", s.preset);
    }
    if (s.ssm_n_v_heads % s.ssm_n_k_heads != 0) {
      return make_error(StatusCode::kInvalidArgument,
                        "model shape '{}': DeltaNet V head count {} is not a multiple of the K head count {}",
                        s.preset, s.ssm_n_v_heads, s.ssm_n_k_heads);
    }
    if (s.is_moe() && s.n_ff_shexp <= 0) {
      return make_error(StatusCode::kInvalidArgument, "model shape '{}': no shared expert width", s.preset);
    }
  }
  return s.is_laguna() ? check_laguna(s) : Status::ok();
}

LagunaGgufParams laguna_params(const ModelShape& s) {
  LagunaGgufParams p;
  p.context_length = s.n_ctx, p.embedding_length = s.n_embd, p.block_count = s.n_layer;
  p.feed_forward_length = s.n_ff;
  for (int64_t il = 0; il < s.n_layer; ++il) p.head_count.push_back(s.n_head_layer(il));
  p.head_count_kv = s.n_head_kv, p.head_dim = s.head_dim, p.rms_eps = s.rms_eps, p.vocab_size = s.n_vocab;
  p.rope_theta = s.rope_theta, p.n_rot = s.rope_dim();
  if (s.yarn_factor > 0) {
    p.yarn_factor = s.yarn_factor, p.yarn_orig_ctx = s.yarn_orig_ctx;
    p.yarn_beta_fast = s.yarn_beta_fast, p.yarn_beta_slow = s.yarn_beta_slow;
  }
  p.has_swa_rope = true, p.rope_theta_swa = s.rope_theta_swa, p.n_rot_swa = s.n_rot_swa;
  if (s.sliding_window > 0 && s.swa_period > 0) {
    p.sliding_window = s.sliding_window, p.sliding_window_pattern = s.swa_period;
  }
  p.leading_dense = s.n_dense_lead;
  p.n_expert = s.n_expert, p.n_expert_used = s.n_expert_used;
  p.expert_ff = s.n_ff_exp, p.shared_expert_ff = s.n_ff_shexp;
  p.expert_weights_scale = s.expert_weights_scale;
  return p;
}

// The qwen3moe / qwen3 / qwen35moe / qwen35 keys.
void set_qwen_hparams(const ModelShape& s, GgufWriter& w) {
  auto k = [&](std::string_view suffix) { return keys::arch_key(arch_name(s.arch), suffix); };
  w.set_u32(k(keys::kContextLength), uint32_t(s.n_ctx));
  w.set_u32(k(keys::kEmbeddingLength), uint32_t(s.n_embd));
  w.set_u32(k(keys::kBlockCount), uint32_t(s.n_layer));
  w.set_u32(k(keys::kFeedForwardLength), uint32_t(s.n_ff));
  w.set_u32(k(keys::kHeadCount), uint32_t(s.n_head));
  w.set_u32(k(keys::kHeadCountKv), uint32_t(s.n_head_kv));
  w.set_u32(k(keys::kKeyLength), uint32_t(s.head_dim));
  w.set_u32(k(keys::kValueLength), uint32_t(s.head_dim));
  w.set_f32(k(keys::kRmsEps), float(s.rms_eps));
  w.set_f32(k(keys::kRopeFreqBase), float(s.rope_theta));
  w.set_u32(k(keys::kRopeDimensionCount), uint32_t(s.rope_dim()));
  if (s.is_hybrid()) {
    w.set_i32_array(k(keys::kRopeDimensionSections), s.rope_sections());
    w.set_u32(k(keys::kSsmConvKernel), uint32_t(s.ssm_conv_kernel));
    w.set_u32(k(keys::kSsmStateSize), uint32_t(s.ssm_head_k_dim));
    w.set_u32(k(keys::kSsmGroupCount), uint32_t(s.ssm_n_k_heads));
    w.set_u32(k(keys::kSsmTimeStepRank), uint32_t(s.ssm_n_v_heads));
    w.set_u32(k(keys::kSsmInnerSize), uint32_t(s.ssm_inner_size()));
    w.set_u32(k(keys::kFullAttentionInterval), uint32_t(s.full_attention_interval));
  }
  if (s.is_moe()) {
    w.set_u32(k(keys::kExpertCount), uint32_t(s.n_expert));
    w.set_u32(k(keys::kExpertUsedCount), uint32_t(s.n_expert_used));
    w.set_u32(k(keys::kExpertFeedForwardLength), uint32_t(s.n_ff_exp));
    if (s.has_shared_expert()) w.set_u32(k(keys::kExpertSharedFeedForwardLength), uint32_t(s.n_ff_shexp));
  }
}

void set_hparams(const MakeModelOptions& o, GgufWriter& w) {
  const ModelShape& s = o.shape;
  const std::string_view arch = arch_name(s.arch);
  w.set_string(keys::kArchitecture, std::string(arch));
  w.set_string(keys::kName, s.model_name);
  w.set_u32(keys::kAlignment, 32);
  w.set_u32(keys::kFileType, uint32_t(o.file_type));
  if (file_type_is_quantized(o.file_type)) w.set_u32(keys::kQuantizationVersion, 2);
  if (s.is_laguna()) {
    write_laguna_hparams(laguna_params(s), w);
  } else {
    set_qwen_hparams(s, w);
  }
  // Provenance, so a synthetic file is never mistaken for a trained one.
  w.set_u64("moeserve.synthetic.seed", o.seed);
  w.set_f32("moeserve.synthetic.router_skew", float(o.router_skew));
}

// Shared by every deferred fill of one model: the pool and progress counters.
struct FillContext {
  SyntheticWeights weights;
  std::unique_ptr<ThreadPool> pool;
  std::function<void(uint64_t, uint64_t)> on_progress;
  uint64_t done = 0;
  uint64_t total = 0;
  QuantEffort effort = QuantEffort::kBest;
};

// Rows per pool task; tasks are small so that two busy cores stay balanced.
constexpr int64_t kTaskElements = 1 << 16;
// Elements per progress update (each is one pool dispatch).
constexpr int64_t kBatchElements = 1 << 24;

Status fill_tensor(FillContext& ctx, const SyntheticTensor& t, std::span<uint8_t> out) {
  const int64_t ne0 = t.ne[0], n_rows = t.n_rows();
  const size_t row_bytes = dtype_row_bytes(t.type, ne0);
  const int64_t rows_per_task = std::max<int64_t>(1, kTaskElements / ne0);
  const int64_t rows_per_batch =
      std::max<int64_t>(rows_per_task, kBatchElements / ne0 / rows_per_task * rows_per_task);
  std::vector<std::vector<float>> scratch(size_t(ctx.pool->size()));
  for (int64_t batch = 0; batch < n_rows; batch += rows_per_batch) {
    const int64_t batch_rows = std::min(rows_per_batch, n_rows - batch);
    const int64_t n_tasks = (batch_rows + rows_per_task - 1) / rows_per_task;
    ctx.pool->run(n_tasks, [&](int64_t task, int thread) {
      const int64_t row0 = batch + task * rows_per_task;
      const int64_t rows = std::min(rows_per_task, batch + batch_rows - row0);
      std::vector<float>& buf = scratch[size_t(thread)];
      buf.resize(size_t(rows * ne0));
      ctx.weights.generate_rows(t, row0, rows, buf.data());
      quantize_rows(t.type, buf.data(), out.data() + size_t(row0) * row_bytes, rows, ne0, ctx.effort);
    });
    ctx.done += size_t(batch_rows) * row_bytes;
    if (ctx.on_progress) ctx.on_progress(ctx.done, ctx.total);
  }
  return Status::ok();
}

}  // namespace

Result<MakeModelSummary> add_synthetic_model(const MakeModelOptions& options, GgufWriter& writer) {
  MOESERVE_RETURN_IF_ERROR(check_options(options));
  const ModelShape& s = options.shape;
  MOESERVE_ASSIGN_OR_RETURN(tok::VocabData vocab, make_synthetic_vocab({.vocab_size = s.n_vocab}));
  // Qwen3.5's pre-tokenizer (combining marks stay with their letters); the
  // merges learned with qwen2's are valid under it.
  if (s.is_hybrid()) vocab.pre = "qwen35";
  set_hparams(options, writer);
  set_vocab_metadata(writer, vocab);

  auto ctx = std::make_shared<FillContext>(FillContext{SyntheticWeights(options.seed, options.router_skew),
                                                       std::make_unique<ThreadPool>(options.n_threads),
                                                       options.on_progress});
  MakeModelSummary summary;
  for (SyntheticTensor& t : plan_tensors(s, options.file_type)) {
    summary.n_params += t.n_elements();
    summary.tensor_bytes += t.nbytes();
    ++summary.n_tensors;
    const std::string name = t.name;
    const std::vector<int64_t> ne = t.ne;
    const DType type = t.type;
    auto fill = [ctx, t = std::move(t)](std::span<uint8_t> out) { return fill_tensor(*ctx, t, out); };
    MOESERVE_RETURN_IF_ERROR(writer.add_tensor_deferred(name, type, ne, std::move(fill)));
  }
  ctx->total = summary.tensor_bytes;
  ctx->effort = options.quick_quant ? QuantEffort::kQuick : QuantEffort::kBest;
  return summary;
}

Result<MakeModelSummary> make_model(const MakeModelOptions& options, const std::string& path) {
  GgufWriter writer;
  MOESERVE_ASSIGN_OR_RETURN(MakeModelSummary summary, add_synthetic_model(options, writer));
  MOESERVE_RETURN_IF_ERROR(writer.write(path));
  return summary;
}

}  // namespace moeserve::convert
