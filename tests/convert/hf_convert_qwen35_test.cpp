// `moeserve convert` on Qwen3.5 / 3.6 hybrid checkpoints (qwen35moe, qwen35):
// a tiny Hugging Face directory with n_k = 2 K heads and n_v = 4 V heads (so
// the V-head reorder matters) is written here, converted, and checked three
// ways: the GGUF keys and tensor shapes; every tensor against the HF weights
// through the spec's transforms (norm + 1, ssm_a = -exp(A_log), conv squeeze,
// the grouped -> tiled V-head order); and the engine's logits on the
// converted file against a double-precision forward written here in HF's own
// order and naming (grouped V heads, zero-centred norms).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "convert/hf_convert.h"
#include "convert/hf_qwen35.h"
#include "core/half.h"
#include "format/gguf.h"
#include "format/safetensors.h"
#include "runtime/model.h"
#include "tensor/quantize.h"
#include "tokenizer/byte_level.h"
#include "gguf_values.h"
#include "qwen35_hf_fixture.h"

namespace moeserve::convert {
namespace {

using namespace qwen35_test;
using testing::gguf_values;
using nlohmann::json;
using Vec = std::vector<double>;


// ---- the HF forward, in HF's order, in double ----

class HfForward {
 public:
  HfForward(const TinyQwen35& m, const Options& o) : m_(m), o_(o) {}

  std::vector<float> logits(const std::vector<int32_t>& tokens) const {
    const size_t T = tokens.size();
    std::vector<Vec> x(T);
    const auto& embd = m_.w("model.embed_tokens.weight");
    for (size_t t = 0; t < T; ++t)
      x[t] = Vec(embd.begin() + tokens[t] * kHidden, embd.begin() + (tokens[t] + 1) * kHidden);
    for (int l = 0; l < kLayers; ++l) {
      const std::string p = fmt::format("model.layers.{}.", l);
      std::vector<Vec> xn(T);
      for (size_t t = 0; t < T; ++t) xn[t] = norm(x[t], w(p + "input_layernorm.weight"));
      const std::vector<Vec> mix =
          full_layer(l) ? attention(p + "self_attn.", xn) : delta_net(p + "linear_attn.", xn);
      for (size_t t = 0; t < T; ++t) {
        add_to(x[t], mix[t]);
        const Vec h = norm(x[t], w(p + "post_attention_layernorm.weight"));
        add_to(x[t], o_.moe ? moe(p + "mlp.", h) : mlp(p + "mlp.", "", kDenseFf, h));
      }
    }
    std::vector<float> out;
    const auto& head = m_.w(o_.tied ? "model.embed_tokens.weight" : "lm_head.weight");
    for (size_t t = 0; t < T; ++t) {
      for (double v : matvec(head, kVocab, kHidden, norm(x[t], w("model.norm.weight"))))
        out.push_back(float(v));
    }
    return out;
  }

 private:
  const std::vector<float>& w(const std::string& name) const { return m_.w(name); }
  static void add_to(Vec& a, const Vec& b) {
    for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
  }
  static double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }
  static double silu(double v) { return v * sigmoid(v); }
  static double f16(double v) { return fp16_to_fp32(fp32_to_fp16(float(v))); }  // the engine's KV cache

  static Vec matvec(const std::vector<float>& W, int64_t n_out, int64_t n_in, const Vec& x) {
    Vec y(size_t(n_out), 0.0);
    for (int64_t o = 0; o < n_out; ++o) {
      for (int64_t i = 0; i < n_in; ++i) y[size_t(o)] += double(W[size_t(o * n_in + i)]) * x[size_t(i)];
    }
    return y;
  }
  // Qwen3_5RMSNorm: x̂·(1 + w), zero-centred.
  static Vec norm(const Vec& x, const std::vector<float>& weight, size_t offset = 0, size_t n = 0) {
    if (n == 0) n = x.size();
    double ss = 0;
    for (size_t i = 0; i < n; ++i) ss += x[offset + i] * x[offset + i];
    const double r = 1.0 / std::sqrt(ss / double(n) + kEps);
    Vec y(n);
    for (size_t i = 0; i < n; ++i) y[i] = x[offset + i] * r * (1.0 + double(weight[i]));
    return y;
  }
  // Rotate-half RoPE over the first kRot dims of a head.
  static void rope(double* v, int64_t pos) {
    const int64_t half = kRot / 2;
    for (int64_t i = 0; i < half; ++i) {
      const double th = double(pos) * std::pow(kTheta, -2.0 * double(i) / double(kRot));
      const double a = v[i], b = v[i + half];
      v[i] = a * std::cos(th) - b * std::sin(th);
      v[i + half] = b * std::cos(th) + a * std::sin(th);
    }
  }

  std::vector<Vec> attention(const std::string& s, const std::vector<Vec>& xn) const {
    const size_t T = xn.size();
    const int64_t D = kHeadDim;
    std::vector<Vec> q(T), gate(T), k(T), v(T), out(T);
    for (size_t t = 0; t < T; ++t) {
      const Vec qg =
          matvec(w(s + "q_proj.weight"), 2 * kHeads * D, kHidden, xn[t]);  // per head [query | gate]
      for (int64_t h = 0; h < kHeads; ++h) {
        Vec qh = norm(qg, w(s + "q_norm.weight"), size_t(h * 2 * D), size_t(D));
        rope(qh.data(), int64_t(t));
        q[t].insert(q[t].end(), qh.begin(), qh.end());
        gate[t].insert(gate[t].end(), qg.begin() + h * 2 * D + D, qg.begin() + (h + 1) * 2 * D);
      }
      const Vec kr = matvec(w(s + "k_proj.weight"), kKvHeads * D, kHidden, xn[t]);
      v[t] = matvec(w(s + "v_proj.weight"), kKvHeads * D, kHidden, xn[t]);
      for (int64_t h = 0; h < kKvHeads; ++h) {
        Vec kh = norm(kr, w(s + "k_norm.weight"), size_t(h * D), size_t(D));
        rope(kh.data(), int64_t(t));
        k[t].insert(k[t].end(), kh.begin(), kh.end());
      }
      for (double& e : k[t]) e = f16(e);
      for (double& e : v[t]) e = f16(e);
    }
    for (size_t t = 0; t < T; ++t) {
      Vec o(size_t(kHeads * D), 0.0);
      for (int64_t h = 0; h < kHeads; ++h) {
        const int64_t g = h / (kHeads / kKvHeads);
        Vec score(t + 1);
        double mx = -1e300, sum = 0;
        for (size_t j = 0; j <= t; ++j) {
          double d = 0;
          for (int64_t i = 0; i < D; ++i) d += q[t][size_t(h * D + i)] * k[j][size_t(g * D + i)];
          score[j] = d / std::sqrt(double(D));
          mx = std::max(mx, score[j]);
        }
        for (double& e : score) sum += (e = std::exp(e - mx));
        for (size_t j = 0; j <= t; ++j) {
          for (int64_t i = 0; i < D; ++i) o[size_t(h * D + i)] += score[j] / sum * v[j][size_t(g * D + i)];
        }
      }
      for (size_t i = 0; i < o.size(); ++i) o[i] *= sigmoid(gate[t][i]);
      out[t] = matvec(w(s + "o_proj.weight"), kHidden, kHeads * D, o);
    }
    return out;
  }

  // Qwen3_5GatedDeltaNet: V head h reads K head h / r (grouped order).
  std::vector<Vec> delta_net(const std::string& a, const std::vector<Vec>& xn) const {
    const size_t T = xn.size();
    const int64_t r = kNv / kNk;
    std::vector<Vec> mixed(T), z(T), beta(T), g(T), out(T);
    const auto& conv = w(a + "conv1d.weight");  // [conv_dim, 1, K]
    const auto& a_log = w(a + "A_log");
    const auto& dt_bias = w(a + "dt_bias");
    for (size_t t = 0; t < T; ++t) {
      mixed[t] = matvec(w(a + "in_proj_qkv.weight"), kConvDim, kHidden, xn[t]);
      z[t] = matvec(w(a + "in_proj_z.weight"), kNv * kDv, kHidden, xn[t]);
      const Vec b = matvec(w(a + "in_proj_b.weight"), kNv, kHidden, xn[t]);
      const Vec al = matvec(w(a + "in_proj_a.weight"), kNv, kHidden, xn[t]);
      for (int64_t h = 0; h < kNv; ++h) {
        beta[t].push_back(sigmoid(b[size_t(h)]));
        const double sp = std::log1p(std::exp(al[size_t(h)] + double(dt_bias[size_t(h)])));
        g[t].push_back(-std::exp(double(a_log[size_t(h)])) * sp);
      }
    }
    std::vector<Vec> S(size_t(kNv), Vec(size_t(kDk * kDv), 0.0));  // [k][v]
    for (size_t t = 0; t < T; ++t) {
      Vec c(size_t(kConvDim), 0.0);
      for (int64_t ch = 0; ch < kConvDim; ++ch) {
        for (int64_t j = 0; j < kConvK; ++j) {
          const int64_t src = int64_t(t) - (kConvK - 1) + j;
          if (src >= 0)
            c[size_t(ch)] += double(conv[size_t(ch * kConvK + j)]) * mixed[size_t(src)][size_t(ch)];
        }
        c[size_t(ch)] = silu(c[size_t(ch)]);
      }
      auto l2 = [&](int64_t offset) {
        Vec v(c.begin() + offset, c.begin() + offset + kDk);
        double ss = 0;
        for (double e : v) ss += e * e;
        for (double& e : v) e /= std::sqrt(ss + 1e-6);
        return v;
      };
      Vec o(size_t(kNv * kDv));
      for (int64_t h = 0; h < kNv; ++h) {
        const int64_t kh = h / r;
        Vec qv = l2(kh * kDk), kv = l2(kNk * kDk + kh * kDk);
        for (double& e : qv) e /= std::sqrt(double(kDk));
        const double* vv = c.data() + kQkDim + h * kDv;
        Vec& s = S[size_t(h)];
        for (double& e : s) e *= std::exp(g[t][size_t(h)]);
        for (int64_t j = 0; j < kDv; ++j) {
          double mem = 0;
          for (int64_t i = 0; i < kDk; ++i) mem += s[size_t(i * kDv + j)] * kv[size_t(i)];
          const double delta = beta[t][size_t(h)] * (vv[j] - mem);
          for (int64_t i = 0; i < kDk; ++i) s[size_t(i * kDv + j)] += kv[size_t(i)] * delta;
        }
        for (int64_t j = 0; j < kDv; ++j) {
          double e = 0;
          for (int64_t i = 0; i < kDk; ++i) e += s[size_t(i * kDv + j)] * qv[size_t(i)];
          o[size_t(h * kDv + j)] = e;
        }
        // Qwen3_5RMSNormGated: w ⊙ rmsnorm(o) ⊙ silu(z), per head, plain weight.
        double ss = 0;
        for (int64_t j = 0; j < kDv; ++j) ss += o[size_t(h * kDv + j)] * o[size_t(h * kDv + j)];
        const double rs = 1.0 / std::sqrt(ss / double(kDv) + kEps);
        for (int64_t j = 0; j < kDv; ++j) {
          o[size_t(h * kDv + j)] *=
              rs * double(w(a + "norm.weight")[size_t(j)]) * silu(z[t][size_t(h * kDv + j)]);
        }
      }
      out[t] = matvec(w(a + "out_proj.weight"), kHidden, kNv * kDv, o);
    }
    return out;
  }

  Vec mlp(const std::string& p, const std::string& infix, int64_t F, const Vec& x) const {
    Vec gate = matvec(w(p + infix + "gate_proj.weight"), F, kHidden, x);
    const Vec up = matvec(w(p + infix + "up_proj.weight"), F, kHidden, x);
    for (int64_t i = 0; i < F; ++i) gate[size_t(i)] = silu(gate[size_t(i)]) * up[size_t(i)];
    return matvec(w(p + infix + "down_proj.weight"), kHidden, F, gate);
  }

  Vec moe(const std::string& p, const Vec& x) const {
    Vec prob = matvec(w(p + "gate.weight"), kExperts, kHidden, x);
    const double mx = *std::max_element(prob.begin(), prob.end());
    for (double& e : prob) e = std::exp(e - mx);
    std::vector<int64_t> order(static_cast<size_t>(kExperts));
    for (int64_t e = 0; e < kExperts; ++e) order[size_t(e)] = e;
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t l, int64_t r) { return prob[size_t(l)] > prob[size_t(r)]; });
    double top = 0;
    for (int64_t j = 0; j < kTopK; ++j) top += prob[size_t(order[size_t(j)])];
    Vec y(size_t(kHidden), 0.0);
    for (int64_t j = 0; j < kTopK; ++j) {
      const int64_t e = order[size_t(j)];
      const Vec o = mlp(p, fmt::format("experts.{}.", e), kExpertFf, x);
      for (int64_t i = 0; i < kHidden; ++i) y[size_t(i)] += prob[size_t(e)] / top * o[size_t(i)];
    }
    const double gs = sigmoid(matvec(w(p + "shared_expert_gate.weight"), 1, kHidden, x)[0]);
    const Vec sh = mlp(p, "shared_expert.", kSharedFf, x);
    for (int64_t i = 0; i < kHidden; ++i) y[size_t(i)] += gs * sh[size_t(i)];
    return y;
  }

  const TinyQwen35& m_;
  Options o_;
};

// ---- fixture ----

class HfConvertQwen35 : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::replace(name.begin(), name.end(), '/', '_');
    dir_ = fs::temp_directory_path() / ("moeserve_hf35_" + name);
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string out_path() const { return (dir_ / "out.gguf").string(); }

  Result<ConvertSummary> convert(FileType type) {
    ConvertOptions options;
    options.hf_dir = (dir_ / "hf").string();
    options.output_path = out_path();
    options.file_type = type;
    options.threads = 2;
    options.progress = ProgressOptions::Mode::kOff;
    return convert_hf_model(options);
  }

  // Every GGUF tensor equals its expected contents (exactly: f32 output).
  void expect_tensors(const GgufFile& gguf, const TinyQwen35& model, const Options& o) {
    const auto expected = expected_tensors(model, o);
    EXPECT_EQ(gguf.tensors().size(), expected.size());
    for (const auto& [name, want] : expected) {
      const GgufTensorInfo* t = gguf.find_tensor(name);
      ASSERT_NE(t, nullptr) << name;
      EXPECT_EQ(std::vector<int64_t>(t->ne, t->ne + t->n_dims), want.ne) << name;
      EXPECT_EQ(gguf_values(*t), want.values) << name;
    }
  }

  // The engine's logits on the converted file against the HF-order forward.
  void expect_forward_matches(const TinyQwen35& model, const Options& o) {
    runtime::ModelLoadOptions lo;
    lo.n_threads = 2;
    lo.device = "cpu";
    auto m = runtime::Model::load(out_path(), lo);
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    std::mt19937 rng(11);
    std::vector<int32_t> tokens(12);
    for (int32_t& t : tokens) t = int32_t(rng() % uint32_t(kVocab));
    const int64_t V = (*m)->info().n_vocab;
    ASSERT_EQ(V, kVocab);
    std::vector<float> got(tokens.size() * size_t(V));
    std::vector<int64_t> rows(tokens.size());
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = int64_t(i);
    runtime::KvCache kv = (*m)->new_kv_cache(64).value();
    auto ws = (*m)->new_workspace(int64_t(tokens.size())).value();
    models::ForwardBatch b;
    b.tokens = tokens;
    b.kv = kv.view();
    b.logit_rows = rows;
    b.logits = got.data();
    const Status st = (*m)->net().forward(b, *ws);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    const std::vector<float> want = HfForward(model, o).logits(tokens);
    double diff = 0, scale = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_TRUE(std::isfinite(got[i])) << i;
      diff = std::max(diff, double(std::fabs(got[i] - want[i])));
      scale = std::max(scale, double(std::fabs(want[i])));
    }
    EXPECT_LT(diff / scale, 1e-3) << "max |logit difference| " << diff << " of max |logit| " << scale;
    std::printf("[ qwen35 convert ] engine vs HF-order forward: %.2e relative (max |logit| %.3f)\n",
                diff / scale, scale);
  }

  fs::path dir_;
};

TEST(Qwen35VHeadOrder, GroupedToTiled) {
  EXPECT_EQ(qwen35_v_head_order(2, 4), kTiled);
  EXPECT_EQ(qwen35_v_head_order(2, 6), (std::vector<int64_t>{0, 3, 1, 4, 2, 5}));  // r = 3
  EXPECT_EQ(qwen35_v_head_order(4, 4), (std::vector<int64_t>{0, 1, 2, 3}));
}

class HfConvertQwen35Moe : public HfConvertQwen35, public ::testing::WithParamInterface<Experts> {};

TEST_P(HfConvertQwen35Moe, KeysTensorsAndForward) {
  const Options o{.moe = true, .experts = GetParam()};
  TinyQwen35 model(o);
  model.write(dir_ / "hf");
  auto summary = convert(FileType::kF32);
  ASSERT_TRUE(summary.is_ok()) << summary.status().to_string();
  EXPECT_EQ(summary->arch, "qwen35moe");
  EXPECT_TRUE(summary->notes.empty());

  auto gguf = GgufFile::open(out_path());
  ASSERT_TRUE(gguf.is_ok()) << gguf.status().to_string();
  const std::string a = "qwen35moe.";
  EXPECT_EQ(gguf->architecture(), "qwen35moe");
  EXPECT_EQ(gguf->get_int(a + "block_count"), kLayers);
  EXPECT_EQ(gguf->get_int(a + "context_length"), 256);
  EXPECT_EQ(gguf->get_int(a + "embedding_length"), kHidden);
  EXPECT_FALSE(gguf->has(a + "feed_forward_length"));  // no intermediate_size in a MoE text config
  EXPECT_EQ(gguf->get_int(a + "attention.head_count"), kHeads);
  EXPECT_EQ(gguf->get_int(a + "attention.head_count_kv"), kKvHeads);
  EXPECT_EQ(gguf->get_int(a + "attention.key_length"), kHeadDim);
  EXPECT_EQ(gguf->get_int(a + "attention.value_length"), kHeadDim);
  EXPECT_FLOAT_EQ(float(gguf->get_float(a + "attention.layer_norm_rms_epsilon").value_or(0)), 1e-6f);
  EXPECT_FLOAT_EQ(float(gguf->get_float(a + "rope.freq_base").value_or(0)), float(kTheta));
  EXPECT_EQ(gguf->get_int(a + "rope.dimension_count"), kRot);
  EXPECT_EQ(gguf->get_int_array(a + "rope.dimension_sections"), (std::vector<int64_t>{2, 1, 1, 0}));
  EXPECT_EQ(gguf->get_int(a + "ssm.conv_kernel"), kConvK);
  EXPECT_EQ(gguf->get_int(a + "ssm.state_size"), kDk);
  EXPECT_EQ(gguf->get_int(a + "ssm.group_count"), kNk);
  EXPECT_EQ(gguf->get_int(a + "ssm.time_step_rank"), kNv);
  EXPECT_EQ(gguf->get_int(a + "ssm.inner_size"), kNv * kDv);
  EXPECT_EQ(gguf->get_int(a + "full_attention_interval"), kInterval);
  EXPECT_EQ(gguf->get_int(a + "expert_count"), kExperts);
  EXPECT_EQ(gguf->get_int(a + "expert_used_count"), kTopK);
  EXPECT_EQ(gguf->get_int(a + "expert_feed_forward_length"), kExpertFf);
  EXPECT_EQ(gguf->get_int(a + "expert_shared_feed_forward_length"), kSharedFf);
  EXPECT_FALSE(gguf->has(a + "nextn_predict_layers"));
  EXPECT_EQ(gguf->get_string("tokenizer.ggml.pre"), "qwen35");
  EXPECT_EQ(gguf->get_int("tokenizer.ggml.eos_token_id"), 258);

  // Names, shapes and every value through the transforms.
  expect_tensors(*gguf, model, o);
  EXPECT_EQ(gguf->find_tensor("blk.0.ssm_conv1d.weight")->shape_string(), "[4, 96]");
  EXPECT_EQ(gguf->find_tensor("blk.1.ffn_gate_inp_shexp.weight")->shape_string(), "[32]");
  EXPECT_EQ(gguf->find_tensor("blk.2.ssm_a")->shape_string(), "[4]");
  EXPECT_EQ(gguf->find_tensor("blk.1.attn_q.weight")->shape_string(), "[32, 64]");
  EXPECT_EQ(gguf->find_tensor("blk.1.ssm_a"), nullptr);  // full-attention layer
  EXPECT_EQ(gguf->find_tensor("blk.0.attn_q.weight"), nullptr);
  // The transforms spelled out on single values (layer 0, HF V head 2 is GGUF head 1).
  const auto values = [&](const std::string& n) { return gguf_values(*gguf->find_tensor(n)); };
  const std::string la = "model.layers.0.linear_attn.";
  EXPECT_EQ(values("blk.0.ssm_a")[1], -std::exp(model.w(la + "A_log")[2]));
  EXPECT_EQ(values("blk.0.ssm_dt.bias")[1], model.w(la + "dt_bias")[2]);
  EXPECT_EQ(values("blk.0.attn_norm.weight")[5], model.w("model.layers.0.input_layernorm.weight")[5] + 1.0f);
  EXPECT_EQ(values("blk.1.attn_k_norm.weight")[3],
            model.w("model.layers.1.self_attn.k_norm.weight")[3] + 1.0f);
  EXPECT_EQ(values("blk.0.ssm_norm.weight")[3], model.w(la + "norm.weight")[3]);
  // conv channel q0 stays; v channel of GGUF head 1, element 5 is HF head 2's.
  EXPECT_EQ(values("blk.0.ssm_conv1d.weight")[0 * kConvK + 3], model.w(la + "conv1d.weight")[3]);
  const int64_t ch = kQkDim + 1 * kDv + 5, hf_ch = kQkDim + 2 * kDv + 5;
  EXPECT_EQ(values("blk.0.ssm_conv1d.weight")[size_t(ch * kConvK + 2)],
            model.w(la + "conv1d.weight")[size_t(hf_ch * kConvK + 2)]);
  EXPECT_EQ(values("blk.0.attn_qkv.weight")[size_t(ch * kHidden + 7)],
            model.w(la + "in_proj_qkv.weight")[size_t(hf_ch * kHidden + 7)]);
  // out_proj: column (GGUF head 1, element 5) of row 3 is HF column (head 2, element 5).
  EXPECT_EQ(values("blk.0.ssm_out.weight")[size_t(3 * kNv * kDv + 1 * kDv + 5)],
            model.w(la + "out_proj.weight")[size_t(3 * kNv * kDv + 2 * kDv + 5)]);

  expect_forward_matches(model, o);
}

INSTANTIATE_TEST_SUITE_P(Experts, HfConvertQwen35Moe,
                         ::testing::Values(Experts::kPerExpert, Experts::kFused, Experts::kFusedTransposed));

// qwen35 (dense), tied embeddings, the interval from full_attention_interval
// and the default M-RoPE sections.
TEST_F(HfConvertQwen35, DenseTiedKeysTensorsAndForward) {
  const Options o{.moe = false, .tied = true};
  TinyQwen35 model(o);
  model.config().erase("layer_types");
  model.config()["full_attention_interval"] = kInterval;
  model.config()["rope_parameters"].erase("mrope_section");
  model.write(dir_ / "hf");
  auto summary = convert(FileType::kF32);
  ASSERT_TRUE(summary.is_ok()) << summary.status().to_string();
  EXPECT_EQ(summary->arch, "qwen35");
  auto gguf = GgufFile::open(out_path());
  ASSERT_TRUE(gguf.is_ok()) << gguf.status().to_string();
  EXPECT_EQ(gguf->architecture(), "qwen35");
  EXPECT_EQ(gguf->get_int("qwen35.feed_forward_length"), kDenseFf);
  EXPECT_EQ(gguf->get_int("qwen35.full_attention_interval"), kInterval);
  EXPECT_EQ(gguf->get_int_array("qwen35.rope.dimension_sections"), (std::vector<int64_t>{11, 11, 10, 0}));
  EXPECT_FALSE(gguf->has("qwen35.expert_count"));
  EXPECT_EQ(gguf->find_tensor("output.weight"), nullptr);
  expect_tensors(*gguf, model, o);
  expect_forward_matches(model, o);
}

// The released multimodal layout: composite config (text_config), tensors
// under model.language_model., a vision tower and MTP layers (skipped, noted).
TEST_F(HfConvertQwen35, MultimodalCheckpointConvertsTheLanguageModel) {
  const Options o{.moe = true, .experts = Experts::kFused, .multimodal = true};
  TinyQwen35 model(o);
  model.write(dir_ / "hf");
  auto summary = convert(FileType::kF32);
  ASSERT_TRUE(summary.is_ok()) << summary.status().to_string();
  EXPECT_EQ(summary->arch, "qwen35moe");
  ASSERT_EQ(summary->notes.size(), 3u);
  EXPECT_NE(summary->notes[0].find("mtp_num_hidden_layers = 1"), std::string::npos) << summary->notes[0];
  EXPECT_NE(summary->notes[1].find("skipped 2 vision-tower tensors (model.visual.*)"), std::string::npos)
      << summary->notes[1];
  EXPECT_NE(summary->notes[2].find("skipped 2 multi-token-prediction tensors (mtp.*)"), std::string::npos)
      << summary->notes[2];
  auto gguf = GgufFile::open(out_path());
  ASSERT_TRUE(gguf.is_ok()) << gguf.status().to_string();
  EXPECT_FALSE(gguf->has("qwen35moe.nextn_predict_layers"));
  EXPECT_EQ(gguf->get_int("qwen35moe.block_count"), kLayers);
  expect_tensors(*gguf, model, o);
}

// bf16 checkpoint -> bf16 GGUF: matrices bf16 (exact), while norms, ssm_a,
// ssm_dt, ssm_conv1d, the router and the shared-expert gate stay f32.
TEST_F(HfConvertQwen35, Bf16KeepsTheSmallTensorsF32) {
  const Options o{.moe = true, .experts = Experts::kFused, .dtype = DType::BF16};
  TinyQwen35 model(o);
  model.write(dir_ / "hf");
  auto summary = convert(FileType::kBF16);
  ASSERT_TRUE(summary.is_ok()) << summary.status().to_string();
  auto gguf = GgufFile::open(out_path());
  ASSERT_TRUE(gguf.is_ok()) << gguf.status().to_string();
  for (const auto& [name, want] : expected_tensors(model, o)) {
    const GgufTensorInfo* t = gguf->find_tensor(name);
    ASSERT_NE(t, nullptr) << name;
    const bool f32 = t->n_dims == 1 || name.find("ffn_gate_inp") != std::string::npos ||
                     name.find("ssm_conv1d") != std::string::npos;
    EXPECT_EQ(t->type, f32 ? DType::F32 : DType::BF16) << name;
    EXPECT_EQ(gguf_values(*t), want.values) << name;
  }
}

struct ErrorCase {
  const char* what;
  std::function<void(TinyQwen35&)> damage;
  const char* message_part;
};

TEST_F(HfConvertQwen35, BadInputsGiveClearErrors) {
  const std::vector<ErrorCase> cases = {
      {"missing tensor", [](TinyQwen35& m) { m.truth().erase("model.layers.2.linear_attn.A_log"); },
       "tensor 'model.layers.2.linear_attn.A_log' is missing"},
      {"wrong shape",
       [](TinyQwen35& m) {
         m.truth()["model.layers.0.linear_attn.conv1d.weight"].shape = {kConvDim, kConvK};
       },
       "tensor 'model.layers.0.linear_attn.conv1d.weight' has shape [96, 4], config.json implies [96, 1, 4]"},
      {"wrong shared gate",
       [](TinyQwen35& m) { m.truth()["model.layers.1.mlp.shared_expert_gate.weight"].shape = {kHidden}; },
       "tensor 'model.layers.1.mlp.shared_expert_gate.weight' has shape [32], config.json implies [1, 32]"},
      {"unknown tensor",
       [](TinyQwen35& m) {
         m.truth()["model.layers.1.self_attn.mystery.weight"] = {{2}, {1, 2}};
       },
       "not used by the qwen35moe conversion: model.layers.1.self_attn.mystery.weight"},
      {"layer_types not periodic",
       [](TinyQwen35& m) {
         m.config()["layer_types"] = {"linear_attention", "full_attention", "full_attention"};
       },
       "layer_types [\"linear_attention\",\"full_attention\",\"full_attention\"] (layer 2 is "
       "\"full_attention\")"},
      {"layer_types against the interval", [](TinyQwen35& m) { m.config()["full_attention_interval"] = 3; },
       "layer_types"},
      {"layer_types length",
       [](TinyQwen35& m) {
         m.config()["layer_types"] = {"linear_attention", "full_attention"};
       },
       "'layer_types' must be a list of num_hidden_layers (3) entries"},
      {"layer_types entry",
       [](TinyQwen35& m) {
         m.config()["layer_types"] = {"linear_attention", "sliding_attention", "linear_attention"};
       },
       "layer_types entry \"sliding_attention\""},
      {"v heads", [](TinyQwen35& m) { m.config()["linear_num_value_heads"] = 3; },
       "linear_num_value_heads 3"},
      {"bias", [](TinyQwen35& m) { m.config()["attention_bias"] = true; }, "attention_bias"},
      {"yarn", [](TinyQwen35& m) { m.config()["rope_parameters"]["rope_type"] = "yarn"; },
       "rope_parameters.rope_type \"yarn\""},
      {"partial rotary", [](TinyQwen35& m) { m.config()["rope_parameters"]["partial_rotary_factor"] = 0.01; },
       "'partial_rotary_factor'"},
      {"mrope_section",
       [](TinyQwen35& m) {
         m.config()["rope_parameters"]["mrope_section"] = {1, 2, 3, 4, 5};
       },
       "'mrope_section'"},
      {"missing linear key", [](TinyQwen35& m) { m.config().erase("linear_key_head_dim"); },
       "'linear_key_head_dim' is missing"},
      {"ungated attention", [](TinyQwen35& m) { m.config()["attn_output_gate"] = false; },
       "attn_output_gate"},
  };
  for (const ErrorCase& c : cases) {
    TinyQwen35 model({.moe = true});
    c.damage(model);
    fs::remove_all(dir_ / "hf");
    model.write(dir_ / "hf");
    auto summary = convert(FileType::kF16);
    ASSERT_FALSE(summary.is_ok()) << c.what;
    EXPECT_NE(summary.status().message().find(c.message_part), std::string::npos)
        << c.what << ": " << summary.status().to_string();
    EXPECT_FALSE(fs::exists(out_path())) << c.what;
  }
}

}  // namespace
}  // namespace moeserve::convert
