// Output parsing: content / reasoning / tool calls, and the streaming
// property: however the text is cut into pieces, the deltas add up to the
// whole-text parse.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "server/api/output_parser.h"

namespace moeserve::server::api {
namespace {

OutputParserOptions opts(bool reasoning = true, bool tools = false, bool in_reasoning = false) {
  OutputParserOptions o;
  o.parse_reasoning = reasoning;
  o.parse_tool_calls = tools;
  o.starts_in_reasoning = in_reasoning;
  o.make_tool_call_id = counter_tool_call_ids();
  return o;
}

OutputDelta parse(std::string_view text, OutputParserOptions o) {
  return OutputParser::parse(text, std::move(o));
}

std::string describe(const OutputDelta& d) {
  std::string s = "content=[" + d.content + "] reasoning=[" + d.reasoning + "] calls=";
  for (const ToolCall& c : d.tool_calls) s += "{" + c.id + " " + c.name + " " + c.arguments + "}";
  return s;
}

void expect_same(const OutputDelta& a, const OutputDelta& b, const std::string& where) {
  EXPECT_EQ(a.content, b.content) << where;
  EXPECT_EQ(a.reasoning, b.reasoning) << where;
  ASSERT_EQ(a.tool_calls.size(), b.tool_calls.size()) << where;
  for (size_t i = 0; i < a.tool_calls.size(); ++i) {
    EXPECT_EQ(a.tool_calls[i].id, b.tool_calls[i].id) << where;
    EXPECT_EQ(a.tool_calls[i].name, b.tool_calls[i].name) << where;
    EXPECT_EQ(a.tool_calls[i].arguments, b.tool_calls[i].arguments) << where;
  }
}

OutputDelta parse_pieces(const std::vector<std::string_view>& pieces, const OutputParserOptions& o) {
  OutputParser parser(o);
  OutputDelta all;
  for (std::string_view p : pieces) all.append(parser.push(p));
  all.append(parser.finish());
  return all;
}

TEST(ApiOutputParser, PlainContent) {
  OutputDelta d = parse("Hello, world!\n", opts());
  EXPECT_EQ(d.content, "Hello, world!\n");
  EXPECT_EQ(d.reasoning, "");
  EXPECT_TRUE(d.tool_calls.empty());
}

TEST(ApiOutputParser, Qwen3Reasoning) {
  OutputDelta d = parse("<think>\nLet me think.\nOK.\n</think>\n\nThe answer is 4.", opts());
  EXPECT_EQ(d.reasoning, "Let me think.\nOK.");
  EXPECT_EQ(d.content, "The answer is 4.");
}

TEST(ApiOutputParser, EmptyThinkBlock) {
  OutputDelta d = parse("<think>\n\n</think>\n\nHi", opts());
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.content, "Hi");
}

TEST(ApiOutputParser, ReasoningOffLeavesTagsInContent) {
  std::string text = "<think>\nx\n</think>\n\nHi";
  EXPECT_EQ(parse(text, opts(false)).content, text);
}

TEST(ApiOutputParser, StartsInReasoning) {
  OutputDelta d = parse("step 1\nstep 2\n</think>\n\nDone.", opts(true, false, true));
  EXPECT_EQ(d.reasoning, "step 1\nstep 2");
  EXPECT_EQ(d.content, "Done.");
}

TEST(ApiOutputParser, UnterminatedThinkIsReasoning) {
  OutputDelta d = parse("<think>\nstill thinking about it\n", opts());
  EXPECT_EQ(d.reasoning, "still thinking about it");
  EXPECT_EQ(d.content, "");
}

TEST(ApiOutputParser, ThinkOnlyRecognisedAtStart) {
  OutputDelta d = parse("Use the <think> tag like this: <think>x</think>", opts());
  EXPECT_EQ(d.content, "Use the <think> tag like this: <think>x</think>");
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(parse("\n  <think>r</think>c", opts()).reasoning, "r");
  EXPECT_EQ(parse("\n  <think>r</think>c", opts()).content, "c");
}

TEST(ApiOutputParser, PartialTagAtEndIsContent) {
  EXPECT_EQ(parse("<thi", opts()).content, "<thi");
  EXPECT_EQ(parse("a <tool_ca", opts(true, true)).content, "a <tool_ca");
  OutputDelta d = parse("<think>abc</thi", opts());
  EXPECT_EQ(d.reasoning, "abc</thi");
}

TEST(ApiOutputParser, WhitespaceOnlyOutputIsKept) { EXPECT_EQ(parse(" \n", opts()).content, " \n"); }

TEST(ApiOutputParser, SingleToolCall) {
  OutputDelta d = parse(
      "<think>\nneed weather\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\", \"days\": [1, 2]}}\n</tool_call>",
      opts(true, true));
  EXPECT_EQ(d.reasoning, "need weather");
  EXPECT_EQ(d.content, "");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].id, "call_000000000000000000000000");
  EXPECT_EQ(d.tool_calls[0].name, "get_weather");
  EXPECT_EQ(d.tool_calls[0].arguments, R"({"city":"Paris","days":[1,2]})");
}

TEST(ApiOutputParser, ContentThenSeveralToolCalls) {
  OutputDelta d = parse(
      "Let me check.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n"
      "{\"name\": \"b\", \"arguments\": {\"z\": 1, \"a\": 2}}\n</tool_call>\n",
      opts(true, true));
  EXPECT_EQ(d.content, "Let me check.");
  ASSERT_EQ(d.tool_calls.size(), 2u);
  EXPECT_EQ(d.tool_calls[0].name, "a");
  EXPECT_EQ(d.tool_calls[0].arguments, "{}");
  EXPECT_EQ(d.tool_calls[1].name, "b");
  EXPECT_EQ(d.tool_calls[1].arguments, R"({"z":1,"a":2})");  // key order kept
  EXPECT_EQ(d.tool_calls[1].id, "call_000000000000000000000001");
}

TEST(ApiOutputParser, ToolCallArgumentVariants) {
  auto one = [](const std::string& body) {
    OutputDelta d = parse("<tool_call>" + body + "</tool_call>", opts(true, true));
    EXPECT_EQ(d.tool_calls.size(), 1u) << body;
    return d.tool_calls.empty() ? std::string("<none>") : d.tool_calls[0].arguments;
  };
  EXPECT_EQ(one(R"({"name":"f"})"), "{}");
  EXPECT_EQ(one(R"({"name":"f","arguments":null})"), "{}");
  EXPECT_EQ(one(R"({"name":"f","arguments":"{\"x\":1}"})"), R"({"x":1})");
  EXPECT_EQ(one("{\"name\":\"f\",\"arguments\":{\"s\":\"caf\xc3\xa9\"}}"), "{\"s\":\"caf\xc3\xa9\"}");
}

TEST(ApiOutputParser, InvalidToolCallBecomesContent) {
  for (const std::string body :
       {"\nnot json\n", "\n{\"arguments\": {}}\n", "\n{\"name\": 5}\n", "\n[1]\n", "\n{\"name\": \"\"}\n"}) {
    std::string raw = "<tool_call>" + body + "</tool_call>";
    OutputDelta d = parse("Hi " + raw, opts(true, true));
    EXPECT_TRUE(d.tool_calls.empty()) << body;
    EXPECT_EQ(d.content, "Hi" + raw) << body;  // the space before the tag is dropped
  }
}

TEST(ApiOutputParser, UnterminatedToolCallIsContent) {
  OutputDelta d = parse("x\n<tool_call>\n{\"name\": \"f\"", opts(true, true));
  EXPECT_TRUE(d.tool_calls.empty());
  EXPECT_EQ(d.content, "x<tool_call>\n{\"name\": \"f\"");
}

TEST(ApiOutputParser, ToolCallsOffLeavesTagsInContent) {
  std::string text = "<tool_call>\n{\"name\": \"f\"}\n</tool_call>";
  OutputDelta d = parse(text, opts(true, false));
  EXPECT_EQ(d.content, text);
  EXPECT_TRUE(d.tool_calls.empty());
}

TEST(ApiOutputParser, TagsInsideReasoningAreReasoning) {
  OutputDelta d = parse("<think><tool_call>{\"name\":\"f\"}</tool_call></think>ok", opts(true, true));
  EXPECT_EQ(d.reasoning, "<tool_call>{\"name\":\"f\"}</tool_call>");
  EXPECT_EQ(d.content, "ok");
  EXPECT_TRUE(d.tool_calls.empty());
}

TEST(ApiOutputParser, HoldsBackPossibleTagsWhileStreaming) {
  OutputParser p(opts(true, true));
  OutputDelta d = p.push("<th");
  EXPECT_TRUE(d.empty());
  d = p.push("ink>\nreason");
  EXPECT_EQ(d.reasoning, "reason");
  d = p.push("ing\n</thi");  // "\n" and the partial tag are held
  EXPECT_EQ(d.reasoning, "ing");
  d = p.push("nk>\n\nAnswer <tool");
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.content, "Answer");
  d = p.push("_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_");
  EXPECT_TRUE(d.empty());
  d = p.push("call>");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].name, "f");
  EXPECT_TRUE(p.finish().empty());
}

TEST(ApiOutputParser, DefaultIdsAreRandomCallIds) {
  OutputParserOptions o;
  o.parse_tool_calls = true;
  OutputDelta d = OutputParser::parse(
      "<tool_call>{\"name\":\"f\"}</tool_call><tool_call>{\"name\":\"g\"}</tool_call>", o);
  ASSERT_EQ(d.tool_calls.size(), 2u);
  for (const ToolCall& c : d.tool_calls) {
    EXPECT_EQ(c.id.size(), 5u + 24u);
    EXPECT_TRUE(c.id.starts_with("call_"));
  }
  EXPECT_NE(d.tool_calls[0].id, d.tool_calls[1].id);
  EXPECT_NE(random_tool_call_id(), random_tool_call_id());
}

// ---- streaming equivalence -----------------------------------------------------

const std::vector<std::string>& corpus() {
  static const std::vector<std::string> texts = {
      "",
      "plain answer",
      "  leading and trailing  \n",
      "<think>\nLet me think.\n\nStep 2.\n</think>\n\nThe answer is 4.\n",
      "<think></think>x",
      "<think>\n\n</think>\n\n",
      "<think>\nunterminated reasoning\n  ",
      "<thin",
      "\n\n<think>r</think>",
      "a < b and c <= d; <t> <tool> </think> <think>",
      "Sure.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\"}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>",
      "<think>\nhmm\n</think>\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\": "
      "\"</tool\"}}\n</tool_call>",
      "<tool_call>\nbroken json\n</tool_call>\ntext after",
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\":",
      "text <tool_call><tool_call>{\"name\":\"x\"}</tool_call></tool_call> end",
      "caf\xc3\xa9 <think> \xe2\x9c\x93 </think>",
      "<think>\xe4\xb8\xad\xe6\x96\x87</think>\n\n\xe4\xb8\xad</tool_call>",
      "step\n</think>\n\nafter",
  };
  return texts;
}

std::vector<OutputParserOptions> option_sets() {
  return {opts(true, false), opts(true, true), opts(false, true), opts(false, false), opts(true, true, true)};
}

TEST(ApiOutputParser, EverySplitPointGivesTheWholeTextParse) {
  for (const std::string& text : corpus()) {
    for (const OutputParserOptions& base : option_sets()) {
      OutputParserOptions o = base;
      o.make_tool_call_id = counter_tool_call_ids();
      OutputDelta whole = parse(text, o);
      std::string_view t = text;
      for (size_t cut = 0; cut <= text.size(); ++cut) {
        o.make_tool_call_id = counter_tool_call_ids();
        OutputDelta split = parse_pieces({t.substr(0, cut), t.substr(cut)}, o);
        expect_same(whole, split, "text=[" + text + "] cut=" + std::to_string(cut) + " " + describe(split));
      }
      if (!o.parse_tool_calls)
        continue;  // pairs of cuts: only where every tag is live (keeps ASan runs short)
      for (size_t a = 0; a <= text.size(); ++a) {  // every pair of cuts
        for (size_t b = a; b <= text.size(); ++b) {
          o.make_tool_call_id = counter_tool_call_ids();
          OutputDelta split = parse_pieces({t.substr(0, a), t.substr(a, b - a), t.substr(b)}, o);
          expect_same(whole, split,
                      "text=[" + text + "] cuts=" + std::to_string(a) + "," + std::to_string(b));
          if (HasFailure()) return;
        }
      }
    }
  }
}

TEST(ApiOutputParser, ByteByByteAndRandomPiecesMatch) {
  std::mt19937 rng(7);
  for (const std::string& text : corpus()) {
    for (const OutputParserOptions& base : option_sets()) {
      OutputParserOptions o = base;
      o.make_tool_call_id = counter_tool_call_ids();
      OutputDelta whole = parse(text, o);
      std::vector<std::string_view> bytes;
      for (size_t i = 0; i < text.size(); ++i) bytes.push_back(std::string_view(text).substr(i, 1));
      o.make_tool_call_id = counter_tool_call_ids();
      expect_same(whole, parse_pieces(bytes, o), "bytewise: " + text);
      for (int trial = 0; trial < 20; ++trial) {
        std::vector<std::string_view> pieces;
        for (size_t at = 0; at < text.size();) {
          size_t n = std::uniform_int_distribution<size_t>(1, 6)(rng);
          pieces.push_back(std::string_view(text).substr(at, n));
          at += n;
        }
        o.make_tool_call_id = counter_tool_call_ids();
        expect_same(whole, parse_pieces(pieces, o), "random: " + text);
      }
    }
  }
}

}  // namespace
}  // namespace moeserve::server::api
