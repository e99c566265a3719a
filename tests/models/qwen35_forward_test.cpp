// The qwen35moe / qwen35 forward on the CPU: against a double-precision
// reference written from the spec, prefill == token-by-token decode ==
// chunked prefill, batched == solo, recurrent-state snapshots and the prefix
// cache, and hostile metadata. Models are make-model's tiny presets in f32.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>

#include "convert/make_model.h"
#include "core/half.h"
#include "format/model_keys.h"
#include "forward_test_util.h"
#include "kernels/cpu/gated_delta_net_reference.h"
#include "runtime/model.h"
#include "runtime/prefix_cache.h"
#include "runtime/sequence.h"
#include "test_device.h"

namespace moeserve {
namespace {

namespace fs = std::filesystem;
using convert::ModelArch;
using Vec = std::vector<double>;

using testing::max_abs;
using testing::random_tokens;
using testing::rel_diff;
using testing::run_chunks;

std::string tiny_path(ModelArch arch, const std::function<void(GgufWriter&)>& edit = {}) {
  return testing::tiny_model_path(arch, edit);
}
std::unique_ptr<runtime::Model> load(const std::string& path, const std::string& device = "cpu") {
  return testing::load_model(path, device);
}

// ---- the double-precision reference -------------------------------------

struct Ref {
  const GgufFile& f;
  const convert::ModelShape& s;

  const float* tensor(const std::string& name) const {
    return reinterpret_cast<const float*>(f.find_tensor(name)->data);
  }
  const float* b(int il, std::string_view name, std::string_view suffix = "weight") const {
    return tensor(keys::blk(il, name, suffix));
  }
  static Vec matvec(const float* w, int64_t n_out, int64_t n_in, const Vec& x) {
    Vec y(size_t(n_out), 0.0);
    for (int64_t o = 0; o < n_out; ++o) {
      for (int64_t i = 0; i < n_in; ++i) y[size_t(o)] += double(w[o * n_in + i]) * x[size_t(i)];
    }
    return y;
  }
  Vec rmsnorm(const double* x, int64_t n, const float* w) const {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
    const double r = 1.0 / std::sqrt(ss / double(n) + s.rms_eps);
    Vec y(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) y[size_t(i)] = x[i] * r * double(w[i]);
    return y;
  }
  static double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
  static double silu(double x) { return x * sigmoid(x); }
  Vec swiglu_ffn(const float* g, const float* u, const float* d, int64_t F, const Vec& x) const {
    Vec gate = matvec(g, F, s.n_embd, x), up = matvec(u, F, s.n_embd, x);
    for (int64_t i = 0; i < F; ++i) gate[size_t(i)] = silu(gate[size_t(i)]) * up[size_t(i)];
    return matvec(d, s.n_embd, F, gate);
  }

  // Gated attention over rows xn[0..T) at positions 0..T-1.
  std::vector<Vec> attention(int il, const std::vector<Vec>& xn) const {
    const int64_t T = int64_t(xn.size()), hd = s.head_dim, nh = s.n_head, nkv = s.n_head_kv;
    std::vector<Vec> q(static_cast<size_t>(T)), gate(static_cast<size_t>(T)), k(static_cast<size_t>(T)),
        v(static_cast<size_t>(T)), out(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      const Vec qg = matvec(b(il, keys::kAttnQ), 2 * nh * hd, s.n_embd, xn[size_t(t)]);
      k[size_t(t)] = matvec(b(il, keys::kAttnK), nkv * hd, s.n_embd, xn[size_t(t)]);
      v[size_t(t)] = matvec(b(il, keys::kAttnV), nkv * hd, s.n_embd, xn[size_t(t)]);
      for (int64_t h = 0; h < nh; ++h) {
        Vec qh = rmsnorm(qg.data() + h * 2 * hd, hd, b(il, keys::kAttnQNorm));
        rope(qh.data(), t);
        q[size_t(t)].insert(q[size_t(t)].end(), qh.begin(), qh.end());
        gate[size_t(t)].insert(gate[size_t(t)].end(), qg.begin() + h * 2 * hd + hd,
                               qg.begin() + (h + 1) * 2 * hd);
      }
      for (int64_t h = 0; h < nkv; ++h) {
        Vec kh = rmsnorm(k[size_t(t)].data() + h * hd, hd, b(il, keys::kAttnKNorm));
        rope(kh.data(), t);
        std::copy(kh.begin(), kh.end(), k[size_t(t)].begin() + h * hd);
      }
      for (double& x : k[size_t(t)]) x = fp16_to_fp32(fp32_to_fp16(float(x)));  // the f16 cache
      for (double& x : v[size_t(t)]) x = fp16_to_fp32(fp32_to_fp16(float(x)));
    }
    for (int64_t t = 0; t < T; ++t) {
      Vec o(size_t(nh * hd), 0.0);
      for (int64_t h = 0; h < nh; ++h) {
        const int64_t g = h / (nh / nkv);
        Vec score(static_cast<size_t>(t + 1));
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j <= t; ++j) {
          double d = 0;
          for (int64_t i = 0; i < hd; ++i)
            d += q[size_t(t)][size_t(h * hd + i)] * k[size_t(j)][size_t(g * hd + i)];
          score[size_t(j)] = d / std::sqrt(double(hd));
          mx = std::max(mx, score[size_t(j)]);
        }
        for (double& x : score) sum += (x = std::exp(x - mx));
        for (int64_t j = 0; j <= t; ++j) {
          for (int64_t i = 0; i < hd; ++i)
            o[size_t(h * hd + i)] += score[size_t(j)] / sum * v[size_t(j)][size_t(g * hd + i)];
        }
      }
      for (int64_t i = 0; i < nh * hd; ++i) o[size_t(i)] *= sigmoid(gate[size_t(t)][size_t(i)]);
      out[size_t(t)] = matvec(b(il, keys::kAttnOutput), s.n_embd, nh * hd, o);
    }
    return out;
  }
  void rope(double* x, int64_t pos) const {
    const int64_t half = s.n_rot / 2;
    for (int64_t i = 0; i < half; ++i) {
      const double th = double(pos) * std::pow(s.rope_theta, -2.0 * double(i) / double(s.n_rot));
      const double a = x[i], c = x[i + half];
      x[i] = a * std::cos(th) - c * std::sin(th);
      x[i + half] = c * std::cos(th) + a * std::sin(th);
    }
  }

  // The DeltaNet mixer through the kernels' double reference (its inputs are floats).
  std::vector<Vec> delta_net(int il, const std::vector<Vec>& xn) const {
    const int64_t T = int64_t(xn.size()), cd = s.conv_dim(), nv = s.ssm_n_v_heads, vd = nv * s.ssm_head_v_dim;
    std::vector<float> qkv, z, beta, alpha;
    for (const Vec& x : xn) {
      for (const auto& [name, n, out] :
           {std::tuple{keys::kAttnQkv, cd, &qkv}, std::tuple{keys::kAttnGate, vd, &z},
            std::tuple{keys::kSsmBeta, nv, &beta}, std::tuple{keys::kSsmAlpha, nv, &alpha}}) {
        for (double y : matvec(b(il, name), n, s.n_embd, x)) out->push_back(float(y));
      }
    }
    std::vector<float> conv_state(static_cast<size_t>((s.ssm_conv_kernel - 1) * cd)),
        ssm(static_cast<size_t>(nv * s.ssm_head_k_dim * s.ssm_head_v_dim));
    std::vector<float> out(static_cast<size_t>(T * vd));
    cpu::GdnMixerArgs m;
    m.heads = {s.ssm_n_k_heads, nv, s.ssm_head_k_dim, s.ssm_head_v_dim, cpu::GdnHeadOrder::kTiled};
    m.conv_kernel = int(s.ssm_conv_kernel);
    m.conv_weight = b(il, keys::kSsmConv1d);
    m.a_neg = b(il, keys::kSsmA, "");
    m.dt_bias = b(il, keys::kSsmDt, "bias");
    m.norm_weight = b(il, keys::kSsmNorm);
    m.n_tokens = T;
    m.qkv = qkv.data();
    m.b = beta.data();
    m.a = alpha.data();
    m.z = z.data();
    m.out = out.data();
    m.conv_state = conv_state.data();
    m.ssm_state = ssm.data();
    m.norm_eps = float(s.rms_eps);
    const cpu::GdnReferenceResult r = cpu::gdn_mixer_reference(m);
    std::vector<Vec> o(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      o[size_t(t)] = matvec(b(il, keys::kSsmOut), s.n_embd, vd,
                            Vec(r.out.begin() + t * vd, r.out.begin() + (t + 1) * vd));
    }
    return o;
  }

  Vec moe(int il, const Vec& x) const {
    const int64_t E = s.n_expert, K = s.n_expert_used, H = s.n_embd, F = s.n_ff_exp;
    Vec p = matvec(b(il, keys::kFfnGateInp), E, H, x);
    const double mx = *std::max_element(p.begin(), p.end());
    for (double& v : p) v = std::exp(v - mx);  // softmax up to its sum, which the renormalisation drops
    std::vector<int64_t> order(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) order[size_t(e)] = e;
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t c) { return p[size_t(a)] > p[size_t(c)]; });
    double wsum = 0;
    for (int64_t j = 0; j < K; ++j) wsum += p[size_t(order[size_t(j)])];
    Vec y(size_t(H), 0.0);
    for (int64_t j = 0; j < K; ++j) {
      const int64_t e = order[size_t(j)];
      const Vec o = swiglu_ffn(b(il, keys::kFfnGateExps) + e * H * F, b(il, keys::kFfnUpExps) + e * H * F,
                               b(il, keys::kFfnDownExps) + e * H * F, F, x);
      for (int64_t i = 0; i < H; ++i) y[size_t(i)] += p[size_t(e)] / wsum * o[size_t(i)];
    }
    const double g = sigmoid(matvec(b(il, keys::kFfnGateInpShexp), 1, H, x)[0]);
    const Vec sh = swiglu_ffn(b(il, keys::kFfnGateShexp), b(il, keys::kFfnUpShexp),
                              b(il, keys::kFfnDownShexp), s.n_ff_shexp, x);
    for (int64_t i = 0; i < H; ++i) y[size_t(i)] += g * sh[size_t(i)];
    return y;
  }

  std::vector<float> logits(std::span<const int32_t> tokens) const {
    const int64_t T = int64_t(tokens.size()), H = s.n_embd;
    std::vector<Vec> x(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      const float* row = t_embd() + int64_t(tokens[size_t(t)]) * H;
      x[size_t(t)] = Vec(row, row + H);
    }
    for (int il = 0; il < int(s.n_layer); ++il) {
      std::vector<Vec> xn(static_cast<size_t>(T));
      for (int64_t t = 0; t < T; ++t) xn[size_t(t)] = rmsnorm(x[size_t(t)].data(), H, b(il, keys::kAttnNorm));
      const std::vector<Vec> o = s.is_full_attention_layer(il) ? attention(il, xn) : delta_net(il, xn);
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t i = 0; i < H; ++i) x[size_t(t)][size_t(i)] += o[size_t(t)][size_t(i)];
        const Vec h = rmsnorm(x[size_t(t)].data(), H, b(il, keys::kPostAttentionNorm));
        const Vec f = s.is_moe() ? moe(il, h)
                                 : swiglu_ffn(b(il, keys::kFfnGate), b(il, keys::kFfnUp),
                                              b(il, keys::kFfnDown), s.n_ff, h);
        for (int64_t i = 0; i < H; ++i) x[size_t(t)][size_t(i)] += f[size_t(i)];
      }
    }
    std::vector<float> out;
    for (int64_t t = 0; t < T; ++t) {
      const Vec h = rmsnorm(x[size_t(t)].data(), H, tensor(std::string(keys::kOutputNorm)));
      for (double v : matvec(tensor(std::string(keys::kOutput)), s.n_vocab, H, h)) out.push_back(float(v));
    }
    return out;
  }
  const float* t_embd() const { return tensor(std::string(keys::kTokenEmbd)); }
};

class Qwen35Forward : public ::testing::TestWithParam<ModelArch> {};

TEST_P(Qwen35Forward, MatchesTheDoublePrecisionReference) {
  auto m = load(tiny_path(GetParam()));
  ASSERT_TRUE(m);
  const convert::ModelShape shape = convert::model_preset(GetParam(), "tiny").value();
  const std::vector<int32_t> tokens = random_tokens(24, m->info().n_vocab, 1);
  runtime::KvCache kv = m->new_kv_cache(64).value();
  const std::vector<float> got = run_chunks(*m, tokens, 24, kv);
  const std::vector<float> want = Ref{m->file(), shape}.logits(tokens);
  const double d = rel_diff(want, got);
  EXPECT_LT(d, 2e-4) << "max |logit difference| / max |logit|";
  std::printf("[ qwen35 ] %s tiny vs double reference: %.2e (max |logit| %.3f)\n",
              std::string(convert::arch_name(GetParam())).c_str(), d, max_abs(want));
}

TEST_P(Qwen35Forward, PrefillEqualsDecodeEqualsChunkedPrefill) {
  auto m = load(tiny_path(GetParam()));
  ASSERT_TRUE(m);
  const std::vector<int32_t> tokens = random_tokens(70, m->info().n_vocab, 2);
  runtime::KvCache a = m->new_kv_cache(128).value(), b = m->new_kv_cache(128).value(),
                   c = m->new_kv_cache(128).value();
  const std::vector<float> prefill = run_chunks(*m, tokens, 70, a);  // chunked DeltaNet form
  const std::vector<float> decode = run_chunks(*m, tokens, 1, b);    // recurrent form
  const std::vector<float> chunks = run_chunks(*m, tokens, 23, c);
  EXPECT_LT(rel_diff(decode, prefill), 1e-4);
  EXPECT_LT(rel_diff(decode, chunks), 1e-4);
}

TEST_P(Qwen35Forward, BatchedSequencesEqualSolo) {
  auto m = load(tiny_path(GetParam()));
  ASSERT_TRUE(m);
  const int64_t V = m->info().n_vocab;
  const std::vector<int32_t> ta = random_tokens(20, V, 3), tb = random_tokens(13, V, 4);
  runtime::KvCache sa = m->new_kv_cache(64).value(), sb = m->new_kv_cache(64).value();
  const std::vector<float> solo_a = run_chunks(*m, ta, 20, sa), solo_b = run_chunks(*m, tb, 13, sb);
  runtime::KvCache ba = m->new_kv_cache(64).value(), bb = m->new_kv_cache(64).value();
  std::vector<int32_t> tokens = ta;
  tokens.insert(tokens.end(), tb.begin(), tb.end());
  const std::vector<int64_t> rows = {19, 32};
  std::vector<float> logits(2 * size_t(V));
  const models::SequenceSlice slices[] = {{0, 20, 0, ba.view()}, {20, 13, 0, bb.view()}};
  models::ForwardBatch batch;
  batch.tokens = tokens;
  batch.sequences = slices;
  batch.logit_rows = rows;
  batch.logits = logits.data();
  auto ws = m->new_workspace(33).value();
  ASSERT_TRUE(m->net().forward(batch, *ws).is_ok());
  EXPECT_LT(rel_diff(std::span(solo_a).subspan(19 * size_t(V), size_t(V)),
                     std::span(logits).first(static_cast<size_t>(V))),
            1e-5);
  EXPECT_LT(rel_diff(std::span(solo_b).subspan(12 * size_t(V), size_t(V)),
                     std::span(logits).subspan(static_cast<size_t>(V))),
            1e-5);
}

TEST_P(Qwen35Forward, SnapshotRestoreGivesIdenticalContinuations) {
  auto m = load(tiny_path(GetParam()));
  ASSERT_TRUE(m);
  const int64_t V = m->info().n_vocab;
  runtime::Sequence seq(m->new_kv_cache(64).value());
  const std::vector<int32_t> prompt = random_tokens(18, V, 5), cont = random_tokens(6, V, 6);
  run_chunks(*m, prompt, 18, seq.kv());
  seq.append(prompt);
  Result<runtime::Sequence::Snapshot> snap = seq.snapshot();
  ASSERT_TRUE(snap.is_ok());
  const std::vector<float> first = run_chunks(*m, cont, 1, seq.kv(), seq.position());
  seq.append(cont);
  ASSERT_TRUE(seq.restore(*snap).is_ok());
  EXPECT_EQ(seq.position(), 18);
  const std::vector<float> again = run_chunks(*m, cont, 1, seq.kv(), seq.position());
  EXPECT_EQ(first, again);  // same state, same path: bit for bit
  // A recurrent cache cannot be cut back: rewinding starts it over.
  seq.append(cont);
  seq.rewind(10);
  EXPECT_EQ(seq.position(), 0);
  // ...and a snapshot of other tokens is refused.
  const std::vector<int32_t> other = random_tokens(20, V, 7);
  run_chunks(*m, other, 20, seq.kv());
  seq.append(other);
  EXPECT_FALSE(seq.restore(*snap).is_ok());
  EXPECT_EQ(seq.position(), 20);
}

TEST_P(Qwen35Forward, PrefixCacheRestoresTheRecurrentState) {
  auto m = load(tiny_path(GetParam()));
  ASSERT_TRUE(m);
  const int64_t V = m->info().n_vocab;
  const std::vector<int32_t> tokens = random_tokens(30, V, 8);
  runtime::KvCache full = m->new_kv_cache(64).value();
  const std::vector<float> want = run_chunks(*m, tokens, 30, full);

  runtime::PrefixCache cache(64 << 20);
  runtime::KvCache first = m->new_kv_cache(64).value();
  run_chunks(*m, std::span(tokens).first(20), 20, first);
  cache.store(std::span(tokens).first(20), first);

  runtime::KvCache miss = m->new_kv_cache(64).value();  // shares 12 tokens only: the state is not there
  std::vector<int32_t> diverging(tokens.begin(), tokens.begin() + 12);
  diverging.push_back((tokens[12] + 1) % int32_t(V));
  EXPECT_EQ(cache.restore(diverging, 12, miss), 0);

  runtime::KvCache hit = m->new_kv_cache(64).value();
  ASSERT_EQ(cache.restore(tokens, 29, hit), 20);
  const std::vector<float> rest = run_chunks(*m, std::span(tokens).subspan(20), 10, hit, 20);
  EXPECT_LT(rel_diff(std::span(want).subspan(20 * size_t(V)), rest), 1e-4);
}

// The same forward on a GPU (MOESERVE_TEST_DEVICE=cuda on the GPU machine):
// prefill (several sequences in one batch) and decode steps against the CPU.
TEST_P(Qwen35Forward, GpuEqualsCpu) {
  if (testing::test_device() == "cpu") GTEST_SKIP() << "MOESERVE_TEST_DEVICE is not a GPU";
  const std::string path = tiny_path(GetParam());
  auto cpu = load(path), gpu = load(path, testing::test_device());
  ASSERT_TRUE(cpu && gpu);
  const std::vector<int32_t> tokens = random_tokens(40, cpu->info().n_vocab, 9);
  runtime::KvCache kc = cpu->new_kv_cache(64).value(), kg = gpu->new_kv_cache(64).value();
  const std::vector<float> want = run_chunks(*cpu, tokens, 17, kc);
  const std::vector<float> got = run_chunks(*gpu, tokens, 17, kg);
  const double prefill = rel_diff(want, got);
  runtime::KvCache dc = cpu->new_kv_cache(64).value(), dg = gpu->new_kv_cache(64).value();
  const double decode = rel_diff(run_chunks(*cpu, tokens, 1, dc), run_chunks(*gpu, tokens, 1, dg));
  EXPECT_LT(prefill, 2e-3);
  EXPECT_LT(decode, 2e-3);
  std::printf("[ qwen35 gpu ] %s: GPU vs CPU max |dlogit| / max |logit|: prefill %.2e, decode %.2e\n",
              std::string(convert::arch_name(GetParam())).c_str(), prefill, decode);
}

INSTANTIATE_TEST_SUITE_P(Archs, Qwen35Forward, ::testing::Values(ModelArch::kQwen35Moe, ModelArch::kQwen35),
                         [](const auto& info) { return std::string(convert::arch_name(info.param)); });

// attention.recurrent_layers (llama.cpp's per-layer flags) that agree with
// the interval give the same model.
TEST(Qwen35Load, RecurrentLayerFlagsOverrideTheInterval) {
  auto interval = load(tiny_path(ModelArch::kQwen35Moe));
  auto flags = load(tiny_path(ModelArch::kQwen35Moe, [](GgufWriter& w) {
    w.set_bool_array("qwen35moe.attention.recurrent_layers", {true, true, true, false});
  }));
  ASSERT_TRUE(interval && flags);
  const std::vector<int32_t> tokens = random_tokens(12, interval->info().n_vocab, 3);
  runtime::KvCache a = interval->new_kv_cache(16).value(), b = flags->new_kv_cache(16).value();
  EXPECT_EQ(run_chunks(*interval, tokens, 12, a), run_chunks(*flags, tokens, 12, b));
}

// Hostile metadata: a clear error naming the key or tensor, no model.
TEST(Qwen35Load, BadMetadataFailsCleanly) {
  const std::string a = "qwen35moe.";
  struct Case {
    std::function<void(GgufWriter&)> edit;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {[&](GgufWriter& w) { w.set_u32(a + "ssm.time_step_rank", 3); }, "ssm.time_step_rank"},
      {[&](GgufWriter& w) { w.set_u32(a + "ssm.inner_size", 250); }, "ssm.inner_size"},
      {[&](GgufWriter& w) { w.set_u32(a + "ssm.conv_kernel", 9); }, "ssm.conv_kernel"},
      {[&](GgufWriter& w) { w.set_u32(a + "ssm.state_size", 32); }, "attn_qkv"},
      {[&](GgufWriter& w) { w.erase(a + "ssm.group_count"); }, "ssm.group_count"},
      {[&](GgufWriter& w) { w.set_u32(a + "nextn_predict_layers", 4); }, "nextn_predict_layers"},
      {[&](GgufWriter& w) { w.set_u32(a + "full_attention_interval", 2); }, "blk.1.attn_q.weight"},
      {[&](GgufWriter& w) { w.set_u32(a + "rope.dimension_count", 66); }, "rope.dimension_count"},
      {[&](GgufWriter& w) {
         w.set_bool_array(a + "attention.recurrent_layers", {true, true, true});
       },
       "attention.recurrent_layers"},
      {[&](GgufWriter& w) {
         w.set_bool_array(a + "attention.recurrent_layers", {true, true, false, false});
       },
       "blk.2.attn_q.weight"},
  };
  for (const Case& c : cases) {
    const std::string path = tiny_path(ModelArch::kQwen35Moe, c.edit);
    runtime::ModelLoadOptions o;
    o.n_threads = 1;
    Result<std::unique_ptr<runtime::Model>> m = runtime::Model::load(path, o);
    ASSERT_FALSE(m.is_ok()) << c.expect;
    EXPECT_NE(m.status().message().find(c.expect), std::string::npos) << m.status().message();
  }
}

}  // namespace
}  // namespace moeserve
