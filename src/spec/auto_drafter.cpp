#include "spec/auto_drafter.h"

#include <algorithm>

namespace moeserve::spec {

AutoDrafter::AutoDrafter(std::unique_ptr<NgramDrafter> ngram, std::unique_ptr<runtime::Drafter> model,
                         std::shared_ptr<DraftModelRecord> shared)
    : ngram_(std::move(ngram)), model_(std::move(model)), shared_(std::move(shared)) {
  load_model_record();
}

AutoDrafter::~AutoDrafter() { publish_model_record(); }

void AutoDrafter::load_model_record() {
  const DraftModelRecord::Value v = shared_ != nullptr ? shared_->get() : DraftModelRecord::Value{};
  kept_[kModel] = v.kept;
  // A record of enough trials carries a bench; a few trials start afresh.
  steps_[kModel] = std::min(v.steps, kMinModelSteps);
  probe_every_ = std::clamp(v.probe_every, kProbeEvery, kProbeEveryMax);
}

void AutoDrafter::publish_model_record() const {
  if (shared_ == nullptr || steps_[kModel] == 0) return;  // nothing learnt
  shared_->put({kept_[kModel], steps_[kModel], probe_every_});
}

void AutoDrafter::reset() {
  publish_model_record();
  model_->reset();
  last_.clear();
  last_context_ = 0;
  kept_[kNgram] = 1.0;
  steps_[kNgram] = 0;
  contested_ = 0;
  skipped_ = 0;
  probing_ = false;
  load_model_record();
}

bool AutoDrafter::model_benched() const {
  return steps_[kModel] >= kMinModelSteps && kept_[kModel] < kBenchBelow;
}

bool AutoDrafter::wants_features() const {
  return !model_benched() || skipped_ + kFeatureLead >= probe_every_;
}

bool AutoDrafter::model_takes_step() {
  if (!model_benched()) return true;
  if (++skipped_ < probe_every_) return false;
  skipped_ = 0;
  probing_ = true;
  return true;
}

// The tokens after the last proposal's context (its pending token first)
// walked through its tree: how many of its nodes the target kept.
void AutoDrafter::learn(std::span<const int32_t> context) {
  if (last_.empty() || context.size() <= last_context_) return;
  int32_t node = -1;
  int64_t kept = 0;
  for (size_t i = last_context_; i < context.size(); ++i) {
    node = last_.child(node, context[i]);
    if (node < 0) break;
    ++kept;
  }
  double& k = kept_[last_source_];
  k += 0.25 * (double(kept) - k);
  ++steps_[last_source_];
  if (probing_) {
    // A benched model's probe: a miss makes probes rarer; a record back
    // above the bench line unbenches it (model_benched) and resets them.
    probe_every_ = model_benched() ? std::min(2 * probe_every_, kProbeEveryMax) : kProbeEvery;
    probing_ = false;
  }
  last_.clear();
}

// Each source drafts within its own share of the budget
// (DraftBudget::for_source: the policy's length for it, 0 when its own
// record says it does not pay this step).
void AutoDrafter::draft(std::span<const int32_t> context, const runtime::DraftBudget& budget,
                        runtime::DraftTree& out) {
  learn(context);
  out.clear();
  const runtime::DraftBudget lookup = budget.for_source(kNgram), model = budget.for_source(kModel);
  const bool model_may = model.max_depth > 0 && model.max_nodes > 0;
  ngram_->draft(context, lookup, out);
  Source source = kNgram;
  if (out.empty()) {
    source = kModel;
  } else if (model_may && !model_benched()) {
    // Both could propose: the better record, the other one now and then.
    const bool model_better = kept_[kModel] > kept_[kNgram];
    const bool explore = ++contested_ % 16 == 0;
    source = model_better != explore ? kModel : kNgram;
  }
  if (source == kModel && (!model_may || !model_takes_step())) {
    // The model may not draft (the policy, or a bench) where the lookup
    // has nothing: no draft this step (its time is the lookup's).
    last_.clear();
    last_source_ = kNgram;
    last_context_ = context.size();
    return;
  }
  if (source == kModel) {
    model_->draft(context, model, candidate_);
    if (!candidate_.empty() || out.empty()) {
      out = candidate_;
    } else {
      source = kNgram;
    }
  }
  last_ = out;
  last_source_ = source;
  // The proposal follows the whole context; the next call's context starts
  // with it and adds the pending token's successors.
  last_context_ = context.size();
}

}  // namespace moeserve::spec
