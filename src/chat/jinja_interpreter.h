// Tree-walking interpreter for parsed chat templates.
//
// Chat templates arrive inside model files and requests, so rendering treats
// them as hostile: every statement, expression node and loop iteration is
// charged against a step budget, produced strings and lists are charged by
// size, nesting (expressions, statements, macro calls) is bounded so the
// native stack cannot overflow, and the output size is capped. Exceeding any
// limit is an error naming the limit, never a hang or a crash.
//
// Scoping follows Jinja2: each for-loop iteration and each macro call gets a
// fresh scope, `if` does not; macros see the scope they were defined in (not
// their caller's); `set` writes to the innermost scope.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "chat/jinja_ast.h"
#include "chat/jinja_value.h"

namespace moeserve::chat::jinja {

struct RenderLimits {
  size_t max_output_bytes = 32u << 20;  // also caps any single string value
  uint64_t max_steps = 10'000'000;     // nodes + loop iterations + bytes/64 produced
  int max_depth = 256;                 // nested evaluation (expressions, blocks, macro calls)
  size_t max_list_items = 1u << 20;    // any single list, e.g. from range()
  // Containers nested in one value (request JSON or built by the template);
  // bounds the recursion of printing, comparing and freeing values.
  uint32_t max_value_nesting = 64;
};

struct RenderEnvironment {
  // Time for strftime_now(); unset uses the clock. Tests fix it.
  std::optional<int64_t> now_unix_seconds;
};

struct Scope {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Scope> parent;
  bool captured = false;  // a macro closes over this scope
};

enum class Flow { kNormal, kBreak, kContinue };

class Interpreter {
 public:
  Interpreter(const SourceInfo& info, const RenderLimits& limits, RenderEnvironment env);

  // Renders `program` with `context` as the template's global variables.
  Status render(const Body& program, DictData context, std::string& out);

  // ---- services for builtins -------------------------------------------------
  // Charges `units` against the step budget.
  Status charge(uint64_t units);
  // Charges for producing a string of `bytes` and checks it against the size cap.
  Status charge_string(size_t bytes);
  // Charges for producing a list of `items` and checks it against the cap.
  Status charge_list(size_t items);
  Result<Value> get_attribute(const Value& object, std::string_view name);
  Result<Value> get_item(const Value& object, const Value& key);
  Result<Value> call_value(const Value& callee, CallArgs& args);
  Result<Value> call_macro(const MacroStmt& macro, const std::shared_ptr<Scope>& closure, CallArgs& args);
  int64_t now_unix_seconds() const;
  const RenderLimits& limits() const { return limits_; }
  // Registers a namespace() created during this render (see render()).
  void track_namespace(std::shared_ptr<NamespaceData> ns);

 private:
  friend class DepthGuard;
  Result<Value> eval(const Expr& expr);
  Result<Value> eval_uncharged(const Expr& expr);
  Result<Value> eval_call(const CallExpr& call);
  Result<Value> eval_filter(const FilterExpr& filter, Value input);
  Result<Value> eval_test(const TestExpr& test);
  Result<Value> eval_compare(const CompareExpr& compare);
  Result<Value> eval_collection(const Expr& expr);
  Result<CallArgs> eval_args(const CallArgsExpr& args);

  Result<Flow> exec_body(const Body& body);
  Result<Flow> exec(const Stmt& stmt);
  Result<Flow> exec_if(const IfStmt& stmt);
  Result<Flow> exec_for(const ForStmt& stmt);
  Status exec_set(const SetStmt& stmt);
  Status exec_set_block(const SetBlockStmt& stmt);
  Status exec_filter_block(const FilterBlockStmt& stmt);
  Status assign(const AssignTarget& target, Value value, SourcePos pos);
  Result<std::string> capture(const Body& body);
  std::shared_ptr<Scope> fresh_iteration_scope(std::shared_ptr<Scope> previous, const std::shared_ptr<Scope>& outer);

  Status write(std::string_view text);
  Value lookup(const std::string& name) const;
  Status located(SourcePos pos, const Status& status) const;

  const SourceInfo& info_;
  RenderLimits limits_;
  RenderEnvironment env_;
  std::shared_ptr<Scope> scope_;
  std::string* out_ = nullptr;  // current output: the result, or a capture buffer
  std::vector<std::shared_ptr<NamespaceData>> namespaces_;
  uint64_t steps_ = 0;
  int depth_ = 0;
};

// Bounds native recursion: every nested eval/exec/macro call holds one.
class DepthGuard {
 public:
  explicit DepthGuard(Interpreter& interp) : interp_(interp) { ++interp_.depth_; }
  ~DepthGuard() { --interp_.depth_; }
  bool exceeded() const { return interp_.depth_ > interp_.limits_.max_depth; }
  DepthGuard(const DepthGuard&) = delete;
  DepthGuard& operator=(const DepthGuard&) = delete;

 private:
  Interpreter& interp_;
};

}  // namespace moeserve::chat::jinja
