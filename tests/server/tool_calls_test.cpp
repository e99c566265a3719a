// Tool calls held to their schemas (strict tools, required calls): the GBNF
// that tool_call_gbnf writes, and the trained tiny model's calls through the
// three APIs.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "runtime/grammar/gbnf.h"
#include "runtime/grammar/matcher.h"
#include "server/api/tool_call_grammar.h"
#include "service_fixture.h"

namespace moeserve::server {
namespace {

using nlohmann::json;
using ojson = nlohmann::ordered_json;
using namespace service_test;  // the fixture

const char* const kWeatherSchema = R"({"type": "object", "additionalProperties": false,
    "required": ["city", "unit"],
    "properties": {"city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["c", "f"]},
                   "days": {"type": "integer"}}})";

ojson tools(bool strict) {
  ojson weather = {
      {"type", "function"},
      {"function",
       {{"name", "get_weather"}, {"parameters", ojson::parse(kWeatherSchema)}, {"strict", strict}}}};
  ojson time = {{"type", "function"}, {"function", {{"name", "get_time"}}}};
  return ojson::array({weather, time});
}

bool matches(const std::string& gbnf, const std::string& text) {
  auto g = runtime::grammar::parse_gbnf(gbnf);
  EXPECT_TRUE(g.is_ok()) << g.status().to_string() << "\n" << gbnf;
  if (!g.is_ok()) return false;
  runtime::grammar::GrammarState st(*g);
  return st.feed_all(text) && st.complete();
}

TEST(ToolCallGrammar, AStrictToolsArgumentsFollowItsSchema) {
  auto g = api::tool_call_gbnf(tools(true), "auto");
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  EXPECT_FALSE(g->required);
  // What follows "<tool_call>", as the Qwen3 templates write it.
  EXPECT_TRUE(matches(
      g->gbnf,
      "\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"unit\": \"c\"}}\n</tool_call>"));
  EXPECT_TRUE(matches(
      g->gbnf,
      "{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\",\"unit\":\"f\",\"days\":3}}</tool_call>"));
  EXPECT_FALSE(
      matches(g->gbnf, "\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>"));
  EXPECT_FALSE(matches(
      g->gbnf,
      "\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"unit\": \"k\"}}\n</tool_call>"));
  EXPECT_FALSE(matches(g->gbnf,
                       "\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Llanfairpwll\", \"unit\": "
                       "\"c\"}}\n</tool_call>"));
  EXPECT_FALSE(matches(g->gbnf, "\n{\"name\": \"other\", \"arguments\": {}}\n</tool_call>"));
  // The tool that is not strict takes any object.
  EXPECT_TRUE(matches(
      g->gbnf, "\n{\"name\": \"get_time\", \"arguments\": {\"zone\": [1, {\"a\": null}]}}\n</tool_call>"));
  EXPECT_FALSE(matches(g->gbnf, "\n{\"name\": \"get_time\", \"arguments\": 5}\n</tool_call>"));
}

TEST(ToolCallGrammar, NothingIsConstrainedWithoutAStrictToolOrARequiredCall) {
  for (const char* choice : {"auto", "none"}) {
    auto g = api::tool_call_gbnf(tools(false), choice);
    ASSERT_TRUE(g.is_ok());
    EXPECT_TRUE(g->gbnf.empty()) << choice;
  }
  auto none = api::tool_call_gbnf(tools(true), "none");
  ASSERT_TRUE(none.is_ok());
  EXPECT_TRUE(none->gbnf.empty());
}

TEST(ToolCallGrammar, ARequiredOrNamedCallIsTheWholeAnswer) {
  auto required = api::tool_call_gbnf(tools(false), "required");
  ASSERT_TRUE(required.is_ok());
  EXPECT_TRUE(required->required);
  const std::string call = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
  EXPECT_TRUE(matches(required->gbnf, call));
  EXPECT_TRUE(matches(required->gbnf, "\n" + call + "\n" + call));
  EXPECT_FALSE(matches(required->gbnf, "Sure. " + call));
  EXPECT_FALSE(matches(required->gbnf, ""));
  auto named = api::tool_call_gbnf(tools(true), "get_weather");
  ASSERT_TRUE(named.is_ok());
  EXPECT_FALSE(matches(named->gbnf, call));  // only the named function
  EXPECT_TRUE(matches(named->gbnf,
                      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\", "
                      "\"unit\": \"c\"}}\n</tool_call>"));
  EXPECT_FALSE(matches(named->gbnf,
                       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\", "
                       "\"unit\": \"c\"}}\n</tool_call><tool_call>\n{\"name\": \"get_weather\", "
                       "\"arguments\": {\"city\": \"Rome\", \"unit\": \"c\"}}\n</tool_call>"));
}

TEST(ToolCallGrammar, AStrictSchemaThatCannotBeGuaranteedIsRefusedByName) {
  ojson t = tools(true);
  t[0]["function"]["parameters"]["properties"]["city"]["pattern"] = "^[A-Z]";
  auto g = api::tool_call_gbnf(t, "auto");
  ASSERT_FALSE(g.is_ok());
  EXPECT_NE(g.status().message().find(
                "unsupported keyword 'pattern' at tools[0].function.parameters.properties.city"),
            std::string::npos)
      << g.status().message();
  // The same schema on a tool that is not strict is not the grammar's business.
  t[0]["function"]["strict"] = false;
  EXPECT_TRUE(api::tool_call_gbnf(t, "required").is_ok());
}

// Tool definitions make long prompts: a context that holds them.
runtime::EngineOptions long_context() {
  runtime::EngineOptions eo;
  eo.n_ctx = 1024;
  return eo;
}

// The tiny model's calls through chat completions: each one parses and
// follows the schema, at every temperature.
TEST(ApiService, StrictToolCallsFollowTheirSchemas) {
  Fixture f(long_context());
  int complete = 0;
  for (const char* choice : {"required", "get_weather"}) {
    for (double temperature : {0.0, 1.0, 1.5}) {
      json req = json::parse(kChat);
      req["messages"][1]["content"] = "What is the weather in Oslo?";
      req["tools"] = json::parse(tools(true).dump());
      req["tool_choice"] = std::string(choice) == "required"
                               ? json("required")
                               : json{{"type", "function"}, {"function", {{"name", choice}}}};
      req["enable_thinking"] = false;
      req["max_tokens"] = 320;
      req["temperature"] = temperature;
      req["seed"] = 3;
      const ApiReply r = f.post("/v1/chat/completions", req.dump());
      ASSERT_EQ(r.status, 200) << r.body;
      const json choice0 = json::parse(r.body)["choices"][0];
      if (choice0["finish_reason"] == "length") continue;  // the tiny model ran on in whitespace
      ASSERT_EQ(choice0["finish_reason"], "tool_calls") << r.body;
      ++complete;
      for (const json& call : choice0["message"]["tool_calls"]) {
        const std::string name = call["function"]["name"];
        const json args = json::parse(call["function"]["arguments"].get<std::string>());
        ASSERT_TRUE(args.is_object()) << r.body;
        if (std::string(choice) != "required") {
          EXPECT_EQ(name, choice);
        }
        if (name != "get_weather") continue;
        EXPECT_TRUE(args["city"].is_string() && args["city"].get<std::string>().size() <= 10) << args;
        EXPECT_TRUE(args["unit"] == "c" || args["unit"] == "f") << args;
        for (const auto& [key, value] : args.items())
          EXPECT_TRUE(key == "city" || key == "unit" || key == "days") << args;
      }
    }
  }
  // The grammar leaves a call no way to run on: most answers are whole calls.
  EXPECT_GE(complete, 3);
}

TEST(ApiService, StrictToolsThroughResponsesAndMessages) {
  Fixture f(long_context());
  json responses = {{"model", "tiny"},  {"input", "Weather in Rome?"}, {"max_output_tokens", 320},
                    {"temperature", 0}, {"tool_choice", "required"},   {"parallel_tool_calls", false}};
  responses["tools"] = json::array({{{"type", "function"},
                                     {"name", "get_weather"},
                                     {"strict", true},
                                     {"parameters", json::parse(kWeatherSchema)}}});
  const ApiReply r = f.post("/v1/responses", responses.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json out = json::parse(r.body)["output"];
  bool called = false;
  for (const json& item : out) {
    if (item["type"] != "function_call") continue;
    called = true;
    const json args = json::parse(item["arguments"].get<std::string>());
    EXPECT_TRUE(args["unit"] == "c" || args["unit"] == "f") << args;
  }
  EXPECT_TRUE(called) << r.body;

  json messages = {{"model", "claude-x"},
                   {"max_tokens", 320},
                   {"temperature", 0},
                   {"messages", json::array({{{"role", "user"}, {"content", "Weather in Rome?"}}})},
                   {"tool_choice", {{"type", "any"}, {"disable_parallel_tool_use", true}}},
                   {"thinking", {{"type", "disabled"}}}};
  messages["tools"] = json::array(
      {{{"name", "get_weather"}, {"strict", true}, {"input_schema", json::parse(kWeatherSchema)}}});
  const ApiReply m = f.post("/v1/messages", messages.dump());
  ASSERT_EQ(m.status, 200) << m.body;
  const json reply = json::parse(m.body);
  ASSERT_EQ(reply["stop_reason"], "tool_use") << m.body;  // one call, then the answer must end
  int used = 0;
  for (const json& block : reply["content"]) {
    if (block["type"] != "tool_use") continue;
    ++used;
    EXPECT_TRUE(block["input"]["unit"] == "c" || block["input"]["unit"] == "f") << block;
  }
  EXPECT_EQ(used, 1) << m.body;
  // A strict schema the server cannot guarantee is a 400 naming it.
  json bad = json::parse(kChat);
  bad["tools"] = json::parse(tools(true).dump());
  bad["tools"][0]["function"]["parameters"]["properties"]["days"]["minimum"] = 1;
  const ApiReply e = f.post("/v1/chat/completions", bad.dump());
  ASSERT_EQ(e.status, 400) << e.body;
  EXPECT_NE(e.body.find("unsupported keyword 'minimum'"), std::string::npos) << e.body;
  EXPECT_EQ(json::parse(e.body)["error"]["param"], "tools");
}

}  // namespace
}  // namespace moeserve::server
