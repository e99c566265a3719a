// ToolCallConstraint: free text stays free, a call is held to its grammar
// from "<tool_call>" to "</tool_call>", reasoning is never constrained, and a
// required call leaves the answer no way around it.
#include "runtime/tool_call_constraint.h"

#include <gtest/gtest.h>

#include "grammar_test_util.h"

namespace moeserve::runtime {
namespace {

using grammar::testing::compile;
using Phase = ToolCallConstraint::Phase;

enum Tok : int32_t {
  kHi,
  kThere,
  kOpen,
  kNewline,
  kBrace,
  kNameF,
  kEmptyArgs,
  kClose,
  kEndCall,
  kThinkOpen,
  kThinkClose,
  kEnd,
  kOpenHalf,      // "<tool"
  kOpenRest,      // "_call>\n{"
  kThinkCloseHi,  // "</think>Hi"
  kCount,
};

const std::vector<std::string> kVocab = {
    "Hi",    "\", there", "<tool_call>",  "\n",      "{",        "\"name\": \"f\", \"arguments\": ",
    "{}",    "}",         "</tool_call>", "<think>", "</think>", "<end>",
    "<tool", "_call>\n{", "</think>Hi"};

constexpr std::string_view kBody =
    R"(ws "{" ws "\"name\": \"f\", \"arguments\": " ws "{}" ws "}" ws "</tool_call>")";

ToolCallConstraintOptions options(bool required) {
  static_assert(kCount == 15);
  ToolCallConstraintOptions o;
  const std::string gbnf =
      required ? "root ::= ws \"<tool_call>\" body (ws \"<tool_call>\" body)*\n" : "root ::= body\n";
  o.grammar = compile(gbnf + "body ::= " + std::string(kBody) + "\nws ::= [ \\n]{0,4}\n");
  o.required = required;
  o.think_open_token = kThinkOpen;
  auto bytes = std::make_shared<std::vector<std::string>>(kVocab);
  o.bytes = bytes;
  o.end_ids = {kEnd};
  o.trie = std::make_shared<const grammar::TokenTrie>(*bytes);
  o.cache = std::make_shared<grammar::MaskCache>();
  return o;
}

// The mask agrees with allows() for every id (and ids past the table).
void expect_mask_matches(const ToolCallConstraint& c) {
  std::vector<uint8_t> mask;
  c.allowed_mask(kCount + 2, mask);
  ASSERT_EQ(mask.size(), size_t(kCount + 2));
  for (int32_t id = 0; id < kCount; ++id) EXPECT_EQ(mask[size_t(id)] != 0, c.allows(id)) << "token " << id;
}

void accept_all(ToolCallConstraint& c, std::initializer_list<int32_t> tokens) {
  for (const int32_t t : tokens) {
    ASSERT_TRUE(c.allows(t)) << "token " << t << " in phase " << int(c.phase());
    c.accept(t);
    expect_mask_matches(c);
  }
}

TEST(ToolCallConstraint, AnOptionalCallIsHeldToItsGrammarAndTheTextAroundItIsFree) {
  ToolCallConstraint c(options(false));
  for (int32_t t = 0; t < kCount; ++t) EXPECT_TRUE(c.allows(t)) << t;  // free text, and it may end
  accept_all(c, {kHi, kThere, kOpen});
  EXPECT_EQ(c.phase(), Phase::kCall);
  EXPECT_FALSE(c.allows(kHi));
  EXPECT_FALSE(c.allows(kEnd));  // an open call cannot end the answer
  EXPECT_FALSE(c.allows(kEmptyArgs));
  accept_all(c, {kNewline, kBrace, kNameF, kEmptyArgs, kClose});
  EXPECT_FALSE(c.allows(kHi));
  accept_all(c, {kNewline, kEndCall});
  EXPECT_EQ(c.phase(), Phase::kText);
  EXPECT_TRUE(c.allows(kHi));
  EXPECT_TRUE(c.allows(kEnd));
  accept_all(c, {kHi, kOpen});  // a second call is held again
  EXPECT_EQ(c.phase(), Phase::kCall);
  EXPECT_FALSE(c.allows(kHi));
}

TEST(ToolCallConstraint, AnOpeningSplitOverTokensStartsTheGrammarWithWhatFollowsIt) {
  ToolCallConstraint c(options(false));
  accept_all(c, {kHi, kOpenHalf});
  EXPECT_EQ(c.phase(), Phase::kText);
  accept_all(c, {kOpenRest});  // "<tool" + "_call>\n{": the grammar has seen "\n{"
  EXPECT_EQ(c.phase(), Phase::kCall);
  EXPECT_FALSE(c.allows(kBrace));
  EXPECT_TRUE(c.allows(kNameF));
}

TEST(ToolCallConstraint, CallsWrittenWhileReasoningAreNotCalls) {
  ToolCallConstraintOptions o = options(false);
  o.starts_in_reasoning = true;
  ToolCallConstraint c(std::move(o));
  EXPECT_EQ(c.phase(), Phase::kReasoning);
  accept_all(c, {kHi, kOpen, kHi});
  EXPECT_EQ(c.phase(), Phase::kReasoning);
  accept_all(c, {kThinkClose, kHi, kOpen});
  EXPECT_EQ(c.phase(), Phase::kCall);
}

TEST(ToolCallConstraint, ARequiredCallIsTheWholeAnswerAfterTheReasoning) {
  ToolCallConstraint c(options(true));
  EXPECT_EQ(c.phase(), Phase::kOpening);
  expect_mask_matches(c);
  EXPECT_FALSE(c.allows(kHi));
  EXPECT_FALSE(c.allows(kEnd));
  EXPECT_TRUE(c.allows(kOpen));
  EXPECT_TRUE(c.allows(kThinkOpen));  // the model may reason first
  accept_all(c, {kThinkOpen, kHi, kThere});
  EXPECT_EQ(c.phase(), Phase::kReasoning);
  EXPECT_FALSE(c.allows(kEnd));  // ending while reasoning would skip the call
  accept_all(c, {kThinkClose});
  EXPECT_EQ(c.phase(), Phase::kCall);
  EXPECT_FALSE(c.allows(kHi));
  accept_all(c, {kNewline, kOpen, kNewline, kBrace, kNameF, kEmptyArgs, kClose, kEndCall});
  EXPECT_TRUE(c.allows(kEnd));  // one call made: the answer may end, or call again
  EXPECT_TRUE(c.allows(kOpen));
  EXPECT_FALSE(c.allows(kHi));
}

TEST(ToolCallConstraint, ARequiredCallWithoutReasoningStartsAtTheFirstToken) {
  ToolCallConstraint c(options(true));
  accept_all(c, {kOpen});
  EXPECT_EQ(c.phase(), Phase::kCall);
  EXPECT_FALSE(c.allows(kThinkOpen));
  // Text after "</think>" in the token that closes the reasoning counts.
  ToolCallConstraintOptions o = options(true);
  o.starts_in_reasoning = true;
  ToolCallConstraint late(std::move(o));
  accept_all(late, {kHi, kThinkCloseHi});  // "Hi" is not a call: the grammar stays at its start
  EXPECT_EQ(late.phase(), Phase::kCall);
  EXPECT_TRUE(late.allows(kOpen));
  EXPECT_FALSE(late.allows(kEnd));
}

}  // namespace
}  // namespace moeserve::runtime
