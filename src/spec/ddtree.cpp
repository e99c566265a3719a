#include "spec/ddtree.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <queue>

namespace moeserve::spec {

namespace {

// A candidate node: rank `rank` of depth `depth` (1-based) under `parent`.
struct Candidate {
  double score = 0.0;  // its path's log-probability
  int32_t depth = 0, rank = 0, parent = -1;
  bool operator<(const Candidate& o) const { return score < o.score; }  // max-heap
};

}  // namespace

void build_draft_tree(std::span<const DepthCandidates> depths, const runtime::DraftBudget& budget,
                      bool chain_seed, runtime::DraftTree& out) {
  out.clear();
  const int32_t max_depth = int32_t(std::min<int64_t>(budget.max_depth, int64_t(depths.size())));
  const int64_t max_nodes = budget.max_nodes;
  if (max_depth < 1 || max_nodes < 1) return;
  auto lp = [&](int32_t depth, int32_t rank) {
    return double(depths[size_t(depth - 1)].log_probs[size_t(rank)]);
  };
  auto has = [&](int32_t depth, int32_t rank) {
    return depth >= 1 && depth <= max_depth && size_t(rank) < depths[size_t(depth - 1)].tokens.size();
  };
  std::priority_queue<Candidate> heap;
  // A node just added: its next sibling and its first child become candidates.
  auto expand = [&](const Candidate& c, int32_t node) {
    if (has(c.depth, c.rank + 1))
      heap.push({c.score - lp(c.depth, c.rank) + lp(c.depth, c.rank + 1), c.depth, c.rank + 1, c.parent});
    if (has(c.depth + 1, 0)) heap.push({c.score + lp(c.depth + 1, 0), c.depth + 1, 0, node});
  };
  if (chain_seed) {
    // The top-1 chain; each chain node's first child is the next chain node,
    // so only its siblings are candidates.
    double score = 0.0;
    int32_t parent = -1;
    for (int32_t d = 1; d <= max_depth && out.size() < max_nodes && has(d, 0); ++d) {
      if (has(d, 1)) heap.push({score + lp(d, 1), d, 1, parent});
      score += lp(d, 0);
      parent = out.add(depths[size_t(d - 1)].tokens[0], parent);
    }
  } else if (has(1, 0)) {
    heap.push({lp(1, 0), 1, 0, -1});
  }
  while (out.size() < max_nodes && !heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const int32_t node = out.add(depths[size_t(c.depth - 1)].tokens[size_t(c.rank)], c.parent);
    expand(c, node);
  }
}

}  // namespace moeserve::spec
