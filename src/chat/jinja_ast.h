// Syntax tree of a parsed chat template. The parser builds it once; rendering
// walks it read-only, so one parsed template can render concurrently.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chat/jinja_builtins.h"
#include "chat/jinja_source.h"
#include "chat/jinja_value.h"

namespace moeserve::chat::jinja {

// ---- expressions ------------------------------------------------------------------

enum class ExprKind {
  kLiteral, kName, kList, kDict, kGetAttr, kGetItem, kSlice, kCall, kFilter, kTest,
  kUnary, kBinary, kCompare, kLogical, kConditional,
};

struct Expr {
  Expr(ExprKind k, SourcePos p) : kind(k), pos(p) {}
  virtual ~Expr() = default;
  ExprKind kind;
  SourcePos pos;
};
using ExprPtr = std::unique_ptr<Expr>;

struct CallArgsExpr {
  std::vector<ExprPtr> positional;
  std::vector<std::pair<std::string, ExprPtr>> keyword;
};

struct LiteralExpr : Expr {
  LiteralExpr(SourcePos p, Value v) : Expr(ExprKind::kLiteral, p), value(std::move(v)) {}
  Value value;
};

struct NameExpr : Expr {
  NameExpr(SourcePos p, std::string n) : Expr(ExprKind::kName, p), name(std::move(n)) {}
  std::string name;
};

struct ListExpr : Expr {  // [a, b] or a tuple (a, b)
  ListExpr(SourcePos p, bool tuple) : Expr(ExprKind::kList, p), is_tuple(tuple) {}
  std::vector<ExprPtr> items;
  bool is_tuple;
};

struct DictExpr : Expr {
  explicit DictExpr(SourcePos p) : Expr(ExprKind::kDict, p) {}
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
};

struct GetAttrExpr : Expr {  // object.name
  GetAttrExpr(SourcePos p, ExprPtr o, std::string n)
      : Expr(ExprKind::kGetAttr, p), object(std::move(o)), name(std::move(n)) {}
  ExprPtr object;
  std::string name;
};

struct GetItemExpr : Expr {  // object[index]
  GetItemExpr(SourcePos p, ExprPtr o, ExprPtr i)
      : Expr(ExprKind::kGetItem, p), object(std::move(o)), index(std::move(i)) {}
  ExprPtr object;
  ExprPtr index;
};

struct SliceExpr : Expr {  // object[start:stop:step]; omitted parts are null
  SliceExpr(SourcePos p, ExprPtr o) : Expr(ExprKind::kSlice, p), object(std::move(o)) {}
  ExprPtr object, start, stop, step;
};

struct CallExpr : Expr {
  CallExpr(SourcePos p, ExprPtr c) : Expr(ExprKind::kCall, p), callee(std::move(c)) {}
  ExprPtr callee;
  CallArgsExpr args;
};

struct FilterExpr : Expr {  // operand | name(args)
  FilterExpr(SourcePos p, ExprPtr o, std::string n, FilterFn f)
      : Expr(ExprKind::kFilter, p), operand(std::move(o)), name(std::move(n)), fn(f) {}
  ExprPtr operand;  // null inside {% filter %} blocks, where the body is the operand
  std::string name;
  FilterFn fn;
  CallArgsExpr args;
};

struct TestExpr : Expr {  // operand is [not] name(args)
  TestExpr(SourcePos p, ExprPtr o, std::string n, TestFn f, bool neg)
      : Expr(ExprKind::kTest, p), operand(std::move(o)), name(std::move(n)), fn(f), negated(neg) {}
  ExprPtr operand;
  std::string name;
  TestFn fn;
  bool negated;
  CallArgsExpr args;
};

enum class UnaryOp { kNegate, kPlus, kNot };
struct UnaryExpr : Expr {
  UnaryExpr(SourcePos p, UnaryOp o, ExprPtr x) : Expr(ExprKind::kUnary, p), op(o), operand(std::move(x)) {}
  UnaryOp op;
  ExprPtr operand;
};

enum class BinaryOp { kAdd, kSub, kMul, kDiv, kFloorDiv, kMod, kPow, kConcat };
struct BinaryExpr : Expr {
  BinaryExpr(SourcePos p, BinaryOp o, ExprPtr l, ExprPtr r)
      : Expr(ExprKind::kBinary, p), op(o), left(std::move(l)), right(std::move(r)) {}
  BinaryOp op;
  ExprPtr left, right;
};

enum class CompareOp { kEq, kNe, kLt, kLe, kGt, kGe, kIn, kNotIn };
struct CompareExpr : Expr {  // chained like Python: a < b < c
  CompareExpr(SourcePos p, ExprPtr first_operand) : Expr(ExprKind::kCompare, p), first(std::move(first_operand)) {}
  ExprPtr first;
  std::vector<std::pair<CompareOp, ExprPtr>> rest;
};

struct LogicalExpr : Expr {  // `and` / `or`, short-circuit, yielding an operand
  LogicalExpr(SourcePos p, bool is_and_op, ExprPtr l, ExprPtr r)
      : Expr(ExprKind::kLogical, p), is_and(is_and_op), left(std::move(l)), right(std::move(r)) {}
  bool is_and;
  ExprPtr left, right;
};

struct ConditionalExpr : Expr {  // then_expr if cond else else_expr
  ConditionalExpr(SourcePos p, ExprPtr t, ExprPtr c)
      : Expr(ExprKind::kConditional, p), then_expr(std::move(t)), cond(std::move(c)) {}
  ExprPtr then_expr, cond;
  ExprPtr else_expr;  // null: yields undefined when cond is false
};

// ---- statements -----------------------------------------------------------------

enum class StmtKind { kText, kOutput, kIf, kFor, kSet, kSetBlock, kMacro, kBreak, kContinue, kFilterBlock };

struct Stmt {
  Stmt(StmtKind k, SourcePos p) : kind(k), pos(p) {}
  virtual ~Stmt() = default;
  StmtKind kind;
  SourcePos pos;
};
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct TextStmt : Stmt {
  TextStmt(SourcePos p, std::string t) : Stmt(StmtKind::kText, p), text(std::move(t)) {}
  std::string text;
};

struct OutputStmt : Stmt {  // {{ expr }}
  OutputStmt(SourcePos p, ExprPtr e) : Stmt(StmtKind::kOutput, p), expr(std::move(e)) {}
  ExprPtr expr;
};

struct IfStmt : Stmt {
  explicit IfStmt(SourcePos p) : Stmt(StmtKind::kIf, p) {}
  std::vector<std::pair<ExprPtr, Body>> branches;  // if, then each elif
  Body else_body;
};

struct ForStmt : Stmt {
  explicit ForStmt(SourcePos p) : Stmt(StmtKind::kFor, p) {}
  std::vector<std::string> targets;  // more than one: tuple unpacking
  ExprPtr iterable;
  ExprPtr filter;  // `for x in xs if cond`; may be null
  Body body;
  Body else_body;
};

// Where a `set` stores: plain names (several for tuple unpacking) or one
// namespace attribute (`ns.attr`).
struct AssignTarget {
  std::vector<std::string> names;
  std::string namespace_name;  // non-empty for `ns.attr`
  std::string attribute;
};

struct SetStmt : Stmt {  // {% set target = value %}
  SetStmt(SourcePos p, AssignTarget t, ExprPtr v) : Stmt(StmtKind::kSet, p), target(std::move(t)), value(std::move(v)) {}
  AssignTarget target;
  ExprPtr value;
};

struct SetBlockStmt : Stmt {  // {% set target | filters %}body{% endset %}
  SetBlockStmt(SourcePos p, AssignTarget t) : Stmt(StmtKind::kSetBlock, p), target(std::move(t)) {}
  AssignTarget target;
  std::vector<std::unique_ptr<FilterExpr>> filters;
  Body body;
};

struct MacroStmt : Stmt {
  MacroStmt(SourcePos p, std::string n) : Stmt(StmtKind::kMacro, p), name(std::move(n)) {}
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // parallel to params; null when none
  Body body;
};

struct LoopControlStmt : Stmt {  // break / continue
  LoopControlStmt(SourcePos p, StmtKind k) : Stmt(k, p) {}
};

struct FilterBlockStmt : Stmt {  // {% filter f | g %}body{% endfilter %}
  explicit FilterBlockStmt(SourcePos p) : Stmt(StmtKind::kFilterBlock, p) {}
  std::vector<std::unique_ptr<FilterExpr>> filters;
  Body body;
};

}  // namespace moeserve::chat::jinja
