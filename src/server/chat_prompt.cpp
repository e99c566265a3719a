#include "server/chat_prompt.h"

#include <utility>

namespace moeserve::server {
namespace {

// Every byte of each control-token text found in s becomes another byte
// ('x', or 'y' where the byte is 'x'): same length, never a token text.
bool mask_string(std::string& s, const std::vector<std::string_view>& texts) {
  bool masked = false;
  for (std::string_view t : texts) {
    for (size_t at = s.find(t); at != std::string::npos; at = s.find(t, at + t.size())) {
      for (size_t i = at; i < at + t.size(); ++i) s[i] = s[i] == 'x' ? 'y' : 'x';
      masked = true;
    }
  }
  return masked;
}

// Masks every string value (and object key) of v; returns whether any changed.
bool mask_json(nlohmann::ordered_json& v, const std::vector<std::string_view>& texts) {
  bool masked = false;
  if (v.is_string()) {
    std::string s = v.get<std::string>();
    if (mask_string(s, texts)) {
      v = std::move(s);
      masked = true;
    }
  } else if (v.is_array()) {
    for (auto& e : v) masked = mask_json(e, texts) || masked;
  } else if (v.is_object()) {
    nlohmann::ordered_json out = nlohmann::ordered_json::object();
    for (auto it = v.begin(); it != v.end(); ++it) {
      std::string key = it.key();
      masked = mask_string(key, texts) || masked;
      nlohmann::ordered_json value = it.value();
      masked = mask_json(value, texts) || masked;
      out[key] = std::move(value);
    }
    if (masked) v = std::move(out);
  }
  return masked;
}

// The maximal runs where a and b (same length) differ.
std::vector<tok::TextRange> differing_runs(std::string_view a, std::string_view b) {
  std::vector<tok::TextRange> runs;
  for (size_t i = 0; i < a.size();) {
    if (a[i] == b[i]) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < a.size() && a[j] != b[j]) ++j;
    runs.push_back({i, j});
    i = j;
  }
  return runs;
}

}  // namespace

std::optional<SpecialTokensInContent> special_tokens_policy_from_name(std::string_view name) {
  if (name == "text") return SpecialTokensInContent::kText;
  if (name == "parse") return SpecialTokensInContent::kParse;
  return std::nullopt;
}

Result<ChatPrompt> encode_chat_prompt(const tok::Tokenizer& tokenizer, const chat::ChatTemplate& tmpl,
                                      const chat::ChatRenderInput& input, SpecialTokensInContent policy) {
  MOESERVE_ASSIGN_OR_RETURN(std::string text, tmpl.render(input));
  ChatPrompt prompt;
  if (policy == SpecialTokensInContent::kParse) {
    prompt.ids = tokenizer.encode(text);
    prompt.text = std::move(text);
    return prompt;
  }
  chat::ChatRenderInput masked = input;
  const std::vector<std::string_view>& texts = tokenizer.control_texts();
  bool any = mask_json(masked.messages, texts);
  any = mask_json(masked.tools, texts) || any;
  any = mask_json(masked.extra, texts) || any;
  if (!any) {
    prompt.ids = tokenizer.encode(text);
    prompt.text = std::move(text);
    return prompt;
  }
  MOESERVE_ASSIGN_OR_RETURN(std::string masked_text, tmpl.render(masked));
  if (masked_text.size() != text.size()) {
    return make_error(
        StatusCode::kInvalidArgument,
        "the request contains control-token text (such as <|im_start|>) where the chat template "
        "transforms it, so it cannot be kept as plain text; remove it, or start the server with "
        "--special-tokens-in-content parse to let such text act as control tokens");
  }
  const std::vector<tok::TextRange> literal = differing_runs(text, masked_text);
  tok::EncodeOptions options;
  options.literal_ranges = literal;
  prompt.ids = tokenizer.encode(text, options);
  prompt.text = std::move(text);
  return prompt;
}

}  // namespace moeserve::server
