// The Anthropic Messages API translation (api/anthropic.h): request bodies
// onto the OpenAI chat request, the message object, the stream's event
// sequence and the error shape.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/api/anthropic.h"

namespace moeserve::server::api {
namespace {

using nlohmann::json;

TEST(AnthropicRequest, TranslatesSystemBlocksToolsAndSampling) {
  const char* body = R"({
    "model": "claude-x", "max_tokens": 100, "temperature": 0.5, "top_p": 0.9, "top_k": 40,
    "stop_sequences": ["END"], "stream": true,
    "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Use tools."}],
    "thinking": {"type": "enabled", "budget_tokens": 1024},
    "tools": [{"name": "get_weather", "description": "Weather", "input_schema":
               {"type": "object", "properties": {"city": {"type": "string"}}}}],
    "tool_choice": {"type": "tool", "name": "get_weather"},
    "messages": [
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "Call the tool."},
        {"type": "text", "text": "Let me check."},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
      {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "18 C"}]},
        {"type": "text", "text": "And tomorrow?"}]}]})";
  const Parsed<MessagesRequest> p = parse_messages_request(body);
  ASSERT_TRUE(p.ok()) << p.error.message;
  EXPECT_TRUE(p.value->stream);
  const ChatCompletionRequest& c = p.value->chat;
  EXPECT_FALSE(c.stream);
  EXPECT_EQ(c.params.max_tokens, 100);
  EXPECT_FLOAT_EQ(c.params.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(c.params.sampling.top_p, 0.9f);
  EXPECT_EQ(c.params.sampling.top_k, 40);
  EXPECT_EQ(c.params.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(c.enable_thinking, true);
  EXPECT_EQ(c.tool_choice, "get_weather");
  ASSERT_EQ(c.tools.size(), 1u);
  EXPECT_EQ(c.tools[0]["function"]["name"], "get_weather");
  EXPECT_EQ(c.tools[0]["function"]["parameters"]["properties"]["city"]["type"], "string");
  ASSERT_EQ(c.messages.size(), 5u);
  EXPECT_EQ(c.messages[0]["role"], "system");
  EXPECT_EQ(c.messages[0]["content"], "Be brief.\nUse tools.");
  EXPECT_EQ(c.messages[1]["content"], "Weather in Paris?");
  EXPECT_EQ(c.messages[2]["role"], "assistant");
  EXPECT_EQ(c.messages[2]["content"], "Let me check.");
  EXPECT_EQ(c.messages[2]["reasoning_content"], "Call the tool.");
  EXPECT_EQ(c.messages[2]["tool_calls"][0]["id"], "toolu_1");
  EXPECT_EQ(c.messages[2]["tool_calls"][0]["function"]["arguments"]["city"], "Paris");  // an object
  EXPECT_EQ(c.messages[3]["role"], "tool");
  EXPECT_EQ(c.messages[3]["tool_call_id"], "toolu_1");
  EXPECT_EQ(c.messages[3]["content"], "18 C");
  EXPECT_EQ(c.messages[4]["role"], "user");
  EXPECT_EQ(c.messages[4]["content"], "And tomorrow?");
}

TEST(AnthropicRequest, ToolChoicesAndErrorResults) {
  const std::string head = R"({"max_tokens": 5, "tools": [{"name": "f", "input_schema": {"type": "object"}}],
    "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "is_error": true,
      "content": "boom"}]}], "tool_choice": )";
  const std::pair<const char*, const char*> cases[] = {
      {R"({"type": "auto"})", "auto"}, {R"({"type": "any"})", "required"}, {R"({"type": "none"})", "none"}};
  for (const auto& [choice, want] : cases) {
    const Parsed<MessagesRequest> p = parse_messages_request(head + choice + "}");
    ASSERT_TRUE(p.ok()) << p.error.message;
    EXPECT_EQ(p.value->chat.tool_choice, want);
    ASSERT_EQ(p.value->chat.messages.size(), 1u) << "a user turn of tool results only is the tool messages";
    EXPECT_EQ(p.value->chat.messages[0]["content"], "Error: boom");
  }
}

TEST(AnthropicRequest, RefusalsNameTheField) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"messages": [{"role": "user", "content": "hi"}]})", "max_tokens"},
      {R"({"max_tokens": 5, "messages": []})", "messages"},
      {R"({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]})", "messages[0].role"},
      {R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]})",
       "messages[0].content[0].type"},
      {R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a",
          "name": "f", "input": {}}]}]})",
       "messages[0].content[0].type"},
      {R"({"max_tokens": 5, "thinking": {"type": "sometimes"}, "messages": [{"role": "user", "content": "x"}]})",
       "thinking.type"},
      {R"({"max_tokens": 0, "messages": [{"role": "user", "content": "x"}]})", "max_tokens"},
      {R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "maybe"}})",
       "tool_choice.type"},
  };
  for (const auto& [body, param] : cases) {
    const Parsed<MessagesRequest> p = parse_messages_request(body);
    ASSERT_FALSE(p.ok()) << body;
    EXPECT_EQ(p.error.status, 400) << body;
    EXPECT_EQ(p.error.param, param) << body << ": " << p.error.message;
  }
  EXPECT_FALSE(parse_messages_request("{not json").ok());
  EXPECT_FALSE(parse_messages_request("[1, 2]").ok());
  // count_tokens needs no max_tokens.
  EXPECT_TRUE(parse_count_tokens_request(R"({"messages": [{"role": "user", "content": "x"}]})").ok());
}

TEST(AnthropicResponse, MessageObjectAndStopReasons) {
  ChatChoiceResult choice;
  choice.reasoning = "think";
  choice.content = "Hello";
  choice.tool_calls = {{"call_1", "f", R"({"a":1})"}};
  Usage usage;
  usage.prompt_tokens = 10, usage.cached_tokens = 4, usage.completion_tokens = 7;
  const json m = anthropic_message({"msg_1", "tiny", 0}, choice, {"tool_use", ""}, usage);
  EXPECT_EQ(m["type"], "message");
  EXPECT_EQ(m["role"], "assistant");
  ASSERT_EQ(m["content"].size(), 3u);
  EXPECT_EQ(m["content"][0]["type"], "thinking");
  EXPECT_EQ(m["content"][1]["text"], "Hello");
  EXPECT_EQ(m["content"][2]["type"], "tool_use");
  EXPECT_EQ(m["content"][2]["input"]["a"], 1);
  EXPECT_EQ(m["stop_reason"], "tool_use");
  EXPECT_TRUE(m["stop_sequence"].is_null());
  EXPECT_EQ(m["usage"]["input_tokens"], 6);
  EXPECT_EQ(m["usage"]["cache_read_input_tokens"], 4);
  EXPECT_EQ(m["usage"]["output_tokens"], 7);
  const json s = anthropic_message({"msg_2", "tiny", 0}, {}, {"stop_sequence", "END"}, usage);
  EXPECT_EQ(s["stop_sequence"], "END");
  EXPECT_TRUE(s["content"].empty());
}

// The data: payloads of an Anthropic stream, checking each event line names
// its payload's type.
std::vector<json> events(const std::string& body) {
  std::vector<json> out;
  size_t pos = 0;
  while ((pos = body.find("event: ", pos)) != std::string::npos) {
    const size_t nl = body.find('\n', pos);
    const std::string type = body.substr(pos + 7, nl - pos - 7);
    EXPECT_EQ(body.compare(nl + 1, 6, "data: "), 0);
    const size_t end = body.find("\n\n", nl);
    out.push_back(json::parse(body.substr(nl + 7, end - nl - 7)));
    EXPECT_EQ(out.back()["type"], type);
    pos = end;
  }
  return out;
}

TEST(AnthropicResponse, StreamOpensAndClosesBlocksInOrder) {
  AnthropicStream s({"msg_1", "tiny", 0});
  Usage u;
  u.prompt_tokens = 3;
  std::string body = s.start(u);
  OutputDelta d1;
  d1.reasoning = "hm";
  body += s.delta(d1);
  OutputDelta d2;
  d2.content = "Hi";
  body += s.delta(d2);
  body += s.delta(d2);
  OutputDelta d3;
  d3.tool_calls = {{"call_9", "f", R"({"x":2})"}};
  body += s.delta(d3);
  u.completion_tokens = 5;
  body += s.finish({"tool_use", ""}, u);
  const std::vector<json> ev = events(body);
  std::vector<std::string> types;
  for (const json& e : ev) types.push_back(e["type"]);
  const std::vector<std::string> want = {"message_start",       "ping",
                                         "content_block_start", "content_block_delta",
                                         "content_block_stop",  "content_block_start",
                                         "content_block_delta", "content_block_delta",
                                         "content_block_stop",  "content_block_start",
                                         "content_block_delta", "content_block_stop",
                                         "message_delta",       "message_stop"};
  EXPECT_EQ(types, want);
  EXPECT_EQ(ev[0]["message"]["usage"]["input_tokens"], 3);
  EXPECT_EQ(ev[2]["content_block"]["type"], "thinking");
  EXPECT_EQ(ev[3]["delta"]["type"], "thinking_delta");
  EXPECT_EQ(ev[5]["index"], 1);
  EXPECT_EQ(ev[6]["delta"]["text"], "Hi");
  EXPECT_EQ(ev[9]["content_block"]["type"], "tool_use");
  EXPECT_EQ(ev[9]["index"], 2);
  EXPECT_EQ(ev[10]["delta"]["partial_json"], R"({"x":2})");
  EXPECT_EQ(ev[12]["delta"]["stop_reason"], "tool_use");
  EXPECT_EQ(ev[12]["usage"]["output_tokens"], 5);
}

TEST(AnthropicResponse, ErrorsInAnthropicsShape) {
  const json e = anthropic_error(not_found("no such thing"));
  EXPECT_EQ(e["type"], "error");
  EXPECT_EQ(e["error"]["type"], "not_found_error");
  EXPECT_EQ(e["error"]["message"], "no such thing");
  const json r = json::parse(anthropic_error_body(429, invalid_request("slow down").to_json().dump()));
  EXPECT_EQ(r["error"]["type"], "rate_limit_error");
  EXPECT_EQ(r["error"]["message"], "slow down");
  EXPECT_EQ(json::parse(anthropic_error_body(503, "garbage"))["error"]["type"], "overloaded_error");
  EXPECT_EQ(json::parse(anthropic_error_body(401, "{}"))["error"]["type"], "authentication_error");
}

}  // namespace
}  // namespace moeserve::server::api
