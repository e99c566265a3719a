// Shapes of the synthetic models `moeserve make-model` writes (and that
// benchmarks and tests refer to by name).
//
// qwen3moe / qwen3 (presets tiny, small, 30b-a3b):
//   tiny     fast tests: 2 layers, hidden 256, 4/2 heads of 64, 8 experts top-2
//            (expert FF 256), dense FF 512, vocab 2048, context 2048. Every row
//            length is a multiple of 256 so Q4_K_M uses real K-quants.
//   small    the benchmark model: 16 layers, hidden 1024, 16/4 heads of
//            64, 64 experts top-8, expert FF 512, vocab 151936 (qwen3moe: 1.96 B
//            parameters, 1.14 GiB in Q4_K_M). Dense qwen3 uses FF 3072 (3x
//            hidden, close to Qwen3-0.6B's ratio): 0.50 B parameters.
//   30b-a3b  the real Qwen3-30B-A3B shapes: 48 layers, hidden 2048, 32/4 heads
//            of 128, 128 experts top-8, expert FF 768, vocab 151936, rope theta
//            1e6, eps 1e-6, context 40960. There is no dense "30b-a3b", so for
//            --arch qwen3 the name maps to Qwen3-32B's shapes (64 layers, hidden
//            5120, 64/8 heads of 128, FF 25600, same vocab/rope/context).
//
// qwen35moe / qwen35, the hybrid Gated DeltaNet models of Qwen3.5/3.6 (presets
// tiny, small, and 35b-a3b for qwen35moe, 27b for qwen35). Every
// full_attention_interval-th layer (layers 3, 7, ...) is gated full attention
// with partial RoPE (n_rot of head_dim); the others are Gated DeltaNet. Rope
// theta 1e7, eps 1e-6, conv kernel 4, interval 4 in all of them.
//   tiny     4 layers (layer 3 full attention), hidden 256, attention 4/2 heads
//            of 64, n_rot 16, DeltaNet 2 K / 4 V heads of 64; qwen35moe: 8
//            experts top-2 of FF 256 + a shared expert of FF 256; qwen35: dense
//            FF 512; vocab 2048, context 2048.
//   small    16 layers, hidden 1024, attention 8/2 heads of 128, n_rot 32,
//            DeltaNet 8 K / 16 V heads of 64; qwen35moe: 64 experts top-8 of
//            FF 512 + shared FF 512 (2.01 B parameters, about the size of
//            qwen3moe small); qwen35: dense FF 3072; vocab 151936, context 40960.
//   35b-a3b  qwen35moe only, the real Qwen3.6-35B-A3B shapes: 40 layers, hidden
//            2048, attention 16/2 heads of 256, n_rot 64, DeltaNet 16 K / 32 V
//            heads of 128, 256 experts top-8 of FF 512 + shared FF 512, vocab
//            248320, context 262144.
//   27b      qwen35 only, the real Qwen3.6-27B shapes: 64 layers, hidden 5120,
//            attention 24/4 heads of 256, n_rot 64, DeltaNet 16 K / 48 V heads
//            of 128, FF 17408, vocab 248320, context 262144.
//
// laguna, Poolside Laguna (presets tiny, small, laguna-xs): layer il is full
// attention when il % 4 == 0 (fewer query heads, partial RoPE θ 500000 with
// YaRN), the others sliding-window attention (whole-head RoPE θ 10000); a
// softplus output gate per head; layer 0 has a dense FFN, the others
// sigmoid-routed experts with a selection bias (exp_probs_b), routed weights
// x 2.5, plus an ungated shared expert. rms eps 1e-6, YaRN beta 64 / 1.
//   tiny       4 layers, hidden 256, heads [4, 6, 6, 6] of 64 (2 KV), n_rot
//              32 full / 64 SWA, window 16, YaRN factor 4 over 64 positions,
//              8 experts top-2 of FF 128 + shared FF 128, dense FF 512, vocab
//              2048, context 2048.
//   small      8 layers, hidden 1024, heads [8, 16, 16, 16] x 2 of 128 (4 KV),
//              n_rot 64 / 128, window 128, YaRN 8 over 4096, 64 experts top-8
//              of FF 512 + shared 512, dense FF 2048, vocab 151936, context
//              32768.
//   laguna-xs  the real Laguna-XS.2 shapes: 40 layers, hidden 2048, heads
//              [48, 64, 64, 64] x 10 of 128 (8 KV), n_rot 64 / 128, window 512,
//              YaRN 32 over 4096, 256 experts top-8 of FF 512 + shared 512,
//              dense FF 8192, vocab 100352, context 131072.
//
// Output embeddings are untied (output.weight present) in every preset, as in
// the real models.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace moeserve::convert {

enum class ModelArch { kQwen3Moe, kQwen3, kQwen35Moe, kQwen35, kLaguna };

std::string_view arch_name(ModelArch arch);  // the general.architecture value
std::optional<ModelArch> arch_from_name(std::string_view name);
inline constexpr std::string_view kArchNames = "qwen3moe, qwen3, qwen35moe, qwen35, laguna";

// Hyperparameters in the units the GGUF keys use.
struct ModelShape {
  ModelArch arch = ModelArch::kQwen3Moe;
  std::string preset;      // "tiny", "small", "30b-a3b", "35b-a3b", "27b", "laguna-xs"
  std::string model_name;  // general.name, e.g. "moeserve-synthetic-qwen3moe-small"
  int64_t n_layer = 0;
  int64_t n_embd = 0;
  int64_t n_head = 0;  // laguna: the full-attention layers' (n_head_layer)
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;
  // Rotated dimensions of each head (rope.dimension_count); 0 means head_dim
  // (qwen3, qwen3moe). The hybrid models rotate a quarter of the head.
  int64_t n_rot = 0;
  // Dense FFN width. qwen3moe files carry it too, as feed_forward_length (the
  // intermediate_size of Qwen3-30B-A3B's config, 6144); MoE layers ignore it.
  // qwen35moe writes the shared expert's width there (its only dense FFN).
  int64_t n_ff = 0;
  int64_t n_expert = 0;  // 0 for dense models
  int64_t n_expert_used = 0;
  int64_t n_ff_exp = 0;      // per-expert FFN width
  int64_t n_ff_shexp = 0;    // shared expert FFN width (qwen35moe)
  int64_t n_vocab = 0;
  int64_t n_ctx = 0;
  double rope_theta = 1e6;
  double rms_eps = 1e-6;
  // Gated DeltaNet (qwen35moe, qwen35); 0 elsewhere.
  int64_t ssm_conv_kernel = 0;          // ssm.conv_kernel
  int64_t ssm_n_k_heads = 0;            // ssm.group_count
  int64_t ssm_n_v_heads = 0;            // ssm.time_step_rank
  int64_t ssm_head_k_dim = 0;           // ssm.state_size
  int64_t ssm_head_v_dim = 0;           // ssm.inner_size / ssm.time_step_rank
  int64_t full_attention_interval = 0;  // layer il is full attention when (il + 1) % interval == 0
  // Laguna; 0 elsewhere.
  int64_t n_head_swa = 0;      // query heads of the sliding-window layers
  int64_t sliding_window = 0;  // attention.sliding_window
  int64_t swa_period = 0;      // layer il is full attention iff il % swa_period == 0
  int64_t n_rot_swa = 0;       // rope.dimension_count_swa
  double rope_theta_swa = 0;   // rope.freq_base_swa
  double yarn_factor = 0;      // full layers' YaRN (rope.scaling.*); 0: none
  int64_t yarn_orig_ctx = 0;
  double yarn_beta_fast = 0, yarn_beta_slow = 0;
  int64_t n_dense_lead = 0;  // leading_dense_block_count (dense FFN of n_ff)
  double expert_weights_scale = 1.0;

  bool is_hybrid() const { return arch == ModelArch::kQwen35Moe || arch == ModelArch::kQwen35; }
  bool is_laguna() const { return arch == ModelArch::kLaguna; }
  bool is_moe() const { return arch == ModelArch::kQwen3Moe || arch == ModelArch::kQwen35Moe || is_laguna(); }
  bool has_shared_expert() const { return arch == ModelArch::kQwen35Moe || is_laguna(); }
  // Laguna: a sliding-window layer (else full attention).
  bool is_sliding_layer(int64_t il) const { return is_laguna() && swa_period > 0 && il % swa_period != 0; }
  // Query heads of layer il (laguna's differ between full and sliding layers).
  int64_t n_head_layer(int64_t il) const { return is_sliding_layer(il) ? n_head_swa : n_head; }
  // Laguna: layer il has the dense FFN (else the experts).
  bool is_dense_layer(int64_t il) const { return il < n_dense_lead; }
  // Every layer of qwen3/qwen3moe; every interval-th layer of the hybrids.
  bool is_full_attention_layer(int64_t il) const {
    return !is_hybrid() || (full_attention_interval > 0 && (il + 1) % full_attention_interval == 0);
  }
  int64_t rope_dim() const { return n_rot > 0 ? n_rot : head_dim; }  // rope.dimension_count
  int64_t q_dim() const { return n_head * head_dim; }
  int64_t kv_dim() const { return n_head_kv * head_dim; }
  // DeltaNet: channels of attn_qkv / the conv ([q | k | v]) and the value width.
  int64_t conv_dim() const { return 2 * ssm_n_k_heads * ssm_head_k_dim + ssm_n_v_heads * ssm_head_v_dim; }
  int64_t ssm_inner_size() const { return ssm_n_v_heads * ssm_head_v_dim; }
  // rope.dimension_sections of the hybrids: [11, 11, 10, 0] for n_rot 64, else
  // [s, s, n_rot/2 - 2s, 0] with s = floor(n_rot/2 * 11/32).
  std::vector<int32_t> rope_sections() const;
  // Weights of every tensor (norms included).
  int64_t n_params() const;
};

// Every preset name of any architecture.
inline constexpr std::string_view kPresetNames = "tiny, small, 30b-a3b, 35b-a3b, 27b, laguna-xs";
const std::vector<std::string>& preset_names();
// The presets of one architecture: tiny, small, and 30b-a3b (qwen3moe, qwen3),
// 35b-a3b (qwen35moe), 27b (qwen35) or laguna-xs (laguna).
const std::vector<std::string>& preset_names(ModelArch arch);
std::string preset_names_string(ModelArch arch);  // "tiny, small, 30b-a3b"

// kInvalidArgument naming the preset and listing the known ones when unknown,
// or the architecture's when it is another architecture's preset.
Result<ModelShape> model_preset(ModelArch arch, std::string_view preset);

}  // namespace moeserve::convert
