// OpenAI's Responses API translation (api/responses.h): input items onto the
// chat request, the response object, the stream's events and the refusals.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/api/responses.h"

namespace moeserve::server::api {
namespace {

using nlohmann::json;

TEST(ResponsesRequest, TranslatesInputItemsToolsAndOptions) {
  const char* body = R"({
    "model": "tiny", "instructions": "Be brief.", "max_output_tokens": 50, "temperature": 0.2, "top_p": 0.8,
    "reasoning": {"effort": "minimal"}, "stream": true, "text": {"format": {"type": "text"}},
    "tools": [{"type": "function", "name": "get_weather", "description": "Weather",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}, "strict": true}],
    "tool_choice": {"type": "function", "name": "get_weather"},
    "input": [
      {"role": "developer", "content": "Use tools."},
      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
      {"type": "reasoning", "summary": []},
      {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
      {"type": "function_call_output", "call_id": "call_1", "output": "18 C"},
      {"role": "assistant", "content": [{"type": "output_text", "text": "It is 18 C."}]},
      {"role": "user", "content": "Thanks"}]})";
  const Parsed<ResponsesRequest> p = parse_responses_request(body);
  ASSERT_TRUE(p.ok()) << p.error.message << " (" << p.error.param << ")";
  EXPECT_TRUE(p.value->stream);
  const ChatCompletionRequest& c = p.value->chat;
  EXPECT_EQ(c.params.max_tokens, 50);
  EXPECT_FLOAT_EQ(c.params.sampling.temperature, 0.2f);
  EXPECT_EQ(c.enable_thinking, false);
  EXPECT_EQ(c.tool_choice, "get_weather");
  ASSERT_EQ(c.messages.size(), 7u);
  EXPECT_EQ(c.messages[0]["role"], "system");
  EXPECT_EQ(c.messages[0]["content"], "Be brief.");
  EXPECT_EQ(c.messages[1]["role"], "system");  // developer
  EXPECT_EQ(c.messages[2]["content"], "Weather in Paris?");
  EXPECT_EQ(c.messages[3]["role"], "assistant");
  EXPECT_EQ(c.messages[3]["tool_calls"][0]["id"], "call_1");
  EXPECT_EQ(c.messages[3]["tool_calls"][0]["function"]["arguments"]["city"], "Paris");
  EXPECT_EQ(c.messages[4]["role"], "tool");
  EXPECT_EQ(c.messages[4]["content"], "18 C");
  EXPECT_EQ(c.messages[5]["content"], "It is 18 C.");
  EXPECT_EQ(c.messages[6]["content"], "Thanks");
  const json& echo = p.value->echo;
  EXPECT_EQ(echo["instructions"], "Be brief.");
  EXPECT_EQ(echo["max_output_tokens"], 50);
  EXPECT_EQ(echo["tools"][0]["name"], "get_weather");
  EXPECT_EQ(echo["reasoning"]["effort"], "minimal");
}

TEST(ResponsesRequest, StringInputAndRefusals) {
  const Parsed<ResponsesRequest> p = parse_responses_request(R"({"input": "Hi"})");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p.value->chat.params.format, OutputFormat::kText);
  const Parsed<ResponsesRequest> js = parse_responses_request(
      R"({"input": "Hi", "text": {"format": {"type": "json_schema", "name": "a", "schema": {"type": "array"}}}})");
  ASSERT_TRUE(js.ok()) << js.error.message;
  EXPECT_EQ(js.value->chat.params.format, OutputFormat::kJsonValue);
  EXPECT_EQ(js.value->echo["text"]["format"]["name"], "a");
  ASSERT_EQ(p.value->chat.messages.size(), 1u);
  EXPECT_EQ(p.value->chat.messages[0]["role"], "user");
  const std::pair<const char*, const char*> cases[] = {
      {R"({})", "input"},
      {R"({"input": 5})", "input"},
      {R"({"input": "x", "previous_response_id": "resp_1"})", "previous_response_id"},
      {R"({"input": [{"type": "item_reference", "id": "msg_1"}]})", "input[0].type"},
      {R"({"input": "x", "tools": [{"type": "web_search"}]})", "tools[0].type"},
      {R"({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]})",
       "input[0].content[0].type"},
      {R"({"input": "x", "text": {"format": {"type": "xml"}}})", "text.format.type"},
      {R"({"input": "x", "reasoning": {"effort": "extreme"}})", "reasoning.effort"},
      {R"({"input": [{"role": "robot", "content": "x"}]})", "input[0].role"},
  };
  for (const auto& [body, param] : cases) {
    const Parsed<ResponsesRequest> r = parse_responses_request(body);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.error.status, 400) << body;
    EXPECT_EQ(r.error.param, param) << body << ": " << r.error.message;
  }
}

TEST(ResponsesResponse, ObjectHasOutputItemsUsageAndEcho) {
  ChatChoiceResult choice;
  choice.reasoning = "think";
  choice.content = "Hello";
  choice.tool_calls = {{"call_1", "f", R"({"a":1})"}};
  Usage u;
  u.prompt_tokens = 10, u.cached_tokens = 4, u.completion_tokens = 7;
  const json r =
      response_object({"resp_1", "tiny", 123}, {{"instructions", "Be brief."}}, choice, {false}, u);
  EXPECT_EQ(r["object"], "response");
  EXPECT_EQ(r["status"], "completed");
  EXPECT_EQ(r["instructions"], "Be brief.");
  ASSERT_EQ(r["output"].size(), 3u);
  EXPECT_EQ(r["output"][0]["type"], "reasoning");
  EXPECT_EQ(r["output"][1]["content"][0]["text"], "Hello");
  EXPECT_EQ(r["output"][2]["type"], "function_call");
  EXPECT_EQ(r["output"][2]["call_id"], "call_1");
  EXPECT_EQ(r["output"][2]["arguments"], R"({"a":1})");
  EXPECT_EQ(r["usage"]["input_tokens"], 10);
  EXPECT_EQ(r["usage"]["input_tokens_details"]["cached_tokens"], 4);
  EXPECT_EQ(r["usage"]["total_tokens"], 17);
  const json cut = response_object({"resp_2", "tiny", 1}, json::object(), {}, {true}, u);
  EXPECT_EQ(cut["status"], "incomplete");
  EXPECT_EQ(cut["incomplete_details"]["reason"], "max_output_tokens");
}

TEST(ResponsesResponse, StreamEventsAreOrderedAndNumbered) {
  ResponsesStream s({"resp_1", "tiny", 1}, json::object());
  std::string body = s.start();
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
  body += s.finish({false}, {});
  std::vector<json> ev;
  size_t pos = 0;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    const size_t end = body.find("\n\n", pos);
    ev.push_back(json::parse(body.substr(pos + 6, end - pos - 6)));
    pos = end;
  }
  std::vector<std::string> types;
  for (size_t i = 0; i < ev.size(); ++i) {
    types.push_back(ev[i]["type"]);
    EXPECT_EQ(ev[i]["sequence_number"], int64_t(i));
  }
  const std::vector<std::string> want = {"response.created",
                                         "response.in_progress",
                                         "response.output_item.added",
                                         "response.content_part.added",
                                         "response.reasoning_text.delta",
                                         "response.reasoning_text.done",
                                         "response.content_part.done",
                                         "response.output_item.done",
                                         "response.output_item.added",
                                         "response.content_part.added",
                                         "response.output_text.delta",
                                         "response.output_text.delta",
                                         "response.output_text.done",
                                         "response.content_part.done",
                                         "response.output_item.done",
                                         "response.output_item.added",
                                         "response.function_call_arguments.delta",
                                         "response.function_call_arguments.done",
                                         "response.output_item.done",
                                         "response.completed"};
  EXPECT_EQ(types, want);
  EXPECT_EQ(ev[12]["text"], "HiHi");
  EXPECT_EQ(ev[15]["output_index"], 2);
  const json& final_response = ev.back()["response"];
  ASSERT_EQ(final_response["output"].size(), 3u);
  EXPECT_EQ(final_response["output"][1]["id"], ev[9]["item_id"]) << "the final items are the streamed ones";
  EXPECT_EQ(final_response["output"][1]["content"][0]["text"], "HiHi");
}

}  // namespace
}  // namespace moeserve::server::api
