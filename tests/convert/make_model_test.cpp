#include "convert/make_model.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>
#include <cstdio>
#include <cstring>
#include <random>

#include "format/gguf.h"
#include "format/model_keys.h"
#include "tensor/quantize.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/vocab_gguf.h"

namespace moeserve::convert {
namespace {

namespace fs = std::filesystem;

ModelShape preset_shape(ModelArch arch, std::string_view preset) { return model_preset(arch, preset).value(); }

class MakeModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("make_model_test_" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  struct Spec {
    ModelArch arch = ModelArch::kQwen3Moe;
    FileType type = FileType::kF32;
    uint64_t seed = 1;
    int threads = 2;
    std::string preset = "tiny";
  };
  std::string make(const Spec& spec, const std::string& name) {
    MakeModelOptions o;
    o.shape = preset_shape(spec.arch, spec.preset);
    o.file_type = spec.type;
    o.seed = spec.seed;
    o.n_threads = spec.threads;
    const std::string path = (dir_ / name).string();
    Result<MakeModelSummary> r = make_model(o, path);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    return path;
  }
  static std::string read_all(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
  }
  fs::path dir_;
};

constexpr FileType kTypes[] = {FileType::kF32, FileType::kBF16, FileType::kQ8_0,
                                    FileType::kQ4_K_M};

TEST_F(MakeModelTest, TinyFilesHaveEveryTensorAndKey) {
  for (ModelArch arch : {ModelArch::kQwen3Moe, ModelArch::kQwen3}) {
    for (FileType type : kTypes) {
      SCOPED_TRACE(fmt::format("{} {}", arch_name(arch), file_type_name(type)));
      const std::string path = make({.arch = arch, .type = type}, "m.gguf");
      Result<GgufFile> f = GgufFile::open(path);
      ASSERT_TRUE(f.is_ok()) << f.status().to_string();
      const ModelShape shape = preset_shape(arch, "tiny");
      const std::vector<SyntheticTensor> plan = plan_tensors(shape, type);
      ASSERT_EQ(f->tensors().size(), plan.size());
      for (const SyntheticTensor& t : plan) {
        const GgufTensorInfo* info = f->find_tensor(t.name);
        ASSERT_NE(info, nullptr) << t.name;
        EXPECT_EQ(info->type, t.type) << t.name;
        ASSERT_EQ(info->n_dims, t.ne.size()) << t.name;
        for (size_t d = 0; d < t.ne.size(); ++d) EXPECT_EQ(info->ne[d], t.ne[d]) << t.name;
      }
      EXPECT_EQ(f->architecture(), arch_name(arch));
      EXPECT_EQ(f->alignment(), 32u);
      EXPECT_EQ(f->get_uint(keys::kFileType), uint32_t(type));
      EXPECT_EQ(f->has(keys::kQuantizationVersion), type == FileType::kQ8_0 || type == FileType::kQ4_K_M);
      EXPECT_EQ(f->get_uint(f->arch_key(keys::kBlockCount)), uint64_t(shape.n_layer));
      EXPECT_EQ(f->get_uint(f->arch_key(keys::kKeyLength)), uint64_t(shape.head_dim));
      EXPECT_EQ(f->get_uint(f->arch_key(keys::kHeadCountKv)), uint64_t(shape.n_head_kv));
      EXPECT_NEAR(*f->get_float(f->arch_key(keys::kRopeFreqBase)), 1e6, 1.0);
      EXPECT_EQ(f->has(f->arch_key(keys::kExpertCount)), arch == ModelArch::kQwen3Moe);
      EXPECT_TRUE(f->has(keys::kName));
      EXPECT_TRUE(f->has(keys::kChatTemplate));
    }
  }
}

TEST_F(MakeModelTest, Q4KMUsesTheMixingRule) {
  const std::string path = make({.type = FileType::kQ4_K_M}, "q.gguf");
  Result<GgufFile> f = GgufFile::open(path);
  ASSERT_TRUE(f.is_ok());
  auto type_of = [&](const std::string& name) { return f->find_tensor(name)->type; };
  EXPECT_EQ(type_of("output.weight"), DType::Q6_K);
  EXPECT_EQ(type_of("token_embd.weight"), DType::Q4_K);
  EXPECT_EQ(type_of("blk.0.attn_q.weight"), DType::Q4_K);
  EXPECT_EQ(type_of("blk.0.attn_v.weight"), DType::Q8_0);  // 8-expert model
  EXPECT_EQ(type_of("blk.0.ffn_down_exps.weight"), DType::Q4_K);  // use_more_bits(0, 2) is false
  EXPECT_EQ(type_of("blk.1.ffn_down_exps.weight"), DType::Q6_K);  // use_more_bits(1, 2): 1 >= 7*2/8
  EXPECT_EQ(type_of("blk.0.ffn_gate_inp.weight"), DType::F32);
  EXPECT_EQ(type_of("blk.1.attn_norm.weight"), DType::F32);
}

TEST_F(MakeModelTest, SameSeedSameBytesRegardlessOfThreads) {
  for (FileType type : {FileType::kF32, FileType::kQ4_K_M}) {
    const std::string a = read_all(make({.type = type, .seed = 7, .threads = 1}, "a.gguf"));
    const std::string b = read_all(make({.type = type, .seed = 7, .threads = 2}, "b.gguf"));
    const std::string c = read_all(make({.type = type, .seed = 7, .threads = 2}, "c.gguf"));
    const std::string d = read_all(make({.type = type, .seed = 8, .threads = 2}, "d.gguf"));
    ASSERT_GT(a.size(), 1000000u);
    EXPECT_TRUE(a == b) << "1 vs 2 threads differ";
    EXPECT_TRUE(b == c) << "two runs differ";
    ASSERT_EQ(c.size(), d.size());
    EXPECT_FALSE(c == d) << "seeds 7 and 8 give the same file";
  }
}

TEST_F(MakeModelTest, StoredValuesAreTheGeneratorsAndLookSane) {
  const std::string path = make({.type = FileType::kF32, .seed = 3}, "f.gguf");
  Result<GgufFile> f = GgufFile::open(path);
  ASSERT_TRUE(f.is_ok());
  const SyntheticWeights gen(3, 0.0);
  for (const SyntheticTensor& t : plan_tensors(preset_shape(ModelArch::kQwen3Moe, "tiny"), FileType::kF32)) {
    std::vector<float> expect(size_t(t.n_elements()));
    gen.generate_rows(t, 0, t.n_rows(), expect.data());
    const GgufTensorInfo* info = f->find_tensor(t.name);
    ASSERT_EQ(info->nbytes, expect.size() * sizeof(float));
    EXPECT_EQ(std::memcmp(info->data, expect.data(), info->nbytes), 0) << t.name;
    // Mean and spread as documented.
    double sum = 0, sq = 0;
    for (float x : expect) sum += x, sq += double(x) * x;
    const double mean = sum / double(expect.size()), sd = std::sqrt(sq / double(expect.size()) - mean * mean);
    EXPECT_NEAR(mean, t.kind == WeightKind::kNorm ? 1.0 : 0.0, 5.0 * t.stddev / std::sqrt(double(expect.size())))
        << t.name;
    EXPECT_NEAR(sd, t.stddev, 0.1 * t.stddev) << t.name;
  }
}

TEST_F(MakeModelTest, VocabularyLoadsAndTokenizes) {
  const std::string path = make({.arch = ModelArch::kQwen3, .type = FileType::kQ8_0}, "v.gguf");
  Result<GgufFile> f = GgufFile::open(path);
  ASSERT_TRUE(f.is_ok());
  Result<tok::VocabData> vocab = tok::vocab_from_gguf(*f);
  ASSERT_TRUE(vocab.is_ok()) << vocab.status().to_string();
  EXPECT_EQ(vocab->tokens.size(), 2048u);
  auto tk = tok::Tokenizer::create(std::move(vocab.value()));
  ASSERT_TRUE(tk.is_ok()) << tk.status().to_string();
  const std::string text = "<|im_start|>user\nWhat is a mixture of experts?<|im_end|>\n";
  const std::vector<int32_t> ids = (*tk)->encode(text);
  EXPECT_EQ(ids.front(), *(*tk)->find_token("<|im_start|>"));
  EXPECT_EQ((*tk)->decode(ids), text);
  EXPECT_EQ((*tk)->eos_id(), (*tk)->find_token("<|im_end|>"));
}

TEST_F(MakeModelTest, BadOptionsAreErrors) {
  EXPECT_FALSE(model_preset(ModelArch::kQwen3Moe, "huge").is_ok());
  MakeModelOptions o;
  o.shape = preset_shape(ModelArch::kQwen3Moe, "tiny");
  o.router_skew = -1.0;
  Result<MakeModelSummary> r = make_model(o, (dir_ / "x.gguf").string());
  EXPECT_FALSE(r.is_ok());
  o.router_skew = 0.0;
  r = make_model(o, (dir_ / "no-such-dir" / "x.gguf").string());
  EXPECT_FALSE(r.is_ok());
  EXPECT_FALSE(fs::exists(dir_ / "x.gguf"));
}

// ---- one token through layer 0, with naive math on the stored weights ----------

class NaiveModel {
 public:
  explicit NaiveModel(const GgufFile& f) : f_(f) {}

  std::vector<float> row(const std::string& name, int64_t r) const {
    const GgufTensorInfo* t = f_.find_tensor(name);
    EXPECT_NE(t, nullptr) << name;
    std::vector<float> out(size_t(t->ne[0]));
    dequantize_row(t->type, t->data + size_t(r) * t->row_bytes(), out.data(), t->ne[0]);
    return out;
  }
  // y = W x over rows [first, first + n) of `name`.
  std::vector<float> matvec(const std::string& name, const std::vector<float>& x, int64_t first, int64_t n) const {
    std::vector<float> y(static_cast<size_t>(n));
    for (int64_t r = 0; r < n; ++r) {
      const std::vector<float> w = row(name, first + r);
      y[size_t(r)] = std::inner_product(w.begin(), w.end(), x.begin(), 0.0f);
    }
    return y;
  }
  std::vector<float> rms_norm(const std::vector<float>& x, const std::string& weight) const {
    const std::vector<float> w = row(weight, 0);
    double sq = 0;
    for (float v : x) sq += double(v) * v;
    const float inv = float(1.0 / std::sqrt(sq / double(x.size()) + 1e-6));
    std::vector<float> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * w[i % w.size()];
    return y;
  }

 private:
  const GgufFile& f_;
};

double rms(const std::vector<float>& x) {
  double sq = 0;
  for (float v : x) sq += double(v) * v;
  return std::sqrt(sq / double(x.size()));
}

bool all_finite(const std::vector<float>& x) {
  return std::all_of(x.begin(), x.end(), [](float v) { return std::isfinite(v); });
}

void add_into(std::vector<float>& x, const std::vector<float>& y, float scale = 1.0f) {
  for (size_t i = 0; i < x.size(); ++i) x[i] += scale * y[i];
}

std::vector<float> swiglu(const std::vector<float>& gate, const std::vector<float>& up) {
  std::vector<float> a(gate.size());
  for (size_t i = 0; i < a.size(); ++i) a[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
  return a;
}

// The FFN (dense or MoE) of layer 0 on the normed hidden state h.
std::vector<float> layer0_ffn(const NaiveModel& m, const ModelShape& s, const std::vector<float>& h) {
  if (!s.is_moe()) {
    const auto act = swiglu(m.matvec("blk.0.ffn_gate.weight", h, 0, s.n_ff), m.matvec("blk.0.ffn_up.weight", h, 0, s.n_ff));
    return m.matvec("blk.0.ffn_down.weight", act, 0, s.n_embd);
  }
  std::vector<float> logits = m.matvec("blk.0.ffn_gate_inp.weight", h, 0, s.n_expert);
  std::vector<int> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + s.n_expert_used, order.end(),
                    [&](int a, int b) { return logits[a] > logits[b]; });
  // Softmax then renormalising over the top-k equals a softmax over the top-k logits.
  std::vector<float> out(size_t(s.n_embd), 0.0f);
  double denom = 0;
  for (int i = 0; i < s.n_expert_used; ++i) denom += std::exp(logits[order[i]] - logits[order[0]]);
  for (int i = 0; i < s.n_expert_used; ++i) {
    const int e = order[i];
    const float weight = float(std::exp(logits[e] - logits[order[0]]) / denom);
    const auto act = swiglu(m.matvec("blk.0.ffn_gate_exps.weight", h, e * s.n_ff_exp, s.n_ff_exp),
                            m.matvec("blk.0.ffn_up_exps.weight", h, e * s.n_ff_exp, s.n_ff_exp));
    add_into(out, m.matvec("blk.0.ffn_down_exps.weight", act, e * s.n_embd, s.n_embd), weight);
  }
  return out;
}

TEST_F(MakeModelTest, OneTokenThroughLayerZeroStaysBounded) {
  for (auto [arch, type] : {std::pair{ModelArch::kQwen3Moe, FileType::kQ4_K_M},
                            std::pair{ModelArch::kQwen3, FileType::kBF16}}) {
    SCOPED_TRACE(arch_name(arch));
    const ModelShape s = preset_shape(arch, "tiny");
    const std::string path = make({.arch = arch, .type = type, .seed = 11}, "fw.gguf");
    Result<GgufFile> f = GgufFile::open(path);
    ASSERT_TRUE(f.is_ok());
    const NaiveModel m(*f);
    std::vector<float> x = m.row("token_embd.weight", 300);
    // Attention of a single token: the softmax over one key is 1, so each
    // query head outputs its KV head's v (q, k and their norms cancel out).
    const std::vector<float> h = m.rms_norm(x, "blk.0.attn_norm.weight");
    const std::vector<float> q = m.rms_norm(m.matvec("blk.0.attn_q.weight", h, 0, s.q_dim()), "blk.0.attn_q_norm.weight");
    const std::vector<float> v = m.matvec("blk.0.attn_v.weight", h, 0, s.kv_dim());
    EXPECT_TRUE(all_finite(q));
    std::vector<float> heads(size_t(s.q_dim()));
    for (int64_t hd = 0; hd < s.n_head; ++hd) {
      const int64_t kv = hd / (s.n_head / s.n_head_kv);
      std::copy_n(v.begin() + kv * s.head_dim, s.head_dim, heads.begin() + hd * s.head_dim);
    }
    const std::vector<float> attn = m.matvec("blk.0.attn_output.weight", heads, 0, s.n_embd);
    add_into(x, attn);
    const std::vector<float> ffn = layer0_ffn(m, s, m.rms_norm(x, "blk.0.ffn_norm.weight"));
    add_into(x, ffn);
    const std::vector<float> logits = m.matvec("output.weight", m.rms_norm(x, "output_norm.weight"), 0, s.n_vocab);
    ASSERT_TRUE(all_finite(x) && all_finite(logits));
    // Branch outputs are small but not degenerate; the stream stays near rms 1.
    EXPECT_GT(rms(attn), 0.01);
    EXPECT_LT(rms(attn), 1.0);
    EXPECT_GT(rms(ffn), 0.005);
    EXPECT_LT(rms(ffn), 1.0);
    EXPECT_GT(rms(x), 0.5);
    EXPECT_LT(rms(x), 2.0);
    EXPECT_GT(rms(logits), 0.3);
    EXPECT_LT(rms(logits), 3.0);
  }
}

// ---- router skew: selection frequencies on random hidden states -------------------

// Share of all top-k selections taken by the 25% most selected experts of
// layer 0 of the `small` shapes (64 experts, top-8), over random normalised
// hidden states; `rank0_is_top` tells whether the expert ranked 0 by the
// generator is the most selected one.
double top_quarter_share(double skew, bool* rank0_is_top) {
  const ModelShape s = preset_shape(ModelArch::kQwen3Moe, "small");
  const SyntheticWeights gen(5, skew);
  const std::vector<SyntheticTensor> plan = plan_tensors(s, FileType::kQ4_K_M);
  const SyntheticTensor& router = *std::find_if(plan.begin(), plan.end(), [](const SyntheticTensor& t) { return t.router; });
  std::vector<float> w(size_t(router.n_elements()));
  gen.generate_rows(router, 0, router.n_rows(), w.data());

  std::mt19937 rng(123);
  std::normal_distribution<float> normal;
  std::vector<int64_t> counts(size_t(s.n_expert), 0);
  std::vector<float> h(size_t(s.n_embd)), logits(size_t(s.n_expert));
  std::vector<int> order(size_t(s.n_expert));
  constexpr int kSamples = 3000;
  for (int n = 0; n < kSamples; ++n) {
    for (float& v : h) v = normal(rng);
    for (int64_t e = 0; e < s.n_expert; ++e) {
      logits[size_t(e)] = std::inner_product(h.begin(), h.end(), w.begin() + e * s.n_embd, 0.0f);
    }
    // Softmax is monotonic, so top-k of the probabilities = top-k of the logits.
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + s.n_expert_used, order.end(),
                      [&](int a, int b) { return logits[size_t(a)] > logits[size_t(b)]; });
    for (int i = 0; i < s.n_expert_used; ++i) ++counts[size_t(order[size_t(i)])];
  }
  const std::vector<int64_t> ranks = gen.expert_ranks(0, s.n_expert);
  const int64_t rank0 = std::find(ranks.begin(), ranks.end(), 0) - ranks.begin();
  *rank0_is_top = counts[size_t(rank0)] == *std::max_element(counts.begin(), counts.end());
  std::sort(counts.begin(), counts.end(), std::greater<>());
  const int64_t top = std::accumulate(counts.begin(), counts.begin() + s.n_expert / 4, int64_t{0});
  return double(top) / double(kSamples * s.n_expert_used);
}

TEST(RouterSkew, SkewConcentratesSelectionsOnPopularExperts) {
  bool rank0_top = false;
  const double uniform = top_quarter_share(0.0, &rank0_top);
  const double half = top_quarter_share(0.5, &rank0_top);
  const double skewed = top_quarter_share(1.0, &rank0_top);
  std::printf("top-25%% experts' share of selections: S=0 %.3f, S=0.5 %.3f, S=1 %.3f\n", uniform, half, skewed);
  // Uniform: 25% plus sampling noise (the top quarter is picked after the fact).
  EXPECT_GT(uniform, 0.24);
  EXPECT_LT(uniform, 0.32);
  EXPECT_GT(half, uniform + 0.1);
  EXPECT_GT(skewed, 0.6);
  EXPECT_GT(skewed, half);
  EXPECT_TRUE(rank0_top);
}

TEST(RouterSkew, RanksArePermutationsThatDifferPerLayer) {
  const SyntheticWeights gen(9, 1.0);
  std::vector<int64_t> r0 = gen.expert_ranks(0, 64), r1 = gen.expert_ranks(1, 64);
  EXPECT_NE(r0, r1);
  std::sort(r0.begin(), r0.end());
  for (int64_t i = 0; i < 64; ++i) EXPECT_EQ(r0[size_t(i)], i);
  const std::vector<float> scales = SyntheticWeights(9, 0.0).router_row_scales(0, 64);
  EXPECT_TRUE(std::all_of(scales.begin(), scales.end(), [](float v) { return v == 1.0f; }));
}

}  // namespace
}  // namespace moeserve::convert
