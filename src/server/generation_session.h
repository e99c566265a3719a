// One accepted generation request between the engine thread and the HTTP
// thread that answers it. The engine's token callbacks feed the output
// parser (content / reasoning / tool calls) and, for streams, queue ready
// SSE chunks; the HTTP thread drains them (next()) or, for a plain
// response, waits for the end (wait()) and takes the JSON body.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "runtime/batch_engine.h"
#include "server/api/anthropic.h"
#include "server/api/output_parser.h"
#include "server/api/response_format.h"
#include "server/api/responses.h"

namespace moeserve::server {

// kMessages: Anthropic's /v1/messages; kResponses: OpenAI's /v1/responses
// (both a chat underneath, with their own shapes).
enum class Endpoint { kChat, kCompletion, kMessages, kResponses };

struct SessionConfig {
  Endpoint endpoint = Endpoint::kChat;
  bool stream = false;
  bool include_usage = false;
  api::ResponseMeta meta;
  api::OutputParserOptions parser;  // chat only
  int top_logprobs = -1;            // -1: no logprobs
  std::string echo;                 // completions: prompt text echoed before the output
  int64_t prompt_tokens = 0;        // messages: reported by message_start
  api::json response_echo;          // responses: request fields the response object repeats
};

// What the session reports when it ends (for metrics).
struct SessionOutcome {
  Status status;
  runtime::RequestStats stats;
};

class GenerationSession {
 public:
  GenerationSession(SessionConfig config, const tok::Tokenizer& tokenizer);

  // Engine-thread callbacks (wire them into the EngineRequest). They only
  // queue the events: the output parser, logprob texts and JSON run on the
  // reading thread (next / wait / response_json), never on the engine's.
  bool on_token(const runtime::TokenEvent& ev);
  void on_finish(const Status& status, const runtime::RequestStats& stats);

  // Streams: waits up to `wait` for output; appends it to `out`. Returns
  // false once the stream is complete and everything was handed out.
  bool next(std::string& out, std::chrono::milliseconds wait);
  // The client went away: later tokens make on_token return false, which
  // cancels the request in the engine.
  void client_gone();

  // Plain responses: blocks until the request ends (wait_for: at most
  // `timeout`; nullopt while it is still running).
  SessionOutcome wait();
  std::optional<SessionOutcome> wait_for(std::chrono::milliseconds timeout);
  // The response body of a finished, successful plain request.
  api::json response_json();

 private:
  std::string finish_reason() const;
  api::MessageStop message_stop() const;
  api::ResponseEnd response_end() const;
  api::Usage usage() const;
  void push_chunk(const api::json& chunk);  // locked by caller
  api::TokenLogprob logprob_entry(const runtime::TokenEvent& ev) const;
  void stream_delta(api::OutputDelta&& delta, std::vector<api::TokenLogprob>&& lps);
  // Reader side, mu_ held: turns the engine's queued events into output.
  void drain_locked();
  void process_token_locked(const runtime::TokenEvent& ev);
  void process_finish_locked();

  SessionConfig config_;
  const tok::Tokenizer& tokenizer_;
  api::OutputParser parser_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> out_;               // SSE frames not yet handed out
  std::vector<runtime::TokenEvent> pending_;  // from the engine, not processed yet
  bool engine_done_ = false;                  // on_finish came (its output may still be pending)
  bool finished_ = false, gone_ = false;      // finished_: the final output is in out_
  Status status_;
  runtime::RequestStats stats_;
  // Accumulated result.
  std::string text_;         // raw model text (completions)
  api::OutputDelta parsed_;  // chat: content / reasoning / tool calls so far
  std::vector<api::TokenLogprob> logprobs_;
  size_t tool_calls_streamed_ = 0;
  std::optional<api::AnthropicStream> anthropic_;  // kMessages streams
  std::optional<api::ResponsesStream> responses_;  // kResponses streams
};

}  // namespace moeserve::server
