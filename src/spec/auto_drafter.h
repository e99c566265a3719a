// `--spec auto` with a draft model loaded: per request, each step takes the
// n-gram lookup's draft or the DFlash draft, whichever has been keeping
// more tokens a step for this request. The drafter learns what each kept
// from the sequence itself: the tokens that followed its last proposal are
// walked through that proposal's tree. n-gram lookup costs nothing, so it
// is always tried first; when it finds nothing, the DFlash draft runs; when
// both have a proposal, the one with the better record wins, and every
// 16th such step goes to the other so its record stays current. The DFlash
// context is kept up to date whichever source drafts.
//
// A draft model that keeps almost nothing for this request (its record
// below kBenchBelow tokens a step) is benched: it costs a forward or more a
// step, so where the lookup has nothing the step goes without a draft
// (plain decoding's price) instead, and the model only probes: every
// kProbeEvery such steps, the interval doubling after each probe that
// misses (up to kProbeEveryMax) and back when the record recovers. While
// benched and no probe is near, it wants no target features either (their
// capture costs every forward a copy and a download).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "runtime/speculation.h"
#include "spec/ngram_drafter.h"

namespace moeserve::spec {

// What the requests of one server learnt of its draft model: kept tokens a
// step, whether it was tried, its probe interval. Each request's AutoDrafter
// starts from it and hands its own record back when it ends, so a draft
// model that keeps nothing is not tried afresh on every request (each trial
// costs a draft and a verify of its rows); its probes still find a request
// where it keeps tokens. Thread-safe.
class DraftModelRecord {
 public:
  struct Value {
    double kept = 1.0;  // optimistic start: the model gets tried
    int64_t steps = 0;
    int64_t probe_every = 16;
  };
  Value get() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return value_;
  }
  void put(const Value& v) {
    std::lock_guard<std::mutex> lock(mutex_);
    value_ = v;
  }

 private:
  mutable std::mutex mutex_;
  Value value_;
};

class AutoDrafter final : public runtime::Drafter {
 public:
  // `shared`: the record requests pass on (none: each drafter starts afresh).
  AutoDrafter(std::unique_ptr<NgramDrafter> ngram, std::unique_ptr<runtime::Drafter> model,
              std::shared_ptr<DraftModelRecord> shared = nullptr);
  ~AutoDrafter() override;
  void draft(std::span<const int32_t> context, const runtime::DraftBudget& budget,
             runtime::DraftTree& out) override;
  void reset() override;
  std::span<const int32_t> feature_layers() const override { return model_->feature_layers(); }
  bool wants_features() const override;
  int sources() const override { return 2; }
  int last_source() const override { return last_source_; }
  int feature_source() const override { return kModel; }
  void observe_features(int64_t pos0, std::span<const float> rows, int64_t n) override {
    model_->observe_features(pos0, rows, n);
  }
  Status status() const override { return model_->status(); }

  enum Source { kNgram = 0, kModel = 1 };
  // Tokens a step of each source kept on average so far (for tests and logs).
  double kept_per_step(Source s) const { return kept_[s]; }
  int64_t steps(Source s) const { return steps_[s]; }
  bool model_benched() const;
  static constexpr double kBenchBelow = 0.5;
  static constexpr int64_t kMinModelSteps = 3, kProbeEvery = 16, kProbeEveryMax = 256;
  // Steps before a probe from which the model is fed features again (a
  // DFlash block's worth, as DraftLengthPolicy::kFeatureLead).
  static constexpr int64_t kFeatureLead = 16;

 private:
  void learn(std::span<const int32_t> context);
  // Whether this step, where the model would draft, goes to it (counts the
  // benched model's skipped steps towards its next probe).
  bool model_takes_step();
  // The model's record from / to `shared_`.
  void load_model_record();
  void publish_model_record() const;

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
  int64_t skipped_ = 0;    // the benched model's steps skipped since its last probe
  int64_t probe_every_ = kProbeEvery;
  bool probing_ = false;  // the last proposal was a benched model's probe
  std::shared_ptr<DraftModelRecord> shared_;
};

}  // namespace moeserve::spec
