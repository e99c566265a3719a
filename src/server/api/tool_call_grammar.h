// Tool calls that follow their tools' parameter schemas: a tool with
// `strict: true` (OpenAI chat `function.strict`, Responses and Anthropic
// tools' `strict`), and every call when `tool_choice` requires one.
//
// A call is written the way the Qwen3 chat templates teach the model:
//   <tool_call>\n{"name": "NAME", "arguments": {...}}\n</tool_call>
// (the same format server/api/output_parser.h reads back). The grammar is
// over what follows "<tool_call>" up to and including "</tool_call>", with
// "name" one of the request's tools and "arguments" its schema's JSON (any
// JSON object for a tool that is not strict). When a call is required
// (tool_choice "required", Anthropic's "any", or a named function) the
// grammar is the whole answer after any reasoning: one or more calls (exactly
// one of the named function, or when parallel calls are off).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "core/status.h"
#include "runtime/grammar/grammar.h"

namespace moeserve::server::api {

struct ToolCallGrammar {
  std::shared_ptr<const runtime::grammar::Grammar> grammar;
  // true: `grammar` is the whole answer after the reasoning; false: it
  // holds from each "<tool_call>" the model writes to its "</tool_call>".
  bool required = false;
};

// The text that opens a call, and where `required == false` grammars start.
inline constexpr const char* kToolCallOpen = "<tool_call>";

// The GBNF for `tools` (the normalized chat tools: [{"type": "function",
// "function": {name, parameters, strict}}]) and `tool_choice` (auto | none |
// required | a function name). Empty when nothing is constrained: tool_choice
// "none", or "auto" without a strict tool. An error names the schema keyword
// that cannot be guaranteed and where ("tools[0].function.parameters...").
struct ToolCallGbnf {
  std::string gbnf;
  bool required = false;
};
// `parallel` false (parallel_tool_calls, Anthropic's disable_parallel_tool_use):
// a required answer is exactly one call.
Result<ToolCallGbnf> tool_call_gbnf(const nlohmann::ordered_json& tools, const std::string& tool_choice,
                                    bool parallel = true);

// tool_call_gbnf compiled (and cached by text); nullopt when it is empty.
Result<std::optional<ToolCallGrammar>> tool_call_grammar(const nlohmann::ordered_json& tools,
                                                         const std::string& tool_choice,
                                                         bool parallel = true);

}  // namespace moeserve::server::api
