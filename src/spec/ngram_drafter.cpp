#include "spec/ngram_drafter.h"

#include <algorithm>

namespace moeserve::spec {

namespace {

// Adds what follows context[from..) (up to max_depth tokens) as a path
// from the root, sharing the nodes already there; stops at the node budget.
void add_path(std::span<const int32_t> context, int64_t from, const runtime::DraftBudget& budget,
              runtime::DraftTree& out) {
  int32_t node = -1;
  const int64_t end = std::min<int64_t>(int64_t(context.size()), from + budget.max_depth);
  for (int64_t i = from; i < end; ++i) {
    const int32_t token = context[size_t(i)];
    const int32_t existing = out.child(node, token);
    if (existing >= 0) {
      node = existing;
      continue;
    }
    if (out.size() >= budget.max_nodes) return;
    node = out.add(token, node);
  }
}

}  // namespace

void NgramDrafter::draft(std::span<const int32_t> context, const runtime::DraftBudget& budget,
                         runtime::DraftTree& out) {
  out.clear();
  const int64_t len = int64_t(context.size());
  if (budget.max_nodes <= 0 || budget.max_depth <= 0) return;
  // Occurrences merged at most (each adds a path of new nodes where it differs).
  constexpr int kMaxOccurrences = 16;
  int used = 0;
  // A chain budget takes the longest suffix's latest occurrence alone.
  const bool chain = budget.max_nodes <= budget.max_depth;
  for (int64_t n = std::min<int64_t>(max_, len - 1); n >= min_ && out.size() < budget.max_nodes; --n) {
    const std::span<const int32_t> suffix = context.subspan(size_t(len - n));
    // Latest occurrences first: recent text predicts best (an edit repeats
    // the lines just above, not the file's first copy).
    for (int64_t start = len - n - 1; start >= 0 && used < kMaxOccurrences; --start) {
      if (context[size_t(start)] != suffix[0] ||
          !std::equal(suffix.begin(), suffix.end(), context.begin() + start)) {
        continue;
      }
      add_path(context, start + n, budget, out);
      ++used;
      if (chain || out.size() >= budget.max_nodes) return;
    }
  }
}

}  // namespace moeserve::spec
