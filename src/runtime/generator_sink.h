// Generator's token handling, shared by its plain and speculative decode
// loops (generator.cpp, generator_spec.cpp): each generated token is checked
// for the end of sequence, detokenized, passed through the stop-string
// filter and the caller's callback — the same decisions in the same order
// whichever loop produced the token.
#pragma once

#include <chrono>

#include "runtime/generator.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::runtime {
namespace generator_detail {

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace generator_detail

class Generator::TokenSink {
 public:
  using Clock = std::chrono::steady_clock;
  TokenSink(const tok::Tokenizer& tokenizer, const GenerateOptions& options, const TextCallback& on_text,
            GenerateResult& result, Clock::time_point t0)
      : tokenizer_(tokenizer),
        options_(options),
        on_text_(on_text),
        r_(result),
        t0_(t0),
        decoder_(tokenizer),
        filter_(options.stop) {}

  // Takes the next generated token; false when generation ends with it
  // (r.reason says why: end of sequence, a stop string, the caller, or
  // max_tokens reached).
  bool push(int32_t next) {
    if (r_.tokens.empty() && !first_seen_) {
      r_.first_token_seconds = std::chrono::duration<double>(Clock::now() - t0_).count();
      first_seen_ = true;
    }
    if (options_.stop_at_eos && (next == tokenizer_.eos_id() || next == tokenizer_.eot_id())) {
      r_.reason = StopReason::kEndOfSequence;
      return false;
    }
    r_.tokens.push_back(next);
    emit(filter_.push(decoder_.feed(next)));
    if (filter_.stopped()) {
      r_.reason = StopReason::kStopString;
      return false;
    }
    if (!keep_going_) {
      r_.reason = StopReason::kCallback;
      return false;
    }
    if (int64_t(r_.tokens.size()) >= options_.max_tokens) {
      r_.reason = StopReason::kMaxTokens;
      return false;
    }
    return true;
  }
  // Releases the held-back text at the end.
  void finish() {
    if (filter_.stopped()) return;
    std::string tail = filter_.push(decoder_.flush());
    if (!filter_.stopped()) tail += filter_.flush();
    emit(tail);
  }

 private:
  void emit(const std::string& text) {
    if (text.empty()) return;
    r_.text += text;
    if (on_text_ && !on_text_(text)) keep_going_ = false;
  }
  const tok::Tokenizer& tokenizer_;
  const GenerateOptions& options_;
  const TextCallback& on_text_;
  GenerateResult& r_;
  Clock::time_point t0_;
  tok::IncrementalDecoder decoder_;
  StopStringFilter filter_;
  bool keep_going_ = true;
  bool first_seen_ = false;
};

}  // namespace moeserve::runtime
