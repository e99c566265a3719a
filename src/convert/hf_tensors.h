// Hugging Face Qwen3 / Qwen3-MoE tensor names and layouts -> GGUF tensors.
//
// Names: model.embed_tokens -> token_embd, model.norm -> output_norm,
// lm_head -> output (omitted when tie_word_embeddings), and per layer
// input_layernorm -> attn_norm, post_attention_layernorm -> ffn_norm,
// self_attn.{q,k,v,o}_proj -> attn_{q,k,v,output}, self_attn.{q,k}_norm ->
// attn_{q,k}_norm, dense mlp.{gate,up,down}_proj -> ffn_{gate,up,down}, MoE
// mlp.gate -> ffn_gate_inp and the experts -> ffn_{gate,up,down}_exps.
//
// A HF Linear weight [out, in] (row-major) already is GGUF ne {in, out}: no
// transposition. Experts are stacked to ne {in, out, n_expert}, expert e
// being the contiguous slab e. Two expert layouts are read:
//  - per expert: mlp.experts.E.{gate,up,down}_proj.weight [out, in];
//  - fused (transformers v5): mlp.experts.gate_up_proj [E, 2I, H] (gate rows
//    first, then up; F.linear(x, w[e]) -> chunk(2)) and mlp.experts.down_proj
//    [E, H, I]. The transposed variants [E, H, 2I] and [E, I, H] (x @ w[e]
//    style) are detected by shape and gathered. When H == 2I (resp. H == I)
//    the two are indistinguishable and the v5 layout [E, 2I, H] is assumed.
//
// Every source shape is checked against config.json, every expected tensor
// must exist, and any tensor the plan does not use is an error naming it
// (rotary_emb.inv_freq buffers, recomputed from rope_theta, are skipped).
//
// The Qwen3.5 / 3.6 hybrids (qwen35moe, qwen35) are planned by hf_qwen35.h;
// their tensors add row / column permutations and value transforms to kDirect.
// Laguna is planned by hf_laguna.h (names only, no transforms).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "convert/hf_config.h"
#include "core/status.h"
#include "format/safetensors.h"

namespace moeserve::convert {

enum class SourceLayout {
  kDirect,         // one source, same element order as the output
  kStackedExperts, // sources[e] is expert e, each [out, in]
  kFusedGateUp,    // sources[0] is gate_up_proj; fused_part 0 = gate, 1 = up
  kFusedDown,      // sources[0] is down_proj stored transposed [E, I, H]
};

// Applied to every value after it is read (in f32).
enum class ValueTransform {
  kNone,
  kPlusOne,  // w + 1: zero-centred RMSNorm weights (x̂·(1+w)) for a plain x̂·w
  kNegExp,   // -exp(w): A_log -> ssm_a
};

struct PlannedTensor {
  std::string name;             // GGUF name
  std::vector<int64_t> ne;      // GGUF ne order
  SourceLayout layout = SourceLayout::kDirect;
  std::vector<const SafetensorsTensor*> sources;
  int fused_part = 0;
  bool transposed = false;      // kFusedGateUp stored as [E, H, 2I]
  // kDirect only: GGUF row r is source row row_map[r], and element i of a
  // row is element col_map[i] of that source row (empty: the identity).
  std::vector<int64_t> row_map = {};
  std::vector<int64_t> col_map = {};
  ValueTransform transform = ValueTransform::kNone;

  int64_t n_rows() const;
  // Rows [begin, end) of the GGUF tensor (row = ne[0] elements) as f32.
  void read_rows(int64_t begin, int64_t end, float* out) const;
};

// The GGUF tensors of the model in a llama.cpp-like order (globals, then
// layer by layer), or an error naming the missing / mis-shaped / unused tensor.
// Sources left out on purpose (vision tower, MTP layers) are summed up in
// `notes`, one line each.
Result<std::vector<PlannedTensor>> plan_hf_tensors(const HfModelConfig& config, const SafetensorsModel& model,
                                                   std::vector<std::string>* notes = nullptr);

}  // namespace moeserve::convert
