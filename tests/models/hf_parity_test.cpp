// Parity of the CPU engine with Hugging Face transformers (f32, eager) on the
// two tiny trained models (tests/data/models/README.md). The BF16 GGUFs hold
// exactly the weights the fixtures were computed from, so the remaining
// differences come from our f16 KV cache and f32 summation order; the
// quantized files are compared statistically (top-1 agreement, KL).
//
// The engine is driven directly (Qwen3Model::forward with our own f16 cache
// rows), as the runtime's Generator does: prefill in one chunk, then one
// decode step per greedy token, never stopping on EOS (the fixtures disabled it).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <vector>
#include <unistd.h>

#include "convert/quantize_model.h"
#include "format/gguf.h"
#include "models/hf_fixtures.h"
#include "models/parity_engine.h"
#include "models/qwen3.h"
#include "backend/cpu/cpu_device.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/vocab_gguf.h"

namespace moeserve::models {
namespace {

using testing::Fixture;
using testing::FixturePrompt;
using parity::Engine;

constexpr int kGreedyTokens = 64;
// Near-ties. Our f16 KV cache moves logits by up to ~0.022 here (measured),
// so two candidates whose HF logits are closer than about twice that may
// swap. At positions whose HF top-1 margin is below kTieMargin we only
// require our top-1 to be HF's top-1 or top-2 (and count the swaps); these
// are 5 (MoE) and 7 (dense) of 436 prompt positions, and one swaps (MoE,
// `unicode` position 29, HF margin 0.0021).
constexpr float kTieMargin = 0.02f;
constexpr int kMaxSwaps = 2;

std::string data_path(const std::string& name) { return std::string(MOESERVE_TEST_DATA_DIR) + "/models/" + name; }

int32_t argmax(std::span<const float> x) {
  return int32_t(std::max_element(x.begin(), x.end()) - x.begin());  // first of ties: lowest id
}

// KL(p || q) where p, q are the softmaxes of the two logit lists.
double kl_of_logits(std::span<const float> p_logits, std::span<const float> q_logits) {
  auto log_softmax = [](std::span<const float> x) {
    const double m = *std::max_element(x.begin(), x.end());
    double sum = 0.0;
    for (float v : x) sum += std::exp(double(v) - m);
    const double lse = m + std::log(sum);
    std::vector<double> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) out[i] = double(x[i]) - lse;
    return out;
  };
  const std::vector<double> lp = log_softmax(p_logits), lq = log_softmax(q_logits);
  double kl = 0.0;
  for (size_t i = 0; i < lp.size(); ++i) kl += std::exp(lp[i]) * (lp[i] - lq[i]);
  return std::max(kl, 0.0);
}

struct ModelCase {
  const char* gguf;
  const char* fixture;
  float max_logit_diff;  // bound for |ours - HF| over top-20 and the full last row
  float q8_min_agree;    // Q8_0: top-1 agreement over all prompt positions
  float q8_max_kl;       // Q8_0: mean KL(HF || ours), top-20 renormalised
  float q4_min_agree;    // Q4_K_M
  float q4_max_kl;
};

// gtest prints this instead of the struct's bytes in failure messages.
void PrintTo(const ModelCase& c, std::ostream* os) { *os << c.gguf; }

class HfParity : public ::testing::TestWithParam<ModelCase> {
 protected:
  static Fixture fixture() {
    auto f = testing::load_fixture(data_path(GetParam().fixture));
    EXPECT_TRUE(f.has_value()) << "cannot read " << GetParam().fixture;
    return f.value_or(Fixture{});
  }
};

// Tokenizer ids, top-1 at every position, |Δlogit| over the top-20 and the
// full last row, and the 64-token greedy continuation, for every prompt.
TEST_P(HfParity, Bf16MatchesTransformers) {
  const Fixture f = fixture();
  ASSERT_FALSE(f.prompts.empty());
  ThreadPool pool(2);
  auto e = Engine::load(data_path(GetParam().gguf), &pool);
  ASSERT_TRUE(e);
  const size_t V = size_t(e->n_vocab());
  double max_diff_top = 0.0, max_diff_last = 0.0;
  int positions = 0, near_ties = 0, swaps = 0, greedy_matched = 0, greedy_total = 0;
  for (const FixturePrompt& p : f.prompts) {
    SCOPED_TRACE(p.name);
    EXPECT_EQ(e->tokenizer->encode(p.text), p.ids);
    const std::vector<float> logits = e->forward(p.ids, 0, 512);
    ASSERT_EQ(p.top_ids.size(), p.ids.size());
    for (size_t t = 0; t < p.ids.size(); ++t) {
      std::span<const float> row(logits.data() + t * V, V);
      ++positions;
      const int32_t top1 = argmax(row);
      if (p.top1_margins[t] < kTieMargin) {
        ++near_ties;
        swaps += top1 != p.top_ids[t][0];
        EXPECT_TRUE(top1 == p.top_ids[t][0] || top1 == p.top_ids[t][1]) << "near-tie position " << t;
      } else {
        EXPECT_EQ(top1, p.top_ids[t][0]) << "position " << t;
      }
      for (size_t j = 0; j < p.top_ids[t].size(); ++j) {
        max_diff_top = std::max(max_diff_top, std::abs(double(row[size_t(p.top_ids[t][j])]) - p.top_logits[t][j]));
      }
    }
    ASSERT_EQ(p.last_logits.size(), V);
    const float* last = logits.data() + (p.ids.size() - 1) * V;
    for (size_t i = 0; i < V; ++i) max_diff_last = std::max(max_diff_last, std::abs(double(last[i]) - p.last_logits[i]));

    // Greedy: argmax of the prefill's last row, then one decode step per token.
    std::vector<int32_t> generated = {argmax(std::span<const float>(last, V))};
    int64_t pos = int64_t(p.ids.size());
    while (int(generated.size()) < kGreedyTokens) {
      const std::vector<float> step = e->forward(std::span<const int32_t>(&generated.back(), 1), pos++, 1);
      generated.push_back(argmax(step));
    }
    int matched = 0;
    while (matched < kGreedyTokens && generated[size_t(matched)] == p.greedy_ids[size_t(matched)]) ++matched;
    EXPECT_EQ(generated, p.greedy_ids) << "first difference at step " << matched;
    greedy_matched += matched;
    greedy_total += kGreedyTokens;
  }
  std::printf("[ parity ] %s: %d positions (%d near-ties with margin < %g, %d swapped), max |dlogit| top-20 %.4g, "
              "last row %.4g; greedy %d/%d tokens\n",
              f.model.c_str(), positions, near_ties, double(kTieMargin), swaps, max_diff_top, max_diff_last,
              greedy_matched, greedy_total);
  RecordProperty("max_abs_logit_diff_top20", std::to_string(max_diff_top));
  RecordProperty("max_abs_logit_diff_last", std::to_string(max_diff_last));
  EXPECT_LT(max_diff_top, GetParam().max_logit_diff);
  EXPECT_LT(max_diff_last, GetParam().max_logit_diff);
  EXPECT_LE(swaps, kMaxSwaps);
}

struct QuantStats {
  double agree = 0.0;    // top-1 agreement with HF over all prompt positions
  double kl_top20 = 0.0;  // mean KL(HF || ours) over the fixture's top-20, renormalised
  double kl_last = 0.0;   // mean KL over the full last-position distribution, per prompt
};

// Through the production path: packed weights where this CPU has packed
// kernels (Q4_K / Q6_K on AVX-512), as moeserve runs them.
QuantStats quantized_stats(const std::string& path, const Fixture& f) {
  ThreadPool pool(2);
  auto e = Engine::load(path, &pool, /*pack=*/true);
  if (!e) return {};
  const size_t V = size_t(e->n_vocab());
  QuantStats s;
  int positions = 0, agree = 0, prompts = 0;
  for (const FixturePrompt& p : f.prompts) {
    const std::vector<float> logits = e->forward(p.ids, 0, 512);
    for (size_t t = 0; t < p.ids.size(); ++t) {
      std::span<const float> row(logits.data() + t * V, V);
      agree += argmax(row) == p.top_ids[t][0];
      std::vector<float> ours(p.top_ids[t].size());
      for (size_t j = 0; j < ours.size(); ++j) ours[j] = row[size_t(p.top_ids[t][j])];
      s.kl_top20 += kl_of_logits(p.top_logits[t], ours);
      ++positions;
    }
    s.kl_last += kl_of_logits(p.last_logits, std::span<const float>(logits.data() + (p.ids.size() - 1) * V, V));
    ++prompts;
  }
  s.agree = double(agree) / std::max(positions, 1);
  s.kl_top20 /= std::max(positions, 1);
  s.kl_last /= std::max(prompts, 1);
  return s;
}

std::string temp_gguf(const std::string& tag) {
  static std::atomic<int> counter{0};
  return (std::filesystem::temp_directory_path() /
          ("moeserve_parity_" + std::to_string(getpid()) + "_" + std::to_string(counter++) + "_" + tag + ".gguf"))
      .string();
}

// Q8_0 and Q4_K_M files made by our quantizer from the BF16 GGUF: top-1
// agreement and KL against the f32 HF logits. For the MoE model, expert FF
// 128 is not a multiple of the K-quant block (256), so Q4_K_M's ffn_down_exps
// falls back to Q8_0/Q5_0 (the spec's rule): its Q4_K_M is closer to Q8_0.
TEST_P(HfParity, QuantizedAgreementAndKl) {
  const Fixture f = fixture();
  ASSERT_FALSE(f.prompts.empty());
  struct Q {
    convert::FileType type;
    const char* name;
    float min_agree, max_kl;
  };
  for (const Q& q : {Q{convert::FileType::kQ8_0, "q8_0", GetParam().q8_min_agree, GetParam().q8_max_kl},
                     Q{convert::FileType::kQ4_K_M, "q4_k_m", GetParam().q4_min_agree, GetParam().q4_max_kl}}) {
    SCOPED_TRACE(q.name);
    convert::QuantizeOptions o;
    o.input_path = data_path(GetParam().gguf);
    o.output_path = temp_gguf(q.name);
    o.file_type = q.type;
    o.threads = 2;
    o.progress = ProgressOptions::Mode::kOff;
    auto summary = convert::quantize_model(o);
    ASSERT_TRUE(summary.is_ok()) << summary.status().to_string();
    const QuantStats s = quantized_stats(o.output_path, f);
    std::filesystem::remove(o.output_path);
    std::printf("[ parity ] %s %s: top-1 agreement %.4f, mean KL top-20 %.5f, mean KL last row %.5f\n",
                f.model.c_str(), q.name, s.agree, s.kl_top20, s.kl_last);
    RecordProperty(std::string(q.name) + "_top1_agree", std::to_string(s.agree));
    RecordProperty(std::string(q.name) + "_mean_kl_top20", std::to_string(s.kl_top20));
    EXPECT_GE(s.agree, q.min_agree);
    EXPECT_LE(s.kl_top20, q.max_kl);
    EXPECT_LE(s.kl_last, q.max_kl);
  }
}

// On a real model: decode after prefill == one-shot prefill, chunked prefill
// == unchunked (1e-4: same dot products, same key order), and 2 threads ==
// 1 thread bit for bit.
TEST_P(HfParity, DecodeChunkingAndThreadsAgree) {
  const Fixture f = fixture();
  ASSERT_FALSE(f.prompts.empty());
  const std::vector<int32_t>& ids = f.prompts.front().ids;  // code_def, 29 tokens
  ASSERT_GT(ids.size(), 8u);
  ThreadPool one(1), two(2);
  auto a = Engine::load(data_path(GetParam().gguf), &one);
  auto b = Engine::load(data_path(GetParam().gguf), &two);
  ASSERT_TRUE(a && b);
  const size_t V = size_t(a->n_vocab()), N = ids.size();
  const std::vector<float> one_shot = a->forward(ids, 0, 512);

  b->forward(std::span<const int32_t>(ids).first(N - 1), 0, 512);
  const std::vector<float> decoded = b->forward(std::span<const int32_t>(ids).last(1), int64_t(N - 1), 1);
  for (size_t i = 0; i < V; ++i) ASSERT_NEAR(decoded[i], one_shot[(N - 1) * V + i], 1e-4) << "decode, logit " << i;

  const std::vector<float> chunked = b->forward(ids, 0, 7);
  ASSERT_EQ(chunked.size(), one_shot.size());
  for (size_t i = 0; i < chunked.size(); ++i) ASSERT_NEAR(chunked[i], one_shot[i], 1e-4) << "chunked, element " << i;

  double decode_diff = 0.0, chunk_diff = 0.0;
  for (size_t i = 0; i < V; ++i) decode_diff = std::max(decode_diff, double(std::abs(decoded[i] - one_shot[(N - 1) * V + i])));
  for (size_t i = 0; i < chunked.size(); ++i) chunk_diff = std::max(chunk_diff, double(std::abs(chunked[i] - one_shot[i])));
  std::printf("[ parity ] %s: decode-after-prefill max |diff| %.3g, chunked (7) max |diff| %.3g\n", f.model.c_str(),
              decode_diff, chunk_diff);

  const std::vector<float> two_threads = b->forward(ids, 0, 512);
  ASSERT_EQ(two_threads.size(), one_shot.size());
  for (size_t i = 0; i < one_shot.size(); ++i) ASSERT_EQ(two_threads[i], one_shot[i]) << "threads, element " << i;
}

// Bounds, measured on the 2-core AVX-512 machine (Release), with margin:
//   qwen3moe: max |dlogit| 0.0145 (top-20), 0.0126 (last row)     -> < 0.03
//             Q8_0   agreement 0.975, KL top-20 0.0051, last 0.0013 -> >= 0.93, <= 0.010
//             Q4_K_M agreement 0.835, KL top-20 0.138,  last 0.057  -> >= 0.78, <= 0.20
//   qwen3:    max |dlogit| 0.0224 (top-20), 0.0105 (last row)     -> < 0.04
//             Q8_0   agreement 0.966, KL top-20 0.0026, last 0.0012 -> >= 0.93, <= 0.006
//             Q4_K_M agreement 0.789, KL top-20 0.179,  last 0.183  -> >= 0.74, <= 0.25
// (HF-side weights-only estimate for Q8_0: agreement >= 0.93, KL <= 0.005.
// Q4_K_M is lossy on models this small; for scale, our Q6_K gives KL 0.014 /
// 0.020, Q5_K_M 0.041 / 0.045, Q4_0 0.28 / 0.24 (dense / MoE).)
// Measured (2026-11-27, the Qwen3.5 hybrids, converted by moeserve convert):
//   qwen35moe: max |dlogit| 0.0111 (top-20), 0.0049 (last row); greedy 512/512 -> < 0.03
//              Q8_0   agreement 0.963, KL top-20 0.0060, last 0.0170 -> >= 0.93, <= 0.03
//              Q4_K_M agreement 0.952, KL top-20 0.0093, last 0.0186 -> >= 0.90, <= 0.05
//   qwen35:    max |dlogit| 0.0117 (top-20), 0.0065 (last row); greedy 512/512 -> < 0.03
//              Q8_0   agreement 0.968, KL top-20 0.0013, last 0.0009 -> >= 0.93, <= 0.006
//              Q4_K_M agreement 0.954, KL top-20 0.0036, last 0.0020 -> >= 0.90, <= 0.02
// Measured (2026-11-27, Laguna, converted by moeserve convert):
//   laguna:    max |dlogit| 0.0082 (top-20), 0.0044 (last row); greedy 512/512 -> < 0.03
//              Q8_0   agreement 0.979, KL top-20 0.0045, last 0.0008 -> >= 0.93, <= 0.02
//              Q4_K_M agreement 0.973, KL top-20 0.0073, last 0.0022 -> >= 0.90, <= 0.04
// Re-measured (2026-11-29) after Q4_K_M took llama.cpp's own choices (the
// release node-llama-cpp pins): rows of 128 (these models' hidden size)
// fall back from Q4_K to Q5_0 and from Q6_K to Q8_0 as llama.cpp's do, where
// our earlier rule kept Q8_0 throughout, and attn_qkv counts as an attention
// value:
//   qwen35moe Q4_K_M agreement 0.878, KL top-20 0.043, last 0.063 -> >= 0.83, <= 0.09
//   qwen35    Q4_K_M agreement 0.917, KL top-20 0.034, last 0.017 -> >= 0.87, <= 0.05
//   laguna    Q4_K_M agreement 0.892, KL top-20 0.053, last 0.047 -> >= 0.85, <= 0.08
INSTANTIATE_TEST_SUITE_P(TinyTrained, HfParity,
                         ::testing::Values(ModelCase{"qwen3moe-tiny.bf16.gguf", "fixtures_qwen3moe.json", 0.03f, 0.93f,
                                                     0.010f, 0.78f, 0.20f},
                                           ModelCase{"qwen3-tiny.bf16.gguf", "fixtures_qwen3.json", 0.04f, 0.93f,
                                                     0.006f, 0.74f, 0.25f},
                                           ModelCase{"qwen35moe-tiny.bf16.gguf", "fixtures_qwen35moe.json", 0.03f,
                                                     0.93f, 0.03f, 0.83f, 0.09f},
                                           ModelCase{"qwen35-tiny.bf16.gguf", "fixtures_qwen35.json", 0.03f, 0.93f,
                                                     0.006f, 0.87f, 0.05f},
                                           ModelCase{"laguna-tiny.bf16.gguf", "fixtures_laguna.json", 0.03f, 0.93f,
                                                     0.02f, 0.85f, 0.08f}),
                         [](const auto& info) { return testing::fixture_stem(info.param.fixture); });

}  // namespace
}  // namespace moeserve::models
