// A mixed forward's decode and verify rows equal the same rows run alone,
// on the CPU, for every architecture (mixed_rows.h; the GPU's in
// hf_parity_gpu_test.cpp): a prompt arriving beside a sequence must not
// change that sequence's greedy tokens, nor a verify's. And a verify
// chain's rows equal their decode rows.
#include <gtest/gtest.h>

#include <memory>
#include <optional>
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

class MixedForward : public ::testing::TestWithParam<MixedCase> {
 protected:
  void SetUp() override {
    const std::string dir = std::string(MOESERVE_TEST_DATA_DIR) + "/models/";
    engine_ = parity::Engine::load(dir + GetParam().gguf, nullptr);
    ASSERT_NE(engine_, nullptr);
    fixture_ = testing::load_fixture(dir + GetParam().fixture);
    ASSERT_TRUE(fixture_.has_value());
  }
  std::unique_ptr<parity::Engine> engine_;
  std::optional<testing::Fixture> fixture_;
};

TEST_P(MixedForward, DecodeRowsBesideAPromptChunkEqualSoloRows) {
  testing::expect_mixed_rows_equal_solo_rows(*engine_, *fixture_);
}

TEST_P(MixedForward, VerifyRowsEqualDecodeRows) {
  testing::expect_verify_chains_equal_decode_rows(*engine_, *fixture_);
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
