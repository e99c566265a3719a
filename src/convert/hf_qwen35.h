// The Qwen3.5 / 3.6 hybrid checkpoints (Qwen3_5MoeForCausalLM -> qwen35moe,
// Qwen3_5ForCausalLM -> qwen35; the released multimodal
// Qwen3_5[Moe]ForConditionalGeneration convert to the same, text model only)
// -> llama.cpp's qwen35moe / qwen35 GGUF keys and tensors
// (model-and-format-specs.md §1-§3, "Conversion transforms").
//
// config.json: the transformers v5 text config (model_type qwen3_5_moe_text /
// qwen3_5_text), or a composite config whose `text_config` object is read
// over the top level (as llama.cpp does). RoPE comes from rope_parameters
// {rope_theta, partial_rotary_factor (default 0.25), mrope_section (default
// [11, 11, 10]), mrope_interleaved}, or the legacy top-level rope_theta /
// partial_rotary_factor (and rope_scaling for the object). For text the
// interleaved M-RoPE is plain NEOX RoPE over the first
// head_dim * partial_rotary_factor dimensions. Layer kinds come from
// layer_types or full_attention_interval (default 4); the GGUF stores only
// the interval, so a layer_types list that is not that periodic pattern is
// refused naming the key. Also refused, naming the key: rope types other than
// "default", attention_bias, attn_output_gate = false, hidden_act other than
// silu, use_sliding_window, linear_num_value_heads not a multiple of
// linear_num_key_heads. mtp_num_hidden_layers is noted and ignored.
//
// Tensors (HF prefix `model.` or `model.language_model.`): per layer
// input_layernorm -> attn_norm, post_attention_layernorm ->
// post_attention_norm; full-attention layers self_attn.{q,k,v,o}_proj ->
// attn_{q,k,v,output} (attn_q rows per head [query | gate], as stored),
// self_attn.{q,k}_norm -> attn_{q,k}_norm; Gated DeltaNet layers
// linear_attn.in_proj_qkv -> attn_qkv, in_proj_z -> attn_gate, in_proj_b ->
// ssm_beta, in_proj_a -> ssm_alpha, conv1d -> ssm_conv1d, dt_bias ->
// ssm_dt.bias, A_log -> ssm_a, norm -> ssm_norm, out_proj -> ssm_out; MoE
// mlp.gate -> ffn_gate_inp, the experts (per-expert or fused, as for
// qwen3moe) -> ffn_{gate,up,down}_exps, mlp.shared_expert.* ->
// ffn_{gate,up,down}_shexp, mlp.shared_expert_gate [1, H] ->
// ffn_gate_inp_shexp {H}; dense mlp.{gate,up,down}_proj -> ffn_{gate,up,down}.
// Transforms:
//  1. every *norm.weight except linear_attn.norm.weight is stored as w + 1
//     (zero-centred RMSNorm x̂·(1+w) -> plain x̂·w);
//  2. ssm_a = -exp(A_log);
//  3. conv1d [conv_dim, 1, K] -> ne {K, conv_dim};
//  4. when n_v != n_k, V heads go from HF's grouped order to GGUF's tiled
//     order: HF V head g·r + j (r = n_v / n_k) becomes GGUF head j·n_k + g,
//     on the v rows of in_proj_qkv and the v channels of conv1d, the rows of
//     in_proj_z / in_proj_a / in_proj_b, A_log, dt_bias and the columns of
//     out_proj. GGUF V head h then reads K head h % n_k.
// model.visual.* (vision tower) and mtp.* (multi-token prediction) tensors
// are skipped with a one-line note each.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string_view>
#include <vector>

#include "convert/hf_config.h"
#include "core/status.h"
#include "format/gguf_writer.h"

namespace moeserve::convert {

class HfTensorPlanner;

// Fills `config` (its arch already chosen) from config.json's `root`.
Status parse_qwen35_config(const nlohmann::json& root, std::string_view name, HfModelConfig& config);

// general.architecture and the {arch}.* keys llama.cpp writes for these archs.
void write_qwen35_hparams(const HfModelConfig& config, GgufWriter& writer);

// Every tensor of the model (planner.config() is a hybrid's).
Status plan_qwen35_tensors(HfTensorPlanner& planner);

// order[h] = the HF V head that GGUF V head h holds (transform 4).
std::vector<int64_t> qwen35_v_head_order(int64_t n_k_heads, int64_t n_v_heads);

}  // namespace moeserve::convert
