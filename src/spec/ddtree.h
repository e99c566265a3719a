// DDTree (arXiv 2604.12989; model-and-format-specs.md §7): a draft tree
// built best-first from a block drafter's per-depth distributions. A node's
// score is the sum of its path's log-probabilities (the draft's positions
// taken as independent), so the tree holds the node budget's most probable
// prefixes. The top-1 chain goes in first (the "chain seed": a greedy target
// follows it most often, and without it a wide tree may stop short of the
// depth the draft reaches); the best-first fill then adds the siblings and
// branches that are likeliest.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "runtime/speculation.h"

namespace moeserve::spec {

// One draft position's candidates, most probable first (a draft's top-k
// log-probabilities: backend::Ops::top_k_rows computes them where its
// logits are).
struct DepthCandidates {
  std::vector<int32_t> tokens;
  std::vector<float> log_probs;
};

// The tree of at most budget.max_nodes nodes and budget.max_depth levels
// from `depths` (depth 1 first). chain_seed: the top-1 chain first.
void build_draft_tree(std::span<const DepthCandidates> depths, const runtime::DraftBudget& budget,
                      bool chain_seed, runtime::DraftTree& out);

}  // namespace moeserve::spec
