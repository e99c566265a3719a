// Generator's speculative decode loop: per step, draft, verify the pending
// token and the draft in one forward, emit the accepted tokens and the
// target's own next one, keep what the cache should keep.
#include <algorithm>
#include <chrono>

#include "runtime/generator.h"
#include "runtime/generator_sink.h"

namespace moeserve::runtime {
using generator_detail::Clock;
using generator_detail::seconds_since;

Status Generator::verify(std::span<const int32_t> rows, int64_t first_logit_row, float* logits,
                         int32_t* greedy, std::span<const int32_t> tree_parents) {
  MOESERVE_RETURN_IF_ERROR(status_);
  const int64_t n = int64_t(rows.size());
  if (n < 1 || first_logit_row < 0 || first_logit_row >= n) {
    return make_error(StatusCode::kInvalidArgument, "verify: {} rows, logits from row {}", n,
                      first_logit_row);
  }
  if (n > seq_.remaining()) {
    return make_error(StatusCode::kOutOfRange,
                      "verify: {} rows but only {} positions of the context are free", n, seq_.remaining());
  }
  std::vector<int64_t> logit_rows;
  for (int64_t i = first_logit_row; i < n; ++i) logit_rows.push_back(i);
  MOESERVE_RETURN_IF_ERROR(seq_.kv().reserve(seq_.position() + n));
  const backend::SequenceSlice slice{0, n, seq_.position(), seq_.kv().view(), tree_parents};
  models::ForwardBatch b;
  b.tokens = rows;
  b.sequences = std::span<const backend::SequenceSlice>(&slice, 1);
  b.expert_counts = expert_counts_;
  b.decode_rows = n;
  b.logit_rows = logit_rows;
  b.logits = logits;
  b.greedy = greedy;
  prepare_capture(b, n);
  return model_.net().forward(b, *ws_, profile_);
}

Status Generator::decode_speculative(const GenerateOptions& options, Sampler& sampler, bool device_greedy,
                                     std::vector<float>& logits, int32_t first, TokenSink& sink,
                                     GenerateResult& r) {
  const int64_t n_vocab = model_.info().n_vocab;
  const bool tree_verify = model_.tree_verify();
  const SpecConfig& spec_config = options.spec;
  const int64_t max_nodes = std::max(spec_config.max_draft, spec_config.tree_nodes);
  SpecSequence spec;
  AcceptancePrior& prior = acceptance_priors_[size_t(spec_config.mode)];
  DraftLengthPolicy policy = prior.policy(static_cast<int>(max_nodes), options.drafter->sources());
  const int feature_source = options.drafter->feature_source();
  std::vector<int32_t> history, greedy;
  DraftTree draft;
  int32_t next = first;
  while (sink.push(next)) {
    const int32_t pending = next;
    const int64_t n_replay = int64_t(spec.replay().size());
    const int64_t room = seq_.remaining() - n_replay - 1;
    if (room < 0) {
      r.reason = StopReason::kContextFull;
      break;
    }
    // More draft than tokens left to emit would be verified for nothing.
    const int64_t left = options.max_tokens - int64_t(r.tokens.size());
    int64_t limit = std::min<int64_t>(room, max_nodes);
    if (n_replay > 0 || left <= 1) limit = 0;  // a replay step carries no draft (speculation.h)
    const int64_t nodes = options.spec_adaptive ? policy.choose(step_costs_, 1 + n_replay, limit) : limit;
    capture_features_ =
        (!options.spec_adaptive || policy.wants_features(DraftLengthPolicy::kFeatureLead, feature_source)) &&
        options.drafter->wants_features();
    draft.clear();
    int draft_source = 0;
    const Clock::time_point t_draft = Clock::now();
    if (nodes > 0) {
      spec.history(seq_, history);
      history.push_back(pending);
      const int64_t depth = std::min<int64_t>({nodes, spec_config.max_draft, left - 1});
      const int64_t budget_nodes = spec_config.tree_nodes > 0 ? nodes : depth;
      DraftBudget budget{.max_nodes = budget_nodes, .max_depth = depth};
      if (options.spec_adaptive) {
        for (int i = 0; i < DraftLengthPolicy::kSources; ++i) budget.source_nodes[i] = policy.chosen(i);
      }
      options.drafter->draft(history, budget, draft);
      draft.truncate(budget_nodes);
      draft_source = options.drafter->last_source();
      policy.observe_draft_time(seconds_since(t_draft), draft_source);
    }
    r.spec.draft_seconds += seconds_since(t_draft);

    MOESERVE_ASSIGN_OR_RETURN(std::vector<int32_t> rows, spec.begin(seq_, pending, draft, tree_verify));
    const int64_t n_draft = spec.draft().size();
    const int64_t first_row = int64_t(rows.size()) - 1 - n_draft;
    greedy.assign(size_t(n_draft + 1), 0);
    if (!device_greedy) logits.resize(size_t(n_draft + 1) * size_t(n_vocab));
    const Clock::time_point t_verify = Clock::now();
    MOESERVE_RETURN_IF_ERROR(verify(rows, first_row, device_greedy ? nullptr : logits.data(),
                                    device_greedy ? greedy.data() : nullptr, spec.tree_parents()));
    const double dt = seconds_since(t_verify);
    step_costs_.record(int64_t(rows.size()), dt);
    if (n_draft > 0) r.spec.verify_seconds += dt * double(n_draft) / double(rows.size());

    // Walk the tree: each row's token is checked against its node's
    // children; the first miss (or a leaf) gives the target's own token,
    // the next pending one.
    if (!device_greedy) {
      spec.history(seq_, history);
      history.push_back(pending);
    }
    TreeWalk walk(spec.draft());
    bool more = true;
    for (;;) {
      const int64_t row = walk.row();
      const std::span<const int32_t> candidates = walk.candidates();
      if (device_greedy) {
        next = greedy[size_t(row)];
      } else {
        const std::span<const float> lg(logits.data() + size_t(row) * size_t(n_vocab), size_t(n_vocab));
        int index = -1;
        next = sampler.sample_against_drafts(lg, history, candidates, &index);
      }
      if (!walk.advance(next)) break;
      history.push_back(next);
      // An accepted token is emitted here; the one after the last accepted
      // is emitted by the outer loop (it becomes the next pending).
      if (!(more = sink.push(next))) break;
    }
    MOESERVE_RETURN_IF_ERROR(spec.commit(seq_, walk.path(), &r.spec));
    hand_features(spec.committed_pos0(), 0, spec.committed_rows());
    if (n_draft > 0) {
      policy.observe(std::max<int64_t>(draft.depth(), 1), int64_t(walk.path().size()), draft_source);
    }
    if (!more) break;
  }
  prior.add(policy);
  capture_features_ = true;
  return Status::ok();
}

}  // namespace moeserve::runtime
