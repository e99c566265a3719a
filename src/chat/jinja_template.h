// A parsed Jinja template of the chat-template subset, ready to render many
// times (concurrently: rendering only reads the parsed tree).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "chat/jinja_interpreter.h"
#include "chat/jinja_parser.h"

namespace moeserve::chat::jinja {

struct TemplateOptions {
  std::string name = "chat template";  // prefixes every error message
  ParseOptions parse;
};

class Template {
 public:
  static Result<Template> parse(std::string_view source, const TemplateOptions& options = {});

  // Renders with `context` as the template's variables.
  Result<std::string> render(const DictData& context, const RenderLimits& limits = {},
                             const RenderEnvironment& env = {}) const;

  const SourceInfo& source_info() const { return *info_; }

 private:
  Template(std::shared_ptr<const Body> body, std::shared_ptr<const SourceInfo> info)
      : body_(std::move(body)), info_(std::move(info)) {}

  std::shared_ptr<const Body> body_;
  std::shared_ptr<const SourceInfo> info_;
};

}  // namespace moeserve::chat::jinja
