#include "convert/make_model_weights.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "format/model_keys.h"

namespace moeserve::convert {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

// The splitmix64 output function: a bijective 64-bit mixer.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) h = (h ^ uint8_t(c)) * 0x100000001b3ull;
  return h;
}

// The stream key of one tensor: any change of seed or name gives an unrelated stream.
uint64_t stream_key(uint64_t seed, std::string_view name) { return mix64(mix64(seed) ^ fnv1a(name)); }

// Irwin-Hall(4) from one 64-bit draw: mean 0, variance 1.
inline float approx_normal(uint64_t bits) {
  constexpr float kInv = 1.0f / 65536.0f;
  const float sum = float(bits & 0xFFFF) + float((bits >> 16) & 0xFFFF) + float((bits >> 32) & 0xFFFF) +
                    float(bits >> 48) + 2.0f;  // + 4 * 0.5: midpoints of the 16-bit cells
  return (sum * kInv - 2.0f) * 1.7320508f;   // sqrt(12 / 4)
}

struct PlanBuilder {
  const ModelShape& shape;
  FileType file_type;
  std::vector<SyntheticTensor> out;

  void add(std::string name, std::vector<int64_t> ne, WeightKind kind, float stddev, int layer, bool router = false) {
    SyntheticTensor t;
    t.name = std::move(name);
    t.ne = std::move(ne);
    t.kind = kind;
    t.stddev = stddev;
    t.layer = layer;
    t.router = router;
    out.push_back(std::move(t));  // its type: in types(), once every tensor is known
  }
  // Each tensor's type in the file type's mix (attn_v's rule counts the
  // file's attention tensors).
  std::vector<SyntheticTensor> types() && {
    std::vector<std::string_view> names;
    for (const SyntheticTensor& t : out) names.push_back(t.name);
    const AttentionTensorIndex attention(names);
    const int n_gqa = shape.n_head > 0 && shape.n_head_kv > 0 ? int(shape.n_head / shape.n_head_kv) : 0;
    for (size_t i = 0; i < out.size(); ++i) {
      out[i].type = choose_tensor_type(file_type, {.name = out[i].name,
                                                   .ne = out[i].ne,
                                                   .n_layer = int(shape.n_layer),
                                                   .n_expert = int(shape.n_expert),
                                                   .output_is_tied = false,
                                                   .n_gqa = n_gqa,
                                                   .attn_v_index = attention.attn_v_index(i),
                                                   .n_attention_wv = attention.n_attention_wv()});
    }
    return std::move(out);
  }
  void norm(std::string name, int64_t n, int layer) { add(std::move(name), {n}, WeightKind::kNorm, 0.05f, layer); }
  // A projection read by the residual stream's branch input (std 1/sqrt(fan_in)).
  void proj(std::string name, std::vector<int64_t> ne, int layer, bool router = false) {
    const float std = 1.0f / std::sqrt(float(ne[0]));
    add(std::move(name), std::move(ne), WeightKind::kGaussian, std, layer, router);
  }
  // A projection that writes back into the residual stream (damped).
  void out_proj(std::string name, std::vector<int64_t> ne, int layer) {
    const float std = 1.0f / std::sqrt(float(ne[0]) * 2.0f * float(shape.n_layer));
    add(std::move(name), std::move(ne), WeightKind::kGaussian, std, layer);
  }
};

}  // namespace

int64_t SyntheticTensor::n_elements() const {
  return std::accumulate(ne.begin(), ne.end(), int64_t{1}, std::multiplies<>());
}

namespace {

// One layer of qwen35moe / qwen35: gated full attention or Gated DeltaNet,
// then the MoE with its shared expert or the dense FFN.
void plan_hybrid_layer(PlanBuilder& b, const ModelShape& s, int il) {
  using namespace keys;
  const int64_t H = s.n_embd;
  b.norm(blk(il, kAttnNorm), H, il);
  if (s.is_full_attention_layer(il)) {
    b.proj(blk(il, kAttnQ), {H, s.q_dim() * 2}, il);  // per head [q | gate]
    b.proj(blk(il, kAttnK), {H, s.kv_dim()}, il);
    b.proj(blk(il, kAttnV), {H, s.kv_dim()}, il);
    b.out_proj(blk(il, kAttnOutput), {s.q_dim(), H}, il);
    b.norm(blk(il, kAttnQNorm), s.head_dim, il);
    b.norm(blk(il, kAttnKNorm), s.head_dim, il);
  } else {
    const int64_t n_v = s.ssm_n_v_heads;
    b.proj(blk(il, kAttnQkv), {H, s.conv_dim()}, il);
    b.proj(blk(il, kAttnGate), {H, s.ssm_inner_size()}, il);
    b.proj(blk(il, kSsmBeta), {H, n_v}, il);
    b.proj(blk(il, kSsmAlpha), {H, n_v}, il);
    b.proj(blk(il, kSsmConv1d), {s.ssm_conv_kernel, s.conv_dim()}, il);
    b.add(blk(il, kSsmDt, "bias"), {n_v}, WeightKind::kGaussian, 0.5f, il);
    b.add(blk(il, kSsmA, ""), {n_v}, WeightKind::kNegExp, 0.3f, il);
    b.norm(blk(il, kSsmNorm), s.ssm_head_v_dim, il);
    b.out_proj(blk(il, kSsmOut), {s.ssm_inner_size(), H}, il);
  }
  b.norm(blk(il, kPostAttentionNorm), H, il);
  if (s.is_moe()) {
    b.proj(blk(il, kFfnGateInp), {H, s.n_expert}, il, /*router=*/true);
    b.proj(blk(il, kFfnGateExps), {H, s.n_ff_exp, s.n_expert}, il);
    b.proj(blk(il, kFfnUpExps), {H, s.n_ff_exp, s.n_expert}, il);
    b.out_proj(blk(il, kFfnDownExps), {s.n_ff_exp, H, s.n_expert}, il);
    b.proj(blk(il, kFfnGateInpShexp), {H}, il);  // one output: 1-D
    b.proj(blk(il, kFfnGateShexp), {H, s.n_ff_shexp}, il);
    b.proj(blk(il, kFfnUpShexp), {H, s.n_ff_shexp}, il);
    b.out_proj(blk(il, kFfnDownShexp), {s.n_ff_shexp, H}, il);
  } else {
    b.proj(blk(il, kFfnGate), {H, s.n_ff}, il);
    b.proj(blk(il, kFfnUp), {H, s.n_ff}, il);
    b.out_proj(blk(il, kFfnDown), {s.n_ff, H}, il);
  }
}

// One layer of laguna: attention with its output gate, then the dense FFN
// (leading layers) or the experts with their selection bias and shared expert.
void plan_laguna_layer(PlanBuilder& b, const ModelShape& s, int il) {
  using namespace keys;
  const int64_t H = s.n_embd, q = s.n_head_layer(il) * s.head_dim;
  b.norm(blk(il, kAttnNorm), H, il);
  b.proj(blk(il, kAttnQ), {H, q}, il);
  b.proj(blk(il, kAttnK), {H, s.kv_dim()}, il);
  b.proj(blk(il, kAttnV), {H, s.kv_dim()}, il);
  b.out_proj(blk(il, kAttnOutput), {q, H}, il);
  b.norm(blk(il, kAttnQNorm), s.head_dim, il);
  b.norm(blk(il, kAttnKNorm), s.head_dim, il);
  b.proj(blk(il, kAttnGate), {H, s.n_head_layer(il)}, il);  // one softplus gate per head
  b.norm(blk(il, kFfnNorm), H, il);
  if (s.is_dense_layer(il)) {
    b.proj(blk(il, kFfnGate), {H, s.n_ff}, il);
    b.proj(blk(il, kFfnUp), {H, s.n_ff}, il);
    b.out_proj(blk(il, kFfnDown), {s.n_ff, H}, il);
    return;
  }
  b.proj(blk(il, kFfnGateInp), {H, s.n_expert}, il, /*router=*/true);
  // Added to the sigmoid scores (in (0, 1)) for the selection only.
  b.add(blk(il, kFfnExpProbsB, "bias"), {s.n_expert}, WeightKind::kGaussian, 0.1f, il);
  b.proj(blk(il, kFfnGateExps), {H, s.n_ff_exp, s.n_expert}, il);
  b.proj(blk(il, kFfnUpExps), {H, s.n_ff_exp, s.n_expert}, il);
  b.out_proj(blk(il, kFfnDownExps), {s.n_ff_exp, H, s.n_expert}, il);
  b.proj(blk(il, kFfnGateShexp), {H, s.n_ff_shexp}, il);
  b.proj(blk(il, kFfnUpShexp), {H, s.n_ff_shexp}, il);
  b.out_proj(blk(il, kFfnDownShexp), {s.n_ff_shexp, H}, il);
}

}  // namespace

std::vector<SyntheticTensor> plan_tensors(const ModelShape& s, FileType file_type) {
  PlanBuilder b{s, file_type, {}};
  const int64_t H = s.n_embd;
  b.add(std::string(keys::kTokenEmbd), {H, s.n_vocab}, WeightKind::kGaussian, 1.0f, -1);
  for (int il = 0; il < int(s.n_layer); ++il) {
    using namespace keys;
    if (s.is_hybrid()) {
      plan_hybrid_layer(b, s, il);
      continue;
    }
    if (s.is_laguna()) {
      plan_laguna_layer(b, s, il);
      continue;
    }
    b.norm(blk(il, kAttnNorm), H, il);
    b.proj(blk(il, kAttnQ), {H, s.q_dim()}, il);
    b.proj(blk(il, kAttnK), {H, s.kv_dim()}, il);
    b.proj(blk(il, kAttnV), {H, s.kv_dim()}, il);
    b.out_proj(blk(il, kAttnOutput), {s.q_dim(), H}, il);
    b.norm(blk(il, kAttnQNorm), s.head_dim, il);
    b.norm(blk(il, kAttnKNorm), s.head_dim, il);
    b.norm(blk(il, kFfnNorm), H, il);
    if (s.is_moe()) {
      b.proj(blk(il, kFfnGateInp), {H, s.n_expert}, il, /*router=*/true);
      b.proj(blk(il, kFfnGateExps), {H, s.n_ff_exp, s.n_expert}, il);
      b.proj(blk(il, kFfnUpExps), {H, s.n_ff_exp, s.n_expert}, il);
      b.out_proj(blk(il, kFfnDownExps), {s.n_ff_exp, H, s.n_expert}, il);
    } else {
      b.proj(blk(il, kFfnGate), {H, s.n_ff}, il);
      b.proj(blk(il, kFfnUp), {H, s.n_ff}, il);
      b.out_proj(blk(il, kFfnDown), {s.n_ff, H}, il);
    }
  }
  b.norm(std::string(keys::kOutputNorm), H, -1);
  b.proj(std::string(keys::kOutput), {H, s.n_vocab}, -1);
  return std::move(b).types();
}

std::vector<int64_t> SyntheticWeights::expert_ranks(int layer, int64_t n_expert) const {
  // Fisher-Yates driven by the counter generator keyed on (seed, layer).
  std::vector<int64_t> order(static_cast<size_t>(n_expert));
  std::iota(order.begin(), order.end(), 0);
  const uint64_t key = stream_key(seed_, "router-rank") ^ mix64(uint64_t(layer) + 1);
  for (int64_t i = n_expert - 1; i > 0; --i) {
    const uint64_t r = mix64(key + uint64_t(i) * kGolden);
    std::swap(order[size_t(i)], order[size_t(r % uint64_t(i + 1))]);
  }
  std::vector<int64_t> rank(static_cast<size_t>(n_expert));
  for (int64_t r = 0; r < n_expert; ++r) rank[size_t(order[size_t(r)])] = r;  // order[r] = expert of rank r
  return rank;
}

std::vector<float> SyntheticWeights::router_row_scales(int layer, int64_t n_expert) const {
  std::vector<float> scales(static_cast<size_t>(n_expert), 1.0f);
  if (router_skew_ <= 0.0) return scales;
  const std::vector<int64_t> rank = expert_ranks(layer, n_expert);
  for (int64_t e = 0; e < n_expert; ++e) scales[size_t(e)] = float(std::pow(double(rank[size_t(e)] + 1), -router_skew_));
  return scales;
}

void SyntheticWeights::generate_rows(const SyntheticTensor& t, int64_t row_begin, int64_t n_rows, float* out) const {
  const uint64_t key = stream_key(seed_, t.name);
  const int64_t ne0 = t.ne[0];
  std::vector<float> row_scale;
  if (t.router && router_skew_ > 0.0) row_scale = router_row_scales(t.layer, t.ne[1]);
  for (int64_t r = 0; r < n_rows; ++r) {
    const int64_t row = row_begin + r;
    const float scale = t.stddev * (row_scale.empty() ? 1.0f : row_scale[size_t(row)]);
    const float offset = t.kind == WeightKind::kNorm ? 1.0f : 0.0f;
    float* dst = out + r * ne0;
    const uint64_t first = uint64_t(row) * uint64_t(ne0);
    for (int64_t i = 0; i < ne0; ++i) dst[i] = offset + scale * approx_normal(mix64(key + (first + uint64_t(i) + 1) * kGolden));
    if (t.kind == WeightKind::kNegExp) {
      for (int64_t i = 0; i < ne0; ++i) dst[i] = -std::exp(dst[i]);
    }
  }
}

}  // namespace moeserve::convert
