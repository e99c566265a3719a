// Poolside Laguna checkpoints (LagunaForCausalLM: Laguna-XS.2, Laguna-M.1)
// -> llama.cpp's `laguna` GGUF keys and tensors (model-and-format-specs.md §5;
// the keys are written by laguna_gguf.h).
//
// config.json (transformers' LagunaConfig; its defaults apply to absent keys):
// num_attention_heads_per_layer (else num_attention_heads on every layer) ->
// the attention.head_count array; layer_types ("full_attention" /
// "sliding_attention", default all full) -> attention.sliding_window_pattern,
// a period P with layer i full iff i % P == 0 (layer_types that are not such a
// pattern are refused naming the key), and sliding_window ->
// attention.sliding_window when some layer slides; rope_parameters
// {full_attention, sliding_attention} (default θ 500000 with partial 0.5 /
// θ 10000 with partial 1.0), each {rope_type, rope_theta,
// partial_rotary_factor (default 1.0)}: n_rot = int(head_dim * factor); the
// full layers may be "yarn" {factor, original_max_position_embeddings,
// beta_fast, beta_slow, attention_factor} -> rope.scaling.*; mlp_layer_types
// ("dense" / "sparse", default one dense layer first) ->
// leading_dense_block_count; intermediate_size -> feed_forward_length;
// num_experts, num_experts_per_tok, moe_intermediate_size,
// shared_expert_intermediate_size; moe_routed_scaling_factor ->
// expert_weights_scale; gating (true or "per-head": one gate per head,
// "per-element": one per channel) and the optional per-layer gating_types.
// Refused, naming the key: rope types other than default / yarn, yarn on the
// sliding layers, a dense layer after a sparse one, attention_bias,
// hidden_act other than silu, moe_apply_router_weight_on_input,
// moe_router_logit_softcapping > 0, other gating values, and a non-empty
// mlp_only_layers without mlp_layer_types (transformers ignores it).
//
// Tensors (HF prefix `model.`), names only, no value transform (standard
// RMSNorm, NEOX RoPE: no q/k permutation): per layer input_layernorm ->
// attn_norm, post_attention_layernorm -> ffn_norm, self_attn.{q,k,v,o}_proj ->
// attn_{q,k,v,output}, self_attn.{q,k}_norm -> attn_{q,k}_norm,
// self_attn.g_proj -> attn_gate ({H, n_head} per head or {H, n_head·head_dim}
// per element; another width is an error naming the tensor and the gating);
// dense layers mlp.{gate,up,down}_proj -> ffn_{gate,up,down}; MoE layers
// mlp.gate -> ffn_gate_inp, mlp.gate.e_score_correction_bias (saved
// checkpoints: mlp.experts.e_score_correction_bias) -> exp_probs_b.bias
// {n_expert}, the experts (per-expert or fused, as for qwen3moe) ->
// ffn_{gate,up,down}_exps, mlp.shared_experts.* (saved: mlp.shared_expert.*)
// -> ffn_{gate,up,down}_shexp. Global: embed_tokens -> token_embd, norm ->
// output_norm, lm_head -> output (none when tie_word_embeddings).
//
// Tokenizer: as for the other architectures, plus config.json's eos_token_id
// list ([2, 24] in XS.2): its first entry other than bos and eos becomes
// tokenizer.ggml.eot_token_id and that token is made a control token (as
// llama.cpp's converter does for `</assistant>`).
#pragma once
#include <nlohmann/json.hpp>
#include <string_view>

#include "convert/hf_config.h"
#include "core/status.h"
#include "tokenizer/vocab.h"

namespace moeserve::convert {

class HfTensorPlanner;

// Fills `config` (arch "laguna") from config.json's `root`, config.laguna
// with every key.
Status parse_laguna_config(const nlohmann::json& root, std::string_view name, HfModelConfig& config);

// Every tensor of the model.
Status plan_laguna_tensors(HfTensorPlanner& planner);

// The eot id from the eos_token_id list, as a control token (see above).
void apply_laguna_vocab(const HfModelConfig& config, tok::VocabData& vocab);

}  // namespace moeserve::convert
