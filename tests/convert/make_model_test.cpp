#include "convert/make_model.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <numeric>
#include <cstdio>
#include <cstring>
#include <random>
#include <tuple>

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
    bool quick_quant = false;  // for tests of shapes and types only: ~15x faster K-quants
  };
  std::string make(const Spec& spec, const std::string& name) {
    MakeModelOptions o;
    o.shape = preset_shape(spec.arch, spec.preset);
    o.file_type = spec.type;
    o.seed = spec.seed;
    o.n_threads = spec.threads;
    o.quick_quant = spec.quick_quant;
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
  for (ModelArch arch :
       {ModelArch::kQwen3Moe, ModelArch::kQwen3, ModelArch::kQwen35Moe, ModelArch::kQwen35}) {
    for (FileType type : kTypes) {
      SCOPED_TRACE(fmt::format("{} {}", arch_name(arch), file_type_name(type)));
      const std::string path = make({.arch = arch, .type = type, .quick_quant = true}, "m.gguf");
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
      EXPECT_NEAR(*f->get_float(f->arch_key(keys::kRopeFreqBase)), shape.is_hybrid() ? 1e7 : 1e6, 1.0);
      EXPECT_EQ(f->has(f->arch_key(keys::kExpertCount)), shape.is_moe());
      EXPECT_EQ(f->has(f->arch_key(keys::kSsmConvKernel)), shape.is_hybrid());
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
  // Another architecture's preset: the error names this architecture's.
  for (auto [arch, preset, has] : {std::tuple{ModelArch::kQwen3, "27b", "tiny, small, 30b-a3b"},
                                   std::tuple{ModelArch::kQwen3Moe, "35b-a3b", "tiny, small, 30b-a3b"},
                                   std::tuple{ModelArch::kQwen35, "35b-a3b", "tiny, small, 27b"},
                                   std::tuple{ModelArch::kQwen35, "30b-a3b", "tiny, small, 27b"},
                                   std::tuple{ModelArch::kQwen35Moe, "27b", "tiny, small, 35b-a3b"}}) {
    Result<ModelShape> r = model_preset(arch, preset);
    ASSERT_FALSE(r.is_ok()) << arch_name(arch) << " " << preset;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(has), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find(preset), std::string::npos) << r.status().message();
  }
  {
    ModelShape bad = preset_shape(ModelArch::kQwen35Moe, "tiny");
    bad.ssm_n_v_heads = 3;  // not a multiple of the 2 K heads
    MakeModelOptions o;
    o.shape = bad;
    EXPECT_FALSE(make_model(o, (dir_ / "bad.gguf").string()).is_ok());
    o.shape = preset_shape(ModelArch::kQwen35, "tiny");
    o.shape.n_rot = 65;
    EXPECT_FALSE(make_model(o, (dir_ / "bad.gguf").string()).is_ok());
  }
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

// ---- hybrid Gated DeltaNet models (qwen35moe, qwen35) ------------------------------

struct ExpectedTensor {
  std::string name;
  std::vector<int64_t> ne;
  DType q4_k_m;  // its type in a q4_k_m file (every tensor is F32 in an f32 file)
};

// The tiny preset's tensors in file order, written out from the spec (not from
// ModelShape): 4 layers, layer 3 full attention, hidden 256, attention 4/2 heads
// of 64, DeltaNet 2 K / 4 V heads of 64 (conv_dim 2*2*64 + 4*64 = 512, inner
// 256), conv 4; MoE: 8 experts of FF 256 + shared FF 256; dense FF 512.
std::vector<ExpectedTensor> expected_tiny_hybrid(bool moe) {
  std::vector<ExpectedTensor> out;
  out.push_back({"token_embd.weight", {256, 2048}, DType::Q4_K});
  for (int il = 0; il < 4; ++il) {
    auto b = [&](const std::string& name, std::vector<int64_t> ne, DType t,
                 const std::string& suffix = ".weight") {
      out.push_back({fmt::format("blk.{}.{}{}", il, name, suffix), std::move(ne), t});
    };
    // use_more_bits(il, 4): layers 2 and 3.
    const DType down = il >= 2 ? DType::Q6_K : DType::Q4_K;
    b("attn_norm", {256}, DType::F32);
    if (il == 3) {
      b("attn_q", {256, 4 * 64 * 2}, DType::Q4_K);
      // 8 experts (llama.cpp's rules): attn_k and attn_v Q8_0, attn_output Q5_K.
      b("attn_k", {256, 128}, moe ? DType::Q8_0 : DType::Q4_K);
      // Attention values (attn_qkv and attn_v) count together: this is the
      // 4th of 4, use_more_bits(3, 4) holds; 8 experts: Q8_0.
      b("attn_v", {256, 128}, moe ? DType::Q8_0 : DType::Q6_K);
      b("attn_output", {256, 256}, moe ? DType::Q5_K : DType::Q4_K);
      b("attn_q_norm", {64}, DType::F32);
      b("attn_k_norm", {64}, DType::F32);
    } else {
      // An attention value in llama.cpp's count: use_more_bits(il, 4) holds
      // for layer 2 (and 3); 8 experts: Q8_0.
      b("attn_qkv", {256, 512}, moe ? DType::Q8_0 : il == 2 ? DType::Q6_K : DType::Q4_K);
      b("attn_gate", {256, 256}, DType::Q4_K);
      b("ssm_beta", {256, 4}, DType::Q4_K);
      b("ssm_alpha", {256, 4}, DType::Q4_K);
      b("ssm_conv1d", {4, 512}, DType::F32);
      b("ssm_dt", {4}, DType::F32, ".bias");
      b("ssm_a", {4}, DType::F32, "");
      b("ssm_norm", {64}, DType::F32);
      b("ssm_out", {256, 256}, DType::Q4_K);
    }
    b("post_attention_norm", {256}, DType::F32);
    if (moe) {
      b("ffn_gate_inp", {256, 8}, DType::F32);
      b("ffn_gate_exps", {256, 256, 8}, DType::Q4_K);
      b("ffn_up_exps", {256, 256, 8}, DType::Q4_K);
      b("ffn_down_exps", {256, 256, 8}, down);
      b("ffn_gate_inp_shexp", {256}, DType::F32);
      b("ffn_gate_shexp", {256, 256}, DType::Q4_K);
      b("ffn_up_shexp", {256, 256}, DType::Q4_K);
      b("ffn_down_shexp", {256, 256}, down);
    } else {
      b("ffn_gate", {256, 512}, DType::Q4_K);
      b("ffn_up", {256, 512}, DType::Q4_K);
      b("ffn_down", {512, 256}, down);
    }
  }
  out.push_back({"output_norm.weight", {256}, DType::F32});
  out.push_back({"output.weight", {256, 2048}, DType::Q6_K});
  return out;
}

TEST_F(MakeModelTest, HybridTinyTensorsAndKeys) {
  for (ModelArch arch : {ModelArch::kQwen35Moe, ModelArch::kQwen35}) {
    const bool moe = arch == ModelArch::kQwen35Moe;
    const ModelShape s = preset_shape(arch, "tiny");
    EXPECT_TRUE(s.is_hybrid());
    EXPECT_EQ(s.is_moe(), moe);
    EXPECT_EQ(s.conv_dim(), 512);
    for (int il = 0; il < 4; ++il) EXPECT_EQ(s.is_full_attention_layer(il), il == 3) << il;
    const std::vector<ExpectedTensor> want = expected_tiny_hybrid(moe);
    int64_t want_params = 0;
    for (const ExpectedTensor& t : want) {
      want_params += std::accumulate(t.ne.begin(), t.ne.end(), int64_t{1}, std::multiplies<>());
    }
    EXPECT_EQ(s.n_params(), want_params);
    EXPECT_EQ(want_params, moe ? 9199192 : 3684952);
    for (FileType type : {FileType::kF32, FileType::kQ4_K_M}) {
      SCOPED_TRACE(fmt::format("{} {}", arch_name(arch), file_type_name(type)));
      const std::vector<SyntheticTensor> plan = plan_tensors(s, type);
      ASSERT_EQ(plan.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_EQ(plan[i].name, want[i].name);
        EXPECT_EQ(plan[i].ne, want[i].ne) << want[i].name;
        EXPECT_EQ(plan[i].type, type == FileType::kF32 ? DType::F32 : want[i].q4_k_m) << want[i].name;
      }
      MakeModelOptions o;
      o.shape = s;
      o.file_type = type;
      o.seed = 4;
      o.n_threads = 2;
      o.quick_quant = true;  // types and shapes only
      Result<MakeModelSummary> summary = make_model(o, (dir_ / "h.gguf").string());
      ASSERT_TRUE(summary.is_ok()) << summary.status().to_string();
      EXPECT_EQ(summary->n_params, want_params);
      EXPECT_EQ(summary->n_tensors, want.size());
      Result<GgufFile> f = GgufFile::open((dir_ / "h.gguf").string());
      ASSERT_TRUE(f.is_ok()) << f.status().to_string();
      ASSERT_EQ(f->tensors().size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        const GgufTensorInfo& info = f->tensors()[i];
        EXPECT_EQ(info.name, want[i].name);
        ASSERT_EQ(info.n_dims, want[i].ne.size()) << want[i].name;
        for (size_t d = 0; d < want[i].ne.size(); ++d) EXPECT_EQ(info.ne[d], want[i].ne[d]) << want[i].name;
        EXPECT_EQ(info.type, type == FileType::kF32 ? DType::F32 : want[i].q4_k_m) << want[i].name;
      }
      EXPECT_EQ(f->find_tensor("blk.0.ffn_norm.weight"), nullptr);  // post_attention_norm instead

      // Keys and values.
      auto u = [&](std::string_view suffix) { return f->get_uint(f->arch_key(suffix)); };
      EXPECT_EQ(f->architecture(), moe ? "qwen35moe" : "qwen35");
      EXPECT_EQ(f->get_string(keys::kName),
                moe ? "moeserve-synthetic-qwen35moe-tiny" : "moeserve-synthetic-qwen35-tiny");
      EXPECT_EQ(f->get_uint(keys::kFileType), uint32_t(type));
      EXPECT_EQ(u(keys::kContextLength), 2048u);
      EXPECT_EQ(u(keys::kEmbeddingLength), 256u);
      EXPECT_EQ(u(keys::kBlockCount), 4u);
      EXPECT_EQ(u(keys::kFeedForwardLength), moe ? 256u : 512u);
      EXPECT_EQ(u(keys::kHeadCount), 4u);
      EXPECT_EQ(u(keys::kHeadCountKv), 2u);
      EXPECT_EQ(u(keys::kKeyLength), 64u);
      EXPECT_EQ(u(keys::kValueLength), 64u);
      EXPECT_NEAR(*f->get_float(f->arch_key(keys::kRmsEps)), 1e-6, 1e-9);
      EXPECT_EQ(*f->get_float(f->arch_key(keys::kRopeFreqBase)), 1e7);
      EXPECT_EQ(u(keys::kRopeDimensionCount), 16u);
      const GgufValue* sections = f->find(f->arch_key(keys::kRopeDimensionSections));
      ASSERT_NE(sections, nullptr);
      EXPECT_TRUE(sections->is_array());
      EXPECT_EQ(sections->elem_type(), GgufType::kI32);
      EXPECT_EQ(sections->as_int_array(), (std::vector<int64_t>{2, 2, 4, 0}));
      EXPECT_EQ(u(keys::kSsmConvKernel), 4u);
      EXPECT_EQ(u(keys::kSsmStateSize), 64u);
      EXPECT_EQ(u(keys::kSsmGroupCount), 2u);
      EXPECT_EQ(u(keys::kSsmTimeStepRank), 4u);
      EXPECT_EQ(u(keys::kSsmInnerSize), 256u);
      EXPECT_EQ(u(keys::kFullAttentionInterval), 4u);
      EXPECT_EQ(u(keys::kExpertCount), moe ? std::optional<uint64_t>(8) : std::nullopt);
      EXPECT_EQ(u(keys::kExpertUsedCount), moe ? std::optional<uint64_t>(2) : std::nullopt);
      EXPECT_EQ(u(keys::kExpertFeedForwardLength), moe ? std::optional<uint64_t>(256) : std::nullopt);
      EXPECT_EQ(u(keys::kExpertSharedFeedForwardLength), moe ? std::optional<uint64_t>(256) : std::nullopt);
      EXPECT_FALSE(f->has(f->arch_key(keys::kNextnPredictLayers)));
      EXPECT_EQ(f->get_string(keys::kTokPre), "qwen35");
      EXPECT_EQ(f->get_uint("moeserve.synthetic.seed"), 4u);
    }
  }
}

TEST(HybridPresets, RopeSections) {
  ModelShape s = preset_shape(ModelArch::kQwen35Moe, "35b-a3b");
  EXPECT_EQ(s.rope_sections(), (std::vector<int32_t>{11, 11, 10, 0}));
  s.n_rot = 32;
  EXPECT_EQ(s.rope_sections(), (std::vector<int32_t>{5, 5, 6, 0}));
  s.n_rot = 16;
  EXPECT_EQ(s.rope_sections(), (std::vector<int32_t>{2, 2, 4, 0}));
  EXPECT_EQ(preset_shape(ModelArch::kQwen3, "tiny").rope_dim(), 64);  // n_rot 0: the whole head
}

TEST(HybridPresets, ParamCountsMatchThePlans) {
  for (ModelArch arch :
       {ModelArch::kQwen3Moe, ModelArch::kQwen3, ModelArch::kQwen35Moe, ModelArch::kQwen35}) {
    EXPECT_EQ(arch_from_name(arch_name(arch)), arch);
    for (const std::string& preset : preset_names(arch)) {
      const ModelShape s = preset_shape(arch, preset);
      int64_t sum = 0;
      uint64_t bytes = 0;
      for (const SyntheticTensor& t : plan_tensors(s, FileType::kQ4_K_M)) {
        sum += t.n_elements();
        bytes += t.nbytes();
      }
      EXPECT_EQ(sum, s.n_params()) << arch_name(arch) << " " << preset;
      std::printf("%-9s %-7s %7.3f B params, %6.2f GiB in q4_k_m\n", std::string(arch_name(arch)).c_str(),
                  preset.c_str(), double(sum) / 1e9, double(bytes) / double(1ull << 30));
    }
  }
}

TEST(HybridPresets, RealShapes) {
  // Qwen3.6-35B-A3B: 10 full-attention layers (3, 7, ..., 39), 30 DeltaNet.
  const ModelShape moe = preset_shape(ModelArch::kQwen35Moe, "35b-a3b");
  const std::vector<SyntheticTensor> plan = plan_tensors(moe, FileType::kQ4_K_M);
  int64_t sum = 0;
  int full = 0, delta = 0;
  for (const SyntheticTensor& t : plan) {
    sum += t.n_elements();
    full += t.name.ends_with(".attn_q.weight");
    delta += t.name.ends_with(".attn_qkv.weight");
  }
  std::printf("qwen35moe 35b-a3b plan: %lld parameters (%.2f B)\n", (long long)sum, double(sum) / 1e9);
  EXPECT_EQ(sum, 34660610688);
  EXPECT_EQ(full, 10);
  EXPECT_EQ(delta, 30);
  auto find = [&](const std::string& name) {
    auto it =
        std::find_if(plan.begin(), plan.end(), [&](const SyntheticTensor& t) { return t.name == name; });
    EXPECT_NE(it, plan.end()) << name;
    return it == plan.end() ? std::vector<int64_t>{} : it->ne;
  };
  // The shapes of model-and-format-specs.md §2.
  EXPECT_EQ(find("blk.3.attn_q.weight"), (std::vector<int64_t>{2048, 8192}));
  EXPECT_EQ(find("blk.3.attn_k.weight"), (std::vector<int64_t>{2048, 512}));
  EXPECT_EQ(find("blk.3.attn_output.weight"), (std::vector<int64_t>{4096, 2048}));
  EXPECT_EQ(find("blk.3.attn_q_norm.weight"), (std::vector<int64_t>{256}));
  EXPECT_EQ(find("blk.0.attn_qkv.weight"), (std::vector<int64_t>{2048, 8192}));
  EXPECT_EQ(find("blk.0.attn_gate.weight"), (std::vector<int64_t>{2048, 4096}));
  EXPECT_EQ(find("blk.0.ssm_beta.weight"), (std::vector<int64_t>{2048, 32}));
  EXPECT_EQ(find("blk.0.ssm_alpha.weight"), (std::vector<int64_t>{2048, 32}));
  EXPECT_EQ(find("blk.0.ssm_conv1d.weight"), (std::vector<int64_t>{4, 8192}));
  EXPECT_EQ(find("blk.0.ssm_dt.bias"), (std::vector<int64_t>{32}));
  EXPECT_EQ(find("blk.0.ssm_a"), (std::vector<int64_t>{32}));
  EXPECT_EQ(find("blk.0.ssm_norm.weight"), (std::vector<int64_t>{128}));
  EXPECT_EQ(find("blk.0.ssm_out.weight"), (std::vector<int64_t>{4096, 2048}));
  EXPECT_EQ(find("blk.39.ffn_gate_inp.weight"), (std::vector<int64_t>{2048, 256}));
  EXPECT_EQ(find("blk.39.ffn_gate_exps.weight"), (std::vector<int64_t>{2048, 512, 256}));
  EXPECT_EQ(find("blk.39.ffn_down_exps.weight"), (std::vector<int64_t>{512, 2048, 256}));
  EXPECT_EQ(find("blk.39.ffn_gate_inp_shexp.weight"), (std::vector<int64_t>{2048}));
  EXPECT_EQ(find("blk.39.ffn_up_shexp.weight"), (std::vector<int64_t>{2048, 512}));
  EXPECT_EQ(find("blk.39.ffn_down_shexp.weight"), (std::vector<int64_t>{512, 2048}));
  EXPECT_EQ(find("token_embd.weight"), (std::vector<int64_t>{2048, 248320}));
  EXPECT_EQ(find("output.weight"), (std::vector<int64_t>{2048, 248320}));

  // Qwen3.6-27B.
  const ModelShape dense = preset_shape(ModelArch::kQwen35, "27b");
  int64_t dense_sum = 0;
  for (const SyntheticTensor& t : plan_tensors(dense, FileType::kQ4_K_M)) dense_sum += t.n_elements();
  std::printf("qwen35 27b plan: %lld parameters (%.2f B)\n", (long long)dense_sum, double(dense_sum) / 1e9);
  EXPECT_EQ(dense_sum, 26895998464);
  EXPECT_EQ(dense.conv_dim(), 2 * 16 * 128 + 48 * 128);
}

TEST_F(MakeModelTest, HybridSameSeedSameBytes) {
  // K-quants on 1 and 2 threads (quick scales: the search's thread independence is
  // SameSeedSameBytesRegardlessOfThreads'); seeds on the cheap types.
  auto q4 = [&](int threads, const std::string& name) {
    return read_all(make({.arch = ModelArch::kQwen35Moe,
                          .type = FileType::kQ4_K_M,
                          .seed = 7,
                          .threads = threads,
                          .quick_quant = true},
                         name));
  };
  const std::string a = q4(1, "a.gguf");
  const std::string b = q4(2, "b.gguf");
  ASSERT_GT(a.size(), 1000000u);
  EXPECT_TRUE(a == b) << "qwen35moe q4_k_m: 1 vs 2 threads differ";
  for (auto [arch, type] :
       {std::pair{ModelArch::kQwen35Moe, FileType::kF32}, std::pair{ModelArch::kQwen35, FileType::kQ8_0}}) {
    SCOPED_TRACE(fmt::format("{} {}", arch_name(arch), file_type_name(type)));
    const std::string c = read_all(make({.arch = arch, .type = type, .seed = 7, .threads = 1}, "c.gguf"));
    const std::string d = read_all(make({.arch = arch, .type = type, .seed = 7, .threads = 2}, "d.gguf"));
    const std::string e = read_all(make({.arch = arch, .type = type, .seed = 8, .threads = 2}, "e.gguf"));
    ASSERT_GT(c.size(), 1000000u);
    EXPECT_TRUE(c == d) << "1 vs 2 threads differ";
    ASSERT_EQ(c.size(), e.size());
    EXPECT_FALSE(c == e) << "seeds 7 and 8 give the same file";
  }
}

TEST_F(MakeModelTest, HybridStoredValuesAreTheGeneratorsAndLookSane) {
  const ModelShape s = preset_shape(ModelArch::kQwen35Moe, "tiny");
  const std::string path = make({.arch = ModelArch::kQwen35Moe, .type = FileType::kF32, .seed = 3}, "f.gguf");
  Result<GgufFile> f = GgufFile::open(path);
  ASSERT_TRUE(f.is_ok());
  const SyntheticWeights gen(3, 0.0);
  const float damped = 1.0f / std::sqrt(2.0f * float(s.n_layer));
  for (const SyntheticTensor& t : plan_tensors(s, FileType::kF32)) {
    std::vector<float> expect(size_t(t.n_elements()));
    gen.generate_rows(t, 0, t.n_rows(), expect.data());
    const GgufTensorInfo* info = f->find_tensor(t.name);
    ASSERT_EQ(info->nbytes, expect.size() * sizeof(float));
    EXPECT_EQ(std::memcmp(info->data, expect.data(), info->nbytes), 0) << t.name;
    const std::string_view name = t.name;
    // The per-tensor rules of make_model_weights.h.
    const bool is_norm = name.find("norm") != std::string_view::npos;
    const bool is_out = name.find("attn_output") != std::string_view::npos ||
                        name.find("ssm_out") != std::string_view::npos ||
                        name.find("ffn_down") != std::string_view::npos;
    if (is_norm) {
      EXPECT_EQ(t.kind, WeightKind::kNorm) << t.name;
      EXPECT_FLOAT_EQ(t.stddev, 0.05f) << t.name;
    } else if (name.ends_with("ssm_a")) {
      EXPECT_EQ(t.kind, WeightKind::kNegExp);
      EXPECT_FLOAT_EQ(t.stddev, 0.3f);
      // -exp(0.3 N), |N| < 3.47: in [-exp(1.04), -exp(-1.04)].
      for (float v : expect) {
        EXPECT_LT(v, -0.35f) << t.name;
        EXPECT_GT(v, -2.9f) << t.name;
      }
    } else if (name.ends_with("ssm_dt.bias")) {
      EXPECT_EQ(t.kind, WeightKind::kGaussian);
      EXPECT_FLOAT_EQ(t.stddev, 0.5f);
    } else if (name.find("token_embd") != std::string_view::npos) {
      EXPECT_FLOAT_EQ(t.stddev, 1.0f);
    } else {
      EXPECT_EQ(t.kind, WeightKind::kGaussian) << t.name;
      const float fan_in_std = 1.0f / std::sqrt(float(t.ne[0]));
      EXPECT_FLOAT_EQ(t.stddev, is_out ? fan_in_std * damped : fan_in_std) << t.name;
    }
    EXPECT_EQ(t.router, name.ends_with("ffn_gate_inp.weight")) << t.name;
    if (t.kind == WeightKind::kNegExp || t.n_elements() < 1000) continue;  // too few for statistics
    double sum = 0, sq = 0;
    for (float x : expect) sum += x, sq += double(x) * x;
    const double mean = sum / double(expect.size()), sd = std::sqrt(sq / double(expect.size()) - mean * mean);
    EXPECT_NEAR(mean, t.kind == WeightKind::kNorm ? 1.0 : 0.0,
                5.0 * t.stddev / std::sqrt(double(expect.size())))
        << t.name;
    EXPECT_NEAR(sd, t.stddev, 0.1 * t.stddev) << t.name;
  }
}

// One token through a DeltaNet layer (0) and the full-attention layer (3) of the
// tiny hybrids, each with its FFN, with naive math on the stored weights
// (model-and-format-specs.md §3): the branches stay bounded.
float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
float silu(float x) { return x * sigmoid(x); }

std::vector<float> l2_normalized(std::vector<float> x) {
  double sq = 0;
  for (float v : x) sq += double(v) * v;
  const float inv = float(1.0 / std::sqrt(sq + 1e-6));
  for (float& v : x) v *= inv;
  return x;
}

// A DeltaNet layer's mixer on the normed input h of the first token (zero
// conv and recurrent state).
std::vector<float> delta_net_first_token(const NaiveModel& m, const ModelShape& s, int il,
                                         const std::vector<float>& h) {
  auto name = [&](std::string_view t, std::string_view suffix = "weight") {
    return keys::blk(il, t, suffix);
  };
  const int64_t nk = s.ssm_n_k_heads, nv = s.ssm_n_v_heads, dk = s.ssm_head_k_dim, dv = s.ssm_head_v_dim;
  const int64_t K = s.ssm_conv_kernel;
  std::vector<float> mixed = m.matvec(name(keys::kAttnQkv), h, 0, s.conv_dim());
  // Causal conv over [0, 0, 0, x]: only the current token's tap (j = K - 1).
  for (int64_t ch = 0; ch < s.conv_dim(); ++ch) {
    mixed[size_t(ch)] = silu(m.row(name(keys::kSsmConv1d), ch)[size_t(K - 1)] * mixed[size_t(ch)]);
  }
  const std::vector<float> z = m.matvec(name(keys::kAttnGate), h, 0, nv * dv);
  const std::vector<float> b = m.matvec(name(keys::kSsmBeta), h, 0, nv);
  const std::vector<float> a = m.matvec(name(keys::kSsmAlpha), h, 0, nv);
  const std::vector<float> dt = m.row(name(keys::kSsmDt, "bias"), 0);
  const std::vector<float> A = m.row(name(keys::kSsmA, ""), 0);
  std::vector<float> y(size_t(nv * dv));
  for (int64_t hv = 0; hv < nv; ++hv) {
    const int64_t hk = hv % nk;  // tiled V-head order
    const std::vector<float> q = l2_normalized({mixed.begin() + hk * dk, mixed.begin() + (hk + 1) * dk});
    const std::vector<float> k =
        l2_normalized({mixed.begin() + (nk + hk) * dk, mixed.begin() + (nk + hk + 1) * dk});
    const float* v = mixed.data() + 2 * nk * dk + hv * dv;
    const float beta = sigmoid(b[size_t(hv)]);
    const float g = A[size_t(hv)] * std::log1p(std::exp(a[size_t(hv)] + dt[size_t(hv)]));
    EXPECT_LT(A[size_t(hv)], 0.0f);
    EXPECT_LE(g, 0.0f);  // a decay
    // S = e^g 0 + k (beta v)^T, o = S^T q / sqrt(dk) = beta v (k . q) / sqrt(dk).
    const float kq = std::inner_product(k.begin(), k.end(), q.begin(), 0.0f) / std::sqrt(float(dk));
    std::vector<float> o(static_cast<size_t>(dv));
    for (int64_t j = 0; j < dv; ++j) o[size_t(j)] = beta * v[j] * kq;
    const std::vector<float> normed = m.rms_norm(o, name(keys::kSsmNorm));
    for (int64_t j = 0; j < dv; ++j)
      y[size_t(hv * dv + j)] = normed[size_t(j)] * silu(z[size_t(hv * dv + j)]);
  }
  return m.matvec(name(keys::kSsmOut), y, 0, s.n_embd);
}

// A gated full-attention layer's mixer on the first token: softmax over one key
// is 1, so each head outputs its KV head's v, gated by sigmoid(gate).
std::vector<float> gated_attention_first_token(const NaiveModel& m, const ModelShape& s, int il,
                                               const std::vector<float>& h) {
  const std::vector<float> qg = m.matvec(keys::blk(il, keys::kAttnQ), h, 0, 2 * s.q_dim());
  const std::vector<float> v = m.matvec(keys::blk(il, keys::kAttnV), h, 0, s.kv_dim());
  std::vector<float> heads(size_t(s.q_dim()));
  const int64_t D = s.head_dim;
  for (int64_t hd = 0; hd < s.n_head; ++hd) {
    const int64_t kv = hd / (s.n_head / s.n_head_kv);
    for (int64_t j = 0; j < D; ++j) {
      heads[size_t(hd * D + j)] = v[size_t(kv * D + j)] * sigmoid(qg[size_t(hd * 2 * D + D + j)]);
    }
  }
  return m.matvec(keys::blk(il, keys::kAttnOutput), heads, 0, s.n_embd);
}

std::vector<float> hybrid_ffn(const NaiveModel& m, const ModelShape& s, int il, const std::vector<float>& h) {
  auto name = [&](std::string_view t) { return keys::blk(il, t); };
  if (!s.is_moe()) {
    const auto act =
        swiglu(m.matvec(name(keys::kFfnGate), h, 0, s.n_ff), m.matvec(name(keys::kFfnUp), h, 0, s.n_ff));
    return m.matvec(name(keys::kFfnDown), act, 0, s.n_embd);
  }
  std::vector<float> logits = m.matvec(name(keys::kFfnGateInp), h, 0, s.n_expert);
  std::vector<int> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + s.n_expert_used, order.end(),
                    [&](int a, int b) { return logits[a] > logits[b]; });
  std::vector<float> out(size_t(s.n_embd), 0.0f);
  double denom = 0;
  for (int i = 0; i < s.n_expert_used; ++i) denom += std::exp(logits[order[i]] - logits[order[0]]);
  for (int i = 0; i < s.n_expert_used; ++i) {
    const int e = order[i];
    const float weight = float(std::exp(logits[e] - logits[order[0]]) / denom);
    const auto act = swiglu(m.matvec(name(keys::kFfnGateExps), h, e * s.n_ff_exp, s.n_ff_exp),
                            m.matvec(name(keys::kFfnUpExps), h, e * s.n_ff_exp, s.n_ff_exp));
    add_into(out, m.matvec(name(keys::kFfnDownExps), act, e * s.n_embd, s.n_embd), weight);
  }
  const float shared_gate = sigmoid(m.matvec(name(keys::kFfnGateInpShexp), h, 0, 1)[0]);
  const auto act = swiglu(m.matvec(name(keys::kFfnGateShexp), h, 0, s.n_ff_shexp),
                          m.matvec(name(keys::kFfnUpShexp), h, 0, s.n_ff_shexp));
  add_into(out, m.matvec(name(keys::kFfnDownShexp), act, 0, s.n_embd), shared_gate);
  return out;
}

TEST_F(MakeModelTest, HybridOneTokenStaysBounded) {
  for (auto [arch, type] : {std::pair{ModelArch::kQwen35Moe, FileType::kQ4_K_M},
                            std::pair{ModelArch::kQwen35, FileType::kBF16}}) {
    SCOPED_TRACE(arch_name(arch));
    const ModelShape s = preset_shape(arch, "tiny");
    const std::string path = make({.arch = arch, .type = type, .seed = 11, .quick_quant = true}, "fw.gguf");
    Result<GgufFile> f = GgufFile::open(path);
    ASSERT_TRUE(f.is_ok());
    const NaiveModel m(*f);
    std::vector<float> x = m.row("token_embd.weight", 300);
    for (int il : {0, 3}) {
      SCOPED_TRACE(il);
      const std::vector<float> h = m.rms_norm(x, keys::blk(il, keys::kAttnNorm));
      const std::vector<float> mixer = s.is_full_attention_layer(il)
                                           ? gated_attention_first_token(m, s, il, h)
                                           : delta_net_first_token(m, s, il, h);
      ASSERT_TRUE(all_finite(mixer));
      add_into(x, mixer);
      const std::vector<float> ffn =
          hybrid_ffn(m, s, il, m.rms_norm(x, keys::blk(il, keys::kPostAttentionNorm)));
      ASSERT_TRUE(all_finite(ffn));
      add_into(x, ffn);
      EXPECT_GT(rms(mixer), 0.01);
      EXPECT_LT(rms(mixer), 1.0);
      EXPECT_GT(rms(ffn), 0.005);
      EXPECT_LT(rms(ffn), 1.0);
      std::printf("%s layer %d: mixer rms %.3f, ffn rms %.3f\n", std::string(arch_name(arch)).c_str(), il,
                  rms(mixer), rms(ffn));
    }
    const std::vector<float> logits =
        m.matvec("output.weight", m.rms_norm(x, "output_norm.weight"), 0, s.n_vocab);
    ASSERT_TRUE(all_finite(x) && all_finite(logits));
    EXPECT_GT(rms(x), 0.5);
    EXPECT_LT(rms(x), 2.0);
    EXPECT_GT(rms(logits), 0.3);
    EXPECT_LT(rms(logits), 3.0);
  }
}

}  // namespace
}  // namespace moeserve::convert
