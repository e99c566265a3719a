// Hyperparameters of the Qwen3 family (qwen3moe, qwen3) read from GGUF
// metadata ({arch}.* keys, model-and-format-specs.md §1) and validated, so the
// forward pass can trust every size it is given.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"
#include "format/gguf.h"

namespace moeserve::models {

enum class Qwen3Arch { kQwen3Moe, kQwen3 };

// "qwen3moe, qwen3": for "unsupported architecture" messages.
std::string_view supported_architectures();

struct Qwen3HParams {
  Qwen3Arch arch = Qwen3Arch::kQwen3Moe;
  std::string arch_name;        // "qwen3moe" / "qwen3"
  int64_t n_ctx_train = 0;      // context_length
  int64_t n_embd = 0;           // embedding_length
  int64_t n_layer = 0;          // block_count
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;         // key_length (default n_embd / n_head)
  int64_t head_dim_v = 0;       // value_length (default head_dim; must equal it)
  int64_t n_rot = 0;            // rope.dimension_count (default head_dim)
  double rope_freq_base = 10000.0;
  float rms_eps = 1e-6f;
  int64_t n_ff = 0;             // dense FFN width (qwen3)
  int64_t n_expert = 0;         // qwen3moe only
  int64_t n_expert_used = 0;
  int64_t n_ff_exp = 0;
  int64_t n_vocab = 0;          // rows of token_embd (filled by the weight loader)

  bool is_moe() const { return arch == Qwen3Arch::kQwen3Moe; }
  int64_t q_dim() const { return n_head * head_dim; }
  int64_t kv_dim() const { return n_head_kv * head_dim; }
};

// Reads and validates. Errors name the file and the key (missing, wrong type,
// out of range or inconsistent with another key).
Result<Qwen3HParams> load_qwen3_hparams(const GgufFile& file);

}  // namespace moeserve::models
