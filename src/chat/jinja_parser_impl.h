// Internal: the recursive-descent parser shared by jinja_parser.cpp
// (statements) and jinja_parse_expr.cpp (expressions).
#pragma once

#include <initializer_list>
#include <string>
#include <vector>

#include "chat/jinja_ast.h"
#include "chat/jinja_lexer.h"
#include "chat/jinja_parser.h"

namespace moeserve::chat::jinja {

class Parser {
 public:
  Parser(std::vector<Token> tokens, const SourceInfo& info, const ParseOptions& options)
      : tokens_(std::move(tokens)), info_(info), options_(options) {}

  Result<Body> parse_program();

 private:
  class NestingGuard;

  // ---- token stream ----
  const Token& peek(size_t ahead = 0) const {
    size_t i = pos_ + ahead;
    return i < tokens_.size() ? tokens_[i] : tokens_.back();
  }
  const Token& next() { return tokens_[pos_ < tokens_.size() - 1 ? pos_++ : pos_]; }
  bool at_operator(std::string_view op) const {
    return peek().kind == TokenKind::kOperator && peek().text == op;
  }
  bool at_name(std::string_view name) const { return peek().kind == TokenKind::kName && peek().text == name; }
  bool skip_operator(std::string_view op) {
    if (!at_operator(op)) return false;
    ++pos_;
    return true;
  }
  bool skip_name(std::string_view name) {
    if (!at_name(name)) return false;
    ++pos_;
    return true;
  }
  Status expect_operator(std::string_view op);
  Result<std::string> expect_name(std::string_view what);
  Status expect_block_end(std::string_view statement);
  Status error(const Token& at, const std::string& message, StatusCode code = StatusCode::kInvalidFormat) const {
    return located_error(code, info_, at.pos, message);
  }
  Status enter_nesting(const Token& at);

  // ---- statements (jinja_parser.cpp) ----
  // Parses statements until a block tag named in `end_tags`; stores which one
  // in `ended_by` (the tag's name token is consumed, its `%}` is not).
  Result<Body> parse_body(std::initializer_list<std::string_view> end_tags, std::string* ended_by,
                          const Token& opened_by);
  Status parse_statement(Body& body);
  Result<StmtPtr> parse_if(const Token& tag);
  Result<StmtPtr> parse_for(const Token& tag);
  Result<StmtPtr> parse_set(const Token& tag);
  Result<StmtPtr> parse_macro(const Token& tag);
  Result<StmtPtr> parse_filter_block(const Token& tag);
  Result<AssignTarget> parse_assign_target();
  Result<std::unique_ptr<FilterExpr>> parse_filter_call(ExprPtr operand);

  // ---- expressions (jinja_parse_expr.cpp) ----
  Result<ExprPtr> parse_expression(bool allow_conditional = true);
  // An expression, or a bare tuple `a, b` (for `set x = a, b` and `for` targets).
  Result<ExprPtr> parse_tuple(bool allow_conditional);
  Result<ExprPtr> parse_or();
  Result<ExprPtr> parse_and();
  Result<ExprPtr> parse_not();
  Result<ExprPtr> parse_compare();
  Result<ExprPtr> parse_math1();
  Result<ExprPtr> parse_concat();
  Result<ExprPtr> parse_math2();
  Result<ExprPtr> parse_pow();
  Result<ExprPtr> parse_unary(bool with_filter);
  Result<ExprPtr> parse_primary();
  Result<ExprPtr> parse_postfix(ExprPtr node);
  Result<ExprPtr> parse_filter_chain(ExprPtr node);
  Result<ExprPtr> parse_test(ExprPtr operand, const Token& is_token);
  Result<ExprPtr> parse_subscript(ExprPtr object, const Token& bracket);
  Result<ExprPtr> parse_paren();
  Result<ExprPtr> parse_list();
  Result<ExprPtr> parse_dict();
  Status parse_call_args(CallArgsExpr& args);

  std::vector<Token> tokens_;
  const SourceInfo& info_;
  const ParseOptions& options_;
  size_t pos_ = 0;
  int nesting_ = 0;
  int loop_depth_ = 0;  // for-loops enclosing the current point (reset inside macros)
};

// RAII: counts one level of nesting; the level is checked by enter_nesting().
class Parser::NestingGuard {
 public:
  explicit NestingGuard(Parser& p) : p_(p) { ++p_.nesting_; }
  ~NestingGuard() { --p_.nesting_; }
  NestingGuard(const NestingGuard&) = delete;
  NestingGuard& operator=(const NestingGuard&) = delete;

 private:
  Parser& p_;
};

}  // namespace moeserve::chat::jinja
