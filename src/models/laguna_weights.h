// Zero-copy views of the Laguna weights inside the mapped GGUF file
// (llama.cpp's tensor names), each checked for presence, type and exact
// shape when the views are built; query, gate and output shapes follow
// each layer's own head count.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "format/gguf.h"
#include "models/laguna_hparams.h"
#include "tensor/weight_view.h"

namespace moeserve::models {

using moeserve::WeightView;

struct LagunaLayerWeights {
  WeightView attn_norm, ffn_norm;
  WeightView attn_q, attn_k, attn_v, attn_output, attn_q_norm, attn_k_norm;
  WeightView attn_gate;  // {n_embd, n_head} or {n_embd, n_head * head_dim}
  // Dense layers.
  WeightView ffn_gate, ffn_up, ffn_down;
  // MoE layers: router, selection bias (f32 {n_expert}), experts, shared expert.
  WeightView ffn_gate_inp, ffn_exp_probs_b, ffn_gate_exps, ffn_up_exps, ffn_down_exps;
  WeightView ffn_gate_shexp, ffn_up_shexp, ffn_down_shexp;
};

struct LagunaWeights {
  WeightView token_embd, output_norm, output;  // output == token_embd when tied
  bool tied_output = false;
  std::vector<LagunaLayerWeights> layers;
  uint64_t n_params = 0;
  uint64_t n_bytes = 0;
  uint64_t active_bytes_per_token = 0;
};

// Builds the views; fills hp.n_vocab from token_embd and hp.gate_per_element
// from attn_gate's width (the same on every layer).
Result<LagunaWeights> load_laguna_weights(const GgufFile& file, LagunaHParams& hp);

}  // namespace moeserve::models
