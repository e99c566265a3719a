#include "chat/jinja_interpreter.h"

#include <algorithm>
#include <chrono>

#include "chat/jinja_operators.h"

namespace moeserve::chat::jinja {

namespace {

// A loop iteration costs several allocations and assignments even with an
// empty body; charging it as several steps keeps the budget proportional to
// time.
constexpr uint64_t kStepsPerIteration = 4;

Status depth_error(int limit) {
  return make_error(StatusCode::kOutOfRange,
                    "template nests or recurses deeper than the limit of {} levels", limit);
}

// A macro defined by `{% macro %}`, closed over the scope it was defined in.
// The scope stores the macro, so the macro holds the scope weakly to avoid a
// reference cycle; a macro smuggled out of a finished loop iteration (through
// a namespace) can then no longer be called.
class MacroCallable : public Callable {
 public:
  MacroCallable(const MacroStmt& macro, const std::shared_ptr<Scope>& closure)
      : macro_(macro), closure_(closure) {}
  std::string name() const override { return macro_.name; }
  Result<Value> call(Interpreter& interp, CallArgs& args) const override {
    std::shared_ptr<Scope> closure = closure_.lock();
    if (!closure) {
      return make_error(StatusCode::kUnsupported,
                        "macro '{}' called after the loop iteration that defined it ended", macro_.name);
    }
    return interp.call_macro(macro_, closure, args);
  }

 private:
  const MacroStmt& macro_;
  std::weak_ptr<Scope> closure_;
};

// loop.cycle(a, b, ...): the argument at the current iteration, round robin.
class LoopCycle : public Callable {
 public:
  explicit LoopCycle(std::shared_ptr<size_t> index) : index_(std::move(index)) {}
  std::string name() const override { return "loop.cycle"; }
  Result<Value> call(Interpreter&, CallArgs& args) const override {
    if (args.positional.empty() || !args.keyword.empty()) {
      return Status(StatusCode::kInvalidArgument, "loop.cycle() takes one or more positional arguments");
    }
    return args.positional[*index_ % args.positional.size()];
  }

 private:
  std::shared_ptr<size_t> index_;
};

// The `loop` variable: one object per loop, updated in place each iteration
// (Jinja2's LoopContext is mutable the same way); previtem/nextitem are
// undefined at the edges.
class LoopObject {
 public:
  explicit LoopObject(const std::vector<Value>& items)
      : items_(items), data_(std::make_shared<DictData>()), index_(std::make_shared<size_t>(0)) {
    for (const char* key : {"index", "index0", "revindex", "revindex0", "first", "last", "previtem", "nextitem"}) {
      data_->set(key, Value());
    }
    data_->set("length", Value::integer(static_cast<int64_t>(items.size())));
    data_->set("depth", Value::integer(1));
    data_->set("depth0", Value::integer(0));
    data_->set("cycle", Value::callable(std::make_shared<LoopCycle>(index_)));
    uint32_t deepest_item = 0;
    for (const Value& item : items) deepest_item = std::max(deepest_item, item.nesting());
    data_->nesting = deepest_item + 1;
    value_ = Value::shared_dict(data_);
  }

  const Value& value() const { return value_; }

  void move_to(size_t i) {
    const size_t n = items_.size();
    const int64_t pos = static_cast<int64_t>(i), len = static_cast<int64_t>(n);
    *index_ = i;
    data_->value_at(kIndex) = Value::integer(pos + 1);
    data_->value_at(kIndex0) = Value::integer(pos);
    data_->value_at(kRevindex) = Value::integer(len - pos);
    data_->value_at(kRevindex0) = Value::integer(len - pos - 1);
    data_->value_at(kFirst) = Value::boolean(i == 0);
    data_->value_at(kLast) = Value::boolean(i + 1 == n);
    data_->value_at(kPrevitem) = i > 0 ? items_[i - 1] : Value::undefined("there is no previous loop item");
    data_->value_at(kNextitem) = i + 1 < n ? items_[i + 1] : Value::undefined("there is no next loop item");
  }

 private:
  enum Key { kIndex, kIndex0, kRevindex, kRevindex0, kFirst, kLast, kPrevitem, kNextitem };  // insertion order above
  const std::vector<Value>& items_;
  std::shared_ptr<DictData> data_;
  std::shared_ptr<size_t> index_;
  Value value_;
};

}  // namespace

Interpreter::Interpreter(const SourceInfo& info, const RenderLimits& limits, RenderEnvironment env)
    : info_(info), limits_(limits), env_(std::move(env)) {}

Status Interpreter::render(const Body& program, DictData context, std::string& out) {
  scope_ = std::make_shared<Scope>();
  for (const auto& [name, value] : context.entries()) scope_->vars[name] = value;
  out_ = &out;
  Result<Flow> flow = exec_body(program);
  out_ = nullptr;
  scope_.reset();
  // A namespace can be stored inside itself; clearing every namespace this
  // render created breaks such cycles so nothing leaks.
  for (const auto& ns : namespaces_) ns->attrs = DictData{};
  namespaces_.clear();
  return flow.status();
}

// ---- services ------------------------------------------------------------------

Status Interpreter::charge(uint64_t units) {
  steps_ += units;
  if (steps_ <= limits_.max_steps) return Status::ok();
  return make_error(StatusCode::kOutOfRange,
                    "rendering exceeded the budget of {} steps (a loop or recursion is too long)",
                    limits_.max_steps);
}

Status Interpreter::charge_string(size_t bytes) {
  if (bytes > limits_.max_output_bytes) {
    return make_error(StatusCode::kOutOfRange, "a string of {} bytes exceeds the output limit of {} bytes",
                      bytes, limits_.max_output_bytes);
  }
  return charge(bytes / 64);
}

Status Interpreter::charge_list(size_t items) {
  if (items > limits_.max_list_items) {
    return make_error(StatusCode::kOutOfRange, "a list of {} items exceeds the limit of {} items", items,
                      limits_.max_list_items);
  }
  return charge(items / 8);
}

Result<Value> Interpreter::get_attribute(const Value& object, std::string_view name) {
  return access_attribute(object, name);
}

Result<Value> Interpreter::get_item(const Value& object, const Value& key) { return access_item(object, key); }

Result<Value> Interpreter::call_value(const Value& callee, CallArgs& args) {
  if (callee.is_undefined()) return undefined_error(callee);
  if (!callee.is_callable()) {
    return make_error(StatusCode::kInvalidArgument, "'{}' object is not callable", callee.type_name());
  }
  return callee.as_callable().call(*this, args);
}

void Interpreter::track_namespace(std::shared_ptr<NamespaceData> ns) { namespaces_.push_back(std::move(ns)); }

int64_t Interpreter::now_unix_seconds() const {
  if (env_.now_unix_seconds) return *env_.now_unix_seconds;
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Status Interpreter::located(SourcePos pos, const Status& status) const {
  if (status.is_ok()) return status;
  // Already located by a nested node (e.g. inside a macro body): keep the
  // innermost position.
  if (status.message().rfind(info_.name + " line ", 0) == 0) return status;
  return located_error(status.code(), info_, pos, status.message());
}

Status Interpreter::write(std::string_view text) {
  if (out_->size() + text.size() > limits_.max_output_bytes) {
    return make_error(StatusCode::kOutOfRange, "rendered output exceeds the limit of {} bytes",
                      limits_.max_output_bytes);
  }
  MOESERVE_RETURN_IF_ERROR(charge(text.size() / 64));
  out_->append(text);
  return Status::ok();
}

Value Interpreter::lookup(const std::string& name) const {
  for (const Scope* s = scope_.get(); s; s = s->parent.get()) {
    auto it = s->vars.find(name);
    if (it != s->vars.end()) return it->second;
  }
  if (std::optional<Value> global = lookup_global(name)) return *global;
  return Value::undefined(fmt::format("'{}' is undefined", name));
}

// ---- macros ----------------------------------------------------------------------

Result<Value> Interpreter::call_macro(const MacroStmt& macro, const std::shared_ptr<Scope>& closure,
                                      CallArgs& args) {
  DepthGuard guard(*this);
  if (guard.exceeded()) return depth_error(limits_.max_depth);
  MOESERVE_RETURN_IF_ERROR(charge(1));
  if (args.positional.size() > macro.params.size()) {
    return make_error(StatusCode::kInvalidArgument, "macro '{}' takes not more than {} argument(s), {} given",
                      macro.name, macro.params.size(), args.positional.size());
  }
  auto frame = std::make_shared<Scope>();
  frame->parent = closure;
  std::vector<bool> given(macro.params.size(), false);
  for (size_t i = 0; i < args.positional.size(); ++i) {
    frame->vars[macro.params[i]] = std::move(args.positional[i]);
    given[i] = true;
  }
  for (auto& [name, value] : args.keyword) {
    size_t i = 0;
    while (i < macro.params.size() && macro.params[i] != name) ++i;
    if (i == macro.params.size()) {
      return make_error(StatusCode::kInvalidArgument, "macro '{}' has no parameter '{}'", macro.name, name);
    }
    if (given[i]) {
      return make_error(StatusCode::kInvalidArgument, "macro '{}' got multiple values for '{}'", macro.name, name);
    }
    frame->vars[name] = std::move(value);
    given[i] = true;
  }
  std::shared_ptr<Scope> saved_scope = scope_;
  scope_ = frame;
  // Defaults are evaluated at call time, in the macro's own scope.
  for (size_t i = 0; i < macro.params.size(); ++i) {
    if (given[i]) continue;
    if (macro.defaults[i]) {
      Result<Value> v = eval(*macro.defaults[i]);
      if (!v.is_ok()) {
        scope_ = saved_scope;
        return v.status();
      }
      frame->vars[macro.params[i]] = std::move(v).value();
    } else {
      frame->vars[macro.params[i]] =
          Value::undefined(fmt::format("parameter '{}' of macro '{}' was not given", macro.params[i], macro.name));
    }
  }
  Result<std::string> text = capture(macro.body);
  scope_ = saved_scope;
  if (!text.is_ok()) return text.status();
  return Value::string(std::move(text).value());
}

// ---- statements ------------------------------------------------------------------

Result<std::string> Interpreter::capture(const Body& body) {
  std::string buffer;
  std::string* saved = out_;
  out_ = &buffer;
  Result<Flow> flow = exec_body(body);
  out_ = saved;
  if (!flow.is_ok()) return flow.status();
  return buffer;
}

Result<Flow> Interpreter::exec_body(const Body& body) {
  for (const StmtPtr& stmt : body) {
    MOESERVE_ASSIGN_OR_RETURN(Flow flow, exec(*stmt));
    if (flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

Result<Flow> Interpreter::exec(const Stmt& stmt) {
  DepthGuard guard(*this);
  if (guard.exceeded()) return located(stmt.pos, depth_error(limits_.max_depth));
  MOESERVE_RETURN_IF_ERROR(located(stmt.pos, charge(1)));
  switch (stmt.kind) {
    case StmtKind::kText:
      MOESERVE_RETURN_IF_ERROR(located(stmt.pos, write(static_cast<const TextStmt&>(stmt).text)));
      return Flow::kNormal;
    case StmtKind::kOutput: {
      MOESERVE_ASSIGN_OR_RETURN(Value v, eval(*static_cast<const OutputStmt&>(stmt).expr));
      MOESERVE_RETURN_IF_ERROR(located(stmt.pos, write(to_display_string(v))));
      return Flow::kNormal;
    }
    case StmtKind::kIf: return exec_if(static_cast<const IfStmt&>(stmt));
    case StmtKind::kFor: return exec_for(static_cast<const ForStmt&>(stmt));
    case StmtKind::kSet: MOESERVE_RETURN_IF_ERROR(exec_set(static_cast<const SetStmt&>(stmt))); return Flow::kNormal;
    case StmtKind::kSetBlock:
      MOESERVE_RETURN_IF_ERROR(exec_set_block(static_cast<const SetBlockStmt&>(stmt)));
      return Flow::kNormal;
    case StmtKind::kMacro: {
      const auto& macro = static_cast<const MacroStmt&>(stmt);
      scope_->vars[macro.name] = Value::callable(std::make_shared<MacroCallable>(macro, scope_));
      scope_->captured = true;
      return Flow::kNormal;
    }
    case StmtKind::kBreak: return Flow::kBreak;
    case StmtKind::kContinue: return Flow::kContinue;
    case StmtKind::kFilterBlock:
      MOESERVE_RETURN_IF_ERROR(exec_filter_block(static_cast<const FilterBlockStmt&>(stmt)));
      return Flow::kNormal;
  }
  return Flow::kNormal;
}

Result<Flow> Interpreter::exec_if(const IfStmt& stmt) {
  for (const auto& [cond, body] : stmt.branches) {
    MOESERVE_ASSIGN_OR_RETURN(Value v, eval(*cond));
    if (v.truthy()) return exec_body(body);
  }
  return exec_body(stmt.else_body);
}

Result<Flow> Interpreter::exec_for(const ForStmt& stmt) {
  MOESERVE_ASSIGN_OR_RETURN(Value iterable, eval(*stmt.iterable));
  Result<std::vector<Value>> all = iterate_value(iterable);
  if (!all.is_ok()) return located(stmt.iterable->pos, all.status());
  MOESERVE_RETURN_IF_ERROR(located(stmt.pos, charge_list(all->size())));
  AssignTarget target;
  target.names = stmt.targets;
  std::shared_ptr<Scope> outer = scope_;
  std::vector<Value> items;
  if (stmt.filter) {  // `for x in xs if cond`: filtered first, so loop.length counts kept items
    for (Value& item : all.value()) {
      scope_ = std::make_shared<Scope>();
      scope_->parent = outer;
      Status st = assign(target, item, stmt.pos);
      Result<Value> keep = st.is_ok() ? eval(*stmt.filter) : Result<Value>(st);
      scope_ = outer;
      if (!keep.is_ok()) return keep.status();
      if (keep->truthy()) items.push_back(std::move(item));
    }
  } else {
    items = std::move(all).value();
  }
  if (items.empty()) return exec_body(stmt.else_body);

  LoopObject loop(items);
  const int64_t n = static_cast<int64_t>(items.size());
  std::shared_ptr<Scope> frame;
  for (int64_t i = 0; i < n; ++i) {
    MOESERVE_RETURN_IF_ERROR(located(stmt.pos, charge(kStepsPerIteration)));
    loop.move_to(static_cast<size_t>(i));
    frame = fresh_iteration_scope(std::move(frame), outer);
    frame->vars["loop"] = loop.value();
    scope_ = frame;
    Status st = assign(target, items[static_cast<size_t>(i)], stmt.pos);
    Result<Flow> flow = st.is_ok() ? exec_body(stmt.body) : Result<Flow>(st);
    scope_ = outer;
    if (!flow.is_ok()) return flow.status();
    if (*flow == Flow::kBreak) break;
  }
  return Flow::kNormal;
}

// Each iteration starts from an empty scope, as in Jinja2. The previous
// iteration's scope is recycled unless something may still refer to it: a
// macro defined in it (macros hold their scope weakly) must keep seeing the
// iteration it was defined in.
std::shared_ptr<Scope> Interpreter::fresh_iteration_scope(std::shared_ptr<Scope> previous,
                                                          const std::shared_ptr<Scope>& outer) {
  bool reusable = previous && previous.use_count() == 1 && !previous->captured;
  if (reusable) {
    previous->vars.clear();
    return previous;
  }
  auto scope = std::make_shared<Scope>();
  scope->parent = outer;
  return scope;
}

Status Interpreter::assign(const AssignTarget& target, Value value, SourcePos pos) {
  // Assignment is the only way a template can grow a value across loop
  // iterations (`{% set ns.x = [ns.x] %}`), so nesting is bounded here.
  if (value.nesting() > limits_.max_value_nesting) {
    return located_error(StatusCode::kOutOfRange, info_, pos,
                         fmt::format("value nests deeper than the limit of {} levels", limits_.max_value_nesting));
  }
  if (!target.namespace_name.empty()) {
    Value ns = lookup(target.namespace_name);
    if (!ns.is_namespace()) {
      return located_error(StatusCode::kInvalidArgument, info_, pos,
                           fmt::format("cannot set attribute '{}' on '{}': it is a {}, not a namespace()",
                                       target.attribute, target.namespace_name, ns.type_name()));
    }
    ns.as_namespace().attrs.set(target.attribute, std::move(value));
    return Status::ok();
  }
  if (target.names.size() == 1) {
    scope_->vars[target.names[0]] = std::move(value);
    return Status::ok();
  }
  Result<std::vector<Value>> parts = value.is_list() ? Result<std::vector<Value>>(value.as_list().items)
                                                     : iterate_value(value);
  if (!parts.is_ok() || parts->size() != target.names.size()) {
    return located_error(StatusCode::kInvalidArgument, info_, pos,
                         fmt::format("cannot unpack a {} into {} names", value.type_name(), target.names.size()));
  }
  for (size_t i = 0; i < target.names.size(); ++i) scope_->vars[target.names[i]] = std::move(parts.value()[i]);
  return Status::ok();
}

Status Interpreter::exec_set(const SetStmt& stmt) {
  MOESERVE_ASSIGN_OR_RETURN(Value v, eval(*stmt.value));
  return assign(stmt.target, std::move(v), stmt.pos);
}

Status Interpreter::exec_set_block(const SetBlockStmt& stmt) {
  MOESERVE_ASSIGN_OR_RETURN(std::string text, capture(stmt.body));
  Value v = Value::string(std::move(text));
  for (const auto& filter : stmt.filters) {
    MOESERVE_ASSIGN_OR_RETURN(v, eval_filter(*filter, std::move(v)));
  }
  return assign(stmt.target, std::move(v), stmt.pos);
}

Status Interpreter::exec_filter_block(const FilterBlockStmt& stmt) {
  MOESERVE_ASSIGN_OR_RETURN(std::string text, capture(stmt.body));
  Value v = Value::string(std::move(text));
  for (const auto& filter : stmt.filters) {
    MOESERVE_ASSIGN_OR_RETURN(v, eval_filter(*filter, std::move(v)));
  }
  return located(stmt.pos, write(to_display_string(v)));
}

}  // namespace moeserve::chat::jinja
