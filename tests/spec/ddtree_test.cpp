// DDTree's best-first construction from per-depth candidates.
#include "spec/ddtree.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <vector>

namespace moeserve::spec {
namespace {

DepthCandidates depth(std::vector<int32_t> tokens, std::vector<float> probs) {
  DepthCandidates d;
  d.tokens = std::move(tokens);
  for (float p : probs) d.log_probs.push_back(std::log(p));
  return d;
}

double path_log_prob(const runtime::DraftTree& t, const std::vector<DepthCandidates>& depths, int32_t node) {
  double lp = 0;
  int d = 0;
  for (int32_t n = node; n >= 0; n = t.parents[size_t(n)]) ++d;
  for (int32_t n = node; n >= 0; n = t.parents[size_t(n)], --d) {
    const DepthCandidates& c = depths[size_t(d - 1)];
    for (size_t r = 0; r < c.tokens.size(); ++r) {
      if (c.tokens[r] == t.tokens[size_t(n)]) lp += c.log_probs[r];
    }
  }
  return lp;
}

TEST(DdTree, BestFirstKeepsTheMostProbablePrefixes) {
  const std::vector<DepthCandidates> depths = {depth({10, 11, 12}, {0.6f, 0.3f, 0.1f}),
                                               depth({20, 21, 22}, {0.9f, 0.05f, 0.05f}),
                                               depth({30, 31}, {0.5f, 0.5f})};
  runtime::DraftTree t;
  build_draft_tree(depths, {.max_nodes = 5, .max_depth = 3}, /*chain_seed=*/false, t);
  ASSERT_EQ(t.size(), 5);
  // Pop order: 10 (.6), 10-20 (.54), 11 (.3), 10-20-30 (.27), 10-20-31 (.27).
  EXPECT_EQ(t.tokens, (std::vector<int32_t>{10, 20, 11, 30, 31}));
  EXPECT_EQ(t.parents, (std::vector<int32_t>{-1, 0, -1, 1, 1}));
  // Every node's path is at least as probable as any prefix left out: the
  // 5 best of all prefixes of depth <= 3.
  double worst_in = 0;
  for (int32_t n = 0; n < 5; ++n) worst_in = std::min(worst_in, path_log_prob(t, depths, n));
  EXPECT_GE(worst_in, std::log(0.27) - 1e-6);
  for (size_t i = 0; i < t.tokens.size(); ++i) {
    for (size_t j = i + 1; j < t.tokens.size(); ++j) {
      if (t.parents[i] == t.parents[j]) {
        EXPECT_NE(t.tokens[i], t.tokens[j]);
      }
    }
    EXPECT_LT(t.parents[i], int32_t(i));
  }
}

TEST(DdTree, TheChainSeedGoesFirstAndBudgetsHold) {
  const std::vector<DepthCandidates> depths = {depth({1, 2}, {0.5f, 0.5f}), depth({3, 4}, {0.4f, 0.35f}),
                                               depth({5, 6}, {0.3f, 0.3f}), depth({7, 8}, {0.3f, 0.2f})};
  runtime::DraftTree t;
  build_draft_tree(depths, {.max_nodes = 6, .max_depth = 4}, /*chain_seed=*/true, t);
  ASSERT_EQ(t.size(), 6);
  EXPECT_EQ(std::vector<int32_t>(t.tokens.begin(), t.tokens.begin() + 4), (std::vector<int32_t>{1, 3, 5, 7}));
  EXPECT_EQ(std::vector<int32_t>(t.parents.begin(), t.parents.begin() + 4),
            (std::vector<int32_t>{-1, 0, 1, 2}));
  EXPECT_EQ(t.depth(), 4);
  // Depth cap and a chain-only budget.
  build_draft_tree(depths, {.max_nodes = 10, .max_depth = 2}, true, t);
  EXPECT_EQ(t.depth(), 2);
  EXPECT_LE(t.size(), 6);  // 2 + 2 per first-level node at most
  build_draft_tree(depths, {.max_nodes = 3, .max_depth = 4}, true, t);
  EXPECT_TRUE(t.is_chain());
  EXPECT_EQ(t.tokens, (std::vector<int32_t>{1, 3, 5}));
  build_draft_tree(depths, {.max_nodes = 0, .max_depth = 4}, true, t);
  EXPECT_TRUE(t.empty());
  build_draft_tree({}, {.max_nodes = 5, .max_depth = 4}, true, t);
  EXPECT_TRUE(t.empty());
}

}  // namespace
}  // namespace moeserve::spec
