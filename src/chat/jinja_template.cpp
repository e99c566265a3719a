#include "chat/jinja_template.h"

namespace moeserve::chat::jinja {

Result<Template> Template::parse(std::string_view source, const TemplateOptions& options) {
  auto info = std::make_shared<SourceInfo>();
  info->name = options.name;
  MOESERVE_ASSIGN_OR_RETURN(std::shared_ptr<const Body> body, parse_template(source, *info, options.parse));
  return Template(std::move(body), std::move(info));
}

Result<std::string> Template::render(const DictData& context, const RenderLimits& limits,
                                     const RenderEnvironment& env) const {
  Interpreter interp(*info_, limits, env);
  std::string out;
  MOESERVE_RETURN_IF_ERROR(interp.render(*body_, context, out));
  return out;
}

}  // namespace moeserve::chat::jinja
