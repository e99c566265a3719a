#include "server/api/response_format.h"

#include <chrono>
#include <cmath>
#include <random>

namespace moeserve::server::api {

std::string make_id(std::string_view prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id(prefix);
  uint64_t bits = 0;
  for (int i = 0; i < 24; ++i) {
    if (i % 16 == 0) bits = rng();
    id += kHex[bits & 15];
    bits >>= 4;
  }
  return id;
}

int64_t unix_time_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

json Usage::to_json() const {
  json u = {{"prompt_tokens", prompt_tokens},
            {"completion_tokens", completion_tokens},
            {"total_tokens", prompt_tokens + completion_tokens},
            {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
  if (!speculative_mode.empty()) u["speculative"] = speculative_json();
  return u;
}

json Usage::speculative_json() const {
  if (speculative_mode.empty()) return nullptr;
  const double mean = draft_steps > 0 ? 1.0 + double(accepted_draft_tokens) / double(draft_steps) : 0.0;
  return {{"mode", speculative_mode},
          {"draft_tokens", draft_tokens},
          {"accepted_draft_tokens", accepted_draft_tokens},
          {"mean_acceptance_length", mean}};
}

// ---- logprobs ----------------------------------------------------------------

namespace {

double finite_logprob(float logprob) { return std::isfinite(logprob) ? logprob : -9999.0; }

json utf8_bytes(std::string_view token) {
  json bytes = json::array();
  for (char c : token) bytes.push_back(static_cast<unsigned char>(c));
  return bytes;
}

json chat_logprob_entry(std::string_view token, float logprob) {
  return {{"token", token}, {"logprob", finite_logprob(logprob)}, {"bytes", utf8_bytes(token)}};
}

json object_base(const ResponseMeta& meta, const char* object) {
  return {{"id", meta.id}, {"object", object}, {"created", meta.created}, {"model", meta.model}};
}

}  // namespace

json chat_logprob_entries(std::span<const TokenLogprob> tokens) {
  json entries = json::array();
  for (const TokenLogprob& t : tokens) {
    json entry = chat_logprob_entry(t.token, t.logprob);
    json top = json::array();
    for (const TopLogprob& alt : t.top) top.push_back(chat_logprob_entry(alt.token, alt.logprob));
    entry["top_logprobs"] = std::move(top);
    entries.push_back(std::move(entry));
  }
  return entries;
}

json chat_logprobs(std::span<const TokenLogprob> tokens) {
  return {{"content", chat_logprob_entries(tokens)}, {"refusal", nullptr}};
}

json completion_logprobs(std::span<const TokenLogprob> tokens, int64_t text_offset) {
  json out = {{"tokens", json::array()},
              {"token_logprobs", json::array()},
              {"top_logprobs", json::array()},
              {"text_offset", json::array()}};
  for (const TokenLogprob& t : tokens) {
    out["tokens"].push_back(t.token);
    out["token_logprobs"].push_back(finite_logprob(t.logprob));
    json top = json::object();
    for (const TopLogprob& alt : t.top) top[alt.token] = finite_logprob(alt.logprob);
    out["top_logprobs"].push_back(std::move(top));
    out["text_offset"].push_back(text_offset);
    text_offset += static_cast<int64_t>(t.token.size());
  }
  return out;
}

// ---- chat --------------------------------------------------------------------

namespace {

json tool_call_json(const ToolCall& call) {
  return {{"id", call.id},
          {"type", "function"},
          {"function", {{"name", call.name}, {"arguments", call.arguments}}}};
}

json chat_choice(json delta_or_message, const char* key, const json& logprobs, const json& finish_reason) {
  return {{"index", 0},
          {key, std::move(delta_or_message)},
          {"logprobs", logprobs},
          {"finish_reason", finish_reason}};
}

}  // namespace

json chat_completion(const ResponseMeta& meta, const ChatChoiceResult& choice, const Usage& usage) {
  const bool has_calls = !choice.tool_calls.empty();
  json message = {{"role", "assistant"}};
  // OpenAI: content is null when the answer is only tool calls.
  message["content"] = choice.content.empty() && has_calls ? json(nullptr) : json(choice.content);
  if (!choice.reasoning.empty()) message["reasoning_content"] = choice.reasoning;
  if (has_calls) {
    json calls = json::array();
    for (const ToolCall& call : choice.tool_calls) calls.push_back(tool_call_json(call));
    message["tool_calls"] = std::move(calls);
  }
  std::string finish = choice.finish_reason == "stop" && has_calls ? "tool_calls" : choice.finish_reason;
  json out = object_base(meta, "chat.completion");
  out["choices"] =
      json::array({chat_choice(std::move(message), "message", choice.logprobs.value_or(nullptr), finish)});
  out["usage"] = usage.to_json();
  return out;
}

json chat_chunk_role(const ResponseMeta& meta) {
  json out = object_base(meta, "chat.completion.chunk");
  out["choices"] =
      json::array({chat_choice({{"role", "assistant"}, {"content", ""}}, "delta", nullptr, nullptr)});
  return out;
}

json chat_chunk_delta(const ResponseMeta& meta, const ChatDelta& delta) {
  json d = json::object();
  if (!delta.content.empty()) d["content"] = delta.content;
  if (!delta.reasoning.empty()) d["reasoning_content"] = delta.reasoning;
  if (!delta.tool_calls.empty()) {
    json calls = json::array();
    for (size_t i = 0; i < delta.tool_calls.size(); ++i) {
      json call = tool_call_json(delta.tool_calls[i]);
      call["index"] = delta.first_tool_index + i;
      calls.push_back(std::move(call));
    }
    d["tool_calls"] = std::move(calls);
  }
  json out = object_base(meta, "chat.completion.chunk");
  out["choices"] =
      json::array({chat_choice(std::move(d), "delta", delta.logprobs.value_or(nullptr), nullptr)});
  return out;
}

json chat_chunk_finish(const ResponseMeta& meta, std::string_view finish_reason) {
  json out = object_base(meta, "chat.completion.chunk");
  out["choices"] = json::array({chat_choice(json::object(), "delta", nullptr, finish_reason)});
  return out;
}

json chat_chunk_usage(const ResponseMeta& meta, const Usage& usage) {
  json out = object_base(meta, "chat.completion.chunk");
  out["choices"] = json::array();
  out["usage"] = usage.to_json();
  return out;
}

// ---- completions -------------------------------------------------------------

namespace {

json completion_choice(const CompletionChoiceResult& c) {
  return {{"index", 0},
          {"text", c.text},
          {"logprobs", c.logprobs.value_or(nullptr)},
          {"finish_reason", c.finish_reason.empty() ? json(nullptr) : json(c.finish_reason)}};
}

}  // namespace

json text_completion(const ResponseMeta& meta, const CompletionChoiceResult& choice, const Usage& usage) {
  json out = object_base(meta, "text_completion");
  out["choices"] = json::array({completion_choice(choice)});
  out["usage"] = usage.to_json();
  return out;
}

json text_completion_chunk(const ResponseMeta& meta, const CompletionChoiceResult& piece) {
  json out = object_base(meta, "text_completion");
  out["choices"] = json::array({completion_choice(piece)});
  return out;
}

json text_completion_usage_chunk(const ResponseMeta& meta, const Usage& usage) {
  json out = object_base(meta, "text_completion");
  out["choices"] = json::array();
  out["usage"] = usage.to_json();
  return out;
}

// ---- models & framing --------------------------------------------------------

json models_list(std::span<const ModelInfo> models) {
  json data = json::array();
  for (const ModelInfo& m : models) {
    data.push_back({{"id", m.id}, {"object", "model"}, {"created", m.created}, {"owned_by", "moeserve"}});
  }
  return {{"object", "list"}, {"data", std::move(data)}};
}

std::string dump_json(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string sse_data(const json& value) { return "data: " + dump_json(value) + "\n\n"; }

std::string sse_done() { return "data: [DONE]\n\n"; }

}  // namespace moeserve::server::api
