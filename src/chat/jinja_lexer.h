// Lexer for the chat-template engine: turns template source into a flat token
// stream of text chunks and tag contents.
//
// Whitespace control is resolved here because it edits the text next to a tag:
// `{%-`/`-%}` (and the `{{`/`{#` forms) strip all adjacent whitespace, and the
// Hugging Face settings trim_blocks (drop the newline right after a block or
// comment tag) and lstrip_blocks (drop spaces and tabs before a block or
// comment tag that starts a line) are applied as transformers configures
// Jinja2. Like Jinja2, the lexer turns "\r\n" and "\r" into "\n" and drops one
// trailing newline at the end of the template.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "chat/jinja_source.h"
#include "core/status.h"

namespace moeserve::chat::jinja {

enum class TokenKind {
  kText,        // template text between tags (already whitespace-controlled)
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,
  kString,      // `text` holds the decoded value
  kInteger,
  kFloat,
  kOperator,    // `text` holds the symbol: "+", "//", "==", "(", ...
  kEnd,
};

struct Token {
  TokenKind kind = TokenKind::kEnd;
  std::string text;
  int64_t int_value = 0;
  double float_value = 0.0;
  SourcePos pos;
};

struct LexerOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
};

Result<std::vector<Token>> tokenize(std::string_view source, const SourceInfo& info,
                                    const LexerOptions& options = {});

}  // namespace moeserve::chat::jinja
