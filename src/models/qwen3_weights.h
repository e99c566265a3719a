// Zero-copy views of the Qwen3 / Qwen3-MoE weights inside the mapped GGUF
// file. Every tensor is checked for presence, type and exact shape when the
// views are built, so the forward pass never re-checks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/status.h"
#include "format/gguf.h"
#include "models/qwen3_hparams.h"
#include "tensor/dtype.h"
#include "tensor/weight_view.h"

namespace moeserve::models {

using moeserve::WeightView;

struct Qwen3LayerWeights {
  WeightView attn_norm, attn_q, attn_k, attn_v, attn_output, attn_q_norm, attn_k_norm, ffn_norm;
  WeightView ffn_gate, ffn_up, ffn_down;                       // qwen3 (dense)
  WeightView ffn_gate_inp, ffn_gate_exps, ffn_up_exps, ffn_down_exps;  // qwen3moe
};

struct Qwen3Weights {
  WeightView token_embd, output_norm, output;  // output == token_embd when tied
  bool tied_output = false;
  std::vector<Qwen3LayerWeights> layers;
  uint64_t n_params = 0;        // all elements of the tensors used
  uint64_t n_bytes = 0;
  uint64_t active_bytes_per_token = 0;  // bytes read per decoded token (top-k experts)
};

// Builds the views; fills hp.n_vocab from token_embd. Errors name the tensor
// and say what was expected and what the file has.
Result<Qwen3Weights> load_qwen3_weights(const GgufFile& file, Qwen3HParams& hp);

}  // namespace moeserve::models
