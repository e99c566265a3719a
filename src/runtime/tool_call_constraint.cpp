#include "runtime/tool_call_constraint.h"

#include <algorithm>

namespace moeserve::runtime {

namespace {
const std::string kNoBytes;
}  // namespace

ToolCallConstraint::ToolCallConstraint(ToolCallConstraintOptions options) : options_(std::move(options)) {
  if (options_.starts_in_reasoning) {
    phase_ = Phase::kReasoning;
  } else if (options_.required) {
    start_call({});
    phase_ = Phase::kOpening;  // the model may still open its reasoning first
  }
}

bool ToolCallConstraint::is_end(int32_t token) const {
  return std::find(options_.end_ids.begin(), options_.end_ids.end(), token) != options_.end_ids.end();
}

bool ToolCallConstraint::is_think_open(int32_t token) const {
  return options_.think_open_token && token == *options_.think_open_token;
}

const std::string& ToolCallConstraint::token_bytes(int32_t token) const {
  if (!options_.bytes || token < 0 || size_t(token) >= options_.bytes->size()) return kNoBytes;
  return (*options_.bytes)[size_t(token)];
}

bool ToolCallConstraint::allows(int32_t token) const {
  switch (phase_) {
    case Phase::kOpening:
      if (is_think_open(token)) return true;
      return !options_.required || call_->allows(token);
    case Phase::kReasoning:
      return !(options_.required && is_end(token));
    case Phase::kText:
      return true;
    case Phase::kCall:
      return call_->allows(token);
  }
  return true;
}

void ToolCallConstraint::accept(int32_t token) {
  if (is_end(token)) return;
  const std::string& bytes = token_bytes(token);
  switch (phase_) {
    case Phase::kOpening:
      if (is_think_open(token)) {
        phase_ = Phase::kReasoning;
        tail_.clear();
        return;
      }
      if (options_.required) {
        phase_ = Phase::kCall;
        call_->accept(token);
      } else {
        phase_ = Phase::kText;
        scan_text(bytes);
      }
      return;
    case Phase::kReasoning:
      if (std::optional<std::string> rest = find_marker(bytes, options_.think_close)) after_reasoning(*rest);
      return;
    case Phase::kText:
      scan_text(bytes);
      return;
    case Phase::kCall:
      call_->accept(token);
      // An optional call is over at its closing tag: free text again.
      if (!options_.required && call_->state().complete() && !call_->state().can_continue()) {
        phase_ = Phase::kText;
        call_.reset();
        tail_.clear();
      }
      return;
  }
}

void ToolCallConstraint::allowed_mask(int64_t n_vocab, std::vector<uint8_t>& allowed) const {
  if (phase_ == Phase::kCall || (phase_ == Phase::kOpening && options_.required)) {
    call_->allowed_mask(n_vocab, allowed);
    if (phase_ == Phase::kOpening && options_.think_open_token) {
      const int32_t id = *options_.think_open_token;
      if (id >= 0 && size_t(id) < allowed.size()) allowed[size_t(id)] = 1;
    }
    return;
  }
  allowed.assign(size_t(std::max<int64_t>(n_vocab, 0)), 1);
  if (phase_ == Phase::kReasoning && options_.required) {
    for (const int32_t id : options_.end_ids) {
      if (id >= 0 && size_t(id) < allowed.size()) allowed[size_t(id)] = 0;
    }
  }
}

void ToolCallConstraint::after_reasoning(std::string_view rest) {
  tail_.clear();
  if (options_.required) {
    start_call(rest);
  } else {
    phase_ = Phase::kText;
    scan_text(rest);
  }
}

void ToolCallConstraint::start_call(std::string_view rest) {
  call_.emplace(options_.grammar, options_.bytes, options_.end_ids, options_.trie, options_.cache);
  phase_ = Phase::kCall;
  tail_.clear();
  // The rest of the token that opened the call was never checked against
  // the grammar; when it does not fit, an optional call goes unconstrained
  // (the output parser still sees its text) rather than be forced into a
  // state the model did not write.
  if (!rest.empty() && !call_->accept_bytes(rest) && !options_.required) {
    phase_ = Phase::kText;
    call_.reset();
  }
}

void ToolCallConstraint::scan_text(std::string_view bytes) {
  if (std::optional<std::string> rest = find_marker(bytes, options_.call_open)) start_call(*rest);
}

std::optional<std::string> ToolCallConstraint::find_marker(std::string_view bytes,
                                                           const std::string& marker) {
  if (marker.empty()) return std::nullopt;
  tail_.append(bytes);
  const size_t at = tail_.find(marker);
  if (at != std::string::npos) {
    std::string rest = tail_.substr(at + marker.size());
    tail_.clear();
    return rest;
  }
  if (tail_.size() >= marker.size()) tail_.erase(0, tail_.size() - (marker.size() - 1));
  return std::nullopt;
}

}  // namespace moeserve::runtime
