// OpenAI-compatible request bodies (/v1/chat/completions, /v1/completions)
// and llama.cpp's /tokenize and /detokenize, parsed and validated into plain
// structs. Every function here takes the raw body and never throws: bad input
// of any kind (malformed or hostile JSON, wrong types, out-of-range values)
// comes back as a 400 ApiError whose `param` names the offending field.
// Unknown fields are ignored, and a field set to null counts as absent (many
// client libraries send null for "unset").
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/grammar/grammar.h"
#include "runtime/sampler.h"
#include "runtime/speculation.h"
#include "server/api/api_error.h"
#include "server/api/json_body.h"
#include "server/api/tool_call_grammar.h"

namespace moeserve::server::api {

inline constexpr size_t kMaxStopStrings = 16;
inline constexpr int kMaxTopLogprobs = 20;

// response_format. kJsonObject: the answer is one JSON object; kJsonValue:
// one JSON value (json_schema without a schema). A json_schema's schema,
// and a request's `grammar`, become GenerationParams::grammar.
enum class OutputFormat { kText, kJsonObject, kJsonValue };

// moeserve's extension field "speculative": {"mode": "none|ngram|dflash|auto",
// "max": N, "tree": N} (or just the mode as a string). What a request
// leaves out is the server's --spec setting.
struct SpeculativeParams {
  std::optional<runtime::SpecMode> mode;
  std::optional<int> max_draft, tree_nodes;
  // The server's configuration with this request's choices over it.
  runtime::SpecConfig over(runtime::SpecConfig base) const;
};

struct GenerationParams {
  // Fields the request leaves out keep SamplerOptions' defaults; temperature
  // 0 means greedy. `seed` is only meaningful when seed_given (otherwise the
  // server picks one).
  runtime::SamplerOptions sampling;
  int64_t max_tokens = -1;  // -1: until the context ends
  // "ignore_eos" (as vLLM and llama-server take it): generate max_tokens
  // tokens past end-of-sequence (load generators fix output lengths so).
  bool ignore_eos = false;
  std::vector<std::string> stop;
  bool logprobs = false;
  int top_logprobs = 0;
  bool seed_given = false;
  OutputFormat format = OutputFormat::kText;  // chat: response_format
  // The grammar the answer must follow (response_format json_schema, or a
  // GBNF `grammar` as llama-server takes it); null: none.
  std::shared_ptr<const runtime::grammar::Grammar> grammar;
  // Tool calls held to their schemas (strict tools, or a call required by
  // tool_choice); nullopt: tool calls are free text.
  std::optional<ToolCallGrammar> tool_calls;
  std::optional<SpeculativeParams> speculative;  // absent: the server's --spec
  // "priority" (as vLLM takes it): lower is admitted first when requests
  // wait for a slot; equal ones in arrival order.
  int priority = 0;
};

struct ChatCompletionRequest {
  std::string model;
  // Normalized for the chat template: role (developer -> system), content as
  // a string, assistant tool_calls with arguments parsed into objects,
  // tool_call_id, name and reasoning_content where given.
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;      // null when none; else [{"type":"function","function":{...}}]
  std::string tool_choice = "auto";  // auto | none | required | <function name>
  bool parallel_tool_calls = true;   // false: a required call is one call
  bool stream = false;
  bool include_usage = false;           // stream_options.include_usage
  std::optional<bool> enable_thinking;  // "enable_thinking" or chat_template_kwargs.enable_thinking
  // The rest of chat_template_kwargs (without enable_thinking): extra
  // template variables for ChatRenderInput::extra.
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();
  GenerationParams params;

  // Whether generated text should be scanned for tool calls.
  bool tools_enabled() const { return tools.is_array() && !tools.empty() && tool_choice != "none"; }
};

struct CompletionRequest {
  std::string model;
  std::string prompt_text;             // when !prompt_is_tokens
  std::vector<int32_t> prompt_tokens;  // when prompt_is_tokens
  bool prompt_is_tokens = false;
  bool stream = false;
  bool include_usage = false;
  bool echo = false;
  GenerationParams params;
};

struct TokenizeRequest {
  std::string content;
  bool add_special = false;
  bool with_pieces = false;
};

struct DetokenizeRequest {
  std::vector<int32_t> tokens;
};

Parsed<ChatCompletionRequest> parse_chat_completion_request(std::string_view body);
// The other APIs' bodies (anthropic.h, responses.h) as chat requests:
// `translate` rewrites the parsed body object into a chat completion body
// (failing through the same field readers), which is then read as
// parse_chat_completion_request reads a body.
Parsed<ChatCompletionRequest> parse_translated_chat_request(
    std::string_view body,
    const std::function<nlohmann::ordered_json(const nlohmann::ordered_json&)>& translate);
Parsed<CompletionRequest> parse_completion_request(std::string_view body);
Parsed<TokenizeRequest> parse_tokenize_request(std::string_view body);
Parsed<DetokenizeRequest> parse_detokenize_request(std::string_view body);

}  // namespace moeserve::server::api
