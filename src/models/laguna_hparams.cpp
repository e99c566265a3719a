#include "models/laguna_hparams.h"

#include <algorithm>
#include <cmath>

#include "format/model_keys.h"
#include "models/model_loading.h"

namespace moeserve::models {
namespace {

constexpr int64_t kMaxHeadDim = 512;  // the attention kernels' limit

// attention.head_count: one count per layer (an array, as llama.cpp writes
// it for Laguna) or one for all.
Status read_head_counts(const GgufFile& f, LagunaHParams& h) {
  const std::string key = f.arch_key(keys::kHeadCount);
  if (auto arr = f.get_int_array(key)) {
    if (int64_t(arr->size()) != h.n_layer) {
      return inconsistent_hparams(
          f, fmt::format("'{}' has {} entries, block_count is {}", key, arr->size(), h.n_layer));
    }
    h.n_head = *arr;
  } else {
    MOESERVE_ASSIGN_OR_RETURN(int64_t n, read_hparam_int(f, keys::kHeadCount, 1));
    h.n_head.assign(size_t(h.n_layer), n);
  }
  MOESERVE_ASSIGN_OR_RETURN(h.n_head_kv, read_hparam_int(f, keys::kHeadCountKv, 1));
  for (int64_t l = 0; l < h.n_layer; ++l) {
    const int64_t n = h.n_head[size_t(l)];
    if (n < 1 || n > 4096 || n % h.n_head_kv != 0) {
      return inconsistent_hparams(f, fmt::format("layer {}: '{}' = {} is not a positive multiple of "
                                                 "head_count_kv {}",
                                                 l, key, n, h.n_head_kv));
    }
  }
  return Status::ok();
}

// Which layers slide: attention.sliding_window_pattern as a period P (layer
// l is full iff l % P == 0, llama.cpp's reading) or as per-layer flags.
Status read_sliding_layers(const GgufFile& f, LagunaHParams& h) {
  MOESERVE_ASSIGN_OR_RETURN(h.window, read_hparam_int(f, keys::kSlidingWindow, 0, 0));
  h.sliding.assign(size_t(h.n_layer), false);
  if (h.window == 0) return Status::ok();
  const std::string key = f.arch_key(keys::kSlidingWindowPattern);
  std::optional<std::vector<int64_t>> flags = f.get_int_array(key);
  if (auto b = f.get_bool_array(key)) flags = std::vector<int64_t>(b->begin(), b->end());
  if (flags) {
    if (int64_t(flags->size()) != h.n_layer) {
      return inconsistent_hparams(
          f, fmt::format("'{}' has {} entries, block_count is {}", key, flags->size(), h.n_layer));
    }
    for (int64_t l = 0; l < h.n_layer; ++l) h.sliding[size_t(l)] = (*flags)[size_t(l)] != 0;
    return Status::ok();
  }
  MOESERVE_ASSIGN_OR_RETURN(int64_t period, read_hparam_int(f, keys::kSlidingWindowPattern, 1, 4));
  for (int64_t l = 0; l < h.n_layer; ++l) h.sliding[size_t(l)] = l % period != 0;
  return Status::ok();
}

Status check_rope(const GgufFile& f, const backend::RopeSpec& r, std::string_view what, int64_t head_dim) {
  if (r.n_rot % 2 != 0 || r.n_rot > head_dim || r.n_rot < 0) {
    return inconsistent_hparams(
        f, fmt::format("{} {} must be even and <= key_length {}", what, r.n_rot, head_dim));
  }
  if (!(r.freq_base > 0.0))
    return inconsistent_hparams(f, fmt::format("{}: freq_base must be positive", what));
  return Status::ok();
}

// Full layers: rope.* with optional YaRN (rope.scaling.*); sliding layers:
// rope.*_swa, never scaled (llama.cpp's and transformers' reading).
Status read_ropes(const GgufFile& f, LagunaHParams& h) {
  backend::YarnParams y;
  MOESERVE_ASSIGN_OR_RETURN(y.n_rot, read_hparam_int(f, keys::kRopeDimensionCount, 0, h.head_dim));
  MOESERVE_ASSIGN_OR_RETURN(y.freq_base, read_hparam_float(f, keys::kRopeFreqBase, 500000.0));
  const std::string type_key = f.arch_key(keys::kRopeScalingType);
  std::string type = "none";
  if (f.has(type_key)) {
    MOESERVE_ASSIGN_OR_RETURN(std::string_view t, f.require_string(type_key));
    type = std::string(t);
  }
  if (type == "yarn") {
    MOESERVE_ASSIGN_OR_RETURN(y.factor, read_hparam_float(f, keys::kRopeScalingFactor, NAN));
    MOESERVE_ASSIGN_OR_RETURN(y.original_ctx, read_hparam_int(f, keys::kRopeScalingOrigCtx, 1));
    MOESERVE_ASSIGN_OR_RETURN(y.beta_fast, read_hparam_float(f, keys::kRopeScalingYarnBetaFast, 32.0));
    MOESERVE_ASSIGN_OR_RETURN(y.beta_slow, read_hparam_float(f, keys::kRopeScalingYarnBetaSlow, 1.0));
    if (f.has(f.arch_key(keys::kRopeScalingYarnAttnFactor))) {  // absent: 0.1 ln(factor) + 1
      MOESERVE_ASSIGN_OR_RETURN(y.attn_factor, read_hparam_float(f, keys::kRopeScalingYarnAttnFactor, NAN));
    }
    if (!(y.factor >= 1.0) || !(y.beta_fast > 0.0) || !(y.beta_slow > 0.0)) {
      return inconsistent_hparams(f, fmt::format("YaRN factor {} (>= 1), beta_fast {} and beta_slow {} (> 0)",
                                                 y.factor, y.beta_fast, y.beta_slow));
    }
  } else if (type != "none") {
    return make_error(StatusCode::kUnsupported, "{}: '{}' = '{}' is not supported (yarn or none)", f.name(),
                      type_key, type);
  }
  if (!(y.freq_base > 0.0)) return inconsistent_hparams(f, "rope.freq_base must be positive");
  h.rope_full = backend::yarn_rope(y);
  MOESERVE_RETURN_IF_ERROR(check_rope(f, h.rope_full, "rope.dimension_count", h.head_dim));
  MOESERVE_ASSIGN_OR_RETURN(h.rope_swa.n_rot,
                            read_hparam_int(f, keys::kRopeDimensionCountSwa, 0, h.head_dim));
  MOESERVE_ASSIGN_OR_RETURN(h.rope_swa.freq_base, read_hparam_float(f, keys::kRopeFreqBaseSwa, y.freq_base));
  return check_rope(f, h.rope_swa, "rope.dimension_count_swa", h.head_dim);
}

Status read_ffn(const GgufFile& f, LagunaHParams& h) {
  MOESERVE_ASSIGN_OR_RETURN(h.n_dense_lead, read_hparam_int(f, keys::kLeadingDenseBlockCount, 0, 0));
  if (h.n_dense_lead > h.n_layer) {
    return inconsistent_hparams(
        f, fmt::format("leading_dense_block_count {} > block_count {}", h.n_dense_lead, h.n_layer));
  }
  MOESERVE_ASSIGN_OR_RETURN(h.n_ff, read_hparam_int(f, keys::kFeedForwardLength, h.n_dense_lead > 0 ? 1 : 0,
                                                    h.n_dense_lead > 0 ? -1 : 0));
  if (h.n_dense_lead == h.n_layer) return Status::ok();
  MOESERVE_ASSIGN_OR_RETURN(h.n_expert, read_hparam_int(f, keys::kExpertCount, 1));
  MOESERVE_ASSIGN_OR_RETURN(h.n_expert_used, read_hparam_int(f, keys::kExpertUsedCount, 1));
  MOESERVE_ASSIGN_OR_RETURN(h.n_ff_exp, read_hparam_int(f, keys::kExpertFeedForwardLength, 1));
  MOESERVE_ASSIGN_OR_RETURN(h.n_ff_shexp, read_hparam_int(f, keys::kExpertSharedFeedForwardLength, 0, 0));
  MOESERVE_ASSIGN_OR_RETURN(int64_t n_shared, read_hparam_int(f, keys::kExpertSharedCount, 0, 1));
  MOESERVE_ASSIGN_OR_RETURN(int64_t gating,
                            read_hparam_int(f, keys::kExpertGatingFunc, 1, keys::kExpertGatingSigmoid));
  MOESERVE_ASSIGN_OR_RETURN(double scale, read_hparam_float(f, keys::kExpertWeightsScale, 1.0));
  if (h.n_expert_used > h.n_expert) {
    return inconsistent_hparams(
        f, fmt::format("expert_used_count {} > expert_count {}", h.n_expert_used, h.n_expert));
  }
  if (n_shared > 1) {
    return make_error(StatusCode::kUnsupported, "{}: expert_shared_count {} (one shared expert is supported)",
                      f.name(), n_shared);
  }
  if (n_shared == 0) h.n_ff_shexp = 0;
  if (gating != keys::kExpertGatingSoftmax && gating != keys::kExpertGatingSigmoid) {
    return make_error(StatusCode::kUnsupported, "{}: expert_gating_func {} (1 softmax, 2 sigmoid)", f.name(),
                      gating);
  }
  h.sigmoid_gating = gating == keys::kExpertGatingSigmoid;
  if (!(scale > 0.0)) return inconsistent_hparams(f, "expert_weights_scale must be positive");
  h.expert_weights_scale = float(scale);
  h.normalize_weights = f.get_bool(f.arch_key(keys::kExpertWeightsNorm)).value_or(true);
  return Status::ok();
}

}  // namespace

int64_t LagunaHParams::max_head() const { return n_head.empty() ? 0 : *std::ranges::max_element(n_head); }

Result<LagunaHParams> load_laguna_hparams(const GgufFile& f) {
  LagunaHParams h;
  MOESERVE_ASSIGN_OR_RETURN(h.n_embd, read_hparam_int(f, keys::kEmbeddingLength, 1));
  MOESERVE_ASSIGN_OR_RETURN(h.n_layer, read_hparam_int(f, keys::kBlockCount, 1));
  MOESERVE_ASSIGN_OR_RETURN(h.n_ctx_train, read_hparam_int(f, keys::kContextLength, 1, 4096));
  if (h.n_layer > 4096) return inconsistent_hparams(f, fmt::format("block_count {} is too large", h.n_layer));
  MOESERVE_RETURN_IF_ERROR(read_head_counts(f, h));
  MOESERVE_ASSIGN_OR_RETURN(h.head_dim, read_hparam_int(f, keys::kKeyLength, 2));
  MOESERVE_ASSIGN_OR_RETURN(int64_t head_dim_v, read_hparam_int(f, keys::kValueLength, 1, h.head_dim));
  if (head_dim_v != h.head_dim || h.head_dim > kMaxHeadDim) {
    return inconsistent_hparams(
        f, fmt::format("attention.key_length {} / value_length {}: must be equal and <= {}", h.head_dim,
                       head_dim_v, kMaxHeadDim));
  }
  MOESERVE_ASSIGN_OR_RETURN(double eps, read_hparam_float(f, keys::kRmsEps, NAN));
  if (!(eps > 0.0 && eps < 1.0))
    return inconsistent_hparams(f, fmt::format("rms epsilon {} is not in (0, 1)", eps));
  h.rms_eps = float(eps);
  MOESERVE_RETURN_IF_ERROR(read_sliding_layers(f, h));
  MOESERVE_RETURN_IF_ERROR(read_ropes(f, h));
  MOESERVE_RETURN_IF_ERROR(read_ffn(f, h));
  return h;
}

}  // namespace moeserve::models
