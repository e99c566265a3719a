// GenerationSession wiring, fed a scripted token stream (the tiny test
// models never write tool calls or <think> blocks on their own): reasoning
// and tool calls reach both the plain response and the stream.
#include "server/generation_session.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "runtime/model.h"

namespace moeserve::server {
namespace {

using nlohmann::json;

const tok::Tokenizer& tokenizer() {
  static std::unique_ptr<runtime::Model> model = std::move(
      runtime::Model::load(std::string(MOESERVE_TEST_DATA_DIR) + "/models/qwen3moe-tiny.bf16.gguf", {.n_threads = 1})
          .value());
  return model->tokenizer();
}

SessionConfig chat_config(bool stream) {
  SessionConfig c;
  c.endpoint = Endpoint::kChat;
  c.stream = stream;
  c.include_usage = true;
  c.meta = {"chatcmpl-test", "tiny", 1};
  c.parser.parse_tool_calls = true;
  c.parser.make_tool_call_id = api::counter_tool_call_ids();
  return c;
}

// The model's output in uneven pieces, as the engine would deliver them.
void feed(GenerationSession& s) {
  const char* pieces[] = {"<thi", "nk>\nThe user wants", " the weather.\n</think>\n\n", "<tool_",
                          "call>\n{\"name\": \"get_weather\", \"argu", "ments\": {\"city\": \"Paris\"}}\n</tool_call>"};
  int32_t id = 100;
  for (const char* p : pieces) {
    runtime::TokenEvent ev;
    ev.token = id++;
    ev.text = p;
    ASSERT_TRUE(s.on_token(ev));
  }
  runtime::RequestStats st;
  st.reason = runtime::StopReason::kEndOfSequence;
  st.prompt_tokens = 20;
  st.completion_tokens = 6;
  s.on_finish(Status::ok(), st);
}

TEST(GenerationSession, ToolCallAndReasoningInThePlainResponse) {
  GenerationSession s(chat_config(false), tokenizer());
  feed(s);
  ASSERT_TRUE(s.wait().status.is_ok());
  const json j = s.response_json();
  const json& choice = j["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_EQ(choice["message"]["reasoning_content"], "The user wants the weather.");
  EXPECT_TRUE(choice["message"]["content"].is_null()) << j.dump();
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u);
  const json& call = choice["message"]["tool_calls"][0];
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(call["function"]["arguments"].get<std::string>()), json({{"city", "Paris"}}));
  EXPECT_EQ(j["usage"]["completion_tokens"], 6);
}

TEST(GenerationSession, ToolCallAndReasoningInTheStream) {
  GenerationSession s(chat_config(true), tokenizer());
  feed(s);
  std::string body;
  while (s.next(body, std::chrono::milliseconds(10))) {
  }
  std::string reasoning, finish;
  json calls = json::array();
  bool usage = false, done = false;
  for (size_t pos = 0; (pos = body.find("data: ", pos)) != std::string::npos;) {
    const size_t end = body.find("\n\n", pos);
    const std::string payload = body.substr(pos + 6, end - pos - 6);
    pos = end;
    if (payload == "[DONE]") {
      done = true;
      continue;
    }
    const json e = json::parse(payload);
    if (e.contains("usage")) {
      usage = true;
      continue;
    }
    const json& c = e["choices"][0];
    if (c["delta"].contains("reasoning_content")) reasoning += c["delta"]["reasoning_content"].get<std::string>();
    if (c["delta"].contains("tool_calls")) {
      for (const json& t : c["delta"]["tool_calls"]) calls.push_back(t);
    }
    if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
  }
  EXPECT_TRUE(done);
  EXPECT_TRUE(usage);
  EXPECT_EQ(reasoning, "The user wants the weather.");
  EXPECT_EQ(finish, "tool_calls");
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0]["index"], 0);
  EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
}

TEST(GenerationSession, ClientGoneCancelsAtTheNextToken) {
  GenerationSession s(chat_config(true), tokenizer());
  runtime::TokenEvent ev;
  ev.text = "hello";
  EXPECT_TRUE(s.on_token(ev));
  s.client_gone();
  EXPECT_FALSE(s.on_token(ev));  // the engine cancels the request on false
}

}  // namespace
}  // namespace moeserve::server
