#include "models/qwen35_hparams.h"

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "format/model_keys.h"
#include "models/model_loading.h"

namespace moeserve::models {
namespace {

// Head sizes the kernels handle (kernels/cpu/gated_delta_net.h: kGdnMaxHeadDim, kGdnMaxConvKernel).
constexpr int64_t kMaxHeadDim = 512;
constexpr int64_t kMaxConvKernel = 8;

Status read_attention(const GgufFile& f, Qwen35HParams& h) {
  MOESERVE_ASSIGN_OR_RETURN(h.n_head, read_hparam_int(f, keys::kHeadCount, 1));
  MOESERVE_ASSIGN_OR_RETURN(h.n_head_kv, read_hparam_int(f, keys::kHeadCountKv, 1, h.n_head));
  MOESERVE_ASSIGN_OR_RETURN(h.head_dim, read_hparam_int(f, keys::kKeyLength, 2));
  MOESERVE_ASSIGN_OR_RETURN(int64_t head_dim_v, read_hparam_int(f, keys::kValueLength, 1, h.head_dim));
  MOESERVE_ASSIGN_OR_RETURN(h.n_rot, read_hparam_int(f, keys::kRopeDimensionCount, 0, h.head_dim));
  MOESERVE_ASSIGN_OR_RETURN(h.rope_freq_base, read_hparam_float(f, keys::kRopeFreqBase, 10000000.0));
  MOESERVE_ASSIGN_OR_RETURN(double eps, read_hparam_float(f, keys::kRmsEps, NAN));
  if (!(eps > 0.0 && eps < 1.0))
    return inconsistent_hparams(f, fmt::format("rms epsilon {} is not in (0, 1)", eps));
  h.rms_eps = float(eps);
  if (!(h.rope_freq_base > 0.0)) return inconsistent_hparams(f, "rope.freq_base must be positive");
  if (h.n_head % h.n_head_kv != 0) {
    return inconsistent_hparams(
        f,
        fmt::format("attention.head_count {} is not a multiple of head_count_kv {}", h.n_head, h.n_head_kv));
  }
  if (head_dim_v != h.head_dim || h.head_dim > kMaxHeadDim) {
    return inconsistent_hparams(
        f, fmt::format("attention.key_length {} / value_length {}: must be equal and <= {}", h.head_dim,
                       head_dim_v, kMaxHeadDim));
  }
  if (h.n_rot % 2 != 0 || h.n_rot > h.head_dim) {
    return inconsistent_hparams(
        f, fmt::format("rope.dimension_count {} must be even and <= key_length {}", h.n_rot, h.head_dim));
  }
  return Status::ok();
}

// attention.recurrent_layers, when present, says per layer (over
// block_count, the MTP blocks included) which layers are DeltaNet ones.
Status read_recurrent_flags(const GgufFile& f, Qwen35HParams& h) {
  const std::string key = f.arch_key(keys::kRecurrentLayers);
  if (!f.has(key)) return Status::ok();
  std::optional<std::vector<int64_t>> flags = f.get_int_array(key);
  if (auto b = f.get_bool_array(key)) flags = std::vector<int64_t>(b->begin(), b->end());
  if (!flags || int64_t(flags->size()) != h.n_layer + h.n_nextn) {
    return inconsistent_hparams(
        f, fmt::format("'{}' must be {} flags (block_count), got {}", key, h.n_layer + h.n_nextn,
                       flags ? std::to_string(flags->size()) : std::string("another type")));
  }
  for (int64_t l = 0; l < h.n_layer; ++l) h.recurrent[size_t(l)] = (*flags)[size_t(l)] != 0;
  return Status::ok();
}

Status read_delta_net(const GgufFile& f, Qwen35HParams& h) {
  MOESERVE_ASSIGN_OR_RETURN(int64_t kernel, read_hparam_int(f, keys::kSsmConvKernel, 1));
  MOESERVE_ASSIGN_OR_RETURN(h.head_k_dim, read_hparam_int(f, keys::kSsmStateSize, 1));
  MOESERVE_ASSIGN_OR_RETURN(h.n_k_heads, read_hparam_int(f, keys::kSsmGroupCount, 1));
  MOESERVE_ASSIGN_OR_RETURN(h.n_v_heads, read_hparam_int(f, keys::kSsmTimeStepRank, 1));
  MOESERVE_ASSIGN_OR_RETURN(int64_t inner, read_hparam_int(f, keys::kSsmInnerSize, 1));
  MOESERVE_ASSIGN_OR_RETURN(h.full_attention_interval,
                            read_hparam_int(f, keys::kFullAttentionInterval, 1, 4));
  if (kernel > kMaxConvKernel) {
    return inconsistent_hparams(f,
                                fmt::format("ssm.conv_kernel {} is larger than {}", kernel, kMaxConvKernel));
  }
  h.conv_kernel = int(kernel);
  if (h.n_v_heads % h.n_k_heads != 0 || inner % h.n_v_heads != 0) {
    return inconsistent_hparams(f,
                                fmt::format("ssm.time_step_rank {} must be a multiple of ssm.group_count {} "
                                            "and divide ssm.inner_size {}",
                                            h.n_v_heads, h.n_k_heads, inner));
  }
  h.head_v_dim = inner / h.n_v_heads;
  if (h.head_k_dim > kMaxHeadDim || h.head_v_dim > kMaxHeadDim) {
    return inconsistent_hparams(f, fmt::format("DeltaNet head sizes {} / {} are larger than {}", h.head_k_dim,
                                               h.head_v_dim, kMaxHeadDim));
  }
  h.recurrent.resize(size_t(h.n_layer));
  for (int64_t l = 0; l < h.n_layer; ++l) h.recurrent[size_t(l)] = (l + 1) % h.full_attention_interval != 0;
  return read_recurrent_flags(f, h);
}

Status read_ffn(const GgufFile& f, Qwen35HParams& h) {
  MOESERVE_ASSIGN_OR_RETURN(h.n_ff,
                            read_hparam_int(f, keys::kFeedForwardLength, h.moe ? 0 : 1, h.moe ? 0 : -1));
  if (!h.moe) return Status::ok();
  MOESERVE_ASSIGN_OR_RETURN(h.n_expert, read_hparam_int(f, keys::kExpertCount, 1));
  MOESERVE_ASSIGN_OR_RETURN(h.n_expert_used, read_hparam_int(f, keys::kExpertUsedCount, 1));
  MOESERVE_ASSIGN_OR_RETURN(h.n_ff_exp, read_hparam_int(f, keys::kExpertFeedForwardLength, 1));
  MOESERVE_ASSIGN_OR_RETURN(h.n_ff_shexp, read_hparam_int(f, keys::kExpertSharedFeedForwardLength, 0, 0));
  if (h.n_expert_used > h.n_expert) {
    return inconsistent_hparams(
        f, fmt::format("expert_used_count {} > expert_count {}", h.n_expert_used, h.n_expert));
  }
  return Status::ok();
}

}  // namespace

Result<Qwen35HParams> load_qwen35_hparams(const GgufFile& f) {
  Qwen35HParams h;
  h.arch_name = std::string(f.architecture());
  h.moe = h.arch_name == "qwen35moe";
  MOESERVE_ASSIGN_OR_RETURN(h.n_embd, read_hparam_int(f, keys::kEmbeddingLength, 1));
  MOESERVE_ASSIGN_OR_RETURN(int64_t blocks, read_hparam_int(f, keys::kBlockCount, 1));
  MOESERVE_ASSIGN_OR_RETURN(h.n_nextn, read_hparam_int(f, keys::kNextnPredictLayers, 0, 0));
  MOESERVE_ASSIGN_OR_RETURN(h.n_ctx_train, read_hparam_int(f, keys::kContextLength, 1, 4096));
  if (h.n_nextn >= blocks) {
    return inconsistent_hparams(
        f, fmt::format("nextn_predict_layers {} leaves no trunk of block_count {}", h.n_nextn, blocks));
  }
  h.n_layer = blocks - h.n_nextn;
  MOESERVE_RETURN_IF_ERROR(read_attention(f, h));
  MOESERVE_RETURN_IF_ERROR(read_delta_net(f, h));
  MOESERVE_RETURN_IF_ERROR(read_ffn(f, h));
  return h;
}

}  // namespace moeserve::models
