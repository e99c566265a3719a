#include "server/generation_session.h"

#include "server/api/api_error.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::server {

GenerationSession::GenerationSession(SessionConfig config, const tok::Tokenizer& tokenizer)
    : config_(std::move(config)), tokenizer_(tokenizer), parser_(config_.parser) {
  if (config_.stream && config_.endpoint == Endpoint::kChat) push_chunk(api::chat_chunk_role(config_.meta));
  if (config_.stream && config_.endpoint == Endpoint::kMessages) {
    anthropic_.emplace(config_.meta);
    api::Usage u;
    u.prompt_tokens = config_.prompt_tokens;
    out_.push_back(anthropic_->start(u));
  }
  if (config_.stream && config_.endpoint == Endpoint::kResponses) {
    responses_.emplace(config_.meta, config_.response_echo);
    out_.push_back(responses_->start());
  }
  if (config_.stream && config_.endpoint == Endpoint::kCompletion && !config_.echo.empty()) {
    api::CompletionChoiceResult piece;
    piece.text = config_.echo;
    piece.finish_reason.clear();
    push_chunk(api::text_completion_chunk(config_.meta, piece));
  }
}

void GenerationSession::push_chunk(const api::json& chunk) { out_.push_back(api::sse_data(chunk)); }

api::TokenLogprob GenerationSession::logprob_entry(const runtime::TokenEvent& ev) const {
  api::TokenLogprob lp;
  const int32_t id = ev.token;
  lp.token = tokenizer_.decode(std::span<const int32_t>(&id, 1));
  lp.logprob = ev.logprob;
  for (const runtime::TokenLogprob& t : ev.top) {
    const int32_t tid = t.id;
    lp.top.push_back({tokenizer_.decode(std::span<const int32_t>(&tid, 1)), t.logprob});
  }
  return lp;
}

// A streamed chat delta (content / reasoning / finished tool calls), with the
// logprobs of the tokens behind it. Caller holds mu_.
void GenerationSession::stream_delta(api::OutputDelta&& delta, std::vector<api::TokenLogprob>&& lps) {
  if (anthropic_ || responses_) {
    std::string events = anthropic_ ? anthropic_->delta(delta) : responses_->delta(delta);
    if (!events.empty()) out_.push_back(std::move(events));
    return;
  }
  if (delta.empty() && lps.empty()) return;
  api::ChatDelta d;
  d.content = std::move(delta.content);
  d.reasoning = std::move(delta.reasoning);
  d.tool_calls = std::move(delta.tool_calls);
  d.first_tool_index = tool_calls_streamed_;
  tool_calls_streamed_ += d.tool_calls.size();
  if (!lps.empty()) d.logprobs = api::chat_logprobs(lps);
  push_chunk(api::chat_chunk_delta(config_.meta, d));
}

// The engine thread only queues the event: parsing, logprob text and JSON
// happen on the thread that reads the session (drain_locked), so no stream
// costs the engine's step anything but a copy.
bool GenerationSession::on_token(const runtime::TokenEvent& ev) {
  std::lock_guard lock(mu_);
  if (gone_) return false;
  pending_.push_back(ev);
  cv_.notify_all();
  return true;
}

void GenerationSession::on_finish(const Status& status, const runtime::RequestStats& stats) {
  std::lock_guard lock(mu_);
  status_ = status;
  stats_ = stats;
  engine_done_ = true;
  cv_.notify_all();
}

void GenerationSession::drain_locked() {
  for (const runtime::TokenEvent& ev : pending_) process_token_locked(ev);
  pending_.clear();
  if (engine_done_ && !finished_) process_finish_locked();
}

void GenerationSession::process_token_locked(const runtime::TokenEvent& ev) {
  std::optional<api::TokenLogprob> lp;
  if (config_.top_logprobs >= 0) {
    lp = logprob_entry(ev);
    logprobs_.push_back(*lp);
  }
  if (config_.endpoint == Endpoint::kCompletion) {
    text_ += ev.text;
    if (config_.stream && (!ev.text.empty() || lp)) {
      api::CompletionChoiceResult piece;
      piece.text = ev.text;
      piece.finish_reason.clear();
      if (lp) piece.logprobs = api::completion_logprobs(std::span(&*lp, 1), 0);
      push_chunk(api::text_completion_chunk(config_.meta, piece));
    }
  } else {
    api::OutputDelta delta = parser_.push(ev.text);
    if (config_.stream) {
      std::vector<api::TokenLogprob> lps;
      if (lp) lps.push_back(*lp);
      api::OutputDelta copy = delta;
      stream_delta(std::move(copy), std::move(lps));
    }
    parsed_.append(std::move(delta));
  }
}

std::string GenerationSession::finish_reason() const {
  using runtime::StopReason;
  if (stats_.reason == StopReason::kMaxTokens || stats_.reason == StopReason::kContextFull) return "length";
  if (config_.endpoint == Endpoint::kChat && !parsed_.tool_calls.empty()) return "tool_calls";
  return "stop";
}

api::ResponseEnd GenerationSession::response_end() const {
  using runtime::StopReason;
  return {stats_.reason == StopReason::kMaxTokens || stats_.reason == StopReason::kContextFull};
}

api::MessageStop GenerationSession::message_stop() const {
  using runtime::StopReason;
  api::MessageStop m;
  if (stats_.reason == StopReason::kMaxTokens || stats_.reason == StopReason::kContextFull) {
    m.reason = "max_tokens";
  } else if (!parsed_.tool_calls.empty()) {
    m.reason = "tool_use";
  } else if (stats_.reason == StopReason::kStopString) {
    m.reason = "stop_sequence";
    m.sequence = stats_.stop_string;
  }
  return m;
}

api::Usage GenerationSession::usage() const {
  api::Usage u;
  u.prompt_tokens = stats_.prompt_tokens;
  u.completion_tokens = stats_.completion_tokens;
  u.cached_tokens = stats_.cached_tokens;
  if (stats_.spec_mode != runtime::SpecMode::kNone) {
    u.speculative_mode = runtime::spec_mode_name(stats_.spec_mode);
    u.draft_tokens = stats_.spec.drafted;
    u.accepted_draft_tokens = stats_.spec.accepted;
    u.draft_steps = stats_.spec.steps;
  }
  return u;
}

void GenerationSession::process_finish_locked() {
  const Status& status = status_;
  const runtime::RequestStats& stats = stats_;
  if (config_.endpoint == Endpoint::kCompletion) {
    text_ += stats.tail_text;
    if (config_.stream && status.is_ok()) {
      api::CompletionChoiceResult piece;
      piece.text = stats.tail_text;
      piece.finish_reason = finish_reason();
      push_chunk(api::text_completion_chunk(config_.meta, piece));
    }
  } else {
    api::OutputDelta delta = parser_.push(stats.tail_text);
    delta.append(parser_.finish());
    if (config_.stream) {
      api::OutputDelta copy = delta;
      stream_delta(std::move(copy), {});
    }
    parsed_.append(std::move(delta));
    if (config_.stream && status.is_ok() && config_.endpoint == Endpoint::kChat)
      push_chunk(api::chat_chunk_finish(config_.meta, finish_reason()));
  }
  if (anthropic_) {  // no [DONE]: message_stop (or an error event) ends the stream
    out_.push_back(status.is_ok() ? anthropic_->finish(message_stop(), usage())
                                  : api::AnthropicStream::error(api::server_error(status.message())));
  } else if (responses_) {  // no [DONE]: response.completed / incomplete / failed ends it
    out_.push_back(status.is_ok() ? responses_->finish(response_end(), usage())
                                  : responses_->error(api::server_error(status.message())));
  } else if (config_.stream) {
    if (!status.is_ok()) {
      api::ApiError e = api::server_error(status.message());
      out_.push_back(api::sse_data(e.to_json()));
    } else if (config_.include_usage) {
      push_chunk(config_.endpoint == Endpoint::kChat
                     ? api::chat_chunk_usage(config_.meta, usage())
                     : api::text_completion_usage_chunk(config_.meta, usage()));
    }
    out_.push_back(api::sse_done());
  }
  finished_ = true;
}

bool GenerationSession::next(std::string& out, std::chrono::milliseconds wait) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, wait, [&] { return !out_.empty() || !pending_.empty() || engine_done_; });
  drain_locked();
  const bool got = !out_.empty();
  while (!out_.empty()) {
    out += out_.front();
    out_.pop_front();
  }
  return got || !finished_;
}

void GenerationSession::client_gone() {
  std::lock_guard lock(mu_);
  gone_ = true;
}

SessionOutcome GenerationSession::wait() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return engine_done_; });
  drain_locked();
  return {status_, stats_};
}

std::optional<SessionOutcome> GenerationSession::wait_for(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return engine_done_; })) return std::nullopt;
  drain_locked();
  return SessionOutcome{status_, stats_};
}

api::json GenerationSession::response_json() {
  std::lock_guard lock(mu_);
  drain_locked();
  if (config_.endpoint == Endpoint::kCompletion) {
    api::CompletionChoiceResult c;
    c.text = config_.echo + text_;
    c.finish_reason = finish_reason();
    if (config_.top_logprobs >= 0) {
      c.logprobs = api::completion_logprobs(logprobs_, int64_t(config_.echo.size()));
    }
    return api::text_completion(config_.meta, c, usage());
  }
  api::ChatChoiceResult c;
  c.content = parsed_.content;
  c.reasoning = parsed_.reasoning;
  c.tool_calls = parsed_.tool_calls;
  if (config_.endpoint == Endpoint::kMessages)
    return api::anthropic_message(config_.meta, c, message_stop(), usage());
  if (config_.endpoint == Endpoint::kResponses)
    return api::response_object(config_.meta, config_.response_echo, c, response_end(), usage());
  c.finish_reason = finish_reason();
  if (config_.top_logprobs >= 0) c.logprobs = api::chat_logprobs(logprobs_);
  return api::chat_completion(config_.meta, c, usage());
}

}  // namespace moeserve::server
