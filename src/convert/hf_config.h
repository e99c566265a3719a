// Hugging Face config.json -> the hyperparameters of a GGUF file.
//
// Supported architectures: Qwen3MoeForCausalLM (-> qwen3moe) and
// Qwen3ForCausalLM (-> qwen3); the Qwen3.5 / 3.6 hybrids
// Qwen3_5MoeForCausalLM (-> qwen35moe) and Qwen3_5ForCausalLM (-> qwen35),
// also as the released multimodal Qwen3_5[Moe]ForConditionalGeneration
// (text model only), read by hf_qwen35.h; LagunaForCausalLM (-> laguna), read
// by hf_laguna.h. Features our engine (and
// llama.cpp's graph for these architectures) does not implement are refused
// with an error naming the key, never silently ignored: decoder_sparse_step
// != 1, non-empty mlp_only_layers, rope scaling (rope_scaling /
// rope_parameters.rope_type other than "default"), attention_bias,
// use_sliding_window, non-full layer_types, and norm_topk_prob = false for
// qwen3moe (llama.cpp always renormalises the top-k router weights for this
// architecture).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "convert/hf_dflash.h"
#include "convert/laguna_gguf.h"
#include "core/status.h"
#include "format/gguf_writer.h"

namespace moeserve::convert {

struct HfModelConfig {
  std::string source;           // path, for messages
  std::string hf_architecture;  // "Qwen3MoeForCausalLM"
  std::string arch;             // "qwen3moe" | "qwen3" | "qwen35moe" | "qwen35" | "laguna"
  int64_t hidden_size = 0;
  int64_t n_layer = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;
  int64_t intermediate_size = 0;  // dense FFN (qwen3), or the unused dense size of qwen3moe
  int64_t vocab_size = 0;
  int64_t context_length = 0;
  double rope_theta = 0;
  double rms_eps = 0;
  bool tie_word_embeddings = false;
  // MoE (qwen3moe only; 0 for dense).
  int64_t n_expert = 0;
  int64_t n_expert_used = 0;
  int64_t expert_ff = 0;
  std::optional<int64_t> bos_token_id, eos_token_id;

  // Qwen3.5 / 3.6 hybrids (qwen35moe, qwen35) only.
  bool hybrid = false;
  bool has_intermediate_size = true;  // feed_forward_length is written (qwen35moe: when config.json has it)
  int64_t n_rot = 0;                  // rope.dimension_count = head_dim * partial_rotary_factor
  std::vector<int32_t> rope_sections; // rope.dimension_sections: mrope_section + zeros, 4 entries
  int64_t conv_kernel = 0;            // linear_conv_kernel_dim
  int64_t n_k_heads = 0, n_v_heads = 0, head_k_dim = 0, head_v_dim = 0;  // linear_*
  int64_t full_attention_interval = 0;
  int64_t shared_expert_ff = 0;  // shared_expert_intermediate_size (qwen35moe, laguna)

  // Laguna only (hf_laguna.h): every laguna.* key, the output gate's kind per
  // layer (true: per element, g_proj {H, n_head * head_dim}; false: per head)
  // and config.json's eos_token_id list (its extra entry becomes eot).
  LagunaGgufParams laguna;
  std::vector<bool> gate_per_element;
  std::vector<int64_t> eos_token_ids;

  // DFlash drafts only (hf_dflash.h).
  DflashGgufParams dflash;

  // What the conversion leaves out on purpose (MTP layers, ...), one line each.
  std::vector<std::string> notes;

  bool is_moe() const { return n_expert > 0; }
  // A gated full-attention layer of a hybrid (else a Gated DeltaNet one).
  bool is_full_attention_layer(int64_t layer) const { return (layer + 1) % full_attention_interval == 0; }
};

// "Qwen3MoeForCausalLM (qwen3moe), Qwen3ForCausalLM (qwen3), ...".
std::string supported_hf_architectures();

Result<HfModelConfig> parse_hf_config(std::string_view json_text, std::string_view name);
// Reads DIR/config.json.
Result<HfModelConfig> load_hf_config(const std::string& dir);

// general.architecture and the {arch}.* hyperparameter keys.
void write_hf_hparams(const HfModelConfig& config, GgufWriter& writer);

}  // namespace moeserve::convert
