// The Anthropic Messages API (POST /v1/messages, /v1/messages/count_tokens)
// as a translation onto the OpenAI chat request the engine already serves:
// the body is rewritten into an OpenAI chat completion body and parsed by
// parse_chat_completion_request, so both APIs share one validation, one chat
// template path, one sampler and the engine's batching and prefix cache.
// Replies are built here: the `message` object, the streamed events
// (message_start, content_block_start / _delta / _stop, message_delta,
// message_stop) and Anthropic's error shape.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/api/api_error.h"
#include "server/api/json_body.h"
#include "server/api/openai_request.h"
#include "server/api/output_parser.h"
#include "server/api/response_format.h"

namespace moeserve::server::api {

struct MessagesRequest {
  ChatCompletionRequest chat;  // the translated request (chat.stream is false; see stream)
  bool stream = false;
};

// POST /v1/messages. Translation: `system` (a string or text blocks) becomes
// the first system message; content blocks map to the chat template's
// fields: text -> content, thinking -> reasoning_content, tool_use ->
// tool_calls (input as the arguments object), tool_result -> a "tool"
// message per result (is_error results get an "Error: " prefix); tools
// {name, description, input_schema} -> functions; tool_choice auto / any /
// tool / none -> auto / required / the name / none; stop_sequences -> stop;
// thinking {type: enabled | disabled} -> enable_thinking. max_tokens is
// required, as in Anthropic's API. Images and documents are refused (400).
Parsed<MessagesRequest> parse_messages_request(std::string_view body);
// POST /v1/messages/count_tokens: the same body without max_tokens.
Parsed<MessagesRequest> parse_count_tokens_request(std::string_view body);

// end_turn | max_tokens | stop_sequence | tool_use, from the engine's stop.
struct MessageStop {
  std::string reason = "end_turn";
  std::string sequence;  // stop_sequence: the string that matched
};

// The complete `message` object of a non-streamed reply.
json anthropic_message(const ResponseMeta& meta, const ChatChoiceResult& choice, const MessageStop& stop,
                       const Usage& usage);

// The error body {"type": "error", "error": {"type": ..., "message": ...}}
// with Anthropic's type for the status (invalid_request_error,
// authentication_error, not_found_error, request_too_large, rate_limit_error,
// api_error, overloaded_error).
json anthropic_error(const ApiError& e);
// An OpenAI error body (ApiError::to_json) rewritten into Anthropic's shape;
// other bodies are wrapped as api_error.
std::string anthropic_error_body(int status, const std::string& openai_body);

// One SSE event: "event: <type>\ndata: <json>\n\n".
std::string anthropic_event(const json& data);

// The streamed events of one message: content blocks opened, filled and
// closed as the parsed output arrives (reasoning, text, finished tool calls).
class AnthropicStream {
 public:
  explicit AnthropicStream(ResponseMeta meta) : meta_(std::move(meta)) {}
  // message_start (with the prompt's token counts) and a ping.
  std::string start(const Usage& usage) const;
  std::string delta(const OutputDelta& delta);
  // Closes the open block; message_delta (stop, output tokens), message_stop.
  std::string finish(const MessageStop& stop, const Usage& usage);
  // An error event (the stream ends after it).
  static std::string error(const ApiError& e);

 private:
  enum class Block { kNone, kThinking, kText };
  std::string open(Block block, const json& content_block);
  std::string close();

  ResponseMeta meta_;
  Block open_ = Block::kNone;
  int index_ = -1;  // of the last block started
};

}  // namespace moeserve::server::api
