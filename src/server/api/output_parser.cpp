#include "server/api/output_parser.h"

#include <algorithm>
#include <memory>
#include <random>

#include "server/api/json_body.h"

namespace moeserve::server::api {

namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kToolOpen = "<tool_call>";
constexpr std::string_view kToolClose = "</tool_call>";

bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

// Length of the longest proper prefix of `tag` that `text` ends with: those
// bytes must wait for the next piece.
size_t partial_tag_suffix(std::string_view text, std::string_view tag) {
  for (size_t k = std::min(text.size(), tag.size() - 1); k > 0; --k) {
    if (text.substr(text.size() - k) == tag.substr(0, k)) return k;
  }
  return 0;
}

// Appends `text` to `out`, trimming leading whitespace while `skip_ws` and
// holding trailing whitespace in `pending` until non-whitespace follows.
void emit_trimmed(std::string& out, std::string& pending, bool& skip_ws, std::string_view text) {
  if (skip_ws) {
    size_t start = 0;
    while (start < text.size() && is_ws(text[start])) ++start;
    text.remove_prefix(start);
    if (text.empty()) return;
    skip_ws = false;
  }
  size_t end = text.size();
  while (end > 0 && is_ws(text[end - 1])) --end;
  if (end > 0) {
    out += pending;
    pending.clear();
    out.append(text.substr(0, end));
  }
  pending.append(text.substr(end));
}

}  // namespace

std::string random_tool_call_id() {
  static constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uniform_int_distribution<size_t> pick(0, sizeof(kAlphabet) - 2);
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kAlphabet[pick(rng)];
  return id;
}

std::function<std::string()> counter_tool_call_ids(uint64_t first) {
  auto next = std::make_shared<uint64_t>(first);
  return [next] {
    std::string digits = std::to_string((*next)++);
    return "call_" + std::string(24 - std::min<size_t>(24, digits.size()), '0') + digits;
  };
}

void OutputDelta::append(OutputDelta&& other) {
  content += other.content;
  reasoning += other.reasoning;
  for (ToolCall& call : other.tool_calls) tool_calls.push_back(std::move(call));
}

OutputParser::OutputParser(OutputParserOptions options) : options_(std::move(options)) {
  if (!options_.make_tool_call_id) options_.make_tool_call_id = random_tool_call_id;
  if (!options_.parse_reasoning) {
    state_ = State::kContent;
  } else if (options_.starts_in_reasoning) {
    state_ = State::kReasoning;
    skip_ws_ = true;
  } else {
    state_ = State::kStart;
  }
}

OutputDelta OutputParser::push(std::string_view piece) {
  OutputDelta out;
  buffer_.append(piece);
  process(out, false);
  return out;
}

OutputDelta OutputParser::finish() {
  OutputDelta out;
  process(out, true);
  // Trailing whitespace of the answer is kept; of the reasoning, trimmed.
  if (state_ != State::kReasoning) out.content += pending_ws_;
  pending_ws_.clear();
  buffer_.clear();
  return out;
}

OutputDelta OutputParser::parse(std::string_view text, OutputParserOptions options) {
  OutputParser parser(std::move(options));
  OutputDelta out = parser.push(text);
  out.append(parser.finish());
  return out;
}

void OutputParser::process(OutputDelta& out, bool final) {
  for (;;) {
    bool progressed = false;
    switch (state_) {
      case State::kStart:
        progressed = step_start(out, final);
        break;
      case State::kContent:
        progressed = step_content(out, final);
        break;
      case State::kReasoning:
        progressed = step_reasoning(out, final);
        break;
      case State::kToolCall:
        progressed = step_tool_call(out, final);
        break;
    }
    if (!progressed) return;
  }
}

bool OutputParser::step_start(OutputDelta& out, bool final) {
  size_t ws = 0;
  while (ws < buffer_.size() && is_ws(buffer_[ws])) ++ws;
  pending_ws_.append(buffer_, 0, ws);
  buffer_.erase(0, ws);
  std::string_view buf = buffer_;
  if (buf.starts_with(kThinkOpen)) {
    pending_ws_.clear();
    buffer_.erase(0, kThinkOpen.size());
    state_ = State::kReasoning;
    skip_ws_ = true;
    return true;
  }
  if (!final && kThinkOpen.starts_with(buf)) return false;  // empty, or a prefix of <think>
  state_ = State::kContent;
  return true;
}

bool OutputParser::step_content(OutputDelta& out, bool final) {
  std::string_view buf = buffer_;
  if (options_.parse_tool_calls) {
    size_t at = buf.find(kToolOpen);
    if (at != std::string_view::npos) {
      emit_content(out, buf.substr(0, at));
      pending_ws_.clear();  // whitespace between the answer and the call
      buffer_.erase(0, at + kToolOpen.size());
      state_ = State::kToolCall;
      return true;
    }
  }
  size_t hold = options_.parse_tool_calls && !final ? partial_tag_suffix(buf, kToolOpen) : 0;
  emit_content(out, buf.substr(0, buf.size() - hold));
  buffer_.erase(0, buffer_.size() - hold);
  return false;
}

bool OutputParser::step_reasoning(OutputDelta& out, bool final) {
  std::string_view buf = buffer_;
  size_t at = buf.find(kThinkClose);
  if (at != std::string_view::npos) {
    emit_reasoning(out, buf.substr(0, at));
    pending_ws_.clear();
    buffer_.erase(0, at + kThinkClose.size());
    state_ = State::kContent;
    skip_ws_ = true;
    return true;
  }
  size_t hold = final ? 0 : partial_tag_suffix(buf, kThinkClose);
  emit_reasoning(out, buf.substr(0, buf.size() - hold));
  buffer_.erase(0, buffer_.size() - hold);
  return false;
}

bool OutputParser::step_tool_call(OutputDelta& out, bool final) {
  std::string_view buf = buffer_;
  size_t at = buf.find(kToolClose);
  if (at != std::string_view::npos) {
    close_tool_call(out, buf.substr(0, at));
    buffer_.erase(0, at + kToolClose.size());
    state_ = State::kContent;
    skip_ws_ = true;
    return true;
  }
  if (final) {  // never closed: the raw text is all we can give
    state_ = State::kContent;
    emit_content(out, std::string(kToolOpen) + buffer_);
    buffer_.clear();
  }
  return false;
}

void OutputParser::emit_content(OutputDelta& out, std::string_view text) {
  emit_trimmed(out.content, pending_ws_, skip_ws_, text);
}

void OutputParser::emit_reasoning(OutputDelta& out, std::string_view text) {
  emit_trimmed(out.reasoning, pending_ws_, skip_ws_, text);
}

void OutputParser::close_tool_call(OutputDelta& out, std::string_view body) {
  Parsed<nlohmann::ordered_json> json = parse_json_text(body);
  const nlohmann::ordered_json* name = nullptr;
  if (json.ok() && json.value->is_object()) {
    auto it = json.value->find("name");
    if (it != json.value->end() && it->is_string() && !it->get_ref<const std::string&>().empty()) name = &*it;
  }
  if (!name) {
    emit_content(out, std::string(kToolOpen) + std::string(body) + std::string(kToolClose));
    return;
  }
  ToolCall call;
  call.id = options_.make_tool_call_id();
  call.name = name->get<std::string>();
  auto args = json.value->find("arguments");
  if (args == json.value->end() || args->is_null()) {
    call.arguments = "{}";
  } else if (args->is_string()) {  // some models emit the arguments already as JSON text
    call.arguments = args->get<std::string>();
  } else {
    call.arguments = args->dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  }
  out.tool_calls.push_back(std::move(call));
}

}  // namespace moeserve::server::api
