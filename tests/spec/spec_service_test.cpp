// Speculative decoding through the server's APIs: the "speculative"
// request field on the OpenAI, Anthropic and Responses endpoints gives the
// same greedy text as without, usage reports drafted and accepted tokens,
// /metrics carries the per-mode series, and bad values are 400s naming the
// field.
#include <gtest/gtest.h>

#include "server/service_fixture.h"
#include "spec/drafter_factory.h"

namespace moeserve::server::service_test {
namespace {

runtime::EngineOptions spec_engine(runtime::SpecMode default_mode) {
  runtime::EngineOptions eo;
  eo.make_drafter = spec::drafter_factory();
  eo.spec.mode = default_mode;
  eo.spec.ngram_min = 1;
  eo.prefix_cache_bytes = 0;
  return eo;
}

// A prompt whose answer tends to repeat what it read: drafts get verified.
const char* const kRepeat =
    R"({"model":"tiny","messages":[{"role":"user","content":"def add(a, b):\n    return a + b\n\ndef add(a, b):\n"}],
  "max_tokens":32,"temperature":0})";

TEST(SpeculativeApi, ChatIsIdenticalAndUsageReportsTheDrafts) {
  Fixture f(spec_engine(runtime::SpecMode::kNone));
  const ApiReply plain = f.post("/v1/chat/completions", kRepeat);
  ASSERT_EQ(plain.status, 200) << plain.body;
  const json p = json::parse(plain.body);
  EXPECT_FALSE(p["usage"].contains("speculative")) << "no speculation, no report";

  json req = json::parse(kRepeat);
  req["speculative"] = {{"mode", "ngram"}, {"max", 6}};
  const ApiReply spec = f.post("/v1/chat/completions", req.dump());
  ASSERT_EQ(spec.status, 200) << spec.body;
  const json s = json::parse(spec.body);
  EXPECT_EQ(s["choices"][0]["message"]["content"], p["choices"][0]["message"]["content"]);
  const json& u = s["usage"]["speculative"];
  ASSERT_TRUE(u.is_object()) << s["usage"].dump();
  EXPECT_EQ(u["mode"], "ngram");
  EXPECT_GT(u["draft_tokens"].get<int64_t>(), 0);
  EXPECT_GE(u["draft_tokens"].get<int64_t>(), u["accepted_draft_tokens"].get<int64_t>());

  // Streamed, with usage: the same text and the same report.
  req["stream"] = true;
  req["stream_options"] = {{"include_usage", true}};
  const ApiReply st = f.post("/v1/chat/completions", req.dump());
  ASSERT_EQ(st.status, 200);
  std::string text;
  bool reported = false;
  for (const json& e : sse_events(drain(st))) {
    if (e.contains("usage") && e["choices"].empty()) {
      reported = e["usage"].contains("speculative");
      continue;
    }
    const json& c = e["choices"][0];
    if (c["delta"].contains("content")) text += c["delta"]["content"].get<std::string>();
  }
  EXPECT_EQ(text, p["choices"][0]["message"]["content"].get<std::string>());
  EXPECT_TRUE(reported);

  const ApiReply m = f.get("/metrics");
  EXPECT_NE(m.body.find("moeserve_spec_draft_tokens_total{mode=\"ngram\"}"), std::string::npos);
  EXPECT_NE(m.body.find("moeserve_spec_acceptance_length{mode=\"ngram\"}"), std::string::npos);
  EXPECT_NE(m.body.find("moeserve_spec_verify_seconds_total{mode=\"ngram\"}"), std::string::npos);
}

TEST(SpeculativeApi, ServerDefaultAndTheOtherApis) {
  Fixture f(spec_engine(runtime::SpecMode::kNgram));
  // The server's --spec applies when the request says nothing; "none" turns it off.
  json req = json::parse(kRepeat);
  const json on = json::parse(f.post("/v1/chat/completions", req.dump()).body);
  EXPECT_EQ(on["usage"]["speculative"]["mode"], "ngram");
  req["speculative"] = {{"mode", "ngram"}, {"max", 4}, {"tree", 10}};
  const json tree = json::parse(f.post("/v1/chat/completions", req.dump()).body);
  EXPECT_EQ(tree["usage"]["speculative"]["mode"], "ngram");
  EXPECT_EQ(tree["choices"][0]["message"]["content"], on["choices"][0]["message"]["content"]);
  req["speculative"] = "none";
  const json off = json::parse(f.post("/v1/chat/completions", req.dump()).body);
  EXPECT_FALSE(off["usage"].contains("speculative"));
  EXPECT_EQ(on["choices"][0]["message"]["content"], off["choices"][0]["message"]["content"]);

  json anthropic = {{"model", "tiny"},
                    {"max_tokens", 24},
                    {"temperature", 0},
                    {"messages", {{{"role", "user"}, {"content", "def add(a, b):\n    return a + b\n"}}}},
                    {"speculative", {{"mode", "auto"}}}};
  const ApiReply a = f.post("/v1/messages", anthropic.dump());
  ASSERT_EQ(a.status, 200) << a.body;
  EXPECT_EQ(json::parse(a.body)["usage"]["speculative"]["mode"], "auto");

  json responses = {{"model", "tiny"},
                    {"max_output_tokens", 24},
                    {"temperature", 0},
                    {"input", "def add(a, b):\n    return a + b\n"},
                    {"speculative", {{"mode", "ngram"}, {"max", 3}}}};
  const ApiReply r = f.post("/v1/responses", responses.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["usage"]["speculative"]["mode"], "ngram");
}

TEST(SpeculativeApi, BadValuesAre400sNamingTheField) {
  Fixture f(spec_engine(runtime::SpecMode::kNone));
  for (const json& bad : {json{{"mode", "warp"}}, json{{"max", 0}}, json{{"max", 1000}}, json{{"tree", 64}},
                          json{{"mode", "dflash"}}, json{{"depth", 3}}, json(42), json("fast")}) {
    json req = json::parse(kRepeat);
    req["speculative"] = bad;
    const ApiReply r = f.post("/v1/chat/completions", req.dump());
    EXPECT_EQ(r.status, 400) << bad.dump() << " -> " << r.body;
    const json e = json::parse(r.body);
    EXPECT_NE(e["error"]["message"].get<std::string>(), "") << bad.dump();
  }
}

}  // namespace
}  // namespace moeserve::server::service_test
