// Tool calls held to their grammar (server/api/tool_call_grammar.h builds
// it) while the rest of the answer stays free: the TokenConstraint of a
// request with strict tools or a required tool call.
//
// The answer is read in phases. Reasoning (from "<think>", or from the start
// when the prompt opened it, to "</think>") is never constrained: calls
// written while thinking are not calls. After it:
//   - a call is optional (tool_choice auto): the text is free until it spells
//     the opening "<tool_call>"; from there to "</tool_call>" every token
//     must keep the call a prefix of the grammar, then the text is free again;
//   - a call is required: the grammar holds from the end of the reasoning to
//     the end of the answer (it is one or more calls), and the answer cannot
//     end before the grammar is complete. A required answer may still open
//     its reasoning first, with the model's "<think>" token.
// Free text costs nothing: allows() says yes to every token there, so the
// engine never computes a mask for it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/grammar/token_mask.h"
#include "runtime/grammar_constraint.h"
#include "runtime/token_constraint.h"

namespace moeserve::runtime {

struct ToolCallConstraintOptions {
  std::shared_ptr<const grammar::Grammar> grammar;
  bool required = false;                  // see above
  std::string call_open = "<tool_call>";  // where an optional call's grammar starts
  std::string think_close = "</think>";
  bool starts_in_reasoning = false;         // the prompt ends inside an opened "<think>"
  std::optional<int32_t> think_open_token;  // the model's "<think>" token, if it has one
  TokenBytes bytes;
  std::vector<int32_t> end_ids;
  std::shared_ptr<const grammar::TokenTrie> trie;
  std::shared_ptr<grammar::MaskCache> cache;  // may be null
};

class ToolCallConstraint final : public TokenConstraint {
 public:
  explicit ToolCallConstraint(ToolCallConstraintOptions options);

  bool allows(int32_t token) const override;
  void accept(int32_t token) override;
  void allowed_mask(int64_t n_vocab, std::vector<uint8_t>& allowed) const override;

  enum class Phase {
    kOpening,    // nothing written yet, reasoning not open
    kReasoning,  // inside <think> ... </think>
    kText,       // free text where a call is optional
    kCall,       // inside the grammar
  };
  Phase phase() const { return phase_; }

 private:
  bool is_end(int32_t token) const;
  bool is_think_open(int32_t token) const;
  const std::string& token_bytes(int32_t token) const;
  // The phase after the reasoning (or instead of it): the grammar when a
  // call is required, free text otherwise. `rest` is text already written.
  void after_reasoning(std::string_view rest);
  void start_call(std::string_view rest);
  void scan_text(std::string_view bytes);
  // Appends `bytes` to what the current free phase has seen and looks for
  // `marker`; the text after it when found.
  std::optional<std::string> find_marker(std::string_view bytes, const std::string& marker);

  ToolCallConstraintOptions options_;
  Phase phase_ = Phase::kOpening;
  std::string tail_;  // the last bytes of free text, for a marker split over tokens
  std::optional<GrammarConstraint> call_;
};

}  // namespace moeserve::runtime
