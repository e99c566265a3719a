// The CUDA MoE routing and combine (kernels/cuda/moe.h) vs the plain CPU
// reference: softmax_ref + top_k_ref + renormalisation (as qwen3.cpp's
// moe_block), or sigmoid gating with a selection bias, with and without
// renormalisation, times a weight scale (as backend.h's RouteOpArgs), and a
// counting sort of the (token, slot) pairs by expert. Decode (one launch)
// and prefill sizes (chunked), odd expert counts, exact ties, masked (-inf)
// experts, a NaN row; outputs (the probabilities too) and scratch poisoned.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/moe.h"
#include "kernels_gpu/cuda/gpu_test_util.h"

namespace moeserve {
namespace {

using testing::DeviceArray;
using testing::random_floats;

const cpu::CpuKernels& ref() { return *cpu::cpu_kernels_for(cpu::SimdLevel::kReference); }

struct RouteCase {
  int64_t n_tokens, n_expert, n_used;
};

// Router logits without near-ties: each token ranks its experts by a random
// permutation, neighbours 6/E apart in logit (>= 1% apart in probability,
// far above the few-ulp softmax differences). Some tokens get exact ties
// (the top two; the k-th and (k+1)-th), some masked experts (-inf), and the
// last token of longer batches a NaN (which makes its whole row NaN).
std::vector<float> router_logits(const RouteCase& c, uint32_t seed) {
  const int64_t T = c.n_tokens, E = c.n_expert, K = c.n_used;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> shift(-2.0f, 2.0f);
  std::vector<float> logits(size_t(T * E));
  std::vector<int32_t> by_rank(static_cast<size_t>(E));  // by_rank[r]: the expert of rank r (0 = smallest)
  for (int64_t t = 0; t < T; ++t) {
    float* l = logits.data() + t * E;
    std::iota(by_rank.begin(), by_rank.end(), 0);
    std::shuffle(by_rank.begin(), by_rank.end(), rng);
    const float base = shift(rng);
    for (int64_t r = 0; r < E; ++r) l[by_rank[size_t(r)]] = base + float(r - E / 2) * (6.0f / float(E));
    if (E >= 2 && t % 3 == 1) l[by_rank[size_t(E - 2)]] = l[by_rank[size_t(E - 1)]];
    if (E > K && t % 5 == 2) l[by_rank[size_t(E - K - 1)]] = l[by_rank[size_t(E - K)]];
    if (t % 7 == 3) {
      for (int64_t r = 0; r < std::min<int64_t>(3, E - 1); ++r) l[by_rank[size_t(r)]] = -INFINITY;
    }
  }
  if (T > 2) logits[size_t((T - 1) * E + E / 2)] = NAN;
  return logits;
}

struct RouteResult {
  std::vector<int32_t> selected;
  std::vector<float> weights;
  std::vector<int32_t> pairs, offsets;
  std::vector<float> probs;
};

// How experts are chosen and weighted (cuda::RouteArgs' gating fields).
struct Gating {
  bool sigmoid = false;
  std::vector<float> bias;  // [n_expert]; empty: none
  bool normalize = true;
  float scale = 1.0f;
};

// Laguna-like: sigmoid, a bias of -0.5, 0 or 0.5 per expert (coarse, so the
// biased scores keep the logits' spacing and their exact ties), weights x 2.5.
Gating sigmoid_gating(int64_t n_expert, bool normalize) {
  Gating g{true, {}, normalize, 2.5f};
  for (int64_t e = 0; e < n_expert; ++e) g.bias.push_back(0.5f * float((e * 7) % 3) - 0.5f);
  return g;
}

std::vector<float> probabilities(const RouteCase& c, std::vector<float> p, const Gating& g) {
  for (int64_t t = 0; t < c.n_tokens; ++t) {
    float* row = p.data() + t * c.n_expert;
    if (g.sigmoid) {
      for (int64_t e = 0; e < c.n_expert; ++e) row[e] = 1.0f / (1.0f + std::exp(-row[e]));
    } else {
      ref().softmax(row, c.n_expert);
    }
  }
  return p;
}

// Top-k of the probabilities (+ bias), their weights, the groups.
RouteResult route_from_probs(const RouteCase& c, std::vector<float> probs, const Gating& g) {
  const int64_t T = c.n_tokens, E = c.n_expert, K = c.n_used;
  RouteResult r;
  r.selected.resize(size_t(T * K));
  r.weights.resize(size_t(T * K));
  r.probs = std::move(probs);
  std::vector<float> key(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const float* p = r.probs.data() + t * E;
    for (int64_t e = 0; e < E; ++e) key[size_t(e)] = g.bias.empty() ? p[e] : p[e] + g.bias[size_t(e)];
    int32_t* ids = r.selected.data() + t * K;
    ref().top_k(key.data(), E, K, ids);
    float sum = 0.0f;
    for (int64_t j = 0; j < K; ++j) sum += p[ids[j]];
    const float scale = g.scale / (g.normalize && sum > 0.0f ? sum : 1.0f);
    for (int64_t j = 0; j < K; ++j) r.weights[size_t(t * K + j)] = p[ids[j]] * scale;
  }
  // Counting sort of the pair ids by expert, ascending within an expert.
  r.offsets.assign(size_t(E + 1), 0);
  for (int32_t e : r.selected) r.offsets[size_t(e + 1)] += 1;
  for (int64_t e = 0; e < E; ++e) r.offsets[size_t(e + 1)] += r.offsets[size_t(e)];
  std::vector<int32_t> next(r.offsets.begin(), r.offsets.end() - 1);
  r.pairs.resize(r.selected.size());
  for (size_t i = 0; i < r.selected.size(); ++i) r.pairs[size_t(next[size_t(r.selected[i])]++)] = int32_t(i);
  return r;
}

RouteResult route_ref(const RouteCase& c, const std::vector<float>& logits, const Gating& g = {}) {
  return route_from_probs(c, probabilities(c, logits, g), g);
}

// probs_in_place: the probabilities overwrite the logits (as CudaOps::route
// asks), else they go to a poisoned buffer of their own.
RouteResult route_gpu(const RouteCase& c, const std::vector<float>& logits, const Gating& g = {},
                      bool probs_in_place = false) {
  const int64_t T = c.n_tokens, E = c.n_expert, K = c.n_used;
  DeviceArray<float> dlogits(logits), dweights(size_t(T * K)), dprobs(logits.size()), dbias(g.bias);
  DeviceArray<int32_t> dsel(size_t(T * K)), dpairs(size_t(T * K)), doffsets(size_t(E + 1));
  DeviceArray<uint8_t> scratch(std::max<size_t>(1, cuda::route_scratch_bytes(T, E)));
  for (auto* d : {&dsel, &dpairs, &doffsets}) d->poison();
  dweights.poison();
  dprobs.poison();
  scratch.poison();  // the kernels must not count on zeroed scratch
  cuda::RouteArgs a;
  a.logits = dlogits.get(), a.n_tokens = T, a.n_expert = E, a.n_used = K;
  a.sigmoid = g.sigmoid, a.selection_bias = g.bias.empty() ? nullptr : dbias.get();
  a.normalize = g.normalize, a.weight_scale = g.scale;
  a.probs = probs_in_place ? dlogits.get() : dprobs.get();
  a.selected = dsel.get(), a.weights = dweights.get(), a.pairs_by_expert = dpairs.get();
  a.expert_offsets = doffsets.get(), a.scratch = scratch.get();
  const Status st = cuda::route_and_group(a, nullptr);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return {dsel.download(), dweights.download(), dpairs.download(), doffsets.download(),
          probs_in_place ? dlogits.download() : dprobs.download()};
}

// Selections and groups exactly; weights and probabilities within a few ulp
// of their size (expf, the softmax sum's order); NaN where the reference has NaN.
void expect_route_matches(const RouteCase& c, const RouteResult& got, const RouteResult& want) {
  for (size_t i = 0; i < want.selected.size(); ++i) {
    ASSERT_EQ(got.selected[i], want.selected[i])
        << "token " << i / size_t(c.n_used) << " slot " << i % size_t(c.n_used);
  }
  auto close = [](const std::vector<float>& g, const std::vector<float>& w, const char* what) {
    ASSERT_EQ(g.size(), w.size());
    for (size_t i = 0; i < w.size(); ++i) {
      if (std::isnan(w[i])) {
        ASSERT_TRUE(std::isnan(g[i])) << what << " " << i;
      } else {
        ASSERT_NEAR(g[i], w[i], 1e-6f * std::max(1.0f, std::abs(w[i]))) << what << " " << i;
      }
    }
  };
  close(got.weights, want.weights, "weight");
  close(got.probs, want.probs, "probability");
  ASSERT_EQ(got.offsets, want.offsets);
  ASSERT_EQ(got.pairs, want.pairs);
}

class RouteGpu : public ::testing::TestWithParam<RouteCase> {};

TEST_P(RouteGpu, MatchesReference) {
  MOESERVE_REQUIRE_GPU();
  const RouteCase c = GetParam();
  const auto logits = router_logits(c, uint32_t(1000 + c.n_tokens + c.n_expert));
  const RouteResult want = route_ref(c, logits);
  expect_route_matches(c, route_gpu(c, logits), want);
}

// Sigmoid gating: top-k of sigmoid + bias, weighted by the unbiased
// sigmoid, renormalised or not, x 2.5; the probabilities replace the logits.
// The probabilities match the CPU's to a few ulp; the selections and weights
// are checked against the reference run on the GPU's own probabilities, as
// a last-ulp difference of expf could flip a near tie of biased scores of
// different bias classes (the softmax test's logits rule those out; a
// per-expert bias cannot).
void check_sigmoid(const RouteCase& c, const std::vector<float>& logits, const Gating& g, bool in_place) {
  const RouteResult got = route_gpu(c, logits, g, in_place);
  const std::vector<float> want_probs = probabilities(c, logits, g);
  ASSERT_EQ(got.probs.size(), want_probs.size());
  for (size_t i = 0; i < want_probs.size(); ++i) {
    if (std::isnan(want_probs[i])) {
      ASSERT_TRUE(std::isnan(got.probs[i])) << "probability " << i;
    } else {
      ASSERT_NEAR(got.probs[i], want_probs[i], 1e-6f) << "probability " << i;
    }
  }
  expect_route_matches(c, got, route_from_probs(c, got.probs, g));
}

TEST_P(RouteGpu, SigmoidWithBiasAndScale) {
  MOESERVE_REQUIRE_GPU();
  const RouteCase c = GetParam();
  const auto logits = router_logits(c, uint32_t(2000 + c.n_tokens + c.n_expert));
  for (bool normalize : {true, false}) {
    SCOPED_TRACE(normalize ? "normalized" : "not normalized");
    check_sigmoid(c, logits, sigmoid_gating(c.n_expert, normalize), /*in_place=*/true);
  }
  Gating no_bias = sigmoid_gating(c.n_expert, true);
  no_bias.bias.clear();
  SCOPED_TRACE("no bias");
  check_sigmoid(c, logits, no_bias, /*in_place=*/false);
}

TEST_P(RouteGpu, IsDeterministic) {
  MOESERVE_REQUIRE_GPU();
  const RouteCase c = GetParam();
  const auto logits = router_logits(c, 77);
  for (const Gating& g : {Gating{}, sigmoid_gating(c.n_expert, true)}) {
    const RouteResult a = route_gpu(c, logits, g), b = route_gpu(c, logits, g);
    EXPECT_EQ(a.selected, b.selected);
    EXPECT_EQ(a.pairs, b.pairs);
    EXPECT_EQ(a.offsets, b.offsets);
    ASSERT_EQ(a.weights.size(), b.weights.size());
    EXPECT_EQ(0, std::memcmp(a.weights.data(), b.weights.data(), a.weights.size() * sizeof(float)));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, RouteGpu,
    ::testing::Values(RouteCase{1, 128, 8},  // decode: one launch (one token: one warp)
                      RouteCase{1, 256, 8},  // Laguna and Qwen3.5 decode
                      RouteCase{1, 1, 1}, RouteCase{1, 33, 5}, RouteCase{1, 512, 32}, RouteCase{1, 20, 20},
                      RouteCase{3, 60, 4}, RouteCase{8, 512, 32},  // the limits, one launch
                      RouteCase{9, 128, 8},                        // two chunks
                      RouteCase{40, 20, 20},                       // every expert used
                      RouteCase{100, 512, 32}, RouteCase{513, 128, 8},
                      RouteCase{2049, 256, 8},  // chunks longer than the minimum
                      RouteCase{8192, 128, 8}, RouteCase{8193, 33, 5}),
    [](const auto& info) {
      const RouteCase& c = info.param;
      std::string name = "T";  // appends (not operator+): gcc 12 -Wrestrict false positive
      name.append(std::to_string(c.n_tokens)).append("_E").append(std::to_string(c.n_expert));
      return name.append("_K").append(std::to_string(c.n_used));
    });

TEST(RouteGpuChecks, NoTokensGivesEmptyGroups) {
  MOESERVE_REQUIRE_GPU();
  DeviceArray<int32_t> offsets(9);
  offsets.poison();
  cuda::RouteArgs a;
  a.n_tokens = 0, a.n_expert = 8, a.n_used = 2, a.expert_offsets = offsets.get();
  ASSERT_TRUE(cuda::route_and_group(a, nullptr).is_ok());
  EXPECT_EQ(offsets.download(), std::vector<int32_t>(9, 0));
}

TEST(RouteGpuChecks, RejectsBadArguments) {
  float logit = 0.0f, weight = 0.0f;
  int32_t sel = 0, pair = 0, offsets[600] = {};
  cuda::RouteArgs a;
  a.logits = &logit, a.selected = &sel, a.weights = &weight, a.pairs_by_expert = &pair,
  a.expert_offsets = offsets;
  a.n_tokens = 1, a.n_expert = 4, a.n_used = 5;  // more slots than experts
  EXPECT_EQ(cuda::route_and_group(a, nullptr).code(), StatusCode::kInvalidArgument);
  a.n_expert = cuda::kRouteMaxExperts + 1, a.n_used = 2;
  EXPECT_EQ(cuda::route_and_group(a, nullptr).code(), StatusCode::kInvalidArgument);
  a.n_expert = 64, a.n_used = cuda::kRouteMaxUsed + 1;
  EXPECT_EQ(cuda::route_and_group(a, nullptr).code(), StatusCode::kInvalidArgument);
  a.n_used = 8, a.n_tokens = 100;  // needs scratch
  ASSERT_GT(cuda::route_scratch_bytes(100, 64), 0u);
  EXPECT_EQ(cuda::route_and_group(a, nullptr).code(), StatusCode::kInvalidArgument);
  a.n_tokens = 1, a.selected = nullptr;
  EXPECT_EQ(cuda::route_and_group(a, nullptr).code(), StatusCode::kInvalidArgument);
}

TEST(RouteGpuChecks, ScratchForMoreTokensServesFewer) {
  for (int64_t e : {1, 128, 512}) {
    EXPECT_EQ(cuda::route_scratch_bytes(1, e), 0u);  // decode needs none
    for (int64_t t = 1; t < 40000; t += 7) {
      ASSERT_LE(cuda::route_scratch_bytes(t, e), cuda::route_scratch_bytes(t + 7, e)) << t;
    }
  }
}

// ---- combine -------------------------------------------------------------------

class CombineGpu : public ::testing::TestWithParam<std::tuple<int64_t, int>> {};

TEST_P(CombineGpu, MatchesSlotOrderReference) {
  MOESERVE_REQUIRE_GPU();
  const auto [n_embd, off] = GetParam();
  const int64_t T = 5, K = 8;
  auto x = random_floats(size_t(T * n_embd + off), 91);
  const auto y = random_floats(size_t(T * K * n_embd + off), 92);
  const auto w = random_floats(size_t(T * K), 93, 0.3f);
  DeviceArray<float> dx(x), dy(y), dw(w);
  cuda::CombineArgs a;
  a.x = dx.get() + off, a.y = dy.get() + off, a.weights = dw.get(), a.n_tokens = T, a.n_used = K,
  a.n_embd = n_embd;
  ASSERT_TRUE(cuda::combine_experts(a, nullptr).is_ok());
  const auto got = dx.download();
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < n_embd; ++i) {
      const size_t at = size_t(off + t * n_embd + i);
      float want = x[at], mag = std::abs(x[at]);
      for (int64_t j = 0; j < K; ++j) {
        const float term = w[size_t(t * K + j)] * y[size_t(off + (t * K + j) * n_embd + i)];
        want += term;
        mag += std::abs(term);
      }
      // The GPU fuses each product into its add (fma): K roundings fewer.
      ASSERT_NEAR(got[at], want, 1e-6f * mag) << "token " << t << " col " << i;
    }
  }
  for (int i = 0; i < off; ++i) EXPECT_EQ(got[size_t(i)], x[size_t(i)]) << "wrote before x";
}

INSTANTIATE_TEST_SUITE_P(Sizes, CombineGpu,
                         ::testing::Combine(::testing::Values(1, 7, 4096, 4099), ::testing::Values(0, 1)));

// The combine fused with the next layer's norm (elementwise.h) gives
// exactly what combine_experts followed by rms_norm give: x and the normed
// rows, bit for bit (float4 rows and, at an odd offset, the scalar path).
TEST_P(CombineGpu, FusedWithNormEqualsCombineThenNorm) {
  MOESERVE_REQUIRE_GPU();
  const auto [n_embd, off] = GetParam();
  const int64_t T = 3, K = 8;
  const auto x = random_floats(size_t(T * n_embd + off), 94);
  const auto y = random_floats(size_t(T * K * n_embd + off), 95);
  const auto w = random_floats(size_t(T * K), 96, 0.3f);
  const auto g = random_floats(size_t(n_embd + off), 97);
  DeviceArray<float> x1(x), x2(x), dy(y), dw(w), dg(g), out1(x.size()), out2(x.size());
  cuda::CombineArgs c;
  c.x = x1.get() + off, c.y = dy.get() + off, c.weights = dw.get(), c.n_tokens = T, c.n_used = K,
  c.n_embd = n_embd;
  ASSERT_TRUE(cuda::combine_experts(c, nullptr).is_ok());
  cuda::RmsNormArgs n;
  n.x = x1.get() + off, n.w = dg.get() + off, n.out = out1.get() + off, n.n_rows = T, n.n_cols = n_embd,
  n.eps = 1e-6f;
  ASSERT_TRUE(cuda::rms_norm(n, nullptr).is_ok());
  cuda::CombineRmsNormArgs f;
  f.x = x2.get() + off, f.y = dy.get() + off, f.weights = dw.get(), f.n_used = K;
  f.w = dg.get() + off, f.out = out2.get() + off, f.n_rows = T, f.n_cols = n_embd, f.eps = 1e-6f;
  ASSERT_TRUE(cuda::combine_rms_norm(f, nullptr).is_ok());
  const auto a1 = x1.download(), a2 = x2.download(), o1 = out1.download(), o2 = out2.download();
  for (size_t i = size_t(off); i < a1.size(); ++i) ASSERT_EQ(a1[i], a2[i]) << "x element " << i;
  for (size_t i = size_t(off); i < o1.size(); ++i) ASSERT_EQ(o1[i], o2[i]) << "normed element " << i;
}

TEST(CombineGpuChecks, RejectsBadArguments) {
  cuda::CombineArgs a;
  float v = 0.0f;
  a.x = &v, a.y = &v, a.weights = &v, a.n_tokens = 1, a.n_used = 0, a.n_embd = 4;
  EXPECT_EQ(cuda::combine_experts(a, nullptr).code(), StatusCode::kInvalidArgument);
  a.n_used = 2, a.n_embd = 0;
  EXPECT_EQ(cuda::combine_experts(a, nullptr).code(), StatusCode::kInvalidArgument);
  a.n_embd = 4, a.y = nullptr;
  EXPECT_EQ(cuda::combine_experts(a, nullptr).code(), StatusCode::kInvalidArgument);
}

// Local groups (a layer sharing its experts with the host): the reference
// is the full groups with the non-local experts' ranges dropped, in the
// local order; decode and prefill sizes, none / some / all experts local.
TEST(LocalExpertGroups, MatchTheFullGroupsFiltered) {
  MOESERVE_REQUIRE_GPU();
  for (const RouteCase c : {RouteCase{1, 128, 8}, RouteCase{37, 16, 4}, RouteCase{300, 256, 8}}) {
    const auto logits = router_logits(c, uint32_t(77 + c.n_tokens));
    const RouteResult full = route_ref(c, logits);
    for (int stride : {1, 3, 1000}) {  // every expert, every third, only expert 0
      std::vector<int32_t> local;
      for (int32_t e = 0; e < c.n_expert; e += stride) local.push_back(e);
      std::vector<int32_t> want_offsets = {0}, want_pairs;
      for (int32_t e : local) {
        for (int32_t i = full.offsets[size_t(e)]; i < full.offsets[size_t(e) + 1]; ++i)
          want_pairs.push_back(full.pairs[size_t(i)]);
        want_offsets.push_back(int32_t(want_pairs.size()));
      }
      DeviceArray<int32_t> doff(full.offsets), dpairs(full.pairs), dlocal(local);
      DeviceArray<int32_t> lo(local.size() + 1), lp(full.pairs.size());
      lo.poison(), lp.poison();
      cuda::LocalGroupsArgs a;
      a.offsets = doff.get(), a.pairs = dpairs.get(), a.local = dlocal.get();
      a.n_expert = c.n_expert, a.n_local = int64_t(local.size());
      a.local_offsets = lo.get(), a.local_pairs = lp.get();
      ASSERT_TRUE(cuda::local_expert_groups(a, nullptr).is_ok());
      EXPECT_EQ(lo.download(), want_offsets) << c.n_tokens << " tokens, stride " << stride;
      std::vector<int32_t> got = lp.download();
      got.resize(want_pairs.size());
      EXPECT_EQ(got, want_pairs) << c.n_tokens << " tokens, stride " << stride;
    }
  }
  cuda::LocalGroupsArgs bad;
  bad.n_expert = 8, bad.n_local = 9;
  EXPECT_EQ(cuda::local_expert_groups(bad, nullptr).code(), StatusCode::kInvalidArgument);
}

// Groups cut at a pair id (a mixed forward's decode rows): the reference
// is each expert's pairs filtered in order, the hi ones less the bound; the
// full groups and a compact stack's (every third expert), decode-sized and
// prefill-sized, the cut at none, some and all of the pairs.
TEST(SplitExpertGroups, MatchTheGroupsFilteredAtTheBound) {
  MOESERVE_REQUIRE_GPU();
  for (const RouteCase c : {RouteCase{5, 128, 8}, RouteCase{40, 16, 4}, RouteCase{300, 256, 8}}) {
    const auto logits = router_logits(c, uint32_t(91 + c.n_tokens));
    const RouteResult full = route_ref(c, logits);
    for (int stride : {1, 3}) {
      std::vector<int32_t> offsets = {0}, pairs;
      for (int32_t e = 0; e < c.n_expert; e += stride) {
        for (int32_t i = full.offsets[size_t(e)]; i < full.offsets[size_t(e) + 1]; ++i)
          pairs.push_back(full.pairs[size_t(i)]);
        offsets.push_back(int32_t(pairs.size()));
      }
      const int64_t n_groups = int64_t(offsets.size()) - 1;
      for (const int64_t rows : {int64_t(0), int64_t(3), c.n_tokens}) {
        const int32_t bound = int32_t(rows * c.n_used);
        std::vector<int32_t> want_lo_off = {0}, want_hi_off = {0}, want_lo, want_hi;
        for (int64_t g = 0; g < n_groups; ++g) {
          for (int32_t i = offsets[size_t(g)]; i < offsets[size_t(g) + 1]; ++i) {
            const int32_t p = pairs[size_t(i)];
            if (p < bound)
              want_lo.push_back(p);
            else
              want_hi.push_back(p - bound);
          }
          want_lo_off.push_back(int32_t(want_lo.size())), want_hi_off.push_back(int32_t(want_hi.size()));
        }
        DeviceArray<int32_t> doff(offsets), dpairs(pairs);
        DeviceArray<int32_t> lo_off(size_t(n_groups + 1)), hi_off(size_t(n_groups + 1));
        DeviceArray<int32_t> lo(pairs.size() + 1), hi(pairs.size() + 1);
        lo_off.poison(), hi_off.poison(), lo.poison(), hi.poison();
        cuda::SplitGroupsArgs a;
        a.offsets = doff.get(), a.pairs = dpairs.get(), a.n_expert = n_groups, a.bound = bound;
        a.lo_offsets = lo_off.get(), a.lo_pairs = lo.get(), a.hi_offsets = hi_off.get(),
        a.hi_pairs = hi.get();
        ASSERT_TRUE(cuda::split_expert_groups(a, nullptr).is_ok());
        const std::string at = std::to_string(c.n_tokens) + " tokens, stride " + std::to_string(stride) +
                               ", cut at row " + std::to_string(rows);
        EXPECT_EQ(lo_off.download(), want_lo_off) << at;
        EXPECT_EQ(hi_off.download(), want_hi_off) << at;
        std::vector<int32_t> got_lo = lo.download(), got_hi = hi.download();
        got_lo.resize(want_lo.size()), got_hi.resize(want_hi.size());
        EXPECT_EQ(got_lo, want_lo) << at;
        EXPECT_EQ(got_hi, want_hi) << at;
      }
    }
  }
  cuda::SplitGroupsArgs bad;
  bad.n_expert = cuda::kRouteMaxExperts + 1;
  EXPECT_EQ(cuda::split_expert_groups(bad, nullptr).code(), StatusCode::kInvalidArgument);
  bad.n_expert = 4;  // null arrays
  EXPECT_EQ(cuda::split_expert_groups(bad, nullptr).code(), StatusCode::kInvalidArgument);
}

TEST(ScatterRows, WritesOnlyTheNamedRows) {
  MOESERVE_REQUIRE_GPU();
  const int64_t rows = 12, cols = 1000;
  const std::vector<float> src = random_floats(size_t(3 * cols), 5);
  const std::vector<int32_t> at = {7, 0, 11};
  DeviceArray<float> dst(size_t(rows * cols)), dsrc(src);
  DeviceArray<int32_t> dat(at);
  dst.poison();
  ASSERT_TRUE(cuda::scatter_rows({dst.get(), dsrc.get(), dat.get(), 3, cols}, nullptr).is_ok());
  const std::vector<float> got = dst.download();
  for (int64_t r = 0; r < rows; ++r) {
    const auto it = std::find(at.begin(), at.end(), int32_t(r));
    for (int64_t c = 0; c < cols; ++c) {
      const float v = got[size_t(r * cols + c)];
      if (it == at.end()) {
        ASSERT_TRUE(std::isnan(v)) << "row " << r << " was written";
      } else {
        ASSERT_EQ(v, src[size_t((it - at.begin()) * cols + c)]) << "row " << r << " col " << c;
      }
    }
  }
  EXPECT_EQ(cuda::scatter_rows({nullptr, nullptr, nullptr, 1, cols}, nullptr).code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace moeserve
