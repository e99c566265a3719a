#include "server/api/tool_call_grammar.h"

#include <fmt/format.h>

#include <vector>

#include "server/api/compiled_grammars.h"
#include "server/api/json_schema_grammar.h"

namespace moeserve::server::api {
namespace {

using ojson = nlohmann::ordered_json;

bool is_strict(const ojson& tool) {
  const auto f = tool.find("function");
  if (f == tool.end() || !f->is_object()) return false;
  const auto s = f->find("strict");
  return s != f->end() && s->is_boolean() && s->get<bool>();
}

bool any_strict(const ojson& tools) {
  if (!tools.is_array()) return false;
  for (const ojson& t : tools) {
    if (is_strict(t)) return true;
  }
  return false;
}

// The rules of the call itself; the schema rules are named tool-N-arguments.
// The call's own JSON is the template's one line, so its gaps are a space
// or a newline at most: a model cannot stall in them.
const char* const kCallRules =
    R"(call-body ::= call-ws "{" call-ws "\"name\"" call-ws ":" call-ws call-function call-ws "}" call-ws "</tool_call>"
call-ws ::= [ \n]{0,2}
)";

}  // namespace

Result<ToolCallGbnf> tool_call_gbnf(const ojson& tools, const std::string& tool_choice, bool parallel) {
  ToolCallGbnf out;
  if (!tools.is_array() || tools.empty() || tool_choice == "none") return out;
  out.required = tool_choice != "auto";
  if (!out.required && !any_strict(tools)) return out;
  const bool named = out.required && tool_choice != "required";

  static const ojson kAnyObject = {{"type", "object"}};
  std::vector<SchemaRule> schemas;
  std::vector<std::string> alternatives;
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& function = tools[i]["function"];
    const std::string name = function["name"].get<std::string>();
    if (named && name != tool_choice) continue;
    const std::string rule = fmt::format("tool-{}-arguments", i);
    const auto params = function.find("parameters");
    const bool strict = is_strict(tools[i]) && params != function.end();
    schemas.push_back(
        {rule, strict ? &*params : &kAnyObject, fmt::format("tools[{}].function.parameters", i)});
    alternatives.push_back(gbnf_literal(ojson(name).dump(-1, ' ', false, ojson::error_handler_t::replace)) +
                           R"( call-ws "," call-ws "\"arguments\"" call-ws ":" call-ws )" + rule);
  }
  if (alternatives.empty())
    return make_error(StatusCode::kInvalidArgument, "tool_choice names no tool of 'tools'");
  const std::set<std::string> reserved = {"root", "call-body", "call-ws", "call-function"};
  Result<std::string> rules = json_schema_rules(schemas, reserved);
  if (!rules.is_ok()) return rules.status();

  std::string gbnf;
  if (!out.required) {
    gbnf = "root ::= call-body\n";
  } else if (named || !parallel) {
    gbnf = "root ::= call-ws \"<tool_call>\" call-body\n";
  } else {
    gbnf = "root ::= call-ws \"<tool_call>\" call-body (call-ws \"<tool_call>\" call-body)*\n";
  }
  gbnf += kCallRules;
  gbnf += "call-function ::= ";
  for (size_t i = 0; i < alternatives.size(); ++i) gbnf += (i ? " | " : "") + alternatives[i];
  gbnf += "\n" + *rules;
  out.gbnf = std::move(gbnf);
  return out;
}

Result<std::optional<ToolCallGrammar>> tool_call_grammar(const ojson& tools, const std::string& tool_choice,
                                                         bool parallel) {
  Result<ToolCallGbnf> text = tool_call_gbnf(tools, tool_choice, parallel);
  if (!text.is_ok()) return text.status();
  if (text->gbnf.empty()) return std::optional<ToolCallGrammar>();
  auto compiled = compiled_grammar(text->gbnf);
  if (!compiled.is_ok()) return compiled.status();
  return std::optional<ToolCallGrammar>(ToolCallGrammar{*compiled, text->required});
}

}  // namespace moeserve::server::api
