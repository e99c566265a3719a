#include "spec/ddtree.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <queue>

namespace moeserve::spec {

void top_log_probs(std::span<const float> logits, int k, float multiplier, float softcap,
                   DepthCandidates& out) {
  auto value = [&](size_t i) {
    float v = logits[i] * multiplier;
    if (softcap > 0.0f) v = softcap * std::tanh(v / softcap);
    return std::isnan(v) ? -std::numeric_limits<float>::infinity() : v;
  };
  const size_t n = logits.size();
  float max = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < n; ++i) max = std::max(max, value(i));
  double sum = 0.0;
  if (std::isfinite(max)) {
    for (size_t i = 0; i < n; ++i) sum += std::exp(double(value(i) - max));
  }
  const double log_z = std::isfinite(max) ? double(max) + std::log(sum) : 0.0;
  // The k best in one pass: a min-heap whose top is the worst kept, so most
  // entries cost one comparison. "Better": larger, then the lower id.
  const size_t kk = std::min(size_t(std::max(k, 0)), n);
  using Entry = std::pair<float, int32_t>;
  auto better = [](const Entry& a, const Entry& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  std::vector<Entry> heap;
  heap.reserve(kk);
  for (size_t i = 0; i < n && kk > 0; ++i) {
    const Entry e{value(i), int32_t(i)};
    if (heap.size() < kk) {
      heap.push_back(e);
      std::push_heap(heap.begin(), heap.end(), better);
    } else if (better(e, heap.front())) {
      std::pop_heap(heap.begin(), heap.end(), better);
      heap.back() = e;
      std::push_heap(heap.begin(), heap.end(), better);
    }
  }
  std::sort(heap.begin(), heap.end(), better);
  out.tokens.resize(heap.size());
  out.log_probs.resize(heap.size());
  for (size_t i = 0; i < heap.size(); ++i) {
    out.tokens[i] = heap[i].second;
    out.log_probs[i] = float(double(heap[i].first) - log_z);
  }
}

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
