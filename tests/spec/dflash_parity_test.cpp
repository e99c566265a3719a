// The engine's DFlash draft against the PyTorch draft it was trained as
// (scripts/train_tiny/train_dflash.py --parity-out): a 1-layer draft of
// qwen3moe-tiny, the features the engine's own target forward captures for
// a committed token sequence, and at three anchors the block's logits the
// Python draft computed in f32 from the same bf16 weights. This checks what
// the host reference of dflash_test.cpp cannot: that the engine reads the
// layers, positions, mask token and context rows the way training wrote
// them (a draft trained well but read differently keeps nothing).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dflash_fixture.h"
#include "format/gguf.h"
#include "models/dflash_draft.h"
#include "runtime/generator.h"
#include "runtime/model.h"
#include "runtime/speculation.h"
#include "target_features.h"
#include "test_device.h"

namespace moeserve::spec {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct Anchor {
  int64_t at = 0;
  std::vector<int32_t> greedy;
  std::vector<std::vector<int32_t>> top_ids;
  std::vector<std::vector<float>> top_logits;
};

struct Fixture {
  std::vector<int32_t> tokens;
  std::vector<int32_t> layers;
  int64_t block = 0;
  std::vector<Anchor> anchors;
};

Fixture read_fixture(const fs::path& path) {
  std::ifstream in(path);
  const json j = json::parse(in);
  Fixture f;
  f.tokens = j.at("tokens").get<std::vector<int32_t>>();
  f.layers = j.at("target_layers").get<std::vector<int32_t>>();
  f.block = j.at("block").get<int64_t>();
  for (const json& a : j.at("anchors")) {
    Anchor x;
    x.at = a.at("anchor").get<int64_t>();
    x.greedy = a.at("greedy").get<std::vector<int32_t>>();
    x.top_ids = a.at("top_ids").get<std::vector<std::vector<int32_t>>>();
    x.top_logits = a.at("top_logits").get<std::vector<std::vector<float>>>();
    f.anchors.push_back(std::move(x));
  }
  return f;
}

TEST(DflashParity, TheEngineDraftsWhatTheTrainedPyTorchDraftDoes) {
  const fs::path dir = fs::path(MOESERVE_TEST_DATA_DIR) / "models/dflash-qwen3moe-tiny";
  const Fixture fx = read_fixture(dir / "parity.json");
  ASSERT_FALSE(fx.anchors.empty());
  const fs::path gguf = fs::temp_directory_path() / "moeserve_dflash_parity.gguf";
  const Status converted = testing::convert_draft(dir, gguf);
  ASSERT_TRUE(converted.is_ok()) << converted.to_string();

  auto target = runtime::Model::load(fmt::format("{}/models/qwen3moe-tiny.bf16.gguf", MOESERVE_TEST_DATA_DIR),
                                     {.n_threads = 2, .device = moeserve::testing::test_device()});
  ASSERT_TRUE(target.is_ok()) << target.status().to_string();
  auto file = GgufFile::open(gguf.string());
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  auto draft = models::load_dflash_draft(*file, (*target)->net());
  ASSERT_TRUE(draft.is_ok()) << draft.status().to_string();
  const models::DflashHParams& hp = (*draft)->hparams();
  ASSERT_EQ(hp.target_layers, fx.layers);
  ASSERT_EQ(hp.block_size, fx.block);
  auto ws = (*draft)->create_workspace();
  ASSERT_TRUE(ws.is_ok());

  std::vector<float> features;
  for (const std::vector<float>& row : testing::reference_features(**target, fx.tokens, hp.target_layers))
    features.insert(features.end(), row.begin(), row.end());
  const int64_t width = hp.feature_width(), n_out = hp.block_size - 1, V = (*draft)->n_vocab();
  ASSERT_EQ(int64_t(features.size()), int64_t(fx.tokens.size()) * width);
  int64_t same_greedy = 0, decided = 0;
  for (const Anchor& a : fx.anchors) {
    models::DflashContext ctx;
    ASSERT_TRUE((*draft)
                    ->extend(ctx, std::span<const float>(features).first(size_t(a.at * width)), a.at, **ws)
                    .is_ok());
    std::vector<float> logits(size_t(n_out * V));
    std::vector<int32_t> greedy(static_cast<size_t>(n_out));
    const Status proposed =
        (*draft)->propose(ctx, fx.tokens[size_t(a.at)],
                          {.n_out = n_out, .greedy = greedy.data(), .logits = logits.data()}, **ws);
    ASSERT_TRUE(proposed.is_ok()) << proposed.to_string();
    for (int64_t i = 0; i < n_out; ++i) {
      const std::vector<int32_t>& ids = a.top_ids[size_t(i)];
      const std::vector<float>& want = a.top_logits[size_t(i)];
      // K/V are kept in f16 and the features come from the engine's own
      // target forward: a few thousandths of the logits' scale.
      const float scale = std::max(1.0f, std::abs(want[0]));
      for (size_t k = 0; k < ids.size(); ++k) {
        const float got = logits[size_t(i * V + ids[k])];
        EXPECT_NEAR(got, want[k], 2e-2f * scale) << "anchor " << a.at << ", block row " << i + 1 << ", token "
                                                 << ids[k] << " (top " << k + 1 << ")";
      }
      // Where the top two stand apart, the arg-max is the same token.
      if (want[0] - want[1] > 4e-2f * scale) {
        ++decided;
        same_greedy += greedy[size_t(i)] == a.greedy[size_t(i)];
      }
    }
  }
  EXPECT_EQ(same_greedy, decided);
  EXPECT_GT(decided, 0);
}

}  // namespace
}  // namespace moeserve::spec
