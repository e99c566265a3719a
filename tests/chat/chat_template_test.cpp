// The high-level API on the real Qwen3 and Qwen3.5 templates (the fixtures of
// the reference test). Expected prompts are spelled out by hand from the
// models' documented chat formats; the reference test compares many more
// conversations against @huggingface/jinja.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "chat/chat_template.h"

namespace moeserve::chat {
namespace {

using nlohmann::ordered_json;

std::string read_template(const std::string& name) {
  std::ifstream in(std::string(MOESERVE_CHAT_TEMPLATES_DIR) + "/" + name);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

ChatTemplate load(const std::string& name) {
  Result<ChatTemplate> t = ChatTemplate::parse(read_template(name));
  EXPECT_TRUE(t.is_ok()) << t.status().to_string();
  return std::move(t).value();
}

ChatRenderInput user_says(const std::string& text) {
  ChatRenderInput in;
  in.messages = ordered_json::array({{{"role", "user"}, {"content", text}}});
  return in;
}

std::string render_ok(const ChatTemplate& t, const ChatRenderInput& in) {
  Result<std::string> out = t.render(in);
  EXPECT_TRUE(out.is_ok()) << out.status().to_string();
  return out.is_ok() ? out.value() : std::string();
}

TEST(ChatTemplate, Qwen3GenerationPromptAndThinkingSwitch) {
  ChatTemplate t = load("qwen3.jinja");
  ChatRenderInput in = user_says("Hello!");
  EXPECT_EQ(render_ok(t, in), "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n");
  in.enable_thinking = false;
  EXPECT_EQ(render_ok(t, in), "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  in.enable_thinking = true;
  in.add_generation_prompt = false;
  EXPECT_EQ(render_ok(t, in), "<|im_start|>user\nHello!<|im_end|>\n");
}

TEST(ChatTemplate, Qwen3HistoryDropsOldReasoningAndKeepsTheLatest) {
  ChatTemplate t = load("qwen3.jinja");
  ChatRenderInput in;
  in.add_generation_prompt = false;
  in.messages = ordered_json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4"},
    {"role": "user", "content": "times 3?"},
    {"role": "assistant", "reasoning_content": "multiply", "content": "12"}
  ])");
  EXPECT_EQ(render_ok(t, in),
            "<|im_start|>system\nBe brief.<|im_end|>\n"
            "<|im_start|>user\n2+2?<|im_end|>\n"
            "<|im_start|>assistant\n4<|im_end|>\n"
            "<|im_start|>user\ntimes 3?<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nmultiply\n</think>\n\n12<|im_end|>\n");
}

TEST(ChatTemplate, Qwen3ToolsAndToolCalls) {
  ChatTemplate t = load("qwen3.jinja");
  ChatRenderInput in;
  in.tools = ordered_json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])");
  in.messages = ordered_json::parse(R"([
    {"role": "user", "content": "go"},
    {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}]},
    {"role": "tool", "content": "done"}
  ])");
  EXPECT_EQ(render_ok(t, in),
            "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
            "{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\"}}}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n"
            "<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
            "<|im_start|>user\ngo<|im_end|>\n"
            "<|im_start|>assistant\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call><|im_end|>\n"
            "<|im_start|>user\n<tool_response>\ndone\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ChatTemplate, Qwen35ThinkingDefaultsOn) {
  ChatTemplate t = load("qwen3.5.jinja");
  ChatRenderInput in = user_says("Hi");
  EXPECT_EQ(render_ok(t, in), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n");
  in.enable_thinking = false;
  EXPECT_EQ(render_ok(t, in), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

TEST(ChatTemplate, Qwen35XmlToolCallsAndGroupedToolResponses) {
  ChatTemplate t = load("qwen3.5.jinja");
  ChatRenderInput in;
  in.add_generation_prompt = false;
  in.messages = ordered_json::parse(R"([
    {"role": "user", "content": "Weather in Paris and Oslo?"},
    {"role": "assistant", "content": "", "tool_calls": [
      {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}},
      {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo", "opts": {"unit": "C"}}}}]},
    {"role": "tool", "content": "Paris: 21"},
    {"role": "tool", "content": "Oslo: 9"}
  ])");
  EXPECT_EQ(render_ok(t, in),
            "<|im_start|>user\nWeather in Paris and Oslo?<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n"
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
            "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>"
            "\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n"
            "<parameter=opts>\n{\"unit\": \"C\"}\n</parameter>\n</function>\n</tool_call><|im_end|>\n"
            "<|im_start|>user\n<tool_response>\nParis: 21\n</tool_response>"
            "\n<tool_response>\nOslo: 9\n</tool_response><|im_end|>\n");
}

TEST(ChatTemplate, Qwen35ContentPartsAndVisionIds) {
  ChatTemplate t = load("qwen3.5.jinja");
  ChatRenderInput in;
  in.extra = {{"add_vision_id", true}};
  in.messages = ordered_json::parse(R"([{"role": "user", "content": [
      {"type": "image", "image": "a.png"}, {"type": "text", "text": " What is this? "}, {"type": "image_url", "image_url": {}}]}])");
  EXPECT_EQ(render_ok(t, in),
            "<|im_start|>user\nPicture 1: <|vision_start|><|image_pad|><|vision_end|> What is this? "
            "Picture 2: <|vision_start|><|image_pad|><|vision_end|><|im_end|>\n<|im_start|>assistant\n<think>\n");
}

TEST(ChatTemplate, TemplateErrorsCarryTheTemplatesMessageAndPosition) {
  ChatTemplate t = load("qwen3.5.jinja");
  ChatRenderInput in;
  in.messages = ordered_json::parse(R"([{"role": "assistant", "content": "I start."}])");
  Result<std::string> out = t.render(in);
  ASSERT_FALSE(out.is_ok());
  EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(out.status().message(), "chat template line 79:9: No user query found in messages.");
  in.messages = ordered_json::array();
  EXPECT_EQ(t.render(in).status().message(), "chat template line 43:9: No messages provided.");
}

TEST(ChatTemplate, InputValidationAndVariables) {
  Result<ChatTemplate> t = ChatTemplate::parse(
      "{{ messages | length }}|{{ tools is none }}|{{ enable_thinking is defined }}|{{ bos_token }}{{ eos_token }}|"
      "{{ custom }}|{{ add_generation_prompt }}|{{ strftime_now('%Y') }}");
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  ChatRenderInput in = user_says("x");
  in.bos_token = "<s>";
  in.eos_token = "</s>";
  in.extra = {{"custom", "c"}, {"messages", "overridden by the real field"}};
  in.now_unix_seconds = 0;
  EXPECT_EQ(render_ok(*t, in), "1|True|False|<s></s>|c|True|1970");
  in.enable_thinking = false;
  in.tools = ordered_json::array();
  EXPECT_EQ(render_ok(*t, in), "1|False|True|<s></s>|c|True|1970");

  in.messages = {{"role", "user"}};  // an object, not a list
  Result<std::string> out = t->render(in);
  ASSERT_FALSE(out.is_ok());
  EXPECT_EQ(out.status().message(), "chat template: messages must be a JSON array");
  in.messages = ordered_json::array();
  in.extra = ordered_json::array({1});
  EXPECT_EQ(t->render(in).status().code(), StatusCode::kInvalidArgument);
}

TEST(ChatTemplate, ParseErrorsUseTheGivenName) {
  ChatTemplateOptions options;
  options.name = "model.gguf chat template";
  Result<ChatTemplate> t = ChatTemplate::parse("{% for m in messages %}", options);
  ASSERT_FALSE(t.is_ok());
  EXPECT_EQ(t.status().to_string(),
            "invalid format: model.gguf chat template line 1:4: 'for' is never closed (expected '{% endfor %}')");
}

TEST(ChatTemplate, CopiesShareOneParsedTemplateAndRenderConcurrently) {
  ChatTemplate original = load("qwen3.5.jinja");
  ChatTemplate copy = original;
  const std::string expected = render_ok(original, user_says("same"));
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (int i = 0; i < 25; ++i) {
        Result<std::string> out = (k % 2 ? copy : original).render(user_says("same"));
        if (!out.is_ok() || out.value() != expected) ++mismatches[static_cast<size_t>(k)];
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches, std::vector<int>(4, 0));
  EXPECT_EQ(&copy.source(), &original.source());
}

}  // namespace
}  // namespace moeserve::chat
