// Hyperparameters of the Qwen3.5 / 3.6 hybrid family (qwen35moe, qwen35):
// Gated DeltaNet layers with gated full attention every
// full_attention_interval layers (model-and-format-specs.md §1–§3), read
// from GGUF metadata and validated, so the forward can trust every size.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "format/gguf.h"

namespace moeserve::models {

struct Qwen35HParams {
  bool moe = true;        // qwen35moe; false: qwen35 (dense FFN)
  std::string arch_name;  // "qwen35moe" / "qwen35"
  int64_t n_ctx_train = 0;
  int64_t n_embd = 0;
  int64_t n_layer = 0;  // trunk layers: block_count - nextn_predict_layers
  int64_t n_nextn = 0;  // multi-token-prediction blocks after the trunk (not run)
  // Gated full attention.
  int64_t n_head = 0, n_head_kv = 0, head_dim = 0;
  int64_t n_rot = 0;  // partial NEOX RoPE dims (rope.dimension_count)
  double rope_freq_base = 10000000.0;
  float rms_eps = 1e-6f;
  // Gated DeltaNet.
  int conv_kernel = 4;
  int64_t n_k_heads = 0, n_v_heads = 0, head_k_dim = 0, head_v_dim = 0;
  int64_t full_attention_interval = 4;
  std::vector<bool> recurrent;  // [n_layer]: a DeltaNet layer
  // FFN.
  int64_t n_ff = 0;                                                       // qwen35
  int64_t n_expert = 0, n_expert_used = 0, n_ff_exp = 0, n_ff_shexp = 0;  // qwen35moe
  int64_t n_vocab = 0;  // rows of token_embd (filled by the weight loader)

  int64_t q_dim() const { return n_head * head_dim; }
  int64_t kv_dim() const { return n_head_kv * head_dim; }
  int64_t conv_dim() const { return 2 * n_k_heads * head_k_dim + n_v_heads * head_v_dim; }
  int64_t v_dim() const { return n_v_heads * head_v_dim; }
  int64_t state_floats() const {
    return int64_t(conv_kernel - 1) * conv_dim() + n_v_heads * head_k_dim * head_v_dim;
  }
};

// Reads and validates (errors name the file and the key).
Result<Qwen35HParams> load_qwen35_hparams(const GgufFile& file);

}  // namespace moeserve::models
