// Generator's speculative decode loop: per step, draft, verify the pending
// token and the draft in one forward, emit the accepted tokens and the
// target's own next one, keep what the cache should keep.
#include <algorithm>
#include <chrono>

#include "runtime/generator.h"
#include "runtime/generator_sink.h"

namespace moeserve::runtime {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

Status Generator::verify(std::span<const int32_t> rows, int64_t first_logit_row, float* logits,
                         int32_t* greedy) {
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
  models::ForwardBatch b;
  b.tokens = rows;
  b.pos0 = seq_.position();
  b.kv = seq_.kv().view();
  b.expert_counts = expert_counts_;
  b.decode_rows = n;
  b.logit_rows = logit_rows;
  b.logits = logits;
  b.greedy = greedy;
  return model_.net().forward(b, *ws_, profile_);
}

Status Generator::decode_speculative(const GenerateOptions& options, Sampler& sampler, bool device_greedy,
                                     std::vector<float>& logits, int32_t first, TokenSink& sink,
                                     GenerateResult& r) {
  const int64_t n_vocab = model_.info().n_vocab;
  SpecSequence spec;
  DraftLengthPolicy policy(options.spec.max_draft);
  std::vector<int32_t> history, draft, greedy;
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
    int64_t limit = std::min<int64_t>({room, left - 1, options.spec.max_draft});
    if (n_replay > 0) limit = 0;  // a replay step carries no draft (speculation.h)
    const int64_t want = options.spec_adaptive ? policy.choose(step_costs_, 1 + n_replay, limit) : limit;
    draft.clear();
    const Clock::time_point t_draft = Clock::now();
    if (want > 0) {
      spec.history(seq_, history);
      history.push_back(pending);
      options.drafter->draft(history, want, draft);
      if (int64_t(draft.size()) > want) draft.resize(size_t(want));
    }
    r.spec.draft_seconds += seconds_since(t_draft);

    MOESERVE_ASSIGN_OR_RETURN(std::vector<int32_t> rows, spec.begin(seq_, pending, draft));
    const int64_t n_draft = int64_t(spec.draft().size());
    const int64_t first_row = int64_t(rows.size()) - 1 - n_draft;
    greedy.assign(size_t(n_draft + 1), 0);
    if (!device_greedy) logits.resize(size_t(n_draft + 1) * size_t(n_vocab));
    const Clock::time_point t_verify = Clock::now();
    MOESERVE_RETURN_IF_ERROR(verify(rows, first_row, device_greedy ? nullptr : logits.data(),
                                    device_greedy ? greedy.data() : nullptr));
    const double dt = seconds_since(t_verify);
    step_costs_.record(int64_t(rows.size()), dt);
    if (n_draft > 0) r.spec.verify_seconds += dt * double(n_draft) / double(rows.size());

    // Walk the rows: row j's token is checked against draft j; the first
    // miss (or the last row) gives the target's own token, the next pending.
    if (!device_greedy) {
      spec.history(seq_, history);
      history.push_back(pending);
    }
    int64_t accepted = 0;
    bool more = true;
    for (int64_t j = 0; j <= n_draft; ++j) {
      const int32_t d = j < n_draft ? spec.draft()[size_t(j)] : -1;
      bool hit = false;
      if (device_greedy) {
        next = greedy[size_t(j)];
        hit = next == d;
      } else {
        const std::span<const float> row(logits.data() + size_t(j) * size_t(n_vocab), size_t(n_vocab));
        next = d >= 0 ? sampler.sample_against_draft(row, history, d, &hit) : sampler.sample(row, history);
      }
      if (!hit) break;
      ++accepted;
      history.push_back(next);
      // An accepted token is emitted here; the one after the last accepted
      // is emitted by the outer loop (it becomes the next pending).
      if (!(more = sink.push(next))) break;
    }
    MOESERVE_RETURN_IF_ERROR(spec.commit(seq_, accepted, &r.spec));
    if (n_draft > 0) policy.observe(n_draft, accepted);
    if (!more) break;
  }
  return Status::ok();
}

}  // namespace moeserve::runtime
