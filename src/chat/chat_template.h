// Chat templates: turning an OpenAI-style message list into the prompt text a
// model was trained on, by running the Jinja template that ships with the
// model (GGUF `tokenizer.chat_template`, HF `tokenizer_config.json`).
//
// The engine is our own interpreter of the Jinja subset such templates use
// (Qwen3, Qwen3.5 and the like), rendered the way transformers'
// apply_chat_template does: trim_blocks and lstrip_blocks on, the immutable
// sandbox (no list.append), `tojson` without HTML escaping and with
// ensure_ascii=False, raise_exception() and strftime_now() available.
// Where Python's Jinja2 and @huggingface/jinja differ, Python wins (it is what
// models are trained with): `{{ true }}` prints "True", `{{ none }}` prints
// "None", floats print like Python's repr, loop-body `set`s do not survive the
// iteration, macros do not see their caller's variables.
//
// Supported: {{ }} {% %} {# #} with -/+ whitespace control; if/elif/else,
// for (tuple unpacking, `if` filter, else, loop.*, break/continue), set
// (names, tuples, namespace attributes, block form), macro (defaults,
// keyword arguments), filter blocks, raw, generation; literals, arithmetic,
// comparisons (chained), and/or/not, in/not in, `is` tests, ternaries,
// slicing, filters, str/dict methods. Anything else (include, import,
// extends, block, call, with, unknown filters/tests/methods) is rejected at
// parse time with "chat template line L:C: ...".
//
// Limits against hostile templates: a step budget, a nesting/recursion limit,
// caps on output and value sizes (jinja::RenderLimits). Breaking one is an
// error (StatusCode::kOutOfRange), never a hang or a crash.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "chat/jinja_template.h"
#include "core/status.h"

namespace moeserve::chat {

struct ChatRenderInput {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;  // null: the template sees `tools` as none
  bool add_generation_prompt = true;
  std::optional<bool> enable_thinking;  // unset: `enable_thinking` is undefined
  std::string bos_token;
  std::string eos_token;
  // More template variables (e.g. preserve_thinking, add_vision_id); the
  // fields above win on a name clash.
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
  // Time for strftime_now(); unset uses the clock.
  std::optional<int64_t> now_unix_seconds;
};

struct ChatTemplateOptions {
  std::string name = "chat template";  // prefixes error messages
  jinja::ParseOptions parse;
  jinja::RenderLimits limits;
};

class ChatTemplate {
 public:
  static Result<ChatTemplate> parse(std::string source, const ChatTemplateOptions& options = {});

  Result<std::string> render(const ChatRenderInput& input) const;

  const std::string& source() const { return *source_; }

 private:
  ChatTemplate(std::shared_ptr<const std::string> source, jinja::Template tmpl, jinja::RenderLimits limits)
      : source_(std::move(source)), template_(std::move(tmpl)), limits_(limits) {}

  std::shared_ptr<const std::string> source_;
  jinja::Template template_;
  jinja::RenderLimits limits_;
};

}  // namespace moeserve::chat
