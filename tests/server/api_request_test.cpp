// Request parsing, part 1: JSON body checks and /v1/chat/completions
// messages, tools and flags (api_params_test.cpp has the rest).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "chat/chat_template.h"
#include "server/api/openai_request.h"

namespace moeserve::server::api {
namespace {

using ojson = nlohmann::ordered_json;

constexpr const char* kHello = R"("messages":[{"role":"user","content":"hi"}])";

std::string chat_body(const std::string& extra) {
  return std::string("{") + kHello + (extra.empty() ? "" : "," + extra) + "}";
}

ChatCompletionRequest chat_ok(const std::string& body) {
  Parsed<ChatCompletionRequest> p = parse_chat_completion_request(body);
  EXPECT_TRUE(p.ok()) << body << " -> " << p.error.message;
  return p.ok() ? *p.value : ChatCompletionRequest{};
}

ApiError chat_error(const std::string& body) {
  Parsed<ChatCompletionRequest> p = parse_chat_completion_request(body);
  EXPECT_FALSE(p.ok()) << body;
  EXPECT_EQ(p.error.status, 400);
  EXPECT_EQ(p.error.type, "invalid_request_error");
  return p.error;
}

// ---- JSON body ----------------------------------------------------------------

TEST(ApiJsonBody, NestingDepthIgnoresBracketsInStrings) {
  EXPECT_EQ(json_nesting_depth("{}"), 1);
  EXPECT_EQ(json_nesting_depth(R"({"a":[[1],{"b":2}]})"), 3);
  EXPECT_EQ(json_nesting_depth(R"({"a":"[[[[{{{"})"), 1);
  EXPECT_EQ(json_nesting_depth(R"({"a":"\"[[[["})"), 1);
  EXPECT_EQ(json_nesting_depth(R"(["\\", [[]]])"), 3);
  EXPECT_EQ(json_nesting_depth("]]]]"), 0);
  EXPECT_EQ(json_nesting_depth("123"), 0);
}

TEST(ApiJsonBody, MalformedJsonNamesPosition) {
  ApiError e = chat_error(R"({"messages": [}")");
  EXPECT_NE(e.message.find("invalid JSON at byte"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("column"), std::string::npos) << e.message;
  EXPECT_EQ(e.message.find("[json.exception"), std::string::npos) << e.message;
  chat_error("");
  chat_error("{");
  chat_error("nul");
  // Invalid UTF-8: the message must not echo the bytes (the error body has to serialize).
  ApiError utf8 = chat_error(std::string("{\"messages\": \"\xff\xfe\"}"));
  EXPECT_NO_THROW((void)utf8.to_json().dump()) << utf8.message;
  EXPECT_EQ(utf8.message.find("last read"), std::string::npos);
}

TEST(ApiJsonBody, BodyMustBeAnObject) {
  for (const char* body : {"[]", "1", "\"x\"", "null", "true"}) {
    EXPECT_EQ(chat_error(body).message, "the request body must be a JSON object");
    EXPECT_FALSE(parse_completion_request(body).ok());
    EXPECT_FALSE(parse_tokenize_request(body).ok());
    EXPECT_FALSE(parse_detokenize_request(body).ok());
  }
}

TEST(ApiJsonBody, DeepNestingIsRejectedBeforeParsing) {
  // Deep enough to overflow the stack if it reached the recursive parser.
  std::string deep = "{\"messages\":" + std::string(200000, '[') + std::string(200000, ']') + "}";
  EXPECT_NE(chat_error(deep).message.find("nested deeper than 64"), std::string::npos);
  std::string unbalanced = std::string(500000, '{');
  chat_error(unbalanced);
  // 64 levels in total are fine.
  std::string ok = "{\"x\":" + std::string(62, '[') + std::string(62, ']') + "," + kHello + "}";
  chat_ok(ok);
  std::string too_deep = "{\"x\":" + std::string(64, '[') + std::string(64, ']') + "," + kHello + "}";
  chat_error(too_deep);
}

// ---- chat: messages ---------------------------------------------------------------

TEST(ApiChatRequest, MinimalRequestKeepsDefaults) {
  ChatCompletionRequest r = chat_ok(chat_body(R"("model":"qwen3")"));
  EXPECT_EQ(r.model, "qwen3");
  EXPECT_EQ(r.messages, ojson::parse(R"([{"role":"user","content":"hi"}])"));
  EXPECT_TRUE(r.tools.is_null());
  EXPECT_EQ(r.tool_choice, "auto");
  EXPECT_FALSE(r.tools_enabled());
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.include_usage);
  EXPECT_FALSE(r.enable_thinking.has_value());
  runtime::SamplerOptions defaults;
  EXPECT_EQ(r.params.sampling.temperature, defaults.temperature);
  EXPECT_EQ(r.params.sampling.top_k, defaults.top_k);
  EXPECT_EQ(r.params.sampling.top_p, defaults.top_p);
  EXPECT_EQ(r.params.sampling.min_p, defaults.min_p);
  EXPECT_EQ(r.params.max_tokens, -1);
  EXPECT_FALSE(r.params.seed_given);
  EXPECT_FALSE(r.params.logprobs);
  EXPECT_TRUE(r.params.stop.empty());
}

TEST(ApiChatRequest, MissingOrEmptyMessages) {
  ApiError e = chat_error("{}");
  EXPECT_EQ(e.param, "messages");
  EXPECT_EQ(e.message, "'messages' is required");
  EXPECT_EQ(chat_error(R"({"messages":null})").param, "messages");
  EXPECT_EQ(chat_error(R"({"messages":[]})").param, "messages");
  EXPECT_EQ(chat_error(R"({"messages":"hi"})").param, "messages");
  EXPECT_EQ(chat_error(R"({"messages":{"role":"user"}})").param, "messages");
}

TEST(ApiChatRequest, BadRoles) {
  EXPECT_EQ(chat_error(R"({"messages":[{"role":"robot","content":"x"}]})").param, "messages[0].role");
  EXPECT_EQ(chat_error(R"({"messages":[{"content":"x"}]})").param, "messages[0].role");
  EXPECT_EQ(chat_error(R"({"messages":[{"role":7,"content":"x"}]})").param, "messages[0].role");
  ApiError e = chat_error(R"({"messages":[{"role":"user","content":"x"},"hello"]})");
  EXPECT_EQ(e.param, "messages[1]");
  EXPECT_EQ(e.message, "'messages[1]' must be an object");
}

TEST(ApiChatRequest, DeveloperBecomesSystem) {
  auto r =
      chat_ok(R"({"messages":[{"role":"developer","content":"be brief"},{"role":"user","content":"hi"}]})");
  EXPECT_EQ(r.messages[0]["role"], "system");
  EXPECT_EQ(r.messages[0]["content"], "be brief");
}

TEST(ApiChatRequest, ContentPartsAreJoined) {
  auto r = chat_ok(
      R"({"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]})");
  EXPECT_EQ(r.messages[0]["content"], "a\nb");
  auto empty = chat_ok(R"({"messages":[{"role":"user","content":[]}]})");
  EXPECT_EQ(empty.messages[0]["content"], "");
}

TEST(ApiChatRequest, NonTextPartsAreRejected) {
  ApiError e = chat_error(
      R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]})");
  EXPECT_EQ(e.message, "only text content is supported");
  EXPECT_EQ(e.param, "messages[0].content[0]");
  EXPECT_EQ(chat_error(R"({"messages":[{"role":"user","content":[{"type":"text"}]}]})").param,
            "messages[0].content[0].text");
  EXPECT_EQ(chat_error(R"({"messages":[{"role":"user","content":["x"]}]})").param, "messages[0].content[0]");
  EXPECT_EQ(chat_error(R"({"messages":[{"role":"user","content":5}]})").param, "messages[0].content");
}

TEST(ApiChatRequest, ContentIsRequiredExceptForAssistantToolCalls) {
  EXPECT_EQ(chat_error(R"({"messages":[{"role":"user"}]})").param, "messages[0].content");
  EXPECT_EQ(chat_error(R"({"messages":[{"role":"user","content":null}]})").param, "messages[0].content");
  EXPECT_EQ(chat_error(R"({"messages":[{"role":"system","content":null}]})").param, "messages[0].content");
  EXPECT_EQ(chat_error(R"({"messages":[{"role":"assistant","content":null}]})").param, "messages[0].content");
  auto r = chat_ok(R"({"messages":[{"role":"user","content":"x"},{"role":"assistant","content":null,
      "tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]}]})");
  EXPECT_EQ(r.messages[1]["content"], "");
}

TEST(ApiChatRequest, AssistantToolCallsAreNormalized) {
  auto r = chat_ok(R"({"messages":[{"role":"user","content":"weather?"},
      {"role":"assistant","content":"","reasoning_content":"think","tool_calls":[
        {"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\",\"unit\":\"c\"}"}},
        {"function":{"name":"noargs"}},
        {"type":"function","function":{"name":"raw","arguments":"not json"}},
        {"type":"function","function":{"name":"obj","arguments":{"x":[1,2]}}}]},
      {"role":"tool","tool_call_id":"call_1","content":"sunny"}]})");
  const ojson& a = r.messages[1];
  EXPECT_EQ(a["reasoning_content"], "think");
  ASSERT_EQ(a["tool_calls"].size(), 4u);
  EXPECT_EQ(
      a["tool_calls"][0].dump(),
      R"({"id":"call_1","type":"function","function":{"name":"get_weather","arguments":{"city":"Paris","unit":"c"}}})");
  EXPECT_EQ(a["tool_calls"][1]["function"]["arguments"], ojson::object());
  EXPECT_FALSE(a["tool_calls"][1].contains("id"));
  EXPECT_EQ(a["tool_calls"][2]["function"]["arguments"], "not json");
  EXPECT_EQ(a["tool_calls"][3]["function"]["arguments"], ojson::parse(R"({"x":[1,2]})"));
  EXPECT_EQ(r.messages[2].dump(), R"({"role":"tool","content":"sunny","tool_call_id":"call_1"})");
}

TEST(ApiChatRequest, ToolCallArgumentsTooDeepStayAString) {
  std::string deep = std::string(100, '[') + std::string(100, ']');
  auto r = chat_ok(R"({"messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":")" +
                   deep + R"("}}]}]})");
  EXPECT_EQ(r.messages[0]["tool_calls"][0]["function"]["arguments"], deep);
}

TEST(ApiChatRequest, BadAssistantToolCalls) {
  auto err = [](const std::string& calls) {
    return chat_error(R"({"messages":[{"role":"assistant","tool_calls":)" + calls + "}]}").param;
  };
  EXPECT_EQ(err(R"("x")"), "messages[0].tool_calls");
  EXPECT_EQ(err(R"([1])"), "messages[0].tool_calls[0]");
  EXPECT_EQ(err(R"([{"type":"function"}])"), "messages[0].tool_calls[0].function");
  EXPECT_EQ(err(R"([{"function":{"arguments":"{}"}}])"), "messages[0].tool_calls[0].function.name");
  EXPECT_EQ(err(R"([{"function":{"name":""}}])"), "messages[0].tool_calls[0].function.name");
  EXPECT_EQ(err(R"([{"function":{"name":"f","arguments":5}}])"),
            "messages[0].tool_calls[0].function.arguments");
  EXPECT_EQ(err(R"([{"type":"code","function":{"name":"f"}}])"), "messages[0].tool_calls[0].type");
  EXPECT_EQ(err(R"([{"id":5,"function":{"name":"f"}}])"), "messages[0].tool_calls[0].id");
}

TEST(ApiChatRequest, ToolMessagesNeedToolCallId) {
  EXPECT_EQ(chat_error(R"({"messages":[{"role":"tool","content":"x"}]})").param, "messages[0].tool_call_id");
  EXPECT_EQ(chat_error(R"({"messages":[{"role":"tool","content":"x","tool_call_id":1}]})").param,
            "messages[0].tool_call_id");
  EXPECT_EQ(chat_error(R"({"messages":[{"role":"tool","tool_call_id":"c"}]})").param, "messages[0].content");
}

TEST(ApiChatRequest, NameIsKeptAndChecked) {
  auto r = chat_ok(R"({"messages":[{"role":"user","content":"x","name":"bob","extra":1}]})");
  EXPECT_EQ(r.messages[0].dump(), R"({"role":"user","content":"x","name":"bob"})");
  EXPECT_EQ(chat_error(R"({"messages":[{"role":"user","content":"x","name":1}]})").param, "messages[0].name");
}

// ---- chat: tools ----------------------------------------------------------------

constexpr const char* kTools =
    R"("tools":[{"type":"function","function":{"name":"get_weather","description":"Weather",
       "parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]},"strict":true}},
       {"type":"function","function":{"name":"now"}}])";

TEST(ApiChatRequest, ToolsAreValidatedAndKeepKeyOrder) {
  auto r = chat_ok(chat_body(kTools));
  ASSERT_TRUE(r.tools.is_array());
  ASSERT_EQ(r.tools.size(), 2u);
  EXPECT_EQ(
      r.tools[0].dump(),
      R"({"type":"function","function":{"name":"get_weather","description":"Weather","parameters":)"
      R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]},"strict":true}})");
  EXPECT_EQ(r.tools[1].dump(), R"({"type":"function","function":{"name":"now"}})");
  // A strict tool's calls get a grammar; `strict` must be a boolean.
  ASSERT_TRUE(r.params.tool_calls.has_value());
  EXPECT_FALSE(r.params.tool_calls->required);
  EXPECT_EQ(
      chat_error(chat_body(R"("tools":[{"type":"function","function":{"name":"f","strict":"yes"}}])")).param,
      "tools[0].function.strict");
  EXPECT_TRUE(r.tools_enabled());
  EXPECT_TRUE(chat_ok(chat_body(R"("tools":[])")).tools.is_null());
  EXPECT_TRUE(chat_ok(chat_body(R"("tools":null)")).tools.is_null());
}

TEST(ApiChatRequest, BadTools) {
  EXPECT_EQ(chat_error(chat_body(R"("tools":{})")).param, "tools");
  EXPECT_EQ(chat_error(chat_body(R"("tools":[1])")).param, "tools[0]");
  EXPECT_EQ(chat_error(chat_body(R"("tools":[{"function":{"name":"f"}}])")).param, "tools[0].type");
  EXPECT_EQ(chat_error(chat_body(R"("tools":[{"type":"retrieval","function":{"name":"f"}}])")).param,
            "tools[0].type");
  EXPECT_EQ(chat_error(chat_body(R"("tools":[{"type":"function"}])")).param, "tools[0].function");
  EXPECT_EQ(chat_error(chat_body(R"("tools":[{"type":"function","function":{}}])")).param,
            "tools[0].function.name");
  EXPECT_EQ(
      chat_error(chat_body(R"("tools":[{"type":"function","function":{"name":"f","parameters":[]}}])")).param,
      "tools[0].function.parameters");
  EXPECT_EQ(
      chat_error(chat_body(R"("tools":[{"type":"function","function":{"name":"f","description":1}}])")).param,
      "tools[0].function.description");
  EXPECT_EQ(chat_error(chat_body(R"("tools":[{"type":"function","function":{"name":"f"}},)"
                                 R"({"type":"function","function":{"name":"f"}}])"))
                .param,
            "tools[1].function.name");
}

TEST(ApiChatRequest, ToolChoice) {
  std::string tools = kTools;
  EXPECT_EQ(chat_ok(chat_body(tools + R"(,"tool_choice":"none")")).tool_choice, "none");
  EXPECT_FALSE(chat_ok(chat_body(tools + R"(,"tool_choice":"none")")).tools_enabled());
  EXPECT_EQ(chat_ok(chat_body(tools + R"(,"tool_choice":"required")")).tool_choice, "required");
  EXPECT_EQ(chat_ok(chat_body(tools + R"(,"tool_choice":{"type":"function","function":{"name":"now"}})"))
                .tool_choice,
            "now");
  EXPECT_EQ(chat_ok(chat_body(R"("tool_choice":"none")")).tool_choice, "none");
  EXPECT_EQ(chat_ok(chat_body(R"("tool_choice":"auto")")).tool_choice, "auto");
  for (const char* bad :
       {R"("tool_choice":"sometimes")", R"("tool_choice":5)", R"("tool_choice":{"type":"function"})",
        R"("tool_choice":"required")", R"("tool_choice":{"function":{"name":"now"}})"}) {
    EXPECT_EQ(chat_error(chat_body(bad)).param, "tool_choice") << bad;
  }
  EXPECT_EQ(
      chat_error(chat_body(tools + R"(,"tool_choice":{"type":"function","function":{"name":"nope"}})")).param,
      "tool_choice");
}

// ---- chat: flags ----------------------------------------------------------------

TEST(ApiChatRequest, StreamAndUsage) {
  auto r = chat_ok(chat_body(R"("stream":true,"stream_options":{"include_usage":true})"));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_FALSE(chat_ok(chat_body(R"("stream":false,"stream_options":{"include_usage":true})")).include_usage);
  EXPECT_EQ(chat_error(chat_body(R"("stream":"yes")")).param, "stream");
  EXPECT_EQ(chat_error(chat_body(R"("stream":true,"stream_options":1)")).param, "stream_options");
  EXPECT_EQ(chat_error(chat_body(R"("stream":true,"stream_options":{"include_usage":1})")).param,
            "stream_options.include_usage");
}

TEST(ApiChatRequest, EnableThinking) {
  EXPECT_EQ(chat_ok(chat_body(R"("enable_thinking":false)")).enable_thinking, false);
  auto r = chat_ok(chat_body(R"("chat_template_kwargs":{"enable_thinking":true,"preserve_thinking":1})"));
  EXPECT_EQ(r.enable_thinking, true);
  EXPECT_EQ(r.template_kwargs.dump(), R"({"preserve_thinking":1})");
  EXPECT_EQ(chat_ok(chat_body(R"("chat_template_kwargs":{"enable_thinking":true},"enable_thinking":false)"))
                .enable_thinking,
            false);
  EXPECT_EQ(chat_error(chat_body(R"("enable_thinking":"no")")).param, "enable_thinking");
  EXPECT_EQ(chat_error(chat_body(R"("chat_template_kwargs":[])")).param, "chat_template_kwargs");
  EXPECT_EQ(chat_error(chat_body(R"("chat_template_kwargs":{"enable_thinking":0})")).param,
            "chat_template_kwargs.enable_thinking");
}

TEST(ApiChatRequest, ModelMustBeAString) { EXPECT_EQ(chat_error(chat_body(R"("model":1)")).param, "model"); }

TEST(ApiChatRequest, UnknownFieldsAndNullsAreIgnored) {
  auto r = chat_ok(
      chat_body(R"("user":"x","response_format":{"type":"text"},"temperature":null,"stop":null,"n":null)"));
  EXPECT_EQ(r.params.sampling.temperature, runtime::SamplerOptions{}.temperature);
}

// ---- template integration ------------------------------------------------------

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(ApiChatRequest, NormalizedMessagesRenderThroughQwen3Template) {
  std::string source = read_file(std::string(MOESERVE_TEST_DATA_DIR) + "/../reference/templates/qwen3.jinja");
  ASSERT_FALSE(source.empty());
  auto tmpl = chat::ChatTemplate::parse(source);
  ASSERT_TRUE(tmpl.is_ok()) << tmpl.status().message();
  auto r = chat_ok(
      std::string(R"({"messages":[{"role":"developer","content":"sys"},{"role":"user","content":"weather?"},
      {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function",
        "function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},
      {"role":"tool","tool_call_id":"c1","content":"sunny"}],)") +
      kTools + "}");
  chat::ChatRenderInput input;
  input.messages = r.messages;
  input.tools = r.tools;
  input.enable_thinking = false;
  auto text = tmpl->render(input);
  ASSERT_TRUE(text.is_ok()) << text.status().message();
  EXPECT_NE(text->find("<|im_start|>system\nsys\n\n# Tools"), std::string::npos) << *text;
  EXPECT_NE(
      text->find(R"({"type": "function", "function": {"name": "get_weather", "description": "Weather")"),
      std::string::npos)
      << *text;
  EXPECT_NE(
      text->find(
          "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"),
      std::string::npos)
      << *text;
  EXPECT_NE(text->find("<tool_response>\nsunny\n</tool_response>"), std::string::npos) << *text;
  EXPECT_TRUE(text->ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n")) << *text;
}

}  // namespace
}  // namespace moeserve::server::api
