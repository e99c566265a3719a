// A DFlash draft (z-lab's block-diffusion drafter, model-and-format-specs.md
// §6) as a GGUF file of architecture "dflash": its hyperparameters, which
// target it was trained on, and its weights. It has no embedding and no
// output head of its own: it uses the target's (models/dflash_draft.h).
//
// Keys (dflash.*): the Qwen3 sizes (block_count, embedding_length,
// feed_forward_length, attention.head_count[_kv], attention.key_length,
// attention.layer_norm_rms_epsilon, rope.freq_base, context_length); then
// block_size, mask_token_id, target_layers (i32 array: the target layers
// whose outputs are the features), target_layer_count, vocab_size (the
// target's; optional), attention.sliding_window with
// attention.sliding_layers and attention.causal_layers (i32 0/1 per layer),
// output_multiplier and final_logit_softcapping (optional).
// Tensors: fc.weight {n_target_layers * n_embd, n_embd},
// enc.output_norm.weight (the features' norm, HF hidden_norm),
// output_norm.weight, and per layer the Qwen3 attention and dense FFN
// tensors (blk.N.attn_norm, attn_q/k/v, attn_output, attn_q_norm,
// attn_k_norm, ffn_norm, ffn_gate/up/down).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "format/gguf.h"
#include "tensor/weight_view.h"

namespace moeserve::models {

inline constexpr std::string_view kDflashArch = "dflash";
inline constexpr std::string_view kDflashFcTensor = "fc.weight";
inline constexpr std::string_view kDflashHiddenNormTensor = "enc.output_norm.weight";

struct DflashHParams {
  int64_t n_layer = 0, n_embd = 0, n_ff = 0;
  int64_t n_head = 0, n_head_kv = 0, head_dim = 0;
  int64_t n_ctx_train = 0;
  float rms_eps = 1e-6f;
  double rope_freq_base = 10000.0;
  int64_t block_size = 16;
  int32_t mask_token_id = 0;
  std::vector<int32_t> target_layers;  // ascending
  int64_t target_layer_count = 0;      // 0: not recorded
  int64_t target_vocab = 0;            // 0: not recorded
  int64_t sliding_window = 0;
  std::vector<bool> sliding;  // [n_layer]: the layer sees only sliding_window keys back
  std::vector<bool> causal;   // [n_layer]: the block's rows see earlier rows only
  float output_multiplier = 1.0f;
  float logit_softcap = 0.0f;  // > 0: logits = cap * tanh(logits / cap)

  int64_t q_dim() const { return n_head * head_dim; }
  int64_t kv_dim() const { return n_head_kv * head_dim; }
  int64_t feature_width() const { return int64_t(target_layers.size()) * n_embd; }
};

struct DflashLayerWeights {
  WeightView attn_norm, attn_q, attn_k, attn_v, attn_output, attn_q_norm, attn_k_norm;
  WeightView ffn_norm, ffn_gate, ffn_up, ffn_down;
};

struct DflashWeights {
  WeightView fc, hidden_norm, output_norm;
  std::vector<DflashLayerWeights> layers;
  uint64_t n_params = 0, n_bytes = 0;
};

// Reads and validates; errors name the file and key. kUnsupported for a
// file of another architecture (saying what --draft expects).
Result<DflashHParams> load_dflash_hparams(const GgufFile& file);
Result<DflashWeights> load_dflash_weights(const GgufFile& file, const DflashHParams& hp);

}  // namespace moeserve::models
