// Response JSON shapes: what OpenAI clients parse.
#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "server/api/response_format.h"

namespace moeserve::server::api {
namespace {

const ResponseMeta kMeta{"chatcmpl-abc", "qwen3", 1700000000};

TEST(ApiResponseFormat, MakeIdIsPrefixPlusHex) {
  std::string id = make_id("chatcmpl-");
  ASSERT_EQ(id.size(), 9u + 24u);
  EXPECT_TRUE(id.starts_with("chatcmpl-"));
  EXPECT_EQ(id.find_first_not_of("0123456789abcdef", 9), std::string::npos);
  EXPECT_NE(make_id("x"), make_id("x"));
  EXPECT_GT(unix_time_now(), 1600000000);
}

TEST(ApiResponseFormat, Usage) {
  EXPECT_EQ((Usage{.prompt_tokens = 10, .completion_tokens = 5, .cached_tokens = 3}.to_json()),
            json::parse(R"({"prompt_tokens":10,"completion_tokens":5,"total_tokens":15,
      "prompt_tokens_details":{"cached_tokens":3}})"));
}

TEST(ApiResponseFormat, ChatCompletionWithContentAndReasoning) {
  ChatChoiceResult c;
  c.content = "4";
  c.reasoning = "2+2";
  json j = chat_completion(kMeta, c, {.prompt_tokens = 7, .completion_tokens = 2, .cached_tokens = 0});
  EXPECT_EQ(
      j, json::parse(R"({"id":"chatcmpl-abc","object":"chat.completion","created":1700000000,"model":"qwen3",
      "choices":[{"index":0,"message":{"role":"assistant","content":"4","reasoning_content":"2+2"},
                  "logprobs":null,"finish_reason":"stop"}],
      "usage":{"prompt_tokens":7,"completion_tokens":2,"total_tokens":9,"prompt_tokens_details":{"cached_tokens":0}}})"));
}

TEST(ApiResponseFormat, ChatCompletionEmptyContentWithoutToolCallsIsEmptyString) {
  json j = chat_completion(kMeta, ChatChoiceResult{}, {});
  EXPECT_EQ(j["choices"][0]["message"]["content"], "");
  EXPECT_FALSE(j["choices"][0]["message"].contains("reasoning_content"));
  EXPECT_FALSE(j["choices"][0]["message"].contains("tool_calls"));
}

TEST(ApiResponseFormat, ChatCompletionWithToolCalls) {
  ChatChoiceResult c;
  c.tool_calls = {{"call_1", "get_weather", R"({"city":"Paris"})"}};
  c.logprobs = chat_logprobs(std::vector<TokenLogprob>{});
  json j = chat_completion(kMeta, c, {});
  const json& choice = j["choices"][0];
  EXPECT_TRUE(choice["message"]["content"].is_null());
  EXPECT_EQ(choice["message"]["tool_calls"], json::parse(R"([{"id":"call_1","type":"function",
      "function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}])"));
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_EQ(choice["logprobs"], json::parse(R"({"content":[],"refusal":null})"));
  c.finish_reason = "length";
  EXPECT_EQ(chat_completion(kMeta, c, {})["choices"][0]["finish_reason"], "length");
}

TEST(ApiResponseFormat, ChatChunks) {
  EXPECT_EQ(chat_chunk_role(kMeta), json::parse(R"({"id":"chatcmpl-abc","object":"chat.completion.chunk",
      "created":1700000000,"model":"qwen3","choices":[{"index":0,"delta":{"role":"assistant","content":""},
      "logprobs":null,"finish_reason":null}]})"));

  ChatDelta d;
  d.content = "Hel";
  d.reasoning = "hmm";
  json j = chat_chunk_delta(kMeta, d);
  EXPECT_EQ(j["choices"][0]["delta"], json::parse(R"({"content":"Hel","reasoning_content":"hmm"})"));
  EXPECT_TRUE(j["choices"][0]["finish_reason"].is_null());

  ChatDelta calls;
  calls.tool_calls = {{"call_a", "f", "{}"}, {"call_b", "g", "{\"x\":1}"}};
  calls.first_tool_index = 2;
  EXPECT_EQ(chat_chunk_delta(kMeta, calls)["choices"][0]["delta"], json::parse(R"({"tool_calls":[
      {"id":"call_a","type":"function","function":{"name":"f","arguments":"{}"},"index":2},
      {"id":"call_b","type":"function","function":{"name":"g","arguments":"{\"x\":1}"},"index":3}]})"));

  json fin = chat_chunk_finish(kMeta, "length");
  EXPECT_EQ(fin["choices"][0]["delta"], json::object());
  EXPECT_EQ(fin["choices"][0]["finish_reason"], "length");

  json usage = chat_chunk_usage(kMeta, {.prompt_tokens = 3, .completion_tokens = 4, .cached_tokens = 1});
  EXPECT_EQ(usage["choices"], json::array());
  EXPECT_EQ(usage["usage"]["total_tokens"], 7);
  EXPECT_EQ(usage["object"], "chat.completion.chunk");
}

TEST(ApiResponseFormat, ChatLogprobs) {
  std::vector<TokenLogprob> tokens = {{"H\xc3\xa9", -0.5f, {{"H\xc3\xa9", -0.5f}, {"a", -1.25f}}},
                                      {"x", -std::numeric_limits<float>::infinity(), {}}};
  EXPECT_EQ(chat_logprobs(tokens), json::parse(R"({"content":[
      {"token":"H\u00e9","logprob":-0.5,"bytes":[72,195,169],
       "top_logprobs":[{"token":"H\u00e9","logprob":-0.5,"bytes":[72,195,169]},{"token":"a","logprob":-1.25,"bytes":[97]}]},
      {"token":"x","logprob":-9999.0,"bytes":[120],"top_logprobs":[]}],"refusal":null})"));
  EXPECT_EQ(chat_logprob_entries(tokens).size(), 2u);
}

TEST(ApiResponseFormat, CompletionLogprobs) {
  std::vector<TokenLogprob> tokens = {{"Hello", -0.25f, {{"Hello", -0.25f}, {"Hi", -2.0f}}},
                                      {" world", -1.0f, {}}};
  EXPECT_EQ(completion_logprobs(tokens, 4),
            json::parse(R"({"tokens":["Hello"," world"],"token_logprobs":[-0.25,-1.0],
      "top_logprobs":[{"Hello":-0.25,"Hi":-2.0},{}],"text_offset":[4,9]})"));
}

TEST(ApiResponseFormat, TextCompletion) {
  CompletionChoiceResult c;
  c.text = " there";
  c.finish_reason = "length";
  json j = text_completion({"cmpl-1", "m", 5}, c,
                           {.prompt_tokens = 2, .completion_tokens = 1, .cached_tokens = 0});
  EXPECT_EQ(j, json::parse(R"({"id":"cmpl-1","object":"text_completion","created":5,"model":"m",
      "choices":[{"index":0,"text":" there","logprobs":null,"finish_reason":"length"}],
      "usage":{"prompt_tokens":2,"completion_tokens":1,"total_tokens":3,"prompt_tokens_details":{"cached_tokens":0}}})"));

  CompletionChoiceResult piece;
  piece.text = "a";
  piece.finish_reason = "";
  json chunk = text_completion_chunk({"cmpl-1", "m", 5}, piece);
  EXPECT_TRUE(chunk["choices"][0]["finish_reason"].is_null());
  EXPECT_FALSE(chunk.contains("usage"));
  json usage = text_completion_usage_chunk({"cmpl-1", "m", 5},
                                           {.prompt_tokens = 1, .completion_tokens = 1, .cached_tokens = 0});
  EXPECT_EQ(usage["choices"], json::array());
  EXPECT_EQ(usage["usage"]["total_tokens"], 2);
}

TEST(ApiResponseFormat, ModelsList) {
  std::vector<ModelInfo> models = {{"qwen3-30b", 123}};
  EXPECT_EQ(models_list(models), json::parse(R"({"object":"list","data":[
      {"id":"qwen3-30b","object":"model","created":123,"owned_by":"moeserve"}]})"));
  EXPECT_EQ(models_list({}), json::parse(R"({"object":"list","data":[]})"));
}

TEST(ApiResponseFormat, SseFraming) {
  EXPECT_EQ(sse_data(json{{"a", 1}, {"b", "x y"}}), "data: {\"a\":1,\"b\":\"x y\"}\n\n");
  EXPECT_EQ(sse_done(), "data: [DONE]\n\n");
  // Multi-line text stays on one data line (newlines are escaped in JSON).
  EXPECT_EQ(sse_data(json("a\nb")), "data: \"a\\nb\"\n\n");
}

TEST(ApiResponseFormat, InvalidUtf8IsReplacedNotThrown) {
  ChatDelta d;
  d.content = "ok \xe4\xb8";  // cut inside a character
  std::string s;
  EXPECT_NO_THROW(s = sse_data(chat_chunk_delta(kMeta, d)));
  EXPECT_NE(s.find("ok \xef\xbf\xbd"), std::string::npos) << s;
}

}  // namespace
}  // namespace moeserve::server::api
