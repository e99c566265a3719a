// A chat request's prompt tokens: the chat template's rendering, encoded so
// that text the request carries (message content, tool results, tool
// definitions, names) stays text even when it spells a control token such
// as <|im_start|>. Otherwise a user could end their turn and forge a system
// turn by typing its markers. `--special-tokens-in-content parse` restores
// the old behaviour (the whole rendering parsed for control tokens, as
// /v1/completions always does with its raw prompt).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "chat/chat_template.h"
#include "core/status.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::server {

enum class SpecialTokensInContent { kText, kParse };

// "text" / "parse"; nullopt for anything else.
std::optional<SpecialTokensInContent> special_tokens_policy_from_name(std::string_view name);

struct ChatPrompt {
  std::string text;          // the template's rendering
  std::vector<int32_t> ids;  // its tokens
};

// kText: the request's strings are rendered once more with every control
// token text in them masked (same length, other bytes); where the two
// renderings differ is request text, encoded with control tokens kept as
// text. A template that changes the length of such text (it would have to
// transform it) makes the request fail with kInvalidArgument naming the
// flag, rather than guessing.
Result<ChatPrompt> encode_chat_prompt(const tok::Tokenizer& tokenizer, const chat::ChatTemplate& tmpl,
                                      const chat::ChatRenderInput& input, SpecialTokensInContent policy);

}  // namespace moeserve::server
