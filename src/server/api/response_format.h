// JSON bodies of OpenAI-compatible responses, built from small input structs:
// chat.completion and its streamed chat.completion.chunk objects,
// text_completion (+ chunks), both logprobs layouts, the /v1/models list, and
// Server-Sent-Events framing. Pure functions; the caller owns ids and clocks
// (ResponseMeta) so every chunk of one stream carries the same id/created.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "server/api/output_parser.h"

namespace moeserve::server::api {

using json = nlohmann::json;

// prefix + 24 random hex digits, e.g. make_id("chatcmpl-").
std::string make_id(std::string_view prefix);
int64_t unix_time_now();

// What every object of one response shares.
struct ResponseMeta {
  std::string id;  // "chatcmpl-..." / "cmpl-..."
  std::string model;
  int64_t created = 0;  // unix seconds
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens served from the prefix cache
  // Speculative decoding (moeserve's extension; reported when the request ran with it).
  std::string speculative_mode{};  // empty: none
  int64_t draft_tokens = 0, accepted_draft_tokens = 0, draft_steps = 0;

  json to_json() const;
  // {"mode", "draft_tokens", "accepted_draft_tokens", "mean_acceptance_length"},
  // or null without speculation; every API's usage carries it as "speculative".
  json speculative_json() const;
};

// ---- logprobs ----------------------------------------------------------------

struct TopLogprob {
  std::string token;  // the token's text (bytes; may be part of a UTF-8 character)
  float logprob = 0;
};

struct TokenLogprob {
  std::string token;
  float logprob = 0;
  std::vector<TopLogprob> top;  // most likely first
};

// Chat layout: {"content": [{token, logprob, bytes, top_logprobs: [...]}], "refusal": null}.
// Non-finite logprobs are written as -9999 (as OpenAI does): JSON has no -inf.
json chat_logprobs(std::span<const TokenLogprob> tokens);
// The entries of chat_logprobs' "content" alone (for stream chunks to wrap).
json chat_logprob_entries(std::span<const TokenLogprob> tokens);
// Completions layout: {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset};
// text offsets count bytes from `text_offset` (the length of the echoed prompt, if any).
json completion_logprobs(std::span<const TokenLogprob> tokens, int64_t text_offset = 0);

// ---- chat --------------------------------------------------------------------

struct ChatChoiceResult {
  std::string content;
  std::string reasoning;
  std::vector<ToolCall> tool_calls;
  std::string finish_reason =
      "stop";                    // stop | length | tool_calls ("stop" with tool calls becomes tool_calls)
  std::optional<json> logprobs;  // chat_logprobs(); absent: null
};

json chat_completion(const ResponseMeta& meta, const ChatChoiceResult& choice, const Usage& usage);

// Streaming: one role chunk, then delta chunks, then a finish chunk, then
// (with include_usage) a usage chunk whose choices is [].
json chat_chunk_role(const ResponseMeta& meta);

struct ChatDelta {
  std::string content;
  std::string reasoning;
  std::vector<ToolCall> tool_calls;
  size_t first_tool_index = 0;   // index of tool_calls[0] among all calls of this response
  std::optional<json> logprobs;  // chat_logprobs() of the tokens behind this delta
};
json chat_chunk_delta(const ResponseMeta& meta, const ChatDelta& delta);
json chat_chunk_finish(const ResponseMeta& meta, std::string_view finish_reason);
json chat_chunk_usage(const ResponseMeta& meta, const Usage& usage);

// ---- completions -------------------------------------------------------------

struct CompletionChoiceResult {
  std::string text;
  std::string finish_reason = "stop";  // stop | length
  std::optional<json> logprobs;        // completion_logprobs(); absent: null
};

json text_completion(const ResponseMeta& meta, const CompletionChoiceResult& choice, const Usage& usage);
// A streamed piece; finish_reason empty: null (not finished yet).
json text_completion_chunk(const ResponseMeta& meta, const CompletionChoiceResult& piece);
json text_completion_usage_chunk(const ResponseMeta& meta, const Usage& usage);

// ---- models & framing --------------------------------------------------------

struct ModelInfo {
  std::string id;
  int64_t created = 0;
};
json models_list(std::span<const ModelInfo> models);

// Compact JSON; invalid UTF-8 (model output cut mid-character) becomes U+FFFD
// instead of an exception.
std::string dump_json(const json& value);
// "data: <compact json>\n\n" and "data: [DONE]\n\n".
std::string sse_data(const json& value);
std::string sse_done();

}  // namespace moeserve::server::api
