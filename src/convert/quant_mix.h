// Which type each tensor gets when a model is written as a "file type"
// (llama.cpp's general.file_type): a pure function of the tensor's name,
// shape and the model's layer/expert counts, shared by convert and quantize.
//
// The quantized mixes make llama.cpp's per-tensor choices (its
// llama_tensor_get_type in the release node-llama-cpp 3.22.1 pins, for the
// types implemented here; see model-and-format-specs.md §4), reimplemented
// from its rules:
//  - 1-D tensors (norms, ssm_a, ssm_dt.bias, ffn_gate_inp_shexp), ffn_gate_inp
//    (router) and ssm_conv1d (the DeltaNet conv: {4, conv_dim}, applied element
//    by element, as llama.cpp keeps it) are never quantized: F32, in every
//    file type.
//  - output.weight, and token_embd.weight when it doubles as the output
//    (tied, no output.weight): Q6_K, or Q8_0 for q8_0, mxfp4_moe and rows
//    that the default type's block does not divide.
//  - attention values (attn_v, and as llama.cpp counts them attn_qkv — a
//    DeltaNet layer's input projection too — and attn_kv_b) by the file
//    type: q2_k Q4_K (GQA >= 4) or Q3_K; q2_k_s Q4_K with GQA >= 4; q3_k_m
//    Q5_K for the first two such tensors, then Q4_K; q3_k_l Q5_K;
//    iq4_nl/iq4_xs Q5_K with GQA >= 4; q4_k_m/q5_k_m Q6_K when
//    use_more_bits(i, n) (i: the tensor's index among the file's attention
//    values, n: their count); q4_k_s Q5_K for the first four; then Q8_0
//    whenever the model has exactly 8 experts (also attn_k).
//  - ffn_down* by layer: q2_k Q3_K; q2_k_s Q4_K in the first eighth; q3_k_m
//    Q5_K in the first sixteenth, else Q4_K; q3_k_l Q5_K; q4_k_m/q5_k_m Q6_K
//    when use_more_bits(layer, n_layer); iq4_nl/iq4_xs Q5_K in the first
//    eighth; q4_k_s Q5_K in the first eighth.
//  - attn_output: with exactly 8 experts Q5_K for q2_k, q3_k_s, q3_k_m,
//    q4_k_s, q4_k_m, iq4_nl and iq4_xs; otherwise q2_k Q3_K, q3_k_m Q4_K,
//    q3_k_l Q5_K.
//  - mxfp4_moe: expert stacks (ne[2] > 1) MXFP4, every other matrix Q8_0.
//  - the i-quant mixes (iq1_s, iq1_m, iq2_xxs, iq2_xs, iq2_s (IQ2_XS), iq2_m
//    (IQ2_S), iq3_xxs, iq3_xs, iq3_s, iq3_m (IQ3_S); quant_mix_iquants.cpp):
//    the output Q5_K for iq1_*, iq2_* and iq3_xxs (Q6_K for the rest); an
//    untied token_embd Q2_K (iq1_*, iq2_xxs, iq2_xs) or IQ3_S (iq2_s, iq2_m,
//    iq3_xxs); iq1_* and iq2_*: attn_v Q4_K with GQA >= 4 or >= 4 experts,
//    else Q2_K (IQ3_S for iq2_s/m); attn_k Q4_K with 8 experts; ffn_down in
//    the first eighth Q2_K (IQ3_S); attn_output Q5_K with 8 experts, else
//    IQ2_XXS for iq1_*, IQ3_S for iq2_s/m.
//    iq3_*: attn_v Q4_K with GQA >= 4 (iq3_xxs without an imatrix IQ3_S;
//    iq3_m always Q4_K), Q8_0 with 8 experts; attn_k/attn_q IQ2_S for
//    iq3_xxs, IQ3_XXS for iq3_xs; ffn_down for iq3_xxs without an imatrix
//    Q4_K in the first eighth, else Q3_K, for iq3_m Q4_K in the first eighth
//    (with 8 experts also where use_more_bits); attn_output Q5_K with 8
//    experts, else IQ3_S (iq3_xxs), Q4_K (iq3_m); ffn_gate/up IQ3_XXS for
//    iq3_xs in the middle three quarters of the layers. Rows of the
//    i-quants that 256 does not divide fall back to IQ4_NL.
//  - everything else (token_embd when untied included) -> the default type.
//  - Rows the chosen type's block does not divide fall back as llama.cpp's
//    do: Q2_K, Q3_K -> Q4_0; IQ4_XS -> IQ4_NL; Q4_K -> Q5_0; Q5_K -> Q5_1;
//    Q6_K -> Q8_0; and to F16 when even 32 does not divide them.
// Float file types (f32/f16/bf16) store every 2-D+ weight in that type,
// except ffn_gate_inp and ssm_conv1d, which stay F32 like the norms.
// The hybrid models' other matrices follow the rules above: ffn_down_shexp like
// ffn_down; attn_gate, ssm_alpha/beta, ssm_out and the shared expert's
// gate/up the default type. Laguna's likewise: its output gate attn_gate
// {n_embd, n_head} takes the default type like attn_q, the shared expert
// as qwen35moe's, and the router's selection bias exp_probs_b.bias (1-D)
// stays F32.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tensor/dtype.h"

namespace moeserve::convert {

// llama.cpp's llama_ftype values (general.file_type); do not renumber.
enum class FileType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ8_0 = 7,
  kQ5_0 = 8,
  kQ5_1 = 9,
  kQ2_K = 10,
  kQ3_K_S = 11,
  kQ3_K_M = 12,
  kQ3_K_L = 13,
  kQ4_K_S = 14,
  kQ4_K_M = 15,
  kQ5_K_S = 16,
  kQ5_K_M = 17,
  kQ6_K = 18,
  kQ2_K_S = 21,
  kIQ2_XXS = 19,
  kIQ2_XS = 20,
  kIQ3_XS = 22,
  kIQ3_XXS = 23,
  kIQ1_S = 24,
  kIQ4_NL = 25,
  kIQ3_S = 26,
  kIQ3_M = 27,
  kIQ2_S = 28,
  kIQ2_M = 29,
  kIQ4_XS = 30,
  kIQ1_M = 31,
  kBF16 = 32,
  kMXFP4_MOE = 38,
};

// "q4_k_m" etc. (case-insensitive); nullopt for a name we do not implement.
std::optional<FileType> file_type_from_name(std::string_view name);
std::string_view file_type_name(FileType type);
// "f32, f16, bf16, q8_0, q4_0, ..." for help and errors.
std::string supported_file_type_names();
bool file_type_is_quantized(FileType type);

struct TensorTypeQuery {
  std::string_view name;        // GGUF name: "blk.3.ffn_down_exps.weight"
  std::span<const int64_t> ne;  // GGUF ne order
  int n_layer = 0;              // block_count
  int n_expert = 0;             // expert_count (0 for dense models)
  bool output_is_tied = false;  // no output.weight: token_embd is the output too
  int n_gqa = 0;                // attention heads per KV head (0: unknown, taken as 1)
  // An attention value's index among the file's attention values (attn_v,
  // attn_qkv, attn_kv_b) and their count (AttentionTensorIndex); -1 / 0:
  // the layer and n_layer stand in.
  int attn_v_index = -1;
  int n_attention_wv = 0;
  bool has_imatrix = false;  // quantized with an importance matrix (iq3_xxs's choices depend on it)
};

// The attention values' indices and count of a file's tensors (in file
// order), for TensorTypeQuery.
class AttentionTensorIndex {
 public:
  explicit AttentionTensorIndex(std::span<const std::string_view> names);
  // The query's attn_v_index for tensor i (-1 for other tensors).
  int attn_v_index(size_t i) const { return i < index_.size() ? index_[i] : -1; }
  int n_attention_wv() const { return n_attention_wv_; }

 private:
  std::vector<int> index_;
  int n_attention_wv_ = 0;
};

// use_more_bits(i, n) of §4: the first and last eighth of the layers, and
// every third layer in between.
bool use_more_bits(int layer, int n_layer);

// The type a tensor is stored as in a file of `file_type`.
DType choose_tensor_type(FileType file_type, const TensorTypeQuery& query);

}  // namespace moeserve::convert
