#include <gtest/gtest.h>

#include <vector>

#include "convert/quant_mix.h"

namespace moeserve::convert {
namespace {

struct MixCase {
  FileType file_type;
  const char* name;
  std::vector<int64_t> ne;
  int n_layer;
  int n_expert;
  bool tied;
  DType want;
};

TEST(QuantMix, FollowsTheSpecTable) {
  const FileType M = FileType::kQ4_K_M;
  // Qwen3-30B-A3B shapes: 48 layers, 128 experts; use_more_bits(i, 48) is
  // true for i < 6, i >= 42 and i = 8, 11, 14, ...
  const std::vector<MixCase> cases = {
      {M, "blk.0.attn_norm.weight", {2048}, 48, 128, false, DType::F32},
      {M, "blk.0.attn_q_norm.weight", {128}, 48, 128, false, DType::F32},
      {M, "blk.0.ffn_gate_inp.weight", {2048, 128}, 48, 128, false, DType::F32},
      {M, "output.weight", {2048, 151936}, 48, 128, false, DType::Q6_K},
      {M, "token_embd.weight", {2048, 151936}, 48, 128, false, DType::Q4_K},
      {M, "token_embd.weight", {2048, 151936}, 48, 128, true, DType::Q6_K},
      {M, "blk.0.attn_v.weight", {2048, 512}, 48, 128, false, DType::Q6_K},
      {M, "blk.7.attn_v.weight", {2048, 512}, 48, 128, false, DType::Q4_K},
      {M, "blk.8.attn_v.weight", {2048, 512}, 48, 128, false, DType::Q6_K},
      {M, "blk.42.attn_v.weight", {2048, 512}, 48, 128, false, DType::Q6_K},
      {M, "blk.47.ffn_down_exps.weight", {768, 2048, 128}, 48, 128, false, DType::Q6_K},
      {M, "blk.10.ffn_down_exps.weight", {768, 2048, 128}, 48, 128, false, DType::Q4_K},
      {M, "blk.11.ffn_down_exps.weight", {768, 2048, 128}, 48, 128, false, DType::Q6_K},
      {M, "blk.11.ffn_down.weight", {3072, 1024}, 48, 0, false, DType::Q6_K},
      {M, "blk.11.ffn_gate_exps.weight", {2048, 768, 128}, 48, 128, false, DType::Q4_K},
      {M, "blk.11.ffn_up_exps.weight", {2048, 768, 128}, 48, 128, false, DType::Q4_K},
      {M, "blk.0.attn_q.weight", {2048, 4096}, 48, 128, false, DType::Q4_K},
      {M, "blk.0.attn_k.weight", {2048, 512}, 48, 128, false, DType::Q4_K},
      {M, "blk.0.attn_output.weight", {4096, 2048}, 48, 128, false, DType::Q4_K},
      // 8-expert models: attn_v -> Q8_0 in every layer.
      {M, "blk.7.attn_v.weight", {2048, 512}, 48, 8, false, DType::Q8_0},
      {M, "blk.0.attn_v.weight", {2048, 512}, 48, 8, false, DType::Q8_0},
      // Fallbacks for rows that are not a multiple of 256 (or 32).
      {M, "blk.7.attn_q.weight", {96, 64}, 48, 0, false, DType::Q5_0},  // llama.cpp's Q4_K fallback
      {M, "output.weight", {96, 64}, 48, 0, false, DType::Q8_0},
      {M, "blk.7.attn_q.weight", {100, 64}, 48, 0, false, DType::F16},
      // Other file types.
      {FileType::kQ8_0, "blk.0.attn_q.weight", {2048, 4096}, 48, 128, false, DType::Q8_0},
      {FileType::kQ8_0, "output.weight", {2048, 4096}, 48, 128, false, DType::Q8_0},
      {FileType::kQ8_0, "blk.0.ffn_gate_inp.weight", {2048, 128}, 48, 128, false, DType::F32},
      {FileType::kQ4_0, "blk.0.attn_q.weight", {2048, 4096}, 48, 128, false, DType::Q4_0},
      {FileType::kQ4_0, "output.weight", {2048, 4096}, 48, 128, false, DType::Q6_K},
      {FileType::kQ6_K, "blk.3.ffn_down_exps.weight", {768, 2048, 128}, 48, 128, false, DType::Q6_K},
      {FileType::kQ6_K, "blk.0.attn_v.weight", {2048, 512}, 48, 8, false, DType::Q8_0},  // 8 experts: every
                                                                                         // type
      {FileType::kQ5_K_M, "blk.10.ffn_down_exps.weight", {768, 2048, 128}, 48, 128, false, DType::Q5_K},
      {FileType::kQ5_K_M, "blk.0.ffn_down_exps.weight", {768, 2048, 128}, 48, 128, false, DType::Q6_K},
      {FileType::kF16, "blk.0.attn_q.weight", {2048, 4096}, 48, 128, false, DType::F16},
      {FileType::kF16, "output.weight", {2048, 4096}, 48, 128, false, DType::F16},
      {FileType::kF16, "blk.0.ffn_gate_inp.weight", {2048, 128}, 48, 128, false, DType::F32},
      {FileType::kBF16, "blk.0.ffn_down_exps.weight", {768, 2048, 128}, 48, 128, false, DType::BF16},
      {FileType::kBF16, "output_norm.weight", {2048}, 48, 128, false, DType::F32},
      {FileType::kF32, "blk.0.attn_q.weight", {2048, 4096}, 48, 128, false, DType::F32},
      {M, "blk.0.attn_norm.weight", {2048, 1}, 48, 0, false, DType::F32},  // {H, 1} is a vector
  };
  for (const MixCase& c : cases) {
    const DType got = choose_tensor_type(c.file_type, {c.name, c.ne, c.n_layer, c.n_expert, c.tied});
    EXPECT_EQ(got, c.want) << file_type_name(c.file_type) << " " << c.name << " n_expert=" << c.n_expert
                           << " tied=" << c.tied << ": got " << dtype_name(got) << ", want "
                           << dtype_name(c.want);
  }
}

// The hybrid Gated DeltaNet tensors (qwen35moe / qwen35), Qwen3.6-35B-A3B
// shapes: 40 layers, 256 experts; use_more_bits(i, 40) is true for i < 5,
// i >= 35 and i = 7, 10, 13, ...
TEST(QuantMix, HybridTensors) {
  const FileType M = FileType::kQ4_K_M;
  const std::vector<MixCase> cases = {
      // ssm_conv1d: 2-D but tiny and applied element-wise, F32 in every file type.
      {M, "blk.0.ssm_conv1d.weight", {4, 8192}, 40, 256, false, DType::F32},
      {FileType::kQ8_0, "blk.0.ssm_conv1d.weight", {4, 8192}, 40, 256, false, DType::F32},
      {FileType::kQ4_0, "blk.1.ssm_conv1d.weight", {4, 8192}, 40, 256, false, DType::F32},
      {FileType::kQ6_K, "blk.1.ssm_conv1d.weight", {4, 8192}, 40, 256, false, DType::F32},
      {FileType::kBF16, "blk.1.ssm_conv1d.weight", {4, 8192}, 40, 256, false, DType::F32},
      {FileType::kF16, "blk.1.ssm_conv1d.weight", {4, 8192}, 40, 256, false, DType::F32},
      // 1-D: F32.
      {M, "blk.0.ssm_a", {32}, 40, 256, false, DType::F32},
      {M, "blk.0.ssm_dt.bias", {32}, 40, 256, false, DType::F32},
      {M, "blk.0.ssm_norm.weight", {128}, 40, 256, false, DType::F32},
      {M, "blk.0.post_attention_norm.weight", {2048}, 40, 256, false, DType::F32},
      {M, "blk.0.ffn_gate_inp_shexp.weight", {2048}, 40, 256, false, DType::F32},
      {FileType::kBF16, "blk.0.ffn_gate_inp_shexp.weight", {2048}, 40, 256, false, DType::F32},
      {FileType::kF16, "blk.0.ssm_a", {32}, 40, 256, false, DType::F32},
      // Matrices: the default type; ffn_down_shexp like ffn_down.
      // attn_qkv (the DeltaNet input projection) counts as an attention value
      // in llama.cpp's quantizer: use_more_bits(0, 40) without an index.
      {M, "blk.0.attn_qkv.weight", {2048, 8192}, 40, 256, false, DType::Q6_K},
      {M, "blk.5.attn_qkv.weight", {2048, 8192}, 40, 256, false, DType::Q4_K},
      {M, "blk.0.attn_gate.weight", {2048, 4096}, 40, 256, false, DType::Q4_K},
      {M, "blk.0.ssm_alpha.weight", {2048, 32}, 40, 256, false, DType::Q4_K},
      {M, "blk.0.ssm_beta.weight", {2048, 32}, 40, 256, false, DType::Q4_K},
      {M, "blk.0.ssm_out.weight", {4096, 2048}, 40, 256, false, DType::Q4_K},
      {M, "blk.5.ffn_gate_shexp.weight", {2048, 512}, 40, 256, false, DType::Q4_K},
      {M, "blk.5.ffn_up_shexp.weight", {2048, 512}, 40, 256, false, DType::Q4_K},
      {M, "blk.0.ffn_down_shexp.weight", {512, 2048}, 40, 256, false, DType::Q6_K},
      {M, "blk.5.ffn_down_shexp.weight", {512, 2048}, 40, 256, false, DType::Q4_K},
      {M, "blk.7.ffn_down_shexp.weight", {512, 2048}, 40, 256, false, DType::Q6_K},
      {M, "blk.39.ffn_down_shexp.weight", {512, 2048}, 40, 256, false, DType::Q6_K},
      {M, "blk.39.ffn_down_exps.weight", {512, 2048, 256}, 40, 256, false, DType::Q6_K},
      {FileType::kQ5_K_M, "blk.5.ffn_down_shexp.weight", {512, 2048}, 40, 256, false, DType::Q5_K},
      {FileType::kQ5_K_M, "blk.7.ffn_down_shexp.weight", {512, 2048}, 40, 256, false, DType::Q6_K},
      {FileType::kQ8_0, "blk.0.ssm_out.weight", {4096, 2048}, 40, 256, false, DType::Q8_0},
      {FileType::kBF16, "blk.0.attn_qkv.weight", {2048, 8192}, 40, 256, false, DType::BF16},
      // Gated attention: attn_q {H, 2 q_dim}; attn_v by the layer rule.
      {M, "blk.3.attn_q.weight", {2048, 8192}, 40, 256, false, DType::Q4_K},
      {M, "blk.3.attn_v.weight", {2048, 512}, 40, 256, false, DType::Q6_K},
      {M, "blk.11.attn_v.weight", {2048, 512}, 40, 256, false, DType::Q4_K},
      {M, "blk.3.attn_v.weight", {256, 128}, 4, 8, false, DType::Q8_0},  // the tiny preset: 8 experts
  };
  for (const MixCase& c : cases) {
    const DType got = choose_tensor_type(c.file_type, {c.name, c.ne, c.n_layer, c.n_expert, c.tied});
    EXPECT_EQ(got, c.want) << file_type_name(c.file_type) << " " << c.name << ": got " << dtype_name(got)
                           << ", want " << dtype_name(c.want);
  }
}

TEST(QuantMix, UseMoreBits) {
  std::vector<int> more;
  for (int i = 0; i < 48; ++i) {
    if (use_more_bits(i, 48)) more.push_back(i);
  }
  const std::vector<int> want = {0,  1,  2,  3,  4,  5,  8,  11, 14, 17, 20, 23,
                                 26, 29, 32, 35, 38, 41, 42, 43, 44, 45, 46, 47};
  EXPECT_EQ(more, want);
}

TEST(QuantMix, FileTypeNamesAndLlamaIds) {
  EXPECT_EQ(file_type_from_name("Q4_K_M"), FileType::kQ4_K_M);
  EXPECT_EQ(file_type_from_name("bf16"), FileType::kBF16);
  EXPECT_EQ(file_type_from_name("q2_k"), FileType::kQ2_K);
  EXPECT_EQ(file_type_from_name("Q3_K"), FileType::kQ3_K_M);  // llama-quantize's alias
  EXPECT_EQ(file_type_from_name("IQ2_XXS"), FileType::kIQ2_XXS);
  EXPECT_EQ(file_type_from_name("iq1_m"), FileType::kIQ1_M);
  EXPECT_EQ(file_type_from_name("iq4_ks"), std::nullopt);  // ik_llama.cpp's, not llama.cpp's
  EXPECT_EQ(file_type_from_name(""), std::nullopt);
  // llama_ftype values written to general.file_type.
  EXPECT_EQ(uint32_t(FileType::kF32), 0u);
  EXPECT_EQ(uint32_t(FileType::kF16), 1u);
  EXPECT_EQ(uint32_t(FileType::kQ4_0), 2u);
  EXPECT_EQ(uint32_t(FileType::kQ8_0), 7u);
  EXPECT_EQ(uint32_t(FileType::kQ4_K_M), 15u);
  EXPECT_EQ(uint32_t(FileType::kQ5_K_M), 17u);
  EXPECT_EQ(uint32_t(FileType::kQ6_K), 18u);
  EXPECT_EQ(uint32_t(FileType::kBF16), 32u);
  EXPECT_EQ(uint32_t(FileType::kQ4_1), 3u);
  EXPECT_EQ(uint32_t(FileType::kQ5_0), 8u);
  EXPECT_EQ(uint32_t(FileType::kQ5_1), 9u);
  EXPECT_EQ(uint32_t(FileType::kQ2_K), 10u);
  EXPECT_EQ(uint32_t(FileType::kQ3_K_S), 11u);
  EXPECT_EQ(uint32_t(FileType::kQ3_K_M), 12u);
  EXPECT_EQ(uint32_t(FileType::kQ3_K_L), 13u);
  EXPECT_EQ(uint32_t(FileType::kQ4_K_S), 14u);
  EXPECT_EQ(uint32_t(FileType::kQ5_K_S), 16u);
  EXPECT_EQ(uint32_t(FileType::kQ2_K_S), 21u);
  EXPECT_EQ(uint32_t(FileType::kIQ4_NL), 25u);
  EXPECT_EQ(uint32_t(FileType::kIQ4_XS), 30u);
  EXPECT_EQ(uint32_t(FileType::kMXFP4_MOE), 38u);
  EXPECT_EQ(uint32_t(FileType::kIQ2_XXS), 19u);
  EXPECT_EQ(uint32_t(FileType::kIQ2_XS), 20u);
  EXPECT_EQ(uint32_t(FileType::kIQ3_XS), 22u);
  EXPECT_EQ(uint32_t(FileType::kIQ3_XXS), 23u);
  EXPECT_EQ(uint32_t(FileType::kIQ3_S), 26u);
  EXPECT_EQ(uint32_t(FileType::kIQ3_M), 27u);
  EXPECT_EQ(uint32_t(FileType::kIQ2_S), 28u);
  EXPECT_EQ(uint32_t(FileType::kIQ2_M), 29u);
  EXPECT_EQ(uint32_t(FileType::kIQ1_S), 24u);
  EXPECT_EQ(uint32_t(FileType::kIQ1_M), 31u);
  EXPECT_TRUE(file_type_is_quantized(FileType::kQ4_0));
  EXPECT_FALSE(file_type_is_quantized(FileType::kBF16));
  EXPECT_NE(supported_file_type_names().find("q4_k_m"), std::string::npos);
}

// The low-bit mixes (llama.cpp's rules) on Qwen3-30B-A3B shapes: 48
// layers, 128 experts, 32 query heads over 4 KV heads (GQA 8).
TEST(QuantMix, LowBitMixesOnQwen3Moe) {
  struct Case {
    FileType file_type;
    const char* name;
    std::vector<int64_t> ne;
    int attn_v_index;
    DType want;
  };
  const std::vector<int64_t> v{2048, 512}, down{768, 2048, 128}, o{4096, 2048}, q{2048, 4096};
  const std::vector<Case> cases = {
      {FileType::kQ2_K, "blk.20.attn_q.weight", q, -1, DType::Q2_K},
      {FileType::kQ2_K, "blk.20.attn_v.weight", v, 20, DType::Q4_K},  // GQA >= 4
      {FileType::kQ2_K, "blk.20.ffn_down_exps.weight", down, -1, DType::Q3_K},
      {FileType::kQ2_K, "blk.20.attn_output.weight", o, -1, DType::Q3_K},
      {FileType::kQ2_K, "output.weight", {2048, 151936}, -1, DType::Q6_K},
      {FileType::kQ2_K_S, "blk.2.ffn_down_exps.weight", down, -1, DType::Q4_K},
      {FileType::kQ2_K_S, "blk.6.ffn_down_exps.weight", down, -1, DType::Q2_K},
      {FileType::kQ3_K_S, "blk.2.ffn_down_exps.weight", down, -1, DType::Q3_K},
      {FileType::kQ3_K_S, "blk.2.attn_v.weight", v, 2, DType::Q3_K},
      {FileType::kQ3_K_M, "blk.0.attn_v.weight", v, 0, DType::Q5_K},
      {FileType::kQ3_K_M, "blk.1.attn_v.weight", v, 1, DType::Q5_K},
      {FileType::kQ3_K_M, "blk.2.attn_v.weight", v, 2, DType::Q4_K},
      {FileType::kQ3_K_M, "blk.2.ffn_down_exps.weight", down, -1, DType::Q5_K},  // 2 < 48 / 16
      {FileType::kQ3_K_M, "blk.3.ffn_down_exps.weight", down, -1, DType::Q4_K},
      {FileType::kQ3_K_M, "blk.3.attn_output.weight", o, -1, DType::Q4_K},
      {FileType::kQ3_K_M, "blk.3.ffn_gate_exps.weight", {2048, 768, 128}, -1, DType::Q3_K},
      {FileType::kQ3_K_L, "blk.30.ffn_down_exps.weight", down, -1, DType::Q5_K},
      {FileType::kQ3_K_L, "blk.30.attn_v.weight", v, 30, DType::Q5_K},
      {FileType::kQ4_K_S, "blk.3.attn_v.weight", v, 3, DType::Q5_K},
      {FileType::kQ4_K_S, "blk.4.attn_v.weight", v, 4, DType::Q4_K},
      {FileType::kQ4_K_S, "blk.5.ffn_down_exps.weight", down, -1, DType::Q5_K},
      {FileType::kQ4_K_S, "blk.6.ffn_down_exps.weight", down, -1, DType::Q4_K},
      {FileType::kQ5_K_S, "blk.0.ffn_down_exps.weight", down, -1, DType::Q5_K},
      {FileType::kIQ4_XS, "blk.0.attn_v.weight", v, 0, DType::Q5_K},
      {FileType::kIQ4_XS, "blk.5.ffn_down_exps.weight", down, -1, DType::Q5_K},
      {FileType::kIQ4_XS, "blk.6.ffn_down_exps.weight", down, -1, DType::IQ4_XS},
      {FileType::kIQ4_NL, "blk.6.attn_q.weight", q, -1, DType::IQ4_NL},
      {FileType::kQ4_1, "blk.6.attn_q.weight", q, -1, DType::Q4_1},
      {FileType::kQ5_0, "blk.6.ffn_down_exps.weight", down, -1, DType::Q5_0},
      {FileType::kQ5_1, "output.weight", {2048, 151936}, -1, DType::Q6_K},
      {FileType::kMXFP4_MOE, "blk.6.ffn_down_exps.weight", down, -1, DType::MXFP4},
      {FileType::kMXFP4_MOE, "blk.6.attn_q.weight", q, -1, DType::Q8_0},
      {FileType::kMXFP4_MOE, "output.weight", {2048, 151936}, -1, DType::Q8_0},
      // Rows the block does not divide: llama.cpp's fallbacks.
      {FileType::kQ2_K, "blk.6.attn_q.weight", {96, 64}, -1, DType::Q4_0},
      {FileType::kIQ4_XS, "blk.6.attn_q.weight", {96, 64}, -1, DType::IQ4_NL},
      {FileType::kQ4_K_S, "blk.6.attn_q.weight", {96, 64}, -1, DType::Q5_0},
      {FileType::kQ5_K_S, "blk.6.attn_q.weight", {96, 64}, -1, DType::Q5_1},
      {FileType::kQ3_K_L, "blk.6.attn_q.weight", {100, 64}, -1, DType::F16},
  };
  for (const Case& c : cases) {
    const DType got = choose_tensor_type(c.file_type, {.name = c.name,
                                                       .ne = c.ne,
                                                       .n_layer = 48,
                                                       .n_expert = 128,
                                                       .output_is_tied = false,
                                                       .n_gqa = 8,
                                                       .attn_v_index = c.attn_v_index,
                                                       .n_attention_wv = 48});
    EXPECT_EQ(got, c.want) << file_type_name(c.file_type) << " " << c.name << ": got " << dtype_name(got)
                           << ", want " << dtype_name(c.want);
  }
}

// The i-quant mixes (llama.cpp's llama_tensor_get_type for them) on
// Qwen3-30B-A3B shapes (GQA 8, 128 experts) and on a dense model with GQA 2.
TEST(QuantMix, IquantMixes) {
  struct Case {
    FileType file_type;
    const char* name;
    std::vector<int64_t> ne;
    bool moe;
    bool imatrix;
    DType want;
  };
  using F = FileType;
  const std::vector<int64_t> v{2048, 512}, down{768, 2048, 128}, o{4096, 2048}, q{2048, 4096},
      gate{2048, 768, 128}, emb{2048, 151936}, dense_down{4096, 2048};
  const std::vector<Case> cases = {
      {F::kIQ2_XXS, "blk.20.ffn_gate_exps.weight", gate, true, true, DType::IQ2_XXS},
      {F::kIQ2_XXS, "blk.20.attn_v.weight", v, true, true, DType::Q4_K},
      {F::kIQ2_XXS, "blk.2.ffn_down_exps.weight", down, true, true, DType::Q2_K},  // first eighth
      {F::kIQ2_XXS, "blk.6.ffn_down_exps.weight", down, true, true, DType::IQ2_XXS},
      {F::kIQ2_XXS, "blk.6.attn_output.weight", o, true, true, DType::IQ2_XXS},
      {F::kIQ2_XXS, "output.weight", emb, true, true, DType::Q5_K},
      {F::kIQ2_XXS, "token_embd.weight", emb, true, true, DType::Q2_K},
      {F::kIQ2_XS, "blk.20.attn_q.weight", q, true, true, DType::IQ2_XS},
      {F::kIQ2_S, "blk.20.attn_q.weight", q, true, true, DType::IQ2_XS},
      {F::kIQ2_S, "blk.2.ffn_down_exps.weight", down, true, true, DType::IQ3_S},
      {F::kIQ2_S, "blk.6.attn_output.weight", o, true, true, DType::IQ3_S},
      {F::kIQ2_M, "blk.20.ffn_up_exps.weight", gate, true, true, DType::IQ2_S},
      {F::kIQ2_M, "token_embd.weight", emb, true, true, DType::IQ3_S},
      {F::kIQ2_XXS, "blk.6.attn_v.weight", {4096, 1024}, false, true, DType::Q2_K},  // dense, GQA 2
      {F::kIQ2_M, "blk.6.attn_v.weight", {4096, 1024}, false, true, DType::IQ3_S},
      {F::kIQ3_XXS, "blk.6.attn_q.weight", q, true, true, DType::IQ2_S},
      {F::kIQ3_XXS, "blk.6.attn_k.weight", v, true, true, DType::IQ2_S},
      {F::kIQ3_XXS, "blk.6.attn_v.weight", v, true, true, DType::Q4_K},
      {F::kIQ3_XXS, "blk.6.attn_v.weight", {4096, 1024}, false, true, DType::IQ3_XXS},
      {F::kIQ3_XXS, "blk.6.attn_v.weight", {4096, 1024}, false, false, DType::IQ3_S},  // no imatrix
      {F::kIQ3_XXS, "blk.2.ffn_down_exps.weight", down, true, false, DType::Q4_K},
      {F::kIQ3_XXS, "blk.6.ffn_down_exps.weight", down, true, false, DType::Q3_K},
      {F::kIQ3_XXS, "blk.6.ffn_down_exps.weight", down, true, true, DType::IQ3_XXS},
      {F::kIQ3_XXS, "blk.6.attn_output.weight", o, true, true, DType::IQ3_S},
      {F::kIQ3_XXS, "output.weight", emb, true, true, DType::Q5_K},
      {F::kIQ3_XXS, "token_embd.weight", emb, true, true, DType::IQ3_S},
      {F::kIQ3_S, "blk.6.attn_v.weight", v, true, true, DType::Q4_K},
      {F::kIQ3_S, "blk.6.ffn_gate_exps.weight", gate, true, true, DType::IQ3_S},
      {F::kIQ3_S, "output.weight", emb, true, true, DType::Q6_K},
      {F::kIQ3_M, "blk.2.ffn_down_exps.weight", down, true, true, DType::Q4_K},
      {F::kIQ3_M, "blk.20.ffn_down_exps.weight", down, true, true, DType::IQ3_S},
      {F::kIQ3_M, "blk.6.attn_output.weight", o, true, true, DType::Q4_K},
      {F::kIQ3_XS, "blk.6.attn_q.weight", q, true, true, DType::IQ3_XXS},
      {F::kIQ3_XS, "blk.20.ffn_up_exps.weight", gate, true, true, DType::IQ3_XXS},
      {F::kIQ3_XS, "blk.2.ffn_up_exps.weight", gate, true, true, DType::IQ3_S},
      {F::kIQ1_S, "blk.20.ffn_gate_exps.weight", gate, true, true, DType::IQ1_S},
      {F::kIQ1_M, "blk.20.ffn_down_exps.weight", down, true, true, DType::IQ1_M},
      {F::kIQ1_M, "blk.2.ffn_down_exps.weight", down, true, true, DType::Q2_K},
      {F::kIQ1_S, "blk.6.attn_output.weight", {4096, 2048}, false, true, DType::IQ2_XXS},  // dense
      {F::kIQ1_S, "output.weight", emb, true, true, DType::Q5_K},
      {F::kIQ1_M, "token_embd.weight", emb, true, true, DType::Q2_K},
      {F::kIQ2_XXS, "blk.6.attn_q.weight", {96, 64}, true, true, DType::IQ4_NL},  // the row fallback
      {F::kIQ3_S, "blk.6.attn_q.weight", {100, 64}, true, true, DType::F16},
  };
  for (const Case& c : cases) {
    const DType got = choose_tensor_type(c.file_type, {.name = c.name,
                                                       .ne = c.ne,
                                                       .n_layer = 48,
                                                       .n_expert = c.moe ? 128 : 0,
                                                       .output_is_tied = false,
                                                       .n_gqa = c.moe ? 8 : 2,
                                                       .n_attention_wv = 48,
                                                       .has_imatrix = c.imatrix});
    EXPECT_EQ(got, c.want) << file_type_name(c.file_type) << " " << c.name
                           << (c.imatrix ? "" : " (no imatrix)") << ": got " << dtype_name(got) << ", want "
                           << dtype_name(c.want);
  }
}

// Attention values (attn_v, attn_qkv — a hybrid model's DeltaNet layers —
// and attn_kv_b) are counted together, in file order, as llama.cpp's
// quantizer counts them.
TEST(QuantMix, AttentionIndexCountsLikeLlamaCpp) {
  const std::vector<std::string_view> names = {"blk.0.attn_qkv.weight", "blk.0.ssm_out.weight",
                                               "blk.3.attn_v.weight",   "blk.3.attn_q.weight",
                                               "blk.4.attn_qkv.weight", "blk.7.attn_v.weight"};
  const AttentionTensorIndex index(names);
  EXPECT_EQ(index.n_attention_wv(), 4);
  EXPECT_EQ(index.attn_v_index(0), 0);
  EXPECT_EQ(index.attn_v_index(2), 1);
  EXPECT_EQ(index.attn_v_index(4), 2);
  EXPECT_EQ(index.attn_v_index(5), 3);
  EXPECT_EQ(index.attn_v_index(1), -1);
  EXPECT_EQ(index.attn_v_index(99), -1);
  // With the index, Q4_K_M's attention values follow use_more_bits(index, count).
  const std::vector<int64_t> v{2048, 512};
  const TensorTypeQuery first{.name = "blk.7.attn_v.weight",
                              .ne = v,
                              .n_layer = 40,
                              .n_expert = 256,
                              .n_gqa = 8,
                              .attn_v_index = 1,
                              .n_attention_wv = 40};
  EXPECT_EQ(choose_tensor_type(FileType::kQ4_K_M, first), DType::Q6_K);  // 1 < 40 / 8
  const TensorTypeQuery qkv{.name = "blk.9.attn_qkv.weight",
                            .ne = v,
                            .n_layer = 40,
                            .n_expert = 256,
                            .n_gqa = 8,
                            .attn_v_index = 9,
                            .n_attention_wv = 40};
  EXPECT_EQ(choose_tensor_type(FileType::kQ4_K_M, qkv), DType::Q4_K);  // (9 - 5) % 3 != 2
  EXPECT_EQ(choose_tensor_type(FileType::kQ3_K_M, qkv), DType::Q4_K);
  EXPECT_EQ(choose_tensor_type(FileType::kQ2_K, qkv), DType::Q4_K);  // GQA >= 4
}

}  // namespace
}  // namespace moeserve::convert
