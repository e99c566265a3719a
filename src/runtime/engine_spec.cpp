// BatchEngine's speculative decoding: a decoding slot's rows of a step (its
// pending token, the tokens a recurrent rollback replays, its draft), and
// after the forward the tokens its verified rows yield (speculation.h).
#include <algorithm>

#include "runtime/batch_engine.h"
#include "runtime/engine_slot.h"

namespace moeserve::runtime {

void BatchEngine::start_speculation(Slot& s) {
  s.spec.reset();
  s.drafter.reset();
  s.spec_config = s.req.spec.value_or(options_.spec);
  s.stats.spec_mode = SpecMode::kNone;
  // A constraint decides each token from the ones before it; verifying a
  // draft under it would need the constraint's state per row, so such a
  // request decodes plainly.
  if (!s.spec_config.enabled() || !options_.make_drafter || s.req.constraint) return;
  s.drafter = options_.make_drafter(s.spec_config);
  if (s.drafter == nullptr) return;
  s.stats.spec_mode = s.spec_config.mode;
  s.draft_policy = acceptance_priors_[size_t(s.spec_config.mode)].policy(
      std::max(s.spec_config.max_draft, s.spec_config.tree_nodes), s.drafter->sources());
}

Status BatchEngine::plan_decode_rows(Slot& s, int64_t base_rows, int64_t draft_budget,
                                     std::vector<int32_t>& tokens, std::vector<models::SequenceSlice>& slices,
                                     std::vector<int64_t>& logit_rows, std::vector<DecodePlan>& plans) {
  s.draft.clear();
  if (s.drafter != nullptr && s.spec.replay().empty()) {
    // A step emits the accepted drafts and one more token: more draft than
    // the request may still emit, or the context still holds, is waste.
    const SpecConfig& c = s.spec_config;
    const int64_t room = std::min(s.seq.remaining(), reachable_positions(s) - s.seq.position()) - 1;
    const int64_t left = s.req.max_tokens - s.stats.completion_tokens;
    const int64_t max_nodes = std::max(c.max_draft, c.tree_nodes);
    const int64_t limit = left > 1 ? std::min<int64_t>({room, draft_budget, max_nodes}) : 0;
    const int64_t nodes =
        options_.spec_adaptive ? s.draft_policy.choose(step_costs_, base_rows, limit) : limit;
    if (nodes > 0) {
      const double t0 = now_seconds();
      s.spec.history(s.seq, s.history);
      s.history.push_back(s.pending);
      const int64_t depth = std::min<int64_t>({nodes, c.max_draft, left - 1});
      const int64_t budget_nodes = c.tree_nodes > 0 ? nodes : depth;
      DraftBudget budget{.max_nodes = budget_nodes, .max_depth = depth};
      if (options_.spec_adaptive) {
        for (int i = 0; i < DraftLengthPolicy::kSources; ++i)
          budget.source_nodes[i] = s.draft_policy.chosen(i);
      }
      s.drafter->draft(s.history, budget, s.draft);
      s.draft.truncate(budget_nodes);
      s.draft_source = s.drafter->last_source();
      s.draft_policy.observe_draft_time(now_seconds() - t0, s.draft_source);
      s.stats.spec.draft_seconds += now_seconds() - t0;
    }
  }
  MOESERVE_ASSIGN_OR_RETURN(std::vector<int32_t> rows, s.spec.begin(s.seq, s.pending, s.draft, tree_verify_));
  const int64_t n_draft = s.spec.draft().size();
  const int64_t row0 = int64_t(tokens.size());
  // (The step left room for these rows: BatchEngine::make_room.)
  MOESERVE_RETURN_IF_ERROR(s.seq.kv().reserve(s.seq.position() + int64_t(rows.size())));
  slices.push_back({row0, int64_t(rows.size()), s.seq.position(), s.seq.kv().view(), s.spec.tree_parents()});
  DecodePlan plan{&s, logit_rows.size(), n_draft, row0};
  for (int64_t j = 0; j <= n_draft; ++j) logit_rows.push_back(row0 + int64_t(rows.size()) - 1 - n_draft + j);
  tokens.insert(tokens.end(), rows.begin(), rows.end());
  plans.push_back(plan);
  return Status::ok();
}

int64_t BatchEngine::finish_decode_rows(const DecodePlan& p, const float* logits, const int32_t* greedy) {
  Slot& s = *p.slot;
  const size_t n_vocab = size_t(model_.info().n_vocab);
  auto row = [&](int64_t j) {
    return logits == nullptr
               ? std::span<const float>()
               : std::span<const float>(logits + (p.first_logit + size_t(j)) * n_vocab, n_vocab);
  };
  if (needs_logits(s) && logits == nullptr) {  // step() asks for them; never expected
    s.spec.reset();
    finish(s, make_error(StatusCode::kInternal, "the step returned no logits for a sampling request"));
    return 0;
  }
  if (p.n_draft == 0) {
    // Plain decode (or a replay): the cache keeps every row, then the
    // token is chosen with the sequence as its history, as without speculation.
    const Status kept = s.spec.commit(s.seq, {}, nullptr);
    if (!kept.is_ok()) {
      finish(s, kept);
      return 0;
    }
    hand_features(s, s.spec.committed_pos0(), p.row0, s.spec.committed_rows());
    handle_logits(s, logits == nullptr ? nullptr : row(0).data(), greedy[p.first_logit]);
    return 1;
  }
  // Walk the tree, choosing every row's token first (the cache must know
  // which nodes were kept before a token can end the request), then emit.
  const tok::Tokenizer& tokenizer = model_.tokenizer();
  s.history.clear();
  if (needs_logits(s)) {
    s.spec.history(s.seq, s.history);
    s.history.push_back(s.pending);
  }
  TreeWalk walk(s.spec.draft());
  std::vector<std::pair<int32_t, int64_t>> out;  // token, its row
  for (;;) {
    const int64_t r = walk.row();
    const std::span<const int32_t> candidates = walk.candidates();
    int32_t next = greedy[p.first_logit + size_t(r)];
    if (needs_logits(s)) {
      int index = -1;
      next = s.sampler->sample_against_drafts(row(r), s.history, candidates, &index);
    }
    out.push_back({next, r});
    // An end of sequence ends the walk: the cache keeps the tokens before it.
    if (s.req.stop_at_eos && (next == tokenizer.eos_id() || next == tokenizer.eot_id())) break;
    if (!walk.advance(next)) break;
    s.history.push_back(next);
    if (s.stats.completion_tokens + int64_t(out.size()) >= s.req.max_tokens) break;
  }
  const int64_t depth = s.spec.draft().depth();
  const Status kept = s.spec.commit(s.seq, walk.path(), &s.stats.spec);
  if (!kept.is_ok()) {
    finish(s, kept);
    return 0;
  }
  hand_features(s, s.spec.committed_pos0(), p.row0, s.spec.committed_rows());
  s.draft_policy.observe(std::max<int64_t>(depth, 1), int64_t(walk.path().size()), s.draft_source);
  int64_t emitted = 0;
  for (size_t i = 0; i < out.size() && s.busy; ++i) {
    emit_token(s, out[i].first, row(out[i].second));
    ++emitted;
  }
  return emitted;
}

// Drafters of one engine come from one factory: those that read features
// read the same layers.
std::span<const int32_t> BatchEngine::step_feature_layers() const {
  for (const auto& s : slots_) {
    if (!s->busy || s->drafter == nullptr || s->drafter->feature_layers().empty()) continue;
    // A prompt's features always; a decoding slot's while its policy drafts
    // (DraftLengthPolicy::wants_features).
    const bool wanted =
        !s->decoding ||
        ((!options_.spec_adaptive ||
          s->draft_policy.wants_features(DraftLengthPolicy::kFeatureLead, s->drafter->feature_source())) &&
         s->drafter->wants_features());
    if (wanted) return s->drafter->feature_layers();
  }
  return {};
}

void BatchEngine::hand_features(Slot& s, int64_t pos0, int64_t row0, std::span<const int32_t> picks) {
  if (s.drafter == nullptr || picks.empty() || captured_.empty()) return;
  const std::span<const int32_t> wanted = s.drafter->feature_layers();
  if (!std::equal(wanted.begin(), wanted.end(), captured_.layers.begin(), captured_.layers.end())) return;
  captured_.gather(row0, picks, feature_rows_);
  s.drafter->observe_features(pos0, feature_rows_, int64_t(picks.size()));
}

}  // namespace moeserve::runtime
