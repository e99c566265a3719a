// The GGUF vocabulary shared by every writer (convert, make-model, quantize)
// and reader (model loaders): metadata keys and tensor names, spelled as
// llama.cpp writes them so files move freely between the two.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace moeserve::keys {

// general.*
inline constexpr std::string_view kArchitecture = "general.architecture";
inline constexpr std::string_view kName = "general.name";
inline constexpr std::string_view kAlignment = "general.alignment";
inline constexpr std::string_view kFileType = "general.file_type";
inline constexpr std::string_view kQuantizationVersion = "general.quantization_version";

// {arch}.* hyperparameters: arch_key("qwen3moe", kBlockCount) -> "qwen3moe.block_count"
inline constexpr std::string_view kContextLength = "context_length";
inline constexpr std::string_view kEmbeddingLength = "embedding_length";
inline constexpr std::string_view kBlockCount = "block_count";
inline constexpr std::string_view kFeedForwardLength = "feed_forward_length";
inline constexpr std::string_view kHeadCount = "attention.head_count";
inline constexpr std::string_view kHeadCountKv = "attention.head_count_kv";
inline constexpr std::string_view kKeyLength = "attention.key_length";
inline constexpr std::string_view kValueLength = "attention.value_length";
inline constexpr std::string_view kRmsEps = "attention.layer_norm_rms_epsilon";
inline constexpr std::string_view kRopeFreqBase = "rope.freq_base";
inline constexpr std::string_view kRopeDimensionCount = "rope.dimension_count";
inline constexpr std::string_view kExpertCount = "expert_count";
inline constexpr std::string_view kExpertUsedCount = "expert_used_count";
inline constexpr std::string_view kExpertFeedForwardLength = "expert_feed_forward_length";
inline constexpr std::string_view kExpertSharedFeedForwardLength = "expert_shared_feed_forward_length";
// Hybrid Gated DeltaNet models (qwen35moe, qwen35; model-and-format-specs.md §1).
inline constexpr std::string_view kSsmConvKernel = "ssm.conv_kernel";      // 4
inline constexpr std::string_view kSsmStateSize = "ssm.state_size";        // head_k_dim
inline constexpr std::string_view kSsmGroupCount = "ssm.group_count";      // K heads
inline constexpr std::string_view kSsmTimeStepRank = "ssm.time_step_rank"; // V heads
inline constexpr std::string_view kSsmInnerSize = "ssm.inner_size";        // V heads * head_v_dim
inline constexpr std::string_view kFullAttentionInterval = "full_attention_interval";
// Optional per-layer flags (bool or integer array over block_count): a
// recurrent layer; overrides the interval.
inline constexpr std::string_view kRecurrentLayers = "attention.recurrent_layers";
inline constexpr std::string_view kRopeDimensionSections = "rope.dimension_sections";  // i32[4]
inline constexpr std::string_view kNextnPredictLayers = "nextn_predict_layers";       // MTP blocks in block_count

// Laguna (model-and-format-specs.md §5; llama.cpp's spellings).
inline constexpr std::string_view kLeadingDenseBlockCount = "leading_dense_block_count";
inline constexpr std::string_view kSlidingWindow = "attention.sliding_window";
inline constexpr std::string_view kSlidingWindowPattern = "attention.sliding_window_pattern";  // period, full first
inline constexpr std::string_view kRopeFreqBaseSwa = "rope.freq_base_swa";
inline constexpr std::string_view kRopeDimensionCountSwa = "rope.dimension_count_swa";
inline constexpr std::string_view kRopeScalingType = "rope.scaling.type";  // "yarn"
inline constexpr std::string_view kRopeScalingFactor = "rope.scaling.factor";
inline constexpr std::string_view kRopeScalingOrigCtx = "rope.scaling.original_context_length";
inline constexpr std::string_view kRopeScalingYarnBetaFast = "rope.scaling.yarn_beta_fast";
inline constexpr std::string_view kRopeScalingYarnBetaSlow = "rope.scaling.yarn_beta_slow";
inline constexpr std::string_view kRopeScalingYarnAttnFactor = "rope.scaling.yarn_attn_factor";
inline constexpr std::string_view kExpertWeightsScale = "expert_weights_scale";  // routed sum x this
inline constexpr std::string_view kExpertWeightsNorm = "expert_weights_norm";    // bool
inline constexpr std::string_view kExpertGatingFunc = "expert_gating_func";      // 1 softmax, 2 sigmoid
inline constexpr std::string_view kExpertSharedCount = "expert_shared_count";
inline constexpr std::string_view kVocabSize = "vocab_size";  // laguna writes it (the embedding's rows)
inline constexpr int64_t kExpertGatingSoftmax = 1;
inline constexpr int64_t kExpertGatingSigmoid = 2;

inline std::string arch_key(std::string_view arch, std::string_view suffix) {
  return fmt::format("{}.{}", arch, suffix);
}

// tokenizer.*
inline constexpr std::string_view kTokModel = "tokenizer.ggml.model";
inline constexpr std::string_view kTokPre = "tokenizer.ggml.pre";
inline constexpr std::string_view kTokTokens = "tokenizer.ggml.tokens";
inline constexpr std::string_view kTokTypes = "tokenizer.ggml.token_type";
inline constexpr std::string_view kTokMerges = "tokenizer.ggml.merges";
inline constexpr std::string_view kTokBos = "tokenizer.ggml.bos_token_id";
inline constexpr std::string_view kTokEos = "tokenizer.ggml.eos_token_id";
inline constexpr std::string_view kTokEot = "tokenizer.ggml.eot_token_id";
inline constexpr std::string_view kTokPad = "tokenizer.ggml.padding_token_id";
inline constexpr std::string_view kTokAddBos = "tokenizer.ggml.add_bos_token";
inline constexpr std::string_view kChatTemplate = "tokenizer.chat_template";

// Global tensors.
inline constexpr std::string_view kTokenEmbd = "token_embd.weight";
inline constexpr std::string_view kOutputNorm = "output_norm.weight";
inline constexpr std::string_view kOutput = "output.weight";  // absent: tied to token_embd

// Per-layer tensors: blk(3, kAttnQ) -> "blk.3.attn_q.weight"
inline constexpr std::string_view kAttnNorm = "attn_norm";
inline constexpr std::string_view kAttnQ = "attn_q";
inline constexpr std::string_view kAttnK = "attn_k";
inline constexpr std::string_view kAttnV = "attn_v";
inline constexpr std::string_view kAttnOutput = "attn_output";
inline constexpr std::string_view kAttnQNorm = "attn_q_norm";
inline constexpr std::string_view kAttnKNorm = "attn_k_norm";
inline constexpr std::string_view kFfnNorm = "ffn_norm";
inline constexpr std::string_view kFfnGate = "ffn_gate";  // dense
inline constexpr std::string_view kFfnUp = "ffn_up";
inline constexpr std::string_view kFfnDown = "ffn_down";
inline constexpr std::string_view kFfnGateInp = "ffn_gate_inp";  // router
inline constexpr std::string_view kFfnGateExps = "ffn_gate_exps";
inline constexpr std::string_view kFfnUpExps = "ffn_up_exps";
inline constexpr std::string_view kFfnDownExps = "ffn_down_exps";
// Hybrid Gated DeltaNet models (qwen35moe, qwen35).
inline constexpr std::string_view kPostAttentionNorm = "post_attention_norm";  // their ffn_norm
inline constexpr std::string_view kAttnQkv = "attn_qkv";      // DeltaNet in_proj_qkv
inline constexpr std::string_view kAttnGate = "attn_gate";    // DeltaNet in_proj_z
inline constexpr std::string_view kSsmBeta = "ssm_beta";      // in_proj_b
inline constexpr std::string_view kSsmAlpha = "ssm_alpha";    // in_proj_a
inline constexpr std::string_view kSsmConv1d = "ssm_conv1d";  // {conv_kernel, conv_dim}, f32
inline constexpr std::string_view kSsmDt = "ssm_dt";          // with suffix "bias": dt_bias {n_v}
inline constexpr std::string_view kSsmA = "ssm_a";            // no suffix: -exp(A_log) {n_v}
inline constexpr std::string_view kSsmNorm = "ssm_norm";      // {head_v_dim}, no +1
inline constexpr std::string_view kSsmOut = "ssm_out";        // out_proj
inline constexpr std::string_view kFfnGateInpShexp = "ffn_gate_inp_shexp";  // {n_embd}: shared expert gate
inline constexpr std::string_view kFfnGateShexp = "ffn_gate_shexp";
inline constexpr std::string_view kFfnUpShexp = "ffn_up_shexp";
inline constexpr std::string_view kFfnDownShexp = "ffn_down_shexp";
// Laguna: the attention output gate is attn_gate {n_embd, n_head} (per head)
// or {n_embd, n_head * head_dim} (per element); the router's selection bias:
inline constexpr std::string_view kFfnExpProbsB = "exp_probs_b";  // suffix "bias", {n_expert}

inline std::string blk(int layer, std::string_view tensor, std::string_view suffix = "weight") {
  return suffix.empty() ? fmt::format("blk.{}.{}", layer, tensor) : fmt::format("blk.{}.{}.{}", layer, tensor, suffix);
}

}  // namespace moeserve::keys
