// The `laguna.*` hyperparameter keys (Poolside Laguna, model-and-format-specs.md
// §5; llama.cpp's spellings, format/model_keys.h), written alike by
// `moeserve convert` (hf_laguna.h) and `moeserve make-model`.
//
// attention.head_count is a u32 array of block_count entries (query heads per
// layer). RoPE: rope.freq_base / rope.dimension_count for the full-attention
// layers, with YaRN as rope.scaling.* when yarn_factor > 0; rope.*_swa for the
// sliding-window layers when has_swa_rope. attention.sliding_window and
// attention.sliding_window_pattern (period P: layer i is full attention iff
// i % P == 0) only when sliding_window > 0. Routing: expert_gating_func 2
// (sigmoid), expert_weights_norm true, expert_weights_scale.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "format/gguf_writer.h"

namespace moeserve::convert {

struct LagunaGgufParams {
  int64_t context_length = 0;
  int64_t embedding_length = 0;
  int64_t block_count = 0;
  int64_t feed_forward_length = 0;  // the dense layers' FFN; 0: not written
  std::vector<int64_t> head_count;  // [block_count]
  int64_t head_count_kv = 0;
  int64_t head_dim = 0;  // key_length = value_length
  double rms_eps = 1e-6;
  int64_t vocab_size = 0;
  // Full-attention layers.
  double rope_theta = 0;
  int64_t n_rot = 0;
  double yarn_factor = 0;  // 0: no rope.scaling.* keys
  int64_t yarn_orig_ctx = 0;
  std::optional<double> yarn_beta_fast, yarn_beta_slow, yarn_attn_factor;
  // Sliding-window layers.
  bool has_swa_rope = false;
  double rope_theta_swa = 0;
  int64_t n_rot_swa = 0;
  int64_t sliding_window = 0;          // 0: every layer full attention, no window keys
  int64_t sliding_window_pattern = 0;  // period P
  // FFN: leading_dense dense layers, then MoE with a shared expert.
  int64_t leading_dense = 0;
  int64_t n_expert = 0, n_expert_used = 0, expert_ff = 0, shared_expert_ff = 0;
  double expert_weights_scale = 1.0;
};

// general.architecture = "laguna" and every laguna.* key above.
void write_laguna_hparams(const LagunaGgufParams& params, GgufWriter& writer);

}  // namespace moeserve::convert
