#include "chat/jinja_parser.h"

#include <algorithm>

#include "chat/jinja_parser_impl.h"

namespace moeserve::chat::jinja {
namespace {

// Jinja statements outside the chat-template subset: named in the error.
constexpr std::string_view kUnsupportedStatements[] = {
    "include", "import", "from", "extends", "block", "call", "with", "autoescape", "do",
    "trans", "pluralize", "print", "endblock", "endcall", "endwith", "endautoescape", "endtrans",
};

bool contains(std::initializer_list<std::string_view> names, std::string_view name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

}  // namespace

Status Parser::expect_operator(std::string_view op) {
  if (skip_operator(op)) return Status::ok();
  return error(peek(), fmt::format("expected '{}'", op));
}

Result<std::string> Parser::expect_name(std::string_view what) {
  if (peek().kind != TokenKind::kName) return error(peek(), fmt::format("expected {}", what));
  return next().text;
}

Status Parser::expect_block_end(std::string_view statement) {
  if (peek().kind == TokenKind::kBlockEnd) {
    next();
    return Status::ok();
  }
  return error(peek(), fmt::format("expected '%}}' to end '{}'", statement));
}

Status Parser::enter_nesting(const Token& at) {
  if (nesting_ <= options_.max_nesting) return Status::ok();
  return error(at, fmt::format("template nests deeper than {} levels", options_.max_nesting),
               StatusCode::kOutOfRange);
}

Result<Body> Parser::parse_program() {
  static const Token kStart{};
  return parse_body({}, nullptr, kStart);
}

Result<Body> Parser::parse_body(std::initializer_list<std::string_view> end_tags, std::string* ended_by,
                                const Token& opened_by) {
  NestingGuard guard(*this);
  MOESERVE_RETURN_IF_ERROR(enter_nesting(opened_by));
  Body body;
  while (true) {
    const Token& tok = peek();
    switch (tok.kind) {
      case TokenKind::kEnd:
        if (end_tags.size() == 0) return body;
        return error(opened_by, fmt::format("'{}' is never closed (expected '{{% {} %}}')", opened_by.text,
                                            *std::prev(end_tags.end())));
      case TokenKind::kText:
        body.push_back(std::make_unique<TextStmt>(tok.pos, tok.text));
        next();
        break;
      case TokenKind::kVarBegin: {
        next();
        MOESERVE_ASSIGN_OR_RETURN(ExprPtr expr, parse_expression());
        if (peek().kind != TokenKind::kVarEnd) return error(peek(), "expected '}}'");
        next();
        body.push_back(std::make_unique<OutputStmt>(tok.pos, std::move(expr)));
        break;
      }
      case TokenKind::kBlockBegin: {
        const Token& name = peek(1);
        if (name.kind == TokenKind::kName && contains(end_tags, name.text)) {
          next();
          next();
          if (ended_by) *ended_by = name.text;
          return body;
        }
        MOESERVE_RETURN_IF_ERROR(parse_statement(body));
        break;
      }
      default:
        return error(tok, "unexpected token");
    }
  }
}

Status Parser::parse_statement(Body& body) {
  next();  // {%
  const Token& tag = peek();
  if (tag.kind != TokenKind::kName) return error(tag, "expected a statement name after '{%'");
  next();
  const std::string& name = tag.text;
  Result<StmtPtr> stmt = Status();
  if (name == "if") {
    stmt = parse_if(tag);
  } else if (name == "for") {
    stmt = parse_for(tag);
  } else if (name == "set") {
    stmt = parse_set(tag);
  } else if (name == "macro") {
    stmt = parse_macro(tag);
  } else if (name == "filter") {
    stmt = parse_filter_block(tag);
  } else if (name == "break" || name == "continue") {
    if (loop_depth_ == 0) return error(tag, fmt::format("'{}' outside of a for loop", name));
    MOESERVE_RETURN_IF_ERROR(expect_block_end(name));
    stmt = StmtPtr(std::make_unique<LoopControlStmt>(
        tag.pos, name == "break" ? StmtKind::kBreak : StmtKind::kContinue));
  } else if (name == "generation") {
    // transformers' {% generation %} only marks assistant tokens for training
    // masks; the rendered text is the body as is.
    MOESERVE_RETURN_IF_ERROR(expect_block_end(name));
    MOESERVE_ASSIGN_OR_RETURN(Body inner, parse_body({"endgeneration"}, nullptr, tag));
    MOESERVE_RETURN_IF_ERROR(expect_block_end("endgeneration"));
    for (auto& s : inner) body.push_back(std::move(s));
    return Status::ok();
  } else if (std::find(std::begin(kUnsupportedStatements), std::end(kUnsupportedStatements), name) !=
             std::end(kUnsupportedStatements)) {
    return error(tag, fmt::format("unsupported statement '{}'", name), StatusCode::kUnsupported);
  } else if (name.rfind("end", 0) == 0 || name == "else" || name == "elif") {
    return error(tag, fmt::format("unexpected '{}' with no open block to close", name));
  } else {
    return error(tag, fmt::format("unknown statement '{}'", name), StatusCode::kUnsupported);
  }
  if (!stmt.is_ok()) return stmt.status();
  body.push_back(std::move(stmt).value());
  return Status::ok();
}

Result<StmtPtr> Parser::parse_if(const Token& tag) {
  auto stmt = std::make_unique<IfStmt>(tag.pos);
  std::string ended_by = "elif";
  while (ended_by == "elif") {
    MOESERVE_ASSIGN_OR_RETURN(ExprPtr cond, parse_expression());
    MOESERVE_RETURN_IF_ERROR(expect_block_end("if"));
    MOESERVE_ASSIGN_OR_RETURN(Body branch, parse_body({"elif", "else", "endif"}, &ended_by, tag));
    stmt->branches.emplace_back(std::move(cond), std::move(branch));
  }
  if (ended_by == "else") {
    MOESERVE_RETURN_IF_ERROR(expect_block_end("else"));
    MOESERVE_ASSIGN_OR_RETURN(stmt->else_body, parse_body({"endif"}, nullptr, tag));
  }
  MOESERVE_RETURN_IF_ERROR(expect_block_end("endif"));
  return StmtPtr(std::move(stmt));
}

Result<StmtPtr> Parser::parse_for(const Token& tag) {
  auto stmt = std::make_unique<ForStmt>(tag.pos);
  bool parenthesized = skip_operator("(");
  do {
    MOESERVE_ASSIGN_OR_RETURN(std::string target, expect_name("a loop variable name"));
    stmt->targets.push_back(std::move(target));
  } while (skip_operator(","));
  if (parenthesized) MOESERVE_RETURN_IF_ERROR(expect_operator(")"));
  if (!skip_name("in")) return error(peek(), "expected 'in' in for loop");
  // No conditional here: a trailing `if` filters the loop instead.
  MOESERVE_ASSIGN_OR_RETURN(stmt->iterable, parse_tuple(false));
  if (skip_name("if")) {
    MOESERVE_ASSIGN_OR_RETURN(stmt->filter, parse_expression());
  }
  if (at_name("recursive")) {
    return error(peek(), "unsupported for-loop option 'recursive'", StatusCode::kUnsupported);
  }
  MOESERVE_RETURN_IF_ERROR(expect_block_end("for"));
  std::string ended_by;
  ++loop_depth_;
  auto body = parse_body({"else", "endfor"}, &ended_by, tag);
  --loop_depth_;
  if (!body.is_ok()) return body.status();
  stmt->body = std::move(body).value();
  if (ended_by == "else") {
    MOESERVE_RETURN_IF_ERROR(expect_block_end("else"));
    MOESERVE_ASSIGN_OR_RETURN(stmt->else_body, parse_body({"endfor"}, nullptr, tag));
  }
  MOESERVE_RETURN_IF_ERROR(expect_block_end("endfor"));
  return StmtPtr(std::move(stmt));
}

Result<AssignTarget> Parser::parse_assign_target() {
  AssignTarget target;
  MOESERVE_ASSIGN_OR_RETURN(std::string first, expect_name("a variable name"));
  if (skip_operator(".")) {
    MOESERVE_ASSIGN_OR_RETURN(target.attribute, expect_name("an attribute name"));
    target.namespace_name = std::move(first);
    return target;
  }
  target.names.push_back(std::move(first));
  while (skip_operator(",")) {
    MOESERVE_ASSIGN_OR_RETURN(std::string name, expect_name("a variable name"));
    target.names.push_back(std::move(name));
  }
  return target;
}

Result<StmtPtr> Parser::parse_set(const Token& tag) {
  MOESERVE_ASSIGN_OR_RETURN(AssignTarget target, parse_assign_target());
  if (skip_operator("=")) {
    MOESERVE_ASSIGN_OR_RETURN(ExprPtr value, parse_tuple(true));
    MOESERVE_RETURN_IF_ERROR(expect_block_end("set"));
    return StmtPtr(std::make_unique<SetStmt>(tag.pos, std::move(target), std::move(value)));
  }
  // Block form: {% set x | filters %}...{% endset %}
  if (target.names.size() > 1) return error(tag, "a block 'set' assigns a single name");
  auto stmt = std::make_unique<SetBlockStmt>(tag.pos, std::move(target));
  while (skip_operator("|")) {
    MOESERVE_ASSIGN_OR_RETURN(auto filter, parse_filter_call(nullptr));
    stmt->filters.push_back(std::move(filter));
  }
  MOESERVE_RETURN_IF_ERROR(expect_block_end("set"));
  MOESERVE_ASSIGN_OR_RETURN(stmt->body, parse_body({"endset"}, nullptr, tag));
  MOESERVE_RETURN_IF_ERROR(expect_block_end("endset"));
  return StmtPtr(std::move(stmt));
}

Result<StmtPtr> Parser::parse_macro(const Token& tag) {
  MOESERVE_ASSIGN_OR_RETURN(std::string name, expect_name("a macro name"));
  auto stmt = std::make_unique<MacroStmt>(tag.pos, std::move(name));
  MOESERVE_RETURN_IF_ERROR(expect_operator("("));
  while (!skip_operator(")")) {
    if (!stmt->params.empty()) MOESERVE_RETURN_IF_ERROR(expect_operator(","));
    if (skip_operator(")")) break;  // trailing comma
    MOESERVE_ASSIGN_OR_RETURN(std::string param, expect_name("a parameter name"));
    ExprPtr default_value;
    if (skip_operator("=")) {
      MOESERVE_ASSIGN_OR_RETURN(default_value, parse_expression());
    }
    stmt->params.push_back(std::move(param));
    stmt->defaults.push_back(std::move(default_value));
  }
  MOESERVE_RETURN_IF_ERROR(expect_block_end("macro"));
  int saved_loop_depth = loop_depth_;
  loop_depth_ = 0;  // `break` inside a macro cannot leave the caller's loop
  auto body = parse_body({"endmacro"}, nullptr, tag);
  loop_depth_ = saved_loop_depth;
  if (!body.is_ok()) return body.status();
  stmt->body = std::move(body).value();
  MOESERVE_RETURN_IF_ERROR(expect_block_end("endmacro"));
  return StmtPtr(std::move(stmt));
}

Result<StmtPtr> Parser::parse_filter_block(const Token& tag) {
  auto stmt = std::make_unique<FilterBlockStmt>(tag.pos);
  do {
    MOESERVE_ASSIGN_OR_RETURN(auto filter, parse_filter_call(nullptr));
    stmt->filters.push_back(std::move(filter));
  } while (skip_operator("|"));
  MOESERVE_RETURN_IF_ERROR(expect_block_end("filter"));
  MOESERVE_ASSIGN_OR_RETURN(stmt->body, parse_body({"endfilter"}, nullptr, tag));
  MOESERVE_RETURN_IF_ERROR(expect_block_end("endfilter"));
  return StmtPtr(std::move(stmt));
}

Result<std::shared_ptr<const Body>> parse_template(std::string_view source, const SourceInfo& info,
                                                   const ParseOptions& options) {
  if (source.size() > options.max_source_bytes) {
    return make_error(StatusCode::kOutOfRange, "{}: template is {} bytes, more than the limit of {}",
                      info.name, source.size(), options.max_source_bytes);
  }
  MOESERVE_ASSIGN_OR_RETURN(std::vector<Token> tokens, tokenize(source, info, options.lexer));
  Parser parser(std::move(tokens), info, options);
  MOESERVE_ASSIGN_OR_RETURN(Body body, parser.parse_program());
  return std::make_shared<const Body>(std::move(body));
}

}  // namespace moeserve::chat::jinja
