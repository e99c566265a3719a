// `--spec auto` with a draft model loaded: per request, each step takes the
// n-gram lookup's draft or the DFlash draft, whichever has been keeping
// more tokens a step for this request. The drafter learns what each kept
// from the sequence itself: the tokens that followed its last proposal are
// walked through that proposal's tree. n-gram lookup costs nothing, so it
// is always tried first; when it finds nothing, the DFlash draft runs; when
// both have a proposal, the one with the better record wins, and every
// 16th such step goes to the other so its record stays current. The DFlash
// context is kept up to date whichever source drafts.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/speculation.h"
#include "spec/ngram_drafter.h"

namespace moeserve::spec {

class AutoDrafter final : public runtime::Drafter {
 public:
  AutoDrafter(std::unique_ptr<NgramDrafter> ngram, std::unique_ptr<runtime::Drafter> model);
  void draft(std::span<const int32_t> context, const runtime::DraftBudget& budget,
             runtime::DraftTree& out) override;
  void reset() override;
  std::span<const int32_t> feature_layers() const override { return model_->feature_layers(); }
  void observe_features(int64_t pos0, std::span<const float> rows, int64_t n) override {
    model_->observe_features(pos0, rows, n);
  }
  Status status() const override { return model_->status(); }

  enum Source { kNgram = 0, kModel = 1 };
  // Tokens a step of each source kept on average so far (for tests and logs).
  double kept_per_step(Source s) const { return kept_[s]; }
  int64_t steps(Source s) const { return steps_[s]; }

 private:
  void learn(std::span<const int32_t> context);

  std::unique_ptr<NgramDrafter> ngram_;
  std::unique_ptr<runtime::Drafter> model_;
  runtime::DraftTree candidate_;
  // The last proposal: its tree, its source and the context length it followed.
  runtime::DraftTree last_;
  Source last_source_ = kNgram;
  size_t last_context_ = 0;
  double kept_[2] = {1.0, 1.0};  // optimistic start: each source gets tried
  int64_t steps_[2] = {0, 0};
  int64_t contested_ = 0;  // steps where both had a proposal
};

}  // namespace moeserve::spec
