#include "models/dflash_weights.h"

#include <fmt/format.h>

#include <algorithm>

#include "format/model_keys.h"
#include "models/model_loading.h"

namespace moeserve::models {
namespace {

Status read_sizes(const GgufFile& f, DflashHParams& h) {
  MOESERVE_ASSIGN_OR_RETURN(h.n_layer, read_hparam_int(f, keys::kBlockCount, 1));
  MOESERVE_ASSIGN_OR_RETURN(h.n_embd, read_hparam_int(f, keys::kEmbeddingLength, 1));
  MOESERVE_ASSIGN_OR_RETURN(h.n_ff, read_hparam_int(f, keys::kFeedForwardLength, 1));
  MOESERVE_ASSIGN_OR_RETURN(h.n_head, read_hparam_int(f, keys::kHeadCount, 1));
  MOESERVE_ASSIGN_OR_RETURN(h.n_head_kv, read_hparam_int(f, keys::kHeadCountKv, 1, h.n_head));
  MOESERVE_ASSIGN_OR_RETURN(h.head_dim, read_hparam_int(f, keys::kKeyLength, 2, h.n_embd / h.n_head));
  MOESERVE_ASSIGN_OR_RETURN(h.n_ctx_train, read_hparam_int(f, keys::kContextLength, 1, 32768));
  MOESERVE_ASSIGN_OR_RETURN(double eps, read_hparam_float(f, keys::kRmsEps, 1e-6));
  MOESERVE_ASSIGN_OR_RETURN(h.rope_freq_base, read_hparam_float(f, keys::kRopeFreqBase, 10000.0));
  if (!(eps > 0.0 && eps < 1.0) || !(h.rope_freq_base > 0.0))
    return inconsistent_hparams(f, "rms epsilon must be in (0, 1) and rope.freq_base positive");
  h.rms_eps = float(eps);
  if (h.n_head % h.n_head_kv != 0 || h.head_dim % 2 != 0) {
    return inconsistent_hparams(f, fmt::format("head_count {} / head_count_kv {} / key_length {}", h.n_head,
                                               h.n_head_kv, h.head_dim));
  }
  return Status::ok();
}

Status read_draft_keys(const GgufFile& f, DflashHParams& h) {
  MOESERVE_ASSIGN_OR_RETURN(h.block_size, read_hparam_int(f, "block_size", 2, 16));
  if (h.block_size > 64) return inconsistent_hparams(f, fmt::format("block_size {} above 64", h.block_size));
  MOESERVE_ASSIGN_OR_RETURN(int64_t mask, read_hparam_int(f, "mask_token_id", 0));
  h.mask_token_id = int32_t(mask);
  MOESERVE_ASSIGN_OR_RETURN(std::vector<int64_t> layers, f.require_int_array(f.arch_key("target_layers")));
  if (layers.empty() || layers.size() > 64)
    return inconsistent_hparams(f, fmt::format("target_layers has {} entries (1..64)", layers.size()));
  for (size_t i = 0; i < layers.size(); ++i) {
    if (layers[i] < 0 || layers[i] > (1 << 20) || (i > 0 && layers[i] <= layers[i - 1]))
      return inconsistent_hparams(f, "target_layers must be ascending, non-negative layer ids");
    h.target_layers.push_back(int32_t(layers[i]));
  }
  MOESERVE_ASSIGN_OR_RETURN(h.target_layer_count, read_hparam_int(f, "target_layer_count", 0, 0));
  MOESERVE_ASSIGN_OR_RETURN(h.target_vocab, read_hparam_int(f, keys::kVocabSize, 0, 0));
  MOESERVE_ASSIGN_OR_RETURN(h.sliding_window, read_hparam_int(f, keys::kSlidingWindow, 0, 0));
  auto flags = [&](std::string_view suffix, std::vector<bool>& out) -> Status {
    out.assign(size_t(h.n_layer), false);
    const std::string key = f.arch_key(suffix);
    if (!f.has(key)) return Status::ok();
    MOESERVE_ASSIGN_OR_RETURN(std::vector<int64_t> v, f.require_int_array(key));
    if (int64_t(v.size()) != h.n_layer)
      return inconsistent_hparams(f,
                                  fmt::format("'{}' has {} entries for {} layers", key, v.size(), h.n_layer));
    for (size_t i = 0; i < v.size(); ++i) out[i] = v[i] != 0;
    return Status::ok();
  };
  MOESERVE_RETURN_IF_ERROR(flags("attention.sliding_layers", h.sliding));
  MOESERVE_RETURN_IF_ERROR(flags("attention.causal_layers", h.causal));
  if (h.sliding_window == 0 && std::find(h.sliding.begin(), h.sliding.end(), true) != h.sliding.end())
    return inconsistent_hparams(f, "sliding layers without attention.sliding_window");
  MOESERVE_ASSIGN_OR_RETURN(double mult, read_hparam_float(f, "output_multiplier", 1.0));
  MOESERVE_ASSIGN_OR_RETURN(double cap, read_hparam_float(f, "final_logit_softcapping", 0.0));
  if (!(mult > 0.0) || cap < 0.0)
    return inconsistent_hparams(f, "output_multiplier must be positive, final_logit_softcapping >= 0");
  h.output_multiplier = float(mult);
  h.logit_softcap = float(cap);
  return Status::ok();
}

}  // namespace

Result<DflashHParams> load_dflash_hparams(const GgufFile& file) {
  const std::string_view arch = file.has(keys::kArchitecture) ? file.architecture() : std::string_view{};
  if (arch != kDflashArch) {
    return make_error(StatusCode::kUnsupported,
                      "{}: architecture '{}' is not a DFlash draft (--draft takes a file of architecture "
                      "'dflash': `moeserve convert` makes one from a DFlash checkpoint directory)",
                      file.name(), arch);
  }
  DflashHParams h;
  MOESERVE_RETURN_IF_ERROR(read_sizes(file, h));
  MOESERVE_RETURN_IF_ERROR(read_draft_keys(file, h));
  return h;
}

Result<DflashWeights> load_dflash_weights(const GgufFile& file, const DflashHParams& hp) {
  DflashWeights w;
  TensorLoader ld{file};
  const int64_t H = hp.n_embd, hd = hp.head_dim;
  MOESERVE_ASSIGN_OR_RETURN(w.fc, ld.get(std::string(kDflashFcTensor), {hp.feature_width(), H}, false));
  MOESERVE_ASSIGN_OR_RETURN(w.hidden_norm, ld.get(std::string(kDflashHiddenNormTensor), {H}, true));
  MOESERVE_ASSIGN_OR_RETURN(w.output_norm, ld.get(std::string(keys::kOutputNorm), {H}, true));
  w.layers.resize(size_t(hp.n_layer));
  for (int il = 0; il < int(hp.n_layer); ++il) {
    DflashLayerWeights& l = w.layers[size_t(il)];
    auto n = [&](std::string_view t) { return keys::blk(il, t); };
    MOESERVE_ASSIGN_OR_RETURN(l.attn_norm, ld.get(n(keys::kAttnNorm), {H}, true));
    MOESERVE_ASSIGN_OR_RETURN(l.attn_q, ld.get(n(keys::kAttnQ), {H, hp.q_dim()}, false));
    MOESERVE_ASSIGN_OR_RETURN(l.attn_k, ld.get(n(keys::kAttnK), {H, hp.kv_dim()}, false));
    MOESERVE_ASSIGN_OR_RETURN(l.attn_v, ld.get(n(keys::kAttnV), {H, hp.kv_dim()}, false));
    MOESERVE_ASSIGN_OR_RETURN(l.attn_output, ld.get(n(keys::kAttnOutput), {hp.q_dim(), H}, false));
    MOESERVE_ASSIGN_OR_RETURN(l.attn_q_norm, ld.get(n(keys::kAttnQNorm), {hd}, true));
    MOESERVE_ASSIGN_OR_RETURN(l.attn_k_norm, ld.get(n(keys::kAttnKNorm), {hd}, true));
    MOESERVE_ASSIGN_OR_RETURN(l.ffn_norm, ld.get(n(keys::kFfnNorm), {H}, true));
    MOESERVE_ASSIGN_OR_RETURN(l.ffn_gate, ld.get(n(keys::kFfnGate), {H, hp.n_ff}, false));
    MOESERVE_ASSIGN_OR_RETURN(l.ffn_up, ld.get(n(keys::kFfnUp), {H, hp.n_ff}, false));
    MOESERVE_ASSIGN_OR_RETURN(l.ffn_down, ld.get(n(keys::kFfnDown), {hp.n_ff, H}, false));
  }
  w.n_params = ld.n_params;
  w.n_bytes = ld.n_bytes;
  return w;
}

}  // namespace moeserve::models
