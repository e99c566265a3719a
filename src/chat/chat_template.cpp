#include "chat/chat_template.h"

#include "chat/jinja_json.h"

namespace moeserve::chat {

Result<ChatTemplate> ChatTemplate::parse(std::string source, const ChatTemplateOptions& options) {
  jinja::TemplateOptions template_options;
  template_options.name = options.name;
  template_options.parse = options.parse;
  MOESERVE_ASSIGN_OR_RETURN(jinja::Template tmpl, jinja::Template::parse(source, template_options));
  return ChatTemplate(std::make_shared<const std::string>(std::move(source)), std::move(tmpl), options.limits);
}

Result<std::string> ChatTemplate::render(const ChatRenderInput& input) const {
  const std::string& name = template_.source_info().name;
  if (!input.messages.is_array()) {
    return make_error(StatusCode::kInvalidArgument, "{}: messages must be a JSON array", name);
  }
  if (!input.extra.is_null() && !input.extra.is_object()) {
    return make_error(StatusCode::kInvalidArgument, "{}: extra template variables must be a JSON object", name);
  }
  const uint32_t max_nesting = limits_.max_value_nesting;
  auto convert = [&](const nlohmann::ordered_json& json, const char* what) -> Result<jinja::Value> {
    Result<jinja::Value> v = jinja::value_from_json(json, max_nesting);
    if (!v.is_ok()) return make_error(v.status().code(), "{}: {}: {}", name, what, v.status().message());
    return v;
  };

  jinja::DictData context;
  if (input.extra.is_object()) {
    for (const auto& [key, value] : input.extra.items()) {
      MOESERVE_ASSIGN_OR_RETURN(jinja::Value v, convert(value, "extra variables"));
      context.set(key, std::move(v));
    }
  }
  MOESERVE_ASSIGN_OR_RETURN(jinja::Value messages, convert(input.messages, "messages"));
  MOESERVE_ASSIGN_OR_RETURN(jinja::Value tools, convert(input.tools, "tools"));
  context.set("messages", std::move(messages));
  context.set("tools", std::move(tools));
  context.set("add_generation_prompt", jinja::Value::boolean(input.add_generation_prompt));
  context.set("bos_token", jinja::Value::string(input.bos_token));
  context.set("eos_token", jinja::Value::string(input.eos_token));
  if (input.enable_thinking) context.set("enable_thinking", jinja::Value::boolean(*input.enable_thinking));

  jinja::RenderEnvironment env;
  env.now_unix_seconds = input.now_unix_seconds;
  return template_.render(context, limits_, env);
}

}  // namespace moeserve::chat
