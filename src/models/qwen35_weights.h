// Zero-copy views of the qwen35moe / qwen35 weights inside the mapped GGUF
// file (llama.cpp's tensor names, model-and-format-specs.md §2), each
// checked for presence, type and exact shape when the views are built.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "format/gguf.h"
#include "models/qwen35_hparams.h"
#include "tensor/weight_view.h"

namespace moeserve::models {

using moeserve::WeightView;

struct Qwen35LayerWeights {
  WeightView attn_norm, post_attention_norm;
  // Gated full attention (attn_q rows: per head [query | gate]).
  WeightView attn_q, attn_k, attn_v, attn_output, attn_q_norm, attn_k_norm;
  // Gated DeltaNet.
  WeightView attn_qkv, attn_gate, ssm_beta, ssm_alpha, ssm_conv1d, ssm_dt, ssm_a, ssm_norm, ssm_out;
  // FFN: dense (qwen35) or routed experts plus a gated shared expert (qwen35moe).
  WeightView ffn_gate, ffn_up, ffn_down;
  WeightView ffn_gate_inp, ffn_gate_exps, ffn_up_exps, ffn_down_exps;
  WeightView ffn_gate_inp_shexp, ffn_gate_shexp, ffn_up_shexp, ffn_down_shexp;
};

struct Qwen35Weights {
  WeightView token_embd, output_norm, output;  // output == token_embd when tied
  bool tied_output = false;
  std::vector<Qwen35LayerWeights> layers;
  uint64_t n_params = 0;
  uint64_t n_bytes = 0;
  uint64_t active_bytes_per_token = 0;
};

// Builds the views; fills hp.n_vocab from token_embd.
Result<Qwen35Weights> load_qwen35_weights(const GgufFile& file, Qwen35HParams& hp);

}  // namespace moeserve::models
