#include "server/api/responses.h"

#include <string>
#include <utility>

#include "server/api/request_fields.h"

namespace moeserve::server::api {
namespace {

using detail::fail;
using detail::find_field;
using detail::ojson;
using detail::required_string;

// A message's content: a string or text parts (input_text, output_text, text).
std::string content_text(const ojson& content, const std::string& param) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) fail("'" + param + "' must be a string or an array of parts", param);
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string p = param + "[" + std::to_string(i) + "]";
    const ojson& part = content[i];
    if (!part.is_object()) fail("'" + p + "' must be an object", p);
    const std::string type = required_string(part, "type", p + ".type");
    if (type != "input_text" && type != "output_text" && type != "text")
      fail("this model reads text only: '" + type + "' parts are not supported", p + ".type");
    if (!text.empty()) text += '\n';
    text += required_string(part, "text", p + ".text");
  }
  return text;
}

// Appends a tool call to the conversation's last assistant message (a new
// one when the last message is not an assistant's).
void add_tool_call(ojson& messages, ojson call) {
  if (messages.empty() || messages.back()["role"] != "assistant")
    messages.push_back({{"role", "assistant"}, {"content", ""}});
  ojson& m = messages.back();
  if (!m.contains("tool_calls")) m["tool_calls"] = ojson::array();
  m["tool_calls"].push_back(std::move(call));
}

void translate_item(const ojson& item, const std::string& param, ojson& messages) {
  if (!item.is_object()) fail("'" + param + "' must be an object", param);
  const std::string type = detail::read_string(item, "type", param + ".type").value_or("message");
  if (type == "message") {
    std::string role = required_string(item, "role", param + ".role");
    if (role == "developer") role = "system";
    if (role != "user" && role != "system" && role != "assistant")
      fail("'" + param + ".role' must be user, system, developer or assistant", param + ".role");
    const ojson* content = find_field(item, "content");
    if (!content) fail("'" + param + ".content' is required", param + ".content");
    messages.push_back({{"role", role}, {"content", content_text(*content, param + ".content")}});
  } else if (type == "function_call") {
    add_tool_call(
        messages,
        {{"id", required_string(item, "call_id", param + ".call_id")},
         {"type", "function"},
         {"function",
          {{"name", required_string(item, "name", param + ".name")},
           {"arguments", detail::read_string(item, "arguments", param + ".arguments").value_or("{}")}}}});
  } else if (type == "function_call_output") {
    const ojson* output = find_field(item, "output");
    messages.push_back({{"role", "tool"},
                        {"tool_call_id", required_string(item, "call_id", param + ".call_id")},
                        {"content", output ? content_text(*output, param + ".output") : std::string()}});
  } else if (type == "reasoning") {
    // Earlier reasoning: the chat template drops it from past turns anyway.
  } else if (type == "item_reference") {
    fail("item references need stored responses, and this server stores none; send the items themselves",
         param + ".type");
  } else {
    fail("unsupported input item type '" + type + "'", param + ".type");
  }
}

ojson translate_tool_choice(const ojson& choice) {
  if (choice.is_string()) return choice;
  if (!choice.is_object()) fail("'tool_choice' must be a string or an object", "tool_choice");
  if (required_string(choice, "type", "tool_choice.type") != "function")
    fail("'tool_choice.type' must be \"function\"", "tool_choice.type");
  return {{"type", "function"},
          {"function", {{"name", required_string(choice, "name", "tool_choice.name")}}}};
}

void translate_options(const ojson& body, ojson& chat, json& echo) {
  if (const ojson* v = find_field(body, "max_output_tokens"))
    chat["max_tokens"] = *v, echo["max_output_tokens"] = *v;
  for (const char* k : {"temperature", "top_p", "top_k", "seed"}) {
    if (const ojson* v = find_field(body, k)) chat[k] = *v, echo[k] = *v;
  }
  if (const ojson* tools = find_field(body, "tools")) {
    chat["tools"] = detail::chat_function_tools(*tools, "parameters", true);
    echo["tools"] = *tools;
  }
  if (const ojson* choice = find_field(body, "tool_choice")) {
    chat["tool_choice"] = translate_tool_choice(*choice);
    echo["tool_choice"] = *choice;
  }
  if (const ojson* parallel = find_field(body, "parallel_tool_calls"))
    chat["parallel_tool_calls"] = *parallel, echo["parallel_tool_calls"] = *parallel;
  if (const ojson* reasoning = find_field(body, "reasoning")) {
    if (!reasoning->is_object()) fail("'reasoning' must be an object", "reasoning");
    if (auto effort = detail::read_string(*reasoning, "effort", "reasoning.effort")) {
      if (*effort == "none" || *effort == "minimal") {
        chat["enable_thinking"] = false;
      } else if (*effort == "low" || *effort == "medium" || *effort == "high") {
        chat["enable_thinking"] = true;
      } else {
        fail("'reasoning.effort' must be none, minimal, low, medium or high", "reasoning.effort");
      }
      echo["reasoning"] = {{"effort", *effort}, {"summary", nullptr}};
    }
  }
  if (const ojson* grammar = find_field(body, "grammar")) chat["grammar"] = *grammar;  // llama-server's GBNF
  if (const ojson* text = find_field(body, "text")) {
    const ojson* format = text->is_object() ? find_field(*text, "format") : nullptr;
    if (format) {
      // Responses' text.format {type, schema, ...} is chat's response_format.
      if (!format->is_object()) fail("'text.format' must be an object", "text.format");
      const std::string type = detail::read_string(*format, "type", "text.format.type").value_or("text");
      if (type == "json_schema") {
        ojson js = {{"name", format->value("name", "answer")}};
        if (const ojson* schema = find_field(*format, "schema")) js["schema"] = *schema;
        chat["response_format"] = {{"type", "json_schema"}, {"json_schema", std::move(js)}};
      } else if (type == "json_object" || type == "text") {
        chat["response_format"] = {{"type", type}};
      } else {
        fail("'text.format.type' must be text, json_object or json_schema", "text.format.type");
      }
      echo["text"] = {{"format", *format}};
    }
  }
}

ojson translate(const ojson& body, json& echo) {
  if (find_field(body, "previous_response_id")) {
    fail(
        "previous_response_id is not supported: this server stores no responses; send the whole conversation "
        "in 'input'",
        "previous_response_id");
  }
  ojson chat = ojson::object();
  if (const ojson* model = find_field(body, "model")) chat["model"] = *model;
  ojson messages = ojson::array();
  if (auto instructions = detail::read_string(body, "instructions")) {
    messages.push_back({{"role", "system"}, {"content", *instructions}});
    echo["instructions"] = *instructions;
  }
  const ojson* input = find_field(body, "input");
  if (!input) fail("'input' is required", "input");
  if (input->is_string()) {
    messages.push_back({{"role", "user"}, {"content", *input}});
  } else if (input->is_array()) {
    for (size_t i = 0; i < input->size(); ++i)
      translate_item((*input)[i], "input[" + std::to_string(i) + "]", messages);
  } else {
    fail("'input' must be a string or an array of items", "input");
  }
  if (messages.empty()) fail("'input' has no messages", "input");
  chat["messages"] = std::move(messages);
  translate_options(body, chat, echo);
  // moeserve's extension, as on the chat endpoint.
  if (const ojson* spec = find_field(body, "speculative")) chat["speculative"] = *spec;
  if (const ojson* priority = find_field(body, "priority")) chat["priority"] = *priority;
  return chat;
}

json message_item(const std::string& id, const std::string& text, const std::string& status) {
  return {{"type", "message"},
          {"id", id},
          {"status", status},
          {"role", "assistant"},
          {"content", status == "in_progress" ? json::array()
                                              : json::array({{{"type", "output_text"},
                                                              {"text", text},
                                                              {"annotations", json::array()},
                                                              {"logprobs", json::array()}}})}};
}

json reasoning_item(const std::string& id, const std::string& text, bool done) {
  return {{"type", "reasoning"},
          {"id", id},
          {"summary", json::array()},
          {"content", done ? json::array({{{"type", "reasoning_text"}, {"text", text}}}) : json::array()}};
}

json function_call_item(const ToolCall& call, const std::string& id, const std::string& status) {
  return {{"type", "function_call"},
          {"id", id},
          {"call_id", call.id},
          {"name", call.name},
          {"arguments", status == "completed" ? call.arguments : std::string()},
          {"status", status}};
}

json usage_json(const Usage& u) {
  json out = {{"input_tokens", u.prompt_tokens},
              {"input_tokens_details", {{"cached_tokens", u.cached_tokens}}},
              {"output_tokens", u.completion_tokens},
              {"output_tokens_details", {{"reasoning_tokens", 0}}},
              {"total_tokens", u.prompt_tokens + u.completion_tokens}};
  if (!u.speculative_mode.empty()) out["speculative"] = u.speculative_json();
  return out;
}

// The response object around `output` (status in_progress, completed or incomplete).
json response_shell(const ResponseMeta& meta, const json& echo, const std::string& status, json output) {
  json r = {{"id", meta.id},
            {"object", "response"},
            {"created_at", meta.created},
            {"status", status},
            {"model", meta.model},
            {"output", std::move(output)},
            {"error", nullptr},
            {"incomplete_details", nullptr},
            {"instructions", nullptr},
            {"max_output_tokens", nullptr},
            {"temperature", nullptr},
            {"top_p", nullptr},
            {"tools", json::array()},
            {"tool_choice", "auto"},
            {"parallel_tool_calls", true},
            {"previous_response_id", nullptr},
            {"reasoning", {{"effort", nullptr}, {"summary", nullptr}}},
            {"store", false},
            {"text", {{"format", {{"type", "text"}}}}},
            {"metadata", json::object()},
            {"usage", nullptr}};
  for (const auto& [k, v] : echo.items()) r[k] = v;
  if (status == "incomplete") r["incomplete_details"] = {{"reason", "max_output_tokens"}};
  return r;
}

}  // namespace

Parsed<ResponsesRequest> parse_responses_request(std::string_view body) {
  ResponsesRequest r;
  Parsed<ChatCompletionRequest> chat = parse_translated_chat_request(body, [&](const ojson& b) {
    r.stream = detail::read_bool(b, "stream").value_or(false);
    return translate(b, r.echo);
  });
  Parsed<ResponsesRequest> out;
  if (!chat.ok()) {
    out.error = std::move(chat.error);
    return out;
  }
  r.chat = std::move(*chat.value);
  out.value = std::move(r);
  return out;
}

json response_object(const ResponseMeta& meta, const json& echo, const ChatChoiceResult& choice,
                     const ResponseEnd& end, const Usage& usage) {
  json output = json::array();
  if (!choice.reasoning.empty()) output.push_back(reasoning_item(make_id("rs_"), choice.reasoning, true));
  if (!choice.content.empty()) output.push_back(message_item(make_id("msg_"), choice.content, "completed"));
  for (const ToolCall& call : choice.tool_calls)
    output.push_back(function_call_item(call, make_id("fc_"), "completed"));
  json r = response_shell(meta, echo, end.incomplete ? "incomplete" : "completed", std::move(output));
  r["usage"] = usage_json(usage);
  return r;
}

std::string ResponsesStream::event(json data) {
  data["sequence_number"] = sequence_++;
  return "event: " + data["type"].get<std::string>() + "\ndata: " + dump_json(data) + "\n\n";
}

json ResponsesStream::base(const std::string& status) const {
  return response_shell(meta_, echo_, status, output_);
}

std::string ResponsesStream::start() {
  std::string out = event({{"type", "response.created"}, {"response", base("in_progress")}});
  return out + event({{"type", "response.in_progress"}, {"response", base("in_progress")}});
}

std::string ResponsesStream::open(Item kind) {
  std::string out = close();
  open_ = kind;
  open_text_.clear();
  open_id_ = make_id(kind == Item::kReasoning ? "rs_" : "msg_");
  const json item = kind == Item::kReasoning ? reasoning_item(open_id_, "", false)
                                             : message_item(open_id_, "", "in_progress");
  const json part = kind == Item::kReasoning
                        ? json{{"type", "reasoning_text"}, {"text", ""}}
                        : json{{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}};
  const int64_t index = int64_t(output_.size());
  out += event({{"type", "response.output_item.added"}, {"output_index", index}, {"item", item}});
  out += event({{"type", "response.content_part.added"},
                {"item_id", open_id_},
                {"output_index", index},
                {"content_index", 0},
                {"part", part}});
  return out;
}

std::string ResponsesStream::close() {
  if (open_ == Item::kNone) return {};
  const bool reasoning = open_ == Item::kReasoning;
  open_ = Item::kNone;
  const int64_t index = int64_t(output_.size());
  const json part = reasoning
                        ? json{{"type", "reasoning_text"}, {"text", open_text_}}
                        : json{{"type", "output_text"}, {"text", open_text_}, {"annotations", json::array()}};
  std::string out = event({{"type", reasoning ? "response.reasoning_text.done" : "response.output_text.done"},
                           {"item_id", open_id_},
                           {"output_index", index},
                           {"content_index", 0},
                           {"text", open_text_}});
  out += event({{"type", "response.content_part.done"},
                {"item_id", open_id_},
                {"output_index", index},
                {"content_index", 0},
                {"part", part}});
  json item = reasoning ? reasoning_item(open_id_, open_text_, true)
                        : message_item(open_id_, open_text_, "completed");
  out += event({{"type", "response.output_item.done"}, {"output_index", index}, {"item", item}});
  output_.push_back(std::move(item));
  return out;
}

std::string ResponsesStream::delta(const OutputDelta& d) {
  std::string out;
  auto text_delta = [&](Item kind, const std::string& piece) {
    if (piece.empty()) return;
    if (open_ != kind) out += open(kind);
    open_text_ += piece;
    out += event(
        {{"type", kind == Item::kReasoning ? "response.reasoning_text.delta" : "response.output_text.delta"},
         {"item_id", open_id_},
         {"output_index", int64_t(output_.size())},
         {"content_index", 0},
         {"delta", piece}});
  };
  text_delta(Item::kReasoning, d.reasoning);
  text_delta(Item::kMessage, d.content);
  for (const ToolCall& call : d.tool_calls) {
    out += close();
    const std::string id = make_id("fc_");
    const int64_t index = int64_t(output_.size());
    out += event({{"type", "response.output_item.added"},
                  {"output_index", index},
                  {"item", function_call_item(call, id, "in_progress")}});
    out += event({{"type", "response.function_call_arguments.delta"},
                  {"item_id", id},
                  {"output_index", index},
                  {"delta", call.arguments}});
    out += event({{"type", "response.function_call_arguments.done"},
                  {"item_id", id},
                  {"output_index", index},
                  {"arguments", call.arguments}});
    json item = function_call_item(call, id, "completed");
    out += event({{"type", "response.output_item.done"}, {"output_index", index}, {"item", item}});
    output_.push_back(std::move(item));
  }
  return out;
}

std::string ResponsesStream::finish(const ResponseEnd& end, const Usage& usage) {
  std::string out = close();
  json r = base(end.incomplete ? "incomplete" : "completed");
  r["usage"] = usage_json(usage);
  return out +
         event({{"type", end.incomplete ? "response.incomplete" : "response.completed"}, {"response", r}});
}

std::string ResponsesStream::error(const ApiError& e) {
  std::string out = event({{"type", "error"},
                           {"code", e.code.empty() ? e.type : e.code},
                           {"message", e.message},
                           {"param", e.param.empty() ? json(nullptr) : json(e.param)}});
  json r = base("failed");
  r["error"] = {{"code", "server_error"}, {"message", e.message}};
  return out + event({{"type", "response.failed"}, {"response", r}});
}

}  // namespace moeserve::server::api
