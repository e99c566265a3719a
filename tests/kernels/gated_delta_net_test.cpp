// Gated DeltaNet kernels: the fp32 recurrent form and the whole mixer core
// against double-precision references, the chunked form against the
// recurrent one, split calls against one call, head orders, edge cases.
//
// Tolerances: |got − want| ≤ tol·(|want| + max|want|), tol = 1e-4 for fp32 vs
// double (fp32 sums over d_k ≤ 128 terms, state carried over ≤ 200 tokens:
// errors of ~1e-6 relative, x100 margin for the gated norm, which divides by
// a per-head RMS) and for chunked vs recurrent (different summation order
// and exp of cumulative rather than per-token decays). The recurrent form
// split over several calls does the same operations as one call, so that
// comparison is exact.
#include "kernels/cpu/gated_delta_net.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/cpu/gated_delta_net_reference.h"
#include "ops_test_util.h"

namespace moeserve::cpu {
namespace {

using testing::random_floats;
using testing::random_normal;

constexpr double kTol = 1e-4;

template <typename Want>
void expect_near_rel(const std::vector<float>& got, const std::vector<Want>& want, double tol,
                     const std::string& what) {
  double max_abs = 0.0;
  for (const Want& w : want) max_abs = std::max(max_abs, std::fabs(double(w)));
  testing::expect_close(got, want, tol * max_abs, tol, what);
}

// The packed [T][width] rows of a strided buffer.
std::vector<float> rows(const std::vector<float>& buf, int64_t T, int64_t stride, int64_t width,
                        int64_t t0 = 0) {
  std::vector<float> r;
  for (int64_t t = t0; t < t0 + T; ++t)
    r.insert(r.end(), buf.begin() + t * stride, buf.begin() + t * stride + width);
  return r;
}

std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

void l2_normalise_heads(std::vector<float>& x, int64_t head_dim) {
  for (size_t h = 0; h + size_t(head_dim) <= x.size(); h += size_t(head_dim)) {
    double ss = 0.0;
    for (int64_t i = 0; i < head_dim; ++i) ss += double(x[h + size_t(i)]) * x[h + size_t(i)];
    for (int64_t i = 0; i < head_dim; ++i) x[h + size_t(i)] = float(x[h + size_t(i)] / std::sqrt(ss));
  }
}

GdnHeads make_heads(int64_t nk, int64_t nv, int64_t dk, int64_t dv,
                    GdnHeadOrder order = GdnHeadOrder::kTiled) {
  GdnHeads h;
  h.n_k_heads = nk;
  h.n_v_heads = nv;
  h.head_k_dim = dk;
  h.head_v_dim = dv;
  h.order = order;
  return h;
}

std::string describe(const GdnHeads& h, int64_t T) {
  return "nk=" + std::to_string(h.n_k_heads) + " nv=" + std::to_string(h.n_v_heads) +
         " dk=" + std::to_string(h.head_k_dim) + " dv=" + std::to_string(h.head_v_dim) +
         (h.order == GdnHeadOrder::kTiled ? " tiled" : " grouped") + " T=" + std::to_string(T);
}

// Inputs of the delta rule alone, in padded rows (a kernel that ignores a
// stride fails). g in [−max_decay, 0]: log decays of up to e^−max_decay a token.
struct DeltaData {
  GdnHeads heads;
  int64_t T = 0, qk_stride = 0, v_stride = 0, gate_stride = 0, out_stride = 0;
  std::vector<float> q, k, v, beta, g, state, out;

  DeltaData(const GdnHeads& h, int64_t n_tokens, uint32_t seed, float max_decay = 3.0f)
      : heads(h), T(n_tokens) {
    const int64_t qkw = h.n_k_heads * h.head_k_dim, vw = h.n_v_heads * h.head_v_dim;
    qk_stride = qkw + 3;
    v_stride = vw + 5;
    gate_stride = h.n_v_heads + 1;
    out_stride = vw + 2;
    q = random_normal(T * qk_stride, seed);
    k = random_normal(T * qk_stride, seed + 1);
    for (int64_t t = 0; t < T; ++t) {  // unit q and k heads, as after gdn_l2_norm
      for (auto* x : {&q, &k}) {
        std::vector<float> r(x->begin() + t * qk_stride, x->begin() + t * qk_stride + qkw);
        l2_normalise_heads(r, h.head_k_dim);
        std::copy(r.begin(), r.end(), x->begin() + t * qk_stride);
      }
    }
    v = random_normal(T * v_stride, seed + 2);
    beta = random_floats(T * gate_stride, seed + 3, 0.0f, 1.0f);
    g = random_floats(T * gate_stride, seed + 4, -max_decay, 0.0f);
    state = random_normal(h.ssm_state_floats(), seed + 5, 0.5f);
    out.assign(size_t(std::max<int64_t>(T, 1) * out_stride), 0.0f);
  }

  GdnDeltaRuleArgs args(int64_t chunk = 64, int64_t t0 = 0, int64_t n = -1) {
    GdnDeltaRuleArgs a;
    a.heads = heads;
    a.n_tokens = n < 0 ? T - t0 : n;
    a.q = q.data() + t0 * qk_stride;
    a.k = k.data() + t0 * qk_stride;
    a.qk_stride = qk_stride;
    a.v = v.data() + t0 * v_stride;
    a.v_stride = v_stride;
    a.beta = beta.data() + t0 * gate_stride;
    a.g = g.data() + t0 * gate_stride;
    a.gate_stride = gate_stride;
    a.q_scale = 1.0f / std::sqrt(float(heads.head_k_dim));
    a.state = state.data();
    a.out = out.data() + t0 * out_stride;
    a.out_stride = out_stride;
    a.chunk_size = chunk;
    return a;
  }
  std::vector<float> outputs() const { return rows(out, T, out_stride, heads.n_v_heads * heads.head_v_dim); }
};

// Inputs of the whole mixer core: projection outputs, weights and states.
struct MixerData {
  GdnHeads heads;
  int K = 4;
  int64_t T = 0, qkv_stride = 0, ba_stride = 0, z_stride = 0, out_stride = 0;
  std::vector<float> qkv, b, a, z, out, conv_w, a_neg, dt_bias, norm_w, conv_state, ssm_state;

  MixerData(const GdnHeads& h, int64_t n_tokens, uint32_t seed) : heads(h), T(n_tokens) {
    const int64_t C = h.conv_dim(), nv = h.n_v_heads, vw = nv * h.head_v_dim;
    qkv_stride = C + 7;
    ba_stride = nv + 3;
    z_stride = vw + 1;
    out_stride = vw + 4;
    qkv = random_normal(T * qkv_stride, seed);
    b = random_normal(T * ba_stride, seed + 1);
    a = random_normal(T * ba_stride, seed + 2);
    z = random_normal(T * z_stride, seed + 3);
    out.assign(size_t(std::max<int64_t>(T, 1) * out_stride), 0.0f);
    conv_w = random_floats(C * K, seed + 4, -0.6f, 0.6f);
    a_neg = random_floats(nv, seed + 5, -8.0f, -0.5f);  // −exp(A_log), A in HF's init range
    dt_bias = random_floats(nv, seed + 6, -4.0f, 1.0f);
    norm_w = random_floats(h.head_v_dim, seed + 7, 0.5f, 1.5f);
    conv_state = random_normal((K - 1) * C, seed + 8);
    ssm_state = random_normal(h.ssm_state_floats(), seed + 9, 0.3f);
  }

  GdnMixerArgs args(GdnForm form, int64_t chunk = 64, int64_t t0 = 0, int64_t n = -1) {
    GdnMixerArgs m;
    m.heads = heads;
    m.conv_kernel = K;
    m.conv_weight = conv_w.data();
    m.a_neg = a_neg.data();
    m.dt_bias = dt_bias.data();
    m.norm_weight = norm_w.data();
    m.n_tokens = n < 0 ? T - t0 : n;
    m.qkv = qkv.data() + t0 * qkv_stride;
    m.qkv_stride = qkv_stride;
    m.b = b.data() + t0 * ba_stride;
    m.a = a.data() + t0 * ba_stride;
    m.ba_stride = ba_stride;
    m.z = z.data() + t0 * z_stride;
    m.z_stride = z_stride;
    m.out = out.data() + t0 * out_stride;
    m.out_stride = out_stride;
    m.conv_state = conv_state.data();
    m.ssm_state = ssm_state.data();
    m.form = form;
    m.chunk_size = chunk;
    return m;
  }
  std::vector<float> outputs() const { return rows(out, T, out_stride, heads.n_v_heads * heads.head_v_dim); }
};

const std::vector<GdnHeads>& shapes() {
  static const std::vector<GdnHeads> s = {
      make_heads(2, 4, 16, 24),                          // tiled, d_k ≠ d_v
      make_heads(2, 4, 16, 24, GdnHeadOrder::kGrouped),  // grouped
      make_heads(3, 3, 32, 32),                          // n_v = n_k
      make_heads(1, 4, 8, 8),                            // every V head on one K head
  };
  return s;
}

TEST(GatedDeltaNet, RecurrentMatchesDoubleReference) {
  for (const GdnHeads& h : shapes()) {
    for (float max_decay : {0.05f, 3.0f}) {
      DeltaData d(h, 37, 11, max_decay);
      const GdnReferenceResult want = gdn_delta_rule_reference(d.args());
      ASSERT_TRUE(gdn_delta_rule_recurrent(d.args()).is_ok());
      const std::string what = describe(h, d.T) + " max_decay=" + std::to_string(max_decay);
      expect_near_rel(d.outputs(), want.out, kTol, what + " out");
      expect_near_rel(d.state, want.ssm_state, kTol, what + " state");
    }
  }
}

TEST(GatedDeltaNet, ChunkedMatchesRecurrent) {
  ThreadPool pool(2);
  for (const GdnHeads& h : {make_heads(2, 4, 32, 48), make_heads(2, 4, 32, 48, GdnHeadOrder::kGrouped)}) {
    for (int64_t T : {1, 5, 63, 64, 65, 200}) {
      for (int64_t chunk : {64, 16}) {
        // Strong decays too: cumulative log-decays reach −1000 inside a chunk.
        for (float max_decay : {0.1f, 30.0f}) {
          DeltaData rec(h, T, uint32_t(T), max_decay), chk = rec;
          ASSERT_TRUE(gdn_delta_rule_recurrent(rec.args()).is_ok());
          GdnDeltaRuleArgs args = chk.args(chunk);
          args.pool = &pool;
          ASSERT_TRUE(gdn_delta_rule_chunked(args).is_ok());
          const std::string what =
              describe(h, T) + " chunk=" + std::to_string(chunk) + " max_decay=" + std::to_string(max_decay);
          expect_near_rel(chk.outputs(), to_double(rec.outputs()), kTol, what + " out");
          expect_near_rel(chk.state, to_double(rec.state), kTol, what + " state");
        }
      }
    }
  }
}

TEST(GatedDeltaNet, ChunkedMatchesRecurrentOnQwen35Heads) {
  const GdnHeads h = make_heads(16, 32, 128, 128);
  DeltaData rec(h, 70, 5), chk = rec;
  ASSERT_TRUE(gdn_delta_rule_recurrent(rec.args()).is_ok());
  ASSERT_TRUE(gdn_delta_rule_chunked(chk.args(64)).is_ok());
  expect_near_rel(chk.outputs(), to_double(rec.outputs()), kTol, "35B heads out");
  expect_near_rel(chk.state, to_double(rec.state), kTol, "35B heads state");
}

TEST(GatedDeltaNet, MixerMatchesDoubleReference) {
  std::vector<GdnHeads> all = shapes();
  all.push_back(make_heads(16, 32, 128, 128));  // Qwen3.5/3.6-35B-A3B
  for (const GdnHeads& h : all) {
    for (GdnForm form : {GdnForm::kRecurrent, GdnForm::kChunked}) {
      MixerData m(h, 45, 3);
      const GdnReferenceResult want = gdn_mixer_reference(m.args(form));
      ASSERT_TRUE(gdn_mixer_core(m.args(form, 16)).is_ok());
      const std::string what = describe(h, m.T) + (form == GdnForm::kChunked ? " chunked" : " recurrent");
      expect_near_rel(m.outputs(), want.out, kTol, what + " out");
      expect_near_rel(m.conv_state, want.conv_state, 0.0, what + " conv state");  // a copy of raw inputs
      expect_near_rel(m.ssm_state, want.ssm_state, kTol, what + " ssm state");
    }
  }
}

TEST(GatedDeltaNet, TwoCallsEqualOneCall) {
  const GdnHeads h = make_heads(2, 4, 16, 24);
  for (int64_t split : {1, 2, 20, 44}) {  // 1 and 2: fewer tokens than the conv history
    MixerData one(h, 45, 9), two = one;
    ASSERT_TRUE(gdn_mixer_core(one.args(GdnForm::kRecurrent)).is_ok());
    ASSERT_TRUE(gdn_mixer_core(two.args(GdnForm::kRecurrent, 64, 0, split)).is_ok());
    ASSERT_TRUE(gdn_mixer_core(two.args(GdnForm::kRecurrent, 64, split)).is_ok());
    const std::string what = "recurrent split at " + std::to_string(split);
    EXPECT_EQ(two.outputs(), one.outputs()) << what;
    EXPECT_EQ(two.conv_state, one.conv_state) << what;
    EXPECT_EQ(two.ssm_state, one.ssm_state) << what;
  }
  // Chunked prefill, then decode token by token (the serving pattern).
  MixerData one(h, 45, 10), two = one;
  ASSERT_TRUE(gdn_mixer_core(one.args(GdnForm::kChunked, 16)).is_ok());
  ASSERT_TRUE(gdn_mixer_core(two.args(GdnForm::kChunked, 16, 0, 30)).is_ok());
  for (int64_t t = 30; t < 45; ++t)
    ASSERT_TRUE(gdn_mixer_core(two.args(GdnForm::kRecurrent, 64, t, 1)).is_ok());
  expect_near_rel(two.outputs(), to_double(one.outputs()), kTol, "prefill + decode out");
  EXPECT_EQ(two.conv_state, one.conv_state);
  expect_near_rel(two.ssm_state, to_double(one.ssm_state), kTol, "prefill + decode ssm state");
}

TEST(GatedDeltaNet, ZeroTokensIsANoOp) {
  for (GdnForm form : {GdnForm::kRecurrent, GdnForm::kChunked, GdnForm::kAuto}) {
    MixerData m(make_heads(2, 4, 16, 24), 0, 4);
    const MixerData before = m;
    ASSERT_TRUE(gdn_mixer_core(m.args(form)).is_ok());
    EXPECT_EQ(m.conv_state, before.conv_state);
    EXPECT_EQ(m.ssm_state, before.ssm_state);
  }
  DeltaData d(make_heads(2, 4, 16, 24), 0, 4);
  const std::vector<float> state = d.state;
  ASSERT_TRUE(gdn_delta_rule_recurrent(d.args()).is_ok());
  ASSERT_TRUE(gdn_delta_rule_chunked(d.args()).is_ok());
  EXPECT_EQ(d.state, state);
}

// Spec §2: converting HF to GGUF moves V head g·r + j to j·n_k + g (r =
// n_v/n_k). The grouped kernel on HF-ordered heads and the tiled kernel on the
// permuted heads must agree exactly, head for head.
TEST(GatedDeltaNet, TiledOrderIsGroupedOrderPermuted) {
  const int64_t nk = 3, nv = 6, r = nv / nk, dk = 8, dv = 16;
  DeltaData hf(make_heads(nk, nv, dk, dv, GdnHeadOrder::kGrouped), 12, 21);
  DeltaData gguf = hf;
  gguf.heads.order = GdnHeadOrder::kTiled;
  auto gguf_head = [&](int64_t hf_head) { return (hf_head % r) * nk + hf_head / r; };
  for (int64_t h = 0; h < nv; ++h) {
    const int64_t p = gguf_head(h);
    for (int64_t t = 0; t < hf.T; ++t) {
      std::copy_n(hf.v.begin() + t * hf.v_stride + h * dv, dv, gguf.v.begin() + t * hf.v_stride + p * dv);
      gguf.beta[size_t(t * hf.gate_stride + p)] = hf.beta[size_t(t * hf.gate_stride + h)];
      gguf.g[size_t(t * hf.gate_stride + p)] = hf.g[size_t(t * hf.gate_stride + h)];
    }
    std::copy_n(hf.state.begin() + h * dk * dv, dk * dv, gguf.state.begin() + p * dk * dv);
  }
  ASSERT_TRUE(gdn_delta_rule_recurrent(hf.args()).is_ok());
  ASSERT_TRUE(gdn_delta_rule_recurrent(gguf.args()).is_ok());
  for (int64_t h = 0; h < nv; ++h) {
    const int64_t p = gguf_head(h);
    for (int64_t t = 0; t < hf.T; ++t) {
      for (int64_t j = 0; j < dv; ++j) {
        ASSERT_EQ(gguf.out[size_t(t * hf.out_stride + p * dv + j)],
                  hf.out[size_t(t * hf.out_stride + h * dv + j)])
            << "head " << h << " token " << t;
      }
    }
  }
}

TEST(GatedDeltaNet, ConvKeepsPartOfTheStateForShortInputs) {
  // K = 4, two tokens: the new state is [old row 2, x0, x1]; y0 uses all three old rows.
  const std::vector<float> w = {0.5f, -1.0f, 2.0f, 0.25f};  // one channel
  std::vector<float> state = {1.0f, 2.0f, 3.0f}, x = {4.0f, 5.0f};
  GdnConvArgs a;
  a.x = a.y = x.data();  // in place
  a.n_tokens = 2;
  a.n_channels = 1;
  a.weight = w.data();
  a.state = state.data();
  ASSERT_TRUE(gdn_conv_silu(a).is_ok());
  auto silu = [](double v) { return v / (1.0 + std::exp(-v)); };
  EXPECT_NEAR(x[0], silu(0.5 * 1 - 1.0 * 2 + 2.0 * 3 + 0.25 * 4), 1e-6);
  EXPECT_NEAR(x[1], silu(0.5 * 2 - 1.0 * 3 + 2.0 * 4 + 0.25 * 5), 1e-6);
  EXPECT_EQ(state, (std::vector<float>{3.0f, 4.0f, 5.0f}));
}

TEST(GatedDeltaNet, GatesAndNorms) {
  const float b[2] = {0.0f, 3.0f}, a[2] = {25.0f, -1.0f}, a_neg[2] = {-2.0f, -0.5f},
              dt_bias[2] = {0.0f, 0.5f};
  float beta[2], g[2];
  GdnGateArgs ga;
  ga.b = b;
  ga.a = a;
  ga.a_neg = a_neg;
  ga.dt_bias = dt_bias;
  ga.beta = beta;
  ga.g = g;
  ga.n_tokens = 1;
  ga.n_heads = 2;
  ASSERT_TRUE(gdn_gates(ga).is_ok());
  EXPECT_FLOAT_EQ(beta[0], 0.5f);
  EXPECT_FLOAT_EQ(beta[1], float(1.0 / (1.0 + std::exp(-3.0))));
  EXPECT_FLOAT_EQ(g[0], -50.0f);  // softplus(25) = 25 to fp32 precision
  EXPECT_FLOAT_EQ(g[1], float(-0.5 * std::log1p(std::exp(-0.5))));

  std::vector<float> x = {3.0f, 4.0f, 0.0f, 0.0f};  // second head all zero: eps keeps it finite
  ASSERT_TRUE(gdn_l2_norm({x.data(), 0, 1, 2, 2, 1e-6f}).is_ok());
  EXPECT_NEAR(x[0], 0.6f, 1e-6);
  EXPECT_NEAR(x[1], 0.8f, 1e-6);
  EXPECT_EQ(x[2], 0.0f);

  const std::vector<float> o = {1.0f, -3.0f}, z = {2.0f, -1.0f}, w = {1.5f, 0.5f};
  std::vector<float> y(2);
  GdnGatedNormArgs na;
  na.x = o.data();
  na.z = z.data();
  na.weight = w.data();
  na.y = y.data();
  na.n_tokens = 1;
  na.n_heads = 1;
  na.head_dim = 2;
  ASSERT_TRUE(gdn_gated_norm(na).is_ok());
  const double inv = 1.0 / std::sqrt(5.0 + 1e-6);
  EXPECT_NEAR(y[0], 1.5 * 1.0 * inv * (2.0 / (1.0 + std::exp(-2.0))), 1e-6);
  EXPECT_NEAR(y[1], 0.5 * -3.0 * inv * (-1.0 / (1.0 + std::exp(1.0))), 1e-6);
}

TEST(GatedDeltaNet, RejectsBadShapes) {
  DeltaData d(make_heads(2, 4, 16, 24), 3, 1);
  GdnDeltaRuleArgs a = d.args();
  a.heads.n_v_heads = 5;  // not a multiple of n_k
  EXPECT_EQ(gdn_delta_rule_recurrent(a).code(), StatusCode::kInvalidArgument);
  a = d.args();
  a.qk_stride = 8;  // below n_k·d_k
  EXPECT_EQ(gdn_delta_rule_chunked(a).code(), StatusCode::kInvalidArgument);
  a = d.args();
  a.chunk_size = 0;
  EXPECT_EQ(gdn_delta_rule_chunked(a).code(), StatusCode::kInvalidArgument);
  GdnConvArgs c;
  c.kernel_size = kGdnMaxConvKernel + 1;
  EXPECT_EQ(gdn_conv_silu(c).code(), StatusCode::kInvalidArgument);
}

// Speed on the Qwen3.6-35B-A3B shapes, T = 512 and decode (T = 1), best of 5
// (not run by default):
//   test_kernels --gtest_also_run_disabled_tests --gtest_filter='GatedDeltaNetSpeed*'
TEST(GatedDeltaNetSpeed, DISABLED_Prefill512) {
  const GdnHeads h = make_heads(16, 32, 128, 128);
  struct Variant {
    GdnForm form;
    int64_t chunk;
  };
  for (int threads : {1, 2}) {
    ThreadPool pool(threads);
    DeltaData one(h, 1, 3, 1.0f);
    GdnDeltaRuleArgs a1 = one.args();
    a1.pool = &pool;
    double decode = 1e30;
    for (int rep = 0; rep < 50; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      ASSERT_TRUE(gdn_delta_rule_recurrent(a1).is_ok());
      decode = std::min(decode, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::printf("decode    T=1      threads=%d  delta rule %6.3f ms per layer\n", threads, decode * 1e3);
    for (Variant var :
         {Variant{GdnForm::kRecurrent, 0}, Variant{GdnForm::kChunked, 64}, Variant{GdnForm::kChunked, 32}}) {
      auto time_best = [](auto&& fn) {
        double best = 1e30;
        for (int rep = 0; rep < 5; ++rep) {
          const auto t0 = std::chrono::steady_clock::now();
          fn();
          best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
        return best;
      };
      DeltaData d(h, 512, 1, 1.0f);
      GdnDeltaRuleArgs a = d.args(std::max<int64_t>(var.chunk, 1));
      a.pool = &pool;
      const double rule = time_best([&] {
        ASSERT_TRUE((var.form == GdnForm::kChunked ? gdn_delta_rule_chunked(a) : gdn_delta_rule_recurrent(a))
                        .is_ok());
      });
      const MixerData fresh(h, 512, 2);
      MixerData m = fresh;
      const double mixer = time_best([&] {
        m.qkv = fresh.qkv;  // the core clobbers qkv, b and a
        m.b = fresh.b;
        m.a = fresh.a;
        GdnMixerArgs ma = m.args(var.form, std::max<int64_t>(var.chunk, 1));
        ma.pool = &pool;
        ASSERT_TRUE(gdn_mixer_core(ma).is_ok());
      });
      std::printf("%-9s chunk=%-2lld threads=%d  delta rule %6.1f ms (%5.0f tok/s)  mixer core %6.1f ms\n",
                  var.form == GdnForm::kChunked ? "chunked" : "recurrent", static_cast<long long>(var.chunk),
                  threads, rule * 1e3, 512 / rule, mixer * 1e3);
    }
  }
}

}  // namespace
}  // namespace moeserve::cpu
