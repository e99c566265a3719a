// Prompt lookup (n-gram) drafts: text that repeats itself — code being
// edited, a document quoted back, a JSON shape filled in again — is drafted
// by copying what followed the last earlier occurrence of the sequence's
// current suffix. With a node budget beyond one path, what followed the
// earlier occurrences too (latest first, longest suffix first) is merged
// into a tree, so a suffix that continued several ways is verified all
// ways at once. No model, no device: microseconds a step.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "runtime/speculation.h"

namespace moeserve::spec {

class NgramDrafter : public runtime::Drafter {
 public:
  // Suffixes of ngram_max tokens are tried first, down to ngram_min.
  NgramDrafter(int ngram_min, int ngram_max) : min_(ngram_min), max_(ngram_max) {}
  void draft(std::span<const int32_t> context, const runtime::DraftBudget& budget,
             runtime::DraftTree& out) override;

 private:
  int min_, max_;
};

}  // namespace moeserve::spec
