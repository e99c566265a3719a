#include "server/api/anthropic.h"

#include <string>
#include <utility>

#include "server/api/request_fields.h"

namespace moeserve::server::api {
namespace {

using detail::fail;
using detail::find_field;
using detail::ojson;

std::string quoted(const std::string& param) { return "'" + param + "'"; }

const std::string& string_field(const ojson& object, std::string_view name, const std::string& param) {
  const ojson* v = find_field(object, name);
  if (!v || !v->is_string()) fail(quoted(param) + " must be a string", param);
  return v->get_ref<const std::string&>();
}

// `system`: a string or an array of text blocks (joined with "\n").
std::string read_system(const ojson& body) {
  const ojson* system = find_field(body, "system");
  if (!system) return {};
  if (system->is_string()) return system->get<std::string>();
  if (!system->is_array()) fail("'system' must be a string or an array of text blocks", "system");
  std::string text;
  for (size_t i = 0; i < system->size(); ++i) {
    const std::string param = "system[" + std::to_string(i) + "]";
    const ojson& block = (*system)[i];
    if (!block.is_object() || string_field(block, "type", param + ".type") != "text")
      fail(quoted(param) + " must be a text block", param);
    if (i > 0) text += '\n';
    text += string_field(block, "text", param + ".text");
  }
  return text;
}

// A tool_result's content: a string or text blocks.
std::string tool_result_text(const ojson& block, const std::string& param) {
  const ojson* content = find_field(block, "content");
  if (!content) return {};
  if (content->is_string()) return content->get<std::string>();
  if (!content->is_array())
    fail(quoted(param + ".content") + " must be a string or text blocks", param + ".content");
  std::string text;
  for (size_t i = 0; i < content->size(); ++i) {
    const std::string p = param + ".content[" + std::to_string(i) + "]";
    const ojson& part = (*content)[i];
    if (!part.is_object() || string_field(part, "type", p + ".type") != "text")
      fail("only text is supported in tool results", p);
    if (!text.empty()) text += '\n';
    text += string_field(part, "text", p + ".text");
  }
  return text;
}

// One Anthropic message as OpenAI chat messages (a user turn with tool
// results becomes one "tool" message per result, then the user's text).
void translate_message(const ojson& message, const std::string& param, ojson& out) {
  if (!message.is_object()) fail(quoted(param) + " must be an object", param);
  const std::string role = string_field(message, "role", param + ".role");
  if (role != "user" && role != "assistant")
    fail(quoted(param + ".role") + " must be user or assistant", param + ".role");
  const ojson* content = find_field(message, "content");
  if (!content) fail(quoted(param + ".content") + " is required", param + ".content");
  if (content->is_string()) {
    out.push_back({{"role", role}, {"content", *content}});
    return;
  }
  if (!content->is_array())
    fail(quoted(param + ".content") + " must be a string or an array of blocks", param + ".content");
  std::string text, thinking;
  ojson tool_calls = ojson::array();
  for (size_t i = 0; i < content->size(); ++i) {
    const std::string p = param + ".content[" + std::to_string(i) + "]";
    const ojson& block = (*content)[i];
    if (!block.is_object()) fail(quoted(p) + " must be an object", p);
    const std::string type = string_field(block, "type", p + ".type");
    if (type == "text") {
      if (!text.empty()) text += '\n';
      text += string_field(block, "text", p + ".text");
    } else if (type == "thinking" && role == "assistant") {
      thinking += string_field(block, "thinking", p + ".thinking");
    } else if (type == "redacted_thinking" && role == "assistant") {
      // Encrypted upstream reasoning: nothing a local model can read.
    } else if (type == "tool_use" && role == "assistant") {
      const ojson* input = find_field(block, "input");
      if (input && !input->is_object()) fail(quoted(p + ".input") + " must be an object", p + ".input");
      tool_calls.push_back({{"id", string_field(block, "id", p + ".id")},
                            {"type", "function"},
                            {"function",
                             {{"name", string_field(block, "name", p + ".name")},
                              {"arguments", input ? input->dump() : std::string("{}")}}}});
    } else if (type == "tool_result" && role == "user") {
      std::string result = tool_result_text(block, p);
      if (const ojson* e = find_field(block, "is_error"); e && e->is_boolean() && e->get<bool>())
        result = "Error: " + result;
      out.push_back({{"role", "tool"},
                     {"tool_call_id", string_field(block, "tool_use_id", p + ".tool_use_id")},
                     {"content", std::move(result)}});
    } else if (type == "image" || type == "document") {
      fail("this model reads text only: " + type + " blocks are not supported", p + ".type");
    } else {
      fail("unsupported content block type '" + type + "' in a " + role + " message", p + ".type");
    }
  }
  if (role == "user") {
    if (!text.empty() || out.empty() || out.back()["role"] != "tool")
      out.push_back({{"role", "user"}, {"content", text}});
    return;
  }
  ojson m = {{"role", "assistant"}, {"content", text}};
  if (!thinking.empty()) m["reasoning_content"] = thinking;
  if (!tool_calls.empty()) m["tool_calls"] = std::move(tool_calls);
  out.push_back(std::move(m));
}

ojson translate_tool_choice(const ojson& choice) {
  if (!choice.is_object()) fail("'tool_choice' must be an object", "tool_choice");
  const std::string type = string_field(choice, "type", "tool_choice.type");
  if (type == "auto") return "auto";
  if (type == "any") return "required";
  if (type == "none") return "none";
  if (type == "tool")
    return {{"type", "function"}, {"function", {{"name", string_field(choice, "name", "tool_choice.name")}}}};
  fail("'tool_choice.type' must be auto, any, tool or none", "tool_choice.type");
}

// The OpenAI chat body for an Anthropic one.
ojson translate(const ojson& body, bool count_only) {
  ojson chat = ojson::object();
  if (const ojson* model = find_field(body, "model")) chat["model"] = *model;
  ojson messages = ojson::array();
  if (std::string system = read_system(body); !system.empty())
    messages.push_back({{"role", "system"}, {"content", std::move(system)}});
  const ojson* input = find_field(body, "messages");
  if (!input || !input->is_array() || input->empty())
    fail("'messages' must be a non-empty array", "messages");
  for (size_t i = 0; i < input->size(); ++i)
    translate_message((*input)[i], "messages[" + std::to_string(i) + "]", messages);
  chat["messages"] = std::move(messages);
  if (!count_only) {
    const ojson* max_tokens = find_field(body, "max_tokens");
    if (!max_tokens) fail("'max_tokens' is required", "max_tokens");
    chat["max_tokens"] = *max_tokens;
    for (const char* k : {"temperature", "top_p", "top_k"}) {
      if (const ojson* v = find_field(body, k)) chat[k] = *v;
    }
    if (const ojson* stops = find_field(body, "stop_sequences")) chat["stop"] = *stops;
  }
  if (const ojson* tools = find_field(body, "tools"))
    chat["tools"] = detail::chat_function_tools(*tools, "input_schema", false);
  if (const ojson* choice = find_field(body, "tool_choice")) {
    chat["tool_choice"] = translate_tool_choice(*choice);
    if (auto one =
            detail::read_bool(*choice, "disable_parallel_tool_use", "tool_choice.disable_parallel_tool_use"))
      chat["parallel_tool_calls"] = !*one;
  }
  if (const ojson* thinking = find_field(body, "thinking")) {
    if (!thinking->is_object()) fail("'thinking' must be an object", "thinking");
    const std::string type = string_field(*thinking, "type", "thinking.type");
    if (type != "enabled" && type != "disabled")
      fail("'thinking.type' must be enabled or disabled", "thinking.type");
    chat["enable_thinking"] = type == "enabled";
  }
  // moeserve's extension, as on the chat endpoint.
  if (const ojson* spec = find_field(body, "speculative")) chat["speculative"] = *spec;
  if (const ojson* priority = find_field(body, "priority")) chat["priority"] = *priority;
  return chat;
}

Parsed<MessagesRequest> parse(std::string_view body, bool count_only) {
  bool stream = false;
  Parsed<ChatCompletionRequest> chat = parse_translated_chat_request(body, [&](const ojson& b) {
    if (!count_only) stream = detail::read_bool(b, "stream").value_or(false);
    return translate(b, count_only);
  });
  Parsed<MessagesRequest> out;
  if (!chat.ok()) {
    out.error = std::move(chat.error);
    return out;
  }
  out.value = MessagesRequest{std::move(*chat.value), stream};
  return out;
}

std::string error_type(int status) {
  switch (status) {
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 413:
      return "request_too_large";
    case 429:
      return "rate_limit_error";
    case 503:
    case 529:
      return "overloaded_error";
    default:
      return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

json tool_use_block(const ToolCall& call) {
  json input = json::object();
  Parsed<nlohmann::ordered_json> args = parse_json_text(call.arguments);
  if (args.ok() && args.value->is_object()) input = json::parse(args.value->dump());
  return {{"type", "tool_use"}, {"id", call.id}, {"name", call.name}, {"input", std::move(input)}};
}

json usage_json(const Usage& u, bool output_only = false) {
  json out = {{"output_tokens", u.completion_tokens}};
  if (!output_only) {
    out = {{"input_tokens", u.prompt_tokens - u.cached_tokens},
           {"cache_read_input_tokens", u.cached_tokens},
           {"cache_creation_input_tokens", 0},
           {"output_tokens", u.completion_tokens}};
  }
  if (!u.speculative_mode.empty()) out["speculative"] = u.speculative_json();
  return out;
}

json stop_sequence_json(const MessageStop& stop) {
  return stop.reason == "stop_sequence" ? json(stop.sequence) : json(nullptr);
}

}  // namespace

Parsed<MessagesRequest> parse_messages_request(std::string_view body) { return parse(body, false); }
Parsed<MessagesRequest> parse_count_tokens_request(std::string_view body) { return parse(body, true); }

json anthropic_message(const ResponseMeta& meta, const ChatChoiceResult& choice, const MessageStop& stop,
                       const Usage& usage) {
  json content = json::array();
  if (!choice.reasoning.empty())
    content.push_back({{"type", "thinking"}, {"thinking", choice.reasoning}, {"signature", ""}});
  if (!choice.content.empty()) content.push_back({{"type", "text"}, {"text", choice.content}});
  for (const ToolCall& call : choice.tool_calls) content.push_back(tool_use_block(call));
  return {{"id", meta.id},
          {"type", "message"},
          {"role", "assistant"},
          {"model", meta.model},
          {"content", std::move(content)},
          {"stop_reason", stop.reason},
          {"stop_sequence", stop_sequence_json(stop)},
          {"usage", usage_json(usage)}};
}

json anthropic_error(const ApiError& e) {
  return {{"type", "error"}, {"error", {{"type", error_type(e.status)}, {"message", e.message}}}};
}

std::string anthropic_error_body(int status, const std::string& openai_body) {
  ApiError e;
  e.status = status;
  e.message = "error " + std::to_string(status);
  Parsed<nlohmann::ordered_json> parsed = parse_json_text(openai_body);
  if (parsed.ok()) {
    const auto& v = *parsed.value;
    if (v.is_object() && v.contains("error") && v["error"].is_object() && v["error"].contains("message") &&
        v["error"]["message"].is_string()) {
      e.message = v["error"]["message"].get<std::string>();
    }
  }
  return dump_json(anthropic_error(e));
}

std::string anthropic_event(const json& data) {
  return "event: " + data.value("type", std::string("message")) + "\ndata: " + dump_json(data) + "\n\n";
}

std::string AnthropicStream::start(const Usage& usage) const {
  json message = {{"id", meta_.id},           {"type", "message"},         {"role", "assistant"},
                  {"model", meta_.model},     {"content", json::array()},  {"stop_reason", nullptr},
                  {"stop_sequence", nullptr}, {"usage", usage_json(usage)}};
  return anthropic_event({{"type", "message_start"}, {"message", std::move(message)}}) +
         anthropic_event({{"type", "ping"}});
}

std::string AnthropicStream::open(Block block, const json& content_block) {
  std::string out = close();
  open_ = block;
  ++index_;
  return out + anthropic_event(
                   {{"type", "content_block_start"}, {"index", index_}, {"content_block", content_block}});
}

std::string AnthropicStream::close() {
  if (open_ == Block::kNone) return {};
  open_ = Block::kNone;
  return anthropic_event({{"type", "content_block_stop"}, {"index", index_}});
}

std::string AnthropicStream::delta(const OutputDelta& d) {
  std::string out;
  if (!d.reasoning.empty()) {
    if (open_ != Block::kThinking) out += open(Block::kThinking, {{"type", "thinking"}, {"thinking", ""}});
    out += anthropic_event({{"type", "content_block_delta"},
                            {"index", index_},
                            {"delta", {{"type", "thinking_delta"}, {"thinking", d.reasoning}}}});
  }
  if (!d.content.empty()) {
    if (open_ != Block::kText) out += open(Block::kText, {{"type", "text"}, {"text", ""}});
    out += anthropic_event({{"type", "content_block_delta"},
                            {"index", index_},
                            {"delta", {{"type", "text_delta"}, {"text", d.content}}}});
  }
  for (const ToolCall& call : d.tool_calls) {
    // A finished call: its block opens, carries the whole input, and closes.
    out += open(Block::kNone,
                {{"type", "tool_use"}, {"id", call.id}, {"name", call.name}, {"input", json::object()}});
    out += anthropic_event({{"type", "content_block_delta"},
                            {"index", index_},
                            {"delta", {{"type", "input_json_delta"}, {"partial_json", call.arguments}}}});
    out += anthropic_event({{"type", "content_block_stop"}, {"index", index_}});
  }
  return out;
}

std::string AnthropicStream::finish(const MessageStop& stop, const Usage& usage) {
  std::string out = close();
  out +=
      anthropic_event({{"type", "message_delta"},
                       {"delta", {{"stop_reason", stop.reason}, {"stop_sequence", stop_sequence_json(stop)}}},
                       {"usage", usage_json(usage, true)}});
  out += anthropic_event({{"type", "message_stop"}});
  return out;
}

std::string AnthropicStream::error(const ApiError& e) { return anthropic_event(anthropic_error(e)); }

}  // namespace moeserve::server::api
