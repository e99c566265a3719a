// A mixed forward's decode and verify rows equal the same rows run alone,
// on the CPU, for every architecture (mixed_rows.h; the GPU's in
// hf_parity_gpu_test.cpp): a prompt arriving beside a sequence must not
// change that sequence's greedy tokens, nor a verify's. And a verify
// chain's rows equal their decode rows.
#include <gtest/gtest.h>

#include <string>

#include "models/mixed_rows.h"
#include "models/parity_engine.h"

namespace moeserve::models {
namespace {

struct MixedCase {
  const char* gguf;
  const char* fixture;
};
void PrintTo(const MixedCase& c, std::ostream* os) { *os << c.gguf; }

class MixedForward : public ::testing::TestWithParam<MixedCase> {};

TEST_P(MixedForward, DecodeRowsBesideAPromptChunkEqualSoloRows) {
  const std::string dir = std::string(MOESERVE_TEST_DATA_DIR) + "/models/";
  auto e = parity::Engine::load(dir + GetParam().gguf, nullptr);
  ASSERT_NE(e, nullptr);
  const std::optional<testing::Fixture> f = testing::load_fixture(dir + GetParam().fixture);
  ASSERT_TRUE(f.has_value());
  testing::expect_mixed_rows_equal_solo_rows(*e, *f);
}

TEST_P(MixedForward, VerifyRowsEqualDecodeRows) {
  const std::string dir = std::string(MOESERVE_TEST_DATA_DIR) + "/models/";
  auto e = parity::Engine::load(dir + GetParam().gguf, nullptr);
  ASSERT_NE(e, nullptr);
  const std::optional<testing::Fixture> f = testing::load_fixture(dir + GetParam().fixture);
  ASSERT_TRUE(f.has_value());
  for (const int64_t n : {int64_t(5), int64_t(24), int64_t(40), int64_t(64)}) {
    testing::expect_verify_rows_equal_decode_rows(*e, *f, n);
  }
}

INSTANTIATE_TEST_SUITE_P(TinyModels, MixedForward,
                         ::testing::Values(MixedCase{"qwen3moe-tiny.bf16.gguf", "fixtures_qwen3moe.json"},
                                           MixedCase{"qwen3-tiny.bf16.gguf", "fixtures_qwen3.json"},
                                           MixedCase{"qwen35moe-tiny.bf16.gguf", "fixtures_qwen35moe.json"},
                                           MixedCase{"qwen35-tiny.bf16.gguf", "fixtures_qwen35.json"},
                                           MixedCase{"laguna-tiny.bf16.gguf", "fixtures_laguna.json"}),
                         [](const auto& info) { return testing::fixture_stem(info.param.fixture); });

}  // namespace
}  // namespace moeserve::models
