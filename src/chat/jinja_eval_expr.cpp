// Expression evaluation for the interpreter (statements are in
// jinja_interpreter.cpp).
#include "chat/jinja_interpreter.h"
#include "chat/jinja_operators.h"

namespace moeserve::chat::jinja {

Result<Value> Interpreter::eval(const Expr& expr) {
  DepthGuard guard(*this);
  if (guard.exceeded()) {
    return located_error(StatusCode::kOutOfRange, info_, expr.pos,
                         fmt::format("template nests or recurses deeper than the limit of {} levels",
                                     limits_.max_depth));
  }
  MOESERVE_RETURN_IF_ERROR(located(expr.pos, charge(1)));
  return eval_uncharged(expr);
}

Result<Value> Interpreter::eval_uncharged(const Expr& expr) {
  switch (expr.kind) {
    case ExprKind::kLiteral: return static_cast<const LiteralExpr&>(expr).value;
    case ExprKind::kName: return lookup(static_cast<const NameExpr&>(expr).name);
    case ExprKind::kList:
    case ExprKind::kDict: return eval_collection(expr);
    case ExprKind::kGetAttr: {
      const auto& e = static_cast<const GetAttrExpr&>(expr);
      MOESERVE_ASSIGN_OR_RETURN(Value obj, eval(*e.object));
      Result<Value> r = get_attribute(obj, e.name);
      if (!r.is_ok()) return located(expr.pos, r.status());
      return r;
    }
    case ExprKind::kGetItem: {
      const auto& e = static_cast<const GetItemExpr&>(expr);
      MOESERVE_ASSIGN_OR_RETURN(Value obj, eval(*e.object));
      MOESERVE_ASSIGN_OR_RETURN(Value key, eval(*e.index));
      Result<Value> r = get_item(obj, key);
      if (!r.is_ok()) return located(expr.pos, r.status());
      return r;
    }
    case ExprKind::kSlice: {
      const auto& e = static_cast<const SliceExpr&>(expr);
      MOESERVE_ASSIGN_OR_RETURN(Value obj, eval(*e.object));
      Value bounds[3];
      const ExprPtr* parts[3] = {&e.start, &e.stop, &e.step};
      for (int i = 0; i < 3; ++i) {
        if (*parts[i]) {
      MOESERVE_ASSIGN_OR_RETURN(bounds[i], eval(**parts[i]));
    }
      }
      Result<Value> r = slice_value(*this, obj, bounds[0], bounds[1], bounds[2]);
      if (!r.is_ok()) return located(expr.pos, r.status());
      return r;
    }
    case ExprKind::kCall: return eval_call(static_cast<const CallExpr&>(expr));
    case ExprKind::kFilter: {
      const auto& e = static_cast<const FilterExpr&>(expr);
      MOESERVE_ASSIGN_OR_RETURN(Value input, eval(*e.operand));
      return eval_filter(e, std::move(input));
    }
    case ExprKind::kTest: return eval_test(static_cast<const TestExpr&>(expr));
    case ExprKind::kUnary: {
      const auto& e = static_cast<const UnaryExpr&>(expr);
      MOESERVE_ASSIGN_OR_RETURN(Value v, eval(*e.operand));
      Result<Value> r = apply_unary(e.op, v);
      if (!r.is_ok()) return located(expr.pos, r.status());
      return r;
    }
    case ExprKind::kBinary: {
      const auto& e = static_cast<const BinaryExpr&>(expr);
      MOESERVE_ASSIGN_OR_RETURN(Value a, eval(*e.left));
      MOESERVE_ASSIGN_OR_RETURN(Value b, eval(*e.right));
      Result<Value> r = apply_binary(*this, e.op, a, b);
      if (!r.is_ok()) return located(expr.pos, r.status());
      return r;
    }
    case ExprKind::kCompare: return eval_compare(static_cast<const CompareExpr&>(expr));
    case ExprKind::kLogical: {
      const auto& e = static_cast<const LogicalExpr&>(expr);
      MOESERVE_ASSIGN_OR_RETURN(Value left, eval(*e.left));
      if (left.truthy() != e.is_and) return left;  // short-circuit: Python returns the operand
      return eval(*e.right);
    }
    case ExprKind::kConditional: {
      const auto& e = static_cast<const ConditionalExpr&>(expr);
      MOESERVE_ASSIGN_OR_RETURN(Value cond, eval(*e.cond));
      if (cond.truthy()) return eval(*e.then_expr);
      if (e.else_expr) return eval(*e.else_expr);
      return Value::undefined("the conditional expression had no else branch");
    }
  }
  return Status(StatusCode::kInternal, "unknown expression kind");
}

Result<Value> Interpreter::eval_collection(const Expr& expr) {
  if (expr.kind == ExprKind::kList) {
    const auto& e = static_cast<const ListExpr&>(expr);
    std::vector<Value> items;
    items.reserve(e.items.size());
    for (const ExprPtr& item : e.items) {
      MOESERVE_ASSIGN_OR_RETURN(Value v, eval(*item));
      items.push_back(std::move(v));
    }
    return Value::list(std::move(items), e.is_tuple);
  }
  const auto& e = static_cast<const DictExpr&>(expr);
  DictData dict;
  for (const auto& [key_expr, value_expr] : e.items) {
    MOESERVE_ASSIGN_OR_RETURN(Value key, eval(*key_expr));
    if (!key.is_string()) {
      return located_error(StatusCode::kUnsupported, info_, key_expr->pos,
                           fmt::format("dict keys must be strings, not '{}'", key.type_name()));
    }
    MOESERVE_ASSIGN_OR_RETURN(Value value, eval(*value_expr));
    dict.set(key.as_string(), std::move(value));
  }
  return Value::dict(std::move(dict));
}

Result<CallArgs> Interpreter::eval_args(const CallArgsExpr& args) {
  CallArgs out;
  out.positional.reserve(args.positional.size());
  for (const ExprPtr& arg : args.positional) {
    MOESERVE_ASSIGN_OR_RETURN(Value v, eval(*arg));
    out.positional.push_back(std::move(v));
  }
  for (const auto& [name, arg] : args.keyword) {
    MOESERVE_ASSIGN_OR_RETURN(Value v, eval(*arg));
    out.keyword.emplace_back(name, std::move(v));
  }
  return out;
}

Result<Value> Interpreter::eval_call(const CallExpr& call) {
  MOESERVE_ASSIGN_OR_RETURN(Value callee, eval(*call.callee));
  MOESERVE_ASSIGN_OR_RETURN(CallArgs args, eval_args(call.args));
  Result<Value> r = call_value(callee, args);
  if (!r.is_ok()) return located(call.pos, r.status());
  return r;
}

Result<Value> Interpreter::eval_filter(const FilterExpr& filter, Value input) {
  MOESERVE_ASSIGN_OR_RETURN(CallArgs args, eval_args(filter.args));
  Result<Value> r = filter.fn(*this, input, args);
  if (!r.is_ok()) {
    return located(filter.pos, Status(r.status().code(), fmt::format("filter '{}': {}", filter.name,
                                                                      r.status().message())));
  }
  return r;
}

Result<Value> Interpreter::eval_test(const TestExpr& test) {
  MOESERVE_ASSIGN_OR_RETURN(Value operand, eval(*test.operand));
  MOESERVE_ASSIGN_OR_RETURN(CallArgs args, eval_args(test.args));
  Result<bool> r = test.fn(*this, operand, args);
  if (!r.is_ok()) {
    return located(test.pos, Status(r.status().code(), fmt::format("test '{}': {}", test.name,
                                                                     r.status().message())));
  }
  return Value::boolean(*r != test.negated);
}

Result<Value> Interpreter::eval_compare(const CompareExpr& compare) {
  MOESERVE_ASSIGN_OR_RETURN(Value left, eval(*compare.first));
  for (const auto& [op, right_expr] : compare.rest) {
    MOESERVE_ASSIGN_OR_RETURN(Value right, eval(*right_expr));
    bool result = false;
    switch (op) {
      case CompareOp::kEq: result = values_equal(left, right); break;
      case CompareOp::kNe: result = !values_equal(left, right); break;
      case CompareOp::kIn:
      case CompareOp::kNotIn: {
        Result<bool> in = value_in(left, right);
        if (!in.is_ok()) return located(right_expr->pos, in.status());
        result = *in == (op == CompareOp::kIn);
        break;
      }
      default: {
        Result<int> c = compare_values(left, right);
        if (!c.is_ok()) return located(right_expr->pos, c.status());
        result = op == CompareOp::kLt ? *c < 0 : op == CompareOp::kLe ? *c <= 0 : op == CompareOp::kGt ? *c > 0 : *c >= 0;
      }
    }
    if (!result) return Value::boolean(false);  // a < b < c stops at the first false link
    left = std::move(right);
  }
  return Value::boolean(true);
}

}  // namespace moeserve::chat::jinja
