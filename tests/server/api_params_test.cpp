// Request parsing, part 2: generation parameters (shared by chat and
// completions), /v1/completions prompts, /tokenize and /detokenize bodies,
// and garbage that must never throw.
#include <gtest/gtest.h>

#include <string>

#include "server/api/openai_request.h"

namespace moeserve::server::api {
namespace {

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

ApiError completion_error(const std::string& body) {
  Parsed<CompletionRequest> p = parse_completion_request(body);
  EXPECT_FALSE(p.ok()) << body;
  EXPECT_EQ(p.error.status, 400);
  return p.error;
}

// ---- generation parameters ------------------------------------------------------

TEST(ApiGenerationParams, AllFieldsAreRead) {
  auto r = chat_ok(chat_body(
      R"("temperature":0,"top_p":0.5,"top_k":7,"min_p":0.1,"seed":42,"presence_penalty":-1.5,)"
      R"("frequency_penalty":2,"repeat_penalty":1.1,"repeat_last_n":-1,"max_tokens":100,"stop":["a","b"],)"
      R"("logprobs":true,"top_logprobs":5,"n":1)"));
  const GenerationParams& p = r.params;
  EXPECT_EQ(p.sampling.temperature, 0.0f);
  EXPECT_EQ(p.sampling.top_p, 0.5f);
  EXPECT_EQ(p.sampling.top_k, 7);
  EXPECT_FLOAT_EQ(p.sampling.min_p, 0.1f);
  EXPECT_EQ(p.sampling.seed, 42u);
  EXPECT_TRUE(p.seed_given);
  EXPECT_EQ(p.sampling.presence_penalty, -1.5f);
  EXPECT_EQ(p.sampling.frequency_penalty, 2.0f);
  EXPECT_FLOAT_EQ(p.sampling.repeat_penalty, 1.1f);
  EXPECT_EQ(p.sampling.repeat_last_n, -1);
  EXPECT_EQ(p.max_tokens, 100);
  EXPECT_EQ(p.stop, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(p.logprobs);
  EXPECT_EQ(p.top_logprobs, 5);
}

TEST(ApiGenerationParams, MaxCompletionTokensWins) {
  EXPECT_EQ(chat_ok(chat_body(R"("max_tokens":10,"max_completion_tokens":20)")).params.max_tokens, 20);
  EXPECT_EQ(chat_ok(chat_body(R"("max_completion_tokens":3)")).params.max_tokens, 3);
}

// "priority" (vLLM's): lower is admitted first; 0 without it.
TEST(ApiGenerationParams, PriorityIsABoundedInteger) {
  EXPECT_EQ(chat_ok(chat_body("")).params.priority, 0);
  EXPECT_EQ(chat_ok(chat_body(R"("priority":-3)")).params.priority, -3);
  EXPECT_EQ(chat_ok(chat_body(R"("priority":1000000)")).params.priority, 1000000);
  EXPECT_EQ(chat_error(chat_body(R"("priority":1000001)")).param, "priority");
  EXPECT_EQ(chat_error(chat_body(R"("priority":"high")")).param, "priority");
  EXPECT_EQ(chat_error(chat_body(R"("priority":0.5)")).param, "priority");
}

TEST(ApiGenerationParams, SeedAcceptsAnyInteger) {
  EXPECT_EQ(chat_ok(chat_body(R"("seed":-1)")).params.sampling.seed, ~uint64_t{0});
  EXPECT_EQ(chat_ok(chat_body(R"("seed":18446744073709551615)")).params.sampling.seed, ~uint64_t{0});
  EXPECT_EQ(chat_error(chat_body(R"("seed":1.5)")).param, "seed");
  EXPECT_EQ(chat_error(chat_body(R"("seed":"1")")).param, "seed");
}

TEST(ApiGenerationParams, HugeTopKMeansAll) {
  EXPECT_EQ(chat_ok(chat_body(R"("top_k":99999999999)")).params.sampling.top_k, 2147483647);
}

TEST(ApiGenerationParams, StopAcceptsStringOrArray) {
  EXPECT_EQ(chat_ok(chat_body(R"("stop":"END")")).params.stop, std::vector<std::string>{"END"});
  std::string sixteen = R"("stop":[)";
  for (int i = 0; i < 16; ++i) sixteen += (i ? ",\"s" : "\"s") + std::to_string(i) + "\"";
  EXPECT_EQ(chat_ok(chat_body(sixteen + "]")).params.stop.size(), 16u);
  EXPECT_EQ(chat_error(chat_body(sixteen + ",\"x\"]")).param, "stop");
  EXPECT_TRUE(chat_ok(chat_body(R"("stop":[])")).params.stop.empty());
  for (const char* bad : {R"("stop":"")", R"("stop":[""])", R"("stop":[1])", R"("stop":5)", R"("stop":{})"}) {
    EXPECT_EQ(chat_error(chat_body(bad)).param, "stop") << bad;
  }
}

TEST(ApiGenerationParams, OnlyNEqualsOne) {
  ApiError e = chat_error(chat_body(R"("n":2)"));
  EXPECT_EQ(e.message, "only n=1 is supported");
  EXPECT_EQ(e.param, "n");
  chat_error(chat_body(R"("n":0)"));
  chat_error(chat_body(R"("n":1.5)"));
  chat_error(chat_body(R"("n":"1")"));
  EXPECT_EQ(completion_error(R"({"prompt":"x","n":3})").message, "only n=1 is supported");
}

struct RangeCase {
  const char* field;
  const char* value;
};

TEST(ApiGenerationParams, OutOfRangeAndWrongTypesAreRejected) {
  const RangeCase cases[] = {
      {"temperature", "-0.1"},
      {"temperature", "2.01"},
      {"temperature", "\"1\""},
      {"temperature", "true"},
      {"top_p", "0"},
      {"top_p", "1.5"},
      {"top_p", "[]"},
      {"top_k", "-1"},
      {"top_k", "1.5"},
      {"min_p", "-0.5"},
      {"min_p", "1.01"},
      {"presence_penalty", "2.5"},
      {"presence_penalty", "-3"},
      {"frequency_penalty", "9"},
      {"repeat_penalty", "0"},
      {"repeat_penalty", "-1"},
      {"repeat_last_n", "-2"},
      {"max_tokens", "0"},
      {"max_tokens", "-5"},
      {"max_tokens", "10.5"},
      {"max_tokens", "\"10\""},
      {"max_tokens", "18446744073709551615"},
      {"max_completion_tokens", "0"},
      {"logprobs", "1"},
      {"top_logprobs", "21"},
      {"top_logprobs", "-1"},
  };
  for (const RangeCase& c : cases) {
    std::string extra = std::string("\"") + c.field + "\":" + c.value;
    if (std::string(c.field) == "top_logprobs") extra += ",\"logprobs\":true";
    ApiError e = chat_error(chat_body(extra));
    EXPECT_EQ(e.param, c.field) << extra;
    EXPECT_NE(e.message.find(std::string("'") + c.field + "' must be"), std::string::npos) << e.message;
  }
  EXPECT_EQ(chat_error(chat_body(R"("temperature":3)")).message,
            "'temperature' must be a number between 0 and 2");
  // Out of double range: nlohmann rejects it while parsing.
  EXPECT_NE(chat_error(chat_body(R"("temperature":1e999)")).message.find("invalid JSON"), std::string::npos);
}

TEST(ApiGenerationParams, BoundaryValuesAreAccepted) {
  auto r =
      chat_ok(chat_body(R"("temperature":2,"top_p":1,"min_p":0,"presence_penalty":-2,"frequency_penalty":2,)"
                        R"("top_k":0,"max_tokens":1,"top_logprobs":0)"));
  EXPECT_EQ(r.params.sampling.temperature, 2.0f);
  EXPECT_EQ(r.params.sampling.top_k, 0);
  EXPECT_EQ(r.params.max_tokens, 1);
}

TEST(ApiGenerationParams, ChatTopLogprobsNeedsLogprobs) {
  ApiError e = chat_error(chat_body(R"("top_logprobs":3)"));
  EXPECT_EQ(e.param, "top_logprobs");
  EXPECT_EQ(e.message, "'top_logprobs' requires 'logprobs' to be true");
}

// ---- completions ----------------------------------------------------------------

TEST(ApiCompletionRequest, PromptShapes) {
  auto text = parse_completion_request(R"({"model":"m","prompt":"Once upon"})");
  ASSERT_TRUE(text.ok()) << text.error.message;
  EXPECT_EQ(text.value->model, "m");
  EXPECT_EQ(text.value->prompt_text, "Once upon");
  EXPECT_FALSE(text.value->prompt_is_tokens);

  auto one = parse_completion_request(R"({"prompt":["Once"]})");
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one.value->prompt_text, "Once");

  auto tokens = parse_completion_request(R"({"prompt":[1,2,3]})");
  ASSERT_TRUE(tokens.ok());
  EXPECT_TRUE(tokens.value->prompt_is_tokens);
  EXPECT_EQ(tokens.value->prompt_tokens, (std::vector<int32_t>{1, 2, 3}));

  auto nested = parse_completion_request(R"({"prompt":[[4,5]]})");
  ASSERT_TRUE(nested.ok());
  EXPECT_EQ(nested.value->prompt_tokens, (std::vector<int32_t>{4, 5}));
}

TEST(ApiCompletionRequest, BadPrompts) {
  EXPECT_EQ(completion_error("{}").message, "'prompt' is required");
  EXPECT_EQ(completion_error(R"({"prompt":null})").param, "prompt");
  EXPECT_EQ(completion_error(R"({"prompt":["a","b"]})").message, "only one prompt per request is supported");
  EXPECT_EQ(completion_error(R"({"prompt":[[1],[2]]})").message, "only one prompt per request is supported");
  EXPECT_EQ(completion_error(R"({"prompt":""})").message, "'prompt' must not be empty");
  EXPECT_EQ(completion_error(R"({"prompt":[]})").message, "'prompt' must not be empty");
  EXPECT_EQ(completion_error(R"({"prompt":[[]]})").message, "'prompt' must not be empty");
  EXPECT_EQ(completion_error(R"({"prompt":[""]})").message, "'prompt' must not be empty");
  for (const char* bad : {R"({"prompt":5})", R"({"prompt":{}})", R"({"prompt":[1,"a"]})",
                          R"({"prompt":[-1]})", R"({"prompt":[1.5]})", R"({"prompt":[2147483648]})",
                          R"({"prompt":[true]})", R"({"prompt":[null]})", R"({"prompt":[[1,"x"]]})"}) {
    EXPECT_EQ(completion_error(bad).param, "prompt") << bad;
  }
}

TEST(ApiCompletionRequest, FlagsAndLogprobsCount) {
  auto r = parse_completion_request(
      R"({"prompt":"x","echo":true,"stream":true,"stream_options":{"include_usage":true},"logprobs":3,"max_tokens":16})");
  ASSERT_TRUE(r.ok()) << r.error.message;
  EXPECT_TRUE(r.value->echo);
  EXPECT_TRUE(r.value->stream);
  EXPECT_TRUE(r.value->include_usage);
  EXPECT_TRUE(r.value->params.logprobs);
  EXPECT_EQ(r.value->params.top_logprobs, 3);
  EXPECT_EQ(r.value->params.max_tokens, 16);

  auto zero = parse_completion_request(R"({"prompt":"x","logprobs":0})");
  ASSERT_TRUE(zero.ok());
  EXPECT_TRUE(zero.value->params.logprobs);
  EXPECT_EQ(zero.value->params.top_logprobs, 0);

  EXPECT_EQ(completion_error(R"({"prompt":"x","logprobs":21})").param, "logprobs");
  EXPECT_EQ(completion_error(R"({"prompt":"x","logprobs":"3"})").param, "logprobs");
  EXPECT_EQ(completion_error(R"({"prompt":"x","echo":1})").param, "echo");
  EXPECT_EQ(completion_error(R"({"prompt":"x","temperature":-1})").param, "temperature");
}

// ---- tokenize / detokenize ------------------------------------------------------

TEST(ApiTokenizeRequest, Parses) {
  auto r = parse_tokenize_request(R"({"content":"hello","add_special":true,"with_pieces":true})");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value->content, "hello");
  EXPECT_TRUE(r.value->add_special);
  EXPECT_TRUE(r.value->with_pieces);
  auto plain = parse_tokenize_request(R"({"content":""})");
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain.value->add_special);
  EXPECT_EQ(parse_tokenize_request("{}").error.param, "content");
  EXPECT_EQ(parse_tokenize_request(R"({"content":1})").error.param, "content");
  EXPECT_EQ(parse_tokenize_request(R"({"content":"x","add_special":"yes"})").error.param, "add_special");
}

TEST(ApiDetokenizeRequest, Parses) {
  auto r = parse_detokenize_request(R"({"tokens":[1,2,151643]})");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value->tokens, (std::vector<int32_t>{1, 2, 151643}));
  auto empty = parse_detokenize_request("{}");
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty.value->tokens.empty());
  EXPECT_EQ(parse_detokenize_request(R"({"tokens":"1"})").error.param, "tokens");
  EXPECT_EQ(parse_detokenize_request(R"({"tokens":[1,-2]})").error.param, "tokens");
  EXPECT_EQ(parse_detokenize_request(R"({"tokens":[1,"a"]})").error.param, "tokens");
}

// ---- robustness --------------------------------------------------------------------

TEST(ApiRequestRobustness, GarbageNeverThrows) {
  const std::string samples[] = {
      R"({"messages":[{"role":"user","content":"x"}],"temperature":{"a":[1,{"b":null}]}})",
      R"({"messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"{\"a\":"}}]}]})",
      R"({"prompt":[[[[1]]]]})",
      "{\"messages\":[{\"role\":\"user\",\"content\":\"\\ud800\"}]}",
      std::string("{\"a\":1}\0garbage", 15),
      "{\"messages\": 1e99999}",
      "   {\"messages\":[{\"role\":\"user\",\"content\":\"ok\"}]}   ",
  };
  for (const std::string& body : samples) {
    EXPECT_NO_THROW({
      parse_chat_completion_request(body);
      parse_completion_request(body);
      parse_tokenize_request(body);
      parse_detokenize_request(body);
    }) << body;
  }
}

}  // namespace
}  // namespace moeserve::server::api
