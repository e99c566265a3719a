// Test-only helper for check_chat_template.mjs: renders chat templates with
// moeserve's engine for a batch of requests read from stdin and prints the
// results as JSON on stdout.
//
// Input:
//   {"templates": {"<name>": "<jinja source>", ...},
//    "requests": [{"id": "...", "template": "<name>",
//                  // either the chat inputs (rendered through ChatTemplate) ...
//                  "messages": [...], "tools": [...]|null, "add_generation_prompt": true,
//                  "enable_thinking": true|false (optional), "bos_token": "", "eos_token": "",
//                  "extra": {...}, "now_unix_seconds": 0,
//                  // ... or a raw variable map (rendered through jinja::Template)
//                  "context": {...}}]}
// Output: [{"id": "...", "ok": true, "output": "..."} | {"id": "...", "ok": false, "error": "..."}]
#include <iostream>
#include <iterator>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "chat/chat_template.h"
#include "chat/jinja_json.h"

namespace {

using nlohmann::ordered_json;
using moeserve::chat::ChatRenderInput;
using moeserve::chat::ChatTemplate;

ordered_json failure(const ordered_json& id, const std::string& message) {
  return ordered_json{{"id", id}, {"ok", false}, {"error", message}};
}

moeserve::Result<std::string> render_raw(const std::string& source, const ordered_json& context) {
  namespace jinja = moeserve::chat::jinja;
  MOESERVE_ASSIGN_OR_RETURN(jinja::Template tmpl, jinja::Template::parse(source));
  MOESERVE_ASSIGN_OR_RETURN(jinja::Value vars, jinja::value_from_json(context, 64));
  if (!vars.is_dict()) return moeserve::Status(moeserve::StatusCode::kInvalidArgument, "context must be an object");
  jinja::RenderEnvironment env;
  env.now_unix_seconds = 0;
  return tmpl.render(vars.as_dict(), {}, env);
}

ordered_json render_one(const ordered_json& request, const ordered_json& templates,
                        std::map<std::string, moeserve::Result<ChatTemplate>>& parsed) {
  const ordered_json id = request.value("id", ordered_json());
  const std::string name = request.value("template", std::string());
  if (!templates.contains(name) || !templates[name].is_string()) return failure(id, "unknown template '" + name + "'");
  moeserve::Result<std::string> out = std::string();
  if (request.contains("context")) {
    out = render_raw(templates[name].get<std::string>(), request["context"]);
  } else {
    auto it = parsed.find(name);
    if (it == parsed.end()) it = parsed.emplace(name, ChatTemplate::parse(templates[name].get<std::string>())).first;
    if (!it->second.is_ok()) return failure(id, it->second.status().to_string());
    ChatRenderInput input;
    input.messages = request.value("messages", ordered_json::array());
    input.tools = request.value("tools", ordered_json());
    input.add_generation_prompt = request.value("add_generation_prompt", false);
    if (request.contains("enable_thinking") && request["enable_thinking"].is_boolean()) {
      input.enable_thinking = request["enable_thinking"].get<bool>();
    }
    input.bos_token = request.value("bos_token", std::string());
    input.eos_token = request.value("eos_token", std::string());
    input.extra = request.value("extra", ordered_json::object());
    input.now_unix_seconds = request.value("now_unix_seconds", int64_t{0});
    out = it->second->render(input);
  }
  if (!out.is_ok()) return failure(id, out.status().to_string());
  return ordered_json{{"id", id}, {"ok", true}, {"output", out.value()}};
}

}  // namespace

int main() {
  std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  ordered_json input = ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (input.is_discarded() || !input.is_object() || !input.contains("requests")) {
    std::cerr << "render_chat_template: stdin must be a JSON object with \"templates\" and \"requests\"\n";
    return 2;
  }
  const ordered_json templates = input.value("templates", ordered_json::object());
  std::map<std::string, moeserve::Result<ChatTemplate>> parsed;
  ordered_json results = ordered_json::array();
  for (const ordered_json& request : input["requests"]) results.push_back(render_one(request, templates, parsed));
  std::cout << results.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  return 0;
}
