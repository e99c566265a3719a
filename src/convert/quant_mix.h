// Which type each tensor gets when a model is written as a "file type"
// (llama.cpp's general.file_type): a pure function of the tensor's name,
// shape and the model's layer/expert counts, shared by convert and quantize.
//
// The K-quant mixes follow model-and-format-specs.md §4 (llama.cpp's Q4_K_M):
//  - 1-D tensors (norms, ssm_a, ssm_dt.bias, ffn_gate_inp_shexp), ffn_gate_inp
//    (router) and ssm_conv1d (the DeltaNet conv: {4, conv_dim}, applied element
//    by element, as llama.cpp keeps it) are never quantized: F32, in every
//    file type.
//  - output.weight, and token_embd.weight when it doubles as the output
//    (tied, no output.weight), -> Q6_K (Q8_0 for the q8_0 type).
//  - attn_v and any ffn_down* (incl. _exps) -> Q6_K when
//    use_more_bits(layer, n_layer) (layer parsed from "blk.N."), else the
//    default. For models with exactly 8 experts attn_v -> Q8_0 (as in §4).
//  - everything else (token_embd when untied included) -> the default type
//    (Q4_K for q4_k_m, Q5_K for q5_k_m, Q6_K for q6_k, Q4_0, Q8_0).
//  - Fallback when ne[0] is not a multiple of 256 for a K-quant: Q8_0 (we do
//    not implement llama.cpp's Q5_0/Q5_1); when ne[0] is not a multiple of 32
//    either: F16.
// Float file types (f32/f16/bf16) store every 2-D+ weight in that type,
// except ffn_gate_inp and ssm_conv1d, which stay F32 like the norms.
// The hybrid models' other matrices follow the rules above: ffn_down_shexp like
// ffn_down; attn_qkv, attn_gate, ssm_alpha/beta, ssm_out and the shared
// expert's gate/up the default type. Laguna's likewise: its output gate
// attn_gate {n_embd, n_head} takes the default type like attn_q, the shared
// expert as qwen35moe's, and the router's selection bias exp_probs_b.bias
// (1-D) stays F32.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "tensor/dtype.h"

namespace moeserve::convert {

// llama.cpp's llama_ftype values (general.file_type); do not renumber.
enum class FileType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ8_0 = 7,
  kQ4_K_M = 15,
  kQ5_K_M = 17,
  kQ6_K = 18,
  kBF16 = 32,
};

// "q4_k_m" etc. (case-insensitive); nullopt for a name we do not implement.
std::optional<FileType> file_type_from_name(std::string_view name);
std::string_view file_type_name(FileType type);
// "f32, f16, bf16, q8_0, q4_0, q4_k_m, q5_k_m, q6_k" for help and errors.
std::string supported_file_type_names();
bool file_type_is_quantized(FileType type);

struct TensorTypeQuery {
  std::string_view name;         // GGUF name: "blk.3.ffn_down_exps.weight"
  std::span<const int64_t> ne;   // GGUF ne order
  int n_layer = 0;               // block_count
  int n_expert = 0;              // expert_count (0 for dense models)
  bool output_is_tied = false;   // no output.weight: token_embd is the output too
};

// use_more_bits(i, n) of §4: the first and last eighth of the layers, and
// every third layer in between.
bool use_more_bits(int layer, int n_layer);

// The type a tensor is stored as in a file of `file_type`.
DType choose_tensor_type(FileType file_type, const TensorTypeQuery& query);

}  // namespace moeserve::convert
