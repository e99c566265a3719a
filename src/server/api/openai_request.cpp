#include "server/api/openai_request.h"

#include <exception>
#include <utility>

#include "server/api/request_fields.h"

namespace moeserve::server::api {

using detail::find_field;
using detail::ojson;

namespace {

// Runs `read` on the parsed body object; the one place where the readers'
// RequestError (and, defensively, any other exception) becomes a value.
template <class T, class Read>
Parsed<T> guarded(std::string_view body, Read read) {
  Parsed<T> out;
  Parsed<ojson> json = parse_json_object_body(body);
  if (!json.ok()) {
    out.error = std::move(json.error);
    return out;
  }
  try {
    out.value = read(*json.value);
  } catch (const detail::RequestError& e) {
    out.error = e.error;
  } catch (const std::exception& e) {
    out.error = invalid_request(std::string("invalid request: ") + e.what());
  }
  return out;
}

// stream + stream_options.include_usage (only meaningful when streaming).
void read_stream(const ojson& body, bool& stream, bool& include_usage) {
  stream = detail::read_bool(body, "stream").value_or(false);
  const ojson* options = find_field(body, "stream_options");
  if (!options) return;
  if (!options->is_object()) detail::fail("'stream_options' must be an object", "stream_options");
  include_usage =
      stream && detail::read_bool(*options, "include_usage", "stream_options.include_usage").value_or(false);
}

void read_thinking(const ojson& body, ChatCompletionRequest& r) {
  if (const ojson* kwargs = find_field(body, "chat_template_kwargs")) {
    if (!kwargs->is_object())
      detail::fail("'chat_template_kwargs' must be an object", "chat_template_kwargs");
    r.enable_thinking = detail::read_bool(*kwargs, "enable_thinking", "chat_template_kwargs.enable_thinking");
    r.template_kwargs = *kwargs;
    r.template_kwargs.erase("enable_thinking");
  }
  // The top-level flag (a llama.cpp/vLLM convenience) wins over the kwargs.
  if (auto top = detail::read_bool(body, "enable_thinking")) r.enable_thinking = top;
}

ChatCompletionRequest read_chat(const ojson& body) {
  ChatCompletionRequest r;
  r.model = detail::read_string(body, "model").value_or("");
  r.messages = detail::read_chat_messages(body);
  r.tools = detail::read_tools(body);
  r.tool_choice = detail::read_tool_choice(body, r.tools);
  read_stream(body, r.stream, r.include_usage);
  read_thinking(body, r);
  r.params = detail::read_generation_params(body, detail::Endpoint::kChat);
  r.parallel_tool_calls = detail::read_bool(body, "parallel_tool_calls").value_or(true);
  auto tool_calls = tool_call_grammar(r.tools, r.tool_choice, r.parallel_tool_calls);
  if (!tool_calls.is_ok()) detail::fail(tool_calls.status().message(), "tools");
  r.params.tool_calls = std::move(*tool_calls);
  return r;
}

// prompt: "text", ["text"], [1, 2, 3] or [[1, 2, 3]]; one prompt only.
void read_prompt(const ojson& body, CompletionRequest& r) {
  const ojson* prompt = find_field(body, "prompt");
  if (!prompt) detail::fail("'prompt' is required", "prompt");
  const char* kExpected = "'prompt' must be a string, an array of one string, or an array of token ids";
  if (prompt->is_string()) {
    r.prompt_text = prompt->get<std::string>();
  } else if (prompt->is_array() && !prompt->empty()) {
    const ojson& first = prompt->front();
    if (first.is_string() || first.is_array()) {
      if (prompt->size() > 1) detail::fail("only one prompt per request is supported", "prompt");
      if (first.is_string()) {
        r.prompt_text = first.get<std::string>();
      } else {
        r.prompt_tokens = detail::read_token_ids(first, "prompt");
        r.prompt_is_tokens = true;
      }
    } else if (first.is_number()) {
      r.prompt_tokens = detail::read_token_ids(*prompt, "prompt");
      r.prompt_is_tokens = true;
    } else {
      detail::fail(kExpected, "prompt");
    }
  } else if (!prompt->is_array()) {
    detail::fail(kExpected, "prompt");
  }
  if (r.prompt_is_tokens ? r.prompt_tokens.empty() : r.prompt_text.empty()) {
    detail::fail("'prompt' must not be empty", "prompt");
  }
}

CompletionRequest read_completion(const ojson& body) {
  CompletionRequest r;
  r.model = detail::read_string(body, "model").value_or("");
  read_prompt(body, r);
  read_stream(body, r.stream, r.include_usage);
  r.echo = detail::read_bool(body, "echo").value_or(false);
  r.params = detail::read_generation_params(body, detail::Endpoint::kCompletion);
  return r;
}

TokenizeRequest read_tokenize(const ojson& body) {
  TokenizeRequest r;
  auto content = detail::read_string(body, "content");
  if (!content) detail::fail("'content' is required", "content");
  r.content = std::move(*content);
  r.add_special = detail::read_bool(body, "add_special").value_or(false);
  r.with_pieces = detail::read_bool(body, "with_pieces").value_or(false);
  return r;
}

DetokenizeRequest read_detokenize(const ojson& body) {
  DetokenizeRequest r;
  if (const ojson* tokens = find_field(body, "tokens")) {  // absent: empty, as llama.cpp
    if (!tokens->is_array()) detail::fail("'tokens' must be an array of token ids", "tokens");
    r.tokens = detail::read_token_ids(*tokens, "tokens");
  }
  return r;
}

}  // namespace

Parsed<ChatCompletionRequest> parse_chat_completion_request(std::string_view body) {
  return guarded<ChatCompletionRequest>(body, read_chat);
}
Parsed<ChatCompletionRequest> parse_translated_chat_request(
    std::string_view body, const std::function<ojson(const ojson&)>& translate) {
  return guarded<ChatCompletionRequest>(body, [&](const ojson& b) { return read_chat(translate(b)); });
}
Parsed<CompletionRequest> parse_completion_request(std::string_view body) {
  return guarded<CompletionRequest>(body, read_completion);
}
Parsed<TokenizeRequest> parse_tokenize_request(std::string_view body) {
  return guarded<TokenizeRequest>(body, read_tokenize);
}
Parsed<DetokenizeRequest> parse_detokenize_request(std::string_view body) {
  return guarded<DetokenizeRequest>(body, read_detokenize);
}

}  // namespace moeserve::server::api

namespace moeserve::server::api {

runtime::SpecConfig SpeculativeParams::over(runtime::SpecConfig base) const {
  if (mode) base.mode = *mode;
  if (max_draft) base.max_draft = *max_draft;
  if (tree_nodes) base.tree_nodes = *tree_nodes;
  return base;
}

}  // namespace moeserve::server::api
