// Synthetic weights for make-model: which tensors a model has, the type each
// is stored in, and their values.
//
// Values are a pure function of (seed, tensor name, element index): a
// counter-based generator (splitmix64 finalizer over a per-tensor stream key)
// gives every element independently, so any row can be produced by any thread
// in any order and the file does not depend on the thread count. Each element
// is an Irwin-Hall approximation of N(0, 1) (the centred sum of four 16-bit
// uniforms, rescaled to variance 1; |x| < 3.47), scaled per tensor:
//   token_embd                          N(0, 1)
//   norms (attn/ffn/post_attention/     1 + 0.05 N(0, 1) (GGUF stores the
//     q/k/ssm/output)                     zero-centred norms with the +1 applied)
//   attn_q/k/v, ffn_gate/up(_exps),     N(0, 1/fan_in), fan_in = ne[0]
//   ffn_gate_inp (router), output,
//   attn_qkv, attn_gate (also laguna's
//   output gate), ssm_alpha,
//   ssm_beta, ssm_conv1d (fan_in = the
//   kernel), ffn_gate/up_shexp,
//   ffn_gate_inp_shexp ({H}: 1/H)
//   attn_output, ssm_out,               N(0, 1/fan_in) / sqrt(2 n_layer): the
//   ffn_down(_exps, _shexp)               residual-branch outputs are damped
//       (GPT-2 style) so the residual stream keeps a bounded magnitude through
//       deep stacks.
//   exp_probs_b.bias (laguna's router   0.1 N(0, 1): the sigmoid scores are in
//     selection bias)                     (0, 1), so the bias changes the top-k
//   ssm_dt.bias                         0.5 N(0, 1)
//   ssm_a                               -exp(0.3 N(0, 1)): negative, as the
//                                         -exp(A_log) the real files store
//
// Router skew (--router-skew S >= 0): in every layer the experts get a
// popularity rank r (0 = most popular) from a seed-derived permutation that
// differs per layer, and router row e (the logit weights of expert e) is
// multiplied by (r_e + 1)^(-S). Router logits of a normalised hidden state are
// then ~N(0, (r+1)^(-2S)): experts with wider logit distributions land in the
// top-k more often, so selection frequency decreases monotonically with rank.
// S = 0 leaves the rows alone (every expert equally likely). Measured on random
// hidden states with the `small` shapes (64 experts, top-8, 3000 samples): the
// 16 most selected experts take 26.9% of selections at S = 0 (25% plus sampling
// noise), 52.9% at S = 0.5 and 68.2% at S = 1 (make_model_test RouterSkew).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <string>
#include <vector>

#include "convert/model_presets.h"
#include "convert/quant_mix.h"
#include "tensor/dtype.h"

namespace moeserve::convert {

enum class WeightKind {
  kGaussian,  // stddev * N(0, 1)
  kNorm,      // 1 + stddev * N(0, 1)
  kNegExp,    // -exp(stddev * N(0, 1))
};

struct SyntheticTensor {
  std::string name;
  std::vector<int64_t> ne;  // GGUF order, ne[0] = row length
  DType type = DType::F32;
  WeightKind kind = WeightKind::kGaussian;
  float stddev = 1.0f;
  int layer = -1;       // -1 for global tensors
  bool router = false;  // ffn_gate_inp: rows get the skew scales

  int64_t n_elements() const;
  int64_t n_rows() const { return n_elements() / ne[0]; }
  size_t nbytes() const { return dtype_row_bytes(type, ne[0]) * size_t(n_rows()); }
};

// Every tensor of the model in file order, with its type in a file of
// `file_type` (choose_tensor_type of quant_mix.h: the same rule as quantize).
std::vector<SyntheticTensor> plan_tensors(const ModelShape& shape, FileType file_type);

class SyntheticWeights {
 public:
  SyntheticWeights(uint64_t seed, double router_skew) : seed_(seed), router_skew_(router_skew) {}

  // Rows [row_begin, row_begin + n_rows) of `t` as f32 (n_rows * ne[0] values).
  void generate_rows(const SyntheticTensor& t, int64_t row_begin, int64_t n_rows, float* out) const;

  // The multiplier of each router row of `layer` ((rank + 1)^-S); all 1 when S = 0.
  std::vector<float> router_row_scales(int layer, int64_t n_expert) const;
  // Popularity rank of each expert of `layer` (0 = most popular).
  std::vector<int64_t> expert_ranks(int layer, int64_t n_expert) const;

 private:
  uint64_t seed_;
  double router_skew_;
};

}  // namespace moeserve::convert
