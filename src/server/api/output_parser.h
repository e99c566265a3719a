// Splitting generated text into what an OpenAI response carries: content,
// reasoning (Qwen3's <think>...</think>) and tool calls (Qwen3/Hermes
// <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>).
//
// The parser is incremental: push() takes text in arbitrary pieces, as
// streaming decodes it, and returns what is decided so far. Text that could
// still be the start of a tag is held back until the next piece settles it,
// so the concatenation of every delta (push... then finish) is the same
// whatever the split points. Pieces should end on UTF-8 character boundaries
// (the tokenizer's incremental decoder guarantees it); the parser only ever
// splits in front of ASCII bytes, so deltas then do too.
//
// Whitespace, as the model writes "<think>\n...\n</think>\n\n<answer>":
//  - reasoning is trimmed at both ends;
//  - whitespace right after </think> and after each </tool_call> is dropped;
//  - whitespace right before a <tool_call> is dropped (the template puts
//    "\n" between content and calls);
//  - <think> is recognised only at the very start (after whitespace), so a
//    model talking about the tag later is left alone.
// A <tool_call> block whose body is not a JSON object with a string "name"
// is passed on as content, tags included.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace moeserve::server::api {

struct ToolCall {
  std::string id;  // "call_" + 24 characters
  std::string name;
  std::string arguments;  // compact JSON text of the arguments object
};

// "call_" + 24 random alphanumerics.
std::string random_tool_call_id();
// Deterministic ids for tests: "call_" + the counter as 24 decimal digits,
// starting at `first`.
std::function<std::string()> counter_tool_call_ids(uint64_t first = 0);

struct OutputParserOptions {
  bool parse_reasoning = true;
  // The prompt already ends in "<think>\n" (the output starts inside the
  // reasoning and only </think> follows).
  bool starts_in_reasoning = false;
  // The request had tools and tool_choice != "none".
  bool parse_tool_calls = false;
  // Makes tool call ids; empty: random_tool_call_id.
  std::function<std::string()> make_tool_call_id;
};

struct OutputDelta {
  std::string content;
  std::string reasoning;
  std::vector<ToolCall> tool_calls;  // completed within this piece

  bool empty() const { return content.empty() && reasoning.empty() && tool_calls.empty(); }
  void append(OutputDelta&& other);
};

class OutputParser {
 public:
  explicit OutputParser(OutputParserOptions options = {});

  OutputDelta push(std::string_view piece);
  // End of generation: flushes held-back text. An unterminated <think> block
  // ends as reasoning; an unterminated <tool_call> becomes content verbatim.
  OutputDelta finish();

  // Whole-text parse (push + finish).
  static OutputDelta parse(std::string_view text, OutputParserOptions options = {});

 private:
  enum class State { kStart, kContent, kReasoning, kToolCall };

  void process(OutputDelta& out, bool final);
  // Each returns false when it needs more text to decide.
  bool step_start(OutputDelta& out, bool final);
  bool step_content(OutputDelta& out, bool final);
  bool step_reasoning(OutputDelta& out, bool final);
  bool step_tool_call(OutputDelta& out, bool final);

  void emit_content(OutputDelta& out, std::string_view text);
  void emit_reasoning(OutputDelta& out, std::string_view text);
  void close_tool_call(OutputDelta& out, std::string_view body);

  OutputParserOptions options_;
  State state_;
  std::string buffer_;      // undecided input
  std::string pending_ws_;  // trailing whitespace of content/reasoning, not yet emitted
  bool skip_ws_ = false;    // drop whitespace at the start of the next content/reasoning
};

}  // namespace moeserve::server::api
