// Parser for the chat-template engine: tokens -> syntax tree.
//
// Supports the Jinja subset chat templates use (see chat_template.h). Every
// construct outside it is rejected here, with its line:column, instead of
// misbehaving at render time: unsupported statements (include, import,
// extends, block, call, with, ...), unknown filters and tests, and calls of
// methods no supported type has (e.g. list.append, which transformers'
// sandbox forbids too). Nesting is bounded so hostile input cannot exhaust the
// native stack.
#pragma once

#include <memory>
#include <string_view>

#include "chat/jinja_ast.h"
#include "chat/jinja_lexer.h"

namespace moeserve::chat::jinja {

struct ParseOptions {
  LexerOptions lexer;
  size_t max_source_bytes = 4u << 20;
  int max_nesting = 100;  // nested expressions + nested blocks
};

Result<std::shared_ptr<const Body>> parse_template(std::string_view source, const SourceInfo& info,
                                                   const ParseOptions& options = {});

}  // namespace moeserve::chat::jinja
