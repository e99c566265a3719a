// Expression grammar, loosest binding first (as in Jinja2):
//   conditional  a if c else b
//   or, and, not
//   compare      == != < <= > >= in, not in   (chained like Python)
//   math1        + -
//   concat       ~
//   math2        * / // %
//   pow          **
//   unary        - +   then primary, postfix (.x [i] (args)), filters | and tests `is`
#include "chat/jinja_parser_impl.h"

namespace moeserve::chat::jinja {
namespace {

bool is_reserved_after_test(std::string_view name) {
  return name == "else" || name == "or" || name == "and" || name == "if" || name == "not" ||
         name == "in" || name == "is" || name == "recursive";
}

ExprPtr literal(SourcePos pos, Value v) { return std::make_unique<LiteralExpr>(pos, std::move(v)); }

}  // namespace

Result<ExprPtr> Parser::parse_expression(bool allow_conditional) {
  NestingGuard guard(*this);
  MOESERVE_RETURN_IF_ERROR(enter_nesting(peek()));
  MOESERVE_ASSIGN_OR_RETURN(ExprPtr expr, parse_or());
  if (!allow_conditional) return expr;
  while (at_name("if")) {
    SourcePos pos = next().pos;
    MOESERVE_ASSIGN_OR_RETURN(ExprPtr cond, parse_or());
    auto cexpr = std::make_unique<ConditionalExpr>(pos, std::move(expr), std::move(cond));
    if (skip_name("else")) {
      MOESERVE_ASSIGN_OR_RETURN(cexpr->else_expr, parse_expression());
    }
    expr = std::move(cexpr);
  }
  return expr;
}

Result<ExprPtr> Parser::parse_tuple(bool allow_conditional) {
  SourcePos pos = peek().pos;
  MOESERVE_ASSIGN_OR_RETURN(ExprPtr first, parse_expression(allow_conditional));
  if (!at_operator(",")) return first;
  auto tuple = std::make_unique<ListExpr>(pos, true);
  tuple->items.push_back(std::move(first));
  while (skip_operator(",")) {
    if (peek().kind == TokenKind::kBlockEnd || peek().kind == TokenKind::kVarEnd) break;
    MOESERVE_ASSIGN_OR_RETURN(ExprPtr item, parse_expression(allow_conditional));
    tuple->items.push_back(std::move(item));
  }
  return ExprPtr(std::move(tuple));
}

Result<ExprPtr> Parser::parse_or() {
  MOESERVE_ASSIGN_OR_RETURN(ExprPtr left, parse_and());
  while (at_name("or")) {
    SourcePos pos = next().pos;
    MOESERVE_ASSIGN_OR_RETURN(ExprPtr right, parse_and());
    left = std::make_unique<LogicalExpr>(pos, false, std::move(left), std::move(right));
  }
  return left;
}

Result<ExprPtr> Parser::parse_and() {
  MOESERVE_ASSIGN_OR_RETURN(ExprPtr left, parse_not());
  while (at_name("and")) {
    SourcePos pos = next().pos;
    MOESERVE_ASSIGN_OR_RETURN(ExprPtr right, parse_not());
    left = std::make_unique<LogicalExpr>(pos, true, std::move(left), std::move(right));
  }
  return left;
}

Result<ExprPtr> Parser::parse_not() {
  if (at_name("not")) {
    const Token& tok = next();
    NestingGuard guard(*this);
    MOESERVE_RETURN_IF_ERROR(enter_nesting(tok));
    MOESERVE_ASSIGN_OR_RETURN(ExprPtr operand, parse_not());
    return ExprPtr(std::make_unique<UnaryExpr>(tok.pos, UnaryOp::kNot, std::move(operand)));
  }
  return parse_compare();
}

Result<ExprPtr> Parser::parse_compare() {
  SourcePos pos = peek().pos;
  MOESERVE_ASSIGN_OR_RETURN(ExprPtr first, parse_math1());
  std::unique_ptr<CompareExpr> cmp;
  while (true) {
    CompareOp op;
    const Token& tok = peek();
    if (tok.kind == TokenKind::kOperator && tok.text == "==") op = CompareOp::kEq;
    else if (tok.kind == TokenKind::kOperator && tok.text == "!=") op = CompareOp::kNe;
    else if (tok.kind == TokenKind::kOperator && tok.text == "<") op = CompareOp::kLt;
    else if (tok.kind == TokenKind::kOperator && tok.text == "<=") op = CompareOp::kLe;
    else if (tok.kind == TokenKind::kOperator && tok.text == ">") op = CompareOp::kGt;
    else if (tok.kind == TokenKind::kOperator && tok.text == ">=") op = CompareOp::kGe;
    else if (at_name("in")) op = CompareOp::kIn;
    else if (at_name("not") && peek(1).kind == TokenKind::kName && peek(1).text == "in") {
      next();
      op = CompareOp::kNotIn;
    } else {
      break;
    }
    next();
    MOESERVE_ASSIGN_OR_RETURN(ExprPtr operand, parse_math1());
    if (!cmp) cmp = std::make_unique<CompareExpr>(pos, std::move(first));
    cmp->rest.emplace_back(op, std::move(operand));
  }
  if (!cmp) return first;
  return ExprPtr(std::move(cmp));
}

Result<ExprPtr> Parser::parse_math1() {
  MOESERVE_ASSIGN_OR_RETURN(ExprPtr left, parse_concat());
  while (at_operator("+") || at_operator("-")) {
    const Token& tok = next();
    BinaryOp op = tok.text == "+" ? BinaryOp::kAdd : BinaryOp::kSub;
    MOESERVE_ASSIGN_OR_RETURN(ExprPtr right, parse_concat());
    left = std::make_unique<BinaryExpr>(tok.pos, op, std::move(left), std::move(right));
  }
  return left;
}

Result<ExprPtr> Parser::parse_concat() {
  MOESERVE_ASSIGN_OR_RETURN(ExprPtr left, parse_math2());
  while (at_operator("~")) {
    SourcePos pos = next().pos;
    MOESERVE_ASSIGN_OR_RETURN(ExprPtr right, parse_math2());
    left = std::make_unique<BinaryExpr>(pos, BinaryOp::kConcat, std::move(left), std::move(right));
  }
  return left;
}

Result<ExprPtr> Parser::parse_math2() {
  MOESERVE_ASSIGN_OR_RETURN(ExprPtr left, parse_pow());
  while (at_operator("*") || at_operator("/") || at_operator("//") || at_operator("%")) {
    const Token& tok = next();
    BinaryOp op = tok.text == "*" ? BinaryOp::kMul
                  : tok.text == "/" ? BinaryOp::kDiv
                  : tok.text == "//" ? BinaryOp::kFloorDiv
                                     : BinaryOp::kMod;
    MOESERVE_ASSIGN_OR_RETURN(ExprPtr right, parse_pow());
    left = std::make_unique<BinaryExpr>(tok.pos, op, std::move(left), std::move(right));
  }
  return left;
}

Result<ExprPtr> Parser::parse_pow() {
  MOESERVE_ASSIGN_OR_RETURN(ExprPtr left, parse_unary(true));
  while (at_operator("**")) {
    SourcePos pos = next().pos;
    MOESERVE_ASSIGN_OR_RETURN(ExprPtr right, parse_unary(true));
    left = std::make_unique<BinaryExpr>(pos, BinaryOp::kPow, std::move(left), std::move(right));
  }
  return left;
}

Result<ExprPtr> Parser::parse_unary(bool with_filter) {
  ExprPtr node;
  if (at_operator("-") || at_operator("+")) {
    const Token& tok = next();
    NestingGuard guard(*this);
    MOESERVE_RETURN_IF_ERROR(enter_nesting(tok));
    MOESERVE_ASSIGN_OR_RETURN(ExprPtr operand, parse_unary(false));
    node = std::make_unique<UnaryExpr>(tok.pos, tok.text == "-" ? UnaryOp::kNegate : UnaryOp::kPlus,
                                       std::move(operand));
  } else {
    MOESERVE_ASSIGN_OR_RETURN(node, parse_primary());
  }
  MOESERVE_ASSIGN_OR_RETURN(node, parse_postfix(std::move(node)));
  if (with_filter) {
    MOESERVE_ASSIGN_OR_RETURN(node, parse_filter_chain(std::move(node)));
  }
  return node;
}

Result<ExprPtr> Parser::parse_primary() {
  const Token& tok = peek();
  switch (tok.kind) {
    case TokenKind::kName: {
      next();
      const std::string& n = tok.text;
      if (n == "true" || n == "True") return literal(tok.pos, Value::boolean(true));
      if (n == "false" || n == "False") return literal(tok.pos, Value::boolean(false));
      if (n == "none" || n == "None") return literal(tok.pos, Value::none());
      return ExprPtr(std::make_unique<NameExpr>(tok.pos, n));
    }
    case TokenKind::kString: {
      std::string value;
      while (peek().kind == TokenKind::kString) value += next().text;  // "a" "b" is "ab"
      return literal(tok.pos, Value::string(std::move(value)));
    }
    case TokenKind::kInteger:
      next();
      return literal(tok.pos, Value::integer(tok.int_value));
    case TokenKind::kFloat:
      next();
      return literal(tok.pos, Value::number(tok.float_value));
    case TokenKind::kOperator:
      if (tok.text == "(") return parse_paren();
      if (tok.text == "[") return parse_list();
      if (tok.text == "{") return parse_dict();
      break;
    default:
      break;
  }
  if (tok.kind == TokenKind::kVarEnd || tok.kind == TokenKind::kBlockEnd || tok.kind == TokenKind::kEnd) {
    return error(tok, "expected an expression");
  }
  return error(tok, fmt::format("unexpected '{}' in expression", tok.text));
}

Result<ExprPtr> Parser::parse_paren() {
  const Token& open = next();
  if (skip_operator(")")) return ExprPtr(std::make_unique<ListExpr>(open.pos, true));  // ()
  MOESERVE_ASSIGN_OR_RETURN(ExprPtr first, parse_expression());
  if (skip_operator(")")) return first;
  auto tuple = std::make_unique<ListExpr>(open.pos, true);
  tuple->items.push_back(std::move(first));
  while (!skip_operator(")")) {
    MOESERVE_RETURN_IF_ERROR(expect_operator(","));
    if (skip_operator(")")) break;
    MOESERVE_ASSIGN_OR_RETURN(ExprPtr item, parse_expression());
    tuple->items.push_back(std::move(item));
  }
  return ExprPtr(std::move(tuple));
}

Result<ExprPtr> Parser::parse_list() {
  const Token& open = next();
  auto list = std::make_unique<ListExpr>(open.pos, false);
  while (!skip_operator("]")) {
    if (!list->items.empty()) {
      MOESERVE_RETURN_IF_ERROR(expect_operator(","));
      if (skip_operator("]")) break;
    }
    MOESERVE_ASSIGN_OR_RETURN(ExprPtr item, parse_expression());
    list->items.push_back(std::move(item));
  }
  return ExprPtr(std::move(list));
}

Result<ExprPtr> Parser::parse_dict() {
  const Token& open = next();
  auto dict = std::make_unique<DictExpr>(open.pos);
  while (!skip_operator("}")) {
    if (!dict->items.empty()) {
      MOESERVE_RETURN_IF_ERROR(expect_operator(","));
      if (skip_operator("}")) break;
    }
    MOESERVE_ASSIGN_OR_RETURN(ExprPtr key, parse_expression());
    MOESERVE_RETURN_IF_ERROR(expect_operator(":"));
    MOESERVE_ASSIGN_OR_RETURN(ExprPtr value, parse_expression());
    dict->items.emplace_back(std::move(key), std::move(value));
  }
  return ExprPtr(std::move(dict));
}

Result<ExprPtr> Parser::parse_postfix(ExprPtr node) {
  while (true) {
    const Token& tok = peek();
    if (at_operator(".")) {
      next();
      const Token& attr = peek();
      if (attr.kind == TokenKind::kName) {
        next();
        node = std::make_unique<GetAttrExpr>(tok.pos, std::move(node), attr.text);
      } else if (attr.kind == TokenKind::kInteger) {  // foo.0 is foo[0]
        next();
        node = std::make_unique<GetItemExpr>(tok.pos, std::move(node), literal(attr.pos, Value::integer(attr.int_value)));
      } else {
        return error(attr, "expected an attribute name after '.'");
      }
    } else if (at_operator("[")) {
      next();
      MOESERVE_ASSIGN_OR_RETURN(node, parse_subscript(std::move(node), tok));
    } else if (at_operator("(")) {
      if (node->kind == ExprKind::kGetAttr) {
        const auto& attr = static_cast<const GetAttrExpr&>(*node);
        if (!is_known_method(attr.name)) {
          return error(tok, fmt::format("unsupported method '{}'", attr.name), StatusCode::kUnsupported);
        }
      }
      next();
      SourcePos callee_pos = node->pos;  // errors point at what was called
      auto call = std::make_unique<CallExpr>(callee_pos, std::move(node));
      MOESERVE_RETURN_IF_ERROR(parse_call_args(call->args));
      node = std::move(call);
    } else {
      return node;
    }
  }
}

Result<ExprPtr> Parser::parse_subscript(ExprPtr object, const Token& bracket) {
  ExprPtr start;
  if (!at_operator(":")) {
    MOESERVE_ASSIGN_OR_RETURN(start, parse_expression());
    if (skip_operator("]")) {
      return ExprPtr(std::make_unique<GetItemExpr>(bracket.pos, std::move(object), std::move(start)));
    }
  }
  auto slice = std::make_unique<SliceExpr>(bracket.pos, std::move(object));
  slice->start = std::move(start);
  MOESERVE_RETURN_IF_ERROR(expect_operator(":"));
  if (!at_operator(":") && !at_operator("]")) {
    MOESERVE_ASSIGN_OR_RETURN(slice->stop, parse_expression());
  }
  if (skip_operator(":") && !at_operator("]")) {
    MOESERVE_ASSIGN_OR_RETURN(slice->step, parse_expression());
  }
  MOESERVE_RETURN_IF_ERROR(expect_operator("]"));
  return ExprPtr(std::move(slice));
}

Status Parser::parse_call_args(CallArgsExpr& args) {
  bool first = true;
  while (!skip_operator(")")) {
    if (!first) {
      MOESERVE_RETURN_IF_ERROR(expect_operator(","));
      if (skip_operator(")")) break;
    }
    first = false;
    if (at_operator("*") || at_operator("**")) {
      return error(peek(), "unsupported '*args' / '**kwargs' in a call", StatusCode::kUnsupported);
    }
    if (peek().kind == TokenKind::kName && peek(1).kind == TokenKind::kOperator && peek(1).text == "=") {
      std::string name = next().text;
      next();
      MOESERVE_ASSIGN_OR_RETURN(ExprPtr value, parse_expression());
      args.keyword.emplace_back(std::move(name), std::move(value));
    } else {
      if (!args.keyword.empty()) return error(peek(), "positional argument after keyword argument");
      MOESERVE_ASSIGN_OR_RETURN(ExprPtr value, parse_expression());
      args.positional.push_back(std::move(value));
    }
  }
  return Status::ok();
}

Result<std::unique_ptr<FilterExpr>> Parser::parse_filter_call(ExprPtr operand) {
  const Token& name_tok = peek();
  MOESERVE_ASSIGN_OR_RETURN(std::string name, expect_name("a filter name"));
  FilterFn fn = find_filter(name);
  if (!fn) return error(name_tok, fmt::format("unsupported filter '{}'", name), StatusCode::kUnsupported);
  auto filter = std::make_unique<FilterExpr>(name_tok.pos, std::move(operand), name, fn);
  if (skip_operator("(")) MOESERVE_RETURN_IF_ERROR(parse_call_args(filter->args));
  return filter;
}

Result<ExprPtr> Parser::parse_filter_chain(ExprPtr node) {
  while (true) {
    if (at_operator("|")) {
      next();
      MOESERVE_ASSIGN_OR_RETURN(auto filter, parse_filter_call(std::move(node)));
      node = std::move(filter);
    } else if (at_name("is")) {
      const Token& is_token = next();
      MOESERVE_ASSIGN_OR_RETURN(node, parse_test(std::move(node), is_token));
    } else if (at_operator("(")) {
      const Token& tok = next();
      auto call = std::make_unique<CallExpr>(tok.pos, std::move(node));
      MOESERVE_RETURN_IF_ERROR(parse_call_args(call->args));
      node = std::move(call);
    } else {
      return node;
    }
  }
}

Result<ExprPtr> Parser::parse_test(ExprPtr operand, const Token& is_token) {
  bool negated = skip_name("not");
  const Token& name_tok = peek();
  MOESERVE_ASSIGN_OR_RETURN(std::string name, expect_name("a test name after 'is'"));
  // `none`, `true` and `false` are test names here, not literals.
  TestFn fn = find_test(name);
  if (!fn) return error(name_tok, fmt::format("unsupported test '{}'", name), StatusCode::kUnsupported);
  auto test = std::make_unique<TestExpr>(is_token.pos, std::move(operand), name, fn, negated);
  const Token& tok = peek();
  if (skip_operator("(")) {
    MOESERVE_RETURN_IF_ERROR(parse_call_args(test->args));
  } else if ((tok.kind == TokenKind::kName && !is_reserved_after_test(tok.text)) ||
             tok.kind == TokenKind::kString || tok.kind == TokenKind::kInteger ||
             tok.kind == TokenKind::kFloat || at_operator("[") || at_operator("{")) {
    // `x is divisibleby 3`: one argument without parentheses.
    MOESERVE_ASSIGN_OR_RETURN(ExprPtr arg, parse_primary());
    MOESERVE_ASSIGN_OR_RETURN(arg, parse_postfix(std::move(arg)));
    test->args.positional.push_back(std::move(arg));
  }
  return ExprPtr(std::move(test));
}

}  // namespace moeserve::chat::jinja
