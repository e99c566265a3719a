// Hyperparameters of Laguna (Poolside Laguna-XS.2, model-and-format-specs.md
// §5) read from GGUF metadata (llama.cpp's `laguna.*` keys) and validated:
// per-layer query head counts, full and sliding-window layers with their own
// RoPE (YaRN on the full ones), a softplus attention output gate per head or
// per element, leading dense layers, then sigmoid-routed experts with a
// selection bias, scaled weights and an ungated shared expert.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "format/gguf.h"

namespace moeserve::models {

struct LagunaHParams {
  std::string arch_name = "laguna";
  int64_t n_ctx_train = 0;
  int64_t n_embd = 0;
  int64_t n_layer = 0;
  std::vector<int64_t> n_head;  // [n_layer] query heads
  int64_t n_head_kv = 0, head_dim = 0;
  float rms_eps = 1e-6f;
  // Attention kinds: sliding[l] layers see the last `window` positions.
  int64_t window = 0;         // 0: every layer is full attention
  std::vector<bool> sliding;  // [n_layer]
  backend::RopeSpec rope_full, rope_swa;
  // The output gate: one value per head, or one per element (Laguna-M.1).
  bool gate_per_element = false;
  // FFN: n_dense_lead dense SwiGLU layers of n_ff, then MoE layers.
  int64_t n_dense_lead = 0, n_ff = 0;
  int64_t n_expert = 0, n_expert_used = 0, n_ff_exp = 0, n_ff_shexp = 0;
  bool sigmoid_gating = true;
  bool normalize_weights = true;
  float expert_weights_scale = 1.0f;
  int64_t n_vocab = 0;  // rows of token_embd (filled by the weight loader)

  int64_t max_head() const;
  int64_t q_dim(int64_t layer) const { return n_head[size_t(layer)] * head_dim; }
  int64_t max_q_dim() const { return max_head() * head_dim; }
  int64_t kv_dim() const { return n_head_kv * head_dim; }
  bool moe_layer(int64_t layer) const { return layer >= n_dense_lead; }
  int rope_index(int64_t layer) const { return sliding[size_t(layer)] ? 1 : 0; }  // [rope_full, rope_swa]
};

// Reads and validates (errors name the file and the key).
Result<LagunaHParams> load_laguna_hparams(const GgufFile& file);

}  // namespace moeserve::models
