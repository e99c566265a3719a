#include "convert/laguna_gguf.h"

#include <string_view>

#include "format/model_keys.h"

namespace moeserve::convert {

void write_laguna_hparams(const LagunaGgufParams& p, GgufWriter& w) {
  constexpr std::string_view kArch = "laguna";
  auto key = [&](std::string_view suffix) { return keys::arch_key(kArch, suffix); };
  w.set_string(keys::kArchitecture, std::string(kArch));
  w.set_u32(key(keys::kContextLength), uint32_t(p.context_length));
  w.set_u32(key(keys::kEmbeddingLength), uint32_t(p.embedding_length));
  w.set_u32(key(keys::kBlockCount), uint32_t(p.block_count));
  if (p.feed_forward_length > 0) w.set_u32(key(keys::kFeedForwardLength), uint32_t(p.feed_forward_length));
  std::vector<uint32_t> heads;
  for (int64_t n : p.head_count) heads.push_back(uint32_t(n));
  w.set_u32_array(key(keys::kHeadCount), std::move(heads));
  w.set_u32(key(keys::kHeadCountKv), uint32_t(p.head_count_kv));
  w.set_u32(key(keys::kKeyLength), uint32_t(p.head_dim));
  w.set_u32(key(keys::kValueLength), uint32_t(p.head_dim));
  w.set_f32(key(keys::kRmsEps), float(p.rms_eps));
  w.set_u32(key(keys::kVocabSize), uint32_t(p.vocab_size));

  w.set_f32(key(keys::kRopeFreqBase), float(p.rope_theta));
  w.set_u32(key(keys::kRopeDimensionCount), uint32_t(p.n_rot));
  if (p.yarn_factor > 0) {
    w.set_string(key(keys::kRopeScalingType), "yarn");
    w.set_f32(key(keys::kRopeScalingFactor), float(p.yarn_factor));
    w.set_u32(key(keys::kRopeScalingOrigCtx), uint32_t(p.yarn_orig_ctx));
    if (p.yarn_beta_fast) w.set_f32(key(keys::kRopeScalingYarnBetaFast), float(*p.yarn_beta_fast));
    if (p.yarn_beta_slow) w.set_f32(key(keys::kRopeScalingYarnBetaSlow), float(*p.yarn_beta_slow));
    if (p.yarn_attn_factor) w.set_f32(key(keys::kRopeScalingYarnAttnFactor), float(*p.yarn_attn_factor));
  }
  if (p.has_swa_rope) {
    w.set_f32(key(keys::kRopeFreqBaseSwa), float(p.rope_theta_swa));
    w.set_u32(key(keys::kRopeDimensionCountSwa), uint32_t(p.n_rot_swa));
  }
  if (p.sliding_window > 0) {
    w.set_u32(key(keys::kSlidingWindow), uint32_t(p.sliding_window));
    w.set_u32(key(keys::kSlidingWindowPattern), uint32_t(p.sliding_window_pattern));
  }

  w.set_u32(key(keys::kLeadingDenseBlockCount), uint32_t(p.leading_dense));
  w.set_u32(key(keys::kExpertCount), uint32_t(p.n_expert));
  w.set_u32(key(keys::kExpertUsedCount), uint32_t(p.n_expert_used));
  w.set_u32(key(keys::kExpertFeedForwardLength), uint32_t(p.expert_ff));
  w.set_u32(key(keys::kExpertSharedFeedForwardLength), uint32_t(p.shared_expert_ff));
  w.set_f32(key(keys::kExpertWeightsScale), float(p.expert_weights_scale));
  w.set_bool(key(keys::kExpertWeightsNorm), true);
  w.set_u32(key(keys::kExpertGatingFunc), uint32_t(keys::kExpertGatingSigmoid));
}

}  // namespace moeserve::convert
