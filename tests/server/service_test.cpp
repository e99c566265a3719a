// ApiService end to end without sockets: the trained tiny model behind a
// BatchEngine, requests in, OpenAI-shaped replies out.
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <nlohmann/json.hpp>

#include "runtime/grammar/gbnf.h"
#include "runtime/grammar/matcher.h"
#include "runtime/json_prefix.h"
#include "server/api/json_schema_grammar.h"
#include "server/api_service.h"
#include "service_fixture.h"

namespace moeserve::server {
namespace {

using nlohmann::json;
using namespace service_test;  // the fixture

// An allocation failure while handling a request (injected) fails that
// request with 503; the next one is served normally.
TEST(ApiService, AllocationFailureIsA503AndTheServerGoesOn) {
  int calls = 0;
  Fixture f({}, {},
            [&calls](const std::string& path) { return path == "/v1/chat/completions" && calls++ == 0; });
  const ApiReply failed = f.post("/v1/chat/completions", kChat);
  EXPECT_EQ(failed.status, 503) << failed.body;
  EXPECT_NE(failed.body.find("out of memory"), std::string::npos) << failed.body;
  const ApiReply ok = f.post("/v1/chat/completions", kChat);
  EXPECT_EQ(ok.status, 200) << ok.body;
}

// The same inside the engine's step: the step's request ends with 503, the
// engine keeps running and the next request is answered.
TEST(ApiService, AllocationFailureInAnEngineStepIsA503AndTheEngineGoesOn) {
  std::atomic<int> steps{0};
  runtime::EngineOptions eo;
  eo.inject_step_allocation_failure = [&steps] { return steps.fetch_add(1) == 1; };  // the second step
  Fixture f(eo);
  const ApiReply failed = f.post("/v1/chat/completions", kChat);
  EXPECT_EQ(failed.status, 503) << failed.body;
  const ApiReply ok = f.post("/v1/chat/completions", kChat);
  EXPECT_EQ(ok.status, 200) << ok.body;
}

TEST(ApiService, ChatPlainAndStreamedGiveTheSameGreedyText) {
  Fixture f;
  const ApiReply plain = f.post("/v1/chat/completions", kChat);
  ASSERT_EQ(plain.status, 200) << plain.body;
  const json p = json::parse(plain.body);
  EXPECT_EQ(p["object"], "chat.completion");
  EXPECT_EQ(p["model"], "tiny");
  const std::string content = p["choices"][0]["message"]["content"];
  EXPECT_FALSE(content.empty());
  EXPECT_EQ(p["usage"]["completion_tokens"], 24);
  EXPECT_EQ(p["choices"][0]["finish_reason"], "length");

  json req = json::parse(kChat);
  req["stream"] = true;
  req["stream_options"] = {{"include_usage", true}};
  const ApiReply s = f.post("/v1/chat/completions", req.dump());
  ASSERT_EQ(s.status, 200);
  ASSERT_TRUE(s.stream);
  EXPECT_EQ(s.content_type, "text/event-stream");
  const std::vector<json> ev = sse_events(drain(s));
  std::string streamed;
  std::string finish;
  for (const json& e : ev) {
    if (e.contains("usage") && e["choices"].empty()) {
      EXPECT_EQ(e["usage"]["completion_tokens"], 24);
      EXPECT_GT(e["usage"]["prompt_tokens_details"]["cached_tokens"], 0);  // the same prompt ran just before
      continue;
    }
    const json& c = e["choices"][0];
    if (c["delta"].contains("content")) streamed += c["delta"]["content"].get<std::string>();
    if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
  }
  EXPECT_EQ(streamed, content);
  EXPECT_EQ(finish, "length");
}

// response_format json_object / json_schema: the answer is JSON whatever
// the (tiny, untrained-for-JSON) model would say; it stops at the closing
// brace, or is a JSON prefix when max_tokens cut it.
TEST(ApiService, JsonResponseFormatConstrainsTheAnswer) {
  Fixture f;
  int complete = 0;
  for (const char* format :
       {R"({"type": "json_object"})",
        R"({"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}})"}) {
    for (double temperature : {0.0, 0.9}) {
      json req = json::parse(kChat);
      req["response_format"] = json::parse(format);
      req["max_tokens"] = 96;
      req["temperature"] = temperature;
      req["seed"] = 5;
      const ApiReply r = f.post("/v1/chat/completions", req.dump());
      ASSERT_EQ(r.status, 200) << r.body;
      const json body = json::parse(r.body);
      const std::string content = body["choices"][0]["message"]["content"];
      runtime::JsonPrefix prefix;
      ASSERT_TRUE(prefix.feed_all(content)) << "not JSON: " << content;
      ASSERT_FALSE(content.empty());
      EXPECT_EQ(content.front(), '{') << content;
      if (body["choices"][0]["finish_reason"] == "stop") {
        ++complete;
        EXPECT_TRUE(prefix.complete()) << content;
        EXPECT_TRUE(json::parse(content).is_object()) << content;
      }
    }
  }
  // Plain text stays unconstrained, and a bad format is a 400 naming it.
  json bad = json::parse(kChat);
  bad["response_format"] = {{"type", "yaml"}};
  const ApiReply r = f.post("/v1/chat/completions", bad.dump());
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(json::parse(r.body)["error"]["param"], "response_format.type");
  RecordProperty("complete_json_answers", complete);
}

// A json_schema is followed to the letter (required keys, their types, an
// enum, bounds), a GBNF grammar too, on chat and on Responses; what cannot
// be guaranteed or parsed is a 400 that says which field and why.
TEST(ApiService, StructuredOutputFollowsTheSchemaAndTheGrammar) {
  Fixture f;
  const json schema =
      json::parse(R"({"type": "object", "additionalProperties": false, "required": ["city", "rank", "tags"],
      "properties": {"city": {"type": "string", "maxLength": 12}, "rank": {"type": "integer"},
                     "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}}})");
  auto gbnf = api::json_schema_to_gbnf(nlohmann::ordered_json::parse(schema.dump()));
  ASSERT_TRUE(gbnf.is_ok());
  auto grammar = runtime::grammar::parse_gbnf(*gbnf);
  ASSERT_TRUE(grammar.is_ok());
  int complete = 0;
  for (double temperature : {0.0, 0.9, 1.5}) {
    json req = json::parse(kChat);
    req["response_format"] = {{"type", "json_schema"},
                              {"json_schema", {{"name", "place"}, {"schema", schema}}}};
    req["max_tokens"] = 120;
    req["temperature"] = temperature;
    req["seed"] = 7;
    const ApiReply r = f.post("/v1/chat/completions", req.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    const json body = json::parse(r.body);
    const std::string content = body["choices"][0]["message"]["content"];
    runtime::grammar::GrammarState state(*grammar);
    ASSERT_TRUE(state.feed_all(content)) << "outside the schema: " << content;
    if (body["choices"][0]["finish_reason"] != "stop") continue;
    ++complete;
    ASSERT_TRUE(state.complete()) << content;
    const json doc = json::parse(content);
    EXPECT_TRUE(doc["city"].is_string() && doc["city"].get<std::string>().size() <= 12) << content;
    EXPECT_TRUE(doc["rank"].is_number_integer()) << content;
    EXPECT_TRUE(doc["tags"].is_array() && doc["tags"].size() <= 2) << content;
    EXPECT_EQ(doc.size(), 3u) << content;
  }
  RecordProperty("complete_schema_answers", complete);
  // A GBNF grammar, on chat and on Responses.
  json yes_no = json::parse(kChat);
  yes_no["grammar"] = R"(root ::= "yes" | "no" # the whole answer)";
  const ApiReply a = f.post("/v1/chat/completions", yes_no.dump());
  ASSERT_EQ(a.status, 200) << a.body;
  const json ab = json::parse(a.body);
  const std::string answer = ab["choices"][0]["message"]["content"];
  EXPECT_TRUE(answer == "yes" || answer == "no") << answer;
  EXPECT_EQ(ab["choices"][0]["finish_reason"], "stop");
  const ApiReply resp = f.post(
      "/v1/responses", R"({"model": "tiny", "input": "Say something.", "grammar": "root ::= [0-9]{3}"})");
  ASSERT_EQ(resp.status, 200) << resp.body;
  const std::string digits = json::parse(resp.body)["output"][0]["content"][0]["text"];
  EXPECT_EQ(digits.size(), 3u) << digits;
  EXPECT_TRUE(std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      << digits;
  // Errors name the field.
  const std::pair<std::string, std::pair<std::string, std::string>> bad[] = {
      {R"J("grammar": "root ::= \"a")J", {"grammar", "grammar line 1"}},
      {R"J("grammar": "start ::= \"a\"")J", {"grammar", "root"}},
      {R"J("grammar": 7)J", {"grammar", "must be a string"}},
      {R"J("response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "a+"}}})J",
       {"response_format.json_schema.schema", "unsupported keyword 'pattern'"}},
      {R"J("response_format": {"type": "json_object"}, "grammar": "root ::= \"{}\"")J",
       {"grammar", "not both"}},
  };
  for (const auto& [field, want] : bad) {
    std::string body = kChat;
    body.insert(body.rfind('}'), ", " + field);
    const ApiReply r = f.post("/v1/chat/completions", body);
    ASSERT_EQ(r.status, 400) << field << ": " << r.body;
    const json e = json::parse(r.body)["error"];
    EXPECT_EQ(e["param"].get<std::string>(), want.first) << r.body;
    EXPECT_NE(e["message"].get<std::string>().find(want.second), std::string::npos) << r.body;
  }
}

// /v1/messages answers what /v1/chat/completions answers for the same
// conversation, reports a matched stop sequence, and errs in Anthropic's shape.
TEST(ApiService, AnthropicMessagesMatchChatAndReportTheStopSequence) {
  Fixture f;
  const ApiReply chat = f.post("/v1/chat/completions", kChat);
  ASSERT_EQ(chat.status, 200) << chat.body;
  const std::string content = json::parse(chat.body)["choices"][0]["message"]["content"];
  ASSERT_GT(content.size(), 12u);
  json req = {{"model", "claude-anything"},
              {"max_tokens", 24},
              {"temperature", 0},
              {"system", "You write Python."},
              {"messages", {{{"role", "user"}, {"content", "Write a function"}}}}};
  const ApiReply plain = f.post("/v1/messages", req.dump());
  ASSERT_EQ(plain.status, 200) << plain.body;
  const json m = json::parse(plain.body);
  EXPECT_EQ(m["type"], "message");
  EXPECT_EQ(m["model"], "tiny");
  std::string text;
  for (const json& b : m["content"]) {
    if (b["type"] == "text") text += b["text"].get<std::string>();
  }
  EXPECT_EQ(text, content);
  EXPECT_EQ(m["stop_reason"], "max_tokens");

  const std::string stop = content.substr(8, 4);
  ASSERT_GT(content.find(stop), 0u) << "a stop sequence with text before it";
  req["stop_sequences"] = {stop};
  const json cut = json::parse(f.post("/v1/messages", req.dump()).body);
  ASSERT_EQ(cut["content"].size(), 1u) << cut.dump();
  EXPECT_EQ(cut["stop_reason"], "stop_sequence");
  EXPECT_EQ(cut["stop_sequence"], stop);
  EXPECT_EQ(cut["content"][0]["text"], content.substr(0, content.find(stop)));

  req.erase("max_tokens");
  const ApiReply bad = f.post("/v1/messages", req.dump());
  EXPECT_EQ(bad.status, 400);
  const json e = json::parse(bad.body);
  EXPECT_EQ(e["type"], "error");
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
}

// serve --chat-template: the given template replaces the model file's.
TEST(ApiService, ChatTemplateOverrideIsUsed) {
  Fixture f;
  const std::string count_body = R"({"messages": [{"role": "user", "content": "hi"}]})";
  const ApiReply own = f.post("/v1/messages/count_tokens", count_body);
  ASSERT_EQ(own.status, 200) << own.body;
  ServiceConfig c;
  c.model_id = "tiny";
  c.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}";
  ApiService custom(*f.model, *f.engine, c);
  const ApiReply r = custom.handle({"POST", "/v1/messages/count_tokens", count_body, "", {}, {}});
  ASSERT_EQ(r.status, 200) << r.body;
  const int64_t n_custom = json::parse(r.body)["input_tokens"], n_own = json::parse(own.body)["input_tokens"];
  EXPECT_EQ(n_custom, int64_t(f.model->tokenizer().encode("hi").size()));
  EXPECT_LT(n_custom, n_own) << "the model's template wraps the turn in control tokens";
}

TEST(ApiService, CompletionsWithTokenPromptEchoAndLogprobs) {
  Fixture f;
  const std::vector<int32_t> ids = f.model->tokenizer().encode("def main(");
  json req = {{"prompt", ids}, {"max_tokens", 5}, {"temperature", 0}, {"echo", true}, {"logprobs", 2}};
  const ApiReply r = f.post("/v1/completions", req.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = json::parse(r.body);
  const std::string text = j["choices"][0]["text"];
  EXPECT_EQ(text.rfind("def main(", 0), 0u) << text;
  const json& lp = j["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 5u);
  ASSERT_EQ(lp["top_logprobs"][0].size(), 2u);
  EXPECT_LE(lp["token_logprobs"][0].get<double>(), 0.0);
}

TEST(ApiService, ErrorsAreOpenAiShapedWithTheRightStatus) {
  runtime::EngineOptions eo;
  eo.n_ctx = 64;
  Fixture f(eo);
  auto expect = [&](const ApiReply& r, int status, const std::string& param = {}) {
    EXPECT_EQ(r.status, status) << r.body;
    const json j = json::parse(r.body);
    ASSERT_TRUE(j.contains("error")) << r.body;
    EXPECT_TRUE(j["error"]["message"].is_string());
    if (!param.empty()) {
      EXPECT_EQ(j["error"]["param"], param) << r.body;
    }
  };
  expect(f.post("/v1/chat/completions", "{not json"), 400);
  expect(f.post("/v1/chat/completions", R"({"messages":"hi"})"), 400, "messages");
  expect(f.post("/v1/chat/completions", R"({"model":"tiny"})"), 400, "messages");
  expect(
      f.post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"temperature":"hot"})"),
      400, "temperature");
  expect(f.post("/v1/chat/completions", R"({"model":"gpt-9","messages":[{"role":"user","content":"x"}]})"),
         404);
  expect(
      f.post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"max_tokens":100000})"),
      400, "max_tokens");
  const std::string long_prompt(2000, 'a');
  expect(f.post("/v1/completions", json{{"prompt", long_prompt}}.dump()), 400);
  expect(f.get("/v2/nothing"), 404);
  // Nothing above disturbed the engine: a normal request still works.
  EXPECT_EQ(f.post("/v1/completions", R"({"prompt":"x = ","max_tokens":3})").status, 200);
}

TEST(ApiService, ApiKeyGuardsEverythingButHealthAndThePage) {
  Fixture f({}, "sekret");
  EXPECT_EQ(f.get("/v1/models").status, 401);
  EXPECT_EQ(f.get("/v1/models", "Bearer wrong").status, 401);
  EXPECT_EQ(f.get("/v1/models", "Bearer sekret").status, 200);
  EXPECT_EQ(f.get("/health").status, 200);
  EXPECT_EQ(f.get("/").status, 200);
  EXPECT_EQ(f.post("/v1/completions", R"({"prompt":"x"})").status, 401);
}

TEST(ApiService, FullQueueIs429AndCancelledStreamFreesTheSlot) {
  runtime::EngineOptions eo;
  eo.n_slots = 1;
  eo.max_queue = 0;
  Fixture f(eo);
  const std::string long_stream = R"({"prompt":"import os","max_tokens":200,"stream":true})";
  const ApiReply a = f.post("/v1/completions", long_stream);
  ASSERT_EQ(a.status, 200);
  // Wait until it holds the slot, then a second request has nowhere to go.
  std::string first;
  ASSERT_TRUE(a.stream->next(first, std::chrono::seconds(10)));
  const ApiReply b = f.post("/v1/completions", R"({"prompt":"x","max_tokens":2})");
  EXPECT_EQ(b.status, 429) << b.body;
  // The client goes away: the slot frees and new work runs.
  a.cancel();
  drain(a);
  const ApiReply c = f.post("/v1/completions", R"({"prompt":"x","max_tokens":2})");
  EXPECT_EQ(c.status, 200) << c.body;
  EXPECT_EQ(f.engine->stats().active_slots, 0);
}

TEST(ApiService, TokenizeDetokenizeModelsAndMetrics) {
  Fixture f;
  const ApiReply t = f.post("/tokenize", R"({"content":"def main():"})");
  ASSERT_EQ(t.status, 200);
  const json ids = json::parse(t.body)["tokens"];
  ASSERT_FALSE(ids.empty());
  const ApiReply d = f.post("/detokenize", json{{"tokens", ids}}.dump());
  ASSERT_EQ(d.status, 200);
  EXPECT_EQ(json::parse(d.body)["content"], "def main():");
  EXPECT_EQ(f.post("/detokenize", R"({"tokens":[99999999]})").status, 400);
  const json m = json::parse(f.get("/v1/models").body);
  EXPECT_EQ(m["data"][0]["id"], "tiny");
  f.post("/v1/completions", R"({"prompt":"x = ","max_tokens":3})");
  const std::string metrics = f.get("/metrics").body;
  EXPECT_NE(metrics.find("moeserve_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 1"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("moeserve_generated_tokens_total 3"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("moeserve_slots_total"), std::string::npos);
}

// The live statistics count prompt chunks and decode rows apart, as
// calibrate does: per layer, n_expert_used selections per prompt token
// computed and per decode row (every completion token but the last is fed
// back as one). Runs on the CPU too (its device takes splits).
TEST(ApiService, ExpertStatsCountPrefillAndDecodeApart) {
  const std::vector<int32_t> some = {0, 1, 2, 3, 4, 5, 6, 7};
  runtime::EngineOptions eo;
  eo.prefix_cache_bytes = 0;  // every prompt token computed
  Fixture f(eo, {}, {}, {some, {}, some, some}, true);
  int64_t prompt = 0, decoded = 0;
  for (int i = 0; i < 2; ++i) {
    const ApiReply r = f.post("/v1/chat/completions", kChat);
    ASSERT_EQ(r.status, 200) << r.body;
    const json usage = json::parse(r.body)["usage"];
    prompt += usage["prompt_tokens"].get<int64_t>();
    decoded += usage["completion_tokens"].get<int64_t>() - 1;
  }
  const json j = json::parse(f.get("/stats/experts").body);
  ASSERT_TRUE(j["experts_split"].get<bool>());
  for (const json& l : j["layers"]) {
    SCOPED_TRACE(l.dump());
    if (l["gpu_experts"].get<int64_t>() == 16) continue;  // all local: not counted
    int64_t all = 0, pre = 0, dec = 0;
    for (size_t e = 0; e < l["selections"].size(); ++e) {
      all += l["selections"][e].get<int64_t>();
      pre += l["selections_prefill"][e].get<int64_t>();
      dec += l["selections_decode"][e].get<int64_t>();
    }
    EXPECT_EQ(pre, 4 * prompt);
    EXPECT_EQ(dec, 4 * decoded);
    EXPECT_EQ(all, pre + dec);
    const double hit = l["decode_hot_hit_ratio"].get<double>();
    EXPECT_GE(hit, 0.0);
    EXPECT_LE(hit, 1.0);
  }
  EXPECT_NE(f.get("/metrics").body.find("moeserve_expert_decode_hot_hit_ratio{layer=\"1\"} 0\n"),
            std::string::npos);
}

// GET /stats/experts: on a model with every expert on its device, a note;
// with experts shared between the GPU and the CPU (the GPU machine), each
// split layer's selections add up to what the requests routed, and
// /metrics carries the per-layer hot-hit ratio.
TEST(ApiService, ExpertStatsEndpoint) {
  {
    Fixture f;
    const ApiReply r = f.get("/stats/experts");
    ASSERT_EQ(r.status, 200);
    const json j = json::parse(r.body);
    EXPECT_FALSE(j["experts_split"].get<bool>());
    EXPECT_TRUE(j.contains("note"));
  }
  if (testing::test_device().rfind("cuda", 0) != 0)
    GTEST_SKIP() << "the split half needs MOESERVE_TEST_DEVICE=cuda";
  const std::vector<int32_t> some = {0, 1, 2, 3, 4, 5, 6, 7};
  runtime::EngineOptions eo;
  eo.promotion.every_tokens = 8;  // promotion between steps must not change an answer
  Fixture f(eo, {}, {}, {some, {}, some, some}, true);
  const ApiReply first = f.post("/v1/chat/completions", kChat);
  ASSERT_EQ(first.status, 200);
  const ApiReply again = f.post("/v1/chat/completions", kChat);
  EXPECT_EQ(json::parse(again.body)["choices"][0]["message"]["content"],
            json::parse(first.body)["choices"][0]["message"]["content"]);
  const json j = json::parse(f.get("/stats/experts").body);
  ASSERT_TRUE(j["experts_split"].get<bool>());
  ASSERT_EQ(j["layers"].size(), 4u);
  for (const json& l : j["layers"]) {
    int64_t sum = 0;
    for (const json& c : l["selections"]) sum += c.get<int64_t>();
    EXPECT_GT(sum, 0);
    EXPECT_EQ(sum, l["selections_gpu"].get<int64_t>() + l["selections_cpu"].get<int64_t>());
    EXPECT_EQ(sum % 4, 0);  // n_expert_used 4 a token
  }
  EXPECT_EQ(j["layers"][1]["selections_gpu"].get<int64_t>(),
            0);  // no expert of layer 1 on the GPU (none to promote into)
  const std::string metrics = f.get("/metrics").body;
  EXPECT_NE(metrics.find("moeserve_expert_hot_hit_ratio{layer=\"1\"} 0"), std::string::npos) << metrics;
}

}  // namespace
}  // namespace moeserve::server
