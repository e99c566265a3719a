// Helpers for the chat-template engine tests: render a template string with a
// JSON context and get either the output or the error.
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <string>

#include "chat/jinja_json.h"
#include "chat/jinja_template.h"

namespace moeserve::chat::jinja::testing {

struct Rendered {
  bool ok = false;
  std::string output;  // when ok
  Status status;       // when not ok
};

inline Rendered render_with(const std::string& source, const nlohmann::ordered_json& context = nlohmann::ordered_json::object(),
                            const RenderLimits& limits = {}) {
  Rendered r;
  Result<Template> tmpl = Template::parse(source);
  if (!tmpl.is_ok()) {
    r.status = tmpl.status();
    return r;
  }
  Result<Value> vars = value_from_json(context.is_null() ? nlohmann::ordered_json::object() : context, 64);
  if (!vars.is_ok()) {
    r.status = vars.status();
    return r;
  }
  if (!vars->is_dict()) {
    r.status = Status(StatusCode::kInvalidArgument, "test context must be a JSON object");
    return r;
  }
  RenderEnvironment env;
  env.now_unix_seconds = 1700000000;  // 2023-11-14 22:13:20 UTC
  Result<std::string> out = tmpl->render(vars->as_dict(), limits, env);
  if (!out.is_ok()) {
    r.status = out.status();
    return r;
  }
  r.ok = true;
  r.output = out.value();
  return r;
}

// The rendered text, or "ERROR: <message>" so expectations show what failed.
inline std::string render(const std::string& source, const nlohmann::ordered_json& context = nlohmann::ordered_json::object()) {
  Rendered r = render_with(source, context);
  return r.ok ? r.output : "ERROR: " + r.status.message();
}

// The error status of a template that must fail (parse or render).
inline Status render_error(const std::string& source, const nlohmann::ordered_json& context = nlohmann::ordered_json::object(),
                           const RenderLimits& limits = {}) {
  Rendered r = render_with(source, context, limits);
  if (r.ok) return Status(StatusCode::kInternal, "unexpectedly rendered: " + r.output);
  return r.status;
}

}  // namespace moeserve::chat::jinja::testing
