// Chat messages and tools: validated and normalized into what chat templates
// (Qwen3's in particular) read: message.role / content / tool_calls /
// reasoning_content, tool_call.function.name / arguments, tool | tojson.
#include <set>
#include <string>

#include "server/api/json_body.h"
#include "server/api/request_fields.h"

namespace moeserve::server::api::detail {

namespace {

std::string in_quotes(const std::string& param) { return "'" + param + "'"; }

// content: a string, or an array of parts of which only {"type":"text"} is
// supported; text parts are joined with "\n" (as vLLM does). Null/absent
// gives nullopt and the caller decides whether that is allowed.
std::optional<std::string> read_text_content(const ojson& message, const std::string& param) {
  const ojson* content = find_field(message, "content");
  if (!content) return std::nullopt;
  if (content->is_string()) return content->get<std::string>();
  if (!content->is_array()) fail(in_quotes(param) + " must be a string or an array of text parts", param);
  std::string text;
  for (size_t i = 0; i < content->size(); ++i) {
    const ojson& part = (*content)[i];
    const std::string part_param = param + "[" + std::to_string(i) + "]";
    if (!part.is_object()) fail(in_quotes(part_param) + " must be an object", part_param);
    const ojson* type = find_field(part, "type");
    if (!type || !type->is_string() || *type != "text") fail("only text content is supported", part_param);
    const ojson* part_text = find_field(part, "text");
    if (!part_text || !part_text->is_string())
      fail(in_quotes(part_param + ".text") + " must be a string", part_param + ".text");
    if (i > 0) text += '\n';
    text += part_text->get_ref<const std::string&>();
  }
  return text;
}

// OpenAI sends arguments as a JSON string; Qwen templates render
// `arguments | tojson`, so they need the object. Text that is not a JSON
// object stays a string (the template then prints it verbatim).
ojson parse_arguments(const ojson& arguments) {
  if (!arguments.is_string()) return arguments;
  Parsed<ojson> parsed = parse_json_text(arguments.get_ref<const std::string&>());
  if (parsed.ok() && parsed.value->is_object()) return std::move(*parsed.value);
  return arguments;
}

ojson read_tool_call(const ojson& call, const std::string& param) {
  if (!call.is_object()) fail(in_quotes(param) + " must be an object", param);
  if (auto type = read_string(call, "type", param + ".type"); type && *type != "function") {
    fail(in_quotes(param + ".type") + " must be \"function\"", param + ".type");
  }
  const ojson* function = find_field(call, "function");
  if (!function || !function->is_object())
    fail(in_quotes(param + ".function") + " must be an object", param + ".function");
  auto name = read_string(*function, "name", param + ".function.name");
  if (!name || name->empty()) {
    fail(in_quotes(param + ".function.name") + " must be a non-empty string", param + ".function.name");
  }
  ojson arguments = ojson::object();
  if (const ojson* a = find_field(*function, "arguments")) {
    if (!a->is_string() && !a->is_object()) {
      fail(in_quotes(param + ".function.arguments") + " must be a JSON string",
           param + ".function.arguments");
    }
    arguments = parse_arguments(*a);
  }
  ojson out = ojson::object();
  if (auto id = read_string(call, "id", param + ".id")) out["id"] = *id;
  out["type"] = "function";
  out["function"] = {{"name", *name}, {"arguments", std::move(arguments)}};
  return out;
}

ojson read_assistant_tool_calls(const ojson& message, const std::string& param) {
  ojson calls = ojson::array();
  const ojson* v = find_field(message, "tool_calls");
  if (!v) return calls;
  if (!v->is_array()) fail(in_quotes(param) + " must be an array", param);
  for (size_t i = 0; i < v->size(); ++i)
    calls.push_back(read_tool_call((*v)[i], param + "[" + std::to_string(i) + "]"));
  return calls;
}

std::string read_role(const ojson& message, const std::string& param) {
  static const std::set<std::string> kRoles = {"system", "developer", "user", "assistant", "tool"};
  const ojson* role = find_field(message, "role");
  if (!role || !role->is_string() || !kRoles.count(role->get<std::string>())) {
    fail(in_quotes(param) + " must be one of system, developer, user, assistant, tool", param);
  }
  const std::string& r = role->get_ref<const std::string&>();
  return r == "developer" ? "system" : r;
}

ojson read_message(const ojson& message, const std::string& param) {
  if (!message.is_object()) fail(in_quotes(param) + " must be an object", param);
  ojson out = ojson::object();
  const std::string role = read_role(message, param + ".role");
  out["role"] = role;
  const std::string content_param = param + ".content";
  std::optional<std::string> content = read_text_content(message, content_param);

  if (role == "assistant") {
    ojson calls = read_assistant_tool_calls(message, param + ".tool_calls");
    if (!content && calls.empty()) {
      fail(in_quotes(content_param) + " is required unless the message has tool_calls", content_param);
    }
    out["content"] = content.value_or("");
    if (auto r = read_string(message, "reasoning_content", param + ".reasoning_content"))
      out["reasoning_content"] = *r;
    if (!calls.empty()) out["tool_calls"] = std::move(calls);
  } else {
    if (!content) fail(in_quotes(content_param) + " is required", content_param);
    out["content"] = *content;
  }
  if (role == "tool") {
    auto id = read_string(message, "tool_call_id", param + ".tool_call_id");
    if (!id)
      fail(in_quotes(param + ".tool_call_id") + " is required for tool messages", param + ".tool_call_id");
    out["tool_call_id"] = *id;
  }
  if (auto name = read_string(message, "name", param + ".name")) out["name"] = *name;
  return out;
}

ojson read_tool(const ojson& tool, const std::string& param) {
  if (!tool.is_object()) fail(in_quotes(param) + " must be an object", param);
  auto type = read_string(tool, "type", param + ".type");
  if (!type || *type != "function")
    fail(in_quotes(param + ".type") + " must be \"function\"", param + ".type");
  const ojson* function = find_field(tool, "function");
  if (!function || !function->is_object())
    fail(in_quotes(param + ".function") + " must be an object", param + ".function");
  auto name = read_string(*function, "name", param + ".function.name");
  if (!name || name->empty()) {
    fail(in_quotes(param + ".function.name") + " must be a non-empty string", param + ".function.name");
  }
  ojson f = ojson::object();
  f["name"] = *name;
  if (auto d = read_string(*function, "description", param + ".function.description")) f["description"] = *d;
  if (const ojson* parameters = find_field(*function, "parameters")) {
    if (!parameters->is_object()) {
      fail(in_quotes(param + ".function.parameters") + " must be an object", param + ".function.parameters");
    }
    f["parameters"] = *parameters;
  }
  if (auto strict = read_bool(*function, "strict", param + ".function.strict")) f["strict"] = *strict;
  return ojson{{"type", "function"}, {"function", std::move(f)}};
}

}  // namespace

ojson read_chat_messages(const ojson& body) {
  const ojson* messages = find_field(body, "messages");
  if (!messages) fail("'messages' is required", "messages");
  if (!messages->is_array() || messages->empty()) fail("'messages' must be a non-empty array", "messages");
  ojson out = ojson::array();
  for (size_t i = 0; i < messages->size(); ++i) {
    out.push_back(read_message((*messages)[i], "messages[" + std::to_string(i) + "]"));
  }
  return out;
}

ojson read_tools(const ojson& body) {
  const ojson* tools = find_field(body, "tools");
  if (!tools) return nullptr;
  if (!tools->is_array()) fail("'tools' must be an array", "tools");
  if (tools->empty()) return nullptr;
  ojson out = ojson::array();
  std::set<std::string> names;
  for (size_t i = 0; i < tools->size(); ++i) {
    const std::string param = "tools[" + std::to_string(i) + "]";
    ojson tool = read_tool((*tools)[i], param);
    if (!names.insert(tool["function"]["name"].get<std::string>()).second) {
      fail("duplicate function name in 'tools'", param + ".function.name");
    }
    out.push_back(std::move(tool));
  }
  return out;
}

std::string read_tool_choice(const ojson& body, const ojson& tools) {
  const ojson* v = find_field(body, "tool_choice");
  if (!v) return "auto";
  std::string choice;
  bool named = false;
  if (v->is_string()) {
    choice = v->get<std::string>();
    if (choice != "auto" && choice != "none" && choice != "required") {
      fail("'tool_choice' must be \"auto\", \"none\", \"required\" or a function", "tool_choice");
    }
  } else if (v->is_object()) {
    const ojson* function = find_field(*v, "function");
    const ojson* name = function && function->is_object() ? find_field(*function, "name") : nullptr;
    if (!name || !name->is_string()) fail("'tool_choice.function.name' must be a string", "tool_choice");
    choice = name->get<std::string>();
    named = true;
  } else {
    fail("'tool_choice' must be a string or an object", "tool_choice");
  }
  if (choice == "auto" || (choice == "none" && !named)) return choice;
  bool found = false;
  if (tools.is_array()) {
    for (const ojson& t : tools) found = found || (named && t["function"]["name"] == choice);
  }
  if (!tools.is_array()) fail("'tool_choice' \"" + choice + "\" requires 'tools'", "tool_choice");
  if (named && !found) fail("'tool_choice' names a function that is not in 'tools'", "tool_choice");
  return choice;
}

}  // namespace moeserve::server::api::detail
