// Shapes of the synthetic models `moeserve make-model` writes (and that
// benchmarks and tests refer to by name).
//
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
// Output embeddings are untied (output.weight present) in every preset, as in
// Qwen3-30B-A3B and Qwen3-32B.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace moeserve::convert {

enum class ModelArch { kQwen3Moe, kQwen3 };

std::string_view arch_name(ModelArch arch);  // the general.architecture value
std::optional<ModelArch> arch_from_name(std::string_view name);
inline constexpr std::string_view kArchNames = "qwen3moe, qwen3";

// Hyperparameters in the units the GGUF keys use.
struct ModelShape {
  ModelArch arch = ModelArch::kQwen3Moe;
  std::string preset;  // "tiny", "small", "30b-a3b"
  std::string model_name;  // general.name, e.g. "moeserve-synthetic-qwen3moe-small"
  int64_t n_layer = 0;
  int64_t n_embd = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;
  // Dense FFN width. qwen3moe files carry it too, as feed_forward_length (the
  // intermediate_size of Qwen3-30B-A3B's config, 6144); MoE layers ignore it.
  int64_t n_ff = 0;
  int64_t n_expert = 0;      // 0 for qwen3
  int64_t n_expert_used = 0;
  int64_t n_ff_exp = 0;      // per-expert FFN width
  int64_t n_vocab = 0;
  int64_t n_ctx = 0;
  double rope_theta = 1e6;
  double rms_eps = 1e-6;

  bool is_moe() const { return arch == ModelArch::kQwen3Moe; }
  int64_t q_dim() const { return n_head * head_dim; }
  int64_t kv_dim() const { return n_head_kv * head_dim; }
  // Weights of every tensor (norms included).
  int64_t n_params() const;
};

inline constexpr std::string_view kPresetNames = "tiny, small, 30b-a3b";
const std::vector<std::string>& preset_names();

// kInvalidArgument naming the preset and listing the known ones when unknown.
Result<ModelShape> model_preset(ModelArch arch, std::string_view preset);

}  // namespace moeserve::convert
